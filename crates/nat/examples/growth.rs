//! The pauses of a worker's NAT tables growing while mappings are made
//! (connection setup path): `cargo run --release -p sluice-nat --example
//! growth [MAPPINGS [PER_SUBSCRIBER [address|port]]]`.
//!
//! MAPPINGS (default 2 000 000) UDP mappings, PER_SUBSCRIBER (default 16)
//! per subscriber, on a 64-address pool, made one at a time with the
//! default capacity hint (1024), as a gateway makes them, under
//! endpoint-independent filtering or the one named (whose permits are a
//! table of their own); prints every mapping whose `translate_outbound`
//! took more than 1 ms (a table growing: re-inserting what it holds, or
//! allocating) and the total time.

use std::net::Ipv4Addr;
use std::time::Instant;

use sluice_nat::{FilteringBehaviour, NatConfig, NoopSink, Pool, PoolId, Translation, WorkerNat};
use sluice_wire::flow::{proto, FlowKey4};

/// The `sluice` binary's allocator, so that growth costs what it costs in
/// the gateway.
#[global_allocator]
static GLOBAL: sluice_io::alloc::Allocator = sluice_io::alloc::Allocator;

fn main() {
    let n: u32 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(2_000_000);
    let per_sub: u32 = std::env::args()
        .nth(2)
        .and_then(|a| a.parse().ok())
        .unwrap_or(16);
    let filtering = match std::env::args().nth(3).as_deref() {
        Some("address") => FilteringBehaviour::AddressDependent,
        Some("port") => FilteringBehaviour::AddressAndPortDependent,
        _ => FilteringBehaviour::EndpointIndependent,
    };
    let cfg = NatConfig {
        pools: vec![Pool::from_range(
            Ipv4Addr::new(198, 51, 100, 0),
            Ipv4Addr::new(198, 51, 100, 63),
        )],
        filtering,
        ..NatConfig::default()
    };
    let mut w = match WorkerNat::new(&cfg, 0, NoopSink) {
        Ok(w) => w,
        Err(e) => panic!("{e}"),
    };
    let snat = Translation::Snat { pool: PoolId(0) };
    let dst = Ipv4Addr::new(203, 0, 113, 1);
    let start = Instant::now();
    let mut slow = Vec::new();
    for i in 0..n {
        let sub = Ipv4Addr::from(u32::from(Ipv4Addr::new(100, 64, 0, 0)) + i / per_sub);
        let key = FlowKey4::new(proto::UDP, sub, 1024 + (i % per_sub) as u16, dst, 53);
        let t = Instant::now();
        let _ = w.translate_outbound(&key, &snat, None);
        let us = t.elapsed().as_secs_f64() * 1e6;
        if us > 1000.0 {
            slow.push((i, us));
        }
    }
    for (i, us) in &slow {
        println!("mapping {i}: {:.1} ms", us / 1e3);
    }
    println!(
        "{} mappings in {:.0} ms, {} of them over 1 ms",
        w.stats().mappings,
        start.elapsed().as_secs_f64() * 1e3,
        slow.len()
    );
}
