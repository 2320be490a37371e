//! One client address space as the tracer sees it: the code-cache chunks,
//! the translated blocks and their counters, unlinked branches, the
//! indirect-branch table, per-thread slots and the modules code came from.
//!
//! All client memory is read and written through `/proc/PID/mem`, which
//! works whatever the page protections are.

use crate::client_mem::{ClientMemory, WriteQueue};
use crate::emit::Emitter;
use crate::ibtable::IbTable;
use crate::layout::{self, CHUNK_REACH, CHUNK_SIZE, MAX_BLOCK_BYTES};
use crate::translate::{self, SyscallSite, TransCtx};
use crate::{EngineError, ModuleRecord, ProcessProfile, UnmappedCode};
use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};
use std::collections::VecDeque;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;

/// Performs one syscall inside the stopped client thread: `(nr, args)` ->
/// result (negative errno on failure).
pub type Injector<'a> = dyn FnMut(u64, [u64; 6]) -> Result<i64, EngineError> + 'a;

/// One code-cache mapping.
#[derive(Debug, Clone)]
struct Chunk {
    base: u64,
    /// Next free code byte (block bodies grow up from the start).
    code_next: u64,
    /// Lowest byte of the aux area (exit stubs, literals and
    /// trampolines grow down from the end, out of the way of fall-through
    /// chains of bodies).
    aux_low: u64,
    /// The shared probe stub (the rest of the indirect-branch table).
    probe_stub: u64,
}

impl Chunk {
    /// Takes `len` bytes (8-aligned) from the top of the aux area.
    fn aux(&mut self, len: u64) -> u64 {
        self.aux_low = (self.aux_low - len) & !7;
        self.aux_low
    }

    /// Room for one more block and its aux bytes.
    fn has_room(&self) -> bool {
        self.has_room_after(self.code_next)
    }

    /// Room for one more block starting at `at`.
    fn has_room_after(&self, at: u64) -> bool {
        at + MAX_BLOCK_BYTES + AUX_PER_BLOCK < self.aux_low
    }
}

/// Aux bytes one block may need at most (literals, exit stubs).
const AUX_PER_BLOCK: u64 = 8 << 10;

/// Metadata of a translated block.
#[derive(Debug, Clone)]
struct Block {
    body: u64,
    /// Guest address past the block's last instruction.
    guest_end: u64,
    /// Index in `modules` of the mapping the code came from.
    module: usize,
    counter: u32,
    counted: Vec<u64>,
    reps: Vec<(u64, u32)>,
}

/// One line of `/proc/PID/maps`.
#[derive(Debug, Clone)]
struct Mapping {
    start: u64,
    end: u64,
    exec: bool,
    write: bool,
    offset: u64,
    path: String,
}

/// What a magic-syscall stop in a direct-branch stub asks for.
#[derive(Debug, Clone, Copy)]
pub struct StubExit {
    /// Guest address to continue at.
    pub target: u64,
}

/// The tracer's view of one client address space.
pub struct Space {
    /// `/proc/PID/mem` of a process using this address space.
    mem: File,
    /// Pid whose `/proc` files are used.
    pid: i32,
    /// Base address of the core region.
    pub core: u64,
    chunks: Vec<Chunk>,
    blocks: HashMap<u64, Block>,
    /// Stub stop RIP -> guest target.
    stubs: HashMap<u64, u64>,
    /// (chunk index, guest target) -> stub address.
    stub_for: HashMap<(usize, u64), u64>,
    /// Guest target -> rel32 fields still pointing at a stub.
    pending: HashMap<u64, Vec<u64>>,
    /// Syscall sites by stop RIP.
    syscalls: HashMap<u64, SyscallSite>,
    maps: Vec<Mapping>,
    modules: Vec<ModuleRecord>,
    recorded: HashMap<(u64, u64, u64, String), usize>,
    /// Blocks whose code was unmapped: no longer reachable, still counted.
    retired: Vec<Block>,
    /// Bodies of retired blocks by guest address: re-pointed to the new
    /// translation when the address is translated again.
    retired_bodies: HashMap<u64, Vec<u64>>,
    /// Block start addresses in order (for range invalidation).
    starts: std::collections::BTreeSet<u64>,
    /// Thread areas whose counters are still in client memory (those of
    /// live threads, and after a fork those the parent's other threads had).
    areas: HashSet<u64>,
    /// Areas of exited threads, zeroed, ready for reuse.
    free_areas: Vec<u64>,
    /// Thread areas mapped so far (for placement hints).
    areas_made: u64,
    /// Next counter offset to hand out.
    next_counter: u32,
    /// Counts of exited threads, by counter index.
    totals: Vec<u64>,
    /// Direct successors of each block (for eager translation).
    successors: HashMap<u64, Vec<u64>>,
    /// Signal-handler trampolines by guest handler address.
    trampolines: HashMap<u64, u64>,
    /// Writes to client memory not yet made: plain ones go out in one
    /// `process_vm_writev` before the client runs again (see
    /// [`Space::flush`]), live ones through the patch gadget.
    out: WriteQueue,
    /// Blocks translated during the current `ensure` (for eager BFS).
    fresh: Vec<u64>,
    /// The indirect-branch table, as the client has it.
    ibt: IbTable,
    /// Lookup counters of exited threads (see `layout::S_STAT_INLINE_HITS`).
    lookup_totals: [u64; 3],
    /// Whether translated code counts inline lookup hits (`--stats=yes`).
    pub count_lookups: bool,
    /// What `--stats=yes` reports.
    pub stats: crate::EngineStats,
    /// Return addresses of translated calls whose block is not translated
    /// yet: published in the table when it is.
    return_sites: HashSet<u64>,
    /// Guest code pages already read (read-only code; dropped with
    /// translations when their range is unmapped or made writable).
    pages: HashMap<u64, Vec<u8>>,
}

