//! Contexts mode's inline fast paths (`docs/client-contexts.md`, step 5):
//! the commonest context entries, a return to the caller's counters and a
//! call the call memo knows, done by hand-written code in the core region
//! before the runtime stub, without its register saves and without the
//! runtime's Rust. They do exactly what `ctxrt`'s own fast paths do in
//! their case (`ctxrt::fast`: the same checks, the same words written);
//! any other entry (and any check that fails) goes on to the runtime stub
//! with every register and flag as it found them.
//!
//! * **A return** (the block left ends in `ret`) that leaves exactly the
//!   top frame, made by a real call returning to the block entered, with
//!   a resume record of the block's counter group that has room for it:
//!   the frame is popped (its arc gets the call's inclusive Ir) and
//!   counting goes on in the resume record.
//! * **A jump** that leaves no frame (an indirect jump, or a direct one
//!   into another counter group, not into a function's start nor another
//!   object) within the counters' group: the counters stay.
//! * **A call** the memo knows: a real call (the block left ends in
//!   `call`), or an emulated one (a jump into a function's start or
//!   another object: a tail call), into code that is not skipped, whose
//!   memo entry matches the counters and both blocks, with the callee's
//!   recursion level still the child's and no frame left behind by the
//!   stack pointer: a frame is pushed, the arc and the function's active
//!   count go up, and counting goes on in the child. Into skipped code
//!   (a PLT entry), the frame has no arc and counting goes on in the call
//!   site's skip node.
//!
//! Outside signal handlers only (a handler's frames and their bottom are
//! the runtime's business).

use super::cc::{JAE, JB, JBE, JE, JNE, JS};
use super::{based, based_indexed as indexed, gs, Emitter, Label};
use crate::layout;
use ctxrt::abi::{self, head};
use ctxrt::hot;
use iced_x86::{Code, Instruction, MemoryOperand, Register};
use Register::{
    EAX, EBX, ECX, EDX, R10, R10L, R11, R8, R8D, R9, R9D, RAX, RBX, RCX, RDI, RDX, RSI,
};

/// Thread-area offset of hot word `i`.
fn hot_word(i: usize) -> u32 {
    layout::S_CONTEXT_HOT + 8 * i as u32
}

/// `[base + 8*word]`: a word of an arena (its base in a register).
fn word(base: Register, word: usize) -> MemoryOperand {
    based(base, 8 * word as i32)
}

// A block's facts are a power of two of bytes (found by a shift), and
// block ids leave room for the return tag.
const _: () = assert!(crate::space::FACTS_CAPACITY <= hot::RETURN_TAG);
const _: () = assert!(ctxrt::FACT_WORDS.is_power_of_two());
/// Byte offsets in a block's packed facts (`ctxrt::Facts::pack`).
const FACT_START: i32 = 0;
const FACT_FUNCTION: i32 = 8;
const FACT_DOMAIN: i32 = 8 + 4;
const FACT_SITE: i32 = 16;
const FACT_END: i32 = 16 + 4;
const FACT_EXIT: i32 = 24;
const FACT_FLAGS: i32 = 25;
const FACT_INDEX: i32 = 24 + 4;
const FACT_GROUP: i32 = 32;
const FACT_LAST: i32 = 32 + 4;
/// Byte offsets in a frame (`ctxrt::abi::FRAME_WORDS`).
const FRAME_SP: i32 = 0;
const FRAME_RET: i32 = 8;
const FRAME_CALLER: i32 = 16;
const FRAME_FUNCTION: i32 = 20;
const FRAME_ARC: i32 = 24;
const FRAME_IR: i32 = 32;
const FRAME_NS_NODE: i32 = 40;
const FRAME_NS_SITE: i32 = 48;
const FRAME_RESUME: i32 = 8 * abi::FRAME_RESUME as i32;
const FRAME_BYTES: i32 = 8 * abi::FRAME_WORDS as i32;
/// Byte offsets in a node record (`ctxrt::NodeRecord`), and of its
/// counters.
const NODE_PARENT: i32 = 0;
const NODE_LEVEL: i32 = 8;
const NODE_KIND: i32 = 8 + 4;
const NODE_GROUP: i32 = 24;
const NODE_ID: i32 = 8 * abi::ID as i32;
const NODE_ROOM: i32 = 8 * (abi::NODE_HEADER as i32 - 1);
const NODE_COUNTERS: i32 = 8 * abi::NODE_HEADER as i32;
/// Byte offsets in an arc.
const ARC_CALLS: i32 = 24;
const ARC_INCLUSIVE: i32 = 32;

/// Registers the fast paths use, pushed after RAX and the arithmetic
/// flags (in AX).
const SAVED: [Register; 8] = [RCX, RDX, RSI, RDI, R8, R9, R10, R11];
/// The stack at the stub's entry: the return address, the argument, then
/// the 128 bytes of red zone the context entry stepped over.
const ARG: i32 = 8 * (SAVED.len() as i32 + 2) + 8;
const CLIENT_SP: i32 = ARG + 8 + 128;

