//! Loading one ELF object (and its separate debug file, if any) into the
//! tables that answer "which function" and "which file and line".

use std::cell::OnceCell;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::Arc;

use object::read::elf::{ElfFile64, ProgramHeader, SectionHeader, Sym};
use object::read::ReadCache;
use object::{Endianness, Object};

/// An ELF file read on demand: only the parts used (headers, symbol and
/// string tables, debug sections) are read, which matters for objects of
/// a hundred megabytes or more.
pub(crate) type Elf<'a> = ElfFile64<'a, Endianness, &'a ReadCache<std::fs::File>>;

/// Opens `path` for on-demand reading.
pub(crate) fn open(path: &Path) -> std::io::Result<ReadCache<std::fs::File>> {
    Ok(ReadCache::new(std::fs::File::open(path)?))
}

use crate::debugfile;
use crate::lines::{LineData, LineTable};
use crate::symtab::{RawSymbol, SymbolTable};

const PT_LOAD: u32 = 1;
const PF_X: u32 = 1;
const STB_LOCAL: u8 = 0;
const STB_GLOBAL: u8 = 1;
const STB_WEAK: u8 = 2;
const STT_OBJECT: u8 = 1;
const STT_FUNC: u8 = 2;
const STT_GNU_IFUNC: u8 = 10;
const PAGE: u64 = 4096;

/// A loadable segment of the object.
#[derive(Debug, Clone, Copy)]
struct Segment {
    offset: u64,
    vaddr: u64,
    filesz: u64,
    memsz: u64,
    exec: bool,
}

/// An address range `[start, start + size)` in the object's own addresses.
#[derive(Debug, Clone, Copy, Default)]
struct Range {
    start: u64,
    size: u64,
}

impl Range {
    fn contains(&self, a: u64) -> bool {
        a >= self.start && a - self.start < self.size
    }
}

/// The sections Valgrind uses to decide whether a symbol is code or data
/// and which symbols to ignore (`get_elf_symbol_info`).
#[derive(Debug, Default)]
struct SectionMap {
    text: Option<Range>,
    /// `.data`, `.sdata`, `.rodata*` (first contiguous run), `.bss`,
    /// `.sbss`: a symbol in one of these is data, not a function.
    data: Vec<Range>,
    /// `.got` and `.plt`: symbols there are references, ignored.
    ignored: Vec<Range>,
    /// `.plt` alone: Valgrind's `Vg_SectPLT`, which Callgrind skips.
    plt: Option<Range>,
}

impl SectionMap {
    fn is_text(&self, svma: u64) -> bool {
        if self.text.is_some_and(|t| t.contains(svma)) {
            return true;
        }
        !self.data.iter().any(|d| d.contains(svma))
    }

    fn is_ignored(&self, svma: u64) -> bool {
        self.ignored.iter().any(|r| r.contains(svma))
    }
}

/// Everything needed to symbolize addresses inside one mapped object.
#[derive(Debug)]
pub struct ObjectInfo {
    path: PathBuf,
    debug_path: Option<PathBuf>,
    segments: Vec<Segment>,
    symbols: Arc<SymbolTable>,
    display_names: Vec<OnceCell<Rc<str>>>,
    lines: LineTable,
    text: Option<Range>,
    plt: Option<Range>,
}

/// The kind of section code is in, as Valgrind's `VG_(DebugInfo_sect_kind)`
/// tells it for code: Callgrind treats a jump from one kind to another as a
/// call, and skips functions in the PLT.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SectionKind {
    /// `.text`.
    Text,
    /// `.plt`.
    Plt,
    /// Anything else (`.init`, `.fini`, `.plt.got`, `.plt.sec`, unknown).
    Other,
}

