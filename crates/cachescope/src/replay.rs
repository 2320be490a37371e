//! `cachescope replay`: runs Cachegrind's cache model over a recorded
//! address trace (Lackey or din format), then writes a `cachegrind.out`
//! file and prints Cachegrind's summary. A trace carries no symbols, so
//! every cost lands on `fl=???` / `fn=???`, line 0.

use crate::outfile::{process_env, BadPattern, Expander};
use crate::run::summary_totals;
use crate::simopts::{self, SimOptions};
use crate::summary::summary_lines;
use costs::{CachegrindTool, CostCentres};
use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::{self, Read, Write};
use std::process::ExitCode;
use symbols::Symbolizer;
use tracefile::Format;

const USAGE: &str = "\
usage: cachescope replay [options] TRACE

Replays an address trace through Cachegrind's cache model. TRACE is a file,
or - for standard input.

options:
  --format=lackey|din          trace format [lackey]: `valgrind --tool=lackey
                               --trace-mem=yes` output, or Dinero's din
  --I1=<size>,<assoc>,<line>   set I1 cache manually
  --D1=<size>,<assoc>,<line>   set D1 cache manually
  --LL=<size>,<assoc>,<line>   set LL cache manually
  --cache-sim=yes|no           simulate caches [yes]; `no` counts Ir only
  --cachegrind-out-file=<file> output file name [cachegrind.out.%p]
                               (%p: process id, %%: a literal %)
";

/// The replay command line, parsed.
#[derive(Debug)]
struct ReplayArgs {
    format: Format,
    sim: SimOptions,
    out_pattern: String,
    trace: OsString,
}

/// A command-line problem: the lines to print (each prefixed with the
/// program name) before exiting with code 1.
type ArgError = Vec<String>;

fn parse_args(args: &[OsString]) -> Result<Option<ReplayArgs>, ArgError> {
    let mut format = Format::Lackey;
    let mut sim = SimOptions::new(true);
    let mut out_pattern = "cachegrind.out.%p".to_string();
    let mut trace = None;
    for raw in args {
        let Some(arg) = raw.to_str() else {
            // Only the trace path may be non-UTF-8.
            if trace.replace(raw.clone()).is_some() {
                return Err(vec!["replay takes exactly one trace file".into()]);
            }
            continue;
        };
        if arg == "-h" || arg == "--help" {
            return Ok(None);
        }
        if sim.parse_arg(arg).map_err(|e| e.lines)? {
            continue;
        }
        if let Some(v) = arg.strip_prefix("--format=") {
            format = Format::from_name(v).ok_or_else(|| {
                vec![
                    format!("Bad option: {arg}"),
                    format!("Unknown trace format '{v}' (should be 'lackey' or 'din')"),
                    simopts::USE_HELP.to_string(),
                ]
            })?;
        } else if let Some(v) = arg.strip_prefix("--cachegrind-out-file=") {
            out_pattern = v.to_string();
        } else if arg.starts_with("--") {
            return Err(vec![
                format!("Unknown option: {arg}"),
                simopts::USE_HELP.into(),
            ]);
        } else if trace.replace(raw.clone()).is_some() {
            return Err(vec!["replay takes exactly one trace file".into()]);
        }
    }
    if sim.branch_sim {
        return Err(vec![
            "Bad option: --branch-sim=yes".into(),
            "An address trace has no branch events to simulate.".into(),
        ]);
    }
    let trace = trace.ok_or_else(|| vec!["no trace file given (try --help)".to_string()])?;
    Ok(Some(ReplayArgs {
        format,
        sim,
        out_pattern,
        trace,
    }))
}

/// The invoked program's name, for error prefixes.
fn program_name() -> String {
    std::env::args_os()
        .next()
        .and_then(|a| {
            std::path::Path::new(&a)
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
        })
        .unwrap_or_else(|| "cachescope".to_string())
}

fn fail(lines: &[String]) -> ExitCode {
    let prog = program_name();
    let mut err = io::stderr().lock();
    for l in lines {
        let _ = writeln!(err, "{prog}: {l}");
    }
    ExitCode::from(1)
}

