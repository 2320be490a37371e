//! The reader: a Callgrind profile file into a [`Profile`].
//!
//! It reads what Valgrind's Callgrind writes (3.19 here, with `--dump-instr`,
//! `--collect-jumps`, `--separate-threads`, `--combine-dumps`, compressed or
//! not) and what [`crate::writer`] writes. Every error is one line naming
//! the input line; no input makes it panic.

use std::collections::HashMap;
use std::fmt;
use std::io::Read;

use crate::model::{Block, Call, Costs, Event, Item, Jump, JumpKind, Part, Position, Profile};
use crate::names::{NameId, NameTable};

/// A malformed input line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseError {
    /// The 1-based line number.
    pub line: usize,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "line {}: {}", self.line, self.message)
    }
}

impl std::error::Error for ParseError {}

/// Why a profile could not be read.
#[derive(Debug)]
pub enum ReadError {
    /// The input could not be read.
    Io(std::io::Error),
    /// The input is not a valid Callgrind profile.
    Parse(ParseError),
}

impl fmt::Display for ReadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReadError::Io(e) => e.fmt(f),
            ReadError::Parse(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for ReadError {}

impl Profile {
    /// Reads a whole profile.
    pub fn read_from(mut input: impl Read) -> Result<Profile, ReadError> {
        let mut data = Vec::new();
        input.read_to_end(&mut data).map_err(ReadError::Io)?;
        parse(&data).map_err(ReadError::Parse)
    }
}

/// Parses a whole profile held in memory.
pub fn parse(data: &[u8]) -> Result<Profile, ParseError> {
    let mut reader = Reader::default();
    let mut line_no = 0;
    for raw in data.split(|&b| b == b'\n') {
        line_no += 1;
        let line = String::from_utf8_lossy(raw);
        let line = line.strip_suffix('\r').unwrap_or(&line);
        reader.line(line).map_err(|message| ParseError {
            line: line_no,
            message,
        })?;
    }
    // `split` yields an empty last piece after a final newline.
    reader.finish().map_err(|message| ParseError {
        line: line_no,
        message,
    })
}

/// A call or jump line waiting for its source line.
enum Pending {
    Call { count: u64, target: Position },
    Jump { kind: JumpKind, target: Position },
}

/// The parsing state.
#[derive(Default)]
struct Reader {
    profile: Profile,
    /// The part being read (pushed to the profile when the next starts).
    part: Part,
    /// Whether `part` has had body lines (blocks or totals).
    part_has_body: bool,
    /// Long names from `event:` lines, by short name.
    long_names: HashMap<String, String>,
    object: Option<NameId>,
    /// The `fl=` file, for the next `fn=`.
    file: Option<NameId>,
    /// The current file inside the block (after `fi=`/`fe=`).
    sub_file: Option<NameId>,
    /// The last source position (relative positions refer to it).
    last: Position,
    call_object: Option<Option<NameId>>,
    call_file: Option<NameId>,
    call_function: Option<NameId>,
    jump_file: Option<NameId>,
    jump_function: Option<NameId>,
    pending: Option<Pending>,
}

/// Header keys (`key: value`) that belong to a part's header.
const PART_KEYS: &[&str] = &[
    "version",
    "creator",
    "pid",
    "cmd",
    "part",
    "thread",
    "desc",
    "positions",
    "event",
    "events",
];

impl Reader {
    fn line(&mut self, line: &str) -> Result<(), String> {
        if line.trim().is_empty() || line.starts_with('#') {
            return if self.pending.is_some() {
                Err(self.missing_source())
            } else {
                Ok(())
            };
        }
        let first = line.as_bytes()[0];
        if first.is_ascii_digit() || matches!(first, b'+' | b'-' | b'*') {
            return self.position_line(line);
        }
        if self.pending.is_some() {
            return Err(self.missing_source());
        }
        if let Some((key, value)) = body_key(line) {
            return self.body_line(key, value);
        }
        if let Some((key, value)) = line.split_once(':') {
            let key = key.trim();
            // Header keys are words (newer versions add some, e.g. with
            // spaces and parentheses); anything else is garbage.
            let is_key = key.starts_with(|c: char| c.is_ascii_alphabetic())
                && key
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || " _-()".contains(c));
            if is_key {
                return self.header_line(key, value.trim_start());
            }
        }
        Err(format!("unrecognized line `{line}`"))
    }

    fn missing_source(&self) -> String {
        match self.pending {
            Some(Pending::Jump { .. }) => "a jump line must be followed by its source position",
            _ => "a calls= line must be followed by the call site's position and costs",
        }
        .to_string()
    }

    fn header_line(&mut self, key: &str, value: &str) -> Result<(), String> {
        if self.part_has_body && PART_KEYS.contains(&key) {
            self.start_part();
        }
        match key {
            "version" => {
                let major = value.split('.').next().unwrap_or("").trim();
                match major.parse::<u64>() {
                    Ok(1) => {}
                    Ok(v) => return Err(format!("cannot read format version {v}")),
                    Err(_) => return Err(format!("bad version `{value}`")),
                }
                self.profile.version = Some(value.to_string());
            }
            "creator" => self.profile.creator = Some(value.to_string()),
            "pid" => self.profile.pid = Some(value.to_string()),
            "cmd" => self.profile.cmd = Some(value.to_string()),
            "part" => self.part.number = Some(number(value.trim(), "part number")?),
            "thread" => self.part.thread = Some(number(value.trim(), "thread number")?),
            "desc" => self.part.desc.push(value.to_string()),
            "positions" => {
                let mut positions = crate::model::Positions {
                    instr: false,
                    line: false,
                };
                for word in value.split_whitespace() {
                    match word {
                        "instr" | "addr" => positions.instr = true,
                        "line" => positions.line = true,
                        other => return Err(format!("unsupported position kind `{other}`")),
                    }
                }
                if !positions.instr && !positions.line {
                    return Err("empty positions: line".to_string());
                }
                self.part.positions = positions;
            }
            "event" => {
                let (name, long) = value.split_once(':').unwrap_or((value, ""));
                let (name, long) = (name.trim(), long.trim());
                if name.is_empty() {
                    return Err("event: line without a name".to_string());
                }
                match self.part.events.iter_mut().find(|e| e.name == name) {
                    Some(e) => e.long_name = Some(long.to_string()),
                    None => {
                        self.long_names.insert(name.to_string(), long.to_string());
                    }
                }
            }
            "events" => {
                self.part.events = value
                    .split_whitespace()
                    .map(|name| Event {
                        name: name.to_string(),
                        long_name: self.long_names.get(name).cloned(),
                    })
                    .collect();
                if self.part.events.is_empty() {
                    return Err("no events in the events: line".to_string());
                }
            }
            "summary" => self.part.summary = Some(self.costs(value.split_whitespace())?),
            "totals" => {
                self.part.totals = Some(self.costs(value.split_whitespace())?);
                self.part_has_body = true;
            }
            _ => self.part.other_header.push(format!("{key}: {value}")),
        }
        Ok(())
    }

    /// Ends the current part and starts the next, which keeps its
    /// positions and events unless it states its own.
    fn start_part(&mut self) {
        let next = Part {
            positions: self.part.positions,
            events: self.part.events.clone(),
            ..Part::default()
        };
        self.profile
            .parts
            .push(std::mem::replace(&mut self.part, next));
        self.part_has_body = false;
        self.object = None;
        self.file = None;
        self.sub_file = None;
        self.last = Position::default();
    }

    fn body_line(&mut self, key: &str, value: &str) -> Result<(), String> {
        self.part_has_body = true;
        let names = &mut self.profile.names;
        match key {
            "ob" => self.object = Some(name(&mut names.objects, value)?),
            "fl" => {
                self.file = Some(name(&mut names.files, value)?);
            }
            "fn" => {
                let function = name(&mut names.functions, value)?;
                let file = self.file.ok_or("fn= before any fl=")?;
                self.part.blocks.push(Block {
                    object: self.object,
                    file,
                    function,
                    items: Vec::new(),
                });
                self.sub_file = Some(file);
            }
            "fi" | "fe" => {
                let file = name(&mut names.files, value)?;
                let block = self
                    .part
                    .blocks
                    .last_mut()
                    .ok_or("fi=/fe= outside a function")?;
                block.items.push(Item::File(file));
                self.sub_file = Some(file);
            }
            "cob" => self.call_object = Some(Some(name(&mut names.objects, value)?)),
            "cfi" | "cfl" => self.call_file = Some(name(&mut names.files, value)?),
            "cfn" => self.call_function = Some(name(&mut names.functions, value)?),
            "jfi" => self.jump_file = Some(name(&mut names.files, value)?),
            "jfn" => self.jump_function = Some(name(&mut names.functions, value)?),
            "calls" => {
                self.current_block()?;
                let (count, rest) = value.split_once(char::is_whitespace).unwrap_or((value, ""));
                let count = number(count, "call count")?;
                let target = self.target(rest)?;
                if self.call_function.is_none() {
                    return Err("calls= without a cfn= before it".to_string());
                }
                self.pending = Some(Pending::Call { count, target });
            }
            "jump" | "jcnd" => {
                self.current_block()?;
                let (counts, rest) = value.split_once(char::is_whitespace).unwrap_or((value, ""));
                let kind = if key == "jump" {
                    JumpKind::Always {
                        count: number(counts, "jump count")?,
                    }
                } else {
                    let (taken, executed) = counts
                        .split_once('/')
                        .ok_or_else(|| format!("bad jcnd= counts `{counts}`"))?;
                    JumpKind::Conditional {
                        taken: number(taken, "jump count")?,
                        executed: number(executed, "jump count")?,
                    }
                };
                let target = self.target(rest)?;
                self.pending = Some(Pending::Jump { kind, target });
            }
            _ => unreachable!("body_key only returns known keys"),
        }
        Ok(())
    }

    fn current_block(&self) -> Result<&Block, String> {
        self.part
            .blocks
            .last()
            .ok_or_else(|| "cost or call line outside a function (no fn= yet)".to_string())
    }

    /// A target position: relative to the last source position, which it
    /// does not change.
    fn target(&self, text: &str) -> Result<Position, String> {
        let mut words = text.split_whitespace();
        let position = self.position(&mut words)?;
        match words.next() {
            None => Ok(position),
            Some(extra) => Err(format!("unexpected `{extra}` after the target position")),
        }
    }

    fn position<'a>(&self, words: &mut impl Iterator<Item = &'a str>) -> Result<Position, String> {
        let positions = self.part.positions;
        let mut position = Position::default();
        if positions.instr {
            let word = words.next().ok_or("missing instruction address")?;
            position.addr = subposition(word, self.last.addr)?;
        }
        if positions.line {
            let word = words.next().ok_or("missing line number")?;
            position.line = subposition(word, self.last.line)?;
        }
        Ok(position)
    }

    fn costs<'a>(&self, words: impl Iterator<Item = &'a str>) -> Result<Costs, String> {
        let n = self.part.events.len();
        let mut costs = vec![0; n];
        for (i, word) in words.enumerate() {
            if i >= n {
                return Err(format!("more costs than the {n} events"));
            }
            costs[i] = number(word, "cost")?;
        }
        Ok(costs)
    }

    fn position_line(&mut self, line: &str) -> Result<(), String> {
        let block = self.current_block()?;
        let (block_object, block_function) = (block.object, block.function);
        if self.part.events.is_empty() {
            return Err("cost line before the events: line".to_string());
        }
        let mut words = line.split_whitespace();
        let position = self.position(&mut words)?;
        let costs = self.costs(words)?;
        self.last = position;
        let sub_file = self.sub_file.expect("set with the block");
        let item = match self.pending.take() {
            None => Item::Cost { position, costs },
            Some(Pending::Call { count, target }) => Item::Call(Call {
                object: self.call_object.take().unwrap_or(block_object),
                file: self.call_file.take().unwrap_or(sub_file),
                function: self.call_function.take().expect("checked at calls="),
                count,
                target,
                source: position,
                inclusive: costs,
            }),
            Some(Pending::Jump { kind, target }) => {
                if costs.iter().any(|&c| c != 0) {
                    return Err("costs on a jump's source line".to_string());
                }
                Item::Jump(Jump {
                    kind,
                    file: self.jump_file.take().unwrap_or(sub_file),
                    function: self.jump_function.take().unwrap_or(block_function),
                    target,
                    source: position,
                })
            }
        };
        self.part
            .blocks
            .last_mut()
            .expect("checked above")
            .items
            .push(item);
        Ok(())
    }

    fn finish(mut self) -> Result<Profile, String> {
        if self.pending.is_some() {
            return Err(self.missing_source());
        }
        if self.part.events.is_empty() && self.profile.parts.is_empty() {
            return Err("no events: line (not a Callgrind profile?)".to_string());
        }
        self.profile.parts.push(self.part);
        Ok(self.profile)
    }
}

