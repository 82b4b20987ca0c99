//! One-shot measurement against the classification and update budgets,
//! through the same [`sluice_classify::bench`] bodies `sluice bench` uses.
//! `cargo run --release -p sluice-classify --example measure [max_rules]`

use std::time::Instant;

use sluice_classify::bench::{measure_rules, measure_updates, Shape};

fn main() {
    let max: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(100_000);
    let t0 = Instant::now();
    let mut clock = move || t0.elapsed().as_nanos() as u64;
    // compiled_ns: one packet at a time (Classifier::eval); batch32_ns:
    // Classifier::eval_batch, groups of 32 packets, with its own ratio.
    println!(
        "shape      rules  tuples  compiled_ns  linear_ns  ratio_vs_20  batch32_ns  batch_ratio"
    );
    for shape in [Shape::Seed001, Shape::ClassBench] {
        let (mut base, mut bbase) = (None, None);
        for &n in [20usize, 100, 1_000, 10_000, 100_000]
            .iter()
            .filter(|n| **n <= max)
        {
            let r = measure_rules(shape, n, 4096, 100, &mut clock);
            let b = *base.get_or_insert(r.compiled_ns);
            let bb = *bbase.get_or_insert(r.batch_ns);
            println!(
                "{:<10} {n:>6}  {:>6}  {:>11.1}  {:>9.1}  {:>11.2}  {:>10.1}  {:>11.2}",
                shape.name(),
                r.tuples,
                r.compiled_ns,
                r.linear_ns,
                r.compiled_ns / b,
                r.batch_ns,
                r.batch_ns / bb
            );
        }
    }
    for shape in [Shape::Seed001, Shape::ClassBench] {
        let u = measure_updates(shape, 150_000, 200, &mut clock);
        println!(
            "{}: load {} rules {:.3} s; insert p50 {:.0} us p99 {:.0} us max {:.0} us; delete p50 {:.0} us p99 {:.0} us max {:.0} us",
            shape.name(),
            u.objects,
            u.load_s,
            u.insert_us_median,
            u.insert_us_p99,
            u.insert_us_max,
            u.delete_us_median,
            u.delete_us_p99,
            u.delete_us_max
        );
    }
}
