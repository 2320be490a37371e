//! The instructions of trace mode: translated code writes one record per
//! block execution into its thread's trace buffer (see `layout`): the
//! block's id, then one word per data access (its address, computed with a
//! `lea` just before the instruction makes it) or per register a rep string
//! instruction leaves behind.
//!
//! A block borrows two registers it does not use at all (`r`, the record's
//! address, and `a`, for addresses), saved in spill slots on entry and
//! restored before its last instruction; the flags are never touched except
//! by the buffer check, which goes where the block's own code kills them
//! (or keeps them with `lahf`/`seto`).

use super::{based, gs, gs_indexed, Emitter, Label};
use crate::layout;
use events::BranchWords;
use iced_x86::{Code, Instruction, MemoryOperand, Register};

/// Condition code of `jne`.
const JNE: u8 = 5;

/// The bit of a flush stop's `S_TARGET` that says it holds where to
/// resume (an append's own check, see `Emitter::append_via`) rather than
/// a flush site's number.
pub const FLUSH_AT: u64 = 1 << 63;

/// Where the branch stream's next (32-bit) word goes, from the buffer's
/// limit (see `Emitter::append_branch`): the word below the limit plus the
/// slack.
const TOP_BRANCH: i64 = layout::TRACE_SLACK as i64 - 4;

/// The bit that marks the id word of a (block id, kept access) pair in
/// the buffer (counted executions), so that the consumer knows a pair
/// without looking the block up: an id word is `id | COUNTED_PAIR`, below
/// 2^31 (one store of a sign-extended 32-bit immediate), which no block id
/// (below it) or marker (at the top of the 32 bits) is.
pub const COUNTED_PAIR: u64 = 1 << 30;

/// Whether `word` of a buffer is the id word of a (block id, kept access)
/// pair.
#[inline(always)]
pub fn is_counted_pair(word: u64) -> bool {
    word >> 30 == 1
}

/// What the filtered trace mode's checks need of the caches' geometry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MruGeometry {
    /// log2 of the line size.
    pub line_bits: u8,
    /// D1's sets minus one.
    pub set_mask: u32,
    /// I1's sets minus one, when fetches are checked too and executions
    /// counted.
    pub i1_set_mask: Option<u32>,
    /// The slots of the indirect-branch target table minus one, when an
    /// indirect branch that hits the thread's copy of it writes no branch
    /// word (with counted executions and branch words).
    pub btac_mask: Option<u32>,
}

/// One instruction fetch a block checks against I1's table (filtered
/// trace mode with counted executions): its place among the block's
/// fetches, its line, and whether it straddles into the next.
#[derive(Debug, Clone, Copy)]
pub struct FetchCheck {
    /// Its place in `events::fetch_starts`.
    pub fetch: u16,
    /// Its (first) line.
    pub line: u64,
    /// Whether the instruction ends in the next line.
    pub straddles: bool,
}

/// The out-of-line path of one fetch's check (see
/// [`Emitter::fetch_checks`]), emitted after the block's code.
#[derive(Debug)]
pub struct FetchPath {
    check: FetchCheck,
    /// Where it starts.
    kept: Label,
    /// Where it comes back to.
    back: Label,
}

/// The out-of-line paths of one access's check (see
/// [`Emitter::mru_check`]), emitted after the block's code.
#[derive(Debug)]
pub struct KeptPath {
    /// Where an access that straddles two lines goes (none for one byte).
    straddle: Option<Label>,
    /// Where an access to another line than its set's last goes. With
    /// `straddle_via_other_line`, a straddling access comes there too.
    other_line: Label,
    /// Whether the inline check tells no straddle apart (see
    /// [`Emitter::mru_check`]).
    straddle_via_other_line: bool,
    /// Where both come back to.
    back: Label,
    /// The access's operand among the block's.
    operand: u16,
}

impl KeptPath {
    /// Whether the access may straddle two lines (it is longer than a
    /// byte): then it needs its block's straddle routine.
    pub fn may_straddle(&self) -> bool {
        self.straddle.is_some()
    }
}

/// The table entry of the set whose number is in `set`.
fn mru_slot(set: Register) -> MemoryOperand {
    gs_indexed(set, layout::AREA_MRU as u32)
}

/// The I1 table's entry of set `set`.
fn i1_slot(set: u32) -> MemoryOperand {
    gs(layout::AREA_I1_MRU as u32 + set * 8)
}

/// How the buffer check keeps the client's flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlagsAt {
    /// They are dead where the check goes: a plain `cmp`.
    Dead,
    /// They are live: saved in AH/AL around the check; the register says
    /// where RAX's value goes meanwhile (`None`: RAX is borrowed by the
    /// block and holds nothing yet).
    Live(Option<u32>),
}

/// How a filtered block writes what its checks keep.
#[derive(Debug, Clone, Copy)]
pub enum KeptForm {
    /// `events::KeptAccess` words after the block's id in its record
    /// (executions reported).
    Record,
    /// (block id, `events::KeptAccess` word) pairs (executions counted):
    /// the block's id.
    Pair(u32),
    /// One `events::SiteWords` word each (executions counted): the words'
    /// layout, the block's first site (its operands' sites come first) and
    /// its number of operands (its fetches' sites follow them).
    Sites {
        words: events::SiteWords,
        first: u32,
        operands: u32,
    },
}

