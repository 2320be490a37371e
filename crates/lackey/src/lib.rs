//! Valgrind's Lackey as a tool on the event stream: `--trace-mem=yes`
//! prints every instruction fetch and data access in Lackey's format, and
//! `--basic-counts=yes` (Lackey's default) counts executed instructions,
//! conditional branches and calls to one function.
//!
//! The trace is Lackey's, line for line:
//!
//! ```text
//! I  00401000,2
//! I  00401002,5
//!  S 1ffefffd58,8
//!  L 00402000,16
//!  M 00403010,4
//! ```
//!
//! `I` is an instruction (address, length), followed by its data accesses
//! in the order it makes them: ` L` a load, ` S` a store, ` M` a
//! read-modify-write of one location; addresses in lower-case hex of at
//! least eight digits, sizes in decimal. A rep-prefixed string instruction
//! is one `I` line per iteration with that iteration's accesses, and a last
//! `I` line alone when it finds RCX exhausted (Cachegrind's n+1 rule).
//!
//! Lines are formatted into a buffer that one [`TraceOut`] shares between
//! the tools of all processes of a run (the engine feeds them from one
//! consumer thread), written out in large pieces; whoever prints messages
//! to the same destination calls [`TraceOut::flush`] first.
#![forbid(unsafe_code)]

mod out;

pub use out::TraceOut;

use events::{AccessKind, BlockId, BlockInfo, Needs, Record, Tool};

/// What the Lackey tool does (its command-line options).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LackeyOptions {
    /// `--trace-mem=yes`: print the instruction and data references.
    pub trace_mem: bool,
    /// `--basic-counts=yes` (the default): count instructions, conditional
    /// branches and calls to [`fnname`](Self::fnname).
    pub basic_counts: bool,
    /// `--fnname=`: the function whose calls are counted (`main`).
    pub fnname: String,
}

impl Default for LackeyOptions {
    fn default() -> Self {
        LackeyOptions {
            trace_mem: false,
            basic_counts: true,
            fnname: "main".to_string(),
        }
    }
}

/// Lackey's basic counts of one process.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BasicCounts {
    /// Instructions executed (each iteration of a rep string instruction
    /// and its final check counting one, as Cachegrind's Ir).
    pub guest_instrs: u64,
    /// Conditional branches executed (Cachegrind's Bc: `jcc`, `loop`,
    /// `jrcxz`, the checks of rep string instructions).
    pub jccs: u64,
    /// Of those, the taken ones (for a rep check: the ones that go on).
    pub jccs_taken: u64,
}

/// The Lackey tool of one process.
#[derive(Clone)]
pub struct LackeyTool {
    trace: Option<TraceOut>,
    basic_counts: bool,
    counts: BasicCounts,
    /// Per block id: its instruction addresses (for counting calls).
    blocks: Vec<Box<[u64]>>,
    /// Per block id: how often it was entered.
    runs: Vec<u64>,
}

impl LackeyTool {
    /// A tool doing what `opts` asks, printing its trace (if any) to
    /// `out`.
    pub fn new(opts: &LackeyOptions, out: TraceOut) -> LackeyTool {
        LackeyTool {
            trace: opts.trace_mem.then_some(out),
            basic_counts: opts.basic_counts,
            counts: BasicCounts::default(),
            blocks: Vec::new(),
            runs: Vec::new(),
        }
    }

    /// The basic counts so far.
    pub fn counts(&self) -> BasicCounts {
        self.counts
    }

    /// How many times an instruction at a function's entry was executed,
    /// `is_entry(addr)` telling whether `addr` is the entry of the counted
    /// function (Lackey counts calls this way: every execution of the
    /// function's first instruction, however it was reached).
    pub fn calls(&self, mut is_entry: impl FnMut(u64) -> bool) -> u64 {
        let mut calls = 0;
        for (addrs, &runs) in self.blocks.iter().zip(&self.runs) {
            if runs > 0 {
                calls += runs * addrs.iter().filter(|&&a| is_entry(a)).count() as u64;
            }
        }
        calls
    }

    fn entered(&mut self, id: BlockId) {
        if let Some(r) = self.runs.get_mut(id.0 as usize) {
            *r += 1;
        }
    }
}

impl Tool for LackeyTool {
    fn needs(&self) -> Needs {
        Needs {
            instr_fetches: self.trace.is_some(),
            data_refs: self.trace.is_some(),
            cond_branches: self.basic_counts,
            ..Needs::COUNTING
        }
    }

    fn block(&mut self, id: BlockId, info: &BlockInfo) {
        let i = id.0 as usize;
        if self.blocks.len() <= i {
            self.blocks.resize_with(i + 1, Default::default);
            self.runs.resize(i + 1, 0);
        }
        self.blocks[i] = info.instrs().iter().map(|i| i.addr).collect();
    }

    fn record(&mut self, record: Record) {
        match record {
            Record::Block(id) => self.entered(id),
            Record::Instr(i) => {
                self.counts.guest_instrs += 1;
                if let Some(t) = &self.trace {
                    t.write(|w| w.instr(i.addr, i.len));
                }
            }
            Record::Data(d) => {
                if let Some(t) = &self.trace {
                    t.write(|w| w.data(d.kind, d.addr, d.size));
                }
            }
            Record::CondBranch(b) => {
                self.counts.jccs += 1;
                self.counts.jccs_taken += u64::from(b.taken);
            }
            Record::Indirect(_) | Record::Call(_) | Record::Return(_) => {}
        }
    }

    fn block_run(&mut self, id: BlockId, info: &BlockInfo, addrs: &[u64]) {
        self.entered(id);
        self.counts.guest_instrs += info.instrs().len() as u64;
        let Some(t) = &self.trace else {
            return;
        };
        // One lock for the whole block.
        t.write(|w| {
            let mut next = addrs.iter();
            for (n, i) in info.instrs().iter().enumerate() {
                w.instr(i.addr, u32::from(i.len));
                for (m, &addr) in info.mem_operands(n).iter().zip(next.by_ref()) {
                    w.data(m.kind, addr, m.size);
                }
            }
        });
    }
}

/// The letter of a data access's line.
fn kind_letter(kind: AccessKind) -> u8 {
    match kind {
        AccessKind::Read => b'L',
        AccessKind::Write => b'S',
        AccessKind::Modify => b'M',
    }
}

#[cfg(test)]
mod tests;
