//! The annotated source files: each chosen file with the counts of its
//! lines, context lines around them, the calls made from each line, and at
//! the end the events annotated.

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};

use super::cc::{self, Cc};
use super::{columns, perl_format, perl_number, AnnotateError, Report, FANCY};

/// An open source file read line by line, with the line number of the
/// last line read (Perl's `$.`).
struct Source {
    reader: BufReader<std::fs::File>,
    number: u64,
}

impl Source {
    /// The next line with its newline (none on a last line without one).
    fn next(&mut self) -> Option<String> {
        let mut line = Vec::new();
        match self.reader.read_until(b'\n', &mut line) {
            Ok(0) | Err(_) => None,
            Ok(_) => {
                self.number += 1;
                Some(String::from_utf8_lossy(&line).into_owned())
            }
        }
    }
}

impl Report<'_> {
    /// The annotated files, the files not found, and the events
    /// annotated.
    pub(super) fn print_sources(
        &self,
        out: &mut String,
        threshold_files: Vec<String>,
    ) -> Result<(), AnnotateError> {
        let opts = self.opts;
        let mut chosen: BTreeSet<String> = opts.user_files.iter().cloned().collect();
        if opts.auto {
            chosen.extend(threshold_files.into_iter().filter(|f| f != "???"));
        }
        let mut not_found = Vec::new();
        let mut printed = Cc::new();
        let mut annotated = false;
        let dirs: Vec<String> = std::iter::once(String::new())
            .chain(opts.include_dirs.iter().cloned())
            .collect();
        for file in &chosen {
            let user = opts.user_files.contains(file);
            let opened = dirs.iter().find_map(|dir| {
                let path = format!("{dir}{file}");
                let f = std::fs::File::open(&path).ok()?;
                // A directory opens but cannot be read as the script reads it.
                f.metadata().ok().filter(|m| !m.is_dir())?;
                let shown = if dir.is_empty() {
                    file.clone()
                } else {
                    format!("{dir} + {file}")
                };
                Some((f, path, shown))
            });
            let Some((f, path, shown)) = opened else {
                if user {
                    return Err(AnnotateError(format!(
                        "File {file} not opened in any of: {}",
                        dirs.join(" ")
                    )));
                }
                not_found.push(file.clone());
                continue;
            };
            out.push_str(FANCY);
            let kind = if user { "User" } else { "Auto" };
            out.push_str(&format!("-- {kind}-annotated source: {shown}\n"));
            out.push_str(FANCY);
            let Some(line_costs) = self.tables.lines.get(file) else {
                out.push_str(&format!(
                    "  No information has been collected for {file}\n\n"
                ));
                continue;
            };
            annotated = true;
            let newer = modified(&path) > modified(&opts.input);
            if newer {
                out.push_str(&newer_warning(file, &opts.input));
            }
            let mut source = Source {
                reader: BufReader::new(f),
                number: 0,
            };
            self.annotate_file(out, file, line_costs, &mut source, newer, &mut printed);
        }
        if !not_found.is_empty() {
            out.push_str(FANCY);
            out.push_str("The following files chosen for auto-annotation could not be found:\n");
            out.push_str(FANCY);
            not_found.sort();
            for f in &not_found {
                out.push_str(&format!("  {f}\n"));
            }
            out.push('\n');
        }
        if annotated {
            // Events whose annotated lines add up to more than the total
            // (or with no total) show 100%.
            let mut summary = self.summary.clone();
            for (i, s) in summary.iter_mut().enumerate() {
                let p = cc::get(&printed, i);
                if s.unwrap_or(0) == 0 || p.unwrap_or(0) > s.unwrap_or(0) {
                    *s = p;
                }
            }
            let widths = self.columns.widths([&printed]);
            out.push_str(FANCY);
            self.columns.header(out, &widths);
            out.push('\n');
            out.push_str(FANCY);
            self.columns.counts(out, &printed, &widths, &summary);
            out.push_str(" events annotated\n\n");
        }
        Ok(())
    }

    fn annotate_file(
        &self,
        out: &mut String,
        file: &str,
        line_costs: &std::collections::BTreeMap<u64, Cc>,
        source: &mut Source,
        newer: bool,
        printed: &mut Cc,
    ) {
        let cols = self.columns;
        let widths = cols.widths(line_costs.values());
        cols.header(out, &widths);
        out.push_str("\n\n");
        // Line 0 (no line information) is reported apart.
        let mut pending: std::collections::VecDeque<u64> =
            line_costs.keys().copied().filter(|&l| l != 0).collect();
        let context = perl_number(&self.opts.context);
        // Ranges of lines to print: each counted line with `context` lines
        // around it, overlapping ranges merged.
        let mut ranges: Vec<(f64, Option<f64>)> = Vec::new();
        let nums: Vec<u64> = pending.iter().copied().collect();
        let mut i = 0;
        while i < nums.len() {
            let low = nums[i] as f64 - context;
            while i + 1 < nums.len() && nums[i] as f64 + 2.0 * context >= nums[i + 1] as f64 {
                i += 1;
            }
            ranges.push((low, Some(nums[i] as f64 + context)));
            i += 1;
        }
        match ranges.first_mut() {
            Some(first) if first.0 < 1.0 => first.0 = 1.0,
            Some(_) => {}
            // No counted line: the script's range starts at 1 and has no
            // end, which prints nothing.
            None => ranges.push((1.0, None)),
        }
        let empty = Cc::new();
        for (low, high) in ranges {
            while (source.number as f64) < low - 1.0 {
                if source.next().is_none() {
                    break;
                }
            }
            if low != 1.0 {
                out.push_str(&format!(
                    "-- line {} {}\n",
                    perl_format(low),
                    "-".repeat(40)
                ));
            }
            let high_value = high.unwrap_or(0.0);
            let mut last_read = None;
            while (source.number as f64) < high_value {
                let Some(text) = source.next() else {
                    last_read = None;
                    break;
                };
                let n = source.number;
                if pending.front() == Some(&n) {
                    let c = &line_costs[&n];
                    cols.counts(out, c, &widths, &self.summary);
                    cc::add(c, printed);
                    pending.pop_front();
                } else {
                    cols.counts(out, &empty, &widths, &self.summary);
                }
                out.push(' ');
                out.push_str(&text);
                self.print_line_calls(out, file, n, &widths);
                last_read = Some(text);
            }
            // The script tests the last line read for truth: none, or a
            // last line "0" without newline, ends the file.
            match last_read {
                Some(t) if t != "0" => {
                    out.push_str(&format!(
                        "-- line {} {}\n",
                        perl_format(high_value),
                        "-".repeat(40)
                    ));
                }
                _ => break,
            }
        }
        if !pending.is_empty() {
            for n in &pending {
                cols.counts(out, &line_costs[n], &widths, &self.summary);
                out.push_str(&format!(" <bogus line {n}>\n"));
            }
            out.push('\n');
            out.push_str(&past_end_warning(file, newer));
        }
        out.push('\n');
        if let Some(c) = line_costs.get(&0) {
            cols.counts(out, c, &widths, &self.summary);
            out.push_str(&format!(" <counts for unidentified lines in {file}>\n\n"));
        }
    }

    /// The calls made from line `n` of `file`, by the first function seen
    /// calling from it.
    fn print_line_calls(&self, out: &mut String, file: &str, n: u64, widths: &[usize]) {
        let t = self.tables;
        let site = (file.to_string(), n);
        let (Some(callees), Some(caller)) =
            (t.called_from_line.get(&site), t.func_of_line.get(&site))
        else {
            return;
        };
        let arc = |callee: &str| (caller.clone(), callee.to_string());
        let mut sorted: Vec<&String> = callees.iter().collect();
        sorted.sort_by(|a, b| {
            self.columns
                .compare(t.arc_costs.get(&arc(a)), t.arc_costs.get(&arc(b)))
        });
        for callee in sorted {
            let key = (caller.clone(), callee.clone(), n);
            let Some(c) = t.line_arc_costs.get(&key) else {
                continue;
            };
            self.columns.counts(out, c, widths, &self.summary);
            let count = t.line_arc_counts.get(&key).copied().unwrap_or(0);
            out.push_str(&format!(" => {callee} ({}x)\n", columns::commas(count)));
        }
    }
}

