//! `--tool=callgrind` against Valgrind's Callgrind on the fixtures of
//! `fixtures/callgrind` (direct and indirect calls, recursion, mutual
//! recursion, `-O2` tail calls, `longjmp`, a C++ exception, callbacks through
//! the PLT, a signal handler, two threads): for the functions of the
//! fixture's own source, self Ir, and for each call arc into one of them,
//! the call count and inclusive Ir, are equal; arcs from them to other code
//! have equal call counts (their inclusive costs are the C library's, whose
//! CPU-dependent paths differ under Valgrind's virtual CPU). Valgrind's own
//! `callgrind_annotate` reads our files and lists the fixture's functions
//! with the same self and inclusive Ir as for Callgrind's file.

mod run_support;

use callgrind::{Item, Profile};
use run_support::{callgrind_fixture, require, under_cachescope_env, TempDir, NOW};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Self Ir per function and `(caller, callee) -> (calls, inclusive)` per
/// arc, for blocks whose file ends with `suffix`.
#[derive(Debug, Default, PartialEq, Eq)]
struct Graph {
    selfs: BTreeMap<String, u64>,
    arcs_in: BTreeMap<(String, String), (u64, u64)>,
    calls_out: BTreeMap<(String, String), u64>,
}

fn graph(p: &Profile, suffix: &str) -> Graph {
    let names = &p.names;
    let ours = |file| names.files.text(file).ends_with(suffix);
    let mut g = Graph::default();
    for part in &p.parts {
        for b in &part.blocks {
            let caller = names.functions.text(b.function).to_string();
            let caller_ours = ours(b.file);
            for item in &b.items {
                match item {
                    Item::Cost { costs, .. } if caller_ours => {
                        *g.selfs.entry(caller.clone()).or_default() += costs[0];
                    }
                    Item::Call(c) => {
                        let callee = names.functions.text(c.function).to_string();
                        let key = (caller.clone(), callee.clone());
                        if ours(c.file) {
                            let e = g.arcs_in.entry(key).or_default();
                            e.0 += c.count;
                            e.1 += c.inclusive[0];
                        } else if caller_ours && !callee.starts_with("_dl_runtime_resolve") {
                            *g.calls_out.entry(key).or_default() += c.count;
                        }
                    }
                    _ => {}
                }
            }
        }
    }
    g
}

fn read(path: &Path) -> Profile {
    let data = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    callgrind::parse(&data).unwrap_or_else(|e| panic!("{}: {e:?}", path.display()))
}

/// Runs fixture `src` under both and returns the two files.
fn both(src: &str, flags: &[&str]) -> (TempDir, PathBuf, PathBuf) {
    both_with(src, flags, &[])
}

/// Runs fixture `src` under both with Callgrind options `options`.
fn both_with(src: &str, flags: &[&str], options: &[&str]) -> (TempDir, PathBuf, PathBuf) {
    require("valgrind");
    let dir = TempDir::new(&format!("callgrind-{src}"));
    let exe = callgrind_fixture(&dir, &[src], &[flags, NOW].concat());
    let ours = dir.join("ours.out");
    let theirs = dir.join("theirs.out");
    ours_into(&dir, &exe, &ours, options);
    let vg = Command::new("valgrind")
        .args(["--tool=callgrind", "-q"])
        .args(options)
        .arg(format!("--callgrind-out-file={}", theirs.display()))
        .arg(&exe)
        .current_dir(&dir.0)
        .output()
        .unwrap();
    assert!(
        vg.status.success(),
        "{}",
        String::from_utf8_lossy(&vg.stderr)
    );
    (dir, ours, theirs)
}

/// Runs `exe` under `--tool=callgrind` with `options`, its file at `out`;
/// the run must succeed. Returns its stdout.
fn ours_into(dir: &TempDir, exe: &Path, out: &Path, options: &[&str]) -> String {
    ours_into_env(dir, exe, out, options, &[])
}

