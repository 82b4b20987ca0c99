//! Token buckets for `limit rate [over] N[/unit] [burst M]` statements.
//!
//! nft's `limit` is a match (the kernel's `nft_limit`): a packet takes its
//! cost from the bucket and the rule matches while there was enough; with
//! `over` the rule matches only when there was not. The bucket starts full
//! and refills continuously at the rate. Its size is the kernel's
//! `tokens_max` (`nft_limit_init`, Linux 6.x): for a packet rate the burst
//! alone, where a burst of 0 or none is 5 packets (so `limit rate
//! 2/second` passes 5 packets at once, then 2 a second); for a byte rate
//! one time unit's rate plus the burst (default 0). A packet costs 1 for a
//! packet rate and its length for a byte rate. The kernel oracle's
//! `dynamic_sets` rule set checks the packet case against the kernel.
//!
//! Buckets are shared by every worker (atomics, no lock; under contention a
//! refill may be counted twice or a take retried, so the rate holds only
//! approximately, like the kernel's per-rule spinlock-free variant) and by
//! the generations derived from a policy, so an incremental update does not
//! refill them. Time comes with the packet ([`sluice_engine::PolicyPacket`]
//! `now_ms`, the worker's batch clock); nothing here reads a clock.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use sluice_classify::ir::PacketFields;
use sluice_ruleset::ast;

use crate::lower::{DynSetSpec, SetOpSpec};

/// Bucket units per packet or byte: nano-units keep slow rates (one per
/// week) exact enough per millisecond of refill.
const SCALE: u64 = 1_000_000_000;

/// A `limit`'s rate, burst and sense: the bucket's constants.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Rate {
    /// Refill per unit time, in nano-units (the rate x `SCALE`).
    per_unit: u128,
    /// The time unit, ms.
    unit_ms: u128,
    /// Capacity, in nano-units.
    cap: u64,
    bytes: bool,
    over: bool,
}

impl Rate {
    pub(crate) fn new(l: &ast::Limit) -> Self {
        let mult = |u: Option<ast::ByteUnit>| -> u64 {
            match u {
                None | Some(ast::ByteUnit::Bytes) => 1,
                Some(ast::ByteUnit::Kbytes) => 1024,
                Some(ast::ByteUnit::Mbytes) => 1024 * 1024,
            }
        };
        let bytes = l.unit.is_some();
        let rate = l.rate.saturating_mul(mult(l.unit));
        let unit_ms = l.per.seconds().saturating_mul(1000).max(1);
        let cap = if bytes {
            let burst = l.burst.map_or(0, |b| b.saturating_mul(mult(l.burst_unit)));
            rate.saturating_add(burst)
        } else {
            // NFT_LIMIT_PKT_BURST_DEFAULT, also for an explicit 0.
            l.burst.filter(|b| *b > 0).unwrap_or(5)
        };
        Rate {
            per_unit: u128::from(rate) * u128::from(SCALE),
            unit_ms: u128::from(unit_ms),
            cap: cap.saturating_mul(SCALE),
            bytes,
            over: l.over,
        }
    }

    /// Refill for `ms` milliseconds, rounded up so that refills in pieces
    /// add up to the rate.
    fn refill(&self, ms: u64) -> u64 {
        let add = (u128::from(ms) * self.per_unit).div_ceil(self.unit_ms);
        u64::try_from(add).unwrap_or(u64::MAX)
    }

    fn cost(&self, len: u32) -> u64 {
        if self.bytes { u64::from(len) } else { 1 }.saturating_mul(SCALE)
    }

    /// The limit on a bucket held by its owner (a dynamic set's element,
    /// under the set's lock): `tokens` `u64::MAX` is a full bucket,
    /// `last_ms` `u64::MAX` one that has seen no packet yet.
    pub(crate) fn take(&self, tokens: &mut u64, last_ms: &mut u64, now_ms: u64, len: u32) -> bool {
        if *tokens == u64::MAX {
            *tokens = self.cap;
        }
        if *last_ms == u64::MAX {
            *last_ms = now_ms;
        } else if now_ms > *last_ms {
            *tokens = tokens
                .saturating_add(self.refill(now_ms - *last_ms))
                .min(self.cap);
            *last_ms = now_ms;
        }
        let cost = self.cost(len);
        let took = *tokens >= cost;
        if took {
            *tokens -= cost;
        }
        took != self.over
    }
}