/// A file's modification time in whole seconds (what Perl's `stat` gives).
fn modified(path: &str) -> i64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).map_or(0, |m| m.mtime())
}

const AT_LINE: &str =
    "@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@\n";
const WARNING_LINE: &str =
    "@@ WARNING @@ WARNING @@ WARNING @@ WARNING @@ WARNING @@ WARNING @@ WARNING @@\n";

fn newer_warning(file: &str, input: &str) -> String {
    format!(
        "{AT_LINE}{WARNING_LINE}{AT_LINE}\
         @ Source file '{file}' is more recent than input file '{input}'.\n\
         @ Annotations may not be correct.\n{AT_LINE}\n"
    )
}

fn past_end_warning(file: &str, newer: bool) -> String {
    let cause = if newer {
        format!(
            "@@ cause:    '{file}' has changed since information was gathered.\n\
             @@           If so, a warning will have already been issued about this.\n\
             @@ solution: Recompile program and rerun under \"valgrind --cachesim=yes\" to \n\
             @@           gather new information.\n"
        )
    } else if file.ends_with(".h") {
        "@@ cause:    bug in the Valgrind's debug info reader that screws up with .h\n\
         @@           files sometimes\n\
         @@ solution: none, sorry\n"
            .to_string()
    } else {
        "@@ cause:    not sure, sorry\n".to_string()
    };
    format!(
        "{AT_LINE}{WARNING_LINE}{AT_LINE}@@\n\
         @@ Information recorded about lines past the end of '{file}'.\n\
         @@\n\
         @@ Probable cause and solution:\n\
         {cause}@@\n{AT_LINE}"
    )
}
