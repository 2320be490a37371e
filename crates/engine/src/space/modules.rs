//! The client's code as the tool reads it: the memory map (kept until
//! an address is missing from it or mappings change), the module records
//! that counts are attributed to, and the guest code pages already read.
//!
//! A module is recorded when code in it is first translated and the record
//! outlives the mapping, so code that ran before a dlclose still resolves
//! at exit. Code pages are cached only for *stable* mappings: private,
//! read-only mappings of ordinary files, whose bytes change only through
//! the mmap family (which drops the cached pages). Everything else
//! (anonymous or writable memory, memory files, `/dev/shm`, deleted files,
//! shared mappings) can change behind the tool's back: it is read afresh
//! for each translation, and `--smc-check` decides which of its blocks
//! check their bytes on entry (see [`Modules::needs_check`]).

use crate::client_mem::{ClientMemory, Mapping};
use crate::layout::MAX_BLOCK_GUEST_BYTES;
use crate::{EngineError, ModuleRecord, SmcCheck};
use rustc_hash::FxHashMap as HashMap;
use std::collections::hash_map::Entry;
use std::path::PathBuf;

/// Guest code is read and cached in pages of this size.
const PAGE: u64 = 4096;

/// How far below the top of the main stack nothing of ours may go: the
/// kernel keeps mmap below the stack by at least 128 MiB (more with a larger
/// stack rlimit at exec), the room the stack has to grow.
const STACK_GAP: u64 = 128 << 20;

/// The map, modules and code pages of one address space.
#[derive(Debug, Clone, Default)]
pub(super) struct Modules {
    /// The memory map as last read (cleared when mappings change).
    maps: Vec<Mapping>,
    /// Every executable mapping code was translated from.
    records: Vec<ModuleRecord>,
    /// Index in `records` by (start, end, file offset, path).
    recorded: HashMap<(u64, u64, u64, String), usize>,
    /// How many of `records` have been handed out as new.
    announced: usize,
    /// The record [`Modules::record`] returned last.
    last_recorded: Option<usize>,
    /// Guest code pages already read, by address.
    pages: HashMap<u64, Vec<u8>>,
}

impl Modules {
    /// Reads the memory map afresh, in address order (as `/proc/PID/maps`
    /// lists it; test memories may not).
    fn read_maps(&mut self, mem: &mut dyn ClientMemory) -> Result<(), EngineError> {
        self.maps = mem.maps()?;
        self.maps.sort_unstable_by_key(|m| m.start);
        Ok(())
    }

    fn find(&self, addr: u64) -> Option<&Mapping> {
        // In address order (see `read_maps`).
        let i = self.maps.partition_point(|m| m.end <= addr);
        self.maps.get(i).filter(|m| m.start <= addr)
    }

    /// Up to `len` bytes of guest code from `addr` on, when it is in an
    /// executable mapping known already whose code cannot change in place
    /// (see `stable`): what a translation may read of code it does not
    /// translate (its successors') and rely on.
    pub fn stable_code(
        &mut self,
        addr: u64,
        len: u64,
        mem: &mut dyn ClientMemory,
    ) -> Option<Vec<u8>> {
        let m = self.find(addr).filter(|m| m.exec && stable(m))?.clone();
        self.read_code_upto(addr, &m, len, mem).ok()
    }

    /// The mapping that holds `addr`, which the client is about to run (an
    /// executable one), or why it cannot be run.
    pub fn code_mapping(
        &mut self,
        addr: u64,
        mem: &mut dyn ClientMemory,
    ) -> Result<Mapping, EngineError> {
        if let Some(m) = self.find(addr) {
            if m.exec {
                return Ok(m.clone());
            }
        }
        self.read_maps(mem)?;
        match self.find(addr) {
            Some(m) if m.exec => Ok(m.clone()),
            Some(_) => Err(EngineError(format!(
                "the client jumped to non-executable memory at {addr:#x}"
            ))),
            None => Err(EngineError(format!(
                "the client jumped to unmapped address {addr:#x}"
            ))),
        }
    }

