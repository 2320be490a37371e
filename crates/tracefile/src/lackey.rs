//! Lackey's `--trace-mem=yes` lines.

use crate::num::{dec_prefix_u32, hex_prefix};
use crate::{Access, Event};

/// Parses one line (without its newline). Lines that are not trace records
/// give `Ok(None)`; a record that does not parse is an error.
#[inline]
pub fn parse_line(line: &[u8]) -> Result<Option<Event>, &'static str> {
    let access = match line {
        [b'I', b' ', b' ', ..] => Access::Instr,
        [b' ', b'L', b' ', ..] => Access::Read,
        [b' ', b'S', b' ', ..] => Access::Write,
        [b' ', b'M', b' ', ..] => Access::Modify,
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
    Ok(Some(Event { access, addr, size }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_and_errors() {
        assert_eq!(
            parse_line(b" S 04022e08,8\r"),
            Ok(Some(Event {
                access: Access::Write,
                addr: 0x0402_2e08,
                size: 8
            }))
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
}
