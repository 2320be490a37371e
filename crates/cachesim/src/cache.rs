//! One set-associative cache as Cachegrind models it (spec §1.1–§1.3):
//! true LRU per set, whole block numbers as tags, write-allocate, no
//! dirty state.

use crate::config::CacheConfig;

/// A simulated cache. The tag store is one flat array of `sets × assoc`
/// block numbers, each set ordered most recently used first.
#[derive(Debug)]
pub struct Cache {
    config: CacheConfig,
    tags: Box<[u64]>,
    assoc: usize,
    set_mask: u64,
    line_bits: u32,
    /// References that changed the tag store (all but hits on a set's most
    /// recently used line), so far: while it stands still, every set's
    /// most recently used line stays the same.
    changes: u64,
}

/// Tags per page of the tag array (4 KiB pages).
const PAGE_TAGS: usize = 512;

impl Clone for Cache {
    /// A copy with the same state. Only the pages of tags that hold a
    /// non-zero tag are written: the rest of the copy stays zeroed memory
    /// that the OS has not yet given pages for. A cold LL of 512 MB (64 MiB
    /// of tags, which every process's tool starts from a copy of) costs no
    /// memory until used, where a plain copy made all of it resident.
    fn clone(&self) -> Cache {
        let mut tags = vec![0u64; self.tags.len()].into_boxed_slice();
        for (to, from) in tags.chunks_mut(PAGE_TAGS).zip(self.tags.chunks(PAGE_TAGS)) {
            // Reading a page never written maps the shared zero page: the
            // scan itself makes nothing resident.
            if from.iter().any(|&t| t != 0) {
                to.copy_from_slice(from);
            }
        }
        Cache {
            config: self.config,
            tags,
            assoc: self.assoc,
            set_mask: self.set_mask,
            line_bits: self.line_bits,
            changes: self.changes,
        }
    }
}

impl Cache {
    /// An empty (all tags zero, like Cachegrind's) cache of geometry
    /// `config`, which must pass [`CacheConfig::check`].
    ///
    /// # Panics
    /// If `config` is invalid: configurations are validated where they are
    /// parsed or detected, so this is a programming error.
    pub fn new(config: CacheConfig) -> Cache {
        assert!(config.check().is_ok(), "invalid cache geometry {config:?}");
        let sets = config.sets() as usize;
        let assoc = config.assoc as usize;
        Cache {
            config,
            // Zeroed memory comes lazily from the OS, so even a 300 MB LL's
            // tag array costs nothing until it is touched.
            tags: vec![0u64; sets * assoc].into_boxed_slice(),
            assoc,
            set_mask: sets as u64 - 1,
            line_bits: config.line_size.trailing_zeros(),
            changes: 0,
        }
    }

    /// The geometry.
    pub fn config(&self) -> CacheConfig {
        self.config
    }

    /// How many references so far changed the tag store: a reference that
    /// is not to the most recently used line of its set (a hit further
    /// down, or a miss). Equal counts at two times mean every set has the
    /// same most recently used line at both.
    pub fn changes(&self) -> u64 {
        self.changes
    }

    /// Looks `block` up in its set and makes it the most recently used
    /// entry, evicting the least recently used one on a miss. Returns
    /// `true` on a miss.
    #[inline(always)]
    fn set_ref_is_miss(&mut self, block: u64) -> bool {
        let base = (block & self.set_mask) as usize * self.assoc;
        // The common case, a hit on the set's most recently used line,
        // changes nothing: one bounds check and one compare. (A filter on
        // the line referenced last, in front of it, saved the indexing
        // but cost a hard-to-predict branch: the consumer took 4 % longer
        // on bzip2.)
        if self.tags.get(base) == Some(&block) {
            return false;
        }
        self.reorder_is_miss(base, block)
    }

