//! The chains before conntrack ([`Policy::has_raw`]) and untracked packets
//! (`notrack`): decided before any connection lookup, never tracked or
//! translated, filtered by the later hooks as `ct state untracked`, and
//! forwarded with only their TTL (hop limit) changed.

use std::net::Ipv6Addr;
use std::sync::{Arc, Mutex};

mod common;

use common::*;
use sluice_engine::{
    Action, CtState, Decision, DropReason, Hook, Policy, PolicyPacket, RawDecision, Route6,
    Verdict, Worker,
};
use sluice_nat::{PoolId, Translation};
use sluice_wire::build::{build_icmp4_echo, build_udp4, build_udp6};
use sluice_wire::checksum;
use sluice_wire::flow::{proto, FlowKey4, FlowKey6};

/// Before conntrack: marks every packet 5, drops UDP to port 666, and
/// exempts DNS (UDP port 53 either way), ICMP echo id 77 and IPv6 UDP to
/// port 53 from conntrack. After it: accepts, SNATs new connections at
/// postrouting, and records what each hook saw.
#[derive(Default)]
struct RawPolicy {
    seen: Mutex<Vec<(Hook, PolicyPacket)>>,
    raw_seen: Mutex<Vec<PolicyPacket>>,
}

impl Policy for RawPolicy {
    fn has_raw(&self) -> bool {
        true
    }
    fn raw(&self, pkt: &PolicyPacket) -> RawDecision {
        self.raw_seen.lock().unwrap().push(*pkt);
        let untracked = (pkt.proto == proto::UDP && (pkt.dport == 53 || pkt.sport == 53))
            || (pkt.proto == proto::ICMP && pkt.sport == 77);
        RawDecision {
            decision: Decision {
                verdict: if pkt.proto == proto::UDP && pkt.dport == 666 {
                    Verdict::Drop
                } else {
                    Verdict::Accept
                },
                mark: 5,
                ct_mark: 0,
                nat: None,
                mss: Default::default(),
                flow_add: false,
                ct_timeout: 0,
            },
            untracked,
        }
    }
    fn decide(&self, hook: Hook, pkt: &PolicyPacket) -> Decision {
        self.seen.lock().unwrap().push((hook, *pkt));
        let nat = (hook == Hook::Postrouting && pkt.ct == CtState::New)
            .then_some(Translation::Snat { pool: PoolId(0) });
        Decision {
            nat,
            ..Decision::accept(pkt)
        }
    }
    fn has_nat(&self, hook: Hook) -> bool {
        hook == Hook::Postrouting
    }
}

const HOST6: &str = "fd00:1::2";
const ROUTER_LL: &str = "fe80::ff:fe00:808";
const REMOTE6: &str = "2001:db8:80::80";

fn v6(s: &str) -> Ipv6Addr {
    s.parse().unwrap()
}

fn setup() -> (Worker, Arc<RawPolicy>) {
    let mut cfg = nat_gateway(0, 1);
    cfg.addrs6 = vec![
        (INSIDE, v6("fd00:1::1"), 64),
        (OUTSIDE, v6("2001:db8:ffff::1"), 64),
    ];
    cfg.routes6 = vec![Route6 {
        net: 0,
        len: 0,
        oif: OUTSIDE,
        via: Some(v6(ROUTER_LL)),
    }];
    cfg.neighbors6 = vec![
        (OUTSIDE, v6(ROUTER_LL), ROUTER_MAC),
        (INSIDE, v6(HOST6), HOST_MAC),
    ];
    cfg.ct6_max = 100;
    let p = Arc::new(RawPolicy::default());
    let w = Worker::new(cfg, Arc::clone(&p) as Arc<dyn Policy>).unwrap();
    (w, p)
}

fn udp(sport: u16, dport: u16) -> FlowKey4 {
    FlowKey4 {
        src: u32::from(HOST),
        dst: u32::from(REMOTE),
        sport,
        dport,
        proto: proto::UDP,
    }
}

/// The IPv4 header checksum and the UDP checksum of an Ethernet frame
/// verify.
fn checksums_verify(f: &[u8]) -> bool {
    let ip = &f[14..34];
    let src = std::net::Ipv4Addr::new(ip[12], ip[13], ip[14], ip[15]);
    let dst = std::net::Ipv4Addr::new(ip[16], ip[17], ip[18], ip[19]);
    let udp = &f[34..];
    let want = udp_checksum(src, dst, udp);
    checksum::verify(ip) && u16::from_be_bytes([udp[6], udp[7]]) == want
}

