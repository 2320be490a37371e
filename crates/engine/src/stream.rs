//! The tool side of trace mode: one consumer thread decodes the records
//! that translated code wrote into the threads' trace buffers, with the
//! metadata of their blocks, and feeds each process's tool, while the
//! client runs on.
//!
//! The tracer hands it, in order, on one channel: a process's tool
//! ([`Msg::Start`]), each block's metadata as it is translated, each
//! buffer's complete records as a thread's buffer fills or the thread ends,
//! a fork (the child's tool is a copy of the parent's as it stands, cache
//! state included), and the end of a process (its tool comes back).
//! Records of one thread arrive in execution order; different threads are
//! interleaved a buffer at a time (Cachegrind serialises threads at its
//! scheduler's time slices; we run them in parallel).
//!
//! Conditional-branch outcomes and indirect targets are not in the records:
//! the next block a thread runs tells them, as drcachesim infers branch
//! targets from the next instruction fetched.
//!
//! For call tools ([`events::Needs::calls_returns`]) the consumer also says
//! which thread a buffer is of, hands over the stack pointer that blocks
//! ending in a call, return or indirect jump record as their last word, and
//! turns the markers the tracer writes at signal deliveries and
//! `rt_sigreturn` into [`events::Tool::signal`].

use crate::emit::{is_counted_pair, COUNTED_PAIR};
use crate::handoff::BufferView;
use crate::space::{MARK_SIGNAL, MARK_SIGRETURN};
use crate::translate::{BlockMeta, REP_WORDS};
use events::{
    BlockId, CondBranch, InstrFetch, KeptAccess, Needs, Record, SignalEvent, SiteWords, Terminator,
    Transfer,
};
use std::any::Any;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{channel, sync_channel, Receiver, Sender, SyncSender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A tool the engine feeds from trace buffers: one per process.
pub trait StreamTool: events::Tool + Send {
    /// The tool a forked child continues with: a copy of this one as it
    /// stands (costs and model state).
    fn fork(&self) -> Box<dyn StreamTool>;
    /// The concrete tool, for whoever receives it with the profile.
    fn into_any(self: Box<Self>) -> Box<dyn Any + Send>;

    /// Feeds the complete records `words` of thread `thread` to this tool,
    /// with the block metadata and branch state of `decoder`, and its
    /// branch words `branches`. Not to be overridden: the default is the
    /// engine's decoder, compiled for each tool type, so that the calls it
    /// makes per block (`block_run`, the branch records) are direct and
    /// inline; through `dyn` they cost the consumer a tenth of its time.
    fn decode(
        &mut self,
        decoder: &mut Decoder,
        thread: u64,
        words: &[u64],
        branches: BranchStream,
    ) {
        decode(self, decoder, thread, words, branches);
    }
}

/// A thread's branch words handed over with its records, last first
/// (`events::Tool::branch_words`), and the client address of the first:
/// a rep string block's record says where among them its own branches go.
#[derive(Clone, Copy, Default, Debug)]
pub struct BranchStream<'a> {
    words: &'a [u32],
    base: u64,
}

impl BranchStream<'_> {
    /// How many of the words were written before the branch stream's
    /// limit was `limit` (those from that index on; the stream grows down
    /// from `layout::TRACE_SLACK` above its limit).
    fn written_before(&self, limit: u64) -> usize {
        let at = limit.wrapping_add(crate::layout::TRACE_SLACK);
        let index = at.saturating_sub(self.base) / 4;
        (index as usize).min(self.words.len())
    }
}

/// Makes the tool of each new process image (the first one, and each
/// `execve` that is followed).
pub type ToolFactory = Arc<dyn Fn() -> Box<dyn StreamTool> + Send + Sync>;

/// A process's tool at its end, as the sink receives it.
pub struct FinishedTool(pub Box<dyn StreamTool>);

impl std::fmt::Debug for FinishedTool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FinishedTool")
    }
}

impl Clone for FinishedTool {
    fn clone(&self) -> Self {
        FinishedTool(self.0.fork())
    }
}

/// What the tracer tells the consumer.
pub(crate) enum Msg {
    /// A process image starts with this tool.
    Start { key: u64, tool: Box<dyn StreamTool> },
    /// Blocks were translated.
    Blocks { key: u64, metas: Vec<BlockMeta> },
    /// Complete records of one thread (little-endian words), and its
    /// branch words.
    Records { key: u64, thread: u64, words: Words },
    /// A client request for the tool, after the records of thread `thread`
    /// sent before it.
    Request {
        key: u64,
        thread: u64,
        request: events::ClientRequest,
    },
    /// Executions of blocks counted rather than recorded, per block id
    /// (after every record of the process).
    Runs { key: u64, runs: Vec<(u32, u64)> },
    /// A thread ended (its next records, if its area is reused, are
    /// another thread's).
    ThreadEnd { key: u64, thread: u64 },
    /// A forked child's process starts from a copy of its parent's.
    Fork { parent: u64, child: u64 },
    /// A process ended: its tool, please, and the time spent on its
    /// records.
    Finish {
        key: u64,
        reply: Sender<Option<(Box<dyn StreamTool>, Duration)>>,
    },
    /// A process image went away without a profile (exec).
    Discard { key: u64 },
}

