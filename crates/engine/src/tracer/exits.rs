//! The exits of translated code to the tool, all magic syscalls stopped by
//! seccomp: an unlinked direct branch (its target is translated and the
//! branch linked), an indirect-branch lookup miss (the target is translated
//! and published in the table), a client request (see `requests`), a
//! block whose guest code changed (its translations are dropped and it is
//! translated again), and a guest syscall that the interest table
//! marks (the mmap family first drops translations of code that goes away
//! or may change, rseq is refused, GS base writes are refused, the rest run
//! for real from the stop; signal syscalls go to `signals`). Code and table
//! entries that other threads may be running are patched by the stopped
//! thread itself before it resumes.

use super::inject::Injection;
use super::{debug_enabled, get_regs, set_regs, syscalls, Tracer};
use crate::emit::FLUSH_AT;
use crate::layout;
use crate::space::Space;
use crate::sys::Regs;
use crate::EngineError;

/// arch_prctl's code for setting the GS base.
const ARCH_SET_GS: u64 = 0x1001;

impl Tracer<'_> {
    /// A magic-syscall stop of translated code.
    pub(super) fn on_magic(&mut self, tid: i32) -> Result<(), EngineError> {
        let space = self
            .space_of(tid)
            .ok_or_else(|| EngineError(format!("magic stop from unknown thread {tid}")))?;
        let mut regs = get_regs(tid)?;
        let nr = regs.orig_rax as u32;
        space.borrow_mut().stats.count_exit(nr);
        // One read for every slot an exit may need (each read of client
        // memory is a system call).
        let spills = Spills::read(&mut space.borrow_mut(), regs.gs_base)?;
        if nr == layout::MAGIC_REQUEST {
            return self.on_request(tid, space, regs, &spills);
        }
        if nr == layout::MAGIC_CALL_RETURN {
            return self.end_native_call(tid, &regs);
        }
        if nr == layout::MAGIC_SYSCALL {
            let sysno = spills.rax;
            if debug_enabled() {
                eprintln!(
                    "[engine] tid {tid} syscall {sysno} at {:#x} rsp {:#x}",
                    regs.rip, regs.rsp
                );
            }
            match sysno as usize {
                syscalls::RT_SIGACTION => return self.on_sigaction(tid, regs),
                syscalls::RT_SIGRETURN => return self.on_sigreturn(tid, regs, sysno),
                syscalls::VFORK | syscalls::CLONE | syscalls::CLONE3 => {
                    return self.on_fork_syscall(tid, regs, sysno)
                }
                syscalls::MMAP => self.executable_file_mapped(tid, &regs),
                _ => {}
            }
        }
        let gadget = space.borrow().core + layout::GADGET;
        let mut inj = Injection::new(tid, gadget, regs);
        {
            let mut sp = space.borrow_mut();
            sp.mem().set_multi(self.threads_sharing(&space) > 1);
            if debug_enabled() {
                eprintln!(
                    "[engine] tid {tid} exit {:#x} rip {:#x} target {:#x}",
                    nr.wrapping_sub(layout::MAGIC_LINK),
                    regs.rip,
                    spills.target
                );
            }
            // (Code on this thread's stack is what --smc-check=stack checks.)
            sp.stack_pointer = regs.rsp;
            answer_exit(&mut sp, &mut inj, &mut regs, nr, &spills)?;
            for module in sp.take_new_modules() {
                self.sink.module_seen(&module);
            }
        }
        let patches = space.borrow_mut().mem().take_live();
        if !patches.is_empty() {
            inj.apply_live_patches(&mut space.borrow_mut(), &patches)?;
        }
        let tgid = self.tasks.get(&tid).map_or(tid, |t| t.tgid);
        self.requeue_signals(tgid, inj);
        set_regs(tid, &regs)?;
        self.resume(tid, 0)?;
        // A flush's records are read while the thread runs on.
        space.borrow_mut().hand_over_pending();
        Ok(())
    }

    /// A guest `mmap` about to map a file executable: the sink hears of
    /// the file now, before any of its code runs (ld.so maps a library,
    /// relocates every library, and only then runs their code), so that
    /// it can start reading the object while the client goes on.
    fn executable_file_mapped(&mut self, tid: i32, regs: &Regs) {
        let (prot, fd) = (regs.rdx, regs.r8 as i32);
        if prot & libc::PROT_EXEC as u64 == 0 || fd < 0 {
            return;
        }
        if let Ok(path) = std::fs::read_link(format!("/proc/{tid}/fd/{fd}")) {
            self.sink.executable_file_mapped(&path);
        }
    }
}

