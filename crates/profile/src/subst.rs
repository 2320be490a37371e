//! `--mod-filename` / `--mod-funcname` search-and-replace expressions:
//! Perl-style `s/old/new/flags` text run with Python's `re.sub` semantics,
//! as Valgrind's tools do.
//!
//! * The expression is split the way the tools' own pattern
//!   `s/(.*)(?<!\\)/(.*)(?<!\\)/(g|i|gi|ig|)$` splits it: greedily, so the
//!   last unescaped slashes delimit; `\/` then becomes `/`.
//! * Without `g` only the first match is replaced; `i` ignores case.
//! * The replacement is a Python template: `\1`..`\99`, `\g<1>`,
//!   `\g<name>`, the escapes `\n`, `\t`, …, octal `\0`/`\NNN`; other
//!   escapes of ASCII letters are errors, other escapes are kept as
//!   written. A group that did not take part in the match gives "".
//! * Empty matches are replaced as Python 3.7+ does, also right after a
//!   non-empty match.
//!
//! Known differences with Python's `re`, all in the pattern syntax, which
//! the `regex` crate provides: no look-around and no back-references (such
//! patterns are refused), `\Z` is translated to `\z`, and `$` does not
//! match before a final newline (names never contain one). Python compiles
//! the pattern lazily and crashes on a bad one when it is first used; here
//! a bad pattern or template is refused up front.

use regex::bytes::{Captures, Regex, RegexBuilder};

/// A compiled `s/old/new/flags` expression.
#[derive(Debug, Clone)]
pub struct Subst {
    regex: Regex,
    template: Vec<Part>,
    /// Replace every match, not just the first.
    global: bool,
}

/// A piece of a replacement template.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Literal(Vec<u8>),
    Group(usize),
}

/// Why an expression was refused. The tools report every case as
/// ``invalid search_and_replace value: '<expr>'``; the reason is extra
/// detail for callers that want it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubstError(pub String);

impl std::fmt::Display for SubstError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for SubstError {}

/// Splits `s/old/new/flags` as the tools' regex does. Returns the raw
/// pattern, replacement and flags.
fn split_expr(expr: &str) -> Option<(&str, &str, &str)> {
    let body = expr.strip_prefix("s/")?;
    // `$` matches at the end or before a final newline; `.` matches no
    // newline, so any other newline makes the match fail.
    let core = body.strip_suffix('\n').unwrap_or(body);
    if core.contains('\n') {
        return None;
    }
    let b = core.as_bytes();
    // A delimiter is a '/' not preceded by a backslash; at position 0 it is
    // preceded by the '/' of "s/".
    let is_delim = |p: usize| b[p] == b'/' && (p == 0 || b[p - 1] != b'\\');
    // Greedy `(.*)` groups: the rightmost first delimiter that allows a
    // match wins, then the rightmost second one.
    for p1 in (0..b.len()).rev().filter(|&p| is_delim(p)) {
        for p2 in (p1 + 1..b.len()).rev().filter(|&p| is_delim(p)) {
            let flags = &core[p2 + 1..];
            if matches!(flags, "" | "g" | "i" | "gi" | "ig") {
                return Some((&core[..p1], &core[p1 + 1..p2], flags));
            }
        }
    }
    None
}

