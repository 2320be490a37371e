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

use super::cc::{JAE, JB, JBE, JE, JNE};
use super::{based_indexed, gs, gs_indexed, Emitter, Label};
use crate::layout::{self, AREA_MEMOS, AREA_TAGGED_ARENA};
use ctxrt::hot;
use ctxrt::tagged::{head, FRAME_WORDS, INLINE_POPS, MEMO_WORDS, SKIP_TAGS};
use ctxrt::tagged::{M_CALL2, M_CALL_ARC, M_CALL_KEY, M_CALL_TARGET};
use ctxrt::tagged::{M_IN_ARC, M_IN_FROM, M_IN_KEY};
use ctxrt::tagged::{M_PLT2, M_PLT_ARC, M_PLT_KEY, M_PLT_TARGET};
use iced_x86::{Code, Instruction, MemoryOperand, Register};
use Register::{ECX, EDX, R10, R10D, R11, R9, R9D, R9L, RAX, RCX, RDX, RSP};

/// Words of an arc record (`ctxrt::tagged`): key (3), calls, inclusive.
const ARC_CALLS: i32 = 8 * 3;
const ARC_INCLUSIVE: i32 = 8 * 4;
const FRAME_BYTES: i32 = 8 * FRAME_WORDS as i32;
const _: () = assert!(FRAME_WORDS == 8 && SKIP_TAGS == 1 << 31);
/// A block id shifted by this is its memos' word offset.
const MEMO_SHIFT: i32 = MEMO_WORDS.trailing_zeros() as i32;
const _: () = assert!(1 << MEMO_SHIFT == MEMO_WORDS);

/// Where a block's header words are, from its body (its context entry):
/// `translate::tagged_header`.
const HEADER_FLAGS: i32 = -20;
const HEADER_FUNCTION: i32 = -12;
const HEADER_ID: i32 = -4;

/// `gs:[arena word i]`.
fn arena(i: usize) -> MemoryOperand {
    gs(AREA_TAGGED_ARENA as u32 + 8 * i as u32)
}

/// `gs:[AREA_TAGGED_ARENA + index*8 + disp]`: a word of the arena at the
/// word offset in `index`, plus `disp` bytes.
fn arena_at(index: Register, disp: i32) -> MemoryOperand {
    gs_indexed(index, (AREA_TAGGED_ARENA as i32 + disp) as u32)
}

/// `gs:[hot word i]`.
fn hot_word(i: usize) -> MemoryOperand {
    gs(layout::S_CONTEXT_HOT + 8 * i as u32)
}

/// `gs:[word k of the memos of the block whose id times 8 is in `r`]`.
fn memo_at(r: Register, k: usize) -> MemoryOperand {
    gs_indexed(r, AREA_MEMOS as u32 + 8 * k as u32)
}

/// The high half of [`memo_at`]'s word.
fn memo_at_high(r: Register, k: usize) -> MemoryOperand {
    gs_indexed(r, AREA_MEMOS as u32 + 8 * k as u32 + 4)
}

/// `[index*8 + disp]`: a depth to a frame's word offset (FRAME_WORDS is 8).
fn frame_index(index: Register, disp: i32) -> MemoryOperand {
    MemoryOperand::with_index_scale_displ_size(index, 8, i64::from(disp), 4)
}

/// Registers a sequence keeps in spill slots (RAX holds the flags).
const KEPT: [(Register, u32); 6] = [
    (RAX, layout::S_TAGGED_RAX),
    (RCX, layout::S_TAGGED_RCX),
    (RDX, layout::S_TAGGED_RDX),
    (R9, layout::S_TAGGED_R9),
    (R10, layout::S_TAGGED_R10),
    (R11, layout::S_TAGGED_R11),
];
/// Those a direct call's stub keeps itself (its site keeps RCX and R9,
/// which carry its arguments).
const KEPT_BY_STUB: &[(Register, u32)] = &[
    (RAX, layout::S_TAGGED_RAX),
    (RDX, layout::S_TAGGED_RDX),
    (R10, layout::S_TAGGED_R10),
    (R11, layout::S_TAGGED_R11),
];
/// Those an inline return keeps (after its lookup, whose RAX and RCX
/// are scratch) when it leaves one frame ...
const RETURN_KEPT: &[(Register, u32)] = &[(RDX, layout::S_TAGGED_RDX), (R11, layout::S_TAGGED_R11)];
/// ... and the ones it keeps too when it leaves more.
const RETURN_MORE_KEPT: &[(Register, u32)] =
    &[(R9, layout::S_TAGGED_R9), (R10, layout::S_TAGGED_R10)];
/// Those a sequence after a lookup keeps (the lookup's RAX and RCX are
/// scratch, the client's in their slots).
const KEPT_AFTER_LOOKUP: &[(Register, u32)] = &[
    (RDX, layout::S_TAGGED_RDX),
    (R9, layout::S_TAGGED_R9),
    (R10, layout::S_TAGGED_R10),
    (R11, layout::S_TAGGED_R11),
];

/// Whether inline calls can compute a callee's tag (`1 + f*R + level -
/// 1`, the multiply a `lea` scale): `--separate-recs` 1, 2 (the default),
/// 4 or 8.
pub fn inline_recs(recs: u32) -> bool {
    matches!(recs.max(1), 1 | 2 | 4 | 8)
}

/// What a direct call's site needs to know of its callee, known at
/// translation.
#[derive(Debug, Clone, Copy)]
pub struct TaggedCall {
    /// The calling block's id (its memos hold the call).
    pub block: u32,
    /// The callee's function (the classifier's number).
    pub function: u32,
    /// Where the call returns to; `None` for a direct jump Callgrind
    /// takes for a call (a tail call: `Tagged::inline_jump_call`).
    pub ret_addr: Option<u64>,
    /// The callee is skipped code (the PLT), called from this call site.
    pub skip_site: Option<u64>,
}