/// [`ours_into`] with variables `env` set.
fn ours_into_env(
    dir: &TempDir,
    exe: &Path,
    out: &Path,
    options: &[&str],
    env: &[(&str, &str)],
) -> String {
    let file = format!("--callgrind-out-file={}", out.display());
    let mut args = vec!["--tool=callgrind", "-q", &file];
    args.extend_from_slice(options);
    let run = under_cachescope_env(&dir.0, &args, exe.as_os_str(), &[], None, env);
    assert!(
        matches!(run.end, run_support::End::Code(0)),
        "{}",
        run.stderr_text()
    );
    String::from_utf8_lossy(&run.stdout).into_owned()
}

/// Compares fixture `src` built with `flags`; the inclusive costs of calls
/// to `library_bound` are not compared (they are mostly library work that
/// depends on the objects loaded, which Valgrind's preloads change).
fn compare(src: &str, flags: &[&str], library_bound: &[&str]) {
    compare_with(src, flags, &[], library_bound);
}

/// The function of a context's name (`fib` of `fib'2` or of
/// `fib'main'(below main)`).
fn function_of(name: &str) -> &str {
    name.split('\'').next().unwrap_or(name)
}

/// As [`compare`], with Callgrind options `options`; `library_bound`
/// names functions, whatever their contexts. Returns Callgrind's graph.
fn compare_with(src: &str, flags: &[&str], options: &[&str], library_bound: &[&str]) -> Graph {
    let (_dir, ours, theirs) = both_with(src, flags, options);
    let suffix = format!("fixtures/callgrind/{src}");
    let (mut us, mut them) = (graph(&read(&ours), &suffix), graph(&read(&theirs), &suffix));
    for g in [&mut us, &mut them] {
        for ((_, callee), (_, inclusive)) in g.arcs_in.iter_mut() {
            if library_bound.contains(&function_of(callee)) {
                *inclusive = 0;
            }
        }
    }
    assert!(
        !them.selfs.is_empty(),
        "no functions of {src} in Callgrind's file"
    );
    assert_eq!(us.selfs, them.selfs, "self Ir per function of {src}");
    assert_eq!(us.arcs_in, them.arcs_in, "calls into {src}'s functions");
    assert_eq!(us.calls_out, them.calls_out, "calls from {src}'s functions");
    annotate_agrees(&ours, &theirs, src, library_bound);
    them
}

/// The lines of Valgrind's `callgrind_annotate` function table (both
/// modes) that name the fixture's source.
fn annotated(path: &Path, src: &str, library_bound: &[&str]) -> Vec<String> {
    let mut lines = Vec::new();
    for inclusive in ["no", "yes"] {
        let o = Command::new("callgrind_annotate")
            .arg(format!("--inclusive={inclusive}"))
            .arg("--threshold=100")
            .arg(path)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let text = String::from_utf8_lossy(&o.stdout).into_owned();
        // Table rows are `count (percent)  file:function [object]`: the
        // count and the function, not the percentage (totals differ);
        // main's inclusive cost is mostly printf's.
        lines.extend(text.lines().filter_map(|l| {
            let (count, rest) = l.trim_start().split_once(' ')?;
            let (_, name) = rest.split_once(")  ")?;
            let count: u64 = count.replace(',', "").parse().ok()?;
            let table_row = name.ends_with(']') && !name.starts_with("=>");
            let bound = library_bound
                .iter()
                .any(|f| name.contains(&format!(":{f} ")) || name.contains(&format!(":{f}'")));
            (table_row && name.contains(&format!("{src}:")) && !(bound && inclusive == "yes"))
                .then(|| format!("{inclusive} {count} {name}"))
        }));
    }
    lines.sort();
    lines
}

fn annotate_agrees(ours: &Path, theirs: &Path, src: &str, library_bound: &[&str]) {
    run_support::require_callgrind_annotate();
    assert_eq!(
        annotated(ours, src, library_bound),
        annotated(theirs, src, library_bound)
    );
}

#[test]
fn calls_recursion_and_callbacks() {
    compare("calls.c", &["-O0"], &["main"]);
}