/// How a conditional branch's outcome is found for its branch word.
#[derive(Debug, Clone, Copy)]
pub enum Taken<'a> {
    /// By its condition code (0-15, as in `jcc`), from the flags.
    Flags(u8),
    /// Always taken: it goes to the next instruction either way (counted
    /// as taken, as when the next block tells).
    Always,
    /// By running the guest's own short branch (`jrcxz`, `jecxz`, `loop`,
    /// `loope`, `loopne`; these bytes: its prefixes and opcode, without
    /// the rel8) on a copy of RCX.
    Guest(&'a [u8]),
}

/// `setcc r/m8` for condition code `cc`.
fn setcc(cc: u8) -> Code {
    const SETCC: [Code; 16] = [
        Code::Seto_rm8,
        Code::Setno_rm8,
        Code::Setb_rm8,
        Code::Setae_rm8,
        Code::Sete_rm8,
        Code::Setne_rm8,
        Code::Setbe_rm8,
        Code::Seta_rm8,
        Code::Sets_rm8,
        Code::Setns_rm8,
        Code::Setp_rm8,
        Code::Setnp_rm8,
        Code::Setl_rm8,
        Code::Setge_rm8,
        Code::Setle_rm8,
        Code::Setg_rm8,
    ];
    SETCC[usize::from(cc & 15)]
}

impl KeptForm {
    /// The id a kept access's pair starts with, if pairs.
    fn pair_id(self) -> Option<u32> {
        match self {
            KeptForm::Pair(id) => Some(id),
            _ => None,
        }
    }
}

impl Emitter {
    /// Block entry in trace mode: borrows `r` (and `a`), reserves `words`
    /// 8-byte words in the buffer and writes the block's `id` in the first.
    /// `r` then holds the record's address. Returns where the record is
    /// reserved (past the write pointer's store).
    pub fn trace_enter(&mut self, r: Register, a: Option<Register>, id: u32, words: u32) -> u64 {
        self.store_gs(r, layout::S_BORROW_R);
        if let Some(a) = a {
            self.store_gs(a, layout::S_BORROW_A);
        }
        // From the load of the write pointer to its store, a signal
        // handler's records would be written over: an interrupted entry
        // runs again from the load (see `Emitter::counter_updates`).
        let load = self.here();
        self.load_gs(r, layout::S_TRACE_PTR);
        self.insn(Instruction::with2(
            Code::Mov_rm64_imm32,
            MemoryOperand::with_base(r),
            id,
        ));
        let size = (words * 8) as i32;
        let reserved = match a {
            Some(a) => {
                self.lea(a, based(r, size));
                self.store_gs(a, layout::S_TRACE_PTR);
                self.here()
            }
            None => {
                self.lea(r, based(r, size));
                self.store_gs(r, layout::S_TRACE_PTR);
                let reserved = self.here();
                self.lea(r, based(r, -size));
                reserved
            }
        };
        self.counter_updates.push((load, reserved));
        reserved
    }

    /// Block entry in filtered trace mode with counted executions: borrows
    /// `r` and `a` (nothing is written: each kept access goes with the
    /// block's id).
    pub fn counted_enter(&mut self, r: Register, a: Register) {
        self.store_gs(r, layout::S_BORROW_R);
        self.store_gs(a, layout::S_BORROW_A);
    }

    /// `add qword gs:[counter], 1` (clobbers the flags): one execution of a
    /// block whose executions are counted, not reported.
    pub fn count_execution(&mut self, counter: u32) {
        self.insn(Instruction::with2(Code::Add_rm64_imm8, gs(counter), 1i32));
    }

    /// Keeps the client's live status flags in AH/AL (`lahf`, `seto`),
    /// RAX in its slot, while the code up to [`Emitter::give_back_flags`]
    /// clobbers them (filtered trace mode borrows no RAX). Much cheaper
    /// than `pushfq`/`popfq`, which half the checks of a python run need.
    pub fn keep_flags(&mut self) {
        self.store_gs(Register::RAX, layout::S_KEEP_RAX);
        self.save_flags_to_ax();
    }

    /// Restores the flags and RAX [`Emitter::keep_flags`] kept.
    pub fn give_back_flags(&mut self) {
        self.restore_flags_from_ax();
        self.load_gs(Register::RAX, layout::S_KEEP_RAX);
    }

    /// The I1 check of a fetch (flags clobbered, `r` clobbered), before
    /// its instruction: a fetch in a line (or two) that is not the line
    /// its set fetched last goes to its out-of-line path
    /// ([`Emitter::fetch_paths`]), which keeps it.
    pub fn fetch_check(&mut self, r: Register, check: FetchCheck, i1_set_mask: u32) -> FetchPath {
        let path = FetchPath {
            check,
            kept: self.new_label(),
            back: self.new_label(),
        };
        // A fetch straddling two lines that are both their sets' last
        // changes nothing either (they are in two sets, unless I1 has one
        // set, where the two compares cannot both succeed).
        let lines = check.line..=check.line + u64::from(check.straddles);
        for line in lines {
            let set = (line & u64::from(i1_set_mask)) as u32;
            self.insn(Instruction::with2(Code::Mov_r64_imm64, r, line));
            self.insn(Instruction::with2(Code::Cmp_rm64_r64, i1_slot(set), r));
            self.jcc_label(JNE, path.kept);
        }
        self.bind(path.back);
        path
    }

