//! `cg_annotate`: the report of one or more profiles, as the current
//! Python `cg_annotate` prints it (spec §7), byte for byte.
//!
//! Several files are merged (summed); with `diff`, the result is the second
//! minus the first. Sections: Metadata, Summary, File:function,
//! Function:file, then with annotation on, each annotated source file and
//! the Annotation summary.

mod aggregate;
mod printer;
mod sections;
mod source;

use std::ffi::OsString;
use std::fs::File;
use std::io::{self, Seek, SeekFrom, Write};
use std::path::PathBuf;

use crate::reader::CgoutReader;
use crate::subst::Subst;
use crate::tool::{open_input, os_error_message, read_error, ToolError};
use aggregate::Agg;
use printer::{fancy, Events, Printer};

/// The options of `cg_annotate`.
#[derive(Debug, Clone)]
pub struct AnnotateOptions {
    /// The profiles, at least one; exactly two with `diff`.
    pub files: Vec<OsString>,
    /// Print the second file minus the first.
    pub diff: bool,
    /// `--mod-filename`.
    pub mod_filename: Option<Subst>,
    /// `--mod-funcname`.
    pub mod_funcname: Option<Subst>,
    /// `--show`: the events shown, in order (default: all).
    pub show: Option<Vec<String>>,
    /// `--sort`: the sort events (default: the file's order).
    pub sort: Option<Vec<String>>,
    /// `--threshold`, a percentage in [0, 20].
    pub threshold: f64,
    /// `--show-percs`.
    pub show_percs: bool,
    /// `--annotate`.
    pub annotate: bool,
    /// `--context`.
    pub context: i64,
    /// `-I`/`--include`: directories searched for relative source paths.
    pub include_dirs: Vec<PathBuf>,
    /// The text of the Invocation line: the command line, space-joined.
    pub invocation: Vec<u8>,
}

impl Default for AnnotateOptions {
    fn default() -> Self {
        AnnotateOptions {
            files: Vec::new(),
            diff: false,
            mod_filename: None,
            mod_funcname: None,
            show: None,
            sort: None,
            threshold: 0.1,
            show_percs: true,
            annotate: true,
            context: 8,
            include_dirs: Vec::new(),
            invocation: Vec::new(),
        }
    }
}

/// Output buffered in memory and written out in large pieces.
pub(crate) struct Output<'a> {
    buf: Vec<u8>,
    w: &'a mut dyn Write,
}

impl<'a> Output<'a> {
    fn new(w: &'a mut dyn Write) -> Self {
        Output {
            buf: Vec::with_capacity(1 << 17),
            w,
        }
    }

    /// The buffer to print into.
    pub(crate) fn buf(&mut self) -> &mut Vec<u8> {
        &mut self.buf
    }

    /// Writes the buffer out once it is large.
    pub(crate) fn maybe_flush(&mut self) -> io::Result<()> {
        if self.buf.len() >= 1 << 16 {
            self.flush()?;
        }
        Ok(())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.w.write_all(&self.buf)?;
        self.buf.clear();
        self.w.flush()
    }
}

/// Checks `--show` and `--sort` against a file's events, as cg_annotate
/// does for every input file.
fn make_events(names: Vec<String>, opts: &AnnotateOptions) -> Result<Events, ToolError> {
    let index = |kind: &str, list: &Option<Vec<String>>| -> Result<Vec<usize>, ToolError> {
        match list {
            // An empty list cannot come from the command line (splitting
            // "" gives [""]), and means "the default" as in Python.
            Some(list) if !list.is_empty() => list
                .iter()
                .map(|e| {
                    names.iter().position(|n| n == e).ok_or_else(|| {
                        ToolError::Fatal(format!(
                            "--{kind} event `{e}` did not appear in `events:` line"
                        ))
                    })
                })
                .collect(),
            _ => Ok((0..names.len()).collect()),
        }
    };
    let show = index("show", &opts.show)?;
    let sort = index("sort", &opts.sort)?;
    Ok(Events { names, show, sort })
}

