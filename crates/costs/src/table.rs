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
///
/// A table may start *narrow* ([`CostTable::storing`]): its rows hold only
/// some columns, and the few instructions charged in others (through
/// [`row_mut`](CostTable::row_mut), or [`add`](CostTable::add) to another
/// column) get a full row on the side, until [`widen`](CostTable::widen)
/// makes every row full. A live run charges nothing but misses per block
/// execution (the rest follows from the blocks' run counts at the end),
/// so its rows need only those columns while the caches' state is held
/// too; and a narrow table gives an address a row only when it is first
/// charged, as most instructions never miss (a python run: 9 MB of rows
/// for 190,000 instructions, most of them zero).
#[derive(Debug, Clone)]
pub struct CostTable {
    events: EventSet,
    /// Columns of a full row.
    width: usize,
    /// While narrow: the columns stored.
    narrow: Option<Narrow>,
    /// The slot of each address.
    slots: SlotIndex,
    /// Recently looked-up addresses and their slots, direct-mapped: a
    /// replayed trace looks up every instruction it fetches, and a hash
    /// map probe for each made replay 6% slower; this costs one load and
    /// one compare when the address is hot.
    recent: Box<[(u64, u32); RECENT]>,
    addrs: Vec<u64>,
    costs: Vec<u64>,
}

/// The columns a narrow table stores, and its full rows on the side.
#[derive(Debug, Clone)]
struct Narrow {
    /// Columns per stored row.
    width: usize,
    /// Per column of a full row: its place in a stored row, or
    /// [`NOT_STORED`].
    place: [u8; 13],
    /// The slots with a full row on the side, and where it starts in
    /// `side_costs`.
    side: FxHashMap<u32, usize>,
    /// Full rows, added to the stored ones when the table widens.
    side_costs: Vec<u64>,
    /// Per slot: its row in the table's costs, or [`NO_ROW`] while it has
    /// none (nothing charged in a stored column yet).
    row_of: Vec<u32>,
    /// The slot whose side row was used last, and that row: a record's
    /// fetch and data references go to one instruction.
    last_side: (usize, usize),
}

/// [`Narrow::place`] of a column not stored.
const NOT_STORED: u8 = u8::MAX;

/// [`Narrow::row_of`] of a slot without a stored row.
const NO_ROW: u32 = u32::MAX;

/// The slot of each address of a table: open addressing over slot numbers,
/// the addresses being the table's own (`addrs`). Four bytes a bucket,
/// where a map of (address, slot) pairs took sixteen: 6 MB less on a
/// python run's 233,000 instructions. Lookups are rare (the tools keep
/// their blocks' slots, and the table a cache of recent addresses), so the
/// extra load of the address costs nothing that shows.
#[derive(Debug, Clone, Default)]
struct SlotIndex {
    /// A power of two of buckets, each a slot or [`NO_SLOT`], at most half
    /// full.
    buckets: Vec<u32>,
    /// Slots held.
    len: usize,
}

/// An empty bucket of a [`SlotIndex`].
const NO_SLOT: u32 = u32::MAX;

impl SlotIndex {
    /// The slot of `addr` among `addrs` (the addresses of the slots so
    /// far), or, if it has none, the next one (`addrs.len()`), which the
    /// caller then gives `addr`.
    ///
    /// # Panics
    ///
    /// With 2^32 - 1 slots already.
    fn slot(&mut self, addrs: &[u64], addr: u64) -> u32 {
        if 2 * (self.len + 1) > self.buckets.len() {
            self.reserve(addrs, 1);
        }
        let mask = self.buckets.len() - 1;
        let mut i = Self::home(addr, mask);
        loop {
            match self.buckets[i] {
                NO_SLOT => break,
                s if addrs[s as usize] == addr => return s,
                _ => i = (i + 1) & mask,
            }
        }
        let next = u32::try_from(addrs.len())
            .ok()
            .filter(|&n| n != NO_SLOT)
            .expect("fewer than 2^32 - 1 instruction addresses");
        self.buckets[i] = next;
        self.len += 1;
        next
    }

    /// The first bucket to look in for `addr` (a Fibonacci hash: the
    /// multiplication's high bits mix every bit of the address).
    #[inline]
    fn home(addr: u64, mask: usize) -> usize {
        (addr.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 32) as usize & mask
    }

