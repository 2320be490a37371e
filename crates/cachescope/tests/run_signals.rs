//! End-to-end: no run loses its profile. A client killed by a signal (its
//! own fault, abort, or a signal sent to the process the caller started,
//! or to the whole process group) still gets its profile written and its
//! summary printed, and the caller sees it end as natively, as under
//! Valgrind: the process the caller started is the client. Signals reach
//! the client once, with their real sender.

mod run_support;

use std::io::{BufRead, BufReader, Read};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use nix::sys::signal::{kill, killpg, Signal};
use nix::unistd::Pid;
use run_support::*;

/// Compiles the lifecycle fixture into `dir`.
fn lifecycle(dir: &TempDir) -> PathBuf {
    let exe = dir.join("lifecycle");
    compile("gcc", &["-g", "-O1"], "lifecycle.c", &exe);
    exe
}

/// A started run: the child (in a process group of its own, as a shell
/// starts a job) and its stdout, read line by line.
struct Started {
    child: Child,
    out: BufReader<std::process::ChildStdout>,
}

impl Started {
    /// Starts `cmd` in `cwd` in a new process group.
    fn new(mut cmd: Command, cwd: &Path) -> Started {
        cmd.current_dir(cwd)
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().unwrap();
        let out = BufReader::new(child.stdout.take().unwrap());
        Started { child, out }
    }

    /// Reads the next line of stdout (panics at end of file).
    fn line(&mut self) -> String {
        let mut l = String::new();
        assert!(self.out.read_line(&mut l).unwrap() > 0, "stdout ended");
        l
    }

    fn pid(&self) -> Pid {
        Pid::from_raw(self.child.id() as i32)
    }

    /// Waits for the end; returns it with the rest of stdout and stderr.
    fn finish(mut self) -> (End, String, String) {
        let mut rest = String::new();
        self.out.read_to_string(&mut rest).unwrap();
        let mut err = String::new();
        self.child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut err)
            .unwrap();
        let status = self.child.wait().unwrap();
        let end = Run::from(std::process::Output {
            status,
            stdout: Vec::new(),
            stderr: Vec::new(),
        })
        .end;
        (end, rest, err)
    }
}

fn under_cs(exe: &Path, args: &[&str], out_file: &str) -> Command {
    let mut c = Command::new(cachescope());
    c.arg(format!("--cachegrind-out-file={out_file}"))
        .arg(exe)
        .args(args);
    c
}

/// The run's single profile, checked complete: it parses, its summary is
/// the sum of its lines, `func` in the fixture has counts, and the summary
/// on stderr shows the same total.
fn check_profile(dir: &TempDir, out_file: &str, func: &str, stderr: &str) {
    let o = CgOut::read(&dir.join(out_file));
    assert_eq!(o.total(), o.summary);
    let f = o.functions_in("lifecycle.c");
    assert!(f.get(func).is_some_and(|&n| n > 100_000), "{f:?}");
    let shown = stderr
        .lines()
        .find_map(|l| l.split_once("== I refs:"))
        .map(|(_, n)| n.trim().replace(',', ""))
        .unwrap_or_else(|| panic!("no summary on stderr:\n{stderr}"));
    assert_eq!(shown.parse::<u64>().unwrap(), o.summary, "{stderr}");
    // Written through a temporary file and a rename: nothing else is left.
    let names: Vec<String> = std::fs::read_dir(&dir.0)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with('.'))
        .collect();
    assert!(names.is_empty(), "{names:?}");
}

#[test]
fn sigint_to_the_process_group_kills_the_client_and_keeps_its_profile() {
    let dir = TempDir::new("sigint-group");
    let exe = lifecycle(&dir);
    let mut native = Started::new(Command::new(&exe), &dir.0);
    assert_eq!(native.line(), "ready\n");
    killpg(native.pid(), Signal::SIGINT).unwrap();
    assert_eq!(native.finish().0, End::Signal(2));

    let mut run = Started::new(under_cs(&exe, &[], "cg.out"), &dir.0);
    assert_eq!(run.line(), "ready\n");
    // As a terminal's Ctrl-C: to cachescope and the client alike.
    killpg(run.pid(), Signal::SIGINT).unwrap();
    let (end, _, err) = run.finish();
    assert_eq!(end, End::Signal(2), "{err}");
    check_profile(&dir, "cg.out", "spin", &err);
}

