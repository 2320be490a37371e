//! The instructions the engine adds around guest code: spills through GS,
//! exits, indirect-branch lookups, counters, syscall gates.
//!
//! Ordinary instructions are encoded by iced-x86; branches are encoded here
//! because their displacement fields matter to the engine: exits between
//! blocks are `jmp`/`jcc rel32` fields that the linker patches later (so
//! they have a fixed size and a known address), and branches inside a
//! sequence go to [`Label`]s resolved when the label is bound.

/// One instruction by its iced code and up to two operands (the
/// submodules' hand-written sequences).
macro_rules! op {
    ($e:expr, $code:ident, $a:expr, $b:expr) => {
        $e.insn(Instruction::with2(Code::$code, $a, $b))
    };
    ($e:expr, $code:ident, $a:expr) => {
        $e.insn(Instruction::with1(Code::$code, $a))
    };
    ($e:expr, $code:ident) => {
        $e.insn(Ok(Instruction::with(Code::$code)))
    };
}

mod contexts;
mod fast_entry;
pub use contexts::{CONTEXT_ENTRY_BYTES, UNCHECKED};
pub use fast_entry::FastEntry;
mod tagged;
pub use tagged::{inline_recs, CallKind, TaggedCall, TaggedStubs};
mod signals;
mod smc;
mod trace;

pub use trace::{
    is_counted_pair, FetchCheck, FetchPath, FlagsAt, KeptForm, KeptPath, MruGeometry, Taken,
    COUNTED_PAIR, FLUSH_AT,
};

use crate::layout;
use iced_x86::{Code, Encoder, Instruction, MemoryOperand, Register};

/// The 64-bit general-purpose registers in encoding order (0..16).
pub const GPR64: [Register; 16] = [
    Register::RAX,
    Register::RCX,
    Register::RDX,
    Register::RBX,
    Register::RSP,
    Register::RBP,
    Register::RSI,
    Register::RDI,
    Register::R8,
    Register::R9,
    Register::R10,
    Register::R11,
    Register::R12,
    Register::R13,
    Register::R14,
    Register::R15,
];

/// The 16-bit general-purpose registers in encoding order.
const GPR16: [Register; 16] = [
    Register::AX,
    Register::CX,
    Register::DX,
    Register::BX,
    Register::SP,
    Register::BP,
    Register::SI,
    Register::DI,
    Register::R8W,
    Register::R9W,
    Register::R10W,
    Register::R11W,
    Register::R12W,
    Register::R13W,
    Register::R14W,
    Register::R15W,
];

/// A position in the code being emitted, bound once; branches to it may
/// come before or after the binding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Label(usize);

/// A branch displacement waiting for its label.
struct Fixup {
    /// Offset in `bytes` just past the displacement field.
    end: usize,
    /// Size of the field (1 or 4 bytes).
    size: usize,
    label: Label,
}

/// Code being emitted at a known host address.
pub struct Emitter {
    /// Host address of `bytes[0]`.
    pub base: u64,
    /// The encoded bytes.
    pub bytes: Vec<u8>,
    encoder: Encoder,
    labels: Vec<Option<u64>>,
    fixups: Vec<Fixup>,
    /// Counter updates emitted as a load, an increment and a store: the
    /// host range from the load to past the store of each. A signal that
    /// interrupts one between the two is delivered as if at the load (see
    /// `space::sites`), or a handler running the same block would lose its
    /// counts to the store of the stale value.
    pub counter_updates: Vec<(u64, u64)>,
    /// Trace mode: where the code first gave the borrowed registers back
    /// ([`Emitter::trace_leave`]): the block's record is complete there
    /// (`translate::RecordSpan`).
    pub left_borrowed: Option<u64>,
    /// Host ranges a signal must not interrupt (tagged counting's
    /// sequences whose words a handler may change meanwhile): the thread
    /// is stepped out of them first (`Translation::quiet`).
    pub quiet: Vec<std::ops::Range<u64>>,
    /// Tagged counting's counts waiting for their slot's second half
    /// (`emit::contexts`).
    second_halves: Vec<contexts::SecondHalf>,
    /// Tagged counting: inline transitions count themselves
    /// (`ctxrt::tagged::head::INLINE`, read by `-v -v` alone).
    pub count_inline: bool,
    /// The host address just past the block counter's update, once made.
    pub counter_end: Option<u64>,
    /// Trace mode, a block without a buffer check on entry: the chunk's
    /// flush stub, where each append to the records goes first when the
    /// buffer is past its limit (see `Emitter::append_via`).
    pub checked_appends: Option<u64>,
}

/// The value of a rel32 field at host address `field` that makes its branch
/// go to `dest`, if `dest` is within reach (±2 GiB from the field's end).
pub fn rel32(field: u64, dest: u64) -> Option<i32> {
    i32::try_from(dest.wrapping_sub(field + 4) as i64).ok()
}

/// `gs:[disp]`: a slot of the current thread's area. The displacement is
/// given as 64-bit addressing's (sign-extended 32 bits, every slot lying
/// below 2 GiB): given as 32-bit, iced encodes the operand with an
/// address-size prefix (`gs:[eiz*1+disp]`), a byte more on each of the
/// several thread-area accesses of every block.
fn gs(disp: u32) -> MemoryOperand {
    MemoryOperand::new(
        Register::None,
        Register::None,
        1,
        disp as i64,
        8,
        false,
        Register::GS,
    )
}

/// `[base + index*scale + disp]`.
fn based_indexed(base: Register, index: Register, scale: u32, disp: i32) -> MemoryOperand {
    MemoryOperand::with_base_index_scale_displ_size(base, index, scale, i64::from(disp), 1)
}

/// Condition codes of `jcc` ([`Emitter::jcc_label`]) the hand-written
/// sequences use.
mod cc {
    pub const JB: u8 = 2;
    pub const JAE: u8 = 3;
    pub const JE: u8 = 4;
    pub const JNE: u8 = 5;
    pub const JBE: u8 = 6;
    pub const JS: u8 = 8;
}

