//! The calling-context tree: one node per distinct stack of functions (and
//! recursion level) per thread, the costs charged onto it, and the call
//! arcs between nodes with their counts and inclusive costs.

use crate::index::Index;
use crate::memo::Memo;
use rustc_hash::FxHashMap;

/// A node of the tree, by index.
pub type NodeId = u32;
pub use callrules::FnId;

/// No node (a thread before its first block, or a handler before its).
pub const NO_NODE: NodeId = u32::MAX;

/// One calling context: a function, at a recursion level, called from its
/// parent's context (none for a root).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Node {
    /// The caller's context, or [`NO_NODE`].
    pub parent: NodeId,
    /// The function.
    pub function: FnId,
    /// Its recursion level (1 for the outermost activation), capped at
    /// `--separate-recs`.
    pub level: u32,
    /// The thread (1, 2, ... as Valgrind numbers them).
    pub thread: u32,
}

/// Calls along one arc: from a caller's context at a call site to a
/// callee's context entered at `target`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Arc {
    /// The caller's context.
    pub caller: NodeId,
    /// The instruction that called (or jumped).
    pub call_site: u64,
    /// The callee's context.
    pub callee: NodeId,
    /// The first instruction run in the callee.
    pub target: u64,
    /// How many calls.
    pub calls: u64,
    /// Their inclusive Ir.
    pub inclusive: u64,
}

/// The tree and everything charged onto it.
#[derive(Debug, Clone, Default)]
pub struct Tree {
    /// The nodes, parents before children.
    pub nodes: Vec<Node>,
    /// Nodes by (parent, function, level, thread), for the nodes below
    /// `nodes_indexed`.
    children: Index,
    /// The nodes `children` covers (see `run_indexed`).
    nodes_indexed: usize,
    /// The arcs.
    pub arcs: Vec<Arc>,
    /// Arcs by (caller, call site, callee, target), for the arcs below
    /// `arcs_indexed`.
    arc_index: Index,
    /// The arcs `arc_index` covers (see `run_indexed`).
    arcs_indexed: usize,
    /// Executions of each (node, block) pair, by slot.
    pub runs: Vec<u64>,
    /// The (node, block id) of each slot.
    pub run_keys: Vec<(NodeId, u32)>,
    /// For each slot, the slot its thread charged next the last time
    /// (`hot::NO_SLOT`: none yet), a cache in front of `run_index`.
    pub next: Vec<u32>,
    /// Slots by (node, block), for the slots below `run_indexed`.
    run_index: Index,
    /// The slots `run_index` and `next` cover: slots made by
    /// [`push_slot`](Tree::push_slot) (the fold of contexts mode, which
    /// finds its slots without the index), and all of them after
    /// [`release_lookups`](Tree::release_lookups), are added at the next
    /// lookup. Nodes and arcs likewise.
    run_indexed: usize,
    /// Ir charged to single instructions of a context: code of skipped
    /// functions (on their caller's call site, as Callgrind does) and the
    /// final check of rep string instructions.
    pub extra: Extra,
    /// Recent calls: (caller, function, level, thread, arc's caller, call
    /// site, target) to (callee's context, arc).
    calls: Memo<CallKey, (NodeId, u32)>,
    /// With a simulation: the columns of a cost row (the simulation's
    /// events, Cachegrind's order); 0 without.
    pub width: usize,
    /// With a simulation: for each run slot, its first row in `rows`
    /// (one row per instruction of the block).
    pub run_rows: Vec<u32>,
    /// With a simulation: for each `extra` entry, its row in `rows`.
    pub extra_rows: FxHashMap<(NodeId, u64), u32>,
    /// With a simulation: what cannot be derived from the run counts (the
    /// misses and branches), row after row; `extra` rows hold every event.
    pub rows: Vec<u64>,
    /// With a simulation: each arc's inclusive costs of every event.
    pub arc_costs: Vec<u64>,
    /// `--collect-jumps=yes`: jumps from one run slot to another (a
    /// block left in a context and the one entered, Callgrind's jCC
    /// between two BBCCs).
    pub jumps: JumpCells,
}

/// What identifies a call for [`Tree::call`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct CallKey {
    caller: NodeId,
    function: FnId,
    level: u32,
    thread: u32,
    from: NodeId,
    call_site: u64,
    target: u64,
}

impl std::hash::Hash for CallKey {
    /// The fields that tell calls apart in practice, as one word: a hash
    /// of all seven was a chain of seven multiplications per call.
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        let contexts = u64::from(self.caller) << 32 | u64::from(self.from);
        (self.call_site ^ self.target.rotate_left(29) ^ contexts.rotate_left(13)).hash(state);
    }
}

