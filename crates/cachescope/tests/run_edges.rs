//! End-to-end: the edges of a run, as Valgrind behaves there: output files
//! that cannot be replaced or written, and programs that cannot be run
//! (shell statuses 127 and 126, one line each).

mod run_support;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Stdio};

use run_support::*;

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|v| v.split_whitespace().nth(1).map(|e| e == "0"))
        .unwrap()
}

/// `program args` in `cwd`, as an unprivileged user when we are root
/// (root ignores directory permissions).
fn unprivileged(cwd: &Path, program: &Path, args: &[&str]) -> Run {
    let mut c = if is_root() {
        require("setpriv");
        let mut c = Command::new("setpriv");
        c.args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(program);
        c
    } else {
        Command::new(program)
    };
    c.args(args)
        .current_dir(cwd)
        .stdin(Stdio::null())
        .output()
        .unwrap()
        .into()
}

#[test]
fn a_writable_file_in_a_read_only_directory_is_written_in_place() {
    let dir = TempDir::new("rodir");
    let ro = dir.join("ro");
    std::fs::create_dir(&ro).unwrap();
    let out = ro.join("cg.out");
    std::fs::write(&out, "old contents\n").unwrap();
    std::fs::set_permissions(&out, std::fs::Permissions::from_mode(0o666)).unwrap();
    std::fs::set_permissions(&ro, std::fs::Permissions::from_mode(0o555)).unwrap();
    let r = unprivileged(
        &ro,
        &cachescope(),
        &["-q", "--cachegrind-out-file=cg.out", "/bin/true"],
    );
    // Back to writable, so that the directory can be removed.
    std::fs::set_permissions(&ro, std::fs::Permissions::from_mode(0o755)).unwrap();
    assert_eq!(r.end, End::Code(0), "{}", r.stderr_text());
    assert_eq!(r.stderr_text(), "");
    let o = CgOut::read(&out);
    assert_eq!(o.cmd, "/bin/true");
    assert!(o.summary > 1000);
    assert_eq!(std::fs::read_dir(&ro).unwrap().count(), 1);
}

#[test]
fn write_errors_are_reported_in_one_line() {
    let dir = TempDir::new("devfull");
    let r = under_cachescope(
        &dir.0,
        &["--cachegrind-out-file=/dev/full"],
        "/bin/true".as_ref(),
        &[],
        None,
    );
    // Valgrind exits with the client's status here (and says nothing).
    assert_eq!(r.end, End::Code(0));
    let err = r.stderr_text();
    let errors: Vec<&str> = err.lines().filter(|l| l.contains("error")).collect();
    assert_eq!(errors.len(), 1, "{err}");
    assert!(
        errors[0].contains("== error: can't write output data file '/dev/full': No space left"),
        "{err}"
    );
    assert!(!err.contains("can't open"), "{err}");
    // The totals are known: the summary shows them.
    assert!(!err.contains("I refs:        0\n"), "{err}");
    assert!(err.contains("I refs: "), "{err}");
}

#[test]
fn unrunnable_programs_end_with_the_shell_statuses_and_valgrinds_words() {
    require("valgrind");
    let dir = TempDir::new("unrunnable-status");
    let noexec = dir.join("noexec");
    std::fs::write(&noexec, "x").unwrap();
    let script = dir.join("badinterp");
    std::fs::write(&script, "#!/nonexistent/interpreter\n").unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::create_dir(dir.join("subdir")).unwrap();
    for (prog, status) in [
        ("./missing", 127),
        ("no-such-program-anywhere", 127),
        ("./noexec", 126),
        ("./subdir", 126),
        ("./badinterp", 126),
    ] {
        let ours = under_cachescope(&dir.0, &["-q"], prog.as_ref(), &[], None);
        let theirs = under_valgrind(&dir.0, &[], prog.as_ref(), &[], None);
        assert_eq!(
            ours.end,
            End::Code(status),
            "{prog}: {}",
            ours.stderr_text()
        );
        assert_eq!(theirs.end, ours.end, "{prog}");
        let vg_line = theirs
            .stderr_text()
            .lines()
            .find(|l| l.starts_with("valgrind: "))
            .unwrap_or_else(|| panic!("{prog}: {}", theirs.stderr_text()))
            .replacen("valgrind: ", "cachescope: ", 1);
        assert_eq!(ours.stderr_text(), format!("{vg_line}\n"), "{prog}");
    }
    // Not an ELF image nor a script (Valgrind hands it to /bin/sh; we
    // refuse it): one line, "cannot execute".
    let text = dir.join("text");
    std::fs::write(&text, "echo hi\n").unwrap();
    std::fs::set_permissions(&text, std::fs::Permissions::from_mode(0o755)).unwrap();
    let r = under_cachescope(&dir.0, &["-q"], "./text".as_ref(), &[], None);
    assert_eq!(r.end, End::Code(126));
    assert_eq!(r.stderr_text().lines().count(), 1);
    assert!(r
        .stderr_text()
        .starts_with("cachescope: ./text: cannot execute"));
}
