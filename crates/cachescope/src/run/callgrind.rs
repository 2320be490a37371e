//! `--tool=callgrind`: [`callstack::CallTool`] fed by the engine's trace
//! stream, one per process (a forked child continues with a copy), and at
//! each process's exit its `callgrind.out` file and Callgrind's summary.
//!
//! The tool runs in the engine's consumer thread and names each block's
//! function as it is translated (Callgrind decides calls by functions,
//! objects and sections); symbol tables are not shareable between threads,
//! so that thread keeps its own [`Symbolizer`] (the run's own one symbolizes
//! positions at exit).

use std::any::Any;
use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;

use callstack::{CallTool, Classify, CodeClass, FnConfig, Section};
use costs::BlockSim;
use engine::{ProcessProfile, StreamTool, ToolFactory};
use events::{BlockId, BlockInfo, ClientRequest, CodeOrigin, Needs, Record, SignalEvent, Tool};
use profile::output::{write_output, OutputError};
use symbols::{Mapping, NameOptions, ObjectInfo, SectionKind, Symbolizer, UNKNOWN};

use super::attribute;
use super::cgopts::{CallgrindOptions, ClientContexts};
use super::options::RunOptions;
use super::skip::glob_match;
use super::CgSink;
use cachesim::CacheSim;

thread_local! {
    /// The naming thread's symbolizer and what it named (see the module
    /// documentation): the consumer thread's on the stream path, the
    /// tracer thread's in contexts mode.
    static NAMING: RefCell<Naming> = RefCell::new(Naming::default());
}

/// The classifier's tables: their keys are addresses, pointers and
/// names, none chosen to collide, and SipHash was a tenth of contexts
/// mode's classification.
type FastMap<K, V> = rustc_hash::FxHashMap<K, V>;

/// An origin's object, its load bias and the object's name.
type OriginObject = Option<(Rc<ObjectInfo>, u64, Arc<str>)>;

/// What the naming thread keeps (one per thread, see [`NAMING`]).
#[derive(Default)]
struct Naming {
    /// Made on first use, with the first classifier's name options (a
    /// run has one set).
    symbols: Option<Symbolizer>,
    /// Each origin's object by the origin's address (the origin kept, so
    /// that no other origin gets its address): blocks of one mapping
    /// share their origin, so the object is looked up once per mapping.
    objects: FastMap<usize, (Arc<CodeOrigin>, OriginObject)>,
    /// Function and file names as shared strings, by their text: classes
    /// share them rather than each holding copies.
    names: FastMap<Rc<str>, Arc<str>>,
    /// `???`.
    unknown: Option<Arc<str>>,
    /// Classes by origin (its address, kept in `objects`) and code
    /// address, for classifiers that remember: contexts mode classifies
    /// code as it is translated and its blocks again when the call tool
    /// is built at the process's end, on this thread. By their number in
    /// `distinct`: most blocks of a function have the same class, and cc1
    /// asks about 365,000 addresses.
    classes: FastMap<(usize, u64), u32>,
    /// Each class once, numbered.
    distinct: Interned<CodeClass>,
}

/// Values kept once each, by number.
struct Interned<T> {
    list: Vec<T>,
    numbers: FastMap<T, u32>,
}

impl<T> Default for Interned<T> {
    fn default() -> Self {
        Interned {
            list: Vec::new(),
            numbers: FastMap::default(),
        }
    }
}

impl<T: Clone + Eq + std::hash::Hash> Interned<T> {
    /// The number of `value`, numbered now if it is new.
    fn number(&mut self, value: &T) -> u32 {
        if let Some(&n) = self.numbers.get(value) {
            return n;
        }
        let n = self.list.len() as u32;
        self.list.push(value.clone());
        self.numbers.insert(value.clone(), n);
        n
    }

    /// The value numbered `n`.
    fn get(&self, n: u32) -> &T {
        &self.list[n as usize]
    }
}

impl Naming {
    /// The symbolizer, made on first use showing names under `names`.
    fn symbolizer(&mut self, names: NameOptions) -> &mut Symbolizer {
        self.symbols
            .get_or_insert_with(|| Symbolizer::with_names(names))
    }

    fn unknown(&mut self) -> Arc<str> {
        self.unknown
            .get_or_insert_with(|| Arc::from(UNKNOWN))
            .clone()
    }

    /// The shared string of `name`.
    fn name(&mut self, name: &Rc<str>) -> Arc<str> {
        if let Some(n) = self.names.get(name) {
            return n.clone();
        }
        let n = Arc::<str>::from(&**name);
        self.names.insert(name.clone(), n.clone());
        n
    }

    /// The object `origin` maps, its load bias and its name.
    fn object(&mut self, origin: &Arc<CodeOrigin>, names: NameOptions) -> OriginObject {
        let key = Arc::as_ptr(origin) as usize;
        if let Some((_, o)) = self.objects.get(&key) {
            return o.clone();
        }
        let mapping = Mapping {
            path: origin.path.clone(),
            start: origin.start,
            end: origin.end,
            file_offset: origin.file_offset,
        };
        let object = self
            .symbolizer(names)
            .mapped_object(&mapping)
            .map(|(obj, bias)| {
                let name = Arc::from(obj.path().to_string_lossy().as_ref());
                (obj, bias, name)
            });
        self.objects.insert(key, (origin.clone(), object.clone()));
        object
    }
}

