//! Packets of established connections and the filter chains.
//!
//! When the policy says it accepts every established packet up front
//! ([`Policy::established_accepted`], true for `ct state established accept`
//! at the head of every filter chain), the fast path forwards them on the
//! connection state alone. When it does not, the engine runs the
//! prerouting, forward and postrouting filter chains for each established
//! packet, as netfilter does, and sees the packet as netfilter's hooks see
//! it: as received at prerouting, with NAT undone or applied to the
//! destination but not yet to the source at forward and postrouting.

use std::sync::atomic::{AtomicBool, AtomicU16, Ordering};
use std::sync::{Arc, Mutex};

mod common;

use common::*;
use sluice_engine::{
    Action, CtState, Decision, DropReason, Hook, Policy, PolicyPacket, Verdict, Worker,
};
use sluice_nat::{PoolId, Translation};
use sluice_wire::build::{build_tcp4, build_udp4};
use sluice_wire::flow::{proto, FlowKey4};

/// Accepts new connections; drops established packets to or from
/// `blocked` (0: none) at the forward hook; SNATs to the pool at
/// postrouting. Records what each hook saw.
struct TestPolicy {
    per_packet: AtomicBool,
    blocked: AtomicU16,
    seen: Mutex<Vec<(Hook, PolicyPacket)>>,
}

impl Policy for TestPolicy {
    fn decide(&self, hook: Hook, pkt: &PolicyPacket) -> Decision {
        if let Ok(mut s) = self.seen.lock() {
            s.push((hook, *pkt));
        }
        let b = self.blocked.load(Ordering::Relaxed);
        let verdict = if hook == Hook::Forward
            && pkt.ct == CtState::Established
            && b != 0
            && (pkt.dport == b || pkt.sport == b)
        {
            Verdict::Drop
        } else {
            Verdict::Accept
        };
        let nat = (hook == Hook::Postrouting && pkt.ct == CtState::New)
            .then_some(Translation::Snat { pool: PoolId(0) });
        Decision {
            verdict,
            mark: pkt.mark,
            nat,
            ct_mark: pkt.ct_mark,
            mss: Default::default(),
            flow_add: false,
            ct_timeout: 0,
        }
    }
    fn has_nat(&self, hook: Hook) -> bool {
        hook == Hook::Postrouting
    }
    fn established_accepted(&self) -> bool {
        !self.per_packet.load(Ordering::Relaxed)
    }
}

fn setup(per_packet: bool) -> (Worker, Arc<TestPolicy>) {
    let cfg = nat_gateway(0, 1);
    let p = Arc::new(TestPolicy {
        per_packet: AtomicBool::new(per_packet),
        blocked: AtomicU16::new(0),
        seen: Mutex::new(Vec::new()),
    });
    let w = Worker::new(cfg, Arc::clone(&p) as Arc<dyn Policy>).unwrap();
    (w, p)
}

fn key(sport: u16) -> FlowKey4 {
    FlowKey4 {
        src: u32::from(HOST),
        dst: u32::from(REMOTE),
        sport,
        dport: 53,
        proto: proto::UDP,
    }
}

/// Sends one packet from the host and, if `reply`, one back from the
/// remote (to the translated tuple); returns the actions.
fn exchange(w: &mut Worker, now: u64, k: &FlowKey4, reply: Option<&FlowKey4>) -> Vec<Action> {
    let mut f = TestFrames::default();
    f.push(INSIDE, |b| {
        build_udp4(b, HOST_MAC, GW_IN_MAC, k, 20).unwrap()
    });
    if let Some(r) = reply {
        f.push(OUTSIDE, |b| {
            build_udp4(b, ROUTER_MAC, GW_OUT_MAC, r, 20).unwrap()
        });
    }
    w.process(now, &mut f);
    f.acts.clone()
}