    /// Room for `more` slots beyond those of `addrs` without growing.
    fn reserve(&mut self, addrs: &[u64], more: usize) {
        let want = (2 * (self.len + more)).next_power_of_two().max(64);
        if want <= self.buckets.len() {
            return;
        }
        self.buckets = vec![NO_SLOT; want];
        let mask = want - 1;
        for (slot, &addr) in addrs.iter().enumerate() {
            let mut i = Self::home(addr, mask);
            while self.buckets[i] != NO_SLOT {
                i = (i + 1) & mask;
            }
            self.buckets[i] = slot as u32;
        }
    }
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
            narrow: None,
            slots: SlotIndex::default(),
            // An empty entry holds an address that never maps to it (`i ^ 1`
            // maps to entry `i ^ 1`), so a lookup needs one comparison.
            recent: Box::new(std::array::from_fn(|i| ((i ^ 1) as u64, 0))),
            addrs: Vec::new(),
            costs: Vec::new(),
        }
    }

    /// An empty narrow table for `events`, storing only the columns
    /// `stored` (in the set's column order) until another is written.
    pub fn storing(events: EventSet, stored: &[usize]) -> CostTable {
        let mut place = [NOT_STORED; 13];
        for (n, &col) in stored.iter().enumerate() {
            assert!(col < events.len(), "column {col} of {events:?}");
            place[col] = n as u8;
        }
        CostTable {
            narrow: Some(Narrow {
                width: stored.len(),
                place,
                side: FxHashMap::default(),
                side_costs: Vec::new(),
                row_of: Vec::new(),
                last_side: (usize::MAX, 0),
            }),
            ..CostTable::new(events)
        }
    }

    /// Whether rows hold every column (not narrow).
    pub fn is_wide(&self) -> bool {
        self.narrow.is_none()
    }

    /// Makes the rows full rows, the columns not stored zero, and adds the
    /// rows on the side to them.
    pub fn widen(&mut self) {
        let Some(narrow) = self.narrow.take() else {
            return;
        };
        let stored = std::mem::take(&mut self.costs);
        self.costs = vec![0; self.addrs.len() * self.width];
        for (slot, &row) in narrow.row_of.iter().enumerate() {
            if row == NO_ROW {
                continue;
            }
            let row = &stored[row as usize * narrow.width..][..narrow.width];
            let wide = &mut self.costs[slot * self.width..][..self.width];
            for (c, &place) in wide.iter_mut().zip(&narrow.place) {
                if place != NOT_STORED {
                    *c = row[place as usize];
                }
            }
        }
        drop(stored);
        for (&slot, &at) in &narrow.side {
            let side = &narrow.side_costs[at..][..self.width];
            let wide = &mut self.costs[slot as usize * self.width..][..self.width];
            for (c, v) in wide.iter_mut().zip(side) {
                *c += v;
            }
        }
    }

    /// The slot's row in the stored rows of a narrow table, made if new.
    #[inline]
    fn stored_row(narrow: &mut Narrow, costs: &mut Vec<u64>, slot: usize) -> usize {
        let row = narrow.row_of[slot];
        if row != NO_ROW {
            return row as usize;
        }
        Self::new_stored_row(narrow, costs, slot)
    }

    /// A new all-zero stored row for `slot`.
    #[cold]
    #[inline(never)]
    fn new_stored_row(narrow: &mut Narrow, costs: &mut Vec<u64>, slot: usize) -> usize {
        let row = costs.len() / narrow.width;
        costs.resize(costs.len() + narrow.width, 0);
        narrow.row_of[slot] = u32::try_from(row).expect("fewer than 2^32 rows");
        row
    }

    /// The full row on the side of `slot` in a narrow table, made if new.
    #[cold]
    #[inline(never)]
    fn side_row(&mut self, slot: usize) -> &mut [u64] {
        let width = self.width;
        let narrow = self.narrow.as_mut().expect("narrow");
        if narrow.last_side.0 != slot {
            let next = narrow.side_costs.len();
            let at = *narrow.side.entry(slot as u32).or_insert(next);
            if at == next {
                narrow.side_costs.resize(next + width, 0);
            }
            narrow.last_side = (slot, at);
        }
        &mut narrow.side_costs[narrow.last_side.1..][..width]
    }

    /// Columns per stored row.
    #[inline(always)]
    fn stored_width(&self) -> usize {
        self.narrow.as_ref().map_or(self.width, |n| n.width)
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

    /// The slot of `addr` from the index, created if new. Kept out of
    /// line: [`slot`](Self::slot) inlines into tools' per-record paths.
    #[cold]
    #[inline(never)]
    fn lookup(&mut self, addr: u64) -> usize {
        let next = self.addrs.len();
        let slot = self.slots.slot(&self.addrs, addr) as usize;
        if slot == next {
            self.addrs.push(addr);
            match &mut self.narrow {
                Some(narrow) => narrow.row_of.push(NO_ROW),
                None => self.costs.resize(self.costs.len() + self.width, 0),
            }
        }
        slot
    }

    /// The address of `slot`.
    #[inline]
    pub fn addr(&self, slot: usize) -> u64 {
        self.addrs[slot]
    }

    /// The costs of `slot`, in the set's column order.
    ///
    /// # Panics
    ///
    /// If the table is narrow (see [`widen`](Self::widen)).
    #[inline]
    pub fn row(&self, slot: usize) -> &[u64] {
        assert!(self.is_wide(), "a narrow table's rows are partial");
        &self.costs[slot * self.width..][..self.width]
    }

    /// Adds `n` to column `col` of `slot` (in a narrow table, a column
    /// not stored goes to the slot's row on the side).
    #[inline]
    pub fn add(&mut self, slot: usize, col: usize, n: u64) {
        debug_assert!(col < self.width);
        let Some(narrow) = &mut self.narrow else {
            self.costs[slot * self.width + col] += n;
            return;
        };
        match narrow.place[col] {
            NOT_STORED => self.side_row(slot)[col] += n,
            at => {
                let row = Self::stored_row(narrow, &mut self.costs, slot);
                self.costs[row * narrow.width + at as usize] += n;
            }
        }
    }

    /// The costs of `slot`, to add to (in a narrow table, its row on the
    /// side).
    #[inline]
    pub fn row_mut(&mut self, slot: usize) -> &mut [u64] {
        if self.narrow.is_some() {
            return self.side_row(slot);
        }
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
        self.slots.reserve(&self.addrs, more);
        self.addrs.reserve(more);
        if self.is_wide() {
            self.costs.reserve(more * self.width);
        }
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
        let mut stored = vec![0; self.stored_width()];
        if !stored.is_empty() {
            for row in self.costs.chunks_exact(stored.len()) {
                for (s, v) in stored.iter_mut().zip(row) {
                    *s += v;
                }
            }
        }
        let Some(narrow) = &self.narrow else {
            return stored;
        };
        let mut sum: Vec<u64> = narrow.place[..self.width]
            .iter()
            .map(|&p| stored.get(usize::from(p)).copied().unwrap_or(0))
            .collect();
        for row in narrow.side_costs.chunks_exact(self.width) {
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

    /// A narrow table keeps its columns' counts through widening, and the
    /// rows on the side are added then. Only addresses charged in a stored
    /// column have a stored row.
    #[test]
    fn narrow_rows_widen() {
        let set = EventSet::new(true, false);
        let mut t = CostTable::storing(set, &[1, 2, 5]);
        let never = t.slot(0x08);
        let (a, b) = (t.slot(0x10), t.slot(0x20));
        assert!(t.costs.is_empty());
        t.add(b, 5, 4);
        t.add(a, 1, 1);
        t.add(a, 2, 2);
        t.add(b, 1, 3);
        assert!(!t.is_wide());
        assert_eq!(t.totals(), [0, 4, 2, 0, 0, 4, 0, 0, 0]);
        let c = t.slot(0x30);
        t.add(c, 2, 7);
        assert_eq!(t.costs.len(), 3 * 3, "rows of a, b and c alone");
        let mut wide = t.clone();
        wide.widen();
        assert_eq!(wide.row(a), [0, 1, 2, 0, 0, 0, 0, 0, 0]);
        assert_eq!(wide.row(b), [0, 3, 0, 0, 0, 4, 0, 0, 0]);
        assert_eq!(wide.row(c), [0, 0, 7, 0, 0, 0, 0, 0, 0]);
        assert_eq!(wide.row(never), [0; 9]);
        assert_eq!(wide.totals(), t.totals());
        // Other columns, and whole rows: on the side until widened.
        t.add(b, 0, 9);
        t.row_mut(c)[1] += 1;
        t.row_mut(b)[2] += 1;
        t.add(b, 1, 1);
        assert!(!t.is_wide());
        assert_eq!(t.totals(), [9, 6, 10, 0, 0, 4, 0, 0, 0]);
        t.widen();
        assert_eq!(t.row(a), [0, 1, 2, 0, 0, 0, 0, 0, 0]);
        assert_eq!(t.row(b), [9, 4, 1, 0, 0, 4, 0, 0, 0]);
        assert_eq!(t.row(c), [0, 1, 7, 0, 0, 0, 0, 0, 0]);
        let mut none = CostTable::storing(EventSet::new(false, true), &[]);
        let s = none.slot(1);
        assert_eq!(none.totals(), [0; 5]);
        none.row_mut(s)[3] += 1;
        assert_eq!(none.totals(), [0, 0, 0, 1, 0]);
        none.widen();
        assert_eq!(none.row(s), [0, 0, 0, 1, 0]);
    }

    /// Many addresses, close together and strided as code and as
    /// multiples of the index's size: each keeps its one slot through the
    /// index's growth.
    #[test]
    fn slot_index_through_growth() {
        let mut t = CostTable::new(EventSet::new(false, false));
        let addrs: Vec<u64> = (0..5000u64)
            .map(|i| 0x40_1000 + 3 * i)
            .chain((0..5000).map(|i| 0x7f00_0000_0000 + (i << 16)))
            .chain([0, u64::MAX, u64::from(u32::MAX)])
            .collect();
        for (n, &a) in addrs.iter().enumerate() {
            assert_eq!(t.lookup(a), n);
        }
        for (n, &a) in addrs.iter().enumerate().rev() {
            assert_eq!(t.lookup(a), n);
            assert_eq!(t.addr(n), a);
        }
        assert_eq!(t.len(), addrs.len());
        assert!(t.slots.buckets.len() <= 4 * addrs.len());
    }
}
