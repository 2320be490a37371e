//! Demangles names read from standard input, one a line, printing
//! `name TAB demangled` with this build's demangler:
//! `nm -D lib.so | awk '{print $NF}' | cargo run --release --example demangle`.
//!
//! With `--compare` (needs the `libiberty` feature) it prints, for every name
//! on which the pure-Rust demangler and libiberty disagree,
//! `name TAB libiberty TAB pure Rust`, and a count on standard error: how
//! the agreement in `tests/demangle_libiberty.rs` is measured on a corpus.
use std::io::{BufRead, Write};

fn main() {
    let compare = std::env::args().any(|a| a == "--compare");
    let stdin = std::io::stdin();
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    let (mut names, mut differ) = (0usize, 0usize);
    for line in stdin.lock().lines() {
        let name = line.expect("standard input is text");
        names += 1;
        if compare {
            if let Some((libiberty, rust)) = disagreement(&name) {
                differ += 1;
                writeln!(out, "{name}\t{libiberty}\t{rust}").expect("write");
            }
        } else {
            writeln!(out, "{name}\t{}", symbols::demangle::demangle(&name)).expect("write");
        }
    }
    if compare {
        eprintln!("{differ} of {names} names differ");
    }
}

/// libiberty's and the pure-Rust text of `name` (the raw name where one does
/// not demangle it), when they differ. Rust names are left out: both builds
/// demangle them with rustc-demangle.
#[cfg(feature = "libiberty")]
fn disagreement(name: &str) -> Option<(String, String)> {
    use symbols::demangle::{cxx_libiberty, cxx_rust};
    if rustc_demangle::try_demangle(name).is_ok() {
        return None;
    }
    let libiberty = cxx_libiberty(name).unwrap_or_else(|| name.to_string());
    let rust = cxx_rust(name).unwrap_or_else(|| name.to_string());
    (libiberty != rust).then_some((libiberty, rust))
}

#[cfg(not(feature = "libiberty"))]
fn disagreement(_: &str) -> Option<(String, String)> {
    eprintln!("--compare needs libiberty: build with --features libiberty");
    std::process::exit(2);
}
