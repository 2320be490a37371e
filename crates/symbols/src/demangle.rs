//! Name demangling and Valgrind's `(below main)` renaming.
//!
//! Valgrind demangles with libiberty's `cplus_demangle(name, DMGL_ANSI |
//! DMGL_PARAMS)` for names starting `_Z` or `_R`, which tries Rust first
//! (legacy and v0, hashes hidden because `DMGL_VERBOSE` is not set) and then
//! the C++ (Itanium) demangler; on failure the raw name is kept. Rust names go
//! through rustc-demangle. C++ names go, by default, through the pure-Rust
//! [`cxx_rust`] (the `cpp_demangle` crate plus a layer that rewrites its text
//! into libiberty's presentation), which agrees with libiberty on all but a
//! small, listed set of names (`tests/demangle_libiberty.rs`); with the cargo
//! feature `libiberty` they go through libiberty itself (`cxx_libiberty`),
//! so every name is exactly Valgrind's. Then the known callers of `main` are
//! renamed `(below main)` (exact names only: a version-decorated name such as
//! `__libc_start_main@@GLIBC_2.34` is not).

mod cxx;
mod gnu_style;
#[cfg(feature = "libiberty")]
mod libiberty;

/// Whether C++ names come from libiberty itself (the cargo feature
/// `libiberty`), i.e. are exactly the names Valgrind shows. Without it they
/// come from [`cxx_rust`].
pub const CXX_IS_LIBIBERTY: bool = cfg!(feature = "libiberty");

/// The pure-Rust C++ demangler: `cpp_demangle`, with its text rewritten into
/// libiberty's presentation, `None` where it does not demangle the name.
/// Present in every build, so that tests can compare it with libiberty when
/// both are there.
pub fn cxx_rust(raw: &str) -> Option<String> {
    cxx::demangle(raw)
}

/// libiberty's C++ demangler (what Valgrind embeds), called with Valgrind's
/// flags; `None` where libiberty refuses the name.
#[cfg(feature = "libiberty")]
pub fn cxx_libiberty(raw: &str) -> Option<String> {
    libiberty::demangle(raw)
}

/// What Valgrind shows in place of a function below `main`.
pub const BELOW_MAIN: &str = "(below main)";

/// How function names are shown: Valgrind's `--demangle` and
/// `--show-below-main` options.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NameOptions {
    /// Demangle C++ and Rust names (`--demangle=yes`, the default).
    pub demangle: bool,
    /// Rename `main`'s callers `(below main)` (`--show-below-main=no`, the
    /// default).
    pub rename_below_main: bool,
}

impl Default for NameOptions {
    fn default() -> Self {
        NameOptions {
            demangle: true,
            rename_below_main: true,
        }
    }
}

/// Demangles `raw` the way Valgrind's `VG_(get_fnname)` does and applies the
/// below-main renaming.
pub fn display_name(raw: &str) -> String {
    display_name_with(raw, NameOptions::default())
}

/// [`display_name`] under the given options.
pub fn display_name_with(raw: &str, opts: NameOptions) -> String {
    let name = if opts.demangle {
        demangle(raw)
    } else {
        raw.to_string()
    };
    if opts.rename_below_main && is_below_main(&name) {
        BELOW_MAIN.to_string()
    } else {
        name
    }
}

/// Demangles a Rust or C++ symbol name, returning it unchanged when it is
/// neither (or does not parse).
pub fn demangle(raw: &str) -> String {
    let b = raw.as_bytes();
    if b.len() < 2 || b[0] != b'_' || !(b[1] == b'Z' || b[1] == b'R') {
        return raw.to_string();
    }
    if let Ok(d) = rustc_demangle::try_demangle(raw) {
        // `{:#}` is rustc-demangle's form without the hash / disambiguators,
        // which is what libiberty prints without DMGL_VERBOSE.
        return format!("{d:#}");
    }
    #[cfg(feature = "libiberty")]
    let cxx = cxx_libiberty(raw);
    #[cfg(not(feature = "libiberty"))]
    let cxx = cxx_rust(raw);
    cxx.unwrap_or_else(|| raw.to_string())
}

/// Whether Valgrind renames this (demangled) name to `(below main)`
/// (`VG_(get_fnname_kind)` on Linux).
pub fn is_below_main(name: &str) -> bool {
    matches!(
        name,
        "__libc_start_main" | "__libc_start_call_main" | "generic_start_main" | "_start"
    ) || name.starts_with("__libc_start_main.")
        || name.starts_with("generic_start_main.")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn below_main_names_are_exact() {
        assert_eq!(display_name("__libc_start_call_main"), BELOW_MAIN);
        assert_eq!(display_name("_start"), BELOW_MAIN);
        assert_eq!(display_name("__libc_start_main.cold"), BELOW_MAIN);
        assert_eq!(
            display_name("__libc_start_main@@GLIBC_2.34"),
            "__libc_start_main@@GLIBC_2.34"
        );
        assert_eq!(display_name("main"), "main");
        assert_eq!(display_name("_start_foo"), "_start_foo");
    }

    #[test]
    fn options_turn_demangling_and_renaming_off() {
        let raw = NameOptions {
            demangle: false,
            rename_below_main: false,
        };
        assert_eq!(display_name_with("_Z3fooi", raw), "_Z3fooi");
        assert_eq!(display_name_with("_start", raw), "_start");
        let only_renaming = NameOptions {
            demangle: false,
            ..NameOptions::default()
        };
        assert_eq!(display_name_with("_start", only_renaming), BELOW_MAIN);
    }

    #[test]
    fn cxx_names_demangle_like_valgrind() {
        assert_eq!(demangle("_Z3fooi"), "foo(int)");
        assert_eq!(
            demangle("_ZNSt6vectorIiSaIiEE9push_backERKi"),
            "std::vector<int, std::allocator<int> >::push_back(int const&)"
        );
        // Without DMGL_VERBOSE, standard abbreviations stay short...
        assert_eq!(demangle("_ZNKSi6gcountEv"), "std::istream::gcount() const");
        // ...and a reference to a nested substitution is printed right.
        assert_eq!(
            demangle("_ZNK10__cxxabiv120__si_class_type_info11__do_upcastEPKNS_17__class_type_infoEPKvRNS1_15__upcast_resultE"),
            "__cxxabiv1::__si_class_type_info::__do_upcast(__cxxabiv1::__class_type_info const*, \
             void const*, __cxxabiv1::__class_type_info::__upcast_result&) const"
        );
        assert_eq!(demangle("_Z3bad!"), "_Z3bad!");
        assert_eq!(demangle("memcpy@GLIBC_2.2.5"), "memcpy@GLIBC_2.2.5");
    }

    #[test]
    fn rust_names_lose_their_hash() {
        assert_eq!(
            demangle("_ZN4core3fmt5write17h0123456789abcdefE"),
            "core::fmt::write"
        );
        assert_eq!(demangle("_RNvCs1234_7mycrate3foo"), "mycrate::foo");
    }
}
