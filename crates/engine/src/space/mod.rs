//! One client address space as the tracer sees it, and the translation of
//! its code into the code cache.
//!
//! [`Space::ensure`] is the heart: the translation of a guest address (and,
//! eagerly, of its direct successors and the return sites of its calls),
//! each block placed in a chunk near its code, right after its predecessor
//! when that falls into it, its exits linked, its return sites published.
//! The parts have a module each:
//!
//! * `chunks`: the code cache: chunks and where they go, the aux area,
//!   exit stubs, far jumps, signal-handler entries;
//! * `links`: direct branches between blocks, and the fields waiting for a
//!   target's translation;
//! * `lookups`: which targets the indirect-branch table offers;
//! * `invalidate`: dropping the translations of a guest range;
//! * `blocks`: the block table, live and retired blocks;
//! * `areas`: thread areas and their counters;
//! * `modules`: the memory map, module records, guest code pages;
//! * `collect`: the profile at exit;
//! * `trace`: trace mode's block ids, flush sites and buffer hand-over.
//!
//! Everything done to the client goes through a [`ClientMemory`] (and an
//! [`Injector`] for the few syscalls the client must make itself), so all of
//! this runs in unit tests against a fake memory.

mod areas;
mod blocks;
mod chunks;
mod collect;
mod contexts;
mod invalidate;
mod links;
mod lookups;
mod modules;
pub(crate) mod quiet;
mod sites;
mod trace;

pub(crate) use trace::{RecordDelivery, Tracing, MARK_SIGNAL, MARK_SIGRETURN};

use crate::client_mem::ClientMemory;
use crate::emit::{self, Emitter};
use crate::layout::{self, MAX_BLOCK_BYTES};
use crate::translate::{self, PointKind, SyscallSite, TransCtx, TransError};
use crate::{EngineError, EngineStats, ModuleRecord, SmcCheck};
use areas::Areas;
use blocks::{Block, Blocks};
use chunks::{Chunk, CodeCache};
use contexts::ContextsCtx;
pub use contexts::{runtime_config, Contexts, FACTS_CAPACITY};
use links::Links;
use lookups::Lookups;
use modules::Modules;
use rustc_hash::FxHashMap as HashMap;
use sites::HostSites;
pub use sites::{GuestPoint, Resumption};
use std::collections::VecDeque;

/// Performs one syscall inside the stopped client thread: `(nr, args)` ->
/// result (negative errno on failure).
pub type Injector<'a> = dyn FnMut(u64, [u64; 6]) -> Result<i64, EngineError> + 'a;

/// Makes the client create a memory file of `len` bytes (`memfd_create`,
/// close-on-exec, then `ftruncate`) through `inj`, in the address space
/// whose core region is at `core`: its descriptor in the client, or `None`
/// if either call failed (the descriptor closed again).
fn client_memory_file(core: u64, len: u64, inj: &mut Injector) -> Result<Option<u64>, EngineError> {
    // The name is an empty string: the interest byte of syscall 65535
    // (always 0).
    let name = core + layout::SYSTAB + 0xffff;
    let fd = inj(
        libc::SYS_memfd_create as u64,
        [name, libc::MFD_CLOEXEC as u64, 0, 0, 0, 0],
    )?;
    if fd < 0 {
        return Ok(None);
    }
    let fd = fd as u64;
    if inj(libc::SYS_ftruncate as u64, [fd, len, 0, 0, 0, 0])? != 0 {
        inj(libc::SYS_close as u64, [fd, 0, 0, 0, 0, 0])?;
        return Ok(None);
    }
    Ok(Some(fd))
}

/// Most blocks placed in a row right after the block that falls into them.
const MAX_CHAIN: u32 = 8;

/// Most blocks translated eagerly per [`Space::ensure`].
const EAGER_BUDGET: u32 = 64;

/// The same in trace mode, where a translation costs several times more
/// (a filtered block's checks and paths) and most eager ones never run
/// (cc1: 60 % of its blocks): 16 made a small compile's peak memory 18 %
/// lower at the same speed (7.3 s against 6.6-7.4 s, three runs each).
const EAGER_BUDGET_TRACED: u32 = 16;

/// The tracer's view of one client address space.
pub struct Space {
    /// The client's memory.
    mem: Box<dyn ClientMemory>,
    /// Base address of the core region.
    pub core: u64,
    cache: CodeCache,
    blocks: Blocks,
    links: Links,
    lookups: Lookups,
    areas: Areas,
    modules: Modules,
    /// Syscall sites by stop RIP.
    syscalls: HashMap<u64, SyscallSite>,
    /// Client-request sites by stop RIP.
    requests: HashMap<u64, SyscallSite>,
    /// Guest addresses of the instructions that raise SIGILL, by the host
    /// address of the `ud2` standing for each.
    sigills: HashMap<u64, u64>,
    /// Retired bodies whose entry became an `int3` (see
    /// `invalidate::retire`): their guest addresses, by body.
    entry_traps: HashMap<u64, u64>,
    /// The guest instructions of translated code, by host address.
    sites: HostSites,
    /// Whether blocks are translated instrumented (counted or traced):
    /// off between `CACHEGRIND_STOP_INSTRUMENTATION` and `_START`.
    instrumented: bool,
    /// The last id handed out by `VALGRIND_STACK_REGISTER`.
    stack_ids: u64,
    /// Direct successors of the blocks translated during the current
    /// `ensure`, not yet queued for eager translation.
    fresh: Vec<u64>,
    /// Whether translated code counts inline lookup hits (`--stats=yes`).
    pub count_lookups: bool,
    /// Which blocks check their guest code on entry (`--smc-check`).
    pub smc_check: SmcCheck,
    /// The stack pointer of the thread code is translated for (what
    /// `--smc-check=stack` asks about).
    pub stack_pointer: u64,
    /// What `--stats=yes` reports.
    pub stats: EngineStats,
    /// Trace mode (a tool needs records), if on.
    tracing: Option<Tracing>,
    /// Contexts mode (the client keeps its calling contexts), if on.
    contexts: Option<Contexts>,
}

