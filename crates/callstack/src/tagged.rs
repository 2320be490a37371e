//! Tagged counts the client kept itself (`ctxrt::tagged`, see
//! `docs/client-contexts.md`), folded into the tree: each block's slot
//! and the arena's table hold its Ir per tag, a tag names a context
//! (function and recursion level: Callgrind's flat contexts), a skip
//! record (skipped code, charged to its call site) or a thread's sink
//! (charged to the context its first entry named), and the arcs carry
//! their calls and inclusive Ir.

use crate::tool::{CallOptions, CallTool};
use crate::tree::{FnId, NodeId, Tree, NO_NODE};
use crate::Classify;
use ctxrt::tagged::{
    context_of_tag, slot_counts, Tagged, TaggedArena, NO_TAG, SINK_TAGS, SKIP_TAGS,
};
use ctxrt::{hot, NumberedBlock};
use events::{BlockId, BlockInfo, Tool};

/// One thread's tagged counts as the client left them.
pub struct TaggedThread<'a> {
    /// Valgrind's thread number.
    pub thread: u32,
    /// Its hot words.
    pub hot: &'a [u64],
    /// Its arena's used words (the calls still running are ended in
    /// them, in place).
    pub arena: &'a mut [u64],
    /// Its blocks' slots ([`SLOT_WORDS`](ctxrt::tagged::SLOT_WORDS) per block id).
    pub slots: &'a [u64],
}

/// The call tool holding what a process's threads kept in tagged
/// counting: `blocks` (each block id's description and function, as the
/// engine classified it) are described to the tool with `classify`, and
/// each thread's counts, its running calls ended, folded into its tree.
/// The tool then writes Callgrind's files as after a stream run.
pub fn into_tool(
    options: CallOptions,
    classify: Box<dyn Classify>,
    blocks: &[Option<NumberedBlock<BlockInfo>>],
    threads: &mut [TaggedThread],
) -> Result<CallTool, String> {
    let mut tool = CallTool::new(options.clone(), classify);
    let mut functions: Vec<FnId> = Vec::new();
    let mut instrs: Vec<u32> = vec![0; blocks.len()];
    for (id, b) in blocks.iter().enumerate() {
        let Some(NumberedBlock {
            info, function: f, ..
        }) = b
        else {
            continue;
        };
        tool.block(BlockId(id as u32), info);
        instrs[id] = (info.instrs().len() as u32).max(1);
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
    }
    for t in threads {
        let mut hot_words = t.hot.to_vec();
        if t.arena.is_empty() || hot_words.len() < hot::WORDS {
            continue;
        }
        Tagged {
            hot: &mut hot_words,
            arena: t.arena,
            slots: &mut [],
            memos: &mut [],
            facts: &[],
            separate_recs: options.separate_recs,
        }
        .finish();
        let runs = fold(
            &mut tool.tree,
            &TaggedArena::new(t.arena),
            t.slots,
            t.thread,
            |b| instrs.get(b as usize).copied().filter(|&n| n > 0),
            |f| {
                functions
                    .get(f as usize)
                    .copied()
                    .filter(|&f| f != NO_FUNCTION)
            },
            options.separate_recs,
        )?;
        tool.block_runs += runs;
        tool.adopt_thread(t.thread, hot::running_ir(&hot_words));
    }
    Ok(tool)
}

/// No function of the tool's (a client function number no block has).
const NO_FUNCTION: FnId = FnId::MAX;

