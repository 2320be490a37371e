//! Stacks of frames built from a stack tree: the common input of every
//! export. Each node's self cost becomes one weighted sample on the stack
//! of frames from its root to it; nothing is estimated, so the samples of
//! an event add up to the tree's total for it.
//!
//! * A node's frame is its function as Callgrind names it (`fib'2` for a
//!   recursion level), with the function's file.
//! * With `lines`, frames also carry a source line: a node's own cost is
//!   split by the lines of its instructions (the tree's positions; cost a
//!   column has no position detail for stays on a frame without line), and
//!   an ancestor's frame has the line of the call through which the path
//!   went, when that call site is unique (a context entered from two call
//!   sites of its parent cannot be split between them: no line).
//! * With an [`InlineResolver`], a frame at a known instruction is followed
//!   by the functions DWARF says were inlined there, outermost first.

use crate::inline::InlineResolver;
use rustc_hash::FxHashMap;
use stacktree::{Site, StackTree, NO_PARENT};

/// One frame.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Frame {
    /// The function's name.
    pub name: String,
    /// Its source file, if known.
    pub file: Option<String>,
    /// The source line in it, if frames carry lines and it is known.
    pub line: Option<u32>,
    /// How deep in an inline chain (0: the function itself).
    pub inline_depth: u32,
}

/// Frames, a prefix tree of stacks over them, and weighted samples.
#[derive(Debug, Default)]
pub struct Stacks {
    /// The distinct frames.
    pub frames: Vec<Frame>,
    frame_index: FxHashMap<Frame, u32>,
    /// Each stack: its prefix (`None` for a root frame) and its last frame.
    pub stacks: Vec<(Option<u32>, u32)>,
    stack_index: FxHashMap<(Option<u32>, u32), u32>,
    /// Each sample: its stack and one weight per event of the tree.
    pub samples: Vec<(u32, Vec<u64>)>,
    sample_index: FxHashMap<u32, usize>,
    /// The events' names.
    pub events: Vec<String>,
}

/// What the stacks are made of.
pub struct Build<'a> {
    /// Only this thread's nodes (all threads with `None`).
    pub thread: Option<u32>,
    /// Frames carry source lines.
    pub lines: bool,
    /// Inline frames from DWARF.
    pub inline: Option<&'a mut InlineResolver>,
}

impl Stacks {
    fn frame(&mut self, f: Frame) -> u32 {
        if let Some(&i) = self.frame_index.get(&f) {
            return i;
        }
        self.frames.push(f.clone());
        let i = (self.frames.len() - 1) as u32;
        self.frame_index.insert(f, i);
        i
    }

    fn push(&mut self, prefix: Option<u32>, frame: u32) -> u32 {
        let stacks = &mut self.stacks;
        *self.stack_index.entry((prefix, frame)).or_insert_with(|| {
            stacks.push((prefix, frame));
            (stacks.len() - 1) as u32
        })
    }

    fn sample(&mut self, stack: u32, weights: &[u64]) {
        if weights.iter().all(|&w| w == 0) {
            return;
        }
        let i = *self.sample_index.entry(stack).or_insert_with(|| {
            self.samples.push((stack, vec![0; weights.len()]));
            self.samples.len() - 1
        });
        for (s, w) in self.samples[i].1.iter_mut().zip(weights) {
            *s += w;
        }
    }

    /// The frames of `stack`, root first.
    pub fn path(&self, stack: u32) -> Vec<u32> {
        let mut out = Vec::new();
        let mut s = Some(stack);
        while let Some(i) = s {
            let (prefix, frame) = self.stacks[i as usize];
            out.push(frame);
            s = prefix;
        }
        out.reverse();
        out
    }

    /// The total of each event over the samples.
    pub fn totals(&self) -> Vec<u64> {
        let mut t = vec![0u64; self.events.len()];
        for (_, w) in &self.samples {
            for (s, v) in t.iter_mut().zip(w) {
                *s += v;
            }
        }
        t
    }

    /// Builds the stacks of `tree` (see the module documentation).
    pub fn build(tree: &StackTree, mut how: Build<'_>) -> Stacks {
        let mut s = Stacks {
            events: tree.events.clone(),
            ..Stacks::default()
        };
        let detail = how.lines || how.inline.is_some();
        // The stack of each node's ancestors as seen from it (its parent's
        // frames at the call into it), in node order: parents come first.
        let mut context: Vec<Option<u32>> = Vec::with_capacity(tree.nodes.len());
        for (i, n) in tree.nodes.iter().enumerate() {
            let wanted = how.thread.is_none_or(|t| n.thread == t);
            let ctx = if n.parent == NO_PARENT || !wanted {
                None
            } else {
                let p = n.parent as usize;
                let site = if detail { unique_site(tree, i) } else { None };
                Some(s.frames_at(tree, p, context[p], site.as_ref(), &mut how))
            };
            context.push(ctx);
            if !wanted {
                continue;
            }
            if !detail {
                let top = s.frames_at(tree, i, context[i], None, &mut how);
                s.sample(top, &n.costs);
                continue;
            }
            let mut rest = n.costs.clone();
            for p in &n.positions {
                let top = s.frames_at(tree, i, context[i], Some(&p.site), &mut how);
                s.sample(top, &p.costs);
                for (r, c) in rest.iter_mut().zip(&p.costs) {
                    *r = r.saturating_sub(*c);
                }
            }
            let top = s.frames_at(tree, i, context[i], None, &mut how);
            s.sample(top, &rest);
        }
        s
    }

