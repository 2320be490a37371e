//! Python's text rules, as the Valgrind tools written in Python apply them:
//! what `str.isspace`/`str.split()` call whitespace, what `int()` and
//! `float()` accept, and how `repr`, `f"{n:,d}"`, `f"{x:.1f}"` and true
//! division format and round. Output must match theirs byte for byte.

use std::fmt::Write as _;

/// Length in bytes of the Python whitespace character starting `s`, if any.
///
/// Python's whitespace is Unicode `White_Space` plus the ASCII separators
/// `\x1c`..`\x1f`. Bytes that are not valid UTF-8 are not whitespace.
#[inline]
pub fn space_len(s: &[u8]) -> Option<usize> {
    let b = *s.first()?;
    if b < 0x80 {
        return matches!(b, b'\t'..=b'\r' | 0x1c..=0x1f | b' ').then_some(1);
    }
    let (c, len) = decode_char(s)?;
    c.is_whitespace().then_some(len)
}

/// Decodes the UTF-8 character at the start of `s`, with its length.
pub fn decode_char(s: &[u8]) -> Option<(char, usize)> {
    let len = match s.first()? {
        0x00..=0x7f => 1,
        0xc2..=0xdf => 2,
        0xe0..=0xef => 3,
        0xf0..=0xf4 => 4,
        _ => return None,
    };
    let c = std::str::from_utf8(s.get(..len)?).ok()?.chars().next()?;
    Some((c, len))
}

/// `s` without its leading Python whitespace.
pub fn trim_start(mut s: &[u8]) -> &[u8] {
    while let Some(n) = space_len(s) {
        s = &s[n..];
    }
    s
}

/// `s` without leading and trailing Python whitespace.
pub fn trim(s: &[u8]) -> &[u8] {
    let mut s = trim_start(s);
    // Trailing: scan from the front so multi-byte characters stay whole.
    let mut end = 0;
    let mut i = 0;
    while i < s.len() {
        match space_len(&s[i..]) {
            Some(n) => i += n,
            None => {
                i += 1;
                end = i;
            }
        }
    }
    s = &s[..end];
    s
}

/// Splits on runs of Python whitespace, like `str.split()` with no
/// arguments.
pub fn split_whitespace(s: &[u8]) -> SplitWhitespace<'_> {
    SplitWhitespace { rest: s }
}

/// Iterator returned by [`split_whitespace`].
pub struct SplitWhitespace<'a> {
    rest: &'a [u8],
}

impl<'a> Iterator for SplitWhitespace<'a> {
    type Item = &'a [u8];

    #[inline]
    fn next(&mut self) -> Option<&'a [u8]> {
        let s = trim_start(self.rest);
        if s.is_empty() {
            self.rest = s;
            return None;
        }
        let mut i = 0;
        while i < s.len() {
            if s[i] < 0x80 {
                if matches!(s[i], b'\t'..=b'\r' | 0x1c..=0x1f | b' ') {
                    break;
                }
                i += 1;
            } else if space_len(&s[i..]).is_some() {
                break;
            } else {
                i += 1;
            }
        }
        self.rest = &s[i..];
        Some(&s[..i])
    }
}

/// Python's whitespace among ASCII bytes.
static ASCII_SPACE: [bool; 256] = {
    let mut t = [false; 256];
    let mut b = 0;
    while b < 256 {
        t[b] = matches!(b as u8, b'\t'..=b'\r' | 0x1c..=0x1f | b' ');
        b += 1;
    }
    t
};

/// True for the ASCII bytes Python calls whitespace.
#[inline]
pub fn is_ascii_space(b: u8) -> bool {
    ASCII_SPACE[b as usize]
}

/// `s` without its last character, like Python's `s[:-1]`: the tools use
/// this to drop a line's `\n`, which drops a real character from a last
/// line that has none. Invalid UTF-8 loses one byte.
pub fn drop_last_char(s: &[u8]) -> &[u8] {
    if s.is_empty() {
        return s;
    }
    let mut start = s.len() - 1;
    // Step back over UTF-8 continuation bytes, at most three.
    while start > 0 && s.len() - start < 4 && s[start] & 0xc0 == 0x80 {
        start -= 1;
    }
    if decode_char(&s[start..]).is_some_and(|(_, n)| start + n == s.len()) {
        &s[..start]
    } else {
        &s[..s.len() - 1]
    }
}

