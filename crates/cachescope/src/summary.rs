//! Cachegrind's end-of-run stderr summary (spec §6): the `I refs:` /
//! miss / rate lines, with Valgrind's own comma grouping and its own
//! float formatter (which rounds ties down, unlike C's `printf`).

/// Event totals of a run, as Cachegrind accumulates them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Totals {
    /// Instruction fetches.
    pub ir: u64,
    /// I1 misses.
    pub i1mr: u64,
    /// LL misses caused by instruction fetches.
    pub ilmr: u64,
    /// Data reads (read-modify-writes included).
    pub dr: u64,
    /// D1 read misses.
    pub d1mr: u64,
    /// LL read misses.
    pub dlmr: u64,
    /// Data writes.
    pub dw: u64,
    /// D1 write misses.
    pub d1mw: u64,
    /// LL write misses.
    pub dlmw: u64,
    /// Conditional branches executed.
    pub bc: u64,
    /// Conditional branches mispredicted.
    pub bcm: u64,
    /// Indirect branches executed.
    pub bi: u64,
    /// Indirect branches mispredicted.
    pub bim: u64,
}

impl std::ops::AddAssign for Totals {
    fn add_assign(&mut self, o: Totals) {
        self.ir += o.ir;
        self.i1mr += o.i1mr;
        self.ilmr += o.ilmr;
        self.dr += o.dr;
        self.d1mr += o.d1mr;
        self.dlmr += o.dlmr;
        self.dw += o.dw;
        self.d1mw += o.d1mw;
        self.dlmw += o.dlmw;
        self.bc += o.bc;
        self.bcm += o.bcm;
        self.bi += o.bi;
        self.bim += o.bim;
    }
}

/// The summary lines of spec §6 (current labels), without the `==PID== `
/// prefix and without the core's leading blank line; a blank line in the
/// block is an empty string.
pub fn summary_lines(t: &Totals, cache_sim: bool, branch_sim: bool) -> Vec<String> {
    // Column widths come from the raw totals, before any zero substitution.
    let l1 = comma_width(t.ir);
    let l2 = comma_width(t.dr.max(t.bc));
    let l3 = comma_width(t.dw.max(t.bi));
    let one = |label: &str, n: u64| format!("{label} {}", commas(n, l1));
    let three = |label: &str, a: u64, b: u64, c: u64, rd: &str, wr: &str| {
        format!(
            "{label} {}  ({} {rd} + {} {wr})",
            commas(a, l1),
            commas(b, l2),
            commas(c, l3)
        )
    };
    let rate3 = |label: &str, a: f64, b: f64, c: f64, tail: &str| {
        format!(
            "{label}{}% ({}%     + {}%{tail})",
            vg_float(a, 1, l1),
            vg_float(b, 1, l2),
            vg_float(c, 1, l3)
        )
    };
    let pct = |m: u64, refs: u64| m as f64 * 100.0 / refs as f64;

    let mut out = vec![one("I refs:       ", t.ir)];
    if cache_sim {
        out.push(one("I1  misses:   ", t.i1mr));
        out.push(one("LLi misses:   ", t.ilmr));
        // Valgrind substitutes 1 for a zero Ir here, and the substituted
        // value is reused by the LL rate below.
        let ir = t.ir.max(1);
        out.push(format!(
            "I1  miss rate: {}%",
            vg_float(pct(t.i1mr, ir), 2, l1)
        ));
        out.push(format!(
            "LLi miss rate: {}%",
            vg_float(pct(t.ilmr, ir), 2, l1)
        ));
        out.push(String::new());

        let (d, d1m, dlm) = (t.dr + t.dw, t.d1mr + t.d1mw, t.dlmr + t.dlmw);
        out.push(three("D refs:       ", d, t.dr, t.dw, "rd  ", "wr"));
        out.push(three("D1  misses:   ", d1m, t.d1mr, t.d1mw, "rd  ", "wr"));
        out.push(three("LLd misses:   ", dlm, t.dlmr, t.dlmw, "rd  ", "wr"));
        let (d, dr, dw) = (d.max(1), t.dr.max(1), t.dw.max(1));
        out.push(rate3(
            "D1  miss rate: ",
            pct(d1m, d),
            pct(t.d1mr, dr),
            pct(t.d1mw, dw),
            "  ",
        ));
        out.push(rate3(
            "LLd miss rate: ",
            pct(dlm, d),
            pct(t.dlmr, dr),
            pct(t.dlmw, dw),
            "  ",
        ));
        out.push(String::new());

        let (refs_r, refs_w) = (t.d1mr + t.i1mr, t.d1mw);
        let (miss_r, miss_w) = (t.dlmr + t.ilmr, t.dlmw);
        out.push(three(
            "LL refs:      ",
            refs_r + refs_w,
            refs_r,
            refs_w,
            "rd  ",
            "wr",
        ));
        out.push(three(
            "LL misses:    ",
            miss_r + miss_w,
            miss_r,
            miss_w,
            "rd  ",
            "wr",
        ));
        out.push(rate3(
            "LL miss rate:  ",
            pct(miss_r + miss_w, ir + d),
            pct(miss_r, ir + dr),
            pct(miss_w, dw),
            "  ",
        ));
    }
    if branch_sim {
        // Zeros are replaced before the sum, so they print as 1.
        let (bc, bi) = (t.bc.max(1), t.bi.max(1));
        let (b, bm) = (bc + bi, t.bcm + t.bim);
        out.push(String::new());
        out.push(three("Branches:     ", b, bc, bi, "cond", "ind"));
        out.push(three("Mispredicts:  ", bm, t.bcm, t.bim, "cond", "ind"));
        out.push(rate3(
            "Mispred rate:  ",
            pct(bm, b),
            pct(t.bcm, bc),
            pct(t.bim, bi),
            "   ",
        ));
    }
    out
}

