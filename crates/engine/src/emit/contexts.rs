//! Contexts mode (`docs/client-contexts.md`): what translated code adds
//! so that the client keeps its own calling contexts. A block's *context
//! entry* calls the runtime (`ctxrt`, in the core region) before its
//! body; its body counts its Ir into the current context's counters and
//! the thread's running Ir; every block stores its id before it leaves,
//! the block the runtime's next decision starts from.

use super::{based, based_indexed, gs, gs_indexed, Emitter, Label};
use crate::layout;
use crate::translate::ContextBlock;
use ctxrt::hot;

/// Tagged counting: a count's check of its slot's second half, emitted
/// out of line by [`Emitter::context_grow`].
#[derive(Debug, Clone, Copy)]
pub struct SecondHalf {
    /// Where the first half's check goes when it fails.
    miss: Label,
    /// Where the count goes on (the running Ir).
    done: Label,
    /// The slot's offset in the thread area.
    slot: u32,
    /// What the count adds: a register's value or a number.
    value: Result<Register, u32>,
}
use iced_x86::{Code, Instruction, MemoryOperand, Register};

/// Thread-area offset of hot word `i`.
fn hot_word(i: usize) -> u32 {
    layout::S_CONTEXT_HOT + 8 * i as u32
}

/// An absolute address below 2 GiB (the core region's), as 64-bit
/// addressing's sign-extended 32 bits (given as 32-bit addressing, iced
/// adds an address-size prefix).
fn absolute(addr: u64) -> MemoryOperand {
    MemoryOperand::new(
        Register::None,
        Register::None,
        1,
        addr as i64,
        8,
        false,
        Register::None,
    )
}

/// Bytes of a block's context entry ([`Emitter::context_entry`]): its
/// body starts this far past it.
pub const CONTEXT_ENTRY_BYTES: u64 = 25;

/// Counters every context has (the runtime's first allocation): a block
/// numbered below it needs no bounds check.
pub const UNCHECKED: u32 = ctxrt::FIRST_COUNTERS as u32;

impl Emitter {
    /// A call of the runtime stub with `arg` (a block id to enter, or the
    /// complement of one whose counters must grow) above the red zone:
    /// `lea rsp, [rsp-128]; push arg; call [stub]; lea rsp, [rsp+136]`.
    /// Flags and registers survive (the stub keeps them).
    fn call_runtime(&mut self, core: u64, arg: i32) {
        self.insn(Instruction::with2(
            Code::Lea_r64_m,
            Register::RSP,
            based(Register::RSP, -128),
        ));
        self.insn(Instruction::with1(Code::Pushq_imm32, arg));
        self.insn(Instruction::with1(
            Code::Call_rm64,
            absolute(core + layout::RT_STUB_PTR),
        ));
        self.insn(Instruction::with2(
            Code::Lea_r64_m,
            Register::RSP,
            based(Register::RSP, 136),
        ));
    }

    /// A block's context entry: the runtime enters block `id`.
    pub fn context_entry(&mut self, core: u64, id: u32) {
        self.call_runtime(core, id as i32);
    }

    /// `lea rsp, [rsp-128]; pushfq` (`keep`) or `popfq; lea rsp,
    /// [rsp+128]`: the flags kept on the stack, below the red zone, around
    /// a count where they are live.
    pub fn keep_flags_on_stack(&mut self, keep: bool) {
        if keep {
            self.insn(Instruction::with2(
                Code::Lea_r64_m,
                Register::RSP,
                based(Register::RSP, -128),
            ));
            self.insn(Ok(Instruction::with(Code::Pushfq)));
        } else {
            self.insn(Ok(Instruction::with(Code::Popfq)));
            self.insn(Instruction::with2(
                Code::Lea_r64_m,
                Register::RSP,
                based(Register::RSP, 128),
            ));
        }
    }

    /// `mov gs:[S_RAX], rax; lahf; seto al` (`keep`) or `add al, 0x7f;
    /// sahf; mov rax, gs:[S_RAX]`: the arithmetic flags kept in AX, RAX
    /// in its spill slot, around a count where they are live (`popfq`
    /// costs tens of cycles: bzip2's blocks of a lone `jcc` spent a sixth
    /// of its translated code's time there).
    pub fn keep_flags_in_ax(&mut self, keep: bool) {
        if keep {
            self.store_gs(Register::RAX, layout::S_RAX);
            self.save_flags_to_ax();
        } else {
            self.restore_flags_from_ax();
            self.load_gs(Register::RAX, layout::S_RAX);
        }
    }

