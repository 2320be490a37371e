//! The x86-64 dynamic binary instrumentation engine: launches a client under
//! ptrace and runs it entirely from translated code.
//!
//! The public surface is deliberately small: [`run`] takes a
//! [`LaunchConfig`] and reports, through a [`ProfileSink`], one
//! [`ProcessProfile`] per traced process as it exits (a forked child reports
//! its own). Symbolization and output are the caller's business.
//!
//! How it works, in one paragraph per module:
//!
//! * `sys` (the only `unsafe` code): the detached tracer's fork, the
//!   client's preparation (`ADDR_NO_RANDOMIZE`, and a seccomp filter that
//!   traps only the engine's own magic syscall numbers, so a program that
//!   runs detached is unaffected) and exec; ptrace and waitpid wrappers.
//! * `tracer`: the event loop. After the client's exec it injects syscalls
//!   (through a `syscall; mov rdi, rax; mov eax, MAGIC; syscall` gadget) to
//!   map the core region and a thread area, translates the entry block and
//!   points RIP at it. Translated code comes back to the tool only through
//!   magic syscalls: an unlinked direct branch, an indirect-branch lookup
//!   miss, or a syscall the tool wants to see (execve, mmap family,
//!   rt_sigaction, rt_sigreturn, rseq, arch_prctl). Threads, forks, vforks,
//!   execs, exits and signals are followed through ptrace events.
//! * `space`: one client address space: code-cache chunks near the code
//!   they translate, blocks, exit stubs and pending links, the indirect
//!   branch table, thread areas and counters, invalidation of unmapped code
//!   (a module per job, see its doc).
//! * `client_mem`: everything the tool does to a client's memory (queued
//!   and live writes, reads, the memory map) behind a trait, so that
//!   `space` and `ibtable` run in unit tests against a fake memory.
//! * `translate`: one guest basic block to code-cache code with iced-x86;
//!   `emit`: the hand-encoded instructions it adds; `layout`: the
//!   addresses and offsets both sides agree on.

// `unsafe` is allowed in `sys` alone (with a `// SAFETY:` comment on each
// block); anywhere else in the engine it does not compile.
#![deny(unsafe_code)]

mod client_mem;
mod clientreq;
mod cpu;
mod emit;
mod handoff;
mod ibtable;
mod layout;
mod memrefs;
mod runtime;
mod space;
mod stream;
mod sys;
mod tracer;
mod translate;
mod vprintf;

pub use clientreq::{RequestConfig, RequestTool};
pub use stream::{BranchStream, Decoder, FinishedTool, StreamTool, ToolFactory};

use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::Arc;

/// Not an API: the per-instruction data-access rules (the private
/// `memrefs` module), for the engine's own integration tests
/// (`tests/memrefs_lackey.rs`).
#[doc(hidden)]
pub mod memrefs_for_tests {
    pub use crate::memrefs::{data_accesses, Access, Accesses, AddrExpr};
}
pub use tracer::{find_program, ProgramError, Unrunnable};

/// What to run and how.
#[derive(Clone)]
pub struct LaunchConfig {
    /// The program, as given by the user (resolved through `PATH` by the
    /// engine when it has no slash, like `execvp`).
    pub program: OsString,
    /// Arguments after the program name.
    pub args: Vec<OsString>,
    /// `--trace-children=yes`: follow `execve`. With `false`, an exec'd
    /// image runs natively and unprofiled.
    pub trace_children: bool,
    /// `--stats=yes`: gather [`EngineStats`] (translated code also counts
    /// its inline lookups, which costs a little).
    pub stats: bool,
    /// The tool of each process image, if any: when it needs records
    /// ([`events::Tool::needs`]), translated code writes trace buffers that
    /// a consumer thread decodes into it, and each process's tool comes
    /// back in its [`ProcessProfile`]; otherwise the inline counters serve
    /// and the tool is not used.
    pub tool: Option<ToolFactory>,
    /// How client requests are treated: whose instrumentation requests are
    /// obeyed, and whether processes start instrumented.
    pub requests: RequestConfig,
    /// `--smc-check`: which translated blocks check, each time they run,
    /// that their guest code has not changed since it was translated.
    pub smc_check: SmcCheck,
    /// Contexts mode (`docs/client-contexts.md`): the client keeps its own
    /// calling contexts with Callgrind's rules, instead of counting or
    /// tracing; each process's arenas come back in its
    /// [`ProcessProfile::contexts`].
    pub contexts: Option<ContextsConfig>,
}

