//! Tagged counting's inline calls and returns (`ctxrt::tagged`): the
//! commonest transitions done by the block that leaves, over the
//! runtime's own words, word for word as `Tagged::inline_call` and
//! `Tagged::inline_return` (the property test's model) do them. Any check
//! that fails changes nothing and goes on to the target's context entry,
//! where the runtime decides.
//!
//! The thread's arena lies at a fixed offset of its thread area
//! ([`layout::AREA_TAGGED_ARENA`]) and its slots before it, so every word
//! is GS-relative: no pointer is loaded. The client's flags are kept in AX
//! and its registers in spill slots meanwhile. A signal that arrives
//! inside one of these sequences waits until the thread steps out of it
//! (the sequences are registered as quiet ranges, `Space::quiet`): a
//! handler must not see a frame half pushed.

use super::{gs, Emitter, Label};
use crate::layout::{self, AREA_SLOTS, AREA_TAGGED_ARENA};
use ctxrt::hot;
use ctxrt::tagged::{head, FRAME_WORDS, SLOT_MEMO, SLOT_WORDS};
use iced_x86::{Code, Instruction, MemoryOperand, Register};
use Register::{ECX, R10, R11, RAX, RCX, RDX, RSP};

const JB: u8 = 2;
const JAE: u8 = 3;
const JE: u8 = 4;
const JNE: u8 = 5;
const JBE: u8 = 6;

/// Words of an arc record (`ctxrt::tagged`): key (3), calls, inclusive.
const ARC_WORDS: i32 = 5;
const ARC_CALLS: i32 = 8 * 3;
const ARC_INCLUSIVE: i32 = 8 * 4;
const FRAME_BYTES: i32 = 8 * FRAME_WORDS as i32;

/// `gs:[arena word i]`.
fn arena(i: usize) -> MemoryOperand {
    gs(AREA_TAGGED_ARENA as u32 + 8 * i as u32)
}

/// `gs:[AREA_TAGGED_ARENA + index*8 + disp]`: a word of the arena at the
/// word offset in `index`, plus `disp` bytes.
fn arena_at(index: Register, disp: i32) -> MemoryOperand {
    MemoryOperand::new(
        Register::None,
        index,
        8,
        i64::from(AREA_TAGGED_ARENA as i32 + disp),
        4,
        false,
        Register::GS,
    )
}

/// `gs:[hot word i]`.
fn hot_word(i: usize) -> MemoryOperand {
    gs(layout::S_CONTEXT_HOT + 8 * i as u32)
}

/// `gs:[word k of block id's slot]`.
fn slot(id: u32, k: usize) -> MemoryOperand {
    gs(AREA_SLOTS as u32 + 8 * (SLOT_WORDS as u32 * id + k as u32))
}

macro_rules! op {
    ($e:expr, $code:ident, $a:expr, $b:expr) => {
        $e.insn(Instruction::with2(Code::$code, $a, $b))
    };
    ($e:expr, $code:ident, $a:expr) => {
        $e.insn(Instruction::with1(Code::$code, $a))
    };
}

/// Registers a sequence keeps in spill slots (RAX holds the flags).
const KEPT: [(Register, u32); 5] = [
    (RAX, layout::S_TAGGED_RAX),
    (RCX, layout::S_TAGGED_RCX),
    (RDX, layout::S_TAGGED_RDX),
    (R10, layout::S_TAGGED_R10),
    (R11, layout::S_TAGGED_R11),
];

/// What an inline call needs to know of its callee, known at translation.
#[derive(Debug, Clone, Copy)]
pub struct TaggedCall {
    /// The calling block's id (its slot holds the call memo).
    pub block: u32,
    /// The callee's function (the classifier's number).
    pub function: u32,
    /// Where the call returns to.
    pub ret_addr: u64,
    /// `--separate-recs` (0 counts as 1).
    pub recs: u32,
}

impl Emitter {
    /// `r` = the running Ir, the sum of its words (flags changed).
    fn running_ir(&mut self, r: Register) {
        op!(self, Mov_r64_rm64, r, hot_word(hot::IR));
        for w in hot::IR_MORE {
            op!(self, Add_r64_rm64, r, hot_word(w));
        }
    }

    fn keep_registers(&mut self, regs: &[(Register, u32)]) {
        for &(r, s) in regs {
            self.store_gs(r, s);
        }
        self.save_flags_to_ax();
    }

