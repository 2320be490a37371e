//! Tools on a live run, fed by the engine's trace buffers, one per process
//! (a forked child continues with a copy of its parent's, state included,
//! as under Valgrind): Cachegrind's [`costs::CachegrindTool`] and Lackey's
//! [`lackey::LackeyTool`].

use cachesim::CacheSim;
use costs::CachegrindTool;
use engine::{StreamTool, ToolFactory};
use events::Tool;
use std::any::Any;
use std::sync::Arc;

/// A tool the engine can own and fork.
#[derive(Clone)]
pub struct LiveTool<T>(pub T);

impl<T: Tool> Tool for LiveTool<T> {
    events::forward_tool!(0);
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
