//! The client's code as the tool reads it: the memory map (kept until
//! an address is missing from it or mappings change), the module records
//! that counts are attributed to, and the guest code pages already read.
//!
//! A module is recorded when code in it is first translated and the record
//! outlives the mapping, so code that ran before a dlclose still resolves
//! at exit. Only executable, non-writable code is translated (the pages it
//! reads cannot change behind the tool's back); code in writable memory is
//! refused with a message.

use crate::client_mem::{ClientMemory, Mapping};
use crate::{EngineError, ModuleRecord};
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
    /// Guest code pages already read, by address.
    pages: HashMap<u64, Vec<u8>>,
}

impl Modules {
    fn find(&self, addr: u64) -> Option<&Mapping> {
        self.maps.iter().find(|m| m.start <= addr && addr < m.end)
    }

    /// The mapping that holds `addr`, which the client is about to run: an
    /// executable one that is not writable, or why it cannot be run.
    pub fn code_mapping(
        &mut self,
        addr: u64,
        mem: &mut dyn ClientMemory,
    ) -> Result<Mapping, EngineError> {
        if let Some(m) = self.find(addr) {
            if m.exec && !m.write {
                return Ok(m.clone());
            }
        }
        self.maps = mem.maps()?;
        match self.find(addr) {
            Some(m) if m.exec && m.write => Err(EngineError(format!(
                "the client runs code from writable memory at {addr:#x} ({}), as JIT compilers do; not supported yet",
                if m.path.is_empty() { "anonymous" } else { &m.path }
            ))),
            Some(m) if m.exec => Ok(m.clone()),
            Some(_) => Err(EngineError(format!(
                "the client jumped to non-executable memory at {addr:#x}"
            ))),
            None => Err(EngineError(format!(
                "the client jumped to unmapped address {addr:#x}"
            ))),
        }
    }

    /// The index in [`Modules::records`] of mapping `m`, recorded now if
    /// it is new.
    pub fn record(&mut self, m: &Mapping) -> usize {
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

    /// `len` bytes of guest code at `addr`, through the page cache.
    pub fn read_code(
        &mut self,
        addr: u64,
        len: usize,
        mem: &mut dyn ClientMemory,
    ) -> Result<Vec<u8>, EngineError> {
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

    /// The lowest address of the main stack's room to grow (`u64::MAX`
    /// when there is no `[stack]` mapping): nothing of the tool's may be
    /// mapped above it.
    pub fn stack_floor(&mut self, mem: &mut dyn ClientMemory) -> Result<u64, EngineError> {
        let stack = |maps: &[Mapping]| maps.iter().find(|m| m.path == "[stack]").map(|m| m.end);
        if stack(&self.maps).is_none() {
            self.maps = mem.maps()?;
        }
        Ok(stack(&self.maps).map_or(u64::MAX, |end| end.saturating_sub(STACK_GAP)))
    }

    /// The range `[start, end)` is being unmapped or remapped: the map is
    /// read again when next needed, its code pages are dropped, and a later
    /// mapping there is a new module (the records stay, for the counts).
    pub fn forget(&mut self, start: u64, end: u64) {
        self.maps.clear();
        self.pages.retain(|&p, _| p + PAGE <= start || p >= end);
        self.recorded.retain(|k, _| k.1 <= start || k.0 >= end);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client_mem::FakeMemory;

    #[test]
    fn code_must_be_executable_and_not_writable() {
        let mut fake = FakeMemory::default();
        fake.add_mapping(0x40_0000, 0x40_1000, "r-xp", "/bin/x");
        fake.add_mapping(0x40_1000, 0x40_2000, "rwxp", "");
        fake.add_mapping(0x40_2000, 0x40_3000, "rw-p", "/bin/x");
        let mut m = Modules::default();
        assert_eq!(m.code_mapping(0x40_0010, &mut fake).unwrap().path, "/bin/x");
        let jit = m.code_mapping(0x40_1010, &mut fake).unwrap_err().0;
        assert!(
            jit.contains("writable memory at 0x401010 (anonymous)"),
            "{jit}"
        );
        let data = m.code_mapping(0x40_2000, &mut fake).unwrap_err().0;
        assert!(data.contains("non-executable"), "{data}");
        let none = m.code_mapping(0x50_0000, &mut fake).unwrap_err().0;
        assert!(none.contains("unmapped address 0x500000"), "{none}");
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
    fn code_is_read_through_pages_that_invalidation_drops() {
        let mut fake = FakeMemory::default();
        fake.poke(0x40_0ffe, &[1, 2, 3, 4]);
        let mut m = Modules::default();
        assert_eq!(m.read_code(0x40_0ffe, 4, &mut fake).unwrap(), [1, 2, 3, 4]);
        // Cached: a change in the client is not seen...
        fake.poke(0x40_1000, &[9]);
        assert_eq!(m.read_code(0x40_1000, 1, &mut fake).unwrap(), [3]);
        // ...until the range is forgotten (only the pages in it).
        m.forget(0x40_1000, 0x40_2000);
        fake.poke(0x40_0ffe, &[7]);
        assert_eq!(m.read_code(0x40_0ffe, 4, &mut fake).unwrap(), [1, 2, 9, 4]);
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