impl Space {
    /// A new address space whose core region is already mapped at `core`.
    /// The modules code was first translated from since the previous
    /// call (so that a profiler can start reading their symbols early).
    pub fn take_new_modules(&mut self) -> Vec<ModuleRecord> {
        self.modules.take_new()
    }

    pub fn new(mem: Box<dyn ClientMemory>, core: u64) -> Space {
        Space {
            mem,
            core,
            cache: CodeCache::new(core),
            blocks: Blocks::default(),
            links: Links::default(),
            lookups: Lookups::new(core),
            areas: Areas::new(),
            modules: Modules::default(),
            syscalls: HashMap::default(),
            requests: HashMap::default(),
            sigills: HashMap::default(),
            entry_traps: HashMap::default(),
            sites: HostSites::default(),
            instrumented: true,
            stack_ids: 0,
            fresh: Vec::new(),
            count_lookups: false,
            smc_check: SmcCheck::default(),
            stack_pointer: 0,
            stats: EngineStats::default(),
            tracing: None,
            contexts: None,
        }
    }

    /// The copy a forked child gets: its memory, `mem`, is a copy of ours.
    pub fn fork_copy(&mut self, mem: Box<dyn ClientMemory>) -> Result<Space, EngineError> {
        let tracing = self.tracing.as_ref().map(|t| t.fork(t.link.fork()));
        let mut child = Space {
            mem,
            core: self.core,
            cache: self.cache.clone(),
            blocks: self.blocks.clone(),
            links: self.links.clone(),
            lookups: self.lookups.clone(),
            areas: self.areas.clone(),
            modules: self.modules.clone(),
            syscalls: self.syscalls.clone(),
            requests: self.requests.clone(),
            sigills: self.sigills.clone(),
            entry_traps: self.entry_traps.clone(),
            sites: self.sites.clone(),
            instrumented: self.instrumented,
            stack_ids: self.stack_ids,
            fresh: Vec::new(),
            count_lookups: self.count_lookups,
            smc_check: self.smc_check,
            stack_pointer: self.stack_pointer,
            stats: self.stats.clone(),
            tracing,
            contexts: self.contexts.as_ref().map(Contexts::fork),
        };
        // The child's copies of the buffers hold the parent's records.
        for area in child.areas.live_areas() {
            child.reset_trace(area);
        }
        // Chunks shared with the tool are the child's private mappings of
        // the same memory file: a page the child has not written still
        // shows what the tool writes there for the parent. Writing each
        // used page once (the same byte back) gives the child its own copy
        // of the code it inherited; its later writes copy the rest.
        for page in self.cache.used_pages() {
            let byte = self.mem.read(page, 1)?;
            child.mem.write(page, &byte);
        }
        child.mem.flush()?;
        Ok(child)
    }

    /// The client's memory.
    pub fn mem(&mut self) -> &mut dyn ClientMemory {
        &mut *self.mem
    }

    /// A thread area for a new thread (its GS base).
    pub fn alloc_area(&mut self, inj: &mut Injector) -> Result<u64, EngineError> {
        let area = self.areas.alloc(&mut *self.mem, inj)?;
        self.share_trace_buffers(area, inj)?;
        self.reset_trace(area);
        self.fresh_contexts(area);
        Ok(area)
    }

    /// A forked child, stopped before it runs, whose one thread has the
    /// area `area`: its trace buffers (the parent's were not copied) are
    /// mapped anew.
    pub fn child_buffers(&mut self, area: u64, inj: &mut Injector) -> Result<(), EngineError> {
        self.share_trace_buffers(area, inj)
    }

    /// A thread exited: its counters join the totals and its area is
    /// recycled. (Called while the client's memory is still there.)
    pub fn thread_exited(&mut self, area: u64) {
        self.drain_trace(area);
        self.contexts_thread_ended(area, layout::valgrind_thread_id(area) as u32);
        self.areas.thread_exited(area, &mut *self.mem);
    }

    /// The process has exited and its profile is collected: the memory
    /// files it shares with the tool are emptied, so that the profile's
    /// building does not add its peak to the client's code cache and
    /// trace buffers (a forked child runs only code it has its own copy
    /// of, see [`Space::fork_copy`]).
    pub fn discard_shared(&mut self) {
        self.mem.discard_shared();
    }

    /// The guest target of the exit stub that stopped at `rip`, and how
    /// far past the target's translation the thread goes on (past its
    /// context entry when the transfer keeps the context, contexts mode).
    pub fn stub_target(&self, rip: u64) -> Option<(u64, u64)> {
        let t = self.cache.stub_target(rip)?;
        Some(if t & links::PLAIN != 0 {
            (t & !links::PLAIN, emit::CONTEXT_ENTRY_BYTES)
        } else {
            (t, 0)
        })
    }

    /// Where a thread whose block was translated again after its guest
    /// code changed goes on in the new translation at `body`: past the
    /// context entry in contexts mode (the old one's ran).
    pub fn retranslated_entry(&self, body: u64) -> u64 {
        if self.contexts.is_some() {
            body + emit::CONTEXT_ENTRY_BYTES
        } else {
            body
        }
    }

