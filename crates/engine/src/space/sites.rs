//! Host code back to guest instructions: for each translation, where the
//! host code of each guest instruction that may fault starts and where the
//! guest's registers are meanwhile (`translate::GuestSite`), kept compactly
//! by the translation's host address. A synchronous signal raised in
//! translated code is given the guest instruction's context with it.
//!
//! Kept rather than recomputed by translating the block again: a block's
//! guest bytes may have changed since (self-modifying code), its layout
//! depends on what was linked and chained at the time, and the translator
//! hands out counters, ids and literals as it goes. Six bytes per guest
//! instruction, less than the block table holds for its counts.

use crate::translate::{GuestSite, SiteRegs};
use iced_x86::Register;
use std::collections::BTreeMap;

/// One site: host offset from the translation's start, guest offset from
/// the block's start, and the registers' state.
#[derive(Debug, Clone, Copy)]
struct Packed {
    host: u16,
    guest: u16,
    regs: u8,
}

const GUEST: u8 = 0;
const RCX_SPILLED: u8 = 1;
const BORROWED: u8 = 2;

/// The sites of one translation.
#[derive(Debug, Clone)]
struct BlockSites {
    /// Guest address of the first instruction.
    guest: u64,
    /// Guest address past the last instruction.
    guest_end: u64,
    /// Host bytes of the translation.
    host_len: u32,
    /// Trace mode's borrowed registers (64-bit GPR numbers, 0xff for
    /// none).
    borrowed: [u8; 2],
    /// Where its sites are in [`HostSites::sites`].
    first: u32,
    count: u32,
}

/// The guest's view of a host address inside a translation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GuestPoint {
    /// The guest address of the block whose translation this is.
    pub block: u64,
    /// The guest instruction the host code stands for.
    pub guest: u64,
    /// The guest address after it.
    pub next: u64,
    /// Where the guest's registers are.
    pub regs: SiteRegs,
}

/// The sites of every translation of an address space (see the module
/// doc).
#[derive(Debug, Clone, Default)]
pub(super) struct HostSites {
    by_host: BTreeMap<u64, BlockSites>,
    /// The sites of all translations, each one's in a row (one vector
    /// rather than an allocation per block; a replaced translation's stay).
    sites: Vec<Packed>,
    /// Multi-instruction counter updates: the end of each (past its store)
    /// by the host address of its load.
    counter_updates: BTreeMap<u64, u64>,
}

const NO_REG: u8 = 0xff;

fn reg_number(r: Register) -> u8 {
    r.full_register().number() as u8
}

fn reg_of(n: u8) -> Option<Register> {
    (n != NO_REG).then(|| crate::emit::GPR64[n as usize])
}

impl HostSites {
    /// Records the sites of a translation of the block `[guest, guest_end)`
    /// at `host`, `host_len` bytes long. A translation at the same host
    /// address replaces any before (the chunk's memory was reused).
    pub fn insert(
        &mut self,
        host: u64,
        host_len: u64,
        guest: u64,
        guest_end: u64,
        sites: &[GuestSite],
    ) {
        let mut borrowed = [NO_REG; 2];
        let first = self.sites.len();
        for s in sites {
            let regs = match s.regs {
                SiteRegs::Guest => GUEST,
                SiteRegs::RcxSpilled => RCX_SPILLED,
                SiteRegs::Borrowed(r, a) => {
                    borrowed = [reg_number(r), a.map_or(NO_REG, reg_number)];
                    BORROWED
                }
            };
            let offsets = s
                .host
                .checked_sub(host)
                .and_then(|h| u16::try_from(h).ok())
                .zip(
                    s.guest
                        .checked_sub(guest)
                        .and_then(|g| u16::try_from(g).ok()),
                );
            // (Blocks are far smaller than 64 KiB either side; one that is
            // not is left unmapped rather than mapped wrongly.)
            let Some((host, guest)) = offsets else {
                self.sites.truncate(first);
                return;
            };
            self.sites.push(Packed { host, guest, regs });
        }
        let (Ok(first), Ok(host_len)) = (u32::try_from(first), u32::try_from(host_len)) else {
            self.sites.truncate(first);
            return;
        };
        if sites.is_empty() {
            return;
        }
        self.by_host.insert(
            host,
            BlockSites {
                guest,
                guest_end,
                host_len,
                borrowed,
                first,
                count: sites.len() as u32,
            },
        );
    }

    /// Records the multi-instruction counter updates of a translation
    /// occupying `[host, host + host_len)` (any earlier ones there go).
    pub fn insert_counter_updates(&mut self, host: u64, host_len: u64, updates: &[(u64, u64)]) {
        let stale: Vec<u64> = self
            .counter_updates
            .range(host..host + host_len)
            .map(|(&load, _)| load)
            .collect();
        for load in stale {
            self.counter_updates.remove(&load);
        }
        self.counter_updates.extend(updates.iter().copied());
    }

