//! C++ demangling checked against libiberty's own output, recorded in
//! `fixtures/demangle_libiberty.tsv` (see its header for how the names were
//! chosen). Valgrind embeds libiberty's demangler, so a difference here is a
//! function name that would not match Valgrind's output.
//!
//! * The pure-Rust demangler (`cxx_rust`, what the default build uses) must
//!   differ from libiberty on exactly the names listed in
//!   `fixtures/demangle_known_differences.txt`: a new difference is a
//!   regression, a listed name that now agrees is an improvement to record.
//! * The build with the `libiberty` feature must print libiberty's text for
//!   every name, and so must its live libiberty.
//!
//! To measure the pure-Rust demangler on a whole system rather than this
//! corpus: `nm -D --defined-only LIB | awk '{print $NF}' | cargo run --release
//! -p symbols --features libiberty --example demangle -- --compare`.

use std::collections::BTreeSet;
use std::path::Path;

use symbols::demangle::{cxx_rust, CXX_IS_LIBIBERTY};

// The constant other crates' tests read says which demangler this build has.
const _: () = assert!(CXX_IS_LIBIBERTY == cfg!(feature = "libiberty"));

fn fixture(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The golden (mangled, libiberty) pairs.
fn golden() -> Vec<(String, String)> {
    let pairs: Vec<_> = fixture("demangle_libiberty.tsv")
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|line| {
            let (mangled, expected) = line
                .split_once('\t')
                .unwrap_or_else(|| panic!("no tab in {line:?}"));
            (mangled.to_string(), expected.to_string())
        })
        .collect();
    assert!(pairs.len() > 1000, "only {} golden names", pairs.len());
    pairs
}

/// The names on which the pure-Rust demangler is known to differ.
fn known_differences() -> BTreeSet<String> {
    fixture("demangle_known_differences.txt")
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(str::to_string)
        .collect()
}

/// What the pure-Rust path prints: `symbols::demangle::demangle` of the
/// default build (every golden name is C++, so rustc-demangle takes none).
fn pure_rust(mangled: &str) -> String {
    assert!(rustc_demangle::try_demangle(mangled).is_err(), "{mangled}");
    cxx_rust(mangled).unwrap_or_else(|| mangled.to_string())
}

#[test]
fn pure_rust_differs_from_libiberty_on_exactly_the_known_names() {
    let known = known_differences();
    let mut differ = BTreeSet::new();
    let mut new = Vec::new();
    for (mangled, expected) in golden() {
        let got = pure_rust(&mangled);
        if got != expected {
            if !known.contains(&mangled) {
                new.push(format!(
                    "{mangled}\n  libiberty: {expected}\n  pure Rust: {got}"
                ));
            }
            differ.insert(mangled);
        }
    }
    let fixed: Vec<_> = known.difference(&differ).collect();
    assert!(
        new.is_empty() && fixed.is_empty(),
        "{} names newly differ from libiberty (regressions), e.g.\n{}\n\
         {} listed names now agree (remove them from \
         demangle_known_differences.txt): {:?}",
        new.len(),
        new[..new.len().min(10)].join("\n"),
        fixed.len(),
        &fixed[..fixed.len().min(20)],
    );
}

#[cfg(feature = "libiberty")]
#[test]
fn libiberty_build_prints_exactly_libiberty() {
    use symbols::demangle::{cxx_libiberty, demangle};
    let mut wrong = Vec::new();
    for (mangled, expected) in golden() {
        let got = demangle(&mangled);
        let live = cxx_libiberty(&mangled).unwrap_or_else(|| mangled.clone());
        if got != expected || live != expected {
            wrong.push(format!(
                "{mangled}\n  recorded: {expected}\n  demangle: {got}\n  libiberty now: {live}"
            ));
        }
    }
    assert!(
        wrong.is_empty(),
        "{} names differ from the recorded libiberty output, e.g.\n{}",
        wrong.len(),
        wrong[..wrong.len().min(10)].join("\n")
    );
}

#[cfg(not(feature = "libiberty"))]
#[test]
fn default_build_uses_the_pure_rust_demangler() {
    use symbols::demangle::demangle;
    for (mangled, _) in golden() {
        assert_eq!(demangle(&mangled), pure_rust(&mangled));
    }
}

#[test]
fn hostile_names_fail_quickly_instead_of_exhausting_memory() {
    // Each parameter is Pair<previous, previous>: the output doubles with
    // every four bytes of input. libiberty would print 2^40 parameters' worth
    // (it takes 7 s and 48 MB at 20 levels); the pure-Rust demangler gives up
    // past 64 KiB of text and keeps the raw name.
    let seq_id = |k: usize| match k {
        0 => "S_".to_string(),
        k => {
            let digits = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ";
            let (mut n, mut s) = (k - 1, Vec::new());
            loop {
                s.insert(0, digits[n % 36]);
                n /= 36;
                if n == 0 {
                    break;
                }
            }
            format!("S{}_", String::from_utf8(s).unwrap())
        }
    };
    let mut name = String::from("_Z1f4PairIiiE");
    for i in 0..40 {
        name += &format!("{}I{}{}E", seq_id(0), seq_id(i + 1), seq_id(i + 1));
    }
    let start = std::time::Instant::now();
    assert_eq!(cxx_rust(&name), None);
    assert!(start.elapsed().as_secs() < 5);
    // Five levels are fine.
    assert_eq!(
        cxx_rust("_Z1f4PairIiiES_IS0_S0_E").as_deref(),
        Some("f(Pair<int, int>, Pair<Pair<int, int>, Pair<int, int> >)")
    );
    // Deep nesting within libiberty's 1024-byte limit does not overflow a
    // test thread's stack (cpp_demangle's recursion limit refuses it; that
    // name is among the known differences).
    let deep = format!("_Z1f{}i", "P".repeat(1019));
    assert_eq!(cxx_rust(&deep), None);
}
