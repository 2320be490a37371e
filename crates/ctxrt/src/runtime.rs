//! The runtime's work at a context entry: Callgrind's decision
//! (`callrules`), the stack, contexts and arcs, and where the next blocks
//! count.

use crate::arena::{head, ARC_WORDS, FRAME_WORDS, NODE_HEADER, NONE, SIGNAL_WORDS};
use crate::facts::{Facts, FACT_WORDS};
use crate::fast::{MEMO_ENTRIES, MEMO_WORDS};
use crate::hot;
use crate::table::{entry, find, hash, place};
use callrules::{Calls, Exit, Flow, Step};

/// Why the runtime cannot go on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Error {
    /// The arena has no room left.
    ArenaFull,
    /// A block id with no facts.
    UnknownBlock(u64),
}

/// Words of the process's runtime configuration, which the engine writes
/// into the core region and the blob's entry reads: the facts table's
/// address and length in words, `--separate-recs`, and whether contexts
/// are flat ([`Runtime::flat`]).
pub const CONFIG_WORDS: usize = 4;

/// The last configuration word: the calling-context tree.
pub const CONTEXTS_TREE: u64 = 0;
/// Flat contexts ([`Runtime::flat`]).
pub const CONTEXTS_FLAT: u64 = 1;
/// Tagged counting ([`crate::tagged`]).
pub const CONTEXTS_TAGGED: u64 = 2;

/// Counters a context starts with (translated code checks the bound only
/// for blocks numbered past it).
pub const FIRST_COUNTERS: usize = 8;

/// Where a node record keeps its id.
pub const ID: usize = 4;

/// Where a fresh thread counts until its first context entry (a thread
/// made by `clone` goes on in the block that made it): a record after the
/// header, never folded.
const SINK: usize = head::WORDS;

/// The words a thread's arena at `arena` (client address), `words` long,
/// starts with: writes to the arena (word index, value) and the thread's
/// hot words. The rest of the arena may hold anything (a reused thread
/// area's old contents): the runtime zeroes what it allocates.
pub fn fresh_thread(arena: u64, words: u64) -> ([(usize, u64); 3], [u64; hot::WORDS]) {
    let mut h = [0; hot::WORDS];
    h[hot::CUR] = arena + 8 * (SINK + NODE_HEADER) as u64;
    h[hot::LAST] = NONE;
    h[hot::ARENA] = arena;
    h[hot::ARENA_WORDS] = words;
    let writes = [
        (head::USED, 0),
        (SINK + ID, NONE),
        (SINK + NODE_HEADER - 1, FIRST_COUNTERS as u64),
    ];
    (writes, h)
}

/// The words with which a thread that takes an ended thread's number
/// goes on with the arena at `arena` that thread left, whose hot words
/// were `old` and whose context was `node`, as Callgrind goes on with a
/// thread number's call stack, recursion levels and contexts: writes to
/// the arena (word index, value) and the thread's hot words. Its first
/// blocks (a `clone` child goes on in the block that made it) count in
/// the sink, which its first context entry charges to that context, as
/// the call tool charges a thread's blocks to the context its number was
/// in.
pub fn continued_thread(
    arena: u64,
    old: &[u64; hot::WORDS],
    node: u64,
) -> ([(usize, u64); FIRST_COUNTERS + 4], [u64; hot::WORDS]) {
    let mut h = *old;
    h[hot::CUR] = arena + 8 * (SINK + NODE_HEADER) as u64;
    h[hot::LAST] = NONE;
    let mut writes = [(0, 0); FIRST_COUNTERS + 4];
    writes[0] = (SINK + ID, NONE);
    writes[1] = (SINK + NODE_HEADER - 1, FIRST_COUNTERS as u64);
    writes[2] = (head::CONTINUED, node.wrapping_add(1));
    writes[3] = (head::NODE, NONE);
    for (i, w) in writes[4..].iter_mut().enumerate() {
        *w = (SINK + NODE_HEADER + i, 0);
    }
    (writes, h)
}

/// Node kinds as stored.
const CONTEXT: u64 = 0;
const SKIP: u64 = 1;
/// Code of another function run in a context without a call (a jump into
/// the middle of it: `.cold` parts): its own counters, charged to the
/// context.
pub const FOREIGN: u64 = 2;

/// One thread's runtime over its hot words, its arena and the process's
/// block facts.
pub struct Runtime<'a> {
    /// The thread's hot words ([`crate::hot`]).
    pub hot: &'a mut [u64],
    /// The thread's arena.
    pub arena: &'a mut [u64],
    /// The process's block facts, [`FACT_WORDS`] per block id.
    pub facts: &'a [u64],
    /// `--separate-recs`.
    pub separate_recs: u32,
    /// Contexts are Callgrind's (function, recursion level) alone, not
    /// one per caller context too: a run that writes only Callgrind's
    /// profile, whose costs and arcs are per (function, level), keeps no
    /// tree it would fold away (g++'s cc1plus made 4.8 M contexts of the
    /// tree, a few hundred MB of counters per thread in most runs).
    pub flat: bool,
}

type Result<T> = core::result::Result<T, Error>;

