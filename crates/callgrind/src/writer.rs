//! The writer: a [`Profile`] in Callgrind's format, laid out as Callgrind
//! 3.19 lays it out, so that a file read in and written with the options
//! it was made with comes out byte for byte the same.
//!
//! Layout facts (from Callgrind's output): a part's header is `part:`,
//! `thread:`, a blank line, the tool's `desc:` lines (cache
//! configuration) between blank lines, the dump's own `desc:` lines
//! (`Timerange:`, `Trigger:`), a blank line, `positions:`, `event:` lines,
//! `events:`, `summary:` and two blank lines. Each function block is
//! followed by a blank line; `ob=`/`fl=` are written when they differ from
//! the previous block's; `totals:` ends the part, and a blank line
//! separates parts. Names are written in full the first time they are
//! used in each part. Positions are relative (`+N`, `-N`, `*`) when the
//! previous value is not 0 and the difference is under 100, and the
//! previous value is reset at each `fn=`; only cost lines change it (call
//! and jump lines are relative to it, and a call site elsewhere makes the
//! next position absolute).

use std::io::{self, Write};

use crate::model::{Block, Costs, Item, JumpKind, Part, Position, Positions, Profile};
use crate::names::{NameId, NameTable};

/// Callgrind's `--compress-strings` and `--compress-pos`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriteOptions {
    /// `(id) name` on first use and `(id)` afterwards (default on).
    pub compress_strings: bool,
    /// Relative positions `+N`/`-N`/`*` (default on).
    pub compress_pos: bool,
}

impl Default for WriteOptions {
    fn default() -> Self {
        WriteOptions {
            compress_strings: true,
            compress_pos: true,
        }
    }
}

impl Profile {
    /// Writes the profile in Callgrind's format.
    pub fn write_to(&self, w: &mut dyn Write, options: WriteOptions) -> io::Result<()> {
        let mut out = Vec::with_capacity(1 << 16);
        self.write_bytes(&mut out, options);
        w.write_all(&out)
    }

    /// The profile in Callgrind's format.
    pub fn to_bytes(&self, options: WriteOptions) -> Vec<u8> {
        let mut out = Vec::new();
        self.write_bytes(&mut out, options);
        out
    }

    fn write_bytes(&self, out: &mut Vec<u8>, options: WriteOptions) {
        let tables = [
            &self.names.objects,
            &self.names.files,
            &self.names.functions,
        ];
        let ids = tables.map(NameTable::effective_ids);
        for (i, part) in self.parts.iter().enumerate() {
            if i == 0 {
                out.extend_from_slice(b"# callgrind format\n");
                let header = [
                    ("version: ", &self.version),
                    ("creator: ", &self.creator),
                    ("pid: ", &self.pid),
                    ("cmd:  ", &self.cmd),
                ];
                for (key, value) in header {
                    if let Some(value) = value {
                        line(out, &[key, value]);
                    }
                }
            } else {
                out.push(b'\n');
            }
            let mut writer = PartWriter {
                out: &mut *out,
                profile: self,
                part,
                options,
                ids: &ids,
                written: tables.map(|t| vec![false; t.len()]),
                last: Position::default(),
            };
            writer.part();
        }
    }
}

/// Writes one part; `written` tracks the names already given in full in
/// this part.
struct PartWriter<'a> {
    out: &'a mut Vec<u8>,
    profile: &'a Profile,
    part: &'a Part,
    options: WriteOptions,
    ids: &'a [Vec<u64>; 3],
    written: [Vec<bool>; 3],
    last: Position,
}

/// The three id spaces, indexing `ids` and `written`.
#[derive(Clone, Copy)]
enum Space {
    Object = 0,
    File = 1,
    Function = 2,
}

