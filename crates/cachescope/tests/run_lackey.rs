//! `--tool=lackey` and the live simulations against Valgrind, on the static
//! `-nostdlib` fixtures of `fixtures/sim` (a matrix multiply, sorts, a
//! pointer chase, a branchy state machine, string instructions, a rep
//! instruction whose fetch only the tool sees among lines of its I1 set):
//!
//! * the `--trace-mem=yes` trace equals `valgrind --tool=lackey
//!   --trace-mem=yes`'s line for line. The fixtures run on a stack of their
//!   own in `.bss` (Valgrind puts the client's stack elsewhere than the
//!   kernel does), so even stack addresses are compared; the VEX artefacts
//!   these fixtures would show (constant targets and counts folded by VEX)
//!   are avoided by the fixtures themselves, so no line is exempt;
//! * the basic counts: calls to `main`, taken conditional branches and
//!   guest instructions equal Lackey's, and the conditional branches equal
//!   Cachegrind's Bc (Lackey's total also counts VEX's never-taken
//!   alignment-check exits, docs/conformance.md);
//! * all 13 totals (Ir I1mr ILmr Dr D1mr DLmr Dw D1mw DLmw Bc Bcm Bi Bim)
//!   equal Cachegrind's with `--cache-sim=yes --branch-sim=yes` and
//!   explicit caches, for two cache geometries.
//!
//! Without `valgrind` (or gcc) the tests fail, loudly.

mod run_support;

use run_support::{cachescope, TempDir};
use std::path::Path;
use std::process::Command;
use testkit::{build_nostdlib, require};

const FIXTURES: &[&str] = &[
    "nostdlib_matmul.c",
    "nostdlib_sort.c",
    "nostdlib_chase.c",
    "nostdlib_statemachine.c",
    "nostdlib_strings.c",
    "nostdlib_repfetch.c",
];

/// Whether a log line is one of Lackey's trace lines (`I  `, ` L `, ` S `,
/// ` M `) rather than a message (`==PID== `, `--PID-- `).
fn is_trace(line: &str) -> bool {
    ["I  ", " L ", " S ", " M "]
        .iter()
        .any(|p| line.starts_with(p))
}

/// A run's log: its lines, and how the program ended.
struct Logged {
    lines: Vec<String>,
    status: Option<i32>,
    stdout: Vec<u8>,
}

/// Runs `cmd args... exe` with `--log-file` in `dir`.
fn logged(dir: &TempDir, tag: &str, mut cmd: Command, exe: &Path) -> Logged {
    let log = dir.join(&format!("{tag}.log"));
    let out = cmd
        .arg(format!("--log-file={}", log.display()))
        .arg(exe)
        .current_dir(dir.path())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {tag}: {e}"));
    let text = std::fs::read_to_string(&log)
        .unwrap_or_else(|e| panic!("{tag}: no log {}: {e}", log.display()));
    Logged {
        lines: text.lines().map(str::to_owned).collect(),
        status: out.status.code(),
        stdout: out.stdout,
    }
}

fn trace(l: &Logged) -> Vec<&str> {
    l.lines
        .iter()
        .map(String::as_str)
        .filter(|l| is_trace(l))
        .collect()
}

/// The text of the summary line starting with `label` (after `==PID== `).
fn summary_value<'a>(l: &'a Logged, label: &str) -> &'a str {
    l.lines
        .iter()
        .filter_map(|l| l.split_once("== ").map(|(_, t)| t))
        .find_map(|t| t.trim_start().strip_prefix(label))
        .unwrap_or_else(|| panic!("no {label:?} line in {:?}", l.lines))
        .trim()
}

/// A comma-grouped count at the start of `s`.
fn count(s: &str) -> u64 {
    let digits: String = s
        .split_whitespace()
        .next()
        .unwrap_or("")
        .chars()
        .filter(|c| *c != ',')
        .collect();
    digits
        .parse()
        .unwrap_or_else(|_| panic!("not a count: {s:?}"))
}

/// Cachegrind's `summary:` totals of a `cachegrind.out` file.
fn cg_summary(path: &Path) -> (String, Vec<u64>) {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    let field = |key: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(key))
            .unwrap_or_else(|| panic!("{}: no {key}", path.display()))
            .to_string()
    };
    let totals = field("summary: ")
        .split_whitespace()
        .map(|n| n.parse().expect("a count"))
        .collect();
    (field("events: "), totals)
}