    /// Makes `line` the line I1's table has for its set (`r` clobbered,
    /// flags untouched): after a rep string block, whose fetches only the
    /// tool sees.
    pub fn i1_mark(&mut self, r: Register, line: u64, i1_set_mask: u32) {
        let set = (line & u64::from(i1_set_mask)) as u32;
        self.insn(Instruction::with2(Code::Mov_r64_imm64, r, line));
        self.insn(Instruction::with2(Code::Mov_rm64_r64, i1_slot(set), r));
    }

    /// The out-of-line path of a fetch check (`r` holding its line unless
    /// it straddles): its line (or both) become their sets' last, and it
    /// is kept by its line, in `form` (counted executions: a pair or a
    /// site word).
    pub fn fetch_paths(
        &mut self,
        a: Register,
        r: Register,
        paths: &[FetchPath],
        d1: MruGeometry,
        form: KeptForm,
    ) {
        let Some(i1_set_mask) = d1.i1_set_mask.map(u64::from) else {
            debug_assert!(paths.is_empty(), "fetches are checked");
            return;
        };
        for path in paths {
            let line = path.check.line;
            self.bind(path.kept);
            let lines = if path.check.straddles { 2 } else { 1 };
            for l in line..line + lines {
                if path.check.straddles {
                    self.insn(Instruction::with2(Code::Mov_r64_imm64, r, l));
                }
                self.insn(Instruction::with2(
                    Code::Mov_rm64_r64,
                    i1_slot((l & i1_set_mask) as u32),
                    r,
                ));
            }
            if let KeptForm::Sites {
                words,
                first,
                operands,
            } = form
            {
                let site = first + operands + u32::from(path.check.fetch);
                let word = words.word(site, true, path.check.straddles, line);
                self.insn(Instruction::with2(Code::Mov_r64_imm64, r, word));
                self.append_word(a, r);
            } else {
                self.insn(Instruction::with2(
                    Code::Mov_r64_imm64,
                    r,
                    line << d1.line_bits,
                ));
                let mut tag = events::KeptAccess::FETCH | (path.check.fetch + 1);
                if path.check.straddles {
                    tag |= events::KeptAccess::STRADDLES;
                }
                self.append_kept(a, r, tag, form.pair_id());
            }
            self.jmp_label(path.back);
        }
    }

    /// The D1 check of one data access whose address is in `a` (filtered
    /// trace mode): the access is left out when it lies in one line that
    /// is the line its set referenced last (the thread's table at
    /// [`layout::AREA_MRU`]), and otherwise goes to the out-of-line path
    /// [`Emitter::kept_paths`] emits, which keeps it. `size` is the
    /// access's bytes (at most a line); `flags_live` keeps the client's
    /// flags around the check ([`Emitter::keep_flags`]). `r` and `a` (not
    /// RAX) are clobbered.
    pub fn mru_check(
        &mut self,
        a: Register,
        r: Register,
        size: u32,
        operand: u16,
        d1: MruGeometry,
        flags_live: bool,
    ) -> KeptPath {
        let path = KeptPath {
            straddle: (size > 1).then(|| self.new_label()),
            other_line: self.new_label(),
            back: self.new_label(),
            operand,
            straddle_via_other_line: size > 1 && d1.set_mask != 0,
        };
        if flags_live {
            self.keep_flags();
        }
        let line_bits = u32::from(d1.line_bits);
        // `a` becomes the first byte's line, `r` its set (or the last
        // byte's), as the out-of-line paths expect them.
        if path.straddle_via_other_line {
            // The first byte's line against the table's entry for the
            // last byte's set: a straddling access's two lines are in two
            // sets, and an entry holds a line of its own set (or 0, a cold
            // set's, which no mapped address is in), so it fails there
            // too, and its out-of-line path tells the two apart. Two
            // instructions fewer on the common path than checking for a
            // straddle first.
            self.lea(r, based(a, size as i32 - 1));
            self.insn(Instruction::with2(Code::Shr_rm64_imm8, a, line_bits));
            self.insn(Instruction::with2(Code::Shr_rm64_imm8, r, line_bits));
        } else if let Some(straddle) = path.straddle {
            // The last byte's line: another one?
            self.lea(r, based(a, size as i32 - 1));
            self.insn(Instruction::with2(Code::Shr_rm64_imm8, r, line_bits));
            self.insn(Instruction::with2(Code::Shr_rm64_imm8, a, line_bits));
            self.insn(Instruction::with2(Code::Cmp_r64_rm64, a, r));
            self.jcc_label(JNE, straddle);
        } else {
            self.insn(Instruction::with2(Code::Shr_rm64_imm8, a, line_bits));
            self.mov(r, a);
        }
        self.and_mask(r, d1.set_mask);
        self.insn(Instruction::with2(Code::Cmp_rm64_r64, mru_slot(r), a));
        self.jcc_label(JNE, path.other_line);
        self.bind(path.back);
        if flags_live {
            self.give_back_flags();
        }
        path
    }

