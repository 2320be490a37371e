//! The call tool: shadow stacks per thread, decisions per block as
//! Callgrind's `setup_bbcc` makes them, and costs charged onto the tree.
//!
//! At each block a thread runs, the previous block's exit says what kind of
//! transfer it was, and Callgrind's rules refine it:
//!
//! * a `ret` is a return only when the stack pointer left the top frame (or
//!   stays and the block is that frame's return address); otherwise it is a
//!   jump (`ret` used as an indirect jump);
//! * a jump (or a fall-through, or such a `ret`) is a call when it goes to
//!   the first instruction of a function (tail calls, jumps to a
//!   function's start), or into another object or section kind (PLT stubs
//!   jumping to the library); a call emulated so has its caller's frame's
//!   stack pointer;
//! * any block whose stack pointer is known unwinds the frames the stack
//!   pointer has left (`longjmp`, exception unwinding), and is then a
//!   return;
//! * a call to a skipped function (the PLT, with `--skip-plt=yes`) pushes a
//!   frame but no context: its code is charged to the caller's call site,
//!   and what it calls is called from there;
//! * a return with no frame left (to code that was never called: a signal
//!   handler returning to the restorer, a thread returning below its first
//!   function) makes the returned-to function a root and gives it an arc
//!   to the returning context, as Callgrind's `handleUnderflow` does.
//!
//! The stack pointer is known where the engine records it: after blocks
//! ending in a call, return or indirect jump (Callgrind checks it at every
//! block; a frame left by a direct jump is unwound at the next such block).

use crate::classify::Classify;
use crate::functions::Functions;
use crate::hot::{lookup, Hot, NO_SLOT, SLOW_FROM};
use crate::tree::{FnId, NodeId, Snapshot, Tree, NO_NODE};
use callrules::{Calls, Exit, Flow, Step};
use costs::{BlockSim, Charge};
use events::{BlockId, BlockInfo, ClientRequest, Needs, Record, SignalEvent, Terminator, Tool};
use rustc_hash::FxHashMap;

/// Callgrind's options that shape the call graph.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallOptions {
    /// `--separate-recs`: recursion levels kept apart (default 2).
    pub separate_recs: u32,
    /// `--separate-callers`: how many of a context's callers its name
    /// carries (default 0: contexts of one function at one level are one
    /// `fn=`); a function's own `--separate-callers<N>=` overrides it.
    pub separate_callers: u32,
    /// `--skip-plt`: PLT stubs are no functions of their own (default yes).
    pub skip_plt: bool,
    /// `--collect-atstart`: threads start collecting (default yes).
    pub collect_atstart: bool,
    /// `--collect-jumps`: jumps between blocks that stay in a context are
    /// counted (default no).
    pub collect_jumps: bool,
    /// `--skip-direct-rec`: a function calling itself stays at its
    /// recursion level (default no, Valgrind 3.19's actual default).
    pub skip_direct_rec: bool,
}

impl Default for CallOptions {
    fn default() -> Self {
        CallOptions {
            separate_recs: 2,
            separate_callers: 0,
            skip_plt: true,
            collect_atstart: true,
            collect_jumps: false,
            skip_direct_rec: false,
        }
    }
}

/// What the tool keeps of each block besides its [`Flow`] and [`Hot`].
#[derive(Debug, Clone)]
pub(crate) struct BlockState {
    /// Its instructions' addresses.
    pub instrs: Box<[u64]>,
    /// Data reads and writes of one execution (with a simulation).
    accesses: (u64, u64),
    /// Which of its exits `--collect-jumps=yes` counts.
    pub jumps: Jumps,
}

/// Which exits of a block Callgrind's `--collect-jumps=yes` counts when
/// control stays in the context by them: its `jk_Jump` exits. A direct or
/// conditional jump's target counts unless it is the block's end (VEX then
/// sees a fall-through: `jmp` to the next instruction), an indirect jump's
/// every target does (its target is no constant); a conditional jump not
/// taken, a cut block's fall-through and a system call's return do not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Jumps {
    /// None.
    None,
    /// The exit to this address, by an unconditional jump.
    To(u64),
    /// The exit to this address, by a conditional jump taken.
    CondTo(u64),
    /// Every exit (an indirect jump).
    Any,
}

impl Jumps {
    fn of(info: &BlockInfo) -> Jumps {
        match info.terminator() {
            Terminator::Jump { target } if target != info.end() => Jumps::To(target),
            Terminator::CondJump { target } if target != info.end() => Jumps::CondTo(target),
            Terminator::IndirectJump => Jumps::Any,
            _ => Jumps::None,
        }
    }

    /// Whether control going on at `next` left by a counted exit: `Some`
    /// of whether that exit is a conditional jump's.
    fn to(self, next: u64) -> Option<bool> {
        match self {
            Jumps::To(t) if t == next => Some(false),
            Jumps::CondTo(t) if t == next => Some(true),
            Jumps::Any => Some(false),
            _ => None,
        }
    }

    /// Whether the counted exit is a conditional jump's (`jcnd=`).
    pub fn conditional(self) -> bool {
        matches!(self, Jumps::CondTo(_))
    }
}

/// One frame of a shadow stack.
#[derive(Debug, Clone)]
struct Frame {
    /// The stack pointer on entry (after the call pushed its return
    /// address; a call emulated from a jump has its caller's).
    sp: u64,
    /// Where a real call returns to (0 for emulated calls).
    ret_addr: u64,
    /// The arc it counts in; `None` for a skipped function's frame.
    arc: Option<u32>,
    /// The callee.
    function: FnId,
    /// The context to go back to.
    caller: NodeId,
    /// The thread's cost when it was pushed.
    enter_cost: u64,
    /// The skipped-call state to go back to.
    nonskipped: Option<(NodeId, u64)>,
    /// The thread's costs of every simulated event when it was pushed.
    enter_sim: Vec<u64>,
    /// Leaving the callee's outermost activation toggles, dumps or zeroes.
    notify: bool,
    /// The call raised the callee's active count (`callrules::raises_depth`),
    /// so its return lowers it.
    raised: bool,
}

/// What a signal handler's start put aside.
#[derive(Debug, Clone)]
struct Interrupted {
    depth: usize,
    node: NodeId,
    last: Option<u32>,
    nonskipped: Option<(NodeId, u64)>,
    cost: u64,
    sim_cost: Vec<u64>,
    collect: bool,
    /// The stack pointers as they were ([`ThreadState::sp`] and
    /// `last_sp`): a signal landing between a call (its record with the
    /// stack pointer) and the callee's first block must not lose the
    /// pending one, or the call's frame gets the handler's.
    sp: Option<u64>,
    last_sp: u64,
    /// Where the interrupted block was charged: a jump it makes after the
    /// handler returns is from there.
    charged: (ChargeAt, u64),
}

/// One thread's state.
#[derive(Debug, Clone)]
struct ThreadState {
    /// Valgrind's thread number.
    tid: u32,
    stack: Vec<Frame>,
    /// The current context.
    node: NodeId,
    /// The block run last.
    last: Option<u32>,
    /// The stack pointer at the start of the next block, if known.
    sp: Option<u64>,
    /// The last stack pointer known.
    last_sp: u64,
    /// Ir run so far (in the current handler, if in one): inclusive costs
    /// are its differences between a call and its return.
    cost: u64,
    /// Inside skipped functions: the context and call site their costs go
    /// to.
    nonskipped: Option<(NodeId, u64)>,
    /// Per function: its frames on the stack (the recursion depth).
    active: Vec<u32>,
    /// Handlers running, innermost last.
    signals: Vec<Interrupted>,
    /// Whether the thread ended (its number may be reused).
    ended: bool,
    /// Whether costs are collected (`--collect-atstart`, toggled by
    /// `--toggle-collect` functions and `CALLGRIND_TOGGLE_COLLECT`).
    collect: bool,
    /// With a simulation: every event's cost so far, as `cost` is Ir's.
    sim_cost: Vec<u64>,
    /// `cost` and `sim_cost` at the last dump (for `summary:`).
    lastdump: (u64, Vec<u64>),
    /// Where the last block was charged, and how much Ir (0 when not
    /// collecting): without a simulation, Callgrind counts a block's Ir
    /// when the next block starts, so a client request's own block counts
    /// after the request; the tool moves it there.
    charged: (ChargeAt, u64),
    /// Functions whose outermost activation was entered (true) or left
    /// (false) since the last block, whose options act before it runs.
    notices: Vec<(FnId, bool)>,
    /// The last block's [`Hot::stays_from`] while nothing else (a stack
    /// pointer, skipped code, a signal, a request, options of functions
    /// entered or left, no context yet) needs the slow path, else
    /// [`SLOW_FROM`]: the fast path's one check of the thread's state.
    stays_from: u32,
}

/// Where one block execution was charged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ChargeAt {
    Nowhere,
    Slot(u32),
    Extra(NodeId, u64),
}

