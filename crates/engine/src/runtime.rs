//! The calling-context runtime's blob (`ctxrt`, built by `build.rs` from
//! `runtime/blob.rs`), which the tracer maps into each client's core
//! region for `--tool=callgrind` runs that keep their contexts in the
//! client (`docs/client-contexts.md`).

#[cfg(test)]
use iced_x86::Mnemonic;
use iced_x86::{Decoder, DecoderOptions, OpKind, Register};

include!(concat!(env!("OUT_DIR"), "/blob.rs"));

/// The blob as mapped at `base`: its relative relocations applied.
pub fn image_at(base: u64) -> Vec<u8> {
    let mut image = BLOB.to_vec();
    for &(at, addend) in RELATIVE {
        let at = at as usize;
        image[at..at + 8].copy_from_slice(&(base + addend).to_le_bytes());
    }
    image
}

/// The blob's instructions: its executable segments, decoded.
fn blob_code() -> impl Iterator<Item = iced_x86::Instruction> {
    CODE.iter().flat_map(|&(start, end)| {
        let bytes = &BLOB[start as usize..end as usize];
        Decoder::with_ip(64, bytes, start, DecoderOptions::NONE).into_iter()
    })
}

/// The vector registers the blob's code names: the XMM registers (which
/// the stub saves around the runtime, the client's being live across it),
/// then any other vector, mask or x87 register (there must be none: the
/// stub saves no such state). Not counting `core::fmt`'s code, linked for
/// panic messages but never run: the panic handler formats nothing.
pub fn vector_registers() -> (Vec<Register>, Vec<Register>) {
    let (mut xmm, mut other) = (Vec::new(), Vec::new());
    let formatting = |ip: u64| FORMATTING.iter().any(|&(s, e)| (s..e).contains(&ip));
    for i in blob_code().filter(|i| !formatting(i.ip())) {
        for k in 0..i.op_count() {
            if i.op_kind(k) != OpKind::Register {
                continue;
            }
            let r = i.op_register(k);
            let list = if r.is_xmm() {
                &mut xmm
            } else if r.is_ymm() || r.is_zmm() || r.is_k() || r.is_st() || r.is_mm() {
                &mut other
            } else {
                continue;
            };
            if !list.contains(&r) {
                list.push(r);
            }
        }
    }
    xmm.sort_by_key(|r| r.number());
    (xmm, other)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_blob_touches_only_xmm_registers_of_the_vector_state() {
        assert!(BLOB.len() > 64 && (ENTRY as usize) < BLOB.len());
        let (xmm, other) = vector_registers();
        assert!(other.is_empty(), "{other:?}");
        assert!(xmm.len() <= 16);
        assert!(!FORMATTING.is_empty(), "core::fmt is linked for panics");
        // Nothing outside it branches into it (it is reached only through
        // the function pointers of a panic message, which nothing formats).
        let formatting = |ip: u64| FORMATTING.iter().any(|&(s, e)| (s..e).contains(&ip));
        for i in blob_code().filter(|i| !formatting(i.ip())) {
            if i.is_call_near() || i.is_jmp_near() || i.is_jcc_short_or_near() {
                let to = i.near_branch_target();
                assert!(!formatting(to), "{i} at {:#x} enters core::fmt", i.ip());
            }
        }
    }

    #[test]
    fn the_blob_leaves_every_flag_but_the_arithmetic_ones() {
        // The stub keeps only the arithmetic flags (`lahf`/`seto`): string
        // instructions come right after the direction flag is set for
        // them, inside a `pushfq`/`popfq` pair, and nothing else writes a
        // system flag.
        let code: Vec<_> = blob_code().collect();
        let mut strings = 0;
        for (n, i) in code.iter().enumerate() {
            let system = i.rflags_modified()
                & !iced_x86::RflagsBits::OF
                & !(iced_x86::RflagsBits::SF
                    | iced_x86::RflagsBits::ZF
                    | iced_x86::RflagsBits::AF
                    | iced_x86::RflagsBits::PF
                    | iced_x86::RflagsBits::CF);
            if i.is_string_instruction() {
                strings += 1;
                let before = code[n - 1].mnemonic();
                assert!(
                    matches!(before, Mnemonic::Cld | Mnemonic::Std),
                    "{i} at {:#x} after {before:?}",
                    i.ip()
                );
                assert_eq!(code[n - 2].mnemonic(), Mnemonic::Pushfq);
                assert_eq!(code[n + 1].mnemonic(), Mnemonic::Popfq);
            } else if system != 0 {
                assert!(
                    matches!(
                        i.mnemonic(),
                        Mnemonic::Cld | Mnemonic::Std | Mnemonic::Popfq
                    ),
                    "{i} at {:#x} writes a system flag",
                    i.ip()
                );
            }
        }
        assert!(strings >= 3, "memcpy, memmove and memset");
    }

    #[test]
    fn relocations_are_words_of_the_image_set_to_its_address() {
        let base = 0x7000_0000;
        let image = image_at(base);
        for &(at, addend) in RELATIVE {
            let w = u64::from_le_bytes(image[at as usize..][..8].try_into().unwrap());
            assert_eq!(w, base + addend);
            assert!(addend < BLOB.len() as u64, "points into the blob");
        }
    }
}