    /// `mov qword gs:[LAST], id`: block `id` is about to leave (flag-free;
    /// the runtime reads it at the next context entry), by `ret` if
    /// `returns` (tagged with `hot::RETURN_TAG`).
    pub fn store_last(&mut self, id: u32, returns: bool) {
        let tag = if returns { hot::RETURN_TAG } else { 0 };
        self.insn(Instruction::with2(
            Code::Mov_rm64_imm32,
            gs(hot_word(hot::LAST)),
            (u64::from(id) | tag) as i32,
        ));
    }

    /// Counts an execution of block `cb` (`instrs` instructions) through
    /// register `r`, with the flags dead: `mov r, gs:[CUR]`, a bounds
    /// check for blocks whose last counter word is past [`UNCHECKED`] (out
    /// of line, the runtime grows the counters and the count goes on),
    /// then `add [r + 8*index], instrs; add gs:[IR], instrs`. Returns the
    /// label of the out-of-line growth, to be bound by
    /// [`Emitter::context_grow`] after the block's code, if any.
    pub fn context_count(
        &mut self,
        r: Register,
        cb: ContextBlock,
        instrs: u32,
    ) -> Option<(Label, Label, u32)> {
        self.context_add(r, cb, Err(instrs))
    }

    /// Counts an execution of block number `index` (below [`UNCHECKED`]:
    /// no bounds check) of `instrs` instructions through register `r`,
    /// without touching the flags: a second register is kept in its spill
    /// slot meanwhile, and the counter and the running Ir are each loaded,
    /// added to with `lea` and stored.
    pub fn context_count_flag_free(&mut self, r: Register, index: u32, instrs: u32) {
        debug_assert!(index < UNCHECKED);
        let (s, slot) = if r == Register::RCX {
            (Register::RDX, layout::S_RDX)
        } else {
            (Register::RCX, layout::S_RCX)
        };
        self.store_gs(s, slot);
        self.load_gs(r, hot_word(hot::CUR));
        let counter = MemoryOperand::with_base_displ(r, 8 * i64::from(index));
        let bump = MemoryOperand::with_base_displ(s, i64::from(instrs));
        self.insn(Instruction::with2(Code::Mov_r64_rm64, s, counter));
        self.insn(Instruction::with2(Code::Lea_r64_m, s, bump));
        self.insn(Instruction::with2(Code::Mov_rm64_r64, counter, s));
        self.load_gs(s, hot_word(hot::IR));
        self.insn(Instruction::with2(Code::Lea_r64_m, s, bump));
        self.store_gs(s, hot_word(hot::IR));
        self.load_gs(s, slot);
    }

    /// [`Emitter::context_count`] adding register `value` (a rep string
    /// instruction's count) instead of a number.
    pub fn context_count_reg(
        &mut self,
        r: Register,
        cb: ContextBlock,
        value: Register,
    ) -> Option<(Label, Label, u32)> {
        self.context_add(r, cb, Ok(value))
    }

    fn context_add(
        &mut self,
        r: Register,
        cb: ContextBlock,
        value: Result<Register, u32>,
    ) -> Option<(Label, Label, u32)> {
        if cb.tagged {
            return Some(self.tagged_add(r, cb, value));
        }
        let cur = hot_word(hot::CUR);
        self.load_gs(r, cur);
        let mut grow = None;
        let back = self.new_label();
        let index = cb.index;
        if cb.last >= UNCHECKED {
            self.insn(Instruction::with2(
                Code::Cmp_rm64_imm32,
                based(r, -8),
                cb.last as i32,
            ));
            let l = self.new_label();
            self.jcc_label(6, l); // jbe: the counters end at or before it
            grow = Some((l, back, cb.id));
        }
        self.bind(back);
        let counter = MemoryOperand::with_base_displ(r, 8 * i64::from(index));
        let ir = gs(hot_word(hot::IR));
        self.add_value(counter, value);
        self.add_value(ir, value);
        grow
    }