/// An index of records by their first three words: the header words of
/// the index (its offset, then its capacity) and where record `id` is.
struct Keyed {
    index: usize,
    at: fn(&Runtime<'_>, u64) -> usize,
}

/// Nodes by (parent and function, level and kind, site).
const NODES: Keyed = Keyed {
    index: head::NODE_INDEX,
    at: |rt, id| rt.node_offset(id),
};

/// Arcs by (caller and callee, site, target).
const ARCS: Keyed = Keyed {
    index: head::ARC_INDEX,
    at: |rt, id| rt.arena[head::ARCS] as usize + id as usize * ARC_WORDS,
};

impl Runtime<'_> {
    /// Control enters block `y` through its context entry with the stack
    /// pointer `sp`, from the block in [`hot::LAST`].
    pub fn enter(&mut self, y: u64, sp: u64) -> Result<()> {
        if self.fast_enter(y, sp) {
            return Ok(());
        }
        self.init()?;
        self.arena[head::ENTRIES] += 1;
        let cur_before = self.hot[hot::CUR];
        let ns_before = self.arena[head::NONSKIPPED_NODE];
        // Handlers whose `rt_sigreturn` put the interrupted code's words
        // back have ended.
        while self.arena[head::SIGNALS_LEN] > self.hot[hot::SIGNALS] {
            self.end_signal(true);
        }
        let yf = self.facts_of(y)?;
        let mut last = hot::block_left(self.hot[hot::LAST]);
        if last == hot::SIGNAL_START {
            self.start_signal()?;
            last = NONE;
        }
        let xf = if last == NONE {
            None
        } else {
            Some(self.facts_of(last)?)
        };
        if self.arena[head::CONTINUED] != 0 {
            // A thread that took an ended thread's number: its context
            // again, with what its first blocks counted.
            self.arena[head::NODE] = core::mem::take(&mut self.arena[head::CONTINUED]) - 1;
            if let Some(x) = &xf {
                self.adopt_continued_sink(x)?;
            }
        } else if let (Some(x), NONE) = (&xf, self.arena[head::NODE]) {
            // A thread that began without an entry (a `clone` child goes
            // on in the block that made it): its first blocks ran in the
            // sink; they are its first context's, a root of their
            // function, as the call tool takes a thread's first block.
            self.adopt_sink(x)?;
        }
        // The stack pointer as the stream path knows it: after a call,
        // return or indirect jump.
        let sp = xf.filter(|x| x.sp_known).map(|_| sp);
        if let Some(sp) = sp {
            self.arena[head::LAST_SP] = sp;
        }
        let step = {
            let mut k = Keeper {
                rt: self,
                err: None,
                group: yf.group,
            };
            let step = callrules::enter(
                &mut k,
                xf.as_ref().map(|x| &x.flow),
                &yf.flow,
                sp,
                last == y,
            );
            if let Some(e) = k.err {
                return Err(e);
            }
            step
        };
        self.hot[hot::LAST] = NONE;
        let (push, site, push_sp, ret_addr, skip) = match step {
            Step::Repeat => return Ok(()),
            Step::Stay => (false, 0, None, 0, false),
            Step::Call {
                site,
                sp,
                ret_addr,
                skip,
            } => (true, site, sp, ret_addr, skip),
        };
        let f = yf.flow.function;
        let caller = self.arena[head::NODE];
        let mut arc = NONE;
        if (push && !skip) || caller == NONE {
            let recs = self.separate_recs;
            let a = self.active(f)?;
            let mut active = self.arena[a] as u32;
            let level = callrules::level(&mut active, push && !skip, recs);
            self.arena[a] = u64::from(active);
            if push && !skip {
                let mut from = (caller, site);
                if self.arena[head::NONSKIPPED_NODE] != NONE {
                    from = (
                        self.arena[head::NONSKIPPED_NODE],
                        self.arena[head::NONSKIPPED_SITE],
                    );
                }
                let parent = if self.flat { NONE } else { caller };
                let node = self.node(CONTEXT, parent, f, level, 0, yf.group)?;
                arc = self.arc(from.0, from.1, node, yf.flow.start)?;
                self.arena[head::NODE] = node;
            } else {
                self.arena[head::NODE] = self.node(CONTEXT, NONE, f, level, 0, yf.group)?;
            }
        }
        if push {
            // A real call's frame keeps the counters it was made from, for
            // its return's fast path.
            let resume = if ret_addr == 0 {
                NONE
            } else {
                self.resume_of(cur_before)
            };
            let frame = [
                push_sp.unwrap_or(self.arena[head::LAST_SP]),
                ret_addr,
                (caller & 0xffff_ffff) | u64::from(f) << 32,
                arc,
                self.hot[hot::IR],
                self.arena[head::NONSKIPPED_NODE],
                self.arena[head::NONSKIPPED_SITE],
                resume,
            ];
            if skip {
                if self.arena[head::NONSKIPPED_NODE] == NONE {
                    self.arena[head::NONSKIPPED_NODE] = caller;
                    self.arena[head::NONSKIPPED_SITE] = site;
                }
            } else {
                let at = self.arena[head::ARCS] as usize + arc as usize * ARC_WORDS;
                self.arena[at + 3] += 1;
                let a = self.active(f)?;
                self.arena[a] += 1;
                self.arena[head::NONSKIPPED_NODE] = NONE;
            }
            self.push(frame)?;
        }
        self.count_in(&yf)?;
        if push && caller != NONE {
            if let Some(x) = xf.filter(|x| x.flow.exit != Exit::Return && last != y) {
                self.remember_call(last, &x.flow, y, cur_before, ns_before, skip);
            }
        }
        Ok(())
    }

    /// A signal handler starts: what it interrupted is kept, and it starts
    /// a root (Callgrind's handlers are roots).
    fn start_signal(&mut self) -> Result<()> {
        let n = self.arena[head::SIGNALS_LEN] as usize;
        let at = self.reserve(head::SIGNALS, head::SIGNALS_CAP, (n + 1) * SIGNAL_WORDS)?;
        let record = [
            self.arena[head::NODE],
            self.arena[head::DEPTH],
            self.arena[head::NONSKIPPED_NODE],
            self.arena[head::NONSKIPPED_SITE],
            self.arena[head::LAST_SP],
            self.hot[hot::IR],
        ];
        self.arena[at + n * SIGNAL_WORDS..][..SIGNAL_WORDS].copy_from_slice(&record);
        self.arena[head::SIGNALS_LEN] = n as u64 + 1;
        self.hot[hot::SIGNALS] = n as u64 + 1;
        self.arena[head::NODE] = NONE;
        self.arena[head::NONSKIPPED_NODE] = NONE;
        Ok(())
    }

