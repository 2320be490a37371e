//! Runs a program under the engine and prints its total instruction count
//! per process: `cargo run -p engine --example count -- prog args`.

use std::process::ExitCode;

struct Print;

impl engine::ProfileSink for Print {
    fn process_finished(&mut self, p: engine::ProcessProfile) {
        let total: u64 = p.instr_counts.values().sum();
        eprintln!(
            "count: pid {} Ir {} ({} addresses, {} modules)",
            p.pid,
            total,
            p.instr_counts.len(),
            p.modules.len()
        );
        if std::env::var_os("COUNT_DUMP").is_some() {
            let mut v: Vec<_> = p.instr_counts.iter().collect();
            v.sort();
            for (a, n) in v {
                eprintln!("{a:#x} {n}");
            }
        }
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
        trace_children: false,
    };
    match engine::run(&cfg, &mut Print) {
        Ok(engine::Outcome::Exited(c)) => ExitCode::from(c as u8),
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