/// Ir per (context, instruction address), with a cache of recent ones in
/// front of the map (skipped code charges here at every block).
#[derive(Debug, Clone, Default)]
pub struct Extra {
    index: FxHashMap<(NodeId, u64), u32>,
    cells: Vec<((NodeId, u64), u64)>,
    memo: Memo<(NodeId, u64), u32>,
}

impl Extra {
    /// The Ir of `node` at `addr`, made (zero) if new.
    #[inline]
    pub fn at(&mut self, node: NodeId, addr: u64) -> &mut u64 {
        let key = (node, addr);
        let cells = &mut self.cells;
        let index = &mut self.index;
        let i = self.memo.get_or(key, || {
            *index.entry(key).or_insert_with(|| {
                cells.push((key, 0));
                (cells.len() - 1) as u32
            })
        });
        &mut self.cells[i as usize].1
    }

    /// Every (context, address) charged, with its Ir.
    pub fn iter(&self) -> impl Iterator<Item = (&(NodeId, u64), &u64)> {
        self.cells.iter().map(|(k, v)| (k, v))
    }

    /// The Ir of every cell.
    pub fn values(&self) -> impl Iterator<Item = &u64> {
        self.cells.iter().map(|(_, v)| v)
    }

    fn zero(&mut self) {
        self.cells.iter_mut().for_each(|(_, v)| *v = 0);
    }
}

/// Jump counts by (from slot, to slot), with each from slot's last cell
/// in front of the map: a loop's jump finds its cell at once.
#[derive(Debug, Clone, Default)]
pub struct JumpCells {
    index: FxHashMap<(u32, u32), u32>,
    /// Each cell's (from, to) and count.
    cells: Vec<((u32, u32), u64)>,
    /// Per from slot, its last cell plus one (0: none yet).
    last: Vec<u32>,
}

impl JumpCells {
    /// One jump from slot `from` to slot `to`.
    #[inline]
    pub fn add(&mut self, from: u32, to: u32) {
        let f = from as usize;
        if let Some(&c) = self.last.get(f) {
            if let Some(cell) = c
                .checked_sub(1)
                .and_then(|c| self.cells.get_mut(c as usize))
            {
                if cell.0 == (from, to) {
                    cell.1 += 1;
                    return;
                }
            }
        }
        let cells = &mut self.cells;
        let c = *self.index.entry((from, to)).or_insert_with(|| {
            cells.push(((from, to), 0));
            (cells.len() - 1) as u32
        });
        cells[c as usize].1 += 1;
        if self.last.len() <= f {
            self.last.resize(f + 1, 0);
        }
        self.last[f] = c + 1;
    }

    /// Every (from, to) pair jumped along, with its count (zero after a
    /// dump wrote it), by cell.
    pub fn iter(&self) -> impl Iterator<Item = (usize, (u32, u32), u64)> + '_ {
        self.cells.iter().enumerate().map(|(i, &(k, n))| (i, k, n))
    }

    /// Zeroes cell `i`'s count.
    pub fn zero_cell(&mut self, i: usize) {
        self.cells[i].1 = 0;
    }

    fn zero(&mut self) {
        self.cells.iter_mut().for_each(|c| c.1 = 0);
    }
}

/// The costs of a tree between two dumps, as a dump takes them: only what
/// is not zero, each cost as a row of every event collected (Cachegrind's
/// order; Ir alone without a simulation).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// Per (context, block): one row per instruction of the block.
    /// With a simulation only.
    pub selfs: Vec<(NodeId, u32, Box<[u64]>)>,
    /// Without a simulation, per (context, block): its executions (each
    /// instruction's Ir), expanded to instructions only as the part is
    /// laid out (a row per instruction took 150 MB on python-json).
    pub runs: Vec<(NodeId, u32, u64)>,
    /// Per (context, instruction address) charged to one instruction
    /// (skipped functions' code, rep instructions' final check): its row
    /// in `extra_costs`.
    pub extra: Vec<(NodeId, u64)>,
    /// The rows of `extra`, one after the other (`width` each).
    pub extra_costs: Vec<u64>,
    /// Per arc (index into the tree's arcs): its calls; its inclusive
    /// costs are its row in `arc_costs`.
    pub arcs: Vec<(u32, u64)>,
    /// The rows of `arcs`, one after the other (`width` each).
    pub arc_costs: Vec<u64>,
    /// The jumps (`--collect-jumps=yes`) from the cells that ran.
    pub jumps: Vec<JumpCount>,
    /// The columns of a row of `extra_costs` and `arc_costs`.
    pub width: usize,
    /// The dump's `summary:` (its threads' costs since their last dump).
    pub summary: Vec<u64>,
}

/// Jumps from one (context, block) cell to another in a dump.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JumpCount {
    /// The context and block left.
    pub from: (NodeId, u32),
    /// The context and block entered.
    pub to: (NodeId, u32),
    /// How many times.
    pub count: u64,
    /// The executions of the block left in its context (a conditional
    /// jump's `jcnd=` count of executions).
    pub executed: u64,
}

