//! `--tool=callgrind --client-contexts=yes` and `=tagged` (the client
//! keeps its calling contexts, `docs/client-contexts.md`; tagged: in a
//! slot per block, `ctxrt::tagged`) against the stream path on the
//! fixtures of `fixtures/callgrind`: the whole program's self Ir per
//! function and line, and every call arc's count and inclusive Ir per
//! (caller, call line, callee), are equal. The stream path is itself
//! checked against Valgrind's Callgrind (`run_callgrind.rs`).

mod run_support;

use callgrind::{Item, Profile};
use run_support::{callgrind_fixture, under_cachescope, TempDir, NOW};
use std::collections::BTreeMap;

/// Self Ir per (function, line) and (count, inclusive Ir) per (caller,
/// call line, callee), of the whole program.
#[derive(Debug, Default, PartialEq, Eq)]
struct Costs {
    selfs: BTreeMap<(String, u64), u64>,
    calls: BTreeMap<(String, u64, String), (u64, u64)>,
}

fn costs(p: &Profile) -> Costs {
    let names = &p.names;
    let mut c = Costs::default();
    for part in &p.parts {
        for b in &part.blocks {
            let f = names.functions.text(b.function).to_string();
            for item in &b.items {
                match item {
                    Item::Cost { position, costs } => {
                        *c.selfs.entry((f.clone(), position.line)).or_default() += costs[0];
                    }
                    Item::Call(call) => {
                        let callee = names.functions.text(call.function).to_string();
                        let e = c
                            .calls
                            .entry((f.clone(), call.source.line, callee))
                            .or_default();
                        e.0 += call.count;
                        e.1 += call.inclusive[0];
                    }
                    _ => {}
                }
            }
        }
    }
    c.selfs.retain(|_, v| *v != 0);
    c
}

/// The client's ways of keeping contexts, each compared with the stream.
const CLIENT_MODES: [&str; 2] = ["--client-contexts=yes", "--client-contexts=tagged"];

/// Runs `src` every way and compares each client way with the stream.
fn compare(src: &str, flags: &[&str]) {
    let dir = TempDir::new(&format!("client-contexts-{src}"));
    let exe = callgrind_fixture(&dir, &[src], &[flags, NOW].concat());
    let [stream, clients @ ..] = all_of(&dir, &exe, None);
    for (mode, client) in CLIENT_MODES.iter().zip(&clients) {
        assert_same(&stream, client, &format!("{src} {mode}"));
    }
}

/// Asserts that `client`'s self costs and calls are the stream's.
fn assert_same(stream: &Costs, client: &Costs, what: &str) {
    assert_eq!(
        differences(&stream.selfs, &client.selfs),
        "",
        "self costs of {what}"
    );
    assert_eq!(
        differences(&stream.calls, &client.calls),
        "",
        "calls of {what}"
    );
}

/// Runs `exe` (in `dir`) the stream's way and each of [`CLIENT_MODES`]:
/// the whole program's costs, or with `thread` those of that thread's
/// file (`--separate-threads=yes`, its `-NN` suffix).
fn all_of(dir: &TempDir, exe: &std::path::Path, thread: Option<&str>) -> [Costs; 3] {
    let mut got = Vec::new();
    let modes = [
        Some("--client-contexts=no"),
        Some(CLIENT_MODES[0]),
        Some(CLIENT_MODES[1]),
    ];
    for (i, extra) in modes.into_iter().enumerate() {
        let name = format!("run{i}");
        let file = dir.join(&format!("{name}.out"));
        let out = format!("--callgrind-out-file={}", file.display());
        let mut args = vec!["--tool=callgrind", "-q", &out];
        args.extend(extra);
        if thread.is_some() {
            args.push("--separate-threads=yes");
        }
        let run = under_cachescope(&dir.0, &args, exe.as_os_str(), &[], None);
        assert!(
            matches!(run.end, run_support::End::Code(0)),
            "{extra:?}: {}",
            run.stderr_text()
        );
        let file = match thread {
            Some(t) => dir.join(&format!("{name}.out-{t}")),
            None => file,
        };
        let data = std::fs::read(&file).unwrap();
        got.push(costs(&callgrind::parse(&data).unwrap()));
    }
    assert!(!got[0].selfs.is_empty() && !got[0].calls.is_empty());
    got.try_into().expect("three runs")
}

