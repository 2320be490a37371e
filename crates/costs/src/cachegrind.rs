//! The Cachegrind tool: consumes the event stream, runs the cache and
//! branch models on it, and charges every event to the instruction that
//! caused it in a [`CostTable`].

use cachesim::{BranchPredictor, CacheConfig, CacheSim, Outcome};
use events::{
    AccessKind, BlockId, BlockInfo, BranchWords, KeptAccess, MruFilter, Needs, Record, SiteWords,
    Terminator, Tool,
};

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
/// mispredicted]` columns from `first` on of `slot`'s row (through
/// [`CostTable::add`]: a table for block runs stores those columns, so a
/// branch costs no row on the side).
#[inline(always)]
fn charge_branch(table: &mut CostTable, slot: usize, first: usize, mispredicted: bool) {
    table.add(slot, first, 1);
    table.add(slot, first + 1, u64::from(mispredicted));
}

/// Where a [`BlockSim`] charges what can miss: column `col` of row `slot`
/// (the slots a block was described with) gets `n` more. Called only for
/// misses and branches, never per instruction.
pub trait Charge {
    /// Adds `n` to column `col` of `slot`.
    fn add(&mut self, slot: usize, col: usize, n: u64);
}

impl Charge for CostTable {
    #[inline]
    fn add(&mut self, slot: usize, col: usize, n: u64) {
        CostTable::add(self, slot, col, n);
    }
}

/// The simulation shared by Cachegrind's tool and Callgrind's: the cache
/// and branch models and, per block, what one execution does to them,
/// worked out once. Rows and columns are the caller's: a block is described
/// with one slot per instruction ([`describe`](Self::describe)), and each
/// execution charges its misses to those slots through a [`Charge`], in the
/// columns of [`EventSet`] (Cachegrind's order). Ir, Dr and Dw are not
/// charged per execution: they follow from the runs and
/// [`accesses`](Self::accesses).
#[derive(Debug, Clone)]
pub struct BlockSim {
    cols: Columns,
    set: EventSet,
    caches: Option<CacheSim>,
    branches: Option<BranchPredictor>,
    /// Callgrind counts a modify (`add %eax,(%rdi)`) as a write, Cachegrind
    /// as a read (spec §1.4): the model does the same either way.
    modify_as_write: bool,
    /// Per block id: what a run needs of its plan, one cache line each.
    blocks: Vec<BlockPlan>,
    /// The plans' steps and instructions.
    arenas: Arenas,
    /// The block whose run made the latest instruction fetches (see
    /// `BlockPlan::repeats_free`).
    last_run: Option<u32>,
    /// log2 of the line size kept references are read with (the caches'
    /// one, when they ask for the filter).
    kept_line_bits: u8,
    /// How site words are laid out (for the kept references' line size).
    site_words: SiteWords,
    /// Per site (see [`Tool::block_sites`]): the reference it names and
    /// the misses found there, not yet charged.
    site_tallies: Vec<SiteTally>,
    /// Per block id: the branch ending it, with counted executions.
    branch_tallies: Vec<BranchTally>,
    /// Per block id: the low 16 bits of the address of the branch ending
    /// it (all the predictor reads of it), kept apart from the tallies so
    /// that the table the predictor reads per branch is two bytes a block
    /// and stays in the host's caches.
    branch_pcs: Vec<u16>,
    /// Per block id: the mispredictions of the branch ending it found
    /// from branch words, not yet charged.
    branch_misses: Vec<u64>,
}

/// A site (see [`Tool::block_sites`]): which reference of which block it
/// names, and its L1 and LL misses not yet charged. An L1 miss of a site
/// word is tallied here rather than charged to the block's row at once:
/// the row lies three dependent loads away (block, plan, step), and on
/// bzip2 that lookup and the table's add were a quarter of the consumer's
/// time (30 M D1 misses); the tallies are charged at the end, where a
/// tally about to overflow is charged at once.
#[derive(Debug, Clone, Copy)]
struct SiteTally {
    /// The block (`u32::MAX`: the site names nothing).
    block: u32,
    /// Its reference: [`SITE_FETCH`] set for a fetch, then the fetch's or
    /// data operand's index.
    reference: u32,
    /// L1 misses not yet charged.
    l1_misses: u32,
    /// LL misses not yet charged (at most `l1_misses`).
    ll_misses: u32,
}

/// In [`SiteTally::reference`]: the site names a fetch.
const SITE_FETCH: u32 = 1 << 31;

impl SiteTally {
    /// A site that names no reference.
    const NONE: SiteTally = SiteTally {
        block: u32::MAX,
        reference: 0,
        l1_misses: 0,
        ll_misses: 0,
    };

    /// Whether the site names a fetch.
    fn is_fetch(&self) -> bool {
        self.reference & SITE_FETCH != 0
    }

    /// The fetch's or data operand's index in its block.
    fn index(&self) -> usize {
        (self.reference & !SITE_FETCH) as usize
    }
}

/// The branch ending a block whose executions are counted: executed as
/// often as the block ran (each execution ends in it; its mispredictions,
/// found from the branch words ([`BranchWords`]), are in
/// `BlockSim::branch_misses`); charged to the block's last instruction at
/// the end.
#[derive(Debug, Clone, Copy, Default)]
struct BranchTally {
    /// Executions (Bc or Bi) not yet charged.
    executed: u64,
    /// What kind of branch it is.
    kind: BranchKind,
}

/// The kind of branch ending a block, as the predictor sees it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
enum BranchKind {
    /// None it simulates (a return, a direct jump or call, no branch).
    #[default]
    None,
    /// A conditional branch: Bc, Bcm.
    Cond,
    /// An indirect jump or call: Bi, Bim.
    Indirect,
}

impl BlockSim {
    /// A simulation of `caches` (cold) if given and of the branch predictor
    /// if `branch_sim`; a modify access is counted as a write if
    /// `modify_as_write` (Callgrind), else as a read (Cachegrind).
    pub fn new(caches: Option<CacheSim>, branch_sim: bool, modify_as_write: bool) -> BlockSim {
        let set = EventSet::new(caches.is_some(), branch_sim);
        let kept_line_bits = caches
            .as_ref()
            .map_or(6, |c| c.d1().line_size.trailing_zeros() as u8);
        BlockSim {
            cols: Columns::of(set),
            set,
            caches,
            branches: branch_sim.then(BranchPredictor::new),
            modify_as_write,
            blocks: Vec::new(),
            arenas: Arenas::default(),
            last_run: None,
            kept_line_bits,
            site_words: SiteWords::new(kept_line_bits),
            site_tallies: Vec::new(),
            branch_tallies: Vec::new(),
            branch_pcs: Vec::new(),
            branch_misses: Vec::new(),
        }
    }

    /// The events charged, in column order.
    pub fn events(&self) -> EventSet {
        self.set
    }

    /// The simulated caches, if any.
    pub fn caches(&self) -> Option<&CacheSim> {
        self.caches.as_ref()
    }

    /// Describes block `id` (`info`), whose instructions are charged to
    /// `slots`.
    pub fn describe(&mut self, id: BlockId, info: &BlockInfo, slots: Box<[usize]>) {
        let i1 = self.caches.as_ref().map(|c| {
            let i1 = c.i1();
            I1Shape {
                line: u64::from(i1.line_size),
                sets: u64::from(i1.sets()),
                lines_held: u64::from(i1.sets()) * u64::from(i1.assoc),
                max_access: c.max_access(),
            }
        });
        let plan = BlockPlan::new(
            info,
            &slots,
            self.cols,
            i1,
            self.modify_as_write,
            &mut self.arenas,
        );
        let i = id.0 as usize;
        if self.blocks.len() <= i {
            self.blocks.resize_with(i + 1, Default::default);
        }
        self.blocks[i] = plan;
        if self.branches.is_some() {
            if self.branch_tallies.len() <= i {
                self.branch_tallies.resize_with(i + 1, Default::default);
                self.branch_pcs.resize(i + 1, 0);
                self.branch_misses.resize(i + 1, 0);
            }
            self.branch_pcs[i] = info.instrs().last().map_or(0, |l| l.addr as u16);
            self.branch_tallies[i] = BranchTally {
                kind: match info.terminator() {
                    Terminator::CondJump { .. } => BranchKind::Cond,
                    Terminator::IndirectJump | Terminator::IndirectCall => BranchKind::Indirect,
                    _ => BranchKind::None,
                },
                ..Default::default()
            };
        }
    }