fn io_err(what: &str, e: std::io::Error) -> EngineError {
    EngineError(format!("{what}: {e}"))
}

impl Space {
    /// A new address space whose core region is already mapped at `core`.
    pub fn new(pid: i32, core: u64) -> Result<Space, EngineError> {
        let mem = open_mem(pid)?;
        Ok(Space {
            mem,
            pid,
            core,
            chunks: Vec::new(),
            blocks: HashMap::default(),
            stubs: HashMap::default(),
            stub_for: HashMap::default(),
            pending: HashMap::default(),
            syscalls: HashMap::default(),
            maps: Vec::new(),
            modules: Vec::new(),
            recorded: HashMap::default(),
            retired: Vec::new(),
            retired_bodies: HashMap::default(),
            starts: Default::default(),
            areas: HashSet::default(),
            free_areas: Vec::new(),
            areas_made: 0,
            next_counter: layout::AREA_COUNTERS,
            totals: Vec::new(),
            successors: HashMap::default(),
            trampolines: HashMap::default(),
            out: WriteQueue::default(),
            return_sites: HashSet::default(),
            ibt: IbTable::new(core + layout::HTAB),
            count_lookups: false,
            stats: Default::default(),
            lookup_totals: [0; 3],
            fresh: Vec::new(),
            pages: HashMap::default(),
        })
    }

    /// The copy a forked child gets (its memory is a copy of the parent's).
    pub fn fork_copy(&self, child: i32) -> Result<Space, EngineError> {
        Ok(Space {
            mem: open_mem(child)?,
            pid: child,
            core: self.core,
            chunks: self.chunks.clone(),
            blocks: self.blocks.clone(),
            stubs: self.stubs.clone(),
            stub_for: self.stub_for.clone(),
            pending: self.pending.clone(),
            syscalls: self.syscalls.clone(),
            maps: self.maps.clone(),
            modules: self.modules.clone(),
            recorded: self.recorded.clone(),
            retired: self.retired.clone(),
            retired_bodies: self.retired_bodies.clone(),
            starts: self.starts.clone(),
            areas: self.areas.clone(),
            free_areas: self.free_areas.clone(),
            areas_made: self.areas_made,
            next_counter: self.next_counter,
            totals: self.totals.clone(),
            successors: self.successors.clone(),
            trampolines: self.trampolines.clone(),
            out: WriteQueue::default(),
            return_sites: self.return_sites.clone(),
            ibt: self.ibt.clone(),
            count_lookups: self.count_lookups,
            stats: self.stats.clone(),
            lookup_totals: self.lookup_totals,
            fresh: Vec::new(),
            pages: self.pages.clone(),
        })
    }

    /// Writes client memory.
    /// (Queued until [`Space::flush`]; reads flush first.)
    pub fn write(&self, addr: u64, bytes: &[u8]) -> Result<(), EngineError> {
        self.out.push(addr, bytes);
        Ok(())
    }

    /// Whether other threads may run code of this space while the tool
    /// works (then live code and table entries change only through atomic
    /// stores).
    pub fn set_multi(&mut self, multi: bool) {
        self.out.multi = multi;
    }

    /// Makes the queued writes, in order: one `process_vm_writev` for
    /// all of them (our regions are writable), else one `pwrite` each.
    pub fn flush(&self) -> Result<(), EngineError> {
        let pending = self.out.take_plain();
        for batch in pending.chunks(512) {
            let parts: Vec<(u64, &[u8])> = batch.iter().map(|(a, b)| (*a, b.as_slice())).collect();
            let total: usize = batch.iter().map(|(_, b)| b.len()).sum();
            if crate::sys::write_remote(self.pid, &parts).ok() == Some(total) {
                continue;
            }
            for (addr, bytes) in batch {
                self.mem
                    .write_all_at(bytes, *addr)
                    .map_err(|e| io_err(&format!("cannot write client memory at {addr:#x}"), e))?;
            }
        }
        Ok(())
    }