    /// The syscall site that stopped at `rip` (an error names an unknown
    /// one: a stop at a syscall exit comes from a site the tool made).
    pub fn syscall_site(&self, rip: u64) -> Result<SyscallSite, EngineError> {
        self.syscalls
            .get(&rip)
            .copied()
            .ok_or_else(|| EngineError(format!("unknown syscall site at {rip:#x}")))
    }

    /// The client-request site that stopped at `rip`.
    pub fn request_site(&self, rip: u64) -> Option<SyscallSite> {
        self.requests.get(&rip).copied()
    }

    /// The guest address of the instruction whose SIGILL was raised at host
    /// address `rip`, if it is one of ours.
    pub fn sigill_site(&self, rip: u64) -> Option<u64> {
        self.sigills.get(&rip).copied()
    }

    /// The guest instruction whose translated code holds host address
    /// `host`, and where the guest's registers are there, if `host` is in
    /// the code of a guest instruction (not in a stub or the engine's own
    /// code between instructions).
    pub fn guest_point(&self, host: u64) -> Option<GuestPoint> {
        self.sites.lookup(host)
    }

    /// A synchronous signal stopped a thread of area `area` at host `host`
    /// with `rcx` its guest RCX: if the guest instruction there is a rep
    /// string instruction with its own counter, the counter is made what
    /// Cachegrind counts for the iterations begun so far (the faulting one
    /// included), whatever the handler does next (leave with `siglongjmp`,
    /// or return, and the instruction goes on as a new execution). A
    /// plain `rep` added RCX + 1 before it ran: RCX (the iterations left)
    /// comes off. A `repe`/`repne` adds its count after it runs: the
    /// iterations begun, RCX before minus RCX now plus one, go on. And the
    /// block's instructions after it are not counted for this execution
    /// (VEX ends a superblock at a rep instruction: Cachegrind counts what
    /// follows only when it runs; see [`Space::fault_in_block`]).
    pub fn rep_faulted(&mut self, host: u64, rcx: u64, area: u64) -> Result<(), EngineError> {
        let Some(p) = self.sites.lookup(host) else {
            return Ok(());
        };
        let Some(&(_, ctr)) = self
            .blocks
            .get(p.block)
            .and_then(|b| b.reps().iter().find(|&&(at, _)| at == p.guest))
        else {
            return Ok(());
        };
        let code = self.mem.read(p.guest, (p.next - p.guest) as usize)?;
        let slot = area + u64::from(ctr);
        let count = self.mem.read_u64(slot)?;
        let count = if translate::is_cond_rep_at(&code, p.guest) {
            let before = self.mem.read_u64(area + u64::from(layout::S_RCX0))?;
            count.wrapping_add(before.wrapping_sub(rcx).wrapping_add(1))
        } else {
            count.wrapping_sub(rcx)
        };
        self.mem.write(slot, &count.to_le_bytes());
        self.cut_execution(p.block, None, host, p.next);
        Ok(())
    }

    /// An asynchronous signal interrupted a thread of area `area` (guest
    /// RCX `rcx`) at host `host`: if that is a clean point, the signal is
    /// to be delivered with the guest instruction there as the RIP, and
    /// whatever follows (the handler returns there as a new block, or
    /// leaves) this execution of the block counts exactly the instructions
    /// before it, and a rep string instruction interrupted part-way the
    /// iterations done (the rest count when it goes on, as a new
    /// execution). Returns the point, or `None` when `host` is not one
    /// (inside the engine's own code between guest instructions).
    pub fn interrupted(
        &mut self,
        host: u64,
        rcx: u64,
        area: u64,
    ) -> Result<Option<Resumption>, EngineError> {
        let Some(p) = self.sites.clean_point(host) else {
            return Ok(None);
        };
        if let PointKind::Rep { cond } = p.kind {
            let Some(&(_, ctr)) = self
                .blocks
                .get(p.block)
                .filter(|b| b.body == p.body)
                .and_then(|b| b.reps().iter().find(|&&(at, _)| at == p.guest))
            else {
                return Ok(None);
            };
            let slot = area + u64::from(ctr);
            let count = self.mem.read_u64(slot)?;
            let count = if cond {
                // The iterations done so far; the count after it comes
                // when it goes on.
                let before = self.mem.read_u64(area + u64::from(layout::S_RCX0))?;
                count.wrapping_add(before.wrapping_sub(rcx))
            } else {
                // RCX + 1 were added for the whole; the rest are added
                // again when it goes on.
                count.wrapping_sub(rcx.wrapping_add(1))
            };
            self.mem.write(slot, &count.to_le_bytes());
        }
        self.cut_execution(p.block, Some(p.body), host, p.guest);
        Ok(Some(p))
    }

    /// A signal stopped a thread at host `host` in a translation of block
    /// `block` (at `body`, when known), and this execution of the block
    /// ends there: it counts its instructions before guest address `end`,
    /// once. The block counter counts all of them at once; whatever the
    /// handler does next (leave with `siglongjmp`, or return, and the code
    /// goes on from there as a new block), the instructions from `end` on
    /// would be counted once too many if the counter had run, and the ones
    /// before it never if it had not. (For a fault, only in rep
    /// instructions, where this is Cachegrind's count; elsewhere VEX's
    /// batching of Ir events within a superblock decides what Cachegrind
    /// counts before a fault, docs/conformance.md.)
    fn cut_execution(&mut self, block: u64, body: Option<u64>, host: u64, end: u64) {
        let Some(b) = self.blocks.get_mut(block) else {
            return;
        };
        if b.counter == 0 || b.counter_end == 0 || body.is_some_and(|body| body != b.body) {
            // Uncounted, or a retired translation (whose counter is not
            // this block's).
            return;
        }
        let counted_already = host >= b.counter_end;
        let (counted, deltas) = b.counted_and_deltas_mut();
        for (&a, d) in counted.iter().zip(deltas) {
            match (counted_already, a >= end) {
                (true, true) => *d -= 1,
                (false, false) => *d += 1,
                _ => {}
            }
        }
    }

