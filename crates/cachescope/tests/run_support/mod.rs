//! Shared helpers of the run-mode end-to-end tests: temporary directories,
//! compiling fixtures, running a program natively, under cachescope and
//! under Valgrind's Cachegrind, and reading `cachegrind.out` files.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// The cachescope binary under test.
pub fn cachescope() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_cachescope"))
}

/// The repository's fixture directory for the engine corpus.
pub fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures/engine")
        .join(name)
        .canonicalize()
        .unwrap_or_else(|e| panic!("fixture {name}: {e}"))
}

// Each test crate that includes this module uses some of these.
#[allow(unused_imports)]
pub use testkit::{have, require, TempDir};

/// Compiles fixture `src` with `compiler` and `flags` into `out`.
pub fn compile(compiler: &str, flags: &[&str], src: &str, out: &Path) {
    let o = Command::new(compiler)
        .args(flags)
        .arg(fixture(src))
        .arg("-o")
        .arg(out)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "{compiler} {flags:?} {src} failed:\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// Compiles fixture sources `srcs` of `fixtures/callgrind` (C, or C++ by
/// the first one's extension) with `flags`, `-g` and `-pthread` into `dir`.
#[allow(dead_code)]
pub fn callgrind_fixture(dir: &TempDir, srcs: &[&str], flags: &[&str]) -> PathBuf {
    let base = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/callgrind");
    let compiler = if srcs[0].ends_with(".cpp") {
        "g++"
    } else {
        "gcc"
    };
    require(compiler);
    let exe = dir.join(srcs[0].split('.').next().unwrap());
    let o = Command::new(compiler)
        .args(flags)
        .args(["-g", "-pthread"])
        .args(srcs.iter().map(|s| base.join(s)))
        .arg("-o")
        .arg(&exe)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    exe
}

/// Linker flag binding every symbol at start: the lazy binder's variant
/// (xsave or xsavec) depends on the CPU, which Valgrind's virtual one
/// changes.
#[allow(dead_code)]
pub const NOW: &[&str] = &["-Wl,-z,now"];

/// How a run ended, comparable across runs: exit code or signal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// Exit status.
    Code(i32),
    /// Killed by this signal.
    Signal(i32),
}

/// The observable result of one run.
#[derive(Debug, Clone)]
pub struct Run {
    /// Standard output.
    pub stdout: Vec<u8>,
    /// Standard error.
    pub stderr: Vec<u8>,
    /// How it ended.
    pub end: End,
}

impl From<Output> for Run {
    fn from(o: Output) -> Self {
        let end = match o.status.code() {
            Some(c) => End::Code(c),
            None => End::Signal(o.status.signal().unwrap_or(0)),
        };
        Run {
            stdout: o.stdout,
            stderr: o.stderr,
            end,
        }
    }
}

impl Run {
    /// Stderr as text.
    pub fn stderr_text(&self) -> String {
        String::from_utf8_lossy(&self.stderr).into_owned()
    }
}

fn run_cmd(mut c: Command, cwd: &Path, stdin: Option<&Path>) -> Run {
    c.current_dir(cwd);
    match stdin {
        Some(p) => c.stdin(std::fs::File::open(p).unwrap()),
        None => c.stdin(Stdio::null()),
    };
    c.output().unwrap().into()
}

/// Runs `prog args` natively in `cwd`.
pub fn native(cwd: &Path, prog: &OsStr, args: &[&str], stdin: Option<&Path>) -> Run {
    let mut c = Command::new(prog);
    c.args(args);
    run_cmd(c, cwd, stdin)
}

/// Runs `cachescope <opts> prog args` in `cwd`.
pub fn under_cachescope(
    cwd: &Path,
    opts: &[&str],
    prog: &OsStr,
    args: &[&str],
    stdin: Option<&Path>,
) -> Run {
    under_cachescope_env(cwd, opts, prog, args, stdin, &[])
}

/// [`under_cachescope`] with variables `env` set (the engine's debugging
/// knobs).
pub fn under_cachescope_env(
    cwd: &Path,
    opts: &[&str],
    prog: &OsStr,
    args: &[&str],
    stdin: Option<&Path>,
    env: &[(&str, &str)],
) -> Run {
    let mut c = Command::new(cachescope());
    c.args(opts).arg(prog).args(args).envs(env.iter().copied());
    let run = run_cmd(c, cwd, stdin);
    // The detached tracer's stderr is the client's: a panic there (after
    // the client ended as natively, say) shows only in this text. Our
    // crates' panics name their sources relative to the workspace; a
    // client's (a Rust fixture panics on purpose) are elsewhere.
    assert!(
        !run.stderr_text().contains("panicked at crates/"),
        "cachescope panicked: {}",
        run.stderr_text()
    );
    run
}

