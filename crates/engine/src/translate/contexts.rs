//! Contexts mode (`docs/client-contexts.md`): a block that keeps the
//! client's calling contexts instead of a counter. Its translation starts
//! with its *context entry* (a call of the runtime, which decides what the
//! transfer that came here was), then its body: the guest code, its Ir
//! added to the current context's counter for it and to the thread's
//! running Ir, and, before it leaves, its id stored as the block run last.
//! Transfers that keep the context (a direct jump, conditional branch or
//! fall-through within one function, not to its start) are linked past
//! the target's context entry ([`Translation::plain_exits`]).

use super::*;
use crate::emit::{CONTEXT_ENTRY_BYTES, UNCHECKED};

/// What the translator needs to know of a block in contexts mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ContextBlock {
    /// Its id (its facts' index in the process's table).
    pub id: u32,
    /// Its number among its function's blocks (its counter's).
    pub index: u32,
    /// The last counter word it uses: its counter's, or its call memo's
    /// last (`ctxrt::Facts::last_word`); the counters' room must pass it.
    pub last: u32,
    /// Tagged counting (`ctxrt::tagged`): it counts in its slot.
    pub tagged: bool,
    /// `--separate-recs` (tagged counting's inline calls compute tags).
    pub recs: u32,
    /// Tagged counting: its inline calls and returns are counted
    /// (`ctxrt::tagged::head::INLINE`).
    pub count_inline: bool,
    /// Its code's object and section kind (`callrules::Flow::domain`),
    /// whether a function starts there and whether it is skipped: tagged
    /// counting writes them before the block's context entry
    /// ([`tagged_header`]).
    pub domain: u32,
    /// See [`ContextBlock::domain`].
    pub entry: bool,
    /// See [`ContextBlock::domain`].
    pub skip: bool,
    /// Its function (the classifier's number).
    pub function: u32,
    /// A jump out of its function first returns from it (the resolver's:
    /// `callrules::Flow::pop_on_jump`).
    pub pop_on_jump: bool,
}

/// Tagged counting: the 24 bytes right before a block's context entry,
/// three `nop dword [rax+rax+disp32]` (harmless where a block falls into
/// the next) whose displacements say what inline indirect jumps and calls
/// need to know of the block without the runtime: its domain, whether it
/// is skipped code and whether a function starts there
/// ([`header_word`]), its function, and its id.
pub fn tagged_header(cb: &ContextBlock) -> [u8; TAGGED_HEADER_BYTES] {
    let mut h = [0; TAGGED_HEADER_BYTES];
    let words = [
        header_word(cb.domain, cb.skip, cb.entry),
        cb.function,
        cb.id,
    ];
    for (chunk, w) in h.chunks_mut(8).zip(words) {
        chunk[..4].copy_from_slice(&[0x0f, 0x1f, 0x84, 0x00]);
        chunk[4..].copy_from_slice(&w.to_le_bytes());
    }
    h
}

/// Bytes of [`tagged_header`].
pub const TAGGED_HEADER_BYTES: usize = 24;

/// The first word of a block's [`tagged_header`]: `domain << 2 | skip <<
/// 1 | entry`.
pub fn header_word(domain: u32, skip: bool, entry: bool) -> u32 {
    domain << 2 | u32::from(skip) << 1 | u32::from(entry)
}

