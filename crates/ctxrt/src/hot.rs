//! The thread's words translated code reads and writes (at a fixed
//! offset of its thread area), by index.

/// The address of the current context's first counter (an Ir count per
/// block of its function, by the block's number in the function); the
/// word before it holds how many there are.
pub const CUR: usize = 0;
/// The thread's running Ir (in the current signal handler, if one runs):
/// a call's inclusive cost is its difference between call and return.
pub const IR: usize = 1;
/// The id of the block a context-changing transfer left ([`crate::NONE`]:
/// none, a thread's first block).
pub const LAST: usize = 2;
/// The arena's address in the client (set when the thread's arena is
/// mapped).
pub const ARENA: usize = 3;
/// The arena's size in words.
pub const ARENA_WORDS: usize = 4;
/// How many signal handlers run, as the interrupted code's saved words
/// say: a handler's `rt_sigreturn` puts back the words of the code it
/// interrupted, this one included, so a count below the runtime's own
/// says which handlers returned.
pub const SIGNALS: usize = 5;
/// Tagged counting's running Ir is [`IR`] plus these three words: each
/// block adds to the one its id picks ([`ir_word`]), so that consecutive
/// blocks do not each wait for the one before's store of a single word (a
/// store-forwarding chain: 45 % of counting mode's time on perl).
pub const IR_MORE: [usize; 3] = [6, 7, 8];
/// Tagged counting: the number of the skip record the current tag names
/// ([`crate::NONE`]: the tag is not a skip record's), into whose Ir
/// skipped code's blocks count (`ctxrt::tagged`): the PLT's blocks run
/// for many call sites, and counting in their slots would retag them at
/// each. Beside the current tag, so that a signal handler's return puts
/// both back.
pub const NS_SKIP: usize = 9;
/// Hot words per thread.
pub const WORDS: usize = 10;

/// The hot word of the running Ir that tagged counting's block `id` adds
/// to.
#[inline(always)]
pub fn ir_word(id: u32) -> usize {
    match id & 3 {
        0 => IR,
        k => IR_MORE[k as usize - 1],
    }
}

/// The running Ir of tagged counting: the sum of its words.
#[inline(always)]
pub fn running_ir(hot: &[u64]) -> u64 {
    hot[IR]
        .wrapping_add(hot[IR_MORE[0]])
        .wrapping_add(hot[IR_MORE[1]])
        .wrapping_add(hot[IR_MORE[2]])
}

/// [`LAST`] when a signal handler starts (its trampoline stores it): its
/// first block starts a root, as in Callgrind.
pub const SIGNAL_START: u64 = u64::MAX - 1;

/// Added to [`LAST`] by a block that leaves by `ret` (block ids are
/// below it): the engine's inline fast paths know a return from the word
/// alone, without the block's facts.
pub const RETURN_TAG: u64 = 1 << 30;

/// The block left, as [`LAST`] holds it: its id (without the
/// [`RETURN_TAG`]), [`crate::NONE`] or [`SIGNAL_START`].
#[inline(always)]
pub fn block_left(last: u64) -> u64 {
    if last < SIGNAL_START {
        last & !RETURN_TAG
    } else {
        last
    }
}