#[test]
fn an_untracked_packet_is_forwarded_unchanged_without_a_connection() {
    let (mut w, p) = setup();
    let k = udp(4000, 53);
    let mut f = TestFrames::default();
    f.push(INSIDE, |b| {
        build_udp4(b, HOST_MAC, GW_IN_MAC, &k, 20).unwrap()
    });
    let sent = f.frame(0).to_vec();
    w.process(1_000_000, &mut f);
    assert_eq!(f.acts, [Action::Forward(OUTSIDE)]);
    let out = f.frame(0);
    // Not translated (the policy would SNAT a new connection), TTL one
    // less, checksums right, MACs of the next hop.
    assert_eq!(&out[26..30], &HOST.octets(), "source not translated");
    assert_eq!(&out[34..38], &sent[34..38], "ports unchanged");
    assert_eq!(out[22], sent[22] - 1, "TTL decremented");
    assert!(checksums_verify(out));
    assert_eq!(&out[0..6], &ROUTER_MAC);
    assert_eq!(&out[6..12], &GW_OUT_MAC);
    assert_eq!(w.conntrack().len(), 0, "no connection");
    assert_eq!(w.counters().untracked, 1);
    assert_eq!(w.counters().ct_created, 0);
    // Before conntrack: no connection (invalid). After: untracked, with
    // the raw chain's mark, at prerouting, forward and postrouting.
    assert_eq!(p.raw_seen.lock().unwrap()[0].ct, CtState::Invalid);
    let seen = p.seen.lock().unwrap().clone();
    let hooks: Vec<Hook> = seen.iter().map(|(h, _)| *h).collect();
    assert_eq!(hooks, [Hook::Prerouting, Hook::Forward, Hook::Postrouting]);
    assert!(seen
        .iter()
        .all(|(_, pp)| pp.ct == CtState::Untracked && pp.mark == 5));

    // The answer (source port 53) is untracked too: forwarded to the host
    // as it is, no connection to translate it back through.
    let back = FlowKey4 {
        src: u32::from(REMOTE),
        dst: u32::from(HOST),
        sport: 53,
        dport: 4000,
        proto: proto::UDP,
    };
    let mut f = TestFrames::default();
    f.push(OUTSIDE, |b| {
        build_udp4(b, ROUTER_MAC, GW_OUT_MAC, &back, 20).unwrap()
    });
    w.process(2_000_000, &mut f);
    assert_eq!(f.acts, [Action::Forward(INSIDE)]);
    assert_eq!(&f.frame(0)[30..34], &HOST.octets());
    assert!(checksums_verify(f.frame(0)));
    assert_eq!(w.conntrack().len(), 0);
    assert_eq!(w.counters().untracked, 2);
}

#[test]
fn tracked_packets_carry_the_raw_mark_and_raw_drops_are_final() {
    let (mut w, p) = setup();
    let mut f = TestFrames::default();
    f.push(INSIDE, |b| {
        build_udp4(b, HOST_MAC, GW_IN_MAC, &udp(4001, 80), 20).unwrap()
    });
    f.push(INSIDE, |b| {
        build_udp4(b, HOST_MAC, GW_IN_MAC, &udp(4002, 666), 20).unwrap()
    });
    w.process(1_000_000, &mut f);
    assert_eq!(
        f.acts,
        [
            Action::Forward(OUTSIDE),
            Action::Drop(DropReason::PolicyDrop)
        ]
    );
    assert_eq!(&f.frame(0)[26..30], &POOL.octets(), "tracked: translated");
    assert_eq!(
        w.conntrack().len(),
        1,
        "one connection, not the dropped one"
    );
    assert_eq!(w.counters().untracked, 0);
    let seen = p.seen.lock().unwrap().clone();
    assert!(!seen.is_empty());
    assert!(
        seen.iter()
            .all(|(_, pp)| pp.ct == CtState::New && pp.mark == 5 && pp.dport == 80),
        "{seen:?}"
    );
    // An established packet of the tracked connection meets the raw
    // chains too (and is forwarded on its connection).
    let before = p.raw_seen.lock().unwrap().len();
    let mut f = TestFrames::default();
    f.push(INSIDE, |b| {
        build_udp4(b, HOST_MAC, GW_IN_MAC, &udp(4001, 80), 20).unwrap()
    });
    w.process(2_000_000, &mut f);
    assert_eq!(f.acts, [Action::Forward(OUTSIDE)]);
    assert_eq!(p.raw_seen.lock().unwrap().len(), before + 1);
}

