//! The data accesses one execution of a guest instruction makes
//! (Cachegrind's event rules, spec §1.4, §2.4, §4.2 and §4.3), as a pure
//! function of the decoded instruction.
//!
//! For every access the list gives its kind (read, write, or one
//! read-modify-write `Modify`, which Cachegrind counts as a read), its size,
//! and how to compute its address from the registers *as they are just
//! before the instruction executes*, so that the trace emission can put a
//! `lea` (or a few instructions) in front of the copied instruction.
//!
//! Where Cachegrind's counts are artefacts of VEX's translation rather than
//! of the machine (spec §0), the list follows the machine; each such case is
//! documented on the rule below and in `docs/conformance.md` ("Data accesses
//! per instruction"), and checked against Valgrind's Lackey by
//! `tests/memrefs_lackey.rs`.
//!
//! Rules, in the order `data_accesses` applies them:
//!
//! * Hints and address computations touch nothing: `lea`, `nop` with a
//!   memory operand, `prefetch*`, `clflush`, `clflushopt`, `clwb`,
//!   `cldemote`, `invlpg`, `monitor`, the MPX bound checks.
//! * Stack instructions (push, pop, near and far call and return, `pushf`,
//!   `popf`, `leave`, `enter`, `iret`): the stack slots, plus the explicit
//!   memory operand of `push m`, `pop m` and `call m`.
//! * `movdir64b`, `enqcmd`, `enqcmds`: a 64-byte read of the source and a
//!   64-byte write at the address held in the first operand.
//! * Everything else: its memory operands as iced-x86 decodes them
//!   (explicit ones, the string instructions' `[rsi]`/`[rdi]`, `xlat`'s
//!   `[rbx+al]`, `maskmov*`'s `[rdi]`), one access each, or one per lane for
//!   a VSIB (gather/scatter) operand. Reads come before writes.
//! * `bt`/`bts`/`btr`/`btc` with a register bit offset and a memory operand
//!   are counted at the operand, with its size. The machine accesses the
//!   operand-sized word at operand + size*(offset div bits): the operand
//!   itself for an offset within it, which is all compilers emit; an offset
//!   outside it would need a shift the address expression cannot express.
//!   (VEX accesses the one byte at operand + (offset >> 3).)
//! * Not modelled (no accesses): VIA/Zhaoxin PadLock's `xstore`,
//!   `xcrypt*`, `xsha*`, `ccs_*` (variable-length, `#UD` on Intel and AMD,
//!   unknown to VEX).
//! * Sizes are those of the memory operand, capped at 64 bytes (spec §2.4:
//!   Cachegrind caps dirty-helper accesses at the line size; every ordinary
//!   amd64 access VEX knows is at most 32 bytes, and AVX-512's 64-byte ones,
//!   which Valgrind 3.19 cannot run, stay 64).

// Consumed by the trace-buffer emission (translate.rs/emit.rs) that lands
// next; until then only the tests use it.
#![cfg_attr(not(test), allow(dead_code))]

use events::AccessKind;
use iced_x86::{
    Code, Instruction, InstructionInfoFactory, InstructionInfoOptions, Mnemonic, OpAccess, OpKind,
    Register,
};
use std::cell::RefCell;

/// The most accesses one instruction can make: `enter $n,$31` makes 62
/// (spec'd by the machine: 2 per nesting level), a 16-lane gather 16.
pub const MAX_ACCESSES: usize = 64;

/// The size cap (spec §2.4): no access is counted as larger than one
/// 64-byte line, so none touches more than two lines.
pub const SIZE_CAP: u32 = 64;

/// How to compute an access's address from the registers before the
/// instruction runs.
///
/// Registers are 64-bit general-purpose registers, except:
/// * with an address-size prefix (`0x67`), `base`/`index` are 32-bit
///   registers and the sum is taken modulo 2^32 (before the segment base is
///   added); `disp` may then be given zero-extended from 32 bits;
/// * `xlat`'s index is `Register::AL`, zero-extended (the only 8-bit index).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AddrExpr {
    /// seg_base + base + index*scale + disp. `base`/`index` may be
    /// `Register::None`. RIP-relative operands are resolved: base `None`,
    /// `disp` = the absolute address. `seg` is `Register::FS` or
    /// `Register::GS` for segment-prefixed operands (the address then adds
    /// that segment's base), else `Register::None`.
    Mem {
        /// `FS`, `GS` or `None`.
        seg: Register,
        /// Base register or `None`.
        base: Register,
        /// Index register or `None`.
        index: Register,
        /// 1, 2, 4 or 8.
        scale: u8,
        /// Displacement (or absolute address).
        disp: i64,
    },
    /// One lane of a VSIB (gather/scatter) operand: seg_base + base +
    /// (sign-extended lane `lane` of vector register `index`, `index_bytes`
    /// = 4 or 8 wide)*scale + disp.
    VsibLane {
        /// `FS`, `GS` or `None`.
        seg: Register,
        /// Base register or `None`.
        base: Register,
        /// The XMM/YMM/ZMM register holding the indices.
        index: Register,
        /// Width of one index: 4 (`vpgatherd*`) or 8 (`vpgatherq*`).
        index_bytes: u8,
        /// Which index.
        lane: u8,
        /// 1, 2, 4 or 8.
        scale: u8,
        /// Displacement.
        disp: i64,
    },
}

impl AddrExpr {
    /// `[base + disp]`, no segment, no index.
    fn based(base: Register, disp: i64) -> AddrExpr {
        AddrExpr::Mem {
            seg: Register::None,
            base,
            index: Register::None,
            scale: 1,
            disp,
        }
    }

