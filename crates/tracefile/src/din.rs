//! Dinero's `din` lines: `label hexaddr [size] [comment]`.

use crate::num::{dec_prefix_u32, hex_prefix};
use crate::{Access, Event};

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
pub fn parse_line(line: &[u8]) -> Result<Option<Event>, &'static str> {
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
    let access = match label {
        0 => Access::Read,
        1 => Access::Write,
        2 => Access::Instr,
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
    Ok(Some(match sized {
        Some((size, _)) => Event { access, addr, size },
        None => Event {
            access,
            addr: addr & !3,
            size: 4,
        },
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines() {
        let ev = |access, addr, size| Ok(Some(Event { access, addr, size }));
        assert_eq!(parse_line(b"2 0"), ev(Access::Instr, 0, 4));
        assert_eq!(
            parse_line(b"\t0\t0x70f6088b  1"),
            ev(Access::Read, 0x70f6_088b, 1)
        );
        assert_eq!(
            parse_line(b"1 70f6088e cmt"),
            ev(Access::Write, 0x70f6_088c, 4)
        );
        assert_eq!(parse_line(b"4 0"), Ok(None));
        assert_eq!(parse_line(b"   "), Ok(None));
        assert_eq!(parse_line(b"12 0"), Err("unknown label (expected 0 to 4)"));
        assert_eq!(parse_line(b"0 zz"), Err("malformed address"));
        assert_eq!(parse_line(b"0 12g4"), Err("malformed address"));
        assert_eq!(parse_line(b"0"), Err("malformed address"));
    }
}