    /// Reads guest code at `addr`: `len` bytes through the page cache.
    fn read_code(&mut self, addr: u64, len: usize) -> Result<Vec<u8>, EngineError> {
        let mut out = Vec::with_capacity(len);
        let end = addr + len as u64;
        let mut at = addr;
        while at < end {
            let page = at & !4095;
            if !self.pages.contains_key(&page) {
                let bytes = self.read(page, 4096)?;
                self.pages.insert(page, bytes);
            }
            let data = &self.pages[&page];
            let from = (at - page) as usize;
            let to = ((end - page) as usize).min(4096);
            out.extend_from_slice(&data[from..to]);
            at = page + to as u64;
        }
        Ok(out)
    }

    /// Reads client memory (exactly `len` bytes).
    pub fn read(&self, addr: u64, len: usize) -> Result<Vec<u8>, EngineError> {
        self.flush()?;
        let mut buf = vec![0u8; len];
        self.mem
            .read_exact_at(&mut buf, addr)
            .map_err(|e| io_err(&format!("cannot read client memory at {addr:#x}"), e))?;
        Ok(buf)
    }

    /// Reads one 64-bit word of client memory.
    pub fn read_u64(&self, addr: u64) -> Result<u64, EngineError> {
        let b = self.read(addr, 8)?;
        Ok(u64::from_le_bytes(b.try_into().expect("8 bytes")))
    }

    /// A thread area for a new thread (its GS base): a recycled one or a
    /// fresh mapping made by `inj` in the client.
    pub fn alloc_area(&mut self, inj: &mut Injector) -> Result<u64, EngineError> {
        let area = match self.free_areas.pop() {
            Some(a) => a,
            None => {
                const PROT: u64 = (libc::PROT_READ | libc::PROT_WRITE) as u64;
                const FLAGS: u64 =
                    (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE) as u64;
                self.flush()?;
                let r = inj(
                    libc::SYS_mmap as u64,
                    [
                        layout::AREA_HINT + self.areas_made * layout::AREA_SIZE,
                        layout::AREA_SIZE,
                        PROT,
                        FLAGS,
                        u64::MAX,
                        0,
                    ],
                )?;
                if r < 0 {
                    return Err(EngineError(format!(
                        "cannot map a thread area in the client: {}",
                        std::io::Error::from_raw_os_error(-r as i32)
                    )));
                }
                self.areas_made += 1;
                r as u64
            }
        };
        self.areas.insert(area);
        Ok(area)
    }

    fn counters_len(&self) -> usize {
        (self.next_counter - layout::AREA_COUNTERS) as usize
    }

    /// Reads the counters of the area at `area` (by counter index).
    fn read_area(&self, area: u64) -> Vec<u64> {
        let len = self.counters_len();
        match self.read(area + layout::AREA_COUNTERS as u64, len) {
            Ok(bytes) => bytes
                .chunks_exact(8)
                .map(|w| u64::from_le_bytes(w.try_into().expect("8 bytes")))
                .collect(),
            Err(_) => Vec::new(),
        }
    }

    /// A thread exited: fold its counters into the totals and recycle its
    /// area. (Called while the client's memory is still there.)
    pub fn thread_exited(&mut self, area: u64) {
        if !self.areas.remove(&area) {
            return;
        }
        let counts = self.read_area(area);
        add_into(&mut self.totals, &counts);
        let lookups = self.read_lookup_counts(area);
        add_lookup_counts(&mut self.lookup_totals, &lookups);
        let _ = self.write(area + u64::from(layout::S_STAT_INLINE_HITS), &[0; 24]);
        let zeros = vec![0u8; self.counters_len()];
        if self
            .write(area + layout::AREA_COUNTERS as u64, &zeros)
            .is_ok()
        {
            self.free_areas.push(area);
        }
    }

    /// The guest target of a direct-branch stub that stopped at `rip`.
    pub fn stub_exit(&self, rip: u64) -> Option<StubExit> {
        self.stubs.get(&rip).map(|&target| StubExit { target })
    }

    /// The syscall site that stopped at `rip`.
    pub fn syscall_site(&self, rip: u64) -> Option<SyscallSite> {
        self.syscalls.get(&rip).copied()
    }

    fn reload_maps(&mut self) -> Result<(), EngineError> {
        let text = std::fs::read_to_string(format!("/proc/{}/maps", self.pid))
            .map_err(|e| io_err("cannot read the client's memory map", e))?;
        self.maps = text.lines().filter_map(parse_maps_line).collect();
        Ok(())
    }

