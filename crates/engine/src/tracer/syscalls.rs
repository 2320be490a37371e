//! The client's syscall numbers (x86-64 ABI) that the tracer acts on.
//!
//! [`INTERCEPTED`] is the contents of the syscall-interest table that
//! translated code consults before each guest `syscall`: those come to the
//! tool as magic-syscall exits (see `exits` and `signals`), every other
//! syscall runs natively in place. Keeping the list next to the numbers
//! keeps the table and the dispatch of those exits in step.

pub(super) const MMAP: usize = 9;
pub(super) const MPROTECT: usize = 10;
pub(super) const MUNMAP: usize = 11;
pub(super) const RT_SIGACTION: usize = 13;
pub(super) const RT_SIGRETURN: usize = 15;
pub(super) const MREMAP: usize = 25;
pub(super) const CLONE: usize = 56;
pub(super) const VFORK: usize = 58;
pub(super) const EXECVE: usize = 59;
pub(super) const ARCH_PRCTL: usize = 158;
pub(super) const EXECVEAT: usize = 322;
pub(super) const RSEQ: usize = 334;
pub(super) const CLONE3: usize = 435;

/// The syscalls translated code hands to the tool: the exec family (run
/// from that stop, then followed at `PTRACE_EVENT_EXEC`), the mmap family
/// (code that goes away loses its translations), signal handlers
/// (trampolines into translated code), rseq (refused, as under Valgrind),
/// arch_prctl (the GS base is the engine's) and the vfork family (made
/// into forks, as under Valgrind: see `tasks`).
pub(super) const INTERCEPTED: [usize; 13] = [
    MMAP,
    MPROTECT,
    MUNMAP,
    MREMAP,
    RT_SIGACTION,
    RT_SIGRETURN,
    EXECVE,
    EXECVEAT,
    ARCH_PRCTL,
    RSEQ,
    VFORK,
    CLONE,
    CLONE3,
];