/// An [`ObjectInfo`] as read from disk, before names are shared for the
/// thread that symbolizes: reading (the expensive part) can happen on
/// another thread (see [`crate::Preloader`]). A copy shares the symbol
/// and line tables with the original (see [`ObjectData::read_shared`]).
#[derive(Debug, Clone)]
pub struct ObjectData {
    path: PathBuf,
    debug_path: Option<PathBuf>,
    segments: Vec<Segment>,
    symbols: Arc<SymbolTable>,
    lines: LineData,
    text: Option<Range>,
    plt: Option<Range>,
}

impl From<ObjectData> for ObjectInfo {
    fn from(data: ObjectData) -> Self {
        let display_names = (0..data.symbols.len()).map(|_| OnceCell::new()).collect();
        ObjectInfo {
            path: data.path,
            debug_path: data.debug_path,
            segments: data.segments,
            symbols: data.symbols,
            display_names,
            lines: data.lines.into(),
            text: data.text,
            plt: data.plt,
        }
    }
}

impl ObjectInfo {
    /// Reads the ELF file at `path` and, if found, its separate debug file.
    pub fn load(path: &Path) -> Result<Self, String> {
        ObjectData::read(path).map(ObjectInfo::from)
    }
}

impl ObjectData {
    /// The symbol table, shared by copies (tests check that copies share).
    #[cfg(test)]
    pub(crate) fn symbols(&self) -> &Arc<SymbolTable> {
        &self.symbols
    }

    /// Reads the ELF file at `path` and, if found, its separate debug file.
    pub fn read(path: &Path) -> Result<Self, String> {
        let data = open(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let file =
            Elf::parse(&data).map_err(|e| format!("{}: not an ELF64 file: {e}", path.display()))?;
        let endian = file.endian();
        let segments: Vec<Segment> = file
            .elf_program_headers()
            .iter()
            .filter(|p| p.p_type(endian).0 == PT_LOAD)
            .map(|p| Segment {
                offset: p.p_offset(endian),
                vaddr: p.p_vaddr(endian),
                filesz: p.p_filesz(endian),
                memsz: p.p_memsz(endian),
                exec: p.p_flags(endian).0 & PF_X != 0,
            })
            .collect();
        let sections = section_map(&file);

        let mut raw = Vec::new();
        read_symbols(&file, false, &sections, &mut raw);
        read_symbols(&file, true, &sections, &mut raw);

        let debug_path = debugfile::find(path, &file);
        let debug_data = debug_path.as_ref().and_then(|p| open(p).ok());
        let debug_file = debug_data.as_ref().and_then(|d| Elf::parse(d).ok());
        if let Some(dbg) = &debug_file {
            read_symbols(dbg, false, &sections, &mut raw);
        }

        // DWARF comes from the object itself when it has any, else from the
        // debug file.
        let exec_ranges: Vec<Range> = segments
            .iter()
            .filter(|s| s.exec)
            .map(|s| {
                let start = s.vaddr & !(PAGE - 1);
                let end = (s.vaddr + s.memsz).div_ceil(PAGE) * PAGE;
                Range {
                    start,
                    size: end - start,
                }
            })
            .collect();
        let in_code =
            |lo: u64, hi: u64| exec_ranges.iter().any(|r| r.contains(lo) && r.contains(hi));
        let lines = if file.section_by_name(".debug_line").is_some() {
            LineData::from_object(&file, &in_code)
        } else if let Some(dbg) = &debug_file {
            LineData::from_object(dbg, &in_code)
        } else {
            LineData::default()
        };

        Ok(ObjectData {
            path: path.to_path_buf(),
            debug_path: debug_path.filter(|_| debug_file.is_some()),
            segments,
            symbols: Arc::new(SymbolTable::new(raw)),
            lines,
            text: sections.text,
            plt: sections.plt,
        })
    }
}

impl ObjectInfo {
    /// The section kind of file address `svma`.
    pub fn section_kind(&self, svma: u64) -> SectionKind {
        if self.plt.is_some_and(|r| r.contains(svma)) {
            SectionKind::Plt
        } else if self.text.is_some_and(|r| r.contains(svma)) {
            SectionKind::Text
        } else {
            SectionKind::Other
        }
    }

