//! Valgrind's Callgrind files (tests/data, made by
//! fixtures/callgrind/regen.sh) read into the model and written out again:
//! the writer reproduces each file byte for byte, and reading the output
//! gives the same model.

use std::path::{Path, PathBuf};

use callgrind::{parse, Profile, WriteOptions};

fn data_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data")
}

/// Every Callgrind file in tests/data.
fn data_files() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(data_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.file_name().unwrap().to_string_lossy().contains(".out"))
        .collect();
    files.sort();
    assert!(files.len() >= 10, "test data missing: {files:?}");
    files
}

/// The options a file was written with, from how it looks.
fn options_of(text: &[u8]) -> WriteOptions {
    let has = |needle: &[u8]| text.windows(needle.len()).any(|w| w == needle);
    WriteOptions {
        compress_strings: text
            .windows(5)
            .any(|w| w.starts_with(b"fn=(") && w[4].is_ascii_digit()),
        compress_pos: has(b"\n+") || has(b"\n-") || has(b"\n* "),
    }
}

fn assert_same_text(what: &str, got: &[u8], want: &[u8]) {
    if got == want {
        return;
    }
    let (g, w) = (String::from_utf8_lossy(got), String::from_utf8_lossy(want));
    let (gl, wl): (Vec<&str>, Vec<&str>) = (g.lines().collect(), w.lines().collect());
    let at = gl
        .iter()
        .zip(&wl)
        .position(|(a, b)| a != b)
        .unwrap_or(gl.len().min(wl.len()));
    let from = at.saturating_sub(5);
    panic!(
        "{what}: differs at line {}\n got: {:?}\nwant: {:?}",
        at + 1,
        &gl[from..(at + 3).min(gl.len())],
        &wl[from..(at + 3).min(wl.len())]
    );
}

#[test]
fn valgrind_files_round_trip_byte_for_byte() {
    for path in data_files() {
        let original = std::fs::read(&path).unwrap();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let profile = parse(&original).unwrap_or_else(|e| panic!("{name}: {e}"));
        let written = profile.to_bytes(options_of(&original));
        assert_same_text(&name, &written, &original);
        let again = parse(&written).unwrap_or_else(|e| panic!("{name} rewritten: {e}"));
        assert!(again == profile, "{name}: model differs after a round trip");
    }
}

#[test]
fn compression_is_only_a_matter_of_form() {
    // The same profile written with and without each compression reads
    // back to the same costs, calls and names.
    let original = std::fs::read(data_dir().join("callbacks.instr-jumps.out")).unwrap();
    let profile = parse(&original).unwrap();
    let plain = profile.to_bytes(WriteOptions {
        compress_strings: false,
        compress_pos: false,
    });
    assert!(!plain.windows(6).any(|w| w == b"fn=(1)"));
    let reread = parse(&plain).unwrap();
    let plain_options = WriteOptions {
        compress_strings: false,
        compress_pos: false,
    };
    assert_same_text("uncompressed", &reread.to_bytes(plain_options), &plain);
    // Compressed again (the names get fresh ids), it reads back to a
    // profile that writes the same text, compressed or not.
    let compressed = reread.to_bytes(WriteOptions::default());
    assert!(compressed.windows(6).any(|w| w == b"fn=(1)"));
    let again = parse(&compressed).unwrap();
    assert_same_text(
        "recompressed",
        &again.to_bytes(WriteOptions::default()),
        &compressed,
    );
    assert_same_text(
        "recompressed, plain",
        &again.to_bytes(plain_options),
        &plain,
    );
}

#[test]
fn plain_file_matches_compressed_run() {
    // fib.out and fib.plain.out are two runs of the same program, one with
    // both compressions off: the same profile apart from the names' ids
    // and the Timerange/summary details of each run.
    let a = parse(&std::fs::read(data_dir().join("fib.out")).unwrap()).unwrap();
    let b = parse(&std::fs::read(data_dir().join("fib.plain.out")).unwrap()).unwrap();
    let flat = |p: &Profile| -> Vec<String> {
        let part = &p.parts[0];
        part.blocks
            .iter()
            .map(|b| {
                format!(
                    "{}:{} {:?}",
                    p.names.files.text(b.file),
                    p.names.functions.text(b.function),
                    b.items.len()
                )
            })
            .collect()
    };
    let (fa, fb) = (flat(&a), flat(&b));
    assert_eq!(fa.len(), fb.len());
    let common = fa.iter().filter(|x| fb.contains(x)).count();
    assert!(
        common * 10 >= fa.len() * 9,
        "only {common} of {} blocks alike",
        fa.len()
    );
}
