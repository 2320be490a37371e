//! Name tables: the objects, files and functions a profile names, with the
//! ids of Callgrind's name compression (`(id) name` on first use, `(id)`
//! afterwards).
//!
//! Objects, files and functions are three separate id spaces. Identity is
//! the table entry, not the text: Callgrind gives two static functions that
//! share a name in different files two ids, and keeping the ids of a file
//! read in means writing it back reproduces it.

use rustc_hash::FxHashMap;

/// One entry of a [`NameTable`], referred to by its index.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NameId(pub u32);

/// One name and its compression id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Name {
    /// The id written as `(id)`; `None` for a name read uncompressed, which
    /// gets a fresh id when written compressed.
    pub id: Option<u64>,
    /// The name itself.
    pub text: String,
}

/// The names of one id space, in order of first appearance.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NameTable {
    entries: Vec<Name>,
    by_id: FxHashMap<u64, NameId>,
    by_text: FxHashMap<String, NameId>,
}

impl NameTable {
    /// The entry `id` refers to.
    ///
    /// # Panics
    /// If `id` does not come from this table.
    pub fn get(&self, id: NameId) -> &Name {
        &self.entries[id.0 as usize]
    }

    /// The text of entry `id`.
    pub fn text(&self, id: NameId) -> &str {
        &self.get(id).text
    }

    /// All entries, in order.
    pub fn entries(&self) -> &[Name] {
        &self.entries
    }

    /// The number of entries.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the table is empty.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The entry with compression id `id`, if defined.
    pub fn by_id(&self, id: u64) -> Option<NameId> {
        self.by_id.get(&id).copied()
    }

    /// The first entry whose text is `text`, if any.
    pub fn by_text(&self, text: &str) -> Option<NameId> {
        self.by_text.get(text).copied()
    }

    /// The entry for `text`, created with the next free compression id
    /// (one more than the largest so far) if there is none: what a tool
    /// filling a profile calls.
    pub fn intern(&mut self, text: &str) -> NameId {
        if let Some(id) = self.by_text(text) {
            return id;
        }
        let next = self.max_id().map_or(1, |m| m + 1);
        self.push(Some(next), text)
    }

    /// The entry for a name read uncompressed: the first with that text,
    /// or a new one without an id.
    pub(crate) fn intern_uncompressed(&mut self, text: &str) -> NameId {
        match self.by_text(text) {
            Some(id) => id,
            None => self.push(None, text),
        }
    }

    /// Defines compression id `id` as `text`. Redefining an id with the
    /// same text is allowed (Callgrind repeats definitions in each part).
    pub(crate) fn define(&mut self, id: u64, text: &str) -> Result<NameId, String> {
        match self.by_id(id) {
            Some(existing) if self.text(existing) == text => Ok(existing),
            Some(existing) => Err(format!(
                "name ({id}) redefined: was `{}`, now `{text}`",
                self.text(existing)
            )),
            None => Ok(self.push(Some(id), text)),
        }
    }

    fn push(&mut self, id: Option<u64>, text: &str) -> NameId {
        let index = NameId(u32::try_from(self.entries.len()).expect("fewer than 2^32 names"));
        self.entries.push(Name {
            id,
            text: text.to_string(),
        });
        if let Some(id) = id {
            self.by_id.insert(id, index);
        }
        self.by_text.entry(text.to_string()).or_insert(index);
        index
    }

    fn max_id(&self) -> Option<u64> {
        self.entries.iter().filter_map(|n| n.id).max()
    }

    /// The id each entry is written with: its own, or for entries without
    /// one, fresh ids after the largest, in table order.
    pub(crate) fn effective_ids(&self) -> Vec<u64> {
        let mut next = self.max_id().map_or(1, |m| m + 1);
        self.entries
            .iter()
            .map(|n| {
                n.id.unwrap_or_else(|| {
                    next += 1;
                    next - 1
                })
            })
            .collect()
    }
}

/// The three id spaces of a profile.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Names {
    /// Objects (`ob=`, `cob=`).
    pub objects: NameTable,
    /// Source files (`fl=`, `fi=`, `fe=`, `cfi=`, `jfi=`).
    pub files: NameTable,
    /// Functions (`fn=`, `cfn=`, `jfn=`).
    pub functions: NameTable,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_and_texts() {
        let mut t = NameTable::default();
        let a = t.define(5, "a").unwrap();
        assert_eq!(t.define(5, "a").unwrap(), a);
        assert!(t.define(5, "b").unwrap_err().contains("redefined"));
        let b = t.intern_uncompressed("b");
        assert_eq!(t.get(b).id, None);
        let c = t.intern("c");
        assert_eq!(t.get(c).id, Some(6));
        assert_eq!(t.intern("a"), a);
        assert_eq!(t.effective_ids(), vec![5, 7, 6]);
        // Same text, different ids: two entries.
        let a2 = t.define(9, "a").unwrap();
        assert_ne!(a, a2);
        assert_eq!(t.by_text("a"), Some(a));
        assert_eq!(t.by_id(9), Some(a2));
    }
}