    /// `add qword [to], value`: a register (a rep string instruction's
    /// count) or a number, with a one-byte immediate when it fits one (a
    /// block's instruction count nearly always does: three bytes less per
    /// add, and tagged counting makes two in every block).
    fn add_value(&mut self, to: MemoryOperand, value: Result<Register, u32>) {
        let add = match value {
            Ok(v) => Instruction::with2(Code::Add_rm64_r64, to, v),
            Err(n) if i8::try_from(n).is_ok() => {
                Instruction::with2(Code::Add_rm64_imm8, to, n as i32)
            }
            Err(n) => Instruction::with2(Code::Add_rm64_imm32, to, n as i32),
        };
        self.insn(add);
    }

    /// Tagged counting's count (flags dead, through `r`): `mov r,
    /// gs:[CUR]; cmp gs:[tag], r; jne retag; add gs:[ir], n; add gs:[IR],
    /// n` on the block's slot. Returns the out-of-line retag (the runtime
    /// gives the slot the current tag, then the count goes on), bound by
    /// [`Emitter::context_grow`]. Skipped code counts in the skip record
    /// the current tag names, if it names one (`hot::NS_SKIP`), else in
    /// its slot: the PLT runs for many call sites.
    fn tagged_add(
        &mut self,
        r: Register,
        cb: ContextBlock,
        value: Result<Register, u32>,
    ) -> (Label, Label, u32) {
        let done = self.new_label();
        if cb.skip {
            let (slot, start) = (self.new_label(), self.here());
            self.load_gs(r, hot_word(hot::NS_SKIP));
            self.insn(Instruction::with2(Code::Cmp_rm64_imm8, r, -1));
            self.jcc_label(4, slot); // je
            self.insn(Instruction::with2(
                Code::Lea_r64_m,
                r,
                based_indexed(r, r, 2, 0),
            ));
            let skips = layout::AREA_TAGGED_ARENA as u32 + 8 * ctxrt::tagged::head::SKIPS as u32;
            self.insn(Instruction::with2(Code::Add_r64_rm64, r, gs(skips)));
            let ir = layout::AREA_TAGGED_ARENA as i32 + 8 * ctxrt::tagged::SKIP_IR as i32;
            self.add_value(gs_indexed(r, ir as u32), value);
            // (A handler run between the record's address and the add
            // could move the records: the thread is stepped out first.)
            self.quiet.push(start..self.here());
            self.jmp_label(done);
            self.bind(slot);
        }
        let slot = layout::AREA_SLOTS as u32 + 8 * ctxrt::tagged::SLOT_WORDS as u32 * cb.id;
        self.load_gs(r, hot_word(hot::CUR));
        self.insn(Instruction::with2(Code::Cmp_rm64_r64, gs(slot), r));
        let miss = self.new_label();
        self.jcc_label(5, miss); // jne
        let back = self.new_label();
        self.bind(back);
        self.add_value(gs(slot + 8), value);
        self.bind(done);
        self.add_value(gs(hot_word(hot::ir_word(cb.id))), value);
        // The slot's second half, out of line (`Emitter::context_grow`).
        self.second_halves.push(SecondHalf {
            miss,
            done,
            slot,
            value,
        });
        (miss, back, cb.id)
    }

    /// Tagged counting: where a count whose slot's first half counts for
    /// another tag goes on (bound at `miss`, with `r` the current tag): its
    /// second half if that one counts for it, else to `retag`.
    fn second_half(&mut self, miss: Label, r: Register, retag: Label) {
        let Some(i) = self.second_halves.iter().position(|h| h.miss == miss) else {
            self.bind(miss);
            self.jmp_label(retag);
            return;
        };
        let h = self.second_halves.swap_remove(i);
        self.bind(miss);
        self.insn(Instruction::with2(Code::Cmp_rm64_r64, gs(h.slot + 16), r));
        self.jcc_label(5, retag); // jne
        self.add_value(gs(h.slot + 24), h.value);
        self.jmp_label(h.done);
    }

