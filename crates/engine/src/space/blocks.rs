//! The translated blocks of one address space: by guest address (what
//! linking and lookups ask for), in address order (what invalidation of a
//! range asks for), and the retired ones, whose code went away but whose
//! counts still go into the profile.

use rustc_hash::FxHashMap as HashMap;
use std::collections::BTreeSet;

/// What the tool keeps of one translated block: 56 bytes, as a python run
/// keeps 120,000 of them (the fields most blocks leave empty are in
/// [`BlockExtras`], behind one pointer).
#[derive(Debug, Clone)]
pub(super) struct Block {
    /// Host address of the translation.
    pub body: u64,
    /// Guest address past the block's last instruction.
    pub guest_end: u64,
    /// The host address just past the counter's update (0: no counter).
    pub counter_end: u64,
    /// The block's execution counter (offset in the thread areas).
    pub counter: u32,
    /// Index of the module the code came from (see `Modules::records`).
    pub module: u32,
    /// Guest addresses counted once per execution of the block (counting
    /// mode only: in trace mode the tool counts).
    pub counted: Box<[u64]>,
    /// What only some blocks have.
    extras: Option<Box<BlockExtras>>,
}

/// The parts of a [`Block`] that few blocks have.
#[derive(Debug, Clone, Default)]
struct BlockExtras {
    /// Corrections to the count of each of `counted` (empty until a
    /// fault leaves an execution of the block part-way: see
    /// `Space::fault_in_block`).
    deltas: Vec<i64>,
    /// Rep string instructions: (guest address, their own counter).
    reps: Vec<(u64, u32)>,
    /// For a block with a self-modifying-code check: the guest bytes it
    /// was translated from (what the check compares with).
    checked: Option<Box<[u8]>>,
}

impl Block {
    /// A block with no count corrections yet.
    pub fn new(
        body: u64,
        guest_end: u64,
        module: usize,
        (counter, counter_end): (u32, u64),
        counted: Vec<u64>,
        reps: Vec<(u64, u32)>,
        checked: Option<Box<[u8]>>,
    ) -> Block {
        let extras = (!reps.is_empty() || checked.is_some()).then(|| {
            Box::new(BlockExtras {
                deltas: Vec::new(),
                reps,
                checked,
            })
        });
        Block {
            body,
            guest_end,
            counter_end,
            counter,
            module: u32::try_from(module).expect("fewer than 2^32 modules"),
            counted: counted.into_boxed_slice(),
            extras,
        }
    }

    /// The module's index (see `Modules::records`).
    pub fn module(&self) -> usize {
        self.module as usize
    }

    /// Corrections to the count of each of `counted`, if any were made.
    pub fn deltas(&self) -> &[i64] {
        self.extras.as_ref().map_or(&[], |e| &e.deltas)
    }

    /// `counted`, with the corrections to each one's count to change (made
    /// all zero at first use).
    pub fn counted_and_deltas_mut(&mut self) -> (&[u64], &mut [i64]) {
        let extras = self.extras.get_or_insert_with(Default::default);
        if extras.deltas.is_empty() {
            extras.deltas = vec![0; self.counted.len()];
        }
        (&self.counted, &mut extras.deltas)
    }

    /// Rep string instructions: (guest address, their own counter).
    pub fn reps(&self) -> &[(u64, u32)] {
        self.extras.as_ref().map_or(&[], |e| &e.reps)
    }

    /// For a block with a self-modifying-code check, the guest bytes it
    /// was translated from.
    pub fn checked(&self) -> Option<&[u8]> {
        self.extras.as_ref().and_then(|e| e.checked.as_deref())
    }
}

/// The block table (see the module doc).
#[derive(Debug, Clone)]
pub(super) struct Blocks {
    /// Reachable translations, in no order, with their guest addresses.
    /// The map holds indices, not blocks: a python run translates 120,000
    /// blocks, and growing a map of whole blocks moved each of them at
    /// every doubling.
    live: Vec<(u64, Block)>,
    /// Index in `live` by guest address.
    index: HashMap<u64, u32>,
    /// The keys of `live`, in order.
    starts: BTreeSet<u64>,
    /// Blocks whose code was unmapped: unreachable, still counted.
    retired: Vec<Block>,
}

