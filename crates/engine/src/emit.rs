//! A byte buffer for the handful of instructions the engine emits itself
//! (spills through GS, exits, lookups, counters). They are hand-encoded so
//! that every branch has a fixed rel32 field the linker can patch later.

/// General-purpose register numbers in x86 encoding order.
#[allow(missing_docs)]
pub mod reg {
    pub const RAX: u8 = 0;
    pub const RCX: u8 = 1;
    pub const RDX: u8 = 2;
    pub const R11: u8 = 11;
}

/// Code being emitted at a known host address.
pub struct Emitter {
    /// Host address of `bytes[0]`.
    pub base: u64,
    /// The encoded bytes.
    pub bytes: Vec<u8>,
}

impl Emitter {
    /// An empty buffer that will live at host address `base`.
    pub fn new(base: u64) -> Self {
        Emitter {
            base,
            bytes: Vec::with_capacity(512),
        }
    }

    /// Host address of the next byte.
    pub fn here(&self) -> u64 {
        self.base + self.bytes.len() as u64
    }

    /// Appends raw bytes.
    pub fn raw(&mut self, b: &[u8]) {
        self.bytes.extend_from_slice(b);
    }

    fn u32(&mut self, v: u32) {
        self.bytes.extend_from_slice(&v.to_le_bytes());
    }

    /// rel32 from the end of a 4-byte field starting at `here()` to `target`.
    fn rel32_to(&self, target: u64, extra: u64) -> u32 {
        let next = self.here() + 4 + extra;
        let d = target.wrapping_sub(next) as i64;
        debug_assert!(
            d >= i32::MIN as i64 && d <= i32::MAX as i64,
            "rel32 out of range"
        );
        d as i32 as u32
    }

    /// `mov gs:[disp], r64`.
    pub fn store_gs(&mut self, r: u8, disp: u32) {
        self.raw(&[0x65, 0x48 | ((r >> 3) << 2), 0x89, ((r & 7) << 3) | 4, 0x25]);
        self.u32(disp);
    }

    /// `mov r64, gs:[disp]`.
    pub fn load_gs(&mut self, r: u8, disp: u32) {
        self.raw(&[0x65, 0x48 | ((r >> 3) << 2), 0x8b, ((r & 7) << 3) | 4, 0x25]);
        self.u32(disp);
    }

