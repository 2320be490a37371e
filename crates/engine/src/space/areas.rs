//! Thread areas and the execution counters in them.
//!
//! Every thread has its own area (its GS base, see `layout`): spill slots,
//! the patch list, the `--stats=yes` lookup counters, then one 8-byte
//! counter per block (and per rep string instruction) at the same offset in
//! every area. Translated code increments its own thread's counters without
//! atomics, so counts are exact however threads interleave; the tool adds
//! an area's counters to the totals when its thread exits and reuses the
//! area, zeroed, for the next thread.

use super::Injector;
use crate::client_mem::ClientMemory;
use crate::layout::{self, AREA_COUNTERS, S_STAT_INLINE_HITS};
use crate::EngineError;
use rustc_hash::FxHashSet as HashSet;

/// Lookup counters per area, from [`layout::S_STAT_INLINE_HITS`] on:
/// inline hits, probes, probe hits.
pub(super) type LookupCounts = [u64; 3];

/// The thread areas of one address space and what their counters held.
#[derive(Debug, Clone)]
pub(super) struct Areas {
    /// Areas whose counters are still in client memory (those of live
    /// threads, and after a fork those the parent's other threads had).
    live: HashSet<u64>,
    /// Areas of exited threads, zeroed, ready for reuse.
    free: Vec<u64>,
    /// Areas mapped so far (for placement hints).
    made: u64,
    /// Offset of the next counter to hand out.
    next_counter: u32,
    /// Counts of exited threads, by counter index.
    totals: Vec<u64>,
    /// Lookup counters of exited threads.
    lookup_totals: LookupCounts,
}

/// The counts of every thread, by counter offset.
pub(super) struct Counts(Vec<u64>);

impl Counts {
    /// What the counter at `offset` (in the thread areas) counted; 0 for
    /// offset 0, the counter of blocks that have none (trace mode,
    /// uninstrumented code).
    pub fn get(&self, offset: u32) -> u64 {
        offset
            .checked_sub(AREA_COUNTERS)
            .and_then(|i| self.0.get((i / 8) as usize))
            .copied()
            .unwrap_or(0)
    }
}

impl Areas {
    /// No areas, no counters.
    pub fn new() -> Areas {
        Areas {
            live: HashSet::default(),
            free: Vec::new(),
            made: 0,
            next_counter: AREA_COUNTERS,
            totals: Vec::new(),
            lookup_totals: [0; 3],
        }
    }

    /// The areas whose threads are alive.
    pub fn live_areas(&self) -> Vec<u64> {
        self.live.iter().copied().collect()
    }

    /// A fresh 8-byte counter: its offset in every area, if it ends at
    /// or below offset `end`.
    pub fn alloc_counter(&mut self, end: u64) -> Option<u32> {
        let c = self.next_counter;
        (u64::from(c) + 8 <= end).then(|| {
            self.next_counter += 8;
            c
        })
    }

    /// An area for a new thread: a recycled one or a fresh mapping made by
    /// `inj` in the client.
    pub fn alloc(
        &mut self,
        mem: &mut dyn ClientMemory,
        inj: &mut Injector,
    ) -> Result<u64, EngineError> {
        let area = match self.free.pop() {
            Some(a) => a,
            None => {
                const PROT: u64 = (libc::PROT_READ | libc::PROT_WRITE) as u64;
                const FLAGS: u64 =
                    (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE) as u64;
                // The injection runs client code: queued writes go first.
                mem.flush()?;
                let hint = layout::AREA_HINT + self.made * layout::AREA_SIZE;
                let r = inj(
                    libc::SYS_mmap as u64,
                    [hint, layout::AREA_SIZE, PROT, FLAGS, u64::MAX, 0],
                )?;
                if r < 0 {
                    return Err(EngineError(format!(
                        "cannot map a thread area in the client: {}",
                        std::io::Error::from_raw_os_error(-r as i32)
                    )));
                }
                self.made += 1;
                // The calling-context runtime's arena (contexts mode) is
                // read at random over up to hundreds of megabytes (a
                // python run's million contexts and arcs, the call memo):
                // huge pages spare most of those reads a TLB miss. A hint
                // (its failure changes nothing); in the other modes that
                // part of the area is never touched.
                let arena = [
                    r as u64 + layout::AREA_ARENA,
                    layout::AREA_SIZE - layout::AREA_ARENA,
                    libc::MADV_HUGEPAGE as u64,
                    0,
                    0,
                    0,
                ];
                inj(libc::SYS_madvise as u64, arena)?;
                r as u64
            }
        };
        self.live.insert(area);
        Ok(area)
    }

    /// Bytes of counters handed out so far.
    fn counters_len(&self) -> usize {
        (self.next_counter - AREA_COUNTERS) as usize
    }

    /// The counters of `area` by index (none if its memory is gone).
    fn read_counters(&self, area: u64, mem: &mut dyn ClientMemory) -> Vec<u64> {
        mem.read(area + u64::from(AREA_COUNTERS), self.counters_len())
            .map(|bytes| words(&bytes))
            .unwrap_or_default()
    }

    /// A thread exited: its counters join the totals and its area, zeroed,
    /// goes to the next thread. (Called while the client's memory is still
    /// there.)
    pub fn thread_exited(&mut self, area: u64, mem: &mut dyn ClientMemory) {
        if !self.live.remove(&area) {
            return;
        }
        let counts = self.read_counters(area, mem);
        add_into(&mut self.totals, &counts);
        let lookups = read_lookup_counts(area, mem);
        add_to(&mut self.lookup_totals, &lookups);
        mem.write(area + u64::from(S_STAT_INLINE_HITS), &[0; 24]);
        // No signal handler of the next thread has started.
        mem.write(area + u64::from(layout::S_SIG_DEPTH), &[0; 8]);
        mem.write(
            area + u64::from(AREA_COUNTERS),
            &vec![0u8; self.counters_len()],
        );
        self.free.push(area);
    }

