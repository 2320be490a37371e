//! Starting the client: finding the program like `execvp`, refusing what the
//! engine cannot run with a one-line reason before anything is spawned, and
//! bringing the spawned child under ptrace up to its exec, with the
//! launcher's failures (ptrace not permitted, exec refused) told apart.

use super::{os_err, wait_for};
use crate::sys::{self, WaitStatus};
use crate::{EngineError, LaunchConfig};
use std::ffi::{CString, OsStr, OsString};
use std::io::Read;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// Spawns the program of `cfg` under ptrace with the engine's options;
/// returns its pid, stopped at `PTRACE_EVENT_EXEC` of its image.
pub(super) fn launch(cfg: &LaunchConfig) -> Result<i32, EngineError> {
    let path = find_program(&cfg.program)?;
    let cpath = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| EngineError("program name contains a NUL byte".into()))?;
    let mut argv = vec![CString::new(cfg.program.clone().into_vec())
        .map_err(|_| EngineError("program name contains a NUL byte".into()))?];
    for a in &cfg.args {
        argv.push(
            CString::new(a.as_bytes())
                .map_err(|_| EngineError("an argument contains a NUL byte".into()))?,
        );
    }
    let pid = sys::spawn_traced(&cpath, &argv).map_err(|e| os_err("cannot start the client", e))?;
    let fail = |msg: String| -> EngineError {
        sys::kill(pid);
        let _ = sys::wait_pid(pid);
        EngineError(msg)
    };
    // The child stops itself before exec.
    match wait_for(pid)? {
        WaitStatus::Stopped(_, libc::SIGSTOP) => {}
        WaitStatus::Exited(..) => {
            return Err(match sys::read_spawn_error() {
                Some((1, _)) => EngineError(
                    "cannot trace the client: ptrace is not permitted here (check /proc/sys/kernel/yama/ptrace_scope, containers' seccomp, or CAP_SYS_PTRACE)"
                        .into(),
                ),
                Some((step, errno)) => EngineError(format!(
                    "cannot set up the client (step {step}): {}",
                    std::io::Error::from_raw_os_error(errno)
                )),
                None => EngineError("the client exited before it started".into()),
            })
        }
        other => return Err(fail(format!("unexpected first stop of the client: {other:?}"))),
    }
    let opts = libc::PTRACE_O_EXITKILL
        | libc::PTRACE_O_TRACECLONE
        | libc::PTRACE_O_TRACEFORK
        | libc::PTRACE_O_TRACEVFORK
        | libc::PTRACE_O_TRACEEXEC
        | libc::PTRACE_O_TRACESECCOMP
        | libc::PTRACE_O_TRACEEXIT
        | libc::PTRACE_O_TRACESYSGOOD;
    sys::set_options(pid, opts).map_err(|e| fail(format!("cannot set ptrace options: {e}")))?;
    sys::cont(pid, 0).map_err(|e| fail(format!("cannot resume the client: {e}")))?;
    // Then it execs, or fails to and exits.
    match wait_for(pid)? {
        WaitStatus::Event(_, libc::PTRACE_EVENT_EXEC) => {
            let _ = sys::read_spawn_error();
        }
        WaitStatus::Event(_, libc::PTRACE_EVENT_EXIT) => {
            let _ = sys::cont(pid, 0);
            let _ = sys::wait_pid(pid);
            let msg = match sys::read_spawn_error() {
                Some((4, errno)) => format!(
                    "cannot run '{}': {}",
                    path.display(),
                    std::io::Error::from_raw_os_error(errno)
                ),
                Some((step, errno)) => format!(
                    "cannot set up the client (step {step}): {}",
                    std::io::Error::from_raw_os_error(errno)
                ),
                None => "the client exited before it started".into(),
            };
            return Err(EngineError(msg));
        }
        other => {
            return Err(fail(format!(
                "unexpected stop at the client's exec: {other:?}"
            )))
        }
    }
    Ok(pid)
}

/// Why a program cannot be run, in the categories a shell reports (and
/// tells apart by exit status: 127 for not found, 126 for not runnable).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unrunnable {
    /// A name without a slash, not found in `PATH`.
    NotInPath,
    /// A path that names nothing.
    NoSuchFile,
    /// A directory.
    Directory,
    /// A file without execute permission (or not a regular file).
    NoPermission,
    /// A `#!` script whose interpreter does not exist.
    BadInterpreter,
    /// Neither an ELF image nor a `#!` script.
    NotElf,
    /// An ELF image for another machine or class.
    ForeignElf,
    /// The file could not be read.
    Unreadable(std::io::ErrorKind),
}

