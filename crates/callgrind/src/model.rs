//! The data model of a Callgrind profile: a header, one or more parts
//! (dumps), and in each part the function blocks in the order they were
//! written, with their cost lines, calls and jumps.
//!
//! The model keeps the file's structure (block order, inlined-file
//! changes, one entry per line) rather than aggregating, so that a file
//! read in and written out again is the same file, and so that
//! `callgrind_annotate`, whose results depend on that order in a few
//! places, sees what the script sees. [`crate::builder::PartBuilder`]
//! fills a part from aggregated data (functions keyed by object, file and
//! name) the way a tool does.

use crate::names::{NameId, Names};

/// A whole profile file.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Profile {
    /// `version:` (Callgrind writes 1).
    pub version: Option<String>,
    /// `creator:`, e.g. `callgrind-3.19.0`.
    pub creator: Option<String>,
    /// `pid:`.
    pub pid: Option<String>,
    /// `cmd:`, without the separating spaces.
    pub cmd: Option<String>,
    /// Object, file and function names, shared by all parts.
    pub names: Names,
    /// The dumps, in file order; at least one in a file read in.
    pub parts: Vec<Part>,
}

/// Which subpositions cost lines carry (`positions:`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Positions {
    /// An instruction address (`instr`, from `--dump-instr=yes`).
    pub instr: bool,
    /// A source line number (`line`, the default).
    pub line: bool,
}

impl Default for Positions {
    fn default() -> Self {
        Positions {
            instr: false,
            line: true,
        }
    }
}

impl Positions {
    /// The value of the `positions:` line.
    pub fn spec(&self) -> &'static str {
        match (self.instr, self.line) {
            (true, true) => "instr line",
            (true, false) => "instr",
            _ => "line",
        }
    }
}

/// One event (a cost column).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// The short name used in `events:`, e.g. `Ir`.
    pub name: String,
    /// The long name given by an `event:` line, if any.
    pub long_name: Option<String>,
}

/// One dump: its header lines and its function blocks.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Part {
    /// `part:`.
    pub number: Option<u64>,
    /// `thread:` (files of `--separate-threads=yes`).
    pub thread: Option<u64>,
    /// `desc:` lines, in order, without `desc: `.
    pub desc: Vec<String>,
    /// Header lines of other keys (newer versions), kept verbatim.
    pub other_header: Vec<String>,
    /// `positions:`.
    pub positions: Positions,
    /// The events, in column order (`events:` and `event:` lines).
    pub events: Vec<Event>,
    /// `summary:` (in the header, as Callgrind writes it).
    pub summary: Option<Vec<u64>>,
    /// `totals:` (at the end of the part).
    pub totals: Option<Vec<u64>>,
    /// Function blocks, in file order. One function may have several.
    pub blocks: Vec<Block>,
}

/// A position: instruction address and line, as far as `positions:` has
/// them (the other is 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Position {
    /// The instruction address.
    pub addr: u64,
    /// The source line.
    pub line: u64,
}

/// The costs of a line, one per event, in event order. Always as long as
/// the part's event list (missing trailing costs are zeros; the writer
/// omits trailing zeros, as Callgrind does).
pub type Costs = Vec<u64>;

/// One `fn=` block: a function of an object and file, and its lines.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Block {
    /// `ob=`, the object (`None` when the file names none).
    pub object: Option<NameId>,
    /// `fl=`, the function's source file.
    pub file: NameId,
    /// `fn=`.
    pub function: NameId,
    /// The lines of the block, in order.
    pub items: Vec<Item>,
}

/// One element of a block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Item {
    /// `fi=`/`fe=`: the following items are in this source file (inlined
    /// or included code); `fe=` when it is the block's own file.
    File(NameId),
    /// A cost line: self costs at a position.
    Cost {
        /// Where.
        position: Position,
        /// The exclusive costs.
        costs: Costs,
    },
    /// A call arc (`cob=`/`cfi=`/`cfn=`, `calls=`, and the call-site line).
    Call(Call),
    /// A jump arc (`jfi=`/`jfn=`, `jump=`/`jcnd=`, and the source line).
    Jump(Jump),
}

/// A call arc with its inclusive costs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    /// The callee's object (the block's object when no `cob=` was given).
    pub object: Option<NameId>,
    /// The callee's file (the current file when no `cfi=` was given).
    pub file: NameId,
    /// The callee.
    pub function: NameId,
    /// How many calls (0 for a call still running at the dump).
    pub count: u64,
    /// The callee's position (its first line or instruction).
    pub target: Position,
    /// The call site.
    pub source: Position,
    /// The inclusive costs of all those calls.
    pub inclusive: Costs,
}

/// What kind of jump, with its counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JumpKind {
    /// `jump=COUNT`: an unconditional jump.
    Always {
        /// Times taken.
        count: u64,
    },
    /// `jcnd=TAKEN/EXECUTED`: a conditional jump.
    Conditional {
        /// Times taken.
        taken: u64,
        /// Times executed.
        executed: u64,
    },
}

/// A jump arc (`--collect-jumps=yes`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Jump {
    /// The kind and counts.
    pub kind: JumpKind,
    /// The target's file (`jfi=`, else the current file).
    pub file: NameId,
    /// The target's function (`jfn=`, else the block's function).
    pub function: NameId,
    /// The target position.
    pub target: Position,
    /// The jump's own position.
    pub source: Position,
}

impl Part {
    /// The event names, in column order.
    pub fn event_names(&self) -> Vec<&str> {
        self.events.iter().map(|e| e.name.as_str()).collect()
    }
}
