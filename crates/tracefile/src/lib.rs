//! Readers for recorded address traces (Valgrind Lackey's `--trace-mem=yes`
//! output, Dinero IV's `din` format) that feed the simulation seam.
#![forbid(unsafe_code)]
