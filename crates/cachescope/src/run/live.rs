//! Tools on a live run, fed by the engine's trace buffers, one per process
//! (a forked child continues with a copy of its parent's, state included,
//! as under Valgrind): Cachegrind's [`costs::CachegrindTool`] and Lackey's
//! [`lackey::LackeyTool`].

use cachesim::CacheSim;
use costs::CachegrindTool;
use engine::{StreamTool, ToolFactory};
use events::{BlockId, BlockInfo, Needs, Record, Tool};
use std::any::Any;
use std::sync::Arc;

/// A tool the engine can own and fork.
#[derive(Clone)]
pub struct LiveTool<T>(pub T);

impl<T: Tool> Tool for LiveTool<T> {
    fn needs(&self) -> Needs {
        self.0.needs()
    }
    fn block(&mut self, id: BlockId, info: &BlockInfo) {
        self.0.block(id, info);
    }
    // Always: the engine's decoder makes branch records of a known kind
    // per block, and inlined, the match on the kind folds away.
    #[inline(always)]
    fn record(&mut self, record: Record) {
        self.0.record(record);
    }
    fn records(&mut self, records: &[Record]) {
        self.0.records(records);
    }
    // Always: the engine's decoding loop is compiled per tool type so that
    // the per-block path inlines into it (5 % of the consumer on bzip2).
    #[inline(always)]
    fn block_run(&mut self, id: BlockId, info: &BlockInfo, addrs: &[u64]) {
        self.0.block_run(id, info, addrs);
    }
    #[inline(always)]
    fn block_run_kept(&mut self, id: BlockId, info: &BlockInfo, kept: &[u64]) {
        self.0.block_run_kept(id, info, kept);
    }
    #[inline(always)]
    fn kept_accesses(&mut self, id: BlockId, info: &BlockInfo, kept: &[u64]) {
        self.0.kept_accesses(id, info, kept);
    }
    #[inline(always)]
    fn counted_access(&mut self, id: BlockId, kept: events::KeptAccess) {
        self.0.counted_access(id, kept);
    }
    fn block_runs(&mut self, id: BlockId, runs: u64) {
        self.0.block_runs(id, runs);
    }
    fn block_sites(&mut self, id: BlockId, first: u32) {
        self.0.block_sites(id, first);
    }
    #[inline(always)]
    fn site_accesses(&mut self, words: &[u64]) -> usize {
        self.0.site_accesses(words)
    }
    fn branch_words(&mut self, words: &[u64]) {
        self.0.branch_words(words);
    }
}

impl<T: Tool + Clone + Send + 'static> StreamTool for LiveTool<T> {
    fn fork(&self) -> Box<dyn StreamTool> {
        Box::new(self.clone())
    }
    fn into_any(self: Box<Self>) -> Box<dyn Any + Send> {
        self
    }
}

/// A fresh tool per process image, made by `make`.
pub fn factory<T: Tool + Clone + Send + 'static>(
    make: impl Fn() -> T + Send + Sync + 'static,
) -> ToolFactory {
    Arc::new(move || Box::new(LiveTool(make())))
}

/// The Cachegrind tool of each process image: cold `caches` (if
/// simulated) and the branch predictor if `branch_sim`.
pub fn cachegrind(caches: Option<CacheSim>, branch_sim: bool) -> ToolFactory {
    factory(move || CachegrindTool::for_block_runs(caches.clone(), branch_sim))
}

/// The finished tool of a process, if it is a `T`.
pub fn finished<T: 'static>(tool: engine::FinishedTool) -> Option<T> {
    let live = tool.0.into_any().downcast::<LiveTool<T>>().ok()?;
    Some(live.0)
}

/// The finished Cachegrind tool of a process, its pending block runs
/// added and its model freed.
pub fn finished_cachegrind(tool: engine::FinishedTool) -> Option<CachegrindTool> {
    let mut t = finished::<CachegrindTool>(tool)?;
    t.end();
    Some(t)
}