/// What the fast paths need to know of the process.
#[derive(Debug, Clone, Copy)]
pub struct FastEntry {
    /// The block facts table's address in the client.
    pub facts: u64,
    /// Blocks the table has room for.
    pub blocks: u64,
    /// `--separate-recs` (0 counts as 1, as `callrules::level` takes it).
    pub separate_recs: u32,
}

impl Emitter {
    /// The context entries' stub (at `core + RT_STUB`, where translated
    /// code calls it with a block id or the complement of one whose
    /// counters must grow): the inline fast paths, and then (bound at the
    /// returned label) the runtime stub, which every other entry reaches
    /// with the stack, registers and flags as at the stub's entry.
    /// Returns the stub's *exit windows*: from each exit's check of
    /// [`layout::S_SIGNAL_WAITS`] to the end of its return, where a thread
    /// goes back to translated code without looking at the slot again.
    pub fn context_entry_stub(
        &mut self,
        core: u64,
        xmm: &[Register],
        fast: FastEntry,
    ) -> [std::ops::Range<u64>; 2] {
        let slow = self.new_label();
        let fast_exit = self.fast_entries(fast, slow);
        self.bind(slow);
        [fast_exit, self.runtime_stub(core, xmm)]
    }

    /// The fast paths, going to `slow` for anything else; returns the
    /// exit window of their common way out.
    fn fast_entries(&mut self, fast: FastEntry, slow: Label) -> std::ops::Range<u64> {
        let (restore_to_slow, ret_path, done) =
            (self.new_label(), self.new_label(), self.new_label());
        // Saves: RAX, the arithmetic flags, the scratch registers.
        op!(self, Push_r64, RAX);
        self.save_flags_to_ax();
        op!(self, Push_r64, RAX);
        for r in SAVED {
            op!(self, Push_r64, r);
        }
        // RCX = y (the block entered), RDX = x (the block left), RSI =
        // the arena; none of them special.
        op!(self, Mov_r64_rm64, RCX, based(Register::RSP, ARG));
        op!(self, Test_rm64_r64, RCX, RCX);
        self.jcc_label(JS, restore_to_slow); // a growth
                                             // RDX = x, untagged; R10L = whether it left by `ret` (the tag).
        op!(self, Mov_r64_rm64, RDX, gs(hot_word(hot::LAST)));
        op!(self, Cmp_rm64_imm8, RDX, hot::SIGNAL_START as i64 as i32);
        self.jcc_label(JAE, restore_to_slow); // none, or a handler's start
        op!(
            self,
            Btr_rm32_imm8,
            EDX,
            hot::RETURN_TAG.trailing_zeros() as i32
        );
        op!(self, Setb_rm8, R10L);
        op!(self, Cmp_rm64_r64, RDX, RCX);
        self.jcc_label(JE, restore_to_slow);
        // Both described blocks.
        op!(self, Mov_r64_imm64, RAX, fast.blocks);
        op!(self, Cmp_rm64_r64, RDX, RAX);
        self.jcc_label(JAE, restore_to_slow);
        op!(self, Cmp_rm64_r64, RCX, RAX);
        self.jcc_label(JAE, restore_to_slow);
        op!(self, Mov_r64_rm64, RSI, gs(hot_word(hot::ARENA)));
        op!(self, Cmp_rm64_imm8, word(RSI, head::USED), 0);
        self.jcc_label(JE, restore_to_slow);
        // No handler running, none returned unnoticed.
        op!(self, Cmp_rm64_imm8, word(RSI, head::SIGNALS_LEN), 0);
        self.jcc_label(JNE, restore_to_slow);
        op!(self, Cmp_rm64_imm8, gs(hot_word(hot::SIGNALS)), 0);
        self.jcc_label(JNE, restore_to_slow);
        op!(self, Cmp_rm64_imm8, word(RSI, head::NODE), -1);
        self.jcc_label(JE, restore_to_slow);
        // RDI = y's facts.
        let shift = (8 * ctxrt::FACT_WORDS).trailing_zeros() as i32;
        op!(self, Mov_r64_imm64, R8, fast.facts);
        op!(self, Mov_r64_rm64, RDI, RCX);
        op!(self, Shl_rm64_imm8, RDI, shift);
        op!(self, Add_r64_rm64, RDI, R8);
        op!(
            self,
            Test_rm8_imm8,
            based(RDI, FACT_FLAGS),
            abi::DESCRIBED as i32
        );
        self.jcc_label(JE, restore_to_slow);
        // R11 = the client's stack pointer at the entry.
        op!(self, Lea_r64_m, R11, based(Register::RSP, CLIENT_SP));
        // A return needs nothing of x's facts (a block that leaves by
        // `ret` is described, with the stack pointer known, before it
        // runs); the other entries read them: RAX = x's.
        op!(self, Test_rm8_r8, R10L, R10L);
        self.jcc_label(JNE, ret_path);
        op!(self, Mov_r64_rm64, RAX, RDX);
        op!(self, Shl_rm64_imm8, RAX, shift);
        op!(self, Add_r64_rm64, RAX, R8);
        // x described.
        op!(
            self,
            Test_rm8_imm8,
            based(RAX, FACT_FLAGS),
            abi::DESCRIBED as i32
        );
        self.jcc_label(JE, restore_to_slow);
        op!(self, Movzx_r32_rm8, R8D, based(RAX, FACT_EXIT));
        // (A return is tagged: untagged, the word is not what it seems.)
        op!(self, Cmp_rm32_imm8, R8D, abi::EXIT_RETURN as i32);
        self.jcc_label(JE, restore_to_slow);
        let (jump, call_skip) = (self.new_label(), self.new_label());
        op!(self, Cmp_rm32_imm8, R8D, abi::EXIT_CALL as i32);
        self.jcc_label(JNE, jump);
        // A call, with the stack pointer known at its exit.
        op!(
            self,
            Test_rm8_imm8,
            based(RAX, FACT_FLAGS),
            abi::SP_KNOWN as i32
        );
        self.jcc_label(JE, restore_to_slow);
        op!(
            self,
            Test_rm8_imm8,
            based(RDI, FACT_FLAGS),
            abi::SKIP as i32
        );
        self.jcc_label(JNE, call_skip);
        self.fast_call(fast, CallKind::Real, restore_to_slow, done);
        self.bind(call_skip);
        self.fast_call(fast, CallKind::RealSkip, restore_to_slow, done);
        // A jump: where its stack pointer is not known (a direct jump),
        // the runtime goes by the last one known (R11 = it, so that the
        // checks below are the runtime's or stricter, and `done` writes
        // it back unchanged).
        self.bind(jump);
        let sp_known = self.new_label();
        op!(
            self,
            Test_rm8_imm8,
            based(RAX, FACT_FLAGS),
            abi::SP_KNOWN as i32
        );
        self.jcc_label(JNE, sp_known);
        op!(self, Mov_r64_rm64, R11, word(RSI, head::LAST_SP));
        self.bind(sp_known);
        // An emulated call into a function's start or another domain (not
        // from code whose jumps pop), or a plain jump.
        let (emulated, plain) = (self.new_label(), self.new_label());
        op!(
            self,
            Test_rm8_imm8,
            based(RDI, FACT_FLAGS),
            abi::ENTRY as i32
        );
        self.jcc_label(JNE, emulated);
        op!(self, Mov_r32_rm32, R8D, based(RAX, FACT_DOMAIN));
        op!(self, Cmp_r32_rm32, R8D, based(RDI, FACT_DOMAIN));
        self.jcc_label(JE, plain);
        self.bind(emulated);
        op!(
            self,
            Test_rm8_imm8,
            based(RAX, FACT_FLAGS),
            abi::POP_ON_JUMP as i32
        );
        self.jcc_label(JNE, restore_to_slow);
        let jump_skip = self.new_label();
        op!(
            self,
            Test_rm8_imm8,
            based(RDI, FACT_FLAGS),
            abi::SKIP as i32
        );
        self.jcc_label(JNE, jump_skip);
        self.fast_call(fast, CallKind::Jump, restore_to_slow, done);
        self.bind(jump_skip);
        self.fast_call(fast, CallKind::JumpSkip, restore_to_slow, done);
        self.bind(plain);
        self.fast_jump(restore_to_slow, done);
        self.bind(ret_path);
        self.fast_return(restore_to_slow, done);
        self.bind(done);
        op!(self, Mov_rm64_r64, word(RSI, head::LAST_SP), R11);
        op!(self, Mov_rm64_imm32, gs(hot_word(hot::LAST)), -1);
        for w in [head::FAST_ENTRIES, head::ENTRIES, head::INLINE_ENTRIES] {
            op!(self, Add_rm64_imm8, word(RSI, w), 1);
        }
        // A signal that arrived meanwhile waits for the entry's end: the
        // tracer delivers it from the trap, as at the return address.
        let waits = self.new_label();
        let window = self.here();
        op!(self, Cmp_rm64_imm8, gs(layout::S_SIGNAL_WAITS), 0);
        self.jcc_label(JNE, waits);
        self.restore_saved();
        op!(self, Retnq);
        let window = window..self.here();
        self.bind(waits);
        self.restore_saved();
        op!(self, Int3);
        self.bind(restore_to_slow);
        self.restore_saved();
        self.jmp_label(slow);
        window
    }

