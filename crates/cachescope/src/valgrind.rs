//! The `valgrind` personality: invoked as `valgrind` (a symlink or a copy
//! named so, first on `PATH`), cachescope is a drop-in for the tools that
//! drive Cachegrind (gungraun/iai-callgrind, rustc-perf, CodSpeed find it
//! as `valgrind`).
//!
//! * `--tool=cachegrind`, `--tool=callgrind` and `--tool=lackey` are the
//!   run mode itself (same parser, same options; error lines start
//!   `valgrind: ` as Valgrind's do).
//! * Any other tool, including Valgrind's default (memcheck, when no
//!   `--tool` is given), is handed to the real Valgrind: the first other
//!   `valgrind` on `PATH`, found by skipping this binary however it is
//!   named (canonical path, or identical contents for a copy), is exec'd
//!   with the same arguments. Without one, the tool is refused in one line.
//! * `--version` prints [`VALGRIND_VERSION`] in Valgrind's format.

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use crate::run;

/// What `valgrind --version` prints after `valgrind-`: the release whose
/// Cachegrind this one behaves as. 3.21 made `--cache-sim=no` the default
/// (`events: Ir`, no `desc:` lines), as here; 3.22 added the Cachegrind
/// client requests and `--instr-at-start`, which wrappers (gungraun) look
/// for by version, and which are supported.
pub const VALGRIND_VERSION: &str = "3.22.0";

/// The tools cachescope runs itself.
const OUR_TOOLS: &[&str] = &["cachegrind", "callgrind", "lackey"];

/// Valgrind's default tool.
const DEFAULT_TOOL: &str = "memcheck";

/// Entry point when invoked as `valgrind` (arguments after argv[0]).
pub fn main(args: &[OsString]) -> ExitCode {
    let opts = core_options(args);
    if opts.version {
        println!("valgrind-{VALGRIND_VERSION}");
        return ExitCode::SUCCESS;
    }
    let tool = opts.tool.unwrap_or(DEFAULT_TOOL);
    if OUR_TOOLS.contains(&tool) {
        return run::main_as(args, "valgrind");
    }
    match real_valgrind() {
        Some(path) => hand_off(&path, args),
        // Our help, rather than nothing, for a bare `valgrind --help`.
        None if opts.help => run::main_as(args, "valgrind"),
        None => {
            eprintln!(
                "valgrind: tool '{tool}' is not provided by cachescope (only cachegrind, callgrind and lackey are), \
                 and no other valgrind was found on PATH"
            );
            ExitCode::from(1)
        }
    }
}

/// What the core options say before the program.
#[derive(Debug, Default, PartialEq, Eq)]
struct CoreOptions<'a> {
    tool: Option<&'a str>,
    version: bool,
    help: bool,
}

/// Reads `--tool=`, `--version` and `-h`/`--help` among the options (the
/// arguments before the first that does not start with `-`); the last
/// `--tool` wins, as in Valgrind. Everything else is the tool's business.
fn core_options(args: &[OsString]) -> CoreOptions<'_> {
    let mut o = CoreOptions::default();
    for a in args {
        let Some(a) = a.to_str().filter(|a| a.starts_with('-')) else {
            break;
        };
        match a {
            "--version" => o.version = true,
            "-h" | "--help" | "--help-debug" => o.help = true,
            _ => {
                if let Some(t) = a.strip_prefix("--tool=") {
                    o.tool = Some(t);
                }
            }
        }
    }
    o
}

/// The first `valgrind` on `PATH` that is not this binary.
fn real_valgrind() -> Option<PathBuf> {
    let me = std::env::current_exe().ok()?;
    let me = me.canonicalize().unwrap_or(me);
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join("valgrind"))
        .find(|cand| is_executable(cand) && !is_same_program(cand, &me))
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Whether `cand` is the binary at `me`: the same file through links, or
/// a copy of it (same size and bytes; Valgrind's own launcher is a small
/// program, so the contents are compared only for a file of our size).
fn is_same_program(cand: &Path, me: &Path) -> bool {
    let canon = cand.canonicalize().unwrap_or_else(|_| cand.to_path_buf());
    if canon == me {
        return true;
    }
    let size = |p: &Path| std::fs::metadata(p).map(|m| m.len()).ok();
    if size(&canon).is_none() || size(&canon) != size(me) {
        return false;
    }
    matches!(
        (std::fs::read(&canon), std::fs::read(me)),
        (Ok(a), Ok(b)) if a == b
    )
}

/// Replaces this process with the real Valgrind, same arguments (so the
/// caller's `wait` sees Valgrind's own exit, signals and all).
fn hand_off(path: &Path, args: &[OsString]) -> ExitCode {
    use std::os::unix::process::CommandExt;
    let err = std::process::Command::new(path)
        .arg0(OsStr::new("valgrind"))
        .args(args)
        .exec();
    eprintln!("valgrind: cannot run {}: {err}", path.display());
    ExitCode::from(126)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os(v: &[&str]) -> Vec<OsString> {
        v.iter().map(OsString::from).collect()
    }

    #[test]
    fn core_options_stop_at_the_program() {
        let a = os(&[
            "-q",
            "--tool=memcheck",
            "--tool=cachegrind",
            "prog",
            "--version",
        ]);
        assert_eq!(
            core_options(&a),
            CoreOptions {
                tool: Some("cachegrind"),
                version: false,
                help: false
            }
        );
        let a = os(&["--version"]);
        assert!(core_options(&a).version);
        let a = os(&["-h"]);
        assert!(core_options(&a).help && core_options(&a).tool.is_none());
    }

    #[test]
    fn this_binary_is_never_the_real_valgrind() {
        let me = std::env::current_exe().unwrap().canonicalize().unwrap();
        assert!(is_same_program(&me, &me));
        assert!(!is_same_program(Path::new("/bin/sh"), &me));
    }
}