fn lackey_trace_equals_valgrinds(name: &str) {
    require("valgrind");
    let dir = TempDir::new(&format!("lackey-{}", name.trim_end_matches(".c")));
    let exe = build_nostdlib(&dir, name);
    let native = Command::new(&exe).output().expect("run the fixture");

    let mut c = Command::new(cachescope());
    c.args(["--tool=lackey", "--trace-mem=yes"]);
    let ours = logged(&dir, "ours", c, &exe);
    let mut c = Command::new("valgrind");
    c.args(["--tool=lackey", "--trace-mem=yes"]);
    let theirs = logged(&dir, "lackey", c, &exe);

    assert_eq!(ours.status, native.status.code(), "{name}: exit status");
    assert_eq!(theirs.status, native.status.code(), "{name}: Lackey's");
    assert_eq!(ours.stdout, native.stdout, "{name}: output");

    let (a, b) = (trace(&ours), trace(&theirs));
    assert!(b.len() > 50_000, "{name}: Lackey traced {} lines", b.len());
    if let Some(k) = (0..a.len().max(b.len())).find(|&k| a.get(k) != b.get(k)) {
        let show = |t: &[&str]| t[k.saturating_sub(3)..(k + 3).min(t.len())].join("\n");
        panic!(
            "{name}: traces differ at line {k} of {} (ours) and {} (Lackey's)\n\
             ours:\n{}\nLackey's:\n{}",
            a.len(),
            b.len(),
            show(&a),
            show(&b)
        );
    }

    // The basic counts that mean the same here.
    for label in ["Counted ", "guest instrs:"] {
        assert_eq!(
            summary_value(&ours, label),
            summary_value(&theirs, label),
            "{name}: {label}"
        );
    }
    let taken = |l: &Logged| count(summary_value(l, "taken:"));
    assert_eq!(taken(&ours), taken(&theirs), "{name}: taken Jccs");
    let total = |l: &Logged| count(summary_value(l, "total:"));
    assert!(total(&ours) <= total(&theirs), "{name}: Jccs");

    // The trace sits where Lackey's does: after the preamble's blank line,
    // before the one that starts the summary.
    for (who, l) in [("ours", &ours), ("Lackey's", &theirs)] {
        let first = l.lines.iter().position(|x| is_trace(x)).unwrap();
        let last = l.lines.iter().rposition(|x| is_trace(x)).unwrap();
        assert!(l.lines[first - 1].ends_with("== "), "{who}: {:?}", l.lines);
        assert!(l.lines[last + 1].ends_with("== "), "{who}");
        assert!(l.lines[last + 2].contains("== Counted "), "{who}");
    }
}

#[test]
fn lackey_trace_matmul() {
    lackey_trace_equals_valgrinds("nostdlib_matmul.c");
}

#[test]
fn lackey_trace_sort() {
    lackey_trace_equals_valgrinds("nostdlib_sort.c");
}

#[test]
fn lackey_trace_chase() {
    lackey_trace_equals_valgrinds("nostdlib_chase.c");
}

#[test]
fn lackey_trace_statemachine() {
    lackey_trace_equals_valgrinds("nostdlib_statemachine.c");
}

#[test]
fn lackey_trace_repfetch() {
    lackey_trace_equals_valgrinds("nostdlib_repfetch.c");
}

#[test]
fn lackey_trace_strings() {
    lackey_trace_equals_valgrinds("nostdlib_strings.c");
}

/// The 13 totals of every fixture equal Cachegrind's, with the caches of
/// `tests/run_sim.rs` and with small ones that miss a lot.
#[test]
fn all_13_totals_equal_cachegrinds() {
    require("valgrind");
    let geometries: [[&str; 3]; 2] = [
        ["--I1=32768,8,64", "--D1=32768,8,64", "--LL=1048576,16,64"],
        ["--I1=512,2,64", "--D1=4096,4,32", "--LL=16384,4,64"],
    ];
    let dir = TempDir::new("lackey-totals");
    for name in FIXTURES {
        let exe = build_nostdlib(&dir, name);
        for (g, caches) in geometries.iter().enumerate() {
            let run = |cmd: &mut Command, out: &Path| {
                let st = cmd
                    .args(["-q", "--cache-sim=yes", "--branch-sim=yes"])
                    .args(caches)
                    .arg(format!("--cachegrind-out-file={}", out.display()))
                    .arg(&exe)
                    .current_dir(dir.path())
                    .output()
                    .expect("run");
                assert!(
                    st.status.code().is_some(),
                    "{name}: {}",
                    String::from_utf8_lossy(&st.stderr)
                );
            };
            let (ours, theirs) = (dir.join("ours.out"), dir.join("cg.out"));
            run(&mut Command::new(cachescope()), &ours);
            run(Command::new("valgrind").arg("--tool=cachegrind"), &theirs);
            let (events, totals) = cg_summary(&ours);
            let (cg_events, cg_totals) = cg_summary(&theirs);
            assert_eq!(
                events,
                "Ir I1mr ILmr Dr D1mr DLmr Dw D1mw DLmw Bc Bcm Bi Bim"
            );
            assert_eq!(events, cg_events);
            assert_eq!(totals, cg_totals, "{name}, caches {caches:?}: {events}");
            eprintln!("{name} {caches:?}: {totals:?}");
            if g == 1 {
                // Small caches: the misses being compared are there.
                assert!(totals[4] > 0 && totals[5] > 0, "{name}: {totals:?}");
            }
        }
    }
}

