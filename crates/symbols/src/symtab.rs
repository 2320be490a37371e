//! A function symbol table canonicalised the way Valgrind canonicalises its
//! per-object symbol table (`canonicaliseSymtab` in m_debuginfo/storage.c),
//! so that the name found for an address is the one Cachegrind prints.
//!
//! Valgrind's steps, reproduced here:
//! 1. sort by start address;
//! 2. merge entries with identical ranges (keeping all names), and drop a
//!    data entry whose range equals a text entry's;
//! 3. truncate overlapping ranges (the earlier-starting one ends where the
//!    next begins; of two starting together, the shorter one stays first
//!    and the longer one starts after it), then repeat from 2 until stable;
//! 4. choose each range's displayed name among its aliases with
//!    [`prefer_name`] (Valgrind skips the last entry here; so do we).

/// One candidate symbol, as read from an ELF symbol table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawSymbol {
    /// Start address (file virtual address).
    pub addr: u64,
    /// Size in bytes (> 0).
    pub size: u64,
    /// Name as written in the string table.
    pub name: String,
    /// Whether Valgrind considers it a text (code) symbol.
    pub is_text: bool,
}

#[derive(Debug, Clone)]
struct Entry {
    addr: u64,
    size: u64,
    /// The displayed name first, then the aliases.
    names: Vec<String>,
    is_text: bool,
    live: bool,
}

impl Entry {
    fn last(&self) -> u64 {
        self.addr + self.size - 1
    }
}

/// A canonical symbol table: sorted, non-overlapping address ranges.
#[derive(Debug, Clone, Default)]
pub struct SymbolTable {
    entries: Vec<Entry>,
}

impl SymbolTable {
    /// Canonicalises `syms` (in the order they were read).
    pub fn new(syms: Vec<RawSymbol>) -> Self {
        let mut e: Vec<Entry> = syms
            .into_iter()
            .filter(|s| s.size > 0)
            .map(|s| Entry {
                addr: s.addr,
                size: s.size,
                names: vec![s.name],
                is_text: s.is_text,
                live: true,
            })
            .collect();
        // A stable sort keeps read order among equal starts; Valgrind's
        // result does not depend on it except for which alias list comes
        // first, and the preferred-name choice below is order-insensitive
        // for all but pathological cases.
        e.sort_by_key(|x| x.addr);
        loop {
            merge_identical(&mut e);
            if !truncate_overlaps(&mut e) {
                break;
            }
        }
        let n = e.len();
        for entry in e.iter_mut().take(n.saturating_sub(1)) {
            if entry.names.len() > 1 {
                let mut best = 0;
                for j in 1..entry.names.len() {
                    if !prefer_name(&entry.names[best], &entry.names[j]) {
                        best = j;
                    }
                }
                let chosen = entry.names.remove(best);
                entry.names.insert(0, chosen);
            }
        }
        SymbolTable { entries: e }
    }

    /// Number of address ranges.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the table is empty.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Index of the text range containing `addr`, if any (a data range
    /// there means no function, as in Valgrind's text lookups).
    pub fn lookup(&self, addr: u64) -> Option<usize> {
        if addr == 0 {
            return None;
        }
        let i = self.entries.partition_point(|e| e.addr <= addr);
        let e = self.entries.get(i.checked_sub(1)?)?;
        (addr <= e.last() && e.is_text).then_some(i - 1)
    }

    /// The displayed (raw, not demangled) name of range `index`.
    pub fn name(&self, index: usize) -> &str {
        &self.entries[index].names[0]
    }

    /// Start address and size of range `index`.
    pub fn range(&self, index: usize) -> (u64, u64) {
        (self.entries[index].addr, self.entries[index].size)
    }
}

/// Appends `from`'s names to `to`'s aliases, as Valgrind does when it
/// merges two entries, unless they carry the very same single name.
fn absorb(to: &mut Entry, from: &mut Entry) {
    if from.names.len() > 1 || from.names[0] != to.names[0] {
        to.names.append(&mut from.names);
    }
    from.live = false;
}

/// Step 2: merges identical ranges; returns after squeezing out the dead.
fn merge_identical(e: &mut Vec<Entry>) {
    loop {
        let mut merged = 0;
        if !e.is_empty() {
            let mut w = 0;
            for r in 1..e.len() {
                if e[w].addr == e[r].addr && e[w].size == e[r].size && e[w].is_text == e[r].is_text
                {
                    let (a, b) = e.split_at_mut(r);
                    absorb(&mut a[w], &mut b[0]);
                    merged += 1;
                } else {
                    w = r;
                }
            }
            for r in 1..e.len() {
                if !e[r - 1].live || !e[r].live {
                    continue;
                }
                if e[r - 1].addr != e[r].addr || e[r - 1].size != e[r].size {
                    continue;
                }
                let (a, b) = e.split_at_mut(r);
                let (prev, cur) = (&mut a[r - 1], &mut b[0]);
                if prev.is_text {
                    absorb(prev, cur);
                } else {
                    absorb(cur, prev);
                }
                merged += 1;
            }
        }
        if merged == 0 {
            return;
        }
        e.retain(|x| x.live);
    }
}