    /// Whether the blocks translated from `m` check their guest bytes on
    /// entry under `mode`; `sp` is the stack pointer of the thread the
    /// translation is for (`--smc-check=stack` checks the mapping it is in,
    /// as Valgrind checks the segment that holds the thread's SP).
    pub fn needs_check(m: &Mapping, mode: SmcCheck, sp: u64) -> bool {
        match mode {
            SmcCheck::None => false,
            SmcCheck::Stack => m.start <= sp && sp < m.end,
            SmcCheck::All => true,
            SmcCheck::AllNonFile => !stable(m),
        }
    }

    /// The index in [`Modules::records`] of mapping `m`, recorded now if
    /// it is new.
    pub fn record(&mut self, m: &Mapping) -> usize {
        // Consecutive translations are mostly from one module: no key to
        // build and hash for them.
        if let Some(&i) = self.last_recorded.as_ref() {
            let r = &self.records[i];
            if (r.start, r.end, r.file_offset) == (m.start, m.end, m.offset)
                && r.path.as_os_str() == std::ffi::OsStr::new(&m.path)
            {
                return i;
            }
        }
        let i = self.record_slow(m);
        self.last_recorded = Some(i);
        i
    }

    fn record_slow(&mut self, m: &Mapping) -> usize {
        let key = (m.start, m.end, m.offset, m.path.clone());
        if let Some(&i) = self.recorded.get(&key) {
            return i;
        }
        self.records.push(ModuleRecord {
            path: PathBuf::from(&m.path),
            start: m.start,
            end: m.end,
            file_offset: m.offset,
        });
        self.recorded.insert(key, self.records.len() - 1);
        self.records.len() - 1
    }

    /// Every module code was translated from, by index.
    pub fn records(&self) -> &[ModuleRecord] {
        &self.records
    }

    /// The modules recorded since the previous call.
    pub fn take_new(&mut self) -> Vec<ModuleRecord> {
        let new = self.records[self.announced..].to_vec();
        self.announced = self.records.len();
        new
    }

    /// The guest code at `addr` in mapping `m` that one block may span:
    /// through the page cache (a page at a time) when `m` is stable, read
    /// afresh otherwise.
    pub fn read_code(
        &mut self,
        addr: u64,
        m: &Mapping,
        mem: &mut dyn ClientMemory,
    ) -> Result<Vec<u8>, EngineError> {
        // No block spans more; copying a page per block (120,000 blocks
        // in a python run) showed up in profiles of translation.
        self.read_code_upto(addr, m, MAX_BLOCK_GUEST_BYTES, mem)
    }

    /// [`Modules::read_code`], at most `len` bytes.
    fn read_code_upto(
        &mut self,
        addr: u64,
        m: &Mapping,
        len: u64,
        mem: &mut dyn ClientMemory,
    ) -> Result<Vec<u8>, EngineError> {
        let len = (m.end - addr).min(len) as usize;
        if !stable(m) {
            return mem.read(addr, len);
        }
        let mut out = Vec::with_capacity(len);
        let end = addr + len as u64;
        let mut at = addr;
        while at < end {
            let page = at & !(PAGE - 1);
            let data = match self.pages.entry(page) {
                Entry::Occupied(e) => e.into_mut(),
                Entry::Vacant(e) => e.insert(mem.read(page, PAGE as usize)?),
            };
            let from = (at - page) as usize;
            let to = (end - page).min(PAGE) as usize;
            out.extend_from_slice(&data[from..to]);
            at = page + to as u64;
        }
        Ok(out)
    }

    /// The guest code in `[start, end)` changed in place (a failed
    /// self-modifying-code check): its cached pages, if any, go.
    pub fn code_changed(&mut self, start: u64, end: u64) {
        self.drop_pages(start, end);
    }

    fn drop_pages(&mut self, start: u64, end: u64) {
        self.pages.retain(|&p, _| p + PAGE <= start || p >= end);
    }