/// Starts reading the object at `path` for the naming thread's
/// symbolizer (this thread's: contexts mode names code on the tracer's
/// thread), which shows names under `names`.
pub(super) fn preload_for_naming(path: &std::path::Path, names: NameOptions) {
    NAMING.with(|n| n.borrow_mut().symbolizer(names).preload(path));
}

/// Names blocks' functions as Callgrind does (`fn.c`): the debug name,
/// else the code's offset in its object (`0x%016x`, ` [PLT]` in the PLT);
/// and matches Callgrind's per-function options against the name (globs)
/// and object (`--obj-skip`: the path).
#[derive(Clone)]
struct SymbolClassifier {
    names: NameOptions,
    patterns: Arc<CallgrindOptions>,
    /// Whether classes are kept by origin and address (contexts mode,
    /// which asks twice; the stream path asks once per block).
    remember: bool,
}

impl SymbolClassifier {
    fn config(&self, function: &str, object: &str) -> FnConfig {
        let o = &self.patterns;
        let any = |list: &[String]| list.iter().any(|p| glob_match(p, function));
        // Of per-function counts (`--separate-callers<N>=`,
        // `--separate-recs<N>=`), the last pattern given that matches
        // decides (Callgrind's order is its pattern tree's).
        let last = |list: &[(u32, String)]| {
            list.iter()
                .rev()
                .find(|(_, p)| glob_match(p, function))
                .map(|&(n, _)| n)
        };
        FnConfig {
            toggle_collect: any(&o.toggle_collect),
            dump_before: any(&o.dump_before),
            dump_after: any(&o.dump_after),
            zero_before: any(&o.zero_before),
            skip: any(&o.fn_skip) || o.obj_skip.iter().any(|p| p == object),
            separate_callers: last(&o.separate_callers_fns),
            separate_recs: last(&o.separate_recs_fns),
        }
    }

    /// The class of the code at `addr`, mapped by `origin`: what
    /// `Symbolizer::code_facts` tells of it, asked of the object directly.
    fn class_at(&self, n: &mut Naming, origin: &Arc<CodeOrigin>, addr: u64) -> CodeClass {
        let Some((obj, bias, object)) = n.object(origin, self.names) else {
            let u = n.unknown();
            let function = Arc::<str>::from(format!("{addr:#018x}"));
            return CodeClass {
                config: self.config(&function, &u),
                object: u.clone(),
                file: u,
                function,
                entry: false,
                section: Section::Other,
            };
        };
        let svma = addr.wrapping_sub(bias);
        // The symbolizer locates only addresses inside the mapping.
        let inside = origin.start <= addr && addr < origin.end;
        let found = inside
            .then(|| obj.function_entry_at(svma, self.names))
            .flatten()
            .filter(|(f, _)| &**f != UNKNOWN);
        let file = match inside.then(|| obj.line_at(svma)).flatten() {
            Some((file, _)) => n.name(&file),
            None => n.unknown(),
        };
        let section = match obj.section_kind(svma) {
            SectionKind::Text => Section::Text,
            SectionKind::Plt => Section::Plt,
            SectionKind::Other => Section::Other,
        };
        let (function, entry) = match found {
            Some((f, entry)) => (n.name(&f), entry),
            None => {
                let plt = if section == Section::Plt {
                    " [PLT]"
                } else {
                    ""
                };
                (Arc::from(format!("{svma:#018x}{plt}")), false)
            }
        };
        CodeClass {
            config: self.config(&function, &object),
            object,
            file,
            function,
            entry,
            section,
        }
    }
}

impl Classify for SymbolClassifier {
    fn classify(&mut self, info: &BlockInfo) -> CodeClass {
        let addr = info.start();
        let Some(origin) = info.origin() else {
            let function = format!("{addr:#018x}");
            let unknown = || Arc::<str>::from(UNKNOWN);
            return CodeClass {
                config: self.config(&function, UNKNOWN),
                object: unknown(),
                file: unknown(),
                function: Arc::from(function),
                entry: false,
                section: Section::Other,
            };
        };
        NAMING.with(|n| {
            let n = &mut *n.borrow_mut();
            let key = (Arc::as_ptr(origin) as usize, addr);
            if self.remember {
                if let Some(&c) = n.classes.get(&key) {
                    return n.distinct.get(c).clone();
                }
            }
            let class = self.class_at(n, origin, addr);
            if self.remember {
                let c = n.distinct.number(&class);
                n.classes.insert(key, c);
            }
            class
        })
    }

    fn fork(&self) -> Box<dyn Classify> {
        Box::new(self.clone())
    }
}

/// A [`CallTool`] the engine can own and fork.
struct LiveCallTool(CallTool);

impl Tool for LiveCallTool {
    fn needs(&self) -> Needs {
        self.0.needs()
    }
    fn block(&mut self, id: BlockId, info: &BlockInfo) {
        self.0.block(id, info);
    }
    fn record(&mut self, record: Record) {
        self.0.record(record);
    }
    // Inline (with `CallTool`'s own): the engine's decoder, compiled for
    // this type, then makes no call for most blocks.
    #[inline(always)]
    fn block_run(&mut self, id: BlockId, info: &BlockInfo, addrs: &[u64]) {
        self.0.block_run(id, info, addrs);
    }
    fn thread(&mut self, thread: u64) {
        self.0.thread(thread);
    }
    fn thread_end(&mut self, thread: u64) {
        self.0.thread_end(thread);
    }
    fn stack_pointer(&mut self, sp: u64) {
        self.0.stack_pointer(sp);
    }
    fn signal(&mut self, event: SignalEvent) {
        self.0.signal(event);
    }
    fn client_request(&mut self, request: &ClientRequest) {
        self.0.client_request(request);
    }
}

