//! The Cachegrind tool on a live run: [`costs::CachegrindTool`] fed by the
//! engine's trace buffers, one per process (a forked child continues with
//! a copy of its parent's, caches and costs included, as under Valgrind).

use cachesim::CacheSim;
use costs::CachegrindTool;
use engine::{StreamTool, ToolFactory};
use events::{BlockId, BlockInfo, Needs, Record, Tool};
use std::any::Any;
use std::sync::Arc;

/// A [`CachegrindTool`] the engine can own and fork.
#[derive(Clone)]
pub struct LiveTool(pub CachegrindTool);

impl Tool for LiveTool {
    fn needs(&self) -> Needs {
        self.0.needs()
    }
    fn block(&mut self, id: BlockId, info: &BlockInfo) {
        self.0.block(id, info);
    }
    #[inline]
    fn record(&mut self, record: Record) {
        self.0.record(record);
    }
    fn records(&mut self, records: &[Record]) {
        self.0.records(records);
    }
    #[inline]
    fn block_run(&mut self, id: BlockId, info: &BlockInfo, addrs: &[u64]) {
        self.0.block_run(id, info, addrs);
    }
}

impl StreamTool for LiveTool {
    fn fork(&self) -> Box<dyn StreamTool> {
        Box::new(self.clone())
    }
    fn into_any(self: Box<Self>) -> Box<dyn Any + Send> {
        self
    }
}

/// A fresh tool per process image: cold `caches` (if simulated) and the
/// branch predictor if `branch_sim`.
pub fn factory(caches: Option<CacheSim>, branch_sim: bool) -> ToolFactory {
    Arc::new(move || Box::new(LiveTool(CachegrindTool::new(caches.clone(), branch_sim))))
}

/// The finished tool of a process, its pending block runs added.
pub fn finished(tool: engine::FinishedTool) -> Option<CachegrindTool> {
    let live = tool.0.into_any().downcast::<LiveTool>().ok()?;
    let mut t = live.0;
    t.finish();
    Some(t)
}
