//! End-to-end: real system programs run under cachescope with the same
//! output and exit status as natively, and leave a profile that
//! `cg_annotate` reads.

mod run_support;

use std::ffi::OsStr;
use std::io::Write;
use std::path::Path;

use run_support::*;

/// Runs `prog args` natively and under cachescope in a scratch directory;
/// they must agree. Returns the profile.
fn same_as_native(
    label: &str,
    prog: &str,
    args: &[&str],
    stdin: Option<&Path>,
    dir: &TempDir,
) -> CgOut {
    let nat = native(&dir.0, OsStr::new(prog), args, stdin);
    let out = format!("--cachegrind-out-file={}/cs.out", dir.0.display());
    let cs = under_cachescope(&dir.0, &["-q", &out], OsStr::new(prog), args, stdin);
    assert_eq!(
        cs.end,
        nat.end,
        "{label}: exit differs; stderr: {}",
        cs.stderr_text()
    );
    assert!(
        cs.stdout == nat.stdout,
        "{label}: stdout differs ({} bytes vs {} natively)",
        cs.stdout.len(),
        nat.stdout.len()
    );
    assert_eq!(
        cs.stderr_text(),
        nat.stderr_text(),
        "{label}: stderr differs"
    );
    let o = CgOut::read(&dir.join("cs.out"));
    assert_eq!(o.total(), o.summary);
    assert!(o.summary > 100_000, "{label}: implausibly few instructions");
    o
}

#[test]
fn ls_la_usr_bin() {
    let dir = TempDir::new("ls");
    let o = same_as_native("ls", "/usr/bin/ls", &["-la", "/usr/bin"], None, &dir);
    assert_eq!(o.cmd, "/usr/bin/ls -la /usr/bin");
    annotate_ok(&dir.join("cs.out"));
}

/// A few megabytes of compressible but varied text, the same every run.
fn sample_text(path: &Path, bytes: usize) {
    let mut f = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    let words = [
        "cache", "line", "miss", "branch", "profile", "engine", "count", "block",
    ];
    let (mut x, mut written) = (0x2545_f491_4f6c_dd1du64, 0);
    while written < bytes {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let w = words[(x % words.len() as u64) as usize];
        let line = format!("{w} {} {}\n", x % 1000, (x >> 20) % 97);
        f.write_all(line.as_bytes()).unwrap();
        written += line.len();
    }
}

#[test]
fn bzip2_of_a_few_megabytes() {
    run_support::require("/usr/bin/bzip2");
    let dir = TempDir::new("bzip2");
    let input = dir.join("input.txt");
    sample_text(&input, 3 << 20);
    let arg = input.to_str().unwrap();
    same_as_native("bzip2", "/usr/bin/bzip2", &["-c", arg], None, &dir);
}

#[test]
fn python3_sum() {
    run_support::require("/usr/bin/python3");
    let dir = TempDir::new("python3");
    let code = "print(sum(range(10**6)))";
    same_as_native("python3", "/usr/bin/python3", &["-c", code], None, &dir);
}

#[test]
fn sqlite3_inserts_and_query() {
    run_support::require("/usr/bin/sqlite3");
    let dir = TempDir::new("sqlite3");
    let script = dir.join("script.sql");
    let mut sql =
        String::from("CREATE TABLE t(id INTEGER PRIMARY KEY, name TEXT, v REAL);\nBEGIN;\n");
    for i in 0..3000 {
        sql.push_str(&format!(
            "INSERT INTO t(name, v) VALUES ('n{}', {}.5);\n",
            i % 37,
            i * 7 % 101
        ));
    }
    sql.push_str(
        "COMMIT;\nSELECT name, count(*), sum(v) FROM t GROUP BY name ORDER BY 3 DESC LIMIT 5;\n",
    );
    std::fs::write(&script, sql).unwrap();
    same_as_native(
        "sqlite3",
        "/usr/bin/sqlite3",
        &[":memory:"],
        Some(&script),
        &dir,
    );
}

#[test]
fn gcc_version() {
    run_support::require("/usr/bin/gcc");
    let dir = TempDir::new("gcc");
    same_as_native("gcc", "/usr/bin/gcc", &["--version"], None, &dir);
}

#[test]
fn perl_regex_loop() {
    run_support::require("/usr/bin/perl");
    let dir = TempDir::new("perl");
    let code = r#"my $n = 0; for my $i (1..20000) { $n++ if "item$i" =~ /^item(\d*7\d*)$/ } print "$n\n";"#;
    same_as_native("perl", "/usr/bin/perl", &["-e", code], None, &dir);
}
