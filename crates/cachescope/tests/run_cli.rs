//! End-to-end: the run mode's command line, messages, output file naming
//! and exit status, as Valgrind behaves (spec §5.1, §6).

mod run_support;

use std::ffi::OsStr;
use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Stdio};

use run_support::*;

fn cs(dir: &TempDir, args: &[&str]) -> Run {
    let mut c = Command::new(cachescope());
    c.args(args).current_dir(&dir.0).stdin(Stdio::null());
    c.output().unwrap().into()
}

fn lines(text: &str) -> Vec<&str> {
    text.lines().collect()
}

#[test]
fn usage_errors_read_like_valgrind() {
    let dir = TempDir::new("usage");
    let r = cs(&dir, &["--foo", "true"]);
    assert_eq!(r.end, End::Code(1));
    assert_eq!(
        lines(&r.stderr_text()),
        [
            "cachescope: Unknown option: --foo",
            "cachescope: Use --help for more information or consult the user manual."
        ]
    );
    let r = cs(&dir, &[]);
    assert_eq!(r.end, End::Code(1));
    assert_eq!(
        lines(&r.stderr_text()),
        [
            "cachescope: no program specified",
            "cachescope: Use --help for more information."
        ]
    );
    let r = cs(&dir, &["--D1=1000,2,64", "true"]);
    assert_eq!(r.end, End::Code(1));
    assert_eq!(
        lines(&r.stderr_text())[0],
        "cachescope: Cache set count is not a power of two."
    );
    let r = cs(&dir, &["--version"]);
    assert_eq!(r.end, End::Code(0));
    assert!(String::from_utf8_lossy(&r.stdout).starts_with("cachescope-"));
    let r = cs(&dir, &["--help"]);
    assert_eq!(r.end, End::Code(0));
    assert!(String::from_utf8_lossy(&r.stdout).contains("--cachegrind-out-file"));
}

#[test]
fn unrunnable_programs_give_one_clear_line() {
    let dir = TempDir::new("unrunnable");
    let text = dir.join("notelf");
    std::fs::write(&text, "just text\n").unwrap();
    std::fs::set_permissions(&text, std::fs::Permissions::from_mode(0o755)).unwrap();
    let plain = dir.join("plain");
    std::fs::write(&plain, "x").unwrap();
    for (prog, quiet) in [
        ("no-such-program-anywhere", "-q"),
        ("./missing", "-v"),
        ("./notelf", "-q"),
        ("./plain", "-q"),
        ("./notelf", "--tool=cachegrind"),
    ] {
        // No preamble either, as Valgrind prints only the error.
        let r = cs(&dir, &[quiet, prog]);
        assert_ne!(r.end, End::Code(0), "{prog}");
        let err = r.stderr_text();
        assert_eq!(err.lines().count(), 1, "{prog}: {err}");
        assert!(
            err.starts_with("cachescope: ") && err.contains(prog),
            "{prog}: {err}"
        );
    }
    assert!(std::fs::read_dir(&dir.0).unwrap().all(|e| !e
        .unwrap()
        .file_name()
        .to_string_lossy()
        .starts_with("cachegrind.out")));
}

#[test]
fn default_output_preamble_and_summary() {
    let dir = TempDir::new("default");
    let child = Command::new(cachescope())
        .args(["/bin/sh", "-c", "echo hi; exit 3"])
        .current_dir(&dir.0)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let me = child.id();
    let r: Run = child.wait_with_output().unwrap().into();
    assert_eq!(r.end, End::Code(3));
    assert_eq!(r.stdout, b"hi\n");
    let err = r.stderr_text();
    let l = lines(&err);
    let pre = format!("=={me}== ");
    assert_eq!(l.len(), 7, "{err}");
    assert!(l[0].starts_with(&format!("{pre}Cachescope-")), "{err}");
    assert!(l[1].starts_with(&format!("{pre}Copyright")), "{err}");
    assert!(
        l[2].starts_with(&format!("{pre}Using cachescope-")),
        "{err}"
    );
    assert_eq!(
        l[3],
        format!("{pre}Command: /bin/sh -c echo\\ hi;\\ exit\\ 3")
    );
    assert_eq!(l[4], format!("=={me}== "));
    // The summary carries the client's pid, which names the output file.
    let client: String = l[5]
        .trim_start_matches("==")
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    assert_eq!(l[5], format!("=={client}== "));
    assert!(
        l[6].starts_with(&format!("=={client}== I refs:        ")),
        "{err}"
    );
    let file = dir.join(&format!("cachegrind.out.{client}"));
    let o = CgOut::read(&file);
    assert_eq!(o.cmd, "/bin/sh -c echo hi; exit 3");
    let shown: u64 = l[6]
        .rsplit(' ')
        .next()
        .unwrap()
        .replace(',', "")
        .parse()
        .unwrap();
    assert_eq!(shown, o.summary);
    let mode = std::fs::metadata(&file).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
}

