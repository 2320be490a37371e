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

use crate::classify::{Classify, CodeClass, Section};
use crate::tree::{FnId, NodeId, Tree, NO_NODE};
use events::{BlockId, BlockInfo, Needs, Record, SignalEvent, Terminator, Tool};
use rustc_hash::FxHashMap;
use std::sync::Arc;

/// Callgrind's options that shape the call graph.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallOptions {
    /// `--separate-recs`: recursion levels kept apart (default 2).
    pub separate_recs: u32,
    /// `--skip-plt`: PLT stubs are no functions of their own (default yes).
    pub skip_plt: bool,
}

impl Default for CallOptions {
    fn default() -> Self {
        CallOptions {
            separate_recs: 2,
            skip_plt: true,
        }
    }
}

/// A function as the tool knows it.
#[derive(Debug, Clone)]
pub(crate) struct Function {
    /// Its name, file and object.
    pub class: CodeClass,
    /// Calls to it push no context (`--skip-plt`).
    skip: bool,
    /// A jump out of it first returns from it (`_dl_runtime_resolve`,
    /// which ends by jumping to the function it resolved).
    pop_on_jump: bool,
}

/// How control leaves a block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Exit {
    Call,
    Return,
    Jump,
    /// Into the next block without a branch (a rep string instruction's
    /// block runs again for each iteration this way).
    FallThrough,
}

/// What the tool keeps of each block.
#[derive(Debug, Clone)]
pub(crate) struct BlockState {
    function: FnId,
    object: u32,
    section: Section,
    entry: bool,
    start: u64,
    /// The address of its last instruction: where its call or jump is.
    call_site: u64,
    /// Where a call returns to.
    end: u64,
    exit: Exit,
    /// Its instructions' addresses.
    pub instrs: Box<[u64]>,
    /// The context it ran in last and that pair's run slot.
    cache: (NodeId, u32),
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
}

/// What a signal handler's start put aside.
#[derive(Debug, Clone)]
struct Interrupted {
    depth: usize,
    node: NodeId,
    last: Option<u32>,
    nonskipped: Option<(NodeId, u64)>,
    cost: u64,
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
}

impl ThreadState {
    fn new(tid: u32) -> ThreadState {
        ThreadState {
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

    /// Back to the code a handler interrupted.
    fn end_signal(&mut self) {
        if let Some(s) = self.signals.pop() {
            self.node = s.node;
            self.last = s.last;
            self.nonskipped = s.nonskipped;
            self.cost = s.cost;
            self.sp = None;
        }
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
            let n = self.active_mut(f.function);
            *n = n.saturating_sub(1);
        }
        self.node = f.caller;
        self.nonskipped = f.nonskipped;
    }

    /// Pops the frames the stack pointer `sp` has left, and at least
    /// `min_pops` frames entered at `sp` (without `sp`: `min_pops` frames).
    /// Returns how many were popped.
    fn unwind(&mut self, sp: Option<u64>, mut min_pops: u32, tree: &mut Tree) -> u32 {
        let mut popped = 0;
        while let Some(top) = self.stack.last() {
            let left = sp.is_some_and(|sp| top.sp < sp);
            let at = sp.is_none_or(|sp| top.sp == sp);
            if !(left || (at && min_pops > 0)) {
                break;
            }
            min_pops = min_pops.saturating_sub(1);
            self.pop(tree);
            popped += 1;
        }
        popped
    }
}

/// The call tool (see the crate documentation).
pub struct CallTool {
    options: CallOptions,
    classify: Box<dyn Classify>,
    pub(crate) functions: Vec<Function>,
    function_index: FxHashMap<CodeClassKey, FnId>,
    objects: FxHashMap<Arc<str>, u32>,
    pub(crate) blocks: Vec<Option<BlockState>>,
    threads: Vec<ThreadState>,
    thread_index: FxHashMap<u64, usize>,
    current: Option<usize>,
    pub(crate) tree: Tree,
    /// Block executions (Callgrind's "basic blocks" for `Timerange:`).
    pub(crate) block_runs: u64,
}

/// A function's identity: object, file, name.
type CodeClassKey = (Arc<str>, Arc<str>, Arc<str>);

impl CallTool {
    /// A tool naming functions with `classify`.
    pub fn new(options: CallOptions, classify: Box<dyn Classify>) -> CallTool {
        CallTool {
            options,
            classify,
            functions: Vec::new(),
            function_index: FxHashMap::default(),
            objects: FxHashMap::default(),
            blocks: Vec::new(),
            threads: Vec::new(),
            thread_index: FxHashMap::default(),
            current: None,
            tree: Tree::default(),
            block_runs: 0,
        }
    }

    /// A copy for a forked child: same costs, stacks and functions.
    pub fn fork(&self) -> CallTool {
        CallTool {
            options: self.options.clone(),
            classify: self.classify.fork(),
            functions: self.functions.clone(),
            function_index: self.function_index.clone(),
            objects: self.objects.clone(),
            blocks: self.blocks.clone(),
            threads: self.threads.clone(),
            thread_index: self.thread_index.clone(),
            current: self.current,
            tree: self.tree.clone(),
            block_runs: self.block_runs,
        }
    }