    /// The innermost handler ended (`returned` by `rt_sigreturn`, or left
    /// by `longjmp`): back to what it interrupted, its Ir nobody's
    /// inclusive cost. A return put the interrupted code's running Ir back
    /// itself (with the other hot words), and the blocks run since it,
    /// before this entry noticed, have counted on from there: that count
    /// stays (reset to the handler's start, it lost them: 16 Ir per signal
    /// in `raise`).
    fn end_signal(&mut self, returned: bool) {
        let Some(n) = (self.arena[head::SIGNALS_LEN] as usize).checked_sub(1) else {
            return;
        };
        let at = self.arena[head::SIGNALS] as usize + n * SIGNAL_WORDS;
        let mut r = [0; SIGNAL_WORDS];
        r.copy_from_slice(&self.arena[at..at + SIGNAL_WORDS]);
        self.arena[head::NODE] = r[0];
        self.arena[head::NONSKIPPED_NODE] = r[2];
        self.arena[head::NONSKIPPED_SITE] = r[3];
        self.arena[head::LAST_SP] = r[4];
        if !returned {
            self.hot[hot::IR] = r[5];
        }
        self.arena[head::SIGNALS_LEN] = n as u64;
        self.hot[hot::SIGNALS] = n as u64;
    }

    /// The stack depth below which frames are the code's the innermost
    /// running handler interrupted (0 outside handlers).
    pub(crate) fn bottom(&self) -> usize {
        match (self.arena[head::SIGNALS_LEN] as usize).checked_sub(1) {
            Some(n) => {
                self.arena[self.arena[head::SIGNALS] as usize + n * SIGNAL_WORDS + 1] as usize
            }
            None => 0,
        }
    }

    /// Moves what the sink counted (blocks of `x`'s group, run by a
    /// thread that took an ended thread's number before its first
    /// context entry) to where `x` counts in the current context.
    fn adopt_continued_sink(&mut self, x: &Facts) -> Result<()> {
        let sink = self.counting_record();
        self.count_in(x)?;
        match self.arena[self.counting_record() + ID] {
            NONE => Ok(()),
            to => self.move_sink_counts(sink, to),
        }
    }

    /// Adds what the sink record at `sink` counted (if it is one) to node
    /// `to`'s counters, grown where they have no room, and counts there.
    fn move_sink_counts(&mut self, sink: usize, to: u64) -> Result<()> {
        let n = match self.arena[sink + ID] {
            NONE => self.arena[sink + NODE_HEADER - 1] as usize,
            _ => 0,
        };
        for i in 0..n {
            let c = core::mem::take(&mut self.arena[sink + NODE_HEADER + i]);
            if c == 0 {
                continue;
            }
            let at = self.node_offset(to);
            if i >= self.arena[at + NODE_HEADER - 1] as usize {
                self.grow_to(to, i)?;
            }
            let at = self.node_offset(to);
            self.arena[at + NODE_HEADER + i] += c;
        }
        let at = self.node_offset(to);
        self.point_at(at);
        Ok(())
    }

    /// Makes the root context of block `x`'s function the current one
    /// and moves what the sink counted (blocks of `x`'s group) into it.
    fn adopt_sink(&mut self, x: &Facts) -> Result<()> {
        let a = self.active(x.flow.function)?;
        let mut active = self.arena[a] as u32;
        let level = callrules::level(&mut active, false, self.separate_recs);
        self.arena[a] = u64::from(active);
        let root = self.node(CONTEXT, NONE, x.flow.function, level, 0, x.group)?;
        self.arena[head::NODE] = root;
        let sink = self.counting_record();
        self.move_sink_counts(sink, root)
    }

    /// Block `y` runs where the current counters have no room for it (or
    /// are an old copy of a node's, moved when it grew).
    pub fn grow(&mut self, y: u64) -> Result<()> {
        self.init()?;
        let yf = self.facts_of(y)?;
        let index = yf.last_word() as usize;
        let counting = self.counting_record();
        let id = self.arena[counting + ID];
        if id == NONE {
            // Counting in the sink still: a bigger one, with its counts.
            let old = self.arena[counting + NODE_HEADER - 1] as usize;
            let n = (index + 1).next_power_of_two();
            let at = self.alloc(NODE_HEADER + n)?;
            self.arena[at + ID] = NONE;
            self.arena[at + NODE_HEADER - 1] = n as u64;
            let from = counting + NODE_HEADER;
            self.arena.copy_within(from..from + old, at + NODE_HEADER);
            self.point_at(at);
            return Ok(());
        }
        let at = self.node_offset(id);
        if index < self.arena[at + NODE_HEADER - 1] as usize {
            self.point_at(at);
            return Ok(());
        }
        self.grow_to(id, index)
    }

    /// The record of the counters [`hot::CUR`] points at.
    fn counting_record(&self) -> usize {
        self.record_of(self.hot[hot::CUR])
    }

    /// The arena offset of the record whose counters start at `cur` (an
    /// address as the hot words hold it).
    #[inline(always)]
    pub(crate) fn record_of(&self, cur: u64) -> usize {
        ((cur - self.hot[hot::ARENA]) / 8) as usize - NODE_HEADER
    }

    /// Moves node `id` to counters with room for block number `index`'s,
    /// and counts there.
    pub(crate) fn grow_to(&mut self, id: u64, index: usize) -> Result<()> {
        let at = self.node_offset(id);
        let n = self.arena[at + NODE_HEADER - 1] as usize;
        let want = (index + 1).max(2 * n).next_power_of_two();
        let new = self.alloc(NODE_HEADER + want)?;
        self.arena.copy_within(at..at + NODE_HEADER + n, new);
        self.arena[new + NODE_HEADER - 1] = want as u64;
        // The old copy has no room left, so the fast paths know it for
        // moved, and a block numbered past the first counters that still
        // counts there (a handler's return put the old pointer back) asks
        // for the node's counters again.
        self.arena[at + NODE_HEADER - 1] = 0;
        let table = self.arena[head::NODES] as usize;
        self.arena[table + id as usize] = new as u64;
        self.point_at(new);
        Ok(())
    }

