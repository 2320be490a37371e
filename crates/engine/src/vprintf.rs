//! `VALGRIND_PRINTF`: the client's format string and `va_list`, read from
//! its memory and formatted as Valgrind's own `vprintf` does (its
//! `VG_(debugLog_vprintf)`, not the C library's): the conversions `d u o x X
//! p c s S f` with the flags `- 0 , ' #`, a width (or `*`), a precision for
//! `f` only, and the length modifiers `l`, `ll`, `z`. Anything else prints
//! nothing and takes no argument (`%i` and `%g` print nothing, as under
//! Valgrind). The count returned is what Valgrind returns to the client.
//!
//! The `va_list` is the x86-64 System V one: general-purpose arguments come
//! from the register save area while `gp_offset < 48`, then from the
//! overflow area; floating-point ones from the save area's XMM slots while
//! `fp_offset < 176`.

use crate::client_mem::ClientMemory;

/// Flag `-`: left-justify.
const LEFT: u32 = 1;
/// Flag `0`: pad with zeros.
const ZERO: u32 = 2;
/// Flags `,` and `'`: thousands separators (decimal only).
const COMMA: u32 = 4;
/// Flag `#`: `0x` before `x`, `0` before `o`.
const ALT: u32 = 8;
/// Internal: a signed conversion.
const SIGNED: u32 = 16;

/// The longest string argument read (a bad pointer must not make us read
/// forever).
const MAX_STRING: usize = 1 << 16;

/// Reads a NUL-terminated string at `addr` (up to [`MAX_STRING`] bytes),
/// page by page so that a string ending just before an unmapped page is
/// read; `None` if its first byte cannot be read.
pub fn read_c_string(mem: &mut dyn ClientMemory, addr: u64) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    let mut at = addr;
    while out.len() < MAX_STRING {
        let to_page_end = (4096 - (at & 4095)) as usize;
        let Ok(bytes) = mem.read(at, to_page_end) else {
            return (!out.is_empty() || at != addr).then_some(out);
        };
        if let Some(n) = bytes.iter().position(|&b| b == 0) {
            out.extend_from_slice(&bytes[..n]);
            return Some(out);
        }
        out.extend_from_slice(&bytes);
        at += to_page_end as u64;
    }
    Some(out)
}

/// A client `va_list` being walked (its fields are copied, as `va_copy`
/// would: the client's own is left alone, as the request's caller ends it).
struct VaList<'m> {
    mem: &'m mut dyn ClientMemory,
    gp_offset: u32,
    fp_offset: u32,
    overflow: u64,
    save_area: u64,
}

impl VaList<'_> {
    fn word(&mut self, addr: u64) -> u64 {
        self.mem.read_u64(addr).unwrap_or(0)
    }

    /// The next integer or pointer argument.
    fn gp(&mut self) -> u64 {
        if self.gp_offset < 48 {
            let v = self.word(self.save_area + u64::from(self.gp_offset));
            self.gp_offset += 8;
            v
        } else {
            let v = self.word(self.overflow);
            self.overflow += 8;
            v
        }
    }

    /// The next `double` argument.
    fn fp(&mut self) -> f64 {
        let bits = if self.fp_offset < 176 {
            let v = self.word(self.save_area + u64::from(self.fp_offset));
            self.fp_offset += 16;
            v
        } else {
            let v = self.word(self.overflow);
            self.overflow += 8;
            v
        };
        f64::from_bits(bits)
    }
}