/// `--separate-callers`: contexts named by their last callers
/// (`leaf'left'via`), recursion levels before them (`fact'2'main`), a
/// recursion's callers counted once, callbacks from the C library, and
/// per function (`--separate-callers<N>=`).
#[test]
fn separate_callers() {
    let runs: [(&[&str], &[&str]); 3] = [
        (
            &["--separate-callers=2"],
            &[
                "leaf'left'via",
                "leaf'cmp'msort_with_tmp.part.0",
                "fact'2'main'(below main)",
            ],
        ),
        (
            &["--separate-callers=1", "--separate-recs=3"],
            &[
                "leaf'cmp",
                "fact'3'main",
                "pong'3'ping",
                "main'(below main)",
            ],
        ),
        (
            &["--separate-callers3=leaf", "--separate-callers1=p?ng"],
            &["leaf'pong'ping'pong", "ping'2'pong", "fact'2", "main"],
        ),
    ];
    for (options, names) in runs {
        let them = compare_with("callers.c", &["-O0"], options, &["main"]);
        for name in names {
            assert!(
                them.selfs.contains_key(*name),
                "{options:?}: no {name} in {them:?}"
            );
        }
    }
}

/// Recursion levels: `--skip-direct-rec=yes` (a function calling itself
/// stays at its level, a mutual recursion still counts, and the
/// outermost activation is entered again at each direct call, which
/// `--toggle-collect` shows), and per function (`--separate-recs<N>=`,
/// alone and with the global cap, with `--separate-callers`). Each run
/// names contexts it must have and some it must not. Levels above the
/// global cap are compared without name compression: Callgrind numbers a
/// function's first context before it applies the function's options,
/// so its compressed file gives such a level the id of another function
/// (docs/conformance.md).
#[test]
fn recursion_levels() {
    type Run<'a> = (&'a str, &'a [&'a str], &'a [&'a str], &'a [&'a str]);
    let runs: [Run; 8] = [
        (
            "fib.c",
            &["--skip-direct-rec=yes"],
            &["fib", "main"],
            &["fib'2"],
        ),
        (
            "fib.c",
            &["--skip-direct-rec=yes", "--toggle-collect=fib"],
            &["fib"],
            &["fib'2"],
        ),
        (
            "fib.c",
            &["--separate-recs3=fib", "--compress-strings=no"],
            &["fib'3"],
            &["fib'4"],
        ),
        (
            "fib.c",
            &["--separate-recs=4", "--separate-recs1=f*"],
            &["fib", "main"],
            &["fib'2"],
        ),
        (
            "callers.c",
            &["--skip-direct-rec=yes"],
            &["fact", "ping'2", "pong'2"],
            &["fact'2"],
        ),
        (
            "callers.c",
            &[
                "--separate-recs3=p?ng",
                "--separate-recs1=fact",
                "--compress-strings=no",
            ],
            &["ping'3", "pong'3", "fact"],
            &["fact'2", "ping'4"],
        ),
        (
            "callers.c",
            &[
                "--skip-direct-rec=yes",
                "--separate-recs=3",
                "--separate-recs2=pong",
            ],
            &["ping'3", "pong'2"],
            &["pong'3", "fact'2"],
        ),
        (
            "callers.c",
            &["--separate-callers=1", "--separate-recs4=fact"],
            &["fact'4'main", "fact'main", "leaf'fact"],
            &["fact'5'main"],
        ),
    ];
    for (src, options, present, absent) in runs {
        let them = compare_with(src, &["-O0"], options, &["main"]);
        for name in present {
            assert!(
                them.selfs.contains_key(*name),
                "{src} {options:?}: no {name} in {them:?}"
            );
        }
        for name in absent {
            assert!(
                !them.selfs.contains_key(*name),
                "{src} {options:?}: {name} in {them:?}"
            );
        }
    }
}

#[test]
fn tail_calls() {
    compare("tail.c", &["-O2"], &["main"]);
}

/// Indirect calls and returns whose targets the engine's indirect-branch
/// table finds only past its inline ways (targets 64 KiB apart).
#[test]
fn targets_sharing_a_lookup_bucket() {
    compare("buckets.c", &["-O1"], &["main"]);
}

