//! `--tool=callgrind`: [`callstack::CallTool`] fed by the engine's trace
//! stream, one per process (a forked child continues with a copy), and at
//! each process's exit its `callgrind.out` file and Callgrind's summary.
//!
//! The tool runs in the engine's consumer thread and names each block's
//! function as it is translated (Callgrind decides calls by functions,
//! objects and sections); symbol tables are not shareable between threads,
//! so that thread keeps its own [`Symbolizer`] (the run's own one symbolizes
//! positions at exit).

use std::any::Any;
use std::cell::RefCell;
use std::sync::Arc;

use callstack::{CallTool, Classify, CodeClass, Section};
use engine::{ProcessProfile, StreamTool, ToolFactory};
use events::{BlockId, BlockInfo, Needs, Record, SignalEvent, Tool};
use profile::output::{write_output, OutputError};
use symbols::{Mapping, NameOptions, SectionKind, Symbolizer, UNKNOWN};

use super::attribute;
use super::cgopts::CallgrindOptions;
use super::options::RunOptions;
use super::CgSink;

thread_local! {
    /// The consumer thread's symbolizer (see the module documentation).
    static SYMBOLS: RefCell<Option<Symbolizer>> = const { RefCell::new(None) };
}

/// Names blocks' functions as Callgrind does (`fn.c`): the debug name,
/// else the code's offset in its object (`0x%016x`, ` [PLT]` in the PLT).
#[derive(Clone, Copy)]
struct SymbolClassifier {
    names: NameOptions,
}

impl Classify for SymbolClassifier {
    fn classify(&mut self, info: &BlockInfo) -> CodeClass {
        let addr = info.start();
        let unknown = || Arc::<str>::from(UNKNOWN);
        let Some(origin) = info.origin() else {
            return CodeClass {
                object: unknown(),
                file: unknown(),
                function: Arc::from(format!("{addr:#018x}")),
                entry: false,
                section: Section::Other,
            };
        };
        let mapping = Mapping {
            path: origin.path.clone(),
            start: origin.start,
            end: origin.end,
            file_offset: origin.file_offset,
        };
        let facts = SYMBOLS.with(|s| {
            s.borrow_mut()
                .get_or_insert_with(|| Symbolizer::with_names(self.names))
                .code_facts(&mapping, addr)
        });
        let section = match facts.section {
            SectionKind::Text => Section::Text,
            SectionKind::Plt => Section::Plt,
            SectionKind::Other => Section::Other,
        };
        let named = &*facts.location.func != UNKNOWN;
        let function = if named {
            Arc::from(&*facts.location.func)
        } else {
            let plt = if section == Section::Plt {
                " [PLT]"
            } else {
                ""
            };
            Arc::from(format!("{:#018x}{plt}", facts.offset))
        };
        CodeClass {
            object: facts
                .object
                .map_or_else(unknown, |p| Arc::from(p.to_string_lossy().as_ref())),
            file: Arc::from(&*facts.location.file),
            function,
            entry: named && facts.entry,
            section,
        }
    }

    fn fork(&self) -> Box<dyn Classify> {
        Box::new(*self)
    }
}

/// A [`CallTool`] the engine can own and fork.
struct LiveCallTool(CallTool);

impl Tool for LiveCallTool {
    fn needs(&self) -> Needs {
        self.0.needs()
    }
    fn block(&mut self, id: BlockId, info: &BlockInfo) {
        self.0.block(id, info);
    }
    fn record(&mut self, record: Record) {
        self.0.record(record);
    }
    fn block_run(&mut self, id: BlockId, info: &BlockInfo, addrs: &[u64]) {
        self.0.block_run(id, info, addrs);
    }
    fn thread(&mut self, thread: u64) {
        self.0.thread(thread);
    }
    fn thread_end(&mut self, thread: u64) {
        self.0.thread_end(thread);
    }
    fn stack_pointer(&mut self, sp: u64) {
        self.0.stack_pointer(sp);
    }
    fn signal(&mut self, event: SignalEvent) {
        self.0.signal(event);
    }
}

