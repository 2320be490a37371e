//! One set-associative cache as Cachegrind models it (spec §1.1–§1.3):
//! true LRU per set, whole block numbers as tags, write-allocate, no
//! dirty state.
//!
//! The model is written once, over a [`Tags`] store: I1 and D1 keep whole
//! block numbers ([`WideTags`]), and LL, whose tag array is the one big
//! enough to matter (a 256 MB LL has 4M lines), keeps 32-bit keys where
//! they are exact ([`LlTags`]). A model with per-line state (cache-use
//! analysis) would be another store, compiled on its own, so the plain
//! model's paths stay as they are.

use crate::config::CacheConfig;

/// A simulated cache: `sets × assoc` tags, each set ordered most recently
/// used first, in a store `T`.
#[derive(Debug, Clone)]
pub(crate) struct Cache<T> {
    config: CacheConfig,
    tags: T,
    assoc: usize,
    set_mask: u64,
    line_bits: u32,
    /// References that changed the tag store (all but hits on a set's most
    /// recently used line), so far: while it stands still, every set's
    /// most recently used line stays the same.
    changes: u64,
}

/// Where a cache keeps its tags, and how a block is compared with them.
/// Every store behaves exactly as whole block numbers would, all zero at
/// the start (so block 0 "hits" in set 0 of a cold cache, as in
/// Cachegrind, and nowhere else).
pub(crate) trait Tags: Clone + std::fmt::Debug {
    /// A cold store for `config`.
    fn cold(config: &CacheConfig) -> Self;

    /// Whether `block` is the most recently used line of the set whose
    /// first way is `base`: the hot path, one compare.
    fn is_mru(&self, base: usize, block: u64) -> bool;

    /// A reference to `block`, not the most recently used line of the set
    /// of `assoc` ways from `base`: moves it (or, on a miss, the new line)
    /// to the front. Returns `true` on a miss.
    fn reorder_is_miss(&mut self, base: usize, assoc: usize, block: u64) -> bool;

    /// Every way's block, set after set, each most recently used first,
    /// as whole block numbers (for tests).
    #[cfg(test)]
    fn blocks(&self, assoc: usize) -> Vec<u64>;
}

/// Whole block numbers (8 bytes a line).
#[derive(Debug)]
pub(crate) struct WideTags(Box<[u64]>);

/// LL's tags: 32-bit keys (4 bytes a line) when the geometry makes them
/// exact for every canonical x86-64 address ([`CompactTags`]), else, or
/// once an address beyond them comes (never, from a real process), whole
/// block numbers.
#[derive(Debug, Clone)]
pub(crate) enum LlTags {
    /// Keys.
    Compact(CompactTags),
    /// Whole block numbers.
    Wide(WideTags),
}

/// 32-bit keys: what identifies a line within its set, made to fit.
///
/// With `S` = line bits + set bits, the key of the line at `addr` is
/// `((addr + 2^47) mod 2^64 >> S) + 1`. Adding 2^47 maps the canonical
/// addresses (user space below 2^47, and the kernel half from
/// `0xffff_8000_0000_0000`, which holds the vsyscall page at
/// `0xffff_ffff_ff60_0000`) onto `[0, 2^48)` in order, so within a set
/// (fixed address bits below `S`) distinct lines get distinct keys, from 1
/// to `2^(48-S)`: below 2^32 exactly when `S >= 17` (a way of 128 KiB or
/// more, so LL sizes, never L1's). No key is 0, whatever the address, so
/// 0 can stand for the cold state: the block 0 of a cold set, which no
/// reference to that set finds (block 0 is in set 0 alone); set 0 starts
/// with block 0's real key instead, as block 0 is there. An address
/// whose key does not fit (non-canonical: no process can touch one, but a
/// faulting access is still simulated) turns the store into whole block
/// numbers first, so the model stays exact for any address.
#[derive(Debug)]
pub(crate) struct CompactTags {
    tags: Box<[u32]>,
    line_bits: u32,
    /// Line bits + set bits: `S` above.
    key_shift: u32,
}

/// What maps the canonical addresses onto `[0, 2^48)` (see [`CompactTags`]).
const CANONICAL_BIAS: u64 = 1 << 47;