    /// The out-of-line paths of a [`mru_check`](Self::mru_check), after the
    /// block: an access in another line than its set's last (`a` the line,
    /// `r` the set) becomes its set's last and is kept by its line's
    /// start; one that straddles two lines (`a` its first line) goes to the
    /// block's [`straddle_routine`](Self::straddle_routine) with its tag
    /// and where to come back. Each is written in `form`.
    pub fn kept_paths(
        &mut self,
        a: Register,
        r: Register,
        path: &KeptPath,
        d1: MruGeometry,
        form: KeptForm,
        straddle_routine: Label,
    ) {
        let line_bits = u32::from(d1.line_bits);
        let tag = path.operand + 1;
        let site = |straddles: bool| match form {
            KeptForm::Sites { words, first, .. } => {
                Some(words.tag(first + u32::from(path.operand), false, straddles))
            }
            _ => None,
        };
        self.bind(path.other_line);
        if let (true, Some(straddle)) = (path.straddle_via_other_line, path.straddle) {
            // `r` is the last byte's set: another set than the first
            // line's is a straddle. (`xor` twice gives `r` back.)
            self.insn(Instruction::with2(Code::Xor_r64_rm64, r, a));
            self.insn(Instruction::with2(Code::Test_rm64_imm32, r, d1.set_mask));
            self.jcc_label(JNE, straddle);
            self.insn(Instruction::with2(Code::Xor_r64_rm64, r, a));
        }
        self.insn(Instruction::with2(Code::Mov_rm64_r64, mru_slot(r), a));
        match site(false) {
            Some(word_tag) => {
                // The word: the line number with the site's bits above.
                self.insn(Instruction::with2(Code::Mov_r64_imm64, r, word_tag));
                self.insn(Instruction::with2(Code::Or_r64_rm64, a, r));
                self.append_word(r, a);
            }
            None => {
                self.insn(Instruction::with2(Code::Shl_rm64_imm8, a, line_bits));
                self.append_kept(r, a, tag, form.pair_id());
            }
        }
        self.jmp_label(path.back);
        if let Some(straddle) = path.straddle {
            // `a` the first line, `r` the next: both their sets' last
            // (two sets, unless D1 has one) is two hits that change
            // nothing; else kept.
            self.bind(straddle);
            let keep = self.new_label();
            self.mov(r, a);
            self.and_mask(r, d1.set_mask);
            self.insn(Instruction::with2(Code::Cmp_rm64_r64, mru_slot(r), a));
            self.jcc_label(JNE, keep);
            self.lea(r, based(a, 1));
            self.and_mask(r, d1.set_mask);
            self.lea(a, based(a, 1));
            self.insn(Instruction::with2(Code::Cmp_rm64_r64, mru_slot(r), a));
            self.lea(a, based(a, -1));
            self.jcc_label(JNE, keep);
            self.jmp_label(path.back);
            self.bind(keep);
            // The tag's bits as the routine shifts them into place.
            let (code, bits) = match (form, site(true)) {
                (KeptForm::Sites { words, .. }, Some(t)) => {
                    (Code::Mov_rm32_imm32, (t >> words.site_shift()) as u32)
                }
                _ => (
                    Code::Mov_rm16_imm16,
                    u32::from(tag | events::KeptAccess::STRADDLES),
                ),
            };
            self.insn(Instruction::with2(code, gs(layout::S_KEPT_TAG), bits));
            self.lea_label(r, path.back);
            self.jmp_label(straddle_routine);
        }
    }

    /// The path of a block's accesses that straddle two lines (rare; one
    /// routine per block keeps the code small): with the access's first
    /// line in `a`, its tag in a slot and where to come back in `r`, keeps
    /// it by that line's start and makes both lines their sets' last, in
    /// address order. It returns through a spill slot (an indirect jump).
    pub fn straddle_routine(
        &mut self,
        a: Register,
        r: Register,
        d1: MruGeometry,
        form: KeptForm,
        routine: Label,
    ) {
        self.bind(routine);
        self.store_gs(r, layout::S_KEPT_RET);
        self.store_gs(a, layout::S_KEPT_LINE);
        // As `append_kept`, the tag from its slot: everything it writes
        // comes from slots, so that an interrupted append runs again whole.
        // The word: a site word's tag bits above the line number; a
        // `KeptAccess` word's tag in the top 16 bits over the line's start.
        let (load_tag, shift, to_start) = match form {
            KeptForm::Sites { words, .. } => (Code::Mov_r32_rm32, words.site_shift(), 0),
            _ => {
                let line_bits = u32::from(d1.line_bits);
                (Code::Movzx_r32_rm16, 48 - line_bits, line_bits)
            }
        };
        self.append(r, |e| {
            let at = e.pair_id(r, form.pair_id());
            e.insn(Instruction::with2(
                load_tag,
                a.full_register32(),
                gs(layout::S_KEPT_TAG),
            ));
            e.insn(Instruction::with2(Code::Shl_rm64_imm8, a, shift));
            e.insn(Instruction::with2(
                Code::Or_r64_rm64,
                a,
                gs(layout::S_KEPT_LINE),
            ));
            if to_start != 0 {
                e.insn(Instruction::with2(Code::Shl_rm64_imm8, a, to_start));
            }
            e.store_at(r, at, a);
            at as i32 + 8
        });
        self.load_gs(a, layout::S_KEPT_LINE);
        for _ in 0..2 {
            self.mov(r, a);
            self.and_mask(r, d1.set_mask);
            self.insn(Instruction::with2(Code::Mov_rm64_r64, mru_slot(r), a));
            self.inc_flag_free(a);
        }
        self.insn(Instruction::with1(Code::Jmp_rm64, gs(layout::S_KEPT_RET)));
    }

