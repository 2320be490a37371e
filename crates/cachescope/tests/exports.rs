//! Exports of `--tool=callgrind` runs on the fixtures of
//! `fixtures/callgrind`: the folded stacks sum exactly to the totals of the
//! run's `callgrind.out`, per event and thread by thread; `cachescope
//! export` from the saved stack tree writes the same files as the run; the
//! SVG is XML naming the fixture's functions; the speedscope file validates
//! against speedscope's own JSON schema (`tests/data/speedscope`); the
//! Firefox Profiler file has the processed format's (version 47) fields,
//! tables that hold together and weights that sum to the totals; inline
//! frames appear only with the flag.

mod run_support;

use run_support::{cachescope, callgrind_fixture, under_cachescope, TempDir};
use serde_json::Value;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

const KINDS: [&str; 5] = ["stacktree", "folded", "svg", "speedscope", "firefox"];

/// A run of fixture `srcs` with every export (`extra` options too).
struct Exported {
    dir: TempDir,
    totals: Vec<u64>,
    events: Vec<String>,
}

impl Exported {
    fn path(&self, kind: &str) -> PathBuf {
        self.dir.join(&format!("out.{kind}"))
    }
    fn text(&self, kind: &str) -> String {
        std::fs::read_to_string(self.path(kind)).unwrap()
    }
    fn json(&self, kind: &str) -> Value {
        serde_json::from_str(&self.text(kind)).unwrap()
    }
}

