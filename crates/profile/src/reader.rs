//! A streaming reader of the `cachegrind.out` format (spec §5 and §7.2).
//!
//! The reader works line by line over any byte source, reusing one line
//! buffer and one count buffer: nothing is allocated per line or per count,
//! and the whole file is never held in memory. Consumers (annotate, merge,
//! diff, [`crate::Profile::read_from`]) see a header and then a sequence of
//! [`Record`]s, and keep only the aggregates they need.
//!
//! The accepted syntax is that of Valgrind's Python tools, with their error
//! messages and line numbers, plus two forms of older files that they
//! reject: `.` as a zero count, and `fi=`/`fe=` lines that switch the file
//! within a function.

use std::fmt;
use std::io::{self, Read};

use crate::lines::{Line, LineReader};
use crate::pytext;

/// The header of a `cachegrind.out` file.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Header {
    /// The value of each `desc:` line (after the key and its whitespace).
    pub desc: Vec<Vec<u8>>,
    /// The value of the `cmd:` line.
    pub cmd: Vec<u8>,
    /// The event names of the `events:` line.
    pub events: Vec<String>,
    /// The raw value of the `events:` line.
    pub events_text: Vec<u8>,
}

/// One body line that carries data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Record<'a> {
    /// A count line: its line number and one count per event (missing
    /// trailing counts are zeros).
    Counts {
        /// The source line number (0 = unknown).
        line: i64,
        /// One count per event.
        counts: &'a [i64],
    },
    /// `fl=NAME`: a new file; the function is unknown until `fn=`.
    Fl(&'a [u8]),
    /// `fi=NAME` or `fe=NAME` (older format): the file changes, the
    /// function does not.
    Fi(&'a [u8]),
    /// `fn=NAME`.
    Fn(&'a [u8]),
    /// `summary:` with one count per event.
    Summary(&'a [i64]),
}

/// Why reading failed.
#[derive(Debug)]
pub enum ReadError {
    /// The underlying reader failed.
    Io(io::Error),
    /// The text is not a valid profile: the 1-based line number and the
    /// message Valgrind's tools give.
    Format {
        /// Line number, counted as the Python tools count it.
        line: u64,
        /// The message, e.g. ``missing an `events:` line``.
        msg: String,
    },
}

impl fmt::Display for ReadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReadError::Io(e) => write!(f, "{e}"),
            ReadError::Format { line, msg } => write!(f, "{line}: {msg}"),
        }
    }
}

impl std::error::Error for ReadError {}

impl From<io::Error> for ReadError {
    fn from(e: io::Error) -> Self {
        ReadError::Io(e)
    }
}

/// The message for a bad count line or `summary:` line.
pub const MALFORMED_COUNTS: &str = "malformed or too many event counts";

/// The streaming reader. See the module documentation.
pub struct CgoutReader<R> {
    lines: LineReader<R>,
    line_num: u64,
    /// The counts of the current record, one per event.
    counts: Vec<i64>,
}

/// The value of a `key:\s+(.*)` header line, as Python's `re.match` finds
/// it: at least one whitespace character after the key (the line's own
/// newline counts), then everything after the whitespace.
fn header_value<'a>(line: &Line<'a>, key: &[u8]) -> Option<&'a [u8]> {
    let rest = line.text.strip_prefix(key)?;
    if rest.is_empty() {
        return line.terminated.then_some(rest);
    }
    pytext::space_len(rest)?;
    Some(pytext::trim_start(rest))
}

/// The name after a 3-byte `xx=` prefix, minus the line's last character
/// as the tools take it (`line[3:-1]`).
fn name_after_prefix<'a>(line: &Line<'a>) -> &'a [u8] {
    let name = &line.text[3..];
    if line.terminated {
        name
    } else {
        pytext::drop_last_char(name)
    }
}