    /// Pops what [`Emitter::fast_entries`] pushed.
    fn restore_saved(&mut self) {
        for r in SAVED.iter().rev() {
            op!(self, Pop_r64, *r);
        }
        op!(self, Pop_r64, RAX);
        self.restore_flags_from_ax();
        op!(self, Pop_r64, RAX);
    }

    /// A call path (`ctxrt::fast`'s `fast_call` for `kind`), with RAX =
    /// x's facts, RCX = y, RDX = x, RSI = the arena, RDI = y's facts,
    /// R11 = the stack pointer; it ends at `done` with the context
    /// entered, or at `fail` having changed nothing the runtime reads (the
    /// new frame's words are written early, above the stack's top).
    fn fast_call(&mut self, fast: FastEntry, kind: CallKind, fail: Label, done: Label) {
        let skip = matches!(kind, CallKind::RealSkip | CallKind::JumpSkip);
        let real = matches!(kind, CallKind::Real | CallKind::RealSkip);
        let failed = self.new_label();
        op!(self, Push_r64, RBX);
        // R10 = the memo's entry (laid out from its second word as a
        // hashed entry's): y and the child at R10+8, the arc at R10+16.
        op!(self, Mov_r64_rm64, R8, gs(hot_word(hot::CUR)));
        let found = self.new_label();
        // x's own memo, past its counter.
        let hashed = self.new_label();
        self.call_memo(hashed);
        self.jmp_label(found);
        // Else the hashed memo's entry of (x, y, CUR), hashed from the key
        // (`ctxrt::memo_key`) and the counters.
        self.bind(hashed);
        op!(self, Mov_r64_rm64, R10, RDX);
        op!(self, Shl_rm64_imm8, R10, 32);
        op!(self, Or_r64_rm64, R10, RCX);
        op!(self, Mov_r64_imm64, R9, abi::MEMO_HASH);
        op!(self, Imul_r64_rm64, R9, R10);
        op!(self, Shr_rm64_imm8, R9, 40);
        op!(self, Mov_r64_rm64, R10, R8);
        op!(self, Shr_rm64_imm8, R10, 3);
        op!(self, Xor_r64_rm64, R9, R10);
        // (The memo's entries, a power of two, from its words.)
        op!(self, Mov_r64_rm64, R10, word(RSI, head::MEMO_CAP));
        op!(
            self,
            Shr_rm64_imm8,
            R10,
            abi::MEMO_WORDS.trailing_zeros() as i32
        );
        op!(self, Sub_rm64_imm8, R10, 1);
        op!(self, And_r64_rm64, R9, R10);
        op!(
            self,
            Shl_rm32_imm8,
            R9D,
            (8 * abi::MEMO_WORDS).trailing_zeros() as i32
        );
        op!(self, Mov_r64_rm64, R10, word(RSI, head::MEMO));
        op!(self, Lea_r64_m, R10, indexed(RSI, R10, 8, 0));
        op!(self, Add_r64_rm64, R10, R9);
        op!(self, Cmp_r64_rm64, R8, based(R10, 0));
        self.jcc_label(JNE, failed);
        op!(self, Cmp_r64_rm64, RDX, based(R10, 24));
        self.jcc_label(JNE, failed);
        op!(self, Lea_r32_m, R9D, based(RCX, 1));
        op!(self, Cmp_rm32_r32, based(R10, 8), R9D);
        self.jcc_label(JNE, failed);
        self.bind(found);
        if skip {
            // Skipped code is entered from code that is not.
            op!(self, Cmp_rm64_imm8, word(RSI, head::NONSKIPPED_NODE), -1);
            self.jcc_label(JNE, failed);
        }
        // RDX = the new frame's place, with room for it.
        op!(self, Mov_r64_rm64, R9, word(RSI, head::DEPTH));
        op!(self, Cmp_r64_rm64, R9, word(RSI, head::STACK_CAP));
        self.jcc_label(JAE, failed);
        op!(self, Mov_r64_rm64, RDX, word(RSI, head::STACK));
        op!(self, Lea_r64_m, RDX, indexed(RSI, RDX, 8, 0));
        op!(self, Shl_rm64_imm8, R9, FRAME_BYTES.trailing_zeros() as i32);
        op!(self, Add_r64_rm64, RDX, R9);
        // No frame left behind by the stack pointer; the frame's stack
        // pointer is the client's, or an emulated call's the top frame's.
        let (no_frame, pushed_sp) = (self.new_label(), self.new_label());
        op!(self, Test_rm64_r64, R9, R9);
        self.jcc_label(JE, no_frame);
        op!(self, Mov_r64_rm64, RBX, based(RDX, FRAME_SP - FRAME_BYTES));
        op!(self, Cmp_rm64_r64, RBX, R11);
        self.jcc_label(JB, failed);
        if !real {
            op!(self, Mov_rm64_r64, based(RDX, FRAME_SP), RBX);
            self.jmp_label(pushed_sp);
        }
        self.bind(no_frame);
        op!(self, Mov_rm64_r64, based(RDX, FRAME_SP), R11);
        self.bind(pushed_sp);
        // The address a real call returns to (x's end); for skipped code,
        // RAX = x's call site, where its Ir is charged.
        if real {
            op!(self, Mov_r32_rm32, R9D, based(RAX, FACT_END));
            op!(self, Add_r64_rm64, R9, based(RAX, FACT_START));
            op!(self, Mov_rm64_r64, based(RDX, FRAME_RET), R9);
        } else {
            op!(self, Mov_rm64_imm32, based(RDX, FRAME_RET), 0);
        }
        if skip {
            op!(self, Mov_r32_rm32, R9D, based(RAX, FACT_SITE));
            op!(self, Add_r64_rm64, R9, based(RAX, FACT_START));
            op!(self, Mov_r64_rm64, RAX, R9);
        }
        // The caller and callee, the arc, the running Ir, the skipped-code
        // state before the call.
        op!(self, Mov_r32_rm32, R9D, word(RSI, head::NODE));
        op!(self, Mov_r32_rm32, EBX, based(RDI, FACT_FUNCTION));
        op!(self, Shl_rm64_imm8, RBX, 32);
        op!(self, Or_r64_rm64, R9, RBX);
        op!(self, Mov_rm64_r64, based(RDX, FRAME_CALLER), R9);
        op!(self, Mov_r64_rm64, R9, based(R10, 16));
        op!(self, Mov_rm64_r64, based(RDX, FRAME_ARC), R9);
        op!(self, Mov_r64_rm64, R9, gs(hot_word(hot::IR)));
        op!(self, Mov_rm64_r64, based(RDX, FRAME_IR), R9);
        op!(self, Mov_r64_rm64, R9, word(RSI, head::NONSKIPPED_NODE));
        op!(self, Mov_rm64_r64, based(RDX, FRAME_NS_NODE), R9);
        op!(self, Mov_r64_rm64, R9, word(RSI, head::NONSKIPPED_SITE));
        op!(self, Mov_rm64_r64, based(RDX, FRAME_NS_SITE), R9);
        // The resume record of the counters a real call is made from
        // (none for a sink or a moved copy).
        let resume_none = self.new_label();
        op!(self, Mov_r64_imm64, R9, u64::MAX);
        if real {
            op!(self, Cmp_rm64_imm8, based(R8, NODE_ID - NODE_COUNTERS), -1);
            self.jcc_label(JE, resume_none);
            op!(self, Cmp_rm64_imm8, based(R8, NODE_ROOM - NODE_COUNTERS), 0);
            self.jcc_label(JE, resume_none);
            op!(self, Mov_r64_rm64, R9, R8);
            op!(self, Sub_r64_rm64, R9, RSI);
            op!(self, Shr_rm64_imm8, R9, 3);
            op!(self, Sub_rm64_imm8, R9, abi::NODE_HEADER as i32);
        }
        self.bind(resume_none);
        op!(self, Mov_rm64_r64, based(RDX, FRAME_RESUME), R9);
        // RBX = the child's record (a skip node for skipped code), with
        // room for y's counter.
        op!(self, Mov_r64_rm64, RBX, based(R10, 8));
        op!(self, Shr_rm64_imm8, RBX, 32);
        op!(self, Add_r64_rm64, RBX, word(RSI, head::NODES));
        op!(self, Mov_r64_rm64, RBX, indexed(RSI, RBX, 8, 0));
        op!(self, Lea_r64_m, RBX, indexed(RSI, RBX, 8, 0));
        op!(self, Mov_r32_rm32, R9D, based(RDI, FACT_LAST));
        op!(self, Cmp_r64_rm64, R9, based(RBX, NODE_ROOM));
        self.jcc_label(JAE, failed);
        if !skip {
            // The child is the context the full decision would find: y's
            // group, at the level y's function is called at now (RCX = its
            // active count).
            op!(self, Mov_r32_rm32, R9D, based(RDI, FACT_GROUP));
            op!(self, Cmp_rm64_r64, based(RBX, NODE_GROUP), R9);
            self.jcc_label(JNE, failed);
            op!(self, Mov_r32_rm32, ECX, based(RDI, FACT_FUNCTION));
            op!(self, Cmp_r64_rm64, RCX, word(RSI, head::ACTIVE_CAP));
            self.jcc_label(JAE, failed);
            op!(self, Add_r64_rm64, RCX, word(RSI, head::ACTIVE));
            op!(self, Lea_r64_m, RCX, indexed(RSI, RCX, 8, 0));
            let recs = fast.separate_recs.max(1) as i32;
            let capped = self.new_label();
            op!(self, Mov_r32_rm32, R9D, based(RCX, 0));
            op!(self, Add_rm32_imm8, R9D, 1);
            op!(self, Cmp_rm32_imm32, R9D, recs);
            self.jcc_label(JBE, capped);
            op!(self, Mov_r32_imm32, R9D, recs as u32);
            self.bind(capped);
            op!(self, Cmp_rm32_r32, based(RBX, NODE_LEVEL), R9D);
            self.jcc_label(JNE, failed);
        }
        // Commit: the frame, then the arc's calls, the active count and
        // the node, or the skipped code's charge.
        op!(self, Add_rm64_imm8, word(RSI, head::DEPTH), 1);
        if skip {
            op!(self, Mov_r64_rm64, R9, word(RSI, head::NODE));
            op!(self, Mov_rm64_r64, word(RSI, head::NONSKIPPED_NODE), R9);
            op!(self, Mov_rm64_r64, word(RSI, head::NONSKIPPED_SITE), RAX);
        } else {
            op!(self, Mov_r64_rm64, RAX, based(R10, 16));
            op!(self, Lea_r64_m, RAX, indexed(RAX, RAX, 4, 0));
            op!(self, Add_r64_rm64, RAX, word(RSI, head::ARCS));
            op!(self, Add_rm64_imm8, indexed(RSI, RAX, 8, ARC_CALLS), 1);
            op!(self, Add_rm64_imm8, based(RCX, 0), 1);
            op!(self, Mov_r64_rm64, RAX, based(R10, 8));
            op!(self, Shr_rm64_imm8, RAX, 32);
            op!(self, Mov_rm64_r64, word(RSI, head::NODE), RAX);
            op!(self, Mov_rm64_imm32, word(RSI, head::NONSKIPPED_NODE), -1);
        }
        op!(self, Lea_r64_m, RAX, based(RBX, NODE_COUNTERS));
        op!(self, Mov_rm64_r64, gs(hot_word(hot::CUR)), RAX);
        op!(self, Pop_r64, RBX);
        self.jmp_label(done);
        self.bind(failed);
        op!(self, Pop_r64, RBX);
        self.jmp_label(fail);
    }