/// A thread's complete records and branch words as the consumer gets
/// them.
pub(crate) enum Words {
    /// Copied out of the client into one of the circulating buffers: the
    /// records, then from `branches_at` on the `branches` 32-bit branch
    /// words, the first of which was at `branches_base` in the client.
    Copied {
        words: Vec<u64>,
        branches_at: usize,
        branches: usize,
        branches_base: u64,
    },
    /// In place, in a trace buffer shared with the client.
    Shared(BufferView),
}

impl Words {
    /// The records' words.
    fn records(&self) -> &[u64] {
        match self {
            Words::Copied {
                words, branches_at, ..
            } => &words[..*branches_at],
            Words::Shared(view) => view.records(),
        }
    }

    /// The branch words, last first (see `events::Tool::branch_words`).
    fn branches(&self) -> BranchStream<'_> {
        match self {
            Words::Copied {
                words,
                branches_at,
                branches,
                branches_base,
            } => BranchStream {
                words: &bytemuck::cast_slice(&words[*branches_at..])[..*branches],
                base: *branches_base,
            },
            Words::Shared(view) => BranchStream {
                words: view.branch_words(),
                base: view.branch_base(),
            },
        }
    }
}

/// Record buffers circulating between the tracer and the consumer (where
/// trace buffers cannot be shared and are copied out): the client waits
/// when all are with the consumer (memory stays bounded, a trace buffer's
/// words each, `layout::TRACE_BYTES` and up to the slack more); other messages (block metadata) never
/// wait behind the simulation. Four: when the consumer keeps up, one or two
/// are in use; when it does not, more buffers only hold more memory (eight
/// put bzip2's peak RSS above Cachegrind's, at the same speed).
const IN_FLIGHT: usize = 4;

/// The circulating record buffers. The tracer takes one per flush (and
/// waits if none is free); the consumer gives it back once decoded
/// (allocating and faulting in a buffer per flush cost more than the copy).
#[derive(Clone)]
struct Pool {
    give: SyncSender<Vec<u64>>,
    take: Arc<Mutex<Receiver<Vec<u64>>>>,
}

impl Pool {
    fn new() -> Pool {
        let (give, take) = sync_channel(IN_FLIGHT);
        for _ in 0..IN_FLIGHT {
            give.send(Vec::new()).expect("room for every buffer");
        }
        Pool {
            give,
            take: Arc::new(Mutex::new(take)),
        }
    }

    /// A free buffer, once there is one.
    fn take(&self) -> Vec<u64> {
        self.take
            .lock()
            .ok()
            .and_then(|r| r.recv().ok())
            .unwrap_or_default()
    }

    /// A buffer back into circulation.
    fn give(&self, buffer: Vec<u64>) {
        let _ = self.give.try_send(buffer);
    }
}

/// The tracer's end of the consumer.
pub(crate) struct Consumer {
    tx: Sender<Msg>,
    keys: Arc<AtomicU64>,
    pool: Pool,
}

/// What an address space keeps to talk to the consumer.
#[derive(Clone)]
pub(crate) struct StreamLink {
    tx: Sender<Msg>,
    keys: Arc<AtomicU64>,
    pool: Pool,
    /// This process's key.
    pub key: u64,
    /// Metadata of blocks translated since the last message, sent in a
    /// batch before the next one (or when many): a message per block woke
    /// the consumer for each, a tenth of the tracer's time on a compiler.
    pending: std::cell::RefCell<Vec<BlockMeta>>,
}

/// Blocks whose metadata waits for a message to go with (see
/// [`StreamLink::pending`]).
const BLOCK_BATCH: usize = 1024;

impl Consumer {
    /// Starts the consumer thread.
    pub fn start() -> Consumer {
        let (tx, rx) = channel();
        let pool = Pool::new();
        let returned = pool.clone();
        // It ends when the last sender (this and every link) is gone.
        std::thread::Builder::new()
            .name("cachescope-consumer".into())
            .spawn(move || consume(rx, returned))
            .expect("spawn the consumer thread");
        Consumer {
            tx,
            keys: Arc::new(AtomicU64::new(1)),
            pool,
        }
    }

    /// A link for a new process image running `tool`.
    pub fn link(&self, tool: Box<dyn StreamTool>) -> StreamLink {
        let key = self.keys.fetch_add(1, Ordering::Relaxed);
        let _ = self.tx.send(Msg::Start { key, tool });
        StreamLink {
            tx: self.tx.clone(),
            keys: self.keys.clone(),
            pool: self.pool.clone(),
            key,
            pending: Default::default(),
        }
    }
}

