//! Contexts mode (`docs/client-contexts.md`): the client keeps its own
//! calling contexts through the runtime in its core region. The space
//! classifies code for it (function, object and section kind, as the
//! tool's classifier says), numbers each function's blocks, writes each
//! block's facts into the process's table before the block can run, gives
//! each thread an arena, and reads the arenas back when threads and the
//! process end.

use super::Space;
use crate::layout::{AREA_ARENA, AREA_SIZE, AREA_SLOTS, AREA_TAGGED_ARENA, S_CONTEXT_HOT};
use crate::translate::ContextBlock;
use crate::{ContextClassifier, ContextsProfile, ThreadContexts};
use callrules::Flow;
use ctxrt::tagged;
use ctxrt::{continued_thread, fresh_thread, Facts, NumberedBlock, CALL_MEMO_WORDS, FACT_WORDS};
use events::{BlockInfo, CodeOrigin, Terminator};
use rustc_hash::FxHashMap as HashMap;
use std::sync::Arc;

/// Blocks the facts table has room for (its mapping is reserved, touched
/// as used).
pub const FACTS_CAPACITY: u64 = 1 << 22;

/// One process image's contexts mode.
pub struct Contexts {
    classifier: Box<dyn ContextClassifier>,
    /// The facts table's address in the client.
    facts_at: u64,
    /// Each block id's description, function, counter group and number.
    blocks: Vec<Option<NumberedBlock<BlockInfo>>>,
    /// The next number in each counter group.
    next_index: HashMap<u32, u32>,
    /// The block being translated: its id, number, flow and group, and
    /// whether its call memo follows its counter.
    current: Option<(u32, u32, Flow, u32, bool)>,
    /// Origins by module record.
    origins: Vec<Option<Arc<CodeOrigin>>>,
    /// The arenas of threads that ended, with their thread numbers.
    ended: Vec<ThreadContexts>,
    /// The context stub's exit windows (`Emitter::context_entry_stub`).
    exit_windows: [std::ops::Range<u64>; 2],
    /// Tagged counting (`ctxrt::tagged`).
    tagged: bool,
    /// `--separate-recs`.
    separate_recs: u32,
    /// Tagged counting: translated code counts its inline transitions.
    count_inline: bool,
    /// Tagged counting: host ranges of inline calls and returns, where a
    /// signal waits (by their start).
    quiet: std::collections::BTreeMap<u64, u64>,
}

impl Contexts {
    /// Contexts mode over the facts table mapped at `facts_at`, with the
    /// context stub's exit windows.
    pub fn new(
        classifier: Box<dyn ContextClassifier>,
        facts_at: u64,
        exit_windows: [std::ops::Range<u64>; 2],
        tagged: bool,
        separate_recs: u32,
        count_inline: bool,
    ) -> Contexts {
        Contexts {
            tagged,
            separate_recs,
            count_inline,
            quiet: Default::default(),
            exit_windows,
            classifier,
            facts_at,
            blocks: Vec::new(),
            next_index: HashMap::default(),
            current: None,
            origins: Vec::new(),
            ended: Vec::new(),
        }
    }

    /// A forked child's copy (its arenas are copies of the parent's
    /// memory; ended threads were the parent's).
    pub fn fork(&self) -> Contexts {
        Contexts {
            classifier: self.classifier.fork(),
            facts_at: self.facts_at,
            blocks: self.blocks.clone(),
            next_index: self.next_index.clone(),
            current: None,
            origins: self.origins.clone(),
            ended: Vec::new(),
            exit_windows: self.exit_windows.clone(),
            tagged: self.tagged,
            separate_recs: self.separate_recs,
            count_inline: self.count_inline,
            quiet: self.quiet.clone(),
        }
    }

    /// Whether host address `host` lies in one of the context stub's exit
    /// windows, where a thread leaves the runtime without looking at
    /// `layout::S_SIGNAL_WAITS` again.
    pub fn in_exit_window(&self, host: u64) -> bool {
        self.exit_windows.iter().any(|w| w.contains(&host)) || self.in_quiet(host)
    }

    /// Whether host address `host` lies in an inline call or return of
    /// tagged counting, which a thread is stepped out of before a signal.
    pub fn in_quiet(&self, host: u64) -> bool {
        self.quiet_range(host).is_some()
    }

