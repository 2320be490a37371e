//! End-to-end: the fixture corpus (`fixtures/engine`), compiled at test
//! time, run natively, under cachescope and under Valgrind's Cachegrind
//! (`--cache-sim=no`).
//!
//! Each must produce the same stdout, stderr and exit status under
//! cachescope as natively. The counts must equal Valgrind's: in total for
//! the `-nostdlib` programs, and per function of the fixture's own source
//! for programs using libc (whose CPU-specific routines and start-up paths
//! differ between the two tools). Forked children write their own files:
//! the same number of files as Valgrind's, compared summed over processes.
//! Each output file must also be read without complaint by Valgrind's
//! `cg_annotate` and ours.

mod run_support;

use std::collections::BTreeMap;
use std::ffi::OsStr;

use run_support::*;

/// What must equal Valgrind's counts.
#[derive(Clone, Copy)]
enum Compare {
    /// The whole-program total (no libc involved).
    Total,
    /// Each function of the fixture's own source file.
    OwnFunctions,
}

fn case(label: &str, compiler: &str, flags: &[&str], src: &str, args: &[&str], cmp: Compare) {
    if !have(compiler) || !have("valgrind") {
        eprintln!("skipped: needs {compiler} and valgrind");
        return;
    }
    let dir = TempDir::new(label);
    let exe = dir.join(label);
    compile(compiler, flags, src, &exe);
    compare_runs(label, &dir, &exe, args, cmp, src);
}

/// Runs `exe args` three ways in `dir` and compares (see the module doc);
/// `Compare::OwnFunctions` looks at the functions of source file `src`.
fn compare_runs(
    label: &str,
    dir: &TempDir,
    exe: &std::path::Path,
    args: &[&str],
    cmp: Compare,
    src: &str,
) {
    let prog = exe.as_os_str();

    let nat = native(&dir.0, prog, args, None);
    let cs_out = format!("--cachegrind-out-file={}/cs.%p", dir.0.display());
    let cs = under_cachescope(&dir.0, &["-q", &cs_out], prog, args, None);
    assert_eq!(
        String::from_utf8_lossy(&cs.stdout),
        String::from_utf8_lossy(&nat.stdout),
        "{label}: stdout differs from the native run"
    );
    assert_eq!(
        cs.end,
        nat.end,
        "{label}: exit differs; stderr: {}",
        cs.stderr_text()
    );
    assert_eq!(
        mask_thread_ids(&cs.stderr_text()),
        mask_thread_ids(&nat.stderr_text()),
        "{label}: stderr differs"
    );

    let vg_out = format!("--cachegrind-out-file={}/vg.%p", dir.0.display());
    // (Valgrind's own exit status may differ: RUNNING_ON_VALGRIND is 1
    // there.)
    under_valgrind(&dir.0, &[&vg_out], prog, args, None);

    let ours: Vec<CgOut> = files_with_prefix(&dir.0, "cs.")
        .iter()
        .map(|p| CgOut::read(p))
        .collect();
    let theirs: Vec<CgOut> = files_with_prefix(&dir.0, "vg.")
        .iter()
        .map(|p| CgOut::read(p))
        .collect();
    assert!(!ours.is_empty(), "{label}: cachescope wrote no profile");
    assert_eq!(
        ours.len(),
        theirs.len(),
        "{label}: number of profiles (processes)"
    );
    let expected_cmd = std::iter::once(exe.display().to_string())
        .chain(args.iter().map(|a| a.to_string()))
        .collect::<Vec<_>>()
        .join(" ");
    for o in &ours {
        assert_eq!(o.events, "Ir");
        assert_eq!(o.cmd, expected_cmd);
        assert_eq!(o.total(), o.summary, "{label}: summary is not the sum");
    }
    match cmp {
        Compare::Total => {
            let sum = |v: &[CgOut]| v.iter().map(|o| o.summary).sum::<u64>();
            assert_eq!(
                sum(&ours),
                sum(&theirs),
                "{label}: total Ir differs from Valgrind's"
            );
        }
        Compare::OwnFunctions => {
            let per_fn = |v: &[CgOut]| {
                let mut m = BTreeMap::new();
                for o in v {
                    for (f, n) in o.functions_in(&format!("/{src}")) {
                        *m.entry(f).or_insert(0u64) += n;
                    }
                }
                // Valgrind also lists code it translated but never ran
                // (count 0, e.g. a faulting instruction); the engine
                // reports executed code only.
                m.retain(|_, n| *n > 0);
                m
            };
            let (a, b) = (per_fn(&ours), per_fn(&theirs));
            assert!(!b.is_empty(), "{label}: Valgrind saw none of {src}");
            assert_eq!(
                a, b,
                "{label}: per-function Ir of {src} differs from Valgrind's"
            );
            // Line by line too: this checks the DWARF line attribution.
            let per_line = |v: &[CgOut]| {
                let mut m = BTreeMap::new();
                for o in v {
                    for (k, n) in o.lines_in(&format!("/{src}")) {
                        *m.entry(k).or_insert(0u64) += n;
                    }
                }
                m.retain(|_, n| *n > 0);
                m
            };
            assert_eq!(
                per_line(&ours),
                per_line(&theirs),
                "{label}: per-line Ir of {src} differs from Valgrind's"
            );
        }
    }
    annotate_ok(&files_with_prefix(&dir.0, "cs.")[0]);
}

