//! Threads and processes: the tracer's record of each, and their lifecycle
//! as ptrace reports it. A new task is set up only once both its creator's
//! clone/fork/vfork event and its own first stop have been seen (in either
//! order), and its creator waits until then; a thread gets its own thread
//! area, a forked child a copy of its parent's bookkeeping. When the last
//! thread of a process exits, the process's counts go to the sink.
//!
//! A vfork is made a fork whose parent still waits, as Valgrind makes it
//! (it keeps `CLONE_VFORK` and drops `CLONE_VM`): the child's code then
//! runs in memory of its own, with counts and a profile of its own, and
//! cannot overwrite the parent's code cache and counters. The `vfork`
//! syscall becomes `clone(CLONE_VFORK | SIGCHLD)`; `clone3` asking for
//! `CLONE_VFORK` is refused with ENOSYS (as Valgrind refuses every
//! `clone3`), so that glibc falls back to `clone`.

use super::inject::Injection;
use super::signals::Handler;
use super::{get_regs, os_err, set_regs, syscalls, Tracer};
use crate::client_mem::ProcMemory;
use crate::layout;
use crate::space::Space;
use crate::sys::{self, Regs};
use crate::EngineError;
use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::rc::Rc;

/// How a task came to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Birth {
    Thread,
    /// A new process (vforks included: they are forks here).
    Fork,
}

const CLONE_VM: u64 = 0x100;
const CLONE_VFORK: u64 = 0x4000;
const CLONE_THREAD: u64 = 0x1_0000;

/// A traced thread.
pub(super) struct Task {
    pub(super) tgid: i32,
    /// The thread area (GS base) this thread owns.
    pub(super) area: u64,
    /// Asynchronous signals (with their siginfo) waiting for the thread to
    /// leave contexts mode's runtime (`Tracer::postpone_in_runtime`).
    pub(super) waiting: Vec<(i32, crate::sys::SigInfo)>,
}

/// A traced process.
pub(super) struct Proc {
    pub(super) space: Rc<RefCell<Space>>,
    pub(super) threads: HashSet<i32>,
    /// Signals whose handler the client installed: the kernel has a
    /// code-cache trampoline instead; this is the client's own value.
    pub(super) handlers: HashMap<i32, Handler>,
}

