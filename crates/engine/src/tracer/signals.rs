//! Signals. The kernel delivers them natively; what the engine adds: a
//! handler the client installs with rt_sigaction is replaced by a
//! trampoline into its translation (and the client reads back its own
//! values), and since the translated handler reuses the thread's spill
//! slots, the interrupted code's slots are saved at delivery and restored
//! at the handler's rt_sigreturn.

use super::inject::Injection;
use super::{cont_syscall, debug_enabled, get_regs, set_regs, syscalls, wait_for, Tracer};
use crate::layout;
use crate::sys::{self, Regs, WaitStatus};
use crate::EngineError;

/// Offset in the thread area of scratch memory for a rewritten sigaction.
const SIGACTION_SCRATCH: u64 = 0x800;
/// Most spill sets kept per thread (handlers that longjmp'd out never
/// return).
const MAX_NESTED: usize = 64;

impl Tracer<'_> {
    /// A signal-delivery stop (or a new task's first stop).
    pub(super) fn on_signal(&mut self, tid: i32, sig: i32) -> Result<(), EngineError> {
        if !self.tasks.contains_key(&tid) {
            return self.on_unknown_task_stop(tid, sig);
        }
        if has_handler(tid, sig) {
            // The kernel runs our trampoline, which enters the translated
            // handler.
            self.save_spills(tid)?;
            if debug_enabled() || std::env::var_os("CACHESCOPE_ENGINE_DEBUG_SIGNALS").is_some() {
                self.log_delivery(tid, sig)?;
            }
        }
        // No handler: the default action (or ignoring) happens as natively.
        self.resume(tid, sig)?;
        Ok(())
    }

    /// Keeps the interrupted code's spill slots until the handler's
    /// rt_sigreturn.
    fn save_spills(&mut self, tid: i32) -> Result<(), EngineError> {
        let space = self.space_of(tid).expect("known task");
        let task = self.tasks.get_mut(&tid).expect("known task");
        let saved = space
            .borrow_mut()
            .mem()
            .read(task.area, layout::SPILL_BYTES as usize)?;
        if task.sig_spills.len() >= MAX_NESTED {
            // Handlers that longjmp'd out never returned: forget the oldest.
            task.sig_spills.remove(0);
        }
        task.sig_spills.push(saved);
        Ok(())
    }

    fn log_delivery(&self, tid: i32, sig: i32) -> Result<(), EngineError> {
        let space = self.space_of(tid).expect("known task");
        let r = get_regs(tid)?;
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
        Ok(())
    }

    /// `rt_sigreturn` (syscall `sysno`) from translated code stopped with
    /// `regs`: leaving a handler, the interrupted code's spills come back,
    /// and the sigreturn is issued from the site's native `syscall` as a
    /// syscall of its own.
    pub(super) fn on_sigreturn(
        &mut self,
        tid: i32,
        mut regs: Regs,
        sysno: u64,
    ) -> Result<(), EngineError> {
        let space = self.space_of(tid).expect("known task");
        let site = space
            .borrow()
            .syscall_site(regs.rip)
            .ok_or_else(|| EngineError(format!("unknown syscall site at {:#x}", regs.rip)))?;
        if let Some(saved) = self.tasks.get_mut(&tid).and_then(|t| t.sig_spills.pop()) {
            space.borrow_mut().mem().write(regs.gs_base, &saved);
        }
        regs.rip = site.stop_rip + 2;
        regs.rax = sysno;
        regs.orig_rax = u64::MAX;
        set_regs(tid, &regs)?;
        self.resume(tid, 0)?;
        Ok(())
    }

    /// `rt_sigaction(sig, act, oldact)`: a handler is replaced by a
    /// trampoline into its translation; the client always reads back its own
    /// values in `oldact`.
    pub(super) fn on_sigaction(&mut self, tid: i32, regs: Regs) -> Result<(), EngineError> {
        let space = self.space_of(tid).expect("known task");
        let tgid = self.tasks[&tid].tgid;
        let site = space
            .borrow()
            .syscall_site(regs.rip)
            .ok_or_else(|| EngineError(format!("unknown syscall site at {:#x}", regs.rip)))?;
        let (sig, act, oldact) = (regs.rdi as i32, regs.rsi, regs.rdx);
        let mut change: Option<Option<u64>> = None;
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
                    change = Some(Some(handler));
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
        cont_syscall(tid)?;
        loop {
            match wait_for(tid)? {
                WaitStatus::Syscall(_) => break,
                WaitStatus::Stopped(_, sg) => {
                    self.requeue.push((tgid, tid, sg));
                    cont_syscall(tid)?;
                }
                WaitStatus::Exited(..) | WaitStatus::Signaled(..) => {
                    self.on_thread_exit(tid);
                    return Ok(());
                }
                WaitStatus::Event(..) => cont_syscall(tid)?,
            }
        }
        let mut out = get_regs(tid)?;
        if out.rax == 0 {
            let proc = self.procs.get_mut(&tgid).expect("known process");
            if oldact != 0 {
                if let Some(&h) = proc.handlers.get(&sig) {
                    space.borrow_mut().mem().write(oldact, &h.to_le_bytes());
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
