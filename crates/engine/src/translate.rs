//! Translation of one guest basic block into code-cache code.
//!
//! A block is a straight run of guest instructions ending at the first
//! control transfer, `syscall`, trap, or after [`MAX_BLOCK_INSNS`]. Ordinary
//! instructions are copied byte for byte (re-encoded by iced-x86 when they
//! have a RIP-relative operand). Control transfers become code-cache
//! branches whose rel32 fields the caller links (`Translation::exits`).
//! One counter per block counts its executions; rep-prefixed string
//! instructions get their own counter with Cachegrind's n+1 rule.
//!
//! Valgrind's client-request sequence (one 19-byte instruction, as VEX
//! decodes it) ends its block, as under Valgrind: its translation exits to
//! the tool, which answers the request in RDX, and the block continues
//! after it. While instrumentation is off (`CACHEGRIND_STOP_INSTRUMENTATION`,
//! `--instr-at-start=no`) blocks are translated without counters or
//! records, as Cachegrind then translates them uninstrumented.
//!
//! An instruction the processor cannot run (`ud2`, bytes that decode to
//! nothing, an instruction whose CPUID feature this processor lacks, such
//! as `xbegin` without TSX) is a block of its own that executes `ud2`: the
//! SIGILL it raises is given the guest address when it is delivered (see
//! `Translation::sigills`), so the client sees what it sees natively. On a
//! processor with TSX, `xbegin` takes its abort path (always a legal
//! outcome: the engine cannot run a transaction).

mod contexts;
mod smc;
mod traced;

pub use contexts::{header_word, ContextBlock};

#[cfg(test)]
pub(crate) use traced::RepString;
pub use traced::{filter_geometry, BlockMeta, FlushSite, RecordSpan, TraceMode, REP_WORDS};

use crate::emit::{Emitter, TaggedStubs, GPR64};
use crate::layout::{self, MAX_BLOCK_INSNS};
use iced_x86::{
    Code, Decoder, DecoderError, DecoderOptions, FlowControl, Instruction, InstructionInfoFactory,
    Mnemonic, OpAccess, OpKind, Register, RflagsBits,
};

/// The 16-byte preamble of Valgrind's client-request magic sequence.
const MAGIC_PREAMBLE: [u8; 16] = [
    0x48, 0xc1, 0xc7, 0x03, 0x48, 0xc1, 0xc7, 0x0d, 0x48, 0xc1, 0xc7, 0x3d, 0x48, 0xc1, 0xc7, 0x33,
];
/// `xchg rbx, rbx`: the "do client request" suffix.
const MAGIC_REQUEST: [u8; 3] = [0x48, 0x87, 0xdb];

/// Everything the translator needs from its caller.
pub trait TransCtx {
    /// A fresh 8-byte counter: its offset in every thread's area (GS);
    /// an error once the areas have no room left for another.
    fn alloc_counter(&mut self) -> Result<u32, TransError>;
    /// Host address of the probe stub near the block, where an inline
    /// indirect-branch lookup goes when way 0 of the home bucket misses.
    fn probe_stub(&self) -> u64;
    /// Whether inline lookup hits are counted (`--stats=yes`).
    fn count_lookups(&self) -> bool {
        false
    }
    /// Places an 8-byte literal (a return address pushed by call emulation)
    /// within rel32 reach of the block; returns its address.
    fn literal(&mut self, value: u64) -> u64;
    /// Absolute (below 2 GiB) address of the core region.
    fn core(&self) -> u64;
    /// Trace mode, if blocks write records (then no counters are used).
    fn trace(&self) -> Option<TraceMode> {
        None
    }
    /// The id of a new traced block.
    fn alloc_block_id(&mut self) -> u32 {
        0
    }
    /// The number of a new flush site.
    fn alloc_flush_site(&mut self) -> u32 {
        0
    }
    /// The first of `n` new sites naming a counted block's kept
    /// references (`events::SiteWords`), if they stay below `limit`.
    fn alloc_ref_sites(&mut self, n: u32, limit: u32) -> Option<u32> {
        let _ = (n, limit);
        None
    }
    /// Host address of the flush stub near the block.
    fn flush_stub(&self) -> u64 {
        0
    }
    /// Whether blocks are instrumented (counted or traced); when not, they
    /// are plain copies that count nothing.
    fn instrumented(&self) -> bool {
        true
    }

    /// Where the block's self-modifying-code check exits to when its guest
    /// code changed (the chunk's SMC stub), if the block gets a check
    /// (`--smc-check`; see `translate::smc`).
    fn smc_stub(&self) -> Option<u64> {
        None
    }

    /// Tagged counting: the chunk's shared inline-transition code
    /// (`None`: none inline, every transition through the runtime).
    fn tagged_stubs(&self) -> Option<crate::emit::TaggedStubs> {
        None
    }

    /// Contexts mode: the id and number in its function of the block about
    /// to be translated at `guest` (`None`: not contexts mode).
    fn contexts(&mut self, guest: u64) -> Result<Option<ContextBlock>, TransError> {
        let _ = guest;
        Ok(None)
    }

    /// Contexts mode: the block being translated may leave its context
    /// other than by a return (a call, a jump out of its counter group),
    /// so its call memo's words (`ctxrt::CALL_MEMO_WORDS`) follow its
    /// counter: its counter group's next numbers are theirs.
    fn reserve_call_memo(&mut self) {}

    /// Contexts mode: whether a jump or fall-through from the block being
    /// translated to `target` keeps the calling context (same function,
    /// object and section kind, not the function's start).
    fn same_context(&mut self, target: u64) -> bool {
        let _ = target;
        false
    }

    /// Tagged counting: the function of the code at `target` (a direct
    /// call's) and whether it is skipped (`None`: not known).
    fn tagged_callee(&mut self, target: u64) -> Option<(u32, bool)> {
        let _ = target;
        None
    }

    /// Up to `len` bytes of the guest code at `guest`, if it is there to
    /// read and cannot change in place (a read-only file mapping): a
    /// translation may look at a successor's first instructions, and rely
    /// on them, without translating it.
    fn stable_code(&mut self, guest: u64, len: u64) -> Option<Vec<u8>> {
        let _ = (guest, len);
        None
    }
}

/// A syscall the translated code may hand to the tool (an intercepted
/// number): the stop is identified by the host address after its magic
/// syscall.
#[derive(Debug, Clone, Copy)]
pub struct SyscallSite {
    /// Host RIP at the tool's stop (after the magic syscall instruction).
    pub stop_rip: u64,
    /// Guest address just after the guest `syscall`.
    pub guest_next: u64,
}

/// Where the guest's general-purpose registers are while the host code
/// standing for one guest instruction runs (see [`GuestSite`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SiteRegs {
    /// Each in its own register.
    Guest,
    /// RCX holds an indirect branch's target; the guest's RCX is in its
    /// spill slot (`layout::S_RCX`).
    RcxSpilled,
    /// Trace mode: the block's borrowed registers (the record's address,
    /// and the one for data addresses) hold the tool's values; the guest's
    /// are in `layout::S_BORROW_R` and `layout::S_BORROW_A`.
    Borrowed(Register, Option<Register>),
    /// As `Borrowed`, inside a run of checks that keeps the guest's status
    /// flags in AH (`lahf`) and AL (OF, `seto`) and its RAX in
    /// `layout::S_KEEP_RAX` across guest instructions that touch neither
    /// (`emit::Emitter::keep_flags`).
    BorrowedFlagsKept(Register, Option<Register>),
}

impl SiteRegs {
    /// The registers the block borrowed (the record's, the addresses'),
    /// if they hold the tool's values here.
    pub fn borrowed(self) -> Option<(Register, Option<Register>)> {
        match self {
            SiteRegs::Borrowed(r, a) | SiteRegs::BorrowedFlagsKept(r, a) => Some((r, a)),
            SiteRegs::Guest | SiteRegs::RcxSpilled => None,
        }
    }
}

/// The start of the host code that stands for one guest instruction: the
/// host instructions from here to the next site are the ones that may
/// fault on its behalf (the instruction itself, copied or re-encoded, or
/// for a control transfer the target load and the return-address push).
/// A fault there is the guest instruction's fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GuestSite {
    /// Host address of the first host instruction.
    pub host: u64,
    /// Guest address of the instruction.
    pub guest: u64,
    /// Where the guest's registers are meanwhile.
    pub regs: SiteRegs,
}

