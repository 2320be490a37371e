//! The ptrace event loop: launches the client, sets up each address space,
//! answers the exits of translated code (unlinked branches, lookup misses,
//! intercepted syscalls), follows threads, forks and execs, and reports
//! each process's counts when its last thread exits.

use crate::layout::{self, CORE_CANDIDATES, CORE_SIZE};
use crate::space::Space;
use crate::sys::{self, Regs, WaitStatus};
use crate::{EngineError, LaunchConfig, Outcome, ProfileSink};
use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::ffi::{CString, OsStr, OsString};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};
use std::rc::Rc;

const SYS_MMAP: usize = 9;
const SYS_MPROTECT: usize = 10;
const SYS_MUNMAP: usize = 11;
const SYS_MREMAP: usize = 25;
const SYS_RT_SIGACTION: usize = 13;
const SYS_RT_SIGRETURN: usize = 15;
const SYS_EXECVE: usize = 59;
const SYS_EXECVEAT: usize = 322;
const SYS_ARCH_PRCTL: usize = 158;
const SYS_RSEQ: usize = 334;
const ARCH_SET_GS: u64 = 0x1001;

/// How a task came to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Birth {
    Thread,
    Fork,
    Vfork,
}

/// A traced thread.
struct Task {
    tgid: i32,
    /// The thread area (GS base) this thread owns.
    area: u64,
    /// Spill slots saved when a signal handler was entered, restored at its
    /// rt_sigreturn (the handler's translated code reuses the slots).
    sig_spills: Vec<Vec<u8>>,
}

/// A traced process.
struct Proc {
    space: Rc<RefCell<Space>>,
    threads: HashSet<i32>,
    /// A vfork child shares its parent's memory: it reports nothing.
    shares_parent: bool,
    /// Signals whose handler the client installed: the kernel has a
    /// code-cache trampoline instead; this is the client's own value.
    handlers: HashMap<i32, u64>,
}

struct Tracer<'a> {
    cfg: &'a LaunchConfig,
    sink: &'a mut dyn ProfileSink,
    main_pid: i32,
    tasks: HashMap<i32, Task>,
    procs: HashMap<i32, Proc>,
    /// New tasks announced by their creator but not yet stopped.
    announced: HashMap<i32, (i32, Birth)>,
    /// New tasks that stopped before their creator's event arrived.
    early: HashSet<i32>,
    /// Signals that arrived during an injection, re-sent afterwards.
    requeue: Vec<(i32, i32, i32)>,
    outcome: Option<Outcome>,
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
            use std::os::unix::fs::PermissionsExt;
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
    use std::io::Read;
    let shown = path.display();
    let md = std::fs::metadata(path).map_err(|e| {
        EngineError(match e.kind() {
            std::io::ErrorKind::NotFound => format!("cannot run '{shown}': no such file"),
            _ => format!("cannot run '{shown}': {e}"),
        })
    })?;
    use std::os::unix::fs::PermissionsExt;
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
    let machine = u16::from_le_bytes([head[18], head[19]]);
    if head[4] != 2 || machine != 62 {
        return Err(EngineError(format!(
            "cannot run '{shown}': not an x86-64 program (only x86-64 ELF is supported)"
        )));
    }
    Ok(())
}

/// Whether `path` is a 64-bit x86-64 ELF file.
fn is_x86_64_elf(path: &Path) -> bool {
    use std::io::Read;
    let mut head = [0u8; 20];
    std::fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut head))
        .is_ok()
        && &head[..4] == b"\x7fELF"
        && head[4] == 2
        && u16::from_le_bytes([head[18], head[19]]) == 62
}

fn os_err(what: &str, e: std::io::Error) -> EngineError {
    EngineError(format!("{what}: {e}"))
}

/// Runs `nr(args)` in the stopped thread `tid` via the gadget at `gadget`.
/// The thread must be at a stop from which new registers take effect
/// (a seccomp stop, a syscall-exit stop or a signal stop). It is left at
/// the magic stop after the gadget.
fn inject(
    tid: i32,
    gadget: u64,
    base: &Regs,
    nr: u64,
    args: [u64; 6],
    requeue: &mut Vec<(i32, i32)>,
) -> Result<i64, EngineError> {
    let mut r = *base;
    r.rip = gadget;
    r.rax = nr;
    r.orig_rax = u64::MAX;
    r.rdi = args[0];
    r.rsi = args[1];
    r.rdx = args[2];
    r.r10 = args[3];
    r.r8 = args[4];
    r.r9 = args[5];
    if debug_enabled() {
        eprintln!("[engine] inject {nr} {args:x?} via {gadget:#x}");
    }
    let out = run_gadget(tid, &r, requeue)?;
    Ok(out.rdi as i64)
}