    /// `mov eax, imm32; syscall`.
    pub fn magic_syscall(&mut self, nr: u32) {
        self.raw(&[0xb8]);
        self.u32(nr);
        self.raw(&[0x0f, 0x05]);
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

    /// `jmp rel32`; returns the host address of the rel32 field.
    pub fn jmp(&mut self, target: u64) -> u64 {
        self.raw(&[0xe9]);
        let at = self.here();
        let r = self.rel32_to(target, 0);
        self.u32(r);
        at
    }

    /// `jcc rel32` with condition code `cc` (0..16); returns the rel32 field.
    pub fn jcc(&mut self, cc: u8, target: u64) -> u64 {
        self.raw(&[0x0f, 0x80 | cc]);
        let at = self.here();
        let r = self.rel32_to(target, 0);
        self.u32(r);
        at
    }

    /// `push qword [rip+disp]` addressing `lit`.
    pub fn push_rip(&mut self, lit: u64) {
        self.raw(&[0xff, 0x35]);
        let r = self.rel32_to(lit, 0);
        self.u32(r);
    }

    /// `add qword gs:[off], 1`: a per-thread counter (clobbers flags).
    pub fn add_counter(&mut self, off: u32) {
        self.raw(&[0x65, 0x48, 0x83, 0x04, 0x25]);
        self.u32(off);
        self.raw(&[0x01]);
    }

    /// Flag-free counter increment through register `r`, which is dead.
    pub fn add_counter_via(&mut self, r: u8, off: u32) {
        self.load_gs(r, off);
        // lea r, [r+1]
        let ext = r >> 3;
        let low = r & 7;
        self.raw(&[0x48 | (ext << 2) | ext, 0x8d, 0x40 | (low << 3) | low]);
        if low == 4 {
            self.raw(&[0x24]); // SIB for r12 as base
        }
        self.raw(&[0x01]);
        self.store_gs(r, off);
    }

    /// Flag-preserving counter increment: through RAX, spilled to the slot.
    pub fn add_counter_keep_flags(&mut self, off: u32) {
        self.store_gs(reg::RAX, crate::layout::S_RAX);
        self.load_gs(reg::RAX, off);
        self.raw(&[0x48, 0x8d, 0x40, 0x01]); // lea rax,[rax+1]
        self.store_gs(reg::RAX, off);
        self.load_gs(reg::RAX, crate::layout::S_RAX);
    }

    /// Looks up the guest address in RCX in the indirect-branch table and
    /// jumps to its translation; on a miss jumps to `miss` with the target
    /// still in RCX. The client's RAX and RCX must already be in the slot;
    /// flags are untouched (only `lea`, `not`, `movzx`, `jrcxz`).
    pub fn lookup(&mut self, htab: u32, miss: u64) {
        self.raw(&[0x0f, 0xb7, 0xc1]); // movzx eax, cx
        self.raw(&[0x48, 0x8d, 0x04, 0x00]); // lea rax,[rax+rax]
        self.raw(&[0x48, 0x8b, 0x04, 0xc5]); // mov rax,[rax*8+htab]
        self.u32(htab);
        self.raw(&[0x48, 0xf7, 0xd0]); // not rax
        self.raw(&[0x48, 0x8d, 0x4c, 0x01, 0x01]); // lea rcx,[rcx+rax+1]
        self.raw(&[0xe3, 0x0c]); // jrcxz hit (+12)
        self.raw(&[0x48, 0xf7, 0xd0]); // not rax            (3)
        self.raw(&[0x48, 0x8d, 0x0c, 0x01]); // lea rcx,[rcx+rax] (4)
        self.jmp(miss); //                                      (5)
                        // hit:
        self.raw(&[0x48, 0xf7, 0xd0]); // not rax
        self.raw(&[0x0f, 0xb7, 0xc8]); // movzx ecx, ax
        self.raw(&[0x48, 0x8d, 0x0c, 0x09]); // lea rcx,[rcx+rcx]
        self.raw(&[0xff, 0x24, 0xcd]); // jmp [rcx*8+htab+8]
        self.u32(htab + 8);
    }

    /// The entry of a block reached through the indirect-branch table, with
    /// the target in RAX (see [`Emitter::lookup`]): if it is not `guest`,
    /// goes to the miss stub with the target in RCX; else restores the
    /// lookup's scratch registers and jumps to `body`. Flags untouched.
    pub fn checked_entry(&mut self, guest: u64, body: u64, miss: u64) {
        self.raw(&[0x48, 0xb9]); // mov rcx, imm64
        self.raw(&guest.to_le_bytes());
        self.raw(&[0x48, 0xf7, 0xd1]); // not rcx
        self.raw(&[0x48, 0x8d, 0x4c, 0x01, 0x01]); // lea rcx,[rcx+rax+1]
        self.raw(&[0xe3, 3 + 5]); // jrcxz ok
        self.raw(&[0x48, 0x89, 0xc1]); // mov rcx, rax
        self.jmp(miss);
        // ok:
        self.lookup_entry();
        self.jmp(body);
    }

    /// Restores the lookup scratch registers (the entry of a block reached
    /// through the table).
    pub fn lookup_entry(&mut self) {
        self.load_gs(reg::RCX, crate::layout::S_RCX);
        self.load_gs(reg::RAX, crate::layout::S_RAX);
    }

    /// Spills RAX and RCX before an indirect transfer.
    pub fn spill_rax_rcx(&mut self) {
        self.store_gs(reg::RCX, crate::layout::S_RCX);
        self.store_gs(reg::RAX, crate::layout::S_RAX);
    }

    /// `mov rcx, [rsp]; lea rsp, [rsp + 8 + pop]`: a return's target and pop.
    pub fn pop_return(&mut self, pop: u32) {
        self.raw(&[0x48, 0x8b, 0x0c, 0x24]);
        self.raw(&[0x48, 0x8d, 0xa4, 0x24]);
        self.u32(8 + pop);
    }

    /// An exit stub: saves RAX, RCX, R11 and makes the magic syscall `nr`.
    pub fn exit_stub(&mut self, nr: u32) {
        self.store_gs(reg::RAX, crate::layout::S_RAX);
        self.store_gs(reg::RCX, crate::layout::S_RCX);
        self.store_gs(reg::R11, crate::layout::S_R11);
        self.magic_syscall(nr);
    }

    /// The shared miss stub: target in RCX (RAX/RCX already spilled).
    pub fn miss_stub(&mut self, nr: u32) {
        self.store_gs(reg::RCX, crate::layout::S_TARGET);
        self.store_gs(reg::R11, crate::layout::S_R11);
        self.magic_syscall(nr);
    }

    /// Pads with `int3` to an 8-byte boundary (literals are aligned).
    pub fn align8(&mut self) {
        while self.here() & 7 != 0 {
            self.raw(&[0xcc]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use iced_x86::{Decoder, DecoderOptions, Formatter, IntelFormatter};

    fn disasm(e: &Emitter) -> Vec<String> {
        let mut d = Decoder::with_ip(64, &e.bytes, e.base, DecoderOptions::NONE);
        let mut f = IntelFormatter::new();
        let mut out = Vec::new();
        for i in &mut d {
            let mut s = String::new();
            f.format(&i, &mut s);
            out.push(s);
        }
        out
    }

    #[test]
    fn lookup_sequence_decodes_as_intended() {
        let mut e = Emitter::new(0x1000);
        e.lookup(0x7002_0000, 0x2000);
        let d = disasm(&e);
        assert_eq!(d[0], "movzx eax,cx");
        assert_eq!(d[2], "mov rax,[rax*8+70020000h]");
        assert_eq!(d[5], "jrcxz 0000000000001025h");
        // The jrcxz must land on the `not rax` after the miss jump.
        let mut dec = Decoder::with_ip(64, &e.bytes, e.base, DecoderOptions::NONE);
        let ips: Vec<u64> = (&mut dec).into_iter().map(|i| i.ip()).collect();
        assert!(ips.contains(&0x1025));
        assert_eq!(d[9], "not rax");
        assert_eq!(d[12], "jmp qword ptr [rcx*8+70020008h]");
    }

    #[test]
    fn checked_entry_compares_rax_with_its_guest() {
        let mut e = Emitter::new(0x1000);
        e.checked_entry(0x4444_5555, 0x9000, 0x2000);
        let d = disasm(&e);
        assert_eq!(d[0], "mov rcx,44445555h");
        assert_eq!(d[3], "jrcxz 000000000000101Ch");
        assert_eq!(d[5], "jmp 0000000000002000h");
        // jrcxz lands on the register restore.
        let mut dec = Decoder::with_ip(64, &e.bytes, e.base, DecoderOptions::NONE);
        let at: Vec<u64> = (&mut dec).into_iter().map(|i| i.ip()).collect();
        assert_eq!(at[6], 0x101c);
        assert_eq!(d[6], "mov rcx,gs:[8]");
        assert_eq!(d[8], "jmp 0000000000009000h");
    }

    #[test]
    fn gs_spills_and_counters() {
        let mut e = Emitter::new(0x1000);
        e.store_gs(reg::R11, 16);
        e.load_gs(reg::RCX, 8);
        e.add_counter(0x3000);
        let d = disasm(&e);
        assert_eq!(d[0], "mov gs:[10h],r11");
        assert_eq!(d[1], "mov rcx,gs:[8]");
        assert_eq!(d[2], "add qword ptr gs:[3000h],1");
    }
}
