//! Source annotation and the Annotation summary (spec §7.3, "Source
//! annotation of one file", "Annotation summary").

use std::ffi::OsStr;
use std::fs::{self, File};
use std::io::{self, Read};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use super::aggregate::{Agg, CcId};
use super::printer::{add_to, fancy, Events, Printer};
use super::Output;
use crate::lines::LineReader;
use crate::pytext;
use crate::tool::FxHashMap;

/// The six totals of the Annotation summary, in print order.
pub struct AnnotatedCcs {
    ccs: [Vec<i64>; 6],
}

const KNOWN: usize = 0;
const UNKNOWN_LINE: usize = 1;
const NON_IDENTICAL: usize = 2;
const UNREADABLE: usize = 3;
const BELOW_THRESHOLD: usize = 4;
const FILES_UNKNOWN: usize = 5;

const LABELS: [&str; 6] = [
    "  annotated: files known & above threshold & readable, line numbers known",
    "  annotated: files known & above threshold & readable, line numbers unknown",
    "unannotated: files known & above threshold & two or more non-identical",
    "unannotated: files known & above threshold & unreadable ",
    "unannotated: files known & below threshold",
    "unannotated: files unknown",
];

/// Where to look for sources, and what to compare their times with.
pub struct SourceContext<'a> {
    /// The profile files given on the command line (for the mtime check).
    pub cgout_files: &'a [std::ffi::OsString],
    /// `-I` directories tried for relative source paths that do not exist.
    pub include_dirs: &'a [PathBuf],
    /// Lines of context around annotated lines.
    pub context: i64,
    /// Whether percentages are shown.
    pub show_percs: bool,
}

/// The path to open for an original source name: the name itself, or for
/// a relative name that does not exist, the first `-I` directory holding
/// it.
fn resolve(ofl: &[u8], include_dirs: &[PathBuf]) -> PathBuf {
    let path = Path::new(OsStr::from_bytes(ofl));
    if !include_dirs.is_empty() && path.is_relative() && fs::metadata(path).is_err() {
        for dir in include_dirs {
            let candidate = dir.join(path);
            if fs::metadata(&candidate).is_ok() {
                return candidate;
            }
        }
    }
    path.to_path_buf()
}

/// Python's `filecmp.cmp(a, b, shallow=False)`: false unless both are
/// regular files of the same size and contents; stat and read failures
/// are errors.
fn files_identical(a: &Path, b: &Path) -> io::Result<bool> {
    let (ma, mb) = (fs::metadata(a)?, fs::metadata(b)?);
    if !ma.is_file() || !mb.is_file() {
        return Ok(false);
    }
    if ma.len() != mb.len() {
        return Ok(false);
    }
    let (mut fa, mut fb) = (File::open(a)?, File::open(b)?);
    let (mut ba, mut bb) = (vec![0u8; 1 << 16], vec![0u8; 1 << 16]);
    loop {
        let na = read_full(&mut fa, &mut ba)?;
        let nb = read_full(&mut fb, &mut bb)?;
        if na != nb || ba[..na] != bb[..nb] {
            return Ok(false);
        }
        if na == 0 {
            return Ok(true);
        }
    }
}