impl Tracer<'_> {
    /// Records a new process `pid` in `space`, its only thread using the
    /// thread area `area`.
    pub(super) fn add_process(
        &mut self,
        pid: i32,
        space: Rc<RefCell<Space>>,
        handlers: HashMap<i32, Handler>,
        area: u64,
    ) {
        self.procs.insert(
            pid,
            Proc {
                space,
                threads: [pid].into_iter().collect(),
                handlers,
            },
        );
        self.add_task(pid, pid, area);
    }

    fn add_task(&mut self, tid: i32, tgid: i32, area: u64) {
        self.tasks.insert(
            tid,
            Task {
                tgid,
                area,
                waiting: Vec::new(),
            },
        );
    }

    /// How many threads, of every process, run in `space`.
    pub(super) fn threads_sharing(&self, space: &Rc<RefCell<Space>>) -> usize {
        self.procs
            .values()
            .filter(|p| Rc::ptr_eq(&p.space, space))
            .map(|p| p.threads.len())
            .sum()
    }

    /// The first stop of a new task (before its creator's event arrived,
    /// or after).
    pub(super) fn on_new_task_stop(&mut self, tid: i32) -> Result<(), EngineError> {
        if let Some((parent, birth)) = self.announced.remove(&tid) {
            self.start_task(tid, parent, birth)?;
            self.resume(parent, 0)?;
            return Ok(());
        }
        self.early.insert(tid);
        Ok(())
    }

    pub(super) fn on_clone_event(&mut self, tid: i32, birth: Birth) -> Result<(), EngineError> {
        let child = sys::event_msg(tid).map_err(|e| os_err("ptrace geteventmsg", e))? as i32;
        // PTRACE_EVENT_CLONE only says the exit signal was not SIGCHLD: a
        // clone without CLONE_VM is a new address space all the same.
        let birth = if birth == Birth::Thread && !self.clone_shares_vm(tid) {
            Birth::Fork
        } else {
            birth
        };
        // A vfork made a fork: the registers it rewrote go back, in the
        // parent now (the syscall has read them) and in the child at its
        // first stop.
        if let Some(args) = self.vfork_args.remove(&tid) {
            restore_args(tid, args)?;
            self.vfork_args.insert(child, args);
        }
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
        let Ok(regs) = sys::get_regs(tid) else {
            return true;
        };
        let flags = match regs.orig_rax as usize {
            syscalls::CLONE => regs.rdi,
            syscalls::CLONE3 => match self.space_of(tid) {
                Some(sp) => sp.borrow_mut().mem().read_u64(regs.rdi).unwrap_or(CLONE_VM),
                None => CLONE_VM,
            },
            _ => CLONE_VM,
        };
        flags & CLONE_VM != 0
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
                // Trace mode: the creator's records so far go to the tool
                // before any of the new thread's can (a call-graph tool
                // numbers threads in the order it first sees them).
                pspace.borrow_mut().hand_over_trace(parea);
                // The new thread still has its creator's GS base: give it
                // its own area, mapped by a syscall injected into it.
                let base = get_regs(tid)?;
                let mut sp = pspace.borrow_mut();
                let mut inj = Injection::new(tid, sp.core + layout::GADGET, base);
                let area = sp.alloc_area(&mut inj.injector())?;
                drop(sp);
                self.requeue_signals(ptgid, inj);
                let mut fin = base;
                fin.gs_base = area;
                fin.orig_rax = u64::MAX;
                set_regs(tid, &fin)?;
                self.procs
                    .get_mut(&ptgid)
                    .expect("parent proc")
                    .threads
                    .insert(tid);
                self.add_task(tid, ptgid, area);
            }
            Birth::Fork => {
                // The forking thread (stopped in its fork, between blocks)
                // hands over its records first: the child's tool is a copy
                // of the parent's with all of them.
                pspace.borrow_mut().hand_over_trace(parea);
                let mut space = pspace
                    .borrow_mut()
                    .fork_copy(Box::new(ProcMemory::open(tid)?))?;
                if space.is_tracing() {
                    // Its trace buffers, before it writes any.
                    let base = get_regs(tid)?;
                    let mut inj = Injection::new(tid, space.core + layout::GADGET, base);
                    space.child_buffers(parea, &mut inj.injector())?;
                    self.requeue_signals(tid, inj);
                    // (As for a new thread: resumed from this stop, the
                    // child must not run its fork again as a restart.)
                    let mut fin = base;
                    fin.orig_rax = u64::MAX;
                    set_regs(tid, &fin)?;
                }
                let handlers = self.procs[&ptgid].handlers.clone();
                self.add_process(tid, Rc::new(RefCell::new(space)), handlers, parea);
                if let Some(args) = self.vfork_args.remove(&tid) {
                    restore_args(tid, args)?;
                }
            }
        }
        self.resume(tid, 0)?;
        Ok(())
    }

    /// A task is gone for good (reaped).
    pub(super) fn on_vanished(&mut self, tid: i32) -> Result<(), EngineError> {
        self.on_thread_exit(tid);
        self.early.remove(&tid);
        self.vfork_args.remove(&tid);
        // A new task that died before its first stop: its creator waits.
        if let Some((parent, _)) = self.announced.remove(&tid) {
            self.resume(parent, 0)?;
        }
        Ok(())
    }

    /// A thread exits: its counters join its process's, and the process's
    /// profile is reported if it was the last one.
    pub(super) fn on_thread_exit(&mut self, tid: i32) {
        self.native_calls.remove(&tid);
        self.resent.retain(|&(t, ..)| t != tid);
        let Some(task) = self.tasks.remove(&tid) else {
            return;
        };
        let Some(proc) = self.procs.get_mut(&task.tgid) else {
            return;
        };
        proc.threads.remove(&tid);
        // Its memory is still there at the exit stop.
        proc.space.borrow_mut().thread_exited(task.area);
        if !proc.threads.is_empty() {
            return;
        }
        let proc = self.procs.remove(&task.tgid).expect("present");
        // Unless another process shares the address space (a clone with
        // CLONE_VM but not CLONE_THREAD), nothing runs its code again.
        let last = std::rc::Rc::strong_count(&proc.space) == 1;
        let profile = proc.space.borrow_mut().collect(task.tgid, last);
        if last {
            proc.space.borrow_mut().discard_shared();
        }
        self.sink.process_finished(profile);
        if self.procs.is_empty() {
            // The last process: the tool is about to exit, and freeing the
            // translation tables piece by piece (hundreds of thousands of
            // blocks on a compiler) would only delay that exit.
            std::mem::forget(proc);
        }
    }

    /// A guest `vfork`, `clone` or `clone3` (syscall `sysno`) from
    /// translated code stopped with `regs`: a vfork becomes a fork whose
    /// parent waits (see the module's doc); anything else runs as it is.
    pub(super) fn on_fork_syscall(
        &mut self,
        tid: i32,
        mut regs: Regs,
        sysno: u64,
    ) -> Result<(), EngineError> {
        let (space, site) = self.syscall_stop(tid, regs.rip)?;
        regs.rcx = site.guest_next;
        let mut run = sysno;
        match sysno as usize {
            syscalls::VFORK => {
                self.vfork_args.insert(tid, (regs.rdi, regs.rsi));
                run = syscalls::CLONE as u64;
                regs.rdi = CLONE_VFORK | libc::SIGCHLD as u64;
                // The child goes on on the same stack, in its own copy.
                regs.rsi = 0;
            }
            syscalls::CLONE if is_vfork(regs.rdi) => {
                self.vfork_args.insert(tid, (regs.rdi, regs.rsi));
                regs.rdi &= !CLONE_VM;
            }
            syscalls::CLONE3 => {
                // `struct clone_args` starts with the flags.
                let flags = space.borrow_mut().mem().read_u64(regs.rdi).unwrap_or(0);
                if is_vfork(flags) {
                    regs.rax = (-libc::ENOSYS) as i64 as u64;
                    regs.orig_rax = u64::MAX;
                    set_regs(tid, &regs)?;
                    return self.resume(tid, 0);
                }
            }
            _ => {}
        }
        // Run it for real, right here. (Should it fail, no child comes to
        // take the rewritten RDI and RSI back: the vfork family's callers
        // are functions, for which both are scratch registers.)
        regs.orig_rax = run;
        regs.rax = run;
        set_regs(tid, &regs)?;
        self.resume(tid, 0)
    }

    /// At `PTRACE_EVENT_EXEC` of `pid` (with `--trace-children=yes`):
    /// whether the caller declines to follow this program
    /// ([`crate::ProfileSink::follow_exec`], Valgrind's
    /// `--trace-children-skip`).
    pub(super) fn skips_exec(&mut self, pid: i32) -> bool {
        if !self.tasks.contains_key(&pid) {
            return false;
        }
        let argv: Vec<String> = std::fs::read(format!("/proc/{pid}/cmdline"))
            .map(|raw| {
                let raw = raw.strip_suffix(b"\0").unwrap_or(&raw).to_vec();
                raw.split(|&b| b == 0)
                    .map(|w| String::from_utf8_lossy(w).into_owned())
                    .collect()
            })
            .unwrap_or_default();
        let exe = exec_file_name(pid)
            .or_else(|| argv.first().cloned())
            .unwrap_or_default();
        !self.sink.follow_exec(&exe, &argv)
    }
}