#[derive(Debug)]
pub(crate) struct Bucket {
    rate: Rate,
    tokens: AtomicU64,
    /// Last refill, ms; `u64::MAX` before the first packet.
    last_ms: AtomicU64,
}

impl Bucket {
    fn new(l: &ast::Limit) -> Self {
        let rate = Rate::new(l);
        Bucket {
            rate,
            tokens: AtomicU64::new(rate.cap),
            last_ms: AtomicU64::new(u64::MAX),
        }
    }

    fn matches(&self, now_ms: u64, len: u32) -> bool {
        // Refill by the time since the last refill (whoever moves
        // `last_ms` forward adds that interval).
        let last = self.last_ms.load(Ordering::Relaxed);
        if last == u64::MAX {
            let _ = self.last_ms.compare_exchange(
                u64::MAX,
                now_ms,
                Ordering::Relaxed,
                Ordering::Relaxed,
            );
        } else if now_ms > last
            && self
                .last_ms
                .compare_exchange(last, now_ms, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            let add = self.rate.refill(now_ms - last);
            let _ = self
                .tokens
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |t| {
                    Some(t.saturating_add(add).min(self.rate.cap))
                });
        }
        let cost = self.rate.cost(len);
        let took = self
            .tokens
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |t| {
                t.checked_sub(cost)
            })
            .is_ok();
        took != self.rate.over
    }
}

/// The buckets of a policy's `limit` statements, by limit id (the index in
/// the policy's limit table); shared with the generations derived from it.
///
/// It also holds the live elements of the policy's dynamic sets and the
/// operations on them ([`crate::dynset`]), which generations share the
/// same way.
#[derive(Debug, Clone, Default)]
pub struct Limiters {
    buckets: Vec<Arc<Bucket>>,
    sets: Vec<Arc<crate::dynset::DynSet>>,
    /// By [`sluice_classify::ir::Stmt::SetOp`] id, with the element limit's
    /// rate.
    ops: Arc<[(SetOpSpec, Option<Rate>)]>,
    /// `quota` statements: (quota bytes, over, bytes used).
    quotas: Vec<Arc<QuotaState>>,
    /// The connection counts of dynamic-set elements (`ct count`).
    counts: Arc<crate::conncount::ConnCounts>,
    /// `numgen` generators, by id.
    numgens: Vec<Arc<Numgen>>,
    /// A rule's own `ct count`, by id (their counts are in `counts`).
    ct_counts: Arc<Vec<ast::CtCount>>,
    /// Named objects, by id.
    objects: Vec<Arc<ObjLive>>,
    /// The state of `numgen random` (xorshift64*, shared by every
    /// generator and worker).
    rng: Arc<AtomicU64>,
}

/// Seed of `numgen random`: fixed, so runs and traces repeat (the numbers
/// balance load; they are not secrets).
const NUMGEN_SEED: u64 = 0x9e37_79b9_7f4a_7c15;

/// One `numgen` match and, for `inc`, its counter.
#[derive(Debug)]
struct Numgen {
    spec: crate::lower::NumgenSpec,
    /// The last number drawn, before the offset (`inc`); starts at
    /// `modulus - 1`, so the first is 0, as the kernel's `nft_ng_inc_init`
    /// sets it.
    last: AtomicU32,
}

impl Numgen {
    fn new(spec: &crate::lower::NumgenSpec) -> Self {
        Numgen {
            spec: spec.clone(),
            last: AtomicU32::new(spec.modulus.saturating_sub(1)),
        }
    }

    /// The next number, offset added: `inc` as the kernel's
    /// `nft_ng_inc_gen` (a shared counter moved by compare-and-swap),
    /// `random` as `nft_ng_random_gen` (a 32-bit random number scaled to
    /// `0..modulus`).
    fn next(&self, rng: &AtomicU64) -> u32 {
        let m = self.spec.modulus.max(1);
        let v = if self.spec.random {
            let mut x = 0;
            let _ = rng.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |s| {
                // A fresh state (0) starts from the seed.
                let mut s = if s == 0 { NUMGEN_SEED } else { s };
                s ^= s >> 12;
                s ^= s << 25;
                s ^= s >> 27;
                x = s;
                Some(s)
            });
            let r = (x.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 32) as u32;
            ((u64::from(r) * u64::from(m)) >> 32) as u32
        } else {
            let mut n = 0;
            let _ = self
                .last
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |o| {
                    n = if o.saturating_add(1) < m { o + 1 } else { 0 };
                    Some(n)
                });
            n
        };
        v.wrapping_add(self.spec.offset)
    }
}

