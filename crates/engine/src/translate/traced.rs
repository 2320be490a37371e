//! Trace mode: the translation of a block that writes a record of each of
//! its executions into the thread's trace buffer (see `emit::trace`), and
//! the block's metadata that the tool decodes those records with.
//!
//! A record is 8-byte words: the block id, then, when data addresses are
//! traced, one word per data access of the block in order (computed just
//! before the instruction that makes it). A rep-prefixed string
//! instruction is a block of its own whose record holds RCX, RSI and RDI
//! before and after it and whether ZF was set after it, from which the
//! tool derives each iteration (Cachegrind's n+1 Ir rule included). No
//! block counters are kept: the records are the counts.

use super::*;
use crate::emit::{FetchCheck, FetchPath, FlagsAt, KeptForm, KeptPath, MruGeometry, Taken};
use crate::memrefs::{data_accesses, AddrExpr};
use events::{BlockInfo, MemOperand, Terminator};

/// What trace mode records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceMode {
    /// Data addresses (cache simulation); without them a record is just
    /// the block id (enough for Ir and branch outcomes).
    pub data: bool,
    /// The stack pointer at calls, returns and indirect jumps (call
    /// graphs): one more word in the records of blocks that end so.
    pub sp: bool,
    /// Without `sp`: D1's geometry, whose most recently used line each
    /// access is checked against in the client; records hold only the
    /// accesses kept (`events::KeptAccess` words after the id; see
    /// `emit::trace`). Without `data` nothing is checked: executions are
    /// counted and only branch words written (branches alone).
    pub filter: Option<MruGeometry>,
    /// With counted executions (`filter` with fetches): the outcome of each
    /// conditional and indirect branch ending a block, as a branch word
    /// (`events::BranchWords`) written where the branch runs.
    pub branches: bool,
}

/// The checks' geometry for a tool's MRU filter, if the thread areas'
/// table holds its sets and the checks can shift by its line size.
pub fn filter_geometry(f: events::MruFilter) -> Option<MruGeometry> {
    let mask = |bits: u8| {
        let sets = 1u64.checked_shl(u32::from(bits))?;
        (sets <= layout::MRU_MAX_SETS).then_some((sets - 1) as u32)
    };
    if !(4..=12).contains(&f.line_bits) {
        return None;
    }
    Some(MruGeometry {
        line_bits: f.line_bits,
        set_mask: mask(f.set_bits)?,
        // An I1 too large for its table: fetches are not filtered.
        i1_set_mask: f.fetch_set_bits.and_then(mask),
        btac_mask: f.indirect_bits.and_then(|bits| {
            let slots = 1u64.checked_shl(u32::from(bits))?;
            (slots <= layout::BTAC_MAX_ENTRIES).then_some((slots - 1) as u32)
        }),
    })
}

/// Most data accesses of one block in filtered trace mode (each has its
/// check inline and its out-of-line paths after the block, up to about
/// 160 bytes in all, and fetches take their share): a block is cut
/// before the access past it, to stay within `layout::MAX_BLOCK_BYTES`.
const MAX_FILTERED_ACCESSES: usize = 32;

/// The metadata of one traced block: what the tool decodes its records
/// with.
#[derive(Debug, Clone)]
pub struct BlockMeta {
    /// The id its records start with.
    pub id: u32,
    /// Its instructions and their memory operands (empty without data
    /// tracing), and how it ends.
    pub info: BlockInfo,
    /// Words per record.
    pub words: u32,
    /// Whether the record's last word is RSP as the block's last
    /// instruction (a call, return or indirect jump) began.
    pub sp: bool,
    /// Whether the record is the id followed by the kept accesses (filtered
    /// trace mode), `words` being 1.
    pub kept: bool,
    /// With counted executions: the thread areas' counter of its
    /// executions (records are written only for executions that keep
    /// something).
    pub counter: Option<u32>,
    /// With counted executions: the first of the sites naming its kept
    /// references (`events::SiteWords`; `None`: they go in pairs with its
    /// id).
    pub sites: Option<u32>,
    /// For a rep string instruction's block: how to expand its record.
    pub rep: Option<RepString>,
}

/// How a rep string instruction's record expands into iterations.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepString {
    /// `Some(true)` for `repe`/`repz` `cmps`/`scas`, `Some(false)` for
    /// `repne`, `None` for the unconditional ones.
    pub cond: Option<bool>,
    /// Bytes each iteration moves RSI/RDI by.
    pub step: u64,
    /// Per memory operand of one iteration: whether it is at RSI (else RDI).
    pub from_rsi: Vec<bool>,
}

/// Record words of a rep string block: id, RCX/RSI/RDI before, RCX/RSI/RDI
/// after, ZF after, the branch stream's position (its limit word).
pub const REP_WORDS: u32 = 9;

/// Where a flush resumes: the site's number is what the check passes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlushSite {
    /// The site's number (`S_TARGET` at the flush stop).
    pub id: u32,
    /// Host address to resume at after the flush.
    pub resume: u64,
    /// The register holding the record's address there, or (filtered
    /// trace mode) the write pointer: the open record is then found by its
    /// id, the last word that is no kept access. (Counted executions have
    /// no open record at their check, on entry: everything before the
    /// write pointer is complete, and it stands for the record's address.)
    pub record_reg: Register,
    /// Whether the records are filtered ones with reported executions.
    pub kept: bool,
}

/// Where a trace-mode block's record is open: from its reservation (or,
/// with counted executions, the end of the entry) up to where the block
/// gives its borrowed registers back, and again in its out-of-line paths
/// after its exits (they jump back into the block). A handler must not run
/// there: its records could fill the buffer and flush it while the
/// interrupted record is half-written, and the interrupted block would go
/// on writing into a buffer handed over already. An asynchronous signal is
/// delivered once the thread has left the span (`Space::record_delivery`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordSpan {
    /// Host address where the record opens.
    pub opens: u64,
    /// Host address where the borrowed registers are back (the block's
    /// exits follow).
    pub closes: u64,
    /// Host address where the out-of-line paths start (the code's end if
    /// there are none).
    pub paths: u64,
}

/// How the outcome of conditional branch `i` (in `code`, at `guest`) is
/// found for its branch word.
fn taken_by<'a>(i: &Instruction, code: &'a [u8], guest: u64) -> Taken<'a> {
    if i.near_branch_target() == i.next_ip() {
        return Taken::Always;
    }
    match i.mnemonic() {
        Mnemonic::Jrcxz | Mnemonic::Jecxz | Mnemonic::Loop | Mnemonic::Loope | Mnemonic::Loopne => {
            let off = (i.ip() - guest) as usize;
            Taken::Guest(&code[off..off + i.len() - 1])
        }
        _ => condition_code(i).map_or(Taken::Always, Taken::Flags),
    }
}

/// The 64-bit GPRs a block may borrow, RAX first (the flag-keeping check
/// uses AH/AL of the address register when it is RAX).
const CANDIDATES: [Register; 15] = [
    Register::RAX,
    Register::R11,
    Register::R10,
    Register::R9,
    Register::R8,
    Register::RDX,
    Register::RCX,
    Register::RSI,
    Register::RDI,
    Register::RBX,
    Register::RBP,
    Register::R12,
    Register::R13,
    Register::R14,
    Register::R15,
];

/// Bit of `r`'s full register in a used-register mask.
fn bit(r: Register) -> u32 {
    1 << r.full_register().number()
}

/// The registers `i` touches, as a mask over the 64-bit GPR numbers.
fn touched(i: &Instruction, info: &mut InstructionInfoFactory) -> u32 {
    let mut m = 0;
    for u in info.info(i).used_registers() {
        let r = u.register();
        if r.is_gpr() {
            m |= bit(r);
        }
    }
    // A rep string instruction's record reads RCX, RSI and RDI.
    if is_rep(i) {
        m |= bit(Register::RCX) | bit(Register::RSI) | bit(Register::RDI);
    }
    m
}