    /// The host address a thread interrupted at `host` inside a counter
    /// update should resume at (see `HostSites::interrupted_counter_update`).
    pub fn interrupted_counter_update(&self, host: u64) -> Option<u64> {
        self.sites.interrupted_counter_update(host)
    }

    /// Whether host address `host` is in the code cache (else it is the
    /// client's own code).
    pub fn in_code_cache(&self, host: u64) -> bool {
        self.cache.holds(host)
    }

    /// Whether host address `host` is the engine's: the code cache or the
    /// core region (gadgets, stubs).
    pub fn in_engine_code(&self, host: u64) -> bool {
        self.in_code_cache(host) || (self.core..self.core + layout::CORE_SIZE).contains(&host)
    }

    /// Whether host address `host` is inside contexts mode's runtime: the
    /// context entries' stub or the runtime blob, where the runtime's words
    /// may be half-written (a signal handler must not enter it there).
    pub fn in_context_runtime(&self, host: u64) -> bool {
        self.contexts.as_ref().is_some_and(|c| {
            (self.core + layout::RT_STUB..self.core + layout::HTAB).contains(&host)
                || c.in_quiet(host)
        })
    }

    /// Whether host address `host` is where a thread leaves contexts
    /// mode's runtime without looking for a waiting signal again (see
    /// `Contexts::in_exit_window`).
    pub fn in_context_exit(&self, host: u64) -> bool {
        self.contexts
            .as_ref()
            .is_some_and(|c| c.in_exit_window(host))
    }

    /// Leaving a signal handler of the stopped thread whose area is `area`:
    /// see [`areas::Areas::pop_signal_spills`].
    pub fn pop_signal_spills(&mut self, area: u64) -> Result<(), EngineError> {
        areas::Areas::pop_signal_spills(area, &mut *self.mem)
    }

    /// The executable mappings code was translated from so far.
    pub fn module_records(&self) -> &[crate::ModuleRecord] {
        self.modules.records()
    }

    /// A new id for a stack the client registers (1, 2, ... per process,
    /// as Valgrind numbers them).
    pub fn new_stack_id(&mut self) -> u64 {
        self.stack_ids += 1;
        self.stack_ids
    }

    /// Whether the space is in trace mode (records for a tool).
    pub fn is_tracing(&self) -> bool {
        self.tracing.is_some()
    }

    /// Whether translations keep no clean points (trace and contexts
    /// modes: a block's records or runtime calls cannot be taken back
    /// part-way), so that a signal is delivered where the thread is.
    pub fn keeps_host_rip(&self) -> bool {
        self.tracing.is_some() || self.contexts.is_some()
    }

    /// Whether code is translated instrumented.
    pub fn instrumented(&self) -> bool {
        self.instrumented
    }

    /// The guest block whose translation contains host address `host`
    /// (diagnostics only: a linear search).
    pub fn guest_block_of(&self, host: u64) -> Option<u64> {
        self.blocks.containing_host(host)
    }

    /// Makes `guest`, if translated, reachable through the indirect-branch
    /// table.
    pub fn publish(&mut self, guest: u64) {
        if let Some(body) = self.blocks.body(guest) {
            self.lookups.publish(guest, body, &mut *self.mem);
        }
    }

    /// Publishes core-region code at `addr` under its own address: a
    /// translated branch there (a `ret` to the return stub of a native
    /// client call that a signal handler's return sent into translated
    /// code) runs it as it is.
    pub fn publish_core_stub(&mut self, addr: u64) {
        self.lookups.publish(addr, addr, &mut *self.mem);
    }

    /// A code-cache entry point for the client's signal handler `guest`:
    /// what the kernel is told to call. It enters the translation through
    /// the indirect-branch lookup.
    pub fn signal_trampoline(
        &mut self,
        guest: u64,
        inj: &mut Injector,
    ) -> Result<u64, EngineError> {
        if let Some(entry) = self.cache.handler_entry(guest) {
            return Ok(entry);
        }
        let ci = self.chunk_near(guest, inj)?;
        let count = self.count_lookups;
        Ok(self
            .cache
            .add_handler_entry(ci, guest, count, &mut *self.mem))
    }

    /// A chunk with room within reach of `guest`, mapped if need be.
    fn chunk_near(&mut self, guest: u64, inj: &mut Injector) -> Result<usize, EngineError> {
        if let Some(ci) = self.cache.near(guest) {
            return Ok(ci);
        }
        let floor = self.modules.stack_floor(&mut *self.mem)?;
        self.cache.map_near(guest, floor, &mut *self.mem, inj)
    }

    /// Host body of the translation of `guest`, translating it (and some of
    /// its direct successors, eagerly) if needed.
    pub fn ensure(&mut self, guest: u64, inj: &mut Injector) -> Result<u64, EngineError> {
        if let Some(body) = self.blocks.body(guest) {
            return Ok(body);
        }
        let started = std::time::Instant::now();
        let result = self.ensure_new(guest, inj);
        self.stats.translation_time += started.elapsed();
        result
    }

