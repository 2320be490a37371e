//! A new image after `execve`: the old address space's bookkeeping goes,
//! and the new one is either let go to run natively (not followed, or not
//! x86-64) or taken over: the core region and a thread area are mapped
//! through syscalls injected into the client (using its entry point as a
//! gadget for the first one, since nothing of ours is mapped yet), the
//! syscall-interest table is written, the entry block is translated and the
//! client starts on it.

use super::inject::Injection;
use super::launch::is_x86_64_elf;
use super::{cont_syscall, get_regs, set_regs, syscalls, wait_for, Tracer};
use crate::client_mem::{ClientMemory, ProcMemory};
use crate::emit::Emitter;
use crate::layout::{self, CORE_CANDIDATES, CORE_SIZE};
use crate::space::{Space, Tracing};
use crate::sys::{self, WaitStatus};
use crate::translate::TraceMode;
use crate::{EngineError, Outcome};
use std::cell::RefCell;
use std::collections::HashMap;
use std::path::Path;
use std::rc::Rc;

impl Tracer<'_> {
    /// `PTRACE_EVENT_EXEC` of a traced task.
    pub(super) fn on_exec(&mut self, pid: i32) -> Result<(), EngineError> {
        // Not followed: without --trace-children, a program the caller
        // skips (--trace-children-skip), or not ours to follow (another
        // architecture's program runs natively, like an unfollowed child).
        let follow = self.cfg.trace_children
            && is_x86_64_elf(Path::new(&format!("/proc/{pid}/exe")))
            && !self.skips_exec(pid);
        // The old image is gone (and, as under Valgrind, its counts with it).
        if let Some(old) = self.tasks.get(&pid).map(|t| t.tgid) {
            if let Some(p) = self.procs.remove(&old) {
                p.space.borrow().discard_trace();
                for t in p.threads {
                    self.tasks.remove(&t);
                }
            }
        }
        if !follow {
            let _ = sys::detach(pid, 0);
            if pid == self.main_pid {
                self.outcome = Some(Outcome::Untraced);
            }
            return Ok(());
        }
        self.take_over_exec(pid)
    }

    /// Steps a task stopped inside `execve` to the syscall-exit stop (the
    /// new image is mapped only then), sets up its address space and
    /// resumes it in translated code.
    pub(super) fn take_over_exec(&mut self, pid: i32) -> Result<(), EngineError> {
        cont_syscall(pid)?;
        match wait_for(pid)? {
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

    /// Maps the core region into a freshly exec'd process stopped at its
    /// execve syscall-exit, and starts it on translated code.
    fn setup_exec(&mut self, pid: i32) -> Result<(), EngineError> {
        let regs = get_regs(pid)?;
        let mut mem = ProcMemory::open(pid)?;
        // The entry point is the gadget until the core region has one.
        let gadget = Emitter::injection_gadget();
        let saved = mem.read(regs.rip, gadget.len())?;
        mem.write(regs.rip, &gadget);
        mem.flush()?;
        let mut inj = Injection::new(pid, regs.rip, regs);
        let mut core = None;
        for &cand in &CORE_CANDIDATES {
            const PROT: u64 = (libc::PROT_READ | libc::PROT_WRITE | libc::PROT_EXEC) as u64;
            const FLAGS: u64 =
                (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE) as u64;
            let r = inj.syscall(
                syscalls::MMAP as u64,
                [cand, CORE_SIZE, PROT, FLAGS, u64::MAX, 0],
            )?;
            inj.base = get_regs(pid)?;
            if r as u64 == cand {
                // The indirect-branch table's home buckets are read at
                // random by every lookup (4 MB, a thousand 4 KB pages):
                // huge pages spare those reads a TLB miss. A hint.
                let hot = (layout::HTAB + layout::HTAB_SETS * 64).next_multiple_of(2 << 20);
                inj.syscall(
                    libc::SYS_madvise as u64,
                    [cand, hot, libc::MADV_HUGEPAGE as u64, 0, 0, 0],
                )?;
                inj.base = get_regs(pid)?;
                core = Some(cand);
                break;
            }
        }
        mem.write(regs.rip, &saved);
        mem.flush()?;
        let core = core.ok_or_else(|| {
            EngineError("cannot map the engine's core region below 2 GiB in the client".into())
        })?;
        mem.write(core + layout::GADGET, &gadget);
        mem.write(core + layout::PATCH_GADGET, &Emitter::patch_gadget());
        let mut stub = Emitter::new(core + layout::SIGRETURN_STUB);
        stub.sigreturn_stub((core + layout::HTAB) as u32);
        debug_assert!(layout::SIGRETURN_STUB + stub.bytes.len() as u64 <= layout::CALL_RETURN_STUB);
        mem.write(core + layout::SIGRETURN_STUB, &stub.bytes);
        mem.write(
            core + layout::CALL_RETURN_STUB,
            &Emitter::call_return_stub(),
        );
        let mut space = Space::new(Box::new(mem), core);
        space.publish_core_stub(core + layout::CALL_RETURN_STUB);
        space.count_lookups = self.cfg.stats;
        // --instr-at-start=no: each new image starts uninstrumented.
        space.set_instrumented(self.cfg.requests.instr_at_start);
        space.smc_check = self.cfg.smc_check;
        space.stack_pointer = regs.rsp;
        if let (Some(factory), Some(consumer)) = (&self.cfg.tool, &self.consumer) {
            let tool = factory();
            let needs = tool.needs();
            if needs.any() {
                let mode = TraceMode {
                    data: needs.data_refs || needs.instr_fetches,
                    sp: needs.calls_returns,
                    filter: needs.mru_filter.and_then(crate::translate::filter_geometry),
                    branches: needs.cond_branches || needs.indirect_targets,
                };
                space.set_tracing(Tracing::new(mode, consumer.link(tool)));
            }
        }
        // Calls and returns (and filtered records, whose accesses resume
        // after a handler) are traced with a marker at each handler's
        // start and return, which the tool writes: there every
        // rt_sigreturn comes to the tool.
        let tool_sigreturn = space.marks_signals();
        space
            .mem()
            .write(core + layout::SYSTAB, &interest_table(tool_sigreturn));
        inj.gadget = core + layout::GADGET;
        if let Some(c) = &self.cfg.contexts {
            // (Its mapping is injected through the core's gadget.)
            let contexts = setup_contexts(space.mem(), core, c, &mut inj)?;
            space.set_contexts(contexts);
        }
        let area = space.alloc_area(&mut inj.injector())?;
        let body = space.ensure(regs.rip, &mut inj.injector())?;
        self.requeue_signals(pid, inj);
        let mut fin = regs;
        fin.rip = body;
        fin.gs_base = area;
        fin.orig_rax = u64::MAX;
        set_regs(pid, &fin)?;
        self.add_process(pid, Rc::new(RefCell::new(space)), HashMap::new(), area);
        Ok(())
    }
}

/// Contexts mode's part of the core region (the runtime blob, its stub and
/// their addresses, the configuration) and the process's facts table.
fn setup_contexts(
    mem: &mut dyn crate::client_mem::ClientMemory,
    core: u64,
    cfg: &crate::ContextsConfig,
    inj: &mut Injection,
) -> Result<crate::space::Contexts, EngineError> {
    use crate::space::{runtime_config, Contexts, FACTS_CAPACITY};
    const PROT: u64 = (libc::PROT_READ | libc::PROT_WRITE) as u64;
    const FLAGS: u64 = (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE) as u64;
    let len = FACTS_CAPACITY * (ctxrt::FACT_WORDS as u64) * 8;
    mem.flush()?;
    // Asked for far from where the kernel puts the client's own mappings,
    // which then land where they land natively (their order shows in
    // what the program does, ld.so's sorting of its objects for one).
    let hint = layout::FACTS_HINT;
    let facts = inj.syscall(syscalls::MMAP as u64, [hint, len, PROT, FLAGS, u64::MAX, 0])?;
    if facts < 0 {
        return Err(EngineError(format!(
            "cannot map the calling-context table in the client: {}",
            std::io::Error::from_raw_os_error(-facts as i32)
        )));
    }
    let blob = core + layout::RT_BLOB;
    let image = crate::runtime::image_at(blob);
    if layout::RT_BLOB + image.len() as u64 > layout::HTAB {
        return Err(EngineError(
            "the calling-context runtime does not fit the core region".into(),
        ));
    }
    mem.write(blob, &image);
    let (xmm, _) = crate::runtime::vector_registers();
    let mut stub = Emitter::new(core + layout::RT_STUB);
    // The inline fast paths first, then the runtime stub they fall into.
    let fast = crate::emit::FastEntry {
        facts: facts as u64,
        blocks: FACTS_CAPACITY,
        separate_recs: cfg.separate_recs,
    };
    // (Tagged counting has no inline fast paths yet: they work on contexts
    // mode's nodes.)
    let exit_windows = if cfg.tagged {
        [0..0, stub.runtime_stub(core, &xmm)]
    } else {
        stub.context_entry_stub(core, &xmm, fast)
    };
    debug_assert!(layout::RT_STUB + (stub.bytes.len() as u64) < layout::RT_BLOB);
    mem.write(core + layout::RT_STUB, &stub.bytes);
    mem.write(
        core + layout::RT_STUB_PTR,
        &(core + layout::RT_STUB).to_le_bytes(),
    );
    let entry = blob + crate::runtime::ENTRY;
    mem.write(core + layout::RT_ENTRY_PTR, &entry.to_le_bytes());
    let config: Vec<u8> = runtime_config(facts as u64, cfg.separate_recs, cfg.flat, cfg.tagged)
        .iter()
        .flat_map(|w| w.to_le_bytes())
        .collect();
    mem.write(core + layout::RT_CONFIG, &config);
    Ok(Contexts::new(
        (cfg.classifier)(),
        facts as u64,
        exit_windows,
        cfg.tagged,
        cfg.separate_recs,
        cfg.count_inline,
    ))
}

/// The syscall-interest table: one byte per syscall number, for those
/// translated code hands to the tool [`layout::SYSTAB_TOOL`];
/// `rt_sigreturn` goes to the client's own stub unless `tool_sigreturn`.
fn interest_table(tool_sigreturn: bool) -> Vec<u8> {
    let mut systab = vec![layout::SYSTAB_NATIVE; 0x1_0000];
    for nr in syscalls::INTERCEPTED {
        systab[nr] = layout::SYSTAB_TOOL;
    }
    if !tool_sigreturn {
        systab[syscalls::RT_SIGRETURN] = layout::SYSTAB_SIGRETURN;
    }
    systab
}
