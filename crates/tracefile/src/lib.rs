//! Readers for recorded address traces (Valgrind Lackey's `--trace-mem=yes`
//! output, Dinero IV's `din` format) that feed the simulation seam.
//!
//! A trace is read in large chunks and parsed on the bytes, with no
//! allocation per line; its accesses are handed to a [`Tool`] one at a time
//! as [`events`] records, [`Record::Instr`] for an instruction fetch and
//! [`Record::Data`] for a data access. A trace has no block metadata, so it
//! never yields [`Record::Block`]. Errors name the line (the caller adds
//! the file name).
#![forbid(unsafe_code)]

mod din;
mod lackey;
mod lines;
mod num;

use std::fmt;
use std::io::{self, Read};

use events::{AccessKind, DataRef, InstrFetch, Record, Tool};

/// The record of one trace line: an instruction fetch of `size` bytes at
/// `addr` when `kind` is `None`, else a data access of that kind.
#[inline(always)]
fn record(kind: Option<AccessKind>, addr: u64, size: u32) -> Record {
    match kind {
        None => Record::Instr(InstrFetch { addr, len: size }),
        Some(kind) => Record::Data(DataRef { addr, size, kind }),
    }
}

/// A trace file format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// `valgrind --tool=lackey --trace-mem=yes` output: `I  addr,size`,
    /// ` L addr,size`, ` S addr,size`, ` M addr,size` (hex address, decimal
    /// size); every other line (banners, program output) is skipped.
    Lackey,
    /// Dinero's `din` format: `label hexaddr [size]` per line, label 0 =
    /// read, 1 = write, 2 = instruction fetch, 3 and 4 = escape records
    /// (skipped). Without a size, an access is 4 bytes at the address
    /// rounded down to 4, as Dinero IV reads `din`. Anything after the
    /// fields is a comment.
    Din,
}

impl Format {
    /// The format named `name` (`lackey` or `din`).
    pub fn from_name(name: &str) -> Option<Format> {
        match name {
            "lackey" => Some(Format::Lackey),
            "din" => Some(Format::Din),
            _ => None,
        }
    }
}

/// Why a trace could not be read.
#[derive(Debug)]
pub enum TraceError {
    /// Reading failed.
    Io(io::Error),
    /// Line `line` (1-based) is not valid in the format.
    Malformed {
        /// 1-based line number.
        line: u64,
        /// What is wrong with it.
        reason: &'static str,
    },
}

impl fmt::Display for TraceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TraceError::Io(e) => write!(f, "{e}"),
            TraceError::Malformed { line, reason } => write!(f, "line {line}: {reason}"),
        }
    }
}

impl std::error::Error for TraceError {}

/// Counts of what a trace held.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TraceStats {
    /// Lines read.
    pub lines: u64,
    /// Records delivered.
    pub events: u64,
}

/// Reads the whole trace from `input` in `format`, handing each of its
/// records to `tool` ([`Tool::record`]) in trace order.
pub fn read_trace<R: Read, T: Tool + ?Sized>(
    input: R,
    format: Format,
    tool: &mut T,
) -> Result<TraceStats, TraceError> {
    // One monomorphised loop per format and tool, so that the parser and
    // the tool inline into one loop and a record's kind is branched on
    // once: a tool behind a call made replay 5% slower.
    match format {
        Format::Lackey => drive(input, lackey::parse_record, lackey::parse_line, tool),
        Format::Din => drive(input, |_| None, din::parse_line, tool),
    }
}

