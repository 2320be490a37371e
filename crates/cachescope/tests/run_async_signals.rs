//! Asynchronous signals are delivered at the client's own addresses (issue
//! 9): a handler that reads the interrupted RIP from its `ucontext` finds
//! it inside the function that was running, `backtrace()` from the handler
//! goes through it, a handler that sends the interrupted code elsewhere
//! does so as natively, and counts stay exact (the interrupted execution of
//! a block counts what ran before the signal; the rest counts when it goes
//! on). `fixtures/engine/async_signals.c` checks addresses itself, with the
//! bounds of its own functions, and prints one line that does not depend on
//! timing, which must be the native one.

mod run_support;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use run_support::{
    calls_and_functions, compile, counted_runs, native, require, under_cachescope,
    under_cachescope_env, End, TempDir,
};

/// Builds the fixture in `dir`.
fn build(dir: &TempDir) -> std::path::PathBuf {
    require("gcc");
    let exe = dir.join("async_signals");
    compile("gcc", &["-O2", "-g"], "async_signals.c", &exe);
    exe
}

/// Runs mode `mode` natively and under cachescope: same stdout, both
/// successful; returns the stdout.
fn same_as_native(mode: &str) -> String {
    let dir = TempDir::new(&format!("async-{mode}"));
    let exe = build(&dir);
    let n = native(dir.path(), exe.as_os_str(), &[mode], None);
    assert_eq!(n.end, End::Code(0), "native {mode}: {}", n.stderr_text());
    let out = dir.join("cg.out");
    let opt = format!("--cachegrind-out-file={}", out.display());
    let r = under_cachescope(dir.path(), &["-q", &opt], exe.as_os_str(), &[mode], None);
    assert_eq!(
        String::from_utf8_lossy(&r.stdout),
        String::from_utf8_lossy(&n.stdout),
        "{mode}: {}",
        r.stderr_text()
    );
    assert_eq!(r.end, End::Code(0), "{mode}: {}", r.stderr_text());
    String::from_utf8_lossy(&r.stdout).into_owned()
}

#[test]
fn a_timer_handler_sees_the_interrupted_functions_address() {
    let out = same_as_native("rip");
    assert_eq!(out, "300 signals or more: inside spin all\n");
}

#[test]
fn backtrace_from_a_timer_handler_includes_the_interrupted_function() {
    let out = same_as_native("backtrace");
    assert_eq!(
        out,
        "300 signals or more: inside spin all, spin in backtrace all\n"
    );
}

#[test]
fn a_handler_that_sets_the_interrupted_rip_sends_the_code_there() {
    let out = same_as_native("redirect");
    assert_eq!(out, "recovered in recover, from spin: yes\n");
}

#[test]
fn a_raised_signals_handler_sees_the_address_in_libc() {
    let out = same_as_native("raise");
    assert_eq!(out, "raised 20000: handler in libc 20000, elsewhere 0\n");
}

/// Ir per function of the fixture's `count` mode, and the calls of `unit`
/// it printed.
fn counts(out: &Path, stdout: &[u8]) -> (BTreeMap<String, u64>, u64) {
    calls_and_functions(out, stdout, "async_signals.c")
}

/// Runs the `count` mode (with `quiet`: no timer) under Valgrind.
fn valgrind_counts(dir: &TempDir, exe: &Path, name: &str, quiet: bool) -> BTreeMap<String, u64> {
    let out = dir.join(name);
    let mut c = Command::new("valgrind");
    c.args(["--tool=cachegrind", "--cache-sim=no", "-q"])
        .arg(format!("--cachegrind-out-file={}", out.display()))
        .arg(exe)
        .arg("count");
    if quiet {
        c.arg("quiet");
    }
    let r = c.output().expect("run valgrind");
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    counts(&out, &r.stdout).0
}

