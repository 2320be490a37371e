//! Signals. The kernel delivers them natively; what the engine adds: a
//! handler the client installs with rt_sigaction is replaced by a
//! trampoline into its translation (and the client reads back its own
//! values), and since the translated handler reuses the thread's spill
//! slots, the interrupted code's slots are saved at delivery and restored
//! at the handler's rt_sigreturn.
//!
//! Handlers reuse their thread's spill slots: the interrupted code's
//! slots are pushed by the handler's trampoline and popped at its
//! `rt_sigreturn`, both in the client (`emit::signals`); that
//! `rt_sigreturn` comes to the tool (`on_sigreturn`) only when the client
//! cannot find the translation of the frame's RIP itself.
//!
//! A synchronous signal raised by a guest instruction in translated code
//! (a fault, a trap, the SIGILL of the `ud2` standing for an instruction
//! the processor cannot run) is delivered with the guest's context, as
//! natively: RIP (and `si_addr` where it is the instruction's address) is
//! the guest instruction's, and registers the translation borrowed hold
//! their guest values again (`Space::guest_point`). Whatever frame a
//! handler returns through, a guest RIP in it (the faulting instruction,
//! one the handler chose) is sent to its translation at the rt_sigreturn
//! stop, so the code after a handler always runs translated.
//!
//! An asynchronous signal (a timer, `kill`) that a handler will see is
//! likewise delivered at the guest instruction the thread was about to run
//! (counting mode): at a clean point of the translation, stepped to the
//! next one if it stopped inside the engine's own code
//! (`place_interrupted`), with the block's counts cut there. In trace mode
//! it is delivered where the thread is, but only once the block it is in
//! has finished its record (`close_record`).
//!
//! Signals sent to the client (by `timeout`, `kill`, a terminal) reach it
//! directly: the caller's process is the client, and the tracer, in a
//! session of its own, receives none of them.

use super::exits::{gpr, Spills};
use super::inject::Injection;
use super::{cont_syscall, debug_enabled, get_regs, os_err, set_regs, syscalls, wait_for, Tracer};
use crate::layout;
use crate::space::{RecordDelivery, MARK_SIGNAL, MARK_SIGRETURN};
use crate::sys::{self, Regs, WaitStatus};
use crate::translate::{PointKind, SiteRegs};
use crate::EngineError;

/// Offset in the thread area of scratch memory for a rewritten sigaction.
const SIGACTION_SCRATCH: u64 = 0x800;
/// `si_code` of a signal the kernel raised for a trap such as `int3`.
const SI_KERNEL: i32 = 0x80;
/// Most instructions an asynchronous signal's thread is stepped through
/// to reach a clean point (an indirect branch's lookup and probe take a
/// dozen or two, a handler's trampoline forty, tagged counting's inline
/// return of sixteen frames (`ctxrt::tagged::INLINE_POPS`) about three
/// hundred and fifty), or, out of quiet code, resumes to a breakpoint and
/// steps.
const MAX_STEPS: u32 = 512;