/// The live state of a named object.
#[derive(Debug)]
pub(crate) enum ObjLive {
    /// A named counter: packets and bytes.
    Counter(AtomicU64, AtomicU64),
    /// A named quota.
    Quota(QuotaState),
    /// A named limit: a token bucket every rule naming it shares.
    Limit(Bucket),
}

impl ObjLive {
    fn new(spec: &crate::lower::ObjSpec) -> Self {
        match spec.state {
            ast::ObjState::Counter { packets, bytes } => {
                ObjLive::Counter(AtomicU64::new(packets), AtomicU64::new(bytes))
            }
            ast::ObjState::Quota(q) => ObjLive::Quota(QuotaState {
                quota: q.bytes(),
                over: q.over,
                used: AtomicU64::new(q.used_bytes()),
            }),
            ast::ObjState::Limit(l) => ObjLive::Limit(Bucket::new(&l)),
        }
    }

    fn copy(&self) -> Self {
        match self {
            ObjLive::Counter(p, b) => ObjLive::Counter(
                AtomicU64::new(p.load(Ordering::Relaxed)),
                AtomicU64::new(b.load(Ordering::Relaxed)),
            ),
            ObjLive::Quota(q) => ObjLive::Quota(QuotaState {
                quota: q.quota,
                over: q.over,
                used: AtomicU64::new(q.used.load(Ordering::Relaxed)),
            }),
            ObjLive::Limit(b) => ObjLive::Limit(Bucket {
                rate: b.rate,
                tokens: AtomicU64::new(b.tokens.load(Ordering::Relaxed)),
                last_ms: AtomicU64::new(b.last_ms.load(Ordering::Relaxed)),
            }),
        }
    }

    /// Packets and bytes (a counter), bytes used (a quota: packets 0), or
    /// the tokens left in a limit's bucket (as packets).
    pub(crate) fn values(&self) -> (u64, u64) {
        match self {
            ObjLive::Counter(p, b) => (p.load(Ordering::Relaxed), b.load(Ordering::Relaxed)),
            ObjLive::Quota(q) => (0, q.used.load(Ordering::Relaxed)),
            ObjLive::Limit(b) => (b.tokens.load(Ordering::Relaxed), 0),
        }
    }

    /// Back to zero (`nft reset counter` / `reset quota`).
    pub(crate) fn reset(&self) {
        match self {
            ObjLive::Counter(p, b) => {
                p.store(0, Ordering::Relaxed);
                b.store(0, Ordering::Relaxed);
            }
            ObjLive::Quota(q) => q.used.store(0, Ordering::Relaxed),
            // A full bucket, as at load.
            ObjLive::Limit(b) => {
                b.tokens.store(b.rate.cap, Ordering::Relaxed);
                b.last_ms.store(u64::MAX, Ordering::Relaxed);
            }
        }
    }
}

/// One `quota`'s bytes and the bytes its rule has seen.
#[derive(Debug)]
pub(crate) struct QuotaState {
    quota: u64,
    over: bool,
    used: AtomicU64,
}

impl QuotaState {
    /// The kernel's `nft_quota` (Linux 6.15 and later): the packet's
    /// length is added first, and the quota is exceeded once the used bytes
    /// are more than the quota (a packet that uses up exactly the rest is
    /// still within it).
    fn matches(&self, len: u32) -> bool {
        let used = self
            .used
            .fetch_add(u64::from(len), Ordering::Relaxed)
            .saturating_add(u64::from(len));
        (used > self.quota) == self.over
    }
}

impl Limiters {
    /// Buckets for `specs` (ids `0..specs.len()`): the ones this set
    /// already has are kept, new ones start full.
    pub fn extend_to(&mut self, specs: &[ast::Limit]) {
        for l in specs.iter().skip(self.buckets.len()) {
            self.buckets.push(Arc::new(Bucket::new(l)));
        }
    }

    /// State for the dynamic sets `sets` and the operations `ops` (both
    /// indexed by id): the sets this one has keep their elements, new ones
    /// start with their declared elements.
    pub(crate) fn extend_sets(&mut self, sets: &[DynSetSpec], ops: &[SetOpSpec]) {
        for s in sets.iter().skip(self.sets.len()) {
            self.sets.push(Arc::new(crate::dynset::DynSet::new(s)));
        }
        if ops.len() > self.ops.len() {
            self.ops = ops
                .iter()
                .map(|o| (o.clone(), o.limit.as_ref().map(Rate::new)))
                .collect();
        }
    }