impl StreamLink {
    /// Sends `msg` (the consumer outlives every link), after the metadata
    /// of the blocks translated before it.
    fn send(&self, msg: Msg) {
        self.send_blocks();
        let _ = self.tx.send(msg);
    }

    /// Sends the metadata of the blocks translated since the last message.
    fn send_blocks(&self) {
        let metas = std::mem::take(&mut *self.pending.borrow_mut());
        if !metas.is_empty() {
            let _ = self.tx.send(Msg::Blocks {
                key: self.key,
                metas,
            });
        }
    }

    /// A block of this process was translated (its metadata goes with the
    /// next message).
    pub fn block(&self, meta: BlockMeta) {
        let full = {
            let mut pending = self.pending.borrow_mut();
            pending.push(meta);
            pending.len() >= BLOCK_BATCH
        };
        if full {
            self.send_blocks();
        }
    }

    /// A buffer of `words` words to read records into (one of the
    /// circulating ones: this waits while all are with the consumer). Its
    /// contents are stale, not zeroed: the reader overwrites them all, and
    /// zeroing 2 MiB per flush cost the tracer 3 % of a run.
    pub fn buffer(&self, words: usize) -> Vec<u64> {
        let mut b = self.pool.take();
        b.resize(words, 0);
        b
    }

    /// Complete records of thread `thread`, then from `branches_at` on its
    /// `branches` 32-bit branch words, the first of which was at
    /// `branches_base` (the buffer goes on to the consumer, or straight
    /// back when empty).
    pub fn records(
        &self,
        thread: u64,
        words: Vec<u64>,
        (branches_at, branches): (usize, usize),
        branches_base: u64,
    ) {
        if words.is_empty() {
            self.recycle(words);
        } else {
            self.send(Msg::Records {
                key: self.key,
                thread,
                words: Words::Copied {
                    words,
                    branches_at,
                    branches,
                    branches_base,
                },
            });
        }
    }

    /// Complete records and branch words of thread `thread`, read in place
    /// (the view is dropped, and the buffer free again, once they are
    /// decoded).
    pub fn shared_records(&self, thread: u64, view: BufferView) {
        self.send(Msg::Records {
            key: self.key,
            thread,
            words: Words::Shared(view),
        });
    }

    /// A buffer from [`StreamLink::buffer`] that was not filled after all.
    pub fn recycle(&self, words: Vec<u64>) {
        self.pool.give(words);
    }

    /// Thread `thread` made a client request for the tool (its records up
    /// to the request were sent first).
    pub fn request(&self, thread: u64, request: events::ClientRequest) {
        self.send(Msg::Request {
            key: self.key,
            thread,
            request,
        });
    }

    /// The counts of the blocks whose executions were counted.
    pub fn runs(&self, runs: Vec<(u32, u64)>) {
        self.send(Msg::Runs {
            key: self.key,
            runs,
        });
    }

    /// Thread `thread` ended.
    pub fn thread_end(&self, thread: u64) {
        self.send(Msg::ThreadEnd {
            key: self.key,
            thread,
        });
    }

    /// The link of a forked child, whose tool starts as a copy of ours.
    pub fn fork(&self) -> StreamLink {
        let child = self.keys.fetch_add(1, Ordering::Relaxed);
        self.send(Msg::Fork {
            parent: self.key,
            child,
        });
        StreamLink {
            tx: self.tx.clone(),
            keys: self.keys.clone(),
            pool: self.pool.clone(),
            key: child,
            pending: Default::default(),
        }
    }

    /// The process ended: its tool, once every record before is consumed,
    /// and the time the consumer spent on the process's records.
    pub fn finish(&self) -> Option<(Box<dyn StreamTool>, Duration)> {
        let (reply, answer) = channel();
        self.send(Msg::Finish {
            key: self.key,
            reply,
        });
        answer.recv().ok().flatten()
    }

    /// The process image went away (exec): drop its tool.
    pub fn discard(&self) {
        self.send(Msg::Discard { key: self.key });
    }
}

/// What the consumer keeps of a process to decode its records: the
/// metadata of its blocks and each thread's last block.
pub struct Decoder {
    needs: Needs,
    /// Per block id, what every record needs: its length and kind, packed
    /// in one word ([`Shape`]). Four bytes per block keep the array in the
    /// cache where a whole entry per block (56 bytes: 5 MB for a python
    /// run's 91,000 blocks) made its load the consumer's costliest stall.
    shapes: Vec<u32>,
    /// Per block id, its metadata (for tools and rep string blocks), if
    /// the block writes records.
    metas: Vec<Option<Arc<BlockMeta>>>,
    /// Per block id, where it starts and the branch its successor resolves:
    /// read only when branches are simulated.
    flows: Vec<Flow>,
    /// Per thread: the block it ran last (whose branch the next resolves).
    last: HashMap<u64, u32>,
    /// Per thread, filtered records: the blocks signal handlers interrupted
    /// (innermost last), whose kept accesses resume after the handler's
    /// `rt_sigreturn` marker.
    interrupted: HashMap<u64, Vec<u32>>,
}

