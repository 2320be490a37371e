//! Readers for recorded address traces (Valgrind Lackey's `--trace-mem=yes`
//! output, Dinero IV's `din` format) that feed the simulation seam.
//!
//! A trace is read in large chunks and parsed on the bytes, with no
//! allocation per line; each access is handed to a callback as an
//! [`Event`]. Errors name the line (the caller adds the file name).
#![forbid(unsafe_code)]

mod din;
mod lackey;
mod lines;
mod num;

use std::fmt;
use std::io::{self, Read};

/// What kind of memory access an event is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// An instruction fetch (one executed instruction).
    Instr,
    /// A data load.
    Read,
    /// A data store.
    Write,
    /// A read-modify-write of one location (Lackey's `M`); Cachegrind
    /// counts it once, as a read.
    Modify,
}

/// One access of a trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Event {
    /// The kind of access.
    pub access: Access,
    /// Its first byte's address.
    pub addr: u64,
    /// Its size in bytes.
    pub size: u32,
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
    /// Events delivered.
    pub events: u64,
}

/// Reads the whole trace from `input` in `format`, calling `on_event` for
/// each access in trace order.
pub fn read_trace<R: Read>(
    input: R,
    format: Format,
    on_event: impl FnMut(Event),
) -> Result<TraceStats, TraceError> {
    // One monomorphised loop per format, so the parsers inline.
    match format {
        Format::Lackey => drive(input, lackey::parse_record, lackey::parse_line, on_event),
        Format::Din => drive(input, |_| None, din::parse_line, on_event),
    }
}

/// The reading loop: `fast` parses a well-formed record at the start of
/// its input, returning it and the bytes used including the newline;
/// anything it declines goes through `line`, which classifies the line
/// (skip, event, or error) on its own.
fn drive<R: Read>(
    input: R,
    fast: impl Fn(&[u8]) -> Option<(Event, usize)>,
    line: impl Fn(&[u8]) -> Result<Option<Event>, &'static str>,
    mut on_event: impl FnMut(Event),
) -> Result<TraceStats, TraceError> {
    let mut stats = TraceStats::default();
    lines::for_each_chunk(input, |chunk| {
        let mut pos = 0;
        while pos < chunk.len() {
            let rest = &chunk[pos..];
            stats.lines += 1;
            if let Some((ev, used)) = fast(rest) {
                stats.events += 1;
                on_event(ev);
                pos += used;
                continue;
            }
            let len = rest.iter().position(|&b| b == b'\n').unwrap_or(rest.len());
            match line(&rest[..len]) {
                Ok(Some(ev)) => {
                    stats.events += 1;
                    on_event(ev);
                }
                Ok(None) => {}
                Err(reason) => {
                    return Err(TraceError::Malformed {
                        line: stats.lines,
                        reason,
                    })
                }
            }
            pos += len + 1;
        }
        Ok(())
    })?;
    Ok(stats)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn events(text: &str, format: Format) -> Result<Vec<Event>, TraceError> {
        let mut v = Vec::new();
        read_trace(text.as_bytes(), format, |e| v.push(e))?;
        Ok(v)
    }

    #[test]
    fn lackey_trace() {
        let text = "==123== Lackey, an example Valgrind tool\n\
                    I  04000000,3\nI  junk\n L 1ffefffd40,8\n S 04022e08,8\n M 1ffefffd38,4\n\
                    ==123== \nI  0401a6f0,19";
        let ev = events(text, Format::Lackey).unwrap_err();
        assert_eq!(ev.to_string(), "line 3: malformed address");
        let text = text.replace("I  junk\n", "");
        let ev = events(&text, Format::Lackey).unwrap();
        let want = [
            (Access::Instr, 0x0400_0000, 3),
            (Access::Read, 0x1f_feff_fd40, 8),
            (Access::Write, 0x0402_2e08, 8),
            (Access::Modify, 0x1f_feff_fd38, 4),
            (Access::Instr, 0x0401_a6f0, 19),
        ];
        let got: Vec<_> = ev.iter().map(|e| (e.access, e.addr, e.size)).collect();
        assert_eq!(got, want);
    }

    #[test]
    fn din_trace() {
        let ev = events(
            "2 400000\n0 1000 8\n\n1 7ffe 2 comment\n3 0\n0 1003\n",
            Format::Din,
        )
        .unwrap();
        let got: Vec<_> = ev.iter().map(|e| (e.access, e.addr, e.size)).collect();
        assert_eq!(
            got,
            [
                (Access::Instr, 0x40_0000, 4),
                (Access::Read, 0x1000, 8),
                (Access::Write, 0x7ffe, 2),
                (Access::Read, 0x1000, 4),
            ]
        );
        let err = events("0 1000\n9 1000\n", Format::Din).unwrap_err();
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
        let stats = read_trace(text.as_bytes(), Format::Lackey, |_| {}).unwrap();
        assert_eq!(
            stats,
            TraceStats {
                lines: 200_001,
                events: 200_000
            }
        );
        text.push_str(" S 10,\n");
        let err = read_trace(text.as_bytes(), Format::Lackey, |_| {}).unwrap_err();
        assert_eq!(err.to_string(), "line 200002: malformed size");
    }

    #[test]
    fn format_names() {
        assert_eq!(Format::from_name("din"), Some(Format::Din));
        assert_eq!(Format::from_name("lackey"), Some(Format::Lackey));
        assert_eq!(Format::from_name("pin"), None);
    }
}
