//! Objects read once per process.
//!
//! A run has more than one symbolizer: the run's own, which locates
//! positions at the end (its [`crate::Preloader`] reading objects as the
//! client maps them), and `--tool=callgrind`'s, which names each block's
//! function as it is translated or described, on another thread. Each used
//! to read every object itself; reading (libpython's line tables alone
//! take a tenth of a second) was then done twice, once while the client
//! waited for a block's translation. Reads go through one table instead:
//! the first to need an object reads it, one that needs it meanwhile
//! waits for that read, and the others take a copy, which shares the
//! symbol and line tables.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::SystemTime;

use crate::elf::ObjectData;

/// What tells one version of a file from another at the same path: a
/// file rewritten during the run (a client building and running a
/// program) is read again.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Version {
    path: PathBuf,
    dev: u64,
    ino: u64,
    len: u64,
    modified: Option<SystemTime>,
}

/// One version's read: made once, by whoever comes first.
type Read = Arc<OnceLock<Option<ObjectData>>>;

fn reads() -> &'static Mutex<HashMap<Version, Read>> {
    static READS: OnceLock<Mutex<HashMap<Version, Read>>> = OnceLock::new();
    READS.get_or_init(Default::default)
}

/// The object at `path` as [`ObjectData::read`] reads it (`None`: it
/// cannot be read), read once in the process for each version of the file.
pub(crate) fn read(path: &Path) -> Option<ObjectData> {
    use std::os::unix::fs::MetadataExt;
    let Ok(meta) = std::fs::metadata(path) else {
        return ObjectData::read(path).ok();
    };
    let version = Version {
        path: path.to_path_buf(),
        dev: meta.dev(),
        ino: meta.ino(),
        len: meta.len(),
        modified: meta.modified().ok(),
    };
    let read = {
        // Every update is one insert: a panic elsewhere leaves the map
        // whole.
        let mut reads = reads().lock().unwrap_or_else(|p| p.into_inner());
        reads.entry(version).or_default().clone()
    };
    read.get_or_init(|| ObjectData::read(path).ok()).clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_object_is_read_once_and_again_when_rewritten() {
        let exe = std::env::current_exe().unwrap();
        let dir = std::env::temp_dir().join(format!("symbols-shared-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let copy = dir.join("obj");
        std::fs::copy(&exe, &copy).unwrap();
        let first = read(&copy).expect("an ELF file");
        let again = read(&copy).expect("an ELF file");
        assert!(Arc::ptr_eq(first.symbols(), again.symbols()), "one read");
        // Another file now at the path: not the first read.
        std::fs::remove_file(&copy).unwrap();
        std::fs::write(&copy, b"not an object").unwrap();
        assert!(read(&copy).is_none());
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(read(&copy).is_none());
    }
}