/// The bits of a block's shape word: the record's length in words below
/// `SP`; 0 for an id no block has.
struct Shape;

impl Shape {
    /// The record's last word is the stack pointer.
    const SP: u32 = 1 << 31;
    /// A rep string instruction's block.
    const REP: u32 = 1 << 30;
    /// A filtered record: the id, then the kept accesses.
    const KEPT: u32 = 1 << 29;
    /// Words per record (the id alone for a filtered one; a block whose
    /// executions are counted has no records of its own, only pairs of its
    /// id and a kept access, marked by `emit::COUNTED_PAIR`).
    const WORDS: u32 = Shape::KEPT - 1;

    fn of(meta: &BlockMeta) -> u32 {
        debug_assert!(
            meta.words > 0 && meta.words <= Shape::WORDS,
            "record length"
        );
        meta.words
            | if meta.sp { Shape::SP } else { 0 }
            | if meta.rep.is_some() { Shape::REP } else { 0 }
            | if meta.kept { Shape::KEPT } else { 0 }
    }
}

/// Where a block starts (the branch before it went there) and what its
/// last instruction's outcome becomes.
#[derive(Clone, Copy, Default)]
struct Flow {
    start: u64,
    branch: Branch,
}

/// The branch record a block's successor resolves.
#[derive(Clone, Copy, Default)]
enum Branch {
    /// None (or not one the tools simulate).
    #[default]
    None,
    /// A conditional jump at `pc`, taken when the next block is `target`.
    Cond { pc: u64, target: u64 },
    /// An indirect jump or call at `pc`.
    Indirect { pc: u64 },
}

impl Flow {
    fn of(meta: &BlockMeta) -> Flow {
        let pc = meta.info.instrs().last().map(|i| i.addr);
        let branch = match (pc, meta.info.terminator()) {
            (Some(pc), Terminator::CondJump { target }) => Branch::Cond { pc, target },
            (Some(pc), Terminator::IndirectJump | Terminator::IndirectCall) => {
                Branch::Indirect { pc }
            }
            _ => Branch::None,
        };
        Flow {
            start: meta.info.start(),
            branch,
        }
    }
}

impl Decoder {
    fn new(needs: Needs) -> Decoder {
        Decoder {
            needs,
            shapes: Vec::new(),
            metas: Vec::new(),
            flows: Vec::new(),
            last: HashMap::new(),
            interrupted: HashMap::new(),
        }
    }

    /// Block `meta.id` was translated.
    fn add(&mut self, meta: BlockMeta) {
        let id = meta.id as usize;
        if self.shapes.len() <= id {
            self.shapes.resize(id + 1, 0);
            self.metas.resize(id + 1, None);
            self.flows.resize(id + 1, Flow::default());
        }
        self.shapes[id] = Shape::of(&meta);
        self.flows[id] = Flow::of(&meta);
        // A block whose executions are counted writes no record of its own
        // (its kept references are site words or pairs, which need no
        // metadata here; a rep string block still has one): the tool has
        // planned it, so its metadata goes. It had been a python run's
        // biggest table in the consumer (24 MB).
        let records = meta.counter.is_none() || meta.rep.is_some();
        self.metas[id] = records.then(|| Arc::new(meta));
    }

    /// A forked child's decoder: the same blocks, no thread's last one.
    fn fork(&self) -> Decoder {
        Decoder {
            needs: self.needs,
            shapes: self.shapes.clone(),
            metas: self.metas.clone(),
            flows: self.flows.clone(),
            last: HashMap::new(),
            interrupted: HashMap::new(),
        }
    }
}

/// One process as the consumer sees it.
struct Proc {
    tool: Box<dyn StreamTool>,
    decoder: Decoder,
    /// Time spent decoding its records (`--stats=yes`).
    busy: Duration,
}

impl Proc {
    fn new(tool: Box<dyn StreamTool>) -> Proc {
        let needs = tool.needs();
        Proc {
            tool,
            decoder: Decoder::new(needs),
            busy: Duration::ZERO,
        }
    }
}

