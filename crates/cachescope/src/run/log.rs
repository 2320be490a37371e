//! Valgrind-style messages: user messages prefixed `==PID== `, debug
//! messages `--PID-- `, to stderr or to the `--log-file`.

use std::fs::File;
use std::io::{self, Write};
use std::path::Path;

/// Where messages go.
pub struct Log {
    file: Option<File>,
}

impl Log {
    /// Messages to stderr.
    pub fn stderr() -> Self {
        Log { file: None }
    }

    /// Messages to a new file at `path` (created or truncated).
    pub fn to_file(path: &Path) -> io::Result<Self> {
        Ok(Log {
            file: Some(File::create(path)?),
        })
    }

    /// Whether messages go to a file (Valgrind then adds `Parent PID:` to
    /// the preamble).
    pub fn is_file(&self) -> bool {
        self.file.is_some()
    }

    fn write_line(&mut self, line: &str) {
        // One write per line, so that lines from different processes do
        // not interleave mid-line; a failed log write is not worth dying.
        let mut buf = String::with_capacity(line.len() + 1);
        buf.push_str(line);
        buf.push('\n');
        let _ = match &mut self.file {
            Some(f) => f.write_all(buf.as_bytes()),
            None => io::stderr().lock().write_all(buf.as_bytes()),
        };
    }

    /// A user message (`==PID== text`; an empty text gives `==PID== `).
    pub fn umsg(&mut self, pid: i32, text: &str) {
        self.write_line(&format!("=={pid}== {text}"));
    }

    /// A debug message (`--PID-- text`).
    pub fn dmsg(&mut self, pid: i32, text: &str) {
        self.write_line(&format!("--{pid}-- {text}"));
    }
}

/// Valgrind's rendering of a command-line word in the preamble: bytes
/// outside printable ASCII become `_`, and space, `\`, `<`, `>` get a
/// backslash.
pub fn preamble_arg(arg: &str) -> String {
    let mut out = String::with_capacity(arg.len());
    for b in arg.bytes() {
        let c = if (32..=127).contains(&b) {
            b as char
        } else {
            '_'
        };
        if matches!(c, ' ' | '\\' | '<' | '>') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn preamble_args_are_escaped_like_valgrind() {
        assert_eq!(preamble_arg("a b"), "a\\ b");
        assert_eq!(preamble_arg("<x>\\"), "\\<x\\>\\\\");
        assert_eq!(preamble_arg("é"), "__");
    }

    #[test]
    fn file_log_gets_prefixed_lines() {
        let path = std::env::temp_dir().join(format!("cs-log-test-{}", std::process::id()));
        let mut log = Log::to_file(&path).unwrap();
        assert!(log.is_file());
        log.umsg(12, "hello");
        log.umsg(12, "");
        log.dmsg(12, "dbg");
        drop(log);
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            "==12== hello\n==12== \n--12-- dbg\n"
        );
        std::fs::remove_file(&path).unwrap();
    }
}
