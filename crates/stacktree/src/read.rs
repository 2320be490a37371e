//! Reading the text form back (`docs/stacktree.md`).

use crate::model::{CallSite, Function, Node, Position, Site, StackTree, NO_PARENT};
use std::fmt;
use std::io::BufRead;

/// Why a file could not be read: the line (1-based; 0 for an I/O error or
/// a file cut short) and what was wrong.
#[derive(Debug)]
pub struct ReadError {
    /// The line number.
    pub line: usize,
    /// What was wrong with it.
    pub message: String,
}

impl fmt::Display for ReadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.line == 0 {
            write!(f, "{}", self.message)
        } else {
            write!(f, "line {}: {}", self.line, self.message)
        }
    }
}

impl std::error::Error for ReadError {}

fn unescape(s: &str) -> Result<String, String> {
    if !s.contains('\\') {
        return Ok(s.to_string());
    }
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('\\') => out.push('\\'),
            Some('n') => out.push('\n'),
            Some('r') => out.push('\r'),
            _ => return Err("bad escape".into()),
        }
    }
    Ok(out)
}

/// Fields of one line, taken in order.
struct Fields<'a> {
    rest: &'a str,
}

impl<'a> Fields<'a> {
    fn word(&mut self, what: &str) -> Result<&'a str, String> {
        let r = self.rest.trim_start_matches(' ');
        if r.is_empty() {
            return Err(format!("missing {what}"));
        }
        let end = r.find(' ').unwrap_or(r.len());
        self.rest = &r[end..];
        Ok(&r[..end])
    }
    fn num<T: std::str::FromStr>(&mut self, what: &str) -> Result<T, String> {
        let w = self.word(what)?;
        w.parse().map_err(|_| format!("bad {what} '{w}'"))
    }
    fn hex(&mut self, what: &str) -> Result<u64, String> {
        let w = self.word(what)?;
        u64::from_str_radix(w, 16).map_err(|_| format!("bad {what} '{w}'"))
    }
    /// The rest of the line, one space after the last field.
    fn text(&mut self) -> Result<String, String> {
        let r = self.rest.strip_prefix(' ').unwrap_or(self.rest);
        self.rest = "";
        unescape(r)
    }
    fn end(&self) -> Result<(), String> {
        if self.rest.trim().is_empty() {
            Ok(())
        } else {
            Err(format!("unexpected '{}'", self.rest.trim()))
        }
    }
}

/// Reads a stack tree, checking every reference.
pub fn read(input: impl BufRead) -> Result<StackTree, ReadError> {
    let mut tree = StackTree::default();
    let mut version = None;
    let mut events = None;
    let mut ended = false;
    for (i, line) in input.lines().enumerate() {
        let line = line.map_err(|e| ReadError {
            line: 0,
            message: e.to_string(),
        })?;
        let at = i + 1;
        let fail = |message: String| ReadError { line: at, message };
        if ended {
            return Err(fail("text after 'end'".into()));
        }
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if version.is_none() {
            let v = line
                .strip_prefix("stacktree: ")
                .ok_or_else(|| fail("not a stack-tree file (no 'stacktree:' line)".into()))?;
            let v: u32 = v.parse().map_err(|_| fail(format!("bad version '{v}'")))?;
            if v != crate::FORMAT_VERSION {
                return Err(fail(format!(
                    "format version {v}, this reader knows {}",
                    crate::FORMAT_VERSION
                )));
            }
            version = Some(v);
            continue;
        }
        line_into(&mut tree, &mut events, &mut ended, &line).map_err(fail)?;
    }
    let short = |m: &str| ReadError {
        line: 0,
        message: m.to_string(),
    };
    if version.is_none() {
        return Err(short("not a stack-tree file (no 'stacktree:' line)"));
    }
    if !ended {
        return Err(short("the file is cut short (no 'end' line)"));
    }
    tree.check().map_err(|m| short(&m))?;
    Ok(tree)
}

fn site(f: &mut Fields) -> Result<Site, String> {
    let object = match f.word("object")? {
        "-" => None,
        o => Some(o.parse().map_err(|_| format!("bad object '{o}'"))?),
    };
    Ok(Site {
        object,
        address: f.hex("address")?,
        file: f.num("file")?,
        line: f.num("line")?,
    })
}

fn costs(f: &mut Fields, width: usize) -> Result<Vec<u64>, String> {
    let c = (0..width)
        .map(|_| f.num("cost"))
        .collect::<Result<_, _>>()?;
    f.end()?;
    Ok(c)
}

/// Checks that a table entry comes with the next index.
fn next_index(f: &mut Fields, len: usize) -> Result<(), String> {
    let i: usize = f.num("index")?;
    if i == len {
        Ok(())
    } else {
        Err(format!("index {i} where {len} comes next"))
    }
}