fn consume(rx: Receiver<Msg>, pool: Pool) {
    let mut procs: HashMap<u64, Proc> = HashMap::new();
    for msg in rx {
        match msg {
            Msg::Start { key, tool } => {
                procs.insert(key, Proc::new(tool));
            }
            Msg::Blocks { key, metas } => {
                if let Some(p) = procs.get_mut(&key) {
                    for meta in metas {
                        p.tool.block(BlockId(meta.id), &meta.info);
                        if let Some(first) = meta.sites {
                            p.tool.block_sites(BlockId(meta.id), first);
                        }
                        p.decoder.add(meta);
                    }
                }
            }
            Msg::Records { key, thread, words } => {
                if let Some(p) = procs.get_mut(&key) {
                    let started = Instant::now();
                    p.tool
                        .decode(&mut p.decoder, thread, words.records(), words.branches());
                    p.busy += started.elapsed();
                }
                if let Words::Copied { words, .. } = words {
                    pool.give(words);
                }
            }
            Msg::Request {
                key,
                thread,
                request,
            } => {
                if let Some(p) = procs.get_mut(&key) {
                    // The thread's last block made the request: no branch
                    // of it to resolve with the next.
                    p.decoder.last.remove(&thread);
                    if p.decoder.needs.calls_returns {
                        p.tool.thread(thread);
                    }
                    p.tool.client_request(&request);
                }
            }
            Msg::Runs { key, runs } => {
                if let Some(p) = procs.get_mut(&key) {
                    for (id, n) in runs {
                        p.tool.block_runs(BlockId(id), n);
                    }
                }
            }
            Msg::ThreadEnd { key, thread } => {
                if let Some(p) = procs.get_mut(&key) {
                    p.decoder.last.remove(&thread);
                    p.decoder.interrupted.remove(&thread);
                    if p.decoder.needs.calls_returns {
                        p.tool.thread_end(thread);
                    }
                }
            }
            Msg::Fork { parent, child } => {
                if let Some(p) = procs.get(&parent) {
                    let copy = Proc {
                        tool: p.tool.fork(),
                        decoder: p.decoder.fork(),
                        busy: Duration::ZERO,
                    };
                    procs.insert(child, copy);
                }
            }
            Msg::Finish { key, reply } => {
                let _ = reply.send(procs.remove(&key).map(|p| (p.tool, p.busy)));
            }
            Msg::Discard { key } => {
                procs.remove(&key);
            }
        }
    }
}

/// Feeds the records in `words` of thread `thread` to `tool`, a process's
/// tool whose blocks and threads `decoder` knows.
fn decode<T: StreamTool + ?Sized>(
    tool: &mut T,
    decoder: &mut Decoder,
    thread: u64,
    words: &[u64],
    branches: BranchStream,
) {
    let Decoder {
        needs,
        shapes,
        metas,
        flows,
        last: lasts,
        interrupted,
    } = decoder;
    let calls = needs.calls_returns;
    // Counted executions: words above 2^32 between records are site words
    // (no record of kept accesses is reported, so none resumes), branch
    // words among them.
    let sited = needs.mru_filter.is_some_and(|f| f.fetch_set_bits.is_some());
    // Otherwise the next block tells a branch's outcome (a rep string
    // block's own are in its record).
    let rep_branches = needs.cond_branches || needs.indirect_targets;
    let branches_resolved = rep_branches && !sited;
    // The branch words not yet simulated: those below `unsimulated` (the
    // earlier ones are at the top).
    let mut unsimulated = branches.words.len();
    if calls {
        tool.thread(thread);
    }
    let mut last = lasts.get(&thread).copied();
    // Filtered records: the block whose kept accesses follow (the last
    // one run, or an interrupted one resumed).
    let mut running = last;
    let mut i = 0;
    while i < words.len() {
        let word = words[i];
        // Block ids lie below COUNTED_PAIR: one compare keeps the rest
        // (pairs, resumed kept accesses, markers) off their path.
        if word >= COUNTED_PAIR {
            if is_counted_pair(word) {
                // A counted block's kept access, after its id: no lookup.
                if let Some(&kept) = words.get(i + 1) {
                    let id = (word & (COUNTED_PAIR - 1)) as u32;
                    tool.counted_access(BlockId(id), KeptAccess(kept));
                }
                i += 2;
            } else if sited && SiteWords::is_site_word(word) {
                // At least this one word, so that the loop goes on.
                i += tool.site_accesses(&words[i..]).max(1);
            } else if KeptAccess::is_kept(word) {
                // Kept accesses of an interrupted block, resumed after its
                // handler (a block's own follow its id, below).
                let n = kept_run(&words[i..]);
                if let Some(Some(meta)) = running.and_then(|id| metas.get(id as usize)) {
                    tool.kept_accesses(BlockId(meta.id), &meta.info, &words[i..i + n]);
                }
                i += n;
            } else {
                // A marker the tracer wrote at a signal stop: the handler's
                // first block is no branch target of the block before.
                let stack = interrupted.entry(thread).or_default();
                if word == u64::from(MARK_SIGNAL) {
                    // Handlers left by longjmp never return: keep a few.
                    if stack.len() >= 64 {
                        stack.remove(0);
                    }
                    stack.extend(running);
                    tool.signal(SignalEvent::Delivered);
                } else if word == u64::from(MARK_SIGRETURN) {
                    running = stack.pop();
                    tool.signal(SignalEvent::Returned);
                } else {
                    debug_assert!(false, "unknown word {word:#x} in a trace buffer");
                    break;
                }
                last = None;
                i += 1;
            }
            continue;
        }
        let id = word as u32;
        let (Some(&shape), Some(Some(meta))) = (shapes.get(id as usize), metas.get(id as usize))
        else {
            // Not a record start: the rest cannot be decoded.
            debug_assert!(false, "unknown block id {id} in a trace buffer");
            break;
        };
        let n = (shape & Shape::WORDS) as usize;
        let Some(addrs) = words.get(i + 1..i + n) else {
            break;
        };
        if branches_resolved {
            if let Some(prev) = last.and_then(|l| flows.get(l as usize)) {
                resolve(tool, prev.branch, flows[id as usize].start);
            }
        }
        if shape & Shape::KEPT != 0 {
            let kept = &words[i + 1..i + 1 + kept_run(&words[i + 1..])];
            tool.block_run_kept(BlockId(id), &meta.info, kept);
            i += kept.len();
        } else if shape & Shape::REP != 0 {
            if rep_branches && sited {
                // First the branch words of the blocks that ran before it.
                let limit = addrs.last().copied().unwrap_or_default();
                let before = branches.written_before(limit).min(unsimulated);
                if before < unsimulated {
                    tool.branch_words(&branches.words[before..unsimulated]);
                    unsimulated = before;
                }
            }
            rep_run(tool, meta, addrs, rep_branches);
        } else if shape & Shape::SP != 0 {
            let (sp, addrs) = addrs.split_last().expect("a stack pointer word");
            tool.block_run(BlockId(id), &meta.info, addrs);
            tool.stack_pointer(*sp);
        } else {
            tool.block_run(BlockId(id), &meta.info, addrs);
        }
        last = Some(id);
        running = last;
        i += n;
    }
    if unsimulated > 0 {
        tool.branch_words(&branches.words[..unsimulated]);
    }
    match last {
        Some(l) => lasts.insert(thread, l),
        None => lasts.remove(&thread),
    };
}

