//! Thin wrappers over the Linux system calls the tracer needs (fork/exec of
//! the client, ptrace, waitpid, seccomp). This is the only module of the
//! engine with `unsafe` code; everything above it is safe Rust.

// The crate denies `unsafe_code`; this module is the exception, and each
// `unsafe` block here must say why it is sound.
#![allow(unsafe_code)]
#![warn(clippy::undocumented_unsafe_blocks)]

use std::ffi::CString;
use std::io;

/// The general-purpose registers of a stopped tracee.
pub type Regs = libc::user_regs_struct;

/// What `waitpid` reported for one task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitStatus {
    /// The task exited with this status.
    Exited(i32, i32),
    /// The task was killed by this signal.
    Signaled(i32, i32),
    /// A ptrace event stop (`PTRACE_EVENT_*`), with the signal number.
    Event(i32, i32),
    /// A signal-delivery stop (or group stop) with this signal.
    Stopped(i32, i32),
    /// A syscall stop (PTRACE_O_TRACESYSGOOD: SIGTRAP|0x80).
    Syscall(i32),
}

fn check(ret: libc::c_long) -> io::Result<libc::c_long> {
    if ret == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// Waits for any traced task (`__WALL`), retrying on EINTR.
pub fn wait_any() -> io::Result<WaitStatus> {
    loop {
        let mut status: libc::c_int = 0;
        // SAFETY: plain syscall; `status` is a valid out pointer.
        let pid = unsafe { libc::waitpid(-1, &mut status, libc::__WALL) };
        if pid == -1 {
            let err = io::Error::last_os_error();
            if err.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(err);
        }
        return Ok(decode_status(pid, status));
    }
}

/// Waits for one particular task.
pub fn wait_pid(pid: i32) -> io::Result<WaitStatus> {
    loop {
        let mut status: libc::c_int = 0;
        // SAFETY: plain syscall; `status` is a valid out pointer.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::__WALL) };
        if r == -1 {
            let err = io::Error::last_os_error();
            if err.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(err);
        }
        return Ok(decode_status(r, status));
    }
}

fn decode_status(pid: i32, status: i32) -> WaitStatus {
    if libc::WIFEXITED(status) {
        WaitStatus::Exited(pid, libc::WEXITSTATUS(status))
    } else if libc::WIFSIGNALED(status) {
        WaitStatus::Signaled(pid, libc::WTERMSIG(status))
    } else {
        let sig = libc::WSTOPSIG(status);
        let event = (status >> 16) & 0xff;
        if event != 0 {
            WaitStatus::Event(pid, event)
        } else if sig == libc::SIGTRAP | 0x80 {
            WaitStatus::Syscall(pid)
        } else {
            WaitStatus::Stopped(pid, sig)
        }
    }
}

fn ptrace(req: libc::c_uint, pid: i32, addr: usize, data: usize) -> io::Result<libc::c_long> {
    // SAFETY: the requests used here take integer/pointer arguments that the
    // callers below make valid (out pointers point to live locals).
    check(unsafe {
        libc::ptrace(
            req,
            pid,
            addr as *mut libc::c_void,
            data as *mut libc::c_void,
        )
    })
}

/// Sets the ptrace options of a freshly attached task.
pub fn set_options(pid: i32, options: i32) -> io::Result<()> {
    ptrace(libc::PTRACE_SETOPTIONS, pid, 0, options as usize).map(drop)
}

/// Resumes a stopped task, delivering `sig` (0 for none).
pub fn cont(pid: i32, sig: i32) -> io::Result<()> {
    ptrace(libc::PTRACE_CONT, pid, 0, sig as usize).map(drop)
}

/// Resumes a stopped task until the next syscall entry/exit.
pub fn cont_syscall(pid: i32, sig: i32) -> io::Result<()> {
    ptrace(libc::PTRACE_SYSCALL, pid, 0, sig as usize).map(drop)
}

/// Lets a task go: it runs natively from now on.
pub fn detach(pid: i32, sig: i32) -> io::Result<()> {
    ptrace(libc::PTRACE_DETACH, pid, 0, sig as usize).map(drop)
}

/// Reads the registers of a stopped task.
pub fn get_regs(pid: i32) -> io::Result<Regs> {
    // SAFETY: user_regs_struct is plain old data; all-zero is a valid value.
    let mut regs: Regs = unsafe { std::mem::zeroed() };
    ptrace(
        libc::PTRACE_GETREGS,
        pid,
        0,
        &mut regs as *mut Regs as usize,
    )?;
    Ok(regs)
}

/// Writes the registers of a stopped task.
pub fn set_regs(pid: i32, regs: &Regs) -> io::Result<()> {
    ptrace(libc::PTRACE_SETREGS, pid, 0, regs as *const Regs as usize).map(drop)
}

/// The message of the last ptrace event (new pid for fork/clone events).
pub fn event_msg(pid: i32) -> io::Result<u64> {
    let mut msg: libc::c_ulong = 0;
    ptrace(
        libc::PTRACE_GETEVENTMSG,
        pid,
        0,
        &mut msg as *mut libc::c_ulong as usize,
    )?;
    Ok(msg)
}

/// Sends a signal to one thread.
pub fn tgkill(tgid: i32, tid: i32, sig: i32) {
    // SAFETY: plain syscall with integer arguments.
    unsafe {
        libc::syscall(libc::SYS_tgkill, tgid, tid, sig);
    }
}

/// Sends SIGKILL to a process.
pub fn kill(pid: i32) {
    // SAFETY: plain syscall with integer arguments.
    unsafe {
        libc::kill(pid, libc::SIGKILL);
    }
}

/// First syscall number reserved for the engine's exits (trapped by seccomp).
pub const MAGIC_LO: u32 = 0x00c0_5c00;
/// Last reserved syscall number.
pub const MAGIC_HI: u32 = MAGIC_LO + 15;

const AUDIT_ARCH_X86_64: u32 = 0xc000_003e;

fn bpf_stmt(code: u16, k: u32) -> libc::sock_filter {
    libc::sock_filter {
        code,
        jt: 0,
        jf: 0,
        k,
    }
}

fn bpf_jump(code: u16, k: u32, jt: u8, jf: u8) -> libc::sock_filter {
    libc::sock_filter { code, jt, jf, k }
}

/// The seccomp program: trace the engine's magic syscall numbers, allow
/// everything else (so a program that runs detached is not affected).
fn seccomp_program() -> Vec<libc::sock_filter> {
    const LD_W_ABS: u16 = (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16;
    const JEQ: u16 = (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16;
    const JGE: u16 = (libc::BPF_JMP | libc::BPF_JGE | libc::BPF_K) as u16;
    const JGT: u16 = (libc::BPF_JMP | libc::BPF_JGT | libc::BPF_K) as u16;
    const RET: u16 = (libc::BPF_RET | libc::BPF_K) as u16;
    vec![
        bpf_stmt(LD_W_ABS, 4),                  // arch
        bpf_jump(JEQ, AUDIT_ARCH_X86_64, 0, 4), // other arch -> allow
        bpf_stmt(LD_W_ABS, 0),                  // nr
        bpf_jump(JGE, MAGIC_LO, 0, 2),          // below -> allow
        bpf_jump(JGT, MAGIC_HI, 1, 0),          // above -> allow
        bpf_stmt(RET, libc::SECCOMP_RET_TRACE), // magic -> tracer
        bpf_stmt(RET, libc::SECCOMP_RET_ALLOW),
    ]
}

/// Forks a child that asks to be traced, disables address randomisation,
/// installs the seccomp filter, stops itself with SIGSTOP and then execs
/// `path`. Returns the child's pid, or the exec error reported through a
/// close-on-exec pipe.
pub fn spawn_traced(path: &CString, argv: &[CString]) -> io::Result<i32> {
    // Everything the child touches is prepared before fork: after fork only
    // async-signal-safe calls are allowed (the caller may be multithreaded).
    let mut argv_ptrs: Vec<*const libc::c_char> = argv.iter().map(|a| a.as_ptr()).collect();
    argv_ptrs.push(std::ptr::null());
    let filter = seccomp_program();
    let prog = libc::sock_fprog {
        len: filter.len() as u16,
        filter: filter.as_ptr() as *mut libc::sock_filter,
    };
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: fds is a valid array of two ints.
    check(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } as libc::c_long)?;
    // SAFETY: fork in a possibly multithreaded process; the child only calls
    // async-signal-safe functions on data prepared above.
    let pid = unsafe { libc::fork() };
    if pid == -1 {
        return Err(io::Error::last_os_error());
    }
    if pid == 0 {
        // SAFETY: child side of fork; raw syscalls only, then exec or _exit.
        unsafe {
            libc::close(fds[0]);
            let mut step: i32 = 1;
            if libc::ptrace(libc::PTRACE_TRACEME, 0, 0, 0) == -1 {
                fail_child(fds[1], step);
            }
            step = 2;
            libc::personality(libc::ADDR_NO_RANDOMIZE as libc::c_ulong);
            if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == -1 {
                fail_child(fds[1], step);
            }
            step = 3;
            if libc::prctl(
                libc::PR_SET_SECCOMP,
                libc::SECCOMP_MODE_FILTER,
                &prog as *const libc::sock_fprog,
            ) == -1
            {
                fail_child(fds[1], step);
            }
            libc::raise(libc::SIGSTOP);
            step = 4;
            extern "C" {
                static environ: *const *const libc::c_char;
            }
            libc::execve(path.as_ptr(), argv_ptrs.as_ptr(), environ);
            fail_child(fds[1], step);
        }
    }
    // SAFETY: closing our copy of the write end.
    unsafe { libc::close(fds[1]) };
    drop(filter);
    Ok(pid_with_pipe(pid, fds[0]))
}

/// Child-side failure: report `(step, errno)` through the pipe and exit.
///
/// # Safety
/// Only called in the forked child.
unsafe fn fail_child(fd: i32, step: i32) -> ! {
    let errno = *libc::__errno_location();
    let buf = [step, errno];
    libc::write(fd, buf.as_ptr() as *const libc::c_void, 8);
    libc::_exit(127);
}

/// Pairs the child pid with the read end of its error pipe (packed so the
/// caller can fetch the error later with [`read_spawn_error`]).
fn pid_with_pipe(pid: i32, fd: i32) -> i32 {
    SPAWN_PIPE.with(|p| p.set(fd));
    pid
}

thread_local! {
    static SPAWN_PIPE: std::cell::Cell<i32> = const { std::cell::Cell::new(-1) };
}

/// After the child ran exec (successfully or not), reads what it reported:
/// `None` when exec succeeded (the pipe closed empty), else `(step, errno)`
/// where step 1 = ptrace, 2 = no_new_privs, 3 = seccomp, 4 = execve.
pub fn read_spawn_error() -> Option<(i32, i32)> {
    let fd = SPAWN_PIPE.with(|p| p.replace(-1));
    if fd < 0 {
        return None;
    }
    let mut buf = [0i32; 2];
    // SAFETY: reading into a local buffer of 8 bytes from our pipe fd.
    let n = unsafe { libc::read(fd, buf.as_mut_ptr() as *mut libc::c_void, 8) };
    // SAFETY: closing our own fd.
    unsafe { libc::close(fd) };
    if n == 8 {
        Some((buf[0], buf[1]))
    } else {
        None
    }
}

/// Reads `buf.len()` bytes at `addr` of process `pid` with one
/// `process_vm_readv` (it pins the pages in batches: several times faster
/// than `/proc/PID/mem` for the megabytes of a trace buffer). Returns the
/// bytes read.
pub fn read_remote(pid: i32, addr: u64, buf: &mut [u8]) -> io::Result<usize> {
    let local = libc::iovec {
        iov_base: buf.as_mut_ptr() as *mut libc::c_void,
        iov_len: buf.len(),
    };
    let remote = libc::iovec {
        iov_base: addr as usize as *mut libc::c_void,
        iov_len: buf.len(),
    };
    // SAFETY: the local iovec covers exactly the live, exclusively borrowed
    // `buf`; the remote one is only interpreted by the kernel.
    let n = unsafe { libc::process_vm_readv(pid, &local, 1, &remote, 1, 0) };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// Writes several buffers into process `pid`'s memory with one
/// `process_vm_writev` (the pages must be writable in the client, which the
/// engine's own regions are). Returns the bytes written.
pub fn write_remote(pid: i32, parts: &[(u64, &[u8])]) -> io::Result<usize> {
    let local: Vec<libc::iovec> = parts
        .iter()
        .map(|(_, b)| libc::iovec {
            iov_base: b.as_ptr() as *mut libc::c_void,
            iov_len: b.len(),
        })
        .collect();
    let remote: Vec<libc::iovec> = parts
        .iter()
        .map(|(a, b)| libc::iovec {
            iov_base: *a as usize as *mut libc::c_void,
            iov_len: b.len(),
        })
        .collect();
    // SAFETY: the local iovecs point into live borrowed slices of the given
    // lengths; the remote ones are only interpreted by the kernel.
    let n = unsafe {
        libc::process_vm_writev(
            pid,
            local.as_ptr(),
            local.len() as libc::c_ulong,
            remote.as_ptr(),
            remote.len() as libc::c_ulong,
            0,
        )
    };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// The faulting address of the signal that stopped `pid` (`si_addr`).
pub fn signal_address(pid: i32) -> io::Result<u64> {
    // SAFETY: siginfo_t is plain old data; all-zero is a valid value.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    ptrace(
        libc::PTRACE_GETSIGINFO,
        pid,
        0,
        &mut info as *mut libc::siginfo_t as usize,
    )?;
    // SAFETY: si_addr is meaningful for the fault signals we ask it for.
    Ok(unsafe { info.si_addr() } as u64)
}

/// A signal's `siginfo_t` as the kernel lays it out on x86-64 (128 bytes),
/// kept as bytes so that it can be passed through a pipe and handed back
/// to `PTRACE_SETSIGINFO` unchanged.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct SigInfo(pub [u8; SIGINFO_BYTES]);

/// Size of `siginfo_t` on x86-64.
pub const SIGINFO_BYTES: usize = 128;
const _: () = assert!(std::mem::size_of::<libc::siginfo_t>() == SIGINFO_BYTES);

impl SigInfo {
    fn i32_at(&self, at: usize) -> i32 {
        i32::from_le_bytes(self.0[at..at + 4].try_into().expect("4 bytes"))
    }

    /// `si_signo`.
    pub fn signo(&self) -> i32 {
        self.i32_at(0)
    }

    /// `si_code` (`SI_USER` for kill, `SI_KERNEL` for a terminal's, ...).
    pub fn code(&self) -> i32 {
        self.i32_at(8)
    }

    /// `si_pid`: the sender, for signals sent by a process (the union's
    /// first field; meaningless for faults).
    pub fn pid(&self) -> i32 {
        self.i32_at(16)
    }

    /// `si_uid`: the sender's real user id (as `pid`).
    pub fn uid(&self) -> i32 {
        self.i32_at(20)
    }

    /// `si_addr`, the faulting address of a fault signal (the union's
    /// first field, like `si_pid`).
    pub fn addr(&self) -> u64 {
        u64::from_le_bytes(self.0[16..24].try_into().expect("8 bytes"))
    }

    /// Sets `si_addr`.
    pub fn set_addr(&mut self, addr: u64) {
        self.0[16..24].copy_from_slice(&addr.to_le_bytes());
    }
}

impl std::fmt::Debug for SigInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "SigInfo(signo {}, code {}, pid {}, uid {})",
            self.signo(),
            self.code(),
            self.pid(),
            self.uid()
        )
    }
}

