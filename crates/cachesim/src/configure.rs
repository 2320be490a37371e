//! Turning auto-detection and command-line cache options into the three
//! simulated geometries (spec §2.2), with Valgrind's warnings.

use crate::config::CacheConfig;
use crate::cpuid::{CacheKind, DetectError, HwCacheInfo};

/// A line of text to print, on the channel Valgrind would use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    /// A debug message: Valgrind prefixes it with `--PID-- ` and prints it
    /// even with `-q`.
    Dmsg(String),
    /// A user message: prefixed with `==PID== `.
    Umsg(String),
}

/// The x86/amd64 fallback geometries: I1, D1, LL.
pub const X86_DEFAULTS: [CacheConfig; 3] = [
    CacheConfig::new(65536, 2, 64),
    CacheConfig::new(65536, 2, 64),
    CacheConfig::new(262_144, 8, 64),
];

/// The largest guest register on amd64 with AVX, the floor for the
/// smallest line size.
pub const AMD64_AVX_REGISTER_BYTES: u32 = 32;

/// The three geometries given on the command line, if any.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheOptions {
    /// `--I1=`.
    pub i1: Option<CacheConfig>,
    /// `--D1=`.
    pub d1: Option<CacheConfig>,
    /// `--LL=` (or `--L2=`).
    pub ll: Option<CacheConfig>,
}

/// The geometries to simulate and the messages produced on the way.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheSetup {
    /// Level-1 instruction cache.
    pub i1: CacheConfig,
    /// Level-1 data cache.
    pub d1: CacheConfig,
    /// Last-level unified cache.
    pub ll: CacheConfig,
    /// Warnings to print, in order.
    pub messages: Vec<Message>,
}

impl CacheSetup {
    /// The `-v` block, `Cache configuration used:` and one line per cache
    /// (user messages).
    pub fn used_lines(&self) -> Vec<String> {
        let mut v = vec!["Cache configuration used:".to_string()];
        for (name, c) in [("I1", self.i1), ("D1", self.d1), ("LL", self.ll)] {
            v.push(format!("  {name}: {}", c.image()));
        }
        v
    }

    /// The smallest of the three line sizes: data accesses are capped to
    /// it so that none touches more than two lines.
    pub fn min_line_size(&self) -> u32 {
        self.i1
            .line_size
            .min(self.d1.line_size)
            .min(self.ll.line_size)
    }
}

/// Configuration that stops the run: every message to print (including
/// the ones that came before the failure). Valgrind exits with code 1.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fatal {
    /// The messages, in order.
    pub messages: Vec<Message>,
}

/// Valgrind's `configure_caches`: picks I1, D1 and the unified cache of the
/// top level from `detected`, or the defaults.
fn select(
    detected: Result<&HwCacheInfo, DetectError>,
    defaults: [CacheConfig; 3],
    all_given: bool,
    msgs: &mut Vec<Message>,
) -> [CacheConfig; 3] {
    let empty = HwCacheInfo::default();
    let ci = detected.unwrap_or(&empty);
    let find = |kind: CacheKind, level: u32| {
        ci.caches
            .iter()
            .find(|c| c.kind == kind && c.level == level)
    };
    let i1 = find(CacheKind::Instr, 1);
    let d1 = find(CacheKind::Data, 1);
    let ll = find(CacheKind::Unified, ci.levels);
    if !ci.caches.is_empty() && ll.is_none() {
        msgs.push(Message::Dmsg(
            "warning: L2 cache not installed, ignore LL results.".into(),
        ));
    }
    if ll.is_some() && ci.levels > 2 {
        msgs.push(Message::Dmsg(format!(
            "warning: L{} cache found, using its data for the LL simulation.",
            ci.levels
        )));
    }
    if let (Some(i1), Some(d1), Some(ll)) = (i1, d1, ll) {
        let i1c = if i1.is_trace_cache {
            // The micro-op count is turned into a guessed byte size.
            let guessed_line = 32;
            let adjusted = if i1.size == 12 * 1024 || i1.size == 16 * 1024 {
                16 * 1024
            } else {
                32 * 1024
            };
            msgs.push(Message::Dmsg(format!(
                "warning: Pentium 4 with {} KB micro-op instruction trace cache",
                i1.size / 1024
            )));
            msgs.push(Message::Dmsg(format!(
                "         Simulating a {} KB I-cache with {guessed_line} B lines",
                adjusted / 1024
            )));
            CacheConfig::new(adjusted, i1.assoc, guessed_line)
        } else {
            CacheConfig::new(i1.size, i1.assoc, i1.line_size)
        };
        return [
            i1c,
            CacheConfig::new(d1.size, d1.assoc, d1.line_size),
            CacheConfig::new(ll.size, ll.assoc, ll.line_size),
        ];
    }
    if !all_given {
        msgs.push(Message::Dmsg(
            "Warning: Cannot auto-detect cache config, using defaults.".into(),
        ));
        msgs.push(Message::Dmsg("         Run with -v to see.".into()));
    }
    defaults
}