impl PartWriter<'_> {
    fn part(&mut self) {
        let part = self.part;
        if let Some(n) = part.number {
            line(self.out, &["part: ", &n.to_string()]);
        }
        if let Some(t) = part.thread {
            line(self.out, &["thread: ", &t.to_string()]);
        }
        self.out.push(b'\n');
        // The tool's descriptions come before the dump's own.
        let split = part
            .desc
            .iter()
            .position(|d| d.starts_with("Timerange:") || d.starts_with("Trigger:"))
            .unwrap_or(part.desc.len());
        if split > 0 {
            self.out.push(b'\n');
            for d in &part.desc[..split] {
                line(self.out, &["desc: ", d]);
            }
            self.out.push(b'\n');
        }
        for d in &part.desc[split..] {
            line(self.out, &["desc: ", d]);
        }
        for other in &part.other_header {
            line(self.out, &[other]);
        }
        self.out.push(b'\n');
        line(self.out, &["positions: ", part.positions.spec()]);
        for event in &part.events {
            if let Some(long) = &event.long_name {
                line(self.out, &["event: ", &event.name, " : ", long]);
            }
        }
        let names: Vec<&str> = part.event_names();
        line(self.out, &["events: ", &names.join(" ")]);
        if let Some(summary) = &part.summary {
            self.out.extend_from_slice(b"summary:");
            push_costs(self.out, summary, part.events.len());
            self.out.push(b'\n');
        }
        self.out.extend_from_slice(b"\n\n");
        let mut previous: Option<&Block> = None;
        for block in &part.blocks {
            self.block(block, previous);
            previous = Some(block);
        }
        if let Some(totals) = &part.totals {
            self.out.extend_from_slice(b"totals:");
            push_costs(self.out, totals, part.events.len());
            self.out.push(b'\n');
        }
    }

    fn block(&mut self, block: &Block, previous: Option<&Block>) {
        let object_changed = previous.is_none_or(|p| p.object != block.object);
        if let (true, Some(object)) = (object_changed, block.object) {
            self.name_line("ob=", Space::Object, object);
        }
        // Callgrind's files belong to objects: `???` in two objects are two
        // files, so a new object always gets its `fl=`.
        if object_changed || previous.is_none_or(|p| p.file != block.file) {
            self.name_line("fl=", Space::File, block.file);
        }
        self.name_line("fn=", Space::Function, block.function);
        self.last = Position::default();
        let mut sub_file = block.file;
        for item in &block.items {
            match item {
                Item::File(file) => {
                    let key = if *file == block.file { "fe=" } else { "fi=" };
                    self.name_line(key, Space::File, *file);
                    sub_file = *file;
                }
                Item::Cost { position, costs } => {
                    self.source(*position);
                    self.costs(costs);
                }
                Item::Call(call) => {
                    let other_object = call.object != block.object;
                    if let (true, Some(object)) = (other_object, call.object) {
                        self.name_line("cob=", Space::Object, object);
                    }
                    if other_object || call.file != sub_file {
                        self.name_line("cfi=", Space::File, call.file);
                    }
                    self.name_line("cfn=", Space::Function, call.function);
                    self.out.extend_from_slice(b"calls=");
                    self.out
                        .extend_from_slice(call.count.to_string().as_bytes());
                    self.out.push(b' ');
                    self.target(call.target);
                    self.out.push(b'\n');
                    self.arc_source(call.source);
                    self.costs(&call.inclusive);
                }
                Item::Jump(jump) => {
                    if jump.file != sub_file {
                        self.name_line("jfi=", Space::File, jump.file);
                    }
                    if jump.function != block.function {
                        self.name_line("jfn=", Space::Function, jump.function);
                    }
                    let counts = match jump.kind {
                        JumpKind::Always { count } => format!("jump={count} "),
                        JumpKind::Conditional { taken, executed } => {
                            format!("jcnd={taken}/{executed} ")
                        }
                    };
                    self.out.extend_from_slice(counts.as_bytes());
                    self.target(jump.target);
                    self.out.push(b'\n');
                    self.arc_source(jump.source);
                    self.out.push(b'\n');
                }
            }
        }
        self.out.push(b'\n');
    }

    /// `key=(id) name`, `key=(id)` or `key=name`.
    fn name_line(&mut self, key: &str, space: Space, name: NameId) {
        let table = match space {
            Space::Object => &self.profile.names.objects,
            Space::File => &self.profile.names.files,
            Space::Function => &self.profile.names.functions,
        };
        let text = table.text(name);
        self.out.extend_from_slice(key.as_bytes());
        if self.options.compress_strings {
            let index = name.0 as usize;
            let id = self.ids[space as usize][index];
            self.out.push(b'(');
            self.out.extend_from_slice(id.to_string().as_bytes());
            self.out.push(b')');
            let written = &mut self.written[space as usize][index];
            if !*written {
                *written = true;
                self.out.push(b' ');
                self.out.extend_from_slice(text.as_bytes());
            }
        } else {
            self.out.extend_from_slice(text.as_bytes());
        }
        self.out.push(b'\n');
    }

    /// A source position, which becomes the last position.
    fn source(&mut self, position: Position) {
        self.target(position);
        self.last = position;
    }

    /// The source position of a call or jump. Callgrind moves its last
    /// position only at cost lines; readers (callgrind_annotate) move it
    /// at every position line. Where the two would disagree about the
    /// next relative position, the next one is written absolute (as
    /// Callgrind does at the start of a block, where its last position is
    /// 0), so that every reader reads the same.
    fn arc_source(&mut self, position: Position) {
        self.target(position);
        if position != self.last {
            self.last = Position::default();
        }
    }

    /// A position relative to the last source position, each subposition
    /// followed by a space.
    fn target(&mut self, position: Position) {
        let Positions { instr, line } = self.part.positions;
        let compress = self.options.compress_pos;
        if instr {
            subposition(self.out, position.addr, self.last.addr, compress, true);
        }
        if line {
            subposition(self.out, position.line, self.last.line, compress, false);
        }
    }

    /// Costs after a position: without trailing zeros, space-separated.
    fn costs(&mut self, costs: &Costs) {
        let n = significant(costs, self.part.events.len());
        for (i, c) in costs[..n].iter().enumerate() {
            if i > 0 {
                self.out.push(b' ');
            }
            self.out.extend_from_slice(c.to_string().as_bytes());
        }
        self.out.push(b'\n');
    }
}

