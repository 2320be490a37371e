//! The tree as a Callgrind profile part: each context's self costs go to
//! its function at its recursion level (`fn'2` from level 2 on) and, with
//! `--separate-callers`, its last callers (`fn'2'caller1'caller2`), each
//! arc becomes a `calls=` line of its caller's function at the call site,
//! with the inclusive cost of its calls.

use crate::tool::CallTool;
use crate::tree::{FnId, NodeId, Snapshot, Tree, NO_NODE};
use callgrind::builder::{FunctionKey, PartBuilder, Site};
use callgrind::{Event, JumpKind, Part, Position, Positions, Profile};
use rustc_hash::FxHashMap;
use std::rc::Rc;

/// Source file and line of an instruction address ([`NO_DEBUG_INFO`] and
/// 0 where it has none).
pub type Locate<'a> = dyn FnMut(u64) -> (Rc<str>, u32) + 'a;

/// The file [`Locate`] names for an address without debug information
/// (Valgrind's and `symbols`' `???`).
pub const NO_DEBUG_INFO: &str = "???";

/// What positions the part's lines carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutputOptions {
    /// `--dump-instr=yes`: instruction addresses.
    pub dump_instr: bool,
    /// `--dump-line=yes` (the default): source lines.
    pub dump_line: bool,
}

impl Default for OutputOptions {
    fn default() -> Self {
        OutputOptions {
            dump_instr: false,
            dump_line: true,
        }
    }
}

/// Where an instruction is: its file (`None`: no debug information) and
/// its position.
type Place = (Option<callgrind::NameId>, Position);

/// The line position of `place` in a part: an instruction without debug
/// information is in `fallback`'s file, else in `???`. Callgrind puts a
/// cost line there in the function's own file ("if we don't have debug
/// info, don't switch to file ???", `dump.c`), but a call's or a jump's
/// in `???` (`get_debug_pos`). (With `???` on cost lines too, Valgrind's
/// `callgrind_annotate` took the next function of the same file, which
/// gets no `fl=` of its own, for one of `???`.)
fn site_of(namer: &mut Namer, (file, position): Place, fallback: Option<FunctionKey>) -> Site {
    let file = file
        .or(fallback.map(|k| k.file))
        .unwrap_or_else(|| namer.file(NO_DEBUG_INFO));
    Site { file, position }
}

/// Instruction addresses located once each (an address recurs in every
/// context its block ran in), their files interned (`None`: no debug
/// information, whose file depends on the line's kind: [`site_of`]).
struct Locator<'l, 'a> {
    locate: &'l mut Locate<'a>,
    located: FxHashMap<u64, (Option<callgrind::NameId>, u32)>,
    options: OutputOptions,
}

impl Locator<'_, '_> {
    /// Where `addr` is.
    fn place(&mut self, namer: &mut Namer, addr: u64) -> Place {
        let locate = &mut *self.locate;
        let (file, line) = *self.located.entry(addr).or_insert_with(|| {
            let (file, line) = locate(addr);
            ((&*file != NO_DEBUG_INFO).then(|| namer.file(&file)), line)
        });
        let position = Position {
            addr: if self.options.dump_instr { addr } else { 0 },
            line: if self.options.dump_line {
                u64::from(line)
            } else {
                0
            },
        };
        (file, position)
    }

    /// The line position of `addr` ([`site_of`]).
    fn site(&mut self, namer: &mut Namer, addr: u64, fallback: Option<FunctionKey>) -> Site {
        let p = self.place(namer, addr);
        site_of(namer, p, fallback)
    }
}

/// Interns object, file and function names into a profile's tables.
struct Namer<'a> {
    profile: &'a mut Profile,
}

impl Namer<'_> {
    fn file(&mut self, text: &str) -> callgrind::NameId {
        self.profile.names.files.intern(text)
    }
}