#[test]
fn quiet_leaves_stderr_to_the_client() {
    let dir = TempDir::new("quiet");
    let r = cs(
        &dir,
        &["-q", "/bin/sh", "-c", "echo out; echo err >&2; exit 0"],
    );
    assert_eq!(r.end, End::Code(0));
    assert_eq!(r.stdout, b"out\n");
    assert_eq!(r.stderr_text(), "err\n");
}

#[test]
fn log_file_takes_the_messages() {
    let dir = TempDir::new("log");
    let r = cs(
        &dir,
        &["--log-file=log.%p", "/bin/sh", "-c", "echo err >&2"],
    );
    assert_eq!(r.end, End::Code(0));
    assert_eq!(r.stderr_text(), "err\n");
    let logs = files_with_prefix(&dir.0, "log.");
    assert_eq!(logs.len(), 1);
    let log = std::fs::read_to_string(&logs[0]).unwrap();
    assert!(
        log.contains("== Command: /bin/sh -c echo\\ err\\ \\>&2\n"),
        "{log}"
    );
    assert!(log.contains("== Parent PID: "), "{log}");
    assert!(log.contains("== I refs: "), "{log}");
}

#[test]
fn output_name_patterns_and_startup_directory() {
    let dir = TempDir::new("patterns");
    let mut c = Command::new(cachescope());
    c.args([
        "-q",
        "--cachegrind-out-file=cg.%q{CS_TEST_TAG}.%n.%%",
        "/bin/sh",
        "-c",
        "cd / && echo moved",
    ])
    .env("CS_TEST_TAG", "tag")
    .current_dir(&dir.0);
    let r: Run = c.output().unwrap().into();
    assert_eq!(r.end, End::Code(0), "{}", r.stderr_text());
    assert_eq!(r.stdout, b"moved\n");
    // Relative to where cachescope started, not where the client went.
    let o = CgOut::read(&dir.join("cg.tag.1.%"));
    assert!(o.summary > 0);
}

#[test]
fn bad_output_pattern_is_refused_before_the_program_runs() {
    // Cachegrind finds it at exit and exits 1 instead of with the client's
    // status; here the caller waits for the client itself, so it is
    // refused up front, as Valgrind refuses a bad --log-file (see
    // docs/conformance.md).
    let dir = TempDir::new("badpattern");
    let r = cs(
        &dir,
        &["--cachegrind-out-file=x.%z", "/bin/sh", "-c", "echo ran"],
    );
    assert_eq!(r.end, End::Code(1));
    assert_eq!(r.stdout, b"");
    assert_eq!(
        r.stderr_text(),
        "cachescope: Bad option: --cachegrind-out-file=x.%z\n\
         cachescope: Expected 'p' or 'q' or '%' after '%'\n\
         cachescope: Use --help for more information or consult the user manual.\n"
    );
    let r = cs(
        &dir,
        &["--tool=callgrind", "--callgrind-out-file=y.%q{", "true"],
    );
    assert_eq!(r.end, End::Code(1));
    assert!(
        r.stderr_text()
            .starts_with("cachescope: Bad option: --callgrind-out-file=y.%q{\n"),
        "{}",
        r.stderr_text()
    );
}

#[test]
fn unwritable_output_gives_zero_totals() {
    let dir = TempDir::new("unwritable");
    let r = cs(&dir, &["--cachegrind-out-file=/nonexistent-dir/x", "true"]);
    assert_eq!(r.end, End::Code(0));
    let err = r.stderr_text();
    assert!(
        err.contains("== error: can't open output data file '/nonexistent-dir/x'\n"),
        "{err}"
    );
    assert!(
        err.contains("==        ... so detailed results will be missing.\n"),
        "{err}"
    );
    assert!(err.contains("== I refs:        0\n"), "{err}");
}

/// Runs `args` (in `dir`) under `tool` (Valgrind's command), or ours.
fn valgrind_or_ours(dir: &TempDir, tool: Option<&str>, args: &[&str]) -> Run {
    match tool {
        Some(vg) => Command::new(vg)
            .args(args)
            .current_dir(&dir.0)
            .output()
            .unwrap()
            .into(),
        None => cs(dir, args),
    }
}

