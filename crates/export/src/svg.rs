//! A flame graph SVG of one event, drawn by inferno from the folded lines.

use crate::folded;
use crate::stacks::Stacks;
use stacktree::StackTree;
use std::io::{self, Write};

/// Writes the flame graph of `event`.
pub fn write(tree: &StackTree, stacks: &Stacks, event: usize, w: &mut dyn Write) -> io::Result<()> {
    let lines = folded::lines(stacks, event);
    let mut options = inferno::flamegraph::Options::default();
    options.title = format!("{} ({})", tree.cmd, tree.events[event]);
    options.count_name = tree.events[event].clone();
    // The lines are sorted already; inferno would sort them again.
    options.no_sort = true;
    inferno::flamegraph::from_lines(&mut options, lines.iter().map(String::as_str), w)
        .map_err(io::Error::other)
}
