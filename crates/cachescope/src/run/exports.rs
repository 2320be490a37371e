//! `--export=KIND:FILE` on a `--tool=callgrind` run: at each process's end,
//! its calling-context tree as a [`stacktree::StackTree`] (self Ir per
//! context and instruction, located by the run's symbolizer), written as
//! each export asks, whole or not at all.

use callstack::{CallTool, Place};
use std::rc::Rc;
use symbols::Mapping;

use super::cgopts::CallgrindOptions;
use super::CgSink;
use crate::outfile::{process_env, BadPattern};
use profile::output::{write_output, OutputError};

impl CgSink<'_> {
    /// Writes the exports `cg` asks for of the process `pid`'s tree.
    pub(super) fn write_exports(
        &mut self,
        cg: &CallgrindOptions,
        pid: i32,
        tool: &CallTool,
        mappings: &[Mapping],
        cmd: &str,
    ) {
        if cg.exports.is_empty() {
            return;
        }
        let symbols = &mut self.symbols;
        let mut place = |addr: u64| {
            let l = symbols.locate(mappings, addr);
            let (object, address) = match symbols.file_address(mappings, addr) {
                Some((path, svma)) => (Some(Rc::from(path.to_string_lossy().as_ref())), svma),
                None => (None, addr),
            };
            Place {
                object,
                address,
                file: l.file,
                line: l.line,
            }
        };
        let mut tree = tool.stack_tree(&mut place);
        tree.creator = format!("cachescope-{}", super::VERSION);
        tree.pid = pid.unsigned_abs();
        tree.cmd = cmd.to_string();
        let options = export::Options {
            inline: cg.export_inline,
            ..export::Options::default()
        };
        for (kind, pattern) in &cg.exports {
            let path = match self.expander.expand("--export", pattern, pid, &process_env) {
                Ok(p) => p,
                Err(BadPattern(lines)) => {
                    for l in lines {
                        self.log.umsg(pid, &l);
                    }
                    continue;
                }
            };
            let mut failure = None;
            let written = write_output(&path, 0o644, |w| {
                export::export(&tree, *kind, &options, w).map_err(|e| match e {
                    export::Error::Io(e) => e,
                    other => {
                        failure = Some(other.to_string());
                        std::io::Error::other("export refused")
                    }
                })
            });
            let why = match (written, failure) {
                (_, Some(why)) => why,
                (Ok(()), None) => continue,
                (Err(OutputError::Open(e)), None) => format!("can not open it: {e}"),
                (Err(OutputError::Write(e)), None) => e.to_string(),
            };
            self.log.umsg(
                pid,
                &format!("error: can't write export '{}': {why}", path.display()),
            );
        }
    }
}
