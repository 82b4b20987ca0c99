//! Shared test batch for the engine's integration tests.
// Each test binary uses part of it.
#![allow(dead_code)]

use sluice_engine::offload::OffloadOp;
use sluice_engine::{Action, Frames, IfIndex, Worker};

/// A minimal batch: owned 2 KiB buffers (room for the ICMP errors the
/// engine writes in place), their lengths, ingress interfaces and actions.
#[derive(Default)]
pub struct TestFrames {
    pub bufs: Vec<Vec<u8>>,
    pub lens: Vec<usize>,
    pub iifs: Vec<IfIndex>,
    pub acts: Vec<Action>,
}

impl TestFrames {
    /// Appends a frame that `f` writes into a zeroed buffer (returns its length).
    pub fn push(&mut self, iif: IfIndex, f: impl FnOnce(&mut [u8]) -> usize) {
        let mut b = vec![0u8; 2048];
        let n = f(&mut b);
        self.bufs.push(b);
        self.lens.push(n);
        self.iifs.push(iif);
        self.acts.push(Action::Pending);
    }

    /// Frame `i` as it is now.
    pub fn frame(&self, i: usize) -> &[u8] {
        &self.bufs[i][..self.lens[i]]
    }
}

impl Frames for TestFrames {
    fn count(&self) -> usize {
        self.bufs.len()
    }
    fn buf_mut(&mut self, i: usize) -> (&mut [u8], usize) {
        (&mut self.bufs[i][..], self.lens[i])
    }
    fn set_len(&mut self, i: usize, len: usize) {
        self.lens[i] = len;
    }
    fn iif(&self, i: usize) -> IfIndex {
        self.iifs[i]
    }
    fn set_action(&mut self, i: usize, a: Action) {
        self.acts[i] = a;
    }
}

// ---- The NAT gateway most IPv4 tests use ------------------------------

use std::net::Ipv4Addr;

use sluice_engine::{EngineConfig, Interface, Route4};
use sluice_nat::{NatConfig, Pool};
use sluice_wire::checksum;
use sluice_wire::flow::FlowKey4;

pub const INSIDE: IfIndex = 0;
pub const OUTSIDE: IfIndex = 1;
pub const GW_IN_MAC: [u8; 6] = [2, 0, 0, 0, 0, 1];
pub const GW_OUT_MAC: [u8; 6] = [2, 0, 0, 0, 0, 2];
/// The MAC of every inside host.
pub const HOST_MAC: [u8; 6] = [2, 0, 0, 0, 9, 9];
pub const ROUTER_MAC: [u8; 6] = [2, 0, 0, 0, 8, 8];
/// Inside hosts.
pub const HOST: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);
pub const SERVER: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 3);
/// The gateway's outside address.
pub const PUBLIC: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 1);
/// A host beyond the default router.
pub const REMOTE: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 80);
/// The SNAT pool's one address (ports 1024-65535).
pub const POOL: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 1);

/// Worker `worker` of `workers`: inside 10.0.0.1/24 (steered by source
/// port), outside 203.0.113.1/24 with the default route via
/// 203.0.113.254, static neighbours for the router and both inside hosts,
/// the pool, 1000 connections.
pub fn nat_gateway(worker: u16, workers: u16) -> EngineConfig {
    EngineConfig {
        interfaces: vec![
            Interface {
                name: "in".into(),
                mac: GW_IN_MAC,
                addrs: vec![(Ipv4Addr::new(10, 0, 0, 1), 24)],
                mtu: Interface::DEFAULT_MTU,
            },
            Interface {
                name: "out".into(),
                mac: GW_OUT_MAC,
                addrs: vec![(PUBLIC, 24)],
                mtu: Interface::DEFAULT_MTU,
            },
        ],
        routes: vec![Route4 {
            net: 0,
            len: 0,
            oif: OUTSIDE,
            via: Some(Ipv4Addr::new(203, 0, 113, 254)),
        }],
        neighbors: vec![
            (Ipv4Addr::new(203, 0, 113, 254), ROUTER_MAC),
            (HOST, HOST_MAC),
            (SERVER, HOST_MAC),
        ],
        worker,
        workers,
        steered_by_source: vec![INSIDE],
        ct_max: 1000,
        nat: NatConfig {
            pools: vec![Pool::new([POOL]).with_ports(1024..=65535)],
            ..NatConfig::default()
        },
        ..EngineConfig::default()
    }
}

