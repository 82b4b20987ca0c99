//! Token buckets for `limit rate [over] N[/unit] [burst M]` statements.
//!
//! nft's `limit` is a match (the kernel's `nft_limit`): a packet takes its
//! cost from the bucket and the rule matches while there was enough; with
//! `over` the rule matches only when there was not. The bucket holds one
//! time unit's rate plus the burst (the kernel's `tokens_max`), starts
//! full, and refills continuously. A packet costs 1 for a packet rate and
//! its length for a byte rate. The burst defaults to 5 packets for packet
//! rates (what nft lists) and 0 for byte rates.
//!
//! Buckets are shared by every worker (atomics, no lock; under contention a
//! refill may be counted twice or a take retried, so the rate holds only
//! approximately, like the kernel's per-rule spinlock-free variant) and by
//! the generations derived from a policy, so an incremental update does not
//! refill them. Time comes with the packet ([`sluice_engine::PolicyPacket`]
//! `now_ms`, the worker's batch clock); nothing here reads a clock.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use sluice_ruleset::ast;

/// Bucket units per packet or byte: nano-units keep slow rates (one per
/// week) exact enough per millisecond of refill.
const SCALE: u64 = 1_000_000_000;

#[derive(Debug)]
struct Bucket {
    /// Refill per unit time, in nano-units (the rate x `SCALE`).
    per_unit: u128,
    /// The time unit, ms.
    unit_ms: u128,
    /// Capacity, in nano-units.
    cap: u64,
    bytes: bool,
    over: bool,
    tokens: AtomicU64,
    /// Last refill, ms; `u64::MAX` before the first packet.
    last_ms: AtomicU64,
}

impl Bucket {
    fn new(l: &ast::Limit) -> Self {
        let mult = |u: Option<ast::ByteUnit>| -> u64 {
            match u {
                None | Some(ast::ByteUnit::Bytes) => 1,
                Some(ast::ByteUnit::Kbytes) => 1024,
                Some(ast::ByteUnit::Mbytes) => 1024 * 1024,
            }
        };
        let bytes = l.unit.is_some();
        let rate = l.rate.saturating_mul(mult(l.unit));
        let burst = l.burst.map_or(if bytes { 0 } else { 5 }, |b| {
            b.saturating_mul(mult(l.burst_unit))
        });
        let unit_ms = l.per.seconds().saturating_mul(1000).max(1);
        let cap = rate.saturating_add(burst).saturating_mul(SCALE);
        Bucket {
            per_unit: u128::from(rate) * u128::from(SCALE),
            unit_ms: u128::from(unit_ms),
            cap,
            bytes,
            over: l.over,
            tokens: AtomicU64::new(cap),
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
            // Rounded up, so that refills in pieces add up to the rate.
            let add = (u128::from(now_ms - last) * self.per_unit).div_ceil(self.unit_ms);
            let add = u64::try_from(add).unwrap_or(u64::MAX);
            let _ = self
                .tokens
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |t| {
                    Some(t.saturating_add(add).min(self.cap))
                });
        }
        let cost = if self.bytes { u64::from(len) } else { 1 }.saturating_mul(SCALE);
        let took = self
            .tokens
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |t| {
                t.checked_sub(cost)
            })
            .is_ok();
        took != self.over
    }
}

/// The buckets of a policy's `limit` statements, by limit id (the index in
/// the policy's limit table); shared with the generations derived from it.
#[derive(Debug, Clone, Default)]
pub struct Limiters {
    buckets: Vec<Arc<Bucket>>,
}

impl Limiters {
    /// Buckets for `specs` (ids `0..specs.len()`): the ones this set
    /// already has are kept, new ones start full.
    pub fn extend_to(&mut self, specs: &[ast::Limit]) {
        for l in specs.iter().skip(self.buckets.len()) {
            self.buckets.push(Arc::new(Bucket::new(l)));
        }
    }

    /// Whether there are any.
    pub fn is_empty(&self) -> bool {
        self.buckets.is_empty()
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
                burst: Some(0),
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
    fn a_packet_rate_allows_rate_plus_burst_then_refills() {
        let mut l = Limiters::default();
        l.extend_to(&[
            limit(2, ast::TimeUnit::Second, Some(1), false),
            limit(2, ast::TimeUnit::Second, Some(0), true),
            limit(1, ast::TimeUnit::Minute, None, false),
        ]);
        // 2/second + 1: three at once, then none.
        let at = |ms| (0..5).map(|_| l.matches(0, ms, 60)).collect::<Vec<_>>();
        assert_eq!(at(1000), [true, true, true, false, false]);
        // 500 ms later one more token.
        assert_eq!(at(1500), [true, false, false, false, false]);
        // `over`: matches once the two are spent.
        let over = (0..4).map(|_| l.matches(1, 1000, 60)).collect::<Vec<_>>();
        assert_eq!(over, [false, false, true, true]);
        // 1/minute with the default burst of 5: six, then one a minute.
        let m = (0..8).map(|_| l.matches(2, 0, 60)).filter(|x| *x).count();
        assert_eq!(m, 6);
        assert!(!l.matches(2, 59_000, 60));
        assert!(l.matches(2, 60_000, 60));
        // An unknown id matches (as without limits).
        assert!(l.matches(9, 0, 60));
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