/// The reading loop: `fast` parses a well-formed record at the start of
/// its input, returning it and the bytes used including the newline;
/// anything it declines goes through `line`, which classifies the line
/// (skip, record, or error) on its own.
fn drive<R: Read, T: Tool + ?Sized>(
    input: R,
    fast: impl Fn(&[u8]) -> Option<(Record, usize)>,
    line: impl Fn(&[u8]) -> Result<Option<Record>, &'static str>,
    tool: &mut T,
) -> Result<TraceStats, TraceError> {
    let mut stats = TraceStats::default();
    lines::for_each_chunk(input, |chunk| {
        let mut pos = 0;
        while pos < chunk.len() {
            let rest = &chunk[pos..];
            stats.lines += 1;
            // One call site for the tool, so that it inlines here.
            let (r, used) = match fast(rest) {
                Some(parsed) => parsed,
                None => {
                    let len = rest.iter().position(|&b| b == b'\n').unwrap_or(rest.len());
                    match line(&rest[..len]) {
                        Ok(Some(r)) => (r, len + 1),
                        Ok(None) => {
                            pos += len + 1;
                            continue;
                        }
                        Err(reason) => {
                            return Err(TraceError::Malformed {
                                line: stats.lines,
                                reason,
                            })
                        }
                    }
                }
            };
            stats.events += 1;
            tool.record(r);
            pos += used;
        }
        Ok(())
    })?;
    Ok(stats)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tool that keeps every record.
    #[derive(Default)]
    struct Keep(Vec<Record>);

    impl Tool for Keep {
        fn needs(&self) -> events::Needs {
            events::Needs::COUNTING
        }
        fn record(&mut self, r: Record) {
            self.0.push(r);
        }
    }

    fn records(text: &str, format: Format) -> Result<Vec<Record>, TraceError> {
        let mut keep = Keep::default();
        read_trace(text.as_bytes(), format, &mut keep)?;
        Ok(keep.0)
    }

    /// A record as `(kind, address, size)`, `None` for an instruction.
    fn fields(r: &Record) -> (Option<AccessKind>, u64, u32) {
        match *r {
            Record::Instr(f) => (None, f.addr, f.len),
            Record::Data(d) => (Some(d.kind), d.addr, d.size),
            other => panic!("not a trace record: {other:?}"),
        }
    }

    const R: Option<AccessKind> = Some(AccessKind::Read);
    const W: Option<AccessKind> = Some(AccessKind::Write);

    #[test]
    fn lackey_trace() {
        let text = "==123== Lackey, an example Valgrind tool\n\
                    I  04000000,3\nI  junk\n L 1ffefffd40,8\n S 04022e08,8\n M 1ffefffd38,4\n\
                    ==123== \nI  0401a6f0,19";
        let err = records(text, Format::Lackey).unwrap_err();
        assert_eq!(err.to_string(), "line 3: malformed address");
        let text = text.replace("I  junk\n", "");
        let got: Vec<_> = records(&text, Format::Lackey)
            .unwrap()
            .iter()
            .map(fields)
            .collect();
        let want = [
            (None, 0x0400_0000, 3),
            (R, 0x1f_feff_fd40, 8),
            (W, 0x0402_2e08, 8),
            (Some(AccessKind::Modify), 0x1f_feff_fd38, 4),
            (None, 0x0401_a6f0, 19),
        ];
        assert_eq!(got, want);
    }

    #[test]
    fn din_trace() {
        let got: Vec<_> = records(
            "2 400000\n0 1000 8\n\n1 7ffe 2 comment\n3 0\n0 1003\n",
            Format::Din,
        )
        .unwrap()
        .iter()
        .map(fields)
        .collect();
        assert_eq!(
            got,
            [
                (None, 0x40_0000, 4),
                (R, 0x1000, 8),
                (W, 0x7ffe, 2),
                (R, 0x1000, 4),
            ]
        );
        let err = records("0 1000\n9 1000\n", Format::Din).unwrap_err();
        assert_eq!(err.to_string(), "line 2: unknown label (expected 0 to 4)");
    }

    #[test]
    fn line_numbers_survive_chunk_boundaries() {
        // About 1.6 MB: more than one read buffer.
        let mut text = "==1== banner\n".to_string();
        for i in 0..100_000u64 {
            text.push_str(&format!(
                "I  {:08x},4\n L {:x},8\r\n",
                0x40_0000 + i * 4,
                i * 8
            ));
        }
        let stats = read_trace(text.as_bytes(), Format::Lackey, &mut Keep::default()).unwrap();
        assert_eq!(
            stats,
            TraceStats {
                lines: 200_001,
                events: 200_000
            }
        );
        text.push_str(" S 10,\n");
        // Records before the bad line have been delivered.
        let mut keep = Keep::default();
        let err = read_trace(text.as_bytes(), Format::Lackey, &mut keep).unwrap_err();
        assert_eq!(err.to_string(), "line 200002: malformed size");
        assert_eq!(keep.0.len(), 200_000);
    }

    #[test]
    fn format_names() {
        assert_eq!(Format::from_name("din"), Some(Format::Din));
        assert_eq!(Format::from_name("lackey"), Some(Format::Lackey));
        assert_eq!(Format::from_name("pin"), None);
    }
}
