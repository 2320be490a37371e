//! The calling-context runtime that runs inside the traced program
//! (`docs/client-contexts.md`): per thread, a shadow stack and Callgrind's
//! calling-context tree, kept by Callgrind's rules (`callrules`), with the
//! costs of each context counted by translated code itself.
//!
//! Translated code counts each block's Ir into the current context's
//! counters (the address in [`hot::CUR`]) and into the thread's running
//! Ir ([`hot::IR`]), and stores its id in [`hot::LAST`] before it
//! leaves; a transfer that may change the context (calls, returns,
//! indirect jumps, jumps into another counter group) enters the next
//! block through a call of [`Runtime::enter`], which decides (the block
//! left is the one in [`hot::LAST`]), keeps the stack, makes contexts and
//! arcs, and points [`hot::CUR`] at the right counters. A block whose
//! number in its counter group is past its context's counters calls
//! [`Runtime::grow`].
//!
//! Everything lives in word slices the engine maps: the thread's *hot*
//! words (in its thread area, where translated code reaches them), its
//! *arena* (a reservation of its own, touched as used) and the process's
//! table of block *facts* (one [`Facts`] per block id, written by the
//! translator). The tool reads the arena when the thread or process ends
//! ([`Arena`] walks it) and folds it into Callgrind's profile.
//!
//! `no_std`, no allocation, no `unsafe`: the engine's build compiles it
//! into the blob the client maps, and its unit tests run on the host.
#![no_std]
#![forbid(unsafe_code)]

mod arena;
mod facts;
mod fast;
pub mod hot;
mod runtime;
mod table;
pub mod tagged;

pub use arena::{ArcRecord, Arena, NodeKind, NodeRecord, NONE};

/// The layout that the engine's inline fast paths (its runtime stub)
/// read and write as the runtime does: the arena's header, frames, node
/// records, block facts and the call memo.
pub mod abi {
    pub use crate::arena::{head, ARC_WORDS, FRAME_WORDS, NODE_HEADER};
    pub use crate::facts::{
        CALL_MEMO, DESCRIBED, ENTRY, EXIT_CALL, EXIT_RETURN, POP_ON_JUMP, SKIP, SP_KNOWN,
    };
    pub use crate::fast::{memo_child, memo_key, memo_slot, FRAME_RESUME, MEMO_HASH, MEMO_WORDS};
    pub use crate::runtime::{FOREIGN, ID};
}
pub use facts::{Facts, CALL_MEMO_WORDS, FACT_WORDS};

/// A block as contexts mode numbered it, for the tool's fold: its
/// description (`T`: the engine's), its function, counter group and
/// number in the group, and whether its call memo follows its counter
/// ([`Facts::memo`]).
#[derive(Debug, Clone)]
pub struct NumberedBlock<T> {
    /// The block's description.
    pub info: T,
    /// Its function (the classifier's number).
    pub function: u32,
    /// Its counter group.
    pub group: u32,
    /// Its counter's number in the group.
    pub index: u32,
    /// Whether [`CALL_MEMO_WORDS`] of call memo follow its counter.
    pub memo: bool,
}
pub use runtime::{
    continued_thread, fresh_thread, Error, Runtime, CONFIG_WORDS, CONTEXTS_FLAT, CONTEXTS_TAGGED,
    CONTEXTS_TREE, FIRST_COUNTERS,
};
