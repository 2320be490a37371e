use super::*;
use events::{expand_block_run, CondBranch, MemOperand, Terminator};
use std::io::Write;
use std::sync::{Arc, Mutex};

/// A destination the test can read back.
#[derive(Clone, Default)]
struct Shared(Arc<Mutex<Vec<u8>>>);

impl Write for Shared {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Shared {
    fn text(&self) -> String {
        String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
    }
}

fn tool(trace_mem: bool) -> (LackeyTool, TraceOut, Shared) {
    let dest = Shared::default();
    let out = TraceOut::new(Box::new(dest.clone()));
    let opts = LackeyOptions {
        trace_mem,
        ..LackeyOptions::default()
    };
    (LackeyTool::new(&opts, out.clone()), out, dest)
}

fn op(size: u32, kind: AccessKind) -> MemOperand {
    MemOperand { size, kind }
}

fn sample_block() -> BlockInfo {
    let mut b = BlockInfo::new(0x401000, Terminator::CondJump { target: 0x401000 });
    b.push(0x401000, 5, &[op(8, AccessKind::Write)]);
    b.push(0x401005, 3, &[]);
    b.push(
        0x401008,
        7,
        &[op(4, AccessKind::Modify), op(16, AccessKind::Read)],
    );
    b
}

const SAMPLE_TRACE: &str = "I  00401000,5\n S 7ffffffde0f8,8\nI  00401005,3\n\
                            I  00401008,7\n M 00000010,4\n L 123456789abcdef0,16\n";

#[test]
fn lines_are_lackeys() {
    let (mut t, out, dest) = tool(true);
    let b = sample_block();
    t.block(BlockId(0), &b);
    t.block_run(BlockId(0), &b, &[0x7ffffffde0f8, 0x10, 0x123456789abcdef0]);
    assert_eq!(dest.text(), "", "buffered until flushed");
    out.flush();
    assert_eq!(dest.text(), SAMPLE_TRACE);
    assert!(!out.failed());
}

/// A block run prints what the records it stands for print (the path a
/// rep instruction's final check and trace readers take).
#[test]
fn block_runs_and_records_agree() {
    let b = sample_block();
    let addrs = [0x7ffffffde0f8, 0x10, 0x123456789abcdef0];
    let (mut t, out, dest) = tool(true);
    t.block(BlockId(0), &b);
    let mut records = Vec::new();
    expand_block_run(BlockId(0), &b, &addrs, &mut records);
    t.records(&records);
    out.flush();
    assert_eq!(dest.text(), SAMPLE_TRACE);
    assert_eq!(t.counts().guest_instrs, 3);
}

#[test]
fn basic_counts_and_calls() {
    let (mut t, out, dest) = tool(false);
    assert!(!t.needs().data_refs && t.needs().cond_branches);
    let b = sample_block();
    let mut callee = BlockInfo::new(0x402000, Terminator::Return);
    callee.push(0x402000, 1, &[]);
    callee.push(0x402001, 1, &[]);
    t.block(BlockId(0), &b);
    t.block(BlockId(1), &callee);
    for k in 0..4 {
        t.block_run(BlockId(0), &b, &[]);
        t.record(Record::CondBranch(CondBranch {
            pc: 0x401008,
            taken: k < 3,
        }));
    }
    t.block_run(BlockId(1), &callee, &[]);
    out.flush();
    assert_eq!(dest.text(), "", "no trace without --trace-mem=yes");
    assert_eq!(
        t.counts(),
        BasicCounts {
            guest_instrs: 14,
            jccs: 4,
            jccs_taken: 3
        }
    );
    assert_eq!(t.calls(|a| a == 0x402000), 1);
    assert_eq!(t.calls(|a| a == 0x401005), 4);
    assert_eq!(t.calls(|_| false), 0);
}

/// Forked tools write to the same place, in the order they are fed.
#[test]
fn a_fork_shares_the_destination() {
    let (mut parent, out, dest) = tool(true);
    let mut one = BlockInfo::new(0x1000, Terminator::FallThrough);
    one.push(0x1000, 2, &[]);
    parent.block(BlockId(0), &one);
    parent.block_run(BlockId(0), &one, &[]);
    let mut child = parent.clone();
    child.block_run(BlockId(0), &one, &[]);
    parent.block_run(BlockId(0), &one, &[]);
    out.flush();
    assert_eq!(dest.text(), "I  00001000,2\n".repeat(3));
    assert_eq!(child.counts().guest_instrs, 2);
    assert_eq!(child.calls(|a| a == 0x1000), 2);
}

/// A destination that fails: the trace stops, nothing panics.
#[test]
fn a_failing_destination_is_noted() {
    struct Broken;
    impl Write for Broken {
        fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
            Err(std::io::ErrorKind::BrokenPipe.into())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let out = TraceOut::new(Box::new(Broken));
    let opts = LackeyOptions {
        trace_mem: true,
        ..LackeyOptions::default()
    };
    let mut t = LackeyTool::new(&opts, out.clone());
    let b = sample_block();
    t.block(BlockId(0), &b);
    for _ in 0..20_000 {
        t.block_run(BlockId(0), &b, &[1, 2, 3]);
    }
    out.flush();
    assert!(out.failed());
    assert_eq!(t.counts().guest_instrs, 60_000);
}