/// `gs:[index*8 + disp]`.
fn gs_indexed(index: Register, disp: u32) -> MemoryOperand {
    MemoryOperand::new(
        Register::None,
        index,
        8,
        i64::from(disp),
        4,
        false,
        Register::GS,
    )
}

/// `[index*scale + disp]` with an absolute 32-bit displacement (the core
/// region lies below 2 GiB).
fn indexed(index: Register, scale: u32, disp: u32) -> MemoryOperand {
    MemoryOperand::with_index_scale_displ_size(index, scale, disp as i64, 4)
}

/// How a lookup that misses its inline ways goes on to the chunk's probe
/// stub.
#[derive(Clone, Copy)]
enum Probe {
    /// Jumps to it: a target found is jumped to.
    Jump(u64),
    /// Calls it (a returning probe stub): a target found comes back.
    Call(u64),
}

/// Bytes a site steps over before it calls the returning probe stub (the
/// red zone: an indirect jump's function may still have data there).
const PROBE_RED_ZONE: i32 = 128;

/// `[base + disp]`.
fn based(base: Register, disp: i32) -> MemoryOperand {
    MemoryOperand::with_base_displ(base, disp as i64)
}

impl Emitter {
    /// An empty buffer that will live at host address `base`.
    pub fn new(base: u64) -> Self {
        let mut encoder = Encoder::new(64);
        // Room for the longest instruction from the start: the buffer is
        // reused for every instruction (see `encode`).
        encoder.set_buffer(Vec::with_capacity(16));
        Emitter {
            base,
            bytes: Vec::with_capacity(2048),
            encoder,
            labels: Vec::new(),
            fixups: Vec::new(),
            counter_updates: Vec::new(),
            left_borrowed: None,
            quiet: Vec::new(),
            second_halves: Vec::new(),
            count_inline: false,
            counter_end: None,
            checked_appends: None,
        }
    }

    /// Host address of the next byte.
    pub fn here(&self) -> u64 {
        self.base + self.bytes.len() as u64
    }

    /// Appends raw bytes (guest instructions copied as they are).
    pub fn raw(&mut self, b: &[u8]) {
        self.bytes.extend_from_slice(b);
    }

    /// Encodes one instruction at `here()`. The engine's own instructions
    /// are fixed forms, so a failure is a bug in this module.
    fn insn(&mut self, i: Result<Instruction, iced_x86::IcedError>) {
        let i = i.expect("valid engine instruction");
        self.encode(&i).expect("encodable engine instruction");
    }

    /// Encodes `i` at `here()` (a guest instruction re-encoded for its new
    /// address, or one built from it). The encoder's buffer is reused, so
    /// translation allocates nothing per instruction here.
    pub fn encode(&mut self, i: &Instruction) -> Result<(), iced_x86::IcedError> {
        let here = self.here();
        let result = self.encoder.encode(i, here);
        let mut buf = self.encoder.take_buffer();
        if result.is_ok() {
            self.bytes.extend_from_slice(&buf);
        }
        buf.clear();
        self.encoder.set_buffer(buf);
        result.map(drop)
    }

    /// A label to bind later with [`Emitter::bind`].
    pub fn new_label(&mut self) -> Label {
        self.labels.push(None);
        Label(self.labels.len() - 1)
    }

    /// Binds `l` here and resolves the branches already made to it.
    pub fn bind(&mut self, l: Label) {
        assert!(self.labels[l.0].is_none(), "label bound twice");
        let at = self.here();
        self.labels[l.0] = Some(at);
        // In place (no vectors made per label: blocks bind several).
        let mut k = 0;
        while k < self.fixups.len() {
            if self.fixups[k].label == l {
                let f = self.fixups.swap_remove(k);
                self.set_displacement(f.end, f.size, at);
            } else {
                k += 1;
            }
        }
    }

    /// Whether every branch to a label has been resolved.
    pub fn is_complete(&self) -> bool {
        self.fixups.is_empty()
    }

    fn set_displacement(&mut self, end: usize, size: usize, target: u64) {
        let field_at = self.base + (end - size) as u64;
        let field = &mut self.bytes[end - size..end];
        if size == 1 {
            let d = i8::try_from(target.wrapping_sub(field_at + 1) as i64)
                .expect("short branch out of range");
            field[0] = d as u8;
        } else {
            let d = rel32(field_at, target).expect("rel32 out of range");
            field.copy_from_slice(&d.to_le_bytes());
        }
    }

    /// A branch whose last `size` bytes (of `opcode` plus the field) go to `l`.
    fn branch_to(&mut self, opcode: &[u8], size: usize, l: Label) {
        self.raw(opcode);
        self.raw(&[0; 4][..size]);
        let end = self.bytes.len();
        match self.labels[l.0] {
            Some(at) => self.set_displacement(end, size, at),
            None => self.fixups.push(Fixup {
                end,
                size,
                label: l,
            }),
        }
    }

    /// A short branch given by its opcode bytes (prefixes included, the
    /// rel8 left off), to `l`: a guest `jrcxz`/`loop` retargeted.
    pub fn short_branch(&mut self, opcode: &[u8], l: Label) {
        self.branch_to(opcode, 1, l);
    }

    /// `jmp rel32` to `l`.
    pub fn jmp_label(&mut self, l: Label) {
        self.branch_to(&[0xe9], 4, l);
    }

    /// `jrcxz l`.
    pub fn jrcxz(&mut self, l: Label) {
        self.branch_to(&[0xe3], 1, l);
    }

    /// `lea r, [rip + l]`: the host address of `l` in `r`.
    pub fn lea_label(&mut self, r: Register, l: Label) {
        let n = r.number() as u8;
        let rex = 0x48 | if n >= 8 { 0x04 } else { 0 };
        // ModRM: mod 00, reg r, r/m 101 (RIP-relative disp32).
        self.branch_to(&[rex, 0x8d, (n & 7) << 3 | 5], 4, l);
    }