    /// With `id` (counted executions), writes the id word of a (block id,
    /// kept access) pair at `ptr` ([`COUNTED_PAIR`] set) and returns the
    /// kept word's offset: 8, else 0.
    fn pair_id(&mut self, ptr: Register, id: Option<u32>) -> i64 {
        let Some(id) = id else { return 0 };
        debug_assert!(u64::from(id) < COUNTED_PAIR, "block ids stay below 2^30");
        self.insn(Instruction::with2(
            Code::Mov_rm64_imm32,
            MemoryOperand::with_base(ptr),
            (u64::from(id) | COUNTED_PAIR) as u32,
        ));
        8
    }

    /// `and r, mask` (the short form when it fits).
    fn and_mask(&mut self, r: Register, mask: u32) {
        let code = if mask < 0x80 {
            Code::And_rm64_imm8
        } else {
            Code::And_rm64_imm32
        };
        self.insn(Instruction::with2(code, r, mask));
    }

    /// Appends the kept-access word with `tag` at `addr` to the buffer
    /// (`ptr` is clobbered): the address, its top 16 bits the tag
    /// (`events::KeptAccess`); with `id` (counted executions), after the
    /// block's id, so that each kept access names its block. An interrupted
    /// append runs again from the load of the write pointer, as a block's
    /// entry does.
    fn append_kept(&mut self, ptr: Register, addr: Register, tag: u16, id: Option<u32>) {
        self.append(ptr, |e| {
            let at = e.pair_id(ptr, id);
            e.store_at(ptr, at, addr);
            e.insn(Instruction::with2(
                Code::Mov_rm16_imm16,
                MemoryOperand::with_base_displ(ptr, at + 6),
                u32::from(tag),
            ));
            at as i32 + 8
        });
    }

    /// Appends to the buffer what `write` stores at `ptr` (the write
    /// pointer, loaded into it; clobbered), `write` returning how many
    /// bytes that is. An interrupted append runs again from the load of
    /// the write pointer (see `Emitter::counter_updates`), so `write` must
    /// store only what does not change when it runs again.
    fn append(&mut self, ptr: Register, write: impl FnOnce(&mut Emitter) -> i32) {
        self.append_via(layout::S_TRACE_PTR, 1, ptr, write);
    }

    /// The append sequence of both streams: the pointer in slot `slot`
    /// loaded into `ptr`, `write`, the pointer moved by `direction` times
    /// the bytes written, stored back; the whole marked to run again when
    /// interrupted.
    ///
    /// In a block without a buffer check on entry (`checked_appends`), an
    /// append to the records checks the buffer itself, after the load:
    /// past the limit, the flush stub gets the load's address (in
    /// `S_TARGET`, with [`FLUSH_AT`] set, which no site number has), where
    /// the thread resumes with the next buffer. Only the records' appends:
    /// blocks that write branch words keep their check on entry.
    fn append_via(
        &mut self,
        slot: u32,
        direction: i32,
        ptr: Register,
        write: impl FnOnce(&mut Emitter) -> i32,
    ) {
        let load = self.here();
        let resume = self.new_label();
        self.bind(resume);
        self.load_gs(ptr, slot);
        if let (Some(stub), layout::S_TRACE_PTR) = (self.checked_appends, slot) {
            let room = self.new_label();
            self.insn(Instruction::with2(
                Code::Cmp_r64_rm64,
                ptr,
                gs(layout::S_TRACE_LIMIT),
            ));
            self.jcc_short(2, room); // jb: below the limit
            self.lea_label(ptr, resume);
            self.insn(Instruction::with2(
                Code::Bts_rm64_imm8,
                ptr,
                FLUSH_AT.trailing_zeros(),
            ));
            self.store_gs(ptr, layout::S_TARGET);
            self.jmp(stub);
            self.bind(room);
        }
        let size = write(self);
        self.lea(ptr, based(ptr, direction * size));
        self.store_gs(ptr, slot);
        self.counter_updates.push((load, self.here()));
    }

    /// Appends to the branch stream, which fills the buffer from its end
    /// down (its lowest word's address less `TRACE_SLACK` is the limit the
    /// buffer checks compare the write pointer with, so the two streams
    /// meet only at a flush), what `write` stores below `ptr + TOP_BRANCH
    /// + 8` (`ptr` the limit, loaded into it; clobbered): the first word
    /// at `ptr + TOP_BRANCH`, the next below it. `write` returns how many
    /// bytes that is. Runs again when interrupted, as [`Emitter::append`].
    fn append_branch(&mut self, ptr: Register, write: impl FnOnce(&mut Emitter) -> i32) {
        self.append_via(layout::S_TRACE_LIMIT, -1, ptr, write);
    }

