//! Throughput of the models alone (no trace parsing, no instrumentation):
//! accesses per second for streams that mostly hit L1 and streams that
//! mostly miss, and branches per second for the predictor.
//!
//! Run with `cargo bench -p cachesim --bench models` (or `bench/models.sh`).
//! An optional argument scales the number of accesses (default 1.0).
//! Output: one `name<TAB>accesses<TAB>seconds<TAB>M accesses/s` line each.

use cachesim::{AccessCounts, BranchPredictor, CacheConfig, CacheSim};
use std::hint::black_box;
use std::time::Instant;

/// A typical desktop hierarchy: 32 KB 8-way L1s, an 8 MB 16-way LL.
fn sim() -> CacheSim {
    CacheSim::new(
        CacheConfig::new(32768, 8, 64),
        CacheConfig::new(32768, 8, 64),
        CacheConfig::new(8 << 20, 16, 64),
    )
}

/// A fast, cheap address generator (so the generator does not dominate).
#[inline(always)]
fn xorshift(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

fn report(name: &str, n: u64, secs: f64, counts: &[AccessCounts]) {
    let refs: u64 = counts.iter().map(|c| c.refs).sum();
    let l1: u64 = counts.iter().map(|c| c.l1_misses).sum();
    let ll: u64 = counts.iter().map(|c| c.ll_misses).sum();
    assert_eq!(refs, n);
    println!(
        "{name}\t{n}\t{secs:.3}\t{:.1}\t(L1 miss {:.1}%, LL miss {:.1}%)",
        n as f64 / secs / 1e6,
        100.0 * l1 as f64 / refs as f64,
        100.0 * ll as f64 / refs as f64,
    );
}

/// Data reads cycling through 16 KB with an 8-byte stride: all D1 hits
/// after the first pass.
fn l1_hit_reads(n: u64) {
    let mut s = sim();
    let mut dr = AccessCounts::default();
    let base = 0x7ff0_0000u64;
    let t = Instant::now();
    for i in 0..n {
        let addr = base + ((i * 8) & 0x3fff);
        dr.record(s.read(black_box(addr), 8));
    }
    report(
        "l1-hit reads",
        n,
        t.elapsed().as_secs_f64(),
        &[black_box(dr)],
    );
}

/// An instruction stream like a hot loop: a fetch per instruction and a
/// read or write every other instruction, all hitting L1.
fn l1_hit_mixed(n: u64) {
    let mut s = sim();
    let (mut ir, mut dr, mut dw) = Default::default();
    let (code, data) = (0x40_1000u64, 0x7ff0_0000u64);
    let t = Instant::now();
    let mut done = 0;
    let mut i = 0u64;
    while done < n {
        let pc = code + ((i * 4) & 0x7ff);
        AccessCounts::record(&mut ir, s.instr(black_box(pc), 4));
        done += 1;
        if i & 1 == 0 {
            let addr = data + ((i * 8) & 0x1fff);
            if i & 2 == 0 {
                AccessCounts::record(&mut dr, s.read(black_box(addr), 8));
            } else {
                AccessCounts::record(&mut dw, s.write(black_box(addr), 8));
            }
            done += 1;
        }
        i += 1;
    }
    report(
        "l1-hit mixed I+D",
        done,
        t.elapsed().as_secs_f64(),
        &[ir, dr, dw],
    );
}

/// Random reads over 64 MB: nearly all miss D1, most miss the 8 MB LL.
fn miss_reads(n: u64) {
    let mut s = sim();
    let mut dr = AccessCounts::default();
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let t = Instant::now();
    for _ in 0..n {
        let addr = 0x1000_0000 + (xorshift(&mut x) & 0x3ff_fff8);
        dr.record(s.read(addr, 8));
    }
    report(
        "miss reads (64 MB)",
        n,
        t.elapsed().as_secs_f64(),
        &[black_box(dr)],
    );
}

/// Random reads over 4 MB: miss D1, hit LL.
fn ll_hit_reads(n: u64) {
    let mut s = sim();
    let mut dr = AccessCounts::default();
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    // Warm the LL so the timed part sees LL hits.
    for i in 0..(4u64 << 20) / 64 {
        s.read(0x1000_0000 + i * 64, 8);
    }
    let t = Instant::now();
    for _ in 0..n {
        let addr = 0x1000_0000 + (xorshift(&mut x) & 0x3f_fff8);
        dr.record(s.read(addr, 8));
    }
    report(
        "L1-miss/LL-hit reads (4 MB)",
        n,
        t.elapsed().as_secs_f64(),
        &[black_box(dr)],
    );
}

/// Conditional branches with a data-dependent pattern.
fn branches(n: u64) {
    let mut bp = BranchPredictor::new();
    let mut x = 0x1234_5678u64;
    let mut bcm = 0u64;
    let t = Instant::now();
    for i in 0..n {
        let pc = 0x40_1000 + ((i & 63) * 6);
        let taken = (xorshift(&mut x) & 3) != 0;
        bcm += u64::from(bp.cond(pc, taken));
    }
    let secs = t.elapsed().as_secs_f64();
    println!(
        "cond branches\t{n}\t{secs:.3}\t{:.1}\t(mispredict {:.1}%)",
        n as f64 / secs / 1e6,
        100.0 * black_box(bcm) as f64 / n as f64
    );
}

fn main() {
    // `cargo bench` passes `--bench`; a number scales the work.
    let scale: f64 = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(1.0);
    let n = |base: f64| (base * scale) as u64;
    println!("stream\taccesses\tseconds\tM/s");
    l1_hit_reads(n(400e6));
    l1_hit_mixed(n(400e6));
    ll_hit_reads(n(50e6));
    miss_reads(n(20e6));
    branches(n(200e6));
}
