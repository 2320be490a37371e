//! Cache geometry: the `--I1/--D1/--LL=size,assoc,line` values, their
//! validation (spec §2.1), and the LL "tweak" (spec §2.5).

use std::fmt;

/// One cache's geometry, in bytes. Valid values (see [`CacheConfig::check`])
/// have a power-of-two line size of at least 16 and a power-of-two number
/// of sets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CacheConfig {
    /// Total size in bytes.
    pub size: u32,
    /// Ways per set.
    pub assoc: u32,
    /// Line (block) size in bytes.
    pub line_size: u32,
}

/// Why a cache geometry is rejected (spec §2.1, first failing rule wins).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CheckError {
    /// Rule 1: the line size is zero.
    LineSizeZero,
    /// Rule 2: the associativity is zero.
    AssocZero,
    /// Rule 3: `size / line / assoc` is not an exact power of two.
    SetCountNotPowerOfTwo,
    /// Rule 4: the line size is not a power of two.
    LineSizeNotPowerOfTwo,
    /// Rule 5: the line size is below 16 bytes.
    LineSizeTooSmall,
    /// Rule 6: the cache is not bigger than one line.
    SizeNotAboveLineSize,
    /// Rule 7: more ways than lines.
    AssocAboveLines,
}

impl fmt::Display for CheckError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CheckError::LineSizeZero => "Cache line size is zero.",
            CheckError::AssocZero => "Cache associativity is zero.",
            CheckError::SetCountNotPowerOfTwo => "Cache set count is not a power of two.",
            CheckError::LineSizeNotPowerOfTwo => "Cache line size is not a power of two.",
            CheckError::LineSizeTooSmall => "Cache line size is too small.",
            CheckError::SizeNotAboveLineSize => "Cache size <= line size.",
            CheckError::AssocAboveLines => "Cache associativity > (size / line size).",
        })
    }
}

/// Why an `--I1/--D1/--LL` value is rejected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OptError {
    /// Not three comma-separated integers.
    Malformed,
    /// One of the integers does not fit in a 32-bit signed int.
    Overflow,
    /// Well-formed, but fails [`CacheConfig::check`].
    Invalid(CheckError),
}

/// The smallest line size accepted (an instruction must never straddle
/// more than two lines).
pub const MIN_LINE_SIZE: i32 = 16;

/// Valgrind's `VG_(log2)`: the exponent if `x` (as unsigned) is a power of
/// two, else `None`.
fn log2(x: u32) -> Option<u32> {
    x.is_power_of_two().then(|| x.trailing_zeros())
}

/// The §2.1 checks on Valgrind's signed-int view of a geometry. Divisions
/// by a zero that the C code would trap on are reported as rule 3.
fn check_ints(size: i32, assoc: i32, line: i32) -> Result<(), CheckError> {
    if line == 0 {
        return Err(CheckError::LineSizeZero);
    }
    if assoc == 0 {
        return Err(CheckError::AssocZero);
    }
    let way_bytes = line.wrapping_mul(assoc);
    if way_bytes == 0
        || size.wrapping_rem(way_bytes) != 0
        || log2(size.wrapping_div(line).wrapping_div(assoc) as u32).is_none()
    {
        return Err(CheckError::SetCountNotPowerOfTwo);
    }
    if log2(line as u32).is_none() {
        return Err(CheckError::LineSizeNotPowerOfTwo);
    }
    if line < MIN_LINE_SIZE {
        return Err(CheckError::LineSizeTooSmall);
    }
    if size <= line {
        return Err(CheckError::SizeNotAboveLineSize);
    }
    if assoc > size / line {
        return Err(CheckError::AssocAboveLines);
    }
    Ok(())
}

/// Valgrind's `VG_(strtoll10)`: optional leading white space, an optional
/// sign, decimal digits (wrapping on overflow, as the C code does). Returns
/// the value and the unparsed rest; with no digits, the value is 0 and the
/// rest is the whole input.
fn strtoll10(s: &[u8]) -> (i64, &[u8]) {
    let mut i = 0;
    while i < s.len() && matches!(s[i], b' ' | b'\t' | b'\n' | b'\x0b' | b'\x0c' | b'\r') {
        i += 1;
    }
    let neg = s.get(i) == Some(&b'-');
    if matches!(s.get(i), Some(b'-' | b'+')) {
        i += 1;
    }
    let start = i;
    let mut n: i64 = 0;
    while let Some(d) = s.get(i).filter(|c| c.is_ascii_digit()) {
        n = n.wrapping_mul(10).wrapping_add(i64::from(d - b'0'));
        i += 1;
    }
    if i == start {
        return (0, s);
    }
    (if neg { n.wrapping_neg() } else { n }, &s[i..])
}