    /// The thread ended (or the process): every call still running
    /// returns, its arc getting the inclusive cost so far.
    pub fn finish(&mut self) {
        if self.arena[head::USED] == 0 {
            return;
        }
        while self.arena[head::DEPTH] > 0 {
            self.pop();
        }
    }

    /// Sets the arena up at the thread's first entry.
    fn init(&mut self) -> Result<()> {
        if self.arena[head::USED] != 0 {
            return Ok(());
        }
        if self.arena.len() < 1 << 16 {
            return Err(Error::ArenaFull);
        }
        self.arena[1..head::WORDS].fill(0);
        self.arena[head::USED] = (SINK + NODE_HEADER + FIRST_COUNTERS) as u64;
        self.arena[head::NODE] = NONE;
        self.arena[head::NONSKIPPED_NODE] = NONE;
        for (off, cap, n) in [
            (head::STACK, head::STACK_CAP, 64 * FRAME_WORDS),
            (head::NODES, head::NODES_CAP, 256),
            (head::NODE_INDEX, head::NODE_INDEX_CAP, 512),
            (head::ARCS, head::ARCS_CAP, 256 * ARC_WORDS),
            (head::ARC_INDEX, head::ARC_INDEX_CAP, 512),
            (head::ACTIVE, head::ACTIVE_CAP, 256),
            (head::SIGNALS, head::SIGNALS_CAP, 4 * SIGNAL_WORDS),
            (head::MEMO, head::MEMO_CAP, MEMO_ENTRIES * MEMO_WORDS),
        ] {
            self.arena[off] = self.alloc(n)? as u64;
            self.arena[cap] = n as u64;
        }
        self.arena[head::STACK_CAP] = 64;
        Ok(())
    }

    fn facts_of(&self, y: u64) -> Result<Facts> {
        let at = y as usize * FACT_WORDS;
        self.facts
            .get(at..at + FACT_WORDS)
            .and_then(Facts::unpack)
            .ok_or(Error::UnknownBlock(y))
    }

    /// `n` zeroed words.
    pub(crate) fn alloc(&mut self, n: usize) -> Result<usize> {
        let at = self.arena[head::USED] as usize;
        if at + n > self.arena.len() {
            return Err(Error::ArenaFull);
        }
        self.arena[head::USED] = (at + n) as u64;
        self.arena[at..at + n].fill(0);
        Ok(at)
    }

    /// The vector at header words (`off`, `cap`), with room for `need`
    /// words, moved to twice the room if full.
    fn reserve(&mut self, off: usize, cap: usize, need: usize) -> Result<usize> {
        let (at, n) = (self.arena[off] as usize, self.arena[cap] as usize);
        if need <= n {
            return Ok(at);
        }
        let m = need.max(2 * n);
        let new = self.alloc(m)?;
        self.arena.copy_within(at..at + n, new);
        self.arena[off] = new as u64;
        self.arena[cap] = m as u64;
        Ok(new)
    }

    /// The word of function `f`'s active count.
    fn active(&mut self, f: u32) -> Result<usize> {
        let at = self.reserve(head::ACTIVE, head::ACTIVE_CAP, f as usize + 1)?;
        Ok(at + f as usize)
    }

    #[inline(always)]
    pub(crate) fn node_offset(&self, id: u64) -> usize {
        self.arena[self.arena[head::NODES] as usize + id as usize] as usize
    }

    /// The node of `kind` with `parent`, function `f`, `level` and
    /// `site`, made if new.
    fn node(
        &mut self,
        kind: u64,
        parent: u64,
        f: u32,
        level: u32,
        site: u64,
        group: u32,
    ) -> Result<u64> {
        let key = [
            (parent & 0xffff_ffff) | u64::from(f) << 32,
            u64::from(level) | kind << 32,
            site,
        ];
        let slot = match self.lookup(&NODES, &key) {
            Ok(id) => return Ok(id),
            Err(slot) => slot,
        };
        let id = self.arena[head::NODES_LEN];
        let at = self.alloc(NODE_HEADER + FIRST_COUNTERS)?;
        self.arena[at..at + 3].copy_from_slice(&key);
        self.arena[at + 3] = u64::from(group);
        self.arena[at + ID] = id;
        self.arena[at + NODE_HEADER - 1] = FIRST_COUNTERS as u64;
        let table = self.reserve(head::NODES, head::NODES_CAP, id as usize + 1)?;
        self.arena[table + id as usize] = at as u64;
        self.arena[head::NODES_LEN] = id + 1;
        self.indexed(&NODES, slot, id)?;
        Ok(id)
    }

    /// The arc from `caller` at `site` to `callee` entered at `target`,
    /// made if new.
    fn arc(&mut self, caller: u64, site: u64, callee: u64, target: u64) -> Result<u64> {
        let key = [(caller & 0xffff_ffff) | callee << 32, site, target];
        let slot = match self.lookup(&ARCS, &key) {
            Ok(id) => return Ok(id),
            Err(slot) => slot,
        };
        let id = self.arena[head::ARCS_LEN];
        let need = (id as usize + 1) * ARC_WORDS;
        let arcs = self.reserve(head::ARCS, head::ARCS_CAP, need)?;
        let at = arcs + id as usize * ARC_WORDS;
        self.arena[at..at + 3].copy_from_slice(&key);
        self.arena[at + 3] = 0;
        self.arena[at + 4] = 0;
        self.arena[head::ARCS_LEN] = id + 1;
        self.indexed(&ARCS, slot, id)?;
        Ok(id)
    }

