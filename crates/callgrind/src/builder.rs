//! Filling a part the way a tool does: costs and calls aggregated per
//! function, keyed by object, file and name, then laid out as blocks.
//!
//! A tool walking its calling-context tree calls
//! [`PartBuilder::add_cost`] for each function's self cost at a position
//! and [`PartBuilder::add_call`] for each arc (call count and inclusive
//! cost), and [`PartBuilder::add_jump`] for each jump arc
//! (`--collect-jumps=yes`); repeated keys add up. [`PartBuilder::finish`]
//! gives one block per function in order of first use, its own file's
//! lines first, then each inlined file's (`fi=`) in order of first use,
//! lines in position order.

use rustc_hash::FxHashMap;
use std::collections::BTreeMap;

use crate::model::{Block, Call, Costs, Item, Jump, JumpKind, Position};
use crate::names::NameId;

/// A function: object, file, name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FunctionKey {
    /// The object (`ob=`), if known.
    pub object: Option<NameId>,
    /// The source file (`fl=`).
    pub file: NameId,
    /// The function (`fn=`).
    pub function: NameId,
}

/// Where a cost or call is: a source file (the function's own, or an
/// inlined one) and a position in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Site {
    /// The source file.
    pub file: NameId,
    /// The position.
    pub position: Position,
}

/// One arc's aggregate.
#[derive(Debug, Clone)]
struct ArcCost {
    count: u64,
    target: Position,
    inclusive: Costs,
}

/// Where a jump goes: the target's function and site, and whether the
/// jump is conditional (`jcnd=`) or not (`jump=`).
type JumpKey = (usize, Position, Position, NameId, NameId, bool);

/// What is known of one function.
#[derive(Debug, Default)]
struct Function {
    /// Source files in order of first use (the function's own first).
    files: Vec<NameId>,
    costs: BTreeMap<(usize, Position), Costs>,
    calls: BTreeMap<(usize, Position, FunctionKey), ArcCost>,
    /// By (file index, source, target, target file, target function,
    /// conditional): times jumped, and times the jump was executed.
    jumps: BTreeMap<JumpKey, (u64, u64)>,
}

/// Aggregates costs and calls into a part's blocks.
#[derive(Debug, Default)]
pub struct PartBuilder {
    events: usize,
    order: Vec<FunctionKey>,
    functions: FxHashMap<FunctionKey, Function>,
}

fn add(to: &mut Costs, from: &[u64]) {
    for (t, f) in to.iter_mut().zip(from) {
        *t = t.wrapping_add(*f);
    }
}

impl PartBuilder {
    /// A builder for a part with `events` events.
    pub fn new(events: usize) -> PartBuilder {
        PartBuilder {
            events,
            ..PartBuilder::default()
        }
    }

    fn function(&mut self, key: FunctionKey, file: NameId) -> (&mut Function, usize) {
        let order = &mut self.order;
        let f = self.functions.entry(key).or_insert_with(|| {
            order.push(key);
            Function {
                files: vec![key.file],
                ..Function::default()
            }
        });
        let index = match f.files.iter().position(|&x| x == file) {
            Some(i) => i,
            None => {
                f.files.push(file);
                f.files.len() - 1
            }
        };
        (f, index)
    }

    /// Adds self costs of `key` at `site`.
    pub fn add_cost(&mut self, key: FunctionKey, site: Site, costs: &[u64]) {
        let n = self.events;
        let (f, index) = self.function(key, site.file);
        add(
            f.costs
                .entry((index, site.position))
                .or_insert_with(|| vec![0; n]),
            costs,
        );
    }

    /// Adds `count` calls from `caller` at `site` to `callee` starting at
    /// `target`, with their inclusive costs.
    pub fn add_call(
        &mut self,
        caller: FunctionKey,
        site: Site,
        callee: FunctionKey,
        target: Position,
        count: u64,
        inclusive: &[u64],
    ) {
        let n = self.events;
        let (f, index) = self.function(caller, site.file);
        let arc = f
            .calls
            .entry((index, site.position, callee))
            .or_insert_with(|| ArcCost {
                count: 0,
                target,
                inclusive: vec![0; n],
            });
        arc.count += count;
        add(&mut arc.inclusive, inclusive);
    }

    /// Adds jumps from `from` at `site` to `target` in function `to` (the
    /// function's own name, or another's for a jump that leaves the
    /// context: `jfn=`), with their counts (`kind`).
    pub fn add_jump(
        &mut self,
        from: FunctionKey,
        site: Site,
        to: NameId,
        target: Site,
        kind: JumpKind,
    ) {
        let (f, index) = self.function(from, site.file);
        let (count, executed, conditional) = match kind {
            JumpKind::Always { count } => (count, 0, false),
            JumpKind::Conditional { taken, executed } => (taken, executed, true),
        };
        let key = (
            index,
            site.position,
            target.position,
            target.file,
            to,
            conditional,
        );
        let e = f.jumps.entry(key).or_default();
        e.0 += count;
        e.1 += executed;
    }