/// Parses a Python replacement template. `groups` is the number of capture
/// groups; `name_index` resolves `\g<name>`.
fn parse_template(
    repl: &str,
    groups: usize,
    name_index: impl Fn(&str) -> Option<usize>,
) -> Result<Vec<Part>, SubstError> {
    let mut parts = Vec::new();
    let mut lit: Vec<u8> = Vec::new();
    let push_group = |parts: &mut Vec<Part>, lit: &mut Vec<u8>, index: usize| {
        if index > groups {
            return Err(SubstError(format!("invalid group reference {index}")));
        }
        if !lit.is_empty() {
            parts.push(Part::Literal(std::mem::take(lit)));
        }
        parts.push(Part::Group(index));
        Ok(())
    };
    let chars: Vec<char> = repl.chars().collect();
    let mut i = 0;
    let is_oct = |c: Option<&char>| c.is_some_and(|c| ('0'..='7').contains(c));
    while i < chars.len() {
        let c = chars[i];
        i += 1;
        if c != '\\' {
            let mut buf = [0; 4];
            lit.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
            continue;
        }
        let Some(&e) = chars.get(i) else {
            return Err(SubstError("bad escape (end of pattern)".into()));
        };
        i += 1;
        match e {
            'g' => {
                if chars.get(i) != Some(&'<') {
                    return Err(SubstError("missing <".into()));
                }
                let close = chars[i + 1..]
                    .iter()
                    .position(|&c| c == '>')
                    .ok_or_else(|| SubstError("missing >, unterminated name".into()))?;
                let name: String = chars[i + 1..i + 1 + close].iter().collect();
                i += close + 2;
                if name.is_empty() {
                    return Err(SubstError("missing group name".into()));
                }
                let index = if name.chars().all(|c| c.is_ascii_digit()) {
                    name.parse::<usize>()
                        .map_err(|_| SubstError(format!("invalid group reference {name}")))?
                } else {
                    name_index(&name)
                        .ok_or_else(|| SubstError(format!("unknown group name '{name}'")))?
                };
                push_group(&mut parts, &mut lit, index)?;
            }
            '0' => {
                let mut value = 0u32;
                for _ in 0..2 {
                    if is_oct(chars.get(i)) {
                        value = value * 8 + chars[i].to_digit(8).unwrap_or(0);
                        i += 1;
                    }
                }
                push_char(&mut lit, value & 0xff);
            }
            '1'..='9' => {
                let mut digits = e.to_string();
                let mut octal = None;
                if chars.get(i).is_some_and(|c| c.is_ascii_digit()) {
                    digits.push(chars[i]);
                    i += 1;
                    if is_oct(Some(&e))
                        && is_oct(digits.chars().nth(1).as_ref())
                        && is_oct(chars.get(i))
                    {
                        digits.push(chars[i]);
                        i += 1;
                        let v = u32::from_str_radix(&digits, 8).unwrap_or(0);
                        if v > 0o377 {
                            return Err(SubstError(format!(
                                "octal escape value \\{digits} outside of range 0-0o377"
                            )));
                        }
                        octal = Some(v);
                    }
                }
                match octal {
                    Some(v) => push_char(&mut lit, v),
                    None => push_group(&mut parts, &mut lit, digits.parse().unwrap_or(0))?,
                }
            }
            'a' => lit.push(0x07),
            'b' => lit.push(0x08),
            'f' => lit.push(0x0c),
            'n' => lit.push(b'\n'),
            'r' => lit.push(b'\r'),
            't' => lit.push(b'\t'),
            'v' => lit.push(0x0b),
            '\\' => lit.push(b'\\'),
            e if e.is_ascii_alphabetic() => {
                return Err(SubstError(format!("bad escape \\{e}")));
            }
            e => {
                lit.push(b'\\');
                let mut buf = [0; 4];
                lit.extend_from_slice(e.encode_utf8(&mut buf).as_bytes());
            }
        }
    }
    if !lit.is_empty() {
        parts.push(Part::Literal(lit));
    }
    Ok(parts)
}

/// Appends the character with code `v` (< 256) as UTF-8.
fn push_char(lit: &mut Vec<u8>, v: u32) {
    let c = char::from_u32(v).unwrap_or('\u{fffd}');
    let mut buf = [0; 4];
    lit.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
}

/// Translates the few Python pattern spellings the `regex` crate writes
/// differently.
fn translate_pattern(pat: &str) -> String {
    let mut out = String::with_capacity(pat.len());
    let mut chars = pat.chars();
    while let Some(c) = chars.next() {
        if c == '\\' {
            match chars.next() {
                Some('Z') => out.push_str("\\z"),
                Some(n) => {
                    out.push('\\');
                    out.push(n);
                }
                None => out.push('\\'),
            }
        } else {
            out.push(c);
        }
    }
    out
}

impl Subst {
    /// Parses and compiles `s/old/new/flags`.
    pub fn parse(expr: &str) -> Result<Subst, SubstError> {
        let (pat, repl, flags) =
            split_expr(expr).ok_or_else(|| SubstError("not of the form s/old/new/flags".into()))?;
        let pat = pat.replace("\\/", "/");
        let repl = repl.replace("\\/", "/");
        let regex = RegexBuilder::new(&translate_pattern(&pat))
            .case_insensitive(flags.contains('i'))
            .build()
            .map_err(|e| SubstError(e.to_string()))?;
        let groups = regex.captures_len() - 1;
        let template = parse_template(&repl, groups, |name| {
            regex.capture_names().position(|n| n == Some(name))
        })?;
        Ok(Subst {
            regex,
            template,
            global: flags.contains('g'),
        })
    }

