//! The code cache: where translated code and the code around it go.
//!
//! A chunk is one 64 MiB mapping within ±1 GiB of the guest code it
//! translates, so that copied RIP-relative operands keep their 32-bit
//! displacements, and never in the main stack's room to grow. It starts
//! with its miss stub and its probe stub (the part of the indirect-branch
//! lookup that runs out of line); block bodies follow and grow up. Its *aux
//! area* grows down from its end: exit stubs, literals, far jumps and
//! signal-handler entries, out of the way of fall-through chains of bodies.
//! Chunks are mapped by the client itself, through an injected `mmap`.

use super::Injector;
use crate::client_mem::ClientMemory;
use crate::emit::{CallKind, Emitter, TaggedStubs};
use crate::layout::{self, CHUNK_REACH, CHUNK_SIZE, MAX_BLOCK_BYTES};
use crate::EngineError;
use rustc_hash::FxHashMap as HashMap;
use std::sync::OnceLock;

/// Aux bytes one block may need at most (literals, exit stubs).
const AUX_PER_BLOCK: u64 = 8 << 10;

/// Chunks go no lower than this (the kernel's `mmap_min_addr` and the
/// first pages of low programs).
const LOWEST_CHUNK: u64 = 0x100_0000;

/// One past the highest user address a chunk may end at.
const HIGHEST_END: u64 = 0x7fff_ffff_f000;

/// Code the tool keeps mapped behind a chunk's end (recent blocks are the
/// ones the linker patches most).
const KEEP_MAPPED: u64 = 1 << 20;

/// How much code is released from the tool's mapping at a time.
const RELEASE_STEP: u64 = 1 << 20;

/// One code-cache mapping.
#[derive(Debug, Clone)]
pub(super) struct Chunk {
    pub base: u64,
    /// Next free code byte (block bodies grow up from the start).
    pub code_next: u64,
    /// Lowest byte of the aux area (growing down from the end).
    aux_low: u64,
    /// The shared probe stub (the rest of the indirect-branch lookup).
    pub probe_stub: u64,
    /// The shared flush stub (trace mode's full buffers).
    pub flush_stub: u64,
    /// The shared exit of failed self-modifying-code checks, made in the
    /// aux area when the first checked block goes into the chunk.
    smc_stub: Option<u64>,
    /// Tagged counting's shared inline-transition code, made in the aux
    /// area when the first block of tagged counting goes into the chunk.
    tagged_stubs: Option<TaggedStubs>,
    /// Code below this address has been released from the tool's mapping
    /// (see [`CodeCache::release_written`]).
    released: u64,
}

impl Chunk {
    /// Takes `len` bytes (8-aligned) from the top of the aux area.
    pub fn aux(&mut self, len: u64) -> u64 {
        self.aux_low = (self.aux_low - len) & !7;
        self.aux_low
    }

    /// Room for one more block and its aux bytes.
    fn has_room(&self) -> bool {
        self.has_room_after(self.code_next)
    }

    /// Room for one more block starting at `at`.
    pub fn has_room_after(&self, at: u64) -> bool {
        at + MAX_BLOCK_BYTES + AUX_PER_BLOCK < self.aux_low
    }

    /// Whether `host` is in this chunk.
    fn holds(&self, host: u64) -> bool {
        self.base <= host && host < self.base + CHUNK_SIZE
    }

    /// Bytes in use: bodies and aux area.
    fn used(&self) -> u64 {
        (self.code_next - self.base) + (self.base + CHUNK_SIZE - self.aux_low)
    }
}

/// The chunks of one address space and the code in their aux areas that
/// the tool needs to find again.
#[derive(Debug, Clone)]
pub(super) struct CodeCache {
    /// Address of the core region (the indirect-branch table is in it).
    core: u64,
    chunks: Vec<Chunk>,
    /// Guest target of each exit stub, by the host RIP of its stop.
    stub_targets: HashMap<u64, u64>,
    /// Exit stubs by (chunk index, guest target).
    stubs: HashMap<(usize, u64), u64>,
    /// Signal-handler entries by guest handler address.
    handler_entries: HashMap<u64, u64>,
}