#[test]
fn longjmp() {
    compare("longjmp.c", &["-O0"], &["main"]);
}

#[test]
fn cxx_exception() {
    // Unwinding walks the loaded objects' frame tables.
    compare(
        "exception.cpp",
        &["-O1"],
        &["main", "middle(int)", "thrower(int)"],
    );
}

#[test]
fn signal_handler() {
    compare("signal.c", &["-O0"], &["main"]);
}

#[test]
fn two_threads() {
    compare("threads.c", &["-O0"], &["main"]);
}

/// Self costs of every event per function of the fixture, with the
/// `events:` line.
fn self_events(p: &Profile, suffix: &str) -> (String, BTreeMap<String, Vec<u64>>) {
    let names = &p.names;
    let mut selfs: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    let part = &p.parts[0];
    for b in &part.blocks {
        if !names.files.text(b.file).ends_with(suffix) {
            continue;
        }
        let f = names.functions.text(b.function).to_string();
        for item in &b.items {
            if let Item::Cost { costs, .. } = item {
                let e = selfs
                    .entry(f.clone())
                    .or_insert_with(|| vec![0; part.events.len()]);
                for (t, c) in e.iter_mut().zip(costs) {
                    *t += c;
                }
            }
        }
    }
    (part.event_names().join(" "), selfs)
}

/// `--cache-sim=yes --branch-sim=yes`: Callgrind's events in its order,
/// and per function of the fixture, Ir, Dr, Dw, Bc and Bi equal
/// Callgrind's (a modify counts as a write, as in Callgrind); misses are
/// within 1 % or 20 (the simulated hierarchy sees a different process:
/// Valgrind's own preloads and stack).
#[test]
fn cache_and_branch_simulation() {
    let (_dir, ours, theirs) = both_with(
        "calls.c",
        &["-O0"],
        &["--cache-sim=yes", "--branch-sim=yes"],
    );
    let suffix = "fixtures/callgrind/calls.c";
    let (ev_us, us) = self_events(&read(&ours), suffix);
    let (ev_them, them) = self_events(&read(&theirs), suffix);
    assert_eq!(
        ev_us,
        "Ir Dr Dw I1mr D1mr D1mw ILmr DLmr DLmw Bc Bcm Bi Bim"
    );
    assert_eq!(ev_us, ev_them);
    assert!(!them.is_empty());
    assert_eq!(
        us.keys().collect::<Vec<_>>(),
        them.keys().collect::<Vec<_>>()
    );
    for (f, u) in &us {
        let t = &them[f];
        for i in [0, 1, 2, 9, 11] {
            assert_eq!(u[i], t[i], "{f}: column {i}: {u:?} against {t:?}");
        }
        for i in [3, 4, 5, 6, 7, 8, 10, 12] {
            let close = u[i].abs_diff(t[i]) <= 20.max(t[i] / 100);
            assert!(close, "{f}: column {i}: {u:?} against {t:?}");
        }
    }
}

/// The files of a run with dumps, by the suffix after the given name
/// (`""` for the last, `.1`, `.2`, ...).
fn dump_files(base: &Path) -> BTreeMap<String, PathBuf> {
    let dir = base.parent().unwrap();
    let name = base.file_name().unwrap().to_string_lossy().into_owned();
    std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| {
            let p = e.unwrap().path();
            let f = p.file_name()?.to_string_lossy().into_owned();
            let rest = f.strip_prefix(&name)?.to_string();
            Some((rest, p))
        })
        .collect()
}

/// Trigger and part number of a file's parts.
fn triggers(p: &Profile) -> Vec<(Option<u64>, String)> {
    p.parts
        .iter()
        .map(|part| {
            let t = part
                .desc
                .iter()
                .find(|d| d.starts_with("Trigger:"))
                .cloned();
            (part.number, t.unwrap_or_default())
        })
        .collect()
}