    fn mapping_of(&mut self, addr: u64) -> Result<Mapping, EngineError> {
        let find = |maps: &[Mapping]| {
            maps.iter()
                .find(|m| m.start <= addr && addr < m.end)
                .cloned()
        };
        if let Some(m) = find(&self.maps) {
            if m.exec && !m.write {
                return Ok(m);
            }
        }
        self.reload_maps()?;
        match find(&self.maps) {
            Some(m) if m.exec && m.write => Err(EngineError(format!(
                "the client runs code from writable memory at {addr:#x} ({}), as JIT compilers do; not supported yet",
                if m.path.is_empty() { "anonymous" } else { &m.path }
            ))),
            Some(m) if m.exec => Ok(m),
            Some(_) => Err(EngineError(format!(
                "the client jumped to non-executable memory at {addr:#x}"
            ))),
            None => Err(EngineError(format!(
                "the client jumped to unmapped address {addr:#x}"
            ))),
        }
    }

    fn chunk_near(&mut self, guest: u64, inj: &mut Injector) -> Result<usize, EngineError> {
        let fits = |c: &Chunk| c.base.abs_diff(guest) < CHUNK_REACH - CHUNK_SIZE && c.has_room();
        if let Some(i) = self.chunks.iter().rposition(fits) {
            return Ok(i);
        }
        let aligned = guest & !(CHUNK_SIZE - 1);
        // Low programs (non-PIE) keep room above them for their heap.
        let first_above = if guest < 0x1_0000_0000 { 8 } else { 1 };
        // Nothing in the main stack's room to grow: the kernel keeps mmap
        // below the stack by at least 128 MiB (more with a larger stack
        // rlimit at exec); so do we.
        if self.maps.iter().all(|m| m.path != "[stack]") {
            self.reload_maps()?;
        }
        let stack_floor = self
            .maps
            .iter()
            .find(|m| m.path == "[stack]")
            .map_or(u64::MAX, |m| m.end.saturating_sub(128 << 20));
        for k in 1..(CHUNK_REACH / CHUNK_SIZE - 2) {
            let below = aligned.checked_sub(k * CHUNK_SIZE);
            let above = aligned + (k + first_above) * CHUNK_SIZE;
            for cand in below.into_iter().chain([above]) {
                if cand < 0x100_0000 || cand + CHUNK_SIZE > stack_floor.min(0x7fff_ffff_f000) {
                    continue;
                }
                const PROT: u64 = (libc::PROT_READ | libc::PROT_WRITE | libc::PROT_EXEC) as u64;
                const FLAGS: u64 =
                    (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE) as u64;
                // The injection runs client code: queued writes go first.
                self.flush()?;
                let r = inj(
                    libc::SYS_mmap as u64,
                    [cand, CHUNK_SIZE, PROT, FLAGS, u64::MAX, 0],
                )?;
                if r as u64 == cand {
                    return self.add_chunk(cand);
                }
                if r >= 0 {
                    // An old kernel ignored NOREPLACE and mapped elsewhere.
                    inj(libc::SYS_munmap as u64, [r as u64, CHUNK_SIZE, 0, 0, 0, 0])?;
                }
            }
        }
        Err(EngineError(format!(
            "cannot place a code-cache chunk within reach of {guest:#x}"
        )))
    }

    fn add_chunk(&mut self, base: u64) -> Result<usize, EngineError> {
        let mut e = Emitter::new(base);
        e.miss_stub(layout::MAGIC_MISS);
        e.align8();
        let probe_stub = e.here();
        e.probe_stub((self.core + layout::HTAB) as u32, base);
        e.align8();
        self.write(base, &e.bytes)?;
        self.chunks.push(Chunk {
            base,
            code_next: e.here(),
            aux_low: base + CHUNK_SIZE,
            probe_stub,
        });
        Ok(self.chunks.len() - 1)
    }

    /// Emits a stub in chunk `ci` that exits to the tool for `target`.
    fn stub(&mut self, ci: usize, target: u64) -> Result<u64, EngineError> {
        if let Some(&s) = self.stub_for.get(&(ci, target)) {
            return Ok(s);
        }
        let mut e = Emitter::new(0);
        e.exit_stub(layout::MAGIC_LINK);
        let at = self.chunks[ci].aux(e.bytes.len() as u64);
        let mut e = Emitter::new(at);
        e.exit_stub(layout::MAGIC_LINK);
        let stop = e.here();
        self.write(e.base, &e.bytes)?;
        self.stubs.insert(stop, target);
        self.stub_for.insert((ci, target), e.base);
        Ok(e.base)
    }

