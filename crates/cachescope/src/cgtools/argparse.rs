//! The behaviour of Python's `argparse` (3.11) that scripts calling
//! `cg_annotate`, `cg_merge` and `cg_diff` meet: `--opt=V` and `--opt V`,
//! unique prefixes of long options, `-oFILE`, `--`, the interleaving rules
//! for positionals, the usage text wrapped to the terminal width, and
//! `usage:` + `<prog>: error: <msg>` with status 2.
//!
//! This is hand-written rather than built on an argument-parsing crate
//! because byte-identical messages need argparse's exact algorithm: e.g.
//! `cg_annotate a.out --diff b.out` is an error ("unrecognized arguments:
//! b.out") there, and `--auto` is "ambiguous" between `--auto=yes` and
//! `--auto=no`.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::os::unix::ffi::{OsStrExt, OsStringExt};

use profile::pytext;
use regex::Regex;

use super::textwrap;

/// How many values an argument takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Nargs {
    /// A flag.
    Zero,
    /// One value (argparse's default, `nargs=None`).
    One,
    /// A list of exactly one value (`nargs=1`).
    ListOfOne,
    /// One or more values (`nargs="+"`).
    OneOrMore,
}

/// What taking an argument does, beyond handing its values to the caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `-h`/`--help`: print the help and exit 0.
    Help,
    /// `--version`: print the version and exit 0.
    Version,
    /// `BooleanOptionalAction`: shown as `--x | --no-x` in the usage.
    BoolOptional,
    /// Anything else: the values go to the caller.
    Plain,
}

/// One argument of a parser.
#[derive(Debug, Clone)]
pub struct Arg {
    /// Option strings; empty for a positional.
    pub option_strings: Vec<&'static str>,
    /// Name handed to the caller with the values.
    pub dest: &'static str,
    /// Number of values.
    pub nargs: Nargs,
    /// The value's name in usage and help (default: `dest` in capitals for
    /// options, `dest` for positionals).
    pub metavar: Option<&'static str>,
    /// Help text, with argparse's `%` expansions already done.
    pub help: &'static str,
    /// What taking it does.
    pub kind: Kind,
    /// Whether it appears in the usage line; false only for options this
    /// program adds to Valgrind's, so that usage messages stay identical.
    pub in_usage: bool,
}

