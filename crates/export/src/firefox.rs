//! The Firefox Profiler's processed profile format, version 47 (the last
//! one with per-thread tables; the profiler upgrades it on load): one
//! thread per event, its samples the stacks of the contexts weighted by
//! their self costs (`weightType: "samples"`), a frame per function and
//! source line, a function per name and file, a resource per object.
//!
//! Weights are JSON numbers, exact up to 2^53 (the `fxprof-processed-profile`
//! crate stores them as `i32`, which instruction counts exceed; hence this
//! writer).

use crate::stacks::Stacks;
use rustc_hash::FxHashMap;
use serde_json::{json, Value};
use stacktree::StackTree;
use std::io::{self, Write};

/// The processed-profile version written.
pub const VERSION: u32 = 47;

/// A thread's string table.
#[derive(Default)]
struct Strings {
    list: Vec<String>,
    index: FxHashMap<String, usize>,
}

impl Strings {
    fn get(&mut self, s: &str) -> usize {
        if let Some(&i) = self.index.get(s) {
            return i;
        }
        self.list.push(s.to_string());
        self.index.insert(s.to_string(), self.list.len() - 1);
        self.list.len() - 1
    }
}

/// One event's thread.
fn thread(tree: &StackTree, stacks: &Stacks, event: usize, main: bool) -> Value {
    let mut strings = Strings::default();
    // Functions by (name, file); frames by (function, line, inline depth).
    let mut funcs: FxHashMap<(String, Option<String>), usize> = FxHashMap::default();
    let (mut func_name, mut func_file, mut func_resource) = (vec![], vec![], vec![]);
    let (mut frame_func, mut frame_line, mut frame_depth) = (vec![], vec![], vec![]);
    for f in &stacks.frames {
        let key = (f.name.clone(), f.file.clone());
        let func = *funcs.entry(key).or_insert_with(|| {
            func_name.push(strings.get(&f.name));
            func_file.push(f.file.as_deref().map(|p| strings.get(p)));
            func_resource.push(-1i64);
            func_name.len() - 1
        });
        frame_func.push(func);
        frame_line.push(f.line);
        frame_depth.push(f.inline_depth);
    }
    let n_funcs = func_name.len();
    let n_frames = frame_func.len();
    let prefix: Vec<Option<u32>> = stacks.stacks.iter().map(|s| s.0).collect();
    let frame: Vec<u32> = stacks.stacks.iter().map(|s| s.1).collect();
    let n_stacks = frame.len();
    let (sample_stack, weight): (Vec<u32>, Vec<u64>) = stacks
        .samples
        .iter()
        .filter(|(_, w)| w[event] != 0)
        .map(|(s, w)| (*s, w[event]))
        .unzip();
    let n = weight.len();
    let time: Vec<f64> = (0..n).map(|i| i as f64).collect();
    let name = stacks.events[event].clone();
    json!({
        "processType": "default",
        "processStartupTime": 0,
        "processShutdownTime": null,
        "registerTime": 0,
        "unregisterTime": null,
        "pausedRanges": [],
        "name": name,
        "processName": tree.cmd,
        "isMainThread": main,
        "pid": tree.pid.to_string(),
        "tid": event,
        "samples": {
            "weightType": "samples",
            "weight": weight,
            "stack": sample_stack,
            "time": time,
            "length": n,
        },
        "markers": {
            "data": [], "name": [], "startTime": [], "endTime": [],
            "phase": [], "category": [], "length": 0,
        },
        "stackTable": {
            "frame": frame,
            "prefix": prefix,
            "category": vec![0; n_stacks],
            "subcategory": vec![0; n_stacks],
            "length": n_stacks,
        },
        "frameTable": {
            "address": vec![-1; n_frames],
            "inlineDepth": frame_depth,
            "category": vec![0; n_frames],
            "subcategory": vec![0; n_frames],
            "func": frame_func,
            "nativeSymbol": vec![Value::Null; n_frames],
            "innerWindowID": vec![0; n_frames],
            "implementation": vec![Value::Null; n_frames],
            "line": frame_line,
            "column": vec![Value::Null; n_frames],
            "length": n_frames,
        },
        "funcTable": {
            "isJS": vec![false; n_funcs],
            "relevantForJS": vec![false; n_funcs],
            "name": func_name,
            "resource": func_resource,
            "fileName": func_file,
            "lineNumber": vec![Value::Null; n_funcs],
            "columnNumber": vec![Value::Null; n_funcs],
            "length": n_funcs,
        },
        "resourceTable": { "lib": [], "name": [], "host": [], "type": [], "length": 0 },
        "nativeSymbols": {
            "libIndex": [], "address": [], "name": [], "functionSize": [], "length": 0,
        },
        "stringArray": strings.list,
    })
}

/// Writes the processed profile.
pub fn write(tree: &StackTree, stacks: &Stacks, w: &mut dyn Write) -> Result<(), crate::Error> {
    crate::exact_in_json(stacks)?;
    let threads: Vec<Value> = (0..stacks.events.len())
        .map(|e| thread(tree, stacks, e, e == 0))
        .collect();
    let profile = json!({
        "meta": {
            "version": 27,
            "preprocessedProfileVersion": VERSION,
            "interval": 1,
            "startTime": 0,
            "processType": 0,
            "product": format!("{} ({})", tree.cmd, tree.creator),
            "stackwalk": 0,
            "symbolicationNotSupported": true,
            "categories": [
                { "name": "Other", "color": "grey", "subcategories": ["Other"] },
            ],
            "markerSchema": [],
        },
        "libs": [],
        "pages": [],
        "counters": [],
        "threads": threads,
    });
    let mut w = io::BufWriter::new(w);
    serde_json::to_writer(&mut w, &profile).map_err(io::Error::from)?;
    w.flush()?;
    Ok(())
}