impl Default for Blocks {
    /// Room for the blocks of a mid-sized program from the start (each
    /// doubling of the index rehashes every entry).
    fn default() -> Self {
        Blocks {
            live: Vec::with_capacity(1 << 14),
            index: HashMap::with_capacity_and_hasher(1 << 16, Default::default()),
            starts: BTreeSet::new(),
            retired: Vec::new(),
        }
    }
}

impl Blocks {
    /// Whether `guest` has a reachable translation.
    pub fn contains(&self, guest: u64) -> bool {
        self.index.contains_key(&guest)
    }

    /// The reachable translation of `guest`, if it has one.
    pub fn get(&self, guest: u64) -> Option<&Block> {
        self.index.get(&guest).map(|&i| &self.live[i as usize].1)
    }

    /// The reachable translation of `guest`, to change.
    pub fn get_mut(&mut self, guest: u64) -> Option<&mut Block> {
        let i = *self.index.get(&guest)?;
        Some(&mut self.live[i as usize].1)
    }

    /// Host address of the translation of `guest`, if it has one.
    pub fn body(&self, guest: u64) -> Option<u64> {
        self.get(guest).map(|b| b.body)
    }

    /// Records the translation of `guest`.
    pub fn insert(&mut self, guest: u64, block: Block) {
        match self.index.get(&guest) {
            Some(&i) => self.live[i as usize].1 = block,
            None => {
                let i = u32::try_from(self.live.len()).expect("fewer than 2^32 blocks");
                self.index.insert(guest, i);
                self.live.push((guest, block));
                self.starts.insert(guest);
            }
        }
    }

    /// The blocks with code in `[start, end)` (blocks are at most
    /// `max_guest_bytes` long), by guest address.
    pub fn overlapping(&self, start: u64, end: u64, max_guest_bytes: u64) -> Vec<u64> {
        self.starts
            .range(start.saturating_sub(max_guest_bytes)..end)
            .copied()
            .filter(|g| self.get(*g).is_some_and(|b| b.guest_end > start))
            .collect()
    }

    /// Makes the translation of `guest` unreachable (its counts stay);
    /// returns its body.
    pub fn retire(&mut self, guest: u64) -> u64 {
        let i = self.index.remove(&guest).expect("a live block") as usize;
        self.starts.remove(&guest);
        let (_, b) = self.live.swap_remove(i);
        if let Some(&(moved, _)) = self.live.get(i) {
            self.index.insert(moved, i as u32);
        }
        let body = b.body;
        self.retired.push(b);
        body
    }

    /// The guest addresses of the reachable blocks.
    pub fn starts(&self) -> Vec<u64> {
        self.starts.iter().copied().collect()
    }

    /// The reachable blocks.
    pub fn live(&self) -> impl Iterator<Item = &Block> {
        self.live.iter().map(|(_, b)| b)
    }

    /// The retired blocks.
    pub fn retired(&self) -> &[Block] {
        &self.retired
    }

    /// The guest block whose translation contains host address `host`
    /// (diagnostics only: a linear search).
    pub fn containing_host(&self, host: u64) -> Option<u64> {
        self.live
            .iter()
            .filter(|(_, b)| b.body <= host)
            .max_by_key(|(_, b)| b.body)
            .map(|&(g, _)| g)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(body: u64) -> Block {
        Block::new(body, body + 1, 0, (0, 0), Vec::new(), Vec::new(), None)
    }

    #[test]
    fn retiring_a_block_keeps_the_others_reachable_by_address() {
        let mut blocks = Blocks::default();
        for g in 1..=4 {
            blocks.insert(g * 0x10, block(g * 0x100));
        }
        assert_eq!(blocks.retire(0x10), 0x100);
        assert_eq!(blocks.retire(0x30), 0x300);
        assert!(!blocks.contains(0x10) && !blocks.contains(0x30));
        assert_eq!(blocks.body(0x20), Some(0x200));
        assert_eq!(blocks.body(0x40), Some(0x400));
        assert_eq!(blocks.starts(), vec![0x20, 0x40]);
        assert_eq!(blocks.live().count(), 2);
        assert_eq!(blocks.retired().len(), 2);
        // A new translation of a retired address is a new live block.
        blocks.insert(0x10, block(0x500));
        assert_eq!(blocks.body(0x10), Some(0x500));
        assert_eq!(blocks.containing_host(0x450), Some(0x40));
    }
}
