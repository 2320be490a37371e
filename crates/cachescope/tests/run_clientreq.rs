//! Client requests end to end: `fixtures/engine/clientreq.c`, built against
//! Valgrind's own `valgrind.h`, `callgrind.h`, `memcheck.h`, `dhat.h` and
//! `helgrind.h` (and `cachegrind.h` where installed: Valgrind 3.19 has none,
//! the fixture then spells its two requests by their 3.22 numbers), under
//! cachescope and under Valgrind.

mod run_support;

use profile::Profile;
use run_support::{
    compile, native, require, under_cachescope, under_valgrind, CgOut, End, TempDir,
};
use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};

/// The fixture, built in `dir`.
fn build(dir: &TempDir) -> PathBuf {
    let exe = dir.join("clientreq");
    compile("gcc", &["-O1", "-g", "-pthread"], "clientreq.c", &exe);
    exe
}

/// The `**PID** ` lines of `stderr`, without the pid, in order.
fn client_lines(stderr: &str) -> Vec<String> {
    stderr
        .lines()
        .filter_map(|l| l.strip_prefix("**"))
        .filter_map(|l| l.split_once("** ").map(|(_, text)| text.to_string()))
        .collect()
}

/// Runs `exe mode` under cachescope (with `opts`) and under Valgrind's
/// Cachegrind; both must end well and print the same thing on stdout.
/// Returns both profiles' paths and both stderrs.
fn both(dir: &TempDir, exe: &Path, mode: &str, opts: &[&str]) -> [(PathBuf, String); 2] {
    let ours = dir.join(&format!("ours.{mode}"));
    let theirs = dir.join(&format!("theirs.{mode}"));
    let mut o = vec![format!("--cachegrind-out-file={}", ours.display())];
    o.extend(opts.iter().map(|s| s.to_string()));
    let o: Vec<&str> = o.iter().map(String::as_str).collect();
    let cs = under_cachescope(dir.path(), &o, exe.as_os_str(), &[mode], None);
    let out = format!("--cachegrind-out-file={}", theirs.display());
    let vg = under_valgrind(dir.path(), &[&out], exe.as_os_str(), &[mode], None);
    assert_eq!(cs.end, End::Code(0), "{}", cs.stderr_text());
    assert_eq!(vg.end, End::Code(0), "{}", vg.stderr_text());
    assert_eq!(
        String::from_utf8_lossy(&cs.stdout),
        String::from_utf8_lossy(&vg.stdout),
        "the client's output, ours then Valgrind's"
    );
    [(ours, cs.stderr_text()), (theirs, vg.stderr_text())]
}

#[test]
fn requests_answer_and_count_as_under_valgrind() {
    require("valgrind");
    require("gcc");
    let dir = TempDir::new("clientreq-requests");
    let exe = build(&dir);
    // Natively every request leaves its default.
    let n = native(dir.path(), exe.as_os_str(), &["requests"], None);
    let text = String::from_utf8_lossy(&n.stdout);
    assert!(
        text.starts_with("running 0\n") && text.contains("loop 0\n"),
        "{text}"
    );
    let [(ours, _), (theirs, _)] = both(&dir, &exe, "requests", &[]);
    let (ours, theirs) = (CgOut::read(&ours), CgOut::read(&theirs));
    // RUNNING_ON_VALGRIND is 1, STACK_REGISTER's id 1, the others'
    // defaults (the stdout comparison above); Ir of the requests themselves
    // (one instruction each) and everything around them as Cachegrind's.
    let f = ours.functions_in("clientreq.c");
    assert_eq!(f, theirs.functions_in("clientreq.c"));
    assert!(f["requests"] > 14_000, "{f:?}");
}

#[test]
fn requests_in_threads_and_in_trace_mode() {
    require("valgrind");
    require("gcc");
    let dir = TempDir::new("clientreq-threads");
    let exe = build(&dir);
    for opts in [&[][..], &["--cache-sim=yes", "--branch-sim=yes"][..]] {
        let [(ours, err_ours), (theirs, err_theirs)] = both(&dir, &exe, "threads", opts);
        // (In trace mode, the Ir column of the full profile.)
        assert_eq!(
            ir_per_function(&read_profile(&ours), "clientreq.c"),
            CgOut::read(&theirs).functions_in("clientreq.c")
        );
        // Threads print in any order.
        let mut a = client_lines(&err_ours);
        let mut b = client_lines(&err_theirs);
        a.sort();
        b.sort();
        assert_eq!(a, b);
        assert_eq!(a.len(), 4);
    }
}

