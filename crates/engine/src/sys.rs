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
    /// A ptrace event stop (`PTRACE_EVENT_*` other than `PTRACE_EVENT_STOP`).
    Event(i32, i32),
    /// A `PTRACE_EVENT_STOP` of a seized task, with its signal: a new
    /// task's first stop, a group-stop (the stopping signal), or the end of
    /// one (`SIGTRAP`).
    EventStop(i32, i32),
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

/// One `waitpid(pid, flags)`, retried on EINTR: the report, or `None`
/// when `WNOHANG` found none.
fn waitpid(pid: i32, flags: i32) -> io::Result<Option<WaitStatus>> {
    loop {
        let mut status: libc::c_int = 0;
        // SAFETY: plain syscall; `status` is a valid out pointer.
        let r = unsafe { libc::waitpid(pid, &mut status, flags) };
        match r {
            -1 => {
                let err = io::Error::last_os_error();
                if err.kind() != io::ErrorKind::Interrupted {
                    return Err(err);
                }
            }
            0 => return Ok(None),
            r => return Ok(Some(decode_status(r, status))),
        }
    }
}

/// Waits for `pid` (-1: any traced task, `__WALL`).
///
/// Polling for a while before sleeping was tried (a stop is reported
/// 13-17 us sooner than to a tracer asleep on an idle virtual processor,
/// 50 us): once a signal cost one stop it no longer paid (gcc 5% slower,
/// xz with two threads 10% faster, signal-heavy programs the same), and a
/// processor spent polling is one the client's threads do not have.
fn wait_blocking(pid: i32) -> io::Result<WaitStatus> {
    loop {
        if let Some(status) = waitpid(pid, libc::__WALL)? {
            return Ok(status);
        }
    }
}

/// Waits for any traced task (`__WALL`), retrying on EINTR.
pub fn wait_any() -> io::Result<WaitStatus> {
    wait_blocking(-1)
}

/// A report of any traced task if one is there (`WNOHANG`).
pub fn poll_any() -> io::Result<Option<WaitStatus>> {
    waitpid(-1, libc::__WALL | libc::WNOHANG)
}

/// Waits for one particular task, or finds it dead without a report to
/// come: a thread-group leader that died while its other threads live is a
/// zombie that `waitpid` reports only once they are gone, and those may be
/// waiting for the tracer. Polls (`WNOHANG`, sleeping a little longer each
/// time), looking at `/proc/PID/stat` once a millisecond has gone by.
pub fn wait_pid_or_gone(pid: i32) -> io::Result<Option<WaitStatus>> {
    let started = std::time::Instant::now();
    let mut nap = std::time::Duration::from_micros(5);
    loop {
        if let Some(status) = waitpid(pid, libc::__WALL | libc::WNOHANG)? {
            return Ok(Some(status));
        }
        if started.elapsed() > std::time::Duration::from_millis(1) && gone(pid) {
            return Ok(None);
        }
        std::thread::sleep(nap);
        nap = (nap * 2).min(std::time::Duration::from_millis(2));
    }
}

/// Whether task `pid` is a zombie or no more.
fn gone(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |stat| {
        stat.rfind(')')
            .and_then(|i| {
                stat[i + 1..]
                    .split_whitespace()
                    .next()
                    .map(|s| s == "Z" || s == "X")
            })
            .unwrap_or(true)
    })
}

/// Waits for one particular task.
pub fn wait_pid(pid: i32) -> io::Result<WaitStatus> {
    wait_blocking(pid)
}

