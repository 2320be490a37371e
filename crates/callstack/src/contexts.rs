//! Calling contexts the client kept itself (`ctxrt`, see
//! `docs/client-contexts.md`), folded into the tree: the runtime's
//! contexts are Callgrind's (parent, function, recursion level) as the
//! call tool makes them, its arcs carry their calls and inclusive Ir, and
//! its counters hold each block's Ir per context (skipped code's per call
//! site, another function's code run without a call per context).

use crate::tool::{CallOptions, CallTool};
use crate::tree::{FnId, NodeId, Tree, NO_NODE};
use crate::Classify;
use ctxrt::{hot, Arena, NodeKind, NumberedBlock, Runtime, CALL_MEMO_WORDS, NONE};
use events::{BlockId, BlockInfo, Tool};

/// One thread's contexts as the client left them.
pub struct ThreadArena<'a> {
    /// Valgrind's thread number.
    pub thread: u32,
    /// Its hot words.
    pub hot: &'a [u64],
    /// Its arena's used words (the calls still running are ended in
    /// them, in place: copying python's arena cost a few hundred MB).
    pub arena: &'a mut [u64],
}

/// The call tool holding what a process's threads kept in contexts mode:
/// `blocks` (each block id's description, with the function, counter
/// group and number in it the engine's classification gave it, and
/// whether its counter is followed by a call memo, `ctxrt::Facts::memo`)
/// are described to the tool with
/// `classify`, and each thread's arena, its running calls ended, folded
/// into its tree. The tool then writes Callgrind's files as after a
/// stream run.
pub fn into_tool(
    options: CallOptions,
    classify: Box<dyn Classify>,
    blocks: &[Option<NumberedBlock<BlockInfo>>],
    threads: &mut [ThreadArena],
) -> Result<CallTool, String> {
    let mut tool = CallTool::new(options.clone(), classify);
    // The client's function numbers to the tool's, and each (counter
    // group, number) to its block: both are dense numbers, so tables
    // rather than maps (the fold looks a block up per counter).
    let mut functions: Vec<FnId> = Vec::new();
    let mut by_index = Numbered::default();
    for (id, b) in blocks.iter().enumerate() {
        let Some(NumberedBlock {
            info,
            function: f,
            group,
            index,
            memo,
        }) = b
        else {
            continue;
        };
        tool.block(BlockId(id as u32), info);
        let mine = tool.function_of_block(id as u32).expect("just described");
        let f = *f as usize;
        if functions.len() <= f {
            functions.resize(f + 1, NO_FUNCTION);
        }
        if functions[f] == NO_FUNCTION {
            functions[f] = mine;
        } else if functions[f] != mine {
            return Err(format!("function {f} names two of the tool's"));
        }
        by_index.insert(
            *group,
            *index,
            Word::Block(id as u32, info.instrs().len() as u32),
        );
        if *memo {
            for i in 1..=CALL_MEMO_WORDS as u32 {
                by_index.insert(*group, index + i, Word::Memo);
            }
        }
    }
    let mut folder = Folder::new(&tool.tree, blocks.len());
    for t in threads {
        let arena = &mut *t.arena;
        let mut hot_words = t.hot.to_vec();
        if arena.is_empty() || hot_words.len() < hot::WORDS {
            continue;
        }
        // Calls still running end now (their inclusive costs so far).
        Runtime {
            hot: &mut hot_words,
            arena,
            facts: &[],
            separate_recs: options.separate_recs,
            // Ending calls makes no contexts.
            flat: false,
        }
        .finish();
        let runs = folder.fold(
            &mut tool.tree,
            &Arena::new(arena),
            t.thread,
            |g, i| by_index.get(g, i),
            |f| {
                functions
                    .get(f as usize)
                    .copied()
                    .filter(|&f| f != NO_FUNCTION)
            },
        )?;
        tool.block_runs += runs;
        tool.adopt_thread(t.thread, hot_words[hot::IR]);
    }
    Ok(tool)
}

/// No function of the tool's (a client function number no block has).
const NO_FUNCTION: FnId = FnId::MAX;

/// What a word of a context's counters is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Word {
    /// The counter of a block: its id and instruction count.
    Block(u32, u32),
    /// A word of the call memo after a call block's counter: not a count.
    Memo,
}

/// Counter words by counter group and number in it.
#[derive(Default)]
struct Numbered {
    groups: Vec<Vec<Option<Word>>>,
}

