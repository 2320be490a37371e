//! `cg_merge`: sums profiles into one `cachegrind.out` file, as the
//! current Python `cg_merge` writes it (spec §8), without its crash on
//! inputs that have no `desc:` lines.
//!
//! The output keeps the first file's `desc:` and `cmd:` lines, lists
//! files, functions and lines in the order first seen across the inputs,
//! and ends with the sum of the `summary:` lines.

use std::ffi::OsString;
use std::io::Write;

use crate::cc::{add_to, write_counts};
use crate::reader::{CgoutReader, Header, Record};
use crate::tool::{open_input, read_error, FxHashMap, Interner, ToolError};

/// One function of the merged data.
struct Func {
    name: u32,
    /// (line, offset of its counts in the arena), in first-seen order.
    lines: Vec<(i64, usize)>,
    /// Where the next line is likely to be in `lines`: inputs list a
    /// function's lines in the same order, so most lookups hit here.
    cursor: usize,
}

/// Merged cost data in first-seen order.
struct Merged {
    n: usize,
    names: Interner,
    /// (file name id, its functions as indices into `funcs`).
    files: Vec<(u32, Vec<usize>)>,
    file_index: FxHashMap<u32, usize>,
    funcs: Vec<Func>,
    func_index: FxHashMap<(usize, u32), usize>,
    /// (function, line) -> position in the function's `lines`.
    line_index: FxHashMap<(usize, i64), usize>,
    arena: Vec<i64>,
    summary: Vec<i64>,
}

impl Merged {
    /// The function `func` of file `fl`, created if new.
    fn func(&mut self, fl: u32, func: u32) -> usize {
        let file = match self.file_index.get(&fl) {
            Some(&f) => f,
            None => {
                self.files.push((fl, Vec::new()));
                self.file_index.insert(fl, self.files.len() - 1);
                self.files.len() - 1
            }
        };
        match self.func_index.get(&(file, func)) {
            Some(&f) => f,
            None => {
                self.funcs.push(Func {
                    name: func,
                    lines: Vec::new(),
                    cursor: 0,
                });
                let f = self.funcs.len() - 1;
                self.func_index.insert((file, func), f);
                self.files[file].1.push(f);
                f
            }
        }
    }

    /// The arena offset of the counts of `line` in function `f`, created
    /// if new.
    fn line_slot(&mut self, f: usize, line: i64) -> usize {
        let func = &mut self.funcs[f];
        if let Some(&(l, slot)) = func.lines.get(func.cursor) {
            if l == line {
                func.cursor += 1;
                return slot;
            }
        }
        match self.line_index.get(&(f, line)) {
            Some(&pos) => {
                func.cursor = pos + 1;
                func.lines[pos].1
            }
            None => {
                let slot = self.arena.len();
                self.arena.resize(slot + self.n, 0);
                self.line_index.insert((f, line), func.lines.len());
                func.lines.push((line, slot));
                func.cursor = func.lines.len();
                slot
            }
        }
    }
}

/// Merges `files` and writes the result to `w`.
pub fn merge(files: &[OsString], w: &mut dyn Write) -> Result<(), ToolError> {
    let mut first: Option<Header> = None;
    let mut m: Option<Merged> = None;
    for path in files {
        let file = open_input(path)?;
        let (mut reader, header) = CgoutReader::new(file).map_err(|e| read_error(path, e))?;
        let n = header.events.len();
        let merged = m.get_or_insert_with(|| Merged {
            n,
            names: Interner::default(),
            files: Vec::new(),
            file_index: FxHashMap::default(),
            funcs: Vec::new(),
            func_index: FxHashMap::default(),
            line_index: FxHashMap::default(),
            arena: Vec::new(),
            summary: vec![0; n],
        });
        // Events are compared after the whole file is read, as cg_merge
        // does; counts of a mismatched file are never used.
        let same_events = first.as_ref().is_none_or(|h| h.events == header.events);
        let mut fl = merged.names.intern(b"");
        let mut func = fl;
        // The function that count lines go to, once one has appeared.
        let mut current: Option<usize> = None;
        let unknown = merged.names.intern(b"???");
        let mut summary_present = false;
        loop {
            let record = match reader.next_record() {
                Ok(Some(r)) => r,
                Ok(None) => break,
                Err(e) => return Err(read_error(path, e)),
            };
            match record {
                Record::Counts { line, counts } => {
                    if same_events {
                        let f = match current {
                            Some(f) => f,
                            None => *current.insert(merged.func(fl, func)),
                        };
                        let slot = merged.line_slot(f, line);
                        add_to(&mut merged.arena[slot..slot + n], counts);
                    }
                }
                Record::Fn(name) => {
                    func = merged.names.intern(name);
                    current = None;
                }
                Record::Fl(name) => {
                    fl = merged.names.intern(name);
                    func = unknown;
                    current = None;
                }
                Record::Fi(name) => {
                    fl = merged.names.intern(name);
                    current = None;
                }
                Record::Summary(counts) => {
                    summary_present = true;
                    if same_events {
                        add_to(&mut merged.summary, counts);
                    }
                }
            }
        }
        if !summary_present {
            return Err(read_error(
                path,
                reader.error("missing `summary:` line, aborting"),
            ));
        }
        if !same_events {
            return Err(ToolError::Fatal("events in data files don't match".into()));
        }
        if first.is_none() {
            first = Some(header);
        }
    }
    let (Some(header), Some(m)) = (first, m) else {
        return Err(ToolError::Fatal("no input files".into()));
    };

    let mut out = Vec::with_capacity(1 << 17);
    for d in &header.desc {
        out.extend_from_slice(b"desc: ");
        out.extend_from_slice(d);
        out.push(b'\n');
    }
    out.extend_from_slice(b"cmd: ");
    out.extend_from_slice(&header.cmd);
    out.extend_from_slice(b"\nevents:");
    for e in &header.events {
        out.push(b' ');
        out.extend_from_slice(e.as_bytes());
    }
    out.push(b'\n');
    for (fl, funcs) in &m.files {
        out.extend_from_slice(b"fl=");
        out.extend_from_slice(m.names.name(*fl));
        out.push(b'\n');
        for &f in funcs {
            let func = &m.funcs[f];
            out.extend_from_slice(b"fn=");
            out.extend_from_slice(m.names.name(func.name));
            out.push(b'\n');
            for &(line, slot) in &func.lines {
                crate::cc::push_int(&mut out, line);
                write_counts(&mut out, "", &m.arena[slot..slot + m.n]);
                if out.len() >= 1 << 16 {
                    w.write_all(&out)?;
                    out.clear();
                }
            }
        }
    }
    write_counts(&mut out, "summary:", &m.summary);
    w.write_all(&out)?;
    w.flush()?;
    Ok(())
}