fn run(srcs: &[&str], flags: &[&str], extra: &[&str]) -> Exported {
    let dir = TempDir::new(&format!("exports-{}", srcs[0]));
    let exe = callgrind_fixture(&dir, srcs, flags);
    let out = dir.join("callgrind.out");
    let mut args = vec![
        "--tool=callgrind".to_string(),
        "-q".into(),
        format!("--callgrind-out-file={}", out.display()),
    ];
    for k in KINDS {
        args.push(format!(
            "--export={k}:{}",
            dir.join(&format!("out.{k}")).display()
        ));
    }
    args.extend(extra.iter().map(|s| s.to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let r = under_cachescope(&dir.0, &args, exe.as_os_str(), &[], None);
    assert!(
        matches!(r.end, run_support::End::Code(0)),
        "{}",
        r.stderr_text()
    );
    assert_eq!(r.stderr_text(), "", "no complaint");
    let data = std::fs::read(&out).unwrap();
    let profile = callgrind::parse(&data).unwrap();
    let part = &profile.parts[0];
    Exported {
        totals: part.totals.clone().expect("totals:"),
        events: part.events.iter().map(|e| e.name.clone()).collect(),
        dir,
    }
}

/// The folded lines' counts, summed.
fn folded_sum(text: &str) -> u64 {
    text.lines()
        .map(|l| {
            let (stack, n) = l.rsplit_once(' ').expect("stack COUNT");
            assert!(!stack.is_empty() && !stack.contains('\n'));
            n.parse::<u64>().expect("a count")
        })
        .sum()
}

/// `cachescope export ARGS`; its exit status and stderr.
fn export(args: &[&str]) -> (i32, String) {
    let o = Command::new(cachescope())
        .arg("export")
        .args(args)
        .output()
        .unwrap();
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// Every check on one run; `functions` are names of the fixture's own.
fn check_all(e: &Exported, functions: &[&str]) {
    assert_eq!(e.events, ["Ir"]);
    let folded = e.text("folded");
    assert_eq!(
        folded_sum(&folded),
        e.totals[0],
        "folded stacks sum to totals:"
    );
    for f in functions {
        assert!(
            folded
                .lines()
                .any(|l| l.rsplit_once(' ').unwrap().0.split(';').any(|x| x == *f)),
            "{f} in the folded stacks"
        );
    }
    // The saved tree gives the same exports afterwards.
    let tree = e.path("stacktree");
    for k in KINDS {
        let again = e.dir.join(&format!("again.{k}"));
        let (code, err) = export(&[k, tree.to_str().unwrap(), "-o", again.to_str().unwrap()]);
        assert_eq!((code, err.as_str()), (0, ""), "export {k}");
        assert_eq!(
            std::fs::read(&again).unwrap(),
            std::fs::read(e.path(k)).unwrap(),
            "export {k} from the saved tree equals the run's"
        );
    }
    // Thread by thread, the folded stacks sum to the whole.
    let threads: BTreeSet<u32> = e
        .text("stacktree")
        .lines()
        .filter_map(|l| l.strip_prefix("node "))
        .map(|l| l.split(' ').nth(2).unwrap().parse().unwrap())
        .collect();
    let mut sum = 0;
    for t in &threads {
        let one = e.dir.join(&format!("thread{t}.folded"));
        let th = format!("--thread={t}");
        let (code, err) = export(&[
            "folded",
            &th,
            tree.to_str().unwrap(),
            "-o",
            one.to_str().unwrap(),
        ]);
        assert_eq!((code, err.as_str()), (0, ""));
        sum += folded_sum(&std::fs::read_to_string(&one).unwrap());
    }
    assert_eq!(sum, e.totals[0], "threads {threads:?} sum to the totals");
    check_svg(&e.text("svg"), functions);
    check_speedscope(&e.json("speedscope"), &e.totals);
    check_firefox(&e.json("firefox"), &e.totals, functions);
}

/// The SVG is well-formed XML whose frame titles name `functions`.
fn check_svg(svg: &str, functions: &[&str]) {
    use quick_xml::events::Event;
    let mut reader = quick_xml::Reader::from_str(svg);
    let (mut depth, mut title, mut titles) = (0i32, None::<String>, Vec::new());
    loop {
        match reader.read_event().expect("well-formed XML") {
            Event::Start(s) => {
                depth += 1;
                title = (s.name().as_ref() == b"title").then(String::new);
            }
            Event::End(_) => {
                depth -= 1;
                titles.extend(title.take());
            }
            Event::Text(t) => {
                if let Some(title) = &mut title {
                    title.push_str(&t.decode().unwrap());
                }
            }
            // Entities come apart from the text around them.
            Event::GeneralRef(r) => {
                if let Some(title) = &mut title {
                    let c = match r.decode().unwrap().as_ref() {
                        "apos" => '\'',
                        "quot" => '"',
                        "amp" => '&',
                        "lt" => '<',
                        "gt" => '>',
                        other => panic!("entity {other}"),
                    };
                    title.push(c);
                }
            }
            Event::Eof => break,
            _ => {}
        }
    }
    assert_eq!(depth, 0, "balanced elements");
    for f in functions {
        assert!(
            titles.iter().any(|t| t.starts_with(&format!("{f} ("))),
            "a frame titled {f}: {:?}",
            &titles[..titles.len().min(20)]
        );
    }
}

/// Validates `v` against the JSON-schema subset speedscope's schema uses
/// (`$ref`, `anyOf`, `type`, `properties`, `required`, `items`, `enum`,
/// `const`); any other keyword fails the test rather than being ignored.
fn validate(schema: &Value, root: &Value, v: &Value, at: &str) -> Result<(), String> {
    let obj = schema.as_object().expect("schema object");
    for k in obj.keys() {
        let known = [
            "$ref",
            "anyOf",
            "type",
            "properties",
            "required",
            "items",
            "enum",
            "const",
            "title",
            "definitions",
            "$schema",
            "description",
        ];
        assert!(
            known.contains(&k.as_str()),
            "schema keyword {k} not understood"
        );
    }
    if let Some(r) = obj.get("$ref").and_then(Value::as_str) {
        let name = r.strip_prefix("#/definitions/").expect("local $ref");
        return validate(&root["definitions"][name], root, v, at);
    }
    if let Some(any) = obj.get("anyOf").and_then(Value::as_array) {
        if !any.iter().any(|s| validate(s, root, v, at).is_ok()) {
            return Err(format!("{at}: matches none of anyOf"));
        }
    }
    if let Some(t) = obj.get("type").and_then(Value::as_str) {
        let ok = match t {
            "object" => v.is_object(),
            "array" => v.is_array(),
            "string" => v.is_string(),
            "number" => v.is_number(),
            "integer" => v.is_u64() || v.is_i64(),
            "boolean" => v.is_boolean(),
            _ => panic!("type {t}"),
        };
        if !ok {
            return Err(format!("{at}: not {t}"));
        }
    }
    if let Some(e) = obj.get("enum").and_then(Value::as_array) {
        if !e.contains(v) {
            return Err(format!("{at}: {v} not in {e:?}"));
        }
    }
    if let Some(c) = obj.get("const") {
        if c != v {
            return Err(format!("{at}: {v} is not {c}"));
        }
    }
    if let Some(req) = obj.get("required").and_then(Value::as_array) {
        for r in req {
            let r = r.as_str().unwrap();
            if v.get(r).is_none() {
                return Err(format!("{at}: no {r}"));
            }
        }
    }
    if let (Some(props), Some(o)) = (
        obj.get("properties").and_then(Value::as_object),
        v.as_object(),
    ) {
        for (k, s) in props {
            if let Some(x) = o.get(k) {
                validate(s, root, x, &format!("{at}.{k}"))?;
            }
        }
    }
    if let (Some(items), Some(a)) = (obj.get("items"), v.as_array()) {
        for (i, x) in a.iter().enumerate() {
            validate(items, root, x, &format!("{at}[{i}]"))?;
        }
    }
    Ok(())
}

fn check_speedscope(v: &Value, totals: &[u64]) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/speedscope");
    let schema: Value = serde_json::from_str(
        &std::fs::read_to_string(dir.join("file-format-schema.json")).unwrap(),
    )
    .unwrap();
    validate(&schema, &schema, v, "$").unwrap();
    let frames = v["shared"]["frames"].as_array().unwrap().len();
    let profiles = v["profiles"].as_array().unwrap();
    assert_eq!(profiles.len(), totals.len(), "one profile per event");
    for (p, total) in profiles.iter().zip(totals) {
        assert_eq!(p["type"], "sampled");
        let samples = p["samples"].as_array().unwrap();
        let weights = p["weights"].as_array().unwrap();
        assert_eq!(samples.len(), weights.len());
        let sum: u64 = weights.iter().map(|w| w.as_u64().unwrap()).sum();
        assert_eq!(sum, *total, "speedscope weights sum to the total");
        assert_eq!(p["endValue"].as_u64(), Some(*total));
        for s in samples {
            assert!(s
                .as_array()
                .unwrap()
                .iter()
                .all(|f| (f.as_u64().unwrap() as usize) < frames));
        }
    }
}

/// Checks a table's columns all have `length` entries; returns it.
fn table(t: &Value, columns: &[&str]) -> usize {
    let n = t["length"].as_u64().expect("length") as usize;
    for c in columns {
        let col = t[*c].as_array().unwrap_or_else(|| panic!("column {c}"));
        assert_eq!(col.len(), n, "column {c}");
    }
    n
}

/// The processed profile format, version 47 (the Firefox Profiler's
/// `src/types/profile.js` of that version and `docs-developer/
/// CHANGELOG-formats.md`).
fn check_firefox(v: &Value, totals: &[u64], functions: &[&str]) {
    let meta = &v["meta"];
    assert_eq!(meta["preprocessedProfileVersion"], 47);
    for k in [
        "version",
        "interval",
        "startTime",
        "processType",
        "product",
        "categories",
        "markerSchema",
    ] {
        assert!(!meta[k].is_null(), "meta.{k}");
    }
    let categories = meta["categories"].as_array().unwrap();
    assert!(
        categories.iter().any(|c| c["color"] == "grey"),
        "a grey default category"
    );
    for k in ["libs", "pages", "counters", "threads"] {
        assert!(v[k].is_array(), "{k}");
    }
    let threads = v["threads"].as_array().unwrap();
    assert_eq!(threads.len(), totals.len(), "one thread per event");
    let mut named = BTreeSet::new();
    for (th, total) in threads.iter().zip(totals) {
        assert!(th["pid"].is_string(), "pid is a string since version 47");
        assert!(th["isMainThread"].is_boolean() && th["name"].is_string());
        for k in [
            "processType",
            "processStartupTime",
            "registerTime",
            "pausedRanges",
            "tid",
        ] {
            assert!(!th[k].is_null(), "thread.{k}");
        }
        let strings = th["stringArray"].as_array().unwrap();
        let string = |i: &Value| strings[i.as_u64().unwrap() as usize].as_str().unwrap();
        let funcs = table(
            &th["funcTable"],
            &[
                "isJS",
                "relevantForJS",
                "name",
                "resource",
                "fileName",
                "lineNumber",
                "columnNumber",
            ],
        );
        let frames = table(
            &th["frameTable"],
            &[
                "address",
                "inlineDepth",
                "category",
                "subcategory",
                "func",
                "nativeSymbol",
                "innerWindowID",
                "implementation",
                "line",
                "column",
            ],
        );
        let stacks = table(
            &th["stackTable"],
            &["frame", "prefix", "category", "subcategory"],
        );
        let samples = &th["samples"];
        let n = table(samples, &["stack", "time", "weight"]);
        table(
            &th["markers"],
            &["data", "name", "startTime", "endTime", "phase", "category"],
        );
        table(&th["resourceTable"], &["lib", "name", "host", "type"]);
        table(
            &th["nativeSymbols"],
            &["libIndex", "address", "name", "functionSize"],
        );
        assert_eq!(samples["weightType"], "samples");
        let ft = &th["funcTable"];
        for i in 0..funcs {
            named.insert(string(&ft["name"][i]).to_string());
            let file = &ft["fileName"][i];
            assert!(file.is_null() || !string(file).is_empty());
        }
        let fr = &th["frameTable"];
        for i in 0..frames {
            assert!((fr["func"][i].as_u64().unwrap() as usize) < funcs);
            let line = &fr["line"][i];
            assert!(line.is_null() || line.as_u64().unwrap() > 0);
        }
        let st = &th["stackTable"];
        for i in 0..stacks {
            assert!((st["frame"][i].as_u64().unwrap() as usize) < frames);
            let p = &st["prefix"][i];
            assert!(
                p.is_null() || (p.as_u64().unwrap() as usize) < i,
                "prefix before its stack"
            );
        }
        let mut last = f64::MIN;
        let mut sum = 0u64;
        for i in 0..n {
            assert!((samples["stack"][i].as_u64().unwrap() as usize) < stacks);
            let t = samples["time"][i].as_f64().unwrap();
            assert!(t >= last, "sample times in order");
            last = t;
            sum += samples["weight"][i].as_u64().expect("integer weight");
        }
        assert_eq!(sum, *total, "Firefox weights sum to the total");
        // Frames of the fixture's own functions carry source lines.
        let lined = (0..frames).any(|i| {
            let f = fr["func"][i].as_u64().unwrap() as usize;
            functions.contains(&string(&ft["name"][f])) && fr["line"][i].is_u64()
        });
        assert!(lined, "source lines on the fixture's frames");
    }
    for f in functions {
        assert!(named.contains(*f), "{f} in the funcTable");
    }
}

#[test]
fn recursion_and_calls() {
    let e = run(&["fib.c"], &[], &[]);
    check_all(&e, &["main", "fib", "fib'2"]);
    let e = run(&["calls.c"], &[], &[]);
    check_all(&e, &["main"]);
}

#[test]
fn threads_and_exceptions() {
    let e = run(&["threads.c"], &[], &[]);
    check_all(&e, &["main"]);
    let e = run(&["exception.cpp"], &[], &[]);
    check_all(&e, &["main"]);
}

#[test]
fn inline_frames_only_with_the_flag() {
    let srcs = ["multi.c", "util.c"];
    let plain = run(&srcs, &[], &[]);
    check_all(&plain, &["main", "scale_all"]);
    let has_clamp = |e: &Exported| {
        e.text("folded").lines().any(|l| {
            l.rsplit_once(' ')
                .unwrap()
                .0
                .split(';')
                .any(|f| f == "clamp")
        })
    };
    assert!(
        !has_clamp(&plain),
        "function names stay Callgrind's by default"
    );
    let inlined = run(&srcs, &[], &["--export-inline=yes"]);
    assert!(has_clamp(&inlined), "{}", inlined.text("folded"));
    assert_eq!(folded_sum(&inlined.text("folded")), inlined.totals[0]);
    // The same from the saved tree with --inline.
    let out = inlined.dir.join("inline.folded");
    let tree = plain.path("stacktree");
    let (code, err) = export(&[
        "folded",
        "--inline",
        tree.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
    ]);
    assert_eq!((code, err.as_str()), (0, ""));
    let text = std::fs::read_to_string(&out).unwrap();
    assert!(text.lines().any(|l| l.contains(";clamp ")), "{text}");
}

#[test]
fn bad_input_is_one_line() {
    let dir = TempDir::new("exports-bad");
    let bad = dir.join("bad.st");
    std::fs::write(&bad, "stacktree: 1\nevents: Ir\nnode 0 - 1 5 1 3\n").unwrap();
    let out = dir.join("x");
    let (code, err) = export(&["folded", bad.to_str().unwrap(), "-o", out.to_str().unwrap()]);
    assert_eq!(code, 1);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("cut short"), "{err}");
    assert!(!out.exists(), "no output");
    let (code, err) = export(&["folded", "/nonexistent.st", "-o", out.to_str().unwrap()]);
    assert_eq!((code, err.lines().count()), (1, 1), "{err}");
    let (code, _) = export(&["pdf", bad.to_str().unwrap(), "-o", out.to_str().unwrap()]);
    assert_eq!(code, 2);
}