impl CacheConfig {
    /// A geometry from its three numbers.
    pub const fn new(size: u32, assoc: u32, line_size: u32) -> Self {
        CacheConfig {
            size,
            assoc,
            line_size,
        }
    }

    /// Parses an option value such as `65536,2,64` exactly as Valgrind's
    /// `parse_cache_opt` does, then validates it.
    pub fn parse_opt(value: &str) -> Result<CacheConfig, OptError> {
        let mut vals = [0i64; 3];
        let mut rest = value.as_bytes();
        for (k, v) in vals.iter_mut().enumerate() {
            let (n, after) = strtoll10(rest);
            *v = n;
            match (k, after.first()) {
                (0 | 1, Some(b',')) => rest = &after[1..],
                (2, None) => {}
                _ => return Err(OptError::Malformed),
            }
        }
        let ints: Vec<i32> = vals
            .iter()
            .map(|&v| i32::try_from(v).map_err(|_| OptError::Overflow))
            .collect::<Result<_, _>>()?;
        check_ints(ints[0], ints[1], ints[2]).map_err(OptError::Invalid)?;
        // The checks guarantee all three are positive.
        Ok(CacheConfig::new(
            ints[0] as u32,
            ints[1] as u32,
            ints[2] as u32,
        ))
    }

    /// Validates the geometry (spec §2.1). Like Valgrind, the numbers are
    /// seen as signed 32-bit ints.
    pub fn check(&self) -> Result<(), CheckError> {
        check_ints(self.size as i32, self.assoc as i32, self.line_size as i32)
    }

    /// Number of sets (`size / line / assoc`).
    pub fn sets(&self) -> u32 {
        self.size / self.line_size / self.assoc
    }

    /// The `desc:` text, e.g. `32768 B, 64 B, 8-way associative`.
    pub fn desc(&self) -> String {
        if self.assoc == 1 {
            format!("{} B, {} B, direct-mapped", self.size, self.line_size)
        } else {
            format!(
                "{} B, {} B, {}-way associative",
                self.size, self.line_size, self.assoc
            )
        }
    }

    /// The `-v` / error image, e.g. `32,768 B, 8-way, 64 B lines` (Valgrind
    /// prints the size with `%'d`).
    pub fn image(&self) -> String {
        format!(
            "{} B, {}-way, {} B lines",
            with_commas(i64::from(self.size as i32)),
            self.assoc as i32,
            self.line_size as i32
        )
    }

    /// The LL "tweak" (spec §2.5): forces the set count down to a power of
    /// two, scaling the associativity up to keep the size. Returns the new
    /// geometry and, when anything changed, the two warning lines (without
    /// any prefix).
    pub fn tweak_ll(&self) -> (CacheConfig, Option<[String; 2]>) {
        let (size, assoc, line) = (self.size, self.assoc, self.line_size);
        if size == 0 || assoc == 0 || line == 0 {
            return (*self, None);
        }
        let sets = size / assoc.wrapping_mul(line);
        if sets == 0 {
            return (*self, None);
        }
        let (new_size, new_assoc) = if sets.is_power_of_two() {
            (line.wrapping_mul(assoc).wrapping_mul(sets), assoc)
        } else {
            let new_sets = 1u32 << sets.ilog2();
            let factor = f64::from(sets) / f64::from(new_sets);
            let new_assoc = (0.5 + factor * f64::from(assoc)) as u32;
            (
                line.wrapping_mul(new_assoc).wrapping_mul(new_sets),
                new_assoc,
            )
        };
        if new_size == size && new_assoc == assoc {
            return (*self, None);
        }
        let warn = |what: &str, a: u32, s: u32| {
            format!(
                "warning: {what} LL cache: line_size {line}  assoc {a}  total_size {}",
                with_commas(i64::from(s))
            )
        };
        (
            CacheConfig::new(new_size, new_assoc, line),
            Some([
                warn("specified", assoc, size),
                warn("simulated", new_assoc, new_size),
            ]),
        )
    }
}

