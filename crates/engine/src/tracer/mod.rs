//! The ptrace event loop: launches the client, sets up each address space,
//! answers the exits of translated code (unlinked branches, lookup misses,
//! intercepted syscalls), follows threads, forks and execs, and reports
//! each process's counts when its last thread exits.
//!
//! This module holds the tracer's state and the loop that dispatches each
//! `waitpid` report; every kind of stop is handled in a module of its own:
//!
//! * `launch`: finding and checking the program, the process model (the
//!   caller becomes the client, a detached process the tracer) up to the
//!   client's exec;
//! * `exec`: taking over a freshly exec'd image (core region, thread area,
//!   entry block), or letting it go;
//! * `exits`: the magic-syscall stops of translated code;
//! * `requests`: client requests (Valgrind's magic sequence);
//! * `signals`: signal delivery and the emulated rt_sigaction and
//!   rt_sigreturn;
//! * `tasks`: threads and processes as they are created and go away;
//! * `inject`: running syscalls and atomic patches in a stopped thread, the
//!   tool's only way to act inside the client;
//! * `syscalls`: the client's syscall numbers the tracer acts on.

mod exec;
mod exits;
mod inject;
mod launch;
mod requests;
mod signals;
mod syscalls;
mod tasks;

use crate::space::Space;
use crate::stream::Consumer;
use crate::sys::{self, Regs, WaitStatus};
use crate::translate::SyscallSite;
use crate::{EngineError, LaunchConfig, Outcome, ProfileSink};
pub use launch::{find_program, ProgramError, Unrunnable};
use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::rc::Rc;
use tasks::{Birth, Proc, Task};

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
    /// RDI and RSI of a vfork rewritten into a fork, by the task (parent,
    /// then child) that gets them back at its next stop.
    vfork_args: HashMap<i32, (u64, u64)>,
    /// Signals taken from a thread meanwhile (during an injection, a
    /// step), re-sent at the next resume as (tgid, tid, signal, the
    /// siginfo they came with).
    requeue: Vec<(i32, i32, i32, Option<sys::SigInfo>)>,
    /// Signals re-sent as our own `tgkill` (the kernel lets no process
    /// forge another's `kill`, `tgkill` or kernel siginfo), oldest first,
    /// as (tid, signal, the siginfo they first came with): given back at
    /// their delivery stop (`Tracer::restore_resent`), so that a handler
    /// sees its sender as natively.
    resent: Vec<(i32, i32, sys::SigInfo)>,
    outcome: Option<Outcome>,
    /// Trace mode's consumer thread (when a tool is given).
    consumer: Option<Consumer>,
    /// Threads running a native client call (`VALGRIND_NON_SIMD_CALL`):
    /// their registers at the request, given back when it returns.
    native_calls: HashMap<i32, Regs>,
    /// Reports taken from the kernel and not handled yet, oldest first
    /// (see [`Tracer::queue_reports`]).
    reports: std::collections::VecDeque<WaitStatus>,
    /// Whether the kernel refused a hardware breakpoint once (threads are
    /// single-stepped out of quiet code instead: `Tracer::leave_quiet`).
    no_breakpoints: bool,
}