impl ChargeAt {
    /// Its run slot, or `NO_SLOT`.
    fn slot(self) -> u32 {
        match self {
            ChargeAt::Slot(s) => s,
            _ => NO_SLOT,
        }
    }
}

impl ThreadState {
    fn new(tid: u32, collect: bool, width: usize) -> ThreadState {
        ThreadState {
            collect,
            sim_cost: vec![0; width],
            lastdump: (0, vec![0; width]),
            charged: (ChargeAt::Nowhere, 0),
            notices: Vec::new(),
            stays_from: SLOW_FROM,
            tid,
            stack: Vec::new(),
            node: NO_NODE,
            last: None,
            sp: None,
            last_sp: 0,
            cost: 0,
            nonskipped: None,
            active: Vec::new(),
            signals: Vec::new(),
            ended: false,
        }
    }

    /// The frames below this depth are the interrupted code's.
    fn bottom(&self) -> usize {
        self.signals.last().map_or(0, |s| s.depth)
    }

    fn active_mut(&mut self, f: FnId) -> &mut u32 {
        let i = f as usize;
        if self.active.len() <= i {
            self.active.resize(i + 1, 0);
        }
        &mut self.active[i]
    }

    /// Back to the code a handler interrupted; returns the stack pointers
    /// it had (its pending one and the last known), which a handler's
    /// return puts back and a `longjmp` out of it does not.
    fn end_signal(&mut self) -> Option<(Option<u64>, u64)> {
        let s = self.signals.pop()?;
        self.node = s.node;
        self.last = s.last;
        self.nonskipped = s.nonskipped;
        self.cost = s.cost;
        self.sim_cost = s.sim_cost;
        self.collect = s.collect;
        self.charged = s.charged;
        self.sp = None;
        Some((s.sp, s.last_sp))
    }

    /// Pops the top frame, adding the calls' inclusive cost to its arc.
    fn pop(&mut self, tree: &mut Tree) {
        // Leaving the frames of interrupted code: the handler was left
        // (longjmp out of it).
        while self
            .signals
            .last()
            .is_some_and(|s| self.stack.len() <= s.depth)
        {
            self.end_signal();
        }
        let Some(f) = self.stack.pop() else { return };
        if let Some(a) = f.arc {
            tree.arcs[a as usize].inclusive += self.cost - f.enter_cost;
            let w = tree.width;
            let arc = &mut tree.arc_costs[a as usize * w..][..w];
            for ((c, now), then) in arc.iter_mut().zip(&self.sim_cost).zip(&f.enter_sim) {
                *c += now - then;
            }
            let n = self.active_mut(f.function);
            if f.raised {
                *n = n.saturating_sub(1);
            }
            if f.notify && *n == 0 {
                self.notices.push((f.function, false));
            }
        }
        self.node = f.caller;
        self.nonskipped = f.nonskipped;
    }
}

/// The call tool (see the crate documentation).
pub struct CallTool {
    pub(crate) options: CallOptions,
    classify: Box<dyn Classify>,
    pub(crate) functions: Functions,
    pub(crate) blocks: Vec<Option<BlockState>>,
    /// What the per-block fast path needs of each block (`hot`).
    hot: Vec<Hot>,
    /// What the call and return decision needs of each block (`flow`).
    flows: Vec<Flow>,
    threads: Vec<ThreadState>,
    thread_index: FxHashMap<u64, usize>,
    current: Option<usize>,
    pub(crate) tree: Tree,
    /// Block executions (Callgrind's "basic blocks" for `Timerange:`).
    pub(crate) block_runs: u64,
    /// The cache and branch simulation (`--cache-sim`, `--branch-sim`).
    sim: Option<BlockSim>,
    /// The dumps made so far (client requests, `--dump-before/after`).
    dumps: Vec<Dump>,
    /// Block executions at the last dump.
    bbs_done: u64,
}

/// One dump of the costs: a part of the profile.
#[derive(Debug, Clone)]
pub struct Dump {
    /// Why (`desc: Trigger:`): `Client Request`, `Client Request: <text>`,
    /// `--dump-before=<fn>`, `--dump-after=<fn>`, `Program termination`.
    pub trigger: String,
    /// Block executions before and at the dump (`desc: Timerange:`).
    pub timerange: (u64, u64),
    /// The costs since the previous dump.
    pub costs: Snapshot,
}

impl CallTool {
    /// A tool naming functions with `classify`.
    pub fn new(options: CallOptions, classify: Box<dyn Classify>) -> CallTool {
        CallTool {
            functions: Functions::new(&options),
            options,
            classify,
            blocks: Vec::new(),
            hot: Vec::new(),
            flows: Vec::new(),
            threads: Vec::new(),
            thread_index: FxHashMap::default(),
            current: None,
            tree: Tree::default(),
            block_runs: 0,
            sim: None,
            dumps: Vec::new(),
            bbs_done: 0,
        }
    }

    /// A tool that also runs `sim` and charges its events to the contexts.
    pub fn with_sim(options: CallOptions, classify: Box<dyn Classify>, sim: BlockSim) -> CallTool {
        let mut t = CallTool::new(options, classify);
        t.tree.width = sim.events().len();
        t.sim = Some(sim);
        t
    }

    /// The simulation, if any.
    pub fn sim(&self) -> Option<&BlockSim> {
        self.sim.as_ref()
    }

    /// The dumps made while the program ran, in order.
    pub fn take_dumps(&mut self) -> Vec<Dump> {
        std::mem::take(&mut self.dumps)
    }

    /// A copy for a forked child: same costs, stacks and functions.
    pub fn fork(&self) -> CallTool {
        CallTool {
            options: self.options.clone(),
            classify: self.classify.fork(),
            functions: self.functions.clone(),
            blocks: self.blocks.clone(),
            hot: self.hot.clone(),
            flows: self.flows.clone(),
            threads: self.threads.clone(),
            thread_index: self.thread_index.clone(),
            current: self.current,
            tree: self.tree.clone(),
            block_runs: self.block_runs,
            sim: self.sim.clone(),
            dumps: self.dumps.clone(),
            bbs_done: self.bbs_done,
        }
    }

    /// Ends every thread's calls (the process ended): their arcs get the
    /// inclusive costs so far, as Callgrind unwinds at exit. What only
    /// the run needed to find its contexts is freed for the output.
    pub fn finish(&mut self) {
        for t in &mut self.threads {
            while !t.stack.is_empty() {
                t.pop(&mut self.tree);
            }
            t.notices.clear();
        }
        self.tree.release_lookups();
    }

    /// Contexts mode: thread `tid`, which ran `cost` Ir, ended; its
    /// contexts are in the tree already.
    pub(crate) fn adopt_thread(&mut self, tid: u32, cost: u64) {
        let mut t = ThreadState::new(tid, self.options.collect_atstart, self.tree.width);
        t.cost = cost;
        t.ended = true;
        self.threads.push(t);
    }

    /// The function the call tool gave block `id` (described).
    pub(crate) fn function_of_block(&self, id: u32) -> Option<FnId> {
        self.flows
            .get(id as usize)
            .filter(|f| f.described())
            .map(|f| f.function)
    }

    /// All Ir charged so far.
    pub fn total(&self) -> u64 {
        let runs: u64 = self
            .tree
            .run_keys
            .iter()
            .zip(&self.tree.runs)
            .map(|(&(_, b), &n)| n * self.block_state(b).instrs.len() as u64)
            .sum();
        runs + self.tree.extra.values().sum::<u64>()
    }

    pub(crate) fn block_state(&self, id: u32) -> &BlockState {
        self.blocks[id as usize]
            .as_ref()
            .expect("runs only of described blocks")
    }

    fn describe(&mut self, id: BlockId, info: &BlockInfo) {
        let class = self.classify.classify(info);
        let flow = self.functions.flow(class, info);
        let i = id.0 as usize;
        if self.blocks.len() <= i {
            self.blocks.resize(i + 1, None);
            self.hot.resize(i + 1, Hot::default());
            self.flows.resize(i + 1, Flow::default());
        }
        let mut accesses = (0, 0);
        if let Some(sim) = &mut self.sim {
            // The rows of a block's instructions in a context are its slots.
            sim.describe(id, info, (0..info.instrs().len()).collect());
            for &(r, w) in sim.accesses(id) {
                accesses.0 += u64::from(r);
                accesses.1 += u64::from(w);
            }
        }
        let jumps = Jumps::of(info);
        self.blocks[i] = Some(BlockState {
            instrs: info.instrs().iter().map(|i| i.addr).collect(),
            accesses,
            jumps,
        });
        let n = info.instrs().len() as u32;
        let hot = Hot::new(n, flow.domain, flow.exit, flow.entry);
        // Jumps are counted on the slow path.
        self.hot[i] = if self.options.collect_jumps && jumps != Jumps::None {
            hot.left_slowly()
        } else {
            hot
        };
        self.flows[i] = flow;
        // A thread whose last block had this id must decide afresh.
        self.unsettle();
    }

