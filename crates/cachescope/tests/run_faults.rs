//! Synchronous signals raised by guest instructions in translated code are
//! delivered with the client's exact context (`fixtures/engine/faults.c`):
//! RIP and `si_addr` are the guest instruction's, registers the
//! translation borrowed hold their guest values, a handler may fix a
//! register and return (the instruction runs again), set RIP past it, or
//! jump out, `backtrace()` walks the client's frames (and a fault among
//! checks that keep the flags in RAX shows the guest's RAX and flags), and without a handler
//! the process dies of the signal. Output and exit as natively, in counting
//! and in trace mode. And the engine's own code raises none: with EFLAGS.AC
//! set, checked generated code at an odd address runs (no misaligned read).

mod run_support;

use run_support::{
    compile, native, require, same_in_both_modes, under_cachescope, under_valgrind, CgOut, End,
    TempDir,
};

#[test]
fn synchronous_signals_see_the_native_context() {
    require("gcc");
    let dir = TempDir::new("faults");
    let exe = dir.join("faults");
    compile("gcc", &["-O1", "-g", "-rdynamic"], "faults.c", &exe);
    for mode in [
        "fix",
        "skip",
        "flags",
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
        same_in_both_modes(dir.path(), &exe, &[mode], &text, nat.end);
    }
}

/// `fixtures/engine/repfault.c`: `rep movsb` and `repe cmpsb` that fault
/// part-way and are left with `siglongjmp` count the iterations begun, as
/// Cachegrind does (the whole RCX before), and nothing after them in their
/// block; per function of the fixture, Ir equals Valgrind's.
#[test]
fn rep_instructions_left_by_siglongjmp_count_the_iterations_begun() {
    require("gcc");
    require("valgrind");
    let dir = TempDir::new("repfault");
    let exe = dir.join("repfault");
    compile("gcc", &["-O1", "-g"], "repfault.c", &exe);
    let nat = native(dir.path(), exe.as_os_str(), &[], None);
    assert_eq!(nat.end, End::Code(0));
    let ours = dir.join("cs.out");
    let opt = format!("--cachegrind-out-file={}", ours.display());
    let cs = under_cachescope(dir.path(), &["-q", &opt], exe.as_os_str(), &[], None);
    assert_eq!((cs.end, &cs.stdout), (nat.end, &nat.stdout));
    let theirs = dir.join("vg.out");
    let opt = format!("--cachegrind-out-file={}", theirs.display());
    let vg = under_valgrind(dir.path(), &[&opt], exe.as_os_str(), &[], None);
    assert_eq!(vg.stdout, nat.stdout);
    let want = CgOut::read(&theirs).functions_in("repfault.c");
    assert_eq!(want["copy_into_guard"], 3 * 1002, "{want:?}");
    assert_eq!(CgOut::read(&ours).functions_in("repfault.c"), want);
}