/// Formats the client's `format` (a C string at `format`) with the
/// arguments of the `va_list` at `va_list`; returns the text and
/// Valgrind's count of it (which a few conversions make differ from its
/// length). Unreadable memory reads as zeros and empty strings.
pub fn format(mem: &mut dyn ClientMemory, format: u64, va_list: u64) -> (Vec<u8>, u32) {
    let fmt = read_c_string(mem, format).unwrap_or_default();
    let head = mem.read(va_list, 24).unwrap_or_else(|_| vec![0; 24]);
    let u32_at = |i: usize| u32::from_le_bytes(head[i..i + 4].try_into().expect("4 bytes"));
    let u64_at = |i: usize| u64::from_le_bytes(head[i..i + 8].try_into().expect("8 bytes"));
    let mut args = VaList {
        gp_offset: u32_at(0),
        fp_offset: u32_at(4),
        overflow: u64_at(8),
        save_area: u64_at(16),
        mem,
    };
    let mut out = Out::default();
    let mut i = 0;
    let at = |i: usize| fmt.get(i).copied().unwrap_or(0);
    while i < fmt.len() {
        if fmt[i] != b'%' {
            out.put(fmt[i]);
            i += 1;
            continue;
        }
        i += 1;
        if at(i) == 0 {
            break;
        }
        if at(i) == b'%' {
            out.put(b'%');
            i += 1;
            continue;
        }
        let mut flags = 0;
        loop {
            match at(i) {
                b',' | b'\'' => flags |= COMMA,
                b'-' => flags |= LEFT,
                b'0' => flags |= ZERO,
                b'#' => flags |= ALT,
                // Accepted and ignored.
                b'(' => {}
                _ => break,
            }
            i += 1;
        }
        let mut width: i64 = 0;
        if at(i) == b'*' {
            width = i64::from(args.gp() as i32);
            i += 1;
        } else {
            while at(i).is_ascii_digit() {
                width = width * 10 + i64::from(at(i) - b'0');
                i += 1;
            }
        }
        let mut precision: i64 = -1;
        if at(i) == b'.' {
            i += 1;
            if at(i) == b'*' {
                precision = i64::from(args.gp() as i32);
                i += 1;
            } else {
                precision = 0;
                while at(i).is_ascii_digit() {
                    precision = precision * 10 + i64::from(at(i) - b'0');
                    i += 1;
                }
            }
        }
        // `l` and `ll` both mean 64 bits here, as `z` does.
        let mut long = false;
        if at(i) == b'z' {
            long = true;
            i += 1;
        } else {
            while at(i) == b'l' {
                long = true;
                i += 1;
            }
        }
        let conv = at(i);
        let int = |v: u64, signed: bool| match (long, signed) {
            (true, _) => v,
            (false, true) => v as u32 as i32 as i64 as u64,
            (false, false) => u64::from(v as u32),
        };
        let width = usize::try_from(width).unwrap_or(0);
        match conv {
            b'd' => {
                let v = int(args.gp(), true);
                out.int(flags | SIGNED, 10, width, false, v);
            }
            b'u' => {
                let v = int(args.gp(), false);
                out.int(flags, 10, width, false, v);
            }
            b'o' => {
                if flags & ALT != 0 {
                    // Valgrind counts two characters and prints one.
                    out.put(b'0');
                    out.count += 1;
                }
                let v = int(args.gp(), false);
                out.int(flags, 8, width, false, v);
            }
            b'x' | b'X' => {
                if flags & ALT != 0 {
                    out.put(b'0');
                    out.put(b'x');
                }
                let v = int(args.gp(), false);
                out.int(flags, 16, width, conv == b'X', v);
            }
            b'p' if matches!(at(i + 1), b's' | b'S') => {
                // `%ps`/`%pS`: a string (XML-escaped for `S`).
                i += 1;
                let s = string_arg(&mut args);
                if conv_after(&fmt, i) == b'S' {
                    out.xml(&s);
                } else {
                    out.string(flags, width, &s, false);
                }
            }
            b'p' => {
                out.put(b'0');
                out.put(b'x');
                let v = args.gp();
                out.int(flags, 16, width, true, v);
            }
            b'c' => {
                let v = args.gp();
                out.put(v as u8);
            }
            b's' | b'S' => {
                let s = string_arg(&mut args);
                out.string(flags, width, &s, conv == b'S');
            }
            b'f' => {
                let v = args.fp();
                out.float(flags, width, precision, v);
            }
            0 => break,
            _ => {}
        }
        i += 1;
    }
    (out.text, out.count)
}

/// The conversion character at `i` of `fmt`.
fn conv_after(fmt: &[u8], i: usize) -> u8 {
    fmt.get(i).copied().unwrap_or(0)
}

/// A string argument, `(null)` for a null pointer.
fn string_arg(args: &mut VaList) -> Vec<u8> {
    match args.gp() {
        0 => b"(null)".to_vec(),
        p => read_c_string(args.mem, p).unwrap_or_default(),
    }
}

