//! Symbolization checked against Valgrind itself: each fixture is compiled,
//! run under `valgrind --tool=callgrind --dump-instr=yes` (which prints,
//! for every executed instruction, its object, object-relative address,
//! file, function and line from Valgrind's own debug-info reader), and every
//! instruction is then looked up with this crate.
//!
//! Files and lines must match Callgrind's exactly. Function names must
//! match Callgrind's or form a cost centre of Cachegrind's own output for the
//! same program (Callgrind names a whole basic block after its first
//! instruction, Cachegrind each instruction), and every cost centre
//! Cachegrind reports in the fixture's source must be produced.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use symbols::ObjectInfo;

/// One executed instruction as Callgrind names it.
#[derive(Debug, Clone)]
struct Instr {
    obj: String,
    addr: u64,
    file: String,
    func: String,
    line: u32,
}

fn tmpdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("symbols-oracle-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

fn compile(compiler: &str, args: &[&str], src: &str, out: &Path) {
    let st = Command::new(compiler)
        .args(args)
        .arg(fixture(src))
        .arg("-o")
        .arg(out)
        .status()
        .unwrap();
    assert!(st.success(), "{compiler} failed on {src}");
}

/// Resolves a Callgrind compressed name (`(id) name` defines, `(id)` uses).
fn name(table: &mut HashMap<String, String>, v: &str) -> String {
    if let Some(rest) = v.strip_prefix('(') {
        if let Some(close) = rest.find(')') {
            let id = &rest[..close];
            let tail = rest[close + 1..].trim_start();
            if tail.is_empty() {
                return table.get(id).cloned().unwrap_or_default();
            }
            table.insert(id.to_string(), tail.to_string());
            return tail.to_string();
        }
    }
    v.to_string()
}

fn run_callgrind(dir: &Path, exe: &Path) -> Vec<Instr> {
    let out = dir.join("callgrind.out");
    let st = Command::new("valgrind")
        .args(["--tool=callgrind", "--dump-instr=yes", "-q"])
        .arg(format!("--callgrind-out-file={}", out.display()))
        .arg(exe)
        .stdout(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(st.success());
    let text = std::fs::read_to_string(&out).unwrap();
    let (mut obs, mut fls, mut fns) = (HashMap::new(), HashMap::new(), HashMap::new());
    let (mut ob, mut fl, mut fi, mut func) = (String::new(), String::new(), None, String::new());
    let (mut addr, mut line) = (0u64, 0i64);
    let mut skip_next = false;
    let mut res = Vec::new();
    for l in text.lines() {
        if let Some((key, v)) = l.split_once('=') {
            if !key.is_empty() && key.bytes().all(|c| c.is_ascii_lowercase()) {
                match key {
                    "ob" => ob = name(&mut obs, v),
                    "fl" => {
                        fl = name(&mut fls, v);
                        fi = None;
                    }
                    "fi" => fi = Some(name(&mut fls, v)),
                    "fe" => {
                        let f = name(&mut fls, v);
                        fi = (f != fl).then_some(f);
                    }
                    "fn" => func = name(&mut fns, v),
                    "cob" => drop(name(&mut obs, v)),
                    "cfi" | "cfl" => drop(name(&mut fls, v)),
                    "cfn" => drop(name(&mut fns, v)),
                    "calls" => skip_next = true,
                    _ => {}
                }
                continue;
            }
        }
        let first = l.bytes().next();
        if !matches!(first, Some(b'0'..=b'9' | b'+' | b'-' | b'*')) {
            continue;
        }
        let mut it = l.split_whitespace();
        let (a, ln) = (it.next().unwrap(), it.next().unwrap());
        addr = match a {
            "*" => addr,
            _ if a.starts_with("0x") => u64::from_str_radix(&a[2..], 16).unwrap(),
            _ if a.starts_with('+') => addr + a[1..].parse::<u64>().unwrap(),
            _ if a.starts_with('-') => addr - a[1..].parse::<u64>().unwrap(),
            _ => a.parse().unwrap(),
        };
        line = match ln {
            "*" => line,
            _ if ln.starts_with('+') => line + ln[1..].parse::<i64>().unwrap(),
            _ if ln.starts_with('-') => line - ln[1..].parse::<i64>().unwrap(),
            _ => ln.parse().unwrap(),
        };
        if std::mem::take(&mut skip_next) {
            continue;
        }
        res.push(Instr {
            obj: ob.clone(),
            addr,
            file: fi.clone().unwrap_or_else(|| fl.clone()),
            func: func.clone(),
            line: line as u32,
        });
    }
    res
}

/// The `(file, fn, line)` cost centres of a Cachegrind output file that
/// have a non-zero count.
fn run_cachegrind(dir: &Path, exe: &Path) -> HashSet<(String, String, u32)> {
    let out = dir.join("cachegrind.out");
    let st = Command::new("valgrind")
        .args(["--tool=cachegrind", "--cache-sim=no", "-q"])
        .arg(format!("--cachegrind-out-file={}", out.display()))
        .arg(exe)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(st.success());
    let text = std::fs::read_to_string(&out).unwrap();
    let (mut fl, mut func) = (String::new(), String::new());
    let mut set = HashSet::new();
    for l in text.lines() {
        if let Some(v) = l.strip_prefix("fl=") {
            fl = v.to_string();
        } else if let Some(v) = l.strip_prefix("fn=") {
            func = v.to_string();
        } else if l.starts_with(|c: char| c.is_ascii_digit()) {
            let mut it = l.split_whitespace();
            let line: u32 = it.next().unwrap().parse().unwrap();
            if it.any(|c| c != "0") {
                set.insert((fl.clone(), func.clone(), line));
            }
        }
    }
    set
}

/// Checks every instruction Callgrind saw; returns how many distinct
/// addresses were checked.
fn compare(instrs: &[Instr], cg: &HashSet<(String, String, u32)>) -> usize {
    let mut objects: HashMap<String, Option<ObjectInfo>> = HashMap::new();
    let mut seen = HashSet::new();
    let mut ours = HashSet::new();
    for i in instrs {
        if !seen.insert((i.obj.clone(), i.addr)) {
            continue;
        }
        let obj = objects
            .entry(i.obj.clone())
            .or_insert_with(|| ObjectInfo::load(Path::new(&i.obj)).ok());
        let Some(obj) = obj else { continue };
        let func = obj
            .function_at(i.addr)
            .map_or("???".into(), |f| f.to_string());
        let (file, line) = obj
            .line_at(i.addr)
            .map_or(("???".to_string(), 0), |(f, l)| (f.to_string(), l));
        // Callgrind prints an unknown file as an empty `fl=` name.
        let want_file = if i.file.is_empty() { "???" } else { &i.file };
        assert_eq!(
            (file.as_str(), line),
            (want_file, i.line),
            "file/line of {}+{:#x} (fn {})",
            i.obj,
            i.addr,
            i.func
        );
        let key = (file, func, line);
        // Callgrind names a whole basic block after its first instruction
        // and Cachegrind's run may not have executed this instruction: the
        // name must agree with at least one of them.
        let callgrind_fn = if i.func.starts_with("0x") {
            "???"
        } else {
            &i.func
        };
        assert!(
            key.1 == callgrind_fn || cg.contains(&key),
            "{}+{:#x}: {key:?} is neither Callgrind's fn ({}) nor a Cachegrind cost centre",
            i.obj,
            i.addr,
            i.func
        );
        ours.insert(key);
    }
    // The other direction: what Cachegrind counted in the fixture's own
    // source must all be found (library paths may differ between runs).
    let in_fixture = |k: &&(String, String, u32)| k.0.contains("/tests/fixtures/");
    assert!(
        cg.iter().any(|k| in_fixture(&k)),
        "no cost centre in the fixture source"
    );
    let missing: Vec<_> = cg.difference(&ours).filter(in_fixture).collect();
    assert!(
        missing.is_empty(),
        "cost centres we never produced: {missing:?}"
    );
    seen.len()
}

fn check(label: &str, exe: &Path, dir: &Path) {
    let instrs = run_callgrind(dir, exe);
    let cg = run_cachegrind(dir, exe);
    let checked = compare(&instrs, &cg);
    eprintln!("{label}: {checked} instructions checked");
    assert!(checked > 1000, "{label}: too few instructions checked");
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn c_pie_matches_valgrind() {
    testkit::require("valgrind");
    testkit::require("gcc");
    let dir = tmpdir("c-pie");
    let exe = dir.join("sym_c");
    compile("gcc", &["-O1", "-g", "-fPIE", "-pie"], "sym_c.c", &exe);
    check("C PIE -O1", &exe, &dir);
}

#[test]
fn c_static_nonpie_dwarf4_matches_valgrind() {
    testkit::require("valgrind");
    testkit::require("gcc");
    let dir = tmpdir("c-static");
    let exe = dir.join("sym_c_static");
    compile(
        "gcc",
        &["-O2", "-gdwarf-4", "-static", "-no-pie"],
        "sym_c.c",
        &exe,
    );
    check("C static -O2 DWARF4", &exe, &dir);
}

#[test]
fn cxx_matches_valgrind() {
    testkit::require("valgrind");
    testkit::require("g++");
    let dir = tmpdir("cxx");
    let exe = dir.join("sym_cxx");
    compile("g++", &["-O2", "-g"], "sym_cxx.cc", &exe);
    check("C++ -O2", &exe, &dir);
}

#[test]
fn rust_matches_valgrind() {
    testkit::require("valgrind");
    testkit::require("rustc");
    let dir = tmpdir("rust");
    let exe = dir.join("sym_rust");
    compile(
        "rustc",
        &["-O", "-g", "--edition=2021"],
        "sym_rust.rs",
        &exe,
    );
    check("Rust", &exe, &dir);
}

#[test]
fn rust_v0_mangling_matches_valgrind() {
    testkit::require("valgrind");
    testkit::require("rustc");
    let dir = tmpdir("rust-v0");
    let exe = dir.join("sym_rust_v0");
    let flags = ["-O", "-g", "--edition=2021", "-Csymbol-mangling-version=v0"];
    compile("rustc", &flags, "sym_rust.rs", &exe);
    check("Rust v0", &exe, &dir);
}