    /// A reference to `block` that is not the most recently used line of
    /// its set (which starts at `base`): moves it (or, on a miss, the new
    /// line) to the front, shifting the more recent ways down one.
    #[inline(always)]
    fn reorder_is_miss(&mut self, base: usize, block: u64) -> bool {
        self.changes += 1;
        let set = &mut self.tags[base..base + self.assoc];
        // Shift while searching: each way takes the tag of the way before
        // it until `block` is found (a hit, whose old way is overwritten)
        // or the least recently used tag falls off the end (a miss). A
        // plain loop: sets are small, and `copy_within` calls `memmove`.
        let mut carry = block;
        for t in set.iter_mut() {
            let here = std::mem::replace(t, carry);
            if here == block {
                return false;
            }
            carry = here;
        }
        true
    }

    /// One access of `size` bytes at `addr`. An access straddling two lines
    /// updates both (in address order) and is one miss if either missed.
    /// Returns `true` on a miss.
    ///
    /// Callers keep `size` at most the line size (Cachegrind caps data
    /// accesses to the smallest line size); a longer access touches every
    /// line it covers rather than failing.
    #[inline(always)]
    pub fn access_is_miss(&mut self, addr: u64, size: u32) -> bool {
        let b1 = addr >> self.line_bits;
        // Saturating: an access at the very top of memory stays in its line.
        let b2 = addr.saturating_add(u64::from(size.max(1)) - 1) >> self.line_bits;
        if b1 == b2 {
            self.set_ref_is_miss(b1)
        } else {
            self.straddle_is_miss(b1, b2)
        }
    }

