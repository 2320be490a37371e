//! The address → (file, line) table of one object, read from DWARF
//! `.debug_line` the way Valgrind reads it (m_debuginfo/readdwarf.c), so
//! that file names and line ranges match Cachegrind's:
//!
//! * only line programs referenced by a compile unit's `DW_AT_stmt_list`
//!   are read, with that unit's `DW_AT_comp_dir` (taken only from the
//!   string forms Valgrind understands: inline, `strp`, `line_strp`);
//!   when every line program is DWARF 5's, whose directory 0 is the
//!   compilation directory, the programs are read in turn from
//!   `.debug_line` alone, each with its directory 0 as `comp_dir`, and
//!   `.debug_info` is not read at all (see [`LineData::from_object`]);
//! * a directory entry that is relative is prefixed with `comp_dir + "/"`;
//!   in DWARF < 5, directory 0 is the comp dir itself (or `.`);
//! * the file is then `dir + "/" + name` (Cachegrind's composition);
//! * each row covers `[previous row address, this row address)` with the
//!   previous row's file and line; nothing is recorded while the previous
//!   address is 0; ranges above 4095 bytes shrink to 1 byte; ranges are
//!   then sorted and overlaps truncated (`canonicaliseLoctab`);
//! * a range that directly continues the previously added one with the
//!   same line number is merged into it, whatever its file (a Valgrind
//!   quirk that shows as an inlined header line counted in its caller).

use std::borrow::Cow;
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::Arc;

use gimli::{AttributeValue, EndianSlice, RunTimeEndian};
use object::{Object, ObjectSection};

type Reader<'a> = EndianSlice<'a, RunTimeEndian>;

/// Valgrind stores a location's size in 12 bits.
const MAX_LOC_SIZE: u64 = 4095;
/// Valgrind stores line numbers in 20 bits and drops larger ones.
const MAX_LINENO: u64 = (1 << 20) - 1;

#[derive(Debug, Clone, Copy)]
struct Loc {
    addr: u64,
    size: u64,
    file: u32,
    line: u32,
}

/// Sorted, non-overlapping line ranges of one object.
#[derive(Debug, Default)]
pub struct LineTable {
    locs: Arc<Vec<Loc>>,
    files: Vec<Rc<str>>,
}

/// A [`LineTable`] as read, before its file names are shared: it can be
/// read on another thread (see [`crate::Preloader`]).
#[derive(Debug, Default, Clone)]
pub struct LineData {
    /// Shared by copies (and the tables made of them).
    locs: Arc<Vec<Loc>>,
    files: Vec<String>,
}

impl From<LineData> for LineTable {
    fn from(data: LineData) -> Self {
        LineTable {
            locs: data.locs,
            files: data.files.iter().map(|f| Rc::from(f.as_str())).collect(),
        }
    }
}

impl LineTable {
    /// Reads every compile unit's line program from `obj`'s DWARF sections,
    /// keeping only ranges for which `in_code(first, last)` holds (Valgrind
    /// drops line entries outside the object's executable mapping).
    pub fn from_object<'d, O: Object<'d>>(obj: &O, in_code: &dyn Fn(u64, u64) -> bool) -> Self {
        LineData::from_object(obj, in_code).into()
    }

    /// Number of line ranges.
    pub fn len(&self) -> usize {
        self.locs.len()
    }

    /// Whether there is no line information.
    pub fn is_empty(&self) -> bool {
        self.locs.is_empty()
    }

    /// File and line of file address `svma`.
    pub fn lookup(&self, svma: u64) -> Option<(Rc<str>, u32)> {
        let i = self.locs.partition_point(|l| l.addr <= svma);
        let l = self.locs.get(i.checked_sub(1)?)?;
        (svma - l.addr < l.size).then(|| (self.files[l.file as usize].clone(), l.line))
    }
}