/// How many leading costs to write: up to the last nonzero one, and never
/// more than there are events.
fn significant(costs: &[u64], events: usize) -> usize {
    let costs = &costs[..costs.len().min(events)];
    costs.iter().rposition(|&c| c != 0).map_or(0, |i| i + 1)
}

/// ` c1 c2 …` for `summary:` and `totals:` (all costs, as Callgrind
/// writes them).
fn push_costs(out: &mut Vec<u8>, costs: &[u64], events: usize) {
    for c in &costs[..costs.len().min(events)] {
        out.push(b' ');
        out.extend_from_slice(c.to_string().as_bytes());
    }
}

fn subposition(out: &mut Vec<u8>, value: u64, last: u64, compress: bool, hex: bool) {
    let diff = value as i128 - last as i128;
    if compress && last > 0 && diff.abs() < 100 {
        match diff {
            0 => out.push(b'*'),
            d if d > 0 => out.extend_from_slice(format!("+{d}").as_bytes()),
            d => out.extend_from_slice(d.to_string().as_bytes()),
        }
    } else if hex && value != 0 {
        out.extend_from_slice(format!("{value:#x}").as_bytes());
    } else {
        out.extend_from_slice(value.to_string().as_bytes());
    }
    out.push(b' ');
}

fn line(out: &mut Vec<u8>, pieces: &[&str]) {
    for p in pieces {
        out.extend_from_slice(p.as_bytes());
    }
    out.push(b'\n');
}