    /// The lowest address of the main stack's room to grow (`u64::MAX`
    /// when there is no `[stack]` mapping): nothing of the tool's may be
    /// mapped above it.
    pub fn stack_floor(&mut self, mem: &mut dyn ClientMemory) -> Result<u64, EngineError> {
        let stack = |maps: &[Mapping]| maps.iter().find(|m| m.path == "[stack]").map(|m| m.end);
        if stack(&self.maps).is_none() {
            self.read_maps(mem)?;
        }
        Ok(stack(&self.maps).map_or(u64::MAX, |end| end.saturating_sub(STACK_GAP)))
    }

    /// The range `[start, end)` is being unmapped or remapped: the map is
    /// read again when next needed, its code pages are dropped, and a later
    /// mapping there is a new module (the records stay, for the counts).
    pub fn forget(&mut self, start: u64, end: u64) {
        self.maps.clear();
        self.drop_pages(start, end);
        self.recorded.retain(|k, _| k.1 <= start || k.0 >= end);
        self.last_recorded = None;
    }
}

/// Whether the bytes of mapping `m` change only through the mmap family:
/// a private, read-only mapping of an ordinary file (or the kernel's vdso).
/// Memory files, `/dev/shm` and deleted files are typically mapped twice by
/// JITs (written through one mapping, run through the other), and a shared
/// mapping sees every other mapping's writes.
fn stable(m: &Mapping) -> bool {
    if m.path == "[vdso]" || m.path == "[vsyscall]" {
        return true;
    }
    !m.write
        && !m.shared
        && m.path.starts_with('/')
        && !m.path.starts_with("/memfd:")
        && !m.path.starts_with("/dev/shm/")
        && !m.path.ends_with(" (deleted)")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client_mem::FakeMemory;

    #[test]
    fn code_must_be_executable() {
        let mut fake = FakeMemory::default();
        fake.add_mapping(0x40_0000, 0x40_1000, "r-xp", "/bin/x");
        fake.add_mapping(0x40_1000, 0x40_2000, "rwxp", "");
        fake.add_mapping(0x40_2000, 0x40_3000, "rw-p", "/bin/x");
        let mut m = Modules::default();
        assert_eq!(m.code_mapping(0x40_0010, &mut fake).unwrap().path, "/bin/x");
        assert!(m.code_mapping(0x40_1010, &mut fake).unwrap().write);
        let data = m.code_mapping(0x40_2000, &mut fake).unwrap_err().0;
        assert!(data.contains("non-executable"), "{data}");
        let none = m.code_mapping(0x50_0000, &mut fake).unwrap_err().0;
        assert!(none.contains("unmapped address 0x500000"), "{none}");
    }

    #[test]
    fn which_code_is_checked_under_each_smc_mode() {
        let fake = FakeMemory::default();
        let maps = [
            ("r-xp", "/usr/lib/libc.so.6"),
            ("r-xp", "[vdso]"),
            ("rwxp", "/usr/lib/libc.so.6"),
            ("r-xs", "/usr/lib/libc.so.6"),
            ("r-xp", ""),
            ("rwxp", ""),
            ("r-xs", "/memfd:jit (deleted)"),
            ("r-xp", "/dev/shm/jit"),
            ("r-xp", "/tmp/jit (deleted)"),
            ("rwxp", "[stack]"),
        ];
        for (n, (perms, path)) in maps.iter().enumerate() {
            let at = 0x10_0000 * (n as u64 + 1);
            fake.add_mapping(at, at + 0x1000, perms, path);
        }
        let maps = fake.clone().maps().unwrap();
        let checked = |mode, sp| -> Vec<bool> {
            maps.iter()
                .map(|m| Modules::needs_check(m, mode, sp))
                .collect()
        };
        // Only ordinary read-only private file mappings (and the vdso) go
        // unchecked by default.
        let mut want = [true; 10];
        want[0] = false;
        want[1] = false;
        assert_eq!(checked(SmcCheck::AllNonFile, 0), want);
        assert_eq!(checked(SmcCheck::All, 0), [true; 10]);
        assert_eq!(checked(SmcCheck::None, 0), [false; 10]);
        let sp = 0xa0_0800;
        let mut want = [false; 10];
        want[9] = true;
        assert_eq!(checked(SmcCheck::Stack, sp), want);
    }

    #[test]
    fn a_module_is_recorded_once_and_anew_after_its_range_is_forgotten() {
        let mut fake = FakeMemory::default();
        fake.add_mapping(0x40_0000, 0x40_2000, "r-xp", "/lib/a.so");
        let mut m = Modules::default();
        let map = m.code_mapping(0x40_0000, &mut fake).unwrap();
        assert_eq!(m.record(&map), 0);
        assert_eq!(m.record(&map), 0);
        m.forget(0x40_1000, 0x40_2000);
        // Mapped again at the same place (dlopen after dlclose).
        assert_eq!(m.record(&map), 1);
        assert_eq!(m.records().len(), 2);
        assert_eq!(m.records()[1].path, PathBuf::from("/lib/a.so"));
    }

    #[test]
    fn stable_code_is_read_through_pages_that_invalidation_drops() {
        let mut fake = FakeMemory::default();
        fake.add_mapping(0x40_0000, 0x40_2000, "r-xp", "/bin/x");
        let map = fake.maps().unwrap()[0].clone();
        fake.poke(0x40_0ffe, &[1, 2, 3, 4]);
        let mut m = Modules::default();
        let code = m.read_code(0x40_0ffe, &map, &mut fake).unwrap();
        // As much as one block may span, across the page boundary.
        assert_eq!(
            (&code[..4], code.len() as u64),
            (&[1, 2, 3, 4][..], MAX_BLOCK_GUEST_BYTES)
        );
        // Cached: a change in the client is not seen...
        fake.poke(0x40_1000, &[9]);
        assert_eq!(m.read_code(0x40_1000, &map, &mut fake).unwrap()[0], 3);
        // ...until the range is forgotten (only the pages in it).
        m.forget(0x40_1000, 0x40_2000);
        fake.poke(0x40_0ffe, &[7]);
        assert_eq!(
            m.read_code(0x40_0ffe, &map, &mut fake).unwrap()[..4],
            [1, 2, 9, 4]
        );
        // Never past the mapping.
        assert_eq!(m.read_code(0x40_1ffe, &map, &mut fake).unwrap().len(), 2);
        // Or changed in place.
        fake.poke(0x40_1000, &[8]);
        m.code_changed(0x40_1000, 0x40_1001);
        assert_eq!(m.read_code(0x40_1000, &map, &mut fake).unwrap()[0], 8);
    }

    #[test]
    fn code_that_may_change_is_read_afresh_one_block_at_most() {
        let mut fake = FakeMemory::default();
        fake.add_mapping(0x40_0000, 0x40_2000, "rwxp", "");
        let map = fake.maps().unwrap()[0].clone();
        let mut m = Modules::default();
        fake.poke(0x40_0000, &[1]);
        let code = m.read_code(0x40_0000, &map, &mut fake).unwrap();
        assert_eq!((code[0], code.len() as u64), (1, MAX_BLOCK_GUEST_BYTES));
        fake.poke(0x40_0000, &[2]);
        assert_eq!(m.read_code(0x40_0000, &map, &mut fake).unwrap()[0], 2);
        assert_eq!(m.read_code(0x40_1ffe, &map, &mut fake).unwrap().len(), 2);
    }

    #[test]
    fn the_stack_floor_leaves_the_stack_room_to_grow() {
        let mut fake = FakeMemory::default();
        let mut m = Modules::default();
        assert_eq!(m.stack_floor(&mut fake).unwrap(), u64::MAX);
        fake.add_mapping(0x7fff_fffd_e000, 0x7fff_ffff_f000, "rw-p", "[stack]");
        assert_eq!(
            m.stack_floor(&mut fake).unwrap(),
            0x7fff_ffff_f000 - (128 << 20)
        );
    }
}
