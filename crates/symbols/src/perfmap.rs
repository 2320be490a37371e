//! Names of JIT-compiled code from `/tmp/perf-<pid>.map`, the file that
//! runtimes write for Linux `perf` (node and V8 with `--perf-basic-prof`,
//! the JVM with a perf-map agent, LuaJIT, .NET with `DOTNET_PerfMapEnabled`).
//!
//! Each line is `START SIZE name`: start and size in hex (with or without
//! `0x`), the name the rest of the line, spaces included. As in perf, the
//! names apply to code no object file describes (anonymous memory); a
//! line that cannot be read is skipped. A runtime that reuses memory for
//! new code lists the new code later, so where entries overlap the one
//! listed last wins.

use std::collections::BTreeMap;
use std::path::Path;
use std::rc::Rc;

/// The functions of one perf map, for lookups by address.
#[derive(Debug, Clone, Default)]
pub struct PerfMap {
    /// Disjoint (start, end, name), sorted: later lines painted over
    /// earlier ones.
    ranges: Vec<(u64, u64, Rc<str>)>,
}

impl PerfMap {
    /// The map process `pid` wrote, if it wrote one (`/tmp/perf-<pid>.map`).
    pub fn for_process(pid: i32) -> Option<PerfMap> {
        Self::read(Path::new(&format!("/tmp/perf-{pid}.map")))
    }

    /// The map in file `path`, if it can be read.
    pub fn read(path: &Path) -> Option<PerfMap> {
        let bytes = std::fs::read(path).ok()?;
        Some(Self::parse(&String::from_utf8_lossy(&bytes)))
    }

    /// The map in `text`.
    pub fn parse(text: &str) -> PerfMap {
        let hex = |s: &str| {
            let s = s.strip_prefix("0x").unwrap_or(s);
            u64::from_str_radix(s, 16).ok()
        };
        // Disjoint ranges by start; each line paints over what it covers.
        let mut painted: BTreeMap<u64, (u64, Rc<str>)> = BTreeMap::new();
        for line in text.lines() {
            let mut it = line.trim_start().splitn(3, ' ');
            let (Some(start), Some(size), Some(name)) = (it.next(), it.next(), it.next()) else {
                continue;
            };
            let (Some(start), Some(size)) = (hex(start), hex(size)) else {
                continue;
            };
            let name = name.trim();
            if size == 0 || name.is_empty() {
                continue;
            }
            let end = start.saturating_add(size);
            // The ranges it overlaps: the one before `start` (if it reaches
            // past it) and those starting inside.
            let before = painted
                .range(..start)
                .next_back()
                .filter(|(_, (e, _))| *e > start)
                .map(|(&s, _)| s);
            let inside: Vec<u64> = painted.range(start..end).map(|(&s, _)| s).collect();
            for s in before.into_iter().chain(inside) {
                let (e, n) = painted.remove(&s).expect("a painted range");
                if s < start {
                    painted.insert(s, (start, n.clone()));
                }
                if e > end {
                    painted.insert(end, (e, n));
                }
            }
            painted.insert(start, (end, Rc::from(name)));
        }
        PerfMap {
            ranges: painted.into_iter().map(|(s, (e, n))| (s, e, n)).collect(),
        }
    }

    /// Whether the map lists nothing.
    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    /// The name of the code at `addr`: of the lines that cover it, the one
    /// listed last.
    pub fn name_at(&self, addr: u64) -> Option<Rc<str>> {
        let at = self
            .ranges
            .partition_point(|r| r.0 <= addr)
            .checked_sub(1)?;
        let (_, end, name) = &self.ranges[at];
        (addr < *end).then(|| name.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_give_ranges_and_names_with_spaces() {
        let m = PerfMap::parse(
            "7f0000001000 40 JS:~add /tmp/a.js:1:12\n\
             0x7f0000002000 0x10 Builtin:ArgumentsAdaptorTrampoline\n\
             not a line\n\
             7f0000003000 0 empty\n\
             7f0000004000 zz bad size\n",
        );
        assert_eq!(
            m.name_at(0x7f00_0000_1000).as_deref(),
            Some("JS:~add /tmp/a.js:1:12")
        );
        assert_eq!(
            m.name_at(0x7f00_0000_103f).as_deref(),
            Some("JS:~add /tmp/a.js:1:12")
        );
        assert_eq!(m.name_at(0x7f00_0000_1040), None);
        assert_eq!(
            m.name_at(0x7f00_0000_2008).as_deref(),
            Some("Builtin:ArgumentsAdaptorTrampoline")
        );
        assert_eq!(m.name_at(0x7f00_0000_3000), None);
        assert_eq!(m.name_at(0x7f00_0000_0fff), None);
        assert!(!m.is_empty() && PerfMap::parse("").is_empty());
    }

    #[test]
    fn the_entry_listed_last_wins_where_code_was_replaced() {
        let m = PerfMap::parse(
            "1000 100 old\n\
             1040 10 newer\n\
             1000 20 newest\n",
        );
        assert_eq!(m.name_at(0x1010).as_deref(), Some("newest"));
        assert_eq!(m.name_at(0x1020).as_deref(), Some("old"));
        assert_eq!(m.name_at(0x1044).as_deref(), Some("newer"));
        assert_eq!(m.name_at(0x1050).as_deref(), Some("old"));
        assert_eq!(m.name_at(0x10ff).as_deref(), Some("old"));
        assert_eq!(m.name_at(0x1100), None);
    }

    #[test]
    fn a_missing_file_is_no_map() {
        assert!(PerfMap::read(Path::new("/nonexistent/perf-1.map")).is_none());
    }
}