/// Client requests (`CALLGRIND_DUMP_STATS`, `_AT`, `ZERO_STATS`,
/// `TOGGLE_COLLECT`) and `--dump-before`: the same files (`.1`, `.2`, ...
/// and the last), parts and triggers as Callgrind's, and in each the
/// fixture's self Ir, calls and inclusive Ir equal.
#[test]
fn dumps_zero_and_toggle_by_request() {
    let (_dir, ours, theirs) = both_with("requests.c", &["-O0"], &["--dump-before=measured"]);
    let (us, them) = (dump_files(&ours), dump_files(&theirs));
    assert_eq!(
        us.keys().collect::<Vec<_>>(),
        them.keys().collect::<Vec<_>>()
    );
    assert_eq!(us.len(), 4, "{us:?}");
    let suffix = "fixtures/callgrind/requests.c";
    for (k, path) in &us {
        let (a, b) = (read(path), read(&them[k]));
        assert_eq!(triggers(&a), triggers(&b), "file {k}");
        let (mut ga, mut gb) = (graph(&a, suffix), graph(&b, suffix));
        // main's inclusive cost is mostly printf's and the exit's.
        for g in [&mut ga, &mut gb] {
            g.arcs_in.retain(|(_, callee), _| callee != "main");
        }
        assert_eq!(ga, gb, "file {k}");
    }
}

/// `--collect-atstart=no --toggle-collect=FN` (gungraun's way) and
/// `--combine-dumps=yes` with `--dump-after`: one file whose parts equal
/// Callgrind's.
#[test]
fn toggle_collect_and_combined_dumps() {
    let (_dir, ours, theirs) = both_with(
        "requests.c",
        &["-O0"],
        &[
            "--collect-atstart=no",
            "--toggle-collect=measured",
            "--toggle-collect=oth*",
            "--combine-dumps=yes",
            "--dump-after=measured",
        ],
    );
    let (a, b) = (read(&ours), read(&theirs));
    assert_eq!(triggers(&a), triggers(&b));
    let suffix = "fixtures/callgrind/requests.c";
    for (pa, pb) in a.parts.iter().zip(&b.parts) {
        let one = |p: &Profile, part: &callgrind::Part| Profile {
            names: p.names.clone(),
            parts: vec![part.clone()],
            ..Profile::default()
        };
        let (ga, gb) = (graph(&one(&a, pa), suffix), graph(&one(&b, pb), suffix));
        assert_eq!(ga, gb);
    }
}

/// `--separate-threads=yes`: the same files as Callgrind's (`-01`, `-02`
/// and the empty unsuffixed one), each a part with its `thread:` line, and
/// in each the fixture's self Ir, calls and inclusive Ir equal; with
/// `--combine-dumps=yes`, one file with a part per thread.
#[test]
fn separate_threads() {
    let (_dir, ours, theirs) = both_with("threads_late.c", &["-O0"], &["--separate-threads=yes"]);
    let (us, them) = (dump_files(&ours), dump_files(&theirs));
    assert_eq!(
        us.keys().collect::<Vec<_>>(),
        them.keys().collect::<Vec<_>>()
    );
    assert_eq!(us.keys().collect::<Vec<_>>(), ["", "-01", "-02"]);
    assert_eq!(std::fs::metadata(&us[""]).unwrap().len(), 0);
    let suffix = "fixtures/callgrind/threads_late.c";
    for k in ["-01", "-02"] {
        let (a, b) = (read(&us[k]), read(&them[k]));
        let heads = |p: &Profile| -> Vec<_> {
            p.parts
                .iter()
                .map(|part| (part.number, part.thread, part.summary == part.totals))
                .collect()
        };
        assert_eq!(heads(&a), heads(&b), "file {k}");
        let (mut ga, mut gb) = (graph(&a, suffix), graph(&b, suffix));
        for g in [&mut ga, &mut gb] {
            g.arcs_in.retain(|(_, callee), _| callee != "main");
        }
        assert!(!gb.selfs.is_empty(), "file {k}");
        assert_eq!(ga, gb, "file {k}");
    }
    let (_dir, ours, theirs) = both_with(
        "threads_late.c",
        &["-O0"],
        &["--separate-threads=yes", "--combine-dumps=yes"],
    );
    let (us, them) = (dump_files(&ours), dump_files(&theirs));
    assert_eq!(us.keys().collect::<Vec<_>>(), [""]);
    assert_eq!(
        us.keys().collect::<Vec<_>>(),
        them.keys().collect::<Vec<_>>()
    );
    // Callgrind repeats the file header before each thread's part.
    let text = |p: &Path| std::fs::read_to_string(p).unwrap();
    let (a, b) = (text(&ours), text(&theirs));
    let shape = |t: &str| -> Vec<String> {
        t.lines()
            .filter(|l| {
                l.starts_with("# callgrind") || l.starts_with("part:") || l.starts_with("thread:")
            })
            .map(str::to_string)
            .collect()
    };
    assert_eq!(shape(&a), shape(&b));
    assert_eq!(shape(&a).len(), 6);
}