/// The smallest line bits + set bits for which [`CompactTags`] are exact.
const COMPACT_MIN_SHIFT: u32 = 17;

/// A copy of a tag array, with only the pages (4 KiB) that hold a non-zero
/// tag written: the rest of the copy stays zeroed memory that the OS has
/// not yet given pages for. A cold LL of 512 MB (32 MiB of tags, which
/// every process's tool starts from a copy of) costs no memory until used,
/// where a plain copy made all of it resident.
fn lazy_copy<T: Copy + Default + PartialEq>(from: &[T]) -> Box<[T]> {
    let page = 4096 / std::mem::size_of::<T>();
    let mut to = vec![T::default(); from.len()].into_boxed_slice();
    for (to, from) in to.chunks_mut(page).zip(from.chunks(page)) {
        // Reading a page never written maps the shared zero page: the
        // scan itself makes nothing resident.
        if from.iter().any(|&t| t != T::default()) {
            to.copy_from_slice(from);
        }
    }
    to
}

/// Puts `tag` at the front of `set`, shifting the more recent ways down
/// one, while searching for it: each way takes the tag of the way before
/// it until `tag` is found (a hit, whose old way is overwritten) or the
/// least recently used tag falls off the end (a miss, returned `true`). A
/// plain loop: sets are small, and `copy_within` calls `memmove`.
#[inline(always)]
fn shift_in<T: Copy + PartialEq>(set: &mut [T], tag: T) -> bool {
    let mut carry = tag;
    for t in set.iter_mut() {
        let here = std::mem::replace(t, carry);
        if here == tag {
            return false;
        }
        carry = here;
    }
    true
}

impl Clone for WideTags {
    fn clone(&self) -> WideTags {
        WideTags(lazy_copy(&self.0))
    }
}

impl Tags for WideTags {
    fn cold(config: &CacheConfig) -> WideTags {
        // Zeroed memory comes lazily from the OS, so even a 300 MB LL's
        // tag array costs nothing until it is touched.
        WideTags(vec![0u64; (config.sets() * config.assoc) as usize].into_boxed_slice())
    }

    #[inline(always)]
    fn is_mru(&self, base: usize, block: u64) -> bool {
        // One bounds check and one compare. (A filter on the line
        // referenced last, in front of it, saved the indexing but cost a
        // hard-to-predict branch: the consumer took 4 % longer on bzip2.)
        self.0.get(base) == Some(&block)
    }

    #[inline(always)]
    fn reorder_is_miss(&mut self, base: usize, assoc: usize, block: u64) -> bool {
        shift_in(&mut self.0[base..base + assoc], block)
    }

    #[cfg(test)]
    fn blocks(&self, _assoc: usize) -> Vec<u64> {
        self.0.to_vec()
    }
}

impl Clone for CompactTags {
    fn clone(&self) -> CompactTags {
        CompactTags {
            tags: lazy_copy(&self.tags),
            ..*self
        }
    }
}

impl CompactTags {
    /// Compact tags for `config`, if they are exact for it (see the type).
    fn for_config(config: &CacheConfig) -> Option<CompactTags> {
        let line_bits = config.line_size.trailing_zeros();
        let key_shift = line_bits + config.sets().trailing_zeros();
        // At most 47 too, for the bias to keep the set bits (sizes are
        // below 2^31 anyway).
        if !(COMPACT_MIN_SHIFT..=47).contains(&key_shift) {
            return None;
        }
        let mut c = CompactTags {
            tags: vec![0u32; (config.sets() * config.assoc) as usize].into_boxed_slice(),
            line_bits,
            key_shift,
        };
        // Set 0 holds block 0 (the whole tags' zeros), which has a key.
        let zero = u32::try_from(c.key(0)).expect("canonical");
        c.tags[..config.assoc as usize].fill(zero);
        Some(c)
    }

    /// The key of `block` (see the type): never 0; below 2^32 for every
    /// canonical address.
    #[inline(always)]
    fn key(&self, block: u64) -> u64 {
        ((block << self.line_bits).wrapping_add(CANONICAL_BIAS) >> self.key_shift) + 1
    }

    /// The block a non-zero `key` in `set` stands for.
    fn block(&self, key: u32, set: u64) -> u64 {
        let line = (u64::from(key - 1) << self.key_shift).wrapping_sub(CANONICAL_BIAS);
        (line >> self.line_bits) | set
    }