/// The text being made and Valgrind's count of it.
#[derive(Default)]
struct Out {
    text: Vec<u8>,
    count: u32,
}

impl Out {
    fn put(&mut self, c: u8) {
        self.text.push(c);
        self.count += 1;
    }

    fn pad(&mut self, n: usize) {
        for _ in 0..n {
            self.put(b' ');
        }
    }

    /// A string in `width` (truncated to it when longer, as Valgrind
    /// does), upper-cased for `%S`.
    fn string(&mut self, flags: u32, width: usize, s: &[u8], upper: bool) {
        let shown = if width > 0 && s.len() > width {
            &s[..width]
        } else {
            s
        };
        let extra = width.saturating_sub(shown.len());
        if flags & LEFT == 0 {
            self.pad(extra);
        }
        for &c in shown {
            self.put(if upper { c.to_ascii_uppercase() } else { c });
        }
        if flags & LEFT != 0 {
            self.pad(extra);
        }
    }

    /// A string with `&`, `<` and `>` escaped.
    fn xml(&mut self, s: &[u8]) {
        for &c in s {
            match c {
                b'&' => b"&amp;".iter().for_each(|&b| self.put(b)),
                b'<' => b"&lt;".iter().for_each(|&b| self.put(b)),
                b'>' => b"&gt;".iter().for_each(|&b| self.put(b)),
                _ => self.put(c),
            }
        }
    }

    /// An integer in `base`, as Valgrind lays it out: digits (with a comma
    /// every three decimal digits), then the sign, then the padding, all
    /// reversed, so a zero-padded negative number reads `00-5`.
    fn int(&mut self, flags: u32, base: u64, width: usize, upper: bool, v: u64) {
        let digits: &[u8] = if upper {
            b"0123456789ABCDEF"
        } else {
            b"0123456789abcdef"
        };
        let (mut p, neg) = if flags & SIGNED != 0 && (v as i64) < 0 {
            ((v as i64).unsigned_abs(), true)
        } else {
            (v, false)
        };
        let mut buf: Vec<u8> = Vec::new();
        let mut commas = 0;
        if p == 0 {
            buf.push(b'0');
        }
        while p > 0 {
            if flags & COMMA != 0
                && base == 10
                && (buf.len() - commas).is_multiple_of(3)
                && !buf.is_empty()
            {
                buf.push(b',');
                commas += 1;
            }
            buf.push(digits[(p % base) as usize]);
            p /= base;
        }
        if neg {
            buf.push(b'-');
        }
        if flags & LEFT == 0 {
            let fill = if flags & ZERO != 0 { b'0' } else { b' ' };
            while buf.len() < width {
                buf.push(fill);
            }
        }
        let len = buf.len();
        for &c in buf.iter().rev() {
            self.put(c);
        }
        if flags & LEFT != 0 {
            self.pad(width.saturating_sub(len));
        }
    }

