//! The run mode, Valgrind's `[options] prog [args]`: launches the program
//! under the instrumentation engine and, for each process that exits,
//! writes its `cachegrind.out` file and prints Cachegrind's summary.
//!
//! The preamble has the shape of Valgrind's (tool line, copyright line,
//! core line, `Command:`, `Parent PID:` when logging to a file, a blank
//! line) so that wrappers which skip or parse it keep working, but it names
//! cachescope. Its `==PID==` is the client's pid, as under Valgrind: this
//! process becomes the client (the engine runs in a detached process), so
//! the banner, `--log-file=%p`, `cachegrind.out.%p` and the summary all
//! name one pid, and each other process's summary carries its own.

mod attribute;
mod callgrind;
mod cgopts;
mod exports;
mod lackey;
mod live;
mod log;
mod options;
mod skip;

pub(crate) use attribute::summary_totals;

use std::ffi::OsString;
use std::process::ExitCode;

use engine::{LaunchConfig, Message, MessageKind, ProcessProfile, ProfileSink};
use symbols::Symbolizer;

use crate::outfile::{process_env, BadPattern, Expander};
use crate::simopts;
use crate::summary::{summary_lines, Totals};
use log::{preamble_arg, Log};
use options::{Command, RunOptions, RunTool, UsageError};
use profile::output::{write_output, OutputError};

/// This program's version, as the banner and `--version` show it.
const VERSION: &str = env!("CARGO_PKG_VERSION");

/// Entry point of the run mode (arguments after the command name).
pub fn main(args: &[OsString]) -> ExitCode {
    main_as(args, "cachescope")
}

/// The run mode under the command name `name` (`cachescope`, or
/// `valgrind` for the drop-in), which prefixes its error lines as
/// Valgrind's `valgrind: `.
pub fn main_as(args: &[OsString], name: &str) -> ExitCode {
    let started = std::time::Instant::now();
    match options::parse(args) {
        Ok(Command::Help) => {
            print!("{}", options::usage(name));
            ExitCode::SUCCESS
        }
        Ok(Command::Version) => {
            println!("cachescope-{VERSION}");
            ExitCode::SUCCESS
        }
        Ok(Command::Run(opts)) => run(&opts, name, started),
        Err(UsageError(lines)) => {
            for l in lines {
                eprintln!("{name}: {l}");
            }
            ExitCode::from(1)
        }
    }
}

