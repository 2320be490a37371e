//! Client memory as the tool's data structures see it: reads, writes and
//! the memory map of one client address space.
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
//! Everything the tool does to a client's memory goes through a
//! [`ClientMemory`]: [`ProcMemory`] for a live process (`/proc/PID/mem`,
//! `process_vm_writev`, `/proc/PID/maps`), and in unit tests `FakeMemory`
//! (bytes by address and a settable memory map), so that the code cache,
//! its links and the indirect-branch table are testable without a process.

use crate::sys::SharedMap;
use crate::EngineError;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::Arc;

/// One mapping of the client's memory map (a line of `/proc/PID/maps`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mapping {
    /// First address.
    pub start: u64,
    /// One past the last address.
    pub end: u64,
    /// Executable.
    pub exec: bool,
    /// Writable.
    pub write: bool,
    /// Shared (`MAP_SHARED`): other mappings of the same memory see its
    /// writes and it sees theirs.
    pub shared: bool,
    /// File offset that `start` maps.
    pub offset: u64,
    /// The mapped file's path, or a pseudo-path such as `[stack]`, or empty.
    pub path: String,
}

/// A live write waiting for the patch gadget: (address, value, size).
pub type LivePatch = (u64, u64, u32);

/// Reads and writes of one client address space (see the module doc).
pub trait ClientMemory {
    /// Writes `bytes` at `addr`, memory no other thread reads yet. Queued:
    /// takes effect, in order with the other writes, at the next
    /// [`ClientMemory::flush`] (or read).
    fn write(&mut self, addr: u64, bytes: &[u8]);

    /// Stores `size` (4 or 8) bytes of `value` at `addr`, which other
    /// threads may be reading: they see the old or the new value, never a
    /// mix. The field must not straddle a cache line (x86 makes such a
    /// store atomic; emitted rel32 fields and table entries never do). Takes effect after every earlier write, in order (with
    /// other threads about, when the caller applies
    /// [`ClientMemory::take_live`] through the patch gadget).
    fn write_live(&mut self, addr: u64, value: u64, size: u32);

    /// Makes the queued plain writes.
    fn flush(&mut self) -> Result<(), EngineError>;

    /// The tool will rarely touch `addr..addr + len` again: where it is
    /// memory shared with the client ([`ClientMemory::share`]), the tool's
    /// own pages of it may go. The default keeps everything.
    fn release(&mut self, addr: u64, len: u64) {
        let _ = (addr, len);
    }

    /// Reads exactly `len` bytes at `addr`, after making the queued writes.
    fn read(&mut self, addr: u64, len: usize) -> Result<Vec<u8>, EngineError>;

    /// Fills `buf` from `addr` (no allocation: trace buffers are read into
    /// recycled memory).
    fn read_into(&mut self, addr: u64, buf: &mut [u8]) -> Result<(), EngineError> {
        let b = self.read(addr, buf.len())?;
        buf.copy_from_slice(&b);
        Ok(())
    }

    /// Reads one little-endian 64-bit word.
    fn read_u64(&mut self, addr: u64) -> Result<u64, EngineError> {
        let b = self.read(addr, 8)?;
        Ok(u64::from_le_bytes(b.try_into().expect("8 bytes")))
    }

    /// Whether other threads may run code of this address space while the
    /// tool works (then live writes wait for the patch gadget).
    fn set_multi(&mut self, multi: bool);

    /// What [`ClientMemory::set_multi`] said last.
    fn is_multi(&self) -> bool;

    /// The live writes that wait for the patch gadget, emptying the queue:
    /// the caller makes them with atomic stores after the plain ones.
    fn take_live(&mut self) -> Vec<LivePatch>;

    /// The client's memory map as it is now.
    fn maps(&mut self) -> Result<Vec<Mapping>, EngineError>;

    /// Whether [`ClientMemory::share`] can work (worth the client's
    /// system calls that prepare it).
    fn can_share(&self) -> bool {
        false
    }

