//! The in-memory model of a stack-tree file.

/// The parent of a root node.
pub const NO_PARENT: u32 = u32::MAX;

/// A function: its object, source file and name (indices into the string
/// tables), as Callgrind names it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Function {
    /// Index into [`StackTree::objects`].
    pub object: u32,
    /// Index into [`StackTree::files`].
    pub file: u32,
    /// The name (Callgrind's: the debug name, else `0x%016x` of the offset).
    pub name: String,
}

/// An instruction: its object (none when unknown), its address in the
/// object's file (the ELF virtual address, what `addr2line` takes; the
/// run-time address without an object) and its source file and line (0:
/// unknown).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Site {
    /// Index into [`StackTree::objects`], or `None`.
    pub object: Option<u32>,
    /// The file address.
    pub address: u64,
    /// Index into [`StackTree::files`].
    pub file: u32,
    /// The source line, 0 when unknown.
    pub line: u32,
}

/// Self costs of a node at one instruction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Position {
    /// The instruction.
    pub site: Site,
    /// One cost per event column (zero where a column has no detail).
    pub costs: Vec<u64>,
}

/// A call site in the parent's function through which a node was entered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallSite {
    /// The calling instruction.
    pub site: Site,
    /// How many times.
    pub calls: u64,
}

/// One calling context.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    /// The caller's context (an index into [`StackTree::nodes`], always
    /// smaller than this node's), or [`NO_PARENT`] for a root.
    pub parent: u32,
    /// The thread, numbered as Valgrind numbers them (1 is the main one).
    pub thread: u32,
    /// Index into [`StackTree::functions`].
    pub function: u32,
    /// Recursion level as Callgrind separates them (`--separate-recs`): 1
    /// for the outermost activation; `fib'2` is level 2.
    pub level: u32,
    /// Self cost, one per event column.
    pub costs: Vec<u64>,
    /// Optional detail of the self costs per instruction.
    pub positions: Vec<Position>,
    /// How the node was entered from its parent.
    pub calls: Vec<CallSite>,
}

/// A calling-context tree with its costs (see the crate documentation).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StackTree {
    /// What made it (`cachescope-0.1.0`).
    pub creator: String,
    /// The process.
    pub pid: u32,
    /// The command line.
    pub cmd: String,
    /// The event columns' names, in order (`Ir` first for a call-graph run).
    pub events: Vec<String>,
    /// Object file paths (`???` when unknown).
    pub objects: Vec<String>,
    /// Source file names (`???` when unknown).
    pub files: Vec<String>,
    /// The functions.
    pub functions: Vec<Function>,
    /// The nodes, parents before children.
    pub nodes: Vec<Node>,
}

impl StackTree {
    /// Adds an event column named `name` (zero everywhere) and returns its
    /// index; an existing column of that name is returned as it is.
    pub fn add_event(&mut self, name: &str) -> usize {
        if let Some(i) = self.event(name) {
            return i;
        }
        self.events.push(name.to_string());
        for n in &mut self.nodes {
            n.costs.push(0);
            for p in &mut n.positions {
                p.costs.push(0);
            }
        }
        self.events.len() - 1
    }

    /// The index of the event column `name`.
    pub fn event(&self, name: &str) -> Option<usize> {
        self.events.iter().position(|e| e == name)
    }

    /// The node's function name as Callgrind writes it: `fib` at level 1,
    /// `fib'2` from level 2 on.
    pub fn display_name(&self, node: &Node) -> String {
        let name = &self.functions[node.function as usize].name;
        if node.level > 1 {
            format!("{name}'{}", node.level)
        } else {
            name.clone()
        }
    }

    /// The sum of each event column over the nodes of `thread` (all
    /// threads with `None`).
    pub fn totals(&self, thread: Option<u32>) -> Vec<u64> {
        let mut t = vec![0u64; self.events.len()];
        for n in self.nodes.iter() {
            if thread.is_none_or(|th| n.thread == th) {
                for (s, c) in t.iter_mut().zip(&n.costs) {
                    *s += c;
                }
            }
        }
        t
    }