impl CodeCache {
    /// No chunks yet, for the address space whose core region is at `core`.
    pub fn new(core: u64) -> CodeCache {
        CodeCache {
            core,
            chunks: Vec::new(),
            stub_targets: HashMap::default(),
            stubs: HashMap::default(),
            handler_entries: HashMap::default(),
        }
    }

    /// Chunk `ci`.
    pub fn chunk(&mut self, ci: usize) -> &mut Chunk {
        &mut self.chunks[ci]
    }

    /// Whether host address `host` is in a chunk.
    pub fn holds(&self, host: u64) -> bool {
        self.chunks.iter().any(|c| c.holds(host))
    }

    /// The index of the chunk that holds host address `host`.
    pub fn chunk_of(&self, host: u64) -> usize {
        self.chunks
            .iter()
            .position(|c| c.holds(host))
            .expect("host address in a chunk")
    }

    /// A chunk within reach of `guest` with room for one more block (the
    /// newest such), if any.
    pub fn near(&self, guest: u64) -> Option<usize> {
        let fits = |c: &Chunk| c.base.abs_diff(guest) < CHUNK_REACH - CHUNK_SIZE && c.has_room();
        self.chunks.iter().rposition(fits)
    }

    /// Maps a new chunk within reach of `guest`, below `stack_floor`,
    /// trying the nearest free places first; returns its index.
    pub fn map_near(
        &mut self,
        guest: u64,
        stack_floor: u64,
        mem: &mut dyn ClientMemory,
        inj: &mut Injector,
    ) -> Result<usize, EngineError> {
        let aligned = guest & !(CHUNK_SIZE - 1);
        // Low programs (non-PIE) keep room above them for their heap.
        let first_above = if guest < 0x1_0000_0000 { 8 } else { 1 };
        let highest_end = stack_floor.min(HIGHEST_END);
        for k in 1..(CHUNK_REACH / CHUNK_SIZE - 2) {
            let below = aligned.checked_sub(k * CHUNK_SIZE);
            let above = aligned + (k + first_above) * CHUNK_SIZE;
            for cand in below.into_iter().chain([above]) {
                if cand < LOWEST_CHUNK || cand + CHUNK_SIZE > highest_end {
                    continue;
                }
                // The injections run client code: queued writes go first.
                mem.flush()?;
                if self.map_at(cand, mem, inj)? {
                    return Ok(self.add(cand, mem));
                }
            }
        }
        Err(EngineError(format!(
            "cannot place a code-cache chunk within reach of {guest:#x}"
        )))
    }

    /// Maps a chunk at `cand` if that place is free: backed by a memory
    /// file shared with the tool when the memory can share (see
    /// [`ClientMemory::share`]), else anonymous memory.
    fn map_at(
        &self,
        cand: u64,
        mem: &mut dyn ClientMemory,
        inj: &mut Injector,
    ) -> Result<bool, EngineError> {
        const PROT: u64 = (libc::PROT_READ | libc::PROT_WRITE | libc::PROT_EXEC) as u64;
        const FIXED: u64 = libc::MAP_FIXED_NOREPLACE as u64;
        let mmap = libc::SYS_mmap as u64;
        let mapped_at = |r: i64, inj: &mut Injector| -> Result<bool, EngineError> {
            if r as u64 == cand {
                return Ok(true);
            }
            if r >= 0 {
                // An old kernel ignored NOREPLACE and mapped elsewhere.
                inj(libc::SYS_munmap as u64, [r as u64, CHUNK_SIZE, 0, 0, 0, 0])?;
            }
            Ok(false)
        };
        if mem.can_share() {
            if let Some(fd) = super::client_memory_file(self.core, CHUNK_SIZE, inj)? {
                let flags = libc::MAP_PRIVATE as u64 | FIXED;
                let placed = mapped_at(inj(mmap, [cand, CHUNK_SIZE, PROT, flags, fd, 0])?, inj)?;
                let shared = placed && mem.share(cand, CHUNK_SIZE, fd as i32);
                inj(libc::SYS_close as u64, [fd, 0, 0, 0, 0, 0])?;
                if shared {
                    return Ok(true);
                }
                if !placed {
                    // The place is taken; the next one is tried.
                    return Ok(false);
                }
                inj(libc::SYS_munmap as u64, [cand, CHUNK_SIZE, 0, 0, 0, 0])?;
            }
        }
        let flags = (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS) as u64 | FIXED;
        mapped_at(
            inj(mmap, [cand, CHUNK_SIZE, PROT, flags, u64::MAX, 0])?,
            inj,
        )
    }

