//! Open-addressed tables of ids in the arena: a power-of-two number of
//! words, each an id plus one (0: empty), probed linearly from a hash of
//! the key; the caller compares keys by reading the record an id names.

/// Fibonacci hashing of a key's words.
pub(crate) fn hash(words: &[u64]) -> u64 {
    let mut h = 0u64;
    for &w in words {
        h = (h.rotate_left(5) ^ w).wrapping_mul(0x517c_c1b7_2722_0a95);
    }
    h
}

/// Where `key` (hashed `h`) is in the table at `words`, or where it would
/// go: `Ok(id)` if `same(id)` holds for an entry, else `Err(slot)` of the
/// first empty word.
pub(crate) fn find(words: &[u64], h: u64, mut same: impl FnMut(u64) -> bool) -> Result<u64, usize> {
    let mask = words.len() - 1;
    let mut i = (h >> 20) as usize & mask;
    loop {
        match words[i] {
            0 => return Err(i),
            e if same(e - 1) => return Ok(e - 1),
            _ => i = (i + 1) & mask,
        }
    }
}
