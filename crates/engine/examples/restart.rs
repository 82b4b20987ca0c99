//! What carrying connections over a restart (`state_file`) costs a
//! worker: `FLOWS` IPv4 UDP connections (no NAT), then the time to give
//! them (`Worker::carried_conns`, at the stop) and to take them back into
//! a new worker (`Worker::restore`, at the next start, before traffic),
//! checking that every one comes back.
//!
//! `cargo run --release -p sluice-engine --example restart [FLOWS]`

mod common;

use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::Instant;

use common::{config_for, worker_with};
use sluice_engine::{StaticPolicy, Worker};

fn main() {
    let flows: u32 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(1_000_000);
    let routers = [(Ipv4Addr::new(203, 0, 113, 254), [2, 0, 0, 0, 8, 1])];
    let (w, now) = worker_with(flows, &routers);
    let t = Instant::now();
    let saved = w.carried_conns(now);
    let give = t.elapsed().as_secs_f64();
    drop(w);
    let mut w2 = Worker::new(
        config_for(flows, &routers),
        Arc::new(StaticPolicy::accept_all()),
    )
    .expect("worker");
    let t = Instant::now();
    let mut failed = 0u64;
    for s in &saved {
        if w2.restore(1_000_000, s).is_err() {
            failed += 1;
        }
    }
    let take = t.elapsed().as_secs_f64();
    println!(
        "{} connections given in {:.1} ms ({:.0} ns each), {} taken back in {:.1} ms ({:.0} ns each); {failed} refused",
        saved.len(),
        give * 1e3,
        give * 1e9 / saved.len().max(1) as f64,
        w2.conntrack().len(),
        take * 1e3,
        take * 1e9 / saved.len().max(1) as f64,
    );
    assert_eq!((w2.conntrack().len(), failed), (saved.len(), 0));
}
