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
    let path = resolve_program(&cfg.program)?;
    check_program(&path)?;
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

/// Finds the program like `execvp` does.
fn resolve_program(program: &OsStr) -> Result<PathBuf, EngineError> {
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
    Err(EngineError(format!(
        "cannot run '{}': program not found in PATH",
        name.display()
    )))
}

/// Checks the file is something we can run: an x86-64 ELF (or a script
/// whose interpreter the kernel will load).
fn check_program(path: &Path) -> Result<(), EngineError> {
    let shown = path.display();
    let md = std::fs::metadata(path).map_err(|e| {
        EngineError(match e.kind() {
            std::io::ErrorKind::NotFound => format!("cannot run '{shown}': no such file"),
            _ => format!("cannot run '{shown}': {e}"),
        })
    })?;
    if !md.is_file() || md.permissions().mode() & 0o111 == 0 {
        return Err(EngineError(format!(
            "cannot run '{shown}': not an executable file"
        )));
    }
    let mut head = [0u8; 20];
    let n = std::fs::File::open(path)
        .and_then(|mut f| f.read(&mut head))
        .map_err(|e| EngineError(format!("cannot run '{shown}': {e}")))?;
    if n >= 2 && &head[..2] == b"#!" {
        return Ok(());
    }
    if n < 20 || &head[..4] != b"\x7fELF" {
        return Err(EngineError(format!(
            "cannot run '{shown}': not an ELF executable"
        )));
    }
    if !is_x86_64(&head) {
        return Err(EngineError(format!(
            "cannot run '{shown}': not an x86-64 program (only x86-64 ELF is supported)"
        )));
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