/// Runs `valgrind --tool=cachegrind --cache-sim=no -q <opts> prog args`.
pub fn under_valgrind(
    cwd: &Path,
    opts: &[&str],
    prog: &OsStr,
    args: &[&str],
    stdin: Option<&Path>,
) -> Run {
    let mut c = Command::new("valgrind");
    c.args(["--tool=cachegrind", "--cache-sim=no", "-q"])
        .args(opts)
        .arg(prog)
        .args(args);
    run_cmd(c, cwd, stdin)
}

/// A parsed `cachegrind.out` file (single event `Ir` expected).
#[derive(Debug, Clone, Default)]
pub struct CgOut {
    /// The `cmd:` text.
    pub cmd: String,
    /// The `events:` text.
    pub events: String,
    /// Ir per (file, function, line).
    pub costs: BTreeMap<(String, String, i64), u64>,
    /// The `summary:` value.
    pub summary: u64,
}

impl CgOut {
    /// Reads and checks the structure of a `cachegrind.out` file.
    pub fn read(path: &Path) -> CgOut {
        let text =
            std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let mut out = CgOut::default();
        let (mut fl, mut func) = (None::<String>, None::<String>);
        let mut saw_summary = false;
        for (i, line) in text.lines().enumerate() {
            let at = || format!("{}:{}", path.display(), i + 1);
            if let Some(v) = line.strip_prefix("desc: ") {
                assert!(out.cmd.is_empty(), "{}: desc after cmd: {v}", at());
            } else if let Some(v) = line.strip_prefix("cmd: ") {
                out.cmd = v.to_string();
            } else if let Some(v) = line.strip_prefix("events: ") {
                out.events = v.to_string();
            } else if let Some(v) = line.strip_prefix("fl=") {
                fl = Some(v.to_string());
                func = None;
            } else if let Some(v) = line.strip_prefix("fn=") {
                assert!(fl.is_some(), "{}: fn= before fl=", at());
                func = Some(v.to_string());
            } else if let Some(v) = line.strip_prefix("summary: ") {
                out.summary = v.trim().parse().unwrap();
                saw_summary = true;
            } else {
                let mut it = line.split(' ');
                let ln: i64 = it
                    .next()
                    .and_then(|t| t.parse().ok())
                    .unwrap_or_else(|| panic!("{}: bad line {line:?}", at()));
                let n: u64 = it.next().unwrap().parse().unwrap();
                assert!(it.next().is_none(), "{}: too many counts", at());
                let key = (fl.clone().unwrap(), func.clone().expect("fn"), ln);
                assert!(!out.costs.contains_key(&key), "{}: duplicate {key:?}", at());
                out.costs.insert(key, n);
            }
        }
        assert!(saw_summary, "{}: no summary line", path.display());
        out
    }

    /// Ir per (function, line), over the files whose name ends with
    /// `suffix`.
    pub fn lines_in(&self, suffix: &str) -> BTreeMap<(String, i64), u64> {
        let mut m = BTreeMap::new();
        for ((f, func, line), n) in &self.costs {
            if f.ends_with(suffix) {
                *m.entry((func.clone(), *line)).or_insert(0) += n;
            }
        }
        m
    }

    /// Sum of all counts (must equal `summary`).
    pub fn total(&self) -> u64 {
        self.costs.values().sum()
    }

    /// Ir per function, over the files whose name ends with `suffix`.
    pub fn functions_in(&self, suffix: &str) -> BTreeMap<String, u64> {
        let mut m = BTreeMap::new();
        for ((f, func, _), n) in &self.costs {
            if f.ends_with(suffix) {
                *m.entry(func.clone()).or_insert(0) += n;
            }
        }
        m
    }
}

/// Every file in `dir` whose name starts with `prefix`, sorted.
pub fn files_with_prefix(dir: &Path, prefix: &str) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(prefix))
        })
        .collect();
    v.sort();
    v
}

