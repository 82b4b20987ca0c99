//! ICMP errors the engine originates about packets it cannot forward,
//! through the whole worker pipeline (slow path and fast path):
//!
//! - TTL <= 1 on a forwarded packet: dropped (`ttl-expired`) and answered
//!   with time exceeded (RFC 792 type 11 code 0) from the ingress
//!   interface's address, quoting the IP header and 8 bytes of data;
//! - a packet larger than the egress MTU with DF set: dropped (`too-big`)
//!   and answered with fragmentation needed (type 3 code 4) carrying the
//!   next-hop MTU (RFC 1191); without DF it is dropped
//!   (`fragmentation-unsupported`);
//! - the rate limit bounds the errors sent; every dropped packet is still
//!   counted under its reason.

use std::net::Ipv4Addr;
use std::sync::Arc;

mod common;

use common::TestFrames;
use sluice_engine::{
    Action, DropReason, EngineConfig, IfIndex, Interface, Route4, StaticPolicy, Verdict, Worker,
};
use sluice_nat::{NatConfig, Pool, PoolId, Translation};
use sluice_wire::build::{build_tcp4, build_udp4};
use sluice_wire::checksum;
use sluice_wire::flow::{proto, FlowKey4};
use sluice_wire::{dissect, Net, L4};

const INSIDE: IfIndex = 0;
const OUTSIDE: IfIndex = 1;
const GW_IN_MAC: [u8; 6] = [2, 0, 0, 0, 0, 1];
const GW_OUT_MAC: [u8; 6] = [2, 0, 0, 0, 0, 2];
const HOST_MAC: [u8; 6] = [2, 0, 0, 0, 9, 9];
const ROUTER_MAC: [u8; 6] = [2, 0, 0, 0, 8, 8];
const GW_IN: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
const GW_OUT: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 1);
const HOST: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);
const REMOTE: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 80);
const POOL: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 1);
const OUT_MTU: u16 = 1400;

