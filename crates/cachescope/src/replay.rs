//! `cachescope replay`: runs Cachegrind's cache model over a recorded
//! address trace (Lackey or din format), then writes a `cachegrind.out`
//! file and prints Cachegrind's summary. A trace carries no symbols, so
//! every cost lands on `fl=???` / `fn=???`, line 0.

use crate::outfile::{process_env, BadPattern, Expander};
use crate::simopts::{self, SimOptions};
use crate::summary::{summary_lines, Totals};
use cachesim::{AccessCounts, CacheSim};
use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::{self, Read, Write};
use std::process::ExitCode;
use tracefile::{Access, Format};

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

/// Event totals of a replay.
#[derive(Debug, Default, Clone, Copy)]
struct Counts {
    ir: AccessCounts,
    dr: AccessCounts,
    dw: AccessCounts,
}

impl Counts {
    fn totals(&self) -> Totals {
        Totals {
            ir: self.ir.refs,
            i1mr: self.ir.l1_misses,
            ilmr: self.ir.ll_misses,
            dr: self.dr.refs,
            d1mr: self.dr.l1_misses,
            dlmr: self.dr.ll_misses,
            dw: self.dw.refs,
            d1mw: self.dw.l1_misses,
            dlmw: self.dw.ll_misses,
            ..Totals::default()
        }
    }
}

/// Runs the trace through the models (or, without cache simulation, just
/// counts instructions).
fn simulate(
    input: impl Read,
    format: Format,
    sim: Option<&mut CacheSim>,
) -> Result<(Counts, tracefile::TraceStats), tracefile::TraceError> {
    let mut c = Counts::default();
    let stats = match sim {
        Some(sim) => {
            tracefile::read_trace(input, format, |ev| match ev.access {
                Access::Instr => c.ir.record(sim.instr(ev.addr, ev.size)),
                // A modify is one access, counted as a read (spec §1.4).
                Access::Read | Access::Modify => c.dr.record(sim.read(ev.addr, ev.size)),
                Access::Write => c.dw.record(sim.write(ev.addr, ev.size)),
            })?
        }
        None => tracefile::read_trace(input, format, |ev| {
            c.ir.refs += u64::from(ev.access == Access::Instr);
        })?,
    };
    Ok((c, stats))
}

/// The `cachegrind.out` contents for a replay.
fn build_profile(cmd: &str, sim: Option<&CacheSim>, counts: &Counts) -> profile::Profile {
    let mut p = match sim {
        Some(sim) => {
            let mut p = profile::Profile::new(
                cmd,
                &[
                    "Ir", "I1mr", "ILmr", "Dr", "D1mr", "DLmr", "Dw", "D1mw", "DLmw",
                ],
            );
            // Cachegrind writes this events line with a trailing space.
            p.events_text.push(' ');
            p.desc = vec![
                format!("I1 cache:         {}", sim.i1().desc()),
                format!("D1 cache:         {}", sim.d1().desc()),
                format!("LL cache:         {}", sim.ll().desc()),
            ];
            p
        }
        None => profile::Profile::new(cmd, &["Ir"]),
    };
    let t = counts.totals();
    if t.ir + t.dr + t.dw > 0 {
        let all = [
            t.ir, t.i1mr, t.ilmr, t.dr, t.d1mr, t.dlmr, t.dw, t.d1mw, t.dlmw,
        ];
        let n = p.events.len();
        let costs: Vec<i64> = all[..n].iter().map(|&v| v as i64).collect();
        p.add("???", "???", 0, &costs);
    }
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
    let mut sim = None;
    if args.sim.cache_sim {
        match simopts::resolve_caches(&args.sim.caches) {
            Ok(setup) => {
                for l in simopts::prefixed(&setup.messages, pid) {
                    let _ = writeln!(stderr, "{l}");
                }
                sim = Some(CacheSim::new(setup.i1, setup.d1, setup.ll));
            }
            Err(fatal) => {
                for l in simopts::prefixed(&fatal.messages, pid) {
                    let _ = writeln!(stderr, "{l}");
                }
                return ExitCode::from(1);
            }
        }
    }
    let trace_name = args.trace.to_string_lossy().into_owned();
    let input = match open_trace(&args.trace) {
        Ok(r) => r,
        Err(e) => return fail(&[format!("cannot open trace '{trace_name}': {e}")]),
    };
    let counts = match simulate(input, args.format, sim.as_mut()) {
        Ok((c, stats)) => {
            if stats.lines > 0 && stats.events == 0 {
                // Most likely the wrong file or format: say so, but a
                // trace without records is still a valid (empty) replay.
                let _ = writeln!(
                    stderr,
                    "{}: warning: no trace records in '{trace_name}' (wrong --format?)",
                    program_name()
                );
            }
            c
        }
        Err(tracefile::TraceError::Malformed { line, reason }) => {
            return fail(&[format!("{trace_name}:{line}: {reason}")])
        }
        Err(tracefile::TraceError::Io(e)) => {
            return fail(&[format!("error reading trace '{trace_name}': {e}")])
        }
    };
    let profile = build_profile(&trace_name, sim.as_ref(), &counts);
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
    for l in summary_lines(&counts.totals(), args.sim.cache_sim, false) {
        let _ = writeln!(stderr, "=={pid}== {l}");
    }
    ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::*;
    use cachesim::CacheConfig;

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

    #[test]
    fn replays_and_writes_profile() {
        let trace = "I  00401000,4\n L 00600000,8\n M 00600008,4\n S 00700000,8\n\
                     I  00401004,3\n L 00600000,8\n";
        let mut sim = CacheSim::new(
            CacheConfig::new(32768, 8, 64),
            CacheConfig::new(32768, 8, 64),
            CacheConfig::new(262_144, 8, 64),
        );
        let (c, stats) = simulate(trace.as_bytes(), Format::Lackey, Some(&mut sim)).unwrap();
        assert_eq!((stats.lines, stats.events), (6, 6));
        let t = c.totals();
        assert_eq!((t.ir, t.i1mr, t.ilmr), (2, 1, 1));
        assert_eq!((t.dr, t.d1mr, t.dlmr), (3, 1, 1));
        assert_eq!((t.dw, t.d1mw, t.dlmw), (1, 1, 1));
        let mut out = Vec::new();
        build_profile("t.trace", Some(&sim), &c)
            .write_to(&mut out)
            .unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "desc: I1 cache:         32768 B, 64 B, 8-way associative\n\
             desc: D1 cache:         32768 B, 64 B, 8-way associative\n\
             desc: LL cache:         262144 B, 64 B, 8-way associative\n\
             cmd: t.trace\n\
             events: Ir I1mr ILmr Dr D1mr DLmr Dw D1mw DLmw \n\
             fl=???\nfn=???\n0 2 1 1 3 1 1 1 1 1\n\
             summary: 2 1 1 3 1 1 1 1 1\n"
        );
        let (c, _) = simulate(trace.as_bytes(), Format::Lackey, None).unwrap();
        let mut out = Vec::new();
        build_profile("t.trace", None, &c)
            .write_to(&mut out)
            .unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "cmd: t.trace\nevents: Ir\nfl=???\nfn=???\n0 2\nsummary: 2\n"
        );
    }

    #[test]
    fn empty_trace_has_no_records() {
        let (c, stats) = simulate(&b"==1== nothing\n"[..], Format::Lackey, None).unwrap();
        assert_eq!((stats.lines, stats.events), (1, 0));
        let mut out = Vec::new();
        build_profile("-", None, &c).write_to(&mut out).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "cmd: -\nevents: Ir\nsummary: 0\n"
        );
    }
}
