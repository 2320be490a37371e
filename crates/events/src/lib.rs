//! The event vocabulary that front ends (the instrumentation engine, trace
//! readers, test harnesses) hand to tools (cache and branch simulation,
//! cost building, later call graphs and cache-use analysis).
//!
//! It is the seam of the architecture, in the spirit of Valgrind's
//! core/tool split and of DynamoRIO drcachesim's tracer/reader/simulator
//! layers around `memref_t`:
//!
//! * **Static facts** live in [`BlockInfo`], given to a tool once per
//!   block ([`Tool::block`]): where the block starts, its instructions
//!   (address, length, memory operands' size and kind) and how it ends
//!   ([`Terminator`]).
//! * **Dynamic facts** arrive as slices of [`Record`]s in execution order
//!   ([`Tool::records`]): a block was entered, an instruction was fetched,
//!   a data location was read or written, a conditional branch went one
//!   way, an indirect branch went somewhere, a call or return happened.
//! * A tool says what it needs ([`Tool::needs`], [`Needs`]) so that a
//!   producer delivers only that: counting alone needs no stream at all
//!   (the engine keeps its inline counters), cache simulation needs
//!   instruction fetches and data references, branch simulation needs
//!   conditional outcomes and indirect targets.
//!
//! The per-event path allocates nothing: records are small `Copy` values
//! handed over in batches, and blocks are named by integer ids.
#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::sync::Arc;

/// Names one block's static metadata. The producer assigns ids (dense,
/// from 0, so that a tool can keep per-block state in a vector) and never
/// reuses one within a stream: a re-translated block gets a new id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockId(pub u32);

/// How an instruction uses a memory location.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AccessKind {
    /// A load.
    Read,
    /// A store.
    Write,
    /// A load and a store of the same location by one instruction (`add
    /// %eax,(%rdi)`, Lackey's `M`). One access: Cachegrind counts it as a
    /// read (spec §1.4).
    Modify,
}

/// The static shape of one memory access an instruction makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MemOperand {
    /// Bytes accessed.
    pub size: u32,
    /// Read, write or both.
    pub kind: AccessKind,
}

/// One instruction of a block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InstrInfo {
    /// Guest address.
    pub addr: u64,
    /// Length in bytes.
    pub len: u8,
    /// Index of its first memory operand in the block's list: operands are
    /// kept in one list per block so that a block costs two allocations.
    mem_start: u16,
}

/// How a block ends: what its last instruction does to control flow.
/// Targets known at translation time are given; the others arrive as
/// records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Terminator {
    /// No branch: the block was cut (size limit, or before an instruction
    /// the engine translates alone) and continues at [`BlockInfo::end`].
    FallThrough,
    /// `jmp target`.
    Jump {
        /// Where it goes.
        target: u64,
    },
    /// `jcc target` (also `jrcxz`, `loop`): taken goes to `target`, not
    /// taken to [`BlockInfo::end`]. The outcome is a
    /// [`Record::CondBranch`].
    CondJump {
        /// Where it goes when taken.
        target: u64,
    },
    /// `jmp *reg/mem`: the target is a [`Record::Indirect`].
    IndirectJump,
    /// `call target`, returning to [`BlockInfo::end`].
    Call {
        /// The callee.
        target: u64,
    },
    /// `call *reg/mem`, returning to [`BlockInfo::end`]: the target is a
    /// [`Record::Indirect`].
    IndirectCall,
    /// `ret`.
    Return,
    /// `syscall`: the kernel returns to [`BlockInfo::end`].
    Syscall,
}

/// Static metadata of one block: its instructions in order, their memory
/// operands, and how it ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockInfo {
    start: u64,
    instrs: Vec<InstrInfo>,
    mem: Vec<MemOperand>,
    terminator: Terminator,
    origin: Option<Arc<CodeOrigin>>,
}

/// The file mapping a block's code was read from, as the producer saw it
/// when it met the block (code unmapped later still says where it was):
/// what a tool that names functions while the program runs (call graphs)
/// symbolizes the block with.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CodeOrigin {
    /// Path of the mapped file (empty for anonymous memory).
    pub path: PathBuf,
    /// First address of the mapping.
    pub start: u64,
    /// One past its last address.
    pub end: u64,
    /// File offset that `start` maps.
    pub file_offset: u64,
}

impl BlockInfo {
    /// A block starting at `start` with no instructions yet.
    pub fn new(start: u64, terminator: Terminator) -> BlockInfo {
        BlockInfo {
            start,
            instrs: Vec::new(),
            mem: Vec::new(),
            terminator,
            origin: None,
        }
    }

    /// Records where the block's code was mapped from.
    pub fn set_origin(&mut self, origin: Arc<CodeOrigin>) {
        self.origin = Some(origin);
    }

    /// Where the block's code was mapped from, if the producer knows.
    pub fn origin(&self) -> Option<&Arc<CodeOrigin>> {
        self.origin.as_ref()
    }

    /// Appends the instruction at `addr`, `len` bytes long, whose memory
    /// accesses are `mem` in the order it makes them.
    ///
    /// # Panics
    ///
    /// If the block would hold more than 65,535 memory operands (blocks are
    /// a few dozen instructions).
    pub fn push(&mut self, addr: u64, len: u8, mem: &[MemOperand]) {
        let mem_start = u16::try_from(self.mem.len())
            .ok()
            .filter(|&s| usize::from(s) + mem.len() <= usize::from(u16::MAX))
            .expect("too many memory operands in one block");
        self.instrs.push(InstrInfo {
            addr,
            len,
            mem_start,
        });
        self.mem.extend_from_slice(mem);
    }

    /// The same block without its memory operands, its lists no longer
    /// than they need be: what a tool that keeps every block's
    /// description for the run's end, but simulates no caches, holds.
    pub fn without_mem_operands(mut self) -> BlockInfo {
        for i in &mut self.instrs {
            i.mem_start = 0;
        }
        self.instrs.shrink_to_fit();
        self.mem = Vec::new();
        self
    }

    /// Address of the first instruction.
    pub fn start(&self) -> u64 {
        self.start
    }

    /// One past the last instruction: where a fall-through, a not-taken
    /// conditional jump or a call's return continues.
    pub fn end(&self) -> u64 {
        self.instrs
            .last()
            .map_or(self.start, |i| i.addr + u64::from(i.len))
    }

    /// The instructions, in order.
    pub fn instrs(&self) -> &[InstrInfo] {
        &self.instrs
    }

    /// The memory operands of instruction `i` (an index into
    /// [`instrs`](Self::instrs)), in the order it accesses them.
    pub fn mem_operands(&self, i: usize) -> &[MemOperand] {
        let start = usize::from(self.instrs[i].mem_start);
        let end = self
            .instrs
            .get(i + 1)
            .map_or(self.mem.len(), |n| usize::from(n.mem_start));
        &self.mem[start..end]
    }