    /// `call rel32` to host address `target` (shared code our own
    /// sequences call, pushing on a stack slot known dead).
    pub fn call(&mut self, target: u64) {
        self.raw(&[0xe8, 0, 0, 0, 0]);
        let end = self.bytes.len();
        self.set_displacement(end, 4, target);
    }

    /// `jcc rel32` with condition code `cc` (0..16) to `l`.
    pub fn jcc_label(&mut self, cc: u8, l: Label) {
        self.branch_to(&[0x0f, 0x80 | cc], 4, l);
    }

    /// `jmp short l`.
    pub fn jmp_short(&mut self, l: Label) {
        self.branch_to(&[0xeb], 1, l);
    }

    /// `jcc short l` with condition code `cc` (0..16).
    pub fn jcc_short(&mut self, cc: u8, l: Label) {
        self.branch_to(&[0x70 | cc], 1, l);
    }

    /// `jmp rel32` to host address `target`; returns the address of the
    /// rel32 field (for the linker).
    pub fn jmp(&mut self, target: u64) -> u64 {
        self.raw(&[0xe9, 0, 0, 0, 0]);
        let end = self.bytes.len();
        self.set_displacement(end, 4, target);
        self.base + end as u64 - 4
    }

    /// `jcc rel32` with condition code `cc` (0..16) to host address
    /// `target`; returns the address of the rel32 field.
    pub fn jcc(&mut self, cc: u8, target: u64) -> u64 {
        self.raw(&[0x0f, 0x80 | cc, 0, 0, 0, 0]);
        let end = self.bytes.len();
        self.set_displacement(end, 4, target);
        self.base + end as u64 - 4
    }

    /// `jmp [rip+0]; dq dest`: a jump to anywhere (rel32 overflow).
    pub fn jmp_far(&mut self, dest: u64) {
        let lit = self.here() + 6;
        self.insn(Instruction::with1(
            Code::Jmp_rm64,
            MemoryOperand::with_base_displ(Register::RIP, lit as i64),
        ));
        self.raw(&dest.to_le_bytes());
    }

    /// `mov gs:[disp], r`.
    pub fn store_gs(&mut self, r: Register, disp: u32) {
        self.insn(Instruction::with2(Code::Mov_rm64_r64, gs(disp), r));
    }

    /// `mov r, gs:[disp]`.
    pub fn load_gs(&mut self, r: Register, disp: u32) {
        self.insn(Instruction::with2(Code::Mov_r64_rm64, r, gs(disp)));
    }

    /// `lea dst, [mem]`.
    fn lea(&mut self, dst: Register, mem: MemoryOperand) {
        self.insn(Instruction::with2(Code::Lea_r64_m, dst, mem));
    }

    /// `lea r, [r + 1]`: a flag-free increment.
    fn inc_flag_free(&mut self, r: Register) {
        self.lea(r, based(r, 1));
    }

    /// `lahf; seto al`: the status flags into AX (AH: SF ZF AF PF CF; AL:
    /// OF), for [`Emitter::restore_flags_from_ax`].
    fn save_flags_to_ax(&mut self) {
        self.insn(Ok(Instruction::with(Code::Lahf)));
        self.insn(Instruction::with1(Code::Seto_rm8, Register::AL));
    }

    /// `add al, 0x7f; sahf`: the flags [`Emitter::save_flags_to_ax`] kept
    /// (OF from AL: 0x7f + 1 overflows exactly when AL was 1; the rest
    /// from AH).
    fn restore_flags_from_ax(&mut self) {
        self.insn(Instruction::with2(Code::Add_rm8_imm8, Register::AL, 0x7f));
        self.insn(Ok(Instruction::with(Code::Sahf)));
    }

    /// `not r` (flag-free).
    fn not(&mut self, r: Register) {
        self.insn(Instruction::with1(Code::Not_rm64, r));
    }

    /// `mov dst, src`.
    fn mov(&mut self, dst: Register, src: Register) {
        self.insn(Instruction::with2(Code::Mov_r64_rm64, dst, src));
    }

    /// `mov dst, [mem]`.
    fn load(&mut self, dst: Register, mem: MemoryOperand) {
        self.insn(Instruction::with2(Code::Mov_r64_rm64, dst, mem));
    }

    /// `movzx dst32, src16`: the low 16 bits of a 64-bit register.
    fn movzx16(&mut self, dst: Register, src: Register) {
        self.insn(Instruction::with2(
            Code::Movzx_r32_rm16,
            dst.full_register32(),
            GPR16[src.number()],
        ));
    }

    /// `mov eax, nr; syscall`: an exit to the tool (seccomp traps `nr`).
    pub fn magic_syscall(&mut self, nr: u32) {
        self.insn(Instruction::with2(Code::Mov_r32_imm32, Register::EAX, nr));
        self.syscall();
    }

    /// `mov eax, imm` (flag-free; zero-extends into RAX).
    pub fn mov_eax_imm(&mut self, imm: u32) {
        self.insn(Instruction::with2(Code::Mov_r32_imm32, Register::EAX, imm));
    }

    /// `syscall`.
    fn syscall(&mut self) {
        self.insn(Ok(Instruction::with(Code::Syscall)));
    }

    /// Pads with `nop`s so that a rel32 field `opcode_len` bytes from here
    /// lies within one cache line: the tool may later patch it with one
    /// atomic store while other threads run the code.
    pub fn align_rel32(&mut self, opcode_len: u64) {
        self.align_span(opcode_len + 4);
    }

    /// Pads with `nop`s so that the next `len` bytes lie within one cache line.
    pub fn align_span(&mut self, len: u64) {
        while (self.here() % 64) + len > 64 {
            self.raw(&[0x90]);
        }
    }

    /// `push qword [rip+disp]` addressing the literal at `lit`.
    pub fn push_rip(&mut self, lit: u64) {
        self.insn(Instruction::with1(
            Code::Push_rm64,
            MemoryOperand::with_base_displ(Register::RIP, lit as i64),
        ));
    }

    /// `add qword gs:[off], 1`: a per-thread counter (clobbers flags).
    pub fn add_counter(&mut self, off: u32) {
        self.insn(Instruction::with2(Code::Add_rm64_imm8, gs(off), 1i32));
        self.counter_end = Some(self.here());
    }