/// How many words at the start of `words` are kept accesses.
#[inline(always)]
fn kept_run(words: &[u64]) -> usize {
    words
        .iter()
        .position(|&w| !KeptAccess::is_kept(w))
        .unwrap_or(words.len())
}

/// The branch that ended the previous block (`branch`) went to `next`:
/// its record, if it has one.
#[inline(always)]
fn resolve<T: StreamTool + ?Sized>(tool: &mut T, branch: Branch, next: u64) {
    match branch {
        Branch::Cond { pc, target } => {
            // Neither the target nor the fall-through: a signal handler
            // came in between; the outcome is unknown (counted not taken).
            tool.record(Record::CondBranch(CondBranch {
                pc,
                taken: next == target,
            }));
        }
        Branch::Indirect { pc } => {
            tool.record(Record::Indirect(Transfer { pc, target: next }));
        }
        Branch::None => {}
    }
}

/// One execution of a rep string instruction's block: each iteration as a
/// block run with its addresses, and the final check (Cachegrind's n+1 Ir)
/// as a fetch alone.
///
/// The branch records are Cachegrind's (spec §3, "What counts as Bc"):
/// every execution checks RCX (taken: it goes on to iterate, so taken on
/// each iteration and not on the final check), and each iteration of
/// `repe`/`repne` then checks its condition (taken: it repeats, so the last
/// iteration's is taken only when the final check follows).
fn rep_run<T: StreamTool + ?Sized>(tool: &mut T, meta: &BlockMeta, words: &[u64], branches: bool) {
    let rep = meta.rep.as_ref().expect("a rep block");
    debug_assert_eq!(words.len(), REP_WORDS as usize - 1);
    let [rcx0, rsi0, rdi0, rcx1, rsi1, rdi1, zf, _] = words[..8] else {
        return;
    };
    let iterations = rcx0.saturating_sub(rcx1);
    let extra = final_check(rep.cond, iterations, rcx1, zf & 0xff != 0);
    let uses_rdi = rep.from_rsi.iter().any(|&s| !s);
    let backwards = if uses_rdi { rdi1 < rdi0 } else { rsi1 < rsi0 };
    let id = BlockId(meta.id);
    let pc = meta.info.start();
    let operands = meta.info.mem_count();
    let mut addrs = Vec::with_capacity(operands);
    for k in 0..iterations {
        let off = k.wrapping_mul(rep.step);
        addrs.clear();
        for &from_rsi in rep.from_rsi.iter().take(operands) {
            let base = if from_rsi { rsi0 } else { rdi0 };
            addrs.push(if backwards {
                base.wrapping_sub(off)
            } else {
                base.wrapping_add(off)
            });
        }
        tool.block_run(id, &meta.info, &addrs);
        if branches {
            tool.record(Record::CondBranch(CondBranch { pc, taken: true }));
            if rep.cond.is_some() {
                let taken = k + 1 < iterations || extra;
                tool.record(Record::CondBranch(CondBranch { pc, taken }));
            }
        }
    }
    if extra {
        let i = meta.info.instrs()[0];
        tool.records(&[
            Record::Block(id),
            Record::Instr(InstrFetch {
                addr: i.addr,
                len: u32::from(i.len),
            }),
        ]);
        if branches {
            tool.record(Record::CondBranch(CondBranch { pc, taken: false }));
        }
    }
}

