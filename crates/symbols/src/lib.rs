//! Symbolization of instruction addresses into Cachegrind's
//! `(file, function, line)` triples, from ELF symbol tables and DWARF.
#![forbid(unsafe_code)]