    /// Whether the counters at R8 are a node's where it keeps them now
    /// (else to `moved`), of the group of the block whose facts are at
    /// `facts` (else to `other_group`), with room for its last word (else
    /// to `no_room`). Uses R9.
    fn counters_hold(&mut self, facts: Register, moved: Label, other_group: Label, no_room: Label) {
        op!(self, Cmp_rm64_imm8, based(R8, NODE_ID - NODE_COUNTERS), -1);
        self.jcc_label(JE, moved);
        op!(self, Mov_r32_rm32, R9D, based(facts, FACT_GROUP));
        op!(
            self,
            Cmp_rm64_r64,
            based(R8, NODE_GROUP - NODE_COUNTERS),
            R9
        );
        self.jcc_label(JNE, other_group);
        op!(self, Mov_r32_rm32, R9D, based(facts, FACT_LAST));
        op!(self, Cmp_r64_rm64, R9, based(R8, NODE_ROOM - NODE_COUNTERS));
        self.jcc_label(JAE, no_room);
    }

    /// Block x's call memo past its counter (`ctxrt::fast`'s
    /// `call_memo_at`: x has one, the counters at R8 are a node's current
    /// ones of x's group with room for it) naming y: R10 = x's counter
    /// (the memo's words at R10+8 and R10+16), or else to `miss`. With RAX
    /// = x's facts, RCX = y.
    fn call_memo(&mut self, miss: Label) {
        op!(
            self,
            Test_rm8_imm8,
            based(RAX, FACT_FLAGS),
            abi::CALL_MEMO as i32
        );
        self.jcc_label(JE, miss);
        self.counters_hold(RAX, miss, miss, miss);
        op!(self, Mov_r32_rm32, R9D, based(RAX, FACT_INDEX));
        op!(self, Lea_r64_m, R10, indexed(R8, R9, 8, 0));
        op!(self, Lea_r32_m, R9D, based(RCX, 1));
        op!(self, Cmp_rm32_r32, based(R10, 8), R9D);
        self.jcc_label(JNE, miss);
    }