/// Reads until `buf` is full or the file ends.
fn read_full(f: &mut File, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match f.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// Modification time in nanoseconds.
fn mtime_ns(path: &Path) -> io::Result<i128> {
    let m = fs::metadata(path)?;
    Ok(i128::from(m.mtime()) * 1_000_000_000 + i128::from(m.mtime_nsec()))
}

/// What became of an annotated file's originals.
enum Originals {
    /// All identical and the first opened.
    Readable(File, PathBuf),
    NotIdentical,
    Unreadable,
}

fn check_originals(paths: &[PathBuf]) -> Originals {
    let identical = (|| {
        for pair in paths.windows(2) {
            if !files_identical(&pair[0], &pair[1])? {
                return Ok(false);
            }
        }
        Ok::<bool, io::Error>(true)
    })();
    match identical {
        Err(_) => Originals::Unreadable,
        Ok(false) => Originals::NotIdentical,
        Ok(true) => match File::open(&paths[0]) {
            Ok(f) if f.metadata().is_ok_and(|m| !m.is_dir()) => {
                Originals::Readable(f, paths[0].clone())
            }
            _ => Originals::Unreadable,
        },
    }
}

fn print_warning(out: &mut Vec<u8>, msg: &[u8]) {
    let at = [b'@'; 79];
    out.extend_from_slice(&at);
    out.extend_from_slice(
        b"\n@@ WARNING @@ WARNING @@ WARNING @@ WARNING @@ WARNING @@ WARNING @@ WARNING @@\n",
    );
    out.extend_from_slice(&at);
    out.push(b'\n');
    out.extend_from_slice(msg);
    out.extend_from_slice(&at);
    out.push(b'\n');
}

/// Prints every annotated file, and returns the Annotation summary's
/// totals. `ann_files` are the file names shown in the File:function
/// section.
pub fn print_annotated_files(
    out: &mut Output<'_>,
    events: &Events,
    agg: &Agg,
    ann_files: &[Vec<u8>],
    ctx: &SourceContext<'_>,
) -> io::Result<AnnotatedCcs> {
    let n = agg.n;
    let mut acc = AnnotatedCcs {
        ccs: std::array::from_fn(|_| vec![0i64; n]),
    };
    let empty = FxHashMap::default();
    let lines_of = |mfl: u32| -> &FxHashMap<i64, CcId> {
        agg.file_lines[mfl as usize].map_or(&empty, |m| &agg.line_maps[m as usize])
    };
    // A file's line counts add up to its outer total, which is what the
    // summary rows below need.
    let outer_of =
        |mfl: u32| agg.file_dcc[mfl as usize].map(|d| agg.cc(agg.dccs[d as usize].outer));
    let mut consumed = vec![false; agg.files.len()];

    if let Some(unknown) = agg.files.get(b"???") {
        if let Some(total) = outer_of(unknown) {
            consumed[unknown as usize] = true;
            add_to(&mut acc.ccs[FILES_UNKNOWN], total);
        }
    }

    let mut names: Vec<&Vec<u8>> = ann_files
        .iter()
        .filter(|f| f.as_slice() != b"???")
        .collect();
    names.sort();
    names.dedup();
    for mfl_name in names {
        let Some(mfl) = agg.files.get(mfl_name) else {
            continue;
        };
        consumed[mfl as usize] = true;
        let lines = lines_of(mfl);
        let ofls: Vec<&Vec<u8>> = agg.file_ofls[mfl as usize].iter().collect();
        let paths: Vec<PathBuf> = ofls.iter().map(|o| resolve(o, ctx.include_dirs)).collect();
        let mut title = b"Annotated source file: ".to_vec();
        title.extend_from_slice(mfl_name);
        if paths.is_empty() {
            continue;
        }
        match check_originals(&paths) {
            Originals::Readable(file, path) => {
                fancy(out.buf(), &title);
                let min_mtime = paths.iter().filter_map(|p| mtime_ns(p).ok()).min();
                for cgout in ctx.cgout_files {
                    let newer = match (min_mtime, mtime_ns(Path::new(cgout))) {
                        (Some(src), Ok(data)) => src > data,
                        _ => false,
                    };
                    if newer {
                        let mut msg =
                            b"@ Original source files are all newer than data file '".to_vec();
                        msg.extend_from_slice(cgout.as_bytes());
                        msg.extend_from_slice(b"':\n");
                        for o in &ofls {
                            msg.extend_from_slice(b"@ - ");
                            msg.extend_from_slice(o);
                            msg.push(b'\n');
                        }
                        msg.extend_from_slice(b"@ Annotations may not be correct.\n");
                        print_warning(out.buf(), &msg);
                        out.buf().push(b'\n');
                    }
                }
                annotate_file(out, events, agg, lines, file, &path, ctx, &mut acc)?;
            }
            other => {
                let (slot, why): (usize, &[u8]) = match other {
                    Originals::NotIdentical => (
                        NON_IDENTICAL,
                        b"Unannotated because two or more of these original files are not identical:",
                    ),
                    _ => (
                        UNREADABLE,
                        b"Unannotated because one or more of these original files are unreadable:",
                    ),
                };
                if let Some(total) = outer_of(mfl) {
                    add_to(&mut acc.ccs[slot], total);
                }
                fancy(out.buf(), &title);
                out.buf().extend_from_slice(why);
                for o in &ofls {
                    out.buf().extend_from_slice(b"\n- ");
                    out.buf().extend_from_slice(o);
                }
                out.buf().extend_from_slice(b"\n\n");
            }
        }
        out.maybe_flush()?;
    }

    for (mfl, done) in consumed.iter().enumerate() {
        if let (false, Some(total)) = (done, outer_of(mfl as u32)) {
            add_to(&mut acc.ccs[BELOW_THRESHOLD], total);
        }
    }
    Ok(acc)
}

/// Annotates one readable source file.
#[allow(clippy::too_many_arguments)]
fn annotate_file(
    out: &mut Output<'_>,
    events: &Events,
    agg: &Agg,
    lines: &FxHashMap<i64, CcId>,
    file: File,
    path: &Path,
    ctx: &SourceContext<'_>,
    acc: &mut AnnotatedCcs,
) -> io::Result<()> {
    let printer = Printer::for_ccs(
        events,
        &agg.summary,
        ctx.show_percs,
        lines.values().map(|&cc| agg.cc(cc)),
    );
    printer.header(out.buf(), "");
    out.buf().push(b'\n');

    if let Some(&line0) = lines.get(&0) {
        if agg.n > 0 {
            printer.row(out.buf(), agg.cc(line0), None, b"<unknown (line 0)>");
            add_to(&mut acc.ccs[UNKNOWN_LINE], agg.cc(line0));
            out.buf().push(b'\n');
        }
    }

    let mut line_nums: Vec<i64> = lines.keys().copied().filter(|&l| l != 0).collect();
    line_nums.sort_unstable();

    // Ranges of lines to print: each counted line with `context` lines
    // around it, merged when they overlap or touch.
    let c = i128::from(ctx.context);
    let mut pairs: Vec<(i128, i128)> = Vec::new();
    let mut i = 0;
    while i < line_nums.len() {
        let lo = (i128::from(line_nums[i]) - c).max(1);
        while i + 1 < line_nums.len()
            && i128::from(line_nums[i]) + 2 * c >= i128::from(line_nums[i + 1])
        {
            i += 1;
        }
        let hi = i128::from(line_nums[i]) + c;
        pairs.push((lo, hi));
        i += 1;
    }
    if pairs.is_empty() {
        return Ok(());
    }

    // Print the ranges; `next` indexes the first counted line not printed.
    let mut next = 0;
    let mut src = LineReader::new(file);
    let mut line_num: i128 = 0;
    'ranges: for &(lo, hi) in &pairs {
        while line_num < lo - 1 {
            line_num += 1;
            if !matches!(src.next_line(), Ok(Some(_))) {
                break 'ranges;
            }
        }
        if lo != 1 {
            writeln_marker(out.buf(), lo);
        }
        while line_num < hi {
            line_num += 1;
            let Ok(Some(line)) = src.next_line() else {
                break 'ranges;
            };
            // `src_line[:-1]`: a last line without newline loses a
            // character.
            let text = if line.terminated {
                line.text
            } else {
                pytext::drop_last_char(line.text)
            };
            if next < line_nums.len() && i128::from(line_nums[next]) == line_num {
                let cc = agg.cc(lines[&line_nums[next]]);
                printer.row(out.buf(), cc, None, text);
                add_to(&mut acc.ccs[KNOWN], cc);
                next += 1;
            } else {
                printer.missing_row(out.buf(), text);
            }
            out.maybe_flush()?;
        }
        writeln_marker(out.buf(), hi);
    }

    // Lines recorded past the end of the file.
    if next < line_nums.len() {
        out.buf().push(b'\n');
        for &l in &line_nums[next..] {
            let cc = agg.cc(lines[&l]);
            printer.row(out.buf(), cc, None, format!("<bogus line {l}>").as_bytes());
            add_to(&mut acc.ccs[KNOWN], cc);
        }
        out.buf().push(b'\n');
        let mut msg = b"@@ Information recorded about lines past the end of '".to_vec();
        msg.extend_from_slice(path.as_os_str().as_bytes());
        msg.extend_from_slice(b"'.\n");
        print_warning(out.buf(), &msg);
    }
    out.buf().push(b'\n');
    Ok(())
}

