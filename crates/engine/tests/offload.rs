//! Flow offload requests (`sluice_engine::offload`): what the worker hands
//! to the lower layer must be exactly its own fast path's rewrite, and it
//! must take offloads back whenever the fast path alone no longer decides.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

mod common;

use common::*;
use sluice_engine::offload::{OffloadFlow, OffloadOp, OffloadProbe};
use sluice_engine::{
    Action, CtState, Decision, Hook, IfIndex, Policy, PolicyPacket, Worker, REINSTALL_EVERY,
};
use sluice_nat::{PoolId, Translation};
use sluice_wire::build::{build_tcp4, build_udp4};
use sluice_wire::flow::{proto, FlowKey4, FlowKey6};
use sluice_wire::tcp::flags as tf;

/// Accepts everything, SNATs new connections to the pool; established
/// packets accepted up front unless `per_packet`.
struct Accept {
    per_packet: AtomicBool,
    /// Its forward hook runs `flow add` (a flowtable of generation 1).
    flow_add: AtomicBool,
}

impl Policy for Accept {
    fn decide(&self, hook: Hook, pkt: &PolicyPacket) -> Decision {
        Decision {
            nat: (hook == Hook::Postrouting && pkt.ct == CtState::New)
                .then_some(Translation::Snat { pool: PoolId(0) }),
            flow_add: hook == Hook::Forward && self.flow_add.load(Ordering::Relaxed),
            ct_timeout: 0,
            ..Decision::accept(pkt)
        }
    }
    fn flowtables(&self) -> u64 {
        u64::from(self.flow_add.load(Ordering::Relaxed))
    }
    fn has_nat(&self, hook: Hook) -> bool {
        hook == Hook::Postrouting
    }
    fn established_accepted(&self) -> bool {
        !self.per_packet.load(Ordering::Relaxed)
    }
}

fn worker() -> (Worker, Arc<Accept>) {
    let mut cfg = nat_gateway(0, 1);
    cfg.offload_queue = 64;
    let p = Arc::new(Accept {
        per_packet: AtomicBool::new(false),
        flow_add: AtomicBool::new(false),
    });
    let w = Worker::new(cfg, Arc::clone(&p) as Arc<dyn Policy>).unwrap();
    (w, p)
}

fn key(p: u8, sport: u16) -> FlowKey4 {
    FlowKey4 {
        src: u32::from(HOST),
        dst: u32::from(REMOTE),
        sport,
        dport: 80,
        proto: p,
    }
}

fn udp(iif: IfIndex, k: &FlowKey4) -> (IfIndex, Vec<u8>) {
    let mut b = vec![0u8; 2048];
    let (s, d) = if iif == INSIDE {
        (HOST_MAC, GW_IN_MAC)
    } else {
        (ROUTER_MAC, GW_OUT_MAC)
    };
    let n = build_udp4(&mut b, s, d, k, 20).unwrap();
    b.truncate(n);
    (iif, b)
}

fn tcp(iif: IfIndex, k: &FlowKey4, flags: u8) -> (IfIndex, Vec<u8>) {
    let mut b = vec![0u8; 2048];
    let (s, d) = if iif == INSIDE {
        (HOST_MAC, GW_IN_MAC)
    } else {
        (ROUTER_MAC, GW_OUT_MAC)
    };
    let n = build_tcp4(&mut b, s, d, k, flags, 1, 1, 10).unwrap();
    b.truncate(n);
    (iif, b)
}

fn installs(ops: &[OffloadOp]) -> Vec<OffloadFlow> {
    ops.iter()
        .filter_map(|o| match o {
            OffloadOp::Install(f) => Some(*f),
            _ => None,
        })
        .collect()
}

/// What the lower layer does with a frame of `f` (as the XDP program
/// does it: the checksum deltas, TTL, tuple and MACs of the request).
fn lower_layer(f: &OffloadFlow, frame: &[u8]) -> Vec<u8> {
    let mut b = frame.to_vec();
    sluice_nat::apply_dissected(&mut b, 14, 34, &f.to, (f.ip_delta, f.l4_delta), true).unwrap();
    f.adj.write_macs(&mut b);
    b
}

