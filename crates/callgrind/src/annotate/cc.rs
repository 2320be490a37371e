//! Cost vectors as callgrind_annotate keeps them: a count per event, or
//! nothing (printed `.`) for an event no line ever gave a count for.
//! Callgrind omits trailing zero costs, so a line's defined counts are
//! those up to its last nonzero one.

/// One count per event; `None` is undefined (`.`).
pub(crate) type Cc = Vec<Option<u64>>;

/// The defined counts of a cost line of the model.
pub(crate) fn from_line(costs: &[u64]) -> Cc {
    let n = costs.iter().rposition(|&c| c != 0).map_or(0, |i| i + 1);
    costs[..n].iter().map(|&c| Some(c)).collect()
}

/// All counts defined (`summary:`, `totals:`).
pub(crate) fn from_all(costs: &[u64]) -> Cc {
    costs.iter().map(|&c| Some(c)).collect()
}

/// `to += from`: a defined count makes the sum defined.
pub(crate) fn add(from: &Cc, to: &mut Cc) {
    if to.len() < from.len() {
        to.resize(from.len(), None);
    }
    for (t, f) in to.iter_mut().zip(from) {
        if let Some(f) = f {
            *t = Some(t.unwrap_or(0).wrapping_add(*f));
        }
    }
}

/// The count of event `i`, undefined past the end.
pub(crate) fn get(cc: &Cc, i: usize) -> Option<u64> {
    cc.get(i).copied().flatten()
}

/// Whether no count is positive.
pub(crate) fn is_zero(cc: &Cc) -> bool {
    cc.iter().all(|c| c.unwrap_or(0) == 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn definedness() {
        assert_eq!(from_line(&[5, 0, 2, 0]), vec![Some(5), Some(0), Some(2)]);
        assert_eq!(from_line(&[0, 0]), Cc::new());
        let mut acc = Cc::new();
        add(&vec![Some(1)], &mut acc);
        add(&vec![None, None, Some(3)], &mut acc);
        assert_eq!(acc, vec![Some(1), None, Some(3)]);
        assert_eq!(get(&acc, 1), None);
        assert_eq!(get(&acc, 7), None);
        assert!(!is_zero(&acc));
        assert!(is_zero(&vec![None, Some(0)]));
    }
}