/// The spill slots an exit reads (`layout::S_RAX` to `S_TARGET`).
pub(super) struct Spills {
    pub(super) rax: u64,
    rcx: u64,
    r11: u64,
    pub(super) target: u64,
}

impl Spills {
    /// The slots of the thread whose area is `area`, in one read.
    pub(super) fn read(sp: &mut Space, area: u64) -> Result<Spills, EngineError> {
        const _: () = assert!(
            layout::S_RAX == 0
                && layout::S_RCX == 8
                && layout::S_R11 == 16
                && layout::S_TARGET == 24
        );
        let b = sp.mem().read(area, 32)?;
        let word = |i: usize| u64::from_le_bytes(b[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
        Ok(Spills {
            rax: word(0),
            rcx: word(1),
            r11: word(2),
            target: word(3),
        })
    }
}

/// Answers exit `nr` of translated code stopped with `regs`, which become
/// the registers to resume with.
fn answer_exit(
    sp: &mut Space,
    inj: &mut Injection,
    regs: &mut Regs,
    nr: u32,
    spills: &Spills,
) -> Result<(), EngineError> {
    match nr {
        layout::MAGIC_LINK => {
            let (target, skip) = sp
                .stub_target(regs.rip)
                .ok_or_else(|| EngineError(format!("unknown exit stub at {:#x}", regs.rip)))?;
            let body = sp.ensure(target, &mut inj.injector())?;
            enter_block(regs, body + skip, spills);
            Ok(())
        }
        layout::MAGIC_MISS => {
            let target = spills.target;
            let body = sp.ensure(target, &mut inj.injector())?;
            sp.publish(target);
            enter_block(regs, body, spills);
            Ok(())
        }
        layout::MAGIC_SMC => {
            // A block's code changed since its translation: translate what
            // is there now and run that instead.
            let target = spills.target;
            sp.code_changed(target);
            let body = sp.ensure(target, &mut inj.injector())?;
            enter_block(regs, sp.retranslated_entry(body), spills);
            Ok(())
        }
        layout::MAGIC_SYSCALL => on_syscall(sp, regs, spills.rax),
        layout::MAGIC_FLUSH => {
            // RAX, RCX and R11 first: the syscall clobbered the last two,
            // and the record's register may be one of them.
            enter_block(regs, regs.rip, spills);
            flush(sp, regs, spills.target)
        }
        layout::MAGIC_RUNTIME => Err(EngineError(match spills.target {
            1 => "the calling-context runtime's arena is full (a thread has more \
                  contexts than 8 GiB holds)"
                .into(),
            code => format!("the calling-context runtime failed (code {code})"),
        })),
        _ => Err(EngineError(format!(
            "unexpected engine syscall {nr:#x} at {:#x}",
            regs.rip
        ))),
    }
}

/// The field of `regs` holding 64-bit general-purpose register `r`.
pub(super) fn gpr(regs: &mut Regs, r: iced_x86::Register) -> &mut u64 {
    use iced_x86::Register as R;
    match r {
        R::RAX => &mut regs.rax,
        R::RBX => &mut regs.rbx,
        R::RCX => &mut regs.rcx,
        R::RDX => &mut regs.rdx,
        R::RSI => &mut regs.rsi,
        R::RDI => &mut regs.rdi,
        R::RBP => &mut regs.rbp,
        R::RSP => &mut regs.rsp,
        R::R8 => &mut regs.r8,
        R::R9 => &mut regs.r9,
        R::R10 => &mut regs.r10,
        R::R11 => &mut regs.r11,
        R::R12 => &mut regs.r12,
        R::R13 => &mut regs.r13,
        R::R14 => &mut regs.r14,
        R::R15 => &mut regs.r15,
        other => unreachable!("not a 64-bit GPR: {other:?}"),
    }
}

/// Continues at the translated block `body` with the registers the exit
/// spilled.
pub(super) fn enter_block(regs: &mut Regs, body: u64, spills: &Spills) {
    regs.rip = body;
    regs.rax = spills.rax;
    regs.rcx = spills.rcx;
    regs.r11 = spills.r11;
    regs.orig_rax = u64::MAX;
}

/// A buffer check's flush, `target` what the check left in `S_TARGET`, for
/// a thread whose registers (`regs`) are the block's: the thread goes on
/// where the check resumes, in its next buffer (at its flush stub's exit,
/// or where a signal found it on the way there: `Tracer::close_record`).
pub(super) fn flush(sp: &mut Space, regs: &mut Regs, target: u64) -> Result<(), EngineError> {
    if target & FLUSH_AT != 0 {
        // An append's own check (a counted block without one on entry):
        // everything below the write pointer is complete; the thread goes
        // on at the append's load.
        regs.rip = target & !FLUSH_AT;
        sp.flush_whole_trace(regs.gs_base)?;
        return Ok(());
    }
    let site = sp
        .flush_site(target as u32)
        .ok_or_else(|| EngineError(format!("unknown trace flush site {target}")))?;
    regs.rip = site.resume;
    if site.kept {
        // The register holds the write pointer, read again after.
        sp.flush_trace(regs.gs_base, None)?;
    } else {
        let record = *gpr(regs, site.record_reg);
        let moved = sp.flush_trace(regs.gs_base, Some(record))?;
        *gpr(regs, site.record_reg) = moved;
    }
    Ok(())
}

/// An intercepted guest syscall (other than the signal ones): answered here
/// or run for real from the stop, as a native `syscall` would.
fn on_syscall(sp: &mut Space, regs: &mut Regs, sysno: u64) -> Result<(), EngineError> {
    let site = sp.syscall_site(regs.rip)?;
    regs.rcx = site.guest_next;
    match sysno as usize {
        syscalls::RSEQ => {
            // As under Valgrind: no rseq, glibc falls back.
            regs.rax = (-libc::ENOSYS) as i64 as u64;
            regs.orig_rax = u64::MAX;
            return Ok(());
        }
        syscalls::ARCH_PRCTL if regs.rdi == ARCH_SET_GS => {
            return Err(EngineError(
                "the client sets its GS base (arch_prctl ARCH_SET_GS), which the engine uses; not supported"
                    .into(),
            ));
        }
        syscalls::MMAP | syscalls::MPROTECT | syscalls::MUNMAP | syscalls::MREMAP => {
            // Code that goes away (dlclose) or may change loses its
            // translations first.
            let page = 4095;
            let start = regs.rdi & !page;
            let end = regs.rdi.saturating_add(regs.rsi).saturating_add(page) & !page;
            let drops = match sysno as usize {
                syscalls::MMAP => regs.r10 & libc::MAP_FIXED as u64 != 0,
                syscalls::MPROTECT => {
                    regs.rdx & libc::PROT_EXEC as u64 == 0
                        || regs.rdx & libc::PROT_WRITE as u64 != 0
                }
                _ => true,
            };
            if drops {
                sp.invalidate(start, end);
            }
        }
        _ => {}
    }
    // Run it for real, right here.
    regs.orig_rax = sysno;
    regs.rax = sysno;
    Ok(())
}
