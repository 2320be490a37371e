//! The calling-context runtime as the client runs it: the entry point of
//! the blob the engine's build script makes of `ctxrt` (see `build.rs`),
//! which the tracer maps into the client's core region. Translated code
//! calls it through the core region's runtime stub (`emit::runtime_stub`)
//! with the System V convention.
//!
//! This is engine low-level code compiled for the client: the only
//! `unsafe` here turns the addresses the stub passes into slices.
#![no_std]
#![no_main]

use ctxrt::tagged::{Tagged, MAX_BLOCKS, MEMOS_BYTES, MEMO_WORDS, SLOTS_BYTES, SLOT_WORDS};
use ctxrt::{hot, Error, Runtime, CONFIG_WORDS, CONTEXTS_TAGGED};

/// What the stub asks: `op` 0 enters block `block` through its context
/// entry with the stack pointer `sp`; 1 grows the counters for it (in
/// tagged counting: retags its slot).
/// `hot` is the thread's hot words, `config` the process's
/// [`CONFIG_WORDS`] runtime configuration words. Returns 0, or an error
/// code the stub reports to the tool (1: the arena is full; 2: a block
/// without facts).
///
/// # Safety
/// `hot` points at the thread's [`hot::WORDS`] hot words, whose
/// [`hot::ARENA`] and [`hot::ARENA_WORDS`] describe the thread's arena;
/// `config` at [`CONFIG_WORDS`] words whose first two describe the facts table. All
/// are mapped for the life of the thread, written only by this thread
/// (the facts table by the tool while the thread is stopped). In tagged
/// counting the thread's memos lie right before its arena, and its slots
/// before them.
#[no_mangle]
pub unsafe extern "sysv64" fn cs_runtime(
    op: u64,
    hot: *mut u64,
    config: *const u64,
    block: u64,
    sp: u64,
) -> u64 {
    // SAFETY: see the function's contract: the hot words and the config
    // words are mapped and sized as stated; the arena and the facts table
    // are distinct mappings of the sizes the words give.
    let (hot, arena, facts, config) = unsafe {
        let hot = core::slice::from_raw_parts_mut(hot, hot::WORDS);
        let arena = core::slice::from_raw_parts_mut(
            hot[hot::ARENA] as *mut u64,
            hot[hot::ARENA_WORDS] as usize,
        );
        let config = core::slice::from_raw_parts(config, CONFIG_WORDS);
        let facts = core::slice::from_raw_parts(config[0] as *const u64, config[1] as usize);
        (hot, arena, facts, config)
    };
    let result = if config[3] == CONTEXTS_TAGGED {
        // SAFETY: in tagged counting the thread's memos lie right before
        // its arena and its slots right before them, `MAX_BLOCKS` of each,
        // in the same thread area, distinct from the rest.
        let (slots, memos) = unsafe {
            let memos = hot[hot::ARENA] - MEMOS_BYTES;
            (
                core::slice::from_raw_parts_mut(
                    (memos - SLOTS_BYTES) as *mut u64,
                    MAX_BLOCKS * SLOT_WORDS,
                ),
                core::slice::from_raw_parts_mut(memos as *mut u64, MAX_BLOCKS * MEMO_WORDS),
            )
        };
        let mut rt = Tagged {
            hot,
            arena,
            slots,
            memos,
            facts,
            separate_recs: config[2] as u32,
        };
        match op {
            0 => rt.enter(block, sp),
            _ => rt.retag(block),
        }
    } else {
        let mut rt = Runtime {
            hot,
            arena,
            facts,
            separate_recs: config[2] as u32,
            flat: config[3] != 0,
        };
        match op {
            0 => rt.enter(block, sp),
            _ => rt.grow(block),
        }
    };
    match result {
        Ok(()) => 0,
        Err(Error::ArenaFull) => 1,
        Err(Error::UnknownBlock(_)) => 2,
    }
}

#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! {
    // An internal error of the runtime: SIGILL in the client, at an
    // address the tool knows for the runtime's.
    loop {
        // SAFETY: `ud2` only raises SIGILL.
        unsafe { core::arch::asm!("ud2") }
    }
}

// The C library's memory functions, which the compiler calls for copies
// and comparisons (the blob has no C library): string instructions, with
// the direction flag set for them and the flags put back after (the stub
// keeps only the arithmetic flags: the runtime must leave the others).

/// # Safety
/// As C's `memcpy`.
#[no_mangle]
pub unsafe extern "C" fn memcpy(dst: *mut u8, src: *const u8, n: usize) -> *mut u8 {
    // SAFETY: the caller's `memcpy` contract; `rep movsb` copies forward.
    unsafe {
        core::arch::asm!("pushfq", "cld", "rep movsb", "popfq", inout("rcx") n => _,
            inout("rdi") dst => _, inout("rsi") src => _, options(preserves_flags));
    }
    dst
}

/// # Safety
/// As C's `memmove`.
#[no_mangle]
pub unsafe extern "C" fn memmove(dst: *mut u8, src: *const u8, n: usize) -> *mut u8 {
    if (dst as usize) <= (src as usize) || (dst as usize) >= (src as usize) + n {
        // SAFETY: a forward copy is right when the destination starts at
        // or before the source, or past its end.
        return unsafe { memcpy(dst, src, n) };
    }
    // SAFETY: backwards, from the last byte (the direction flag set, and
    // put back).
    unsafe {
        core::arch::asm!("pushfq", "std", "rep movsb", "popfq", inout("rcx") n => _,
            inout("rdi") dst.add(n - 1) => _, inout("rsi") src.add(n - 1) => _,
            options(preserves_flags));
    }
    dst
}

/// # Safety
/// As C's `memset`.
#[no_mangle]
pub unsafe extern "C" fn memset(dst: *mut u8, c: i32, n: usize) -> *mut u8 {
    // SAFETY: the caller's `memset` contract.
    unsafe {
        core::arch::asm!("pushfq", "cld", "rep stosb", "popfq", inout("rcx") n => _,
            inout("rdi") dst => _, in("al") c as u8, options(preserves_flags));
    }
    dst
}

/// # Safety
/// As C's `memcmp`.
#[no_mangle]
pub unsafe extern "C" fn memcmp(a: *const u8, b: *const u8, n: usize) -> i32 {
    let mut i = 0;
    while i < n {
        // SAFETY: both hold `n` bytes (the caller's contract).
        let (x, y) = unsafe { (a.add(i).read_volatile(), b.add(i).read_volatile()) };
        if x != y {
            return i32::from(x) - i32::from(y);
        }
        i += 1;
    }
    0
}

/// # Safety
/// As C's `bcmp`.
#[no_mangle]
pub unsafe extern "C" fn bcmp(a: *const u8, b: *const u8, n: usize) -> i32 {
    // SAFETY: the same contract.
    unsafe { memcmp(a, b, n) }
}

/// Referenced by `core`'s unwinding tables; never called (panics abort).
#[no_mangle]
pub extern "C" fn rust_eh_personality() {}