    /// The inline call or return of tagged counting holding host address
    /// `host`.
    fn quiet_range(&self, host: u64) -> Option<std::ops::Range<u64>> {
        self.quiet
            .range(..=host)
            .next_back()
            .filter(|(_, &end)| host < end)
            .map(|(&start, &end)| start..end)
    }

    /// `--separate-recs`.
    pub fn separate_recs(&self) -> u32 {
        self.separate_recs
    }

    /// Whether this is tagged counting.
    pub fn tagged(&self) -> bool {
        self.tagged
    }

    /// Tagged counting: whether translated code counts its inline calls
    /// and returns.
    pub fn count_inline(&self) -> bool {
        self.count_inline
    }

    /// Tagged counting: `ranges` of a translation are inline calls and
    /// returns.
    pub fn add_quiet(&mut self, ranges: &[std::ops::Range<u64>]) {
        for r in ranges {
            self.quiet.insert(r.start, r.end);
        }
    }
}

impl Space {
    /// Tagged counting: where a thread at `host`, inside an inline call or
    /// return, can next leave them (`quiet::exits`); `None` if it cannot
    /// be told (outside them, or code that cannot be followed).
    pub fn quiet_exits(&mut self, host: u64) -> Option<Vec<u64>> {
        let c = self.contexts.as_ref()?;
        c.quiet_range(host)?;
        let mem = &mut *self.mem;
        super::quiet::exits(
            host,
            |a| c.quiet_range(a),
            |r| mem.read(r.start, (r.end - r.start) as usize).ok(),
        )
    }

    /// Contexts mode from now on (a new process image).
    pub fn set_contexts(&mut self, contexts: Contexts) {
        self.contexts = Some(contexts);
    }

    /// Contexts mode: the hot words and arena start of a thread whose area
    /// is `area` (a new thread, or one reusing an ended thread's area).
    pub(super) fn fresh_contexts(&mut self, area: u64) {
        let Some(c) = self.contexts.as_mut() else {
            return;
        };
        if c.tagged {
            return self.fresh_tagged(area);
        }
        let arena = area + AREA_ARENA;
        // A thread that takes an ended thread's number goes on with that
        // thread's arena, still in the area, as Callgrind goes on with a
        // thread number's call stack (the stream path's tool does too);
        // the copy read at the thread's end is dropped, the arena holding
        // both now.
        let thread = crate::layout::valgrind_thread_id(area) as u32;
        let ended = c.ended.iter().position(|t| t.thread == thread);
        let (writes, hot) = match ended.map(|i| c.ended.remove(i)) {
            Some(t) if t.arena.len() > ctxrt::abi::head::WORDS => {
                let old: [u64; ctxrt::hot::WORDS] = t.hot[..].try_into().expect("hot words");
                let (w, hot) = continued_thread(arena, &old, t.arena[ctxrt::abi::head::NODE]);
                (w.to_vec(), hot)
            }
            _ => {
                let (w, hot) = fresh_thread(arena, (AREA_SIZE - AREA_ARENA) / 8);
                (w.to_vec(), hot)
            }
        };
        for (i, v) in writes {
            self.mem.write(arena + 8 * i as u64, &v.to_le_bytes());
        }
        let bytes: Vec<u8> = hot.iter().flat_map(|w| w.to_le_bytes()).collect();
        self.mem.write(area + u64::from(S_CONTEXT_HOT), &bytes);
    }

    /// Tagged counting: [`Space::fresh_contexts`]. A thread that takes an
    /// ended thread's number goes on with its arena and slots, still in
    /// the area, as in contexts mode.
    fn fresh_tagged(&mut self, area: u64) {
        let c = self.contexts.as_mut().expect("contexts mode");
        let arena = area + AREA_TAGGED_ARENA;
        let thread = crate::layout::valgrind_thread_id(area) as u32;
        let ended = c.ended.iter().position(|t| t.thread == thread);
        let (writes, hot) = match ended.map(|i| c.ended.remove(i)) {
            Some(t) => {
                let old: [u64; ctxrt::hot::WORDS] = t.hot[..].try_into().expect("hot words");
                let (w, hot) = tagged::continued_thread(&old, &t.arena);
                (w.to_vec(), hot)
            }
            // (The header reads zero until the first entry makes it:
            // translated code's inline paths read it.)
            None => (
                (0..tagged::head::WORDS).map(|i| (i, 0)).collect(),
                tagged::fresh_thread(arena, (AREA_SIZE - AREA_TAGGED_ARENA) / 8),
            ),
        };
        for (i, v) in writes {
            self.mem.write(arena + 8 * i as u64, &v.to_le_bytes());
        }
        let bytes: Vec<u8> = hot.iter().flat_map(|w| w.to_le_bytes()).collect();
        self.mem.write(area + u64::from(S_CONTEXT_HOT), &bytes);
    }