/// The shared inline-transition code of a chunk (tagged counting), which
/// sites call rather than each holding a copy.
#[derive(Debug, Clone, Copy)]
pub struct TaggedStubs {
    /// [`Emitter::tagged_return_stub`].
    pub ret: u64,
    /// [`Emitter::tagged_call_stub`] of a call.
    pub call: u64,
    /// [`Emitter::tagged_call_stub`] of a jump Callgrind takes for a call.
    pub jump_call: u64,
    /// [`Emitter::tagged_call_stub`] of a call into skipped code.
    pub skip_call: u64,
    /// [`Emitter::tagged_call_stub`] of a jump into skipped code.
    pub skip_jump_call: u64,
    /// [`Emitter::tagged_indirect_call_stub`].
    pub indirect_call: u64,
    /// [`Emitter::tagged_jump_stub`] that keeps the context only.
    pub jump: u64,
    /// [`Emitter::tagged_jump_stub`] that may call.
    pub jump_calls: u64,
    /// [`Emitter::probe_stub_returning`]: the lookups of the sites above
    /// go on to their inline code when a probe finds the target.
    pub probe: u64,
}

/// Which of the direct calls a sequence does.
#[derive(Debug, Clone, Copy)]
pub struct CallKind {
    /// A direct jump Callgrind takes for a call (a tail call).
    pub jump: bool,
    /// Into skipped code (the PLT), from the call site.
    pub skip: bool,
}

/// What a call's frame records as its return address.
#[derive(Clone, Copy)]
enum RetAddr {
    /// None (0): an emulated call, made by a jump.
    Emulated,
    /// The one the client's `call` pushed, at the stack pointer.
    Pushed,
}

/// Bytes from a call stub's return address to where its site goes on
/// when the call is not done inline: past the site's `jmp rel32` to the
/// callee's body.
const CALL_FAIL_SKIP: i32 = 5;
/// The same for a jump's call stub: past `lea rsp, [rsp + 128]` (8
/// bytes) and the `jmp rel32`.
const JUMP_CALL_FAIL_SKIP: i32 = 13;
/// The red zone a jump's site steps over before it calls its stub (the
/// jumping function may still have data there).
const RED_ZONE: i32 = 128;

/// Where a call's frame has its stack pointer.
#[derive(Clone, Copy)]
enum FrameSp {
    /// The client's (a real call).
    Client,
    /// The top frame's (an emulated call, from skipped code).
    Top,
    /// The top frame's, or the last known without a frame (a direct
    /// jump's emulated call, whose own stack pointer is not looked at).
    TopOrLast,
    /// The top frame's, or the client's without a frame (an indirect
    /// jump's emulated call).
    TopOrClient,
}

impl Emitter {
    /// `r` = the running Ir, the sum of its words (flags changed).
    fn running_ir(&mut self, r: Register) {
        op!(self, Mov_r64_rm64, r, hot_word(hot::IR));
        for w in hot::IR_MORE {
            op!(self, Add_r64_rm64, r, hot_word(w));
        }
    }

    /// Spills `regs`, then keeps the flags in AX.
    fn keep_registers(&mut self, regs: &[(Register, u32)]) {
        self.keep_registers_only(regs);
        self.save_flags_to_ax();
    }

    /// Spills `regs` (the flags already kept).
    fn keep_registers_only(&mut self, regs: &[(Register, u32)]) {
        for &(r, s) in regs {
            self.store_gs(r, s);
        }
    }

    /// The flags back from AX, then `regs` from their spill slots.
    fn restore_registers(&mut self, regs: &[(Register, u32)]) {
        self.restore_flags_from_ax();
        self.unspill_registers(regs);
    }

    /// `regs` back from their spill slots.
    fn unspill_registers(&mut self, regs: &[(Register, u32)]) {
        for &(r, s) in regs.iter().rev() {
            self.load_gs(r, s);
        }
    }

    /// Goes to `fail` inside a signal handler (or one returned unseen);
    /// `scratch` changes.
    fn fail_in_handler(&mut self, scratch: Register, fail: Label) {
        op!(self, Mov_r64_rm64, scratch, arena(head::SIGNALS_LEN));
        op!(self, Or_r64_rm64, scratch, hot_word(hot::SIGNALS));
        self.jcc_label(JNE, fail);
    }

    /// `r` = the current context's tag; to `fail` if none.
    fn caller_or_fail(&mut self, r: Register, fail: Label) {
        op!(self, Mov_r64_rm64, r, arena(head::CTX));
        op!(self, Test_rm64_r64, r, r);
        self.jcc_label(JE, fail);
    }

    /// `dst` = the word offset of the top frame, of `depth` frames.
    fn top_frame(&mut self, dst: Register, depth: Register) {
        op!(
            self,
            Lea_r64_m,
            dst,
            frame_index(depth, -(FRAME_WORDS as i32))
        );
        op!(self, Add_r64_rm64, dst, arena(head::STACK));
    }

    /// To `fail` if the top of the `depth` frames has its stack pointer
    /// below the client's (a frame the stack pointer left: a `longjmp`).
    /// `scratch` (which may be `depth`) changes.
    fn no_frame_left_or_fail(&mut self, depth: Register, scratch: Register, fail: Label) {
        let no_frame = self.new_label();
        op!(self, Test_rm64_r64, depth, depth);
        self.jcc_label(JE, no_frame);
        self.top_frame(scratch, depth);
        op!(self, Cmp_rm64_r64, arena_at(scratch, 0), RSP);
        self.jcc_label(JB, fail);
        self.bind(no_frame);
    }

    /// `depth` = the frames; to `fail` if there is no room for one more,
    /// or if a frame was left ([`Emitter::no_frame_left_or_fail`]).
    fn room_or_fail(&mut self, depth: Register, scratch: Register, fail: Label) {
        self.room_only_or_fail(depth, fail);
        self.no_frame_left_or_fail(depth, scratch, fail);
    }

    /// `depth` = the frames; to `fail` if there is no room for one more.
    fn room_only_or_fail(&mut self, depth: Register, fail: Label) {
        op!(self, Mov_r64_rm64, depth, arena(head::DEPTH));
        op!(self, Cmp_r64_rm64, depth, arena(head::STACK_CAP));
        self.jcc_label(JAE, fail);
    }

    /// R10 = the tag of function R9's context when called now (its level
    /// one more than its frames, at most `recs`); to `fail` if its active
    /// count has no room.
    fn callee_tag(&mut self, recs: u32, fail: Label) {
        let recs = recs.max(1);
        let capped = self.new_label();
        op!(self, Cmp_rm64_r64, arena(head::ACTIVE_CAP), R9);
        self.jcc_label(JBE, fail);
        op!(self, Mov_r64_rm64, R10, arena(head::ACTIVE));
        op!(self, Add_r64_rm64, R10, R9);
        op!(self, Mov_r64_rm64, R10, arena_at(R10, 0));
        op!(self, Cmp_rm64_imm32, R10, recs as i32 - 1);
        self.jcc_label(JBE, capped);
        op!(self, Mov_r32_imm32, R10D, recs - 1);
        self.bind(capped);
        op!(self, Lea_r64_m, R10, based_indexed(R10, R9, recs, 1));
    }

