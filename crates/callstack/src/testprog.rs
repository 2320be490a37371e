//! A random program for the property tests of the client's runtimes
//! against the call tool: six functions of an executable, a PLT stub
//! jumping into one of two library functions, blocks ending in random
//! terminators.

use crate::classify::{Classify, CodeClass, Section};
use crate::tree::{FnId, NodeId, Tree, NO_NODE};
use callrules::{Exit, Flow};
use ctxrt::{Facts, CALL_MEMO_WORDS};
use events::{BlockInfo, Terminator, Tool};
use rustc_hash::FxHashMap;

/// A function of the random program.
#[derive(Clone)]
pub(crate) struct Function {
    pub(crate) name: String,
    pub(crate) object: &'static str,
    pub(crate) section: Section,
    /// Skipped as `--fn-skip` skips (the PLT is, as `--skip-plt`).
    pub(crate) skip: bool,
    /// Its blocks' ids.
    pub(crate) blocks: Vec<usize>,
}

/// A block of the random program.
#[derive(Clone)]
pub(crate) struct Block {
    pub(crate) function: usize,
    pub(crate) index: usize,
    /// Its counter's number in its group: call blocks leave room for
    /// their call memo after theirs, as the translator numbers them.
    pub(crate) counter: usize,
    pub(crate) start: u64,
    pub(crate) instrs: u64,
    pub(crate) term: Terminator,
}

#[derive(Clone)]
pub(crate) struct Program {
    pub(crate) functions: Vec<Function>,
    pub(crate) blocks: Vec<Block>,
}

impl Program {
    pub(crate) fn at(&self, addr: u64) -> usize {
        self.blocks
            .iter()
            .position(|b| b.start == addr)
            .expect("a block")
    }

    pub(crate) fn domain(&self, f: usize) -> u32 {
        let f = &self.functions[f];
        let object = u32::from(f.object == "lib");
        object * 3 + f.section as u32
    }

    pub(crate) fn facts(&self, b: usize) -> Facts {
        let blk = &self.blocks[b];
        let exit = match blk.term {
            Terminator::Call { .. } | Terminator::IndirectCall => Exit::Call,
            Terminator::Return => Exit::Return,
            Terminator::FallThrough => Exit::FallThrough,
            _ => Exit::Jump,
        };
        let end = blk.start + blk.instrs;
        let mut flow = Flow::new(blk.start, end - 1, end, exit);
        flow.function = blk.function as u32;
        flow.domain = self.domain(blk.function);
        flow.entry = blk.index == 0;
        flow.skip = self.functions[blk.function].skip;
        Facts {
            flow,
            group: blk.function as u32,
            index: blk.counter as u32,
            memo: may_call(blk.term),
            instrs: blk.instrs as u32,
            sp_known: matches!(
                blk.term,
                Terminator::Call { .. }
                    | Terminator::IndirectCall
                    | Terminator::Return
                    | Terminator::IndirectJump
            ),
        }
    }
}

impl Classify for Program {
    fn classify(&mut self, info: &BlockInfo) -> CodeClass {
        let b = &self.blocks[self.at(info.start())];
        let f = &self.functions[b.function];
        CodeClass {
            object: f.object.into(),
            file: "f.c".into(),
            function: f.name.as_str().into(),
            entry: b.index == 0,
            section: f.section,
            config: crate::classify::FnConfig {
                skip: f.skip && f.section != Section::Plt,
                ..Default::default()
            },
        }
    }

    fn fork(&self) -> Box<dyn Classify> {
        Box::new(self.clone())
    }
}

/// Whether a block left by `term` has a call memo, as the translator
/// gives one to a block that may leave its context other than by a
/// return (here: a call, an indirect jump, a jump into another
/// function).
pub(crate) fn may_call(term: Terminator) -> bool {
    matches!(
        term,
        Terminator::Call { .. }
            | Terminator::IndirectCall
            | Terminator::IndirectJump
            | Terminator::Jump { .. }
    )
}

/// xorshift64*.
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    pub(crate) fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 33) as usize % n
    }
}