impl<R: Read> CgoutReader<R> {
    /// Reads the header (`desc:`, `cmd:` and `events:` lines).
    pub fn new(inner: R) -> Result<(Self, Header), ReadError> {
        let mut r = CgoutReader {
            lines: LineReader::new(inner),
            line_num: 0,
            counts: Vec::new(),
        };
        let mut header = Header::default();
        // `desc:` lines, then the `cmd:` line.
        loop {
            r.line_num += 1;
            let line = r.lines.next_line()?;
            if let Some(line) = &line {
                if let Some(v) = header_value(line, b"desc:") {
                    header.desc.push(v.to_vec());
                    continue;
                }
                if let Some(v) = header_value(line, b"cmd:") {
                    header.cmd = v.to_vec();
                    break;
                }
            }
            return Err(r.error("missing a `command:` line"));
        }
        r.line_num += 1;
        match r.lines.next_line()? {
            Some(line) => match header_value(&line, b"events:") {
                Some(v) => {
                    header.events_text = v.to_vec();
                    header.events = pytext::split_whitespace(v)
                        .map(|e| String::from_utf8_lossy(e).into_owned())
                        .collect();
                }
                None => return Err(r.error("missing an `events:` line")),
            },
            None => return Err(r.error("missing an `events:` line")),
        }
        r.counts = vec![0; header.events.len()];
        Ok((r, header))
    }

    /// The number of lines read so far, counting the read that found the
    /// end of the input, as the Python tools number lines in messages.
    pub fn line_num(&self) -> u64 {
        self.line_num
    }

    /// A format error at the current line.
    pub fn error(&self, msg: impl Into<String>) -> ReadError {
        ReadError::Format {
            line: self.line_num,
            msg: msg.into(),
        }
    }

    /// The next record, skipping blank and comment lines, or `None` at the
    /// end of the input.
    pub fn next_record(&mut self) -> Result<Option<Record<'_>>, ReadError> {
        loop {
            self.line_num += 1;
            if !self.lines.advance()? {
                return Ok(None);
            }
            let text = self.lines.current().text;
            if !(text.is_empty() || text[0] == b'#') {
                break;
            }
        }
        let line = self.lines.current();
        let text = line.text;
        let line_num = self.line_num;
        let bad = |msg: &str| ReadError::Format {
            line: line_num,
            msg: msg.into(),
        };
        if text[0].is_ascii_digit() {
            // Nearly every line is a count line, nearly always ASCII.
            let line_no = match parse_ascii_count_line(text, &mut self.counts) {
                Fast::Done(line) => line,
                Fast::NotAscii => {
                    parse_count_line(pytext::split_whitespace(text), &mut self.counts)
                }
            };
            return match line_no {
                Some(line) => Ok(Some(Record::Counts {
                    line,
                    counts: &self.counts,
                })),
                None => Err(bad(MALFORMED_COUNTS)),
            };
        }
        if text.starts_with(b"fn=") {
            return Ok(Some(Record::Fn(name_after_prefix(&line))));
        }
        if text.starts_with(b"fl=") {
            return Ok(Some(Record::Fl(name_after_prefix(&line))));
        }
        if let Some(v) = header_value(&line, b"summary:") {
            if !parse_counts(pytext::split_whitespace(v), &mut self.counts) {
                return Err(bad(MALFORMED_COUNTS));
            }
            return Ok(Some(Record::Summary(&self.counts)));
        }
        if text.starts_with(b"fi=") || text.starts_with(b"fe=") {
            return Ok(Some(Record::Fi(name_after_prefix(&line))));
        }
        let shown = if line.terminated {
            text
        } else {
            pytext::drop_last_char(text)
        };
        Err(bad(&format!(
            "malformed line: {}",
            String::from_utf8_lossy(shown)
        )))
    }
}

/// Parses a count line's tokens: the line number, returned, then the
/// counts into `out`.
#[inline]
fn parse_count_line<'a>(
    mut tokens: impl Iterator<Item = &'a [u8]>,
    out: &mut [i64],
) -> Option<i64> {
    let line = pytext::parse_int(tokens.next()?)?;
    parse_counts(tokens, out).then_some(line)
}

/// The result of [`parse_ascii_count_line`].
enum Fast {
    /// The line was ASCII: the line number, or `None` if malformed.
    Done(Option<i64>),
    /// The line has non-ASCII bytes, which may be Unicode whitespace:
    /// only the general parser can tell.
    NotAscii,
}

