//! The Valgrind-style simulation options shared by `replay` and the run
//! mode (`--cache-sim`, `--branch-sim`, `--I1/--D1/--LL/--L2`), and the
//! resolution of the simulated caches from them and the host CPU (spec
//! §2.1–§2.3).

use cachesim::configure::{AMD64_AVX_REGISTER_BYTES, X86_DEFAULTS};
use cachesim::cpuid::{self, DetectError, HwCacheInfo};
use cachesim::{CacheConfig, CacheOptions, CacheSetup, CacheSim, Fatal, Message, OptError};

/// The simulation switches and cache geometries given on a command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SimOptions {
    /// `--cache-sim=yes|no`.
    pub cache_sim: bool,
    /// `--branch-sim=yes|no`.
    pub branch_sim: bool,
    /// `--I1=`, `--D1=`, `--LL=` (or `--L2=`).
    pub caches: CacheOptions,
}

/// A rejected option: the lines Valgrind prints for it (each to be
/// prefixed with `<program>: `); the process then exits with code 1.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadOption {
    /// The message lines, without prefix.
    pub lines: Vec<String>,
}

impl BadOption {
    /// Valgrind's `fmsg_bad_option`: `Bad option: <arg>`, the detail lines,
    /// then the `--help` hint.
    fn new(arg: &str, detail: &[String]) -> BadOption {
        let mut lines = vec![format!("Bad option: {arg}")];
        lines.extend_from_slice(detail);
        lines.push(USE_HELP.to_string());
        BadOption { lines }
    }
}

/// Valgrind's closing line for command-line errors.
pub const USE_HELP: &str = "Use --help for more information or consult the user manual.";

/// Valgrind's `yes`/`no` option values.
fn parse_bool(arg: &str, value: &str) -> Result<bool, BadOption> {
    match value {
        "yes" => Ok(true),
        "no" => Ok(false),
        _ => Err(BadOption::new(
            arg,
            &[format!(
                "Invalid boolean value '{value}' (should be 'yes' or 'no')"
            )],
        )),
    }
}

/// One `--I1/--D1/--LL` value, with Valgrind's three error shapes.
fn parse_cache(arg: &str, value: &str) -> Result<CacheConfig, BadOption> {
    CacheConfig::parse_opt(value).map_err(|e| match e {
        OptError::Malformed => BadOption::new(arg, &[format!("Bad argument '{value}'")]),
        OptError::Overflow => BadOption::new(
            arg,
            &["One of the cache parameters was too large and overflowed.".to_string()],
        ),
        OptError::Invalid(check) => {
            let mut b = BadOption::new(arg, &[format!("Bad argument '{value}'")]);
            b.lines.insert(0, check.to_string());
            b
        }
    })
}

impl SimOptions {
    /// No options given yet; `cache_sim` is the front end's default
    /// (current Cachegrind: off; trace replay: on).
    pub fn new(cache_sim: bool) -> SimOptions {
        SimOptions {
            cache_sim,
            branch_sim: false,
            caches: CacheOptions::default(),
        }
    }

    /// Takes `arg` if it is one of these options: `Ok(true)` if consumed,
    /// `Ok(false)` if it is some other argument, `Err` with Valgrind's
    /// message if its value is bad. Later options override earlier ones.
    pub fn parse_arg(&mut self, arg: &str) -> Result<bool, BadOption> {
        let Some((name, value)) = arg.split_once('=') else {
            return Ok(false);
        };
        match name {
            "--cache-sim" => self.cache_sim = parse_bool(arg, value)?,
            "--branch-sim" => self.branch_sim = parse_bool(arg, value)?,
            "--I1" => self.caches.i1 = Some(parse_cache(arg, value)?),
            "--D1" => self.caches.d1 = Some(parse_cache(arg, value)?),
            "--LL" | "--L2" => self.caches.ll = Some(parse_cache(arg, value)?),
            _ => return Ok(false),
        }
        Ok(true)
    }
}

/// Reads CPUID on the machine we run on.
#[cfg(target_arch = "x86_64")]
pub fn host_cpuid(leaf: u32, subleaf: u32) -> [u32; 4] {
    let r = std::arch::x86_64::__cpuid_count(leaf, subleaf);
    [r.eax, r.ebx, r.ecx, r.edx]
}