    /// The address, given the registers' values before the instruction:
    /// `gpr(r)` for a general-purpose register (for `FS`/`GS`: the segment
    /// base; for `AL`: its zero-extended value) and `lane(r, bytes, k)` for
    /// the sign-extended `k`-th `bytes`-wide element of vector register `r`.
    /// (Tests use it; it also pins down the semantics the emission follows.)
    pub fn eval(
        &self,
        gpr: &dyn Fn(Register) -> u64,
        lane: &dyn Fn(Register, u8, u8) -> i64,
    ) -> u64 {
        let (seg, base, idx_val, scale, disp, addr32) = match *self {
            AddrExpr::Mem {
                seg,
                base,
                index,
                scale,
                disp,
            } => (
                seg,
                base,
                if index == Register::None {
                    0
                } else {
                    gpr(index)
                },
                scale,
                disp,
                base.is_gpr32() || index.is_gpr32(),
            ),
            AddrExpr::VsibLane {
                seg,
                base,
                index,
                index_bytes,
                lane: k,
                scale,
                disp,
            } => (
                seg,
                base,
                lane(index, index_bytes, k) as u64,
                scale,
                disp,
                base.is_gpr32(),
            ),
        };
        let b = if base == Register::None { 0 } else { gpr(base) };
        let mut ea = b
            .wrapping_add(idx_val.wrapping_mul(u64::from(scale)))
            .wrapping_add(disp as u64);
        if addr32 {
            ea &= 0xffff_ffff;
        }
        if seg != Register::None {
            ea = ea.wrapping_add(gpr(seg));
        }
        ea
    }
}

/// One data access of one instruction execution.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Access {
    /// Read, write, or one read-modify-write of the same location.
    pub kind: AccessKind,
    /// Bytes, at most [`SIZE_CAP`].
    pub size: u32,
    /// Where.
    pub addr: AddrExpr,
}

/// The accesses of one execution of an instruction, in order: a
/// fixed-capacity list (no heap allocation), at most [`MAX_ACCESSES`].
#[derive(Clone, Copy)]
pub struct Accesses {
    len: u8,
    items: [Access; MAX_ACCESSES],
}

impl Accesses {
    const FILLER: Access = Access {
        kind: AccessKind::Read,
        size: 0,
        addr: AddrExpr::Mem {
            seg: Register::None,
            base: Register::None,
            index: Register::None,
            scale: 1,
            disp: 0,
        },
    };

    /// The empty list.
    pub const fn new() -> Accesses {
        Accesses {
            len: 0,
            items: [Self::FILLER; MAX_ACCESSES],
        }
    }

    /// Appends one access. The rules never make more than
    /// [`MAX_ACCESSES`]; an excess one would be dropped (and fails a debug
    /// assertion) rather than panic in a release translation.
    fn push(&mut self, kind: AccessKind, size: u32, addr: AddrExpr) {
        debug_assert!((self.len as usize) < MAX_ACCESSES, "too many accesses");
        if (self.len as usize) < MAX_ACCESSES {
            self.items[self.len as usize] = Access {
                kind,
                size: size.min(SIZE_CAP),
                addr,
            };
            self.len += 1;
        }
    }

    /// The accesses, in order.
    pub fn as_slice(&self) -> &[Access] {
        &self.items[..self.len as usize]
    }

    /// How many.
    pub fn len(&self) -> usize {
        self.len as usize
    }

    /// Whether the instruction touches no data.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Iterates over the accesses in order.
    pub fn iter(&self) -> std::slice::Iter<'_, Access> {
        self.as_slice().iter()
    }
}

impl Default for Accesses {
    fn default() -> Self {
        Accesses::new()
    }
}

impl std::fmt::Debug for Accesses {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.as_slice()).finish()
    }
}

impl PartialEq for Accesses {
    fn eq(&self, other: &Self) -> bool {
        self.as_slice() == other.as_slice()
    }
}

impl Eq for Accesses {}

