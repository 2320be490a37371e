//! What annotate, merge and diff share: their error type, opening inputs
//! with Python's error wording, and a fast hash map for interned names.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs::File;
use std::hash::{BuildHasherDefault, Hasher};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use crate::pytext;
use crate::reader::ReadError;

/// Why a tool stopped.
#[derive(Debug)]
pub enum ToolError {
    /// A fatal error: the front end prints `<tool>: error: <msg>` and exits
    /// with status 1.
    Fatal(String),
    /// Writing the output failed (e.g. a closed pipe).
    Output(io::Error),
}

impl From<io::Error> for ToolError {
    /// Errors from `?` on writes are output errors; input errors are
    /// converted explicitly with their file names.
    fn from(e: io::Error) -> Self {
        ToolError::Output(e)
    }
}

/// Python's `str(OSError)`: `[Errno 2] No such file or directory: 'x'`.
pub fn os_error_message(e: &io::Error, path: &OsStr) -> String {
    match e.raw_os_error() {
        Some(code) => {
            let text = e.to_string();
            let suffix = format!(" (os error {code})");
            let strerror = text.strip_suffix(&suffix).unwrap_or(&text);
            format!(
                "[Errno {code}] {strerror}: {}",
                pytext::repr_str(path.as_bytes())
            )
        }
        None => e.to_string(),
    }
}

/// Opens an input file for reading, refusing directories as Python's
/// `open()` does.
pub fn open_input(path: &OsStr) -> Result<File, ToolError> {
    let fail = |e: io::Error| ToolError::Fatal(os_error_message(&e, path));
    let file = File::open(Path::new(path)).map_err(fail)?;
    if file.metadata().map_err(fail)?.is_dir() {
        return Err(fail(io::Error::from_raw_os_error(21)));
    }
    Ok(file)
}

/// Turns a reader error into the tools' message: `<file>:<line>: <msg>`.
pub fn read_error(path: &OsStr, e: ReadError) -> ToolError {
    let name = path.to_string_lossy();
    ToolError::Fatal(match e {
        ReadError::Format { line, msg } => format!("{name}:{line}: {msg}"),
        ReadError::Io(e) => format!("{name}: {}", os_error_message(&e, path)),
    })
}

/// The FxHash function (as in rustc): fast for the short keys used here
/// (names, line numbers), and deterministic.
#[derive(Default, Clone, Copy)]
pub struct FxHasher {
    hash: u64,
}

const SEED: u64 = 0x51_7c_c1_b7_27_22_0a_95;

impl FxHasher {
    #[inline]
    fn add(&mut self, word: u64) {
        self.hash = (self.hash.rotate_left(5) ^ word).wrapping_mul(SEED);
    }
}

impl Hasher for FxHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            self.add(u64::from_le_bytes(c.try_into().unwrap_or_default()));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut buf = [0u8; 8];
            buf[..rest.len()].copy_from_slice(rest);
            self.add(u64::from_le_bytes(buf));
        }
    }
    #[inline]
    fn write_u8(&mut self, i: u8) {
        self.add(u64::from(i));
    }
    #[inline]
    fn write_u32(&mut self, i: u32) {
        self.add(u64::from(i));
    }
    #[inline]
    fn write_u64(&mut self, i: u64) {
        self.add(i);
    }
    #[inline]
    fn write_usize(&mut self, i: usize) {
        self.add(i as u64);
    }
    #[inline]
    fn finish(&self) -> u64 {
        self.hash
    }
}

/// A `HashMap` using [`FxHasher`].
pub type FxHashMap<K, V> = HashMap<K, V, BuildHasherDefault<FxHasher>>;

/// Interns byte strings as dense `u32` ids.
#[derive(Default)]
pub struct Interner {
    ids: FxHashMap<Box<[u8]>, u32>,
    names: Vec<Box<[u8]>>,
}

impl Interner {
    /// The id of `name`, adding it if new.
    pub fn intern(&mut self, name: &[u8]) -> u32 {
        if let Some(&id) = self.ids.get(name) {
            return id;
        }
        let id = self.names.len() as u32;
        self.names.push(name.into());
        self.ids.insert(name.into(), id);
        id
    }

    /// The id of `name`, if interned.
    pub fn get(&self, name: &[u8]) -> Option<u32> {
        self.ids.get(name).copied()
    }

    /// The name of `id`.
    pub fn name(&self, id: u32) -> &[u8] {
        &self.names[id as usize]
    }

    /// The number of names.
    pub fn len(&self) -> usize {
        self.names.len()
    }

    /// True if no name was interned.
    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_style_os_errors() {
        let e = io::Error::from_raw_os_error(2);
        assert_eq!(
            os_error_message(&e, OsStr::new("x.out")),
            "[Errno 2] No such file or directory: 'x.out'"
        );
        match open_input(OsStr::new("/")) {
            Err(ToolError::Fatal(m)) => assert_eq!(m, "[Errno 21] Is a directory: '/'"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn interner_gives_dense_ids() {
        let mut i = Interner::default();
        assert_eq!(i.intern(b"a"), 0);
        assert_eq!(i.intern(b"b"), 1);
        assert_eq!(i.intern(b"a"), 0);
        assert_eq!(i.get(b"b"), Some(1));
        assert_eq!(i.name(1), b"b");
        assert_eq!(i.len(), 2);
    }
}
