//! `callgrind_annotate`: the report Valgrind 3.19's Perl script prints for
//! a Callgrind profile, byte for byte.
//!
//! Sections: the options (data file, descriptions, target, events,
//! thresholds), the program totals, the functions sorted by the sort
//! events down to the threshold (with their callers and callees for
//! `--tree`), then the annotated source files and the events annotated.
//!
//! Where the script's order comes from a Perl hash (the annotated files,
//! callers or callees with equal costs, several user files), it is not
//! even the same from one run of the script to the next; here it is by
//! name.

mod cc;
mod collect;
mod columns;
mod source;

pub mod cli;

use std::collections::HashSet;
use std::fmt;
use std::path::Path;

use crate::model::Profile;
use cc::Cc;
use collect::{CollectOptions, Tables};
use columns::Columns;

/// The options of `callgrind_annotate`.
#[derive(Debug, Clone, PartialEq)]
pub struct AnnotateOptions {
    /// The profile, as named on the command line.
    pub input: String,
    /// Source files named on the command line (annotated as "User").
    pub user_files: Vec<String>,
    /// `--show` (empty: all events).
    pub show: Vec<String>,
    /// `--sort` (empty: the file's order).
    pub sort: Vec<String>,
    /// Thresholds per sort event from `--sort=EV:N` (empty when none was
    /// given), as written.
    pub sort_thresholds: Vec<String>,
    /// `--threshold`, as written (default `99`).
    pub threshold: String,
    /// `--show-percs`.
    pub show_percs: bool,
    /// `--auto`.
    pub auto: bool,
    /// `--context`, as written.
    pub context: String,
    /// `--inclusive`.
    pub inclusive: bool,
    /// `--tree=caller` or `both`.
    pub tree_caller: bool,
    /// `--tree=calling` or `both`.
    pub tree_calling: bool,
    /// `-I=`/`--include=` directories, each with one trailing `/`.
    pub include_dirs: Vec<String>,
}

impl Default for AnnotateOptions {
    fn default() -> Self {
        AnnotateOptions {
            input: String::new(),
            user_files: Vec::new(),
            show: Vec::new(),
            sort: Vec::new(),
            sort_thresholds: Vec::new(),
            threshold: "99".to_string(),
            show_percs: true,
            auto: true,
            context: "8".to_string(),
            inclusive: false,
            tree_caller: false,
            tree_calling: false,
            include_dirs: Vec::new(),
        }
    }
}

/// Why the report could not be made (one line, as the script dies).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AnnotateError(pub String);

impl fmt::Display for AnnotateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for AnnotateError {}

/// A number as Perl reads it from the start of a string (`"5%"` is 5);
/// the options' values are checked to be digits and dots before.
pub(crate) fn perl_number(s: &str) -> f64 {
    let end = s
        .char_indices()
        .scan(false, |dot, (i, c)| match c {
            '0'..='9' => Some(i + 1),
            '.' if !*dot => {
                *dot = true;
                Some(i + 1)
            }
            _ => None,
        })
        .last()
        .unwrap_or(0);
    s[..end].trim_end_matches('.').parse().unwrap_or(0.0)
}