    /// A far jump to `dest` placed in chunk `ci` (for rel32 overflow).
    fn trampoline(&mut self, ci: usize, dest: u64) -> Result<u64, EngineError> {
        let at = self.chunks[ci].aux(Emitter::JMP_FAR_BYTES);
        let mut e = Emitter::new(at);
        e.jmp_far(dest);
        self.write(at, &e.bytes)?;
        Ok(at)
    }

    fn chunk_of(&self, host: u64) -> usize {
        self.chunks
            .iter()
            .position(|c| c.base <= host && host < c.base + CHUNK_SIZE)
            .expect("host address in a chunk")
    }

    /// Points the rel32 field at `site` to `dest` (via a trampoline if far).
    fn patch(&mut self, site: u64, dest: u64) -> Result<(), EngineError> {
        let mut dest = dest;
        let mut d = dest.wrapping_sub(site + 4) as i64;
        if d < i32::MIN as i64 || d > i32::MAX as i64 {
            dest = self.trampoline(self.chunk_of(site), dest)?;
            d = dest.wrapping_sub(site + 4) as i64;
        }
        self.write_live(site, d as i32 as u32 as u64, 4)
    }

    /// Writes a 4- or 8-byte value into code or data that other threads may
    /// be running or reading right now. With several threads it is queued
    /// for the patch gadget (one atomic store each, after all other writes
    /// of this stop); alone, a plain write will do.
    fn write_live(&mut self, addr: u64, value: u64, size: u32) -> Result<(), EngineError> {
        self.out.write_live(addr, value, size);
        Ok(())
    }

    /// The queued live patches (see [`Space::write_live`]); the caller runs
    /// the patch gadget with them before the client continues.
    pub fn take_live_patches(&mut self) -> Vec<(u64, u64, u32)> {
        self.out.take_live()
    }

    /// Host body of the translation of `guest`, translating it (and some of
    /// its direct successors, eagerly) if needed.
    pub fn ensure(&mut self, guest: u64, inj: &mut Injector) -> Result<u64, EngineError> {
        if let Some(b) = self.blocks.get(&guest) {
            return Ok(b.body);
        }
        let started = std::time::Instant::now();
        let result = self.ensure_new(guest, inj);
        self.stats.translation_time += started.elapsed();
        result
    }

    /// [`Space::ensure`] for a block not translated yet.
    fn ensure_new(&mut self, guest: u64, inj: &mut Injector) -> Result<u64, EngineError> {
        self.fresh.clear();
        let body = self.translate_one(guest, inj)?;
        // Eager translation of nearby successors saves one tool exit each;
        // failures there are ignored (the stub reports them if ever run).
        // Blocks chained into a translation are fresh too: their successors
        // are explored as well.
        let mut queue: VecDeque<u64> = VecDeque::new();
        let mut budget = 64;
        loop {
            for g in std::mem::take(&mut self.fresh) {
                self.push_successors(g, &mut queue);
            }
            let Some(g) = queue.pop_front() else { break };
            if budget == 0 {
                break;
            }
            if self.blocks.contains_key(&g) {
                continue;
            }
            budget -= 1;
            let _ = self.translate_one(g, inj);
        }
        self.fresh.clear();
        Ok(body)
    }

    fn push_successors(&self, guest: u64, queue: &mut VecDeque<u64>) {
        if let Some(s) = self.successors.get(&guest) {
            queue.extend(s.iter().copied());
        }
    }

    fn translate_one(&mut self, guest: u64, inj: &mut Injector) -> Result<u64, EngineError> {
        self.translate_at(guest, inj, None, 0)
    }