fn run(opts: &RunOptions, name: &str, started: std::time::Instant) -> ExitCode {
    let me = std::process::id() as i32;
    let mut expander = Expander::new(std::env::current_dir().ok());
    let log = match &opts.log_file {
        None => Log::stderr(),
        Some(pattern) => {
            let opened = expander
                .expand("--log-file", pattern, me, &process_env)
                .map_err(|BadPattern(lines)| lines)
                .and_then(|path| {
                    Log::to_file(&path).map_err(|e| {
                        vec![format!("can't create log file '{}': {e}", path.display())]
                    })
                });
            match opened {
                Ok(log) => log,
                Err(lines) => {
                    for l in lines {
                        eprintln!("{name}: {l}");
                    }
                    return ExitCode::from(1);
                }
            }
        }
    };
    if let Err(BadPattern(lines)) = check_out_pattern(opts, me) {
        for l in lines {
            eprintln!("{name}: {l}");
        }
        return ExitCode::from(1);
    }
    let log = if opts.time_stamp {
        log.with_time_stamps(started)
    } else {
        log
    };
    // Lackey's trace goes where the messages go, through its own buffer.
    let trace =
        matches!(opts.tool, RunTool::Lackey(_)).then(|| ::lackey::TraceOut::new(log.writer()));
    let mut sink = CgSink {
        opts,
        cmd: attribute::command_line(&opts.program, &opts.args),
        expander,
        symbols: Symbolizer::with_names(opts.names),
        unwinder: symbols::Unwinder::new(),
        log,
        trace,
        preload_symbols: false,
        preload_naming: false,
    };
    // Valgrind prints nothing but the error for a program it cannot start.
    if let Err(e) = engine::find_program(&opts.program) {
        let (line, status) = unrunnable(&opts.program, &e);
        eprintln!("{name}: {line}");
        return ExitCode::from(status);
    }
    sink.preamble(me);
    if let RunTool::Callgrind(cg) = &opts.tool {
        if !sink.callgrind_started(cg, me) {
            return ExitCode::from(1);
        }
    }
    let tool = match (&opts.tool, &sink.trace) {
        (RunTool::Lackey(l), Some(out)) => Some(lackey::factory(l, out.clone())),
        _ => {
            // The simulated caches, as Cachegrind (and Callgrind) resolve
            // them at start-up (their warnings come after the preamble).
            let log = &mut sink.log;
            let Ok(caches) = simopts::setup_caches(&opts.sim, |m| match m {
                cachesim::Message::Umsg(t) => log.umsg(me, t),
                cachesim::Message::Dmsg(t) => log.dmsg(me, t),
            }) else {
                return ExitCode::from(1);
            };
            match &opts.tool {
                RunTool::Callgrind(cg) if callgrind::contexts_config(opts, cg).is_some() => None,
                RunTool::Callgrind(cg) => Some(callgrind::factory(opts, cg, caches)),
                _ => (opts.sim.cache_sim || opts.sim.branch_sim)
                    .then(|| live::cachegrind(caches, opts.sim.branch_sim)),
            }
        }
    };
    sink.preload_symbols = tool.is_none();
    sink.preload_naming = matches!(&opts.tool,
        RunTool::Callgrind(cg) if callgrind::contexts_config(opts, cg).is_some());
    let requests = match &opts.tool {
        RunTool::Callgrind(cg) => engine::RequestConfig {
            tool: engine::RequestTool::Callgrind,
            instr_at_start: cg.instr_atstart,
        },
        _ => engine::RequestConfig {
            tool: engine::RequestTool::Cachegrind,
            instr_at_start: opts.instr_at_start,
        },
    };
    let config = LaunchConfig {
        program: opts.program.clone(),
        args: opts.args.clone(),
        trace_children: opts.trace_children,
        stats: opts.stats,
        tool,
        requests,
        smc_check: opts.smc_check,
        contexts: match &opts.tool {
            RunTool::Callgrind(cg) => callgrind::contexts_config(opts, cg),
            _ => None,
        },
    };
    // From here on this process is the client (the engine forks the
    // tracer, which comes back from `run`): signals sent to it and its exit
    // status are the client's, and each process's profile and summary are
    // written at its exit, before its parent can see that exit.
    let result = engine::run(&config, &mut sink);
    // Freeing the symbol tables of big objects (hundreds of thousands of
    // names) takes longer than anything else left to do: exit without.
    std::mem::forget(std::mem::take(&mut sink.symbols));
    match result {
        Err(e) => {
            eprintln!("{name}: {e}");
            ExitCode::from(1)
        }
        // The tracer's own status: nobody waits for it.
        Ok(_) => ExitCode::SUCCESS,
    }
}

/// Checks the pattern of the tool's output file before anything runs.
/// Cachegrind and Callgrind expand it at exit and, when it is bad, print
/// the error and exit 1 instead of with the client's status; here the
/// caller waits for the client itself, whose status the tool cannot
/// change, so a bad pattern is refused up front as Valgrind refuses a bad
/// `--log-file`. Every exit would find it equally bad: only the pid and
/// the sequence number differ, and the environment is this process's.
fn check_out_pattern(opts: &RunOptions, pid: i32) -> Result<(), BadPattern> {
    let (option, pattern) = match &opts.tool {
        RunTool::Cachegrind => ("--cachegrind-out-file", &opts.out_file),
        RunTool::Callgrind(cg) => ("--callgrind-out-file", &cg.out_file),
        RunTool::Lackey(_) => return Ok(()),
    };
    // A scratch expander: the run's own keeps its `%n` counters.
    Expander::new(std::env::current_dir().ok())
        .expand(option, pattern, pid, &process_env)
        .map(drop)
}