    /// Every page of the chunks that holds code or aux bytes (a forked
    /// child must have its own copy of each, see [`Space::fork_copy`]).
    pub fn used_pages(&self) -> Vec<u64> {
        const PAGE: u64 = 4096;
        let mut pages = Vec::new();
        for c in &self.chunks {
            pages.extend((c.base..c.code_next).step_by(PAGE as usize));
            pages.extend((c.aux_low & !(PAGE - 1)..c.base + CHUNK_SIZE).step_by(PAGE as usize));
        }
        pages
    }

    /// Starts the chunk mapped at `base` with its miss and probe stubs.
    fn add(&mut self, base: u64, mem: &mut dyn ClientMemory) -> usize {
        let mut e = Emitter::new(base);
        e.miss_stub(layout::MAGIC_MISS);
        e.align8();
        let probe_stub = e.here();
        e.probe_stub(self.htab(), base);
        e.align8();
        let flush_stub = e.here();
        e.flush_stub();
        e.align8();
        mem.write(base, &e.bytes);
        self.chunks.push(Chunk {
            base,
            code_next: e.here(),
            aux_low: base + CHUNK_SIZE,
            probe_stub,
            flush_stub,
            smc_stub: None,
            tagged_stubs: None,
            released: base,
        });
        self.chunks.len() - 1
    }

    /// Lets the tool's pages of chunk `ci`'s older code go (the client
    /// keeps them: the code cache is one memory file mapped in both, and
    /// counted twice where both map it). Code more than [`KEEP_MAPPED`]
    /// bytes behind the chunk's end is released a megabyte at a time; the
    /// linker writes into it again now and then, mapping a page back.
    pub fn release_written(&mut self, ci: usize, mem: &mut dyn ClientMemory) {
        let c = &mut self.chunks[ci];
        let upto = c.code_next.saturating_sub(KEEP_MAPPED);
        if upto >= c.released + RELEASE_STEP {
            mem.release(c.released, upto - c.released);
            c.released = upto;
        }
    }

    /// Absolute address of the indirect-branch table.
    fn htab(&self) -> u32 {
        (self.core + layout::HTAB) as u32
    }

    /// Places the code `emit` makes in the aux area of chunk `ci`; returns
    /// its address and the address past it.
    fn put_aux(
        &mut self,
        ci: usize,
        mem: &mut dyn ClientMemory,
        emit: impl Fn(&mut Emitter),
    ) -> (u64, u64) {
        // Sized where it will nearly be (so that branches are in reach).
        let mut sizing = Emitter::new(self.chunks[ci].aux_low);
        emit(&mut sizing);
        let at = self.chunks[ci].aux(sizing.bytes.len() as u64);
        let mut e = Emitter::new(at);
        emit(&mut e);
        debug_assert_eq!(e.bytes.len(), sizing.bytes.len());
        mem.write(at, &e.bytes);
        (at, e.here())
    }

    /// The exit stub of chunk `ci` for the guest address `target`: it
    /// exits to the tool, which translates `target` (made on first use).
    pub fn exit_stub(&mut self, ci: usize, target: u64, mem: &mut dyn ClientMemory) -> u64 {
        if let Some(&s) = self.stubs.get(&(ci, target)) {
            return s;
        }
        // Position-independent (GS-relative stores, a syscall): encoded
        // once, copied for each target (a third of the cost of making a
        // stub was encoding it twice).
        static CODE: OnceLock<Vec<u8>> = OnceLock::new();
        let code = CODE.get_or_init(|| Emitter::exit_stub_code(layout::MAGIC_LINK));
        let at = self.chunks[ci].aux(code.len() as u64);
        mem.write(at, code);
        let stop = at + code.len() as u64;
        self.stub_targets.insert(stop, target);
        self.stubs.insert((ci, target), at);
        at
    }