    /// Translates `guest` into chunk `forced` (at its `code_next`, right
    /// after the block that falls into it) or a chunk near it. A block whose
    /// code ends with a jump to an untranslated block gets that block placed
    /// right after it, without the jump (up to `MAX_CHAIN` in a row), so
    /// hot fall-through paths run straight through as natively.
    fn translate_at(
        &mut self,
        guest: u64,
        inj: &mut Injector,
        forced: Option<usize>,
        depth: u32,
    ) -> Result<u64, EngineError> {
        const MAX_CHAIN: u32 = 8;
        let m = self.mapping_of(guest)?;
        let key = (m.start, m.end, m.offset, m.path.clone());
        let module = match self.recorded.get(&key) {
            Some(&i) => i,
            None => {
                self.modules.push(ModuleRecord {
                    path: PathBuf::from(&m.path),
                    start: m.start,
                    end: m.end,
                    file_offset: m.offset,
                });
                self.recorded.insert(key, self.modules.len() - 1);
                self.modules.len() - 1
            }
        };
        let len = (m.end - guest).min(4096) as usize;
        let code = self.read_code(guest, len)?;
        let ci = match forced {
            Some(ci) => ci,
            None => self.chunk_near(guest, inj)?,
        };
        let host = self.chunks[ci].code_next;
        let mut aux_writes = Vec::new();
        let mut ctx = Ctx {
            chunk: &mut self.chunks[ci],
            core: self.core,
            count_lookups: self.count_lookups,
            next_counter: &mut self.next_counter,
            writes: &mut aux_writes,
        };
        let mut t =
            translate::translate(&code, guest, host, &mut ctx).map_err(|e| EngineError(e.0))?;
        if t.code.len() as u64 > MAX_BLOCK_BYTES {
            return Err(EngineError(format!(
                "translation of {guest:#x} is too large"
            )));
        }
        debug_assert_eq!(t.host, host);
        for (at, bytes) in aux_writes {
            self.write(at, &bytes)?;
        }
        // Chain the tail block right after this one?
        let chain = t.tail.filter(|&next| {
            depth < MAX_CHAIN
                && next != guest
                && !self.blocks.contains_key(&next)
                && next >= m.start
                && next < m.end
                && self.chunks[ci].has_room_after(host + t.code.len() as u64)
        });
        if chain.is_some() {
            t.code.truncate(t.code.len() - 5);
            t.exits.pop();
        }
        self.chunks[ci].code_next = host + t.code.len() as u64;
        // Link exits: to the translation if it exists, else to a stub.
        let mut new_pending = Vec::new();
        for &(site, target) in &t.exits {
            let dest = match self.blocks.get(&target) {
                Some(b) => b.body,
                None if target == guest => t.body,
                None => {
                    new_pending.push((target, site));
                    self.stub(ci, target)?
                }
            };
            let d = dest.wrapping_sub(site + 4) as i64;
            let off = (site - host) as usize;
            if d < i32::MIN as i64 || d > i32::MAX as i64 {
                // Leave it to `patch` once the code is in place.
                new_pending.push((target, site));
                continue;
            }
            t.code[off..off + 4].copy_from_slice(&(d as i32).to_le_bytes());
        }
        self.write(host, &t.code)?;
        for (target, site) in new_pending {
            if let Some(b) = self.blocks.get(&target) {
                let body = b.body;
                self.patch(site, body)?;
            } else {
                self.pending.entry(target).or_default().push(site);
            }
        }
        for s in &t.syscalls {
            self.syscalls.insert(s.stop_rip, *s);
        }
        // Return sites are reached by `ret` through the table: translate
        // them eagerly and publish them as soon as they exist.
        let mut succ = t.successors.clone();
        succ.extend(t.call_returns.iter().copied());
        self.successors.insert(guest, succ);
        for &r in &t.call_returns {
            if self.blocks.contains_key(&r) {
                self.publish(r)?;
            } else {
                self.return_sites.insert(r);
            }
        }
        self.stats.blocks_translated += 1;
        self.stats.guest_instructions_translated += t.counted.len() as u64 + t.reps.len() as u64;
        self.blocks.insert(
            guest,
            Block {
                body: t.body,
                guest_end: t.guest_end,
                module,
                counter: t.counter,
                counted: std::mem::take(&mut t.counted),
                reps: std::mem::take(&mut t.reps),
            },
        );
        self.starts.insert(guest);
        self.fresh.push(guest);
        if self.return_sites.remove(&guest) {
            self.publish(guest)?;
        }
        for old in self.retired_bodies.remove(&guest).unwrap_or_default() {
            // The old body starts with `jmp rel32`: retarget it.
            self.patch(old + 1, t.body)?;
        }
        if let Some(sites) = self.pending.remove(&guest) {
            for site in sites {
                self.patch(site, t.body)?;
            }
        }
        if let Some(next) = chain {
            let end = self.chunks[ci].code_next;
            if self.translate_at(next, inj, Some(ci), depth + 1).is_err() {
                // Put the jump back (the error shows if it is ever taken).
                let stub = self.stub(ci, next)?;
                let mut e = Emitter::new(end);
                e.align_rel32(1);
                let site = e.jmp(stub);
                self.chunks[ci].code_next = e.here();
                self.write(end, &e.bytes)?;
                self.pending.entry(next).or_default().push(site);
            }
        }
        Ok(t.body)
    }

