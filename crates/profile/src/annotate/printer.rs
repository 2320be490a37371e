//! Column layout of cost centres, as cg_annotate prints them (spec §7.3,
//! "Column formatting", "Widths", "Rendering").

pub use crate::cc::{add_to, sub_from};
use crate::pytext;

/// Event names and which of them are shown and sorted on.
pub struct Events {
    /// All event names, in file order.
    pub names: Vec<String>,
    /// Indices of the shown events, in `--show` order.
    pub show: Vec<usize>,
    /// Indices of the sort events, in `--sort` order.
    pub sort: Vec<usize>,
}

/// Widths of one event column: the count, the first percentage and the
/// second (cumulative) percentage.
#[derive(Clone, Copy, Default)]
struct Width {
    count: usize,
    perc1: usize,
    perc2: usize,
}

/// Formats rows of cost centres with widths fitted to a set of them.
pub struct Printer<'a> {
    events: &'a Events,
    summary: &'a [i64],
    show_percs: bool,
    widths: Vec<Width>,
    /// Printed before the event names: "" or, in the summaries, "  ".
    prefix: &'static str,
    /// The text of a row for a source line without counts.
    missing: String,
}

/// Updates element-wise minima and maxima.
fn update_extremes(cc: &[i64], min: &mut [i64], max: &mut [i64]) {
    for ((c, lo), hi) in cc.iter().zip(min.iter_mut()).zip(max.iter_mut()) {
        if *c > *hi {
            *hi = *c;
        } else if *c < *lo {
            *lo = *c;
        }
    }
}

