//! Placeholder until the cg_annotate / cg_merge / cg_diff front ends land.

use std::ffi::OsString;
use std::process::ExitCode;

fn unbuilt() -> ExitCode {
    eprintln!("cachescope: this front end is not built yet");
    ExitCode::from(1)
}

/// `cg_annotate` / `cachescope annotate`.
pub fn annotate_main(_args: &[OsString]) -> ExitCode {
    unbuilt()
}

/// `cg_merge` / `cachescope merge`.
pub fn merge_main(_args: &[OsString]) -> ExitCode {
    unbuilt()
}

/// `cg_diff` / `cachescope diff`.
pub fn diff_main(_args: &[OsString]) -> ExitCode {
    unbuilt()
}
