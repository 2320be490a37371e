//! The Cachegrind tool: consumes the event stream, runs the cache and
//! branch models on it, and charges every event to the instruction that
//! caused it in a [`CostTable`].

use cachesim::{BranchPredictor, CacheSim, Outcome};
use events::{AccessKind, BlockId, BlockInfo, Needs, Record, Tool};

use crate::set::{Event, EventCounts, EventSet};
use crate::table::CostTable;

/// Where in a row the models' events go: the first column of each group
/// of events charged together. Each group is contiguous in every event set,
/// so charging one takes a single bounds check. A group not collected is 0
/// and never written.
#[derive(Debug, Clone, Copy)]
struct Columns {
    /// Ir (alone without cache simulation).
    ir: usize,
    /// Ir, I1mr, ILmr.
    instr: usize,
    /// Dr, D1mr, DLmr.
    read: usize,
    /// Dw, D1mw, DLmw.
    write: usize,
    /// Bc, Bcm.
    cond: usize,
    /// Bi, Bim.
    indirect: usize,
}

impl Columns {
    fn of(set: EventSet) -> Columns {
        let group = |events: &[Event]| {
            let cols: Option<Vec<usize>> = events.iter().map(|&e| set.index(e)).collect();
            cols.map_or(0, |cols| {
                assert!(cols.windows(2).all(|w| w[1] == w[0] + 1), "{events:?}");
                cols[0]
            })
        };
        Columns {
            ir: group(&[Event::Ir]),
            instr: group(&[Event::Ir, Event::I1mr, Event::ILmr]),
            read: group(&[Event::Dr, Event::D1mr, Event::DLmr]),
            write: group(&[Event::Dw, Event::D1mw, Event::DLmw]),
            cond: group(&[Event::Bc, Event::Bcm]),
            indirect: group(&[Event::Bi, Event::Bim]),
        }
    }
}

/// Adds one access and its outcome to the `[refs, L1 misses, LL misses]`
/// columns from `first` on in `row`, branch-free.
#[inline(always)]
fn charge(row: &mut [u64], first: usize, o: Outcome) {
    let c = &mut row[first..first + 3];
    c[0] += 1;
    c[1] += u64::from(o.l1_miss());
    c[2] += u64::from(o.ll_miss());
}

/// Adds one branch and whether it was mispredicted to the `[executed,
/// mispredicted]` columns from `first` on in `row`.
#[inline(always)]
fn charge_branch(row: &mut [u64], first: usize, mispredicted: bool) {
    let c = &mut row[first..first + 2];
    c[0] += 1;
    c[1] += u64::from(mispredicted);
}

/// Cachegrind as a [`Tool`]: Ir from instruction fetches, and, when
/// simulated, the I1/D1/LL events (spec §1) and the branch events (§3),
/// each charged to its instruction's row of a [`CostTable`].
///
/// Data references before any instruction fetch (possible in a `din`
/// trace) are charged to address 0.
#[derive(Debug)]
pub struct CachegrindTool {
    table: CostTable,
    cols: Columns,
    caches: Option<CacheSim>,
    branches: Option<BranchPredictor>,
    /// Slot of the latest fetched instruction, which data references and
    /// branch records belong to.
    current: Option<usize>,
    /// Per block id: the slots of its instructions, made when the block
    /// was described, as Cachegrind makes its cost centres at translation
    /// (so an instruction translated but never run still has a row).
    blocks: Vec<Box<[usize]>>,
    /// The block entered last and how many of its instructions have been
    /// fetched since: fetches inside it need no address lookup.
    in_block: Option<(usize, usize)>,
}

impl CachegrindTool {
    /// A tool that simulates `caches` (cold) if given, and the branch
    /// predictor if `branch_sim`; Ir is always counted.
    pub fn new(caches: Option<CacheSim>, branch_sim: bool) -> CachegrindTool {
        let set = EventSet::new(caches.is_some(), branch_sim);
        CachegrindTool {
            table: CostTable::new(set),
            cols: Columns::of(set),
            caches,
            branches: branch_sim.then(BranchPredictor::new),
            current: None,
            blocks: Vec::new(),
            in_block: None,
        }
    }

    /// The events collected.
    pub fn events(&self) -> EventSet {
        self.table.events()
    }

    /// The costs so far.
    pub fn table(&self) -> &CostTable {
        &self.table
    }

    /// The totals of every event so far.
    pub fn totals(&self) -> EventCounts {
        self.events().counts(self.table.totals())
    }

    /// An empty profile for this tool's results: its `desc:` lines (the
    /// simulated caches, as Cachegrind describes them) and its columns.
    pub fn new_profile(&self, cmd: &str) -> profile::Profile {
        let mut p = self.events().new_profile(cmd);
        if let Some(sim) = &self.caches {
            p.desc = vec![
                format!("I1 cache:         {}", sim.i1().desc()),
                format!("D1 cache:         {}", sim.d1().desc()),
                format!("LL cache:         {}", sim.ll().desc()),
            ];
        }
        p
    }