    /// Memory operands of all its instructions (the number of addresses
    /// one execution reports).
    pub fn mem_count(&self) -> usize {
        self.mem.len()
    }

    /// How the block ends.
    pub fn terminator(&self) -> Terminator {
        self.terminator
    }
}

/// One execution of one instruction: its fetch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InstrFetch {
    /// Guest address.
    pub addr: u64,
    /// Bytes fetched (the instruction's length).
    pub len: u32,
}

/// One dynamic data access.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DataRef {
    /// Address of the first byte.
    pub addr: u64,
    /// Bytes accessed.
    pub size: u32,
    /// Read, write or both.
    pub kind: AccessKind,
}

/// The outcome of one conditional branch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CondBranch {
    /// Address of the branch instruction.
    pub pc: u64,
    /// Whether it went to its target (for a rep-prefixed string
    /// instruction: whether it iterates again).
    pub taken: bool,
}

/// A control transfer whose target is only known at run time, or whose
/// occurrence matters to a call graph.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transfer {
    /// Address of the branch, call or return instruction.
    pub pc: u64,
    /// Where control went.
    pub target: u64,
}

/// One dynamic fact, as a tool receives it. Records of one thread arrive in
/// execution order: an instruction's [`Instr`](Record::Instr) comes first,
/// then its data references in the order it makes them, then its branch
/// records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Record {
    /// Control entered block `id`, whose [`BlockInfo`] the tool has been
    /// given. A marker only: it implies no instruction fetches (those are
    /// [`Instr`](Record::Instr) records), so a tool can use the static
    /// metadata (per-instruction state kept at [`Tool::block`], the
    /// terminator) without a lookup per instruction. Producers without
    /// block metadata (address traces) never emit it.
    Block(BlockId),
    /// One instruction executed. Delivered when
    /// [`Needs::instr_fetches`] (and by trace readers, which have them).
    Instr(InstrFetch),
    /// A data access by the instruction of the latest
    /// [`Instr`](Record::Instr). Delivered when [`Needs::data_refs`],
    /// always together with instruction fetches.
    Data(DataRef),
    /// A conditional branch's outcome. Delivered when
    /// [`Needs::cond_branches`].
    CondBranch(CondBranch),
    /// The target of an indirect jump or call. Delivered when
    /// [`Needs::indirect_targets`].
    Indirect(Transfer),
    /// A call (direct or indirect) and its callee. Delivered when
    /// [`Needs::calls_returns`]; an indirect call can also have an
    /// [`Indirect`](Record::Indirect) record.
    Call(Transfer),
    /// A return and where it went. Delivered when
    /// [`Needs::calls_returns`].
    Return(Transfer),
}

/// What a tool needs a producer to deliver. Anything not asked for may
/// still come (a trace reader delivers what its trace holds) and is then
/// ignored by the tool.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Needs {
    /// [`Record::Instr`] per executed instruction (Ir, I-cache).
    pub instr_fetches: bool,
    /// [`Record::Data`] per data access (D-cache).
    pub data_refs: bool,
    /// [`Record::CondBranch`] per conditional branch (Bc, Bcm).
    pub cond_branches: bool,
    /// [`Record::Indirect`] per indirect jump and call (Bi, Bim).
    pub indirect_targets: bool,
    /// What a call-stack tool needs (call graphs): the stack pointer at
    /// every call, return and indirect jump ([`Tool::stack_pointer`]),
    /// which thread the records are of ([`Tool::thread`]) and where signal
    /// handlers start and return ([`Tool::signal`]). Calls and returns
    /// themselves are the terminators of the blocks run; trace readers
    /// may also deliver [`Record::Call`] and [`Record::Return`].
    pub calls_returns: bool,
    /// With [`Needs::data_refs`]: the producer may leave out the data
    /// references that hit the most recently used line of their set in a
    /// cache of this geometry, and deliver the rest as [`KeptAccess`]
    /// words through [`Tool::block_run_kept`] (see [`MruFilter`]).
    pub mru_filter: Option<MruFilter>,
}

/// The geometry of the true-LRU caches whose most-recently-used hits a
/// producer may leave out of what it delivers ([`Needs::mru_filter`]).
///
/// Exact: the most recently used line of a set is the line referenced last
/// in it, hit or miss, so a producer that remembers per set the last line
/// its own references touched knows which references find their line on
/// top; such a reference hits and reorders nothing. A tool that runs every
/// delivered reference through the same cache (in order) ends in the same
/// state with the same misses. A reference straddling two lines is left
/// out when both are their sets' last lines (two hits that change
/// nothing); a data reference longer than a line counts as a
/// line's bytes at its address (Cachegrind caps them so when its caches
/// have one line size, the only case a tool asks for the filter).
///
/// Data references left out are still counted by the tool: Dr and Dw
/// follow from the block's operands and its executions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MruFilter {
    /// log2 of the line size (of D1, and of I1 when `fetch_set_bits`).
    pub line_bits: u8,
    /// log2 of D1's number of sets.
    pub set_bits: u8,
    /// log2 of I1's number of sets, when instruction fetches are filtered
    /// too. Then block executions are counted rather than reported: the
    /// producer delivers only what it keeps, in execution order, through
    /// [`Tool::site_accesses`] (or [`Tool::counted_access`], for blocks
    /// past the sites [`SiteWords`] can name), and each block's count at
    /// the end through
    /// [`Tool::block_runs`]. With [`Needs::cond_branches`] or
    /// [`Needs::indirect_targets`], the outcome of the branch ending each
    /// execution comes as a *branch word* (see [`BranchWords`]), in a
    /// stream of its own ([`Tool::branch_words`]). The fetches
    /// checked are those
    /// [`fetch_starts`] lists; a kept one names its place in that list.
    pub fetch_set_bits: Option<u8>,
    /// With branch words and [`Needs::indirect_targets`]: log2 of the
    /// entries of the tool's table of indirect-branch targets, indexed by
    /// the branch's address modulo its size and holding each slot's last
    /// target (Cachegrind's BTAC). The producer may then leave out the
    /// branch word of an indirect branch whose target is the one its own
    /// branches last wrote to that slot: the tool's table holds it too, so
    /// the branch is predicted and changes nothing (its execution comes
    /// with the block's runs). As with the lines, the producer forgets its
    /// slots whenever another thread's words may come in between.
    pub indirect_bits: Option<u8>,
}

/// The instructions of `info` that start an instruction fetch of their
/// own in a cache with lines of `1 << line_bits` bytes: the first, and each
/// one that starts in another line than the one before ends in, or
/// straddles two lines. The others lie in the line their block fetched
/// last, which is the most recently used line of its set (only data
/// references, which do not touch the instruction cache, came in between):
/// they hit and change nothing.
pub fn fetch_starts(info: &BlockInfo, line_bits: u8) -> impl Iterator<Item = usize> + '_ {
    let mut last_line = None;
    info.instrs().iter().enumerate().filter_map(move |(n, i)| {
        let first = i.addr >> line_bits;
        let last = (i.addr + u64::from(i.len.max(1)) - 1) >> line_bits;
        let starts = !(first == last && last_line == Some(last));
        last_line = Some(last);
        starts.then_some(n)
    })
}

