//! The I1/D1/LL hierarchy (spec §1.4): LL is consulted only on an L1 miss,
//! with the same address and size, and is shared by both L1 caches.

use crate::cache::{Cache, LlTags, WideTags};
use crate::config::CacheConfig;

/// What one instruction fetch or data access did in the hierarchy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Outcome {
    /// Hit in I1 or D1.
    Hit = 0,
    /// Missed L1, hit LL.
    L1Miss = 1,
    /// Missed L1 and LL.
    LlMiss = 2,
}

impl Outcome {
    /// Whether the L1 cache missed.
    #[inline]
    pub fn l1_miss(self) -> bool {
        self != Outcome::Hit
    }

    /// Whether the LL cache missed too.
    #[inline]
    pub fn ll_miss(self) -> bool {
        self == Outcome::LlMiss
    }
}

/// Counters for one kind of access (Ir, Dr or Dw): references, L1 misses
/// and LL misses.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AccessCounts {
    /// Accesses.
    pub refs: u64,
    /// L1 misses (I1mr, D1mr or D1mw).
    pub l1_misses: u64,
    /// LL misses (ILmr, DLmr or DLmw).
    pub ll_misses: u64,
}

impl AccessCounts {
    /// Counts one access with its outcome; branch-free.
    #[inline(always)]
    pub fn record(&mut self, o: Outcome) {
        self.refs += 1;
        self.l1_misses += u64::from(o.l1_miss());
        self.ll_misses += u64::from(o.ll_miss());
    }
}

/// The three caches of Cachegrind's model.
#[derive(Debug, Clone)]
pub struct CacheSim {
    i1: Cache<WideTags>,
    d1: Cache<WideTags>,
    /// Compact tags where exact: LL's tag array is the big one.
    ll: Cache<LlTags>,
    max_access: u32,
}

impl CacheSim {
    /// A cold hierarchy. Every geometry must pass [`CacheConfig::check`].
    pub fn new(i1: CacheConfig, d1: CacheConfig, ll: CacheConfig) -> CacheSim {
        let max_access = i1.line_size.min(d1.line_size).min(ll.line_size);
        CacheSim {
            i1: Cache::new(i1),
            d1: Cache::new(d1),
            ll: Cache::new(ll),
            max_access,
        }
    }

    /// The I1 geometry.
    pub fn i1(&self) -> CacheConfig {
        self.i1.config()
    }

    /// The D1 geometry.
    pub fn d1(&self) -> CacheConfig {
        self.d1.config()
    }

    /// The LL geometry.
    pub fn ll(&self) -> CacheConfig {
        self.ll.config()
    }

    /// How many I1 references so far changed its tag store (all but hits
    /// on a set's most recently used line): while the count stands still,
    /// every I1 set has the same most recently used line.
    #[inline]
    pub fn i1_changes(&self) -> u64 {
        self.i1.changes()
    }

    /// The largest access simulated as such: the smallest line size. Like
    /// Cachegrind (which caps helper and CAS accesses this way, spec §2.4),
    /// longer accesses count as this many bytes at their start address, so
    /// no access touches more than two lines.
    pub fn max_access(&self) -> u32 {
        self.max_access
    }

    /// Fetch of the instruction at `addr`, `len` bytes long.
    #[inline(always)]
    pub fn instr(&mut self, addr: u64, len: u32) -> Outcome {
        let len = len.min(self.max_access);
        if !self.i1.access_is_miss(addr, len) {
            Outcome::Hit
        } else if !self.ll.access_is_miss(addr, len) {
            Outcome::L1Miss
        } else {
            Outcome::LlMiss
        }
    }

    /// The I1 half of [`instr`](Self::instr): whether the fetch misses I1.
    /// I1 and D1 meet only in LL, so a caller may simulate a run of fetches
    /// in I1 ahead of the data accesses between them, as long as each I1
    /// miss then goes to LL ([`instr_ll_is_miss`](Self::instr_ll_is_miss))
    /// in its original place among the data accesses' LL references.
    #[inline(always)]
    pub fn i1_is_miss(&mut self, addr: u64, len: u32) -> bool {
        self.i1.access_is_miss(addr, len.min(self.max_access))
    }

    /// A reference given by its line number `block` (an address over the
    /// line size) to I1 (a `fetch`) or D1 alone, to that line and with
    /// `straddles` the next one too, in address order (what an access of
    /// the last byte of one and the first of the other does): whether it
    /// missed.
    #[inline(always)]
    pub fn l1_line_is_miss(&mut self, fetch: bool, block: u64, straddles: bool) -> bool {
        let l1 = if fetch { &mut self.i1 } else { &mut self.d1 };
        let miss = l1.line_is_miss(block);
        // Both lines are referenced, whatever the first did.
        miss | (straddles && l1.line_is_miss(block + 1))
    }

