//! The `cg_annotate`, `cg_merge` and `cg_diff` front ends: Valgrind's
//! command lines (parsed as Python's argparse parses them), the tools in
//! the `profile` crate, and the tools' error conventions.
//!
//! Under any name (`cachescope annotate` or a `cg_annotate` link), messages
//! use the tool's name, as scripts expect: `cg_annotate: error: …` with
//! status 1 for errors found by the tool, usage + error with status 2 for
//! command-line errors.

mod argparse;
mod textwrap;

use std::ffi::{OsStr, OsString};
use std::io::{self, Write};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::process::ExitCode;

use argparse::{Arg, Exit, Kind, Nargs, Parser};
use profile::annotate::{annotate, AnnotateOptions};
use profile::pytext;
use profile::subst::Subst;
use profile::tool::{os_error_message, ToolError};

/// The version the tools report (`cg_annotate --version` prints
/// `cg_annotate-<version>`).
const VERSION: &str = env!("CARGO_PKG_VERSION");

fn version_of(prog: &str) -> String {
    format!("{prog}-{VERSION}")
}

/// Prints an argparse exit and returns its status.
fn finish(exit: Exit) -> ExitCode {
    print!("{}", exit.stdout);
    let _ = io::stdout().flush();
    eprint!("{}", exit.stderr);
    ExitCode::from(exit.code)
}

/// Reports a tool's result: `<prog>: error: <msg>` and status 1 on error.
fn report(prog: &str, result: Result<(), ToolError>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(ToolError::Fatal(msg)) => {
            let _ = io::stdout().flush();
            eprintln!("{prog}: error: {msg}");
            ExitCode::from(1)
        }
        // A reader that went away (`| head`) is not worth a message.
        Err(ToolError::Output(e)) if e.kind() == io::ErrorKind::BrokenPipe => ExitCode::from(1),
        Err(ToolError::Output(e)) => {
            eprintln!("{prog}: error: {e}");
            ExitCode::from(1)
        }
    }
}

/// argparse's "invalid <type> value: '<text>'".
fn invalid(kind: &str, value: &OsStr) -> String {
    format!(
        "invalid {kind} value: {}",
        pytext::repr_str(value.as_bytes())
    )
}

/// `search_and_replace`, the type of `--mod-filename` / `--mod-funcname`.
fn parse_subst(value: &OsStr) -> Result<Subst, String> {
    value
        .to_str()
        .and_then(|v| Subst::parse(v).ok())
        .ok_or_else(|| invalid("search_and_replace", value))
}

fn mod_args() -> [Arg; 2] {
    [
        Arg::option(
            &["--mod-filename"],
            "mod_filename",
            Nargs::One,
            "a search-and-replace regex applied to filenames, e.g. `s/prog[0-9]/progN/`",
        )
        .metavar("REGEX"),
        Arg::option(
            &["--mod-funcname"],
            "mod_funcname",
            Nargs::One,
            "like --mod-filename, but for function names",
        )
        .metavar("REGEX"),
    ]
}

fn common_args() -> [Arg; 2] {
    [
        Arg::option(
            &["-h", "--help"],
            "help",
            Nargs::Zero,
            "show this help message and exit",
        )
        .kind(Kind::Help),
        Arg::option(
            &["--version"],
            "version",
            Nargs::Zero,
            "show program's version number and exit",
        )
        .kind(Kind::Version),
    ]
}