/// What a thread stopped at a [`CleanPoint`] needs besides its RIP to be in
/// the guest's exact state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PointKind {
    /// Nothing: the guest's registers are all in place.
    Clean,
    /// The load of a counter update through RAX, spilled: the guest's RAX
    /// is in its spill slot (`layout::S_RAX`); RAX itself holds it only if
    /// the load has not run (a thread inside the update is rewound here).
    RaxSpilled,
    /// Right after a guest `syscall` (run natively in the gate, or by the
    /// tool): RCX is the guest address after it, R11 the flags, as the
    /// processor leaves them (the gate's own `syscall` left host values).
    AfterSyscall,
    /// At a rep string instruction whose counting has begun (the guest
    /// instruction itself, possibly part-way): its own counter has the
    /// count of a whole execution (plain `rep`, added before it) or its
    /// starting RCX is kept for the count after it (`repe`/`repne`,
    /// `cond`).
    Rep {
        /// `repe`/`repne`.
        cond: bool,
    },
}

/// A host address in a translation where the guest's state is exactly the
/// one before guest instruction `guest` runs (what an asynchronous signal
/// is delivered with): between guest instructions, outside any
/// instrumentation sequence. Points are recorded in host order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CleanPoint {
    /// The host address.
    pub host: u64,
    /// The guest instruction to run next (possibly the block's end).
    pub guest: u64,
    /// What else the guest's state needs.
    pub kind: PointKind,
}

/// The code and metadata of one translated block.
#[derive(Debug, Clone, Default)]
pub struct Translation {
    /// Guest address just past the last instruction.
    pub guest_end: u64,
    /// Host address the code is emitted for.
    pub host: u64,
    /// Host address of the body (the same as `host`: blocks start with
    /// their first guest instruction, so a predecessor may fall into them).
    pub body: u64,
    /// The code ends with `jmp rel32` to this guest address (the block's
    /// fall-through), which the caller may drop with
    /// [`Translation::drop_tail`] by placing that block next.
    pub tail: Option<u64>,
    /// Offset in `code` of that jump.
    tail_at: usize,
    /// The emitted bytes.
    pub code: Vec<u8>,
    /// rel32 fields to link: (host address of the field, guest target).
    pub exits: Vec<(u64, u64)>,
    /// The block's execution counter (offset in the thread areas; 0 for
    /// none: trace mode, or instrumentation off).
    pub counter: u32,
    /// Guest addresses counted once per block execution.
    pub counted: Vec<u64>,
    /// Rep-prefixed string instructions: (guest address, their own counter).
    pub reps: Vec<(u64, u32)>,
    /// Syscall sites that may stop in the tool.
    pub syscalls: Vec<SyscallSite>,
    /// Client-request sites, which always stop in the tool (`guest_next`
    /// is the address after the magic sequence).
    pub requests: Vec<SyscallSite>,
    /// `ud2`s standing for guest instructions that raise SIGILL: (host
    /// address of the `ud2`, guest address of the instruction).
    pub sigills: Vec<(u64, u64)>,
    /// Guest return addresses pushed by calls of this block.
    pub call_returns: Vec<u64>,
    /// The host code of each guest instruction that may fault, in order
    /// (what a synchronous signal's context is mapped back with).
    pub sites: Vec<GuestSite>,
    /// Counting mode: the clean points, in host order (what an
    /// asynchronous signal's context is mapped back with).
    pub points: Vec<CleanPoint>,
    /// Direct successors reached by falling through or jumping (for eager
    /// translation).
    pub successors: Vec<u64>,
    /// Targets of conditional branches (for eager translation where it is
    /// cheap: see `Space::translate_at`).
    pub branch_targets: Vec<u64>,
    /// Host ranges of the counter updates that take several instructions
    /// (see [`Emitter::counter_updates`]).
    pub counter_updates: Vec<(u64, u64)>,
    /// The host address just past the block counter's update (none when
    /// the block has no counter).
    pub counter_end: Option<u64>,
    /// Trace mode: the block's metadata.
    pub meta: Option<BlockMeta>,
    /// Trace mode: where its buffer checks resume after a flush.
    pub flush_sites: Vec<FlushSite>,
    /// Trace mode: where the block's record is open (see [`RecordSpan`]).
    pub record: Option<RecordSpan>,
    /// Contexts mode: the rel32 fields of exits whose transfer keeps the
    /// context, linked past their target's context entry.
    pub plain_exits: Vec<u64>,
    /// Tagged counting: host ranges of inline calls and returns, which a
    /// signal waits to leave (`Space::quiet`).
    pub quiet: Vec<std::ops::Range<u64>>,
    /// Contexts mode: the block as the tool sees it (no origin yet).
    pub info: Option<events::BlockInfo>,
}

impl Translation {
    /// Drops the final jump to [`Translation::tail`] (and its exit): the
    /// caller places the tail block right after this one.
    pub fn drop_tail(&mut self) {
        assert!(self.tail.take().is_some(), "a tail jump to drop");
        self.code.truncate(self.tail_at);
        self.exits.pop();
    }
}

/// Why a block could not be translated: the message names the instruction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransError(pub String);

/// Status flags whose liveness matters for the counter update.
const STATUS: u32 = RflagsBits::OF
    | RflagsBits::SF
    | RflagsBits::ZF
    | RflagsBits::AF
    | RflagsBits::CF
    | RflagsBits::PF;

enum Item {
    Insn(Instruction),
    ClientRequest(u64),
    /// An instruction that raises SIGILL here (address, length: 1 when it
    /// does not decode, as Cachegrind then counts it).
    Illegal(u64, u8),
}

impl Item {
    /// Guest address of the item.
    fn ip(&self) -> u64 {
        match self {
            Item::Insn(i) => i.ip(),
            Item::ClientRequest(ip) | Item::Illegal(ip, _) => *ip,
        }
    }
}

/// Whether `i` raises SIGILL on this processor: the undefined-opcode
/// instructions, and those needing a CPUID feature it lacks.
fn raises_sigill(i: &Instruction) -> bool {
    matches!(i.mnemonic(), Mnemonic::Ud0 | Mnemonic::Ud1 | Mnemonic::Ud2)
        || crate::cpu::lacks_feature(i)
}

fn is_magic(code: &[u8]) -> bool {
    code.len() >= 19 && code[..16] == MAGIC_PREAMBLE && code[16..19] == MAGIC_REQUEST
}

/// Why decoding stopped before a control transfer.
enum Stop {
    /// The block ends with this control-flow instruction (last item).
    Terminator,
    /// Decoding must resume at this address in a new block.
    Continue(u64),
}

fn unsupported(i: &Instruction) -> Option<&'static str> {
    let gs = i.segment_prefix() == Register::GS
        || (0..i.op_count()).any(|n| i.op_register(n) == Register::GS);
    if gs {
        return Some("GS segment use");
    }
    match i.mnemonic() {
        Mnemonic::Wrgsbase | Mnemonic::Rdgsbase | Mnemonic::Swapgs => Some("GS base access"),
        Mnemonic::Sysenter | Mnemonic::Sysexit | Mnemonic::Sysret => Some("instruction"),
        Mnemonic::Iret | Mnemonic::Iretd | Mnemonic::Iretq => Some("instruction"),
        Mnemonic::Retf => Some("far return"),
        _ => match i.flow_control() {
            FlowControl::UnconditionalBranch | FlowControl::Call
                if i.op0_kind() == OpKind::FarBranch16 || i.op0_kind() == OpKind::FarBranch32 =>
            {
                Some("far branch")
            }
            FlowControl::IndirectBranch | FlowControl::IndirectCall
                if i.op0_kind() == OpKind::Memory && i.memory_size().size() != 8 =>
            {
                Some("far or 16-bit indirect branch")
            }
            _ => None,
        },
    }
}

/// Formats an instruction for an error message.
pub fn describe(i: &Instruction) -> String {
    use iced_x86::{Formatter, IntelFormatter};
    let mut s = String::new();
    IntelFormatter::new().format(i, &mut s);
    s
}