/// Whether a rep string instruction that ran `iterations` times, leaving
/// RCX at `rcx_after` and ZF at `zf`, is executed once more to find it has
/// finished (Cachegrind's n+1 Ir): when it never iterated, or when RCX ran
/// out while its condition (`cond`: `Some(true)` for `repe`, `Some(false)`
/// for `repne`) still held; not when the condition stopped it.
fn final_check(cond: Option<bool>, iterations: u64, rcx_after: u64, zf: bool) -> bool {
    iterations == 0
        || (rcx_after == 0
            && match cond {
                None => true,
                Some(repe) => zf == repe,
            })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::translate::RepString;
    use events::{BlockInfo, MemOperand};

    /// Keeps the fetches and branch outcomes it is given.
    #[derive(Default)]
    struct Seen {
        fetches: usize,
        data: Vec<u64>,
        branches: Vec<bool>,
    }

    impl events::Tool for Seen {
        fn needs(&self) -> Needs {
            Needs::COUNTING
        }
        fn record(&mut self, record: Record) {
            match record {
                Record::Instr(_) => self.fetches += 1,
                Record::Data(d) => self.data.push(d.addr),
                Record::CondBranch(b) => self.branches.push(b.taken),
                _ => {}
            }
        }
    }

    impl StreamTool for Seen {
        fn fork(&self) -> Box<dyn StreamTool> {
            Box::new(Seen::default())
        }
        fn into_any(self: Box<Self>) -> Box<dyn Any + Send> {
            self
        }
    }

    /// A one-byte-step rep string block at 0x1000 reading at RSI.
    fn rep_block(cond: Option<bool>) -> BlockMeta {
        let mut info = BlockInfo::new(0x1000, Terminator::FallThrough);
        let read = MemOperand {
            size: 1,
            kind: events::AccessKind::Read,
        };
        info.push(0x1000, 2, &[read]);
        BlockMeta {
            id: 0,
            info,
            words: REP_WORDS,
            sp: false,
            kept: false,
            counter: None,
            sites: None,
            rep: Some(RepString {
                cond,
                step: 1,
                from_rsi: vec![true],
            }),
        }
    }

    /// Runs a rep block whose registers went from `rcx0` to `rcx1`, RSI
    /// forwards from 0x5000, with ZF `zf` at the end.
    fn run(cond: Option<bool>, rcx0: u64, rcx1: u64, zf: bool) -> Seen {
        let meta = rep_block(cond);
        let n = rcx0 - rcx1;
        let words = [
            rcx0,
            0x5000,
            0x9000,
            rcx1,
            0x5000 + n,
            0x9000,
            u64::from(zf),
            // The branch stream's position (read by the decoder only).
            0,
        ];
        let mut seen = Seen::default();
        rep_run(&mut seen, &meta, &words, true);
        seen
    }

    /// Filtered records: each block's kept accesses follow its id; those
    /// of a block a signal handler interrupted resume after the handler's
    /// `rt_sigreturn` marker.
    #[test]
    fn kept_accesses_follow_their_block_and_resume_after_a_handler() {
        let load = MemOperand {
            size: 8,
            kind: events::AccessKind::Read,
        };
        let mut decoder = Decoder::new(Needs::COUNTING);
        let mut two = BlockInfo::new(0x1000, Terminator::FallThrough);
        two.push(0x1000, 4, &[load, load]);
        let mut none = BlockInfo::new(0x2000, Terminator::FallThrough);
        none.push(0x2000, 2, &[]);
        for (id, info, kept) in [(0, two, true), (1, none, false)] {
            decoder.add(BlockMeta {
                id,
                info,
                words: 1,
                sp: false,
                kept,
                counter: None,
                sites: None,
                rep: None,
            });
        }
        let k = |operand, addr| KeptAccess::new(operand, addr).0;
        let words = [
            0,
            k(1, 0x40),
            1,
            0,
            k(0, 0x80),
            u64::from(MARK_SIGNAL),
            1,
            u64::from(MARK_SIGRETURN),
            k(1, 0xc0),
            0,
        ];
        let mut seen = Seen::default();
        decode(&mut seen, &mut decoder, 9, &words, BranchStream::default());
        assert_eq!(seen.fetches, 5, "five block runs");
        assert_eq!(seen.data, [0x40, 0x80, 0xc0]);
        assert!(decoder.interrupted[&9].is_empty());
    }

    /// What a tool with counted executions receives.
    #[derive(Default)]
    struct Counted {
        sites: Vec<Vec<u64>>,
        pairs: Vec<(u32, u64)>,
        signals: usize,
        /// Branches in the order the predictor would see them: branch
        /// words, and `REP_TAKEN`/`REP_NOT_TAKEN` for a rep block's.
        branches: Vec<u32>,
    }

    const REP_TAKEN: u32 = 1;
    const REP_NOT_TAKEN: u32 = 0;

    impl events::Tool for Counted {
        fn needs(&self) -> Needs {
            Needs {
                mru_filter: Some(events::MruFilter {
                    line_bits: 6,
                    set_bits: 6,
                    fetch_set_bits: Some(6),
                    indirect_bits: None,
                }),
                cond_branches: true,
                ..Needs::COUNTING
            }
        }
        fn record(&mut self, record: Record) {
            if let Record::CondBranch(b) = record {
                self.branches
                    .push(if b.taken { REP_TAKEN } else { REP_NOT_TAKEN });
            }
        }
        fn branch_words(&mut self, words: &[u32]) {
            self.branches.extend(words.iter().rev());
        }
        fn site_accesses(&mut self, words: &[u64]) -> usize {
            let n = events::site_run(words);
            self.sites.push(words[..n].to_vec());
            n
        }
        fn counted_access(&mut self, id: BlockId, kept: KeptAccess) {
            self.pairs.push((id.0, kept.0));
        }
        fn signal(&mut self, _: SignalEvent) {
            self.signals += 1;
        }
    }

    impl StreamTool for Counted {
        fn fork(&self) -> Box<dyn StreamTool> {
            Box::new(Counted::default())
        }
        fn into_any(self: Box<Self>) -> Box<dyn Any + Send> {
            self
        }
    }

    /// Counted executions: site words between pairs and markers reach the
    /// tool in runs, in order, and pairs as pairs.
    #[test]
    fn site_words_reach_the_tool_in_runs() {
        let mut tool = Counted::default();
        let mut decoder = Decoder::new(events::Tool::needs(&tool));
        let layout = SiteWords::new(6);
        let site = |n: u32, line: u64| layout.word(n, n.is_multiple_of(2), false, line);
        let pair = KeptAccess::new(0, 0x1000).0;
        let words = [
            site(1, 0),
            site(2, 0x7fff_ffff),
            COUNTED_PAIR | 5,
            pair,
            site(3, 9),
            u64::from(MARK_SIGNAL),
            site(4, 10),
            u64::from(MARK_SIGRETURN),
        ];
        decode(&mut tool, &mut decoder, 1, &words, BranchStream::default());
        assert_eq!(
            tool.sites,
            [
                vec![site(1, 0), site(2, 0x7fff_ffff)],
                vec![site(3, 9)],
                vec![site(4, 10)]
            ]
        );
        assert_eq!(tool.pairs, [(5, pair)]);
        assert_eq!(tool.signals, 2);
    }

    /// A rep string block's branches (from its record) go to the predictor
    /// between the branch words written before it and those after: its
    /// record holds the branch stream's position.
    #[test]
    fn a_rep_blocks_branches_go_in_their_place_among_the_branch_words() {
        let mut tool = Counted::default();
        let mut decoder = Decoder::new(events::Tool::needs(&tool));
        decoder.add(rep_block(None));
        let c = |n: u32| events::BranchWords::tag(n + 1) | u32::from(n.is_multiple_of(2));
        // Written c0, c1, c2 from the top of the buffer down (at `base`
        // the last), the rep block after c1.
        let base = 0x10_0000;
        let stream = [c(2), c(1), c(0)];
        let limit_after_c1 = (base + 4) - crate::layout::TRACE_SLACK;
        let words = [0, 2, 0x5000, 0x9000, 0, 0x5002, 0x9000, 0, limit_after_c1];
        let branches = BranchStream {
            words: &stream,
            base,
        };
        decode(&mut tool, &mut decoder, 1, &words, branches);
        assert_eq!(
            tool.branches,
            [c(0), c(1), REP_TAKEN, REP_TAKEN, REP_NOT_TAKEN, c(2)]
        );
    }

    /// Cachegrind's branch records (spec §3): `rep movsb` with n = 3 makes
    /// 4 checks of RCX, taken (iterate) three times; `repe cmpsb` adds a
    /// condition check per iteration, taken (repeat) unless the condition
    /// stopped it.
    #[test]
    fn rep_branches_are_cachegrinds() {
        let s = run(None, 3, 0, false);
        assert_eq!(s.fetches, 4);
        assert_eq!(s.data, [0x5000, 0x5001, 0x5002]);
        assert_eq!(s.branches, [true, true, true, false]);
        // repe, all equal: runs out of RCX, then the final check.
        let s = run(Some(true), 3, 0, true);
        assert_eq!(s.fetches, 4);
        assert_eq!(s.branches, [true, true, true, true, true, true, false]);
        // repe, unequal at the second byte: stopped by the condition.
        let s = run(Some(true), 3, 1, false);
        assert_eq!(s.fetches, 2);
        assert_eq!(s.branches, [true, true, true, false]);
        // repne finding its byte at the last position: no final check.
        let s = run(Some(false), 2, 0, true);
        assert_eq!(s.fetches, 2);
        assert_eq!(s.branches, [true, true, true, false]);
        // Nothing to do: one check, not taken.
        let s = run(Some(true), 0, 0, false);
        assert_eq!((s.fetches, s.branches), (1, vec![false]));
    }
}
