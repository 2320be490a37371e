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

use super::{based, gs, Emitter, Label};
use crate::layout;
use iced_x86::{Code, Instruction, MemoryOperand, Register};

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

impl Emitter {
    /// Block entry in trace mode: borrows `r` (and `a`), reserves `words`
    /// 8-byte words in the buffer and writes the block's `id` in the first.
    /// `r` then holds the record's address.
    pub fn trace_enter(&mut self, r: Register, a: Option<Register>, id: u32, words: u32) {
        self.store_gs(r, layout::S_BORROW_R);
        if let Some(a) = a {
            self.store_gs(a, layout::S_BORROW_A);
        }
        self.load_gs(r, layout::S_TRACE_PTR);
        self.insn(Instruction::with2(
            Code::Mov_rm64_imm32,
            MemoryOperand::with_base(r),
            id,
        ));
        let size = (words * 8) as i32;
        match a {
            Some(a) => {
                self.lea(a, based(r, size));
                self.store_gs(a, layout::S_TRACE_PTR);
            }
            None => {
                self.lea(r, based(r, size));
                self.store_gs(r, layout::S_TRACE_PTR);
                self.lea(r, based(r, -size));
            }
        }
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
    /// free) and stores it in word `word` of the record at `r`.
    #[allow(clippy::too_many_arguments)]
    pub fn trace_addr(
        &mut self,
        r: Register,
        a: Register,
        word: u32,
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
        self.trace_store(r, word, a);
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
        self.insn(Instruction::with2(
            Code::Mov_rm64_r64,
            MemoryOperand::with_base_displ(r, i64::from(word * 8)),
            src,
        ));
    }

    /// `setz byte [r + 8 * word]`.
    pub fn trace_setz(&mut self, r: Register, word: u32) {
        self.insn(Instruction::with1(
            Code::Sete_rm8,
            MemoryOperand::with_base_displ(r, i64::from(word * 8)),
        ));
    }

    /// Gives the borrowed registers back (before the block's last
    /// instruction).
    pub fn trace_leave(&mut self, r: Register, a: Option<Register>) {
        self.load_gs(r, layout::S_BORROW_R);
        if let Some(a) = a {
            self.load_gs(a, layout::S_BORROW_A);
        }
    }

    /// The chunk's flush stub: an exit to the tool with the site in
    /// `S_TARGET` (RAX, RCX and R11 spilled as for every exit).
    pub fn flush_stub(&mut self) {
        self.exit_stub(layout::MAGIC_FLUSH);
    }
}