fn line_into(
    tree: &mut StackTree,
    events: &mut Option<usize>,
    ended: &mut bool,
    line: &str,
) -> Result<(), String> {
    if let Some((key, value)) = line.split_once(": ") {
        match key {
            "creator" => tree.creator = unescape(value)?,
            "cmd" => tree.cmd = unescape(value)?,
            "pid" => tree.pid = value.parse().map_err(|_| format!("bad pid '{value}'"))?,
            "events" => {
                if events.is_some() || !tree.nodes.is_empty() {
                    return Err("'events:' must come once, before the nodes".into());
                }
                tree.events = value.split(' ').map(str::to_string).collect();
                *events = Some(tree.events.len());
            }
            _ => return Err(format!("unknown header '{key}'")),
        }
        return Ok(());
    }
    let (kind, rest) = line.split_once(' ').unwrap_or((line, ""));
    let mut f = Fields { rest };
    let width = || events.ok_or_else(|| "a node before 'events:'".to_string());
    match kind {
        "ob" => {
            next_index(&mut f, tree.objects.len())?;
            tree.objects.push(f.text()?);
        }
        "fl" => {
            next_index(&mut f, tree.files.len())?;
            tree.files.push(f.text()?);
        }
        "fn" => {
            next_index(&mut f, tree.functions.len())?;
            let object = f.num("object")?;
            let file = f.num("file")?;
            let name = f.text()?;
            tree.functions.push(Function { object, file, name });
        }
        "node" => {
            next_index(&mut f, tree.nodes.len())?;
            let parent = match f.word("parent")? {
                "-" => NO_PARENT,
                p => p.parse().map_err(|_| format!("bad parent '{p}'"))?,
            };
            let thread = f.num("thread")?;
            let function = f.num("function")?;
            let level = f.num("level")?;
            let costs = costs(&mut f, width()?)?;
            tree.nodes.push(Node {
                parent,
                thread,
                function,
                level,
                costs,
                positions: Vec::new(),
                calls: Vec::new(),
            });
        }
        "at" | "call" => {
            let width = width()?;
            let s = site(&mut f)?;
            let node = tree
                .nodes
                .last_mut()
                .ok_or_else(|| format!("'{kind}' before any node"))?;
            if kind == "at" {
                node.positions.push(Position {
                    site: s,
                    costs: costs(&mut f, width)?,
                });
            } else {
                let calls = f.num("call count")?;
                f.end()?;
                node.calls.push(CallSite { site: s, calls });
            }
        }
        "end" => {
            f.end()?;
            *ended = true;
        }
        _ => return Err(format!("unknown line '{kind}'")),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::tests::sample;

    fn text(t: &StackTree) -> String {
        let mut out = Vec::new();
        crate::write(t, &mut out).unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn round_trip() {
        let mut t = sample();
        t.functions[0].name = "operator new(unsigned long) \\ odd\nname".into();
        t.cmd = "./fib 3 'a b'".into();
        let s = text(&t);
        assert!(s.contains("node 2 1 1 1 2 5\n"), "{s}");
        assert!(s.contains("\nat 0 1000 1 3 10\n"), "{s}");
        assert_eq!(read(s.as_bytes()).unwrap(), t);
        let mut wide = t.clone();
        let e = wide.add_event("bytes_wasted");
        wide.nodes[1].costs[e] = 1 << 40;
        assert_eq!(read(text(&wide).as_bytes()).unwrap(), wide);
    }

    #[test]
    fn errors_name_the_line() {
        let good = text(&sample());
        let err = |s: &str| read(s.as_bytes()).unwrap_err().to_string();
        assert_eq!(
            err("hello\n"),
            "line 1: not a stack-tree file (no 'stacktree:' line)"
        );
        assert_eq!(
            err("stacktree: 2\n"),
            "line 1: format version 2, this reader knows 1"
        );
        let cut = good.replace("end\n", "");
        assert_eq!(err(&cut), "the file is cut short (no 'end' line)");
        let bad = good.replace("node 2 1 1 1 2 5", "node 2 1 1 1 2 x");
        assert!(err(&bad).ends_with(": bad cost 'x'"), "{}", err(&bad));
        let bad = good.replace("node 2 1 1 1 2 5", "node 2 7 1 1 2 5");
        assert!(err(&bad).contains("does not precede"), "{}", err(&bad));
        let bad = good.replace("node 2 1 1 1 2 5", "node 3 1 1 1 2 5");
        assert!(
            err(&bad).contains("index 3 where 2 comes next"),
            "{}",
            err(&bad)
        );
        assert!(err(&format!("{good}x\n")).contains("text after 'end'"));
    }
}