/// Translates the block at `guest` in contexts mode.
pub(super) fn translate_contexts(
    code: &[u8],
    guest: u64,
    host: u64,
    ctx: &mut dyn TransCtx,
    cb: ContextBlock,
) -> Result<Translation, TransError> {
    let (mut items, mut stop) = decode_block(code, guest, ctx.smc_stub().is_some())?;
    rep_alone(&mut items, &mut stop);
    // The counter of a block that may leave its context other than by a
    // return (a call, a jump into another function, counter group or
    // object: a PLT entry's, a tail call) is followed by its call memo
    // (`ctxrt::fast`).
    let store_last = leaves_context(&items, &stop, &mut *ctx);
    let returns = matches!(items.last(), Some(Item::Insn(i))
        if i.flow_control() == FlowControl::Return);
    let cb = if store_last && !returns && !cb.tagged {
        ctx.reserve_call_memo();
        ContextBlock {
            last: cb.index + ctxrt::CALL_MEMO_WORDS as u32,
            ..cb
        }
    } else {
        cb
    };
    let rep = match items.first() {
        Some(Item::Insn(i)) if is_rep(i) => Some(*i),
        _ => None,
    };
    let core = ctx.core();
    let header = cb.tagged.then(|| tagged_header(&cb));
    let mut b = Builder::start_with(ctx, host, 0, &items, code, guest, header, |e| {
        e.context_entry(core, cb.id);
    });
    debug_assert_eq!(b.e.here() - b.t.body, CONTEXT_ENTRY_BYTES);
    b.contexts = true;
    if cb.tagged {
        b.tagged = Some(cb);
        b.e.count_inline = cb.count_inline;
    }
    let instrs = items.len() as u32;
    let mut grows = Vec::new();
    let count = |b: &mut Builder, r: Option<Register>, grows: &mut Vec<_>| {
        let r = r.unwrap_or(Register::RAX);
        if let Some(g) = b.e.context_count(r, cb, instrs) {
            grows.push((g, r));
        }
    };
    // Counted before any system call of the block: a `clone` child goes
    // on after it, and the stream path counts the block for the parent.
    let placement = match counter_position(&items) {
        Placement::DeadFlags(n) | Placement::DeadRegister(n, _)
            if items[..n].iter().any(|it| {
                matches!(it, Item::Insn(i) if i.mnemonic() == Mnemonic::Syscall)
                    || matches!(it, Item::ClientRequest(_))
            }) =>
        {
            Placement::Spill
        }
        p => p,
    };
    // Where the flags are dead, the count goes at the earliest place they
    // are (after the last instruction before it that reads them) that has
    // a dead register, else where counter_position put it, RAX spilled: a
    // spill's reload sits on the path of whatever RAX holds (bzip2's
    // loops).
    let (placement, dead_flags_register) = match placement {
        Placement::DeadFlags(n) => match dead_flags_with_register(&items, n) {
            Some((k, r)) => (Placement::DeadFlags(k), Some(r)),
            None => (Placement::DeadFlags(n), None),
        },
        p => (p, None),
    };
    // Blocks numbered past the first counters need a bounds check, which
    // needs the flags; the others count without them where flags live.
    // (A tagged count always compares its slot's tag.)
    let flag_free = cb.last < UNCHECKED && !cb.tagged;
    let spilled = |b: &mut Builder| b.e.store_gs(Register::RAX, layout::S_RAX);
    let unspill = |b: &mut Builder| b.e.load_gs(Register::RAX, layout::S_RAX);
    // A rep block is counted after its instruction; others where the
    // flags are dead, else through a dead register, else at the start.
    match placement {
        _ if rep.is_some() => {}
        Placement::DeadFlags(_) => {}
        Placement::DeadRegister(..) if flag_free => {}
        Placement::Spill if flag_free => {
            spilled(&mut b);
            b.e.context_count_flag_free(Register::RAX, cb.index, instrs);
            unspill(&mut b);
        }
        _ => {
            // Flags live and a bounds check: they are kept in AX, the
            // count goes through RCX.
            b.e.keep_flags_in_ax(true);
            b.e.store_gs(Register::RCX, layout::S_RCX);
            count(&mut b, Some(Register::RCX), &mut grows);
            b.e.load_gs(Register::RCX, layout::S_RCX);
            b.e.keep_flags_in_ax(false);
        }
    }
    let mut end = guest;
    for (n, item) in items.iter().enumerate() {
        match (placement, item, rep) {
            (Placement::DeadFlags(at), Item::Insn(_), None) if at == n => match dead_flags_register
            {
                Some(r) => count(&mut b, Some(r), &mut grows),
                None => {
                    spilled(&mut b);
                    count(&mut b, None, &mut grows);
                    unspill(&mut b);
                }
            },
            (Placement::DeadRegister(at, r), Item::Insn(_), None) if at == n && flag_free => {
                b.e.context_count_flag_free(r, cb.index, instrs);
            }
            _ => {}
        }
        match item {
            Item::ClientRequest(ip) => {
                b.t.counted.push(*ip);
                end = ip + 19;
                b.e.store_last(cb.id, false);
                b.client_request(end);
            }
            Item::Illegal(ip, len) => {
                b.t.counted.push(*ip);
                end = ip + u64::from(*len);
                b.illegal(*ip);
            }
            Item::Insn(i) => {
                end = i.next_ip();
                b.t.counted.push(i.ip());
                if is_rep(i) {
                    let ctr = b.ctx.alloc_counter()?;
                    if is_cond_rep(i) {
                        b.e.count_cond_rep_before();
                        b.copy(i, code, guest)?;
                        b.e.count_cond_rep_after(ctr, i.has_repe_prefix());
                    } else {
                        b.e.count_rep(ctr);
                        b.copy(i, code, guest)?;
                    }
                    if let Some(g) = b.e.context_rep_count(ctr, cb) {
                        grows.push((g, Register::RCX));
                    }
                } else if i.flow_control() == FlowControl::Next {
                    b.copy(i, code, guest)?;
                } else {
                    if store_last {
                        let returns = i.flow_control() == FlowControl::Return;
                        b.pending_last = Some((cb.id, returns));
                    }
                    b.terminator(i, code, guest)?;
                }
            }
        }
    }
    if let Stop::Continue(next) = stop {
        if store_last {
            b.e.store_last(cb.id, false);
        }
        b.exit_jmp_next(next, PointKind::Clean);
    }
    for ((grow, back, id), r) in grows {
        b.e.context_grow(core, grow, back, r, id);
    }
    b.seal(end);
    b.t.points.clear();
    let mut info = events::BlockInfo::new(guest, traced::terminator_of(&items, &stop));
    for item in &items {
        let (ip, len) = match item {
            Item::Insn(i) => (i.ip(), i.len() as u8),
            Item::ClientRequest(ip) => (*ip, 19),
            Item::Illegal(ip, len) => (*ip, *len),
        };
        info.push(ip, len, &[]);
    }
    b.t.info = Some(info);
    Ok(b.t)
}

