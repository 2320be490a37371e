//! Signal handlers without tool stops of their own. A handler's
//! translation reuses its thread's spill slots, so the interrupted code's
//! slots are kept while it runs: its trampoline pushes them on the
//! thread's save stack ([`layout::AREA_SIGSAVE`]) and its `rt_sigreturn`
//! pops them. That `rt_sigreturn` also makes a guest RIP in the frame (the
//! point an asynchronous signal interrupted, a fault's instruction, an
//! address the handler chose) the address of its translation, so the code
//! after the handler runs translated. The stub here does both in the
//! client when the indirect-branch table knows the RIP's translation, and
//! otherwise hands the `rt_sigreturn` to the tool as before; a signal then
//! costs one tool stop (its delivery) instead of two.
//!
//! Both run where the registers they use are dead: at a handler's entry
//! the kernel has put the handler's arguments in RDI, RSI and RDX and 0 in
//! RAX (and the flags are no function's input); at `rt_sigreturn` every
//! register and the flags come back from the frame.
//!
//! A nested signal can land inside either sequence (the stub is outside
//! the code cache, so it is delivered there): the push writes the set
//! before it raises the depth, and the pop restores the set before it
//! lowers the depth, so a nested handler's own push and pop save and
//! restore the slots as they are at that moment and use another set.

use super::{Emitter, Label};
use crate::layout;
use iced_x86::{Code, Instruction, MemoryOperand, Register};

/// `gs:[base + disp]`.
fn gs_based(base: Register, disp: u64) -> MemoryOperand {
    MemoryOperand::new(base, Register::None, 1, disp as i64, 8, false, Register::GS)
}

/// `[rsp + FRAME_RIP]`: the RIP `rt_sigreturn` restores.
fn frame_rip() -> MemoryOperand {
    MemoryOperand::with_base_displ(Register::RSP, layout::FRAME_RIP as i64)
}

impl Emitter {
    /// The start of a handler's trampoline: pushes the thread's spill
    /// slots on its save stack. Uses R11; leaves RAX 0, as the kernel
    /// passes it.
    pub fn push_spills(&mut self) {
        let (rax, r11) = (Register::RAX, Register::R11);
        self.load_gs(r11, layout::S_SIG_DEPTH);
        self.save_set_offset(r11);
        for slot in 0..(layout::SPILL_BYTES / 8) as u32 {
            self.load_gs(rax, slot * 8);
            self.insn(Instruction::with2(
                Code::Mov_rm64_r64,
                gs_based(r11, layout::AREA_SIGSAVE + u64::from(slot) * 8),
                rax,
            ));
        }
        self.insn(Instruction::with2(
            Code::Add_rm64_imm8,
            super::gs(layout::S_SIG_DEPTH),
            1i32,
        ));
        self.insn(Instruction::with2(
            Code::Xor_r32_rm32,
            Register::EAX,
            Register::EAX,
        ));
        // Contexts mode: the handler's first block starts a root.
        self.insn(Instruction::with2(
            Code::Mov_rm64_imm32,
            super::gs(layout::S_CONTEXT_HOT + 8 * ctxrt::hot::LAST as u32),
            ctxrt::hot::SIGNAL_START as i64 as i32,
        ));
    }

    /// `r = (r & (levels - 1)) * SPILL_BYTES`: the offset of stack level
    /// `r` in the save stack. Changes the flags.
    fn save_set_offset(&mut self, r: Register) {
        let r32 = r.full_register32();
        self.insn(Instruction::with2(
            Code::And_rm32_imm8,
            r32,
            (layout::SIGSAVE_LEVELS - 1) as i32,
        ));
        self.insn(Instruction::with2(
            Code::Shl_rm32_imm8,
            r32,
            layout::SPILL_BYTES.trailing_zeros(),
        ));
    }

