//! The per-block fast path: what one block execution needs when control
//! stays in its function, and the lookup of a block's cost cell in the
//! current context.
//!
//! Most blocks are entered by a jump or fall-through inside one function,
//! where Callgrind's `setup_bbcc` changes nothing but the cost cell
//! (`BBCC`) charged. Whether a transfer can be one is a property of the two
//! blocks, known when they are described: the previous block ends in a
//! direct jump, conditional jump or fall-through (no stack pointer to
//! check), the next is no function's first instruction, and both lie in
//! the same object and section kind. [`Hot`] keeps that as two numbers
//! that are equal exactly then, next to the block's cost-cell cache, in one
//! dense array: a block execution is a compare of the two, a compare of
//! the cached context and an increment.
//!
//! Cost cells are found as Callgrind finds its `BBCC`s: first the block's
//! last one (loops), then the one that followed the previous block's cell
//! last time (a function alternating between contexts keeps its path in
//! each: a context's parent is fixed, so even returns find their cell), and
//! only then the tree's map.

use crate::tree::{NodeId, Tree, NO_NODE};
use callrules::Exit;

/// No run slot.
pub(crate) const NO_SLOT: u32 = u32::MAX;

/// `Hot::from` of a block whose exit needs the slow path (calls and
/// returns), and a thread's [`Hot::stays_from`] when its state does.
pub(crate) const SLOW_FROM: u32 = u32::MAX;
/// `Hot::to` of a block entered only by the slow path (a function's first
/// instruction, an undescribed id).
const SLOW_TO: u32 = u32::MAX - 1;

/// What the fast path needs of a block, by id.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Hot {
    /// The context it was charged in last, and that pair's run slot.
    pub node: NodeId,
    pub slot: u32,
    /// Its instruction count (its Ir per execution).
    pub instrs: u32,
    /// Its object and section kind if a plain jump or fall-through ends
    /// it, else [`SLOW_FROM`].
    from: u32,
    /// Its object and section kind if it may be entered without a call or
    /// return, else [`SLOW_TO`].
    to: u32,
    /// How control leaves it (for the stack pointer its record ends with,
    /// read right after it ran: its `Flow` is not in the caches then).
    pub exit: Exit,
}

impl Default for Hot {
    fn default() -> Self {
        Hot {
            node: NO_NODE,
            slot: NO_SLOT,
            instrs: 0,
            from: SLOW_FROM,
            to: SLOW_TO,
            exit: Exit::Jump,
        }
    }
}

impl Hot {
    /// A described block of `instrs` instructions in `domain` (its object
    /// and section kind, as one number below `u32::MAX - 1`), left by
    /// `exit` and starting a function or not (`entry`).
    pub fn new(instrs: u32, domain: u32, exit: Exit, entry: bool) -> Hot {
        debug_assert!(domain < SLOW_TO);
        let plain_exit = matches!(exit, Exit::Jump | Exit::FallThrough);
        Hot {
            instrs,
            exit,
            from: if plain_exit { domain } else { SLOW_FROM },
            to: if entry { SLOW_TO } else { domain },
            ..Hot::default()
        }
    }

    /// The block, left only by the slow path (its exits are counted
    /// there: `--collect-jumps=yes`).
    pub fn left_slowly(self) -> Hot {
        Hot {
            from: SLOW_FROM,
            ..self
        }
    }

    /// Whether control going from block `self` to block `next` is neither
    /// a call nor a return, whatever the stacks hold (given no stack
    /// pointer is pending).
    #[cfg(test)]
    pub fn stays_to(&self, next: &Hot) -> bool {
        self.stays_from() == next.to
    }

    /// What a thread whose last block this is keeps to compare with the
    /// next block's [`Hot::stays_with`] (equal: the fast path).
    #[inline]
    pub fn stays_from(&self) -> u32 {
        self.from
    }

    /// See [`Hot::stays_from`].
    #[inline]
    pub fn stays_with(&self) -> u32 {
        self.to
    }
}