    /// The jump path (`ctxrt::fast`'s `fast_jump`: an indirect jump, a
    /// `switch`, a jump into another counter group), with RAX = x's facts,
    /// RCX = y, RDX = x, RSI = the arena, RDI = y's facts, R11 = the stack
    /// pointer; it ends at `done` with the counters as they are (y's
    /// group) or those x's call memo holds for y (another group of the
    /// context), or at `fail` having changed nothing.
    fn fast_jump(&mut self, fail: Label, done: Label) {
        // No frame left behind by the stack pointer.
        let frames_kept = self.new_label();
        op!(self, Mov_r64_rm64, R9, word(RSI, head::DEPTH));
        op!(self, Test_rm64_r64, R9, R9);
        self.jcc_label(JE, frames_kept);
        op!(self, Mov_r64_rm64, R8, word(RSI, head::STACK));
        op!(self, Lea_r64_m, R8, indexed(RSI, R8, 8, 0));
        op!(self, Shl_rm64_imm8, R9, FRAME_BYTES.trailing_zeros() as i32);
        op!(self, Add_r64_rm64, R8, R9);
        op!(self, Cmp_rm64_r64, based(R8, FRAME_SP - FRAME_BYTES), R11);
        self.jcc_label(JB, fail);
        self.bind(frames_kept);
        // The counters are a node's where it keeps them now; of y's
        // group, with room for y's counter, they stay.
        let other_group = self.new_label();
        op!(self, Mov_r64_rm64, R8, gs(hot_word(hot::CUR)));
        self.counters_hold(RDI, fail, other_group, fail);
        self.jmp_label(done);
        // Another group, outside skipped code: x's call memo (in counters
        // of x's group with room for it) has y's key and a node of this
        // context's with y's group and room for y's counter: the
        // context's own node, or its foreign node of y's group.
        self.bind(other_group);
        op!(self, Cmp_rm64_imm8, word(RSI, head::NONSKIPPED_NODE), -1);
        self.jcc_label(JNE, fail);
        self.call_memo(fail);
        // R9 = the node, R10 = its record.
        op!(self, Mov_r64_rm64, R9, based(R10, 8));
        op!(self, Shr_rm64_imm8, R9, 32);
        op!(self, Mov_r64_rm64, R10, word(RSI, head::NODES));
        op!(self, Add_r64_rm64, R10, R9);
        op!(self, Mov_r64_rm64, R10, indexed(RSI, R10, 8, 0));
        op!(self, Lea_r64_m, R10, indexed(RSI, R10, 8, 0));
        op!(self, Mov_r32_rm32, EAX, based(RDI, FACT_GROUP));
        op!(self, Cmp_rm64_r64, based(R10, NODE_GROUP), RAX);
        self.jcc_label(JNE, fail);
        op!(self, Mov_r32_rm32, EAX, based(RDI, FACT_LAST));
        op!(self, Cmp_r64_rm64, RAX, based(R10, NODE_ROOM));
        self.jcc_label(JAE, fail);
        let own = self.new_label();
        op!(self, Cmp_r64_rm64, R9, word(RSI, head::NODE));
        self.jcc_label(JE, own);
        op!(self, Mov_r32_rm32, EAX, word(RSI, head::NODE));
        op!(self, Cmp_rm32_r32, based(R10, NODE_PARENT), EAX);
        self.jcc_label(JNE, fail);
        op!(
            self,
            Cmp_rm32_imm8,
            based(R10, NODE_KIND),
            abi::FOREIGN as i32
        );
        self.jcc_label(JNE, fail);
        self.bind(own);
        op!(self, Lea_r64_m, RAX, based(R10, NODE_COUNTERS));
        op!(self, Mov_rm64_r64, gs(hot_word(hot::CUR)), RAX);
        self.jmp_label(done);
    }

