//! `callgrind_annotate` against Valgrind 3.19's Perl script.
//!
//! The goldens (crates/callgrind/tests/golden, listed in cases.txt) are the
//! script's output on Callgrind files made from fixtures/callgrind. Our
//! binary, run as `callgrind_annotate` in the same layout (data and sources
//! in one directory, sources older), must print the same text. The one
//! allowance: where the script's order comes from a Perl hash (annotated
//! source files; callers, callees or calls from a line with equal costs),
//! the script itself prints a different order from one run to the next, so
//! those groups are compared as sets; everything else is compared byte for
//! byte. The oracle test proves the goldens are the script's output (with
//! a fixed hash seed, exactly), and another checks the script reads our
//! writer's files as it reads Valgrind's.

mod cg_support;
mod run_support;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use cg_support::{assert_same_text, run_tool, TempDir};

fn callgrind_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../callgrind/tests")
}

fn fixtures_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/callgrind")
}

/// One golden case: name, directory to run in, arguments.
struct Case {
    name: String,
    dir: String,
    args: Vec<String>,
}

fn cases() -> Vec<Case> {
    let text = std::fs::read_to_string(callgrind_dir().join("golden/cases.txt")).unwrap();
    let cases: Vec<Case> = text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            let mut fields = l.split('\t');
            let (name, dir, args) = (fields.next(), fields.next(), fields.next());
            Case {
                name: name.unwrap().to_string(),
                dir: dir.expect("a directory").to_string(),
                args: args
                    .expect("arguments")
                    .split(' ')
                    .map(str::to_string)
                    .collect(),
            }
        })
        .collect();
    assert!(cases.len() >= 10, "cases.txt lists {} cases", cases.len());
    cases
}

fn golden(name: &str) -> Vec<u8> {
    std::fs::read(callgrind_dir().join(format!("golden/{name}.txt")))
        .unwrap_or_else(|e| panic!("golden {name}: {e}"))
}

/// The data files and the sources in one directory (sources older, as
/// when the program was profiled), and an empty `sub` directory.
fn layout() -> TempDir {
    let tmp = TempDir::new("callgrind-annotate");
    let dir = tmp.path();
    let mut files = Vec::new();
    for from in [fixtures_dir(), callgrind_dir().join("data")] {
        for entry in std::fs::read_dir(&from).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            if name.ends_with(".c") || name.ends_with(".h") || name.contains(".out") {
                std::fs::copy(&path, dir.join(&name)).unwrap();
                files.push(name);
            }
        }
    }
    std::fs::create_dir(dir.join("sub")).unwrap();
    let when = |secs| std::time::UNIX_EPOCH + std::time::Duration::from_secs(secs);
    for name in files {
        let newer = name.contains(".out");
        let f = std::fs::File::options()
            .append(true)
            .open(dir.join(&name))
            .unwrap();
        f.set_modified(when(if newer { 1_600_000_100 } else { 1_600_000_000 }))
            .unwrap();
    }
    tmp
}

/// Sorts what the script prints in Perl-hash order: runs of caller,
/// callee or call lines with the same counts, and the annotated source
/// files (each from its header to the next section).
fn hash_order_normalized(text: &[u8]) -> String {
    let text = String::from_utf8_lossy(text);
    let lines: Vec<&str> = text.split_inclusive('\n').collect();
    let fancy = format!("{}\n", "-".repeat(80));
    let arc_key = |line: &str| -> Option<String> {
        [" < ", " >   ", " => "]
            .iter()
            .find_map(|arrow| line.find(arrow).map(|i| format!("{}{arrow}", &line[..i])))
    };
    // Runs of arc lines with equal counts.
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        if let Some(key) = arc_key(lines[i]) {
            let mut j = i;
            while j < lines.len() && arc_key(lines[j]).as_deref() == Some(key.as_str()) {
                j += 1;
            }
            let mut group: Vec<&str> = lines[i..j].to_vec();
            group.sort();
            out.push(group.concat());
            i = j;
        } else {
            out.push(lines[i].to_string());
            i += 1;
        }
    }
    // Annotated source files: consecutive blocks, sorted.
    let is_start = |k: usize| {
        out[k] == fancy
            && out.get(k + 1).is_some_and(|l| {
                l.starts_with("-- Auto-annotated source:")
                    || l.starts_with("-- User-annotated source:")
            })
    };
    let mut result = String::new();
    let mut k = 0;
    while k < out.len() {
        if !is_start(k) {
            result.push_str(&out[k]);
            k += 1;
            continue;
        }
        let mut blocks = Vec::new();
        while k < out.len() && is_start(k) {
            let mut end = k + 3;
            while end < out.len() && out[end] != fancy {
                end += 1;
            }
            blocks.push(out[k..end].concat());
            k = end;
        }
        blocks.sort();
        result.push_str(&blocks.concat());
    }
    result
}

