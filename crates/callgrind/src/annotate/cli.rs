//! The command line of `callgrind_annotate`, parsed as Valgrind 3.19's
//! script parses it (`--opt=value` only; `-I=DIR`, not `-I DIR`), and the
//! program around [`super::annotate`]: errors are one line on stderr with a
//! non-zero status, as the script dies (255, or 2 for a file that cannot be
//! opened).

use std::io::Write;

use super::{annotate, perl_number, AnnotateOptions};
use crate::model::Profile;

/// The outcome of a command line: what to print and the exit status.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Outcome {
    /// Standard output.
    pub stdout: String,
    /// Standard error.
    pub stderr: String,
    /// The exit status.
    pub status: u8,
}

const USAGE: &str = "\
usage: callgrind_annotate [options] [callgrind-out-file [source-files...]]
  options (defaults in brackets):
    -h, --help             this message
    --version              the version
    --show=A,B,C           the events shown [all]
    --sort=A,B,C           the sort events [the file's order]; each may be
                           EVENT:N, a threshold percentage for that event
    --threshold=N          list functions until they cover N% of the
                           primary sort event (0 to 100) [99]
    --show-percs=yes|no    percentages beside counts [yes]
    --auto=yes|no          annotate the source files of the listed
                           functions [yes]
    --context=N            lines of context around annotated lines [8]
    --inclusive=yes|no     inclusive costs for functions [no]
    --tree=none|caller|calling|both
                           callers and/or callees of each function [none]
    -I=DIR, --include=DIR  also look for source files in DIR
";

/// A failed run: the message (one line) and the status.
fn fail(message: String, status: u8) -> Outcome {
    Outcome {
        stderr: format!("callgrind_annotate: {message}\n"),
        status,
        ..Outcome::default()
    }
}

fn usage_error(message: String) -> Outcome {
    let mut outcome = fail(message, 255);
    outcome.stderr.push_str(USAGE);
    outcome
}

/// Perl's `split /,/`: trailing empty fields dropped.
fn split_commas(s: &str) -> Vec<String> {
    let mut v: Vec<String> = s.split(',').map(str::to_string).collect();
    while v.last().is_some_and(String::is_empty) {
        v.pop();
    }
    v
}

/// Digits and dots, as the script's `[\d\.]+`.
fn is_decimal(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit() || b == b'.')
}

fn yes_no(value: &str) -> Option<bool> {
    match value {
        "yes" => Some(true),
        "no" => Some(false),
        _ => None,
    }
}