    /// The id of the record with `key` in `by`, or the free slot of its
    /// index where it goes.
    fn lookup(&self, by: &Keyed, key: &[u64; 3]) -> core::result::Result<u64, usize> {
        let (index, cap) = (
            self.arena[by.index] as usize,
            self.arena[by.index + 1] as usize,
        );
        find(&self.arena[index..index + cap], hash(key), |id| {
            let at = (by.at)(self, id);
            self.arena[at..at + 3] == *key
        })
    }

    /// Record `id`, just made, goes in `slot` of `by`'s index (the slot
    /// [`Runtime::lookup`] gave), which is rebuilt at twice its size once
    /// half full.
    fn indexed(&mut self, by: &Keyed, slot: usize, id: u64) -> Result<()> {
        let (index, cap) = (
            self.arena[by.index] as usize,
            self.arena[by.index + 1] as usize,
        );
        let at = (by.at)(self, id);
        let h = hash(&self.arena[at..at + 3]);
        self.arena[index + slot] = entry(id, h);
        let len = id as usize + 1;
        if 2 * len <= cap {
            return Ok(());
        }
        // Rebuilt from the old words alone (no record read).
        let n = 2 * cap;
        let new = self.alloc(n)?;
        for i in index..index + cap {
            let e = self.arena[i];
            if e != 0 {
                let slot = place(&self.arena[new..new + n], e);
                self.arena[new + slot] = e;
            }
        }
        self.arena[by.index] = new as u64;
        self.arena[by.index + 1] = n as u64;
        Ok(())
    }

    #[inline(always)]
    pub(crate) fn push(&mut self, frame: [u64; FRAME_WORDS]) -> Result<()> {
        let depth = self.arena[head::DEPTH] as usize;
        let cap = self.arena[head::STACK_CAP] as usize;
        if depth == cap {
            let (at, n) = (self.arena[head::STACK] as usize, cap * FRAME_WORDS);
            let new = self.alloc(2 * n)?;
            self.arena.copy_within(at..at + n, new);
            self.arena[head::STACK] = new as u64;
            self.arena[head::STACK_CAP] = 2 * cap as u64;
        }
        let at = self.frame_at(depth);
        self.arena[at..at + FRAME_WORDS].copy_from_slice(&frame);
        self.arena[head::DEPTH] = depth as u64 + 1;
        Ok(())
    }

    #[inline(always)]
    pub(crate) fn frame_at(&self, i: usize) -> usize {
        self.arena[head::STACK] as usize + i * FRAME_WORDS
    }

    /// Pops the top frame: its arc gets the call's inclusive Ir. Popping
    /// the frames of code a handler interrupted ends the handler (it was
    /// left by `longjmp`).
    pub(crate) fn pop(&mut self) {
        while self.arena[head::SIGNALS_LEN] > 0 && self.bottom() >= self.arena[head::DEPTH] as usize
        {
            self.end_signal(false);
        }
        let depth = self.arena[head::DEPTH] as usize;
        let Some(top) = depth.checked_sub(1) else {
            return;
        };
        let at = self.frame_at(top);
        let mut frame = [0; FRAME_WORDS];
        frame.copy_from_slice(&self.arena[at..at + FRAME_WORDS]);
        self.arena[head::DEPTH] = top as u64;
        let [_, _, caller_f, arc, enter_ir, ns_node, ns_site, _] = frame;
        if arc != NONE {
            let a = self.arena[head::ARCS] as usize + arc as usize * ARC_WORDS;
            self.arena[a + 4] += self.hot[hot::IR] - enter_ir;
            let f = (caller_f >> 32) as usize;
            let active = self.arena[head::ACTIVE] as usize + f;
            self.arena[active] = self.arena[active].saturating_sub(1);
        }
        let caller = caller_f & 0xffff_ffff;
        self.arena[head::NODE] = if caller == 0xffff_ffff { NONE } else { caller };
        self.arena[head::NONSKIPPED_NODE] = ns_node;
        self.arena[head::NONSKIPPED_SITE] = ns_site;
    }

    /// A return with no frame (Callgrind's `handleUnderflow`): the
    /// function returned to becomes a root, with an arc to the returning
    /// context carrying the thread's Ir so far.
    fn underflow(&mut self, x: Option<&Flow>, y: &Flow, group: u32, arc: bool) -> Result<()> {
        let returning = self.arena[head::NODE];
        if returning != NONE {
            let at = self.node_offset(returning);
            let f = (self.arena[at] >> 32) as u32;
            let a = self.active(f)?;
            self.arena[a] = self.arena[a].saturating_sub(1);
        }
        let a = self.active(y.function)?;
        let mut active = self.arena[a] as u32;
        let level = callrules::level(&mut active, false, self.separate_recs);
        self.arena[a] = u64::from(active);
        let root = self.node(CONTEXT, NONE, y.function, level, 0, group)?;
        if returning != NONE && arc {
            let target = x.map_or(y.start, |x| x.start);
            let id = self.arc(root, y.start.wrapping_sub(1), returning, target)?;
            let at = self.arena[head::ARCS] as usize + id as usize * ARC_WORDS;
            self.arena[at + 3] += 1;
            self.arena[at + 4] += self.hot[hot::IR];
        }
        self.arena[head::NODE] = root;
        self.arena[head::NONSKIPPED_NODE] = NONE;
        Ok(())
    }

