//! Valgrind's own cg_annotate tests (`cachegrind/tests/ann*.vgtest`), run
//! as their `post:` lines say, with this binary in place of `cg_annotate`,
//! `cg_merge` and `cg_diff`: the output must be exactly `<test>.post.exp`.
//!
//! Each test runs in a scratch copy of the test data, so that the `touch`
//! commands of the `post:` lines can set modification times, with links
//! named after the tools one directory up, where the `post:` lines expect
//! them (`../cg_annotate`). The Invocation line then reads as in Valgrind's
//! expected output.

mod cg_support;

use cg_support::*;
use std::process::Command;

fn run_vgtest(name: &str) {
    let data = valgrind_testdata();
    let vgtest = std::fs::read_to_string(data.join(format!("{name}.vgtest")))
        .unwrap_or_else(|e| panic!("{name}.vgtest in {}: {e}", data.display()));
    let line = |key: &str| {
        vgtest
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .map(str::trim)
    };
    // The tools are this binary, not Python scripts.
    let post = line("post:").expect("a post: line").replace("python3 ", "");
    // A `prereq:` line may prepare files (`touch`); its Python check does
    // not apply.
    let prereq: Vec<&str> = line("prereq:")
        .unwrap_or("")
        .split("&&")
        .map(str::trim)
        .filter(|c| !c.is_empty() && !c.contains("python_test"))
        .collect();
    let script = prereq
        .into_iter()
        .chain([post.as_str()])
        .collect::<Vec<_>>()
        .join(" && ");

    let tmp = TempDir::new(&format!("vgtest-{name}"));
    let tests = tmp.path().join("tests");
    copy_tree(&data, &tests);
    // As in a fresh checkout, no file is newer than another until the
    // test's own `touch` commands run.
    set_all_mtimes(&tests);
    for tool in ["cg_annotate", "cg_merge", "cg_diff"] {
        std::os::unix::fs::symlink(binary(), tmp.path().join(tool)).unwrap();
    }
    let out = Command::new("sh")
        .arg("-c")
        .arg(&script)
        .current_dir(&tests)
        .env_remove("COLUMNS")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{name}: `{script}` failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stderr), "", "{name}: stderr");
    let want = std::fs::read(data.join(format!("{name}.post.exp"))).unwrap();
    assert_same_text(name, &out.stdout, &want);
}

macro_rules! vgtests {
    ($($test:ident => $name:literal,)*) => {
        $(
            #[test]
            fn $test() {
                run_vgtest($name);
            }
        )*
    };
}

vgtests! {
    ann1a => "ann1a",
    ann1b => "ann1b",
    ann2 => "ann2",
    ann_diff1 => "ann-diff1",
    ann_diff2 => "ann-diff2",
    ann_diff3 => "ann-diff3",
    ann_diff4 => "ann-diff4",
    ann_merge1 => "ann-merge1",
    ann_merge2 => "ann-merge2",
}

/// Every `ann*.vgtest` in the test data has a test above.
#[test]
fn all_valgrind_tests_are_covered() {
    let mut names: Vec<String> = std::fs::read_dir(valgrind_testdata())
        .unwrap()
        .filter_map(|e| {
            let name = e.unwrap().file_name().into_string().ok()?;
            name.strip_suffix(".vgtest").map(str::to_string)
        })
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            "ann-diff1",
            "ann-diff2",
            "ann-diff3",
            "ann-diff4",
            "ann-merge1",
            "ann-merge2",
            "ann1a",
            "ann1b",
            "ann2"
        ]
    );
}
