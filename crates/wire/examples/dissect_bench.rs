//! Rough timing of `dissect` on 64-byte Eth+IPv4+UDP frames (60 bytes
//! without FCS). Not a test: run it in release on an idle core.
//!
//! ```text
//! cargo run --release -p sluice-wire --example dissect_bench
//! ```

use sluice_wire::build::build_udp4;
use sluice_wire::{dissect, flow::proto, EthernetAddress, FlowKey4, L4};
use std::hint::black_box;
use std::time::Instant;

fn main() {
    const BATCH: usize = 256;
    const ROUNDS: usize = 200_000;
    let a = EthernetAddress([2, 0, 0, 0, 0, 1]);
    let b = EthernetAddress([2, 0, 0, 0, 0, 2]);
    let mut frames = vec![[0u8; 60]; BATCH];
    for (i, f) in frames.iter_mut().enumerate() {
        let key = FlowKey4 {
            src: 0x0a00_0000 + i as u32,
            dst: 0xc612_0001,
            sport: 1024 + i as u16,
            dport: 7,
            proto: proto::UDP,
        };
        let n = build_udp4(f, a, b, &key, 18).expect("60-byte frame");
        assert_eq!(n, 60);
    }
    println!(
        "size_of::<Dissect>() = {}",
        std::mem::size_of::<sluice_wire::Dissect>()
    );
    for pass in 0..3 {
        let t = Instant::now();
        let mut acc = 0u64;
        for _ in 0..ROUNDS {
            for f in &frames {
                if let Ok(d) = dissect(black_box(&f[..])) {
                    if let (Some(k), L4::Udp { .. }) = (d.key4(), d.l4) {
                        acc = acc.wrapping_add(u64::from(k.sport) ^ u64::from(k.src));
                    }
                }
            }
        }
        let n = (ROUNDS * BATCH) as f64;
        let ns = t.elapsed().as_nanos() as f64 / n;
        println!("pass {pass}: {ns:.2} ns/frame over {n} frames (checksum {acc})");
    }
}

#[allow(dead_code)]
fn sizes() {
    println!(
        "size_of Dissect = {}",
        std::mem::size_of::<sluice_wire::Dissect>()
    );
}
