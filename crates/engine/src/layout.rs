//! Fixed addresses, sizes and offsets shared by the translator (which emits
//! code that uses them) and the tracer (which reads and writes them).
//!
//! The *core region* is one private mapping per client address space, placed
//! below 2 GiB so that emitted code can address it with absolute 32-bit
//! displacements (no register needed):
//!
//! | offset      | size    | contents                                          |
//! |-------------|---------|---------------------------------------------------|
//! | `SYSTAB`    | 64 KiB  | one byte per syscall number (low 16 bits): 0 native, 1 the tool's, 2 the `rt_sigreturn` stub |
//! | `GADGET`    | 4 KiB   | `syscall; mov rdi, rax; mov eax, MAGIC_INJECT; syscall` for syscall injection, the patch gadget, the `rt_sigreturn` stub |
//! | `HTAB`      | 20 MiB  | indirect-branch table: 65536 home buckets of 64 bytes, then 262144 overflow buckets |
//!
//! Each client thread has its own *thread area* (a separate private mapping
//! of [`AREA_SIZE`] bytes, reserved lazily) whose address is the thread's GS
//! base: its first page holds the spill slots (`S_*`), then come the
//! thread's 8-byte execution counters from [`AREA_COUNTERS`] on. Per-thread
//! counters need no atomic operations and are exact however threads
//! interleave; the tool adds them up when a thread or process exits.
//!
//! Code-cache *chunks* are separate mappings placed within ±1 GiB of the code
//! they translate (so RIP-relative operands keep 32-bit displacements).

use crate::sys::MAGIC_LO;

/// Preferred base addresses of the core region (first that maps wins).
pub const CORE_CANDIDATES: [u64; 4] = [0x7000_0000, 0x6000_0000, 0x5000_0000, 0x3800_0000];
/// Size of the core region (address space; pages are touched as used).
pub const CORE_SIZE: u64 = 0x0200_0000;
/// Offset of the syscall-interest table.
pub const SYSTAB: u64 = 0;
/// Offset of the injection gadget.
pub const GADGET: u64 = 0x1_0000;
/// Offset of the indirect-branch table: [`HTAB_SETS`] home buckets, then
/// [`HTAB_OVERFLOW_BUCKETS`] overflow buckets (see `ibtable`).
pub const HTAB: u64 = 0x10_0000;
/// Number of home buckets (indexed by the low 16 bits of the target, which
/// one flag-free `movzx` extracts).
pub const HTAB_SETS: u64 = 0x1_0000;
/// Bytes per bucket: [`BUCKET_WAYS`] {guest key, host entry} pairs, the
/// address of the next bucket of the chain (0: none), 8 unused bytes. One
/// cache line.
pub const BUCKET_BYTES: u64 = 64;
/// {key, entry} pairs per bucket.
pub const BUCKET_WAYS: u64 = 3;
/// Ways of the home bucket that translated code checks inline; the probe
/// stub checks the others and the chain.
pub const INLINE_WAYS: u64 = 3;
/// Offset in a bucket of the next-bucket address.
pub const BUCKET_NEXT: u64 = BUCKET_WAYS * 16;
/// Overflow buckets after the home buckets (chained when a home bucket
/// is full, so that aliasing targets never evict each other).
pub const HTAB_OVERFLOW_BUCKETS: u64 = 0x4_0000;
/// Size of one thread area (address space only, `MAP_NORESERVE`; pages are
/// touched as used): the calling-context runtime's arena is its part past
/// [`AREA_ARENA`]. 8 GiB: g++'s cc1plus makes about 5 million contexts,
/// 5.5 GB of arena (1 GiB filled in its first 11 s); the other modes touch
/// the first 32 MiB only.
pub const AREA_SIZE: u64 = 1 << 33;
/// Where thread areas are asked to go (a hint): well away from the code,
/// whose neighbourhood the code-cache chunks need.
pub const AREA_HINT: u64 = 0x10_0000_0000;
/// Offset of the first counter in a thread area.
pub const AREA_COUNTERS: u32 = 0x1_0000;
/// Offset in a thread area of the spill slots of interrupted code, kept
/// while a signal handler runs (which reuses the slots): [`SIGSAVE_LEVELS`]
/// sets of [`SPILL_BYTES`], used as a stack indexed by the nesting depth in
/// [`S_SIG_DEPTH`] modulo the number of sets. The handler's trampoline
/// pushes, its `rt_sigreturn` pops (see `emit::signals`).
pub const AREA_SIGSAVE: u64 = 0x1000;
/// Spill sets kept for nested handlers; a deeper level reuses the oldest
/// (handlers that left with `siglongjmp` never pop theirs).
pub const SIGSAVE_LEVELS: u64 = 64;
/// Offset in a thread area of the list the patch gadget applies: entries
/// of {address, value, size} (8 bytes each), up to [`MAX_PATCHES`].
pub const AREA_PATCHES: u64 = AREA_SIGSAVE + SIGSAVE_LEVELS * SPILL_BYTES;
/// Most entries in one run of the patch gadget.
pub const MAX_PATCHES: usize = ((AREA_COUNTERS as u64 - AREA_PATCHES) / 24) as usize;
/// Offset in the core region of the patch gadget (after the injection one).
pub const PATCH_GADGET: u64 = GADGET + 0x100;
/// Offset in the core region of the `rt_sigreturn` stub (after the patch
/// gadget), which translated code enters for that syscall (its byte in
/// the interest table is [`SYSTAB_SIGRETURN`]).
pub const SIGRETURN_STUB: u64 = GADGET + 0x400;
/// Offset in the core region of the return stub of native client calls
/// (`VALGRIND_NON_SIMD_CALL`): the called function returns there, and it
/// exits with [`MAGIC_CALL_RETURN`], the result in RDX.
pub const CALL_RETURN_STUB: u64 = GADGET + 0xc00;
/// Interest-table byte of a syscall that runs natively.
pub const SYSTAB_NATIVE: u8 = 0;
/// Interest-table byte of a syscall the tool sees (a magic exit).
pub const SYSTAB_TOOL: u8 = 1;
/// Interest-table byte of `rt_sigreturn` when the client handles it
/// itself, through the stub at [`SIGRETURN_STUB`].
pub const SYSTAB_SIGRETURN: u8 = 2;
/// Where the interrupted RIP is in a signal frame, from the stack pointer
/// at its `rt_sigreturn` (the frame's `ucontext`: flags, link, `stack_t`,
/// then the `sigcontext` registers r8-r15, rdi, rsi, rbp, rbx, rdx, rax,
/// rcx, rsp, rip).
pub const FRAME_RIP: u64 = 8 + 8 + 24 + 16 * 8;

