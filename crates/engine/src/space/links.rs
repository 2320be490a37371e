//! Direct branches between translated blocks.
//!
//! Every direct exit of a block is a rel32 field (of a `jmp` or `jcc`) that
//! goes straight to its target's translation. Until the target is
//! translated it goes to an exit stub of the block's chunk and waits here;
//! when the target is translated, every field waiting for it is patched
//! (with a live write: other threads may be running that code). A target
//! more than 2 GiB away is reached through a far jump in the aux area.
//!
//! The entry of a retired block (see `invalidate`) is such a field too: a
//! jump to the exit stub of its own guest address, patched when that
//! address is translated again, so that branches still linked to the old
//! body reach the new one.

use super::Space;
use crate::emit::{rel32, CONTEXT_ENTRY_BYTES};
use crate::translate::Translation;
use rustc_hash::FxHashMap as HashMap;

/// Marks a waiting field (contexts mode) whose transfer keeps the
/// context: it is linked past its target's context entry. (Host addresses
/// never have the top bit.)
pub(super) const PLAIN: u64 = 1 << 63;

/// The rel32 fields that go to exit stubs, by the guest target they wait
/// for.
#[derive(Debug, Clone, Default)]
pub(super) struct Links {
    waiting: HashMap<u64, Vec<u64>>,
}

impl Links {
    /// The rel32 field at `field` goes to the exit stub of `target` until
    /// `target` is translated.
    pub fn wait(&mut self, target: u64, field: u64) {
        self.waiting.entry(target).or_default().push(field);
    }

    /// The fields waiting for `target`, which no longer wait.
    fn take(&mut self, target: u64) -> Vec<u64> {
        self.waiting.remove(&target).unwrap_or_default()
    }
}

impl Space {
    /// Fills in the exits of `t`, the translation of `guest` about to be
    /// written in chunk `ci`: each goes to its target's translation, or to
    /// an exit stub (and waits). Returns the exits that cannot reach their
    /// target's translation, to [`Space::patch`] once the code is written.
    pub(super) fn link_exits(
        &mut self,
        t: &mut Translation,
        ci: usize,
        guest: u64,
    ) -> Vec<(u64, u64)> {
        let mut far = Vec::new();
        for &(field, target) in &t.exits {
            // Contexts mode: a transfer that keeps the context skips the
            // target's context entry.
            let (skip, plain) = if t.plain_exits.contains(&field) {
                (CONTEXT_ENTRY_BYTES, PLAIN)
            } else {
                (0, 0)
            };
            let dest = match self.blocks.body(target) {
                Some(body) => body + skip,
                None if target == guest => t.body + skip,
                None => {
                    self.links.wait(target, field | plain);
                    self.cache.exit_stub(ci, target | plain, &mut *self.mem)
                }
            };
            // Stubs and the block itself are in its chunk, within reach.
            let Some(d) = rel32(field, dest) else {
                far.push((field, dest));
                continue;
            };
            let off = (field - t.host) as usize;
            t.code[off..off + 4].copy_from_slice(&d.to_le_bytes());
        }
        far
    }

    /// Points the rel32 field at `field`, which may be running, to `dest`
    /// (through a far jump if `dest` is out of its reach).
    pub(super) fn patch(&mut self, field: u64, dest: u64) {
        let d = rel32(field, dest).unwrap_or_else(|| {
            let ci = self.cache.chunk_of(field);
            let far = self.cache.far_jump(ci, dest, &mut *self.mem);
            rel32(field, far).expect("the aux area is within reach of its chunk")
        });
        self.mem.write_live(field, d as u32 as u64, 4);
    }

