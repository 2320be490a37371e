//! Callgrind profiles: the data model of a `callgrind.out` file, its
//! reader and writer, and `callgrind_annotate`.
//!
//! * [`Profile`] is a whole file: header, parts (dumps), and in each part
//!   the function blocks with their cost lines, call arcs (with inclusive
//!   costs) and jump arcs, in file order ([`model`]). Names live in three
//!   id spaces ([`names`]).
//! * [`reader::parse`] / [`Profile::read_from`] read what Valgrind's
//!   Callgrind writes (any mix of `--compress-strings`, `--compress-pos`,
//!   `--dump-instr`, `--collect-jumps`, `--separate-threads`,
//!   `--combine-dumps`); errors name the line.
//! * [`Profile::write_to`] writes Callgrind's exact layout
//!   ([`writer::WriteOptions`] for the two compressions).
#![forbid(unsafe_code)]

pub mod annotate;
pub mod builder;
pub mod model;
pub mod names;
pub mod reader;
pub mod writer;

pub use model::{
    Block, Call, Costs, Event, Item, Jump, JumpKind, Part, Position, Positions, Profile,
};
pub use names::{Name, NameId, NameTable, Names};
pub use reader::{parse, ParseError, ReadError};
pub use writer::WriteOptions;