const C_DBG: &[&str] = &["-g", "-O1"];

#[test]
fn nostdlib_static_total_matches() {
    let flags = ["-g", "-O1", "-nostdlib", "-static", "-no-pie", "-fno-pie"];
    case("nostdlib", "gcc", &flags, "nostdlib.c", &[], Compare::Total);
}

#[test]
fn loops_dynamic_pie() {
    case(
        "loops-pie",
        "gcc",
        C_DBG,
        "loops.c",
        &[],
        Compare::OwnFunctions,
    );
}

#[test]
fn loops_dynamic_non_pie() {
    let flags = ["-g", "-O2", "-no-pie", "-fno-pie"];
    case(
        "loops-nopie",
        "gcc",
        &flags,
        "loops.c",
        &[],
        Compare::OwnFunctions,
    );
}

#[test]
fn loops_static_glibc() {
    let flags = ["-g", "-O2", "-static"];
    case(
        "loops-static",
        "gcc",
        &flags,
        "loops.c",
        &[],
        Compare::OwnFunctions,
    );
}

#[test]
fn setjmp_longjmp() {
    case(
        "setjmp",
        "gcc",
        C_DBG,
        "setjmp.c",
        &[],
        Compare::OwnFunctions,
    );
}

#[test]
fn rep_string_instructions() {
    case(
        "repstr",
        "gcc",
        C_DBG,
        "repstr.c",
        &[],
        Compare::OwnFunctions,
    );
}

#[test]
fn cxx_exceptions() {
    case(
        "exceptions",
        "g++",
        &["-g", "-O2"],
        "exceptions.cpp",
        &[],
        Compare::OwnFunctions,
    );
}

#[test]
fn rust_program() {
    let flags = ["-g", "-O", "--edition=2021"];
    case(
        "rustprog",
        "rustc",
        &flags,
        "rustprog.rs",
        &[],
        Compare::OwnFunctions,
    );
}

#[test]
fn threads() {
    let flags = ["-g", "-O1", "-pthread"];
    case(
        "threads",
        "gcc",
        &flags,
        "threads.c",
        &[],
        Compare::OwnFunctions,
    );
}

#[test]
fn fork_and_spawn() {
    // The forked child writes its own profile; the spawned program runs
    // natively (--trace-children=no), as under Valgrind.
    case("fork", "gcc", C_DBG, "fork.c", &[], Compare::OwnFunctions);
}

#[test]
fn code_unloaded_by_dlclose_keeps_its_names() {
    if !have("gcc") || !have("valgrind") {
        return;
    }
    let dir = TempDir::new("dlclose");
    let lib = dir.join("libplugin.so");
    compile(
        "gcc",
        &["-g", "-O1", "-shared", "-fPIC"],
        "sym_dlclose_lib.c",
        &lib,
    );
    let exe = dir.join("dlclose");
    compile("gcc", &["-g", "-O1"], "sym_dlclose.c", &exe);
    let lib_arg = lib.to_str().unwrap();
    compare_runs(
        "dlclose",
        &dir,
        &exe,
        &[lib_arg],
        Compare::OwnFunctions,
        "sym_dlclose_lib.c",
    );
}