fn worker_with(default: Verdict, icmp_rate: u32) -> Worker {
    let cfg = EngineConfig {
        interfaces: vec![
            Interface {
                name: "in".into(),
                mac: GW_IN_MAC,
                addrs: vec![(Ipv4Addr::new(172, 16, 0, 1), 24), (GW_IN, 24)],
                mtu: Interface::DEFAULT_MTU,
            },
            Interface {
                name: "out".into(),
                mac: GW_OUT_MAC,
                addrs: vec![(GW_OUT, 24)],
                mtu: OUT_MTU,
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
        ],
        ct_max: 1000,
        nat: NatConfig {
            pools: vec![Pool::new([POOL]).with_ports(1024..=65535)],
            ..NatConfig::default()
        },
        icmp_errors_per_sec: icmp_rate,
        ..EngineConfig::default()
    };
    let mut p = StaticPolicy::accept_all();
    p.default = default;
    p.snat = vec![(OUTSIDE, Translation::Snat { pool: PoolId(0) })];
    Worker::new(cfg, Arc::new(p)).unwrap()
}

fn worker() -> Worker {
    worker_with(Verdict::Accept, 1000)
}

fn udp_key(sport: u16) -> FlowKey4 {
    FlowKey4 {
        src: u32::from(HOST),
        dst: u32::from(REMOTE),
        sport,
        dport: 53,
        proto: proto::UDP,
    }
}

/// An outbound UDP frame with `payload` bytes, TTL `ttl` and DF as given
/// (the IPv4 header checksum is recomputed).
fn udp_frame(b: &mut [u8], k: &FlowKey4, payload: usize, ttl: u8, df: bool) -> usize {
    let n = build_udp4(b, HOST_MAC, GW_IN_MAC, k, payload).unwrap();
    b[14 + 8] = ttl;
    b[14 + 6] = if df { 0x40 } else { 0 };
    b[24..26].fill(0);
    let c = checksum::checksum(&b[14..34]);
    b[24..26].copy_from_slice(&c.to_be_bytes());
    n
}

/// Assert that `f` is an ICMP error `ty`/`code` from `from` to `to` (MACs
/// swapped back towards the sender) whose checksums verify, quoting
/// `quoted`; returns bytes 4..8 of the ICMP header.
fn assert_icmp_error(
    f: &[u8],
    ty: u8,
    code: u8,
    from: Ipv4Addr,
    to: Ipv4Addr,
    quoted: &[u8],
) -> [u8; 4] {
    assert_eq!(&f[0..6], &HOST_MAC, "destination MAC: the sender");
    assert_eq!(&f[6..12], &GW_IN_MAC, "source MAC: the ingress interface");
    let d = dissect(f).unwrap();
    let Net::Ipv4 {
        key,
        ttl,
        total_len,
        ..
    } = d.net
    else {
        panic!("not IPv4: {:?}", d.net)
    };
    assert_eq!((key.src, key.dst), (u32::from(from), u32::from(to)));
    assert_eq!(key.proto, proto::ICMP);
    assert_eq!(ttl, 64);
    assert!(checksum::verify(&f[14..34]), "IPv4 header checksum");
    let icmp = &f[34..14 + usize::from(total_len)];
    assert!(checksum::verify(icmp), "ICMP checksum");
    assert_eq!((icmp[0], icmp[1]), (ty, code));
    assert!(matches!(d.l4, L4::IcmpError { .. }), "{:?}", d.l4);
    assert_eq!(&icmp[8..], quoted, "quoted datagram");
    [icmp[4], icmp[5], icmp[6], icmp[7]]
}

#[test]
fn ttl_1_on_a_new_flow_gets_time_exceeded_from_the_ingress_address() {
    let mut w = worker();
    let mut f = TestFrames::default();
    let k = udp_key(4000);
    f.push(INSIDE, |b| udp_frame(b, &k, 100, 1, false));
    let quoted = f.frame(0)[14..14 + 28].to_vec();
    w.process(1_000_000, &mut f);
    assert_eq!(f.acts[0], Action::Reply);
    // 10.0.0.1, the address on the sender's subnet, not the first one.
    let rest = assert_icmp_error(f.frame(0), 11, 0, GW_IN, HOST, &quoted);
    assert_eq!(rest, [0; 4]);
    let c = w.counters();
    assert_eq!(c.drops_for(DropReason::TtlExpired), 1);
    assert_eq!(c.icmp_errors, 1);
    assert_eq!(c.tx, 0);
    // Nothing was created for the dropped packet.
    assert_eq!(w.conntrack().len(), 0);
    assert_eq!(w.nat().mappings().count(), 0);
}

#[test]
fn ttl_1_is_answered_even_when_the_forward_policy_would_drop() {
    // As netfilter: ip_forward checks the TTL before the forward hook.
    let mut w = worker_with(Verdict::Drop, 1000);
    let mut f = TestFrames::default();
    let k = udp_key(4001);
    f.push(INSIDE, |b| udp_frame(b, &k, 8, 1, false));
    f.push(INSIDE, |b| udp_frame(b, &k, 8, 5, false));
    w.process(1_000_000, &mut f);
    assert_eq!(f.acts[0], Action::Reply);
    assert_eq!(f.acts[1], Action::Drop(DropReason::PolicyDrop));
}

#[test]
fn ttl_1_on_an_established_flow_gets_time_exceeded_on_the_fast_path() {
    let mut w = worker();
    let k = udp_key(4002);
    let mut f = TestFrames::default();
    f.push(INSIDE, |b| udp_frame(b, &k, 20, 64, false));
    w.process(1_000_000, &mut f);
    assert_eq!(f.acts[0], Action::Forward(OUTSIDE));
    // The reply direction, from the outside, with TTL 1: the error goes
    // back out of the outside interface, from its address, quoting the
    // packet as the remote sent it (to the pool address).
    let e = w.conntrack().iter().next().map(|(_, e)| e.reply()).unwrap();
    let mut g = TestFrames::default();
    g.push(OUTSIDE, |b| {
        let n = build_udp4(b, ROUTER_MAC, GW_OUT_MAC, &e, 20).unwrap();
        b[14 + 8] = 1;
        n
    });
    let quoted = g.frame(0)[14..14 + 28].to_vec();
    w.process(2_000_000, &mut g);
    assert_eq!(g.acts[0], Action::Reply);
    let f0 = g.frame(0);
    assert_eq!(&f0[0..6], &ROUTER_MAC);
    assert_eq!(&f0[6..12], &GW_OUT_MAC);
    let d = dissect(f0).unwrap();
    assert_eq!(
        d.key4().map(|k| (k.src, k.dst)),
        Some((u32::from(GW_OUT), u32::from(REMOTE)))
    );
    assert!(checksum::verify(&f0[34..f0.len()]));
    assert_eq!(&f0[42..], &quoted[..]);
    assert_eq!(w.counters().fast_path, 0, "the error is not a forward");
    assert_eq!(w.counters().drops_for(DropReason::TtlExpired), 1);
    // The same flow with TTL 2 still goes through.
    let mut h = TestFrames::default();
    h.push(INSIDE, |b| udp_frame(b, &k, 20, 2, false));
    w.process(3_000_000, &mut h);
    assert_eq!(h.acts[0], Action::Forward(OUTSIDE));
}

#[test]
fn too_big_with_df_gets_frag_needed_with_the_next_hop_mtu() {
    let mut w = worker();
    let mut f = TestFrames::default();
    let k = udp_key(4003);
    // 1500-byte IP packet (20 + 8 + 1472) with DF, out of a 1400 MTU.
    f.push(INSIDE, |b| udp_frame(b, &k, 1472, 64, true));
    let quoted = f.frame(0)[14..14 + 28].to_vec();
    // Exactly the MTU passes.
    f.push(INSIDE, |b| udp_frame(b, &udp_key(4004), 1372, 64, true));
    // Too big without DF: translated, and sent as fragments (the io
    // layer splits it), no error.
    f.push(INSIDE, |b| udp_frame(b, &udp_key(4005), 1373, 64, false));
    w.process(1_000_000, &mut f);
    assert_eq!(f.acts[0], Action::Reply);
    let rest = assert_icmp_error(f.frame(0), 3, 4, GW_IN, HOST, &quoted);
    assert_eq!(u16::from_be_bytes([rest[2], rest[3]]), OUT_MTU);
    assert_eq!(f.acts[1], Action::Forward(OUTSIDE));
    assert_eq!(f.acts[2], Action::Fragment(OUTSIDE, OUT_MTU));
    let k2 = dissect(f.frame(2)).unwrap().key4().unwrap();
    assert_ne!(k2.src, u32::from(HOST), "translated before it is split");
    let c = w.counters();
    assert_eq!(c.drops_for(DropReason::TooBig), 1);
    assert_eq!(c.icmp_errors, 1);
    assert_eq!(c.fragmented, 1);
    // The packets that were forwarded created connections.
    assert_eq!(w.conntrack().len(), 2);
}

#[test]
fn too_big_on_an_established_tcp_flow_gets_frag_needed() {
    let mut w = worker();
    let k = FlowKey4 {
        src: u32::from(HOST),
        dst: u32::from(REMOTE),
        sport: 40000,
        dport: 80,
        proto: proto::TCP,
    };
    let mut f = TestFrames::default();
    f.push(INSIDE, |b| {
        build_tcp4(b, HOST_MAC, GW_IN_MAC, &k, 0x02, 1, 0, 0).unwrap()
    });
    w.process(1_000_000, &mut f);
    assert_eq!(f.acts[0], Action::Forward(OUTSIDE));
    let r = w.conntrack().iter().next().map(|(_, e)| e.reply()).unwrap();
    let mut sa = TestFrames::default();
    sa.push(OUTSIDE, |b| {
        build_tcp4(b, ROUTER_MAC, GW_OUT_MAC, &r, 0x12, 100, 2, 0).unwrap()
    });
    w.process(1_500_000, &mut sa);
    assert_eq!(sa.acts[0], Action::Forward(INSIDE));
    let mut g = TestFrames::default();
    g.push(INSIDE, |b| {
        let n = build_tcp4(b, HOST_MAC, GW_IN_MAC, &k, 0x10, 2, 101, 1460).unwrap();
        b[14 + 6] = 0x40;
        b[24..26].fill(0);
        let c = checksum::checksum(&b[14..34]);
        b[24..26].copy_from_slice(&c.to_be_bytes());
        n
    });
    let quoted = g.frame(0)[14..14 + 28].to_vec();
    w.process(2_000_000, &mut g);
    assert_eq!(g.acts[0], Action::Reply);
    let rest = assert_icmp_error(g.frame(0), 3, 4, GW_IN, HOST, &quoted);
    assert_eq!(u16::from_be_bytes([rest[2], rest[3]]), OUT_MTU);
    assert_eq!(w.counters().drops_for(DropReason::TooBig), 1);
}

#[test]
fn the_rate_limit_bounds_errors_and_every_drop_is_still_counted() {
    let mut w = worker_with(Verdict::Accept, 10);
    let mut f = TestFrames::default();
    for i in 0..60 {
        f.push(INSIDE, |b| udp_frame(b, &udp_key(5000 + i), 8, 1, false));
    }
    w.process(1_000_000_000, &mut f);
    let replies = f.acts.iter().filter(|a| **a == Action::Reply).count();
    assert_eq!(replies, sluice_engine::worker::ICMP_ERROR_BURST as usize);
    let c = w.counters().clone();
    assert_eq!(c.drops_for(DropReason::TtlExpired), 60);
    assert_eq!(c.icmp_errors, 50);
    assert_eq!(c.icmp_errors_limited, 10);
    // 10 per second: after 300 ms, three more.
    let mut g = TestFrames::default();
    for i in 0..5 {
        g.push(INSIDE, |b| udp_frame(b, &udp_key(6000 + i), 8, 1, false));
    }
    w.process(1_300_000_000, &mut g);
    assert_eq!(g.acts.iter().filter(|a| **a == Action::Reply).count(), 3);
    // 0 per second sends none.
    let mut w = worker_with(Verdict::Accept, 0);
    let mut h = TestFrames::default();
    h.push(INSIDE, |b| udp_frame(b, &udp_key(7000), 8, 1, false));
    w.process(1_000_000, &mut h);
    assert_eq!(h.acts[0], Action::Drop(DropReason::TtlExpired));
}

#[test]
fn an_icmp_error_with_ttl_1_is_dropped_without_an_error_about_it() {
    let mut w = worker();
    let mut f = TestFrames::default();
    f.push(INSIDE, |b| {
        let n = sluice_wire::build::build_icmp4_error(
            b,
            HOST_MAC,
            GW_IN_MAC,
            u32::from(HOST),
            u32::from(REMOTE),
            3,
            3,
            0,
            &[
                0x45, 0, 0, 28, 0, 0, 0, 0, 64, 17, 0, 0, 192, 0, 2, 80, 10, 0, 0, 2,
            ],
        )
        .unwrap();
        b[14 + 8] = 1;
        n
    });
    w.process(1_000_000, &mut f);
    assert!(matches!(f.acts[0], Action::Drop(_)), "{:?}", f.acts[0]);
    assert_eq!(w.counters().icmp_errors, 0);
}

/// The slow path names the next hop a `no-neighbor` drop waits for: after
/// DNAT it is the inside server, not the frame's destination. And a port
/// forward on the gateway's own address is forwarded, not delivered
/// locally (regression: it was dropped as `local-unhandled`).
#[test]
fn a_no_neighbor_drop_names_the_missing_next_hop_after_dnat() {
    let cfg = EngineConfig {
        interfaces: vec![
            Interface {
                name: "in".into(),
                mac: GW_IN_MAC,
                addrs: vec![(GW_IN, 24)],
                mtu: Interface::DEFAULT_MTU,
            },
            Interface {
                name: "out".into(),
                mac: GW_OUT_MAC,
                addrs: vec![(GW_OUT, 24)],
                mtu: Interface::DEFAULT_MTU,
            },
        ],
        neighbors: vec![(Ipv4Addr::new(203, 0, 113, 9), ROUTER_MAC)],
        ..EngineConfig::default()
    };
    let mut p = StaticPolicy::accept_all();
    p.dnat = vec![sluice_engine::PortForward {
        proto: proto::TCP,
        addr: GW_OUT,
        port: 8080,
        to_addr: Ipv4Addr::new(10, 0, 0, 3),
        to_port: 80,
    }];
    let mut w = Worker::new(cfg, Arc::new(p)).unwrap();
    let k = FlowKey4 {
        src: u32::from(Ipv4Addr::new(203, 0, 113, 9)),
        dst: u32::from(GW_OUT),
        sport: 40000,
        dport: 8080,
        proto: proto::TCP,
    };
    let mut f = TestFrames::default();
    f.push(OUTSIDE, |b| {
        build_tcp4(b, ROUTER_MAC, GW_OUT_MAC, &k, 0x02, 1, 0, 0).unwrap()
    });
    w.process(1_000_000, &mut f);
    assert_eq!(f.acts[0], Action::Drop(DropReason::NoNeighbor));
    assert_eq!(
        w.missing_next_hop(0),
        Some((INSIDE, Ipv4Addr::new(10, 0, 0, 3)))
    );
    // The frame is untouched, so it can be processed again once resolved.
    assert_eq!(dissect(f.frame(0)).unwrap().key4(), Some(k));
    w.set_neighbor(Ipv4Addr::new(10, 0, 0, 3), HOST_MAC)
        .unwrap();
    w.process(2_000_000, &mut f);
    assert_eq!(f.acts[0], Action::Forward(INSIDE));
    assert_eq!(w.missing_next_hop(0), None);
}