    /// Charges what is tallied rather than charged as it happens (the
    /// branches of counted executions, the L1 and LL misses of site
    /// words) to the instructions of their blocks, and starts the tallies
    /// again.
    pub fn charge_tallies(&mut self, out: &mut impl Charge) {
        for site in 0..self.site_tallies.len() {
            if self.site_tallies[site].l1_misses > 0 {
                self.charge_site(site, out);
            }
        }
        self.charge_branch_tallies(out);
    }

    /// Charges site `site`'s tallied misses to its reference's row and
    /// starts its tally again.
    #[cold]
    #[inline(never)]
    fn charge_site(&mut self, site: usize, out: &mut impl Charge) {
        let Some(t) = self.site_tallies.get_mut(site) else {
            return;
        };
        let (l1, ll) = (t.l1_misses, t.ll_misses);
        (t.l1_misses, t.ll_misses) = (0, 0);
        let t = *t;
        if let Some((slot, first)) = self.place(t.block, t.is_fetch(), t.index()) {
            out.add(slot, first + 1, u64::from(l1));
            out.add(slot, first + 2, u64::from(ll));
        }
    }

    /// Charges the branches tallied with counted executions to the last
    /// instruction of their blocks, and starts the tallies again.
    fn charge_branch_tallies(&mut self, out: &mut impl Charge) {
        let tallies = self.branch_tallies.iter_mut().zip(&mut self.branch_misses);
        for (plan, (t, misses)) in self.blocks.iter().zip(tallies) {
            let first = match t.kind {
                BranchKind::Cond => self.cols.cond,
                BranchKind::Indirect => self.cols.indirect,
                BranchKind::None => continue,
            };
            if let (Some((slot, _)), true) = (plan.last(), t.executed > 0) {
                out.add(slot, first, std::mem::take(&mut t.executed));
                out.add(slot, first + 1, std::mem::take(misses));
            }
        }
    }

    /// Whether block `id` was described.
    pub fn described(&self, id: BlockId) -> bool {
        self.blocks
            .get(id.0 as usize)
            .is_some_and(|p| p.instrs.len > 0)
    }

    /// Per instruction of block `id`: the reads (with modifies, unless they
    /// count as writes) and writes one execution makes.
    pub fn accesses(&self, id: BlockId) -> &[(u16, u16)] {
        self.blocks
            .get(id.0 as usize)
            .map_or(&[], |p| p.instrs.of(&self.arenas.accesses))
    }

    /// Simulates one execution of block `id` with its data addresses
    /// `addrs`, charging misses to `out` (`I1mr`/`ILmr`, `D1mr`/`DLmr`,
    /// `D1mw`/`DLmw` of each instruction's slot). Returns false if the block
    /// was never described (nothing simulated).
    #[inline]
    pub fn run(&mut self, id: BlockId, addrs: &[u64], out: &mut impl Charge) -> bool {
        self.run_plan(id, addrs, out).is_some()
    }

    /// [`run`](Self::run), giving the slot and address of the block's last
    /// instruction if it has one (kept in its plan, which is in the cache
    /// already), or `None` if the block is beyond those described.
    #[inline(always)]
    fn run_plan(
        &mut self,
        id: BlockId,
        addrs: &[u64],
        out: &mut impl Charge,
    ) -> Option<Option<(usize, u64)>> {
        let described = self.blocks.get(id.0 as usize)?.data.len as usize;
        let steps = addrs.iter().copied().enumerate().take(described);
        self.run_steps(id, steps, addrs.len(), out)
    }

    /// Simulates one execution of block `id` whose data references went
    /// through [`BlockSim::mru_filter`]: `kept` holds the
    /// [`KeptAccess`] words of the references left, in order (the others
    /// hit the most recently used line of their D1 set and change
    /// nothing). Charges as [`run`](Self::run) does; returns what
    /// `run_plan` returns.
    #[inline(always)]
    fn run_kept_plan(
        &mut self,
        id: BlockId,
        kept: &[u64],
        out: &mut impl Charge,
    ) -> Option<Option<(usize, u64)>> {
        let described = self.blocks.get(id.0 as usize)?.data.len as usize;
        let line_bits = self.kept_line_bits;
        // A straddling access's word holds its first line: its last byte
        // with the access's size touches that line and the next.
        let steps = kept.iter().map(move |&w| {
            let k = KeptAccess(w);
            (k.operand(), k.reference(line_bits).0)
        });
        self.run_steps(id, steps, described, out)
    }

    /// One execution of block `id` making the data accesses `steps` (each
    /// the index of its operand and its address, in order: all of them or
    /// those a filter kept), `available` operands being accounted for: the
    /// block's fetches and accesses through the caches, misses charged.
    #[inline(always)]
    fn run_steps(
        &mut self,
        id: BlockId,
        steps: impl Iterator<Item = (usize, u64)>,
        available: usize,
        out: &mut impl Charge,
    ) -> Option<Option<(usize, u64)>> {
        let plan = self.blocks.get_mut(id.0 as usize)?;
        let last = plan.last();
        plan.runs += 1;
        let Some(sim) = &mut self.caches else {
            return Some(last);
        };
        let repeat = (plan.repeats_free && self.last_run == Some(id.0))
            || (plan.distinct_sets && plan.i1_changes == sim.i1_changes());
        self.last_run = Some(id.0);
        let cols = self.cols;
        let fetches = plan.fetches.of(&self.arenas.fetch_ops);
        let data = plan.data.of(&self.arenas.data_ops);
        // I1 and D1 meet only in LL, so the fetches go through I1 first, on
        // their own, and only an I1 miss (rare) needs its LL access put
        // back in order among the data accesses': exact, and the loops
        // need no dispatch per step.
        let mut missed = 0u64;
        if !repeat && fetches.len() <= 64 && available == data.len() {
            for (k, f) in fetches.iter().enumerate() {
                missed |= u64::from(sim.i1_is_miss(f.addr, u32::from(f.len))) << k;
            }
            plan.i1_changes = sim.i1_changes();
        } else if !repeat {
            // Long blocks (or a producer giving too few addresses): each
            // fetch where it comes.
            interleaved(sim, fetches, data, steps, available, None, cols.instr, out);
            plan.i1_changes = sim.i1_changes();
            return Some(last);
        }
        if missed == 0 {
            for (op, addr) in steps {
                if let Some(d) = data.get(op) {
                    d.run(sim, addr, out);
                }
            }
        } else {
            interleaved(
                sim,
                fetches,
                data,
                steps,
                available,
                Some(missed),
                cols.instr,
                out,
            );
        }
        Some(last)
    }

    /// Kept references of an execution of block `id` counted elsewhere
    /// (see [`events::Tool::kept_accesses`]), in execution order (each
    /// instruction's fetch before its data references): each goes through
    /// I1 or D1 as its word says, without the block's plan; only a miss
    /// (rare) looks the plan up, for the slot it is charged to, and goes on
    /// to LL at once.
    #[inline(always)]
    pub fn kept_accesses(&mut self, id: BlockId, kept: &[u64], out: &mut impl Charge) {
        // Fetches not seen here: the next full run must simulate its own.
        self.last_run = None;
        for &w in kept {
            let k = KeptAccess(w);
            let (addr, size) = k.reference(self.kept_line_bits);
            if self.l1_is_miss(k.is_fetch(), addr, size) {
                self.miss_to_ll(id.0, k.is_fetch(), k.operand(), addr, size, out);
            }
        }
    }

