//! The File:function and Function:file sections (spec §7.3, "Entry
//! selection in sections 3 and 4").

use std::cmp::Ordering;

use super::aggregate::{Agg, CcId};
use super::printer::{add_to, fancy, Events, Printer};
use super::Output;
use crate::tool::Interner;

/// Which of the two sections.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Files, each with its functions.
    FileFunction,
    /// Functions, each with their files.
    FunctionFile,
}

/// True if `n >= t` for a non-negative integer and a float, compared
/// exactly as Python compares `int >= float`.
fn at_least(n: u64, t: f64) -> bool {
    if t.is_nan() {
        return false;
    }
    if t <= 0.0 {
        return true;
    }
    let c = t.ceil();
    // 2^64 as f64; every integer-valued float below it converts exactly.
    c < 18_446_744_073_709_551_616.0 && n >= c as u64
}

/// Sort key order: descending on (|counts| in sort order, name).
fn cmp_desc(events: &Events, a: (&[i64], &[u8]), b: (&[i64], &[u8])) -> Ordering {
    for &i in &events.sort {
        match b.0[i].unsigned_abs().cmp(&a.0[i].unsigned_abs()) {
            Ordering::Equal => {}
            o => return o,
        }
    }
    b.1.cmp(a.1)
}

/// A kept outer entry: name, total, and the kept inner entries, sorted.
struct Entry<'a> {
    name: &'a [u8],
    outer: &'a [i64],
    inner: Vec<(&'a [u8], &'a [i64])>,
}

/// Prints one section and returns the outer names it shows.
pub fn print_section(
    out: &mut Output<'_>,
    kind: Kind,
    events: &Events,
    agg: &Agg,
    threshold_pct: f64,
    show_percs: bool,
) -> std::io::Result<Vec<Vec<u8>>> {
    let (outer_names, inner_names, dcc_ids): (&Interner, &Interner, &[Option<u32>]) = match kind {
        Kind::FileFunction => (&agg.files, &agg.funcs, &agg.file_dcc),
        Kind::FunctionFile => (&agg.funcs, &agg.files, &agg.func_dcc),
    };
    let ti = events.sort[0];
    let threshold = threshold_pct * (agg.summary[ti].unsigned_abs() as f64) / 100.0;
    let meets = |cc: &[i64]| at_least(cc[ti].unsigned_abs(), threshold);

    let mut entries: Vec<Entry<'_>> = Vec::new();
    for (name_id, dcc) in dcc_ids.iter().enumerate() {
        let Some(dcc) = dcc else { continue };
        let dcc = &agg.dccs[*dcc as usize];
        let mut inner: Vec<(&[u8], &[i64])> = dcc
            .inner
            .iter()
            .map(|&(n, cc): &(u32, CcId)| (inner_names.name(n), agg.cc(cc)))
            .filter(|(_, cc)| meets(cc))
            .collect();
        if inner.is_empty() {
            continue;
        }
        inner.sort_by(|a, b| cmp_desc(events, (a.1, a.0), (b.1, b.0)));
        entries.push(Entry {
            name: outer_names.name(name_id as u32),
            outer: agg.cc(dcc.outer),
            inner,
        });
    }
    entries.sort_by(|a, b| cmp_desc(events, (a.outer, a.name), (b.outer, b.name)));

    let printer = Printer::for_entries(
        events,
        &agg.summary,
        show_percs,
        entries
            .iter()
            .map(|e| (e.outer, e.inner.iter().map(|(_, cc)| *cc).collect())),
    );
    let (title, suffix, marker): (&[u8], &str, &[u8]) = match kind {
        Kind::FileFunction => (b"File:function summary", " file:function", b"< "),
        Kind::FunctionFile => (b"Function:file summary", " function:file", b"> "),
    };
    fancy(out.buf(), title);
    printer.header(out.buf(), suffix);
    out.buf().push(b'\n');

    let mut shown = Vec::with_capacity(entries.len());
    let mut cumul = vec![0i64; agg.n];
    for e in &entries {
        add_to(&mut cumul, e.outer);
        out.buf().extend_from_slice(marker);
        if e.inner.len() == 1 && e.inner[0].1 == e.outer {
            let mut label = e.name.to_vec();
            label.push(b':');
            label.extend_from_slice(e.inner[0].0);
            printer.row(out.buf(), e.outer, Some(&cumul), &label);
        } else {
            let mut label = e.name.to_vec();
            label.push(b':');
            printer.row(out.buf(), e.outer, Some(&cumul), &label);
            for (name, cc) in &e.inner {
                out.buf().extend_from_slice(b"  ");
                let mut label = b"  ".to_vec();
                label.extend_from_slice(name);
                printer.row(out.buf(), cc, None, &label);
            }
        }
        out.buf().push(b'\n');
        out.maybe_flush()?;
        shown.push(e.name.to_vec());
    }
    Ok(shown)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn int_float_comparison_is_exact() {
        assert!(at_least(0, 0.0));
        assert!(at_least(0, -0.0));
        assert!(at_least(5, 4.5));
        assert!(!at_least(4, 4.5));
        assert!(at_least(100, 100.0));
        // 2^53 + 1 vs the float 2^53: Python says greater.
        assert!(at_least((1 << 53) + 1, 9007199254740992.0));
        assert!(!at_least(u64::MAX, 1e20));
    }
}
