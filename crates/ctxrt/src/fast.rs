//! The runtime's fast paths: the commonest context entries, taken without
//! Callgrind's full decision when the state shows what it would decide.
//!
//! * **A call** (a `call`, or a jump into a function's start or into
//!   another object: a tail call, a PLT stub's jump) whose outcome the
//!   *call memo* remembers: the last time block `x` entered block `y` so
//!   while counting into the same counters (the same context, the same
//!   skipped code), the decision made context `child` with arc `arc` (or,
//!   into a skipped function such as a PLT stub, counted in skip node
//!   `child`); if the callee's recursion level is still the child's and
//!   no frame is left behind by the stack pointer, the call is that again.
//! * **A return** that leaves the frames the stack pointer passed, the
//!   last of them a call's that returns here, in the counter group the
//!   call was made from: that frame keeps the counters it was called from
//!   (its *resume* record), and the caller's counting goes on there.
//! * **A jump** inside one counter group that leaves no frame: the
//!   counters stay.
//!
//! Each fast path does exactly what the full decision does in its case
//! (the property tests of `callstack::contexts` run the runtime against
//! the call tool); everything else takes the full decision. The memo and
//! the resume records are also what translated code's inline paths can
//! read.

use crate::arena::{head, ARC_WORDS, FRAME_WORDS, NODE_HEADER, NONE};
use crate::facts::{
    Packed, CALL_MEMO, CALL_MEMO_WORDS, ENTRY, EXIT_CALL, EXIT_RETURN, FACT_WORDS, POP_ON_JUMP,
    SKIP, SP_KNOWN,
};
use crate::hot;
use crate::runtime::{Runtime, FOREIGN, ID};
use callrules::Flow;

/// Entries of a thread's first call memo (a power of two).
pub const MEMO_ENTRIES: usize = 1 << 16;
/// Entries the memo grows to at most. It doubles each time as many
/// entries were replaced by other keys as it has (cc1's calls thrashed
/// 64 K entries: a tenth of its calls took the full decision, each a
/// lookup of a node and an arc), up to 16 MB of memo.
pub const MAX_MEMO_ENTRIES: usize = 1 << 19;
/// Words of a memo entry: the counting record's address the call was
/// made from (0: empty), the block entered and the child node
/// ([`memo_child`]), the arc ([`NONE`] for a skipped function's call),
/// the block left. A call memo past a counter has the middle two
/// (`crate::CALL_MEMO_WORDS`), the same words at the same distance from
/// the word before them, which the engine's inline paths read alike.
pub const MEMO_WORDS: usize = 4;
/// The multiplier of [`memo_slot`]'s hash.
pub const MEMO_HASH: u64 = 0x9e37_79b9_7f4a_7c15;

/// A memo entry's key for block `x` entering block `y` (block ids are
/// below 2^32), which its slot is hashed from. Both are kept: two call
/// sites of one function entering the same callee from the same counters
/// may share a slot, and each has its own arc.
#[inline(always)]
pub fn memo_key(x: u64, y: u64) -> u64 {
    y | x << 32
}

/// A memo's word naming block `y` entered (plus one: an empty memo's 0
/// names none) and the node `child` it made or counted in (node ids are
/// below 2^32).
#[inline(always)]
pub fn memo_child(y: u64, child: u64) -> u64 {
    (y + 1) | child << 32
}

/// The node of a memo's word made by [`memo_child`], if it names `y`.
#[inline(always)]
fn child_of(word: u64, y: u64) -> Option<u64> {
    (word & 0xffff_ffff == y + 1).then_some(word >> 32)
}

/// Where a frame keeps its resume record: the arena offset of the
/// counters its call was made from ([`NONE`] if there are none to go
/// back to: an emulated call, or counters that were moved).
pub const FRAME_RESUME: usize = 7;

/// The memo slot (its first word's index in the memo) of the entry with
/// `key` ([`memo_key`]) from the counters at `cur`, in a memo of
/// `entries` (a power of two). The block entered is part of the hash: an
/// indirect call site has an entry per callee (perl's op loop calls
/// hundreds of functions from one site, which thrashed one slot: 6 M of
/// its calls took the full decision).
pub fn memo_slot(key: u64, cur: u64, entries: usize) -> usize {
    let h = (cur >> 3 ^ key.wrapping_mul(MEMO_HASH) >> 40) as usize;
    (h & (entries - 1)) * MEMO_WORDS
}

/// Block `id`'s facts in `facts`, if it was described.
fn raw(facts: &[u64], id: u64) -> Option<Packed<'_>> {
    Packed::of(facts.get(id as usize * FACT_WORDS..)?)
}