/// Runs `callgrind_annotate` (ours, through argv[0]) in a case's directory.
fn ours(root: &Path, case: &Case) -> Output {
    run_tool("callgrind_annotate", &root.join(&case.dir), &case.args)
}

/// Runs Valgrind's script with a fixed Perl hash seed.
fn script(dir: &Path, args: &[String]) -> Output {
    Command::new("callgrind_annotate")
        .args(args)
        .current_dir(dir)
        .env("PERL_HASH_SEED", "0")
        .env("PERL_PERTURB_KEYS", "0")
        .output()
        .unwrap()
}

/// Fails loudly without perl or Valgrind's callgrind_annotate: the
/// oracle tests are what prove the goldens genuine.
fn require_script() {
    run_support::require_callgrind_annotate();
}

#[test]
fn ours_prints_the_goldens() {
    let tmp = layout();
    for case in cases() {
        let out = ours(tmp.path(), &case);
        assert!(
            out.status.success(),
            "{}: status {:?}: {}",
            case.name,
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        let want = golden(&case.name);
        assert_same_text(
            &case.name,
            hash_order_normalized(&out.stdout).as_bytes(),
            hash_order_normalized(&want).as_bytes(),
        );
    }
}

#[test]
fn goldens_are_the_scripts_output() {
    require_script();
    let tmp = layout();
    for case in cases() {
        let out = script(&tmp.path().join(&case.dir), &case.args);
        assert!(out.status.success(), "{}: the script failed", case.name);
        assert_same_text(&case.name, &out.stdout, &golden(&case.name));
    }
}

#[test]
fn script_reads_our_writer_as_valgrinds_files() {
    require_script();
    let tmp = layout();
    let mine = tmp.path().join("sub");
    for source in ["fib.c", "callbacks.c", "multi.c", "util.c", "inline.h"] {
        std::fs::copy(fixtures_dir().join(source), mine.join(source)).unwrap();
    }
    cg_support::set_all_mtimes(&mine);
    let options = [
        callgrind::WriteOptions::default(),
        callgrind::WriteOptions {
            compress_strings: false,
            compress_pos: false,
        },
    ];
    let files = [
        "fib.parts.out",
        "multi.cache.out",
        "callbacks.instr-jumps.out",
    ];
    for (file, args) in files
        .iter()
        .zip(["--tree=both", "--inclusive=yes", "--auto=yes"])
    {
        let data = std::fs::read(tmp.path().join(file)).unwrap();
        let profile = callgrind::parse(&data).unwrap();
        let args = vec![args.to_string(), file.to_string()];
        let want = script(tmp.path(), &args);
        for opts in options {
            let written = profile.to_bytes(opts);
            std::fs::write(mine.join(file), &written).unwrap();
            let f = std::fs::File::options()
                .append(true)
                .open(mine.join(file))
                .unwrap();
            f.set_modified(std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_600_000_100))
                .unwrap();
            let got = script(&mine, &args);
            assert_same_text(&format!("{file} {opts:?}"), &got.stdout, &want.stdout);
        }
    }
}

#[test]
fn errors_are_one_line_with_a_status() {
    let tmp = layout();
    let run = |args: &[&str]| run_tool("callgrind_annotate", tmp.path(), args);
    let missing = run(&["no-such.out"]);
    assert_eq!(missing.status.code(), Some(2));
    assert_eq!(
        String::from_utf8_lossy(&missing.stderr),
        "callgrind_annotate: File no-such.out not opened\n"
    );
    let bad = run(&["--tree=sideways", "fib.out"]);
    assert_eq!(bad.status.code(), Some(255));
    let stderr = String::from_utf8_lossy(&bad.stderr);
    assert!(
        stderr.starts_with("callgrind_annotate: bad option `--tree=sideways`\nusage:"),
        "{stderr}"
    );
    let event = run(&["--show=Dr", "fib.out"]);
    assert_eq!(event.status.code(), Some(255));
    assert_eq!(
        String::from_utf8_lossy(&event.stderr),
        "callgrind_annotate: --show event `Dr' did not appear in input\n"
    );
    std::fs::write(tmp.path().join("bad.out"), "events: Ir\nfl=a\nfn=b\n1 x\n").unwrap();
    let garbled = run(&["bad.out"]);
    assert_eq!(garbled.status.code(), Some(255));
    assert_eq!(
        String::from_utf8_lossy(&garbled.stderr),
        "callgrind_annotate: bad.out: line 4: bad cost `x`\n"
    );
    // The subcommand is the same program.
    let sub = Command::new(cg_support::binary())
        .args(["callgrind_annotate", "--auto=no", "fib.out"])
        .current_dir(tmp.path())
        .output()
        .unwrap();
    assert!(sub.status.success());
    let want = golden("fib-default");
    let want = String::from_utf8_lossy(&want);
    // Same report up to the annotation part (this one has --auto=no).
    let head = |s: &str| s.split("Auto-annotation").next().unwrap().to_string();
    assert_eq!(head(&String::from_utf8_lossy(&sub.stdout)), head(&want));
}