    /// The stub of chunk `ci` where a block whose guest code changed since
    /// its translation exits (its guest address in RCX, the client's RAX
    /// and RCX in their slots), made on first use.
    pub fn smc_stub(&mut self, ci: usize, mem: &mut dyn ClientMemory) -> u64 {
        if let Some(s) = self.chunks[ci].smc_stub {
            return s;
        }
        let (at, _) = self.put_aux(ci, mem, |e| e.miss_stub(layout::MAGIC_SMC));
        self.chunks[ci].smc_stub = Some(at);
        at
    }

    /// Tagged counting's shared code of chunk `ci` (made on first use),
    /// and the host range it was made in if it is new (a quiet range).
    /// (`recs`: `--separate-recs`.)
    pub fn tagged_stubs(
        &mut self,
        ci: usize,
        recs: u32,
        count_inline: bool,
        mem: &mut dyn ClientMemory,
    ) -> (TaggedStubs, Option<std::ops::Range<u64>>) {
        if let Some(s) = self.chunks[ci].tagged_stubs {
            return (s, None);
        }
        // (Sites call the stubs that compute a callee's tag only where it
        // can be computed: `emit::inline_recs`.)
        let recs = if crate::emit::inline_recs(recs) {
            recs
        } else {
            1
        };
        // Laid out together (the aux area grows down): one quiet range.
        // Each counts its transitions if asked to.
        let c = count_inline;
        let stub =
            |jump, skip| move |e: &mut Emitter| e.tagged_call_stub(CallKind { jump, skip }, recs);
        let (jump_call, end) = self.put_aux(ci, mem, counting(c, stub(true, false)));
        let (call, _) = self.put_aux(ci, mem, counting(c, stub(false, false)));
        let (skip_jump_call, _) = self.put_aux(ci, mem, counting(c, stub(true, true)));
        let (skip_call, _) = self.put_aux(ci, mem, counting(c, stub(false, true)));
        let indirect_call = |e: &mut Emitter| e.tagged_indirect_call_stub(recs);
        let (indirect_call, _) = self.put_aux(ci, mem, counting(c, indirect_call));
        let (jump, _) = self.put_aux(ci, mem, counting(c, |e| e.tagged_jump_stub(None)));
        let jump_calls = |e: &mut Emitter| e.tagged_jump_stub(Some(recs));
        let (jump_calls, _) = self.put_aux(ci, mem, counting(c, jump_calls));
        let (ret, _) = self.put_aux(ci, mem, counting(c, Emitter::tagged_return_stub));
        let (htab, miss) = (self.htab(), self.chunks[ci].base);
        let (probe, _) = self.put_aux(ci, mem, |e| e.probe_stub_returning(htab, miss));
        let stubs = TaggedStubs {
            ret,
            call,
            jump_call,
            skip_call,
            skip_jump_call,
            indirect_call,
            jump,
            jump_calls,
            probe,
        };
        self.chunks[ci].tagged_stubs = Some(stubs);
        (stubs, Some(probe..end))
    }

    /// The guest target of the exit stub that stopped at `rip`.
    pub fn stub_target(&self, rip: u64) -> Option<u64> {
        self.stub_targets.get(&rip).copied()
    }

    /// A jump to anywhere, `dest`, in the aux area of chunk `ci` (for a
    /// rel32 branch that cannot reach `dest`).
    pub fn far_jump(&mut self, ci: usize, dest: u64, mem: &mut dyn ClientMemory) -> u64 {
        self.put_aux(ci, mem, |e| e.jmp_far(dest)).0
    }

