//! Valgrind's command line for the run mode: `[options] prog [args]`.
//!
//! Options are the arguments before the first one that does not start with
//! `-`; that one is the program and the rest are its arguments. The
//! spellings are Valgrind's, so wrappers that drive `valgrind
//! --tool=cachegrind` can drive us unchanged.

use std::ffi::OsString;

use super::cgopts::CallgrindOptions;
use super::lackey;
use super::skip::{patterns, SkipPatterns};
use crate::simopts::{BadOption, SimOptions, USE_HELP};

/// The default `--cachegrind-out-file` pattern.
pub const DEFAULT_OUT_FILE: &str = "cachegrind.out.%p";

/// The tool a run uses (`--tool=`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunTool {
    /// Cachegrind, the default.
    Cachegrind,
    /// Lackey's memory trace and basic counts.
    Lackey(::lackey::LackeyOptions),
    /// Callgrind's call graph, with its options.
    Callgrind(Box<CallgrindOptions>),
}

/// Everything the run mode needs from the command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunOptions {
    /// `--tool=`.
    pub tool: RunTool,
    /// Valgrind's verbosity: 1 by default, 0 with `-q`, +1 per `-v`.
    pub verbosity: i32,
    /// `--log-file=` pattern (unexpanded), if any.
    pub log_file: Option<String>,
    /// `--trace-children=yes|no`.
    pub trace_children: bool,
    /// `--trace-children-skip=` and `--trace-children-skip-by-arg=`: exec'd
    /// programs not followed even with `--trace-children=yes`.
    pub skip: SkipPatterns,
    /// `--time-stamp=yes`: messages carry the time since startup.
    pub time_stamp: bool,
    /// `--stats=yes|no`: the engine's statistics at each process's exit.
    pub stats: bool,
    /// `--instr-at-start=yes|no` (Cachegrind 3.22): whether processes start
    /// instrumented, or wait for `CACHEGRIND_START_INSTRUMENTATION`.
    pub instr_at_start: bool,
    /// `--smc-check=none|stack|all|all-non-file`.
    pub smc_check: engine::SmcCheck,
    /// `--cachegrind-out-file=` pattern (unexpanded).
    pub out_file: String,
    /// `--demangle` and `--show-below-main`.
    pub names: symbols::NameOptions,
    /// `--cache-sim`, `--branch-sim` and the cache geometries.
    pub sim: SimOptions,
    /// The program, as given.
    pub program: OsString,
    /// Its arguments.
    pub args: Vec<OsString>,
}

/// What the command line asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// Run and profile a program.
    Run(Box<RunOptions>),
    /// `--help` / `-h`.
    Help,
    /// `--version`.
    Version,
}

/// A command-line error: the lines to print, each prefixed with
/// `cachescope: ` (Valgrind's `valgrind: `); the exit code is 1.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageError(pub Vec<String>);

impl From<BadOption> for UsageError {
    fn from(b: BadOption) -> Self {
        UsageError(b.lines)
    }
}

pub(super) fn bad_option(arg: &str, detail: &str) -> UsageError {
    UsageError(vec![
        format!("Bad option: {arg}"),
        detail.to_string(),
        USE_HELP.to_string(),
    ])
}

pub(super) fn yes_no(arg: &str, value: &str) -> Result<bool, UsageError> {
    match value {
        "yes" => Ok(true),
        "no" => Ok(false),
        _ => Err(bad_option(
            arg,
            &format!("Invalid boolean value '{value}' (should be 'yes' or 'no')"),
        )),
    }
}