#[test]
fn valgrind_printf_prints_and_returns_as_valgrind_does() {
    require("valgrind");
    require("gcc");
    let dir = TempDir::new("clientreq-printf");
    let exe = build(&dir);
    let [(_, ours), (_, theirs)] = both(&dir, &exe, "printf", &[]);
    assert_eq!(client_lines(&ours), client_lines(&theirs));
    // The backtrace's first frame, the request's own, names the same
    // function and line (addresses differ: Valgrind loads programs at
    // another base).
    let frame = |s: &str| -> String {
        let l = s
            .lines()
            .find(|l| l.contains("    at 0x"))
            .unwrap_or_else(|| panic!("no backtrace in {s}"));
        l.split_once(": ").unwrap().1.to_string()
    };
    assert_eq!(frame(&ours), frame(&theirs));
    assert!(frame(&ours).starts_with("VALGRIND_PRINTF_BACKTRACE (valgrind.h:"));
}

#[test]
fn non_simd_calls_run_the_function_natively_as_valgrind_does() {
    require("valgrind");
    require("gcc");
    let dir = TempDir::new("clientreq-call");
    let exe = build(&dir);
    // Natively the requests return 0 and call nothing.
    let n = native(dir.path(), exe.as_os_str(), &["call"], None);
    assert_eq!(String::from_utf8_lossy(&n.stdout), "call 0 0 0 0 0 1234\n");
    // Under both tools (same output asserted): each function gets the
    // thread's number (1 for main, 2 for the second thread) and its
    // arguments, its result comes back, registers survive; it runs
    // uncounted, so the fixture's functions count alike.
    let [(ours, _), (theirs, _)] = both(&dir, &exe, "call", &[]);
    let mine = ir_per_function(&read_profile(&ours), "clientreq.c");
    assert_eq!(mine, CgOut::read(&theirs).functions_in("clientreq.c"));
    for f in ["call0", "call2", "call3"] {
        assert!(!mine.contains_key(f), "{f} counted: {mine:?}");
    }
    let cs = under_cachescope(dir.path(), &[], exe.as_os_str(), &["call"], None);
    assert_eq!(
        String::from_utf8_lossy(&cs.stdout),
        "call 1000 1006 3600 2000 4 1234\n"
    );
}

#[test]
fn toggling_instrumentation_while_other_threads_run_is_safe() {
    // Each toggle retires every block while two threads run theirs: an
    // entry rewritten under a running thread must never be seen half
    // written (before, 20 runs of 20 crashed or stopped with "jumped to
    // non-executable memory").
    require("gcc");
    let dir = TempDir::new("clientreq-toggle-threads");
    let exe = dir.join("toggle_threads");
    compile("gcc", &["-O1", "-g", "-pthread"], "toggle_threads.c", &exe);
    let nat = native(dir.path(), exe.as_os_str(), &[], None);
    assert_eq!(nat.end, End::Code(0));
    // Counting, then trace mode (where the looping threads' trace-buffer
    // stops also starved the main thread's, and it crashed 10 runs of 10).
    for sim in ["--cache-sim=no", "--cache-sim=yes"] {
        for _ in 0..3 {
            let opts = [
                "-q",
                sim,
                "--instr-at-start=no",
                "--cachegrind-out-file=/dev/null",
            ];
            let r = under_cachescope(dir.path(), &opts, exe.as_os_str(), &[], None);
            assert_eq!(r.end, End::Code(0), "{sim}: {}", r.stderr_text());
            assert_eq!(r.stdout, nat.stdout, "{sim}");
        }
    }
}

/// The client lines and stack-trace lines of `stderr`, without pids and
/// addresses (Valgrind loads programs at another base).
fn traces(stderr: &str) -> Vec<String> {
    stderr
        .lines()
        .filter_map(|l| {
            if let Some(text) = l.strip_prefix("**") {
                return text.split_once("** ").map(|(_, t)| t.to_string());
            }
            let frame = l.split_once("==    ")?.1;
            let (at, rest) = frame.split_once(" 0x")?;
            Some(format!("{at} {}", rest.split_once(": ")?.1))
        })
        .collect()
}

#[test]
fn printf_backtrace_names_the_callers_as_valgrind_does() {
    require("valgrind");
    require("gcc");
    let dir = TempDir::new("clientreq-backtrace");
    for opt in ["-O0", "-O2"] {
        let exe = dir.join(&format!("backtrace{opt}"));
        compile("gcc", &[opt, "-g"], "backtrace.c", &exe);
        let [(_, ours), (_, theirs)] = both(&dir, &exe, opt, &[]);
        let (ours, theirs) = (traces(&ours), traces(&theirs));
        assert_eq!(ours, theirs, "{opt}: ours, then Valgrind's");
        // Callers through libc's qsort (its CFI), and at -O0 the twelve
        // frames of a deep recursion.
        assert!(ours.iter().any(|l| l.starts_with("by qsort")), "{ours:#?}");
        let frames = ours
            .iter()
            .filter(|l| l.starts_with("at ") || l.starts_with("by "));
        assert!(frames.count() >= 3 + 6 + 3, "{ours:#?}");
    }
}

/// `measured` runs 2005 instructions between its two requests: `mov` once,
/// `dec` and `jnz` 1000 times each, the three instructions setting up the
/// second request and that request. The first request's block runs while
/// instrumentation is off, so none of it counts.
const REGION: u64 = 2005;