/// [`parse_count_line`] for an ASCII line, scanning each byte once: plain
/// decimal tokens are converted as they are found; anything else (signs,
/// underscores, `.`, long numbers) goes through the general parser.
#[inline]
fn parse_ascii_count_line(text: &[u8], out: &mut [i64]) -> Fast {
    let mut i = 0;
    let mut line = None;
    let mut n = 0;
    loop {
        while i < text.len() && pytext::is_ascii_space(text[i]) {
            i += 1;
        }
        if i == text.len() {
            break;
        }
        let start = i;
        let mut v: i64 = 0;
        while i < text.len() {
            let d = text[i].wrapping_sub(b'0');
            if d >= 10 {
                break;
            }
            v = v.wrapping_mul(10).wrapping_add(i64::from(d));
            i += 1;
        }
        // Up to 18 digits cannot overflow.
        let plain =
            i > start && i - start <= 18 && (i == text.len() || pytext::is_ascii_space(text[i]));
        if !plain {
            while i < text.len() && !pytext::is_ascii_space(text[i]) {
                if text[i] >= 0x80 {
                    return Fast::NotAscii;
                }
                i += 1;
            }
            let tok = &text[start..i];
            v = match (line, tok) {
                (Some(_), b".") => 0,
                _ => match pytext::parse_int(tok) {
                    Some(v) => v,
                    None => return Fast::Done(None),
                },
            };
        }
        if line.is_none() {
            line = Some(v);
        } else {
            match out.get_mut(n) {
                Some(slot) => *slot = v,
                None => return Fast::Done(None),
            }
            n += 1;
        }
    }
    out[n..].fill(0);
    Fast::Done(line)
}

