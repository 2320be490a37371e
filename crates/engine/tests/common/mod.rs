//! Shared helpers of the engine's integration tests: compile fixtures into
//! a temporary directory, run them natively, under the engine (through the
//! `count` example, so that the client's stdout can be captured) and under
//! Valgrind, and compare.
#![allow(dead_code)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

pub use testkit::TempDir;

/// The fixture source `name` in `fixtures/engine`.
pub fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures/engine")
        .join(name)
        .canonicalize()
        .expect("fixture exists")
}

/// Compiles `src` with `compiler` and `flags` into `dir/out`.
pub fn build(dir: &TempDir, compiler: &str, src: &str, out: &str, flags: &[&str]) -> PathBuf {
    let exe = dir.0.join(out);
    let mut cmd = Command::new(compiler);
    if compiler == "rustc" {
        cmd.args(["--edition", "2021", "-C", "opt-level=1", "-g", "-o"]);
    } else {
        cmd.args(["-O1", "-g", "-o"]);
    }
    cmd.arg(&exe).arg(fixture(src)).args(flags);
    let st = cmd
        .status()
        .unwrap_or_else(|e| panic!("cannot run {compiler}: {e}"));
    assert!(st.success(), "{compiler} failed on {src}");
    exe
}

/// The `count` example binary (built by `cargo test` with the tests).
pub fn count_bin() -> PathBuf {
    let exe = std::env::current_exe().expect("test exe");
    let dir = exe.parent().and_then(Path::parent).expect("target dir");
    let bin = dir.join("examples").join("count");
    assert!(
        bin.exists(),
        "{} missing: run through cargo test",
        bin.display()
    );
    bin
}

/// One process's counts as reported by the engine.
#[derive(Debug, Default)]
pub struct Counts {
    pub pid: i32,
    pub modules: Vec<symbols::Mapping>,
    pub counts: HashMap<u64, u64>,
    /// Counts of code unmapped before exit, with the mapping it ran from.
    pub unmapped: Vec<(symbols::Mapping, HashMap<u64, u64>)>,
}

impl Counts {
    /// Total Ir.
    pub fn total(&self) -> u64 {
        self.counts.values().sum::<u64>()
            + self.unmapped.iter().flat_map(|u| u.1.values()).sum::<u64>()
    }

    /// Ir per function of the source file named `file` (by base name).
    pub fn by_function(&self, file: &str) -> HashMap<String, u64> {
        let mut sym = symbols::Symbolizer::new();
        let mut out: HashMap<String, u64> = HashMap::new();
        let sets = std::iter::once((self.modules.clone(), &self.counts))
            .chain(self.unmapped.iter().map(|(m, c)| (vec![m.clone()], c)));
        for (modules, counts) in sets {
            for (&a, &n) in counts {
                let loc = sym.locate(&modules, a);
                if Path::new(&*loc.file).file_name().and_then(|f| f.to_str()) == Some(file) {
                    *out.entry(loc.func.to_string()).or_default() += n;
                }
            }
        }
        out
    }
}

/// What a run printed and how it ended.
pub struct Run {
    pub stdout: Vec<u8>,
    pub stderr: String,
    pub status: Option<i32>,
}

fn to_run(o: Output) -> Run {
    Run {
        stdout: o.stdout,
        stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
        status: o.status.code(),
    }
}

/// Runs `exe args` natively.
pub fn native(exe: &Path, args: &[&str]) -> Run {
    to_run(
        Command::new(exe)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("run natively"),
    )
}

/// Runs `exe args` under the engine; returns the run and each process's
/// counts in the order they were reported.
pub fn engine(dir: &TempDir, exe: &Path, args: &[&str]) -> (Run, Vec<Counts>) {
    engine_env(dir, exe, args, &[])
}

/// [`engine`] with extra environment variables for the `count` example.
pub fn engine_env(
    dir: &TempDir,
    exe: &Path,
    args: &[&str],
    env: &[(&str, &str)],
) -> (Run, Vec<Counts>) {
    let out = dir.0.join(format!(
        "counts-{}.txt",
        exe.file_name().unwrap().to_string_lossy()
    ));
    let _ = std::fs::remove_file(&out);
    let run = to_run(
        Command::new(count_bin())
            .arg(exe)
            .args(args)
            .env("COUNT_OUT", &out)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .output()
            .expect("run count"),
    );
    let text = std::fs::read_to_string(&out).unwrap_or_default();
    let mut procs: Vec<Counts> = Vec::new();
    for line in text.lines() {
        if let Some(pid) = line.strip_prefix("process ") {
            procs.push(Counts {
                pid: pid.parse().unwrap(),
                ..Default::default()
            });
        } else if let Some(m) = line.strip_prefix("unmapped ") {
            let mut it = m.splitn(4, ' ');
            let h = |s: Option<&str>| u64::from_str_radix(s.unwrap(), 16).unwrap();
            let (start, end, off) = (h(it.next()), h(it.next()), h(it.next()));
            let map = symbols::Mapping {
                path: PathBuf::from(it.next().unwrap_or("")),
                start,
                end,
                file_offset: off,
            };
            procs
                .last_mut()
                .unwrap()
                .unmapped
                .push((map, HashMap::new()));
        } else if let Some(m) = line.strip_prefix("module ") {
            let mut it = m.splitn(4, ' ');
            let h = |s: Option<&str>| u64::from_str_radix(s.unwrap(), 16).unwrap();
            let (start, end, off) = (h(it.next()), h(it.next()), h(it.next()));
            procs.last_mut().unwrap().modules.push(symbols::Mapping {
                path: PathBuf::from(it.next().unwrap_or("")),
                start,
                end,
                file_offset: off,
            });
        } else if let Some((a, n)) = line.split_once(' ') {
            let a = u64::from_str_radix(a, 16).unwrap();
            let n = u64::from_str_radix(n, 16).unwrap();
            let p = procs.last_mut().unwrap();
            match p.unmapped.last_mut() {
                Some(u) => u.1.insert(a, n),
                None => p.counts.insert(a, n),
            };
        }
    }
    (run, procs)
}