    /// The slot of the instruction fetched at `addr`: the next one of the
    /// current block if it is that, else looked up.
    #[inline(always)]
    fn fetch_slot(&mut self, addr: u64) -> usize {
        if let Some((block, pos)) = &mut self.in_block {
            match self.blocks[*block].get(*pos) {
                Some(&slot) if self.table.addr(slot) == addr => {
                    *pos += 1;
                    return slot;
                }
                // Left the block early (or a producer bug): look up.
                _ => self.in_block = None,
            }
        }
        self.table.slot(addr)
    }

    /// The slot a branch at `pc` is charged to: the current instruction's
    /// when it is the one (the usual case: no lookup).
    #[inline(always)]
    fn branch_slot(&mut self, pc: u64) -> usize {
        match self.current {
            Some(cur) if self.table.addr(cur) == pc => cur,
            _ => self.table.slot(pc),
        }
    }
}

impl Tool for CachegrindTool {
    fn needs(&self) -> Needs {
        let cache = self.caches.is_some();
        let branch = self.branches.is_some();
        Needs {
            instr_fetches: cache,
            data_refs: cache,
            cond_branches: branch,
            indirect_targets: branch,
            calls_returns: false,
        }
    }

    fn block(&mut self, id: BlockId, info: &BlockInfo) {
        let slots = info
            .instrs()
            .iter()
            .map(|i| self.table.slot(i.addr))
            .collect();
        let i = id.0 as usize;
        if self.blocks.len() <= i {
            self.blocks.resize_with(i + 1, Default::default);
        }
        self.blocks[i] = slots;
    }