    /// The node (made if new) whose counters group `g`'s blocks count in
    /// now: in skipped code the skip node of its call site, else the
    /// context's own, or its foreign node of `g` (code of another group
    /// run without a call); `None` outside any context.
    pub(crate) fn node_counting(&mut self, g: u32) -> Result<Option<u64>> {
        let node = self.arena[head::NODE];
        let ns = self.arena[head::NONSKIPPED_NODE];
        Ok(Some(if ns != NONE {
            let site = self.arena[head::NONSKIPPED_SITE];
            self.node(SKIP, ns, g, 0, site, g)?
        } else if node == NONE {
            return Ok(None);
        } else if self.arena[self.node_offset(node) + 3] as u32 == g {
            node
        } else {
            self.node(FOREIGN, node, g, 0, 0, g)?
        }))
    }

    /// Points [`hot::CUR`] at the counters block `y` and the blocks after
    /// it count in: the current context's, a skip node's in skipped code,
    /// a foreign node's for another function's code.
    fn count_in(&mut self, y: &Facts) -> Result<()> {
        let Some(id) = self.node_counting(y.group)? else {
            return Ok(());
        };
        let at = self.node_offset(id);
        let last = y.last_word() as usize;
        if last >= self.arena[at + NODE_HEADER - 1] as usize {
            return self.grow_to(id, last);
        }
        self.point_at(at);
        Ok(())
    }

    /// Points [`hot::CUR`] at the counters of the node record at `at`.
    #[inline(always)]
    pub(crate) fn point_at(&mut self, at: usize) {
        self.hot[hot::CUR] = self.hot[hot::ARENA] + 8 * (at + NODE_HEADER) as u64;
    }
}

/// The rules' view of the runtime's stack.
struct Keeper<'r, 'a> {
    rt: &'r mut Runtime<'a>,
    /// The first error of an underflow (the rules cannot return one).
    err: Option<Error>,
    /// The counter group of the block entered.
    group: u32,
}

impl Calls for Keeper<'_, '_> {
    fn depth(&self) -> usize {
        self.rt.arena[head::DEPTH] as usize
    }

    fn bottom(&self) -> usize {
        self.rt.bottom()
    }

    fn in_handler(&self) -> bool {
        self.rt.arena[head::SIGNALS_LEN] > 0
    }

    fn frame_sp(&self, i: usize) -> u64 {
        self.rt.arena[self.rt.frame_at(i)]
    }

    fn frame_ret_addr(&self, i: usize) -> u64 {
        self.rt.arena[self.rt.frame_at(i) + 1]
    }

    fn top_call_site(&self) -> Option<u64> {
        let top = self.depth().checked_sub(1)?;
        let arc = self.rt.arena[self.rt.frame_at(top) + 3];
        if arc == NONE {
            return None;
        }
        Some(self.rt.arena[self.rt.arena[head::ARCS] as usize + arc as usize * ARC_WORDS + 1])
    }

    fn pop(&mut self) {
        self.rt.pop();
    }

