//! Self-modifying and generated code (`fixtures/engine/smc.c`, one case per
//! argument) under the engine: the same output and exit status as native,
//! and exactly Valgrind's instruction counts, per function of the fixture
//! and for the generated code (`???`), with `--smc-check=all` on Valgrind's
//! side: its default skips file-backed mappings, memory files included, so
//! it would run stale code in the double-mapping cases.

mod common;
use common::*;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

fn build_smc(dir: &TempDir) -> PathBuf {
    // Nested functions need an executable stack: say so, without the
    // linker's warning. Symbols are bound at load (`-z now`): with lazy
    // binding, worker threads that make their first call of a function
    // at the same moment each run the PLT's resolver path (the PLT is
    // code without a name), natively as well, so the unnamed code's Ir
    // depended on thread timing (4 more in about one loaded run in
    // three).
    build(
        dir,
        "gcc",
        "smc.c",
        "smc",
        &["-Wl,-z,execstack", "-pthread", "-Wl,-z,now"],
    )
}

/// Ir of code without a name (`???`), in the engine's counts and in
/// Valgrind's profile of `exe case`. The generated code's is what a case
/// adds to the `none` case's: the start-up code the two attribute
/// differently (Valgrind has 42 more unnamed instructions in every
/// program, generated code or not) cancels out.
fn unnamed(procs: &[Counts], vg: &HashMap<(String, String), u64>) -> (u64, u64) {
    let ours = procs[0].by_function("???").get("???").copied().unwrap_or(0);
    let theirs = vg.get(&("???".into(), "???".into())).copied().unwrap_or(0);
    (ours, theirs)
}

/// Runs case `case` natively and under the engine (same behaviour), and
/// under Valgrind: equal Ir per function of smc.c and for the generated
/// code.
fn check_case(dir: &TempDir, exe: &Path, case: &str) {
    let nat = native(exe, &[case]);
    assert_eq!(nat.status, Some(0), "{case} natively: {}", nat.stderr);
    let (run, procs) = engine(dir, exe, &[case]);
    assert_same_behaviour(&nat, &run);
    assert_eq!(procs.len(), 1, "{}", run.stderr);
    let opts = ["--smc-check=all"];
    let (vg, _) = valgrind_with(dir, exe, &[case], &opts);
    let want = functions_of(&vg, "smc.c");
    let got = procs[0].by_function("smc.c");
    assert!(!want.is_empty(), "valgrind attributed nothing to smc.c");
    assert_eq!(got, want, "{case}: per-function Ir of smc.c");
    let (ours, theirs) = unnamed(&procs, &vg);
    let (_, base_procs) = engine(dir, exe, &["none"]);
    let (base_vg, _) = valgrind_with(dir, exe, &["none"], &opts);
    let (ours_base, theirs_base) = unnamed(&base_procs, &base_vg);
    assert!(
        theirs > theirs_base,
        "{case}: no generated code ran under Valgrind"
    );
    assert_eq!(
        ours - ours_base,
        theirs - theirs_base,
        "{case}: Ir of the generated code"
    );
}

#[test]
fn a_block_that_rewrites_its_own_next_instruction_runs_the_new_bytes() {
    testkit::require("valgrind");
    let dir = TempDir::new("smc-selfpatch");
    let exe = build_smc(&dir);
    check_case(&dir, &exe, "selfpatch");
}

#[test]
fn code_rewritten_in_an_rwx_buffer_between_calls() {
    testkit::require("valgrind");
    let dir = TempDir::new("smc-rewrite");
    let exe = build_smc(&dir);
    check_case(&dir, &exe, "rewrite");
}

#[test]
fn w_xor_x_double_mappings_of_a_memory_file_and_a_deleted_file() {
    testkit::require("valgrind");
    let dir = TempDir::new("smc-wx");
    let exe = build_smc(&dir);
    check_case(&dir, &exe, "wx");
    check_case(&dir, &exe, "wxfile");
}

#[test]
fn nested_function_trampolines_on_the_stack() {
    testkit::require("valgrind");
    let dir = TempDir::new("smc-nested");
    let exe = build_smc(&dir);
    check_case(&dir, &exe, "nested");
}

#[test]
fn code_unmapped_remapped_moved_and_reprotected() {
    testkit::require("valgrind");
    let dir = TempDir::new("smc-remap");
    let exe = build_smc(&dir);
    check_case(&dir, &exe, "remap");
}

#[test]
fn threads_running_code_that_another_thread_rewrites() {
    testkit::require("valgrind");
    let dir = TempDir::new("smc-threads");
    let exe = build_smc(&dir);
    check_case(&dir, &exe, "threads");
}

#[test]
fn without_checks_stale_code_runs_as_under_valgrind() {
    testkit::require("valgrind");
    let dir = TempDir::new("smc-none");
    let exe = build_smc(&dir);
    // --smc-check=none: the first translation of the buffer runs on, as
    // under Valgrind with the same option (so natively it differs).
    let (run, _) = engine_env(&dir, &exe, &["rewrite"], &[("COUNT_SMC_CHECK", "none")]);
    let (vg_stdout, _, _) = valgrind_output(&dir, &exe, &["rewrite"], &["--smc-check=none"]);
    assert_eq!(
        String::from_utf8_lossy(&run.stdout),
        String::from_utf8_lossy(&vg_stdout)
    );
    assert_ne!(run.stdout, native(&exe, &["rewrite"]).stdout);
    // --smc-check=stack checks the trampolines on the stack, not the heap.
    let env = [("COUNT_SMC_CHECK", "stack")];
    let (run, _) = engine_env(&dir, &exe, &["nested"], &env);
    assert_same_behaviour(&native(&exe, &["nested"]), &run);
    let (run, _) = engine_env(&dir, &exe, &["rewrite"], &env);
    assert_eq!(
        String::from_utf8_lossy(&run.stdout),
        String::from_utf8_lossy(&vg_stdout)
    );
}

#[test]
fn the_jit_fixture_runs_from_a_writable_and_executable_mapping() {
    testkit::require("valgrind");
    let dir = TempDir::new("jit-rwx");
    let exe = build(&dir, "gcc", "jit.c", "jit", &[]);
    check_built(&dir, &exe, &["rwx"], &["jit.c"]);
}
