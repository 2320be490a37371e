//! A thread's arena: a header of words, then records and vectors
//! allocated upwards and never freed (a vector that grows moves, leaving
//! its old words unused; contexts' counters grow the same way).
//!
//! * A **node** (calling context: parent, function, recursion level, as
//!   Callgrind's) is a record of [`NODE_HEADER`] words then one counter per
//!   block of its function; the node table maps its id to the record's
//!   offset, so it can move when it grows. A *skip node* counts the code
//!   of skipped functions (the PLT) called from one call site of a
//!   context, whose Ir Callgrind charges to that call site.
//! * An **arc** (calls from a context at a call site to a context entered
//!   at an address) is [`ARC_WORDS`] words in the arc vector.
//! * **Frames** of the shadow stack are [`FRAME_WORDS`] words each.

/// No node, arc or block.
pub const NONE: u64 = u64::MAX;

/// Header words, by index (also read and written by the engine's inline
/// fast paths, see [`crate::abi`]).
pub mod head {
    /// Words used (the next record goes there); 0 until the first entry.
    pub const USED: usize = 0;
    /// The current node ([`super::NONE`] before a thread's first block).
    pub const NODE: usize = 1;
    /// Frames on the stack, and the vector holding them (offset, capacity
    /// in frames).
    pub const DEPTH: usize = 3;
    /// The frames' vector (offset).
    pub const STACK: usize = 4;
    /// Its capacity in frames.
    pub const STACK_CAP: usize = 5;
    /// The node table (offset, length, capacity).
    pub const NODES: usize = 6;
    /// Its length.
    pub const NODES_LEN: usize = 7;
    /// Its capacity.
    pub const NODES_CAP: usize = 8;
    /// The table of nodes by key (offset, capacity).
    pub const NODE_INDEX: usize = 9;
    /// Its capacity.
    pub const NODE_INDEX_CAP: usize = 10;
    /// The arcs (offset, length in arcs, capacity in words).
    pub const ARCS: usize = 11;
    /// Their number.
    pub const ARCS_LEN: usize = 12;
    /// Their capacity in words.
    pub const ARCS_CAP: usize = 13;
    /// The table of arcs by key (offset, capacity).
    pub const ARC_INDEX: usize = 14;
    /// Its capacity.
    pub const ARC_INDEX_CAP: usize = 15;
    /// Per function, its frames on the stack (offset, capacity).
    pub const ACTIVE: usize = 16;
    /// Its capacity.
    pub const ACTIVE_CAP: usize = 17;
    /// The last stack pointer known.
    pub const LAST_SP: usize = 18;
    /// In skipped code: the context and call site it is charged to.
    pub const NONSKIPPED_NODE: usize = 19;
    /// And the call site.
    pub const NONSKIPPED_SITE: usize = 20;
    /// What each running signal handler interrupted (offset, length,
    /// capacity in records).
    pub const SIGNALS: usize = 21;
    /// Its length.
    pub const SIGNALS_LEN: usize = 22;
    /// Its capacity in records.
    pub const SIGNALS_CAP: usize = 23;
    /// The call memo (`crate::fast`: offset, capacity in words).
    pub const MEMO: usize = 24;
    /// Its capacity in words.
    pub const MEMO_CAP: usize = 25;
    /// Context entries a fast path took (`crate::fast`).
    pub const FAST_ENTRIES: usize = 26;
    /// Context entries the runtime was asked for, fast or not.
    pub const ENTRIES: usize = 27;
    /// Context entries the engine's stub took inline, without the runtime
    /// (also counted in [`FAST_ENTRIES`] and [`ENTRIES`]).
    pub const INLINE_ENTRIES: usize = 28;
    /// Memo entries replaced by another key's since the memo last grew
    /// (`crate::fast`: it doubles when they reach its entries).
    pub const MEMO_EVICTIONS: usize = 29;
    /// A thread that took an ended thread's number goes on with its
    /// arena: the context it was in plus one, until its first context
    /// entry puts it back (0: none; [`NODE`] is [`crate::NONE`] meanwhile,
    /// which sends that entry to the full decision).
    pub const CONTINUED: usize = 30;
    /// Words of header.
    pub const WORDS: usize = 32;
}

/// Words of a node record before its counters: its key (parent and
/// function, level and kind, site), its counter group, its id ([`NONE`]
/// for a sink, which no table holds), and the number of counters
/// (translated code's bounds check reads it just before the first
/// counter). The id is found from the counters alone: what the hot words
/// point at is the only thing a growth may trust (a signal handler's
/// return puts back the interrupted code's pointer, not the runtime's
/// state).
pub const NODE_HEADER: usize = 6;
/// Words of an arc.
pub const ARC_WORDS: usize = 5;
/// Words of a frame: the stack pointer after the call, the address it
/// returns to (0: an emulated call), the caller node (low half, all ones
/// for none) and the callee's function (high half), the arc ([`NONE`]
/// for skipped code), the running Ir at the call, the skipped-code node
/// and site before it, and the resume record (`crate::fast`).
pub const FRAME_WORDS: usize = 8;
/// Words of what a signal handler interrupted: the context, the stack's
/// depth, the skipped-code state, the last stack pointer, the running Ir.
pub(crate) const SIGNAL_WORDS: usize = 6;