impl<'a> IntoIterator for &'a Accesses {
    type Item = &'a Access;
    type IntoIter = std::slice::Iter<'a, Access>;
    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

thread_local! {
    /// iced-x86's operand-access tables come through its info factory, which
    /// owns two vectors: one per thread, allocated once, reused per call.
    static FACTORY: RefCell<InstructionInfoFactory> = RefCell::new(InstructionInfoFactory::new());
}

/// How each operand of `i` is accessed (iced-x86's tables).
fn op_accesses(i: &Instruction) -> [OpAccess; 5] {
    FACTORY.with(|f| {
        let mut f = f.borrow_mut();
        let info = f.info_options(
            i,
            InstructionInfoOptions::NO_MEMORY_USAGE | InstructionInfoOptions::NO_REGISTER_USAGE,
        );
        [
            info.op0_access(),
            info.op1_access(),
            info.op2_access(),
            info.op3_access(),
            info.op4_access(),
        ]
    })
}

/// The accesses of one execution of `i` (for a rep-prefixed string
/// instruction: of ONE iteration), in the order the instruction makes
/// them. See the module documentation for the rules.
pub fn data_accesses(i: &Instruction) -> Accesses {
    let mut out = Accesses::new();
    if i.code() == Code::INVALID || touches_nothing(i) {
        return out;
    }
    if stack_accesses(i, &mut out) {
        return out;
    }
    match i.mnemonic() {
        // The destination is the 64-byte block at ES:[op0] (ES is flat in
        // 64-bit mode); iced-x86 gives it as a register operand.
        Mnemonic::Movdir64b | Mnemonic::Enqcmd | Mnemonic::Enqcmds => {
            out.push(AccessKind::Read, 64, explicit_addr(i));
            out.push(AccessKind::Write, 64, AddrExpr::based(i.op0_register(), 0));
        }
        _ => operand_accesses(i, &mut out),
    }
    out
}

/// Instructions whose memory operand is a hint or an address only.
/// (`prefetch*` and `lea` iced-x86 already marks as not accessing memory;
/// the cache-control ones it reports as reads, which they are not for
/// Cachegrind: VEX drops them.)
fn touches_nothing(i: &Instruction) -> bool {
    matches!(
        i.mnemonic(),
        Mnemonic::Lea
            | Mnemonic::Nop
            | Mnemonic::Prefetch
            | Mnemonic::Prefetchnta
            | Mnemonic::Prefetcht0
            | Mnemonic::Prefetcht1
            | Mnemonic::Prefetcht2
            | Mnemonic::Prefetchw
            | Mnemonic::Prefetchwt1
            | Mnemonic::Prefetchit0
            | Mnemonic::Prefetchit1
            | Mnemonic::Clflush
            | Mnemonic::Clflushopt
            | Mnemonic::Clwb
            | Mnemonic::Cldemote
            | Mnemonic::Invlpg
            | Mnemonic::Monitor
            | Mnemonic::Monitorx
            | Mnemonic::Umonitor
            | Mnemonic::Bndcl
            | Mnemonic::Bndcu
            | Mnemonic::Bndcn
            | Mnemonic::Bndmk
    )
}

/// The stack instructions. Returns false (nothing pushed) for any other.
///
/// Addresses are relative to RSP (RBP for `leave`/`enter`'s frame reads)
/// before the instruction. The width of a stack slot is the operand size:
/// 8, or 2 with a `0x66` prefix (`push ax`, `pushfw`, `retw`, ...).
fn stack_accesses(i: &Instruction, out: &mut Accesses) -> bool {
    use AccessKind::{Read, Write};
    let rsp = |d: i64| AddrExpr::based(Register::RSP, d);
    match i.code() {
        // Near returns (the immediate of `ret $n` is freed after the read).
        Code::Retnq | Code::Retnq_imm16 => out.push(Read, 8, rsp(0)),
        Code::Retnd | Code::Retnd_imm16 => out.push(Read, 4, rsp(0)),
        Code::Retnw | Code::Retnw_imm16 => out.push(Read, 2, rsp(0)),
        // Far returns: the return address, then the code segment.
        Code::Retfq | Code::Retfq_imm16 => {
            out.push(Read, 8, rsp(0));
            out.push(Read, 8, rsp(8));
        }
        Code::Retfd | Code::Retfd_imm16 => {
            out.push(Read, 4, rsp(0));
            out.push(Read, 4, rsp(4));
        }
        Code::Retfw | Code::Retfw_imm16 => {
            out.push(Read, 2, rsp(0));
            out.push(Read, 2, rsp(2));
        }
        // iret: RIP, CS, RFLAGS, RSP, SS.
        Code::Iretq | Code::Iretd | Code::Iretw => {
            let w: u32 = match i.code() {
                Code::Iretq => 8,
                Code::Iretd => 4,
                _ => 2,
            };
            for k in 0..5 {
                out.push(Read, w, rsp(i64::from(k * w)));
            }
        }
        // leave = mov rsp,rbp; pop rbp.
        Code::Leaveq => out.push(Read, 8, AddrExpr::based(Register::RBP, 0)),
        Code::Leaved => out.push(Read, 4, AddrExpr::based(Register::RBP, 0)),
        Code::Leavew => out.push(Read, 2, AddrExpr::based(Register::RBP, 0)),
        Code::Enterq_imm16_imm8 => enter(i, 8, out),
        Code::Enterd_imm16_imm8 => enter(i, 4, out),
        Code::Enterw_imm16_imm8 => enter(i, 2, out),
        // Far calls: read the far pointer (if in memory), push CS, push the
        // return address; each slot is half the stack-pointer decrement.
        Code::Call_m1664 | Code::Call_m1632 | Code::Call_m1616 => {
            let w = (-i.stack_pointer_increment()) as u32 / 2;
            out.push(Read, i.memory_size().size() as u32, explicit_addr(i));
            out.push(Write, w, rsp(-i64::from(w)));
            out.push(Write, w, rsp(-2 * i64::from(w)));
        }
        Code::Call_ptr1632 | Code::Call_ptr1616 => {
            let w = (-i.stack_pointer_increment()) as u32 / 2;
            out.push(Write, w, rsp(-i64::from(w)));
            out.push(Write, w, rsp(-2 * i64::from(w)));
        }
        _ => {
            let inc = i.stack_pointer_increment();
            let push = matches!(
                i.mnemonic(),
                Mnemonic::Push | Mnemonic::Pushf | Mnemonic::Pushfd | Mnemonic::Pushfq
            ) || (i.mnemonic() == Mnemonic::Call && inc < 0);
            let pop = matches!(
                i.mnemonic(),
                Mnemonic::Pop | Mnemonic::Popf | Mnemonic::Popfd | Mnemonic::Popfq
            );
            if push && inc < 0 {
                // `push m`/`call m`: the operand's address is computed
                // with RSP before the decrement (so `push 8(%rsp)` reads
                // the slot 8 above the old top).
                if i.op0_kind() == OpKind::Memory {
                    out.push(Read, i.memory_size().size() as u32, explicit_addr(i));
                }
                out.push(Write, (-inc) as u32, rsp(i64::from(inc)));
            } else if pop && inc > 0 {
                out.push(Read, inc as u32, rsp(0));
                // `pop m`: the destination's address is computed with RSP
                // already incremented, so `pop 8(%rsp)` writes 8+width above
                // the old top.
                if i.op0_kind() == OpKind::Memory {
                    let mut addr = explicit_addr(i);
                    if let AddrExpr::Mem { base, disp, .. } = &mut addr {
                        if matches!(*base, Register::RSP | Register::ESP) {
                            *disp += i64::from(inc);
                        }
                    }
                    out.push(Write, i.memory_size().size() as u32, addr);
                }
            } else {
                return false;
            }
        }
    }
    true
}

/// `enter $size, $level` with a `w`-byte operand size: push RBP; for each
/// nesting level after the first, copy one frame pointer from the caller's
/// display (read at RBP-k*w, pushed); then, for a nested frame, push the new
/// frame pointer. The level is taken modulo 32, as the machine does.
fn enter(i: &Instruction, w: u32, out: &mut Accesses) {
    let level = i64::from(i.immediate8_2nd() & 31);
    let w64 = i64::from(w);
    out.push(AccessKind::Write, w, AddrExpr::based(Register::RSP, -w64));
    if level > 0 {
        for k in 1..level {
            out.push(
                AccessKind::Read,
                w,
                AddrExpr::based(Register::RBP, -k * w64),
            );
            out.push(
                AccessKind::Write,
                w,
                AddrExpr::based(Register::RSP, -(k + 1) * w64),
            );
        }
        out.push(
            AccessKind::Write,
            w,
            AddrExpr::based(Register::RSP, -(level + 1) * w64),
        );
    }
}

/// Keeps FS and GS, the only segments with a base in 64-bit mode.
fn seg_of(r: Register) -> Register {
    match r {
        Register::FS | Register::GS => r,
        _ => Register::None,
    }
}

/// The address of `i`'s explicit (ModRM) memory operand.
fn explicit_addr(i: &Instruction) -> AddrExpr {
    let seg = seg_of(i.memory_segment());
    if i.is_ip_rel_memory_operand() {
        return AddrExpr::Mem {
            seg,
            base: Register::None,
            index: Register::None,
            scale: 1,
            disp: i.ip_rel_memory_address() as i64,
        };
    }
    AddrExpr::Mem {
        seg,
        base: i.memory_base(),
        index: i.memory_index(),
        scale: i.memory_index_scale() as u8,
        disp: i.memory_displacement64() as i64,
    }
}

/// The accesses of `i`'s memory operands, reads (and read-modify-writes)
/// before writes: an instruction reads its sources before it writes its
/// destination (`movs` reads `[rsi]`, then writes `[rdi]`). `cmps` reads
/// `[rdi]` before `[rsi]`, as VEX does (so Cachegrind's caches and
/// Lackey's trace see them in that order).
fn operand_accesses(i: &Instruction, out: &mut Accesses) {
    let access = op_accesses(i);
    // At most two memory operands (movs, cmps); writes wait here.
    let mut writes: [Option<(u32, AddrExpr)>; 2] = [None; 2];
    let mut nwrites = 0;
    let n = i.op_count();
    let string_compare = i.op_count() == 2
        && matches!(i.op0_kind(), OpKind::MemorySegRSI | OpKind::MemorySegESI)
        && matches!(i.op1_kind(), OpKind::MemoryESRDI | OpKind::MemoryESEDI);
    for op in (0..n).map(|k| if string_compare { n - 1 - k } else { k }) {
        let size = i.memory_size().size() as u32;
        let str_addr = |base: Register, seg: Register| AddrExpr::Mem {
            seg,
            base,
            index: Register::None,
            scale: 1,
            disp: 0,
        };
        let addr = match i.op_kind(op) {
            OpKind::Memory => {
                if i.is_vsib() {
                    vsib_accesses(i, access[op as usize], out);
                    continue;
                }
                explicit_addr(i)
            }
            // The string source (and maskmov's destination) honour a
            // segment override; the string destination is always ES.
            OpKind::MemorySegRSI => str_addr(Register::RSI, seg_of(i.memory_segment())),
            OpKind::MemorySegESI => str_addr(Register::ESI, seg_of(i.memory_segment())),
            OpKind::MemorySegRDI => str_addr(Register::RDI, seg_of(i.memory_segment())),
            OpKind::MemorySegEDI => str_addr(Register::EDI, seg_of(i.memory_segment())),
            OpKind::MemoryESRDI => str_addr(Register::RDI, Register::None),
            OpKind::MemoryESEDI => str_addr(Register::EDI, Register::None),
            _ => continue,
        };
        match kind_of(i, access[op as usize]) {
            // (No instruction has more than two memory operands.)
            Some(AccessKind::Write) if nwrites < writes.len() => {
                writes[nwrites] = Some((size_of(i, size), addr));
                nwrites += 1;
            }
            Some(kind) => out.push(kind, size_of(i, size), addr),
            None => {}
        }
    }
    for (size, addr) in writes.into_iter().flatten() {
        out.push(AccessKind::Write, size, addr);
    }
}

/// The size counted for a `size`-byte memory operand of `i`: the XSAVE
/// family's area has no fixed size (iced-x86 says 0) and is counted as one
/// capped access, like `fxsave`'s 512 bytes (spec §2.4).
fn size_of(i: &Instruction, size: u32) -> u32 {
    if size == 0 && is_xsave_family(i) {
        SIZE_CAP
    } else {
        size.min(SIZE_CAP)
    }
}

/// `xsave*`/`xrstor*`.
fn is_xsave_family(i: &Instruction) -> bool {
    matches!(
        i.mnemonic(),
        Mnemonic::Xsave
            | Mnemonic::Xsave64
            | Mnemonic::Xsavec
            | Mnemonic::Xsavec64
            | Mnemonic::Xsaveopt
            | Mnemonic::Xsaveopt64
            | Mnemonic::Xsaves
            | Mnemonic::Xsaves64
            | Mnemonic::Xrstor
            | Mnemonic::Xrstor64
            | Mnemonic::Xrstors
            | Mnemonic::Xrstors64
    )
}

/// The access kind of a memory operand. A conditional read (`cmov m,r`,
/// a `rep`-prefixed `cmps`) always reads; a conditional write (masked
/// stores) is one write; read-and-write of the same operand (`add r,m`,
/// `xchg`, `cmpxchg`, `lock` forms) is one `Modify`. The XSAVE family is one
/// write (save) or one read (restore): iced-x86 also marks the save's read
/// of the area's header, which Cachegrind's helper does not count.
fn kind_of(i: &Instruction, access: OpAccess) -> Option<AccessKind> {
    if is_xsave_family(i) {
        let restore = matches!(
            i.mnemonic(),
            Mnemonic::Xrstor | Mnemonic::Xrstor64 | Mnemonic::Xrstors | Mnemonic::Xrstors64
        );
        return Some(if restore {
            AccessKind::Read
        } else {
            AccessKind::Write
        });
    }
    match access {
        OpAccess::Read | OpAccess::CondRead => Some(AccessKind::Read),
        OpAccess::Write | OpAccess::CondWrite => Some(AccessKind::Write),
        OpAccess::ReadWrite | OpAccess::ReadCondWrite => Some(AccessKind::Modify),
        _ => None,
    }
}

/// A gather or scatter: one access per lane, each of the element size, at
/// base + index[lane]*scale + disp. The lanes are as many as both the index
/// register and the data register hold (`vgatherdpd xmm` uses the low two
/// of its four dword indices; `vgatherqps xmm,[ymm]` fills four floats).
/// Every lane counts, masked or not (the machine skips masked-off lanes;
/// VEX loads them from RSP instead: both give one access per lane, and we
/// put each at its computed address).
fn vsib_accesses(i: &Instruction, access: OpAccess, out: &mut Accesses) {
    let Some(kind) = kind_of(i, access) else {
        return;
    };
    let index = i.memory_index();
    let index_bytes: u8 = if i.is_vsib64() { 8 } else { 4 };
    let elem = i.memory_size().element_size().max(1);
    let data = (0..i.op_count())
        .filter(|&op| i.op_kind(op) == OpKind::Register)
        .map(|op| i.op_register(op))
        .find(|r| r.is_xmm() || r.is_ymm() || r.is_zmm());
    let index_lanes = index.size() / usize::from(index_bytes);
    let lanes = data.map_or(index_lanes, |d| index_lanes.min(d.size() / elem));
    for lane in 0..lanes {
        out.push(
            kind,
            elem as u32,
            AddrExpr::VsibLane {
                seg: seg_of(i.memory_segment()),
                base: i.memory_base(),
                index,
                index_bytes,
                lane: lane as u8,
                scale: i.memory_index_scale() as u8,
                disp: i.memory_displacement64() as i64,
            },
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use iced_x86::{Decoder, DecoderOptions};
    use AccessKind::{Modify as M, Read as R, Write as W};

    /// Where test instructions are decoded.
    const IP: u64 = 0x40_1000;

    fn dec(hex: &str) -> Instruction {
        let bytes: Vec<u8> = hex
            .split_whitespace()
            .map(|b| u8::from_str_radix(b, 16).unwrap())
            .collect();
        let mut d = Decoder::with_ip(64, &bytes, IP, DecoderOptions::NONE);
        let i = d.decode();
        assert_ne!(i.code(), Code::INVALID, "{hex} does not decode");
        assert_eq!(i.len(), bytes.len(), "{hex} is not one instruction");
        i
    }

    /// A fixed register file: general-purpose registers (32-bit views are
    /// the low halves), segment bases, and vector lanes.
    fn gpr(r: Register) -> u64 {
        match r {
            Register::RAX => 5,
            Register::AL => 5,
            Register::RCX => 3,
            Register::RBX => 0x3000,
            Register::RSP => 0x7ff0_0000,
            Register::RBP => 0x7ff0_0100,
            Register::RSI => 0x1_0000_1000,
            Register::ESI => 0x1000,
            Register::RDI => 0x2000,
            Register::RDX => 0x40,
            Register::ECX => 3,
            Register::FS => 0x10_0000,
            Register::GS => 0x20_0000,
            other => panic!("register {other:?} not in the test file"),
        }
    }

    /// Lane k of any vector register: 16k-8 (lane 0 negative, to check the
    /// sign extension is the expression's).
    fn lane(_: Register, _: u8, k: u8) -> i64 {
        16 * i64::from(k) - 8
    }

    /// (kind, size, address) of each access of `hex`.
    fn accesses(hex: &str) -> Vec<(AccessKind, u32, u64)> {
        data_accesses(&dec(hex))
            .iter()
            .map(|a| (a.kind, a.size, a.addr.eval(&gpr, &lane)))
            .collect()
    }

    fn check(hex: &str, want: &[(AccessKind, u32, u64)]) {
        assert_eq!(accesses(hex), want, "{hex}: {}", dec(hex));
    }

    const RSP: u64 = 0x7ff0_0000;
    const RBP: u64 = 0x7ff0_0100;
    const RSI: u64 = 0x1_0000_1000;
    const RDI: u64 = 0x2000;

    #[test]
    fn explicit_operands() {
        // mov rax,[rdi+rcx*4+16]; mov [rdi-8],eax
        check("48 8b 44 8f 10", &[(R, 8, RDI + 12 + 16)]);
        check("89 47 f8", &[(W, 4, RDI - 8)]);
        // movsd xmm0,[rsi] (not the string movsd); cmpsd xmm0,[rsi],1
        check("f2 0f 10 06", &[(R, 8, RSI)]);
        check("f2 0f c2 06 01", &[(R, 8, RSI)]);
        // movabs al,[abs64]; movabs [abs64],rax
        check("a0 88 77 66 55 44 33 22 11", &[(R, 1, 0x1122334455667788)]);
        check(
            "48 a3 88 77 66 55 44 33 22 11",
            &[(W, 8, 0x1122334455667788)],
        );
        // mov eax,[esi+ecx*2+4] (address-size prefix: 32-bit registers)
        check("67 8b 44 4e 04", &[(R, 4, 0x1000 + 6 + 4)]);
        // fld tbyte [rsi]; fldenv [rsi]
        check("db 2e", &[(R, 10, RSI)]);
        check("d9 26", &[(R, 28, RSI)]);
        // mov ds,[rsi]; mov [rsi],ds
        check("8e 1e", &[(R, 2, RSI)]);
        check("8c 1e", &[(W, 2, RSI)]);
        // vmovdqu ymm0,[rsi]; vmovdqu [rsi],ymm0: one 32-byte access
        check("c5 fe 6f 06", &[(R, 32, RSI)]);
        check("c5 fe 7f 06", &[(W, 32, RSI)]);
    }

    #[test]
    fn rip_relative_and_segments_are_resolved() {
        // mov rax,[rip+0x100] (7 bytes): the absolute address, no base.
        let i = dec("48 8b 05 00 01 00 00");
        let a = data_accesses(&i);
        assert_eq!(
            a.as_slice(),
            &[Access {
                kind: R,
                size: 8,
                addr: AddrExpr::Mem {
                    seg: Register::None,
                    base: Register::None,
                    index: Register::None,
                    scale: 1,
                    disp: (IP + 7 + 0x100) as i64,
                },
            }]
        );
        // mov rax,fs:[0x28]; mov rax,gs:[rbx+8]
        check("64 48 8b 04 25 28 00 00 00", &[(R, 8, 0x10_0000 + 0x28)]);
        check("65 48 8b 43 08", &[(R, 8, 0x20_0000 + 0x3008)]);
        let a = data_accesses(&dec("64 48 8b 04 25 28 00 00 00"));
        assert!(matches!(
            a.as_slice()[0].addr,
            AddrExpr::Mem {
                seg: Register::FS,
                base: Register::None,
                ..
            }
        ));
        // A DS/SS/ES override or default means no base: seg None.
        let a = data_accesses(&dec("ff 74 24 08"));
        assert!(a.iter().all(|x| matches!(
            x.addr,
            AddrExpr::Mem {
                seg: Register::None,
                ..
            }
        )));
    }

    #[test]
    fn read_modify_write_is_one_modify() {
        check("48 01 46 10", &[(M, 8, RSI + 16)]); // add [rsi+16],rax
        check("ff 06", &[(M, 4, RSI)]); // inc dword [rsi]
        check("48 f7 1e", &[(M, 8, RSI)]); // neg qword [rsi]
        check("48 87 06", &[(M, 8, RSI)]); // xchg [rsi],rax
        check("0f c1 06", &[(M, 4, RSI)]); // xadd [rsi],eax
        check("f0 48 83 06 01", &[(M, 8, RSI)]); // lock add qword [rsi],1
        check("0f b1 0e", &[(M, 4, RSI)]); // cmpxchg [rsi],ecx
        check("f0 48 0f c7 0e", &[(M, 16, RSI)]); // lock cmpxchg16b
        check("0f c7 0e", &[(M, 8, RSI)]); // cmpxchg8b
        check("48 0f ba 2e 03", &[(M, 8, RSI)]); // bts qword [rsi],3
                                                 // bts [rsi],rax: counted at the operand (see the module docs).
        check("48 0f ab 06", &[(M, 8, RSI)]);
    }

    #[test]
    fn reads_that_look_conditional() {
        check("48 0f ba 26 03", &[(R, 8, RSI)]); // bt qword [rsi],3
        check("48 0f 44 06", &[(R, 8, RSI)]); // cmove rax,[rsi]: always
    }

    #[test]
    fn hints_touch_nothing() {
        for hex in [
            "48 8d 46 08", // lea
            "0f 1f 00",    // nop dword [rax]
            "0f 18 0e",    // prefetcht0
            "0f 0d 0f",    // prefetchw
            "0f ae 3e",    // clflush
            "66 0f ae 3e", // clflushopt
            "66 0f ae 36", // clwb
            "0f 01 c8",    // monitor
            "90",          // nop
            "48 01 c8",    // add rax,rcx
        ] {
            assert!(data_accesses(&dec(hex)).is_empty(), "{hex}");
        }
    }

    #[test]
    fn stack() {
        check("50", &[(W, 8, RSP - 8)]); // push rax
        check("6a 01", &[(W, 8, RSP - 8)]); // push 1
        check("9c", &[(W, 8, RSP - 8)]); // pushfq
        check("58", &[(R, 8, RSP)]); // pop rax
        check("9d", &[(R, 8, RSP)]); // popfq
        check("66 50", &[(W, 2, RSP - 2)]); // push ax
        check("66 58", &[(R, 2, RSP)]); // pop ax
        check("66 9c", &[(W, 2, RSP - 2)]); // pushfw
        check("0f a0", &[(W, 8, RSP - 8)]); // push fs
        check("0f a1", &[(R, 8, RSP)]); // pop fs
        check("e8 00 00 00 00", &[(W, 8, RSP - 8)]); // call rel32
        check("ff d0", &[(W, 8, RSP - 8)]); // call rax
        check("c3", &[(R, 8, RSP)]); // ret
        check("c2 10 00", &[(R, 8, RSP)]); // ret 16
        check("c9", &[(R, 8, RBP)]); // leave
        check("66 c9", &[(R, 2, RBP)]); // leavew
                                        // push [rsp+8]: the source is addressed before the decrement.
        check("ff 74 24 08", &[(R, 8, RSP + 8), (W, 8, RSP - 8)]);
        // call [rsp+8]: likewise.
        check("ff 54 24 08", &[(R, 8, RSP + 8), (W, 8, RSP - 8)]);
        // pop [rsp+8]: the destination is addressed after the increment.
        check("8f 44 24 08", &[(R, 8, RSP), (W, 8, RSP + 8 + 8)]);
        // pop [rsp+rax]; pop word [rsp+8]
        check("8f 04 04", &[(R, 8, RSP), (W, 8, RSP + 8 + 5)]);
        check("66 8f 44 24 08", &[(R, 2, RSP), (W, 2, RSP + 2 + 8)]);
        // pop [rsi]: no adjustment for other bases.
        check("8f 06", &[(R, 8, RSP), (W, 8, RSI)]);
        // rex.w call far [rsi]: the 10-byte pointer, then CS, then RIP.
        check(
            "48 ff 1e",
            &[(R, 10, RSI), (W, 8, RSP - 8), (W, 8, RSP - 16)],
        );
        // ret far (64-bit): RIP then CS.
        check("48 cb", &[(R, 8, RSP), (R, 8, RSP + 8)]);
        // iretq: RIP, CS, RFLAGS, RSP, SS.
        check(
            "48 cf",
            &[
                (R, 8, RSP),
                (R, 8, RSP + 8),
                (R, 8, RSP + 16),
                (R, 8, RSP + 24),
                (R, 8, RSP + 32),
            ],
        );
    }

    #[test]
    fn enter_nesting() {
        // enter 32,0: push rbp.
        check("c8 20 00 00", &[(W, 8, RSP - 8)]);
        // enter 32,1: push rbp; push the new frame pointer.
        check("c8 20 00 01", &[(W, 8, RSP - 8), (W, 8, RSP - 16)]);
        // enter 32,3: push rbp; two display entries copied from the old
        // frame; the new frame pointer.
        check(
            "c8 20 00 03",
            &[
                (W, 8, RSP - 8),
                (R, 8, RBP - 8),
                (W, 8, RSP - 16),
                (R, 8, RBP - 16),
                (W, 8, RSP - 24),
                (W, 8, RSP - 32),
            ],
        );
        // The level is taken modulo 32: 33 is 1.
        check("c8 20 00 21", &[(W, 8, RSP - 8), (W, 8, RSP - 16)]);
        // 31 levels: the most accesses any instruction makes.
        assert_eq!(data_accesses(&dec("c8 20 00 1f")).len(), 62);
        // enterw 32,1: 2-byte slots.
        check("66 c8 20 00 01", &[(W, 2, RSP - 2), (W, 2, RSP - 4)]);
    }

    #[test]
    fn strings_one_iteration() {
        check("a4", &[(R, 1, RSI), (W, 1, RDI)]); // movsb
        check("48 a5", &[(R, 8, RSI), (W, 8, RDI)]); // movsq
        check("66 a5", &[(R, 2, RSI), (W, 2, RDI)]); // movsw
        check("a6", &[(R, 1, RDI), (R, 1, RSI)]); // cmpsb
        check("48 ab", &[(W, 8, RDI)]); // stosq
        check("ad", &[(R, 4, RSI)]); // lodsd
        check("66 af", &[(R, 2, RDI)]); // scasw
        check("f3 a4", &[(R, 1, RSI), (W, 1, RDI)]); // rep movsb
        check("f3 a6", &[(R, 1, RDI), (R, 1, RSI)]); // repe cmpsb
        check("f3 48 ab", &[(W, 8, RDI)]); // rep stosq
        check("f2 ae", &[(R, 1, RDI)]); // repne scasb
                                        // fs: applies to the source only.
        check("64 a4", &[(R, 1, 0x10_0000 + RSI), (W, 1, RDI)]);
        // Address-size prefix: esi/edi.
        let a = data_accesses(&dec("67 a4"));
        assert!(matches!(
            a.as_slice()[0].addr,
            AddrExpr::Mem {
                base: Register::ESI,
                ..
            }
        ));
        // ins/outs: the machine's accesses (they trap in user mode).
        check("6c", &[(W, 1, RDI)]); // insb
        check("6f", &[(R, 4, RSI)]); // outsd
    }

    #[test]
    fn other_implicit_operands() {
        // xlat: [rbx + zero-extended al].
        check("d7", &[(R, 1, 0x3000 + 5)]);
        // maskmovq/maskmovdqu: a write of the whole register at [rdi].
        check("0f f7 c1", &[(W, 8, RDI)]);
        check("66 0f f7 c1", &[(W, 16, RDI)]);
        // movdir64b rax,[rsi]: 64 bytes read at [rsi], written at [rax].
        check("66 0f 38 f8 06", &[(R, 64, RSI), (W, 64, 5)]);
    }

    #[test]
    fn state_saves_are_one_capped_access() {
        check("0f ae 06", &[(W, 64, RSI)]); // fxsave
        check("0f ae 0e", &[(R, 64, RSI)]); // fxrstor
        check("0f ae 26", &[(W, 64, RSI)]); // xsave
        check("0f ae 2e", &[(R, 64, RSI)]); // xrstor
        check("48 0f ae 26", &[(W, 64, RSI)]); // xsave64
        check("dd 36", &[(W, 64, RSI)]); // fnsave (108 bytes)
    }

    #[test]
    fn non_temporal_and_masked() {
        check("48 0f c3 06", &[(W, 8, RSI)]); // movnti
        check("66 0f e7 06", &[(W, 16, RSI)]); // movntdq
        check("c4 e2 75 2c 06", &[(R, 32, RSI)]); // vmaskmovps load
        check("c4 e2 75 2e 06", &[(W, 32, RSI)]); // vmaskmovps store
        check("c4 e2 75 8e 06", &[(W, 32, RSI)]); // vpmaskmovd store
        check("62 f1 fe 48 6f 06", &[(R, 64, RSI)]); // vmovdqu64 zmm load
        check("62 f1 7e 49 7f 06", &[(W, 64, RSI)]); // vmovdqu32 {k1} store
        check("62 f1 7c 58 58 06", &[(R, 4, RSI)]); // vaddps {1to16}
    }

    #[test]
    fn gathers_and_scatters_one_access_per_lane() {
        let lanes = |n: u64, elem: u32, scale: u64, disp: u64, kind| {
            (0..n)
                .map(|k| {
                    let idx = (16 * k as i64 - 8) as u64;
                    (kind, elem, RSI.wrapping_add(idx.wrapping_mul(scale)) + disp)
                })
                .collect::<Vec<_>>()
        };
        // vpgatherdd ymm0,[rsi+ymm1*4+8],ymm2: 8 dword lanes.
        check("c4 e2 6d 90 44 8e 08", &lanes(8, 4, 4, 8, R));
        // vpgatherdq ymm0,[rsi+xmm1*8],ymm2: 4 dword indices, qwords.
        check("c4 e2 ed 90 04 ce", &lanes(4, 8, 8, 0, R));
        // vgatherqps xmm0,[rsi+ymm1*4],xmm2: 4 qword indices, floats.
        check("c4 e2 6d 93 04 8e", &lanes(4, 4, 4, 0, R));
        // vgatherdpd xmm0,[rsi+xmm1*8],xmm2: 2 of the 4 indices.
        check("c4 e2 e9 92 04 ce", &lanes(2, 8, 8, 0, R));
        // vpgatherdd zmm0{k1},[rsi+zmm1*4]: 16 lanes.
        check("62 f2 7d 49 90 04 8e", &lanes(16, 4, 4, 0, R));
        // vpscatterqq [rsi+zmm1*8]{k1},zmm0: 8 lanes written.
        check("62 f2 fd 49 a1 04 ce", &lanes(8, 8, 8, 0, W));
        let a = data_accesses(&dec("c4 e2 ed 90 04 ce"));
        assert_eq!(
            a.as_slice()[3].addr,
            AddrExpr::VsibLane {
                seg: Register::None,
                base: Register::RSI,
                index: Register::XMM1,
                index_bytes: 4,
                lane: 3,
                scale: 8,
                disp: 0,
            }
        );
    }

    /// Byte strings covering the opcode maps: legacy (one byte, 0F, 0F38,
    /// 0F3A) under the common prefixes, VEX and EVEX in every map, length,
    /// W and pp, each opcode with memory ModRMs (every reg field, plain and
    /// SIB/VSIB forms) and a register ModRM, then filler bytes.
    fn opcode_space(mut f: impl FnMut(&[u8])) {
        let modrms: Vec<Vec<u8>> = (0..8u8)
            .flat_map(|reg| {
                [
                    vec![reg << 3 | 0x06],             // [rsi]
                    vec![reg << 3 | 0x44, 0x8e, 0x10], // [rsi+rcx*4+16]
                    vec![0xc0 | reg << 3 | 1],         // register form
                ]
            })
            .collect();
        let tail = [0x11u8, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x08];
        let mut buf = Vec::with_capacity(32);
        let mut emit = |head: &[u8], op: u8, f: &mut dyn FnMut(&[u8])| {
            for m in &modrms {
                buf.clear();
                buf.extend_from_slice(head);
                buf.push(op);
                buf.extend_from_slice(m);
                buf.extend_from_slice(&tail);
                f(&buf);
            }
        };
        let prefixes: [&[u8]; 10] = [
            &[],
            &[0x66],
            &[0xf2],
            &[0xf3],
            &[0x48],
            &[0x66, 0x48],
            &[0xf3, 0x48],
            &[0xf2, 0x48],
            &[0x67],
            &[0xf0],
        ];
        let maps: [&[u8]; 4] = [&[], &[0x0f], &[0x0f, 0x38], &[0x0f, 0x3a]];
        for p in prefixes {
            for m in maps {
                let head = [p, m].concat();
                for op in 0..=255u8 {
                    emit(&head, op, &mut f);
                }
            }
        }
        // VEX (3-byte form): R X B set (inverted), map 1-3; W, vvvv=1111,
        // L, pp.
        for map in 1..=3u8 {
            for w in 0..2u8 {
                for l in 0..2u8 {
                    for pp in 0..4u8 {
                        let head = [0xc4, 0xe0 | map, w << 7 | 0x78 | l << 2 | pp];
                        for op in 0..=255u8 {
                            emit(&head, op, &mut f);
                        }
                    }
                }
            }
        }
        // EVEX: maps 1-3, 5, 6; W, pp; L'L 0-2; masking k0 and k1.
        for map in [1u8, 2, 3, 5, 6] {
            for w in 0..2u8 {
                for pp in 0..4u8 {
                    for ll in 0..3u8 {
                        for aaa in 0..2u8 {
                            let head = [
                                0x62,
                                0xf0 | map,
                                w << 7 | 0x78 | 0x04 | pp,
                                ll << 5 | 0x08 | aaa,
                            ];
                            for op in 0..=255u8 {
                                emit(&head, op, &mut f);
                            }
                        }
                    }
                }
            }
        }
    }

    /// Instructions iced-x86 reports as using memory that touch no data
    /// for Cachegrind (and for this module): cache control and address
    /// hints, whose operand names a line or an address, not data.
    const NO_DATA_ACCESS: &[Mnemonic] = &[
        Mnemonic::Clflush,
        Mnemonic::Clflushopt,
        Mnemonic::Clwb,
        Mnemonic::Cldemote,
        Mnemonic::Invlpg,
        Mnemonic::Monitor,
        Mnemonic::Monitorx,
        Mnemonic::Umonitor,
    ];

    /// Instructions not modelled: VIA/Zhaoxin PadLock's block operations
    /// (variable lengths, `#UD` on Intel and AMD, unknown to VEX).
    const NOT_MODELLED: &[Mnemonic] = &[
        Mnemonic::Xstore,
        Mnemonic::Xstore_alt,
        Mnemonic::Xcryptecb,
        Mnemonic::Xcryptcbc,
        Mnemonic::Xcryptctr,
        Mnemonic::Xcryptcfb,
        Mnemonic::Xcryptofb,
        Mnemonic::Xsha1,
        Mnemonic::Xsha256,
        Mnemonic::Xsha512,
        Mnemonic::Xsha512_alt,
        Mnemonic::Ccs_hash,
        Mnemonic::Ccs_encrypt,
    ];

    /// iced-x86's view of an instruction's memory use, as (kind, size)
    /// sorted, sizes capped like ours.
    fn iced_view(factory: &mut InstructionInfoFactory, i: &Instruction) -> Vec<(AccessKind, u32)> {
        let mut v: Vec<(AccessKind, u32)> = factory
            .info(i)
            .used_memory()
            .iter()
            .filter_map(|m| {
                let k = match m.access() {
                    OpAccess::Read | OpAccess::CondRead => R,
                    OpAccess::Write | OpAccess::CondWrite => W,
                    OpAccess::ReadWrite | OpAccess::ReadCondWrite => M,
                    _ => return None,
                };
                Some((k, (m.memory_size().size() as u32).min(SIZE_CAP)))
            })
            .collect();
        v.sort_by_key(|&(k, s)| (k as u8, s));
        v
    }

    /// Over every instruction form the opcode space above decodes to: when
    /// iced-x86 says an instruction reads or writes memory, `data_accesses`
    /// gives at least one access (the allow-lists aside), and the same
    /// accesses as iced-x86 (kinds and sizes, in any order) except where
    /// this module deliberately differs:
    /// * rep-prefixed string instructions (iced-x86 gives size 0: the
    ///   whole run; we give one iteration's element size);
    /// * gathers and scatters (iced-x86: one access of one element; we:
    ///   one per lane);
    /// * the XSAVE family (iced-x86: size 0, a save as read-write; we: one
    ///   capped write or read).
    #[test]
    fn agrees_with_iced_memory_use() {
        let mut factory = InstructionInfoFactory::new();
        let mut with_memory = std::collections::HashSet::new();
        let mut missing = std::collections::BTreeMap::new();
        let mut differ = std::collections::BTreeMap::new();
        let mut decoded = 0u64;
        opcode_space(|bytes| {
            let mut d = Decoder::with_ip(64, bytes, IP, DecoderOptions::NONE);
            let i = d.decode();
            if i.code() == Code::INVALID {
                return;
            }
            decoded += 1;
            let iced = iced_view(&mut factory, &i);
            let ours = data_accesses(&i);
            let hex = || {
                bytes[..i.len()]
                    .iter()
                    .map(|b| format!("{b:02x}"))
                    .collect::<Vec<_>>()
                    .join(" ")
            };
            if iced.is_empty() {
                assert!(ours.is_empty(), "{} ({}): {ours:?}", i, hex());
                return;
            }
            with_memory.insert(i.code());
            if NO_DATA_ACCESS.contains(&i.mnemonic()) || NOT_MODELLED.contains(&i.mnemonic()) {
                return;
            }
            if ours.is_empty() {
                missing.entry(format!("{:?}", i.code())).or_insert_with(hex);
                return;
            }
            let mut mine: Vec<(AccessKind, u32)> = ours.iter().map(|a| (a.kind, a.size)).collect();
            mine.sort_by_key(|&(k, s)| (k as u8, s));
            let rep_string = (i.has_rep_prefix() || i.has_repne_prefix())
                && iced.iter().all(|&(_, s)| s == 0)
                && mine
                    .iter()
                    .all(|&(_, s)| s == i.memory_size().size() as u32);
            let lanes = i.is_vsib()
                && iced.len() == 1
                && mine.iter().all(|&m| m == iced[0])
                && mine.len() > 1;
            let xsave = is_xsave_family(&i) && mine.len() == 1 && mine[0].1 == SIZE_CAP;
            let same_kinds = |a: &[(AccessKind, u32)], b: &[(AccessKind, u32)]| {
                a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.0 == y.0)
            };
            let ok = mine == iced || (rep_string && same_kinds(&mine, &iced)) || lanes || xsave;
            if !ok {
                differ
                    .entry(format!("{:?}", i.code()))
                    .or_insert_with(|| format!("{} ({}): iced {iced:?}, ours {mine:?}", i, hex()));
            }
        });
        assert!(missing.is_empty(), "no accesses for: {missing:#?}");
        assert!(differ.is_empty(), "differences: {differ:#?}");
        // The sweep must actually reach the memory forms: about 3,500 of
        // iced-x86's instruction codes use memory in 64-bit mode.
        assert!(
            with_memory.len() > 3000,
            "only {} codes with memory ({decoded} decoded)",
            with_memory.len()
        );
    }
}