    /// The current thread's index, made on first use (a producer that
    /// never names threads has one).
    fn current(&mut self) -> usize {
        match self.current {
            Some(c) => c,
            None => {
                self.thread(0);
                self.current.expect("just made")
            }
        }
    }

    /// Control enters block `y` on the current thread: Callgrind's
    /// decision (`callrules::enter`, which pops the frames it leaves),
    /// then a call's context and frame, or a first block's root. Returns
    /// the run slot of the block left when the entry is a jump
    /// `--collect-jumps=yes` counts.
    fn enter(&mut self, y: u32) -> Option<u32> {
        let ti = self.current();
        let (skip_direct, collect_jumps) =
            (self.options.skip_direct_rec, self.options.collect_jumps);
        let functions = &self.functions;
        let flows = &self.flows;
        let blocks = &self.blocks;
        let t = &mut self.threads[ti];
        let yb = &flows[y as usize];
        let sp = t.sp.take();
        if let Some(sp) = sp {
            t.last_sp = sp;
        }
        let again = t.last == Some(y);
        let xb = t.last.map(|l| &flows[l as usize]);
        let mut keeper = Keeper {
            t,
            tree: &mut self.tree,
            functions,
        };
        let (step, jumping) = callrules::enter_jumping(&mut keeper, xb, yb, sp, again);
        let Keeper { t, tree, .. } = keeper;
        let (push, call_site, push_sp, ret_addr, skip) = match step {
            Step::Repeat => return None,
            Step::Stay => (false, 0, None, 0, false),
            Step::Call {
                site,
                sp,
                ret_addr,
                skip,
            } => (true, site, sp, ret_addr, skip),
        };
        // Counted from the cell of the block left (skipped code has none:
        // Callgrind never writes out its cells).
        let jumped_from = match (jumping && collect_jumps, t.last) {
            (true, Some(x)) => blocks[x as usize]
                .as_ref()
                .and_then(|b| b.jumps.to(yb.start))
                .map(|_| t.charged.0.slot())
                .filter(|&s| s != NO_SLOT),
            _ => None,
        };
        let caller = t.node;
        // Skipped code runs in its caller's context, so this is also the
        // function of a call from skipped code (Callgrind's `nonskipped`).
        let caller_fn = (caller != NO_NODE).then(|| tree.nodes[caller as usize].function);
        let raised = callrules::raises_depth(caller_fn, yb.function, skip_direct);
        let mut arc = None;
        if (push && !skip) || t.node == NO_NODE {
            let recs = functions[yb.function as usize].separate_recs;
            let level = callrules::level(t.active_mut(yb.function), push && !skip && raised, recs);
            if push && !skip {
                // A call from skipped code is the skipping caller's.
                let (from, site) = t.nonskipped.unwrap_or((caller, call_site));
                let (f, tid) = (yb.function, t.tid);
                let (node, a) = tree.call(caller, f, level, tid, from, site, yb.start);
                t.node = node;
                arc = Some(a);
            } else {
                t.node = tree.child(NO_NODE, yb.function, level, t.tid);
            }
        }
        if push {
            let mut frame = Frame {
                sp: push_sp.unwrap_or(t.last_sp),
                ret_addr,
                arc: None,
                function: yb.function,
                caller,
                enter_cost: t.cost,
                nonskipped: t.nonskipped,
                enter_sim: t.sim_cost.clone(),
                notify: false,
                raised,
            };
            if skip {
                if t.nonskipped.is_none() {
                    t.nonskipped = Some((caller, call_site));
                }
            } else {
                let a = arc.expect("made with the callee's context");
                tree.arcs[a as usize].calls += 1;
                frame.arc = Some(a);
                let depth = t.active_mut(yb.function);
                if raised {
                    *depth += 1;
                }
                // Callgrind enters the outermost activation whenever the
                // count is 1 after the call, so with `--skip-direct-rec`
                // a direct recursion from it enters it again (its return
                // leaves nothing).
                if yb.notify {
                    frame.notify = true;
                    if *depth == 1 {
                        t.notices.push((yb.function, true));
                    }
                }
                t.nonskipped = None;
            }
            t.stack.push(frame);
        }
        jumped_from
    }

    /// One block execution the fast path left: Callgrind's decisions
    /// ([`enter`](Self::enter)), the options of functions entered or left,
    /// the charge.
    #[inline(never)]
    fn run(&mut self, id: BlockId, info: &BlockInfo, addrs: &[u64]) {
        if self.flows.get(id.0 as usize).is_none_or(|f| !f.described()) {
            self.describe(id, info);
        }
        let jumped_from = self.enter(id.0);
        let ti = self.current();
        if !self.threads[ti].notices.is_empty() {
            self.notices(ti);
        }
        self.charge(id.0, addrs);
        if let Some(from) = jumped_from {
            // Counted whether or not the thread collects, as Callgrind
            // does (only the cells' executions depend on it).
            let to = self.threads[ti].charged.0.slot();
            if to != NO_SLOT {
                self.tree.jumps.add(from, to);
            }
        }
        self.settle();
    }

    /// Whether the current thread's next block may take the fast path
    /// (`ThreadState::stays_from`), after a block the slow path ran.
    fn settle(&mut self) {
        let Some(ti) = self.current else { return };
        let t = &mut self.threads[ti];
        t.stays_from = match t.last {
            Some(x)
                if t.sp.is_none()
                    && t.nonskipped.is_none()
                    && t.node != NO_NODE
                    && t.notices.is_empty() =>
            {
                self.hot[x as usize].stays_from()
            }
            _ => SLOW_FROM,
        };
    }

    /// Sends every thread's next block down the slow path (its state
    /// changed outside a block run).
    fn unsettle(&mut self) {
        self.threads
            .iter_mut()
            .for_each(|t| t.stays_from = SLOW_FROM);
    }

    /// One execution of block `y` when control stays where the thread's
    /// last block left it (see `hot`), without a simulation: what
    /// [`enter`](Self::enter) and [`charge`](Self::charge) do then, which
    /// is only the charge. False (nothing done) when they must decide.
    #[inline(always)]
    fn run_in_place(&mut self, y: u32) -> bool {
        let Some(ti) = self.current else { return false };
        let CallTool {
            threads,
            hot,
            tree,
            block_runs,
            ..
        } = self;
        let t = &mut threads[ti];
        let Some(yh) = hot.get_mut(y as usize) else {
            return false;
        };
        if t.stays_from != yh.stays_with() {
            return false;
        }
        t.stays_from = yh.stays_from();
        let slot = lookup(tree, yh, t.node, y, t.charged.0.slot());
        let n = u64::from(yh.instrs);
        *block_runs += 1;
        t.last = Some(y);
        let charged = if t.collect {
            t.cost += n;
            tree.runs[slot as usize] += 1;
            n
        } else {
            0
        };
        t.charged = (ChargeAt::Slot(slot), charged);
        true
    }

    /// Charges one execution of block `y` (data addresses `addrs`) to the
    /// current context, if the thread collects; the simulation runs either
    /// way.
    fn charge(&mut self, y: u32, addrs: &[u64]) {
        let ti = self.current();
        self.block_runs += 1;
        let CallTool {
            threads,
            blocks,
            hot,
            tree,
            sim,
            ..
        } = self;
        let t = &mut threads[ti];
        let n = u64::from(hot[y as usize].instrs);
        t.last = Some(y);
        let at = match t.nonskipped {
            Some((node, addr)) => ChargeAt::Extra(node, addr),
            None => {
                let prev = t.charged.0.slot();
                ChargeAt::Slot(lookup(tree, &mut hot[y as usize], t.node, y, prev))
            }
        };
        let collect = t.collect;
        t.charged = (at, if collect { n } else { 0 });
        if collect {
            t.cost += n;
            match at {
                ChargeAt::Slot(slot) => tree.runs[slot as usize] += 1,
                ChargeAt::Extra(node, addr) => *tree.extra.at(node, addr) += n,
                ChargeAt::Nowhere => {}
            }
        }
        let Some(sim) = sim else { return };
        let [ir, read, write, ..] = sim.columns();
        let cache = sim.caches().is_some();
        let width = tree.width;
        let (first, single) = match at {
            ChargeAt::Extra(node, addr) if collect => (tree.extra_row(node, addr), true),
            ChargeAt::Slot(slot) if collect => {
                (tree.run_rows[slot as usize] as usize * width, false)
            }
            _ => (0, true),
        };
        if collect {
            let mut add = |col: usize, v: u64| {
                t.sim_cost[col] += v;
                if single {
                    tree.rows[first + col] += v;
                }
            };
            add(ir, n);
            if cache {
                let b = blocks[y as usize].as_ref().expect("described");
                add(read, b.accesses.0);
                add(write, b.accesses.1);
            }
        }
        let mut out = RowCharge {
            rows: if collect {
                &mut tree.rows[first..]
            } else {
                &mut []
            },
            cost: &mut t.sim_cost,
            width,
            collect,
            single,
        };
        sim.run(BlockId(y), addrs, &mut out);
    }

