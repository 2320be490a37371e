//! CPUID cache auto-detection (spec §2.3), as a pure decoder: the caller
//! supplies a `cpuid(leaf, subleaf) -> [eax, ebx, ecx, edx]` function, so
//! recorded values from other machines can be replayed in tests.

/// What a hardware cache holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheKind {
    /// Data only.
    Data,
    /// Instructions only.
    Instr,
    /// Both.
    Unified,
}

/// One cache reported by the CPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HwCache {
    /// Data, instruction or unified.
    pub kind: CacheKind,
    /// 1 for L1, 2 for L2, ...
    pub level: u32,
    /// Size in bytes (for a trace cache: thousands of micro-ops × 1024).
    pub size: u32,
    /// Ways per set.
    pub assoc: u32,
    /// Line size in bytes (0 for a trace cache).
    pub line_size: u32,
    /// A Pentium 4 micro-op trace cache, whose size is not in bytes.
    pub is_trace_cache: bool,
}

/// The caches CPUID reported, after Valgrind's sanity check.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HwCacheInfo {
    /// The highest level seen.
    pub levels: u32,
    /// Every cache, in discovery order.
    pub caches: Vec<HwCache>,
}

/// Why detection gave nothing usable (Valgrind then falls back to its
/// defaults).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DetectError {
    /// CPUID's maximum basic leaf is 0.
    NoLeaves,
    /// Intel CPU with a maximum leaf below 2.
    IntelLevelTooLow,
    /// Intel leaf 2 asks for more than one call (AL != 1).
    IntelTrials,
    /// An IA-64 descriptor byte (Valgrind panics on these).
    Ia64,
    /// AMD CPU without extended leaf 0x80000006.
    AmdExtLevelTooLow,
    /// An unknown vendor string.
    UnknownVendor,
    /// The reported caches failed the sanity rules.
    NotSensible,
}

/// Reads the x86 cache hierarchy with `cpuid(leaf, subleaf)`, as Valgrind's
/// `m_cache.c` does (Intel leaf 2 descriptors and leaf 4, AMD extended
/// leaves, Centaur fixed values), then applies its sanity check.
pub fn detect(mut cpuid: impl FnMut(u32, u32) -> [u32; 4]) -> Result<HwCacheInfo, DetectError> {
    let [max_leaf, b, c, d] = cpuid(0, 0);
    if max_leaf == 0 {
        return Err(DetectError::NoLeaves);
    }
    let mut vendor = [0u8; 12];
    vendor[0..4].copy_from_slice(&b.to_le_bytes());
    vendor[4..8].copy_from_slice(&d.to_le_bytes());
    vendor[8..12].copy_from_slice(&c.to_le_bytes());
    let mut info = match &vendor {
        b"GenuineIntel" => intel(max_leaf, &mut cpuid)?,
        b"AuthenticAMD" => amd(&mut cpuid)?,
        b"CentaurHauls" => {
            // Valgrind pretends to be a VIA Nehemiah.
            let mut ci = HwCacheInfo::default();
            add(&mut ci, CacheKind::Data, 1, 64, 16, 16);
            add(&mut ci, CacheKind::Instr, 1, 64, 4, 16);
            add(&mut ci, CacheKind::Unified, 2, 64, 16, 16);
            ci
        }
        _ => return Err(DetectError::UnknownVendor),
    };
    for c in &mut info.caches {
        c.size = c.size.wrapping_mul(1024);
    }
    if !is_sensible(&info) {
        return Err(DetectError::NotSensible);
    }
    Ok(info)
}

/// Records a cache; `size` is in KB here (converted to bytes at the end).
fn add(ci: &mut HwCacheInfo, kind: CacheKind, level: u32, size: u32, assoc: u32, line: u32) {
    ci.levels = ci.levels.max(level);
    ci.caches.push(HwCache {
        kind,
        level,
        size,
        assoc,
        line_size: line,
        is_trace_cache: false,
    });
}