/// Decodes the guest block at `guest` from `code` (bytes starting at
/// `guest`). Fails only when the very first instruction cannot be
/// translated; later problems end the block early so that the error is
/// raised only if execution really gets there. An instruction that raises
/// SIGILL is a block of its own, likewise. A checked block (`checked`) also
/// ends after each instruction that writes memory (see `translate::smc`).
fn decode_block(code: &[u8], guest: u64, checked: bool) -> Result<(Vec<Item>, Stop), TransError> {
    let mut stores = checked.then(smc::Stores::new);
    let mut items = Vec::with_capacity(16);
    let mut dec = Decoder::with_ip(64, code, guest, DecoderOptions::NONE);
    loop {
        let pos = dec.position();
        let ip = guest + pos as u64;
        if items.len() >= MAX_BLOCK_INSNS {
            return Ok((items, Stop::Continue(ip)));
        }
        if is_magic(&code[pos..]) {
            // A client request ends its block (VEX ends the superblock
            // there with a jump of kind ClientReq).
            items.push(Item::ClientRequest(ip));
            return Ok((items, Stop::Continue(ip + 19)));
        }
        if !dec.can_decode() {
            if items.is_empty() {
                return Err(TransError(format!("cannot read code at {ip:#x}")));
            }
            return Ok((items, Stop::Continue(ip)));
        }
        let i = dec.decode();
        if i.is_invalid() {
            if dec.last_error() == DecoderError::NoMoreBytes && !items.is_empty() {
                return Ok((items, Stop::Continue(ip)));
            }
            if items.is_empty() {
                // Natively an undefined opcode: SIGILL.
                items.push(Item::Illegal(ip, 1));
                return Ok((items, Stop::Terminator));
            }
            return Ok((items, Stop::Continue(ip)));
        }
        if raises_sigill(&i) {
            if items.is_empty() {
                items.push(Item::Illegal(ip, i.len() as u8));
                return Ok((items, Stop::Terminator));
            }
            return Ok((items, Stop::Continue(ip)));
        }
        if let Some(what) = unsupported(&i) {
            if items.is_empty() {
                return Err(TransError(format!(
                    "cannot translate {what} `{}` at {ip:#x}",
                    describe(&i)
                )));
            }
            return Ok((items, Stop::Continue(ip)));
        }
        if is_rep(&i)
            && (0..i.op_count()).any(|n| {
                matches!(
                    i.op_kind(n),
                    OpKind::MemorySegESI | OpKind::MemorySegEDI | OpKind::MemoryESEDI
                )
            })
        {
            if items.is_empty() {
                return Err(TransError(format!(
                    "cannot translate 32-bit addressed `{}` at {ip:#x}",
                    describe(&i)
                )));
            }
            return Ok((items, Stop::Continue(ip)));
        }
        let ends = i.flow_control() != FlowControl::Next;
        let stores = stores.as_mut().is_some_and(|s| s.writes(&i));
        items.push(Item::Insn(i));
        if ends {
            return Ok((items, Stop::Terminator));
        }
        if stores {
            return Ok((items, Stop::Continue(i.next_ip())));
        }
    }
}

/// Cuts `items` so that a rep string instruction is a block of its own
/// (trace and contexts modes count its iterations from the block): before
/// it, or right after it when it comes first; `stop` says where decoding
/// goes on.
fn rep_alone(items: &mut Vec<Item>, stop: &mut Stop) {
    if let Some(n) = items
        .iter()
        .position(|it| matches!(it, Item::Insn(i) if is_rep(i)))
    {
        let cut = n.max(1);
        if cut < items.len() {
            *stop = Stop::Continue(items[cut].ip());
            items.truncate(cut);
        }
    }
}

fn is_cond_rep(i: &Instruction) -> bool {
    matches!(
        i.mnemonic(),
        Mnemonic::Cmpsb
            | Mnemonic::Cmpsw
            | Mnemonic::Cmpsd
            | Mnemonic::Cmpsq
            | Mnemonic::Scasb
            | Mnemonic::Scasw
            | Mnemonic::Scasd
            | Mnemonic::Scasq
    )
}

/// Whether the instruction at the start of `code` (at guest `ip`) is a
/// `repe`/`repne` string instruction (counted after it runs), rather than
/// a plain `rep` one (counted before).
pub fn is_cond_rep_at(code: &[u8], ip: u64) -> bool {
    let i = Decoder::with_ip(64, code, ip, DecoderOptions::NONE).decode();
    is_rep(&i) && is_cond_rep(&i)
}

fn is_rep(i: &Instruction) -> bool {
    i.is_string_instruction() && (i.has_rep_prefix() || i.has_repne_prefix())
}

/// Where the block counter update goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Placement {
    /// Before item `n`, which writes every status flag without reading any:
    /// flags are dead there, a plain `add` will do.
    DeadFlags(usize),
    /// Before item `n`, which overwrites this register without reading it:
    /// the update goes through the register (`mov`/`lea`/`mov`, flag-free).
    DeadRegister(usize, Register),
    /// At the start, spilling RAX.
    Spill,
    /// Nowhere: the block is not instrumented.
    Nowhere,
}

/// A 64-bit GPR that `i` overwrites as a whole without reading it, if any.
fn dead_register(i: &Instruction, info: &mut InstructionInfoFactory) -> Option<Register> {
    if keeps_its_destination(i) {
        return None;
    }
    let used = info.info(i).used_registers();
    let full = |r: Register| r.full_register();
    used.iter().find_map(|u| {
        let r = u.register();
        let whole = r.is_gpr64() || r.is_gpr32();
        if !whole || u.access() != OpAccess::Write || full(r) == Register::RSP {
            return None;
        }
        let read = used
            .iter()
            .any(|o| full(o.register()) == full(r) && o.access() != OpAccess::Write);
        if read {
            return None;
        }
        Some(GPR64[full(r).number()])
    })
}

/// Whether `i`, which iced-x86 says overwrites its destination, may leave
/// it as it was: `rdssp` is a no-op without shadow stacks, and code tests
/// the register it zeroed before (libgcc's unwinder: a count through RAX
/// there sent C++ exceptions down the shadow-stack path).
fn keeps_its_destination(i: &Instruction) -> bool {
    matches!(i.mnemonic(), Mnemonic::Rdsspd | Mnemonic::Rdsspq)
}

/// A 64-bit GPR dead before item `n` of a block: scanning on from there,
/// overwritten as a whole (its 64 or 32 bits) before anything reads it,
/// within the block's plain instructions (what follows the block may read
/// anything). Not RSP.
fn dead_register_from(
    items: &[Item],
    n: usize,
    info: &mut InstructionInfoFactory,
) -> Option<Register> {
    let mut read = [false; 16];
    for it in &items[n..] {
        // A system call reads registers iced-x86 does not list.
        let Item::Insn(i) = it else {
            return None;
        };
        if i.mnemonic() == Mnemonic::Syscall {
            return None;
        }
        if keeps_its_destination(i) {
            // Its destination counts as read: it may keep its value.
            for u in info.info(i).used_registers() {
                if u.register().is_gpr() {
                    read[u.register().full_register().number()] = true;
                }
            }
            continue;
        }
        let used = info.info(i).used_registers();
        for u in used {
            let r = u.register();
            if r.is_gpr() && u.access() != OpAccess::Write {
                read[r.full_register().number()] = true;
            }
        }
        for u in used {
            let r = u.register();
            let whole = r.is_gpr64() || r.is_gpr32();
            let full = r.full_register();
            if whole
                && u.access() == OpAccess::Write
                && full != Register::RSP
                && !read[full.number()]
            {
                return Some(GPR64[full.number()]);
            }
        }
        if i.flow_control() != FlowControl::Next {
            return None;
        }
    }
    None
}

/// Whether `i` is a shift or rotate, which leaves every flag alone when
/// its count (masked) is 0.
fn shifts(i: &Instruction) -> bool {
    matches!(
        i.mnemonic(),
        Mnemonic::Shl
            | Mnemonic::Sal
            | Mnemonic::Shr
            | Mnemonic::Sar
            | Mnemonic::Rol
            | Mnemonic::Ror
            | Mnemonic::Rcl
            | Mnemonic::Rcr
            | Mnemonic::Shld
            | Mnemonic::Shrd
    )
}

/// Whether `i` may leave every flag as it was, whatever iced-x86 says it
/// writes: a rep string instruction (which may not run at all), or a shift
/// or rotate whose count may be 0 ([`count_may_be_zero`]). Flag liveness
/// (counter placement, trace mode's checks, the successor scan) takes such
/// an instruction for one that writes none.
fn may_leave_flags(i: &Instruction) -> bool {
    is_rep(i) || count_may_be_zero(i)
}

/// A shift or rotate whose count may be zero: by CL, or by an immediate
/// that the count mask (5 bits, 6 for a 64-bit operand) makes 0. With a
/// zero count it leaves every flag alone, so flags are not dead before it
/// whatever iced-x86 says it may write.
fn count_may_be_zero(i: &Instruction) -> bool {
    if !shifts(i) {
        return false;
    }
    let size = match i.op0_kind() {
        OpKind::Register => i.op0_register().size(),
        _ => i.memory_size().size(),
    };
    let mask = if size == 8 { 0x3f } else { 0x1f };
    (0..i.op_count()).any(|n| match i.op_kind(n) {
        OpKind::Register => i.op_register(n) == Register::CL,
        OpKind::Immediate8 => i.immediate8() & mask == 0,
        OpKind::Immediate8_2nd => i.immediate8_2nd() & mask == 0,
        _ => false,
    })
}

/// Chooses where the block counter goes: the first point where flags are
/// dead, else the first point where some register is dead, else a spill.
fn counter_position(items: &[Item]) -> Placement {
    let plain = |it: &Item| match it {
        Item::Insn(i) => i.flow_control() == FlowControl::Next && !is_rep(i),
        Item::ClientRequest(_) | Item::Illegal(..) => false,
    };
    let flags = items.iter().position(|it| match it {
        Item::Insn(i) => {
            plain(it)
                && !may_leave_flags(i)
                && i.rflags_read() & STATUS == 0
                && i.rflags_modified() & STATUS == STATUS
        }
        Item::ClientRequest(_) | Item::Illegal(..) => false,
    });
    if let Some(n) = flags {
        return Placement::DeadFlags(n);
    }
    let mut info = InstructionInfoFactory::new();
    for (n, it) in items.iter().enumerate() {
        if let (true, Item::Insn(i)) = (plain(it), it) {
            if let Some(r) = dead_register(i, &mut info) {
                return Placement::DeadRegister(n, r);
            }
        }
    }
    Placement::Spill
}