/// Whether clone flags `flags` ask for a vfork: the parent waits while the
/// child runs in its memory.
fn is_vfork(flags: u64) -> bool {
    flags & (CLONE_VFORK | CLONE_VM) == CLONE_VFORK | CLONE_VM && flags & CLONE_THREAD == 0
}

/// Puts back the RDI and RSI a vfork had before it was rewritten, in `tid`
/// (the parent after its fork event, or the child at its first stop).
fn restore_args(tid: i32, (rdi, rsi): (u64, u64)) -> Result<(), EngineError> {
    let mut regs = get_regs(tid)?;
    regs.rdi = rdi;
    regs.rsi = rsi;
    set_regs(tid, &regs)
}

/// The file name a process stopped at `PTRACE_EVENT_EXEC` gave `execve`,
/// as given (a script's, not its interpreter's): the kernel leaves it on
/// the new stack and points the `AT_EXECFN` auxiliary vector entry at it.
fn exec_file_name(pid: i32) -> Option<String> {
    use std::os::unix::fs::FileExt;
    const AT_EXECFN: u64 = 31;
    let auxv = std::fs::read(format!("/proc/{pid}/auxv")).ok()?;
    let addr = auxv.chunks_exact(16).find_map(|e| {
        let key = u64::from_le_bytes(e[..8].try_into().expect("8 bytes"));
        (key == AT_EXECFN).then(|| u64::from_le_bytes(e[8..].try_into().expect("8 bytes")))
    })?;
    let mem = std::fs::File::open(format!("/proc/{pid}/mem")).ok()?;
    let mut buf = vec![0u8; 4096];
    let n = mem.read_at(&mut buf, addr).ok()?;
    let name = buf[..n].split(|&b| b == 0).next()?;
    Some(String::from_utf8_lossy(name).into_owned())
}
