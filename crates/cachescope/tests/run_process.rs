//! End-to-end: the process model. The process the caller started is the
//! client, as under Valgrind: one pid for the banner, `--log-file=%p`,
//! `cachegrind.out.%p` and the program's own `getpid()`; the program's
//! parent is the caller (a readiness signal to `getppid()` reaches it), its
//! children's parent is the program, and a caller that waits for it finds
//! its profile and summary complete the moment the wait returns, while a
//! daemon it leaves behind does not hold that wait. A vfork child is a
//! process of its own, with its own profile, as under Valgrind. A child
//! that outlives its parent runs on correctly after the parent's memory
//! files were emptied at its exit.

mod run_support;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use run_support::*;

/// Compiles fixture `name`.c into `dir`.
fn build(dir: &TempDir, name: &str) -> PathBuf {
    let exe = dir.join(name);
    compile("gcc", &["-g", "-O1"], &format!("{name}.c"), &exe);
    exe
}

/// The first number after `key` in `text`.
fn number_after(text: &str, key: &str) -> i32 {
    let at = text
        .find(key)
        .unwrap_or_else(|| panic!("no {key:?} in {text:?}"));
    text[at + key.len()..]
        .split(|c: char| !c.is_ascii_digit())
        .find(|w| !w.is_empty())
        .unwrap()
        .parse()
        .unwrap()
}