/// Runs the stopped thread `tid` with registers `r` until the gadget there
/// makes its MAGIC_INJECT syscall; returns the registers at that stop.
/// Signals that arrive meanwhile are collected in `requeue`.
fn run_gadget(tid: i32, r: &Regs, requeue: &mut Vec<(i32, i32)>) -> Result<Regs, EngineError> {
    sys::set_regs(tid, r).map_err(|e| os_err("cannot set client registers", e))?;
    sys::cont(tid, 0).map_err(|e| os_err("cannot resume the client", e))?;
    loop {
        match sys::wait_pid(tid).map_err(|e| os_err("waitpid", e))? {
            WaitStatus::Event(_, libc::PTRACE_EVENT_SECCOMP) => break,
            WaitStatus::Stopped(_, sig) => {
                requeue.push((tid, sig));
                sys::cont(tid, 0).map_err(|e| os_err("cannot resume the client", e))?;
            }
            WaitStatus::Exited(..) | WaitStatus::Signaled(..) => {
                return Err(EngineError("the client died while being set up".into()))
            }
            _ => {
                sys::cont(tid, 0).map_err(|e| os_err("cannot resume the client", e))?;
            }
        }
    }
    sys::get_regs(tid).map_err(|e| os_err("cannot read client registers", e))
}

/// Applies `patches` (address, value, size) with atomic stores made by the
/// stopped thread `tid` itself, through the patch gadget (see
/// `layout::patch_gadget_bytes`). Its registers are set afterwards by the caller.
fn apply_live_patches(
    tid: i32,
    base: &Regs,
    space: &Space,
    patches: &[(u64, u64, u32)],
    requeue: &mut Vec<(i32, i32)>,
) -> Result<(), EngineError> {
    let list = base.gs_base + layout::AREA_PATCHES;
    for batch in patches.chunks(layout::MAX_PATCHES) {
        let mut bytes = Vec::with_capacity(batch.len() * 24);
        for &(addr, value, size) in batch {
            bytes.extend_from_slice(&addr.to_le_bytes());
            bytes.extend_from_slice(&value.to_le_bytes());
            bytes.extend_from_slice(&u64::from(size).to_le_bytes());
        }
        space.write(list, &bytes)?;
        space.flush()?;
        let mut r = *base;
        r.rip = space.core + layout::PATCH_GADGET;
        r.rdi = list;
        r.rsi = batch.len() as u64;
        r.orig_rax = u64::MAX;
        run_gadget(tid, &r, requeue)?;
    }
    Ok(())
}

/// `CACHESCOPE_ENGINE_DEBUG` set: log every exit to the tool on stderr.
fn debug_enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("CACHESCOPE_ENGINE_DEBUG").is_some())
}