    /// Whether a function symbol starts at file address `svma` (Valgrind's
    /// `get_fnname_if_entry`).
    pub fn is_function_entry(&self, svma: u64) -> bool {
        self.symbols
            .lookup(svma)
            .is_some_and(|i| self.symbols.range(i).0 == svma)
    }

    /// The object's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The separate debug file that was used, if any.
    pub fn debug_path(&self) -> Option<&Path> {
        self.debug_path.as_deref()
    }

    /// The load bias (`runtime address - file address`) of a mapping of
    /// this object that starts at `start` and maps file offset
    /// `file_offset`; `None` if no loadable segment covers that offset.
    pub fn bias_for(&self, start: u64, file_offset: u64) -> Option<u64> {
        let covers = |s: &Segment| {
            let lo = s.offset & !(PAGE - 1);
            file_offset >= lo && file_offset < s.offset + s.filesz.max(1)
        };
        let seg = self
            .segments
            .iter()
            .find(|s| s.exec && covers(s))
            .or_else(|| self.segments.iter().find(|s| covers(s)))?;
        // File offset o of the segment lives at vaddr + (o - offset).
        let svma_of_start = seg.vaddr.wrapping_add(file_offset).wrapping_sub(seg.offset);
        Some(start.wrapping_sub(svma_of_start))
    }

    /// The displayed function name at file address `svma`.
    pub fn function_at(&self, svma: u64) -> Option<Rc<str>> {
        self.function_at_with(svma, crate::demangle::NameOptions::default())
    }

    /// The function name at file address `svma`, shown under `opts`
    /// (names are cached for the default options only).
    pub fn function_at_with(
        &self,
        svma: u64,
        opts: crate::demangle::NameOptions,
    ) -> Option<Rc<str>> {
        let i = self.symbols.lookup(svma)?;
        let show = || {
            Rc::from(crate::demangle::display_name_with(
                self.symbols.name(i),
                opts,
            ))
        };
        if opts != crate::demangle::NameOptions::default() {
            return Some(show());
        }
        Some(self.display_names[i].get_or_init(show).clone())
    }

    /// The function name at file address `svma` shown under `opts` (as
    /// [`function_at_with`](Self::function_at_with)) and whether it starts
    /// exactly there (as [`is_function_entry`](Self::is_function_entry)),
    /// with one search of the symbol table.
    pub fn function_entry_at(
        &self,
        svma: u64,
        opts: crate::demangle::NameOptions,
    ) -> Option<(Rc<str>, bool)> {
        let i = self.symbols.lookup(svma)?;
        let entry = self.symbols.range(i).0 == svma;
        let show = || {
            Rc::from(crate::demangle::display_name_with(
                self.symbols.name(i),
                opts,
            ))
        };
        if opts != crate::demangle::NameOptions::default() {
            return Some((show(), entry));
        }
        Some((self.display_names[i].get_or_init(show).clone(), entry))
    }

    /// The function name shown under `opts` if a function starts exactly at
    /// file address `svma`.
    pub fn function_starting_at(
        &self,
        svma: u64,
        opts: crate::demangle::NameOptions,
    ) -> Option<Rc<str>> {
        self.is_function_entry(svma)
            .then(|| self.function_at_with(svma, opts))
            .flatten()
    }

    /// The raw (undemangled) symbol name at file address `svma`.
    pub fn raw_function_at(&self, svma: u64) -> Option<&str> {
        self.symbols.lookup(svma).map(|i| self.symbols.name(i))
    }

