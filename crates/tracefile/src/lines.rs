//! Reading a byte stream in large chunks of whole lines, through one
//! reused buffer.

use crate::TraceError;
use std::io::{ErrorKind, Read};

/// Initial buffer size: large reads keep a text trace I/O-bound.
const CHUNK: usize = 1 << 20;

/// Calls `f` with successive chunks of `input`, each made of whole lines
/// (every one ending in `\n`), except that the last chunk may end with a
/// line that has no newline. Stops at the first error `f` returns.
pub fn for_each_chunk<R: Read>(
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
        // Only the tail after the last newline is carried over; searching
        // for it from the new data's end is cheap.
        let whole = match buf[end..filled].iter().rposition(|&b| b == b'\n') {
            Some(i) => end + i + 1,
            None => 0,
        };
        if whole > 0 {
            f(&buf[..whole])?;
        }
        buf.copy_within(whole..filled, 0);
        end = filled - whole;
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

    fn chunks(input: impl Read) -> Vec<String> {
        let mut v = Vec::new();
        for_each_chunk(input, |c| {
            v.push(String::from_utf8_lossy(c).into_owned());
            Ok(())
        })
        .unwrap();
        v
    }

    #[test]
    fn chunks_hold_whole_lines() {
        let text = b"ab\n\ncd\nlast";
        for step in 1..12 {
            let got = chunks(Trickle(text, step));
            assert_eq!(got.concat(), "ab\n\ncd\nlast", "step {step}");
            let (last, whole) = got.split_last().unwrap();
            assert!(
                whole.iter().all(|c| c.ends_with('\n')),
                "step {step}: {got:?}"
            );
            assert!(last.ends_with('\n') || last.ends_with("last"));
        }
        assert_eq!(chunks(&b"x\n"[..]), ["x\n"]);
        assert!(chunks(&b""[..]).is_empty());
    }

    #[test]
    fn long_line_grows_the_buffer() {
        let mut text = vec![b'z'; CHUNK * 2 + 5];
        text.extend_from_slice(b"\nend\n");
        let got = chunks(&text[..]);
        assert_eq!(got.concat().len(), CHUNK * 2 + 10);
        assert!(got[0].len() > CHUNK * 2);
    }
}
