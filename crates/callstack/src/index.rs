//! A hash index over entries kept in a vector elsewhere (the tree's
//! nodes, arcs and run slots): buckets hold only the entries' 4-byte
//! positions, and a lookup compares keys read from the vector. The tree's
//! maps had held a copy of every key besides (on python-json, 2 million
//! run slots took 52 MB of map for 40 MB of slots).

use rustc_hash::FxHasher;
use std::hash::{Hash, Hasher};

/// An empty bucket.
const EMPTY: u32 = u32::MAX;

/// Where a key not found goes.
#[derive(Debug)]
pub(crate) struct Vacant(usize);

/// Positions of entries by the hash of their keys (open addressing, linear
/// probing, at most half full).
#[derive(Debug, Clone, Default)]
pub(crate) struct Index {
    buckets: Vec<u32>,
    len: usize,
}

/// The hash of a key.
#[inline]
pub(crate) fn hash<K: Hash>(key: &K) -> u64 {
    let mut h = FxHasher::default();
    key.hash(&mut h);
    h.finish()
}

impl Index {
    fn bucket(&self, hash: u64) -> usize {
        // Fx's high bits are its mixed ones.
        let bits = self.buckets.len().trailing_zeros();
        (hash >> (64 - bits)) as usize
    }

    /// The position of the entry whose key is `key` (`key_at` gives the
    /// key of each position), or where to [`insert`](Self::insert) it.
    #[inline]
    pub fn find<K: Hash + Eq>(
        &mut self,
        key: &K,
        key_at: impl Fn(u32) -> K,
    ) -> Result<u32, Vacant> {
        if self.buckets.is_empty() {
            self.buckets = vec![EMPTY; 16];
        }
        let mask = self.buckets.len() - 1;
        let mut b = self.bucket(hash(key));
        loop {
            match self.buckets[b] {
                EMPTY => return Err(Vacant(b)),
                i if key_at(i) == *key => return Ok(i),
                _ => b = (b + 1) & mask,
            }
        }
    }

    /// Records position `i` (below `u32::MAX`, its entry already stored,
    /// `key_at` as for `find`) where `find` said, with nothing inserted in
    /// between.
    pub fn insert<K: Hash>(&mut self, at: Vacant, i: u32, key_at: impl Fn(u32) -> K) {
        debug_assert_ne!(i, EMPTY);
        self.buckets[at.0] = i;
        self.len += 1;
        if self.len * 2 > self.buckets.len() {
            self.grow(&key_at);
        }
    }

    /// Records every position of `positions` not recorded yet (`key_at`
    /// as for `find`): an index rebuilt from the entries it indexes, or
    /// given the entries made without it.
    pub fn extend<K: Hash + Eq>(
        &mut self,
        positions: std::ops::Range<usize>,
        key_at: impl Fn(u32) -> K,
    ) {
        for i in positions.start as u32..positions.end as u32 {
            if let Err(at) = self.find(&key_at(i), &key_at) {
                self.insert(at, i, &key_at);
            }
        }
    }

    /// Records the positions from `*indexed` up to `len` (entries made
    /// without the index since it last caught up), and moves `*indexed`
    /// to `len`.
    pub fn catch_up<K: Hash + Eq>(
        &mut self,
        indexed: &mut usize,
        len: usize,
        key_at: impl Fn(u32) -> K,
    ) {
        if *indexed < len {
            self.extend(*indexed..len, key_at);
            *indexed = len;
        }
    }

    /// Twice the buckets, every position placed again.
    fn grow<K: Hash>(&mut self, key_at: &impl Fn(u32) -> K) {
        let size = self.buckets.len() * 2;
        let old = std::mem::replace(&mut self.buckets, vec![EMPTY; size]);
        let mask = self.buckets.len() - 1;
        for i in old.into_iter().filter(|&i| i != EMPTY) {
            let mut b = self.bucket(hash(&key_at(i)));
            while self.buckets[b] != EMPTY {
                b = (b + 1) & mask;
            }
            self.buckets[b] = i;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_what_it_made_through_growth() {
        let mut index = Index::default();
        let mut keys: Vec<(u32, u64)> = Vec::new();
        for round in 0..2 {
            for k in 0..10_000u64 {
                let key = ((k % 7) as u32, k * 31);
                let i = match index.find(&key, |i| keys[i as usize]) {
                    Ok(i) => i,
                    Err(at) => {
                        assert_eq!(round, 0, "made once");
                        keys.push(key);
                        let i = (keys.len() - 1) as u32;
                        index.insert(at, i, |i| keys[i as usize]);
                        i
                    }
                };
                assert_eq!(keys[i as usize], key);
            }
        }
        assert_eq!(keys.len(), 10_000);
    }
}