/// Slot offset: the client's RAX, saved by emitted code.
pub const S_RAX: u32 = 0;
/// Slot offset: the client's RCX.
pub const S_RCX: u32 = 8;
/// Slot offset: the client's R11.
pub const S_R11: u32 = 16;
/// Slot offset: a branch target passed to the tool on a lookup miss.
pub const S_TARGET: u32 = 24;
/// Slot offset: RCX before a rep-prefixed instruction.
pub const S_RCX0: u32 = 32;
/// Slot offset: the client's RDX.
pub const S_RDX: u32 = 40;
/// Slot offset: the client's value of the register a block borrows in
/// trace mode for its record's address (inside the spill slots, so that a
/// signal handler's blocks do not clobber the interrupted block's).
pub const S_BORROW_R: u32 = 48;
/// Slot offset: the client's value of the register a block borrows in
/// trace mode for computing addresses.
pub const S_BORROW_A: u32 = 56;
/// Slot offset: the client's RAX while filtered trace mode keeps live
/// flags in AH/AL around a check (not `S_RAX`: a flush inside one spills
/// RAX there).
pub const S_KEEP_RAX: u32 = 64;
/// Slot offset: filtered trace mode, a block's straddle routine: the
/// line it keeps (spill slots from here on: a signal handler's blocks
/// must not change an interrupted routine's).
pub const S_KEPT_LINE: u32 = 72;
/// Slot offset: the straddle routine's tag.
pub const S_KEPT_TAG: u32 = 80;
/// Slot offset: where the straddle routine returns to.
pub const S_KEPT_RET: u32 = 88;
/// Bytes of spill slots at the start of a thread area (saved and restored
/// around signal handlers, which reuse them; a power of two).
pub const SPILL_BYTES: u64 = 256;
/// Slot offset: how many signal handlers of the thread have started and
/// not returned (the top of the stack at [`AREA_SIGSAVE`]). Outside the
/// spill slots, which are saved and restored around handlers.
pub const S_SIG_DEPTH: u32 = 0x1c0;
/// Thread-area offset of the `--stats=yes` counter of indirect transfers
/// resolved by the inline lookup (way 0 of the home bucket). Outside the
/// spill slots: a signal handler's return must not roll it back.
pub const S_STAT_INLINE_HITS: u32 = 0x100;
/// Thread-area offset of the count of lookups that went on to the probe
/// stub (inline miss); always counted (the probe is the slow path).
pub const S_STAT_PROBES: u32 = 0x108;
/// Thread-area offset of the count of probes that found their target.
pub const S_STAT_PROBE_HITS: u32 = 0x110;

