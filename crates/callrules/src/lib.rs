//! Callgrind's rules for what a transfer of control is (`setup_bbcc` in
//! Valgrind's `callgrind/bbcc.c`): a call, a return or a jump, decided at
//! each block from the block left, the block entered and the stack
//! pointer, with the frames a return or a `longjmp` leaves popped.
//!
//! The rules read and change a thread's shadow stack only through
//! [`Calls`], so that every keeper of call stacks applies the same ones:
//! the call tool in the tool's process (`callstack`), and the client-side
//! runtime the plan in `docs/client-contexts.md` adds. What a frame holds
//! besides its stack pointer and return address, and how contexts are
//! made, is the keeper's.
//!
//! `no_std`, without allocation: the client-side runtime runs inside the
//! traced program.
#![no_std]
#![forbid(unsafe_code)]

mod flow;
mod rules;

pub use flow::{Exit, Flow, FnId};
pub use rules::{enter, enter_jumping, level, raises_depth, unwind, Calls, Step};