/// The siginfo of the signal a task is stopped for (signal-delivery stop).
pub fn get_siginfo(pid: i32) -> io::Result<SigInfo> {
    let mut info = SigInfo([0; SIGINFO_BYTES]);
    ptrace(
        libc::PTRACE_GETSIGINFO,
        pid,
        0,
        info.0.as_mut_ptr() as usize,
    )?;
    Ok(info)
}

/// Replaces the siginfo of the signal a task is stopped for: the client
/// then sees `info` (sender and all) when the signal is delivered.
pub fn set_siginfo(pid: i32, info: &SigInfo) -> io::Result<()> {
    ptrace(libc::PTRACE_SETSIGINFO, pid, 0, info.0.as_ptr() as usize).map(drop)
}

// Signal forwarding: signals sent to the tool go on to the client, as if
// they had been sent to it (under Valgrind the tool *is* the client's
// process). The handler only calls async-signal-safe functions: it records
// the original siginfo in a pipe (so the tracer can give the client the
// real sender's) and then re-sends the signal to the client's main
// process with kill(2), at once, so that a tracer blocked in waitpid needs
// no waking.

/// The client's main process, or 0 when there is none to forward to.
static FORWARD_TO: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);
/// Write end of the record pipe (-1 before installation).
static FORWARD_PIPE_W: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(-1);
/// Read end of the record pipe (-1 before installation).
static FORWARD_PIPE_R: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(-1);

