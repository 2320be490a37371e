//! Cachegrind's cache and branch-prediction models: I1/D1/LL caches, their
//! configuration (options, CPUID auto-detection, the LL tweak) and the
//! branch predictor. Pure computation: no I/O, no unsafe.
#![forbid(unsafe_code)]