    /// The return path (`ctxrt::fast`'s `fast_return`), with RSI = the
    /// arena, RDI = y's facts, R11 = the stack pointer; it ends at `done`
    /// with the context entered, or at `fail` having changed nothing.
    fn fast_return(&mut self, fail: Label, done: Label) {
        // RDX = the first frame, RCX = past the top one, R8 = the lowest
        // frame the stack pointer left (frames above it are left too).
        op!(self, Mov_r64_rm64, RDX, word(RSI, head::STACK));
        op!(self, Lea_r64_m, RDX, indexed(RSI, RDX, 8, 0));
        op!(self, Mov_r64_rm64, RCX, word(RSI, head::DEPTH));
        op!(
            self,
            Shl_rm64_imm8,
            RCX,
            FRAME_BYTES.trailing_zeros() as i32
        );
        op!(self, Add_r64_rm64, RCX, RDX);
        op!(self, Mov_r64_rm64, R8, RCX);
        let (down, found) = (self.new_label(), self.new_label());
        self.bind(down);
        op!(self, Cmp_r64_rm64, R8, RDX);
        self.jcc_label(JE, found);
        op!(self, Cmp_rm64_r64, based(R8, FRAME_SP - FRAME_BYTES), R11);
        self.jcc_label(JAE, found);
        op!(self, Sub_rm64_imm8, R8, FRAME_BYTES);
        self.jmp_label(down);
        self.bind(found);
        op!(self, Cmp_r64_rm64, R8, RCX);
        self.jcc_label(JE, fail);
        // The lowest frame left: a real call's returning here, with a
        // caller, no skipped code, and a resume record (R9) of y's group
        // with room for it.
        op!(self, Mov_r64_rm64, RAX, based(RDI, FACT_START));
        op!(self, Cmp_rm64_r64, based(R8, FRAME_RET), RAX);
        self.jcc_label(JNE, fail);
        op!(self, Cmp_rm64_imm8, based(R8, FRAME_NS_NODE), -1);
        self.jcc_label(JNE, fail);
        op!(self, Cmp_rm32_imm8, based(R8, FRAME_CALLER), -1);
        self.jcc_label(JE, fail);
        op!(self, Mov_r64_rm64, R9, based(R8, FRAME_RESUME));
        op!(self, Cmp_rm64_imm8, R9, -1);
        self.jcc_label(JE, fail);
        op!(self, Lea_r64_m, R9, indexed(RSI, R9, 8, 0));
        op!(self, Mov_r32_rm32, EAX, based(RDI, FACT_GROUP));
        op!(self, Cmp_rm64_r64, based(R9, NODE_GROUP), RAX);
        self.jcc_label(JNE, fail);
        op!(self, Cmp_rm64_imm8, based(R9, NODE_ID), -1);
        self.jcc_label(JE, fail);
        op!(self, Mov_r32_rm32, EAX, based(RDI, FACT_LAST));
        op!(self, Cmp_r64_rm64, RAX, based(R9, NODE_ROOM));
        self.jcc_label(JAE, fail);
        // Commit: the new depth; each frame left, from the top, gives its
        // arc the call's inclusive Ir and its function one active frame
        // less; then the lowest one's caller and skipped-code state, and
        // the resume record.
        op!(self, Mov_r64_rm64, RAX, R8);
        op!(self, Sub_r64_rm64, RAX, RDX);
        op!(
            self,
            Shr_rm64_imm8,
            RAX,
            FRAME_BYTES.trailing_zeros() as i32
        );
        op!(self, Mov_rm64_r64, word(RSI, head::DEPTH), RAX);
        let (pop, no_arc, popped) = (self.new_label(), self.new_label(), self.new_label());
        self.bind(pop);
        op!(self, Sub_rm64_imm8, RCX, FRAME_BYTES);
        op!(self, Mov_r64_rm64, RAX, based(RCX, FRAME_ARC));
        op!(self, Cmp_rm64_imm8, RAX, -1);
        self.jcc_label(JE, no_arc);
        op!(self, Lea_r64_m, RAX, indexed(RAX, RAX, 4, 0));
        op!(self, Add_r64_rm64, RAX, word(RSI, head::ARCS));
        op!(self, Lea_r64_m, RAX, indexed(RSI, RAX, 8, 0));
        op!(self, Mov_r64_rm64, RDX, gs(hot_word(hot::IR)));
        op!(self, Sub_r64_rm64, RDX, based(RCX, FRAME_IR));
        op!(self, Add_rm64_r64, based(RAX, ARC_INCLUSIVE), RDX);
        op!(self, Mov_r32_rm32, EAX, based(RCX, FRAME_FUNCTION));
        op!(self, Add_r64_rm64, RAX, word(RSI, head::ACTIVE));
        op!(self, Lea_r64_m, RAX, indexed(RSI, RAX, 8, 0));
        op!(self, Cmp_rm64_imm8, based(RAX, 0), 0);
        self.jcc_label(JE, no_arc);
        op!(self, Sub_rm64_imm8, based(RAX, 0), 1);
        self.bind(no_arc);
        op!(self, Cmp_r64_rm64, RCX, R8);
        self.jcc_label(JE, popped);
        self.jmp_label(pop);
        self.bind(popped);
        op!(self, Mov_r32_rm32, EAX, based(R8, FRAME_CALLER));
        op!(self, Mov_rm64_r64, word(RSI, head::NODE), RAX);
        op!(self, Mov_r64_rm64, RAX, based(R8, FRAME_NS_NODE));
        op!(self, Mov_rm64_r64, word(RSI, head::NONSKIPPED_NODE), RAX);
        op!(self, Mov_r64_rm64, RAX, based(R8, FRAME_NS_SITE));
        op!(self, Mov_rm64_r64, word(RSI, head::NONSKIPPED_SITE), RAX);
        op!(self, Lea_r64_m, RAX, based(R9, NODE_COUNTERS));
        op!(self, Mov_rm64_r64, gs(hot_word(hot::CUR)), RAX);
        self.jmp_label(done);
    }
}

/// The calls the fast paths take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CallKind {
    /// A `call` into code that is not skipped.
    Real,
    /// A `call` into skipped code (a PLT entry): a frame without an arc,
    /// its code charged to the call site.
    RealSkip,
    /// A jump into a function's start or another object (a tail call,
    /// a PLT entry's jump) that is not skipped: an emulated call.
    Jump,
    /// A jump into skipped code (a tail call into a PLT entry): a frame
    /// without an arc, as [`CallKind::RealSkip`].
    JumpSkip,
}
