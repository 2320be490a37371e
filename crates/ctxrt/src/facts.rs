//! What the runtime knows of a block: Callgrind's flow facts (`callrules::Flow`)
//! plus its number in its function and its instruction count, packed in
//! [`FACT_WORDS`] words per block id by the translator.

use callrules::{Exit, Flow, FnId};

/// Words per block in the facts table: five used, padded to a cache line
/// of its own (the engine's inline fast paths read a block's facts at
/// each entry: one line, not two where five words straddle).
pub const FACT_WORDS: usize = 8;

// Flags of a block's packed facts: bits 8-15 of word 3, above its exit
// kind and below its instruction count (the engine's inline fast paths
// test them as the byte at offset 25).
/// The first block of a function.
pub const ENTRY: u64 = 1;
/// Skipped code (the PLT, `--fn-skip`).
pub const SKIP: u64 = 2;
/// A jump out of it pops a frame (Callgrind's `pop_on_jump`).
pub const POP_ON_JUMP: u64 = 4;
/// Its function has options the tool must hear of.
pub const NOTIFY: u64 = 8;
/// The stack pointer is known when it is left.
pub const SP_KNOWN: u64 = 16;
/// A block was described here.
pub const DESCRIBED: u64 = 32;
/// Its counter is followed by its call memo ([`CALL_MEMO_WORDS`]).
pub const CALL_MEMO: u64 = 64;

/// Words after the counter of a block that may leave its context other
/// than by a return (a call, an indirect jump, a jump into another
/// function, group or object) that keep its *call memo*: the block it
/// last entered so from those counters with the node it made or counted
/// in (`crate::memo_child`), and the arc (or none), as an entry of the
/// hashed memo has them. A context's counters then hold each of its call
/// sites' last call beside the counter the block has just added to, where
/// the hashed memo's entry is a miss of its own (sqlite: a fifth of the
/// inline stub's time was the memo's compare).
pub const CALL_MEMO_WORDS: usize = 2;

/// A block's facts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Facts {
    /// Callgrind's flow facts.
    pub flow: Flow,
    /// Its counter group: the blocks of one function (by name, whatever
    /// the source file of their first instruction), whose counters a
    /// context keeps side by side.
    pub group: u32,
    /// Its number in its group (its counter's index).
    pub index: u32,
    /// Its instructions (its Ir per execution).
    pub instrs: u32,
    /// Whether the stack pointer is known when it is left (it ends in a
    /// call, return or indirect jump: where the stream path records it).
    pub sp_known: bool,
    /// Whether its counter is followed by a call memo (it ends in a call
    /// or an indirect jump: its group's numbering left
    /// [`CALL_MEMO_WORDS`] for it).
    pub memo: bool,
}

impl Facts {
    /// The last counter word the block uses (its counter's, or its call
    /// memo's last): a context's counters must have room for it.
    pub fn last_word(&self) -> u32 {
        self.index + if self.memo { CALL_MEMO_WORDS as u32 } else { 0 }
    }
}

impl Facts {
    /// The facts packed for the table.
    pub fn pack(&self) -> [u64; FACT_WORDS] {
        let f = &self.flow;
        let exit = match f.exit {
            Exit::Call => EXIT_CALL,
            Exit::Return => EXIT_RETURN,
            Exit::Jump => 2,
            Exit::FallThrough => 3,
        };
        let flags = DESCRIBED
            | if f.entry { ENTRY } else { 0 }
            | if f.skip { SKIP } else { 0 }
            | if f.pop_on_jump { POP_ON_JUMP } else { 0 }
            | if f.notify { NOTIFY } else { 0 }
            | if self.sp_known { SP_KNOWN } else { 0 }
            | if self.memo { CALL_MEMO } else { 0 };
        [
            f.start,
            u64::from(f.function) | u64::from(f.domain) << 32,
            (f.call_site() - f.start) | (f.end() - f.start) << 32,
            exit | flags << 8 | u64::from(self.instrs) << 16 | u64::from(self.index) << 32,
            u64::from(self.group) | u64::from(self.last_word()) << 32,
            0,
            0,
            0,
        ]
    }

