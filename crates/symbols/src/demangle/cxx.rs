//! The pure-Rust C++ demangler of the default build: `cpp_demangle` (the
//! gimli-rs Itanium demangler), its text rewritten by [`super::gnu_style`]
//! into libiberty's presentation, with libiberty's limits.

use cpp_demangle::{DemangleOptions, DemangleWrite, Symbol};

/// libiberty refuses names longer than this (1,024-byte names demangle,
/// 1,025-byte ones are kept raw: measured on libiberty 20230104), so Valgrind
/// shows such names mangled and so do we.
const MAX_MANGLED_LEN: usize = 1024;

/// Demangled text longer than this is given up on and the name kept raw.
/// Substitutions let a short name expand exponentially (each `S_IS0_S0_E`
/// doubles the output), and `cpp_demangle`, like libiberty, would print it
/// all: 233 bytes of name took three minutes and 2 GB. The longest
/// demangling among 210,398 real names is 8,358 bytes.
const MAX_DEMANGLED_LEN: usize = 64 * 1024;

/// Demangles a C++ name the way libiberty does, or `None` where it cannot.
pub(super) fn demangle(raw: &str) -> Option<String> {
    if raw.len() > MAX_MANGLED_LEN {
        return None;
    }
    let symbol = Symbol::new(raw.as_bytes()).ok()?;
    let mut out = Bounded(String::new());
    // Default options are libiberty's DMGL_PARAMS | DMGL_ANSI: parameters,
    // return types of templates and cv-qualifiers shown, literal types kept
    // (libiberty prints them, as suffixes or casts).
    symbol
        .structured_demangle(&mut out, &DemangleOptions::new())
        .ok()?;
    Some(super::gnu_style::rewrite(raw, out.0))
}

/// A demangling sink that fails once [`MAX_DEMANGLED_LEN`] is passed, which
/// makes `cpp_demangle` stop early.
struct Bounded(String);

impl DemangleWrite for Bounded {
    fn write_string(&mut self, s: &str) -> std::fmt::Result {
        if self.0.len() + s.len() > MAX_DEMANGLED_LEN {
            return Err(std::fmt::Error);
        }
        self.0.push_str(s);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn libiberty_length_limit() {
        let fits = format!("_Z1f{}i", "P".repeat(20));
        assert!(demangle(&fits).is_some());
        let long = format!("_ZN{}3barEv", "3foo".repeat(254));
        assert!(long.len() > MAX_MANGLED_LEN);
        assert_eq!(demangle(&long), None);
    }
}