/// Thread-area offset of the trace buffer's write pointer (trace mode):
/// where the next block record goes. Outside the spill slots: records a
/// signal handler wrote must not be written over after it returns.
pub const S_TRACE_PTR: u32 = 0x118;
/// Thread-area offset of the trace buffer's limit: a block whose record
/// starts at or past it has the buffer flushed ([`TRACE_SLACK`] bytes of
/// room remain after it for the records of the blocks before the check).
pub const S_TRACE_LIMIT: u32 = 0x120;
/// Thread-area offset of 64 bytes where trace mode stores a gather's or
/// scatter's index register to read one lane.
pub const S_VECTOR_SCRATCH: u32 = 0x140;
/// Offset in a thread area of its first trace buffer; the others follow
/// it ([`TRACE_BUFFER`] bytes apart): the thread writes one while the
/// consumer reads the others (in place where the buffers are a memory file
/// shared with the tool, see `handoff`).
pub const AREA_TRACE: u64 = 16 << 20;
/// Trace buffers per thread: the consumer may fall this many less one
/// buffers behind a thread before the thread waits for it.
pub const TRACE_BUFFERS: usize = 4;
/// Bytes from one trace buffer's start to the next's.
pub const TRACE_BUFFER: u64 = TRACE_BYTES + TRACE_SLACK;
/// Offset in a thread area of the filtered trace mode's table of the line
/// each D1 set referenced last (8 bytes per set, [`MRU_MAX_SETS`] at most;
/// zero, like a cold cache's tags, until referenced). Below the trace
/// buffer, where counting mode's counters would be: trace mode has none.
pub const AREA_MRU: u64 = AREA_TRACE - (MRU_MAX_SETS << 3);
/// Most D1 (and I1) sets the filtered trace mode keeps a line for (1 MiB
/// of table).
pub const MRU_MAX_SETS: u64 = 1 << 17;
/// Offset in a thread area of the table of the line each I1 set fetched
/// last (filtered trace mode with fetches filtered), below D1's.
pub const AREA_I1_MRU: u64 = AREA_MRU - (MRU_MAX_SETS << 3);
/// Offset in a thread area of the filtered trace mode's copy of the
/// branch predictor's table of indirect-branch targets (8 bytes per slot,
/// [`BTAC_MAX_ENTRIES`] at most; [`BTAC_UNKNOWN`] in a slot forgotten),
/// below I1's table.
pub const AREA_BTAC: u64 = AREA_I1_MRU - (BTAC_MAX_ENTRIES << 3);
/// Where trace mode's execution counters (from [`AREA_COUNTERS`] up) must
/// end: below the lowest of the filter's tables.
pub const TRACE_COUNTERS_END: u64 = AREA_BTAC;
/// Most slots the copy of the indirect-target table has.
pub const BTAC_MAX_ENTRIES: u64 = 512;
/// A forgotten slot of the indirect-target table's copy: no target a
/// branch that runs can have (not a user address), so the next branch of
/// the slot is told.
pub const BTAC_UNKNOWN: u64 = u64::MAX;
/// Bytes of trace buffer before its limit. Each fill is a flush stop (a
/// ptrace round trip and a hand-over): 4 MiB rather than 1 MiB cut
/// python-json's with cache and branch simulation from 16,600 to 4,200,
/// 1.3-1.4 s of 36-37 s (session 19), for 12 MiB more of memory shared by
/// the client and the tool (counted once in proportional set size).
pub const TRACE_BYTES: u64 = 1 << 22;
/// Room after the limit: a record starting just before the limit fits,
/// and so do the records of a signal handler's blocks up to its own check
/// (each block checks).
pub const TRACE_SLACK: u64 = 1 << 20;
const _: () = assert!(AREA_TRACE + TRACE_BUFFERS as u64 * TRACE_BUFFER <= AREA_SIZE);

