//! `--trace-children-skip` and `--trace-children-skip-by-arg`: which exec'd
//! programs are not followed, matched as Valgrind matches them
//! (`VG_(should_we_trace_this_child)`): comma-separated glob patterns
//! (`*`, `?`, `\` escaping the next character) against the file name given
//! to `execve`, and against each of the new program's arguments.

/// The patterns of both options.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SkipPatterns {
    /// `--trace-children-skip=`: patterns for the executable's name.
    pub by_exe: Vec<String>,
    /// `--trace-children-skip-by-arg=`: patterns for any argument.
    pub by_arg: Vec<String>,
}

/// Splits an option's value into its patterns (empty fields are ignored,
/// as Valgrind skips repeated commas).
pub fn patterns(value: &str) -> Vec<String> {
    value
        .split(',')
        .filter(|p| !p.is_empty())
        .map(str::to_string)
        .collect()
}

impl SkipPatterns {
    /// Whether the program `exe`, started with `argv`, is skipped.
    pub fn skips(&self, exe: &str, argv: &[String]) -> bool {
        self.by_exe.iter().any(|p| glob_match(p, exe))
            || self
                .by_arg
                .iter()
                .any(|p| argv.iter().any(|a| glob_match(p, a)))
    }
}

/// Valgrind's `VG_(string_match)`: `*` matches any run of characters, `?`
/// any one, `\` makes the next character literal.
pub fn glob_match(pattern: &str, text: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let t: Vec<char> = text.chars().collect();
    matches_at(&p, &t)
}

fn matches_at(p: &[char], t: &[char]) -> bool {
    match p.split_first() {
        None => t.is_empty(),
        Some(('*', rest)) => (0..=t.len()).any(|i| matches_at(rest, &t[i..])),
        Some(('?', rest)) => !t.is_empty() && matches_at(rest, &t[1..]),
        Some(('\\', rest)) if !rest.is_empty() => {
            t.first() == Some(&rest[0]) && matches_at(&rest[1..], &t[1..])
        }
        Some((c, rest)) => t.first() == Some(c) && matches_at(rest, &t[1..]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs_match_like_valgrind() {
        assert!(glob_match("*esbuild", "/usr/lib/node/esbuild"));
        assert!(!glob_match("*esbuild", "/usr/bin/esbuild2"));
        assert!(glob_match("/bin/ec?o", "/bin/echo"));
        assert!(glob_match("*", ""));
        assert!(glob_match("a\\*b", "a*b"));
        assert!(!glob_match("a\\*b", "axb"));
        assert!(glob_match("*.rustup-wrapped", "/x/cargo.rustup-wrapped"));
    }

    #[test]
    fn patterns_split_at_commas_and_apply_to_exe_or_args() {
        let s = SkipPatterns {
            by_exe: patterns("*esbuild,,*/echo"),
            by_arg: patterns("--skip-me"),
        };
        assert_eq!(s.by_exe, ["*esbuild", "*/echo"]);
        assert!(s.skips("/bin/echo", &["echo".into()]));
        assert!(!s.skips("/bin/cat", &["cat".into(), "x".into()]));
        assert!(s.skips("/bin/cat", &["cat".into(), "--skip-me".into()]));
    }
}
