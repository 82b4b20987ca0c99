//! NAT invariants through the whole engine pipeline, on random traffic:
//!
//! - a mapping is unique per (protocol, external address, external port):
//!   two different internal endpoints never share one;
//! - endpoint-independent mapping: one internal endpoint keeps its external
//!   endpoint whatever the destination (RFC 4787 REQ-1);
//! - a reply to the translated tuple reaches the host that opened the
//!   connection, with the original tuple restored;
//! - every emitted IPv4 header and TCP/UDP/ICMP checksum verifies.
//!
//! And: filling the connection table to its maximum keeps established
//! connections working.

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::sync::Arc;

use proptest::prelude::*;
mod common;

use common::TestFrames;
use sluice_engine::{
    Action, DropReason, EngineConfig, IfIndex, Interface, Route4, StaticPolicy, Worker,
};
use sluice_nat::{NatConfig, Pool, PoolId, Translation};
use sluice_wire::build::{build_icmp4_echo, build_tcp4, build_udp4};
use sluice_wire::checksum;
use sluice_wire::flow::{proto, FlowKey4};
use sluice_wire::{dissect, Net, L4};

const INSIDE: IfIndex = 0;
const OUTSIDE: IfIndex = 1;
const GW_IN_MAC: [u8; 6] = [2, 0, 0, 0, 0, 1];
const GW_OUT_MAC: [u8; 6] = [2, 0, 0, 0, 0, 2];
const HOST_MAC: [u8; 6] = [2, 0, 0, 0, 9, 9];
const POOL: [Ipv4Addr; 2] = [
    Ipv4Addr::new(198, 51, 100, 1),
    Ipv4Addr::new(198, 51, 100, 2),
];

fn worker(ct_max: u64) -> Worker {
    Worker::new(config(ct_max), Arc::new(snat_policy())).unwrap()
}

fn snat_policy() -> StaticPolicy {
    let mut p = StaticPolicy::accept_all();
    p.snat = vec![(OUTSIDE, Translation::Snat { pool: PoolId(0) })];
    p
}

fn config(ct_max: u64) -> EngineConfig {
    let iface = |name: &str, mac, addr, len| Interface {
        name: name.into(),
        mac,
        addrs: vec![(addr, len)],
        mtu: Interface::DEFAULT_MTU,
    };
    let mut neighbors = vec![(Ipv4Addr::new(203, 0, 113, 254), [2, 0, 0, 0, 8, 8])];
    neighbors.extend((2..40u8).map(|h| (Ipv4Addr::new(10, 0, 0, h), HOST_MAC)));
    EngineConfig {
        interfaces: vec![
            iface("in", GW_IN_MAC, Ipv4Addr::new(10, 0, 0, 1), 16),
            iface("out", GW_OUT_MAC, Ipv4Addr::new(203, 0, 113, 1), 24),
        ],
        routes: vec![Route4 {
            net: 0,
            len: 0,
            oif: OUTSIDE,
            via: Some(Ipv4Addr::new(203, 0, 113, 254)),
        }],
        neighbors,
        ct_max,
        nat: NatConfig {
            pools: vec![Pool::new(POOL).with_ports(1024..=65535)],
            ..NatConfig::default()
        },
        ..EngineConfig::default()
    }
}

/// Build a frame for `k` (TCP SYN, UDP, or ICMP echo request/reply): from
/// an inside host to the inside interface, or (`reply`) from the outside
/// to the outside interface.
fn build(buf: &mut [u8], k: &FlowKey4, reply: bool) -> usize {
    let (s, d) = if reply {
        (HOST_MAC, GW_OUT_MAC)
    } else {
        (HOST_MAC, GW_IN_MAC)
    };
    match k.proto {
        proto::TCP => build_tcp4(buf, s, d, k, if reply { 0x12 } else { 0x02 }, 1, 0, 0).unwrap(),
        proto::ICMP => build_icmp4_echo(buf, s, d, k, 1, !reply, 8).unwrap(),
        _ => build_udp4(buf, s, d, k, 18).unwrap(),
    }
}