    /// The threads that have nodes, in order.
    pub fn threads(&self) -> Vec<u32> {
        let mut t: Vec<u32> = self.nodes.iter().map(|n| n.thread).collect();
        t.sort_unstable();
        t.dedup();
        t
    }

    /// Checks the references between tables and the column counts: what
    /// [`read`](crate::read) guarantees of a file, and what a writer must
    /// hold to.
    pub fn check(&self) -> Result<(), String> {
        let width = self.events.len();
        let site_ok = |s: &Site| {
            s.object.is_none_or(|o| (o as usize) < self.objects.len())
                && (s.file as usize) < self.files.len()
        };
        for (i, f) in self.functions.iter().enumerate() {
            if f.object as usize >= self.objects.len() || f.file as usize >= self.files.len() {
                return Err(format!("function {i} names an unknown object or file"));
            }
        }
        for (i, n) in self.nodes.iter().enumerate() {
            if n.parent != NO_PARENT && n.parent as usize >= i {
                return Err(format!(
                    "node {i}: its parent {} does not precede it",
                    n.parent
                ));
            }
            if n.parent != NO_PARENT && self.nodes[n.parent as usize].thread != n.thread {
                return Err(format!("node {i}: its parent is of another thread"));
            }
            if n.function as usize >= self.functions.len() {
                return Err(format!("node {i}: unknown function {}", n.function));
            }
            if n.level == 0 {
                return Err(format!("node {i}: recursion level 0"));
            }
            if n.costs.len() != width || n.positions.iter().any(|p| p.costs.len() != width) {
                return Err(format!("node {i}: not {width} cost columns"));
            }
            if !n.positions.iter().all(|p| site_ok(&p.site))
                || !n.calls.iter().all(|c| site_ok(&c.site))
            {
                return Err(format!("node {i}: a site names an unknown object or file"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn sample() -> StackTree {
        let site = |address, line| Site {
            object: Some(0),
            address,
            file: 1,
            line,
        };
        StackTree {
            creator: "test".into(),
            pid: 42,
            cmd: "./fib 3".into(),
            events: vec!["Ir".into()],
            objects: vec!["/tmp/fib".into()],
            files: vec!["???".into(), "fib.c".into()],
            functions: vec![
                Function {
                    object: 0,
                    file: 1,
                    name: "main".into(),
                },
                Function {
                    object: 0,
                    file: 1,
                    name: "fib".into(),
                },
            ],
            nodes: vec![
                Node {
                    parent: NO_PARENT,
                    thread: 1,
                    function: 0,
                    level: 1,
                    costs: vec![10],
                    positions: vec![Position {
                        site: site(0x1000, 3),
                        costs: vec![10],
                    }],
                    calls: vec![],
                },
                Node {
                    parent: 0,
                    thread: 1,
                    function: 1,
                    level: 1,
                    costs: vec![7],
                    positions: vec![],
                    calls: vec![CallSite {
                        site: site(0x1004, 4),
                        calls: 1,
                    }],
                },
                Node {
                    parent: 1,
                    thread: 1,
                    function: 1,
                    level: 2,
                    costs: vec![5],
                    positions: vec![],
                    calls: vec![],
                },
            ],
        }
    }

    #[test]
    fn columns_names_and_totals() {
        let mut t = sample();
        assert_eq!(t.check(), Ok(()));
        assert_eq!(t.display_name(&t.nodes[2]), "fib'2");
        assert_eq!(t.totals(None), [22]);
        assert_eq!(t.totals(Some(2)), [0]);
        let used = t.add_event("bytes_used");
        assert_eq!((used, t.add_event("bytes_used")), (1, 1));
        t.nodes[2].costs[used] = 64;
        assert_eq!(t.totals(None), [22, 64]);
        assert_eq!(t.nodes[0].positions[0].costs, [10, 0]);
        assert_eq!(t.check(), Ok(()));
        t.nodes[1].parent = 2;
        assert!(t.check().unwrap_err().contains("does not precede"));
    }
}