/// Whether the block must store its id as the block left before it
/// leaves: some way out of it may reach a context entry, where the
/// runtime reads it. A block whose every exit keeps the context (a direct
/// jump, conditional branch or fall-through within its counter group,
/// linked past the target's entry: `Builder::mark_plain`'s test) need
/// not: the next entry is reached from a later block, which stores its
/// own. A block with a system call stores it all the same: a `clone`
/// child goes on after it, and its first entry takes the block left for
/// the block that made it.
fn leaves_context(items: &[Item], stop: &Stop, ctx: &mut dyn TransCtx) -> bool {
    let syscall = items.iter().any(|it| match it {
        Item::Insn(i) => i.mnemonic() == Mnemonic::Syscall,
        Item::ClientRequest(_) | Item::Illegal(..) => true,
    });
    if syscall {
        return true;
    }
    let last = match items.last() {
        Some(Item::Insn(i)) if i.flow_control() != FlowControl::Next => Some(i),
        _ => None,
    };
    match (last, stop) {
        (None, Stop::Continue(next)) => !ctx.same_context(*next),
        (Some(i), Stop::Terminator) if i.is_jmp_short_or_near() => {
            !ctx.same_context(i.near_branch_target())
        }
        (Some(i), Stop::Terminator) if i.is_jcc_short_or_near() => {
            !(ctx.same_context(i.near_branch_target()) && ctx.same_context(i.next_ip()))
        }
        _ => true,
    }
}

/// The earliest place at or before item `n` (where the flags are dead,
/// `Placement::DeadFlags`) where the flags are dead and a register is
/// too, and that register.
fn dead_flags_with_register(items: &[Item], n: usize) -> Option<(usize, Register)> {
    let mut k0 = n;
    while k0 > 0 {
        match &items[k0 - 1] {
            Item::Insn(i)
                if i.flow_control() == FlowControl::Next
                    && !is_rep(i)
                    && i.rflags_read() & STATUS == 0 =>
            {
                k0 -= 1
            }
            _ => break,
        }
    }
    let mut info = InstructionInfoFactory::new();
    (k0..=n).find_map(|k| dead_register_from(items, k, &mut info).map(|r| (k, r)))
}