impl StreamTool for LiveCallTool {
    fn fork(&self) -> Box<dyn StreamTool> {
        Box::new(LiveCallTool(self.0.fork()))
    }
    fn into_any(self: Box<Self>) -> Box<dyn Any + Send> {
        self
    }
}

/// A fresh call tool per process image, simulating `caches` if given
/// and branches with `--branch-sim=yes`.
pub fn factory(opts: &RunOptions, cg: &CallgrindOptions, caches: Option<CacheSim>) -> ToolFactory {
    let calls = cg.calls.clone();
    let names = opts.names;
    let branch_sim = opts.sim.branch_sim;
    let patterns = Arc::new(cg.clone());
    Arc::new(move || {
        let classify = Box::new(SymbolClassifier {
            names,
            patterns: patterns.clone(),
            remember: false,
        });
        let tool = if caches.is_some() || branch_sim {
            // Callgrind counts a modify as a write.
            let sim = BlockSim::new(caches.clone(), branch_sim, true);
            CallTool::with_sim(calls.clone(), classify, sim)
        } else {
            CallTool::new(calls.clone(), classify)
        };
        Box::new(LiveCallTool(tool))
    })
}

/// Contexts mode's classifier (`docs/client-contexts.md`): Callgrind's
/// names, and the flow facts its rules read, numbered as the call tool
/// numbers them.
#[derive(Clone)]
struct ContextNamer {
    classify: SymbolClassifier,
    functions: callstack::Functions,
    /// Counter groups by object and function name (a function's blocks
    /// whose first instructions lie in different source files are
    /// Callgrind's different functions, but jumps between them are not
    /// calls: they count side by side), and one per object and
    /// [`UNNAMED_REGION`] of addresses for code without a name.
    groups: FastMap<(Arc<str>, GroupName), u32>,
    /// Flow facts and group by code address, as first described: the
    /// engine asks about a block's start before translating it and again
    /// with the whole block, whose facts differ only in what
    /// [`block_flow`] fills in.
    classes: FastMap<u64, (callrules::Flow, u32)>,
}

impl engine::ContextClassifier for ContextNamer {
    fn classify(&mut self, info: &BlockInfo) -> (callrules::Flow, u32) {
        if let Some(&(first, group)) = self.classes.get(&info.start()) {
            return (block_flow(&first, info), group);
        }
        let (class, group) = self.class_of(info);
        // Numbered here, at the code's first description, as before the
        // classes were kept: later ones find the same function and object.
        let flow = self.functions.flow(class, info);
        self.classes.insert(info.start(), (flow, group));
        (flow, group)
    }

    fn fork(&self) -> Box<dyn engine::ContextClassifier> {
        Box::new(self.clone())
    }
}

/// The flow facts of the block `info` describes, whose code's facts were
/// `first` (described with another block starting there): what
/// `Functions::flow` says of it, without naming and numbering again. The
/// function's facts are `first`'s; the exit and addresses `info`'s.
fn block_flow(first: &callrules::Flow, info: &BlockInfo) -> callrules::Flow {
    let mut flow = callstack::block_shape(info);
    (flow.function, flow.domain, flow.entry) = (first.function, first.domain, first.entry);
    (flow.skip, flow.pop_on_jump, flow.notify) = (first.skip, first.pop_on_jump, first.notify);
    flow
}

/// Bytes of code without a name whose blocks count side by side. Each
/// context's counters have room for every block of its group it ran, up
/// to the highest number among them, so one group for a whole stripped
/// object (cc1: hundreds of thousands of blocks) gave each context
/// megabytes of counters and filled the arena; a region bounds a context's
/// counters to the blocks of 4 KiB of code, and a jump between regions (in
/// a function that straddles a boundary) counts the new region in a node
/// of the same context, which the jumping block's call memo keeps (inline
/// in the stub since session 23). g++'s cc1plus: 5.5 GB of arena with 4
/// KiB regions, 7.0 GB with 64 KiB, in 174 s against 208 s.
const UNNAMED_REGION: u64 = 1 << 12;

/// What a counter group is of, in its object.
#[derive(Clone, PartialEq, Eq, Hash)]
enum GroupName {
    /// A function, by name.
    Function(Arc<str>),
    /// Code without a name, in region `n` ([`UNNAMED_REGION`]) of addresses.
    Region(u64),
}

impl ContextNamer {
    /// The class of the code at `info`'s start and its counter group.
    fn class_of(&mut self, info: &BlockInfo) -> (CodeClass, u32) {
        let class = self.classify.classify(info);
        // Code without a name (Callgrind names it by its address, a
        // function per block) counts in one group per object and region
        // of addresses; PLT entries (skipped code, counted per call site)
        // keep their own.
        let unnamed = class.function.starts_with("0x") && class.section != Section::Plt;
        let name = if unnamed {
            GroupName::Region(info.start() / UNNAMED_REGION)
        } else {
            GroupName::Function(class.function.clone())
        };
        let key = (class.object.clone(), name);
        let next = self.groups.len() as u32;
        let group = *self.groups.entry(key).or_insert(next);
        (class, group)
    }
}

