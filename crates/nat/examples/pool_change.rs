//! The cost of a pool change on a worker with many live mappings (what a
//! reload that changes `snat to` makes every worker do when it takes the
//! new rule set):
//! `cargo run --release -p sluice-nat --example pool_change [MAPPINGS] [BLOCK]`.
//!
//! MAPPINGS UDP mappings (default 1 000 000; 16 per subscriber, from
//! 100.64.0.0) on a pool of 64 addresses (ports 1024-65535), port blocks
//! of BLOCK ports (default 0: none). Then seven changes, each timed: an
//! address added at the end of the pool (every mapping kept), a second
//! pool added after it, a pool put ahead of it (renumbered), the first
//! address removed and then one out of the middle (their mappings
//! retired, the other addresses' bitmaps close up), the second half
//! removed (half the mappings retired), the addresses back in another
//! pool list order (no port blocks only: with them an address that left
//! cannot come back while running; the mappings filed again one by one),
//! then a flush.

use std::net::Ipv4Addr;
use std::time::Instant;

use sluice_nat::{NatConfig, NoopSink, Pool, PoolId, Translation, WorkerNat};
use sluice_wire::flow::{proto, FlowKey4};

fn pool(first: u8, last: u8) -> Pool {
    Pool::from_range(
        Ipv4Addr::new(198, 51, 100, first),
        Ipv4Addr::new(198, 51, 100, last),
    )
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let mappings: u32 = args
        .get(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(1_000_000);
    let block: u16 = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(0);
    let cfg = NatConfig {
        pools: vec![pool(0, 63)],
        port_block_size: block,
        capacity_hint: mappings as usize,
        ..NatConfig::default()
    };
    let mut n = match WorkerNat::new(&cfg, 0, NoopSink) {
        Ok(n) => n,
        Err(e) => panic!("{e}"),
    };
    let snat = Translation::Snat { pool: PoolId(0) };
    let dst = Ipv4Addr::new(203, 0, 113, 1);
    let mut made = 0u32;
    for i in 0..mappings {
        let sub = Ipv4Addr::from(u32::from(Ipv4Addr::new(100, 64, 0, 0)) + i / 16);
        let key = FlowKey4::new(proto::UDP, sub, 1024 + (i % 16) as u16, dst, 53);
        if n.translate_outbound(&key, &snat, None).is_ok() {
            made += 1;
        }
    }
    println!(
        "{made} mappings on 64 addresses, port blocks {block}: {} MB RSS",
        rss_mb()
    );
    let mut step = |what: &str, pools: Vec<Pool>| {
        let next = NatConfig {
            pools,
            ..n.config().clone()
        };
        let t0 = Instant::now();
        let r = n.set_pools(&next);
        let ms = t0.elapsed().as_secs_f64() * 1e3;
        match r {
            Ok(c) => println!(
                "{what}: {ms:.3} ms ({} kept, {} retired, {} retired alive)",
                c.kept,
                c.retired,
                n.stats().retired
            ),
            Err(e) => println!("{what}: refused in {ms:.3} ms: {e}"),
        }
    };
    step("one address added", vec![pool(0, 64)]);
    step("a pool added after it", vec![pool(0, 64), pool(210, 211)]);
    step(
        "renumbered (a pool put ahead)",
        vec![pool(200, 200), pool(0, 64)],
    );
    step(
        "the first address removed",
        vec![pool(200, 200), pool(1, 64)],
    );
    let middle = Pool::new(
        (1..=64)
            .filter(|&d| d != 10)
            .map(|d| Ipv4Addr::new(198, 51, 100, d)),
    );
    step(
        "an address out of the middle removed",
        vec![pool(200, 200), middle],
    );
    let half = Pool::new(
        (1..=31)
            .filter(|&d| d != 10)
            .map(|d| Ipv4Addr::new(198, 51, 100, d)),
    );
    step("the second half removed", vec![pool(200, 200), half]);
    step(
        "all back, in another order",
        vec![pool(32, 64), pool(0, 31)],
    );
    // What `conntrack flush` makes every worker do with its NAT.
    let mappings = n.stats().mappings;
    let t0 = Instant::now();
    n.clear();
    println!(
        "flush of {mappings} mappings: {:.3} ms",
        t0.elapsed().as_secs_f64() * 1e3
    );
}

/// Resident set size of this process, MB (Linux).
fn rss_mb() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or(0, |pages| (pages * 4096) >> 20)
}