    /// `mov [ptr + disp], src`.
    fn store_at(&mut self, ptr: Register, disp: i64, src: Register) {
        self.insn(Instruction::with2(
            Code::Mov_rm64_r64,
            MemoryOperand::with_base_displ(ptr, disp),
            src,
        ));
    }

    /// Appends the word in `word` to the buffer (`ptr` is clobbered).
    fn append_word(&mut self, ptr: Register, word: Register) {
        self.append(ptr, |e| {
            e.store_at(ptr, 0, word);
            8
        });
    }

    /// Appends the branch word of the conditional branch ending block `id`
    /// (`events::BranchWords`, with the word of its id's high bits first
    /// if it has one) to the branch stream, just before that branch runs:
    /// `word` and `ptr` (borrowed) are clobbered, the flags and the
    /// client's registers are left as they are.
    pub fn cond_branch_word(&mut self, word: Register, ptr: Register, id: u32, taken: Taken) {
        let tag = BranchWords::tag(id);
        let high = BranchWords::high(id);
        // The branch's word, below the high bits' if there are some.
        let top = TOP_BRANCH - if high.is_some() { 4 } else { 0 };
        let size = TOP_BRANCH + 4 - top;
        let word32 = word.full_register32();
        if let Taken::Guest(opcode) = taken {
            // The guest's own branch (`jrcxz`, `loop`...), run on a copy
            // of RCX, tells where it will go; all before the append, which
            // an interruption may run again.
            let (taken, done) = (self.new_label(), self.new_label());
            self.insn(Instruction::with2(Code::Mov_r32_imm32, word32, tag));
            self.store_gs(Register::RCX, layout::S_RCX0);
            self.short_branch(opcode, taken);
            self.jmp_short(done);
            self.bind(taken);
            self.insn(Instruction::with2(Code::Mov_r32_imm32, word32, tag | 1));
            self.bind(done);
            self.load_gs(Register::RCX, layout::S_RCX0);
        }
        self.append_branch(ptr, |e| {
            if let Some(high) = high {
                let at = MemoryOperand::with_base_displ(ptr, TOP_BRANCH);
                e.insn(Instruction::with2(Code::Mov_rm32_imm32, at, high));
            }
            let at = MemoryOperand::with_base_displ(ptr, top);
            match taken {
                // The usual case: one store of the tag, `setcc` on its low
                // byte.
                Taken::Flags(cc) => {
                    e.insn(Instruction::with2(Code::Mov_rm32_imm32, at, tag));
                    e.insn(Instruction::with1(setcc(cc), at));
                }
                Taken::Always => {
                    e.insn(Instruction::with2(Code::Mov_rm32_imm32, at, tag | 1));
                }
                Taken::Guest(_) => {
                    e.insn(Instruction::with2(Code::Mov_rm32_r32, at, word32));
                }
            }
            size as i32
        });
    }

    /// Appends the branch word of the indirect jump or call ending block
    /// `id` and, below it, its target, in RCX (`events::BranchWords`) to
    /// the branch stream, with the client's RAX and RCX in their spill
    /// slots: RAX is used and reloaded; the flags are left as they are.
    ///
    /// With `copy` (the thread-area offset of the branch's slot in the
    /// thread's copy of the indirect-target table, `layout::AREA_BTAC`), a
    /// target equal to the copy's writes nothing: the tool's table holds
    /// it too (the tool predicts it and nothing changes). Another is
    /// written and put in the copy, inside the append, so that an
    /// interrupted append runs again whole. (A handler starts with the
    /// copy forgotten, see `Space::trace_marker`; the one window left is a
    /// handler interrupting between the comparison and its jump that
    /// changes the same slot: one misprediction the tool misses.)
    pub fn indirect_branch_word(&mut self, id: u32, copy: Option<u32>) {
        let (rax, rcx) = (Register::RAX, Register::RCX);
        let tag = BranchWords::tag(id) | BranchWords::INDIRECT;
        let high = BranchWords::high(id);
        // The branch's word, below the high bits' if there are some, and
        // the target's 8 bytes below it.
        let top = TOP_BRANCH - if high.is_some() { 4 } else { 0 };
        let same = copy.map(|slot| {
            // RCX minus the copy without touching the flags (`not`,
            // `lea`), tested by `jrcxz` with the target in RAX meanwhile.
            let same = self.new_label();
            self.load_gs(rax, slot);
            self.insn(Instruction::with1(Code::Not_rm64, rax));
            self.insn(Instruction::with2(
                Code::Lea_r64_m,
                rax,
                MemoryOperand::with_base_index_scale_displ_size(rax, rcx, 1, 1, 1),
            ));
            self.insn(Instruction::with2(Code::Xchg_rm64_r64, rcx, rax));
            self.short_branch(&[0xe3], same); // jrcxz
            self.insn(Instruction::with2(Code::Xchg_rm64_r64, rcx, rax));
            same
        });
        // The target goes in two 32-bit halves, through a spill slot free
        // in a block that ends in an indirect branch (a rep string block's):
        // one 64-bit store could be unaligned, and a client running with
        // EFLAGS.AC set faults on that. An interrupted append runs again
        // from the slot, which handlers' blocks do not change (spill slots
        // are kept around them).
        self.store_gs(rcx, layout::S_RCX0);
        self.append_branch(rax, |e| {
            if let Some(high) = high {
                let at = MemoryOperand::with_base_displ(rax, TOP_BRANCH);
                e.insn(Instruction::with2(Code::Mov_rm32_imm32, at, high));
            }
            let at = MemoryOperand::with_base_displ(rax, top);
            e.insn(Instruction::with2(Code::Mov_rm32_imm32, at, tag));
            for half in [0, 4] {
                let ecx = Register::ECX;
                let from = gs(layout::S_RCX0 + half);
                e.insn(Instruction::with2(Code::Mov_r32_rm32, ecx, from));
                let at = MemoryOperand::with_base_displ(rax, top - 8 + i64::from(half));
                e.insn(Instruction::with2(Code::Mov_rm32_r32, at, ecx));
            }
            e.load_gs(rcx, layout::S_RCX0);
            if let Some(slot) = copy {
                e.store_gs(rcx, slot);
            }
            (TOP_BRANCH + 4 - (top - 8)) as i32
        });
        if let Some(same) = same {
            let done = self.new_label();
            self.jmp_short(done);
            self.bind(same);
            self.mov(rcx, rax);
            self.bind(done);
        }
        self.load_gs(rax, layout::S_RAX);
    }