extern "C" fn forward_handler(sig: libc::c_int, info: *mut libc::siginfo_t, _: *mut libc::c_void) {
    use std::sync::atomic::Ordering::Relaxed;
    // SAFETY: errno is thread-local; the handler must leave it as it found
    // it for the interrupted code.
    let errno = unsafe { *libc::__errno_location() };
    let pid = FORWARD_TO.load(Relaxed);
    // Never pid 0 (that would signal our whole process group).
    if pid > 0 {
        let fd = FORWARD_PIPE_W.load(Relaxed);
        if fd >= 0 && !info.is_null() {
            // SAFETY: the kernel passes a valid siginfo_t of SIGINFO_BYTES;
            // a write of at most PIPE_BUF bytes to a pipe is atomic, and the
            // non-blocking pipe drops the record rather than block when
            // full (the signal is still forwarded).
            unsafe { libc::write(fd, info as *const libc::c_void, SIGINFO_BYTES) };
        }
        // SAFETY: plain syscall with integer arguments.
        unsafe { libc::kill(pid, sig) };
    }
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = errno };
}

/// Installs the forwarding handler for each of `signals` (blocking all of
/// them while it runs) and returns the dispositions it replaced, for
/// [`restore_signal_actions`].
pub fn install_forwarding(signals: &[i32]) -> io::Result<Vec<(i32, libc::sigaction)>> {
    use std::sync::atomic::Ordering::SeqCst;
    if FORWARD_PIPE_W.load(SeqCst) < 0 {
        let mut fds = [0 as libc::c_int; 2];
        // Close-on-exec keeps the pipe out of the client, which is forked
        // from this process.
        let flags = libc::O_CLOEXEC | libc::O_NONBLOCK;
        // SAFETY: fds is a valid array of two ints.
        let r = unsafe { libc::pipe2(fds.as_mut_ptr(), flags) };
        check(r as libc::c_long)?;
        FORWARD_PIPE_R.store(fds[0], SeqCst);
        FORWARD_PIPE_W.store(fds[1], SeqCst);
    }
    // SAFETY: sigaction is plain old data; all-zero is a valid value.
    let mut act: libc::sigaction = unsafe { std::mem::zeroed() };
    act.sa_sigaction = forward_handler as *const () as usize;
    // SA_RESTART: the tool's own blocking calls (waitpid, writes) go on.
    act.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART;
    // SAFETY: sa_mask is a valid sigset_t to initialise.
    unsafe { libc::sigemptyset(&mut act.sa_mask) };
    for &s in signals {
        // SAFETY: as above; s is a signal number.
        unsafe { libc::sigaddset(&mut act.sa_mask, s) };
    }
    let mut previous = Vec::with_capacity(signals.len());
    for &s in signals {
        // SAFETY: all-zero sigaction is valid.
        let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
        // SAFETY: a null new action only reads the current one into old.
        if unsafe { libc::sigaction(s, std::ptr::null(), &mut old) } == -1 {
            let err = io::Error::last_os_error();
            restore_signal_actions(&previous);
            return Err(err);
        }
        // A signal ignored at startup stays ignored (as shells leave it):
        // the client inherits that, and it reaches neither of us natively.
        if old.sa_sigaction == libc::SIG_IGN {
            continue;
        }
        // SAFETY: act is a valid sigaction structure.
        if unsafe { libc::sigaction(s, &act, std::ptr::null_mut()) } == -1 {
            let err = io::Error::last_os_error();
            restore_signal_actions(&previous);
            return Err(err);
        }
        previous.push((s, old));
    }
    Ok(previous)
}

