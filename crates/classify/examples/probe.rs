//! One shape and size, for cachegrind and interleaved timing:
//! `probe <seed001|classbench|hosts|hosts6> <rules> <rounds> [single|batch] [reps]`.
//! Diff two round counts under cachegrind to get instructions per packet.
//! With `reps` (default 1) the timed run is repeated and the minimum
//! printed: on a shared machine the least disturbed run is the closest to
//! the cost of the code itself. `HDRS=N` sets the number of distinct headers.

use std::time::Instant;

use sluice_classify::bench::Shape;
use sluice_classify::{bench_lookup, ChainId, Classifier, Scratch};

fn main() {
    let a: Vec<String> = std::env::args().collect();
    let shape = match a.get(1).map(String::as_str) {
        Some("seed001") => Shape::Seed001,
        Some("hosts") => Shape::Hosts,
        Some("hosts6") => Shape::Hosts6,
        _ => Shape::ClassBench,
    };
    let n: usize = a.get(2).and_then(|x| x.parse().ok()).unwrap_or(20);
    let rounds: usize = a.get(3).and_then(|x| x.parse().ok()).unwrap_or(100);
    let batch = a.get(4).map(String::as_str) == Some("batch");
    let reps: usize = a.get(5).and_then(|x| x.parse().ok()).unwrap_or(1).max(1);
    // `HDRS` (default 4096): distinct headers; 32 keeps everything a lookup
    // touches cache resident, so the time is the instructions and branches.
    let hdrs = std::env::var("HDRS")
        .ok()
        .and_then(|x| x.parse().ok())
        .unwrap_or(4096);
    let (prog, pkts) = shape.build(n, hdrs);
    let c = Classifier::compile(&prog).unwrap_or_default();
    let mut s = Scratch::new();
    let mut run = |rounds: usize| -> u64 {
        if batch {
            let mut sum = 0u64;
            for _ in 0..rounds {
                c.eval_batch(ChainId(0), &pkts, &mut s, |_, o, _| {
                    sum = sum
                        .wrapping_mul(31)
                        .wrapping_add(o.rule.map_or(u64::MAX, |r| r.0));
                });
            }
            sum
        } else {
            bench_lookup(&c, ChainId(0), &pkts, rounds, &mut s)
        }
    };
    std::hint::black_box(run(1));
    let mut ns = f64::INFINITY;
    for _ in 0..reps {
        let t0 = Instant::now();
        std::hint::black_box(run(rounds));
        ns = ns.min(t0.elapsed().as_nanos() as f64 / (rounds * pkts.len()).max(1) as f64);
    }
    println!(
        "{} {n} {} {ns:.1}",
        shape.name(),
        if batch { "batch32" } else { "single" }
    );
}