    /// A copy whose dynamic sets are copies of this one's (the buckets
    /// are shared).
    pub(crate) fn snapshot(&self) -> Self {
        Limiters {
            buckets: self.buckets.clone(),
            sets: self.sets.iter().map(|s| Arc::new(s.snapshot())).collect(),
            ops: Arc::clone(&self.ops),
            counts: Arc::new(self.counts.snapshot()),
            ct_counts: Arc::clone(&self.ct_counts),
            numgens: self
                .numgens
                .iter()
                .map(|g| {
                    Arc::new(Numgen {
                        spec: g.spec.clone(),
                        last: AtomicU32::new(g.last.load(Ordering::Relaxed)),
                    })
                })
                .collect(),
            rng: Arc::new(AtomicU64::new(self.rng.load(Ordering::Relaxed))),
            objects: self.objects.iter().map(|o| Arc::new(o.copy())).collect(),
            quotas: self
                .quotas
                .iter()
                .map(|q| {
                    Arc::new(QuotaState {
                        quota: q.quota,
                        over: q.over,
                        used: AtomicU64::new(q.used.load(Ordering::Relaxed)),
                    })
                })
                .collect(),
        }
    }

    /// State for the `quota` statements `specs` (ids `0..specs.len()`):
    /// the ones this set has keep their used bytes.
    pub(crate) fn extend_quotas(&mut self, specs: &[ast::Quota]) {
        for q in specs.iter().skip(self.quotas.len()) {
            self.quotas.push(Arc::new(QuotaState {
                quota: q.bytes(),
                over: q.over,
                used: AtomicU64::new(q.used_bytes()),
            }));
        }
    }

    /// State for the `numgen` matches `specs` (ids `0..specs.len()`): the
    /// ones this set has keep their counters.
    pub(crate) fn extend_numgens(&mut self, specs: &[crate::lower::NumgenSpec]) {
        for g in specs.iter().skip(self.numgens.len()) {
            self.numgens.push(Arc::new(Numgen::new(g)));
        }
    }

    /// `numgen` matches known.
    pub(crate) fn numgens(&self) -> usize {
        self.numgens.len()
    }

    /// A rule's own `ct count` statements `specs` (ids `0..specs.len()`);
    /// the counts are kept by id.
    pub(crate) fn extend_ct_counts(&mut self, specs: &[ast::CtCount]) {
        if specs.len() > self.ct_counts.len() {
            self.ct_counts = Arc::new(specs.to_vec());
        }
    }

    /// State for the named objects `specs` (ids `0..specs.len()`): the
    /// ones this set has keep their values.
    pub(crate) fn extend_objects(&mut self, specs: &[crate::lower::ObjSpec]) {
        for o in specs.iter().skip(self.objects.len()) {
            self.objects.push(Arc::new(ObjLive::new(o)));
        }
    }

    /// Named objects known.
    pub(crate) fn objects(&self) -> usize {
        self.objects.len()
    }

    /// Named object `id`.
    pub(crate) fn object(&self, id: usize) -> Option<&ObjLive> {
        self.objects.get(id).map(|o| &**o)
    }

    /// A rule's own `ct count` statements known.
    pub(crate) fn ct_counts(&self) -> usize {
        self.ct_counts.len()
    }

    /// `quota` statements known.
    pub(crate) fn quotas(&self) -> usize {
        self.quotas.len()
    }

    /// Dynamic-set operations known.
    pub(crate) fn set_ops(&self) -> usize {
        self.ops.len()
    }

    /// Starts the timers of every dynamic set's declared elements at
    /// `now_ms` ([`crate::dynset::DynSet::start`]).
    pub(crate) fn start_timers(&self, now_ms: u64) {
        for s in &self.sets {
            s.start(now_ms);
        }
    }

    /// Dynamic set `i`.
    pub(crate) fn set(&self, i: usize) -> Option<&crate::dynset::DynSet> {
        self.sets.get(i).map(|s| &**s)
    }

    /// The live elements of dynamic set `i` (see
    /// [`crate::dynset::DynSet::elements`]).
    pub(crate) fn set_elements(
        &self,
        i: usize,
        key_len: usize,
        now_ms: u64,
    ) -> Option<Vec<crate::dynset::ListedElem>> {
        let set = self.sets.get(i)?;
        Some(set.elements(key_len, now_ms, i as u32, &self.ops, &self.counts))
    }