/// The run slot of `block` (of `instrs` instructions) in `node`, where
/// `hot` is the block's cache and `prev` the slot the thread charged last
/// ([`NO_SLOT`] if none): the cache, the slot that followed `prev` last
/// time, or the tree's (made if new, with its rows when the tree has a
/// simulation's). Both caches are updated.
#[inline(always)]
pub(crate) fn lookup(tree: &mut Tree, hot: &mut Hot, node: NodeId, block: u32, prev: u32) -> u32 {
    if hot.node == node {
        return hot.slot;
    }
    lookup_further(tree, hot, node, block, prev)
}

/// [`lookup`] past the block's cache (kept out of line: the fast path
/// stays small).
#[inline(never)]
fn lookup_further(tree: &mut Tree, hot: &mut Hot, node: NodeId, block: u32, prev: u32) -> u32 {
    let slot = match tree.next.get(prev as usize) {
        Some(&s) if s != NO_SLOT && tree.run_keys[s as usize] == (node, block) => s,
        _ => {
            let s = slot_of(tree, node, block, u64::from(hot.instrs));
            if let Some(n) = tree.next.get_mut(prev as usize) {
                *n = s;
            }
            s
        }
    };
    hot.node = node;
    hot.slot = slot;
    slot
}

/// The run slot of `block` (of `n` instructions) in `node`, made if new,
/// with its rows when the tree has a simulation's.
fn slot_of(tree: &mut Tree, node: NodeId, block: u32, n: u64) -> u32 {
    let slot = tree.run_slot(node, block);
    if tree.width > 0 && tree.run_rows.len() <= slot as usize {
        let row = tree.rows.len() / tree.width;
        tree.run_rows.push(row as u32);
        tree.rows
            .resize(tree.rows.len() + n as usize * tree.width, 0);
    }
    slot
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_transfers_in_one_domain_stay() {
        let plain = Hot::new(3, 7, Exit::Jump, false);
        let entry = Hot::new(3, 7, Exit::FallThrough, true);
        let call = Hot::new(3, 7, Exit::Return, false);
        let other = Hot::new(3, 8, Exit::Jump, false);
        assert!(plain.stays_to(&plain));
        assert!(!call.stays_to(&plain), "a call or return ends it");
        assert!(!plain.stays_to(&entry), "a function's start is a call");
        assert!(!plain.stays_to(&other), "another object or section");
        assert!(!plain.stays_to(&Hot::default()), "an undescribed block");
        assert!(!Hot::default().stays_to(&Hot::default()));
    }

    #[test]
    fn slots_are_found_by_cache_successor_and_map() {
        let mut tree = Tree::default();
        let (a, b) = (tree.child(NO_NODE, 0, 1, 1), tree.child(NO_NODE, 1, 1, 1));
        let mut h1 = Hot::new(2, 0, Exit::Jump, false);
        let mut h2 = Hot::new(2, 0, Exit::Jump, false);
        // Block 1 then 2 in context a, then in b, then in a again.
        let a1 = lookup(&mut tree, &mut h1, a, 1, NO_SLOT);
        let a2 = lookup(&mut tree, &mut h2, a, 2, a1);
        let b1 = lookup(&mut tree, &mut h1, b, 1, a2);
        let b2 = lookup(&mut tree, &mut h2, b, 2, b1);
        assert_eq!(tree.runs.len(), 4);
        assert_eq!(tree.next[a1 as usize], a2);
        assert_eq!(tree.next[b1 as usize], b2);
        assert_eq!(lookup(&mut tree, &mut h1, a, 1, b2), a1);
        assert_eq!(lookup(&mut tree, &mut h2, a, 2, a1), a2, "by successor");
        assert_eq!(lookup(&mut tree, &mut h2, a, 2, NO_SLOT), a2, "cached");
        assert_eq!(tree.run_keys[b2 as usize], (b, 2));
        assert_eq!(tree.runs.len(), 4, "nothing made twice");
    }
}