/// What a node is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeKind {
    /// A calling context.
    Context,
    /// Skipped code called from a context's call site.
    Skip,
    /// Code of another function run in a context without a call (a jump
    /// into the middle of it, such as a `.cold` part).
    Foreign,
}

/// A node as the tool reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeRecord<'a> {
    /// The parent context ([`NONE`] for a root); for a skip or foreign
    /// node, the context its code is charged to.
    pub parent: u64,
    /// Its function.
    pub function: u32,
    /// Its recursion level (contexts).
    pub level: u32,
    /// What it is.
    pub kind: NodeKind,
    /// A skip node's call site.
    pub site: u64,
    /// Its counter group (`Facts::group`).
    pub group: u32,
    /// Ir per block of its group, by the block's number in it.
    pub counters: &'a [u64],
}

/// An arc as the tool reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArcRecord {
    /// The calling context.
    pub caller: u64,
    /// The called context.
    pub callee: u64,
    /// The calling instruction.
    pub site: u64,
    /// Where the callee was entered.
    pub target: u64,
    /// Calls made.
    pub calls: u64,
    /// Their inclusive Ir.
    pub inclusive: u64,
}

/// A thread's arena, read (the tool's view at the thread's end).
pub struct Arena<'a> {
    words: &'a [u64],
}

impl<'a> Arena<'a> {
    /// The arena in `words` (as the runtime left it; all zero if the
    /// thread never entered the runtime).
    pub fn new(words: &'a [u64]) -> Arena<'a> {
        Arena { words }
    }

    /// Words in use (what the tool needs to read of it).
    pub fn used(&self) -> usize {
        self.words.first().map_or(0, |&w| w as usize)
    }

    fn head(&self, i: usize) -> usize {
        self.words[i] as usize
    }

    /// Context entries the runtime was asked for, and how many of them a
    /// fast path took (the rest took Callgrind's full decision).
    pub fn entries(&self) -> (u64, u64) {
        if self.used() == 0 {
            (0, 0)
        } else {
            (self.words[head::ENTRIES], self.words[head::FAST_ENTRIES])
        }
    }

    /// Context entries the engine's stub took inline (a share of the fast
    /// ones).
    pub fn inline_entries(&self) -> u64 {
        if self.used() == 0 {
            0
        } else {
            self.words[head::INLINE_ENTRIES]
        }
    }

    /// Its nodes, by id.
    pub fn nodes(&self) -> impl Iterator<Item = NodeRecord<'a>> + '_ {
        let len = if self.used() == 0 {
            0
        } else {
            self.head(head::NODES_LEN)
        };
        let table = self.head(head::NODES);
        (0..len).map(move |id| node_at(self.words, self.words[table + id] as usize))
    }

    /// Its arcs, by id (inclusive costs of the calls still running are
    /// not in them: [`crate::Runtime::finish`] pops them first).
    pub fn arcs(&self) -> impl Iterator<Item = ArcRecord> + '_ {
        let len = if self.used() == 0 {
            0
        } else {
            self.head(head::ARCS_LEN)
        };
        let base = self.head(head::ARCS);
        (0..len)
            .map(move |i| {
                let w = &self.words[base + i * ARC_WORDS..][..ARC_WORDS];
                ArcRecord {
                    caller: w[0] & 0xffff_ffff,
                    callee: w[0] >> 32,
                    site: w[1],
                    target: w[2],
                    calls: w[3],
                    inclusive: w[4],
                }
            })
            .map(|mut a| {
                if a.caller == 0xffff_ffff {
                    a.caller = NONE;
                }
                a
            })
    }
}

/// The node record at word `at`.
pub(crate) fn node_at(words: &[u64], at: usize) -> NodeRecord<'_> {
    let w = &words[at..at + NODE_HEADER];
    let parent = w[0] & 0xffff_ffff;
    let n = w[NODE_HEADER - 1] as usize;
    NodeRecord {
        parent: if parent == 0xffff_ffff { NONE } else { parent },
        function: (w[0] >> 32) as u32,
        level: (w[1] & 0xffff_ffff) as u32,
        kind: match w[1] >> 32 {
            0 => NodeKind::Context,
            1 => NodeKind::Skip,
            _ => NodeKind::Foreign,
        },
        site: w[2],
        group: w[3] as u32,
        counters: &words[at + NODE_HEADER..at + NODE_HEADER + n],
    }
}
