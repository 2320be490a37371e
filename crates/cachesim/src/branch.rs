//! Cachegrind's branch predictor (spec §3): 16384 two-bit saturating
//! counters indexed by 7 bits of global history and 7 bits of the branch
//! address, and a 512-entry branch target address cache for indirect
//! branches.

const HIST_BITS: u32 = 7;
const COUNTERS_LOG2: u32 = 14;
const COUNTERS: usize = 1 << COUNTERS_LOG2;
const BTAC_ENTRIES: usize = 512;

/// The conditional and indirect branch predictors, with Cachegrind's state
/// and update order.
#[derive(Debug, Clone)]
pub struct BranchPredictor {
    history: u64,
    counters: Box<[u8; COUNTERS]>,
    btac: Box<[u64; BTAC_ENTRIES]>,
    pc_shift: u32,
}

impl Default for BranchPredictor {
    fn default() -> Self {
        Self::new()
    }
}

impl BranchPredictor {
    /// A fresh predictor for x86/amd64 (branch addresses used unshifted).
    pub fn new() -> Self {
        Self::with_pc_shift(0)
    }

    /// A fresh predictor that ignores the `pc_shift` always-zero low bits
    /// of instruction addresses (2 on ppc, mips and arm64; 1 on s390x, arm
    /// and riscv64).
    pub fn with_pc_shift(pc_shift: u32) -> Self {
        BranchPredictor {
            history: 0,
            counters: Box::new([0; COUNTERS]),
            btac: Box::new([0; BTAC_ENTRIES]),
            pc_shift,
        }
    }

    /// A conditional branch at `pc` that was (`taken`) or was not taken.
    /// Returns `true` on a misprediction.
    #[inline]
    pub fn cond(&mut self, pc: u64, taken: bool) -> bool {
        let low_mask = (1u64 << (COUNTERS_LOG2 - HIST_BITS)) - 1;
        let hist_bits = self.history & ((1 << HIST_BITS) - 1);
        let pc_bits = (pc >> self.pc_shift) & low_mask;
        let idx = ((hist_bits << (COUNTERS_LOG2 - HIST_BITS)) | pc_bits) as usize % COUNTERS;
        let counter = &mut self.counters[idx];
        let mispredict = (*counter >= 2) != taken;
        self.history = (self.history << 1) | u64::from(taken);
        // Saturating up when taken, down when not, by arithmetic the
        // compiler makes branch-free: the outcome is as hard to guess for
        // the host as for the model, and a table lookup after the
        // counter's load had lengthened the chain from one branch's
        // counter to the next one's (a simulator spends its time there).
        let c = *counter;
        *counter = if taken {
            c + u8::from(c < 3)
        } else {
            c - u8::from(c > 0)
        };
        mispredict
    }

    /// log2 of the indirect predictor's entries, when a slot is the
    /// branch's address modulo their number (no low bits ignored): then
    /// whoever runs the branches can keep a copy of the table and tell
    /// which ones it would predict.
    pub fn btac_index_bits(&self) -> Option<u8> {
        (self.pc_shift == 0).then_some(BTAC_ENTRIES.trailing_zeros() as u8)
    }

    /// An indirect branch at `pc` that went to `target`. Returns `true` on
    /// a misprediction (the remembered target differed).
    #[inline]
    pub fn indirect(&mut self, pc: u64, target: u64) -> bool {
        let idx = ((pc >> self.pc_shift) as usize) % BTAC_ENTRIES;
        let slot = &mut self.btac[idx];
        let mispredict = *slot != target;
        *slot = target;
        mispredict
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Spec §3: `loop 1b` with rcx=10 (9 taken, 1 not taken) gave Bc=10,
    /// Bcm=10 on a fresh predictor.
    #[test]
    fn loop_example_mispredicts_every_time() {
        let mut bp = BranchPredictor::new();
        let pc = 0x401_0a5;
        let bcm: u32 = (0..10).map(|i| u32::from(bp.cond(pc, i < 9))).sum();
        assert_eq!(bcm, 10);
    }

    /// Spec §3: `rep movsb` with n=10 has 11 exits (10 "continue", then
    /// one "stop"); the 10th prediction is right, giving Bcm=10.
    #[test]
    fn rep_movsb_example() {
        let mut bp = BranchPredictor::new();
        let got: Vec<bool> = (0..11).map(|i| bp.cond(0x40_1000, i < 10)).collect();
        assert_eq!(got.iter().filter(|&&m| m).count(), 10);
        assert!(!got[9]);
    }

    #[test]
    fn counters_saturate_and_history_correlates() {
        let mut bp = BranchPredictor::new();
        // Always-taken branch: once history is all ones the same counter
        // is used and it saturates at 3, so a single not-taken mispredicts
        // and the next taken is still predicted taken.
        for _ in 0..20 {
            bp.cond(7, true);
        }
        assert!(!bp.cond(7, true));
        assert!(bp.cond(7, false));
        // History is now ...1110: a different counter, still cold.
        assert!(bp.cond(7, true));
    }

    #[test]
    fn indirect_btac() {
        let mut bp = BranchPredictor::new();
        assert!(bp.indirect(0x1000, 0x2000));
        assert!(!bp.indirect(0x1000, 0x2000));
        // 512 entries: pc and pc+512 share a slot.
        assert!(bp.indirect(0x1000 + 512, 0x3000));
        assert!(bp.indirect(0x1000, 0x2000));
        // A zero target is predicted for a never-seen slot.
        assert!(!bp.indirect(0x1001, 0));
    }

    #[test]
    fn pc_shift_drops_low_bits() {
        assert_eq!(BranchPredictor::new().btac_index_bits(), Some(9));
        let mut bp = BranchPredictor::with_pc_shift(2);
        assert_eq!(bp.btac_index_bits(), None);
        assert!(bp.indirect(0x1000, 9));
        assert!(!bp.indirect(0x1003, 9));
    }
}
