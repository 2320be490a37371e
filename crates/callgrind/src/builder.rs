//! Filling a part the way a tool does: costs and calls aggregated per
//! function, keyed by object, file and name, then laid out as blocks.
//!
//! A tool walking its calling-context tree calls
//! [`PartBuilder::add_cost`] for each function's self cost at a position
//! and [`PartBuilder::add_call`] for each arc (call count and inclusive
//! cost); repeated keys add up. [`PartBuilder::finish`] gives one block per
//! function in order of first use, its own file's lines first, then each
//! inlined file's (`fi=`) in order of first use, lines in position order.

use rustc_hash::FxHashMap;
use std::collections::BTreeMap;

use crate::model::{Block, Call, Costs, Item, Position};
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

/// What is known of one function.
#[derive(Debug, Default)]
struct Function {
    /// Source files in order of first use (the function's own first).
    files: Vec<NameId>,
    costs: BTreeMap<(usize, Position), Costs>,
    calls: BTreeMap<(usize, Position, FunctionKey), ArcCost>,
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
                for (index, &file) in f.files.iter().enumerate() {
                    if index > 0 {
                        items.push(Item::File(file));
                    }
                    // Calls at a position come before its cost line, as
                    // Callgrind writes them.
                    loop {
                        let next_call = calls.peek().filter(|c| c.0 .0 == index).map(|c| c.0 .1);
                        let next_cost = costs.peek().filter(|c| c.0 .0 == index).map(|c| c.0 .1);
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