    /// The same state as whole block numbers; pages of cold sets stay
    /// untouched.
    fn widen(&self, assoc: usize) -> WideTags {
        let mut wide = vec![0u64; self.tags.len()].into_boxed_slice();
        for (i, &t) in self.tags.iter().enumerate() {
            if t != 0 {
                wide[i] = self.block(t, (i / assoc) as u64);
            }
        }
        WideTags(wide)
    }
}

impl LlTags {
    /// [`Tags::reorder_is_miss`] for a block whose key does not fit: the
    /// store becomes whole block numbers first. Out of line: it never
    /// happens in a real process, and kept apart it leaves the paths that
    /// inline the model small.
    #[cold]
    #[inline(never)]
    fn widened_reorder_is_miss(&mut self, base: usize, assoc: usize, block: u64) -> bool {
        if let LlTags::Compact(c) = self {
            *self = LlTags::Wide(c.widen(assoc));
        }
        match self {
            LlTags::Wide(w) => w.reorder_is_miss(base, assoc, block),
            LlTags::Compact(_) => unreachable!("widened above"),
        }
    }
}

impl Tags for LlTags {
    fn cold(config: &CacheConfig) -> LlTags {
        match CompactTags::for_config(config) {
            Some(c) => LlTags::Compact(c),
            None => LlTags::Wide(WideTags::cold(config)),
        }
    }

    #[inline(always)]
    fn is_mru(&self, base: usize, block: u64) -> bool {
        match self {
            // Zero-extended: a key that does not fit matches no tag.
            LlTags::Compact(c) => c.tags.get(base).map(|&t| u64::from(t)) == Some(c.key(block)),
            LlTags::Wide(w) => w.is_mru(base, block),
        }
    }

    #[inline(always)]
    fn reorder_is_miss(&mut self, base: usize, assoc: usize, block: u64) -> bool {
        match self {
            LlTags::Compact(c) => match u32::try_from(c.key(block)) {
                Ok(key) => shift_in(&mut c.tags[base..base + assoc], key),
                Err(_) => self.widened_reorder_is_miss(base, assoc, block),
            },
            LlTags::Wide(w) => w.reorder_is_miss(base, assoc, block),
        }
    }

    #[cfg(test)]
    fn blocks(&self, assoc: usize) -> Vec<u64> {
        match self {
            LlTags::Compact(c) => c.widen(assoc).0.to_vec(),
            LlTags::Wide(w) => w.0.to_vec(),
        }
    }
}