/// Six functions of the executable, a PLT stub jumping into one of two
/// library functions; blocks laid out one after another, each ending
/// in a random terminator.
pub(crate) fn program(rng: &mut Rng) -> Program {
    let mut functions = Vec::new();
    for k in 0..6 {
        functions.push(("exe", Section::Text, format!("f{k}"), 2 + rng.below(5)));
    }
    functions.push(("exe", Section::Plt, "0x8000 [PLT]".into(), 1));
    functions.push(("lib", Section::Text, "lib0".into(), 2 + rng.below(3)));
    functions.push(("lib", Section::Text, "lib1".into(), 2 + rng.below(3)));
    // A function of the executable `--fn-skip` skips: called, and jumped
    // into from the others' code (which keeps their context).
    functions.push(("exe", Section::Text, "fskip".into(), 2 + rng.below(3)));
    let mut p = Program {
        functions: Vec::new(),
        blocks: Vec::new(),
    };
    for (k, (object, section, name, n)) in functions.into_iter().enumerate() {
        let skip = section == Section::Plt || name == "fskip";
        let mut start = 0x1000 * (k as u64 + 1);
        let mut blocks = Vec::new();
        for index in 0..n {
            let instrs = 1 + rng.below(3) as u64;
            blocks.push(p.blocks.len());
            p.blocks.push(Block {
                function: k,
                index,
                counter: 0,
                start,
                instrs,
                term: Terminator::Return,
            });
            start += instrs;
        }
        p.functions.push(Function {
            name,
            object,
            section,
            skip,
            blocks,
        });
    }
    let entry = |p: &Program, f: usize| p.blocks[p.functions[f].blocks[0]].start;
    // The executable's functions, its PLT stub and its skipped function.
    let callable = |rng: &mut Rng| match rng.below(8) {
        7 => 9,
        f => f,
    };
    let number = |p: &mut Program| {
        for f in 0..p.functions.len() {
            let mut next = 0;
            for &b in &p.functions[f].blocks {
                p.blocks[b].counter = next;
                let call = may_call(p.blocks[b].term);
                next += 1 + if call { CALL_MEMO_WORDS } else { 0 };
            }
        }
    };
    for b in 0..p.blocks.len() {
        let (f, index) = (p.blocks[b].function, p.blocks[b].index);
        let fb = p.functions[f].blocks.clone();
        let last = index + 1 == fb.len();
        let lib = p.functions[f].object == "lib";
        p.blocks[b].term = if p.functions[f].section == Section::Plt {
            Terminator::IndirectJump
        } else if last {
            Terminator::Return
        } else {
            match rng.below(20) {
                0..=5 => Terminator::CondJump {
                    target: p.blocks[fb[1 + rng.below(fb.len() - 1)]].start,
                },
                6..=9 if !lib => Terminator::Call {
                    target: entry(&p, callable(rng)),
                },
                10 if !lib => Terminator::IndirectCall,
                // A tail call, through the PLT too.
                11 if !lib => Terminator::Jump {
                    target: entry(&p, rng.below(7)),
                },
                12 if !lib => {
                    let g = callable(rng);
                    let gb = &p.functions[g].blocks;
                    Terminator::Jump {
                        target: p.blocks[gb[rng.below(gb.len())]].start,
                    }
                }
                13 | 14 => Terminator::IndirectJump,
                15 => Terminator::Return,
                _ => Terminator::FallThrough,
            }
        };
    }
    number(&mut p);
    p
}

/// Self Ir per context (named by its stack of functions) and arcs
/// with their counts and inclusive Ir, as text.
pub(crate) type Results = (Vec<(String, u64)>, Vec<String>);

/// A tree's [`Results`], its contexts named by their stack of
/// functions, or by their function and level alone if `flat`
/// (Callgrind's contexts).
pub(crate) fn results(
    tree: &Tree,
    name: impl Fn(FnId) -> String,
    instrs: impl Fn(u32) -> u64,
    flat: bool,
) -> Results {
    let path = |mut n: NodeId| {
        let mut s = String::new();
        while n != NO_NODE {
            let node = tree.nodes[n as usize];
            s = format!("{}'{}/{s}", name(node.function), node.level);
            n = if flat { NO_NODE } else { node.parent };
        }
        s
    };
    let mut selfs: FxHashMap<String, u64> = FxHashMap::default();
    for (&(n, b), &runs) in tree.run_keys.iter().zip(&tree.runs) {
        *selfs.entry(path(n)).or_default() += runs * instrs(b);
    }
    for (&(n, site), &ir) in tree.extra.iter() {
        *selfs.entry(format!("{} @{site:#x}", path(n))).or_default() += ir;
    }
    let mut selfs: Vec<_> = selfs.into_iter().filter(|e| e.1 > 0).collect();
    selfs.sort();
    // Arcs of one name (those of one (function, level) pair, if
    // `flat`) are one.
    let mut by_name: FxHashMap<String, (u64, u64)> = FxHashMap::default();
    for a in tree.arcs.iter().filter(|a| a.calls > 0 || a.inclusive > 0) {
        let name = format!(
            "{} @{:#x} -> {} @{:#x}",
            path(a.caller),
            a.call_site,
            path(a.callee),
            a.target
        );
        let e = by_name.entry(name).or_default();
        e.0 += a.calls;
        e.1 += a.inclusive;
    }
    let mut arcs: Vec<_> = by_name
        .into_iter()
        .map(|(name, (calls, ir))| format!("{name}: {calls} calls, {ir} Ir"))
        .collect();
    arcs.sort();
    (selfs, arcs)
}