/// The entries of two maps that differ, one per line (stream, client).
fn differences<K: Ord + std::fmt::Debug, V: PartialEq + std::fmt::Debug>(
    stream: &BTreeMap<K, V>,
    client: &BTreeMap<K, V>,
) -> String {
    let keys: std::collections::BTreeSet<&K> = stream.keys().chain(client.keys()).collect();
    keys.into_iter()
        .filter(|k| stream.get(k) != client.get(k))
        .map(|k| format!("{k:?}: {:?} {:?}\n", stream.get(k), client.get(k)))
        .collect()
}

/// The line of `-v -v`'s summary of the client's contexts that contains
/// `marker`, for fixture `src` built with `opt`, run with `extra`.
fn contexts_summary(src: &str, opt: &str, extra: &[&str], marker: &str) -> String {
    let dir = TempDir::new(&format!("client-contexts-summary-{src}"));
    let exe = callgrind_fixture(&dir, &[src], &[&[opt], NOW].concat());
    let out = format!("--callgrind-out-file={}", dir.join("out").display());
    let mut args = vec!["--tool=callgrind", "-v", "-v", &out];
    args.extend(extra);
    let run = under_cachescope(&dir.0, &args, exe.as_os_str(), &[], None);
    let text = run.stderr_text();
    let line = text.lines().find(|l| l.contains(marker));
    line.unwrap_or_else(|| panic!("{src}: no {marker:?} in {text}"))
        .to_string()
}

#[test]
fn calls_recursion_and_callbacks() {
    compare("calls.c", &["-O0"]);
}

/// Indirect calls and returns whose targets the indirect-branch table
/// finds only past its inline ways (`buckets.c`: targets 64 KiB apart).
#[test]
fn targets_found_past_the_inline_ways() {
    compare("buckets.c", &["-O1"]);
}

/// Tagged counting: a lookup that finds its target past the inline ways
/// (a probe) goes on to the site's inline transition, as one found in
/// them does, not to a runtime entry (cc1 probes 4.5 M of its lookups).
/// Before that, a third of `buckets.c`'s transitions entered the runtime.
#[test]
fn probed_targets_stay_inline() {
    let line = contexts_summary("buckets.c", "-O1", &[], "client contexts (tagged):");
    // "client contexts (tagged): N context entries, I calls and returns
    // inline, ...".
    let numbers: Vec<u64> = line
        .split(|c: char| !c.is_ascii_digit())
        .filter(|w| !w.is_empty())
        .filter_map(|w| w.parse().ok())
        .collect();
    // (The first number is the pid in "==PID==".)
    let (entries, inline) = (numbers[1], numbers[2]);
    assert!(
        inline > 60_000 && entries * 20 < inline,
        "probed lookups entered the runtime: {line}"
    );
}

#[test]
fn recursion_levels() {
    compare("fib.c", &["-O0"]);
}

#[test]
fn tail_calls() {
    compare("tail.c", &["-O2"]);
}

#[test]
fn longjmp() {
    compare("longjmp.c", &["-O0"]);
}

#[test]
fn cxx_exception() {
    compare("exception.cpp", &["-O1"]);
}

/// A handler is a root of its own both ways; the calls it interrupted
/// have equal inclusive costs (the blocks run after a handler's
/// `rt_sigreturn`, before the runtime's next entry, count on: they were
/// lost until session 19, 16 Ir per signal in `raise`).
#[test]
fn signal_handler() {
    compare("signal.c", &["-O0"]);
}

