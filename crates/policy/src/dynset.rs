//! The live elements of dynamic sets: `add @s { ip saddr }`, `update @s {
//! ip saddr limit rate over 3/minute }`, `delete @s { ... }` and the
//! lookups `ip saddr @s` (the kernel's `nft_dynset` and `nft_lookup` on a
//! set with `flags dynamic`).
//!
//! Semantics, as the kernel's:
//! - `add` inserts the key unless present (an existing element keeps its
//!   expiry); `update` inserts it or gives the element a fresh timeout;
//!   both then run the element's `limit`, and the rule goes on only if it
//!   matches. A full set (`size`, default 65 535) takes no new key and the
//!   rule stops there.
//! - `delete` removes the key if present; the rule always goes on.
//! - An element expires `timeout` after it was added or updated (the
//!   statement's `timeout`, else the set's; none: it stays). Expired
//!   elements are absent for lookups and are reclaimed when the set is full.
//! - The elements a set is declared with expire as the kernel's do:
//!   their `expires` (a listing of a live set), else their own `timeout`,
//!   else the set's, counted from when the rule set starts (its timers are
//!   started by the gateway when it publishes it, [`DynSet::start`], or
//!   else by the set's first use); without any, never.
//! - A full rule-set load starts every dynamic set afresh, as `nft -f` of a
//!   file with `flush ruleset` does; rule and element updates through the
//!   control socket keep the live elements.
//!
//! Concurrency: the workers share the sets. Each set is split into
//! [`SHARDS`] hash maps behind a mutex each, every map allocated for its
//! share of the set's size when the set is created, so an insert does not
//! allocate while the shares stay even. This is the policy's slow path (a
//! connection's first packet, or every packet of a rule set that filters
//! established traffic); an uncontended lock is one atomic exchange, as
//! the kernel's per-bucket spinlock of `nft_set_hash` is.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};

use hashbrown::HashMap;
use sluice_classify::ir::PacketFields;

use crate::conncount::ConnCounts;
use crate::limits::Rate;
use crate::lower::{DynSetSpec, KeySrc, SetKey, SetOpKind, SetOpSpec, MAX_SET_KEY};

/// Maps per set.
pub(crate) const SHARDS: usize = 16;

/// Expiry of an element that never expires.
const NEVER: u64 = u64::MAX;

#[derive(Debug, Clone, Copy)]
struct Elem {
    /// ms; [`NEVER`] for none.
    expires_ms: u64,
    /// The element's `limit` bucket (nano-units) and its last refill (ms;
    /// `u64::MAX` before the first packet).
    tokens: u64,
    last_ms: u64,
    /// Packets and bytes that hit the element through `add`/`update`.
    packets: u64,
    bytes: u64,
    /// The operation that created the element, whose `limit`, `quota`
    /// and `ct count` the element keeps ([`NO_OP`]: declared or added by
    /// the control plane, without any).
    creator: u32,
    /// Bytes its `quota` has counted (from the quota's `used` at
    /// creation).
    quota_used: u64,
    /// `expires_ms` is relative to the start of the rule set's timers (a
    /// declared element before [`DynSet::start`]).
    rel: bool,
}

/// [`Elem::creator`] of an element no statement created.
const NO_OP: u32 = u32::MAX;

impl Elem {
    fn live(&self, now_ms: u64) -> bool {
        self.expires_ms > now_ms
    }
}

/// One dynamic set.
#[derive(Debug)]
pub(crate) struct DynSet {
    timeout_ms: Option<u64>,
    cap: usize,
    /// Elements in all shards, expired ones included until reclaimed.
    len: AtomicUsize,
    shards: Box<[Mutex<HashMap<SetKey, Elem>>]>,
    /// Some declared element's expiry waits for [`DynSet::start`].
    pending: AtomicBool,
}

/// An element as [`DynSet::elements`] lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListedElem {
    /// The key's values.
    pub key: Vec<u128>,
    /// ms left, `None` when it does not expire.
    pub expires_in_ms: Option<u64>,
    /// Packets and bytes counted on it.
    pub packets: u64,
    /// Bytes.
    pub bytes: u64,
    /// The open connections its `ct count` holds; `None` without one.
    pub connections: Option<u64>,
}