    /// The rare multi-line case, kept out of line so the common path stays
    /// small.
    #[inline(never)]
    fn straddle_is_miss(&mut self, b1: u64, b2: u64) -> bool {
        let mut miss = false;
        let mut b = b1;
        loop {
            // Every line is referenced: LRU state changes as a side effect.
            miss |= self.set_ref_is_miss(b);
            if b == b2 {
                return miss;
            }
            b += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The MRU-first contents of the set holding `block`.
    fn set_of(c: &Cache, block: u64) -> Vec<u64> {
        let base = (block & c.set_mask) as usize * c.assoc;
        c.tags[base..base + c.assoc].to_vec()
    }

    #[test]
    fn true_lru_in_one_set() {
        // One set, 4 ways, 64-byte lines.
        let mut c = Cache::new(CacheConfig::new(256, 4, 64));
        let blk = |b: u64| b * 64;
        for b in 1..=4 {
            assert!(c.access_is_miss(blk(b), 8));
        }
        assert_eq!(set_of(&c, 0), [4, 3, 2, 1]);
        assert!(!c.access_is_miss(blk(2), 8));
        assert_eq!(set_of(&c, 0), [2, 4, 3, 1]);
        // 1 is the LRU line and falls off.
        assert!(c.access_is_miss(blk(5), 8));
        assert_eq!(set_of(&c, 0), [5, 2, 4, 3]);
        assert!(c.access_is_miss(blk(1), 8));
        assert!(!c.access_is_miss(blk(4), 8));
        assert_eq!(set_of(&c, 0), [4, 1, 5, 2]);
    }

    /// Only references that reorder a set or miss count as changes.
    #[test]
    fn changes_count_what_moves() {
        let mut c = Cache::new(CacheConfig::new(256, 2, 64));
        assert!(c.access_is_miss(64, 8));
        assert_eq!(c.changes(), 1);
        // Hits on the most recently used line of a set: no change.
        assert!(!c.access_is_miss(70, 8));
        assert!(!c.access_is_miss(64, 4));
        assert_eq!(c.changes(), 1);
        // A hit on the second way reorders.
        assert!(c.access_is_miss(64 + 128, 8));
        assert!(!c.access_is_miss(64, 8));
        assert_eq!(c.changes(), 3);
        assert_eq!(c.clone().changes(), 3);
    }

    #[test]
    fn direct_mapped_and_block_zero_hits_cold() {
        let mut c = Cache::new(CacheConfig::new(1024, 1, 64));
        // Tags start at zero, so block 0 "hits" in a cold cache.
        assert!(!c.access_is_miss(0, 4));
        assert!(c.access_is_miss(1024, 4));
        assert!(c.access_is_miss(0, 4));
        assert!(c.access_is_miss(64, 4));
        assert!(!c.access_is_miss(64 + 60, 4));
    }

    /// Spec §1.5: `--D1=128,2,64`, 8-byte loads at +60, +0, +128, +64, +60
    /// of a fresh aligned buffer.
    #[test]
    fn straddling_load_table() {
        let mut d1 = Cache::new(CacheConfig::new(128, 2, 64));
        let x = 0x10_0000u64; // line 0 of the buffer is block 0x4000
        let l = |n: u64| (x >> 6) + n;
        let expect = [
            (60, true, [l(1), l(0)]),
            (0, false, [l(0), l(1)]),
            (128, true, [l(2), l(0)]),
            (64, true, [l(1), l(2)]),
            (60, true, [l(1), l(0)]),
        ];
        for (off, miss, state) in expect {
            assert_eq!(d1.access_is_miss(x + off, 8), miss, "+{off}");
            assert_eq!(set_of(&d1, 0), state, "+{off}");
        }
    }

    /// The plain model, as spec §1 states it: each set a list, most
    /// recently used first.
    struct Reference {
        sets: Vec<Vec<u64>>,
        line_bits: u32,
    }

    impl Reference {
        fn access_is_miss(&mut self, addr: u64, size: u64) -> bool {
            let (b1, b2) = (addr >> self.line_bits, (addr + size - 1) >> self.line_bits);
            let mut miss = false;
            for b in b1..=b2 {
                let n = self.sets.len() as u64;
                let set = &mut self.sets[(b % n) as usize];
                match set.iter().position(|&t| t == b) {
                    Some(i) => {
                        set.remove(i);
                    }
                    None => {
                        set.pop();
                        miss = true;
                    }
                }
                set.insert(0, b);
            }
            miss
        }
    }

    /// The MRU check and the shifting search give
    /// the plain model's outcome and state on a random stream with many
    /// repeats, hits at every way, misses and straddles.
    #[test]
    fn equals_the_plain_model() {
        for (sets, assoc) in [(4u32, 3u32), (1, 2), (8, 1), (2, 8)] {
            let mut c = Cache::new(CacheConfig::new(sets * assoc * 64, assoc, 64));
            let mut r = Reference {
                sets: vec![vec![0; assoc as usize]; sets as usize],
                line_bits: 6,
            };
            let mut seed = 0x9e37_79b9_7f4a_7c15u64;
            let mut addr = 0u64;
            for n in 0..50_000 {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                // Mostly near the previous access, sometimes anywhere in a
                // range a few times the cache's size.
                addr = match seed % 4 {
                    0 => seed % u64::from(4 * sets * assoc * 64),
                    _ => addr.saturating_add(seed % 96).saturating_sub(40),
                };
                let size = [1u64, 4, 8, 16][(seed >> 8) as usize % 4];
                assert_eq!(
                    c.access_is_miss(addr, size as u32),
                    r.access_is_miss(addr, size),
                    "access {n} at {addr:#x}"
                );
            }
            for (i, set) in r.sets.iter().enumerate() {
                assert_eq!(set_of(&c, i as u64), *set);
            }
        }
    }

    /// A copy has the same state, touched pages or not, and goes on
    /// independently.
    #[test]
    fn clone_keeps_the_state() {
        let mut c = Cache::new(CacheConfig::new(1 << 20, 2, 64));
        for addr in [0x40, 0x1000_0040, 0x7_0000, 0x2_0000_0000] {
            c.access_is_miss(addr, 8);
        }
        let mut d = c.clone();
        assert_eq!(d.tags, c.tags);
        assert!(!d.access_is_miss(0x7_0000, 8));
        assert!(d.access_is_miss(0x9_0000, 8));
        assert!(c.access_is_miss(0x9_0000, 8));
    }

    #[test]
    fn oversized_access_touches_every_line() {
        let mut c = Cache::new(CacheConfig::new(4096, 4, 64));
        assert!(c.access_is_miss(32, 200));
        for line in 0..4u64 {
            assert!(!c.access_is_miss(line * 64, 1));
        }
        // Zero-sized and top-of-memory accesses do not wrap around.
        assert!(c.access_is_miss(u64::MAX, 0));
        assert!(!c.access_is_miss(u64::MAX - 1, 8));
    }
}