/// Step 3: one pass of overlap truncation; true if anything changed.
fn truncate_overlaps(e: &mut [Entry]) -> bool {
    let mut changed = false;
    let mut i = 0;
    while i + 1 < e.len() {
        if e[i].addr + e[i].size <= e[i + 1].addr {
            i += 1;
            continue;
        }
        let (sta1, end1) = (e[i].addr, e[i].last());
        let (sta2, end2) = (e[i + 1].addr, e[i + 1].last());
        if sta1 < sta2 {
            e[i].size = sta2 - sta1;
        } else if end1 > end2 {
            // Same start, first one longer: the shorter goes first and the
            // longer one keeps only what follows it.
            e.swap(i, i + 1);
            e[i + 1].addr = end2 + 1;
            e[i + 1].size = end1 - end2;
        } else if end1 < end2 {
            e[i + 1].addr = end1 + 1;
            e[i + 1].size = end2 - end1;
        }
        // (Identical ranges are left for the next merge round.)
        let mut j = i + 1;
        while j + 1 < e.len() && e[j].addr > e[j + 1].addr {
            e.swap(j, j + 1);
            j += 1;
        }
        changed = true;
        i += 1;
    }
    changed
}

/// Valgrind's `preferName`: true if `a` is preferred over `b` as the name
/// shown for an address range: non-empty, then non-blank, then the shorter
/// name ignoring any `@version` suffix, then the versioned one, then the
/// alphabetically smaller one.
pub fn prefer_name(a: &str, b: &str) -> bool {
    let base_len = |s: &str| s.find('@').unwrap_or(s.len());
    let (la, lb) = (base_len(a), base_len(b));
    let (va, vb) = (a.contains('@'), b.contains('@'));
    if a.starts_with("MPI_") && b.starts_with("PMPI_") && a == &b[1..] {
        return false;
    }
    if b.starts_with("MPI_") && a.starts_with("PMPI_") && b == &a[1..] {
        return true;
    }
    if la != 0 && lb == 0 {
        return true;
    }
    if lb != 0 && la == 0 {
        return false;
    }
    let blank = |s: &str| s.bytes().all(|c| c.is_ascii_whitespace() || c == 0x0b);
    match (blank(a), blank(b)) {
        (false, true) => return true,
        (true, false) => return false,
        _ => {}
    }
    if la != lb {
        return la < lb;
    }
    if va != vb {
        return va;
    }
    a <= b
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sym(addr: u64, size: u64, name: &str) -> RawSymbol {
        RawSymbol {
            addr,
            size,
            name: name.into(),
            is_text: true,
        }
    }

    fn name_at(t: &SymbolTable, a: u64) -> Option<&str> {
        t.lookup(a).map(|i| t.name(i))
    }

    #[test]
    fn versioned_alias_wins_over_plain_name_of_same_length() {
        let t = SymbolTable::new(vec![
            sym(0x100, 0x10, "__libc_start_main"),
            sym(0x100, 0x10, "__libc_start_main@@GLIBC_2.34"),
            sym(0x200, 0x10, "last"),
        ]);
        assert_eq!(name_at(&t, 0x105), Some("__libc_start_main@@GLIBC_2.34"));
    }

    #[test]
    fn shorter_alias_wins_then_alphabetical() {
        let t = SymbolTable::new(vec![
            sym(0x100, 0x10, "__memcpy_avx"),
            sym(0x100, 0x10, "memcpy_x"),
            sym(0x100, 0x10, "memcpy_a"),
            sym(0x200, 0x10, "last"),
        ]);
        assert_eq!(name_at(&t, 0x100), Some("memcpy_a"));
    }

    #[test]
    fn overlaps_are_truncated_like_valgrind() {
        // A long symbol containing a short one starting at the same place:
        // the short one comes first, the long one keeps only the rest.
        let t = SymbolTable::new(vec![
            sym(0x100, 0x40, "outer"),
            sym(0x100, 0x10, "inner"),
            sym(0x120, 0x30, "next"),
        ]);
        assert_eq!(name_at(&t, 0x100), Some("inner"));
        assert_eq!(name_at(&t, 0x110), Some("outer"));
        assert_eq!(name_at(&t, 0x11f), Some("outer"));
        assert_eq!(name_at(&t, 0x120), Some("next"));
        assert_eq!(name_at(&t, 0x14f), Some("next"));
        assert_eq!(name_at(&t, 0x150), None);
        assert_eq!(name_at(&t, 0xff), None);
    }

    #[test]
    fn data_symbols_hide_nothing_but_name_nothing() {
        let mut d = sym(0x300, 0x10, "table");
        d.is_text = false;
        let t = SymbolTable::new(vec![sym(0x100, 0x10, "f"), d.clone()]);
        assert_eq!(name_at(&t, 0x305), None);
        // A data symbol with the same range as a text one is dropped.
        let t = SymbolTable::new(vec![
            RawSymbol { addr: 0x100, ..d },
            sym(0x100, 0x10, "f"),
            sym(0x200, 1, "z"),
        ]);
        assert_eq!(t.len(), 2);
        assert_eq!(name_at(&t, 0x100), Some("f"));
    }

    #[test]
    fn prefer_name_rules() {
        assert!(prefer_name("a", ""));
        assert!(!prefer_name("", "a"));
        assert!(prefer_name("ab", "abc"));
        assert!(prefer_name("abc@V1", "abc"));
        assert!(!prefer_name("abc", "abc@@V1"));
        assert!(prefer_name("abc@V1", "abc@V2"));
        assert!(prefer_name("PMPI_x", "MPI_x"));
    }
}
