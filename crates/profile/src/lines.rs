//! A line reader with Python's "universal newlines": `\n`, `\r\n` and a lone
//! `\r` all end a line.
//!
//! Valgrind's Python tools open both `cachegrind.out` files and source files
//! in text mode, which translates every line ending to `\n`. Reading the same
//! way keeps line numbers and line contents identical to theirs, also for
//! files written on other systems. The reader hands out slices of its own
//! buffer, so reading a file allocates nothing per line.

use std::io::{self, Read};

/// Initial buffer size; the buffer grows only for lines longer than this.
const BUF_SIZE: usize = 1 << 16;

/// Reads lines with universal newlines from any byte source.
pub struct LineReader<R> {
    inner: R,
    buf: Vec<u8>,
    /// Start of the unread data in `buf`.
    start: usize,
    /// End of the valid data in `buf`.
    end: usize,
    eof: bool,
    /// The current line: its text range in `buf` and whether a terminator
    /// ended it.
    current: (usize, usize, bool),
}

/// One line: its text without the terminator, and whether a terminator
/// ended it (only the last line of a file can lack one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Line<'a> {
    /// The text, without `\n`, `\r\n` or `\r`.
    pub text: &'a [u8],
    /// True if a line terminator followed the text.
    pub terminated: bool,
}

impl<R: Read> LineReader<R> {
    /// A reader over `inner`. No buffering is needed in `inner`.
    pub fn new(inner: R) -> Self {
        LineReader {
            inner,
            buf: vec![0; BUF_SIZE],
            start: 0,
            end: 0,
            eof: false,
            current: (0, 0, false),
        }
    }

    /// Reads more data after `end`, compacting or growing the buffer first.
    /// Returns false at end of input.
    fn fill(&mut self) -> io::Result<bool> {
        if self.eof {
            return Ok(false);
        }
        if self.start > 0 {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        if self.end == self.buf.len() {
            let new_len = self.buf.len() * 2;
            self.buf.resize(new_len, 0);
        }
        loop {
            match self.inner.read(&mut self.buf[self.end..]) {
                Ok(0) => {
                    self.eof = true;
                    return Ok(false);
                }
                Ok(n) => {
                    self.end += n;
                    return Ok(true);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
    }

    /// The next line, or `None` at end of input.
    pub fn next_line(&mut self) -> io::Result<Option<Line<'_>>> {
        Ok(if self.advance()? {
            Some(self.current())
        } else {
            None
        })
    }

    /// The line found by the last successful [`LineReader::advance`].
    pub fn current(&self) -> Line<'_> {
        let (start, end, terminated) = self.current;
        Line {
            text: &self.buf[start..end],
            terminated,
        }
    }

    /// Moves to the next line, which [`LineReader::current`] then returns.
    /// False at end of input.
    pub fn advance(&mut self) -> io::Result<bool> {
        // Where to resume searching for a terminator, relative to `start`,
        // so that refills do not rescan a long line from its beginning.
        let mut scanned = 0;
        loop {
            let data = &self.buf[self.start..self.end];
            if let Some(pos) = memchr::memchr2(b'\n', b'\r', &data[scanned..]) {
                let pos = scanned + pos;
                let consumed = if data[pos] == b'\n' {
                    pos + 1
                } else if pos + 1 < data.len() {
                    // `\r\n` is one terminator, a lone `\r` another.
                    pos + 1 + usize::from(data[pos + 1] == b'\n')
                } else if !self.eof {
                    // A `\r` at the end of the data: whether a `\n` follows
                    // is only known after reading more.
                    scanned = pos;
                    self.fill()?;
                    continue;
                } else {
                    pos + 1
                };
                self.current = (self.start, self.start + pos, true);
                self.start += consumed;
                return Ok(true);
            }
            scanned = data.len();
            if !self.fill()? {
                if self.start == self.end {
                    return Ok(false);
                }
                self.current = (self.start, self.end, false);
                self.start = self.end;
                return Ok(true);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reads every line of `input` through a reader that returns at most
    /// `chunk` bytes per `read` call, to exercise buffer boundaries.
    fn lines(input: &[u8], chunk: usize) -> Vec<(Vec<u8>, bool)> {
        struct Chunked<'a>(&'a [u8], usize);
        impl Read for Chunked<'_> {
            fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
                let n = self.0.len().min(self.1).min(out.len());
                out[..n].copy_from_slice(&self.0[..n]);
                self.0 = &self.0[n..];
                Ok(n)
            }
        }
        let mut r = LineReader::new(Chunked(input, chunk));
        let mut out = Vec::new();
        while let Some(l) = r.next_line().unwrap() {
            out.push((l.text.to_vec(), l.terminated));
        }
        out
    }

    #[test]
    fn universal_newlines_at_every_chunk_size() {
        let input = b"a\nbb\r\ncc\rd\r\r\ne\n\nlast";
        let want: Vec<(Vec<u8>, bool)> = vec![
            (b"a".to_vec(), true),
            (b"bb".to_vec(), true),
            (b"cc".to_vec(), true),
            (b"d".to_vec(), true),
            (b"".to_vec(), true),
            (b"e".to_vec(), true),
            (b"".to_vec(), true),
            (b"last".to_vec(), false),
        ];
        for chunk in 1..=input.len() {
            assert_eq!(lines(input, chunk), want, "chunk {chunk}");
        }
    }

    #[test]
    fn trailing_cr_and_empty_input() {
        assert_eq!(lines(b"x\r", 1), vec![(b"x".to_vec(), true)]);
        assert!(lines(b"", 4).is_empty());
    }

    #[test]
    fn lines_longer_than_the_buffer() {
        let long = vec![b'x'; BUF_SIZE * 3 + 7];
        let mut input = long.clone();
        input.extend_from_slice(b"\r\nshort\n");
        let got = lines(&input, BUF_SIZE / 3);
        assert_eq!(got, vec![(long, true), (b"short".to_vec(), true)]);
    }
}