/// Length of `n` written with thousands commas.
pub(crate) fn comma_width(n: u64) -> usize {
    let digits = n.checked_ilog10().map_or(1, |l| l as usize + 1);
    digits + (digits - 1) / 3
}

/// `n` with thousands commas, right-aligned to `width` (Valgrind's `%,Nllu`).
pub fn commas(n: u64, width: usize) -> String {
    let digits = n.to_string();
    let mut s = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            s.push(',');
        }
        s.push(c);
    }
    format!("{s:>width$}")
}

/// Valgrind's `%*.Nf` (coregrind's own printf): the fraction is truncated
/// to `prec` digits and bumped by one only when the rest is *strictly*
/// greater than one half, so exact ties round down. With no digits, there
/// is no point either (Lackey's `%.0f%%`).
pub fn vg_float(v: f64, prec: u32, width: usize) -> String {
    let neg = v < 0.0;
    let v = v.abs();
    let mut ipart = v as u64;
    let frac = v - ipart as f64;
    let factor = 10u64.pow(prec);
    let scaled = frac * factor as f64;
    let mut fr = scaled as u64;
    if scaled - fr as f64 > 0.5 {
        fr += 1;
    }
    if fr == factor {
        ipart += 1;
        fr = 0;
    }
    let sign = if neg { "-" } else { "" };
    let p = prec as usize;
    let s = if prec == 0 {
        format!("{sign}{ipart}")
    } else {
        format!("{sign}{ipart}.{fr:0p$}")
    };
    format!("{s:>width$}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(t: &Totals, cache: bool, branch: bool) -> String {
        summary_lines(t, cache, branch).join("\n")
    }

    /// The §6 example (3.19 run with both simulations), current labels.
    #[test]
    fn spec_example_block() {
        let t = Totals {
            ir: 123_546,
            i1mr: 1_075,
            ilmr: 1_060,
            dr: 28_165,
            d1mr: 1_101,
            dlmr: 969,
            dw: 9_933,
            d1mw: 330,
            dlmw: 306,
            bc: 24_577,
            bcm: 3_072,
            bi: 279,
            bim: 145,
        };
        let want = "\
I refs:        123,546
I1  misses:      1,075
LLi misses:      1,060
I1  miss rate:    0.87%
LLi miss rate:    0.86%

D refs:         38,098  (28,165 rd   + 9,933 wr)
D1  misses:      1,431  ( 1,101 rd   +   330 wr)
LLd misses:      1,275  (   969 rd   +   306 wr)
D1  miss rate:     3.8% (   3.9%     +   3.3%  )
LLd miss rate:     3.3% (   3.4%     +   3.1%  )

LL refs:         2,506  ( 2,176 rd   +   330 wr)
LL misses:       2,335  ( 2,029 rd   +   306 wr)
LL miss rate:      1.4% (   1.3%     +   3.1%  )

Branches:       24,856  (24,577 cond +   279 ind)
Mispredicts:     3,217  ( 3,072 cond +   145 ind)
Mispred rate:     12.9% (  12.5%     +  52.0%   )";
        assert_eq!(block(&t, true, true), want);
    }

    /// Numbers from a real Valgrind 3.19 run here (`cachegrind
    /// --cache-sim=yes --branch-sim=yes ls /`), labels updated.
    #[test]
    fn valgrind_319_run() {
        let t = Totals {
            ir: 569_883,
            i1mr: 2_266,
            ilmr: 2_006,
            dr: 143_974,
            d1mr: 3_591,
            dlmr: 2_298,
            dw: 59_594,
            d1mw: 977,
            dlmw: 880,
            bc: 94_229,
            bcm: 8_826,
            bi: 4_434,
            bim: 549,
        };
        let want = "\
I refs:        569,883
I1  misses:      2,266
LLi misses:      2,006
I1  miss rate:    0.40%
LLi miss rate:    0.35%

D refs:        203,568  (143,974 rd   + 59,594 wr)
D1  misses:      4,568  (  3,591 rd   +    977 wr)
LLd misses:      3,178  (  2,298 rd   +    880 wr)
D1  miss rate:     2.2% (    2.5%     +    1.6%  )
LLd miss rate:     1.6% (    1.6%     +    1.5%  )

LL refs:         6,834  (  5,857 rd   +    977 wr)
LL misses:       5,184  (  4,304 rd   +    880 wr)
LL miss rate:      0.7% (    0.6%     +    1.5%  )

Branches:       98,663  ( 94,229 cond +  4,434 ind)
Mispredicts:     9,375  (  8,826 cond +    549 ind)
Mispred rate:      9.5% (    9.4%     +   12.4%   )";
        assert_eq!(block(&t, true, true), want);
    }

    #[test]
    fn branch_only_and_zero_substitution() {
        let t = Totals {
            ir: 7,
            ..Totals::default()
        };
        assert_eq!(
            summary_lines(&t, false, true),
            vec![
                "I refs:        7",
                "",
                "Branches:      2  (1 cond + 1 ind)",
                "Mispredicts:   0  (0 cond + 0 ind)",
                "Mispred rate:  0.0% (0.0%     + 0.0%   )",
            ]
        );
        assert_eq!(summary_lines(&t, false, false), vec!["I refs:        7"]);
    }

    #[test]
    fn all_zero_cache_block() {
        let lines = summary_lines(&Totals::default(), true, false);
        assert_eq!(lines[0], "I refs:        0");
        assert_eq!(lines[3], "I1  miss rate: 0.00%");
        assert_eq!(lines[6], "D refs:        0  (0 rd   + 0 wr)");
        assert_eq!(lines[9], "D1  miss rate: 0.0% (0.0%     + 0.0%  )");
        assert_eq!(lines[14], "LL miss rate:  0.0% (0.0%     + 0.0%  )");
    }

    #[test]
    fn float_ties_round_down_and_carry() {
        assert_eq!(vg_float(0.75, 1, 0), "0.7");
        assert_eq!(vg_float(0.25, 1, 0), "0.2");
        assert_eq!(vg_float(0.76, 1, 0), "0.8");
        assert_eq!(vg_float(9.96, 1, 5), " 10.0");
        assert_eq!(vg_float(0.999, 2, 0), "1.00");
        assert_eq!(vg_float(100.0, 2, 6), "100.00");
        assert_eq!(vg_float(39.92, 0, 0), "40");
        assert_eq!(vg_float(99.5, 0, 0), "99");
    }

    #[test]
    fn comma_grouping() {
        assert_eq!(commas(0, 1), "0");
        assert_eq!(commas(999, 0), "999");
        assert_eq!(commas(1000, 7), "  1,000");
        assert_eq!(commas(318_767_104, 0), "318,767,104");
        assert_eq!(comma_width(0), 1);
        assert_eq!(comma_width(1_000_000), 9);
        assert_eq!(comma_width(u64::MAX), 26);
    }
}