impl LineData {
    /// What [`LineTable::from_object`] reads, in a form that can cross threads.
    pub fn from_object<'d, O: Object<'d>>(obj: &O, in_code: &dyn Fn(u64, u64) -> bool) -> Self {
        let endian = endian_of(obj);
        // Borrowed from the object's read cache where it can be: a copy of
        // each section would double what a big library's DWARF costs
        // (libpython's five sections are 12 MB) while its lines are read.
        let mut sections = HashMap::new();
        add_sections(obj, LINE_SECTIONS, &mut sections);
        // DWARF 5 line programs name their compilation directory: then the
        // compile units need not be read. Skipping `.debug_info` (inflated,
        // its units' abbreviations parsed, only for each root's two
        // attributes) made libc's lines (Debian's compressed debug file)
        // take 30 ms instead of 70.
        let mut by_programs = Builder::new(in_code);
        if by_programs.read_v5_programs(&sections, endian).is_ok() {
            return by_programs.finish();
        }
        Self::by_units(obj, in_code, sections, endian)
    }

    /// The lines of `obj` read through its compile units, `sections`
    /// holding the line programs' already.
    fn by_units<'d, O: Object<'d>>(
        obj: &O,
        in_code: &dyn Fn(u64, u64) -> bool,
        mut sections: HashMap<&'static str, Cow<'d, [u8]>>,
        endian: RunTimeEndian,
    ) -> Self {
        add_sections(obj, UNIT_SECTIONS, &mut sections);
        let mut by_units = Builder::new(in_code);
        // Malformed DWARF just yields fewer lines (Valgrind also carries on).
        let _ = by_units.read_all(&sections, endian);
        by_units.finish()
    }

    /// [`LineData::from_object`] through the compile units, always (what
    /// the DWARF 5 shortcut must equal).
    #[cfg(test)]
    pub(crate) fn from_object_by_units<'d, O: Object<'d>>(
        obj: &O,
        in_code: &dyn Fn(u64, u64) -> bool,
    ) -> Self {
        let mut sections = HashMap::new();
        add_sections(obj, LINE_SECTIONS, &mut sections);
        Self::by_units(obj, in_code, sections, endian_of(obj))
    }

    /// Each range with its file's name, in order (for comparisons).
    #[cfg(test)]
    pub(crate) fn named_ranges(&self) -> Vec<(u64, u64, &str, u32)> {
        self.locs
            .iter()
            .map(|l| (l.addr, l.size, self.files[l.file as usize].as_str(), l.line))
            .collect()
    }
}

/// The sections line programs are read from.
const LINE_SECTIONS: &[&str] = &[".debug_line", ".debug_str", ".debug_line_str"];

/// The sections compile units are read from, when line programs alone
/// are not enough.
const UNIT_SECTIONS: &[&str] = &[".debug_info", ".debug_abbrev"];

/// Adds the sections `ids` of `obj` to `sections`, inflated if compressed
/// (empty where missing or unreadable).
fn add_sections<'d, O: Object<'d>>(
    obj: &O,
    ids: &[&'static str],
    sections: &mut HashMap<&'static str, Cow<'d, [u8]>>,
) {
    for &id in ids {
        let data = obj
            .section_by_name(id)
            .and_then(|s| s.uncompressed_data().ok())
            .unwrap_or_default();
        sections.insert(id, data);
    }
}

/// The byte order of `obj`'s DWARF.
fn endian_of<'d, O: Object<'d>>(obj: &O) -> RunTimeEndian {
    if obj.is_little_endian() {
        RunTimeEndian::Little
    } else {
        RunTimeEndian::Big
    }
}

/// The string an attribute value holds, in the forms Valgrind understands
/// (inline, `strp`, `line_strp`).
fn string_value<'a>(
    value: Option<AttributeValue<Reader<'a>>>,
    debug_str: &gimli::DebugStr<Reader<'a>>,
    debug_line_str: &gimli::DebugLineStr<Reader<'a>>,
) -> Option<Reader<'a>> {
    match value? {
        AttributeValue::String(s) => Some(s),
        AttributeValue::DebugStrRef(o) => debug_str.get_str(o).ok(),
        AttributeValue::DebugLineStrRef(o) => debug_line_str.get_str(o).ok(),
        _ => None,
    }
}