    /// Moves a rep string instruction's count from its thread counter at
    /// `ctr` (Cachegrind's n+1 rule, `Emitter::count_rep`) into the
    /// current context's counter of block `cb`,
    /// keeping the flags and every register.
    pub fn context_rep_count(&mut self, ctr: u32, cb: ContextBlock) -> Option<(Label, Label, u32)> {
        self.keep_flags_on_stack(true);
        self.store_gs(Register::RAX, layout::S_RAX);
        self.store_gs(Register::RCX, layout::S_RCX);
        self.load_gs(Register::RAX, ctr);
        self.insn(Instruction::with2(Code::Mov_rm64_imm32, gs(ctr), 0));
        let grow = self.context_count_reg(Register::RCX, cb, Register::RAX);
        self.load_gs(Register::RCX, layout::S_RCX);
        self.load_gs(Register::RAX, layout::S_RAX);
        self.keep_flags_on_stack(false);
        grow
    }

    /// The out-of-line growth of [`Emitter::context_count`]: the runtime
    /// grows the counters for block `id`, `r` is loaded again, and the
    /// count goes on at `back`.
    pub fn context_grow(&mut self, core: u64, grow: Label, back: Label, r: Register, id: u32) {
        if self.second_halves.iter().any(|h| h.miss == grow) {
            let retag = self.new_label();
            self.second_half(grow, r, retag);
            self.bind(retag);
        } else {
            self.bind(grow);
        }
        self.call_runtime(core, !(id as i32));
        self.load_gs(r, hot_word(hot::CUR));
        self.jmp_label(back);
    }

    /// The runtime stub (at `core + RT_STUB`): entered by
    /// [`Emitter::call_runtime`] with the argument above the return
    /// address, it keeps the arithmetic flags (`seto`/`lahf`, put back by
    /// `add`/`sahf`: `popfq` costs more than all the rest; the runtime
    /// leaves the other flags alone), the caller-saved general registers and
    /// the XMM registers in `xmm` (those the runtime's code uses), aligns
    /// the stack, and calls `cs_runtime(op, hot, config, block, sp)` with
    /// the thread's hot words (GS base plus their offset) and the client's
    /// stack pointer at the entry. A runtime error exits to the tool
    /// ([`layout::MAGIC_RUNTIME`], the code in RAX). Returns the exit
    /// window (see [`Emitter::context_entry_stub`]).
    pub fn runtime_stub(&mut self, core: u64, xmm: &[Register]) -> std::ops::Range<u64> {
        self.insn(Instruction::with1(Code::Push_r64, Register::RAX));
        self.insn(Instruction::with1(Code::Seto_rm8, Register::AL));
        self.insn(Ok(Instruction::with(Code::Lahf)));
        self.insn(Instruction::with1(Code::Push_r64, Register::RAX));
        for r in RUNTIME_SAVED {
            self.insn(Instruction::with1(Code::Push_r64, r));
        }
        // RBX (kept by the callee) holds the stack pointer past the saves.
        self.insn(Instruction::with2(
            Code::Mov_r64_rm64,
            Register::RBX,
            Register::RSP,
        ));
        self.insn(Instruction::with2(Code::And_rm64_imm8, Register::RSP, -16));
        let area = 16 * xmm.len() as i32;
        if area > 0 {
            self.insn(Instruction::with2(
                Code::Sub_rm64_imm32,
                Register::RSP,
                area,
            ));
        }
        for (i, &x) in xmm.iter().enumerate() {
            let slot = based(Register::RSP, 16 * i as i32);
            self.insn(Instruction::with2(Code::Movdqu_xmmm128_xmm, slot, x));
        }
        // Above RBX: the saves (11 words with RAX and the flags), the
        // return address, the argument, then the 128 bytes skipped.
        let saves = 8 * (RUNTIME_SAVED.len() as i32 + 2);
        let arg = based(Register::RBX, saves + 8);
        self.insn(Instruction::with2(Code::Mov_r64_rm64, Register::RCX, arg));
        // op: 1 (grow) for a complemented id, else 0.
        self.insn(Instruction::with2(
            Code::Mov_r64_rm64,
            Register::RDI,
            Register::RCX,
        ));
        self.insn(Instruction::with2(Code::Shr_rm64_imm8, Register::RDI, 63));
        // block: the id either way (`rcx ^ (0 - op)`, i.e. not for grow).
        self.insn(Instruction::with2(
            Code::Mov_r64_rm64,
            Register::RAX,
            Register::RDI,
        ));
        self.insn(Instruction::with1(Code::Neg_rm64, Register::RAX));
        self.insn(Instruction::with2(
            Code::Xor_r64_rm64,
            Register::RCX,
            Register::RAX,
        ));
        self.insn(Instruction::with1(Code::Rdgsbase_r64, Register::RSI));
        self.insn(Instruction::with2(
            Code::Add_rm64_imm32,
            Register::RSI,
            layout::S_CONTEXT_HOT as i32,
        ));
        self.insn(Instruction::with2(
            Code::Mov_r32_imm32,
            Register::EDX,
            (core + layout::RT_CONFIG) as u32,
        ));
        self.insn(Instruction::with2(
            Code::Lea_r64_m,
            Register::R8,
            based(Register::RBX, saves + 16 + 128),
        ));
        self.insn(Instruction::with1(
            Code::Call_rm64,
            absolute(core + layout::RT_ENTRY_PTR),
        ));
        let fail = self.new_label();
        self.insn(Instruction::with2(
            Code::Test_rm64_r64,
            Register::RAX,
            Register::RAX,
        ));
        self.jcc_label(5, fail); // jne
                                 // A signal that arrived meanwhile waits for the entry's end (see
                                 // `layout::S_SIGNAL_WAITS`): the exit traps instead of returning.
        let waits = self.new_label();
        let window = self.here();
        self.insn(Instruction::with2(
            Code::Cmp_rm64_imm8,
            gs(layout::S_SIGNAL_WAITS),
            0,
        ));
        self.jcc_label(5, waits); // jne
        self.runtime_stub_exit(xmm, Code::Retnq);
        let window = window..self.here();
        self.bind(waits);
        self.runtime_stub_exit(xmm, Code::Int3);
        self.bind(fail);
        self.insn(Instruction::with2(
            Code::Mov_rm64_r64,
            gs(layout::S_TARGET),
            Register::RAX,
        ));
        self.magic_syscall(layout::MAGIC_RUNTIME);
        self.insn(Ok(Instruction::with(Code::Ud2)));
        window
    }
}