    /// A branch of the current thread's last block (at `pc`), whose events
    /// start at column `col`, mispredicted or not.
    fn charge_branch(&mut self, pc: u64, col: usize, mispredicted: bool) {
        let ti = self.current();
        let CallTool {
            threads,
            blocks,
            hot,
            tree,
            ..
        } = self;
        let t = &mut threads[ti];
        if !t.collect {
            return;
        }
        let row = match (t.nonskipped, t.last) {
            (Some((node, addr)), _) => tree.extra_row(node, addr),
            (None, Some(y)) => {
                let b = blocks[y as usize].as_ref().expect("described");
                let n = b.instrs.len();
                // The block's own slot, charged just before (no successor).
                let slot = lookup(tree, &mut hot[y as usize], t.node, y, NO_SLOT);
                let i = b.instrs.iter().position(|&a| a == pc).unwrap_or(n - 1);
                (tree.run_rows[slot as usize] as usize + i) * tree.width
            }
            (None, None) => return,
        };
        let m = u64::from(mispredicted);
        tree.rows[row + col] += 1;
        tree.rows[row + col + 1] += m;
        t.sim_cost[col] += 1;
        t.sim_cost[col + 1] += m;
    }

    /// The final check of a rep string instruction: one fetch of `addr`.
    fn charge_fetch(&mut self, addr: u64, len: u32) {
        let ti = self.current();
        let outcome = self.sim.as_mut().and_then(|s| s.fetch(addr, len));
        let t = &mut self.threads[ti];
        if !t.collect {
            return;
        }
        t.cost += 1;
        let (node, at) = t.nonskipped.unwrap_or((t.node, addr));
        *self.tree.extra.at(node, at) += 1;
        let Some(sim) = &self.sim else { return };
        let ir = sim.columns()[0];
        let row = self.tree.extra_row(node, at);
        let misses = outcome.map_or([0, 0], |o| [u64::from(o.l1_miss()), u64::from(o.ll_miss())]);
        let cache = sim.caches().is_some();
        for (k, v) in [1, misses[0], misses[1]].into_iter().enumerate() {
            if k == 0 || cache {
                self.tree.rows[row + ir + k] += v;
                t.sim_cost[ir + k] += v;
            }
        }
    }

    /// Acts on the options of functions entered or left by the last
    /// transfer (Callgrind's `function_entered` / `function_left`).
    fn notices(&mut self, ti: usize) {
        let notices = std::mem::take(&mut self.threads[ti].notices);
        for (f, entered) in notices {
            let class = &self.functions[f as usize].class;
            let (c, name) = (class.config, class.function.clone());
            if entered && c.dump_before {
                self.dump(format!("--dump-before={name}"));
            } else if entered && c.zero_before {
                self.zero(ti);
            }
            if !entered && c.dump_after {
                self.dump(format!("--dump-after={name}"));
            }
            if c.toggle_collect {
                let t = &mut self.threads[ti];
                t.collect = !t.collect;
            }
        }
    }

    /// The costs since the last dump (all threads'), as a dump takes them:
    /// calls still running get their inclusive costs so far. With `take`,
    /// the tree is zeroed, and the running calls start again from now.
    fn snapshot(&mut self, take: bool) -> Snapshot {
        let width = self.tree.width.max(1);
        let mut summary = vec![0u64; width];
        for t in &mut self.threads {
            for f in &mut t.stack {
                let Some(a) = f.arc else { continue };
                self.tree.arcs[a as usize].inclusive += t.cost - f.enter_cost;
                let w = self.tree.width;
                let arc = &mut self.tree.arc_costs[a as usize * w..][..w];
                for ((c, now), then) in arc.iter_mut().zip(&t.sim_cost).zip(&mut f.enter_sim) {
                    *c += now - *then;
                    *then = *now;
                }
                f.enter_cost = t.cost;
            }
            if self.sim.is_some() {
                for ((s, now), then) in summary.iter_mut().zip(&t.sim_cost).zip(&t.lastdump.1) {
                    *s = s.wrapping_add(now.wrapping_sub(*then));
                }
            } else {
                summary[0] = summary[0].wrapping_add(t.cost.wrapping_sub(t.lastdump.0));
            }
        }
        // Callgrind sets the last-dump costs of thread 1 only (the thread
        // its dump runs as).
        if let Some(t) = self.threads.iter_mut().find(|t| t.tid == 1) {
            t.lastdump = (t.cost, t.sim_cost.clone());
        }
        let tree = &self.tree;
        let mut snap = Snapshot {
            summary,
            width,
            ..Snapshot::default()
        };
        let sim = self.sim.as_ref();
        if sim.is_none() {
            // Millions on large programs: no room to spare.
            snap.runs
                .reserve_exact(tree.runs.iter().filter(|&&r| r != 0).count());
        }
        for (slot, (&(node, block), &runs)) in tree.run_keys.iter().zip(&tree.runs).enumerate() {
            if runs == 0 {
                continue;
            }
            let Some(sim) = sim else {
                snap.runs.push((node, block, runs));
                continue;
            };
            let b = self.blocks[block as usize].as_ref().expect("described");
            let n = b.instrs.len();
            let mut rows = vec![0u64; n * width].into_boxed_slice();
            let [ir, read, write, ..] = sim.columns();
            let base = tree.run_rows[slot] as usize * width;
            rows.copy_from_slice(&tree.rows[base..base + n * width]);
            let cache = sim.caches().is_some();
            let accesses = sim.accesses(BlockId(block));
            for (i, row) in rows.chunks_mut(width).enumerate() {
                row[ir] += runs;
                if let (true, Some(&(r, w))) = (cache, accesses.get(i)) {
                    row[read] += runs * u64::from(r);
                    row[write] += runs * u64::from(w);
                }
            }
            snap.selfs.push((node, block, rows));
        }
        let mut extra: Vec<(&(NodeId, u64), &u64)> = tree.extra.iter().collect();
        extra.sort_unstable();
        for (&(node, addr), ir) in extra {
            let row = match tree.extra_rows.get(&(node, addr)) {
                Some(&r) if sim.is_some() => &tree.rows[r as usize * width..][..width],
                _ => std::slice::from_ref(ir),
            };
            if node != NO_NODE && row.iter().any(|&c| c != 0) {
                snap.extra.push((node, addr));
                snap.extra_costs.extend_from_slice(row);
            }
        }
        // Callgrind's arcs are between functions (at recursion levels),
        // where the tree's are between contexts: an arc is written when its
        // function-level arc has a cost, and only a written arc's calls
        // start again from zero at a dump (calls without cost so far, of
        // collection switched off, go on to the next dump).
        let group = |a: &crate::tree::Arc| {
            let f = |n: NodeId| {
                let node = tree.nodes[n as usize];
                (node.function, node.level)
            };
            (f(a.caller), a.call_site, f(a.callee), a.target)
        };
        let costs = |i: usize| match sim {
            Some(_) => &tree.arc_costs[i * width..][..width],
            None => std::slice::from_ref(&tree.arcs[i].inclusive),
        };
        let has_cost = |i: usize| costs(i).iter().any(|&c| c != 0);
        // Only calls without cost need their group's: when there are none
        // (no collection switched off, the usual case), an arc is written
        // exactly when it has a cost, and no set of groups is made (on
        // python-json, a third of a million arcs hashed twice).
        let grouped = take || (0..tree.arcs.len()).any(|i| tree.arcs[i].calls > 0 && !has_cost(i));
        let written: rustc_hash::FxHashSet<_> = if grouped {
            (0..tree.arcs.len())
                .filter(|&i| has_cost(i))
                .map(|i| group(&tree.arcs[i]))
                .collect()
        } else {
            Default::default()
        };
        for (i, arc) in tree.arcs.iter().enumerate() {
            let row = costs(i);
            let write = if grouped {
                (arc.calls > 0 || has_cost(i)) && written.contains(&group(arc))
            } else {
                has_cost(i)
            };
            if write {
                snap.arcs.push((i as u32, arc.calls));
                snap.arc_costs.extend_from_slice(row);
            }
        }
        // A jump is written with the cell it leaves, when that ran (as
        // Callgrind writes out the cells that ran, with their jumps); the
        // others wait for a later dump.
        let mut jumped: Vec<usize> = Vec::new();
        for (cell, (from, to), count) in tree.jumps.iter() {
            let executed = tree.runs[from as usize];
            if count > 0 && executed > 0 {
                jumped.push(cell);
                snap.jumps.push(crate::tree::JumpCount {
                    from: tree.run_keys[from as usize],
                    to: tree.run_keys[to as usize],
                    count,
                    executed,
                });
            }
        }
        snap.jumps.sort_unstable_by_key(|j| (j.from, j.to));
        if take {
            let keep: Vec<bool> = self
                .tree
                .arcs
                .iter()
                .map(|a| !written.contains(&group(a)))
                .collect();
            self.tree.zero(false);
            for &cell in &jumped {
                self.tree.jumps.zero_cell(cell);
            }
            for (a, keep) in self.tree.arcs.iter_mut().zip(keep) {
                if !keep {
                    a.calls = 0;
                }
            }
        }
        snap
    }

