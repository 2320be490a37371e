//! Generated code in a run's profile: named from the perf map the program
//! wrote (`/tmp/perf-<pid>.map`, as node `--perf-basic-prof` writes it),
//! `???` without one, in the counting and the simulating modes, with the
//! exact instruction counts of the generated functions; self-modifying code
//! counted alike with and without the simulations.

mod run_support;

use run_support::*;
use std::collections::BTreeMap;

/// Ir (the first event) per function of file `???` in a profile with any
/// events.
fn unknown_file_functions(path: &std::path::Path) -> BTreeMap<String, u64> {
    let text = std::fs::read_to_string(path).unwrap();
    let (mut fl, mut func) = (String::new(), String::new());
    let mut m = BTreeMap::new();
    for line in text.lines() {
        if let Some(v) = line.strip_prefix("fl=") {
            fl = v.to_string();
        } else if let Some(v) = line.strip_prefix("fn=") {
            func = v.to_string();
        } else if line.starts_with(|c: char| c.is_ascii_digit()) && fl == "???" {
            let ir: u64 = line.split(' ').nth(1).unwrap().parse().unwrap();
            *m.entry(func.clone()).or_insert(0) += ir;
        }
    }
    m
}

/// Ir of the generated functions: `jit_sum_loop(i)` runs 3 + 3i
/// instructions, `constant` 2, for i = 1..=100.
const SUM_LOOP_IR: u64 = 100 * 3 + 3 * 5050;
const CONSTANT_IR: u64 = 100 * 2;

/// Runs `exe args` under cachescope with `opts`: same stdout as
/// `exe native_args` natively (the perf-map fixture is run natively with
/// `nomap`, so as to leave no map that nothing would remove); returns Ir
/// per function of file `???` and the program's pid.
fn profile(
    dir: &TempDir,
    exe: &std::path::Path,
    opts: &[&str],
    args: &[&str],
    native_args: &[&str],
) -> (BTreeMap<String, u64>, i32) {
    let nat = native(&dir.0, exe.as_os_str(), native_args, None);
    let out = format!("--cachegrind-out-file={}/cs.%p", dir.0.display());
    let mut all = vec!["-q", out.as_str()];
    all.extend_from_slice(opts);
    let run = under_cachescope(&dir.0, &all, exe.as_os_str(), args, None);
    assert_eq!(run.stdout, nat.stdout, "{}", run.stderr_text());
    assert_eq!(run.end, End::Code(0), "{}", run.stderr_text());
    let files = files_with_prefix(&dir.0, "cs.");
    assert_eq!(files.len(), 1);
    let file = files[0].clone();
    let pid = file.extension().unwrap().to_str().unwrap().parse().unwrap();
    let p = unknown_file_functions(&file);
    annotate_ok(&file);
    std::fs::remove_file(&file).unwrap();
    (p, pid)
}

#[test]
fn generated_code_is_named_from_the_perf_map() {
    require("gcc");
    let dir = TempDir::new("run-jit-perfmap");
    let exe = dir.join("perfmap");
    compile("gcc", &["-O1", "-g"], "perfmap.c", &exe);
    for opts in [&[][..], &["--cache-sim=yes", "--branch-sim=yes"][..]] {
        let (named, pid) = profile(&dir, &exe, opts, &[], &["nomap"]);
        std::fs::remove_file(format!("/tmp/perf-{pid}.map")).unwrap();
        assert_eq!(
            named.get("jit_sum_loop"),
            Some(&SUM_LOOP_IR),
            "{opts:?}: {named:?}"
        );
        assert_eq!(
            named.get("JS:*constant /tmp/app.js:3:7"),
            Some(&CONSTANT_IR),
            "{opts:?}: {named:?}"
        );
        // Without a map, the same code is `???`.
        let (unnamed, pid) = profile(&dir, &exe, opts, &["nomap"], &["nomap"]);
        assert!(!std::path::Path::new(&format!("/tmp/perf-{pid}.map")).exists());
        assert!(!unnamed.contains_key("jit_sum_loop"));
        assert!(
            unnamed.get("???").copied().unwrap_or(0) >= SUM_LOOP_IR + CONSTANT_IR,
            "{opts:?}: {unnamed:?}"
        );
    }
}

#[test]
fn rewritten_code_counts_the_same_with_the_simulations() {
    require("gcc");
    let dir = TempDir::new("run-jit-smc");
    let exe = dir.join("smc");
    compile(
        "gcc",
        &["-O1", "-g", "-pthread", "-Wl,-z,execstack"],
        "smc.c",
        &exe,
    );
    for case in ["selfpatch", "rewrite", "wx", "nested"] {
        // Trace mode translates differently (records instead of counters):
        // the generated code's Ir must not depend on it.
        let (counted, _) = profile(&dir, &exe, &[], &[case], &[case]);
        let sim = ["--cache-sim=yes", "--branch-sim=yes"];
        let (traced, _) = profile(&dir, &exe, &sim, &[case], &[case]);
        assert_eq!(counted.get("???"), traced.get("???"), "{case}");
        assert!(counted.get("???").copied().unwrap_or(0) > 0, "{case}");
    }
}
