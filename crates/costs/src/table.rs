//! Costs per instruction address.

use rustc_hash::FxHashMap;

use crate::set::{Event, EventSet};

/// The costs of one event set, per instruction address.
///
/// Each address gets a *slot*: a dense row of one count per event, in the
/// set's column order, stored row after row in one vector. A tool looks a
/// slot up once per instruction (or once per block, keeping the slots of
/// its instructions) and then adds to the row, so one instruction's events
/// share a cache line and nothing is hashed per data access.
#[derive(Debug, Clone)]
pub struct CostTable {
    events: EventSet,
    width: usize,
    slots: FxHashMap<u64, u32>,
    /// Recently looked-up addresses and their slots, direct-mapped: a
    /// replayed trace looks up every instruction it fetches, and a hash
    /// map probe for each made replay 6% slower; this costs one load and
    /// one compare when the address is hot.
    recent: Box<[(u64, u32); RECENT]>,
    addrs: Vec<u64>,
    costs: Vec<u64>,
}

/// Entries of [`CostTable::recent`]: 16 KiB, well within the L1 cache.
const RECENT: usize = 1024;

/// The [`CostTable::recent`] entry of `addr`. Folding in higher bits keeps
/// functions a multiple of the table size apart from sharing entries.
#[inline(always)]
fn recent_index(addr: u64) -> usize {
    ((addr ^ (addr >> 10)) as usize) % RECENT
}

impl CostTable {
    /// An empty table for `events`.
    pub fn new(events: EventSet) -> CostTable {
        CostTable {
            events,
            width: events.len(),
            slots: FxHashMap::default(),
            // An empty entry holds an address that never maps to it (`i ^ 1`
            // maps to entry `i ^ 1`), so a lookup needs one comparison.
            recent: Box::new(std::array::from_fn(|i| ((i ^ 1) as u64, 0))),
            addrs: Vec::new(),
            costs: Vec::new(),
        }
    }

    /// The events of every row.
    pub fn events(&self) -> EventSet {
        self.events
    }

    /// The slot of `addr`, created with all-zero costs if new. Slots are
    /// dense indices from 0 in creation order.
    #[inline]
    pub fn slot(&mut self, addr: u64) -> usize {
        let (recent, slot) = self.recent[recent_index(addr)];
        if recent == addr {
            return slot as usize;
        }
        let slot = self.lookup(addr);
        self.recent[recent_index(addr)] = (addr, slot as u32);
        slot
    }

    /// The slot of `addr` from the hash map, created if new. Kept out of
    /// line: [`slot`](Self::slot) inlines into tools' per-record paths.
    #[cold]
    #[inline(never)]
    fn lookup(&mut self, addr: u64) -> usize {
        let next = self.addrs.len();
        let slot = *self
            .slots
            .entry(addr)
            .or_insert_with(|| u32::try_from(next).expect("more than 2^32 instruction addresses"));
        let slot = slot as usize;
        if slot == next {
            self.addrs.push(addr);
            self.costs.resize(self.costs.len() + self.width, 0);
        }
        slot
    }

    /// The address of `slot`.
    #[inline]
    pub fn addr(&self, slot: usize) -> u64 {
        self.addrs[slot]
    }

    /// The costs of `slot`, in the set's column order.
    #[inline]
    pub fn row(&self, slot: usize) -> &[u64] {
        &self.costs[slot * self.width..][..self.width]
    }

    /// Adds `n` to column `col` of `slot`.
    #[inline]
    pub fn add(&mut self, slot: usize, col: usize, n: u64) {
        debug_assert!(col < self.width);
        self.costs[slot * self.width + col] += n;
    }

    /// The costs of `slot`, to add to.
    #[inline]
    pub fn row_mut(&mut self, slot: usize) -> &mut [u64] {
        &mut self.costs[slot * self.width..][..self.width]
    }

    /// Adds `counts`, as `(address, count)` pairs, to `event`'s column.
    /// A zero count still creates the address's row, as Cachegrind keeps a
    /// line for an instruction translated but never run.
    ///
    /// # Panics
    ///
    /// If the set does not collect `event`.
    pub fn add_counts(&mut self, event: Event, counts: impl IntoIterator<Item = (u64, u64)>) {
        let col = self
            .events
            .index(event)
            .unwrap_or_else(|| panic!("{} is not collected", event.name()));
        let counts = counts.into_iter();
        let more = counts.size_hint().0;
        self.slots.reserve(more);
        self.addrs.reserve(more);
        self.costs.reserve(more * self.width);
        for (addr, n) in counts {
            let slot = self.slot(addr);
            self.add(slot, col, n);
        }
    }

    /// How many addresses have a row.
    pub fn len(&self) -> usize {
        self.addrs.len()
    }

    /// Whether no address has a row.
    pub fn is_empty(&self) -> bool {
        self.addrs.is_empty()
    }

    /// Column sums over every row.
    pub fn totals(&self) -> Vec<u64> {
        let mut sum = vec![0; self.width];
        for row in self.costs.chunks_exact(self.width) {
            for (s, v) in sum.iter_mut().zip(row) {
                *s += v;
            }
        }
        sum
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_per_address() {
        let mut t = CostTable::new(EventSet::new(false, true));
        assert!(t.is_empty());
        let a = t.slot(0x1000);
        let b = t.slot(0x2000);
        assert_eq!((a, b), (0, 1));
        assert_eq!(t.slot(0x1000), a);
        t.row_mut(a)[0] += 3;
        t.row_mut(b)[2] += 1;
        t.row_mut(a)[2] += 1;
        assert_eq!(t.row(a), [3, 0, 1, 0, 0]);
        assert_eq!(t.addr(b), 0x2000);
        assert_eq!(t.len(), 2);
        assert_eq!(t.totals(), [3, 0, 2, 0, 0]);
    }

    /// Empty entries of the lookup cache never match, whatever the
    /// address (0 and 1 included).
    #[test]
    fn lookup_cache() {
        let mut t = CostTable::new(EventSet::new(false, false));
        for addr in [0, 1, 2, 0x400, 0x401, 0, 1, 1 << 40, (1 << 40) + 0x400] {
            let slot = t.slot(addr);
            assert_eq!(t.addr(slot), addr);
        }
        assert_eq!(t.len(), 7);
        assert_eq!(t.slot(0x401), 4);
    }

    #[test]
    fn counts_from_a_map() {
        let mut t = CostTable::new(EventSet::new(false, false));
        t.add_counts(Event::Ir, [(0x10, 5), (0x14, 0), (0x10, 2)]);
        assert_eq!(t.len(), 2);
        assert_eq!(t.row(t.clone().slot(0x10)), [7]);
        assert_eq!(t.totals(), [7]);
    }

    #[test]
    #[should_panic(expected = "Dr is not collected")]
    fn uncollected_event() {
        CostTable::new(EventSet::new(false, false)).add_counts(Event::Dr, [(1, 1)]);
    }
}
