//! What a call tool must know of the code a block starts with.

use events::BlockInfo;
use std::sync::Arc;

/// The kind of section code is in: Callgrind treats a jump from one kind or
/// object to another as a call, and skips functions in the PLT.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Section {
    /// `.text`.
    Text,
    /// `.plt`.
    Plt,
    /// Anything else.
    Other,
}

/// The function a block belongs to, as Callgrind names it (`ob=`, `fl=`,
/// `fn=`), and what its start is.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CodeClass {
    /// The object file (`???` when unknown).
    pub object: Arc<str>,
    /// The source file of the block's first instruction (`???`).
    pub file: Arc<str>,
    /// The function name (for code without one, Callgrind's
    /// `0x%016x` offset in the object).
    pub function: Arc<str>,
    /// Whether a function starts exactly at the block's first instruction.
    pub entry: bool,
    /// Where the block is.
    pub section: Section,
    /// What Callgrind's per-function options ask of it.
    pub config: FnConfig,
}

/// Callgrind's per-function options, as the run matched them against the
/// function's name and object.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct FnConfig {
    /// `--toggle-collect`: collection is switched on entering and leaving
    /// it (its outermost activation).
    pub toggle_collect: bool,
    /// `--dump-before`: a dump on entering it.
    pub dump_before: bool,
    /// `--dump-after`: a dump on leaving it.
    pub dump_after: bool,
    /// `--zero-before`: costs zeroed on entering it.
    pub zero_before: bool,
    /// `--fn-skip` / `--obj-skip`: no context of its own; its costs go to
    /// its caller's call site (as PLT stubs with `--skip-plt`).
    pub skip: bool,
    /// `--separate-callers<N>=`: how many callers its contexts' names
    /// carry, instead of `--separate-callers`.
    pub separate_callers: Option<u32>,
    /// `--separate-recs<N>=`: the recursion levels its contexts keep
    /// apart, instead of `--separate-recs`.
    pub separate_recs: Option<u32>,
}

/// Tells the function of each block, while the program runs (in whatever
/// thread the tool runs in).
pub trait Classify: Send {
    /// The class of the block `info` describes.
    fn classify(&mut self, info: &BlockInfo) -> CodeClass;
    /// A classifier for a forked child's copy of the tool.
    fn fork(&self) -> Box<dyn Classify>;
}
