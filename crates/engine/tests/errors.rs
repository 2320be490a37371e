//! Failures a user can meet get one clear line and a non-zero exit, never a
//! hang; a program killed by a signal is reported as such.

mod common;
use common::*;
use std::process::Command;

fn count(args: &[&str]) -> (Option<i32>, String) {
    let o = Command::new(count_bin())
        .args(args)
        .output()
        .expect("run count");
    (
        o.status.code(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

#[test]
fn missing_programs_are_named() {
    let (code, err) = count(&["/nonexistent/prog"]);
    assert_eq!(code, Some(1));
    assert!(
        err.contains("cannot run '/nonexistent/prog': no such file"),
        "{err}"
    );
    let (code, err) = count(&["no-such-program-in-path-xyz"]);
    assert_eq!(code, Some(1));
    assert!(err.contains("program not found in PATH"), "{err}");
}

#[test]
fn non_executables_and_foreign_elf_are_refused() {
    let dir = TempDir::new("errors");
    let text = dir.0.join("text");
    std::fs::write(&text, "hello\n").unwrap();
    let (_, err) = count(&[text.to_str().unwrap()]);
    assert!(err.contains("not an executable file"), "{err}");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&text, std::fs::Permissions::from_mode(0o755)).unwrap();
    let (_, err) = count(&[text.to_str().unwrap()]);
    assert!(err.contains("not an ELF executable"), "{err}");
    // An ELF file for another machine (e_machine = AArch64).
    let mut elf = std::fs::read("/bin/true").unwrap();
    elf[18] = 0xb7;
    elf[19] = 0;
    let arm = dir.0.join("arm");
    std::fs::write(&arm, elf).unwrap();
    std::fs::set_permissions(&arm, std::fs::Permissions::from_mode(0o755)).unwrap();
    let (code, err) = count(&[arm.to_str().unwrap()]);
    assert_eq!(code, Some(1));
    assert!(err.contains("not an x86-64 program"), "{err}");
}

#[test]
fn a_fault_without_handler_kills_as_natively_and_the_profile_is_written() {
    let dir = TempDir::new("signals");
    let exe = build(&dir, "gcc", "signals.c", "signals", &[]);
    let nat = native(&exe, &["fault"]);
    assert_eq!(nat.status, None);
    let (run, procs) = engine(&dir, &exe, &["fault"]);
    assert_eq!(run.status, None, "the caller's process is the client");
    assert!(run.stderr.contains("killed by signal 11"), "{}", run.stderr);
    assert_eq!(procs.len(), 1, "the profile is still written");
}