fn shard_of(k: &SetKey) -> usize {
    let mut h = 0u64;
    for v in k {
        h = (h ^ (*v as u64) ^ ((*v >> 64) as u64)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
    (h >> 60) as usize % SHARDS
}

impl DynSet {
    pub(crate) fn new(spec: &DynSetSpec) -> Self {
        let cap = spec.size.max(1) as usize;
        let per = cap.div_ceil(SHARDS) + cap.div_ceil(SHARDS) / 2 + 8;
        let shards = (0..SHARDS)
            .map(|_| Mutex::new(HashMap::with_capacity(per)))
            .collect::<Vec<_>>()
            .into_boxed_slice();
        let set = DynSet {
            timeout_ms: spec.timeout_ms,
            cap,
            len: AtomicUsize::new(0),
            shards,
            pending: AtomicBool::new(false),
        };
        for (i, k) in spec.elements.iter().take(cap).enumerate() {
            let e = match spec.expires.get(i).copied().flatten() {
                Some(ms) => {
                    set.pending.store(true, Ordering::Relaxed);
                    Elem {
                        rel: true,
                        ..fresh(ms, NO_OP)
                    }
                }
                None => fresh(NEVER, NO_OP),
            };
            let mut m = set.shard(k);
            if m.insert(*k, e).is_none() {
                set.len.fetch_add(1, Ordering::Relaxed);
            }
        }
        set
    }

    /// Starts the timers of the declared elements at `now_ms` (the
    /// workers' clock): each expires its time after now. Once; later
    /// calls, and calls of a set without such elements, do nothing. Every
    /// use of the set at a time starts them first, so a rule set nobody
    /// started (`sluice trace`) times them from its first packet.
    pub(crate) fn start(&self, now_ms: u64) {
        if !self.pending.load(Ordering::Acquire) {
            return;
        }
        // Under every shard's lock, so that no use sees half of them
        // started; the flag is cleared last.
        let mut guards: Vec<_> = self
            .shards
            .iter()
            .map(|s| s.lock().unwrap_or_else(PoisonError::into_inner))
            .collect();
        if !self.pending.load(Ordering::Acquire) {
            return;
        }
        for m in guards.iter_mut() {
            for e in m.values_mut().filter(|e| e.rel) {
                e.expires_ms = e.expires_ms.saturating_add(now_ms);
                e.rel = false;
            }
        }
        self.pending.store(false, Ordering::Release);
    }

    /// A copy of the set and its elements (a trace's throw-away state).
    pub(crate) fn snapshot(&self) -> Self {
        DynSet {
            timeout_ms: self.timeout_ms,
            cap: self.cap,
            pending: AtomicBool::new(self.pending.load(Ordering::Acquire)),
            len: AtomicUsize::new(self.len.load(Ordering::Relaxed)),
            shards: self
                .shards
                .iter()
                .map(|s| Mutex::new(s.lock().unwrap_or_else(PoisonError::into_inner).clone()))
                .collect(),
        }
    }

    fn shard(&self, k: &SetKey) -> std::sync::MutexGuard<'_, HashMap<SetKey, Elem>> {
        // A poisoned map is still a valid map: a panic elsewhere does not
        // take the set down with it.
        self.shards[shard_of(k)]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether `k` is a live element.
    pub(crate) fn contains(&self, k: &SetKey, now_ms: u64) -> bool {
        self.start(now_ms);
        self.shard(k).get(k).is_some_and(|e| e.live(now_ms))
    }

    /// Removes every element (`flush set`).
    pub(crate) fn clear(&self) {
        for s in self.shards.iter() {
            let mut m = s.lock().unwrap_or_else(PoisonError::into_inner);
            self.len.fetch_sub(m.len(), Ordering::Relaxed);
            m.clear();
        }
    }

    /// Whether `n` more elements fit.
    pub(crate) fn has_room(&self, n: usize) -> bool {
        self.len.load(Ordering::Relaxed).saturating_add(n) <= self.cap
    }

    /// Inserts `k` (the control plane's `add element`): to stay until
    /// deleted (`lifetime_ms` `None`), or to expire that long after its
    /// timer starts, at the next [`Self::start`] (the gateway starts it
    /// when it publishes the change) or use. An element already there
    /// keeps its state but takes that expiry.
    pub(crate) fn insert_added(&self, k: &SetKey, lifetime_ms: Option<u64>) {
        let (expires_ms, rel) = match lifetime_ms {
            Some(ms) => (ms, true),
            None => (NEVER, false),
        };
        let mut m = self.shard(k);
        match m.get_mut(k) {
            Some(e) => {
                e.expires_ms = expires_ms;
                e.rel = rel;
            }
            None => {
                m.insert(
                    *k,
                    Elem {
                        rel,
                        ..fresh(expires_ms, NO_OP)
                    },
                );
                self.len.fetch_add(1, Ordering::Relaxed);
            }
        }
        if rel {
            self.pending.store(true, Ordering::Release);
        }
    }

    /// Removes `k`; whether it was there (live or not).
    pub(crate) fn delete(&self, k: &SetKey) -> bool {
        let gone = self.shard(k).remove(k).is_some();
        if gone {
            self.len.fetch_sub(1, Ordering::Relaxed);
        }
        gone
    }

    /// Removes every expired element; how many.
    fn reclaim(&self, now_ms: u64) -> usize {
        let mut n = 0;
        for s in self.shards.iter() {
            let mut m = s.lock().unwrap_or_else(PoisonError::into_inner);
            let before = m.len();
            m.retain(|_, e| e.live(now_ms));
            n += before - m.len();
        }
        self.len.fetch_sub(n, Ordering::Relaxed);
        n
    }

    /// `add` (`refresh` false) or `update` (true) of `k` by operation
    /// `op`; the operation that created the element (`op` itself for a new
    /// one) and whether it was created now (absent or expired before),
    /// after its packet and byte counts and its `limit` (`ops`, by
    /// operation id) ran: `None` when the rule stops there (the set is
    /// full, or the limit did not match).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn upsert(
        &self,
        k: &SetKey,
        refresh: bool,
        op: u32,
        ops: &[(SetOpSpec, Option<Rate>)],
        now_ms: u64,
        len: u32,
    ) -> Option<(u32, bool)> {
        self.start(now_ms);
        let timeout_ms = ops.get(op as usize).and_then(|(o, _)| o.timeout_ms);
        let expires = match timeout_ms.or(self.timeout_ms) {
            Some(t) => now_ms.saturating_add(t),
            None => NEVER,
        };
        let mut reclaimed = false;
        loop {
            let mut m = self.shard(k);
            match m.get_mut(k) {
                Some(e) if e.live(now_ms) => {
                    if refresh {
                        e.expires_ms = expires;
                    }
                    return hit(e, ops, now_ms, len).map(|c| (c, false));
                }
                Some(e) => {
                    // Expired: it is added afresh.
                    *e = fresh_by(expires, op, ops);
                    return hit(e, ops, now_ms, len).map(|c| (c, true));
                }
                None => {}
            }
            if self.len.load(Ordering::Relaxed) < self.cap {
                self.len.fetch_add(1, Ordering::Relaxed);
                let e = m.entry(*k).or_insert(fresh_by(expires, op, ops));
                return hit(e, ops, now_ms, len).map(|c| (c, true));
            }
            drop(m);
            // Full: make room from expired elements once, else the rule
            // stops (the kernel's dynset breaks when the set is full).
            if reclaimed || self.reclaim(now_ms) == 0 {
                return None;
            }
            reclaimed = true;
        }
    }

    /// The live elements, keys cut to `key_len` values, with the
    /// connections counted for those whose creating operation (of `ops`)
    /// has a `ct count` (this is set `set` of `counts`).
    pub(crate) fn elements(
        &self,
        key_len: usize,
        now_ms: u64,
        set: u32,
        ops: &[(SetOpSpec, Option<Rate>)],
        counts: &ConnCounts,
    ) -> Vec<ListedElem> {
        self.start(now_ms);
        let mut out = Vec::new();
        for s in self.shards.iter() {
            let m = s.lock().unwrap_or_else(PoisonError::into_inner);
            for (k, e) in m.iter().filter(|(_, e)| e.live(now_ms)) {
                let counted = ops
                    .get(e.creator as usize)
                    .is_some_and(|(o, _)| o.ct_count.is_some());
                out.push(ListedElem {
                    key: k.iter().take(key_len.min(MAX_SET_KEY)).copied().collect(),
                    expires_in_ms: (e.expires_ms != NEVER).then(|| e.expires_ms - now_ms),
                    packets: e.packets,
                    bytes: e.bytes,
                    connections: counted.then(|| counts.counted(set, k) as u64),
                });
            }
        }
        out.sort_by(|a, b| a.key.cmp(&b.key));
        out
    }
}

/// A new element created by operation `creator` (of `ops`): its quota
/// starts at the quota's `used` bytes.
fn fresh_by(expires_ms: u64, creator: u32, ops: &[(SetOpSpec, Option<Rate>)]) -> Elem {
    let used = ops
        .get(creator as usize)
        .and_then(|(o, _)| o.quota)
        .map_or(0, |q| q.used_bytes());
    Elem {
        quota_used: used,
        ..fresh(expires_ms, creator)
    }
}

fn fresh(expires_ms: u64, creator: u32) -> Elem {
    Elem {
        expires_ms,
        tokens: u64::MAX,
        last_ms: u64::MAX,
        packets: 0,
        bytes: 0,
        creator,
        quota_used: 0,
        rel: false,
    }
}

/// Counts the packet on the element and runs the `limit` of the operation
/// that created it (the kernel's element keeps the expressions it was
/// created with; one a statement did not create has none); the creator,
/// or `None` when the limit stops the rule.
fn hit(e: &mut Elem, ops: &[(SetOpSpec, Option<Rate>)], now_ms: u64, len: u32) -> Option<u32> {
    e.packets += 1;
    e.bytes += u64::from(len);
    let Some((op, rate)) = ops.get(e.creator as usize) else {
        return Some(e.creator);
    };
    if let Some(r) = rate {
        if !r.take(&mut e.tokens, &mut e.last_ms, now_ms, len) {
            return None;
        }
    }
    if let Some(q) = &op.quota {
        // The kernel's `nft_quota`: the length is added first; over once
        // the used bytes exceed the quota.
        e.quota_used = e.quota_used.saturating_add(u64::from(len));
        if (e.quota_used > q.bytes()) != q.over {
            return None;
        }
    }
    Some(e.creator)
}

/// The key of operation `op` for packet `p`.
pub(crate) fn key_of(op: &SetOpSpec, p: &PacketFields) -> SetKey {
    let mut k: SetKey = [0; MAX_SET_KEY];
    for (slot, src) in k.iter_mut().zip(&op.key) {
        *slot = match src {
            KeySrc::Field(f) => p.get(*f),
            KeySrc::Const(v) => *v,
        };
    }
    k
}

/// Runs operation `id` (of the policy's operations `ops`) on `set`, whose
/// elements' connection counts are in `counts`; whether the rule goes on.
#[allow(clippy::too_many_arguments)]
pub(crate) fn run(
    set: &DynSet,
    counts: &ConnCounts,
    id: u32,
    ops: &[(SetOpSpec, Option<Rate>)],
    p: &PacketFields,
    now_ms: u64,
    len: u32,
) -> bool {
    let Some((op, _)) = ops.get(id as usize) else {
        return true;
    };
    let k = key_of(op, p);
    let creator = match op.kind {
        SetOpKind::Lookup { negate } => return set.contains(&k, now_ms) != negate,
        SetOpKind::Add => set.upsert(&k, false, id, ops, now_ms, len),
        SetOpKind::Update => set.upsert(&k, true, id, ops, now_ms, len),
        SetOpKind::Delete => {
            set.delete(&k);
            counts.forget(op.set, &k);
            return true;
        }
    };
    let Some((creator, created)) = creator else {
        return false;
    };
    // The element's expressions run in order: its count after its limit.
    match ops.get(creator as usize).and_then(|(o, _)| o.ct_count) {
        Some(c) => {
            // An element created now starts with no connections, even if
            // an expired one with the same key had some.
            if created {
                counts.forget(op.set, &k);
            }
            // nft's count adds only a connection met with its first packet
            // (`nft_connlimit` skips confirmed ones); iptables' adds any
            // (`xt_connlimit`).
            let exists = p.ct_state != sluice_classify::ir::ct::NEW;
            let n = counts.count(op.set, &k, &p.conn, now_ms, exists, c.existing);
            (n > c.count as usize) == c.over
        }
        None => true,
    }
}