    /// The guest range `[start, end)` is being unmapped or remapped: drop
    /// the translations of code in it. Their entry now jumps to an exit stub
    /// (so direct links from other blocks retranslate on the next run) and
    /// their counts stay (attributed to the addresses they ran at).
    pub fn invalidate(&mut self, start: u64, end: u64) -> Result<(), EngineError> {
        self.maps.clear();
        self.pages.retain(|&p, _| p + 4096 <= start || p >= end);
        // A later mapping of the same range is a new module.
        self.recorded.retain(|k, _| k.1 <= start || k.0 >= end);
        let lo = start.saturating_sub(layout::MAX_BLOCK_GUEST_BYTES);
        let hit: Vec<u64> = self
            .starts
            .range(lo..end)
            .copied()
            .filter(|g| self.blocks.get(g).is_some_and(|b| b.guest_end > start))
            .collect();
        if !hit.is_empty() && std::env::var_os("CACHESCOPE_ENGINE_DEBUG").is_some() {
            eprintln!(
                "[engine] dropping {} blocks in {start:#x}..{end:#x}",
                hit.len()
            );
        }
        for g in hit {
            let b = self.blocks.remove(&g).expect("listed block");
            self.starts.remove(&g);
            self.successors.remove(&g);
            let ci = self.chunk_of(b.body);
            let stub = self.stub(ci, g)?;
            let mut e = Emitter::new(b.body);
            e.jmp(stub);
            self.write(b.body, &e.bytes)?;
            self.ibt.remove(g, &mut self.out);
            self.retired_bodies.entry(g).or_default().push(b.body);
            self.retired.push(b);
        }
        Ok(())
    }

    /// The guest block whose translation contains host address `host`
    /// (diagnostics only: a linear search).
    pub fn guest_block_of(&self, host: u64) -> Option<u64> {
        self.blocks
            .iter()
            .filter(|(_, b)| b.body <= host)
            .max_by_key(|(_, b)| b.body)
            .map(|(&g, _)| g)
    }

    /// A code-cache entry point for the client's signal handler `guest`:
    /// what the kernel is told to call. It enters the translation through
    /// the indirect-branch lookup.
    pub fn signal_trampoline(
        &mut self,
        guest: u64,
        inj: &mut Injector,
    ) -> Result<u64, EngineError> {
        if let Some(&t) = self.trampolines.get(&guest) {
            return Ok(t);
        }
        let ci = self.chunk_near(guest, inj)?;
        let htab = (self.core + layout::HTAB) as u32;
        let count = self.count_lookups;
        let emit = |e: &mut Emitter, probe: u64| {
            e.spill_rax_rcx();
            e.target_rcx(guest);
            e.lookup(htab, probe, count);
        };
        let probe = self.chunks[ci].probe_stub;
        let mut sizing = Emitter::new(probe);
        emit(&mut sizing, probe);
        let at = self.chunks[ci].aux(sizing.bytes.len() as u64);
        let mut e = Emitter::new(at);
        emit(&mut e, probe);
        self.write(e.base, &e.bytes)?;
        self.trampolines.insert(guest, e.base);
        Ok(e.base)
    }

    /// Makes `guest` reachable through the indirect-branch table.
    pub fn publish(&mut self, guest: u64) -> Result<(), EngineError> {
        let body = match self.blocks.get(&guest) {
            Some(b) => b.body,
            None => return Ok(()),
        };
        if !self.ibt.contains(guest) {
            self.ibt.insert(guest, body, &mut self.out);
        }
        Ok(())
    }

    /// The `--stats=yes` figures, with what translated code counted in the
    /// thread areas still alive.
    fn stats_at_exit(&self) -> crate::EngineStats {
        let mut s = self.stats.clone();
        let mut lookups = self.lookup_totals;
        for &area in &self.areas {
            add_lookup_counts(&mut lookups, &self.read_lookup_counts(area));
        }
        [s.lookup_inline_hits, s.lookup_probes, s.lookup_probe_hits] = lookups;
        s.table_targets = self.ibt.len() as u64;
        s.table_overflow_buckets = self.ibt.overflow_buckets() as u64;
        s.table_refused = self.ibt.refused();
        s.code_cache_chunks = self.chunks.len() as u64;
        s.code_cache_bytes = self
            .chunks
            .iter()
            .map(|c| (c.code_next - c.base) + (c.base + CHUNK_SIZE - c.aux_low))
            .sum();
        s
    }

    /// The lookup counters of the thread area at `area` (see
    /// `layout::S_STAT_INLINE_HITS`).
    fn read_lookup_counts(&self, area: u64) -> [u64; 3] {
        let mut out = [0; 3];
        if let Ok(bytes) = self.read(area + u64::from(layout::S_STAT_INLINE_HITS), 24) {
            for (o, w) in out.iter_mut().zip(bytes.chunks_exact(8)) {
                *o = u64::from_le_bytes(w.try_into().expect("8 bytes"));
            }
        }
        out
    }

