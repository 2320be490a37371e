//! Symbolization of instruction addresses into Cachegrind's
//! `(file, function, line)` triples, from ELF symbol tables and DWARF.
//!
//! The rules are Valgrind's (spec §4.4), reproduced closely enough that a
//! profile names the same cost centres as Cachegrind's:
//!
//! * the function comes from `.symtab` and `.dynsym` of the object and
//!   `.symtab` of its separate debug file, canonicalised like Valgrind's
//!   symbol table (aliases merged, overlaps truncated, one preferred name
//!   per address range, see [`symtab`]); names are taken literally, so
//!   glibc's versioned names such as `__libc_start_main@@GLIBC_2.34` come
//!   out as Valgrind shows them;
//! * names are demangled (Rust legacy and v0 without hashes, C++), and the
//!   callers of `main` become `(below main)` ([`demangle`]);
//! * file and line come from the DWARF line tables, with the directory
//!   composed as Valgrind composes it ([`lines`]);
//! * anything unknown is `???` (line 0), except code that no object
//!   describes but the process's perf map names (JIT-compiled code, see
//!   [`PerfMap`]), which gets that name in file `???`.
#![forbid(unsafe_code)]

mod debugfile;
pub mod demangle;
mod elf;
pub mod lines;
mod perfmap;
mod preload;
mod shared;
pub mod symtab;
pub mod unwind;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::rc::Rc;

pub use demangle::NameOptions;
pub use elf::{ObjectData, ObjectInfo, SectionKind};
pub use perfmap::PerfMap;
pub use preload::{Preloaded, Preloader};
pub use unwind::{StackCopy, Unwinder};

/// An executable mapping of a client process: which file is mapped where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mapping {
    /// Path of the mapped file (empty for anonymous memory).
    pub path: PathBuf,
    /// First address of the mapping.
    pub start: u64,
    /// One past the last address of the mapping.
    pub end: u64,
    /// File offset that `start` maps.
    pub file_offset: u64,
}

/// Cachegrind's cost-centre key for one instruction.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Location {
    /// Source file (`dir/name`), or `???`.
    pub file: Rc<str>,
    /// Function name, demangled, or `???` / `(below main)`.
    pub func: Rc<str>,
    /// Source line, 0 when unknown.
    pub line: u32,
}

/// What [`Symbolizer::code_facts`] tells of an instruction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CodeFacts {
    /// File, function and line, as for Cachegrind.
    pub location: Location,
    /// The object file, if it could be read.
    pub object: Option<PathBuf>,
    /// The address in the object's own (file) addresses.
    pub offset: u64,
    /// Whether a function symbol starts exactly there.
    pub entry: bool,
    /// The kind of section the code is in.
    pub section: SectionKind,
}

/// The text Cachegrind uses for anything unknown.
pub const UNKNOWN: &str = "???";

/// Resolves addresses to [`Location`]s, loading each object file once and
/// caching demangled names.
#[derive(Default)]
pub struct Symbolizer {
    objects: HashMap<PathBuf, Option<Rc<ObjectInfo>>>,
    unknown: Option<Rc<str>>,
    /// How function names are shown.
    names: NameOptions,
    /// The mapping of the previous lookup and what it resolved to:
    /// callers go through addresses in order, so most lookups hit it.
    last: Option<(Mapping, Option<Resolved>)>,
    /// Reads objects ahead of use, once [`Symbolizer::preload`] is used.
    preloader: Option<Preloader>,
    /// Names of JIT-compiled code of the process being located.
    perf_map: Option<PerfMap>,
}

/// A readable object and the load bias of one of its mappings.
type Resolved = (Rc<ObjectInfo>, u64);

impl Symbolizer {
    /// A symbolizer with nothing loaded yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// A symbolizer showing function names under `names`.
    pub fn with_names(names: NameOptions) -> Self {
        Symbolizer {
            names,
            ..Self::default()
        }
    }

    fn unknown(&mut self) -> Rc<str> {
        self.unknown
            .get_or_insert_with(|| Rc::from(UNKNOWN))
            .clone()
    }

    /// Names code that no object describes from `map` (the perf map of
    /// the process whose addresses are located next), or from nothing.
    pub fn set_perf_map(&mut self, map: Option<PerfMap>) {
        self.perf_map = map.filter(|m| !m.is_empty());
    }

    /// Starts reading the object at `path` on a background thread, so that
    /// it is ready when [`Symbolizer::locate`] needs it (the first call
    /// starts the thread).
    pub fn preload(&mut self, path: &Path) {
        if self.objects.contains_key(path) {
            return;
        }
        if self.preloader.is_none() {
            self.preloader = Preloader::start();
        }
        if let Some(p) = &self.preloader {
            p.request(path);
        }
    }

    /// The parsed object at `path`, loaded on first use; `None` when it
    /// cannot be read or is not an ELF file (its code is then `???`).
    pub fn object(&mut self, path: &Path) -> Option<Rc<ObjectInfo>> {
        if let Some(o) = self.objects.get(path) {
            return o.clone();
        }
        let ahead = match &self.preloader {
            Some(p) => p.take(path),
            None => Preloaded::NotRead,
        };
        let loaded = match ahead {
            Preloaded::Read(data) => data.map(ObjectInfo::from),
            Preloaded::NotRead => shared::read(path).map(ObjectInfo::from),
        }
        .map(Rc::new);
        self.objects.insert(path.to_path_buf(), loaded.clone());
        loaded
    }

