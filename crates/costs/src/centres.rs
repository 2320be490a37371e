//! Attribution of per-address costs to Cachegrind's cost centres,
//! `(file, fn, line)` (spec §4.4).

use rustc_hash::FxHashMap;
use symbols::{Location, Mapping, Symbolizer};

use crate::set::EventSet;
use crate::table::CostTable;

/// Costs being accumulated per `(file, fn, line)`.
///
/// The symbolizer hands out one shared string per distinct file and
/// function name of an object, so keying on the strings' addresses groups
/// instructions without hashing every name; equal names from different
/// objects are merged when the centres go into a profile.
#[derive(Debug)]
pub struct CostCentres {
    events: EventSet,
    keys: FxHashMap<(usize, usize, u32), usize>,
    /// The location of each centre; holding it keeps the keys' strings
    /// alive, so their addresses stay unique.
    locs: Vec<Location>,
    /// One row of costs per centre, as in a [`CostTable`].
    costs: Vec<u64>,
}

impl CostCentres {
    /// No centres yet, for costs of `events`.
    pub fn new(events: EventSet) -> CostCentres {
        CostCentres {
            events,
            keys: FxHashMap::default(),
            locs: Vec::new(),
            costs: Vec::new(),
        }
    }

    /// Adds every row of `table`, its address located through `mappings`
    /// (the executable mappings the code ran from; with none, everything is
    /// `???`). Each address is located once.
    ///
    /// # Panics
    ///
    /// If `table` has other events than these centres.
    pub fn add_table(&mut self, table: &CostTable, mappings: &[Mapping], syms: &mut Symbolizer) {
        assert_eq!(table.events(), self.events, "cost tables of other events");
        let width = self.events.len();
        // Sorted addresses keep consecutive lookups in the same object
        // (the symbolizer caches the last one).
        let mut slots: Vec<usize> = (0..table.len()).collect();
        slots.sort_unstable_by_key(|&s| table.addr(s));
        for slot in slots {
            let loc = syms.locate(mappings, table.addr(slot));
            let key = (
                loc.file.as_ptr() as usize,
                loc.func.as_ptr() as usize,
                loc.line,
            );
            let centre = *self.keys.entry(key).or_insert_with(|| {
                self.locs.push(loc);
                self.costs.resize(self.costs.len() + width, 0);
                self.locs.len() - 1
            });
            let row = &mut self.costs[centre * width..][..width];
            for (c, v) in row.iter_mut().zip(table.row(slot)) {
                *c += v;
            }
        }
    }

    /// Adds the centres' costs to `profile`, whose columns must be these
    /// events' (see [`EventSet::new_profile`]).
    pub fn add_to(&self, profile: &mut profile::Profile) {
        let width = self.events.len();
        let mut counts = vec![0i64; width];
        for (loc, row) in self.locs.iter().zip(self.costs.chunks_exact(width)) {
            for (c, &v) in counts.iter_mut().zip(row) {
                *c = v as i64;
            }
            profile.add(&loc.file, &loc.func, i64::from(loc.line), &counts);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Event;

    #[test]
    fn unknown_code_goes_to_question_marks() {
        let set = EventSet::new(false, false);
        let mut live = CostTable::new(set);
        live.add_counts(Event::Ir, [(0x1000, 5), (0x1004, 2)]);
        let mut gone = CostTable::new(set);
        gone.add_counts(Event::Ir, [(0x1000, 3)]);
        let mapping = Mapping {
            path: Default::default(),
            start: 0x1000,
            end: 0x2000,
            file_offset: 0,
        };
        let mut syms = Symbolizer::new();
        let mut centres = CostCentres::new(set);
        centres.add_table(&live, &[mapping], &mut syms);
        centres.add_table(&gone, &[], &mut syms);
        let mut p = set.new_profile("./x a");
        centres.add_to(&mut p);
        assert_eq!(p.totals(), vec![10]);
        assert_eq!(p.costs["???"]["???"][&0], vec![10]);
    }

    #[test]
    fn every_column_is_carried() {
        let set = EventSet::new(true, true);
        let mut t = CostTable::new(set);
        let s = t.slot(0x40);
        t.row_mut(s)
            .copy_from_slice(&[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13]);
        let mut centres = CostCentres::new(set);
        centres.add_table(&t, &[], &mut Symbolizer::new());
        centres.add_table(&t, &[], &mut Symbolizer::new());
        let mut p = set.new_profile("c");
        centres.add_to(&mut p);
        assert_eq!(
            p.totals(),
            vec![2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26]
        );
    }

    #[test]
    fn empty_table_adds_no_centre() {
        let set = EventSet::new(true, false);
        let mut centres = CostCentres::new(set);
        centres.add_table(&CostTable::new(set), &[], &mut Symbolizer::new());
        let mut p = set.new_profile("c");
        centres.add_to(&mut p);
        assert!(p.costs.is_empty());
    }
}
