//! What the integration tests of every crate share: scratch directories,
//! and the one check that an oracle (Valgrind, its Perl scripts) or a tool a
//! test drives (a compiler, a workload) is installed. A test whose oracle
//! is missing fails, loudly, naming what to install; it never passes with
//! nothing to compare with.
//!
//! A dev-dependency only: nothing here ships in the tools.
#![forbid(unsafe_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};

/// A fresh directory under the system's temporary directory, removed (with
/// everything in it) when dropped.
pub struct TempDir(pub PathBuf);

impl TempDir {
    /// A new, empty directory whose name contains `tag`, the process id and
    /// a counter (so tests running in parallel never share one).
    pub fn new(tag: &str) -> TempDir {
        static N: AtomicUsize = AtomicUsize::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("cachescope-{tag}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)
            .unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
        TempDir(dir)
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.0
    }

    /// A path inside the directory.
    pub fn join(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Whether `tool --version` runs and succeeds.
pub fn have(tool: &str) -> bool {
    Command::new(tool)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Fails the test, loudly, when `tool` (an oracle or a tool the test
/// drives) is not installed.
pub fn require(tool: &str) {
    assert!(
        have(tool),
        "this test needs `{tool}` on PATH (an oracle or a tool it drives): \
         install it (scripts/setup installs what the tests need)"
    );
}

/// The `-nostdlib` fixture `name` of `fixtures/sim` (`nostdlib_*.c`).
pub fn sim_fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures/sim")
        .join(name)
        .canonicalize()
        .unwrap_or_else(|e| panic!("fixture {name}: {e}"))
}

/// The compiler flags on the `cflags:` comment line of the C file `src`.
pub fn cflags(src: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(src)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", src.display()));
    let line = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("cflags:"))
        .unwrap_or_else(|| panic!("{}: no cflags: line", src.display()));
    line.split_whitespace().map(str::to_owned).collect()
}

/// Compiles the `-nostdlib` fixture `name` of `fixtures/sim` with gcc
/// (static, not position-independent, no stack protector or CET, with the
/// flags of its `cflags:` line, `-g`) into `dir`; returns the executable.
pub fn build_nostdlib(dir: &TempDir, name: &str) -> PathBuf {
    require("gcc");
    let src = sim_fixture(name);
    let exe = dir.join(name.trim_end_matches(".c"));
    let st = Command::new("gcc")
        .args(cflags(&src))
        .args([
            "-g",
            "-static",
            "-nostdlib",
            "-no-pie",
            "-fno-pie",
            "-fno-stack-protector",
            "-fcf-protection=none",
            "-o",
        ])
        .arg(&exe)
        .arg(&src)
        .status()
        .unwrap_or_else(|e| panic!("cannot run gcc: {e}"));
    assert!(st.success(), "gcc failed on {name}");
    exe
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn directories_are_fresh_and_go_away() {
        let a = TempDir::new("testkit");
        let b = TempDir::new("testkit");
        assert_ne!(a.path(), b.path());
        std::fs::write(a.join("f"), b"x").unwrap();
        let p = a.path().to_path_buf();
        drop(a);
        assert!(!p.exists());
    }

    #[test]
    fn a_missing_tool_is_told() {
        assert!(!have("cachescope-no-such-tool"));
        assert!(std::panic::catch_unwind(|| require("cachescope-no-such-tool")).is_err());
        assert!(have("sh") || have("true") || have("gcc"));
    }
}
