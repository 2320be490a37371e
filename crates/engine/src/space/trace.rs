//! Trace mode in one address space: block ids and flush sites handed out
//! at translation, thread areas' buffer pointers, and the hand-over of
//! complete records to the consumer when a buffer fills or a thread ends.

use super::{Injector, Space};
use crate::handoff::{Gate, SharedBuffers};
use crate::layout::{
    AREA_BTAC, AREA_I1_MRU, AREA_MRU, AREA_TRACE, BTAC_UNKNOWN, S_TRACE_LIMIT, S_TRACE_PTR,
    TRACE_BUFFER, TRACE_BUFFERS, TRACE_BYTES, TRACE_SLACK,
};
use crate::stream::StreamLink;
use crate::translate::{FlushSite, TraceMode};
use crate::{EngineError, ModuleRecord, TraceStats};
use events::CodeOrigin;
use rustc_hash::FxHashMap;
use std::sync::Arc;
use std::time::Instant;

/// What the delivery of an asynchronous signal waits for in trace mode
/// (see [`Space::record_delivery`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecordDelivery {
    /// Nothing: the thread has no open record.
    Now,
    /// The thread is in a flush stub, its block's record open: the flush
    /// is done first, as the stub's exit would (RAX is in its spill slot
    /// already if `rax_spilled`).
    Flush {
        /// Whether the stub has spilled RAX and overwritten it.
        rax_spilled: bool,
    },
    /// The thread is inside a block whose record is open: it runs on to
    /// one of these breakpoints out of it (`None`: the code cannot be
    /// followed, and it is stepped).
    Leave(Option<Vec<u64>>),
}

/// What an address space in trace mode keeps.
#[derive(Clone)]
pub(crate) struct Tracing {
    /// What blocks record.
    pub mode: TraceMode,
    /// The consumer, and this process's key there.
    pub link: StreamLink,
    /// The next block id.
    pub next_block: u32,
    /// The next flush site's number.
    pub next_site: u32,
    /// The next site naming a counted block's kept reference (from 1:
    /// `events::SiteWords`).
    pub next_ref_site: u32,
    /// Flush sites by number.
    pub sites: Vec<FlushSite>,
    /// Per module record (by index): the origin its blocks' metadata
    /// names, made once.
    pub origins: Vec<Option<Arc<CodeOrigin>>>,
    /// The records handed over so far and the tracer's time on them
    /// (`--stats=yes`; the tool's time is added at the end).
    pub stats: TraceStats,
    /// Blocks whose executions are counted rather than recorded, and
    /// their counters (filtered trace mode with fetches checked).
    pub counted: Vec<(u32, u32)>,
    /// Complete records a flush left for the consumer, read once the
    /// thread runs on in its next buffer (copied buffers only: shared ones
    /// go at once).
    pub pending: Option<Handed>,
    /// Per thread area, which buffer its thread writes and what of it the
    /// consumer has.
    pub areas: FxHashMap<u64, TraceArea>,
    /// Bytes of records a buffer takes before its checks flush it:
    /// `layout::TRACE_BYTES`, or fewer with `CACHESCOPE_ENGINE_TRACE_BYTES`
    /// (tests make flushes frequent with it).
    pub bytes: u64,
}

/// The bytes of records a trace buffer takes (see [`Tracing::bytes`]):
/// `CACHESCOPE_ENGINE_TRACE_BYTES` if set, rounded down to words and kept
/// from 4 KiB to `layout::TRACE_BYTES`.
fn trace_bytes() -> u64 {
    std::env::var("CACHESCOPE_ENGINE_TRACE_BYTES")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .map_or(TRACE_BYTES, |b| b.clamp(4096, TRACE_BYTES) & !7)
}

/// What a thread hands over: its records from `from` to `to` and its
/// branch words from `down` up to `down_to` (the branch stream fills the
/// buffer from its end down).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Handed {
    area: u64,
    from: u64,
    to: u64,
    down: u64,
    down_to: u64,
}

impl Handed {
    fn is_empty(&self) -> bool {
        self.from == self.to && self.down == self.down_to
    }
}

