//! Callgrind's own options (`--tool=callgrind`), parsed beside the core
//! ones, with Callgrind's defaults.

use callstack::{CallOptions, OutputOptions};

/// The default `--callgrind-out-file` pattern.
pub const DEFAULT_OUT_FILE: &str = "callgrind.out.%p";

/// Callgrind's options.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallgrindOptions {
    /// `--callgrind-out-file=` pattern (unexpanded).
    pub out_file: String,
    /// `--separate-recs`, `--skip-plt`.
    pub calls: CallOptions,
    /// `--dump-instr`, `--dump-line`.
    pub output: OutputOptions,
    /// `--compress-strings`, `--compress-pos`.
    pub write: callgrind::WriteOptions,
    /// `--export=KIND:FILE` (repeatable; FILE unexpanded).
    pub exports: Vec<(export::Kind, String)>,
    /// `--export-inline`: inline frames in the exports.
    pub export_inline: bool,
    /// `--instr-atstart` (default yes).
    pub instr_atstart: bool,
    /// `--combine-dumps`: every dump a part of one file (default no: a
    /// file per dump, `.1`, `.2`, ...).
    pub combine_dumps: bool,
    /// `--toggle-collect=GLOB`, several allowed.
    pub toggle_collect: Vec<String>,
    /// `--separate-callers<N>=GLOB`: the callers a matching function's
    /// contexts are named by, in the order given.
    pub separate_callers_fns: Vec<(u32, String)>,
    /// `--separate-recs<N>=GLOB`: the recursion levels a matching
    /// function's contexts keep apart, in the order given.
    pub separate_recs_fns: Vec<(u32, String)>,
    /// `--dump-before=GLOB`.
    pub dump_before: Vec<String>,
    /// `--dump-after=GLOB`.
    pub dump_after: Vec<String>,
    /// `--zero-before=GLOB`.
    pub zero_before: Vec<String>,
    /// `--fn-skip=GLOB`.
    pub fn_skip: Vec<String>,
    /// `--obj-skip=PATH`.
    pub obj_skip: Vec<String>,
    /// `--separate-threads`: a file (or part) per thread (default no).
    pub separate_threads: bool,
    /// `--client-contexts` (ours, `docs/client-contexts.md`): whether the
    /// client keeps its calling contexts itself instead of streaming every
    /// block to the tool.
    pub client_contexts: ClientContexts,
}

/// `--client-contexts=auto|no|yes|tagged`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ClientContexts {
    /// The default: tagged counting where it can do the run (no export
    /// needs the calling-context tree), else the stream.
    #[default]
    Auto,
    /// The stream: every block to the tool.
    No,
    /// Contexts mode: the client keeps the calling-context tree.
    Yes,
    /// Tagged counting (`ctxrt::tagged`), contexts mode where an export
    /// needs the tree.
    Tagged,
}

impl Default for CallgrindOptions {
    fn default() -> Self {
        CallgrindOptions {
            out_file: DEFAULT_OUT_FILE.to_string(),
            calls: CallOptions::default(),
            output: OutputOptions::default(),
            write: callgrind::WriteOptions::default(),
            exports: Vec::new(),
            export_inline: false,
            instr_atstart: true,
            combine_dumps: false,
            toggle_collect: Vec::new(),
            separate_callers_fns: Vec::new(),
            separate_recs_fns: Vec::new(),
            dump_before: Vec::new(),
            dump_after: Vec::new(),
            zero_before: Vec::new(),
            fn_skip: Vec::new(),
            obj_skip: Vec::new(),
            separate_threads: false,
            client_contexts: ClientContexts::Auto,
        }
    }
}

/// Why an option was refused: the lines to print.
pub type Refused = Vec<String>;

