//! End-to-end: cachescope invoked as `valgrind` (a symlink first on PATH,
//! as scripts/valgrind-shim makes) is a drop-in for `valgrind
//! --tool=cachegrind`, and hands every other tool to the real Valgrind.

mod run_support;

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use run_support::*;

/// A directory holding a `valgrind` symlink to cachescope.
fn shim(dir: &TempDir) -> PathBuf {
    let bin = dir.join("shim");
    std::fs::create_dir(&bin).unwrap();
    std::os::unix::fs::symlink(cachescope(), bin.join("valgrind")).unwrap();
    bin
}

/// `PATH` with `first` in front of the current one.
fn path_with(first: &Path) -> OsString {
    let mut dirs = vec![first.to_path_buf()];
    dirs.extend(std::env::split_paths(
        &std::env::var_os("PATH").unwrap_or_default(),
    ));
    std::env::join_paths(dirs).unwrap()
}

/// Runs `valgrind args` in `cwd`, found through `path`.
fn valgrind_via(path: &OsString, cwd: &Path, args: &[&str]) -> Run {
    Command::new("valgrind")
        .args(args)
        .env("PATH", path)
        .current_dir(cwd)
        .stdin(Stdio::null())
        .output()
        .unwrap()
        .into()
}

#[test]
fn version_is_valgrinds_format() {
    let dir = TempDir::new("vg-version");
    let path = path_with(&shim(&dir));
    let r = valgrind_via(&path, &dir.0, &["--version"]);
    assert_eq!(r.end, End::Code(0));
    let out = String::from_utf8(r.stdout).unwrap();
    let v = out.strip_prefix("valgrind-").unwrap().trim_end();
    assert_eq!(out, format!("valgrind-{v}\n"));
    let parts: Vec<u32> = v.split('.').map(|p| p.parse().unwrap()).collect();
    assert_eq!(parts.len(), 3, "{out}");
    assert!(parts[0] == 3 && parts[1] >= 19, "{out}");
}

#[test]
fn tool_cachegrind_is_cachescope() {
    let dir = TempDir::new("vg-cachegrind");
    let path = path_with(&shim(&dir));
    let exe = dir.join("loops");
    compile("gcc", &["-g", "-O1"], "loops.c", &exe);
    let exe_s = exe.to_str().unwrap();
    let r = valgrind_via(&path, &dir.0, &["--tool=cachegrind", "-q", exe_s]);
    assert_eq!(r.stderr_text(), "");
    let ours = files_with_prefix(&dir.0, "cachegrind.out.");
    assert_eq!(ours.len(), 1, "the default name, cachegrind.out.<pid>");
    let via_valgrind = CgOut::read(&ours[0]);
    std::fs::remove_file(&ours[0]).unwrap();
    // The same environment (the client's startup reads it).
    let direct: Run = Command::new(cachescope())
        .arg("-q")
        .arg(&exe)
        .env("PATH", &path)
        .current_dir(&dir.0)
        .stdin(Stdio::null())
        .output()
        .unwrap()
        .into();
    assert_eq!(r.end, direct.end);
    assert_eq!(r.stdout, direct.stdout);
    let direct = CgOut::read(&files_with_prefix(&dir.0, "cachegrind.out.")[0]);
    assert_eq!(via_valgrind.cmd, direct.cmd);
    let differing: Vec<_> = via_valgrind
        .costs
        .iter()
        .filter(|(k, v)| direct.costs.get(*k) != Some(v))
        .take(5)
        .collect();
    assert!(
        differing.is_empty() && via_valgrind.costs.len() == direct.costs.len(),
        "{differing:?}"
    );
    assert!(via_valgrind.lines_in("loops.c").values().sum::<u64>() > 1000);
    // Errors are Valgrind's, under Valgrind's name.
    let r = valgrind_via(&path, &dir.0, &["--tool=cachegrind", "--bogus", exe_s]);
    assert_eq!(r.end, End::Code(1));
    assert_eq!(
        r.stderr_text(),
        "valgrind: Unknown option: --bogus\n\
         valgrind: Use --help for more information or consult the user manual.\n"
    );
    // Core options wrappers pass are honoured or accepted.
    let r = valgrind_via(
        &path,
        &dir.0,
        &[
            "--tool=cachegrind",
            "--time-stamp=yes",
            "--error-exitcode=201",
            "--fair-sched=try",
            "--cachegrind-out-file=ts.out",
            "/bin/true",
        ],
    );
    assert_eq!(r.end, End::Code(0), "{}", r.stderr_text());
    let first = r.stderr_text().lines().next().unwrap().to_string();
    // ==DD:HH:MM:SS.mmm PID== as Valgrind's --time-stamp=yes.
    let stamp = first.strip_prefix("==").unwrap().split(' ').next().unwrap();
    assert_eq!(stamp.len(), "00:00:00:00.000".len(), "{first}");
    assert!(stamp
        .chars()
        .all(|c| c.is_ascii_digit() || c == ':' || c == '.'));
    assert!(CgOut::read(&dir.join("ts.out")).summary > 0);
}

