//! Starting the client: finding the program like `execvp`, refusing what the
//! engine cannot run with a one-line reason before anything is spawned, and
//! the process model. The calling process *becomes* the client, so that the
//! pid its caller's `fork` returned is the client's (the banner, `%p` and
//! `getppid()` in the client's children agree), its caller's `wait` sees
//! the client's own exit status or killing signal, and signals sent to it
//! reach the client. The tool runs in a detached process (a grandchild in
//! a session of its own, as `strace -D` runs strace) that seizes the
//! caller with ptrace, lets it exec the program and traces it from there.

use super::os_err;
use crate::sys::{self, ClientStep, Forked, WaitStatus};
use crate::{EngineError, LaunchConfig};
use std::ffi::{CString, OsStr, OsString};
use std::io::{Read, Write};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

/// The ptrace options of every traced task.
const OPTIONS: i32 = libc::PTRACE_O_EXITKILL
    | libc::PTRACE_O_TRACECLONE
    | libc::PTRACE_O_TRACEFORK
    | libc::PTRACE_O_TRACEVFORK
    | libc::PTRACE_O_TRACEEXEC
    | libc::PTRACE_O_TRACESECCOMP
    | libc::PTRACE_O_TRACEEXIT
    | libc::PTRACE_O_TRACESYSGOOD;

/// Forks the detached tracer and makes the calling process the client.
///
/// In the calling process this returns only on failure (the client could
/// not be set up or its program not be run): on success the process *is*
/// the client from then on. In the tracer it returns the client's pid,
/// stopped at `PTRACE_EVENT_EXEC` of its image; when the client never got
/// that far (the caller reports why) the tracer just ends.
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
    // The tracer goes on as a copy of this process: another thread's lock
    // held at the fork would stay held there forever.
    if thread_count() != Some(1) {
        return Err(EngineError(
            "the engine must be started from a single-threaded process".into(),
        ));
    }
    let client = sys::getpid();
    let (ours, theirs) = UnixStream::pair().map_err(|e| os_err("cannot start the tracer", e))?;
    match sys::fork_detached().map_err(|e| os_err("cannot start the tracer", e))? {
        Forked::Original => {
            drop(theirs);
            Err(become_client(ours, &cpath, &argv, &path))
        }
        Forked::Detached => {
            drop(ours);
            sys::map_large_allocations();
            Ok(become_tracer(theirs, client))
        }
    }
}

/// The calling process's side: lets the tracer attach, prepares itself
/// and execs the program. Returns only on failure, with the reason.
fn become_client(
    mut link: UnixStream,
    cpath: &CString,
    argv: &[CString],
    path: &Path,
) -> EngineError {
    let lost = || EngineError("cannot start the client: the tracer ended unexpectedly".into());
    let Some(tracer) = read_i32(&mut link) else {
        return lost();
    };
    sys::allow_tracer(tracer);
    if link.write_all(&0i32.to_ne_bytes()).is_err() {
        return lost();
    }
    match read_i32(&mut link) {
        Some(0) => {}
        Some(libc::EPERM) => {
            return EngineError(
                "cannot trace the client: ptrace is not permitted here (check /proc/sys/kernel/yama/ptrace_scope, containers' seccomp, or CAP_SYS_PTRACE)"
                    .into(),
            )
        }
        Some(errno) => {
            return EngineError(format!(
                "cannot trace the client: {}",
                std::io::Error::from_raw_os_error(errno)
            ))
        }
        None => return lost(),
    }
    drop(link);
    if let Err((step, e)) = sys::prepare_client() {
        let what = match step {
            ClientStep::NoNewPrivs => "no new privileges",
            ClientStep::Seccomp => "seccomp filter",
        };
        return EngineError(format!("cannot set up the client ({what}): {e}"));
    }
    let e = sys::exec(cpath, argv);
    EngineError(format!("cannot run '{}': {e}", path.display()))
}

/// The detached tracer's side: seizes `client` and waits for its exec.
/// Ends the process when the client does not get there.
fn become_tracer(mut link: UnixStream, client: i32) -> i32 {
    sys::release_inherited_fds();
    if link.write_all(&sys::getpid().to_ne_bytes()).is_err() || read_i32(&mut link).is_none() {
        sys::exit_now(0);
    }
    let seized = sys::seize(client, OPTIONS);
    let errno = seized
        .as_ref()
        .err()
        .map_or(0, |e| e.raw_os_error().unwrap_or(libc::EPERM));
    if link.write_all(&errno.to_ne_bytes()).is_err() || errno != 0 {
        sys::exit_now(0);
    }
    drop(link);
    loop {
        match sys::wait_pid(client) {
            Ok(WaitStatus::Event(_, libc::PTRACE_EVENT_EXEC)) => return client,
            // A signal before the exec is the client's, as natively.
            Ok(WaitStatus::Stopped(_, sig)) => {
                let _ = sys::cont(client, sig);
            }
            Ok(WaitStatus::Exited(..) | WaitStatus::Signaled(..)) | Err(_) => sys::exit_now(0),
            // Its exit stop (it could not be set up; it says why): let it go.
            Ok(_) => {
                let _ = sys::cont(client, 0);
            }
        }
    }
}

/// Reads one native-endian `i32` from the other side; `None` at its end.
fn read_i32(link: &mut UnixStream) -> Option<i32> {
    let mut b = [0u8; 4];
    link.read_exact(&mut b).ok()?;
    Some(i32::from_ne_bytes(b))
}

/// The number of threads of this process, from `/proc`.
fn thread_count() -> Option<usize> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("Threads:"))?
        .trim()
        .parse()
        .ok()
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