impl CallgrindOptions {
    /// Takes `arg` if it is one of Callgrind's options (`Ok(true)`), or
    /// says why its value is bad.
    pub fn parse_arg(&mut self, arg: &str) -> Result<bool, Refused> {
        let Some((name, value)) = arg.split_once('=') else {
            return Ok(false);
        };
        let bad = |detail: String| {
            Err(vec![
                format!("Bad option: {arg}"),
                detail,
                crate::simopts::USE_HELP.to_string(),
            ])
        };
        let yes_no = |v: &str| match v {
            "yes" => Ok(true),
            "no" => Ok(false),
            _ => Err(format!(
                "Invalid boolean value '{v}' (should be 'yes' or 'no')"
            )),
        };
        let flag = |v: &str, to: &mut bool| match yes_no(v) {
            Ok(b) => {
                *to = b;
                Ok(true)
            }
            Err(e) => bad(e),
        };
        match name {
            "--callgrind-out-file" => {
                self.out_file = value.to_string();
                Ok(true)
            }
            "--dump-instr" => flag(value, &mut self.output.dump_instr),
            "--dump-line" => flag(value, &mut self.output.dump_line),
            "--compress-strings" => flag(value, &mut self.write.compress_strings),
            "--compress-pos" => flag(value, &mut self.write.compress_pos),
            "--skip-plt" => flag(value, &mut self.calls.skip_plt),
            "--export-inline" => flag(value, &mut self.export_inline),
            "--export" => match value.split_once(':') {
                Some((kind, file)) if !file.is_empty() => match kind.parse() {
                    Ok(k) => {
                        self.exports.push((k, file.to_string()));
                        Ok(true)
                    }
                    Err(e) => bad(e),
                },
                _ => bad("expected --export=KIND:FILE".to_string()),
            },
            "--collect-atstart" => flag(value, &mut self.calls.collect_atstart),
            "--collect-jumps" => flag(value, &mut self.calls.collect_jumps),
            "--skip-direct-rec" => flag(value, &mut self.calls.skip_direct_rec),
            "--instr-atstart" => flag(value, &mut self.instr_atstart),
            "--combine-dumps" => flag(value, &mut self.combine_dumps),
            "--separate-threads" => flag(value, &mut self.separate_threads),
            "--client-contexts" => {
                self.client_contexts = match value {
                    "auto" => ClientContexts::Auto,
                    "no" => ClientContexts::No,
                    "yes" => ClientContexts::Yes,
                    "tagged" => ClientContexts::Tagged,
                    _ => return bad(format!("expected auto, no, yes or tagged, not '{value}'")),
                };
                Ok(true)
            }
            "--toggle-collect" | "--dump-before" | "--dump-after" | "--zero-before"
            | "--fn-skip" | "--obj-skip" => {
                let list = match name {
                    "--toggle-collect" => {
                        // As Callgrind's option parser does: a toggle makes
                        // collection start off (a later --collect-atstart
                        // still decides).
                        self.calls.collect_atstart = false;
                        &mut self.toggle_collect
                    }
                    "--dump-before" => &mut self.dump_before,
                    "--dump-after" => &mut self.dump_after,
                    "--zero-before" => &mut self.zero_before,
                    "--fn-skip" => &mut self.fn_skip,
                    _ => &mut self.obj_skip,
                };
                list.push(value.to_string());
                Ok(true)
            }
            "--separate-recs" => match value.parse::<u32>() {
                Ok(n) if n >= 1 => {
                    self.calls.separate_recs = n;
                    Ok(true)
                }
                _ => bad(format!("'{value}' is not a positive number")),
            },
            // Callgrind takes any integer; `auto` and every value below 1
            // give contexts without callers, as 0 (its -2 and below
            // crash it).
            "--separate-callers" => match value {
                "auto" => {
                    self.calls.separate_callers = 0;
                    Ok(true)
                }
                _ => match value.parse::<i64>() {
                    Ok(n) => {
                        self.calls.separate_callers = n.clamp(0, u32::MAX.into()) as u32;
                        Ok(true)
                    }
                    Err(_) => bad(format!("Invalid integer value '{value}'")),
                },
            },
            _ => {
                let per_function = [
                    ("--separate-callers", &mut self.separate_callers_fns),
                    ("--separate-recs", &mut self.separate_recs_fns),
                ];
                for (prefix, list) in per_function {
                    if let Some(n) = per_function_count(name, prefix) {
                        list.push((n, value.to_string()));
                        return Ok(true);
                    }
                }
                Ok(false)
            }
        }
    }
}

