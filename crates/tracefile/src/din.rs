//! Dinero's `din` lines: `label hexaddr [size] [comment]`.

use crate::num::{dec_prefix_u32, hex_prefix};
use crate::record;
use events::{AccessKind, Record};

fn skip_blanks(s: &[u8]) -> &[u8] {
    let n = s
        .iter()
        .take_while(|b| matches!(b, b' ' | b'\t' | b'\r'))
        .count();
    &s[n..]
}

/// Parses one line (without its newline). Blank lines and escape records
/// (labels 3 and 4) give `Ok(None)`.
#[inline]
pub fn parse_line(line: &[u8]) -> Result<Option<Record>, &'static str> {
    let s = skip_blanks(line);
    let (label, s) = match s {
        [] => return Ok(None),
        [l @ b'0'..=b'4', rest @ ..]
            if matches!(rest.first(), None | Some(b' ' | b'\t' | b'\r')) =>
        {
            (l - b'0', rest)
        }
        _ => return Err("unknown label (expected 0 to 4)"),
    };
    // An instruction fetch, or a data access of this kind.
    let kind = match label {
        0 => Some(AccessKind::Read),
        1 => Some(AccessKind::Write),
        2 => None,
        _ => return Ok(None),
    };
    let s = skip_blanks(s);
    let s = s.strip_prefix(b"0x").unwrap_or(s);
    let (addr, n) = hex_prefix(s).ok_or("malformed address")?;
    let s = &s[n..];
    if !matches!(s.first(), None | Some(b' ' | b'\t' | b'\r')) {
        return Err("malformed address");
    }
    let s = skip_blanks(s);
    // An optional decimal size; anything else is a comment.
    let sized =
        dec_prefix_u32(s).filter(|&(_, n)| matches!(s.get(n), None | Some(b' ' | b'\t' | b'\r')));
    let (addr, size) = match sized {
        Some((size, _)) => (addr, size),
        None => (addr & !3, 4),
    };
    Ok(Some(record(kind, addr, size)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines() {
        assert_eq!(parse_line(b"2 0"), Ok(Some(record(None, 0, 4))));
        assert_eq!(
            parse_line(b"\t0\t0x70f6088b  1"),
            Ok(Some(record(Some(AccessKind::Read), 0x70f6_088b, 1)))
        );
        assert_eq!(
            parse_line(b"1 70f6088e cmt"),
            Ok(Some(record(Some(AccessKind::Write), 0x70f6_088c, 4)))
        );
        assert_eq!(parse_line(b"4 0"), Ok(None));
        assert_eq!(parse_line(b"   "), Ok(None));
        assert_eq!(parse_line(b"12 0"), Err("unknown label (expected 0 to 4)"));
        assert_eq!(parse_line(b"0 zz"), Err("malformed address"));
        assert_eq!(parse_line(b"0 12g4"), Err("malformed address"));
        assert_eq!(parse_line(b"0"), Err("malformed address"));
    }
}