    /// `%f`: integer part, `.`, `precision` digits (6 by default, at most
    /// 10), rounded half up; `*`s for numbers beyond 64 bits.
    fn float(&mut self, flags: u32, width: usize, precision: i64, v: f64) {
        let neg = v < 0.0;
        let val = v.abs();
        if val > u64::MAX as f64 {
            let n = if width == 0 { 6 } else { width };
            for _ in 0..n {
                self.put(b'*');
            }
            return;
        }
        let mut ip = val as u64;
        let frac = val - ip as f64;
        let precision = match precision {
            -1 => 6,
            p => p.clamp(0, 10) as u32,
        };
        let factor = 10u64.pow(precision);
        let mut fr = (frac * factor as f64) as u64;
        if frac * factor as f64 - fr as f64 > 0.5 {
            fr += 1;
        }
        if fr == factor {
            ip += 1;
        }
        fr %= factor;
        let ip_width = ip.checked_ilog10().map_or(1, |d| d as usize + 1);
        let mut n = ip_width + usize::from(neg);
        if precision != 0 {
            n += 1 + precision as usize;
        }
        if n < width && flags & LEFT == 0 {
            self.pad(width - n);
        }
        if neg {
            self.put(b'-');
        }
        self.int(0, 10, ip_width, false, ip);
        if precision != 0 {
            self.put(b'.');
            self.int(ZERO, 10, precision as usize, false, fr);
        }
        if n < width && flags & LEFT != 0 {
            self.pad(width - n);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client_mem::FakeMemory;

    const FMT: u64 = 0x1000;
    const VA: u64 = 0x2000;
    const SAVE: u64 = 0x3000;
    const OVERFLOW: u64 = 0x4000;
    const STR: u64 = 0x5000;

    /// Formats `fmt` with `gp` integer arguments (the first six from the
    /// save area, the rest from the overflow area) and `fp` doubles.
    fn fmt(fmt: &str, gp: &[u64], fp: &[f64]) -> (String, u32) {
        let mut mem = FakeMemory::default();
        mem.add_mapping(0x1000, 0x6000, "rw-p", "");
        let mut f = fmt.as_bytes().to_vec();
        f.push(0);
        mem.poke(FMT, &f);
        mem.poke(STR, b"str\0");
        // Like a variadic function's prologue: the format took the first
        // register.
        let regs = gp.len().min(5);
        for (n, v) in gp[..regs].iter().enumerate() {
            mem.poke(SAVE + 8 + 8 * n as u64, &v.to_le_bytes());
        }
        for (n, v) in gp[regs..].iter().enumerate() {
            mem.poke(OVERFLOW + 8 * n as u64, &v.to_le_bytes());
        }
        for (n, v) in fp.iter().enumerate() {
            mem.poke(SAVE + 48 + 16 * n as u64, &v.to_bits().to_le_bytes());
        }
        let mut head = 8u32.to_le_bytes().to_vec();
        head.extend_from_slice(&48u32.to_le_bytes());
        head.extend_from_slice(&OVERFLOW.to_le_bytes());
        head.extend_from_slice(&SAVE.to_le_bytes());
        mem.poke(VA, &head);
        let (text, n) = format(&mut mem, FMT, VA);
        (String::from_utf8(text).unwrap(), n)
    }

    #[test]
    fn conversions_read_like_valgrind_3_19() {
        // What Valgrind 3.19 printed for the same call (and returned: 55).
        let (s, n) = fmt(
            "hello %d %s|%5d|%-5d|%05x|%lu|%c|%%|%p\n",
            &[42, STR, 7, 8, 255, 123_456_789_012, u64::from(b'z'), 0x1234],
            &[],
        );
        assert_eq!(
            s,
            "hello 42 str|    7|8    |000ff|123456789012|z|%|0x1234\n"
        );
        assert_eq!(n, 55);
        // %g prints nothing; commas either way (48).
        let (s, n) = fmt(
            "float %f %.2f %g|%llx|%'d|%,d\n",
            &[0xabcdef, 1_234_567, 1_234_567],
            &[3.5, 2.25, 1.5],
        );
        assert_eq!(s, "float 3.500000 2.25 |abcdef|1,234,567|1,234,567\n");
        assert_eq!(n, 48);
    }

    #[test]
    fn valgrind_quirks_are_kept() {
        assert_eq!(fmt("%05d", &[(-5i64) as u64], &[]).0, "000-5");
        assert_eq!(fmt("%p", &[0xabc], &[]).0, "0xABC");
        assert_eq!(fmt("%2s|%S", &[STR, STR], &[]).0, "st|STR");
        assert_eq!(fmt("%s", &[0], &[]).0, "(null)");
        assert_eq!(fmt("%i|%d", &[1, 2], &[]).0, "|1");
        assert_eq!(fmt("%#o", &[8], &[]), ("010".into(), 4));
        assert_eq!(fmt("%d", &[u64::from(u32::MAX)], &[]).0, "-1");
        assert_eq!(
            fmt("%.1f|%8.3f|%-6.1f|", &[], &[-0.96, 2.0, 1.0]).0,
            "-1.0|   2.000|1.0   |"
        );
        // The seventh integer comes from the overflow area.
        assert_eq!(
            fmt("%d %d %d %d %d %d", &[1, 2, 3, 4, 5, 6], &[]).0,
            "1 2 3 4 5 6"
        );
    }
}