    /// The thread-area offset of the slot of the branch at `pc` in the
    /// copy of the indirect-target table with `mask + 1` slots.
    pub fn btac_slot(pc: u64, mask: u32) -> u32 {
        debug_assert!(u64::from(mask) < layout::BTAC_MAX_ENTRIES);
        layout::AREA_BTAC as u32 + (pc & u64::from(mask)) as u32 * 8
    }

    /// After a rep string instruction in filtered trace mode (whose
    /// accesses and fetches the tool simulates from its record, unseen by
    /// the tables): forgets every set's last line, so that the next access
    /// to each (and fetch) is kept. Flag-free (`loop`); RCX is kept in a spill slot meanwhile and
    /// `r` is clobbered.
    pub fn mru_forget(&mut self, r: Register, d1: MruGeometry) {
        self.store_gs(Register::RCX, layout::S_RCX0);
        self.insn(Instruction::with2(
            Code::Mov_r32_imm32,
            Register::ECX,
            d1.set_mask + 1,
        ));
        self.insn(Instruction::with2(
            Code::Mov_r32_imm32,
            r.full_register32(),
            0,
        ));
        let top = self.new_label();
        self.bind(top);
        self.insn(Instruction::with2(
            Code::Mov_rm64_r64,
            gs_indexed(Register::RCX, layout::AREA_MRU as u32 - 8),
            r,
        ));
        self.short_branch(&[0xe2], top); // loop
        self.load_gs(Register::RCX, layout::S_RCX0);
    }

    /// The buffer check: when the record at `r` starts past the buffer's
    /// limit, `site` (which tells the tool where to resume and where the
    /// record is) goes to the chunk's flush stub. Returns where the flush
    /// resumes (before the flags are restored).
    pub fn trace_check(&mut self, r: Register, site: u32, flush_stub: u64, flags: FlagsAt) -> u64 {
        if let FlagsAt::Live(stash) = flags {
            if let Some(slot) = stash {
                self.store_gs(Register::RAX, slot);
            }
            self.save_flags_to_ax();
        }
        let ok: Label = self.new_label();
        self.insn(Instruction::with2(
            Code::Cmp_r64_rm64,
            r,
            gs(layout::S_TRACE_LIMIT),
        ));
        self.jcc_short(2, ok); // jb: below the limit
        self.insn(Instruction::with2(
            Code::Mov_rm64_imm32,
            gs(layout::S_TARGET),
            site,
        ));
        self.jmp(flush_stub);
        self.bind(ok);
        let resume = self.here();
        if let FlagsAt::Live(stash) = flags {
            self.restore_flags_from_ax();
            if let Some(slot) = stash {
                self.load_gs(Register::RAX, slot);
            }
        }
        resume
    }

    /// Computes `fs_base? + base + index * scale + disp` into `a` (flag
    /// free).
    pub fn access_addr(
        &mut self,
        a: Register,
        fs: bool,
        base: Register,
        index: Register,
        scale: u32,
        disp: i64,
    ) {
        let fits = i32::try_from(disp).is_ok();
        assert!(
            fits || !fs,
            "fs-relative operands have 32-bit displacements"
        );
        let mut have = false; // whether `a` holds a partial sum
        if fs {
            self.insn(Instruction::with1(Code::Rdfsbase_r64, a));
            have = true;
        }
        if !fits {
            self.insn(Instruction::with2(Code::Mov_r64_imm64, a, disp as u64));
            have = true;
        }
        let disp = if fits { disp } else { 0 };
        let mem = |b: Register, i: Register, s: u32, d: i64| {
            // The displacement's size says the address size: 4 for 32-bit
            // registers, 8 (a 32-bit field, sign-extended) for 64-bit ones.
            let narrow = b.is_gpr32() || i.is_gpr32();
            let size = match (d, narrow) {
                (0, _) => 0,
                (_, true) => 4,
                (_, false) => 8,
            };
            MemoryOperand::new(b, i, s, d, size, false, Register::None)
        };
        if have {
            if base != Register::None || disp != 0 {
                self.lea(a, mem(a, base, 1, disp));
            }
            if index != Register::None {
                self.lea(a, mem(a, index, scale, 0));
            }
        } else if base == Register::None && index == Register::None {
            self.insn(Instruction::with2(Code::Mov_r64_imm64, a, disp as u64));
        } else {
            self.lea(a, mem(base, index, scale.max(1), disp));
        }
    }