    /// A call of function R9's context R10 on the arc in R11, returning to
    /// `ret_addr`: the arc's calls, the function's active count, the
    /// frame, counting in the callee (`Tagged::push_call`), from skipped
    /// code if `from_skipped` (else its checks made sure the thread is
    /// not: what skipped code keeps is left alone). RCX and RDX change.
    fn commit_call(&mut self, sp: FrameSp, ret_addr: RetAddr, from_skipped: bool) {
        op!(self, Mov_r64_rm64, RDX, R11);
        op!(self, Lea_r64_m, RDX, based_indexed(RDX, RDX, 4, 0));
        op!(self, Add_r64_rm64, RDX, arena(head::ARCS));
        op!(self, Add_rm64_imm8, arena_at(RDX, ARC_CALLS), 1);
        op!(self, Mov_r64_rm64, RDX, arena(head::ACTIVE));
        op!(self, Add_r64_rm64, RDX, R9);
        op!(self, Add_rm64_imm8, arena_at(RDX, 0), 1);
        // RCX = the new frame's word offset.
        op!(self, Mov_r64_rm64, RCX, arena(head::DEPTH));
        op!(self, Lea_r64_m, RCX, frame_index(RCX, 0));
        op!(self, Add_r64_rm64, RCX, arena(head::STACK));
        match sp {
            FrameSp::Client => op!(self, Mov_rm64_r64, arena_at(RCX, 0), RSP),
            FrameSp::Top => {
                op!(self, Mov_r64_rm64, RDX, arena_at(RCX, -FRAME_BYTES));
                op!(self, Mov_rm64_r64, arena_at(RCX, 0), RDX);
            }
            FrameSp::TopOrLast | FrameSp::TopOrClient => {
                self.frame_sp_top_or(RDX, matches!(sp, FrameSp::TopOrClient));
                op!(self, Mov_rm64_r64, arena_at(RCX, 0), RDX);
            }
        }
        self.frame_ret_addr(ret_addr, RDX);
        // The caller's tag and the callee's function in one word (the
        // flags are in AX).
        op!(self, Mov_r64_rm64, RDX, R9);
        op!(self, Shl_rm64_imm8, RDX, 32);
        op!(self, Or_r64_rm64, RDX, arena(head::CTX));
        op!(self, Mov_rm64_r64, arena_at(RCX, 16), RDX);
        op!(self, Mov_rm64_r64, arena_at(RCX, 24), R11);
        self.running_ir(RDX);
        op!(self, Mov_rm64_r64, arena_at(RCX, 32), RDX);
        if from_skipped {
            op!(self, Mov_r64_rm64, RDX, arena(head::NS_CTX));
            op!(self, Mov_rm64_r64, arena_at(RCX, 40), RDX);
            op!(self, Mov_r64_rm64, RDX, arena(head::NS_SITE));
            op!(self, Mov_rm64_r64, arena_at(RCX, 48), RDX);
            op!(self, Mov_rm64_imm32, arena(head::NS_CTX), 0);
            op!(self, Mov_rm64_imm32, hot_word(hot::NS_SKIP), -1);
        } else {
            // (Outside skipped code: the site word is dead, and the
            // current tag is no skip record's, as NS_SKIP says.)
            op!(self, Mov_rm64_imm32, arena_at(RCX, 40), 0);
        }
        op!(self, Add_rm64_imm8, arena(head::DEPTH), 1);
        op!(self, Mov_rm64_r64, arena(head::CTX), R10);
        op!(self, Mov_rm64_r64, hot_word(hot::CUR), R10);
    }

    /// The return address word of the frame at the word offset in RCX
    /// (`scratch` changes).
    fn frame_ret_addr(&mut self, ret_addr: RetAddr, scratch: Register) {
        match ret_addr {
            RetAddr::Emulated => op!(self, Mov_rm64_imm32, arena_at(RCX, 8), 0),
            RetAddr::Pushed => {
                op!(self, Mov_r64_rm64, scratch, MemoryOperand::with_base(RSP));
                op!(self, Mov_rm64_r64, arena_at(RCX, 8), scratch);
            }
        }
    }

    /// `r` = the stack pointer of a jump's emulated call, whose frame goes
    /// at the word offset in RCX: the top frame's, or without a frame the
    /// client's if `client`, else the last known (flags changed).
    fn frame_sp_top_or(&mut self, r: Register, client: bool) {
        let none = self.new_label();
        if client {
            op!(self, Mov_r64_rm64, r, RSP);
        } else {
            op!(self, Mov_r64_rm64, r, arena(head::LAST_SP));
        }
        op!(self, Cmp_rm64_imm8, arena(head::DEPTH), 0);
        self.jcc_label(JE, none);
        op!(self, Mov_r64_rm64, r, arena_at(RCX, -FRAME_BYTES));
        self.bind(none);
    }

    /// R11 = the arc the call block's memos (its id times [`MEMO_WORDS`]
    /// in `x`) know (either of their
    /// two calls) under the key of the caller's tag in EDX and the
    /// callee's in R10D (and into the guest target in `S_TAGGED_TARGET`
    /// if `target`); else to `miss`. RCX changes.
    fn call_memo_arc(&mut self, x: Register, target: bool, miss: Label) {
        debug_assert!(!(target && x == RCX));
        if target {
            op!(self, Mov_r64_rm64, RCX, gs(layout::S_TAGGED_TARGET));
        }
        self.either_memo_entry([M_CALL_KEY, M_CALL_KEY + M_CALL2], miss, |e, key, next| {
            e.memo_entry_arc(x, key, target, next);
        });
    }

    /// A memo's two entries, the first at word `keys[0]`, the second at
    /// `keys[1]`: `entry` (given the entry's key word and the label to
    /// go to when it does not match) tries each in turn; to `miss` if
    /// neither matches.
    fn either_memo_entry(
        &mut self,
        keys: [usize; 2],
        miss: Label,
        mut entry: impl FnMut(&mut Emitter, usize, Label),
    ) {
        let (second, hit) = (self.new_label(), self.new_label());
        entry(self, keys[0], second);
        self.jmp_label(hit);
        self.bind(second);
        entry(self, keys[1], miss);
        self.bind(hit);
    }