/// Runs `exe args` under `valgrind --tool=cachegrind --cache-sim=no` and
/// returns its profile's Ir per (file base name, function) and the total.
pub fn valgrind(dir: &TempDir, exe: &Path, args: &[&str]) -> (HashMap<(String, String), u64>, u64) {
    valgrind_with(dir, exe, args, &[])
}

/// [`valgrind`] with more of Valgrind's options (`opts`).
pub fn valgrind_with(
    dir: &TempDir,
    exe: &Path,
    args: &[&str],
    opts: &[&str],
) -> (HashMap<(String, String), u64>, u64) {
    let (_, by_fn, total) = valgrind_output(dir, exe, args, opts);
    (by_fn, total)
}

/// [`valgrind_with`], and what the client printed on stdout.
pub fn valgrind_output(
    dir: &TempDir,
    exe: &Path,
    args: &[&str],
    opts: &[&str],
) -> (Vec<u8>, HashMap<(String, String), u64>, u64) {
    let out = dir.0.join(format!(
        "cachegrind.out.{}",
        exe.file_name().unwrap().to_string_lossy()
    ));
    let run = Command::new("valgrind")
        .args(["--tool=cachegrind", "--cache-sim=no", "-q"])
        .args(opts)
        .arg(format!("--cachegrind-out-file={}", out.display()))
        .arg(exe)
        .args(args)
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .expect("valgrind runs");
    let text = std::fs::read_to_string(&out).expect("valgrind wrote its profile");
    let mut by_fn: HashMap<(String, String), u64> = HashMap::new();
    let mut total = 0;
    let (mut file, mut func) = (String::new(), String::new());
    for line in text.lines() {
        if let Some(f) = line.strip_prefix("fl=") {
            file = Path::new(f)
                .file_name()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_default();
        } else if let Some(f) = line.strip_prefix("fn=") {
            func = f.to_string();
        } else if line.starts_with(|c: char| c.is_ascii_digit()) {
            let mut it = line.split_ascii_whitespace();
            let _line = it.next();
            let n: u64 = it.next().and_then(|v| v.parse().ok()).unwrap_or(0);
            *by_fn.entry((file.clone(), func.clone())).or_default() += n;
            total += n;
        }
    }
    (run.stdout, by_fn, total)
}

/// Valgrind's per-function Ir for the functions of source file `file`.
pub fn functions_of(vg: &HashMap<(String, String), u64>, file: &str) -> HashMap<String, u64> {
    vg.iter()
        .filter(|((f, _), _)| f == file)
        .map(|((_, func), &n)| (func.clone(), n))
        .collect()
}

/// Asserts the run under the engine printed and exited like the native one.
pub fn assert_same_behaviour(native: &Run, under: &Run) {
    assert_eq!(
        String::from_utf8_lossy(&native.stdout),
        String::from_utf8_lossy(&under.stdout),
        "stdout differs; engine stderr:\n{}",
        under.stderr
    );
    assert_eq!(
        native.status, under.status,
        "exit status differs; engine stderr:\n{}",
        under.stderr
    );
}

/// Builds `src`, checks that the engine runs it like native, and that every
/// function of `src` has exactly Valgrind's Ir. Returns the engine's counts.
pub fn check_fixture(tag: &str, compiler: &str, src: &str, flags: &[&str]) -> Vec<Counts> {
    let dir = TempDir::new(tag);
    let exe = build(&dir, compiler, src, tag, flags);
    check_built(&dir, &exe, &[], &[src])
}

/// Checks the built `exe` run with `args`: same behaviour as native, and
/// Valgrind's Ir for every function of each source file in `srcs`.
pub fn check_built(dir: &TempDir, exe: &Path, args: &[&str], srcs: &[&str]) -> Vec<Counts> {
    let nat = native(exe, args);
    let (run, procs) = engine(dir, exe, args);
    assert_same_behaviour(&nat, &run);
    assert!(!procs.is_empty(), "no profile reported: {}", run.stderr);
    let (vg, _) = valgrind(dir, exe, args);
    for src in srcs {
        let want = functions_of(&vg, src);
        let got = procs[procs.len() - 1].by_function(src);
        assert!(!want.is_empty(), "valgrind attributed nothing to {src}");
        assert_eq!(
            got, want,
            "per-function Ir of {src} differs from Valgrind's"
        );
    }
    procs
}