/// What contexts mode needs: how code is classified, and Callgrind's
/// options the runtime applies.
#[derive(Clone)]
pub struct ContextsConfig {
    /// A classifier for each process image.
    pub classifier: Arc<dyn Fn() -> Box<dyn ContextClassifier> + Send + Sync>,
    /// `--separate-recs`.
    pub separate_recs: u32,
    /// Whether the client keeps only Callgrind's (function, level)
    /// contexts rather than the calling-context tree
    /// (`ctxrt::Runtime::flat`): when nothing reads the tree (no export).
    pub flat: bool,
    /// Tagged counting (`ctxrt::tagged`, flat contexts only): each block
    /// counts in a slot of its own tagged with its context, and jumps
    /// Callgrind's rules take for jumps keep the context whatever
    /// function they go to.
    pub tagged: bool,
    /// Tagged counting: translated code counts its inline calls and
    /// returns (`-v -v`'s summary). Off, it saves an increment of a hot
    /// word in each: stores set the pace of a transition
    /// (`docs/client-contexts.md`, session 37).
    pub count_inline: bool,
}

/// Names the code a block starts with for Callgrind's rules, as the call
/// tool would (`callrules::Flow`'s function, domain, entry, skip,
/// pop-on-jump and notify facts; the engine fills in the addresses and
/// the exit).
pub trait ContextClassifier: Send {
    /// The facts of the block `info` describes (its instructions may be
    /// missing when only the code at its start is asked about; its origin
    /// is there when the code is a file's), and its counter group: the
    /// blocks a context counts side by side (one function by name, whatever
    /// source file each block starts in; `ctxrt::Facts::group`). Asked
    /// again about code it was asked about, it answers as it did the
    /// first time (its function's facts then; the engine keeps no copy of
    /// the answers and asks about code each time it needs to know).
    fn classify(&mut self, info: &events::BlockInfo) -> (callrules::Flow, u32);
    /// A copy for a forked child.
    fn fork(&self) -> Box<dyn ContextClassifier>;
}

/// One thread's calling contexts as its runtime left them.
#[derive(Debug, Clone)]
pub struct ThreadContexts {
    /// Valgrind's thread number.
    pub thread: u32,
    /// Its hot words (`ctxrt::hot`).
    pub hot: Vec<u64>,
    /// Its arena's used words (`ctxrt::Arena`, or `ctxrt::tagged`'s).
    pub arena: Vec<u64>,
    /// Tagged counting: its blocks' slots (`ctxrt::tagged::SLOT_WORDS`
    /// per block id); empty otherwise.
    pub slots: Vec<u64>,
}

/// A process's calling contexts (contexts mode).
#[derive(Debug, Clone, Default)]
pub struct ContextsProfile {
    /// Each thread's, by thread number.
    pub threads: Vec<ThreadContexts>,
    /// Each block id's description (origin set), function, counter group
    /// and number in the group, and whether a call memo follows its
    /// counter (`ctxrt::Facts::memo`); `None` for an id whose translation
    /// failed.
    pub blocks: Vec<Option<ctxrt::NumberedBlock<events::BlockInfo>>>,
    /// Whether the threads counted tagged (`ctxrt::tagged`).
    pub tagged: bool,
}

/// Valgrind's `--smc-check`: which code gets self-modifying-code checks
/// (a block with one compares its guest bytes with those it was made from
/// on every entry, and is translated again when they differ).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SmcCheck {
    /// No checks: code that changes without an `munmap`/`mprotect` keeps
    /// running its old translation.
    None,
    /// Code on the stack of the thread that first runs it (GCC's
    /// nested-function trampolines).
    Stack,
    /// Every block, file-backed code included.
    All,
    /// Every block except those from ordinary read-only file mappings
    /// (Valgrind's default on amd64): anonymous and writable code, and
    /// code whose bytes can change through another mapping (memory files,
    /// `/dev/shm`, deleted files, shared mappings), is checked.
    #[default]
    AllNonFile,
}

impl SmcCheck {
    /// The mode Valgrind spells `name` (`none`, `stack`, `all`,
    /// `all-non-file`).
    pub fn from_name(name: &str) -> Option<SmcCheck> {
        Some(match name {
            "none" => SmcCheck::None,
            "stack" => SmcCheck::Stack,
            "all" => SmcCheck::All,
            "all-non-file" => SmcCheck::AllNonFile,
            _ => return None,
        })
    }
}

