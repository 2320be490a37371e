//! Frequent asynchronous signals (`fixtures/engine/timer.c`: a 10 kHz timer
//! whose handler calls the function the main loop calls): counts stay
//! exact. A signal that lands inside a counter update the engine makes with
//! a load, an increment and a store (a block whose flags are live all
//! through) is delivered as if before the load, so the handler's runs of
//! the same block are not lost to the store of the stale value (issue 9).
//! How many signals arrive depends on speed, under any tool; the fixture
//! prints how many calls its function got, and the Ir of each function per
//! call must be Valgrind's on the same work without the timer.

mod run_support;

use std::collections::BTreeMap;
use std::path::Path;

use run_support::{
    calls_and_functions, compile, counted_runs, require, under_cachescope, under_valgrind, End,
    TempDir,
};

/// Calls of `unit` without the timer.
const QUIET_CALLS: u64 = 3_000_000;

/// Ir per function of `timer.c`, and the calls of `unit` it printed.
fn counts(out: &Path, stdout: &[u8]) -> (BTreeMap<String, u64>, u64) {
    calls_and_functions(out, stdout, "timer.c")
}

#[test]
fn a_10khz_timer_loses_no_counts() {
    require("gcc");
    require("valgrind");
    let dir = TempDir::new("timer");
    let exe = dir.join("timer");
    compile("gcc", &["-O2", "-g"], "timer.c", &exe);

    // The Ir per call of each function, from Valgrind on the quiet run.
    let vg_out = dir.join("vg.out");
    let opt = format!("--cachegrind-out-file={}", vg_out.display());
    let vg = under_valgrind(dir.path(), &[&opt], exe.as_os_str(), &["quiet"], None);
    let (vg_fns, vg_calls) = counts(&vg_out, &vg.stdout);
    assert_eq!(vg_calls, QUIET_CALLS);
    let per_call = vg_fns["unit"] / QUIET_CALLS;
    assert_eq!(per_call * QUIET_CALLS, vg_fns["unit"], "{vg_fns:?}");

    // Valgrind with the timer: `main` (which does not depend on the
    // signals) as a reference.
    let vg_timer_out = dir.join("vg-timer.out");
    let opt = format!("--cachegrind-out-file={}", vg_timer_out.display());
    let vg_timer = under_valgrind(dir.path(), &[&opt], exe.as_os_str(), &[], None);
    let (vg_timer_fns, _) = counts(&vg_timer_out, &vg_timer.stdout);

    // Quiet: every function as Valgrind counts it.
    let quiet_out = dir.join("quiet.out");
    let opt = format!("--cachegrind-out-file={}", quiet_out.display());
    let quiet = under_cachescope(dir.path(), &["-q", &opt], exe.as_os_str(), &["quiet"], None);
    assert_eq!(quiet.end, End::Code(0), "{}", quiet.stderr_text());
    let (quiet_fns, _) = counts(&quiet_out, &quiet.stdout);
    assert_eq!(quiet_fns, vg_fns);

    // With the timer: `unit` exactly per_call times the calls it got (main's
    // and the handlers'), the handler's own code twice per signal (a move
    // and the tail jump to `unit`), `main` as Valgrind counts it.
    for (run, (fns, calls)) in counted_runs(&dir, &exe, &[], "timer.c", 3)
        .into_iter()
        .enumerate()
    {
        let signals = calls - QUIET_CALLS;
        assert!(signals > 100, "only {signals} timer signals in run {run}");
        assert_eq!(
            fns["unit"],
            per_call * calls,
            "run {run}: {signals} signals"
        );
        assert_eq!(fns["on_tick"], 2 * signals, "run {run}");
        assert_eq!(fns["main"], vg_timer_fns["main"], "run {run}");
    }
}
