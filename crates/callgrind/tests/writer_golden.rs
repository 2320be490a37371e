//! The writer's output for a small profile built as a tool builds it
//! (tests/golden/writer-small.out), and the reader's errors on broken
//! input: one line with the line number, never a panic.

use std::path::Path;

use callgrind::builder::{FunctionKey, PartBuilder, Site};
use callgrind::{parse, Event, Part, Position, Positions, Profile, WriteOptions};

fn small_profile() -> Profile {
    let mut p = Profile {
        version: Some("1".into()),
        creator: Some("cachescope-test".into()),
        pid: Some("42".into()),
        cmd: Some("./prog arg".into()),
        ..Profile::default()
    };
    let obj = p.names.objects.intern("/bin/prog");
    let libc = p.names.objects.intern("/lib/libc.so.6");
    let main_c = p.names.files.intern("main.c");
    let inline_h = p.names.files.intern("inline.h");
    let unknown = p.names.files.intern("???");
    let main = p.names.functions.intern("main");
    let work = p.names.functions.intern("work");
    let puts = p.names.functions.intern("puts");
    let main_key = FunctionKey {
        object: Some(obj),
        file: main_c,
        function: main,
    };
    let work_key = FunctionKey {
        object: Some(obj),
        file: main_c,
        function: work,
    };
    let puts_key = FunctionKey {
        object: Some(libc),
        file: unknown,
        function: puts,
    };
    let at = |line| Position { addr: 0, line };
    let site = |file, line| Site {
        file,
        position: at(line),
    };
    let mut b = PartBuilder::new(3);
    b.add_cost(main_key, site(main_c, 10), &[3, 1, 0]);
    b.add_cost(main_key, site(main_c, 11), &[2, 0, 1]);
    b.add_call(main_key, site(main_c, 11), work_key, at(3), 2, &[40, 10, 2]);
    b.add_cost(main_key, site(inline_h, 5), &[4, 0, 0]);
    b.add_cost(main_key, site(main_c, 250), &[1, 0, 0]);
    b.add_call(
        main_key,
        site(main_c, 250),
        puts_key,
        at(0),
        1,
        &[100, 20, 5],
    );
    b.add_cost(work_key, site(main_c, 3), &[20, 5, 1]);
    b.add_cost(work_key, site(main_c, 4), &[20, 5, 1]);
    // Repeated keys add up.
    b.add_cost(main_key, site(main_c, 10), &[3, 1, 0]);
    b.add_cost(puts_key, site(unknown, 0), &[100, 20, 5]);
    p.parts.push(Part {
        number: Some(1),
        desc: vec!["I1 cache: ".into(), "Timerange: Basic block 0 - 9".into()],
        positions: Positions::default(),
        events: ["Ir", "Dr", "Dw"]
            .iter()
            .map(|n| Event {
                name: n.to_string(),
                long_name: None,
            })
            .collect(),
        summary: Some(vec![193, 47, 15]),
        totals: Some(vec![193, 47, 15]),
        blocks: b.finish(),
        ..Part::default()
    });
    p
}

#[test]
fn small_profile_golden() {
    let golden = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/writer-small.out");
    let p = small_profile();
    let written = p.to_bytes(WriteOptions::default());
    if std::env::var_os("CALLGRIND_BLESS").is_some() {
        std::fs::write(&golden, &written).unwrap();
    }
    let want = std::fs::read(&golden).unwrap();
    assert_eq!(
        String::from_utf8_lossy(&written),
        String::from_utf8_lossy(&want)
    );
    // Read back, it is the same profile (its names in order of first use
    // in the file rather than of creation, so compared as text).
    let reread = parse(&written).unwrap();
    assert_eq!(
        String::from_utf8_lossy(&reread.to_bytes(WriteOptions::default())),
        String::from_utf8_lossy(&written)
    );
    let plain = WriteOptions {
        compress_strings: false,
        compress_pos: false,
    };
    assert_eq!(reread.to_bytes(plain), p.to_bytes(plain));
}

#[test]
fn broken_input_is_one_line_error() {
    let good = small_profile().to_bytes(WriteOptions::default());
    // Every truncation parses or fails cleanly.
    for len in 0..good.len() {
        if let Err(e) = parse(&good[..len]) {
            let text = e.to_string();
            assert!(text.starts_with("line ") && !text.contains('\n'), "{text}");
        }
    }
    // Every single-byte corruption too.
    for i in (0..good.len()).step_by(3) {
        for b in [b'(', b'x', b'+', b'\n', b'=', b'9'] {
            let mut bad = good.clone();
            bad[i] = b;
            if let Err(e) = parse(&bad) {
                assert!(!e.to_string().contains('\n'));
            }
        }
    }
    let cases: [(&str, usize, &str); 6] = [
        (
            "events: Ir\nfl=a\nfn=b\n1 2 3\n",
            4,
            "more costs than the 1 events",
        ),
        ("events: Ir\nfn=b\n", 2, "fn= before any fl="),
        (
            "events: Ir\nfl=(1)\n",
            2,
            "name (1) used before it was defined",
        ),
        (
            "events: Ir\nfl=a\nfn=b\ncfn=c\ncalls=1 5\n",
            6,
            "a calls= line must be followed",
        ),
        ("version: 2\n", 1, "cannot read format version 2"),
        ("events: Ir\nfl=a\nfn=b\n-5 1\n", 4, "bad position `-5`"),
    ];
    for (text, line, message) in cases {
        let e = parse(text.as_bytes()).unwrap_err();
        assert_eq!(e.line, line, "{text:?}: {e}");
        assert!(e.message.starts_with(message), "{text:?}: {e}");
    }
}