struct Builder<'a> {
    e: Emitter,
    t: Translation,
    ctx: &'a mut dyn TransCtx,
    /// The last `jmp rel32` exit: (offset of the jump in the code, host
    /// address past it, guest target).
    tail_jmp: Option<(usize, u64, u64)>,
    /// Where the guest's registers are at this point of the code.
    regs: SiteRegs,
    /// The branch word the block's indirect jump or call writes, if any
    /// (counted executions with branch simulation).
    indirect_word: Option<IndirectWord>,
    /// Contexts mode: exits that keep the context are marked plain.
    contexts: bool,
    /// Contexts mode: the terminator being translated leaves the context
    /// whatever its target (a call).
    leaving: bool,
    /// Tagged counting: the block (its calls and returns are done inline).
    tagged: Option<ContextBlock>,
    /// Contexts mode: the block's id, to go in `hot::LAST` before the
    /// terminator leaves (with `hot::RETURN_TAG` for a `ret`), if the block
    /// leaves its context. The terminator stores it, except where an
    /// inline call's stub stores it only if the call is not done inline
    /// (only a context entry reads it).
    pending_last: Option<(u32, bool)>,
}

/// What a block's indirect jump or call writes to the branch stream.
#[derive(Debug, Clone, Copy)]
pub(crate) struct IndirectWord {
    /// The block's id.
    pub id: u32,
    /// The slots of the thread's copy of the indirect-target table minus
    /// one, when a target the copy holds writes no word.
    pub btac_mask: Option<u32>,
}

impl<'a> Builder<'a> {
    /// A builder for the block at `guest` (bytes `code`, decoded into
    /// `items`) emitted at `host`, counted by `counter` (0: none). Its body
    /// starts here, with the block's self-modifying-code check if it gets
    /// one.
    fn start(
        ctx: &'a mut dyn TransCtx,
        host: u64,
        counter: u32,
        items: &[Item],
        code: &[u8],
        guest: u64,
    ) -> Builder<'a> {
        Builder::start_with(ctx, host, counter, items, code, guest, None, |_| {})
    }

    /// [`Builder::start`] with `entry` emitting code at the body's start,
    /// before the self-modifying-code check (contexts mode's context
    /// entry), and `header` bytes right before the body (tagged
    /// counting's block header).
    #[allow(clippy::too_many_arguments)]
    fn start_with(
        ctx: &'a mut dyn TransCtx,
        host: u64,
        counter: u32,
        items: &[Item],
        code: &[u8],
        guest: u64,
        header: Option<[u8; contexts::TAGGED_HEADER_BYTES]>,
        entry: impl FnOnce(&mut Emitter),
    ) -> Builder<'a> {
        let mut b = Builder {
            e: Emitter::new(host),
            t: Translation {
                host,
                counter,
                ..Default::default()
            },
            ctx,
            tail_jmp: None,
            regs: SiteRegs::Guest,
            indirect_word: None,
            contexts: false,
            leaving: false,
            tagged: None,
            pending_last: None,
        };
        if b.ctx.smc_stub().is_some() {
            // Code that may change gets retired while other threads run it:
            // its entry (the check's first store, 9 bytes) is then replaced
            // by a jump in one 8-byte store, atomic within a cache line.
            let ahead = if header.is_some() {
                contexts::TAGGED_HEADER_BYTES as u64
            } else {
                0
            };
            while (b.e.here() + ahead) % 64 + 8 > 64 {
                b.e.raw(&[0x90]);
            }
        }
        if let Some(h) = header {
            b.e.raw(&h);
        }
        b.t.body = b.e.here();
        entry(&mut b.e);
        b.point(guest, PointKind::Clean);
        b.smc_check(items, code, guest);
        b
    }
}