/// Parses the arguments (without the program name).
pub fn parse_args(args: &[String]) -> Result<AnnotateOptions, Outcome> {
    let mut opts = AnnotateOptions::default();
    let mut input = None;
    let bad = |arg: &str| usage_error(format!("bad option `{arg}`"));
    for arg in args {
        if !arg.starts_with('-') {
            if input.is_none() {
                input = Some(arg.clone());
                continue;
            }
            let dirs: Vec<String> = std::iter::once(String::new())
                .chain(opts.include_dirs.iter().cloned())
                .collect();
            let readable = dirs
                .iter()
                .any(|d| std::fs::File::open(format!("{d}{arg}")).is_ok());
            if !readable {
                return Err(fail(
                    format!("File {arg} not found in any of: {}", dirs.join(" ")),
                    2,
                ));
            }
            opts.user_files.push(arg.clone());
            continue;
        }
        if arg == "--version" {
            return Err(Outcome {
                stderr: format!("callgrind_annotate-{}\n", env!("CARGO_PKG_VERSION")),
                status: 255,
                ..Outcome::default()
            });
        }
        let (key, value) = arg.split_once('=').unwrap_or((arg, ""));
        let has_value = arg.contains('=');
        match key {
            "--show" if has_value => opts.show = split_commas(value),
            "--sort" if has_value => {
                let mut thresholds = Vec::new();
                let mut given = false;
                opts.sort = Vec::new();
                for event in split_commas(value) {
                    // EVENT:N or EVENT:N%: a threshold for this event.
                    let after = event.rsplit_once(':').map(|(_, t)| t);
                    let number = after.map(|t| t.strip_suffix('%').unwrap_or(t));
                    match number.filter(|t| is_decimal(t)) {
                        Some(t) => {
                            if !(0.0..=100.0).contains(&perl_number(t)) {
                                return Err(bad(arg));
                            }
                            thresholds.push(t.to_string());
                            given = true;
                            let name = event.split(':').next().unwrap_or("");
                            opts.sort.push(name.to_string());
                        }
                        None => {
                            thresholds.push("0".to_string());
                            opts.sort.push(event);
                        }
                    }
                }
                opts.sort_thresholds = if given { thresholds } else { Vec::new() };
            }
            "--threshold" if has_value => {
                let t = value.strip_suffix('%').unwrap_or(value);
                if !is_decimal(t) || !(0.0..=100.0).contains(&perl_number(t)) {
                    return Err(bad(arg));
                }
                opts.threshold = t.to_string();
            }
            "--show-percs" => opts.show_percs = yes_no(value).ok_or_else(|| bad(arg))?,
            "--auto" => opts.auto = yes_no(value).ok_or_else(|| bad(arg))?,
            "--inclusive" => opts.inclusive = yes_no(value).ok_or_else(|| bad(arg))?,
            "--context" if is_decimal(value) => opts.context = value.to_string(),
            "--tree" => match value {
                "none" => {}
                "caller" => opts.tree_caller = true,
                "calling" => opts.tree_calling = true,
                "both" => {
                    opts.tree_caller = true;
                    opts.tree_calling = true;
                }
                _ => return Err(bad(arg)),
            },
            "-I" | "--include" if has_value => {
                let dir = value.strip_suffix('/').unwrap_or(value);
                opts.include_dirs.push(format!("{dir}/"));
            }
            "-h" | "--help" => return Err(usage_error("usage".to_string())),
            _ => return Err(bad(arg)),
        }
    }
    match input {
        Some(i) => opts.input = i,
        None => opts.input = String::new(),
    }
    Ok(opts)
}

/// The newest-named profile in the current directory when none is given:
/// the first `callgrind.out*` in name order, else the first
/// `cachegrind.out*`.
fn default_input() -> Option<String> {
    let mut names: Vec<String> = std::fs::read_dir(".")
        .ok()?
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .collect();
    names.sort();
    ["callgrind.out", "cachegrind.out"]
        .iter()
        .find_map(|prefix| names.iter().find(|n| n.starts_with(prefix)).cloned())
}

/// Runs `callgrind_annotate` with `args` (without the program name).
pub fn run(args: &[String]) -> Outcome {
    let mut opts = match parse_args(args) {
        Ok(o) => o,
        Err(outcome) => return outcome,
    };
    let mut stdout = String::new();
    if opts.input.is_empty() {
        match default_input() {
            Some(found) => {
                stdout.push_str(&format!("Reading data from '{found}'...\n"));
                opts.input = found;
            }
            None => return usage_error("no callgrind.out* file here".to_string()),
        }
    }
    let data = match std::fs::read(&opts.input) {
        Ok(d) => d,
        Err(_) => return fail(format!("File {} not opened", opts.input), 2),
    };
    let profile = match crate::reader::parse(&data) {
        Ok(p) => p,
        Err(e) => return fail(format!("{}: {e}", opts.input), 255),
    };
    report(&profile, &opts, stdout)
}

fn report(profile: &Profile, opts: &AnnotateOptions, mut stdout: String) -> Outcome {
    match annotate(profile, opts) {
        Ok(text) => {
            stdout.push_str(&text);
            Outcome {
                stdout,
                ..Outcome::default()
            }
        }
        Err(e) => {
            let mut outcome = fail(e.0, 255);
            outcome.stdout = stdout;
            outcome
        }
    }
}

/// Runs `callgrind_annotate`, printing to the process's stdout and stderr;
/// returns the exit status.
pub fn main(args: &[String]) -> u8 {
    let outcome = run(args);
    let mut out = std::io::stdout().lock();
    // A reader that went away (`| head`) is not worth a message.
    let _ = out.write_all(outcome.stdout.as_bytes());
    let _ = out.flush();
    eprint!("{}", outcome.stderr);
    outcome.status
}
