//! A small direct-mapped cache in front of the tree's maps, for what the
//! per-block path looks up at calls and in skipped code: the recent keys
//! stay in a few hundred KiB, where the maps (hundreds of thousands of
//! contexts and arcs on large programs) miss the processor's caches.

use rustc_hash::FxHasher;
use std::hash::{Hash, Hasher};

/// Entries of a [`Memo`] (a power of two).
const ENTRIES: usize = 4096;

/// Recently used keys and their values; a miss says nothing.
#[derive(Debug, Clone)]
pub(crate) struct Memo<K, V> {
    entries: Vec<Option<(K, V)>>,
}

impl<K, V> Default for Memo<K, V> {
    fn default() -> Self {
        Memo {
            entries: Vec::new(),
        }
    }
}

impl<K: Copy + Eq + Hash, V: Copy> Memo<K, V> {
    fn index(key: &K) -> usize {
        let mut h = FxHasher::default();
        key.hash(&mut h);
        // The high bits of Fx's product are the mixed ones.
        (h.finish() >> (64 - ENTRIES.trailing_zeros())) as usize
    }

    /// The value kept for `key`, if it is still kept.
    #[inline]
    pub fn get(&self, key: &K) -> Option<V> {
        match self.entries.get(Self::index(key)) {
            Some(Some((k, v))) if k == key => Some(*v),
            _ => None,
        }
    }

    /// Keeps `value` for `key` (in place of whatever shared its entry).
    pub fn put(&mut self, key: K, value: V) {
        if self.entries.is_empty() {
            self.entries.resize(ENTRIES, None);
        }
        self.entries[Self::index(&key)] = Some((key, value));
    }

    /// `get`, else `make` (kept).
    #[inline]
    pub fn get_or(&mut self, key: K, make: impl FnOnce() -> V) -> V {
        match self.get(&key) {
            Some(v) => v,
            None => {
                let v = make();
                self.put(key, v);
                v
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_last_value_of_each_entry() {
        let mut m: Memo<(u32, u64), u32> = Memo::default();
        assert_eq!(m.get(&(1, 2)), None);
        assert_eq!(m.get_or((1, 2), || 7), 7);
        assert_eq!(m.get_or((1, 2), || 8), 7, "kept");
        m.put((1, 2), 9);
        assert_eq!(m.get(&(1, 2)), Some(9));
        // More keys than entries: some are gone, none is wrong.
        for k in 0..3 * ENTRIES as u64 {
            m.put((0, k), k as u32);
        }
        let kept = (0..3 * ENTRIES as u64)
            .filter(|&k| {
                m.get(&(0, k))
                    .inspect(|&v| assert_eq!(v, k as u32))
                    .is_some()
            })
            .count();
        assert!(kept > 0 && kept <= ENTRIES);
    }
}