/// Exit: an unlinked direct branch (the stub is identified by its address).
pub const MAGIC_LINK: u32 = MAGIC_LO;
/// Exit: indirect-branch lookup miss (target in `S_TARGET`).
pub const MAGIC_MISS: u32 = MAGIC_LO + 1;
/// Exit: a syscall the tool wants to see (number saved in `S_RAX`).
pub const MAGIC_SYSCALL: u32 = MAGIC_LO + 2;
/// Exit: end of an injected syscall (its result in RDI).
pub const MAGIC_INJECT: u32 = MAGIC_LO + 3;
/// Exit: a trace buffer reached its limit (the check site in `S_TARGET`).
pub const MAGIC_FLUSH: u32 = MAGIC_LO + 4;
/// Exit: a client request (Valgrind's magic sequence); the client's RAX,
/// the argument block's address, is in `S_RAX`.
pub const MAGIC_REQUEST: u32 = MAGIC_LO + 5;
/// Exit: a block's self-modifying-code check found its guest code changed
/// (the block's guest address in `S_TARGET`). (`MAGIC_LO + 5` is the
/// client requests'.)
pub const MAGIC_SMC: u32 = MAGIC_LO + 6;
/// Exit: a native client call returned (see [`CALL_RETURN_STUB`]).
pub const MAGIC_CALL_RETURN: u32 = MAGIC_LO + 7;
/// Exit: the calling-context runtime failed (its error code in RAX, the
/// client's in `S_RAX`).
pub const MAGIC_RUNTIME: u32 = MAGIC_LO + 8;