/// The drop-in `valgrind` runs Lackey itself; `-q` leaves the trace and
/// Lackey's summary (as Valgrind does), and without `--log-file` both go
/// to stderr.
#[test]
fn lackey_through_the_drop_in_and_quiet() {
    require("valgrind");
    let dir = TempDir::new("lackey-dropin");
    let exe = build_nostdlib(&dir, "nostdlib_strings.c");
    let shim = dir.join("valgrind");
    std::os::unix::fs::symlink(cachescope(), &shim).unwrap();
    let stderr_lines = |mut cmd: Command| -> Vec<String> {
        let out = cmd
            .args(["--tool=lackey", "--trace-mem=yes", "-q"])
            .arg(&exe)
            .output()
            .expect("run");
        String::from_utf8_lossy(&out.stderr)
            .lines()
            .map(str::to_owned)
            .collect()
    };
    let ours = stderr_lines(Command::new(&shim));
    let theirs = stderr_lines(Command::new("valgrind"));
    let traced =
        |l: &[String]| -> Vec<String> { l.iter().filter(|x| is_trace(x)).cloned().collect() };
    assert_eq!(traced(&ours), traced(&theirs));
    for l in [&ours, &theirs] {
        assert!(is_trace(&l[0]), "no preamble with -q: {:?}", &l[..3]);
        let after = l.iter().rposition(|x| is_trace(x)).unwrap() + 1;
        assert!(
            l[after].contains("== Counted 0 calls to main()"),
            "{:?}",
            &l[after..]
        );
    }
    // A glibc program: calls to main (and to another function, the same
    // count as Valgrind's), found through its symbols.
    let dynamic = dir.join("loops");
    run_support::compile("gcc", &["-O1", "-g"], "loops.c", &dynamic);
    let counted = |cmd: &str, fnname: &str| -> String {
        let out = Command::new(cmd)
            .args(["--tool=lackey", "-q"])
            .arg(format!("--fnname={fnname}"))
            .arg(&dynamic)
            .output()
            .expect("run");
        let text = String::from_utf8_lossy(&out.stderr).into_owned();
        let line = text
            .lines()
            .find(|l| l.contains("== Counted "))
            .unwrap_or_else(|| panic!("{cmd}: no Counted line in {text}"));
        line.split_once("== ").unwrap().1.to_string()
    };
    assert_eq!(
        counted(shim.to_str().unwrap(), "main"),
        "Counted 1 call to main()"
    );
    assert_eq!(
        counted(shim.to_str().unwrap(), "fib"),
        counted("valgrind", "fib")
    );
}

/// A forked child's tool continues from its parent's as it stood at the
/// fork (as under Valgrind, where the child inherits the tool's memory):
/// both processes report the one call to `main` made before the fork.
#[test]
fn a_forked_child_inherits_the_counts() {
    require("valgrind");
    let dir = TempDir::new("lackey-fork");
    let exe = dir.join("fork");
    run_support::compile("gcc", &["-O1", "-g"], "fork.c", &exe);
    let summaries = |cmd: &str| -> Vec<(String, u64)> {
        let out = Command::new(cmd)
            .args(["--tool=lackey", "-q"])
            .arg(&exe)
            .current_dir(dir.path())
            .output()
            .expect("run");
        let text = String::from_utf8_lossy(&out.stderr).into_owned();
        let (mut calls, mut found) = (Vec::new(), Vec::new());
        for l in text.lines().filter_map(|l| l.split_once("== ")) {
            if l.1.starts_with("Counted ") {
                calls.push(l.1.to_string());
            } else if let Some(n) = l.1.trim_start().strip_prefix("guest instrs:") {
                found.push(count(n));
            }
        }
        calls.into_iter().zip(found).collect()
    };
    let ours = summaries(cachescope().to_str().unwrap());
    let theirs = summaries("valgrind");
    assert_eq!(ours.len(), 2, "{ours:?}");
    assert_eq!(theirs.len(), 2, "{theirs:?}");
    for ((c, _), (vc, _)) in ours.iter().zip(&theirs) {
        assert_eq!(c, "Counted 1 call to main()");
        assert_eq!(c, vc);
    }
    // The child (first to finish) ran the parent's start and work(30000);
    // the parent work(10000) after waiting for it.
    assert!(ours[0].1 > ours[1].1, "{ours:?}");
}