    /// Flag-free counter increment through register `r`, which is dead.
    pub fn add_counter_via(&mut self, r: Register, off: u32) {
        let load = self.here();
        self.load_gs(r, off);
        self.inc_flag_free(r);
        self.store_gs(r, off);
        self.counter_updates.push((load, self.here()));
        self.counter_end = Some(self.here());
    }

    /// Flag-preserving counter increment: through RAX, spilled to its slot.
    /// Returns the host address of the update's load.
    pub fn add_counter_keep_flags(&mut self, off: u32) -> u64 {
        self.store_gs(Register::RAX, layout::S_RAX);
        let load = self.here();
        self.add_counter_via(Register::RAX, off);
        self.load_gs(Register::RAX, layout::S_RAX);
        load
    }

    /// `rcx -= key` where `key_not` holds `!key`, then `jrcxz hit`; on a
    /// mismatch RCX is the target again. Flag-free (`lea`, `not`, `jrcxz`).
    fn compare_rcx(&mut self, key_not: Register, hit: Label) {
        self.not(key_not);
        self.lea(
            Register::RCX,
            MemoryOperand::with_base_index_scale_displ_size(Register::RCX, key_not, 1, 1, 1),
        );
        self.jrcxz(hit);
        self.not(key_not);
        self.lea(
            Register::RCX,
            MemoryOperand::with_base_index(Register::RCX, key_not),
        );
    }

    /// Looks up the guest address in RCX in the first
    /// [`layout::INLINE_WAYS`] ways of its home bucket of the
    /// indirect-branch table (at absolute `htab`) and jumps to the
    /// translation found there, with the client's RAX and RCX restored;
    /// otherwise jumps to `probe` (the chunk's probe stub) with the target
    /// still in RCX. The client's RAX and RCX must already be in their
    /// slots; flags are untouched. Each site has its own dispatching `jmp`,
    /// so the processor predicts each site's targets separately. With
    /// `count_hits`, hits are counted in the thread area (`--stats=yes`).
    pub fn lookup(&mut self, htab: u32, probe: u64, count_hits: bool) {
        self.lookup_found(htab, probe, count_hits);
        self.lookup_entry();
        self.jmp_slot();
    }

    /// [`Emitter::lookup`] up to the translation found in the inline ways
    /// (in `S_TARGET`, the client's RAX and RCX still in their slots),
    /// where the code that follows goes on; a miss goes to the probe stub
    /// as there.
    pub fn lookup_found(&mut self, htab: u32, probe: u64, count_hits: bool) {
        self.lookup_found_then(htab, Probe::Jump(probe), count_hits);
    }

    /// [`Emitter::lookup_found`] that goes on after the lookup whether the
    /// target was in the inline ways or found by `probe`: a
    /// [`Emitter::probe_stub`] built `returning`, called over the red zone.
    /// Tagged counting's sites go on to their inline transition either
    /// way (a probe that jumped to the target's context entry would make
    /// each such transition a runtime entry: cc1 probes 4.5 M of its 211 M
    /// lookups).
    pub fn lookup_found_probe_call(&mut self, htab: u32, probe: u64, count_hits: bool) {
        self.lookup_found_then(htab, Probe::Call(probe), count_hits);
    }

    fn lookup_found_then(&mut self, htab: u32, probe: Probe, count_hits: bool) {
        let (rax, rcx) = (Register::RAX, Register::RCX);
        let hits: Vec<Label> = (0..layout::INLINE_WAYS).map(|_| self.new_label()).collect();
        for (way, &hit) in hits.iter().enumerate() {
            // rax = home bucket index * 8; the bucket is at htab + rax * 8.
            self.movzx16(rax, rcx);
            self.lea(rax, indexed(rax, 8, 0));
            self.load(rax, indexed(rax, 8, htab + way as u32 * 16));
            self.compare_rcx(rax, hit);
        }
        let probed = self.new_label();
        match probe {
            Probe::Jump(stub) => {
                self.jmp(stub);
            }
            Probe::Call(stub) => {
                self.lea(Register::RSP, based(Register::RSP, -PROBE_RED_ZONE));
                self.call(stub);
                self.lea(Register::RSP, based(Register::RSP, PROBE_RED_ZONE));
                self.jmp_label(probed);
            }
        }
        // A hit in way k: rax = !key, rcx = 0; rcx becomes the way's offset.
        let dispatch = self.new_label();
        for (way, hit) in hits.into_iter().enumerate().rev() {
            self.bind(hit);
            if way > 0 {
                self.lea(rcx, based(rcx, way as i32 * 16));
                if way > 1 {
                    self.jmp_short(dispatch);
                }
            }
        }
        self.bind(dispatch);
        self.not(rax);
        self.movzx16(rax, rax);
        self.lea(rax, indexed(rax, 8, 0));
        self.lea(rax, MemoryOperand::with_base_index_scale(rcx, rax, 8));
        self.load(rax, based(rax, (htab + 8) as i32));
        self.store_gs(rax, layout::S_TARGET);
        if count_hits {
            self.add_counter_via(rax, layout::S_STAT_INLINE_HITS);
        }
        self.bind(probed);
    }

    /// `jmp gs:[S_TARGET]`: to the translation a lookup found, once the
    /// scratch registers are restored. (The slot is a spill slot, saved
    /// around signal handlers like the others.)
    fn jmp_slot(&mut self) {
        self.insn(Instruction::with1(Code::Jmp_rm64, gs(layout::S_TARGET)));
    }

    /// The probe stub of a chunk, reached from [`Emitter::lookup`] when the
    /// inline-checked ways of the home bucket do not hold the target (in RCX; the client's
    /// RAX and RCX in their slots): checks the bucket's other ways, then
    /// the chained overflow buckets, and jumps to the translation found
    /// with the client's registers restored, or to `miss` with the target
    /// in RCX. Flag-free; R11
    /// is used and restored. This keeps every published target reachable
    /// without an exit, however many targets share a home bucket.
    pub fn probe_stub(&mut self, htab: u32, miss: u64) {
        self.probe_stub_then(htab, miss, false);
    }

