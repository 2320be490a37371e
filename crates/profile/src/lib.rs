//! Cost data, the `cachegrind.out` format (reader and writer), and the
//! annotate / merge / diff tools that reproduce `cg_annotate`, `cg_merge`
//! and `cg_diff`.
//!
//! * [`Profile`] is the in-memory profile that writers build;
//!   [`Profile::write_to`] writes Cachegrind's exact layout.
//! * [`reader::CgoutReader`] streams any `cachegrind.out` file record by
//!   record; [`Profile::read_from`] builds a [`Profile`] with it.
//! * [`annotate::annotate`], [`merge::merge`] and [`diff::diff`] are the
//!   three tools, printing exactly what Valgrind's Python tools print.
#![forbid(unsafe_code)]

pub mod annotate;
pub mod cc;
pub mod cgout;
pub mod diff;
pub mod lines;
pub mod merge;
pub mod output;
pub mod pytext;
pub mod reader;
pub mod subst;
pub mod tool;

pub use cgout::Profile;
pub use output::write_file_atomic;