    /// Ends every thread's calls (the process ended): their arcs get the
    /// inclusive costs so far, as Callgrind unwinds at exit.
    pub fn finish(&mut self) {
        for t in &mut self.threads {
            while !t.stack.is_empty() {
                t.pop(&mut self.tree);
            }
        }
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

    fn function_of(&mut self, class: CodeClass) -> FnId {
        let key = (
            class.object.clone(),
            class.file.clone(),
            class.function.clone(),
        );
        if let Some(&f) = self.function_index.get(&key) {
            return f;
        }
        let f = self.functions.len() as FnId;
        self.functions.push(Function {
            skip: class.section == Section::Plt && self.options.skip_plt,
            pop_on_jump: class.function.starts_with("_dl_runtime_resolve"),
            class,
        });
        self.function_index.insert(key, f);
        f
    }

    fn describe(&mut self, id: BlockId, info: &BlockInfo) {
        let class = self.classify.classify(info);
        let next = self.objects.len() as u32;
        let object = *self.objects.entry(class.object.clone()).or_insert(next);
        let (section, entry) = (class.section, class.entry);
        let function = self.function_of(class);
        let exit = match info.terminator() {
            Terminator::Call { .. } | Terminator::IndirectCall => Exit::Call,
            Terminator::Return => Exit::Return,
            Terminator::FallThrough => Exit::FallThrough,
            _ => Exit::Jump,
        };
        let i = id.0 as usize;
        if self.blocks.len() <= i {
            self.blocks.resize(i + 1, None);
        }
        self.blocks[i] = Some(BlockState {
            function,
            object,
            section,
            entry,
            start: info.start(),
            call_site: info.instrs().last().map_or(info.start(), |l| l.addr),
            end: info.end(),
            exit,
            instrs: info.instrs().iter().map(|i| i.addr).collect(),
            cache: (NO_NODE, 0),
        });
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

    /// Control enters block `y` on the current thread.
    fn enter(&mut self, y: u32) {
        let ti = self.current();
        let blocks = &self.blocks;
        let functions = &self.functions;
        let tree = &mut self.tree;
        let t = &mut self.threads[ti];
        let yb = blocks[y as usize].as_ref().expect("described");
        let sp = t.sp.take();
        if let Some(sp) = sp {
            t.last_sp = sp;
        }
        let xb = t
            .last
            .map(|l| blocks[l as usize].as_ref().expect("described"));
        if let Some(x) = xb {
            // A rep string instruction's next iteration.
            if x.exit == Exit::FallThrough && t.last == Some(y) {
                return;
            }
        }
        #[derive(PartialEq)]
        enum Kind {
            None,
            Call,
            Return,
            Jump,
        }
        let mut kind = match xb.map(|x| x.exit) {
            None => Kind::None,
            Some(Exit::Call) => Kind::Call,
            Some(Exit::Return) => Kind::Return,
            Some(Exit::Jump | Exit::FallThrough) => Kind::Jump,
        };
        // A return that does not leave the top frame is a jump.
        let mut pops = 1;
        let mut ret_without_call = false;
        let bottom = t.bottom();
        if kind == Kind::Return && t.stack.len() > bottom {
            let top = t.stack.len() - 1;
            if let Some(sp) = sp {
                if sp < t.stack[top].sp {
                    pops = 0;
                } else if sp == t.stack[top].sp {
                    let mut i = top;
                    loop {
                        if t.stack[i].ret_addr == yb.start {
                            break;
                        }
                        if i > 0 {
                            i -= 1;
                            if t.stack[i].sp == sp {
                                pops += 1;
                                continue;
                            }
                        }
                        pops = 0;
                        break;
                    }
                }
            }
            if pops == 0 {
                kind = Kind::Jump;
                ret_without_call = true;
            }
        }
        // A jump into a function's start, another object or section kind
        // is a call.
        let mut emulated = false;
        let mut push_sp = sp;
        let mut call_site = xb.map_or(yb.start, |x| x.call_site);
        if let (Kind::Jump, Some(x)) = (&kind, xb) {
            if ret_without_call || yb.entry || x.section != yb.section || x.object != yb.object {
                if functions[x.function as usize].pop_on_jump && !t.stack.is_empty() {
                    let top = t.stack.last().expect("not empty");
                    if let Some(a) = top.arc {
                        // The resolver's caller calls what it resolved.
                        call_site = tree.arcs[a as usize].call_site;
                        push_sp = Some(top.sp);
                        t.pop(tree);
                    }
                }
                kind = Kind::Call;
                emulated = true;
            }
        }
        let skip = kind == Kind::Call && functions[yb.function as usize].skip;
        let mut push = false;
        if kind == Kind::Return {
            if t.stack.len() <= bottom {
                // A handler returning to the restorer: under Valgrind it
                // returns into Valgrind's own sigreturn trampoline, which is
                // not profiled, so no arc is made.
                let arc = t.signals.is_empty();
                underflow(t, tree, xb, yb, self.options.separate_recs, arc);
            } else {
                t.unwind(sp, pops, tree);
            }
        } else {
            if sp.is_some() && t.unwind(sp, 0, tree) > 0 {
                kind = Kind::Return;
            }
            if kind == Kind::Call {
                push = true;
                if emulated {
                    if let Some(top) = t.stack.last() {
                        push_sp = Some(top.sp);
                    }
                }
            }
        }
        let caller = t.node;
        if (push && !skip) || t.node == NO_NODE {
            let active = t.active_mut(yb.function);
            let mut level = *active + u32::from(push && !skip);
            level = level.min(self.options.separate_recs.max(1));
            if level == 0 {
                level = 1;
                *active = 1;
            }
            let parent = if push && !skip { caller } else { NO_NODE };
            t.node = tree.child(parent, yb.function, level, t.tid);
        }
        if push {
            let ret_addr = match xb {
                Some(x) if x.exit == Exit::Call => x.end,
                _ => 0,
            };
            let mut frame = Frame {
                sp: push_sp.unwrap_or(t.last_sp),
                ret_addr,
                arc: None,
                function: yb.function,
                caller,
                enter_cost: t.cost,
                nonskipped: t.nonskipped,
            };
            if skip {
                if t.nonskipped.is_none() {
                    t.nonskipped = Some((caller, call_site));
                }
            } else {
                // A call from skipped code is the skipping caller's.
                let (from, site) = t.nonskipped.unwrap_or((caller, call_site));
                let a = tree.arc(from, site, t.node, yb.start);
                tree.arcs[a as usize].calls += 1;
                frame.arc = Some(a);
                *t.active_mut(yb.function) += 1;
                t.nonskipped = None;
            }
            t.stack.push(frame);
        }
    }

    /// Charges one execution of block `y` to the current context.
    fn charge(&mut self, y: u32) {
        let ti = self.current();
        let t = &mut self.threads[ti];
        let b = self.blocks[y as usize].as_mut().expect("described");
        let n = b.instrs.len() as u64;
        t.cost += n;
        t.last = Some(y);
        self.block_runs += 1;
        if let Some(at) = t.nonskipped {
            *self.tree.extra.entry(at).or_default() += n;
            return;
        }
        let slot = if b.cache.0 == t.node {
            b.cache.1
        } else {
            let slot = self.tree.run_slot(t.node, y);
            b.cache = (t.node, slot);
            slot
        };
        self.tree.runs[slot as usize] += 1;
    }
}

/// A return with no frame to return from (Callgrind's `handleUnderflow`):
/// the function returned to becomes a root context, with an arc (if `arc`,
/// as if it had called) to the returning context carrying the cost so far.
fn underflow(
    t: &mut ThreadState,
    tree: &mut Tree,
    x: Option<&BlockState>,
    y: &BlockState,
    separate_recs: u32,
    arc: bool,
) {
    let returning = t.node;
    if returning != NO_NODE {
        let f = tree.nodes[returning as usize].function;
        let n = t.active_mut(f);
        *n = n.saturating_sub(1);
    }
    let active = t.active_mut(y.function);
    let mut level = (*active).min(separate_recs.max(1));
    if level == 0 {
        level = 1;
        *active = 1;
    }
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

impl Tool for CallTool {
    fn needs(&self) -> Needs {
        Needs {
            calls_returns: true,
            ..Needs::COUNTING
        }
    }

    fn block(&mut self, id: BlockId, info: &BlockInfo) {
        self.describe(id, info);
    }

    fn record(&mut self, record: Record) {
        // The final check of a rep string instruction (one fetch of the
        // block it belongs to).
        if let Record::Instr(f) = record {
            let ti = self.current();
            let t = &mut self.threads[ti];
            t.cost += 1;
            let at = t.nonskipped.unwrap_or((t.node, f.addr));
            *self.tree.extra.entry(at).or_default() += 1;
        }
    }

    fn block_run(&mut self, id: BlockId, info: &BlockInfo, _addrs: &[u64]) {
        if self.blocks.get(id.0 as usize).is_none_or(Option::is_none) {
            self.describe(id, info);
        }
        self.enter(id.0);
        self.charge(id.0);
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
                self.threads.push(ThreadState::new(tid));
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
        let Some(last) = t.last else { return };
        let after = match self.blocks[last as usize].as_ref().map(|b| b.exit) {
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
        match event {
            SignalEvent::Delivered => {
                t.signals.push(Interrupted {
                    depth: t.stack.len(),
                    node: t.node,
                    last: t.last,
                    nonskipped: t.nonskipped,
                    cost: t.cost,
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
                t.end_signal();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
            for (&(n, _), &ir) in &t.tree.extra {
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
        let main_site = r.tool.tree.extra.keys().map(|k| k.1).collect::<Vec<_>>();
        assert_eq!(main_site, [0x1001]);
        // With --skip-plt=no the stub is a function of its own.
        let mut r = Run::new();
        r.tool.options.skip_plt = false;
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
