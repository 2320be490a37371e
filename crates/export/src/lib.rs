//! Exports of a calling-context tree ([`stacktree::StackTree`]): folded
//! stacks, a flame graph SVG (inferno), a speedscope file and a Firefox
//! Profiler processed profile. Every export is exact: each context's self
//! cost is one weighted stack (see [`stacks`]), so the weights of an event
//! add up to the tree's total for it; nothing is rebuilt from call arcs.
#![forbid(unsafe_code)]

mod firefox;
mod folded;
pub mod inline;
mod speedscope;
pub mod stacks;
mod svg;

use stacks::{Build, Stacks};
use stacktree::StackTree;
use std::fmt;
use std::io::{self, Write};
use std::str::FromStr;

/// What to export.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// The stack-tree file itself (`docs/stacktree.md`).
    StackTree,
    /// `root;...;leaf COUNT` lines, one event.
    Folded,
    /// A flame graph SVG of one event.
    Svg,
    /// A speedscope file, one profile per event.
    Speedscope,
    /// A Firefox Profiler processed profile, one thread per event.
    Firefox,
}

impl Kind {
    /// The names `--export=KIND:FILE` and `cachescope export KIND` take.
    pub const NAMES: &'static str = "stacktree, folded, svg, speedscope, firefox";
}

impl FromStr for Kind {
    type Err = String;
    fn from_str(s: &str) -> Result<Kind, String> {
        Ok(match s {
            "stacktree" => Kind::StackTree,
            "folded" => Kind::Folded,
            "svg" => Kind::Svg,
            "speedscope" => Kind::Speedscope,
            "firefox" => Kind::Firefox,
            _ => {
                return Err(format!(
                    "unknown export kind '{s}' (one of {})",
                    Kind::NAMES
                ))
            }
        })
    }
}

/// How to export.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Options {
    /// The event of the one-event kinds (folded, SVG); the first by default.
    pub event: Option<String>,
    /// Only this thread (all threads, merged, by default).
    pub thread: Option<u32>,
    /// Inline frames from DWARF after each function's frame.
    pub inline: bool,
}

/// Why an export failed.
#[derive(Debug)]
pub enum Error {
    /// The options do not fit the tree (an unknown event or thread, a
    /// weight a JSON reader cannot hold exactly).
    Invalid(String),
    /// Writing failed.
    Io(io::Error),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Invalid(m) => write!(f, "{m}"),
            Error::Io(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for Error {}

impl From<io::Error> for Error {
    fn from(e: io::Error) -> Error {
        Error::Io(e)
    }
}

/// Checks `options` against `tree` without writing anything (what a run
/// does before the program starts would need the tree; this is for after).
pub fn check(tree: &StackTree, options: &Options) -> Result<(), Error> {
    event_index(tree, options)?;
    if let Some(t) = options.thread {
        if !tree.threads().contains(&t) {
            return Err(Error::Invalid(format!("no thread {t} in the profile")));
        }
    }
    Ok(())
}

fn event_index(tree: &StackTree, options: &Options) -> Result<usize, Error> {
    match &options.event {
        None if tree.events.is_empty() => Err(Error::Invalid("the profile has no events".into())),
        None => Ok(0),
        Some(e) => tree.event(e).ok_or_else(|| {
            Error::Invalid(format!(
                "no event '{e}' in the profile (it has: {})",
                tree.events.join(" ")
            ))
        }),
    }
}

/// Writes `tree` as `kind` to `w`.
pub fn export(
    tree: &StackTree,
    kind: Kind,
    options: &Options,
    w: &mut dyn Write,
) -> Result<(), Error> {
    check(tree, options)?;
    if kind == Kind::StackTree {
        return Ok(stacktree::write(tree, w)?);
    }
    let mut resolver = inline::InlineResolver::default();
    let stacks = Stacks::build(
        tree,
        Build {
            thread: options.thread,
            lines: kind == Kind::Firefox,
            inline: options.inline.then_some(&mut resolver),
        },
    );
    let event = event_index(tree, options)?;
    match kind {
        Kind::StackTree => unreachable!("written above"),
        Kind::Folded => folded::write(&stacks, event, w)?,
        Kind::Svg => svg::write(tree, &stacks, event, w)?,
        Kind::Speedscope => speedscope::write(tree, &stacks, w)?,
        Kind::Firefox => firefox::write(tree, &stacks, w)?,
    }
    Ok(())
}

/// The largest integer a JSON reader in JavaScript (speedscope, the
/// Firefox Profiler) holds exactly: 2^53.
const JSON_EXACT: u64 = 1 << 53;

/// Refuses weights JavaScript would round.
fn exact_in_json(stacks: &Stacks) -> Result<(), Error> {
    if stacks.totals().iter().any(|&t| t > JSON_EXACT) {
        return Err(Error::Invalid(
            "a total exceeds 2^53, which a JSON reader in JavaScript cannot hold exactly".into(),
        ));
    }
    Ok(())
}