/// The connection's reply as it arrives from outside.
fn reply_of(w: &Worker) -> FlowKey4 {
    w.conntrack().iter().next().map(|(_, e)| e.reply()).unwrap()
}

#[test]
fn both_directions_are_offloaded_with_the_fast_paths_own_rewrite() {
    for p in [proto::UDP, proto::TCP] {
        let (mut w, _) = worker();
        let k = key(p, 5000);
        let pkt = |iif, k: &FlowKey4| {
            if p == proto::UDP {
                udp(iif, k)
            } else {
                tcp(iif, k, tf::ACK)
            }
        };
        if p == proto::TCP {
            // Handshake: nothing is offloaded before ESTABLISHED.
            assert_eq!(
                send(&mut w, 1_000_000, &tcp(INSIDE, &k, tf::SYN)).0,
                Action::Forward(OUTSIDE)
            );
            let r = reply_of(&w);
            assert_eq!(
                send(&mut w, 2_000_000, &tcp(OUTSIDE, &r, tf::SYN | tf::ACK)).0,
                Action::Forward(INSIDE)
            );
            assert!(ops(&mut w).is_empty(), "not offloaded before ESTABLISHED");
        } else {
            assert_eq!(
                send(&mut w, 1_000_000, &pkt(INSIDE, &k)).0,
                Action::Forward(OUTSIDE)
            );
            assert!(ops(&mut w).is_empty(), "the slow path offloads nothing");
        }
        // The next fast-path packet offloads both directions.
        let out = pkt(INSIDE, &k);
        let (act, sent) = send(&mut w, 3_000_000, &out);
        assert_eq!(act, Action::Forward(OUTSIDE));
        let o = ops(&mut w);
        let fl = installs(&o);
        assert_eq!(fl.len(), 2, "{p}: {o:?}");
        let r = reply_of(&w);
        let orig = fl.iter().find(|f| f.key == k).expect("original direction");
        let back = fl.iter().find(|f| f.key == r).expect("reply direction");
        assert_eq!((orig.iif, orig.adj.oif), (INSIDE, OUTSIDE));
        assert_eq!((back.iif, back.adj.oif), (OUTSIDE, INSIDE));
        assert_eq!(
            lower_layer(orig, &out.1),
            sent,
            "{p}: original as the fast path"
        );
        // The reply: what the engine's fast path sends equals the request.
        let inb = pkt(OUTSIDE, &r);
        let (act, sent) = send(&mut w, 4_000_000, &inb);
        assert_eq!(act, Action::Forward(INSIDE));
        assert_eq!(
            lower_layer(back, &inb.1),
            sent,
            "{p}: reply as the fast path"
        );
        assert!(ops(&mut w).is_empty(), "installed once");
    }
}

/// A table that lost an offloaded connection (a clear by another worker
/// sharing it, an install that found no room) gets it back: every
/// `REINSTALL_EVERY`th packet of the connection that the engine sees
/// installs both directions again, the same requests as the first time;
/// the packets in between install nothing.
#[test]
fn an_offloaded_connection_the_engine_keeps_seeing_is_installed_again() {
    let (mut w, _) = worker();
    let k = key(proto::UDP, 5000);
    send(&mut w, 1_000_000, &udp(INSIDE, &k));
    send(&mut w, 2_000_000, &udp(INSIDE, &k));
    let first = installs(&ops(&mut w));
    assert_eq!(first.len(), 2);
    let r = reply_of(&w);
    let mut t = 3_000_000;
    let mut again = Vec::new();
    // Both directions keep reaching the engine, as when the lower layer
    // lost them.
    for i in 0..3 * REINSTALL_EVERY {
        let f = if i % 2 == 0 {
            udp(INSIDE, &k)
        } else {
            udp(OUTSIDE, &r)
        };
        t += 1_000;
        assert!(matches!(send(&mut w, t, &f).0, Action::Forward(_)));
        let packets = w.conntrack().iter().next().unwrap().1.packets();
        let fl = installs(&ops(&mut w));
        if packets % REINSTALL_EVERY == 0 {
            assert_eq!(fl.len(), 2, "at packet {packets}");
            again.push(fl);
        } else {
            assert!(fl.is_empty(), "at packet {packets}: {fl:?}");
        }
    }
    assert_eq!(again.len(), 3);
    for fl in again {
        for f in &first {
            assert!(fl.contains(f), "{f:?} installed again as it was");
        }
    }
}

