//! Compile and single-update cost of the classifier alone, through
//! [`sluice_classify::bench::measure_updates`]:
//! `cargo run --release -p sluice-classify --example updates [rules] [ops]`.

use std::time::Instant;

use sluice_classify::bench::{measure_updates, Shape};

fn main() {
    let a: Vec<String> = std::env::args().collect();
    let n: usize = a.get(1).and_then(|x| x.parse().ok()).unwrap_or(150_000);
    let ops: usize = a.get(2).and_then(|x| x.parse().ok()).unwrap_or(200);
    let t0 = Instant::now();
    let mut clock = move || t0.elapsed().as_nanos() as u64;
    for shape in [Shape::Seed001, Shape::ClassBench] {
        let u = measure_updates(shape, n, ops, &mut clock);
        println!(
            "{}: compile {} rules {:.3} s; insert p50 {:.1} us p99 {:.1} us; delete p50 {:.1} us p99 {:.1} us",
            shape.name(),
            u.objects,
            u.load_s,
            u.insert_us_median,
            u.insert_us_p99,
            u.delete_us_median,
            u.delete_us_p99
        );
    }
}