    /// The connection counts of dynamic-set elements.
    pub(crate) fn conn_counts(&self) -> &crate::conncount::ConnCounts {
        &self.counts
    }

    /// Whether some rule or dynamic-set operation counts connections.
    pub(crate) fn counts_connections(&self) -> bool {
        !self.ct_counts.is_empty() || self.ops.iter().any(|(o, _)| o.ct_count.is_some())
    }

    /// Whether there are any (buckets, dynamic-set operations, quotas,
    /// number generators).
    pub fn is_empty(&self) -> bool {
        self.buckets.is_empty()
            && self.ops.is_empty()
            && self.quotas.is_empty()
            && self.numgens.is_empty()
            && self.ct_counts.is_empty()
            && self.objects.is_empty()
    }

    /// How many.
    pub fn len(&self) -> usize {
        self.buckets.len()
    }
}

impl sluice_classify::Limits for Limiters {
    fn matches(&self, id: u32, now_ms: u64, len: u32) -> bool {
        self.buckets
            .get(id as usize)
            .is_none_or(|b| b.matches(now_ms, len))
    }

    fn set_op(&self, id: u32, p: &PacketFields, now_ms: u64, len: u32, stateless: bool) -> bool {
        let Some((op, _)) = self.ops.get(id as usize) else {
            return stateless;
        };
        match self.sets.get(op.set as usize) {
            Some(set) => crate::dynset::run(set, &self.counts, id, &self.ops, p, now_ms, len),
            None => stateless,
        }
    }

    fn quota(&self, id: u32, len: u32, stateless: bool) -> bool {
        self.quotas
            .get(id as usize)
            .map_or(stateless, |q| q.matches(len))
    }

    fn object(&self, id: u32, now_ms: u64, len: u32, stateless: bool) -> bool {
        match self.objects.get(id as usize).map(|o| &**o) {
            Some(ObjLive::Limit(b)) => b.matches(now_ms, len),
            Some(ObjLive::Counter(p, b)) => {
                p.fetch_add(1, Ordering::Relaxed);
                b.fetch_add(u64::from(len), Ordering::Relaxed);
                true
            }
            Some(ObjLive::Quota(q)) => q.matches(len),
            None => stateless,
        }
    }

    fn numgen(&self, id: u32, stateless: bool) -> bool {
        self.numgens
            .get(id as usize)
            .map_or(stateless, |g| g.spec.matches(g.next(&self.rng)))
    }

    fn ct_count(&self, id: u32, p: &PacketFields, now_ms: u64, stateless: bool) -> bool {
        let Some(c) = self.ct_counts.get(id as usize) else {
            return stateless;
        };
        // One list per statement, beside the elements' lists (no dynamic
        // set has this index).
        let mut key = [0; crate::lower::MAX_SET_KEY];
        key[0] = u128::from(id);
        let exists = p.ct_state != sluice_classify::ir::ct::NEW;
        let n = self
            .counts
            .count(RULE_COUNTS, &key, &p.conn, now_ms, exists, false);
        (n > c.count as usize) == c.over
    }
}

/// The dynamic-set index under which [`crate::conncount::ConnCounts`]
/// keeps a rule's own `ct count` lists (keyed by the statement's id).
const RULE_COUNTS: u32 = u32::MAX;

/// The state a trace keeps from packet to packet: the dynamic sets; every
/// plain `limit` is within its rate, as in a stateless trace.
#[derive(Debug)]
pub(crate) struct SetsOnly(pub Limiters);

impl sluice_classify::Limits for SetsOnly {
    fn matches(&self, _id: u32, _now_ms: u64, _len: u32) -> bool {
        true
    }

    fn set_op(&self, id: u32, p: &PacketFields, now_ms: u64, len: u32, stateless: bool) -> bool {
        self.0.set_op(id, p, now_ms, len, stateless)
    }

    fn quota(&self, id: u32, len: u32, stateless: bool) -> bool {
        sluice_classify::Limits::quota(&self.0, id, len, stateless)
    }

    fn numgen(&self, id: u32, stateless: bool) -> bool {
        sluice_classify::Limits::numgen(&self.0, id, stateless)
    }

    fn object(&self, id: u32, now_ms: u64, len: u32, stateless: bool) -> bool {
        // A trace's limits stay within their rate, named ones too.
        match self.0.objects.get(id as usize).map(|o| &**o) {
            Some(ObjLive::Limit(_)) => true,
            _ => sluice_classify::Limits::object(&self.0, id, now_ms, len, stateless),
        }
    }