impl std::fmt::Debug for LaunchConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LaunchConfig")
            .field("program", &self.program)
            .field("args", &self.args)
            .field("trace_children", &self.trace_children)
            .field("stats", &self.stats)
            .field("tool", &self.tool.is_some())
            .field("requests", &self.requests)
            .field("smc_check", &self.smc_check)
            .field("contexts", &self.contexts.is_some())
            .finish()
    }
}

/// Where the engine's time went in one process (`--stats=yes`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EngineStats {
    /// Guest blocks translated (eagerly or on demand).
    pub blocks_translated: u64,
    /// Translated blocks with a self-modifying-code check (`--smc-check`).
    pub blocks_checked: u64,
    /// Translated blocks that ran at least once.
    pub blocks_executed: u64,
    /// Guest instructions in those blocks.
    pub guest_instructions_translated: u64,
    /// Time spent translating (including eager translation and linking).
    pub translation_time: std::time::Duration,
    /// Exits to the tool because a direct branch's target had no
    /// translation yet.
    pub exits_link: u64,
    /// Exits to the tool because an indirect target was not in the table.
    pub exits_lookup_miss: u64,
    /// Exits for a system call the tool handles (mmap family, signals,
    /// exec, ...).
    pub exits_syscall: u64,
    /// Exits because a trace buffer was full (trace mode).
    pub exits_flush: u64,
    /// Exits for a client request (Valgrind's magic sequence).
    pub exits_request: u64,
    /// Exits because a block's guest code had changed since it was
    /// translated (self-modifying code, `--smc-check`).
    pub exits_smc: u64,
    /// Indirect transfers resolved inline (way 0 of the home bucket);
    /// counted only with `--stats=yes`.
    pub lookup_inline_hits: u64,
    /// Indirect transfers that went on to the probe stub.
    pub lookup_probes: u64,
    /// Probes that found their target in the table (the rest exited).
    pub lookup_probe_hits: u64,
    /// Targets published in the indirect-branch table at exit.
    pub table_targets: u64,
    /// Overflow buckets chained in the table at exit.
    pub table_overflow_buckets: u64,
    /// Targets not published because the table was full.
    pub table_refused: u64,
    /// Bytes of code cache used (block bodies and aux areas).
    pub code_cache_bytes: u64,
    /// Code-cache chunks mapped.
    pub code_cache_chunks: u64,
    /// Trace mode (blocks wrote records for a tool): where the records'
    /// time went.
    pub trace: Option<TraceStats>,
}

/// The records of one process in trace mode (`--stats=yes`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TraceStats {
    /// Record bytes handed to the tool.
    pub bytes: u64,
    /// Time the tracer spent reading records out of the client.
    pub read_time: std::time::Duration,
    /// Time the tracer (and so the client thread at a buffer's flush)
    /// waited for the tool to give a record buffer back: the tool not
    /// keeping up.
    pub wait_time: std::time::Duration,
    /// Time the tool's thread spent on this process's records.
    pub tool_time: std::time::Duration,
}

/// An executable mapping of the client, recorded when code in it was first
/// translated, so that addresses still resolve after the module is unmapped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModuleRecord {
    /// Path of the mapped file (empty for anonymous memory).
    pub path: PathBuf,
    /// First address of the mapping.
    pub start: u64,
    /// One past the last address of the mapping.
    pub end: u64,
    /// File offset that `start` maps.
    pub file_offset: u64,
}

impl EngineStats {
    /// Counts an exit of translated code by its magic number.
    pub(crate) fn count_exit(&mut self, magic: u32) {
        match magic {
            layout::MAGIC_LINK => self.exits_link += 1,
            layout::MAGIC_MISS => self.exits_lookup_miss += 1,
            layout::MAGIC_SYSCALL => self.exits_syscall += 1,
            layout::MAGIC_FLUSH => self.exits_flush += 1,
            layout::MAGIC_REQUEST => self.exits_request += 1,
            layout::MAGIC_SMC => self.exits_smc += 1,
            _ => {}
        }
    }

    /// Exits to the tool in all.
    pub fn exits(&self) -> u64 {
        self.exits_link
            + self.exits_lookup_miss
            + self.exits_syscall
            + self.exits_flush
            + self.exits_request
            + self.exits_smc
    }