/// What the tracer knows of one thread area's trace buffers.
#[derive(Clone, Debug)]
pub(crate) struct TraceArea {
    /// The buffer the thread writes (0 to `TRACE_BUFFERS - 1`).
    buffer: usize,
    /// Where the records not yet handed over start, in that buffer.
    from: u64,
    /// Where the branch words not yet handed over end (they run down from
    /// there).
    down_to: u64,
    /// The buffers as a memory file the tool maps too (their records go
    /// to the consumer in place); `None`: the area's private memory,
    /// copied out.
    shared: Option<SharedBuffers>,
}

impl TraceArea {
    /// The thread of `area` about to write buffer `buffer` from its start,
    /// which is all its own (nothing handed over yet), its checks flushing
    /// past `bytes` of records.
    fn at(area: u64, buffer: usize, bytes: u64) -> TraceArea {
        let start = area + AREA_TRACE + buffer as u64 * TRACE_BUFFER;
        TraceArea {
            buffer,
            from: start,
            down_to: start + bytes + TRACE_SLACK,
            shared: None,
        }
    }
}

impl Tracing {
    /// Trace mode for a new process image, linked to the consumer.
    pub fn new(mode: TraceMode, link: StreamLink) -> Tracing {
        Tracing {
            mode,
            link,
            next_block: 0,
            next_site: 0,
            next_ref_site: 1,
            sites: Vec::new(),
            origins: Vec::new(),
            stats: TraceStats::default(),
            counted: Vec::new(),
            pending: None,
            areas: FxHashMap::default(),
            bytes: trace_bytes(),
        }
    }

    /// What a forked child's address space starts with: the same blocks
    /// and ids, linked to `link`, and no buffers shared yet (the child has
    /// no mapping of its parent's: `MADV_DONTFORK`).
    pub fn fork(&self, link: StreamLink) -> Tracing {
        Tracing {
            link,
            pending: None,
            areas: FxHashMap::default(),
            ..self.clone()
        }
    }

    /// The shared origin of module record `index`.
    pub fn origin(&mut self, index: usize, module: &ModuleRecord) -> Arc<CodeOrigin> {
        shared_origin(&mut self.origins, index, module)
    }
}

/// The first word of a marker the tracer puts in a thread's trace buffer
/// (never a block id: ids are dense from 0): a signal handler starts.
pub const MARK_SIGNAL: u32 = u32::MAX;
/// The marker of a handler's `rt_sigreturn`.
pub const MARK_SIGRETURN: u32 = u32::MAX - 1;

impl Space {
    /// Trace mode: blocks translated from now on write records.
    pub fn set_tracing(&mut self, tracing: Tracing) {
        self.tracing = Some(tracing);
    }

    /// The process image goes away without a profile (exec): its tool
    /// is dropped.
    pub fn discard_trace(&self) {
        if let Some(t) = &self.tracing {
            t.link.discard();
        }
    }

    /// Maps the trace buffers of the thread area `area` as a memory file
    /// that the tool maps too, if the client's memory can be shared and
    /// they are not yet (a new area, or a forked child's, which has no
    /// mapping there: `MADV_DONTFORK` keeps a child from writing its
    /// parent's buffers). Otherwise they stay the area's private memory,
    /// copied out at each hand-over.
    pub(super) fn share_trace_buffers(
        &mut self,
        area: u64,
        inj: &mut Injector,
    ) -> Result<(), EngineError> {
        let Some(t) = &self.tracing else {
            return Ok(());
        };
        if t.areas.get(&area).is_some_and(|a| a.shared.is_some()) {
            return Ok(());
        }
        const LEN: u64 = TRACE_BUFFERS as u64 * TRACE_BUFFER;
        const RW: u64 = (libc::PROT_READ | libc::PROT_WRITE) as u64;
        let start = area + AREA_TRACE;
        // The injections run client code: queued writes go first.
        self.mem.flush()?;
        let mut map = None;
        if self.mem.can_share() {
            if let Some(fd) = super::client_memory_file(self.core, LEN, inj)? {
                let shared = (libc::MAP_SHARED | libc::MAP_FIXED) as u64;
                let dontfork = libc::MADV_DONTFORK as u64;
                if inj(libc::SYS_mmap as u64, [start, LEN, RW, shared, fd, 0])? as u64 == start
                    && inj(libc::SYS_madvise as u64, [start, LEN, dontfork, 0, 0, 0])? == 0
                {
                    map = self.mem.share_buffers(start, LEN, fd as i32);
                }
                inj(libc::SYS_close as u64, [fd, 0, 0, 0, 0, 0])?;
            }
        }
        match map {
            Some(map) => {
                let t = self.tracing.as_mut().expect("checked above");
                let a = t
                    .areas
                    .entry(area)
                    .or_insert_with(|| TraceArea::at(area, 0, t.bytes));
                a.shared = Some(SharedBuffers {
                    map,
                    gate: Gate::new(),
                    base: start,
                });
            }
            None => {
                // Private memory: where a shared mapping was made that the
                // tool does not read (a forked child would write it too),
                // and in a forked child, whose parent's shared buffers left
                // a hole.
                let private = (libc::MAP_PRIVATE
                    | libc::MAP_ANONYMOUS
                    | libc::MAP_NORESERVE
                    | libc::MAP_FIXED) as u64;
                let r = inj(
                    libc::SYS_mmap as u64,
                    [start, LEN, RW, private, u64::MAX, 0],
                )?;
                if r as u64 != start {
                    return Err(EngineError(format!(
                        "cannot map the trace buffers of thread area {area:#x}: {}",
                        std::io::Error::from_raw_os_error(-r as i32)
                    )));
                }
            }
        }
        Ok(())
    }

