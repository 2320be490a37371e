//! Lackey's `--trace-mem=yes` lines.

use crate::num::{dec_prefix_u32, hex_prefix};
use crate::record;
use events::{AccessKind, Record};

/// The fast path: a well-formed record at the start of `s`, followed by
/// `\n`. Returns the record and the bytes used (newline included), or
/// `None` for anything else (which [`parse_line`] then classifies).
#[inline(always)]
pub fn parse_record(s: &[u8]) -> Option<(Record, usize)> {
    let kind = match s.get(..3)? {
        b"I  " => None,
        b" L " => Some(AccessKind::Read),
        b" S " => Some(AccessKind::Write),
        b" M " => Some(AccessKind::Modify),
        _ => return None,
    };
    let (addr, n) = hex_prefix(&s[3..])?;
    let mut i = 3 + n;
    if *s.get(i)? != b',' {
        return None;
    }
    i += 1;
    let (size, n) = dec_prefix_u32(&s[i..])?;
    i += n;
    if *s.get(i)? != b'\n' {
        return None;
    }
    Some((record(kind, addr, size), i + 1))
}

/// Parses one line (without its newline). Lines that are not trace records
/// give `Ok(None)`; a record that does not parse is an error.
#[inline]
pub fn parse_line(line: &[u8]) -> Result<Option<Record>, &'static str> {
    let kind = match line {
        [b'I', b' ', b' ', ..] => None,
        [b' ', b'L', b' ', ..] => Some(AccessKind::Read),
        [b' ', b'S', b' ', ..] => Some(AccessKind::Write),
        [b' ', b'M', b' ', ..] => Some(AccessKind::Modify),
        _ => return Ok(None),
    };
    let rest = &line[3..];
    let (addr, n) = hex_prefix(rest).ok_or("malformed address")?;
    let rest = match rest.get(n) {
        Some(b',') => &rest[n + 1..],
        _ => return Err("expected ',' after the address"),
    };
    let (size, n) = dec_prefix_u32(rest).ok_or("malformed size")?;
    if !matches!(&rest[n..], [] | [b'\r']) {
        return Err("unexpected text after the size");
    }
    Ok(Some(record(kind, addr, size)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_and_errors() {
        assert_eq!(
            parse_line(b" S 04022e08,8\r"),
            Ok(Some(record(Some(AccessKind::Write), 0x0402_2e08, 8)))
        );
        assert_eq!(parse_line(b"==1== I  x"), Ok(None));
        assert_eq!(parse_line(b""), Ok(None));
        assert_eq!(
            parse_line(b" L 1000"),
            Err("expected ',' after the address")
        );
        assert_eq!(parse_line(b" L 1000,"), Err("malformed size"));
        assert_eq!(
            parse_line(b" L 1000,8x"),
            Err("unexpected text after the size")
        );
        assert_eq!(parse_line(b"I  ,8"), Err("malformed address"));
    }

    /// The fast path accepts exactly the well-formed records, with the
    /// same result as the line parser.
    #[test]
    fn fast_path_agrees_with_line_parser() {
        let lines: [&[u8]; 10] = [
            b"I  04000000,3\n",
            b" M 1ffefffd38,4\nrest",
            b" S 04022e08,8\r\n",
            b" L 1000,8x\n",
            b" L 10000000000000000,8\n",
            b"==1== x\n",
            b"I  0400,3",
            b" L 1000,99999999999\n",
            b" X 1000,8\n",
            b"I  ab,\n",
        ];
        for l in lines {
            let nl = l.iter().position(|&b| b == b'\n');
            match parse_record(l) {
                Some((ev, used)) => {
                    assert_eq!(Some(used - 1), nl);
                    assert_eq!(parse_line(&l[..used - 1]), Ok(Some(ev)));
                }
                None => {
                    let line = &l[..nl.unwrap_or(l.len())];
                    assert!(
                        !matches!(parse_line(line), Ok(Some(_)))
                            || line.ends_with(b"\r")
                            || nl.is_none()
                    );
                }
            }
        }
        assert_eq!(parse_record(b"I  04000000,3\n").unwrap().1, 14);
    }
}