    /// The report `--stats=yes` prints, one line per subject.
    pub fn report(&self) -> Vec<String> {
        let lookups = self.lookup_inline_hits + self.lookup_probes;
        vec![
            format!(
                "engine: translated {} blocks ({} instructions, {} blocks ran, {} checked for changes) in {:.3} s",
                self.blocks_translated,
                self.guest_instructions_translated,
                self.blocks_executed,
                self.blocks_checked,
                self.translation_time.as_secs_f64()
            ),
            format!(
                "engine: exits to the tool: {} (untranslated branch {}, lookup miss {}, syscall {}, trace buffer full {}, client request {}, code changed {})",
                self.exits(),
                self.exits_link,
                self.exits_lookup_miss,
                self.exits_syscall,
                self.exits_flush,
                self.exits_request,
                self.exits_smc
            ),
            format!(
                "engine: indirect lookups: {lookups} ({} inline hits, {} probed: {} found, {} missed)",
                self.lookup_inline_hits,
                self.lookup_probes,
                self.lookup_probe_hits,
                self.lookup_probes.saturating_sub(self.lookup_probe_hits)
            ),
            format!(
                "engine: lookup table: {} targets, {} overflow buckets, {} refused (full)",
                self.table_targets, self.table_overflow_buckets, self.table_refused
            ),
            format!(
                "engine: code cache: {} bytes in {} chunks",
                self.code_cache_bytes, self.code_cache_chunks
            ),
        ]
        .into_iter()
        .chain(self.trace.map(|t| {
            format!(
                "engine: trace: {:.1} MB of records, read in {:.3} s; the tool took {:.3} s of them, the client waited {:.3} s for it",
                t.bytes as f64 / f64::from(1 << 20),
                t.read_time.as_secs_f64(),
                t.tool_time.as_secs_f64(),
                t.wait_time.as_secs_f64()
            )
        }))
        .collect()
    }
}

/// Executed-instruction counts by guest instruction address (a fast hash:
/// a large program has hundreds of thousands of addresses to count at exit).
pub type InstrCounts = rustc_hash::FxHashMap<u64, u64>;

/// The counts gathered for one client process (all its threads).
#[derive(Debug, Clone, Default)]
pub struct ProcessProfile {
    /// The client's pid (used for `%p` in output names).
    pub pid: i32,
    /// Executed-instruction count per guest instruction address (Ir).
    pub instr_counts: InstrCounts,
    /// Every executable mapping that code was translated from.
    pub modules: Vec<ModuleRecord>,
    /// What `--stats=yes` reports (gathered only when asked for).
    pub stats: Option<EngineStats>,
    /// Counts of code whose translations were dropped before the process
    /// ended (unmapped by dlclose, or translated again when instrumentation
    /// was stopped or started), each with the mapping it ran from;
    /// `instr_counts` holds the rest.
    /// (Another module may have been mapped at the same addresses since.)
    pub unmapped: Vec<UnmappedCode>,
    /// In trace mode, the process's tool with everything it was fed
    /// (`instr_counts` is then empty: the tool counted).
    pub tool: Option<FinishedTool>,
    /// In contexts mode, the calling contexts its threads kept.
    pub contexts: Option<ContextsProfile>,
}

/// Counts of instructions from one mapping that went away before exit.
#[derive(Debug, Clone, Default)]
pub struct UnmappedCode {
    /// The mapping the instructions ran from.
    pub module: Option<ModuleRecord>,
    /// Executed-instruction count per guest instruction address.
    pub instr_counts: InstrCounts,
}

/// Which of Valgrind's message streams a [`Message`] belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MessageKind {
    /// The client's own text (`VALGRIND_PRINTF`): Valgrind prefixes each
    /// line with `**PID** `. The text is exactly what the client formatted,
    /// newlines included; a text that does not end with one is continued
    /// by the next client message.
    Client,
    /// A user message (`==PID== `), one line, without its newline.
    User,
    /// A debug message (`--PID-- `), one line, without its newline.
    Debug,
}

/// Something the engine prints on the client's behalf, as Valgrind would.
#[derive(Debug, Clone, Copy)]
pub struct Message<'a> {
    /// Which stream.
    pub kind: MessageKind,
    /// The text (see [`MessageKind`]).
    pub text: &'a str,
    /// For `VALGRIND_PRINTF_BACKTRACE`: the stack trace to print after the
    /// text, innermost first (instruction addresses: the request's own
    /// first, then return addresses minus one, as Valgrind shows them).
    /// The engine gives the request's own frame; the callers are found by
    /// unwinding `stack`.
    pub backtrace: &'a [u64],
    /// For `VALGRIND_PRINTF_BACKTRACE`: the requesting thread's registers
    /// and stack, to unwind.
    pub stack: Option<ThreadStack<'a>>,
    /// The process's executable mappings, to symbolize `backtrace` with.
    pub modules: &'a [ModuleRecord],
}

