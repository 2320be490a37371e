//! The fixture corpus under the engine: same output and exit status as
//! native, and Valgrind's instruction counts (exactly, in total for the
//! -nostdlib program; per function of the fixture's own source otherwise,
//! since libc picks CPU-specific routines that Valgrind's CPUID hides).

mod common;
use common::*;

#[test]
fn nostdlib_total_equals_valgrind() {
    let dir = TempDir::new("nostdlib");
    let exe = build(
        &dir,
        "gcc",
        "nostdlib.c",
        "nostdlib",
        &["-static", "-nostdlib", "-no-pie", "-fno-pie"],
    );
    let nat = native(&exe, &[]);
    let (run, procs) = engine(&dir, &exe, &[]);
    assert_same_behaviour(&nat, &run);
    assert_eq!(procs.len(), 1);
    let (_, vg_total) = valgrind(&dir, &exe, &[]);
    assert_eq!(procs[0].total(), vg_total);
    // The client request sequence counts as one instruction of 19 bytes.
    assert_eq!(
        procs[0].by_function("nostdlib.c").values().sum::<u64>(),
        vg_total - 6
    );
}

#[test]
fn loops_recursion_pointers_switch_dynamic_pie() {
    check_fixture("loops-pie", "gcc", "loops.c", &["-pie", "-fpie"]);
}

#[test]
fn loops_dynamic_non_pie() {
    check_fixture("loops-nopie", "gcc", "loops.c", &["-no-pie", "-fno-pie"]);
}

#[test]
fn loops_static_glibc() {
    check_fixture("loops-static", "gcc", "loops.c", &["-static"]);
}

#[test]
fn setjmp_longjmp() {
    check_fixture("setjmp", "gcc", "setjmp.c", &[]);
}

#[test]
fn rep_string_instructions() {
    check_fixture("repstr", "gcc", "repstr.c", &[]);
}

#[test]
fn cpp_exceptions() {
    check_fixture("exceptions", "g++", "exceptions.cpp", &[]);
}

#[test]
fn rust_program() {
    check_fixture("rustprog", "rustc", "rustprog.rs", &[]);
}

#[test]
fn threads_count_exactly() {
    check_fixture("threads", "gcc", "threads.c", &["-pthread"]);
}

#[test]
fn fork_child_has_its_own_profile_and_spawned_program_runs_natively() {
    let dir = TempDir::new("fork");
    let exe = build(&dir, "gcc", "fork.c", "fork", &[]);
    let nat = native(&exe, &[]);
    let (run, procs) = engine(&dir, &exe, &[]);
    assert_same_behaviour(&nat, &run);
    // The forked child and the parent; the posix_spawn'd program runs
    // natively and, as under Valgrind, reports nothing.
    assert_eq!(procs.len(), 2, "{}", run.stderr);
    assert_ne!(procs[0].pid, procs[1].pid);
    let child: u64 = procs[0].by_function("fork.c").values().sum();
    let parent: u64 = procs[1].by_function("fork.c").values().sum();
    // The child ran work(30000) after the fork, the parent work(10000).
    assert!(child > parent + 100_000, "child {child}, parent {parent}");
}

#[test]
fn forked_processes_translating_in_turns_keep_their_own_code() {
    // Parent and child link the blocks translated before the fork to
    // different new code, in alternation: each must run (and count) only
    // its own translations, so each function's count equals that of one
    // process taking the same turns.
    let dir = TempDir::new("fork-pingpong");
    let exe = build(
        &dir,
        "gcc",
        "fork_pingpong.c",
        "fork_pingpong",
        &["-O1", "-fno-jump-tables"],
    );
    let nat = native(&exe, &[]);
    let (run, procs) = engine(&dir, &exe, &[]);
    assert_same_behaviour(&nat, &run);
    assert_eq!(procs.len(), 2, "{}", run.stderr);
    let (_, alone) = engine(&dir, &exe, &["nofork"]);
    let alone = alone[0].by_function("fork_pingpong.c");
    let (a, b) = (
        procs[0].by_function("fork_pingpong.c"),
        procs[1].by_function("fork_pingpong.c"),
    );
    let (child, parent) = if a.contains_key("f80") {
        (a, b)
    } else {
        (b, a)
    };
    for k in 64..96 {
        let f = format!("f{k}");
        let (mine, other) = if k >= 80 {
            (&child, &parent)
        } else {
            (&parent, &child)
        };
        assert_eq!(mine.get(&f), alone.get(&f), "{f}");
        assert_eq!(other.get(&f), None, "{f}");
    }
}

#[test]
fn sa_resethand_reads_back_the_default_and_the_next_signal_kills() {
    let dir = TempDir::new("resethand");
    let exe = build(&dir, "gcc", "resethand.c", "resethand", &[]);
    let nat = native(&exe, &[]);
    assert_eq!(nat.status, None, "killed by the second SIGUSR1");
    let (run, _) = engine(&dir, &exe, &[]);
    assert_eq!(run.stdout, nat.stdout, "{}", run.stderr);
    assert!(String::from_utf8_lossy(&run.stdout).contains("after the first: SIG_DFL"));
    // The caller's process is the client: it is killed as natively.
    assert_eq!(run.status, None, "{}", run.stderr);
    assert!(run.stderr.contains("killed by signal 10"), "{}", run.stderr);
}

#[test]
fn dlclosed_code_is_retranslated_and_keeps_its_counts() {
    let dir = TempDir::new("dlopen");
    let one = dir.0.join("libone.so");
    let two = dir.0.join("libtwo.so");
    build(&dir, "gcc", "dl_one.c", "libone.so", &["-shared", "-fpic"]);
    build(&dir, "gcc", "dl_two.c", "libtwo.so", &["-shared", "-fpic"]);
    let exe = build(&dir, "gcc", "dlopen.c", "dlopen", &["-ldl"]);
    let args = [one.to_str().unwrap(), two.to_str().unwrap()];
    let procs = check_built(&dir, &exe, &args, &["dlopen.c", "dl_one.c", "dl_two.c"]);
    assert!(
        !procs[0].unmapped.is_empty(),
        "dlclose unmapped translated code"
    );
}

#[test]
fn signal_handlers_run_translated_and_are_counted() {
    check_fixture("signals", "gcc", "signals.c", &[]);
}

#[test]
fn trace_children_follows_exec_into_a_fresh_profile() {
    let dir = TempDir::new("fork-traced");
    let exe = build(&dir, "gcc", "fork.c", "fork", &[]);
    let nat = native(&exe, &[]);
    let (run, procs) = engine_env(&dir, &exe, &[], &[("COUNT_TRACE_CHILDREN", "1")]);
    assert_same_behaviour(&nat, &run);
    // Forked child, the exec'd /bin/true (its own profile, nothing of the
    // spawner's code), and the parent.
    assert_eq!(procs.len(), 3, "{}", run.stderr);
    let spawned = &procs[1];
    assert!(spawned.by_function("fork.c").is_empty());
    assert!(
        spawned.modules.iter().any(|m| m.path.ends_with("true")),
        "{:?}",
        spawned.modules
    );
}

#[test]
fn rewritten_code_is_retranslated_for_a_w_xor_x_jit() {
    check_fixture("jit", "gcc", "jit.c", &[]);
}