impl Tree {
    /// The node for `function` at `level` called from `parent` (a root of
    /// `thread`'s tree when `parent` is [`NO_NODE`]), made if new.
    pub fn child(&mut self, parent: NodeId, function: FnId, level: u32, thread: u32) -> NodeId {
        self.index_nodes();
        let key = |n: &Node| (n.parent, n.function, n.level, n.thread);
        let node = Node {
            parent,
            function,
            level,
            thread,
        };
        let nodes = &mut self.nodes;
        match self.children.find(&key(&node), |i| key(&nodes[i as usize])) {
            Ok(i) => i,
            Err(at) => {
                nodes.push(node);
                let i = (nodes.len() - 1) as NodeId;
                self.children.insert(at, i, |i| key(&nodes[i as usize]));
                self.nodes_indexed = nodes.len();
                i
            }
        }
    }

    /// A call into `function` at `level` from context `caller` of
    /// `thread`, counted on the arc from `from` at `call_site` to the
    /// callee's context entered at `target`: that context and arc, made
    /// if new.
    #[allow(clippy::too_many_arguments)]
    pub fn call(
        &mut self,
        caller: NodeId,
        function: FnId,
        level: u32,
        thread: u32,
        from: NodeId,
        call_site: u64,
        target: u64,
    ) -> (NodeId, u32) {
        let key = CallKey {
            caller,
            function,
            level,
            thread,
            from,
            call_site,
            target,
        };
        if let Some(v) = self.calls.get(&key) {
            return v;
        }
        let node = self.child(caller, function, level, thread);
        let arc = self.arc(from, call_site, node, target);
        self.calls.put(key, (node, arc));
        (node, arc)
    }

    /// The arc from `caller` at `call_site` to `callee` entered at
    /// `target`, made if new.
    pub fn arc(&mut self, caller: NodeId, call_site: u64, callee: NodeId, target: u64) -> u32 {
        self.index_arcs();
        let key = |a: &Arc| (a.caller, a.call_site, a.callee, a.target);
        let arcs = &mut self.arcs;
        let k = (caller, call_site, callee, target);
        match self.arc_index.find(&k, |i| key(&arcs[i as usize])) {
            Ok(i) => i,
            Err(at) => {
                arcs.push(Arc {
                    caller,
                    call_site,
                    callee,
                    target,
                    calls: 0,
                    inclusive: 0,
                });
                let costs = &mut self.arc_costs;
                costs.resize(costs.len() + self.width, 0);
                let i = (arcs.len() - 1) as u32;
                self.arc_index.insert(at, i, |i| key(&arcs[i as usize]));
                self.arcs_indexed = arcs.len();
                i
            }
        }
    }

    /// The slot counting executions of `block` in `node`, made if new.
    pub fn run_slot(&mut self, node: NodeId, block: u32) -> u32 {
        self.index_runs();
        let keys = &mut self.run_keys;
        match self.run_index.find(&(node, block), |i| keys[i as usize]) {
            Ok(i) => i,
            Err(at) => {
                self.runs.push(0);
                keys.push((node, block));
                self.next.push(crate::hot::NO_SLOT);
                // Its rows, if any, are made by the tool (it knows the size).
                let i = (keys.len() - 1) as u32;
                self.run_index.insert(at, i, |i| keys[i as usize]);
                self.run_indexed = keys.len();
                i
            }
        }
    }

    /// A new node for `function` at `level` called from `parent` in
    /// `thread`, which the caller knows is not there: no lookup (the
    /// index takes it at the next [`child`](Self::child)).
    pub(crate) fn push_node(
        &mut self,
        parent: NodeId,
        function: FnId,
        level: u32,
        thread: u32,
    ) -> NodeId {
        self.nodes.push(Node {
            parent,
            function,
            level,
            thread,
        });
        (self.nodes.len() - 1) as NodeId
    }

    /// A new arc, which the caller knows is not there (as
    /// [`push_node`](Self::push_node); [`arc`](Self::arc) indexes it).
    pub(crate) fn push_arc(
        &mut self,
        caller: NodeId,
        call_site: u64,
        callee: NodeId,
        target: u64,
    ) -> u32 {
        self.arcs.push(Arc {
            caller,
            call_site,
            callee,
            target,
            calls: 0,
            inclusive: 0,
        });
        self.arc_costs.resize(self.arc_costs.len() + self.width, 0);
        (self.arcs.len() - 1) as u32
    }

    /// A new slot counting executions of `block` in `node`, which the
    /// caller knows has none: no lookup (the fold makes millions; the
    /// index takes them at the next [`run_slot`](Self::run_slot)).
    pub(crate) fn push_slot(&mut self, node: NodeId, block: u32) -> u32 {
        self.runs.push(0);
        self.run_keys.push((node, block));
        (self.run_keys.len() - 1) as u32
    }