/// The byte view of four CPUID registers, as Valgrind's `UChar info[16]`.
fn bytes(regs: [u32; 4]) -> [u8; 16] {
    let mut b = [0u8; 16];
    for (chunk, r) in b.chunks_exact_mut(4).zip(regs) {
        chunk.copy_from_slice(&r.to_le_bytes());
    }
    b
}

/// Intel: leaf 2 descriptor bytes, with `0xff` deferring to leaf 4.
fn intel(
    max_leaf: u32,
    cpuid: &mut impl FnMut(u32, u32) -> [u32; 4],
) -> Result<HwCacheInfo, DetectError> {
    use CacheKind::{Data as D, Instr as I, Unified as U};
    if max_leaf < 2 {
        return Err(DetectError::IntelLevelTooLow);
    }
    let eax1 = cpuid(1, 0)[0];
    let family = (((eax1 >> 20) & 0xff) << 4) + ((eax1 >> 8) & 0xf);
    let model = (((eax1 >> 16) & 0xf) << 4) + ((eax1 >> 4) & 0xf);

    let mut info = bytes(cpuid(2, 0));
    if info[0] != 1 {
        return Err(DetectError::IntelTrials);
    }
    info[0] = 0;
    let mut ci = HwCacheInfo::default();
    // Indexing (not iterating) on purpose: descriptor 0xff overwrites the
    // buffer with the last leaf-4 result, and Valgrind then goes on
    // decoding the remaining positions from that buffer.
    for i in 0..16 {
        let (kind, level, size, assoc, line) = match info[i] {
            0x00 => continue,
            // TLB and prefetch information, and "no L2/L3" (0x40).
            0x01..=0x05 | 0x0b | 0x4f..=0x52 | 0x55..=0x57 | 0x59 | 0x5a..=0x5d | 0x76 => continue,
            0xb0..=0xb4 | 0xba | 0xc0 | 0xca | 0xf0 | 0xf1 | 0x40 => continue,
            0x10 | 0x15 | 0x1a | 0x88 | 0x89 | 0x8a | 0x8d | 0x90 | 0x96 | 0x9b => {
                return Err(DetectError::Ia64)
            }
            0x06 => (I, 1, 8, 4, 32),
            0x08 => (I, 1, 16, 4, 32),
            0x09 => (I, 1, 32, 4, 64),
            0x30 => (I, 1, 32, 8, 64),
            0x0a => (D, 1, 8, 2, 32),
            0x0c => (D, 1, 16, 4, 32),
            0x0d => (D, 1, 16, 4, 64),
            0x0e => (D, 1, 24, 6, 64),
            0x2c => (D, 1, 32, 8, 64),
            0x60 => (D, 1, 16, 8, 64),
            0x66 => (D, 1, 8, 4, 64),
            0x67 => (D, 1, 16, 4, 64),
            0x68 => (D, 1, 32, 4, 64),
            0x22 => (U, 3, 512, 4, 64),
            0x23 => (U, 3, 1024, 8, 64),
            0x25 => (U, 3, 2048, 8, 64),
            0x29 => (U, 3, 4096, 8, 64),
            0x46 => (U, 3, 4096, 4, 64),
            0x47 => (U, 3, 8192, 8, 64),
            0x4a => (U, 3, 6144, 12, 64),
            0x4b => (U, 3, 8192, 16, 64),
            0x4c => (U, 3, 12288, 12, 64),
            0x4d => (U, 3, 16384, 16, 64),
            0xd0 => (U, 3, 512, 4, 64),
            0xd1 => (U, 3, 1024, 4, 64),
            0xd2 => (U, 3, 2048, 4, 64),
            0xd6 => (U, 3, 1024, 8, 64),
            0xd7 => (U, 3, 2048, 8, 64),
            0xd8 => (U, 3, 4096, 8, 64),
            0xdc => (U, 3, 1536, 12, 64),
            0xdd => (U, 3, 3072, 12, 64),
            0xde => (U, 3, 6144, 12, 64),
            0xe2 => (U, 3, 2048, 16, 64),
            0xe3 => (U, 3, 4096, 16, 64),
            0xe4 => (U, 3, 8192, 16, 64),
            0xea => (U, 3, 12288, 24, 64),
            0xeb => (U, 3, 18432, 24, 64),
            0xec => (U, 3, 24576, 24, 64),
            0x21 => (U, 2, 256, 8, 64),
            0x39 => (U, 2, 128, 4, 64),
            0x3c => (U, 2, 256, 4, 64),
            0x41 => (U, 2, 128, 4, 32),
            0x42 => (U, 2, 256, 4, 32),
            0x43 => (U, 2, 512, 4, 32),
            0x44 => (U, 2, 1024, 4, 32),
            0x45 => (U, 2, 2048, 4, 32),
            0x48 => (U, 2, 3072, 12, 64),
            0x4e => (U, 2, 6144, 24, 64),
            // Xeon MP (family 15, model 6) reuses 0x49 for its L3.
            0x49 if family == 15 && model == 6 => (U, 3, 4096, 16, 64),
            0x49 => (U, 2, 4096, 16, 64),
            0x78 => (U, 2, 1024, 4, 64),
            0x79 => (U, 2, 128, 8, 64),
            0x7a => (U, 2, 256, 8, 64),
            0x7b => (U, 2, 512, 8, 64),
            0x7c => (U, 2, 1024, 8, 64),
            0x7d => (U, 2, 2048, 8, 64),
            0x7e => (U, 2, 256, 8, 128),
            0x7f => (U, 2, 512, 2, 64),
            0x80 => (U, 2, 512, 8, 64),
            0x81 => (U, 2, 128, 8, 32),
            0x82 => (U, 2, 256, 8, 32),
            0x83 => (U, 2, 512, 8, 32),
            0x84 => (U, 2, 1024, 8, 32),
            0x85 => (U, 2, 2048, 8, 32),
            0x86 => (U, 2, 512, 4, 64),
            0x87 => (U, 2, 1024, 8, 64),
            // Pentium 4 trace caches: sizes in K micro-ops, 8-way.
            code @ 0x70..=0x72 => {
                let kuops = [12, 16, 32][usize::from(code - 0x70)];
                add(&mut ci, I, 1, kuops, 8, 0);
                if let Some(last) = ci.caches.last_mut() {
                    last.is_trace_cache = true;
                }
                continue;
            }
            0xff => {
                let mut j = 0;
                let mut regs = cpuid(4, j);
                j += 1;
                while regs[0] & 0x1f != 0 {
                    let [eax, ebx, ecx, _] = regs;
                    let assoc = ((ebx >> 22) & 0x3ff) + 1;
                    let parts = ((ebx >> 12) & 0x3ff) + 1;
                    let line = (ebx & 0x7ff) + 1;
                    let sets = ecx.wrapping_add(1);
                    let size = assoc
                        .wrapping_mul(parts)
                        .wrapping_mul(line)
                        .wrapping_mul(sets)
                        / 1024;
                    let kind = match eax & 0x1f {
                        1 => Some(D),
                        2 => Some(I),
                        3 => Some(U),
                        _ => None,
                    };
                    let level = (eax & 0xe0) >> 5;
                    if let (Some(kind), 1..=3) = (kind, level) {
                        add(&mut ci, kind, level, size, assoc, line);
                    }
                    regs = cpuid(4, j);
                    j += 1;
                }
                info = bytes(regs);
                continue;
            }
            _ => continue,
        };
        add(&mut ci, kind, level, size, assoc, line);
    }
    Ok(ci)
}