    /// Points the trace buffer of the thread area `area` at the start of
    /// its first buffer (once the consumer has no view of it left).
    pub(super) fn reset_trace(&mut self, area: u64) {
        if self.tracing.is_some() {
            self.write_from(area, 0, 0);
            self.forget_tables(area);
        }
    }

    /// Makes the thread of `area` write buffer `buffer` from `skip` bytes
    /// past its start on, the records before that not its to hand over;
    /// waits first until the consumer has no view of the buffer.
    fn write_from(&mut self, area: u64, buffer: usize, skip: u64) {
        let Some(t) = &mut self.tracing else { return };
        let start = area + AREA_TRACE + buffer as u64 * TRACE_BUFFER;
        let bytes = t.bytes;
        let a = t
            .areas
            .entry(area)
            .or_insert_with(|| TraceArea::at(area, buffer, bytes));
        if let Some(shared) = &a.shared {
            t.stats.wait_time += shared.gate.wait_free(buffer);
        }
        a.buffer = buffer;
        a.from = start;
        a.down_to = start + bytes + TRACE_SLACK;
        let mut b = (start + skip).to_le_bytes().to_vec();
        b.extend_from_slice(&(start + bytes).to_le_bytes());
        const _: () = assert!(S_TRACE_LIMIT == S_TRACE_PTR + 8);
        self.mem.write(area + u64::from(S_TRACE_PTR), &b);
    }

    /// Filtered trace mode: clears the tables of the line each D1 set of
    /// the thread whose area is `area` referenced last, and each I1 set
    /// fetched last, and forgets its copy of the indirect-target table's
    /// slots. Whenever its records are handed over: the tool may
    /// take other threads' records before the next ones, and a set's last
    /// line is then not necessarily this thread's (the next access to each
    /// set is kept; exact again). (I1's had been left as it was: another
    /// thread's fetches in between could make a fetch the table called a
    /// hit on its set's last line a reordering one.)
    fn forget_tables(&mut self, area: u64) {
        let Some(g) = self.tracing.as_ref().and_then(|t| t.mode.filter) else {
            return;
        };
        let tables = [
            (AREA_MRU, Some(g.set_mask), 0),
            (AREA_I1_MRU, g.i1_set_mask, 0),
            (AREA_BTAC, g.btac_mask, BTAC_UNKNOWN),
        ];
        for (table, mask, forgotten) in tables {
            if let Some(mask) = mask {
                let bytes = forgotten.to_le_bytes().repeat(mask as usize + 1);
                self.mem.write(area + table, &bytes);
            }
        }
    }

    /// The flush site numbered `site`.
    pub fn flush_site(&self, site: u32) -> Option<FlushSite> {
        self.tracing.as_ref()?.sites.get(site as usize).copied()
    }