    /// R11 = the arc of the memo entry of `x` (a block's memos, its id
    /// times [`MEMO_WORDS`]) whose key is at word `key` (its arc and
    /// target the next two) if the key is the caller's tag in EDX and the
    /// callee's in R10D, and, if `target`, its target the guest target in
    /// RCX; else to `next`.
    fn memo_entry_arc(&mut self, x: Register, key: usize, target: bool, next: Label) {
        const _: () = assert!(M_CALL_ARC == M_CALL_KEY + 1 && M_CALL_TARGET == M_CALL_KEY + 2);
        const _: () = assert!(M_PLT_ARC == M_PLT_KEY + 1 && M_PLT_TARGET == M_PLT_KEY + 2);
        op!(self, Cmp_rm32_r32, memo_at(x, key), EDX);
        self.jcc_label(JNE, next);
        op!(self, Cmp_rm32_r32, memo_at_high(x, key), R10D);
        self.jcc_label(JNE, next);
        if target {
            op!(self, Cmp_rm64_r64, memo_at(x, key + 2), RCX);
            self.jcc_label(JNE, next);
        }
        op!(self, Mov_r64_rm64, R11, memo_at(x, key + 1));
    }

    /// The end of every inline transition (`Tagged::inline_done`): the
    /// stack pointer known, except at a direct jump.
    fn inline_done(&mut self, sp_known: bool) {
        if sp_known {
            op!(self, Mov_rm64_r64, arena(head::LAST_SP), RSP);
        }
        if self.count_inline {
            op!(self, Add_rm64_imm8, arena(head::INLINE), 1);
        }
    }

    /// The target found by a lookup is entered past its context entry.
    fn skip_target_entry(&mut self) {
        op!(
            self,
            Add_rm64_imm8,
            gs(layout::S_TARGET),
            super::CONTEXT_ENTRY_BYTES as i32
        );
    }

    /// The way out of a sequence after a lookup: the client's registers
    /// and flags back, then to the translation in `S_TARGET`.
    fn after_lookup_exit(&mut self) {
        self.restore_registers(KEPT_AFTER_LOOKUP);
        self.load_gs(RCX, layout::S_RCX);
        self.load_gs(RAX, layout::S_RAX);
        self.insn(Instruction::with1(Code::Jmp_rm64, gs(layout::S_TARGET)));
    }

    /// A direct call's site over the chunk's shared
    /// [`Emitter::tagged_call_stub`], right after the `call`'s return
    /// address is pushed: on at `done` (the callee's body) when done, else
    /// at the code that follows (the context entry's jump, at `fail`);
    /// every register and flag as they were either way.
    pub fn tagged_call_site(&mut self, c: TaggedCall, stubs: TaggedStubs, done: Label) {
        // The stub's arguments go in the registers it would otherwise
        // spill itself: the calling block's memos in RCX, the callee's
        // function in R9 (no store and reload of a spill slot each).
        debug_assert!(c.block < 1 << (31 - MEMO_SHIFT) && c.function < 1 << 31);
        self.store_gs(RCX, layout::S_TAGGED_RCX);
        self.store_gs(R9, layout::S_TAGGED_R9);
        if let Some(site) = c.skip_site {
            // (The slot of an indirect jump's target, free until the
            // skipped code's own jump.) One 64-bit store, which the stub's
            // 64-bit load can be forwarded from (two halves cannot).
            op!(self, Mov_r64_imm64, R9, site);
            self.store_gs(R9, layout::S_TAGGED_TARGET);
        }
        op!(self, Mov_r32_imm32, ECX, c.block << MEMO_SHIFT);
        op!(self, Mov_r32_imm32, R9D, c.function);
        let skip = c.skip_site.is_some();
        let below_red_zone = MemoryOperand::with_base_displ(RSP, -i64::from(RED_ZONE));
        let back = MemoryOperand::with_base_displ(RSP, i64::from(RED_ZONE));
        match c.ret_addr {
            Some(_) => {
                self.call(if skip { stubs.skip_call } else { stubs.call });
                self.jmp_label(done);
            }
            None => {
                op!(self, Lea_r64_m, RSP, below_red_zone);
                self.call(if skip {
                    stubs.skip_jump_call
                } else {
                    stubs.jump_call
                });
                let start = self.here();
                op!(self, Lea_r64_m, RSP, back);
                debug_assert_eq!(self.here() - start, 8);
                self.jmp_label(done);
                op!(self, Lea_r64_m, RSP, back);
            }
        }
    }

    /// The shared code of inline direct calls (`Tagged::inline_call`, or
    /// `Tagged::inline_jump_call` for a direct jump Callgrind takes for a
    /// call if `kind.jump`; into skipped code if `kind.skip`), one copy
    /// per chunk, which [`Emitter::tagged_call_site`] calls: the calling
    /// block's memos (its id times [`MEMO_WORDS`]) in RCX, the callee's
    /// function in R9 (the client's in their spill slots) and, into
    /// skipped code, the call's address in a spill slot; returns past its
    /// site's jump to the callee's body if not done, the calling block
    /// stored as `hot::LAST`; every register and flag the site's. `recs`
    /// is `--separate-recs`.
    pub fn tagged_call_stub(&mut self, kind: CallKind, recs: u32) {
        let failed = self.new_label();
        // The client's stack pointer while it works (a jump's site stepped
        // over the red zone).
        let over = if kind.jump { 8 + RED_ZONE } else { 8 };
        self.stub_enter(over);
        self.call_body(kind, recs, failed);
        self.restore_registers(&KEPT);
        self.stub_return(over);
        self.bind(failed);
        // The block leaves for the callee's context entry, which reads
        // which block it was (its site left that store to this path: RCX
        // is still its memos, its id times MEMO_WORDS). (The flags come
        // back from AX.)
        op!(self, Shr_rm64_imm8, RCX, MEMO_SHIFT);
        op!(self, Mov_rm64_r64, hot_word(hot::LAST), RCX);
        let skip = if kind.jump {
            JUMP_CALL_FAIL_SKIP
        } else {
            CALL_FAIL_SKIP
        };
        op!(
            self,
            Add_rm64_imm8,
            MemoryOperand::with_base_displ(RSP, -i64::from(over)),
            skip
        );
        self.restore_registers(&KEPT);
        self.stub_return(over);
    }

    /// R9 = the callee's function, from its site.
    fn callee_function(&mut self) {
        op!(self, Mov_r64_rm64, R9, gs(layout::S_TAGGED_FUNCTION));
    }

