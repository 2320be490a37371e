//! cg_annotate / cg_merge / cg_diff on profiles written by Valgrind 3.19
//! for a real program (`golden/real/prog.c`) and on hand-made edge cases:
//! the output, error messages and exit status must be exactly those of
//! Valgrind's current Python tools, recorded in `golden/real/expected` by
//! `golden/real/regen.sh` for the cases listed in `golden/real/cases`.

mod cg_support;

use cg_support::*;
use std::path::Path;

/// One line of `golden/real/cases`.
struct Case {
    name: String,
    env: Vec<(String, String)>,
    tool: String,
    args: Vec<String>,
}

fn cases() -> Vec<Case> {
    let text = std::fs::read_to_string(golden_dir().join("real/cases")).unwrap();
    text.lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| {
            let mut f = l.split('\t').map(str::to_string);
            let name = f.next().unwrap();
            let env = f.next().unwrap();
            let env = if env == "-" {
                Vec::new()
            } else {
                env.split(' ')
                    .map(|kv| {
                        let (k, v) = kv.split_once('=').unwrap();
                        (k.to_string(), v.to_string())
                    })
                    .collect()
            };
            let tool = f.next().unwrap();
            Case {
                name,
                env,
                tool,
                args: f.collect(),
            }
        })
        .collect()
}

/// A scratch copy of `golden/real` where all files have the same
/// modification time (no "newer than data file" warnings).
fn scratch_copy(tag: &str) -> TempDir {
    let tmp = TempDir::new(tag);
    copy_tree(&golden_dir().join("real"), tmp.path());
    set_all_mtimes(tmp.path());
    tmp
}

fn expected(name: &str) -> (Vec<u8>, Vec<u8>, i32) {
    let dir = golden_dir().join("real/expected");
    let read = |ext: &str| std::fs::read(dir.join(format!("{name}.{ext}"))).ok();
    let out = read("out").unwrap_or_else(|| panic!("no expected output for {name}"));
    let err = read("err").unwrap_or_default();
    let code = read("code").map_or(0, |c| String::from_utf8(c).unwrap().trim().parse().unwrap());
    (out, err, code)
}