    /// What the delivery of an asynchronous signal to a thread at host
    /// `host` waits for in trace mode: nothing, the flush of the flush
    /// stub the thread is in, or the thread's leaving the open record it
    /// is in (`translate::RecordSpan`).
    pub fn record_delivery(&mut self, host: u64) -> RecordDelivery {
        if self.tracing.is_none() {
            return RecordDelivery::Now;
        }
        static STUB: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
        let stub = *STUB.get_or_init(|| {
            crate::emit::Emitter::exit_stub_code(crate::layout::MAGIC_FLUSH).len() as u64
        });
        let in_stub = self
            .cache
            .chunks()
            .iter()
            .find_map(|c| host.checked_sub(c.flush_stub).filter(|&o| o < stub));
        if let Some(offset) = in_stub {
            // The stub spills RAX, RCX and R11, then `mov eax, nr`; at its
            // `syscall` (two bytes) RAX is the exit's number.
            return RecordDelivery::Flush {
                rax_spilled: offset >= stub - 2,
            };
        }
        if self.sites.open_record(host).is_none() {
            return RecordDelivery::Now;
        }
        let sites = &self.sites;
        let mem = &mut *self.mem;
        RecordDelivery::Leave(super::quiet::exits(
            host,
            |a| sites.open_record(a),
            |r| mem.read(r.start, (r.end - r.start) as usize).ok(),
        ))
    }

    /// The buffer the thread of `area` writes (its number) and what it
    /// would hand over now: its records not yet handed over, up to its
    /// write pointer, and its branch words, down to its limit's.
    fn trace_extent(&mut self, area: u64) -> Result<(usize, Handed), EngineError> {
        const _: () = assert!(S_TRACE_LIMIT == S_TRACE_PTR + 8);
        let slots = self.mem.read(area + u64::from(S_TRACE_PTR), 16)?;
        let word = |i: usize| u64::from_le_bytes(slots[i..i + 8].try_into().expect("8 bytes"));
        let (ptr, down) = (word(0), word(8).wrapping_add(TRACE_SLACK));
        let fresh;
        let t = self.tracing.as_ref();
        let a = match t.and_then(|t| t.areas.get(&area)) {
            Some(a) => a,
            None => {
                fresh = TraceArea::at(area, 0, t.map_or(TRACE_BYTES, |t| t.bytes));
                &fresh
            }
        };
        let (buffer, from, down_to) = (a.buffer, a.from, a.down_to);
        let ordered = from <= ptr && ptr <= down && down <= down_to;
        if !ordered || !(ptr - from).is_multiple_of(8) || !(down_to - down).is_multiple_of(4) {
            return Err(EngineError(format!(
                "trace buffer of thread area {area:#x} is corrupt (write pointer {ptr:#x}, branch words from {down:#x})"
            )));
        }
        let handed = Handed {
            area,
            from,
            to: ptr,
            down,
            down_to,
        };
        Ok((buffer, handed))
    }

    /// The words of `h` (records, then its 32-bit branch words, two to a
    /// word), read in one go each into a recycled buffer; returns it, where
    /// its branch words start and how many there are.
    fn read_handed(&mut self, h: Handed) -> Result<(Vec<u64>, (usize, usize)), EngineError> {
        let Some(t) = &mut self.tracing else {
            return Ok((Vec::new(), (0, 0)));
        };
        let up = ((h.to - h.from) / 8) as usize;
        let branch_bytes = (h.down_to - h.down) as usize;
        let down = branch_bytes.div_ceil(8);
        let asked = Instant::now();
        let mut words = t.link.buffer(up + down);
        let got = Instant::now();
        let (records, branches) = words.split_at_mut(up);
        let read = self
            .mem
            .read_into(h.from, bytemuck::cast_slice_mut(records))
            .and_then(|()| {
                let bytes: &mut [u8] = bytemuck::cast_slice_mut(branches);
                self.mem.read_into(h.down, &mut bytes[..branch_bytes])
            });
        let Some(t) = &mut self.tracing else {
            return Ok((Vec::new(), (0, 0)));
        };
        if let Err(e) = read {
            // Back into circulation: the tracer waits for free buffers.
            t.link.recycle(words);
            return Err(e);
        }
        t.stats.wait_time += got - asked;
        t.stats.read_time += got.elapsed();
        t.stats.bytes += (8 * up + branch_bytes) as u64;
        Ok((words, (up, branch_bytes / 4)))
    }

