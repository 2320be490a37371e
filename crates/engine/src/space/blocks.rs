//! The translated blocks of one address space: by guest address (what
//! linking and lookups ask for), in address order (what invalidation of a
//! range asks for), and the retired ones, whose code went away but whose
//! counts still go into the profile.

use rustc_hash::FxHashMap as HashMap;
use std::collections::BTreeSet;

/// What the tool keeps of one translated block.
#[derive(Debug, Clone)]
pub(super) struct Block {
    /// Host address of the translation.
    pub body: u64,
    /// Guest address past the block's last instruction.
    pub guest_end: u64,
    /// Index of the module the code came from (see `Modules::records`).
    pub module: usize,
    /// The block's execution counter (offset in the thread areas).
    pub counter: u32,
    /// Guest addresses counted once per execution of the block.
    pub counted: Vec<u64>,
    /// Rep string instructions: (guest address, their own counter).
    pub reps: Vec<(u64, u32)>,
    /// For a block with a self-modifying-code check: the guest bytes it
    /// was translated from (what the check compares with).
    pub checked: Option<Box<[u8]>>,
}

/// The block table (see the module doc).
#[derive(Debug, Clone)]
pub(super) struct Blocks {
    /// Reachable translations by guest address.
    live: HashMap<u64, Block>,
    /// The keys of `live`, in order.
    starts: BTreeSet<u64>,
    /// Blocks whose code was unmapped: unreachable, still counted.
    retired: Vec<Block>,
}

impl Default for Blocks {
    /// Room for the blocks of a small program from the start: a program
    /// translates tens of thousands, and each doubling of the table moves
    /// every block.
    fn default() -> Self {
        Blocks {
            live: HashMap::with_capacity_and_hasher(1 << 14, Default::default()),
            starts: BTreeSet::new(),
            retired: Vec::new(),
        }
    }
}

impl Blocks {
    /// Whether `guest` has a reachable translation.
    pub fn contains(&self, guest: u64) -> bool {
        self.live.contains_key(&guest)
    }

    /// The reachable translation of `guest`, if it has one.
    pub fn get(&self, guest: u64) -> Option<&Block> {
        self.live.get(&guest)
    }

    /// Host address of the translation of `guest`, if it has one.
    pub fn body(&self, guest: u64) -> Option<u64> {
        self.get(guest).map(|b| b.body)
    }

    /// Records the translation of `guest`.
    pub fn insert(&mut self, guest: u64, block: Block) {
        self.live.insert(guest, block);
        self.starts.insert(guest);
    }

    /// The blocks with code in `[start, end)` (blocks are at most
    /// `max_guest_bytes` long), by guest address.
    pub fn overlapping(&self, start: u64, end: u64, max_guest_bytes: u64) -> Vec<u64> {
        self.starts
            .range(start.saturating_sub(max_guest_bytes)..end)
            .copied()
            .filter(|g| self.live[g].guest_end > start)
            .collect()
    }

    /// Makes the translation of `guest` unreachable (its counts stay);
    /// returns its body.
    pub fn retire(&mut self, guest: u64) -> u64 {
        let b = self.live.remove(&guest).expect("a live block");
        self.starts.remove(&guest);
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
        self.live.values()
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
            .map(|(&g, _)| g)
    }
}