#[test]
fn callgrind_makes_its_file_before_the_program_runs() {
    // Callgrind creates its file, empty, when it starts: a program that
    // execs another without --trace-children=yes leaves it so; one it
    // cannot create stops the run before the program starts.
    require("valgrind");
    let dir = TempDir::new("callgrind-start");
    for (tool, prefix) in [(Some("valgrind"), "vg."), (None, "cs.")] {
        let file = format!("--callgrind-out-file={prefix}%p");
        let args = [
            "--tool=callgrind",
            "-q",
            &file,
            "/bin/sh",
            "-c",
            "exec /bin/echo hi",
        ];
        let r = valgrind_or_ours(&dir, tool, &args);
        assert_eq!(r.end, End::Code(0), "{}", r.stderr_text());
        assert_eq!(r.stdout, b"hi\n");
        let files = files_with_prefix(&dir.0, prefix);
        assert_eq!(files.len(), 1, "{prefix}");
        let meta = std::fs::metadata(&files[0]).unwrap();
        assert_eq!((meta.len(), meta.permissions().mode() & 0o777), (0, 0o600));
    }
    for tool in [Some("valgrind"), None] {
        let args = [
            "-q",
            "--tool=callgrind",
            "--callgrind-out-file=/nonexistent-dir/x",
            "/bin/sh",
            "-c",
            "echo ran",
        ];
        let r = valgrind_or_ours(&dir, tool, &args);
        assert_eq!(r.end, End::Code(1), "{tool:?}");
        assert_eq!(r.stdout, b"", "{tool:?}");
        assert!(
            r.stderr_text().contains(
                "== Error: can not open cache simulation output file `/nonexistent-dir/x'\n"
            ),
            "{}",
            r.stderr_text()
        );
    }
}

#[test]
fn death_by_signal_is_passed_on() {
    let dir = TempDir::new("signal");
    let prog = OsStr::new("/bin/sh");
    let args = ["-c", "kill -TERM $$"];
    let nat = native(&dir.0, prog, &args, None);
    assert_eq!(nat.end, End::Signal(15));
    let r = under_cachescope(&dir.0, &["-q"], prog, &args, None);
    assert_eq!(r.end, End::Signal(15), "{}", r.stderr_text());
}

#[test]
fn trace_children_profiles_exec_d_programs() {
    // With `no`, an exec'd image runs natively and, as under Valgrind, the
    // process leaves no profile (the pre-exec image never exits).
    let dir = TempDir::new("tracechildren");
    let script = "exec /bin/echo hi there";
    let r = cs(
        &dir,
        &["-q", "--cachegrind-out-file=no.%p", "/bin/sh", "-c", script],
    );
    assert_eq!(r.end, End::Code(0), "{}", r.stderr_text());
    assert_eq!(r.stdout, b"hi there\n");
    assert!(files_with_prefix(&dir.0, "no.").is_empty());
    // Nor a word on stderr: the tool let go of the process at its exec.
    assert_eq!(r.stderr_text(), "");
    // With `yes`, the exec'd program is profiled under its own command line.
    let r = cs(
        &dir,
        &[
            "-q",
            "--trace-children=yes",
            "--cachegrind-out-file=yes.%p",
            "/bin/sh",
            "-c",
            script,
        ],
    );
    assert_eq!(r.end, End::Code(0), "{}", r.stderr_text());
    assert_eq!(r.stdout, b"hi there\n");
    let files = files_with_prefix(&dir.0, "yes.");
    assert_eq!(files.len(), 1);
    let o = CgOut::read(&files[0]);
    assert_eq!(o.cmd, "/bin/echo hi there");
    assert!(o.summary > 1000);
}

/// `--stats=yes` reports the engine's figures after the tool's summary, even
/// with -q, whichever the tool; in trace mode also how many bytes of records
/// the tool got and where their time went (reading them, the tool's work,
/// the client waiting for the tool).
#[test]
fn stats_report_the_engine_and_in_trace_mode_the_records() {
    let dir = TempDir::new("stats");
    let out = "--callgrind-out-file=/dev/null";
    for (args, traced) in [
        (
            &["--cache-sim=no", "--cachegrind-out-file=/dev/null"][..],
            false,
        ),
        (
            &["--cache-sim=yes", "--cachegrind-out-file=/dev/null"],
            true,
        ),
        // Callgrind's calling contexts in the client (the default), or by
        // the tool from the stream.
        (&["--tool=callgrind", out], false),
        (&["--tool=callgrind", out, "--client-contexts=no"], true),
    ] {
        let r = cs(&dir, &[&["-q", "--stats=yes"], args, &["true"]].concat());
        assert_eq!(r.end, End::Code(0), "{args:?}");
        let err = r.stderr_text();
        assert!(err.contains("engine: translated "), "{args:?}: {err}");
        let trace = err.lines().find_map(|l| {
            let rest = l.split_once("engine: trace: ")?.1;
            rest.split_once(" MB")?.0.parse::<f64>().ok()
        });
        // Counters (counting mode) and slots (tagged counting) say how
        // many blocks ran.
        let ran = err.lines().find_map(|l| {
            let head = l.split_once(" blocks ran")?.0;
            head.rsplit(' ').next()?.parse::<u64>().ok()
        });
        if !traced {
            assert!(ran.is_some_and(|n| n > 0), "{args:?}: {err}");
        }
        match trace {
            Some(mb) => assert!(traced && mb > 0.0, "{args:?}: {err}"),
            None => assert!(!traced, "{args:?}: no trace line in {err}"),
        }
    }
}
