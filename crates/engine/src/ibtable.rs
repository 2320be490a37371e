//! The indirect-branch table: how returns, indirect jumps and indirect
//! calls find the translation of their target without leaving the client.
//!
//! The table lives in the core region ([`layout::HTAB`]). A target's *home
//! bucket* is chosen by the low 16 bits of its guest address (what one
//! flag-free `movzx` extracts); a bucket is one cache line holding
//! [`layout::BUCKET_WAYS`] {guest key, host entry} pairs and the address of
//! the next bucket of its chain. Translated code checks way 0 of the home
//! bucket inline ([`crate::emit::Emitter::lookup`]); the chunk's probe stub
//! checks the other ways and walks the chain
//! ([`crate::emit::Emitter::probe_stub`]); only a target found nowhere exits
//! to the tool. Targets that share their low 16 bits (code 64 KiB apart)
//! therefore never evict each other: a full home bucket gets an overflow
//! bucket chained to it.
//!
//! This type is the tool's mirror of the client's table: it decides where
//! each key goes and makes the writes through a [`ClientMemory`], in an
//! order that keeps racing readers safe. Translated code reads a key, then
//! the entry beside it, and jumps there without checking again, so:
//!
//! * an entry is written before its key, and a bucket is filled before it
//!   is chained (x86 keeps loads in order, so a reader that sees the key
//!   sees the entry);
//! * a way never changes hands: a withdrawn key becomes a tombstone that
//!   no target matches, and its way is not given to another key, because a
//!   reader that matched the old key (another thread, or this one
//!   interrupted by a signal whose handler exited to the tool) may still
//!   be about to load the entry. The entry of a key may change (a new
//!   translation of the same code); the old one stays valid, since a
//!   retired translation jumps on to the new one;
//! * when every overflow bucket is in use (about a million targets), a new
//!   target is not published and keeps exiting to the tool: slow, never
//!   wrong.

use crate::client_mem::ClientMemory;
use crate::layout::{BUCKET_BYTES, BUCKET_NEXT, BUCKET_WAYS, HTAB_OVERFLOW_BUCKETS, HTAB_SETS};
use rustc_hash::FxHashMap as HashMap;

const WAYS: usize = BUCKET_WAYS as usize;

/// The key of a withdrawn target: not a canonical address, so no target
/// matches it, and not 0, so its way is never reused.
const TOMBSTONE: u64 = u64::MAX;

/// Where a key sits: bucket index and way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Slot {
    bucket: u32,
    way: u8,
}

/// The tool's mirror of one client's indirect-branch table.
#[derive(Debug, Clone)]
pub struct IbTable {
    /// Client address of bucket 0.
    base: u64,
    /// Keys by bucket (home buckets, then overflow buckets in use).
    keys: Vec<[u64; WAYS]>,
    /// Next bucket of each bucket's chain (0: none; bucket 0 is a home
    /// bucket, never chained).
    next: Vec<u32>,
    /// Where each published key is.
    slots: HashMap<u64, Slot>,
    /// Targets not published because the table was full (should stay 0).
    refused: u64,
}

impl IbTable {
    /// An empty table whose bucket 0 is at client address `base` (the
    /// client's memory there is zero).
    pub fn new(base: u64) -> IbTable {
        IbTable {
            base,
            keys: vec![[0; WAYS]; HTAB_SETS as usize],
            next: vec![0; HTAB_SETS as usize],
            slots: HashMap::default(),
            refused: 0,
        }
    }

    /// The home bucket of `guest`.
    fn home(guest: u64) -> u32 {
        (guest & (HTAB_SETS - 1)) as u32
    }

    /// Client address of bucket `b`.
    fn bucket_addr(&self, b: u32) -> u64 {
        self.base + u64::from(b) * BUCKET_BYTES
    }

    /// Client address of the key of `slot` (its entry follows it).
    fn key_addr(&self, slot: Slot) -> u64 {
        self.bucket_addr(slot.bucket) + u64::from(slot.way) * 16
    }

    /// Whether `guest` is published.
    pub fn contains(&self, guest: u64) -> bool {
        self.slots.contains_key(&guest)
    }

    /// Number of published targets.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Overflow buckets in use.
    pub fn overflow_buckets(&self) -> usize {
        self.keys.len() - HTAB_SETS as usize
    }

    /// Targets not published because the table was full.
    pub fn refused(&self) -> u64 {
        self.refused
    }