/// The client's contexts, when the run can use them: not with a
/// simulation (whose events need the stream), nor with what needs costs
/// in time order (dumps, zeroing and collection switched by function or by
/// start-up option), nor with `--collect-jumps=yes`, `--separate-callers`,
/// `--skip-direct-rec=yes` or `--separate-recs<N>=`. By default
/// (`--client-contexts=auto`) tagged counting, where no export needs the
/// calling-context tree; contexts mode (the tree) only when asked.
pub fn contexts_config(opts: &RunOptions, cg: &CallgrindOptions) -> Option<engine::ContextsConfig> {
    let flat = cg.exports.is_empty();
    let (asked, tagged) = match cg.client_contexts {
        ClientContexts::Auto => (flat, true),
        ClientContexts::No => (false, false),
        ClientContexts::Yes => (true, false),
        ClientContexts::Tagged => (true, true),
    };
    let timed = !cg.toggle_collect.is_empty()
        || !cg.dump_before.is_empty()
        || !cg.dump_after.is_empty()
        || !cg.zero_before.is_empty()
        || !cg.calls.collect_atstart
        || !cg.instr_atstart;
    // The client's runtime counts no jumps: the stream path does.
    let jumps = cg.calls.collect_jumps;
    // Nor does it keep the callers of a context where the profile is
    // flat, and tagged counting never: contexts named by their callers
    // come from the stream's tree.
    let callers = cg.calls.separate_callers > 0 || !cg.separate_callers_fns.is_empty();
    // Its recursion levels are one rule for every function and call.
    let levels = cg.calls.skip_direct_rec || !cg.separate_recs_fns.is_empty();
    if !asked || timed || jumps || callers || levels || opts.sim.cache_sim || opts.sim.branch_sim {
        return None;
    }
    let namer = ContextNamer {
        classify: SymbolClassifier {
            names: opts.names,
            patterns: Arc::new(cg.clone()),
            remember: true,
        },
        functions: callstack::Functions::new(&cg.calls),
        groups: Default::default(),
        classes: Default::default(),
    };
    Some(engine::ContextsConfig {
        classifier: Arc::new(move || Box::new(namer.clone()) as Box<dyn engine::ContextClassifier>),
        separate_recs: cg.calls.separate_recs,
        // The exports read the calling-context tree; Callgrind's profile
        // needs only its (function, level) contexts.
        flat,
        tagged: tagged && flat,
        // (Only `-v -v` reports them.)
        count_inline: opts.verbosity > 1,
    })
}

/// What `-v -v` says of the client's runtime: context entries, the
/// share its fast paths took, and how many of those the engine's stub
/// took inline.
fn contexts_summary(c: &engine::ContextsProfile) -> String {
    if c.tagged {
        let (mut entries, mut retags, mut inline, mut words) = (0, 0, 0, 0);
        for t in &c.threads {
            let (e, r, i) = ctxrt::tagged::TaggedArena::new(&t.arena).entries();
            (entries, retags) = (entries + e, retags + r);
            (inline, words) = (inline + i, words + t.arena.len());
        }
        return format!(
            "client contexts (tagged): {entries} context entries, {inline} calls and returns \
             inline, {retags} slots retagged; arenas {} MB",
            (words * 8) >> 20
        );
    }
    let (mut entries, mut fast, mut inline, mut words) = (0, 0, 0, 0);
    for t in &c.threads {
        let arena = ctxrt::Arena::new(&t.arena);
        let (e, f) = arena.entries();
        entries += e;
        fast += f;
        inline += arena.inline_entries();
        words += t.arena.len();
    }
    let share = 100.0 * fast as f64 / entries.max(1) as f64;
    // (The arenas' size: what the client touched and the tool read back.)
    let mb = (words * 8) >> 20;
    format!(
        "client contexts: {entries} context entries, {fast} by a fast path ({share:.1}%), \
         {inline} of them inline; arenas {mb} MB"
    )
}

/// The call tool of a process whose contexts the client kept.
fn contexts_tool(
    opts: &RunOptions,
    cg: &CallgrindOptions,
    contexts: &mut engine::ContextsProfile,
) -> Result<CallTool, String> {
    let classify = Box::new(SymbolClassifier {
        names: opts.names,
        patterns: Arc::new(cg.clone()),
        remember: true,
    });
    if contexts.tagged {
        let mut threads: Vec<callstack::tagged::TaggedThread> = contexts
            .threads
            .iter_mut()
            .map(|t| callstack::tagged::TaggedThread {
                thread: t.thread,
                hot: &t.hot,
                arena: &mut t.arena,
                slots: &t.slots,
            })
            .collect();
        return callstack::tagged::into_tool(
            cg.calls.clone(),
            classify,
            &contexts.blocks,
            &mut threads,
        );
    }
    let mut threads: Vec<callstack::contexts::ThreadArena> = contexts
        .threads
        .iter_mut()
        .map(|t| callstack::contexts::ThreadArena {
            thread: t.thread,
            hot: &t.hot,
            arena: &mut t.arena,
        })
        .collect();
    callstack::contexts::into_tool(cg.calls.clone(), classify, &contexts.blocks, &mut threads)
}

