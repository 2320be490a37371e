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

/// Merged cost data in first-seen order.
struct Merged {
    n: usize,
    names: Interner,
    /// (file name id, index of its first function in `funcs` order).
    files: Vec<(u32, Vec<usize>)>,
    file_index: FxHashMap<u32, usize>,
    /// (function name id, lines in first-seen order).
    funcs: Vec<(u32, Vec<(i64, usize)>)>,
    func_index: FxHashMap<(usize, u32), usize>,
    line_index: FxHashMap<(usize, i64), usize>,
    arena: Vec<i64>,
    summary: Vec<i64>,
}

impl Merged {
    fn cc_slot(&mut self, fl: u32, func: u32, line: i64) -> usize {
        let file = match self.file_index.get(&fl) {
            Some(&f) => f,
            None => {
                self.files.push((fl, Vec::new()));
                self.file_index.insert(fl, self.files.len() - 1);
                self.files.len() - 1
            }
        };
        let f = match self.func_index.get(&(file, func)) {
            Some(&f) => f,
            None => {
                self.funcs.push((func, Vec::new()));
                let f = self.funcs.len() - 1;
                self.func_index.insert((file, func), f);
                self.files[file].1.push(f);
                f
            }
        };
        match self.line_index.get(&(f, line)) {
            Some(&slot) => slot,
            None => {
                let slot = self.arena.len();
                self.arena.resize(slot + self.n, 0);
                self.line_index.insert((f, line), slot);
                self.funcs[f].1.push((line, slot));
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
                        let slot = merged.cc_slot(fl, func, line);
                        add_to(&mut merged.arena[slot..slot + n], counts);
                    }
                }
                Record::Fn(name) => func = merged.names.intern(name),
                Record::Fl(name) => {
                    fl = merged.names.intern(name);
                    func = unknown;
                }
                Record::Fi(name) => fl = merged.names.intern(name),
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
            let (name, lines) = &m.funcs[f];
            out.extend_from_slice(b"fn=");
            out.extend_from_slice(m.names.name(*name));
            out.push(b'\n');
            for &(line, slot) in lines {
                write_counts(&mut out, &line.to_string(), &m.arena[slot..slot + m.n]);
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