#[test]
fn established_packets_meet_the_filter_chains_when_the_policy_asks() {
    let (mut w, p) = setup(true);
    let k = key(5000);
    assert_eq!(
        exchange(&mut w, 1_000_000, &k, None),
        [Action::Forward(OUTSIDE)]
    );
    let reply = w
        .conntrack()
        .iter()
        .next()
        .map(|(_, e)| e.reply().reversed())
        .unwrap();
    let back = reply.reversed();
    assert_eq!(back.dst, u32::from(POOL), "the reply goes to the pool");
    // Established both ways, accepted.
    p.seen.lock().unwrap().clear();
    assert_eq!(
        exchange(&mut w, 2_000_000, &k, Some(&back)),
        [Action::Forward(OUTSIDE), Action::Forward(INSIDE)]
    );
    // What the hooks saw: prerouting the packet as received, forward and
    // postrouting with the destination translated back and the source not
    // yet translated, ct state established, and the egress interface.
    let seen = p.seen.lock().unwrap().clone();
    let view = |hook: Hook, from_inside: bool| {
        seen.iter()
            .find(|(h, pp)| *h == hook && (pp.iif == INSIDE) == from_inside)
            .map(|(_, pp)| *pp)
            .unwrap_or_else(|| panic!("{hook:?} not run: {seen:?}"))
    };
    let pre_out = view(Hook::Prerouting, true);
    assert_eq!(
        (pre_out.src, pre_out.dst),
        (u128::from(u32::from(HOST)), u128::from(u32::from(REMOTE)))
    );
    let pre_back = view(Hook::Prerouting, false);
    assert_eq!(pre_back.dst, u128::from(u32::from(POOL)), "as received");
    let fwd_back = view(Hook::Forward, false);
    assert_eq!(
        (fwd_back.src, fwd_back.dst, fwd_back.dport),
        (
            u128::from(u32::from(REMOTE)),
            u128::from(u32::from(HOST)),
            5000
        ),
        "de-NATed destination at forward"
    );
    assert_eq!(fwd_back.oif, Some(INSIDE));
    assert_eq!(fwd_back.ct, CtState::Established);
    assert_eq!(fwd_back.ct_status & 0x10, 0x10, "IPS_SRC_NAT");
    let post_out = view(Hook::Postrouting, true);
    assert_eq!(post_out.src, u128::from(u32::from(HOST)), "not yet SNATed");
    assert_eq!(post_out.oif, Some(OUTSIDE));
    // A rule change that drops the flow's established packets applies to
    // the very next packet in both directions, and is counted.
    p.blocked.store(53, Ordering::Relaxed);
    assert_eq!(
        exchange(&mut w, 3_000_000, &k, Some(&back)),
        [
            Action::Drop(DropReason::PolicyDrop),
            Action::Drop(DropReason::PolicyDrop)
        ]
    );
    assert_eq!(w.counters().drops_for(DropReason::PolicyDrop), 2);
    // The connection is kept (as in netfilter): unblocking resumes it.
    assert_eq!(w.conntrack().len(), 1);
    p.blocked.store(0, Ordering::Relaxed);
    assert_eq!(
        exchange(&mut w, 4_000_000, &k, Some(&back)),
        [Action::Forward(OUTSIDE), Action::Forward(INSIDE)]
    );
}

#[test]
fn established_packets_skip_the_policy_when_it_accepts_them_up_front() {
    let (mut w, p) = setup(false);
    let k = key(5001);
    assert_eq!(
        exchange(&mut w, 1_000_000, &k, None),
        [Action::Forward(OUTSIDE)]
    );
    p.blocked.store(53, Ordering::Relaxed);
    p.seen.lock().unwrap().clear();
    assert_eq!(
        exchange(&mut w, 2_000_000, &k, None),
        [Action::Forward(OUTSIDE)]
    );
    assert!(
        p.seen.lock().unwrap().is_empty(),
        "the policy was consulted"
    );
    // A new generation that no longer accepts established packets up front
    // takes effect at once (set_policy re-reads the property).
    p.per_packet.store(true, Ordering::Relaxed);
    w.set_policy(Arc::clone(&p) as Arc<dyn Policy>);
    assert_eq!(
        exchange(&mut w, 3_000_000, &k, None),
        [Action::Drop(DropReason::PolicyDrop)]
    );
}

/// Sets mark 9 at prerouting; records the mark each hook starts from.
#[derive(Default)]
struct MarkAtPrerouting {
    seen: Mutex<Vec<(Hook, CtState, u32)>>,
}

impl Policy for MarkAtPrerouting {
    fn decide(&self, hook: Hook, pkt: &PolicyPacket) -> Decision {
        self.seen.lock().unwrap().push((hook, pkt.ct, pkt.mark));
        Decision {
            mark: if hook == Hook::Prerouting {
                9
            } else {
                pkt.mark
            },
            ..Decision::accept(pkt)
        }
    }
    fn has_nat(&self, _: Hook) -> bool {
        false
    }
    fn established_accepted(&self) -> bool {
        false
    }
}

