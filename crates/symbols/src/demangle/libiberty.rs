//! C++ demangling by libiberty itself, through the `cplus_demangle` crate
//! (the cargo feature `libiberty`): the very demangler Valgrind embeds, so
//! names are exactly Valgrind's. The crate links Debian's `libiberty-dev`,
//! which is why this is optional.

/// Demangles `raw` with `cplus_demangle(raw, DMGL_PARAMS | DMGL_ANSI)`,
/// Valgrind's call; `None` where libiberty refuses the name.
pub(super) fn demangle(raw: &str) -> Option<String> {
    let options = cplus_demangle::Options {
        show_params: true,
        show_ansi: true,
    };
    cplus_demangle::demangle_with_options(raw, options).ok()
}