/// Why the line programs could not be read without the compile units.
#[derive(Debug)]
struct NotAllV5;

struct Builder<'f> {
    in_code: &'f dyn Fn(u64, u64) -> bool,
    locs: Vec<Loc>,
    files: Vec<String>,
    file_ids: HashMap<String, u32>,
}

impl<'f> Builder<'f> {
    /// Nothing read yet; ranges kept where `in_code` holds.
    fn new(in_code: &'f dyn Fn(u64, u64) -> bool) -> Self {
        Builder {
            in_code,
            locs: Vec::new(),
            files: Vec::new(),
            file_ids: HashMap::new(),
        }
    }

    fn file_id(&mut self, name: String) -> u32 {
        if let Some(&id) = self.file_ids.get(&name) {
            return id;
        }
        let id = self.files.len() as u32;
        self.files.push(name.clone());
        self.file_ids.insert(name, id);
        id
    }

    /// Reads every line program of `.debug_line` in turn, each with its
    /// directory 0 as the compilation directory, if all of them are DWARF
    /// 5's (GCC and Clang make directory 0 the unit's `DW_AT_comp_dir`);
    /// otherwise (an older program, or one that does not parse) fails,
    /// and the caller starts again from the units with a fresh builder.
    fn read_v5_programs(
        &mut self,
        sections: &HashMap<&'static str, Cow<'_, [u8]>>,
        endian: RunTimeEndian,
    ) -> Result<(), NotAllV5> {
        let sect = |id: &str| EndianSlice::new(&sections[id][..], endian);
        let debug_line = gimli::DebugLine::from(sect(".debug_line"));
        let debug_str = gimli::DebugStr::from(sect(".debug_str"));
        let debug_line_str = gimli::DebugLineStr::from(sect(".debug_line_str"));
        let len = sections[".debug_line"].len();
        let mut at = 0;
        while at < len {
            // The address size is the header's own in DWARF 5. An older
            // program sends the whole object the units' way (what was read
            // is thrown away with this builder).
            let program = debug_line
                .program(gimli::DebugLineOffset(at), 8, None, None)
                .map_err(|_| NotAllV5)?;
            let header = program.header();
            if header.version() < 5 {
                return Err(NotAllV5);
            }
            at += header.format().initial_length_size() as usize + header.unit_length();
            let comp_dir = string_value(header.directory(0), &debug_str, &debug_line_str)
                .map(|c| c.to_string_lossy().into_owned());
            let files = self.file_names(header, comp_dir.as_deref(), &debug_str, &debug_line_str);
            let _ = self.read_rows(program, &files);
        }
        Ok(())
    }

    fn read_all(
        &mut self,
        sections: &HashMap<&'static str, Cow<'_, [u8]>>,
        endian: RunTimeEndian,
    ) -> gimli::Result<()> {
        let sect = |id: &str| EndianSlice::new(&sections[id][..], endian);
        let debug_info = gimli::DebugInfo::from(sect(".debug_info"));
        let debug_abbrev = gimli::DebugAbbrev::from(sect(".debug_abbrev"));
        let debug_line = gimli::DebugLine::from(sect(".debug_line"));
        let debug_str = gimli::DebugStr::from(sect(".debug_str"));
        let debug_line_str = gimli::DebugLineStr::from(sect(".debug_line_str"));

        let mut units = debug_info.units();
        while let Some(header) = units.next()? {
            let Ok(abbrevs) = header.abbreviations(&debug_abbrev) else {
                continue;
            };
            let mut cursor = header.entries(&abbrevs);
            let Ok(Some(root)) = cursor.next_dfs() else {
                continue;
            };
            if root.tag() != gimli::DW_TAG_compile_unit && root.tag() != gimli::DW_TAG_skeleton_unit
            {
                continue;
            }
            let comp_dir = string_value(
                root.attr_value_raw(gimli::DW_AT_comp_dir),
                &debug_str,
                &debug_line_str,
            );
            let stmt_list = match root.attr_value_raw(gimli::DW_AT_stmt_list) {
                Some(AttributeValue::DebugLineRef(o)) => o,
                Some(AttributeValue::SecOffset(o)) => gimli::DebugLineOffset(o),
                Some(v) => match v.udata_value() {
                    Some(o) => gimli::DebugLineOffset(o as usize),
                    None => continue,
                },
                None => continue,
            };
            let Ok(program) = debug_line.program(stmt_list, header.address_size(), None, None)
            else {
                continue;
            };
            let comp_dir = comp_dir.map(|c| c.to_string_lossy().into_owned());
            let files = self.file_names(
                program.header(),
                comp_dir.as_deref(),
                &debug_str,
                &debug_line_str,
            );
            let _ = self.read_rows(program, &files);
        }
        Ok(())
    }