    /// [`Space::ensure`] for a block not translated yet.
    fn ensure_new(&mut self, guest: u64, inj: &mut Injector) -> Result<u64, EngineError> {
        self.fresh.clear();
        let body = self.translate_at(guest, inj, None, 0)?;
        // Eager translation of nearby successors saves one tool exit each;
        // failures there are ignored (the stub reports them if ever run).
        // Blocks chained into a translation are fresh too: their successors
        // are explored as well.
        let mut queue: VecDeque<u64> = VecDeque::new();
        let mut budget = match self.tracing {
            Some(_) => EAGER_BUDGET_TRACED,
            None => EAGER_BUDGET,
        };
        loop {
            queue.extend(self.fresh.drain(..));
            let Some(g) = queue.pop_front() else { break };
            if budget == 0 {
                break;
            }
            if self.blocks.contains(g) {
                continue;
            }
            budget -= 1;
            let _ = self.translate_at(g, inj, None, 0);
        }
        self.fresh.clear();
        Ok(body)
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
        let m = self.modules.code_mapping(guest, &mut *self.mem)?;
        let module = self.modules.record(&m);
        let code = self.modules.read_code(guest, &m, &mut *self.mem)?;
        let ci = match forced {
            Some(ci) => ci,
            None => self.chunk_near(guest, inj)?,
        };
        let smc_stub = Modules::needs_check(&m, self.smc_check, self.stack_pointer)
            .then(|| self.cache.smc_stub(ci, &mut *self.mem));
        let tagged_stubs = match self.contexts.as_mut() {
            Some(c) if c.tagged() && self.instrumented => {
                let (recs, count) = (c.separate_recs(), c.count_inline());
                let (stubs, made) = self.cache.tagged_stubs(ci, recs, count, &mut *self.mem);
                c.add_quiet(made.as_slice());
                Some(stubs)
            }
            _ => None,
        };
        let host = self.cache.chunk(ci).code_next;
        let mut literals = Vec::new();
        let contexts = match self.contexts.as_mut() {
            Some(c) if self.instrumented => {
                let mut cc = ContextsCtx { contexts: c };
                let origin = cc.origin(module, &self.modules.records()[module]);
                Some((cc, Some(origin)))
            }
            _ => None,
        };
        let mut ctx = Ctx {
            chunk: self.cache.chunk(ci),
            core: self.core,
            count_lookups: self.count_lookups,
            areas: &mut self.areas,
            literals: &mut literals,
            tracing: self.tracing.as_mut(),
            instrumented: self.instrumented,
            smc_stub,
            tagged_stubs,
            modules: &mut self.modules,
            mem: &mut *self.mem,
            contexts,
        };
        let mut t =
            translate::translate(&code, guest, host, &mut ctx).map_err(|e| EngineError(e.0))?;
        if let Some(mut info) = t.info.take() {
            let origin = ContextsCtx {
                contexts: self.contexts.as_mut().expect("contexts mode"),
            }
            .origin(module, &self.modules.records()[module]);
            info.set_origin(origin);
            self.context_block_done(info);
        }
        if t.code.len() as u64 > MAX_BLOCK_BYTES {
            return Err(EngineError(format!(
                "translation of {guest:#x} is too large"
            )));
        }
        debug_assert_eq!(t.host, host);
        for (at, value) in literals {
            self.mem.write(at, &value.to_le_bytes());
        }
        // Chain the tail block right after this one? (Not when the tail
        // keeps the context: falling into the next block would run its
        // context entry.)
        let plain_tail = t
            .exits
            .last()
            .is_some_and(|(f, _)| t.plain_exits.contains(f));
        let chain = t.tail.filter(|&next| {
            !plain_tail
                && depth < MAX_CHAIN
                && next != guest
                && !self.blocks.contains(next)
                && m.start <= next
                && next < m.end
                && self
                    .cache
                    .chunk(ci)
                    .has_room_after(host + t.code.len() as u64)
        });
        if chain.is_some() {
            t.drop_tail();
        }
        self.cache.chunk(ci).code_next = host + t.code.len() as u64;
        let far = self.link_exits(&mut t, ci, guest);
        self.mem.write(host, &t.code);
        self.cache.release_written(ci, &mut *self.mem);
        for (field, dest) in far {
            self.patch(field, dest);
        }
        for s in &t.syscalls {
            self.syscalls.insert(s.stop_rip, *s);
        }
        for s in &t.requests {
            self.requests.insert(s.stop_rip, *s);
        }
        self.sigills.extend(t.sigills.iter().copied());
        if let Some(c) = self.contexts.as_mut() {
            c.add_quiet(&t.quiet);
        }
        self.sites.insert(
            host,
            t.code.len() as u64,
            guest,
            t.guest_end,
            &t.sites,
            &t.points,
        );
        self.sites
            .insert_counter_updates(host, t.code.len() as u64, &t.counter_updates);
        if let Some(span) = t.record {
            self.sites
                .insert_record_span(host, t.code.len() as u64, span);
        }
        if let Some(tr) = &mut self.tracing {
            for site in &t.flush_sites {
                let n = site.id as usize;
                if tr.sites.len() <= n {
                    tr.sites.resize(n + 1, *site);
                }
                tr.sites[n] = *site;
            }
            if let Some(mut meta) = t.meta.take() {
                let origin = tr.origin(module, &self.modules.records()[module]);
                meta.info.set_origin(origin);
                if let Some(counter) = meta.counter {
                    tr.counted.push((meta.id, counter));
                }
                tr.link.block(meta);
            }
        }
        // Return sites are reached by `ret` through the table: translate
        // them eagerly and publish them as soon as they exist.
        for &r in &t.call_returns {
            let body = self.blocks.body(r);
            self.lookups.return_site(r, body, &mut *self.mem);
        }
        self.fresh.extend(&t.successors);
        // A conditional branch's target is eagerly translated only where a
        // translation is small (counting). Traced, a third of python's
        // translations never ran, most of them such targets (error
        // paths): leaving them to be translated when first taken made
        // python-json's code cache 41 MB instead of 50 (python-import's
        // 48 instead of 57, sqlite's 15 instead of 17, with 13 % less time
        // translating) for 13-38 % more exits to the tracer (3,200 more on
        // python-json's 24,700), at the same speed.
        if self.tracing.is_none() {
            self.fresh.extend(&t.branch_targets);
        }
        self.fresh.extend(&t.call_returns);
        self.stats.blocks_translated += 1;
        self.stats.blocks_checked += u64::from(smc_stub.is_some());
        self.stats.guest_instructions_translated += t.counted.len() as u64 + t.reps.len() as u64;
        // The engine's own counts (and their corrections after faults)
        // make the profile in counting mode only: in trace mode the tool
        // counts, and the instruction list would be 5 MB of a python run.
        let counted = match self.tracing {
            Some(_) => Vec::new(),
            None => t.counted,
        };
        self.blocks.insert(
            guest,
            Block::new(
                t.body,
                t.guest_end,
                module,
                (t.counter, t.counter_end.unwrap_or(0)),
                counted,
                t.reps,
                smc_stub.map(|_| code[..(t.guest_end - guest) as usize].into()),
            ),
        );
        if let Some(next) = chain {
            let end = self.cache.chunk(ci).code_next;
            if self.translate_at(next, inj, Some(ci), depth + 1).is_err() {
                // Put the jump back (the error shows if it is ever taken).
                let stub = self.cache.exit_stub(ci, next, &mut *self.mem);
                let mut e = Emitter::new(end);
                e.align_rel32(1);
                let field = e.jmp(stub);
                self.cache.chunk(ci).code_next = e.here();
                self.mem.write(end, &e.bytes);
                self.links.wait(next, field);
            }
        }
        // Published only now, its fall-through written: a waiting field is
        // patched at once (the code cache is shared memory), and another
        // thread taking it before the chained block was written ran into
        // zeros (Valgrind's `threadederrno` crashed so under load).
        self.lookups.translated(guest, t.body, &mut *self.mem);
        self.link_waiting(guest, t.body);
        Ok(t.body)
    }
}

