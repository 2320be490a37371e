//! Finding an object's separate debug file, as Valgrind does: first by
//! build id (`/usr/lib/debug/.build-id/xx/yyyy.debug`, the file's own build
//! id checked), then by `.gnu_debuglink` (next to the object, in its
//! `.debug/` subdirectory, and under `/usr/lib/debug/<object dir>/`, with
//! the CRC checked).

use std::path::{Path, PathBuf};

use object::Object;

use crate::elf::{open, Elf};

/// Root of the system's separate debug files.
const DEBUG_ROOT: &str = "/usr/lib/debug";

/// The separate debug file for `obj` (read from `path`), if one exists.
pub fn find(path: &Path, obj: &Elf<'_>) -> Option<PathBuf> {
    if let Ok(Some(id)) = obj.build_id() {
        if id.len() >= 2 {
            let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
            let p = PathBuf::from(format!(
                "{DEBUG_ROOT}/.build-id/{}/{}.debug",
                &hex[..2],
                &hex[2..]
            ));
            if build_id_of(&p).as_deref() == Some(id) {
                return Some(p);
            }
        }
    }
    let (name, crc) = obj.gnu_debuglink().ok().flatten()?;
    let name = std::str::from_utf8(name).ok()?;
    let dir = path.parent().unwrap_or(Path::new("/"));
    let candidates = [
        dir.join(name),
        dir.join(".debug").join(name),
        PathBuf::from(format!("{DEBUG_ROOT}{}/{name}", dir.display())),
    ];
    candidates
        .into_iter()
        .find(|c| c.as_path() != path && std::fs::read(c).is_ok_and(|data| crc32(&data) == crc))
}

fn build_id_of(path: &Path) -> Option<Vec<u8>> {
    let data = open(path).ok()?;
    let f = Elf::parse(&data).ok()?;
    f.build_id().ok().flatten().map(<[u8]>::to_vec)
}

/// The CRC-32 (IEEE 802.3, as zlib computes it) that `.gnu_debuglink`
/// records.
pub fn crc32(data: &[u8]) -> u32 {
    static TABLE: std::sync::OnceLock<[u32; 256]> = std::sync::OnceLock::new();
    let table = TABLE.get_or_init(|| {
        let mut t = [0u32; 256];
        for (i, slot) in t.iter_mut().enumerate() {
            let mut c = i as u32;
            for _ in 0..8 {
                c = if c & 1 != 0 {
                    0xedb8_8320 ^ (c >> 1)
                } else {
                    c >> 1
                };
            }
            *slot = c;
        }
        t
    });
    let mut crc = !0u32;
    for &b in data {
        crc = table[((crc ^ b as u32) & 0xff) as usize] ^ (crc >> 8);
    }
    !crc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32_matches_zlib() {
        assert_eq!(crc32(b""), 0);
        assert_eq!(crc32(b"123456789"), 0xcbf4_3926);
    }
}