/// The one line and exit status for a program that cannot be run, in
/// Valgrind's words (`valgrind: ./x: No such file or directory`) and with
/// the shell's statuses: 127 when there is nothing to run, 126 when there
/// is something that cannot be run.
fn unrunnable(program: &std::ffi::OsStr, e: &engine::ProgramError) -> (String, u8) {
    use engine::Unrunnable as U;
    let p = program.to_string_lossy();
    match &e.kind {
        U::NotInPath => (format!("{p}: command not found"), 127),
        U::NoSuchFile => (format!("{p}: No such file or directory"), 127),
        U::Directory => (format!("{p}: is a directory"), 126),
        U::NoPermission => (format!("{p}: Permission denied"), 126),
        U::BadInterpreter => (
            format!("{p}: bad interpreter: No such file or directory"),
            126,
        ),
        U::NotElf => (
            format!("{p}: cannot execute: not an ELF executable or '#!' script"),
            126,
        ),
        U::ForeignElf => (
            format!("{p}: cannot execute: not an x86-64 program (only x86-64 ELF is supported)"),
            126,
        ),
        U::Unreadable(k) => (format!("{p}: {}", std::io::Error::from(*k)), 126),
    }
}

/// One frame of a stack trace as Valgrind shows it: `fn (file:line)` with
/// the file's base name, else `fn (in /path/of/object)`, else `???`.
fn frame_text(symbols: &mut Symbolizer, mappings: &[symbols::Mapping], ip: u64) -> String {
    let loc = symbols.locate(mappings, ip);
    if loc.line > 0 && &*loc.file != symbols::UNKNOWN {
        let base = loc.file.rsplit('/').next().unwrap_or(&loc.file);
        return format!("{} ({base}:{})", loc.func, loc.line);
    }
    match mappings.iter().rev().find(|m| m.start <= ip && ip < m.end) {
        Some(m) if !m.path.as_os_str().is_empty() => {
            format!("{} (in {})", loc.func, m.path.display())
        }
        _ => symbols::UNKNOWN.to_string(),
    }
}

/// The most frames a client's stack trace shows (Valgrind's
/// `--num-callers` default).
const NUM_CALLERS: usize = 12;

/// Receives each exiting process's counts and writes its profile.
struct CgSink<'a> {
    opts: &'a RunOptions,
    cmd: String,
    expander: Expander,
    symbols: Symbolizer,
    /// For `VALGRIND_PRINTF_BACKTRACE`'s callers.
    unwinder: symbols::Unwinder,
    log: Log,
    /// With `--tool=lackey`: where the processes' tools write the trace.
    trace: Option<::lackey::TraceOut>,
    /// Whether to read objects' symbols while the client runs (see
    /// [`ProfileSink::module_seen`]).
    preload_symbols: bool,
    /// Whether the tracer's thread names code as it is translated
    /// (Callgrind's contexts in the client), reading objects first.
    preload_naming: bool,
}

