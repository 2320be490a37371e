//! Tagged counting (`docs/client-contexts.md`, "Session 26"): the runtime
//! of a design at Callgrind's own grain, for runs that write only
//! Callgrind's profile (flat contexts: a context is a function and a
//! recursion level).
//!
//! Translated code counts each block's Ir in the block's own *slot*, a
//! pair of words per block id in the thread area: the *tag* of the
//! context the slot counts for, and the Ir. A block whose tag is the
//! current one ([`hot::CUR`]) adds to its slot; one whose tag differs asks
//! [`Tagged::retag`], which moves what the slot holds into the arena's
//! table of (tag, block) counts and gives the slot the current tag. So a
//! block costs a compare and an add, whatever context it runs in, and a
//! jump costs nothing unless Callgrind's rules may change the context
//! there (a jump between a function's counter groups, which contexts mode
//! has to enter the runtime for, is a plain jump).
//!
//! Tags are numbers the translator can compute: a function `f` at level
//! `l` (of `R = --separate-recs`) is `1 + f*R + l - 1` ([`context_tag`]).
//! Skipped code (the PLT) counts for the call site it was called from,
//! as Callgrind charges it: a *skip record* (caller's tag, call site) per
//! pair, whose tag is [`SKIP_TAGS`] plus its number. A thread's blocks
//! before its first context entry count under a *sink* tag
//! ([`SINK_TAGS`] plus the sink's number), which that entry names the
//! context of ([`sink_adopters`](TaggedArena::sink_adopters)).
//!
//! Context entries make Callgrind's decision as contexts mode's runtime
//! does (`callrules`, with the same frames, arcs, active counts, signal
//! handlers' roots and threads that take an ended thread's number), over
//! this module's own arena.

use crate::arena::NONE;
use crate::facts::{Facts, FACT_WORDS};
use crate::hot;
use crate::runtime::Error;
use crate::table::{entry, find, hash, place};
use callrules::{Calls, Exit, Flow, Step};

type Result<T> = core::result::Result<T, Error>;

/// Tags from here on are skip records' (below: contexts').
pub const SKIP_TAGS: u64 = 1 << 31;
/// Tags from here on are sinks' (below: skip records').
pub const SINK_TAGS: u64 = 3 << 30;
/// A slot that counts for no context yet.
pub const NO_TAG: u64 = 0;
/// Words of a block's slot: two halves of a tag and its Ir, the first
/// the one counted in last (a block of a recursive function runs at two
/// levels by turns, one a function's code jumps into for another's
/// context as its own: two tags are enough for most).
pub const SLOT_WORDS: usize = 4;
/// Block ids a thread's slots have room for.
pub const MAX_BLOCKS: usize = 1 << 22;
/// Bytes of a thread's slots, which lie right before its memos.
pub const SLOTS_BYTES: u64 = (MAX_BLOCKS * SLOT_WORDS * 8) as u64;

/// Words of a block's *memos*, which translated code's inline calls read
/// ([`Tagged::enter`] writes them), by index:
/// * [`M_CALL_KEY`], [`M_CALL_ARC`], [`M_CALL_TARGET`]: the block's last
///   call from a context (the caller's tag in the low half, the callee's
///   in the high: a context's, or a skip record's for a call into skipped
///   code), its arc (none for skipped code) and the address it entered;
///   then the call before it from another context ([`M_CALL2`] words on):
///   a recursive function's call sites run at two levels by turns;
/// * [`M_PLT_KEY`], [`M_PLT_ARC`], [`M_PLT_TARGET`]: the last call that
///   skipped code the block called made (the PLT's jump into its
///   function), its arc and its target; the one before it under another
///   key [`M_PLT2`] words on;
/// * [`M_IN_KEY`], [`M_IN_FROM`], [`M_IN_ARC`]: the last call into the
///   block (its tags, the calling block and the arc), for indirect calls
///   whose targets vary more than their call site's two calls keep (an
///   interpreter's loop calls every operation from one site).
pub const MEMO_WORDS: usize = 16;
/// See [`MEMO_WORDS`].
pub const M_CALL_KEY: usize = 0;
/// See [`MEMO_WORDS`].
pub const M_CALL_ARC: usize = 1;
/// See [`MEMO_WORDS`].
pub const M_CALL_TARGET: usize = 2;
/// Where the second call's words are: [`M_CALL_KEY`] + `M_CALL2` and so
/// on.
pub const M_CALL2: usize = 3;
/// See [`MEMO_WORDS`].
pub const M_PLT_KEY: usize = 6;
/// See [`MEMO_WORDS`].
pub const M_PLT_ARC: usize = 7;
/// See [`MEMO_WORDS`].
pub const M_PLT_TARGET: usize = 8;
/// See [`MEMO_WORDS`].
pub const M_IN_KEY: usize = 9;
/// See [`MEMO_WORDS`].
pub const M_IN_FROM: usize = 10;
/// See [`MEMO_WORDS`].
pub const M_IN_ARC: usize = 11;
/// Where the skipped code's second call out is: [`M_PLT_KEY`] +
/// `M_PLT2` and so on (a recursive function's call sites into the PLT run
/// at two levels by turns, each with its own skip record).
pub const M_PLT2: usize = 6;
const _: () = assert!(M_PLT_KEY + M_PLT2 + 3 <= MEMO_WORDS && M_PLT2 >= 3);
/// Bytes of a thread's memos, which lie right before its arena (the
/// runtime finds them, and the slots before them, from the arena's
/// address).
pub const MEMOS_BYTES: u64 = (MAX_BLOCKS * MEMO_WORDS * 8) as u64;

/// The counts a thread's slots hold, as (tag, block id, Ir), each half
/// that counted any Ir.
pub fn slot_counts(slots: &[u64]) -> impl Iterator<Item = (u64, u64, u64)> + '_ {
    slots
        .chunks_exact(SLOT_WORDS)
        .enumerate()
        .flat_map(|(b, s)| s.chunks(2).map(move |h| (h[0], b as u64, h[1])))
        .filter(|&(_, _, ir)| ir != 0)
}

/// [`hot::NS_SKIP`] for the tag `tag`: its skip record's number, or
/// [`NONE`] for a context's or a sink's.
#[inline(always)]
pub fn skip_record_of(tag: u64) -> u64 {
    if (SKIP_TAGS..SINK_TAGS).contains(&tag) {
        tag - SKIP_TAGS
    } else {
        NONE
    }
}

/// The tag of function `f`'s context at recursion level `level` (from
/// 1), with `--separate-recs` `recs` (0 counts as 1).
#[inline(always)]
pub fn context_tag(f: u32, level: u32, recs: u32) -> u64 {
    1 + u64::from(f) * u64::from(recs.max(1)) + u64::from(level.max(1) - 1)
}

/// The function and level of a context's tag.
#[inline(always)]
pub fn context_of_tag(tag: u64, recs: u32) -> (u32, u32) {
    let r = u64::from(recs.max(1));
    (((tag - 1) / r) as u32, ((tag - 1) % r) as u32 + 1)
}