/// Puts back dispositions saved by [`install_forwarding`].
pub fn restore_signal_actions(previous: &[(i32, libc::sigaction)]) {
    for (s, old) in previous {
        // SAFETY: old is a sigaction the kernel gave us for s.
        unsafe { libc::sigaction(*s, old, std::ptr::null_mut()) };
    }
}

/// Sets the process that forwarded signals go to (0: none).
pub fn set_forward_target(pid: i32) {
    FORWARD_TO.store(pid, std::sync::atomic::Ordering::SeqCst);
}

/// Whether forwarding handlers are installed.
pub fn forwarding_installed() -> bool {
    FORWARD_PIPE_R.load(std::sync::atomic::Ordering::SeqCst) >= 0
}

/// Takes the siginfo records of the signals forwarded since the last call,
/// oldest first.
pub fn take_forwarded() -> Vec<SigInfo> {
    let fd = FORWARD_PIPE_R.load(std::sync::atomic::Ordering::SeqCst);
    let mut out = Vec::new();
    if fd < 0 {
        return out;
    }
    loop {
        let mut info = SigInfo([0; SIGINFO_BYTES]);
        // SAFETY: reading into a local buffer of SIGINFO_BYTES from our
        // non-blocking pipe; records are written whole (atomic writes).
        let n = unsafe { libc::read(fd, info.0.as_mut_ptr() as *mut libc::c_void, SIGINFO_BYTES) };
        if n != SIGINFO_BYTES as isize {
            return out;
        }
        out.push(info);
    }
}

