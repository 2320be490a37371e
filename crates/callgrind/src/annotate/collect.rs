//! The tables callgrind_annotate builds while reading a profile, built
//! from the model in file order: function totals keyed `file:function`,
//! per-line costs per source file, and call arcs per caller, callee and
//! call line.
//!
//! The keys follow the script: a function inside inlined code (`fi=`) is
//! keyed by the inlined file; a callee without `cfi=` takes the current
//! file; file names of `fl=`/`fi=`/`fe=` lose the current directory prefix
//! (callee files from `cfi=` keep it); a call still running at the dump
//! (`calls=0`) counts as self cost of the caller; a jump's source line is a
//! cost line without costs (it makes the line annotated).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use super::cc::{self, Cc};
use crate::model::{Item, Profile};

/// A caller and a callee, both `file:function`.
pub(crate) type Arc = (String, String);

/// Everything the report is printed from.
#[derive(Default)]
pub(crate) struct Tables {
    /// Self (or, with `--inclusive=yes`, inclusive) cost per function.
    pub fn_totals: HashMap<String, Cc>,
    /// Per source file, the cost of each line.
    pub lines: HashMap<String, BTreeMap<u64, Cc>>,
    /// Inclusive cost and call count per arc.
    pub arc_costs: HashMap<Arc, Cc>,
    /// Call count per arc.
    pub arc_counts: HashMap<Arc, u64>,
    /// Inclusive cost per arc and call line.
    pub line_arc_costs: HashMap<(String, String, u64), Cc>,
    /// Call count per arc and call line.
    pub line_arc_counts: HashMap<(String, String, u64), u64>,
    /// Per (file, line), the callees called from it.
    pub called_from_line: HashMap<(String, u64), BTreeSet<String>>,
    /// Per (file, line), the first caller seen calling from it.
    pub func_of_line: HashMap<(String, u64), String>,
    /// Per callee, its callers.
    pub callers: HashMap<String, BTreeSet<String>>,
    /// Per caller, its callees.
    pub callees: HashMap<String, BTreeSet<String>>,
    /// Per callee, the inclusive cost of all calls to it.
    pub called_totals: HashMap<String, Cc>,
    /// Per function, its object (from the last `fn=` naming it).
    pub objects: HashMap<String, String>,
    /// The `summary:` line (the last one).
    pub summary: Option<Cc>,
    /// The `totals:` line (the last one).
    pub totals: Option<Cc>,
}

/// What decides which costs are kept.
pub(crate) struct CollectOptions<'a> {
    /// `--inclusive=yes`.
    pub inclusive: bool,
    /// Per-line costs are kept for every file (`--auto=yes`) ...
    pub all_lines: bool,
    /// ... or only for these (named on the command line).
    pub line_files: &'a HashSet<String>,
    /// The current directory with a trailing `/`, removed from file names.
    pub cwd_prefix: &'a str,
}

/// The reading state: where the walk is.
struct Cursor {
    file: String,
    function: String,
    name: String,
    line_kept: bool,
}

impl Tables {
    /// Builds the tables from `profile`.
    pub(crate) fn collect(profile: &Profile, opts: &CollectOptions) -> Tables {
        let mut t = Tables::default();
        let names = &profile.names;
        let strip = |s: &str| -> String {
            match s.strip_prefix(opts.cwd_prefix) {
                Some(rest) if !opts.cwd_prefix.is_empty() => rest.to_string(),
                _ => s.to_string(),
            }
        };
        let keeps_lines = |file: &str| opts.all_lines || opts.line_files.contains(file);
        let mut object = String::new();
        for part in &profile.parts {
            if let Some(s) = &part.summary {
                t.summary = Some(cc::from_all(s));
            }
            let line_of = |p: &crate::model::Position| if part.positions.line { p.line } else { 0 };
            for block in &part.blocks {
                if let Some(o) = block.object {
                    object = names.objects.text(o).to_string();
                }
                let function = names.functions.text(block.function).to_string();
                let file = strip(names.files.text(block.file));
                let name = format!("{file}:{function}");
                t.fn_totals.entry(name.clone()).or_default();
                t.objects.insert(name.clone(), object.clone());
                let mut cur = Cursor {
                    line_kept: keeps_lines(&file),
                    file,
                    function,
                    name,
                };
                let mut sub_file = block.file;
                for item in &block.items {
                    match item {
                        Item::File(f) => {
                            sub_file = *f;
                            cur.file = strip(names.files.text(*f));
                            cur.name = format!("{}:{}", cur.file, cur.function);
                            cur.line_kept = keeps_lines(&cur.file);
                            t.fn_totals.entry(cur.name.clone()).or_default();
                        }
                        Item::Cost { position, costs } => {
                            t.cost_line(&cur, line_of(position), &cc::from_line(costs));
                        }
                        Item::Jump(jump) => t.cost_line(&cur, line_of(&jump.source), &Cc::new()),
                        Item::Call(call) => {
                            // Where Callgrind wrote `cfi=` (see the writer),
                            // the callee's file is that name as is.
                            let cfi_written = call.object != block.object || call.file != sub_file;
                            let callee_file = if cfi_written {
                                names.files.text(call.file).to_string()
                            } else {
                                cur.file.clone()
                            };
                            let callee =
                                format!("{callee_file}:{}", names.functions.text(call.function));
                            t.callers
                                .entry(callee.clone())
                                .or_default()
                                .insert(cur.name.clone());
                            t.callees
                                .entry(cur.name.clone())
                                .or_default()
                                .insert(callee.clone());
                            let costs = cc::from_line(&call.inclusive);
                            let line = line_of(&call.source);
                            if call.count == 0 {
                                t.cost_line(&cur, line, &costs);
                            } else {
                                t.call_line(&cur, callee, call.count, line, &costs, opts.inclusive);
                            }
                        }
                    }
                }
            }
            if let Some(s) = &part.totals {
                t.totals = Some(cc::from_all(s));
            }
        }
        if opts.inclusive {
            let called: Vec<(String, Cc)> = t.called_totals.drain().collect();
            for (name, cc) in called {
                t.fn_totals.insert(name, cc);
            }
        }
        t
    }

    fn cost_line(&mut self, cur: &Cursor, line: u64, costs: &Cc) {
        cc::add(costs, self.fn_totals.entry(cur.name.clone()).or_default());
        if cur.line_kept {
            let lines = self.lines.entry(cur.file.clone()).or_default();
            cc::add(costs, lines.entry(line).or_default());
        }
    }

    fn call_line(
        &mut self,
        cur: &Cursor,
        callee: String,
        count: u64,
        line: u64,
        costs: &Cc,
        inclusive: bool,
    ) {
        let arc = (cur.name.clone(), callee.clone());
        cc::add(costs, self.arc_costs.entry(arc.clone()).or_default());
        *self.arc_counts.entry(arc).or_default() += count;
        let site = (cur.file.clone(), line);
        self.func_of_line
            .entry(site.clone())
            .or_insert_with(|| cur.name.clone());
        self.called_from_line
            .entry(site)
            .or_default()
            .insert(callee.clone());
        let key = (cur.name.clone(), callee.clone(), line);
        cc::add(costs, self.line_arc_costs.entry(key.clone()).or_default());
        *self.line_arc_counts.entry(key).or_default() += count;
        cc::add(costs, self.called_totals.entry(callee).or_default());
        if inclusive {
            cc::add(costs, self.fn_totals.entry(cur.name.clone()).or_default());
        }
    }
}
