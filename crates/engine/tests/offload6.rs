//! Flow offload requests for IPv6 connections (`OffloadOp::Install6`):
//! what the worker hands to the lower layer must be exactly its own fast
//! path's forwarding (MACs, hop limit, nothing else), and it must take the
//! offload back whenever the fast path alone no longer decides.

use std::net::Ipv6Addr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

mod common;

use common::{ops, send};
use sluice_engine::offload::{OffloadFlow6, OffloadOp, OffloadProbe};
use sluice_engine::{
    Action, Decision, EngineConfig, Hook, IfIndex, Interface, Policy, PolicyPacket, Route6, Worker,
};
use sluice_wire::build::{build_tcp6, build_udp6};
use sluice_wire::flow::{proto, FlowKey4, FlowKey6};
use sluice_wire::tcp::flags as tf;

const INSIDE: IfIndex = 0;
const OUTSIDE: IfIndex = 1;
const GW_IN_MAC: [u8; 6] = [2, 0, 0, 0, 0, 1];
const GW_OUT_MAC: [u8; 6] = [2, 0, 0, 0, 0, 2];
const HOST_MAC: [u8; 6] = [2, 0, 0, 0, 9, 9];
const ROUTER_MAC: [u8; 6] = [2, 0, 0, 0, 8, 8];
const OUT_MTU: u16 = 1400;
const HOST: &str = "fd00:1::2";
const ROUTER_LL: &str = "fe80::ff:fe00:808";
const REMOTE: &str = "2001:db8:80::80";

fn ip(s: &str) -> Ipv6Addr {
    s.parse().unwrap()
}

/// Accepts everything; established packets up front unless `per_packet`.
struct Accept {
    per_packet: AtomicBool,
    /// Its forward hook runs `flow add` (a flowtable of generation 1).
    flow_add: AtomicBool,
}

impl Policy for Accept {
    fn decide(&self, hook: Hook, pkt: &PolicyPacket) -> Decision {
        Decision {
            flow_add: hook == Hook::Forward && self.flow_add.load(Ordering::Relaxed),
            ct_timeout: 0,
            ..Decision::accept(pkt)
        }
    }
    fn flowtables(&self) -> u64 {
        u64::from(self.flow_add.load(Ordering::Relaxed))
    }
    fn has_nat(&self, _: Hook) -> bool {
        false
    }
    fn established_accepted(&self) -> bool {
        !self.per_packet.load(Ordering::Relaxed)
    }
}

fn worker() -> (Worker, Arc<Accept>) {
    let cfg = EngineConfig {
        interfaces: vec![
            Interface {
                name: "in".into(),
                mac: GW_IN_MAC,
                addrs: vec![],
                mtu: Interface::DEFAULT_MTU,
            },
            Interface {
                name: "out".into(),
                mac: GW_OUT_MAC,
                addrs: vec![],
                mtu: OUT_MTU,
            },
        ],
        addrs6: vec![
            (INSIDE, ip("fd00:1::1"), 64),
            (OUTSIDE, ip("2001:db8:ffff::1"), 64),
        ],
        routes6: vec![Route6 {
            net: 0,
            len: 0,
            oif: OUTSIDE,
            via: Some(ip(ROUTER_LL)),
        }],
        neighbors6: vec![
            (OUTSIDE, ip(ROUTER_LL), ROUTER_MAC),
            (INSIDE, ip(HOST), HOST_MAC),
        ],
        ct6_max: 1000,
        offload_queue: 64,
        ..EngineConfig::default()
    };
    let p = Arc::new(Accept {
        per_packet: AtomicBool::new(false),
        flow_add: AtomicBool::new(false),
    });
    let w = Worker::new(cfg, Arc::clone(&p) as Arc<dyn Policy>).unwrap();
    (w, p)
}

fn key(p: u8, sport: u16) -> FlowKey6 {
    FlowKey6::new(p, ip(HOST), sport, ip(REMOTE), 443)
}

/// A frame of `k` arriving on `iif` (TCP with `flags`, or UDP for 0 with
/// a UDP key).
fn frame(iif: IfIndex, k: &FlowKey6, flags: u8) -> (IfIndex, Vec<u8>) {
    let mut b = vec![0u8; 2048];
    let (s, d) = if iif == INSIDE {
        (HOST_MAC, GW_IN_MAC)
    } else {
        (ROUTER_MAC, GW_OUT_MAC)
    };
    let n = if k.proto == proto::TCP {
        build_tcp6(&mut b, s, d, k, flags, 1, 1, 10).unwrap()
    } else {
        build_udp6(&mut b, s, d, k, 20).unwrap()
    };
    b.truncate(n);
    (iif, b)
}