    /// The composed names of the program's file entries, indexed like the
    /// `file` register (DWARF < 5: 1-based; DWARF 5: 0-based). `None`
    /// entries become `???`.
    fn file_names(
        &mut self,
        header: &gimli::LineProgramHeader<Reader>,
        comp_dir: Option<&str>,
        debug_str: &gimli::DebugStr<Reader>,
        debug_line_str: &gimli::DebugLineStr<Reader>,
    ) -> Vec<u32> {
        let string = |v: &AttributeValue<Reader>| -> Option<String> {
            let r = string_value(Some(*v), debug_str, debug_line_str)?;
            Some(r.to_string_lossy().into_owned())
        };
        let compose_dir = |d: String| -> String {
            match comp_dir {
                Some(c) if !d.starts_with('/') && !c.is_empty() => format!("{c}/{d}"),
                _ => d,
            }
        };
        let v5 = header.version() >= 5;
        let mut dirs: Vec<Option<String>> = Vec::new();
        if !v5 {
            dirs.push(Some(comp_dir.unwrap_or(".").to_string()));
        }
        for d in header.include_directories() {
            dirs.push(string(d).map(compose_dir));
        }
        let mut ids = Vec::new();
        if !v5 {
            ids.push(self.file_id(crate::UNKNOWN.to_string()));
        }
        for f in header.file_names() {
            let name = string(&f.path_name()).unwrap_or_default();
            let dir = dirs
                .get(f.directory_index() as usize)
                .cloned()
                .flatten()
                .unwrap_or_default();
            let full = if dir.is_empty() {
                name
            } else {
                format!("{dir}/{name}")
            };
            ids.push(self.file_id(full));
        }
        ids
    }

    fn read_rows(
        &mut self,
        program: gimli::IncompleteLineProgram<Reader>,
        files: &[u32],
    ) -> gimli::Result<()> {
        let unknown = self.file_id(crate::UNKNOWN.to_string());
        let file_of = |i: u64| files.get(i as usize).copied().unwrap_or(unknown);
        // Valgrind's "last" registers: a range is recorded only when the
        // previous row's address is non-zero.
        let (mut last_addr, mut last_file, mut last_line) = (0u64, 1u64, 1u64);
        let mut rows = program.rows();
        while let Some((_, row)) = rows.next_row()? {
            let addr = row.address();
            if last_addr != 0 {
                self.add(file_of(last_file), last_addr, addr, last_line);
            }
            if row.end_sequence() {
                (last_addr, last_file, last_line) = (0, 1, 1);
            } else {
                last_addr = addr;
                last_file = row.file_index();
                last_line = row.line().map_or(0, |l| l.get());
            }
        }
        Ok(())
    }