#[test]
fn a_mark_set_at_prerouting_carries_to_the_later_hooks_of_an_established_packet() {
    let p = Arc::new(MarkAtPrerouting::default());
    let mut w = Worker::new(nat_gateway(0, 1), Arc::clone(&p) as Arc<dyn Policy>).unwrap();
    let k = key(5100);
    assert_eq!(
        exchange(&mut w, 1_000_000, &k, None),
        [Action::Forward(OUTSIDE)]
    );
    assert_eq!(
        exchange(&mut w, 2_000_000, &k, None),
        [Action::Forward(OUTSIDE)]
    );
    let seen = p.seen.lock().unwrap().clone();
    for ct in [CtState::New, CtState::Established] {
        let marks: Vec<(Hook, u32)> = seen
            .iter()
            .filter(|(_, c, _)| *c == ct)
            .map(|(h, _, m)| (*h, *m))
            .collect();
        assert_eq!(
            marks,
            [
                (Hook::Prerouting, 0),
                (Hook::Forward, 9),
                (Hook::Postrouting, 9)
            ],
            "{ct:?}: {seen:?}"
        );
    }
}

/// Filters established packets per packet (nothing accepts them up front);
/// its forward hook runs `flow add` for TCP and UDP; `gen` is its flowtables'
/// generation. Counts the hooks run.
struct FlowPolicy {
    gen: std::sync::atomic::AtomicU64,
    hooks: std::sync::atomic::AtomicUsize,
}

impl Policy for FlowPolicy {
    fn decide(&self, hook: Hook, pkt: &PolicyPacket) -> Decision {
        self.hooks.fetch_add(1, Ordering::Relaxed);
        Decision {
            nat: (hook == Hook::Postrouting && pkt.ct == CtState::New)
                .then_some(Translation::Snat { pool: PoolId(0) }),
            flow_add: hook == Hook::Forward && matches!(pkt.proto, proto::UDP | proto::TCP),
            ct_timeout: 0,
            ..Decision::accept(pkt)
        }
    }
    fn has_nat(&self, hook: Hook) -> bool {
        hook == Hook::Postrouting
    }
    fn established_accepted(&self) -> bool {
        false
    }
    fn flowtables(&self) -> u64 {
        self.gen.load(Ordering::Relaxed)
    }
}

#[test]
fn a_connection_in_a_flowtable_skips_the_filter_chains_until_the_rule_set_is_replaced() {
    let p = Arc::new(FlowPolicy {
        gen: std::sync::atomic::AtomicU64::new(1),
        hooks: std::sync::atomic::AtomicUsize::new(0),
    });
    let mut w = Worker::new(nat_gateway(0, 1), Arc::clone(&p) as Arc<dyn Policy>).unwrap();
    let hooks = || p.hooks.load(Ordering::Relaxed);
    let k = key(5200);
    // The first packet: its connection is not confirmed yet, so `flow
    // add` does nothing (netfilter's `nft_flow_offload`); the second, an
    // established one, meets the chains and joins the flowtable.
    for (n, now) in [(1_000_000u64, 0), (2_000_000, 1)] {
        let before = hooks();
        assert_eq!(exchange(&mut w, n, &k, None), [Action::Forward(OUTSIDE)]);
        assert_eq!(
            hooks() - before,
            3,
            "packet {now}: prerouting, forward, postrouting"
        );
    }
    let in_flowtable = |w: &Worker| {
        w.conntrack()
            .iter()
            .next()
            .map(|(_, e)| e.in_flowtable())
            .unwrap()
    };
    assert!(in_flowtable(&w));
    // Now its packets skip the chains, and are still translated.
    let before = hooks();
    let mut f = TestFrames::default();
    f.push(INSIDE, |b| {
        build_udp4(b, HOST_MAC, GW_IN_MAC, &k, 20).unwrap()
    });
    w.process(3_000_000, &mut f);
    assert_eq!(f.acts, [Action::Forward(OUTSIDE)]);
    assert_eq!(&f.frame(0)[26..30], &POOL.octets());
    assert_eq!(hooks(), before, "no hook ran");
    // The same rule set again (an incremental update keeps the
    // flowtable): still in it.
    w.set_policy(Arc::clone(&p) as Arc<dyn Policy>);
    assert!(in_flowtable(&w));
    // A replaced rule set (new flowtables): out of it; the next packet
    // meets the chains (and joins again).
    p.gen.store(2, Ordering::Relaxed);
    w.set_policy(Arc::clone(&p) as Arc<dyn Policy>);
    assert!(!in_flowtable(&w));
    let before = hooks();
    assert_eq!(
        exchange(&mut w, 4_000_000, &k, None),
        [Action::Forward(OUTSIDE)]
    );
    assert_eq!(hooks() - before, 3);
    assert!(in_flowtable(&w));
}

