//! Where the trace goes: one buffer, shared by the tools of a run's
//! processes, written out in large pieces.

use std::io::Write;
use std::sync::{Arc, Mutex, MutexGuard};

use events::AccessKind;

/// Bytes gathered before they are written out: few, large writes (a trace
/// is tens of bytes per instruction).
const FLUSH_AT: usize = 256 * 1024;

/// The destination of a run's trace, shared by its processes' tools (a
/// forked child's tool writes to the same place, as under Valgrind, where
/// the child inherits the log's file descriptor). Lines are buffered:
/// [`flush`](Self::flush) before anything else is written to the same
/// destination.
#[derive(Clone)]
pub struct TraceOut(Arc<Mutex<Sink>>);

struct Sink {
    buf: Vec<u8>,
    dest: Box<dyn Write + Send>,
    /// Writing failed once (a closed pipe, a full disk): the rest of the
    /// trace is dropped rather than failing the client's run.
    failed: bool,
}

impl Sink {
    fn drain(&mut self) {
        if !self.failed
            && self
                .dest
                .write_all(&self.buf)
                .and_then(|()| self.dest.flush())
                .is_err()
        {
            self.failed = true;
        }
        self.buf.clear();
    }
}

impl TraceOut {
    /// A trace written to `dest`.
    pub fn new(dest: Box<dyn Write + Send>) -> TraceOut {
        TraceOut(Arc::new(Mutex::new(Sink {
            buf: Vec::with_capacity(FLUSH_AT + 4096),
            dest,
            failed: false,
        })))
    }

    fn lock(&self) -> MutexGuard<'_, Sink> {
        // A panic elsewhere while holding it leaves the buffer usable.
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Appends lines through `f` (under one lock) and writes the buffer out
    /// once it is large.
    pub(crate) fn write(&self, f: impl FnOnce(&mut Lines<'_>)) {
        let mut sink = self.lock();
        f(&mut Lines(&mut sink.buf));
        if sink.buf.len() >= FLUSH_AT {
            sink.drain();
        }
    }

    /// Writes out everything buffered.
    pub fn flush(&self) {
        self.lock().drain();
    }

    /// Whether a write failed (the trace is then incomplete).
    pub fn failed(&self) -> bool {
        self.lock().failed
    }
}

/// Appends Lackey's lines to a buffer.
pub(crate) struct Lines<'a>(&'a mut Vec<u8>);

impl Lines<'_> {
    /// `I  addr,len`.
    pub fn instr(&mut self, addr: u64, len: u32) {
        self.0.extend_from_slice(b"I  ");
        self.addr_size(addr, len);
    }

    /// ` L addr,size`, ` S addr,size` or ` M addr,size`.
    pub fn data(&mut self, kind: AccessKind, addr: u64, size: u32) {
        self.0
            .extend_from_slice(&[b' ', crate::kind_letter(kind), b' ']);
        self.addr_size(addr, size);
    }

    /// `%08lx,%lu\n`, as Lackey prints it.
    fn addr_size(&mut self, addr: u64, size: u32) {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let digits = (16 - addr.leading_zeros() as usize / 4).max(8);
        let at = self.0.len();
        self.0.resize(at + digits, b'0');
        let mut v = addr;
        for d in self.0[at..].iter_mut().rev() {
            *d = HEX[(v & 0xf) as usize];
            v >>= 4;
        }
        self.0.push(b',');
        let mut dec = [0u8; 10];
        let mut n = dec.len();
        let mut v = size;
        loop {
            n -= 1;
            dec[n] = b'0' + (v % 10) as u8;
            v /= 10;
            if v == 0 {
                break;
            }
        }
        self.0.extend_from_slice(&dec[n..]);
        self.0.push(b'\n');
    }
}