/// Checks that Valgrind's Perl `cg_annotate`, and ours, read `path`
/// without complaint.
pub fn annotate_ok(path: &Path) {
    // Valgrind's own, by its path (a valgrind-shim on PATH would be ours);
    // missing, the test fails (scripts/setup installs Valgrind).
    let theirs = Path::new("/usr/bin/cg_annotate");
    assert!(
        theirs.exists(),
        "this test needs Valgrind's {}",
        theirs.display()
    );
    let o = Command::new(theirs).arg(path).output().unwrap();
    assert!(
        o.status.success() && o.stderr.is_empty(),
        "Valgrind's cg_annotate on {}: {}",
        path.display(),
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(String::from_utf8_lossy(&o.stdout).contains("PROGRAM TOTALS"));
    let o = Command::new(cachescope())
        .arg("annotate")
        .arg(path)
        .output()
        .unwrap();
    assert!(
        o.status.success() && o.stderr.is_empty(),
        "cachescope annotate on {}: {}",
        path.display(),
        String::from_utf8_lossy(&o.stderr)
    );
}

/// Replaces the thread ids Rust prints in panic messages (`thread 'main'
/// (12345) panicked`), which differ from run to run, with `N`.
pub fn mask_thread_ids(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find("' (") {
        out.push_str(&rest[..i + 3]);
        rest = &rest[i + 3..];
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits > 0 && rest[digits..].starts_with(')') {
            out.push('N');
            rest = &rest[digits..];
        }
    }
    out.push_str(rest);
    out
}

/// Fails loudly without perl or Valgrind's `callgrind_annotate` (which
/// dies with its version on stderr, so [`require`] cannot tell).
pub fn require_callgrind_annotate() {
    assert!(
        have("perl"),
        "perl is not installed: the callgrind_annotate oracle tests need it (scripts/setup)"
    );
    let version = Command::new("callgrind_annotate").arg("--version").output();
    let ok = version
        .is_ok_and(|o| String::from_utf8_lossy(&o.stderr).starts_with("callgrind_annotate-"));
    assert!(
        ok,
        "Valgrind's callgrind_annotate is not installed: the oracle tests need it (scripts/setup)"
    );
}

/// A fixture that prints `calls N` (how many calls its work function got,
/// which depends on how many signals arrived): N, and Ir per function of
/// the source file `file` in the profile at `out`.
pub fn calls_and_functions(out: &Path, stdout: &[u8], file: &str) -> (BTreeMap<String, u64>, u64) {
    let text = String::from_utf8_lossy(stdout);
    let calls = text
        .trim()
        .strip_prefix("calls ")
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("unexpected output {text:?}"));
    (CgOut::read(out).functions_in(file), calls)
}

/// Runs `exe args` under cachescope in counting mode and in trace mode
/// (both simulations): each run must print `native_stdout` and end as
/// `native_end` did natively.
pub fn same_in_both_modes(
    cwd: &Path,
    exe: &Path,
    args: &[&str],
    native_stdout: &str,
    native_end: End,
) {
    for sim in [&[][..], &["--cache-sim=yes", "--branch-sim=yes"][..]] {
        let mut opts = vec!["-q", "--cachegrind-out-file=/dev/null"];
        opts.extend_from_slice(sim);
        let ours = under_cachescope(cwd, &opts, exe.as_os_str(), args, None);
        assert_eq!(
            String::from_utf8_lossy(&ours.stdout),
            native_stdout,
            "{args:?} {sim:?}: {}",
            ours.stderr_text()
        );
        assert_eq!(
            ours.end,
            native_end,
            "{args:?} {sim:?}: {}",
            ours.stderr_text()
        );
    }
}

/// Runs `exe args` under cachescope `runs` times (a fixture that prints
/// `calls N`, see [`calls_and_functions`]); for each run, Ir per function
/// of source file `file` and the calls printed.
pub fn counted_runs(
    dir: &TempDir,
    exe: &Path,
    args: &[&str],
    file: &str,
    runs: usize,
) -> Vec<(BTreeMap<String, u64>, u64)> {
    (0..runs)
        .map(|run| {
            let out = dir.join(&format!("run{run}.out"));
            let opt = format!("--cachegrind-out-file={}", out.display());
            let r = under_cachescope(dir.path(), &["-q", &opt], exe.as_os_str(), args, None);
            assert_eq!(r.end, End::Code(0), "run {run}: {}", r.stderr_text());
            calls_and_functions(&out, &r.stdout, file)
        })
        .collect()
}