#[test]
fn other_tools_go_to_the_real_valgrind() {
    require("valgrind");
    let dir = TempDir::new("vg-memcheck");
    let shim_dir = shim(&dir);
    let path = path_with(&shim_dir);
    let r = valgrind_via(&path, &dir.0, &["--tool=memcheck", "/bin/true"]);
    assert_eq!(r.end, End::Code(0), "{}", r.stderr_text());
    assert!(
        r.stderr_text()
            .contains("Memcheck, a memory error detector"),
        "{}",
        r.stderr_text()
    );
    // Memcheck is also the default tool.
    let r = valgrind_via(&path, &dir.0, &["/bin/true"]);
    assert!(r.stderr_text().contains("Memcheck"), "{}", r.stderr_text());
    // A copy of cachescope further down PATH is not taken for Valgrind.
    let copy_dir = dir.join("copy");
    std::fs::create_dir(&copy_dir).unwrap();
    std::fs::copy(cachescope(), copy_dir.join("valgrind")).unwrap();
    let only_us = std::env::join_paths([&shim_dir, &copy_dir]).unwrap();
    let r = valgrind_via(&only_us, &dir.0, &["--tool=memcheck", "/bin/true"]);
    assert_eq!(r.end, End::Code(1));
    let err = r.stderr_text();
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with("valgrind: tool 'memcheck' is not provided by cachescope"),
        "{err}"
    );
}

/// The `cmd:` lines of the profiles in `dir` whose names start `prefix`.
fn commands(dir: &Path, prefix: &str) -> BTreeSet<String> {
    files_with_prefix(dir, prefix)
        .iter()
        .map(|f| {
            std::fs::read_to_string(f)
                .unwrap()
                .lines()
                .find_map(|l| l.strip_prefix("cmd: ").map(str::to_string))
                .unwrap()
        })
        .collect()
}

#[test]
fn trace_children_skip_matches_like_valgrind() {
    require("valgrind");
    let dir = TempDir::new("vg-skip");
    let path = path_with(&shim(&dir));
    // Two programs exec'd by forked shells; `sh` itself ends with an exec
    // of its own or an exit, as the shell decides: the oracle says which
    // profiles there are.
    let script = "/bin/echo one; /bin/true two; exit 0";
    for (label, skip) in [
        ("all", "--trace-children-skip=nothing-matches"),
        ("by-exe", "--trace-children-skip=*/ech?"),
        ("by-arg", "--trace-children-skip-by-arg=tw*"),
    ] {
        let ours_prefix = format!("ours-{label}.");
        let theirs_prefix = format!("theirs-{label}.");
        let r = valgrind_via(
            &path,
            &dir.0,
            &[
                "--tool=cachegrind",
                "-q",
                "--trace-children=yes",
                skip,
                &format!("--cachegrind-out-file={ours_prefix}%p"),
                "/bin/sh",
                "-c",
                script,
            ],
        );
        assert_eq!(r.end, End::Code(0), "{}", r.stderr_text());
        let vg = under_valgrind(
            &dir.0,
            &[
                "--trace-children=yes",
                skip,
                &format!("--cachegrind-out-file={theirs_prefix}%p"),
            ],
            "/bin/sh".as_ref(),
            &["-c", script],
            None,
        );
        assert_eq!(vg.end, End::Code(0), "{}", vg.stderr_text());
        let ours = commands(&dir.0, &ours_prefix);
        assert_eq!(ours, commands(&dir.0, &theirs_prefix), "{label}");
        let echo = ours.iter().any(|c| c.starts_with("/bin/echo"));
        let truth = ours.iter().any(|c| c.starts_with("/bin/true"));
        assert_eq!(
            (echo, truth),
            (label != "by-exe", label != "by-arg"),
            "{ours:?}"
        );
    }
}
