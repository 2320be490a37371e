//! Instructions this processor cannot run raise SIGILL under cachescope
//! exactly as natively (`fixtures/engine/sigill.c`): a handler sees the
//! same `si_code`, `si_addr` and RIP, may resume after the instruction or
//! jump out, and without one the process dies of the signal. In counting
//! and in trace mode.

mod run_support;

use run_support::{compile, native, require, same_in_both_modes, End, TempDir};

#[test]
fn sigill_is_delivered_as_natively() {
    require("gcc");
    let dir = TempDir::new("sigill");
    let exe = dir.join("sigill");
    compile("gcc", &["-O1", "-g"], "sigill.c", &exe);
    for mode in ["skip", "longjmp", "die"] {
        let nat = native(dir.path(), exe.as_os_str(), &[mode], None);
        let text = String::from_utf8_lossy(&nat.stdout).into_owned();
        match mode {
            "die" => assert_eq!(nat.end, End::Signal(libc_sigill()), "{text}"),
            _ => {
                assert_eq!(nat.end, End::Code(0));
                // Each instruction the processor lacks twice, and (the
                // fixture checks) at the right address with ILL_ILLOPN:
                // `ud2` and the invalid opcode always; `xbegin` without
                // TSX and the FP16 instruction without AVX512-FP16 (an
                // Intel processor with TSX runs the first natively).
                let raised = text.matches("SIGILL 4 code 2 addr ok rip ok\n").count();
                assert!(
                    (4..=8).contains(&raised) && raised.is_multiple_of(2),
                    "{text}"
                );
            }
        }
        same_in_both_modes(dir.path(), &exe, &[mode], &text, nat.end);
    }
}

/// SIGILL's number on Linux.
fn libc_sigill() -> i32 {
    4
}
