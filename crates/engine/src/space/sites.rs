//! Host code back to guest instructions: for each translation, where the
//! host code of each guest instruction that may fault starts and where the
//! guest's registers are meanwhile (`translate::GuestSite`), kept compactly
//! by the translation's host address. A synchronous signal raised in
//! translated code is given the guest instruction's context with it.
//!
//! In counting mode each translation also has its clean points
//! (`translate::CleanPoint`): host addresses between guest instructions
//! where the guest's state is exact, which an asynchronous signal is
//! delivered at (five bytes each, about one per guest instruction).
//!
//! Kept rather than recomputed by translating the block again: a block's
//! guest bytes may have changed since (self-modifying code), its layout
//! depends on what was linked and chained at the time, and the translator
//! hands out counters, ids and literals as it goes. Six bytes per guest
//! instruction, less than the block table holds for its counts.

use crate::translate::{CleanPoint, GuestSite, PointKind, RecordSpan, SiteRegs};
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

/// One clean point: host and guest offsets as in [`Packed`], and its kind.
#[derive(Debug, Clone, Copy)]
#[repr(C, packed)]
struct PackedPoint {
    host: u16,
    guest: u16,
    kind: u8,
}

const CLEAN: u8 = 0;
const AFTER_SYSCALL: u8 = 1;
const REP: u8 = 2;
const COND_REP: u8 = 3;
const RAX_SPILLED: u8 = 4;

const GUEST: u8 = 0;
const RCX_SPILLED: u8 = 1;
const BORROWED: u8 = 2;
const BORROWED_FLAGS_KEPT: u8 = 3;

/// A multi-instruction counter update of a translation (see
/// [`HostSites::interrupted_counter_update`]): its load's offset from the
/// translation's start, and the offset past its store.
#[derive(Debug, Clone, Copy)]
struct PackedUpdate {
    load: u32,
    end: u32,
}

/// The sites of one translation.
#[derive(Debug, Clone, Default)]
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
    /// Where its clean points are in [`HostSites::points`].
    first_point: u32,
    points: u32,
    /// Where its counter updates are in [`HostSites::counter_updates`].
    first_update: u32,
    updates: u32,
    /// Trace mode: where its record is open (`translate::RecordSpan`), as
    /// offsets: from `[0]` to `[1]`, and from `[2]` to the code's end.
    record: Option<[u32; 3]>,
}

/// A clean point (see `translate::CleanPoint`) of some translation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Resumption {
    /// The guest address of the block whose translation this is.
    pub block: u64,
    /// The host address of that translation.
    pub body: u64,
    /// The guest instruction to run next.
    pub guest: u64,
    /// What else the guest's state needs.
    pub kind: PointKind,
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
    /// The clean points of all translations, likewise.
    points: Vec<PackedPoint>,
    /// The multi-instruction counter updates of all translations, each
    /// one's in a row by their loads' offsets (8 bytes each: a python run
    /// has several per block, and a map entry per update had been most of
    /// this table).
    counter_updates: Vec<PackedUpdate>,
}

const NO_REG: u8 = 0xff;

fn reg_number(r: Register) -> u8 {
    r.full_register().number() as u8
}

fn reg_of(n: u8) -> Option<Register> {
    (n != NO_REG).then(|| crate::emit::GPR64[n as usize])
}

