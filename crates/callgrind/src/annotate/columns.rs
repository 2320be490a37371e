//! The count columns: widths, event headers and counts with percentages,
//! as callgrind_annotate prints them.

use super::cc::{self, Cc};
use profile::pytext::commify;

/// The events shown and sorted on, as indexes into the file's events.
pub(crate) struct Columns {
    /// All event names, in file order.
    pub names: Vec<String>,
    /// `--show`, in order.
    pub show: Vec<usize>,
    /// `--sort`, in order.
    pub sort: Vec<usize>,
    /// `--show-percs`.
    pub percs: bool,
}

/// A count with commas; counts past `i64` (never seen) without.
pub(crate) fn commas(v: u64) -> String {
    i64::try_from(v).map_or_else(|_| v.to_string(), commify)
}

impl Columns {
    /// The width of each event's column: at least the event's name, and
    /// enough for every defined count (with commas and a percentage).
    pub(crate) fn widths<'a>(&self, ccs: impl IntoIterator<Item = &'a Cc>) -> Vec<usize> {
        let mut widths: Vec<usize> = self.names.iter().map(String::len).collect();
        for c in ccs {
            for (i, v) in c.iter().enumerate() {
                if let (Some(v), Some(w)) = (v, widths.get_mut(i)) {
                    let digits = v.to_string().len();
                    let width = digits + (digits - 1) / 3 + if self.percs { 9 } else { 0 };
                    *w = (*w).max(width);
                }
            }
        }
        widths
    }

    /// The event names, each padded to its column, each followed by a
    /// space.
    pub(crate) fn header(&self, out: &mut String, widths: &[usize]) {
        for &i in &self.show {
            let name = &self.names[i];
            out.push_str(name);
            out.push_str(&" ".repeat(widths[i].saturating_sub(name.len())));
            out.push(' ');
        }
    }

    /// The shown counts of `c`, right-aligned, each followed by a space;
    /// percentages are of `total`.
    pub(crate) fn counts(&self, out: &mut String, c: &Cc, widths: &[usize], total: &Cc) {
        for &i in &self.show {
            let value = cc::get(c, i);
            let mut text = value.map_or_else(|| ".".to_string(), commas);
            if self.percs {
                match value {
                    Some(v) if v != 0 => {
                        let t = cc::get(total, i).unwrap_or(0);
                        let perc = if t == 0 {
                            0.0
                        } else {
                            (u128::from(v) * 100) as f64 / t as f64
                        };
                        if -9.995 < perc && perc < 99.995 {
                            text.push_str(&format!(" ({perc:5.2}%)"));
                        } else {
                            text.push_str(&format!(" ({perc:5.1}%)"));
                        }
                    }
                    _ => text.push_str("         "),
                }
            }
            out.push_str(&" ".repeat(widths[i].saturating_sub(text.len())));
            out.push_str(&text);
            out.push(' ');
        }
    }

    /// Descending by the sort events in turn; an undefined count is below
    /// every defined one.
    pub(crate) fn compare(&self, a: Option<&Cc>, b: Option<&Cc>) -> std::cmp::Ordering {
        let key = |c: Option<&Cc>, i: usize| -> i128 {
            c.and_then(|c| cc::get(c, i)).map_or(-1, i128::from)
        };
        for &i in &self.sort {
            let ord = key(b, i).cmp(&key(a, i));
            if ord.is_ne() {
                return ord;
            }
        }
        std::cmp::Ordering::Equal
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns() {
        let cols = Columns {
            names: vec!["Ir".into(), "Dr".into()],
            show: vec![1, 0],
            sort: vec![0],
            percs: true,
        };
        let total = vec![Some(2000), Some(10)];
        let w = cols.widths([&total, &vec![Some(1234567)]]);
        assert_eq!(w, vec![18, 11]);
        let mut out = String::new();
        cols.counts(&mut out, &vec![Some(1000), None], &w, &total);
        assert_eq!(out, " .              1,000 (50.00%) ");
        out.clear();
        cols.counts(&mut out, &vec![Some(2000), Some(0)], &w, &total);
        assert_eq!(out, " 0              2,000 (100.0%) ");
        assert!(cols
            .compare(Some(&vec![Some(1)]), Some(&vec![None]))
            .is_lt());
    }
}