impl Arg {
    /// An option with the given option strings.
    pub fn option(
        option_strings: &[&'static str],
        dest: &'static str,
        nargs: Nargs,
        help: &'static str,
    ) -> Arg {
        Arg {
            option_strings: option_strings.to_vec(),
            dest,
            nargs,
            metavar: None,
            help,
            kind: Kind::Plain,
            in_usage: true,
        }
    }

    /// A positional argument.
    pub fn positional(
        dest: &'static str,
        nargs: Nargs,
        metavar: &'static str,
        help: &'static str,
    ) -> Arg {
        Arg {
            option_strings: Vec::new(),
            dest,
            nargs,
            metavar: Some(metavar),
            help,
            kind: Kind::Plain,
            in_usage: true,
        }
    }

    /// Sets the metavar.
    pub fn metavar(mut self, m: &'static str) -> Arg {
        self.metavar = Some(m);
        self
    }

    /// Sets the kind.
    pub fn kind(mut self, k: Kind) -> Arg {
        self.kind = k;
        self
    }

    /// Leaves the argument out of the usage line.
    pub fn hidden_from_usage(mut self) -> Arg {
        self.in_usage = false;
        self
    }

    fn is_positional(&self) -> bool {
        self.option_strings.is_empty()
    }

    /// argparse's `_get_action_name`.
    fn name(&self) -> String {
        if self.is_positional() {
            self.metavar.unwrap_or(self.dest).to_string()
        } else {
            self.option_strings.join("/")
        }
    }

    fn value_name(&self) -> String {
        match self.metavar {
            Some(m) => m.to_string(),
            None if self.is_positional() => self.dest.to_string(),
            None => self.dest.to_uppercase(),
        }
    }

    /// `_format_args`.
    fn format_args(&self) -> String {
        let m = self.value_name();
        match self.nargs {
            Nargs::Zero => String::new(),
            Nargs::One | Nargs::ListOfOne => m,
            Nargs::OneOrMore => format!("{m} [{m} ...]"),
        }
    }

    /// The argument's parts of the usage line (as argparse's wrapping
    /// splits them).
    fn usage_parts(&self) -> Vec<String> {
        if self.is_positional() {
            let m = self.value_name();
            return match self.nargs {
                Nargs::OneOrMore => vec![m.clone(), format!("[{m} ...]")],
                _ => vec![m],
            };
        }
        let inner = if self.nargs == Nargs::Zero {
            if self.kind == Kind::BoolOptional {
                self.option_strings.join(" | ")
            } else {
                self.option_strings[0].to_string()
            }
        } else {
            format!("{} {}", self.option_strings[0], self.format_args())
        };
        vec![format!("[{inner}]")]
    }

    /// `_format_action_invocation`.
    fn invocation(&self) -> String {
        if self.is_positional() {
            return self.value_name();
        }
        if self.nargs == Nargs::Zero {
            return self.option_strings.join(", ");
        }
        let args = self.format_args();
        self.option_strings
            .iter()
            .map(|o| format!("{o} {args}"))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// The regex fragment argparse matches against the argument pattern.
    fn nargs_pattern(&self) -> &'static str {
        match (self.nargs, self.is_positional()) {
            (Nargs::Zero, _) => "()",
            (Nargs::One | Nargs::ListOfOne, true) => "(-*A-*)",
            (Nargs::OneOrMore, true) => "(-*A[A-]*)",
            (Nargs::One | Nargs::ListOfOne, false) => "(A)",
            (Nargs::OneOrMore, false) => "(A[A]*)",
        }
    }
}

/// How parsing ended early: text for stdout and stderr, and the status.
#[derive(Debug, PartialEq, Eq)]
pub struct Exit {
    /// Text for standard output (help, version).
    pub stdout: String,
    /// Text for standard error (usage and error).
    pub stderr: String,
    /// Exit status.
    pub code: u8,
}

/// A parser: program name, description, version text and arguments.
pub struct Parser {
    /// The program name used in usage and error messages.
    pub prog: &'static str,
    /// The description shown by `--help`.
    pub description: &'static str,
    /// The text printed by `--version`.
    pub version: String,
    /// The arguments, in registration order.
    pub args: Vec<Arg>,
    /// The terminal width argparse would use.
    pub columns: usize,
}

/// A value taken from the command line: which argument, the option string
/// used (empty for positionals) and its values.
pub type Taken<'a> = (&'a Arg, &'a str, Vec<OsString>);

/// argparse's result of `_parse_optional`: an action (or none for an
/// unknown option), the option string and an explicit `=` value.
type OptionTuple = (Option<usize>, Vec<u8>, Option<Vec<u8>>);

/// The width argparse formats for: `$COLUMNS` if it is a positive
/// integer, else 80. (Python would ask the terminal when standard output
/// is one; this program cannot without unsafe code.)
pub fn terminal_columns() -> usize {
    std::env::var_os("COLUMNS")
        .and_then(|c| pytext::parse_int(pytext::trim(c.as_bytes())))
        .filter(|&c| c > 0)
        .map_or(80, |c| c as usize)
}

impl Parser {
    fn width(&self) -> usize {
        self.columns.saturating_sub(2)
    }

