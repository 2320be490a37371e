//! speedscope's file format (`https://www.speedscope.app/file-format-schema.json`):
//! one "sampled" profile per event, its samples the stacks of the contexts
//! and its weights their self costs. A sampled profile with weights holds
//! the tree exactly (speedscope's "left heavy" and "sandwich" views add
//! the weights up into exact inclusive costs); the samples come in the
//! tree's order (parents before children), so the "time order" view shows
//! each context's stacks together. An "evented" profile would hold the
//! same, as opening and closing times, but invents a timeline.

use crate::stacks::Stacks;
use serde_json::{json, Value};
use stacktree::StackTree;
use std::io::{self, Write};

/// Writes the speedscope file.
pub fn write(tree: &StackTree, stacks: &Stacks, w: &mut dyn Write) -> Result<(), crate::Error> {
    crate::exact_in_json(stacks)?;
    let frames: Vec<Value> = stacks
        .frames
        .iter()
        .map(|f| {
            let mut v = json!({ "name": f.name });
            if let Some(file) = &f.file {
                v["file"] = json!(file);
            }
            if let Some(line) = f.line {
                v["line"] = json!(line);
            }
            v
        })
        .collect();
    let paths: Vec<Vec<u32>> = stacks
        .samples
        .iter()
        .map(|(s, _)| stacks.path(*s))
        .collect();
    let totals = stacks.totals();
    let profiles: Vec<Value> = stacks
        .events
        .iter()
        .enumerate()
        .map(|(e, name)| {
            let (samples, weights): (Vec<&Vec<u32>>, Vec<u64>) = paths
                .iter()
                .zip(&stacks.samples)
                .filter(|(_, (_, w))| w[e] != 0)
                .map(|(p, (_, w))| (p, w[e]))
                .unzip();
            json!({
                "type": "sampled",
                "name": name,
                "unit": "none",
                "startValue": 0,
                "endValue": totals[e],
                "samples": samples,
                "weights": weights,
            })
        })
        .collect();
    let file = json!({
        "$schema": "https://www.speedscope.app/file-format-schema.json",
        "shared": { "frames": frames },
        "profiles": profiles,
        "name": tree.cmd,
        "activeProfileIndex": 0,
        "exporter": format!("{}", tree.creator),
    });
    let mut w = io::BufWriter::new(w);
    serde_json::to_writer(&mut w, &file).map_err(io::Error::from)?;
    w.flush()?;
    Ok(())
}