    /// Applies the substitution to `s`.
    pub fn apply(&self, s: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(s.len());
        let mut last_end = 0;
        let mut pos = 0;
        let mut must_advance = false;
        while pos <= s.len() {
            let Some(mut caps) = self.regex.captures_at(s, pos) else {
                break;
            };
            let mut m = caps.get(0).map_or(pos..pos, |m| m.range());
            if must_advance && m.is_empty() && m.start == pos {
                // Python does not match the empty string again where the
                // previous empty match was; look from the next character.
                let Some(next) = next_char_boundary(s, pos) else {
                    break;
                };
                match self.regex.captures_at(s, next) {
                    Some(c) => caps = c,
                    None => break,
                }
                m = caps.get(0).map_or(next..next, |m| m.range());
            }
            out.extend_from_slice(&s[last_end..m.start]);
            self.expand(&caps, &mut out);
            last_end = m.end;
            must_advance = m.is_empty();
            pos = m.end;
            if !self.global {
                break;
            }
        }
        out.extend_from_slice(&s[last_end..]);
        out
    }

    fn expand(&self, caps: &Captures<'_>, out: &mut Vec<u8>) {
        for part in &self.template {
            match part {
                Part::Literal(l) => out.extend_from_slice(l),
                Part::Group(g) => {
                    if let Some(m) = caps.get(*g) {
                        out.extend_from_slice(m.as_bytes());
                    }
                }
            }
        }
    }
}

/// The position after the character at `pos`, or `None` at the end.
fn next_char_boundary(s: &[u8], pos: usize) -> Option<usize> {
    if pos >= s.len() {
        return None;
    }
    let n = crate::pytext::decode_char(&s[pos..]).map_or(1, |(_, n)| n);
    Some(pos + n)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sub(expr: &str, s: &str) -> String {
        String::from_utf8(Subst::parse(expr).unwrap().apply(s.as_bytes())).unwrap()
    }

    #[test]
    fn splitting_is_greedy_like_the_tools() {
        assert_eq!(split_expr("s/a/b/"), Some(("a", "b", "")));
        assert_eq!(split_expr("s/a/b/gi"), Some(("a", "b", "gi")));
        assert_eq!(split_expr("s/a/b/c/"), Some(("a/b", "c", "")));
        assert_eq!(split_expr("s/a\\/b/c/"), Some(("a\\/b", "c", "")));
        assert_eq!(
            split_expr("s/.*aux\\//aux\\//i"),
            Some((".*aux\\/", "aux\\/", "i"))
        );
        assert_eq!(split_expr("s///"), Some(("", "", "")));
        assert_eq!(split_expr("s/a/b/\n"), Some(("a", "b", "")));
        assert_eq!(split_expr("s/a/b/x"), None);
        assert_eq!(split_expr("s/a/b"), None);
        assert_eq!(split_expr("foo"), None);
        assert_eq!(split_expr("s/a\n/b/"), None);
        // Both slashes escaped: no delimiter.
        assert_eq!(split_expr("s/a\\/b\\/"), None);
    }

    #[test]
    fn replaces_like_python() {
        assert_eq!(sub("s/main/MAIN/", "main_main"), "MAIN_main");
        assert_eq!(sub("s/main/MAIN/g", "main_main"), "MAIN_MAIN");
        assert_eq!(sub("s/MAIN/x/i", "a_main"), "a_x");
        assert_eq!(sub("s/(f[a-z]*)[0-9]/\\1N/g", "f1 foo2 g3"), "fN fooN g3");
        assert_eq!(sub("s/.*aux\\//aux\\//i", "/x/AUX/y.rs"), "aux/y.rs");
        assert_eq!(sub("s/(?P<w>o+)/[\\g<w>\\g<0>]/", "foo"), "f[oooo]");
        assert_eq!(sub("s/x*/-/g", "abxd"), "-a-b--d-");
        assert_eq!(sub("s/(a)|b/[\\1]/g", "ab"), "[a][]");
        assert_eq!(sub("s/a/\\t\\.\\\\$1/", "a"), "\t\\.\\$1");
        assert_eq!(sub("s/a/\\101\\0/", "a"), "A\0");
        assert_eq!(sub("s/$/!/", "ab"), "ab!");
        assert_eq!(sub("s/b\\Z/c/", "ab"), "ac");
    }

    #[test]
    fn refuses_bad_expressions() {
        for bad in [
            "foo",
            "s/(/x/",
            "s/a/\\2/",
            "s/a/\\q/",
            "s/a/\\g<x>/",
            "s/(?<=a)b/c/",
        ] {
            assert!(Subst::parse(bad).is_err(), "{bad}");
        }
    }
}
