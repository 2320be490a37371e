//! Dropping the translations of code that goes away or may change: the
//! guest range of a munmap, an mremap, a `MAP_FIXED` mmap over it, or an
//! mprotect that makes it writable or not executable (dlclose, W^X JITs);
//! and a block whose self-modifying-code check found its code changed.
//!
//! A dropped block is *retired*: its counts stay (attributed at exit to the
//! module it ran from), lookups no longer find it, and its body's first
//! instruction becomes a jump to the exit stub of its guest address. Blocks
//! still linked to the old body therefore exit to the tool, which
//! translates the code that is there now, and the jump is then re-pointed
//! to the new translation (see `links`). Nothing is freed: the code cache
//! only grows.
//!
//! Starting or stopping instrumentation (client requests) retires every
//! block in the same way, as Cachegrind discards all its translations: the
//! code is translated again, instrumented or not, as it is reached. Its
//! indirect-branch table entries stay (the old bodies lead on to the new
//! translations) and are re-pointed as the code is translated again.

use super::Space;
use crate::emit::Emitter;
use crate::layout::MAX_BLOCK_GUEST_BYTES;

/// The one-byte breakpoint a retired entry may become.
const INT3: u8 = 0xcc;

impl Space {
    /// The guest range `[start, end)` is being unmapped or remapped: drops
    /// the translations of code in it (see the module doc).
    pub fn invalidate(&mut self, start: u64, end: u64) {
        self.modules.forget(start, end);
        self.drop_blocks(start, end);
    }

    /// The check of the block at `guest` found its code changed in place:
    /// drops the translations of code in the block's range (the mapping is
    /// the same). When the block there now matches the memory (another
    /// thread's check failed first and it is the new translation), or there
    /// is none, nothing is dropped.
    pub fn code_changed(&mut self, guest: u64) {
        let Some(b) = self.blocks.get(guest) else {
            return;
        };
        let end = b.guest_end;
        if let Some(bytes) = b.checked() {
            if self.mem.read(guest, bytes.len()).ok().as_deref() == Some(bytes) {
                return;
            }
        }
        self.modules.code_changed(guest, end);
        self.drop_blocks(guest, end);
    }

    /// Retires every block with code in `[start, end)`.
    fn drop_blocks(&mut self, start: u64, end: u64) {
        let hit = self.blocks.overlapping(start, end, MAX_BLOCK_GUEST_BYTES);
        if !hit.is_empty() && std::env::var_os("CACHESCOPE_ENGINE_DEBUG").is_some() {
            eprintln!(
                "[engine] dropping {} blocks in {start:#x}..{end:#x}",
                hit.len()
            );
        }
        for guest in hit {
            self.retire(guest);
            self.lookups.withdraw(guest, &mut *self.mem);
        }
    }

    /// Instrumentation starts (`on`) or stops: every block is retired, to
    /// be translated again the new way when reached. Returns whether the
    /// state changed.
    pub fn set_instrumented(&mut self, on: bool) -> bool {
        if self.instrumented == on {
            return false;
        }
        self.instrumented = on;
        for guest in self.blocks.starts() {
            self.retire(guest);
        }
        true
    }

    /// Makes the translation of `guest` unreachable: its body's entry
    /// jumps to the exit stub of its guest address, until translated again.
    ///
    /// Other threads may be running that code: where the body's first
    /// instruction is at least the jump's 5 bytes long (no thread can be
    /// inside it) and its first 8 bytes lie in one cache line, the jump goes
    /// in with the 3 bytes after it in one atomic 8-byte store, so a thread
    /// sees the old entry or the jump, never a mix. A checked block's entry
    /// always qualifies (the translator places it so). Another's, with other
    /// threads about, gets an `int3` in its first byte instead (one byte:
    /// a thread inside its first instructions runs on unharmed), and a
    /// thread that enters it traps to the tool, which sends it on (see
    /// [`Space::entry_trap`]). Alone, the client cannot see the jump being
    /// written.
    fn retire(&mut self, guest: u64) {
        let body = self.blocks.retire(guest);
        let word = self.entry_word(body);
        if word.is_none() && self.mem.is_multi() {
            self.mem.write(body, &[INT3]);
            self.entry_traps.insert(body, guest);
            return;
        }
        let ci = self.cache.chunk_of(body);
        let stub = self.cache.exit_stub(ci, guest, &mut *self.mem);
        let mut e = Emitter::new(body);
        let field = e.jmp(stub);
        match word {
            Some(mut word) => {
                word[..5].copy_from_slice(&e.bytes);
                self.mem.write_live(body, u64::from_le_bytes(word), 8);
            }
            None => self.mem.write(body, &e.bytes),
        }
        self.links.wait(guest, field);
    }