/// Perl's default number formatting (`%.15g`) for the line markers of a
/// fractional `--context`.
pub(crate) fn perl_format(x: f64) -> String {
    if x.fract() == 0.0 && x.abs() < 1e15 {
        return format!("{}", x as i64);
    }
    let s = format!("{:.*e}", 14, x);
    let (mantissa, exp) = s.split_once('e').unwrap_or((&s, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    if (-5..15).contains(&exp) {
        let decimals = (14 - exp).max(0) as usize;
        let fixed = format!("{x:.decimals$}");
        let fixed = fixed.trim_end_matches('0').trim_end_matches('.');
        fixed.to_string()
    } else {
        let m = mantissa.trim_end_matches('0').trim_end_matches('.');
        format!("{m}e{}{:02}", if exp < 0 { '-' } else { '+' }, exp.abs())
    }
}

const FANCY: &str =
    "--------------------------------------------------------------------------------\n";

/// Prints the report for `profile` (read from `opts.input`).
pub fn annotate(profile: &Profile, opts: &AnnotateOptions) -> Result<String, AnnotateError> {
    let first = profile
        .parts
        .first()
        .ok_or_else(|| AnnotateError("Line 0: missing events line".to_string()))?;
    let names: Vec<String> = first.events.iter().map(|e| e.name.clone()).collect();
    let index = |kind: &str, list: &[String]| -> Result<Vec<usize>, AnnotateError> {
        if list.is_empty() {
            return Ok((0..names.len()).collect());
        }
        list.iter()
            .map(|e| {
                names.iter().position(|n| n == e).ok_or_else(|| {
                    AnnotateError(format!("--{kind} event `{e}' did not appear in input"))
                })
            })
            .collect()
    };
    let columns = Columns {
        show: index("show", &opts.show)?,
        sort: index("sort", &opts.sort)?,
        names: names.clone(),
        percs: opts.show_percs,
    };
    // One threshold per sort event: the given ones, or --threshold for
    // the primary event and 0 for the others.
    let (thresholds, single_threshold) = if opts.sort_thresholds.is_empty() {
        let mut t = vec!["0".to_string(); columns.sort.len()];
        t[0] = opts.threshold.clone();
        (t, perl_number(&opts.threshold))
    } else {
        (opts.sort_thresholds.clone(), 0.0)
    };

    let cwd = cwd_prefix();
    let user_files: HashSet<String> = opts.user_files.iter().cloned().collect();
    let tables = Tables::collect(
        profile,
        &CollectOptions {
            inclusive: opts.inclusive,
            all_lines: opts.auto,
            line_files: &user_files,
            cwd_prefix: &cwd,
        },
    );
    let mut summary = tables.summary.clone().filter(|s| !cc::is_zero(s));
    if summary.is_none() {
        summary = tables.totals.clone().filter(|s| !cc::is_zero(s));
    }
    let calculated = summary.is_none();
    let summary = summary.unwrap_or_else(|| {
        let mut sum = Cc::new();
        for c in tables.fn_totals.values() {
            cc::add(c, &mut sum);
        }
        sum
    });

    let mut out = String::new();
    print_options(&mut out, profile, opts, &columns, &thresholds);
    let report = Report {
        columns: &columns,
        tables: &tables,
        summary,
        opts,
    };
    let threshold_files =
        report.print_functions(&mut out, calculated, &thresholds, single_threshold);
    report.print_sources(&mut out, threshold_files)?;
    Ok(out)
}

/// The current directory with a trailing `/`, as the shell's `pwd` gives
/// it (the logical `$PWD` when it is this directory).
fn cwd_prefix() -> String {
    let physical = std::env::current_dir().ok();
    let logical = std::env::var("PWD").ok().filter(|p| {
        Path::new(p).is_absolute()
            && std::fs::canonicalize(p).ok()
                == physical.as_ref().and_then(|c| c.canonicalize().ok())
    });
    match logical.or_else(|| physical.map(|p| p.to_string_lossy().into_owned())) {
        Some(p) if p == "/" => p,
        Some(p) => format!("{p}/"),
        None => String::new(),
    }
}

fn print_options(
    out: &mut String,
    profile: &Profile,
    opts: &AnnotateOptions,
    columns: &Columns,
    thresholds: &[String],
) {
    let header = &profile.parts[0];
    out.push_str(FANCY);
    out.push_str(&format!("Profile data file '{}'", opts.input));
    if let Some(creator) = profile.creator.as_deref().filter(|c| !c.is_empty()) {
        out.push_str(&format!(" (creator: {creator})"));
    }
    out.push('\n');
    out.push_str(FANCY);
    for d in header.desc.iter().filter(|d| !d.starts_with("Option:")) {
        out.push_str(d);
        out.push('\n');
    }
    let mut target = profile.cmd.clone().unwrap_or_default();
    if target.is_empty() {
        target = "(unknown)".to_string();
    }
    if let Some(pid) = profile.pid.as_deref().filter(|p| !p.is_empty()) {
        target.push_str(&format!(" (PID {pid}"));
        if let Some(part) = header.number {
            target.push_str(&format!(", part {part}"));
        }
        if let Some(thread) = header.thread {
            target.push_str(&format!(", thread {thread}"));
        }
        target.push(')');
    }
    let list = |ids: &[usize]| -> String {
        ids.iter()
            .map(|&i| columns.names[i].as_str())
            .collect::<Vec<_>>()
            .join(" ")
    };
    let all: Vec<usize> = (0..columns.names.len()).collect();
    out.push_str(&format!("Profiled target:  {target}\n"));
    out.push_str(&format!("Events recorded:  {}\n", list(&all)));
    out.push_str(&format!("Events shown:     {}\n", list(&columns.show)));
    out.push_str(&format!("Event sort order: {}\n", list(&columns.sort)));
    out.push_str(&format!("Thresholds:       {}\n", thresholds.join(" ")));
    let continued = |out: &mut String, label: &str, items: &[String]| {
        let first = items.first().map_or("", String::as_str);
        out.push_str(&format!("{label}{first}\n"));
        for item in items.iter().skip(1) {
            out.push_str(&format!("                  {item}\n"));
        }
    };
    continued(out, "Include dirs:     ", &opts.include_dirs);
    let mut user: Vec<String> = opts.user_files.clone();
    user.sort();
    user.dedup();
    continued(out, "User annotated:   ", &user);
    let on = if opts.auto { "on" } else { "off" };
    out.push_str(&format!("Auto-annotation:  {on}\n\n"));
}

/// What the sections after the options are printed from.
struct Report<'a> {
    columns: &'a Columns,
    tables: &'a Tables,
    /// The program totals percentages refer to.
    summary: Cc,
    opts: &'a AnnotateOptions,
}

impl Report<'_> {
    /// The totals and the function list; returns the files of the listed
    /// functions (for `--auto=yes`).
    fn print_functions(
        &self,
        out: &mut String,
        calculated: bool,
        thresholds: &[String],
        single_threshold: f64,
    ) -> Vec<String> {
        let (cols, t) = (self.columns, self.tables);
        let summary_widths = cols.widths([&self.summary]);
        let fn_widths = cols.widths(t.fn_totals.values());
        out.push_str(FANCY);
        cols.header(out, &summary_widths);
        out.push('\n');
        out.push_str(FANCY);
        cols.counts(out, &self.summary, &summary_widths, &self.summary);
        out.push_str(" PROGRAM TOTALS");
        if calculated {
            out.push_str(" (calculated)");
        }
        out.push_str("\n\n");
        out.push_str(FANCY);
        cols.header(out, &fn_widths);
        out.push_str(" file:function\n");
        out.push_str(FANCY);

        let mut functions: Vec<(&String, &Cc)> = t.fn_totals.iter().collect();
        functions.sort_by(|a, b| {
            cols.compare(Some(a.1), Some(b.1))
                .then_with(|| a.0.cmp(b.0))
        });
        let thresholds: Vec<f64> = thresholds.iter().map(|t| perl_number(t)).collect();
        let mut reached = vec![0i128; thresholds.len()];
        let mut files = Vec::new();
        let tree = self.opts.tree_caller || self.opts.tree_calling;
        for (name, costs) in functions {
            if single_threshold < 100.0 {
                let done = thresholds.iter().enumerate().all(|(i, &th)| {
                    let mut prop = (reached[i] * 100) as f64;
                    if let Some(total) = cc::get(&self.summary, cols.sort[i]).filter(|&v| v > 0) {
                        prop /= total as f64;
                    }
                    prop >= th
                });
                if done {
                    break;
                }
            }
            if tree {
                out.push('\n');
            }
            if self.opts.tree_caller && name != "???:???" {
                self.print_arcs(out, name, true, &fn_widths);
            }
            cols.counts(out, costs, &fn_widths, &self.summary);
            if tree {
                out.push_str(" * ");
            }
            out.push(' ');
            out.push_str(name);
            if let Some(obj) = t.objects.get(name).filter(|o| !o.is_empty()) {
                out.push_str(&format!(" [{obj}]"));
            }
            out.push('\n');
            if self.opts.tree_calling && name != "???:???" {
                self.print_arcs(out, name, false, &fn_widths);
            }
            files.push(file_of(name).to_string());
            for (i, &event) in cols.sort.iter().enumerate() {
                if let Some(v) = cc::get(costs, event) {
                    if self.opts.inclusive {
                        let total = cc::get(&self.summary, event).unwrap_or(0);
                        reached[i] = i128::from(total) - i128::from(v);
                    } else {
                        reached[i] += i128::from(v);
                    }
                }
            }
        }
        out.push('\n');
        files
    }

    /// The callers (`<`) or callees (`>`) of `name`, most costly first.
    fn print_arcs(&self, out: &mut String, name: &str, callers: bool, widths: &[usize]) {
        let t = self.tables;
        let others = if callers { &t.callers } else { &t.callees };
        let Some(others) = others.get(name) else {
            return;
        };
        let arc = |other: &str| -> (String, String) {
            if callers {
                (other.to_string(), name.to_string())
            } else {
                (name.to_string(), other.to_string())
            }
        };
        let mut sorted: Vec<&String> = others.iter().collect();
        sorted.sort_by(|a, b| {
            self.columns
                .compare(t.arc_costs.get(&arc(a)), t.arc_costs.get(&arc(b)))
        });
        for other in sorted {
            let key = arc(other);
            let Some(count) = t.arc_counts.get(&key) else {
                continue;
            };
            let empty = Cc::new();
            let costs = t.arc_costs.get(&key).unwrap_or(&empty);
            self.columns.counts(out, costs, widths, &self.summary);
            let arrow = if callers { " < " } else { " >   " };
            out.push_str(&format!("{arrow}{other} ({}x)", columns::commas(*count)));
            if let Some(obj) = t.objects.get(other.as_str()) {
                out.push_str(&format!(" [{obj}]"));
            }
            out.push('\n');
        }
    }
}

/// The file part of `file:function`: up to the first colon that is not
/// the last character.
fn file_of(name: &str) -> &str {
    match name.find(':') {
        Some(i) if i + 1 < name.len() => &name[..i],
        _ => name,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn perl_numbers() {
        assert_eq!(perl_number("99"), 99.0);
        assert_eq!(perl_number("0.5"), 0.5);
        assert_eq!(perl_number("1.2.3"), 1.2);
        assert_eq!(perl_number("."), 0.0);
        assert_eq!(perl_format(7.0), "7");
        assert_eq!(perl_format(-2.5), "-2.5");
        assert_eq!(perl_format(0.1 + 0.2), "0.3");
        assert_eq!(file_of("a.c:main"), "a.c");
        assert_eq!(file_of("???:???"), "???");
        assert_eq!(file_of("odd:"), "odd:");
    }
}