    /// `movzx dst, src8` (xlat's AL index).
    pub fn movzx8(&mut self, dst: Register, src8: Register) {
        self.insn(Instruction::with2(
            Code::Movzx_r32_rm8,
            dst.full_register32(),
            src8,
        ));
    }

    /// `dst` = the sign-extended lane `lane` (`bytes` = 4 or 8 wide) of
    /// vector register `v`, through the thread area's vector scratch (a
    /// store of the register, which changes nothing).
    pub fn vector_lane(&mut self, dst: Register, v: Register, bytes: u8, lane: u8) {
        let scratch = gs(layout::S_VECTOR_SCRATCH);
        let store = if v.is_xmm() {
            Instruction::with2(Code::VEX_Vmovdqu_xmmm128_xmm, scratch, v)
        } else if v.is_ymm() {
            Instruction::with2(Code::VEX_Vmovdqu_ymmm256_ymm, scratch, v)
        } else {
            Instruction::with2(Code::EVEX_Vmovdqu64_zmmm512_k1z_zmm, scratch, v)
        };
        self.insn(store);
        let at = layout::S_VECTOR_SCRATCH + u32::from(bytes) * u32::from(lane);
        if bytes == 4 {
            self.insn(Instruction::with2(Code::Movsxd_r64_rm32, dst, gs(at)));
        } else {
            self.load_gs(dst, at);
        }
    }

    /// `mov [r + 8 * word], src`.
    pub fn trace_store(&mut self, r: Register, word: u32, src: Register) {
        self.store_at(r, i64::from(word * 8), src);
    }

    /// Stores the branch stream's position (the buffer's limit, see
    /// [`Emitter::append_branch`]) at `[r + 8 * word]`, through RCX, which
    /// a spill slot keeps meanwhile (flag-free): a rep string block's
    /// branches, which its record tells, go in their place among the
    /// branch words.
    pub fn trace_store_branch_position(&mut self, r: Register, word: u32) {
        self.store_gs(Register::RCX, layout::S_RCX0);
        self.load_gs(Register::RCX, layout::S_TRACE_LIMIT);
        self.store_at(r, i64::from(word * 8), Register::RCX);
        self.load_gs(Register::RCX, layout::S_RCX0);
    }

    /// `setz byte [r + 8 * word]`.
    pub fn trace_setz(&mut self, r: Register, word: u32) {
        self.insn(Instruction::with1(
            Code::Sete_rm8,
            MemoryOperand::with_base_displ(r, i64::from(word * 8)),
        ));
    }

    /// Gives the borrowed registers back (before the block's last
    /// instruction), the first time noted in [`Emitter::left_borrowed`].
    pub fn trace_leave(&mut self, r: Register, a: Option<Register>) {
        self.load_gs(r, layout::S_BORROW_R);
        if let Some(a) = a {
            self.load_gs(a, layout::S_BORROW_A);
        }
        let here = self.here();
        self.left_borrowed.get_or_insert(here);
    }

    /// The chunk's flush stub: an exit to the tool with the site in
    /// `S_TARGET` (RAX, RCX and R11 spilled as for every exit).
    pub fn flush_stub(&mut self) {
        self.exit_stub(layout::MAGIC_FLUSH);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A block numbered past 2^24 has its id's high bits in a word of
    /// their own, above its branch's word.
    #[test]
    fn a_long_block_id_writes_its_high_bits_first() {
        let id = (3 << 24) | 7;
        let mut e = Emitter::new(0x5555_0000_0000);
        e.cond_branch_word(Register::R10, Register::R11, id, Taken::Flags(5));
        let d = crate::emit::tests::disasm_at(&e.bytes, e.base);
        let high = BranchWords::high(id).expect("a high word");
        let tag = BranchWords::tag(id);
        let expect = [
            format!("mov dword ptr [r11+0FFFFCh],{high:X}h"),
            format!("mov dword ptr [r11+0FFFF8h],{tag:X}h"),
            "setne [r11+0FFFF8h]".to_string(),
            "lea r11,[r11-8]".to_string(),
        ];
        let at: Vec<Option<usize>> = expect
            .iter()
            .map(|l| d.iter().position(|x| x == l))
            .collect();
        assert!(at.iter().all(Option::is_some), "{d:#?}");
        assert!(at.windows(2).all(|w| w[0] < w[1]), "{d:#?}");
    }
}