impl CgSink<'_> {
    /// The output file of process `pid` from the pattern of `option`; a bad
    /// pattern (checked before the client started, see
    /// [`check_out_pattern`], so not expected here) is reported and gives
    /// none.
    fn out_path(&mut self, option: &str, pattern: &str, pid: i32) -> Option<std::path::PathBuf> {
        match self.expander.expand(option, pattern, pid, &process_env) {
            Ok(p) => Some(p),
            Err(BadPattern(lines)) => {
                for l in lines {
                    self.log.umsg(pid, &l);
                }
                None
            }
        }
    }

    /// Valgrind's preamble, in the same shape, naming cachescope.
    fn preamble(&mut self, pid: i32) {
        if self.opts.verbosity < 1 {
            return;
        }
        let what = match self.opts.tool {
            RunTool::Cachegrind => "a Cachegrind-compatible high-precision tracing profiler",
            RunTool::Lackey(_) => "a Lackey-compatible memory tracer",
            RunTool::Callgrind(_) => "a Callgrind-compatible call-graph generating cache profiler",
        };
        let lines = [
            format!("Cachescope-{VERSION}, {what}"),
            "Copyright (C) 2026, and GNU GPL'd, by the cachescope developers.".to_string(),
            format!("Using cachescope-{VERSION} and its own instrumentation engine; rerun with -h for usage"),
        ];
        for l in &lines {
            self.log.umsg(pid, l);
        }
        let mut command = format!(
            "Command: {}",
            preamble_arg(&self.opts.program.to_string_lossy())
        );
        for a in &self.opts.args {
            command.push(' ');
            command.push_str(&preamble_arg(&a.to_string_lossy()));
        }
        self.log.umsg(pid, &command);
        if self.log.is_file() {
            let ppid = std::os::unix::process::parent_id();
            self.log.umsg(pid, &format!("Parent PID: {ppid}"));
        }
        self.log.umsg(pid, "");
        if self.opts.verbosity > 1 {
            self.log.dmsg(pid, "");
            self.log.dmsg(pid, "cachescope options:");
            for a in std::env::args().skip(1) {
                if a == self.opts.program.to_string_lossy() {
                    break;
                }
                self.log.dmsg(pid, &format!("   {a}"));
            }
        }
    }
}

