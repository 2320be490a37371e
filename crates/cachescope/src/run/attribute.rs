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

fn mapping(m: &ModuleRecord) -> Mapping {
    Mapping {
        path: m.path.clone(),
        start: m.start,
        end: m.end,
        file_offset: m.file_offset,
    }
}

/// Cost centres being accumulated. The symbolizer hands out one shared
/// string per distinct file and function name of an object, so keying on
/// the strings' addresses groups addresses without hashing every name
/// (equal names from different objects are merged when added to the
/// profile).
type PerLocation = HashMap<(usize, usize, u32), (Location, u64)>;

/// Adds `counts`, located through `mappings`, to `per_loc`.
fn locate_all(
    counts: &HashMap<u64, u64>,
    mappings: &[Mapping],
    syms: &mut Symbolizer,
    per_loc: &mut PerLocation,
) {
    // Sorted addresses keep consecutive lookups in the same object and
    // make the result independent of hash order.
    let mut addrs: Vec<(&u64, &u64)> = counts.iter().collect();
    addrs.sort_unstable();
    for (&addr, &count) in addrs {
        let loc = syms.locate(mappings, addr);
        let key = (
            loc.file.as_ptr() as usize,
            loc.func.as_ptr() as usize,
            loc.line,
        );
        per_loc.entry(key).or_insert((loc, 0)).1 += count;
    }
}

/// Builds the `events: Ir` profile of `proc_profile`, resolving each
/// distinct address once. Code unmapped before the end (dlclose) is
/// resolved against the module it ran from, as Cachegrind resolves code
/// when it translates it.
pub fn build_profile(cmd: &str, proc_profile: &ProcessProfile, syms: &mut Symbolizer) -> Profile {
    let mappings: Vec<Mapping> = proc_profile.modules.iter().map(mapping).collect();
    let mut per_loc = PerLocation::new();
    locate_all(&proc_profile.instr_counts, &mappings, syms, &mut per_loc);
    for gone in &proc_profile.unmapped {
        let old: Vec<Mapping> = gone.module.iter().map(mapping).collect();
        locate_all(&gone.instr_counts, &old, syms, &mut per_loc);
    }
    let mut p = Profile::new(cmd, &["Ir"]);
    for (loc, count) in per_loc.into_values() {
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
        let mut gone = engine::UnmappedCode {
            module: None,
            instr_counts: HashMap::new(),
        };
        gone.instr_counts.insert(0x1000, 3);
        pp.unmapped.push(gone);
        let p = build_profile("./x a", &pp, &mut Symbolizer::new());
        assert_eq!(p.cmd, "./x a");
        assert_eq!(p.events, vec!["Ir".to_string()]);
        assert_eq!(p.totals(), vec![10]);
        assert_eq!(p.costs["???"]["???"][&0], vec![10]);
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