    /// Puts the nodes not indexed yet into the index.
    fn index_nodes(&mut self) {
        let nodes = &self.nodes;
        self.children
            .catch_up(&mut self.nodes_indexed, nodes.len(), |i| {
                let n = &nodes[i as usize];
                (n.parent, n.function, n.level, n.thread)
            });
    }

    /// Puts the arcs not indexed yet into the index.
    fn index_arcs(&mut self) {
        let arcs = &self.arcs;
        self.arc_index
            .catch_up(&mut self.arcs_indexed, arcs.len(), |i| {
                let a = &arcs[i as usize];
                (a.caller, a.call_site, a.callee, a.target)
            });
    }

    /// Puts the slots not indexed yet into the index and `next`.
    fn index_runs(&mut self) {
        let (from, to) = (self.run_indexed, self.run_keys.len());
        if from == to {
            return;
        }
        let keys = &self.run_keys;
        self.run_index.extend(from..to, |i| keys[i as usize]);
        self.next.resize(to, crate::hot::NO_SLOT);
        self.run_indexed = to;
    }
}

impl Tree {
    /// Frees what only finding nodes, arcs and slots needs (the indexes
    /// and successor hints: 30 MB on python-json) when the run is over
    /// and the costs are laid out; should anything be looked up again,
    /// they are rebuilt first.
    pub fn release_lookups(&mut self) {
        self.children = Index::default();
        self.nodes_indexed = 0;
        self.arc_index = Index::default();
        self.arcs_indexed = 0;
        self.run_index = Index::default();
        self.run_indexed = 0;
        self.next = Vec::new();
    }

    /// The row of extra costs of `node` at `addr` (a simulation's), made
    /// if new.
    pub fn extra_row(&mut self, node: NodeId, addr: u64) -> usize {
        let (rows, width) = (&mut self.rows, self.width);
        let r = *self.extra_rows.entry((node, addr)).or_insert_with(|| {
            let r = (rows.len() / width.max(1)) as u32;
            rows.resize(rows.len() + width, 0);
            r
        });
        r as usize * width
    }

    /// Sets every cost to zero (a dump or `ZERO_STATS`); nodes, arcs and
    /// slots stay. Arcs' call counts and jumps are zeroed with `calls` (a
    /// dump zeroes those it wrote itself).
    pub fn zero(&mut self, calls: bool) {
        if calls {
            self.jumps.zero();
        }
        self.runs.iter_mut().for_each(|r| *r = 0);
        self.extra.zero();
        self.rows.iter_mut().for_each(|r| *r = 0);
        self.arc_costs.iter_mut().for_each(|c| *c = 0);
        for a in &mut self.arcs {
            if calls {
                a.calls = 0;
            }
            a.inclusive = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jump_cells_count_per_pair() {
        let mut j = JumpCells::default();
        for (from, to) in [(3, 4), (3, 4), (3, 5), (3, 4), (0, 3)] {
            j.add(from, to);
        }
        let counts: Vec<_> = j.iter().map(|(_, k, n)| (k, n)).collect();
        assert_eq!(counts, [((3, 4), 3), ((3, 5), 1), ((0, 3), 1)]);
        j.zero_cell(1);
        j.add(3, 5);
        assert_eq!(j.iter().nth(1).map(|c| c.2), Some(1));
        j.zero();
        assert!(j.iter().all(|c| c.2 == 0));
    }

    #[test]
    fn nodes_arcs_and_slots_are_made_once() {
        let mut t = Tree::default();
        let root = t.child(NO_NODE, 0, 1, 1);
        let a = t.child(root, 1, 1, 1);
        assert_eq!(t.child(root, 1, 1, 1), a);
        assert_ne!(t.child(root, 1, 2, 1), a);
        assert_ne!(t.child(NO_NODE, 0, 1, 2), root, "one tree per thread");
        let arc = t.arc(root, 0x10, a, 0x20);
        assert_eq!(t.arc(root, 0x10, a, 0x20), arc);
        assert_ne!(t.arc(root, 0x14, a, 0x20), arc);
        let s = t.run_slot(a, 3);
        assert_eq!(t.run_slot(a, 3), s);
        assert_eq!(t.run_keys[s as usize], (a, 3));
        assert!(t.nodes.iter().all(|n| n.parent == NO_NODE || n.parent < 3));
        // Released and rebuilt: the same ones are found, nothing is made.
        t.release_lookups();
        assert_eq!(t.child(root, 1, 1, 1), a);
        assert_eq!(t.arc(root, 0x10, a, 0x20), arc);
        assert_eq!(t.run_slot(a, 3), s);
        assert_eq!((t.nodes.len(), t.arcs.len(), t.runs.len()), (4, 2, 1));
        assert_eq!(t.next.len(), t.runs.len());
    }
}
