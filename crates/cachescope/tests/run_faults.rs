//! Synchronous signals raised by guest instructions in translated code are
//! delivered with the client's exact context (`fixtures/engine/faults.c`):
//! RIP and `si_addr` are the guest instruction's, registers the
//! translation borrowed hold their guest values, a handler may fix a
//! register and return (the instruction runs again), set RIP past it, or
//! jump out, `backtrace()` walks the client's frames, and without a handler
//! the process dies of the signal. Output and exit as natively, in counting
//! and in trace mode. And the engine's own code raises none: with EFLAGS.AC
//! set, checked generated code at an odd address runs (no misaligned read).

mod run_support;

use run_support::{compile, native, require, under_cachescope, End, TempDir};

#[test]
fn synchronous_signals_see_the_native_context() {
    require("gcc");
    let dir = TempDir::new("faults");
    let exe = dir.join("faults");
    compile("gcc", &["-O1", "-g", "-rdynamic"], "faults.c", &exe);
    for mode in [
        "fix",
        "skip",
        "icall",
        "fpe",
        "trap",
        "backtrace",
        "die",
        "ac",
    ] {
        let nat = native(dir.path(), exe.as_os_str(), &[mode], None);
        let text = String::from_utf8_lossy(&nat.stdout).into_owned();
        match mode {
            "die" => assert_eq!(nat.end, End::Signal(11), "{text}"),
            _ => {
                assert_eq!(nat.end, End::Code(0), "{text}");
                // The fixture's own checks pass natively.
                assert!(!text.contains("WRONG"), "{text}");
            }
        }
        if mode == "backtrace" {
            assert!(
                text.contains("frame level3\nframe level2\nframe level1\n"),
                "{text}"
            );
        }
        for sim in [&[][..], &["--cache-sim=yes", "--branch-sim=yes"][..]] {
            let mut opts = vec!["-q", "--cachegrind-out-file=/dev/null"];
            opts.extend_from_slice(sim);
            let ours = under_cachescope(dir.path(), &opts, exe.as_os_str(), &[mode], None);
            assert_eq!(
                String::from_utf8_lossy(&ours.stdout),
                text,
                "{mode} {sim:?}: {}",
                ours.stderr_text()
            );
            assert_eq!(ours.end, nat.end, "{mode} {sim:?}: {}", ours.stderr_text());
        }
    }
}