    /// What `h` holds goes to the consumer: in place if its thread's
    /// buffers are shared, else copied out (at once, or with `later` once
    /// the thread runs on: [`Space::hand_over_pending`]).
    fn hand_over(&mut self, h: Handed, later: bool) {
        let Some(t) = &mut self.tracing else { return };
        if h.is_empty() {
            return;
        }
        if let Some(shared) = t.areas.get(&h.area).and_then(|a| a.shared.clone()) {
            let first = h.area + AREA_TRACE;
            // (The buffer `from` lies in: the area may have moved on.)
            let buffer = ((h.from - first) / TRACE_BUFFER) as usize;
            // Records in 64-bit words, branch words in 32-bit ones.
            let range =
                |at: u64, to: u64, size: u64| ((at - first) as usize, ((to - at) / size) as usize);
            let view = shared.view(buffer, range(h.from, h.to, 8), range(h.down, h.down_to, 4));
            t.stats.bytes += (h.to - h.from) + (h.down_to - h.down);
            t.link.shared_records(h.area, view);
        } else if later {
            t.pending = Some(h);
        } else {
            self.hand_over_copy(h);
        }
    }

    /// `h`'s words, copied out, go to the consumer.
    fn hand_over_copy(&mut self, h: Handed) {
        // (Memory already gone: nothing more to hand over.)
        let (words, branches) = self.read_handed(h).unwrap_or_default();
        if let Some(t) = &self.tracing {
            t.link.records(h.area, words, branches, h.down);
        }
    }

    /// The records a flush left go to the consumer: read once the thread
    /// runs on in its next buffer (the tracer's copy overlaps its work),
    /// and before anything else of the process is read.
    pub fn hand_over_pending(&mut self) {
        if let Some(h) = self.tracing.as_mut().and_then(|t| t.pending.take()) {
            self.hand_over_copy(h);
        }
    }

    /// Where the open record of filtered records (`record` `None` at a
    /// flush) starts in the buffer from `start` to `ptr`: at the last word
    /// that is no kept access (its id, or a signal marker after which its
    /// accesses resumed). Read from the end: a record is short.
    fn open_filtered_record(&mut self, start: u64, ptr: u64) -> Result<u64, EngineError> {
        let mut from = ptr.saturating_sub(64 << 10).max(start);
        loop {
            let words = self.mem.read(from, (ptr - from) as usize)?;
            let words: &[u64] = bytemuck::cast_slice(&words);
            if let Some(open) = words.iter().rposition(|&w| !events::KeptAccess::is_kept(w)) {
                return Ok(from + 8 * open as u64);
            }
            if from == start {
                return Ok(start);
            }
            from = start;
        }
    }

    /// A flush stop of the thread whose area is `area`, in a block whose
    /// record is at `record`: the thread goes on in its next buffer, where
    /// its open (partly written) record is moved, and the records before
    /// that go to the consumer (copied ones once the thread runs:
    /// [`Space::hand_over_pending`]). Returns the record's new address.
    /// Filtered records (`record` `None`) have no fixed length: see
    /// `open_filtered_record`.
    pub fn flush_trace(&mut self, area: u64, record: Option<u64>) -> Result<u64, EngineError> {
        self.hand_over_pending();
        let (buffer, extent) = self.trace_extent(area)?;
        let (from, ptr) = (extent.from, extent.to);
        let record = match record {
            Some(r) => r,
            None => self.open_filtered_record(from, ptr)?,
        };
        if !(from..=ptr).contains(&record) || (record - from) % 8 != 0 {
            return Err(EngineError(format!(
                "trace buffer of thread area {area:#x} is corrupt (record {record:#x})"
            )));
        }
        // (Branch words have no open part: a block writes its own after
        // its check.)
        self.hand_over(
            Handed {
                to: record,
                ..extent
            },
            true,
        );
        let next_buffer = (buffer + 1) % TRACE_BUFFERS;
        let next = area + AREA_TRACE + next_buffer as u64 * TRACE_BUFFER;
        // (Counted executions have none: their check is on entry.)
        let open = if record < ptr {
            self.mem.read(record, (ptr - record) as usize)?
        } else {
            Vec::new()
        };
        self.write_from(area, next_buffer, ptr - record);
        if !open.is_empty() {
            self.mem.write(next, &open);
        }
        // Its records go on their own: the thread starts its tables afresh.
        self.forget_tables(area);
        Ok(next)
    }