/// Parses an integer token the way Python's `int()` does for ASCII text:
/// an optional sign, then digits with single underscores between them.
/// Values outside `i64` are refused (Python would accept them).
#[inline]
pub fn parse_int(s: &[u8]) -> Option<i64> {
    let (neg, digits) = match s.first()? {
        b'-' => (true, &s[1..]),
        b'+' => (false, &s[1..]),
        _ => (false, s),
    };
    if digits.is_empty() {
        return None;
    }
    // Accumulate negatively so that i64::MIN parses.
    let mut v: i64 = 0;
    let mut prev_digit = false;
    for &b in digits {
        match b {
            b'0'..=b'9' => {
                v = v.checked_mul(10)?.checked_sub(i64::from(b - b'0'))?;
                prev_digit = true;
            }
            b'_' if prev_digit => prev_digit = false,
            _ => return None,
        }
    }
    if !prev_digit {
        return None;
    }
    if neg {
        Some(v)
    } else {
        v.checked_neg()
    }
}

/// Parses like Python's `float()`: surrounding whitespace, underscores
/// between digits, `inf`/`infinity`/`nan` in any case.
pub fn parse_float(s: &str) -> Option<f64> {
    let t = std::str::from_utf8(trim(s.as_bytes())).ok()?;
    let b = t.as_bytes();
    let mut cleaned = String::with_capacity(t.len());
    for (i, &c) in b.iter().enumerate() {
        if c == b'_' {
            let before = i > 0 && b[i - 1].is_ascii_digit();
            let after = b.get(i + 1).is_some_and(|n| n.is_ascii_digit());
            if !(before && after) {
                return None;
            }
        } else {
            cleaned.push(c as char);
        }
    }
    if !cleaned.is_ascii() {
        return None;
    }
    cleaned.parse::<f64>().ok()
}

/// `f"{n:,d}"`: decimal with a comma every three digits.
pub fn commify(n: i64) -> String {
    let digits = n.unsigned_abs().to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3 + 1);
    if n < 0 {
        out.push('-');
    }
    // Digits before the first comma, then groups of three.
    let mut until_comma = (digits.len() + 2) % 3 + 1;
    for c in digits.chars() {
        if until_comma == 0 {
            out.push(',');
            until_comma = 3;
        }
        out.push(c);
        until_comma -= 1;
    }
    out
}

/// Python's `a / b` for integers: the quotient correctly rounded to the
/// nearest double, ties to even. (`a as f64 / b as f64` rounds twice once
/// the operands exceed 2^53.) `b` must not be zero.
pub fn true_div(a: i128, b: i128) -> f64 {
    debug_assert!(b != 0);
    let negative = (a < 0) != (b < 0);
    let (ua, ub) = (a.unsigned_abs(), b.unsigned_abs());
    let magnitude = if ua == 0 {
        0.0
    } else if ua < 1 << 53 && ub < 1 << 53 {
        ua as f64 / ub as f64
    } else {
        div_magnitude(ua, ub)
    };
    if negative {
        -magnitude
    } else {
        magnitude
    }
}

/// Correctly rounded `ua / ub` for operands below 2^72 or so.
fn div_magnitude(ua: u128, ub: u128) -> f64 {
    let bits = |x: u128| 128 - x.leading_zeros() as i32;
    // Scale so the integer quotient has at least 55 significant bits: 53
    // for the mantissa, one for rounding, one spare; the remainder is the
    // sticky bit.
    let shift = (55 + bits(ub) - bits(ua)).max(0);
    let num = ua << shift;
    let (q, r) = (num / ub, num % ub);
    let extra = bits(q) - 53;
    let mut mant = q >> extra;
    let rest = q & ((1u128 << extra) - 1);
    let half = 1u128 << (extra - 1);
    if rest > half || (rest == half && (r != 0 || mant & 1 == 1)) {
        mant += 1;
    }
    let exp = extra - shift;
    // `mant` <= 2^53 converts exactly; scaling by a power of two is exact.
    mant as f64 * f64::from_bits(((exp + 1023) as u64) << 52)
}

/// `f"{x:.1f}"`. Rust rounds the exact binary value half to even, as
/// Python does, and keeps the sign of negative zero.
pub fn fixed1(x: f64) -> String {
    format!("{x:.1}")
}

/// `f"{n * 100 / total:.1f}"` for a percentage.
pub fn percent(n: i64, total: i64) -> String {
    fixed1(true_div(i128::from(n) * 100, i128::from(total)))
}

