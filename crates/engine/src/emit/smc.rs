//! The self-modifying-code check a block from memory that may change starts
//! with (`--smc-check`): its guest bytes, compared with the bytes it was
//! translated from (immediates in the check itself), 8 at a time where the
//! block allows, every read aligned. A mismatch leaves through the chunk's SMC stub with the
//! block's guest address, and the tool translates the code that is there
//! now.
//!
//! The check must leave the client's state exactly as it was, flags
//! included: flag liveness computed from the block's instructions is
//! worthless here, because when the check fails those instructions are not
//! the ones that will run. So the flags are kept in AH/AL (`lahf`/`seto`,
//! as trace mode's buffer check keeps them) around the compares, and RAX
//! and RCX go to their spill slots.

use super::{Emitter, Label};
use crate::layout;
use iced_x86::{Code, Instruction, MemoryOperand, Register};

/// The pieces (offset, size in bytes) one compare each covers of `len`
/// guest bytes at `addr`: each naturally aligned (8-byte words where the
/// block allows, 4, 2 and 1 bytes at its edges). Never a byte outside the
/// block (its neighbours may be data that changes), and never a misaligned
/// read: a client that sets EFLAGS.AC (the JVM's CPU probe does, for a few
/// instructions) would take an alignment-check SIGBUS on it.
pub fn pieces(addr: u64, len: u64) -> Vec<(u64, u64)> {
    let mut v = Vec::new();
    let mut at = 0;
    while at < len {
        let size = [8, 4, 2, 1]
            .into_iter()
            .find(|&s| (addr + at).is_multiple_of(s) && at + s <= len)
            .expect("a byte always fits");
        v.push((at, size));
        at += size;
    }
    v
}

/// `[rip + (addr - next rip)]`: guest memory at absolute `addr`, which the
/// code cache keeps within rel32 reach.
fn at(addr: u64) -> MemoryOperand {
    MemoryOperand::with_base_displ(Register::RIP, addr as i64)
}

