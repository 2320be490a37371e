//! `cachescope replay` command-line behaviour: option errors and start-up
//! warnings compared with the real Valgrind, trace formats, bad traces.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use testkit::TempDir;

fn replay(args: &[&str], dir: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_cachescope"))
        .arg("replay")
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap()
}

fn cachegrind(args: &[&str], dir: &Path) -> Output {
    Command::new("valgrind")
        .arg("--tool=cachegrind")
        .args(args)
        .arg("true")
        .current_dir(dir)
        .output()
        .expect("valgrind must be installed")
}

fn stderr_lines(o: &Output) -> Vec<String> {
    String::from_utf8_lossy(&o.stderr)
        .lines()
        .map(str::to_string)
        .collect()
}

/// Lines starting with `prefix`, with it removed.
fn with_prefix(lines: &[String], prefix: &str) -> Vec<String> {
    lines
        .iter()
        .filter_map(|l| l.strip_prefix(prefix).map(str::to_string))
        .collect()
}

/// Valgrind's `--PID-- ` / `==PID== ` lines, with the pid replaced by `P`.
fn without_pids(lines: &[String]) -> Vec<String> {
    lines
        .iter()
        .filter_map(|l| {
            for (open, close) in [("--", "-- "), ("==", "== ")] {
                if let Some(rest) = l.strip_prefix(open) {
                    if let Some((pid, text)) = rest.split_once(close) {
                        if !pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit()) {
                            return Some(format!("{open}P{close}{text}"));
                        }
                    }
                }
            }
            None
        })
        .collect()
}

/// A small synthetic trace: accesses of assorted sizes (some straddling
/// lines) over a few hundred KB, in Lackey's and din's spellings.
fn synthetic_traces(events: usize) -> (String, String) {
    let (mut lackey, mut din) = (String::new(), String::new());
    let mut x: u64 = 0x9e37_79b9;
    let mut pc: u64 = 0x40_1000;
    for i in 0..events {
        x = x
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        let r = x >> 33;
        let len = 1 + r % 15;
        lackey.push_str(&format!("I  {pc:08x},{len}\n"));
        din.push_str(&format!("2 {pc:x} {len}\n"));
        pc = if r.is_multiple_of(7) {
            0x40_1000 + (r % 4096)
        } else {
            pc + len
        };
        let addr = 0x1_0000 + (r >> 8) % (384 * 1024);
        let size = [1, 2, 4, 8, 16, 32][(r % 6) as usize];
        let (l, d) = match i % 3 {
            0 => ('L', 0),
            1 => ('S', 1),
            _ => ('M', 0),
        };
        lackey.push_str(&format!(" {l} {addr:08x},{size}\n"));
        din.push_str(&format!("{d} {addr:x} {size}\n"));
    }
    (lackey, din)
}

/// The replayed `summary:` line of an output file.
fn summary_line(path: &Path) -> String {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .find(|l| l.starts_with("summary:"))
        .unwrap()
        .to_string()
}

#[test]
fn option_errors_match_valgrind() {
    let dir = TempDir::new("opterr");
    // Rules 1 and 2 (zero line size / associativity) are not compared:
    // 3.19 predates them and crashes instead; unit tests cover them.
    for opt in [
        "--D1=1000,2,64",
        "--D1=65536,2",
        "--I1=99999999999,2,64",
        "--LL=65536,2,48",
        "--D1=,2,64",
        "--D1=65536,2,64,",
        "--D1=-65536,2,64",
        "--L2=8192,2,8",
        "--D1=64,1,64",
        "--D1=128,4,64",
        "--I1=3072,1,24",
        "--I1=65536,2,64x",
        "--cache-sim=maybe",
        "--cache-sim=",
    ] {
        let theirs = cachegrind(&[opt], &dir.0);
        let ours = replay(&[opt, "no-such-trace"], &dir.0);
        assert_eq!(ours.status.code(), theirs.status.code(), "{opt}");
        assert_eq!(ours.status.code(), Some(1), "{opt}");
        let want = with_prefix(&stderr_lines(&theirs), "valgrind: ");
        assert!(
            !want.is_empty(),
            "{opt}: valgrind said {:?}",
            stderr_lines(&theirs)
        );
        assert_eq!(
            stderr_lines(&ours),
            with_prefix(&stderr_lines(&theirs), "valgrind: ")
                .iter()
                .map(|l| format!("cachescope: {l}"))
                .collect::<Vec<_>>(),
            "{opt}"
        );
    }
}