#[test]
fn only_the_instrumented_region_is_counted() {
    require("gcc");
    let dir = TempDir::new("clientreq-region");
    let exe = build(&dir);
    let run = |opts: &[&str], out: &str| {
        let path = dir.join(out);
        let mut o = vec![format!("--cachegrind-out-file={}", path.display())];
        o.extend(opts.iter().map(|s| s.to_string()));
        let o: Vec<&str> = o.iter().map(String::as_str).collect();
        let r = under_cachescope(dir.path(), &o, exe.as_os_str(), &["cg"], None);
        assert_eq!(r.end, End::Code(0), "{}", r.stderr_text());
        (path, r.stderr_text())
    };
    // Counting mode: exactly the region, nothing else of the program.
    let (path, _) = run(&["--instr-at-start=no"], "counting");
    let p = CgOut::read(&path);
    assert_eq!(p.summary, REGION);
    assert_eq!(p.costs.len(), 1, "{:?}", p.costs);
    assert_eq!(
        p.costs.keys().next().unwrap(),
        &("???".to_string(), "measured".to_string(), 0)
    );
    // Trace mode: no simulated event outside either; inside, the one store
    // (the second request's argument) and the loop's 1000 branches.
    let sims = ["--instr-at-start=no", "--cache-sim=yes", "--branch-sim=yes"];
    let (path, _) = run(&sims, "trace");
    let p = read_profile(&path);
    let totals = event_totals(&p);
    assert_eq!(totals["Ir"], REGION as i64);
    assert_eq!((totals["Dr"], totals["Dw"]), (0, 1));
    assert_eq!((totals["Bc"], totals["Bi"]), (1000, 0));
    // Instrumented from the start: the first request finds it on (and says
    // so, as Cachegrind 3.22 does); its block counts, and nothing after the
    // second request does.
    let (path, stderr) = run(&[], "at-start");
    let p = CgOut::read(&path);
    assert_eq!(p.functions_in("???")["measured"], 4 + 1 + REGION);
    assert!(
        stderr.contains("-- warning: CACHEGRIND_START_INSTRUMENTATION called,\n")
            && stderr.contains("--          but instrumentation is already enabled\n"),
        "{stderr}"
    );
    assert!(!p.functions_in("").contains_key("exit"), "{:?}", p.costs);
}

#[test]
fn the_region_agrees_with_callgrinds_start_and_stop() {
    // Valgrind 3.19 has Callgrind's requests, not Cachegrind's: the same
    // region between CALLGRIND_START/STOP_INSTRUMENTATION under
    // `--tool=callgrind --instr-atstart=no`. Callgrind charges a block's
    // instructions when the next instrumented block starts, so it leaves
    // out the 4 of the block that stops instrumentation.
    require("valgrind");
    require("gcc");
    let dir = TempDir::new("clientreq-callgrind");
    let exe = build(&dir);
    let out = dir.join("callgrind.out");
    let o = std::process::Command::new("valgrind")
        .args(["--tool=callgrind", "--instr-atstart=no", "-q"])
        .arg(format!("--callgrind-out-file={}", out.display()))
        .arg(&exe)
        .arg("ct")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let text = std::fs::read_to_string(&out).unwrap();
    let totals: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix("totals: "))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert_eq!(totals + 4, REGION);
    // Cachescope obeys Cachegrind's requests only (as Valgrind's Cachegrind
    // does): Callgrind's leave everything uninstrumented.
    let ours = dir.join("ours");
    let r = under_cachescope(
        dir.path(),
        &[
            "--instr-at-start=no",
            &format!("--cachegrind-out-file={}", ours.display()),
        ],
        OsStr::new(&exe),
        &["ct"],
        None,
    );
    assert_eq!(r.end, End::Code(0));
    assert_eq!(CgOut::read(&ours).summary, 0);
}

fn read_profile(path: &Path) -> Profile {
    let f = std::fs::File::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    Profile::read_from(std::io::BufReader::new(f)).unwrap()
}

/// Each event's total over the whole profile.
fn event_totals(p: &Profile) -> BTreeMap<&str, i64> {
    let mut sums = vec![0; p.events.len()];
    for funcs in p.costs.values() {
        for lines in funcs.values() {
            for c in lines.values() {
                for (s, n) in sums.iter_mut().zip(c) {
                    *s += n;
                }
            }
        }
    }
    p.events.iter().map(String::as_str).zip(sums).collect()
}

/// Ir per function of the files ending in `suffix`.
fn ir_per_function(p: &Profile, suffix: &str) -> BTreeMap<String, u64> {
    let ir = p.events.iter().position(|e| e == "Ir").expect("Ir");
    let mut out = BTreeMap::new();
    for (file, funcs) in &p.costs {
        if file.ends_with(suffix) {
            for (func, lines) in funcs {
                let n: i64 = lines.values().map(|c| c[ir]).sum();
                // (Trace mode has rows for code translated but never run.)
                if n != 0 {
                    *out.entry(func.clone()).or_default() += n as u64;
                }
            }
        }
    }
    out
}