/// Cuts `items` where fewer than two registers would be left to borrow
/// (never before the first), setting `stop` to where decoding goes on, and
/// returns the two borrowed registers: `a` (addresses; RAX if free, unless
/// `keep_rax`: filtered trace mode keeps live flags in AH/AL, around
/// checks that use both) and `r` (the record; never RAX).
fn borrow(
    items: &mut Vec<Item>,
    stop: &mut Stop,
    info: &mut InstructionInfoFactory,
    keep_rax: bool,
) -> Result<(Register, Register), TransError> {
    let free_in = |used: u32| {
        CANDIDATES
            .iter()
            .copied()
            .filter(move |&r| !(keep_rax && r == Register::RAX))
            .filter(move |&r| used & bit(r) == 0)
    };
    let mut used = bit(Register::RSP);
    for n in 0..items.len() {
        let m = match &items[n] {
            Item::Insn(i) => touched(i, info),
            Item::ClientRequest(_) | Item::Illegal(..) => 0,
        };
        if free_in(used | m).nth(1).is_none() && n > 0 {
            *stop = Stop::Continue(items[n].ip());
            items.truncate(n);
            break;
        }
        used |= m;
    }
    let mut free = free_in(used);
    match (free.next(), free.next()) {
        (Some(a), Some(r)) => Ok((a, r)),
        _ => Err(TransError(
            "cannot trace a block that uses every general-purpose register".into(),
        )),
    }
}

/// The data accesses of a block's items, in one vector (a vector per item
/// was most of translation's allocations).
struct BlockAccesses {
    all: Vec<crate::memrefs::Access>,
    /// Per item, where its accesses end in `all`.
    ends: Vec<usize>,
}

impl BlockAccesses {
    /// The accesses of `items` (none unless `data`).
    fn of(items: &[Item], data: bool) -> BlockAccesses {
        let mut all = Vec::new();
        let mut ends = Vec::with_capacity(items.len());
        for it in items {
            if let (Item::Insn(i), true) = (it, data) {
                all.extend_from_slice(data_accesses(i).as_slice());
            }
            ends.push(all.len());
        }
        BlockAccesses { all, ends }
    }

    /// The accesses of item `n`.
    fn at(&self, n: usize) -> &[crate::memrefs::Access] {
        let start = if n == 0 { 0 } else { self.ends[n - 1] };
        &self.all[start..self.ends[n]]
    }

    /// How many there are.
    fn total(&self) -> usize {
        self.all.len()
    }

    /// The first item whose accesses bring the count past `limit`.
    fn first_past(&self, limit: usize) -> Option<usize> {
        self.ends.iter().position(|&end| end > limit)
    }

    /// Only the first `n` items'.
    fn truncate(&mut self, n: usize) {
        self.ends.truncate(n);
        self.all.truncate(self.ends.last().copied().unwrap_or(0));
    }
}

/// Per item, as a bit mask (bit n for item n; blocks have at most
/// `layout::MAX_BLOCK_INSNS` items): whether the status flags are dead
/// just before it (the next instruction to touch them writes them all
/// without reading any, within the block, or past its end when
/// `dead_at_end`). Where they are live, an access check keeps them.
fn flags_dead_before(items: &[Item], dead_at_end: bool) -> u64 {
    let mut dead = 0u64;
    // Backwards: what the code from here on does to the flags first.
    let mut next_dead = dead_at_end;
    for (n, it) in items.iter().enumerate().rev() {
        if let Item::Insn(i) = it {
            if i.rflags_read() & STATUS != 0 {
                next_dead = false;
            } else if i.rflags_modified() & STATUS == STATUS && !may_leave_flags(i) {
                next_dead = true;
            }
            // Otherwise (some written, the rest passed on; or all but
            // perhaps none, by a count of 0) what it leaves unwritten is
            // what came in, which is as dead after it as before: a
            // `sar edi,cl` before a `cmp` leaves them dead.
        } else {
            next_dead = false;
        }
        if next_dead && n < 64 {
            dead |= 1 << n;
        }
    }
    dead
}

/// Per item, as a bit mask like [`flags_dead_before`]'s: whether the
/// item is a guest instruction that may run while a run of checks keeps
/// the status flags in RAX (`Emitter::keep_flags`): one that goes on to
/// the next, neither reads nor writes a status flag, and leaves RAX (all
/// of it, implicit uses included) alone. Counted blocks keep the flags
/// once across such instructions rather than around every check: a
/// function's epilogue pops with live flags (conservatively live at its
/// `ret`) and checked three pops in three keeps.
fn runs_with_flags_kept(items: &[Item], info: &mut InstructionInfoFactory) -> u64 {
    let mut keepable = 0u64;
    for (n, it) in items.iter().enumerate().take(64) {
        if let Item::Insn(i) = it {
            let ok = i.flow_control() == FlowControl::Next
                && !is_rep(i)
                && i.rflags_read() & STATUS == 0
                && i.rflags_modified() & STATUS == 0
                && touched(i, info) & bit(Register::RAX) == 0;
            if ok {
                keepable |= 1 << n;
            }
        }
    }
    keepable
}

/// Most instructions of a successor looked at by [`writes_flags_first`].
const SUCCESSOR_LOOKAHEAD: usize = 16;

/// Whether the guest code at the start of `code` (at `guest`), run from
/// there, writes every status flag before it reads any: straight-line,
/// within [`SUCCESSOR_LOOKAHEAD`] instructions; anything that may leave
/// the flags as they were (`may_leave_flags`) writes none, and leaving the
/// straight line first counts as a read. Then the flags are dead where
/// control enters that code: a block ending in a jump or call there (or
/// cut before it) need not keep them around its last checks.
fn writes_flags_first(code: &[u8], guest: u64) -> bool {
    let mut decoder = Decoder::with_ip(64, code, guest, DecoderOptions::NONE);
    let mut pending = STATUS;
    for _ in 0..SUCCESSOR_LOOKAHEAD {
        if !decoder.can_decode() {
            return false;
        }
        let i = decoder.decode();
        if i.is_invalid() || i.rflags_read() & pending != 0 {
            return false;
        }
        if !may_leave_flags(&i) {
            pending &= !i.rflags_modified();
        }
        if pending == 0 {
            return true;
        }
        if i.flow_control() != FlowControl::Next {
            return false;
        }
    }
    false
}

/// Whether the status flags are dead where the block ends: its direct
/// successor (a jump's or call's target, or where a cut block goes on)
/// writes them all first, by [`writes_flags_first`], in code that cannot
/// change in place (`TransCtx::stable_code`). Returns, indirect branches,
/// conditional ones (which read the flags themselves) and the rest: live.
fn flags_dead_at_end(ctx: &mut dyn TransCtx, terminator: &Terminator, stop: &Stop) -> bool {
    let successor = match (terminator, stop) {
        (Terminator::Jump { target } | Terminator::Call { target }, _) => *target,
        (Terminator::FallThrough, Stop::Continue(next)) => *next,
        _ => return false,
    };
    // (The longest x86 instruction is 15 bytes.)
    let len = SUCCESSOR_LOOKAHEAD as u64 * 15;
    ctx.stable_code(successor, len)
        .is_some_and(|code| writes_flags_first(&code, successor))
}

/// Starts keeping the flags in RAX (`Emitter::keep_flags`) unless
/// `keeping` says they are kept already; the sites from here on say so.
fn start_keep(b: &mut Builder, keeping: &mut bool, r: Register, a: Option<Register>) {
    if !std::mem::replace(keeping, true) {
        b.e.keep_flags();
        b.regs = SiteRegs::BorrowedFlagsKept(r, a);
    }
}

/// Gives the flags and RAX back if `keeping` says they are kept.
fn end_keep(b: &mut Builder, keeping: &mut bool, r: Register, a: Option<Register>) {
    if std::mem::take(keeping) {
        b.e.give_back_flags();
        b.regs = SiteRegs::Borrowed(r, a);
    }
}