    /// `ML_(addLineInfo)`.
    fn add(&mut self, file: u32, this: u64, next: u64, line: u64) {
        if this == next {
            return;
        }
        let mut size = next.wrapping_sub(this);
        if this > next || size > MAX_LOC_SIZE {
            size = 1;
        }
        if !(self.in_code)(this, this + size - 1) || line > MAX_LINENO {
            return;
        }
        // Valgrind's `addLoc` extends the previous range when this one
        // continues it with the same line number, without comparing files:
        // the merged range keeps the first file.
        if let Some(prev) = self.locs.last_mut() {
            if prev.line as u64 == line
                && prev.addr + prev.size == this
                && prev.size + size <= MAX_LOC_SIZE
            {
                prev.size += size;
                return;
            }
        }
        self.locs.push(Loc {
            addr: this,
            size,
            file,
            line: line as u32,
        });
    }

    /// `canonicaliseLoctab`: sort by address, truncate overlaps, drop
    /// ranges truncated to nothing.
    fn finish(mut self) -> LineData {
        self.locs.sort_by_key(|l| l.addr);
        for i in 0..self.locs.len().saturating_sub(1) {
            let next = self.locs[i + 1].addr;
            let l = &mut self.locs[i];
            if l.addr + l.size > next {
                l.size = (next - l.addr).min(MAX_LOC_SIZE);
            }
        }
        self.locs.retain(|l| l.size > 0);
        LineData {
            locs: Arc::new(self.locs),
            files: self.files,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    /// A program with lines in two files, one of them a header found
    /// through a relative include directory (composed with the
    /// compilation directory), compiled with `-g<dwarf>` in `dir`.
    fn compiled(dir: &testkit::TempDir, dwarf: &str) -> Vec<u8> {
        std::fs::create_dir_all(dir.join("inc")).unwrap();
        std::fs::write(
            dir.join("inc/twice.h"),
            "static inline int twice(int i) { return i * 2; }\n",
        )
        .unwrap();
        std::fs::write(
            dir.join("main.c"),
            "#include <stdio.h>\n#include \"twice.h\"\n\
             static int sq(int x) { return x * x; }\n\
             int main(int argc, char **argv) {\n  int s = 0;\n\
             for (int i = 0; i < argc * 10; i++)\n    s += sq(i) + twice(i);\n\
             printf(\"%d\\n\", s);\n  return 0;\n}\n",
        )
        .unwrap();
        let out = dir.join(&format!("main-{dwarf}"));
        let status = Command::new("gcc")
            .current_dir(dir.path())
            .args([&format!("-g{dwarf}"), "-O0", "-Iinc", "main.c", "-o"])
            .arg(&out)
            .status()
            .unwrap();
        assert!(status.success(), "gcc -g{dwarf}");
        std::fs::read(out).unwrap()
    }

    /// Whether the line programs alone could be read.
    fn by_programs(obj: &object::File) -> bool {
        let mut sections = HashMap::new();
        add_sections(obj, LINE_SECTIONS, &mut sections);
        let all = |_: u64, _: u64| true;
        let mut b = Builder::new(&all);
        b.read_v5_programs(&sections, RunTimeEndian::Little).is_ok()
    }

    /// DWARF 5's line programs, read alone, give the ranges and file names
    /// the compile units give; older ones are read through the units.
    #[test]
    fn line_programs_read_alone_equal_them_read_through_the_units() {
        testkit::require("gcc");
        let dir = testkit::TempDir::new("lines");
        for (dwarf, alone) in [("dwarf-5", true), ("dwarf-4", false)] {
            let data = compiled(&dir, dwarf);
            let obj = object::File::parse(&*data).unwrap();
            assert_eq!(by_programs(&obj), alone, "{dwarf}");
            let all = |_: u64, _: u64| true;
            let lines = LineData::from_object(&obj, &all);
            let units = LineData::from_object_by_units(&obj, &all);
            assert_eq!(lines.named_ranges(), units.named_ranges(), "{dwarf}");
            let header = format!("{}/inc/twice.h", dir.path().display());
            let ranges = lines.named_ranges();
            assert!(ranges.iter().any(|r| r.2 == header), "{dwarf}: {ranges:#?}");
            assert!(ranges.iter().any(|r| r.2.ends_with("/main.c")), "{dwarf}");
        }
    }
}
