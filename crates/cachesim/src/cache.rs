//! One set-associative cache as Cachegrind models it (spec §1.1–§1.3):
//! true LRU per set, whole block numbers as tags, write-allocate, no
//! dirty state.

use crate::config::CacheConfig;

/// A simulated cache. The tag store is one flat array of `sets × assoc`
/// block numbers, each set ordered most recently used first.
#[derive(Debug, Clone)]
pub struct Cache {
    config: CacheConfig,
    tags: Box<[u64]>,
    assoc: usize,
    set_mask: u64,
    line_bits: u32,
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
        }
    }

    /// The geometry.
    pub fn config(&self) -> CacheConfig {
        self.config
    }

    /// Looks `block` up in its set and makes it the most recently used
    /// entry, evicting the least recently used one on a miss. Returns
    /// `true` on a miss.
    #[inline(always)]
    fn set_ref_is_miss(&mut self, block: u64) -> bool {
        let base = (block & self.set_mask) as usize * self.assoc;
        let set = &mut self.tags[base..base + self.assoc];
        if set[0] == block {
            return false;
        }
        match set.iter().skip(1).position(|&t| t == block) {
            Some(i) => {
                // Hit at way i+1: shift the more recent ways down one.
                set.copy_within(0..=i, 1);
                set[0] = block;
                false
            }
            None => {
                set.copy_within(0..self.assoc - 1, 1);
                set[0] = block;
                true
            }
        }
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