/// Parses the arguments after the command name.
pub fn parse(args: &[OsString]) -> Result<Command, UsageError> {
    let mut opts = RunOptions {
        tool: tool_of(args)?,
        verbosity: 1,
        log_file: None,
        trace_children: false,
        skip: SkipPatterns::default(),
        time_stamp: false,
        stats: false,
        instr_at_start: true,
        smc_check: engine::SmcCheck::default(),
        out_file: DEFAULT_OUT_FILE.to_string(),
        names: symbols::NameOptions::default(),
        sim: SimOptions::new(false),
        program: OsString::new(),
        args: Vec::new(),
    };
    let mut i = 0;
    while i < args.len() {
        let Some(arg) = args[i].to_str() else {
            // A non-UTF-8 argument cannot be one of our options.
            if args[i].as_encoded_bytes().starts_with(b"-") {
                let shown = args[i].to_string_lossy().into_owned();
                return Err(unknown(&shown));
            }
            break;
        };
        if !arg.starts_with('-') {
            break;
        }
        i += 1;
        // Each tool's own options (the tool is known before: `--tool` may
        // come after them).
        match &mut opts.tool {
            RunTool::Cachegrind => {
                if opts.sim.parse_arg(arg)? {
                    continue;
                }
            }
            RunTool::Lackey(l) => {
                if lackey::parse_arg(l, arg)? {
                    continue;
                }
            }
            RunTool::Callgrind(c) => {
                // Callgrind still takes --cache-sim's old name, which many
                // scripts use.
                let sim_arg = match arg.strip_prefix("--simulate-cache=") {
                    Some(v) => format!("--cache-sim={v}"),
                    None => arg.to_string(),
                };
                if opts.sim.parse_arg(&sim_arg)? || c.parse_arg(arg).map_err(UsageError)? {
                    continue;
                }
            }
        }
        let (name, value) = match arg.split_once('=') {
            Some((n, v)) => (n, Some(v)),
            None => (arg, None),
        };
        match (name, value) {
            ("-h" | "--help" | "--help-debug", None) => return Ok(Command::Help),
            ("--version", None) => return Ok(Command::Version),
            ("-q" | "--quiet", None) => opts.verbosity = 0,
            ("-v" | "--verbose", None) => opts.verbosity += 1,
            // Taken by `tool_of`.
            ("--tool", Some(_)) => {}
            ("--log-file", Some(f)) => opts.log_file = Some(f.to_string()),
            ("--trace-children", Some(v)) => opts.trace_children = yes_no(arg, v)?,
            // Valgrind keeps the last of each (a string option).
            ("--trace-children-skip", Some(v)) => opts.skip.by_exe = patterns(v),
            ("--trace-children-skip-by-arg", Some(v)) => opts.skip.by_arg = patterns(v),
            ("--time-stamp", Some(v)) => opts.time_stamp = yes_no(arg, v)?,
            ("--stats", Some(v)) => opts.stats = yes_no(arg, v)?,
            ("--smc-check", Some(v)) => match engine::SmcCheck::from_name(v) {
                Some(mode) => opts.smc_check = mode,
                // Valgrind's words for a value it does not know.
                None => return Err(unknown(arg)),
            },
            ("--cachegrind-out-file", Some(f)) if opts.tool == RunTool::Cachegrind => {
                opts.out_file = f.to_string()
            }
            ("--demangle", Some(v)) => opts.names.demangle = yes_no(arg, v)?,
            ("--show-below-main", Some(v)) => opts.names.rename_below_main = !yes_no(arg, v)?,
            ("--instr-at-start", Some(v)) => opts.instr_at_start = yes_no(arg, v)?,
            // Accepted for wrappers' sake; they change nothing here:
            // Cachegrind reports no errors, scheduling is the kernel's
            // (threads run truly in parallel, with exact counts), and there
            // is no gdbserver to attach to (gungraun passes --vgdb=no).
            ("--error-exitcode", Some(v)) if v.parse::<i32>().is_ok() => {}
            ("--fair-sched", Some("yes" | "no" | "try")) => {}
            ("--vgdb", Some("yes" | "no" | "full")) => {}
            ("--vgdb-error", Some(v)) if v.parse::<u64>().is_ok() => {}
            _ => return Err(unknown(arg)),
        }
    }
    let Some(program) = args.get(i) else {
        return Err(UsageError(vec![
            "no program specified".to_string(),
            "Use --help for more information.".to_string(),
        ]));
    };
    opts.program = program.clone();
    opts.args = args[i + 1..].to_vec();
    Ok(Command::Run(Box::new(opts)))
}

/// The tool named by the last `--tool=` among the options (Valgrind's
/// rule), Cachegrind by default.
fn tool_of(args: &[OsString]) -> Result<RunTool, UsageError> {
    let named = args
        .iter()
        .map_while(|a| a.to_str().filter(|a| a.starts_with('-')))
        .filter_map(|a| a.strip_prefix("--tool="))
        .last();
    match named {
        None | Some("cachegrind") => Ok(RunTool::Cachegrind),
        Some("lackey") => Ok(RunTool::Lackey(::lackey::LackeyOptions::default())),
        Some("callgrind") => Ok(RunTool::Callgrind(Box::default())),
        Some(t) => Err(UsageError(vec![format!(
            "tool '{t}' is not supported: only --tool=cachegrind, --tool=callgrind and --tool=lackey are"
        )])),
    }
}

fn unknown(arg: &str) -> UsageError {
    UsageError(vec![format!("Unknown option: {arg}"), USE_HELP.to_string()])
}

