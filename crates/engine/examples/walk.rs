//! What a filtered `conntrack count` / `flush` costs a worker: `FLOWS`
//! IPv4 UDP connections (no NAT), then a walk of the tables
//! (`Worker::walk_step`) in steps of `BUDGET` slots (the gateway's
//! `WALK_BUDGET`, 32 768), selecting one connection in 256 (by source
//! port): first counting, then removing. Prints the steps, their median
//! and longest duration (each one a pause of the packet path between two
//! batches), the walk's total time, and checks the counts.
//!
//! `cargo run --release -p sluice-engine --example walk [FLOWS] [BUDGET]`

mod common;

use std::net::Ipv4Addr;
use std::time::Instant;

use common::worker_with;
use sluice_engine::Walk;
use sluice_wire::flow::FlowKey4;

fn main() {
    let arg = |i: usize, d: u64| {
        std::env::args()
            .nth(i)
            .and_then(|a| a.parse().ok())
            .unwrap_or(d)
    };
    let flows = arg(1, 1_000_000) as u32;
    let budget = arg(2, 32_768) as usize;
    let r1 = Ipv4Addr::new(203, 0, 113, 254);
    let (mut w, _) = worker_with(flows, &[(r1, [2, 0, 0, 0, 8, 1])]);
    let n = w.conntrack().len();
    let pick = |e: &sluice_conntrack::Entry<FlowKey4, sluice_engine::worker::FlowInfo>| {
        e.orig().sport & 0xff == 7
    };
    let want = (0..flows).filter(|&i| (i & 0xff) == 7).count() as u64;
    for remove in [false, true] {
        let mut walk = Walk::new(remove);
        let mut steps = Vec::new();
        let all = Instant::now();
        loop {
            let t = Instant::now();
            let done = w.walk_step(&mut walk, budget, &mut |_, e| pick(e), &mut |_, _| false);
            steps.push(t.elapsed().as_secs_f64() * 1e6);
            if done {
                break;
            }
        }
        let total = all.elapsed().as_secs_f64();
        steps.sort_by(f64::total_cmp);
        let med = steps.get(steps.len() / 2).copied().unwrap_or(0.0);
        let max = steps.last().copied().unwrap_or(0.0);
        println!(
            "{}: {} selected of {n} in {} steps of {budget} slots, median {med:.0} us, longest {max:.0} us per step, {:.1} ms in all",
            if remove { "flush" } else { "count" },
            walk.matched,
            steps.len(),
            total * 1e3
        );
        assert_eq!(walk.matched, want);
    }
    assert_eq!(w.conntrack().len() as u64, n as u64 - want);
    println!("{} connections left", w.conntrack().len());
}