impl StreamTool for LiveCallTool {
    fn fork(&self) -> Box<dyn StreamTool> {
        Box::new(LiveCallTool(self.0.fork()))
    }
    fn into_any(self: Box<Self>) -> Box<dyn Any + Send> {
        self
    }
}

/// A fresh call tool per process image.
pub fn factory(opts: &RunOptions, cg: &CallgrindOptions) -> ToolFactory {
    let calls = cg.calls.clone();
    let names = opts.names;
    Arc::new(move || {
        let classify = Box::new(SymbolClassifier { names });
        Box::new(LiveCallTool(CallTool::new(calls.clone(), classify)))
    })
}

impl CgSink<'_> {
    /// Writes the `callgrind.out` file of a process that ended and prints
    /// Callgrind's summary.
    pub(super) fn callgrind_finished(
        &mut self,
        cg: &CallgrindOptions,
        mut proc_profile: ProcessProfile,
    ) {
        let pid = proc_profile.pid;
        if self.opts.verbosity > 0 {
            self.log.umsg(pid, "");
        }
        let Some(path) = self.out_path("--callgrind-out-file", &cg.out_file, pid) else {
            return;
        };
        let Some(mut tool) = proc_profile
            .tool
            .take()
            .and_then(|t| t.0.into_any().downcast::<LiveCallTool>().ok())
            .map(|t| t.0)
        else {
            return;
        };
        tool.finish();
        let cmd = if self.opts.trace_children {
            attribute::command_line_of(pid).unwrap_or_else(|| self.cmd.clone())
        } else {
            self.cmd.clone()
        };
        let mappings: Vec<Mapping> = proc_profile.modules.iter().map(mapping).collect();
        let mut profile = callgrind::Profile {
            version: Some("1".into()),
            creator: Some(format!("cachescope-{}", super::VERSION)),
            pid: Some(pid.to_string()),
            cmd: Some(cmd),
            ..callgrind::Profile::default()
        };
        let symbols = &mut self.symbols;
        let mut locate = |addr: u64| {
            let l = symbols.locate(&mappings, addr);
            (l.file, l.line)
        };
        let mut part = tool.part(&mut profile, cg.output, None, &mut locate);
        part.number = Some(1);
        part.desc = vec![
            "I1 cache: ".into(),
            "D1 cache: ".into(),
            "LL cache: ".into(),
            format!("Timerange: Basic block 0 - {}", tool.block_runs()),
            "Trigger: Program termination".into(),
        ];
        let total = part.totals.as_ref().map_or(0, |t| t[0]);
        profile.parts.push(part);
        self.write_exports(
            cg,
            pid,
            &tool,
            &mappings,
            profile.cmd.as_deref().unwrap_or(""),
        );
        match write_output(&path, 0o600, |w| profile.write_to(w, cg.write)) {
            Ok(()) => {}
            Err(OutputError::Open(_)) => {
                self.log.umsg(
                    pid,
                    &format!(
                        "Error: can not open cache simulation output file `{}'",
                        path.display()
                    ),
                );
            }
            Err(OutputError::Write(e)) => {
                self.log.umsg(
                    pid,
                    &format!(
                        "error: can't write output data file '{}': {e}",
                        path.display()
                    ),
                );
            }
        }
        if self.opts.verbosity > 0 {
            for l in summary_lines(total) {
                self.log.umsg(pid, &l);
            }
        }
    }
}

fn mapping(m: &engine::ModuleRecord) -> Mapping {
    Mapping {
        path: m.path.clone(),
        start: m.start,
        end: m.end,
        file_offset: m.file_offset,
    }
}

/// Callgrind's summary at exit (without cache or branch simulation).
fn summary_lines(ir: u64) -> Vec<String> {
    vec![
        "Events    : Ir".to_string(),
        format!("Collected : {ir}"),
        String::new(),
        format!("I   refs:      {}", crate::summary::commas(ir, 0)),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_reads_like_callgrind() {
        assert_eq!(
            summary_lines(131_164),
            [
                "Events    : Ir",
                "Collected : 131164",
                "",
                "I   refs:      131,164"
            ]
        );
    }
}