    /// Pushes node `n`'s frames (at `site`, if known) on `prefix`.
    fn frames_at(
        &mut self,
        tree: &StackTree,
        n: usize,
        prefix: Option<u32>,
        site: Option<&Site>,
        how: &mut Build<'_>,
    ) -> u32 {
        let node = &tree.nodes[n];
        let function = &tree.functions[node.function as usize];
        let known = |f: &str| (f != "???" && !f.is_empty()).then(|| f.to_string());
        let file = known(&tree.files[function.file as usize]);
        let line = |l: u32| (how.lines && l != 0).then_some(l);
        let chain = match (site, how.inline.as_deref_mut()) {
            (
                Some(Site {
                    object: Some(o),
                    address,
                    ..
                }),
                Some(r),
            ) => r.frames(&tree.objects[*o as usize], *address),
            _ => Vec::new(),
        };
        let own_line = match (chain.last(), site) {
            (Some(outer), _) if chain.len() > 1 => outer.line.and_then(line),
            (_, Some(s)) => line(s.line),
            _ => None,
        };
        let me = self.frame(Frame {
            name: tree.display_name(node),
            file,
            line: own_line,
            inline_depth: 0,
        });
        let mut top = self.push(prefix, me);
        // Inlined functions, outermost first (the chain's last frame is the
        // function itself, named by the tree).
        for (depth, f) in chain.iter().rev().skip(1).enumerate() {
            let frame = self.frame(Frame {
                name: f.function.clone().unwrap_or_else(|| "???".into()),
                file: f.file.clone(),
                line: f.line.and_then(line),
                inline_depth: depth as u32 + 1,
            });
            top = self.push(Some(top), frame);
        }
        top
    }
}

/// The one call site through which node `n` was entered, if there is one.
fn unique_site(tree: &StackTree, n: usize) -> Option<Site> {
    let calls = &tree.nodes[n].calls;
    let first = calls.first()?.site;
    calls
        .iter()
        .all(|c| (c.site.object, c.site.address) == (first.object, first.address))
        .then_some(first)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use stacktree::{CallSite, Function, Node, Position};

    /// main (2 call sites into g) -> f -> f'2, main -> g; thread 2: h.
    pub(crate) fn tree() -> StackTree {
        let site = |address, line| Site {
            object: Some(0),
            address,
            file: 1,
            line,
        };
        let f = |name: &str| Function {
            object: 0,
            file: 1,
            name: name.into(),
        };
        let node = |parent, thread, function, level, costs: Vec<u64>| Node {
            parent,
            thread,
            function,
            level,
            costs,
            positions: vec![],
            calls: vec![],
        };
        let mut t = StackTree {
            creator: "t".into(),
            pid: 1,
            cmd: "prog".into(),
            events: vec!["Ir".into(), "Dr".into()],
            objects: vec!["/nonexistent/prog".into()],
            files: vec!["???".into(), "p.c".into()],
            functions: vec![f("main"), f("f"), f("g"), f("h")],
            nodes: vec![
                node(NO_PARENT, 1, 0, 1, vec![10, 1]),
                node(0, 1, 1, 1, vec![20, 2]),
                node(1, 1, 1, 2, vec![30, 3]),
                node(0, 1, 2, 1, vec![40, 0]),
                node(NO_PARENT, 2, 3, 1, vec![5, 5]),
            ],
        };
        t.nodes[0].positions = vec![
            Position {
                site: site(0x10, 3),
                costs: vec![6, 1],
            },
            Position {
                site: site(0x14, 4),
                costs: vec![4, 0],
            },
        ];
        t.nodes[1].calls = vec![CallSite {
            site: site(0x12, 3),
            calls: 1,
        }];
        t.nodes[3].calls = vec![
            CallSite {
                site: site(0x16, 5),
                calls: 1,
            },
            CallSite {
                site: site(0x18, 6),
                calls: 2,
            },
        ];
        t
    }

    fn names(s: &Stacks, stack: u32) -> String {
        let p: Vec<String> = s
            .path(stack)
            .iter()
            .map(|&f| {
                let f = &s.frames[f as usize];
                match f.line {
                    Some(l) => format!("{}:{l}", f.name),
                    None => f.name.clone(),
                }
            })
            .collect();
        p.join(";")
    }

    #[test]
    fn one_sample_per_node_without_lines() {
        let t = tree();
        let s = Stacks::build(
            &t,
            Build {
                thread: None,
                lines: false,
                inline: None,
            },
        );
        let got: Vec<(String, Vec<u64>)> = s
            .samples
            .iter()
            .map(|(st, w)| (names(&s, *st), w.clone()))
            .collect();
        assert_eq!(
            got,
            [
                ("main".to_string(), vec![10, 1]),
                ("main;f".into(), vec![20, 2]),
                ("main;f;f'2".into(), vec![30, 3]),
                ("main;g".into(), vec![40, 0]),
                ("h".into(), vec![5, 5]),
            ]
        );
        assert_eq!(s.totals(), t.totals(None));
        let one = Stacks::build(
            &t,
            Build {
                thread: Some(2),
                lines: false,
                inline: None,
            },
        );
        assert_eq!(one.totals(), [5, 5]);
    }

    #[test]
    fn lines_split_self_costs_and_name_unique_call_sites() {
        let t = tree();
        let s = Stacks::build(
            &t,
            Build {
                thread: Some(1),
                lines: true,
                inline: None,
            },
        );
        let got: Vec<(String, Vec<u64>)> = s
            .samples
            .iter()
            .map(|(st, w)| (names(&s, *st), w.clone()))
            .collect();
        assert_eq!(
            got,
            [
                ("main:3".to_string(), vec![6, 1]),
                ("main:4".into(), vec![4, 0]),
                ("main:3;f".into(), vec![20, 2]),
                ("main:3;f;f'2".into(), vec![30, 3]),
                ("main;g".into(), vec![40, 0]),
            ]
        );
        assert_eq!(s.totals(), t.totals(Some(1)));
    }
}