/// Folds one thread's tagged counts (its arena and slots) into `tree` as
/// thread `thread`. `instrs` gives a block's instruction count (`None`:
/// a block the translator never described, an error), `function` maps the
/// client's function numbers to the tree's; `recs` is `--separate-recs`.
/// Returns the block executions folded.
pub fn fold(
    tree: &mut Tree,
    arena: &TaggedArena,
    slots: &[u64],
    thread: u32,
    instrs: impl Fn(u64) -> Option<u32>,
    function: impl Fn(u32) -> Option<FnId>,
    recs: u32,
) -> Result<u64, String> {
    let adopters: Vec<u64> = arena.sink_adopters().collect();
    let node = |tree: &mut Tree, tag: u64| -> Result<NodeId, String> {
        if tag == NO_TAG {
            return Ok(NO_NODE);
        }
        if tag >= SKIP_TAGS {
            return Err(format!("tag {tag:#x} names no context"));
        }
        let (f, level) = context_of_tag(tag, recs);
        let f = function(f).ok_or_else(|| format!("a context of unknown function {f}"))?;
        Ok(tree.child(NO_NODE, f, level, thread))
    };
    let mut runs_folded = 0;
    for (tag, b, ir) in slot_counts(slots).chain(arena.counts()) {
        let mut tag = tag;
        if tag >= SINK_TAGS {
            // A sink no entry named is a thread that never entered a
            // context: its blocks are nobody's, as in contexts mode.
            tag = adopters
                .get((tag - SINK_TAGS) as usize)
                .copied()
                .unwrap_or(NO_TAG);
            if tag == NO_TAG {
                continue;
            }
        }
        if tag >= SKIP_TAGS {
            let (caller, site) = arena
                .skip_record(tag - SKIP_TAGS)
                .ok_or_else(|| format!("no skip record {}", tag - SKIP_TAGS))?;
            let at = node(tree, caller)?;
            *tree.extra.at(at, site) += ir;
            continue;
        }
        if tag == NO_TAG {
            return Err(format!("block {b} counted {ir} Ir for no context"));
        }
        let n = u64::from(instrs(b).ok_or_else(|| format!("block {b} was never described"))?);
        if ir % n != 0 {
            return Err(format!("block {b} counted {ir} Ir in runs of {n}"));
        }
        let at = node(tree, tag)?;
        let slot = tree.run_slot(at, b as u32) as usize;
        tree.runs[slot] += ir / n;
        runs_folded += ir / n;
    }
    // What skipped code's blocks counted in their records, not in slots.
    for (caller, site, ir) in arena.skip_records().filter(|r| r.2 != 0) {
        let at = node(tree, caller)?;
        *tree.extra.at(at, site) += ir;
    }
    for a in arena.arcs() {
        let (caller, callee) = (node(tree, a.caller)?, node(tree, a.callee)?);
        let i = tree.arc(caller, a.site, callee, a.target) as usize;
        tree.arcs[i].calls += a.calls;
        tree.arcs[i].inclusive += a.inclusive;
    }
    Ok(runs_folded)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testprog::{program, results, Machine, Program, Results, Rng};
    use ctxrt::tagged::{fresh_thread, MEMO_WORDS, SLOT_WORDS};
    use ctxrt::{FACT_WORDS, NONE};
    use events::Terminator;

    /// Runs `p` for up to `steps` blocks from f0, feeding each block to the
    /// call tool and, as translated code would, to the tagged runtime:
    /// a context entry unless Callgrind's rules cannot change the context
    /// there (whatever function the block is of), the block's Ir into its
    /// slot, retagged where its tag is not the current one. Returns both
    /// trees' results (contexts named by function and level), and the
    /// entries and retags.
    fn run_both(p: &Program, rng: &mut Rng, steps: usize) -> ([Results; 2], [u64; 11], u64) {
        let mut tool = CallTool::new(CallOptions::default(), Box::new(p.clone()));
        let mut facts = vec![0u64; p.blocks.len() * FACT_WORDS];
        for b in 0..p.blocks.len() {
            facts[b * FACT_WORDS..][..FACT_WORDS].copy_from_slice(&p.facts(b).pack());
        }
        let mut hot = fresh_thread(0, 1 << 20).to_vec();
        let mut arena = vec![0u64; 1 << 20];
        let mut slots = vec![0u64; p.blocks.len() * SLOT_WORDS];
        let mut memos = vec![0u64; p.blocks.len() * MEMO_WORDS];
        let mut described = vec![false; p.blocks.len()];
        let mut machine = Machine::default();
        // Inline paths taken: returns of one frame, of two, calls from
        // skipped code, jumps, direct calls, into skipped code, indirect,
        // returns of more frames, tail calls (jumps taken for calls), into
        // skipped code, through a pointer.
        let mut paths = [0u64; 11];
        let (mut b, mut last): (usize, Option<usize>) = (0, None);
        for _ in 0..steps {
            let blk = &p.blocks[b];
            let sp = machine.sp;
            let y = p.facts(b);
            let plain = last.is_some_and(|x| {
                let x = p.facts(x);
                !x.sp_known && !y.flow.entry && x.flow.domain == y.flow.domain
            });
            let mut rt = Tagged {
                hot: &mut hot,
                arena: &mut arena,
                slots: &mut slots,
                memos: &mut memos,
                facts: &facts,
                separate_recs: 2,
            };
            // The inline paths translated code takes first: a return, and
            // a direct call of code that is not skipped.
            let depth = rt.arena[ctxrt::tagged::head::DEPTH];
            let inline = last.is_some_and(|x| {
                let xf = p.facts(x);
                let f = y.flow.function;
                match p.blocks[x].term {
                    Terminator::Return => rt.inline_return(sp),
                    Terminator::IndirectJump if xf.flow.skip => {
                        let call = y.flow.entry || xf.flow.domain != y.flow.domain;
                        call && !y.flow.skip && rt.inline_skipped_call(f, y.flow.start, sp)
                    }
                    Terminator::IndirectJump if y.flow.entry || xf.flow.domain != y.flow.domain => {
                        !y.flow.skip
                            && rt.inline_indirect_jump_call(x as u64, b as u64, y.flow.start, f, sp)
                    }
                    Terminator::IndirectJump => {
                        rt.inline_jump(xf.flow.domain, y.flow.domain, y.flow.entry, sp)
                    }
                    Terminator::Call { .. } => {
                        let site = y.flow.skip.then(|| xf.flow.call_site());
                        rt.inline_call(x as u64, f, sp, xf.flow.end(), site)
                    }
                    Terminator::Jump { .. } if y.flow.entry || xf.flow.domain != y.flow.domain => {
                        let site = y.flow.skip.then(|| xf.flow.call_site());
                        rt.inline_jump_call(x as u64, f, site)
                    }
                    Terminator::IndirectCall => {
                        !y.flow.skip
                            && rt.inline_indirect_call(
                                x as u64,
                                b as u64,
                                y.flow.start,
                                f,
                                sp,
                                xf.flow.end(),
                            )
                    }
                    _ => false,
                }
            });
            if inline {
                // Which path: a return that popped two frames counts apart.
                let x = last.expect("a block left");
                let popped = depth.wrapping_sub(rt.arena[ctxrt::tagged::head::DEPTH]);
                let kind = match (p.blocks[x].term, p.facts(x).flow.skip) {
                    (Terminator::Return, _) if popped > 2 => 7,
                    (Terminator::Return, _) => popped as usize - 1,
                    (Terminator::IndirectJump, true) => 2,
                    (Terminator::IndirectJump, false) if popped == u64::MAX => 10,
                    (Terminator::IndirectJump, false) => 3,
                    (Terminator::Call { .. }, _) => 4 + usize::from(y.flow.skip),
                    (Terminator::Jump { .. }, _) => 8 + usize::from(y.flow.skip),
                    _ => 6,
                };
                paths[kind] += 1;
            }
            if !plain && !inline {
                rt.hot[hot::LAST] = last.map_or(NONE, |x| x as u64);
                rt.enter(b as u64, sp).expect("room");
            }
            // What inline calls and returns outside skipped code rely on
            // when they leave NS_SKIP and NS_CTX alone: outside it, the
            // current tag is no skip record's.
            if rt.arena[ctxrt::tagged::head::NS_CTX] == NO_TAG {
                assert_eq!(rt.hot[hot::NS_SKIP], NONE, "outside skipped code");
            }
            // Skipped code counts in its skip record, else in its slot.
            if !(y.flow.skip && rt.count_skipped(blk.instrs)) {
                rt.count_in_slot(b as u64, blk.instrs).expect("room");
            }
            rt.hot[hot::ir_word(b as u32)] += blk.instrs;
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
        Tagged {
            hot: &mut hot,
            arena: &mut arena,
            slots: &mut slots,
            memos: &mut memos,
            facts: &facts,
            separate_recs: 2,
        }
        .finish();
        let mut tree = Tree::default();
        let a = TaggedArena::new(&arena);
        let instrs = |b: u64| p.blocks.get(b as usize).map(|b| b.instrs as u32);
        fold(&mut tree, &a, &slots, 1, instrs, Some, 2).expect("folds");
        let client = results(
            &tree,
            |f| p.functions[f as usize].name.clone(),
            |b| p.blocks[b as usize].instrs,
            true,
        );
        let names = |f: FnId| tool.functions[f as usize].class.function.to_string();
        let instrs = |b: u32| tool.block_state(b).instrs.len() as u64;
        let stream = results(&tool.tree, names, instrs, true);
        ([stream, client], paths, a.entries().0)
    }

    #[test]
    fn tagged_counting_keeps_the_call_tools_contexts_on_random_programs() {
        let (mut entries, mut paths) = (0, [0u64; 11]);
        for seed in 1..=300u64 {
            let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
            let p = program(&mut rng);
            let ([stream, client], taken, e) = run_both(&p, &mut rng, 400);
            assert_eq!(client, stream, "seed {seed}");
            entries += e;
            for (all, t) in paths.iter_mut().zip(taken) {
                *all += t;
            }
        }
        // Contexts changed under blocks (recursion levels, code run from
        // other functions' contexts, the PLT from several call sites), and
        // every inline path was taken.
        assert!(entries > 10_000, "{entries} entries");
        assert!(
            paths.iter().all(|&n| n > 100),
            "inline paths taken: {paths:?}"
        );
    }
}