impl HostSites {
    /// Records the sites and clean points of a translation of the block
    /// `[guest, guest_end)` at `host`, `host_len` bytes long. A translation
    /// at the same host address replaces any before (the chunk's memory was
    /// reused).
    pub fn insert(
        &mut self,
        host: u64,
        host_len: u64,
        guest: u64,
        guest_end: u64,
        sites: &[GuestSite],
        points: &[CleanPoint],
    ) {
        // Whatever was translated here before is gone (the chunk's memory
        // was reused), with its sites and counter updates.
        self.by_host.remove(&host);
        let mut borrowed = [NO_REG; 2];
        let first = self.sites.len();
        for s in sites {
            if let Some((r, a)) = s.regs.borrowed() {
                borrowed = [reg_number(r), a.map_or(NO_REG, reg_number)];
            }
            let regs = match s.regs {
                SiteRegs::Guest => GUEST,
                SiteRegs::RcxSpilled => RCX_SPILLED,
                SiteRegs::Borrowed(..) => BORROWED,
                SiteRegs::BorrowedFlagsKept(..) => BORROWED_FLAGS_KEPT,
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
        let first_point = self.points.len();
        // Points past the code (its dropped tail jump) belong to the block
        // placed there.
        let offsets = |p: &CleanPoint| {
            let h = p.host.checked_sub(host).filter(|&h| h < host_len)?;
            let g = p
                .guest
                .checked_sub(guest)
                .filter(|_| p.guest <= guest_end)?;
            Some((u16::try_from(h).ok()?, u16::try_from(g).ok()?))
        };
        self.points.extend(points.iter().filter_map(|p| {
            let (host, guest) = offsets(p)?;
            let kind = match p.kind {
                PointKind::Clean => CLEAN,
                PointKind::RaxSpilled => RAX_SPILLED,
                PointKind::AfterSyscall => AFTER_SYSCALL,
                PointKind::Rep { cond: false } => REP,
                PointKind::Rep { cond: true } => COND_REP,
            };
            Some(PackedPoint { host, guest, kind })
        }));
        let (Ok(first), Ok(host_len), Ok(first_point)) = (
            u32::try_from(first),
            u32::try_from(host_len),
            u32::try_from(first_point),
        ) else {
            self.sites.truncate(first);
            self.points.truncate(first_point);
            return;
        };
        let npoints = self.points.len() as u32 - first_point;
        if sites.is_empty() && npoints == 0 {
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
                first_point,
                points: npoints,
                ..BlockSites::default()
            },
        );
    }

    /// The clean point at host address `host` exactly, if there is one.
    pub fn clean_point(&self, host: u64) -> Option<Resumption> {
        let (&start, b) = self.by_host.range(..=host).next_back()?;
        let off = u16::try_from(host - start).ok()?;
        if u64::from(off) >= u64::from(b.host_len) {
            return None;
        }
        let points = &self.points[b.first_point as usize..][..b.points as usize];
        let n = points.partition_point(|p| {
            let h = p.host;
            h < off
        });
        let p = points.get(n).filter(|p| {
            let h = p.host;
            h == off
        })?;
        let kind = match p.kind {
            CLEAN => PointKind::Clean,
            AFTER_SYSCALL => PointKind::AfterSyscall,
            REP => PointKind::Rep { cond: false },
            RAX_SPILLED => PointKind::RaxSpilled,
            _ => PointKind::Rep { cond: true },
        };
        Some(Resumption {
            block: b.guest,
            body: start,
            guest: b.guest + u64::from(p.guest),
            kind,
        })
    }

    /// Records the multi-instruction counter updates of the translation
    /// at `host`, `host_len` bytes long, recorded by [`HostSites::insert`]
    /// just before: `(load, end)` host addresses, each update's load and
    /// the address past its store.
    pub fn insert_counter_updates(&mut self, host: u64, host_len: u64, updates: &[(u64, u64)]) {
        let first = self.counter_updates.len();
        let offset = |a: u64| {
            a.checked_sub(host)
                .filter(|&o| o <= host_len)
                .and_then(|o| u32::try_from(o).ok())
        };
        self.counter_updates
            .extend(updates.iter().filter_map(|&(load, end)| {
                Some(PackedUpdate {
                    load: offset(load)?,
                    end: offset(end)?,
                })
            }));
        self.counter_updates[first..].sort_unstable_by_key(|u| u.load);
        let (Ok(first_update), Ok(updates), Ok(host_len)) = (
            u32::try_from(first),
            u32::try_from(self.counter_updates.len() - first),
            u32::try_from(host_len),
        ) else {
            self.counter_updates.truncate(first);
            return;
        };
        if updates == 0 {
            return;
        }
        let b = self.entry(host, host_len);
        b.first_update = first_update;
        b.updates = updates;
    }

    /// The entry of the translation at `host`, `host_len` bytes long: one
    /// with no sites or clean points has an entry for its counter updates
    /// or record alone (no guest instruction maps there).
    fn entry(&mut self, host: u64, host_len: u32) -> &mut BlockSites {
        self.by_host.entry(host).or_insert(BlockSites {
            host_len,
            borrowed: [NO_REG; 2],
            ..BlockSites::default()
        })
    }

    /// Records where the record of the trace-mode translation at `host`,
    /// `host_len` bytes long, is open (after [`HostSites::insert`] for
    /// it). Addresses past the code (its dropped tail) are its end.
    pub fn insert_record_span(&mut self, host: u64, host_len: u64, span: RecordSpan) {
        let Ok(len) = u32::try_from(host_len) else {
            return;
        };
        let offset = |a: u64| a.saturating_sub(host).min(host_len) as u32;
        let record = [offset(span.opens), offset(span.closes), offset(span.paths)];
        self.entry(host, len).record = Some(record);
    }

    /// The open part of a trace-mode block's record (see
    /// `translate::RecordSpan`) that holds `host`, if any.
    pub fn open_record(&self, host: u64) -> Option<std::ops::Range<u64>> {
        let (&start, b) = self.by_host.range(..=host).next_back()?;
        let off = u32::try_from(host - start).ok()?;
        let [opens, closes, paths] = b.record?;
        let span = if (opens..closes).contains(&off) {
            opens..closes
        } else if (paths..b.host_len).contains(&off) {
            paths..b.host_len
        } else {
            return None;
        };
        Some(start + u64::from(span.start)..start + u64::from(span.end))
    }

    /// Where a thread interrupted at `host` should resume instead: the
    /// load of a counter update it stopped inside, after the load and
    /// before the store completed. Delivering a signal there lets the
    /// update run again, whole, after the handler (whose runs of the same
    /// block would otherwise be lost to the store of the stale value).
    pub fn interrupted_counter_update(&self, host: u64) -> Option<u64> {
        let (&start, b) = self.by_host.range(..=host).next_back()?;
        let off = host - start;
        if off >= u64::from(b.host_len) {
            return None;
        }
        let updates = &self.counter_updates[b.first_update as usize..][..b.updates as usize];
        let n = updates.partition_point(|u| u64::from(u.load) < off);
        let u = updates[..n].last()?;
        (off < u64::from(u.end)).then_some(start + u64::from(u.load))
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
            BORROWED_FLAGS_KEPT => {
                SiteRegs::BorrowedFlagsKept(reg_of(b.borrowed[0])?, reg_of(b.borrowed[1]))
            }
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
            &[],
        );
        m.insert(
            0x5040,
            0x10,
            0x2000,
            0x2001,
            &[site(0x5040, 0x2000, SiteRegs::Guest)],
            &[],
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
    fn a_record_is_open_up_to_its_close_and_in_the_paths_after_the_exits() {
        let mut m = HostSites::default();
        m.insert(0x5000, 0x40, 0x1000, 0x1009, &[], &[]);
        let span = RecordSpan {
            opens: 0x5008,
            closes: 0x5020,
            paths: 0x5030,
        };
        m.insert_record_span(0x5000, 0x40, span);
        assert_eq!(m.open_record(0x5007), None, "not reserved yet");
        assert_eq!(m.open_record(0x5008), Some(0x5008..0x5020));
        assert_eq!(m.open_record(0x501f), Some(0x5008..0x5020));
        assert_eq!(m.open_record(0x5020), None, "closed: the exits");
        assert_eq!(m.open_record(0x502f), None);
        assert_eq!(m.open_record(0x5030), Some(0x5030..0x5040), "a path");
        assert_eq!(m.open_record(0x5040), None, "past the code");
        // A dropped tail: the paths start at the code's end.
        let tail = RecordSpan {
            paths: 0x5050,
            ..span
        };
        m.insert_record_span(0x5000, 0x40, tail);
        assert_eq!(m.open_record(0x503f), None);
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
    fn a_site_inside_kept_flags_says_so() {
        let mut m = HostSites::default();
        let kept = SiteRegs::BorrowedFlagsKept(Register::R8, Some(Register::R10));
        let plain = SiteRegs::Borrowed(Register::R8, Some(Register::R10));
        m.insert(
            0x5000,
            0x40,
            0x1000,
            0x1006,
            &[site(0x5008, 0x1000, kept), site(0x5020, 0x1003, plain)],
            &[],
        );
        assert_eq!(m.lookup(0x500a).unwrap().regs, kept);
        assert_eq!(m.lookup(0x5021).unwrap().regs, plain);
    }

    #[test]
    fn trace_mode_without_an_address_register_borrows_one() {
        let mut m = HostSites::default();
        let b = SiteRegs::Borrowed(Register::R11, None);
        m.insert(
            0x5000,
            0x20,
            0x1000,
            0x1003,
            &[site(0x5008, 0x1000, b)],
            &[],
        );
        assert_eq!(m.lookup(0x5008).unwrap().regs, b);
    }

    fn point(host: u64, guest: u64, kind: PointKind) -> CleanPoint {
        CleanPoint { host, guest, kind }
    }

    #[test]
    fn only_clean_points_map_an_interrupted_thread() {
        let mut m = HostSites::default();
        let rep = PointKind::Rep { cond: false };
        m.insert(
            0x5000,
            0x40,
            0x1000,
            0x1009,
            &[],
            &[
                point(0x5000, 0x1000, PointKind::Clean),
                point(0x5010, 0x1004, rep),
                point(0x5030, 0x1009, PointKind::AfterSyscall),
                // Past the code (a dropped tail): the next block's.
                point(0x5040, 0x1009, PointKind::Clean),
                // Outside the block's guest range: not representable.
                point(0x5038, 0x9000, PointKind::Clean),
            ],
        );
        let p = m.clean_point(0x5010).unwrap();
        assert_eq!(
            (p.block, p.body, p.guest, p.kind),
            (0x1000, 0x5000, 0x1004, rep)
        );
        assert_eq!(m.clean_point(0x5000).unwrap().guest, 0x1000);
        assert_eq!(m.clean_point(0x5030).unwrap().kind, PointKind::AfterSyscall);
        for host in [0x4fff, 0x5001, 0x500f, 0x5020, 0x5038, 0x5040] {
            assert_eq!(m.clean_point(host), None, "{host:#x}");
        }
        // A block with points and no faulting instruction is still mapped,
        // and its sites are not.
        m.insert(
            0x6000,
            0x10,
            0x2000,
            0x2002,
            &[],
            &[point(0x6000, 0x2000, PointKind::Clean)],
        );
        assert_eq!(m.clean_point(0x6000).unwrap().guest, 0x2000);
        assert_eq!(m.lookup(0x6000), None);
    }

    #[test]
    fn counter_updates_belong_to_the_translation_holding_them() {
        let mut m = HostSites::default();
        m.insert(0x5000, 0x40, 0x1000, 0x1009, &[], &[]);
        m.insert_counter_updates(0x5000, 0x40, &[(0x5030, 0x5038), (0x5010, 0x5018)]);
        m.insert_counter_updates(0x5040, 0x10, &[(0x5040, 0x5048)]);
        for (host, resume) in [
            (0x5010, None),
            (0x5011, Some(0x5010)),
            (0x5017, Some(0x5010)),
            (0x5018, None),
            (0x5031, Some(0x5030)),
            (0x5041, Some(0x5040)),
            (0x5048, None),
            (0x4fff, None),
        ] {
            assert_eq!(m.interrupted_counter_update(host), resume, "{host:#x}");
        }
        // Translated again at the same place: the old updates are gone.
        m.insert(0x5000, 0x40, 0x1000, 0x1009, &[], &[]);
        assert_eq!(m.interrupted_counter_update(0x5011), None);
    }
}