/// Whether computing the address `addr` reads RAX (or a part of it).
fn reads_rax(addr: &AddrExpr) -> bool {
    let rax = |r: Register| r != Register::None && r.full_register() == Register::RAX;
    match *addr {
        AddrExpr::Mem { base, index, .. } => rax(base) || rax(index),
        AddrExpr::VsibLane { base, .. } => rax(base),
    }
}

pub(super) fn terminator_of(items: &[Item], stop: &Stop) -> Terminator {
    let last = match (stop, items.last()) {
        (Stop::Terminator, Some(Item::Insn(i))) => i,
        _ => return Terminator::FallThrough,
    };
    match last.flow_control() {
        FlowControl::UnconditionalBranch => Terminator::Jump {
            target: last.near_branch_target(),
        },
        FlowControl::ConditionalBranch => Terminator::CondJump {
            target: last.near_branch_target(),
        },
        FlowControl::Call if last.mnemonic() == Mnemonic::Syscall => Terminator::Syscall,
        FlowControl::Call => Terminator::Call {
            target: last.near_branch_target(),
        },
        FlowControl::IndirectCall => Terminator::IndirectCall,
        FlowControl::IndirectBranch => Terminator::IndirectJump,
        FlowControl::Return => Terminator::Return,
        _ => Terminator::FallThrough,
    }
}

impl Builder<'_> {
    /// Computes the address of `addr` (for `i`) into `a`.
    fn access_addr(
        &mut self,
        a: Register,
        addr: &AddrExpr,
        i: &Instruction,
    ) -> Result<(), TransError> {
        let unsupported = |what: &str| {
            TransError(format!(
                "cannot trace the {what} operand of `{}` at {:#x}",
                describe(i),
                i.ip()
            ))
        };
        match *addr {
            AddrExpr::Mem {
                seg,
                base,
                index,
                scale,
                disp,
            } => {
                let fs = seg == Register::FS;
                if seg == Register::GS {
                    return Err(unsupported("GS-relative"));
                }
                let narrow = |r: Register| r != Register::None && !r.is_gpr64();
                if index == Register::AL {
                    if fs {
                        return Err(unsupported("FS-relative xlat"));
                    }
                    // xlat: [rbx + al].
                    self.e.movzx8(a, Register::AL);
                    self.e.access_addr(a, fs, a, base, 1, disp);
                    return Ok(());
                }
                if fs && (narrow(base) || narrow(index) || i32::try_from(disp).is_err()) {
                    return Err(unsupported("FS-relative 32-bit addressed"));
                }
                // 32-bit addressing wraps at 2^32: the displacement's low
                // half says the same.
                let disp = if narrow(base) || narrow(index) {
                    i64::from(disp as u32 as i32)
                } else {
                    disp
                };
                self.e
                    .access_addr(a, fs, base, index, u32::from(scale), disp);
            }
            AddrExpr::VsibLane {
                seg,
                base,
                index,
                index_bytes,
                lane,
                scale,
                disp,
            } => {
                if seg != Register::None || i32::try_from(disp).is_err() {
                    return Err(unsupported("segment-relative vector-indexed"));
                }
                self.e.vector_lane(a, index, index_bytes, lane);
                self.e
                    .access_addr(a, false, base, a, u32::from(scale), disp);
            }
        }
        Ok(())
    }
}