    /// The object mapped by `m` and its load bias (`runtime address - file
    /// address`), if it can be read: what [`code_facts`](Self::code_facts)
    /// looks up for each address, for a caller that keeps it per mapping
    /// and asks the object itself ([`ObjectInfo::function_entry_at`],
    /// [`ObjectInfo::line_at`], [`ObjectInfo::section_kind`]).
    pub fn mapped_object(&mut self, m: &Mapping) -> Option<(Rc<ObjectInfo>, u64)> {
        self.resolve_mapping(m)
    }

    /// The object mapped by `m` and its load bias, if it can be read.
    fn resolve_mapping(&mut self, m: &Mapping) -> Option<Resolved> {
        if m.path.as_os_str().is_empty() {
            return None;
        }
        let obj = self.object(&m.path)?;
        let bias = obj.bias_for(m.start, m.file_offset)?;
        Some((obj, bias))
    }

    /// The object holding `addr` (through the mapping among `mappings` that
    /// contains it: the last one, if several do, as the most recently
    /// recorded wins) and `addr`'s file address in it.
    fn object_at(&mut self, mappings: &[Mapping], addr: u64) -> Option<(Rc<ObjectInfo>, u64)> {
        let m = mappings
            .iter()
            .rev()
            .find(|m| m.start <= addr && addr < m.end)?;
        let resolved = match &self.last {
            Some((last, resolved)) if last == m => resolved.clone(),
            _ => {
                let resolved = self.resolve_mapping(m);
                self.last = Some((m.clone(), resolved.clone()));
                resolved
            }
        };
        resolved.map(|(obj, bias)| (obj, addr.wrapping_sub(bias)))
    }

    /// The object holding `addr` (through `mappings`, as
    /// [`locate`](Self::locate) finds it) and `addr`'s file address in it:
    /// what a later reader of the object's DWARF (`addr2line`) takes.
    pub fn file_address(&mut self, mappings: &[Mapping], addr: u64) -> Option<(PathBuf, u64)> {
        let (obj, svma) = self.object_at(mappings, addr)?;
        Some((obj.path().to_path_buf(), svma))
    }

    /// The name of the function whose first instruction is at `addr` (none
    /// if `addr` is inside a function or in no known one), as
    /// [`locate`](Self::locate) would name it: what Valgrind's
    /// `get_fnname_if_entry` answers, with which Lackey counts calls.
    pub fn entry_name(&mut self, mappings: &[Mapping], addr: u64) -> Option<Rc<str>> {
        let (obj, svma) = self.object_at(mappings, addr)?;
        obj.function_starting_at(svma, self.names)
    }

    /// What Callgrind knows of the code at `addr`, mapped by `mapping`: its
    /// location, its object (`None`: no readable ELF file, Valgrind's
    /// `???`), its offset in the object (the file address; the address
    /// itself without an object), whether a function starts there and the
    /// section kind.
    pub fn code_facts(&mut self, mapping: &Mapping, addr: u64) -> CodeFacts {
        let location = self.locate(std::slice::from_ref(mapping), addr);
        match self.resolve_mapping(mapping) {
            Some((obj, bias)) => {
                let svma = addr.wrapping_sub(bias);
                CodeFacts {
                    location,
                    object: Some(obj.path().to_path_buf()),
                    offset: svma,
                    entry: obj.is_function_entry(svma),
                    section: obj.section_kind(svma),
                }
            }
            None => CodeFacts {
                location,
                object: None,
                offset: addr,
                entry: false,
                section: SectionKind::Other,
            },
        }
    }

    /// Locates `addr`, an address in the client, using the mapping among
    /// `mappings` that contains it (the last one, if several do: the most
    /// recently recorded wins).
    pub fn locate(&mut self, mappings: &[Mapping], addr: u64) -> Location {
        let found = self.object_at(mappings, addr);
        match found {
            Some((obj, svma)) => {
                let func = obj.function_at_with(svma, self.names);
                let (file, line) = match obj.line_at(svma) {
                    Some((file, line)) => (file, line),
                    None => (self.unknown(), 0),
                };
                let func = func.unwrap_or_else(|| self.unknown());
                Location { file, func, line }
            }
            None => {
                let u = self.unknown();
                let jit = self.perf_map.as_ref().and_then(|m| m.name_at(addr));
                Location {
                    file: u.clone(),
                    func: jit.unwrap_or(u),
                    line: 0,
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn code_in_no_object_is_named_from_the_perf_map() {
        let anon = Mapping {
            path: PathBuf::new(),
            start: 0x1000,
            end: 0x3000,
            file_offset: 0,
        };
        let maps = [anon];
        let mut s = Symbolizer::new();
        assert_eq!(&*s.locate(&maps, 0x1010).func, UNKNOWN);
        s.set_perf_map(Some(PerfMap::parse("1000 20 JS:*loop /tmp/a.js:1\n")));
        let loc = s.locate(&maps, 0x1010);
        assert_eq!(
            (&*loc.file, &*loc.func, loc.line),
            (UNKNOWN, "JS:*loop /tmp/a.js:1", 0)
        );
        // Outside every entry, and outside every mapping.
        assert_eq!(&*s.locate(&maps, 0x1020).func, UNKNOWN);
        s.set_perf_map(Some(PerfMap::parse("5000 20 stub\n")));
        assert_eq!(&*s.locate(&maps, 0x5000).func, "stub");
        s.set_perf_map(None);
        assert_eq!(&*s.locate(&maps, 0x5000).func, UNKNOWN);
    }
}