    /// A dump (Callgrind's `dump_profile`): the costs so far become a part
    /// and start again from zero.
    fn dump(&mut self, trigger: String) {
        let costs = self.snapshot(true);
        self.dumps.push(Dump {
            trigger,
            timerange: (self.bbs_done, self.block_runs),
            costs,
        });
        // Callgrind counts a block more at each dump.
        self.bbs_done = self.block_runs;
        self.block_runs += 1;
    }

    /// The costs at the program's end (after [`finish`](Self::finish)), as
    /// the last dump; the tree keeps them.
    pub fn final_dump(&mut self) -> Dump {
        Dump {
            trigger: "Program termination".into(),
            timerange: (self.bbs_done, self.block_runs),
            costs: self.snapshot(false),
        }
    }

    /// `ZERO_STATS` / `--zero-before` on thread `ti`: every cost is zeroed,
    /// and that thread's running calls start again from now.
    fn zero(&mut self, ti: usize) {
        self.tree.zero(true);
        let t = &mut self.threads[ti];
        for f in &mut t.stack {
            f.enter_cost = t.cost;
            f.enter_sim.clone_from(&t.sim_cost);
        }
        t.lastdump = (t.cost, t.sim_cost.clone());
    }

    /// Runs `f` for a client request of the current thread. Without a
    /// simulation Callgrind counts the requesting block's Ir only when the
    /// next block starts, so after the request: its charge is moved there.
    fn at_request(&mut self, f: impl FnOnce(&mut CallTool, usize)) {
        let ti = self.current();
        let deferred = self.sim.is_none();
        if deferred {
            let t = &mut self.threads[ti];
            let (at, n) = t.charged;
            if n > 0 {
                t.cost -= n;
                match at {
                    ChargeAt::Slot(s) => self.tree.runs[s as usize] -= 1,
                    ChargeAt::Extra(node, addr) => {
                        *self.tree.extra.at(node, addr) -= n;
                    }
                    ChargeAt::Nowhere => {}
                }
            }
        }
        f(self, ti);
        if deferred {
            let t = &mut self.threads[ti];
            let (at, n) = t.charged;
            if n > 0 && t.collect {
                t.cost += n;
                match at {
                    ChargeAt::Slot(s) => self.tree.runs[s as usize] += 1,
                    ChargeAt::Extra(node, addr) => {
                        *self.tree.extra.at(node, addr) += n;
                    }
                    ChargeAt::Nowhere => {}
                }
            } else if let (ChargeAt::Slot(_) | ChargeAt::Extra(..), Some(y), true) =
                (at, t.last, t.collect)
            {
                // It was not collected before the request and is now.
                let n = self.blocks[y as usize]
                    .as_ref()
                    .map_or(0, |b| b.instrs.len() as u64);
                t.cost += n;
                match at {
                    ChargeAt::Slot(s) => self.tree.runs[s as usize] += 1,
                    ChargeAt::Extra(node, addr) => {
                        *self.tree.extra.at(node, addr) += n;
                    }
                    ChargeAt::Nowhere => {}
                }
                t.charged.1 = n;
            } else {
                t.charged.1 = 0;
            }
        }
    }

    /// Instrumentation switched on or off: Callgrind unwinds every call
    /// stack, zeroes the threads' running costs and empties the caches.
    fn reset_instrumentation(&mut self) {
        let collect = self.options.collect_atstart;
        for t in &mut self.threads {
            while !t.stack.is_empty() {
                t.pop(&mut self.tree);
            }
            t.signals.clear();
            t.notices.clear();
            t.node = NO_NODE;
            t.last = None;
            t.sp = None;
            t.nonskipped = None;
            t.active.clear();
            t.cost = 0;
            t.sim_cost.iter_mut().for_each(|c| *c = 0);
            t.charged = (ChargeAt::Nowhere, 0);
            t.collect = collect;
        }
        if let Some(sim) = &mut self.sim {
            sim.clear();
        }
    }
}

/// Charges a simulation's misses to one context's rows of a block (or to
/// one row for all its instructions: skipped code's call site), and to the
/// thread's running costs.
struct RowCharge<'a> {
    rows: &'a mut [u64],
    cost: &'a mut [u64],
    width: usize,
    collect: bool,
    single: bool,
}

impl Charge for RowCharge<'_> {
    #[inline]
    fn add(&mut self, slot: usize, col: usize, n: u64) {
        if self.collect {
            let row = if self.single { 0 } else { slot };
            self.rows[row * self.width + col] += n;
            self.cost[col] += n;
        }
    }
}

/// A return with no frame to return from (Callgrind's `handleUnderflow`):
/// the function returned to becomes a root context (its levels capped at
/// `separate_recs`, its own), with an arc (if `arc`, as if it had called)
/// to the returning context carrying the cost so far.
fn underflow(
    t: &mut ThreadState,
    tree: &mut Tree,
    x: Option<&Flow>,
    y: &Flow,
    separate_recs: u32,
    arc: bool,
) {
    let returning = t.node;
    if returning != NO_NODE {
        let f = tree.nodes[returning as usize].function;
        let n = t.active_mut(f);
        *n = n.saturating_sub(1);
    }
    let level = callrules::level(t.active_mut(y.function), false, separate_recs);
    let root = tree.child(NO_NODE, y.function, level, t.tid);
    if returning != NO_NODE && arc {
        let target = x.map_or(y.start, |x| x.start);
        let a = tree.arc(root, y.start.wrapping_sub(1), returning, target);
        tree.arcs[a as usize].calls += 1;
        tree.arcs[a as usize].inclusive += t.cost;
    }
    t.node = root;
    t.nonskipped = None;
}

/// A thread's stack as Callgrind's rules change it ([`Calls`]): popping a
/// frame adds its inclusive costs to its arc.
struct Keeper<'a> {
    t: &'a mut ThreadState,
    tree: &'a mut Tree,
    /// For each function's `--separate-recs`.
    functions: &'a Functions,
}

impl Calls for Keeper<'_> {
    fn depth(&self) -> usize {
        self.t.stack.len()
    }

    fn bottom(&self) -> usize {
        self.t.bottom()
    }

    fn in_handler(&self) -> bool {
        !self.t.signals.is_empty()
    }

    fn frame_sp(&self, i: usize) -> u64 {
        self.t.stack[i].sp
    }

    fn frame_ret_addr(&self, i: usize) -> u64 {
        self.t.stack[i].ret_addr
    }

    fn top_call_site(&self) -> Option<u64> {
        let a = self.t.stack.last()?.arc?;
        Some(self.tree.arcs[a as usize].call_site)
    }

    fn pop(&mut self) {
        self.t.pop(self.tree);
    }

    fn underflow(&mut self, from: Option<&Flow>, to: &Flow, arc: bool) {
        let recs = self.functions[to.function as usize].separate_recs;
        underflow(self.t, self.tree, from, to, recs, arc);
    }
}

impl Tool for CallTool {
    fn needs(&self) -> Needs {
        let (cache, branch) = self.sim.as_ref().map_or((false, false), |s| {
            let e = s.events();
            (e.cache_sim(), e.branch_sim())
        });
        Needs {
            instr_fetches: cache,
            data_refs: cache,
            cond_branches: branch,
            indirect_targets: branch,
            calls_returns: true,
            mru_filter: None,
        }
    }

    fn block(&mut self, id: BlockId, info: &BlockInfo) {
        self.describe(id, info);
    }

    fn record(&mut self, record: Record) {
        match record {
            // The final check of a rep string instruction (one fetch of
            // the block it belongs to).
            Record::Instr(f) => self.charge_fetch(f.addr, f.len),
            Record::CondBranch(b) => {
                let Some(sim) = &mut self.sim else { return };
                if let Some(m) = sim.cond(b.pc, b.taken) {
                    let col = sim.columns()[3];
                    self.charge_branch(b.pc, col, m);
                }
            }
            Record::Indirect(x) => {
                let Some(sim) = &mut self.sim else { return };
                if let Some(m) = sim.indirect(x.pc, x.target) {
                    let col = sim.columns()[4];
                    self.charge_branch(x.pc, col, m);
                }
            }
            _ => {}
        }
    }

    /// Inlined into the engine's decoder: most blocks take the fast path
    /// and never call [`CallTool::run`]. (`#[inline]` alone was a hint the
    /// compiler stopped taking: a call per block, a fifth of bzip2's
    /// consumer.)
    #[inline(always)]
    fn block_run(&mut self, id: BlockId, info: &BlockInfo, addrs: &[u64]) {
        if self.sim.is_none() && self.run_in_place(id.0) {
            return;
        }
        self.run(id, info, addrs);
    }

