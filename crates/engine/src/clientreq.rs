//! Valgrind's client requests: the numbers a program puts in the argument
//! block of the magic sequence (`valgrind.h`, `cachegrind.h`,
//! `callgrind.h`, and the Memcheck, DHAT, Helgrind and DRD headers), and
//! what each one means here. Pure: the tracer reads the block and acts.
//!
//! A request Valgrind's core answers is answered as the core does
//! (`RUNNING_ON_VALGRIND` is 1, `VALGRIND_PRINTF` prints); a tool request is
//! obeyed when it is for the run's tool, and every other request (another
//! tool's, or one nobody knows) leaves the default the client passed in
//! RDX, as under Valgrind when no one handles it.

/// The requests of `valgrind.h` the engine acts on.
const RUNNING_ON_VALGRIND: u64 = 0x1001;
const DISCARD_TRANSLATIONS: u64 = 0x1002;
const COUNT_ERRORS: u64 = 0x1201;
const STACK_REGISTER: u64 = 0x1501;
/// `VALGRIND_NON_SIMD_CALL0` .. `3`: 0x1101 + the number of arguments.
const CLIENT_CALL0: u64 = 0x1101;
const CLIENT_CALL3: u64 = 0x1104;
/// `VALGRIND_PRINTF` of old (Valgrind before 3.7): on x86-64 the `va_list`
/// is passed by reference anyway.
const PRINTF: u64 = 0x1401;
const PRINTF_BACKTRACE: u64 = 0x1402;
const PRINTF_VALIST_BY_REF: u64 = 0x1403;
const PRINTF_BACKTRACE_VALIST_BY_REF: u64 = 0x1404;

/// `VG_USERREQ_TOOL_BASE(a, b)`: the high half of a tool's request numbers.
pub const fn tool_base(a: u8, b: u8) -> u64 {
    ((a as u64) << 24) | ((b as u64) << 16)
}

/// Cachegrind's requests (Valgrind 3.22's `cachegrind.h`).
const CG_START_INSTRUMENTATION: u64 = tool_base(b'C', b'G');
const CG_STOP_INSTRUMENTATION: u64 = tool_base(b'C', b'G') + 1;

/// Callgrind's requests (`callgrind.h`).
const CT_DUMP_STATS: u64 = tool_base(b'C', b'T');
const CT_ZERO_STATS: u64 = tool_base(b'C', b'T') + 1;
const CT_TOGGLE_COLLECT: u64 = tool_base(b'C', b'T') + 2;
const CT_DUMP_STATS_AT: u64 = tool_base(b'C', b'T') + 3;
const CT_START_INSTRUMENTATION: u64 = tool_base(b'C', b'T') + 4;
const CT_STOP_INSTRUMENTATION: u64 = tool_base(b'C', b'T') + 5;

/// Whose start/stop-instrumentation requests the run obeys: the tool's,
/// as under Valgrind, where each tool handles only its own requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RequestTool {
    /// `CACHEGRIND_START/STOP_INSTRUMENTATION` (Callgrind's are ignored).
    #[default]
    Cachegrind,
    /// `CALLGRIND_START/STOP_INSTRUMENTATION` (Cachegrind's are ignored).
    Callgrind,
}

/// How a run treats client requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestConfig {
    /// Whose instrumentation requests are obeyed.
    pub tool: RequestTool,
    /// `--instr-at-start` (Cachegrind) / `--instr-atstart` (Callgrind):
    /// whether each process image starts instrumented.
    pub instr_at_start: bool,
}

impl Default for RequestConfig {
    fn default() -> Self {
        RequestConfig {
            tool: RequestTool::Cachegrind,
            instr_at_start: true,
        }
    }
}

/// What a request asks for, as far as the engine is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Request {
    /// `RUNNING_ON_VALGRIND`: answered 1.
    RunningOnValgrind,
    /// `VALGRIND_DISCARD_TRANSLATIONS(addr, len)`.
    DiscardTranslations { addr: u64, len: u64 },
    /// `VALGRIND_COUNT_ERRORS`: no tool here reports errors, 0.
    CountErrors,
    /// `VALGRIND_STACK_REGISTER`: answered with a new stack id (1, 2, ...),
    /// as Valgrind's core does.
    StackRegister,
    /// `VALGRIND_PRINTF` (`backtrace`: `_BACKTRACE`): the format string
    /// and the client's `va_list`.
    Printf {
        format: u64,
        va_list: u64,
        backtrace: bool,
    },
    /// `VALGRIND_NON_SIMD_CALL0..3(func, args...)` (`arity` arguments):
    /// `func(tid, args...)` runs natively, uninstrumented, and its result
    /// is the answer (the arguments past the call's own are whatever the
    /// block holds). A null `func` is only reported, as Valgrind does.
    NonSimdCall {
        func: u64,
        arity: u64,
        args: [u64; 3],
    },
    /// Start or stop instrumentation (the run's tool's request).
    Instrumentation { on: bool },
    /// `CALLGRIND_DUMP_STATS_AT(reason)`: the string is the client's.
    DumpStatsAt { reason: u64 },
    /// A Callgrind request for the tool, passed on as it is.
    Tool(ToolRequest),
    /// A Cachegrind request this Cachegrind does not know: Valgrind's
    /// Cachegrind warns about it.
    UnknownCachegrind(u64),
    /// Anything else: the client keeps its default.
    Default,
}

