//! `--tool=lackey`: Valgrind's Lackey on the engine's stream. The tool
//! itself (the trace and the counts) is [`lackey::LackeyTool`]; here are
//! its options, its tool per process image and its end-of-process summary
//! in Lackey's words.
//!
//! Lackey prints its trace with `VG_(printf)`: to the log (stderr or the
//! `--log-file`), without the `==PID==` prefix, between the preamble and
//! the blank line that starts the summary, even with `-q`. Here the trace
//! is buffered, so a client's own writes to the same stderr are not
//! interleaved line by line with it as under Valgrind.

use engine::{ProcessProfile, ToolFactory};
use lackey::{BasicCounts, LackeyOptions, LackeyTool, TraceOut};
use symbols::{Mapping, Symbolizer};

use super::live;
use super::options::{bad_option, yes_no, UsageError};
use crate::summary::{commas, vg_float};

/// Takes `arg` if it is one of Lackey's options.
pub fn parse_arg(opts: &mut LackeyOptions, arg: &str) -> Result<bool, UsageError> {
    let Some((name, value)) = arg.split_once('=') else {
        return Ok(false);
    };
    match name {
        "--trace-mem" => opts.trace_mem = yes_no(arg, value)?,
        "--basic-counts" => opts.basic_counts = yes_no(arg, value)?,
        "--fnname" if !value.is_empty() => opts.fnname = value.to_string(),
        // Counts of VEX IR operations and superblock entries: nothing here
        // corresponds to them (the engine copies machine code).
        "--detailed-counts" | "--trace-superblocks" => {
            if yes_no(arg, value)? {
                return Err(bad_option(
                    arg,
                    "not supported: it counts Valgrind's VEX IR superblocks and operations",
                ));
            }
        }
        _ => return Ok(false),
    }
    Ok(true)
}

/// A fresh Lackey tool per process image, tracing to `out`.
pub fn factory(opts: &LackeyOptions, out: TraceOut) -> ToolFactory {
    let opts = opts.clone();
    live::factory(move || LackeyTool::new(&opts, out.clone()))
}

/// The summary of a finished process (empty without the basic counts or
/// when the process had no tool), its trace written out first. Calls are
/// counted at the entries of functions named `opts.fnname`, found with
/// `syms` among the process's mappings.
pub fn finish(
    opts: &LackeyOptions,
    out: &TraceOut,
    proc_profile: &mut ProcessProfile,
    mappings: &[Mapping],
    syms: &mut Symbolizer,
) -> Vec<String> {
    out.flush();
    let tool = proc_profile
        .tool
        .take()
        .and_then(live::finished::<LackeyTool>);
    match tool {
        Some(t) if opts.basic_counts => {
            let calls =
                t.calls(|addr| syms.entry_name(mappings, addr).as_deref() == Some(&opts.fnname));
            summary_lines(&t.counts(), calls, &opts.fnname)
        }
        _ => Vec::new(),
    }
}

/// Lackey's `--basic-counts` summary, as far as it means something here:
/// the superblock and IR statement counts (and their ratios) are VEX's and
/// are left out, and so is `Exit code:`, which Valgrind always prints as 0.
fn summary_lines(c: &BasicCounts, calls: u64, fnname: &str) -> Vec<String> {
    let taken_pct = c.jccs_taken as f64 * 100.0 / c.jccs.max(1) as f64;
    vec![
        format!(
            "Counted {} call{} to {fnname}()",
            commas(calls, 0),
            if calls == 1 { "" } else { "s" }
        ),
        String::new(),
        "Jccs:".to_string(),
        format!("  total:         {}", commas(c.jccs, 0)),
        format!(
            "  taken:         {} ({}%)",
            commas(c.jccs_taken, 0),
            vg_float(taken_pct, 0, 0)
        ),
        String::new(),
        "Executed:".to_string(),
        format!("  guest instrs:  {}", commas(c.guest_instrs, 0)),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options() {
        let mut o = LackeyOptions::default();
        assert!(parse_arg(&mut o, "--trace-mem=yes").unwrap());
        assert!(parse_arg(&mut o, "--basic-counts=no").unwrap());
        assert!(parse_arg(&mut o, "--fnname=work").unwrap());
        assert!(parse_arg(&mut o, "--detailed-counts=no").unwrap());
        assert!(!parse_arg(&mut o, "--cache-sim=yes").unwrap());
        assert!(!parse_arg(&mut o, "-q").unwrap());
        assert_eq!(
            o,
            LackeyOptions {
                trace_mem: true,
                basic_counts: false,
                fnname: "work".into()
            }
        );
        let e = parse_arg(&mut o, "--trace-mem=maybe").unwrap_err();
        assert_eq!(e.0[0], "Bad option: --trace-mem=maybe");
        let e = parse_arg(&mut o, "--trace-superblocks=yes").unwrap_err();
        assert!(e.0[1].contains("not supported"), "{:?}", e.0);
    }

    /// The lines of Valgrind 3.19's Lackey that we print, in its layout.
    #[test]
    fn summary_reads_like_lackeys() {
        let c = BasicCounts {
            guest_instrs: 125_778,
            jccs: 25_645,
            jccs_taken: 10_238,
        };
        assert_eq!(
            summary_lines(&c, 1, "main"),
            [
                "Counted 1 call to main()",
                "",
                "Jccs:",
                "  total:         25,645",
                "  taken:         10,238 (40%)",
                "",
                "Executed:",
                "  guest instrs:  125,778",
            ]
        );
        let none = summary_lines(&BasicCounts::default(), 0, "f");
        assert_eq!(none[0], "Counted 0 calls to f()");
        assert_eq!(none[4], "  taken:         0 (0%)");
    }
}