fn installs(ops: &[OffloadOp]) -> Vec<OffloadFlow6> {
    ops.iter()
        .filter_map(|o| match o {
            OffloadOp::Install6(f) => Some(*f),
            OffloadOp::Install(f) => panic!("an IPv4 install for IPv6: {f:?}"),
            _ => None,
        })
        .collect()
}

fn removals(ops: &[OffloadOp]) -> Vec<FlowKey6> {
    ops.iter()
        .filter_map(|o| match o {
            OffloadOp::Remove6 { key, .. } => Some(*key),
            _ => None,
        })
        .collect()
}

/// What the lower layer does with a frame of `f` (as the XDP program does
/// it): the request's MACs, the hop limit decremented.
fn lower_layer(f: &OffloadFlow6, frame: &[u8]) -> Vec<u8> {
    let mut b = frame.to_vec();
    b[21] -= 1;
    f.adj.write_macs(&mut b);
    b
}

#[test]
fn both_directions_are_offloaded_with_the_fast_paths_own_forwarding() {
    for p in [proto::UDP, proto::TCP] {
        let (mut w, _) = worker();
        let k = key(p, 5000);
        let r = k.reversed();
        if p == proto::TCP {
            send(&mut w, 1_000_000, &frame(INSIDE, &k, tf::SYN));
            send(&mut w, 2_000_000, &frame(OUTSIDE, &r, tf::SYN | tf::ACK));
            assert!(ops(&mut w).is_empty(), "not offloaded before ESTABLISHED");
        } else {
            assert_eq!(
                send(&mut w, 1_000_000, &frame(INSIDE, &k, 0)).0,
                Action::Forward(OUTSIDE)
            );
            assert!(ops(&mut w).is_empty(), "the slow path offloads nothing");
        }
        let out = frame(INSIDE, &k, tf::ACK);
        let (act, sent) = send(&mut w, 3_000_000, &out);
        assert_eq!(act, Action::Forward(OUTSIDE));
        let o = ops(&mut w);
        let fl = installs(&o);
        assert_eq!(fl.len(), 2, "{p}: {o:?}");
        let orig = fl.iter().find(|f| f.key == k).expect("original direction");
        let back = fl.iter().find(|f| f.key == r).expect("reply direction");
        assert_eq!((orig.iif, orig.adj.oif), (INSIDE, OUTSIDE));
        assert_eq!((back.iif, back.adj.oif), (OUTSIDE, INSIDE));
        assert_eq!(orig.adj.mtu, OUT_MTU, "the egress MTU");
        assert_eq!(orig.adj.dst_mac, ROUTER_MAC);
        assert_eq!(lower_layer(orig, &out.1), sent, "{p}: as the fast path");
        let inb = frame(OUTSIDE, &r, tf::ACK);
        let (act, sent) = send(&mut w, 4_000_000, &inb);
        assert_eq!(act, Action::Forward(INSIDE));
        assert_eq!(
            lower_layer(back, &inb.1),
            sent,
            "{p}: reply as the fast path"
        );
        assert!(ops(&mut w).is_empty(), "installed once");
        let (_, e) = w.conntrack6().iter().next().unwrap();
        assert_eq!(w.offloaded_directions6(e).count(), 2);
    }
}

#[test]
fn a_tcp_connection_leaving_established_is_taken_back() {
    let (mut w, _) = worker();
    let k = key(proto::TCP, 6000);
    let r = k.reversed();
    send(&mut w, 1_000_000, &frame(INSIDE, &k, tf::SYN));
    send(&mut w, 2_000_000, &frame(OUTSIDE, &r, tf::SYN | tf::ACK));
    send(&mut w, 3_000_000, &frame(INSIDE, &k, tf::ACK));
    assert_eq!(installs(&ops(&mut w)).len(), 2);
    let (act, _) = send(&mut w, 4_000_000, &frame(INSIDE, &k, tf::FIN | tf::ACK));
    assert_eq!(act, Action::Forward(OUTSIDE));
    let gone = removals(&ops(&mut w));
    assert_eq!(gone.len(), 2, "{gone:?}");
    assert!(gone.contains(&k) && gone.contains(&r));
    send(&mut w, 5_000_000, &frame(OUTSIDE, &r, tf::ACK));
    assert!(installs(&ops(&mut w)).is_empty(), "not offloaded again");
    // A reset removes the entry: nothing left to take back twice.
    let k2 = key(proto::TCP, 6001);
    send(&mut w, 6_000_000, &frame(INSIDE, &k2, tf::SYN));
    send(
        &mut w,
        6_100_000,
        &frame(OUTSIDE, &k2.reversed(), tf::SYN | tf::ACK),
    );
    send(&mut w, 6_200_000, &frame(INSIDE, &k2, tf::ACK));
    assert_eq!(installs(&ops(&mut w)).len(), 2);
    send(&mut w, 6_300_000, &frame(INSIDE, &k2, tf::RST));
    assert_eq!(removals(&ops(&mut w)).len(), 2);
}