/// Resolves the simulated caches (spec §2.2): auto-detection or defaults,
/// the LL tweak, the check of the auto-detected values, then the
/// command-line overrides, then the minimum-line-size rule against
/// `largest_register` bytes.
pub fn configure(
    detected: Result<&HwCacheInfo, DetectError>,
    defaults: [CacheConfig; 3],
    opts: &CacheOptions,
    largest_register: u32,
) -> Result<CacheSetup, Fatal> {
    let mut messages = Vec::new();
    let all_given = opts.i1.is_some() && opts.d1.is_some() && opts.ll.is_some();
    let [i1, d1, ll] = select(detected, defaults, all_given, &mut messages);
    let (ll, warnings) = ll.tweak_ll();
    messages.extend(warnings.into_iter().flatten().map(Message::Dmsg));

    for (name, auto, given) in [
        ("I1", i1, opts.i1),
        ("D1", d1, opts.d1),
        ("LL", ll, opts.ll),
    ] {
        if let Err(e) = auto.check() {
            messages.push(Message::Umsg(format!(
                "Auto-detected {name} cache configuration not supported: {e}"
            )));
            messages.push(Message::Umsg(format!("  {name}: {}", auto.image())));
            if given.is_none() {
                messages.push(Message::Umsg(
                    "As it probably should be supported, please report a bug!".into(),
                ));
                messages.push(Message::Umsg(format!(
                    "Bypass this message by using option --{name}=..."
                )));
                return Err(Fatal { messages });
            }
        }
    }
    let setup = CacheSetup {
        i1: opts.i1.unwrap_or(i1),
        d1: opts.d1.unwrap_or(d1),
        ll: opts.ll.unwrap_or(ll),
        messages,
    };
    let min_line = setup.min_line_size();
    if min_line < largest_register {
        let mut messages = setup.messages;
        messages.extend(
            [
                format!("Cachegrind: cannot continue: the minimum line size ({min_line})"),
                format!(
                    "  must be equal to or larger than the maximum register size ({largest_register})"
                ),
                "  but it is not.  Exiting now.".to_string(),
            ]
            .map(Message::Umsg),
        );
        return Err(Fatal { messages });
    }
    Ok(setup)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpuid::tests::{amd_epyc, intel_xeon, table};
    use crate::cpuid::{detect, HwCache};

    fn dm(s: &str) -> Message {
        Message::Dmsg(s.to_string())
    }

    #[test]
    fn this_machine_matches_valgrind() {
        let ci = detect(amd_epyc()).unwrap();
        let s = configure(Ok(&ci), X86_DEFAULTS, &CacheOptions::default(), 32).unwrap();
        assert_eq!(s.i1, CacheConfig::new(32768, 8, 64));
        assert_eq!(s.d1, CacheConfig::new(32768, 8, 64));
        assert_eq!(s.ll, CacheConfig::new(268_435_456, 1, 64));
        // Byte for byte what `valgrind --tool=cachegrind -v` printed here.
        assert_eq!(
            s.messages,
            vec![
                dm("warning: L3 cache found, using its data for the LL simulation."),
                dm("warning: specified LL cache: line_size 64  assoc 1  total_size 335,544,320"),
                dm("warning: simulated LL cache: line_size 64  assoc 1  total_size 268,435,456"),
            ]
        );
        assert_eq!(
            s.used_lines(),
            [
                "Cache configuration used:",
                "  I1: 32,768 B, 8-way, 64 B lines",
                "  D1: 32,768 B, 8-way, 64 B lines",
                "  LL: 268,435,456 B, 1-way, 64 B lines",
            ]
        );
    }

    #[test]
    fn xeon_gets_the_spec_tweak() {
        let ci = detect(intel_xeon()).unwrap();
        let s = configure(Ok(&ci), X86_DEFAULTS, &CacheOptions::default(), 32).unwrap();
        assert_eq!(s.i1, CacheConfig::new(32768, 8, 64));
        assert_eq!(s.d1, CacheConfig::new(49152, 12, 64));
        assert_eq!(s.ll, CacheConfig::new(318_767_104, 38, 64));
        assert_eq!(s.messages.len(), 3);
    }

    #[test]
    fn options_override_but_warnings_stay() {
        let ci = detect(amd_epyc()).unwrap();
        let opts = CacheOptions {
            i1: Some(CacheConfig::new(16384, 4, 64)),
            d1: Some(CacheConfig::new(8192, 2, 64)),
            ll: Some(CacheConfig::new(3 << 20, 12, 64)),
        };
        let s = configure(Ok(&ci), X86_DEFAULTS, &opts, 32).unwrap();
        assert_eq!((s.i1, s.d1), (opts.i1.unwrap(), opts.d1.unwrap()));
        // Command-line values are never tweaked.
        assert_eq!(s.ll, CacheConfig::new(3 << 20, 12, 64));
        assert_eq!(s.messages.len(), 3);
    }

    #[test]
    fn defaults_and_their_warning() {
        let s = configure(
            Err(DetectError::UnknownVendor),
            X86_DEFAULTS,
            &CacheOptions::default(),
            32,
        )
        .unwrap();
        assert_eq!([s.i1, s.d1, s.ll], X86_DEFAULTS);
        assert_eq!(
            s.messages,
            vec![
                dm("Warning: Cannot auto-detect cache config, using defaults."),
                dm("         Run with -v to see."),
            ]
        );
        // Silent when all three are given.
        let all = CacheOptions {
            i1: Some(X86_DEFAULTS[0]),
            d1: Some(X86_DEFAULTS[1]),
            ll: Some(X86_DEFAULTS[2]),
        };
        let s = configure(Err(DetectError::NoLeaves), X86_DEFAULTS, &all, 32).unwrap();
        assert!(s.messages.is_empty());
    }

    #[test]
    fn no_unified_top_level() {
        let ci = HwCacheInfo {
            levels: 2,
            caches: vec![
                HwCache {
                    kind: CacheKind::Instr,
                    level: 1,
                    size: 32768,
                    assoc: 8,
                    line_size: 64,
                    is_trace_cache: false,
                },
                HwCache {
                    kind: CacheKind::Data,
                    level: 1,
                    size: 32768,
                    assoc: 8,
                    line_size: 64,
                    is_trace_cache: false,
                },
                HwCache {
                    kind: CacheKind::Data,
                    level: 2,
                    size: 1 << 20,
                    assoc: 8,
                    line_size: 64,
                    is_trace_cache: false,
                },
            ],
        };
        let s = configure(Ok(&ci), X86_DEFAULTS, &CacheOptions::default(), 32).unwrap();
        assert_eq!(
            s.messages[0],
            dm("warning: L2 cache not installed, ignore LL results.")
        );
        assert_eq!(
            s.messages[1].clone(),
            dm("Warning: Cannot auto-detect cache config, using defaults.")
        );
        assert_eq!(s.ll, X86_DEFAULTS[2]);
    }

    #[test]
    fn trace_cache_becomes_a_guessed_icache() {
        let ci = detect(table(&[
            ((0, 0), [2, 0x756e6547, 0x6c65746e, 0x49656e69]),
            ((2, 0), [0x665b5001, 0, 0, 0x007a7000]),
        ]))
        .unwrap();
        let s = configure(Ok(&ci), X86_DEFAULTS, &CacheOptions::default(), 32).unwrap();
        assert_eq!(s.i1, CacheConfig::new(16384, 8, 32));
        assert_eq!(
            s.messages,
            vec![
                dm("warning: Pentium 4 with 12 KB micro-op instruction trace cache"),
                dm("         Simulating a 16 KB I-cache with 32 B lines"),
            ]
        );
        // Its 32-byte line is fine only for a 32-byte register file.
        assert!(configure(Ok(&ci), X86_DEFAULTS, &CacheOptions::default(), 64).is_err());
    }

    #[test]
    fn unsupported_auto_detected_cache() {
        // An AMD L1d reported fully associative (255 ways) has no
        // power-of-two set count.
        let amd = |d1: u32| {
            detect(table(&[
                ((0, 0), [1, 0x68747541, 0x444d4163, 0x69746e65]),
                ((0x8000_0000, 0), [0x8000_0008, 0, 0, 0]),
                ((0x8000_0005, 0), [0, 0, d1, 0x40020140]),
                ((0x8000_0006, 0), [0, 0, 0x02008140, 0]),
            ]))
            .unwrap()
        };
        let ci = amd(0x40ff0140);
        let err = configure(Ok(&ci), X86_DEFAULTS, &CacheOptions::default(), 32).unwrap_err();
        let um = |s: &str| Message::Umsg(s.to_string());
        assert_eq!(
            err.messages,
            vec![
                um("Auto-detected D1 cache configuration not supported: \
                    Cache set count is not a power of two."),
                um("  D1: 65,536 B, 255-way, 64 B lines"),
                um("As it probably should be supported, please report a bug!"),
                um("Bypass this message by using option --D1=..."),
            ]
        );
        // Given --D1, the complaint stays but the run goes on.
        let opts = CacheOptions {
            d1: Some(CacheConfig::new(32768, 8, 64)),
            ..Default::default()
        };
        let s = configure(Ok(&ci), X86_DEFAULTS, &opts, 32).unwrap();
        assert_eq!(s.messages.len(), 2);
        assert_eq!(s.d1, CacheConfig::new(32768, 8, 64));
        assert_eq!(s.ll, CacheConfig::new(512 * 1024, 16, 64));
    }

    #[test]
    fn minimum_line_size_rule() {
        let opts = CacheOptions {
            d1: Some(CacheConfig::new(65536, 2, 16)),
            ..Default::default()
        };
        let ci = detect(amd_epyc()).unwrap();
        let err = configure(Ok(&ci), X86_DEFAULTS, &opts, 32).unwrap_err();
        let tail: Vec<_> = err.messages[3..].to_vec();
        assert_eq!(
            tail,
            vec![
                Message::Umsg("Cachegrind: cannot continue: the minimum line size (16)".into()),
                Message::Umsg(
                    "  must be equal to or larger than the maximum register size (32)".into()
                ),
                Message::Umsg("  but it is not.  Exiting now.".into()),
            ]
        );
    }
}