impl ProfileSink for CgSink<'_> {
    fn follow_exec(&mut self, exe: &str, argv: &[String]) -> bool {
        !self.opts.skip.skips(exe, argv)
    }

    fn module_seen(&mut self, module: &engine::ModuleRecord) {
        // Symbolization happens at exit; reading the objects now, on a
        // thread of their own, overlaps it with the client's run when the
        // tracer has a core to spare (counting). A tool's consumer thread
        // and the client take both cores of a 2-core machine: there the
        // preload only took CPU from them, and held the tables through the
        // run's peak (python-json with the cache simulation: 14 MB of the
        // tracer's 78).
        if self.preload_symbols && !module.path.as_os_str().is_empty() {
            self.symbols.preload(&module.path);
        }
    }

    fn executable_file_mapped(&mut self, path: &std::path::Path) {
        // Contexts mode names a block's function before translating it, on
        // this thread: reading the object while ld.so relocates (and the
        // other core is idle) takes that read off the client's way.
        if self.preload_naming {
            callgrind::preload_for_naming(path, self.opts.names);
        }
    }

    fn message(&mut self, pid: i32, message: &Message) {
        match message.kind {
            MessageKind::Client => self.log.client(pid, message.text),
            MessageKind::User => self.log.umsg(pid, message.text),
            MessageKind::Debug => self.log.dmsg(pid, message.text),
        }
        let mappings: Vec<symbols::Mapping> =
            message.modules.iter().map(attribute::mapping).collect();
        let mut frames = message.backtrace.to_vec();
        if let Some(stack) = &message.stack {
            let copy = symbols::StackCopy {
                rip: stack.rip,
                rsp: stack.rsp,
                rbp: stack.rbp,
                bytes: stack.bytes.to_vec(),
            };
            let callers = self.unwinder.callers(
                &mut self.symbols,
                &mappings,
                &copy,
                NUM_CALLERS.saturating_sub(frames.len()),
            );
            // Shown at the call, as Valgrind shows callers.
            frames.extend(callers.iter().map(|ra| ra - 1));
        }
        for (n, &ip) in frames.iter().enumerate() {
            let at = if n == 0 { "at" } else { "by" };
            let frame = frame_text(&mut self.symbols, &mappings, ip);
            self.log.umsg(pid, &format!("   {at} 0x{ip:X}: {frame}"));
            // Valgrind's stack traces end at main (--show-below-main=no),
            // or at the first function below it if main was not seen.
            let func = self.symbols.locate(&mappings, ip).func;
            if &*func == "main" || &*func == "(below main)" {
                break;
            }
        }
    }

    fn process_finished(&mut self, proc_profile: ProcessProfile) {
        let opts = self.opts;
        if let RunTool::Callgrind(cg) = &opts.tool {
            return self.callgrind_finished(cg, proc_profile);
        }
        let pid = proc_profile.pid;
        // Valgrind's core prints this blank line at exit, before the tool
        // writes its file (so before any error about it).
        if let (RunTool::Lackey(l), Some(out)) = (&self.opts.tool, &self.trace) {
            let mut proc_profile = proc_profile;
            let mappings = attribute::mappings(&proc_profile);
            let lines = lackey::finish(l, out, &mut proc_profile, &mappings, &mut self.symbols);
            if self.opts.verbosity > 0 {
                self.log.umsg(pid, "");
            }
            // Lackey prints its summary even with -q.
            for l in &lines {
                self.log.umsg(pid, l);
            }
            self.stats(&proc_profile);
            return;
        }
        if self.opts.verbosity > 0 {
            self.log.umsg(pid, "");
        }
        // Like Cachegrind, the name is expanded at exit, with the pid of
        // the process that exits.
        let opts = self.opts;
        let Some(path) = self.out_path("--cachegrind-out-file", &opts.out_file, pid) else {
            return;
        };
        let started = std::time::Instant::now();
        let cmd = if self.opts.trace_children {
            // An image exec'd under --trace-children=yes has its own command
            // line; the process is at its exit stop, so /proc still has it.
            attribute::command_line_of(pid).unwrap_or_else(|| self.cmd.clone())
        } else {
            self.cmd.clone()
        };
        let mut proc_profile = proc_profile;
        let tool = proc_profile.tool.take().and_then(live::finished_cachegrind);
        let (profile, counts) =
            attribute::build_profile(&cmd, &proc_profile, tool.as_ref(), &mut self.symbols);
        let symbolized_in = started.elapsed();
        let mut totals = Totals::default();
        match write_output(&path, 0o600, |mut w| profile.write_to(&mut w)) {
            Ok(()) => totals = summary_totals(counts),
            Err(OutputError::Open(e)) => {
                if self.opts.verbosity > 1 {
                    self.log
                        .dmsg(pid, &format!("cachescope: {}: {e}", path.display()));
                }
                // Cachegrind then reports all-zero totals.
                self.log.umsg(
                    pid,
                    &format!("error: can't open output data file '{}'", path.display()),
                );
                self.log
                    .umsg(pid, "       ... so detailed results will be missing.");
            }
            Err(OutputError::Write(e)) => {
                // Cachegrind does not check its writes (it exits 0 with a
                // truncated file and says nothing); we say so in one line,
                // and the totals, which are right, are still shown.
                self.log.umsg(
                    pid,
                    &format!(
                        "error: can't write output data file '{}': {e}",
                        path.display()
                    ),
                );
                totals = summary_totals(counts);
            }
        }
        if self.opts.verbosity > 1 {
            self.log.dmsg(
                pid,
                &format!(
                    "cachescope: {} instruction addresses in {} mappings symbolized in {} ms, \
                     written to {}",
                    proc_profile.instr_counts.len(),
                    proc_profile.modules.len(),
                    symbolized_in.as_millis(),
                    path.display()
                ),
            );
        }
        if self.opts.verbosity > 0 {
            for l in summary_lines(&totals, self.opts.sim.cache_sim, self.opts.sim.branch_sim) {
                self.log.umsg(pid, &l);
            }
        }
        self.stats(&proc_profile);
    }
}

impl CgSink<'_> {
    /// The engine's statistics of a process, if asked for: like Valgrind's
    /// core statistics, after the tool's summary, even with -q.
    fn stats(&mut self, proc_profile: &ProcessProfile) {
        if let Some(stats) = &proc_profile.stats {
            self.log.umsg(proc_profile.pid, "");
            for l in stats.report() {
                self.log.umsg(proc_profile.pid, &l);
            }
        }
    }
}