impl Runtime<'_> {
    /// Enters block `y` with the stack pointer `sp` by a fast path, if one
    /// applies; `false` leaves the entry to the full decision.
    pub(crate) fn fast_enter(&mut self, y: u64, sp: u64) -> bool {
        let x = hot::block_left(self.hot[hot::LAST]);
        if x >= hot::SIGNAL_START
            || x == y
            || self.arena[head::USED] == 0
            || self.arena[head::SIGNALS_LEN] != self.hot[hot::SIGNALS]
            || self.arena[head::NODE] == NONE
        {
            return false;
        }
        let facts = self.facts;
        let (Some(xf), Some(yf)) = (raw(facts, x), raw(facts, y)) else {
            return false;
        };
        // The stack pointer as the full decision knows it.
        let sp = xf.has(SP_KNOWN).then_some(sp);
        let done = match xf.exit() {
            EXIT_RETURN => sp.is_some_and(|sp| self.fast_return(&yf, sp)),
            EXIT_CALL => sp.is_some() && self.fast_call(x, y, &xf, &yf, sp),
            _ if yf.has(ENTRY) || xf.domain() != yf.domain() => {
                !xf.has(POP_ON_JUMP) && self.fast_call(x, y, &xf, &yf, sp)
            }
            _ => self.fast_jump(&xf, y, &yf, sp),
        };
        if done {
            if let Some(sp) = sp {
                self.arena[head::LAST_SP] = sp;
            }
            self.hot[hot::LAST] = NONE;
            self.arena[head::FAST_ENTRIES] += 1;
            self.arena[head::ENTRIES] += 1;
        }
        done
    }

    /// The top frame's stack pointer, if there is a frame.
    fn top_sp(&self) -> Option<u64> {
        let top = (self.arena[head::DEPTH] as usize).checked_sub(1)?;
        Some(self.arena[self.frame_at(top)])
    }

    /// Whether an entry with the stack pointer `sp` leaves frames behind
    /// (`longjmp`, exceptions): the full decision unwinds them.
    fn leaves_frames(&self, sp: Option<u64>) -> bool {
        sp.is_some_and(|sp| self.top_sp().is_some_and(|top| top < sp))
    }

    /// The arena offset of the counters at `cur` (an address the hot
    /// words held), if they are where their node keeps them now: not the
    /// sink, nor an old copy left by a growth (which has no room).
    #[inline(always)]
    pub(crate) fn current_record(&self, cur: u64) -> Option<usize> {
        let at = self.record_of(cur);
        let moved = self.arena[at + NODE_HEADER - 1] == 0;
        (self.arena[at + ID] != NONE && !moved).then_some(at)
    }

    /// The resume record of a call made while counting at `cur`.
    #[inline(always)]
    pub(crate) fn resume_of(&self, cur: u64) -> u64 {
        self.current_record(cur).map_or(NONE, |at| at as u64)
    }

    /// Remembers in the memo what the full decision did when block `x`
    /// (left by a call or a jump) entered block `y` and pushed a frame,
    /// counting at `cur` before, with the skipped-code context
    /// `ns_before`: the current context, or for a skipped function the
    /// skip node now counting.
    pub(crate) fn remember_call(
        &mut self,
        x: u64,
        xf: &Flow,
        y: u64,
        cur: u64,
        ns_before: u64,
        skip: bool,
    ) {
        if xf.pop_on_jump || (skip && ns_before != NONE) || self.current_record(cur).is_none() {
            return;
        }
        let entry = if skip {
            [
                cur,
                memo_child(y, self.arena[self.record_of(self.hot[hot::CUR]) + ID]),
                NONE,
                x,
            ]
        } else {
            let arc = self.arena[self.frame_at(self.arena[head::DEPTH] as usize - 1) + 3];
            [cur, memo_child(y, self.arena[head::NODE]), arc, x]
        };
        let memo = raw(self.facts, x).and_then(|xf| self.call_memo_at(&xf, cur));
        if let Some(at) = memo {
            self.arena[at..at + CALL_MEMO_WORDS].copy_from_slice(&entry[1..3]);
        }
        let mut at = self.memo_at(x, y, cur);
        let same_key = |m: &[u64]| m[0] == cur && m[3] == x && child_of(m[1], y).is_some();
        if self.arena[at] != 0 && !same_key(&self.arena[at..at + MEMO_WORDS]) {
            self.arena[head::MEMO_EVICTIONS] += 1;
            if self.grow_memo() {
                at = self.memo_at(x, y, cur);
            }
        }
        self.arena[at..at + MEMO_WORDS].copy_from_slice(&entry);
    }

    /// Where the call memo of the block whose facts are `xf` is in the
    /// counters at `cur` (past its counter: the block entered and the
    /// child, then the arc), if it has one and they are a node's where it
    /// keeps them now, with room for it.
    #[inline(always)]
    fn call_memo_at(&self, xf: &Packed<'_>, cur: u64) -> Option<usize> {
        if !xf.has(CALL_MEMO) {
            return None;
        }
        let at = self.current_record(cur)?;
        let last = xf.last_word() as usize;
        (self.arena[at + 3] == u64::from(xf.group())
            && last < self.arena[at + NODE_HEADER - 1] as usize)
            .then_some(at + NODE_HEADER + xf.index() as usize + 1)
    }

    /// The memo slot's arena offset for block `x` entering `y` counting
    /// at `cur`.
    #[inline(always)]
    fn memo_at(&self, x: u64, y: u64, cur: u64) -> usize {
        let entries = self.arena[head::MEMO_CAP] as usize / MEMO_WORDS;
        self.arena[head::MEMO] as usize + memo_slot(memo_key(x, y), cur, entries)
    }

    /// A memo of twice the entries, empty, once as many entries were
    /// replaced as it has (and below [`MAX_MEMO_ENTRIES`]); `false` if it
    /// stays (also when the arena has no room: the memo is only a cache).
    fn grow_memo(&mut self) -> bool {
        let words = self.arena[head::MEMO_CAP] as usize;
        let entries = words / MEMO_WORDS;
        if (self.arena[head::MEMO_EVICTIONS] as usize) < entries || entries >= MAX_MEMO_ENTRIES {
            return false;
        }
        let Ok(new) = self.alloc(2 * words) else {
            return false;
        };
        self.arena[head::MEMO] = new as u64;
        self.arena[head::MEMO_CAP] = 2 * words as u64;
        self.arena[head::MEMO_EVICTIONS] = 0;
        true
    }

    /// A call (`x` ends in one) or an emulated call (a jump into `y`'s
    /// function) the memo knows.
    fn fast_call(
        &mut self,
        x: u64,
        y: u64,
        xf: &Packed<'_>,
        yf: &Packed<'_>,
        sp: Option<u64>,
    ) -> bool {
        let cur = self.hot[hot::CUR];
        // The call memo beside x's counter, else the hashed memo's entry.
        let mine = self
            .call_memo_at(xf, cur)
            .and_then(|at| Some((child_of(self.arena[at], y)?, self.arena[at + 1])));
        let (child, arc) = match mine {
            Some(found) => found,
            None => {
                let slot = self.memo_at(x, y, cur);
                let memo = &self.arena[slot..slot + MEMO_WORDS];
                match child_of(memo[1], y) {
                    Some(child) if memo[0] == cur && memo[3] == x => (child, memo[2]),
                    _ => return false,
                }
            }
        };
        if self.leaves_frames(sp) {
            return false;
        }
        let f = yf.function();
        let skip = yf.has(SKIP);
        let active_at = self.arena[head::ACTIVE] as usize + f as usize;
        if skip && self.arena[head::NONSKIPPED_NODE] != NONE {
            return false;
        }
        let child_at = self.node_offset(child);
        if !skip {
            if f as u64 >= self.arena[head::ACTIVE_CAP] {
                return false;
            }
            let mut active = self.arena[active_at] as u32;
            let level = callrules::level(&mut active, true, self.separate_recs);
            // The child is the context (and its counters the ones) the
            // full decision would find.
            let child_level = self.arena[child_at + 1] & 0xffff_ffff;
            if child_level != u64::from(level) || self.arena[child_at + 3] != u64::from(yf.group())
            {
                return false;
            }
        }
        let real = xf.exit() == EXIT_CALL;
        let push_sp = match (real, self.top_sp(), sp) {
            (false, Some(top), _) => top,
            (_, _, Some(sp)) => sp,
            _ => self.arena[head::LAST_SP],
        };
        let caller = self.arena[head::NODE];
        let (ns, ns_site) = (
            self.arena[head::NONSKIPPED_NODE],
            self.arena[head::NONSKIPPED_SITE],
        );
        let frame = [
            push_sp,
            if real { xf.end() } else { 0 },
            (caller & 0xffff_ffff) | u64::from(f) << 32,
            arc,
            self.hot[hot::IR],
            ns,
            ns_site,
            if real { self.resume_of(cur) } else { NONE },
        ];
        if self.push(frame).is_err() {
            return false;
        }
        if skip {
            self.arena[head::NONSKIPPED_NODE] = caller;
            self.arena[head::NONSKIPPED_SITE] = xf.call_site();
        } else {
            let at = self.arena[head::ARCS] as usize + arc as usize * ARC_WORDS;
            self.arena[at + 3] += 1;
            self.arena[active_at] += 1;
            self.arena[head::NODE] = child;
            self.arena[head::NONSKIPPED_NODE] = NONE;
        }
        self.count_at(child_at, yf.last_word() as usize)
    }

    /// A return leaving the frames the stack pointer `sp` passed.
    fn fast_return(&mut self, yf: &Packed<'_>, sp: u64) -> bool {
        // The frames left, down to `last`: none of them what a running
        // signal handler interrupted.
        let depth = self.arena[head::DEPTH] as usize;
        let bottom = self.bottom();
        let mut last = depth;
        while last > bottom && self.arena[self.frame_at(last - 1)] < sp {
            last -= 1;
        }
        if last == depth || (last == bottom && last > 0 && self.arena[self.frame_at(last - 1)] < sp)
        {
            return false;
        }
        let at = self.frame_at(last);
        let frame = &self.arena[at..at + FRAME_WORDS];
        let resume = frame[FRAME_RESUME];
        if frame[1] != yf.start()
            || frame[5] != NONE
            || frame[2] & 0xffff_ffff == 0xffff_ffff
            || resume == NONE
            || self.arena[resume as usize + 3] != u64::from(yf.group())
            || self
                .current_record(self.hot[hot::ARENA] + 8 * (resume + NODE_HEADER as u64))
                .is_none()
        {
            return false;
        }
        while self.arena[head::DEPTH] as usize > last {
            self.pop();
        }
        self.count_at(resume as usize, yf.last_word() as usize)
    }

    /// A jump that leaves no frame: counting goes on in the counters'
    /// group, or in the context's node of another (a `switch` jumping
    /// across a region of code without a name: perl's regex engine made
    /// 12 M such jumps, each a full decision before), which the jumping block's call
    /// memo keeps for the next time.
    fn fast_jump(&mut self, xf: &Packed<'_>, y: u64, yf: &Packed<'_>, sp: Option<u64>) -> bool {
        if self.leaves_frames(sp) {
            return false;
        }
        let cur = self.hot[hot::CUR];
        let Some(at) = self.current_record(cur) else {
            return false;
        };
        let (group, index) = (yf.group(), yf.last_word() as usize);
        if self.arena[at + 3] == u64::from(group) {
            return self.count_at(at, index);
        }
        if self.arena[head::NONSKIPPED_NODE] != NONE {
            return match self.node_counting(group) {
                Ok(Some(id)) => self.count_at(self.node_offset(id), index),
                _ => false,
            };
        }
        let memo = self.call_memo_at(xf, cur);
        if let Some(id) = memo.and_then(|m| child_of(self.arena[m], y)) {
            if self.counts_group_in_context(id, group) {
                return self.count_at(self.node_offset(id), index);
            }
        }
        let Ok(Some(id)) = self.node_counting(group) else {
            return false;
        };
        if let Some(m) = memo {
            self.arena[m..m + CALL_MEMO_WORDS].copy_from_slice(&[memo_child(y, id), NONE]);
        }
        self.count_at(self.node_offset(id), index)
    }

    /// Whether node `id` is where group `group`'s code counts in the
    /// current context (outside skipped code): the context's own node, or
    /// its foreign node of that group (what a call memo of a jump holds;
    /// the engine's inline jump path makes the same checks).
    pub(crate) fn counts_group_in_context(&self, id: u64, group: u32) -> bool {
        let node = self.arena[head::NODE];
        let at = self.node_offset(id);
        let r = &self.arena[at..at + NODE_HEADER];
        r[3] == u64::from(group)
            && (id == node || (r[0] & 0xffff_ffff == node & 0xffff_ffff && r[1] >> 32 == FOREIGN))
    }

    /// Counting goes on in the record at `at` from a block whose last
    /// counter word is number `index` (grown first if it has no room for
    /// it); `false` if the arena is full (the full decision then reports
    /// it).
    #[inline(always)]
    fn count_at(&mut self, at: usize, index: usize) -> bool {
        if index >= self.arena[at + NODE_HEADER - 1] as usize {
            let id = self.arena[at + ID];
            return self.grow_to(id, index).is_ok();
        }
        self.point_at(at);
        true
    }
}
