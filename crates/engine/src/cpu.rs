//! What this processor can run: an instruction whose CPUID feature it lacks
//! raises SIGILL natively, and must under the engine too (its copy in the
//! code cache would fault at a host address instead of the client's). The
//! features are read once with CPUID; a feature not in the table is taken
//! as present (the instruction is copied and runs, or faults, natively).

use iced_x86::{CpuidFeature as F, Instruction};
use std::arch::x86_64::__cpuid_count;
use std::sync::OnceLock;

/// A CPUID bit: leaf, subleaf, register (0 = EAX .. 3 = EDX), bit.
type Bit = (u32, u32, u8, u8);

/// Where CPUID reports `f`, for the features a current x86-64 processor
/// may lack (`None`: not tracked, taken as present).
fn bit(f: F) -> Option<Bit> {
    const EBX: u8 = 1;
    const ECX: u8 = 2;
    const EDX: u8 = 3;
    const EAX: u8 = 0;
    Some(match f {
        F::SSE3 => (1, 0, ECX, 0),
        F::PCLMULQDQ => (1, 0, ECX, 1),
        F::SSSE3 => (1, 0, ECX, 9),
        F::FMA => (1, 0, ECX, 12),
        F::CMPXCHG16B => (1, 0, ECX, 13),
        F::SSE4_1 => (1, 0, ECX, 19),
        F::SSE4_2 => (1, 0, ECX, 20),
        F::MOVBE => (1, 0, ECX, 22),
        F::POPCNT => (1, 0, ECX, 23),
        F::AES => (1, 0, ECX, 25),
        F::XSAVE => (1, 0, ECX, 26),
        F::AVX => (1, 0, ECX, 28),
        F::F16C => (1, 0, ECX, 29),
        F::RDRAND => (1, 0, ECX, 30),
        F::FSGSBASE => (7, 0, EBX, 0),
        F::BMI1 => (7, 0, EBX, 3),
        F::HLE => (7, 0, EBX, 4),
        F::AVX2 => (7, 0, EBX, 5),
        F::BMI2 => (7, 0, EBX, 8),
        F::RTM => (7, 0, EBX, 11),
        F::MPX => (7, 0, EBX, 14),
        F::AVX512F => (7, 0, EBX, 16),
        F::AVX512DQ => (7, 0, EBX, 17),
        F::RDSEED => (7, 0, EBX, 18),
        F::ADX => (7, 0, EBX, 19),
        F::AVX512_IFMA => (7, 0, EBX, 21),
        F::CLFLUSHOPT => (7, 0, EBX, 23),
        F::CLWB => (7, 0, EBX, 24),
        F::AVX512PF => (7, 0, EBX, 26),
        F::AVX512ER => (7, 0, EBX, 27),
        F::AVX512CD => (7, 0, EBX, 28),
        F::SHA => (7, 0, EBX, 29),
        F::AVX512BW => (7, 0, EBX, 30),
        F::AVX512VL => (7, 0, EBX, 31),
        F::PREFETCHWT1 => (7, 0, ECX, 0),
        F::AVX512_VBMI => (7, 0, ECX, 1),
        F::WAITPKG => (7, 0, ECX, 5),
        F::AVX512_VBMI2 => (7, 0, ECX, 6),
        F::GFNI => (7, 0, ECX, 8),
        F::VAES => (7, 0, ECX, 9),
        F::VPCLMULQDQ => (7, 0, ECX, 10),
        F::AVX512_VNNI => (7, 0, ECX, 11),
        F::AVX512_BITALG => (7, 0, ECX, 12),
        F::AVX512_VPOPCNTDQ => (7, 0, ECX, 14),
        F::RDPID => (7, 0, ECX, 22),
        F::KL => (7, 0, ECX, 23),
        F::CLDEMOTE => (7, 0, ECX, 25),
        F::MOVDIRI => (7, 0, ECX, 27),
        F::MOVDIR64B => (7, 0, ECX, 28),
        F::ENQCMD => (7, 0, ECX, 29),
        F::AVX512_4VNNIW => (7, 0, EDX, 2),
        F::AVX512_4FMAPS => (7, 0, EDX, 3),
        F::UINTR => (7, 0, EDX, 5),
        F::AVX512_VP2INTERSECT => (7, 0, EDX, 8),
        F::SERIALIZE => (7, 0, EDX, 14),
        F::TSXLDTRK => (7, 0, EDX, 16),
        F::PCONFIG => (7, 0, EDX, 18),
        F::AMX_BF16 => (7, 0, EDX, 22),
        F::AVX512_FP16 => (7, 0, EDX, 23),
        F::AMX_TILE => (7, 0, EDX, 24),
        F::AMX_INT8 => (7, 0, EDX, 25),
        F::SHA512 => (7, 1, EAX, 0),
        F::SM3 => (7, 1, EAX, 1),
        F::SM4 => (7, 1, EAX, 2),
        F::RAO_INT => (7, 1, EAX, 3),
        F::AVX_VNNI => (7, 1, EAX, 4),
        F::AVX512_BF16 => (7, 1, EAX, 5),
        F::CMPCCXADD => (7, 1, EAX, 7),
        F::AMX_FP16 => (7, 1, EAX, 21),
        F::HRESET => (7, 1, EAX, 22),
        F::AVX_IFMA => (7, 1, EAX, 23),
        F::MSRLIST => (7, 1, EAX, 27),
        F::AVX_VNNI_INT8 => (7, 1, EDX, 4),
        F::AVX_NE_CONVERT => (7, 1, EDX, 5),
        F::AMX_COMPLEX => (7, 1, EDX, 8),
        F::AVX_VNNI_INT16 => (7, 1, EDX, 10),
        F::PREFETCHITI => (7, 1, EDX, 14),
        F::XSAVEOPT => (0xd, 1, EAX, 0),
        F::XSAVEC => (0xd, 1, EAX, 1),
        F::XSAVES => (0xd, 1, EAX, 3),
        F::LZCNT => (0x8000_0001, 0, ECX, 5),
        F::SSE4A => (0x8000_0001, 0, ECX, 6),
        F::PREFETCHW => (0x8000_0001, 0, ECX, 8),
        F::XOP => (0x8000_0001, 0, ECX, 11),
        F::FMA4 => (0x8000_0001, 0, ECX, 16),
        F::TBM => (0x8000_0001, 0, ECX, 21),
        F::MONITORX => (0x8000_0001, 0, ECX, 29),
        F::RDTSCP => (0x8000_0001, 0, EDX, 27),
        F::D3NOWEXT => (0x8000_0001, 0, EDX, 30),
        F::D3NOW => (0x8000_0001, 0, EDX, 31),
        F::CLZERO => (0x8000_0008, 0, EBX, 0),
        F::WBNOINVD => (0x8000_0008, 0, EBX, 9),
        _ => return None,
    })
}