impl CgSink<'_> {
    /// Writes the `callgrind.out` file of a process that ended and prints
    /// Callgrind's summary.
    pub(super) fn callgrind_finished(
        &mut self,
        cg: &CallgrindOptions,
        mut proc_profile: ProcessProfile,
    ) {
        let pid = proc_profile.pid;
        if self.opts.verbosity > 0 {
            self.log.umsg(pid, "");
        }
        let Some(path) = self.out_path("--callgrind-out-file", &cg.out_file, pid) else {
            return;
        };
        let tool = match proc_profile.contexts.take() {
            Some(mut c) => match contexts_tool(self.opts, cg, &mut c) {
                Ok(tool) if self.opts.verbosity > 1 => {
                    self.log.umsg(pid, &contexts_summary(&c));
                    Some(tool)
                }
                Ok(tool) => Some(tool),
                Err(e) => {
                    self.log
                        .umsg(pid, &format!("calling contexts unreadable: {e}"));
                    return;
                }
            },
            None => proc_profile
                .tool
                .take()
                .and_then(|t| t.0.into_any().downcast::<LiveCallTool>().ok())
                .map(|t| t.0),
        };
        let Some(mut tool) = tool else {
            return;
        };
        tool.finish();
        let cmd = if self.opts.trace_children {
            attribute::command_line_of(pid).unwrap_or_else(|| self.cmd.clone())
        } else {
            self.cmd.clone()
        };
        let mappings = attribute::mappings(&proc_profile);
        let mut dumps = tool.take_dumps();
        dumps.push(tool.final_dump());
        // One name table for the whole run: Callgrind's name ids go on from
        // one dump to the next (each file still gives each name in full).
        let mut names = callgrind::Names::default();
        let desc = cache_desc(&tool);
        let header = |names: callgrind::Names| callgrind::Profile {
            version: Some("1".into()),
            creator: Some(format!("cachescope-{}", super::VERSION)),
            pid: Some(pid.to_string()),
            cmd: Some(cmd.clone()),
            names,
            ..callgrind::Profile::default()
        };
        let symbols = &mut self.symbols;
        let mut locate = |addr: u64| {
            let l = symbols.locate(&mappings, addr);
            (l.file, l.line)
        };
        let count = dumps.len();
        // With --separate-threads=yes, each dump is a part per thread.
        let threads: Vec<Option<u32>> = if cg.separate_threads {
            tool.threads().into_iter().map(Some).collect()
        } else {
            vec![None]
        };
        let mut collected: Vec<u64> = Vec::new();
        let mut events: Vec<String> = Vec::new();
        // Each file's contents: whole profiles one after the other (a
        // combined file of several threads repeats the file header for
        // each thread of the first dump, as Callgrind does).
        let mut files: Vec<(std::path::PathBuf, Vec<callgrind::Profile>)> = Vec::new();
        for (i, dump) in dumps.iter().enumerate() {
            let n = i + 1;
            for &thread in &threads {
                let mut profile = header(std::mem::take(&mut names));
                let mut part =
                    tool.part_of(&dump.costs, &mut profile, cg.output, thread, &mut locate);
                part.number = Some(n as u64);
                part.thread = thread.map(u64::from);
                if thread.is_some() {
                    // Callgrind's summary of a thread's part: that thread's
                    // costs since its last dump, which is what it wrote.
                    part.summary.clone_from(&part.totals);
                }
                // A combined file describes the caches once, in its first
                // part (of each thread).
                if !cg.combine_dumps || i == 0 {
                    part.desc.clone_from(&desc);
                }
                part.desc.push(format!(
                    "Timerange: Basic block {} - {}",
                    dump.timerange.0, dump.timerange.1
                ));
                part.desc.push(format!("Trigger: {}", dump.trigger));
                if let Some(t) = &part.totals {
                    collected.resize(t.len(), 0);
                    collected.iter_mut().zip(t).for_each(|(c, v)| *c += v);
                }
                events = part.event_names().iter().map(|e| e.to_string()).collect();
                let name = dump_file_name(&path, cg, n, count, thread);
                let last = files.last_mut().filter(|(f, _)| *f == name);
                match last.and_then(|(_, chunks)| chunks.last_mut().filter(|_| n > 1)) {
                    Some(p) => {
                        p.parts.push(part);
                        p.names = profile.names.clone();
                        names = profile.names;
                    }
                    None => {
                        profile.parts.push(part);
                        names = profile.names.clone();
                        match files.last_mut() {
                            Some((f, chunks)) if *f == name => chunks.push(profile),
                            _ => files.push((name, vec![profile])),
                        }
                    }
                }
            }
        }
        if cg.separate_threads && !cg.combine_dumps {
            // Callgrind creates the unsuffixed file at start (checking it
            // can write there) and leaves it empty.
            files.insert(0, (path.clone(), Vec::new()));
        }
        // The exports show the calling contexts of the last period (since
        // the last dump or zero), as the unsuffixed file does.
        self.write_exports(cg, pid, &tool, &mappings, &cmd);
        for (path, chunks) in &files {
            self.write_callgrind(pid, path, chunks, cg);
        }
        if self.opts.verbosity > 0 {
            for l in summary_lines(&events, &collected, &self.opts.sim) {
                self.log.umsg(pid, &l);
            }
        }
        self.stats(&proc_profile);
    }

    /// Makes process `pid`'s `callgrind.out` file, empty, before the
    /// program runs, as Callgrind does at its start: a program that execs
    /// another without `--trace-children=yes` leaves it so, as under
    /// Valgrind (it is written whole at the process's end). False, with
    /// Callgrind's message, when it cannot be made: then, as under
    /// Valgrind, the program does not run.
    pub(super) fn callgrind_started(&mut self, cg: &CallgrindOptions, pid: i32) -> bool {
        let Some(path) = self.out_path("--callgrind-out-file", &cg.out_file, pid) else {
            return false;
        };
        if profile::output::create_empty(&path, 0o600).is_err() {
            self.log.umsg(pid, &cannot_open(&path));
            return false;
        }
        true
    }

    /// Writes one `callgrind.out` file, or says why it could not.
    fn write_callgrind(
        &mut self,
        pid: i32,
        path: &std::path::Path,
        chunks: &[callgrind::Profile],
        cg: &CallgrindOptions,
    ) {
        let write =
            |w: &mut dyn std::io::Write| chunks.iter().try_for_each(|p| p.write_to(w, cg.write));
        match write_output(path, 0o600, write) {
            Ok(()) => {}
            Err(OutputError::Open(_)) => self.log.umsg(pid, &cannot_open(path)),
            Err(OutputError::Write(e)) => {
                self.log.umsg(
                    pid,
                    &format!(
                        "error: can't write output data file '{}': {e}",
                        path.display()
                    ),
                );
            }
        }
    }
}