/// A reference kept by an [`MruFilter`]: one 8-byte word holding what it
/// is in its top 16 bits and an address in the low 48 (user addresses on
/// x86-64 fit). The top bit says an instruction fetch (else a data
/// reference), the next that it straddles two lines, and the other 14 its
/// index plus one: of the memory operand among the block's
/// ([`BlockInfo`] order), or of the fetch in [`fetch_starts`]. The address
/// is the reference's, or the start of its (first) line: the filter's
/// caches, and any with the same line size, see the same lines
/// ([`KeptAccess::reference`]), so a tool can simulate them without the
/// block's metadata and look that up only for a miss.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeptAccess(pub u64);

impl KeptAccess {
    /// Bits of the address.
    const ADDR_BITS: u32 = 48;

    /// The tag bit of a fetch.
    pub const FETCH: u16 = 0x8000;
    /// The tag bit of a reference straddling two lines.
    pub const STRADDLES: u16 = 0x4000;
    /// The tag bits of the index.
    const INDEX: u64 = 0x3fff;

    fn with_tag(tag: u64, addr: u64) -> KeptAccess {
        KeptAccess(tag << Self::ADDR_BITS | addr & ((1 << Self::ADDR_BITS) - 1))
    }

    /// The word for operand `operand` of its block at `addr` (see
    /// [`KeptAccess::straddling`]).
    pub fn new(operand: usize, addr: u64) -> KeptAccess {
        debug_assert!(
            (operand as u64) < Self::INDEX,
            "operands per block fit 14 bits"
        );
        Self::with_tag(operand as u64 + 1, addr)
    }

    /// The word for fetch `fetch` of its block (see [`fetch_starts`]) in
    /// the line at `addr`.
    pub fn fetch(fetch: usize, addr: u64) -> KeptAccess {
        debug_assert!(
            (fetch as u64) < Self::INDEX,
            "fetches per block fit 14 bits"
        );
        Self::with_tag(u64::from(Self::FETCH) | (fetch as u64 + 1), addr)
    }

    /// This reference, marked as straddling two lines.
    pub fn straddling(self) -> KeptAccess {
        KeptAccess(self.0 | u64::from(Self::STRADDLES) << Self::ADDR_BITS)
    }

    /// Whether it is an instruction fetch (else a data reference).
    #[inline(always)]
    pub fn is_fetch(self) -> bool {
        self.0 >> 63 != 0
    }

    /// Whether it straddles two lines.
    #[inline(always)]
    pub fn straddles(self) -> bool {
        self.0 >> 62 & 1 != 0
    }

    /// The reference as a cache with lines of `1 << line_bits` bytes (the
    /// filter's) sees it: an address and a size touching the same lines.
    #[inline(always)]
    pub fn reference(self, line_bits: u8) -> (u64, u32) {
        if self.straddles() {
            // The last byte of the first line and the first of the next.
            (self.addr() | ((1 << line_bits) - 1), 2)
        } else {
            (self.addr(), 1)
        }
    }

    /// Whether `word` of a record is a kept access (block ids and markers
    /// have their top 16 bits clear).
    #[inline(always)]
    pub fn is_kept(word: u64) -> bool {
        word >> Self::ADDR_BITS != 0
    }

    /// Which of the block's memory operands it is, or for a fetch its
    /// place in [`fetch_starts`].
    #[inline(always)]
    pub fn operand(self) -> usize {
        (self.0 >> Self::ADDR_BITS & Self::INDEX) as usize - 1
    }

    /// Its address (or its line's).
    #[inline(always)]
    pub fn addr(self) -> u64 {
        self.0 & ((1 << Self::ADDR_BITS) - 1)
    }
}

/// How many words at the start of `words` are site words
/// ([`SiteWords::is_site_word`]).
#[inline(always)]
pub fn site_run(words: &[u64]) -> usize {
    words
        .iter()
        .position(|&w| !SiteWords::is_site_word(w))
        .unwrap_or(words.len())
}

/// The layout of a *site word*: a reference kept by an [`MruFilter`] in
/// a block whose executions are counted ([`MruFilter::fetch_set_bits`]),
/// named by its *site*, a number the producer gives each reference a block
/// may keep ([`Tool::block_sites`]), so that one word says everything: the
/// line number in the low bits (user addresses on x86-64 lie below 2^47),
/// the site above it, then whether it straddles two lines (bit 62) and
/// whether it is an instruction fetch (bit 63). Sites start at 1, so a site
/// word is above 2^32, where no block id or marker is.
///
/// The outcomes of the branches that end counted blocks go apart, in a
/// stream of 32-bit [`BranchWords`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SiteWords {
    /// Bits of the line number: the site's field starts there.
    line_field: u32,
}

impl SiteWords {
    /// The bit of a fetch.
    pub const FETCH: u64 = 1 << 63;
    /// The bit of a reference straddling two lines.
    pub const STRADDLES: u64 = 1 << 62;

    /// The layout for lines of `1 << line_bits` bytes (16 to 256).
    pub fn new(line_bits: u8) -> SiteWords {
        SiteWords {
            line_field: 47 - u32::from(line_bits.clamp(4, 8)),
        }
    }

    /// How many sites the words can name (sites are below it; 0 is none).
    /// The field's top value is no site's.
    pub fn sites(self) -> u32 {
        self.site_field_mask()
    }

    /// The site field's bits, in place at bit 0 (its top value names no
    /// site).
    fn site_field_mask(self) -> u32 {
        (1 << (62 - self.line_field)) - 1
    }

    /// Where the site's field starts (the number of line-number bits).
    pub fn site_shift(self) -> u32 {
        self.line_field
    }

    /// The word's bits above the line number: site `site`, a fetch or not,
    /// straddling or not.
    pub fn tag(self, site: u32, fetch: bool, straddles: bool) -> u64 {
        debug_assert!(site != 0 && site < self.sites(), "site {site} out of range");
        u64::from(site) << self.line_field
            | if fetch { Self::FETCH } else { 0 }
            | if straddles { Self::STRADDLES } else { 0 }
    }

    /// The word for a reference to line number `line` (its first line, if
    /// it straddles two).
    pub fn word(self, site: u32, fetch: bool, straddles: bool, line: u64) -> u64 {
        self.tag(site, fetch, straddles) | line & ((1 << self.line_field) - 1)
    }

    /// The (first) line number of `word`.
    #[inline(always)]
    pub fn line(self, word: u64) -> u64 {
        word & ((1 << self.line_field) - 1)
    }

    /// The site of `word`.
    #[inline(always)]
    pub fn site(self, word: u64) -> u32 {
        (word >> self.line_field) as u32 & self.site_field_mask()
    }