/// A memory file of the client mapped into the tool as well: the tool
/// writes translated code there with plain stores instead of a system
/// call per stop (see `client_mem::ProcMemory::share`).
#[derive(Debug)]
pub struct SharedMap {
    ptr: *mut u8,
    len: usize,
    fd: libc::c_int,
}

impl SharedMap {
    /// Duplicates file descriptor `client_fd` of process `pid` (a tracee:
    /// `pidfd_getfd` needs the tracer's access) into the tool, sizes the
    /// file to `len` bytes and maps it shared.
    pub fn from_client_fd(pid: i32, client_fd: i32, len: usize) -> io::Result<SharedMap> {
        // SAFETY: plain system calls on integers; each result is checked,
        // and every descriptor opened here is closed on the error paths
        // (or owned by the returned value).
        unsafe {
            let pidfd = check(libc::syscall(libc::SYS_pidfd_open, pid, 0))? as libc::c_int;
            let fd = libc::syscall(libc::SYS_pidfd_getfd, pidfd, client_fd, 0);
            let err = io::Error::last_os_error();
            libc::close(pidfd);
            if fd < 0 {
                return Err(err);
            }
            let fd = fd as libc::c_int;
            if libc::ftruncate(fd, len as libc::off_t) != 0 {
                let err = io::Error::last_os_error();
                libc::close(fd);
                return Err(err);
            }
            let ptr = libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            );
            if ptr == libc::MAP_FAILED {
                let err = io::Error::last_os_error();
                libc::close(fd);
                return Err(err);
            }
            Ok(SharedMap {
                ptr: ptr as *mut u8,
                len,
                fd,
            })
        }
    }

    /// Size of the mapping in bytes.
    pub fn size(&self) -> usize {
        self.len
    }

    /// Copies `bytes` to offset `off`.
    ///
    /// # Panics
    /// If the range is outside the mapping.
    pub fn write(&self, off: usize, bytes: &[u8]) {
        assert!(off.checked_add(bytes.len()).is_some_and(|e| e <= self.len));
        // SAFETY: the destination range is inside the live mapping (checked
        // above) and cannot overlap `bytes`, which is tool memory outside
        // it (the tool never hands out references into the mapping).
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.ptr.add(off), bytes.len()) }
    }

    /// Stores the low `size` (4 or 8) bytes of `value` at `off` as one
    /// store, so that client threads running meanwhile see the old or the
    /// new value (`off` must not make the field straddle a cache line).
    ///
    /// # Panics
    /// If the range is outside the mapping or `size` is not 4 or 8.
    pub fn store(&self, off: usize, value: u64, size: u32) {
        assert!(off
            .checked_add(size as usize)
            .is_some_and(|e| e <= self.len));
        let p = self.ptr.wrapping_add(off);
        // SAFETY: inside the live mapping (checked above). One `mov` of 4
        // or 8 bytes, written out so that the compiler cannot split it: x86
        // makes it atomic when it does not cross a cache line (the caller's
        // contract), aligned or not.
        unsafe {
            match size {
                8 => {
                    std::arch::asm!("mov qword ptr [{p}], {v}", p = in(reg) p, v = in(reg) value, options(nostack, preserves_flags))
                }
                4 => {
                    std::arch::asm!("mov dword ptr [{p}], {v:e}", p = in(reg) p, v = in(reg) value, options(nostack, preserves_flags))
                }
                _ => panic!("store of {size} bytes"),
            }
        }
    }

    /// Copies `buf.len()` bytes from offset `off`.
    ///
    /// # Panics
    /// If the range is outside the mapping.
    pub fn read(&self, off: usize, buf: &mut [u8]) {
        assert!(off.checked_add(buf.len()).is_some_and(|e| e <= self.len));
        // SAFETY: the source range is inside the live mapping (checked
        // above); `buf` is exclusively borrowed tool memory outside it.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr.add(off), buf.as_mut_ptr(), buf.len()) }
    }
}

impl Drop for SharedMap {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` are the mapping made in `from_client_fd` and
        // `fd` its descriptor; nothing refers to them after the drop.
        unsafe {
            libc::munmap(self.ptr as *mut libc::c_void, self.len);
            libc::close(self.fd);
        }
    }
}
