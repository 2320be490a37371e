//! Helpers shared by the cg_annotate / cg_merge / cg_diff tests: temporary
//! directories, running the binary under a tool's name, and comparing text
//! with a readable report.
#![allow(dead_code)]

use std::ffi::OsStr;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The binary under test.
pub fn binary() -> &'static str {
    env!("CARGO_BIN_EXE_cachescope")
}

/// Valgrind's cg_annotate tests, beside the repository.
pub fn valgrind_testdata() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/testdata/cg_annotate")
}

/// This crate's golden files.
pub fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden")
}

pub use testkit::TempDir;

/// Copies a directory tree, making everything writable.
pub fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_tree(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap();
            let mut perms = std::fs::metadata(&target).unwrap().permissions();
            #[allow(clippy::permissions_set_readonly_false)]
            perms.set_readonly(false);
            std::fs::set_permissions(&target, perms).unwrap();
        }
    }
}

/// Runs the binary as `tool` (its argv[0]) in `dir`.
pub fn run_tool<I, S>(tool: &str, dir: &Path, args: I) -> Output
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    Command::new(binary())
        .arg0(tool)
        .args(args)
        .current_dir(dir)
        .env_remove("COLUMNS")
        .output()
        .unwrap()
}

/// Asserts two texts are equal, showing the first differing line.
pub fn assert_same_text(what: &str, got: &[u8], want: &[u8]) {
    if got == want {
        return;
    }
    let g = String::from_utf8_lossy(got);
    let w = String::from_utf8_lossy(want);
    let (gl, wl): (Vec<&str>, Vec<&str>) = (g.split('\n').collect(), w.split('\n').collect());
    let line = gl
        .iter()
        .zip(&wl)
        .position(|(a, b)| a != b)
        .unwrap_or(gl.len().min(wl.len()));
    panic!(
        "{what}: output differs at line {}\n got: {:?}\nwant: {:?}\n--- whole output ---\n{g}",
        line + 1,
        gl.get(line),
        wl.get(line)
    );
}

/// Sets the modification times of `paths`, in order, one second apart,
/// starting far in the past, so later paths are newer.
pub fn set_mtimes_in_order(paths: &[PathBuf]) {
    let base = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_600_000_000);
    for (i, p) in paths.iter().enumerate() {
        let f = std::fs::File::options().append(true).open(p).unwrap();
        f.set_modified(base + std::time::Duration::from_secs(i as u64))
            .unwrap();
    }
}

/// Gives every file under `dir` the same modification time, in the past.
pub fn set_all_mtimes(dir: &Path) {
    let when = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_600_000_000);
    for entry in std::fs::read_dir(dir).unwrap() {
        let entry = entry.unwrap();
        if entry.file_type().unwrap().is_dir() {
            set_all_mtimes(&entry.path());
        } else {
            let f = std::fs::File::options()
                .append(true)
                .open(entry.path())
                .unwrap();
            f.set_modified(when).unwrap();
        }
    }
}
