//! Threads meeting the process lifecycle (`fixtures/engine/thread_lifecycle.c`,
//! the cases of Valgrind's `pth_term_signal`, `pth_self_kill_15_other` and
//! `threaded-fork`, an exec from a thread and a signal sent to a thread just
//! before its action changes, issue 9): the same output and
//! exit as natively, every time, no hang, and a profile of what ran even when
//! a signal ends the process.

mod run_support;

use std::time::{Duration, Instant};

use run_support::{compile, native, require, under_cachescope, CgOut, End, TempDir};

/// Runs of each mode (the races were lost about half the time).
const RUNS: usize = 5;

/// SIGTERM's number on Linux.
const SIGTERM: i32 = 15;

#[test]
fn threads_meet_exit_signals_fork_and_exec_as_natively() {
    require("gcc");
    let dir = TempDir::new("thread-lifecycle");
    let exe = dir.join("thread_lifecycle");
    compile(
        "gcc",
        &["-O1", "-g", "-pthread"],
        "thread_lifecycle.c",
        &exe,
    );
    let modes = [
        "kill-group",
        "exit-group",
        "fork-thread",
        "exec-thread",
        "kill-then-default",
    ];
    for mode in modes {
        let expected_end = match mode {
            "kill-group" => End::Signal(SIGTERM),
            "exit-group" => End::Code(7),
            "kill-then-default" => End::Code(3),
            _ => End::Code(0),
        };
        // kill-then-default is a race natively too, which the signalled
        // thread wins unless the machine is too busy to wake it at once:
        // a few tries to see the native behaviour.
        let nat = (0..20)
            .map(|_| native(dir.path(), exe.as_os_str(), &[mode], None))
            .find(|nat| nat.end == expected_end)
            .unwrap_or_else(|| panic!("{mode} natively never ended as {expected_end:?}"));
        for run in 0..RUNS {
            let out = dir.join(&format!("{mode}-{run}.out"));
            let opt = format!("--cachegrind-out-file={}", out.display());
            let started = Instant::now();
            let cs = under_cachescope(dir.path(), &["-q", &opt], exe.as_os_str(), &[mode], None);
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "{mode} run {run}: took {:?}",
                started.elapsed()
            );
            assert_eq!(cs.end, nat.end, "{mode} run {run}: {}", cs.stderr_text());
            assert_eq!(cs.stdout, nat.stdout, "{mode} run {run}: stdout");
            if mode != "exec-thread" {
                let profile = CgOut::read(&out);
                assert!(
                    profile
                        .functions_in("thread_lifecycle.c")
                        .contains_key("main"),
                    "{mode} run {run}: main not in the profile"
                );
            }
        }
    }
}
