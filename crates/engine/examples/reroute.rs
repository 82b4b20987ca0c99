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

use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::Instant;

use sluice_engine::{
    Action, EngineConfig, Frames, IfIndex, Interface, Route4, StaticPolicy, Worker,
};
use sluice_wire::build::build_udp4;
use sluice_wire::flow::{proto, FlowKey4};

const MAC_IN: [u8; 6] = [2, 0, 0, 0, 0, 1];
const MAC_OUT: [u8; 6] = [2, 0, 0, 0, 0, 2];
const HOST_MAC: [u8; 6] = [2, 0, 0, 0, 9, 9];

struct Batch {
    bufs: Vec<Vec<u8>>,
    lens: Vec<usize>,
    acts: Vec<Action>,
}

impl Frames for Batch {
    fn count(&self) -> usize {
        self.bufs.len()
    }
    fn buf_mut(&mut self, i: usize) -> (&mut [u8], usize) {
        (&mut self.bufs[i][..], self.lens[i])
    }
    fn set_len(&mut self, i: usize, len: usize) {
        self.lens[i] = len;
    }
    fn iif(&self, _: usize) -> IfIndex {
        0
    }
    fn set_action(&mut self, i: usize, a: Action) {
        self.acts[i] = a;
    }
}

fn key(i: u32) -> FlowKey4 {
    FlowKey4 {
        src: u32::from(Ipv4Addr::new(10, 0, 0, 2)) + (i >> 16),
        dst: u32::from(Ipv4Addr::new(192, 0, 2, 1)),
        sport: (i & 0xffff) as u16,
        dport: 53,
        proto: proto::UDP,
    }
}

fn batch(keys: impl Iterator<Item = FlowKey4>) -> Batch {
    let mut b = Batch {
        bufs: Vec::new(),
        lens: Vec::new(),
        acts: Vec::new(),
    };
    for k in keys {
        let mut buf = vec![0u8; 128];
        let n = build_udp4(&mut buf, HOST_MAC, MAC_IN, &k, 18).unwrap_or(0);
        b.bufs.push(buf);
        b.lens.push(n);
        b.acts.push(Action::Pending);
    }
    b
}

fn main() {
    let flows: u32 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(1_000_000);
    let r1 = Ipv4Addr::new(203, 0, 113, 254);
    let r2 = Ipv4Addr::new(203, 0, 113, 253);
    let default_via = |r| Route4 {
        net: 0,
        len: 0,
        oif: 1,
        via: Some(r),
    };
    let cfg = EngineConfig {
        interfaces: vec![
            Interface {
                name: "in".into(),
                mac: MAC_IN,
                addrs: vec![(Ipv4Addr::new(10, 0, 0, 1), 8)],
                mtu: Interface::DEFAULT_MTU,
            },
            Interface {
                name: "out".into(),
                mac: MAC_OUT,
                addrs: vec![(Ipv4Addr::new(203, 0, 113, 1), 24)],
                mtu: Interface::DEFAULT_MTU,
            },
        ],
        routes: vec![default_via(r1)],
        // The routers, and the hosts the connections come from.
        neighbors: [(r1, [2, 0, 0, 0, 8, 1]), (r2, [2, 0, 0, 0, 8, 2])]
            .into_iter()
            .chain((0..=flows >> 16).map(|j| (Ipv4Addr::from(key(j << 16).src), HOST_MAC)))
            .collect(),
        ct_max: u64::from(flows) + 1024,
        ..EngineConfig::default()
    };
    let mut w = Worker::new(cfg, Arc::new(StaticPolicy::accept_all())).expect("worker");
    let t = Instant::now();
    let mut now = 1_000_000_000u64;
    for start in (0..flows).step_by(256) {
        let mut b = batch((start..(start + 256).min(flows)).map(key));
        w.process(now, &mut b);
        now += 1000;
    }
    println!(
        "{} connections set up in {:.2} s",
        w.conntrack().len(),
        t.elapsed().as_secs_f64()
    );
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