    /// A free way of bucket `bucket`, if any.
    fn free_in(&self, bucket: u32) -> Option<Slot> {
        self.keys[bucket as usize]
            .iter()
            .position(|&k| k == 0)
            .map(|way| Slot {
                bucket,
                way: way as u8,
            })
    }

    /// Publishes `guest` with host `entry` (replacing its entry if it is
    /// already there).
    pub fn insert(&mut self, guest: u64, entry: u64, mem: &mut dyn ClientMemory) {
        debug_assert_ne!(guest, 0, "0 marks a free way");
        if let Some(&slot) = self.slots.get(&guest) {
            // A new translation of the same target: readers may take the
            // old entry or the new one, both right.
            mem.write_live(self.key_addr(slot) + 8, entry, 8);
            return;
        }
        let mut bucket = Self::home(guest);
        let slot = loop {
            if let Some(slot) = self.free_in(bucket) {
                break slot;
            }
            match self.next[bucket as usize] {
                0 => match self.chain_bucket(bucket, mem) {
                    Some(slot) => break slot,
                    None => {
                        self.refused += 1;
                        return;
                    }
                },
                n => bucket = n,
            }
        };
        // A free way: entry first, then the key.
        let at = self.key_addr(slot);
        self.keys[slot.bucket as usize][slot.way as usize] = guest;
        mem.write_live(at + 8, entry, 8);
        mem.write_live(at, guest, 8);
        self.slots.insert(guest, slot);
    }

    /// Way 0 of a new overflow bucket chained after `last`, the full end of
    /// a chain; `None` when every overflow bucket is in use.
    fn chain_bucket(&mut self, last: u32, mem: &mut dyn ClientMemory) -> Option<Slot> {
        if self.overflow_buckets() as u64 >= HTAB_OVERFLOW_BUCKETS {
            return None;
        }
        let b = self.keys.len() as u32;
        self.keys.push([0; WAYS]);
        self.next.push(0);
        self.next[last as usize] = b;
        // The new bucket is zero in the client; chaining it is one store,
        // and readers walking it before its first key lands find nothing.
        let link = self.bucket_addr(last) + BUCKET_NEXT;
        let addr = self.bucket_addr(b);
        mem.write_live(link, addr, 8);
        Some(Slot { bucket: b, way: 0 })
    }