    /// A thread trapped on the `int3` at the entry of the retired body
    /// `body` (its RIP is past it): where it goes on, its registers being
    /// the guest's as at any block entry (the current translation of the
    /// block's guest address, or the exit stub that translates it).
    /// `None` if `body` is no such entry.
    pub fn entry_trap(&mut self, body: u64) -> Option<u64> {
        let guest = *self.entry_traps.get(&body)?;
        Some(match self.blocks.body(guest) {
            Some(current) => current,
            None => {
                let ci = self.cache.chunk_of(body);
                self.cache.exit_stub(ci, guest, &mut *self.mem)
            }
        })
    }

    /// The 8 bytes at `body` if one atomic store of them can replace its
    /// first instruction by a jump (see [`Space::retire`]).
    fn entry_word(&mut self, body: u64) -> Option<[u8; 8]> {
        if body % 64 > 56 {
            return None;
        }
        let bytes = self.mem.read(body, 15).ok()?;
        let first =
            iced_x86::Decoder::with_ip(64, &bytes, body, iced_x86::DecoderOptions::NONE).decode();
        (!first.is_invalid() && first.len() >= 5).then(|| bytes[..8].try_into().expect("8 bytes"))
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::*;
    use crate::client_mem::FakeMemory;
    use crate::layout;
    use std::path::Path;

    /// Where the library goes.
    const LIB: u64 = 0x50_0000;

    /// A library block at `LIB` (`add rax,1 ; ret`) that the program at
    /// CODE jumps to, both translated, the library's published; its block
    /// ran 5 times in the thread whose area is returned.
    fn program_and_library() -> (super::Space, FakeMemory, u64) {
        let (mut sp, fake) = fake_space();
        // CODE: jmp LIB
        let rel = (LIB - (CODE + 5)) as u32;
        let mut jmp = vec![0xe9];
        jmp.extend_from_slice(&rel.to_le_bytes());
        load(&fake, CODE, &jmp, "/bin/main");
        load(&fake, LIB, &[0x48, 0x83, 0xc0, 0x01, 0xc3], "/lib/a.so");
        let area = sp.alloc_area(&mut mmap_as_asked).unwrap();
        assert_eq!(area, layout::AREA_HINT);
        sp.ensure(CODE, &mut mmap_as_asked).unwrap();
        sp.publish(LIB);
        let counter = sp.blocks.get(LIB).unwrap().counter;
        fake.poke(area + u64::from(counter), &5u64.to_le_bytes());
        (sp, fake, area)
    }

    #[test]
    fn dropped_code_jumps_to_a_stub_leaves_the_table_and_keeps_its_counts() {
        let (mut sp, fake, _) = program_and_library();
        let old = sp.blocks.body(LIB).unwrap();
        assert_eq!(published(&fake, LIB), Some(old));
        let home_way0 = CORE + layout::HTAB + (LIB & 0xffff) * layout::BUCKET_BYTES;
        assert_eq!(fake.u64_at(home_way0), LIB);
        // dlclose.
        sp.invalidate(LIB, LIB + 0x1000);
        assert!(!sp.blocks.contains(LIB));
        // The old body now exits to the tool for its guest address.
        let jmp = &insns_at(&fake, old, 1)[0];
        assert!(jmp.starts_with("jmp "), "{jmp}");
        assert_eq!(sp.stub_target(stub_stop(addr_in(jmp))), Some((LIB, 0)));
        // Withdrawn from the table: its way holds a tombstone.
        assert_eq!(published(&fake, LIB), None);
        assert_eq!(fake.u64_at(home_way0), u64::MAX);
        // The program's block is untouched.
        assert!(sp.blocks.contains(CODE));
        // Its counts stay, with the module they ran from.
        let p = sp.collect(1, true);
        assert!(!p.instr_counts.contains_key(&LIB));
        assert_eq!(p.unmapped.len(), 1);
        let u = &p.unmapped[0];
        assert_eq!(u.module.as_ref().unwrap().path, Path::new("/lib/a.so"));
        assert_eq!(u.instr_counts[&LIB], 5);
        assert_eq!(u.instr_counts[&(LIB + 4)], 5);
    }

    #[test]
    fn retranslation_repoints_the_retired_body_and_links_still_go_there() {
        let (mut sp, fake, _) = program_and_library();
        let old = sp.blocks.body(LIB).unwrap();
        let prog = sp.blocks.body(CODE).unwrap();
        assert_eq!(addr_in(&find(&fake, prog, 8, "jmp ")), old);
        sp.invalidate(LIB, LIB + 0x1000);
        // Another library at the same place (dlopen): `add rax,2 ; ret`.
        fake.poke(LIB, &[0x48, 0x83, 0xc0, 0x02, 0xc3]);
        let new = sp.ensure(LIB, &mut mmap_as_asked).unwrap();
        assert_ne!(new, old);
        assert!(insns_at(&fake, new, 4).contains(&"add rax,2".to_string()));
        // The program still jumps to the old body, which goes on to the new.
        assert_eq!(addr_in(&find(&fake, prog, 8, "jmp ")), old);
        assert_eq!(addr_in(&insns_at(&fake, old, 1)[0]), new);
        // Published again on the next miss, at the new body.
        sp.publish(LIB);
        assert_eq!(published(&fake, LIB), Some(new));
        // Two modules recorded at the same place: the old counts keep theirs.
        let p = sp.collect(1, true);
        assert_eq!(p.modules.len(), 3);
        assert_eq!(p.unmapped[0].instr_counts[&LIB], 5);
    }

    #[test]
    fn stopping_instrumentation_retranslates_everything_without_counters() {
        let (mut sp, fake, _) = program_and_library();
        let old = sp.blocks.body(LIB).unwrap();
        assert!(sp.set_instrumented(false));
        assert!(!sp.set_instrumented(false), "no change the second time");
        assert!(!sp.blocks.contains(LIB) && !sp.blocks.contains(CODE));
        // The old body exits to the tool, which translates it anew,
        // uncounted; the table entry follows the new translation.
        let jmp = &insns_at(&fake, old, 1)[0];
        assert_eq!(sp.stub_target(stub_stop(addr_in(jmp))), Some((LIB, 0)));
        let new = sp.ensure(LIB, &mut mmap_as_asked).unwrap();
        assert_eq!(sp.blocks.get(LIB).unwrap().counter, 0);
        assert!(sp.blocks.get(LIB).unwrap().counted.is_empty());
        assert_eq!(published(&fake, LIB), Some(new));
        assert_eq!(insns_at(&fake, new, 1)[0], "add rax,1");
        // The counts made while instrumented stay.
        assert_eq!(sp.collect(1, true).unmapped[0].instr_counts[&LIB], 5);
    }

    #[test]
    fn only_blocks_with_code_in_the_range_are_dropped() {
        let (mut sp, _fake, _) = program_and_library();
        // Ends where the library starts: nothing of it is dropped.
        sp.invalidate(LIB - 0x1000, LIB);
        assert!(sp.blocks.contains(LIB) && sp.blocks.contains(CODE));
        // A block that starts before the range but runs into it is.
        sp.invalidate(LIB + 4, LIB + 5);
        assert!(!sp.blocks.contains(LIB) && sp.blocks.contains(CODE));
    }

    #[test]
    fn a_block_whose_code_changed_is_translated_again_from_its_new_bytes() {
        let (mut sp, fake) = fake_space();
        // JIT code: mov eax,42 ; ret, in an anonymous RWX mapping.
        const JIT: u64 = 0x60_0000;
        fake.add_mapping(JIT, JIT + 0x1000, "rwxp", "");
        fake.poke(JIT, &[0xb8, 42, 0, 0, 0, 0xc3]);
        let old = sp.ensure(JIT, &mut mmap_as_asked).unwrap();
        // It checks its 6 bytes first, exiting to the chunk's SMC stub.
        let d = insns_at(&fake, old, 12);
        assert_eq!(d[..3], ["mov gs:[0],rax", "lahf", "seto al"]);
        assert!(
            d.contains(&"cmp dword ptr [600000h],2AB8h".to_string()),
            "{d:#?}"
        );
        let stub = addr_in(d.iter().find(|l| l.starts_with("jmp ")).unwrap());
        assert_eq!(
            insns_at(&fake, stub, 4),
            [
                "mov gs:[18h],rcx",
                "mov gs:[10h],r11",
                "mov eax,0C05C06h",
                "syscall"
            ]
        );
        // Rewritten in place (no syscall the tool would see); the check
        // fails and the tool is told.
        fake.poke(JIT + 1, &[43]);
        sp.code_changed(JIT);
        assert!(!sp.blocks.contains(JIT));
        let new = sp.ensure(JIT, &mut mmap_as_asked).unwrap();
        assert_ne!(new, old);
        let d = insns_at(&fake, new, 24);
        assert!(
            d.contains(&"cmp dword ptr [600000h],2BB8h".to_string()),
            "{d:#?}"
        );
        assert!(d.contains(&"mov eax,2Bh".to_string()), "{d:#?}");
        // The same stub serves every checked block of the chunk.
        assert_eq!(
            addr_in(d.iter().find(|l| l.starts_with("jmp ")).unwrap()),
            stub
        );
        // Links to the old body go on to the new one.
        assert_eq!(addr_in(&insns_at(&fake, old, 1)[0]), new);
        // A second report of the same change (another thread's check)
        // finds the new translation current and keeps it.
        sp.code_changed(JIT);
        assert_eq!(sp.blocks.body(JIT), Some(new));
        sp.code_changed(JIT + 0x10);
        assert!(sp.blocks.contains(JIT));
    }

    #[test]
    fn checked_blocks_are_retired_by_one_atomic_store_at_their_entry() {
        let (mut sp, fake) = fake_space();
        // Forty JIT blocks (N % 8 nops, mov eax,N ; ret), each checked:
        // their sizes vary, and so do their bodies' offsets in cache lines.
        const JIT: u64 = 0x60_0000;
        fake.add_mapping(JIT, JIT + 0x1000, "rwxp", "");
        let starts: Vec<u64> = (0..40).map(|n| JIT + 0x20 * n).collect();
        for (n, &g) in starts.iter().enumerate() {
            let mut code = vec![0x90; n % 8];
            code.extend_from_slice(&[0xb8, n as u8, 0, 0, 0, 0xc3]);
            fake.poke(g, &code);
        }
        let bodies: Vec<u64> = starts
            .iter()
            .map(|&g| sp.ensure(g, &mut mmap_as_asked).unwrap())
            .collect();
        sp.invalidate(JIT, JIT + 0x1000);
        let live = fake.live_writes();
        for &body in &bodies {
            assert!(body % 64 <= 56, "entry {body:#x} crosses a cache line");
            // The jump and the 3 bytes after it, one store; a thread sees
            // the check's first store or the jump.
            assert!(live.iter().any(|&(at, _, size)| at == body && size == 8));
            assert!(insns_at(&fake, body, 1)[0].starts_with("jmp "));
        }
    }

    #[test]
    fn with_threads_about_a_short_entry_becomes_a_trap_that_leads_on() {
        let (mut sp, fake) = fake_space();
        // cmovz rax,rbx (reads ZF: the block's first instruction stays
        // first, 4 bytes) ; add rax,1 ; ret
        let code = [0x48, 0x0f, 0x44, 0xc3, 0x48, 0x83, 0xc0, 0x01, 0xc3];
        load(&fake, LIB, &code, "/lib/cmov.so");
        let body = sp.ensure(LIB, &mut mmap_as_asked).unwrap();
        let before = fake.peek(body, 8);
        assert!(
            insns_at(&fake, body, 1)[0].starts_with("cmove "),
            "{:?}",
            insns_at(&fake, body, 3)
        );
        sp.mem().set_multi(true);
        sp.invalidate(LIB, LIB + 0x1000);
        // One byte changed, nothing else: a thread past it runs on.
        let after = fake.peek(body, 8);
        assert_eq!(after[0], 0xcc);
        assert_eq!(after[1..], before[1..]);
        // A thread that traps there goes to a stub that translates LIB,
        // then, once it is translated again, to the new body.
        let stub = sp.entry_trap(body).expect("a trap");
        assert_eq!(sp.stub_target(stub_stop(stub)), Some((LIB, 0)));
        let new = sp.ensure(LIB, &mut mmap_as_asked).unwrap();
        assert_ne!(new, body);
        assert_eq!(sp.entry_trap(body), Some(new));
        assert_eq!(sp.entry_trap(new), None);
        // Translating it again patched nothing into the old body.
        assert_eq!(fake.peek(body, 8), after);
    }

    #[test]
    fn library_code_gets_no_check() {
        let (sp, fake, _) = program_and_library();
        let body = sp.blocks.body(LIB).unwrap();
        let d = insns_at(&fake, body, 3);
        assert_eq!(d[1], "add rax,1", "{d:#?}");
    }
}