    /// Where a thread interrupted at `host` should resume instead: the
    /// load of a counter update it stopped inside, after the load and
    /// before the store completed. Delivering a signal there lets the
    /// update run again, whole, after the handler (whose runs of the same
    /// block would otherwise be lost to the store of the stale value).
    pub fn interrupted_counter_update(&self, host: u64) -> Option<u64> {
        let (&load, &end) = self.counter_updates.range(..host).next_back()?;
        (host < end).then_some(load)
    }

    /// The guest instruction whose host code contains `host`, if `host` is
    /// in the code of a guest instruction of some translation.
    pub fn lookup(&self, host: u64) -> Option<GuestPoint> {
        let (&start, b) = self.by_host.range(..=host).next_back()?;
        let off = host - start;
        if off >= u64::from(b.host_len) {
            return None;
        }
        let sites = &self.sites[b.first as usize..][..b.count as usize];
        let n = sites
            .partition_point(|s| u64::from(s.host) <= off)
            .checked_sub(1)?;
        let s = sites[n];
        let guest = b.guest + u64::from(s.guest);
        let next = sites
            .get(n + 1)
            .map_or(b.guest_end, |t| b.guest + u64::from(t.guest));
        let regs = match s.regs {
            GUEST => SiteRegs::Guest,
            RCX_SPILLED => SiteRegs::RcxSpilled,
            _ => SiteRegs::Borrowed(reg_of(b.borrowed[0])?, reg_of(b.borrowed[1])),
        };
        Some(GuestPoint {
            block: b.guest,
            guest,
            next,
            regs,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn site(host: u64, guest: u64, regs: SiteRegs) -> GuestSite {
        GuestSite { host, guest, regs }
    }

    #[test]
    fn host_addresses_map_to_the_instruction_whose_code_holds_them() {
        let mut m = HostSites::default();
        let b = SiteRegs::Borrowed(Register::R10, Some(Register::RAX));
        m.insert(
            0x5000,
            0x40,
            0x1000,
            0x1009,
            &[
                site(0x5010, 0x1000, b),
                site(0x5020, 0x1004, b),
                site(0x5030, 0x1007, SiteRegs::RcxSpilled),
            ],
        );
        m.insert(
            0x5040,
            0x10,
            0x2000,
            0x2001,
            &[site(0x5040, 0x2000, SiteRegs::Guest)],
        );
        assert_eq!(m.lookup(0x500f), None, "before the first instruction");
        let p = m.lookup(0x5010).unwrap();
        assert_eq!((p.guest, p.next, p.regs), (0x1000, 0x1004, b));
        assert_eq!(m.lookup(0x501f).unwrap().guest, 0x1000);
        assert_eq!(m.lookup(0x5020).unwrap().next, 0x1007);
        let p = m.lookup(0x503f).unwrap();
        assert_eq!(
            (p.guest, p.next, p.regs),
            (0x1007, 0x1009, SiteRegs::RcxSpilled)
        );
        let p = m.lookup(0x5040).unwrap();
        assert_eq!((p.guest, p.regs), (0x2000, SiteRegs::Guest));
        assert_eq!(m.lookup(0x5050), None, "past the last translation");
        assert_eq!(m.lookup(0x4fff), None);
    }

    #[test]
    fn a_thread_inside_a_counter_update_resumes_at_its_load() {
        let mut m = HostSites::default();
        m.insert_counter_updates(0x5000, 0x40, &[(0x5008, 0x5018), (0x5020, 0x5030)]);
        assert_eq!(
            m.interrupted_counter_update(0x5008),
            None,
            "load not run yet"
        );
        assert_eq!(m.interrupted_counter_update(0x500f), Some(0x5008));
        assert_eq!(m.interrupted_counter_update(0x5017), Some(0x5008));
        assert_eq!(m.interrupted_counter_update(0x5018), None, "store done");
        assert_eq!(m.interrupted_counter_update(0x5025), Some(0x5020));
        assert_eq!(m.interrupted_counter_update(0x4fff), None);
        // A new translation at the same place replaces the old updates.
        m.insert_counter_updates(0x5000, 0x40, &[(0x5010, 0x5014)]);
        assert_eq!(m.interrupted_counter_update(0x5025), None);
        assert_eq!(m.interrupted_counter_update(0x5012), Some(0x5010));
    }

    #[test]
    fn trace_mode_without_an_address_register_borrows_one() {
        let mut m = HostSites::default();
        let b = SiteRegs::Borrowed(Register::R11, None);
        m.insert(0x5000, 0x20, 0x1000, 0x1003, &[site(0x5008, 0x1000, b)]);
        assert_eq!(m.lookup(0x5008).unwrap().regs, b);
    }
}