impl Numbered {
    fn insert(&mut self, group: u32, index: u32, word: Word) {
        let (g, i) = (group as usize, index as usize);
        if self.groups.len() <= g {
            self.groups.resize_with(g + 1, Vec::new);
        }
        let words = &mut self.groups[g];
        if words.len() <= i {
            words.resize(i + 1, None);
        }
        words[i] = Some(word);
    }

    #[inline]
    fn get(&self, group: u32, index: u32) -> Option<Word> {
        *self.groups.get(group as usize)?.get(index as usize)?
    }
}

/// Folds one thread's arena into `tree` as thread `thread`. `block`
/// says what a counter group's word is by its number in the group (a
/// block's counter, with its id and instruction count, or a call memo's
/// word, which is skipped); counters it does not know are an error (the
/// translator numbered every block it made). `function` maps
/// the client's function numbers to the tree's. Returns the block
/// executions folded.
pub fn fold(
    tree: &mut Tree,
    arena: &Arena,
    thread: u32,
    block: impl Fn(u32, u32) -> Option<Word>,
    function: impl Fn(FnId) -> Option<FnId>,
) -> Result<u64, String> {
    let blocks = tree.run_keys.iter().map(|&(_, b)| b as usize + 1).max();
    let mut folder = Folder::new(tree, blocks.unwrap_or(0));
    folder.fold(tree, arena, thread, block, function)
}

/// No slot.
const NO_SLOT: u32 = u32::MAX;

/// What the fold keeps to find a (context, block)'s run slot without a
/// hash per pair: the arena's counters come grouped by node, and a
/// context is charged by its own node and, rarely, by others (a foreign
/// node's code, a thread number used again), so each context's slots are
/// a list, and a table by block says which slot of the context charged
/// last holds the block.
struct Folder {
    /// Per tree node, its last slot (`NO_SLOT`: none), at the node's
    /// number plus one (code charged to no context is at 0).
    last: Vec<u32>,
    /// Per slot, the slot of the same node before it.
    before: Vec<u32>,
    /// Per block id, a (node, slot) holding it; complete for `stamped`.
    stamps: Vec<(NodeId, u32)>,
    /// The node all of whose slots are in `stamps`.
    stamped: Option<NodeId>,
    /// The threads the tree has nodes of.
    threads: rustc_hash::FxHashSet<u32>,
    /// Per function of the tool's, the client's function number plus one
    /// that the thread being folded mapped to it (0: none yet).
    owner: Vec<u32>,
}

impl Folder {
    /// A folder for `tree` (its slots listed) and blocks below `blocks`.
    fn new(tree: &Tree, blocks: usize) -> Folder {
        let mut f = Folder {
            last: vec![NO_SLOT; tree.nodes.len() + 1],
            before: Vec::with_capacity(tree.run_keys.len()),
            stamps: vec![(NO_NODE, NO_SLOT); blocks],
            stamped: None,
            threads: tree.nodes.iter().map(|n| n.thread).collect(),
            owner: Vec::new(),
        };
        for (slot, &(node, _)) in tree.run_keys.iter().enumerate() {
            f.link(node, slot as u32);
        }
        f
    }

    /// Records `slot` as `node`'s last.
    #[inline]
    fn link(&mut self, node: NodeId, slot: u32) {
        let n = node.wrapping_add(1) as usize;
        if self.last.len() <= n {
            self.last.resize(n + 1, NO_SLOT);
        }
        self.before.push(self.last[n]);
        self.last[n] = slot;
    }

    /// Makes `stamps` complete for `node`.
    fn stamp(&mut self, tree: &Tree, node: NodeId) {
        if self.stamped == Some(node) {
            return;
        }
        self.stamped = Some(node);
        let n = node.wrapping_add(1) as usize;
        let mut slot = self.last.get(n).copied().unwrap_or(NO_SLOT);
        while slot != NO_SLOT {
            let b = tree.run_keys[slot as usize].1 as usize;
            if self.stamps.len() <= b {
                self.stamps.resize(b + 1, (NO_NODE, NO_SLOT));
            }
            self.stamps[b] = (node, slot);
            slot = self.before[slot as usize];
        }
    }

    /// The slot of `block` in `node` (made if new), `node` stamped.
    #[inline]
    fn slot(&mut self, tree: &mut Tree, node: NodeId, block: u32) -> u32 {
        let b = block as usize;
        if self.stamps.len() <= b {
            self.stamps.resize(b + 1, (NO_NODE, NO_SLOT));
        }
        match self.stamps[b] {
            (n, slot) if n == node => slot,
            _ => {
                let slot = tree.push_slot(node, block);
                self.link(node, slot);
                self.stamps[b] = (node, slot);
                slot
            }
        }
    }

