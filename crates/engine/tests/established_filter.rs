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
use sluice_wire::build::build_udp4;
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
            verdict: Verdict::Accept,
            mark: if hook == Hook::Prerouting {
                9
            } else {
                pkt.mark
            },
            nat: None,
            ct_mark: pkt.ct_mark,
            mss: Default::default(),
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