    /// Option strings in registration order, with their argument index.
    fn option_strings(&self) -> impl Iterator<Item = (&'static str, usize)> + '_ {
        self.args
            .iter()
            .enumerate()
            .flat_map(|(i, a)| a.option_strings.iter().map(move |o| (*o, i)))
    }

    fn find_option(&self, s: &[u8]) -> Option<usize> {
        self.option_strings()
            .find(|(o, _)| o.as_bytes() == s)
            .map(|(_, i)| i)
    }

    /// `error()`: the usage, then `<prog>: error: <msg>`, status 2.
    pub fn error(&self, msg: &str) -> Exit {
        Exit {
            stdout: String::new(),
            stderr: format!("{}{}: error: {msg}\n", self.format_usage(), self.prog),
            code: 2,
        }
    }

    fn arg_error(&self, arg: &Arg, msg: &str) -> Exit {
        self.error(&format!("argument {}: {msg}", arg.name()))
    }

    /// `_parse_optional`.
    fn parse_optional(&self, arg: &[u8]) -> Result<Option<OptionTuple>, Exit> {
        if arg.first() != Some(&b'-') {
            return Ok(None);
        }
        if let Some(i) = self.find_option(arg) {
            return Ok(Some((Some(i), arg.to_vec(), None)));
        }
        if arg.len() == 1 {
            return Ok(None);
        }
        if let Some(eq) = arg.iter().position(|&b| b == b'=') {
            if let Some(i) = self.find_option(&arg[..eq]) {
                return Ok(Some((
                    Some(i),
                    arg[..eq].to_vec(),
                    Some(arg[eq + 1..].to_vec()),
                )));
            }
        }
        let tuples = self.option_tuples(arg);
        if tuples.len() > 1 {
            let matches: Vec<String> = tuples
                .iter()
                .map(|t| String::from_utf8_lossy(&t.1).into_owned())
                .collect();
            return Err(self.error(&format!(
                "ambiguous option: {} could match {}",
                String::from_utf8_lossy(arg),
                matches.join(", ")
            )));
        }
        if let Some(t) = tuples.into_iter().next() {
            return Ok(Some(t));
        }
        // Negative numbers are positionals (no option looks like one).
        let neg = Regex::new(r"^-\d+$|^-\d*\.\d+$").expect("valid regex");
        if neg.is_match(&String::from_utf8_lossy(arg)) {
            return Ok(None);
        }
        if arg.contains(&b' ') {
            return Ok(None);
        }
        Ok(Some((None, arg.to_vec(), None)))
    }

    /// `_get_option_tuples`: options that `arg` abbreviates.
    fn option_tuples(&self, arg: &[u8]) -> Vec<OptionTuple> {
        let mut result = Vec::new();
        if arg.starts_with(b"--") {
            let (prefix, explicit) = match arg.iter().position(|&b| b == b'=') {
                Some(eq) => (&arg[..eq], Some(arg[eq + 1..].to_vec())),
                None => (arg, None),
            };
            for (o, i) in self.option_strings() {
                if o.as_bytes().starts_with(prefix) {
                    result.push((Some(i), o.as_bytes().to_vec(), explicit.clone()));
                }
            }
        } else {
            let short = &arg[..2.min(arg.len())];
            for (o, i) in self.option_strings() {
                if o.as_bytes() == short {
                    result.push((Some(i), o.as_bytes().to_vec(), Some(arg[2..].to_vec())));
                } else if o.as_bytes().starts_with(arg) {
                    result.push((Some(i), o.as_bytes().to_vec(), None));
                }
            }
        }
        result
    }

    /// Parses `argv` (without the program name). `take` receives each
    /// argument as argparse takes it, in the same order, and may refuse
    /// its values with a message (argparse's "invalid <type> value").
    /// Help and version requests, and every error, end in an [`Exit`].
    pub fn parse(
        &self,
        argv: &[OsString],
        take: &mut dyn FnMut(Taken<'_>) -> Result<(), String>,
    ) -> Result<(), Exit> {
        let args: Vec<&[u8]> = argv.iter().map(|a| a.as_bytes()).collect();

        // The pattern: 'O' for an option, 'A' for an argument, '-' for "--".
        let mut tuples: BTreeMap<usize, OptionTuple> = BTreeMap::new();
        let mut pattern = String::new();
        for (i, arg) in args.iter().enumerate() {
            if *arg == b"--" {
                pattern.push('-');
                pattern.extend(std::iter::repeat_n('A', args.len() - i - 1));
                break;
            }
            match self.parse_optional(arg)? {
                Some(t) => {
                    tuples.insert(i, t);
                    pattern.push('O');
                }
                None => pattern.push('A'),
            }
        }

        let mut state = ParseState {
            parser: self,
            args: &args,
            pattern,
            positionals: (0..self.args.len())
                .filter(|&i| self.args[i].is_positional())
                .collect(),
            seen: vec![false; self.args.len()],
            extras: Vec::new(),
            take,
        };
        // Alternate between positionals and options up to the last option.
        let mut start = 0;
        while let Some((&next_option, _)) = tuples.range(start..).next() {
            if start != next_option {
                let end = state.consume_positionals(start)?;
                if end > start {
                    start = end;
                    continue;
                }
            }
            if !tuples.contains_key(&start) {
                state.extras.extend_from_slice(&args[start..next_option]);
                start = next_option;
            }
            start = state.consume_optional(start, tuples[&start].clone())?;
        }
        let stop = state.consume_positionals(start)?;
        state.extras.extend_from_slice(&args[stop..]);

        let missing: Vec<String> = self
            .args
            .iter()
            .zip(&state.seen)
            .filter(|(a, seen)| a.is_positional() && !**seen)
            .map(|(a, _)| a.name())
            .collect();
        if !missing.is_empty() {
            return Err(self.error(&format!(
                "the following arguments are required: {}",
                missing.join(", ")
            )));
        }
        if !state.extras.is_empty() {
            let extras: Vec<String> = state
                .extras
                .iter()
                .map(|e| String::from_utf8_lossy(e).into_owned())
                .collect();
            return Err(self.error(&format!("unrecognized arguments: {}", extras.join(" "))));
        }
        Ok(())
    }

    /// `format_usage()`: `usage: ...` wrapped to the width.
    pub fn format_usage(&self) -> String {
        format!("{}\n", self.usage_text())
    }

    /// The usage text wrapped to the width, without a final newline.
    fn usage_text(&self) -> String {
        let prefix = "usage: ";
        let prog = self.prog;
        let parts = |positional: bool| -> Vec<String> {
            self.args
                .iter()
                .filter(|a| a.in_usage && a.is_positional() == positional)
                .flat_map(|a| a.usage_parts())
                .collect()
        };
        let (opt_parts, pos_parts) = (parts(false), parts(true));
        let mut usage = prog.to_string();
        for p in opt_parts.iter().chain(&pos_parts) {
            usage.push(' ');
            usage.push_str(p);
        }
        let text_width = self.width();
        if prefix.len() + usage.len() > text_width {
            let get_lines = |parts: &[String], indent: &str, with_prefix: bool| -> Vec<String> {
                let mut lines = Vec::new();
                let mut line: Vec<&str> = Vec::new();
                let mut line_len = if with_prefix {
                    prefix.len()
                } else {
                    indent.len()
                } as isize
                    - 1;
                for part in parts {
                    if line_len + 1 + part.len() as isize > text_width as isize && !line.is_empty()
                    {
                        lines.push(format!("{indent}{}", line.join(" ")));
                        line.clear();
                        line_len = indent.len() as isize - 1;
                    }
                    line.push(part);
                    line_len += part.len() as isize + 1;
                }
                if !line.is_empty() {
                    lines.push(format!("{indent}{}", line.join(" ")));
                }
                if with_prefix {
                    if let Some(first) = lines.first_mut() {
                        *first = first[indent.len()..].to_string();
                    }
                }
                lines
            };
            let lines: Vec<String> =
                if (prefix.len() + prog.len()) as f64 <= 0.75 * text_width as f64 {
                    let indent = " ".repeat(prefix.len() + prog.len() + 1);
                    let with_prog = |parts: &[String]| {
                        let mut v = vec![prog.to_string()];
                        v.extend_from_slice(parts);
                        v
                    };
                    if !opt_parts.is_empty() {
                        let mut l = get_lines(&with_prog(&opt_parts), &indent, true);
                        l.extend(get_lines(&pos_parts, &indent, false));
                        l
                    } else if !pos_parts.is_empty() {
                        get_lines(&with_prog(&pos_parts), &indent, true)
                    } else {
                        vec![prog.to_string()]
                    }
                } else {
                    let indent = " ".repeat(prefix.len());
                    let all: Vec<String> = opt_parts.iter().chain(&pos_parts).cloned().collect();
                    let mut l = get_lines(&all, &indent, false);
                    if l.len() > 1 {
                        l = get_lines(&opt_parts, &indent, false);
                        l.extend(get_lines(&pos_parts, &indent, false));
                    }
                    let mut v = vec![prog.to_string()];
                    v.extend(l);
                    v
                };
            usage = lines.join("\n");
        }
        format!("{prefix}{usage}")
    }

    /// `format_help()`.
    pub fn format_help(&self) -> String {
        let width = self.width();
        let max_help_position = 24.min(width.saturating_sub(20).max(4));
        let action_max = self
            .args
            .iter()
            .map(|a| a.invocation().len() + 2)
            .max()
            .unwrap_or(0);
        let help_position = (action_max + 2).min(max_help_position);
        let help_width = width.saturating_sub(help_position).max(11);
        let action_width = help_position.saturating_sub(4);

        let format_action = |a: &Arg| -> String {
            let header = a.invocation();
            let mut s;
            let indent_first;
            if header.len() <= action_width {
                s = format!("  {header:<action_width$}  ");
                indent_first = 0;
            } else {
                s = format!("  {header}\n");
                indent_first = help_position;
            }
            let lines = textwrap::wrap(a.help, help_width);
            for (k, line) in lines.iter().enumerate() {
                let indent = if k == 0 { indent_first } else { help_position };
                s.push_str(&" ".repeat(indent));
                s.push_str(line);
                s.push('\n');
            }
            if lines.is_empty() {
                s.push('\n');
            }
            s
        };
        let section = |title: &str, positional: bool| -> String {
            let items: String = self
                .args
                .iter()
                .filter(|a| a.is_positional() == positional)
                .map(format_action)
                .collect();
            if items.is_empty() {
                String::new()
            } else {
                format!("\n{title}:\n{items}\n")
            }
        };
        let mut text = format!("{}\n\n", self.usage_text());
        if !self.description.is_empty() {
            text.push_str(&textwrap::wrap(self.description, width.max(11)).join("\n"));
            text.push_str("\n\n");
        }
        text.push_str(&section("positional arguments", true));
        text.push_str(&section("options", false));
        // argparse collapses runs of blank lines and trims the ends.
        while text.contains("\n\n\n") {
            text = text.replace("\n\n\n", "\n\n");
        }
        format!("{}\n", text.trim_matches('\n'))
    }
}

/// An argument taken by an option: its index, the option string used and
/// its values.
type TakenOption<'a> = (usize, Vec<u8>, Vec<&'a [u8]>);

/// The state of one `parse` call: argparse's `_parse_known_args` locals.
struct ParseState<'p, 'a, 't> {
    parser: &'p Parser,
    args: &'a [&'a [u8]],
    pattern: String,
    /// Positionals not yet consumed.
    positionals: Vec<usize>,
    seen: Vec<bool>,
    extras: Vec<&'a [u8]>,
    take: &'t mut dyn FnMut(Taken<'_>) -> Result<(), String>,
}

