//! Running code in a stopped client thread, the tool's only way to act
//! inside the client: a syscall through the injection gadget (memory for
//! code-cache chunks and thread areas must be mapped by the client itself),
//! or a batch of atomic stores through the patch gadget (code and table
//! entries that other threads may be running must never be seen half
//! written).
//!
//! The thread must be at a stop from which new registers take effect (a
//! seccomp stop, a syscall-exit stop or a signal stop); it is left at the
//! magic stop after the gadget, and its caller sets its registers again.
//! The thread's asynchronous signals are blocked meanwhile (they stay
//! pending in the kernel); one already on its way is held back and re-sent
//! when the thread resumes.

use super::signals::{hold_signals, release_signals};
use super::{cont, debug_enabled, get_regs, os_err, set_regs, Tracer};
use crate::client_mem::LivePatch;
use crate::layout;
use crate::space::Space;
use crate::sys::{self, Regs, WaitStatus};
use crate::EngineError;

/// Injections into one stopped thread.
pub(super) struct Injection {
    tid: i32,
    /// Address of the injection gadget (`Emitter::injection_gadget`).
    pub(super) gadget: u64,
    /// The thread's registers to run the gadget with (RIP and the
    /// syscall's registers replaced).
    pub(super) base: Regs,
    /// Signals that arrived meanwhile, with their siginfo.
    signals: Vec<(i32, Option<sys::SigInfo>)>,
}

impl Injection {
    pub(super) fn new(tid: i32, gadget: u64, base: Regs) -> Injection {
        Injection {
            tid,
            gadget,
            base,
            signals: Vec::new(),
        }
    }

    /// Runs `nr(args)` in the thread; returns the syscall's result.
    pub(super) fn syscall(&mut self, nr: u64, args: [u64; 6]) -> Result<i64, EngineError> {
        let mut r = self.base;
        r.rip = self.gadget;
        r.rax = nr;
        r.orig_rax = u64::MAX;
        r.rdi = args[0];
        r.rsi = args[1];
        r.rdx = args[2];
        r.r10 = args[3];
        r.r8 = args[4];
        r.r9 = args[5];
        if debug_enabled() {
            eprintln!("[engine] inject {nr} {args:x?} via {:#x}", self.gadget);
        }
        let out = self.run_gadget(&r)?;
        Ok(out.rdi as i64)
    }

    /// [`Injection::syscall`] in the shape `Space` asks for.
    pub(super) fn injector(
        &mut self,
    ) -> impl FnMut(u64, [u64; 6]) -> Result<i64, EngineError> + '_ {
        |nr, args| self.syscall(nr, args)
    }

    /// Applies `patches` (address, value, size) with atomic stores made by
    /// the thread itself, through the patch gadget (see
    /// `Emitter::patch_gadget`).
    pub(super) fn apply_live_patches(
        &mut self,
        space: &mut Space,
        patches: &[LivePatch],
    ) -> Result<(), EngineError> {
        let list = self.base.gs_base + layout::AREA_PATCHES;
        for batch in patches.chunks(layout::MAX_PATCHES) {
            let mut bytes = Vec::with_capacity(batch.len() * 24);
            for &(addr, value, size) in batch {
                bytes.extend_from_slice(&addr.to_le_bytes());
                bytes.extend_from_slice(&value.to_le_bytes());
                bytes.extend_from_slice(&u64::from(size).to_le_bytes());
            }
            space.mem().write(list, &bytes);
            space.mem().flush()?;
            let mut r = self.base;
            r.rip = space.core + layout::PATCH_GADGET;
            r.rdi = list;
            r.rsi = batch.len() as u64;
            r.orig_rax = u64::MAX;
            self.run_gadget(&r)?;
        }
        Ok(())
    }

    /// Runs the thread with registers `r` until the gadget there makes its
    /// MAGIC_INJECT syscall; returns the registers at that stop.
    fn run_gadget(&mut self, r: &Regs) -> Result<Regs, EngineError> {
        let held = hold_signals(self.tid);
        let regs = self.run_gadget_held(r);
        release_signals(self.tid, held);
        regs
    }

    /// [`Injection::run_gadget`] with the asynchronous signals held.
    fn run_gadget_held(&mut self, r: &Regs) -> Result<Regs, EngineError> {
        let tid = self.tid;
        set_regs(tid, r)?;
        cont(tid)?;
        loop {
            let Some(status) = sys::wait_pid_or_gone(tid).map_err(|e| os_err("waitpid", e))? else {
                return Err(vanished(tid));
            };
            match status {
                WaitStatus::Event(_, libc::PTRACE_EVENT_SECCOMP) => break,
                WaitStatus::Stopped(_, sig) => {
                    self.signals.push((sig, sys::get_siginfo(tid).ok()));
                    cont(tid)?;
                }
                // Killed while running the gadget (another thread's
                // exit_group, a fatal signal): left at its exit stop for
                // the event loop, which handles its exit (continuing it
                // and waiting here would wait for ever on a leader).
                WaitStatus::Event(_, libc::PTRACE_EVENT_EXIT)
                | WaitStatus::Exited(..)
                | WaitStatus::Signaled(..) => return Err(vanished(tid)),
                _ => cont(tid)?,
            }
        }
        get_regs(tid)
    }
}

/// What an injection returns when its thread is killed meanwhile.
const VANISHED: &str = "the client's thread exited while the tool worked in it: ";

/// The error of an injection into `tid`, which was killed meanwhile (see
/// [`vanished_thread`]).
pub(super) fn vanished(tid: i32) -> EngineError {
    EngineError(format!("{VANISHED}{tid}"))
}

/// The thread an error says was killed during an injection: the operation
/// it was for is moot (the process is going), and its exit is handled
/// instead.
pub(super) fn vanished_thread(e: &EngineError) -> Option<i32> {
    e.0.strip_prefix(VANISHED)?.parse().ok()
}

impl Tracer<'_> {
    /// Queues the signals held back during `inj` (a thread of process
    /// `tgid`) for the next resume.
    pub(super) fn requeue_signals(&mut self, tgid: i32, inj: Injection) {
        for (sig, info) in inj.signals {
            self.requeue.push((tgid, inj.tid, sig, info));
        }
    }
}
