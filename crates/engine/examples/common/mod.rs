//! What the engine's examples share: a worker with `flows` IPv4 UDP
//! connections (no NAT) from hosts 10.0.x.y through a default route, and
//! the frames that make them.

use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::Instant;

use sluice_engine::{
    Action, EngineConfig, Frames, IfIndex, Interface, Route4, StaticPolicy, Worker,
};
use sluice_wire::build::build_udp4;
use sluice_wire::flow::{proto, FlowKey4};

pub const MAC_IN: [u8; 6] = [2, 0, 0, 0, 0, 1];
pub const MAC_OUT: [u8; 6] = [2, 0, 0, 0, 0, 2];
pub const HOST_MAC: [u8; 6] = [2, 0, 0, 0, 9, 9];

pub struct Batch {
    pub bufs: Vec<Vec<u8>>,
    pub lens: Vec<usize>,
    pub acts: Vec<Action>,
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

/// Connection `i`'s tuple.
pub fn key(i: u32) -> FlowKey4 {
    FlowKey4 {
        src: u32::from(Ipv4Addr::new(10, 0, 0, 2)) + (i >> 16),
        dst: u32::from(Ipv4Addr::new(192, 0, 2, 1)),
        sport: (i & 0xffff) as u16,
        dport: 53,
        proto: proto::UDP,
    }
}

/// A UDP frame of each key, arriving on the inside interface.
pub fn batch(keys: impl Iterator<Item = FlowKey4>) -> Batch {
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

/// The default route via router `r`.
pub fn default_via(r: Ipv4Addr) -> Route4 {
    Route4 {
        net: 0,
        len: 0,
        oif: 1,
        via: Some(r),
    }
}

/// The configuration [`worker_with`] builds its worker from: room for
/// `flows` connections.
#[allow(dead_code)]
pub fn config_for(flows: u32, routers: &[(Ipv4Addr, [u8; 6])]) -> EngineConfig {
    EngineConfig {
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
        routes: routers
            .first()
            .map(|&(r, _)| default_via(r))
            .into_iter()
            .collect(),
        // The routers, and the hosts the connections come from.
        neighbors: routers
            .iter()
            .copied()
            .chain((0..=flows >> 16).map(|j| (Ipv4Addr::from(key(j << 16).src), HOST_MAC)))
            .collect(),
        ct_max: u64::from(flows) + 1024,
        ..EngineConfig::default()
    }
}

/// A worker routing by default via the first of `routers` (all of them
/// known neighbours, with the hosts), with `flows` connections made, and
/// the engine time after them. Prints how long they took.
#[allow(dead_code)]
pub fn worker_with(flows: u32, routers: &[(Ipv4Addr, [u8; 6])]) -> (Worker, u64) {
    let cfg = config_for(flows, routers);
    let mut w = Worker::new(cfg, Arc::new(StaticPolicy::accept_all())).expect("worker");
    let now = connect(&mut w, flows);
    (w, now)
}

/// Send the first packet of connections `0..flows` ([`key`]) through `w`
/// in batches of 256; returns the engine time after them. Prints how long
/// they took.
#[allow(dead_code)]
pub fn connect(w: &mut Worker, flows: u32) -> u64 {
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
    now
}