#[test]
fn untracked_icmp_echo_keeps_its_identifier_and_checksum() {
    let (mut w, _) = setup();
    let k = FlowKey4 {
        src: u32::from(HOST),
        dst: u32::from(REMOTE),
        sport: 77,
        dport: 77,
        proto: proto::ICMP,
    };
    let mut f = TestFrames::default();
    f.push(INSIDE, |b| {
        build_icmp4_echo(b, HOST_MAC, GW_IN_MAC, &k, 3, true, 32).unwrap()
    });
    let sent = f.frame(0).to_vec();
    w.process(1_000_000, &mut f);
    assert_eq!(f.acts, [Action::Forward(OUTSIDE)]);
    let out = f.frame(0);
    assert_eq!(&out[34..], &sent[34..], "the ICMP message is unchanged");
    assert!(checksum::verify(&out[14..34]));
    assert_eq!(w.conntrack().len(), 0);
}

#[test]
fn untracked_ipv6_is_forwarded_without_a_connection() {
    let (mut w, p) = setup();
    let k = FlowKey6 {
        src: u128::from(v6(HOST6)),
        dst: u128::from(v6(REMOTE6)),
        sport: 4000,
        dport: 53,
        proto: proto::UDP,
    };
    let mut f = TestFrames::default();
    f.push(INSIDE, |b| {
        build_udp6(b, HOST_MAC, GW_IN_MAC, &k, 20).unwrap()
    });
    let sent = f.frame(0).to_vec();
    w.process(1_000_000, &mut f);
    assert_eq!(f.acts, [Action::Forward(OUTSIDE)]);
    let out = f.frame(0);
    assert_eq!(out[21], sent[21] - 1, "hop limit decremented");
    assert_eq!(&out[22..], &sent[22..], "addresses and payload unchanged");
    assert_eq!(w.counters().untracked, 1);
    assert_eq!(w.counters().ct_created, 0);
    let seen = p.seen.lock().unwrap().clone();
    assert!(!seen.is_empty());
    assert!(seen
        .iter()
        .all(|(_, pp)| pp.family == 6 && pp.ct == CtState::Untracked && pp.mark == 5));
    // Tracked IPv6 (port 80) makes a connection.
    let k80 = FlowKey6 { dport: 80, ..k };
    let mut f = TestFrames::default();
    f.push(INSIDE, |b| {
        build_udp6(b, HOST_MAC, GW_IN_MAC, &k80, 20).unwrap()
    });
    w.process(2_000_000, &mut f);
    assert_eq!(f.acts, [Action::Forward(OUTSIDE)]);
    assert_eq!(w.counters().ct_created, 1);
}

#[test]
fn an_untracked_fragmented_datagram_is_forwarded_whole() {
    let (mut w, _) = setup();
    let data = udp_datagram(HOST, REMOTE, 4000, 53, 2000);
    let frames = ipv4_fragments((HOST_MAC, GW_IN_MAC), HOST, REMOTE, 17, 0x1234, 64, &data);
    assert_eq!(frames.len(), 2);
    let mut f = TestFrames::default();
    for fr in &frames {
        f.push(INSIDE, |b| {
            b[..fr.len()].copy_from_slice(fr);
            fr.len()
        });
    }
    w.process(1_000_000, &mut f);
    assert_eq!(f.acts, [Action::Forward(OUTSIDE), Action::Forward(OUTSIDE)]);
    for (i, sent) in frames.iter().enumerate() {
        let out = f.frame(i);
        assert_eq!(&out[26..34], &sent[26..34], "addresses unchanged");
        assert_eq!(out[22], 63);
        assert!(checksum::verify(&out[14..34]));
    }
    assert_eq!(w.conntrack().len(), 0);
}