    /// Maps the client's memory file `client_fd`, which backs the client's
    /// private mapping of `[addr, addr + len)`, into the tool as well: the
    /// writes and reads of that range then go straight to it, with no
    /// system call. The client must never write that memory itself (its
    /// private copy of a page would no longer see the tool's writes).
    /// Returns false when that cannot be done; the caller closes the
    /// client's descriptor either way.
    fn share(&mut self, addr: u64, len: u64, client_fd: i32) -> bool {
        let _ = (addr, len, client_fd);
        false
    }

    /// Maps the client's memory file `client_fd`, which backs the client's
    /// *shared* mapping of `[addr, addr + len)` (a thread's trace buffers,
    /// which the client writes), into the tool as well: reads and writes of
    /// the range go straight to it, and the returned map lets another
    /// thread of the tool read it in place. `None` when that cannot be
    /// done; the caller closes the client's descriptor either way.
    fn share_buffers(&mut self, addr: u64, len: u64, client_fd: i32) -> Option<Arc<SharedMap>> {
        let _ = (addr, len, client_fd);
        None
    }

    /// The process has exited and nothing will read its memory again:
    /// the memory files it shares with the tool (code cache chunks, trace
    /// buffers) are emptied, their pages freed (see
    /// [`SharedMap::discard`]).
    fn discard_shared(&mut self) {}
}

/// The writes of one stop, waiting to be made (see the module doc).
#[derive(Debug, Default)]
pub struct WriteQueue {
    /// Plain writes in order, adjacent ones merged.
    pending: Vec<(u64, Vec<u8>)>,
    /// Live writes waiting for the patch gadget.
    live: Vec<LivePatch>,
    /// Other threads may run code of this address space while the tool
    /// works: live writes must be atomic stores.
    multi: bool,
}

impl WriteQueue {
    /// Queues a plain write.
    pub fn push(&mut self, addr: u64, bytes: &[u8]) {
        if let Some((at, buf)) = self.pending.last_mut() {
            if *at + buf.len() as u64 == addr {
                buf.extend_from_slice(bytes);
                return;
            }
        }
        self.pending.push((addr, bytes.to_vec()));
    }

    /// Queues a live write: for the patch gadget with other threads about,
    /// else as a plain write.
    pub fn push_live(&mut self, addr: u64, value: u64, size: u32) {
        if self.multi {
            self.live.push((addr, value, size));
        } else {
            // Alone in its address space, the stopped thread cannot observe
            // a torn value: a plain write (in order with the others) will do.
            self.push(addr, &value.to_le_bytes()[..size as usize]);
        }
    }

    /// The queued plain writes, emptying the queue.
    pub fn take_plain(&mut self) -> Vec<(u64, Vec<u8>)> {
        std::mem::take(&mut self.pending)
    }

    /// The queued live writes, emptying the queue.
    pub fn take_live(&mut self) -> Vec<LivePatch> {
        std::mem::take(&mut self.live)
    }
}

/// The memory of a live traced process: reads and fallback writes through
/// `/proc/PID/mem` (which ignores page protections), batched writes with
/// `process_vm_writev`, the map from `/proc/PID/maps`.
pub struct ProcMemory {
    pid: i32,
    mem: File,
    queue: WriteQueue,
    /// Client ranges also mapped into the tool ([`ClientMemory::share`]),
    /// by client address.
    windows: Vec<(u64, Arc<SharedMap>)>,
    /// Sharing failed once (an old kernel, a sandbox): not tried again.
    share_failed: bool,
    /// An error of a flush that a live write had to make first, reported
    /// by the next flush.
    deferred: Option<EngineError>,
}

fn io_err(what: &str, e: std::io::Error) -> EngineError {
    EngineError(format!("{what}: {e}"))
}

impl ProcMemory {
    /// The memory of process `pid`.
    pub fn open(pid: i32) -> Result<ProcMemory, EngineError> {
        let mem = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(format!("/proc/{pid}/mem"))
            .map_err(|e| io_err("cannot open the client's memory", e))?;
        Ok(ProcMemory {
            pid,
            mem,
            queue: WriteQueue::default(),
            windows: Vec::new(),
            share_failed: false,
            deferred: None,
        })
    }

