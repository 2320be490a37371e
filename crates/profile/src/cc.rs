//! Cost-centre arithmetic and the count lines of the `cachegrind.out`
//! format. Sums wrap on overflow instead of panicking: inputs are
//! untrusted, and only absurd files (counts near 2^63) can overflow.

/// `acc += cc`, element-wise.
#[inline]
pub fn add_to(acc: &mut [i64], cc: &[i64]) {
    for (a, c) in acc.iter_mut().zip(cc) {
        *a = a.wrapping_add(*c);
    }
}

/// `acc -= cc`, element-wise.
#[inline]
pub fn sub_from(acc: &mut [i64], cc: &[i64]) {
    for (a, c) in acc.iter_mut().zip(cc) {
        *a = a.wrapping_sub(*c);
    }
}

/// Appends `first`, then ` <count>` for each count, then a newline: a
/// count line (`first` is the line number) or a `summary:` line.
pub fn write_counts(out: &mut Vec<u8>, first: &str, counts: &[i64]) {
    out.extend_from_slice(first.as_bytes());
    for &c in counts {
        out.push(b' ');
        push_int(out, c);
    }
    out.push(b'\n');
}

/// Appends `v` in decimal (what `{}` gives, without the formatting
/// machinery: profiles have millions of counts).
pub fn push_int(out: &mut Vec<u8>, v: i64) {
    let mut buf = [0u8; 20];
    let mut i = buf.len();
    let mut u = v.unsigned_abs();
    loop {
        i -= 1;
        buf[i] = b'0' + (u % 10) as u8;
        u /= 10;
        if u == 0 {
            break;
        }
    }
    if v < 0 {
        out.push(b'-');
    }
    out.extend_from_slice(&buf[i..]);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arithmetic_and_lines() {
        let mut a = vec![1, 2, i64::MAX];
        add_to(&mut a, &[1, -5, 1]);
        assert_eq!(a, vec![2, -3, i64::MIN]);
        sub_from(&mut a, &[2, -3, 1]);
        assert_eq!(a, vec![0, 0, i64::MAX]);
        let mut out = Vec::new();
        write_counts(&mut out, "7", &[1, -2]);
        write_counts(&mut out, "summary:", &[]);
        assert_eq!(out, b"7 1 -2\nsummary:\n");
        for v in [0, 9, 10, -1, 1234567, i64::MAX, i64::MIN] {
            let mut out = Vec::new();
            push_int(&mut out, v);
            assert_eq!(out, v.to_string().as_bytes());
        }
    }
}
