//! What a filtered `conntrack count` / `flush` costs a worker: `FLOWS`
//! IPv4 UDP connections (no NAT), then a walk of the tables
//! (`Worker::walk_step`) in steps of `BUDGET` slots (the gateway's
//! `WALK_BUDGET`, 32 768), selecting one connection in 256 (by source
//! port): first counting, then removing. Prints the steps, their median
//! and longest duration (each one a pause of the packet path between two
//! batches), the walk's total time, and checks the counts.
//!
//! `cargo run --release -p sluice-engine --example walk [FLOWS] [BUDGET]`

use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::Instant;

use sluice_engine::{
    Action, EngineConfig, Frames, IfIndex, Interface, Route4, StaticPolicy, Walk, Worker,
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
    let arg = |i: usize, d: u64| {
        std::env::args()
            .nth(i)
            .and_then(|a| a.parse().ok())
            .unwrap_or(d)
    };
    let flows = arg(1, 1_000_000) as u32;
    let budget = arg(2, 32_768) as usize;
    let r1 = Ipv4Addr::new(203, 0, 113, 254);
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
        routes: vec![Route4 {
            net: 0,
            len: 0,
            oif: 1,
            via: Some(r1),
        }],
        neighbors: std::iter::once((r1, [2, 0, 0, 0, 8, 1]))
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
    let n = w.conntrack().len();
    println!(
        "{n} connections set up in {:.2} s",
        t.elapsed().as_secs_f64()
    );
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