    /// `guest` was just translated at `body`: the fields waiting for it go
    /// there now.
    pub(super) fn link_waiting(&mut self, guest: u64, body: u64) {
        for field in self.links.take(guest) {
            let skip = if field & PLAIN != 0 {
                CONTEXT_ENTRY_BYTES
            } else {
                0
            };
            self.patch(field & !PLAIN, body + skip);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::*;
    use crate::EngineError;

    #[test]
    fn an_exit_to_an_untranslated_target_waits_at_a_stub_then_is_relinked() {
        let (mut sp, fake) = fake_space();
        // CODE: test rdi,rdi ; je CODE+0x100 ; CODE+9: ret ... CODE+0x100: ret
        let mut code = vec![0u8; 0x101];
        code[..9].copy_from_slice(&[0x48, 0x85, 0xff, 0x0f, 0x84, 0xf7, 0x00, 0x00, 0x00]);
        code[9] = 0xc3;
        code[0x100] = 0xc3;
        // CODE+0x200: je CODE+0x100 ; ret (translated later)
        code.resize(0x207, 0);
        code[0x200..].copy_from_slice(&[0x0f, 0x84, 0xfa, 0xfe, 0xff, 0xff, 0xc3]);
        load(&fake, CODE, &code, "/bin/je");
        let target = CODE + 0x100;
        // One block (and its fall-through, placed after it), no eager
        // translation of the rest.
        let body = sp.translate_at(CODE, &mut mmap_as_asked, None, 0).unwrap();
        assert!(!sp.blocks.contains(target));
        let stub = addr_in(&find(&fake, body, 8, "je "));
        assert_eq!(
            insns_at(&fake, stub, 5),
            [
                "mov gs:[0],rax",
                "mov gs:[8],rcx",
                "mov gs:[10h],r11",
                "mov eax,0C05C00h",
                "syscall"
            ]
        );
        // The tool, stopped there, knows what to translate.
        assert_eq!(sp.stub_target(stub_stop(stub)), Some((target, 0)));
        let field = sp.links.waiting[&target][0];
        assert_eq!(field + 4 + fake.i32_at(field) as i64 as u64, stub);
        // Translated: the field goes to the body (a live write).
        let tbody = sp.ensure(target, &mut mmap_as_asked).unwrap();
        assert_eq!(addr_in(&find(&fake, body, 8, "je ")), tbody);
        assert!(fake.live_writes().iter().any(|w| w.0 == field));
        assert!(!sp.links.waiting.contains_key(&target));
        // A later block branching there is linked straight away.
        let later = sp
            .translate_at(CODE + 0x200, &mut mmap_as_asked, None, 0)
            .unwrap();
        assert_eq!(addr_in(&find(&fake, later, 16, "je ")), tbody);
        assert!(!sp.links.waiting.contains_key(&target));
    }

    #[test]
    fn a_block_is_linked_to_only_once_the_block_chained_after_it_is_written() {
        let (mut sp, fake) = fake_space();
        // CODE: je A ; ret.  A = CODE+0x100: add rax,1 ; jmp B.
        // B = CODE+0x180: ret.
        let a = CODE + 0x100;
        let b = CODE + 0x180;
        let mut code = vec![0u8; 0x181];
        code[..7].copy_from_slice(&[0x0f, 0x84, 0xfa, 0x00, 0x00, 0x00, 0xc3]);
        code[0x100..0x109].copy_from_slice(&[0x48, 0x83, 0xc0, 0x01, 0xe9, 0x77, 0x00, 0x00, 0x00]);
        code[0x180] = 0xc3;
        load(&fake, CODE, &code, "/bin/chain");
        sp.translate_at(CODE, &mut mmap_as_asked, None, 0).unwrap();
        let field = sp.links.waiting[&a][0];
        // A's translation falls through into B's, placed right after it.
        let abody = sp.translate_at(a, &mut mmap_as_asked, None, 0).unwrap();
        let bbody = sp.blocks.body(b).expect("B chained after A");
        assert!(bbody > abody);
        // Another thread may take the field the moment it is patched: B's
        // code must be there by then.
        let log = fake.write_log();
        let linked = log
            .iter()
            .position(|&(at, _, live)| live && at == field)
            .expect("the field waiting for A is patched");
        let b_written = log
            .iter()
            .position(|&(at, len, live)| !live && at <= bbody && bbody < at + len as u64)
            .expect("B's code is written");
        assert!(
            b_written < linked,
            "B written at {b_written}, A linked at {linked}"
        );
        assert_eq!(
            addr_in(&find(&fake, sp.blocks.body(CODE).unwrap(), 8, "je ")),
            abody
        );
    }

    #[test]
    fn a_target_out_of_rel32_reach_goes_through_a_far_jump() {
        let (mut sp, fake) = fake_space();
        // A: jmp B, 2 GiB - 64 KiB on, in another mapping.
        let a = 0x1_0000_0000u64;
        let b = a + 0x7fff_0000;
        let rel = (b - (a + 5)) as u32;
        let mut jmp = vec![0xe9];
        jmp.extend_from_slice(&rel.to_le_bytes());
        load(&fake, a, &jmp, "/a");
        load(&fake, b, &[0xc3], "/b");
        // Memory between A and B is taken: A's chunk goes below A, B's
        // above B, more than 2 GiB apart.
        let mut inj = |nr: u64, args: [u64; 6]| -> Result<i64, EngineError> {
            if args[0] > a && args[0] < b {
                return Ok(-i64::from(libc::EEXIST));
            }
            mmap_as_asked(nr, args)
        };
        let body = sp.ensure(a, &mut inj).unwrap();
        let bbody = sp.blocks.body(b).expect("B translated eagerly");
        assert!(bbody - body > 1 << 31);
        let via = addr_in(&find(&fake, body, 8, "jmp "));
        // The far jump is in A's chunk (its aux area), and goes to B.
        let chunk = sp.cache.chunks()[sp.cache.chunk_of(body)].base;
        assert!(via > body && via < chunk + crate::layout::CHUNK_SIZE);
        let far = &insns_at(&fake, via, 1)[0];
        assert!(far.starts_with("jmp qword ptr ["), "{far}");
        assert_eq!(addr_in(far), via + 6);
        assert_eq!(fake.u64_at(via + 6), bbody);
    }
}