#[test]
fn a_tcp_connection_leaving_established_is_taken_back() {
    let (mut w, _) = worker();
    let k = key(proto::TCP, 6000);
    send(&mut w, 1_000_000, &tcp(INSIDE, &k, tf::SYN));
    let r = reply_of(&w);
    send(&mut w, 2_000_000, &tcp(OUTSIDE, &r, tf::SYN | tf::ACK));
    send(&mut w, 3_000_000, &tcp(INSIDE, &k, tf::ACK));
    assert_eq!(installs(&ops(&mut w)).len(), 2);
    // FIN (the lower layer passes it up): both directions come back.
    let (act, _) = send(&mut w, 4_000_000, &tcp(INSIDE, &k, tf::FIN | tf::ACK));
    assert_eq!(act, Action::Forward(OUTSIDE));
    let o = ops(&mut w);
    let removed: Vec<FlowKey4> = o
        .iter()
        .filter_map(|o| match o {
            OffloadOp::Remove { key, .. } => Some(*key),
            _ => None,
        })
        .collect();
    assert_eq!(removed.len(), 2, "{o:?}");
    assert!(removed.contains(&k) && removed.contains(&r));
    // And is not offloaded again.
    send(&mut w, 5_000_000, &tcp(OUTSIDE, &r, tf::ACK));
    assert!(installs(&ops(&mut w)).is_empty());
}

struct Probe(Option<u64>, usize);

impl OffloadProbe for Probe {
    fn last_used_ns(&mut self, _: IfIndex, _: &FlowKey4) -> Option<u64> {
        self.1 += 1;
        self.0
    }
    fn last_used6_ns(&mut self, _: IfIndex, k: &FlowKey6) -> Option<u64> {
        panic!("asked about IPv6 {k:?}")
    }
}

#[test]
fn the_gc_keeps_connections_the_lower_layer_still_forwards() {
    let (mut w, _) = worker();
    let k = key(proto::UDP, 7000);
    send(&mut w, 1_000_000_000, &udp(INSIDE, &k));
    send(&mut w, 1_100_000_000, &udp(INSIDE, &k));
    assert_eq!(installs(&ops(&mut w)).len(), 2);
    // 40 s later (UDP's 30 s are over): used 1 s ago below, so it stays.
    let now = 41_000_000_000;
    let mut used = Probe(Some(now - 1_000_000_000), 0);
    assert_eq!(w.gc_with(now, 1000, &mut used), 0);
    assert_eq!(used.1, 2, "asked about both directions");
    assert_eq!(w.conntrack().len(), 1);
    assert!(ops(&mut w).is_empty());
    // The probe reported use in the reply direction too: the connection
    // became an assured UDP stream (120 s), as the replies would have made
    // it had the engine seen them.
    let (_, e) = w.conntrack().iter().next().unwrap();
    assert!(e.is_assured() && e.seen_reply());
    assert_eq!(e.state().name(), "STREAM");
    // Not used for longer than the timeout: removed, offload taken back.
    let later = now + 121_000_000_000;
    assert_eq!(w.gc_with(later, 1000, &mut used), 1);
    assert_eq!(w.conntrack().len(), 0);
    let o = ops(&mut w);
    assert_eq!(
        o.iter()
            .filter(|o| matches!(o, OffloadOp::Remove { .. }))
            .count(),
        2,
        "{o:?}"
    );
    // A connection that is not offloaded never asks.
    let mut never = Probe(None, 0);
    let k2 = key(proto::UDP, 7001);
    send(&mut w, later, &udp(INSIDE, &k2));
    assert_eq!(w.gc_with(later + 40_000_000_000, 1000, &mut never), 1);
    assert_eq!(never.1, 0);
}

