//! What carrying connections over a restart (`state_file`) costs a
//! worker: `FLOWS` IPv4 UDP connections (with `nat`: each source-translated
//! to a pool of 64 addresses, one mapping per connection), then the time
//! to give them (`Worker::carried_conns`, at the stop) and to take them
//! back into a new worker (`Worker::restore`, at the next start, before
//! traffic; with NAT each mapping made again on its external endpoint),
//! checking that every one comes back.
//!
//! `cargo run --release -p sluice-engine --example restart [FLOWS] [nat]`

mod common;

use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::Instant;

use common::{config_for, connect};
use sluice_engine::{EngineConfig, StaticPolicy, Worker};
use sluice_nat::{NatConfig, Pool, PoolId, Translation};

fn main() {
    let flows: u32 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(1_000_000);
    let nat = std::env::args().nth(2).as_deref() == Some("nat");
    let routers = [(Ipv4Addr::new(203, 0, 113, 254), [2, 0, 0, 0, 8, 1])];
    let cfg = || EngineConfig {
        nat: NatConfig {
            pools: vec![Pool::from_range(
                Ipv4Addr::new(198, 51, 100, 0),
                Ipv4Addr::new(198, 51, 100, 63),
            )],
            capacity_hint: 1024,
            ..NatConfig::default()
        },
        ..config_for(flows, &routers)
    };
    let policy = || {
        let mut p = StaticPolicy::accept_all();
        if nat {
            p.snat = vec![(1, Translation::Snat { pool: PoolId(0) })];
        }
        Arc::new(p)
    };
    let mut w = Worker::new(cfg(), policy()).expect("worker");
    let now = connect(&mut w, flows);
    println!("{} NAT mappings", w.nat().stats().mappings);
    let t = Instant::now();
    let saved = w.carried_conns(now);
    let give = t.elapsed().as_secs_f64();
    let mappings = w.nat().stats().mappings;
    drop(w);
    let mut w2 = Worker::new(cfg(), policy()).expect("worker");
    let t = Instant::now();
    let mut failed = 0u64;
    for s in &saved {
        if w2.restore(1_000_000, s).is_err() {
            failed += 1;
        }
    }
    let take = t.elapsed().as_secs_f64();
    println!(
        "{} connections given in {:.1} ms ({:.0} ns each), {} taken back in {:.1} ms ({:.0} ns each), {} NAT mappings made again; {failed} refused",
        saved.len(),
        give * 1e3,
        give * 1e9 / saved.len().max(1) as f64,
        w2.conntrack().len(),
        take * 1e3,
        take * 1e9 / saved.len().max(1) as f64,
        w2.nat().stats().mappings,
    );
    assert_eq!((w2.conntrack().len(), failed), (saved.len(), 0));
    assert_eq!(w2.nat().stats().mappings, mappings);
}