/// The `--help` text, for the command `name` (`cachescope` or `valgrind`).
pub fn usage(name: &str) -> String {
    format!(
        "usage: {name} [options] prog-and-args\n\
         \n\
         \x20 Runs prog under cachescope's instrumentation engine and writes a\n\
         \x20 Cachegrind profile (cachegrind.out format).\n\
         \n\
         \x20 core options (Valgrind's spelling):\n\
         \x20   --tool=cachegrind|callgrind|lackey  the tool (as `valgrind`, the\n\
         \x20                              others are Valgrind's own, run when installed)\n\
         \x20   -h --help                  show this message\n\
         \x20   --version                  show version\n\
         \x20   -q --quiet                 run silently; only print error msgs\n\
         \x20   -v --verbose               be more verbose\n\
         \x20   --trace-children=no|yes    profile exec'd programs too? [no]\n\
         \x20   --trace-children-skip=patt1,patt2,...  but not the programs\n\
         \x20                              whose name matches one of these globs\n\
         \x20   --trace-children-skip-by-arg=patt1,patt2,...  nor those with an\n\
         \x20                              argument matching one of these\n\
         \x20   --time-stamp=no|yes        add timestamps to log messages? [no]\n\
         \x20   --log-file=<file>          log messages to <file> (%p, %q{{VAR}}, %n, %%)\n\
         \x20   --smc-check=none|stack|all|all-non-file [all-non-file]\n\
         \x20                              checks for self-modifying code: none, only for\n\
         \x20                              code found in stacks, for all code, or for all\n\
         \x20                              code except that from file-backed mappings\n\
         \x20   --demangle=no|yes          demangle C++ and Rust names? [yes]\n\
         \x20   --show-below-main=no|yes   keep the names of main's callers? [no]\n\
         \x20   --error-exitcode=<n>, --fair-sched=no|yes|try\n\
         \x20                              accepted (no errors to report; threads\n\
         \x20                              run in parallel, counted exactly)\n\
         \n\
         \x20 cachegrind options:\n\
         \x20   --cache-sim=no|yes         collect cache stats? [no]\n\
         \x20   --branch-sim=no|yes        collect branch prediction stats? [no]\n\
         \x20   --cachegrind-out-file=<file>  output file name [{DEFAULT_OUT_FILE}]\n\
         \x20   --instr-at-start=yes|no    instrument at start? [yes] (see\n\
         \x20                              CACHEGRIND_START_INSTRUMENTATION)\n\
         \n\
         \n\
         \x20 lackey options (--tool=lackey):\n\
         \x20   --trace-mem=no|yes         trace all instruction and data\n\
         \x20                              references [no]\n\
         \x20   --basic-counts=no|yes      count instructions, conditional\n\
         \x20                              branches, calls [yes]\n\
         \x20   --fnname=<name>            count calls to <name> [main]\n\
         \n\
         \x20 callgrind options (--tool=callgrind):\n\
         \x20   --callgrind-out-file=<f>   output file name [callgrind.out.%p]\n\
         \x20   --dump-instr=no|yes        dump instruction address of costs? [no]\n\
         \x20   --dump-line=no|yes         dump source lines of costs? [yes]\n\
         \x20   --compress-strings=no|yes  compress strings in profile dump? [yes]\n\
         \x20   --compress-pos=no|yes      compress positions in profile dump? [yes]\n\
         \x20   --separate-recs=<n>        separate function recursions up to level [2]\n\
         \x20   --separate-recs<n>=<f>     separate <n> recursions for function <f>\n\
         \x20   --skip-direct-rec=no|yes   ignore direct recursions? [no]\n\
         \x20   --separate-callers=<n>     separate functions by call chain length [0]\n\
         \x20   --separate-callers<n>=<f>  separate <n> callers for function <f>\n\
         \x20   --skip-plt=no|yes          ignore calls to/from PLT sections? [yes]\n\
         \x20   --fn-skip=<function>       ignore calls to/from function (glob)\n\
         \x20   --obj-skip=<object>        ignore calls to/from the object (its path)\n\
         \x20   --separate-threads=no|yes  separate data per thread [no]\n\
         \x20   --cache-sim=no|yes         do cache simulation [no]\n\
         \x20   --branch-sim=no|yes        do branch prediction simulation [no]\n\
         \x20   --dump-before=<func>       dump when entering function\n\
         \x20   --zero-before=<func>       zero all costs when entering function\n\
         \x20   --dump-after=<func>        dump when leaving function\n\
         \x20   --combine-dumps=no|yes     concatenate dumps into one file [no]\n\
         \x20   --instr-atstart=no|yes     do instrumentation at callgrind start [yes]\n\
         \x20   --collect-atstart=no|yes   collect at process/thread start [yes]\n\
         \x20   --collect-jumps=no|yes     collect jumps? [no]\n\
         \x20   --toggle-collect=<func>    toggle collection on enter/leave function\n\
         \x20   --export=<kind>:<file>     also write an export of the calling contexts:\n\
         \x20                              folded, svg, speedscope, firefox, stacktree\n\
         \x20   --export-inline=no|yes     inline frames from DWARF in exports [no]\n\
         \x20   --client-contexts=auto|no|yes|tagged  where calling contexts are kept:\n\
         \x20                              in the client (tagged counting, or the tree\n\
         \x20                              with yes) or by the tool (no) [auto: tagged\n\
         \x20                              unless an export needs the tree]\n\
         \n\
         \x20 Other modes: cachescope replay|annotate|merge|diff|export ...\n"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os(v: &[&str]) -> Vec<OsString> {
        v.iter().map(OsString::from).collect()
    }

    fn run(v: &[&str]) -> RunOptions {
        match parse(&os(v)) {
            Ok(Command::Run(r)) => *r,
            other => panic!("{other:?}"),
        }
    }

    fn err(v: &[&str]) -> Vec<String> {
        match parse(&os(v)) {
            Err(UsageError(lines)) => lines,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn options_stop_at_the_program() {
        let r = run(&["-q", "--tool=cachegrind", "ls", "-la", "--foo"]);
        assert_eq!(r.verbosity, 0);
        assert_eq!(r.program, OsString::from("ls"));
        assert_eq!(r.args, os(&["-la", "--foo"]));
        assert_eq!(r.out_file, DEFAULT_OUT_FILE);
        assert!(!r.trace_children);
        assert!(run(&["--trace-children=yes", "ls"]).trace_children);
        let r = run(&[
            "--trace-children-skip=*a,*b",
            "--trace-children-skip-by-arg=x",
            "--time-stamp=yes",
            "ls",
        ]);
        assert_eq!(r.skip.by_exe, ["*a", "*b"]);
        assert_eq!(r.skip.by_arg, ["x"]);
        assert!(r.time_stamp && !run(&["ls"]).time_stamp);
        assert!(!r.stats);
        assert!(run(&["--stats=yes", "ls"]).stats);
    }

    #[test]
    fn smc_check_takes_valgrinds_values() {
        assert_eq!(run(&["ls"]).smc_check, engine::SmcCheck::AllNonFile);
        for (v, mode) in [
            ("none", engine::SmcCheck::None),
            ("stack", engine::SmcCheck::Stack),
            ("all", engine::SmcCheck::All),
            ("all-non-file", engine::SmcCheck::AllNonFile),
        ] {
            assert_eq!(run(&[&format!("--smc-check={v}"), "ls"]).smc_check, mode);
        }
        // Valgrind 3.19's words.
        assert_eq!(
            err(&["--smc-check=foo", "ls"]),
            vec!["Unknown option: --smc-check=foo", USE_HELP]
        );
        assert_eq!(
            err(&["--smc-check", "ls"]),
            vec!["Unknown option: --smc-check", USE_HELP]
        );
    }

    #[test]
    fn wrapper_options_are_accepted() {
        let r = run(&[
            "--tool=cachegrind",
            "--cache-sim=no",
            "--branch-sim=no",
            "--cachegrind-out-file=cgout",
            "--trace-children=no",
            "--log-file=log.%p",
            "--error-exitcode=0",
            "--fair-sched=try",
            "--vgdb=no",
            "-v",
            "-v",
            "./prog",
        ]);
        assert_eq!(r.out_file, "cgout");
        assert_eq!(r.log_file.as_deref(), Some("log.%p"));
        assert_eq!(r.verbosity, 3);
        assert_eq!(r.names, symbols::NameOptions::default());
        let r = run(&["--demangle=no", "--show-below-main=yes", "x"]);
        assert!(!r.names.demangle && !r.names.rename_below_main);
    }

    #[test]
    fn errors_read_like_valgrind() {
        assert_eq!(
            err(&["--foo", "ls"]),
            vec!["Unknown option: --foo", USE_HELP]
        );
        assert_eq!(
            err(&[]),
            vec!["no program specified", "Use --help for more information."]
        );
        assert_eq!(
            err(&["--cache-sim=maybe", "ls"]),
            vec![
                "Bad option: --cache-sim=maybe",
                "Invalid boolean value 'maybe' (should be 'yes' or 'no')",
                USE_HELP
            ]
        );
        assert_eq!(err(&["--tool=memcheck", "ls"]).len(), 1);
    }

    #[test]
    fn the_help_lists_every_callgrind_option() {
        let text = usage("cachescope");
        let mut cg = CallgrindOptions::default();
        for a in [
            "--callgrind-out-file=f",
            "--dump-instr=yes",
            "--dump-line=yes",
            "--compress-strings=yes",
            "--compress-pos=yes",
            "--separate-recs=2",
            "--separate-callers=2",
            "--skip-direct-rec=yes",
            "--skip-plt=yes",
            "--fn-skip=f",
            "--obj-skip=o",
            "--separate-threads=yes",
            "--dump-before=f",
            "--zero-before=f",
            "--dump-after=f",
            "--combine-dumps=yes",
            "--instr-atstart=yes",
            "--collect-atstart=yes",
            "--toggle-collect=f",
            "--export=folded:f",
            "--export-inline=yes",
        ] {
            assert_eq!(cg.parse_arg(a), Ok(true), "{a}");
            let name = a.split('=').next().unwrap();
            assert!(
                text.contains(&format!("   {name}=")),
                "{name} not in --help"
            );
        }
        for name in ["--cache-sim", "--branch-sim"] {
            assert!(text.matches(&format!("   {name}=")).count() >= 2, "{name}");
        }
        // The per-function forms, by their placeholder.
        for a in ["--separate-callers2=f", "--separate-recs3=f"] {
            assert_eq!(cg.parse_arg(a), Ok(true), "{a}");
            let name = a.trim_end_matches("=f").trim_end_matches(char::is_numeric);
            assert!(text.contains(&format!("   {name}<n>=<f>")), "{name}");
        }
    }

    #[test]
    fn callgrind_is_a_tool_with_its_options() {
        let r = run(&["--dump-instr=yes", "--tool=callgrind", "ls"]);
        let RunTool::Callgrind(c) = r.tool else {
            panic!("callgrind expected")
        };
        assert!(c.output.dump_instr);
        assert_eq!(run(&["ls"]).tool, RunTool::Cachegrind);
        assert!(
            run(&["--tool=callgrind", "--simulate-cache=yes", "ls"])
                .sim
                .cache_sim
        );
        assert_eq!(
            err(&["--dump-instr=yes", "ls"]),
            vec!["Unknown option: --dump-instr=yes", USE_HELP]
        );
    }

    #[test]
    fn simulations_and_instrumentation_at_start_are_taken() {
        let r = run(&["--cache-sim=yes", "--branch-sim=yes", "ls"]);
        assert!(r.sim.cache_sim && r.sim.branch_sim);
        assert!(!run(&["ls"]).sim.cache_sim);
        assert!(!run(&["--instr-at-start=no", "ls"]).instr_at_start);
        assert!(run(&["ls"]).instr_at_start);
    }

    #[test]
    fn cache_geometry_errors_come_from_simopts() {
        let e = err(&["--D1=1000,2,64", "ls"]);
        assert_eq!(e[0], "Cache set count is not a power of two.");
        assert_eq!(e[1], "Bad option: --D1=1000,2,64");
    }

    #[test]
    fn lackey_and_its_options() {
        // The tool may come after its options; the last --tool wins.
        let r = run(&[
            "--trace-mem=yes",
            "--tool=memcheck",
            "--tool=lackey",
            "-q",
            "x",
        ]);
        let RunTool::Lackey(l) = &r.tool else {
            panic!("{:?}", r.tool)
        };
        assert!(l.trace_mem && l.basic_counts);
        assert_eq!(l.fnname, "main");
        assert_eq!(run(&["x"]).tool, RunTool::Cachegrind);
        // Each tool's options are its own.
        assert_eq!(
            err(&["--trace-mem=yes", "x"])[0],
            "Unknown option: --trace-mem=yes"
        );
        for o in [
            "--cache-sim=yes",
            "--I1=32768,8,64",
            "--cachegrind-out-file=f",
        ] {
            assert_eq!(
                err(&["--tool=lackey", o, "x"])[0],
                format!("Unknown option: {o}")
            );
        }
        assert!(err(&["--tool=lackey", "--detailed-counts=yes", "x"])[1].contains("VEX"));
    }

    #[test]
    fn help_and_version() {
        assert_eq!(parse(&os(&["--help"])), Ok(Command::Help));
        assert_eq!(parse(&os(&["-q", "--version", "ls"])), Ok(Command::Version));
    }
}
