//! Valgrind-style messages: user messages prefixed `==PID== `, debug
//! messages `--PID-- `, the client's own (`VALGRIND_PRINTF`) `**PID** `, to
//! stderr or to the `--log-file`; with
//! `--time-stamp=yes`, the time since startup goes inside the prefix, as
//! `==00:00:00:01.234 PID== ` (days, hours, minutes, seconds.millis).

use std::collections::HashSet;
use std::fs::File;
use std::io::{self, Write};
use std::path::Path;
use std::time::Instant;

/// Where messages go.
pub struct Log {
    file: Option<File>,
    /// `--time-stamp=yes`: when cachescope started.
    started: Option<Instant>,
    /// Processes whose last client text did not end its line.
    open_client_lines: HashSet<i32>,
}

impl Log {
    /// Messages to stderr.
    pub fn stderr() -> Self {
        Log {
            file: None,
            started: None,
            open_client_lines: HashSet::new(),
        }
    }

    /// Messages to a new file at `path` (created or truncated).
    pub fn to_file(path: &Path) -> io::Result<Self> {
        Ok(Log {
            file: Some(File::create(path)?),
            started: None,
            open_client_lines: HashSet::new(),
        })
    }

    /// Messages get Valgrind's time stamps, counted from `started`.
    pub fn with_time_stamps(mut self, started: Instant) -> Self {
        self.started = Some(started);
        self
    }

    /// `PID`, or `TIME PID` with time stamps.
    fn who(&self, pid: i32) -> String {
        match self.started {
            None => pid.to_string(),
            Some(t) => format!("{} {pid}", time_stamp(t.elapsed().as_millis())),
        }
    }

    /// Whether messages go to a file (Valgrind then adds `Parent PID:` to
    /// the preamble).
    pub fn is_file(&self) -> bool {
        self.file.is_some()
    }

    /// Another handle on the destination (the same open file, sharing its
    /// offset), for output written besides the messages: Lackey's trace.
    pub fn writer(&self) -> Box<dyn Write + Send> {
        match self.file.as_ref().map(File::try_clone) {
            Some(Ok(f)) => Box::new(f),
            // Not expected (it would take running out of descriptors): the
            // trace then goes to stderr.
            Some(Err(_)) | None => Box::new(io::stderr()),
        }
    }

    fn write_line(&mut self, line: &str) {
        let mut buf = String::with_capacity(line.len() + 1);
        buf.push_str(line);
        buf.push('\n');
        self.write(&buf);
    }

    fn write(&mut self, text: &str) {
        // One write per message, so that lines from different processes do
        // not interleave mid-line; a failed log write is not worth dying.
        let _ = match &mut self.file {
            Some(f) => f.write_all(text.as_bytes()),
            None => io::stderr().lock().write_all(text.as_bytes()),
        };
    }

    /// Text the client had printed (`VALGRIND_PRINTF`), as Valgrind's
    /// message buffer writes it: `**PID** ` at the start of each line, and
    /// a text that does not end its line continued by the next one.
    pub fn client(&mut self, pid: i32, text: &str) {
        let mut at_left = !self.open_client_lines.contains(&pid);
        let mut out = String::with_capacity(text.len() + 16);
        for c in text.chars() {
            if at_left {
                out.push_str(&format!("**{}** ", self.who(pid)));
            }
            out.push(c);
            at_left = c == '\n';
        }
        if at_left {
            self.open_client_lines.remove(&pid);
        } else {
            self.open_client_lines.insert(pid);
        }
        self.write(&out);
    }

    /// A user message (`==PID== text`; an empty text gives `==PID== `).
    pub fn umsg(&mut self, pid: i32, text: &str) {
        self.write_line(&format!("=={}== {text}", self.who(pid)));
    }

    /// A debug message (`--PID-- text`).
    pub fn dmsg(&mut self, pid: i32, text: &str) {
        self.write_line(&format!("--{}-- {text}", self.who(pid)));
    }
}

/// Valgrind's `--time-stamp=yes` text for `ms` milliseconds:
/// `DD:HH:MM:SS.mmm`.
fn time_stamp(ms: u128) -> String {
    let (s, ms) = (ms / 1000, ms % 1000);
    let (m, s) = (s / 60, s % 60);
    let (h, m) = (m / 60, m % 60);
    let (d, h) = (h / 24, h % 24);
    format!("{d:02}:{h:02}:{m:02}:{s:02}.{ms:03}")
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
    fn time_stamps_read_like_valgrind() {
        assert_eq!(time_stamp(0), "00:00:00:00.000");
        assert_eq!(time_stamp(90_061_001), "01:01:01:01.001");
        let log = Log::stderr().with_time_stamps(Instant::now());
        let who = log.who(42);
        assert!(
            who.starts_with("00:00:00:0") && who.ends_with(" 42"),
            "{who}"
        );
    }

    #[test]
    fn preamble_args_are_escaped_like_valgrind() {
        assert_eq!(preamble_arg("a b"), "a\\ b");
        assert_eq!(preamble_arg("<x>\\"), "\\<x\\>\\\\");
        assert_eq!(preamble_arg("é"), "__");
    }

    #[test]
    fn client_text_is_prefixed_per_line_and_continued_across_messages() {
        let dir = testkit::TempDir::new("log-client");
        let path = dir.join("log");
        let mut log = Log::to_file(&path).unwrap();
        log.client(7, "no newline 1");
        log.client(7, "two\nlines\n");
        log.client(8, "other\n");
        drop(log);
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            "**7** no newline 1two\n**7** lines\n**8** other\n"
        );
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
