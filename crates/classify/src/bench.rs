//! Benchmark bodies for `sluice bench rules` and `sluice bench update`.
//!
//! The crate never reads a clock: every function takes `clock`, a monotonic
//! nanosecond counter owned by the caller (e.g. `Instant` in the binary).
//! Rule sets and packets come from [`crate::gen`], so a result is
//! reproducible from its arguments.

use std::sync::Arc;

use crate::gen;
use crate::ir::{ChainId, PacketFields, Program, RuleId};
use crate::{bench_lookup, Classifier, Evaluate, Placement, Scratch};

/// Which generated rule set to measure.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Shape {
    /// Seed 001: `count` single-port drop rules ahead of the matching rule
    /// ([`gen::seed001_shape`]).
    Seed001,
    /// ClassBench-style 5-tuple ACL ([`gen::classbench`]) with trace-style
    /// headers ([`gen::classbench_packets`]).
    ClassBench,
    /// A block list as rules: `count` rules `ip saddr A drop` of
    /// consecutive addresses ([`gen::host_list`]).
    Hosts,
    /// The same in IPv6, every address in one /64 ([`gen::host_list6`]).
    Hosts6,
}

impl Shape {
    /// Name as shown in reports.
    pub const fn name(self) -> &'static str {
        match self {
            Shape::Seed001 => "seed001",
            Shape::ClassBench => "classbench",
            Shape::Hosts => "hosts",
            Shape::Hosts6 => "hosts6",
        }
    }

    /// The rule set of `count` rules and `packets` headers for it.
    pub fn build(self, count: usize, packets: usize) -> (Program, Vec<PacketFields>) {
        match self {
            Shape::Seed001 => (gen::seed001_shape(count), gen::seed001_packets(packets, 1)),
            Shape::ClassBench => {
                let p = gen::classbench(count, 7);
                let k = gen::classbench_packets(&p, packets, 8);
                (p, k)
            }
            Shape::Hosts => (
                gen::host_list(count),
                gen::host_list_packets(count, packets, 9),
            ),
            Shape::Hosts6 => (
                gen::host_list6(count),
                gen::host_list6_packets(count, packets, 9),
            ),
        }
    }
}

/// Result of [`measure_rules`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RuleTimes {
    /// Rules in the base chain.
    pub rules: usize,
    /// Tuples (hash tables) of the compiled base chain.
    pub tuples: usize,
    /// Compiled classifier, one packet at a time ([`Classifier::eval`]), ns
    /// per packet.
    pub compiled_ns: f64,
    /// Compiled classifier, [`Classifier::eval_batch`] over groups of
    /// [`crate::BATCH`] (32) packets, ns per packet.
    pub batch_ns: f64,
    /// Linear evaluator, ns per packet.
    pub linear_ns: f64,
    /// Evaluations the linear figure is based on (fewer than
    /// `packets * rounds` when the linear walk is slow).
    pub linear_evals: usize,
}

/// How [`measure_lookup`] calls the compiled classifier.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// [`Classifier::eval`], one packet at a time.
    Single,
    /// [`Classifier::eval_batch`] over all the packets (groups of
    /// [`crate::BATCH`]).
    Batch,
}

fn time_batch(
    c: &Classifier,
    pkts: &[PacketFields],
    rounds: usize,
    clock: &mut dyn FnMut() -> u64,
) -> f64 {
    let mut s = Scratch::new();
    let t0 = clock();
    let mut sum = 0u64;
    for _ in 0..rounds {
        c.eval_batch(ChainId(0), pkts, &mut s, |_, o, _| {
            sum = sum
                .wrapping_mul(31)
                .wrapping_add(o.rule.map_or(u64::MAX, |r| r.0));
        });
    }
    let ns = clock().saturating_sub(t0);
    std::hint::black_box(sum);
    ns as f64 / (pkts.len() * rounds).max(1) as f64
}