    fn ct_count(&self, id: u32, p: &PacketFields, now_ms: u64, stateless: bool) -> bool {
        sluice_classify::Limits::ct_count(&self.0, id, p, now_ms, stateless)
    }
}

/// `log` lines a policy writes per second at most (burst the same).
pub const LOG_PER_SEC: u64 = 100;

/// The rate budget of a policy's `log` lines: [`LOG_PER_SEC`] a second,
/// shared by the workers; the lines over it are counted, not written.
#[derive(Debug)]
pub struct LogBudget {
    bucket: Bucket,
    /// Lines not written for the budget.
    pub suppressed: AtomicU64,
}

impl Default for LogBudget {
    fn default() -> Self {
        LogBudget {
            bucket: Bucket::new(&ast::Limit {
                over: false,
                rate: LOG_PER_SEC,
                unit: None,
                per: ast::TimeUnit::Second,
                burst: Some(LOG_PER_SEC),
                burst_unit: None,
            }),
            suppressed: AtomicU64::new(0),
        }
    }
}

impl sluice_classify::Limits for LogBudget {
    fn matches(&self, _id: u32, now_ms: u64, len: u32) -> bool {
        self.bucket.matches(now_ms, len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_classify::Limits;

    fn limit(rate: u64, per: ast::TimeUnit, burst: Option<u64>, over: bool) -> ast::Limit {
        ast::Limit {
            over,
            rate,
            unit: None,
            per,
            burst,
            burst_unit: None,
        }
    }

    #[test]
    fn a_packet_rate_allows_the_burst_then_refills_at_the_rate() {
        let mut l = Limiters::default();
        l.extend_to(&[
            limit(2, ast::TimeUnit::Second, Some(3), false),
            limit(2, ast::TimeUnit::Second, Some(2), true),
            limit(1, ast::TimeUnit::Minute, None, false),
            limit(1, ast::TimeUnit::Minute, Some(0), false),
        ]);
        // A bucket of the burst (3): three at once, then none.
        let at = |ms| (0..5).map(|_| l.matches(0, ms, 60)).collect::<Vec<_>>();
        assert_eq!(at(1000), [true, true, true, false, false]);
        // 500 ms later one more token (2/second).
        assert_eq!(at(1500), [true, false, false, false, false]);
        // `over`: matches once the burst of two is spent.
        let over = (0..4).map(|_| l.matches(1, 1000, 60)).collect::<Vec<_>>();
        assert_eq!(over, [false, false, true, true]);
        // 1/minute with the default burst of 5 (also for `burst 0`): five,
        // then one a minute.
        for id in [2, 3] {
            let m = (0..8).map(|_| l.matches(id, 0, 60)).filter(|x| *x).count();
            assert_eq!(m, 5);
            assert!(!l.matches(id, 59_000, 60));
            assert!(l.matches(id, 60_000, 60));
        }
        // An unknown id matches (as without limits).
        assert!(l.matches(9, 0, 60));
    }

    #[test]
    fn an_owned_bucket_behaves_as_a_shared_one() {
        let r = Rate::new(&limit(2, ast::TimeUnit::Second, Some(3), false));
        let (mut tokens, mut last) = (u64::MAX, u64::MAX);
        let mut at = |ms| {
            (0..5)
                .map(|_| r.take(&mut tokens, &mut last, ms, 60))
                .collect::<Vec<_>>()
        };
        assert_eq!(at(1000), [true, true, true, false, false]);
        assert_eq!(at(1500), [true, false, false, false, false]);
        assert_eq!(
            at(60_000),
            [true, true, true, false, false],
            "capped at the burst"
        );
    }

    #[test]
    fn a_byte_rate_charges_the_length_and_generations_share_buckets() {
        let mut l = Limiters::default();
        l.extend_to(&[ast::Limit {
            over: false,
            rate: 1,
            unit: Some(ast::ByteUnit::Kbytes),
            per: ast::TimeUnit::Second,
            burst: None,
            burst_unit: None,
        }]);
        let mut next = l.clone();
        next.extend_to(&[
            limit(1, ast::TimeUnit::Second, None, false),
            limit(1, ast::TimeUnit::Second, None, false),
        ]);
        assert!(l.matches(0, 0, 1000));
        assert!(
            !next.matches(0, 0, 100),
            "1000 of 1024 bytes spent on the old one"
        );
        assert!(next.matches(0, 0, 24));
        assert!(next.matches(1, 0, 1));
    }
}