/// The UDP checksum of `udp` (its checksum field is ignored) between
/// `src` and `dst`.
pub fn udp_checksum(src: Ipv4Addr, dst: Ipv4Addr, udp: &[u8]) -> u16 {
    let mut z = udp.to_vec();
    z[6] = 0;
    z[7] = 0;
    let s = checksum::add(
        checksum::pseudo_v4(u32::from(src), u32::from(dst), 17, udp.len() as u16),
        checksum::sum(&z),
    );
    match checksum::finish(s) {
        0 => 0xffff,
        c => c,
    }
}

/// A UDP datagram (header + `data_len` bytes of a pattern) with a valid
/// checksum.
pub fn udp_datagram(
    src: Ipv4Addr,
    dst: Ipv4Addr,
    sport: u16,
    dport: u16,
    data_len: usize,
) -> Vec<u8> {
    let len = 8 + data_len;
    let mut d = vec![0u8; len];
    d[0..2].copy_from_slice(&sport.to_be_bytes());
    d[2..4].copy_from_slice(&dport.to_be_bytes());
    d[4..6].copy_from_slice(&(len as u16).to_be_bytes());
    for (i, b) in d[8..].iter_mut().enumerate() {
        *b = (i * 7 + 3) as u8;
    }
    let c = udp_checksum(src, dst, &d);
    d[6..8].copy_from_slice(&c.to_be_bytes());
    d
}

/// The IPv4 fragments (Ethernet frames from `macs.0` to `macs.1`) of
/// `datagram` (the IP payload, protocol `proto`), 1480 bytes of it per
/// fragment.
pub fn ipv4_fragments(
    macs: ([u8; 6], [u8; 6]),
    src: Ipv4Addr,
    dst: Ipv4Addr,
    proto: u8,
    ident: u16,
    ttl: u8,
    datagram: &[u8],
) -> Vec<Vec<u8>> {
    let chunks: Vec<&[u8]> = datagram.chunks(1480).collect();
    let n = chunks.len();
    chunks
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let mut f = vec![0u8; 14 + 20 + c.len()];
            f[0..6].copy_from_slice(&macs.1);
            f[6..12].copy_from_slice(&macs.0);
            f[12..14].copy_from_slice(&[0x08, 0x00]);
            let ip = &mut f[14..34];
            ip[0] = 0x45;
            ip[2..4].copy_from_slice(&((20 + c.len()) as u16).to_be_bytes());
            ip[4..6].copy_from_slice(&ident.to_be_bytes());
            let off = (i * 1480 / 8) as u16 | if i + 1 < n { 0x2000 } else { 0 };
            ip[6..8].copy_from_slice(&off.to_be_bytes());
            ip[8] = ttl;
            ip[9] = proto;
            ip[12..16].copy_from_slice(&src.octets());
            ip[16..20].copy_from_slice(&dst.octets());
            let c16 = checksum::checksum(ip);
            ip[10..12].copy_from_slice(&c16.to_be_bytes());
            f[34..].copy_from_slice(c);
            f
        })
        .collect()
}

/// A UDP frame of `k` (16 payload bytes) from MAC `from` to `to`,
/// arriving on `iif`, as [`send`] takes it.
pub fn udp_frame(from: [u8; 6], to: [u8; 6], iif: IfIndex, k: &FlowKey4) -> (IfIndex, Vec<u8>) {
    let mut b = vec![0u8; 128];
    let n = sluice_wire::build::build_udp4(&mut b, from, to, k, 16).expect("a UDP frame");
    b.truncate(n);
    (iif, b)
}

/// Flow `i` of [`HOST`] to [`REMOTE`]'s DNS port, from source port
/// 20 000 + `i`.
pub fn host_flow(i: u16) -> FlowKey4 {
    FlowKey4 {
        src: u32::from(HOST),
        dst: u32::from(REMOTE),
        sport: 20_000 + i,
        dport: 53,
        proto: sluice_wire::flow::proto::UDP,
    }
}

/// Processes one frame (`(ingress, bytes)`); returns its action and the
/// frame as it left.
pub fn send(w: &mut Worker, now: u64, f: &(IfIndex, Vec<u8>)) -> (Action, Vec<u8>) {
    let mut t = TestFrames::default();
    t.push(f.0, |b| {
        b[..f.1.len()].copy_from_slice(&f.1);
        f.1.len()
    });
    w.process(now, &mut t);
    (t.acts[0], t.frame(0).to_vec())
}

/// The offload requests the worker queued, drained.
pub fn ops(w: &mut Worker) -> Vec<OffloadOp> {
    w.offload_ops().expect("offload on").drain().collect()
}
