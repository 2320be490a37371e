//! Writing an output file whole or not at all: through a temporary file
//! in its directory and a rename, so that neither a crash nor a write error
//! leaves half a file behind; in place where the file cannot be replaced
//! (a device or pipe, or a read-only directory), as Valgrind writes it. An
//! open failure is told apart from a write failure, since Cachegrind
//! reports them differently.

use std::io::{self, Write};
use std::path::Path;

/// Why an output file was not written.
#[derive(Debug)]
pub enum OutputError {
    /// It could not be created or opened (Cachegrind's "can't open").
    Open(io::Error),
    /// It was opened, but writing it failed (a full disk, `/dev/full`).
    Write(io::Error),
}

/// Writes `contents` to `path` (permission bits `mode`, reduced by the
/// umask, when created; an existing file keeps its own), never leaving a
/// half-written file where that can be avoided: a regular file is written
/// to a temporary file in its directory and renamed over it. A path that
/// cannot be replaced is written in place, as Valgrind writes it: a device
/// or pipe (`/dev/stdout`), and an existing writable file in a directory
/// where we cannot create the temporary file (a read-only directory).
pub fn write_output(
    path: &Path,
    mode: u32,
    contents: impl FnOnce(&mut dyn Write) -> io::Result<()>,
) -> Result<(), OutputError> {
    use std::os::unix::fs::OpenOptionsExt;
    let existing = std::fs::metadata(path).ok();
    if existing.as_ref().is_some_and(|m| !m.is_file()) {
        return write_in_place(path, false, contents);
    }
    // A symbolic link is followed, as an open for writing would.
    let target = match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_symlink() => std::fs::canonicalize(path).ok(),
        _ => None,
    };
    let path = target.as_deref().unwrap_or(path);
    let Some(name) = path.file_name() else {
        return Err(OutputError::Open(io::Error::new(
            io::ErrorKind::InvalidInput,
            "no file name",
        )));
    };
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(name);
    tmp_name.push(format!(".tmp{}", std::process::id()));
    let tmp = path.with_file_name(tmp_name);
    let file = match std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(&tmp)
    {
        Ok(f) => f,
        Err(e) => {
            // The directory refuses new files: a file that is there and
            // writable is written in place.
            let dir_refuses = matches!(
                e.raw_os_error(),
                Some(libc_errno::EACCES | libc_errno::EROFS | libc_errno::EPERM)
            );
            if dir_refuses && existing.is_some() {
                return write_in_place(path, true, contents);
            }
            return Err(OutputError::Open(e));
        }
    };
    let written = (|| {
        if let Some(m) = &existing {
            file.set_permissions(m.permissions())?;
        }
        let mut out = io::BufWriter::with_capacity(1 << 16, file);
        contents(&mut out)?;
        out.into_inner().map_err(|e| e.into_error())?.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    written.map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        OutputError::Write(e)
    })
}

/// Writes `contents` into the existing `path` (truncating it first when
/// `truncate`; a device or pipe is not truncated).
fn write_in_place(
    path: &Path,
    truncate: bool,
    contents: impl FnOnce(&mut dyn Write) -> io::Result<()>,
) -> Result<(), OutputError> {
    let file = std::fs::OpenOptions::new()
        .write(true)
        .truncate(truncate)
        .open(path)
        .map_err(OutputError::Open)?;
    let mut out = io::BufWriter::with_capacity(1 << 16, file);
    contents(&mut out)
        .and_then(|()| out.flush())
        .map_err(OutputError::Write)
}

/// Creates `path` empty (permission bits `mode`, reduced by the umask,
/// when new), or empties the regular file there, as Callgrind makes its
/// output file when it starts. A path that is not a regular file (a
/// device or pipe) is left alone: the profile goes there at the end, and
/// opening a pipe now would wait for its reader.
pub fn create_empty(path: &Path, mode: u32) -> io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    if std::fs::metadata(path).is_ok_and(|m| !m.is_file()) {
        return Ok(());
    }
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(path)
        .map(drop)
}

/// The few errno values [`write_output`] tells apart (std has no names
/// for them, and this crate does not link libc directly).
mod libc_errno {
    pub const EPERM: i32 = 1;
    pub const EACCES: i32 = 13;
    pub const EROFS: i32 = 30;
}

impl From<OutputError> for io::Error {
    fn from(e: OutputError) -> io::Error {
        match e {
            OutputError::Open(e) | OutputError::Write(e) => e,
        }
    }
}

/// [`write_output`] with mode 0600, as Cachegrind's output files have.
pub fn write_file_atomic(
    path: &Path,
    contents: impl FnOnce(&mut dyn Write) -> io::Result<()>,
) -> io::Result<()> {
    write_file_replacing(path, 0o600, contents)
}

/// [`write_output`] with the permission bits `mode` for a new file, and
/// any failure as an I/O error.
pub fn write_file_replacing(
    path: &Path,
    mode: u32,
    contents: impl FnOnce(&mut dyn Write) -> io::Result<()>,
) -> io::Result<()> {
    Ok(write_output(path, mode, contents)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replacing_keeps_modes_and_follows_links() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("cgout-replace-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let target = dir.join("target");
        std::fs::write(&target, b"old").unwrap();
        std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o640)).unwrap();
        let link = dir.join("link");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        write_file_replacing(&link, 0o666, |w| w.write_all(b"new")).unwrap();
        assert!(std::fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink());
        assert_eq!(std::fs::read(&target).unwrap(), b"new");
        let mode = std::fs::metadata(&target).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o640);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn atomic_write_leaves_no_temporary() {
        let dir = std::env::temp_dir().join(format!("cgout-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("out");
        write_file_atomic(&path, |w| w.write_all(b"x\n")).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"x\n");
        let failed = write_file_atomic(&dir.join("bad"), |_| Err(io::Error::other("boom")));
        assert!(failed.is_err());
        let names: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("out")]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn output_is_replaced_whole_and_write_errors_are_told_apart() {
        let dir = std::env::temp_dir().join(format!("cs-outfile-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("out");
        write_output(&f, 0o600, |w| w.write_all(b"one\n")).unwrap();
        assert_eq!(std::fs::read_to_string(&f).unwrap(), "one\n");
        // A failing writer leaves the old file and no temporary file.
        let failed = write_output(&f, 0o600, |w| {
            w.write_all(b"half")?;
            Err(io::Error::other("boom"))
        });
        assert!(matches!(failed, Err(OutputError::Write(_))), "{failed:?}");
        assert_eq!(std::fs::read_to_string(&f).unwrap(), "one\n");
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1);
        let missing = write_output(&dir.join("no/such/dir"), 0o600, |w| w.write_all(b"x"));
        assert!(matches!(missing, Err(OutputError::Open(_))), "{missing:?}");
        if Path::new("/dev/full").exists() {
            let full = write_output(Path::new("/dev/full"), 0o600, |w| w.write_all(b"x"));
            assert!(matches!(full, Err(OutputError::Write(_))), "{full:?}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
