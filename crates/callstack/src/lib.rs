//! Call stacks from the event stream: per-thread shadow stacks and a
//! calling-context tree (one node per distinct stack of functions, one tree
//! per thread) onto which every instruction executed is charged, with
//! Callgrind's rules for what counts as a call and a return.
//!
//! * [`CallTool`] is the [`events::Tool`]: it follows each thread's blocks,
//!   and at each block decides, as Callgrind's `setup_bbcc` does, whether
//!   control came by a call (a `call`, or a jump to a function's first
//!   instruction, into another object or section: tail calls and PLT
//!   stubs), by a return (a `ret` that leaves the frame, by the stack
//!   pointer), or by a jump, and unwinds frames the stack pointer has left
//!   (`longjmp`, exceptions). Signal handlers start new roots.
//! * Functions come from a [`Classify`] given by the run (symbolization is
//!   not this crate's business): object, file, name, whether a block starts
//!   a function, its section kind.
//! * [`CallTool::profile`] lays the tree out as a Callgrind profile part:
//!   self costs per function and position, and `calls=` arcs with their
//!   inclusive costs, recursion levels named `fn'2` (`--separate-recs`).
#![forbid(unsafe_code)]

mod classify;
pub mod contexts;
mod functions;
mod hot;
mod index;
mod memo;
mod output;
mod stacks;
pub mod tagged;
#[cfg(test)]
mod testprog;
mod tool;
mod tree;

pub use classify::{Classify, CodeClass, FnConfig, Section};
pub use functions::{block_shape, Functions};
pub use output::{Locate, OutputOptions};
pub use stacks::Place;
pub use tool::{CallOptions, CallTool, Dump};
pub use tree::Snapshot;