    /// The window holding `addr`, and `addr`'s offset in it.
    fn window(&self, addr: u64) -> Option<(&SharedMap, usize)> {
        self.windows
            .iter()
            .find(|(base, m)| addr >= *base && addr - base < m.size() as u64)
            .map(|(base, m)| (&**m, (addr - base) as usize))
    }

    /// Makes the queued writes to memory outside the windows.
    fn flush_queue(&mut self) -> Result<(), EngineError> {
        let pending = self.queue.take_plain();
        for batch in pending.chunks(512) {
            let parts: Vec<(u64, &[u8])> = batch.iter().map(|(a, b)| (*a, b.as_slice())).collect();
            let total: usize = batch.iter().map(|(_, b)| b.len()).sum();
            if crate::sys::write_remote(self.pid, &parts).ok() == Some(total) {
                continue;
            }
            for (addr, bytes) in batch {
                self.mem
                    .write_all_at(bytes, *addr)
                    .map_err(|e| io_err(&format!("cannot write client memory at {addr:#x}"), e))?;
            }
        }
        Ok(())
    }
}

impl ClientMemory for ProcMemory {
    /// Into a window: at once (the client sees the bytes no earlier than
    /// it would after a flush that made the queued ones too: a window only
    /// holds code no one runs before the tool links to it). Elsewhere:
    /// queued.
    fn write(&mut self, addr: u64, bytes: &[u8]) {
        match self.window(addr) {
            Some((map, off)) => {
                let inside = bytes.len().min(map.size() - off);
                map.write(off, &bytes[..inside]);
                if inside < bytes.len() {
                    self.write(addr + inside as u64, &bytes[inside..]);
                }
            }
            None => self.queue.push(addr, bytes),
        }
    }

    fn write_live(&mut self, addr: u64, value: u64, size: u32) {
        if self.window(addr).is_none() {
            self.queue.push_live(addr, value, size);
            return;
        }
        // In order after every earlier write: with other threads about,
        // those queued go first (alone, the client sees them all at once).
        if self.queue.multi {
            if let Err(e) = self.flush_queue() {
                self.deferred.get_or_insert(e);
            }
        }
        let (map, off) = self.window(addr).expect("checked above");
        map.store(off, value, size);
    }

    /// One `process_vm_writev` for all the queued writes (the engine's
    /// regions are writable), else one `pwrite` each (guest code is not).
    fn flush(&mut self) -> Result<(), EngineError> {
        if let Some(e) = self.deferred.take() {
            return Err(e);
        }
        self.flush_queue()
    }

    fn can_share(&self) -> bool {
        !self.share_failed
    }

    fn release(&mut self, addr: u64, len: u64) {
        if let Some((map, off)) = self.window(addr) {
            map.release(off, len as usize);
        }
    }

    fn share(&mut self, addr: u64, len: u64, client_fd: i32) -> bool {
        self.share_buffers(addr, len, client_fd).is_some()
    }

    fn discard_shared(&mut self) {
        for (_, map) in &self.windows {
            map.discard();
        }
    }

    fn share_buffers(&mut self, addr: u64, len: u64, client_fd: i32) -> Option<Arc<SharedMap>> {
        match SharedMap::from_client_fd(self.pid, client_fd, len as usize) {
            Ok(map) => {
                let map = Arc::new(map);
                self.windows.push((addr, map.clone()));
                Some(map)
            }
            Err(_) => {
                self.share_failed = true;
                None
            }
        }
    }

    fn read(&mut self, addr: u64, len: usize) -> Result<Vec<u8>, EngineError> {
        let mut buf = vec![0u8; len];
        self.read_into(addr, &mut buf)?;
        Ok(buf)
    }

    fn read_into(&mut self, addr: u64, buf: &mut [u8]) -> Result<(), EngineError> {
        if let Some((map, off)) = self.window(addr) {
            if off + buf.len() <= map.size() {
                map.read(off, buf);
                return Ok(());
            }
        }
        self.flush()?;
        if buf.len() >= 4096 && crate::sys::read_remote(self.pid, addr, buf).ok() == Some(buf.len())
        {
            return Ok(());
        }
        self.mem
            .read_exact_at(buf, addr)
            .map_err(|e| io_err(&format!("cannot read client memory at {addr:#x}"), e))
    }