/// Answers with `.0` for IPv6 directions, counts the questions; IPv4 is
/// never asked here.
struct Probe(Option<u64>, usize);

impl OffloadProbe for Probe {
    fn last_used_ns(&mut self, _: IfIndex, k: &FlowKey4) -> Option<u64> {
        panic!("asked about IPv4 {k:?}")
    }
    fn last_used6_ns(&mut self, _: IfIndex, _: &FlowKey6) -> Option<u64> {
        self.1 += 1;
        self.0
    }
}

#[test]
fn the_gc_keeps_connections_the_lower_layer_still_forwards() {
    let (mut w, _) = worker();
    let k = key(proto::UDP, 7000);
    send(&mut w, 1_000_000_000, &frame(INSIDE, &k, 0));
    send(&mut w, 1_100_000_000, &frame(INSIDE, &k, 0));
    assert_eq!(installs(&ops(&mut w)).len(), 2);
    // 40 s later (UDP's 30 s are over), used 1 s ago: it stays.
    let now = 41_000_000_000;
    let mut used = Probe(Some(now - 1_000_000_000), 0);
    assert_eq!(w.gc_with(now, 1000, &mut used), 0);
    assert_eq!(used.1, 2, "asked about both directions");
    assert_eq!(w.conntrack6().len(), 1);
    let (_, e) = w.conntrack6().iter().next().unwrap();
    assert!(
        e.is_assured() && e.seen_reply(),
        "replies seen by the lower layer count"
    );
    // Not used for longer than the stream timeout: removed, taken back.
    let later = now + 121_000_000_000;
    assert_eq!(w.gc_with(later, 1000, &mut used), 1);
    assert_eq!(w.conntrack6().len(), 0);
    assert_eq!(removals(&ops(&mut w)).len(), 2);
    // A connection that is not offloaded never asks.
    let mut never = Probe(None, 0);
    send(&mut w, later, &frame(INSIDE, &key(proto::UDP, 7001), 0));
    assert_eq!(w.gc_with(later + 40_000_000_000, 1000, &mut never), 1);
    assert_eq!(never.1, 0);
}

#[test]
fn filtering_a_new_or_forgotten_neighbour_a_route_change_and_a_flush_take_it_back() {
    let (mut w, p) = worker();
    let k = key(proto::UDP, 8000);
    let again = |w: &mut Worker, now: u64| {
        send(w, now, &frame(INSIDE, &k, 0));
        installs(&ops(w))
    };
    send(&mut w, 1_000_000, &frame(INSIDE, &k, 0));
    assert_eq!(again(&mut w, 2_000_000).len(), 2);
    // The policy starts filtering established packets.
    p.per_packet.store(true, Ordering::Relaxed);
    w.set_policy(Arc::clone(&p) as Arc<dyn Policy>);
    assert_eq!(ops(&mut w), [OffloadOp::Clear]);
    assert!(
        again(&mut w, 3_000_000).is_empty(),
        "nothing while filtering"
    );
    p.per_packet.store(false, Ordering::Relaxed);
    w.set_policy(Arc::clone(&p) as Arc<dyn Policy>);
    assert_eq!(again(&mut w, 4_000_000).len(), 2);
    // The router's MAC changes.
    w.set_neighbor6(OUTSIDE, ip(ROUTER_LL), [2, 0, 0, 0, 7, 7])
        .unwrap();
    assert_eq!(ops(&mut w), [OffloadOp::Clear]);
    let fl = again(&mut w, 5_000_000);
    assert!(fl.iter().any(|f| f.adj.dst_mac == [2, 0, 0, 0, 7, 7]));
    // The same MAC learnt again takes nothing back.
    w.set_neighbor6(OUTSIDE, ip(ROUTER_LL), [2, 0, 0, 0, 7, 7])
        .unwrap();
    assert!(ops(&mut w).is_empty());
    // The router is forgotten (stopped answering probes).
    assert!(w.clear_neighbor6(OUTSIDE, ip(ROUTER_LL)));
    assert_eq!(ops(&mut w), [OffloadOp::Clear]);
    w.set_neighbor6(OUTSIDE, ip(ROUTER_LL), ROUTER_MAC).unwrap();
    assert_eq!(again(&mut w, 6_000_000).len(), 2);
    // A route change takes everything back, and the walk moves the
    // connection to the new next hop.
    let r2 = Route6 {
        net: 0,
        len: 0,
        oif: OUTSIDE,
        via: Some(ip("fe80::2")),
    };
    w.set_routes(&[], &[r2]).unwrap();
    assert_eq!(ops(&mut w), [OffloadOp::Clear]);
    w.set_neighbor6(OUTSIDE, ip("fe80::2"), [2, 0, 0, 0, 8, 9])
        .unwrap();
    w.gc(7_000_000, 4096);
    let fl = again(&mut w, 8_000_000);
    assert!(
        fl.iter().any(|f| f.adj.dst_mac == [2, 0, 0, 0, 8, 9]),
        "{fl:?}"
    );
    // A link going down.
    w.set_link_up(OUTSIDE, false);
    assert_eq!(ops(&mut w), [OffloadOp::Clear]);
    w.set_link_up(OUTSIDE, true);
    assert_eq!(again(&mut w, 9_000_000).len(), 2);
    w.flush();
    assert_eq!(ops(&mut w), [OffloadOp::Clear]);
}