    /// A direct call's work (`Tagged::inline_call` or
    /// `Tagged::inline_jump_call`), [`KEPT`] kept from here on; to
    /// `failed` with nothing changed (RCX still the calling block's memos)
    /// if a check fails.
    fn call_body(&mut self, kind: CallKind, recs: u32, failed: Label) {
        // A jump's call: the frame's stack pointer not the client's, and
        // no frame it left (the rules do not look at its stack pointer).
        let (frame_sp, ret_addr) = match kind.jump {
            true => (FrameSp::TopOrLast, RetAddr::Emulated),
            false => (FrameSp::Client, RetAddr::Pushed),
        };
        // (Its site kept RCX and R9 and put its arguments there.)
        self.keep_registers(KEPT_BY_STUB);
        if kind.skip {
            // Both are needed again once RCX and R9 are the frame's.
            self.store_gs(RCX, layout::S_TAGGED_BLOCK);
            self.store_gs(R9, layout::S_TAGGED_FUNCTION);
        }
        self.fail_in_handler(R10, failed);
        op!(self, Cmp_rm64_imm8, arena(head::NS_CTX), 0);
        self.jcc_label(JNE, failed);
        self.caller_or_fail(RDX, failed);
        match frame_sp {
            FrameSp::Client => self.room_or_fail(R11, R10, failed),
            _ => self.room_only_or_fail(R11, failed),
        }
        if !kind.skip {
            self.callee_tag(recs, failed);
            self.call_memo_arc(RCX, false, failed);
            self.commit_call(frame_sp, ret_addr, false);
            self.inline_done(!kind.jump);
            return;
        }
        // Into skipped code: either of the memo's calls names the skip
        // record.
        self.either_memo_entry(
            [M_CALL_KEY, M_CALL_KEY + M_CALL2],
            failed,
            |e, key, next| {
                op!(e, Cmp_rm32_r32, memo_at(RCX, key), EDX);
                e.jcc_label(JNE, next);
                op!(e, Mov_r32_rm32, R10D, memo_at_high(RCX, key));
                op!(e, Cmp_rm32_imm32, R10D, SKIP_TAGS as u32);
                e.jcc_label(JB, next);
            },
        );
        // The frame (no arc), at STACK + depth*8.
        op!(self, Lea_r64_m, RCX, frame_index(R11, 0));
        op!(self, Add_r64_rm64, RCX, arena(head::STACK));
        match frame_sp {
            FrameSp::Client => op!(self, Mov_rm64_r64, arena_at(RCX, 0), RSP),
            _ => {
                self.frame_sp_top_or(R9, false);
                op!(self, Mov_rm64_r64, arena_at(RCX, 0), R9);
                self.callee_function();
            }
        }
        op!(self, Mov_rm32_r32, arena_at(RCX, 16), EDX);
        op!(self, Mov_rm32_r32, arena_at(RCX, 20), R9D);
        self.frame_ret_addr(ret_addr, R9);
        op!(self, Mov_rm64_imm32, arena_at(RCX, 24), -1);
        self.running_ir(R9);
        op!(self, Mov_rm64_r64, arena_at(RCX, 32), R9);
        op!(self, Mov_rm64_imm32, arena_at(RCX, 40), 0);
        op!(self, Mov_r64_rm64, R9, arena(head::NS_SITE));
        op!(self, Mov_rm64_r64, arena_at(RCX, 48), R9);
        op!(self, Add_rm64_imm8, arena(head::DEPTH), 1);
        op!(self, Mov_rm64_r64, arena(head::NS_CTX), RDX);
        op!(self, Mov_r64_rm64, R9, gs(layout::S_TAGGED_TARGET));
        op!(self, Mov_rm64_r64, arena(head::NS_SITE), R9);
        op!(self, Mov_r64_rm64, R9, gs(layout::S_TAGGED_BLOCK));
        op!(self, Shr_rm64_imm8, R9, MEMO_SHIFT);
        op!(self, Mov_rm64_r64, arena(head::NS_BLOCK), R9);
        op!(self, Mov_rm64_r64, hot_word(hot::CUR), R10);
        // Its blocks count in its skip record (the tag less SKIP_TAGS,
        // 1 << 31).
        op!(self, Mov_r32_rm32, R9D, R10D);
        op!(self, And_rm32_imm32, R9D, 0x7fff_ffff);
        op!(self, Mov_rm64_r64, hot_word(hot::NS_SKIP), R9);
        self.inline_done(!kind.jump);
    }

    /// A stub's start: the stack pointer back to the client's, `over`
    /// bytes above the one it was called with ([`Emitter::stub_return`]
    /// undoes it).
    fn stub_enter(&mut self, over: i32) {
        op!(
            self,
            Lea_r64_m,
            RSP,
            MemoryOperand::with_base_displ(RSP, i64::from(over))
        );
    }

    /// A stub's return to its site, the stack pointer `over` bytes above
    /// the one it was called with.
    fn stub_return(&mut self, over: i32) {
        op!(
            self,
            Lea_r64_m,
            RSP,
            MemoryOperand::with_base_displ(RSP, -i64::from(over))
        );
        self.raw(&[0xc3]);
    }

    /// An indirect call's site over the chunk's shared
    /// [`Emitter::tagged_indirect_call_stub`] (`Tagged::inline_indirect_call`),
    /// reached from its lookup once it found the target's translation (in
    /// `S_TARGET`, the client's RAX and RCX in their slots): the calling
    /// block `x`'s memos and id in spill slots; then on to `S_TARGET`.
    pub fn tagged_indirect_call_site(&mut self, x: u32, stubs: TaggedStubs) {
        self.site_args(x, x);
        self.call(stubs.indirect_call);
        self.after_stub_exit();
    }

    /// The shared code of inline indirect calls (one copy per chunk): the
    /// call the calling block's memo knows (with its target), else the
    /// target's (the last indirect call into it), from what its site
    /// ([`Emitter::tagged_indirect_call_site`]) put in spill slots.
    pub fn tagged_indirect_call_stub(&mut self, recs: u32) {
        self.after_lookup_stub(8, |e, out| e.indirect_call_body(recs, out));
    }

    /// A shared stub a site calls after its lookup: `body` works with the
    /// client's stack pointer (`over` bytes above the stub's) and goes on
    /// to `out`, done or not; then the site's registers and flags back and
    /// the return to it.
    fn after_lookup_stub(&mut self, over: i32, body: impl FnOnce(&mut Emitter, Label)) {
        let out = self.new_label();
        self.stub_enter(over);
        body(self, out);
        self.bind(out);
        self.restore_registers(KEPT_AFTER_LOOKUP);
        self.stub_return(over);
    }

