//! The stack-tree file: what `--tool=callgrind` records as a calling-context
//! tree, kept after the run so that exports (folded stacks, flame graphs,
//! speedscope, Firefox Profiler) can be made from it later
//! (`docs/stacktree.md` is the format's reference).
//!
//! * A [`StackTree`] holds every context node (its parent, thread, function
//!   and recursion level) with its *self* cost in any number of named event
//!   columns. Columns can be added after the tree was built
//!   ([`StackTree::add_event`]): an analysis whose costs are known only
//!   later (cache-use bytes charged at eviction to the context that loaded
//!   the line) attaches them to the same nodes.
//! * Optional detail per node: self costs per instruction (object, file
//!   address, source file and line) and the call sites in the parent
//!   through which the node was entered, with their call counts.
//! * [`write`] and [`read`] are the text format, versioned
//!   ([`FORMAT_VERSION`]); [`read`] fails with one line naming the line
//!   number.
#![forbid(unsafe_code)]

mod model;
mod read;
mod write;

pub use model::{CallSite, Function, Node, Position, Site, StackTree, NO_PARENT};
pub use read::{read, ReadError};
pub use write::write;

/// The version of the format this crate writes and reads.
pub const FORMAT_VERSION: u32 = 1;
