//! Oracle test of the per-instruction data-access rules
//! (`crates/engine/src/memrefs.rs`) against Valgrind's Lackey.
//!
//! Each `fixtures/sim/nostdlib_*.c` program is compiled (static,
//! `-nostdlib`, with the flags its `cflags:` comment line gives) and run
//! under `valgrind --tool=lackey --trace-mem=yes`. For every instruction
//! execution Lackey reports (`I  addr,size`, then its ` L`/` S`/` M`
//! accesses), the instruction is decoded from the ELF's executable segments
//! and the (kind, size) sequence Lackey reports is compared with
//! `data_accesses`'. Addresses are checked where they can be computed
//! without the registers: absolute and RIP-relative operands exactly, and
//! RSP-relative ones from a stack pointer followed through the trace (learnt
//! from the first RSP-relative access, then moved by each instruction's
//! known effect; lost when an instruction sets RSP otherwise).
//!
//! Differences that are VEX artefacts are listed in [`KNOWN`] (by mnemonic,
//! with the reason and the exact shape accepted) and in
//! `docs/conformance.md`; anything else fails the test. Without `valgrind`
//! the test fails (it never passes silently).

use engine::memrefs_for_tests::{data_accesses, AddrExpr};
use events::AccessKind;
use iced_x86::{
    Code, Decoder, DecoderOptions, Instruction, InstructionInfoFactory, Mnemonic, OpAccess, OpKind,
    Register,
};
use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::process::Command;

/// One access as Lackey prints it.
type Seen = (AccessKind, u32, u64);

/// An access's kind and size.
type Shape = (AccessKind, u32);

/// A decoded instruction with its accesses' shapes and addresses.
type Decoded = (Instruction, Vec<Shape>, Vec<AddrExpr>);

/// A VEX artefact: where Lackey (and so Cachegrind) differs from the
/// machine, and the exact shape of the difference.
struct Known {
    /// The instructions it applies to.
    mnemonics: &'static [Mnemonic],
    /// Why Lackey differs.
    reason: &'static str,
    /// Whether `lackey` is this artefact's rendering of `ours`.
    accepts: fn(i: &Instruction, ours: &[Shape], lackey: &[Shape]) -> bool,
}

use AccessKind::{Modify as M, Read as R, Write as W};

/// The VEX artefacts the fixtures exercise.
const KNOWN: &[Known] = &[
    Known {
        mnemonics: &[Mnemonic::Xchg, Mnemonic::Xadd, Mnemonic::Add],
        reason: "a locked read-modify-write (lock prefix, or xchg with memory) is a load \
                 and then a compare-and-swap in VEX: Lackey shows L then M (Cachegrind: 2 Dr); \
                 the machine makes one locked access",
        accepts: |i, ours, lackey| {
            (i.has_lock_prefix() || i.mnemonic() == Mnemonic::Xchg)
                && ours.len() == 1
                && ours[0].0 == M
                && lackey == [(R, ours[0].1), (M, ours[0].1)]
        },
    },
    Known {
        mnemonics: &[Mnemonic::Fxsave, Mnemonic::Fxrstor],
        reason: "VEX runs fxsave/fxrstor as a helper for the x87 part (160 bytes), one 8-byte \
                 access (MXCSR and its mask) and one 16-byte access per XMM register: 18 \
                 accesses (Cachegrind caps the helper's at 64 bytes); the machine makes one \
                 512-byte access, counted as one capped at 64",
        accepts: |_, ours, lackey| {
            ours.len() == 1
                && ours[0].1 == 64
                && lackey.len() == 18
                && lackey.iter().all(|&(k, _)| k == ours[0].0)
                && lackey[0].1 == 160
                && lackey[1].1 == 8
                && lackey[2..].iter().all(|&(_, s)| s == 16)
        },
    },
    Known {
        mnemonics: &[Mnemonic::Bt, Mnemonic::Bts, Mnemonic::Btr, Mnemonic::Btc],
        reason: "with a register bit offset, VEX accesses the one byte holding the bit, at \
                 operand + (offset >> 3); the machine accesses an operand-sized word at \
                 operand + size*(offset div bits), which for an offset within the operand is \
                 the operand: we count the operand",
        accepts: |i, ours, lackey| {
            i.op1_kind() == OpKind::Register
                && ours.len() == 1
                && lackey.len() == 1
                && lackey[0] == (ours[0].0, 1)
        },
    },
    Known {
        mnemonics: &[Mnemonic::Maskmovdqu, Mnemonic::Maskmovq],
        reason: "VEX loads the whole 16 (8) bytes at [rdi], merges the selected bytes and \
                 stores them back: Lackey shows M (Cachegrind a Dr); the machine only writes \
                 the selected bytes",
        accepts: |_, ours, lackey| ours.len() == 1 && lackey == [(M, ours[0].1)],
    },
    Known {
        mnemonics: &[Mnemonic::Pop],
        reason: "a load whose result is overwritten later in the same superblock is deleted \
                 by VEX (spec section 0, effect 2): here `pop %dx; pop %dx`, the first pop's \
                 read is gone",
        accepts: |i, ours, lackey| {
            i.op0_kind() == OpKind::Register
                && ours.len() == 1
                && ours[0].0 == R
                && lackey.is_empty()
        },
    },
];