    /// Whether `word` is an instruction fetch (else a data reference).
    #[inline(always)]
    pub fn is_fetch(word: u64) -> bool {
        word & Self::FETCH != 0
    }

    /// Whether `word`'s reference straddles two lines.
    #[inline(always)]
    pub fn straddles(word: u64) -> bool {
        word & Self::STRADDLES != 0
    }

    /// Whether a word of a buffer is a site word (block ids and markers lie
    /// below 2^32).
    #[inline(always)]
    pub fn is_site_word(word: u64) -> bool {
        word > u64::from(u32::MAX)
    }
}

/// The branch stream's 32-bit words ([`Tool::branch_words`]): the outcome
/// of the conditional or indirect branch that ends an execution of a
/// counted block, written where the branch ran (the predictor is simulated
/// in execution order, like the caches), in a stream apart from the site
/// words. The producer's buffer fills with them from its end down, so a
/// branch's words are written from the highest address down and a slice
/// of the stream holds them last first.
///
/// A branch's word holds its block's id in bits 8 to 31 and, in its low
/// byte, whether a conditional branch was taken ([`BranchWords::TAKEN`],
/// the byte a producer's `setcc` writes) or that the branch is an indirect
/// one ([`BranchWords::INDIRECT`]), whose target follows it as a 64-bit
/// value (two words, the low half last). A block id of 2^24 or more has
/// its high bits in a word of their own before its branch's word
/// ([`BranchWords::HIGH`]). Half the bytes of the 64-bit words they
/// replaced: python-json's 1.3 G conditional branches had written 10 GB.
pub struct BranchWords;

impl BranchWords {
    /// Bit 0: the conditional branch was taken.
    pub const TAKEN: u32 = 1;
    /// Bit 1: an indirect branch; its target follows.
    pub const INDIRECT: u32 = 2;
    /// Bit 2: no branch's word but bits 24 and up of the next one's block
    /// id, in bits 8 to 31.
    pub const HIGH: u32 = 4;
    /// Block ids below this fit a branch's word alone.
    pub const SHORT_IDS: u32 = 1 << 24;

    /// Block `id`'s branch word without its outcome (low byte 0).
    pub fn tag(id: u32) -> u32 {
        (id % Self::SHORT_IDS) << 8
    }

    /// The word before block `id`'s branch word, if its id needs one.
    pub fn high(id: u32) -> Option<u32> {
        (id >= Self::SHORT_IDS).then_some((id >> 24) << 8 | Self::HIGH)
    }

    /// Appends the words of a conditional branch of block `id`, taken or
    /// not, in the order they are written.
    pub fn push_cond(out: &mut Vec<u32>, id: u32, taken: bool) {
        out.extend(Self::high(id));
        out.push(Self::tag(id) | u32::from(taken));
    }

    /// Appends the words of an indirect branch of block `id` to `target`,
    /// in the order they are written.
    pub fn push_indirect(out: &mut Vec<u32>, id: u32, target: u64) {
        out.extend(Self::high(id));
        out.extend([
            Self::tag(id) | Self::INDIRECT,
            (target >> 32) as u32,
            target as u32,
        ]);
    }

    /// Whether `word` holds the high bits of the next word's block id.
    #[inline(always)]
    pub fn is_high(word: u32) -> bool {
        word & Self::HIGH != 0
    }

    /// The block of a branch word, with the high bits `high` of a
    /// [`BranchWords::is_high`] word before it (else 0).
    #[inline(always)]
    pub fn block(word: u32, high: u32) -> u32 {
        (high >> 8) << 24 | word >> 8
    }

    /// Whether a conditional branch's word says taken.
    #[inline(always)]
    pub fn taken(word: u32) -> bool {
        word & Self::TAKEN != 0
    }

    /// Whether a branch word is an indirect branch's (its target follows).
    #[inline(always)]
    pub fn is_indirect(word: u32) -> bool {
        word & Self::INDIRECT != 0
    }

    /// The target of an indirect branch from the two words after its
    /// word, in a slice's order (low half first).
    #[inline(always)]
    pub fn target(low: u32, high: u32) -> u64 {
        u64::from(high) << 32 | u64::from(low)
    }

    /// The branches a slice of the stream tells (last first, as handed
    /// over: [`Tool::branch_words`]), in execution order.
    #[inline(always)]
    pub fn decode(words: &[u32]) -> BranchDecoder<'_> {
        BranchDecoder {
            words,
            next: words.len(),
        }
    }
}

/// A branch as its words tell it ([`BranchWords::decode`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BranchOutcome {
    /// The block the branch ends.
    pub block: u32,
    /// Whether a conditional branch was taken.
    pub taken: bool,
    /// An indirect branch's target.
    pub target: Option<u64>,
}

/// The branches of a slice of the branch stream, in execution order.
#[derive(Debug, Clone)]
pub struct BranchDecoder<'a> {
    words: &'a [u32],
    /// The index past the next word to read (the slice is read from its
    /// end).
    next: usize,
}

impl Iterator for BranchDecoder<'_> {
    type Item = BranchOutcome;

    #[inline(always)]
    fn next(&mut self) -> Option<BranchOutcome> {
        self.next = self.next.checked_sub(1)?;
        let mut w = self.words[self.next];
        let mut high = 0;
        if BranchWords::is_high(w) {
            // (Rare: a block numbered past 2^24.)
            high = w;
            self.next = self.next.checked_sub(1)?;
            w = self.words[self.next];
        }
        let target = BranchWords::is_indirect(w).then(|| {
            // Its target is the two words before it, low half first.
            self.next = self.next.saturating_sub(2);
            let low = self.words[self.next];
            BranchWords::target(low, self.words.get(self.next + 1).copied().unwrap_or(0))
        });
        Some(BranchOutcome {
            block: BranchWords::block(w, high),
            taken: BranchWords::taken(w),
            target,
        })
    }
}

impl Needs {
    /// Nothing beyond instruction counts, which the engine keeps with
    /// inline counters: no stream at all.
    pub const COUNTING: Needs = Needs {
        instr_fetches: false,
        data_refs: false,
        cond_branches: false,
        indirect_targets: false,
        calls_returns: false,
        mru_filter: None,
    };

    /// Whether any records are needed (otherwise counting alone serves).
    pub fn any(self) -> bool {
        self != Needs::COUNTING
    }

    /// What two tools fed from one stream need together.
    pub fn union(self, o: Needs) -> Needs {
        Needs {
            instr_fetches: self.instr_fetches || o.instr_fetches,
            data_refs: self.data_refs || o.data_refs,
            cond_branches: self.cond_branches || o.cond_branches,
            indirect_targets: self.indirect_targets || o.indirect_targets,
            calls_returns: self.calls_returns || o.calls_returns,
            // Only a filter both would apply: one tool's hits are the other's
            // references otherwise.
            mru_filter: match (self.mru_filter, o.mru_filter) {
                (Some(a), Some(b)) if a == b => Some(a),
                _ => None,
            },
        }
    }
}