#[test]
fn per_packet_filtering_a_flush_and_a_new_neighbour_mac_take_everything_back() {
    let (mut w, p) = worker();
    let k = key(proto::UDP, 8000);
    send(&mut w, 1_000_000, &udp(INSIDE, &k));
    send(&mut w, 2_000_000, &udp(INSIDE, &k));
    assert_eq!(installs(&ops(&mut w)).len(), 2);
    // The policy starts filtering established packets.
    p.per_packet.store(true, Ordering::Relaxed);
    w.set_policy(Arc::clone(&p) as Arc<dyn Policy>);
    assert_eq!(ops(&mut w), [OffloadOp::Clear]);
    send(&mut w, 3_000_000, &udp(INSIDE, &k));
    assert!(ops(&mut w).is_empty(), "nothing offloaded while filtering");
    // Accepted up front again: offloaded again on the next packet.
    p.per_packet.store(false, Ordering::Relaxed);
    w.set_policy(Arc::clone(&p) as Arc<dyn Policy>);
    send(&mut w, 4_000_000, &udp(INSIDE, &k));
    assert_eq!(installs(&ops(&mut w)).len(), 2);
    // The router's MAC changes.
    w.set_neighbor(
        std::net::Ipv4Addr::new(203, 0, 113, 254),
        [2, 0, 0, 0, 7, 7],
    )
    .unwrap();
    assert_eq!(ops(&mut w), [OffloadOp::Clear]);
    send(&mut w, 5_000_000, &udp(INSIDE, &k));
    let fl = installs(&ops(&mut w));
    assert_eq!(fl.len(), 2);
    assert!(fl.iter().any(|f| f.adj.dst_mac == [2, 0, 0, 0, 7, 7]));
    // Flush.
    w.flush();
    assert_eq!(ops(&mut w), [OffloadOp::Clear]);
}

/// With a rule set that filters established packets, only a connection in
/// a flowtable goes to the lower layer, and a FIN (which takes it out of
/// the flowtable) takes it back.
#[test]
fn a_flowtable_connection_is_offloaded_despite_per_packet_filtering() {
    let (mut w, p) = worker();
    p.per_packet.store(true, Ordering::Relaxed);
    p.flow_add.store(true, Ordering::Relaxed);
    w.set_policy(Arc::clone(&p) as Arc<dyn Policy>);
    let k = key(proto::TCP, 6100);
    send(&mut w, 1_000_000, &tcp(INSIDE, &k, tf::SYN));
    let r = reply_of(&w);
    send(&mut w, 2_000_000, &tcp(OUTSIDE, &r, tf::SYN | tf::ACK));
    assert!(installs(&ops(&mut w)).is_empty(), "not established yet");
    // The ACK meets `flow add` and joins the flowtable; the next packet
    // is offloaded.
    send(&mut w, 3_000_000, &tcp(INSIDE, &k, tf::ACK));
    send(&mut w, 3_500_000, &tcp(OUTSIDE, &r, tf::ACK));
    assert_eq!(installs(&ops(&mut w)).len(), 2);
    let (act, _) = send(&mut w, 4_000_000, &tcp(INSIDE, &k, tf::FIN | tf::ACK));
    assert_eq!(act, Action::Forward(OUTSIDE));
    let removed = ops(&mut w)
        .iter()
        .filter(|o| matches!(o, OffloadOp::Remove { .. }))
        .count();
    assert_eq!(removed, 2);
    // Without a flowtable, per-packet filtering offloads nothing.
    p.flow_add.store(false, Ordering::Relaxed);
    w.set_policy(Arc::clone(&p) as Arc<dyn Policy>);
    let k = key(proto::UDP, 6101);
    send(&mut w, 5_000_000, &udp(INSIDE, &k));
    let r = w
        .conntrack()
        .iter()
        .find(|(_, e)| e.orig() == k)
        .map(|(_, e)| e.reply())
        .unwrap();
    send(&mut w, 6_000_000, &udp(OUTSIDE, &r));
    send(&mut w, 7_000_000, &udp(INSIDE, &k));
    assert!(installs(&ops(&mut w)).is_empty());
}

