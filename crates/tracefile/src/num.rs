//! Hand-rolled number parsing on bytes: the trace hot path must not build
//! strings.

/// Value of each byte as a hex digit, or 0xff.
const HEX: [u8; 256] = {
    let mut t = [0xffu8; 256];
    let mut i = 0;
    while i < 10 {
        t[b'0' as usize + i] = i as u8;
        i += 1;
    }
    let mut i = 0;
    while i < 6 {
        t[b'a' as usize + i] = 10 + i as u8;
        t[b'A' as usize + i] = 10 + i as u8;
        i += 1;
    }
    t
};

/// Parses the hex digits at the start of `s`. Returns the value and the
/// number of bytes used, or `None` if there is no digit or more than 16.
#[inline]
pub fn hex_prefix(s: &[u8]) -> Option<(u64, usize)> {
    let mut v = 0u64;
    let mut n = 0;
    for &b in s {
        let d = HEX[usize::from(b)];
        if d == 0xff {
            break;
        }
        v = (v << 4) | u64::from(d);
        n += 1;
    }
    (n > 0 && n <= 16).then_some((v, n))
}

/// Parses the decimal digits at the start of `s` as a `u32`. Returns the
/// value and the number of bytes used, or `None` if there is no digit or
/// the value overflows.
#[inline]
pub fn dec_prefix_u32(s: &[u8]) -> Option<(u32, usize)> {
    let mut v = 0u32;
    let mut n = 0;
    for &b in s {
        if !b.is_ascii_digit() {
            break;
        }
        v = v.checked_mul(10)?.checked_add(u32::from(b - b'0'))?;
        n += 1;
    }
    (n > 0).then_some((v, n))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex() {
        assert_eq!(hex_prefix(b"04000000,3"), Some((0x0400_0000, 8)));
        assert_eq!(hex_prefix(b"fFfFffffffffffff"), Some((u64::MAX, 16)));
        assert_eq!(hex_prefix(b"10000000000000000"), None);
        assert_eq!(hex_prefix(b",3"), None);
    }

    #[test]
    fn dec() {
        assert_eq!(dec_prefix_u32(b"19\r"), Some((19, 2)));
        assert_eq!(dec_prefix_u32(b"4294967295"), Some((u32::MAX, 10)));
        assert_eq!(dec_prefix_u32(b"4294967296"), None);
        assert_eq!(dec_prefix_u32(b"x"), None);
    }
}