fn decode_status(pid: i32, status: i32) -> WaitStatus {
    if libc::WIFEXITED(status) {
        WaitStatus::Exited(pid, libc::WEXITSTATUS(status))
    } else if libc::WIFSIGNALED(status) {
        WaitStatus::Signaled(pid, libc::WTERMSIG(status))
    } else {
        let sig = libc::WSTOPSIG(status);
        let event = (status >> 16) & 0xff;
        if event == libc::PTRACE_EVENT_STOP {
            WaitStatus::EventStop(pid, sig)
        } else if event != 0 {
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

/// Resumes a stopped task, delivering `sig` (0 for none).
pub fn cont(pid: i32, sig: i32) -> io::Result<()> {
    ptrace(libc::PTRACE_CONT, pid, 0, sig as usize).map(drop)
}

/// Runs a stopped task for one instruction, delivering `sig` (0 for
/// none); it stops again with SIGTRAP.
pub fn single_step(pid: i32, sig: i32) -> io::Result<()> {
    ptrace(libc::PTRACE_SINGLESTEP, pid, 0, sig as usize).map(drop)
}

/// Sets debug register `n` of a stopped task: 0-3 an address to break
/// at, 6 the status, 7 the control word (the kernel checks what it is
/// given, and fails where the processor has none to give).
pub fn set_debug_reg(pid: i32, n: usize, value: u64) -> io::Result<()> {
    let offset = std::mem::offset_of!(libc::user, u_debugreg) + 8 * n;
    ptrace(libc::PTRACE_POKEUSER, pid, offset, value as usize).map(drop)
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

/// Sends `sig` to thread `tid` of process `tgid` again, with `info`, the
/// siginfo it first came with, where the kernel lets another process
/// send that kind (negative codes but `SI_TKILL`: a POSIX timer's, with
/// its `sigev_value`, or `sigqueue`'s); else (a `kill`, a `tgkill`, the
/// kernel's) as `tgkill` does. Returns whether it went with `info`; if
/// not, it arrives as this process's `tgkill` (`SI_TKILL`, our pid).
pub fn resend_signal(tgid: i32, tid: i32, sig: i32, info: Option<&SigInfo>) -> bool {
    if let Some(info) = info.filter(|i| i.code() < 0 && i.code() != libc::SI_TKILL) {
        // SAFETY: `info` is a whole siginfo_t (128 bytes) the kernel only
        // reads.
        let sent =
            unsafe { libc::syscall(libc::SYS_rt_tgsigqueueinfo, tgid, tid, sig, info.0.as_ptr()) };
        if sent == 0 {
            return true;
        }
    }
    tgkill(tgid, tid, sig);
    false
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

/// Which process [`fork_detached`] returned in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Forked {
    /// The calling process.
    Original,
    /// The new process: a grandchild of the caller whose parent has
    /// exited (so it is nobody's child that the caller could wait for),
    /// in a session of its own (so no terminal or process-group signal
    /// meant for the caller reaches it).
    Detached,
}

/// Forks a detached process, as `strace -D` detaches its tracer: the
/// caller forks a child that forks again and exits at once; the caller
/// reaps that child. The caller must be single-threaded (the new process
/// goes on running ordinary Rust code).
pub fn fork_detached() -> io::Result<Forked> {
    // SAFETY: fork in a single-threaded process (the caller's contract);
    // the intermediate child only calls fork, setsid and _exit.
    let child = unsafe { libc::fork() };
    if child == -1 {
        return Err(io::Error::last_os_error());
    }
    if child == 0 {
        // SAFETY: as above; the intermediate child never returns.
        unsafe {
            match libc::fork() {
                -1 => libc::_exit(*libc::__errno_location()),
                0 => {
                    libc::setsid();
                    return Ok(Forked::Detached);
                }
                _ => libc::_exit(0),
            }
        }
    }
    let mut status: libc::c_int = 0;
    // SAFETY: plain syscall on our own child; `status` is a valid out
    // pointer. Retried on EINTR.
    while unsafe { libc::waitpid(child, &mut status, 0) } == -1 {
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
    match libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status)) {
        Some(0) => Ok(Forked::Original),
        Some(errno) => Err(io::Error::from_raw_os_error(errno)),
        None => Err(io::Error::other("the intermediate process was killed")),
    }
}

/// Makes the allocator give every block of 256 KiB or more a mapping of
/// its own, for good: glibc raises that threshold (up to 32 MiB) each time
/// such a block is freed, after which the tracer's growing tables (a
/// vector per block id, doubled as blocks are translated) are copied
/// within the heap and their old copies stay resident, a fifth of a
/// python run's tracer.
pub fn map_large_allocations() {
    // SAFETY: mallopt only sets a parameter of the allocator; called once,
    // before the tracer starts its threads.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 256 << 10);
    }
}

/// This process's pid.
pub fn getpid() -> i32 {
    // SAFETY: plain syscall without arguments.
    unsafe { libc::getpid() }
}

/// Ends this process at once, without running destructors or `atexit`
/// handlers (for the detached tracer when there is nothing left to do).
pub fn exit_now(code: i32) -> ! {
    // SAFETY: _exit never returns and touches no Rust state.
    unsafe { libc::_exit(code) }
}

/// Lets process `tracer` ptrace this one where Yama's `ptrace_scope` 1
/// allows ptrace of descendants only (a detached tracer is a descendant of
/// its tracee). Without Yama the call fails harmlessly.
pub fn allow_tracer(tracer: i32) {
    // SAFETY: plain syscall with integer arguments.
    unsafe { libc::prctl(libc::PR_SET_PTRACER, tracer as libc::c_ulong, 0, 0, 0) };
}

/// Attaches to `pid` with `PTRACE_SEIZE` (no stop) and sets `options`.
pub fn seize(pid: i32, options: i32) -> io::Result<()> {
    ptrace(libc::PTRACE_SEIZE, pid, 0, options as usize).map(drop)
}

/// Keeps a task that reported a group-stop stopped, as it would be
/// natively, until a `SIGCONT` (`PTRACE_LISTEN`; seized tasks only).
pub fn listen(pid: i32) -> io::Result<()> {
    ptrace(libc::PTRACE_LISTEN, pid, 0, 0).map(drop)
}

/// In the detached tracer: standard input and output become `/dev/null`
/// and every other descriptor inherited from the caller (those without
/// close-on-exec: the descriptors the tool opens itself have it) is
/// closed, so that the client's readers and writers see end-of-file when
/// the client closes its own copies, not when the tracer exits. Standard
/// error stays: the tool's messages go there.
pub fn release_inherited_fds() {
    let fds: Vec<i32> = std::fs::read_dir("/proc/self/fd")
        .map(|dir| {
            dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    for fd in fds {
        if fd == libc::STDERR_FILENO || fd == libc::STDIN_FILENO || fd == libc::STDOUT_FILENO {
            continue;
        }
        // SAFETY: plain syscalls on integer descriptors; one that is
        // close-on-exec (or already gone: the directory's own) is left.
        unsafe {
            let flags = libc::fcntl(fd, libc::F_GETFD);
            if flags != -1 && flags & libc::FD_CLOEXEC == 0 {
                libc::close(fd);
            }
        }
    }
    // SAFETY: a NUL-terminated path literal; dup2 over our own standard
    // descriptors, then the temporary one closed.
    unsafe {
        let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC);
        if null >= 0 {
            libc::dup2(null, libc::STDIN_FILENO);
            libc::dup2(null, libc::STDOUT_FILENO);
            libc::close(null);
        }
    }
}

/// What [`prepare_client`] was doing when it failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientStep {
    /// `PR_SET_NO_NEW_PRIVS` (required by the seccomp filter).
    NoNewPrivs,
    /// Installing the seccomp filter.
    Seccomp,
}

/// Makes the calling process ready to exec the client under the engine:
/// no address randomisation (the engine's regions go at fixed addresses),
/// no new privileges, the seccomp filter that sends the engine's magic
/// syscall numbers (and only those, so that a detached exec'd program is
/// unaffected) to the tracer, and `SIGPIPE` back to its default (the Rust
/// runtime ignores it, and an ignored signal stays ignored across exec).
pub fn prepare_client() -> Result<(), (ClientStep, io::Error)> {
    let filter = seccomp_program();
    let prog = libc::sock_fprog {
        len: filter.len() as u16,
        filter: filter.as_ptr() as *mut libc::sock_filter,
    };
    // SAFETY: plain syscalls; `prog` points to `filter`, alive until after
    // the prctl that copies it.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        libc::personality(libc::ADDR_NO_RANDOMIZE as libc::c_ulong);
        if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == -1 {
            return Err((ClientStep::NoNewPrivs, io::Error::last_os_error()));
        }
        if libc::prctl(
            libc::PR_SET_SECCOMP,
            libc::SECCOMP_MODE_FILTER,
            &prog as *const libc::sock_fprog,
        ) == -1
        {
            return Err((ClientStep::Seccomp, io::Error::last_os_error()));
        }
    }
    Ok(())
}

/// Replaces this process's image with `path` run with `argv` and the
/// current environment; returns only on failure, with the reason.
pub fn exec(path: &CString, argv: &[CString]) -> io::Error {
    let mut argv_ptrs: Vec<*const libc::c_char> = argv.iter().map(|a| a.as_ptr()).collect();
    argv_ptrs.push(std::ptr::null());
    extern "C" {
        static environ: *const *const libc::c_char;
    }
    // SAFETY: `path` and every `argv` string are NUL-terminated and alive,
    // `argv_ptrs` is NULL-terminated; `environ` is the C library's own
    // (the process is single-threaded, so nothing changes it meanwhile).
    unsafe { libc::execve(path.as_ptr(), argv_ptrs.as_ptr(), environ) };
    io::Error::last_os_error()
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
/// kept as bytes so that it can be handed back to `PTRACE_SETSIGINFO`
/// unchanged.
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

/// The signals a tracee blocks (`PTRACE_GETSIGMASK`), bit `n - 1` for
/// signal `n`.
pub fn get_sigmask(pid: i32) -> io::Result<u64> {
    let mut mask: u64 = 0;
    ptrace(
        libc::PTRACE_GETSIGMASK,
        pid,
        std::mem::size_of::<u64>(),
        &mut mask as *mut u64 as usize,
    )?;
    Ok(mask)
}

/// Sets the signals a tracee blocks (`PTRACE_SETSIGMASK`).
pub fn set_sigmask(pid: i32, mask: u64) -> io::Result<()> {
    ptrace(
        libc::PTRACE_SETSIGMASK,
        pid,
        std::mem::size_of::<u64>(),
        &mask as *const u64 as usize,
    )
    .map(drop)
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

// SAFETY: a `SharedMap` is a mapping of a memory file that the client
// process writes too, so the compiler can assume nothing about its bytes
// whichever thread of the tool touches them; every access goes through the
// methods below, which check their ranges. The tool's threads never write
// and read the same range at once: the tracer writes a trace buffer's words
// only while the consumer holds no view of them (`space::trace`).
unsafe impl Send for SharedMap {}
// SAFETY: as for `Send` above.
unsafe impl Sync for SharedMap {}

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

    /// Drops the tool's pages of the page-aligned range `off..off + len`
    /// (the memory file keeps its bytes; a later access maps them again):
    /// code written once costs no tool memory on top of the client's.
    pub fn release(&self, off: usize, len: usize) {
        const PAGE: usize = 4096;
        let start = off.next_multiple_of(PAGE);
        let end = (off + len).min(self.len) / PAGE * PAGE;
        if start >= end {
            return;
        }
        // SAFETY: the range is inside the live mapping (clamped above) and
        // page-aligned; MADV_DONTNEED on a shared file mapping only unmaps
        // pages from this process, and no reference into the mapping is
        // ever handed out, so nothing can observe the pages going.
        unsafe {
            libc::madvise(
                self.ptr.add(start) as *mut libc::c_void,
                end - start,
                libc::MADV_DONTNEED,
            );
        }
    }

    /// Empties the memory file (a hole punched over all of it): its pages
    /// are freed in every process that maps it shared, and in the
    /// client's private mappings wherever it has no copy of its own. For a
    /// process that has exited: its code and trace buffers are no longer
    /// needed, and the tool's profile building that follows would
    /// otherwise add its own peak to the client's whole memory.
    pub fn discard(&self) {
        // SAFETY: a plain system call on the descriptor this value owns;
        // no reference into the mapping is ever handed out, so nothing
        // observes the bytes becoming zeros. A failure leaves the bytes as
        // they were, which is only memory not freed.
        unsafe {
            libc::fallocate(
                self.fd,
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                0,
                self.len as libc::off_t,
            );
        }
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

    /// The `n` little-endian 64-bit words from offset `off` (a multiple
    /// of 8), without a copy: a trace buffer's records, which the consumer
    /// decodes in place.
    ///
    /// # Panics
    /// If the range is outside the mapping or `off` is not 8-aligned.
    pub fn words(&self, off: usize, n: usize) -> &[u64] {
        self.slice(off, n)
    }

    /// The `n` little-endian 32-bit words from offset `off` (a multiple
    /// of 4), without a copy: a trace buffer's branch words.
    ///
    /// # Panics
    /// If the range is outside the mapping or `off` is not 4-aligned.
    pub fn halves(&self, off: usize, n: usize) -> &[u32] {
        self.slice(off, n)
    }

    /// `n` values of `T` from offset `off` (a multiple of their size).
    fn slice<T: bytemuck::Pod>(&self, off: usize, n: usize) -> &[T] {
        let size = std::mem::size_of::<T>();
        assert!(
            off.is_multiple_of(size),
            "words at the unaligned offset {off}"
        );
        assert!(n
            .checked_mul(size)
            .and_then(|b| b.checked_add(off))
            .is_some_and(|e| e <= self.len));
        // SAFETY: the range is inside the live mapping (checked above),
        // which lives as long as `self`; the mapping is page-aligned and
        // `off` a multiple of the values' size (a power of two), so they
        // are aligned, and any bits are a value of `T` (`Pod`). Nothing
        // writes them while the slice lives: the client writes a trace
        // buffer only after the tracer hands it back, which waits until the
        // consumer has dropped its view (`space::trace::Gate`), and the
        // tracer's own writes (markers, a moved open record) go past the
        // viewed words. (Client code never addresses its thread area, the
        // engine's GS-relative memory; a wild store into it would wreck the
        // spill slots as well, and is outside what the engine runs.)
        unsafe { std::slice::from_raw_parts(self.ptr.add(off) as *const T, n) }
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

/// Runs the calling-context runtime's blob in this process (the tests'
/// check that the bytes the client maps do what `ctxrt` does): the image
/// mapped executable at an address of the kernel's choice, relocated
/// there by `relocate`, then `cs_runtime(args)` called at `entry`.
#[cfg(test)]
pub fn call_blob(relocate: impl Fn(u64) -> Vec<u8>, entry: u64, args: [u64; 5]) -> u64 {
    let len = relocate(0).len().next_multiple_of(4096);
    // SAFETY: a fresh private anonymous mapping, written before it is made
    // executable; the call follows the blob's System V signature, whose
    // pointer arguments the caller made valid (its own buffers), and the
    // mapping is removed after.
    unsafe {
        let p = libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        assert_ne!(p, libc::MAP_FAILED);
        let image = relocate(p as u64);
        std::ptr::copy_nonoverlapping(image.as_ptr(), p.cast::<u8>(), image.len());
        assert_eq!(libc::mprotect(p, len, libc::PROT_READ | libc::PROT_EXEC), 0);
        let f: unsafe extern "sysv64" fn(u64, u64, u64, u64, u64) -> u64 =
            std::mem::transmute(p.cast::<u8>().add(entry as usize));
        let r = f(args[0], args[1], args[2], args[3], args[4]);
        libc::munmap(p, len);
        r
    }
}
