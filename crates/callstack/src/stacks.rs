//! A read-only view of the tree as a [`stacktree::StackTree`]: each
//! context with its self Ir, per instruction, and the call sites it was
//! entered through, for the exports (`crates/export`) and the stack-tree
//! file.

use crate::tool::CallTool;
use crate::tree::{NodeId, NO_NODE};
use rustc_hash::FxHashMap;
use stacktree::{CallSite, Function, Node, Position, Site, StackTree, NO_PARENT};
use std::rc::Rc;

/// Where an instruction is, as the run knows it.
#[derive(Debug, Clone)]
pub struct Place {
    /// The object file (`None`: unknown).
    pub object: Option<Rc<str>>,
    /// Its address in the object file (the run-time address without one).
    pub address: u64,
    /// Source file (`???` when unknown).
    pub file: Rc<str>,
    /// Source line (0 when unknown).
    pub line: u32,
}

/// Interns strings into a table.
#[derive(Default)]
struct Table {
    index: FxHashMap<String, u32>,
}

impl Table {
    fn get(&mut self, list: &mut Vec<String>, s: &str) -> u32 {
        if let Some(&i) = self.index.get(s) {
            return i;
        }
        list.push(s.to_string());
        self.index.insert(s.to_string(), (list.len() - 1) as u32);
        (list.len() - 1) as u32
    }
}

impl CallTool {
    /// The tree with its self Ir per context and per instruction, and the
    /// call sites of each context; `place` locates an instruction address
    /// (each once). Nodes with no cost and no calls are kept: they are part
    /// of the paths to their children.
    pub fn stack_tree(&self, place: &mut dyn FnMut(u64) -> Place) -> StackTree {
        let mut t = StackTree {
            events: vec!["Ir".into()],
            ..StackTree::default()
        };
        let (mut obs, mut fls) = (Table::default(), Table::default());
        let mut placed: FxHashMap<u64, Site> = FxHashMap::default();
        let mut site = |t: &mut StackTree, obs: &mut Table, fls: &mut Table, addr: u64| -> Site {
            *placed.entry(addr).or_insert_with(|| {
                let p = place(addr);
                Site {
                    object: p.object.map(|o| obs.get(&mut t.objects, &o)),
                    address: p.address,
                    file: fls.get(&mut t.files, &p.file),
                    line: p.line,
                }
            })
        };
        let mut fn_ids: FxHashMap<u32, u32> = FxHashMap::default();
        let tree = &self.tree;
        for n in &tree.nodes {
            let function = *fn_ids.entry(n.function).or_insert_with(|| {
                let c = &self.functions[n.function as usize].class;
                let f = Function {
                    object: obs.get(&mut t.objects, &c.object),
                    file: fls.get(&mut t.files, &c.file),
                    name: c.function.to_string(),
                };
                t.functions.push(f);
                (t.functions.len() - 1) as u32
            });
            t.nodes.push(Node {
                parent: if n.parent == NO_NODE {
                    NO_PARENT
                } else {
                    n.parent
                },
                thread: n.thread,
                function,
                level: n.level,
                costs: vec![0],
                positions: Vec::new(),
                calls: Vec::new(),
            });
        }
        // Self Ir per (node, instruction).
        let mut at: FxHashMap<(NodeId, u64), u64> = FxHashMap::default();
        for (&(node, block), &runs) in tree.run_keys.iter().zip(&tree.runs) {
            if runs == 0 {
                continue;
            }
            for &addr in self.block_state(block).instrs.iter() {
                *at.entry((node, addr)).or_default() += runs;
            }
        }
        for (&(node, addr), &ir) in tree.extra.iter() {
            if ir != 0 && node != NO_NODE {
                *at.entry((node, addr)).or_default() += ir;
            }
        }
        let mut at: Vec<((NodeId, u64), u64)> = at.into_iter().collect();
        at.sort_unstable();
        for ((node, addr), ir) in at {
            let s = site(&mut t, &mut obs, &mut fls, addr);
            let n = &mut t.nodes[node as usize];
            n.costs[0] += ir;
            n.positions.push(Position {
                site: s,
                costs: vec![ir],
            });
        }
        // Calls from the parent (an underflow's arc, from a new root to
        // the context that returned, is no edge of the tree).
        let mut calls: FxHashMap<(NodeId, u64), u64> = FxHashMap::default();
        for a in &tree.arcs {
            if a.calls != 0 && tree.nodes[a.callee as usize].parent == a.caller {
                *calls.entry((a.callee, a.call_site)).or_default() += a.calls;
            }
        }
        let mut calls: Vec<((NodeId, u64), u64)> = calls.into_iter().collect();
        calls.sort_unstable();
        for ((node, addr), n) in calls {
            let s = site(&mut t, &mut obs, &mut fls, addr);
            t.nodes[node as usize]
                .calls
                .push(CallSite { site: s, calls: n });
        }
        t
    }
}