/// Valgrind's decoding of AMD's 4-bit L2/L3 associativity field.
fn amd_assoc(bits: u32) -> u32 {
    match bits & 0xf {
        1 => 1,
        2 => 2,
        4 => 4,
        6 => 8,
        8 => 16,
        0xa => 32,
        0xb => 48,
        0xc => 64,
        0xd => 96,
        0xe => 128,
        _ => 1,
    }
}

/// AMD: leaves 0x80000005 (L1) and 0x80000006 (L2, L3).
fn amd(cpuid: &mut impl FnMut(u32, u32) -> [u32; 4]) -> Result<HwCacheInfo, DetectError> {
    let ext = cpuid(0x8000_0000, 0)[0];
    if ext & 0x8000_0000 == 0 || ext < 0x8000_0006 {
        return Err(DetectError::AmdExtLevelTooLow);
    }
    let [_, _, d1, i1] = cpuid(0x8000_0005, 0);
    let [_, _, mut l2, l3] = cpuid(0x8000_0006, 0);
    if cpuid(1, 0)[0] == 0x630 {
        // Duron stepping A0 misreports its 64 KB L2 as 1 KB.
        l2 = (64 << 16) | (l2 & 0xffff);
    }
    let mut ci = HwCacheInfo::default();
    let l1 = |r: u32| ((r >> 24) & 0xff, (r >> 16) & 0xff, r & 0xff);
    let (s, a, l) = l1(d1);
    add(&mut ci, CacheKind::Data, 1, s, a, l);
    let (s, a, l) = l1(i1);
    add(&mut ci, CacheKind::Instr, 1, s, a, l);
    add(
        &mut ci,
        CacheKind::Unified,
        2,
        (l2 >> 16) & 0xffff,
        amd_assoc(l2 >> 12),
        l2 & 0xff,
    );
    let l3_units = (l3 >> 18) & 0x3fff;
    if l3_units > 0 {
        add(
            &mut ci,
            CacheKind::Unified,
            3,
            l3_units * 512,
            amd_assoc(l3 >> 12),
            l3 & 0xff,
        );
    }
    Ok(ci)
}