    fn client_request(&mut self, request: &ClientRequest) {
        self.unsettle();
        match request {
            ClientRequest::DumpStats { reason } => {
                let trigger = match reason {
                    Some(r) => format!("Client Request: {r}"),
                    None => "Client Request".to_string(),
                };
                self.at_request(|tool, _| tool.dump(trigger));
            }
            ClientRequest::ZeroStats => self.at_request(|tool, ti| tool.zero(ti)),
            ClientRequest::ToggleCollect => self.at_request(|tool, ti| {
                let t = &mut tool.threads[ti];
                t.collect = !t.collect;
            }),
            ClientRequest::Instrumentation { .. } => self.reset_instrumentation(),
        }
    }

    fn thread(&mut self, thread: u64) {
        if let Some(&i) = self.thread_index.get(&thread) {
            self.current = Some(i);
            return;
        }
        // Valgrind numbers threads from 1 and gives a new thread the lowest
        // free number; Callgrind then continues with the state the ended
        // thread of that number left (its stack, context and recursion
        // depths), and so does this tool.
        let i = match self.threads.iter().position(|t| t.ended) {
            Some(i) => {
                let lowest = self
                    .threads
                    .iter()
                    .enumerate()
                    .filter(|(_, t)| t.ended)
                    .min_by_key(|(_, t)| t.tid)
                    .map_or(i, |(j, _)| j);
                self.threads[lowest].ended = false;
                lowest
            }
            None => {
                let tid = self.threads.len() as u32 + 1;
                let (collect, width) = (self.options.collect_atstart, self.tree.width);
                self.threads.push(ThreadState::new(tid, collect, width));
                self.threads.len() - 1
            }
        };
        self.thread_index.insert(thread, i);
        self.current = Some(i);
    }

    fn thread_end(&mut self, thread: u64) {
        // The frames stay (Callgrind unwinds them at the end of the run).
        if let Some(i) = self.thread_index.remove(&thread) {
            self.threads[i].ended = true;
            if self.current == Some(i) {
                self.current = None;
            }
        }
    }

    fn stack_pointer(&mut self, sp: u64) {
        let ti = self.current();
        let t = &mut self.threads[ti];
        t.stays_from = SLOW_FROM;
        let Some(last) = t.last else { return };
        let after = match self.hot.get(last as usize).map(|h| h.exit) {
            // The call pushes its return address, the return pops it.
            Some(Exit::Call) => sp.wrapping_sub(8),
            Some(Exit::Return) => sp.wrapping_add(8),
            _ => sp,
        };
        t.sp = Some(after);
    }