#[test]
fn a_tcp_connection_joins_the_flowtable_once_established_and_leaves_it_at_fin() {
    let p = Arc::new(FlowPolicy {
        gen: std::sync::atomic::AtomicU64::new(1),
        hooks: std::sync::atomic::AtomicUsize::new(0),
    });
    let mut w = Worker::new(nat_gateway(0, 1), Arc::clone(&p) as Arc<dyn Policy>).unwrap();
    let hooks = || p.hooks.load(Ordering::Relaxed);
    let k = FlowKey4 {
        proto: proto::TCP,
        dport: 80,
        ..key(5300)
    };
    let send = |w: &mut Worker, now: u64, out: bool, flags: u8, seq: u32, ack: u32| {
        let mut f = TestFrames::default();
        if out {
            f.push(INSIDE, |b| {
                build_tcp4(b, HOST_MAC, GW_IN_MAC, &k, flags, seq, ack, 0).unwrap()
            });
        } else {
            let back = w.conntrack().iter().next().map(|(_, e)| e.reply()).unwrap();
            f.push(OUTSIDE, |b| {
                build_tcp4(b, ROUTER_MAC, GW_OUT_MAC, &back, flags, seq, ack, 0).unwrap()
            });
        }
        w.process(now, &mut f);
        f.acts[0]
    };
    let in_flowtable = |w: &Worker| {
        w.conntrack()
            .iter()
            .next()
            .is_some_and(|(_, e)| e.in_flowtable())
    };
    const SYN: u8 = 0x02;
    const ACK: u8 = 0x10;
    const FIN: u8 = 0x01;
    assert_eq!(
        send(&mut w, 1_000_000, true, SYN, 100, 0),
        Action::Forward(OUTSIDE)
    );
    // The SYN-ACK meets `flow add`, but the connection is not established.
    assert_eq!(
        send(&mut w, 2_000_000, false, SYN | ACK, 500, 101),
        Action::Forward(INSIDE)
    );
    assert!(!in_flowtable(&w));
    // The ACK makes it established: it joins.
    assert_eq!(
        send(&mut w, 3_000_000, true, ACK, 101, 501),
        Action::Forward(OUTSIDE)
    );
    assert!(in_flowtable(&w));
    let before = hooks();
    assert_eq!(
        send(&mut w, 4_000_000, false, ACK, 501, 101),
        Action::Forward(INSIDE)
    );
    assert_eq!(hooks(), before, "in the flowtable: no hook");
    // A FIN leaves it and meets the chains.
    assert_eq!(
        send(&mut w, 5_000_000, true, FIN | ACK, 101, 501),
        Action::Forward(OUTSIDE)
    );
    assert!(!in_flowtable(&w));
    assert_eq!(hooks() - before, 3);
}

#[test]
fn the_policy_sees_the_connections_original_and_reply_tuples() {
    let (mut w, p) = setup(true);
    let k = key(5400);
    assert_eq!(
        exchange(&mut w, 1_000_000, &k, None),
        [Action::Forward(OUTSIDE)]
    );
    let reply = w.conntrack().iter().next().map(|(_, e)| e.reply()).unwrap();
    let tuple = |f: &FlowKey4| (u128::from(f.src), u128::from(f.dst), f.sport, f.dport);
    let of = |c: &sluice_engine::ConnTuple| (c.src, c.dst, c.sport, c.dport);
    // The first packet, at forward: the original tuple is the packet's,
    // the reply tuple its reverse (the SNAT comes after, at postrouting).
    let seen = p.seen.lock().unwrap().clone();
    let fwd = seen
        .iter()
        .find(|(h, _)| *h == Hook::Forward)
        .map(|(_, pp)| *pp)
        .unwrap();
    assert_eq!(of(&fwd.conn), tuple(&k));
    assert_eq!(of(&fwd.ct_reply), tuple(&k.reversed()));
    // An established packet: the connection's tuples, the reply with the
    // pool address as destination.
    p.seen.lock().unwrap().clear();
    assert_eq!(
        exchange(&mut w, 2_000_000, &k, Some(&reply)),
        [Action::Forward(OUTSIDE), Action::Forward(INSIDE)]
    );
    let seen = p.seen.lock().unwrap().clone();
    assert!(!seen.is_empty());
    for (_, pp) in &seen {
        assert_eq!(of(&pp.conn), tuple(&k));
        assert_eq!(of(&pp.ct_reply), tuple(&reply));
        assert_eq!(pp.ct_reply.dst, u128::from(u32::from(POOL)));
    }
}
