//! Valgrind's file-name patterns (`VG_(expand_file_name)`, spec §5.1):
//! `%p` → pid, `%n` → a per-pid sequence number, `%q{VAR}` → the value of
//! an environment variable, `%%` → `%`; a relative result is prefixed with
//! the directory cachescope started in, so a client's `chdir` has no effect.
//! (Writing the file so named is `profile::output`.)

use std::collections::HashMap;
use std::path::PathBuf;

/// Expands file-name patterns, keeping the `%n` counters per pid.
#[derive(Debug)]
pub struct Expander {
    startup_dir: Option<PathBuf>,
    seq: HashMap<i32, u32>,
}

/// The message lines for a bad pattern, as Valgrind prints them after
/// `Bad option: <option>=<pattern>` (each line gets the output prefix).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadPattern(pub Vec<String>);

impl Expander {
    /// An expander resolving relative names against `startup_dir` (`None`
    /// if the working directory did not exist at startup).
    pub fn new(startup_dir: Option<PathBuf>) -> Self {
        Expander {
            startup_dir,
            seq: HashMap::new(),
        }
    }

    /// Expands `pattern` (the value of `option`) for process `pid`, with
    /// `env` looking up `%q{VAR}`.
    pub fn expand(
        &mut self,
        option: &str,
        pattern: &str,
        pid: i32,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<PathBuf, BadPattern> {
        let bad = |msg: &[&str]| {
            let mut lines = vec![format!("Bad option: {option}={pattern}")];
            lines.extend(msg.iter().map(|s| s.to_string()));
            lines.push(crate::simopts::USE_HELP.to_string());
            BadPattern(lines)
        };
        if pattern.is_empty() {
            return Err(bad(&["No filename given"]));
        }
        if pattern.starts_with('~') {
            return Err(bad(&[
                "Filename begins with '~'",
                "You probably expected the shell to expand the '~', but it",
                "didn't.  The rules for '~'-expansion vary from shell to shell.",
                "You might have more luck using $HOME instead.",
            ]));
        }
        let mut out = String::new();
        let mut chars = pattern.chars();
        while let Some(c) = chars.next() {
            if c != '%' {
                out.push(c);
                continue;
            }
            match chars.next() {
                Some('%') => out.push('%'),
                Some('p') => out.push_str(&pid.to_string()),
                Some('n') => {
                    let n = self.seq.entry(pid).or_insert(0);
                    *n += 1;
                    out.push_str(&n.to_string());
                }
                Some('q') => {
                    if chars.next() != Some('{') {
                        return Err(bad(&["Expected '{' after '%q'"]));
                    }
                    let mut name = String::new();
                    loop {
                        match chars.next() {
                            None => return Err(bad(&["Missing '}' in %q specifier"])),
                            Some('}') => break,
                            Some(ch) => name.push(ch),
                        }
                    }
                    match env(&name) {
                        Some(v) => out.push_str(&v),
                        None => {
                            return Err(bad(&[&format!(
                                "Environment variable '{name}' is not set"
                            )]))
                        }
                    }
                }
                _ => return Err(bad(&["Expected 'p' or 'q' or '%' after '%'"])),
            }
        }
        if out.starts_with('/') {
            return Ok(PathBuf::from(out));
        }
        match &self.startup_dir {
            // Valgrind joins with a plain "/", keeping the name as written.
            Some(dir) => Ok(PathBuf::from(format!("{}/{out}", dir.display()))),
            None => Err(bad(&[
                "Current working dir doesn't exist, use absolute path",
            ])),
        }
    }
}

/// The environment lookup used for `%q{VAR}` outside tests.
pub fn process_env(name: &str) -> Option<String> {
    std::env::var_os(name).map(|v| v.to_string_lossy().into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(name: &str) -> Option<String> {
        (name == "FOO").then(|| "bar".to_string())
    }

    fn ex() -> Expander {
        Expander::new(Some(PathBuf::from("/start")))
    }

    #[test]
    fn expands_like_valgrind() {
        let mut e = ex();
        let p = e
            .expand("--cachegrind-out-file", "cg.%p.%q{FOO}.%n.%%", 9276, &env)
            .unwrap();
        assert_eq!(p, PathBuf::from("/start/cg.9276.bar.1.%"));
        let p = e.expand("--x", "/abs/%n-%n", 9276, &env).unwrap();
        assert_eq!(p, PathBuf::from("/abs/2-3"));
        let p = e.expand("--x", "o.%n", 1, &env).unwrap();
        assert_eq!(p, PathBuf::from("/start/o.1"));
    }

    #[test]
    fn bad_patterns_give_valgrinds_messages() {
        let mut e = ex();
        let msg = |e: &mut Expander, pat: &str| e.expand("--opt", pat, 1, &env).unwrap_err().0;
        assert_eq!(
            msg(&mut e, "x.%z"),
            vec![
                "Bad option: --opt=x.%z",
                "Expected 'p' or 'q' or '%' after '%'",
                crate::simopts::USE_HELP
            ]
        );
        assert_eq!(msg(&mut e, "")[1], "No filename given");
        assert_eq!(msg(&mut e, "~/x")[1], "Filename begins with '~'");
        assert_eq!(msg(&mut e, "~/x").len(), 6);
        assert_eq!(msg(&mut e, "a%q{FOO")[1], "Missing '}' in %q specifier");
        assert_eq!(msg(&mut e, "a%qFOO")[1], "Expected '{' after '%q'");
        assert_eq!(
            msg(&mut e, "a%q{NOPE}")[1],
            "Environment variable 'NOPE' is not set"
        );
        assert_eq!(msg(&mut e, "a%")[1], "Expected 'p' or 'q' or '%' after '%'");
        let mut lost = Expander::new(None);
        assert_eq!(
            msg(&mut lost, "rel")[1],
            "Current working dir doesn't exist, use absolute path"
        );
    }
}