/// Valgrind's `cache_info_is_sensible`.
fn is_sensible(ci: &HwCacheInfo) -> bool {
    for level in 1..=ci.levels {
        let count = |k: CacheKind| {
            ci.caches
                .iter()
                .filter(|c| c.level == level && c.kind == k)
                .count()
        };
        let (ni, nd, nu) = (
            count(CacheKind::Instr),
            count(CacheKind::Data),
            count(CacheKind::Unified),
        );
        if ni + nd + nu == 0 || ni > 1 || nd > 1 || nu > 1 || (nu != 0 && ni + nd > 0) {
            return false;
        }
    }
    (2..=ci.levels).all(|level| ci.caches.iter().any(|c| c.level == level - 1))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::collections::HashMap;

    /// A recorded CPUID table; missing entries read as zeros.
    pub(crate) fn table(entries: &[((u32, u32), [u32; 4])]) -> impl FnMut(u32, u32) -> [u32; 4] {
        let map: HashMap<(u32, u32), [u32; 4]> = entries.iter().copied().collect();
        move |leaf, sub| map.get(&(leaf, sub)).copied().unwrap_or([0; 4])
    }

    /// Vendor registers (EBX, EDX, ECX order in the string).
    fn vendor(max: u32, name: &[u8; 12]) -> [u32; 4] {
        let w = |i: usize| u32::from_le_bytes(name[i..i + 4].try_into().unwrap());
        [max, w(0), w(8), w(4)]
    }

    /// This machine (AMD EPYC under a hypervisor), recorded with
    /// `__cpuid_count`; Valgrind 3.19 reports I1=D1=32768,8,64 and an L3
    /// of 335544320 B, 1-way (assoc code 9 decodes to 1), 64 B lines.
    pub(crate) fn amd_epyc() -> impl FnMut(u32, u32) -> [u32; 4] {
        table(&[
            ((0, 0), vendor(0x1c, b"AuthenticAMD")),
            ((1, 0), [0x00a10f11, 0x01020800, 0xfffa3203, 0x178bfbff]),
            (
                (0x8000_0000, 0),
                [0x80000021, 0x68747541, 0x444d4163, 0x69746e65],
            ),
            (
                (0x8000_0005, 0),
                [0xff48ff40, 0xff48ff40, 0x20080140, 0x20080140],
            ),
            (
                (0x8000_0006, 0),
                [0x5c002200, 0x6c004200, 0x04006140, 0x0a009140],
            ),
        ])
    }

    /// A Xeon like the one the spec's [V] results came from (Valgrind
    /// reported I1=32768,8,64 D1=49152,12,64 LL=314572800,20,64 there):
    /// leaf 2 says "use leaf 4", whose subleaves give a 48K/12 L1d, a
    /// 32K/8 L1i, a 1.25M/20 L2 and a 300M/20 L3.
    pub(crate) fn intel_xeon() -> impl FnMut(u32, u32) -> [u32; 4] {
        // Leaf 4 encodings: eax = level<<5 | type, ebx = (ways-1)<<22 |
        // (parts-1)<<12 | (line-1), ecx = sets-1.
        let l4 = |ty: u32, level: u32, ways: u32, sets: u32| {
            [(level << 5) | ty, ((ways - 1) << 22) | 63, sets - 1, 0]
        };
        table(&[
            ((0, 0), vendor(0x1b, b"GenuineIntel")),
            ((1, 0), [0x000606a6, 0, 0, 0]),
            ((2, 0), [0x00feff01, 0x000000f0, 0, 0]),
            ((4, 0), l4(1, 1, 12, 64)),
            ((4, 1), l4(2, 1, 8, 64)),
            ((4, 2), l4(3, 2, 20, 1024)),
            ((4, 3), l4(3, 3, 20, 245_760)),
        ])
    }

    fn find(ci: &HwCacheInfo, kind: CacheKind, level: u32) -> (u32, u32, u32) {
        let c = ci
            .caches
            .iter()
            .find(|c| c.kind == kind && c.level == level)
            .unwrap();
        (c.size, c.assoc, c.line_size)
    }

    #[test]
    fn amd_epyc_here() {
        let ci = detect(amd_epyc()).unwrap();
        assert_eq!(ci.levels, 3);
        assert_eq!(find(&ci, CacheKind::Data, 1), (32768, 8, 64));
        assert_eq!(find(&ci, CacheKind::Instr, 1), (32768, 8, 64));
        assert_eq!(find(&ci, CacheKind::Unified, 2), (1 << 20, 8, 64));
        assert_eq!(find(&ci, CacheKind::Unified, 3), (335_544_320, 1, 64));
    }

    #[test]
    fn intel_leaf4() {
        let ci = detect(intel_xeon()).unwrap();
        assert_eq!(ci.levels, 3);
        assert_eq!(find(&ci, CacheKind::Data, 1), (49152, 12, 64));
        assert_eq!(find(&ci, CacheKind::Instr, 1), (32768, 8, 64));
        assert_eq!(find(&ci, CacheKind::Unified, 3), (314_572_800, 20, 64));
    }

    #[test]
    fn intel_leaf2_descriptors() {
        // Core 2 style: 0x30 (I1 32K/8), 0x2c (D1 32K/8), 0x7d (L2 2M/8),
        // plus TLB bytes that are ignored.
        let ci = detect(table(&[
            ((0, 0), vendor(10, b"GenuineIntel")),
            ((2, 0), [0x0b7d3001, 0x2c5a5657, 0, 0]),
        ]))
        .unwrap();
        assert_eq!(ci.levels, 2);
        assert_eq!(find(&ci, CacheKind::Instr, 1), (32768, 8, 64));
        assert_eq!(find(&ci, CacheKind::Data, 1), (32768, 8, 64));
        assert_eq!(find(&ci, CacheKind::Unified, 2), (2 << 20, 8, 64));
    }

    #[test]
    fn intel_0x49_depends_on_family_model() {
        let regs = [0x002c3001, 0x00000049, 0, 0];
        let xeon_mp = detect(table(&[
            ((0, 0), vendor(2, b"GenuineIntel")),
            ((1, 0), [0x00000f60, 0, 0, 0]),
            ((2, 0), regs),
        ]));
        // An L3 with no L2 fails the sanity check.
        assert_eq!(xeon_mp, Err(DetectError::NotSensible));
        let other = detect(table(&[
            ((0, 0), vendor(2, b"GenuineIntel")),
            ((1, 0), [0x000006f6, 0, 0, 0]),
            ((2, 0), regs),
        ]))
        .unwrap();
        assert_eq!(find(&other, CacheKind::Unified, 2), (4 << 20, 16, 64));
    }

    #[test]
    fn intel_failures() {
        let v = vendor(2, b"GenuineIntel");
        assert_eq!(
            detect(table(&[((0, 0), vendor(1, b"GenuineIntel"))])),
            Err(DetectError::IntelLevelTooLow)
        );
        assert_eq!(
            detect(table(&[((0, 0), v), ((2, 0), [0x2c3002, 0, 0, 0])])),
            Err(DetectError::IntelTrials)
        );
        assert_eq!(
            detect(table(&[((0, 0), v), ((2, 0), [0x2c3001, 0x10, 0, 0])])),
            Err(DetectError::Ia64)
        );
        assert_eq!(detect(table(&[])), Err(DetectError::NoLeaves));
        assert_eq!(
            detect(table(&[((0, 0), vendor(5, b"CyrixInstead"))])),
            Err(DetectError::UnknownVendor)
        );
    }

    #[test]
    fn pentium4_trace_cache() {
        let ci = detect(table(&[
            ((0, 0), vendor(2, b"GenuineIntel")),
            ((2, 0), [0x665b5001, 0, 0, 0x007a7000]),
        ]))
        .unwrap();
        let t = ci.caches.iter().find(|c| c.is_trace_cache).unwrap();
        assert_eq!(
            (t.size, t.assoc, t.line_size, t.level),
            (12 * 1024, 8, 0, 1)
        );
    }

    #[test]
    fn amd_without_l3_and_duron_bug() {
        let base = |eax1: u32| {
            detect(table(&[
                ((0, 0), vendor(1, b"AuthenticAMD")),
                ((1, 0), [eax1, 0, 0, 0]),
                ((0x8000_0000, 0), [0x8000_0008, 0, 0, 0]),
                ((0x8000_0005, 0), [0, 0, 0x40020140, 0x40020140]),
                ((0x8000_0006, 0), [0, 0, 0x00018140, 0]),
            ]))
            .unwrap()
        };
        let ci = base(0x6f2);
        assert_eq!(ci.levels, 2);
        assert_eq!(find(&ci, CacheKind::Unified, 2), (1024, 16, 64));
        assert_eq!(find(&ci, CacheKind::Data, 1), (65536, 2, 64));
        assert_eq!(find(&base(0x630), CacheKind::Unified, 2), (65536, 16, 64));
        assert_eq!(
            detect(table(&[
                ((0, 0), vendor(1, b"AuthenticAMD")),
                ((0x8000_0000, 0), [0x8000_0004, 0, 0, 0]),
            ])),
            Err(DetectError::AmdExtLevelTooLow)
        );
    }

    #[test]
    fn centaur_fixed_values() {
        let ci = detect(table(&[((0, 0), vendor(1, b"CentaurHauls"))])).unwrap();
        assert_eq!(find(&ci, CacheKind::Instr, 1), (65536, 4, 16));
        assert_eq!(find(&ci, CacheKind::Data, 1), (65536, 16, 16));
        assert_eq!(find(&ci, CacheKind::Unified, 2), (65536, 16, 16));
    }

    #[test]
    fn amd_assoc_decoding() {
        let got: Vec<u32> = (0..16).map(amd_assoc).collect();
        assert_eq!(got, [1, 1, 2, 1, 4, 1, 8, 1, 16, 1, 32, 48, 64, 96, 128, 1]);
    }
}