/// Runs the trace through `tool`.
fn simulate(
    input: impl Read,
    format: Format,
    tool: &mut CachegrindTool,
) -> Result<tracefile::TraceStats, tracefile::TraceError> {
    tracefile::read_trace(input, format, tool)
}

/// The `cachegrind.out` contents for a replay: a trace carries no
/// mappings, so every address is located to `???`.
fn build_profile(cmd: &str, tool: &CachegrindTool) -> profile::Profile {
    let mut p = tool.new_profile(cmd);
    let mut centres = CostCentres::new(tool.events());
    centres.add_table(tool.table(), &[], &mut Symbolizer::new());
    centres.add_to(&mut p);
    p
}

fn open_trace(path: &OsStr) -> io::Result<Box<dyn Read>> {
    if path == "-" {
        Ok(Box::new(io::stdin().lock()))
    } else {
        Ok(Box::new(File::open(path)?))
    }
}

/// Entry point: `cachescope replay [options] TRACE`.
pub fn main(args: &[OsString]) -> ExitCode {
    let args = match parse_args(args) {
        Ok(Some(a)) => a,
        Ok(None) => {
            print!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(lines) => return fail(&lines),
    };
    let pid = std::process::id();
    let mut expander = Expander::new(std::env::current_dir().ok());
    let out_name = match expander.expand(
        "--cachegrind-out-file",
        &args.out_pattern,
        pid as i32,
        &process_env,
    ) {
        Ok(n) => n,
        Err(BadPattern(lines)) => return fail(&lines),
    };
    let mut stderr = io::stderr().lock();
    let Ok(caches) = simopts::setup_caches(&args.sim, |m| {
        for l in simopts::prefixed(std::slice::from_ref(m), pid) {
            let _ = writeln!(stderr, "{l}");
        }
    }) else {
        return ExitCode::from(1);
    };
    let trace_name = args.trace.to_string_lossy().into_owned();
    let input = match open_trace(&args.trace) {
        Ok(r) => r,
        Err(e) => return fail(&[format!("cannot open trace '{trace_name}': {e}")]),
    };
    let mut tool = CachegrindTool::new(caches, false);
    match simulate(input, args.format, &mut tool) {
        Ok(stats) => {
            if stats.lines > 0 && stats.events == 0 {
                // Most likely the wrong file or format: say so, but a
                // trace without records is still a valid (empty) replay.
                let _ = writeln!(
                    stderr,
                    "{}: warning: no trace records in '{trace_name}' (wrong --format?)",
                    program_name()
                );
            }
        }
        Err(tracefile::TraceError::Malformed { line, reason }) => {
            return fail(&[format!("{trace_name}:{line}: {reason}")])
        }
        Err(tracefile::TraceError::Io(e)) => {
            return fail(&[format!("error reading trace '{trace_name}': {e}")])
        }
    }
    let profile = build_profile(&trace_name, &tool);
    if profile::write_file_atomic(&out_name, |mut w| profile.write_to(&mut w)).is_err() {
        let _ = writeln!(
            stderr,
            "=={pid}== error: can't open output data file '{}'",
            out_name.display()
        );
        let _ = writeln!(
            stderr,
            "=={pid}==        ... so detailed results will be missing."
        );
        return ExitCode::from(1);
    }
    let _ = writeln!(stderr, "=={pid}== ");
    let totals = summary_totals(tool.totals());
    for l in summary_lines(&totals, args.sim.cache_sim, false) {
        let _ = writeln!(stderr, "=={pid}== {l}");
    }
    ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::*;
    use cachesim::{CacheConfig, CacheSim};

    fn os(args: &[&str]) -> Vec<OsString> {
        args.iter().map(OsString::from).collect()
    }

    #[test]
    fn parses_options() {
        let a = parse_args(&os(&[
            "--format=din",
            "--D1=8192,2,64",
            "--cache-sim=no",
            "t.din",
        ]))
        .unwrap()
        .unwrap();
        assert_eq!(a.format, Format::Din);
        assert!(!a.sim.cache_sim);
        assert_eq!(a.sim.caches.d1, Some(CacheConfig::new(8192, 2, 64)));
        assert_eq!(a.trace, "t.din");
        assert!(parse_args(&os(&["--help"])).unwrap().is_none());
        assert_eq!(
            parse_args(&os(&["--format=pin", "t"])).unwrap_err()[1],
            "Unknown trace format 'pin' (should be 'lackey' or 'din')"
        );
        assert_eq!(
            parse_args(&os(&["--bogus", "t"])).unwrap_err()[0],
            "Unknown option: --bogus"
        );
        assert!(parse_args(&os(&["a", "b"])).is_err());
        assert!(parse_args(&os(&[])).is_err());
        assert!(parse_args(&os(&["--branch-sim=yes", "t"])).is_err());
    }

    fn caches() -> CacheSim {
        CacheSim::new(
            CacheConfig::new(32768, 8, 64),
            CacheConfig::new(32768, 8, 64),
            CacheConfig::new(262_144, 8, 64),
        )
    }

    fn profile_text(p: &profile::Profile) -> String {
        let mut out = Vec::new();
        p.write_to(&mut out).unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn replays_and_writes_profile() {
        let trace = "I  00401000,4\n L 00600000,8\n M 00600008,4\n S 00700000,8\n\
                     I  00401004,3\n L 00600000,8\n";
        let mut tool = CachegrindTool::new(Some(caches()), false);
        let stats = simulate(trace.as_bytes(), Format::Lackey, &mut tool).unwrap();
        assert_eq!((stats.lines, stats.events), (6, 6));
        let t = summary_totals(tool.totals());
        assert_eq!((t.ir, t.i1mr, t.ilmr), (2, 1, 1));
        assert_eq!((t.dr, t.d1mr, t.dlmr), (3, 1, 1));
        assert_eq!((t.dw, t.d1mw, t.dlmw), (1, 1, 1));
        assert_eq!(
            profile_text(&build_profile("t.trace", &tool)),
            "desc: I1 cache:         32768 B, 64 B, 8-way associative\n\
             desc: D1 cache:         32768 B, 64 B, 8-way associative\n\
             desc: LL cache:         262144 B, 64 B, 8-way associative\n\
             cmd: t.trace\n\
             events: Ir I1mr ILmr Dr D1mr DLmr Dw D1mw DLmw \n\
             fl=???\nfn=???\n0 2 1 1 3 1 1 1 1 1\n\
             summary: 2 1 1 3 1 1 1 1 1\n"
        );
        let mut tool = CachegrindTool::new(None, false);
        simulate(trace.as_bytes(), Format::Lackey, &mut tool).unwrap();
        assert_eq!(
            profile_text(&build_profile("t.trace", &tool)),
            "cmd: t.trace\nevents: Ir\nfl=???\nfn=???\n0 2\nsummary: 2\n"
        );
    }

    #[test]
    fn empty_trace_has_no_records() {
        let mut tool = CachegrindTool::new(None, false);
        let stats = simulate(&b"==1== nothing\n"[..], Format::Lackey, &mut tool).unwrap();
        assert_eq!((stats.lines, stats.events), (1, 0));
        assert_eq!(
            profile_text(&build_profile("-", &tool)),
            "cmd: -\nevents: Ir\nsummary: 0\n"
        );
    }

    /// Data accesses with no instruction before them (a `din` trace can
    /// start so) still count, on `???` like everything else.
    #[test]
    fn data_before_instructions() {
        let mut tool = CachegrindTool::new(Some(caches()), false);
        simulate(&b"1 7000 8\n"[..], Format::Din, &mut tool).unwrap();
        let text = profile_text(&build_profile("d", &tool));
        assert!(
            text.ends_with("fl=???\nfn=???\n0 0 0 0 0 0 0 1 1 1\nsummary: 0 0 0 0 0 0 1 1 1\n"),
            "{text}"
        );
    }
}