    /// Reads every counter and attributes it to guest instructions.
    pub fn collect(&self, pid: i32) -> ProcessProfile {
        if let Some(dir) = std::env::var_os("CACHESCOPE_ENGINE_DUMP") {
            // Debugging aid: the code cache as it is, one file per chunk.
            for c in &self.chunks {
                if let Ok(code) = self.read(c.base, (CHUNK_SIZE) as usize) {
                    let path =
                        std::path::Path::new(&dir).join(format!("chunk-{pid}-{:x}.bin", c.base));
                    let _ = std::fs::write(path, code);
                }
            }
        }
        let mut counts = self.totals.clone();
        for &area in &self.areas {
            add_into(&mut counts, &self.read_area(area));
        }
        let get = |off: u32| {
            counts
                .get(((off - layout::AREA_COUNTERS) / 8) as usize)
                .copied()
                .unwrap_or(0)
        };
        let add = |map: &mut std::collections::HashMap<u64, u64>, b: &Block| {
            let n = get(b.counter);
            if n != 0 {
                for &a in &b.counted {
                    *map.entry(a).or_default() += n;
                }
            }
            for &(a, ctr) in &b.reps {
                let n = get(ctr);
                if n != 0 {
                    *map.entry(a).or_default() += n;
                }
            }
        };
        let mut instr_counts = std::collections::HashMap::new();
        for b in self.blocks.values() {
            add(&mut instr_counts, b);
        }
        let mut unmapped: HashMap<usize, std::collections::HashMap<u64, u64>> = HashMap::default();
        for b in &self.retired {
            add(unmapped.entry(b.module).or_default(), b);
        }
        let mut unmapped: Vec<UnmappedCode> = unmapped
            .into_iter()
            .filter(|(_, c)| !c.is_empty())
            .map(|(m, instr_counts)| UnmappedCode {
                module: self.modules.get(m).cloned(),
                instr_counts,
            })
            .collect();
        unmapped.sort_by_key(|u| u.module.as_ref().map(|m| (m.start, m.path.clone())));
        ProcessProfile {
            pid,
            stats: self.count_lookups.then(|| {
                let mut s = self.stats_at_exit();
                s.blocks_executed = self
                    .blocks
                    .values()
                    .chain(&self.retired)
                    .filter(|b| get(b.counter) != 0)
                    .count() as u64;
                s
            }),
            instr_counts,
            modules: self.modules.clone(),
            unmapped,
        }
    }
}

fn add_lookup_counts(total: &mut [u64; 3], add: &[u64; 3]) {
    for (t, a) in total.iter_mut().zip(add) {
        *t += a;
    }
}

fn add_into(total: &mut Vec<u64>, add: &[u64]) {
    if total.len() < add.len() {
        total.resize(add.len(), 0);
    }
    for (t, a) in total.iter_mut().zip(add) {
        *t += a;
    }
}

struct Ctx<'a> {
    chunk: &'a mut Chunk,
    core: u64,
    count_lookups: bool,
    next_counter: &'a mut u32,
    /// Aux-area bytes to write once translation succeeded.
    writes: &'a mut Vec<(u64, Vec<u8>)>,
}

impl TransCtx for Ctx<'_> {
    fn alloc_counter(&mut self) -> u32 {
        let c = *self.next_counter;
        *self.next_counter += 8;
        c
    }
    fn probe_stub(&self) -> u64 {
        self.chunk.probe_stub
    }
    fn count_lookups(&self) -> bool {
        self.count_lookups
    }
    fn literal(&mut self, value: u64) -> u64 {
        let at = self.chunk.aux(8);
        self.writes.push((at, value.to_le_bytes().to_vec()));
        at
    }
    fn core(&self) -> u64 {
        self.core
    }
}

fn open_mem(pid: i32) -> Result<File, EngineError> {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(format!("/proc/{pid}/mem"))
        .map_err(|e| io_err("cannot open the client's memory", e))
}

fn parse_maps_line(line: &str) -> Option<Mapping> {
    let mut it = line.split_ascii_whitespace();
    let range = it.next()?;
    let perms = it.next()?;
    let offset = u64::from_str_radix(it.next()?, 16).ok()?;
    let _dev = it.next()?;
    let _inode = it.next()?;
    let path = it.collect::<Vec<_>>().join(" ");
    let (s, e) = range.split_once('-')?;
    Some(Mapping {
        start: u64::from_str_radix(s, 16).ok()?,
        end: u64::from_str_radix(e, 16).ok()?,
        exec: perms.as_bytes().get(2) == Some(&b'x'),
        write: perms.as_bytes().get(1) == Some(&b'w'),
        offset,
        path,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_lines_parse() {
        let m = parse_maps_line(
            "7ffff7dd3000-7ffff7f3b000 r-xp 00028000 fe:01 1234   /usr/lib/x86_64-linux-gnu/libc.so.6",
        )
        .unwrap();
        assert_eq!(m.start, 0x7ffff7dd3000);
        assert!(m.exec);
        assert_eq!(m.offset, 0x28000);
        assert_eq!(m.path, "/usr/lib/x86_64-linux-gnu/libc.so.6");
        let v = parse_maps_line("7ffff7fc1000-7ffff7fc3000 r-xp 00000000 00:00 0  [vdso]").unwrap();
        assert_eq!(v.path, "[vdso]");
    }
}