/// What the translator gets from the space: counters, the chunk's probe
/// stub, literals in the chunk's aux area.
struct Ctx<'a> {
    chunk: &'a mut Chunk,
    core: u64,
    count_lookups: bool,
    areas: &'a mut Areas,
    /// Literals placed (address, value), to write once translation
    /// succeeded.
    literals: &'a mut Vec<(u64, u64)>,
    /// Trace mode's numbering of blocks and flush sites.
    tracing: Option<&'a mut Tracing>,
    /// Whether blocks are instrumented.
    instrumented: bool,
    /// The chunk's SMC stub, when the block gets a check.
    smc_stub: Option<u64>,
    /// The chunk's shared code of tagged counting.
    tagged_stubs: Option<crate::emit::TaggedStubs>,
    /// What `stable_code` reads through.
    modules: &'a mut Modules,
    mem: &'a mut dyn ClientMemory,
    /// Contexts mode, and the origin of the code being translated.
    contexts: Option<(ContextsCtx<'a>, Option<std::sync::Arc<events::CodeOrigin>>)>,
}

impl Ctx<'_> {
    /// Contexts mode: the origin of the code at `target` (`None`: not
    /// contexts mode; `Some(None)`: code of no file).
    fn context_origin(
        &mut self,
        target: u64,
    ) -> Option<Option<std::sync::Arc<events::CodeOrigin>>> {
        let (c, _) = self.contexts.as_mut()?;
        Some(match self.modules.code_mapping(target, &mut *self.mem) {
            Ok(m) => {
                let i = self.modules.record(&m);
                Some(c.origin(i, &self.modules.records()[i]))
            }
            Err(_) => None,
        })
    }
}