fn run_case(dir: &Path, case: &Case) -> std::process::Output {
    let mut cmd = std::process::Command::new(binary());
    std::os::unix::process::CommandExt::arg0(&mut cmd, &case.tool);
    cmd.args(&case.args).current_dir(dir).env_remove("COLUMNS");
    for (k, v) in &case.env {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

#[test]
fn every_case_matches_the_python_tools() {
    let tmp = scratch_copy("pygolden");
    let cases = cases();
    assert!(cases.len() > 50);
    for case in &cases {
        let out = run_case(tmp.path(), case);
        let (want_out, want_err, want_code) = expected(&case.name);
        let mut stdout = out.stdout.clone();
        if case.name.starts_with("help-annotate") || case.name == "help-narrow" {
            // Our help ends with `-I`, which the Python tool does not have.
            let text = String::from_utf8(stdout).unwrap();
            let at = text
                .find("  -I DIR, --include DIR")
                .expect("-I in the help");
            stdout = text.as_bytes()[..at].to_vec();
        }
        assert_same_text(&format!("{} (stdout)", case.name), &stdout, &want_out);
        assert_same_text(&format!("{} (stderr)", case.name), &out.stderr, &want_err);
        assert_eq!(
            out.status.code(),
            Some(want_code),
            "{}: exit status",
            case.name
        );
    }
}

/// Replaces the Invocation line, which holds the command line.
fn without_invocation(text: &[u8]) -> String {
    String::from_utf8_lossy(text)
        .lines()
        .map(|l| {
            if l.starts_with("Invocation:") {
                "Invocation: -"
            } else {
                l
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// `.` counts, `fi=`/`fe=` lines and CRLF line ends (older or foreign
/// files, refused by the Python tools) read as their plain equivalent.
#[test]
fn older_format_reads_as_its_plain_equivalent() {
    let tmp = scratch_copy("pygolden-crlf");
    let out = run_tool("cg_annotate", tmp.path(), ["crlf.cgout"]);
    assert!(out.status.success());
    let (want, _, _) = expected("ann-crlf-norm");
    assert_eq!(without_invocation(&out.stdout), without_invocation(&want));
}

/// A profile that cannot be read twice (a pipe) is read in one pass,
/// keeping every line's counts; the report is the same.
#[test]
fn pipes_are_read_in_one_pass() {
    let tmp = scratch_copy("pygolden-pipe-input");
    for (case, args) in [
        ("ann-full-default", vec!["/dev/stdin"]),
        (
            "ann-runs-diff",
            vec![
                "--diff",
                "--mod-funcname=s/^_?(dl|IO)_.*/\\1_stuff/",
                "/dev/stdin",
                "run5.cgout",
            ],
        ),
    ] {
        let input = match case {
            "ann-full-default" => "full.cgout",
            _ => "run2.cgout",
        };
        let mut cat = std::process::Command::new("cat")
            .arg(input)
            .current_dir(tmp.path())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let pipe = cat.stdout.take().unwrap();
        let out = std::process::Command::new(binary())
            .arg("annotate")
            .args(&args)
            .current_dir(tmp.path())
            .stdin(pipe)
            .output()
            .unwrap();
        cat.wait().unwrap();
        assert!(
            out.status.success(),
            "{case}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let (want, _, _) = expected(case);
        // Only the file names differ.
        let text = without_invocation(&out.stdout).replace("/dev/stdin", input);
        assert_eq!(text, without_invocation(&want), "{case}");
    }
}

/// `-I DIR` finds sources recorded with relative paths.
#[test]
fn include_dirs_find_relative_sources() {
    let tmp = scratch_copy("pygolden-include");
    let elsewhere = tmp.path().join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    let copy = |name: &str| std::fs::copy(tmp.path().join(name), elsewhere.join(name)).unwrap();
    copy("full.cgout");
    // From another directory, the sources are unreadable...
    let lost = run_tool("cg_annotate", &elsewhere, ["full.cgout"]);
    assert!(String::from_utf8_lossy(&lost.stdout).contains("unreadable:\n- ././prog.c"));
    // ...unless -I names their directory.
    for args in [
        ["-I", ".."],
        ["--include", ".."],
        ["-I..", ""],
        ["--inc=..", ""],
    ] {
        let args: Vec<&str> = args
            .into_iter()
            .filter(|a| !a.is_empty())
            .chain(["full.cgout"])
            .collect();
        let found = run_tool("cg_annotate", &elsewhere, &args);
        assert!(found.status.success(), "{args:?}");
        let (want, _, _) = expected("ann-full-default");
        assert_eq!(
            without_invocation(&found.stdout),
            without_invocation(&want),
            "{args:?}"
        );
    }
}

/// `cachescope annotate|merge|diff` are the same tools.
#[test]
fn subcommands_are_the_tools() {
    let tmp = scratch_copy("pygolden-sub");
    let run = |args: &[&str]| {
        std::process::Command::new(binary())
            .args(args)
            .current_dir(tmp.path())
            .output()
            .unwrap()
    };
    let out = run(&["annotate", "run2.cgout", "run5.cgout"]);
    assert!(out.status.success());
    let (want, _, _) = expected("ann-runs-merged");
    assert_eq!(without_invocation(&out.stdout), without_invocation(&want));
    assert!(String::from_utf8_lossy(&out.stdout).contains(" annotate run2.cgout run5.cgout\n"));

    let out = run(&["merge", "run2.cgout", "run5.cgout"]);
    assert_eq!(out.stdout, expected("merge-runs").0);
    let out = run(&["diff", "run2.cgout", "run5.cgout"]);
    assert_eq!(out.stdout, expected("diff-runs").0);
    let out = run(&["diff"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).starts_with("usage: cg_diff "));
}

#[test]
fn merge_writes_the_output_file_whole() {
    let tmp = scratch_copy("pygolden-merge-o");
    let out = run_tool(
        "cg_merge",
        tmp.path(),
        ["-o", "merged.out", "run2.cgout", "run5.cgout"],
    );
    assert!(out.status.success());
    assert!(out.stdout.is_empty());
    assert_eq!(
        std::fs::read(tmp.path().join("merged.out")).unwrap(),
        expected("merge-runs").0
    );
    // -oFILE and -o=FILE are argparse spellings too.
    for arg in ["-omerged2.out", "-o=merged2.out"] {
        let out = run_tool("cg_merge", tmp.path(), [arg, "run2.cgout", "run5.cgout"]);
        assert!(out.status.success());
        assert_eq!(
            std::fs::read(tmp.path().join("merged2.out")).unwrap(),
            expected("merge-runs").0
        );
    }
    // An output that cannot be written is reported as Python reports it.
    let out = run_tool("cg_merge", tmp.path(), ["-o", "no/such/dir", "run2.cgout"]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "cg_merge: error: [Errno 2] No such file or directory: 'no/such/dir'\n"
    );
    // A bad input leaves no output file behind.
    let out = run_tool(
        "cg_merge",
        tmp.path(),
        ["-o", "bad.out", "run2.cgout", "no-summary.cgout"],
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(!tmp.path().join("bad.out").exists());
}

#[test]
fn version_names_the_tool() {
    let tmp = TempDir::new("pygolden-version");
    for tool in ["cg_annotate", "cg_merge", "cg_diff"] {
        let out = run_tool(tool, tmp.path(), ["--version"]);
        assert!(out.status.success());
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            format!("{tool}-{}\n", env!("CARGO_PKG_VERSION"))
        );
    }
}

/// Closing the output early (`| head`) is not a crash.
#[test]
fn closed_output_is_not_a_crash() {
    let tmp = scratch_copy("pygolden-pipe");
    // Over 200 KB of output: more than a pipe holds, so the writes fail
    // whenever the reader's end is closed.
    let mut child = std::process::Command::new(binary())
        .args(["annotate", "--threshold=0", "--context=20", "full.cgout"])
        .current_dir(tmp.path())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