    /// [`Space::flush_trace`] with no open record: every word below the
    /// write pointer is complete (an append's own check, see
    /// `Emitter::append_via`).
    pub fn flush_whole_trace(&mut self, area: u64) -> Result<u64, EngineError> {
        let ptr = self.mem.read_u64(area + u64::from(S_TRACE_PTR))?;
        self.flush_trace(area, Some(ptr))
    }

    /// Counted executions: every block's count, of live and exited
    /// threads, goes to the tool (before the process's end, after its
    /// records).
    pub fn hand_over_runs(&mut self) {
        self.hand_over_pending();
        let Some(t) = &self.tracing else { return };
        if t.counted.is_empty() {
            return;
        }
        let counts = self.areas.counts(&mut *self.mem);
        let runs: Vec<(u32, u64)> = t
            .counted
            .iter()
            .map(|&(id, counter)| (id, counts.get(counter)))
            .filter(|&(_, n)| n != 0)
            .collect();
        t.link.runs(runs);
    }

    /// Whether signal deliveries and handler returns are marked in the
    /// records by the tool: for call tools, and for filtered records (the
    /// kept accesses of an interrupted block resume after the handler's).
    pub fn marks_signals(&self) -> bool {
        self.tracing
            .as_ref()
            .is_some_and(|t| t.mode.sp || t.mode.filter.is_some())
    }

    /// Puts `marker` in the trace buffer of the stopped thread whose area is
    /// `area`, after the records written so far, if signals are marked
    /// ([`Space::marks_signals`]). A marker may go past the buffer's limit:
    /// the thread's next block check flushes.
    pub fn trace_marker(&mut self, area: u64, marker: u32) -> Result<(), EngineError> {
        if !self.marks_signals() {
            return Ok(());
        }
        let at = area + u64::from(S_TRACE_PTR);
        let ptr = self.mem.read_u64(at)?;
        self.mem.write(ptr, &u64::from(marker).to_le_bytes());
        self.mem.write(at, &(ptr + 8).to_le_bytes());
        // A handler starts with its tables forgotten (and where the tracer
        // sees its return, the code it interrupted goes on with them
        // forgotten): a check interrupted between updating its table and
        // its append cannot make the handler skip a reference (or an
        // indirect branch) that the tool has not seen yet.
        self.forget_tables(area);
        Ok(())
    }

    /// The thread whose area is `area`, stopped between blocks, made a
    /// client request for the tool: its records so far go to the consumer,
    /// then the request (nothing in counting mode, which has no tool).
    pub fn tool_request(&mut self, area: u64, request: events::ClientRequest) {
        if self.tracing.is_none() {
            return;
        }
        self.hand_over_trace(area);
        if let Some(t) = &self.tracing {
            t.link.request(area, request);
        }
    }

    /// The records in the buffer of `area`, whose thread is stopped
    /// between two blocks (its last record complete), go to the consumer;
    /// the thread goes on after them. Before a fork, so that the child's
    /// tool, a copy of the parent's, has seen everything the forking thread
    /// did.
    pub fn hand_over_trace(&mut self, area: u64) {
        self.hand_over_pending();
        if self.tracing.is_none() {
            return;
        }
        // (Memory already gone: nothing more to hand over.)
        let Ok((_, extent)) = self.trace_extent(area) else {
            return;
        };
        self.hand_over(extent, false);
        if let Some(a) = self.tracing.as_mut().and_then(|t| t.areas.get_mut(&area)) {
            a.from = extent.to;
            a.down_to = extent.down;
        }
        self.forget_tables(area);
    }

    /// A thread ends (or the process does): its complete records go to the
    /// consumer and its buffer starts over.
    pub(super) fn drain_trace(&mut self, area: u64) {
        self.hand_over_trace(area);
        if let Some(t) = &self.tracing {
            t.link.thread_end(area);
        }
    }
}

/// The origin of module record `index` (`module`), made once and shared
/// by every block from it (`origins` by record).
pub(super) fn shared_origin(
    origins: &mut Vec<Option<Arc<CodeOrigin>>>,
    index: usize,
    module: &ModuleRecord,
) -> Arc<CodeOrigin> {
    if origins.len() <= index {
        origins.resize(index + 1, None);
    }
    origins[index]
        .get_or_insert_with(|| {
            Arc::new(CodeOrigin {
                path: module.path.clone(),
                start: module.start,
                end: module.end,
                file_offset: module.file_offset,
            })
        })
        .clone()
}