    /// Leaving a signal handler of the stopped thread whose area is `area`:
    /// the spill slots its trampoline pushed come back (the client's own
    /// `rt_sigreturn` stub does the same, `emit::signals`).
    pub fn pop_signal_spills(area: u64, mem: &mut dyn ClientMemory) -> Result<(), EngineError> {
        let depth_at = area + u64::from(layout::S_SIG_DEPTH);
        let depth = mem.read_u64(depth_at)?;
        if depth == 0 {
            return Ok(());
        }
        let level = (depth - 1) % layout::SIGSAVE_LEVELS;
        let set = area + layout::AREA_SIGSAVE + level * layout::SPILL_BYTES;
        let saved = mem.read(set, layout::SPILL_BYTES as usize)?;
        mem.write(area, &saved);
        mem.write(depth_at, &(depth - 1).to_le_bytes());
        Ok(())
    }

    /// What every thread counted: the totals of exited threads plus the
    /// counters of the live areas.
    pub fn counts(&self, mem: &mut dyn ClientMemory) -> Counts {
        let mut counts = self.totals.clone();
        for &area in &self.live {
            add_into(&mut counts, &self.read_counters(area, mem));
        }
        Counts(counts)
    }

    /// The lookup counters of every thread (see [`Areas::counts`]).
    pub fn lookup_counts(&self, mem: &mut dyn ClientMemory) -> LookupCounts {
        let mut lookups = self.lookup_totals;
        for &area in &self.live {
            add_to(&mut lookups, &read_lookup_counts(area, mem));
        }
        lookups
    }
}

/// The lookup counters of the area at `area` (zero if its memory is gone).
fn read_lookup_counts(area: u64, mem: &mut dyn ClientMemory) -> LookupCounts {
    let mut out = [0; 3];
    if let Ok(bytes) = mem.read(area + u64::from(S_STAT_INLINE_HITS), 24) {
        out.copy_from_slice(&words(&bytes));
    }
    out
}

/// Little-endian 64-bit words.
fn words(bytes: &[u8]) -> Vec<u64> {
    bytes
        .chunks_exact(8)
        .map(|w| u64::from_le_bytes(w.try_into().expect("8 bytes")))
        .collect()
}

/// Adds `add` into `total` element by element.
fn add_to(total: &mut [u64], add: &[u64]) {
    for (t, a) in total.iter_mut().zip(add) {
        *t += a;
    }
}

/// Adds `add` into `total`, which grows to its length.
fn add_into(total: &mut Vec<u64>, add: &[u64]) {
    if total.len() < add.len() {
        total.resize(add.len(), 0);
    }
    add_to(total, add);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client_mem::FakeMemory;
    use crate::space::tests::mmap_as_asked;

    #[test]
    fn counts_of_exited_threads_are_kept_and_their_areas_reused() {
        let mut fake = FakeMemory::default();
        let mut areas = Areas::new();
        let a1 = areas.alloc(&mut fake, &mut mmap_as_asked).unwrap();
        let a2 = areas.alloc(&mut fake, &mut mmap_as_asked).unwrap();
        assert_eq!(a1, layout::AREA_HINT);
        assert_eq!(a2, layout::AREA_HINT + layout::AREA_SIZE);
        let end = u64::from(AREA_COUNTERS) + 16;
        let (c1, c2) = (areas.alloc_counter(end), areas.alloc_counter(end));
        assert_eq!((c1, c2), (Some(AREA_COUNTERS), Some(AREA_COUNTERS + 8)));
        assert_eq!(areas.alloc_counter(end), None, "no room past `end`");
        let (c1, c2) = (AREA_COUNTERS, AREA_COUNTERS + 8);
        let put = |at: u64, v: u64| fake.poke(at, &v.to_le_bytes());
        put(a1 + u64::from(c1), 3);
        put(a1 + u64::from(S_STAT_INLINE_HITS), 7);
        put(a2 + u64::from(c1), 10);
        put(a2 + u64::from(c2), 4);
        areas.thread_exited(a1, &mut fake);
        // (Folded once only.)
        areas.thread_exited(a1, &mut fake);
        // Zeroed for the next thread, which gets it without a new mapping.
        assert_eq!(fake.u64_at(a1 + u64::from(c1)), 0);
        assert_eq!(fake.u64_at(a1 + u64::from(S_STAT_INLINE_HITS)), 0);
        let mut no_mmap =
            |_: u64, _: [u64; 6]| -> Result<i64, EngineError> { panic!("a free area is reused") };
        assert_eq!(areas.alloc(&mut fake, &mut no_mmap).unwrap(), a1);
        // Exited threads' totals plus the live areas.
        let counts = areas.counts(&mut fake);
        assert_eq!((counts.get(c1), counts.get(c2)), (13, 4));
        assert_eq!(areas.lookup_counts(&mut fake), [7, 0, 0]);
    }

    #[test]
    fn a_failed_mapping_is_an_error() {
        let mut areas = Areas::new();
        let mut enomem =
            |_: u64, _: [u64; 6]| -> Result<i64, EngineError> { Ok(-i64::from(libc::ENOMEM)) };
        let e = areas
            .alloc(&mut FakeMemory::default(), &mut enomem)
            .unwrap_err();
        assert!(e.0.starts_with("cannot map a thread area"), "{}", e.0);
    }
}