/// An input kept open for the second pass: its file and what it looked
/// like when first read.
struct Input {
    file: File,
    len: u64,
    modified: Option<std::time::SystemTime>,
}

/// What the first pass over the inputs gives.
struct FirstPass {
    events: Events,
    descs: Vec<Vec<u8>>,
    cmds: Vec<Vec<u8>>,
    agg: Agg,
    /// Per input, the file to read again for per-line counts; `None` for
    /// an input that cannot be read again (a pipe), whose per-line counts
    /// were kept in the first pass.
    inputs: Vec<Option<Input>>,
}

/// Reads every profile into the aggregates, one after the other as
/// cg_annotate does (so errors come in the same order).
fn read_all(opts: &AnnotateOptions) -> Result<FirstPass, ToolError> {
    let mut descs = Vec::new();
    let mut cmds = Vec::new();
    let mut state: Option<(Events, Agg)> = None;
    let mut inputs = Vec::new();
    for (i, path) in opts.files.iter().enumerate() {
        let file = open_input(path)?;
        let regular = file.metadata().ok().filter(|m| m.is_file());
        let (mut reader, header) = CgoutReader::new(&file).map_err(|e| read_error(path, e))?;
        let mut desc = Vec::new();
        for d in &header.desc {
            desc.extend_from_slice(d);
            desc.push(b'\n');
        }
        descs.push(desc);
        cmds.push(header.cmd.clone());
        let events = make_events(header.events, opts)?;
        match &state {
            None => {
                if events.names.is_empty() {
                    // cg_annotate crashes on this (an IndexError); say why.
                    return Err(read_error(
                        path,
                        reader.error("no events in the `events:` line"),
                    ));
                }
                let agg = Agg::new(
                    events.names.len(),
                    opts.mod_filename.clone(),
                    opts.mod_funcname.clone(),
                );
                state = Some((events, agg));
            }
            Some((first, _)) => {
                if first.names != events.names {
                    return Err(ToolError::Fatal("events in data files don't match".into()));
                }
            }
        }
        let (_, agg) = state.as_mut().expect("set above");
        let collect_lines = opts.annotate && regular.is_none();
        agg.read_body(path, &mut reader, opts.diff && i == 0, collect_lines)?;
        inputs.push(regular.map(|m| Input {
            file,
            len: m.len(),
            modified: m.modified().ok(),
        }));
    }
    let (events, agg) = state.ok_or_else(|| ToolError::Fatal("no input files".into()))?;
    Ok(FirstPass {
        events,
        descs,
        cmds,
        agg,
        inputs,
    })
}

/// The second pass: the per-line counts of the files to annotate.
fn read_lines_again(
    opts: &AnnotateOptions,
    agg: &mut Agg,
    inputs: &mut [Option<Input>],
    ann_files: &[Vec<u8>],
) -> Result<(), ToolError> {
    let mut wanted = vec![false; agg.files.len()];
    for name in ann_files {
        if let Some(id) = agg.files.get(name) {
            wanted[id as usize] = true;
        }
    }
    for (i, (path, input)) in opts.files.iter().zip(inputs.iter_mut()).enumerate() {
        let Some(input) = input else { continue };
        let changed = || {
            ToolError::Fatal(format!(
                "{}: the file changed while it was being read",
                path.to_string_lossy()
            ))
        };
        let meta = input.file.metadata().map_err(|_| changed())?;
        if meta.len() != input.len || meta.modified().ok() != input.modified {
            return Err(changed());
        }
        input
            .file
            .seek(SeekFrom::Start(0))
            .map_err(|e| ToolError::Fatal(os_error_message(&e, path)))?;
        let (mut reader, _) = CgoutReader::new(&input.file).map_err(|_| changed())?;
        agg.read_lines(path, &mut reader, opts.diff && i == 0, &wanted)?;
    }
    Ok(())
}

