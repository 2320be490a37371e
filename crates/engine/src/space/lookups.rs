//! What the indirect-branch table offers translated code: which translated
//! targets returns, indirect jumps and indirect calls find without exiting
//! to the tool.
//!
//! A target is published when a lookup missed it (the tool translates it,
//! then publishes it) and, without waiting for a miss, when it is the
//! return site of a translated call, since every call's return comes back
//! through the table: as soon as both the call and the return site are
//! translated. It is withdrawn when its code goes away. How keys are placed
//! in the client's table and in what order they are written is
//! [`IbTable`]'s business.

use crate::client_mem::ClientMemory;
use crate::ibtable::IbTable;
use crate::layout;
use rustc_hash::FxHashSet as HashSet;

/// The published targets of one address space.
#[derive(Debug, Clone)]
pub(super) struct Lookups {
    table: IbTable,
    /// Return sites of translated calls that are not translated yet:
    /// published when they are.
    return_sites: HashSet<u64>,
}

impl Lookups {
    /// An empty table in the core region at `core`.
    pub fn new(core: u64) -> Lookups {
        Lookups {
            table: IbTable::new(core + layout::HTAB),
            return_sites: HashSet::default(),
        }
    }

    /// Publishes `guest`, translated at `body`, unless it is published.
    pub fn publish(&mut self, guest: u64, body: u64, mem: &mut dyn ClientMemory) {
        if !self.table.contains(guest) {
            self.table.insert(guest, body, mem);
        }
    }

    /// A translated call returns to `site`, whose translation is at `body`
    /// if it has one: published now, or as soon as it is translated.
    pub fn return_site(&mut self, site: u64, body: Option<u64>, mem: &mut dyn ClientMemory) {
        match body {
            Some(body) => self.publish(site, body, mem),
            None => {
                self.return_sites.insert(site);
            }
        }
    }

    /// `guest` was just translated at `body`: published if a translated
    /// call returns there, re-pointed if it was published already (it was
    /// translated again after its blocks were retired, keeping its code).
    pub fn translated(&mut self, guest: u64, body: u64, mem: &mut dyn ClientMemory) {
        if self.return_sites.remove(&guest) || self.table.contains(guest) {
            self.table.insert(guest, body, mem);
        }
    }

    /// The code of `guest` went away: lookups no longer find it.
    pub fn withdraw(&mut self, guest: u64, mem: &mut dyn ClientMemory) {
        self.table.remove(guest, mem);
    }

    /// Whether `guest` is published.
    #[cfg(test)]
    pub fn contains(&self, guest: u64) -> bool {
        self.table.contains(guest)
    }

    /// The table (for `--stats=yes`).
    pub fn table(&self) -> &IbTable {
        &self.table
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::*;

    #[test]
    fn a_return_site_is_published_as_soon_as_it_is_translated() {
        let (mut sp, fake) = fake_space();
        // CODE: call rax ; CODE+2: ret
        load(&fake, CODE, &[0xff, 0xd0, 0xc3], "/bin/icall");
        // The call alone: its return site waits.
        sp.translate_at(CODE, &mut mmap_as_asked, None, 0).unwrap();
        assert!(!sp.lookups.contains(CODE + 2));
        assert!(sp.lookups.return_sites.contains(&(CODE + 2)));
        let site = sp
            .translate_at(CODE + 2, &mut mmap_as_asked, None, 0)
            .unwrap();
        assert_eq!(published(&fake, CODE + 2), Some(site));
        assert!(sp.lookups.return_sites.is_empty());
        // Withdrawn with its code.
        sp.invalidate(CODE, CODE + 3);
        assert!(!sp.lookups.contains(CODE + 2));
        assert_eq!(published(&fake, CODE + 2), None);
    }
}