fn annotate_parser() -> Parser {
    let mut args = common_args().to_vec();
    args.push(Arg::option(
        &["--diff"],
        "diff",
        Nargs::Zero,
        "perform a diff between two Cachegrind output files",
    ));
    args.extend(mod_args());
    args.extend([
        Arg::option(
            &["--show"],
            "show",
            Nargs::One,
            "only show figures for events A,B,C (default: all events)",
        )
        .metavar("A,B,C"),
        Arg::option(
            &["--sort"],
            "sort",
            Nargs::One,
            "sort functions by events A,B,C (default: event column order)",
        )
        .metavar("A,B,C"),
        Arg::option(
            &["--threshold"],
            "threshold",
            Nargs::One,
            "only show file:function/function:file pairs with more than N% of primary sort event \
             counts (default: 0.1)",
        )
        .metavar("N:[0,20]"),
        Arg::option(
            &["--show-percs", "--no-show-percs"],
            "show_percs",
            Nargs::Zero,
            "show a percentage for each non-zero count",
        )
        .kind(Kind::BoolOptional),
        Arg::option(
            &["--show-percs=yes"],
            "show_percs",
            Nargs::Zero,
            "(deprecated) same as --show-percs",
        ),
        Arg::option(
            &["--show-percs=no"],
            "show_percs",
            Nargs::Zero,
            "(deprecated) same as --no-show-percs",
        ),
        Arg::option(
            &["--annotate", "--no-annotate"],
            "annotate",
            Nargs::Zero,
            "annotate all source files containing functions that reached the event count threshold",
        )
        .kind(Kind::BoolOptional),
        Arg::option(
            &["--auto=yes"],
            "annotate",
            Nargs::Zero,
            "(deprecated) same as --annotate",
        ),
        Arg::option(
            &["--auto=no"],
            "annotate",
            Nargs::Zero,
            "(deprecated) same as --no-annotate",
        ),
        Arg::option(
            &["--context"],
            "context",
            Nargs::One,
            "print N lines of context before and after annotated lines (default: 8)",
        )
        .metavar("N"),
        // Not in the current cg_annotate (the Perl one had it): kept out of
        // the usage line so that usage messages stay identical.
        Arg::option(
            &["-I", "--include"],
            "include",
            Nargs::One,
            "look for source files with relative paths in DIR too (may be repeated)",
        )
        .metavar("DIR")
        .hidden_from_usage(),
        Arg::positional(
            "cgout_filename",
            Nargs::OneOrMore,
            "cachegrind-out-file",
            "file produced by Cachegrind",
        ),
    ]);
    Parser {
        prog: "cg_annotate",
        description: "Process one or more Cachegrind output files.",
        version: version_of("cg_annotate"),
        args,
        columns: argparse::terminal_columns(),
    }
}

/// The command line as Python's `sys.argv`, joined by spaces.
fn invocation() -> Vec<u8> {
    let mut out = Vec::new();
    for (i, a) in std::env::args_os().enumerate() {
        if i > 0 {
            out.push(b' ');
        }
        out.extend_from_slice(a.as_bytes());
    }
    out
}

/// `cg_annotate` / `cachescope annotate`.
pub fn annotate_main(args: &[OsString]) -> ExitCode {
    let parser = annotate_parser();
    let mut opts = AnnotateOptions {
        invocation: invocation(),
        ..AnnotateOptions::default()
    };
    let parsed = parser.parse(args, &mut |(arg, option_string, values)| {
        let value = values.first().map(OsString::as_os_str).unwrap_or_default();
        let text = || value.to_string_lossy().into_owned();
        match arg.dest {
            "diff" => opts.diff = true,
            "mod_filename" => opts.mod_filename = Some(parse_subst(value)?),
            "mod_funcname" => opts.mod_funcname = Some(parse_subst(value)?),
            "show" => opts.show = Some(text().split(',').map(str::to_string).collect()),
            "sort" => opts.sort = Some(text().split(',').map(str::to_string).collect()),
            "threshold" => {
                opts.threshold = value
                    .to_str()
                    .and_then(pytext::parse_float)
                    .filter(|f| (0.0..=20.0).contains(f))
                    .ok_or_else(|| invalid("threshold", value))?;
            }
            "show_percs" => {
                opts.show_percs = matches!(option_string, "--show-percs" | "--show-percs=yes")
            }
            "annotate" => opts.annotate = matches!(option_string, "--annotate" | "--auto=yes"),
            "context" => {
                opts.context = pytext::parse_int(pytext::trim(value.as_bytes()))
                    .ok_or_else(|| invalid("int", value))?;
            }
            "include" => opts.include_dirs.push(PathBuf::from(value)),
            "cgout_filename" => opts.files = values,
            _ => {}
        }
        Ok(())
    });
    if let Err(exit) = parsed {
        return finish(exit);
    }
    if opts.diff && opts.files.len() != 2 {
        eprint!("{}", parser.format_usage());
        eprintln!(
            "cg_annotate: error: argument --diff: requires exactly two Cachegrind output files"
        );
        return ExitCode::from(1);
    }
    let stdout = io::stdout();
    let mut lock = stdout.lock();
    report("cg_annotate", annotate(&opts, &mut lock))
}