/// Callgrind's message for an output file it cannot open.
fn cannot_open(path: &std::path::Path) -> String {
    format!(
        "Error: can not open cache simulation output file `{}'",
        path.display()
    )
}

/// The file a dump of `thread` goes to, as Callgrind names it: `<file>.<n>`
/// for dump `n` of `count` (the last, at the program's end, unsuffixed),
/// one file with --combine-dumps; then `-<tid>` (two digits at least) with
/// --separate-threads=yes.
fn dump_file_name(
    path: &std::path::Path,
    cg: &CallgrindOptions,
    n: usize,
    count: usize,
    thread: Option<u32>,
) -> std::path::PathBuf {
    let mut p = path.as_os_str().to_owned();
    if !cg.combine_dumps && n != count {
        p.push(format!(".{n}"));
    }
    if let (Some(t), false) = (thread, cg.combine_dumps) {
        p.push(format!("-{t:02}"));
    }
    p.into()
}

/// The `desc:` lines of the simulated caches (empty values without).
fn cache_desc(tool: &CallTool) -> Vec<String> {
    match tool.sim().and_then(BlockSim::caches) {
        Some(c) => vec![
            format!("I1 cache: {}", c.i1().desc()),
            format!("D1 cache: {}", c.d1().desc()),
            format!("LL cache: {}", c.ll().desc()),
        ],
        None => vec![
            "I1 cache: ".into(),
            "D1 cache: ".into(),
            "LL cache: ".into(),
        ],
    }
}