/// Splits `key=value` for the body keys.
fn body_key(line: &str) -> Option<(&str, &str)> {
    let (key, value) = line.split_once('=')?;
    const KEYS: &[&str] = &[
        "ob", "fl", "fi", "fe", "fn", "cob", "cfi", "cfl", "cfn", "calls", "jump", "jcnd", "jfi",
        "jfn",
    ];
    KEYS.contains(&key).then_some((key, value))
}

/// A name specification: `(id) name`, `(id)` or `name`.
fn name(table: &mut NameTable, value: &str) -> Result<NameId, String> {
    let compressed = value
        .strip_prefix('(')
        .filter(|rest| rest.starts_with(|c: char| c.is_ascii_digit()));
    let Some(rest) = compressed else {
        return Ok(table.intern_uncompressed(value));
    };
    let (id, text) = rest
        .split_once(')')
        .ok_or_else(|| format!("bad compressed name `{value}`"))?;
    let id = number(id, "name id")?;
    let text = text.trim_start();
    if text.is_empty() {
        table
            .by_id(id)
            .ok_or_else(|| format!("name ({id}) used before it was defined"))
    } else {
        table.define(id, text)
    }
}

/// One subposition: `*`, `+N`, `-N`, `0xHEX` or `N`.
fn subposition(word: &str, last: u64) -> Result<u64, String> {
    let bad = || format!("bad position `{word}`");
    if word == "*" {
        Ok(last)
    } else if let Some(d) = word.strip_prefix('+') {
        last.checked_add(number(d, "position")?).ok_or_else(bad)
    } else if let Some(d) = word.strip_prefix('-') {
        last.checked_sub(number(d, "position")?).ok_or_else(bad)
    } else if let Some(hex) = word.strip_prefix("0x").or_else(|| word.strip_prefix("0X")) {
        u64::from_str_radix(hex, 16).map_err(|_| bad())
    } else {
        number(word, "position")
    }
}

/// A decimal number.
fn number(word: &str, what: &str) -> Result<u64, String> {
    if word.is_empty() || !word.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("bad {what} `{word}`"));
    }
    word.parse()
        .map_err(|_| format!("{what} `{word}` out of range"))
}
