//! The end of a process: every counter, of live and exited threads, is
//! attributed to the guest instructions of its block, and `--stats=yes`
//! gets what translated code counted and how big the tool's structures
//! grew. Counts of retired blocks go with the module they ran from.

use super::blocks::Block;
use super::Space;
use crate::layout::CHUNK_SIZE;
use crate::{EngineStats, InstrCounts, ProcessProfile, TraceStats, UnmappedCode};
use rustc_hash::FxHashMap as HashMap;

impl Space {
    /// The profile of process `pid` (whose memory is still there).
    /// `last`: no other process shares this address space, so nothing
    /// runs its code again and what the profile needs of the translation
    /// tables is moved out of them rather than copied (python-import: the
    /// copy of every block's description took 4 % of the tracer's perf
    /// samples).
    pub fn collect(&mut self, pid: i32, last: bool) -> ProcessProfile {
        if let Some(dir) = std::env::var_os("CACHESCOPE_ENGINE_DUMP") {
            // Debugging aid: the code cache as it is, one file per chunk.
            for c in self.cache.chunks() {
                if let Ok(code) = self.mem.read(c.base, CHUNK_SIZE as usize) {
                    let path =
                        std::path::Path::new(&dir).join(format!("chunk-{pid}-{:x}.bin", c.base));
                    let _ = std::fs::write(path, code);
                }
            }
        }
        // Trace mode: every thread's records are with the consumer (each
        // thread's were handed over as it exited); its tool has the counts,
        // or gets them now.
        self.hand_over_runs();
        let live: Vec<(u64, u32)> = self
            .areas
            .live_areas()
            .into_iter()
            .map(|a| (a, crate::layout::valgrind_thread_id(a) as u32))
            .collect();
        let contexts = self.contexts_profile(&live, last);
        let traced = self.tracing.as_ref().map(|t| (t.link.finish(), t.stats));
        if let Some((tool, trace)) = traced {
            let tool_time = tool.as_ref().map(|(_, busy)| *busy).unwrap_or_default();
            return ProcessProfile {
                pid,
                stats: self.count_lookups.then(|| EngineStats {
                    trace: Some(TraceStats { tool_time, ..trace }),
                    ..self.stats_at_exit()
                }),
                instr_counts: InstrCounts::default(),
                modules: self.modules.records().to_vec(),
                unmapped: Vec::new(),
                tool: tool.map(|(tool, _)| crate::FinishedTool(tool)),
                contexts,
            };
        }
        let counts = self.areas.counts(&mut *self.mem);
        let stats = self.count_lookups.then(|| match &contexts {
            Some(c) if c.tagged => tagged_blocks_ran(c),
            _ => {
                let ran = self.blocks.live().chain(self.blocks.retired());
                ran.filter(|b| counts.get(b.counter) != 0).count() as u64
            }
        });
        let stats = stats.map(|blocks_executed| EngineStats {
            blocks_executed,
            ..self.stats_at_exit()
        });
        let add = |map: &mut InstrCounts, b: &Block| {
            let n = counts.get(b.counter);
            if !b.deltas().is_empty() {
                for (&a, &d) in b.counted.iter().zip(b.deltas()) {
                    *map.entry(a).or_default() += n.wrapping_add_signed(d);
                }
            } else if n != 0 {
                for &a in &b.counted {
                    *map.entry(a).or_default() += n;
                }
            }
            for &(a, ctr) in b.reps() {
                let n = counts.get(ctr);
                if n != 0 {
                    *map.entry(a).or_default() += n;
                }
            }
        };
        let mut instr_counts = InstrCounts::default();
        for b in self.blocks.live() {
            add(&mut instr_counts, b);
        }
        let mut unmapped: HashMap<usize, InstrCounts> = HashMap::default();
        for b in self.blocks.retired() {
            add(unmapped.entry(b.module()).or_default(), b);
        }
        let modules = self.modules.records();
        let mut unmapped: Vec<UnmappedCode> = unmapped
            .into_iter()
            .filter(|(_, c)| !c.is_empty())
            .map(|(m, instr_counts)| UnmappedCode {
                module: modules.get(m).cloned(),
                instr_counts,
            })
            .collect();
        unmapped.sort_by_key(|u| u.module.as_ref().map(|m| (m.start, m.path.clone())));
        ProcessProfile {
            pid,
            stats,
            instr_counts,
            modules: modules.to_vec(),
            unmapped,
            tool: None,
            contexts,
        }
    }

    /// The `--stats=yes` figures, with what translated code counted in the
    /// thread areas still alive.
    fn stats_at_exit(&mut self) -> EngineStats {
        let mut s = self.stats.clone();
        [s.lookup_inline_hits, s.lookup_probes, s.lookup_probe_hits] =
            self.areas.lookup_counts(&mut *self.mem);
        let table = self.lookups.table();
        s.table_targets = table.len() as u64;
        s.table_overflow_buckets = table.overflow_buckets() as u64;
        s.table_refused = table.refused();
        s.code_cache_chunks = self.cache.len() as u64;
        s.code_cache_bytes = self.cache.bytes_used();
        s
    }
}

/// Tagged counting: how many block ids counted any Ir, in any thread's
/// slots or arena (`--stats=yes`'s blocks that ran; skipped code's blocks,
/// which count in their call site's record, only where they also ran
/// outside it).
fn tagged_blocks_ran(c: &crate::ContextsProfile) -> u64 {
    use ctxrt::tagged::{slot_counts, TaggedArena};
    let mut ran = vec![false; c.blocks.len()];
    for t in &c.threads {
        let arena = TaggedArena::new(&t.arena);
        for (_, b, ir) in slot_counts(&t.slots).chain(arena.counts()) {
            if let Some(r) = ran.get_mut(b as usize).filter(|_| ir != 0) {
                *r = true;
            }
        }
    }
    ran.iter().filter(|&&r| r).count() as u64
}