/// `n` with thousands separators, as Valgrind's `%'d` / `%'u` print it.
pub fn with_commas(n: i64) -> String {
    let digits = n.unsigned_abs().to_string();
    let mut s = String::with_capacity(digits.len() + digits.len() / 3 + 1);
    if n < 0 {
        s.push('-');
    }
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            s.push(',');
        }
        s.push(c);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<CacheConfig, OptError> {
        CacheConfig::parse_opt(s)
    }

    #[test]
    fn parses_valid_values() {
        assert_eq!(parse("65536,2,64"), Ok(CacheConfig::new(65536, 2, 64)));
        // strtoll10 skips leading blanks and takes a sign.
        assert_eq!(parse(" 32768,+8, 64"), Ok(CacheConfig::new(32768, 8, 64)));
        // Sizes and ways need not be powers of two, only the set count.
        assert_eq!(parse("24576,6,64"), Ok(CacheConfig::new(24576, 6, 64)));
        assert_eq!(parse("128,2,64"), Ok(CacheConfig::new(128, 2, 64)));
    }

    #[test]
    fn malformed_and_overflow() {
        for bad in [
            "65536,2",
            "65536,2,64,",
            "65536;2;64",
            "a,2,64",
            "65536,2,64 ",
            "",
        ] {
            assert_eq!(parse(bad), Err(OptError::Malformed), "{bad:?}");
        }
        assert_eq!(parse("99999999999,2,64"), Err(OptError::Overflow));
        assert_eq!(parse("65536,2,-2147483649"), Err(OptError::Overflow));
    }

    #[test]
    fn check_order_and_messages() {
        use CheckError::*;
        let cases = [
            ("65536,2,0", LineSizeZero),
            ("65536,0,64", AssocZero),
            ("0,0,0", LineSizeZero),
            ("1000,2,64", SetCountNotPowerOfTwo),
            ("65536,2,48", SetCountNotPowerOfTwo),
            ("65536,3,64", SetCountNotPowerOfTwo),
            (",2,64", SetCountNotPowerOfTwo),
            ("-65536,2,64", SetCountNotPowerOfTwo),
            ("128,4,64", SetCountNotPowerOfTwo),
            ("8192,2,8", LineSizeTooSmall),
            ("64,1,64", SizeNotAboveLineSize),
            ("65536,1,65536", SizeNotAboveLineSize),
        ];
        for (opt, want) in cases {
            assert_eq!(parse(opt), Err(OptError::Invalid(want)), "{opt}");
        }
        // A 24-byte line with a power-of-two set count fails rule 4.
        assert_eq!(
            parse("3072,1,24"),
            Err(OptError::Invalid(LineSizeNotPowerOfTwo))
        );
        assert_eq!(
            SetCountNotPowerOfTwo.to_string(),
            "Cache set count is not a power of two."
        );
        assert_eq!(
            AssocAboveLines.to_string(),
            "Cache associativity > (size / line size)."
        );
    }

    #[test]
    fn desc_and_image() {
        assert_eq!(
            CacheConfig::new(32768, 8, 64).desc(),
            "32768 B, 64 B, 8-way associative"
        );
        assert_eq!(
            CacheConfig::new(268435456, 1, 64).desc(),
            "268435456 B, 64 B, direct-mapped"
        );
        assert_eq!(
            CacheConfig::new(32768, 8, 64).image(),
            "32,768 B, 8-way, 64 B lines"
        );
    }

    /// Spec §2.5 worked example and its table.
    #[test]
    fn ll_tweak_examples() {
        let (c, w) = CacheConfig::new(314_572_800, 20, 64).tweak_ll();
        assert_eq!(c, CacheConfig::new(318_767_104, 38, 64));
        assert_eq!(
            w.unwrap(),
            [
                "warning: specified LL cache: line_size 64  assoc 20  total_size 314,572,800",
                "warning: simulated LL cache: line_size 64  assoc 38  total_size 318,767,104",
            ]
        );
        let (c, w) = CacheConfig::new(12 << 20, 16, 64).tweak_ll();
        assert_eq!(c, CacheConfig::new(12_582_912, 24, 64));
        assert!(w.is_some());
        // 5 MB, 48-way: size unchanged but the assoc changes, so it warns.
        let (c, w) = CacheConfig::new(5 << 20, 48, 64).tweak_ll();
        assert_eq!(c, CacheConfig::new(5_242_880, 80, 64));
        assert!(w.is_some());
        // This machine's LL (AMD EPYC, 320 MB, 1-way) as Valgrind 3.19 tweaks it.
        let (c, w) = CacheConfig::new(335_544_320, 1, 64).tweak_ll();
        assert_eq!(c, CacheConfig::new(268_435_456, 1, 64));
        assert_eq!(
            w.unwrap()[1],
            "warning: simulated LL cache: line_size 64  assoc 1  total_size 268,435,456"
        );
        // Already fine, or degenerate: nothing, silently.
        for ok in [
            CacheConfig::new(8 << 20, 16, 64),
            CacheConfig::new(0, 16, 64),
            CacheConfig::new(32, 16, 64),
        ] {
            assert_eq!(ok.tweak_ll(), (ok, None));
        }
        // A remainder is dropped when the set count is a power of two.
        let (c, _) = CacheConfig::new(65536 + 100, 2, 64).tweak_ll();
        assert_eq!(c, CacheConfig::new(65536, 2, 64));
    }

    #[test]
    fn commas() {
        assert_eq!(with_commas(0), "0");
        assert_eq!(with_commas(-1234), "-1,234");
        assert_eq!(with_commas(314_572_800), "314,572,800");
    }
}
