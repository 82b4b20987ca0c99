//! Established-flow forwarding cost, IPv4 against IPv6, in process (no
//! I/O): one worker, `FLOWS` UDP flows created first, then batches of 256
//! 64-byte (IPv4) / 78-byte (IPv6, the smallest UDP frame) frames from those
//! flows, whose TTL / hop limit is restored before each batch. Prints ns per
//! frame for the restore alone and for restore + `Worker::process`.
//!
//! `cargo run --release -p sluice-engine --example v6_forward [FLOWS] [SECONDS]`

use std::net::{Ipv4Addr, Ipv6Addr};
use std::sync::Arc;
use std::time::Instant;

use sluice_engine::{
    Action, EngineConfig, Frames, IfIndex, Interface, Route4, Route6, StaticPolicy, Worker,
};
use sluice_wire::build::{build_udp4, build_udp6};
use sluice_wire::flow::{proto, FlowKey4, FlowKey6};

struct Batch {
    tmpl: Vec<Vec<u8>>,
    bufs: Vec<Vec<u8>>,
    lens: Vec<usize>,
    acts: Vec<Action>,
}

impl Batch {
    /// Undo what forwarding changed: bytes 14..26 hold the IPv6 hop limit
    /// (21) and the IPv4 TTL and header checksum (22..26); the MACs are not
    /// looked at again.
    #[inline]
    fn restore_hot(&mut self) {
        for (b, t) in self.bufs.iter_mut().zip(&self.tmpl) {
            let (Some(d), Some(s)) = (b.get_mut(14..26), t.get(14..26)) else {
                continue;
            };
            let s: [u8; 12] = s.try_into().unwrap_or([0; 12]);
            d.copy_from_slice(&s);
        }
    }

    fn restore(&mut self) {
        for (b, t) in self.bufs.iter_mut().zip(&self.tmpl) {
            b[..t.len()].copy_from_slice(t);
        }
        for (l, t) in self.lens.iter_mut().zip(&self.tmpl) {
            *l = t.len();
        }
    }
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

const IN_MAC: [u8; 6] = [2, 0, 0, 0, 0, 1];
const OUT_MAC: [u8; 6] = [2, 0, 0, 0, 0, 2];
const HOST_MAC: [u8; 6] = [2, 0, 0, 0, 9, 9];
const ROUTER_MAC: [u8; 6] = [2, 0, 0, 0, 8, 8];

fn worker() -> Worker {
    let cfg = EngineConfig {
        interfaces: vec![
            Interface {
                name: "in".into(),
                mac: IN_MAC,
                addrs: vec![(Ipv4Addr::new(10, 0, 0, 1), 16)],
                mtu: 1500,
            },
            Interface {
                name: "out".into(),
                mac: OUT_MAC,
                addrs: vec![(Ipv4Addr::new(203, 0, 113, 1), 24)],
                mtu: 1500,
            },
        ],
        routes: vec![Route4 {
            net: 0,
            len: 0,
            oif: 1,
            via: Some(Ipv4Addr::new(203, 0, 113, 254)),
        }],
        neighbors: vec![(Ipv4Addr::new(203, 0, 113, 254), ROUTER_MAC)],
        addrs6: vec![
            (0, "fd00:1::1".parse().unwrap(), 64),
            (1, "2001:db8:ffff::1".parse().unwrap(), 64),
        ],
        routes6: vec![Route6 {
            net: 0,
            len: 0,
            oif: 1,
            via: Some("fe80::1".parse().unwrap()),
        }],
        neighbors6: vec![(1, "fe80::1".parse().unwrap(), ROUTER_MAC)],
        ct_max: 1 << 20,
        ct6_max: 1 << 20,
        ..EngineConfig::default()
    };
    let mut w = Worker::new(cfg, Arc::new(StaticPolicy::accept_all())).expect("worker");
    // Hosts: 10.0.x.y and fd00:1::x:y, all with one MAC (it is not looked at).
    w.set_neighbor(Ipv4Addr::new(10, 0, 0, 2), HOST_MAC)
        .expect("neigh");
    w
}

fn run(w: &mut Worker, mut b: Batch, secs: f64, what: &str) {
    let n = b.bufs.len();
    // Create the connections.
    b.restore();
    w.process(1_000_000_000, &mut b);
    let fwd = b
        .acts
        .iter()
        .filter(|a| matches!(a, Action::Forward(_)))
        .count();
    assert_eq!(
        fwd,
        n,
        "{what}: not every frame forwarded: {:?}",
        &b.acts[..4]
    );
    let mut now = 1_000_000_000u64;
    let (mut frames, t0) = (0u64, Instant::now());
    while t0.elapsed().as_secs_f64() < secs {
        for _ in 0..64 {
            b.restore_hot();
            std::hint::black_box(&mut b);
        }
        frames += 64 * n as u64;
    }
    let restore_ns = t0.elapsed().as_nanos() as f64 / frames as f64;
    let before = w.counters().fast_path;
    let (mut frames, t0) = (0u64, Instant::now());
    while t0.elapsed().as_secs_f64() < secs {
        for _ in 0..64 {
            b.restore_hot();
            now += 1000;
            w.process(now, &mut b);
        }
        frames += 64 * n as u64;
    }
    let total_ns = t0.elapsed().as_nanos() as f64 / frames as f64;
    let fast = w.counters().fast_path - before;
    assert_eq!(
        fast, frames,
        "{what}: every timed frame takes the fast path"
    );
    println!(
        "{what:>5}: {total_ns:6.1} ns/frame (restore {restore_ns:4.1} ns, engine {:6.1} ns), {:.2} Mpps",
        total_ns - restore_ns,
        1e3 / (total_ns - restore_ns)
    );
}

fn main() {
    let mut args = std::env::args().skip(1);
    let flows: usize = args.next().and_then(|s| s.parse().ok()).unwrap_or(256);
    let secs: f64 = args.next().and_then(|s| s.parse().ok()).unwrap_or(1.0);
    let batch = 256;
    let mk = |f: &dyn Fn(usize, &mut [u8]) -> usize| {
        let tmpl: Vec<Vec<u8>> = (0..batch)
            .map(|i| {
                let mut b = vec![0u8; 2048];
                let n = f(i % flows, &mut b);
                b.truncate(n);
                b
            })
            .collect();
        Batch {
            bufs: vec![vec![0u8; 2048]; batch],
            lens: vec![0; batch],
            acts: vec![Action::Pending; batch],
            tmpl,
        }
    };
    println!("{flows} UDP flows, batches of {batch}, {secs} s per figure");
    let mut w = worker();
    let v4 = mk(&|i, b| {
        let k = FlowKey4::new(
            proto::UDP,
            Ipv4Addr::new(10, 0, 0, 2),
            (1024 + i) as u16,
            Ipv4Addr::new(198, 18, 0, 1),
            53,
        );
        build_udp4(b, HOST_MAC, IN_MAC, &k, 18).expect("frame")
    });
    run(&mut w, v4, secs, "IPv4");
    let mut w = worker();
    w.set_neighbor6(0, "fd00:1::2".parse().unwrap(), HOST_MAC)
        .expect("neigh");
    let v6 = mk(&|i, b| {
        let k = FlowKey6::new(
            proto::UDP,
            "fd00:1::2".parse::<Ipv6Addr>().unwrap(),
            (1024 + i) as u16,
            "2001:db8:80::1".parse().unwrap(),
            53,
        );
        build_udp6(b, HOST_MAC, IN_MAC, &k, 16).expect("frame")
    });
    run(&mut w, v6, secs, "IPv6");
}
