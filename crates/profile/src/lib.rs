//! Cost data, the `cachegrind.out` format (reader and writer), and the
//! annotate / merge / diff tools that reproduce `cg_annotate`, `cg_merge`
//! and `cg_diff`.
#![forbid(unsafe_code)]

pub mod cgout;

pub use cgout::{write_file_atomic, Profile};
