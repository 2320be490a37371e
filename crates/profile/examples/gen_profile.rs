//! Writes a large synthetic `cachegrind.out` file for benchmarks
//! (`bench/annotate.sh`): Cachegrind's layout and event set (`--cache-sim=
//! yes` of Valgrind 3.19), many files and functions, skewed counts so that
//! thresholds and sorting have work to do. The output is deterministic.
//!
//! Usage: `gen_profile OUT [MEGABYTES]` (default 70).

use std::io::{BufWriter, Write};

/// A small deterministic generator (xorshift64*).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// The output and the number of bytes written to it.
struct Counted {
    out: BufWriter<std::fs::File>,
    written: u64,
}

impl Counted {
    fn emit(&mut self, s: &str) -> std::io::Result<()> {
        self.written += s.len() as u64;
        self.out.write_all(s.as_bytes())
    }
}

fn main() -> std::io::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let Some(out) = args.get(1) else {
        eprintln!("usage: gen_profile OUT [MEGABYTES]");
        std::process::exit(2);
    };
    let megabytes: u64 = args.get(2).and_then(|m| m.parse().ok()).unwrap_or(70);
    let target = megabytes * 1_000_000;

    let mut w = Counted {
        out: BufWriter::with_capacity(1 << 20, std::fs::File::create(out)?),
        written: 0,
    };
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    w.emit("desc: I1 cache:         32768 B, 64 B, 8-way associative\n")?;
    w.emit("desc: D1 cache:         32768 B, 64 B, 8-way associative\n")?;
    w.emit("desc: LL cache:         8388608 B, 64 B, 16-way associative\n")?;
    w.emit("cmd: ./big-program --with arguments\n")?;
    w.emit("events: Ir I1mr ILmr Dr D1mr DLmr Dw D1mw DLmw \n")?;

    let mut totals = [0u64; 9];
    let mut file_no = 0u64;
    let mut line = String::new();
    while w.written < target {
        file_no += 1;
        let dir = rng.below(40);
        w.emit(&format!(
            "fl=/usr/src/project/module{dir}/source_file_{file_no}.c\n"
        ))?;
        let funcs = 1 + rng.below(30);
        for f in 0..funcs {
            w.emit(&format!("fn=module{dir}_function_{file_no}_{f}\n"))?;
            let first = 1 + rng.below(2000);
            let lines = 1 + rng.below(60);
            // A few hot functions carry most of the cost.
            let heat = if rng.below(50) == 0 { 10_000 } else { 1 };
            for l in 0..lines {
                let ir = (1 + rng.below(400_000)) * heat;
                let dr = ir * (1 + rng.below(3)) / 3;
                let dw = ir * rng.below(3) / 4;
                let (i1, d1r, d1w) = (
                    rng.below(ir / 100 + 1) / 4,
                    rng.below(dr / 20 + 1),
                    rng.below(dw / 50 + 1),
                );
                let counts = [
                    ir,
                    i1,
                    rng.below(i1 + 1),
                    dr,
                    d1r,
                    rng.below(d1r / 10 + 1),
                    dw,
                    d1w,
                    rng.below(d1w / 4 + 1),
                ];
                line.clear();
                line.push_str(&(first + 3 * l).to_string());
                for (t, c) in totals.iter_mut().zip(counts) {
                    *t += c;
                    line.push(' ');
                    line.push_str(&c.to_string());
                }
                line.push('\n');
                w.emit(&line)?;
            }
        }
    }
    let mut summary = String::from("summary:");
    for t in totals {
        summary.push_str(&format!(" {t}"));
    }
    summary.push('\n');
    w.emit(&summary)?;
    w.out.flush()
}