impl TransCtx for Ctx<'_> {
    fn contexts(&mut self, guest: u64) -> Result<Option<translate::ContextBlock>, TransError> {
        let Some((c, origin)) = self.contexts.as_mut() else {
            return Ok(None);
        };
        c.begin(guest, origin.clone()).map(Some).map_err(TransError)
    }

    fn reserve_call_memo(&mut self) {
        if let Some((c, _)) = self.contexts.as_mut() {
            c.reserve_call_memo();
        }
    }

    fn same_context(&mut self, target: u64) -> bool {
        let Some(origin) = self.context_origin(target) else {
            return false;
        };
        let (c, _) = self.contexts.as_mut().expect("contexts mode");
        c.same_context(target, origin)
    }

    fn tagged_callee(&mut self, target: u64) -> Option<(u32, bool)> {
        let origin = self.context_origin(target)?;
        let (c, _) = self.contexts.as_mut().expect("contexts mode");
        Some(c.callee(target, origin))
    }

    fn alloc_counter(&mut self) -> Result<u32, TransError> {
        // Counting mode's may fill the area; trace mode has its tables
        // there.
        let end = match self.tracing {
            Some(_) => layout::TRACE_COUNTERS_END,
            None => layout::AREA_ARENA,
        };
        self.areas.alloc_counter(end).ok_or_else(|| {
            TransError(format!(
                "more than {} blocks translated: no room for their counters in a thread area",
                (end - u64::from(layout::AREA_COUNTERS)) / 8
            ))
        })
    }
    fn probe_stub(&self) -> u64 {
        self.chunk.probe_stub
    }
    fn tagged_stubs(&self) -> Option<crate::emit::TaggedStubs> {
        self.tagged_stubs
    }
    fn count_lookups(&self) -> bool {
        self.count_lookups
    }
    fn literal(&mut self, value: u64) -> u64 {
        let at = self.chunk.aux(8);
        self.literals.push((at, value));
        at
    }
    fn core(&self) -> u64 {
        self.core
    }
    fn trace(&self) -> Option<translate::TraceMode> {
        self.tracing.as_ref().map(|t| t.mode)
    }
    fn alloc_block_id(&mut self) -> u32 {
        let t = self.tracing.as_mut().expect("trace mode");
        t.next_block += 1;
        t.next_block - 1
    }
    fn alloc_flush_site(&mut self) -> u32 {
        // Sites of a translation that fails are never used: harmless.
        let t = self.tracing.as_mut().expect("trace mode");
        t.next_site += 1;
        t.next_site - 1
    }
    fn alloc_ref_sites(&mut self, n: u32, limit: u32) -> Option<u32> {
        // Sites of a translation that fails are never used: harmless.
        let t = self.tracing.as_mut().expect("trace mode");
        let first = t.next_ref_site;
        let end = first.checked_add(n).filter(|&end| end <= limit)?;
        t.next_ref_site = end;
        Some(first)
    }
    fn flush_stub(&self) -> u64 {
        self.chunk.flush_stub
    }
    fn instrumented(&self) -> bool {
        self.instrumented
    }

    fn smc_stub(&self) -> Option<u64> {
        self.smc_stub
    }

    fn stable_code(&mut self, guest: u64, len: u64) -> Option<Vec<u8>> {
        self.modules.stable_code(guest, len, &mut *self.mem)
    }
}