    /// [`fold`] with this folder's lists.
    fn fold(
        &mut self,
        tree: &mut Tree,
        arena: &Arena,
        thread: u32,
        block: impl Fn(u32, u32) -> Option<Word>,
        function: impl Fn(FnId) -> Option<FnId>,
    ) -> Result<u64, String> {
        let mut runs_folded = 0;
        let mut nodes: Vec<NodeId> = Vec::with_capacity(arena.nodes().size_hint().0);
        // The arena has one context per (parent, function, level), as the
        // tree has one node: while the thread's tree is new and the
        // client's functions map to distinct ones of the tool's, each of
        // its contexts (and so each arc) is a node (an arc) of its own,
        // made without looking for it (the lookups were a third of the
        // fold). Two client functions of one tool function (never seen)
        // would merge contexts: from there on, each is looked up.
        let mut direct = self.threads.insert(thread);
        self.owner.clear();
        let node = |nodes: &[NodeId], id: u64| -> Result<NodeId, String> {
            if id == NONE {
                return Ok(NO_NODE);
            }
            nodes
                .get(id as usize)
                .copied()
                .filter(|&n| n != NO_NODE)
                .ok_or_else(|| format!("context {id} is named before it is made"))
        };
        for n in arena.nodes() {
            let parent = node(&nodes, n.parent)?;
            let own = match n.kind {
                NodeKind::Context => {
                    let f = function(n.function)
                        .ok_or_else(|| format!("a context of unknown function {}", n.function))?;
                    if direct {
                        let i = f as usize;
                        if self.owner.len() <= i {
                            self.owner.resize(i + 1, 0);
                        }
                        let client = n.function + 1;
                        match self.owner[i] {
                            0 => self.owner[i] = client,
                            c => direct = c == client,
                        }
                    }
                    if direct {
                        tree.push_node(parent, f, n.level, thread)
                    } else {
                        tree.child(parent, f, n.level, thread)
                    }
                }
                NodeKind::Skip | NodeKind::Foreign => NO_NODE,
            };
            nodes.push(own);
            let at = if own == NO_NODE { parent } else { own };
            if n.kind != NodeKind::Skip {
                self.stamp(tree, at);
            }
            // A skip node's code is all charged to its call site.
            let mut skip_ir = 0u64;
            for (i, &ir) in n.counters.iter().enumerate().filter(|(_, &ir)| ir > 0) {
                let (id, instrs) = match block(n.group, i as u32) {
                    Some(Word::Block(id, instrs)) => (id, instrs),
                    Some(Word::Memo) => continue,
                    None => return Err(format!("no block {i} of counter group {}", n.group)),
                };
                match n.kind {
                    NodeKind::Skip => skip_ir = skip_ir.wrapping_add(ir),
                    NodeKind::Context | NodeKind::Foreign => {
                        let instrs = u64::from(instrs.max(1));
                        if ir % instrs != 0 {
                            return Err(format!(
                                "block {id} counted {ir} Ir in runs of {instrs} (counter group {}, number {i}, {:?})",
                                n.group, n.kind
                            ));
                        }
                        let slot = self.slot(tree, at, id) as usize;
                        tree.runs[slot] += ir / instrs;
                        runs_folded += ir / instrs;
                    }
                }
            }
            if skip_ir > 0 {
                *tree.extra.at(parent, n.site) += skip_ir;
            }
        }
        for a in arena.arcs() {
            let (caller, callee) = (node(&nodes, a.caller)?, node(&nodes, a.callee)?);
            let i = if direct {
                tree.push_arc(caller, a.site, callee, a.target)
            } else {
                tree.arc(caller, a.site, callee, a.target)
            } as usize;
            tree.arcs[i].calls += a.calls;
            tree.arcs[i].inclusive += a.inclusive;
        }
        Ok(runs_folded)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testprog::{program, results, Machine, Program, Results, Rng};
    use ctxrt::FACT_WORDS;

    /// Runs `p` for up to `steps` blocks from f0, feeding each block to the
    /// call tool and, as translated code would, to the client runtime
    /// (keeping only (function, level) contexts if `flat`); returns both
    /// trees' self Ir per context and arcs, by names (contexts named by
    /// their function and level alone if `flat`).
    fn run_both(p: &Program, rng: &mut Rng, steps: usize, flat: bool) -> ([Results; 2], u64) {
        let mut tool = CallTool::new(CallOptions::default(), Box::new(p.clone()));
        let mut facts = vec![0u64; p.blocks.len() * FACT_WORDS];
        for b in 0..p.blocks.len() {
            facts[b * FACT_WORDS..][..FACT_WORDS].copy_from_slice(&p.facts(b).pack());
        }
        let mut hot = vec![0u64; hot::WORDS];
        hot[hot::LAST] = NONE;
        let mut arena = vec![0u64; 1 << 20];
        let mut described = vec![false; p.blocks.len()];
        let mut machine = Machine::default();
        let (mut b, mut last): (usize, Option<usize>) = (0, None);
        for _ in 0..steps {
            let blk = &p.blocks[b];
            let sp = machine.sp;
            // The client: a context entry unless control stays plainly.
            let y = p.facts(b);
            let plain = last.is_some_and(|x| {
                let x = p.facts(x);
                !x.sp_known
                    && !y.flow.entry
                    && x.flow.domain == y.flow.domain
                    && x.flow.function == y.flow.function
            });
            let mut rt = Runtime {
                hot: &mut hot,
                arena: &mut arena,
                facts: &facts,
                separate_recs: 2,
                flat,
            };
            if !plain {
                rt.hot[hot::LAST] = last.map_or(NONE, |x| x as u64);
                rt.enter(b as u64, sp).expect("room");
            }
            let mut cur = rt.hot[hot::CUR] as usize / 8;
            if u64::from(y.last_word()) >= rt.arena[cur - 1] {
                rt.grow(b as u64).expect("room");
                cur = rt.hot[hot::CUR] as usize / 8;
            }
            rt.arena[cur + y.index as usize] += blk.instrs;
            rt.hot[hot::IR] += blk.instrs;
            // The call tool.
            let mut info = BlockInfo::new(blk.start, blk.term);
            for i in 0..blk.instrs {
                info.push(blk.start + i, 1, &[]);
            }
            if !described[b] {
                tool.block(BlockId(b as u32), &info);
                described[b] = true;
            }
            tool.block_run(BlockId(b as u32), &info, &[]);
            let next = machine.next(p, rng, b, &mut tool);
            last = Some(b);
            b = next;
        }
        tool.finish();
        Runtime {
            hot: &mut hot,
            arena: &mut arena,
            facts: &facts,
            separate_recs: 2,
            flat,
        }
        .finish();
        // The client's, folded.
        let mut tree = Tree::default();
        let by_index = |f: FnId, i: u32| {
            let blocks = &p.functions.get(f as usize)?.blocks;
            let i = i as usize;
            let b = *blocks.iter().rfind(|&&b| p.blocks[b].counter <= i)?;
            Some(if p.blocks[b].counter == i {
                Word::Block(b as u32, p.blocks[b].instrs as u32)
            } else {
                Word::Memo
            })
        };
        fold(&mut tree, &Arena::new(&arena), 1, by_index, Some).expect("folds");
        // Each (context, block) has one slot, which the tree's index finds;
        // folded again into the same tree (every context charged a second
        // time), no slot is made and each counts twice.
        let keys: rustc_hash::FxHashSet<_> = tree.run_keys.iter().collect();
        assert_eq!(keys.len(), tree.run_keys.len(), "a slot per pair");
        let mut twice = tree.clone();
        fold(&mut twice, &Arena::new(&arena), 1, by_index, Some).expect("folds");
        assert_eq!(twice.run_keys, tree.run_keys);
        assert!(twice.runs.iter().zip(&tree.runs).all(|(&a, &b)| a == 2 * b));
        for (s, &(n, b)) in tree.run_keys.iter().enumerate() {
            assert_eq!(twice.run_slot(n, b), s as u32);
        }
        let client = results(
            &tree,
            |f| p.functions[f as usize].name.clone(),
            |b| p.blocks[b as usize].instrs,
            flat,
        );
        let names = |f: FnId| tool.functions[f as usize].class.function.to_string();
        let instrs = |b: u32| tool.block_state(b).instrs.len() as u64;
        let stream = results(&tool.tree, names, instrs, flat);
        ([stream, client], Arena::new(&arena).entries().1)
    }

    #[test]
    fn the_client_runtime_keeps_the_call_tools_contexts_on_random_programs() {
        for flat in [false, true] {
            let mut fast = 0;
            for seed in 1..=300u64 {
                let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
                let p = program(&mut rng);
                let ([stream, client], fast_entries) = run_both(&p, &mut rng, 400, flat);
                assert_eq!(client, stream, "seed {seed}, flat {flat}");
                fast += fast_entries;
            }
            // The fast paths (calls the memo knows, returns, jumps) were
            // taken, and kept the contexts equal.
            assert!(fast > 10_000, "{fast} fast entries, flat {flat}");
        }
    }
}