/// A program that cannot be run: the reason, and the engine's one-line
/// message for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProgramError {
    /// The reason.
    pub kind: Unrunnable,
    /// One line for the user, naming the program.
    pub message: String,
}

impl From<ProgramError> for EngineError {
    fn from(e: ProgramError) -> Self {
        EngineError(e.message)
    }
}

/// Finds `program` like `execvp` does and checks that the engine can run
/// it: an x86-64 ELF image, or a `#!` script whose interpreter exists.
/// [`crate::run`] makes the same checks; a caller can make them first, to
/// report a failure in its own words before anything else.
pub fn find_program(program: &OsStr) -> Result<PathBuf, ProgramError> {
    let path = resolve_program(program)?;
    check_program(&path)?;
    Ok(path)
}

/// Finds the program like `execvp` does.
fn resolve_program(program: &OsStr) -> Result<PathBuf, ProgramError> {
    let name = Path::new(program);
    if program.as_bytes().contains(&b'/') {
        return Ok(name.to_path_buf());
    }
    let path = std::env::var_os("PATH").unwrap_or_else(|| OsString::from("/usr/bin:/bin"));
    for dir in std::env::split_paths(&path) {
        let cand = dir.join(name);
        if let Ok(md) = std::fs::metadata(&cand) {
            if md.is_file() && md.permissions().mode() & 0o111 != 0 {
                return Ok(cand);
            }
        }
    }
    Err(ProgramError {
        kind: Unrunnable::NotInPath,
        message: format!("cannot run '{}': program not found in PATH", name.display()),
    })
}

/// Checks the file is something we can run: an x86-64 ELF (or a script
/// whose interpreter the kernel will find).
fn check_program(path: &Path) -> Result<(), ProgramError> {
    let shown = path.display();
    let refuse = |kind: Unrunnable, why: &dyn std::fmt::Display| ProgramError {
        kind,
        message: format!("cannot run '{shown}': {why}"),
    };
    let md = std::fs::metadata(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => refuse(Unrunnable::NoSuchFile, &"no such file"),
        k => refuse(Unrunnable::Unreadable(k), &e),
    })?;
    if md.is_dir() {
        return Err(refuse(Unrunnable::Directory, &"not an executable file"));
    }
    if !md.is_file() || md.permissions().mode() & 0o111 == 0 {
        return Err(refuse(Unrunnable::NoPermission, &"not an executable file"));
    }
    let mut head = [0u8; 256];
    let n = std::fs::File::open(path)
        .and_then(|mut f| f.read(&mut head))
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::PermissionDenied => refuse(Unrunnable::NoPermission, &e),
            k => refuse(Unrunnable::Unreadable(k), &e),
        })?;
    let head = &head[..n];
    if let Some(line) = head.strip_prefix(b"#!") {
        // The interpreter: the first word of the first line.
        let line = line.split(|&b| b == b'\n').next().unwrap_or(&[]);
        let interp = line
            .split(|&b| b == b' ' || b == b'\t')
            .find(|w| !w.is_empty())
            .unwrap_or(&[]);
        let interp = Path::new(OsStr::from_bytes(interp));
        if std::fs::metadata(interp).is_err() {
            return Err(refuse(
                Unrunnable::BadInterpreter,
                &format_args!("bad interpreter '{}': no such file", interp.display()),
            ));
        }
        return Ok(());
    }
    if n < 20 || &head[..4] != b"\x7fELF" {
        return Err(refuse(Unrunnable::NotElf, &"not an ELF executable"));
    }
    if !is_x86_64(head[..20].try_into().expect("20 bytes")) {
        return Err(refuse(
            Unrunnable::ForeignElf,
            &"not an x86-64 program (only x86-64 ELF is supported)",
        ));
    }
    Ok(())
}

/// Whether `path` is a 64-bit x86-64 ELF file.
pub(super) fn is_x86_64_elf(path: &Path) -> bool {
    let mut head = [0u8; 20];
    std::fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut head))
        .is_ok()
        && &head[..4] == b"\x7fELF"
        && is_x86_64(&head)
}

/// Whether the ELF header starting with `head` is 64-bit (ELFCLASS64) for
/// x86-64 (EM_X86_64).
fn is_x86_64(head: &[u8; 20]) -> bool {
    head[4] == 2 && u16::from_le_bytes([head[18], head[19]]) == 62
}