impl Builder<'_> {
    /// Ends the translation of a block whose guest code ends at `end`: a
    /// final `jmp rel32` exit becomes the tail (its target may be placed
    /// right after), and the code is moved into the translation.
    fn seal(&mut self, end: u64) {
        if let Some((at, end, target)) = self.tail_jmp {
            if end == self.e.here() {
                self.t.tail = Some(target);
                self.t.tail_at = at;
            }
        }
        debug_assert!(self.e.is_complete());
        self.t.guest_end = end;
        self.t.code = std::mem::take(&mut self.e.bytes);
        self.t.counter_updates = std::mem::take(&mut self.e.counter_updates);
        self.t.quiet.append(&mut self.e.quiet);
        self.t.counter_end = self.e.counter_end.take();
    }

    fn exit_jmp(&mut self, guest_target: u64) {
        self.e.align_rel32(1);
        self.exit_jmp_unaligned(guest_target);
    }

    /// An exit `jmp rel32` to `next`, the guest instruction that runs next
    /// as far as the guest is concerned (the block's fall-through): the
    /// jump and any padding before it are clean points for it.
    fn exit_jmp_next(&mut self, next: u64, kind: PointKind) {
        self.point(next, kind);
        self.e.align_rel32(1);
        self.point(next, kind);
        self.exit_jmp_unaligned(next);
    }

    /// Records the current host address as a clean point before guest
    /// instruction `guest` (see [`CleanPoint`]).
    fn point(&mut self, guest: u64, kind: PointKind) {
        self.point_at(self.e.here(), guest, kind);
    }

    fn point_at(&mut self, host: u64, guest: u64, kind: PointKind) {
        match self.t.points.last() {
            Some(p) if p.host == host => return,
            Some(p) => debug_assert!(p.host < host, "clean points in host order"),
            None => {}
        }
        self.t.points.push(CleanPoint { host, guest, kind });
    }

    /// An exit `jmp rel32` right here (the caller keeps its field within a
    /// cache line).
    fn exit_jmp_unaligned(&mut self, guest_target: u64) {
        let at = self.e.bytes.len();
        let site = self.e.jmp(self.e.here());
        self.t.exits.push((site, guest_target));
        self.mark_plain(site, guest_target);
        self.t.successors.push(guest_target);
        self.tail_jmp = Some((at, self.e.here(), guest_target));
    }

    /// An exit `jcc rel32` standing for the guest branch at `ip`.
    fn exit_jcc(&mut self, cc: u8, guest_target: u64, ip: u64) {
        self.e.align_rel32(2);
        self.point(ip, PointKind::Clean);
        let site = self.e.jcc(cc, self.e.here());
        self.t.exits.push((site, guest_target));
        self.mark_plain(site, guest_target);
        self.t.branch_targets.push(guest_target);
    }

    /// Tagged counting: a direct call of `function` at `target` (skipped
    /// code if `skip_site`, the call's address, is given), returning to
    /// `next` (`None`: a direct jump Callgrind takes for a call), done
    /// inline when its memo knows it (into the callee's body), else
    /// through the callee's context entry.
    fn tagged_call(
        &mut self,
        (cb, stubs): (ContextBlock, TaggedStubs),
        function: u32,
        next: Option<u64>,
        target: u64,
        skip_site: Option<u64>,
    ) {
        let done = self.e.new_label();
        let start = self.e.here();
        let call = crate::emit::TaggedCall {
            block: cb.id,
            function,
            ret_addr: next,
            skip_site,
        };
        // The stub returns past the site's jump when not done.
        self.e.tagged_call_site(call, stubs, done);
        self.t.quiet.push(start..self.e.here());
        self.leaving = true;
        self.exit_jmp(target);
        self.leaving = false;
        self.e.bind(done);
        self.exit_jmp(target);
        let (site, _) = *self.t.exits.last().expect("just made");
        self.t.plain_exits.push(site);
    }

    /// Tagged counting: whether a direct jump from the block being
    /// translated to `target` is one Callgrind takes for a call (a tail
    /// call: into a function's start or another domain) that an inline
    /// call can do: the block, the callee's function and whether it is
    /// skipped code. Not from skipped code nor the resolver (whose jump
    /// calls for its caller).
    fn tagged_jump_call(
        &mut self,
        target: u64,
    ) -> Option<((ContextBlock, TaggedStubs), u32, bool)> {
        let inline = self
            .inline_tagged()
            .filter(|(cb, _)| !cb.skip && !cb.pop_on_jump)?;
        if self.ctx.same_context(target) {
            return None;
        }
        let (function, skip) = self.ctx.tagged_callee(target)?;
        Some((inline, function, skip))
    }

    /// Tagged counting with inline transitions: the block and the chunk's
    /// shared code, if callees' tags are computable (`emit::inline_recs`).
    fn inline_tagged(&self) -> Option<(ContextBlock, TaggedStubs)> {
        let cb = self.tagged.filter(|cb| crate::emit::inline_recs(cb.recs))?;
        Some((cb, self.ctx.tagged_stubs()?))
    }

    /// Tagged counting: an indirect transfer's lookup (target in RCX), then
    /// `inline`, the inline transition that goes on once the lookup found
    /// the target's translation; a quiet range, which a signal waits to
    /// leave.
    fn tagged_after_lookup(&mut self, inline: impl FnOnce(&mut Emitter)) {
        let htab = (self.ctx.core() + layout::HTAB) as u32;
        let count = self.ctx.count_lookups();
        let start = self.e.here();
        match self.ctx.tagged_stubs() {
            Some(stubs) => self.e.lookup_found_probe_call(htab, stubs.probe, count),
            None => self.e.lookup_found(htab, self.ctx.probe_stub(), count),
        }
        inline(&mut self.e);
        self.t.quiet.push(start..self.e.here());
    }

    /// Contexts mode: marks the exit at `site` plain if the transfer to
    /// `target` keeps the context.
    fn mark_plain(&mut self, site: u64, target: u64) {
        if self.contexts && !self.leaving && self.ctx.same_context(target) {
            self.t.plain_exits.push(site);
        }
    }

    /// The branch word of the indirect jump or call at `ip` (its target
    /// loaded), if the block writes one.
    fn indirect_branch_word(&mut self, ip: u64) {
        if let Some(w) = self.indirect_word {
            let copy = w.btac_mask.map(|m| Emitter::btac_slot(ip, m));
            self.e.indirect_branch_word(w.id, copy);
        }
    }

    /// Marks the start of the host code standing for guest instruction
    /// `ip`, with the registers where `regs` says.
    fn site(&mut self, ip: u64, regs: SiteRegs) {
        self.t.sites.push(GuestSite {
            host: self.e.here(),
            guest: ip,
            regs,
        });
    }

    /// Copies (or re-encodes) an ordinary instruction.
    fn copy(&mut self, i: &Instruction, code: &[u8], guest: u64) -> Result<(), TransError> {
        self.site(i.ip(), self.regs);
        if i.is_ip_rel_memory_operand() {
            self.reencode(i, i)?;
        } else {
            let off = (i.ip() - guest) as usize;
            self.e.raw(&code[off..off + i.len()]);
        }
        Ok(())
    }

    /// `mov rcx, <operand 0 of i>` for an indirect jump or call.
    fn load_target(&mut self, i: &Instruction) -> Result<(), TransError> {
        let mut m = if i.op0_kind() == OpKind::Register {
            Instruction::with2(Code::Mov_r64_rm64, Register::RCX, i.op0_register())
        } else {
            Instruction::with2(
                Code::Mov_r64_rm64,
                Register::RCX,
                iced_x86::MemoryOperand::with_base(Register::RAX),
            )
            .map(|mut m| {
                m.set_memory_base(i.memory_base());
                m.set_memory_index(i.memory_index());
                m.set_memory_index_scale(i.memory_index_scale());
                m.set_memory_displacement64(i.memory_displacement64());
                m.set_memory_displ_size(i.memory_displ_size());
                m.set_segment_prefix(i.segment_prefix());
                m
            })
        }
        .map_err(|err| TransError(format!("cannot translate `{}`: {err}", describe(i))))?;
        m.set_ip(self.e.here());
        self.reencode(&m, i)
    }

    /// Encodes `m` (made from guest instruction `i`) at the current host
    /// address; an error names `i`.
    fn reencode(&mut self, m: &Instruction, i: &Instruction) -> Result<(), TransError> {
        self.e.encode(m).map_err(|err| {
            TransError(format!(
                "cannot re-encode `{}` at {:#x}: {err}",
                describe(i),
                i.ip()
            ))
        })
    }

    fn push_literal(&mut self, value: u64) {
        let lit = self.ctx.literal(value);
        self.e.push_rip(lit);
    }

    fn lookup(&mut self) {
        let htab = (self.ctx.core() + layout::HTAB) as u32;
        let probe = self.ctx.probe_stub();
        let count = self.ctx.count_lookups();
        self.e.lookup(htab, probe, count);
    }

    fn terminator(&mut self, i: &Instruction, code: &[u8], guest: u64) -> Result<(), TransError> {
        let next = i.next_ip();
        let inline_call = match i.flow_control() {
            FlowControl::UnconditionalBranch => self.tagged_jump_call(i.near_branch_target()),
            FlowControl::Call if i.mnemonic() != Mnemonic::Syscall => {
                let target = i.near_branch_target();
                self.inline_tagged().and_then(|inline| {
                    let (function, skip) = self.ctx.tagged_callee(target)?;
                    Some((inline, function, skip))
                })
            }
            _ => None,
        };
        // (An inline call's stub stores it when the call is not done
        // inline.)
        let last = self.pending_last.take().filter(|_| inline_call.is_none());
        if let Some((id, returns)) = last {
            self.e.store_last(id, returns);
        }
        match i.flow_control() {
            FlowControl::UnconditionalBranch => {
                let target = i.near_branch_target();
                if let Some((inline, function, skip)) = inline_call {
                    self.tagged_call(inline, function, None, target, skip.then(|| i.ip()));
                } else {
                    self.exit_jmp(target);
                }
            }
            FlowControl::ConditionalBranch => match i.mnemonic() {
                Mnemonic::Jrcxz
                | Mnemonic::Jecxz
                | Mnemonic::Loop
                | Mnemonic::Loope
                | Mnemonic::Loopne => {
                    // Short-only forms: the guest instruction, retargeted
                    // over a jmp to the fall-through, lands on a jmp to the
                    // target. Both jumps' rel32 fields in one cache line, no
                    // padding between them.
                    self.e.align_span(i.len() as u64 + 10);
                    self.point(i.ip(), PointKind::Clean);
                    let taken = self.e.new_label();
                    let off = (i.ip() - guest) as usize;
                    // Its opcode (and prefixes) as they are; the rel8 is the last byte.
                    self.e.short_branch(&code[off..off + i.len() - 1], taken);
                    self.point(next, PointKind::Clean);
                    self.exit_jmp_unaligned(next);
                    self.e.bind(taken);
                    self.exit_jmp_unaligned(i.near_branch_target());
                }
                _ => {
                    let cc = condition_code(i).ok_or_else(|| {
                        TransError(format!(
                            "cannot translate `{}` at {:#x}",
                            describe(i),
                            i.ip()
                        ))
                    })?;
                    self.exit_jcc(cc, i.near_branch_target(), i.ip());
                    self.exit_jmp_next(next, PointKind::Clean);
                }
            },
            FlowControl::Call if i.mnemonic() == Mnemonic::Syscall => {
                self.syscall(next);
                self.exit_jmp_next(next, PointKind::AfterSyscall);
            }
            FlowControl::Call => {
                self.site(i.ip(), self.regs);
                self.push_literal(next);
                self.t.call_returns.push(next);
                let target = i.near_branch_target();
                if let Some((inline, function, skip)) = inline_call {
                    let skip_site = skip.then(|| i.ip());
                    self.tagged_call(inline, function, Some(next), target, skip_site);
                    return Ok(());
                }
                self.leaving = true;
                self.exit_jmp(i.near_branch_target());
                self.leaving = false;
            }
            FlowControl::IndirectCall => {
                self.e.spill_rax_rcx();
                self.site(i.ip(), SiteRegs::RcxSpilled);
                self.load_target(i)?;
                self.indirect_branch_word(i.ip());
                self.push_literal(next);
                self.t.call_returns.push(next);
                match self.inline_tagged() {
                    Some((cb, stubs)) => {
                        // (The call's memo knows its target.)
                        self.e.store_gs(Register::RCX, layout::S_TAGGED_TARGET);
                        self.tagged_after_lookup(|e| e.tagged_indirect_call_site(cb.id, stubs));
                    }
                    None => self.lookup(),
                }
            }
            FlowControl::IndirectBranch => {
                self.e.spill_rax_rcx();
                self.site(i.ip(), SiteRegs::RcxSpilled);
                self.load_target(i)?;
                self.indirect_branch_word(i.ip());
                match (self.tagged, self.ctx.tagged_stubs()) {
                    // Skipped code (the PLT) calls out.
                    (Some(cb), _) if cb.skip && crate::emit::inline_recs(cb.recs) => {
                        self.e.store_gs(Register::RCX, layout::S_TAGGED_TARGET);
                        self.tagged_after_lookup(|e| e.tagged_skipped_call(cb.domain, cb.recs));
                    }
                    (Some(cb), Some(stubs)) => {
                        // (Not the resolver's call for its caller.)
                        let calls = !cb.pop_on_jump && crate::emit::inline_recs(cb.recs);
                        if calls {
                            self.e.store_gs(Register::RCX, layout::S_TAGGED_TARGET);
                        }
                        self.tagged_after_lookup(|e| {
                            e.tagged_jump_site(cb.id, cb.domain, calls, stubs);
                        });
                    }
                    _ => self.lookup(),
                }
            }
            FlowControl::Return => {
                let pop = if i.op_count() == 1 {
                    i.immediate16() as u32
                } else {
                    0
                };
                self.e.spill_rax_rcx();
                self.site(i.ip(), SiteRegs::RcxSpilled);
                self.e.pop_return(pop);
                match self.ctx.tagged_stubs().filter(|_| self.tagged.is_some()) {
                    Some(stubs) => self.tagged_after_lookup(|e| e.tagged_return_site(stubs.ret)),
                    None => self.lookup(),
                }
            }
            FlowControl::Interrupt | FlowControl::Exception => {
                self.copy(i, code, guest)?;
                self.exit_jmp_next(next, PointKind::Clean);
            }
            FlowControl::XbeginXabortXend if i.mnemonic() == Mnemonic::Xbegin => {
                self.xbegin_aborts(i);
            }
            FlowControl::XbeginXabortXend => {
                // Outside a transaction (there are none): xabort does
                // nothing, xend faults, natively.
                self.copy(i, code, guest)?;
                self.exit_jmp_next(next, PointKind::Clean);
            }
            _ => {
                return Err(TransError(format!(
                    "cannot translate `{}` at {:#x}",
                    describe(i),
                    i.ip()
                )))
            }
        }
        Ok(())
    }

    /// A client request: an exit to the tool, which reads the argument
    /// block (RAX) and leaves the result in RDX; the code goes on after it.
    fn client_request(&mut self, guest_next: u64) {
        self.e.exit_stub(layout::MAGIC_REQUEST);
        self.t.requests.push(SyscallSite {
            stop_rip: self.e.here(),
            guest_next,
        });
    }

    /// An instruction that raises SIGILL at guest `ip`: a `ud2`, whose
    /// signal the tool gives that address at delivery.
    fn illegal(&mut self, ip: u64) {
        self.t.sigills.push((self.e.here(), ip));
        self.e.raw(&[0x0f, 0x0b]);
    }

    /// `xbegin` on a processor with TSX: its abort path, as after an abort
    /// that sets no status bit (EAX = 0; flags and memory untouched).
    fn xbegin_aborts(&mut self, i: &Instruction) {
        self.e.mov_eax_imm(0);
        self.exit_jmp(i.near_branch_target());
    }

    /// A guest `syscall`: numbers marked in the core's table go to the tool,
    /// the rest run natively right here.
    fn syscall(&mut self, guest_next: u64) {
        let systab = (self.ctx.core() + layout::SYSTAB) as u32;
        let sigreturn = (self.ctx.core() + layout::SIGRETURN_STUB) as u32;
        let stop_rip = self
            .e
            .syscall_gate(systab, sigreturn, layout::MAGIC_SYSCALL);
        // Where the tool resumes the thread after a syscall it handled.
        self.point_at(stop_rip, guest_next, PointKind::AfterSyscall);
        self.t.syscalls.push(SyscallSite {
            stop_rip,
            guest_next,
        });
    }

    fn rep(&mut self, i: &Instruction, code: &[u8], guest: u64) -> Result<(), TransError> {
        let ctr = self.ctx.alloc_counter()?;
        self.t.reps.push((i.ip(), ctr));
        if !is_cond_rep(i) {
            let load = self.e.count_rep(ctr);
            self.point_at(load, i.ip(), PointKind::RaxSpilled);
            self.point(i.ip(), PointKind::Rep { cond: false });
            return self.copy(i, code, guest);
        }
        self.e.count_cond_rep_before();
        self.point(i.ip(), PointKind::Rep { cond: true });
        self.copy(i, code, guest)?;
        self.e.count_cond_rep_after(ctr, i.has_repe_prefix());
        Ok(())
    }
}