    /// The LL half of [`instr`](Self::instr), after an I1 miss: whether LL
    /// missed too.
    #[inline]
    pub fn instr_ll_is_miss(&mut self, addr: u64, len: u32) -> bool {
        self.ll.access_is_miss(addr, len.min(self.max_access))
    }

    /// A data access (read, write or read-modify-write: the model treats
    /// them alike; the caller decides which counters it feeds).
    #[inline(always)]
    pub fn data(&mut self, addr: u64, size: u32) -> Outcome {
        let size = size.min(self.max_access);
        if !self.d1.access_is_miss(addr, size) {
            Outcome::Hit
        } else if !self.ll.access_is_miss(addr, size) {
            Outcome::L1Miss
        } else {
            Outcome::LlMiss
        }
    }

    /// The D1 half of [`data`](Self::data): whether the access misses D1
    /// (then [`data_ll_is_miss`](Self::data_ll_is_miss) in its place among
    /// the LL references, as for [`i1_is_miss`](Self::i1_is_miss)).
    #[inline(always)]
    pub fn d1_is_miss(&mut self, addr: u64, size: u32) -> bool {
        self.d1.access_is_miss(addr, size.min(self.max_access))
    }

    /// The LL half of [`data`](Self::data), after a D1 miss: whether LL
    /// missed too.
    #[inline]
    pub fn data_ll_is_miss(&mut self, addr: u64, size: u32) -> bool {
        self.ll.access_is_miss(addr, size.min(self.max_access))
    }

    /// A data read (`Dr`).
    #[inline(always)]
    pub fn read(&mut self, addr: u64, size: u32) -> Outcome {
        self.data(addr, size)
    }

    /// A data write (`Dw`).
    #[inline(always)]
    pub fn write(&mut self, addr: u64, size: u32) -> Outcome {
        self.data(addr, size)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Spec §1.5 with `--D1=128,2,64 --LL=65536,4,64`: D1mr and DLmr per
    /// load exactly as Valgrind measured them.
    #[test]
    fn worked_example_d1_and_ll() {
        let mut sim = CacheSim::new(
            CacheConfig::new(32768, 8, 64),
            CacheConfig::new(128, 2, 64),
            CacheConfig::new(65536, 4, 64),
        );
        let x = 0x40_0000u64;
        let mut dr = AccessCounts::default();
        let mut got = Vec::new();
        for off in [60, 0, 128, 64, 60] {
            let o = sim.read(x + off, 8);
            dr.record(o);
            got.push((u8::from(o.l1_miss()), u8::from(o.ll_miss())));
        }
        assert_eq!(got, [(1, 1), (0, 0), (1, 1), (1, 0), (1, 0)]);
        assert_eq!(
            dr,
            AccessCounts {
                refs: 5,
                l1_misses: 4,
                ll_misses: 2
            }
        );
    }

    /// Spec §1.5: a 10-byte instruction at line offset 58 with
    /// `--I1=128,2,64` misses once (the second line is new), and the
    /// following `ret` in that second line hits.
    #[test]
    fn straddling_instruction() {
        let mut sim = CacheSim::new(
            CacheConfig::new(128, 2, 64),
            CacheConfig::new(32768, 8, 64),
            CacheConfig::new(65536, 4, 64),
        );
        let base = 0x40_1000u64;
        assert_eq!(sim.instr(base, 4), Outcome::LlMiss);
        assert_eq!(sim.instr(base + 58, 10), Outcome::LlMiss);
        assert_eq!(sim.instr(base + 68, 1), Outcome::Hit);
    }

    #[test]
    fn ll_is_shared_and_only_sees_l1_misses() {
        let mut sim = CacheSim::new(
            CacheConfig::new(1024, 1, 64),
            CacheConfig::new(1024, 1, 64),
            CacheConfig::new(8192, 2, 64),
        );
        // A data read brings the line into LL; the instruction fetch of
        // the same line then misses I1 but hits LL.
        assert_eq!(sim.read(0x8000, 4), Outcome::LlMiss);
        assert_eq!(sim.instr(0x8000, 4), Outcome::L1Miss);
        // Writes allocate like reads.
        assert_eq!(sim.write(0x9000, 8), Outcome::LlMiss);
        assert_eq!(sim.read(0x9004, 4), Outcome::Hit);
        // Oversized accesses are capped to the smallest line size.
        assert_eq!(sim.max_access(), 64);
        assert_eq!(sim.read(0xa000, 512), Outcome::LlMiss);
        assert_eq!(sim.read(0xa040, 8), Outcome::LlMiss);
    }
}