/// Lackey's rendering of a masked AVX load or store (vmaskmov*,
/// vpmaskmov*): VEX makes one guarded access per lane, and Lackey shows
/// those whose mask bit is set. The machine accesses the whole operand
/// (as one access, faults suppressed on masked-off lanes).
fn masked_lanes(i: &Instruction, ours: &[(AccessKind, u32)], lackey: &[(AccessKind, u32)]) -> bool {
    let lane = match i.mnemonic() {
        Mnemonic::Vmaskmovps | Mnemonic::Vpmaskmovd => 4,
        Mnemonic::Vmaskmovpd | Mnemonic::Vpmaskmovq => 8,
        _ => return false,
    };
    ours.len() == 1
        && lackey.len() as u32 <= ours[0].1 / lane
        && lackey.iter().all(|&(k, s)| k == ours[0].0 && s == lane)
}

/// The fixtures, by name.
const FIXTURES: &[&str] = &[
    "nostdlib_matmul.c",
    "nostdlib_sort.c",
    "nostdlib_chase.c",
    "nostdlib_statemachine.c",
    "nostdlib_strings.c",
    "nostdlib_insns.c",
];

use testkit::{build_nostdlib as build, TempDir};

/// The executable PT_LOAD segments of a static ELF64 file: (vaddr, bytes).
fn code_segments(exe: &Path) -> Vec<(u64, Vec<u8>)> {
    let f = std::fs::read(exe).expect("read ELF");
    assert_eq!(&f[..4], b"\x7fELF", "not an ELF file");
    assert_eq!(f[4], 2, "not ELF64");
    let u16_at = |o: usize| u16::from_le_bytes(f[o..o + 2].try_into().unwrap());
    let u32_at = |o: usize| u32::from_le_bytes(f[o..o + 4].try_into().unwrap());
    let u64_at = |o: usize| u64::from_le_bytes(f[o..o + 8].try_into().unwrap());
    let phoff = u64_at(0x20) as usize;
    let phentsize = u16_at(0x36) as usize;
    let phnum = u16_at(0x38) as usize;
    let mut out = Vec::new();
    for k in 0..phnum {
        let ph = phoff + k * phentsize;
        let (ptype, flags) = (u32_at(ph), u32_at(ph + 4));
        // PT_LOAD, PF_X
        if ptype == 1 && flags & 1 != 0 {
            let (off, vaddr, filesz) = (u64_at(ph + 8) as usize, u64_at(ph + 16), u64_at(ph + 32));
            out.push((vaddr, f[off..off + filesz as usize].to_vec()));
        }
    }
    assert!(!out.is_empty(), "no executable segment");
    out
}