    /// Block `id`'s references are named by sites from `first` on (see
    /// [`Tool::block_sites`]); `id` is described.
    pub fn name_sites(&mut self, id: BlockId, first: u32) {
        let i = id.0 as usize;
        let Some(plan) = self.blocks.get(i) else {
            return;
        };
        let (data, fetches) = (plan.data.len, plan.fetches.len);
        let (first, end) = (first as usize, first as usize + (data + fetches) as usize);
        if self.site_tallies.len() < end {
            self.site_tallies.resize(end, SiteTally::NONE);
        }
        // The block's operands' sites first, then its fetches'.
        let references = (0..data).chain((0..fetches).map(|f| f | SITE_FETCH));
        for (t, reference) in self.site_tallies[first..end].iter_mut().zip(references) {
            *t = SiteTally {
                block: id.0,
                reference,
                l1_misses: 0,
                ll_misses: 0,
            };
        }
    }

    /// Kept references as site words (see [`Tool::site_accesses`]), in
    /// execution order, those at the start of `words`: each goes through
    /// I1 or D1 as its word says, and a miss (rare) on to LL at once,
    /// charged to the slot its site names. Branch words among them go
    /// through the predictor. Returns how many words were site words.
    #[inline(always)]
    pub fn site_accesses(&mut self, words: &[u64], out: &mut impl Charge) -> usize {
        // Fetches not seen here: the next full run must simulate its own.
        self.last_run = None;
        let line_bits = self.kept_line_bits;
        let mut i = 0;
        while i < words.len() {
            let w = words[i];
            if !SiteWords::is_site_word(w) {
                break;
            }
            i += 1;
            let line = self.site_words.line(w);
            let straddles = SiteWords::straddles(w);
            // The line number is the word's: no address to take apart.
            let miss = self
                .caches
                .as_mut()
                .is_some_and(|sim| sim.l1_line_is_miss(SiteWords::is_fetch(w), line, straddles));
            if miss {
                // LL's reference: the last byte of the first line and the
                // first of the next, or the line's start.
                let (addr, size) = match straddles {
                    true => ((line << line_bits) | ((1 << line_bits) - 1), 2),
                    false => (line << line_bits, 1),
                };
                self.site_miss_to_ll(w, addr, size, out);
            }
        }
        i
    }

    /// Branch words ([`Tool::branch_words`](events::Tool::branch_words),
    /// last first) through the predictor in execution order,
    /// mispredictions tallied per block (executions come with its runs).
    /// They come in a stream of their own, apart from the kept references
    /// (the predictor and the caches share nothing), so that this loop has
    /// no branch the host cannot guess, its counters' loads overlap, and
    /// the caches' loop never meets a branch word (interleaved, a python
    /// run's 1.5 G branch words cost the consumer 7 ns each).
    pub fn branch_words(&mut self, words: &[u32]) {
        let Some(bp) = &mut self.branches else {
            return;
        };
        for b in BranchWords::decode(words) {
            let block = b.block as usize;
            let (Some(&pc), Some(misses)) = (
                self.branch_pcs.get(block),
                self.branch_misses.get_mut(block),
            ) else {
                continue;
            };
            let pc = u64::from(pc);
            let mispredicted = match b.target {
                Some(target) => bp.indirect(pc, target),
                None => bp.cond(pc, b.taken),
            };
            // Without a branch: the host would mispredict as often as the
            // model.
            *misses += u64::from(mispredicted);
        }
    }

    /// Whether a kept reference (a fetch, else a data reference) misses
    /// its L1 cache.
    #[inline(always)]
    fn l1_is_miss(&mut self, fetch: bool, addr: u64, size: u32) -> bool {
        match (&mut self.caches, fetch) {
            (Some(sim), true) => sim.i1_is_miss(addr, size),
            (Some(sim), false) => sim.d1_is_miss(addr, size),
            (None, _) => false,
        }
    }

    /// The L1 miss of a site word: its LL reference made, both misses
    /// tallied at the site (a site that names no reference of the word's
    /// kind is ignored, LL reference and all).
    #[inline(always)]
    fn site_miss_to_ll(&mut self, word: u64, addr: u64, size: u32, out: &mut impl Charge) {
        let site = self.site_words.site(word) as usize;
        let (Some(t), Some(sim)) = (self.site_tallies.get_mut(site), &mut self.caches) else {
            return;
        };
        let fetch = SiteWords::is_fetch(word);
        if t.block == u32::MAX || t.is_fetch() != fetch {
            return;
        }
        let ll_miss = match fetch {
            true => sim.instr_ll_is_miss(addr, size),
            false => sim.data_ll_is_miss(addr, size),
        };
        t.l1_misses += 1;
        t.ll_misses += u32::from(ll_miss);
        if t.l1_misses == u32::MAX {
            self.charge_site(site, out);
        }
    }

    /// A kept reference that missed L1, fetch or data operand `index` of
    /// block `block`: its L1 miss charged, its LL reference made and an LL
    /// miss charged.
    #[inline(never)]
    fn miss_to_ll(
        &mut self,
        block: u32,
        fetch: bool,
        index: usize,
        addr: u64,
        size: u32,
        out: &mut impl Charge,
    ) {
        let (Some((slot, first)), Some(sim)) = (self.place(block, fetch, index), &mut self.caches)
        else {
            return;
        };
        let ll_miss = match fetch {
            true => sim.instr_ll_is_miss(addr, size),
            false => sim.data_ll_is_miss(addr, size),
        };
        out.add(slot, first + 1, 1);
        if ll_miss {
            out.add(slot, first + 2, 1);
        }
    }

    /// Where the misses of fetch (else data operand) `index` of block
    /// `block` are charged: its instruction's slot and the first column
    /// of its group (`I1mr`'s, `D1mr`'s or `D1mw`'s is one on).
    fn place(&self, block: u32, fetch: bool, index: usize) -> Option<(usize, usize)> {
        let plan = self.blocks.get(block as usize)?;
        match fetch {
            true => plan
                .fetches
                .of(&self.arenas.fetch_ops)
                .get(index)
                .map(|f| (f.slot as usize, self.cols.instr)),
            false => plan
                .data
                .of(&self.arenas.data_ops)
                .get(index)
                .map(|d| (d.slot as usize, usize::from(d.first))),
        }
    }

    /// Block `id` ran `runs` more times (counted by the producer).
    pub fn add_runs(&mut self, id: BlockId, runs: u64) {
        if let Some(plan) = self.blocks.get_mut(id.0 as usize) {
            plan.runs += runs;
        }
        // Each counted execution ends in its branch.
        if let Some(t) = self.branch_tallies.get_mut(id.0 as usize) {
            t.executed += runs;
        }
    }

    /// The filter a producer may apply to the data references it delivers
    /// (see [`events::MruFilter`]): D1's geometry when the caches are
    /// simulated and all three have one line size (then no access is
    /// capped below a line, and an access within one D1 line is within
    /// one LL line).
    /// With the branch predictor too, branch words tell the outcomes among
    /// the kept references (see [`SiteWords`]), and indirect branches that
    /// hit the producer's copy of the predictor's target table need none.
    ///
    /// Branches alone (no caches) take the same counted form: a filter
    /// with nothing to check (the producer is given no reference), so
    /// that executions are counted and the branches come as branch words,
    /// not as a record per block execution (which made python-json's
    /// branch simulation slower than Cachegrind's).
    pub fn mru_filter(&self) -> Option<MruFilter> {
        let indirect_bits = self.branches.as_ref().and_then(|bp| bp.btac_index_bits());
        let Some(sim) = self.caches.as_ref() else {
            return self.branches.as_ref().map(|_| MruFilter {
                line_bits: 6,
                set_bits: 0,
                fetch_set_bits: Some(0),
                indirect_bits,
            });
        };
        let (i1, d1, ll) = (sim.i1(), sim.d1(), sim.ll());
        if i1.line_size != d1.line_size || ll.line_size != d1.line_size {
            return None;
        }
        Some(MruFilter {
            line_bits: d1.line_size.trailing_zeros() as u8,
            set_bits: d1.sets().trailing_zeros() as u8,
            fetch_set_bits: Some(i1.sets().trailing_zeros() as u8),
            indirect_bits,
        })
    }