    /// The probe stub that [`Emitter::lookup_found_probe_call`] calls:
    /// as [`Emitter::probe_stub`], but a target found returns to the site
    /// with its translation in `S_TARGET` (RAX and RCX still in their
    /// slots); one found nowhere leaves the call and the red zone first.
    pub fn probe_stub_returning(&mut self, htab: u32, miss: u64) {
        self.probe_stub_then(htab, miss, true);
    }

    fn probe_stub_then(&mut self, htab: u32, miss: u64, returning: bool) {
        let (r11, rax, rcx) = (Register::R11, Register::RAX, Register::RCX);
        self.store_gs(r11, layout::S_R11);
        self.store_gs(rcx, layout::S_TARGET);
        self.add_counter_via(r11, layout::S_STAT_PROBES);
        let bucket = self.new_label();
        let first = self.new_label();
        let missed = self.new_label();
        // r11 = home bucket; its first ways were checked inline.
        self.movzx16(r11, rcx);
        self.lea(r11, indexed(r11, 8, 0));
        self.lea(r11, indexed(r11, 8, htab));
        self.jmp_label(first);
        self.bind(bucket);
        for way in 0..layout::BUCKET_WAYS as i32 {
            if way == layout::INLINE_WAYS as i32 {
                self.bind(first);
            }
            let (hit, next) = (self.new_label(), self.new_label());
            self.load(rax, based(r11, way * 16));
            self.compare_rcx(rax, hit);
            self.jmp_short(next);
            self.bind(hit);
            self.load(rcx, based(r11, way * 16 + 8));
            self.store_gs(rcx, layout::S_TARGET);
            self.add_counter_via(r11, layout::S_STAT_PROBE_HITS);
            self.load_gs(r11, layout::S_R11);
            if returning {
                self.raw(&[0xc3]);
            } else {
                self.lookup_entry();
                self.jmp_slot();
            }
            self.bind(next);
        }
        if layout::INLINE_WAYS == layout::BUCKET_WAYS {
            self.bind(first);
        }
        // The next bucket of the chain, if any.
        self.load(rax, based(r11, layout::BUCKET_NEXT as i32));
        self.mov(rcx, rax);
        self.jrcxz(missed);
        self.mov(r11, rcx);
        self.load_gs(rcx, layout::S_TARGET);
        self.jmp_label(bucket);
        self.bind(missed);
        self.load_gs(rcx, layout::S_TARGET);
        self.load_gs(r11, layout::S_R11);
        if returning {
            // (The call's return address and the red zone its site
            // stepped over.)
            self.lea(Register::RSP, based(Register::RSP, PROBE_RED_ZONE + 8));
        }
        self.jmp(miss);
    }

    /// Restores the lookup scratch registers.
    fn lookup_entry(&mut self) {
        self.load_gs(Register::RCX, layout::S_RCX);
        self.load_gs(Register::RAX, layout::S_RAX);
    }

    /// Spills RAX and RCX before an indirect transfer.
    pub fn spill_rax_rcx(&mut self) {
        self.store_gs(Register::RCX, layout::S_RCX);
        self.store_gs(Register::RAX, layout::S_RAX);
    }

    /// `mov rcx, imm64`: a known target for [`Emitter::lookup`].
    pub fn target_rcx(&mut self, guest: u64) {
        self.insn(Instruction::with2(
            Code::Mov_r64_imm64,
            Register::RCX,
            guest,
        ));
    }

    /// `mov rcx, [rsp]; lea rsp, [rsp + 8 + pop]`: a return's target and pop.
    pub fn pop_return(&mut self, pop: u32) {
        self.load(Register::RCX, based(Register::RSP, 0));
        self.lea(Register::RSP, based(Register::RSP, 8 + pop as i32));
    }

    /// An exit stub: saves RAX, RCX, R11 and makes the magic syscall `nr`.
    pub fn exit_stub(&mut self, nr: u32) {
        self.store_gs(Register::RAX, layout::S_RAX);
        self.store_gs(Register::RCX, layout::S_RCX);
        self.store_gs(Register::R11, layout::S_R11);
        self.magic_syscall(nr);
    }

    /// The return stub of native client calls (`VALGRIND_NON_SIMD_CALL`):
    /// the function's result (RAX) into RDX, then the `MAGIC_CALL_RETURN`
    /// exit.
    pub fn call_return_stub() -> Vec<u8> {
        let mut e = Emitter::new(0);
        e.mov(Register::RDX, Register::RAX);
        e.magic_syscall(layout::MAGIC_CALL_RETURN);
        e.bytes
    }

    /// The injection gadget: the injected `syscall` (set up in the
    /// registers), then its result into RDI and the `MAGIC_INJECT` exit.
    pub fn injection_gadget() -> Vec<u8> {
        let mut e = Emitter::new(0);
        e.syscall();
        e.mov(Register::RDI, Register::RAX);
        e.magic_syscall(layout::MAGIC_INJECT);
        e.bytes
    }