/// Runs `exe` natively and under Lackey; returns Lackey's log.
fn lackey(dir: &TempDir, exe: &Path) -> String {
    let native = Command::new(exe).status().expect("run fixture natively");
    let log = dir.0.join("lackey.log");
    let st = Command::new("valgrind")
        .args(["--tool=lackey", "--trace-mem=yes"])
        .arg(format!("--log-file={}", log.display()))
        .arg(exe)
        .status()
        .expect("run valgrind");
    let text = std::fs::read_to_string(&log).expect("read Lackey's log");
    assert!(
        !text.contains("unhandled instruction"),
        "{}: VEX could not run an instruction:\n{}",
        exe.display(),
        text.lines()
            .filter(|l| l.starts_with("vex"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert_eq!(
        st.code(),
        native.code(),
        "{}: exit status differs under Lackey",
        exe.display()
    );
    text
}

/// One parsed execution: instruction address and length, its accesses.
struct Exec {
    addr: u64,
    len: u32,
    data: Vec<Seen>,
}

fn parse_addr_size(s: &str) -> (u64, u32) {
    let (a, n) = s
        .trim()
        .split_once(',')
        .unwrap_or_else(|| panic!("bad Lackey line {s:?}"));
    (
        u64::from_str_radix(a, 16).unwrap_or_else(|_| panic!("bad address {a:?}")),
        n.parse().unwrap_or_else(|_| panic!("bad size {n:?}")),
    )
}

/// Lackey's `--trace-mem=yes` lines, grouped by instruction execution.
fn parse(log: &str) -> Vec<Exec> {
    let mut out: Vec<Exec> = Vec::new();
    for line in log.lines() {
        if let Some(rest) = line.strip_prefix("I  ") {
            let (addr, len) = parse_addr_size(rest);
            out.push(Exec {
                addr,
                len,
                data: Vec::new(),
            });
        } else if line.len() > 3 && line.starts_with(' ') && line.as_bytes()[2] == b' ' {
            let kind = match line.as_bytes()[1] {
                b'L' => R,
                b'S' => W,
                b'M' => M,
                _ => continue,
            };
            let (a, n) = parse_addr_size(&line[3..]);
            out.last_mut()
                .expect("data access before any instruction")
                .data
                .push((kind, n, a));
        }
    }
    out
}

/// What the comparison found, over all fixtures.
#[derive(Default)]
struct Tally {
    execs: u64,
    equal: u64,
    rep_final: u64,
    known: BTreeMap<String, u64>,
    unexplained: BTreeMap<String, (u64, String)>,
    static_addrs: u64,
    stack_addrs: u64,
    addr_errors: Vec<String>,
}

/// Where the stack pointer goes after `i` (None: no longer known).
fn next_rsp(
    factory: &mut InstructionInfoFactory,
    i: &Instruction,
    rsp: Option<u64>,
    lackey: &[Seen],
) -> Option<u64> {
    if i.code() == Code::Leaveq {
        // rsp = rbp + 8, and the read is at rbp.
        return lackey.first().map(|&(_, _, a)| a + 8);
    }
    let rsp = rsp?;
    let inc = i.stack_pointer_increment();
    if inc != 0 {
        return Some(rsp.wrapping_add(inc as i64 as u64));
    }
    let on_rsp =
        i.op_count() >= 1 && i.op0_kind() == OpKind::Register && i.op0_register() == Register::RSP;
    let imm = i.op_count() == 2
        && matches!(
            i.op1_kind(),
            OpKind::Immediate8to64 | OpKind::Immediate32to64
        );
    if on_rsp {
        match i.mnemonic() {
            Mnemonic::Add if imm => return Some(rsp.wrapping_add(i.immediate(1))),
            Mnemonic::Sub if imm => return Some(rsp.wrapping_sub(i.immediate(1))),
            Mnemonic::And if imm => return Some(rsp & i.immediate(1)),
            Mnemonic::Lea
                if i.memory_base() == Register::RSP && i.memory_index() == Register::None =>
            {
                return Some(rsp.wrapping_add(i.memory_displacement64()))
            }
            _ => {}
        }
    }
    let writes_rsp = factory.info(i).used_registers().iter().any(|r| {
        matches!(
            r.register(),
            Register::RSP | Register::ESP | Register::SP | Register::SPL
        ) && !matches!(
            r.access(),
            OpAccess::Read | OpAccess::CondRead | OpAccess::NoMemAccess
        )
    });
    if writes_rsp {
        None
    } else {
        Some(rsp)
    }
}

fn compare_fixture(name: &str, tally: &mut Tally) -> u64 {
    let dir = TempDir::new(name.trim_end_matches(".c"));
    let exe = build(&dir, name);
    let segs = code_segments(&exe);
    let log = lackey(&dir, &exe);
    let execs = parse(&log);
    assert!(!execs.is_empty(), "{name}: Lackey traced no instruction");

    let mut decoded: HashMap<u64, Decoded> = HashMap::new();
    let mut factory = InstructionInfoFactory::new();
    let mut rsp: Option<u64> = None;
    let mut pending_rep_end: Option<u64> = None;
    for e in &execs {
        let entry = decoded.entry(e.addr).or_insert_with(|| {
            let (base, bytes) = segs
                .iter()
                .find(|(v, b)| e.addr >= *v && e.addr < v + b.len() as u64)
                .unwrap_or_else(|| panic!("{name}: {:#x} is outside the code", e.addr));
            let off = (e.addr - base) as usize;
            let mut d = Decoder::with_ip(64, &bytes[off..], e.addr, DecoderOptions::NONE);
            let i = d.decode();
            let acc = data_accesses(&i);
            (
                i,
                acc.iter().map(|a| (a.kind, a.size)).collect(),
                acc.iter().map(|a| a.addr).collect(),
            )
        });
        let (i, ours, addrs) = (&entry.0, &entry.1, &entry.2);
        assert_eq!(
            i.len() as u32,
            e.len,
            "{name}: {:#x} {i}: length differs from Lackey's",
            e.addr
        );
        tally.execs += 1;
        // A rep-prefixed string instruction's last execution finds rcx = 0
        // and makes no access; execution must then move on.
        if let Some(at) = pending_rep_end.take() {
            assert_ne!(
                at, e.addr,
                "{name}: {:#x}: a rep instruction ran on after its final check",
                at
            );
        }
        let lk: Vec<(AccessKind, u32)> = e.data.iter().map(|&(k, s, _)| (k, s)).collect();
        let rep = i.has_rep_prefix() || i.has_repne_prefix();
        if lk == *ours {
            tally.equal += 1;
            // Addresses: absolute/RIP-relative exactly, RSP-relative from
            // the tracked stack pointer.
            for (a, &(_, _, got)) in addrs.iter().zip(&e.data) {
                if let AddrExpr::Mem {
                    seg: Register::None,
                    base,
                    index: Register::None,
                    disp,
                    ..
                } = *a
                {
                    if base == Register::None {
                        tally.static_addrs += 1;
                        if got != disp as u64 {
                            tally.addr_errors.push(format!(
                                "{name}: {:#x} {i}: address {got:#x}, ours {:#x}",
                                e.addr, disp as u64
                            ));
                        }
                    } else if base == Register::RSP {
                        match rsp {
                            Some(sp) => {
                                tally.stack_addrs += 1;
                                let want = sp.wrapping_add(disp as u64);
                                if got != want {
                                    tally.addr_errors.push(format!("{name}: {:#x} {i}: address {got:#x}, ours rsp{disp:+} = {want:#x}", e.addr));
                                    rsp = None;
                                }
                            }
                            None => rsp = Some(got.wrapping_sub(disp as u64)),
                        }
                    }
                }
            }
        } else if rep && lk.is_empty() && i.is_string_instruction() {
            tally.rep_final += 1;
            pending_rep_end = Some(e.addr);
        } else if let Some(k) = KNOWN
            .iter()
            .find(|k| k.mnemonics.contains(&i.mnemonic()) && (k.accepts)(i, ours, &lk))
        {
            *tally
                .known
                .entry(format!("{:?}: {}", i.mnemonic(), k.reason))
                .or_default() += 1;
        } else if masked_lanes(i, ours, &lk) {
            *tally
                .known
                .entry(format!(
                    "{:?}: VEX makes one guarded access per lane (Lackey shows the enabled \
                     ones); the machine one access of the whole operand",
                    i.mnemonic()
                ))
                .or_default() += 1;
        } else {
            let entry = tally
                .unexplained
                .entry(format!("{:?}", i.mnemonic()))
                .or_insert_with(|| {
                    (
                        0,
                        format!("{name}: {:#x} {i}: Lackey {lk:?}, ours {ours:?}", e.addr),
                    )
                });
            entry.0 += 1;
        }
        rsp = next_rsp(&mut factory, i, rsp, &e.data);
    }
    execs.len() as u64
}

#[test]
fn data_accesses_match_lackey() {
    testkit::require("valgrind");
    let mut tally = Tally::default();
    for name in FIXTURES {
        let n = compare_fixture(name, &mut tally);
        eprintln!("{name}: {n} instruction executions");
        assert!(n > 1000, "{name}: only {n} instruction executions traced");
    }
    eprintln!(
        "compared {} executions: {} equal, {} final rep checks, addresses checked: {} absolute, {} stack",
        tally.execs, tally.equal, tally.rep_final, tally.static_addrs, tally.stack_addrs
    );
    for (k, n) in &tally.known {
        eprintln!("  known VEX artefact x{n}: {k}");
    }
    let unexplained: Vec<String> = tally
        .unexplained
        .iter()
        .map(|(m, (n, ex))| format!("{m} x{n}, e.g. {ex}"))
        .collect();
    assert!(
        unexplained.is_empty(),
        "unexplained differences:\n{}",
        unexplained.join("\n")
    );
    assert!(
        tally.addr_errors.is_empty(),
        "address differences:\n{}",
        tally.addr_errors.join("\n")
    );
    // The checks must have had something to check.
    assert!(tally.static_addrs > 1_000, "few absolute addresses checked");
    assert!(tally.stack_addrs > 10_000, "few stack addresses checked");
}