    /// One instruction fetch outside a described block's run (a trace's
    /// fetch, a rep instruction's final check): its outcome, if caches are
    /// simulated.
    #[inline]
    pub fn fetch(&mut self, addr: u64, len: u32) -> Option<Outcome> {
        self.last_run = None;
        self.caches.as_mut().map(|sim| sim.instr(addr, len))
    }

    /// One data access outside a block's run, if caches are simulated.
    #[inline]
    pub fn data(&mut self, addr: u64, size: u32) -> Option<Outcome> {
        self.caches.as_mut().map(|sim| sim.data(addr, size))
    }

    /// A conditional branch: whether it was mispredicted, if branches are
    /// simulated.
    #[inline]
    pub fn cond(&mut self, pc: u64, taken: bool) -> Option<bool> {
        self.branches.as_mut().map(|bp| bp.cond(pc, taken))
    }

    /// An indirect branch: whether it was mispredicted, if branches are
    /// simulated.
    #[inline]
    pub fn indirect(&mut self, pc: u64, target: u64) -> Option<bool> {
        self.branches.as_mut().map(|bp| bp.indirect(pc, target))
    }

    /// The first column of the `[refs, L1 misses, LL misses]` group of an
    /// access of `kind` (Dr or Dw).
    pub fn data_column(&self, kind: AccessKind) -> usize {
        match kind {
            AccessKind::Read => self.cols.read,
            AccessKind::Modify if !self.modify_as_write => self.cols.read,
            AccessKind::Modify | AccessKind::Write => self.cols.write,
        }
    }

    /// The columns of Ir's group, of Dr's and of Dw's, of `Bc`/`Bcm` and of
    /// `Bi`/`Bim` (0 for a group not collected).
    pub fn columns(&self) -> [usize; 5] {
        let c = self.cols;
        [c.instr, c.read, c.write, c.cond, c.indirect]
    }

    /// Cold caches and predictor, as after Callgrind's instrumentation
    /// switch.
    pub fn clear(&mut self) {
        if let Some(c) = &self.caches {
            self.caches = Some(CacheSim::new(c.i1(), c.d1(), c.ll()));
            // The new I1 counts its changes from 0 again.
            for plan in &mut self.blocks {
                plan.i1_changes = u64::MAX;
            }
        }
        if self.branches.is_some() {
            self.branches = Some(BranchPredictor::new());
        }
        self.last_run = None;
    }
}

/// Cachegrind as a [`Tool`]: Ir from instruction fetches, and, when
/// simulated, the I1/D1/LL events (spec §1) and the branch events (§3),
/// each charged to its instruction's row of a [`CostTable`].
///
/// Data references before any instruction fetch (possible in a `din`
/// trace) are charged to address 0.
#[derive(Debug, Clone)]
pub struct CachegrindTool {
    table: CostTable,
    cols: Columns,
    sim: BlockSim,
    /// Slot and address of the latest fetched instruction, which data
    /// references and branch records belong to (the address at hand, a
    /// branch record is matched without loading the table's).
    current: Option<(usize, u64)>,
    /// The block entered last and how many of its instructions have been
    /// fetched since: fetches inside it need no address lookup.
    in_block: Option<(usize, usize)>,
    /// I1, D1 and LL as simulated (what the profile's `desc:` lines say),
    /// kept apart from the model, which [`end`](Self::end) frees.
    geometry: Option<[CacheConfig; 3]>,
}

impl CachegrindTool {
    /// A tool that simulates `caches` (cold) if given, and the branch
    /// predictor if `branch_sim`; Ir is always counted.
    pub fn new(caches: Option<CacheSim>, branch_sim: bool) -> CachegrindTool {
        let geometry = caches.as_ref().map(|c| [c.i1(), c.d1(), c.ll()]);
        let sim = BlockSim::new(caches, branch_sim, false);
        let set = sim.events();
        CachegrindTool {
            table: CostTable::new(set),
            cols: Columns::of(set),
            sim,
            current: None,
            in_block: None,
            geometry,
        }
    }

    /// [`new`](Self::new) for a producer that reports block runs (the
    /// engine): block runs charge misses and branches alone (see
    /// [`BlockSim`]), so the table's rows store just those until
    /// [`finish`](Self::finish) (the few records of other kinds, a rep
    /// instruction's last check, go to rows on the side). Not for record
    /// streams: each record would go to a row on the side.
    ///
    /// The branch columns are stored because, where the producer has no
    /// filter (caches of unequal line sizes), every conditional branch and
    /// indirect transfer comes as a record of its own (the next block
    /// tells its outcome): on the side, each cost a hash lookup (a quarter
    /// of a python run's consumer time, when branches alone took that
    /// path). With the filter, branches are tallied per block.
    pub fn for_block_runs(caches: Option<CacheSim>, branch_sim: bool) -> CachegrindTool {
        let mut tool = CachegrindTool::new(caches, branch_sim);
        let set = tool.events();
        let stored = [Event::I1mr, Event::ILmr, Event::D1mr, Event::DLmr]
            .into_iter()
            .chain([Event::D1mw, Event::DLmw])
            .chain([Event::Bc, Event::Bcm, Event::Bi, Event::Bim]);
        let stored: Vec<usize> = stored.filter_map(|e| set.index(e)).collect();
        tool.table = CostTable::storing(set, &stored);
        tool
    }

    /// Adds the events of the block executions reported through
    /// [`Tool::block_run`] so far to the table: their Ir, Dr and Dw are
    /// counted per block, not per execution. Call it before reading
    /// [`table`](Self::table) or [`totals`](Self::totals) after block runs.
    pub fn finish(&mut self) {
        self.table.widen();
        self.sim.charge_tallies(&mut self.table);
        let cols = self.cols;
        let cache = self.events().cache_sim();
        let arenas = &self.sim.arenas;
        for plan in &mut self.sim.blocks {
            let runs = std::mem::take(&mut plan.runs);
            if runs == 0 {
                continue;
            }
            let slots = plan.instrs.of(&arenas.slots);
            for (&slot, &(reads, writes)) in slots.iter().zip(plan.instrs.of(&arenas.accesses)) {
                let row = self.table.row_mut(slot as usize);
                row[cols.ir] += runs;
                if cache {
                    row[cols.read] += runs * u64::from(reads);
                    row[cols.write] += runs * u64::from(writes);
                }
            }
        }
    }

    /// The run is over: adds what [`finish`](Self::finish) adds, then
    /// frees the model (cache tags, predictor state, block plans), keeping
    /// the costs and the geometry the profile names. The attribution that
    /// follows allocates about as much again, and with the model still
    /// held the two made the run's peak memory (a 256 MB LL alone has
    /// 16 MiB of tags). The caches go first, before the table widens to
    /// full rows in their place. Block runs after it are not simulated.
    pub fn end(&mut self) {
        self.sim.caches = None;
        self.finish();
        self.sim = BlockSim::new(None, false, self.sim.modify_as_write);
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
        if let Some([i1, d1, ll]) = &self.geometry {
            p.desc = vec![
                format!("I1 cache:         {}", i1.desc()),
                format!("D1 cache:         {}", d1.desc()),
                format!("LL cache:         {}", ll.desc()),
            ];
        }
        p
    }

    /// A run of a block never described: the general path, which looks
    /// slots up. Out of line, so that the block path inlines into the
    /// engine's decoding loop.
    #[inline(never)]
    fn undescribed_run(&mut self, id: BlockId, info: &BlockInfo, addrs: &[u64]) {
        let mut records = Vec::new();
        events::expand_block_run(id, info, addrs, &mut records);
        self.records(&records);
    }