/// Entry point behind [`crate::run`].
pub fn run(cfg: &LaunchConfig, sink: &mut dyn ProfileSink) -> Result<Outcome, EngineError> {
    let pid = launch::launch(cfg)?;
    let mut tracer = Tracer {
        cfg,
        sink,
        main_pid: pid,
        tasks: HashMap::new(),
        procs: HashMap::new(),
        announced: HashMap::new(),
        early: HashSet::new(),
        vfork_args: HashMap::new(),
        requeue: Vec::new(),
        resent: Vec::new(),
        outcome: None,
        consumer: cfg.tool.as_ref().map(|_| Consumer::start()),
        native_calls: HashMap::new(),
        reports: std::collections::VecDeque::new(),
        no_breakpoints: false,
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

impl Tracer<'_> {
    fn event_loop(&mut self) -> Result<(), EngineError> {
        loop {
            let st = match self.reports.pop_front() {
                Some(st) => st,
                None => match sys::wait_any() {
                    Ok(st) => {
                        self.queue_reports()?;
                        st
                    }
                    Err(e) if e.raw_os_error() == Some(libc::ECHILD) => return Ok(()),
                    Err(e) => return Err(os_err("waitpid", e)),
                },
            };
            self.handle(st)?;
        }
    }

    /// Takes every report already there into the queue of reports to
    /// handle: each task stopped now is handled once before any is handled
    /// again. (`waitpid(-1)` scans the newest tasks first: threads that
    /// stop again as soon as they are resumed, a busy loop filling its
    /// trace buffer, starved an older thread's stop for minutes.)
    fn queue_reports(&mut self) -> Result<(), EngineError> {
        while let Some(st) = poll_kernel()? {
            self.reports.push_back(st);
        }
        Ok(())
    }

    /// The next report to handle if one is there: queued first, then the
    /// kernel's.
    pub(super) fn poll_report(&mut self) -> Result<Option<WaitStatus>, EngineError> {
        match self.reports.pop_front() {
            Some(st) => Ok(Some(st)),
            None => poll_kernel(),
        }
    }

    /// Handles one event of a traced task ([`Tracer::dispatch`]), or the
    /// exit of a thread killed while the tool worked in it.
    fn handle(&mut self, st: WaitStatus) -> Result<(), EngineError> {
        if debug_enabled() {
            eprintln!("[engine] {st:?}");
        }
        if let Err(e) = self.dispatch(st) {
            // A thread killed while the tool worked in it: its exit
            // instead of what the work was for.
            let tid = inject::vanished_thread(&e).ok_or(e)?;
            self.on_thread_exit(tid);
            self.resume(tid, 0)?;
        }
        Ok(())
    }

    /// Handles one event of a traced task.
    fn dispatch(&mut self, st: WaitStatus) -> Result<(), EngineError> {
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
                libc::PTRACE_EVENT_VFORK => self.on_clone_event(pid, Birth::Fork)?,
                libc::PTRACE_EVENT_EXEC => self.on_exec(pid)?,
                libc::PTRACE_EVENT_EXIT => {
                    self.on_thread_exit(pid);
                    self.resume(pid, 0)?;
                }
                _ => self.resume(pid, 0)?,
            },
            WaitStatus::EventStop(pid, sig) => self.on_event_stop(pid, sig)?,
            WaitStatus::Stopped(pid, sig) => self.on_signal(pid, sig)?,
            WaitStatus::Syscall(pid) => self.resume(pid, 0)?,
        }
        Ok(())
    }

    /// A `PTRACE_EVENT_STOP` of `tid` with signal `sig`: a new task's
    /// first stop, or a group-stop, which lasts until a `SIGCONT` as it
    /// would natively (a shell's job control works on the client), or the
    /// end of one.
    fn on_event_stop(&mut self, tid: i32, sig: i32) -> Result<(), EngineError> {
        if !self.tasks.contains_key(&tid) {
            return self.on_new_task_stop(tid);
        }
        if matches!(
            sig,
            libc::SIGSTOP | libc::SIGTSTP | libc::SIGTTIN | libc::SIGTTOU
        ) {
            // Code and links written for it go out before it stops.
            if let Some(space) = self.space_of(tid) {
                space.borrow_mut().mem().flush()?;
            }
            let _ = sys::listen(tid);
            return Ok(());
        }
        self.resume(tid, 0)
    }

    /// The address space thread `tid` runs in.
    fn space_of(&self, tid: i32) -> Option<Rc<RefCell<Space>>> {
        let t = self.tasks.get(&tid)?;
        Some(self.procs.get(&t.tgid)?.space.clone())
    }

    /// The address space of `tid`, stopped at the syscall site whose stop
    /// is at `rip`, and that site (the syscalls the tool emulates).
    fn syscall_stop(
        &self,
        tid: i32,
        rip: u64,
    ) -> Result<(Rc<RefCell<Space>>, SyscallSite), EngineError> {
        let space = self.space_of(tid).expect("known task");
        let site = space.borrow().syscall_site(rip)?;
        Ok((space, site))
    }

    /// Lets a stopped task run on (delivering `sig` unless 0), after writing
    /// out what the tool changed in its memory and re-sending the signals
    /// held back during injections.
    fn resume(&mut self, tid: i32, sig: i32) -> Result<(), EngineError> {
        // Code and links written for this task's address space go out now.
        if let Some(space) = self.space_of(tid) {
            space.borrow_mut().mem().flush()?;
        }
        // A task that vanished (killed by a sibling's exit_group) is fine.
        let _ = sys::cont(tid, sig);
        let requeue = std::mem::take(&mut self.requeue);
        for (tgid, t, s, info) in requeue {
            if !sys::resend_signal(tgid, t, s, info.as_ref()) {
                if let Some(info) = info {
                    // A standard signal sent while one is pending merges
                    // with it (one delivery, the first one's siginfo): its
                    // entry is kept once.
                    let merged = s < libc::SIGRTMIN()
                        && self.resent.iter().any(|&(u, r, _)| (u, r) == (t, s));
                    if !merged {
                        self.resent.push((t, s, info));
                    }
                }
            }
        }
        Ok(())
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
                WaitStatus::Event(p, _)
                | WaitStatus::EventStop(p, _)
                | WaitStatus::Stopped(p, _)
                | WaitStatus::Syscall(p) => {
                    let _ = sys::cont(p, 0);
                }
            }
        }
    }
}