impl CallTool {
    /// The threads that ran (Valgrind's numbers), in order.
    pub fn threads(&self) -> Vec<u32> {
        let mut t: Vec<u32> = self.tree.nodes.iter().map(|n| n.thread).collect();
        t.sort_unstable();
        t.dedup();
        t
    }

    /// A part with the costs and calls of `thread` (all threads with
    /// `None`) so far, its names interned in `profile`; positions are
    /// located with `locate` (each address once). The part's header
    /// (number, thread, `desc:`) is the caller's.
    pub fn part(
        &mut self,
        profile: &mut Profile,
        options: OutputOptions,
        thread: Option<u32>,
        locate: &mut Locate<'_>,
    ) -> Part {
        let costs = self.final_dump().costs;
        self.part_of(&costs, profile, options, thread, locate)
    }

    /// A part of the costs of a dump ([`Snapshot`]), as [`part`](Self::part)
    /// lays them out, with Callgrind's event columns and the dump's
    /// `summary:`.
    pub fn part_of(
        &self,
        costs: &Snapshot,
        profile: &mut Profile,
        options: OutputOptions,
        thread: Option<u32>,
        locate: &mut Locate<'_>,
    ) -> Part {
        let mut loc = Locator {
            locate,
            located: FxHashMap::default(),
            options,
        };
        let mut namer = Namer { profile };
        let tree = &self.tree;
        let wanted = |n: NodeId| thread.is_none_or(|t| tree.nodes[n as usize].thread == t);
        // Callgrind's columns, from the rows' (Cachegrind's order).
        let order: Vec<(&'static str, usize)> = match self.sim() {
            Some(sim) => sim
                .events()
                .callgrind_order()
                .into_iter()
                .map(|(e, i)| (e.name(), i))
                .collect(),
            None => vec![("Ir", 0)],
        };
        // Into a buffer kept for the loops over rows.
        let permute_into = |c: &mut Vec<u64>, row: &[u64]| {
            c.clear();
            c.extend(order.iter().map(|&(_, i)| row[i]));
        };
        let permute = |row: &[u64]| -> Vec<u64> {
            let mut c = Vec::with_capacity(order.len());
            permute_into(&mut c, row);
            c
        };
        let mut c = Vec::with_capacity(order.len());
        // Each context's function key, made once per (function, level,
        // callers named); the callers are none without
        // `--separate-callers`, which allocates nothing.
        let mut keys: FxHashMap<(FnId, u32, Box<[FnId]>), FunctionKey> = FxHashMap::default();
        // And per node, once known (a node has many cost lines).
        let mut node_keys: Vec<Option<FunctionKey>> = vec![None; tree.nodes.len()];
        let mut key_of = |namer: &mut Namer, n: NodeId| -> FunctionKey {
            if let Some(key) = node_keys[n as usize] {
                return key;
            }
            let node = tree.nodes[n as usize];
            let c = &self.functions[node.function as usize].class;
            let separate = c
                .config
                .separate_callers
                .unwrap_or(self.options.separate_callers);
            let callers = context_callers(tree, n, separate);
            let key = *keys
                .entry((node.function, node.level, callers))
                .or_insert_with_key(|(_, _, callers)| {
                    // Callgrind's mangled name: the function, its level from
                    // 2 on, then each caller's plain name.
                    let mut name = c.function.to_string();
                    if node.level > 1 {
                        name += &format!("'{}", node.level);
                    }
                    for &f in callers.iter() {
                        name.push('\'');
                        name += &self.functions[f as usize].class.function;
                    }
                    let names = &mut namer.profile.names;
                    FunctionKey {
                        object: Some(names.objects.intern(&c.object)),
                        file: names.files.intern(&c.file),
                        function: names.functions.intern(&name),
                    }
                });
            node_keys[n as usize] = Some(key);
            key
        };
        let mut builder = PartBuilder::new(order.len());
        let mut total = vec![0u64; order.len()];
        let add = |total: &mut Vec<u64>, c: &[u64]| {
            for (t, v) in total.iter_mut().zip(c) {
                *t += v;
            }
        };
        let width = costs.summary.len().max(1);
        let costs_width = costs.width.max(1);
        // Self costs: a row per instruction of each block run in a context.
        for (node, block, rows) in &costs.selfs {
            if !wanted(*node) {
                continue;
            }
            let key = key_of(&mut namer, *node);
            for (&addr, row) in self
                .block_state(*block)
                .instrs
                .iter()
                .zip(rows.chunks(width))
            {
                permute_into(&mut c, row);
                let s = loc.site(&mut namer, addr, Some(key));
                builder.add_cost(key, s, &c);
                add(&mut total, &c);
            }
        }
        // Per block: its instructions' sites, each run of equal ones as
        // one with its length, made once (a block runs in many contexts),
        // at `sites[block_sites[block]]`.
        let mut sites: Vec<(Place, u64)> = Vec::new();
        let mut block_sites: Vec<(u32, u32)> = Vec::new();
        // The runs summed per (function key, block), in order of first
        // use: a block's cost lines are its function's at each context's
        // level, so one function key takes the runs of all its contexts
        // (the 2 M pairs of a python JSON run become 47 K). Names are
        // interned, and the sums made, in the order the pairs come, so
        // the part is the one a cost line per pair makes.
        let mut summed: Vec<(FunctionKey, u32, u64)> = Vec::new();
        // Per block, its last entry of `summed`; per entry, the one before
        // of the same block (a block runs under a few keys).
        let mut block_last: Vec<u32> = Vec::new();
        let mut before: Vec<u32> = Vec::new();
        const NONE: u32 = u32::MAX;
        for &(node, block, runs) in &costs.runs {
            if !wanted(node) {
                continue;
            }
            let key = key_of(&mut namer, node);
            let b = block as usize;
            if block_sites.len() <= b {
                block_sites.resize(b + 1, (NONE, 0));
                block_last.resize(b + 1, NONE);
            }
            if block_sites[b].0 == NONE {
                let start = sites.len();
                for &addr in self.block_state(block).instrs.iter() {
                    let s = loc.place(&mut namer, addr);
                    match sites[start..].last_mut() {
                        Some((last, n)) if *last == s => *n += 1,
                        _ => sites.push((s, 1)),
                    }
                }
                block_sites[b] = (start as u32, (sites.len() - start) as u32);
            }
            let mut e = block_last[b];
            while e != NONE && summed[e as usize].0 != key {
                e = before[e as usize];
            }
            if e == NONE {
                before.push(block_last[b]);
                block_last[b] = summed.len() as u32;
                summed.push((key, block, runs));
            } else {
                let s = &mut summed[e as usize].2;
                *s = s.wrapping_add(runs);
            }
        }
        for &(key, block, runs) in &summed {
            let (start, len) = block_sites[block as usize];
            for &(p, n) in &sites[start as usize..][..len as usize] {
                let ir = runs.wrapping_mul(n);
                builder.add_cost(key, site_of(&mut namer, p, Some(key)), &[ir]);
                total[0] = total[0].wrapping_add(ir);
            }
        }
        for (&(node, addr), row) in costs
            .extra
            .iter()
            .zip(costs.extra_costs.chunks(costs_width))
        {
            if !wanted(node) {
                continue;
            }
            let key = key_of(&mut namer, node);
            permute_into(&mut c, row);
            // (At a call site, as Callgrind prints skipped functions' Ir.)
            let s = loc.site(&mut namer, addr, None);
            builder.add_cost(key, s, &c);
            add(&mut total, &c);
        }
        for ((i, calls), inclusive) in costs.arcs.iter().zip(costs.arc_costs.chunks(costs_width)) {
            let arc = tree.arcs[*i as usize];
            if !wanted(arc.caller) {
                continue;
            }
            let caller = key_of(&mut namer, arc.caller);
            let callee = key_of(&mut namer, arc.callee);
            let s = loc.site(&mut namer, arc.call_site, None);
            let target = loc.place(&mut namer, arc.target).1;
            permute_into(&mut c, inclusive);
            builder.add_call(caller, s, callee, target, *calls, &c);
        }
        // Jumps go from the block left's last instruction to the entered
        // block's first. Callgrind leaves out those whose target has no
        // line when positions are lines alone.
        for j in &costs.jumps {
            if !wanted(j.from.0) {
                continue;
            }
            let from = self.block_state(j.from.1);
            let Some(&source) = from.instrs.last() else {
                continue;
            };
            let Some(&start) = self.block_state(j.to.1).instrs.first() else {
                continue;
            };
            let target = loc.site(&mut namer, start, None);
            if !options.dump_instr && target.position.line == 0 {
                continue;
            }
            let s = loc.site(&mut namer, source, None);
            let (key, to) = (key_of(&mut namer, j.from.0), key_of(&mut namer, j.to.0));
            let kind = if from.jumps.conditional() {
                JumpKind::Conditional {
                    taken: j.count,
                    executed: j.executed,
                }
            } else {
                JumpKind::Always { count: j.count }
            };
            builder.add_jump(key, s, to.function, target, kind);
        }
        Part {
            positions: Positions {
                instr: options.dump_instr,
                line: options.dump_line,
            },
            events: order
                .iter()
                .map(|&(name, _)| Event {
                    name: name.into(),
                    long_name: None,
                })
                .collect(),
            // Callgrind leaves trailing zero costs out of these lines too.
            summary: Some(trim_zeros(permute(&costs.summary))),
            totals: Some(trim_zeros(total)),
            blocks: builder.finish(),
            ..Part::default()
        }
    }