/// The host's caches as CPUID reports them.
pub fn detect_host() -> Result<HwCacheInfo, DetectError> {
    #[cfg(target_arch = "x86_64")]
    {
        cpuid::detect(host_cpuid)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        Err(DetectError::UnknownVendor)
    }
}

/// Resolves the three simulated caches as Cachegrind does at start-up:
/// host auto-detection (or the defaults), the LL tweak, then the
/// command-line values. `Ok` carries the warnings to print; `Err` the
/// messages to print before exiting with code 1.
pub fn resolve_caches(opts: &CacheOptions) -> Result<CacheSetup, Fatal> {
    let detected = detect_host();
    cachesim::configure(
        detected.as_ref().map_err(|e| *e),
        X86_DEFAULTS,
        opts,
        AMD64_AVX_REGISTER_BYTES,
    )
}

/// The simulated caches of a run (`None` without `--cache-sim=yes`), as
/// Cachegrind sets them up at start-up: each warning or error goes to
/// `say` in order; `Err(())` when the configuration is fatal (exit 1).
pub fn setup_caches(
    sim: &SimOptions,
    mut say: impl FnMut(&Message),
) -> Result<Option<CacheSim>, ()> {
    if !sim.cache_sim {
        return Ok(None);
    }
    let resolved = resolve_caches(&sim.caches);
    let messages = match &resolved {
        Ok(setup) => &setup.messages,
        Err(fatal) => &fatal.messages,
    };
    messages.iter().for_each(&mut say);
    resolved
        .map(|s| Some(CacheSim::new(s.i1, s.d1, s.ll)))
        .map_err(|_| ())
}

/// Formats `messages` with Valgrind's prefixes for process `pid`:
/// `--PID-- ` for debug messages, `==PID== ` for user messages.
pub fn prefixed(messages: &[Message], pid: u32) -> Vec<String> {
    messages
        .iter()
        .map(|m| match m {
            Message::Dmsg(t) => format!("--{pid}-- {t}"),
            Message::Umsg(t) => format!("=={pid}== {t}"),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bad(arg: &str) -> Vec<String> {
        SimOptions::new(true).parse_arg(arg).unwrap_err().lines
    }

    #[test]
    fn accepts_and_overrides() {
        let mut o = SimOptions::new(false);
        for a in [
            "--cache-sim=yes",
            "--branch-sim=yes",
            "--L2=8388608,16,64",
            "--I1=32768,8,64",
        ] {
            assert_eq!(o.parse_arg(a), Ok(true));
        }
        assert!(o.cache_sim && o.branch_sim);
        assert_eq!(o.caches.ll, Some(CacheConfig::new(8 << 20, 16, 64)));
        assert_eq!(o.parse_arg("--cache-sim=no"), Ok(true));
        assert!(!o.cache_sim);
        assert_eq!(o.parse_arg("--I1"), Ok(false));
        assert_eq!(o.parse_arg("--D1x=1"), Ok(false));
        assert_eq!(o.parse_arg("prog"), Ok(false));
    }

    #[test]
    fn valgrind_error_texts() {
        assert_eq!(
            bad("--D1=1000,2,64"),
            [
                "Cache set count is not a power of two.",
                "Bad option: --D1=1000,2,64",
                "Bad argument '1000,2,64'",
                USE_HELP,
            ]
        );
        assert_eq!(
            bad("--D1=65536,2"),
            [
                "Bad option: --D1=65536,2",
                "Bad argument '65536,2'",
                USE_HELP
            ]
        );
        assert_eq!(
            bad("--I1=99999999999,2,64"),
            [
                "Bad option: --I1=99999999999,2,64",
                "One of the cache parameters was too large and overflowed.",
                USE_HELP,
            ]
        );
        assert_eq!(
            bad("--cache-sim=maybe"),
            [
                "Bad option: --cache-sim=maybe",
                "Invalid boolean value 'maybe' (should be 'yes' or 'no')",
                USE_HELP,
            ]
        );
    }

    #[test]
    fn prefixes() {
        let m = [
            Message::Dmsg("warning: x".into()),
            Message::Umsg("Cachegrind: y".into()),
        ];
        assert_eq!(
            prefixed(&m, 42),
            ["--42-- warning: x", "==42== Cachegrind: y"]
        );
    }
}