/// A report of any traced task if the kernel has one (none, too, when no
/// task is left to report).
fn poll_kernel() -> Result<Option<WaitStatus>, EngineError> {
    match sys::poll_any() {
        Err(e) if e.raw_os_error() == Some(libc::ECHILD) => Ok(None),
        other => other.map_err(|e| os_err("waitpid", e)),
    }
}

fn os_err(what: &str, e: std::io::Error) -> EngineError {
    EngineError(format!("{what}: {e}"))
}

/// `CACHESCOPE_ENGINE_DEBUG` set: log every exit to the tool on stderr.
fn debug_enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("CACHESCOPE_ENGINE_DEBUG").is_some())
}

// The ptrace requests of the tracer proper, failing with the user's
// message; or, for a task no longer there to be stopped (ESRCH: killed
// meanwhile by a sibling's fatal signal or exit_group), with the error that
// makes the event loop handle its exit instead of giving up on the run.

/// The error of a ptrace request `what` about `tid`.
fn task_err(tid: i32, what: &str, e: std::io::Error) -> EngineError {
    if e.raw_os_error() == Some(libc::ESRCH) {
        return inject::vanished(tid);
    }
    os_err(what, e)
}

/// Reads the registers of the stopped task `tid`.
fn get_regs(tid: i32) -> Result<Regs, EngineError> {
    sys::get_regs(tid).map_err(|e| task_err(tid, "cannot read client registers", e))
}

/// Writes the registers of the stopped task `tid`.
fn set_regs(tid: i32, regs: &Regs) -> Result<(), EngineError> {
    sys::set_regs(tid, regs).map_err(|e| task_err(tid, "cannot set client registers", e))
}

/// Resumes `tid` until its next stop, with no signal.
fn cont(tid: i32) -> Result<(), EngineError> {
    sys::cont(tid, 0).map_err(|e| task_err(tid, "cannot resume the client", e))
}

/// Resumes `tid` until its next stop or syscall entry or exit, with no signal.
fn cont_syscall(tid: i32) -> Result<(), EngineError> {
    sys::cont_syscall(tid, 0).map_err(|e| task_err(tid, "cannot resume the client", e))
}

/// Waits for the next report about `tid`.
fn wait_for(tid: i32) -> Result<WaitStatus, EngineError> {
    sys::wait_pid(tid).map_err(|e| os_err("waitpid", e))
}