/// A client request that concerns the tool (Valgrind's `CALLGRIND_*` and
/// `CACHEGRIND_*` macros), as a tool fed by the engine's stream receives it
/// ([`Tool::client_request`]): in the requesting thread's order, after the
/// records of the blocks that ran before it. The engine has already answered
/// the client (these requests return 0); the tool only acts on them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientRequest {
    /// `CALLGRIND_DUMP_STATS`, or `CALLGRIND_DUMP_STATS_AT(reason)` with
    /// the client's string.
    DumpStats {
        /// The reason given with `_AT`.
        reason: Option<String>,
    },
    /// `CALLGRIND_ZERO_STATS`.
    ZeroStats,
    /// `CALLGRIND_TOGGLE_COLLECT`.
    ToggleCollect,
    /// Instrumentation was started (`on`) or stopped by the requests the
    /// run's tool obeys (`CACHEGRIND_START/STOP_INSTRUMENTATION` for
    /// Cachegrind, `CALLGRIND_START/STOP_INSTRUMENTATION` for Callgrind).
    /// Blocks translated while it is off produce no records at all; a tool
    /// keeping state across blocks (a shadow call stack) resets it here.
    /// Delivered only when the state changes.
    Instrumentation {
        /// Whether instrumentation is now on.
        on: bool,
    },
}

/// A consumer of the event stream (a simulator, a cost builder, a trace
/// writer).
///
/// A method added here goes into [`forward_tool!`] too, which wrappers use
/// to hand every method on.
pub trait Tool {
    /// What the producer must deliver; asked before the stream starts.
    fn needs(&self) -> Needs;

    /// The static metadata of block `id`, given once, before any
    /// [`Record::Block`] names it. The default ignores it.
    fn block(&mut self, id: BlockId, info: &BlockInfo) {
        let _ = (id, info);
    }

    /// The next record of the stream. Producers that parse one record at a
    /// time (trace readers) call this, so that a statically known tool is
    /// inlined into the parser and the record's kind is never branched on
    /// twice (worth 10% of a trace replay).
    fn record(&mut self, record: Record);

    /// The next records of the stream, in execution order: what producers
    /// with buffers (the engine's trace buffers) call.
    fn records(&mut self, records: &[Record]) {
        for &r in records {
            self.record(r);
        }
    }

    /// A client request for the tool, at its place in the stream (see
    /// [`ClientRequest`]). The default ignores it.
    fn client_request(&mut self, request: &ClientRequest) {
        let _ = request;
    }

    /// One complete execution of block `id` (described by `info`), as the
    /// engine's trace buffers report it: `addrs` holds the address of each
    /// of the block's memory operands, in the order of
    /// [`BlockInfo::mem_operands`] over its instructions. It means the same
    /// as the records [`expand_block_run`] makes of it (which the default
    /// hands to [`Tool::records`]); a tool overrides it to work per block
    /// rather than per record (Cachegrind's tool charges Ir, Dr and Dw per
    /// block execution and simulates only what can miss).
    fn block_run(&mut self, id: BlockId, info: &BlockInfo, addrs: &[u64]) {
        let mut records = Vec::with_capacity(1 + info.instrs().len() + addrs.len());
        expand_block_run(id, info, addrs, &mut records);
        self.records(&records);
    }

    /// One execution of block `id` whose data references went through the
    /// tool's [`Needs::mru_filter`]: `kept` holds the [`KeptAccess`] words
    /// of those delivered, in execution order (the rest were hits on their
    /// set's most recently used line). More of the same execution's may
    /// follow through [`Tool::kept_accesses`] when a signal handler
    /// interrupted it. The default hands the instruction fetches and the
    /// kept references to [`Tool::records`].
    fn block_run_kept(&mut self, id: BlockId, info: &BlockInfo, kept: &[u64]) {
        let mut records = Vec::with_capacity(1 + info.instrs().len() + kept.len());
        expand_kept_run(id, info, kept, &mut records);
        self.records(&records);
    }

    /// Kept references (see [`MruFilter`]) of an execution of block `id`
    /// that is counted elsewhere: the rest of one reported with
    /// [`Tool::block_run_kept`] that a signal handler interrupted, or any
    /// part of one whose executions are counted
    /// ([`MruFilter::fetch_set_bits`]; see also [`Tool::counted_access`]),
    /// in execution order (each instruction's fetch before its data
    /// references). The default hands them to [`Tool::records`].
    fn kept_accesses(&mut self, id: BlockId, info: &BlockInfo, kept: &[u64]) {
        let _ = id;
        // The line size the fetches were counted in (any, without them).
        let line_bits = self.needs().mru_filter.map_or(6, |f| f.line_bits);
        self.records(&kept_records(info, kept, line_bits));
    }

    /// One kept reference of block `id`, whose executions are counted
    /// ([`MruFilter::fetch_set_bits`]): the engine delivers them one by one,
    /// in execution order, with the word alone (the tool knows the block
    /// from [`Tool::block`]). The default ignores it: only a tool that asks
    /// for that filter receives these, and simulates them here.
    fn counted_access(&mut self, id: BlockId, kept: KeptAccess) {
        let _ = (id, kept);
    }

    /// The references block `id` may keep are named by sites from `first`
    /// on ([`SiteWords`]): its memory operands' in [`BlockInfo`] order, then
    /// its fetches' in [`fetch_starts`] order. Given after [`Tool::block`],
    /// for blocks whose executions are counted. The default ignores it.
    fn block_sites(&mut self, id: BlockId, first: u32) {
        let _ = (id, first);
    }

    /// Kept references of blocks whose executions are counted, as
    /// [`SiteWords`] for the filter's line size, in execution order (each
    /// instruction's fetch before its data references): the site words at
    /// the start of `words`, up to the first that is none
    /// ([`SiteWords::is_site_word`]). Returns how many there were (one
    /// pass over a buffer: it is read once). The default ignores them:
    /// only a tool that asks for that filter receives these.
    fn site_accesses(&mut self, words: &[u64]) -> usize {
        site_run(words)
    }

    /// The branch words ([`BranchWords`]) of the branches that blocks
    /// whose executions are counted end in, when the tool simulates
    /// branches: one thread's since its last, a stream of their own beside
    /// the kept references (the two models share nothing), *last first*:
    /// the producer's buffer fills with them from its end down. The
    /// default ignores them.
    fn branch_words(&mut self, words: &[u32]) {
        let _ = words;
    }

    /// Block `id` ran `runs` more times than its reported executions say:
    /// with fetches filtered ([`MruFilter::fetch_set_bits`]) the producer
    /// counts executions and gives the counts at the end. The default
    /// ignores it (tools that ask for that filter count with it).
    fn block_runs(&mut self, id: BlockId, runs: u64) {
        let _ = (id, runs);
    }

