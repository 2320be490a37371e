//! Cost building shared by live runs and trace replay.
//!
//! * [`EventSet`]: the events a run collects (Cachegrind's names and column
//!   order, decided by `--cache-sim` and `--branch-sim`), the one place
//!   that knows them.
//! * [`CostTable`]: costs per instruction address, one dense row per
//!   address.
//! * [`CachegrindTool`]: an [`events::Tool`] that runs the cache and branch
//!   models over the event stream and fills a [`CostTable`].
//! * [`CostCentres`]: attribution of tables to Cachegrind's
//!   `(file, fn, line)` cost centres through [`symbols`], into a
//!   [`profile::Profile`].
//!
//! A live run turns the engine's instruction counts into a table
//! ([`CostTable::add_counts`]); a replay feeds trace records to a
//! [`CachegrindTool`]. Both end in the same attribution.
#![forbid(unsafe_code)]

mod cachegrind;
mod centres;
mod set;
mod table;

pub use cachegrind::{BlockSim, CachegrindTool, Charge};
pub use centres::CostCentres;
pub use set::{Event, EventCounts, EventSet};
pub use table::CostTable;
