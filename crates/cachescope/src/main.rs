//! The `cachescope` command: composes the engine, the simulators, symbols and
//! profile writers.
//!
//! Dispatch: invoked as `cg_annotate`, `cg_merge`, `cg_diff` or
//! `callgrind_annotate` (a symlink or a copy), the binary behaves as that
//! Valgrind tool; as `valgrind`, as Valgrind's launcher (see `valgrind.rs`).
//! Otherwise the first argument may name a subcommand (`replay`,
//! `annotate`, `merge`, `diff`, `callgrind_annotate`);
//! anything else is Valgrind's command line: `[options] prog [args]`.
#![forbid(unsafe_code)]

mod cgtools;
mod exportcmd;
mod outfile;
mod replay;
mod run;
mod simopts;
mod summary;
mod valgrind;

use std::ffi::OsString;
use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<OsString> = std::env::args_os().collect();
    let invoked = args
        .first()
        .and_then(|a| std::path::Path::new(a).file_name())
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let rest = args.get(1..).unwrap_or(&[]);
    match invoked.as_str() {
        "cg_annotate" => return cgtools::annotate_main(rest),
        "cg_merge" => return cgtools::merge_main(rest),
        "cg_diff" => return cgtools::diff_main(rest),
        "callgrind_annotate" => return cgtools::callgrind_annotate_main(rest),
        "valgrind" => return valgrind::main(rest),
        _ => {}
    }
    let sub = rest.first().and_then(|a| a.to_str());
    let sub_args = rest.get(1..).unwrap_or(&[]);
    match sub {
        Some("replay") => replay::main(sub_args),
        Some("export") => exportcmd::main(sub_args),
        Some("annotate") => cgtools::annotate_main(sub_args),
        Some("merge") => cgtools::merge_main(sub_args),
        Some("diff") => cgtools::diff_main(sub_args),
        Some("callgrind_annotate") => cgtools::callgrind_annotate_main(sub_args),
        _ => run::main(rest),
    }
}