/// Code without a name (a stripped program: Callgrind names each block
/// by its address) counts in a counter group per 64 KiB region of its
/// object; a function bigger than that jumps between regions, each
/// jump a runtime decision that counts the new region in the same
/// context. Costs and calls are the stream path's.
#[test]
fn stripped_code_across_regions() {
    use std::fmt::Write;
    let dir = TempDir::new("client-contexts-stripped");
    // `big` is well over 64 KiB of code at -O0: 3,000 branches, each
    // arm calling or adding, with a constant of its own.
    let mut src = String::from(
        "#include <stdio.h>\n\
         __attribute__((noinline)) long leaf(long x) { return x * 7 + 1; }\n\
         __attribute__((noinline)) long big(long x) {\n",
    );
    for i in 0..3000 {
        writeln!(
            src,
            "    if (x & {}) x = leaf(x) ^ {i}; else x += {i};",
            1 << (i % 5)
        )
        .unwrap();
    }
    src.push_str(
        "    return x;\n}\n\
         int main(void) {\n    long s = 0;\n\
         for (int i = 0; i < 20; i++) s += big(i);\n\
         printf(\"%ld\\n\", s);\n    return 0;\n}\n",
    );
    let c = dir.join("stripped.c");
    std::fs::write(&c, src).unwrap();
    let exe = dir.join("stripped");
    run_support::require("gcc");
    run_support::require("strip");
    let o = std::process::Command::new("gcc")
        .args(["-O0", "-Wl,-z,now"])
        .arg(&c)
        .arg("-o")
        .arg(&exe)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = std::process::Command::new("strip")
        .arg(&exe)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let [stream, clients @ ..] = all_of(&dir, &exe, None);
    assert!(stream.selfs.keys().any(|(f, _)| f.starts_with("0x")));
    for (mode, client) in CLIENT_MODES.iter().zip(&clients) {
        assert_same(&stream, client, mode);
    }
}

/// `threads.c`'s two workers run one after the other and get the same
/// thread number: the second goes on with the first's call stack, as in
/// Callgrind (its `start_thread` is `start_thread'2`, called from the
/// first's context), and each worker's first blocks count there. The
/// workers' thread is compared: the main thread's `pthread_join` waits on
/// its futex once or twice, as the worker's timing has it, either way.
#[test]
fn threads_taking_an_ended_threads_number() {
    let dir = TempDir::new("client-contexts-threads");
    let exe = callgrind_fixture(&dir, &["threads.c"], &[&["-O0"], NOW].concat());
    let [stream, clients @ ..] = all_of(&dir, &exe, Some("02"));
    assert!(
        stream.selfs.keys().any(|(f, _)| f == "start_thread'2"),
        "the second worker goes on with the first's stack"
    );
    for (mode, client) in CLIENT_MODES.iter().zip(&clients) {
        assert_same(&stream, client, mode);
    }
}

/// The engine's inline fast paths (its stub, before the runtime) take
/// most entries (most of these small programs' are the dynamic linker's):
/// `fib.c`'s calls and returns, and the PLT calls
/// into the C library and their returns; the costs are the stream path's
/// (`recursion_levels`, `calls_recursion_and_callbacks`). A regression
/// that sends them all to the runtime would still be exact, only slow:
/// this says so.
#[test]
fn inline_fast_paths_take_most_entries() {
    for (src, at_least) in [("fib.c", 0.7), ("calls.c", 0.5)] {
        let line = contexts_summary(src, "-O0", &["--client-contexts=yes"], "client contexts:");
        let line = line.as_str();
        // "client contexts: N context entries, F by a fast path (P%), I of
        // them inline; arenas M MB": the last number before a phrase.
        let number_before = |phrase: &str| -> u64 {
            let head = &line[..line.find(phrase).unwrap_or_else(|| panic!("{line}"))];
            let digits: String = head
                .trim_end()
                .chars()
                .rev()
                .take_while(char::is_ascii_digit)
                .collect();
            digits.chars().rev().collect::<String>().parse().unwrap()
        };
        let (entries, inline) = (
            number_before("context entries"),
            number_before("of them inline"),
        );
        assert!(
            entries > 0 && inline as f64 >= at_least * entries as f64,
            "{src}: {line}"
        );
    }
}