    fn underflow(&mut self, from: Option<&Flow>, to: &Flow, arc: bool) {
        if let Err(e) = self.rt.underflow(from, to, self.group, arc) {
            self.err.get_or_insert(e);
        }
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use crate::arena::{Arena, NodeKind};
    use callrules::Exit;
    use std::vec;
    use std::vec::Vec;

    /// A client: blocks described by their facts, run as translated code
    /// runs them (context entries through the runtime, counts inline).
    struct Client {
        hot: Vec<u64>,
        arena: Vec<u64>,
        facts: Vec<u64>,
        recs: u32,
    }

    impl Client {
        fn new() -> Client {
            let mut hot = vec![0; hot::WORDS];
            hot[hot::LAST] = NONE;
            Client {
                hot,
                arena: vec![0; 1 << 20],
                facts: Vec::new(),
                recs: 2,
            }
        }

        /// Describes block `id`: function `f`, its `index` in it, at
        /// `start`, `instrs` long, left by `exit`.
        fn block(&mut self, id: usize, f: u32, index: u32, start: u64, exit: Exit, entry: bool) {
            self.block_with(id, f, index, start, exit, entry, false);
        }

        /// [`Client::block`], with a call memo past its counter if `memo`.
        #[allow(clippy::too_many_arguments)]
        fn block_with(
            &mut self,
            id: usize,
            f: u32,
            index: u32,
            start: u64,
            exit: Exit,
            entry: bool,
            memo: bool,
        ) {
            let mut flow = Flow::new(start, start + 8, start + 10, exit);
            (flow.function, flow.entry) = (f, entry);
            let facts = Facts {
                flow,
                group: f,
                index,
                instrs: 3,
                sp_known: matches!(exit, Exit::Call | Exit::Return),
                memo,
            };
            if self.facts.len() < (id + 1) * FACT_WORDS {
                self.facts.resize((id + 1) * FACT_WORDS, 0);
            }
            self.facts[id * FACT_WORDS..][..FACT_WORDS].copy_from_slice(&facts.pack());
        }

        fn rt(&mut self) -> Runtime<'_> {
            Runtime {
                hot: &mut self.hot,
                arena: &mut self.arena,
                facts: &self.facts,
                separate_recs: self.recs,
                flat: false,
            }
        }

        /// Block `y` runs, entered through its context entry if `context`
        /// (with the stack pointer `sp`).
        fn run(&mut self, y: u64, context: bool, sp: u64) {
            if context {
                self.rt().enter(y, sp).expect("room");
            }
            let f = Facts::unpack(&self.facts[y as usize * FACT_WORDS..][..FACT_WORDS]).unwrap();
            let mut cur = self.hot[hot::CUR] as usize / 8;
            let last = f.last_word();
            if last as usize >= FIRST_COUNTERS && u64::from(last) >= self.arena[cur - 1] {
                self.rt().grow(y).expect("room");
                cur = self.hot[hot::CUR] as usize / 8;
            }
            self.arena[cur + f.index as usize] += u64::from(f.instrs);
            self.hot[hot::IR] += u64::from(f.instrs);
            // A block left by a call or return stores itself for the next
            // context entry.
            if matches!(f.flow.exit, Exit::Call | Exit::Return) {
                self.hot[hot::LAST] = y;
            }
        }

        /// Block `site` (run without an entry, at the stack pointer
        /// 0x8000) calls block `callee`, which returns to block `back`.
        fn call(&mut self, site: u64, callee: u64, back: u64) {
            self.run(site, false, 0x8000);
            self.run(callee, true, 0x7ff8);
            self.run(back, true, 0x8000);
        }

        /// The arcs, as (call site, calls, inclusive Ir), once every
        /// call still running has returned.
        fn arcs(&mut self) -> Vec<(u64, u64, u64)> {
            let a = self.finish();
            let arcs = a.arcs().map(|a| (a.site, a.calls, a.inclusive));
            arcs.collect()
        }

        fn finish(&mut self) -> Arena<'_> {
            self.rt().finish();
            Arena::new(&self.arena)
        }
    }

    #[test]
    fn calls_make_contexts_and_arcs_with_inclusive_costs() {
        let mut c = Client::new();
        // main (f0): block 0 calls f1 (block 1, which returns) twice, from
        // two call sites (blocks 0 and 2), then ends in block 3.
        c.block(0, 0, 0, 0x1000, Exit::Call, true);
        c.block(1, 1, 0, 0x2000, Exit::Return, true);
        c.block(2, 0, 1, 0x100a, Exit::Call, false);
        c.block(3, 0, 2, 0x1014, Exit::Jump, false);
        c.run(0, true, 0x8000);
        c.run(1, true, 0x7ff8);
        c.run(2, true, 0x8000); // entered by f1's return (ret_addr 0x100a)
        c.run(1, true, 0x7ff8);
        c.run(3, true, 0x8000);
        let a = c.finish();
        let nodes: Vec<_> = a.nodes().collect();
        assert_eq!(nodes.len(), 2);
        assert_eq!(
            (nodes[0].function, nodes[0].parent, nodes[0].level),
            (0, NONE, 1)
        );
        assert_eq!(&nodes[0].counters[..3], &[3, 3, 3]);
        assert_eq!((nodes[1].function, nodes[1].parent), (1, 0));
        assert_eq!(nodes[1].counters[0], 6);
        let arcs: Vec<_> = a.arcs().collect();
        assert_eq!(arcs.len(), 2, "one per call site");
        assert_eq!(
            (arcs[0].site, arcs[0].calls, arcs[0].inclusive),
            (0x1008, 1, 3)
        );
        assert_eq!(
            (arcs[1].site, arcs[1].calls, arcs[1].inclusive),
            (0x1012, 1, 3)
        );
    }

    #[test]
    fn recursion_levels_are_capped_and_running_calls_end_at_finish() {
        let mut c = Client::new();
        // f1 calls itself from block 1 three times, never returning.
        c.block(0, 0, 0, 0x1000, Exit::Call, true);
        c.block(1, 1, 0, 0x2000, Exit::Call, true);
        c.run(0, true, 0x8000);
        for i in 0..4 {
            c.run(1, true, 0x7ff8 - 8 * i);
        }
        let a = c.finish();
        let levels: Vec<_> = a.nodes().map(|n| (n.function, n.level)).collect();
        // A context per depth (its parent differs), the level capped at 2.
        assert_eq!(levels, [(0, 1), (1, 1), (1, 2), (1, 2), (1, 2)]);
        let arcs: Vec<_> = a
            .arcs()
            .map(|a| (a.caller, a.callee, a.calls, a.inclusive))
            .collect();
        // Each call's inclusive Ir is what ran after it.
        assert_eq!(
            arcs,
            [(0, 1, 1, 12), (1, 2, 1, 9), (2, 3, 1, 6), (3, 4, 1, 3)]
        );
    }

    #[test]
    fn skipped_code_counts_for_the_call_site_and_foreign_code_for_the_context() {
        let mut c = Client::new();
        c.block(0, 0, 0, 0x1000, Exit::Call, true);
        // A PLT stub (f2, skipped, another domain) jumping into f3.
        c.block(1, 2, 0, 0x3000, Exit::Jump, true);
        let mut plt = Facts::unpack(&c.facts[FACT_WORDS..2 * FACT_WORDS]).unwrap();
        (plt.flow.skip, plt.flow.domain) = (true, 1);
        c.facts[FACT_WORDS..2 * FACT_WORDS].copy_from_slice(&plt.pack());
        c.block(2, 3, 0, 0x4000, Exit::Jump, true);
        // f3 jumps into the middle of f4 (its cold part) and back.
        c.block(3, 4, 5, 0x5010, Exit::Jump, false);
        c.block(4, 3, 1, 0x4010, Exit::Return, false);
        c.run(0, true, 0x8000);
        c.run(1, true, 0x7ff8);
        c.hot[hot::LAST] = 1;
        c.run(2, true, 0x7ff8);
        c.hot[hot::LAST] = 2;
        c.run(3, true, 0x7ff8);
        c.hot[hot::LAST] = 3;
        c.run(4, true, 0x7ff8);
        let a = c.finish();
        let nodes: Vec<_> = a
            .nodes()
            .map(|n| (n.kind, n.function, n.parent, n.site))
            .collect();
        assert_eq!(
            nodes,
            [
                (NodeKind::Context, 0, NONE, 0),
                (NodeKind::Skip, 2, 0, 0x1008),
                (NodeKind::Context, 3, 0, 0),
                (NodeKind::Foreign, 4, 2, 0),
            ]
        );
        let counters: Vec<_> = a.nodes().map(|n| n.counters.iter().sum::<u64>()).collect();
        assert_eq!(counters, [3, 3, 6, 3]);
        let arcs: Vec<_> = a.arcs().map(|a| (a.caller, a.site, a.callee)).collect();
        assert_eq!(
            arcs,
            [(0, 0x1008, 2)],
            "the call from the PLT is the call site's"
        );
    }

    #[test]
    fn counters_grow_for_blocks_numbered_past_them() {
        let mut c = Client::new();
        c.block(0, 0, 0, 0x1000, Exit::Jump, true);
        c.block(1, 0, 40, 0x1040, Exit::Jump, false);
        c.run(0, true, 0x8000);
        c.run(1, false, 0x8000);
        c.run(1, false, 0x8000);
        let a = c.finish();
        let n = a.nodes().next().unwrap();
        assert_eq!(n.counters.len(), 64);
        assert_eq!((n.counters[0], n.counters[40]), (3, 6));
    }

    #[test]
    fn the_memo_doubles_once_it_thrashes_and_calls_stay_exact() {
        use crate::fast::{memo_key, memo_slot, MEMO_ENTRIES};
        let mut c = Client::new();
        // main (f0) enters at block 0 and calls f1 (block 1) from call
        // sites a and b, returning to ra and rb; b's memo slot is a's.
        c.block(0, 0, 0, 0x1000, Exit::Jump, true);
        c.block(1, 1, 0, 0x2000, Exit::Return, true);
        c.block(2, 0, 1, 0x1100, Exit::Call, false);
        c.block(3, 0, 2, 0x110a, Exit::Jump, false);
        c.run(0, true, 0x8000);
        let cur = c.hot[hot::CUR];
        let slot = |x: u64| memo_slot(memo_key(x, 1), cur, MEMO_ENTRIES);
        let b = (4..).find(|&x| slot(x) == slot(2)).unwrap();
        c.block(b as usize, 0, 3, 0x1200, Exit::Call, false);
        c.block(b as usize + 1, 0, 4, 0x120a, Exit::Jump, false);
        let call = |c: &mut Client, site: u64| c.call(site, 1, site + 1);
        call(&mut c, 2);
        // One replacement short of doubling: b's call replaces a's entry.
        c.arena[head::MEMO_EVICTIONS] = MEMO_ENTRIES as u64 - 1;
        call(&mut c, b);
        assert_eq!(c.arena[head::MEMO_CAP] as usize, 2 * MEMO_ENTRIES * 4);
        assert_eq!(c.arena[head::MEMO_EVICTIONS], 0);
        call(&mut c, 2);
        call(&mut c, 2);
        assert_eq!(c.arcs(), [(0x1108, 3, 9), (0x1208, 1, 3)]);
    }

    #[test]
    fn a_call_block_keeps_its_last_call_beside_its_counter() {
        use crate::fast::{memo_child, MEMO_ENTRIES};
        let mut c = Client::new();
        // main (f0, block 0) calls f1 (block 1) from block 2, whose call
        // memo takes numbers 2 and 3; the return site is number 4.
        c.block(0, 0, 0, 0x1000, Exit::Jump, true);
        c.block(1, 1, 0, 0x2000, Exit::Return, true);
        c.block_with(2, 0, 1, 0x1100, Exit::Call, false, true);
        c.block(3, 0, 4, 0x110a, Exit::Jump, false);
        c.run(0, true, 0x8000);
        c.call(2, 1, 3);
        let cur = c.hot[hot::CUR] as usize / 8;
        let (child, arc) = (c.arena[cur + 2] >> 32, c.arena[cur + 3]);
        assert_eq!(c.arena[cur + 2], memo_child(1, child));
        // The hashed memo forgotten, the next call still takes a fast
        // path, by the memo beside the counter.
        let memo = c.arena[head::MEMO] as usize;
        c.arena[memo..memo + MEMO_ENTRIES * 4].fill(0);
        let fast = c.arena[head::FAST_ENTRIES];
        c.call(2, 1, 3);
        assert_eq!(c.arena[head::FAST_ENTRIES], fast + 2);
        assert_eq!(c.arcs(), [(0x1108, 2, 6)]);
        assert_eq!(arc, 0);
        // The memo's words are not counts: the caller's counters hold
        // blocks 0, 2 and 3 only.
        let a = c.finish();
        let caller = a.nodes().next().unwrap();
        assert_eq!(
            (caller.counters[0], caller.counters[1], caller.counters[4]),
            (3, 6, 6)
        );
    }

    #[test]
    fn a_thread_taking_an_ended_threads_number_goes_on_with_its_stack() {
        let mut c = Client::new();
        // f0 calls f1, whose thread ends there; the next thread with its
        // number runs block 2 (f2's code, in the sink) and calls f1.
        c.block(0, 0, 0, 0x1000, Exit::Call, true);
        c.block(1, 1, 0, 0x2000, Exit::Jump, true);
        c.block(2, 2, 0, 0x3000, Exit::Call, false);
        c.run(0, true, 0x8000);
        c.run(1, true, 0x7ff8);
        let old: [u64; hot::WORDS] = c.hot[..].try_into().unwrap();
        let (writes, hot) = continued_thread(0, &old, c.arena[head::NODE]);
        for (i, v) in writes {
            c.arena[i] = v;
        }
        c.hot.copy_from_slice(&hot);
        // (The same stack as the ended thread's, below its frames, as
        // glibc reuses a joined thread's stack: frames the stack pointer
        // left would be unwound.)
        c.run(2, false, 0x7f00);
        c.run(1, true, 0x7ef8);
        let a = c.finish();
        let nodes: Vec<_> = a
            .nodes()
            .map(|n| (n.kind, n.function, n.level, n.counters.iter().sum::<u64>()))
            .collect();
        assert_eq!(
            nodes,
            [
                (NodeKind::Context, 0, 1, 3),
                (NodeKind::Context, 1, 1, 3),
                (NodeKind::Foreign, 2, 0, 3),
                (NodeKind::Context, 1, 2, 3),
            ],
            "block 2 counts in f1's context, whose call of f1 is its second level"
        );
    }
}
