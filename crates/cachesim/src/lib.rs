//! Cachegrind's cache and branch-prediction models: I1/D1/LL caches, their
//! configuration (options, CPUID auto-detection, the LL tweak) and the
//! branch predictor. Pure computation: no I/O, no unsafe.
//!
//! The seam with the front ends (trace replay, the instrumentation engine)
//! is a stream of calls: [`CacheSim::instr`] per executed instruction, then
//! [`CacheSim::read`] / [`CacheSim::write`] per data access, and
//! [`BranchPredictor::cond`] / [`BranchPredictor::indirect`] per branch.
//! Each returns the outcome of that one event, so a caller can attribute
//! it to an instruction; [`AccessCounts::record`] keeps totals. Nothing on
//! these paths allocates or hashes.
#![forbid(unsafe_code)]

mod branch;
mod cache;
pub mod config;
pub mod configure;
pub mod cpuid;
mod sim;

pub use branch::BranchPredictor;
pub use config::{CacheConfig, CheckError, OptError};
pub use configure::{configure, CacheOptions, CacheSetup, Fatal, Message};
pub use sim::{AccessCounts, CacheSim, Outcome};
