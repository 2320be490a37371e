//! Threads and processes: the tracer's record of each, and their lifecycle
//! as ptrace reports it. A new task is set up only once both its creator's
//! clone/fork/vfork event and its own first stop have been seen (in either
//! order), and its creator waits until then; a thread gets its own thread
//! area, a forked child a copy of its parent's bookkeeping. When the last
//! thread of a process exits, the process's counts go to the sink.

use super::inject::Injection;
use super::{get_regs, os_err, set_regs, syscalls, Tracer};
use crate::client_mem::ProcMemory;
use crate::layout;
use crate::space::Space;
use crate::sys;
use crate::EngineError;
use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::rc::Rc;

/// How a task came to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Birth {
    Thread,
    Fork,
    Vfork,
}

/// A traced thread.
pub(super) struct Task {
    pub(super) tgid: i32,
    /// The thread area (GS base) this thread owns.
    pub(super) area: u64,
    /// Spill slots saved when a signal handler was entered, restored at its
    /// rt_sigreturn (the handler's translated code reuses the slots).
    pub(super) sig_spills: Vec<Vec<u8>>,
}

/// A traced process.
pub(super) struct Proc {
    pub(super) space: Rc<RefCell<Space>>,
    pub(super) threads: HashSet<i32>,
    /// A vfork child shares its parent's memory: it reports nothing.
    pub(super) shares_parent: bool,
    /// Signals whose handler the client installed: the kernel has a
    /// code-cache trampoline instead; this is the client's own value.
    pub(super) handlers: HashMap<i32, u64>,
}

impl Tracer<'_> {
    /// Records a new process `pid` in `space`, its only thread using the
    /// thread area `area`.
    pub(super) fn add_process(
        &mut self,
        pid: i32,
        space: Rc<RefCell<Space>>,
        shares_parent: bool,
        handlers: HashMap<i32, u64>,
        area: u64,
    ) {
        self.procs.insert(
            pid,
            Proc {
                space,
                threads: [pid].into_iter().collect(),
                shares_parent,
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
                sig_spills: Vec::new(),
            },
        );
    }

    /// How many threads, of every process, run in `space` (a vfork child
    /// shares its parent's memory, whose other threads keep running).
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
            Birth::Fork | Birth::Vfork => {
                let (space, shares) = if birth == Birth::Fork {
                    // The forking thread (stopped in its fork, between
                    // blocks) hands over its records first: the child's
                    // tool is a copy of the parent's with all of them.
                    pspace.borrow_mut().hand_over_trace(parea);
                    (
                        Rc::new(RefCell::new(
                            pspace
                                .borrow_mut()
                                .fork_copy(Box::new(ProcMemory::open(tid)?))?,
                        )),
                        false,
                    )
                } else {
                    (pspace, true)
                };
                let handlers = self.procs[&ptgid].handlers.clone();
                self.add_process(tid, space, shares, handlers, parea);
            }
        }
        self.resume(tid, 0)?;
        Ok(())
    }

    /// A task is gone for good (reaped).
    pub(super) fn on_vanished(&mut self, tid: i32) -> Result<(), EngineError> {
        self.on_thread_exit(tid);
        self.early.remove(&tid);
        // A new task that died before its first stop: its creator waits.
        if let Some((parent, _)) = self.announced.remove(&tid) {
            self.resume(parent, 0)?;
        }
        Ok(())
    }

    /// A thread exits: its counters join its process's, and the process's
    /// profile is reported if it was the last one.
    pub(super) fn on_thread_exit(&mut self, tid: i32) {
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
            let profile = proc.space.borrow_mut().collect(task.tgid);
            self.sink.process_finished(profile);
        }
        if self.procs.is_empty() {
            // The last process: the tool is about to exit, and freeing the
            // translation tables piece by piece (hundreds of thousands of
            // blocks on a compiler) would only delay that exit.
            std::mem::forget(proc);
        }
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
