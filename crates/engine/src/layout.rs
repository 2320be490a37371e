//! Fixed addresses, sizes and offsets shared by the translator (which emits
//! code that uses them) and the tracer (which reads and writes them).
//!
//! The *core region* is one private mapping per client address space, placed
//! below 2 GiB so that emitted code can address it with absolute 32-bit
//! displacements (no register needed):
//!
//! | offset      | size    | contents                                          |
//! |-------------|---------|---------------------------------------------------|
//! | `SYSTAB`    | 64 KiB  | one byte per syscall number (low 16 bits): 1 = the tool wants to see it |
//! | `GADGET`    | 4 KiB   | `syscall; mov rdi, rax; mov eax, MAGIC_INJECT; syscall` for syscall injection |
//! | `HTAB`      | 1 MiB   | indirect-branch table: 65536 × {guest key, host entry} |
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
/// Size of the core region.
pub const CORE_SIZE: u64 = 0x0020_0000;
/// Offset of the syscall-interest table.
pub const SYSTAB: u64 = 0;
/// Offset of the injection gadget.
pub const GADGET: u64 = 0x1_0000;
/// Offset of the indirect-branch hash table.
pub const HTAB: u64 = 0x2_0000;
/// Number of hash-table entries (indexed by the low 16 bits of the target).
pub const HTAB_ENTRIES: u64 = 0x1_0000;
/// Size of one thread area (address space only; pages are touched as used).
pub const AREA_SIZE: u64 = 64 << 20;
/// Offset of the first counter in a thread area.
pub const AREA_COUNTERS: u32 = 4096;

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

/// Exit: an unlinked direct branch (the stub is identified by its address).
pub const MAGIC_LINK: u32 = MAGIC_LO;
/// Exit: indirect-branch lookup miss (target in `S_TARGET`).
pub const MAGIC_MISS: u32 = MAGIC_LO + 1;
/// Exit: a syscall the tool wants to see (number saved in `S_RAX`).
pub const MAGIC_SYSCALL: u32 = MAGIC_LO + 2;
/// Exit: end of an injected syscall (its result in RDI).
pub const MAGIC_INJECT: u32 = MAGIC_LO + 3;

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

/// The injection gadget's bytes.
pub fn gadget_bytes() -> Vec<u8> {
    let mut v = vec![0x0f, 0x05, 0x48, 0x89, 0xc7, 0xb8];
    v.extend_from_slice(&MAGIC_INJECT.to_le_bytes());
    v.extend_from_slice(&[0x0f, 0x05]);
    v
}