/// Callgrind's summary at exit: the events, what was collected (the sum
/// of every dump's totals) and, from those, the lines of Cachegrind's
/// summary in Callgrind's layout (`rd +`, its widths).
fn summary_lines(
    events: &[String],
    collected: &[u64],
    sim: &crate::simopts::SimOptions,
) -> Vec<String> {
    use crate::summary::{comma_width, commas, vg_float};
    let get = |name: &str| {
        events
            .iter()
            .position(|e| e == name)
            .and_then(|i| collected.get(i).copied())
            .unwrap_or(0)
    };
    let mut out = vec![
        format!("Events    : {}", events.join(" ")),
        format!(
            "Collected : {}",
            collected
                .iter()
                .map(u64::to_string)
                .collect::<Vec<_>>()
                .join(" ")
        ),
        String::new(),
    ];
    let ir = get("Ir");
    let l1 = comma_width(ir);
    let (mut l2, mut l3) = (0, 0);
    if sim.cache_sim {
        l2 = comma_width(get("Dr"));
        l3 = comma_width(get("Dw"));
    }
    if sim.branch_sim {
        l2 = l2.max(comma_width(get("Bc")));
        l3 = l3.max(comma_width(get("Bi")));
    }
    out.push(format!("I   refs:      {}", commas(ir, l1)));
    let pct = |m: u64, refs: u64| m as f64 * 100.0 / refs.max(1) as f64;
    let three = |label: &str, a: u64, b: u64, c: u64, rd: &str, wr: &str| {
        format!(
            "{label}{}  ({} {rd} + {} {wr})",
            commas(a, l1),
            commas(b, l2),
            commas(c, l3)
        )
    };
    let rate = |label: &str, a: f64, b: f64, c: f64, mid: &str, tail: &str| {
        format!(
            "{label}{}% ({}%{mid}+ {}%{tail}",
            vg_float(a, 1, l1),
            vg_float(b, 1, l2),
            vg_float(c, 1, l3)
        )
    };
    if sim.cache_sim {
        let (i1, il) = (get("I1mr"), get("ILmr"));
        out.push(format!("I1  misses:    {}", commas(i1, l1)));
        out.push(format!("LLi misses:    {}", commas(il, l1)));
        out.push(format!("I1  miss rate: {}%", vg_float(pct(i1, ir), 2, l1)));
        out.push(format!("LLi miss rate: {}%", vg_float(pct(il, ir), 2, l1)));
        out.push(String::new());
        let (dr, dw) = (get("Dr"), get("Dw"));
        let (d1r, d1w, dlr, dlw) = (get("D1mr"), get("D1mw"), get("DLmr"), get("DLmw"));
        out.push(three("D   refs:      ", dr + dw, dr, dw, "rd", "wr"));
        out.push(three("D1  misses:    ", d1r + d1w, d1r, d1w, "rd", "wr"));
        out.push(three("LLd misses:    ", dlr + dlw, dlr, dlw, "rd", "wr"));
        let d = dr + dw;
        out.push(rate(
            "D1  miss rate: ",
            pct(d1r + d1w, d),
            pct(d1r, dr),
            pct(d1w, dw),
            "   ",
            "  )",
        ));
        out.push(rate(
            "LLd miss rate: ",
            pct(dlr + dlw, d),
            pct(dlr, dr),
            pct(dlw, dw),
            "   ",
            "  )",
        ));
        out.push(String::new());
        let (refs_r, refs_w) = (i1 + d1r, d1w);
        let (miss_r, miss_w) = (il + dlr, dlw);
        out.push(three(
            "LL refs:       ",
            refs_r + refs_w,
            refs_r,
            refs_w,
            "rd",
            "wr",
        ));
        out.push(three(
            "LL misses:     ",
            miss_r + miss_w,
            miss_r,
            miss_w,
            "rd",
            "wr",
        ));
        out.push(rate(
            "LL miss rate:  ",
            pct(miss_r + miss_w, ir + d),
            pct(miss_r, ir + dr),
            pct(miss_w, dw),
            "   ",
            "  )",
        ));
    }
    if sim.branch_sim {
        let (bc, bcm, bi, bim) = (get("Bc"), get("Bcm"), get("Bi"), get("Bim"));
        out.push(String::new());
        out.push(three("Branches:      ", bc + bi, bc, bi, "cond", "ind"));
        out.push(three("Mispredicts:   ", bcm + bim, bcm, bim, "cond", "ind"));
        out.push(rate(
            "Mispred rate:  ",
            pct(bcm + bim, bc + bi),
            pct(bcm, bc),
            pct(bim, bi),
            "     ",
            "   )",
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use events::Terminator;

    /// The classification as it was made before classes were built from
    /// the object directly: from `Symbolizer::code_facts`.
    fn facts_class(
        c: &SymbolClassifier,
        s: &mut Symbolizer,
        origin: &CodeOrigin,
        addr: u64,
    ) -> CodeClass {
        let unknown = || Arc::<str>::from(UNKNOWN);
        let mapping = Mapping {
            path: origin.path.clone(),
            start: origin.start,
            end: origin.end,
            file_offset: origin.file_offset,
        };
        let facts = s.code_facts(&mapping, addr);
        let section = match facts.section {
            SectionKind::Text => Section::Text,
            SectionKind::Plt => Section::Plt,
            SectionKind::Other => Section::Other,
        };
        let named = &*facts.location.func != UNKNOWN;
        let function = if named {
            Arc::from(&*facts.location.func)
        } else {
            let plt = if section == Section::Plt {
                " [PLT]"
            } else {
                ""
            };
            Arc::from(format!("{:#018x}{plt}", facts.offset))
        };
        let object = facts
            .object
            .map_or_else(unknown, |p| Arc::from(p.to_string_lossy().as_ref()));
        CodeClass {
            config: c.config(&function, &object),
            object,
            file: Arc::from(&*facts.location.file),
            function,
            entry: named && facts.entry,
            section,
        }
    }

    /// This process's executable mappings of files, as origins.
    fn own_code() -> Vec<Arc<CodeOrigin>> {
        let maps = std::fs::read_to_string("/proc/self/maps").expect("/proc/self/maps");
        maps.lines()
            .filter_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                if f.len() < 6 || !f[1].contains('x') || !f[5].starts_with('/') {
                    return None;
                }
                let (lo, hi) = f[0].split_once('-')?;
                Some(Arc::new(CodeOrigin {
                    path: f[5].into(),
                    start: u64::from_str_radix(lo, 16).ok()?,
                    end: u64::from_str_radix(hi, 16).ok()?,
                    file_offset: u64::from_str_radix(f[2], 16).ok()?,
                }))
            })
            .collect()
    }

    /// Whether a run asking for tagged counting with `option` gets the
    /// client's contexts (else the stream path).
    fn client_contexts_with(option: &str) -> bool {
        let args: Vec<std::ffi::OsString> =
            ["--tool=callgrind", "--client-contexts=tagged", option, "x"]
                .iter()
                .map(Into::into)
                .collect();
        match crate::run::options::parse(&args) {
            Ok(crate::run::options::Command::Run(r)) => match &r.tool {
                crate::run::options::RunTool::Callgrind(cg) => contexts_config(&r, cg).is_some(),
                other => panic!("{other:?}"),
            },
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn jumps_take_the_stream_path() {
        assert!(client_contexts_with("--collect-jumps=no"));
        assert!(!client_contexts_with("--collect-jumps=yes"));
    }

    #[test]
    fn separate_callers_take_the_stream_path() {
        assert!(client_contexts_with("--separate-callers=0"));
        assert!(!client_contexts_with("--separate-callers=1"));
        assert!(!client_contexts_with("--separate-callers2=main"));
    }

    #[test]
    fn skip_direct_rec_and_separate_recs_per_function_take_the_stream_path() {
        assert!(client_contexts_with("--skip-direct-rec=no"));
        assert!(!client_contexts_with("--skip-direct-rec=yes"));
        assert!(client_contexts_with("--separate-recs=3"));
        assert!(!client_contexts_with("--separate-recs3=fib"));
    }

    #[test]
    fn a_functions_separate_callers_is_the_last_matching_pattern() {
        let cg = CallgrindOptions {
            separate_callers_fns: vec![(2, "le*".into()), (3, "leaf".into()), (1, "x?".into())],
            ..Default::default()
        };
        let c = SymbolClassifier {
            names: NameOptions::default(),
            patterns: Arc::new(cg),
            remember: false,
        };
        let callers = |f| c.config(f, "/bin/x").separate_callers;
        assert_eq!(callers("leaf"), Some(3));
        assert_eq!(callers("left"), Some(2));
        assert_eq!(callers("xy"), Some(1));
        assert_eq!(callers("main"), None);
    }

    #[test]
    fn a_functions_separate_recs_is_the_last_matching_pattern() {
        let cg = CallgrindOptions {
            separate_recs_fns: vec![(3, "fi*".into()), (1, "fib".into())],
            separate_callers_fns: vec![(2, "fib".into())],
            ..Default::default()
        };
        let c = SymbolClassifier {
            names: NameOptions::default(),
            patterns: Arc::new(cg),
            remember: false,
        };
        let config = |f| c.config(f, "/bin/x");
        assert_eq!(config("fib").separate_recs, Some(1));
        assert_eq!(config("fib").separate_callers, Some(2), "its own list");
        assert_eq!(config("fix").separate_recs, Some(3));
        assert_eq!(config("main").separate_recs, None);
    }

    #[test]
    fn classes_are_the_code_facts_classes() {
        let cg = CallgrindOptions {
            fn_skip: vec!["*alloc*".into()],
            ..Default::default()
        };
        let c = SymbolClassifier {
            names: NameOptions::default(),
            patterns: Arc::new(cg),
            remember: false,
        };
        let mut s = Symbolizer::new();
        let mut n = Naming::default();
        let code = own_code();
        assert!(code.len() >= 2, "the test binary and libc: {code:?}");
        let (mut named, mut files) = (0, 0);
        for origin in &code {
            // A step that is no power of two meets every alignment; the
            // addresses past the end are located as outside the mapping.
            for addr in (origin.start..origin.end + 64).step_by(13) {
                let new = c.class_at(&mut n, origin, addr);
                assert_eq!(new, facts_class(&c, &mut s, origin, addr), "{addr:#x}");
                named += usize::from(!new.function.starts_with("0x"));
                files += usize::from(&*new.file != UNKNOWN);
            }
        }
        assert!(
            named > 10_000 && files > 10_000,
            "{named} named, {files} with a file"
        );
        // Unreadable objects.
        let missing = Arc::new(CodeOrigin {
            path: "/nonexistent/lib.so".into(),
            start: 0x1000,
            end: 0x2000,
            file_offset: 0,
        });
        let new = c.class_at(&mut n, &missing, 0x1234);
        assert_eq!(new, facts_class(&c, &mut s, &missing, 0x1234));
    }

    #[test]
    fn block_flows_are_the_call_tools() {
        let mut functions = callstack::Functions::new(&Default::default());
        let class = |function: &str, section| CodeClass {
            object: Arc::from("/lib/x.so"),
            file: Arc::from("x.c"),
            function: Arc::from(function),
            entry: true,
            section,
            config: FnConfig {
                skip: function == "skipped",
                ..FnConfig::default()
            },
        };
        let terminators = [
            Terminator::FallThrough,
            Terminator::Jump { target: 0x10 },
            Terminator::CondJump { target: 0x10 },
            Terminator::IndirectJump,
            Terminator::Call { target: 0x10 },
            Terminator::IndirectCall,
            Terminator::Return,
            Terminator::Syscall,
        ];
        let classes = [
            class("f", Section::Text),
            class("skipped", Section::Text),
            class("_dl_runtime_resolve_xsave", Section::Text),
            class("0x0000000000001000 [PLT]", Section::Plt),
        ];
        for (i, class) in classes.into_iter().enumerate() {
            let start = 0x1000 * (i as u64 + 1);
            let first = functions.flow(
                class.clone(),
                &BlockInfo::new(start, Terminator::FallThrough),
            );
            for t in terminators {
                for n in 0..3u64 {
                    let mut info = BlockInfo::new(start, t);
                    for k in 0..n {
                        info.push(start + 3 * k, 3, &[]);
                    }
                    let f = functions.flow(class.clone(), &info);
                    assert_eq!(block_flow(&first, &info), f, "{t:?} {n}");
                }
            }
        }
    }

    #[test]
    fn summary_reads_like_callgrind() {
        let events = ["Ir".to_string()];
        assert_eq!(
            summary_lines(&events, &[131_164], &crate::simopts::SimOptions::new(false)),
            [
                "Events    : Ir",
                "Collected : 131164",
                "",
                "I   refs:      131,164"
            ]
        );
    }
}
