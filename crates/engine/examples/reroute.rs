//! What a route change costs the worker: `FLOWS` IPv4 UDP connections
//! (no NAT) through a default route, then `Worker::set_routes` with a
//! default route via another (known) router and the walk that
//! `Worker::gc` advances in steps of 4096 slots, as the gateway's
//! housekeeping does every 10 ms. Prints the time of `set_routes`, the
//! steps, their median and longest duration (each one a pause of the
//! packet path), against the GC's own steps before the change, and checks
//! that a connection leaves by the new router.
//!
//! `cargo run --release -p sluice-engine --example reroute [FLOWS]`

mod common;

use std::net::Ipv4Addr;
use std::time::Instant;

use common::{batch, default_via, key, worker_with};

fn main() {
    let flows: u32 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(1_000_000);
    let r1 = Ipv4Addr::new(203, 0, 113, 254);
    let r2 = Ipv4Addr::new(203, 0, 113, 253);
    let (mut w, mut now) =
        worker_with(flows, &[(r1, [2, 0, 0, 0, 8, 1]), (r2, [2, 0, 0, 0, 8, 2])]);
    // The GC's own steps, for comparison.
    let mut base = Vec::new();
    for _ in 0..64 {
        now += 10_000_000;
        let t = Instant::now();
        w.gc(now, 4096);
        base.push(t.elapsed().as_secs_f64() * 1e6);
    }
    base.sort_by(f64::total_cmp);
    println!(
        "gc alone: median {:.0} us per step",
        base.get(base.len() / 2).copied().unwrap_or(0.0)
    );
    let t = Instant::now();
    w.set_routes(&[default_via(r2)], &[]).expect("routes");
    println!("set_routes: {:.1} us", t.elapsed().as_secs_f64() * 1e6);
    let mut steps = Vec::new();
    while w.rerouting() {
        now += 10_000_000;
        let t = Instant::now();
        w.gc(now, 4096);
        steps.push(t.elapsed().as_secs_f64() * 1e6);
    }
    steps.sort_by(f64::total_cmp);
    let med = steps.get(steps.len() / 2).copied().unwrap_or(0.0);
    let max = steps.last().copied().unwrap_or(0.0);
    println!(
        "walk: {} steps of 4096 slots (one per 10 ms of housekeeping: {:.1} s), median {med:.0} us, longest {max:.0} us per step (GC included)",
        steps.len(),
        steps.len() as f64 * 0.01
    );
    let mut b = batch(std::iter::once(key(7)));
    w.process(now, &mut b);
    let dst: [u8; 6] = b.bufs[0][0..6].try_into().unwrap_or_default();
    println!(
        "a connection now leaves by {:?} to {:02x?} (router 2: [02, 00, 00, 00, 08, 02])",
        b.acts[0], dst
    );
}