impl Emitter {
    /// The check of the guest bytes `bytes` at `guest`: falls through when
    /// they are unchanged, else jumps to `smc_stub` with RCX = `guest`.
    pub fn smc_check(&mut self, guest: u64, bytes: &[u8], smc_stub: u64) {
        let (rax, rcx) = (Register::RAX, Register::RCX);
        self.store_gs(rax, layout::S_RAX);
        self.save_flags_to_ax();
        self.store_gs(rcx, layout::S_RCX);
        let (changed, same): (Label, Label) = (self.new_label(), self.new_label());
        let all = pieces(guest, bytes.len() as u64);
        for (n, &(off, size)) in all.iter().enumerate() {
            let b = &bytes[off as usize..(off + size) as usize];
            let addr = guest + off;
            let cmp = match size {
                8 => {
                    let v = u64::from_le_bytes(b.try_into().expect("8 bytes"));
                    self.insn(Instruction::with2(Code::Mov_r64_imm64, rcx, v));
                    Instruction::with2(Code::Cmp_rm64_r64, at(addr), rcx)
                }
                4 => {
                    let v = u32::from_le_bytes(b.try_into().expect("4 bytes"));
                    Instruction::with2(Code::Cmp_rm32_imm32, at(addr), v)
                }
                2 => {
                    let v = u32::from(u16::from_le_bytes([b[0], b[1]]));
                    Instruction::with2(Code::Cmp_rm16_imm16, at(addr), v)
                }
                _ => Instruction::with2(Code::Cmp_rm8_imm8, at(addr), u32::from(b[0])),
            };
            self.insn(cmp);
            if n + 1 == all.len() {
                self.jcc_label(4, same); // je: all equal
            } else {
                self.jcc_label(5, changed); // jne
            }
        }
        // Changed: the client's flags back, its RAX and RCX stay in their
        // slots for the stub.
        self.bind(changed);
        self.restore_flags_from_ax();
        self.insn(Instruction::with2(Code::Mov_r64_imm64, rcx, guest));
        self.jmp(smc_stub);
        self.bind(same);
        self.restore_flags_from_ax();
        self.load_gs(rax, layout::S_RAX);
        self.load_gs(rcx, layout::S_RCX);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::emit::tests::disasm_at;

    #[test]
    fn pieces_cover_exactly_the_block_aligned() {
        assert_eq!(pieces(0x1000, 16), [(0, 8), (8, 8)]);
        assert_eq!(pieces(0x1000, 13), [(0, 8), (8, 4), (12, 1)]);
        assert_eq!(pieces(0x1003, 8), [(0, 1), (1, 4), (5, 2), (7, 1)]);
        assert_eq!(pieces(0x1000, 7), [(0, 4), (4, 2), (6, 1)]);
        assert_eq!(pieces(0x1001, 1), [(0, 1)]);
        for addr in 0x1000..0x1010 {
            for len in 1..40 {
                let mut seen = vec![false; len as usize];
                for (off, size) in pieces(addr, len) {
                    assert!(off + size <= len, "{addr:#x} {len}: past the end");
                    assert!(
                        (addr + off).is_multiple_of(size),
                        "{addr:#x} {len}: misaligned"
                    );
                    seen[off as usize..(off + size) as usize].fill(true);
                }
                assert!(seen.iter().all(|&s| s), "{addr:#x} {len}: a byte missed");
            }
        }
    }

    #[test]
    fn the_check_compares_every_byte_and_keeps_flags_and_registers() {
        let guest = 0x40_1000;
        let bytes: Vec<u8> = (1..=16).collect();
        let mut e = Emitter::new(0x50_0000);
        e.smc_check(guest, &bytes, 0x50_8000);
        assert!(e.is_complete());
        let d = disasm_at(&e.bytes, e.base);
        assert_eq!(
            d[..4],
            ["mov gs:[0],rax", "lahf", "seto al", "mov gs:[8],rcx"]
        );
        assert_eq!(d[4], "mov rcx,807060504030201h");
        assert_eq!(d[5], "cmp [401000h],rcx");
        assert!(d[6].starts_with("jne "), "{d:#?}");
        assert_eq!(d[7], "mov rcx,100F0E0D0C0B0A09h");
        assert_eq!(d[8], "cmp [401008h],rcx");
        assert!(d[9].starts_with("je "), "{d:#?}");
        // Changed: flags back, guest address in RCX, to the stub.
        assert_eq!(
            d[10..14],
            [
                "add al,7Fh",
                "sahf",
                "mov rcx,401000h",
                "jmp 0000000000508000h"
            ]
        );
        // Unchanged: flags and registers back.
        assert_eq!(
            d[14..],
            ["add al,7Fh", "sahf", "mov rax,gs:[0]", "mov rcx,gs:[8]"]
        );
        // The compares jump to the right paths.
        let insns: Vec<_> =
            iced_x86::Decoder::with_ip(64, &e.bytes, e.base, iced_x86::DecoderOptions::NONE)
                .into_iter()
                .collect();
        assert_eq!(insns[6].near_branch_target(), insns[10].ip());
        assert_eq!(insns[9].near_branch_target(), insns[14].ip());
    }

    #[test]
    fn short_blocks_compare_with_immediates() {
        let mut e = Emitter::new(0x50_0000);
        e.smc_check(0x40_1000, &[0xb8, 1, 0, 0, 0, 0xc3, 0x90], 0x50_8000);
        let d = disasm_at(&e.bytes, e.base);
        assert!(
            d.contains(&"cmp dword ptr [401000h],1B8h".to_string()),
            "{d:#?}"
        );
        assert!(
            d.contains(&"cmp word ptr [401004h],0C300h".to_string()),
            "{d:#?}"
        );
        assert!(
            d.contains(&"cmp byte ptr [401006h],90h".to_string()),
            "{d:#?}"
        );
    }
}