fn writeln_marker(out: &mut Vec<u8>, n: i128) {
    out.extend_from_slice(format!("-- line {n} {}\n", "-".repeat(40)).as_bytes());
}

/// Prints the Annotation summary. Returns false if its rows do not add up
/// to the summary (cg_annotate then stops with an error).
pub fn print_annotation_summary(
    out: &mut Output<'_>,
    events: &Events,
    agg: &Agg,
    acc: &AnnotatedCcs,
    show_percs: bool,
) -> Result<(), String> {
    let printer = Printer::for_ccs(
        events,
        &agg.summary,
        show_percs,
        acc.ccs.iter().map(|c| c.as_slice()),
    );
    fancy(out.buf(), b"Annotation summary");
    printer.header(out.buf(), "");
    out.buf().push(b'\n');
    let mut total = vec![0i64; agg.n];
    for (cc, label) in acc.ccs.iter().zip(LABELS) {
        printer.row(out.buf(), cc, None, label.as_bytes());
        add_to(&mut total, cc);
    }
    out.buf().push(b'\n');
    if total != agg.summary {
        return Err(format!(
            "`summary:` line doesn't match computed annotated counts\n- summary:   {}\n- annotated: {}",
            pytext::int_list(&agg.summary),
            pytext::int_list(&total)
        ));
    }
    Ok(())
}
