//! Inline frames from DWARF: `addr2line`'s chain of inlined functions at
//! an instruction, read from the object file after the run.

use rustc_hash::FxHashMap;
use std::borrow::Cow;
use std::path::{Path, PathBuf};
use std::rc::Rc;

type Reader = gimli::EndianRcSlice<gimli::RunTimeEndian>;

/// One frame of an inline chain: the function, and the source position in
/// it (for an inlined function, its instruction's line; for the functions
/// around it, the line of the inlined call).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InlineFrame {
    /// The function's name, demangled.
    pub function: Option<String>,
    /// The source file.
    pub file: Option<String>,
    /// The line.
    pub line: Option<u32>,
}

/// Reads objects' DWARF once each and answers inline chains.
#[derive(Default)]
pub struct InlineResolver {
    objects: FxHashMap<PathBuf, Option<addr2line::Context<Reader>>>,
}

fn load(path: &Path) -> Option<addr2line::Context<Reader>> {
    use object::{Object, ObjectSection};
    let data = std::fs::read(path).ok()?;
    let file = object::File::parse(&*data).ok()?;
    let endian = if file.is_little_endian() {
        gimli::RunTimeEndian::Little
    } else {
        gimli::RunTimeEndian::Big
    };
    let section = |id: gimli::SectionId| -> Result<Reader, gimli::Error> {
        let bytes = file
            .section_by_name(id.name())
            .and_then(|s| s.uncompressed_data().ok())
            .unwrap_or(Cow::Borrowed(&[]));
        Ok(gimli::EndianRcSlice::new(Rc::from(&*bytes), endian))
    };
    let dwarf = gimli::Dwarf::load(section).ok()?;
    addr2line::Context::from_dwarf(dwarf).ok()
}

impl InlineResolver {
    /// The chain at `address` (a file address) in the object at `path`,
    /// innermost frame first; empty when the object or its DWARF cannot be
    /// read or does not cover the address.
    pub fn frames(&mut self, path: &str, address: u64) -> Vec<InlineFrame> {
        let ctx = self
            .objects
            .entry(PathBuf::from(path))
            .or_insert_with(|| load(Path::new(path)));
        let Some(ctx) = ctx else {
            return Vec::new();
        };
        let mut out = Vec::new();
        let Ok(mut iter) = ctx.find_frames(address).skip_all_loads() else {
            return out;
        };
        while let Ok(Some(frame)) = iter.next() {
            let function = frame
                .function
                .as_ref()
                .and_then(|f| f.raw_name().ok())
                .map(|n| symbols::demangle::demangle(&n[..]));
            let (file, line) = match frame.location {
                Some(l) => (l.file.map(str::to_string), l.line),
                None => (None, None),
            };
            out.push(InlineFrame {
                function,
                file,
                line,
            });
        }
        out
    }
}
