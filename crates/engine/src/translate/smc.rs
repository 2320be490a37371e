//! Blocks whose guest code may change after translation (`--smc-check`):
//! JIT output, code on the stack, memory mapped twice.
//!
//! Such a block starts with a check that its guest bytes are still those it
//! was translated from (`emit::smc`); when they are not, it exits before
//! running any of them and the tool translates the code that is there now.
//! A check at entry alone would miss a block that rewrites its own later
//! instructions (natively the processor runs the new bytes), so a checked
//! block also ends after every instruction that writes memory: the next
//! instruction starts a block of its own, whose check sees the write. The
//! checks cost nothing to code from ordinary read-only file mappings, which
//! get none.

use super::{Builder, Item};
use iced_x86::{Instruction, InstructionInfoFactory, OpAccess};

/// Tells which instructions write memory.
pub(super) struct Stores(InstructionInfoFactory);

impl Stores {
    pub fn new() -> Self {
        Stores(InstructionInfoFactory::new())
    }

    /// Whether `i` may write memory (explicit operands, pushes, string
    /// stores, saves of register state, ...).
    pub fn writes(&mut self, i: &Instruction) -> bool {
        self.0.info(i).used_memory().iter().any(|m| {
            matches!(
                m.access(),
                OpAccess::Write
                    | OpAccess::CondWrite
                    | OpAccess::ReadWrite
                    | OpAccess::ReadCondWrite
            )
        })
    }
}

/// The guest address past the last of `items`.
fn end_of(items: &[Item], guest: u64) -> u64 {
    match items.last() {
        Some(Item::Insn(i)) => i.next_ip(),
        Some(Item::ClientRequest(ip)) => ip + 19,
        Some(Item::Illegal(ip, len)) => ip + u64::from(*len),
        None => guest,
    }
}

impl Builder<'_> {
    /// The entry check of a block that gets one (its context gives an SMC
    /// stub): `items` are the block's final instructions, from `code` at
    /// `guest`.
    pub(super) fn smc_check(&mut self, items: &[Item], code: &[u8], guest: u64) {
        if let Some(stub) = self.ctx.smc_stub() {
            let len = (end_of(items, guest) - guest) as usize;
            self.e.smc_check(guest, &code[..len], stub);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::Ctx;
    use super::super::*;
    use crate::emit::tests::disasm_at;

    /// The unit tests' context, with an SMC stub.
    struct Checked(Ctx);
    impl TransCtx for Checked {
        fn alloc_counter(&mut self) -> Result<u32, TransError> {
            self.0.alloc_counter()
        }
        fn probe_stub(&self) -> u64 {
            self.0.probe_stub()
        }
        fn literal(&mut self, value: u64) -> u64 {
            self.0.literal(value)
        }
        fn core(&self) -> u64 {
            self.0.core()
        }
        fn trace(&self) -> Option<TraceMode> {
            self.0.trace()
        }
        fn alloc_block_id(&mut self) -> u32 {
            self.0.alloc_block_id()
        }
        fn alloc_flush_site(&mut self) -> u32 {
            self.0.alloc_flush_site()
        }
        fn flush_stub(&self) -> u64 {
            self.0.flush_stub()
        }
        fn smc_stub(&self) -> Option<u64> {
            Some(0x52_0000)
        }
    }

    fn checked(code: &[u8], trace: Option<TraceMode>) -> Translation {
        let mut ctx = Checked(Ctx {
            next: 0x1000,
            trace,
            ..Ctx::default()
        });
        translate(code, 0x1000, 0x40_0000, &mut ctx).unwrap()
    }

    // add rax,1 ; mov [rdi],al ; inc rcx ; ret
    const STORE_THEN_MORE: [u8; 11] = [
        0x48, 0x83, 0xc0, 0x01, 0x88, 0x07, 0x48, 0xff, 0xc1, 0xc3, 0x90,
    ];

    #[test]
    fn a_checked_block_starts_with_its_check_and_ends_after_a_store() {
        for trace in crate::translate::tests::BOTH_MODES {
            let t = checked(&STORE_THEN_MORE, trace);
            // Cut after the store; the rest is the next block.
            assert_eq!(t.guest_end, 0x1006);
            assert_eq!(t.tail, Some(0x1006));
            let d = disasm_at(&t.code, t.host);
            assert_eq!(d[..3], ["mov gs:[0],rax", "lahf", "seto al"]);
            // The 6 bytes: a dword and a word.
            assert!(
                d.contains(&"cmp dword ptr [1000h],1C08348h".to_string()),
                "{d:#?}"
            );
            assert!(
                d.contains(&"cmp word ptr [1004h],788h".to_string()),
                "{d:#?}"
            );
            assert!(d.contains(&"jmp 0000000000520000h".to_string()), "{d:#?}");
            // The block's own code only after the check.
            let first = d.iter().position(|l| l == "add rax,1").unwrap();
            let restore = d.iter().position(|l| l == "mov rcx,gs:[8]").unwrap();
            assert!(restore < first, "{d:#?}");
        }
    }

    #[test]
    fn pushes_end_a_checked_block_too_and_unchecked_blocks_are_unchanged() {
        // push rax ; inc rcx ; ret
        let t = checked(&[0x50, 0x48, 0xff, 0xc1, 0xc3], None);
        assert_eq!(t.guest_end, 0x1001);
        let mut ctx = Ctx {
            next: 0x1000,
            ..Ctx::default()
        };
        let plain = translate(&STORE_THEN_MORE, 0x1000, 0x40_0000, &mut ctx).unwrap();
        assert_eq!(plain.guest_end, 0x100a);
        let d = disasm_at(&plain.code, plain.host);
        assert!(
            !d.iter().any(|l| l == "lahf" || l.starts_with("cmp")),
            "{d:#?}"
        );
    }
}
