//! Client requests: the exit of a translated magic sequence. The argument
//! block (the request number and five arguments) is at the client's RAX;
//! the answer goes in RDX, which otherwise keeps the default the client
//! put there; the client then goes on after the sequence (see `clientreq`
//! for what each request means).
//!
//! Starting or stopping instrumentation hands the thread's records so far
//! to the tool, tells it, and retires every translation, so that code is
//! translated again, instrumented or not, as Cachegrind does. Requests for
//! the tool (Callgrind's dump, zero, toggle) reach a stream tool in the
//! thread's order through [`events::Tool::client_request`].

use super::exits::{enter_block, Spills};
use super::inject::Injection;
use super::{set_regs, Tracer};
use crate::clientreq::{self, Request, RequestTool, ToolRequest};
use crate::space::Space;
use crate::sys::Regs;
use crate::translate::SyscallSite;
use crate::{layout, vprintf, EngineError, Message, MessageKind, ThreadStack};
use events::ClientRequest;
use std::cell::RefCell;
use std::rc::Rc;

impl Tracer<'_> {
    /// The client-request exit of thread `tid` in `space`, stopped with
    /// `regs` after spilling `spills`.
    pub(super) fn on_request(
        &mut self,
        tid: i32,
        space: Rc<RefCell<Space>>,
        mut regs: Regs,
        spills: &Spills,
    ) -> Result<(), EngineError> {
        let site = space.borrow().request_site(regs.rip).ok_or_else(|| {
            EngineError(format!("unknown client request site at {:#x}", regs.rip))
        })?;
        // The client's registers as they were; it goes on after the exit.
        let resume = regs.rip;
        enter_block(&mut regs, resume, spills);
        let tgid = self.tasks.get(&tid).map_or(tid, |t| t.tgid);
        let multi = self.threads_sharing(&space) > 1;
        let block = {
            let mut sp = space.borrow_mut();
            sp.mem().set_multi(multi);
            sp.mem().read(spills.rax, 48).ok()
        };
        if let Some(block) = block {
            let args: [u64; 6] = std::array::from_fn(|i| {
                u64::from_le_bytes(block[i * 8..i * 8 + 8].try_into().expect("8 bytes"))
            });
            let request = clientreq::decode(&args, &self.cfg.requests);
            if let Request::NonSimdCall { func, args, .. } = request {
                if func != 0 {
                    return self.start_native_call(tid, &space, regs, func, args);
                }
            }
            if let Some(result) = self.answer(tgid, &space, &regs, site, request) {
                regs.rdx = result;
            }
        }
        // Translations dropped by the request, while other threads may run
        // them: patched by this thread, as after any exit.
        let patches = space.borrow_mut().mem().take_live();
        if !patches.is_empty() {
            let gadget = space.borrow().core + layout::GADGET;
            let mut inj = Injection::new(tid, gadget, regs);
            inj.apply_live_patches(&mut space.borrow_mut(), &patches)?;
            self.requeue_signals(tgid, inj);
        }
        set_regs(tid, &regs)?;
        self.resume(tid, 0)
    }

    /// `VALGRIND_NON_SIMD_CALLn(func, args)` from thread `tid` (its
    /// registers `regs`, ready to go on after the request): `func(thread
    /// id, args...)` runs natively, as Valgrind runs it on the real CPU,
    /// uninstrumented, on the thread's stack below the red zone, and
    /// returns to the core's return stub, where
    /// [`Tracer::end_native_call`] takes over.
    fn start_native_call(
        &mut self,
        tid: i32,
        space: &Rc<RefCell<Space>>,
        regs: Regs,
        func: u64,
        args: [u64; 3],
    ) -> Result<(), EngineError> {
        let core = space.borrow().core;
        // 16-byte aligned at the call, as a `call` leaves it.
        let sp = ((regs.rsp - 128) & !15) - 8;
        let stub = core + layout::CALL_RETURN_STUB;
        space.borrow_mut().mem().write(sp, &stub.to_le_bytes());
        let mut call = regs;
        call.rsp = sp;
        call.rip = func;
        call.rdi = layout::valgrind_thread_id(self.tasks.get(&tid).map_or(0, |t| t.area));
        call.rsi = args[0];
        call.rdx = args[1];
        call.rcx = args[2];
        call.rax = 0;
        self.native_calls.insert(tid, regs);
        set_regs(tid, &call)?;
        self.resume(tid, 0)
    }

    /// The native call of thread `tid`, stopped at the return stub with
    /// `regs`, returned: the thread goes on after its request with the
    /// function's result in RDX, its other registers as they were.
    pub(super) fn end_native_call(&mut self, tid: i32, regs: &Regs) -> Result<(), EngineError> {
        let Some(mut back) = self.native_calls.remove(&tid) else {
            return Err(EngineError(format!(
                "thread {tid} reached the return of a native client call it did not make"
            )));
        };
        back.rdx = regs.rdx;
        set_regs(tid, &back)?;
        self.resume(tid, 0)
    }

    /// Does what `request` from process `tgid` asks; returns the client's
    /// answer, if it is not the default.
    fn answer(
        &mut self,
        tgid: i32,
        space: &Rc<RefCell<Space>>,
        regs: &Regs,
        site: SyscallSite,
        request: Request,
    ) -> Option<u64> {
        let area = regs.gs_base;
        // Callgrind answers its requests 0; under Cachegrind nobody does.
        let tool_answer = (self.cfg.requests.tool == RequestTool::Callgrind).then_some(0);
        match request {
            Request::RunningOnValgrind => Some(1),
            // A function is called by `on_request`; none, Valgrind says so.
            Request::NonSimdCall { func, arity, .. } => {
                self.debug(
                    tgid,
                    &format!("VG_USERREQ__CLIENT_CALL{arity}: func={func:#x}"),
                );
                None
            }
            Request::CountErrors => Some(0),
            Request::StackRegister => Some(space.borrow_mut().new_stack_id()),
            Request::DiscardTranslations { addr, len } => {
                space
                    .borrow_mut()
                    .invalidate(addr, addr.saturating_add(len));
                Some(0)
            }
            Request::Printf {
                format,
                va_list,
                backtrace,
            } => {
                let mut sp = space.borrow_mut();
                let (text, count) = vprintf::format(sp.mem(), format, va_list);
                if !text.is_empty() || backtrace {
                    let text = String::from_utf8_lossy(&text);
                    // The request's own frame: Valgrind shows the address
                    // after the magic sequence.
                    let frames = [site.guest_next];
                    let bytes = if backtrace {
                        stack_copy(&mut sp, regs.rsp)
                    } else {
                        Vec::new()
                    };
                    let message = Message {
                        kind: MessageKind::Client,
                        text: &text,
                        backtrace: if backtrace { &frames } else { &[] },
                        stack: backtrace.then_some(ThreadStack {
                            rip: site.guest_next,
                            rsp: regs.rsp,
                            rbp: regs.rbp,
                            bytes: &bytes,
                        }),
                        modules: sp.module_records(),
                    };
                    self.sink.message(tgid, &message);
                }
                Some(u64::from(count))
            }
            Request::Instrumentation { on } => {
                let mut sp = space.borrow_mut();
                if sp.instrumented() != on {
                    // Records made while instrumented go first, then the
                    // tool hears of it; the code is translated anew.
                    sp.tool_request(area, ClientRequest::Instrumentation { on });
                    sp.set_instrumented(on);
                } else if self.cfg.requests.tool == RequestTool::Cachegrind {
                    drop(sp);
                    let (what, state) = if on {
                        ("START", "enabled")
                    } else {
                        ("STOP", "disabled")
                    };
                    self.debug(
                        tgid,
                        &format!("warning: CACHEGRIND_{what}_INSTRUMENTATION called,"),
                    );
                    self.debug(
                        tgid,
                        &format!("         but instrumentation is already {state}"),
                    );
                }
                Some(0)
            }
            Request::DumpStatsAt { reason } => {
                let mut sp = space.borrow_mut();
                let reason = vprintf::read_c_string(sp.mem(), reason)
                    .map(|s| String::from_utf8_lossy(&s).into_owned());
                sp.tool_request(area, ClientRequest::DumpStats { reason });
                tool_answer
            }
            Request::Tool(t) => {
                let request = match t {
                    ToolRequest::DumpStats => ClientRequest::DumpStats { reason: None },
                    ToolRequest::ZeroStats => ClientRequest::ZeroStats,
                    ToolRequest::ToggleCollect => ClientRequest::ToggleCollect,
                };
                space.borrow_mut().tool_request(area, request);
                tool_answer
            }
            Request::UnknownCachegrind(code) => {
                let text = format!("Warning: unknown cachegrind client request code {code:x}");
                self.sink
                    .message(tgid, &Message::line(MessageKind::User, &text));
                None
            }
            Request::Default => None,
        }
    }

    /// A debug message (`--PID-- text`) from process `tgid`.
    fn debug(&mut self, tgid: i32, text: &str) {
        self.sink
            .message(tgid, &Message::line(MessageKind::Debug, text));
    }
}

/// How much of a thread's stack a backtrace request copies: Valgrind's
/// twelve frames fit many times over.
const STACK_COPY: u64 = 64 * 1024;

/// The client's stack from `rsp` up, to [`STACK_COPY`] bytes or the end of
/// the mapping that holds it (nothing if none does).
fn stack_copy(sp: &mut Space, rsp: u64) -> Vec<u8> {
    let end = sp
        .mem()
        .maps()
        .ok()
        .and_then(|maps| maps.into_iter().find(|m| m.start <= rsp && rsp < m.end))
        .map_or(rsp, |m| m.end.min(rsp.saturating_add(STACK_COPY)));
    sp.mem().read(rsp, (end - rsp) as usize).unwrap_or_default()
}