    /// The facts of a table entry; `None` if no block was described there.
    pub fn unpack(w: &[u64]) -> Option<Facts> {
        let p = Packed::of(w)?;
        let exit = match p.exit() {
            EXIT_CALL => Exit::Call,
            EXIT_RETURN => Exit::Return,
            2 => Exit::Jump,
            _ => Exit::FallThrough,
        };
        let mut flow = Flow::new(p.start(), p.call_site(), p.end(), exit);
        flow.function = p.function();
        flow.domain = p.domain();
        flow.entry = p.has(ENTRY);
        flow.skip = p.has(SKIP);
        flow.pop_on_jump = p.has(POP_ON_JUMP);
        flow.notify = p.has(NOTIFY);
        Some(Facts {
            flow,
            group: p.group(),
            index: p.index(),
            instrs: p.instrs(),
            sp_known: p.has(SP_KNOWN),
            memo: p.has(CALL_MEMO),
        })
    }
}

/// Exit kinds as packed (the low byte of word 3).
pub const EXIT_CALL: u64 = 0;
/// A return.
pub const EXIT_RETURN: u64 = 1;

/// A block's packed facts, read in place (the runtime's fast paths read
/// only the words they need).
#[derive(Clone, Copy)]
pub(crate) struct Packed<'a>(&'a [u64]);

impl<'a> Packed<'a> {
    /// The packed facts in `w` ([`FACT_WORDS`] words), if a block was
    /// described there.
    pub(crate) fn of(w: &'a [u64]) -> Option<Packed<'a>> {
        let p = Packed(w.get(..FACT_WORDS)?);
        p.has(DESCRIBED).then_some(p)
    }
    pub(crate) fn start(&self) -> u64 {
        self.0[0]
    }
    pub(crate) fn function(&self) -> FnId {
        self.0[1] as FnId
    }
    pub(crate) fn domain(&self) -> u32 {
        (self.0[1] >> 32) as u32
    }
    pub(crate) fn call_site(&self) -> u64 {
        self.0[0] + (self.0[2] & 0xffff_ffff)
    }
    pub(crate) fn end(&self) -> u64 {
        self.0[0] + (self.0[2] >> 32)
    }
    pub(crate) fn exit(&self) -> u64 {
        self.0[3] & 0xff
    }
    pub(crate) fn has(&self, flag: u64) -> bool {
        (self.0[3] >> 8) & flag != 0
    }
    pub(crate) fn instrs(&self) -> u32 {
        ((self.0[3] >> 16) & 0xffff) as u32
    }
    pub(crate) fn index(&self) -> u32 {
        (self.0[3] >> 32) as u32
    }
    pub(crate) fn group(&self) -> u32 {
        self.0[4] as u32
    }
    /// [`Facts::last_word`].
    pub(crate) fn last_word(&self) -> u32 {
        (self.0[4] >> 32) as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn facts_round_trip() {
        let mut flow = Flow::new(0x40_1000, 0x40_1010, 0x40_1015, Exit::Call);
        (flow.function, flow.domain, flow.entry, flow.skip) = (7, 3, true, true);
        let f = Facts {
            flow,
            group: 3,
            index: 12,
            instrs: 9,
            sp_known: true,
            memo: true,
        };
        let back = Facts::unpack(&f.pack()).expect("described");
        assert_eq!(back.pack(), f.pack());
        assert_eq!(back.last_word(), 12 + CALL_MEMO_WORDS as u32);
        assert_eq!(back.flow.call_site(), 0x40_1010);
        assert_eq!(back.flow.end(), 0x40_1015);
        assert_eq!((back.index, back.instrs, back.flow.function), (12, 9, 7));
        assert!(Facts::unpack(&[0; FACT_WORDS]).is_none());
    }
}