/// Header words of the arena, by index.
pub mod head {
    /// Words used (the next record goes there); 0 until the first entry.
    pub const USED: usize = 0;
    /// The current context's tag ([`super::NO_TAG`]: none yet).
    pub const CTX: usize = 1;
    /// Frames on the stack.
    pub const DEPTH: usize = 2;
    /// The frames' vector (offset, capacity in frames).
    pub const STACK: usize = 3;
    /// Its capacity in frames.
    pub const STACK_CAP: usize = 4;
    /// Per function, its frames on the stack (offset, capacity).
    pub const ACTIVE: usize = 5;
    /// Its capacity.
    pub const ACTIVE_CAP: usize = 6;
    /// The last stack pointer known.
    pub const LAST_SP: usize = 7;
    /// In skipped code: the tag of the context it is charged to
    /// ([`super::NO_TAG`]: not in skipped code).
    pub const NS_CTX: usize = 8;
    /// And the call site.
    pub const NS_SITE: usize = 9;
    /// What each running signal handler interrupted (offset, length,
    /// capacity in records).
    pub const SIGNALS: usize = 10;
    /// Its length.
    pub const SIGNALS_LEN: usize = 11;
    /// Its capacity in records.
    pub const SIGNALS_CAP: usize = 12;
    /// Context entries.
    pub const ENTRIES: usize = 13;
    /// Slots given another tag.
    pub const RETAGS: usize = 14;
    /// Calls and returns translated code did inline (not in
    /// [`ENTRIES`]).
    pub const INLINE: usize = 36;
    /// The block whose call entered skipped code (the PLT), until the next
    /// transition: the skipped code's call out is memoized there
    /// ([`super::M_PLT_KEY`]); [`crate::NONE`] otherwise.
    pub const NS_BLOCK: usize = 37;
    /// A thread that took an ended thread's number: the context it was
    /// in plus one, until its first entry (0: none).
    pub const CONTINUED: usize = 15;
    /// The tables: arcs, skip records, (tag, block) counts, sinks' adopters;
    /// each five words from here (see `Table`).
    pub const ARCS: usize = 16;
    /// Skip records.
    pub const SKIPS: usize = 21;
    /// Counts moved out of slots.
    pub const COUNTS: usize = 26;
    /// Per sink, the tag its counts are charged to.
    pub const SINKS: usize = 31;
    /// Words of header.
    pub const WORDS: usize = 40;
}

/// Most frames an inline return leaves (more: the runtime's entry; the
/// bound keeps the sequence within the steps a signal waits for). GCC's
/// split functions (`f` and `f.cold`, jumps between them taken for calls)
/// leave chains of frames that one return pops: sqlite's returns of 7 to
/// 16 frames were 402,000 of its 567,000 runtime entries with six.
pub const INLINE_POPS: usize = 16;

/// Words of a frame: the stack pointer after the call, the address it
/// returns to (0: an emulated call), the caller's tag (low half) and the
/// callee's function (high half), the arc ([`NONE`] for skipped code),
/// the running Ir at the call, the skipped-code tag and site before it,
/// and a word unused.
pub const FRAME_WORDS: usize = 8;
/// Words of what a signal handler interrupted: the context, the stack's
/// depth, the skipped-code state, the last stack pointer, the running Ir.
const SIGNAL_WORDS: usize = 6;

/// A vector of records of `words` words, the first `key` of them a key,
/// with an open-addressed index; its header is five words at `at`: the
/// records' offset, their number, their capacity in records, the index's
/// offset and its capacity (0 for a vector without one).
#[derive(Clone, Copy)]
struct Table {
    at: usize,
    words: usize,
    key: usize,
}

/// Arcs: (caller's tag | callee's tag << 32, call site, target), calls,
/// inclusive Ir.
const ARCS: Table = Table {
    at: head::ARCS,
    words: 5,
    key: 3,
};
/// Skip records: (caller's tag, call site), and the Ir skipped code's
/// blocks counted for them ([`hot::NS_SKIP`]).
const SKIPS: Table = Table {
    at: head::SKIPS,
    words: 3,
    key: 2,
};
/// The word of a skip record its blocks' Ir goes to.
pub const SKIP_IR: usize = 2;
/// Words of a skip record.
pub const SKIP_WORDS: usize = 3;
/// Counts: (tag | block << 32), Ir.
const COUNTS: Table = Table {
    at: head::COUNTS,
    words: 2,
    key: 1,
};
/// Sinks' adopters: a tag each, by sink number (no index).
const SINKS: Table = Table {
    at: head::SINKS,
    words: 1,
    key: 0,
};

/// One thread's tagged-counting runtime over its hot words, its arena,
/// its slots and the process's block facts.
pub struct Tagged<'a> {
    /// The thread's hot words ([`crate::hot`]; [`hot::CUR`] holds the
    /// current tag).
    pub hot: &'a mut [u64],
    /// The thread's arena.
    pub arena: &'a mut [u64],
    /// The thread's slots, [`SLOT_WORDS`] per block id.
    pub slots: &'a mut [u64],
    /// The thread's memos, [`MEMO_WORDS`] per block id.
    pub memos: &'a mut [u64],
    /// The process's block facts, [`FACT_WORDS`] per block id.
    pub facts: &'a [u64],
    /// `--separate-recs`.
    pub separate_recs: u32,
}

/// The hot words of a thread that starts afresh with the arena at `arena`
/// (client address), `words` long (its header, which must read all zero,
/// is made at the first entry: translated code's inline paths read it).
pub fn fresh_thread(arena: u64, words: u64) -> [u64; hot::WORDS] {
    let mut h = [0; hot::WORDS];
    h[hot::CUR] = SINK_TAGS;
    h[hot::LAST] = NONE;
    h[hot::NS_SKIP] = NONE;
    h[hot::ARENA] = arena;
    h[hot::ARENA_WORDS] = words;
    h
}

/// The hot words and the arena's words to write (index, value) for a
/// thread that takes an ended thread's number and goes on with its arena
/// (`old`: its hot words and arena header), as Callgrind goes on with a
/// thread number's call stack: its first blocks count in a new sink,
/// which its first entry charges to the context the old thread was in.
pub fn continued_thread(
    old_hot: &[u64; hot::WORDS],
    old_head: &[u64],
) -> ([(usize, u64); 2], [u64; hot::WORDS]) {
    let mut h = *old_hot;
    h[hot::LAST] = NONE;
    h[hot::NS_SKIP] = NONE;
    if old_head.get(head::USED).copied().unwrap_or(0) == 0 {
        h[hot::CUR] = SINK_TAGS;
        return ([(head::USED, 0); 2], h);
    }
    h[hot::CUR] = SINK_TAGS + old_head[SINKS.at + 1];
    let writes = [
        (head::CONTINUED, old_head[head::CTX] + 1),
        (head::CTX, NO_TAG),
    ];
    (writes, h)
}

