//! Where a thread inside code that an asynchronous signal waits out can
//! next leave it: tagged counting's quiet ranges (inline calls and
//! returns, their shared stubs: `Contexts::in_quiet`), or a trace-mode
//! block's open record (`translate::RecordSpan`). The breakpoints let the
//! signal wait with one resume instead of a single step per instruction
//! (a ptrace stop costs tens of microseconds; a quiet sequence or a block
//! is up to a few hundred instructions).
//!
//! The code is followed statically from the thread's RIP: straight on,
//! both ways at a conditional branch, into a direct call's target (its
//! return is a stop of its own). Every way out is a breakpoint: the first
//! address outside the quiet ranges a direct transfer or a fall-through
//! reaches, or an indirect transfer (`ret`, `jmp reg`) itself, whose
//! target is known only when it runs (the thread is stepped over it, then
//! looked at again).

use iced_x86::{Decoder, DecoderOptions, FlowControl};

/// Most instructions followed before giving up (a stub is a few hundred).
const MAX_FOLLOWED: usize = 4096;

/// The breakpoints out of the quiet code from `rip` (sorted, distinct), or
/// `None` if it cannot be followed (an instruction that traps or does not
/// decode, or too much code). `range_of(a)` is the quiet range holding `a`
/// (`None`: `a` is outside them), `code(range)` its bytes.
pub fn exits(
    rip: u64,
    mut range_of: impl FnMut(u64) -> Option<std::ops::Range<u64>>,
    mut code: impl FnMut(&std::ops::Range<u64>) -> Option<Vec<u8>>,
) -> Option<Vec<u64>> {
    let mut bytes: Vec<(std::ops::Range<u64>, Vec<u8>)> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    let mut todo = vec![rip];
    let mut out = Vec::new();
    while let Some(at) = todo.pop() {
        if !seen.insert(at) {
            continue;
        }
        if seen.len() > MAX_FOLLOWED {
            return None;
        }
        let Some(range) = range_of(at) else {
            out.push(at);
            continue;
        };
        let held = match bytes.iter().position(|(r, _)| *r == range) {
            Some(i) => i,
            None => {
                let b = code(&range)?;
                bytes.push((range.clone(), b));
                bytes.len() - 1
            }
        };
        let (range, b) = &bytes[held];
        let from = usize::try_from(at - range.start).ok()?;
        let mut d = Decoder::with_ip(64, &b[from..], at, DecoderOptions::NONE);
        let insn = d.decode();
        if insn.is_invalid() {
            return None;
        }
        // (A `syscall` is a call without a target: not followed.)
        let near = insn.is_jmp_short_or_near()
            || insn.is_call_near()
            || insn.is_jcc_short_or_near()
            || insn.is_loop()
            || insn.is_loopcc()
            || insn.is_jcx_short();
        match insn.flow_control() {
            FlowControl::Next => todo.push(insn.next_ip()),
            FlowControl::UnconditionalBranch | FlowControl::Call if near => {
                todo.push(insn.near_branch_target())
            }
            FlowControl::ConditionalBranch if near => {
                todo.push(insn.near_branch_target());
                todo.push(insn.next_ip());
            }
            FlowControl::UnconditionalBranch
            | FlowControl::Call
            | FlowControl::ConditionalBranch => return None,
            FlowControl::IndirectBranch | FlowControl::IndirectCall | FlowControl::Return => {
                out.push(at)
            }
            FlowControl::Interrupt | FlowControl::XbeginXabortXend | FlowControl::Exception => {
                return None
            }
        }
    }
    out.sort_unstable();
    out.dedup();
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ops::Range;

    /// The quiet range holding `a` of `ranges`.
    fn range_in(ranges: &[(Range<u64>, Vec<u8>)], a: u64) -> Option<Range<u64>> {
        ranges
            .iter()
            .map(|(r, _)| r)
            .find(|r| r.contains(&a))
            .cloned()
    }

    /// `ranges`' code at `r`.
    fn code_in(ranges: &[(Range<u64>, Vec<u8>)], r: &Range<u64>) -> Option<Vec<u8>> {
        ranges.iter().find(|(q, _)| q == r).map(|(_, b)| b.clone())
    }

    /// Quiet code at `start`, its range as long as `code`.
    fn quiet(start: u64, code: &[u8]) -> (Range<u64>, Vec<u8>) {
        (start..start + code.len() as u64, code.to_vec())
    }

    fn exits_in(ranges: &[(Range<u64>, Vec<u8>)], rip: u64) -> Option<Vec<u64>> {
        exits(rip, |a| range_in(ranges, a), |r| code_in(ranges, r))
    }

    #[test]
    fn follows_both_ways_and_stops_at_the_ways_out() {
        // A stub at 0x1000: a conditional branch out of it, a fall-through
        // to a `ret`; a site at 0x2000 calling it, then falling out at its
        // end.
        let ranges = [
            quiet(
                0x1000,
                &[
                    0x48, 0x83, 0xf8, 0x01, // cmp rax, 1
                    0x0f, 0x84, 0xf6, 0x1f, 0, 0, // je 0x3000
                    0x48, 0x89, 0xc1, // mov rcx, rax
                    0xc3, // ret (0x100d)
                ],
            ),
            quiet(
                0x2000,
                &[
                    0xb8, 5, 0, 0, 0, // mov eax, 5
                    0xe8, 0xf6, 0xef, 0xff, 0xff, // call 0x1000
                    0x90, // nop (0x200a)
                ],
            ),
        ];
        // From the site: into the stub (the call's return is looked at
        // when the `ret` has run).
        assert_eq!(exits_in(&ranges, 0x2000), Some(vec![0x100d, 0x3000]));
        // From the site's last instruction: its end.
        assert_eq!(exits_in(&ranges, 0x200a), Some(vec![0x200b]));
        // At the `ret`: itself.
        assert_eq!(exits_in(&ranges, 0x100d), Some(vec![0x100d]));
    }

    #[test]
    fn loops_end_and_traps_give_up() {
        let looped = [quiet(
            0x1000,
            &[
                0x48, 0xff, 0xc9, // dec rcx
                0x75, 0xfb, // jne 0x1000
                0xe9, 0xf6, 0x3f, 0, 0, // jmp 0x5000
            ],
        )];
        assert_eq!(exits_in(&looped, 0x1000), Some(vec![0x5000]));
        let trap = [quiet(0x1000, &[0x90, 0x0f, 0x0b])]; // nop; ud2
        assert_eq!(exits_in(&trap, 0x1000), None);
        // (`loop` and `jrcxz` are followed both ways, as a `jcc`.)
        let counted = [quiet(
            0x1000,
            &[
                0xe2, 0xfe, // loop 0x1000
                0xe3, 0x02, // jrcxz 0x1006
                0xeb, 0xfa, // jmp 0x1000
            ],
        )];
        assert_eq!(exits_in(&counted, 0x1000), Some(vec![0x1006]));
        let syscall = [quiet(0x1000, &[0x90, 0x0f, 0x05])];
        assert_eq!(exits_in(&syscall, 0x1000), None);
    }
}