/// Thread-area offset of the calling-context runtime's hot words
/// (`ctxrt::hot`: the current context's counters, the running Ir, the
/// block left last, the arena, the handlers running). Inside the spill
/// slots: a signal handler's trampoline saves them with the slots and its
/// `rt_sigreturn` puts them back, so the interrupted code goes on counting
/// where it counted.
pub const S_CONTEXT_HOT: u32 = 0x60;
const _: () = assert!(S_CONTEXT_HOT as u64 + 8 * ctxrt::hot::WORDS as u64 <= SPILL_BYTES);
/// Spill slot (contexts mode): non-zero while an asynchronous signal
/// waits for the thread to leave the context runtime (its stub or blob),
/// which a handler must not re-enter half-way through an entry; the
/// stub's exits then trap (`int3`) instead of returning, and the tracer
/// delivers the signal from there (`tracer/signals.rs`).
pub const S_SIGNAL_WAITS: u32 = 0xf8;
/// Spill slots (tagged counting): the client's registers while an inline
/// call or return (`emit::tagged`) uses them.
pub const S_TAGGED_RAX: u32 = 0xb0;
/// See [`S_TAGGED_RAX`].
pub const S_TAGGED_RCX: u32 = 0xb8;
/// See [`S_TAGGED_RAX`].
pub const S_TAGGED_RDX: u32 = 0xc0;
/// See [`S_TAGGED_RAX`].
pub const S_TAGGED_R10: u32 = 0xc8;
/// See [`S_TAGGED_RAX`].
pub const S_TAGGED_R11: u32 = 0xd0;
/// See [`S_TAGGED_RAX`].
pub const S_TAGGED_R9: u32 = 0xd8;
/// Spill slot (tagged counting): the guest target of skipped code's
/// indirect jump, which its inline call out compares with the memo's.
pub const S_TAGGED_TARGET: u32 = 0xe0;
/// Spill slot (tagged counting): the calling block's id times
/// `ctxrt::tagged::MEMO_WORDS`, which a direct call's site gives its
/// shared stub.
pub const S_TAGGED_BLOCK: u32 = 0xe8;
/// Spill slot (tagged counting): the callee's function, which a direct
/// call's site gives its shared stub.
pub const S_TAGGED_FUNCTION: u32 = 0xf0;
const _: () = assert!(S_TAGGED_FUNCTION + 8 <= S_SIGNAL_WAITS);
const _: () = assert!(S_TAGGED_RAX >= S_CONTEXT_HOT + 8 * ctxrt::hot::WORDS as u32);
const _: () = assert!(S_SIGNAL_WAITS >= S_CONTEXT_HOT + 8 * ctxrt::hot::WORDS as u32);
const _: () = assert!((S_SIGNAL_WAITS as u64) + 8 <= SPILL_BYTES);
/// Where the process's table of block facts (contexts mode) is asked to
/// go: below the thread areas, away from the code and the client's own
/// mappings.
pub const FACTS_HINT: u64 = 0x0f_0000_0000;
/// Offset in a thread area of the runtime's arena (contexts mode), up to
/// the area's end.
pub const AREA_ARENA: u64 = 32 << 20;
/// Offset in a thread area of the blocks' slots in tagged counting
/// (`ctxrt::tagged`: a tag and an Ir per block id), whose memos and arena
/// follow them ([`AREA_TAGGED_ARENA`]: the runtime finds them from its
/// address).
pub const AREA_SLOTS: u64 = AREA_ARENA;
/// Offset in a thread area of the blocks' memos in tagged counting
/// (`ctxrt::tagged::MEMO_WORDS` per block id), after the slots.
pub const AREA_MEMOS: u64 = AREA_SLOTS + ctxrt::tagged::SLOTS_BYTES;
/// Offset in a thread area of the runtime's arena in tagged counting.
pub const AREA_TAGGED_ARENA: u64 = AREA_MEMOS + ctxrt::tagged::MEMOS_BYTES;
const _: () = assert!(AREA_TAGGED_ARENA < 1 << 31, "slots are within disp32 of GS");
/// Offset in the core region of the runtime's configuration words
/// (`ctxrt::CONFIG_WORDS` of them, before [`RT_STUB_PTR`]).
pub const RT_CONFIG: u64 = 0x2_0000;
/// Offset in the core region of the word holding the runtime stub's
/// address (translated code calls through it: chunks may lie beyond
/// rel32 reach of the core region).
pub const RT_STUB_PTR: u64 = 0x2_0020;
const _: () = assert!(RT_CONFIG + 8 * ctxrt::CONFIG_WORDS as u64 <= RT_STUB_PTR);
/// Offset in the core region of the word holding the blob's entry's
/// address.
pub const RT_ENTRY_PTR: u64 = 0x2_0028;
/// Offset in the core region of the runtime stub.
pub const RT_STUB: u64 = 0x2_1000;
/// Offset in the core region of the runtime blob (up to [`HTAB`]).
pub const RT_BLOB: u64 = 0x3_0000;

/// Size of one code-cache chunk (reserved address space; pages are only
/// touched as they are used).
pub const CHUNK_SIZE: u64 = 64 << 20;
/// Largest distance between a chunk and the code it translates.
pub const CHUNK_REACH: u64 = 1 << 30;
/// Upper bound on the bytes one translated block needs (checked).
pub const MAX_BLOCK_BYTES: u64 = 16 << 10;
/// Upper bound on the guest bytes of one block (64 instructions of at most
/// 15 bytes, or client requests of 19).
pub const MAX_BLOCK_GUEST_BYTES: u64 = 64 * 19;
/// Most guest instructions per translated block.
pub const MAX_BLOCK_INSNS: usize = 64;

/// Valgrind's number for the thread whose area is `area`: 1 for the first
/// thread, then in the order areas were mapped (an exited thread's number
/// is reused, as Valgrind reuses its thread slots).
pub fn valgrind_thread_id(area: u64) -> u64 {
    area.checked_sub(AREA_HINT)
        .filter(|off| off % AREA_SIZE == 0)
        .map_or(1, |off| off / AREA_SIZE + 1)
}