    fn restore_registers(&mut self, regs: &[(Register, u32)]) {
        self.restore_flags_from_ax();
        for &(r, s) in regs.iter().rev() {
            self.load_gs(r, s);
        }
    }

    /// An inline call (`Tagged::inline_call`), right after the `call`'s
    /// return address is pushed: it goes on at `done` (the callee's body,
    /// past its context entry) when done, else at `fail` (its context
    /// entry) with nothing changed; every register and flag as they were
    /// either way.
    pub fn tagged_call(&mut self, c: TaggedCall, done: Label, fail: Label) {
        let (failed, no_frame, level_ok) = (self.new_label(), self.new_label(), self.new_label());
        self.keep_registers(&KEPT);
        let recs = c.recs.max(1);
        let f = c.function;
        // No handler, a context, not in skipped code, room for a frame and
        // the function's active count.
        op!(self, Mov_r64_rm64, RCX, arena(head::SIGNALS_LEN));
        op!(self, Or_r64_rm64, RCX, hot_word(hot::SIGNALS));
        self.jcc_label(JNE, failed);
        op!(self, Cmp_rm64_imm8, arena(head::NS_CTX), 0);
        self.jcc_label(JNE, failed);
        op!(self, Mov_r64_rm64, RCX, arena(head::CTX));
        op!(self, Test_rm64_r64, RCX, RCX);
        self.jcc_label(JE, failed);
        op!(self, Mov_r64_rm64, RDX, arena(head::DEPTH));
        op!(self, Cmp_r64_rm64, RDX, arena(head::STACK_CAP));
        self.jcc_label(JAE, failed);
        op!(self, Cmp_rm64_imm32, arena(head::ACTIVE_CAP), f as i32);
        self.jcc_label(JBE, failed);
        // No frame the stack pointer has left.
        op!(self, Test_rm64_r64, RDX, RDX);
        self.jcc_label(JE, no_frame);
        op!(
            self,
            Lea_r64_m,
            R11,
            arena_index(RDX, -(FRAME_WORDS as i32))
        );
        op!(self, Add_r64_rm64, R11, arena(head::STACK));
        op!(self, Cmp_rm64_r64, arena_at(R11, 0), RSP);
        self.jcc_label(JB, failed);
        self.bind(no_frame);
        // R10 = the callee's tag: 1 + f*R + min(active, R-1).
        op!(self, Mov_r64_rm64, R11, arena(head::ACTIVE));
        op!(self, Mov_r64_rm64, R10, arena_at(R11, 8 * f as i32));
        op!(self, Cmp_rm64_imm32, R10, recs as i32 - 1);
        self.jcc_label(JBE, level_ok);
        op!(self, Mov_r64_imm64, R10, u64::from(recs) - 1);
        self.bind(level_ok);
        op!(
            self,
            Add_rm64_imm32,
            R10,
            (1 + u64::from(f) * u64::from(recs)) as i32
        );
        // The memo: (caller, callee) as the last call from this block.
        op!(self, Mov_r64_rm64, R11, R10);
        op!(self, Shl_rm64_imm8, R11, 32);
        op!(self, Or_r64_rm64, R11, RCX);
        op!(self, Cmp_rm64_r64, slot(c.block, SLOT_MEMO), R11);
        self.jcc_label(JNE, failed);
        // The arc's calls, the function's active count.
        op!(self, Mov_r64_rm64, R11, slot(c.block, SLOT_MEMO + 1));
        op!(self, Lea_r64_m, R11, scaled(R11, R11, 4));
        op!(self, Add_r64_rm64, R11, arena(head::ARCS));
        op!(self, Add_rm64_imm8, arena_at(R11, ARC_CALLS), 1);
        op!(self, Mov_r64_rm64, R11, arena(head::ACTIVE));
        op!(self, Add_rm64_imm8, arena_at(R11, 8 * f as i32), 1);
        // The frame, at STACK + depth*FRAME_WORDS.
        op!(self, Lea_r64_m, R11, arena_index(RDX, 0));
        op!(self, Add_r64_rm64, R11, arena(head::STACK));
        op!(self, Mov_rm64_r64, arena_at(R11, 0), RSP);
        op!(self, Mov_rm32_imm32, arena_at(R11, 8), c.ret_addr as u32);
        op!(
            self,
            Mov_rm32_imm32,
            arena_at(R11, 12),
            (c.ret_addr >> 32) as u32
        );
        op!(self, Mov_rm32_r32, arena_at(R11, 16), ECX);
        op!(self, Mov_rm32_imm32, arena_at(R11, 20), f);
        op!(self, Mov_r64_rm64, RDX, slot(c.block, SLOT_MEMO + 1));
        op!(self, Mov_rm64_r64, arena_at(R11, 24), RDX);
        self.running_ir(RDX);
        op!(self, Mov_rm64_r64, arena_at(R11, 32), RDX);
        op!(self, Mov_rm64_imm32, arena_at(R11, 40), 0);
        op!(self, Mov_r64_rm64, RDX, arena(head::NS_SITE));
        op!(self, Mov_rm64_r64, arena_at(R11, 48), RDX);
        op!(self, Add_rm64_imm8, arena(head::DEPTH), 1);
        // Counting goes on in the callee's context.
        op!(self, Mov_rm64_r64, arena(head::CTX), R10);
        op!(self, Mov_rm64_r64, hot_word(hot::CUR), R10);
        op!(self, Mov_rm64_r64, arena(head::LAST_SP), RSP);
        op!(self, Add_rm64_imm8, arena(head::INLINE), 1);
        op!(self, Mov_rm64_imm32, hot_word(hot::LAST), -1);
        self.restore_registers(&KEPT);
        self.jmp_label(done);
        self.bind(failed);
        self.restore_registers(&KEPT);
        self.jmp_label(fail);
    }

