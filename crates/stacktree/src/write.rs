//! The text form of a stack tree (`docs/stacktree.md`).

use crate::model::{Site, StackTree, NO_PARENT};
use std::io::{self, Write};

/// Escapes a string that runs to the end of its line: backslashes, line
/// feeds and carriage returns (the only characters that could break a
/// line-based reader).
pub(crate) fn escape(s: &str) -> std::borrow::Cow<'_, str> {
    if !s.contains(['\\', '\n', '\r']) {
        return s.into();
    }
    let mut out = String::with_capacity(s.len() + 2);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            c => out.push(c),
        }
    }
    out.into()
}

fn site(w: &mut dyn Write, s: &Site) -> io::Result<()> {
    match s.object {
        Some(o) => write!(w, " {o}")?,
        None => write!(w, " -")?,
    }
    write!(w, " {:x} {} {}", s.address, s.file, s.line)
}

fn costs(w: &mut dyn Write, c: &[u64]) -> io::Result<()> {
    for v in c {
        write!(w, " {v}")?;
    }
    Ok(())
}

/// Writes `tree` in the stack-tree text format. Refuses (as an
/// `InvalidInput` error, before writing anything) a tree that
/// [`StackTree::check`] rejects or whose event names are empty or contain
/// white space.
pub fn write(tree: &StackTree, w: &mut dyn Write) -> io::Result<()> {
    let invalid = |m: String| io::Error::new(io::ErrorKind::InvalidInput, m);
    tree.check().map_err(invalid)?;
    if let Some(e) = tree
        .events
        .iter()
        .find(|e| e.is_empty() || e.contains(char::is_whitespace))
    {
        return Err(invalid(format!("bad event name {e:?}")));
    }
    let mut w = io::BufWriter::new(w);
    writeln!(w, "# cachescope stack tree (format: docs/stacktree.md)")?;
    writeln!(w, "stacktree: {}", crate::FORMAT_VERSION)?;
    writeln!(w, "creator: {}", escape(&tree.creator))?;
    writeln!(w, "pid: {}", tree.pid)?;
    writeln!(w, "cmd: {}", escape(&tree.cmd))?;
    writeln!(w, "events: {}", tree.events.join(" "))?;
    for (i, o) in tree.objects.iter().enumerate() {
        writeln!(w, "ob {i} {}", escape(o))?;
    }
    for (i, f) in tree.files.iter().enumerate() {
        writeln!(w, "fl {i} {}", escape(f))?;
    }
    for (i, f) in tree.functions.iter().enumerate() {
        writeln!(w, "fn {i} {} {} {}", f.object, f.file, escape(&f.name))?;
    }
    for (i, n) in tree.nodes.iter().enumerate() {
        write!(w, "node {i} ")?;
        if n.parent == NO_PARENT {
            write!(w, "-")?;
        } else {
            write!(w, "{}", n.parent)?;
        }
        write!(w, " {} {} {}", n.thread, n.function, n.level)?;
        costs(&mut w, &n.costs)?;
        writeln!(w)?;
        for c in &n.calls {
            write!(w, "call")?;
            site(&mut w, &c.site)?;
            writeln!(w, " {}", c.calls)?;
        }
        for p in &n.positions {
            write!(w, "at")?;
            site(&mut w, &p.site)?;
            costs(&mut w, &p.costs)?;
            writeln!(w)?;
        }
    }
    writeln!(w, "end")?;
    w.flush()
}