    #[inline(always)]
    fn record(&mut self, record: Record) {
        let cols = self.cols;
        match record {
            Record::Block(id) => self.in_block = Some((id.0 as usize, 0)),
            Record::Instr(f) => {
                let slot = self.fetch_slot(f.addr);
                self.current = Some(slot);
                match &mut self.caches {
                    Some(sim) => {
                        let outcome = sim.instr(f.addr, f.len);
                        charge(self.table.row_mut(slot), cols.instr, outcome);
                    }
                    None => self.table.add(slot, cols.ir, 1),
                }
            }
            Record::Data(d) => {
                if let Some(sim) = &mut self.caches {
                    let outcome = sim.data(d.addr, d.size);
                    let slot = match self.current {
                        Some(cur) => cur,
                        None => self.table.slot(0),
                    };
                    // A modify is one access, counted as a read (spec §1.4).
                    let first = match d.kind {
                        AccessKind::Read | AccessKind::Modify => cols.read,
                        AccessKind::Write => cols.write,
                    };
                    charge(self.table.row_mut(slot), first, outcome);
                }
            }
            Record::CondBranch(b) => {
                if let Some(bp) = &mut self.branches {
                    let mispredicted = bp.cond(b.pc, b.taken);
                    let slot = self.branch_slot(b.pc);
                    charge_branch(self.table.row_mut(slot), cols.cond, mispredicted);
                }
            }
            Record::Indirect(t) => {
                if let Some(bp) = &mut self.branches {
                    let mispredicted = bp.indirect(t.pc, t.target);
                    let slot = self.branch_slot(t.pc);
                    charge_branch(self.table.row_mut(slot), cols.indirect, mispredicted);
                }
            }
            Record::Call(_) | Record::Return(_) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cachesim::CacheConfig;
    use events::{CondBranch, DataRef, InstrFetch, MemOperand, Terminator, Transfer};

    fn caches() -> CacheSim {
        CacheSim::new(
            CacheConfig::new(32768, 8, 64),
            CacheConfig::new(32768, 8, 64),
            CacheConfig::new(262_144, 8, 64),
        )
    }

    fn instr(addr: u64, len: u32) -> Record {
        Record::Instr(InstrFetch { addr, len })
    }

    fn data(addr: u64, size: u32, kind: AccessKind) -> Record {
        Record::Data(DataRef { addr, size, kind })
    }

    fn row(tool: &CachegrindTool, addr: u64) -> Vec<u64> {
        let mut t = tool.table().clone();
        let slot = t.slot(addr);
        t.row(slot).to_vec()
    }

    #[test]
    fn needs_follow_the_simulations() {
        assert!(!CachegrindTool::new(None, false).needs().any());
        let n = CachegrindTool::new(Some(caches()), false).needs();
        assert!(n.instr_fetches && n.data_refs && !n.cond_branches);
        let n = CachegrindTool::new(None, true).needs();
        assert!(!n.data_refs && n.cond_branches && n.indirect_targets);
    }

    /// Each event lands on the instruction that caused it.
    #[test]
    fn costs_per_instruction() {
        let mut tool = CachegrindTool::new(Some(caches()), false);
        tool.records(&[
            instr(0x40_1000, 4),
            data(0x60_0000, 8, AccessKind::Read),
            data(0x60_0008, 4, AccessKind::Modify),
            instr(0x40_1004, 3),
            data(0x70_0000, 8, AccessKind::Write),
        ]);
        tool.records(&[instr(0x40_1000, 4), data(0x60_0000, 8, AccessKind::Read)]);
        assert_eq!(row(&tool, 0x40_1000), [2, 1, 1, 3, 1, 1, 0, 0, 0]);
        assert_eq!(row(&tool, 0x40_1004), [1, 0, 0, 0, 0, 0, 1, 1, 1]);
        assert_eq!(tool.table().totals(), [3, 1, 1, 3, 1, 1, 1, 1, 1]);
        assert_eq!(tool.totals().get(Event::DLmw), 1);
    }

    #[test]
    fn without_cache_simulation_only_ir() {
        let mut tool = CachegrindTool::new(None, false);
        tool.records(&[
            data(0x60_0000, 8, AccessKind::Read),
            instr(0x40_1000, 4),
            data(0x60_0000, 8, AccessKind::Read),
        ]);
        assert_eq!(tool.table().len(), 1);
        assert_eq!(tool.table().totals(), [1]);
    }

    #[test]
    fn data_before_any_instruction_is_charged_to_address_zero() {
        let mut tool = CachegrindTool::new(Some(caches()), false);
        tool.records(&[data(0x1000, 4, AccessKind::Write)]);
        assert_eq!(row(&tool, 0), [0, 0, 0, 0, 0, 0, 1, 1, 1]);
    }

    /// Spec §3's `loop` example, charged to the branch; a branch record
    /// for another address than the current instruction goes to its own.
    #[test]
    fn branches() {
        let mut tool = CachegrindTool::new(None, true);
        let pc = 0x40_10a5;
        let mut recs = Vec::new();
        for i in 0..10 {
            recs.push(instr(pc, 2));
            recs.push(Record::CondBranch(CondBranch { pc, taken: i < 9 }));
        }
        recs.push(Record::Indirect(Transfer {
            pc: 0x40_2000,
            target: 0x40_3000,
        }));
        recs.push(Record::Call(Transfer {
            pc: 0x40_2000,
            target: 0x40_3000,
        }));
        tool.records(&recs);
        assert_eq!(row(&tool, pc), [10, 10, 10, 0, 0]);
        assert_eq!(row(&tool, 0x40_2000), [0, 0, 0, 1, 1]);
        // Without branch simulation they are ignored.
        let mut tool = CachegrindTool::new(None, false);
        tool.records(&recs);
        assert_eq!(tool.table().totals(), [10]);
    }

    /// Fetches inside a described block reuse the slots made for it; every
    /// instruction described has a row, run or not.
    #[test]
    fn blocks_give_slots_without_lookups() {
        let mut b = BlockInfo::new(0x1000, Terminator::CondJump { target: 0x1000 });
        let store = MemOperand {
            size: 8,
            kind: AccessKind::Write,
        };
        b.push(0x1000, 4, &[store]);
        b.push(0x1004, 2, &[]);
        b.push(0x1006, 2, &[]);
        let mut tool = CachegrindTool::new(Some(caches()), false);
        tool.block(BlockId(3), &b);
        assert_eq!(tool.table().len(), 3);
        tool.records(&[
            Record::Block(BlockId(3)),
            instr(0x1000, 4),
            data(0x9000, 8, AccessKind::Write),
            instr(0x1004, 2),
            // Left early: the lookup takes over.
            instr(0x5000, 1),
            instr(0x1006, 2),
            Record::Block(BlockId(3)),
            instr(0x1000, 4),
        ]);
        assert_eq!(row(&tool, 0x1000)[0], 2);
        assert_eq!(row(&tool, 0x1000)[6], 1);
        assert_eq!(row(&tool, 0x1004)[0], 1);
        assert_eq!(row(&tool, 0x1006)[0], 1);
        assert_eq!(row(&tool, 0x5000)[0], 1);
        assert_eq!(tool.table().len(), 4);
    }

    #[test]
    fn profile_header() {
        let tool = CachegrindTool::new(Some(caches()), true);
        let p = tool.new_profile("cmd");
        assert_eq!(
            p.desc[0],
            "I1 cache:         32768 B, 64 B, 8-way associative"
        );
        assert_eq!(p.events.len(), 13);
        assert!(CachegrindTool::new(None, false)
            .new_profile("c")
            .desc
            .is_empty());
    }
}
