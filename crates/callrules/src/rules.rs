//! The decision at one block.
//!
//! * a `ret` is a return only when the stack pointer left the top frame
//!   (or stays and the block is that frame's return address, or one of the
//!   frames entered at the same stack pointer returns there); otherwise it
//!   is a jump (`ret` used as an indirect jump);
//! * a jump (or a fall-through, or such a `ret`) is a call when it goes to
//!   the first instruction of a function (tail calls), or into another
//!   object or section kind (PLT stubs jumping into the library); a call
//!   emulated so has its caller's frame's stack pointer, and a jump out of
//!   `_dl_runtime_resolve` first returns from it, its caller calling what
//!   it resolved from the same call site;
//! * any block whose stack pointer is known unwinds the frames the stack
//!   pointer has left (`longjmp`, exception unwinding), and is then a
//!   return;
//! * a return with no frame left is an underflow (Callgrind's
//!   `handleUnderflow`), the keeper's to handle.

use crate::flow::{Exit, Flow, FnId};

/// One thread's shadow stack, as the rules read and change it.
pub trait Calls {
    /// Frames on the stack.
    fn depth(&self) -> usize;
    /// Frames below this depth are the code's a signal handler interrupted
    /// (a return never pops them).
    fn bottom(&self) -> usize;
    /// Whether a signal handler runs.
    fn in_handler(&self) -> bool;
    /// The stack pointer frame `i` (0 the outermost) was entered with.
    fn frame_sp(&self, i: usize) -> u64;
    /// Where frame `i`'s call returns to (0 for an emulated call).
    fn frame_ret_addr(&self, i: usize) -> u64;
    /// The call site of the top frame's arc; `None` if the top frame is a
    /// skipped function's (it has no arc).
    fn top_call_site(&self) -> Option<u64>;
    /// Pops the top frame (its call ends).
    fn pop(&mut self);
    /// A return with no frame to return from, from block `from` to block
    /// `to`; `arc`: whether the root `to`'s function becomes gets an arc to
    /// the returning context (not for a handler returning to its restorer,
    /// which under Valgrind returns into Valgrind's own trampoline).
    fn underflow(&mut self, from: Option<&Flow>, to: &Flow, arc: bool);
}

/// What a block's entry is, once the frames it left are popped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// A rep string instruction's next iteration: nothing changes, not
    /// even the charge's context.
    Repeat,
    /// Control goes on in the current context (a jump, or a return whose
    /// frames are popped).
    Stay,
    /// A call of the entered block's function: the keeper pushes a frame
    /// (and, unless `skip`, a context).
    Call {
        /// The call site: the left block's last instruction, or the
        /// resolver's call site for a function `_dl_runtime_resolve`
        /// jumped to.
        site: u64,
        /// The frame's stack pointer: the one known at the entry, an
        /// emulated call's caller frame's, or `None` (the keeper's last
        /// known one).
        sp: Option<u64>,
        /// Where the call returns to (the left block's end for a real
        /// call, 0 for an emulated one).
        ret_addr: u64,
        /// The function is skipped (`--skip-plt`, `--fn-skip`): a frame
        /// but no context.
        skip: bool,
    },
}

/// Control enters block `y` from block `x` (`None`: the thread's first
/// block, or the first after a handler's start), with the stack pointer
/// `sp` if known there; `again`: `y` is `x` (a rep string instruction
/// iterating when `x` falls through). Pops what the entry leaves through
/// `t` and says what the entry is.
#[inline]
pub fn enter<T: Calls>(
    t: &mut T,
    x: Option<&Flow>,
    y: &Flow,
    sp: Option<u64>,
    again: bool,
) -> Step {
    enter_jumping(t, x, y, sp, again).0
}