#[cfg(test)]
mod tests {
    use super::super::tests::{fake_space, load, mmap_as_asked, CODE};
    use super::*;
    use crate::emit::MruGeometry;
    use crate::stream::{Consumer, StreamTool};

    /// A tool that takes nothing: the tests look at the client's memory.
    struct Nothing;
    impl events::Tool for Nothing {
        fn needs(&self) -> events::Needs {
            events::Needs::COUNTING
        }
        fn record(&mut self, _: events::Record) {}
    }
    impl StreamTool for Nothing {
        fn fork(&self) -> Box<dyn StreamTool> {
            Box::new(Nothing)
        }
        fn into_any(self: Box<Self>) -> Box<dyn std::any::Any + Send> {
            self
        }
    }

    /// Traced, a conditional branch's target is translated when first
    /// taken, not eagerly with the branch (most never run: error paths);
    /// counted, where a translation is small, it is translated at once.
    #[test]
    fn a_branch_target_waits_for_its_first_run_only_when_traced() {
        // CODE: test rax,rax ; jz CODE+0x40 ; ret ... CODE+0x40: ret
        let mut code = vec![0u8; 0x41];
        code[..6].copy_from_slice(&[0x48, 0x85, 0xc0, 0x74, 0x3b, 0xc3]);
        code[0x40] = 0xc3;
        let target = CODE + 0x40;
        let (mut counted, fake) = fake_space();
        load(&fake, CODE, &code, "/bin/branch");
        counted.ensure(CODE, &mut mmap_as_asked).unwrap();
        assert!(counted.blocks.contains(CODE + 5));
        assert!(counted.blocks.contains(target));

        let (mut traced, fake) = fake_space();
        load(&fake, CODE, &code, "/bin/branch");
        let consumer = Consumer::start();
        let mode = TraceMode {
            data: true,
            sp: false,
            filter: None,
            branches: true,
        };
        traced.set_tracing(Tracing::new(mode, consumer.link(Box::new(Nothing))));
        traced.alloc_area(&mut mmap_as_asked).unwrap();
        traced.ensure(CODE, &mut mmap_as_asked).unwrap();
        assert!(traced.blocks.contains(CODE + 5), "the fall-through");
        assert!(!traced.blocks.contains(target));
        traced.ensure(target, &mut mmap_as_asked).unwrap();
        assert!(traced.blocks.contains(target));
    }

    /// A signal handler starts with the thread's tables forgotten: no line
    /// in D1's or I1's, no target in the indirect-target copy.
    #[test]
    fn a_handler_starts_with_its_tables_forgotten() {
        let (mut space, fake) = fake_space();
        let consumer = Consumer::start();
        let filter = MruGeometry {
            line_bits: 6,
            set_mask: 63,
            i1_set_mask: Some(63),
            btac_mask: Some(511),
        };
        let mode = TraceMode {
            data: true,
            sp: false,
            filter: Some(filter),
            branches: true,
        };
        space.set_tracing(Tracing::new(mode, consumer.link(Box::new(Nothing))));
        let area = space.alloc_area(&mut mmap_as_asked).unwrap();
        let slot = |table: u64, n: u64| {
            let bytes = fake.peek(area + table + n * 8, 8);
            u64::from_le_bytes(bytes.try_into().unwrap())
        };
        assert_eq!(slot(AREA_BTAC, 0), BTAC_UNKNOWN, "a new thread's copy");
        // What a thread's checks left there.
        fake.poke(area + AREA_MRU + 8, &0x1234u64.to_le_bytes());
        fake.poke(area + AREA_I1_MRU + 63 * 8, &0x99u64.to_le_bytes());
        fake.poke(area + AREA_BTAC + 511 * 8, &0x40_1000u64.to_le_bytes());
        space.trace_marker(area, MARK_SIGNAL).unwrap();
        space.mem().flush().unwrap();
        assert_eq!(slot(AREA_MRU, 1), 0);
        assert_eq!(slot(AREA_I1_MRU, 63), 0);
        assert!((0..512).all(|n| slot(AREA_BTAC, n) == BTAC_UNKNOWN));
    }
}