/// The compiled classifier alone for `shape` at `count` rules: ns per
/// packet over `packets` headers classified `rounds` times (after one
/// warm-up round), in `mode`; the least of [`REPS`] such runs.
pub fn measure_lookup(
    shape: Shape,
    count: usize,
    packets: usize,
    rounds: usize,
    mode: Mode,
    clock: &mut dyn FnMut() -> u64,
) -> f64 {
    let (prog, pkts) = shape.build(count, packets.max(1));
    let c = Classifier::compile(&prog).unwrap_or_default();
    match mode {
        Mode::Single => {
            let _ = time(&c, &pkts, 1, clock);
            least(|| time(&c, &pkts, rounds.max(1), clock))
        }
        Mode::Batch => {
            let _ = time_batch(&c, &pkts, 1, clock);
            least(|| time_batch(&c, &pkts, rounds.max(1), clock))
        }
    }
}

/// Timed repetitions of a compiled measurement; the least is reported.
/// One repetition of the CLI's 8 rounds over 4096 headers lasts 3–10 ms, so
/// a single preemption or a burst from another tenant of a shared host can
/// inflate it by tens of percent (and with it a ratio to another size);
/// the least of several is the cost of the lookups themselves. Every
/// repetition classifies the same headers with caches as warm as after
/// the warm-up round, so no repetition is favoured over another.
pub const REPS: usize = 5;

/// The least ns per packet of [`REPS`] timed runs of `f`.
fn least(mut f: impl FnMut() -> f64) -> f64 {
    (0..REPS).map(|_| f()).fold(f64::INFINITY, f64::min)
}

/// Time budget of the linear measurement.
const LINEAR_BUDGET_NS: u64 = 400_000_000;

fn time<E: Evaluate + ?Sized>(
    e: &E,
    pkts: &[PacketFields],
    rounds: usize,
    clock: &mut dyn FnMut() -> u64,
) -> f64 {
    let mut s = Scratch::new();
    let t0 = clock();
    let sum = bench_lookup(e, ChainId(0), pkts, rounds, &mut s);
    let ns = clock().saturating_sub(t0);
    std::hint::black_box(sum);
    ns as f64 / (pkts.len() * rounds).max(1) as f64
}

/// Classification cost for `shape` at `count` rules: `packets` headers,
/// classified `rounds` times by the compiled classifier (after one warm-up
/// round; the least of [`REPS`] such runs, for each of the single and the
/// batch form) and by the linear evaluator. The linear walk is sampled: at most
/// about 0.4 s of it, on a prefix of the packets when it is slow.
pub fn measure_rules(
    shape: Shape,
    count: usize,
    packets: usize,
    rounds: usize,
    clock: &mut dyn FnMut() -> u64,
) -> RuleTimes {
    let (prog, pkts) = shape.build(count, packets.max(1));
    let rounds = rounds.max(1);
    // Generated programs always compile.
    let c = Classifier::compile(&prog).unwrap_or_default();
    let _ = time(&c, &pkts, 1, clock);
    let compiled_ns = least(|| time(&c, &pkts, rounds, clock));
    let _ = time_batch(&c, &pkts, 1, clock);
    let batch_ns = least(|| time_batch(&c, &pkts, rounds, clock));
    // Estimate the linear cost on a few packets, then size the sample.
    let probe = &pkts[..pkts.len().min(16)];
    let est = time(&prog, probe, 1, clock).max(1.0);
    let evals = ((LINEAR_BUDGET_NS as f64 / est) as usize).clamp(probe.len(), pkts.len() * rounds);
    let linear_ns = if evals >= pkts.len() {
        time(&prog, &pkts, evals / pkts.len(), clock)
    } else {
        time(&prog, &pkts[..evals], 1, clock)
    };
    let linear_evals = if evals >= pkts.len() {
        evals / pkts.len() * pkts.len()
    } else {
        evals
    };
    RuleTimes {
        rules: count,
        tuples: c.tuple_count(ChainId(0)).unwrap_or(0),
        compiled_ns,
        batch_ns,
        linear_ns,
        linear_evals,
    }
}