    /// An inline jump that keeps the context (`Tagged::inline_jump`) from
    /// code of `domain`, reached from an indirect jump's lookup once it
    /// found the target's translation (as [`Emitter::tagged_return`]),
    /// whose header (`translate::tagged_header`) says what the target is.
    pub fn tagged_jump(&mut self, domain: u32) {
        let (out, no_frame) = (self.new_label(), self.new_label());
        let kept = &KEPT[2..];
        self.keep_registers(kept);
        // Not a function's start nor another domain (skipped or not).
        op!(self, Mov_r64_rm64, RCX, gs(layout::S_TARGET));
        op!(
            self,
            Mov_r32_rm32,
            ECX,
            MemoryOperand::with_base_displ(RCX, -4)
        );
        op!(self, And_rm32_imm8, ECX, !2);
        let want = crate::translate::header_word(domain, false, false);
        op!(self, Cmp_rm32_imm32, ECX, want);
        self.jcc_label(JNE, out);
        op!(self, Mov_r64_rm64, RCX, arena(head::SIGNALS_LEN));
        op!(self, Or_r64_rm64, RCX, hot_word(hot::SIGNALS));
        self.jcc_label(JNE, out);
        op!(self, Cmp_rm64_imm8, arena(head::CTX), 0);
        self.jcc_label(JE, out);
        // No frame the stack pointer has left (a `longjmp`).
        op!(self, Mov_r64_rm64, RDX, arena(head::DEPTH));
        op!(self, Test_rm64_r64, RDX, RDX);
        self.jcc_label(JE, no_frame);
        op!(
            self,
            Lea_r64_m,
            R11,
            arena_index(RDX, -(FRAME_WORDS as i32))
        );
        op!(self, Add_r64_rm64, R11, arena(head::STACK));
        op!(self, Cmp_rm64_r64, arena_at(R11, 0), RSP);
        self.jcc_label(JB, out);
        self.bind(no_frame);
        op!(self, Mov_rm64_r64, arena(head::LAST_SP), RSP);
        op!(self, Add_rm64_imm8, arena(head::INLINE), 1);
        op!(self, Mov_rm64_imm32, hot_word(hot::LAST), -1);
        op!(
            self,
            Add_rm64_imm8,
            gs(layout::S_TARGET),
            super::CONTEXT_ENTRY_BYTES as i32
        );
        self.bind(out);
        self.restore_registers(kept);
        self.load_gs(RCX, layout::S_RCX);
        self.load_gs(RAX, layout::S_RAX);
        self.insn(Instruction::with1(Code::Jmp_rm64, gs(layout::S_TARGET)));
    }