/// Python's `repr(float)` / `str(float)`: the shortest round-tripping
/// digits, in scientific form below 1e-4 or from 1e16 on.
pub fn float_repr(x: f64) -> String {
    if x.is_nan() {
        return "nan".into();
    }
    if x.is_infinite() {
        return if x > 0.0 { "inf" } else { "-inf" }.into();
    }
    // `{:e}` gives the shortest digits: "d.ddde-5" or "de3".
    let sci = format!("{:e}", x.abs());
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    let sign = if x.is_sign_negative() { "-" } else { "" };
    if x == 0.0 {
        return format!("{sign}0.0");
    }
    if (-4..16).contains(&exp) {
        let point = exp + 1; // digits before the decimal point
        let text = if point <= 0 {
            format!("0.{}{}", "0".repeat((-point) as usize), digits)
        } else if point as usize >= digits.len() {
            format!("{}{}.0", digits, "0".repeat(point as usize - digits.len()))
        } else {
            let (int, frac) = digits.split_at(point as usize);
            format!("{int}.{frac}")
        };
        format!("{sign}{text}")
    } else {
        let (first, rest) = digits.split_at(1);
        let frac = if rest.is_empty() {
            String::new()
        } else {
            format!(".{rest}")
        };
        let esign = if exp < 0 { '-' } else { '+' };
        format!("{sign}{first}{frac}e{esign}{:02}", exp.abs())
    }
}

/// Python's `repr(str)`: single quotes unless the text has a single quote
/// and no double quote; backslash escapes for quotes, backslashes and
/// non-printable characters. Bytes that are not UTF-8 show as the
/// surrogates Python's `surrogateescape` decoding would give them.
pub fn repr_str(s: &[u8]) -> String {
    let text = String::from_utf8_lossy(s);
    let quote = if text.contains('\'') && !text.contains('"') {
        '"'
    } else {
        '\''
    };
    let mut out = String::with_capacity(s.len() + 2);
    out.push(quote);
    let mut i = 0;
    while i < s.len() {
        let Some((c, n)) = decode_char(&s[i..]) else {
            let _ = write!(out, "\\udc{:02x}", s[i]);
            i += 1;
            continue;
        };
        i += n;
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if is_printable(c) => out.push(c),
            c if (c as u32) < 0x100 => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c if (c as u32) < 0x10000 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => {
                let _ = write!(out, "\\U{:08x}", c as u32);
            }
        }
    }
    out.push(quote);
    out
}

/// An approximation of Python's `str.isprintable` for one character:
/// controls, separators other than the space, and format characters are
/// not printable.
fn is_printable(c: char) -> bool {
    let u = c as u32;
    !(u < 0x20
        || (0x7f..=0xa0).contains(&u)
        || u == 0xad
        || c.is_whitespace() && c != ' '
        || (0x200b..=0x200f).contains(&u)
        || (0x202a..=0x202e).contains(&u)
        || (0x2060..=0x2064).contains(&u)
        || u == 0xfeff
        || (0xd800..=0xdfff).contains(&u)
        || (0xe000..=0xf8ff).contains(&u)
        || (0xfff9..=0xfffb).contains(&u)
        || u >= 0xf0000)
}