/// Whether thread `tid` has a handler for `sig` (from /proc).
fn has_handler(tid: i32, sig: i32) -> bool {
    let Ok(status) = std::fs::read_to_string(format!("/proc/{tid}/status")) else {
        return false;
    };
    status
        .lines()
        .find_map(|l| l.strip_prefix("SigCgt:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .is_some_and(|mask| sig >= 1 && mask & (1u64 << (sig - 1)) != 0)
}

/// Bytes of spill slots at the start of a thread area.
const SPILL_BYTES: usize = 64;
/// Offset in the thread area of scratch memory for a rewritten sigaction.
const SIGACTION_SCRATCH: u64 = 0x800;

impl<'a> Tracer<'a> {
    fn space_of(&self, tid: i32) -> Option<Rc<RefCell<Space>>> {
        let t = self.tasks.get(&tid)?;
        Some(self.procs.get(&t.tgid)?.space.clone())
    }

    /// Maps the core region into a freshly exec'd process stopped at its
    /// execve syscall-exit, and starts it on translated code.
    fn setup_exec(&mut self, pid: i32) -> Result<(), EngineError> {
        let regs = sys::get_regs(pid).map_err(|e| os_err("cannot read client registers", e))?;
        let mem = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(format!("/proc/{pid}/mem"))
            .map_err(|e| os_err("cannot open the client's memory", e))?;
        use std::os::unix::fs::FileExt;
        let gadget = layout::gadget_bytes();
        let mut saved = vec![0u8; gadget.len()];
        mem.read_exact_at(&mut saved, regs.rip)
            .map_err(|e| os_err("cannot read the client's entry point", e))?;
        mem.write_all_at(&gadget, regs.rip)
            .map_err(|e| os_err("cannot write the client's entry point", e))?;
        let mut requeue = Vec::new();
        let mut core = None;
        let mut base = regs;
        for &cand in &CORE_CANDIDATES {
            const PROT: u64 = (libc::PROT_READ | libc::PROT_WRITE | libc::PROT_EXEC) as u64;
            const FLAGS: u64 =
                (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE) as u64;
            let r = inject(
                pid,
                regs.rip,
                &base,
                libc::SYS_mmap as u64,
                [cand, CORE_SIZE, PROT, FLAGS, u64::MAX, 0],
                &mut requeue,
            )?;
            base = sys::get_regs(pid).map_err(|e| os_err("cannot read client registers", e))?;
            if r as u64 == cand {
                core = Some(cand);
                break;
            }
        }
        mem.write_all_at(&saved, regs.rip)
            .map_err(|e| os_err("cannot restore the client's entry point", e))?;
        let core = core.ok_or_else(|| {
            EngineError("cannot map the engine's core region below 2 GiB in the client".into())
        })?;
        let mut space = Space::new(pid, core)?;
        space.write(core + layout::GADGET, &gadget)?;
        space.write(core + layout::PATCH_GADGET, &layout::patch_gadget_bytes())?;
        let mut systab = vec![0u8; 0x1_0000];
        for nr in [
            SYS_MMAP,
            SYS_MPROTECT,
            SYS_MUNMAP,
            SYS_MREMAP,
            SYS_RT_SIGACTION,
            SYS_RT_SIGRETURN,
            SYS_EXECVE,
            SYS_EXECVEAT,
            SYS_ARCH_PRCTL,
            SYS_RSEQ,
        ] {
            systab[nr] = 1;
        }
        space.write(core + layout::SYSTAB, &systab)?;
        let (area, body) = {
            let gadget_at = core + layout::GADGET;
            let mut inj =
                |nr: u64, args: [u64; 6]| inject(pid, gadget_at, &base, nr, args, &mut requeue);
            let area = space.alloc_area(&mut inj)?;
            (area, space.ensure(regs.rip, &mut inj)?)
        };
        for (tid, sig) in requeue {
            self.requeue.push((pid, tid, sig));
        }
        let mut fin = regs;
        fin.rip = body;
        fin.gs_base = area;
        fin.orig_rax = u64::MAX;
        sys::set_regs(pid, &fin).map_err(|e| os_err("cannot set client registers", e))?;
        self.procs.insert(
            pid,
            Proc {
                space: Rc::new(RefCell::new(space)),
                threads: [pid].into_iter().collect(),
                shares_parent: false,
                handlers: HashMap::new(),
            },
        );
        self.tasks.insert(
            pid,
            Task {
                tgid: pid,
                area,
                sig_spills: Vec::new(),
            },
        );
        Ok(())
    }

    fn resume(&mut self, tid: i32, sig: i32) -> Result<(), EngineError> {
        // Code and links written for this task's address space go out now.
        if let Some(space) = self.space_of(tid) {
            space.borrow().flush()?;
        }
        // A task that vanished (killed by a sibling's exit_group) is fine.
        let _ = sys::cont(tid, sig);
        let requeue = std::mem::take(&mut self.requeue);
        for (tgid, t, s) in requeue {
            sys::tgkill(tgid, t, s);
        }
        Ok(())
    }

    /// A magic-syscall stop of translated code.
    fn on_magic(&mut self, tid: i32) -> Result<(), EngineError> {
        let space = self
            .space_of(tid)
            .ok_or_else(|| EngineError(format!("magic stop from unknown thread {tid}")))?;
        let mut regs = sys::get_regs(tid).map_err(|e| os_err("cannot read client registers", e))?;
        if regs.orig_rax as u32 == layout::MAGIC_SYSCALL {
            let sysno = space
                .borrow()
                .read_u64(regs.gs_base + layout::S_RAX as u64)?;
            if debug_enabled() {
                eprintln!(
                    "[engine] tid {tid} syscall {sysno} at {:#x} rsp {:#x}",
                    regs.rip, regs.rsp
                );
            }
            match sysno as usize {
                SYS_RT_SIGACTION => return self.on_sigaction(tid, regs),
                SYS_RT_SIGRETURN => {
                    // Leaving a handler: the interrupted code's spills come
                    // back, and the sigreturn is issued from the site's
                    // native `syscall` as a syscall of its own.
                    let site = space.borrow().syscall_site(regs.rip).ok_or_else(|| {
                        EngineError(format!("unknown syscall site at {:#x}", regs.rip))
                    })?;
                    if let Some(saved) = self.tasks.get_mut(&tid).and_then(|t| t.sig_spills.pop()) {
                        space.borrow().write(regs.gs_base, &saved)?;
                    }
                    regs.rip = site.stop_rip + 2;
                    regs.rax = sysno;
                    regs.orig_rax = u64::MAX;
                    sys::set_regs(tid, &regs)
                        .map_err(|e| os_err("cannot set client registers", e))?;
                    self.resume(tid, 0)?;
                    return Ok(());
                }
                _ => {}
            }
        }
        let mut sp = space.borrow_mut();
        // Every thread of every process sharing this memory (a vfork child
        // shares its parent's, whose other threads keep running).
        sp.multi = self
            .procs
            .values()
            .filter(|p| Rc::ptr_eq(&p.space, &space))
            .map(|p| p.threads.len())
            .sum::<usize>()
            > 1;
        let slot = regs.gs_base;
        let gadget_at = sp.core + layout::GADGET;
        let base = regs;
        let mut requeue = Vec::new();
        let nr = regs.orig_rax as u32;
        if debug_enabled() {
            eprintln!(
                "[engine] tid {tid} exit {:#x} rip {:#x} target/rax {:#x}",
                nr.wrapping_sub(layout::MAGIC_LINK),
                regs.rip,
                sp.read_u64(slot + layout::S_TARGET as u64).unwrap_or(0)
            );
        }
        let result = (|| -> Result<(), EngineError> {
            let mut inj =
                |nr: u64, args: [u64; 6]| inject(tid, gadget_at, &base, nr, args, &mut requeue);
            match nr {
                layout::MAGIC_LINK => {
                    let target = sp.stub_exit(regs.rip).map(|s| s.target).ok_or_else(|| {
                        EngineError(format!("unknown exit stub at {:#x}", regs.rip))
                    })?;
                    let body = sp.ensure(target, &mut inj)?;
                    regs.rip = body;
                    regs.rax = sp.read_u64(slot + layout::S_RAX as u64)?;
                    regs.rcx = sp.read_u64(slot + layout::S_RCX as u64)?;
                    regs.r11 = sp.read_u64(slot + layout::S_R11 as u64)?;
                    regs.orig_rax = u64::MAX;
                }
                layout::MAGIC_MISS => {
                    let target = sp.read_u64(slot + layout::S_TARGET as u64)?;
                    let body = sp.ensure(target, &mut inj)?;
                    sp.publish(target)?;
                    regs.rip = body;
                    regs.rax = sp.read_u64(slot + layout::S_RAX as u64)?;
                    regs.rcx = sp.read_u64(slot + layout::S_RCX as u64)?;
                    regs.r11 = sp.read_u64(slot + layout::S_R11 as u64)?;
                    regs.orig_rax = u64::MAX;
                }
                layout::MAGIC_SYSCALL => {
                    let site = sp.syscall_site(regs.rip).ok_or_else(|| {
                        EngineError(format!("unknown syscall site at {:#x}", regs.rip))
                    })?;
                    let sysno = sp.read_u64(slot + layout::S_RAX as u64)?;
                    regs.rcx = site.guest_next;
                    match sysno as usize {
                        SYS_RSEQ => {
                            // As under Valgrind: no rseq, glibc falls back.
                            regs.rax = (-libc::ENOSYS) as i64 as u64;
                            regs.orig_rax = u64::MAX;
                        }
                        SYS_ARCH_PRCTL if regs.rdi == ARCH_SET_GS => {
                            return Err(EngineError(
                                "the client sets its GS base (arch_prctl ARCH_SET_GS), which the engine uses; not supported"
                                    .into(),
                            ));
                        }
                        SYS_MMAP | SYS_MPROTECT | SYS_MUNMAP | SYS_MREMAP => {
                            // Code that goes away (dlclose) or may change
                            // loses its translations first.
                            let page = 4095;
                            let start = regs.rdi & !page;
                            let end =
                                regs.rdi.saturating_add(regs.rsi).saturating_add(page) & !page;
                            let drops = match sysno as usize {
                                SYS_MMAP => regs.r10 & libc::MAP_FIXED as u64 != 0,
                                SYS_MPROTECT => {
                                    regs.rdx & libc::PROT_EXEC as u64 == 0
                                        || regs.rdx & libc::PROT_WRITE as u64 != 0
                                }
                                _ => true,
                            };
                            if drops {
                                sp.invalidate(start, end)?;
                            }
                            regs.orig_rax = sysno;
                            regs.rax = sysno;
                        }
                        _ => {
                            // Run it for real, right here.
                            regs.orig_rax = sysno;
                            regs.rax = sysno;
                        }
                    }
                }
                _ => {
                    return Err(EngineError(format!(
                        "unexpected engine syscall {nr:#x} at {:#x}",
                        regs.rip
                    )))
                }
            }
            Ok(())
        })();
        drop(sp);
        result?;
        let patches = space.borrow_mut().take_live_patches();
        if !patches.is_empty() {
            apply_live_patches(tid, &base, &space.borrow(), &patches, &mut requeue)?;
        }
        for (t, s) in requeue {
            let tgid = self.tasks.get(&t).map_or(t, |x| x.tgid);
            self.requeue.push((tgid, t, s));
        }
        sys::set_regs(tid, &regs).map_err(|e| os_err("cannot set client registers", e))?;
        self.resume(tid, 0)?;
        Ok(())
    }

    /// `rt_sigaction(sig, act, oldact)`: a handler is replaced by a
    /// trampoline into its translation; the client always reads back its own
    /// values in `oldact`.
    fn on_sigaction(&mut self, tid: i32, regs: Regs) -> Result<(), EngineError> {
        let space = self.space_of(tid).expect("known task");
        let tgid = self.tasks[&tid].tgid;
        let site = space
            .borrow()
            .syscall_site(regs.rip)
            .ok_or_else(|| EngineError(format!("unknown syscall site at {:#x}", regs.rip)))?;
        let (sig, act, oldact) = (regs.rdi as i32, regs.rsi, regs.rdx);
        let mut change: Option<Option<u64>> = None;
        let mut r = regs;
        let mut requeue = Vec::new();
        if act != 0 {
            let mut sp = space.borrow_mut();
            if let Ok(mut bytes) = sp.read(act, 32) {
                let handler = u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes"));
                if handler > 1 {
                    let gadget_at = sp.core + layout::GADGET;
                    let mut inj = |nr: u64, args: [u64; 6]| {
                        inject(tid, gadget_at, &regs, nr, args, &mut requeue)
                    };
                    let tramp = sp.signal_trampoline(handler, &mut inj)?;
                    bytes[..8].copy_from_slice(&tramp.to_le_bytes());
                    let scratch = regs.gs_base + SIGACTION_SCRATCH;
                    sp.write(scratch, &bytes)?;
                    r.rsi = scratch;
                    change = Some(Some(handler));
                } else {
                    change = Some(None);
                }
            }
        }
        for (t, sg) in requeue {
            self.requeue.push((tgid, t, sg));
        }
        r.orig_rax = SYS_RT_SIGACTION as u64;
        r.rax = SYS_RT_SIGACTION as u64;
        space.borrow().flush()?;
        sys::set_regs(tid, &r).map_err(|e| os_err("cannot set client registers", e))?;
        sys::cont_syscall(tid, 0).map_err(|e| os_err("cannot resume the client", e))?;
        loop {
            match sys::wait_pid(tid).map_err(|e| os_err("waitpid", e))? {
                WaitStatus::Syscall(_) => break,
                WaitStatus::Stopped(_, sg) => {
                    self.requeue.push((tgid, tid, sg));
                    sys::cont_syscall(tid, 0).map_err(|e| os_err("cannot resume the client", e))?;
                }
                WaitStatus::Exited(..) | WaitStatus::Signaled(..) => {
                    self.on_thread_exit(tid);
                    return Ok(());
                }
                WaitStatus::Event(..) => {
                    sys::cont_syscall(tid, 0).map_err(|e| os_err("cannot resume the client", e))?;
                }
            }
        }
        let mut out = sys::get_regs(tid).map_err(|e| os_err("cannot read client registers", e))?;
        if out.rax == 0 {
            let proc = self.procs.get_mut(&tgid).expect("known process");
            if oldact != 0 {
                if let Some(&h) = proc.handlers.get(&sig) {
                    space.borrow().write(oldact, &h.to_le_bytes())?;
                }
            }
            match change {
                Some(Some(h)) => {
                    proc.handlers.insert(sig, h);
                }
                Some(None) => {
                    proc.handlers.remove(&sig);
                }
                None => {}
            }
        }
        out.rsi = regs.rsi;
        out.rcx = site.guest_next;
        sys::set_regs(tid, &out).map_err(|e| os_err("cannot set client registers", e))?;
        self.resume(tid, 0)?;
        Ok(())
    }

    /// A new task is stopped and its creator's event has been seen.
    fn start_task(&mut self, tid: i32, parent: i32, birth: Birth) -> Result<(), EngineError> {
        let Some(ptask) = self.tasks.get(&parent) else {
            self.resume(tid, 0)?;
            return Ok(());
        };
        let ptgid = ptask.tgid;
        let parea = ptask.area;
        let pspace = self.procs[&ptgid].space.clone();
        let tgid = std::fs::read_to_string(format!("/proc/{tid}/status"))
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("Tgid:"))
                    .and_then(|v| v.trim().parse::<i32>().ok())
            })
            .unwrap_or(tid);
        let birth = if tgid == ptgid { Birth::Thread } else { birth };
        match birth {
            Birth::Thread => {
                // The new thread still has its creator's GS base: give it
                // its own area, mapped by a syscall injected into it.
                let base =
                    sys::get_regs(tid).map_err(|e| os_err("cannot read thread registers", e))?;
                let mut requeue = Vec::new();
                let area = {
                    let mut sp = pspace.borrow_mut();
                    let gadget_at = sp.core + layout::GADGET;
                    let mut inj = |nr: u64, args: [u64; 6]| {
                        inject(tid, gadget_at, &base, nr, args, &mut requeue)
                    };
                    sp.alloc_area(&mut inj)?
                };
                for (t, sig) in requeue {
                    self.requeue.push((ptgid, t, sig));
                }
                let mut fin = base;
                fin.gs_base = area;
                fin.orig_rax = u64::MAX;
                sys::set_regs(tid, &fin).map_err(|e| os_err("cannot set thread registers", e))?;
                self.procs
                    .get_mut(&ptgid)
                    .expect("parent proc")
                    .threads
                    .insert(tid);
                self.tasks.insert(
                    tid,
                    Task {
                        tgid: ptgid,
                        area,
                        sig_spills: Vec::new(),
                    },
                );
            }
            Birth::Fork | Birth::Vfork => {
                let (space, shares) = if birth == Birth::Fork {
                    (
                        Rc::new(RefCell::new(pspace.borrow().fork_copy(tid)?)),
                        false,
                    )
                } else {
                    (pspace, true)
                };
                self.procs.insert(
                    tid,
                    Proc {
                        space,
                        threads: [tid].into_iter().collect(),
                        shares_parent: shares,
                        handlers: self.procs[&ptgid].handlers.clone(),
                    },
                );
                self.tasks.insert(
                    tid,
                    Task {
                        tgid: tid,
                        area: parea,
                        sig_spills: Vec::new(),
                    },
                );
            }
        }
        self.resume(tid, 0)?;
        Ok(())
    }

    /// A task is gone for good (reaped).
    fn on_vanished(&mut self, tid: i32) -> Result<(), EngineError> {
        self.on_thread_exit(tid);
        self.early.remove(&tid);
        // A new task that died before its first stop: its creator waits.
        if let Some((parent, _)) = self.announced.remove(&tid) {
            self.resume(parent, 0)?;
        }
        Ok(())
    }

    fn on_thread_exit(&mut self, tid: i32) {
        let Some(task) = self.tasks.remove(&tid) else {
            return;
        };
        let Some(proc) = self.procs.get_mut(&task.tgid) else {
            return;
        };
        proc.threads.remove(&tid);
        if !proc.shares_parent {
            // Its memory is still there at the exit stop.
            proc.space.borrow_mut().thread_exited(task.area);
        }
        if !proc.threads.is_empty() {
            return;
        }
        let proc = self.procs.remove(&task.tgid).expect("present");
        if !proc.shares_parent {
            let profile = proc.space.borrow().collect(task.tgid);
            self.sink.process_finished(profile);
        }
    }

    fn on_exec(&mut self, pid: i32) -> Result<(), EngineError> {
        // The old image is gone (and, as under Valgrind, its counts with it).
        if let Some(old) = self.tasks.get(&pid).map(|t| t.tgid) {
            if let Some(p) = self.procs.remove(&old) {
                for t in p.threads {
                    self.tasks.remove(&t);
                }
            }
        }
        if !self.cfg.trace_children || !is_x86_64_elf(Path::new(&format!("/proc/{pid}/exe"))) {
            // Not followed (or not ours to follow: another architecture's
            // program runs natively, like an unfollowed child).
            let _ = sys::detach(pid, 0);
            return Ok(());
        }
        self.take_over_exec(pid)
    }

    /// Steps a task stopped inside `execve` to the syscall-exit stop (the
    /// new image is mapped only then), sets up its address space and
    /// resumes it in translated code.
    fn take_over_exec(&mut self, pid: i32) -> Result<(), EngineError> {
        sys::cont_syscall(pid, 0).map_err(|e| os_err("cannot resume the client", e))?;
        match sys::wait_pid(pid).map_err(|e| os_err("waitpid", e))? {
            WaitStatus::Syscall(_) => {}
            other => {
                return Err(EngineError(format!(
                    "unexpected stop after exec: {other:?}"
                )))
            }
        }
        self.setup_exec(pid)?;
        self.resume(pid, 0)?;
        Ok(())
    }

    fn on_signal(&mut self, tid: i32, sig: i32) -> Result<(), EngineError> {
        if !self.tasks.contains_key(&tid) {
            if sig == libc::SIGSTOP {
                if let Some((parent, birth)) = self.announced.remove(&tid) {
                    self.start_task(tid, parent, birth)?;
                    self.resume(parent, 0)?;
                    return Ok(());
                }
                self.early.insert(tid);
                return Ok(());
            }
            self.resume(tid, sig)?;
            return Ok(());
        }
        if has_handler(tid, sig) {
            // The kernel runs our trampoline, which enters the translated
            // handler; the handler reuses the thread's spill slots, so keep
            // the interrupted code's until its rt_sigreturn.
            let space = self.space_of(tid).expect("known task");
            let task = self.tasks.get_mut(&tid).expect("known task");
            let saved = space.borrow().read(task.area, SPILL_BYTES)?;
            if task.sig_spills.len() >= 64 {
                // Handlers that longjmp'd out never returned: forget the oldest.
                task.sig_spills.remove(0);
            }
            task.sig_spills.push(saved);
            if debug_enabled() || std::env::var_os("CACHESCOPE_ENGINE_DEBUG_SIGNALS").is_some() {
                let r = sys::get_regs(tid).map_err(|e| os_err("regs", e))?;
                eprintln!(
                    "[engine] deliver {sig} at rip {:#x} (guest block {:x?}) rsp {:#x} addr {:#x} regs {r:x?}",
                    r.rip,
                    space.borrow().guest_block_of(r.rip),
                    r.rsp,
                    sys::signal_address(tid).unwrap_or(0)
                );
                if sig == libc::SIGSEGV {
                    if let Ok(m) = std::fs::read_to_string(format!("/proc/{tid}/maps")) {
                        eprintln!("{m}");
                    }
                }
            }
        }
        // No handler: the default action (or ignoring) happens as natively.
        self.resume(tid, sig)?;
        Ok(())
    }

    fn on_clone_event(&mut self, tid: i32, birth: Birth) -> Result<(), EngineError> {
        let child = sys::event_msg(tid).map_err(|e| os_err("ptrace geteventmsg", e))? as i32;
        // PTRACE_EVENT_CLONE only says the exit signal was not SIGCHLD: a
        // clone without CLONE_VM is a new address space all the same.
        let birth = if birth == Birth::Thread && !self.clone_shares_vm(tid) {
            Birth::Fork
        } else {
            birth
        };
        if self.early.remove(&child) {
            self.start_task(child, tid, birth)?;
            self.resume(tid, 0)?;
        } else {
            // The creator waits until the child has stopped and been set up:
            // a forked child's bookkeeping must be copied before the parent
            // translates more code.
            self.announced.insert(child, (tid, birth));
        }
        Ok(())
    }

    /// Whether the clone/clone3 that `tid` is stopped in passed CLONE_VM.
    fn clone_shares_vm(&self, tid: i32) -> bool {
        const CLONE_VM: u64 = 0x100;
        let Ok(regs) = sys::get_regs(tid) else {
            return true;
        };
        let flags = match regs.orig_rax {
            56 => regs.rdi,
            435 => match self.space_of(tid) {
                Some(sp) => sp.borrow().read_u64(regs.rdi).unwrap_or(CLONE_VM),
                None => CLONE_VM,
            },
            _ => CLONE_VM,
        };
        flags & CLONE_VM != 0
    }

    fn event_loop(&mut self) -> Result<(), EngineError> {
        loop {
            let st = match sys::wait_any() {
                Ok(st) => st,
                Err(e) if e.raw_os_error() == Some(libc::ECHILD) => return Ok(()),
                Err(e) => return Err(os_err("waitpid", e)),
            };
            if debug_enabled() {
                eprintln!("[engine] {st:?}");
            }
            match st {
                WaitStatus::Exited(pid, code) => {
                    self.on_vanished(pid)?;
                    if pid == self.main_pid {
                        self.outcome = Some(Outcome::Exited(code));
                    }
                }
                WaitStatus::Signaled(pid, sig) => {
                    self.on_vanished(pid)?;
                    if pid == self.main_pid {
                        self.outcome = Some(Outcome::Signaled(sig));
                    }
                }
                WaitStatus::Event(pid, ev) => match ev {
                    libc::PTRACE_EVENT_SECCOMP => self.on_magic(pid)?,
                    libc::PTRACE_EVENT_CLONE => self.on_clone_event(pid, Birth::Thread)?,
                    libc::PTRACE_EVENT_FORK => self.on_clone_event(pid, Birth::Fork)?,
                    libc::PTRACE_EVENT_VFORK => self.on_clone_event(pid, Birth::Vfork)?,
                    libc::PTRACE_EVENT_EXEC => self.on_exec(pid)?,
                    libc::PTRACE_EVENT_EXIT => {
                        self.on_thread_exit(pid);
                        self.resume(pid, 0)?;
                    }
                    _ => self.resume(pid, 0)?,
                },
                WaitStatus::Stopped(pid, sig) => self.on_signal(pid, sig)?,
                WaitStatus::Syscall(pid) => self.resume(pid, 0)?,
            }
        }
    }

    fn kill_all(&mut self) {
        for &tgid in self.procs.keys() {
            sys::kill(tgid);
        }
        sys::kill(self.main_pid);
        // Killed tasks still stop once at PTRACE_EVENT_EXIT: let them go.
        while let Ok(st) = sys::wait_any() {
            match st {
                WaitStatus::Exited(p, _) | WaitStatus::Signaled(p, _) => {
                    self.tasks.remove(&p);
                }
                WaitStatus::Event(p, _) | WaitStatus::Stopped(p, _) | WaitStatus::Syscall(p) => {
                    let _ = sys::cont(p, 0);
                }
            }
        }
    }
}

/// Entry point behind [`crate::run`].
pub fn run(cfg: &LaunchConfig, sink: &mut dyn ProfileSink) -> Result<Outcome, EngineError> {
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
    match sys::wait_pid(pid).map_err(|e| os_err("waitpid", e))? {
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
    match sys::wait_pid(pid).map_err(|e| os_err("waitpid", e))? {
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
    let mut tracer = Tracer {
        cfg,
        sink,
        main_pid: pid,
        tasks: HashMap::new(),
        procs: HashMap::new(),
        announced: HashMap::new(),
        early: HashSet::new(),
        requeue: Vec::new(),
        outcome: None,
    };
    let started = tracer.take_over_exec(pid);
    let result = started.and_then(|()| tracer.event_loop());
    if let Err(e) = result {
        tracer.kill_all();
        return Err(e);
    }
    tracer
        .outcome
        .ok_or_else(|| EngineError("lost track of the client's exit status".into()))
}