    fn signal(&mut self, event: SignalEvent) {
        let ti = self.current();
        let t = &mut self.threads[ti];
        t.stays_from = SLOW_FROM;
        match event {
            SignalEvent::Delivered => {
                let zero = vec![0; t.sim_cost.len()];
                t.signals.push(Interrupted {
                    depth: t.stack.len(),
                    node: t.node,
                    last: t.last,
                    nonskipped: t.nonskipped,
                    cost: t.cost,
                    sim_cost: std::mem::replace(&mut t.sim_cost, zero),
                    collect: t.collect,
                    sp: t.sp,
                    last_sp: t.last_sp,
                    charged: t.charged,
                });
                t.node = NO_NODE;
                t.last = None;
                t.nonskipped = None;
                t.cost = 0;
                t.sp = None;
            }
            SignalEvent::Returned => {
                let Some(depth) = t.signals.last().map(|s| s.depth) else {
                    return;
                };
                while t.stack.len() > depth {
                    t.pop(&mut self.tree);
                }
                if let Some((sp, last_sp)) = t.end_signal() {
                    (t.sp, t.last_sp) = (sp, last_sp);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::classify::{CodeClass, FnConfig, Section};
    use crate::output::OutputOptions;
    use callgrind::{Item, JumpKind, Profile};
    use std::rc::Rc;

    /// Functions by address range: (start, end, name, object, section).
    #[derive(Clone)]
    struct Fake(Vec<(u64, u64, &'static str, &'static str, Section)>);

    impl Classify for Fake {
        fn classify(&mut self, info: &BlockInfo) -> CodeClass {
            let a = info.start();
            let &(start, _, name, object, section) = self
                .0
                .iter()
                .find(|f| f.0 <= a && a < f.1)
                .expect("a fake function");
            CodeClass {
                object: object.into(),
                file: "f.c".into(),
                function: name.into(),
                entry: a == start,
                section,
                config: Default::default(),
            }
        }
        fn fork(&self) -> Box<dyn Classify> {
            Box::new(self.clone())
        }
    }

    fn program() -> Fake {
        Fake(vec![
            (0x1000, 0x2000, "main", "exe", Section::Text),
            (0x2000, 0x3000, "f", "exe", Section::Text),
            (0x3000, 0x4000, "g", "exe", Section::Text),
            (0x4000, 0x5000, "h", "exe", Section::Text),
            (0x5000, 0x5010, "0x5000 [PLT]", "exe", Section::Plt),
            (0x9000, 0xa000, "lib", "libc", Section::Text),
            (0xa000, 0xb000, "restorer", "libc", Section::Text),
        ])
    }

    /// Self Ir by function name.
    type Selfs = Vec<(String, u64)>;
    /// (caller, callee, calls, inclusive) by names.
    type Arcs = Vec<(String, String, u64, u64)>;

    /// Runs blocks: (start, instructions, terminator, stack pointer before
    /// the last instruction).
    struct Run {
        tool: CallTool,
        ids: FxHashMap<u64, u32>,
    }

    impl Run {
        fn new() -> Run {
            Run {
                tool: CallTool::new(CallOptions::default(), Box::new(program())),
                ids: FxHashMap::default(),
            }
        }

        fn block(&mut self, start: u64, n: u64, term: Terminator, sp: Option<u64>) {
            let next = self.ids.len() as u32;
            let id = *self.ids.entry(start).or_insert(next);
            let mut info = BlockInfo::new(start, term);
            for i in 0..n {
                info.push(start + i, 1, &[]);
            }
            if id == next {
                self.tool.block(BlockId(id), &info);
            }
            self.tool.block_run(BlockId(id), &info, &[]);
            if let Some(sp) = sp {
                self.tool.stack_pointer(sp);
            }
        }

        /// Self Ir per (function, level), and arcs as (caller, callee,
        /// calls, inclusive), by names.
        fn results(&mut self) -> (Selfs, Arcs) {
            self.tool.finish();
            let t = &self.tool;
            let name = |n: NodeId| {
                let node = t.tree.nodes[n as usize];
                let f = &t.functions[node.function as usize].class.function;
                if node.level > 1 {
                    format!("{f}'{}", node.level)
                } else {
                    f.to_string()
                }
            };
            let mut selfs: FxHashMap<String, u64> = FxHashMap::default();
            for (&(n, b), &runs) in t.tree.run_keys.iter().zip(&t.tree.runs) {
                *selfs.entry(name(n)).or_default() += runs * t.block_state(b).instrs.len() as u64;
            }
            for (&(n, _), &ir) in t.tree.extra.iter() {
                *selfs.entry(name(n)).or_default() += ir;
            }
            let mut selfs: Vec<_> = selfs.into_iter().collect();
            selfs.sort();
            let mut arcs: Vec<_> = t
                .tree
                .arcs
                .iter()
                .map(|a| (name(a.caller), name(a.callee), a.calls, a.inclusive))
                .collect();
            arcs.sort();
            (selfs, arcs)
        }
    }

    fn s(v: &[(&str, u64)]) -> Selfs {
        v.iter().map(|&(n, c)| (n.to_string(), c)).collect()
    }

    fn a(v: &[(&str, &str, u64, u64)]) -> Arcs {
        v.iter()
            .map(|&(x, y, c, i)| (x.to_string(), y.to_string(), c, i))
            .collect()
    }

    const CALL_F: Terminator = Terminator::Call { target: 0x2000 };

    #[test]
    fn calls_returns_and_recursion_levels() {
        let mut r = Run::new();
        r.tool.thread(7);
        r.block(0x1000, 3, CALL_F, Some(0x8000)); // main calls f
        r.block(0x2000, 2, Terminator::CondJump { target: 0x2010 }, None);
        r.block(0x2002, 2, CALL_F, Some(0x7ff0)); // f calls f
        r.block(0x2000, 2, Terminator::CondJump { target: 0x2010 }, None);
        r.block(0x2010, 1, Terminator::Return, Some(0x7fe8)); // f'2 returns
        r.block(0x2004, 1, Terminator::Jump { target: 0x2010 }, None);
        r.block(0x2010, 1, Terminator::Return, Some(0x7ff8)); // f returns
        r.block(0x1003, 4, Terminator::Syscall, None);
        let (selfs, arcs) = r.results();
        assert_eq!(selfs, s(&[("f", 6), ("f'2", 3), ("main", 7)]));
        assert_eq!(arcs, a(&[("f", "f'2", 1, 3), ("main", "f", 1, 9)]));
        assert_eq!(r.tool.total(), 16);
        assert_eq!(r.tool.threads(), [1]);
    }

    #[test]
    fn a_jump_to_a_function_start_is_a_tail_call() {
        let mut r = Run::new();
        r.block(0x1000, 2, Terminator::Call { target: 0x3000 }, Some(0x8000));
        r.block(0x3000, 3, Terminator::Jump { target: 0x4000 }, None); // g -> h
        r.block(0x4000, 2, Terminator::Return, Some(0x7ff8)); // h returns to main
        r.block(0x1002, 1, Terminator::Syscall, None);
        let (selfs, arcs) = r.results();
        assert_eq!(selfs, s(&[("g", 3), ("h", 2), ("main", 3)]));
        assert_eq!(arcs, a(&[("g", "h", 1, 2), ("main", "g", 1, 5)]));
    }

    #[test]
    fn longjmp_unwinds_by_the_stack_pointer() {
        let mut r = Run::new();
        r.block(0x1000, 2, Terminator::Call { target: 0x3000 }, Some(0x8000));
        r.block(0x3000, 1, Terminator::Call { target: 0x4000 }, Some(0x7f00));
        // h jumps back into main's frame (SP back above both frames).
        r.block(0x4000, 4, Terminator::IndirectJump, Some(0x8000));
        r.block(0x1010, 1, Terminator::Syscall, None);
        let (selfs, arcs) = r.results();
        assert_eq!(selfs, s(&[("g", 1), ("h", 4), ("main", 3)]));
        assert_eq!(arcs, a(&[("g", "h", 1, 4), ("main", "g", 1, 5)]));
    }

    #[test]
    fn plt_stubs_are_skipped_and_charged_to_the_call_site() {
        let mut r = Run::new();
        r.block(0x1000, 2, Terminator::Call { target: 0x5000 }, Some(0x8000));
        r.block(0x5000, 1, Terminator::IndirectJump, Some(0x7ff8)); // PLT -> libc
        r.block(0x9000, 5, Terminator::Return, Some(0x7ff8));
        r.block(0x1002, 1, Terminator::Syscall, None);
        let (selfs, arcs) = r.results();
        assert_eq!(selfs, s(&[("lib", 5), ("main", 4)]));
        assert_eq!(arcs, a(&[("main", "lib", 1, 5)]));
        // The stub's Ir sits on main's call instruction.
        let main_site = r
            .tool
            .tree
            .extra
            .iter()
            .map(|(k, _)| k.1)
            .collect::<Vec<_>>();
        assert_eq!(main_site, [0x1001]);
        // With --skip-plt=no the stub is a function of its own.
        let mut r = Run::new();
        let options = CallOptions {
            skip_plt: false,
            ..CallOptions::default()
        };
        r.tool = CallTool::new(options, Box::new(program()));
        r.block(0x1000, 2, Terminator::Call { target: 0x5000 }, Some(0x8000));
        r.block(0x5000, 1, Terminator::IndirectJump, Some(0x7ff8));
        r.block(0x9000, 5, Terminator::Return, Some(0x7ff8));
        r.block(0x1002, 1, Terminator::Syscall, None);
        let (_, arcs) = r.results();
        assert_eq!(
            arcs,
            a(&[
                ("0x5000 [PLT]", "lib", 1, 5),
                ("main", "0x5000 [PLT]", 1, 6)
            ])
        );
    }

    /// Self Ir per function name of the part the tool lays out.
    fn part_selfs(r: &mut Run) -> Selfs {
        r.tool.finish();
        let mut profile = Profile::default();
        let mut locate = |a: u64| (Rc::from("f.c"), (a & 0xfff) as u32);
        let part = r
            .tool
            .part(&mut profile, OutputOptions::default(), None, &mut locate);
        let mut selfs: FxHashMap<String, u64> = FxHashMap::default();
        for b in &part.blocks {
            let name = profile.names.functions.text(b.function).to_string();
            for item in &b.items {
                if let Item::Cost { costs, .. } = item {
                    *selfs.entry(name.clone()).or_default() += costs[0];
                }
            }
        }
        let mut selfs: Vec<_> = selfs.into_iter().collect();
        selfs.sort();
        selfs
    }

    /// [`Fake`] with per-function options, by name.
    #[derive(Clone)]
    struct Configured(Fake, Vec<(&'static str, FnConfig)>);

    impl Classify for Configured {
        fn classify(&mut self, info: &BlockInfo) -> CodeClass {
            let mut c = self.0.classify(info);
            if let Some(&(_, config)) = self.1.iter().find(|(n, _)| **n == *c.function) {
                c.config = config;
            }
            c
        }
        fn fork(&self) -> Box<dyn Classify> {
            Box::new(self.clone())
        }
    }

    /// main calls f, f calls g, g calls f (f'2: a mutual recursion), f'2
    /// calls itself (a direct one), all return, then main calls f again
    /// (level 1 again: every count went back down). Under `options`, with
    /// `configs` per function.
    fn recursions(options: CallOptions, configs: Vec<(&'static str, FnConfig)>) -> (Selfs, Arcs) {
        let mut r = Run::new();
        r.tool = CallTool::new(options, Box::new(Configured(program(), configs)));
        let f_start = Terminator::CondJump { target: 0x2010 };
        r.block(0x1000, 2, CALL_F, Some(0x8000));
        r.block(0x2000, 1, f_start, None);
        r.block(0x2001, 1, Terminator::Call { target: 0x3000 }, Some(0x7ff0));
        r.block(0x3000, 1, CALL_F, Some(0x7fe0));
        r.block(0x2000, 1, f_start, None);
        r.block(0x2010, 1, CALL_F, Some(0x7fd0));
        r.block(0x2000, 1, f_start, None);
        r.block(0x2020, 1, Terminator::Return, Some(0x7fc8));
        r.block(0x2011, 1, Terminator::Return, Some(0x7fd8));
        r.block(0x3001, 1, Terminator::Return, Some(0x7fe8));
        r.block(0x2002, 1, Terminator::Return, Some(0x7ff8));
        r.block(0x1002, 1, CALL_F, Some(0x8000));
        r.block(0x2000, 1, f_start, None);
        r.block(0x2002, 1, Terminator::Return, Some(0x7ff8));
        r.block(0x1003, 1, Terminator::Syscall, None);
        r.results()
    }

    #[test]
    fn skip_direct_rec_keeps_only_a_direct_recursion_at_its_level() {
        let options = |skip_direct_rec| CallOptions {
            separate_recs: 3,
            skip_direct_rec,
            ..CallOptions::default()
        };
        let (selfs, arcs) = recursions(options(false), Vec::new());
        assert_eq!(
            selfs,
            s(&[("f", 5), ("f'2", 3), ("f'3", 2), ("g", 2), ("main", 4)])
        );
        assert!(arcs.contains(&("f'2".into(), "f'3".into(), 1, 2)));
        let (selfs, arcs) = recursions(options(true), Vec::new());
        assert_eq!(selfs, s(&[("f", 5), ("f'2", 5), ("g", 2), ("main", 4)]));
        assert_eq!(
            arcs,
            a(&[
                ("f", "g", 1, 7),
                ("f'2", "f'2", 1, 2),
                ("g", "f'2", 1, 5),
                ("main", "f", 1, 2),
                ("main", "f", 1, 10)
            ])
        );
    }

    #[test]
    fn a_functions_separate_recs_caps_its_own_levels() {
        let recs = |n| FnConfig {
            separate_recs: Some(n),
            ..FnConfig::default()
        };
        let (selfs, _) = recursions(CallOptions::default(), vec![("f", recs(3))]);
        assert_eq!(
            selfs,
            s(&[("f", 5), ("f'2", 3), ("f'3", 2), ("g", 2), ("main", 4)])
        );
        let (selfs, _) = recursions(CallOptions::default(), vec![("f", recs(1))]);
        assert_eq!(selfs, s(&[("f", 10), ("g", 2), ("main", 4)]));
        // Another function's option leaves f at the global cap.
        let (selfs, _) = recursions(CallOptions::default(), vec![("g", recs(5))]);
        assert_eq!(selfs, s(&[("f", 5), ("f'2", 5), ("g", 2), ("main", 4)]));
    }

    #[test]
    fn separate_callers_name_contexts_by_their_last_callers() {
        let run = |callers| {
            let mut r = Run::new();
            let options = CallOptions {
                separate_callers: callers,
                ..CallOptions::default()
            };
            r.tool = CallTool::new(options, Box::new(program()));
            // main calls f, which calls itself; f'2 calls g; main calls g.
            r.block(0x1000, 2, CALL_F, Some(0x8000));
            r.block(0x2000, 1, Terminator::CondJump { target: 0x2010 }, None);
            r.block(0x2001, 1, CALL_F, Some(0x7ff8));
            r.block(0x2000, 1, Terminator::CondJump { target: 0x2010 }, None);
            r.block(0x2010, 1, Terminator::Call { target: 0x3000 }, Some(0x7ff0));
            r.block(0x3000, 1, Terminator::Return, Some(0x7fe8));
            r.block(0x2011, 1, Terminator::Return, Some(0x7ff0));
            r.block(0x2002, 1, Terminator::Return, Some(0x7ff8));
            r.block(0x1002, 1, Terminator::Call { target: 0x3000 }, Some(0x8000));
            r.block(0x3000, 1, Terminator::Return, Some(0x7ff8));
            r.block(0x1003, 1, Terminator::Syscall, None);
            part_selfs(&mut r)
        };
        let plain = s(&[("f", 3), ("f'2", 3), ("g", 2), ("main", 4)]);
        assert_eq!(run(0), plain);
        assert_eq!(
            run(1),
            s(&[
                ("f'2'main", 3),
                ("f'main", 3),
                ("g'f", 1),
                ("g'main", 1),
                ("main", 4)
            ])
        );
        // f'2 is called by f, but Callgrind's stack has f once: g's
        // second caller is main.
        assert_eq!(
            run(2),
            s(&[
                ("f'2'main", 3),
                ("f'main", 3),
                ("g'f'main", 1),
                ("g'main", 1),
                ("main", 4)
            ])
        );
    }

    #[test]
    fn a_signal_handler_is_a_root_and_its_return_an_underflow() {
        let mut r = Run::new();
        r.block(0x1000, 2, Terminator::Call { target: 0x2000 }, Some(0x8000));
        r.block(0x2000, 3, Terminator::Jump { target: 0x2100 }, None);
        r.tool.signal(SignalEvent::Delivered);
        r.block(0x3000, 4, Terminator::Return, Some(0x7000)); // handler g
        r.block(0xa000, 2, Terminator::Syscall, None); // restorer: rt_sigreturn
        r.tool.signal(SignalEvent::Returned);
        r.block(0x2100, 1, Terminator::Return, Some(0x7ff8));
        r.block(0x1002, 1, Terminator::Syscall, None);
        let (selfs, arcs) = r.results();
        assert_eq!(
            selfs,
            s(&[("f", 4), ("g", 4), ("main", 3), ("restorer", 2)])
        );
        // The handler's cost is not f's, and returning to the restorer
        // makes no arc (Valgrind's handlers return to its own trampoline).
        assert_eq!(arcs, a(&[("main", "f", 1, 4)]));
        // A return below a thread's first function does.
        let mut r = Run::new();
        r.block(0x3000, 4, Terminator::Return, Some(0x7000));
        r.block(0xa000, 2, Terminator::Syscall, None);
        let (_, arcs) = r.results();
        assert_eq!(arcs, a(&[("restorer", "g", 1, 4)]));
    }

    #[test]
    fn threads_have_their_own_stacks_and_numbers() {
        let mut r = Run::new();
        r.tool.thread(0x100);
        r.block(0x1000, 2, CALL_F, Some(0x8000));
        r.tool.thread(0x200);
        r.block(0x3000, 1, Terminator::Call { target: 0x4000 }, Some(0x6000));
        r.tool.thread(0x100);
        r.block(0x2000, 1, Terminator::Return, Some(0x7ff8));
        r.tool.thread(0x200);
        r.block(0x4000, 1, Terminator::Return, Some(0x5ff8));
        r.block(0x3001, 1, Terminator::Call { target: 0x4000 }, Some(0x5ff8));
        r.tool.thread_end(0x200);
        // The third thread reuses the second's number and what it left:
        // it continues in h's context, whose call is unwound at the end.
        r.tool.thread(0x300);
        r.block(0x4010, 3, Terminator::Syscall, None);
        let (selfs, arcs) = r.results();
        assert_eq!(selfs, s(&[("f", 1), ("g", 2), ("h", 4), ("main", 2)]));
        assert_eq!(
            arcs,
            a(&[("g", "h", 1, 1), ("g", "h", 1, 3), ("main", "f", 1, 1)])
        );
        assert_eq!(r.tool.threads(), [1, 2]);
    }

    /// The jumps of the final dump: (from block, to block, count,
    /// executions of the block left, conditional), by block starts.
    fn jumps(r: &mut Run) -> Vec<(u64, u64, u64, u64, bool)> {
        r.tool.finish();
        let t = &mut r.tool;
        let dump = t.final_dump();
        let start = |b: u32| t.block_state(b).instrs[0];
        dump.costs
            .jumps
            .iter()
            .map(|j| {
                let cond = t.block_state(j.from.1).jumps.conditional();
                (start(j.from.1), start(j.to.1), j.count, j.executed, cond)
            })
            .collect()
    }

    fn collecting_jumps() -> Run {
        let mut r = Run::new();
        let options = CallOptions {
            collect_jumps: true,
            ..CallOptions::default()
        };
        r.tool = CallTool::new(options, Box::new(program()));
        r
    }

    #[test]
    fn jumps_that_stay_in_a_context_are_counted() {
        let mut r = collecting_jumps();
        r.block(0x1000, 2, CALL_F, Some(0x8000));
        r.block(0x2000, 1, Terminator::FallThrough, None);
        // f's loop: taken twice, then not taken (no jump).
        for _ in 0..3 {
            r.block(0x2001, 2, Terminator::CondJump { target: 0x2001 }, None);
        }
        r.block(0x2003, 1, Terminator::Jump { target: 0x2004 }, None); // to its end
        r.block(0x2004, 1, Terminator::Jump { target: 0x2010 }, None);
        r.block(0x2010, 2, Terminator::IndirectJump, Some(0x7ff8));
        r.block(0x2020, 1, Terminator::Jump { target: 0x3000 }, None); // tail call
        r.block(0x3000, 1, Terminator::Return, Some(0x7ff8));
        r.block(0x1002, 1, Terminator::Syscall, None);
        assert_eq!(
            jumps(&mut r),
            [
                (0x2001, 0x2001, 2, 3, true),
                (0x2004, 0x2010, 1, 1, false),
                (0x2010, 0x2020, 1, 1, false),
            ]
        );
        let mut profile = Profile::default();
        let mut locate = |a: u64| (Rc::from("f.c"), (a & 0xfff) as u32);
        let part = r
            .tool
            .part(&mut profile, OutputOptions::default(), None, &mut locate);
        let f = profile.names.functions.intern("f");
        let block = part.blocks.iter().find(|b| b.function == f).unwrap();
        let written: Vec<_> = block
            .items
            .iter()
            .filter_map(|i| match i {
                Item::Jump(j) => Some((j.source.line, j.target.line, j.kind)),
                _ => None,
            })
            .collect();
        assert_eq!(
            written,
            [
                (
                    0x2,
                    0x1,
                    JumpKind::Conditional {
                        taken: 2,
                        executed: 3
                    }
                ),
                (0x4, 0x10, JumpKind::Always { count: 1 }),
                (0x11, 0x20, JumpKind::Always { count: 1 }),
            ]
        );
        // Without the option, nothing is counted.
        let mut r = Run::new();
        r.block(0x2000, 1, Terminator::FallThrough, None);
        r.block(0x2001, 2, Terminator::CondJump { target: 0x2001 }, None);
        r.block(0x2001, 2, Terminator::CondJump { target: 0x2001 }, None);
        assert!(jumps(&mut r).is_empty());
    }

    #[test]
    fn a_dump_writes_the_jumps_of_the_cells_that_ran() {
        let mut r = collecting_jumps();
        r.block(0x2000, 1, Terminator::FallThrough, None);
        r.block(0x2001, 1, Terminator::Jump { target: 0x2010 }, None);
        r.block(0x2010, 1, Terminator::Jump { target: 0x2001 }, None);
        r.block(0x2001, 1, Terminator::Jump { target: 0x2010 }, None);
        r.tool
            .client_request(&ClientRequest::DumpStats { reason: None });
        r.block(0x2010, 1, Terminator::Syscall, None);
        let first = &r.tool.take_dumps()[0].costs.jumps;
        assert_eq!(first.len(), 2);
        assert_eq!(first.iter().map(|j| j.count).sum::<u64>(), 2);
        // The jump after the dump is the next dump's.
        let rest = jumps(&mut r);
        assert_eq!(rest.len(), 1);
        assert_eq!(rest[0].2, 1);
    }

    #[test]
    fn a_forked_copy_continues_independently() {
        let mut r = Run::new();
        r.block(0x1000, 2, CALL_F, Some(0x8000));
        let mut child = r.tool.fork();
        r.block(0x2000, 1, Terminator::Return, Some(0x7ff8));
        r.block(0x1002, 1, Terminator::Syscall, None);
        let info = {
            let mut i = BlockInfo::new(0x2000, Terminator::Return);
            i.push(0x2000, 1, &[]);
            i
        };
        child.block_run(BlockId(1), &info, &[]);
        child.finish();
        assert_eq!(child.total(), 3);
        assert_eq!(r.tool.total(), 4);
    }
}
