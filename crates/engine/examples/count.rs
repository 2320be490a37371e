//! Runs a program under the engine and prints its total instruction count
//! per process: `cargo run -p engine --example count -- prog args`.
//!
//! `COUNT_TRACE_CHILDREN=1` follows execve (`--trace-children=yes`);
//! `COUNT_SMC_CHECK=none|stack|all|all-non-file` is `--smc-check`.
//! With `COUNT_OUT=FILE`, also appends every process's counts to FILE
//! (`process PID`, `module START END OFFSET PATH` and `ADDR COUNT` lines, in
//! hex; counts of unmapped code follow an `unmapped START END OFFSET PATH` line): the engine's integration tests read it.

use std::io::Write;
use std::process::ExitCode;

struct Print;

fn dump(p: &engine::ProcessProfile, path: &std::ffi::OsStr) -> std::io::Result<()> {
    let mut f = std::io::BufWriter::new(
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)?,
    );
    writeln!(f, "process {}", p.pid)?;
    for m in &p.modules {
        writeln!(
            f,
            "module {:x} {:x} {:x} {}",
            m.start,
            m.end,
            m.file_offset,
            m.path.display()
        )?;
    }
    let mut v: Vec<_> = p.instr_counts.iter().collect();
    v.sort();
    for (a, n) in v {
        writeln!(f, "{a:x} {n:x}")?;
    }
    for u in &p.unmapped {
        match &u.module {
            Some(m) => writeln!(
                f,
                "unmapped {:x} {:x} {:x} {}",
                m.start,
                m.end,
                m.file_offset,
                m.path.display()
            )?,
            None => writeln!(f, "unmapped 0 0 0 ")?,
        }
        let mut v: Vec<_> = u.instr_counts.iter().collect();
        v.sort();
        for (a, n) in v {
            writeln!(f, "{a:x} {n:x}")?;
        }
    }
    f.flush()
}

impl engine::ProfileSink for Print {
    fn process_finished(&mut self, p: engine::ProcessProfile) {
        if let Some(path) = std::env::var_os("COUNT_OUT") {
            if let Err(e) = dump(&p, &path) {
                eprintln!("count: cannot write {}: {e}", path.to_string_lossy());
            }
        }
        let total: u64 = p.instr_counts.values().sum::<u64>()
            + p.unmapped
                .iter()
                .flat_map(|u| u.instr_counts.values())
                .sum::<u64>();
        eprintln!(
            "count: pid {} Ir {} ({} addresses, {} modules)",
            p.pid,
            total,
            p.instr_counts.len(),
            p.modules.len()
        );
    }
}

fn main() -> ExitCode {
    let mut args = std::env::args_os().skip(1);
    let Some(program) = args.next() else {
        eprintln!("usage: count PROG [ARGS...]");
        return ExitCode::from(2);
    };
    let cfg = engine::LaunchConfig {
        program,
        args: args.collect(),
        trace_children: std::env::var_os("COUNT_TRACE_CHILDREN").is_some(),
        stats: false,
        tool: None,
        // COUNT_INSTR_AT_START=no: as --instr-at-start=no.
        requests: engine::RequestConfig {
            instr_at_start: std::env::var_os("COUNT_INSTR_AT_START").is_none_or(|v| v != "no"),
            ..engine::RequestConfig::default()
        },
        smc_check: match std::env::var("COUNT_SMC_CHECK") {
            Ok(mode) => match engine::SmcCheck::from_name(&mode) {
                Some(m) => m,
                None => {
                    eprintln!("count: bad COUNT_SMC_CHECK {mode:?}");
                    return ExitCode::from(2);
                }
            },
            Err(_) => engine::SmcCheck::default(),
        },
        contexts: None,
    };
    match engine::run(&cfg, &mut Print) {
        Ok(engine::Outcome::Exited(c)) => ExitCode::from(c as u8),
        Ok(engine::Outcome::Untraced) => ExitCode::SUCCESS,
        Ok(engine::Outcome::Signaled(s)) => {
            eprintln!("count: killed by signal {s}");
            ExitCode::from(128 + s as u8)
        }
        Err(e) => {
            eprintln!("count: {e}");
            ExitCode::from(1)
        }
    }
}