    /// `S_TAGGED_BLOCK` = block `x`'s memos, `S_TAGGED_FUNCTION` = `word`:
    /// what a site gives its shared stub.
    fn site_args(&mut self, x: u32, word: u32) {
        debug_assert!(x < 1 << (31 - MEMO_SHIFT) && word < 1 << 31);
        op!(
            self,
            Mov_rm64_imm32,
            gs(layout::S_TAGGED_BLOCK),
            (x << MEMO_SHIFT) as i32
        );
        op!(
            self,
            Mov_rm64_imm32,
            gs(layout::S_TAGGED_FUNCTION),
            word as i32
        );
    }

    /// After a shared stub returned to a site past a lookup: the client's
    /// RAX and RCX back, on to the translation in `S_TARGET`.
    fn after_stub_exit(&mut self) {
        self.load_gs(RCX, layout::S_RCX);
        self.load_gs(RAX, layout::S_RAX);
        self.insn(Instruction::with1(Code::Jmp_rm64, gs(layout::S_TARGET)));
    }

    /// An indirect call's work, on to `out` done or not, with
    /// [`KEPT_AFTER_LOOKUP`] kept.
    fn indirect_call_body(&mut self, recs: u32, out: Label) {
        self.keep_registers(KEPT_AFTER_LOOKUP);
        // The target (not skipped code): its function and id.
        op!(self, Mov_r64_rm64, RCX, gs(layout::S_TARGET));
        op!(
            self,
            Test_rm8_imm8,
            MemoryOperand::with_base_displ(RCX, i64::from(HEADER_FLAGS)),
            2
        );
        self.jcc_label(JNE, out);
        self.indirect_commit(recs, out);
    }

    /// The call of an inline indirect call into the target whose header is
    /// at RCX (not skipped code): the call its memo knows from the block
    /// its site names; else to `out`.
    fn indirect_commit(&mut self, recs: u32, out: Label) {
        op!(
            self,
            Mov_r32_rm32,
            R9D,
            MemoryOperand::with_base_displ(RCX, i64::from(HEADER_FUNCTION))
        );
        self.fail_in_handler(RCX, out);
        op!(self, Cmp_rm64_imm8, arena(head::NS_CTX), 0);
        self.jcc_label(JNE, out);
        self.caller_or_fail(RDX, out);
        self.room_or_fail(RCX, R10, out);
        self.callee_tag(recs, out);
        // The calling block's memo, else the callee's (its id again from
        // its header).
        // (The site gave the calling block's id in S_TAGGED_FUNCTION.)
        self.call_or_callee_memo_arc(out, |e| {
            op!(e, Mov_r64_rm64, RCX, gs(layout::S_TAGGED_FUNCTION));
        });
        self.commit_call(FrameSp::Client, RetAddr::Pushed, false);
        self.inline_done(true);
        self.skip_target_entry();
    }

    /// R11 = the arc of a call through a pointer
    /// (`Tagged::call_or_callee_memo`) under the key of the caller's tag
    /// in EDX and the callee's in R10D: the one the calling block's memo
    /// knows (with the guest target in `S_TAGGED_TARGET`), else the
    /// target's (its header at `S_TARGET`) if its last call in came from
    /// the calling block, whose id `from` puts in RCX; else to `out`. RCX
    /// changes.
    fn call_or_callee_memo_arc(&mut self, out: Label, from: impl FnOnce(&mut Emitter)) {
        let (callee_memo, found) = (self.new_label(), self.new_label());
        op!(self, Mov_r64_rm64, R11, gs(layout::S_TAGGED_BLOCK));
        self.call_memo_arc(R11, true, callee_memo);
        self.jmp_label(found);
        self.bind(callee_memo);
        op!(self, Mov_r64_rm64, R11, gs(layout::S_TARGET));
        op!(
            self,
            Mov_r32_rm32,
            Register::R11D,
            MemoryOperand::with_base_displ(R11, i64::from(HEADER_ID))
        );
        op!(self, Shl_rm64_imm8, R11, MEMO_SHIFT);
        op!(self, Cmp_rm32_r32, memo_at(R11, M_IN_KEY), EDX);
        self.jcc_label(JNE, out);
        op!(self, Cmp_rm32_r32, memo_at_high(R11, M_IN_KEY), R10D);
        self.jcc_label(JNE, out);
        from(self);
        op!(self, Cmp_rm64_r64, memo_at(R11, M_IN_FROM), RCX);
        self.jcc_label(JNE, out);
        op!(self, Mov_r64_rm64, R11, memo_at(R11, M_IN_ARC));
        self.bind(found);
    }

    /// An indirect jump's site (block `x`, code of `domain`) over the
    /// chunk's shared [`Emitter::tagged_jump_stub`] (`calls`: the one that
    /// may call), reached from its lookup once it found the target's
    /// translation: over the red zone (the jumping function may still have
    /// data there), then on to `S_TARGET`.
    pub fn tagged_jump_site(&mut self, x: u32, domain: u32, calls: bool, stubs: TaggedStubs) {
        self.site_args(x, crate::translate::header_word(domain, false, false));
        op!(
            self,
            Lea_r64_m,
            RSP,
            MemoryOperand::with_base_displ(RSP, -i64::from(RED_ZONE))
        );
        self.call(if calls { stubs.jump_calls } else { stubs.jump });
        op!(
            self,
            Lea_r64_m,
            RSP,
            MemoryOperand::with_base_displ(RSP, i64::from(RED_ZONE))
        );
        self.after_stub_exit();
    }

    /// The shared code of inline indirect jumps (one copy per chunk), from
    /// what its site ([`Emitter::tagged_jump_site`]) put in spill slots:
    /// the target's header (`translate::tagged_header`) says what it is:
    /// one that keeps the context (`Tagged::inline_jump`), or a tail call
    /// the jumping block's memo or the target's knows
    /// (`Tagged::inline_indirect_jump_call`;
    /// `recs` `--separate-recs`, `None` in the stub that does none).
    pub fn tagged_jump_stub(&mut self, recs: Option<u32>) {
        // (Its site stepped over the red zone.)
        let over = 8 + RED_ZONE;
        let out = self.new_label();
        self.stub_enter(over);
        self.save_flags_to_ax();
        self.jump_body(recs, out);
        self.bind(out);
        self.restore_flags_from_ax();
        self.stub_return(over);
    }

