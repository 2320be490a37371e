//! Turning one process's per-address instruction counts into Cachegrind's
//! per-`(file, fn, line)` profile, and a run's event counts into the
//! stderr summary's totals.

use costs::{CachegrindTool, CostCentres, CostTable, Event, EventCounts, EventSet};
use engine::{ModuleRecord, ProcessProfile};
use profile::Profile;
use symbols::{Mapping, PerfMap, Symbolizer};

use crate::summary::Totals;

/// Cachegrind's `cmd:` text: the program as given, then each argument,
/// separated by single spaces (never quoted or escaped).
pub fn command_line(program: &std::ffi::OsStr, args: &[std::ffi::OsString]) -> String {
    let mut cmd = program.to_string_lossy().into_owned();
    for a in args {
        cmd.push(' ');
        cmd.push_str(&a.to_string_lossy());
    }
    cmd
}

/// The command line of live process `pid` (its argv, joined like
/// [`command_line`]), from `/proc`. For an image started by a traced exec
/// this is its argv, where Valgrind would show the path given to `execve`
/// as the first word: they differ only when argv[0] is not that path.
pub fn command_line_of(pid: i32) -> Option<String> {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let mut words = raw.strip_suffix(b"\0").unwrap_or(&raw).split(|&b| b == 0);
    let first = words.next().filter(|w| !w.is_empty())?;
    let mut cmd = String::from_utf8_lossy(first).into_owned();
    for w in words {
        cmd.push(' ');
        cmd.push_str(&String::from_utf8_lossy(w));
    }
    Some(cmd)
}

/// The executable mappings `proc_profile`'s code was translated from.
pub fn mappings(proc_profile: &ProcessProfile) -> Vec<Mapping> {
    proc_profile.modules.iter().map(mapping).collect()
}

pub(crate) fn mapping(m: &ModuleRecord) -> Mapping {
    Mapping {
        path: m.path.clone(),
        start: m.start,
        end: m.end,
        file_offset: m.file_offset,
    }
}

/// The engine's per-address instruction counts as a cost table.
fn ir_table(events: EventSet, counts: &engine::InstrCounts) -> CostTable {
    let mut table = CostTable::new(events);
    table.add_counts(Event::Ir, counts.iter().map(|(&addr, &n)| (addr, n)));
    table
}

/// Builds the `events: Ir` profile of `proc_profile`, resolving each
/// distinct address once, and its event totals. Code unmapped before the
/// end (dlclose) is resolved against the module it ran from, as Cachegrind
/// resolves code when it translates it; code in no object is named from
/// `/tmp/perf-<pid>.map` when the process wrote one.
pub fn build_profile(
    cmd: &str,
    proc_profile: &ProcessProfile,
    tool: Option<&CachegrindTool>,
    syms: &mut Symbolizer,
) -> (Profile, EventCounts) {
    let mappings = mappings(proc_profile);
    // JIT-compiled code is named from the perf map the runtime left, if any
    // (read now, at the process's exit, as perf reads it after the run).
    syms.set_perf_map(PerfMap::for_process(proc_profile.pid));
    if let Some(tool) = tool {
        // Trace mode: the tool simulated and counted everything.
        let events = tool.events();
        let mut centres = CostCentres::new(events);
        centres.add_table(tool.table(), &mappings, syms);
        let mut p = tool.new_profile(cmd);
        centres.add_to(&mut p);
        let counts = events.counts(p.totals().into_iter().map(|v| v as u64));
        return (p, counts);
    }
    // Counting alone: the engine's inline counters.
    let events = EventSet::new(false, false);
    let mut centres = CostCentres::new(events);
    let live = ir_table(events, &proc_profile.instr_counts);
    centres.add_table(&live, &mappings, syms);
    for gone in &proc_profile.unmapped {
        let old: Vec<Mapping> = gone.module.iter().map(mapping).collect();
        centres.add_table(&ir_table(events, &gone.instr_counts), &old, syms);
    }
    let mut p = events.new_profile(cmd);
    centres.add_to(&mut p);
    let counts = events.counts(p.totals().into_iter().map(|v| v as u64));
    (p, counts)
}

/// The stderr summary's totals for a run's (or a replay's) event counts.
pub fn summary_totals(c: EventCounts) -> Totals {
    Totals {
        ir: c.get(Event::Ir),
        i1mr: c.get(Event::I1mr),
        ilmr: c.get(Event::ILmr),
        dr: c.get(Event::Dr),
        d1mr: c.get(Event::D1mr),
        dlmr: c.get(Event::DLmr),
        dw: c.get(Event::Dw),
        d1mw: c.get(Event::D1mw),
        dlmw: c.get(Event::DLmw),
        bc: c.get(Event::Bc),
        bcm: c.get(Event::Bcm),
        bi: c.get(Event::Bi),
        bim: c.get(Event::Bim),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    #[test]
    fn unknown_code_is_attributed_to_question_marks() {
        let mut pp = ProcessProfile {
            pid: 7,
            ..Default::default()
        };
        pp.instr_counts.insert(0x1000, 5);
        pp.instr_counts.insert(0x1004, 2);
        pp.modules.push(ModuleRecord {
            path: PathBuf::new(),
            start: 0x1000,
            end: 0x2000,
            file_offset: 0,
        });
        let mut gone = engine::UnmappedCode {
            module: None,
            instr_counts: Default::default(),
        };
        gone.instr_counts.insert(0x1000, 3);
        pp.unmapped.push(gone);
        let (p, counts) = build_profile("./x a", &pp, None, &mut Symbolizer::new());
        assert_eq!(p.cmd, "./x a");
        assert_eq!(p.events, vec!["Ir".to_string()]);
        assert_eq!(p.totals(), vec![10]);
        assert_eq!(p.costs["???"]["???"][&0], vec![10]);
        assert_eq!(summary_totals(counts).ir, 10);
    }

    #[test]
    fn summary_totals_by_event() {
        let t = summary_totals(EventSet::new(true, true).counts(1..=13));
        assert_eq!((t.ir, t.i1mr, t.ilmr), (1, 2, 3));
        assert_eq!((t.dr, t.d1mr, t.dlmr), (4, 5, 6));
        assert_eq!((t.dw, t.d1mw, t.dlmw), (7, 8, 9));
        assert_eq!((t.bc, t.bcm, t.bi, t.bim), (10, 11, 12, 13));
        let t = summary_totals(EventSet::new(false, true).counts([5, 4, 3, 2, 1]));
        assert_eq!((t.ir, t.dr, t.bc, t.bim), (5, 0, 4, 1));
    }

    #[test]
    fn command_line_of_a_live_process() {
        let me = std::process::id() as i32;
        let cmd = command_line_of(me).unwrap();
        let argv0 = std::env::args().next().unwrap();
        assert!(cmd.starts_with(&argv0), "{cmd}");
        assert_eq!(command_line_of(i32::MAX), None);
    }

    #[test]
    fn command_line_is_joined_with_spaces() {
        let args = vec!["a b".into(), "c".into()];
        assert_eq!(command_line("ls".as_ref(), &args), "ls a b c");
    }
}