impl<'a> Message<'a> {
    /// A message of `kind` that is only `text`.
    pub fn line(kind: MessageKind, text: &'a str) -> Self {
        Message {
            kind,
            text,
            backtrace: &[],
            stack: None,
            modules: &[],
        }
    }
}

/// A stopped thread's stack as a [`Message`] carries it: the registers
/// unwinding starts from and a copy of the stack from RSP up.
#[derive(Debug, Clone, Copy)]
pub struct ThreadStack<'a> {
    /// The instruction address of the innermost frame (a guest address).
    pub rip: u64,
    /// The stack pointer: the address of `bytes[0]`.
    pub rsp: u64,
    /// The frame pointer.
    pub rbp: u64,
    /// The stack's contents from `rsp` on (up to 64 KiB, less where the
    /// stack's mapping ends).
    pub bytes: &'a [u8],
}

/// Receives each process's profile when that process exits.
pub trait ProfileSink {
    /// Called once per traced process, after its last thread exited.
    fn process_finished(&mut self, profile: ProcessProfile);

    /// Code was translated for the first time from `module` (a sink that
    /// symbolizes at the end can start reading the object now, while the
    /// client runs). By default, nothing.
    fn module_seen(&mut self, module: &ModuleRecord) {
        let _ = module;
    }

    /// The client is about to map the file at `path` executable (its code
    /// has not run yet; a sink that names code as it is translated can
    /// start reading the object). By default, nothing.
    fn executable_file_mapped(&mut self, path: &std::path::Path) {
        let _ = path;
    }

    /// With `trace_children`, whether to follow a process into the program
    /// it just exec'd: `exe` is the file name it gave `execve` (as given,
    /// like Valgrind's `--trace-children-skip` sees it) and `argv` the new
    /// program's arguments, `argv[0]` included. An image not followed runs
    /// natively. By default, every one is followed.
    fn follow_exec(&mut self, exe: &str, argv: &[String]) -> bool {
        let _ = (exe, argv);
        true
    }

    /// A message for the user from process `pid` (see [`Message`]). By
    /// default, written to stderr with Valgrind's prefix on each line (the
    /// backtrace as bare addresses).
    fn message(&mut self, pid: i32, message: &Message) {
        let mark = match message.kind {
            MessageKind::Client => "**",
            MessageKind::User => "==",
            MessageKind::Debug => "--",
        };
        let mut out = String::new();
        for line in message.text.lines() {
            out.push_str(&format!("{mark}{pid}{mark} {line}\n"));
        }
        for (n, ip) in message.backtrace.iter().enumerate() {
            let at = if n == 0 { "at" } else { "by" };
            out.push_str(&format!("=={pid}==    {at} 0x{ip:X}: ???\n"));
        }
        eprint!("{out}");
    }
}

/// How the client ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// It called exit with this status.
    Exited(i32),
    /// It was killed by this signal.
    Signaled(i32),
    /// It went on natively in a program the run did not follow (an exec
    /// without `trace_children`, or one the sink declined): its end is
    /// its caller's to see, not the tool's.
    Untraced,
}

/// Something that stops the engine from running the client, with a one-line
/// message suitable for the user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineError(pub String);

impl std::fmt::Display for EngineError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for EngineError {}

/// Runs the client described by `config` to completion from translated code,
/// reporting each process's profile to `sink` as it exits.
///
/// The calling process becomes the client: its pid is the client's, its
/// parent sees the client's exit status (or killing signal) in `wait`, and
/// signals sent to it are the client's. The engine runs in a detached copy
/// of the caller (a new session, no longer anyone's child), forked here, in
/// which this function returns once every traced process has ended, with
/// how the client ended. Each process's profile reaches `sink` at the
/// process's exit, before the process is released, so whoever waits for it
/// finds the sink's output complete.
///
/// In the calling process this returns only with an error (the client
/// could not be started; nothing ran): on success the caller's image is
/// replaced by the program. An error in the tracer (after the client
/// started) kills the client. Must be called from a single-threaded
/// process, with nothing buffered for output that the copy would write
/// again.
pub fn run(config: &LaunchConfig, sink: &mut dyn ProfileSink) -> Result<Outcome, EngineError> {
    tracer::run(config, sink)
}