/// Every checksum in an IPv4 frame verifies.
fn checksums_verify(f: &[u8]) -> bool {
    let Ok(d) = dissect(f) else { return false };
    let Net::Ipv4 {
        key,
        header_len,
        total_len,
        ..
    } = d.net
    else {
        return false;
    };
    let l3 = usize::from(d.l3_off);
    let l4 = usize::from(d.l4_off);
    let end = l3 + usize::from(total_len);
    if !checksum::verify(&f[l3..l3 + usize::from(header_len)]) {
        return false;
    }
    let seg = &f[l4..end];
    match d.l4 {
        L4::Udp {
            checksum_zero: true,
        } => true,
        L4::Tcp { .. } | L4::Udp { .. } => {
            let ph = checksum::pseudo_v4(key.src, key.dst, key.proto, seg.len() as u16);
            checksum::finish(ph + checksum::sum(seg)) == 0
        }
        _ => checksum::verify(seg),
    }
}

fn arb_flow() -> impl Strategy<Value = FlowKey4> {
    (
        2u8..40,
        prop::sample::select(vec![proto::TCP, proto::UDP, proto::ICMP]),
        1024u16..1100,
        0u8..4,
        1u16..6,
    )
        .prop_map(|(h, p, sp, dh, dp)| {
            let src = u32::from(Ipv4Addr::new(10, 0, 0, h));
            let dst = u32::from(Ipv4Addr::new(192, 0, 2, 10 + dh));
            let (sport, dport) = if p == proto::ICMP {
                (sp, sp)
            } else {
                (sp, 80 + dp)
            };
            FlowKey4 {
                src,
                dst,
                sport,
                dport,
                proto: p,
            }
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn mappings_are_unique_replies_return_and_checksums_verify(flows in prop::collection::vec(arb_flow(), 1..120)) {
        let mut w = worker(10_000);
        // Outbound.
        let mut out = TestFrames::default();
        for k in &flows {
            out.push(INSIDE, |b| build(b, k, false));
        }
        w.process(1_000_000, &mut out);
        // (proto, ext addr, ext port) -> internal endpoint; and per internal
        // endpoint the external one (endpoint-independent mapping).
        let mut owner: HashMap<(u8, u32, u16), (u32, u16)> = HashMap::new();
        let mut ext_of: HashMap<(u8, u32, u16), (u32, u16)> = HashMap::new();
        let mut translated = Vec::new();
        for (i, k) in flows.iter().enumerate() {
            prop_assert_eq!(out.acts[i], Action::Forward(OUTSIDE), "flow {} {}", i, k);
            let f = out.frame(i);
            prop_assert!(checksums_verify(f), "bad checksum on outbound {}", k);
            let t = dissect(f).unwrap().key4().unwrap();
            prop_assert!(POOL.contains(&Ipv4Addr::from(t.src)));
            prop_assert_eq!(t.dst, k.dst);
            if k.proto != proto::ICMP {
                // ICMP query keys carry the (translated) identifier as ports.
                prop_assert_eq!(t.dport, k.dport);
            }
            let int = (k.src, k.sport);
            let e = owner.entry((k.proto, t.src, t.sport)).or_insert(int);
            prop_assert_eq!(*e, int, "external endpoint shared by two internal endpoints");
            let x = ext_of.entry((k.proto, k.src, k.sport)).or_insert((t.src, t.sport));
            if k.proto != proto::ICMP {
                prop_assert_eq!(*x, (t.src, t.sport), "EIM: endpoint changed with destination");
            }
            translated.push(t);
        }
        // Replies from the outside to each translated tuple.
        let mut back = TestFrames::default();
        for t in &translated {
            let r = t.reversed();
            back.push(OUTSIDE, |b| build(b, &r, true));
        }
        w.process(2_000_000, &mut back);
        for (i, k) in flows.iter().enumerate() {
            prop_assert_eq!(back.acts[i], Action::Forward(INSIDE), "reply {} not delivered", k);
            let f = back.frame(i);
            prop_assert!(checksums_verify(f), "bad checksum on reply to {}", k);
            prop_assert_eq!(dissect(f).unwrap().key4().unwrap(), k.reversed());
            prop_assert_eq!(&f[..6], &HOST_MAC[..]);
        }
    }
}

#[test]
fn a_full_table_keeps_established_connections_working() {
    let max = 64u64;
    let mut w = worker(max);
    let udp = |h: u8, sport: u16| FlowKey4 {
        src: u32::from(Ipv4Addr::new(10, 0, 0, h)),
        dst: u32::from(Ipv4Addr::new(192, 0, 2, 1)),
        sport,
        dport: 53,
        proto: proto::UDP,
    };
    // Fill the table with connections that see a reply and one more packet
    // (assured), remembering their translations.
    let mut est = Vec::new();
    for i in 0..max as u16 {
        let k = udp(2 + (i % 30) as u8, 2000 + i);
        let mut f = TestFrames::default();
        f.push(INSIDE, |b| build(b, &k, false));
        w.process(1_000_000, &mut f);
        assert_eq!(f.acts[0], Action::Forward(OUTSIDE));
        let t = dissect(f.frame(0)).unwrap().key4().unwrap();
        let mut r = TestFrames::default();
        r.push(OUTSIDE, |b| build(b, &t.reversed(), true));
        r.push(INSIDE, |b| build(b, &k, false));
        w.process(2_000_000, &mut r);
        assert_eq!(r.acts[0], Action::Forward(INSIDE));
        est.push((k, t));
    }
    assert_eq!(w.conntrack().len(), max as usize);
    // New connections cannot evict assured ones: they are refused.
    let mut n = TestFrames::default();
    for i in 0..32u16 {
        let k = udp(39, 9000 + i);
        n.push(INSIDE, |b| build(b, &k, false));
    }
    w.process(3_000_000, &mut n);
    assert!(
        n.acts
            .iter()
            .all(|a| *a == Action::Drop(DropReason::CtFull)),
        "{:?}",
        n.acts
    );
    assert_eq!(w.counters().drops_for(DropReason::CtFull), 32);
    // Every established connection still works in both directions.
    let mut f = TestFrames::default();
    for (k, t) in &est {
        f.push(INSIDE, |b| build(b, k, false));
        f.push(OUTSIDE, |b| build(b, &t.reversed(), true));
    }
    w.process(4_000_000, &mut f);
    for (i, (k, t)) in est.iter().enumerate() {
        assert_eq!(f.acts[2 * i], Action::Forward(OUTSIDE), "{k}");
        assert_eq!(dissect(f.frame(2 * i)).unwrap().key4(), Some(*t));
        assert_eq!(f.acts[2 * i + 1], Action::Forward(INSIDE), "{k}");
        assert_eq!(
            dissect(f.frame(2 * i + 1)).unwrap().key4(),
            Some(k.reversed())
        );
    }
}

#[test]
fn flush_removes_every_connection_and_frees_the_ports() {
    let mut w = worker(1000);
    let mut f = TestFrames::default();
    for i in 0..100u16 {
        let k = FlowKey4 {
            src: u32::from(Ipv4Addr::new(10, 0, 0, 2)),
            dst: u32::from(Ipv4Addr::new(192, 0, 2, 1)),
            sport: 3000 + i,
            dport: 53,
            proto: proto::UDP,
        };
        f.push(INSIDE, |b| build(b, &k, false));
    }
    w.process(1_000_000, &mut f);
    assert_eq!(w.conntrack().len(), 100);
    assert_eq!(w.flush(), 100);
    assert_eq!(w.conntrack().len(), 0);
    assert_eq!(w.nat().mappings().count(), 0);
}

#[test]
fn garbage_frames_are_dropped_as_malformed_and_counted() {
    let mut w = worker(100);
    let mut f = TestFrames::default();
    // IPv4 ethertype with a header length of 0 words.
    f.push(INSIDE, |b| {
        b[..6].copy_from_slice(&GW_IN_MAC);
        b[12..14].copy_from_slice(&[0x08, 0x00]);
        b[14] = 0x40;
        60
    });
    f.push(INSIDE, |_| 0);
    w.process(0, &mut f);
    assert_eq!(f.acts, vec![Action::Drop(DropReason::Malformed); 2]);
    assert_eq!(w.counters().drops_for(DropReason::Malformed), 2);
}

#[test]
fn echo_request_to_the_gateway_gets_a_valid_echo_reply() {
    let mut w = worker(100);
    let k = FlowKey4 {
        src: u32::from(Ipv4Addr::new(10, 0, 0, 7)),
        dst: u32::from(Ipv4Addr::new(10, 0, 0, 1)),
        sport: 42,
        dport: 42,
        proto: proto::ICMP,
    };
    let mut f = TestFrames::default();
    f.push(INSIDE, |b| build(b, &k, false));
    w.process(0, &mut f);
    assert_eq!(f.acts[0], Action::Reply);
    let out = f.frame(0);
    assert!(checksums_verify(out), "reply checksums do not verify");
    let d = dissect(out).unwrap();
    assert!(
        matches!(d.l4, L4::IcmpQuery { ty: 0, id: 42, .. }),
        "{:?}",
        d.l4
    );
    assert_eq!(d.key4(), Some(k.reversed()));
    assert!(matches!(d.net, Net::Ipv4 { ttl: 64, .. }));
    assert_eq!((&out[..6], &out[6..12]), (&HOST_MAC[..], &GW_IN_MAC[..]));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(16))]

    /// Pass 1 prefetches index buckets one by one below
    /// `BATCHED_PREFETCH_FROM` connections and in a loop of their own from
    /// there on. Only the order of the prefetches differs: on the same
    /// traffic (new connections, their replies, then established traffic
    /// both ways, in batches longer than a pipeline group), the two
    /// workers decide every frame alike and emit the same bytes.
    #[test]
    fn both_prefetch_schedules_decide_alike(flows in prop::collection::vec(arb_flow(), 1..200)) {
        let big = sluice_engine::worker::BATCHED_PREFETCH_FROM;
        let mut ws = [worker(10_000), worker(big)];
        let mut outs: Vec<Vec<(Action, Vec<u8>)>> = Vec::new();
        for w in &mut ws {
            let mut seen = Vec::new();
            let mut out = TestFrames::default();
            for k in &flows {
                out.push(INSIDE, |b| build(b, k, false));
            }
            w.process(1_000_000, &mut out);
            let translated: Vec<FlowKey4> = (0..flows.len())
                .filter_map(|i| dissect(out.frame(i)).ok()?.key4())
                .collect();
            seen.extend((0..flows.len()).map(|i| (out.acts[i], out.frame(i).to_vec())));
            for round in 0..3u64 {
                let mut f = TestFrames::default();
                for (k, t) in flows.iter().zip(&translated) {
                    f.push(OUTSIDE, |b| build(b, &t.reversed(), true));
                    f.push(INSIDE, |b| build(b, k, false));
                }
                w.process(2_000_000 + round, &mut f);
                seen.extend((0..f.acts.len()).map(|i| (f.acts[i], f.frame(i).to_vec())));
            }
            prop_assert!(w.counters().fast_path > 0);
            outs.push(seen);
        }
        prop_assert_eq!(&outs[0], &outs[1]);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// A policy that rejects everything, on random flows with random bytes
    /// flipped: nothing panics, and every answer (a TCP reset or an ICMP
    /// port unreachable) goes back out of the ingress interface with every
    /// checksum valid.
    #[test]
    fn rejects_answer_with_valid_checksums(
        flows in prop::collection::vec(arb_flow(), 1..40),
        flips in prop::collection::vec((14usize..70, any::<u8>()), 0..4),
        reset in any::<bool>(),
    ) {
        let mut p = snat_policy();
        p.default = sluice_engine::Verdict::Reject(if reset {
            sluice_engine::policy::RejectWith::TcpReset
        } else {
            sluice_engine::policy::RejectWith::Unreachable { v4: 3, v6: 4 }
        });
        let mut w = Worker::new(config(1000), Arc::new(p)).unwrap();
        let mut f = TestFrames::default();
        for (i, k) in flows.iter().enumerate() {
            f.push(INSIDE, |b| {
                let n = build(b, k, false);
                if i % 2 == 1 {
                    for &(at, x) in &flips {
                        if at < n {
                            b[at] ^= x;
                        }
                    }
                }
                n
            });
        }
        w.process(1_000_000, &mut f);
        for (i, k) in flows.iter().enumerate() {
            // An intact frame is answered: every one with port
            // unreachable, a TCP one with a reset.
            if i % 2 == 0 && (!reset || k.proto == proto::TCP) {
                prop_assert_eq!(f.acts[i], Action::Reply, "{:?}", k);
            }
            if f.acts[i] == Action::Reply {
                let out = f.frame(i);
                prop_assert_eq!(&out[..6], &HOST_MAC[..]);
                prop_assert_eq!(&out[6..12], &GW_IN_MAC[..]);
                prop_assert!(checksums_verify(out), "{:02x?}", out);
            } else {
                prop_assert!(matches!(f.acts[i], Action::Drop(_)), "{:?}", f.acts[i]);
            }
        }
        let c = w.counters();
        prop_assert_eq!(
            c.tcp_resets + c.icmp_errors,
            (0..flows.len()).filter(|&i| f.acts[i] == Action::Reply).count() as u64
        );
    }
}