/// The `N` of a per-function option `PREFIX<N>=GLOB`
/// (`--separate-callers<N>=`, `--separate-recs<N>=`) named `name`: N at
/// least 1 (`+3` and `03` are 3, as Callgrind reads them); anything else
/// after the prefix is no option of Callgrind's.
fn per_function_count(name: &str, prefix: &str) -> Option<u32> {
    let n = name.strip_prefix(prefix)?.parse::<u32>().ok()?;
    (n >= 1).then_some(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_values() {
        let mut o = CallgrindOptions::default();
        assert_eq!(o.out_file, "callgrind.out.%p");
        assert_eq!(o.calls.separate_recs, 2);
        assert!(!o.calls.collect_jumps);
        assert!(o.calls.skip_plt && o.output.dump_line && !o.output.dump_instr);
        assert!(o.write.compress_strings && o.write.compress_pos);
        for a in [
            "--dump-instr=yes",
            "--dump-line=no",
            "--compress-strings=no",
            "--compress-pos=no",
            "--skip-plt=no",
            "--separate-recs=5",
            "--callgrind-out-file=cg.%p",
        ] {
            assert_eq!(o.parse_arg(a), Ok(true), "{a}");
        }
        assert!(o.output.dump_instr && !o.output.dump_line && !o.calls.skip_plt);
        assert!(!o.write.compress_strings && !o.write.compress_pos);
        assert_eq!((o.calls.separate_recs, o.out_file.as_str()), (5, "cg.%p"));
        assert_eq!(o.parse_arg("--cache-sim=yes"), Ok(false));
        for a in [
            "--toggle-collect=a::*",
            "--toggle-collect=b",
            "--collect-atstart=no",
            "--instr-atstart=no",
            "--combine-dumps=yes",
            "--dump-before=f",
            "--dump-after=g",
            "--zero-before=h",
            "--fn-skip=x*",
            "--obj-skip=/lib/libc.so.6",
            "--separate-threads=yes",
            "--collect-jumps=yes",
        ] {
            assert_eq!(o.parse_arg(a), Ok(true), "{a}");
        }
        assert!(o.calls.collect_jumps);
        assert_eq!(o.toggle_collect, ["a::*", "b"]);
        assert!(!o.calls.collect_atstart && !o.instr_atstart && o.combine_dumps);
        assert!(o.separate_threads);
        assert_eq!((o.dump_before.len(), o.obj_skip.len()), (1, 1));
        assert_eq!(o.parse_arg("-q"), Ok(false));
        let e = o.parse_arg("--dump-instr=maybe").unwrap_err();
        assert_eq!(e[0], "Bad option: --dump-instr=maybe");
        assert!(o.parse_arg("--separate-recs=0").is_err());
    }

    #[test]
    fn separate_callers_globally_and_per_function() {
        let mut o = CallgrindOptions::default();
        assert_eq!(o.calls.separate_callers, 0);
        assert_eq!(o.parse_arg("--separate-callers=3"), Ok(true));
        assert_eq!(o.calls.separate_callers, 3);
        for zero in ["auto", "0", "-1"] {
            o.calls.separate_callers = 3;
            let arg = format!("--separate-callers={zero}");
            assert_eq!(o.parse_arg(&arg), Ok(true), "{arg}");
            assert_eq!(o.calls.separate_callers, 0, "{arg}");
        }
        let e = o.parse_arg("--separate-callers=x").unwrap_err();
        assert_eq!(
            e[..2],
            [
                "Bad option: --separate-callers=x",
                "Invalid integer value 'x'"
            ]
        );
        assert_eq!(o.parse_arg("--separate-callers2=leaf"), Ok(true));
        assert_eq!(o.parse_arg("--separate-callers12=a*"), Ok(true));
        assert_eq!(
            o.separate_callers_fns,
            [(2, "leaf".to_string()), (12, "a*".to_string())]
        );
        // Unknown to Callgrind, as to us.
        for a in [
            "--separate-callers0=f",
            "--separate-callersx=f",
            "--separate-callers-1=f",
        ] {
            assert_eq!(o.parse_arg(a), Ok(false), "{a}");
        }
        assert_eq!(o.separate_callers_fns.len(), 2);
    }

    #[test]
    fn skip_direct_rec_and_separate_recs_per_function() {
        let mut o = CallgrindOptions::default();
        assert!(!o.calls.skip_direct_rec, "Valgrind 3.19's actual default");
        assert_eq!(o.parse_arg("--skip-direct-rec=yes"), Ok(true));
        assert!(o.calls.skip_direct_rec);
        assert_eq!(o.parse_arg("--skip-direct-rec=no"), Ok(true));
        assert!(!o.calls.skip_direct_rec);
        let e = o.parse_arg("--skip-direct-rec=x").unwrap_err();
        assert_eq!(
            e[..2],
            [
                "Bad option: --skip-direct-rec=x",
                "Invalid boolean value 'x' (should be 'yes' or 'no')"
            ]
        );
        assert_eq!(o.parse_arg("--separate-recs3=fib"), Ok(true));
        assert_eq!(o.parse_arg("--separate-recs+1=p?ng"), Ok(true));
        assert_eq!(o.parse_arg("--separate-recs=4"), Ok(true), "still global");
        assert_eq!(
            o.separate_recs_fns,
            [(3, "fib".to_string()), (1, "p?ng".to_string())]
        );
        assert_eq!(o.calls.separate_recs, 4);
        assert!(o.separate_callers_fns.is_empty(), "a list of its own");
        for a in [
            "--separate-recs0=f",
            "--separate-recsx=f",
            "--separate-recs3x=f",
            "--separate-recs-1=f",
        ] {
            assert_eq!(o.parse_arg(a), Ok(false), "{a}");
        }
        assert_eq!(o.separate_recs_fns.len(), 2);
    }

    #[test]
    fn exports() {
        let mut o = CallgrindOptions::default();
        assert!(o.exports.is_empty() && !o.export_inline);
        assert_eq!(o.parse_arg("--export=folded:out.%p.folded"), Ok(true));
        assert_eq!(o.parse_arg("--export=svg:a:b.svg"), Ok(true));
        assert_eq!(o.parse_arg("--export-inline=yes"), Ok(true));
        assert_eq!(
            o.exports,
            [
                (export::Kind::Folded, "out.%p.folded".to_string()),
                (export::Kind::Svg, "a:b.svg".to_string())
            ]
        );
        assert!(o.export_inline);
        let e = o.parse_arg("--export=pdf:x").unwrap_err();
        assert_eq!(e[0], "Bad option: --export=pdf:x");
        assert!(e[1].starts_with("unknown export kind 'pdf'"), "{}", e[1]);
        assert!(o.parse_arg("--export=folded").is_err());
        assert!(o.parse_arg("--export=folded:").is_err());
    }

    #[test]
    fn a_toggle_starts_collection_off_unless_a_later_option_says_otherwise() {
        let mut o = CallgrindOptions::default();
        assert!(o.calls.collect_atstart);
        assert_eq!(o.parse_arg("--toggle-collect=*::bench::*"), Ok(true));
        assert!(!o.calls.collect_atstart);
        assert_eq!(o.parse_arg("--collect-atstart=yes"), Ok(true));
        assert!(o.calls.collect_atstart);
    }
}
