//! Separate debug files found through `.gnu_debuglink` (next to the object
//! and in its `.debug/` directory, CRC checked), as Valgrind finds them.

use std::path::{Path, PathBuf};
use std::process::Command;

use symbols::ObjectInfo;

fn run(cmd: &str, args: &[&str]) {
    let st = Command::new(cmd).args(args).status().unwrap();
    assert!(st.success(), "{cmd} {args:?}");
}

/// `main`'s address in `exe`, from `nm`.
fn main_addr(exe: &Path) -> u64 {
    let out = Command::new("nm").arg(exe).output().unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    let line = text
        .lines()
        .find(|l| l.ends_with(" T main"))
        .expect("main in nm output");
    u64::from_str_radix(line.split(' ').next().unwrap(), 16).unwrap()
}

/// Builds `exe` with debug info, then a stripped copy whose debug info
/// lives in `debug_dir/sym_c.debug`, linked by `.gnu_debuglink`.
fn stripped_with_debuglink(dir: &Path, debug_dir: &Path) -> (PathBuf, PathBuf, u64) {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/sym_c.c");
    let full = dir.join("full");
    let exe = dir.join("sym_c");
    let debug = debug_dir.join("sym_c.debug");
    std::fs::create_dir_all(debug_dir).unwrap();
    // No build id, so that only the debuglink can find the debug file.
    run(
        "gcc",
        &[
            "-g",
            "-O1",
            "-Wl,--build-id=none",
            src.to_str().unwrap(),
            "-o",
            full.to_str().unwrap(),
        ],
    );
    run(
        "objcopy",
        &[
            "--only-keep-debug",
            full.to_str().unwrap(),
            debug.to_str().unwrap(),
        ],
    );
    let link = format!("--add-gnu-debuglink={}", debug.display());
    run(
        "objcopy",
        &[
            "--strip-debug",
            "--strip-unneeded",
            &link,
            full.to_str().unwrap(),
            exe.to_str().unwrap(),
        ],
    );
    let addr = main_addr(&full);
    (exe, debug, addr)
}

fn tmp(label: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("symbols-debuglink-{}-{label}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn debuglink_next_to_the_object_and_in_dot_debug() {
    testkit::require("gcc");
    testkit::require("objcopy");
    testkit::require("nm");
    for sub in ["", ".debug"] {
        let dir = tmp(if sub.is_empty() { "same" } else { "dotdebug" });
        let (exe, debug, main) = stripped_with_debuglink(&dir, &dir.join(sub));
        let obj = ObjectInfo::load(&exe).unwrap();
        assert_eq!(obj.debug_path(), Some(debug.as_path()));
        let (file, line) = obj.line_at(main).expect("line info from the debug file");
        assert!(file.ends_with("tests/fixtures/sym_c.c"), "{file}");
        assert!(line > 0);
        assert_eq!(obj.function_at(main).as_deref(), Some("main"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

#[test]
fn debuglink_with_wrong_crc_is_ignored() {
    testkit::require("gcc");
    testkit::require("objcopy");
    testkit::require("nm");
    let dir = tmp("badcrc");
    let (exe, debug, main) = stripped_with_debuglink(&dir, &dir);
    let mut bytes = std::fs::read(&debug).unwrap();
    bytes.push(0);
    std::fs::write(&debug, bytes).unwrap();
    let obj = ObjectInfo::load(&exe).unwrap();
    assert_eq!(obj.debug_path(), None);
    assert_eq!(obj.line_at(main), None);
    std::fs::remove_dir_all(&dir).unwrap();
}