fn print_metadata(
    out: &mut Vec<u8>,
    opts: &AnnotateOptions,
    events: &Events,
    descs: &[Vec<u8>],
    cmds: &[Vec<u8>],
) {
    fancy(out, b"Metadata");
    out.extend_from_slice(b"Invocation:       ");
    out.extend_from_slice(&opts.invocation);
    out.push(b'\n');
    if descs.windows(2).all(|w| w[0] == w[1]) {
        out.extend_from_slice(&descs[0]);
    } else {
        for (i, d) in descs.iter().enumerate() {
            out.extend_from_slice(format!("Description {}:\n", i + 1).as_bytes());
            out.extend_from_slice(d);
        }
    }
    if cmds.len() == 1 {
        out.extend_from_slice(b"Command:          ");
        out.extend_from_slice(&cmds[0]);
        out.push(b'\n');
    } else {
        for (i, cmd) in cmds.iter().enumerate() {
            if i > 0 && cmds[i - 1] == *cmd {
                out.extend_from_slice(
                    format!("Command {}:        (same as Command {i})\n", i + 1).as_bytes(),
                );
            } else {
                out.extend_from_slice(format!("Command {}:        ", i + 1).as_bytes());
                out.extend_from_slice(cmd);
                out.push(b'\n');
            }
        }
    }
    let list = |ids: &[usize]| -> String {
        ids.iter()
            .map(|&i| events.names[i].as_str())
            .collect::<Vec<_>>()
            .join(" ")
    };
    let all: Vec<usize> = (0..events.names.len()).collect();
    let text = format!(
        "Events recorded:  {}\nEvents shown:     {}\nEvent sort order: {}\nThreshold:        {}%\nAnnotation:       {}\n\n",
        list(&all),
        list(&events.show),
        list(&events.sort),
        crate::pytext::float_repr(opts.threshold),
        if opts.annotate { "on" } else { "off" }
    );
    out.extend_from_slice(text.as_bytes());
}

/// Runs `cg_annotate` with `opts`, writing the report to `w`.
pub fn annotate(opts: &AnnotateOptions, w: &mut dyn Write) -> Result<(), ToolError> {
    let FirstPass {
        events,
        descs,
        cmds,
        mut agg,
        mut inputs,
    } = read_all(opts)?;
    let mut out = Output::new(w);

    print_metadata(out.buf(), opts, &events, &descs, &cmds);

    let summary_printer = Printer::for_ccs(
        &events,
        &agg.summary,
        opts.show_percs,
        [agg.summary.as_slice()],
    );
    fancy(out.buf(), b"Summary");
    summary_printer.header(out.buf(), "");
    out.buf().push(b'\n');
    summary_printer.row(out.buf(), &agg.summary, None, b"PROGRAM TOTALS");
    out.buf().push(b'\n');

    let ann_files = sections::print_section(
        &mut out,
        sections::Kind::FileFunction,
        &events,
        &agg,
        opts.threshold,
        opts.show_percs,
    )?;
    sections::print_section(
        &mut out,
        sections::Kind::FunctionFile,
        &events,
        &agg,
        opts.threshold,
        opts.show_percs,
    )?;

    let mut result = Ok(());
    if opts.annotate {
        if inputs.iter().any(Option::is_some) {
            out.flush()?;
            read_lines_again(opts, &mut agg, &mut inputs, &ann_files)?;
        }
        let ctx = source::SourceContext {
            cgout_files: &opts.files,
            include_dirs: &opts.include_dirs,
            context: opts.context,
            show_percs: opts.show_percs,
        };
        let acc = source::print_annotated_files(&mut out, &events, &agg, &ann_files, &ctx)?;
        if let Err(msg) =
            source::print_annotation_summary(&mut out, &events, &agg, &acc, opts.show_percs)
        {
            result = Err(ToolError::Fatal(msg));
        }
    }
    out.flush()?;
    result
}