#[test]
fn counts_stay_exact_when_signals_land_anywhere_in_a_function() {
    require("valgrind");
    let dir = TempDir::new("async-count");
    let exe = build(&dir);
    const CALLS: u64 = 3_000_000;
    // Ir per call of `unit` (a loop and a `rep stosb`), from Valgrind
    // without the timer; `main` with it.
    let quiet = valgrind_counts(&dir, &exe, "vg-quiet.out", true);
    let per_call = quiet["unit"] / CALLS;
    assert_eq!(per_call * CALLS, quiet["unit"], "{quiet:?}");
    let vg_timer = valgrind_counts(&dir, &exe, "vg-timer.out", false);
    let vg_signals = vg_timer["unit"] / per_call - CALLS;
    assert!(vg_signals > 0, "no timer signal under Valgrind");
    let vg_per_signal = vg_timer["on_tick_count"] / vg_signals;
    assert_eq!(vg_per_signal * vg_signals, vg_timer["on_tick_count"]);

    let q_out = dir.join("quiet.out");
    let opt = format!("--cachegrind-out-file={}", q_out.display());
    let q = under_cachescope(
        dir.path(),
        &["-q", &opt],
        exe.as_os_str(),
        &["count", "quiet"],
        None,
    );
    assert_eq!(q.end, End::Code(0), "{}", q.stderr_text());
    assert_eq!(counts(&q_out, &q.stdout).0, quiet);

    // With the timer: `unit` exactly per_call times the calls it got (main's
    // and the handlers'), the handler's own code as many instructions per
    // signal as under Valgrind (it reads its context and tail-calls
    // `unit`), `main` as Valgrind counts it.
    let runs = counted_runs(&dir, &exe, &["count"], "async_signals.c", 3);
    for (run, (fns, calls)) in runs.into_iter().enumerate() {
        let signals = calls - CALLS;
        assert!(signals > 100, "only {signals} timer signals in run {run}");
        assert_eq!(
            fns["unit"],
            per_call * calls,
            "run {run}: {signals} signals"
        );
        assert_eq!(fns["main"], vg_timer["main"], "run {run}");
        assert_eq!(
            fns["on_tick_count"],
            vg_per_signal * signals,
            "run {run}: the handler's Ir per signal is Valgrind's"
        );
    }
}

/// Signals that arrive while the tool works in a thread (an injection, a
/// single step, a syscall it runs) reach the handler as they were sent:
/// `fixtures/engine/siginfo_timer.c` counts deliveries of its POSIX timer
/// whose `si_code` is not `SI_TIMER` (thousands per run when the tool
/// re-sent held signals with `tgkill`; it now sends them again with their
/// siginfo, `sys::resend_signal`).
#[test]
fn held_signals_keep_their_siginfo() {
    require("gcc");
    let dir = TempDir::new("siginfo-timer");
    let exe = dir.join("siginfo_timer");
    compile("gcc", &["-O1", "-g", "-pthread"], "siginfo_timer.c", &exe);
    let nat = native(dir.path(), exe.as_os_str(), &[], None);
    assert_eq!(nat.end, End::Code(0));
    assert_eq!(String::from_utf8_lossy(&nat.stdout), "wrong 0 of some\n");
    // Counting mode, then Callgrind's tagged counting and contexts mode,
    // where a signal that lands in the runtime waits for the thread to
    // leave it (and others that arrive meanwhile are sent again).
    let callgrind = ["-q", "--tool=callgrind", "--callgrind-out-file=/dev/null"];
    let contexts = [&callgrind[..], &["--client-contexts=yes"]].concat();
    let modes: [(&[&str], u32); 3] = [
        (&["-q", "--cachegrind-out-file=/dev/null"], 3),
        (&callgrind, 2),
        (&contexts, 2),
    ];
    for (args, runs) in modes {
        for run in 0..runs {
            let r = under_cachescope(dir.path(), args, exe.as_os_str(), &[], None);
            assert_eq!(
                r.end,
                End::Code(0),
                "{args:?} run {run}: {}",
                r.stderr_text()
            );
            assert_eq!(r.stdout, nat.stdout, "{args:?} run {run}");
        }
    }
}

/// Signals sent with `kill` and `tgkill` (`fixtures/engine/siginfo_kill.c`)
/// reach the handler with their sender's `si_pid`, `si_uid` and `si_code`,
/// also when the tool held one back and sent it again: the kernel lets it
/// send those only as its own `tgkill`, so their siginfo is given back at
/// their delivery. `CACHESCOPE_ENGINE_RESEND_SIGNALS` makes every one go
/// that way (otherwise a few per run do); without the siginfo given back,
/// every one of them came from the tool's pid.
#[test]
fn resent_signals_keep_their_sender() {
    require("gcc");
    let dir = TempDir::new("siginfo-kill");
    let exe = dir.join("siginfo_kill");
    compile("gcc", &["-O1", "-g", "-pthread"], "siginfo_kill.c", &exe);
    let nat = native(dir.path(), exe.as_os_str(), &[], None);
    assert_eq!(nat.end, End::Code(0));
    assert_eq!(String::from_utf8_lossy(&nat.stdout), "wrong 0 of 2000\n");
    let counting = ["-q", "--cachegrind-out-file=/dev/null"];
    let callgrind = ["-q", "--tool=callgrind", "--callgrind-out-file=/dev/null"];
    let stream = [&callgrind[..], &["--client-contexts=no"]].concat();
    let resend = [("CACHESCOPE_ENGINE_RESEND_SIGNALS", "1")];
    for args in [&counting[..], &callgrind[..], &stream[..]] {
        for env in [&[][..], &resend[..]] {
            let r = under_cachescope_env(dir.path(), args, exe.as_os_str(), &[], None, env);
            assert_eq!(r.end, End::Code(0), "{args:?} {env:?}: {}", r.stderr_text());
            assert_eq!(
                String::from_utf8_lossy(&r.stdout),
                "wrong 0 of 2000\n",
                "{args:?} {env:?}"
            );
        }
    }
}
