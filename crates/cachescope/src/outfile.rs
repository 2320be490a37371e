//! Valgrind's file-name patterns (`VG_(expand_file_name)`, spec §5.1):
//! `%p` → pid, `%n` → a per-pid sequence number, `%q{VAR}` → the value of
//! an environment variable, `%%` → `%`; a relative result is prefixed with
//! the directory cachescope started in, so a client's `chdir` has no effect.
//!
//! And writing the file so named ([`write_output`]): whole or not at all
//! where the directory allows it, and with an open failure told apart from
//! a write failure, since Cachegrind reports them differently.

use std::collections::HashMap;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

/// Expands file-name patterns, keeping the `%n` counters per pid.
#[derive(Debug)]
pub struct Expander {
    startup_dir: Option<PathBuf>,
    seq: HashMap<i32, u32>,
}

/// The message lines for a bad pattern, as Valgrind prints them after
/// `Bad option: <option>=<pattern>` (each line gets the output prefix).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadPattern(pub Vec<String>);

impl Expander {
    /// An expander resolving relative names against `startup_dir` (`None`
    /// if the working directory did not exist at startup).
    pub fn new(startup_dir: Option<PathBuf>) -> Self {
        Expander {
            startup_dir,
            seq: HashMap::new(),
        }
    }

    /// Expands `pattern` (the value of `option`) for process `pid`, with
    /// `env` looking up `%q{VAR}`.
    pub fn expand(
        &mut self,
        option: &str,
        pattern: &str,
        pid: i32,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<PathBuf, BadPattern> {
        let bad = |msg: &[&str]| {
            let mut lines = vec![format!("Bad option: {option}={pattern}")];
            lines.extend(msg.iter().map(|s| s.to_string()));
            lines.push(crate::simopts::USE_HELP.to_string());
            BadPattern(lines)
        };
        if pattern.is_empty() {
            return Err(bad(&["No filename given"]));
        }
        if pattern.starts_with('~') {
            return Err(bad(&[
                "Filename begins with '~'",
                "You probably expected the shell to expand the '~', but it",
                "didn't.  The rules for '~'-expansion vary from shell to shell.",
                "You might have more luck using $HOME instead.",
            ]));
        }
        let mut out = String::new();
        let mut chars = pattern.chars();
        while let Some(c) = chars.next() {
            if c != '%' {
                out.push(c);
                continue;
            }
            match chars.next() {
                Some('%') => out.push('%'),
                Some('p') => out.push_str(&pid.to_string()),
                Some('n') => {
                    let n = self.seq.entry(pid).or_insert(0);
                    *n += 1;
                    out.push_str(&n.to_string());
                }
                Some('q') => {
                    if chars.next() != Some('{') {
                        return Err(bad(&["Expected '{' after '%q'"]));
                    }
                    let mut name = String::new();
                    loop {
                        match chars.next() {
                            None => return Err(bad(&["Missing '}' in %q specifier"])),
                            Some('}') => break,
                            Some(ch) => name.push(ch),
                        }
                    }
                    match env(&name) {
                        Some(v) => out.push_str(&v),
                        None => {
                            return Err(bad(&[&format!(
                                "Environment variable '{name}' is not set"
                            )]))
                        }
                    }
                }
                _ => return Err(bad(&["Expected 'p' or 'q' or '%' after '%'"])),
            }
        }
        if out.starts_with('/') {
            return Ok(PathBuf::from(out));
        }
        match &self.startup_dir {
            // Valgrind joins with a plain "/", keeping the name as written.
            Some(dir) => Ok(PathBuf::from(format!("{}/{out}", dir.display()))),
            None => Err(bad(&[
                "Current working dir doesn't exist, use absolute path",
            ])),
        }
    }
}

/// The environment lookup used for `%q{VAR}` outside tests.
pub fn process_env(name: &str) -> Option<String> {
    std::env::var_os(name).map(|v| v.to_string_lossy().into_owned())
}

/// Why an output file was not written.
#[derive(Debug)]
pub enum OutputError {
    /// It could not be created or opened (Cachegrind's "can't open").
    Open(io::Error),
    /// It was opened, but writing it failed (a full disk, `/dev/full`).
    Write(io::Error),
}

/// Writes `contents` to `path` (mode 0600 when created), never leaving a
/// half-written file where that can be avoided: a regular file is written
/// to a temporary file in its directory and renamed over it. A path that
/// cannot be replaced is written in place, as Valgrind writes it: a device
/// or pipe (`/dev/stdout`), and an existing writable file in a directory
/// where we cannot create the temporary file (a read-only directory).
pub fn write_output(
    path: &Path,
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
        .create_new(true)
        .mode(0o600)
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

/// The few errno values [`write_output`] tells apart (std has no names
/// for them, and this crate does not link libc directly).
mod libc_errno {
    pub const EPERM: i32 = 1;
    pub const EACCES: i32 = 13;
    pub const EROFS: i32 = 30;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(name: &str) -> Option<String> {
        (name == "FOO").then(|| "bar".to_string())
    }

    fn ex() -> Expander {
        Expander::new(Some(PathBuf::from("/start")))
    }

    #[test]
    fn expands_like_valgrind() {
        let mut e = ex();
        let p = e
            .expand("--cachegrind-out-file", "cg.%p.%q{FOO}.%n.%%", 9276, &env)
            .unwrap();
        assert_eq!(p, PathBuf::from("/start/cg.9276.bar.1.%"));
        let p = e.expand("--x", "/abs/%n-%n", 9276, &env).unwrap();
        assert_eq!(p, PathBuf::from("/abs/2-3"));
        let p = e.expand("--x", "o.%n", 1, &env).unwrap();
        assert_eq!(p, PathBuf::from("/start/o.1"));
    }

    #[test]
    fn bad_patterns_give_valgrinds_messages() {
        let mut e = ex();
        let msg = |e: &mut Expander, pat: &str| e.expand("--opt", pat, 1, &env).unwrap_err().0;
        assert_eq!(
            msg(&mut e, "x.%z"),
            vec![
                "Bad option: --opt=x.%z",
                "Expected 'p' or 'q' or '%' after '%'",
                crate::simopts::USE_HELP
            ]
        );
        assert_eq!(msg(&mut e, "")[1], "No filename given");
        assert_eq!(msg(&mut e, "~/x")[1], "Filename begins with '~'");
        assert_eq!(msg(&mut e, "~/x").len(), 6);
        assert_eq!(msg(&mut e, "a%q{FOO")[1], "Missing '}' in %q specifier");
        assert_eq!(msg(&mut e, "a%qFOO")[1], "Expected '{' after '%q'");
        assert_eq!(
            msg(&mut e, "a%q{NOPE}")[1],
            "Environment variable 'NOPE' is not set"
        );
        assert_eq!(msg(&mut e, "a%")[1], "Expected 'p' or 'q' or '%' after '%'");
        let mut lost = Expander::new(None);
        assert_eq!(
            msg(&mut lost, "rel")[1],
            "Current working dir doesn't exist, use absolute path"
        );
    }

    #[test]
    fn output_is_replaced_whole_and_write_errors_are_told_apart() {
        let dir = std::env::temp_dir().join(format!("cs-outfile-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("out");
        write_output(&f, |w| w.write_all(b"one\n")).unwrap();
        assert_eq!(std::fs::read_to_string(&f).unwrap(), "one\n");
        // A failing writer leaves the old file and no temporary file.
        let failed = write_output(&f, |w| {
            w.write_all(b"half")?;
            Err(io::Error::other("boom"))
        });
        assert!(matches!(failed, Err(OutputError::Write(_))), "{failed:?}");
        assert_eq!(std::fs::read_to_string(&f).unwrap(), "one\n");
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1);
        let missing = write_output(&dir.join("no/such/dir"), |w| w.write_all(b"x"));
        assert!(matches!(missing, Err(OutputError::Open(_))), "{missing:?}");
        if Path::new("/dev/full").exists() {
            let full = write_output(Path::new("/dev/full"), |w| w.write_all(b"x"));
            assert!(matches!(full, Err(OutputError::Write(_))), "{full:?}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