/// The random program's machine: its call stack, its stack pointer at
/// the next block's start, and the running frame's: the stack pointer
/// its function was entered with and the bytes its prologue took (the
/// stack pointer is lower in a function's body than at its entry and its
/// tail calls, as in compiled code).
pub(crate) struct Machine {
    pub(crate) frames: Vec<Frame>,
    pub(crate) sp: u64,
    entry_sp: u64,
    size: u64,
}

/// A call the machine runs: the block it returns to, the stack pointer
/// after the return, and the caller's frame (entry stack pointer, size).
#[derive(Clone, Copy)]
pub(crate) struct Frame {
    ret: usize,
    after: u64,
    entry_sp: u64,
    size: u64,
}

impl Default for Machine {
    fn default() -> Machine {
        Machine {
            frames: Vec::new(),
            sp: 0x10_0000,
            entry_sp: 0x10_0000,
            size: 0,
        }
    }
}

/// The bytes function `f`'s prologue takes: none for the PLT.
fn frame_size(p: &Program, f: usize) -> u64 {
    match p.functions[f].section {
        Section::Plt => 0,
        _ => 16 * (f as u64 % 3),
    }
}

impl Machine {
    /// The stack pointer in the running function's body.
    fn body(&self) -> u64 {
        self.entry_sp - self.size
    }

    /// Function `f` starts in the running frame (entered by a call or a
    /// tail call, at the frame's entry stack pointer).
    fn enter(&mut self, p: &Program, f: usize) {
        self.size = frame_size(p, f);
        self.sp = self.entry_sp;
    }

    /// The block that runs after block `b`, telling `tool` the stack
    /// pointer where the stream path records it.
    pub(crate) fn next(
        &mut self,
        p: &Program,
        rng: &mut Rng,
        b: usize,
        tool: &mut crate::CallTool,
    ) -> usize {
        let blk = &p.blocks[b];
        let end = blk.start + blk.instrs;
        let next_in_fn = || p.at(end);
        let is_entry = |y: usize| p.blocks[y].index == 0;
        match blk.term {
            Terminator::Call { .. } | Terminator::IndirectCall => {
                let body = self.body();
                tool.stack_pointer(body);
                self.frames.push(Frame {
                    ret: next_in_fn(),
                    after: body,
                    entry_sp: self.entry_sp,
                    size: self.size,
                });
                let y = match blk.term {
                    Terminator::Call { target } => p.at(target),
                    // A function pointer: any of the executable's
                    // functions, or the PLT stub.
                    _ => p.functions[rng.below(7)].blocks[0],
                };
                self.entry_sp = body - 8;
                self.enter(p, p.blocks[y].function);
                y
            }
            Terminator::Return => {
                // The epilogue put the stack pointer back first.
                tool.stack_pointer(self.entry_sp);
                // With no frame left, a return underflows: the machine
                // goes on in f0 as if f0 had called it.
                let f = self.frames.pop().unwrap_or(Frame {
                    ret: 0,
                    after: self.entry_sp + 8,
                    entry_sp: self.entry_sp + 8,
                    size: 0,
                });
                // (Past the return address, where a tail call from a
                // function's body put it.)
                self.sp = self.entry_sp + 8;
                (self.entry_sp, self.size) = (f.entry_sp, f.size);
                f.ret
            }
            Terminator::IndirectJump => {
                let to = if p.functions[blk.function].section == Section::Plt {
                    let lib = 7 + rng.below(2);
                    self.enter(p, lib);
                    p.functions[lib].blocks[0]
                } else if rng.below(2) == 0 {
                    // A tail call through a pointer: an executable's
                    // function or the PLT stub, as hand-written code may
                    // sometimes from the body (the stack pointer not put
                    // back first).
                    // Or into any block of a library's function (another
                    // domain: a call wherever it lands).
                    let f = rng.below(9);
                    if rng.below(2) == 0 {
                        self.entry_sp = self.body();
                    }
                    self.enter(p, f);
                    let blocks = &p.functions[f].blocks;
                    match f {
                        7 | 8 => blocks[rng.below(blocks.len())],
                        _ => blocks[0],
                    }
                } else if self.frames.len() >= 2 && rng.below(2) == 0 {
                    // longjmp to an older frame's return site.
                    let k = rng.below(self.frames.len() - 1);
                    let f = self.frames[k];
                    self.frames.truncate(k);
                    (self.sp, self.entry_sp, self.size) = (f.after, f.entry_sp, f.size);
                    f.ret
                } else {
                    self.sp = self.body();
                    next_in_fn()
                };
                tool.stack_pointer(self.sp);
                to
            }
            Terminator::Jump { target } if is_entry(p.at(target)) => {
                // A tail call: the epilogue first.
                let y = p.at(target);
                self.enter(p, p.blocks[y].function);
                y
            }
            term => {
                self.sp = self.body();
                match term {
                    Terminator::CondJump { target } if rng.below(2) == 0 => p.at(target),
                    Terminator::Jump { target } => p.at(target),
                    _ => next_in_fn(),
                }
            }
        }
    }
}