    /// An inline return (`Tagged::inline_return`), reached from a
    /// return's lookup once it found the target's translation (its
    /// context entry in `S_TARGET`, the client's RAX and RCX in their
    /// slots, the stack pointer past the return): when done, the target is
    /// entered past its context entry; else nothing changed and its context
    /// entry decides. Ends by jumping to `S_TARGET` with the client's
    /// registers and flags back.
    pub fn tagged_return(&mut self) {
        let (out, one) = (self.new_label(), self.new_label());
        // RAX and RCX are the lookup's (the client's are in their slots).
        let kept = &KEPT[2..];
        self.keep_registers(kept);
        op!(self, Mov_r64_rm64, RCX, arena(head::SIGNALS_LEN));
        op!(self, Or_r64_rm64, RCX, hot_word(hot::SIGNALS));
        self.jcc_label(JNE, out);
        op!(self, Mov_r64_rm64, RDX, arena(head::DEPTH));
        op!(self, Test_rm64_r64, RDX, RDX);
        self.jcc_label(JE, out);
        // R11 = the top frame's word offset.
        op!(
            self,
            Lea_r64_m,
            R11,
            arena_index(RDX, -(FRAME_WORDS as i32))
        );
        op!(self, Add_r64_rm64, R11, arena(head::STACK));
        // It is left (its stack pointer below ours), the one below is not,
        // and it does not return into skipped code.
        op!(self, Cmp_rm64_r64, arena_at(R11, 0), RSP);
        self.jcc_label(JAE, out);
        op!(self, Cmp_rm64_imm8, RDX, 1);
        self.jcc_label(JE, one);
        op!(self, Cmp_rm64_r64, arena_at(R11, -FRAME_BYTES), RSP);
        self.jcc_label(JB, out);
        self.bind(one);
        op!(self, Cmp_rm64_imm8, arena_at(R11, 40), 0);
        self.jcc_label(JNE, out);
        // Its arc gets the call's inclusive Ir; its function is active
        // once less.
        let no_arc = self.new_label();
        op!(self, Mov_r64_rm64, RDX, arena_at(R11, 24));
        op!(self, Cmp_rm64_imm8, RDX, -1);
        self.jcc_label(JE, no_arc);
        op!(self, Lea_r64_m, RDX, scaled(RDX, RDX, 4));
        op!(self, Add_r64_rm64, RDX, arena(head::ARCS));
        self.running_ir(RCX);
        op!(self, Sub_r64_rm64, RCX, arena_at(R11, 32));
        op!(self, Add_rm64_r64, arena_at(RDX, ARC_INCLUSIVE), RCX);
        op!(self, Mov_r32_rm32, ECX, arena_at(R11, 20));
        op!(self, Add_r64_rm64, RCX, arena(head::ACTIVE));
        op!(self, Cmp_rm64_imm8, arena_at(RCX, 0), 0);
        self.jcc_label(JE, no_arc);
        op!(self, Sub_rm64_imm8, arena_at(RCX, 0), 1);
        self.bind(no_arc);
        op!(self, Mov_r32_rm32, ECX, arena_at(R11, 16));
        op!(self, Mov_rm64_r64, arena(head::CTX), RCX);
        op!(self, Mov_rm64_r64, hot_word(hot::CUR), RCX);
        op!(self, Mov_rm64_imm32, arena(head::NS_CTX), 0);
        op!(self, Mov_r64_rm64, RCX, arena_at(R11, 48));
        op!(self, Mov_rm64_r64, arena(head::NS_SITE), RCX);
        op!(self, Sub_rm64_imm8, arena(head::DEPTH), 1);
        op!(self, Mov_rm64_r64, arena(head::LAST_SP), RSP);
        op!(self, Add_rm64_imm8, arena(head::INLINE), 1);
        op!(self, Mov_rm64_imm32, hot_word(hot::LAST), -1);
        op!(
            self,
            Add_rm64_imm8,
            gs(layout::S_TARGET),
            super::CONTEXT_ENTRY_BYTES as i32
        );
        self.bind(out);
        self.restore_registers(kept);
        self.load_gs(RCX, layout::S_RCX);
        self.load_gs(RAX, layout::S_RAX);
        self.insn(Instruction::with1(Code::Jmp_rm64, gs(layout::S_TARGET)));
    }
}

/// `[index*8*FRAME_WORDS... ]`: `[index*8 + disp]` words (a depth to a
/// frame's word offset: FRAME_WORDS is 8).
fn arena_index(index: Register, disp: i32) -> MemoryOperand {
    const _: () = assert!(FRAME_WORDS == 8);
    MemoryOperand::with_index_scale_displ_size(index, 8, i64::from(disp), 4)
}

/// `[base + index*scale]`.
fn scaled(base: Register, index: Register, scale: u32) -> MemoryOperand {
    MemoryOperand::with_base_index_scale(base, index, scale)
}

// Arcs are five words: `lea r, [r + r*4]` numbers their words.
const _: () = assert!(ARC_WORDS == 5);