/// A route change seen by the walk (not by `set_routes`): an offloaded
/// connection whose next hop moves is taken back one by one.
#[test]
fn the_reroute_walk_takes_back_a_connection_whose_next_hop_moved() {
    let (mut w, _) = worker();
    let k = key(proto::UDP, 8100);
    send(&mut w, 1_000_000, &frame(INSIDE, &k, 0));
    send(&mut w, 2_000_000, &frame(INSIDE, &k, 0));
    assert_eq!(installs(&ops(&mut w)).len(), 2);
    let r2 = Route6 {
        net: 0,
        len: 0,
        oif: OUTSIDE,
        via: Some(ip("fe80::2")),
    };
    w.set_routes(&[], &[r2]).unwrap();
    assert_eq!(ops(&mut w), [OffloadOp::Clear]);
    // The packet before the walk re-offloads on the old path ...
    send(&mut w, 3_000_000, &frame(INSIDE, &k, 0));
    assert_eq!(installs(&ops(&mut w)).len(), 2);
    // ... and the walk, moving it, takes both directions back.
    w.gc(4_000_000, 4096);
    let o = ops(&mut w);
    assert_eq!(removals(&o).len(), 2, "{o:?}");
}

/// With a rule set that filters established packets, only an IPv6
/// connection in a flowtable goes to the lower layer, and a FIN (which
/// takes it out of the flowtable) takes it back; without a flowtable,
/// nothing is offloaded.
#[test]
fn a_flowtable_connection_is_offloaded_despite_per_packet_filtering() {
    let (mut w, p) = worker();
    p.per_packet.store(true, Ordering::Relaxed);
    p.flow_add.store(true, Ordering::Relaxed);
    w.set_policy(Arc::clone(&p) as Arc<dyn Policy>);
    let k = key(proto::TCP, 6100);
    let r = k.reversed();
    send(&mut w, 1_000_000, &frame(INSIDE, &k, tf::SYN));
    send(&mut w, 2_000_000, &frame(OUTSIDE, &r, tf::SYN | tf::ACK));
    assert!(installs(&ops(&mut w)).is_empty(), "not established yet");
    send(&mut w, 3_000_000, &frame(INSIDE, &k, tf::ACK));
    send(&mut w, 3_500_000, &frame(OUTSIDE, &r, tf::ACK));
    assert_eq!(installs(&ops(&mut w)).len(), 2);
    let (act, _) = send(&mut w, 4_000_000, &frame(INSIDE, &k, tf::FIN | tf::ACK));
    assert_eq!(act, Action::Forward(OUTSIDE));
    assert_eq!(removals(&ops(&mut w)).len(), 2);
    p.flow_add.store(false, Ordering::Relaxed);
    w.set_policy(Arc::clone(&p) as Arc<dyn Policy>);
    let u = key(proto::UDP, 6101);
    for now in [5_000_000, 6_000_000, 7_000_000] {
        send(&mut w, now, &frame(INSIDE, &u, 0));
    }
    assert!(
        installs(&ops(&mut w)).is_empty(),
        "filtered per packet: not offloaded"
    );
}