    /// The entry made for the signal handler at guest `handler`, if any.
    pub fn handler_entry(&self, handler: u64) -> Option<u64> {
        self.handler_entries.get(&handler).copied()
    }

    /// Makes the entry for the signal handler at guest `handler` in chunk
    /// `ci`: what the kernel is told to call. It pushes the interrupted
    /// code's spill slots (`emit::signals`) and enters the translation
    /// through the indirect-branch lookup (so it never goes stale).
    pub fn add_handler_entry(
        &mut self,
        ci: usize,
        handler: u64,
        count_lookups: bool,
        mem: &mut dyn ClientMemory,
    ) -> u64 {
        let (htab, probe) = (self.htab(), self.chunks[ci].probe_stub);
        let (at, _) = self.put_aux(ci, mem, |e| {
            e.push_spills();
            e.spill_rax_rcx();
            e.target_rcx(handler);
            e.lookup(htab, probe, count_lookups);
        });
        self.handler_entries.insert(handler, at);
        at
    }

    /// Number of chunks mapped.
    pub fn len(&self) -> usize {
        self.chunks.len()
    }

    /// The chunks, in the order they were mapped.
    pub fn chunks(&self) -> &[Chunk] {
        &self.chunks
    }

    /// Bytes of code cache in use.
    pub fn bytes_used(&self) -> u64 {
        self.chunks.iter().map(Chunk::used).sum()
    }
}