#[test]
fn sigterm_to_cachescope_alone_reaches_the_client() {
    // As `timeout` or `kill` do: they know only cachescope's pid.
    let dir = TempDir::new("sigterm-tool");
    let exe = lifecycle(&dir);
    let mut run = Started::new(under_cs(&exe, &[], "cg.out"), &dir.0);
    assert_eq!(run.line(), "ready\n");
    kill(run.pid(), Signal::SIGTERM).unwrap();
    let (end, _, err) = run.finish();
    assert_eq!(end, End::Signal(15), "{err}");
    check_profile(&dir, "cg.out", "spin", &err);
}

#[test]
fn other_signals_sent_to_cachescope_reach_the_client_too() {
    for (sig, n) in [
        (Signal::SIGHUP, 1),
        (Signal::SIGQUIT, 3),
        (Signal::SIGUSR1, 10),
    ] {
        let dir = TempDir::new("forward");
        let exe = lifecycle(&dir);
        let mut run = Started::new(under_cs(&exe, &["-q"], "cg.out"), &dir.0);
        assert_eq!(run.line(), "ready\n");
        kill(run.pid(), sig).unwrap();
        let (end, _, err) = run.finish();
        assert_eq!(end, End::Signal(n), "{sig}: {err}");
        let o = CgOut::read(&dir.join("cg.out"));
        assert!(o.functions_in("lifecycle.c")["spin"] > 100_000, "{sig}");
    }
}

#[test]
fn a_handled_sigterm_ends_as_the_handler_says() {
    let dir = TempDir::new("handled");
    let exe = lifecycle(&dir);
    let mut run = Started::new(under_cs(&exe, &["term3"], "cg.out"), &dir.0);
    assert_eq!(run.line(), "ready\n");
    kill(run.pid(), Signal::SIGTERM).unwrap();
    let (end, _, err) = run.finish();
    assert_eq!(end, End::Code(3), "{err}");
    check_profile(&dir, "cg.out", "spin", &err);
}

#[test]
fn a_group_signal_reaches_the_client_once_from_its_sender() {
    // SIGINT to the group must reach the client once, sent by us, as
    // natively (the tracer, in a session of its own, is not in the group).
    let me = std::process::id();
    let expect = format!("signal 2 from {me}\n");
    for under in [false, true] {
        let dir = TempDir::new("once");
        let exe = lifecycle(&dir);
        let cmd = if under {
            under_cs(&exe, &["count"], "cg.out")
        } else {
            let mut c = Command::new(&exe);
            c.arg("count");
            c
        };
        let mut run = Started::new(cmd, &dir.0);
        assert_eq!(run.line(), "ready\n");
        for _ in 0..3 {
            killpg(run.pid(), Signal::SIGINT).unwrap();
            assert_eq!(run.line(), expect, "under cachescope: {under}");
        }
        // And once sent to the process we started alone.
        kill(run.pid(), Signal::SIGINT).unwrap();
        assert_eq!(run.line(), expect, "under cachescope: {under}");
        kill(run.pid(), Signal::SIGTERM).unwrap();
        let (end, rest, err) = run.finish();
        assert_eq!(end, End::Code(3), "{err}");
        assert_eq!(
            rest, "",
            "a signal delivered twice (under cachescope: {under})"
        );
        if under {
            check_profile(&dir, "cg.out", "spin", &err);
        }
    }
}

#[test]
fn faults_and_aborts_keep_the_profile_and_the_signal() {
    for (mode, sig) in [("segv", 11), ("abort", 6)] {
        let dir = TempDir::new(mode);
        let exe = lifecycle(&dir);
        let nat = native(&dir.0, exe.as_os_str(), &[mode], None);
        assert_eq!(nat.end, End::Signal(sig));
        let r: Run = under_cs(&exe, &[mode], "cg.out")
            .current_dir(&dir.0)
            .stdin(Stdio::null())
            .output()
            .unwrap()
            .into();
        assert_eq!(r.end, End::Signal(sig), "{mode}: {}", r.stderr_text());
        check_profile(&dir, "cg.out", "work", &r.stderr_text());
    }
}