impl<T: Tags> Cache<T> {
    /// An empty (all tags zero, like Cachegrind's) cache of geometry
    /// `config`, which must pass [`CacheConfig::check`].
    ///
    /// # Panics
    /// If `config` is invalid: configurations are validated where they are
    /// parsed or detected, so this is a programming error.
    pub fn new(config: CacheConfig) -> Cache<T> {
        assert!(config.check().is_ok(), "invalid cache geometry {config:?}");
        Cache {
            config,
            tags: T::cold(&config),
            assoc: config.assoc as usize,
            set_mask: u64::from(config.sets()) - 1,
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
        // changes nothing.
        if self.tags.is_mru(base, block) {
            return false;
        }
        self.changes += 1;
        self.tags.reorder_is_miss(base, self.assoc, block)
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

    /// A reference to the whole of line `block` (an address's line number):
    /// what [`access_is_miss`](Self::access_is_miss) does for an access
    /// within one line, without working the line out again.
    #[inline(always)]
    pub fn line_is_miss(&mut self, block: u64) -> bool {
        self.set_ref_is_miss(block)
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

    /// The caches I1 and D1 are.
    type Cache = super::Cache<WideTags>;

    /// The MRU-first contents of the set holding `block`.
    fn set_of<T: Tags>(c: &super::Cache<T>, block: u64) -> Vec<u64> {
        let base = (block & c.set_mask) as usize * c.assoc;
        sets_of(c)[base..base + c.assoc].to_vec()
    }

    /// Every set's contents, set after set.
    fn sets_of<T: Tags>(c: &super::Cache<T>) -> Vec<u64> {
        c.tags.blocks(c.assoc)
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
        assert_eq!(sets_of(&d), sets_of(&c));
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

    /// A random stream over the addresses a process meets (low ones
    /// inside the first way, block 0 among them, the top of user space,
    /// the kernel half's vsyscall page), near each other or not.
    fn canonical_stream(n: usize, mut seed: u64) -> Vec<(u64, u32)> {
        let regions = [
            0u64,
            0x40_0000,
            0x5555_5555_0000,
            0x7fff_ffff_0000,
            0xffff_ffff_ff60_0000,
            0xffff_8000_0000_0000,
            0xffff_ffff_fff8_0000,
        ];
        let mut addr = 0u64;
        (0..n)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                addr = match seed % 5 {
                    // Anywhere in a region, within a few ways' worth.
                    0 => regions[(seed >> 8) as usize % regions.len()]
                        .wrapping_add((seed >> 20) % (1 << 19)),
                    _ => addr.wrapping_add(seed % 192).wrapping_sub(64),
                };
                (addr, [1, 4, 8, 16][(seed >> 16) as usize % 4])
            })
            .collect()
    }

    /// LL's compact keys give whole block numbers' outcomes and state, on
    /// every canonical address; a non-canonical one widens the store, and
    /// it goes on the same.
    #[test]
    fn compact_tags_equal_wide_tags() {
        // S = 17, the least that keys fit for (2048 sets of 64-byte
        // lines), and S = 28, the 256 MB direct-mapped LL's.
        for config in [
            CacheConfig::new(2048 * 64 * 2, 2, 64),
            CacheConfig::new(2048 * 64, 1, 64),
            CacheConfig::new(4096 * 32 * 4, 4, 32),
            CacheConfig::new(1 << 28, 1, 64),
        ] {
            let mut wide = Cache::new(config);
            let mut ll = super::Cache::<LlTags>::new(config);
            assert!(matches!(ll.tags, LlTags::Compact(_)), "{config:?}");
            let mut stream = canonical_stream(100_000, u64::from(config.size));
            // Block 0 hits in set 0 of cold caches, and nowhere else.
            stream.splice(0..0, [(0, 8), (0x40, 8), (64 << 20, 8), (0, 4)]);
            for (n, &(addr, size)) in stream.iter().enumerate() {
                assert_eq!(
                    ll.access_is_miss(addr, size),
                    wide.access_is_miss(addr, size),
                    "{config:?}: access {n} at {addr:#x}"
                );
            }
            assert!(matches!(ll.tags, LlTags::Compact(_)));
            assert_eq!(ll.changes(), wide.changes());
            let ll_sets = sets_of(&ll);
            assert_eq!(ll_sets, sets_of(&wide));
            assert!(ll_sets.iter().filter(|&&b| b != 0).count() > 1000);
            // A non-canonical address: widened, the same state, and on.
            for addr in [0x8000_0000_0000_0040u64, 0x40, u64::MAX - 3] {
                assert_eq!(ll.access_is_miss(addr, 8), wide.access_is_miss(addr, 8));
            }
            assert!(matches!(ll.tags, LlTags::Wide(_)));
            for &(addr, size) in &stream[..20_000] {
                assert_eq!(
                    ll.access_is_miss(addr, size),
                    wide.access_is_miss(addr, size)
                );
            }
            assert_eq!(sets_of(&ll), sets_of(&wide));
        }
    }

    /// Geometries whose keys would not fit keep whole block numbers; a
    /// copy of compact tags is as lazy as one of wide tags.
    #[test]
    fn compact_only_where_exact() {
        let l1 = CacheConfig::new(32768, 8, 64);
        assert!(matches!(
            super::Cache::<LlTags>::new(l1).tags,
            LlTags::Wide(_)
        ));
        let just_below = CacheConfig::new(1024 * 64, 1, 64);
        assert!(matches!(
            super::Cache::<LlTags>::new(just_below).tags,
            LlTags::Wide(_)
        ));
        let mut ll = super::Cache::<LlTags>::new(CacheConfig::new(1 << 28, 1, 64));
        ll.access_is_miss(0x7fff_ffff_f000, 8);
        let copy = ll.clone();
        assert_eq!(sets_of(&copy), sets_of(&ll));
    }
}