/// Parses count tokens into `out`, zero-filling missing trailing counts.
/// False if a token is not an integer (or `.`) or there are too many.
#[inline]
fn parse_counts<'a>(tokens: impl Iterator<Item = &'a [u8]>, out: &mut [i64]) -> bool {
    let mut n = 0;
    for tok in tokens {
        let Some(slot) = out.get_mut(n) else {
            return false;
        };
        *slot = if tok == b"." {
            0
        } else {
            match pytext::parse_int(tok) {
                Some(v) => v,
                None => return false,
            }
        };
        n += 1;
    }
    out[n..].fill(0);
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read_all(text: &[u8]) -> Result<(Header, Vec<String>), ReadError> {
        let (mut r, h) = CgoutReader::new(text)?;
        let mut out = Vec::new();
        while let Some(rec) = r.next_record()? {
            out.push(match rec {
                Record::Counts { line, counts } => format!("{line} {counts:?}"),
                Record::Fl(n) => format!("fl {}", String::from_utf8_lossy(n)),
                Record::Fi(n) => format!("fi {}", String::from_utf8_lossy(n)),
                Record::Fn(n) => format!("fn {}", String::from_utf8_lossy(n)),
                Record::Summary(c) => format!("summary {c:?}"),
            });
        }
        Ok((h, out))
    }

    fn format_error(text: &[u8]) -> (u64, String) {
        match read_all(text) {
            Err(ReadError::Format { line, msg }) => (line, msg),
            other => panic!("expected a format error, got {other:?}"),
        }
    }

    #[test]
    fn reads_header_and_records() {
        let (h, recs) = read_all(
            b"desc: I1 cache: x\ndesc:\t  two  \ncmd:  ./prog a\nevents: Ir Dr \n\
              fl=a.c\nfn=main\n# comment\n\n3 1 2\n4 5\n5 . 7\nfi=b.h\n6 1_0\n\
              summary: 20 9\n",
        )
        .unwrap();
        assert_eq!(h.desc, vec![b"I1 cache: x".to_vec(), b"two  ".to_vec()]);
        assert_eq!(h.cmd, b"./prog a");
        assert_eq!(h.events, vec!["Ir", "Dr"]);
        assert_eq!(h.events_text, b"Ir Dr ");
        assert_eq!(
            recs,
            vec![
                "fl a.c",
                "fn main",
                "3 [1, 2]",
                "4 [5, 0]",
                "5 [0, 7]",
                "fi b.h",
                "6 [10, 0]",
                "summary [20, 9]"
            ]
        );
    }

    #[test]
    fn crlf_and_missing_final_newline() {
        let (h, recs) = read_all(b"cmd: x\r\nevents: A\r\nfl=f\r\nfn=g\r\n1 2\r\nfn=last").unwrap();
        assert_eq!(h.cmd, b"x");
        // Like `line[3:-1]`, a name on a last line without newline loses
        // its last character.
        assert_eq!(recs, vec!["fl f", "fn g", "1 [2]", "fn las"]);
    }

    #[test]
    fn empty_header_values() {
        let (h, _) = read_all(b"desc:\ncmd:\nevents:   \n").unwrap();
        assert_eq!(h.desc, vec![Vec::<u8>::new()]);
        assert!(h.cmd.is_empty() && h.events.is_empty());
    }

    #[test]
    fn errors_have_python_wording_and_line_numbers() {
        assert_eq!(format_error(b""), (1, "missing a `command:` line".into()));
        assert_eq!(
            format_error(b"desc: a\ncmd:x\n"),
            (2, "missing a `command:` line".into())
        );
        assert_eq!(
            format_error(b"cmd: a\n"),
            (2, "missing an `events:` line".into())
        );
        assert_eq!(
            format_error(b"cmd: a\nevent: A\n"),
            (2, "missing an `events:` line".into())
        );
        assert_eq!(
            format_error(b"cmd: a\nevents: A\n1 2 3\n"),
            (3, MALFORMED_COUNTS.into())
        );
        assert_eq!(
            format_error(b"cmd: a\nevents: A\n1x 2\n"),
            (3, MALFORMED_COUNTS.into())
        );
        assert_eq!(
            format_error(b"cmd: a\nevents: A\n1 -\n"),
            (3, MALFORMED_COUNTS.into())
        );
        assert_eq!(
            format_error(b"cmd: a\nevents: A\nsummary: 1 2\n"),
            (3, MALFORMED_COUNTS.into())
        );
        assert_eq!(
            format_error(b"cmd: a\nevents: A\n\ntotals: 1\n"),
            (4, "malformed line: totals: 1".into())
        );
        assert_eq!(
            format_error(b"cmd: a\nevents: A\n  \n"),
            (3, "malformed line:   ".into())
        );
        assert_eq!(
            format_error(b"cmd: a\nevents: A\nsummary:"),
            (3, "malformed line: summary".into())
        );
    }

    #[test]
    fn fast_count_parser_agrees_with_the_general_one() {
        let lines: &[&[u8]] = &[
            b"1",
            b"1 2 3",
            b"12  3\t4 ",
            b"7 . 5",
            b"7 +5 -6",
            b"1_0 2_0",
            b"007 08",
            b"5 999999999999999999",
            b"5 9999999999999999999",
            b"5 9223372036854775807 -9223372036854775808",
            b"5 1 2 3 4",
            b"5x 1",
            b"5 1x",
            b"5 1__0",
            b"5 --1",
            b"5\x0b6\x1c7",
        ];
        // Non-ASCII text, even after a malformed token, goes to the
        // general parser: U+00A0 is whitespace to Python.
        assert!(matches!(
            parse_ascii_count_line(b"5 1\xc2\xa02", &mut [0; 3]),
            Fast::NotAscii
        ));
        assert!(matches!(
            parse_ascii_count_line(b"5 x\xc2\xa02", &mut [0; 3]),
            Fast::NotAscii
        ));
        for line in lines {
            let (mut fast, mut slow) = (vec![9; 3], vec![9; 3]);
            let Fast::Done(f) = parse_ascii_count_line(line, &mut fast) else {
                panic!("ASCII input");
            };
            let s = parse_count_line(pytext::split_whitespace(line), &mut slow);
            assert_eq!(f, s, "{}", String::from_utf8_lossy(line));
            if f.is_some() {
                assert_eq!(fast, slow, "{}", String::from_utf8_lossy(line));
            }
        }
    }

    #[test]
    fn line_count_includes_the_final_read() {
        let (mut r, _) = CgoutReader::new(&b"cmd: a\nevents: A\n1 1\n"[..]).unwrap();
        while r.next_record().unwrap().is_some() {}
        assert_eq!(r.line_num(), 4);
    }
}
