//! Writes into client memory, as the tool's data structures see them.
//!
//! The tool changes client memory only while the thread that exited to it
//! is stopped, but other threads of the client may be running the very
//! code and tables being changed. Two kinds of write follow:
//!
//! * plain writes, to memory no other thread can reach yet (a new block's
//!   code, a fresh stub): queued and sent in one `process_vm_writev` before
//!   the client runs again;
//! * live writes, of one aligned 4- or 8-byte field that running threads
//!   may read right now (a rel32 being relinked, a table key): with other
//!   threads about they are made by the stopped thread itself with atomic
//!   stores (the patch gadget), after the plain writes.
//!
//! Structures that write client memory take a [`ClientMemory`], so they can
//! be tested against a fake one without a live process.

use std::cell::RefCell;

/// Where the tool's structures write client memory.
pub trait ClientMemory {
    /// Stores `size` (4 or 8) bytes of `value` at the aligned `addr`, which
    /// other threads may be reading: they see the old or the new value,
    /// never a mix. Takes effect after every earlier write, in order.
    fn write_live(&mut self, addr: u64, value: u64, size: u32);
}

/// The writes of one stop, waiting to be made (see the module doc).
#[derive(Debug, Default)]
pub struct WriteQueue {
    /// Plain writes in order, adjacent ones merged. (A `RefCell` so that
    /// reads, which take `&self`, can flush them first.)
    pending: RefCell<Vec<(u64, Vec<u8>)>>,
    /// Live writes: (address, value, size).
    live: Vec<(u64, u64, u32)>,
    /// Other threads may run code of this address space while the tool
    /// works: live writes must be atomic stores.
    pub multi: bool,
}

impl WriteQueue {
    /// Queues a plain write (see [`ClientMemory::write`]).
    pub fn push(&self, addr: u64, bytes: &[u8]) {
        let mut pending = self.pending.borrow_mut();
        if let Some((at, buf)) = pending.last_mut() {
            if *at + buf.len() as u64 == addr {
                buf.extend_from_slice(bytes);
                return;
            }
        }
        pending.push((addr, bytes.to_vec()));
    }

    /// The queued plain writes, emptying the queue.
    pub fn take_plain(&self) -> Vec<(u64, Vec<u8>)> {
        std::mem::take(&mut *self.pending.borrow_mut())
    }

    /// The queued live writes, emptying the queue: the caller makes them
    /// with atomic stores after the plain ones.
    pub fn take_live(&mut self) -> Vec<(u64, u64, u32)> {
        std::mem::take(&mut self.live)
    }
}

impl ClientMemory for WriteQueue {
    fn write_live(&mut self, addr: u64, value: u64, size: u32) {
        if self.multi {
            self.live.push((addr, value, size));
        } else {
            // Alone in its address space, the stopped thread cannot observe
            // a torn value: a plain write (in order with the others) will do.
            self.push(addr, &value.to_le_bytes()[..size as usize]);
        }
    }
}

/// A fake client memory for unit tests: bytes by address.
#[cfg(test)]
#[derive(Debug, Default)]
pub struct FakeMemory {
    /// Every byte written.
    pub bytes: std::collections::HashMap<u64, u8>,
    /// How many live writes were made.
    pub live_writes: usize,
}

#[cfg(test)]
impl FakeMemory {
    /// The little-endian word at `addr` (unwritten bytes read as 0).
    pub fn u64_at(&self, addr: u64) -> u64 {
        let mut b = [0u8; 8];
        for (i, x) in b.iter_mut().enumerate() {
            *x = self.bytes.get(&(addr + i as u64)).copied().unwrap_or(0);
        }
        u64::from_le_bytes(b)
    }
}

#[cfg(test)]
impl ClientMemory for FakeMemory {
    fn write_live(&mut self, addr: u64, value: u64, size: u32) {
        assert_eq!(addr % u64::from(size), 0, "live writes are aligned");
        self.live_writes += 1;
        for (i, &b) in value.to_le_bytes()[..size as usize].iter().enumerate() {
            self.bytes.insert(addr + i as u64, b);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_writes_merge_and_live_ones_wait_with_threads() {
        let mut q = WriteQueue::default();
        q.push(0x1000, &[1, 2]);
        q.push(0x1002, &[3]);
        q.push(0x2000, &[4]);
        q.write_live(0x3000, 7, 8);
        assert_eq!(
            q.take_plain(),
            vec![
                (0x1000, vec![1, 2, 3]),
                (0x2000, vec![4]),
                (0x3000, 7u64.to_le_bytes().to_vec())
            ]
        );
        q.multi = true;
        q.write_live(0x3000, 9, 4);
        assert!(q.take_plain().is_empty());
        assert_eq!(q.take_live(), vec![(0x3000, 9, 4)]);
    }
}
