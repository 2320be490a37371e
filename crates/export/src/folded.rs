//! Folded stacks: `root;...;leaf COUNT`, one line per distinct stack of
//! names, sorted, as Brendan Gregg's `stackcollapse` scripts write them.

use crate::stacks::Stacks;
use std::collections::BTreeMap;
use std::io::{self, Write};

/// The folded lines of `event`: stacks with the same names (they can differ
/// in files or lines) are one line; stacks of weight 0 are left out. A `;`
/// in a name (it separates frames) is written as `:`.
pub fn lines(stacks: &Stacks, event: usize) -> Vec<String> {
    let mut folded: BTreeMap<String, u64> = BTreeMap::new();
    for (stack, weights) in &stacks.samples {
        let w = weights[event];
        if w == 0 {
            continue;
        }
        let names: Vec<String> = stacks
            .path(*stack)
            .iter()
            .map(|&f| stacks.frames[f as usize].name.replace(';', ":"))
            .collect();
        *folded.entry(names.join(";")).or_default() += w;
    }
    folded
        .into_iter()
        .map(|(s, w)| format!("{s} {w}"))
        .collect()
}

/// Writes the folded lines of `event`.
pub fn write(stacks: &Stacks, event: usize, w: &mut dyn Write) -> io::Result<()> {
    let mut w = io::BufWriter::new(w);
    for l in lines(stacks, event) {
        writeln!(w, "{l}")?;
    }
    w.flush()
}

#[cfg(test)]
mod tests {
    use crate::stacks::tests::tree;
    use crate::stacks::{Build, Stacks};

    #[test]
    fn lines_sum_to_the_totals() {
        let t = tree();
        let s = Stacks::build(
            &t,
            Build {
                thread: None,
                lines: false,
                inline: None,
            },
        );
        assert_eq!(
            super::lines(&s, 0),
            ["h 5", "main 10", "main;f 20", "main;f;f'2 30", "main;g 40"]
        );
        let dr = super::lines(&s, 1);
        assert_eq!(dr, ["h 5", "main 1", "main;f 2", "main;f;f'2 3"]);
    }
}
