//! Cachegrind's events and the set a run collects (spec §5.2): which
//! columns a profile has, in which order, and how its `events:` line reads.

/// One of Cachegrind's events.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Event {
    /// Instructions executed.
    Ir,
    /// I1 misses.
    I1mr,
    /// LL misses caused by instruction fetches.
    ILmr,
    /// Data reads (read-modify-writes included).
    Dr,
    /// D1 read misses.
    D1mr,
    /// LL read misses.
    DLmr,
    /// Data writes.
    Dw,
    /// D1 write misses.
    D1mw,
    /// LL write misses.
    DLmw,
    /// Conditional branches executed.
    Bc,
    /// Conditional branches mispredicted.
    Bcm,
    /// Indirect branches executed.
    Bi,
    /// Indirect branches mispredicted.
    Bim,
}

impl Event {
    /// Every event, in Cachegrind's column order.
    pub const ALL: [Event; 13] = [
        Event::Ir,
        Event::I1mr,
        Event::ILmr,
        Event::Dr,
        Event::D1mr,
        Event::DLmr,
        Event::Dw,
        Event::D1mw,
        Event::DLmw,
        Event::Bc,
        Event::Bcm,
        Event::Bi,
        Event::Bim,
    ];

    /// The name in `events:` lines.
    pub fn name(self) -> &'static str {
        match self {
            Event::Ir => "Ir",
            Event::I1mr => "I1mr",
            Event::ILmr => "ILmr",
            Event::Dr => "Dr",
            Event::D1mr => "D1mr",
            Event::DLmr => "DLmr",
            Event::Dw => "Dw",
            Event::D1mw => "D1mw",
            Event::DLmw => "DLmw",
            Event::Bc => "Bc",
            Event::Bcm => "Bcm",
            Event::Bi => "Bi",
            Event::Bim => "Bim",
        }
    }
}

/// The branch events alone follow Ir when there is no cache simulation.
const IR_BRANCH: [Event; 5] = [Event::Ir, Event::Bc, Event::Bcm, Event::Bi, Event::Bim];

/// The events a run collects, decided by `--cache-sim` and `--branch-sim`:
/// the one place that knows the columns of a profile and their order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EventSet {
    cache_sim: bool,
    branch_sim: bool,
}

impl EventSet {
    /// The set for these simulation switches.
    pub fn new(cache_sim: bool, branch_sim: bool) -> EventSet {
        EventSet {
            cache_sim,
            branch_sim,
        }
    }

    /// Whether the cache events are collected.
    pub fn cache_sim(self) -> bool {
        self.cache_sim
    }

    /// Whether the branch events are collected.
    pub fn branch_sim(self) -> bool {
        self.branch_sim
    }

    /// The events, in column order.
    pub fn events(self) -> &'static [Event] {
        match (self.cache_sim, self.branch_sim) {
            (false, false) => &Event::ALL[..1],
            (true, false) => &Event::ALL[..9],
            (false, true) => &IR_BRANCH,
            (true, true) => &Event::ALL,
        }
    }

    /// The events in Callgrind's column order (`Ir Dr Dw I1mr D1mr D1mw
    /// ILmr DLmr DLmw Bc Bcm Bi Bim`, those collected), each with its
    /// column in this set (Cachegrind's order).
    pub fn callgrind_order(self) -> Vec<(Event, usize)> {
        const ORDER: [Event; 13] = [
            Event::Ir,
            Event::Dr,
            Event::Dw,
            Event::I1mr,
            Event::D1mr,
            Event::D1mw,
            Event::ILmr,
            Event::DLmr,
            Event::DLmw,
            Event::Bc,
            Event::Bcm,
            Event::Bi,
            Event::Bim,
        ];
        ORDER
            .iter()
            .filter_map(|&e| self.index(e).map(|i| (e, i)))
            .collect()
    }

    /// How many columns.
    pub fn len(self) -> usize {
        self.events().len()
    }

    /// Never true: Ir is always collected. (For symmetry with `len`.)
    pub fn is_empty(self) -> bool {
        false
    }

    /// The column of `event`, if collected.
    pub fn index(self, event: Event) -> Option<usize> {
        self.events().iter().position(|&e| e == event)
    }

    /// An empty profile with these columns. Its `events:` line is
    /// Cachegrind's exactly, including the trailing space it writes after
    /// the cache events alone (spec §5.2).
    pub fn new_profile(self, cmd: &str) -> profile::Profile {
        let names: Vec<&str> = self.events().iter().map(|e| e.name()).collect();
        let mut p = profile::Profile::new(cmd, &names);
        if self.cache_sim && !self.branch_sim {
            p.events_text.push(' ');
        }
        p
    }

    /// `sums` (one per column, as [`CostTable::totals`](crate::CostTable::totals)
    /// or [`Profile::totals`](profile::Profile::totals) give them) by
    /// event, with zeros for events not collected.
    pub fn counts(self, sums: impl IntoIterator<Item = u64>) -> EventCounts {
        let mut all = [0; 13];
        for (&e, v) in self.events().iter().zip(sums) {
            all[e as usize] = v;
        }
        EventCounts(all)
    }
}