    /// The blocks, one per function in order of first use.
    pub fn finish(self) -> Vec<Block> {
        let mut functions = self.functions;
        self.order
            .into_iter()
            .map(|key| {
                let f = functions.remove(&key).expect("every key has a function");
                let mut items = Vec::new();
                let mut calls = f.calls.into_iter().peekable();
                let mut costs = f.costs.into_iter().peekable();
                let mut jumps = f.jumps.into_iter().peekable();
                for (index, &file) in f.files.iter().enumerate() {
                    if index > 0 {
                        items.push(Item::File(file));
                    }
                    // Calls at a position come before its cost line, as
                    // Callgrind writes them; jumps after it (Callgrind
                    // writes the cost of the jump's line so far first).
                    loop {
                        let next_call = calls.peek().filter(|c| c.0 .0 == index).map(|c| c.0 .1);
                        let next_cost = costs.peek().filter(|c| c.0 .0 == index).map(|c| c.0 .1);
                        let next_jump = jumps.peek().filter(|j| j.0 .0 == index).map(|j| j.0 .1);
                        if let Some(jump) = next_jump {
                            let before = |p: Option<Position>| p.is_none_or(|p| jump < p);
                            if before(next_call) && before(next_cost) {
                                let ((_, source, target, file, function, conditional), n) =
                                    jumps.next().expect("peeked");
                                let kind = if conditional {
                                    JumpKind::Conditional {
                                        taken: n.0,
                                        executed: n.1,
                                    }
                                } else {
                                    JumpKind::Always { count: n.0 }
                                };
                                items.push(Item::Jump(Jump {
                                    kind,
                                    file,
                                    function,
                                    target,
                                    source,
                                }));
                                continue;
                            }
                        }
                        match (next_call, next_cost) {
                            (Some(call), cost) if cost.is_none_or(|cost| call <= cost) => {
                                let ((_, site, callee), arc) = calls.next().expect("peeked");
                                items.push(Item::Call(Call {
                                    object: callee.object,
                                    file: callee.file,
                                    function: callee.function,
                                    count: arc.count,
                                    target: arc.target,
                                    source: site,
                                    inclusive: arc.inclusive,
                                }));
                            }
                            (_, Some(_)) => {
                                let ((_, position), c) = costs.next().expect("peeked");
                                items.push(Item::Cost { position, costs: c });
                            }
                            _ => break,
                        }
                    }
                }
                Block {
                    object: key.object,
                    file: key.file,
                    function: key.function,
                    items,
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Event, Part, Positions, Profile};
    use crate::WriteOptions;

    #[test]
    fn jumps_add_up_and_follow_their_line_cost() {
        let mut p = Profile::default();
        let file = p.names.files.intern("a.c");
        let other = p.names.files.intern("b.h");
        let f = p.names.functions.intern("f");
        let g = p.names.functions.intern("g");
        let key = FunctionKey {
            object: None,
            file,
            function: f,
        };
        let at = |file, line| Site {
            file,
            position: Position { addr: 0, line },
        };
        let mut b = PartBuilder::new(1);
        b.add_cost(key, at(file, 10), &[4]);
        b.add_cost(key, at(file, 12), &[2]);
        let cond = |taken, executed| JumpKind::Conditional { taken, executed };
        let always = |count| JumpKind::Always { count };
        b.add_jump(key, at(file, 10), f, at(file, 12), cond(3, 5));
        b.add_jump(key, at(file, 12), f, at(file, 10), always(2));
        // Another context of the same function: the counts add up.
        b.add_jump(key, at(file, 10), f, at(file, 12), cond(1, 4));
        b.add_jump(key, at(file, 12), g, at(other, 7), always(1));
        let blocks = b.finish();
        let kinds: Vec<String> = blocks[0]
            .items
            .iter()
            .map(|i| match i {
                Item::Cost { position, .. } => format!("cost {}", position.line),
                Item::Jump(j) => format!("{:?} {}->{}", j.kind, j.source.line, j.target.line),
                other => format!("{other:?}"),
            })
            .collect();
        assert_eq!(
            kinds,
            [
                "cost 10",
                "Conditional { taken: 4, executed: 9 } 10->12",
                "cost 12",
                "Always { count: 1 } 12->7",
                "Always { count: 2 } 12->10",
            ]
        );
        p.parts.push(Part {
            positions: Positions::default(),
            events: vec![Event {
                name: "Ir".into(),
                long_name: None,
            }],
            blocks,
            ..Part::default()
        });
        let text = String::from_utf8(p.to_bytes(WriteOptions::default())).unwrap();
        assert!(
            text.contains("10 4\njcnd=4/9 +2 \n* \n+2 2\njfi=(2) b.h\njfn=(2) g\njump=1 -5 \n* \njump=2 -2 \n* \n"),
            "{text}"
        );
        let read = crate::parse(text.as_bytes()).unwrap();
        assert_eq!(read.parts[0].blocks, p.parts[0].blocks);
    }
}
