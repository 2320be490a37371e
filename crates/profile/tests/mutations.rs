//! Property test: the reader and the three tools never panic, whatever the
//! input. Real profiles (Valgrind's test inputs and profiles of a real
//! program written by Valgrind 3.19) are mutated at random, with a fixed
//! seed, and fed to every entry point; each must return a value or an
//! error. The fuzz target (`fuzz/`) explores the same space for longer.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use profile::annotate::{annotate, AnnotateOptions};
use profile::reader::CgoutReader;
use profile::subst::Subst;
use profile::Profile;

/// xorshift64*: deterministic, no dependencies.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// Fragments that make interesting syntax when spliced in.
const TOKENS: &[&[u8]] = &[
    b"fl=",
    b"fn=",
    b"fi=",
    b"fe=",
    b"summary:",
    b"summary: 1 2 3\n",
    b"desc: x\n",
    b"cmd:",
    b"events:",
    b"events: \n",
    b"totals: 1\n",
    b"\n",
    b"\r",
    b"\r\n",
    b" ",
    b"\t",
    b"#",
    b".",
    b"-",
    b"+",
    b"_",
    b"0",
    b"9223372036854775807",
    b"-9223372036854775808",
    b"99999999999999999999999",
    b"\xff",
    b"\xc2\xa0",
    b"\xe2\x80\xa8",
    b"???",
    b"<unspecified>",
];

fn seeds() -> Vec<Vec<u8>> {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut dirs = vec![
        here.join("../cachescope/tests/golden/real"),
        here.join("../../../shared/testdata/cg_annotate"),
    ];
    dirs.retain(|d| d.is_dir());
    let mut out = Vec::new();
    for dir in dirs {
        let mut names: Vec<PathBuf> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "cgout"))
            .collect();
        names.sort();
        for p in names {
            let data = std::fs::read(&p).unwrap();
            // Keep the inputs small so that many mutations run quickly.
            out.push(data[..data.len().min(6000)].to_vec());
        }
    }
    assert!(out.len() >= 5, "seed profiles not found");
    out
}

fn mutate(rng: &mut Rng, data: &mut Vec<u8>) {
    for _ in 0..1 + rng.below(4) {
        let pos = rng.below(data.len() + 1);
        match rng.below(7) {
            0 if !data.is_empty() => {
                let i = pos.min(data.len() - 1);
                data[i] ^= 1 << rng.below(8);
            }
            1 => data.insert(pos, rng.next() as u8),
            2 => {
                let end = (pos + rng.below(40)).min(data.len());
                data.drain(pos..end);
            }
            3 | 4 => {
                let t = TOKENS[rng.below(TOKENS.len())];
                data.splice(pos..pos, t.iter().copied());
            }
            5 => {
                // Duplicate a line somewhere else.
                let start = data[..pos]
                    .iter()
                    .rposition(|&b| b == b'\n')
                    .map_or(0, |i| i + 1);
                let end = data[pos..]
                    .iter()
                    .position(|&b| b == b'\n')
                    .map_or(data.len(), |i| pos + i + 1);
                let line = data[start..end].to_vec();
                let at = rng.below(data.len() + 1);
                data.splice(at..at, line);
            }
            _ => data.truncate(pos),
        }
    }
}

/// Runs every entry point on `a` (and `b` as a second file).
fn exercise(dir: &Path, a: &[u8], b: &[u8]) {
    if let Ok((mut r, _)) = CgoutReader::new(a) {
        while let Ok(Some(_)) = r.next_record() {}
    }
    let _ = Profile::read_from(a);

    let (fa, fb) = (dir.join("a.cgout"), dir.join("b.cgout"));
    std::fs::write(&fa, a).unwrap();
    std::fs::write(&fb, b).unwrap();
    let (fa, fb): (OsString, OsString) = (fa.into(), fb.into());
    let subst = Subst::parse("s/[a-z]+/X/g").unwrap();
    let mut sink = Vec::new();
    for (files, diff, annotate_on, threshold) in [
        (vec![fa.clone()], false, true, 0.1),
        (vec![fa.clone(), fb.clone()], false, false, 0.0),
        (vec![fa.clone(), fb.clone()], true, true, 20.0),
    ] {
        let opts = AnnotateOptions {
            files,
            diff,
            annotate: annotate_on,
            threshold,
            context: 1,
            mod_funcname: Some(subst.clone()),
            ..AnnotateOptions::default()
        };
        sink.clear();
        let _ = annotate(&opts, &mut sink);
    }
    sink.clear();
    let _ = profile::merge::merge(&[fa.clone(), fb.clone()], &mut sink);
    sink.clear();
    let _ = profile::diff::diff(&fa, &fb, Some(&subst), None, &mut sink);
}

#[test]
fn mutated_profiles_never_panic() {
    let seeds = seeds();
    let dir = std::env::temp_dir().join(format!("profile-mutations-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut rng = Rng(0x1234_5678_9abc_def1);
    for round in 0..1500 {
        let mut a = seeds[rng.below(seeds.len())].clone();
        let b = seeds[rng.below(seeds.len())].clone();
        mutate(&mut rng, &mut a);
        // Keep the unmutated input as the second file half of the time, so
        // that most diffs and merges get past the second file.
        let b = if round % 2 == 0 {
            b
        } else {
            let mut m = b;
            mutate(&mut rng, &mut m);
            m
        };
        exercise(&dir, &a, &b);
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