    fn set_multi(&mut self, multi: bool) {
        self.queue.multi = multi;
    }

    fn is_multi(&self) -> bool {
        self.queue.multi
    }

    fn take_live(&mut self) -> Vec<LivePatch> {
        self.queue.take_live()
    }

    fn maps(&mut self) -> Result<Vec<Mapping>, EngineError> {
        let text = std::fs::read_to_string(format!("/proc/{}/maps", self.pid))
            .map_err(|e| io_err("cannot read the client's memory map", e))?;
        Ok(text.lines().filter_map(parse_maps_line).collect())
    }
}

/// One line of `/proc/PID/maps`.
fn parse_maps_line(line: &str) -> Option<Mapping> {
    let mut it = line.split_ascii_whitespace();
    let range = it.next()?;
    let perms = it.next()?;
    let offset = u64::from_str_radix(it.next()?, 16).ok()?;
    let _dev = it.next()?;
    let _inode = it.next()?;
    let path = it.collect::<Vec<_>>().join(" ");
    let (s, e) = range.split_once('-')?;
    Some(Mapping {
        start: u64::from_str_radix(s, 16).ok()?,
        end: u64::from_str_radix(e, 16).ok()?,
        exec: perms.as_bytes().get(2) == Some(&b'x'),
        write: perms.as_bytes().get(1) == Some(&b'w'),
        shared: perms.as_bytes().get(3) == Some(&b's'),
        offset,
        path,
    })
}

#[cfg(test)]
pub use fake::FakeMemory;

#[cfg(test)]
mod fake {
    use super::{ClientMemory, LivePatch, Mapping};
    use crate::EngineError;
    use std::cell::RefCell;
    use std::collections::HashMap;
    use std::rc::Rc;

    #[derive(Debug, Default)]
    struct State {
        bytes: HashMap<u64, u8>,
        live: Vec<LivePatch>,
        /// Every write, plain or live: (address, length, live).
        log: Vec<(u64, usize, bool)>,
        maps: Vec<Mapping>,
        multi: bool,
    }

    /// A fake client memory for unit tests: bytes by address (unwritten
    /// ones read as 0) and a settable memory map. Writes take effect at
    /// once. Clones share the memory, so a test keeps one to look into
    /// what the code under test was given.
    #[derive(Debug, Default, Clone)]
    pub struct FakeMemory(Rc<RefCell<State>>);

    impl FakeMemory {
        /// Adds a mapping to the memory map.
        pub fn add_mapping(&self, start: u64, end: u64, perms: &str, path: &str) {
            let p = perms.as_bytes();
            self.0.borrow_mut().maps.push(Mapping {
                start,
                end,
                exec: p.get(2) == Some(&b'x'),
                write: p.get(1) == Some(&b'w'),
                shared: p.get(3) == Some(&b's'),
                offset: 0,
                path: path.into(),
            });
        }

        /// Puts `bytes` at `addr`.
        pub fn poke(&self, addr: u64, bytes: &[u8]) {
            let mut s = self.0.borrow_mut();
            for (i, &b) in bytes.iter().enumerate() {
                s.bytes.insert(addr + i as u64, b);
            }
        }

        /// `len` bytes at `addr`.
        pub fn peek(&self, addr: u64, len: usize) -> Vec<u8> {
            let s = self.0.borrow();
            (0..len as u64)
                .map(|i| s.bytes.get(&(addr + i)).copied().unwrap_or(0))
                .collect()
        }

        /// The little-endian word at `addr`.
        pub fn u64_at(&self, addr: u64) -> u64 {
            u64::from_le_bytes(self.peek(addr, 8).try_into().expect("8 bytes"))
        }

        /// The little-endian 32-bit value at `addr`.
        pub fn i32_at(&self, addr: u64) -> i32 {
            i32::from_le_bytes(self.peek(addr, 4).try_into().expect("4 bytes"))
        }

        /// Every live write made so far, in order.
        pub fn live_writes(&self) -> Vec<LivePatch> {
            self.0.borrow().live.clone()
        }

        /// Every write made so far, in order: (address, length, whether
        /// it was a live write).
        pub fn write_log(&self) -> Vec<(u64, usize, bool)> {
            self.0.borrow().log.clone()
        }
    }