    /// File (as Cachegrind composes it) and line at file address `svma`.
    pub fn line_at(&self, svma: u64) -> Option<(Rc<str>, u32)> {
        self.lines.lookup(svma)
    }
}

/// Finds the sections that classify symbols, as Valgrind's ELF reader does.
fn section_map(file: &Elf<'_>) -> SectionMap {
    let endian = file.endian();
    let table = file.elf_section_table();
    let mut map = SectionMap::default();
    let mut rodata: Option<Range> = None;
    for sh in table.iter() {
        let Ok(name) = table.section_name(endian, sh) else {
            continue;
        };
        let r = Range {
            start: sh.sh_addr(endian),
            size: sh.sh_size(endian),
        };
        match name {
            b".text" if map.text.is_none() => map.text = Some(r),
            b".data" | b".sdata" | b".bss" | b".sbss" => map.data.push(r),
            b".got" => map.ignored.push(r),
            b".plt" => {
                map.ignored.push(r);
                map.plt = Some(r);
            }
            n if n.starts_with(b".rodata") => match &mut rodata {
                None => rodata = Some(r),
                Some(ro) => {
                    let align = sh.sh_addralign(endian).max(1);
                    let next = (ro.start + ro.size).div_ceil(align) * align;
                    if r.start == next {
                        ro.size = r.start + r.size - ro.start;
                    }
                }
            },
            _ => {}
        }
    }
    map.data.extend(rodata);
    map
}

/// Appends the plausible function/object symbols of `file`'s `.symtab`
/// (or `.dynsym` with `dynamic`), with Valgrind's filters: named, non-zero
/// size, low 32 bits of the value not zero, not in `.got`/`.plt`.
fn read_symbols(file: &Elf<'_>, dynamic: bool, sections: &SectionMap, out: &mut Vec<RawSymbol>) {
    let endian = file.endian();
    let table = if dynamic {
        file.elf_dynamic_symbol_table()
    } else {
        file.elf_symbol_table()
    };
    if table.is_empty() {
        return;
    }
    // The string table is read in one piece: names are looked up in it
    // directly rather than through one small read per symbol.
    let strtab = file
        .elf_section_table()
        .section(table.string_section())
        .and_then(|sh| sh.data(endian, file.data()))
        .unwrap_or(&[]);
    for sym in table.symbols().iter().skip(1) {
        let info = sym.st_info().0;
        let (bind, kind) = (info >> 4, info & 0xf);
        if !matches!(bind, STB_LOCAL | STB_GLOBAL | STB_WEAK)
            || !matches!(kind, STT_FUNC | STT_OBJECT | STT_GNU_IFUNC)
        {
            continue;
        }
        let name = strtab
            .get(sym.st_name(endian) as usize..)
            .map(|tail| &tail[..tail.iter().position(|&b| b == 0).unwrap_or(tail.len())])
            .unwrap_or(&[]);
        if name.is_empty() {
            continue;
        }
        let value = sym.st_value(endian);
        let size = (sym.st_size(endian) as i64).clamp(1, i32::MAX as i64) as u64;
        if sym.st_size(endian) == 0 || value as u32 == 0 || sections.is_ignored(value) {
            continue;
        }
        out.push(RawSymbol {
            addr: value,
            size,
            name: match std::str::from_utf8(name) {
                Ok(n) => n.to_owned(),
                Err(_) => String::from_utf8_lossy(name).into_owned(),
            },
            is_text: sections.is_text(value),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Function starts and section kinds of this very test binary (an
    /// executable with a `.text` and symbols).
    #[test]
    fn function_entries_and_sections() {
        let exe = std::env::current_exe().unwrap();
        let obj = ObjectInfo::load(&exe).unwrap();
        let (start, _) = (0..obj.symbols.len())
            .map(|i| obj.symbols.range(i))
            .find(|&(a, s)| s > 1 && obj.text.is_some_and(|t| t.contains(a)))
            .expect("a function in .text");
        assert!(obj.is_function_entry(start));
        assert!(!obj.is_function_entry(start + 1));
        assert_eq!(obj.section_kind(start), SectionKind::Text);
        assert_eq!(obj.section_kind(0), SectionKind::Other);
        if let Some(plt) = obj.plt {
            assert_eq!(obj.section_kind(plt.start), SectionKind::Plt);
        }
    }
}
