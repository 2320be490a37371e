//! Trace buffers handed to the consumer in place.
//!
//! Where the client's memory can be shared with the tool, each thread
//! area's trace buffers are one memory file that the client maps shared and
//! the tool maps too (`space::trace`). A full buffer then reaches the
//! consumer as a [`BufferView`] of its words instead of a copy: the tracer
//! no longer reads 8 bytes per record out of the client (on python-json
//! that copy had been most of the tracer's time). In exchange, a buffer
//! must not be written while a view of it lives: the tracer lets a thread
//! write a buffer again only after [`Gate::wait_free`], and the consumer
//! drops each view once decoded.

use crate::layout::TRACE_BUFFERS;
use crate::sys::SharedMap;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// How many views of each of a thread area's trace buffers the consumer
/// still holds.
#[derive(Debug, Default)]
pub(crate) struct Gate {
    views: Mutex<[u32; TRACE_BUFFERS]>,
    closed: Condvar,
}

impl Gate {
    /// A gate with no views open.
    pub fn new() -> Arc<Gate> {
        Arc::new(Gate::default())
    }

    /// Waits until no view of buffer `buffer` is left; returns how long
    /// that took (the client's thread waits as long: the consumer is
    /// behind).
    pub fn wait_free(&self, buffer: usize) -> Duration {
        let started = Instant::now();
        let mut views = self.views.lock().unwrap_or_else(|e| e.into_inner());
        while views[buffer] != 0 {
            views = self.closed.wait(views).unwrap_or_else(|e| e.into_inner());
        }
        started.elapsed()
    }

    /// Whether a view of buffer `buffer` is open.
    #[cfg(test)]
    fn is_viewed(&self, buffer: usize) -> bool {
        self.views.lock().unwrap_or_else(|e| e.into_inner())[buffer] != 0
    }

    fn open(&self, buffer: usize) {
        self.views.lock().unwrap_or_else(|e| e.into_inner())[buffer] += 1;
    }

    fn close(&self, buffer: usize) {
        let mut views = self.views.lock().unwrap_or_else(|e| e.into_inner());
        views[buffer] -= 1;
        if views[buffer] == 0 {
            self.closed.notify_all();
        }
    }
}

/// A thread area's trace buffers as the tool maps them, and their gate.
#[derive(Debug, Clone)]
pub(crate) struct SharedBuffers {
    /// The buffers, from the first one's start.
    pub map: Arc<SharedMap>,
    /// Which buffers the consumer still reads.
    pub gate: Arc<Gate>,
    /// The client address of the first buffer.
    pub base: u64,
}

/// Words of a trace buffer: their byte offset in the buffers and how many
/// (64-bit records, or 32-bit branch words).
pub(crate) type Span = (usize, usize);

impl SharedBuffers {
    /// A view of buffer `buffer`'s records at `records` and branch words
    /// at `branches` (open until dropped).
    pub fn view(&self, buffer: usize, records: Span, branches: Span) -> BufferView {
        // (Checked now, not when the consumer reads: a bad range is the
        // tracer's error.)
        let _ = (self.words(records), self.halves(branches));
        self.gate.open(buffer);
        BufferView {
            buffers: self.clone(),
            buffer,
            records,
            branches,
        }
    }

    fn words(&self, (off, n): Span) -> &[u64] {
        self.map.words(off, n)
    }

    fn halves(&self, (off, n): Span) -> &[u32] {
        self.map.halves(off, n)
    }
}

/// Complete records and branch words in a shared trace buffer, which the
/// thread does not write again before the view is dropped (it may write
/// the rest of the buffer meanwhile, between the two: no slice covers
/// that).
#[derive(Debug)]
pub(crate) struct BufferView {
    buffers: SharedBuffers,
    buffer: usize,
    records: Span,
    branches: Span,
}

impl BufferView {
    /// The records' words.
    pub fn records(&self) -> &[u64] {
        self.buffers.words(self.records)
    }

    /// The branch words, last first.
    pub fn branch_words(&self) -> &[u32] {
        self.buffers.halves(self.branches)
    }

    /// The client address of the first branch word.
    pub fn branch_base(&self) -> u64 {
        self.buffers.base + self.branches.0 as u64
    }
}

impl Drop for BufferView {
    fn drop(&mut self) {
        self.buffers.gate.close(self.buffer);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_buffer_is_free_once_its_last_view_is_dropped() {
        let gate = Gate::new();
        gate.open(1);
        gate.open(1);
        gate.open(2);
        assert!(gate.is_viewed(1) && gate.is_viewed(2) && !gate.is_viewed(0));
        // Buffer 0 has no view: no wait.
        gate.wait_free(0);
        let waiter = {
            let gate = gate.clone();
            std::thread::spawn(move || gate.wait_free(1))
        };
        gate.close(1);
        assert!(gate.is_viewed(1));
        gate.close(1);
        waiter
            .join()
            .expect("the waiter returns once both views are gone");
        assert!(!gate.is_viewed(1) && gate.is_viewed(2));
    }
}
