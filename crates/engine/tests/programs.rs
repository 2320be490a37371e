//! Real programs of the system run under the engine with output identical
//! to native (the issue's acceptance list).

mod common;
use common::*;
use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

fn run_both(exe: &str, args: &[&str], stdin: Option<&[u8]>) -> (Vec<u8>, Vec<u8>, String) {
    let go = |cmd: &mut Command| {
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn");
        let mut input = child.stdin.take().unwrap();
        let data = stdin.unwrap_or(b"").to_vec();
        let writer = std::thread::spawn(move || {
            let _ = input.write_all(&data);
        });
        let out = child.wait_with_output().expect("wait");
        writer.join().unwrap();
        assert!(
            out.status.success(),
            "{exe} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        (
            out.stdout,
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (nat, _) = go(Command::new(exe).args(args));
    let (eng, err) = go(Command::new(count_bin()).arg(exe).args(args));
    (nat, eng, err)
}

fn check(exe: &str, args: &[&str], stdin: Option<&[u8]>) {
    if !Path::new(exe).exists() {
        panic!("{exe} is not installed (scripts/setup installs the test programs)");
    }
    let (nat, eng, err) = run_both(exe, args, stdin);
    assert!(
        nat == eng,
        "{exe} {args:?}: output differs under the engine\n{err}"
    );
    assert!(err.contains("count: pid"), "{err}");
}

#[test]
fn ls_la() {
    check("/usr/bin/ls", &["-la", "/usr/bin"], None);
}

#[test]
fn bzip2_of_a_megabyte() {
    let mut data = Vec::with_capacity(1 << 20);
    let mut x: u32 = 12345;
    while data.len() < 1 << 20 {
        x = x.wrapping_mul(1_103_515_245).wrapping_add(12345);
        data.extend_from_slice(format!("{} ", x >> 20).as_bytes());
    }
    check("/usr/bin/bzip2", &["-c"], Some(&data));
}

#[test]
fn python3_sum() {
    check(
        "/usr/bin/python3",
        &["-c", "print(sum(range(10**6)))"],
        None,
    );
}

#[test]
fn sqlite3_inserts_and_query() {
    let mut sql = String::from("create table t(a integer, b text);\nbegin;\n");
    for i in 0..3000 {
        sql.push_str(&format!("insert into t values({i}, 'row{i}');\n"));
    }
    sql.push_str("commit;\nselect count(*), sum(a), max(b) from t where a % 3 = 0;\n");
    check("/usr/bin/sqlite3", &[":memory:"], Some(sql.as_bytes()));
}

#[test]
fn gcc_version() {
    check("/usr/bin/gcc", &["--version"], None);
}

#[test]
fn perl_regex_loop() {
    check(
        "/usr/bin/perl",
        &[
            "-e",
            r#"my $n=0; for my $i (1..20000) { $n++ if "abc$i" =~ /c(\d+)7$/ } print "$n\n""#,
        ],
        None,
    );
}
