//! The functions a call tool knows, numbered as it meets them, and a
//! block's flow facts (`callrules::Flow`) from its class: what Callgrind's
//! rules read of it. Shared by the call tool and contexts mode's
//! classifier, so that both number functions and objects alike.

use crate::classify::{CodeClass, Section};
use crate::tool::CallOptions;
use callrules::{Exit, Flow, FnId};
use events::{BlockInfo, Terminator};
use rustc_hash::FxHashMap;
use std::sync::Arc;

/// A function as the tool knows it.
#[derive(Debug, Clone)]
pub struct Function {
    /// Its name, file and object.
    pub(crate) class: CodeClass,
    /// Calls to it push no context (`--skip-plt`).
    pub(crate) skip: bool,
    /// A jump out of it first returns from it (`_dl_runtime_resolve`,
    /// which ends by jumping to the function it resolved).
    pub(crate) pop_on_jump: bool,
    /// Entering or leaving it toggles, dumps or zeroes.
    pub(crate) notify: bool,
    /// The recursion levels its contexts keep apart: its own
    /// `--separate-recs<N>=`, else `--separate-recs`.
    pub(crate) separate_recs: u32,
}

/// A function's identity: object, file, name.
type CodeClassKey = (Arc<str>, Arc<str>, Arc<str>);

/// The functions met so far, by number, and the objects.
#[derive(Debug, Clone, Default)]
pub struct Functions {
    skip_plt: bool,
    separate_recs: u32,
    list: Vec<Function>,
    index: FxHashMap<CodeClassKey, FnId>,
    objects: FxHashMap<Arc<str>, u32>,
}

impl std::ops::Index<usize> for Functions {
    type Output = Function;
    fn index(&self, f: usize) -> &Function {
        &self.list[f]
    }
}

impl Functions {
    /// None yet, under `options` (`--skip-plt`, `--separate-recs`).
    pub fn new(options: &CallOptions) -> Functions {
        Functions {
            skip_plt: options.skip_plt,
            separate_recs: options.separate_recs,
            ..Functions::default()
        }
    }

    /// The number of the function of `class`, made if new.
    fn function_of(&mut self, class: CodeClass) -> FnId {
        let key = (
            class.object.clone(),
            class.file.clone(),
            class.function.clone(),
        );
        if let Some(&f) = self.index.get(&key) {
            return f;
        }
        let f = self.list.len() as FnId;
        let c = class.config;
        self.list.push(Function {
            skip: (class.section == Section::Plt && self.skip_plt) || c.skip,
            pop_on_jump: class.function.starts_with("_dl_runtime_resolve"),
            notify: c.toggle_collect || c.dump_before || c.dump_after || c.zero_before,
            separate_recs: c.separate_recs.unwrap_or(self.separate_recs),
            class,
        });
        self.index.insert(key, f);
        f
    }

    /// The flow facts of the block `info` describes, whose code is of
    /// `class`: its function (numbered if new), object and section kind,
    /// exit, addresses, and its function's options.
    pub fn flow(&mut self, class: CodeClass, info: &BlockInfo) -> Flow {
        let next = self.objects.len() as u32;
        let object = *self.objects.entry(class.object.clone()).or_insert(next);
        let (section, entry) = (class.section, class.entry);
        let function = self.function_of(class);
        let f = &self.list[function as usize];
        let mut flow = block_shape(info);
        (flow.function, flow.domain, flow.entry) = (function, object * 3 + section as u32, entry);
        (flow.skip, flow.pop_on_jump, flow.notify) = (f.skip, f.pop_on_jump, f.notify);
        flow
    }
}

/// The flow facts of `info`'s block that its own code decides: its
/// start, call site (its last instruction), end and exit; the function's
/// facts are left for the caller to fill in.
pub fn block_shape(info: &BlockInfo) -> Flow {
    let exit = match info.terminator() {
        Terminator::Call { .. } | Terminator::IndirectCall => Exit::Call,
        Terminator::Return => Exit::Return,
        Terminator::FallThrough => Exit::FallThrough,
        _ => Exit::Jump,
    };
    let call_site = info.instrs().last().map_or(info.start(), |l| l.addr);
    Flow::new(info.start(), call_site, info.end(), exit)
}
