//! The cost of creating and releasing NAT mappings, with and without port
//! block allocation, on one worker:
//! `cargo run --release -p sluice-nat --example alloc [SUBSCRIBERS] [PER_SUB] [BLOCK] [ROUNDS]`.
//!
//! SUBSCRIBERS internal hosts (from 100.64.0.0) each open PER_SUB UDP
//! mappings onto a pool of 64 addresses (ports 1024-65535), in rounds
//! that interleave the hosts as real traffic does; then every session is
//! released. Prints ns per mapping created and per mapping released, and
//! the NAT log events written, for block size 0 (one event per mapping)
//! and BLOCK (default 128: 504 blocks per address, for the 313 subscribers paired with each). The least of ROUNDS (default 5) repetitions.

use std::net::Ipv4Addr;
use std::time::Instant;

use sluice_nat::{NatConfig, NatEvent, NatEventSink, Pool, PoolId, Translation, WorkerNat};
use sluice_wire::flow::{proto, FlowKey4};

/// Counts events, as the engine's ring would take them.
#[derive(Default)]
struct Count(u64);

impl NatEventSink for Count {
    fn event(&mut self, _e: &NatEvent) {
        self.0 += 1;
    }
}

fn run(subs: u32, per_sub: u16, block: u16) -> (f64, f64, u64) {
    let cfg = NatConfig {
        pools: vec![Pool::from_range(
            Ipv4Addr::new(198, 51, 100, 0),
            Ipv4Addr::new(198, 51, 100, 63),
        )],
        port_block_size: block,
        capacity_hint: subs as usize * usize::from(per_sub),
        ..NatConfig::default()
    };
    let mut n = match WorkerNat::new(&cfg, 0, Count::default()) {
        Ok(n) => n,
        Err(e) => panic!("{e}"),
    };
    let snat = Translation::Snat { pool: PoolId(0) };
    let total = u64::from(subs) * u64::from(per_sub);
    let mut live = Vec::with_capacity(total as usize);
    let t0 = Instant::now();
    for p in 0..per_sub {
        for s in 0..subs {
            let o = FlowKey4::new(
                proto::UDP,
                Ipv4Addr::from(0x6440_0000 + s),
                10_000 + p,
                Ipv4Addr::new(203, 0, 113, 9),
                53,
            );
            match n.translate_outbound(&o, &snat, None) {
                Ok(r) => live.push((o, r)),
                Err(e) => panic!("{e} at subscriber {s}, mapping {p}"),
            }
        }
    }
    let create = t0.elapsed().as_nanos() as f64 / total as f64;
    let t1 = Instant::now();
    for (o, r) in &live {
        n.release(o, r);
    }
    let release = t1.elapsed().as_nanos() as f64 / total as f64;
    (create, release, n.sink().0)
}

fn main() {
    let a: Vec<String> = std::env::args().collect();
    let arg = |i: usize, d: u64| a.get(i).and_then(|x| x.parse().ok()).unwrap_or(d);
    let subs = arg(1, 20_000) as u32;
    let per_sub = arg(2, 50) as u16;
    let block = arg(3, 128) as u16;
    let rounds = arg(4, 5).max(1);
    println!("{subs} subscribers x {per_sub} UDP mappings, 64 pool addresses, one worker");
    println!("block | create ns | release ns | log events");
    for b in [0, block] {
        let mut best = (f64::INFINITY, f64::INFINITY, 0);
        for _ in 0..rounds {
            let r = run(subs, per_sub, b);
            best = (best.0.min(r.0), best.1.min(r.1), r.2);
        }
        println!("{b:>5} | {:>9.1} | {:>10.1} | {}", best.0, best.1, best.2);
    }
}