/// `callgrind_annotate` / `cachescope callgrind_annotate`: Valgrind 3.19's
/// Perl script, whose command line and errors follow its own conventions
/// (see the `callgrind` crate).
pub fn callgrind_annotate_main(args: &[OsString]) -> ExitCode {
    let args: Vec<String> = args
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    ExitCode::from(callgrind::annotate::cli::main(&args))
}

/// `cg_merge` / `cachescope merge`.
pub fn merge_main(args: &[OsString]) -> ExitCode {
    let mut parser_args = common_args().to_vec();
    parser_args.push(
        Arg::option(
            &["-o"],
            "output",
            Nargs::One,
            "output file (default: stdout)",
        )
        .metavar("FILE"),
    );
    parser_args.push(Arg::positional(
        "cgout_filename",
        Nargs::OneOrMore,
        "cachegrind-out-file",
        "file produced by Cachegrind",
    ));
    let parser = Parser {
        prog: "cg_merge",
        description:
            "Merge multiple Cachegrind output files. Deprecated; use `cg_annotate` with multiple \
                      Cachegrind output files instead.",
        version: version_of("cg_merge"),
        args: parser_args,
        columns: argparse::terminal_columns(),
    };
    let mut output: Option<OsString> = None;
    let mut files = Vec::new();
    let parsed = parser.parse(args, &mut |(arg, _, values)| {
        match arg.dest {
            "output" => output = values.into_iter().next(),
            "cgout_filename" => files = values,
            _ => {}
        }
        Ok(())
    });
    if let Err(exit) = parsed {
        return finish(exit);
    }
    // `-o ''` is no output file, as `if args.output:` has it.
    let result = match output.filter(|o| !o.is_empty()) {
        None => {
            let stdout = io::stdout();
            let mut lock = stdout.lock();
            profile::merge::merge(&files, &mut lock)
        }
        Some(path) => {
            let mut data = Vec::new();
            profile::merge::merge(&files, &mut data).and_then(|()| {
                profile::output::write_file_replacing(path.as_ref(), 0o666, |w| w.write_all(&data))
                    .map_err(|e| ToolError::Fatal(os_error_message(&e, &path)))
            })
        }
    };
    report("cg_merge", result)
}

/// `cg_diff` / `cachescope diff`.
pub fn diff_main(args: &[OsString]) -> ExitCode {
    let mut parser_args = common_args().to_vec();
    parser_args.extend(mod_args());
    parser_args.push(Arg::positional(
        "cgout_filename1",
        Nargs::ListOfOne,
        "cachegrind-out-file1",
        "file produced by Cachegrind",
    ));
    parser_args.push(Arg::positional(
        "cgout_filename2",
        Nargs::ListOfOne,
        "cachegrind-out-file2",
        "file produced by Cachegrind",
    ));
    let parser = Parser {
        prog: "cg_diff",
        description:
            "Diff two Cachegrind output files. Deprecated; use `cg_annotate --diff` instead.",
        version: version_of("cg_diff"),
        args: parser_args,
        columns: argparse::terminal_columns(),
    };
    let (mut mod_filename, mut mod_funcname) = (None, None);
    let (mut file1, mut file2) = (OsString::new(), OsString::new());
    let parsed = parser.parse(args, &mut |(arg, _, values)| {
        let value = values.first().cloned().unwrap_or_default();
        match arg.dest {
            "mod_filename" => mod_filename = Some(parse_subst(&value)?),
            "mod_funcname" => mod_funcname = Some(parse_subst(&value)?),
            "cgout_filename1" => file1 = value,
            "cgout_filename2" => file2 = value,
            _ => {}
        }
        Ok(())
    });
    if let Err(exit) = parsed {
        return finish(exit);
    }
    let stdout = io::stdout();
    let mut lock = stdout.lock();
    report(
        "cg_diff",
        profile::diff::diff(
            &file1,
            &file2,
            mod_filename.as_ref(),
            mod_funcname.as_ref(),
            &mut lock,
        ),
    )
}