fn condition_code(i: &Instruction) -> Option<u8> {
    use iced_x86::ConditionCode as C;
    Some(match i.condition_code() {
        C::o => 0,
        C::no => 1,
        C::b => 2,
        C::ae => 3,
        C::e => 4,
        C::ne => 5,
        C::be => 6,
        C::a => 7,
        C::s => 8,
        C::ns => 9,
        C::p => 10,
        C::np => 11,
        C::l => 12,
        C::ge => 13,
        C::le => 14,
        C::g => 15,
        C::None => return None,
    })
}

/// Translates the guest block at `guest` (whose bytes start `code`) into
/// code for host address `host`.
pub fn translate(
    code: &[u8],
    guest: u64,
    host: u64,
    ctx: &mut dyn TransCtx,
) -> Result<Translation, TransError> {
    let instrumented = ctx.instrumented();
    if let Some(cb) = ctx.contexts(guest)?.filter(|_| instrumented) {
        return contexts::translate_contexts(code, guest, host, ctx, cb);
    }
    if let Some(mode) = ctx.trace().filter(|_| instrumented) {
        // Trace mode keeps no clean points: its records of a block are
        // written as it goes, and cannot be taken back part-way.
        return traced::translate_traced(code, guest, host, ctx, mode).map(|mut t| {
            t.points.clear();
            t
        });
    }
    let (items, stop) = decode_block(code, guest, ctx.smc_stub().is_some())?;
    let counter = if instrumented {
        ctx.alloc_counter()?
    } else {
        0
    };
    let mut b = Builder::start(ctx, host, counter, &items, code, guest);
    let placement = if instrumented {
        counter_position(&items)
    } else {
        Placement::Nowhere
    };
    if placement == Placement::Spill {
        // A thread inside the update is rewound to its load, the guest's
        // RAX in its slot.
        let load = b.e.add_counter_keep_flags(counter);
        b.point_at(load, guest, PointKind::RaxSpilled);
    }
    let mut end = guest;
    for (n, item) in items.iter().enumerate() {
        let ip = item.ip();
        b.point(ip, PointKind::Clean);
        match placement {
            Placement::DeadFlags(at) if at == n => {
                b.e.add_counter(counter);
                b.point(ip, PointKind::Clean);
            }
            Placement::DeadRegister(at, r) if at == n => {
                b.e.add_counter_via(r, counter);
                b.point(ip, PointKind::Clean);
            }
            _ => {}
        }
        match item {
            Item::ClientRequest(ip) => {
                // One instruction, as VEX decodes it.
                if instrumented {
                    b.t.counted.push(*ip);
                }
                end = ip + 19;
                b.client_request(end);
            }
            Item::Illegal(ip, len) => {
                if instrumented {
                    b.t.counted.push(*ip);
                }
                end = ip + u64::from(*len);
                b.illegal(*ip);
            }
            Item::Insn(i) => {
                end = i.next_ip();
                if is_rep(i) && instrumented {
                    b.rep(i, code, guest)?;
                    continue;
                }
                if instrumented {
                    b.t.counted.push(i.ip());
                }
                if i.flow_control() == FlowControl::Next {
                    b.copy(i, code, guest)?;
                } else {
                    b.terminator(i, code, guest)?;
                }
            }
        }
    }
    if let Stop::Continue(next) = stop {
        b.exit_jmp_next(next, PointKind::Clean);
    }
    b.seal(end);
    Ok(b.t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_register_is_dead_where_the_block_overwrites_it_before_reading_it() {
        let dead = |code: &[u8]| {
            let (items, _) = decode_block(code, 0x1000, false).expect("decodes");
            dead_register_from(&items, 0, &mut InstructionInfoFactory::new())
        };
        // sub rsi, 1; lea eax, [rbx+rsi]; movzx eax, byte [r13+rax]; ret
        let lea_first = [
            0x48, 0x83, 0xee, 0x01, 0x8d, 0x04, 0x33, 0x41, 0x0f, 0xb6, 0x44, 0x05, 0x00, 0xc3,
        ];
        assert_eq!(dead(&lea_first), Some(Register::RAX));
        // mov rdi, rax; mov eax, 1: RAX is read first, RDI is written.
        let read_first = [0x48, 0x89, 0xc7, 0xb8, 0x01, 0x00, 0x00, 0x00, 0xc3];
        assert_eq!(dead(&read_first), Some(Register::RDI));
        // mov ax, 1 (a partial write); syscall; mov eax, 1: nothing dead
        // before the system call, which reads what it likes.
        let syscall = [
            0x66, 0xb8, 0x01, 0x00, 0x0f, 0x05, 0xb8, 0x01, 0x00, 0x00, 0x00, 0xc3,
        ];
        assert_eq!(dead(&syscall), None);
        // add rax, rcx; ret: nothing written.
        assert_eq!(dead(&[0x48, 0x01, 0xc8, 0xc3]), None);
        // rdsspq rax; test rax, rax; mov ecx, 1; ret: without shadow
        // stacks `rdssp` leaves RAX as it was (libgcc tests it), so RAX is
        // live; RCX is dead.
        let rdssp = [
            0xf3, 0x48, 0x0f, 0x1e, 0xc8, 0x48, 0x85, 0xc0, 0xb9, 0x01, 0x00, 0x00, 0x00, 0xc3,
        ];
        assert_eq!(dead(&rdssp), Some(Register::RCX));
        let (items, _) = decode_block(&rdssp, 0x1000, false).expect("decodes");
        let Item::Insn(first) = &items[0] else {
            panic!("an instruction")
        };
        assert_eq!(
            dead_register(first, &mut InstructionInfoFactory::new()),
            None
        );
    }

    /// Counting mode and trace mode (with data addresses).
    pub(super) const BOTH_MODES: [Option<TraceMode>; 2] = [
        None,
        Some(TraceMode {
            data: true,
            sp: false,
            filter: None,
            branches: false,
        }),
    ];

    /// The translator's context in the unit tests: counters handed out
    /// from `next` on, or trace mode when `trace` is set (block ids from
    /// `next` on, flush sites from 0).
    #[derive(Default)]
    pub(super) struct Ctx {
        pub next: u32,
        pub trace: Option<TraceMode>,
        pub sites: u32,
        /// The next site for kept references (`None`: none to give).
        pub ref_sites: Option<u32>,
        /// Stable guest code elsewhere (a successor's): its address and
        /// bytes.
        pub stable: Option<(u64, Vec<u8>)>,
    }
    impl TransCtx for Ctx {
        fn alloc_counter(&mut self) -> Result<u32, TransError> {
            // Trace mode counts only blocks whose executions are counted.
            assert!(
                self.trace
                    .is_none_or(|t| t.filter.is_some_and(|f| f.i1_set_mask.is_some())),
                "no counters in trace mode"
            );
            self.next += 8;
            Ok(self.next)
        }
        fn probe_stub(&self) -> u64 {
            0x50_0000
        }
        fn literal(&mut self, _value: u64) -> u64 {
            0x48_0000
        }
        fn core(&self) -> u64 {
            0x7000_0000
        }
        fn trace(&self) -> Option<TraceMode> {
            self.trace
        }
        fn alloc_block_id(&mut self) -> u32 {
            self.next += 1;
            self.next - 1
        }
        fn alloc_flush_site(&mut self) -> u32 {
            self.sites += 1;
            self.sites - 1
        }
        fn alloc_ref_sites(&mut self, n: u32, limit: u32) -> Option<u32> {
            let first = self.ref_sites.filter(|&f| f + n <= limit)?;
            self.ref_sites = Some(first + n);
            Some(first)
        }
        fn flush_stub(&self) -> u64 {
            0x51_0000
        }
        fn stable_code(&mut self, guest: u64, len: u64) -> Option<Vec<u8>> {
            let (at, code) = self.stable.as_ref()?;
            (*at == guest).then(|| code[..code.len().min(len as usize)].to_vec())
        }
    }

    #[test]
    fn loop_block_counts_and_exits() {
        // 1000: add rax,1 ; dec rcx ; jnz 1000
        let code = [0x48, 0x83, 0xc0, 0x01, 0x48, 0xff, 0xc9, 0x75, 0xf7];
        let mut ctx = Ctx {
            next: 0x1000,
            ..Ctx::default()
        };
        let t = translate(&code, 0x1000, 0x40_0000, &mut ctx).unwrap();
        assert_eq!(t.counted, vec![0x1000, 0x1004, 0x1007]);
        assert_eq!(
            t.exits.iter().map(|e| e.1).collect::<Vec<_>>(),
            vec![0x1000, 0x1009]
        );
        assert_eq!(t.guest_end, 0x1009);
        assert_eq!(t.tail, Some(0x1009));
    }

    #[test]
    fn dropping_the_tail_leaves_the_block_open_at_its_end() {
        // 1000: add rax,1 ; dec rcx ; jnz 1000 (then falls through to 1009)
        let code = [0x48, 0x83, 0xc0, 0x01, 0x48, 0xff, 0xc9, 0x75, 0xf7];
        let mut ctx = Ctx {
            next: 0x1000,
            ..Ctx::default()
        };
        let mut t = translate(&code, 0x1000, 0x40_0000, &mut ctx).unwrap();
        let whole = disasm(&t);
        assert!(whole.last().unwrap().starts_with("jmp "), "{whole:?}");
        t.drop_tail();
        assert_eq!(t.tail, None);
        assert_eq!(t.exits.len(), 1);
        let d = disasm(&t);
        assert_eq!(d[..], whole[..whole.len() - 1]);
        assert!(d.last().unwrap().starts_with("jne "), "{d:?}");
    }

    #[test]
    fn flags_are_not_dead_before_a_shift_by_cl_or_by_a_count_masked_to_zero() {
        // shl eax, cl ; jz: CL may be 0, leaving the flags of before; so
        // does shl eax, 32 (the count masked to 5 bits). shl rax, 32 does
        // write them, and the counter's add goes before it.
        let counted_with_add = |code: &[u8]| {
            let mut ctx = Ctx {
                next: 0x1000,
                ..Ctx::default()
            };
            let t = translate(code, 0x1000, 0x40_0000, &mut ctx).unwrap();
            let d = disasm(&t);
            d.iter().any(|l| l.starts_with("add qword ptr gs:"))
        };
        assert!(!counted_with_add(&[0xd3, 0xe0, 0x74, 0xfc]));
        assert!(!counted_with_add(&[0xc1, 0xe0, 0x20, 0x74, 0xfb]));
        assert!(counted_with_add(&[0x48, 0xc1, 0xe0, 0x20, 0x74, 0xfa]));
    }

    #[test]
    fn counter_goes_where_flags_or_a_register_are_dead() {
        let mut ctx = Ctx {
            next: 0x1000,
            ..Ctx::default()
        };
        // ja 1000 (flags live, nothing dead): spill.
        let t = translate(&[0x77, 0xfe], 0x1000, 0x40_0000, &mut ctx).unwrap();
        assert!(disasm(&t).iter().any(|l| l.contains("mov gs:[0],rax")));
        // mov r12, [rdi]; ja ...: through r12 before the mov.
        let code = [0x4c, 0x8b, 0x27, 0x77, 0xfb];
        let t = translate(&code, 0x1000, 0x40_0000, &mut ctx).unwrap();
        let d = disasm(&t);
        let at = d
            .iter()
            .position(|l| l.starts_with("lea r12,[r12+1]"))
            .unwrap();
        assert!(d[at - 1].starts_with("mov r12,gs:["), "{d:?}");
        assert!(d[at + 1].starts_with("mov gs:["), "{d:?}");
        assert_eq!(d[at + 2], "mov r12,[rdi]");
        // mov eax, [rax] reads rax: not dead; test: flags dead before it.
        let code = [0x8b, 0x00, 0x85, 0xc0, 0x74, 0xfa];
        let t = translate(&code, 0x1000, 0x40_0000, &mut ctx).unwrap();
        let d = disasm(&t);
        assert!(
            d.iter().any(|l| l.starts_with("add qword ptr gs:")),
            "{d:?}"
        );
    }

    /// The host instruction at each clean point of `t`, with the point.
    fn at_points(t: &Translation) -> Vec<(String, u64, PointKind)> {
        use iced_x86::{Decoder, DecoderOptions, Formatter, IntelFormatter};
        let mut by_addr = std::collections::HashMap::new();
        let mut f = IntelFormatter::new();
        for i in Decoder::with_ip(64, &t.code, t.host, DecoderOptions::NONE) {
            let mut text = String::new();
            f.format(&i, &mut text);
            by_addr.insert(i.ip(), text);
        }
        t.points
            .iter()
            .map(|p| {
                let text = by_addr.get(&p.host).cloned();
                let text =
                    text.unwrap_or_else(|| panic!("{:#x}: no instruction starts there", p.host));
                (text, p.guest, p.kind)
            })
            .collect()
    }

    #[test]
    fn clean_points_lie_between_guest_instructions() {
        // 1000: add rax,1 ; dec rcx ; jnz 1000 (falls through to 1009)
        let code = [0x48, 0x83, 0xc0, 0x01, 0x48, 0xff, 0xc9, 0x75, 0xf7];
        let mut ctx = Ctx {
            next: 0x1000,
            ..Ctx::default()
        };
        let t = translate(&code, 0x1000, 0x40_0000, &mut ctx).unwrap();
        let clean = PointKind::Clean;
        let p = at_points(&t);
        let short: Vec<(&str, u64)> = p
            .iter()
            .map(|(s, g, k)| {
                assert_eq!(*k, clean);
                (s.split(' ').next().unwrap(), *g)
            })
            .collect();
        // Before and after the counter (flags dead before the add), then
        // each instruction and the fall-through.
        assert_eq!(
            short,
            [
                ("add", 0x1000),
                ("add", 0x1000),
                ("dec", 0x1004),
                ("jne", 0x1007),
                ("jmp", 0x1009)
            ],
            "{p:?}"
        );
        assert!(p[0].0.starts_with("add qword ptr gs:"), "{p:?}");
        assert_eq!(p[1].0, "add rax,1");

        // mov eax, 39 ; syscall: after the gate's syscall (native) or the
        // tool's stop, the guest is after its syscall, RCX and R11 to fix.
        let code = [0xb8, 0x27, 0, 0, 0, 0x0f, 0x05];
        let t = translate(&code, 0x1000, 0x40_0000, &mut ctx).unwrap();
        let after: Vec<_> = t
            .points
            .iter()
            .filter(|p| p.kind == PointKind::AfterSyscall)
            .collect();
        assert!(after.iter().all(|p| p.guest == 0x1007), "{after:?}");
        let stop = t.syscalls[0].stop_rip;
        assert!(after.iter().any(|p| p.host == stop), "{after:?}");
        let d = at_points(&t);
        assert!(
            d.iter()
                .any(|(s, g, _)| s.starts_with("jmp") && *g == 0x1007),
            "{d:?}"
        );
        assert!(
            d.iter()
                .any(|(s, g, _)| s.starts_with("movzx") && *g == 0x1005),
            "{d:?}"
        );

        // rep movsb: clean before its count and at its load; at the
        // instruction itself its counter has begun.
        let t = translate(&[0xf3, 0xa4, 0xc3], 0x1000, 0x40_0000, &mut ctx).unwrap();
        let d = at_points(&t);
        let rep = d
            .iter()
            .find(|(_, _, k)| *k == PointKind::Rep { cond: false })
            .unwrap_or_else(|| panic!("{d:?}"));
        assert_eq!((rep.0.as_str(), rep.1), ("rep movsb [rdi],[rsi]", 0x1000));

        // Trace mode keeps none.
        let mut ctx = Ctx {
            trace: BOTH_MODES[1],
            ..Ctx::default()
        };
        let t = translate(&[0x48, 0x83, 0xc0, 0x01, 0xc3], 0x1000, 0x40_0000, &mut ctx).unwrap();
        assert!(t.points.is_empty());
    }

    fn disasm(t: &Translation) -> Vec<String> {
        crate::emit::tests::disasm_at(&t.code, t.host)
    }

    #[test]
    fn a_client_request_is_one_instruction_that_exits_and_ends_its_block() {
        let mut code = vec![0x90];
        code.extend_from_slice(&MAGIC_PREAMBLE);
        code.extend_from_slice(&MAGIC_REQUEST);
        code.push(0xc3);
        for trace in BOTH_MODES {
            let mut ctx = Ctx {
                next: 0x1000,
                trace,
                ..Ctx::default()
            };
            let t = translate(&code, 0x1000, 0x40_0000, &mut ctx).unwrap();
            assert_eq!(t.counted, vec![0x1000, 0x1001]);
            assert_eq!(t.guest_end, 0x1014);
            assert_eq!(t.tail, Some(0x1014));
            let [site] = t.requests[..] else {
                panic!("one request site: {:?}", t.requests)
            };
            assert_eq!(site.guest_next, 0x1014);
            // The exit: the client's RAX, RCX and R11 spilled, then the
            // magic syscall, which the tool's stop sees just after.
            let d = disasm(&t);
            // (The formatter puts a 0 before a leading hex letter.)
            let magic = format!("mov eax,0{:X}h", layout::MAGIC_REQUEST);
            let at = d
                .iter()
                .position(|l| *l == magic)
                .unwrap_or_else(|| panic!("{magic} in {d:#?}"));
            assert_eq!(
                d[at - 3..at],
                ["mov gs:[0],rax", "mov gs:[8],rcx", "mov gs:[10h],r11"]
            );
            assert_eq!(d[at + 1], "syscall");
            let off = (site.stop_rip - t.host) as usize;
            assert_eq!(
                crate::emit::tests::disasm_at(&t.code[off - 2..off], 0)[0],
                "syscall"
            );
            if trace.is_some() {
                // The borrowed registers are given back before it.
                assert!(
                    d[at - 4].starts_with("mov ") && d[at - 4].contains(",gs:[3"),
                    "{d:#?}"
                );
                assert_eq!(t.meta.unwrap().info.instrs()[1].len, 19);
            }
        }
    }

    #[test]
    fn uninstrumented_blocks_count_nothing() {
        struct Off(Ctx);
        impl TransCtx for Off {
            fn alloc_counter(&mut self) -> Result<u32, TransError> {
                panic!("no counter while instrumentation is off")
            }
            fn probe_stub(&self) -> u64 {
                self.0.probe_stub()
            }
            fn literal(&mut self, value: u64) -> u64 {
                self.0.literal(value)
            }
            fn core(&self) -> u64 {
                self.0.core()
            }
            fn trace(&self) -> Option<TraceMode> {
                Some(TraceMode {
                    data: true,
                    sp: false,
                    filter: None,
                    branches: false,
                })
            }
            fn alloc_block_id(&mut self) -> u32 {
                panic!("no record while instrumentation is off")
            }
            fn instrumented(&self) -> bool {
                false
            }
        }
        // add rax,1 ; rep movsb ; ret
        let code = [0x48, 0x83, 0xc0, 0x01, 0xf3, 0xa4, 0xc3];
        let t = translate(&code, 0x1000, 0x40_0000, &mut Off(Ctx::default())).unwrap();
        assert!(t.counted.is_empty() && t.reps.is_empty() && t.meta.is_none());
        assert_eq!(t.counter, 0);
        let d = disasm(&t);
        assert_eq!(d[..2], ["add rax,1", "rep movsb [rdi],[rsi]"]);
    }

    #[test]
    fn bad_first_instruction_is_named() {
        // mov rax, gs:[0]
        let code = [0x65, 0x48, 0x8b, 0x04, 0x25, 0, 0, 0, 0];
        let mut ctx = Ctx {
            next: 0x1000,
            ..Ctx::default()
        };
        let err = translate(&code, 0x1000, 0x40_0000, &mut ctx).unwrap_err();
        assert!(
            err.0.contains("GS segment use") && err.0.contains("0x1000"),
            "{}",
            err.0
        );
    }

    #[test]
    fn instructions_that_raise_sigill_are_blocks_of_their_own_ending_in_ud2() {
        let xbegin = [0xc7, 0xf8, 0, 0, 0, 0];
        let mut cases: Vec<(Vec<u8>, u64)> = vec![
            (vec![0x0f, 0x0b], 2), // ud2
            (vec![0x06], 1),       // push es: nothing in 64-bit mode
        ];
        if !is_x86_feature_detected!("rtm") {
            cases.push((xbegin.to_vec(), 6));
        }
        for (bytes, len) in cases {
            for trace in BOTH_MODES {
                let mut ctx = Ctx {
                    next: 0x1000,
                    trace,
                    ..Ctx::default()
                };
                // After a nop, the block ends before the instruction.
                let mut code = vec![0x90];
                code.extend_from_slice(&bytes);
                let t = translate(&code, 0x1000, 0x40_0000, &mut ctx).unwrap();
                assert_eq!((t.guest_end, t.sigills.len()), (0x1001, 0));
                let t = translate(&bytes, 0x1000, 0x40_0000, &mut ctx).unwrap();
                assert_eq!(t.guest_end, 0x1000 + len);
                assert_eq!(t.counted, [0x1000]);
                let [(host, guest)] = t.sigills[..] else {
                    panic!("{:?}", t.sigills)
                };
                assert_eq!(guest, 0x1000);
                let off = (host - t.host) as usize;
                assert_eq!(t.code[off..], [0x0f, 0x0b], "ends with the ud2");
                assert!(t.exits.is_empty());
            }
        }
    }

    #[test]
    fn xbegin_with_tsx_takes_its_abort_path() {
        let mut ctx = Ctx::default();
        let mut b = Builder {
            e: Emitter::new(0x40_0000),
            t: Translation::default(),
            ctx: &mut ctx,
            tail_jmp: None,
            regs: SiteRegs::Guest,
            indirect_word: None,
            contexts: false,
            leaving: false,
            tagged: None,
            pending_last: None,
        };
        // xbegin +0x10
        let i = Decoder::with_ip(
            64,
            &[0xc7, 0xf8, 0x10, 0, 0, 0],
            0x1000,
            DecoderOptions::NONE,
        )
        .decode();
        b.xbegin_aborts(&i);
        let d = crate::emit::tests::disasm_at(&b.e.bytes, 0x40_0000);
        assert_eq!(d[0], "mov eax,0");
        assert!(d[1].starts_with("jmp "), "{d:?}");
        assert_eq!(b.t.exits.iter().map(|e| e.1).collect::<Vec<_>>(), [0x1016]);
    }
}