#[test]
fn signal_handlers() {
    case(
        "signals",
        "gcc",
        C_DBG,
        "signals.c",
        &[],
        Compare::OwnFunctions,
    );
}

#[test]
fn mixed_control_flow_pie_with_args() {
    let flags = ["-g", "-O2"];
    case(
        "mix-pie",
        "gcc",
        &flags,
        "sym_mix.c",
        &["a", "b c"],
        Compare::OwnFunctions,
    );
}

#[test]
fn mixed_control_flow_static_non_pie() {
    let flags = ["-g", "-O1", "-static", "-no-pie", "-fno-pie"];
    case(
        "mix-static",
        "gcc",
        &flags,
        "sym_mix.c",
        &[],
        Compare::OwnFunctions,
    );
}

#[test]
fn cxx_virtual_calls_and_unwinding() {
    case(
        "exc",
        "g++",
        &["-g", "-O2"],
        "sym_exc.cc",
        &[],
        Compare::OwnFunctions,
    );
}

#[test]
fn rust_panics_and_exit_status() {
    let flags = ["-g", "-O", "--edition=2021"];
    case(
        "panic",
        "rustc",
        &flags,
        "sym_panic.rs",
        &[],
        Compare::OwnFunctions,
    );
}

#[test]
fn program_found_through_path() {
    // `cmd:` and the run use the name as given; the engine resolves it.
    if !have("valgrind") {
        return;
    }
    let dir = TempDir::new("path");
    let out = format!("--cachegrind-out-file={}/cs.out", dir.0.display());
    let cs = under_cachescope(&dir.0, &["-q", &out], OsStr::new("true"), &[], None);
    assert_eq!(cs.end, End::Code(0), "{}", cs.stderr_text());
    let o = CgOut::read(&dir.join("cs.out"));
    assert_eq!(o.cmd, "true");
    assert!(o.summary > 1000);
}

#[test]
fn raw_names_with_demangle_no_and_show_below_main_yes() {
    if !have("g++") || !have("valgrind") {
        return;
    }
    let dir = TempDir::new("rawnames");
    let exe = dir.join("exc");
    compile("g++", &["-g", "-O2"], "sym_exc.cc", &exe);
    let opts = ["--demangle=no", "--show-below-main=yes"];
    let cs_out = format!("--cachegrind-out-file={}/cs.out", dir.0.display());
    let vg_out = format!("--cachegrind-out-file={}/vg.out", dir.0.display());
    let mut cs_opts = vec!["-q", cs_out.as_str()];
    cs_opts.extend(opts);
    let mut vg_opts = vec![vg_out.as_str()];
    vg_opts.extend(opts);
    let r = under_cachescope(&dir.0, &cs_opts, exe.as_os_str(), &[], None);
    assert_eq!(r.end, End::Code(0), "{}", r.stderr_text());
    under_valgrind(&dir.0, &vg_opts, exe.as_os_str(), &[], None);
    let ours = CgOut::read(&dir.join("cs.out"));
    let theirs = CgOut::read(&dir.join("vg.out"));
    let own = |o: &CgOut| {
        let mut m = o.functions_in("/sym_exc.cc");
        m.retain(|_, n| *n > 0);
        m
    };
    assert_eq!(own(&ours), own(&theirs));
    assert!(
        own(&ours).keys().any(|f| f.starts_with("_Z")),
        "{:?}",
        own(&ours)
    );
    let names = |o: &CgOut| -> std::collections::BTreeSet<String> {
        o.costs.keys().map(|(_, f, _)| f.clone()).collect()
    };
    for n in ["__libc_start_call_main", "_start"] {
        assert!(
            names(&ours).contains(n) && names(&theirs).contains(n),
            "{n}"
        );
    }
    assert!(!names(&ours).contains("(below main)"));
}