    /// An indirect jump's work, on to `out` done or not, the flags in AX.
    /// A jump that keeps the context (an interpreter's dispatch: the
    /// commonest) works in RCX alone, which the lookup kept with RAX; a
    /// call keeps [`KEPT_AFTER_LOOKUP`] too.
    fn jump_body(&mut self, recs: Option<u32>, out: Label) {
        let call = self.new_label();
        // Not a function's start nor another domain (skipped or not): the
        // context stays.
        op!(self, Mov_r64_rm64, RCX, gs(layout::S_TARGET));
        let flags = MemoryOperand::with_base_displ(RCX, i64::from(HEADER_FLAGS));
        op!(self, Mov_r32_rm32, ECX, flags);
        op!(self, And_rm32_imm8, ECX, !2);
        // (The jumping block's domain's header word, from its site.)
        op!(self, Cmp_r32_rm32, ECX, gs(layout::S_TAGGED_FUNCTION));
        self.jcc_label(JNE, call);
        self.fail_in_handler(RCX, out);
        op!(self, Cmp_rm64_imm8, arena(head::CTX), 0);
        self.jcc_label(JE, out);
        // No frame the stack pointer has left (a `longjmp`).
        op!(self, Mov_r64_rm64, RCX, arena(head::DEPTH));
        self.no_frame_left_or_fail(RCX, RCX, out);
        self.inline_done(true);
        self.skip_target_entry();
        self.jmp_label(out);
        // A call, into code not skipped, that the jumping block's memo
        // knows (the guest target in S_TAGGED_TARGET).
        self.bind(call);
        if let Some(recs) = recs {
            let kept = self.new_label();
            self.keep_registers_only(KEPT_AFTER_LOOKUP);
            op!(self, Mov_r64_rm64, RCX, gs(layout::S_TARGET));
            op!(self, Test_rm8_imm8, flags, 2);
            self.jcc_label(JNE, kept);
            op!(
                self,
                Mov_r32_rm32,
                R9D,
                MemoryOperand::with_base_displ(RCX, i64::from(HEADER_FUNCTION))
            );
            self.fail_in_handler(RCX, kept);
            op!(self, Cmp_rm64_imm8, arena(head::NS_CTX), 0);
            self.jcc_label(JNE, kept);
            self.caller_or_fail(RDX, kept);
            self.room_or_fail(RCX, R10, kept);
            self.callee_tag(recs, kept);
            // (The site gave the jumping block's memos in S_TAGGED_BLOCK:
            // its id times MEMO_WORDS.)
            self.call_or_callee_memo_arc(kept, |e| {
                op!(e, Mov_r64_rm64, RCX, gs(layout::S_TAGGED_BLOCK));
                op!(e, Shr_rm64_imm8, RCX, MEMO_SHIFT);
            });
            self.commit_call(FrameSp::TopOrClient, RetAddr::Emulated, false);
            self.inline_done(true);
            self.skip_target_entry();
            self.bind(kept);
            self.unspill_registers(KEPT_AFTER_LOOKUP);
        }
    }

    /// Skipped code's inline call out (`Tagged::inline_skipped_call`):
    /// the PLT's indirect jump (code of `domain`) into a function, reached
    /// from its lookup once it found the target's translation, the guest
    /// target in `S_TAGGED_TARGET`: the call the memo of the block that
    /// called the skipped code knows.
    pub fn tagged_skipped_call(&mut self, domain: u32, recs: u32) {
        let (out, call) = (self.new_label(), self.new_label());
        self.keep_registers(KEPT_AFTER_LOOKUP);
        // Not skipped code, and a call: a function's start or another
        // domain.
        op!(self, Mov_r64_rm64, RCX, gs(layout::S_TARGET));
        op!(
            self,
            Mov_r32_rm32,
            R9D,
            MemoryOperand::with_base_displ(RCX, i64::from(HEADER_FLAGS))
        );
        op!(self, Test_rm8_imm8, R9L, 2);
        self.jcc_label(JNE, out);
        op!(self, Test_rm8_imm8, R9L, 1);
        self.jcc_label(JNE, call);
        op!(self, Shr_rm32_imm8, R9D, 2);
        op!(self, Cmp_rm32_imm32, R9D, domain);
        self.jcc_label(JE, out);
        self.bind(call);
        op!(
            self,
            Mov_r32_rm32,
            R9D,
            MemoryOperand::with_base_displ(RCX, i64::from(HEADER_FUNCTION))
        );
        self.fail_in_handler(RCX, out);
        op!(self, Cmp_rm64_imm8, arena(head::CTX), 0);
        self.jcc_label(JE, out);
        // In skipped code entered from block R11 (its id), a frame under.
        op!(self, Mov_r64_rm64, RDX, arena(head::NS_CTX));
        op!(self, Test_rm64_r64, RDX, RDX);
        self.jcc_label(JE, out);
        op!(self, Mov_r64_rm64, R11, arena(head::NS_BLOCK));
        op!(self, Cmp_rm64_imm8, R11, -1);
        self.jcc_label(JE, out);
        op!(self, Cmp_rm64_imm8, arena(head::DEPTH), 0);
        self.jcc_label(JE, out);
        self.room_or_fail(RCX, R10, out);
        self.callee_tag(recs, out);
        op!(self, Shl_rm64_imm8, R11, MEMO_SHIFT);
        // Either of the two calls out the memo keeps (R11 is its memos
        // until an entry matches).
        op!(self, Mov_r64_rm64, RCX, gs(layout::S_TAGGED_TARGET));
        self.either_memo_entry([M_PLT_KEY, M_PLT_KEY + M_PLT2], out, |e, key, next| {
            e.memo_entry_arc(R11, key, true, next);
        });
        self.commit_call(FrameSp::Top, RetAddr::Emulated, true);
        self.inline_done(true);
        self.skip_target_entry();
        self.bind(out);
        self.after_lookup_exit();
    }

