//! cg_annotate, cg_merge and cg_diff on arbitrary pairs of files: an
//! output or an error, never a panic.
#![no_main]

use std::ffi::OsString;

use libfuzzer_sys::fuzz_target;
use profile::annotate::{annotate, AnnotateOptions};
use profile::subst::Subst;

fuzz_target!(|data: &[u8]| {
    // Two files, split at the first NUL byte.
    let cut = data.iter().position(|&b| b == 0).unwrap_or(data.len());
    let (a, b) = (&data[..cut], data.get(cut + 1..).unwrap_or(&[]));
    let dir = std::env::temp_dir().join(format!("cachescope-fuzz-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (fa, fb) = (dir.join("a.cgout"), dir.join("b.cgout"));
    std::fs::write(&fa, a).unwrap();
    std::fs::write(&fb, b).unwrap();
    let (fa, fb): (OsString, OsString) = (fa.into(), fb.into());
    let subst = Subst::parse(r"s/(\w)\w*/\1/g").unwrap();
    let mut sink = Vec::new();
    for (files, diff, threshold) in [
        (vec![fa.clone()], false, 0.1),
        (vec![fa.clone(), fb.clone()], false, 0.0),
        (vec![fa.clone(), fb.clone()], true, 20.0),
    ] {
        let opts = AnnotateOptions {
            files,
            diff,
            threshold,
            context: 2,
            mod_filename: Some(subst.clone()),
            ..AnnotateOptions::default()
        };
        sink.clear();
        let _ = annotate(&opts, &mut sink);
    }
    sink.clear();
    let _ = profile::merge::merge(&[fa.clone(), fb.clone()], &mut sink);
    sink.clear();
    let _ = profile::diff::diff(&fa, &fb, None, Some(&subst), &mut sink);
});
