//! Stack unwinding from call frame information (`.eh_frame`), as
//! Valgrind's stack traces do it on amd64: for each frame, the CFI row of
//! its instruction gives the canonical frame address (CFA, from RSP or
//! RBP) and where the return address and the caller's RBP were saved;
//! code without CFI falls back to the frame-pointer chain.
//!
//! The unwinder reads no process: it takes the registers and a copy of the
//! stack ([`StackCopy`]) made while the thread was stopped, and the
//! process's mappings to find each frame's object and file address.

use crate::{Mapping, Symbolizer};
use gimli::{
    BaseAddresses, CfaRule, EhFrame, LittleEndian, RegisterRule, UnwindContext, UnwindSection,
    X86_64,
};
use object::{Object, ObjectSection};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// The registers unwinding starts from, and a copy of the stack from RSP
/// up (as much as could be read).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StackCopy {
    /// Instruction address of the innermost frame.
    pub rip: u64,
    /// Its stack pointer: the address of `bytes[0]`.
    pub rsp: u64,
    /// Its frame pointer.
    pub rbp: u64,
    /// The stack's contents from `rsp` on.
    pub bytes: Vec<u8>,
}

impl StackCopy {
    /// The 8-byte word at `addr`, if the copy holds it.
    fn word(&self, addr: u64) -> Option<u64> {
        let off = usize::try_from(addr.checked_sub(self.rsp)?).ok()?;
        let b = self.bytes.get(off..off.checked_add(8)?)?;
        Some(u64::from_le_bytes(b.try_into().ok()?))
    }
}

/// How to find a frame's caller: the CFA is `base + cfa_offset`; the
/// return address is saved at CFA + `ra_at`, the caller's RBP at CFA +
/// `rbp_at` (unchanged when `None`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FrameRule {
    cfa_from_rbp: bool,
    cfa_offset: i64,
    ra_at: i64,
    rbp_at: Option<i64>,
}

/// One object's `.eh_frame`, with the addresses its pointer encodings
/// are relative to.
struct Cfi {
    section: Vec<u8>,
    bases: BaseAddresses,
}

impl Cfi {
    fn read(path: &Path) -> Option<Cfi> {
        let data = std::fs::read(path).ok()?;
        let file = object::File::parse(&*data).ok()?;
        let eh = file.section_by_name(".eh_frame")?;
        let mut bases = BaseAddresses::default().set_eh_frame(eh.address());
        if let Some(text) = file.section_by_name(".text") {
            bases = bases.set_text(text.address());
        }
        if let Some(got) = file.section_by_name(".got") {
            bases = bases.set_got(got.address());
        }
        Some(Cfi {
            section: eh.data().ok()?.to_vec(),
            bases,
        })
    }

    /// The rule of the code at file address `svma`.
    fn rule(&self, svma: u64) -> Option<FrameRule> {
        let eh = EhFrame::new(&self.section, LittleEndian);
        let mut ctx = UnwindContext::new();
        let row = eh
            .unwind_info_for_address(&self.bases, &mut ctx, svma, EhFrame::cie_from_offset)
            .ok()?;
        let CfaRule::RegisterAndOffset { register, offset } = *row.cfa() else {
            return None; // an expression (PLT stubs): the fallback's
        };
        let cfa_from_rbp = match register {
            X86_64::RSP => false,
            X86_64::RBP => true,
            _ => return None,
        };
        let Some(RegisterRule::Offset(ra_at)) = row.register(X86_64::RA) else {
            return None;
        };
        let rbp_at = match row.register(X86_64::RBP) {
            Some(RegisterRule::Offset(at)) => Some(at),
            _ => None,
        };
        Some(FrameRule {
            cfa_from_rbp,
            cfa_offset: offset,
            ra_at,
            rbp_at,
        })
    }
}

/// Walks stacks; keeps each object's CFI once read.
#[derive(Default)]
pub struct Unwinder {
    objects: HashMap<PathBuf, Option<Cfi>>,
}

impl Unwinder {
    /// An unwinder that has read nothing yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// The return addresses of the callers of the frame `stack` starts
    /// in, innermost first, at most `max`: unwinding stops at an address no
    /// mapping holds, a word outside the copy, or a frame that makes no
    /// progress. `symbols` finds each frame's object among `mappings`.
    pub fn callers(
        &mut self,
        symbols: &mut Symbolizer,
        mappings: &[Mapping],
        stack: &StackCopy,
        max: usize,
    ) -> Vec<u64> {
        let (mut rip, mut rsp, mut rbp) = (stack.rip, stack.rsp, stack.rbp);
        let mut out = Vec::new();
        while out.len() < max {
            // A caller's return address is past its call: its CFI row is
            // the call's (the innermost frame is at its own instruction).
            let at = if out.is_empty() { rip } else { rip - 1 };
            let rule = symbols
                .file_address(mappings, at)
                .and_then(|(path, svma)| self.cfi(&path)?.rule(svma));
            let (ra, next_rsp, next_rbp) = match rule {
                Some(r) => {
                    let base = if r.cfa_from_rbp { rbp } else { rsp };
                    let cfa = base.wrapping_add_signed(r.cfa_offset);
                    let Some(ra) = stack.word(cfa.wrapping_add_signed(r.ra_at)) else {
                        break;
                    };
                    let rbp = match r.rbp_at {
                        Some(off) => match stack.word(cfa.wrapping_add_signed(off)) {
                            Some(v) => v,
                            None => break,
                        },
                        None => rbp,
                    };
                    (ra, cfa, rbp)
                }
                // No CFI: the frame-pointer chain, if RBP points into the
                // stack above this frame.
                None => {
                    if rbp < rsp {
                        break;
                    }
                    let (Some(ra), Some(caller_rbp)) = (stack.word(rbp + 8), stack.word(rbp))
                    else {
                        break;
                    };
                    (ra, rbp + 16, caller_rbp)
                }
            };
            if ra == 0 || next_rsp <= rsp || !mappings.iter().any(|m| m.start <= ra && ra < m.end) {
                break;
            }
            out.push(ra);
            (rip, rsp, rbp) = (ra, next_rsp, next_rbp);
        }
        out
    }

    fn cfi(&mut self, path: &Path) -> Option<&Cfi> {
        self.objects
            .entry(path.to_path_buf())
            .or_insert_with(|| Cfi::read(path))
            .as_ref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_outside_the_copy_are_not_read() {
        let s = StackCopy {
            rip: 0,
            rsp: 0x1000,
            rbp: 0,
            bytes: (0u8..16).collect(),
        };
        assert_eq!(s.word(0x1000), Some(0x0706_0504_0302_0100));
        assert_eq!(s.word(0x1008), Some(0x0f0e_0d0c_0b0a_0908));
        assert_eq!(s.word(0x1009), None);
        assert_eq!(s.word(0xff8), None);
    }

    #[test]
    fn a_frame_without_cfi_or_frame_pointer_ends_the_walk() {
        // Nothing mapped: no object, no CFI; RBP below RSP.
        let s = StackCopy {
            rip: 0x40_0000,
            rsp: 0x1000,
            rbp: 0x10,
            bytes: vec![0; 64],
        };
        let mut u = Unwinder::new();
        assert!(u.callers(&mut Symbolizer::new(), &[], &s, 12).is_empty());
    }
}