impl Tagged<'_> {
    /// Control enters block `y` through its context entry with the stack
    /// pointer `sp`, from the block in [`hot::LAST`].
    pub fn enter(&mut self, y: u64, sp: u64) -> Result<()> {
        self.init()?;
        self.arena[head::ENTRIES] += 1;
        let ns_block = core::mem::replace(&mut self.arena[head::NS_BLOCK], NONE);
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
        // Still in the thread's sink: its first entry names the context
        // the sink's counts are charged to (none, without a block left).
        let in_sink = self.hot[hot::CUR] >= SINK_TAGS;
        if self.arena[head::CONTINUED] != 0 {
            self.arena[head::CTX] = core::mem::take(&mut self.arena[head::CONTINUED]) - 1;
            if in_sink {
                let tag = if xf.is_some() {
                    self.counting_tag()
                } else {
                    NO_TAG
                };
                self.adopt_sink(tag)?;
            }
        } else if let (Some(x), NO_TAG, true) = (&xf, self.arena[head::CTX], in_sink) {
            // A thread's first entry: its first blocks (a `clone` child
            // goes on in the block that made it) are a root of their
            // function's, as the call tool takes a thread's first block.
            let f = x.flow.function;
            let a = self.active(f)?;
            let mut active = self.arena[a] as u32;
            let level = callrules::level(&mut active, false, self.separate_recs);
            self.arena[a] = u64::from(active);
            self.arena[head::CTX] = context_tag(f, level, self.separate_recs);
            self.adopt_sink(self.arena[head::CTX])?;
        } else if in_sink {
            self.adopt_sink(NO_TAG)?;
        }
        let sp = xf.filter(|x| x.sp_known).map(|_| sp);
        if let Some(sp) = sp {
            self.arena[head::LAST_SP] = sp;
        }
        let step = {
            let mut k = Keeper {
                rt: self,
                err: None,
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
        let caller = self.arena[head::CTX];
        let mut arc = NONE;
        if (push && !skip) || caller == NO_TAG {
            let a = self.active(f)?;
            let mut active = self.arena[a] as u32;
            let level = callrules::level(&mut active, push && !skip, self.separate_recs);
            self.arena[a] = u64::from(active);
            let callee = context_tag(f, level, self.separate_recs);
            if push && !skip {
                let mut from = (caller, site);
                if self.arena[head::NS_CTX] != NO_TAG {
                    from = (self.arena[head::NS_CTX], self.arena[head::NS_SITE]);
                }
                arc = self.arc(from.0, from.1, callee, yf.flow.start)?;
            }
            self.arena[head::CTX] = callee;
        }
        let real_call = xf.is_some_and(|x| x.flow.exit == Exit::Call) && last != y;
        // A jump taken for a call (a tail call), which inline jumps can
        // do again from the same memo (not the resolver's, whose call is
        // its caller's).
        let jump_call =
            xf.is_some_and(|x| x.flow.exit == Exit::Jump && !x.flow.pop_on_jump) && last != y;
        let ns_before = self.arena[head::NS_CTX];
        let callee = self.arena[head::CTX];
        if push && !skip && caller != NO_TAG {
            if (real_call || jump_call) && ns_before == NO_TAG {
                // The calling block's memo and the callee's (read by inline
                // calls and tail calls, direct and indirect, which check
                // both tags).
                let key = caller | callee << 32;
                self.memo_call(last, [key, arc, yf.flow.start]);
                // (Through a pointer, a call site or a tail call site may
                // reach more functions than its memo's two calls keep.)
                self.memo(y, M_IN_KEY, [key, last, arc]);
            } else if xf.is_some_and(|x| x.flow.skip) && ns_before != NO_TAG && ns_block != NONE {
                // Skipped code (the PLT) calling out, for the block that
                // called it.
                let key = ns_before | callee << 32;
                self.memo_plt(ns_block, [key, arc, yf.flow.start]);
            }
        }
        if push {
            let frame = [
                push_sp.unwrap_or(self.arena[head::LAST_SP]),
                ret_addr,
                caller | u64::from(f) << 32,
                arc,
                hot::running_ir(self.hot),
                self.arena[head::NS_CTX],
                self.arena[head::NS_SITE],
                0,
            ];
            if skip {
                if self.arena[head::NS_CTX] == NO_TAG {
                    self.arena[head::NS_CTX] = caller;
                    self.arena[head::NS_SITE] = site;
                }
            } else {
                let at = self.record(ARCS, arc);
                self.arena[at + 3] += 1;
                let a = self.active(f)?;
                self.arena[a] += 1;
                self.arena[head::NS_CTX] = NO_TAG;
            }
            self.push(frame)?;
        }
        let tag = self.counting_tag();
        if tag != NO_TAG {
            self.hot[hot::CUR] = tag;
        }
        self.hot[hot::NS_SKIP] = skip_record_of(self.hot[hot::CUR]);
        if push
            && skip
            && (real_call || jump_call)
            && caller != NO_TAG
            && ns_before == NO_TAG
            && tag >= SKIP_TAGS
        {
            // A call into skipped code: the calling block's memo names the
            // skip record, and the skipped code's call out is memoized
            // there next.
            self.memo_call(last, [caller | tag << 32, NONE, yf.flow.start]);
            self.arena[head::NS_BLOCK] = last;
        }
        Ok(())
    }

    /// A call from block `b` (key, arc, target) becomes its memo's first,
    /// the first its second unless it was the same key.
    fn memo_call(&mut self, b: u64, call: [u64; 3]) {
        let i = b as usize * MEMO_WORDS;
        if let Some(m) = self.memos.get_mut(i..i + 2 * M_CALL2) {
            if m[M_CALL_KEY] != call[0] {
                m.copy_within(M_CALL_KEY..M_CALL2, M_CALL2);
            }
            m[..M_CALL2].copy_from_slice(&call);
        }
    }

    /// The call out of skipped code that block `b` called (key, arc,
    /// target) becomes its memo's first, the first its second if its key
    /// differs.
    fn memo_plt(&mut self, b: u64, call: [u64; 3]) {
        let i = b as usize * MEMO_WORDS + M_PLT_KEY;
        if let Some(m) = self.memos.get_mut(i..i + M_PLT2 + 3) {
            if m[0] != call[0] {
                m.copy_within(0..3, M_PLT2);
            }
            m[..3].copy_from_slice(&call);
        }
    }

    /// The arc of the call from block `x` its memo's two calls know
    /// under `key` (into `target`, if given).
    fn memo_arc(&self, x: u64, key: u64, target: Option<u64>) -> Option<u64> {
        let m = &self.memos[x as usize * MEMO_WORDS..][..2 * M_CALL2];
        [0, M_CALL2]
            .into_iter()
            .find(|&k| m[k + M_CALL_KEY] == key && target.is_none_or(|t| m[k + M_CALL_TARGET] == t))
            .map(|k| m[k + M_CALL_ARC])
    }

    /// Writes `words` into block `b`'s memos from word `at`.
    fn memo<const N: usize>(&mut self, b: u64, at: usize, words: [u64; N]) {
        let i = b as usize * MEMO_WORDS + at;
        if let Some(m) = self.memos.get_mut(i..i + N) {
            m.copy_from_slice(&words);
        }
    }

    /// Block `b` runs where neither half of its slot counts for the
    /// current tag: what the second holds moves to the arena's counts, the
    /// first becomes the second, and the first counts for the current tag
    /// from now on.
    pub fn retag(&mut self, b: u64) -> Result<()> {
        self.init()?;
        let at = b as usize * SLOT_WORDS;
        if at + SLOT_WORDS > self.slots.len() {
            return Err(Error::UnknownBlock(b));
        }
        self.arena[head::RETAGS] += 1;
        let (tag, ir) = (self.slots[at + 2], self.slots[at + 3]);
        self.slots.copy_within(at..at + 2, at + 2);
        self.slots[at] = self.hot[hot::CUR];
        self.slots[at + 1] = 0;
        if tag != NO_TAG && ir != 0 {
            self.add_count(tag, b, ir)?;
        }
        Ok(())
    }

    /// What a block `b` of `ir` instructions does to count in its slot
    /// (the engine's `emit::contexts`, word for word): in the half that
    /// counts for the current tag, else in the first once retagged.
    pub fn count_in_slot(&mut self, b: u64, ir: u64) -> Result<()> {
        let at = b as usize * SLOT_WORDS;
        let cur = self.hot[hot::CUR];
        if self.slots.get(at) == Some(&cur) {
            self.slots[at + 1] += ir;
        } else if self.slots.get(at + 2) == Some(&cur) {
            self.slots[at + 3] += ir;
        } else {
            self.retag(b)?;
            self.slots[at + 1] += ir;
        }
        Ok(())
    }

    /// Whether the inline paths may run: no signal handler, a context.
    fn inline_ok(&self) -> bool {
        self.arena[head::SIGNALS_LEN] | self.hot[hot::SIGNALS] == 0
            && self.arena[head::CTX] != NO_TAG
    }

    /// The word offset of frame `i` from the top (0: the top).
    fn frame_from_top(&self, i: usize) -> usize {
        let depth = self.arena[head::DEPTH] as usize;
        self.arena[head::STACK] as usize + (depth - 1 - i) * FRAME_WORDS
    }

    /// Whether no frame is left by the stack pointer `sp` (the top one's
    /// is not below it).
    fn no_frame_left(&self, sp: u64) -> bool {
        self.arena[head::DEPTH] == 0 || self.arena[self.frame_from_top(0)] >= sp
    }

    /// The tag of function `f`'s context when called now (its level one
    /// more than its frames), if `f`'s active count has room.
    fn called_tag(&self, f: u32) -> Option<u64> {
        if u64::from(f) >= self.arena[head::ACTIVE_CAP] {
            return None;
        }
        let active = self.arena[self.arena[head::ACTIVE] as usize + f as usize];
        let recs = u64::from(self.separate_recs.max(1));
        Some(1 + u64::from(f) * recs + (active + 1).min(recs) - 1)
    }

    /// Ends an inline transition: the stack pointer known (not at a
    /// direct jump), the entry done.
    fn inline_done(&mut self, sp: Option<u64>) -> bool {
        if let Some(sp) = sp {
            self.arena[head::LAST_SP] = sp;
        }
        self.arena[head::INLINE] += 1;
        // (`hot::LAST` is left as it is: a block stores it on its way to
        // a context entry, which alone reads it, and this one was
        // skipped.)
        true
    }

    /// A call of `f`'s context `callee` on arc `arc`: its calls, `f`'s
    /// active count, the frame (at `sp`, returning to `ret_addr`), and
    /// counting in the callee. Outside skipped code.
    fn push_call(&mut self, f: u32, callee: u64, arc: u64, sp: u64, ret_addr: u64) {
        let caller = self.arena[head::CTX];
        let at = self.record(ARCS, arc);
        self.arena[at + 3] += 1;
        let active = self.arena[head::ACTIVE] as usize + f as usize;
        self.arena[active] += 1;
        // Outside skipped code its call site is dead, and so is the block
        // that called it ([`head::NS_BLOCK`]): translated code stores
        // neither (the frame's site word keeps whatever it held).
        let ns = self.arena[head::NS_CTX];
        let top = self.arena[head::STACK] as usize + self.arena[head::DEPTH] as usize * FRAME_WORDS;
        let site = match ns {
            NO_TAG => self.arena[top + 6],
            _ => self.arena[head::NS_SITE],
        };
        let frame = [
            sp,
            ret_addr,
            caller | u64::from(f) << 32,
            arc,
            hot::running_ir(self.hot),
            ns,
            site,
            self.arena[top + 7],
        ];
        self.put_frame(frame);
        self.arena[head::CTX] = callee;
        self.hot[hot::CUR] = callee;
        // Outside skipped code the current tag is no skip record's: both
        // words already say so.
        if ns != NO_TAG {
            self.arena[head::NS_CTX] = NO_TAG;
            self.hot[hot::NS_SKIP] = NONE;
        }
    }

    fn put_frame(&mut self, frame: [u64; FRAME_WORDS]) {
        let depth = self.arena[head::DEPTH] as usize;
        let top = self.arena[head::STACK] as usize + depth * FRAME_WORDS;
        self.arena[top..top + FRAME_WORDS].copy_from_slice(&frame);
        self.arena[head::DEPTH] = depth as u64 + 1;
    }

    /// What translated code does inline at a `ret` (the engine's
    /// `emit::tagged`, word for word), with the stack pointer `sp` after
    /// it: the commonest returns, which leave the top frame and the frames
    /// under it the stack pointer left too, up to [`INLINE_POPS`] (a call
    /// through the PLT leaves the callee's and the skipped code's; a tail
    /// call through it, the caller's too), back to a context's own code,
    /// outside signal handlers. Returns whether it did; if not, nothing
    /// changed and the target's context entry decides.
    pub fn inline_return(&mut self, sp: u64) -> bool {
        let depth = self.arena[head::DEPTH] as usize;
        if self.arena[head::SIGNALS_LEN] | self.hot[hot::SIGNALS] != 0 || depth == 0 {
            return false;
        }
        let top = self.frame_from_top(0);
        if self.arena[top] >= sp {
            return false;
        }
        // The frames it leaves: the top, and those under it the stack
        // pointer left.
        let mut pops = 1;
        while pops < depth && self.arena[top - pops * FRAME_WORDS] < sp {
            if pops == INLINE_POPS {
                return false;
            }
            pops += 1;
        }
        let last = top - (pops - 1) * FRAME_WORDS;
        if self.arena[last + 5] != NO_TAG {
            return false;
        }
        let ir = hot::running_ir(self.hot);
        let a = &mut *self.arena;
        for frame in (last..=top).step_by(FRAME_WORDS) {
            let arc = a[frame + 3];
            if arc != NONE {
                let at = a[ARCS.at] as usize + arc as usize * ARCS.words;
                a[at + 4] += ir - a[frame + 4];
                let f = a[head::ACTIVE] as usize + (a[frame + 2] >> 32) as usize;
                a[f] = a[f].saturating_sub(1);
            }
        }
        let caller = a[last + 2] & 0xffff_ffff;
        a[head::CTX] = caller;
        self.hot[hot::CUR] = caller;
        // Back outside skipped code (its site and block are dead), if it
        // was in it: outside, both words already say so.
        if a[head::NS_CTX] != NO_TAG {
            a[head::NS_CTX] = NO_TAG;
            self.hot[hot::NS_SKIP] = NONE;
        }
        a[head::DEPTH] = (depth - pops) as u64;
        self.inline_done(Some(sp))
    }

    /// What a block of skipped code does with its `ir` (the engine's
    /// `emit::contexts`): in skipped code a call entered, its skip
    /// record's Ir gets it ([`hot::NS_SKIP`]). Returns whether it did;
    /// if not, the block counts in its slot.
    pub fn count_skipped(&mut self, ir: u64) -> bool {
        let n = self.hot[hot::NS_SKIP];
        if n == NONE {
            return false;
        }
        let at = self.arena[SKIPS.at] as usize + n as usize * SKIPS.words + SKIP_IR;
        self.arena[at] += ir;
        true
    }

    /// What translated code does inline at an indirect jump from code of
    /// domain `from` into a block of domain `to` (`entry`: a function
    /// starts there), with the stack pointer `sp` there: a jump Callgrind's
    /// rules keep in the context (not into a function's start nor another
    /// domain, leaving no frame), outside signal handlers. Returns whether
    /// it did; if not, nothing changed.
    pub fn inline_jump(&mut self, from: u32, to: u32, entry: bool, sp: u64) -> bool {
        if entry || from != to || !self.inline_ok() || !self.no_frame_left(sp) {
            return false;
        }
        self.inline_done(Some(sp))
    }

    /// What translated code does inline at a direct `call` from block `x`
    /// (returning to `ret_addr`) of function `f`'s first block, with the
    /// stack pointer `sp` after it: the call its memo knows, from a
    /// context outside signal handlers and skipped code, leaving no frame.
    /// `skip_site`: the callee is skipped code (the PLT), called from that
    /// call site. Returns whether it did; if not, nothing changed.
    pub fn inline_call(
        &mut self,
        x: u64,
        f: u32,
        sp: u64,
        ret_addr: u64,
        skip_site: Option<u64>,
    ) -> bool {
        self.no_frame_left(sp)
            && self.direct_call(x, f, sp, ret_addr, skip_site)
            && self.inline_done(Some(sp))
    }

    /// What translated code does inline at a direct `jmp` from block `x`
    /// that Callgrind takes for a call (a tail call: into function `f`'s
    /// first block, or into another domain; `skip_site` as for
    /// [`Tagged::inline_call`]): the call its memo knows. The jump's stack
    /// pointer is not known (Callgrind's rules do not look at it): the
    /// frame has the top frame's, or the last one known without a frame,
    /// and nothing is unwound. Returns whether it did; if not, nothing
    /// changed.
    pub fn inline_jump_call(&mut self, x: u64, f: u32, skip_site: Option<u64>) -> bool {
        let sp = match self.arena[head::DEPTH] {
            0 => self.arena[head::LAST_SP],
            _ => self.arena[self.frame_from_top(0)],
        };
        self.direct_call(x, f, sp, 0, skip_site) && self.inline_done(None)
    }

    /// The call of [`Tagged::inline_call`] and
    /// [`Tagged::inline_jump_call`], its frame at `frame_sp`.
    fn direct_call(
        &mut self,
        x: u64,
        f: u32,
        frame_sp: u64,
        ret_addr: u64,
        skip_site: Option<u64>,
    ) -> bool {
        let depth = self.arena[head::DEPTH];
        let caller = self.arena[head::CTX];
        if !self.inline_ok()
            || self.arena[head::NS_CTX] != NO_TAG
            || depth >= self.arena[head::STACK_CAP]
        {
            return false;
        }
        let memo = x as usize * MEMO_WORDS;
        if let Some(site) = skip_site {
            // Into skipped code: a frame without an arc, counting for the
            // call site's skip record (either of the memo's calls).
            let Some(key) = [0, M_CALL2]
                .map(|k| self.memos[memo + k + M_CALL_KEY])
                .into_iter()
                .find(|&key| key & 0xffff_ffff == caller && key >> 32 >= SKIP_TAGS)
            else {
                return false;
            };
            let frame = [
                frame_sp,
                ret_addr,
                caller | u64::from(f) << 32,
                NONE,
                hot::running_ir(self.hot),
                NO_TAG,
                self.arena[head::NS_SITE],
                0,
            ];
            self.put_frame(frame);
            self.arena[head::NS_CTX] = caller;
            self.arena[head::NS_SITE] = site;
            self.arena[head::NS_BLOCK] = x;
            self.hot[hot::CUR] = key >> 32;
            self.hot[hot::NS_SKIP] = skip_record_of(key >> 32);
            return true;
        }
        let Some(callee) = self.called_tag(f) else {
            return false;
        };
        let Some(arc) = self.memo_arc(x, caller | callee << 32, None) else {
            return false;
        };
        self.push_call(f, callee, arc, frame_sp, ret_addr);
        true
    }

    /// What translated code does inline at skipped code's indirect jump
    /// (the PLT's) into function `f`'s block at `target` (not skipped,
    /// a function's start or another domain: a call), with the stack
    /// pointer `sp`: the call the memo of the block that called the
    /// skipped code knows. Returns whether it did; if not, nothing
    /// changed.
    pub fn inline_skipped_call(&mut self, f: u32, target: u64, sp: u64) -> bool {
        let (depth, x) = (self.arena[head::DEPTH], self.arena[head::NS_BLOCK]);
        let ns = self.arena[head::NS_CTX];
        if !self.inline_ok()
            || ns == NO_TAG
            || x == NONE
            || depth == 0
            || depth >= self.arena[head::STACK_CAP]
            || !self.no_frame_left(sp)
        {
            return false;
        }
        let Some(callee) = self.called_tag(f) else {
            return false;
        };
        let memo = x as usize * MEMO_WORDS;
        let Some(k) = [0, M_PLT2].into_iter().find(|&k| {
            self.memos[memo + k + M_PLT_KEY] == ns | callee << 32
                && self.memos[memo + k + M_PLT_TARGET] == target
        }) else {
            return false;
        };
        // An emulated call: the frame has the skip frame's stack pointer.
        let frame_sp = self.arena[self.frame_from_top(0)];
        let arc = self.memos[memo + k + M_PLT_ARC];
        self.push_call(f, callee, arc, frame_sp, 0);
        self.inline_done(Some(sp))
    }

    /// What translated code does inline at an indirect `call` from block
    /// `x` (returning to `ret_addr`) into block `y` at `target`, of
    /// function `f` (not skipped), with the stack pointer `sp` after it:
    /// the call `x`'s memo knows, or `y`'s. Returns whether it did; if
    /// not, nothing changed.
    pub fn inline_indirect_call(
        &mut self,
        x: u64,
        y: u64,
        target: u64,
        f: u32,
        sp: u64,
        ret_addr: u64,
    ) -> bool {
        let Some((callee, arc)) = self.indirect_arc(x, y, target, f, sp) else {
            return false;
        };
        self.push_call(f, callee, arc, sp, ret_addr);
        self.inline_done(Some(sp))
    }

    /// What translated code does inline at an indirect jump from block `x`
    /// that Callgrind takes for a call (a tail call through a pointer:
    /// into function `f`'s block at `target`, its first block or another
    /// domain's, not skipped; block `y`), with the stack pointer `sp`
    /// there: the call `x`'s memo knows, or `y`'s (the last call into it,
    /// if from `x`: a dispatcher's tail call site reaches many
    /// functions), its frame at the top frame's stack pointer (or `sp`
    /// without one). Returns whether it did; if not, nothing changed.
    pub fn inline_indirect_jump_call(
        &mut self,
        x: u64,
        y: u64,
        target: u64,
        f: u32,
        sp: u64,
    ) -> bool {
        let Some((callee, arc)) = self.indirect_arc(x, y, target, f, sp) else {
            return false;
        };
        let frame_sp = match self.arena[head::DEPTH] {
            0 => sp,
            _ => self.arena[self.frame_from_top(0)],
        };
        self.push_call(f, callee, arc, frame_sp, 0);
        self.inline_done(Some(sp))
    }

    /// The callee's tag and the arc of a call through a pointer from
    /// block `x` into block `y` at `target`, of function `f`, with the
    /// stack pointer `sp`, where one can be done inline: the arc `x`'s
    /// memo knows, else `y`'s if its last call in came from `x`.
    fn indirect_arc(&self, x: u64, y: u64, target: u64, f: u32, sp: u64) -> Option<(u64, u64)> {
        if !self.inline_ok()
            || self.arena[head::NS_CTX] != NO_TAG
            || self.arena[head::DEPTH] >= self.arena[head::STACK_CAP]
            || !self.no_frame_left(sp)
        {
            return None;
        }
        let callee = self.called_tag(f)?;
        let key = self.arena[head::CTX] | callee << 32;
        let memo = y as usize * MEMO_WORDS;
        let arc = self.memo_arc(x, key, Some(target)).or_else(|| {
            (self.memos[memo + M_IN_KEY] == key && self.memos[memo + M_IN_FROM] == x)
                .then(|| self.memos[memo + M_IN_ARC])
        })?;
        Some((callee, arc))
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

    /// The tag blocks count for now: a skip record's in skipped code,
    /// else the context's ([`NO_TAG`]: none).
    fn counting_tag(&mut self) -> u64 {
        let ns = self.arena[head::NS_CTX];
        if ns == NO_TAG {
            return self.arena[head::CTX];
        }
        let site = self.arena[head::NS_SITE];
        match self.find_or_add(SKIPS, &[ns, site]) {
            Ok(id) => SKIP_TAGS + id,
            // (No room: the arena's end is reported at the next entry.)
            Err(_) => self.arena[head::CTX],
        }
    }

    /// The sink the thread's blocks have counted in since it started
    /// (the next sink's number) is `tag`'s.
    fn adopt_sink(&mut self, tag: u64) -> Result<()> {
        let n = self.arena[SINKS.at + 1];
        let at = self.reserve(SINKS, n as usize + 1)?;
        self.arena[at + n as usize] = tag;
        self.arena[SINKS.at + 1] = n + 1;
        Ok(())
    }

    /// A signal handler starts: what it interrupted is kept, and it starts
    /// a root (Callgrind's handlers are roots).
    fn start_signal(&mut self) -> Result<()> {
        let n = self.arena[head::SIGNALS_LEN] as usize;
        let at = self.reserve_words(head::SIGNALS, head::SIGNALS_CAP, (n + 1) * SIGNAL_WORDS)?;
        let record = [
            self.arena[head::CTX],
            self.arena[head::DEPTH],
            self.arena[head::NS_CTX],
            self.arena[head::NS_SITE],
            self.arena[head::LAST_SP],
            hot::running_ir(self.hot),
        ];
        self.arena[at + n * SIGNAL_WORDS..][..SIGNAL_WORDS].copy_from_slice(&record);
        self.arena[head::SIGNALS_LEN] = n as u64 + 1;
        self.hot[hot::SIGNALS] = n as u64 + 1;
        self.arena[head::CTX] = NO_TAG;
        self.arena[head::NS_CTX] = NO_TAG;
        Ok(())
    }

    /// The innermost handler ended (`returned` by `rt_sigreturn`, which
    /// put the interrupted code's running Ir back itself, or left by
    /// `longjmp`): back to what it interrupted.
    fn end_signal(&mut self, returned: bool) {
        let Some(n) = (self.arena[head::SIGNALS_LEN] as usize).checked_sub(1) else {
            return;
        };
        let at = self.arena[head::SIGNALS] as usize + n * SIGNAL_WORDS;
        let mut r = [0; SIGNAL_WORDS];
        r.copy_from_slice(&self.arena[at..at + SIGNAL_WORDS]);
        self.arena[head::CTX] = r[0];
        self.arena[head::NS_CTX] = r[2];
        self.arena[head::NS_SITE] = r[3];
        self.arena[head::LAST_SP] = r[4];
        if !returned {
            self.hot[hot::IR] = r[5];
            for w in hot::IR_MORE {
                self.hot[w] = 0;
            }
        }
        self.arena[head::SIGNALS_LEN] = n as u64;
        self.hot[hot::SIGNALS] = n as u64;
    }

    /// The stack depth below which frames are the code's the innermost
    /// running handler interrupted (0 outside handlers).
    fn bottom(&self) -> usize {
        match (self.arena[head::SIGNALS_LEN] as usize).checked_sub(1) {
            Some(n) => {
                self.arena[self.arena[head::SIGNALS] as usize + n * SIGNAL_WORDS + 1] as usize
            }
            None => 0,
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
        self.arena[head::USED] = head::WORDS as u64;
        for (off, cap, n) in [
            (head::STACK, head::STACK_CAP, 64 * FRAME_WORDS),
            (head::ACTIVE, head::ACTIVE_CAP, 256),
            (head::SIGNALS, head::SIGNALS_CAP, 4 * SIGNAL_WORDS),
        ] {
            self.arena[off] = self.alloc(n)? as u64;
            self.arena[cap] = n as u64;
        }
        self.arena[head::STACK_CAP] = 64;
        self.arena[head::NS_BLOCK] = NONE;
        for (t, n) in [(ARCS, 256), (SKIPS, 64), (COUNTS, 256), (SINKS, 4)] {
            self.arena[t.at] = self.alloc(n * t.words)? as u64;
            self.arena[t.at + 2] = n as u64;
            if t.key > 0 {
                self.arena[t.at + 3] = self.alloc(2 * n)? as u64;
                self.arena[t.at + 4] = 2 * n as u64;
            }
        }
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
    fn alloc(&mut self, n: usize) -> Result<usize> {
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
    fn reserve_words(&mut self, off: usize, cap: usize, need: usize) -> Result<usize> {
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

    /// Table `t`'s records, with room for `n` of them.
    fn reserve(&mut self, t: Table, n: usize) -> Result<usize> {
        let cap = self.arena[t.at + 2] as usize;
        if n <= cap {
            return Ok(self.arena[t.at] as usize);
        }
        let (at, m) = (self.arena[t.at] as usize, n.max(2 * cap));
        let new = self.alloc(m * t.words)?;
        self.arena.copy_within(at..at + cap * t.words, new);
        self.arena[t.at] = new as u64;
        self.arena[t.at + 2] = m as u64;
        Ok(new)
    }

    /// Where record `id` of table `t` is.
    #[inline(always)]
    fn record(&self, t: Table, id: u64) -> usize {
        self.arena[t.at] as usize + id as usize * t.words
    }

    /// The record of `t` with `key`, made (its other words zero) if new.
    fn find_or_add(&mut self, t: Table, key: &[u64]) -> Result<u64> {
        let (index, cap) = (self.arena[t.at + 3] as usize, self.arena[t.at + 4] as usize);
        let h = hash(key);
        let records = self.arena[t.at] as usize;
        let slot = match find(&self.arena[index..index + cap], h, |id| {
            let at = records + id as usize * t.words;
            self.arena[at..at + t.key] == *key
        }) {
            Ok(id) => return Ok(id),
            Err(slot) => slot,
        };
        let id = self.arena[t.at + 1];
        let at = self.reserve(t, id as usize + 1)? + id as usize * t.words;
        self.arena[at..at + t.key].copy_from_slice(key);
        self.arena[at + t.key..at + t.words].fill(0);
        self.arena[t.at + 1] = id + 1;
        self.arena[index + slot] = entry(id, h);
        if 2 * (id as usize + 1) > cap {
            // Rebuilt at twice the size from the old words alone.
            let n = 2 * cap;
            let new = self.alloc(n)?;
            for i in index..index + cap {
                let e = self.arena[i];
                if e != 0 {
                    let s = place(&self.arena[new..new + n], e);
                    self.arena[new + s] = e;
                }
            }
            self.arena[t.at + 3] = new as u64;
            self.arena[t.at + 4] = n as u64;
        }
        Ok(id)
    }

    /// The arc from `caller` at `site` to `callee` entered at `target`.
    fn arc(&mut self, caller: u64, site: u64, callee: u64, target: u64) -> Result<u64> {
        self.find_or_add(ARCS, &[caller | callee << 32, site, target])
    }

    /// Adds `ir` to block `b`'s count for `tag` in the arena.
    fn add_count(&mut self, tag: u64, b: u64, ir: u64) -> Result<()> {
        let id = self.find_or_add(COUNTS, &[tag | b << 32])?;
        let at = self.record(COUNTS, id);
        self.arena[at + 1] += ir;
        Ok(())
    }

    /// The word of function `f`'s active count.
    fn active(&mut self, f: u32) -> Result<usize> {
        let at = self.reserve_words(head::ACTIVE, head::ACTIVE_CAP, f as usize + 1)?;
        Ok(at + f as usize)
    }

    fn push(&mut self, frame: [u64; FRAME_WORDS]) -> Result<()> {
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
    fn frame_at(&self, i: usize) -> usize {
        self.arena[head::STACK] as usize + i * FRAME_WORDS
    }

    /// Pops the top frame: its arc gets the call's inclusive Ir. Popping
    /// the frames of code a handler interrupted ends the handler (it was
    /// left by `longjmp`).
    fn pop(&mut self) {
        while self.arena[head::SIGNALS_LEN] > 0 && self.bottom() >= self.arena[head::DEPTH] as usize
        {
            self.end_signal(false);
        }
        let Some(top) = (self.arena[head::DEPTH] as usize).checked_sub(1) else {
            return;
        };
        let at = self.frame_at(top);
        let mut frame = [0; FRAME_WORDS];
        frame.copy_from_slice(&self.arena[at..at + FRAME_WORDS]);
        self.arena[head::DEPTH] = top as u64;
        let [_, _, caller_f, arc, enter_ir, ns_ctx, ns_site, _] = frame;
        if arc != NONE {
            let a = self.record(ARCS, arc);
            self.arena[a + 4] += hot::running_ir(self.hot) - enter_ir;
            let f = (caller_f >> 32) as usize;
            let active = self.arena[head::ACTIVE] as usize + f;
            self.arena[active] = self.arena[active].saturating_sub(1);
        }
        self.arena[head::CTX] = caller_f & 0xffff_ffff;
        self.arena[head::NS_CTX] = ns_ctx;
        self.arena[head::NS_SITE] = ns_site;
    }

    /// A return with no frame (Callgrind's `handleUnderflow`): the
    /// function returned to becomes a root, with an arc to the returning
    /// context carrying the thread's Ir so far.
    fn underflow(&mut self, x: Option<&Flow>, y: &Flow, arc: bool) -> Result<()> {
        let returning = self.arena[head::CTX];
        if returning != NO_TAG {
            let (f, _) = context_of_tag(returning, self.separate_recs);
            let a = self.active(f)?;
            self.arena[a] = self.arena[a].saturating_sub(1);
        }
        let a = self.active(y.function)?;
        let mut active = self.arena[a] as u32;
        let level = callrules::level(&mut active, false, self.separate_recs);
        self.arena[a] = u64::from(active);
        let root = context_tag(y.function, level, self.separate_recs);
        if returning != NO_TAG && arc {
            let target = x.map_or(y.start, |x| x.start);
            let id = self.arc(root, y.start.wrapping_sub(1), returning, target)?;
            let at = self.record(ARCS, id);
            self.arena[at + 3] += 1;
            self.arena[at + 4] += hot::running_ir(self.hot);
        }
        self.arena[head::CTX] = root;
        self.arena[head::NS_CTX] = NO_TAG;
        Ok(())
    }
}

/// The rules' view of the runtime's stack.
struct Keeper<'r, 'a> {
    rt: &'r mut Tagged<'a>,
    /// The first error of an underflow (the rules cannot return one).
    err: Option<Error>,
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
        Some(self.rt.arena[self.rt.record(ARCS, arc) + 1])
    }

    fn pop(&mut self) {
        self.rt.pop();
    }

    fn underflow(&mut self, from: Option<&Flow>, to: &Flow, arc: bool) {
        if let Err(e) = self.rt.underflow(from, to, arc) {
            self.err.get_or_insert(e);
        }
    }
}

/// A thread's tagged counts as the client left them, for the tool's
/// fold (after [`Tagged::finish`]).
pub struct TaggedArena<'a> {
    words: &'a [u64],
}

/// An arc of a thread's tagged counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TaggedArc {
    /// The caller's tag (a context's or a skip record's caller's).
    pub caller: u64,
    /// The call site.
    pub site: u64,
    /// The callee's tag.
    pub callee: u64,
    /// The address the callee was entered at.
    pub target: u64,
    /// Calls.
    pub calls: u64,
    /// Inclusive Ir.
    pub inclusive: u64,
}

impl<'a> TaggedArena<'a> {
    /// The arena in `words` (its used words).
    pub fn new(words: &'a [u64]) -> TaggedArena<'a> {
        TaggedArena { words }
    }

    fn records(&self, t: Table) -> impl Iterator<Item = &'a [u64]> + 'a {
        let w = self.words;
        let (at, n) = if w.get(head::USED).copied().unwrap_or(0) == 0 {
            (0, 0)
        } else {
            (w[t.at] as usize, w[t.at + 1] as usize)
        };
        (0..n).map(move |i| &w[at + i * t.words..][..t.words])
    }

    /// The arcs.
    pub fn arcs(&self) -> impl Iterator<Item = TaggedArc> + 'a {
        self.records(ARCS).map(|r| TaggedArc {
            caller: r[0] & 0xffff_ffff,
            callee: r[0] >> 32,
            site: r[1],
            target: r[2],
            calls: r[3],
            inclusive: r[4],
        })
    }

    /// Skip record `i`'s (caller's tag, call site).
    pub fn skip_record(&self, i: u64) -> Option<(u64, u64)> {
        let r = self.records(SKIPS).nth(i as usize)?;
        Some((r[0], r[1]))
    }

    /// The skip records: (caller's tag, call site, the Ir its skipped
    /// code's blocks counted there rather than in their slots).
    pub fn skip_records(&self) -> impl Iterator<Item = (u64, u64, u64)> + 'a {
        self.records(SKIPS).map(|r| (r[0], r[1], r[SKIP_IR]))
    }

    /// The counts moved out of slots: (tag, block, Ir).
    pub fn counts(&self) -> impl Iterator<Item = (u64, u64, u64)> + 'a {
        self.records(COUNTS)
            .map(|r| (r[0] & 0xffff_ffff, r[0] >> 32, r[1]))
    }

    /// The tag each sink's counts are charged to, by sink number.
    pub fn sink_adopters(&self) -> impl Iterator<Item = u64> + 'a {
        self.records(SINKS).map(|r| r[0])
    }

    /// Context entries, slots retagged, and calls and returns done
    /// inline.
    pub fn entries(&self) -> (u64, u64, u64) {
        match self.words.get(head::USED) {
            Some(&u) if u != 0 => (
                self.words[head::ENTRIES],
                self.words[head::RETAGS],
                self.words[head::INLINE],
            ),
            _ => (0, 0, 0),
        }
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use std::vec;
    use std::vec::Vec;

    /// A client: blocks described by their facts, run as translated code
    /// runs them (context entries through the runtime, counts in slots).
    struct Client {
        hot: Vec<u64>,
        arena: Vec<u64>,
        slots: Vec<u64>,
        memos: Vec<u64>,
        facts: Vec<u64>,
    }

    impl Client {
        fn new() -> Client {
            Client {
                hot: fresh_thread(0, 1 << 20).to_vec(),
                arena: vec![0; 1 << 20],
                slots: vec![0; 64 * SLOT_WORDS],
                memos: vec![0; 64 * MEMO_WORDS],
                facts: Vec::new(),
            }
        }

        fn block(&mut self, id: usize, f: u32, start: u64, exit: Exit, entry: bool) -> Facts {
            let mut flow = Flow::new(start, start + 8, start + 10, exit);
            (flow.function, flow.entry) = (f, entry);
            let facts = Facts {
                flow,
                group: f,
                index: 0,
                instrs: 3,
                sp_known: matches!(exit, Exit::Call | Exit::Return),
                memo: false,
            };
            self.set(id, facts);
            facts
        }

        fn set(&mut self, id: usize, facts: Facts) {
            if self.facts.len() < (id + 1) * FACT_WORDS {
                self.facts.resize((id + 1) * FACT_WORDS, 0);
            }
            self.facts[id * FACT_WORDS..][..FACT_WORDS].copy_from_slice(&facts.pack());
        }

        fn rt(&mut self) -> Tagged<'_> {
            Tagged {
                hot: &mut self.hot,
                arena: &mut self.arena,
                slots: &mut self.slots,
                memos: &mut self.memos,
                facts: &self.facts,
                separate_recs: 2,
            }
        }

        /// Block `y` runs, entered through its context entry if `context`.
        fn run(&mut self, y: u64, context: bool, sp: u64) {
            if context {
                self.rt().enter(y, sp).expect("room");
            }
            let f = Facts::unpack(&self.facts[y as usize * FACT_WORDS..][..FACT_WORDS]).unwrap();
            self.rt()
                .count_in_slot(y, u64::from(f.instrs))
                .expect("room");
            self.hot[hot::ir_word(y as u32)] += u64::from(f.instrs);
            self.hot[hot::LAST] = y;
        }

        /// (tag, block, Ir) of every count, slots and arena together.
        fn counts(&mut self) -> Vec<(u64, u64, u64)> {
            self.rt().finish();
            let mut all: Vec<_> = TaggedArena::new(&self.arena).counts().collect();
            all.extend(slot_counts(&self.slots));
            all.sort();
            all
        }
    }

    #[test]
    fn tags_name_a_function_and_level() {
        for recs in [0, 1, 2, 5] {
            for (f, l) in [(0, 1), (7, 1), (7, recs.max(1)), (123_456, 1)] {
                let t = context_tag(f, l, recs);
                assert!((1..SKIP_TAGS).contains(&t));
                assert_eq!(context_of_tag(t, recs), (f, l));
            }
        }
    }

    #[test]
    fn recursion_counts_each_level_apart_and_arcs_carry_inclusive_costs() {
        let mut c = Client::new();
        // main (f0, block 0) calls f1 (block 1, jumping to block 5), whose
        // block 5 calls f1 again; there block 1 jumps to block 2, which
        // returns to block 6 (after block 5's call), which jumps to block
        // 2 again, returning to main's block 3.
        c.block(0, 0, 0x1000, Exit::Call, true);
        c.block(1, 1, 0x2000, Exit::Jump, true);
        c.block(5, 1, 0x2010, Exit::Call, false);
        c.block(6, 1, 0x201a, Exit::Jump, false);
        c.block(2, 1, 0x2030, Exit::Return, false);
        c.block(3, 0, 0x100a, Exit::Jump, false);
        c.run(0, true, 0x8000);
        c.run(1, true, 0x7ff8);
        c.run(5, false, 0x7ff8);
        c.run(1, true, 0x7ff0);
        c.run(2, false, 0x7ff0);
        c.run(6, true, 0x7ff8);
        c.run(2, false, 0x7ff8);
        c.run(3, true, 0x8000);
        let (f0, f1, f1b) = (
            context_tag(0, 1, 2),
            context_tag(1, 1, 2),
            context_tag(1, 2, 2),
        );
        assert_eq!(
            c.counts(),
            [
                (f0, 0, 3),
                (f0, 3, 3),
                (f1, 1, 3),
                (f1, 2, 3),
                (f1, 5, 3),
                (f1, 6, 3),
                (f1b, 1, 3),
                (f1b, 2, 3)
            ]
        );
        let arcs: Vec<_> = TaggedArena::new(&c.arena)
            .arcs()
            .map(|a| (a.caller, a.callee, a.calls, a.inclusive))
            .collect();
        assert_eq!(arcs, [(f0, f1, 1, 18), (f1, f1b, 1, 6)]);
        // Each block's first run tags its slot (six), and the two run at
        // both levels moved their first level's counts out once each.
        assert_eq!(TaggedArena::new(&c.arena).entries(), (5, 6 + 2, 0));
    }

    #[test]
    fn skipped_code_counts_for_its_call_site_and_the_first_blocks_for_the_first_context() {
        let mut c = Client::new();
        // Block 4 (f0) runs before any entry; block 0 calls a PLT stub
        // (f2, skipped, another domain) that jumps into f3.
        c.block(4, 0, 0x0f00, Exit::Jump, false);
        c.block(0, 0, 0x1000, Exit::Call, false);
        let mut plt = c.block(1, 2, 0x3000, Exit::Jump, true);
        (plt.flow.skip, plt.flow.domain) = (true, 1);
        c.set(1, plt);
        c.block(2, 3, 0x4000, Exit::Return, true);
        c.block(3, 0, 0x100a, Exit::Jump, false);
        c.run(4, false, 0x8000);
        c.run(0, true, 0x8000);
        c.run(1, true, 0x7ff8);
        c.run(2, true, 0x7ff8);
        c.run(3, true, 0x8000);
        let (f0, f3) = (context_tag(0, 1, 2), context_tag(3, 1, 2));
        let counts = c.counts();
        let a = TaggedArena::new(&c.arena);
        assert_eq!(a.sink_adopters().collect::<Vec<_>>(), [f0]);
        assert_eq!(a.skip_record(0), Some((f0, 0x1008)));
        assert_eq!(
            counts,
            [
                (f0, 0, 3),
                (f0, 3, 3),
                (f3, 2, 3),
                (SKIP_TAGS, 1, 3),
                (SINK_TAGS, 4, 3)
            ]
        );
        let arcs: Vec<_> = a.arcs().map(|a| (a.caller, a.site, a.callee)).collect();
        assert_eq!(
            arcs,
            [(f0, 0x1008, f3)],
            "the call from the PLT is the call site's"
        );
    }

    #[test]
    fn a_continued_thread_charges_its_first_blocks_to_the_old_context() {
        let mut c = Client::new();
        c.block(0, 0, 0x1000, Exit::Call, true);
        c.block(1, 1, 0x2000, Exit::Jump, true);
        c.block(2, 2, 0x3000, Exit::Call, false);
        c.run(0, true, 0x8000);
        c.run(1, true, 0x7ff8);
        let old: [u64; hot::WORDS] = c.hot[..].try_into().unwrap();
        let (writes, hot) = continued_thread(&old, &c.arena[..head::WORDS]);
        for (i, v) in writes {
            c.arena[i] = v;
        }
        c.hot.copy_from_slice(&hot);
        c.run(2, false, 0x7f00);
        c.run(1, true, 0x7ef8);
        let counts = c.counts();
        let a = TaggedArena::new(&c.arena);
        let f1 = context_tag(1, 1, 2);
        assert_eq!(
            a.sink_adopters().collect::<Vec<_>>(),
            [NO_TAG, f1],
            "the first thread's first entry had no block left"
        );
        assert!(counts.contains(&(SINK_TAGS + 1, 2, 3)));
        assert!(counts.contains(&(context_tag(1, 2, 2), 1, 3)));
    }
}
