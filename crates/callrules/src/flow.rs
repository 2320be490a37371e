//! What Callgrind's decision at a block (`setup_bbcc`: call, return or
//! jump) reads of the block left and the block entered, in one compact
//! record per block id. Blocks that call or return are a large share of
//! the slow path's blocks in call-heavy programs (a quarter of python's),
//! and a program's blocks number in the hundreds of thousands: 32 bytes a
//! block instead of the block's and its function's full state keep the
//! decision's loads in the processor's caches.

/// A function's number (the tool's).
pub type FnId = u32;

/// How control leaves a block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// A `call` (direct or indirect).
    Call,
    /// A `ret`.
    Return,
    /// A jump (direct, conditional or indirect).
    Jump,
    /// Into the next block without a branch (a rep string instruction's
    /// block runs again for each iteration this way).
    FallThrough,
}

/// No function: an id no block was described under.
const UNDESCRIBED: FnId = FnId::MAX;

/// A block as the call and return decision sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Flow {
    /// Its function.
    pub function: FnId,
    /// Its object and section kind, as one number (a jump between two
    /// is a call).
    pub domain: u32,
    /// Its first instruction's address.
    pub start: u64,
    /// Its last instruction (where its call or jump is), from `start`.
    call_site: u32,
    /// Its end (where a call returns to), from `start`.
    end: u32,
    /// How control leaves it.
    pub exit: Exit,
    /// Whether a function starts at `start`.
    pub entry: bool,
    /// Calls to its function push no context (`--skip-plt`, `--fn-skip`).
    pub skip: bool,
    /// A jump out of its function first returns from it
    /// (`_dl_runtime_resolve`).
    pub pop_on_jump: bool,
    /// Entering or leaving its function toggles, dumps or zeroes.
    pub notify: bool,
}

impl Default for Flow {
    fn default() -> Self {
        Flow {
            function: UNDESCRIBED,
            domain: 0,
            start: 0,
            call_site: 0,
            end: 0,
            exit: Exit::Jump,
            entry: false,
            skip: false,
            pop_on_jump: false,
            notify: false,
        }
    }
}

impl Flow {
    /// A block from `start` to `end` (exclusive) whose last instruction
    /// is at `call_site`; the rest as the fields say.
    pub fn new(start: u64, call_site: u64, end: u64, exit: Exit) -> Flow {
        Flow {
            start,
            call_site: (call_site - start) as u32,
            end: (end - start) as u32,
            exit,
            ..Flow::default()
        }
    }

    /// Whether a block was described under this id.
    #[inline]
    pub fn described(&self) -> bool {
        self.function != UNDESCRIBED
    }

    /// Its last instruction's address.
    #[inline]
    pub fn call_site(&self) -> u64 {
        self.start + u64::from(self.call_site)
    }

    /// Where a call at its end returns to.
    #[inline]
    pub fn end(&self) -> u64 {
        self.start + u64::from(self.end)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    extern crate std;

    #[test]
    fn addresses_round_trip_and_the_record_is_small() {
        let f = Flow::new(
            0x7fff_0000_1000,
            0x7fff_0000_1010,
            0x7fff_0000_1015,
            Exit::Call,
        );
        assert_eq!(f.call_site(), 0x7fff_0000_1010);
        assert_eq!(f.end(), 0x7fff_0000_1015);
        assert!(!f.described() && !Flow::default().described());
        assert!(core::mem::size_of::<Flow>() <= 32);
    }
}
