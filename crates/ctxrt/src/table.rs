//! Open-addressed tables of ids in the arena: a power-of-two number of
//! words, each an id plus one (0: empty) under the high half of its key's
//! hash, probed linearly from the hash; the caller compares keys by
//! reading the record an id names, only where the halves agree (python's
//! runs make most of a million nodes and arcs, and a record read is a
//! cache miss: a new key's lookup now reads the index alone).

/// A hash of a key's words, every bit of every word mixed into the bits
/// [`find`] takes (splitmix64's steps). Keys differ in their high halves
/// too (a node's function, an arc's callee), which a multiply alone
/// carries only into higher bits.
pub(crate) fn hash(words: &[u64]) -> u64 {
    let mut h = 0x9e37_79b9_7f4a_7c15u64;
    for &w in words {
        h = (h ^ w).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        h ^= h >> 31;
    }
    h ^= h >> 27;
    h = h.wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ h >> 31
}

/// Where `key` (hashed `h`) is in the table at `words`, or where it would
/// go: `Ok(id)` if `same(id)` holds for an entry, else `Err(slot)` of the
/// first empty word.
pub(crate) fn find(words: &[u64], h: u64, mut same: impl FnMut(u64) -> bool) -> Result<u64, usize> {
    let mask = words.len() - 1;
    let mut i = (h >> 32) as usize & mask;
    loop {
        match words[i] {
            0 => return Err(i),
            e if e >> 32 == h >> 32 && same((e & 0xffff_ffff) - 1) => {
                return Ok((e & 0xffff_ffff) - 1)
            }
            _ => i = (i + 1) & mask,
        }
    }
}

/// The word of a table for id `id` whose key hashed `h` (ids are below
/// 2^32 - 1). The slot a key is probed from is in the word too (it is
/// taken from the same high half), so a table is rebuilt from its words.
pub(crate) fn entry(id: u64, h: u64) -> u64 {
    (h >> 32) << 32 | (id + 1)
}

/// Where entry word `e` of a table goes in a new table of `words` (its
/// key's own probe run).
pub(crate) fn place(words: &[u64], e: u64) -> usize {
    match find(words, e, |_| false) {
        Ok(_) => unreachable!("nothing matches"),
        Err(slot) => slot,
    }
}