    /// Contexts mode: reads the arena of the thread of `area` (numbered
    /// `thread`), which ended or whose process ends, and in tagged
    /// counting its blocks' slots.
    pub(super) fn read_contexts(&mut self, area: u64, thread: u32) -> Option<ThreadContexts> {
        let c = self.contexts.as_ref()?;
        let (tagged, blocks) = (c.tagged, c.blocks.len());
        let arena = area
            + if tagged {
                AREA_TAGGED_ARENA
            } else {
                AREA_ARENA
            };
        let used = self.mem.read(arena, 8).ok()?;
        let used = u64::from_le_bytes(used.try_into().ok()?);
        // Read straight into the words (python's arena is hundreds of
        // megabytes: a copy in bytes first doubled the exit's peak).
        let mut words = vec![0u64; usize::try_from(used).ok()?];
        self.mem
            .read_into(arena, bytemuck::cast_slice_mut(&mut words))
            .ok()?;
        let mut hot = vec![0u64; ctxrt::hot::WORDS];
        self.mem
            .read_into(
                area + u64::from(S_CONTEXT_HOT),
                bytemuck::cast_slice_mut(&mut hot),
            )
            .ok()?;
        let mut slots = Vec::new();
        if tagged {
            slots = vec![0u64; blocks * tagged::SLOT_WORDS];
            self.mem
                .read_into(area + AREA_SLOTS, bytemuck::cast_slice_mut(&mut slots))
                .ok()?;
        }
        Some(ThreadContexts {
            thread,
            hot,
            arena: words,
            slots,
        })
    }

    /// Contexts mode: the thread of `area` ended.
    pub(super) fn contexts_thread_ended(&mut self, area: u64, thread: u32) {
        if let Some(t) = self.read_contexts(area, thread) {
            self.contexts.as_mut().expect("contexts mode").ended.push(t);
        }
    }

    /// Contexts mode: what the process's threads kept, for its profile.
    /// (`last`: as [`Space::collect`]'s.)
    pub(super) fn contexts_profile(
        &mut self,
        live: &[(u64, u32)],
        last: bool,
    ) -> Option<ContextsProfile> {
        self.contexts.as_ref()?;
        let mut threads: Vec<ThreadContexts> = live
            .iter()
            .filter_map(|&(area, thread)| self.read_contexts(area, thread))
            .collect();
        let c = self.contexts.as_mut().expect("contexts mode");
        threads.append(&mut c.ended);
        threads.sort_by_key(|t| t.thread);
        Some(ContextsProfile {
            threads,
            blocks: match last {
                true => std::mem::take(&mut c.blocks),
                false => c.blocks.clone(),
            },
            tagged: c.tagged,
        })
    }
}

/// The classification of the code at `addr` (whose origin is `origin`).
/// (The classifier keeps its answers: cc1's 351,000 of them were kept
/// here as well.)
fn classify(c: &mut Contexts, addr: u64, origin: Option<Arc<CodeOrigin>>) -> (Flow, u32) {
    let mut info = BlockInfo::new(addr, Terminator::FallThrough);
    if let Some(o) = origin {
        info.set_origin(o);
    }
    c.classifier.classify(&info)
}

/// What the translator asks of contexts mode, through the space's
/// translation context.
pub(super) struct ContextsCtx<'a> {
    pub contexts: &'a mut Contexts,
}