/// [`enter`], and whether the entry is a jump that stays a jump: `x` left
/// by a jump or fall-through that is no call (it goes to no function's
/// start, nor into another object or section kind) and unwinds no frame.
/// Those are the transfers Callgrind's `--collect-jumps=yes` counts
/// (`jk_Jump` still, at the end of `setup_bbcc`), once the keeper has
/// told a fall-through (which it does not count) from a jump by where
/// `x`'s branch went.
pub fn enter_jumping<T: Calls>(
    t: &mut T,
    x: Option<&Flow>,
    y: &Flow,
    sp: Option<u64>,
    again: bool,
) -> (Step, bool) {
    #[derive(PartialEq)]
    enum Kind {
        None,
        Call,
        Return,
        Jump,
    }
    let mut kind = match x.map(|x| x.exit) {
        None => Kind::None,
        Some(Exit::FallThrough) if again => return (Step::Repeat, false),
        Some(Exit::Call) => Kind::Call,
        Some(Exit::Return) => Kind::Return,
        Some(Exit::Jump | Exit::FallThrough) => Kind::Jump,
    };
    // A return that does not leave the top frame is a jump.
    let mut pops = 1;
    let mut ret_without_call = false;
    let bottom = t.bottom();
    if kind == Kind::Return && t.depth() > bottom {
        let top = t.depth() - 1;
        if let Some(sp) = sp {
            let top_sp = t.frame_sp(top);
            if sp < top_sp {
                pops = 0;
            } else if sp == top_sp {
                let mut i = top;
                loop {
                    if t.frame_ret_addr(i) == y.start {
                        break;
                    }
                    if i > 0 {
                        i -= 1;
                        if t.frame_sp(i) == sp {
                            pops += 1;
                            continue;
                        }
                    }
                    pops = 0;
                    break;
                }
            }
        }
        if pops == 0 {
            kind = Kind::Jump;
            ret_without_call = true;
        }
    }
    // A jump into a function's start, another object or section kind is
    // a call.
    let mut emulated = false;
    let mut push_sp = sp;
    let mut site = x.map_or(y.start, |x| x.call_site());
    if let (Kind::Jump, Some(x)) = (&kind, x) {
        if ret_without_call || y.entry || x.domain != y.domain {
            if x.pop_on_jump && t.depth() > 0 {
                if let Some(s) = t.top_call_site() {
                    // The resolver's caller calls what it resolved.
                    site = s;
                    push_sp = Some(t.frame_sp(t.depth() - 1));
                    t.pop();
                }
            }
            kind = Kind::Call;
            emulated = true;
        }
    }
    if kind == Kind::Return {
        if t.depth() <= bottom {
            let arc = !t.in_handler();
            t.underflow(x, y, arc);
        } else {
            unwind(t, sp, pops);
        }
        return (Step::Stay, false);
    }
    if sp.is_some() && unwind(t, sp, 0) > 0 {
        return (Step::Stay, false);
    }
    if kind != Kind::Call {
        return (Step::Stay, kind == Kind::Jump);
    }
    if emulated && t.depth() > 0 {
        push_sp = Some(t.frame_sp(t.depth() - 1));
    }
    let ret_addr = match x {
        Some(x) if x.exit == Exit::Call => x.end(),
        _ => 0,
    };
    let step = Step::Call {
        site,
        sp: push_sp,
        ret_addr,
        skip: y.skip,
    };
    (step, false)
}

/// Pops the frames the stack pointer `sp` has left, and at least
/// `min_pops` frames entered at `sp` (without `sp`: `min_pops` frames).
/// Returns how many were popped.
pub fn unwind<T: Calls>(t: &mut T, sp: Option<u64>, mut min_pops: u32) -> u32 {
    let mut popped = 0;
    while t.depth() > 0 {
        let top = t.frame_sp(t.depth() - 1);
        let left = sp.is_some_and(|sp| top < sp);
        let at = sp.is_none_or(|sp| top == sp);
        if !(left || (at && min_pops > 0)) {
            break;
        }
        min_pops = min_pops.saturating_sub(1);
        t.pop();
        popped += 1;
    }
    popped
}

/// The recursion level of a context of a function with `active` frames on
/// the thread's stack, one more if `push` (its call is being entered),
/// capped at `separate_recs` (`--separate-recs`; 0 counts as 1). A
/// function entered without a call (a root) and never called is at level
/// 1 and counts as active once.
#[inline]
pub fn level(active: &mut u32, push: bool, separate_recs: u32) -> u32 {
    let level = (*active + u32::from(push)).min(separate_recs.max(1));
    if level == 0 {
        *active = 1;
        return 1;
    }
    level
}

