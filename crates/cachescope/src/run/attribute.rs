//! Turning one process's per-address instruction counts into Cachegrind's
//! per-`(file, fn, line)` profile.

use std::collections::HashMap;

use engine::{ModuleRecord, ProcessProfile};
use profile::Profile;
use symbols::{Location, Mapping, Symbolizer};

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

fn mapping(m: &ModuleRecord) -> Mapping {
    Mapping {
        path: m.path.clone(),
        start: m.start,
        end: m.end,
        file_offset: m.file_offset,
    }
}

/// Builds the `events: Ir` profile of `proc_profile`, resolving each
/// distinct address once.
pub fn build_profile(cmd: &str, proc_profile: &ProcessProfile, syms: &mut Symbolizer) -> Profile {
    let mappings: Vec<Mapping> = proc_profile.modules.iter().map(mapping).collect();
    let mut per_loc: HashMap<Location, u64> = HashMap::new();
    // Sorted addresses keep consecutive lookups in the same object and
    // make the result independent of hash order.
    let mut addrs: Vec<(&u64, &u64)> = proc_profile.instr_counts.iter().collect();
    addrs.sort_unstable();
    for (&addr, &count) in addrs {
        *per_loc.entry(syms.locate(&mappings, addr)).or_insert(0) += count;
    }
    let mut p = Profile::new(cmd, &["Ir"]);
    for (loc, count) in per_loc {
        p.add(&loc.file, &loc.func, loc.line as i64, &[count as i64]);
    }
    p
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
        let p = build_profile("./x a", &pp, &mut Symbolizer::new());
        assert_eq!(p.cmd, "./x a");
        assert_eq!(p.events, vec!["Ir".to_string()]);
        assert_eq!(p.totals(), vec![7]);
        assert_eq!(p.costs["???"]["???"][&0], vec![7]);
    }

    #[test]
    fn command_line_is_joined_with_spaces() {
        let args = vec!["a b".into(), "c".into()];
        assert_eq!(command_line("ls".as_ref(), &args), "ls a b c");
    }
}
