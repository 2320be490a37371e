//! Valgrind's command line for the run mode: `[options] prog [args]`.
//!
//! Options are the arguments before the first one that does not start with
//! `-`; that one is the program and the rest are its arguments. The
//! spellings are Valgrind's, so wrappers that drive `valgrind
//! --tool=cachegrind` can drive us unchanged.

use std::ffi::OsString;

use super::skip::{patterns, SkipPatterns};
use crate::simopts::{BadOption, SimOptions, USE_HELP};

/// The default `--cachegrind-out-file` pattern.
pub const DEFAULT_OUT_FILE: &str = "cachegrind.out.%p";

/// Everything the run mode needs from the command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunOptions {
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

fn bad_option(arg: &str, detail: &str) -> UsageError {
    UsageError(vec![
        format!("Bad option: {arg}"),
        detail.to_string(),
        USE_HELP.to_string(),
    ])
}

fn yes_no(arg: &str, value: &str) -> Result<bool, UsageError> {
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
        verbosity: 1,
        log_file: None,
        trace_children: false,
        skip: SkipPatterns::default(),
        time_stamp: false,
        stats: false,
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
        if opts.sim.parse_arg(arg)? {
            continue;
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
            ("--tool", Some(t)) => {
                if t != "cachegrind" {
                    return Err(UsageError(vec![format!(
                        "tool '{t}' is not supported: only --tool=cachegrind is"
                    )]));
                }
            }
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
            ("--cachegrind-out-file", Some(f)) => opts.out_file = f.to_string(),
            ("--demangle", Some(v)) => opts.names.demangle = yes_no(arg, v)?,
            ("--show-below-main", Some(v)) => opts.names.rename_below_main = !yes_no(arg, v)?,
            ("--instr-at-start", Some(v)) => {
                if !yes_no(arg, v)? {
                    return Err(UsageError(vec![format!(
                        "{arg} is not supported yet (instrumentation is always on)"
                    )]));
                }
            }
            // Accepted for wrappers' sake; they change nothing here:
            // Cachegrind reports no errors, and scheduling is the kernel's
            // (threads run truly in parallel, with exact counts).
            ("--error-exitcode", Some(v)) if v.parse::<i32>().is_ok() => {}
            ("--fair-sched", Some("yes" | "no" | "try")) => {}
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
         \x20   --tool=cachegrind          the tool (as `valgrind`, the others are\n\
         \x20                              Valgrind's own, run when installed)\n\
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
         \n\
         \x20 Other modes: cachescope replay|annotate|merge|diff ...\n"
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
    fn simulations_are_taken_and_unsupported_modes_refused_clearly() {
        let r = run(&["--cache-sim=yes", "--branch-sim=yes", "ls"]);
        assert!(r.sim.cache_sim && r.sim.branch_sim);
        assert!(!run(&["ls"]).sim.cache_sim);
        assert!(err(&["--instr-at-start=no", "ls"])[0].contains("not supported"));
    }

    #[test]
    fn cache_geometry_errors_come_from_simopts() {
        let e = err(&["--D1=1000,2,64", "ls"]);
        assert_eq!(e[0], "Cache set count is not a power of two.");
        assert_eq!(e[1], "Bad option: --D1=1000,2,64");
    }

    #[test]
    fn help_and_version() {
        assert_eq!(parse(&os(&["--help"])), Ok(Command::Help));
        assert_eq!(parse(&os(&["-q", "--version", "ls"])), Ok(Command::Version));
    }
}