impl<'a> Printer<'a> {
    /// A printer for plain rows, with widths fitted to `ccs`.
    pub fn for_ccs<'c>(
        events: &'a Events,
        summary: &'a [i64],
        show_percs: bool,
        ccs: impl IntoIterator<Item = &'c [i64]>,
    ) -> Self {
        let n = events.names.len();
        let (mut min, mut max) = (vec![0; n], vec![0; n]);
        for cc in ccs {
            update_extremes(cc, &mut min, &mut max);
        }
        let mut p = Printer {
            events,
            summary,
            show_percs,
            widths: Vec::new(),
            prefix: "",
            missing: String::new(),
        };
        p.init_widths(&min, &max, None);
        p
    }

    /// A printer for the File:function / Function:file sections: widths
    /// fitted to the outer and inner cost centres, and to the running
    /// totals of the outer ones.
    pub fn for_entries<'c>(
        events: &'a Events,
        summary: &'a [i64],
        show_percs: bool,
        entries: impl IntoIterator<Item = (&'c [i64], Vec<&'c [i64]>)>,
    ) -> Self {
        let n = events.names.len();
        let (mut min, mut max) = (vec![0; n], vec![0; n]);
        let (mut min_cumul, mut max_cumul) = (vec![0; n], vec![0; n]);
        let mut cumul = vec![0i64; n];
        for (outer, inners) in entries {
            update_extremes(outer, &mut min, &mut max);
            for inner in inners {
                update_extremes(inner, &mut min, &mut max);
            }
            add_to(&mut cumul, outer);
            update_extremes(&cumul, &mut min_cumul, &mut max_cumul);
        }
        let mut p = Printer {
            events,
            summary,
            show_percs,
            widths: Vec::new(),
            prefix: "  ",
            missing: String::new(),
        };
        p.init_widths(&min, &max, Some((&min_cumul, &max_cumul)));
        p
    }

    fn init_widths(&mut self, min: &[i64], max: &[i64], cumul: Option<(&[i64], &[i64])>) {
        self.widths = (0..self.events.names.len())
            .map(|i| {
                let (c1, p1, q1) = self.strs(min, cumul.map(|c| c.0), i);
                let (c2, p2, q2) = self.strs(max, cumul.map(|c| c.1), i);
                Width {
                    count: c1.len().max(c2.len()),
                    perc1: p1.len().max(p2.len()),
                    perc2: q1.len().max(q2.len()),
                }
            })
            .collect();
        let mut missing = String::new();
        for &i in &self.events.show {
            self.cell(&mut missing, i, ".", "", "");
        }
        self.missing = missing;
    }

    /// The count and percentage texts of `cc1[i]`; with `cc2` (an outer
    /// entry's running total) there are two percentages.
    fn strs(&self, cc1: &[i64], cc2: Option<&[i64]>, i: usize) -> (String, String, String) {
        let count = pytext::commify(cc1[i]);
        if !self.show_percs {
            return (count, String::new(), String::new());
        }
        let total = self.summary[i];
        match cc2 {
            None => {
                let perc1 = if cc1[i] == 0 {
                    String::new()
                } else if total == 0 {
                    " (n/a)".to_string()
                } else {
                    format!(" ({}%)", pytext::percent(cc1[i], total))
                };
                (count, perc1, String::new())
            }
            Some(cc2) => {
                if total == 0 {
                    (count, " (n/a,".into(), " n/a)".into())
                } else {
                    (
                        count,
                        format!(" ({}%,", pytext::percent(cc1[i], total)),
                        format!(" {}%)", pytext::percent(cc2[i], total)),
                    )
                }
            }
        }
    }

    /// One column: padding up to the event name's width, the three parts
    /// right-aligned, and a space.
    fn cell(&self, out: &mut String, i: usize, count: &str, perc1: &str, perc2: &str) {
        let w = self.widths[i];
        let event_w = self.events.names[i].chars().count();
        let pre = event_w.saturating_sub(w.count + w.perc1 + w.perc2);
        for _ in 0..pre {
            out.push(' ');
        }
        pad_left(out, count, w.count);
        pad_left(out, perc1, w.perc1);
        pad_left(out, perc2, w.perc2);
        out.push(' ');
    }

    /// The header line: each shown event name padded with `_`, then
    /// `suffix`.
    pub fn header(&self, out: &mut Vec<u8>, suffix: &str) {
        let mut s = String::from(self.prefix);
        for &i in &self.events.show {
            let name = &self.events.names[i];
            let w = self.widths[i];
            let width = name.chars().count().max(w.count + w.perc1 + w.perc2);
            s.push_str(name);
            for _ in name.chars().count()..width {
                s.push('_');
            }
            s.push(' ');
        }
        s.push_str(suffix);
        s.push('\n');
        out.extend_from_slice(s.as_bytes());
    }

    /// A row: the shown columns of `cc` (with running totals `cc2` for an
    /// outer entry), a space, and `label`.
    pub fn row(&self, out: &mut Vec<u8>, cc: &[i64], cc2: Option<&[i64]>, label: &[u8]) {
        let mut s = String::new();
        for &i in &self.events.show {
            let (count, perc1, perc2) = self.strs(cc, cc2, i);
            self.cell(&mut s, i, &count, &perc1, &perc2);
        }
        s.push(' ');
        out.extend_from_slice(s.as_bytes());
        out.extend_from_slice(label);
        out.push(b'\n');
    }

    /// A row for a source line without counts.
    pub fn missing_row(&self, out: &mut Vec<u8>, label: &[u8]) {
        out.extend_from_slice(self.missing.as_bytes());
        out.push(b' ');
        out.extend_from_slice(label);
        out.push(b'\n');
    }
}

/// Right-aligns `s` in `width` characters.
fn pad_left(out: &mut String, s: &str, width: usize) {
    for _ in s.len()..width {
        out.push(' ');
    }
    out.push_str(s);
}

/// The `"-" * 80` / `-- text` / `"-" * 80` section title.
pub fn fancy(out: &mut Vec<u8>, text: &[u8]) {
    let rule = [b'-'; 80];
    out.extend_from_slice(&rule);
    out.extend_from_slice(b"\n-- ");
    out.extend_from_slice(text);
    out.push(b'\n');
    out.extend_from_slice(&rule);
    out.push(b'\n');
}