/// Starts `exe` (procmodel) in `mode` under cachescope, quiet, writing
/// `cg.<pid>` profiles in `dir`, with no standard streams.
fn spawn_quiet(dir: &TempDir, exe: &Path, mode: &str) -> std::process::Child {
    Command::new(cachescope())
        .args(["-q", "--cachegrind-out-file=cg.%p"])
        .arg(exe)
        .arg(mode)
        .current_dir(&dir.0)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

/// Waits (20 s at most) until `dir` holds `n` profiles (`cg.<pid>`; one
/// being written is a hidden temporary file until it is whole) and
/// returns them; `what` names the late one in the failure.
fn wait_for_profiles(dir: &TempDir, n: usize, what: &str) -> Vec<PathBuf> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let profiles = files_with_prefix(&dir.0, "cg.");
        if profiles.len() >= n {
            return profiles;
        }
        assert!(Instant::now() < deadline, "no profile of the {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn banner_log_file_output_file_and_the_program_name_one_pid() {
    let dir = TempDir::new("onepid");
    let exe = build(&dir, "procmodel");
    let child = Command::new(cachescope())
        .args(["--log-file=log.%p", "--cachegrind-out-file=cg.%p"])
        .arg(&exe)
        .arg("pids")
        .current_dir(&dir.0)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id() as i32;
    let out = child.wait_with_output().unwrap();
    let r = Run::from(out);
    assert_eq!(r.end, End::Code(5), "{}", r.stderr_text());
    let stdout = String::from_utf8(r.stdout.clone()).unwrap();
    // The program's pid is the one our spawn returned, its parent is us,
    // and its child's parent is the program.
    assert_eq!(number_after(&stdout, "pid "), pid, "{stdout}");
    assert_eq!(
        number_after(&stdout, "ppid "),
        std::process::id() as i32,
        "{stdout}"
    );
    assert_eq!(number_after(&stdout, "child's parent "), pid, "{stdout}");
    // The log file is named with that pid, and every message of the
    // program's process (banner and summary) carries it.
    let log = std::fs::read_to_string(dir.join(&format!("log.{pid}")))
        .unwrap_or_else(|e| panic!("log.{pid}: {e}; stderr {}", r.stderr_text()));
    let banner = log.lines().next().unwrap();
    assert!(
        banner.starts_with(&format!("=={pid}== Cachescope-")),
        "{log}"
    );
    assert!(log.contains(&format!("=={pid}== Command: ")), "{log}");
    assert!(
        log.contains(&format!("=={pid}== Parent PID: {}\n", std::process::id())),
        "{log}"
    );
    assert!(log.contains(&format!("=={pid}== I refs:")), "{log}");
    // The forked child's summary carries its own pid, and each process
    // has its profile.
    let kid = log
        .lines()
        .filter(|l| l.contains("I refs:"))
        .map(|l| number_after(l, "=="))
        .find(|&p| p != pid)
        .unwrap_or_else(|| panic!("no summary of the child:\n{log}"));
    let o = CgOut::read(&dir.join(&format!("cg.{pid}")));
    assert!(o.functions_in("procmodel.c")["work"] > 100_000);
    assert_eq!(o.total(), o.summary);
    let o = CgOut::read(&dir.join(&format!("cg.{kid}")));
    assert_eq!(o.total(), o.summary);
}

#[test]
fn a_readiness_signal_to_the_parent_reaches_the_parent() {
    let dir = TempDir::new("notify");
    let exe = build(&dir, "procmodel");
    let waiter = build(&dir, "waiter");
    let copy = dir.join("copy");
    let run = |under: bool| -> String {
        let mut c = Command::new(&waiter);
        c.arg(&copy).arg(dir.join("cg.%p"));
        if under {
            c.arg(cachescope()).arg("--cachegrind-out-file=cg.%p");
        }
        let o = c
            .arg(&exe)
            .arg("notify")
            .current_dir(&dir.0)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(o.status.success());
        String::from_utf8(o.stdout).unwrap()
    };
    let native = run(false);
    assert!(native.ends_with("exited 0, usr1 1\n"), "{native}");
    let under = run(true);
    assert!(under.ends_with("exited 0, usr1 1\n"), "{under}");
}

#[test]
fn a_parent_that_waits_finds_the_profile_complete() {
    let dir = TempDir::new("waits");
    let exe = build(&dir, "procmodel");
    let waiter = build(&dir, "waiter");
    let copy = dir.join("copy");
    for round in 0..5 {
        let _ = std::fs::remove_file(&copy);
        let err = dir.join("stderr");
        let o = Command::new(&waiter)
            .arg(&copy)
            .arg(dir.join("cg.%p"))
            .arg(cachescope())
            .arg("--cachegrind-out-file=cg.%p")
            .arg(&exe)
            .arg("pids")
            .current_dir(&dir.0)
            .stdin(Stdio::null())
            .stderr(std::fs::File::create(&err).unwrap())
            .output()
            .unwrap();
        let stdout = String::from_utf8(o.stdout).unwrap();
        let pid = number_after(&stdout, "child ");
        assert!(
            stdout.ends_with(&format!("child {pid} exited 5, usr1 0\n")),
            "{stdout}"
        );
        // What the waiter copied the moment its wait returned is the whole
        // profile, and the summary was on stderr by then too (the waiter
        // printed after both).
        let snap = CgOut::read(&copy);
        let last = CgOut::read(&dir.join(&format!("cg.{pid}")));
        assert_eq!(snap.summary, last.summary, "round {round}");
        assert_eq!(snap.costs, last.costs, "round {round}");
        let stderr = std::fs::read_to_string(&err).unwrap();
        assert!(stderr.contains(&format!("=={pid}== I refs:")), "{stderr}");
    }
}

#[test]
fn a_daemon_left_behind_does_not_hold_the_callers_wait() {
    let dir = TempDir::new("daemon");
    let exe = build(&dir, "procmodel");
    let started = Instant::now();
    let mut child = spawn_quiet(&dir, &exe, "daemon");
    let pid = child.id();
    let status = child.wait().unwrap();
    let waited = started.elapsed();
    assert!(status.success());
    // The daemon sleeps two seconds; the program itself ends at once.
    assert!(waited < Duration::from_millis(1500), "waited {waited:?}");
    let o = CgOut::read(&dir.join(&format!("cg.{pid}")));
    assert!(o.functions_in("procmodel.c")["work"] > 100_000);
    // The daemon's own profile follows when it ends.
    wait_for_profiles(&dir, 2, "daemon");
}

#[test]
fn job_control_stops_and_continues_the_program() {
    use nix::sys::signal::{kill, Signal};
    use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
    use nix::unistd::Pid;
    use std::io::BufRead;
    let dir = TempDir::new("jobctl");
    let exe = dir.join("lifecycle");
    compile("gcc", &["-g", "-O1"], "lifecycle.c", &exe);
    let mut child = Command::new(cachescope())
        .args(["-q", "--cachegrind-out-file=cg.out"])
        .arg(&exe)
        .current_dir(&dir.0)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line, "ready\n");
    let pid = Pid::from_raw(child.id() as i32);
    // CPU time of the program's process, from /proc.
    let utime = || -> u64 {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
        let after = &stat[stat.rfind(')').unwrap() + 2..];
        after.split(' ').nth(11).unwrap().parse().unwrap()
    };
    // As a shell's Ctrl-Z: the shell's wait reports the stop, and the
    // program no longer runs. SIGSTOP rather than the terminal's SIGTSTP:
    // the kernel discards SIGTSTP sent to an orphaned process group, which
    // the test's is when the suite runs detached (as in CI).
    kill(pid, Signal::SIGSTOP).unwrap();
    assert_eq!(
        waitpid(pid, Some(WaitPidFlag::WUNTRACED)).unwrap(),
        WaitStatus::Stopped(pid, Signal::SIGSTOP)
    );
    let before = utime();
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(utime(), before, "the stopped program ran");
    // As `fg`: it runs again.
    kill(pid, Signal::SIGCONT).unwrap();
    assert_eq!(
        waitpid(pid, Some(WaitPidFlag::WCONTINUED)).unwrap(),
        WaitStatus::Continued(pid)
    );
    let before = utime();
    let deadline = Instant::now() + Duration::from_secs(10);
    while utime() == before {
        assert!(
            Instant::now() < deadline,
            "the continued program does not run"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    kill(pid, Signal::SIGTERM).unwrap();
    let r = Run::from(std::process::Output {
        status: child.wait().unwrap(),
        stdout: Vec::new(),
        stderr: Vec::new(),
    });
    assert_eq!(r.end, End::Signal(15));
    let o = CgOut::read(&dir.join("cg.out"));
    assert!(o.functions_in("lifecycle.c")["spin"] > 100_000);
}

/// The profiles named `prefix.PID` in `dir`: the fixture's functions of
/// each, keyed by whether the process ran `child_work`.
fn vfork_profiles(dir: &TempDir, prefix: &str) -> Vec<std::collections::BTreeMap<String, u64>> {
    let mut found: Vec<_> = std::fs::read_dir(&dir.0)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| {
            n.strip_prefix(prefix)
                .and_then(|p| p.strip_prefix('.'))
                .is_some_and(|p| p.parse::<u32>().is_ok())
        })
        .map(|n| CgOut::read(&dir.join(&n)).functions_in("vfork.c"))
        .collect();
    found.sort_by_key(|f| f.contains_key("child_work"));
    found
}

#[test]
fn a_vfork_child_has_its_own_counts_and_profile_as_under_valgrind() {
    require("valgrind");
    let dir = TempDir::new("vfork");
    let exe = build(&dir, "vfork");
    let nat = native(&dir.0, exe.as_os_str(), &[], None);
    let r = under_cachescope(
        &dir.0,
        &["-q", "--cachegrind-out-file=cs.%p"],
        exe.as_os_str(),
        &[],
        None,
    );
    assert_eq!(r.stdout, nat.stdout, "{}", r.stderr_text());
    assert_eq!(r.end, nat.end);
    let vg = under_valgrind(
        &dir.0,
        &["--cachegrind-out-file=vg.%p"],
        exe.as_os_str(),
        &[],
        None,
    );
    assert_eq!(vg.stdout, nat.stdout);
    let (ours, theirs) = (vfork_profiles(&dir, "cs"), vfork_profiles(&dir, "vg"));
    assert_eq!(theirs.len(), 2, "Valgrind writes one profile per process");
    assert_eq!(ours.len(), 2, "{}", r.stderr_text());
    // The parent's profile has none of the child's work, the child's has
    // it; per function of the fixture, the counts are Valgrind's.
    assert!(!ours[0].contains_key("child_work"), "{:?}", ours[0]);
    assert!(ours[1]["child_work"] > 300_000, "{:?}", ours[1]);
    assert_eq!(ours, theirs);
    // posix_spawn's clone(CLONE_VM | CLONE_VFORK) child, which execs.
    let nat = native(&dir.0, exe.as_os_str(), &["spawn"], None);
    let r = under_cachescope(&dir.0, &["-q"], exe.as_os_str(), &["spawn"], None);
    assert_eq!(r.stdout, nat.stdout, "{}", r.stderr_text());
    assert_eq!(r.end, nat.end);
}

/// A child that goes on after its parent's exit runs code translated
/// before the fork, in code-cache pages the parent shared with the tool and
/// emptied at its exit (`Space::discard_shared`): the child has its own
/// copy of each (`Space::fork_copy`), so its counts are right. It inherits
/// the parent's count of `work` (one call) and adds two calls of its own.
#[test]
fn an_orphan_runs_on_after_its_parent_emptied_its_code_cache() {
    let dir = TempDir::new("orphan");
    let exe = build(&dir, "procmodel");
    let status = spawn_quiet(&dir, &exe, "orphan").wait().unwrap();
    assert!(status.success());
    let mut work: Vec<u64> = wait_for_profiles(&dir, 2, "orphan")
        .iter()
        .map(|p| CgOut::read(p).functions_in("procmodel.c")["work"])
        .collect();
    work.sort();
    assert!(work[0] > 100_000, "{work:?}");
    assert_eq!(work[1], 3 * work[0], "{work:?}");
}