impl Tracer<'_> {
    /// Waits for the next syscall stop of `tid` (of process `tgid`), which
    /// was just continued to one; signals that stop it meanwhile wait for
    /// their delivery. `false` if it exited instead (its exit is handled).
    fn await_syscall_stop(&mut self, tgid: i32, tid: i32) -> Result<bool, EngineError> {
        loop {
            match wait_for(tid)? {
                WaitStatus::Syscall(_) => return Ok(true),
                WaitStatus::Stopped(_, sg) => {
                    self.take_for_later(tgid, tid, sg);
                    cont_syscall(tid)?;
                }
                WaitStatus::Exited(..) | WaitStatus::Signaled(..) => {
                    self.on_thread_exit(tid);
                    return Ok(false);
                }
                WaitStatus::Event(_, libc::PTRACE_EVENT_EXIT) => {
                    // Killed on the way (another thread's exit_group, a
                    // fatal signal): its exit is handled at this stop,
                    // while its memory is there. Waiting for its syscall
                    // stop would wait for ever if it is the leader, whose
                    // end is reported only after every other thread's.
                    self.on_thread_exit(tid);
                    self.resume(tid, 0)?;
                    return Ok(false);
                }
                WaitStatus::Event(..) | WaitStatus::EventStop(..) => cont_syscall(tid)?,
            }
        }
    }

    /// A signal-delivery stop.
    pub(super) fn on_signal(&mut self, tid: i32, sig: i32) -> Result<(), EngineError> {
        if !self.tasks.contains_key(&tid) {
            return self.resume(tid, sig);
        }
        if !self.restore_resent(tid, sig) && !is_synchronous(sig) && self.forces_resend(tid, sig) {
            // (Debugging knob: every such signal goes the way of one that
            // arrived while the tool held the thread.)
            let tgid = self.tasks[&tid].tgid;
            self.take_for_later(tgid, tid, sig);
            return self.resume(tid, 0);
        }
        if sig == libc::SIGTRAP && self.left_retired_entry(tid)? {
            return self.resume(tid, 0);
        }
        if sig == libc::SIGTRAP && self.left_runtime_with_signal(tid)? {
            return Ok(());
        }
        if is_synchronous(sig) {
            self.place_fault(tid, sig)?;
        }
        if self.handler_runs(tid, sig) {
            // The kernel runs our trampoline, which enters the translated
            // handler.
            if !is_synchronous(sig) {
                if self.postpone_in_runtime(tid, sig)? {
                    return Ok(());
                }
                if !self.place_interrupted(tid, sig)? {
                    return Ok(());
                }
            }
            return self.deliver_to_handler(tid, sig);
        }
        // No handler: the default action (or ignoring) happens as natively.
        self.resume(tid, sig)?;
        Ok(())
    }

    /// Whether the delivery stop of `sig` to `tid` is that of a signal the
    /// tool re-sent as its own `tgkill` ([`Tracer::resume`]); if so the
    /// siginfo it first came with is given back, to be delivered instead
    /// (the sender's pid and uid, `SI_USER` for a `kill`, a kernel code).
    fn restore_resent(&mut self, tid: i32, sig: i32) -> bool {
        let Some(at) = self
            .resent
            .iter()
            .position(|&(t, s, _)| t == tid && s == sig)
        else {
            return false;
        };
        let Ok(now) = sys::get_siginfo(tid) else {
            return false;
        };
        // (A signal of the same number sent meanwhile by someone else comes
        // first: ours is still pending.)
        if now.code() != libc::SI_TKILL || now.pid() != std::process::id() as i32 {
            return false;
        }
        let (_, _, info) = self.resent.remove(at);
        sys::set_siginfo(tid, &info).is_ok()
    }

    /// Whether the asynchronous signal `sig` of `tid`, whose handler the
    /// client installed, is to be taken and sent again before its delivery
    /// (`CACHESCOPE_ENGINE_RESEND_SIGNALS`, for tests: that happens
    /// otherwise only to a signal arriving while the tool holds the
    /// thread, a few times a run). Only those re-sent as the tool's own
    /// `tgkill`, whose siginfo is given back at their delivery.
    fn forces_resend(&self, tid: i32, sig: i32) -> bool {
        static KNOB: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        if !*KNOB.get_or_init(|| std::env::var_os("CACHESCOPE_ENGINE_RESEND_SIGNALS").is_some()) {
            return false;
        }
        let handled = self
            .tasks
            .get(&tid)
            .and_then(|t| self.procs.get(&t.tgid))
            .is_some_and(|p| p.handlers.contains_key(&sig));
        handled && sys::get_siginfo(tid).is_ok_and(|i| i.code() >= 0 || i.code() == libc::SI_TKILL)
    }

    /// `tid`, stopped at the delivery of `sig` whose handler runs (with
    /// the siginfo it is to see), goes on into the handler.
    fn deliver_to_handler(&mut self, tid: i32, sig: i32) -> Result<(), EngineError> {
        self.mark_trace(tid, MARK_SIGNAL)?;
        if debug_enabled() || std::env::var_os("CACHESCOPE_ENGINE_DEBUG_SIGNALS").is_some() {
            self.log_delivery(tid, sig)?;
        }
        if self.shares_actions(tid) {
            // Another thread may change the action before this one runs
            // again and looks it up: the handler's frame is built now,
            // under the action the signal met.
            return self.step_into_handler(tid, sig);
        }
        self.resume(tid, sig)
    }

    /// Contexts mode: an asynchronous signal `sig` whose handler runs,
    /// stopped at while `tid` is inside the context runtime (the stub or
    /// the blob), where the runtime's words may be half-written and a
    /// handler's first block would enter the runtime again. The signal
    /// waits: it is kept with its siginfo, the thread's
    /// `layout::S_SIGNAL_WAITS` is set, and the thread goes on; the
    /// runtime's exit then traps instead of returning, and
    /// [`Tracer::left_runtime_with_signal`] delivers it there. A thread
    /// already past its exit's check (in an exit window) is stepped out
    /// instead, and the signal delivered where it lands. Returns whether
    /// the signal was taken care of (waits, or was delivered meanwhile).
    fn postpone_in_runtime(&mut self, tid: i32, sig: i32) -> Result<bool, EngineError> {
        let space = self.space_of(tid).expect("known task");
        let mut regs = get_regs(tid)?;
        if !space.borrow().in_context_runtime(regs.rip) {
            return Ok(false);
        }
        let info = sys::get_siginfo(tid).map_err(|e| os_err("PTRACE_GETSIGINFO", e))?;
        let mut steps = 0;
        while space.borrow().in_context_exit(regs.rip) && steps < MAX_STEPS {
            if !self.leave_quiet(tid, (sig, &info), regs.rip)? {
                return Ok(true);
            }
            steps += 1;
            regs = get_regs(tid)?;
        }
        if steps > 0 {
            // Stopped by the step's SIGTRAP: the signal is delivered
            // instead, with its own siginfo.
            sys::set_siginfo(tid, &info).map_err(|e| os_err("PTRACE_SETSIGINFO", e))?;
            if !space.borrow().in_context_runtime(regs.rip) {
                return Ok(false);
            }
        }
        let task = self.tasks.get_mut(&tid).expect("known task");
        task.waiting.push((sig, info));
        let slot = regs.gs_base + u64::from(layout::S_SIGNAL_WAITS);
        space.borrow_mut().mem().write(slot, &1u64.to_le_bytes());
        self.resume(tid, 0)?;
        Ok(true)
    }

    /// Whether `tid`'s SIGTRAP is the context runtime's exit trapping for
    /// a signal that waits ([`Tracer::postpone_in_runtime`]); if so the
    /// exit's return is done here (the thread is back in translated code,
    /// after the context entry's call) and the first waiting signal is
    /// delivered there, with its own siginfo; others are sent again.
    fn left_runtime_with_signal(&mut self, tid: i32) -> Result<bool, EngineError> {
        if self.tasks.get(&tid).is_none_or(|t| t.waiting.is_empty()) {
            return Ok(false);
        }
        let space = self.space_of(tid).expect("known task");
        let mut regs = get_regs(tid)?;
        if !space.borrow().in_context_runtime(regs.rip.wrapping_sub(1)) {
            return Ok(false);
        }
        let task = self.tasks.get_mut(&tid).expect("known task");
        let mut waiting = std::mem::take(&mut task.waiting).into_iter();
        let tgid = task.tgid;
        {
            let mut sp = space.borrow_mut();
            let mem = sp.mem();
            mem.write(
                regs.gs_base + u64::from(layout::S_SIGNAL_WAITS),
                &0u64.to_le_bytes(),
            );
            regs.rip = mem.read_u64(regs.rsp)?;
            regs.rsp += 8;
        }
        set_regs(tid, &regs)?;
        let (sig, info) = waiting.next().expect("a waiting signal");
        for (other, info) in waiting {
            self.requeue.push((tgid, tid, other, Some(info)));
        }
        sys::set_siginfo(tid, &info).map_err(|e| os_err("PTRACE_SETSIGINFO", e))?;
        self.deliver_to_handler(tid, sig)?;
        Ok(true)
    }

    /// Whether `tid` trapped on the `int3` of a retired block's entry
    /// (see `Space::entry_trap`); if so it is sent on to the block's
    /// current translation, and the trap is the tool's, not the client's.
    fn left_retired_entry(&mut self, tid: i32) -> Result<bool, EngineError> {
        let Some(space) = self.space_of(tid) else {
            return Ok(false);
        };
        let mut regs = get_regs(tid)?;
        let Some(dest) = space.borrow_mut().entry_trap(regs.rip.wrapping_sub(1)) else {
            return Ok(false);
        };
        regs.rip = dest;
        set_regs(tid, &regs)?;
        Ok(true)
    }

    /// Whether the delivery of `sig` to `tid` runs a handler the client
    /// installed, from the tool's record of its `rt_sigaction` calls (read
    /// from `/proc` per signal, this was most of a signal's cost). A
    /// one-shot handler (`SA_RESETHAND`) is reset by this delivery.
    fn handler_runs(&mut self, tid: i32, sig: i32) -> bool {
        let Some(proc) = self
            .tasks
            .get(&tid)
            .and_then(|t| self.procs.get_mut(&t.tgid))
        else {
            return has_handler(tid, sig);
        };
        let runs = match proc.handlers.get(&sig) {
            Some(h) if h.once => {
                proc.handlers.remove(&sig);
                true
            }
            Some(_) => true,
            None => false,
        };
        debug_assert_eq!(runs, has_handler(tid, sig), "handler of signal {sig}");
        runs
    }

    /// The delivery stop of an asynchronous signal `sig` of `tid`, which a
    /// handler will see: in counting mode, a thread in translated code is
    /// given the guest's context at the clean point (between guest
    /// instructions) it stopped at, as natively: RIP the guest instruction
    /// to run next (`Space::interrupted` keeps the counts exact whatever
    /// the handler does), RCX and R11 what a `syscall` it has just returned
    /// from leaves. One inside the engine's own code (an indirect branch's
    /// lookup, a counter update) is first stepped to the next clean point,
    /// a few instructions on; where that fails (a `syscall` first, or too
    /// far) it stays where it is, a counter update it stopped inside
    /// rewound to its load, so that the update runs whole after the handler
    /// and keeps the counts the handler adds meanwhile. In trace mode the
    /// thread first runs on to the end of its block's record
    /// ([`Tracer::close_record`]). Returns whether the
    /// thread still stands at the signal's delivery stop (not when it exited,
    /// or a fault of a stepped instruction was delivered instead).
    fn place_interrupted(&mut self, tid: i32, sig: i32) -> Result<bool, EngineError> {
        let space = self.space_of(tid).expect("known task");
        let mut regs = get_regs(tid)?;
        if space.borrow().is_tracing() {
            match self.close_record(tid, sig, regs)? {
                Some(r) => regs = r,
                None => return Ok(false),
            }
        }
        let mut steps = 0;
        let mut info = None;
        loop {
            let rewound = space.borrow().interrupted_counter_update(regs.rip);
            let at = rewound.unwrap_or(regs.rip);
            let point = space.borrow_mut().interrupted(at, regs.rcx, regs.gs_base)?;
            if let Some(p) = point {
                regs.rip = p.guest;
                match p.kind {
                    PointKind::AfterSyscall => {
                        regs.rcx = p.guest;
                        regs.r11 = regs.eflags;
                    }
                    PointKind::RaxSpilled => {
                        let slot = regs.gs_base + u64::from(layout::S_RAX);
                        regs.rax = space.borrow_mut().mem().read_u64(slot)?;
                    }
                    PointKind::Clean | PointKind::Rep { .. } => {}
                }
            } else if steps < MAX_STEPS && self.steppable(&space, regs.rip) {
                let held = withheld(tid, &mut info)?;
                if !self.step_towards_delivery(tid, (sig, &held))? {
                    return Ok(false);
                }
                steps += 1;
                regs = get_regs(tid)?;
                continue;
            } else {
                regs.rip = at;
            }
            set_regs(tid, &regs)?;
            if let Some(info) = info {
                // Stopped by the step's SIGTRAP: the signal is delivered
                // instead, with its own siginfo.
                sys::set_siginfo(tid, &info).map_err(|e| os_err("PTRACE_SETSIGINFO", e))?;
            }
            return Ok(true);
        }
    }

    /// Moves `tid`, at `rip` in a context stub's exit window or in tagged
    /// counting's quiet code, on towards a way out on the way to
    /// delivering `sig` (withheld meanwhile): in quiet code that can be
    /// followed, it runs to the next breakpoint out of it
    /// (`Space::quiet_exits`; standing at one, an indirect transfer, it is
    /// stepped over it); elsewhere it is stepped one instruction. As
    /// [`Tracer::step_towards_delivery`], `false` when the signal was
    /// taken care of otherwise.
    fn leave_quiet(
        &mut self,
        tid: i32,
        signal: (i32, &sys::SigInfo),
        rip: u64,
    ) -> Result<bool, EngineError> {
        let space = self.space_of(tid).expect("known task");
        let exits = match self.no_breakpoints {
            true => None,
            false => space.borrow_mut().quiet_exits(rip),
        };
        self.run_to_exits(tid, signal, rip, exits)
    }

    /// Trace mode: `tid`, stopped at the delivery of `sig` (whose handler
    /// runs) inside a block whose record is open (`translate::RecordSpan`),
    /// runs on, the signal withheld, until it has left the record: to a
    /// breakpoint out of it, or stepped. A flush stub on the way is
    /// answered here, as its exit would be, so that the handler starts
    /// with every record before it complete. Otherwise the handler's
    /// records could fill the buffer and flush it, and the interrupted
    /// block would finish its record in a buffer handed over already.
    /// Returns the thread's registers where it stands then (`regs` if it
    /// did not move), or `None` as [`Tracer::step_towards_delivery`]
    /// returns `false`.
    fn close_record(
        &mut self,
        tid: i32,
        sig: i32,
        mut regs: Regs,
    ) -> Result<Option<Regs>, EngineError> {
        let space = self.space_of(tid).expect("known task");
        let mut info = None;
        // Whether `regs` are the thread's (not after it ran on).
        let mut current = true;
        for _ in 0..MAX_STEPS {
            if !current {
                regs = get_regs(tid)?;
                current = true;
            }
            let delivery = space.borrow_mut().record_delivery(regs.rip);
            match delivery {
                RecordDelivery::Now => break,
                RecordDelivery::Flush { rax_spilled } => {
                    let mut sp = space.borrow_mut();
                    let spills = Spills::read(&mut sp, regs.gs_base)?;
                    if rax_spilled {
                        regs.rax = spills.rax;
                    }
                    super::exits::flush(&mut sp, &mut regs, spills.target)?;
                    sp.hand_over_pending();
                    drop(sp);
                    set_regs(tid, &regs)?;
                }
                RecordDelivery::Leave(exits) => {
                    let held = withheld(tid, &mut info)?;
                    let exits = exits.filter(|_| !self.no_breakpoints);
                    if !self.run_to_exits(tid, (sig, &held), regs.rip, exits)? {
                        return Ok(None);
                    }
                    current = false;
                }
            }
        }
        if let Some(info) = info {
            // Stopped by a SIGTRAP: the signal is delivered instead, with
            // its own siginfo.
            sys::set_siginfo(tid, &info).map_err(|e| os_err("PTRACE_SETSIGINFO", e))?;
        }
        Ok(Some(regs))
    }

    /// Runs `tid` (at `rip`, stopped at a delivery of `signal`, withheld)
    /// to the first of the breakpoints `exits`, or steps it one
    /// instruction where there are none (or too many, or one at `rip`, or
    /// no hardware breakpoints). As [`Tracer::step_towards_delivery`].
    fn run_to_exits(
        &mut self,
        tid: i32,
        signal: (i32, &sys::SigInfo),
        rip: u64,
        exits: Option<Vec<u64>>,
    ) -> Result<bool, EngineError> {
        let usable = |e: &Vec<u64>| e.len() <= BREAKPOINTS && !e.contains(&rip);
        let Some(exits) = exits.filter(usable) else {
            return self.step_towards_delivery(tid, signal);
        };
        if let Err(e) = set_breakpoints(tid, &exits) {
            if debug_enabled() {
                eprintln!("cachescope: no hardware breakpoints ({e}): quiet code is stepped");
            }
            self.no_breakpoints = true;
            clear_breakpoints(tid);
            return self.step_towards_delivery(tid, signal);
        }
        let run = self.resume_holding(tid, Resume::Continue);
        if !matches!(run, Ok(Step::Gone)) {
            clear_breakpoints(tid);
        }
        self.after_step(tid, signal, run?)
    }

    /// Steps `tid` one instruction on the way to delivering `sig`
    /// (withheld meanwhile). `false` when the signal was taken care of
    /// otherwise: the thread exited, or the stepped instruction (an
    /// indirect branch's target load) faulted, and that signal is
    /// delivered now, as at the guest instruction, with `sig` sent again
    /// after it.
    fn step_towards_delivery(
        &mut self,
        tid: i32,
        signal: (i32, &sys::SigInfo),
    ) -> Result<bool, EngineError> {
        let step = self.resume_holding(tid, Resume::Step)?;
        self.after_step(tid, signal, step)
    }

    /// What a step or run towards delivering `sig` came to (see
    /// [`Tracer::step_towards_delivery`]).
    fn after_step(
        &mut self,
        tid: i32,
        (sig, info): (i32, &sys::SigInfo),
        step: Step,
    ) -> Result<bool, EngineError> {
        match step {
            Step::Done => Ok(true),
            Step::Gone => Ok(false),
            Step::Raised(other) => {
                let tgid = self.tasks[&tid].tgid;
                self.requeue.push((tgid, tid, sig, Some(*info)));
                self.on_signal(tid, other)?;
                Ok(false)
            }
        }
    }

    /// Whether a thread at host `rip` in `space` may be single-stepped
    /// towards a clean point: in the code cache, in counting mode, and not
    /// at a `syscall` (which would run, or stop in the tool, meanwhile).
    fn steppable(
        &self,
        space: &std::rc::Rc<std::cell::RefCell<crate::space::Space>>,
        rip: u64,
    ) -> bool {
        let mut sp = space.borrow_mut();
        if !sp.in_code_cache(rip) || sp.keeps_host_rip() {
            return false;
        }
        sp.mem().read(rip, 2).is_ok_and(|b| b[..] != [0x0f, 0x05])
    }

    /// Runs `tid` (at a signal-delivery stop, whose signal is withheld)
    /// for one instruction or to a breakpoint, its asynchronous signals
    /// held (they stay pending).
    fn resume_holding(&mut self, tid: i32, how: Resume) -> Result<Step, EngineError> {
        let held = hold_signals(tid);
        let step = self.resume_held(tid, how);
        release_signals(tid, held);
        step
    }

    /// `tid`, stopped at the delivery of `sig` (of process `tgid`), which
    /// the tracer keeps from it for now: sent again, with its siginfo, at
    /// the thread's next resume.
    fn take_for_later(&mut self, tgid: i32, tid: i32, sig: i32) {
        let info = sys::get_siginfo(tid).ok();
        self.requeue.push((tgid, tid, sig, info));
    }

    /// Resumes `tid` (asynchronous signals held) until its next SIGTRAP:
    /// after one instruction, or at a breakpoint.
    fn resume_held(&mut self, tid: i32, how: Resume) -> Result<Step, EngineError> {
        let tgid = self.tasks[&tid].tgid;
        let go = |tid| match how {
            Resume::Step => sys::single_step(tid, 0).map_err(|e| os_err("PTRACE_SINGLESTEP", e)),
            Resume::Continue => sys::cont(tid, 0).map_err(|e| os_err("PTRACE_CONT", e)),
        };
        go(tid)?;
        loop {
            match wait_for(tid)? {
                WaitStatus::Stopped(_, libc::SIGTRAP) => return Ok(Step::Done),
                WaitStatus::Stopped(_, sg) if is_synchronous(sg) => return Ok(Step::Raised(sg)),
                WaitStatus::Stopped(_, sg) => {
                    // Another signal came first: deliver it later, and
                    // go on.
                    self.take_for_later(tgid, tid, sg);
                    go(tid)?;
                }
                WaitStatus::Exited(..) | WaitStatus::Signaled(..) => {
                    self.on_thread_exit(tid);
                    return Ok(Step::Gone);
                }
                WaitStatus::Event(..) | WaitStatus::EventStop(..) | WaitStatus::Syscall(_) => {
                    go(tid)?;
                }
            }
        }
    }

    /// The delivery stop of a synchronous signal `sig` of `tid`: when a
    /// guest instruction in translated code raised it, the thread is given
    /// that instruction's context before the kernel builds the frame: RIP
    /// the guest address (after the instruction for a trap, which natively
    /// reports the next one), `si_addr` likewise where it is the
    /// instruction's address (SIGILL, SIGFPE; a fault's data address stays),
    /// borrowed registers their guest values. Returns whether it did.
    fn place_fault(&mut self, tid: i32, sig: i32) -> Result<bool, EngineError> {
        let space = self.space_of(tid).expect("known task");
        let mut regs = get_regs(tid)?;
        let Ok(mut info) = sys::get_siginfo(tid) else {
            return Ok(false);
        };
        if info.code() <= 0 {
            // Sent by a process (kill, tgkill, sigqueue): nothing to map.
            return Ok(false);
        }
        let host = regs.rip;
        // `guest`: where the client's context says it stopped; the
        // instruction that raised the signal is in host code at `probe`.
        let (guest, regs_at, probe) = if let Some(g) = space.borrow().sigill_site(host) {
            (g, SiteRegs::Guest, host)
        } else {
            let trap = sig == libc::SIGTRAP && info.code() == SI_KERNEL;
            let probe = if trap { host.wrapping_sub(1) } else { host };
            let Some(p) = space.borrow().guest_point(probe) else {
                return Ok(false);
            };
            (if trap { p.next } else { p.guest }, p.regs, probe)
        };
        let area = regs.gs_base;
        let slot = |space: &std::cell::RefCell<crate::space::Space>, off: u32| {
            space.borrow_mut().mem().read_u64(area + u64::from(off))
        };
        if regs_at == SiteRegs::RcxSpilled {
            regs.rcx = slot(&space, layout::S_RCX)?;
        }
        if let Some((r, a)) = regs_at.borrowed() {
            *gpr(&mut regs, r) = slot(&space, layout::S_BORROW_R)?;
            if let Some(a) = a {
                *gpr(&mut regs, a) = slot(&space, layout::S_BORROW_A)?;
            }
        }
        if let SiteRegs::BorrowedFlagsKept(..) = regs_at {
            regs.eflags = kept_flags(regs.eflags, regs.rax);
            regs.rax = slot(&space, layout::S_KEEP_RAX)?;
        }
        space.borrow_mut().rep_faulted(probe, regs.rcx, area)?;
        if info.addr() == host {
            info.set_addr(guest);
            let _ = sys::set_siginfo(tid, &info);
        }
        regs.rip = guest;
        set_regs(tid, &regs)?;
        Ok(true)
    }

    /// Tells the thread's tool (through its trace buffer, in order with its
    /// records) that a handler starts or returns.
    fn mark_trace(&mut self, tid: i32, marker: u32) -> Result<(), EngineError> {
        let space = self.space_of(tid).expect("known task");
        let area = self.tasks.get(&tid).expect("known task").area;
        let result = space.borrow_mut().trace_marker(area, marker);
        result
    }

    fn log_delivery(&self, tid: i32, sig: i32) -> Result<(), EngineError> {
        let space = self.space_of(tid).expect("known task");
        let r = get_regs(tid)?;
        let code = sys::get_siginfo(tid).map_or(0, |i| i.code());
        let bytes = space.borrow_mut().mem().read(r.rip, 16).unwrap_or_default();
        eprintln!(
            "[engine] deliver {sig} (code {code}, bytes {bytes:02x?}) at rip {:#x} (guest block {:x?}) rsp {:#x} addr {:#x} regs {r:x?}",
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
        Ok(())
    }

    /// `rt_sigreturn` (syscall `sysno`) from translated code stopped with
    /// `regs` (where the client's stub did not find the frame's RIP, or
    /// calls are traced): leaving a handler, the interrupted code's spills
    /// come back, and the sigreturn is issued from the site's native
    /// `syscall` as a syscall of its own.
    pub(super) fn on_sigreturn(
        &mut self,
        tid: i32,
        mut regs: Regs,
        sysno: u64,
    ) -> Result<(), EngineError> {
        let (space, site) = self.syscall_stop(tid, regs.rip)?;
        space.borrow_mut().pop_signal_spills(regs.gs_base)?;
        self.mark_trace(tid, MARK_SIGRETURN)?;
        self.frame_to_translation(tid, regs)?;
        regs.rip = site.stop_rip + 2;
        regs.rax = sysno;
        regs.orig_rax = u64::MAX;
        set_regs(tid, &regs)?;
        self.resume(tid, 0)?;
        Ok(())
    }

    /// The frame `tid`'s rt_sigreturn (stopped with `regs`) is about to
    /// restore: a guest RIP in it (a synchronous signal's, or one the
    /// handler set) becomes the address of its translation, so the code
    /// after the handler runs translated, and the translation is published
    /// in the indirect-branch table, where the client's own stub finds it
    /// next time. One that cannot be translated is left as it is: the
    /// client then faults there, as natively; so is one in the engine's own
    /// code (a signal delivered where no guest state was clean).
    fn frame_to_translation(&mut self, tid: i32, regs: Regs) -> Result<(), EngineError> {
        let space = self.space_of(tid).expect("known task");
        let at = regs.rsp.wrapping_add(layout::FRAME_RIP);
        let Ok(rip) = space.borrow_mut().mem().read_u64(at) else {
            return Ok(());
        };
        if space.borrow().in_engine_code(rip) {
            return Ok(());
        }
        let tgid = self.tasks[&tid].tgid;
        let multi = self.threads_sharing(&space) > 1;
        let gadget = space.borrow().core + layout::GADGET;
        let mut inj = Injection::new(tid, gadget, regs);
        let body = {
            let mut sp = space.borrow_mut();
            sp.mem().set_multi(multi);
            sp.ensure(rip, &mut inj.injector())
        };
        let patches = space.borrow_mut().mem().take_live();
        if !patches.is_empty() {
            inj.apply_live_patches(&mut space.borrow_mut(), &patches)?;
        }
        self.requeue_signals(tgid, inj);
        match body {
            Ok(body) => {
                let mut sp = space.borrow_mut();
                sp.publish(rip);
                sp.mem().write(at, &body.to_le_bytes());
            }
            Err(e) if debug_enabled() => eprintln!("[engine] sigreturn to {rip:#x}: {}", e.0),
            Err(_) => {}
        }
        Ok(())
    }

    /// `rt_sigaction(sig, act, oldact)`: a handler is replaced by a
    /// trampoline into its translation; the client always reads back its own
    /// values in `oldact`.
    pub(super) fn on_sigaction(&mut self, tid: i32, regs: Regs) -> Result<(), EngineError> {
        self.deliver_pending_first(tid, regs.rdi as i32)?;
        if !self.tasks.contains_key(&tid) {
            // A handler that ran meanwhile ended the process.
            return Ok(());
        }
        let (space, site) = self.syscall_stop(tid, regs.rip)?;
        let tgid = self.tasks[&tid].tgid;
        let (sig, act, oldact) = (regs.rdi as i32, regs.rsi, regs.rdx);
        let mut change: Option<Option<Handler>> = None;
        let mut r = regs;
        if act != 0 {
            let mut sp = space.borrow_mut();
            if let Ok(mut bytes) = sp.mem().read(act, 32) {
                let handler = u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes"));
                if handler > 1 {
                    let mut inj = Injection::new(tid, sp.core + layout::GADGET, regs);
                    let tramp = sp.signal_trampoline(handler, &mut inj.injector())?;
                    self.requeue_signals(tgid, inj);
                    bytes[..8].copy_from_slice(&tramp.to_le_bytes());
                    let scratch = regs.gs_base + SIGACTION_SCRATCH;
                    sp.mem().write(scratch, &bytes);
                    r.rsi = scratch;
                    let flags = u64::from_le_bytes(bytes[8..16].try_into().expect("8 bytes"));
                    change = Some(Some(Handler {
                        addr: handler,
                        once: flags & u64::from(libc::SA_RESETHAND as u32) != 0,
                    }));
                } else {
                    change = Some(None);
                }
            }
        }
        r.orig_rax = syscalls::RT_SIGACTION as u64;
        r.rax = syscalls::RT_SIGACTION as u64;
        space.borrow_mut().mem().flush()?;
        set_regs(tid, &r)?;
        // Run it to its syscall-exit stop, to see its result.
        let held = hold_signals(tid);
        cont_syscall(tid)?;
        let stopped = self.await_syscall_stop(tgid, tid)?;
        release_signals(tid, held);
        if !stopped {
            return Ok(());
        }
        let mut out = get_regs(tid)?;
        if out.rax == 0 {
            let proc = self.procs.get_mut(&tgid).expect("known process");
            if oldact != 0 {
                // The kernel wrote the real old action: our trampoline,
                // shown as the client's handler, or SIG_DFL/SIG_IGN, true as
                // it stands (SA_RESETHAND reset it at a delivery).
                let real = space.borrow_mut().mem().read_u64(oldact)?;
                match proc.handlers.get(&sig) {
                    Some(h) if real > 1 => space
                        .borrow_mut()
                        .mem()
                        .write(oldact, &h.addr.to_le_bytes()),
                    Some(_) => {
                        proc.handlers.remove(&sig);
                    }
                    None => {}
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
        set_regs(tid, &out)?;
        self.resume(tid, 0)?;
        Ok(())
    }
}

/// Longest wait for other threads' pending signals before an
/// `rt_sigaction` goes ahead (a thread that does not take its signal in
/// that time, being stopped or busy in a long tool stop, gets it after).
const PENDING_WAIT: std::time::Duration = std::time::Duration::from_millis(100);

impl Tracer<'_> {
    /// `tid` is about to change the action of signal `sig`: the signals
    /// `sig` already pending for its process's other threads (and not
    /// blocked there) are delivered first, with the action they were sent
    /// under. Natively the kernel wakes such a thread at once and it takes
    /// its signal before the sender's next syscall can run (Valgrind's
    /// `pth_self_kill 15 killotherthread`: `pthread_kill` of a thread, then
    /// `sigaction(SIG_DFL)`); here its delivery stop waits for the tracer,
    /// which might see the `rt_sigaction` first, and the thread then died
    /// of a signal its handler catches natively. Other tasks' events are
    /// handled meanwhile as in the event loop.
    fn deliver_pending_first(&mut self, tid: i32, sig: i32) -> Result<(), EngineError> {
        let Some(tgid) = self.tasks.get(&tid).map(|t| t.tgid) else {
            return Ok(());
        };
        if !(1..=64).contains(&sig) || !self.shares_actions(tid) {
            return Ok(());
        }
        // A thread may stand at its delivery stop already (the signal is
        // no longer pending then: its report is handled first), or be on
        // its way there (pending: its stop is awaited), or have got there
        // since the last look (so a last look at the reports).
        // Each is stepped into its handler (`on_signal` does so in a
        // process of several threads) before the action changes.
        let started = std::time::Instant::now();
        loop {
            while let Some(st) = self.poll_report()? {
                self.handle(st)?;
            }
            if started.elapsed() >= PENDING_WAIT || !self.pending_elsewhere(tgid, tid, sig) {
                break;
            }
            std::thread::yield_now();
        }
        while let Some(st) = self.poll_report()? {
            self.handle(st)?;
        }
        Ok(())
    }

    /// Delivers `sig` to `tid` (at its delivery stop, ready) by stepping it
    /// into the handler: the kernel looks the action up, builds the frame
    /// and stops the thread at the handler's first instruction (a SIGTRAP
    /// stop), from where it runs on.
    fn step_into_handler(&mut self, tid: i32, sig: i32) -> Result<(), EngineError> {
        if let Some(space) = self.space_of(tid) {
            space.borrow_mut().mem().flush()?;
        }
        if sys::single_step(tid, sig).is_err() {
            return Ok(()); // gone meanwhile
        }
        let tgid = self.tasks[&tid].tgid;
        loop {
            match wait_for(tid)? {
                WaitStatus::Stopped(_, libc::SIGTRAP) => return self.resume(tid, 0),
                WaitStatus::Stopped(_, other) => {
                    // Another signal first: sent again after this one.
                    self.take_for_later(tgid, tid, other);
                    sys::single_step(tid, 0).map_err(|e| os_err("PTRACE_SINGLESTEP", e))?;
                }
                WaitStatus::Exited(..) | WaitStatus::Signaled(..) => {
                    self.on_thread_exit(tid);
                    return Ok(());
                }
                WaitStatus::Event(_, libc::PTRACE_EVENT_EXIT) => {
                    self.on_thread_exit(tid);
                    return self.resume(tid, 0);
                }
                WaitStatus::Event(..) | WaitStatus::EventStop(..) | WaitStatus::Syscall(_) => {
                    sys::single_step(tid, 0).map_err(|e| os_err("PTRACE_SINGLESTEP", e))?;
                }
            }
        }
    }

    /// Whether `tid`'s signal actions are shared with other threads (its
    /// process has more than one), which may change them at any time.
    fn shares_actions(&self, tid: i32) -> bool {
        self.tasks
            .get(&tid)
            .and_then(|t| self.procs.get(&t.tgid))
            .is_some_and(|p| p.threads.len() > 1)
    }

    /// Whether a thread of process `tgid` other than `tid` has `sig`
    /// pending for itself and not blocked (from `/proc`).
    fn pending_elsewhere(&self, tgid: i32, tid: i32, sig: i32) -> bool {
        let Some(proc) = self.procs.get(&tgid) else {
            return false;
        };
        let bit = 1u64 << (sig - 1);
        proc.threads.iter().filter(|&&t| t != tid).any(|&t| {
            let Ok(status) = std::fs::read_to_string(format!("/proc/{tgid}/task/{t}/status"))
            else {
                return false;
            };
            status_mask(&status, "SigPnd:") & !status_mask(&status, "SigBlk:") & bit != 0
        })
    }
}

/// How [`Tracer::resume_held`] runs a thread.
#[derive(Clone, Copy)]
enum Resume {
    /// One instruction.
    Step,
    /// Until a breakpoint.
    Continue,
}

/// Hardware breakpoints an x86-64 thread has (debug registers 0 to 3).
const BREAKPOINTS: usize = 4;

/// Sets `tid`'s hardware breakpoints (up to [`BREAKPOINTS`]) at `addrs`,
/// enabled.
fn set_breakpoints(tid: i32, addrs: &[u64]) -> std::io::Result<()> {
    let mut control = 0;
    for (i, &a) in addrs.iter().enumerate() {
        sys::set_debug_reg(tid, i, a)?;
        // Local enable; break on execution, length 1 (zero bits).
        control |= 1 << (2 * i);
    }
    sys::set_debug_reg(tid, 7, control)
}

/// Disables `tid`'s hardware breakpoints and clears their status.
fn clear_breakpoints(tid: i32) {
    // A thread that vanished meanwhile needs none.
    let _ = sys::set_debug_reg(tid, 7, 0);
    let _ = sys::set_debug_reg(tid, 6, 0);
}

/// How a step or a run to a breakpoint ended.
enum Step {
    /// At the next instruction or the breakpoint (a SIGTRAP stop).
    Done,
    /// The thread exited (its exit is handled).
    Gone,
    /// The instruction raised this synchronous signal (at its delivery
    /// stop).
    Raised(i32),
}

/// A handler the client installed for a signal.
#[derive(Debug, Clone, Copy)]
pub(super) struct Handler {
    /// The client's handler (the kernel has a trampoline into its
    /// translation instead).
    pub(super) addr: u64,
    /// `SA_RESETHAND`: the kernel resets it to the default at delivery.
    pub(super) once: bool,
}

/// Blocks in stopped thread `tid` every signal but those the processor
/// raises (blocked, a fault would reset its handler: design/engine.md) and
/// SIGKILL/SIGSTOP, while the tool runs the thread for its own purposes (an
/// injection, single steps, a syscall it runs): a signal sent meanwhile
/// stays pending in the kernel, with its own siginfo and only once, and is
/// delivered as usual after [`release_signals`]. Returns the thread's own
/// mask (`None` if it could not be read: nothing is changed then).
pub(super) fn hold_signals(tid: i32) -> Option<u64> {
    let own = sys::get_sigmask(tid).ok()?;
    let mut keep = 0u64;
    for sig in [
        libc::SIGKILL,
        libc::SIGSTOP,
        libc::SIGSEGV,
        libc::SIGBUS,
        libc::SIGFPE,
        libc::SIGILL,
        libc::SIGTRAP,
        libc::SIGSYS,
    ] {
        keep |= 1u64 << (sig - 1);
    }
    sys::set_sigmask(tid, own | !keep).ok()?;
    Some(own)
}

/// Gives thread `tid` its own signal mask back (see [`hold_signals`]).
pub(super) fn release_signals(tid: i32, own: Option<u64>) {
    if let Some(own) = own {
        // A thread that vanished meanwhile needs no mask.
        let _ = sys::set_sigmask(tid, own);
    }
}

/// The status flags a run of checks keeps in RAX (`lahf` into AH: SF,
/// ZF, AF, PF and CF where the flags register has them; `seto` into AL:
/// OF) put back into `eflags`, whose other bits stay.
fn kept_flags(eflags: u64, rax: u64) -> u64 {
    const LAHF_BITS: u64 = 0xd5; // SF ZF AF PF CF
    const OF: u64 = 0x800;
    let ah = (rax >> 8) & LAHF_BITS;
    let of = if rax & 0xff != 0 { OF } else { 0 };
    (eflags & !(LAHF_BITS | OF)) | ah | of
}

/// Signals the processor raises for the instruction that is running.
/// The siginfo of the signal `tid` stands at the delivery stop of, read
/// once into `info` (the stops of steps and breakpoints on the way are
/// SIGTRAP's, and the signal is delivered with this one after them).
fn withheld(tid: i32, info: &mut Option<sys::SigInfo>) -> Result<sys::SigInfo, EngineError> {
    match info {
        Some(i) => Ok(*i),
        None => {
            let read = sys::get_siginfo(tid).map_err(|e| os_err("PTRACE_GETSIGINFO", e))?;
            Ok(*info.insert(read))
        }
    }
}

fn is_synchronous(sig: i32) -> bool {
    matches!(
        sig,
        libc::SIGSEGV | libc::SIGBUS | libc::SIGFPE | libc::SIGILL | libc::SIGTRAP
    )
}

/// Whether thread `tid` has a handler for `sig` (from /proc).
fn has_handler(tid: i32, sig: i32) -> bool {
    let Ok(status) = std::fs::read_to_string(format!("/proc/{tid}/status")) else {
        return false;
    };
    sig >= 1 && status_mask(&status, "SigCgt:") & (1u64 << (sig - 1)) != 0
}

/// A signal mask line (`SigPnd:`, `SigBlk:`, `SigCgt:`...) of a
/// `/proc/.../status` text; 0 if it is missing.
fn status_mask(status: &str, key: &str) -> u64 {
    status
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::kept_flags;

    #[test]
    fn kept_flags_come_back_from_ah_and_al() {
        // AH as `lahf` leaves it with ZF and CF set (bit 1 always reads 1),
        // AL 1 from `seto`; the guest's IF (0x200) and TF stay as they are.
        let rax = 0x1234_0000_0000_4301;
        assert_eq!(kept_flags(0x202 | 0x8d5, rax), 0x202 | 0x41 | 0x800);
        assert_eq!(kept_flags(0x202, 0x0000), 0x202);
        assert_eq!(kept_flags(0x202, 0xd500), 0x202 | 0xd5);
    }
}
