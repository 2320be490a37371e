//! Splitting a byte stream into lines through one large reused buffer.

use crate::TraceError;
use std::io::{ErrorKind, Read};

/// Initial buffer size: large reads keep a text trace I/O-bound.
const CHUNK: usize = 1 << 20;

/// Calls `f` with every line of `input` (without the `\n`), including a
/// last line with no newline. Stops at the first error `f` returns.
pub fn for_each_line<R: Read>(
    mut input: R,
    mut f: impl FnMut(&[u8]) -> Result<(), TraceError>,
) -> Result<(), TraceError> {
    let mut buf = vec![0u8; CHUNK];
    let mut end = 0;
    loop {
        let n = match input.read(&mut buf[end..]) {
            Ok(n) => n,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => return Err(TraceError::Io(e)),
        };
        if n == 0 {
            if end > 0 {
                f(&buf[..end])?;
            }
            return Ok(());
        }
        let filled = end + n;
        let mut start = 0;
        while let Some(nl) = buf[start..filled].iter().position(|&b| b == b'\n') {
            f(&buf[start..start + nl])?;
            start += nl + 1;
        }
        buf.copy_within(start..filled, 0);
        end = filled - start;
        if end == buf.len() {
            // One line longer than the buffer: grow rather than split it.
            buf.resize(buf.len() * 2, 0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reader that hands out at most `step` bytes per call.
    struct Trickle<'a>(&'a [u8], usize);

    impl Read for Trickle<'_> {
        fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
            let n = self.1.min(self.0.len()).min(out.len());
            out[..n].copy_from_slice(&self.0[..n]);
            self.0 = &self.0[n..];
            Ok(n)
        }
    }

    fn collect(input: impl Read) -> Vec<String> {
        let mut v = Vec::new();
        for_each_line(input, |l| {
            v.push(String::from_utf8_lossy(l).into_owned());
            Ok(())
        })
        .unwrap();
        v
    }

    #[test]
    fn splits_across_reads() {
        let text = b"ab\n\ncd\nlast";
        for step in 1..6 {
            assert_eq!(collect(Trickle(text, step)), ["ab", "", "cd", "last"]);
        }
        assert_eq!(collect(&b"x\n"[..]), ["x"]);
        assert!(collect(&b""[..]).is_empty());
    }

    #[test]
    fn long_line_grows_the_buffer() {
        let mut text = vec![b'z'; CHUNK * 2 + 5];
        text.extend_from_slice(b"\nend\n");
        let lines = collect(&text[..]);
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[0].len(), CHUNK * 2 + 5);
        assert_eq!(lines[1], "end");
    }
}