/// Whether this processor reports CPUID bit `b`.
fn has_bit((leaf, sub, reg, bit): Bit) -> bool {
    // Leaves beyond the maximum return garbage: check the range first.
    let max = __cpuid_count(leaf & 0x8000_0000, 0).eax;
    if leaf > max {
        return false;
    }
    let r = __cpuid_count(leaf, sub);
    let v = [r.eax, r.ebx, r.ecx, r.edx][usize::from(reg)];
    v & (1 << bit) != 0
}

/// Whether this processor has feature `f` (cached).
fn has(f: F) -> bool {
    static KNOWN: OnceLock<Vec<bool>> = OnceLock::new();
    let known = KNOWN.get_or_init(|| {
        F::values()
            .map(|f| match (f, bit(f)) {
                // `xtest`: either will do.
                (F::HLE_or_RTM, _) => has_bit((7, 0, 1, 4)) || has_bit((7, 0, 1, 11)),
                (_, Some(b)) => has_bit(b),
                (_, None) => true,
            })
            .collect()
    });
    known.get(f as usize).copied().unwrap_or(true)
}

/// Whether `i` needs a feature this processor lacks (it raises SIGILL here).
pub fn lacks_feature(i: &Instruction) -> bool {
    i.cpuid_features().iter().any(|&f| !has(f))
}

#[cfg(test)]
mod tests {
    use super::*;
    use iced_x86::{Decoder, DecoderOptions};

    fn decode(bytes: &[u8]) -> Instruction {
        Decoder::with_ip(64, bytes, 0, DecoderOptions::NONE).decode()
    }

    #[test]
    fn features_agree_with_the_standard_library() {
        // add eax, ebx: every x86-64 has it.
        assert!(!lacks_feature(&decode(&[0x01, 0xd8])));
        // vpaddd ymm0, ymm1, ymm2 (AVX2).
        let avx2 = decode(&[0xc5, 0xf5, 0xfe, 0xc2]);
        assert_eq!(lacks_feature(&avx2), !is_x86_feature_detected!("avx2"));
        // xbegin (RTM).
        let xbegin = decode(&[0xc7, 0xf8, 0, 0, 0, 0]);
        assert_eq!(lacks_feature(&xbegin), !is_x86_feature_detected!("rtm"));
        // vaddps zmm0, zmm1, zmm2 (AVX-512F).
        let zmm = decode(&[0x62, 0xf1, 0x74, 0x48, 0x58, 0xc2]);
        assert_eq!(lacks_feature(&zmm), !is_x86_feature_detected!("avx512f"));
    }
}