/// Registers the runtime stub pushes after RAX and the arithmetic flags
/// (in AX).
const RUNTIME_SAVED: [Register; 9] = [
    Register::RCX,
    Register::RDX,
    Register::RSI,
    Register::RDI,
    Register::R8,
    Register::R9,
    Register::R10,
    Register::R11,
    Register::RBX,
];

impl Emitter {
    /// The runtime stub's way out (RBX = the stack past its saves): the
    /// XMM registers, the saved ones and the flags back, then `last` (a
    /// return, or the trap a waiting signal is delivered from).
    fn runtime_stub_exit(&mut self, xmm: &[Register], last: Code) {
        for (i, &x) in xmm.iter().enumerate() {
            let slot = based(Register::RSP, 16 * i as i32);
            self.insn(Instruction::with2(Code::Movdqu_xmm_xmmm128, x, slot));
        }
        self.insn(Instruction::with2(
            Code::Mov_r64_rm64,
            Register::RSP,
            Register::RBX,
        ));
        for r in RUNTIME_SAVED.iter().rev() {
            self.insn(Instruction::with1(Code::Pop_r64, *r));
        }
        // OF from AL (1 + 0x7f overflows), then the rest from AH.
        self.insn(Instruction::with1(Code::Pop_r64, Register::RAX));
        self.insn(Instruction::with2(Code::Add_rm8_imm8, Register::AL, 0x7f));
        self.insn(Ok(Instruction::with(Code::Sahf)));
        self.insn(Instruction::with1(Code::Pop_r64, Register::RAX));
        self.insn(Ok(Instruction::with(last)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_context_entry_is_as_long_as_said() {
        let mut e = Emitter::new(0x5555_0000_0000);
        e.context_entry(0x7000_0000, 123_456);
        assert_eq!(e.bytes.len() as u64, CONTEXT_ENTRY_BYTES);
    }
}