/// `emit`, for tagged stubs that count their inline transitions if
/// `count_inline` (`Emitter::count_inline`).
fn counting(count_inline: bool, emit: impl Fn(&mut Emitter)) -> impl Fn(&mut Emitter) {
    move |e| {
        e.count_inline = count_inline;
        emit(e);
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::*;
    use super::*;
    use crate::client_mem::FakeMemory;

    #[test]
    fn chunks_are_placed_in_reach_and_never_in_the_stacks_room() {
        // Code near the top of the stack (the vdso is there); every place
        // is taken, so every candidate is tried.
        let guest = 0x7fff_f7fc_1000;
        let floor = 0x7fff_ffff_f000 - (128 << 20);
        let mut tried = Vec::new();
        let mut inj = |nr: u64, args: [u64; 6]| -> Result<i64, EngineError> {
            assert_eq!(nr, libc::SYS_mmap as u64);
            tried.push(args[0]);
            Ok(-i64::from(libc::EEXIST))
        };
        let mut cache = CodeCache::new(CORE);
        let e = cache
            .map_near(guest, floor, &mut FakeMemory::default(), &mut inj)
            .unwrap_err();
        assert!(e.0.contains("within reach of 0x7ffff7fc1000"), "{}", e.0);
        assert!(tried.len() > 10);
        for &c in &tried {
            assert!(c + CHUNK_SIZE <= floor, "{c:#x} in the stack's room");
            assert!(c.abs_diff(guest) < CHUNK_REACH, "{c:#x} out of reach");
        }
        // Nearest first.
        assert_eq!(tried[0], (guest & !(CHUNK_SIZE - 1)) - CHUNK_SIZE);
    }

    #[test]
    fn a_chunk_mapped_elsewhere_by_an_old_kernel_is_unmapped() {
        let mut calls = Vec::new();
        let mut inj = |nr: u64, args: [u64; 6]| -> Result<i64, EngineError> {
            calls.push((nr, args[0]));
            Ok(match calls.len() {
                1 => 0x5555_0000_0000,
                2 => 0,
                _ => args[0] as i64,
            })
        };
        let mut cache = CodeCache::new(CORE);
        let guest = 0x5555_5555_1000;
        let ci = cache
            .map_near(guest, u64::MAX, &mut FakeMemory::default(), &mut inj)
            .unwrap();
        let (mmap, munmap) = (libc::SYS_mmap as u64, libc::SYS_munmap as u64);
        let first = (guest & !(CHUNK_SIZE - 1)) - CHUNK_SIZE;
        let second = first + 3 * CHUNK_SIZE;
        assert_eq!(
            calls,
            [(mmap, first), (munmap, 0x5555_0000_0000), (mmap, second)]
        );
        assert_eq!(cache.chunks()[ci].base, second);
        assert_eq!(cache.near(guest), Some(ci));
        assert_eq!(cache.near(guest - CHUNK_REACH), None);
    }

    #[test]
    fn exit_stubs_are_shared_per_chunk_and_target_and_grow_down() {
        let mut fake = FakeMemory::default();
        let mut cache = CodeCache::new(CORE);
        let guest = 0x40_1000;
        let ci = cache
            .map_near(guest, u64::MAX, &mut fake, &mut mmap_as_asked)
            .unwrap();
        let end = cache.chunks()[ci].base + CHUNK_SIZE;
        let s1 = cache.exit_stub(ci, 0x40_2000, &mut fake);
        let s2 = cache.exit_stub(ci, 0x40_3000, &mut fake);
        assert_eq!(cache.exit_stub(ci, 0x40_2000, &mut fake), s1);
        assert!(s2 < s1 && s1 < end && s1.is_multiple_of(8));
        assert_eq!(cache.stub_target(stub_stop(s1)), Some(0x40_2000));
        assert_eq!(cache.stub_target(stub_stop(s2)), Some(0x40_3000));
        assert_eq!(cache.stub_target(s1), None);
        assert_eq!(insns_at(&fake, s1, 5)[4], "syscall");
    }

    #[test]
    fn an_indirect_jump_looks_up_through_the_chunks_probe_and_miss_stubs() {
        let (mut sp, fake) = fake_space();
        // CODE: jmp rax
        load(&fake, CODE, &[0xff, 0xe0], "/bin/jmp");
        let body = sp.ensure(CODE, &mut mmap_as_asked).unwrap();
        assert_eq!(sp.stats.blocks_translated, 1);
        let code = insns_at(&fake, body, 40);
        let start = code.iter().position(|l| l == "mov gs:[8],rcx").unwrap();
        assert_eq!(
            code[start + 1..start + 3],
            ["mov gs:[0],rax", "mov rcx,rax"]
        );
        // Missing from the inline ways: on to the chunk's probe stub...
        let chunk = sp.cache.chunks()[0].clone();
        let probe = code.iter().find(|l| l.starts_with("jmp 0")).unwrap();
        assert_eq!(addr_in(probe), chunk.probe_stub);
        // ...which, missing too, goes to the miss stub at the chunk's start.
        let probe_code = insns_at(&fake, chunk.probe_stub, 80);
        let miss = probe_code.iter().rfind(|l| l.starts_with("jmp 0")).unwrap();
        assert_eq!(addr_in(miss), chunk.base);
        assert_eq!(
            insns_at(&fake, chunk.base, 4),
            [
                "mov gs:[18h],rcx",
                "mov gs:[10h],r11",
                "mov eax,0C05C01h",
                "syscall"
            ]
        );
    }

    #[test]
    fn a_signal_handler_entry_is_made_once_and_looks_its_handler_up() {
        let (mut sp, fake) = fake_space();
        load(&fake, CODE, &[0xc3], "/bin/handler");
        let entry = sp.signal_trampoline(CODE, &mut mmap_as_asked).unwrap();
        assert_eq!(
            sp.signal_trampoline(CODE, &mut mmap_as_asked).unwrap(),
            entry
        );
        // The interrupted code's spills pushed (3 + 2 per slot + 2
        // instructions), contexts mode's handler-start word, then the
        // lookup of the handler.
        let pushed = 3 + 2 * (crate::layout::SPILL_BYTES / 8) as usize + 1;
        let insns = insns_at(&fake, entry, pushed + 5);
        assert_eq!(
            insns[0],
            format!("mov r11,gs:[{:X}h]", crate::layout::S_SIG_DEPTH)
        );
        assert_eq!(insns[pushed], "xor eax,eax");
        assert!(insns[pushed + 1].starts_with("mov qword ptr gs:[70h],"));
        assert_eq!(
            insns[pushed + 2..],
            ["mov gs:[8],rcx", "mov gs:[0],rax", "mov rcx,401000h"]
        );
    }
}