impl<'a> ParseState<'_, 'a, '_> {
    /// `take_action`: help and version end parsing; anything else goes to
    /// the caller.
    fn take_action(
        &mut self,
        index: usize,
        option_string: &[u8],
        mut values: Vec<&[u8]>,
    ) -> Result<(), Exit> {
        let parser = self.parser;
        let arg = &parser.args[index];
        self.seen[index] = true;
        // `_get_values` drops the first "--".
        if let Some(p) = values.iter().position(|v| *v == b"--") {
            values.remove(p);
        }
        match arg.kind {
            Kind::Help => Err(Exit {
                stdout: parser.format_help(),
                stderr: String::new(),
                code: 0,
            }),
            Kind::Version => Err(Exit {
                stdout: format!("{}\n", parser.version),
                stderr: String::new(),
                code: 0,
            }),
            Kind::BoolOptional | Kind::Plain => {
                let option_string = String::from_utf8_lossy(option_string);
                let values = values
                    .into_iter()
                    .map(|v| OsString::from_vec(v.to_vec()))
                    .collect();
                (self.take)((arg, &option_string, values))
                    .map_err(|msg| parser.arg_error(arg, &msg))
            }
        }
    }

    /// `consume_positionals`: as many positionals as the pattern allows
    /// from `start`. Returns where they stop.
    fn consume_positionals(&mut self, start: usize) -> Result<usize, Exit> {
        let selected = &self.pattern[start..];
        let mut counts = Vec::new();
        for n in (1..=self.positionals.len()).rev() {
            let re: String = std::iter::once("^")
                .chain(
                    self.positionals[..n]
                        .iter()
                        .map(|&p| self.parser.args[p].nargs_pattern()),
                )
                .collect();
            let re = Regex::new(&re).expect("valid regex");
            if let Some(c) = re.captures(selected) {
                counts = (1..=n).map(|g| c.get(g).map_or(0, |m| m.len())).collect();
                break;
            }
        }
        let mut pos = start;
        for (k, &count) in counts.iter().enumerate() {
            let index = self.positionals[k];
            self.take_action(index, b"", self.args[pos..pos + count].to_vec())?;
            pos += count;
        }
        self.positionals.drain(..counts.len());
        Ok(pos)
    }