/// A request that goes to the tool without anything the engine must read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolRequest {
    DumpStats,
    ZeroStats,
    ToggleCollect,
}

/// What the request with argument block `args` (the request number, then
/// five arguments) means under `config`.
pub fn decode(args: &[u64; 6], config: &RequestConfig) -> Request {
    let cachegrind = config.tool == RequestTool::Cachegrind;
    match args[0] {
        RUNNING_ON_VALGRIND => Request::RunningOnValgrind,
        DISCARD_TRANSLATIONS => Request::DiscardTranslations {
            addr: args[1],
            len: args[2],
        },
        COUNT_ERRORS => Request::CountErrors,
        CLIENT_CALL0..=CLIENT_CALL3 => Request::NonSimdCall {
            func: args[1],
            arity: args[0] - CLIENT_CALL0,
            args: [args[2], args[3], args[4]],
        },
        STACK_REGISTER => Request::StackRegister,
        PRINTF | PRINTF_VALIST_BY_REF => Request::Printf {
            format: args[1],
            va_list: args[2],
            backtrace: false,
        },
        PRINTF_BACKTRACE | PRINTF_BACKTRACE_VALIST_BY_REF => Request::Printf {
            format: args[1],
            va_list: args[2],
            backtrace: true,
        },
        CG_START_INSTRUMENTATION if cachegrind => Request::Instrumentation { on: true },
        CG_STOP_INSTRUMENTATION if cachegrind => Request::Instrumentation { on: false },
        code if cachegrind && code & 0xffff_0000 == tool_base(b'C', b'G') => {
            Request::UnknownCachegrind(code)
        }
        CT_START_INSTRUMENTATION if !cachegrind => Request::Instrumentation { on: true },
        CT_STOP_INSTRUMENTATION if !cachegrind => Request::Instrumentation { on: false },
        CT_DUMP_STATS => Request::Tool(ToolRequest::DumpStats),
        CT_ZERO_STATS => Request::Tool(ToolRequest::ZeroStats),
        CT_TOGGLE_COLLECT => Request::Tool(ToolRequest::ToggleCollect),
        CT_DUMP_STATS_AT => Request::DumpStatsAt { reason: args[1] },
        _ => Request::Default,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(code: u64, tool: RequestTool) -> Request {
        let config = RequestConfig {
            tool,
            instr_at_start: true,
        };
        decode(&[code, 11, 22, 0, 0, 0], &config)
    }

    #[test]
    fn core_requests_whatever_the_tool() {
        for tool in [RequestTool::Cachegrind, RequestTool::Callgrind] {
            assert_eq!(req(0x1001, tool), Request::RunningOnValgrind);
            assert_eq!(
                req(0x1403, tool),
                Request::Printf {
                    format: 11,
                    va_list: 22,
                    backtrace: false
                }
            );
            assert_eq!(
                req(0x1002, tool),
                Request::DiscardTranslations { addr: 11, len: 22 }
            );
            assert_eq!(
                req(0x1102, tool),
                Request::NonSimdCall {
                    func: 11,
                    arity: 1,
                    args: [22, 0, 0]
                }
            );
        }
    }

    #[test]
    fn each_tool_obeys_its_own_instrumentation_requests() {
        use RequestTool::*;
        assert_eq!(
            req(0x4347_0000, Cachegrind),
            Request::Instrumentation { on: true }
        );
        assert_eq!(
            req(0x4347_0001, Cachegrind),
            Request::Instrumentation { on: false }
        );
        assert_eq!(req(0x4354_0004, Cachegrind), Request::Default);
        assert_eq!(
            req(0x4354_0004, Callgrind),
            Request::Instrumentation { on: true }
        );
        assert_eq!(
            req(0x4354_0005, Callgrind),
            Request::Instrumentation { on: false }
        );
        assert_eq!(req(0x4347_0000, Callgrind), Request::Default);
        assert_eq!(
            req(0x4347_0007, Cachegrind),
            Request::UnknownCachegrind(0x4347_0007)
        );
        // Callgrind's other requests go to whichever tool runs.
        assert_eq!(
            req(0x4354_0001, Cachegrind),
            Request::Tool(ToolRequest::ZeroStats)
        );
        assert_eq!(
            req(0x4354_0003, Callgrind),
            Request::DumpStatsAt { reason: 11 }
        );
    }

    #[test]
    fn other_tools_and_unknown_requests_keep_the_default() {
        // Memcheck's MAKE_MEM_DEFINED, DHAT's, Helgrind's, and nonsense.
        for code in [
            0x4d43_0002,
            0x4448_0000,
            0x4847_0100,
            0x1301,
            0x1502,
            0xdead,
        ] {
            assert_eq!(req(code, RequestTool::Cachegrind), Request::Default);
        }
    }
}