    /// The `rt_sigreturn` stub, entered from a syscall gate with RAX = 15
    /// and R11 = the gate's exit to the tool. Looks the frame's RIP up in
    /// the indirect-branch table (at absolute `htab`: every way of its home
    /// bucket and the chain); found, it writes the translation's address
    /// into the frame, pops the spill slots and makes the syscall itself;
    /// not found (a RIP never reached by an indirect branch yet, or already
    /// a code-cache address), it goes on to the gate's exit with RAX = 15
    /// and the tool does the same.
    pub fn sigreturn_stub(&mut self, htab: u32) {
        let (rax, rcx, rdx, r11) = (Register::RAX, Register::RCX, Register::RDX, Register::R11);
        let (bucket, found, miss, go) = (
            self.new_label(),
            self.new_label(),
            self.new_label(),
            self.new_label(),
        );
        self.load(rcx, frame_rip());
        // rax = the home bucket: htab + (rip & 0xffff) * BUCKET_BYTES.
        self.insn(Instruction::with2(
            Code::Movzx_r32_rm16,
            Register::EAX,
            Register::CX,
        ));
        self.insn(Instruction::with2(
            Code::Shl_rm32_imm8,
            Register::EAX,
            layout::BUCKET_BYTES.trailing_zeros(),
        ));
        self.insn(Instruction::with2(
            Code::Add_rm32_imm32,
            Register::EAX,
            htab,
        ));
        self.bind(bucket);
        for way in 0..layout::BUCKET_WAYS as i32 {
            let next = self.new_label();
            self.insn(Instruction::with2(
                Code::Cmp_r64_rm64,
                rcx,
                MemoryOperand::with_base_displ(rax, i64::from(way * 16)),
            ));
            self.jcc_short(5, next); // jne
            self.load(
                rdx,
                MemoryOperand::with_base_displ(rax, i64::from(way * 16 + 8)),
            );
            self.insn(Instruction::with2(Code::Test_rm64_r64, rdx, rdx));
            self.jcc_short(5, found); // jnz
            self.bind(next);
        }
        self.load(
            rax,
            MemoryOperand::with_base_displ(rax, layout::BUCKET_NEXT as i64),
        );
        self.insn(Instruction::with2(Code::Test_rm64_r64, rax, rax));
        self.jcc_short(5, bucket); // jnz
        self.bind(miss);
        self.mov_eax_imm(libc::SYS_rt_sigreturn as u32);
        self.insn(Instruction::with1(Code::Jmp_rm64, r11));
        self.bind(found);
        self.insn(Instruction::with2(Code::Mov_rm64_r64, frame_rip(), rdx));
        self.pop_spills(go);
        self.bind(go);
        self.mov_eax_imm(libc::SYS_rt_sigreturn as u32);
        self.syscall();
    }

    /// Pops the thread's spill slots from its save stack (nothing when it
    /// is empty: `go` is where that skips to).
    fn pop_spills(&mut self, go: Label) {
        let (rax, rcx, r11) = (Register::RAX, Register::RCX, Register::R11);
        self.load_gs(rcx, layout::S_SIG_DEPTH);
        let some = self.new_label();
        // jrcxz reaches only 127 bytes: past the copy with a near jump.
        let none = self.new_label();
        self.jrcxz(none);
        self.jmp_short(some);
        self.bind(none);
        self.jmp_label(go);
        self.bind(some);
        self.lea(r11, MemoryOperand::with_base_displ(rcx, -1));
        self.save_set_offset(r11);
        for slot in 0..(layout::SPILL_BYTES / 8) as u32 {
            self.load(
                rax,
                gs_based(r11, layout::AREA_SIGSAVE + u64::from(slot) * 8),
            );
            self.store_gs(rax, slot * 8);
        }
        self.insn(Instruction::with1(Code::Dec_rm64, rcx));
        self.store_gs(rcx, layout::S_SIG_DEPTH);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn disasm(e: &Emitter) -> Vec<String> {
        crate::emit::tests::disasm_at(&e.bytes, e.base)
    }

    #[test]
    fn the_trampoline_pushes_every_slot_then_raises_the_depth() {
        let mut e = Emitter::new(0x1000);
        e.push_spills();
        let text = disasm(&e);
        let stores = text
            .iter()
            .filter(|s| s.starts_with("mov gs:[r11+"))
            .count();
        assert_eq!(stores as u64, layout::SPILL_BYTES / 8, "{text:#?}");
        let depth_up = text
            .iter()
            .position(|s| {
                s.starts_with(&format!("add qword ptr gs:[{:X}h],1", layout::S_SIG_DEPTH))
            })
            .expect("depth raised");
        let last_store = text
            .iter()
            .rposition(|s| s.starts_with("mov gs:[r11+"))
            .unwrap();
        assert!(depth_up > last_store, "{text:#?}");
        assert_eq!(text[text.len() - 2], "xor eax,eax");
        // Contexts mode's word saying a handler starts.
        let last = layout::S_CONTEXT_HOT + 8 * ctxrt::hot::LAST as u32;
        assert!(
            text.last()
                .unwrap()
                .starts_with(&format!("mov qword ptr gs:[{last:X}h],")),
            "{text:#?}"
        );
    }

    #[test]
    fn the_stub_restores_before_lowering_the_depth_and_ends_in_the_syscall() {
        let mut e = Emitter::new(0x7001_0400);
        e.sigreturn_stub(0x7010_0000);
        assert!(e.is_complete());
        let text = disasm(&e);
        assert_eq!(text.last().unwrap(), "syscall", "{text:#?}");
        assert!(text.iter().any(|s| s == "jmp r11"), "{text:#?}");
        let restores = text
            .iter()
            .filter(|s| s.starts_with("mov rax,gs:[r11+"))
            .count();
        assert_eq!(restores as u64, layout::SPILL_BYTES / 8);
        let lowered = text
            .iter()
            .position(|s| s.starts_with(&format!("mov gs:[{:X}h],rcx", layout::S_SIG_DEPTH)))
            .expect("depth lowered");
        let last_restore = text
            .iter()
            .rposition(|s| s.starts_with("mov gs:[") && s.ends_with("],rax"))
            .unwrap();
        assert!(lowered > last_restore, "{text:#?}");
    }
}