/// Python's `str(list_of_ints)`: `[1, -2, 3]`.
pub fn int_list(v: &[i64]) -> String {
    let mut out = String::from("[");
    for (i, n) in v.iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        let _ = write!(out, "{n}");
    }
    out.push(']');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whitespace_is_pythons() {
        let words: Vec<&[u8]> =
            split_whitespace(b" a\x1cb\x0bc\xc2\xa0d\xe3\x80\x80e \xc3\xa9 \xff ").collect();
        let want: Vec<&[u8]> = vec![b"a", b"b", b"c", b"d", b"e", b"\xc3\xa9", b"\xff"];
        assert_eq!(words, want);
        assert_eq!(trim(b" \t x y \n"), b"x y");
        assert_eq!(trim(b"   "), b"");
        assert_eq!(space_len(b"\xc2\x85"), Some(2));
        assert_eq!(space_len(b"\xc2"), None);
    }

    #[test]
    fn drop_last_char_counts_characters() {
        assert_eq!(drop_last_char(b"abc"), b"ab");
        assert_eq!(drop_last_char("a\u{e9}".as_bytes()), b"a");
        assert_eq!(drop_last_char("\u{1f600}".as_bytes()), b"");
        assert_eq!(drop_last_char(b"a\xff"), b"a");
        assert_eq!(drop_last_char(b"a\x80\x80"), b"a\x80");
        assert_eq!(drop_last_char(b""), b"");
    }

    #[test]
    fn ints_follow_python() {
        assert_eq!(parse_int(b"12"), Some(12));
        assert_eq!(parse_int(b"-0012"), Some(-12));
        assert_eq!(parse_int(b"+1_000"), Some(1000));
        assert_eq!(parse_int(b"-9223372036854775808"), Some(i64::MIN));
        for bad in [
            &b""[..],
            b"-",
            b"1_",
            b"_1",
            b"1__0",
            b"1a",
            b"9223372036854775808",
            b".",
        ] {
            assert_eq!(parse_int(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn floats_follow_python() {
        assert_eq!(parse_float(" 0.5 "), Some(0.5));
        assert_eq!(parse_float("1_0.2_5"), Some(10.25));
        assert_eq!(parse_float("1e1"), Some(10.0));
        assert_eq!(parse_float(".5"), Some(0.5));
        assert!(parse_float("nan").unwrap().is_nan());
        assert_eq!(parse_float("-Infinity"), Some(f64::NEG_INFINITY));
        for bad in ["", "1__0", "_1", "1_", "0x10", "1e", "abc"] {
            assert_eq!(parse_float(bad), None, "{bad}");
        }
    }

    #[test]
    fn commas() {
        assert_eq!(commify(0), "0");
        assert_eq!(commify(999), "999");
        assert_eq!(commify(1000), "1,000");
        assert_eq!(commify(-1_000_000), "-1,000,000");
        assert_eq!(commify(i64::MIN), "-9,223,372,036,854,775,808");
    }

    #[test]
    fn division_is_correctly_rounded() {
        // Exact for small operands.
        assert_eq!(true_div(1, 3), 1.0 / 3.0);
        assert_eq!(true_div(0, -5).to_bits(), (-0.0f64).to_bits());
        assert_eq!(true_div(-7, 2), -3.5);
        // 2^53 + 1 rounds to even; the naive conversion would agree here,
        // but for a quotient just above a tie it would not.
        assert_eq!(true_div((1 << 53) + 1, 1), 9007199254740992.0);
        assert_eq!(true_div((1 << 53) + 3, 1), 9007199254740996.0);
        // (2^54 + 3) / 2 = 2^53 + 1.5 -> 2^53 + 2.
        assert_eq!(true_div((1 << 54) + 3, 2), 9007199254740994.0);
        // (2^53+1)*100 / (2^53+1) must be exactly 100.
        let big = (1i128 << 53) + 1;
        assert_eq!(true_div(big * 100, big), 100.0);
        let a = 123_456_789_012_345_678i128 * 100;
        let b = 987_654_321_098_765_432i128;
        assert_eq!(true_div(a, b), 12.49999988609375);
    }

    #[test]
    fn percentages_round_like_python() {
        assert_eq!(percent(1, 8), "12.5");
        assert_eq!(percent(1, 400), "0.2"); // 0.25 -> 0.2
        assert_eq!(percent(-1, 2000), "-0.1"); // -0.05 is below -0.05
        assert_eq!(percent(0, -3), "-0.0");
        assert_eq!(percent(-1_000_000, 100_000), "-1000.0");
    }

    #[test]
    fn float_reprs() {
        for (x, s) in [
            (0.1, "0.1"),
            (1.0, "1.0"),
            (20.0, "20.0"),
            (0.0, "0.0"),
            (-0.0, "-0.0"),
            (1e-5, "1e-05"),
            (0.0001, "0.0001"),
            (1.5e-7, "1.5e-07"),
            (1e16, "1e+16"),
            (123.456, "123.456"),
            (1e15, "1000000000000000.0"),
        ] {
            assert_eq!(float_repr(x), s);
        }
    }

    #[test]
    fn str_reprs() {
        assert_eq!(repr_str(b"x"), "'x'");
        assert_eq!(repr_str(b"it's"), "\"it's\"");
        assert_eq!(repr_str(b"'\""), "'\\'\"'");
        assert_eq!(repr_str(b"a\\b\n\x01\xff"), "'a\\\\b\\n\\x01\\udcff'");
        assert_eq!(repr_str("\u{e9}".as_bytes()), "'\u{e9}'");
    }

    #[test]
    fn lists() {
        assert_eq!(int_list(&[]), "[]");
        assert_eq!(int_list(&[1, -2]), "[1, -2]");
    }
}