    /// The records and block runs that follow are thread `thread`'s (a
    /// producer-chosen number, reused only after [`Tool::thread_end`]).
    /// Delivered when [`Needs::calls_returns`]; the default ignores it.
    fn thread(&mut self, thread: u64) {
        let _ = thread;
    }

    /// Thread `thread` ended. The default ignores it.
    fn thread_end(&mut self, thread: u64) {
        let _ = thread;
    }

    /// The stack pointer as the last instruction of the block just run (a
    /// call, indirect call, return or indirect jump) began: right after
    /// that block's [`Tool::block_run`] when [`Needs::calls_returns`]. A
    /// call tool unwinds its shadow stack by it (`longjmp`, exceptions), as
    /// Callgrind does. The default ignores it.
    fn stack_pointer(&mut self, sp: u64) {
        let _ = sp;
    }

    /// A signal handler starts (its first block runs next) or returns
    /// (`rt_sigreturn`) on the current thread. Delivered when
    /// [`Needs::calls_returns`]; the default ignores it.
    fn signal(&mut self, event: SignalEvent) {
        let _ = event;
    }
}

/// The methods of a [`Tool`] implementation that hands each one, the
/// defaulted ones included, to the tool in field `$field` of `self`:
/// `impl<T: Tool> Tool for Wrapper<T> { events::forward_tool!(0); }`.
/// Kept beside the trait so that a new method is forwarded where it is
/// added: a wrapper forwarding by hand silently dropped any method it did
/// not list, as a live run's wrapper once dropped the branch words (the
/// profile then had no mispredictions). The per-block and per-record
/// methods are inlined into the engine's decoding loop, which is compiled
/// per tool type.
#[macro_export]
macro_rules! forward_tool {
    ($field:tt) => {
        fn needs(&self) -> $crate::Needs {
            self.$field.needs()
        }
        fn block(&mut self, id: $crate::BlockId, info: &$crate::BlockInfo) {
            self.$field.block(id, info)
        }
        #[inline(always)]
        fn record(&mut self, record: $crate::Record) {
            self.$field.record(record)
        }
        fn records(&mut self, records: &[$crate::Record]) {
            self.$field.records(records)
        }
        fn client_request(&mut self, request: &$crate::ClientRequest) {
            self.$field.client_request(request)
        }
        #[inline(always)]
        fn block_run(&mut self, id: $crate::BlockId, info: &$crate::BlockInfo, addrs: &[u64]) {
            self.$field.block_run(id, info, addrs)
        }
        #[inline(always)]
        fn block_run_kept(&mut self, id: $crate::BlockId, info: &$crate::BlockInfo, kept: &[u64]) {
            self.$field.block_run_kept(id, info, kept)
        }
        #[inline(always)]
        fn kept_accesses(&mut self, id: $crate::BlockId, info: &$crate::BlockInfo, kept: &[u64]) {
            self.$field.kept_accesses(id, info, kept)
        }
        #[inline(always)]
        fn counted_access(&mut self, id: $crate::BlockId, kept: $crate::KeptAccess) {
            self.$field.counted_access(id, kept)
        }
        fn block_sites(&mut self, id: $crate::BlockId, first: u32) {
            self.$field.block_sites(id, first)
        }
        #[inline(always)]
        fn site_accesses(&mut self, words: &[u64]) -> usize {
            self.$field.site_accesses(words)
        }
        fn branch_words(&mut self, words: &[u32]) {
            self.$field.branch_words(words)
        }
        fn block_runs(&mut self, id: $crate::BlockId, runs: u64) {
            self.$field.block_runs(id, runs)
        }
        fn thread(&mut self, thread: u64) {
            self.$field.thread(thread)
        }
        fn thread_end(&mut self, thread: u64) {
            self.$field.thread_end(thread)
        }
        fn stack_pointer(&mut self, sp: u64) {
            self.$field.stack_pointer(sp)
        }
        fn signal(&mut self, event: $crate::SignalEvent) {
            self.$field.signal(event)
        }
    };
}

/// Where a signal handler's execution starts or ends, for [`Tool::signal`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SignalEvent {
    /// A handler was entered: the thread's next block is its first.
    Delivered,
    /// The handler returned through `rt_sigreturn`: the interrupted code
    /// continues.
    Returned,
}

/// The records one execution of a block stands for: [`Record::Block`], then
/// for each instruction its [`Record::Instr`] and a [`Record::Data`] per
/// memory operand, with the addresses from `addrs` (see
/// [`Tool::block_run`]), appended to `out`.
///
/// # Panics
///
/// If `addrs` does not hold one address per memory operand of the block.
pub fn expand_block_run(id: BlockId, info: &BlockInfo, addrs: &[u64], out: &mut Vec<Record>) {
    assert_eq!(
        addrs.len(),
        info.mem.len(),
        "one address per memory operand"
    );
    out.push(Record::Block(id));
    let mut next = addrs.iter();
    for (n, i) in info.instrs().iter().enumerate() {
        out.push(Record::Instr(InstrFetch {
            addr: i.addr,
            len: u32::from(i.len),
        }));
        for m in info.mem_operands(n) {
            out.push(Record::Data(DataRef {
                addr: *next.next().expect("counted above"),
                size: m.size,
                kind: m.kind,
            }));
        }
    }
}

/// The records one filtered execution of a block stands for (see
/// [`Tool::block_run_kept`]): the block, each instruction's fetch and, after
/// it, its kept data references.
pub fn expand_kept_run(id: BlockId, info: &BlockInfo, kept: &[u64], out: &mut Vec<Record>) {
    out.push(Record::Block(id));
    let mut kept = kept.iter().map(|&w| KeptAccess(w)).peekable();
    let mut operands = 0;
    for (n, i) in info.instrs().iter().enumerate() {
        out.push(Record::Instr(InstrFetch {
            addr: i.addr,
            len: u32::from(i.len),
        }));
        operands += info.mem_operands(n).len();
        while let Some(k) = kept.next_if(|k| k.operand() < operands) {
            out.extend(kept_record(info, k));
        }
    }
}

/// The records of kept references `kept` of one execution of a block
/// described by `info`, in execution order: each fetch's (of
/// [`fetch_starts`] with lines of `1 << line_bits` bytes) before the data
/// references of its instruction. Words naming no fetch or operand of the
/// block are left out.
pub fn kept_records(info: &BlockInfo, kept: &[u64], line_bits: u8) -> Vec<Record> {
    // (position, record): a fetch of instruction n goes before operand
    // `mem_start` of n, a data reference after the operands before it.
    let starts: Vec<usize> = fetch_starts(info, line_bits).collect();
    let mut placed: Vec<(usize, bool, Record)> = kept
        .iter()
        .filter_map(|&w| {
            let k = KeptAccess(w);
            if k.is_fetch() {
                let i = info.instrs().get(*starts.get(k.operand())?)?;
                let fetch = Record::Instr(InstrFetch {
                    addr: i.addr,
                    len: u32::from(i.len),
                });
                Some((usize::from(i.mem_start), false, fetch))
            } else {
                let m = info.mem.get(k.operand())?;
                let data = Record::Data(DataRef {
                    addr: k.addr(),
                    size: m.size,
                    kind: m.kind,
                });
                Some((k.operand(), true, data))
            }
        })
        .collect();
    // Stable: each kind keeps its own order.
    placed.sort_by_key(|&(at, data, _)| (at, data));
    placed.into_iter().map(|(_, _, r)| r).collect()
}