/// [`translate`] in trace mode.
pub(super) fn translate_traced(
    code: &[u8],
    guest: u64,
    host: u64,
    ctx: &mut dyn TransCtx,
    mode: TraceMode,
) -> Result<Translation, TransError> {
    let (mut items, mut stop) = decode_block(code, guest, ctx.smc_stub().is_some())?;
    rep_alone(&mut items, &mut stop);
    let mut info = InstructionInfoFactory::new();
    let (a_reg, r) = borrow(&mut items, &mut stop, &mut info, mode.filter.is_some())?;
    let mut accesses = BlockAccesses::of(&items, mode.data);
    let rep_block = matches!(items.first(), Some(Item::Insn(i)) if is_rep(i));
    // (Without data, a filter checks nothing: branches alone, counted.)
    let filter = mode.filter.filter(|_| !mode.sp);
    if filter.is_some() && !rep_block {
        // Cut before the instruction whose accesses pass the limit.
        if let Some(n) = accesses.first_past(MAX_FILTERED_ACCESSES) {
            let cut = n.max(1);
            if cut < items.len() {
                stop = Stop::Continue(items[cut].ip());
                items.truncate(cut);
                accesses.truncate(cut);
            }
        }
    }
    let rep = match items.first() {
        Some(Item::Insn(i)) if is_rep(i) => Some(i),
        _ => None,
    };
    let n_access = accesses.total();
    let terminator = terminator_of(&items, &stop);
    // Call tools unwind by the stack pointer where control may leave a
    // frame (or enter one): calls, returns and indirect jumps (longjmp).
    let sp = mode.sp
        && matches!(
            terminator,
            Terminator::Call { .. }
                | Terminator::IndirectCall
                | Terminator::Return
                | Terminator::IndirectJump
        );
    // Counted executions: fetches checked too, no record unless something
    // is kept (then the id, written before the first).
    let counted = filter.filter(|g| rep.is_none() && g.i1_set_mask.is_some());
    // Filtered records: the id, then what the checks keep.
    let kept = filter.filter(|_| rep.is_none() && (n_access > 0 || counted.is_some()));
    let words = match rep {
        Some(_) => REP_WORDS,
        None if kept.is_some() => 1,
        None => 1 + n_access as u32 + u32::from(sp),
    };
    // `a` is needed for addresses only (a rep block stores registers), and
    // for the out-of-line paths of fetches.
    let a = (rep.is_none() && (n_access > 0 || counted.is_some())).then_some(a_reg);
    let id = ctx.alloc_block_id();
    let mut block_info = BlockInfo::new(guest, terminator);
    for (n, item) in items.iter().enumerate() {
        match item {
            Item::ClientRequest(ip) => block_info.push(*ip, 19, &[]),
            Item::Illegal(ip, len) => block_info.push(*ip, *len, &[]),
            Item::Insn(i) => {
                let ops: Vec<MemOperand> = accesses
                    .at(n)
                    .iter()
                    .map(|acc| MemOperand {
                        size: acc.size,
                        kind: acc.kind,
                    })
                    .collect();
                block_info.push(i.ip(), i.len() as u8, &ops);
            }
        }
    }
    if u64::from(id) >= crate::emit::COUNTED_PAIR {
        // The consumer reads words from 2^30 on as the ids of pairs.
        return Err(TransError("more than 2^30 blocks translated".into()));
    }
    let counter = match counted {
        Some(_) => ctx.alloc_counter()?,
        None => 0,
    };
    // The fetches a counted block checks, each before its instruction.
    let fetch_checks: Vec<(usize, FetchCheck)> = match counted {
        Some(g) if mode.data => events::fetch_starts(&block_info, g.line_bits)
            .enumerate()
            .map(|(k, n)| {
                let i = block_info.instrs()[n];
                let line = i.addr >> g.line_bits;
                let check = FetchCheck {
                    fetch: k as u16,
                    line,
                    straddles: (i.addr + u64::from(i.len.max(1)) - 1) >> g.line_bits != line,
                };
                (n, check)
            })
            .collect(),
        _ => Vec::new(),
    };
    // How what the checks keep is written: counted blocks name each
    // reference by a site of its own, one word (by a pair of the block's
    // id and the reference once the sites run out).
    let form = match counted {
        Some(g) => {
            let refs = n_access as u32 + fetch_checks.len() as u32;
            let words = events::SiteWords::new(g.line_bits);
            match ctx.alloc_ref_sites(refs, words.sites()) {
                Some(first) => KeptForm::Sites {
                    words,
                    first,
                    operands: n_access as u32,
                },
                None => KeptForm::Pair(id),
            }
        }
        None => KeptForm::Record,
    };
    // Trace mode counts through the stream (or these counters): no
    // counter of counting mode's.
    let mut b = Builder::start(ctx, host, 0, &items, code, guest);
    // Counted executions tell branch outcomes in branch words, where the
    // branch runs (an indirect one's in the terminator, by its target).
    let branch_words = counted.is_some() && mode.branches;
    if branch_words
        && matches!(
            terminator,
            Terminator::IndirectJump | Terminator::IndirectCall
        )
    {
        b.indirect_word = Some(IndirectWord {
            id,
            btac_mask: filter.and_then(|g| g.btac_mask),
        });
    }
    // A counted block checks the buffer on entry only if it writes more
    // than its kept references (a rep string instruction's record, branch
    // words); the others check at each append, on their out-of-line
    // paths, and so most blocks run no check (see `Emitter::append_via`).
    let writes_branch_words = branch_words
        && matches!(
            terminator,
            Terminator::CondJump { .. } | Terminator::IndirectJump | Terminator::IndirectCall
        );
    let entry_buffer_check = counted.is_none() || rep.is_some() || writes_branch_words;
    if !entry_buffer_check {
        b.e.checked_appends = Some(b.ctx.flush_stub());
    }
    // (A filtered record starts as a plain one of one word: the id; its
    // kept accesses are appended after it.)
    let opens = match counted {
        Some(_) => {
            b.e.counted_enter(r, a_reg);
            b.e.here()
        }
        None => b.e.trace_enter(r, a, id, words),
    };
    b.regs = SiteRegs::Borrowed(r, a);
    let flags_dead = match kept {
        Some(_) => {
            let dead_at_end = flags_dead_at_end(&mut *b.ctx, &terminator, &stop);
            flags_dead_before(&items, dead_at_end)
        }
        None => 0,
    };
    let dead_before = |n: usize| n < 64 && flags_dead >> n & 1 != 0;
    // Counted blocks keep live flags across runs of checks (see
    // `runs_with_flags_kept`): `keeping` says whether RAX holds them now.
    let keepable = match counted {
        Some(_) => runs_with_flags_kept(&items, &mut info),
        None => 0,
    };
    let may_run_kept = |n: usize| n < 64 && keepable >> n & 1 != 0;
    let mut keeping = false;
    let check_at = match counter_position(&items) {
        // Counted executions are counted on entry.
        _ if counted.is_some() => dead_before(0).then_some(0),
        Placement::DeadFlags(n) => Some(n),
        _ => None,
    };
    let mut flush_sites = Vec::new();
    let mut fetch_paths: Vec<FetchPath> = Vec::new();
    // The first instruction's fetch is checked with the count, inside the
    // same keeping of the flags.
    let entry_fetch = fetch_checks
        .first()
        .filter(|&&(n, _)| n == 0)
        .map(|&(_, f)| f);
    // (Counted blocks come with the flags dead or kept already.)
    let mut check = |b: &mut Builder, flags: FlagsAt| -> Option<FetchPath> {
        debug_assert!(counted.is_none() || flags == FlagsAt::Dead);
        let entry_path = counted.and_then(|g| {
            b.e.count_execution(counter);
            let mask = g.i1_set_mask.expect("counted executions check fetches");
            entry_fetch.map(|f| b.e.fetch_check(r, f, mask))
        });
        if !entry_buffer_check {
            return entry_path;
        }
        let site = b.ctx.alloc_flush_site();
        let stub = b.ctx.flush_stub();
        if kept.is_some() {
            // `r` is free between checks: it takes the write pointer.
            b.e.load_gs(r, layout::S_TRACE_PTR);
        }
        let resume = b.e.trace_check(r, site, stub, flags);
        flush_sites.push(FlushSite {
            id: site,
            resume,
            record_reg: r,
            kept: kept.is_some() && counted.is_none(),
        });
        entry_path
    };
    if check_at.is_none() {
        if counted.is_some() {
            // Kept from here on, for as long as the guest lets them.
            start_keep(&mut b, &mut keeping, r, a);
            fetch_paths.extend(check(&mut b, FlagsAt::Dead));
        } else {
            // Flags may be live everywhere: keep them around the check.
            let stash = (a != Some(Register::RAX)).then_some(layout::S_RCX0);
            fetch_paths.extend(check(&mut b, FlagsAt::Live(stash)));
        }
    }
    let mut paths: Vec<KeptPath> = Vec::new();
    let mut word = 1u32;
    let mut end = guest;
    // Whether the borrowed registers are given back already (a client
    // request exits with the client's own registers).
    let mut left = false;
    let mut next_fetch = fetch_checks
        .iter()
        .skip(usize::from(entry_fetch.is_some()))
        .peekable();
    for (n, item) in items.iter().enumerate() {
        if check_at == Some(n) {
            fetch_paths.extend(check(&mut b, FlagsAt::Dead));
        }
        // A fetch's check goes before its instruction (and its data
        // references'), so that what is kept is in execution order.
        if let (Some(g), Some(&(_, fetch))) = (counted, next_fetch.next_if(|&&(at, _)| at == n)) {
            if !dead_before(n) {
                start_keep(&mut b, &mut keeping, r, a);
            }
            let mask = g.i1_set_mask.expect("counted executions check fetches");
            fetch_paths.push(b.e.fetch_check(r, fetch, mask));
        }
        // (An instruction's own checks come first, below.)
        let give_back = |b: &mut Builder, keeping: &mut bool| end_keep(b, keeping, r, a);
        match item {
            Item::ClientRequest(ip) => {
                give_back(&mut b, &mut keeping);
                // The last item of its block: its record is complete here.
                b.t.counted.push(*ip);
                end = ip + 19;
                b.e.trace_leave(r, a);
                b.regs = SiteRegs::Guest;
                left = true;
                b.client_request(end);
            }
            Item::Illegal(ip, len) => {
                give_back(&mut b, &mut keeping);
                // Alone in its block; the signal sees the client's registers.
                b.t.counted.push(*ip);
                end = ip + u64::from(*len);
                b.e.trace_leave(r, a);
                b.regs = SiteRegs::Guest;
                b.illegal(*ip);
            }
            Item::Insn(i) => {
                end = i.next_ip();
                b.t.counted.push(i.ip());
                if rep.is_some() {
                    give_back(&mut b, &mut keeping);
                    for (w, reg) in [(1, Register::RCX), (2, Register::RSI), (3, Register::RDI)] {
                        b.e.trace_store(r, w, reg);
                    }
                    b.copy(i, code, guest)?;
                    for (w, reg) in [(4, Register::RCX), (5, Register::RSI), (6, Register::RDI)] {
                        b.e.trace_store(r, w, reg);
                    }
                    if is_cond_rep(i) {
                        b.e.trace_setz(r, 7);
                    }
                    b.e.trace_store_branch_position(r, 8);
                    if let Some(d1) = filter {
                        // The tool simulates its iterations; the table
                        // must not remember lines from before them.
                        b.e.mru_forget(r, d1);
                        // Nor I1's: the tool's fetches of it leave its
                        // line (each of two, in order) its set's last,
                        // which no check of the client's has seen.
                        if let Some(mask) = d1.i1_set_mask {
                            let first = i.ip() >> d1.line_bits;
                            let last = (i.next_ip() - 1) >> d1.line_bits;
                            for line in first..=last {
                                b.e.i1_mark(r, line, mask);
                            }
                        }
                    }
                    continue;
                }
                if let Some(a) = a {
                    for acc in accesses.at(n) {
                        if reads_rax(&acc.addr) {
                            // The guest's RAX, not the kept flags.
                            give_back(&mut b, &mut keeping);
                        }
                        b.access_addr(a, &acc.addr, i)?;
                        match kept {
                            Some(d1) => {
                                let line = 1u32 << d1.line_bits;
                                // Cachegrind caps an access at a line.
                                let size = acc.size.clamp(1, line);
                                let operand = (word - 1) as u16;
                                let live = !dead_before(n);
                                if live && counted.is_some() {
                                    start_keep(&mut b, &mut keeping, r, Some(a));
                                }
                                let own_keep = live && !keeping;
                                paths.push(b.e.mru_check(a, r, size, operand, d1, own_keep));
                            }
                            None => b.e.trace_store(r, word, a),
                        }
                        word += 1;
                    }
                }
                if !may_run_kept(n) {
                    give_back(&mut b, &mut keeping);
                }
                if i.flow_control() == FlowControl::Next {
                    b.copy(i, code, guest)?;
                } else {
                    if sp {
                        b.e.trace_store(r, words - 1, Register::RSP);
                    }
                    if branch_words && i.flow_control() == FlowControl::ConditionalBranch {
                        b.e.cond_branch_word(r, a_reg, id, taken_by(i, code, guest));
                    }
                    b.e.trace_leave(r, a);
                    b.regs = SiteRegs::Guest;
                    b.terminator(i, code, guest)?;
                }
            }
        }
    }
    if let Stop::Continue(next) = stop {
        end_keep(&mut b, &mut keeping, r, a);
        if !left {
            b.e.trace_leave(r, a);
        }
        b.exit_jmp(next);
    }
    let paths_at = b.e.here();
    if let Some(d1) = kept {
        let straddles = b.e.new_label();
        for p in &paths {
            b.e.kept_paths(a_reg, r, p, d1, form, straddles);
        }
        b.e.fetch_paths(a_reg, r, &fetch_paths, d1, form);
        if paths.iter().any(KeptPath::may_straddle) {
            b.e.straddle_routine(a_reg, r, d1, form, straddles);
        }
    }
    b.seal(end);
    b.t.flush_sites = flush_sites;
    b.t.record = Some(RecordSpan {
        opens,
        closes: b.e.left_borrowed.take().unwrap_or(paths_at),
        paths: paths_at,
    });
    // One iteration's accesses (none without data tracing) say which
    // pointer each operand follows; the element size is the operand size.
    let rep = rep.map(|i| RepString {
        cond: is_cond_rep(i).then(|| i.has_repe_prefix()),
        step: i.memory_size().size() as u64,
        from_rsi: accesses
            .at(0)
            .iter()
            .map(|acc| {
                matches!(acc.addr, AddrExpr::Mem { base, .. } if base.full_register() == Register::RSI)
            })
            .collect(),
    });
    b.t.meta = Some(BlockMeta {
        id,
        info: block_info,
        words,
        sp,
        kept: kept.is_some(),
        counter: counted.map(|_| counter),
        sites: match form {
            KeptForm::Sites { first, .. } => Some(first),
            _ => None,
        },
        rep,
    });
    Ok(b.t)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::translate::tests::Ctx;

    fn traced(code: &[u8]) -> Translation {
        let mut ctx = Ctx {
            next: 7,
            trace: Some(TraceMode {
                data: true,
                sp: false,
                filter: None,
                branches: false,
            }),
            ..Ctx::default()
        };
        translate(code, 0x1000, 0x40_0000, &mut ctx).unwrap()
    }

    #[test]
    fn a_record_holds_the_id_and_one_address_per_access() {
        // mov rax,[rdi] ; mov [rsi+8],rax ; ret
        let t = traced(&[0x48, 0x8b, 0x07, 0x48, 0x89, 0x46, 0x08, 0xc3]);
        let meta = t.meta.as_ref().unwrap();
        assert_eq!(meta.id, 7);
        // id, the load, the store, the return address read by `ret`.
        assert_eq!(meta.words, 4);
        assert_eq!(meta.info.mem_count(), 3);
        assert_eq!(meta.info.terminator(), Terminator::Return);
        assert_eq!(t.flush_sites.len(), 1);
        // The borrowed registers are none of the block's.
        let d = crate::emit::tests::disasm_at(&t.code, t.host);
        let borrowed: Vec<&String> = d.iter().filter(|l| l.starts_with("mov gs:[")).collect();
        for l in &borrowed {
            assert!(
                !l.contains("rdi") && !l.contains("rsi") && !l.contains("rsp"),
                "{d:#?}"
            );
        }
        // The store's address is computed before the store.
        let lea = d
            .iter()
            .position(|l| l.starts_with("lea ") && l.ends_with(",[rsi+8]"))
            .unwrap_or_else(|| panic!("{d:#?}"));
        let store = d.iter().position(|l| l == "mov [rsi+8],rax").unwrap();
        assert!(lea < store, "{d:#?}");
    }

    #[test]
    fn each_guest_instruction_has_a_site_with_its_registers() {
        // mov rax,[rdi] ; mov [rsi+8],rax ; ret
        let t = traced(&[0x48, 0x8b, 0x07, 0x48, 0x89, 0x46, 0x08, 0xc3]);
        let guests: Vec<u64> = t.sites.iter().map(|s| s.guest).collect();
        assert_eq!(guests, [0x1000, 0x1003, 0x1007]);
        let SiteRegs::Borrowed(r, a) = t.sites[0].regs else {
            panic!("{:?}", t.sites)
        };
        assert_eq!(t.sites[1].regs, t.sites[0].regs);
        for reg in [Some(r), a].into_iter().flatten() {
            assert!(![Register::RAX, Register::RDI, Register::RSI].contains(&reg));
        }
        // The return's target load runs with the borrowed registers given
        // back and RCX spilled; each site starts its instruction's code.
        assert_eq!(t.sites[2].regs, SiteRegs::RcxSpilled);
        let at = |n: usize| (t.sites[n].host - t.host) as usize;
        let d = crate::emit::tests::disasm_at(&t.code[at(0)..at(1)], 0);
        assert_eq!(d[0], "mov rax,[rdi]");
        let d = crate::emit::tests::disasm_at(&t.code[at(2)..], 0);
        assert_eq!(d[0], "mov rcx,[rsp]");
        // Counting mode: the guest's registers are its own.
        let mut ctx = Ctx::default();
        let t = translate(&[0x48, 0x8b, 0x07, 0xc3], 0x1000, 0x40_0000, &mut ctx).unwrap();
        assert_eq!(t.sites[0].regs, SiteRegs::Guest);
        assert_eq!(t.sites[1].regs, SiteRegs::RcxSpilled);
    }

    #[test]
    fn call_tools_get_the_stack_pointer_of_calls_returns_and_indirect_jumps() {
        let traced_sp = |code: &[u8]| {
            let mut ctx = Ctx {
                trace: Some(TraceMode {
                    data: false,
                    sp: true,
                    filter: None,
                    branches: false,
                }),
                ..Ctx::default()
            };
            translate(code, 0x1000, 0x40_0000, &mut ctx).unwrap()
        };
        // add rax,1 ; ret: the id, then RSP, stored before the return.
        let t = traced_sp(&[0x48, 0x83, 0xc0, 0x01, 0xc3]);
        let meta = t.meta.as_ref().unwrap();
        assert!(meta.sp);
        assert_eq!(meta.words, 2);
        let d = crate::emit::tests::disasm_at(&t.code, t.host);
        assert!(d.iter().any(|l| l.ends_with("+8],rsp")), "{d:#?}");
        // call rel32, jmp rax: recorded too.
        assert!(traced_sp(&[0xe8, 0, 0, 0, 0]).meta.unwrap().sp);
        assert!(traced_sp(&[0xff, 0xe0]).meta.unwrap().sp);
        // jnz (a branch that leaves no frame): the id alone.
        let meta = traced_sp(&[0x48, 0x85, 0xc0, 0x75, 0xfb]).meta.unwrap();
        assert!(!meta.sp);
        assert_eq!(meta.words, 1);
        // Without call tools, a return's record is the id alone.
        let t = traced(&[0xc3]);
        assert!(!t.meta.as_ref().unwrap().sp);
    }

    /// Filtered trace mode with a 64-set D1 of 64-byte lines, and with
    /// fetches checked too (a 64-set I1) if `counted`.
    fn filtered_mode(code: &[u8], counted: bool) -> Translation {
        filtered_with_sites(code, counted, None)
    }

    /// [`filtered_mode`], with sites for kept references from `ref_sites`.
    fn filtered_with_sites(code: &[u8], counted: bool, ref_sites: Option<u32>) -> Translation {
        filtered_with(code, counted, ref_sites, false)
    }

    /// [`filtered_with_sites`], with branch words if `branches`.
    fn filtered_with(
        code: &[u8],
        counted: bool,
        ref_sites: Option<u32>,
        branches: bool,
    ) -> Translation {
        let mut ctx = filtered_ctx(counted, ref_sites, branches);
        translate(code, 0x1000, 0x40_0000, &mut ctx).unwrap()
    }

    /// The context of [`filtered_with`]'s translations (block id 7).
    fn filtered_ctx(counted: bool, ref_sites: Option<u32>, branches: bool) -> Ctx {
        Ctx {
            ref_sites,
            next: 7,
            trace: Some(TraceMode {
                data: true,
                sp: false,
                filter: Some(MruGeometry {
                    line_bits: 6,
                    set_mask: 63,
                    i1_set_mask: counted.then_some(63),
                    btac_mask: None,
                }),
                branches,
            }),
            ..Ctx::default()
        }
    }

    /// The disassembly of `code` translated as a counted block (id 7)
    /// writing branch words.
    fn with_branch_words(code: &[u8]) -> Vec<String> {
        let t = filtered_with(code, true, Some(1), true);
        crate::emit::tests::disasm_at(&t.code, t.host)
    }

    #[test]
    fn a_block_writing_only_kept_references_checks_the_buffer_at_each_append() {
        // mov rax,[rdi] ; ret: no flush site on entry; the appends (the
        // load's and the return's read's paths, the fetch's, the block's
        // straddle routine) compare the write pointer with the limit and,
        // past it, give the flush stub the load to resume at, with
        // FLUSH_AT set.
        let t = filtered_with(&[0x48, 0x8b, 0x07, 0xc3], true, Some(1), false);
        assert!(t.flush_sites.is_empty(), "{:?}", t.flush_sites);
        let d = crate::emit::tests::disasm_at(&t.code, t.host);
        let limit = format!("gs:[{:X}h]", layout::S_TRACE_LIMIT);
        let checks = d
            .iter()
            .filter(|l| l.starts_with("cmp ") && l.ends_with(&limit))
            .count();
        assert_eq!(checks, 4, "{d:#?}");
        let marks = d
            .iter()
            .filter(|l| l.starts_with("bts ") && l.ends_with(",3Fh"))
            .count();
        assert_eq!(marks, 4, "{d:#?}");
        // With branch words (a conditional branch ends it), the check is on
        // entry again, and the appends do not repeat it.
        let t = filtered_with(&[0x48, 0x8b, 0x07, 0x75, 0x10], true, Some(1), true);
        assert_eq!(t.flush_sites.len(), 1);
        let d = crate::emit::tests::disasm_at(&t.code, t.host);
        let checks = d
            .iter()
            .filter(|l| l.ends_with(&limit) && l.starts_with("cmp "))
            .count();
        assert_eq!(checks, 1, "{d:#?}");
    }

    #[test]
    fn a_shift_by_cl_passes_the_flags_on() {
        // cmp rdi,rsi ; mov rdx,[rdi] ; shl rax,cl ; jne: with CL = 0 the
        // jne reads cmp's flags, so the load's check keeps them.
        let code = [
            0x48, 0x39, 0xf7, 0x48, 0x8b, 0x17, 0x48, 0xd3, 0xe0, 0x75, 0x10,
        ];
        let t = filtered_with(&code, true, Some(1), false);
        let d = crate::emit::tests::disasm_at(&t.code, t.host);
        assert_eq!(d.iter().filter(|l| *l == "lahf").count(), 1, "{d:#?}");
        // shl rax,3 instead: a count the block shows is not 0; dead.
        let code = [
            0x48, 0x39, 0xf7, 0x48, 0x8b, 0x17, 0x48, 0xc1, 0xe0, 0x03, 0x75, 0x10,
        ];
        let t = filtered_with(&code, true, Some(1), false);
        let d = crate::emit::tests::disasm_at(&t.code, t.host);
        assert_eq!(d.iter().filter(|l| *l == "lahf").count(), 0, "{d:#?}");
        // cmp rdi,rsi ; mov rdx,[rdi] ; shl rax,cl ; inc rax ; cmp rax,rdx
        // ; jne: what the shift and the inc leave of cmp's flags, the last
        // cmp writes before the jne reads; dead at the load.
        let code = [
            0x48, 0x39, 0xf7, 0x48, 0x8b, 0x17, 0x48, 0xd3, 0xe0, 0x48, 0xff, 0xc0, 0x48, 0x39,
            0xd0, 0x75, 0x10,
        ];
        let t = filtered_with(&code, true, Some(1), false);
        let d = crate::emit::tests::disasm_at(&t.code, t.host);
        assert_eq!(d.iter().filter(|l| *l == "lahf").count(), 0, "{d:#?}");
    }

    #[test]
    fn an_epilogue_keeps_its_live_flags_once() {
        // pop rbx ; pop rbp ; ret: no flag is written, so they are live
        // all along; one keep covers the entry check and the three
        // accesses' checks, given back before the return.
        let t = filtered_with(&[0x5b, 0x5d, 0xc3], true, Some(1), false);
        let d = crate::emit::tests::disasm_at(&t.code, t.host);
        let keeps = d.iter().filter(|l| *l == "lahf").count();
        let backs = d.iter().filter(|l| *l == "sahf").count();
        assert_eq!((keeps, backs), (1, 1), "{d:#?}");
        // The pops run in between, with their sites saying so.
        let kept = SiteRegs::BorrowedFlagsKept(Register::None, None);
        let in_keep =
            |s: &GuestSite| std::mem::discriminant(&s.regs) == std::mem::discriminant(&kept);
        assert!(t.sites[..2].iter().all(in_keep), "{:?}", t.sites);
        assert!(!in_keep(&t.sites[2]), "{:?}", t.sites);
    }

    #[test]
    fn an_instruction_using_rax_runs_with_the_flags_given_back() {
        // pop rbx ; mov rax,[rdi] ; pop rbp ; ret: the load reads into
        // RAX, so the keep ends before it and starts again after.
        let code = [0x5b, 0x48, 0x8b, 0x07, 0x5d, 0xc3];
        let t = filtered_with(&code, true, Some(1), false);
        let d = crate::emit::tests::disasm_at(&t.code, t.host);
        let load = d.iter().position(|l| l == "mov rax,[rdi]").unwrap();
        let last_back = d[..load].iter().rposition(|l| l == "sahf");
        let last_keep = d[..load].iter().rposition(|l| l == "lahf");
        assert!(last_back > last_keep, "{d:#?}");
    }

    #[test]
    fn a_call_to_code_that_writes_the_flags_first_keeps_none() {
        // 1000: pop rbx ; call 0x2000, whose code is push rbp ; sub rsp,8
        // (or, the second time, adc: it reads CF).
        let code = [0x5b, 0xe8, 0xfa, 0x0f, 0x00, 0x00];
        let keeps = |callee: &[u8]| {
            let mut ctx = Ctx {
                stable: Some((0x2000, callee.to_vec())),
                ..filtered_ctx(true, Some(1), false)
            };
            let t = translate(&code, 0x1000, 0x40_0000, &mut ctx).unwrap();
            let d = crate::emit::tests::disasm_at(&t.code, t.host);
            d.iter().filter(|l| *l == "lahf").count()
        };
        assert_eq!(keeps(&[0x55, 0x48, 0x83, 0xec, 0x08]), 0);
        assert_eq!(keeps(&[0x48, 0x83, 0xd0, 0x01]), 1);
    }

    #[test]
    fn code_that_writes_the_flags_first_makes_them_dead_on_entry() {
        let first = |code: &[u8]| writes_flags_first(code, 0x1000);
        // push rbp ; mov rbp,rsp ; sub rsp,16
        assert!(first(&[0x55, 0x48, 0x89, 0xe5, 0x48, 0x83, 0xec, 0x10]));
        // endbr64 ; xor eax,eax
        assert!(first(&[0xf3, 0x0f, 0x1e, 0xfa, 0x31, 0xc0]));
        // adc rax,1 reads CF
        assert!(!first(&[0x48, 0x83, 0xd0, 0x01]));
        // shl rax,cl may leave them (CL = 0); cmp after it writes them all
        assert!(!first(&[0x48, 0xd3, 0xe0]));
        assert!(first(&[0x48, 0xd3, 0xe0, 0x48, 0x39, 0xd8]));
        // so may shl rax,0 and shl eax,32 (counts masked to 0); shl rax,32
        // writes them
        assert!(!first(&[0x48, 0xc1, 0xe0, 0x00]));
        assert!(!first(&[0xc1, 0xe0, 0x20]));
        assert!(first(&[0x48, 0xc1, 0xe0, 0x20]));
        // inc leaves CF: a jc after it reads the old one
        assert!(!first(&[0x48, 0xff, 0xc0, 0x72, 0x00]));
        // a return first: who knows
        assert!(!first(&[0xc3, 0x31, 0xc0]));
        // truncated code
        assert!(!first(&[0x55]));
    }

    #[test]
    fn a_counted_block_tells_its_branch_in_a_branch_word() {
        // cmp rdi,rsi ; jne +0x10: the tag (block 7) stored as a 32-bit
        // word, its low byte set by `setne`, before the branch reads the
        // same flags.
        let d = with_branch_words(&[0x48, 0x39, 0xf7, 0x75, 0x10]);
        let tag = events::BranchWords::tag(7);
        let store = d
            .iter()
            .position(|l| l.starts_with("mov dword ptr [") && l.ends_with(&format!("{tag:X}h")))
            .expect("the tag's store");
        let set = d.iter().position(|l| l.starts_with("setne [")).unwrap();
        let jne = set + d[set..].iter().position(|l| l.starts_with("jne ")).unwrap();
        assert!(store < set, "{d:#?}");
        let sets_flags = |l: &&String| {
            ["add ", "cmp ", "and ", "sub "]
                .iter()
                .any(|p| l.starts_with(p))
        };
        assert!(!d[set..jne].iter().any(|l| sets_flags(&l)), "{d:#?}");
        // Four bytes of the branch stream.
        assert!(
            d.iter()
                .any(|l| l.starts_with("lea ") && l.ends_with("-4]")),
            "{d:#?}"
        );
        // Without branch simulation, nothing of it.
        let t = filtered_with(&[0x48, 0x39, 0xf7, 0x75, 0x10], true, Some(1), false);
        let d = crate::emit::tests::disasm_at(&t.code, t.host);
        assert!(!d.iter().any(|l| l.starts_with("setne")), "{d:#?}");
    }

    #[test]
    fn a_loop_is_run_on_a_copy_of_rcx_for_its_branch_word() {
        // loop -2: the guest's own `loop` runs once on RCX kept in its
        // slot, choosing between the two words; then the real one.
        let d = with_branch_words(&[0xe2, 0xfe]);
        let loops = d.iter().filter(|l| l.starts_with("loop ")).count();
        assert_eq!(loops, 2, "{d:#?}");
        let tag = events::BranchWords::tag(7);
        for word in [tag, tag | 1] {
            let imm = format!("{word:X}h");
            assert!(d.iter().any(|l| l.ends_with(&imm)), "{imm} {d:#?}");
        }
    }

    #[test]
    fn an_indirect_jump_tells_its_target_after_its_branch_word() {
        // jmp rax: the word (block 7, bit 1), then the target from RCX.
        let d = with_branch_words(&[0xff, 0xe0]);
        let word = events::BranchWords::tag(7) | events::BranchWords::INDIRECT;
        let imm = format!("mov dword ptr [rax+0FFFFCh],{word:X}h");
        assert!(d.contains(&imm), "{imm} {d:#?}");
        // In the branch stream, below the limit plus the slack: the word
        // on top, its target's two halves under it (32-bit stores: no
        // unaligned one, which faults with EFLAGS.AC set).
        for at in ["0FFFF4h", "0FFFF8h"] {
            let store = format!("mov [rax+{at}],ecx");
            assert!(d.contains(&store), "{store} {d:#?}");
        }
        assert!(d.iter().any(|l| l == "lea rax,[rax-0Ch]"), "{d:#?}");
    }

    #[test]
    fn an_indirect_jump_that_hits_the_copy_of_the_target_table_writes_nothing() {
        // jmp rax at 0x1000 (slot 0): RCX less the copy, flag-free, tested
        // by jrcxz; a miss writes the two words and the copy inside the
        // append (which runs again whole when interrupted).
        let mut ctx = filtered_ctx(true, Some(1), true);
        if let Some(t) = &mut ctx.trace {
            t.filter = t.filter.map(|g| MruGeometry {
                btac_mask: Some(511),
                ..g
            });
        }
        let t = translate(&[0xff, 0xe0], 0x1000, 0x40_0000, &mut ctx).unwrap();
        let d = crate::emit::tests::disasm_at(&t.code, t.host);
        let slot = format!("{:X}h", layout::AREA_BTAC);
        let at = |p: &dyn Fn(&String) -> bool| d.iter().position(p).unwrap();
        let load = at(&|l| l.starts_with("mov rax,gs:[") && l.contains(&slot));
        let jrcxz = at(&|l| l.starts_with("jrcxz "));
        let store = at(&|l| l.starts_with("mov gs:[") && l.contains(&slot) && l.ends_with(",rcx"));
        let target = at(&|l| l == "mov [rax+0FFFF4h],ecx");
        assert!(load < jrcxz && jrcxz < target && target < store, "{d:#?}");
        assert!(d[load..jrcxz].iter().any(|l| l == "not rax"), "{d:#?}");
        assert!(
            d[load..jrcxz].iter().any(|l| l == "lea rax,[rax+rcx+1]"),
            "{d:#?}"
        );
        // Without the table, the words are written every time.
        let d = with_branch_words(&[0xff, 0xe0]);
        assert!(!d.iter().any(|l| l.contains(&slot)), "{d:#?}");
    }

    fn filtered(code: &[u8]) -> Translation {
        filtered_mode(code, false)
    }

    #[test]
    fn a_counted_block_keeps_each_reference_in_one_site_word_in_execution_order() {
        // nop x62 ; mov rax,[rdi] ; ret: as below, with sites from 1: the
        // load's 1, the return address's 2, the fetches' 3 and 4.
        let mut code = vec![0x90; 62];
        code.extend([0x48, 0x8b, 0x07, 0xc3]);
        let t = filtered_with_sites(&code, true, Some(1));
        let meta = t.meta.as_ref().unwrap();
        assert_eq!((meta.counter.is_some(), meta.sites), (true, Some(1)));
        let d = crate::emit::tests::disasm_at(&t.code, t.host);
        // No pairs.
        assert!(!d.iter().any(|l| l.ends_with("],40000007h")), "{d:#?}");
        // The straddling mov's fetch is checked (both lines, 40h and 41h)
        // after the nops, before the load's address.
        let at = |p: &dyn Fn(&String) -> bool| d.iter().position(p).unwrap();
        let last_nop = d.iter().rposition(|l| l == "nop").unwrap();
        let second_line = at(&|l: &String| l.starts_with("mov r") && l.ends_with(",41h"));
        let load_addr = at(&|l: &String| l.starts_with("lea r") && l.ends_with(",[rdi]"));
        assert!(last_nop < second_line && second_line < load_addr, "{d:#?}");
        // Its kept word is a constant; the load's tag goes above its line
        // number, and when it straddles, from the routine's slot.
        let layout = events::SiteWords::new(6);
        let fetch = format!("{:X}h", layout.word(4, true, true, 0x40));
        assert!(d.iter().any(|l| l.ends_with(&fetch)), "{fetch} {d:#?}");
        let load = format!(",{:X}h", layout.tag(1, false, false));
        assert!(d.iter().any(|l| l.ends_with(&load)), "{load} {d:#?}");
        let straddling = layout.tag(1, false, true) >> layout.site_shift();
        let straddling = format!(",{straddling:X}h");
        assert!(d.iter().any(|l| l.ends_with(&straddling)), "{d:#?}");
    }

    #[test]
    fn a_counted_block_without_sites_keeps_accesses_with_its_id() {
        // nop x62 ; mov rax,[rdi] ; ret: three instructions from 0x103e,
        // the mov straddling into the line at 0x1040.
        let mut code = vec![0x90; 62];
        code.extend([0x48, 0x8b, 0x07, 0xc3]);
        let t = filtered_mode(&code, true);
        let meta = t.meta.as_ref().unwrap();
        assert!(meta.kept && meta.counter.is_some());
        let d = crate::emit::tests::disasm_at(&t.code, t.host);
        // The execution is counted; nothing is written on entry.
        let count = d
            .iter()
            .position(|l| l.starts_with("add qword ptr gs:["))
            .unwrap();
        assert!(count < d.iter().position(|l| l == "nop").unwrap(), "{d:#?}");
        assert!(!d[..count].iter().any(|l| l.ends_with("],7")), "{d:#?}");
        // Fetch 0 (line 0x40 of the nops) is checked against I1's table,
        // and fetch 1 (the straddling mov) against both its lines'.
        assert!(
            d.iter()
                .any(|l| l.ends_with(",40h") && l.starts_with("mov r")),
            "{d:#?}"
        );
        // Each kept access goes with the block's id (7), after it: in the
        // paths of the two fetches, of the two data accesses (the load,
        // the return address) and in the block's straddle routine.
        // (Marked as the id of a pair: `emit::COUNTED_PAIR`, 2^30.)
        let ids = d
            .iter()
            .filter(|l| l.starts_with("mov qword ptr [") && l.ends_with("],40000007h"));
        assert_eq!(ids.count(), 5, "{d:#?}");
        // Tags: fetch 1 straddling (0xC002), the load (operand 0: 1), and
        // the load when it straddles (its tag from the straddle routine's
        // slot, 0x4001).
        assert!(d.iter().any(|l| l.ends_with("+0Eh],0C002h")), "{d:#?}");
        assert!(d.iter().any(|l| l.ends_with("+0Eh],1")), "{d:#?}");
        assert!(d.iter().any(|l| l.ends_with(",4001h")), "{d:#?}");
    }

    #[test]
    fn a_filtered_block_checks_each_access_against_its_sets_last_line() {
        // mov rax,[rdi] ; mov [rsi+8],rax ; ret
        let t = filtered(&[0x48, 0x8b, 0x07, 0x48, 0x89, 0x46, 0x08, 0xc3]);
        let meta = t.meta.as_ref().unwrap();
        assert!(meta.kept);
        assert_eq!(meta.words, 1, "the id; kept accesses follow it");
        assert_eq!(meta.info.mem_count(), 3);
        let d = crate::emit::tests::disasm_at(&t.code, t.host);
        // One table compare per access in the block (up to the return of
        // its borrowed registers before the `ret`), each followed by its
        // jump out; out of line, two more for each access that straddles
        // (both lines compared).
        let end = d.iter().position(|l| l == "mov r10,gs:[30h]").unwrap();
        let compares: Vec<usize> = d
            .iter()
            .enumerate()
            .filter(|(_, l)| l.starts_with("cmp gs:["))
            .map(|(n, _)| n)
            .collect();
        assert_eq!(compares.len(), 3 + 3 * 2, "{d:#?}");
        assert_eq!(compares.iter().filter(|&&n| n < end).count(), 3, "{d:#?}");
        for &n in &compares {
            // (The next line's compare goes back to the first line first.)
            let jump = if d[n + 1].starts_with("lea ") {
                n + 2
            } else {
                n + 1
            };
            assert!(d[jump].starts_with("jne "), "{d:#?}");
        }
        // The load's check comes before the load, the store's before the
        // store.
        let load = d.iter().position(|l| l == "mov rax,[rdi]").unwrap();
        let store = d.iter().position(|l| l == "mov [rsi+8],rax").unwrap();
        assert!(compares[0] < load && load < compares[1] && compares[1] < store);
        // Out of line, after the block: each kept access's word gets its
        // operand number plus one in its top 16 bits.
        for operand in 1..=3 {
            let tag = format!("+6],{operand}");
            assert!(
                d.iter()
                    .any(|l| l.starts_with("mov word ptr") && l.ends_with(&tag)),
                "{d:#?}"
            );
        }
        // Eight-byte accesses may straddle two lines: both bytes' lines
        // are worked out, the first compared with the table's entry for
        // the last one's set, with no test of its own inline; out of line,
        // a set other than the first line's is a straddle.
        let shifts = d.iter().filter(|l| l.starts_with("shr ")).count();
        assert_eq!(shifts, 6, "{d:#?}");
        let inline_compares = d[..end].iter().filter(|l| l.starts_with("cmp ")).count();
        assert_eq!(
            inline_compares,
            3 + 1,
            "the table's, and the buffer's limit: {d:#?}"
        );
        let straddle_tests = d[end..]
            .iter()
            .filter(|l| l.starts_with("test r10,3Fh"))
            .count();
        assert_eq!(straddle_tests, 3, "{d:#?}");
    }

    #[test]
    fn a_filtered_rep_block_forgets_the_sets_last_lines() {
        // rep movsq: its record as in trace mode, then the table cleared.
        let t = filtered(&[0xf3, 0x48, 0xa5]);
        let meta = t.meta.as_ref().unwrap();
        assert!(!meta.kept);
        assert_eq!(meta.words, REP_WORDS);
        let d = crate::emit::tests::disasm_at(&t.code, t.host);
        let rep = d.iter().position(|l| l.starts_with("rep movsq")).unwrap();
        let clear = d.iter().position(|l| l.starts_with("loop ")).unwrap();
        assert!(rep < clear, "{d:#?}");
    }

    #[test]
    fn a_rep_string_instruction_is_a_block_of_its_own() {
        // add rax,1 ; rep movsq ; ret
        let t = traced(&[0x48, 0x83, 0xc0, 0x01, 0xf3, 0x48, 0xa5, 0xc3]);
        assert_eq!(t.guest_end, 0x1004, "cut before the rep");
        let t = traced(&[0xf3, 0x48, 0xa5, 0xc3]);
        assert_eq!(t.guest_end, 0x1003, "cut after the rep");
        let meta = t.meta.unwrap();
        assert_eq!(meta.words, REP_WORDS);
        let rep = meta.rep.unwrap();
        assert_eq!(rep.step, 8);
        assert_eq!(rep.from_rsi, [true, false]);
        assert_eq!(rep.cond, None);
        // repne scasb: one byte, at RDI.
        let rep = traced(&[0xf2, 0xae]).meta.unwrap().rep.unwrap();
        assert_eq!((rep.step, rep.cond), (1, Some(false)));
        assert_eq!(rep.from_rsi, [false]);
        // repe cmpsb: [rdi], then [rsi] (VEX's order).
        let rep = traced(&[0xf3, 0xa6]).meta.unwrap().rep.unwrap();
        assert_eq!((rep.step, rep.cond), (1, Some(true)));
        assert_eq!(rep.from_rsi, [false, true]);
    }
}