    /// The slot of the instruction fetched at `addr`: the next one of the
    /// current block if it is that, else looked up.
    #[inline(always)]
    fn fetch_slot(&mut self, addr: u64) -> usize {
        if let Some((block, pos)) = &mut self.in_block {
            let plan = &self.sim.blocks[*block];
            match plan.instrs.of(&self.sim.arenas.slots).get(*pos) {
                Some(&slot) if self.table.addr(slot as usize) == addr => {
                    *pos += 1;
                    return slot as usize;
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
            Some((cur, addr)) if addr == pc => cur,
            _ => self.table.slot(pc),
        }
    }
}

/// An instruction fetch of a block's plan.
#[derive(Debug, Clone, Copy)]
struct FetchOp {
    /// The instruction's address.
    addr: u64,
    /// Its slot.
    slot: u32,
    /// Its length.
    len: u8,
    /// How many of the block's data accesses come before it.
    data_before: u16,
}

/// A data access of a block's plan: the block's next memory operand (the
/// next reported address) for the instruction in `slot`; misses go to the
/// columns after `first` (Dr or Dw).
#[derive(Debug, Clone, Copy)]
struct DataOp {
    slot: u32,
    /// Bytes, at most [`CacheSim::max_access`].
    size: u16,
    first: u16,
}

impl DataOp {
    /// Simulates the access at `addr`, charging its misses.
    #[inline(always)]
    fn run(self, sim: &mut CacheSim, addr: u64, out: &mut impl Charge) {
        let outcome = sim.data(addr, u32::from(self.size));
        if outcome.l1_miss() {
            out.add(self.slot as usize, self.first as usize + 1, 1);
            if outcome.ll_miss() {
                out.add(self.slot as usize, self.first as usize + 2, 1);
            }
        }
    }
}

/// A block execution with each fetch's LL access in its place among the
/// data accesses: `steps` are the data accesses made, each the index of
/// its operand in `data` and its address, in order (all of them, or those
/// an MRU filter kept); `missed` has bit k set if fetch k missed I1
/// (already simulated), or is `None` when I1 is still to be simulated here
/// too. Fetch misses go to the columns after `instr` (Ir). Stops at the
/// first fetch that follows more than `available` operands (a producer
/// that gave too few addresses).
#[allow(clippy::too_many_arguments)]
#[inline(never)]
fn interleaved(
    sim: &mut CacheSim,
    fetches: &[FetchOp],
    data: &[DataOp],
    steps: impl Iterator<Item = (usize, u64)>,
    available: usize,
    missed: Option<u64>,
    instr: usize,
    out: &mut impl Charge,
) {
    let mut steps = steps.peekable();
    for (k, f) in fetches.iter().enumerate() {
        let before = usize::from(f.data_before);
        while let Some((op, addr)) = steps.next_if(|&(op, _)| op < before) {
            if let Some(d) = data.get(op) {
                d.run(sim, addr, out);
            }
        }
        if before > available {
            return;
        }
        let len = u32::from(f.len);
        let l1_miss = match missed {
            Some(bits) => bits >> k & 1 != 0,
            None => sim.i1_is_miss(f.addr, len),
        };
        if l1_miss {
            // Ir itself is counted per block.
            out.add(f.slot as usize, instr + 1, 1);
            if sim.instr_ll_is_miss(f.addr, len) {
                out.add(f.slot as usize, instr + 2, 1);
            }
        }
    }
    for (op, addr) in steps {
        if let Some(d) = data.get(op) {
            d.run(sim, addr, out);
        }
    }
}

/// What one execution of a block does to the models, worked out when the
/// block is described, and how many executions are not yet in the table:
/// what a run reads and writes, in one cache line.
#[derive(Debug, Clone, Default)]
#[repr(align(64))]
struct BlockPlan {
    /// Executions reported since the last [`CachegrindTool::finish`].
    runs: u64,
    /// I1's count of changes after this block's last simulated fetches
    /// (`u64::MAX`: none yet).
    i1_changes: u64,
    /// The slot of its last instruction and its address: a branch ending
    /// the block is charged to it (slot `usize::MAX`: the block is empty).
    last_slot: usize,
    last_addr: u64,
    /// Instruction fetches in execution order, in the fetch arena: those
    /// of [`events::fetch_starts`]. A fetch that lies within the line the
    /// previous fetch of the block touched last is left out: that line is
    /// the most recently used of its I1 set (only data accesses, which do
    /// not touch I1, came in between), so the fetch hits and changes
    /// nothing: exact, and most fetches of a block go.
    fetches: Span,
    /// Data accesses in execution order, in the data arena.
    data: Span,
    /// Its instructions' slots and accesses per execution, in those
    /// arenas: for the end of the run and the general path.
    instrs: Span,
    /// No I1 set receives more of its lines than it has ways. Then after
    /// one execution all its lines are cached, on top of their sets in the
    /// order the block last touched them; an execution that directly
    /// follows (a tight loop) hits every line and leaves exactly that
    /// state again, so its fetches need no simulation.
    repeats_free: bool,
    /// Its lines fall in distinct I1 sets. Then after an execution each is
    /// the most recently used line of its set, and stays so while no I1
    /// reference changes the tag store: an execution that finds I1's
    /// [`CacheSim::i1_changes`] as the last one left it (`i1_changes`) hits
    /// on every line and changes nothing, so its fetches need no
    /// simulation (the blocks of a loop that fits in I1, however many).
    distinct_sets: bool,
}

// A plan stays one cache line.
const _: () = assert!(std::mem::size_of::<BlockPlan>() == 64);

/// The plans' steps and instructions, each plan's together: arenas, where
/// consecutive blocks' steps are near each other and a block costs no
/// allocation of its own (two per block, for its instructions' slots and
/// accesses, were 5 MB of a python run's).
#[derive(Debug, Clone, Default)]
struct Arenas {
    /// Fetches, each plan's in execution order.
    fetch_ops: Vec<FetchOp>,
    /// Data accesses, likewise.
    data_ops: Vec<DataOp>,
    /// Per instruction: its slot.
    slots: Vec<u32>,
    /// Per instruction: reads (and modifies) and writes per execution.
    accesses: Vec<(u16, u16)>,
}

/// A plan's steps in an arena.
#[derive(Debug, Clone, Copy, Default)]
struct Span {
    start: u32,
    len: u32,
}

impl Span {
    /// The steps `items` pushed onto `arena`, as a span of it.
    fn push<T>(arena: &mut Vec<T>, items: Vec<T>) -> Span {
        let start = u32::try_from(arena.len()).expect("plan arenas stay below 4G steps");
        let len = u32::try_from(items.len()).expect("steps per block fit u32");
        arena.extend(items);
        Span { start, len }
    }

    /// The steps in `arena`.
    #[inline(always)]
    fn of<T>(self, arena: &[T]) -> &[T] {
        let start = self.start as usize;
        &arena[start..start + self.len as usize]
    }
}

/// What a block's plan needs of the I1 geometry.
#[derive(Debug, Clone, Copy)]
struct I1Shape {
    /// Line size.
    line: u64,
    /// Sets.
    sets: u64,
    /// Lines it holds.
    lines_held: u64,
    /// [`CacheSim::max_access`].
    max_access: u32,
}

impl BlockPlan {
    /// The plan of `info`, whose instructions have `slots`; `i1` is the I1
    /// line size and the number of lines it holds when caches are simulated
    /// (else only the access counts matter). Its steps go to the `arenas`
    /// of fetches and data accesses.
    fn new(
        info: &BlockInfo,
        slots: &[usize],
        cols: Columns,
        i1: Option<I1Shape>,
        modify_as_write: bool,
        arenas: &mut Arenas,
    ) -> BlockPlan {
        let i1_line = i1.map(|i1| i1.line);
        let max_access = i1.map_or(u32::MAX, |i1| i1.max_access);
        let line = i1_line.unwrap_or(64);
        // Instructions are contiguous: the block touches every line from its
        // first to its last.
        let lines = (info.end().max(info.start() + 1) - 1) / line - info.start() / line + 1;
        let repeats_free = i1.is_some_and(|i1| lines <= i1.lines_held);
        let distinct_sets = i1.is_some_and(|i1| lines <= i1.sets);
        let mut fetches = Vec::new();
        let mut data = Vec::new();
        let mut accesses = Vec::with_capacity(slots.len());
        let mut starts = events::fetch_starts(info, line.trailing_zeros() as u8).peekable();
        for (n, (i, &slot)) in info.instrs().iter().zip(slots.iter()).enumerate() {
            if starts.next_if_eq(&n).is_some() {
                fetches.push(FetchOp {
                    addr: i.addr,
                    slot: slot as u32,
                    len: i.len,
                    data_before: u16::try_from(data.len()).expect("operands per block fit u16"),
                });
            }
            let (mut reads, mut writes) = (0u16, 0u16);
            for m in info.mem_operands(n) {
                let write = match m.kind {
                    AccessKind::Read => false,
                    AccessKind::Modify => modify_as_write,
                    AccessKind::Write => true,
                };
                let first = if write {
                    writes += 1;
                    cols.write
                } else {
                    reads += 1;
                    cols.read
                };
                data.push(DataOp {
                    slot: slot as u32,
                    size: u16::try_from(m.size.min(max_access)).unwrap_or(u16::MAX),
                    first: first as u16,
                });
            }
            accesses.push((reads, writes));
        }
        if i1_line.is_none() {
            fetches.clear();
            data.clear();
        }
        let (last_slot, last_addr) = slots
            .last()
            .copied()
            .zip(info.instrs().last().map(|i| i.addr))
            .unwrap_or((usize::MAX, 0));
        let plan = BlockPlan {
            runs: 0,
            i1_changes: u64::MAX,
            last_slot,
            last_addr,
            fetches: Span::push(&mut arenas.fetch_ops, fetches),
            data: Span::push(&mut arenas.data_ops, data),
            instrs: Span::push(&mut arenas.accesses, accesses),
            repeats_free,
            distinct_sets,
        };
        // One slot per access entry: the two arenas share the span.
        let slots = slots.iter().take(plan.instrs.len as usize);
        let slots = slots.map(|&s| u32::try_from(s).expect("slots fit u32"));
        arenas.slots.extend(slots);
        plan
    }

    /// The slot and address of the block's last instruction, if it has
    /// one.
    #[inline(always)]
    fn last(&self) -> Option<(usize, u64)> {
        (self.last_slot != usize::MAX).then_some((self.last_slot, self.last_addr))
    }
}

impl Tool for CachegrindTool {
    fn needs(&self) -> Needs {
        let cache = self.sim.caches.is_some();
        let branch = self.sim.branches.is_some();
        Needs {
            instr_fetches: cache,
            data_refs: cache,
            cond_branches: branch,
            indirect_targets: branch,
            calls_returns: false,
            mru_filter: self.sim.mru_filter(),
        }
    }

    fn block(&mut self, id: BlockId, info: &BlockInfo) {
        let slots: Box<[usize]> = info
            .instrs()
            .iter()
            .map(|i| self.table.slot(i.addr))
            .collect();
        self.sim.describe(id, info, slots);
    }

    #[inline(always)]
    fn block_run(&mut self, id: BlockId, info: &BlockInfo, addrs: &[u64]) {
        debug_assert_eq!(addrs.len(), info.mem_count());
        self.in_block = None;
        match self.sim.run_plan(id, addrs, &mut self.table) {
            Some(last) => self.current = last,
            None => self.undescribed_run(id, info, addrs),
        }
    }

    #[inline(always)]
    fn block_run_kept(&mut self, id: BlockId, info: &BlockInfo, kept: &[u64]) {
        self.in_block = None;
        match self.sim.run_kept_plan(id, kept, &mut self.table) {
            Some(last) => self.current = last,
            None => {
                let mut records = Vec::new();
                events::expand_kept_run(id, info, kept, &mut records);
                self.records(&records);
            }
        }
    }

    fn kept_accesses(&mut self, id: BlockId, _info: &BlockInfo, kept: &[u64]) {
        self.sim.kept_accesses(id, kept, &mut self.table);
    }

    #[inline(always)]
    fn counted_access(&mut self, id: BlockId, kept: KeptAccess) {
        self.sim.kept_accesses(id, &[kept.0], &mut self.table);
    }

    fn block_runs(&mut self, id: BlockId, runs: u64) {
        self.sim.add_runs(id, runs);
    }

    fn block_sites(&mut self, id: BlockId, first: u32) {
        self.sim.name_sites(id, first);
    }

    #[inline(always)]
    fn site_accesses(&mut self, words: &[u64]) -> usize {
        self.sim.site_accesses(words, &mut self.table)
    }

    fn branch_words(&mut self, words: &[u32]) {
        self.sim.branch_words(words);
    }

    #[inline(always)]
    fn record(&mut self, record: Record) {
        let cols = self.cols;
        match record {
            Record::Block(id) => self.in_block = Some((id.0 as usize, 0)),
            Record::Instr(f) => {
                let slot = self.fetch_slot(f.addr);
                self.current = Some((slot, f.addr));
                match self.sim.fetch(f.addr, f.len) {
                    Some(outcome) => charge(self.table.row_mut(slot), cols.instr, outcome),
                    None => self.table.add(slot, cols.ir, 1),
                }
            }
            Record::Data(d) => {
                if let Some(outcome) = self.sim.data(d.addr, d.size) {
                    let slot = match self.current {
                        Some((cur, _)) => cur,
                        None => self.table.slot(0),
                    };
                    // A modify is one access, counted as a read (spec §1.4).
                    let first = self.sim.data_column(d.kind);
                    charge(self.table.row_mut(slot), first, outcome);
                }
            }
            Record::CondBranch(b) => {
                if let Some(mispredicted) = self.sim.cond(b.pc, b.taken) {
                    let slot = self.branch_slot(b.pc);
                    charge_branch(&mut self.table, slot, cols.cond, mispredicted);
                }
            }
            Record::Indirect(t) => {
                if let Some(mispredicted) = self.sim.indirect(t.pc, t.target) {
                    let slot = self.branch_slot(t.pc);
                    charge_branch(&mut self.table, slot, cols.indirect, mispredicted);
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

    /// Fetch misses a `BlockSim` charges, by slot.
    #[derive(Default)]
    struct Misses(Vec<(usize, usize)>);

    impl Charge for Misses {
        fn add(&mut self, slot: usize, col: usize, _n: u64) {
            self.0.push((slot, col));
        }
    }

    /// After `clear` (cold caches, whose count of I1 changes starts over)
    /// a block's fetches are simulated again, not taken for hits because
    /// the count happens to be where the block left it.
    #[test]
    fn cleared_caches_miss_again() {
        let mut sim = BlockSim::new(Some(caches()), false, false);
        // Two one-line blocks in different I1 sets.
        for (id, at) in [(0u32, 0x40_1000u64), (1, 0x40_1040)] {
            let mut b = BlockInfo::new(at, Terminator::FallThrough);
            b.push(at, 4, &[]);
            sim.describe(BlockId(id), &b, vec![id as usize].into());
        }
        let mut m = Misses::default();
        // Block 0 misses: I1 has made one change since it was cold.
        assert!(sim.run(BlockId(0), &[], &mut m));
        assert_eq!(m.0, [(0, 1), (0, 2)]);
        sim.clear();
        // Block 1 misses the cold I1: one change again.
        m.0.clear();
        assert!(sim.run(BlockId(1), &[], &mut m));
        assert_eq!(m.0, [(1, 1), (1, 2)]);
        // Block 0 misses too, though I1's count is where its run left it.
        m.0.clear();
        assert!(sim.run(BlockId(0), &[], &mut m));
        assert_eq!(m.0, [(0, 1), (0, 2)]);
        // Warm now: a run after block 1 makes no fetch at all.
        sim.run(BlockId(1), &[], &mut m);
        m.0.clear();
        assert!(sim.run(BlockId(0), &[], &mut m));
        assert!(m.0.is_empty());
    }

    /// A site's misses are tallied and charged at the end, and a tally
    /// about to overflow its 32 bits is charged at once: no miss is lost
    /// or counted twice either way.
    #[test]
    fn site_tallies_are_charged_once_whatever_their_size() {
        let mut sim = BlockSim::new(Some(caches()), false, false);
        let mut b = BlockInfo::new(0x40_1000, Terminator::FallThrough);
        b.push(
            0x40_1000,
            4,
            &[MemOperand {
                size: 8,
                kind: AccessKind::Read,
            }],
        );
        sim.describe(BlockId(0), &b, vec![7].into());
        // Site 1 is the load, site 2 the fetch.
        sim.name_sites(BlockId(0), 1);
        let layout = SiteWords::new(6);
        let mut m = Totals::default();
        // Lines of one D1 set, far apart: each misses D1 and LL.
        let d1_sets = u64::from(caches().d1().sets());
        let word = |n: u64| layout.word(1, false, false, 0x10_0000 + n * d1_sets * 1024);
        assert_eq!(sim.site_accesses(&[word(0), word(1)], &mut m), 2);
        // Tallied, not charged yet.
        assert!(m.0.is_empty());
        sim.site_tallies[1].l1_misses = u32::MAX - 1;
        sim.site_tallies[1].ll_misses = 5;
        sim.site_accesses(&[word(2)], &mut m);
        assert_eq!(m.0, [((7, 4), u64::from(u32::MAX)), ((7, 5), 6)]);
        sim.site_accesses(&[word(3)], &mut m);
        sim.charge_tallies(&mut m);
        assert_eq!(m.total(7, 4), u64::from(u32::MAX) + 1);
        assert_eq!(m.total(7, 5), 7);
        // Nothing is left to charge twice.
        m.0.clear();
        sim.charge_tallies(&mut m);
        assert!(m.0.is_empty());
    }

    /// What a `BlockSim` charges, add by add.
    #[derive(Default)]
    struct Totals(Vec<((usize, usize), u64)>);

    impl Charge for Totals {
        fn add(&mut self, slot: usize, col: usize, n: u64) {
            self.0.push(((slot, col), n));
        }
    }

    impl Totals {
        fn total(&self, slot: usize, col: usize) -> u64 {
            self.0
                .iter()
                .filter(|(at, _)| *at == (slot, col))
                .map(|(_, n)| n)
                .sum()
        }
    }

    /// A xorshift generator: each call gives a number below its argument.
    fn xorshift(mut seed: u64) -> impl FnMut(u64) -> u64 {
        move |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        }
    }

    /// A random program of `count` blocks, the first `long` of them of
    /// `long_len` instructions, the others of up to 12, each instruction
    /// with up to two memory operands of random sizes and kinds.
    fn random_blocks(
        rand: &mut impl FnMut(u64) -> u64,
        count: usize,
        long: usize,
        long_len: u64,
    ) -> Vec<BlockInfo> {
        let kinds = [AccessKind::Read, AccessKind::Write, AccessKind::Modify];
        let mut blocks = Vec::new();
        let mut at = 0x40_1000u64;
        for n in 0..count {
            let mut b = BlockInfo::new(at, Terminator::FallThrough);
            let instrs = if n < long { long_len } else { 1 + rand(12) };
            for _ in 0..instrs {
                let len = 1 + rand(15) as u8;
                let ops: Vec<MemOperand> = (0..rand(3))
                    .map(|_| MemOperand {
                        size: [1, 2, 4, 8, 16, 32][rand(6) as usize],
                        kind: kinds[rand(3) as usize],
                    })
                    .collect();
                b.push(at, len, &ops);
                at += u64::from(len);
            }
            at += rand(300);
            blocks.push(b);
        }
        blocks
    }

    /// Block `b` ending in `terminator` instead.
    fn ending_in(b: &BlockInfo, terminator: Terminator) -> BlockInfo {
        let mut e = BlockInfo::new(b.start(), terminator);
        for (n, i) in b.instrs().iter().enumerate() {
            e.push(i.addr, i.len, b.mem_operands(n));
        }
        e
    }

    /// Caches small enough for many misses: I1 as given, a 512-byte D1
    /// and a 2 KiB LL, both with 64-byte lines.
    fn small_caches(i1: CacheConfig) -> CacheSim {
        CacheSim::new(
            i1,
            CacheConfig::new(512, 2, 64),
            CacheConfig::new(2048, 4, 64),
        )
    }

    /// A tool's table, row by row in address order.
    fn rows(t: &CachegrindTool) -> Vec<(u64, Vec<u64>)> {
        let t = t.table();
        let mut v: Vec<(u64, Vec<u64>)> = (0..t.len())
            .map(|s| (t.addr(s), t.row(s).to_vec()))
            .collect();
        v.sort();
        v
    }

    /// Block runs (charged per block, fetches within the last line left
    /// out) give exactly the costs of the records they stand for, on a
    /// random program with small caches (many misses, straddling
    /// instructions and accesses).
    #[test]
    fn block_runs_equal_their_records() {
        let small = || small_caches(CacheConfig::new(128, 2, 32));
        let mut rand = xorshift(0x2545_f491_4f6c_dd1d);
        // A few blocks long enough to make more than 64 fetches (the plan's
        // I1 pass keeps a bit per fetch).
        let blocks = random_blocks(&mut rand, 40, 3, 200);
        // Narrow rows: the branch records go to rows on the side.
        let mut fast = CachegrindTool::for_block_runs(Some(small()), true);
        let mut slow = CachegrindTool::new(Some(small()), true);
        for (n, b) in blocks.iter().enumerate() {
            fast.block(BlockId(n as u32), b);
            slow.block(BlockId(n as u32), b);
        }
        let mut records = Vec::new();
        let mut repeats = 0;
        for _ in 0..20_000 {
            let n = rand(blocks.len() as u64) as usize;
            let b = &blocks[n];
            // Blocks also run several times in a row (loops), where the
            // fast path skips the fetches of blocks whose lines all fit in
            // I1 at once (in this test's I1 of four lines, not all do).
            for _ in 0..1 + rand(3) {
                let addrs: Vec<u64> = (0..b.mem_count()).map(|_| 0x60_0000 + rand(8192)).collect();
                let branch = Record::CondBranch(CondBranch {
                    pc: b.instrs().last().unwrap().addr,
                    taken: rand(2) == 0,
                });
                fast.block_run(BlockId(n as u32), b, &addrs);
                fast.record(branch);
                records.clear();
                events::expand_block_run(BlockId(n as u32), b, &addrs, &mut records);
                records.push(branch);
                slow.records(&records);
                repeats += 1;
            }
        }
        assert!(repeats > 30_000);
        fast.finish();
        assert_eq!(rows(&fast), rows(&slow));
        assert!(fast.totals().get(Event::D1mr) > 100);
        assert!(fast.totals().get(Event::I1mr) > 100);
    }

    /// What a producer applying the tool's MRU filter delivers of one run's
    /// addresses: per D1 set it remembers the line referenced last, and
    /// keeps the references that straddle lines (by address) or find
    /// another line on top (by their line's start).
    fn kept(filter: MruFilter, last: &mut [u64], b: &BlockInfo, addrs: &[u64]) -> Vec<u64> {
        let sizes = (0..b.instrs().len()).flat_map(|n| b.mem_operands(n).iter().map(|m| m.size));
        let mut kept = Vec::new();
        for (op, (&addr, size)) in addrs.iter().zip(sizes).enumerate() {
            let line = addr >> filter.line_bits;
            let end = (addr + u64::from(size) - 1) >> filter.line_bits;
            let set = |l: u64| (l & ((1 << filter.set_bits) - 1)) as usize;
            if line != end {
                // By its first line's start, as the engine keeps it.
                let start = line << filter.line_bits;
                kept.push(KeptAccess::new(op, start).straddling().0);
                last[set(line)] = line;
                last[set(end)] = end;
            } else if last[set(line)] != line {
                kept.push(KeptAccess::new(op, line << filter.line_bits).0);
                last[set(line)] = line;
            }
        }
        kept
    }

    /// The fetches of one execution of `b` a producer filtering them keeps
    /// (per I1 set, the line fetched last).
    fn kept_fetches(filter: MruFilter, last: &mut [u64], b: &BlockInfo) -> Vec<u64> {
        let sets = 1 << filter.fetch_set_bits.expect("fetches filtered");
        let set = |l: u64| (l & (sets - 1)) as usize;
        let mut kept = Vec::new();
        for (k, n) in events::fetch_starts(b, filter.line_bits).enumerate() {
            let i = b.instrs()[n];
            let line = i.addr >> filter.line_bits;
            let end = (i.addr + u64::from(i.len) - 1) >> filter.line_bits;
            if line != end || last[set(line)] != line {
                let word = KeptAccess::fetch(k, line << filter.line_bits);
                kept.push(if line != end { word.straddling() } else { word }.0);
                last[set(line)] = line;
                last[set(end)] = end;
            }
        }
        kept
    }

    /// Kept fetches and data references of one execution of `b` (each in
    /// its own order) merged as the engine writes them: each instruction's
    /// fetch before its data references.
    fn in_execution_order(b: &BlockInfo, fetches: Vec<u64>, data: Vec<u64>) -> Vec<u64> {
        let fetch_instr: Vec<usize> = events::fetch_starts(b, 6).collect();
        let data_instr: Vec<usize> = (0..b.instrs().len())
            .flat_map(|n| std::iter::repeat_n(n, b.mem_operands(n).len()))
            .collect();
        let mut words: Vec<(usize, bool, u64)> = fetches
            .into_iter()
            .map(|w| (fetch_instr[KeptAccess(w).operand()], false, w))
            .chain(
                data.into_iter()
                    .map(|w| (data_instr[KeptAccess(w).operand()], true, w)),
            )
            .collect();
        words.sort_by_key(|&(n, is_data, w)| (n, is_data, KeptAccess(w).operand()));
        words.into_iter().map(|(.., w)| w).collect()
    }

    #[test]
    fn filtered_runs_equal_full_runs() {
        let small = || small_caches(CacheConfig::new(256, 2, 64));
        let mut rand = xorshift(0x9e37_79b9_7f4a_7c15);
        // Blocks ending in conditional branches, indirect jumps and
        // neither, with the branch predictor simulated.
        let terminators = [
            Terminator::CondJump { target: 0x40_1000 },
            Terminator::IndirectJump,
            Terminator::FallThrough,
        ];
        let blocks: Vec<BlockInfo> = random_blocks(&mut rand, 30, 2, 100)
            .iter()
            .enumerate()
            .map(|(n, b)| ending_in(b, terminators[n % 3]))
            .collect();
        // Four ways to report the same executions: every address; the
        // data references an MRU filter keeps, executions reported one by
        // one; and the fetches and data references kept with executions
        // counted, each with its block's id or as a site word (branch
        // outcomes then in a stream of branch words beside them).
        let mut full = CachegrindTool::new(Some(small()), true);
        let mut filtered = CachegrindTool::new(Some(small()), true);
        let mut counted = CachegrindTool::new(Some(small()), true);
        let mut sited = CachegrindTool::for_block_runs(Some(small()), true);
        let layout = SiteWords::new(6);
        // Sites from 1 on: each block's operands', then its fetches'.
        let mut first_sites = Vec::new();
        let mut next_site = 1;
        for b in &blocks {
            first_sites.push(next_site);
            next_site += (b.mem_count() + events::fetch_starts(b, 6).count()) as u32;
        }
        let filter = filtered.needs().mru_filter.expect("one line size");
        assert_eq!((filter.line_bits, filter.set_bits), (6, 2));
        let fetch_filter = counted.needs().mru_filter.expect("one line size");
        assert_eq!(fetch_filter.fetch_set_bits, Some(1));
        for (n, b) in blocks.iter().enumerate() {
            full.block(BlockId(n as u32), b);
            filtered.block(BlockId(n as u32), b);
            counted.block(BlockId(n as u32), b);
            sited.block(BlockId(n as u32), b);
            sited.block_sites(BlockId(n as u32), first_sites[n]);
        }
        let mut last = vec![0u64; 4];
        let mut last_counted = vec![0u64; 4];
        let mut last_fetched = vec![0u64; 2];
        let mut runs = vec![0u64; blocks.len()];
        let (mut refs, mut delivered) = (0, 0);
        // The branch stream since the last hand-over, in execution order
        // (handed over last first, as a buffer fills with it from its end).
        let mut stream: Vec<u32> = Vec::new();
        let hand_over = |stream: &mut Vec<u32>, tools: [&mut CachegrindTool; 2]| {
            stream.reverse();
            for t in tools {
                t.branch_words(stream);
            }
            stream.clear();
        };
        for run in 0..20_000 {
            let n = rand(blocks.len() as u64) as usize;
            let b = &blocks[n];
            // Mostly four lines, one per set, so that many references find
            // theirs on top; some further away, which miss.
            let addrs: Vec<u64> = (0..b.mem_count())
                .map(|_| 0x60_0000 + if rand(8) == 0 { rand(8192) } else { rand(256) })
                .collect();
            // Where its branch (if any) goes, as a record and as words.
            let pc = b.instrs().last().unwrap().addr;
            let (branch, branch_words) = match b.terminator() {
                Terminator::CondJump { .. } => {
                    let taken = rand(3) != 0;
                    let mut words = Vec::new();
                    BranchWords::push_cond(&mut words, n as u32, taken);
                    (Some(Record::CondBranch(CondBranch { pc, taken })), words)
                }
                Terminator::IndirectJump => {
                    let target = 0x40_0000 + 16 * rand(40);
                    let mut words = Vec::new();
                    BranchWords::push_indirect(&mut words, n as u32, target);
                    (Some(Record::Indirect(Transfer { pc, target })), words)
                }
                _ => (None, Vec::new()),
            };
            full.block_run(BlockId(n as u32), b, &addrs);
            let kept_data = kept(filter, &mut last, b, &addrs);
            filtered.block_run_kept(BlockId(n as u32), b, &kept_data);
            if let Some(branch) = branch {
                full.record(branch);
                filtered.record(branch);
            }
            refs += addrs.len();
            delivered += kept_data.len();
            // In execution order: each instruction's fetch, then its data.
            let fetches = kept_fetches(fetch_filter, &mut last_fetched, b);
            let data = kept(filter, &mut last_counted, b, &addrs);
            let words = in_execution_order(b, fetches, data);
            for &w in &words {
                counted.counted_access(BlockId(n as u32), KeptAccess(w));
            }
            stream.extend(&branch_words);
            let site_words: Vec<u64> = words
                .iter()
                .map(|&w| {
                    let k = KeptAccess(w);
                    let at = k.operand() + if k.is_fetch() { b.mem_count() } else { 0 };
                    let site = first_sites[n] + at as u32;
                    layout.word(site, k.is_fetch(), k.straddles(), k.addr() >> 6)
                })
                .collect();
            sited.site_accesses(&site_words);
            if run % 97 == 0 {
                hand_over(&mut stream, [&mut counted, &mut sited]);
            }
            runs[n] += 1;
        }
        hand_over(&mut stream, [&mut counted, &mut sited]);
        for (n, &r) in runs.iter().enumerate() {
            counted.block_runs(BlockId(n as u32), r);
            sited.block_runs(BlockId(n as u32), r);
        }
        assert!(delivered < refs * 3 / 4, "{delivered} of {refs}");
        full.finish();
        filtered.finish();
        counted.finish();
        sited.finish();
        assert_eq!(rows(&full), rows(&counted));
        assert_eq!(rows(&full), rows(&sited));
        assert_eq!(rows(&full), rows(&filtered));
        assert!(full.totals().get(Event::Bcm) > 100);
        assert!(full.totals().get(Event::Bim) > 100);
        assert!(full.totals().get(Event::D1mr) > 100);
        assert!(full.totals().get(Event::DLmr) > 10);
        assert!(full.totals().get(Event::I1mr) > 100);
        // Different line sizes: no filter (an access within a D1 line may
        // straddle two of a shorter LL line, or be capped below a line).
        let mixed = CachegrindTool::new(Some(small_caches(CacheConfig::new(128, 2, 32))), false);
        assert_eq!(mixed.needs().mru_filter, None);
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
