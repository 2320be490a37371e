//! `cachescope export KIND [options] STACKTREE -o FILE`: an export of a
//! saved stack-tree file (`--export=stacktree:FILE` on a callgrind run).

use std::ffi::OsString;
use std::fs::File;
use std::io::{self, BufReader, Write};
use std::path::PathBuf;
use std::process::ExitCode;

const USAGE: &str = "\
usage: cachescope export KIND [options] STACKTREE -o FILE

Writes an export of a stack-tree file (made by a run with
--tool=callgrind --export=stacktree:FILE). KIND is one of:
  folded      root;...;leaf COUNT lines of one event
  svg         a flame graph of one event
  speedscope  a speedscope file, one profile per event
  firefox     a Firefox Profiler processed profile, one thread per event
  stacktree   the stack-tree file again

options:
  -o FILE        output file (- for standard output)
  --event=EV     the event of folded and svg [the first]
  --thread=N     only thread N [all threads]
  --inline       inline frames from the objects' DWARF after each function
";

/// The parsed command line.
struct Args {
    kind: export::Kind,
    options: export::Options,
    input: PathBuf,
    output: PathBuf,
}

fn parse(args: &[OsString]) -> Result<Args, String> {
    let mut kind = None;
    let mut input = None;
    let mut output = None;
    let mut options = export::Options::default();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let s = a
            .to_str()
            .ok_or_else(|| format!("argument is not UTF-8: {}", a.to_string_lossy()))?;
        if s == "-o" {
            let o = it.next().ok_or("-o needs a file name")?;
            output = Some(PathBuf::from(o));
        } else if let Some(o) = s.strip_prefix("-o").filter(|o| !o.is_empty()) {
            output = Some(PathBuf::from(o));
        } else if let Some(e) = s.strip_prefix("--event=") {
            options.event = Some(e.to_string());
        } else if let Some(t) = s.strip_prefix("--thread=") {
            let t = t.parse().map_err(|_| format!("bad thread number '{t}'"))?;
            options.thread = Some(t);
        } else if s == "--inline" {
            options.inline = true;
        } else if s.starts_with('-') && s != "-" {
            return Err(format!("unknown option '{s}'"));
        } else if kind.is_none() {
            kind = Some(s.parse::<export::Kind>()?);
        } else if input.is_none() {
            input = Some(PathBuf::from(a));
        } else {
            return Err(format!("unexpected argument '{s}'"));
        }
    }
    Ok(Args {
        kind: kind.ok_or("no export kind given")?,
        options,
        input: input.ok_or("no stack-tree file given")?,
        output: output.ok_or("no output file given (-o FILE)")?,
    })
}

/// Runs `cachescope export`.
pub fn main(args: &[OsString]) -> ExitCode {
    if args.iter().any(|a| a == "-h" || a == "--help") {
        print!("{USAGE}");
        return ExitCode::SUCCESS;
    }
    let args = match parse(args) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("cachescope export: {e}");
            eprint!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("cachescope export: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &Args) -> Result<(), String> {
    let name = args.input.display();
    let file = File::open(&args.input).map_err(|e| format!("{name}: {e}"))?;
    let tree = stacktree::read(BufReader::new(file)).map_err(|e| format!("{name}: {e}"))?;
    // Checked before the output is opened, so that a bad option leaves no file.
    export::check(&tree, &args.options).map_err(|e| e.to_string())?;
    let write = |w: &mut dyn Write| {
        export::export(&tree, args.kind, &args.options, w).map_err(|e| match e {
            export::Error::Io(e) => e,
            other => io::Error::other(other.to_string()),
        })
    };
    let out = args.output.display();
    if args.output.as_os_str() == "-" {
        let mut stdout = io::stdout().lock();
        return write(&mut stdout).map_err(|e| format!("standard output: {e}"));
    }
    profile::output::write_output(&args.output, 0o644, write).map_err(|e| match e {
        profile::output::OutputError::Open(e) => format!("{out}: {e}"),
        profile::output::OutputError::Write(e) => format!("{out}: {e}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os(a: &[&str]) -> Vec<OsString> {
        a.iter().map(OsString::from).collect()
    }

    #[test]
    fn parses_and_refuses() {
        let a = parse(&os(&[
            "svg",
            "--event=Ir",
            "--thread=2",
            "--inline",
            "t",
            "-o",
            "x",
        ]))
        .unwrap();
        assert_eq!(a.kind, export::Kind::Svg);
        assert_eq!(a.options.event.as_deref(), Some("Ir"));
        assert_eq!((a.options.thread, a.options.inline), (Some(2), true));
        assert_eq!(
            (a.input.to_str(), a.output.to_str()),
            (Some("t"), Some("x"))
        );
        assert_eq!(
            parse(&os(&["folded", "t"])).err().unwrap(),
            "no output file given (-o FILE)"
        );
        assert!(parse(&os(&["pdf", "t", "-o", "x"]))
            .err()
            .unwrap()
            .starts_with("unknown export kind"));
        assert_eq!(
            parse(&os(&["folded", "--x", "t"])).err().unwrap(),
            "unknown option '--x'"
        );
        assert_eq!(
            parse(&os(&["folded", "--thread=a", "t"])).err().unwrap(),
            "bad thread number 'a'"
        );
    }
}