    impl ClientMemory for FakeMemory {
        fn write(&mut self, addr: u64, bytes: &[u8]) {
            self.poke(addr, bytes);
            self.0.borrow_mut().log.push((addr, bytes.len(), false));
        }

        fn write_live(&mut self, addr: u64, value: u64, size: u32) {
            assert!(size == 4 || size == 8, "live writes are 4 or 8 bytes");
            let line = |a: u64| a / 64;
            assert_eq!(
                line(addr),
                line(addr + u64::from(size) - 1),
                "a live write at {addr:#x} straddles a cache line"
            );
            self.poke(addr, &value.to_le_bytes()[..size as usize]);
            self.0.borrow_mut().live.push((addr, value, size));
            self.0.borrow_mut().log.push((addr, size as usize, true));
        }

        fn flush(&mut self) -> Result<(), EngineError> {
            Ok(())
        }

        fn read(&mut self, addr: u64, len: usize) -> Result<Vec<u8>, EngineError> {
            Ok(self.peek(addr, len))
        }

        fn set_multi(&mut self, multi: bool) {
            self.0.borrow_mut().multi = multi;
        }

        fn is_multi(&self) -> bool {
            self.0.borrow().multi
        }

        fn take_live(&mut self) -> Vec<LivePatch> {
            Vec::new()
        }

        fn maps(&mut self) -> Result<Vec<Mapping>, EngineError> {
            Ok(self.0.borrow().maps.clone())
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
        q.push_live(0x3000, 7, 8);
        assert_eq!(
            q.take_plain(),
            vec![
                (0x1000, vec![1, 2, 3]),
                (0x2000, vec![4]),
                (0x3000, 7u64.to_le_bytes().to_vec())
            ]
        );
        q.multi = true;
        q.push_live(0x3000, 9, 4);
        assert!(q.take_plain().is_empty());
        assert_eq!(q.take_live(), vec![(0x3000, 9, 4)]);
    }

    #[test]
    fn maps_lines_parse() {
        let m = parse_maps_line(
            "7ffff7dd3000-7ffff7f3b000 r-xp 00028000 fe:01 1234   /usr/lib/x86_64-linux-gnu/libc.so.6",
        )
        .unwrap();
        assert_eq!(m.start, 0x7ffff7dd3000);
        assert_eq!(m.end, 0x7ffff7f3b000);
        assert!(m.exec && !m.write);
        assert_eq!(m.offset, 0x28000);
        assert_eq!(m.path, "/usr/lib/x86_64-linux-gnu/libc.so.6");
        let v = parse_maps_line("7ffff7fc1000-7ffff7fc3000 r-xp 00000000 00:00 0  [vdso]").unwrap();
        assert_eq!(v.path, "[vdso]");
        let a = parse_maps_line("7ffff7fc5000-7ffff7fc7000 rw-p 00000000 00:00 0").unwrap();
        assert!(a.write && !a.exec && a.path.is_empty() && !a.shared);
        let s =
            parse_maps_line("7ffff7fc8000-7ffff7fc9000 r-xs 00000000 00:01 9 /memfd:jit (deleted)")
                .unwrap();
        assert!(s.shared && s.exec && !s.write);
        assert_eq!(s.path, "/memfd:jit (deleted)");
    }

    #[test]
    fn a_live_process_reads_back_what_was_written() {
        // Our own memory stands in for a client's.
        let mut mem = ProcMemory::open(std::process::id() as i32).unwrap();
        let mut buf = vec![0u8; 64];
        let at = buf.as_mut_ptr() as u64;
        mem.write(at, &[1, 2, 3]);
        mem.write(at + 3, &[4]);
        mem.write_live(at + 8, 0x1122_3344, 4);
        assert_eq!(mem.read(at, 4).unwrap(), [1, 2, 3, 4]);
        assert_eq!(mem.read_u64(at + 8).unwrap(), 0x1122_3344);
        assert!(mem.take_live().is_empty());
        assert!(mem.maps().unwrap().iter().any(|m| m.path == "[stack]"));
        std::hint::black_box(&buf);
    }
}