/// The data record of kept reference `k` of a block (`None` if the block
/// has no such operand).
fn kept_record(info: &BlockInfo, k: KeptAccess) -> Option<Record> {
    let m = info.mem.get(k.operand())?;
    Some(Record::Data(DataRef {
        addr: k.addr(),
        size: m.size,
        kind: m.kind,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample_block() -> BlockInfo {
        let mut b = BlockInfo::new(0x1000, Terminator::CondJump { target: 0x1000 });
        let load = MemOperand {
            size: 8,
            kind: AccessKind::Read,
        };
        let rmw = MemOperand {
            size: 4,
            kind: AccessKind::Modify,
        };
        b.push(0x1000, 4, &[load]);
        b.push(0x1004, 3, &[]);
        b.push(0x1007, 5, &[rmw, load]);
        b.push(0x100c, 2, &[]);
        b
    }

    #[test]
    fn block_metadata() {
        let b = sample_block();
        assert_eq!(b.start(), 0x1000);
        assert_eq!(b.end(), 0x100e);
        assert_eq!(b.instrs().len(), 4);
        assert_eq!(b.instrs()[2].addr, 0x1007);
        let sizes = |i| -> Vec<u32> { b.mem_operands(i).iter().map(|m| m.size).collect() };
        assert_eq!(sizes(0), [8]);
        assert!(sizes(1).is_empty());
        assert_eq!(sizes(2), [4, 8]);
        assert_eq!(b.mem_operands(2)[0].kind, AccessKind::Modify);
        assert!(sizes(3).is_empty());
        assert_eq!(b.terminator(), Terminator::CondJump { target: 0x1000 });
        let empty = BlockInfo::new(0x2000, Terminator::FallThrough);
        assert_eq!(empty.end(), 0x2000);
    }

    #[test]
    fn a_block_without_its_memory_operands_keeps_the_rest() {
        let b = sample_block();
        let c = b.clone().without_mem_operands();
        assert_eq!(
            (c.start(), c.end(), c.terminator()),
            (b.start(), b.end(), b.terminator())
        );
        let at = |x: &BlockInfo| -> Vec<(u64, u8)> {
            x.instrs().iter().map(|i| (i.addr, i.len)).collect()
        };
        assert_eq!(at(&c), at(&b));
        assert_eq!(c.mem_count(), 0);
        assert!((0..4).all(|i| c.mem_operands(i).is_empty()));
    }

    /// Records stay small: a batch of them is the whole per-event cost.
    #[test]
    fn records_are_small() {
        assert!(std::mem::size_of::<Record>() <= 24);
    }

    #[test]
    fn needs() {
        assert!(!Needs::COUNTING.any());
        assert_eq!(Needs::default(), Needs::COUNTING);
        let cache = Needs {
            instr_fetches: true,
            data_refs: true,
            ..Needs::COUNTING
        };
        let branch = Needs {
            cond_branches: true,
            indirect_targets: true,
            ..Needs::COUNTING
        };
        let both = cache.union(branch);
        assert!(both.any() && both.data_refs && both.indirect_targets);
        assert!(!both.calls_returns);
        // A filter stays only if both tools apply the same one.
        let f = MruFilter {
            line_bits: 6,
            set_bits: 6,
            fetch_set_bits: None,
            indirect_bits: None,
        };
        let filtered = Needs {
            mru_filter: Some(f),
            ..cache
        };
        assert_eq!(filtered.union(filtered).mru_filter, Some(f));
        assert_eq!(filtered.union(cache).mru_filter, None);
    }

    /// A tool that keeps what it is given, as a consumer would.
    #[derive(Default)]
    struct Recorder {
        blocks: Vec<(BlockId, u64)>,
        seen: Vec<Record>,
    }

    impl Tool for Recorder {
        fn needs(&self) -> Needs {
            Needs::COUNTING
        }
        fn block(&mut self, id: BlockId, info: &BlockInfo) {
            self.blocks.push((id, info.start()));
        }
        fn record(&mut self, record: Record) {
            self.seen.push(record);
        }
    }

    #[test]
    fn a_kept_access_word_holds_the_operand_and_the_address() {
        let k = KeptAccess::new(2, 0x7ffd_1234_5678);
        assert!(KeptAccess::is_kept(k.0));
        assert_eq!((k.operand(), k.addr()), (2, 0x7ffd_1234_5678));
        assert!(!k.straddles() && !k.is_fetch());
        assert_eq!(k.reference(6), (0x7ffd_1234_5678, 1));
        let s = KeptAccess::new(2, 0x103c).straddling();
        assert!(s.straddles() && !s.is_fetch());
        assert_eq!(s.operand(), 2);
        // The last byte of 0x1000's line and the first of 0x1040's.
        assert_eq!(s.reference(6), (0x103f, 2));
        let f = KeptAccess::fetch(5, 0x2000).straddling();
        assert!(f.is_fetch() && f.straddles());
        assert_eq!((f.operand(), f.reference(6)), (5, (0x203f, 2)));
        // Block ids and the tracer's markers are never kept accesses.
        assert!(!KeptAccess::is_kept(u64::from(u32::MAX)));
        assert!(!KeptAccess::is_kept(0));
    }

    #[test]
    fn a_site_word_holds_the_site_and_the_line() {
        let l = SiteWords::new(6);
        assert_eq!((l.site_shift(), l.sites()), (41, (1 << 21) - 1));
        // The top line of user space and the top site.
        let line = (1u64 << 41) - 1;
        let w = l.word(l.sites() - 1, true, false, line);
        assert_eq!((l.site(w), l.line(w)), (l.sites() - 1, line));
        assert!(SiteWords::is_fetch(w) && !SiteWords::straddles(w));
        // Line 0 (a null pointer's) and site 1: still above any id.
        let w = l.word(1, false, true, 0);
        assert!(SiteWords::is_site_word(w) && SiteWords::straddles(w));
        assert_eq!((l.site(w), l.line(w)), (1, 0));
        assert!(!SiteWords::is_site_word(u64::from(u32::MAX)));
        // Longer lines leave the sites more bits.
        assert_eq!(SiteWords::new(7).sites(), (1 << 22) - 1);
    }

    #[test]
    fn a_branch_word_holds_its_block_and_outcome() {
        // Read as a consumer does: the slice last first.
        fn read(written: &[u32]) -> Vec<(u32, bool, Option<u64>)> {
            let words: Vec<u32> = written.iter().rev().copied().collect();
            BranchWords::decode(&words)
                .map(|b| (b.block, b.taken, b.target))
                .collect()
        }
        let top = (1 << 30) - 1;
        let mut written = Vec::new();
        let mut expected = Vec::new();
        for (id, taken) in [
            (top, true),
            (7, false),
            (1 << 24, true),
            ((1 << 24) - 1, true),
        ] {
            BranchWords::push_cond(&mut written, id, taken);
            expected.push((id, taken, None));
        }
        for (id, target) in [(5, 0x7fff_ffff_f000), (1 << 25, 0x40_1000)] {
            BranchWords::push_indirect(&mut written, id, target);
            expected.push((id, false, Some(target)));
        }
        assert_eq!(read(&written), expected);
        // Short ids: one word, its low byte free for the outcome.
        assert_eq!(BranchWords::high((1 << 24) - 1), None);
        assert_eq!(BranchWords::tag(5) & 0xff, 0);
    }

    #[test]
    fn a_filtered_run_puts_each_kept_reference_after_its_instruction() {
        let b = sample_block();
        let mut t = Recorder::default();
        // Operands 0 (the first instruction's load) and 2 (the third's
        // second operand) were kept; operand 1 hit its set's top line.
        let kept = [KeptAccess::new(0, 0x40).0, KeptAccess::new(2, 0x80).0];
        t.block_run_kept(BlockId(3), &b, &kept);
        let shape: Vec<String> = t
            .seen
            .iter()
            .map(|r| match r {
                Record::Block(id) => format!("B{}", id.0),
                Record::Instr(f) => format!("I{:x}", f.addr),
                Record::Data(d) => format!("D{:x}/{}", d.addr, d.size),
                other => format!("{other:?}"),
            })
            .collect();
        assert_eq!(
            shape,
            ["B3", "I1000", "D40/8", "I1004", "I1007", "D80/8", "I100c"]
        );
        t.seen.clear();
        t.kept_accesses(BlockId(3), &b, &[KeptAccess::new(1, 0xc0).0]);
        assert!(matches!(
            t.seen[..],
            [Record::Data(DataRef {
                addr: 0xc0,
                size: 4,
                kind: AccessKind::Modify
            })]
        ));
    }

    #[test]
    fn a_block_run_stands_for_its_records() {
        let b = sample_block();
        assert_eq!(b.mem_count(), 3);
        let mut t = Recorder::default();
        t.block_run(BlockId(7), &b, &[0x10, 0x20, 0x30]);
        let data: Vec<_> = t
            .seen
            .iter()
            .filter_map(|r| match r {
                Record::Data(d) => Some((d.addr, d.size, d.kind)),
                _ => None,
            })
            .collect();
        assert_eq!(t.seen[0], Record::Block(BlockId(7)));
        assert_eq!(t.seen.len(), 1 + 4 + 3);
        assert_eq!(
            data,
            [
                (0x10, 8, AccessKind::Read),
                (0x20, 4, AccessKind::Modify),
                (0x30, 8, AccessKind::Read)
            ]
        );
        // Each data record follows its instruction's fetch.
        assert_eq!(
            t.seen[4],
            Record::Instr(InstrFetch {
                addr: 0x1007,
                len: 5
            })
        );
    }

    #[test]
    fn tools_receive_metadata_then_records() {
        let mut t = Recorder::default();
        let tool: &mut dyn Tool = &mut t;
        tool.block(BlockId(0), &sample_block());
        tool.records(&[
            Record::Block(BlockId(0)),
            Record::Instr(InstrFetch {
                addr: 0x1000,
                len: 4,
            }),
            Record::Data(DataRef {
                addr: 0x8000,
                size: 8,
                kind: AccessKind::Read,
            }),
        ]);
        assert_eq!(t.blocks, [(BlockId(0), 0x1000)]);
        assert_eq!(t.seen.len(), 3);
    }

    /// A tool that notes which of its methods were called.
    #[derive(Default)]
    struct Calls(Vec<&'static str>);

    impl Tool for Calls {
        fn needs(&self) -> Needs {
            Needs::COUNTING
        }
        fn block(&mut self, _: BlockId, _: &BlockInfo) {
            self.0.push("block");
        }
        fn record(&mut self, _: Record) {
            self.0.push("record");
        }
        fn records(&mut self, _: &[Record]) {
            self.0.push("records");
        }
        fn client_request(&mut self, _: &ClientRequest) {
            self.0.push("client_request");
        }
        fn block_run(&mut self, _: BlockId, _: &BlockInfo, _: &[u64]) {
            self.0.push("block_run");
        }
        fn block_run_kept(&mut self, _: BlockId, _: &BlockInfo, _: &[u64]) {
            self.0.push("block_run_kept");
        }
        fn kept_accesses(&mut self, _: BlockId, _: &BlockInfo, _: &[u64]) {
            self.0.push("kept_accesses");
        }
        fn counted_access(&mut self, _: BlockId, _: KeptAccess) {
            self.0.push("counted_access");
        }
        fn block_sites(&mut self, _: BlockId, _: u32) {
            self.0.push("block_sites");
        }
        fn site_accesses(&mut self, _: &[u64]) -> usize {
            self.0.push("site_accesses");
            7
        }
        fn branch_words(&mut self, _: &[u32]) {
            self.0.push("branch_words");
        }
        fn block_runs(&mut self, _: BlockId, _: u64) {
            self.0.push("block_runs");
        }
        fn thread(&mut self, _: u64) {
            self.0.push("thread");
        }
        fn thread_end(&mut self, _: u64) {
            self.0.push("thread_end");
        }
        fn stack_pointer(&mut self, _: u64) {
            self.0.push("stack_pointer");
        }
        fn signal(&mut self, _: SignalEvent) {
            self.0.push("signal");
        }
    }

    /// A wrapper as the engine's live runs use one.
    struct Wrapped(Calls);

    impl Tool for Wrapped {
        forward_tool!(0);
    }

    #[test]
    fn forward_tool_hands_every_method_on() {
        let mut w = Wrapped(Calls::default());
        let (id, info) = (BlockId(1), sample_block());
        assert_eq!(w.needs(), Needs::COUNTING);
        w.block(id, &info);
        w.record(Record::Block(id));
        w.records(&[]);
        w.client_request(&ClientRequest::ZeroStats);
        w.block_run(id, &info, &[]);
        w.block_run_kept(id, &info, &[]);
        w.kept_accesses(id, &info, &[]);
        w.counted_access(id, KeptAccess::new(1, 0x1000));
        w.block_sites(id, 0);
        assert_eq!(w.site_accesses(&[]), 7);
        w.branch_words(&[]);
        w.block_runs(id, 1);
        w.thread(1);
        w.thread_end(1);
        w.stack_pointer(0);
        w.signal(SignalEvent::Delivered);
        let calls = w.0 .0;
        assert_eq!(calls.len(), 16, "{calls:?}");
        let mut distinct = calls.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert_eq!(distinct.len(), calls.len(), "{calls:?}");
    }
}