/// `--fn-skip=GLOB`: skipped functions have no context of their own,
/// their costs go to the caller's call site and what they call is called
/// from there; the fixture's self Ir, calls and inclusive Ir equal
/// Callgrind's. (`--obj-skip`, CodSpeed's option, is not in Valgrind 3.19:
/// no oracle.)
#[test]
fn fn_skip() {
    let (_dir, ours, theirs) =
        both_with("calls.c", &["-O0"], &["--fn-skip=is_*", "--fn-skip=qsort"]);
    let suffix = "fixtures/callgrind/calls.c";
    let (a, b) = (read(&ours), read(&theirs));
    let (mut ga, mut gb) = (graph(&a, suffix), graph(&b, suffix));
    for g in [&mut ga, &mut gb] {
        g.arcs_in.retain(|(_, callee), _| callee != "main");
    }
    assert!(!gb.selfs.contains_key("is_odd") && gb.selfs.contains_key("main"));
    assert_eq!(ga, gb);
}

/// Self Ir of two functions, then calls and inclusive Ir of two arcs.
type TimerLoop = (Vec<Option<u64>>, Vec<Option<(u64, u64)>>);

/// What `timer.c`'s loop runs whatever its profiling timer interrupts:
/// work's and main's self Ir, and main -> work and work -> mid with their
/// calls and inclusive Ir.
fn timer_loop(g: &Graph) -> TimerLoop {
    let selfs = ["work", "main"].map(|f| g.selfs.get(f).copied()).to_vec();
    let arcs = [("main", "work"), ("work", "mid")]
        .map(|(a, b)| g.arcs_in.get(&(a.to_string(), b.to_string())).copied())
        .to_vec();
    (selfs, arcs)
}

#[test]
fn asynchronous_timer_signals() {
    // A timer signal landing between a call and its callee's first block
    // lost the call's stack pointer (the callee's return became a call:
    // work'2 under mid); in contexts mode, one landing in the runtime had
    // the handler enter it half-way through an entry.
    let (dir, ours, theirs) = both("timer.c", &["-O1"]);
    let suffix = "fixtures/callgrind/timer.c";
    let them = graph(&read(&theirs), suffix);
    assert!(timer_loop(&them).0.iter().all(Option::is_some), "{them:?}");
    // The default, tagged counting (a signal landing inside one of its
    // inline calls or returns waits for the thread to step out), then the
    // stream path and contexts mode.
    // The stream path runs again with 8 KiB trace buffers: a flush every
    // few hundred blocks, so that handlers often flush while the block
    // they interrupted has its record open (which had corrupted the
    // buffer: a signal now waits for the block to finish its record).
    let mut files = vec![("tagged counting", ours)];
    let small = [("CACHESCOPE_ENGINE_TRACE_BYTES", "8192")];
    for (mode, flag, env) in [
        ("stream path", "--client-contexts=no", &[][..]),
        (
            "stream path, small buffers",
            "--client-contexts=no",
            &small[..],
        ),
        ("contexts mode", "--client-contexts=yes", &[][..]),
    ] {
        let file = dir.join(&format!("{}-{}.out", flag.replace('=', "-"), env.len()));
        let stdout = ours_into_env(&dir, &dir.join("timer"), &file, &[flag], env);
        assert!(stdout.ends_with(" ticked\n"), "{mode}: {stdout}");
        files.push((mode, file));
    }
    for (mode, file) in &files {
        let us = graph(&read(file), suffix);
        assert_eq!(timer_loop(&us), timer_loop(&them), "{mode}");
        let levels: Vec<_> = us.selfs.keys().filter(|f| f.starts_with("work'")).collect();
        assert!(levels.is_empty(), "{mode}: {levels:?}");
    }
}