/// What the unit tests of the space share: a space over a fake memory,
/// guest code in it, an injector, decoding of the code cache.
#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::client_mem::FakeMemory;
    use crate::emit::tests::disasm_at;
    use crate::ibtable::tests::lookup_in;
    use crate::layout;

    /// The core region of the test spaces.
    pub(crate) const CORE: u64 = 0x7000_0000;
    /// Where test programs go (low, like a non-PIE executable).
    pub(crate) const CODE: u64 = 0x40_1000;

    /// A space over a fake memory that has a main stack, and that memory
    /// (to look into).
    pub(crate) fn fake_space() -> (Space, FakeMemory) {
        let fake = FakeMemory::default();
        fake.add_mapping(0x7fff_fffd_e000, 0x7fff_ffff_f000, "rw-p", "[stack]");
        (Space::new(Box::new(fake.clone()), CORE), fake)
    }

    /// Guest code `bytes` at `at`, in an executable mapping of `path` of
    /// its own.
    pub(crate) fn load(fake: &FakeMemory, at: u64, bytes: &[u8], path: &str) {
        let end = (at + bytes.len() as u64 + 0xfff) & !0xfff;
        fake.add_mapping(at & !0xfff, end, "r-xp", path);
        fake.poke(at, bytes);
    }

    /// An injector whose `mmap` maps where it is asked to, as on a client
    /// with free memory there.
    pub(crate) fn mmap_as_asked(nr: u64, args: [u64; 6]) -> Result<i64, EngineError> {
        if nr == libc::SYS_madvise as u64 {
            return Ok(0);
        }
        assert_eq!(nr, libc::SYS_mmap as u64);
        Ok(args[0] as i64)
    }

    /// The first `n` instructions at host address `at`, from fake memory.
    pub(crate) fn insns_at(fake: &FakeMemory, at: u64, n: usize) -> Vec<String> {
        let mut lines = disasm_at(&fake.peek(at, n * 15), at);
        lines.truncate(n);
        lines
    }

    /// The address an instruction's text ends with (a branch target, or an
    /// absolute memory operand such as `[1006h]`).
    pub(crate) fn addr_in(line: &str) -> u64 {
        let last = line.rsplit([' ', ',']).next().unwrap();
        let hex = last.trim_matches(['[', ']']).trim_end_matches('h');
        u64::from_str_radix(hex, 16).unwrap_or_else(|_| panic!("no address in {line:?}"))
    }

    /// The first instruction at `at`, within `n`, that starts with `prefix`.
    pub(crate) fn find(fake: &FakeMemory, at: u64, n: usize, prefix: &str) -> String {
        let lines = insns_at(fake, at, n);
        lines
            .iter()
            .find(|l| l.starts_with(prefix))
            .unwrap_or_else(|| panic!("no {prefix} in {lines:#?}"))
            .clone()
    }

    /// The address past the exit stub at `stub` (where its stop is seen).
    pub(crate) fn stub_stop(stub: u64) -> u64 {
        let mut e = Emitter::new(stub);
        e.exit_stub(layout::MAGIC_LINK);
        e.here()
    }

    /// What the client's lookup finds for `guest` in the space's table.
    pub(crate) fn published(fake: &FakeMemory, guest: u64) -> Option<u64> {
        lookup_in(fake, CORE + layout::HTAB, guest)
    }

    #[test]
    fn a_loop_links_to_itself_and_its_fall_through_is_placed_right_after() {
        let (mut sp, fake) = fake_space();
        // CODE: add rax,1 ; dec rcx ; jnz CODE ; ret
        let code = [0x48, 0x83, 0xc0, 0x01, 0x48, 0xff, 0xc9, 0x75, 0xf7, 0xc3];
        load(&fake, CODE, &code, "/bin/loop");
        let body = sp.ensure(CODE, &mut mmap_as_asked).unwrap();
        // The chunk went above the program, leaving room for its heap, and
        // within reach.
        let chunk = sp.cache.chunks()[0].base;
        assert_eq!(chunk, 9 * layout::CHUNK_SIZE);
        assert!(chunk.abs_diff(CODE) < layout::CHUNK_REACH);
        let lines = insns_at(&fake, body, 12);
        let jne = lines.iter().position(|l| l.starts_with("jne")).unwrap();
        assert_eq!(addr_in(&lines[jne]), body, "{lines:#?}");
        assert!(lines[..jne].contains(&"add rax,1".to_string()));
        // No jump to the `ret` block: it follows (after alignment padding).
        let ret_body = sp.blocks.body(CODE + 9).unwrap();
        let after: Vec<_> = lines[jne + 1..].iter().filter(|l| *l != "nop").collect();
        assert_eq!(after[0], &insns_at(&fake, ret_body, 1)[0]);
        // (The `ret` block's counter, through a spilled RAX.)
        assert_eq!(after[0], "mov gs:[0],rax");
        assert!(ret_body > body && ret_body < body + 64);
        assert_eq!(sp.stats.blocks_translated, 2);
        assert_eq!(sp.stats.guest_instructions_translated, 4);
        assert_eq!(
            &*sp.blocks.get(CODE).unwrap().counted,
            [CODE, CODE + 4, CODE + 7]
        );
        // Translated once: the second time is a lookup.
        assert_eq!(sp.ensure(CODE, &mut mmap_as_asked).unwrap(), body);
        assert_eq!(sp.stats.blocks_translated, 2);
    }

    #[test]
    fn a_call_pushes_the_client_return_address_and_its_return_site_is_published() {
        let (mut sp, fake) = fake_space();
        // CODE: call CODE+0x100 ; CODE+5: ret ; CODE+0x100: ret
        let mut code = vec![0u8; 0x101];
        code[..5].copy_from_slice(&[0xe8, 0xfb, 0x00, 0x00, 0x00]);
        code[5] = 0xc3;
        code[0x100] = 0xc3;
        load(&fake, CODE, &code, "/bin/call");
        let body = sp.ensure(CODE, &mut mmap_as_asked).unwrap();
        // The client's stack gets the client's return address.
        let push = find(&fake, body, 8, "push qword ptr");
        assert_eq!(fake.u64_at(addr_in(&push)), CODE + 5);
        // The callee was placed right after the call (no jump to it).
        let callee = sp.blocks.body(CODE + 0x100).unwrap();
        assert!(insns_at(&fake, body, 3)
            .iter()
            .all(|l| !l.starts_with("jmp")));
        assert!(callee > body && callee < body + 64);
        // The return site was translated eagerly and published, so the
        // callee's `ret` finds it without exiting.
        let site = sp.blocks.body(CODE + 5).unwrap();
        assert_eq!(published(&fake, CODE + 5), Some(site));
        // The callee itself is reached by a direct branch: not published.
        assert_eq!(published(&fake, CODE + 0x100), None);
    }

    #[test]
    fn a_lookup_miss_publishes_its_target_once_translated() {
        let (mut sp, fake) = fake_space();
        load(&fake, CODE, &[0xc3], "/bin/ret");
        sp.publish(CODE);
        assert_eq!(published(&fake, CODE), None);
        let body = sp.ensure(CODE, &mut mmap_as_asked).unwrap();
        sp.publish(CODE);
        assert_eq!(published(&fake, CODE), Some(body));
    }

    #[test]
    fn code_the_engine_cannot_run_is_refused_with_its_address() {
        let (mut sp, fake) = fake_space();
        fake.add_mapping(0x60_0000, 0x60_1000, "rw-p", "");
        let e = sp.ensure(0x60_0000, &mut mmap_as_asked).unwrap_err().0;
        assert!(e.contains("non-executable memory at 0x600000"), "{e}");
        let e = sp.ensure(0x70_0000, &mut mmap_as_asked).unwrap_err().0;
        assert!(e.contains("unmapped address 0x700000"), "{e}");
        // mov rax, gs:[0]: runs natively, but GS is the engine's.
        let gs = [0x65, 0x48, 0x8b, 0x04, 0x25, 0, 0, 0, 0];
        load(&fake, CODE, &gs, "/bin/gs");
        let e = sp.ensure(CODE, &mut mmap_as_asked).unwrap_err().0;
        assert!(e.contains("gs:[0]") && e.contains("0x401000"), "{e}");
    }

    #[test]
    fn an_instruction_that_raises_sigill_is_known_by_its_ud2() {
        let (mut sp, fake) = fake_space();
        load(&fake, CODE, &[0x06], "/bin/bad");
        let body = sp.ensure(CODE, &mut mmap_as_asked).unwrap();
        // The counter (spilled, flags kept), then the ud2.
        assert!(insns_at(&fake, body, 8).contains(&"ud2".to_string()));
        let at = (body..body + 64)
            .find(|&h| fake.peek(h, 2) == [0x0f, 0x0b])
            .unwrap();
        assert_eq!(sp.sigill_site(at), Some(CODE));
        assert_eq!(sp.sigill_site(at + 1), None);
        assert!(sp.in_code_cache(at) && !sp.in_code_cache(CODE));
    }
}