    /// Withdraws `guest` (its code went away): its way becomes a tombstone.
    /// Returns whether it was there.
    pub fn remove(&mut self, guest: u64, mem: &mut dyn ClientMemory) -> bool {
        let Some(slot) = self.slots.remove(&guest) else {
            return false;
        };
        self.keys[slot.bucket as usize][slot.way as usize] = TOMBSTONE;
        mem.write_live(self.key_addr(slot), TOMBSTONE, 8);
        true
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::client_mem::FakeMemory;

    const BASE: u64 = 0x7010_0000;

    /// What translated code does (emit::lookup, then emit::probe_stub),
    /// over the fake memory: the entry found for `target` in the table at
    /// `base`, if any.
    pub(crate) fn lookup_in(mem: &FakeMemory, base: u64, target: u64) -> Option<u64> {
        let mut bucket = base + (target & 0xffff) * BUCKET_BYTES;
        loop {
            for way in 0..BUCKET_WAYS {
                if mem.u64_at(bucket + way * 16) == target {
                    return Some(mem.u64_at(bucket + way * 16 + 8));
                }
            }
            match mem.u64_at(bucket + BUCKET_NEXT) {
                0 => return None,
                n => bucket = n,
            }
        }
    }

    fn client_lookup(mem: &FakeMemory, target: u64) -> Option<u64> {
        lookup_in(mem, BASE, target)
    }

    #[test]
    fn aliasing_targets_all_stay_reachable() {
        // The targets that thrashed the old direct-mapped table: equal low
        // 16 bits, 64 KiB apart.
        let mut t = IbTable::new(BASE);
        let mut mem = FakeMemory::default();
        let targets: Vec<u64> = (0..50).map(|i| 0xdc7958 + i * 0x1_0000).collect();
        for (n, &g) in targets.iter().enumerate() {
            t.insert(g, 0x9000_0000 + n as u64, &mut mem);
        }
        for (n, &g) in targets.iter().enumerate() {
            assert_eq!(client_lookup(&mem, g), Some(0x9000_0000 + n as u64));
        }
        // 50 keys, 3 per bucket: the home bucket and 16 overflow buckets.
        assert_eq!(t.overflow_buckets(), 16);
        assert_eq!(t.len(), 50);
        assert_eq!(t.refused(), 0);
        assert_eq!(client_lookup(&mem, 0xdc7958 + 50 * 0x1_0000), None);
    }

    #[test]
    fn the_first_keys_of_a_bucket_go_home() {
        let mut t = IbTable::new(BASE);
        let mut mem = FakeMemory::default();
        t.insert(0x401000, 0xaaaa, &mut mem);
        t.insert(0x411000, 0xbbbb, &mut mem);
        t.insert(0x421000, 0xcccc, &mut mem);
        assert_eq!(t.overflow_buckets(), 0);
        let home = BASE + 0x1000 * BUCKET_BYTES;
        assert_eq!(mem.u64_at(home), 0x401000);
        assert_eq!(mem.u64_at(home + 8), 0xaaaa);
        assert_eq!(mem.u64_at(home + 32), 0x421000);
        t.insert(0x431000, 0xdddd, &mut mem);
        assert_eq!(t.overflow_buckets(), 1);
    }

    #[test]
    fn a_removed_target_leaves_a_tombstone_never_reused() {
        let mut t = IbTable::new(BASE);
        let mut mem = FakeMemory::default();
        let g = |i: u64| 0x5000 + i * 0x1_0000;
        for i in 0..7 {
            t.insert(g(i), 0x100 + i, &mut mem);
        }
        assert!(t.remove(g(1), &mut mem));
        assert!(!t.remove(g(1), &mut mem));
        assert_eq!(client_lookup(&mem, g(1)), None);
        let way1 = BASE + 0x5000 * BUCKET_BYTES + 16;
        assert_eq!(mem.u64_at(way1), TOMBSTONE);
        // Keys past the tombstone (in overflow buckets) are still found.
        for i in [0, 2, 3, 4, 5, 6] {
            assert_eq!(client_lookup(&mem, g(i)), Some(0x100 + i));
        }
        // A new key does not take the withdrawn way: a thread that matched
        // the old key may still load its entry.
        t.insert(g(9), 0x999, &mut mem);
        assert_eq!(mem.u64_at(way1), TOMBSTONE);
        assert_eq!(mem.u64_at(way1 + 8), 0x101);
        assert_eq!(client_lookup(&mem, g(9)), Some(0x999));
        // The same target translated again is published anew.
        t.insert(g(1), 0x111, &mut mem);
        assert_eq!(client_lookup(&mem, g(1)), Some(0x111));
    }

    #[test]
    fn republishing_replaces_the_entry_in_place() {
        let mut t = IbTable::new(BASE);
        let mut mem = FakeMemory::default();
        t.insert(0x401234, 0x1111, &mut mem);
        t.insert(0x401234, 0x2222, &mut mem);
        assert_eq!(t.len(), 1);
        assert_eq!(client_lookup(&mem, 0x401234), Some(0x2222));
    }

    #[test]
    fn a_full_table_refuses_new_targets_instead_of_reusing_ways() {
        let mut t = IbTable::new(BASE);
        let mut mem = FakeMemory::default();
        // Fill the overflow area directly (as if many chains had grown).
        t.keys
            .resize((HTAB_SETS + HTAB_OVERFLOW_BUCKETS) as usize, [1; WAYS]);
        t.next
            .resize((HTAB_SETS + HTAB_OVERFLOW_BUCKETS) as usize, 0);
        for i in 0..4 {
            t.insert(0x7777 + i * 0x1_0000, 0x10 + i, &mut mem);
        }
        assert_eq!(t.refused(), 1);
        assert!(!t.contains(0x7777 + 3 * 0x1_0000));
        assert_eq!(client_lookup(&mem, 0x7777 + 3 * 0x1_0000), None);
        assert_eq!(client_lookup(&mem, 0x7777), Some(0x10));
    }

    #[test]
    fn keys_and_entries_are_written_live_in_a_safe_order() {
        let mut t = IbTable::new(BASE);
        let mut mem = FakeMemory::default();
        for i in 0..4 {
            t.insert(0x3000 + i * 0x1_0000, 0x50 + i, &mut mem);
        }
        let home = BASE + 0x3000 * BUCKET_BYTES;
        let over = BASE + HTAB_SETS * BUCKET_BYTES;
        // The fourth key: chain link, then entry, then key.
        assert_eq!(
            mem.live_writes()[6..],
            [
                (home + BUCKET_NEXT, over, 8),
                (over + 8, 0x53, 8),
                (over, 0x3000 + 3 * 0x1_0000, 8)
            ]
        );
    }
}
