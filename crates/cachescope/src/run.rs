//! Placeholder until this front end lands; replaced by its owner.

use std::ffi::OsString;
use std::process::ExitCode;

/// Entry point for this front end.
pub fn main(_args: &[OsString]) -> ExitCode {
    eprintln!("cachescope: this front end is not built yet");
    ExitCode::from(1)
}