    /// Block executions so far (for `desc: Timerange:`).
    pub fn block_runs(&self) -> u64 {
        self.block_runs
    }
}

/// The last `n` callers of context `node` as Callgrind's context of
/// `--separate-callers=n` has them, nearest first: the functions of its
/// ancestors, each run of one function (a recursion, whose contexts are
/// nodes of their own here) counted once, as Callgrind's function stack
/// pushes no function onto itself. A root (a thread's first function, a
/// signal handler, the function an underflow returned to) has none, as
/// Callgrind's stack starts each of them above a separator.
fn context_callers(tree: &Tree, node: NodeId, n: u32) -> Box<[FnId]> {
    let mut callers = Vec::new();
    if n == 0 {
        return callers.into();
    }
    let mut last = tree.nodes[node as usize].function;
    let mut at = tree.nodes[node as usize].parent;
    while at != NO_NODE && callers.len() < n as usize {
        let up = tree.nodes[at as usize];
        if up.function != last {
            callers.push(up.function);
            last = up.function;
        }
        at = up.parent;
    }
    callers.into()
}

/// `costs` without its trailing zeros (Callgrind's `summary:` and
/// `totals:` lines end at the last non-zero cost), the first one kept.
fn trim_zeros(mut costs: Vec<u64>) -> Vec<u64> {
    while costs.len() > 1 && costs.last() == Some(&0) {
        costs.pop();
    }
    costs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn callers_count_a_recursion_once_and_end_at_a_root() {
        let (main, a, b) = (0, 1, 2);
        let mut t = Tree::default();
        let root = t.child(NO_NODE, main, 1, 1);
        let a1 = t.child(root, a, 1, 1);
        let a2 = t.child(a1, a, 2, 1);
        let b1 = t.child(a2, b, 1, 1);
        let a3 = t.child(b1, a, 2, 1);
        let callers = |n, k| context_callers(&t, n, k).into_vec();
        assert_eq!(callers(a3, 0), []);
        assert_eq!(callers(a3, 1), [b]);
        assert_eq!(callers(a3, 3), [b, a, main]);
        assert_eq!(callers(b1, 5), [a, main], "a'2 and a are one caller");
        assert_eq!(callers(a2, 2), [main]);
        assert_eq!(callers(root, 2), []);
    }
}