    /// `consume_optional`: the option at `start` (and, for `-xyz`, the
    /// flags joined to it). Returns where its values stop.
    fn consume_optional(&mut self, start: usize, tuple: OptionTuple) -> Result<usize, Exit> {
        let parser = self.parser;
        let (mut action, mut option_string, mut explicit) = tuple;
        let mut taken: Vec<TakenOption<'a>> = Vec::new();
        let stop = loop {
            let Some(a) = action else {
                self.extras.push(self.args[start]);
                return Ok(start + 1);
            };
            let arg = &parser.args[a];
            let Some(e) = explicit.take() else {
                let first = start + 1;
                let count = match arg.nargs {
                    Nargs::Zero => 0,
                    _ if self.pattern[first..].starts_with('A') => 1,
                    _ => return Err(parser.arg_error(arg, "expected one argument")),
                };
                taken.push((a, option_string, self.args[first..first + count].to_vec()));
                break first + count;
            };
            let ignored = || {
                parser.arg_error(
                    arg,
                    &format!("ignored explicit argument {}", pytext::repr_str(&e)),
                )
            };
            if arg.nargs != Nargs::Zero {
                // The value is the end of the argument string.
                let whole = self.args[start];
                taken.push((a, option_string, vec![&whole[whole.len() - e.len()..]]));
                break start + 1;
            }
            if option_string.get(1) == Some(&b'-') || e.is_empty() {
                return Err(ignored());
            }
            // `-xyz` is `-x -y -z` for flags.
            taken.push((a, option_string, Vec::new()));
            let first_len = pytext::decode_char(&e).map_or(1, |(_, n)| n);
            let mut next = b"-".to_vec();
            next.extend_from_slice(&e[..first_len]);
            let Some(n) = parser.find_option(&next) else {
                return Err(ignored());
            };
            let rest = &e[first_len..];
            explicit = (!rest.is_empty()).then(|| rest.to_vec());
            action = Some(n);
            option_string = next;
        };
        for (a, o, values) in taken {
            self.take_action(a, &o, values)?;
        }
        Ok(stop)
    }
}