/// Result of [`measure_updates`]; times are end to end (clone of the
/// published generation, the update, and publishing it as a new `Arc`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct UpdateTimes {
    /// Rules loaded before the updates.
    pub objects: usize,
    /// Seconds to compile the loaded rule set.
    pub load_s: f64,
    /// Insert, median µs.
    pub insert_us_median: f64,
    /// Insert, 99th percentile µs.
    pub insert_us_p99: f64,
    /// Insert, worst µs.
    pub insert_us_max: f64,
    /// Delete, median µs.
    pub delete_us_median: f64,
    /// Delete, 99th percentile µs.
    pub delete_us_p99: f64,
    /// Delete, worst µs.
    pub delete_us_max: f64,
}

fn quantile(v: &mut [f64], q: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => 0.0,
        n => v[((n - 1) as f64 * q) as usize],
    }
}

/// Loads `objects` rules of `shape` (timed), then performs `ops` inserts of
/// ClassBench rules at spread positions and `ops` deletes of loaded rules,
/// each on a fresh generation while the previous one stays alive, as a
/// reader would keep it.
pub fn measure_updates(
    shape: Shape,
    objects: usize,
    ops: usize,
    clock: &mut dyn FnMut() -> u64,
) -> UpdateTimes {
    let (prog, _) = shape.build(objects, 1);
    let n = prog.chains.first().map_or(0, |c| c.rules.len()).max(1) as u64;
    let t0 = clock();
    let loaded = Classifier::compile(&prog).unwrap_or_default();
    let load_s = clock().saturating_sub(t0) as f64 / 1e9;
    let extra = gen::classbench(ops, 99);
    let (mut ins, mut del) = (Vec::with_capacity(ops), Vec::with_capacity(ops));
    let mut cur = Arc::new(loaded);
    let mut deleted = hashbrown::HashSet::new();
    for (i, r) in extra.chains.iter().flat_map(|c| c.rules.iter()).enumerate() {
        let mut r = r.clone();
        r.id = RuleId(u64::MAX / 2 + i as u64);
        // A spread of anchors and victims; skip ones already deleted.
        let mut anchor = (i as u64 * 7919) % n;
        while deleted.contains(&anchor) {
            anchor = (anchor + 1) % n;
        }
        let t = clock();
        let mut next = (*cur).clone();
        let ok = next
            .insert_rule(ChainId(0), Placement::Before(RuleId(anchor)), &r)
            .is_ok();
        let published = Arc::new(next);
        ins.push(clock().saturating_sub(t) as f64 / 1e3);
        std::hint::black_box((&cur, ok));
        cur = published;
        let mut victim = (i as u64 * 104_729 + 1) % n;
        while deleted.contains(&victim) || victim == anchor {
            victim = (victim + 1) % n;
        }
        let t = clock();
        let mut next = (*cur).clone();
        let ok = next.delete_rule(ChainId(0), RuleId(victim)).is_ok();
        let published = Arc::new(next);
        del.push(clock().saturating_sub(t) as f64 / 1e3);
        std::hint::black_box((&cur, ok));
        deleted.insert(victim);
        cur = published;
    }
    UpdateTimes {
        objects,
        load_s,
        insert_us_median: quantile(&mut ins, 0.5),
        insert_us_p99: quantile(&mut ins, 0.99),
        insert_us_max: quantile(&mut ins, 1.0),
        delete_us_median: quantile(&mut del, 0.5),
        delete_us_p99: quantile(&mut del, 0.99),
        delete_us_max: quantile(&mut del, 1.0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn measures_with_a_fake_clock() {
        let mut t = 0u64;
        let mut clock = || {
            t += 1000;
            t
        };
        let r = measure_rules(Shape::ClassBench, 50, 64, 2, &mut clock);
        assert_eq!(r.rules, 50);
        assert!(r.tuples > 0 && r.compiled_ns > 0.0 && r.batch_ns > 0.0 && r.linear_ns > 0.0);
        let u = measure_updates(Shape::Seed001, 500, 20, &mut clock);
        assert_eq!(u.objects, 500);
        assert!(u.load_s > 0.0 && u.insert_us_median > 0.0 && u.delete_us_max > 0.0);
    }
}