    /// The patch gadget (RDI = list of {address, value, size} entries of
    /// 24 bytes, RSI = their number): applies each entry with one aligned
    /// 4- or 8-byte store, so a thread running the patched code sees
    /// either the old or the new value, never a torn one; then makes the
    /// `MAGIC_INJECT` exit. (Writes through /proc or process_vm_writev copy
    /// bytewise and can tear.) Position-independent.
    pub fn patch_gadget() -> Vec<u8> {
        let (rax, rcx, rdx, rsi, rdi) = (
            Register::RAX,
            Register::RCX,
            Register::RDX,
            Register::RSI,
            Register::RDI,
        );
        let mut e = Emitter::new(0);
        let (entry, store4, next) = (e.new_label(), e.new_label(), e.new_label());
        e.bind(entry);
        e.load(rax, based(rdi, 0));
        e.load(rdx, based(rdi, 8));
        e.insn(Instruction::with2(
            Code::Mov_r32_rm32,
            rcx.full_register32(),
            based(rdi, 16),
        ));
        e.insn(Instruction::with2(
            Code::Cmp_rm32_imm8,
            rcx.full_register32(),
            4,
        ));
        e.jcc_short(4, store4); // je
        e.insn(Instruction::with2(Code::Mov_rm64_r64, based(rax, 0), rdx));
        e.jmp_short(next);
        e.bind(store4);
        e.insn(Instruction::with2(
            Code::Mov_rm32_r32,
            based(rax, 0),
            rdx.full_register32(),
        ));
        e.bind(next);
        e.insn(Instruction::with2(Code::Add_rm64_imm8, rdi, 24));
        e.insn(Instruction::with1(Code::Dec_rm64, rsi));
        e.jcc_short(5, entry); // jne
        e.magic_syscall(layout::MAGIC_INJECT);
        e.bytes
    }

    /// The bytes of [`Emitter::exit_stub`], which are the same wherever
    /// they are placed.
    pub fn exit_stub_code(nr: u32) -> Vec<u8> {
        let mut e = Emitter::new(0);
        e.exit_stub(nr);
        e.bytes
    }

    /// The shared miss stub: target in RCX (RAX/RCX already spilled).
    pub fn miss_stub(&mut self, nr: u32) {
        self.store_gs(Register::RCX, layout::S_TARGET);
        self.store_gs(Register::R11, layout::S_R11);
        self.magic_syscall(nr);
    }

    /// A guest `syscall`: the number's byte in the interest table at
    /// absolute `systab` says whether it runs natively right here
    /// ([`layout::SYSTAB_NATIVE`]), the tool wants to see it (a magic exit,
    /// with the number in the RAX slot) or it is an `rt_sigreturn` the
    /// stub at absolute `sigreturn` handles (entered with R11 = the exit,
    /// where it goes when it needs the tool). RCX and R11 are free (the
    /// syscall clobbers them); flags are preserved. Returns the host
    /// address where the tool's stop is seen (just after the magic
    /// syscall); the tool either turns the magic syscall into the real one,
    /// which then returns there, or sets RIP.
    pub fn syscall_gate(&mut self, systab: u32, sigreturn: u32, nr: u32) -> u64 {
        let (native, done, stub) = (self.new_label(), self.new_label(), self.new_label());
        self.movzx16(Register::R11, Register::RAX);
        self.insn(Instruction::with2(
            Code::Movzx_r32_rm8,
            Register::R11D,
            MemoryOperand::with_base_displ_size(Register::R11, systab as i64, 8),
        ));
        self.mov(Register::RCX, Register::R11);
        self.jrcxz(native);
        self.lea(
            Register::RCX,
            MemoryOperand::with_base_displ(Register::R11, -i64::from(layout::SYSTAB_SIGRETURN)),
        );
        self.jrcxz(stub);
        let exit = self.new_label();
        self.jmp_short(exit);
        self.bind(stub);
        // The exit's address: after these 5 + 10 + 2 bytes.
        let exit_at = self.here() + 17;
        self.insn(Instruction::with2(
            Code::Mov_r32_imm32,
            Register::ECX,
            sigreturn,
        ));
        self.insn(Instruction::with2(
            Code::Mov_r64_imm64,
            Register::R11,
            exit_at,
        ));
        self.insn(Instruction::with1(Code::Jmp_rm64, Register::RCX));
        self.bind(exit);
        assert_eq!(self.here(), exit_at, "stub jump of the syscall gate");
        self.store_gs(Register::RAX, layout::S_RAX);
        self.magic_syscall(nr);
        // The tool resumes a syscall it turned into the real one right
        // after its stop, at the native `syscall` (`on_sigreturn`).
        let stop = self.here();
        self.jmp_short(done);
        self.bind(native);
        self.syscall();
        self.bind(done);
        stop
    }

    /// Before `rep movs/stos/lods/ins/outs`: adds RCX + 1 (Cachegrind's
    /// count, known before it runs) to the counter at `ctr`. Flag-free.
    /// Returns the host address of the update's load.
    pub fn count_rep(&mut self, ctr: u32) -> u64 {
        self.store_gs(Register::RAX, layout::S_RAX);
        let load = self.here();
        self.load_gs(Register::RAX, ctr);
        self.lea(
            Register::RAX,
            MemoryOperand::with_base_index_scale_displ_size(Register::RAX, Register::RCX, 1, 1, 1),
        );
        self.store_gs(Register::RAX, ctr);
        self.counter_updates.push((load, self.here()));
        self.load_gs(Register::RAX, layout::S_RAX);
        load
    }

    /// Before `repe/repne cmps/scas`: keeps RCX for [`Emitter::count_cond_rep_after`].
    pub fn count_cond_rep_before(&mut self) {
        self.store_gs(Register::RCX, layout::S_RCX0);
    }

    /// After `repe/repne cmps/scas` (`repe` says which): adds Cachegrind's
    /// count to the counter at `ctr`: the k iterations that ran, plus one
    /// when it stopped on RCX = 0 with the condition still holding (or
    /// never ran). Flag-free; RAX and RDX are restored.
    pub fn count_cond_rep_after(&mut self, ctr: u32, repe: bool) {
        let (rax, rcx, rdx) = (Register::RAX, Register::RCX, Register::RDX);
        let (exhausted, extra, add) = (self.new_label(), self.new_label(), self.new_label());
        self.store_gs(rax, layout::S_RAX);
        self.store_gs(rdx, layout::S_RDX);
        // k = rcx0 - rcx = rcx0 + !rcx + 1.
        self.load_gs(rax, layout::S_RCX0);
        self.mov(rdx, rcx);
        self.not(rdx);
        self.lea(
            rax,
            MemoryOperand::with_base_index_scale_displ_size(rax, rdx, 1, 1, 1),
        );
        self.jrcxz(exhausted);
        self.jmp_short(add);
        self.bind(exhausted);
        // RCX = 0: one more unless the condition failed on the last
        // iteration (k = 0 means it never ran: one more too).
        self.mov(rcx, rax);
        self.jrcxz(extra);
        self.insn(Instruction::with2(Code::Mov_r32_imm32, Register::ECX, 0u32));
        self.jcc_short(if repe { 4 } else { 5 }, extra); // jz / jnz: condition held
        self.jmp_short(add);
        self.bind(extra);
        self.inc_flag_free(rax);
        self.bind(add);
        let load = self.here();
        self.load_gs(rdx, ctr);
        self.lea(rdx, MemoryOperand::with_base_index(rdx, rax));
        self.store_gs(rdx, ctr);
        self.counter_updates.push((load, self.here()));
        self.load_gs(rdx, layout::S_RDX);
        self.load_gs(rax, layout::S_RAX);
    }