/// Whether a call from a context of function `caller` (`None`: no context
/// yet) into `callee` counts as one more activation of `callee`: it
/// raises the callee's active count (the recursion level its context
/// gets, and whether the call enters its outermost activation), and the
/// call's return lowers it again. Always, unless `skip_direct_rec`
/// (`--skip-direct-rec=yes`) and the function calls itself: Callgrind
/// then leaves both its level and its depth as they were (`setup_bbcc`,
/// `push_call_stack`, `pop_call_stack`), so a direct recursion stays at
/// its level and a mutual one still counts.
#[inline]
pub fn raises_depth(caller: Option<FnId>, callee: FnId, skip_direct_rec: bool) -> bool {
    !skip_direct_rec || caller != Some(callee)
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use std::vec::Vec;

    /// A stack of (sp, ret_addr, call site) frames that logs underflows.
    #[derive(Default)]
    struct Stack {
        frames: Vec<(u64, u64, Option<u64>)>,
        underflows: Vec<(u64, bool)>,
        bottom: usize,
        handler: bool,
    }

    impl Calls for Stack {
        fn depth(&self) -> usize {
            self.frames.len()
        }
        fn bottom(&self) -> usize {
            self.bottom
        }
        fn in_handler(&self) -> bool {
            self.handler
        }
        fn frame_sp(&self, i: usize) -> u64 {
            self.frames[i].0
        }
        fn frame_ret_addr(&self, i: usize) -> u64 {
            self.frames[i].1
        }
        fn top_call_site(&self) -> Option<u64> {
            self.frames.last()?.2
        }
        fn pop(&mut self) {
            self.frames.pop();
        }
        fn underflow(&mut self, _: Option<&Flow>, to: &Flow, arc: bool) {
            self.underflows.push((to.start, arc));
        }
    }

    /// A block of function `f` at `start`, 16 bytes long, its last
    /// instruction 5 bytes before its end.
    fn block(f: u32, start: u64, exit: Exit, entry: bool) -> Flow {
        let mut b = Flow::new(start, start + 11, start + 16, exit);
        (b.function, b.entry) = (f, entry);
        b
    }

    #[test]
    fn a_call_returns_to_its_return_address() {
        let mut s = Stack::default();
        let caller = block(1, 0x1000, Exit::Call, false);
        let callee = block(2, 0x2000, Exit::Return, true);
        let step = enter(&mut s, Some(&caller), &callee, Some(0x7ff8), false);
        assert_eq!(
            step,
            Step::Call {
                site: 0x100b,
                sp: Some(0x7ff8),
                ret_addr: 0x1010,
                skip: false
            }
        );
        s.frames.push((0x7ff8, 0x1010, Some(0x100b)));
        let back = block(1, 0x1010, Exit::Jump, false);
        assert_eq!(
            enter(&mut s, Some(&callee), &back, Some(0x8000), false),
            Step::Stay
        );
        assert!(s.frames.is_empty());
    }

    #[test]
    fn a_ret_that_keeps_the_frame_is_an_emulated_call() {
        let mut s = Stack::default();
        s.frames.push((0x7ff8, 0x1010, Some(0x100b)));
        // `push addr; ret` below the frame: a jump, here into another
        // function's start, so a call with the frame's stack pointer.
        let x = block(2, 0x2000, Exit::Return, true);
        let y = block(3, 0x3000, Exit::Jump, true);
        let step = enter(&mut s, Some(&x), &y, Some(0x7ff0), false);
        assert_eq!(
            step,
            Step::Call {
                site: 0x200b,
                sp: Some(0x7ff8),
                ret_addr: 0,
                skip: false
            }
        );
        assert_eq!(s.frames.len(), 1, "nothing popped");
        // At the frame's own stack pointer, to an address no frame returns
        // to: a `ret` that returns nowhere is a call even inside the
        // function (Callgrind's `ret_without_call`).
        let z = block(2, 0x2040, Exit::Jump, false);
        let step = enter(&mut s, Some(&x), &z, Some(0x7ff8), false);
        assert!(matches!(
            step,
            Step::Call {
                sp: Some(0x7ff8),
                ..
            }
        ));
        assert_eq!(s.frames.len(), 1);
        // A plain jump there changes nothing.
        let j = block(2, 0x2000, Exit::Jump, false);
        assert_eq!(enter(&mut s, Some(&j), &z, None, false), Step::Stay);
    }

    #[test]
    fn frames_entered_at_one_stack_pointer_return_together() {
        let mut s = Stack::default();
        // f calls g, which tail-calls h (h's frame has g's stack pointer).
        s.frames.push((0x7ff8, 0x1010, Some(0x100b)));
        s.frames.push((0x7ff8, 0, Some(0x200b)));
        let h = block(3, 0x3000, Exit::Return, true);
        let back = block(1, 0x1010, Exit::Jump, false);
        assert_eq!(
            enter(&mut s, Some(&h), &back, Some(0x8000), false),
            Step::Stay
        );
        assert!(s.frames.is_empty(), "both popped");
    }

    #[test]
    fn jumps_into_a_function_or_another_object_are_calls() {
        let mut s = Stack::default();
        s.frames.push((0x7ff8, 0x1010, Some(0x100b)));
        let x = block(2, 0x2000, Exit::Jump, false);
        let inside = block(2, 0x2040, Exit::Jump, false);
        assert_eq!(enter(&mut s, Some(&x), &inside, None, false), Step::Stay);
        let entry = block(3, 0x3000, Exit::Jump, true);
        let tail = enter(&mut s, Some(&x), &entry, None, false);
        assert!(matches!(
            tail,
            Step::Call {
                sp: Some(0x7ff8),
                ret_addr: 0,
                ..
            }
        ));
        let mut other = block(4, 0x4040, Exit::Jump, false);
        other.domain = 1;
        assert!(matches!(
            enter(&mut s, Some(&x), &other, None, false),
            Step::Call { .. }
        ));
        other.skip = true;
        assert!(matches!(
            enter(&mut s, Some(&x), &other, None, false),
            Step::Call { skip: true, .. }
        ));
    }

    #[test]
    fn a_known_stack_pointer_unwinds_the_frames_it_left() {
        let mut s = Stack::default();
        s.frames.push((0x7000, 0x1010, Some(0x100b)));
        s.frames.push((0x6000, 0x2010, Some(0x200b)));
        s.frames.push((0x5000, 0x3010, Some(0x300b)));
        // longjmp: an indirect jump landing with SP back in the first frame.
        let x = block(4, 0x4000, Exit::Jump, false);
        let y = block(2, 0x2080, Exit::Jump, false);
        assert_eq!(enter(&mut s, Some(&x), &y, Some(0x6800), false), Step::Stay);
        assert_eq!(s.frames.len(), 1);
        assert_eq!(unwind(&mut s, None, 1), 1);
    }

    #[test]
    fn the_resolver_returns_before_its_caller_calls_what_it_resolved() {
        let mut s = Stack::default();
        s.frames.push((0x7ff8, 0x1010, Some(0x100b)));
        let mut resolver = block(5, 0x5000, Exit::Jump, false);
        resolver.pop_on_jump = true;
        resolver.domain = 1;
        let resolved = block(6, 0x6000, Exit::Jump, true);
        let step = enter(&mut s, Some(&resolver), &resolved, None, false);
        assert_eq!(
            step,
            Step::Call {
                site: 0x100b,
                sp: Some(0x7ff8),
                ret_addr: 0,
                skip: false
            }
        );
        assert!(s.frames.is_empty(), "the resolver's frame is popped");
    }

    #[test]
    fn a_return_with_no_frame_underflows_with_an_arc_outside_handlers() {
        let mut s = Stack::default();
        let x = block(1, 0x1000, Exit::Return, false);
        let y = block(2, 0x2010, Exit::Jump, false);
        assert_eq!(enter(&mut s, Some(&x), &y, Some(0x8000), false), Step::Stay);
        s.handler = true;
        s.frames.push((0x7000, 0x1010, None));
        s.bottom = 1;
        assert_eq!(enter(&mut s, Some(&x), &y, Some(0x8000), false), Step::Stay);
        assert_eq!(s.underflows, [(0x2010, true), (0x2010, false)]);
        assert_eq!(s.frames.len(), 1, "the interrupted code's frame stays");
    }

    #[test]
    fn a_rep_iteration_changes_nothing() {
        let mut s = Stack::default();
        let rep = block(1, 0x1000, Exit::FallThrough, true);
        assert_eq!(enter(&mut s, Some(&rep), &rep, None, true), Step::Repeat);
        assert!(matches!(
            enter(&mut s, Some(&rep), &rep, None, false),
            Step::Call { .. }
        ));
    }

    #[test]
    fn only_jumps_that_stay_jumps_are_jumps() {
        let mut s = Stack::default();
        s.frames.push((0x7ff8, 0x1010, Some(0x100b)));
        let x = block(2, 0x2000, Exit::Jump, true);
        let inside = block(2, 0x2010, Exit::Return, false);
        assert_eq!(
            enter_jumping(&mut s, Some(&x), &inside, None, false),
            (Step::Stay, true)
        );
        // Into a function's start: a call.
        let other = block(3, 0x3000, Exit::Return, true);
        let (step, jump) = enter_jumping(&mut s, Some(&x), &other, None, false);
        assert!(matches!(step, Step::Call { .. }) && !jump);
        // Leaving the frame by the stack pointer (longjmp): a return.
        let back = block(1, 0x1020, Exit::Jump, false);
        assert_eq!(
            enter_jumping(&mut s, Some(&x), &back, Some(0x8000), false),
            (Step::Stay, false)
        );
        assert!(s.frames.is_empty());
        // A return, and a thread's first block, are no jumps.
        let ret = block(2, 0x2010, Exit::Return, false);
        assert!(!enter_jumping(&mut s, Some(&ret), &back, None, false).1);
        assert!(!enter_jumping(&mut s, None, &back, None, false).1);
    }

    #[test]
    fn levels_count_active_frames_up_to_the_cap() {
        let mut active = 0;
        assert_eq!(level(&mut active, false, 2), 1);
        assert_eq!(active, 1, "a root counts as active");
        assert_eq!(level(&mut active, true, 2), 2);
        active = 5;
        assert_eq!(level(&mut active, true, 2), 2);
        assert_eq!(level(&mut active, true, 0), 1);
    }

    #[test]
    fn only_a_direct_recursion_is_skipped_and_only_when_asked() {
        let (f, g) = (1, 2);
        assert!(raises_depth(Some(f), f, false));
        assert!(!raises_depth(Some(f), f, true));
        assert!(raises_depth(Some(g), f, true), "mutual recursion counts");
        assert!(raises_depth(None, f, true), "no caller's context yet");
    }
}