#[cfg(test)]
mod native {
    use super::*;
    use callrules::{Exit, Flow};
    use ctxrt::{hot, Arena, Facts, Runtime, FACT_WORDS, NONE};

    /// Block 0 of f0 calls f1 (block 1), which returns to block 2 of f0.
    fn facts() -> Vec<u64> {
        let block = |start, f, index, exit, entry| {
            let mut flow = Flow::new(start, start + 4, start + 5, exit);
            (flow.function, flow.entry) = (f, entry);
            let sp_known = exit != Exit::Jump;
            Facts {
                flow,
                group: f,
                index,
                instrs: 2,
                sp_known,
                memo: false,
            }
            .pack()
        };
        [
            block(0x1000, 0, 0, Exit::Call, true),
            block(0x2000, 1, 0, Exit::Return, true),
            block(0x1005, 0, 1, Exit::Jump, false),
        ]
        .concat()
    }

    /// The blob and the library, run on the same entries, leave the same
    /// words.
    #[test]
    fn the_blob_runs_the_runtime_as_the_library_does() {
        let facts = facts();
        // Flat contexts (`Runtime::flat`), as a run without exports has them.
        // (Written out: `runtime_config` gives the process table's length.)
        let config: [u64; ctxrt::CONFIG_WORDS] = [facts.as_ptr() as u64, facts.len() as u64, 2, 1];
        let entries = [(0u64, NONE, 0x8000u64), (1, 0, 0x7ff8), (2, 1, 0x8000)];
        let mut blob_arena = vec![0u64; 1 << 20];
        let mut hot_words = vec![0u64; hot::WORDS];
        hot_words[hot::ARENA] = blob_arena.as_mut_ptr() as u64;
        hot_words[hot::ARENA_WORDS] = blob_arena.len() as u64;
        let mut lib_arena = vec![0u64; 1 << 20];
        let mut lib_hot = hot_words.clone();
        lib_hot[hot::ARENA] = blob_arena.as_ptr() as u64;
        for (y, last, sp) in entries {
            hot_words[hot::LAST] = last;
            let args = [
                0,
                hot_words.as_mut_ptr() as u64,
                config.as_ptr() as u64,
                y,
                sp,
            ];
            assert_eq!(crate::sys::call_blob(image_at, ENTRY, args), 0);
            lib_hot[hot::LAST] = last;
            let mut rt = Runtime {
                hot: &mut lib_hot,
                arena: &mut lib_arena,
                facts: &facts,
                separate_recs: 2,
                flat: true,
            };
            rt.enter(y, sp).expect("room");
            assert_eq!(hot_words, lib_hot);
            // A run of the block's 2 instructions, as translated code counts.
            let cur = (hot_words[hot::CUR] - hot_words[hot::ARENA]) as usize / 8;
            let index = Facts::unpack(&facts[y as usize * FACT_WORDS..][..FACT_WORDS])
                .unwrap()
                .index;
            blob_arena[cur + index as usize] += 2;
            lib_arena[cur + index as usize] += 2;
            hot_words[hot::IR] += 2;
            lib_hot[hot::IR] += 2;
        }
        assert_eq!(blob_arena, lib_arena);
        let arcs: Vec<_> = Arena::new(&blob_arena).arcs().collect();
        assert_eq!((arcs.len(), arcs[0].calls, arcs[0].inclusive), (1, 1, 2));
    }
}