    /// Pads with `int3` to an 8-byte boundary (literals are aligned).
    pub fn align8(&mut self) {
        while self.here() & 7 != 0 {
            self.raw(&[0xcc]);
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use iced_x86::{Decoder, DecoderOptions, Formatter, IntelFormatter};

    #[test]
    fn the_patch_gadget_stores_each_entry_by_its_size_and_loops() {
        let code = Emitter::patch_gadget();
        let insns: Vec<_> = Decoder::with_ip(64, &code, 0x1000, DecoderOptions::NONE)
            .into_iter()
            .collect();
        let find = |m: iced_x86::Mnemonic| insns.iter().find(|i| i.mnemonic() == m).unwrap();
        assert_eq!(find(iced_x86::Mnemonic::Jne).near_branch_target(), 0x1000);
        let store4 = find(iced_x86::Mnemonic::Je).near_branch_target();
        let at = |ip: u64| insns.iter().find(|i| i.ip() == ip).unwrap();
        assert_eq!(at(store4).code(), Code::Mov_rm32_r32);
        let next = find(iced_x86::Mnemonic::Jmp).near_branch_target();
        assert_eq!(at(next).code(), Code::Add_rm64_imm8);
        assert_magic_exit(&insns[insns.len() - 2..]);
    }

    /// `mov eax, MAGIC_INJECT; syscall`.
    fn assert_magic_exit(insns: &[iced_x86::Instruction]) {
        assert_eq!(insns[0].code(), Code::Mov_r32_imm32);
        assert_eq!(insns[0].immediate32(), layout::MAGIC_INJECT);
        assert_eq!(insns[1].code(), Code::Syscall);
    }

    #[test]
    fn the_injection_gadget_starts_with_the_injected_syscall() {
        let code = Emitter::injection_gadget();
        assert_eq!(disasm_at(&code[..5], 0), vec!["syscall", "mov rdi,rax"]);
        let insns: Vec<_> = Decoder::with_ip(64, &code[5..], 0, DecoderOptions::NONE)
            .into_iter()
            .collect();
        assert_magic_exit(&insns);
    }

    #[test]
    fn an_exit_stub_is_the_same_bytes_anywhere() {
        let mut far = Emitter::new(0x7f00_1234_5000);
        far.exit_stub(layout::MAGIC_LINK);
        assert_eq!(far.bytes, Emitter::exit_stub_code(layout::MAGIC_LINK));
    }

    /// Intel-syntax lines of `bytes` at `base` (for tests here and in
    /// `translate`).
    pub(crate) fn disasm_at(bytes: &[u8], base: u64) -> Vec<String> {
        let mut d = Decoder::with_ip(64, bytes, base, DecoderOptions::NONE);
        let mut f = IntelFormatter::new();
        let mut out = Vec::new();
        for i in &mut d {
            let mut s = String::new();
            f.format(&i, &mut s);
            out.push(s);
        }
        out
    }

    fn disasm(e: &Emitter) -> Vec<String> {
        assert!(e.is_complete());
        disasm_at(&e.bytes, e.base)
    }

    /// Address of the first instruction whose text starts with `prefix`.
    fn addr_of(e: &Emitter, prefix: &str) -> u64 {
        let mut d = Decoder::with_ip(64, &e.bytes, e.base, DecoderOptions::NONE);
        let mut f = IntelFormatter::new();
        for i in &mut d {
            let mut s = String::new();
            f.format(&i, &mut s);
            if s.starts_with(prefix) {
                return i.ip();
            }
        }
        panic!("no {prefix}");
    }

    #[test]
    fn lea_label_gives_the_labels_address() {
        let mut e = Emitter::new(0x1000);
        let l = e.new_label();
        e.lea_label(Register::R11, l);
        e.lea_label(Register::RCX, l);
        e.raw(&[0x90; 3]);
        e.bind(l);
        assert_eq!(disasm(&e)[..2], ["lea r11,[1011h]", "lea rcx,[1011h]"]);
    }

    #[test]
    fn labels_resolve_forward_and_backward() {
        let mut e = Emitter::new(0x1000);
        let back = e.new_label();
        let fwd = e.new_label();
        e.bind(back);
        e.jrcxz(fwd);
        e.jmp_short(back);
        e.bind(fwd);
        assert_eq!(
            disasm(&e),
            vec!["jrcxz 0000000000001004h", "jmp short 0000000000001000h"]
        );
    }

    #[test]
    #[should_panic(expected = "short branch out of range")]
    fn short_branch_range_is_checked() {
        let mut e = Emitter::new(0x1000);
        let l = e.new_label();
        e.jrcxz(l);
        e.raw(&[0x90; 200]);
        e.bind(l);
    }

    #[test]
    fn lookup_checks_the_inline_ways_and_dispatches_through_the_bucket() {
        let mut e = Emitter::new(0x1000);
        e.lookup(0x7010_0000, 0x2000, false);
        let d = disasm(&e);
        assert_eq!(d[0], "movzx eax,cx");
        assert_eq!(d[1], "lea rax,[rax*8]");
        assert_eq!(d[2], "mov rax,[rax*8+70100000h]");
        assert_eq!(d[3], "not rax");
        assert_eq!(d[4], "lea rcx,[rcx+rax+1]");
        assert!(d[5].starts_with("jrcxz"));
        assert_eq!(d[10], "mov rax,[rax*8+70100010h]");
        assert_eq!(d[18], "mov rax,[rax*8+70100020h]");
        assert_eq!(d[24], "jmp 0000000000002000h");
        let mut dec = Decoder::with_ip(64, &e.bytes, e.base, DecoderOptions::NONE);
        let insns: Vec<_> = (&mut dec).into_iter().collect();
        // Way 2 sets rcx = 32 and jumps to the dispatch; way 1 sets 16 and
        // falls into it; way 0 lands on it with rcx = 0.
        assert_eq!(insns[25].ip(), insns[21].near_branch_target());
        assert_eq!(d[25], "lea rcx,[rcx+20h]");
        assert_eq!(insns[27].ip(), insns[13].near_branch_target());
        assert_eq!(d[27], "lea rcx,[rcx+10h]");
        assert_eq!(insns[28].ip(), insns[5].near_branch_target());
        assert_eq!(insns[28].ip(), insns[26].near_branch_target());
        assert_eq!(
            d[28..],
            [
                "not rax",
                "movzx eax,ax",
                "lea rax,[rax*8]",
                "lea rax,[rcx+rax*8]",
                "mov rax,[rax+70100008h]",
                "mov gs:[18h],rax",
                "mov rcx,gs:[8]",
                "mov rax,gs:[0]",
                "jmp qword ptr gs:[18h]"
            ]
        );
    }

    #[test]
    fn lookup_counts_hits_only_when_asked() {
        let mut e = Emitter::new(0x1000);
        e.lookup(0x7010_0000, 0x2000, true);
        assert!(disasm(&e).iter().any(|l| l == "mov gs:[100h],rax"));
        let mut e = Emitter::new(0x1000);
        e.lookup(0x7010_0000, 0x2000, false);
        assert!(!disasm(&e).iter().any(|l| l.contains("gs:[100h]")));
    }

    #[test]
    fn probe_stub_walks_ways_and_chain_without_touching_flags() {
        let mut e = Emitter::new(0x1000);
        e.probe_stub(0x7010_0000, 0x3000);
        let d = disasm(&e);
        // Only flag-free instructions.
        for l in &d {
            let m = l.split_whitespace().next().unwrap();
            assert!(
                ["mov", "lea", "not", "movzx", "jrcxz", "jmp"].contains(&m),
                "{l}"
            );
        }
        assert!(d.contains(&"mov rax,[r11+10h]".to_string()));
        assert!(d.contains(&"mov rax,[r11+20h]".to_string()));
        assert!(d.contains(&"mov rax,[r11]".to_string()));
        assert!(d.contains(&"mov rax,[r11+30h]".to_string()));
        assert!(d.contains(&"jmp 0000000000003000h".to_string()));
        assert_eq!(
            d.iter().filter(|l| *l == "jmp qword ptr gs:[18h]").count(),
            3
        );
    }

    #[test]
    fn syscall_gate_reaches_native_syscall_or_exit() {
        let mut e = Emitter::new(0x1000);
        let stop = e.syscall_gate(0x7000_0000, 0x7001_0400, 0xc05c02);
        let d = disasm(&e);
        assert_eq!(d[0], "movzx r11d,ax");
        assert_eq!(d[1], "movzx r11d,byte ptr [r11+70000000h]");
        assert!(d[3].starts_with("jrcxz"));
        let native = addr_of(&e, "syscall");
        // The first syscall is the magic one; the native one follows the jmp.
        assert_eq!(native + 2, stop);
        assert!(d.last().unwrap() == "syscall");
        // After the stop's jump over it, the native syscall (where the
        // tool resumes a syscall it handled as the real one).
        let after_stop = disasm_at(&e.bytes[(stop + 2 - 0x1000) as usize..], stop + 2);
        assert_eq!(after_stop[0], "syscall");
        // Byte 2: on to the rt_sigreturn stub, with the exit in R11.
        assert_eq!(d[4], "lea rcx,[r11-2]");
        assert!(d[5].starts_with("jrcxz"));
        let exit = addr_of(&e, "mov gs:[0],rax");
        let stub = d
            .iter()
            .position(|s| s == "jmp rcx")
            .expect("jump to the stub");
        assert_eq!(d[stub - 2], "mov ecx,70010400h");
        assert_eq!(d[stub - 1], format!("mov r11,{exit:X}h"));
    }

    #[test]
    fn far_jump_reads_the_following_literal() {
        let mut e = Emitter::new(0x1000);
        e.jmp_far(0x1122_3344_5566);
        assert_eq!(e.bytes.len(), 14);
        assert_eq!(disasm_at(&e.bytes[..6], 0x1000), ["jmp qword ptr [1006h]"]);
        assert_eq!(e.bytes[6..], 0x1122_3344_5566u64.to_le_bytes());
    }

    #[test]
    fn gs_spills_and_counters() {
        let mut e = Emitter::new(0x1000);
        e.store_gs(Register::R11, 16);
        e.load_gs(Register::RCX, 8);
        e.add_counter(0x3000);
        e.add_counter_via(Register::R12, 0x3008);
        let d = disasm(&e);
        assert_eq!(d[0], "mov gs:[10h],r11");
        assert_eq!(d[1], "mov rcx,gs:[8]");
        assert_eq!(d[2], "add qword ptr gs:[3000h],1");
        assert_eq!(d[3], "mov r12,gs:[3008h]");
        assert_eq!(d[4], "lea r12,[r12+1]");
        assert_eq!(d[5], "mov gs:[3008h],r12");
    }

    #[test]
    fn conditional_rep_count_assembles() {
        let mut e = Emitter::new(0x1000);
        e.count_cond_rep_before();
        e.count_cond_rep_after(0x2000, true);
        let d = disasm(&e);
        assert!(d.iter().any(|l| l.starts_with("je short")), "{d:?}");
        assert!(d.iter().any(|l| l == "lea rdx,[rdx+rax]"), "{d:?}");
    }
}