    /// The shared code of inline returns (`Tagged::inline_return`), one
    /// copy per chunk that a return site calls right after its lookup
    /// found the target's translation (its context entry in `S_TARGET`,
    /// the client's RAX and RCX in their slots; the return's stack slot
    /// and those under it are dead, so the call may push there): when
    /// done, `S_TARGET` is past the context entry; else nothing changed
    /// and the context entry decides. Returns with every register and
    /// flag the site's.
    pub fn tagged_return_stub(&mut self) {
        let (out, multi) = (self.new_label(), self.new_label());
        // (The client's stack pointer while it works.)
        self.stub_enter(8);
        // The commonest return leaves one frame, with two registers kept;
        // more frames take two more (`multi`).
        self.keep_registers(RETURN_KEPT);
        self.fail_in_handler(RCX, out);
        op!(self, Mov_r64_rm64, RDX, arena(head::DEPTH));
        op!(self, Test_rm64_r64, RDX, RDX);
        self.jcc_label(JE, out);
        // R11 = the top frame's word offset; it is left (its stack pointer
        // below ours).
        self.top_frame(R11, RDX);
        op!(self, Cmp_rm64_r64, arena_at(R11, 0), RSP);
        self.jcc_label(JAE, out);
        let single = self.new_label();
        op!(self, Cmp_rm64_imm8, RDX, 1);
        self.jcc_label(JE, single);
        op!(self, Cmp_rm64_r64, arena_at(R11, -FRAME_BYTES), RSP);
        self.jcc_label(JB, multi);
        self.bind(single);
        // Back to a context's own code, not into skipped code.
        op!(self, Cmp_rm64_imm8, arena_at(R11, 40), 0);
        self.jcc_label(JNE, out);
        self.commit_return_frame(R11);
        self.commit_return(R11, None);
        self.jmp_label(out);
        self.bind(multi);
        let multi_out = self.new_label();
        self.keep_registers_only(RETURN_MORE_KEPT);
        self.tagged_return_frames(multi_out);
        self.bind(multi_out);
        self.unspill_registers(RETURN_MORE_KEPT);
        self.bind(out);
        self.restore_registers(RETURN_KEPT);
        self.stub_return(8);
    }

    /// A return site over the shared [`Emitter::tagged_return_stub`] at
    /// `stub`: then on to `S_TARGET` with the client's RAX and RCX back.
    pub fn tagged_return_site(&mut self, stub: u64) {
        self.call(stub);
        self.after_stub_exit();
    }

    /// A return that leaves more than one frame (the top, at the word
    /// offset in R11, and those under it the stack pointer left too, up to
    /// INLINE_POPS, of the DEPTH in RDX), on to `out` done or not.
    fn tagged_return_frames(&mut self, out: Label) {
        let popped = self.new_label();
        let (scan, commit, committed) = (self.new_label(), self.new_label(), self.new_label());
        // R9 = the last frame it leaves, R10 = how many.
        op!(self, Mov_r64_rm64, R9, R11);
        op!(self, Mov_r32_imm32, R10D, 1);
        self.bind(scan);
        op!(self, Cmp_r64_rm64, R10, RDX);
        self.jcc_label(JE, popped);
        op!(self, Cmp_rm64_r64, arena_at(R9, -FRAME_BYTES), RSP);
        self.jcc_label(JAE, popped);
        op!(self, Cmp_rm64_imm8, R10, INLINE_POPS as i32);
        self.jcc_label(JE, out);
        op!(
            self,
            Lea_r64_m,
            R9,
            MemoryOperand::with_base_displ(R9, -(FRAME_WORDS as i64))
        );
        op!(self, Add_rm64_imm8, R10, 1);
        self.jmp_label(scan);
        self.bind(popped);
        // Back to a context's own code, not into skipped code.
        op!(self, Cmp_rm64_imm8, arena_at(R9, 40), 0);
        self.jcc_label(JNE, out);
        // From the top (R11) down to R9.
        self.bind(commit);
        self.commit_return_frame(R11);
        op!(self, Cmp_r64_rm64, R11, R9);
        self.jcc_label(JE, committed);
        op!(
            self,
            Lea_r64_m,
            R11,
            MemoryOperand::with_base_displ(R11, -(FRAME_WORDS as i64))
        );
        self.jmp_label(commit);
        self.bind(committed);
        self.commit_return(R9, Some(R10));
        self.jmp_label(out);
    }

    /// A frame a return leaves, at the word offset in `frame`: its arc
    /// gets its call's inclusive Ir, its function is active once less.
    /// RCX and RDX change.
    fn commit_return_frame(&mut self, frame: Register) {
        let next = self.new_label();
        op!(self, Mov_r64_rm64, RDX, arena_at(frame, 24));
        op!(self, Cmp_rm64_imm8, RDX, -1);
        self.jcc_label(JE, next);
        op!(self, Lea_r64_m, RDX, based_indexed(RDX, RDX, 4, 0));
        op!(self, Add_r64_rm64, RDX, arena(head::ARCS));
        self.running_ir(RCX);
        op!(self, Sub_r64_rm64, RCX, arena_at(frame, 32));
        op!(self, Add_rm64_r64, arena_at(RDX, ARC_INCLUSIVE), RCX);
        op!(self, Mov_r32_rm32, ECX, arena_at(frame, 20));
        op!(self, Add_r64_rm64, RCX, arena(head::ACTIVE));
        op!(self, Cmp_rm64_imm8, arena_at(RCX, 0), 0);
        self.jcc_label(JE, next);
        op!(self, Sub_rm64_imm8, arena_at(RCX, 0), 1);
        self.bind(next);
    }

    /// The end of an inline return whose last frame left is at the word
    /// offset in `last`: back in its caller's context, `pops` frames fewer
    /// (the register's count; one if `None`). RCX changes.
    fn commit_return(&mut self, last: Register, pops: Option<Register>) {
        op!(self, Mov_r32_rm32, ECX, arena_at(last, 16));
        op!(self, Mov_rm64_r64, arena(head::CTX), RCX);
        op!(self, Mov_rm64_r64, hot_word(hot::CUR), RCX);
        // Out of skipped code, if in it (outside, both words say so).
        let outside = self.new_label();
        op!(self, Cmp_rm64_imm8, arena(head::NS_CTX), 0);
        self.jcc_label(JE, outside);
        op!(self, Mov_rm64_imm32, hot_word(hot::NS_SKIP), -1);
        op!(self, Mov_rm64_imm32, arena(head::NS_CTX), 0);
        self.bind(outside);
        match pops {
            Some(r) => op!(self, Sub_rm64_r64, arena(head::DEPTH), r),
            None => op!(self, Sub_rm64_imm8, arena(head::DEPTH), 1),
        }
        self.inline_done(true);
        self.skip_target_entry();
    }
}
