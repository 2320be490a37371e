//! C++ demangling checked against libiberty's own output, recorded in
//! `fixtures/demangle_libiberty.tsv` while the crate still called libiberty
//! (see the file's header for how the names were chosen). Valgrind embeds
//! libiberty's demangler, so any difference here is a function name that
//! would not match Valgrind's output.

use std::path::Path;

use symbols::demangle::demangle;

#[test]
fn demangling_matches_libiberty_on_the_golden_corpus() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/demangle_libiberty.tsv");
    let text = std::fs::read_to_string(&path).unwrap();
    let mut checked = 0;
    let mut wrong = Vec::new();
    for line in text
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
    {
        let (mangled, expected) = line
            .split_once('\t')
            .unwrap_or_else(|| panic!("no tab in {line:?}"));
        let got = demangle(mangled);
        if got != expected {
            wrong.push(format!(
                "{mangled}\n  libiberty: {expected}\n  ours:      {got}"
            ));
        }
        checked += 1;
    }
    assert!(checked > 1000, "only {checked} names in {}", path.display());
    assert!(
        wrong.is_empty(),
        "{} of {checked} names differ from libiberty, e.g.\n{}",
        wrong.len(),
        wrong[..wrong.len().min(10)].join("\n")
    );
}

#[test]
fn hostile_names_fail_quickly_instead_of_exhausting_memory() {
    // Each parameter is Pair<previous, previous>: the output doubles with
    // every four bytes of input. libiberty would print 2^40 parameters' worth
    // (it takes 7 s and 48 MB at 20 levels); we give up and keep the raw name.
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
    assert_eq!(demangle(&name), name);
    assert!(start.elapsed().as_secs() < 5);
    // Five levels are fine.
    let small = "_Z1f4PairIiiES_IS0_S0_E";
    assert_eq!(
        demangle(small),
        "f(Pair<int, int>, Pair<Pair<int, int>, Pair<int, int> >)"
    );
    // The deepest nesting a name within libiberty's 1024-byte limit allows
    // demangles (without overflowing a test thread's stack); one byte more
    // and libiberty refuses the name.
    let deep = format!("_Z1f{}i", "P".repeat(1019));
    assert_eq!(demangle(&deep), format!("f(int{})", "*".repeat(1019)));
    let too_long = format!("_Z1f{}i", "P".repeat(1020));
    assert_eq!(demangle(&too_long), too_long);
}