/// One jump arc's key: (function, source, target function, target,
/// conditional); positions are lines, or addresses with `--dump-instr`.
type JumpKey = (String, u64, String, u64, bool);

/// Per jump arc of the fixture's functions: jumps and (for `jcnd=`)
/// executions, summed over the lines Callgrind writes per context.
fn jump_arcs(p: &Profile, suffix: &str, by_addr: bool) -> BTreeMap<JumpKey, (u64, u64)> {
    let names = &p.names;
    let mut arcs: BTreeMap<JumpKey, (u64, u64)> = BTreeMap::new();
    for part in &p.parts {
        for b in &part.blocks {
            if !names.files.text(b.file).ends_with(suffix) {
                continue;
            }
            let f = names.functions.text(b.function).to_string();
            for item in &b.items {
                let Item::Jump(j) = item else { continue };
                let pos = |p: callgrind::Position| if by_addr { p.addr } else { p.line };
                let (count, executed, cond) = match j.kind {
                    callgrind::JumpKind::Always { count } => (count, 0, false),
                    callgrind::JumpKind::Conditional { taken, executed } => (taken, executed, true),
                };
                let to = names.functions.text(j.function).to_string();
                let e = arcs
                    .entry((f.clone(), pos(j.source), to, pos(j.target), cond))
                    .or_default();
                e.0 += count;
                e.1 += executed;
            }
        }
    }
    arcs
}

/// `--collect-jumps=yes` on loops, conditionals, a jump table and a
/// conditional tail call (built `-O1`, and `-O0`): per jump arc of the
/// fixture's functions (function, source line, target, kind), the jumps
/// and a conditional jump's executions equal Callgrind's; with
/// `--dump-instr=yes` too, by instruction address (the fixture is built
/// without PIE, so both load it at the same address). Self Ir and calls
/// into the fixture's functions stay Callgrind's.
#[test]
fn collect_jumps() {
    let suffix = "fixtures/callgrind/jumps.c";
    for (flags, options) in [
        (&["-O1"][..], &["--collect-jumps=yes"][..]),
        (&["-O0"][..], &["--collect-jumps=yes"][..]),
        (
            &["-O1", "-no-pie"][..],
            &["--collect-jumps=yes", "--dump-instr=yes"][..],
        ),
        // Jumps between contexts of other names (`jfn=`).
        (
            &["-O1"][..],
            &["--collect-jumps=yes", "--separate-callers=2"][..],
        ),
    ] {
        let (_dir, ours, theirs) = both_with("jumps.c", flags, options);
        let (a, b) = (read(&ours), read(&theirs));
        let by_addr = options.contains(&"--dump-instr=yes");
        let (ja, jb) = (
            jump_arcs(&a, suffix, by_addr),
            jump_arcs(&b, suffix, by_addr),
        );
        assert!(
            jb.len() > 10 && jb.keys().any(|k| k.4) && jb.keys().any(|k| !k.4),
            "{flags:?}: Callgrind's jumps {jb:?}"
        );
        assert_eq!(ja, jb, "{flags:?} {options:?}: jumps per arc");
        // (main's inclusive cost is mostly printf's.)
        let (mut ga, mut gb) = (graph(&a, suffix), graph(&b, suffix));
        for g in [&mut ga, &mut gb] {
            g.arcs_in
                .retain(|(_, callee), _| function_of(callee) != "main");
        }
        assert_eq!(ga, gb, "{flags:?} {options:?}");
    }
}