#[test]
fn startup_warnings_and_desc_match_valgrind() {
    let dir = TempDir::new("autodetect");
    std::fs::write(dir.join("t.lackey"), "I  00401000,4\n").unwrap();
    // Auto-detected caches: the same dmsg warnings (CPUID decoding, the LL
    // tweak) and the same `desc:` lines as Cachegrind on this machine.
    let theirs = cachegrind(&["--cache-sim=yes", "--cachegrind-out-file=cg.out"], &dir.0);
    let ours = replay(&["--cachegrind-out-file=ours.out", "t.lackey"], &dir.0);
    assert!(ours.status.success(), "{:?}", stderr_lines(&ours));
    let dmsgs = |o: &Output| {
        without_pids(&stderr_lines(o))
            .into_iter()
            .filter(|l| l.starts_with("--P-- "))
            .filter(|l| {
                !l.contains("Reading syms") && !l.contains("--tool") && !l.contains("--cache")
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(dmsgs(&ours), dmsgs(&theirs));
    let desc = |p: PathBuf| {
        std::fs::read_to_string(p)
            .unwrap()
            .lines()
            .filter(|l| l.starts_with("desc:"))
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    let want = desc(dir.join("cg.out"));
    assert_eq!(want.len(), 3);
    assert_eq!(desc(dir.join("ours.out")), want);

    // A line size below the largest register: the same fatal message.
    let theirs = cachegrind(&["--D1=65536,2,16"], &dir.0);
    let ours = replay(&["--D1=65536,2,16", "t.lackey"], &dir.0);
    assert_eq!(ours.status.code(), Some(1));
    assert_eq!(theirs.status.code(), Some(1));
    let fatal = |o: &Output| {
        let l = without_pids(&stderr_lines(o));
        l[l.len() - 3..].to_vec()
    };
    assert_eq!(fatal(&ours), fatal(&theirs));
    assert_eq!(
        fatal(&ours)[0],
        "==P== Cachegrind: cannot continue: the minimum line size (16)"
    );
    assert!(!dir.join("cachegrind.out").exists());
}

#[test]
fn din_and_lackey_spellings_agree() {
    let dir = TempDir::new("formats");
    let (lackey, din) = synthetic_traces(30_000);
    std::fs::write(dir.join("t.lackey"), lackey).unwrap();
    std::fs::write(dir.join("t.din"), din).unwrap();
    let caches = ["--I1=4096,2,64", "--D1=8192,4,64", "--LL=65536,8,64"];
    let run = |extra: &[&str]| {
        let mut args: Vec<&str> = caches.to_vec();
        args.extend_from_slice(extra);
        let o = replay(&args, &dir.0);
        assert!(o.status.success(), "{:?}", stderr_lines(&o));
        o
    };
    let a = run(&["--cachegrind-out-file=a.out", "t.lackey"]);
    let b = run(&["--format=din", "--cachegrind-out-file=b.out", "t.din"]);
    let sa = summary_line(&dir.join("a.out"));
    assert_eq!(sa, summary_line(&dir.join("b.out")));
    let n: Vec<u64> = sa[9..].split(' ').map(|v| v.parse().unwrap()).collect();
    // 30,000 instructions, 20,000 reads (L and M), 10,000 writes, and a
    // mix of hits and misses at every level.
    assert_eq!((n[0], n[3], n[6]), (30_000, 20_000, 10_000));
    assert!(n.iter().all(|&v| v > 0), "{sa}");
    assert!(n[4] < n[3] && n[5] < n[4], "{sa}");
    // Same totals, same summary (bar the pids).
    let block = |o: &Output| {
        without_pids(&stderr_lines(o))
            .into_iter()
            .filter(|l| l.starts_with("==P== "))
            .collect::<Vec<_>>()
    };
    assert_eq!(block(&a), block(&b));
    assert_eq!(block(&a)[1], format!("==P== I refs:        {}", "30,000"));
}

#[test]
fn stdin_and_cache_sim_no() {
    let dir = TempDir::new("stdin");
    let (lackey, _) = synthetic_traces(1_000);
    let mut child = Command::new(env!("CARGO_BIN_EXE_cachescope"))
        .args([
            "replay",
            "--cache-sim=no",
            "--cachegrind-out-file=out.%p.%%",
            "-",
        ])
        .current_dir(&dir.0)
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(lackey.as_bytes())
        .unwrap();
    let pid = child.id();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    let text = std::fs::read_to_string(dir.join(&format!("out.{pid}.%"))).unwrap();
    assert_eq!(
        text,
        "cmd: -\nevents: Ir\nfl=???\nfn=???\n0 1000\nsummary: 1000\n"
    );
    assert_eq!(
        String::from_utf8(out.stderr).unwrap(),
        format!("=={pid}== \n=={pid}== I refs:        1,000\n")
    );
}

#[test]
fn bad_traces_name_file_and_line() {
    let dir = TempDir::new("badtrace");
    std::fs::write(
        dir.join("bad.lackey"),
        "==1== hi\nI  00401000,4\n L 12zz,8\n",
    )
    .unwrap();
    let o = replay(&["--cachegrind-out-file=x.out", "bad.lackey"], &dir.0);
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(
        stderr_lines(&o).last().unwrap(),
        "cachescope: bad.lackey:3: expected ',' after the address"
    );
    assert!(!dir.join("x.out").exists());

    std::fs::write(dir.join("bad.din"), "2 400000\n7 1000\n").unwrap();
    let o = replay(&["--format=din", "--cache-sim=no", "bad.din"], &dir.0);
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(
        stderr_lines(&o),
        ["cachescope: bad.din:2: unknown label (expected 0 to 4)"]
    );

    // A file with no records at all (here: din read as Lackey) is an
    // empty replay, with a warning.
    let o = replay(
        &["--cache-sim=no", "--cachegrind-out-file=e.out", "bad.din"],
        &dir.0,
    );
    assert!(o.status.success());
    assert_eq!(
        stderr_lines(&o)[0],
        "cachescope: warning: no trace records in 'bad.din' (wrong --format?)"
    );

    let o = replay(&["--cache-sim=no", "missing.trace"], &dir.0);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr_lines(&o)[0].starts_with("cachescope: cannot open trace 'missing.trace': "));

    let o = replay(
        &["--cache-sim=no", "--cachegrind-out-file=x.%z", "t"],
        &dir.0,
    );
    assert_eq!(
        stderr_lines(&o),
        [
            "cachescope: Bad option: --cachegrind-out-file=x.%z",
            "cachescope: Expected 'p' or 'q' or '%' after '%'",
            "cachescope: Use --help for more information or consult the user manual.",
        ]
    );
    // An output directory that does not exist: Cachegrind's message.
    std::fs::write(dir.join("ok.lackey"), "I  00401000,4\n").unwrap();
    let o = replay(
        &[
            "--cache-sim=no",
            "--cachegrind-out-file=no/such/dir/x",
            "ok.lackey",
        ],
        &dir.0,
    );
    assert_eq!(o.status.code(), Some(1));
    let lines = without_pids(&stderr_lines(&o));
    // A relative name is resolved against the starting directory, as
    // Valgrind does, and the message shows the resolved name.
    let resolved = format!(
        "==P== error: can't open output data file '{}/no/such/dir/x'",
        dir.0.display()
    );
    assert_eq!(
        lines,
        [
            resolved.as_str(),
            "==P==        ... so detailed results will be missing."
        ]
    );
}