/// A count for every event, collected or not (zero then): what a summary
/// prints from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EventCounts([u64; 13]);

impl EventCounts {
    /// The count of `event`.
    pub fn get(&self, event: Event) -> u64 {
        self.0[event as usize]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn events_line(cache: bool, branch: bool) -> String {
        let mut out = Vec::new();
        EventSet::new(cache, branch)
            .new_profile("x")
            .write_to(&mut out)
            .unwrap();
        let text = String::from_utf8(out).unwrap();
        text.lines().nth(1).unwrap().to_string()
    }

    /// The four `events:` lines of spec §5.2, byte for byte.
    #[test]
    fn events_lines() {
        assert_eq!(events_line(false, false), "events: Ir");
        assert_eq!(
            events_line(true, false),
            "events: Ir I1mr ILmr Dr D1mr DLmr Dw D1mw DLmw "
        );
        assert_eq!(events_line(false, true), "events: Ir Bc Bcm Bi Bim");
        assert_eq!(
            events_line(true, true),
            "events: Ir I1mr ILmr Dr D1mr DLmr Dw D1mw DLmw Bc Bcm Bi Bim"
        );
    }

    #[test]
    fn columns() {
        let branch = EventSet::new(false, true);
        assert_eq!(branch.len(), 5);
        assert_eq!(branch.index(Event::Bc), Some(1));
        assert_eq!(branch.index(Event::Dr), None);
        let both = EventSet::new(true, true);
        assert_eq!(both.index(Event::Bim), Some(12));
        assert!(both.cache_sim() && both.branch_sim() && !both.is_empty());
        for (i, e) in Event::ALL.iter().enumerate() {
            assert_eq!(*e as usize, i, "{}", e.name());
        }
    }

    #[test]
    fn callgrind_order() {
        let names = |c, b| {
            EventSet::new(c, b)
                .callgrind_order()
                .iter()
                .map(|(e, _)| e.name())
                .collect::<Vec<_>>()
                .join(" ")
        };
        assert_eq!(names(false, false), "Ir");
        assert_eq!(names(false, true), "Ir Bc Bcm Bi Bim");
        assert_eq!(names(true, false), "Ir Dr Dw I1mr D1mr D1mw ILmr DLmr DLmw");
        let all = EventSet::new(true, true).callgrind_order();
        assert_eq!(all[1], (Event::Dr, 3));
        assert_eq!(all[3], (Event::I1mr, 1));
    }

    #[test]
    fn counts_by_event() {
        let c = EventSet::new(false, true).counts([10, 4, 2, 3, 1]);
        assert_eq!(c.get(Event::Ir), 10);
        assert_eq!(c.get(Event::Bcm), 2);
        assert_eq!(c.get(Event::Bim), 1);
        assert_eq!(c.get(Event::Dr), 0);
    }
}