impl ContextsCtx<'_> {
    /// The shared origin of module record `index`.
    pub fn origin(&mut self, index: usize, module: &crate::ModuleRecord) -> Arc<CodeOrigin> {
        super::trace::shared_origin(&mut self.contexts.origins, index, module)
    }

    /// The block about to be translated at `guest` (from `origin`): its id
    /// and number in its function.
    pub fn begin(
        &mut self,
        guest: u64,
        origin: Option<Arc<CodeOrigin>>,
    ) -> Result<ContextBlock, String> {
        let (flow, group) = classify(self.contexts, guest, origin);
        let c = &mut *self.contexts;
        let id = c.blocks.len() as u32;
        if u64::from(id) >= FACTS_CAPACITY {
            return Err(format!(
                "more than {FACTS_CAPACITY} blocks translated: the calling-context table is full"
            ));
        }
        c.blocks.push(None);
        let next = c.next_index.entry(group).or_default();
        let index = *next;
        *next += 1;
        c.current = Some((id, index, flow, group, false));
        Ok(ContextBlock {
            id,
            index,
            last: index,
            tagged: c.tagged,
            recs: c.separate_recs,
            count_inline: c.count_inline,
            domain: flow.domain,
            entry: flow.entry,
            skip: flow.skip,
            function: flow.function,
            pop_on_jump: flow.pop_on_jump,
        })
    }

    /// The block being translated may leave its context other than by a
    /// return (a call, a jump out of its counter group): the next numbers
    /// of its group are its call memo's words, right after its counter.
    pub fn reserve_call_memo(&mut self) {
        let c = &mut *self.contexts;
        let Some((_, index, _, group, memo)) = &mut c.current else {
            return;
        };
        let next = c.next_index.entry(*group).or_default();
        debug_assert_eq!(*next, *index + 1, "numbered right after the counter");
        *next += CALL_MEMO_WORDS as u32;
        *memo = true;
    }

    /// Tagged counting: the function of the code at `target` (from
    /// `origin`) and whether it is skipped.
    pub fn callee(&mut self, target: u64, origin: Option<Arc<CodeOrigin>>) -> (u32, bool) {
        let (f, _) = classify(self.contexts, target, origin);
        (f.function, f.skip)
    }

    /// Whether a jump or fall-through from the block being translated to
    /// `target` (from `origin`) keeps the context.
    pub fn same_context(&mut self, target: u64, origin: Option<Arc<CodeOrigin>>) -> bool {
        let Some((_, _, here, group, _)) = self.contexts.current else {
            return false;
        };
        let (there, there_group) = classify(self.contexts, target, origin);
        // Tagged counting counts a block for its context whatever group
        // it is of: Callgrind's rules keep the context at a jump that is
        // not into a function's start nor another object or section.
        let tagged = self.contexts.tagged;
        !there.entry && (tagged || there_group == group) && there.domain == here.domain
    }
}

impl Space {
    /// Contexts mode: the block `id` just translated is `info` (its
    /// origin set): its facts go into the client's table.
    pub(super) fn context_block_done(&mut self, info: BlockInfo) {
        let Some(c) = &mut self.contexts else { return };
        let Some((id, index, _, group, memo)) = c.current.take() else {
            return;
        };
        // The whole block's facts (exit, addresses), as the call tool
        // would describe it.
        let (flow, _) = c.classifier.classify(&info);
        let sp_known = matches!(
            info.terminator(),
            Terminator::Call { .. }
                | Terminator::IndirectCall
                | Terminator::Return
                | Terminator::IndirectJump
        );
        let facts = Facts {
            flow,
            group,
            index,
            instrs: info.instrs().len() as u32,
            sp_known,
            memo,
        };
        let words = facts.pack();
        let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        let at = c.facts_at + (id as usize * FACT_WORDS * 8) as u64;
        c.blocks[id as usize] = Some(NumberedBlock {
            info: info.without_mem_operands(),
            function: flow.function,
            group,
            index,
            memo,
        });
        self.mem.write(at, &bytes);
    }
}

/// The core region's runtime configuration words (`ctxrt::CONFIG_WORDS`):
/// the last is the kind of contexts (`ctxrt::CONTEXTS_TREE`, `_FLAT` or
/// `_TAGGED`).
pub fn runtime_config(
    facts_at: u64,
    separate_recs: u32,
    flat: bool,
    tagged: bool,
) -> [u64; ctxrt::CONFIG_WORDS] {
    let kind = match (tagged, flat) {
        (true, _) => ctxrt::CONTEXTS_TAGGED,
        (false, true) => ctxrt::CONTEXTS_FLAT,
        (false, false) => ctxrt::CONTEXTS_TREE,
    };
    [
        facts_at,
        FACTS_CAPACITY * FACT_WORDS as u64,
        u64::from(separate_recs),
        kind,
    ]
}

// Every block id has a slot in tagged counting.
const _: () = assert!(FACTS_CAPACITY as usize <= ctxrt::tagged::MAX_BLOCKS);