/// A link going down takes every offloaded direction back; while it is
/// down nothing through it is offloaded (its packets are dropped as
/// `link-down`); up again, the next packet offloads the connection again.
#[test]
fn a_link_going_down_takes_the_offload_back() {
    let (mut w, _) = worker();
    let k = key(proto::UDP, 9000);
    send(&mut w, 1_000_000, &udp(INSIDE, &k));
    send(&mut w, 2_000_000, &udp(INSIDE, &k));
    assert_eq!(installs(&ops(&mut w)).len(), 2);
    w.set_link_up(OUTSIDE, false);
    assert_eq!(ops(&mut w), [OffloadOp::Clear]);
    assert_eq!(
        send(&mut w, 3_000_000, &udp(INSIDE, &k)).0,
        Action::Drop(sluice_engine::DropReason::LinkDown)
    );
    assert!(ops(&mut w).is_empty(), "nothing offloaded while down");
    w.set_link_up(OUTSIDE, true);
    assert!(ops(&mut w).is_empty(), "coming up takes nothing back");
    assert_eq!(
        send(&mut w, 4_000_000, &udp(INSIDE, &k)).0,
        Action::Forward(OUTSIDE)
    );
    assert_eq!(installs(&ops(&mut w)).len(), 2);
}

/// `conntrack flush` / `count` with a filter (`Worker::walk_step`): a walk
/// in small steps selects exactly the connections its predicate names,
/// counts them, and with `remove` removes them as an expiry would (NAT
/// mappings released, offloaded directions taken back), leaving the rest.
#[test]
fn a_filtered_walk_counts_or_removes_exactly_the_selected_connections() {
    let (mut w, _) = worker();
    for i in 0..10u16 {
        let k = key(proto::UDP, 7100 + i);
        send(&mut w, 1_000_000, &udp(INSIDE, &k));
        send(&mut w, 2_000_000, &udp(INSIDE, &k));
    }
    assert_eq!(installs(&ops(&mut w)).len(), 20);
    assert_eq!(w.conntrack().len(), 10);
    let mappings = w.nat().stats().mappings;
    assert_eq!(mappings, 10);
    // Source ports 7100-7104.
    let pick = |e: &sluice_conntrack::Entry<FlowKey4, sluice_engine::worker::FlowInfo>| {
        (7100..7105).contains(&e.orig().sport)
    };
    let run = |w: &mut Worker, remove: bool| -> (u64, usize) {
        let mut walk = sluice_engine::Walk::new(remove);
        let mut steps = 0;
        while !w.walk_step(&mut walk, 3, &mut |_, e| pick(e), &mut |_, _| false) {
            steps += 1;
            assert!(steps < 10_000, "the walk ends");
        }
        (walk.matched, steps)
    };
    // Counting changes nothing.
    let (n, steps) = run(&mut w, false);
    assert_eq!(n, 5);
    assert!(steps >= 3, "{steps} steps of 3 slots");
    assert_eq!(w.conntrack().len(), 10);
    assert!(ops(&mut w).is_empty());
    // Removing: the five go, with their mappings and offloads.
    assert_eq!(run(&mut w, true).0, 5);
    assert_eq!(w.conntrack().len(), 5);
    assert!(w.conntrack().iter().all(|(_, e)| !pick(e)));
    let o = ops(&mut w);
    let removed = o
        .iter()
        .filter(|o| matches!(o, OffloadOp::Remove { .. }))
        .count();
    assert_eq!(removed, 10, "{o:?}");
    assert_eq!(w.nat().stats().mappings, 5, "mappings released");
    // Nothing left to select.
    assert_eq!(run(&mut w, true).0, 0);
    assert_eq!(w.conntrack().len(), 5);
}
