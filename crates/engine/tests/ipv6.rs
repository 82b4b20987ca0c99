//! IPv6 through the whole worker pipeline, on crafted frames:
//!
//! - neighbor solicitations for the gateway's addresses (global and the
//!   EUI-64 link-local one, to the solicited-node group) are answered with a
//!   valid neighbor advertisement; other targets and invalid messages are
//!   counted and dropped;
//! - echo requests to the gateway are answered;
//! - forwarding by longest prefix match, hop limit decrement, stateful
//!   filtering (replies of a connection pass a forward policy that drops
//!   new inbound connections), ICMPv6 errors of a connection (related);
//! - hop limit exceeded and packet too big are answered with ICMPv6 errors
//!   whose checksums verify; the drops are counted;
//! - `no-neighbor` names the missing next hop; forgetting a neighbour stops
//!   established traffic until it is learnt again;
//! - no frame, however corrupted, panics the worker.

use std::net::Ipv6Addr;
use std::sync::Arc;

mod common;

use common::TestFrames;
use sluice_engine::{
    Action, CtState, Decision, DropReason, EngineConfig, Hook, IfIndex, Interface, Policy,
    PolicyPacket, Route6, StaticPolicy, Verdict, Worker,
};
use sluice_wire::build::{build_icmp6_echo, build_icmp6_error, build_tcp6, build_udp6};
use sluice_wire::flow::{proto, FlowKey6};
use sluice_wire::icmp;
use sluice_wire::ndp;
use sluice_wire::IpPair;

const INSIDE: IfIndex = 0;
const OUTSIDE: IfIndex = 1;
const GW_IN_MAC: [u8; 6] = [2, 0, 0, 0, 0, 1];
const GW_OUT_MAC: [u8; 6] = [2, 0, 0, 0, 0, 2];
const HOST_MAC: [u8; 6] = [2, 0, 0, 0, 9, 9];
const ROUTER_MAC: [u8; 6] = [2, 0, 0, 0, 8, 8];
const OUT_MTU: u16 = 1400;

fn a(s: &str) -> u128 {
    u128::from(s.parse::<Ipv6Addr>().unwrap())
}
fn ip(s: &str) -> Ipv6Addr {
    s.parse().unwrap()
}

const GW_IN: &str = "fd00:1::1";
const HOST: &str = "fd00:1::2";
const GW_OUT: &str = "2001:db8:ffff::1";
const ROUTER_LL: &str = "fe80::ff:fe00:808";
const REMOTE: &str = "2001:db8:80::80";

/// Forward: accept new connections only from the inside; anything of a
/// known connection passes (`ct state established,related accept`).
struct InsideOnly;

impl Policy for InsideOnly {
    fn decide(&self, hook: Hook, p: &PolicyPacket) -> Decision {
        let ok = hook != Hook::Forward || p.ct != CtState::New || p.iif == INSIDE;
        assert_eq!(
            p.family, 6,
            "the engine must present IPv6 packets as family 6"
        );
        if hook == Hook::Forward {
            assert!(
                p.oif.is_some(),
                "forward hook runs with the egress interface"
            );
        }
        Decision {
            verdict: if ok { Verdict::Accept } else { Verdict::Drop },
            mark: p.mark,
            nat: None,
            ct_mark: p.ct_mark,
            mss: Default::default(),
            flow_add: false,
            ct_timeout: 0,
        }
    }
    fn has_nat(&self, _: Hook) -> bool {
        false
    }
}

fn config() -> EngineConfig {
    EngineConfig {
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
        addrs6: vec![(INSIDE, ip(GW_IN), 64), (OUTSIDE, ip(GW_OUT), 64)],
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
        ..EngineConfig::default()
    }
}

fn worker(p: impl Policy + 'static) -> Worker {
    Worker::new(config(), Arc::new(p)).unwrap()
}

fn run(w: &mut Worker, iif: IfIndex, f: impl FnOnce(&mut [u8]) -> usize) -> (Action, Vec<u8>) {
    let mut t = TestFrames::default();
    t.push(iif, f);
    w.process(1_000_000_000, &mut t);
    (t.acts[0], t.frame(0).to_vec())
}

fn key(p: u8, s: &str, sp: u16, d: &str, dp: u16) -> FlowKey6 {
    FlowKey6::new(p, ip(s), sp, ip(d), dp)
}

fn v6_src(f: &[u8]) -> u128 {
    u128::from_be_bytes(f[22..38].try_into().unwrap())
}
fn v6_dst(f: &[u8]) -> u128 {
    u128::from_be_bytes(f[38..54].try_into().unwrap())
}

fn icmp_ok(f: &[u8]) -> bool {
    icmp::Packet::new_unchecked(&f[54..]).verify_checksum_v6(&IpPair::V6 {
        src: v6_src(f),
        dst: v6_dst(f),
    })
}

fn ns_frame(b: &mut [u8], target: &str) -> usize {
    ndp::build_ns(b, HOST_MAC, a(HOST), a(target), None).unwrap()
}

#[test]
fn neighbor_solicitation_for_our_addresses_is_answered() {
    let mut w = worker(StaticPolicy::accept_all());
    let ll = u128::from(ndp::link_local(GW_IN_MAC));
    for target in [GW_IN.to_string(), Ipv6Addr::from(ll).to_string()] {
        let (act, f) = run(&mut w, INSIDE, |b| ns_frame(b, &target));
        assert_eq!(act, Action::Reply, "NS for {target}");
        assert_eq!(f.len(), ndp::FRAME_LEN);
        assert_eq!(&f[0..6], &HOST_MAC, "to the solicitor's link-layer address");
        assert_eq!(&f[6..12], &GW_IN_MAC);
        assert_eq!((v6_src(&f), v6_dst(&f)), (a(&target), a(HOST)));
        let na = ndp::parse(v6_src(&f), v6_dst(&f), f[21], &f[54..]).expect("valid NA");
        assert_eq!(na.msg_type, ndp::NEIGHBOR_ADVERT);
        assert_eq!(na.target, a(&target));
        assert_eq!(na.lladdr, Some(GW_IN_MAC));
        assert_eq!(
            na.flags,
            ndp::FLAG_ROUTER | ndp::FLAG_SOLICITED | ndp::FLAG_OVERRIDE
        );
    }
    assert_eq!(w.counters().local, 2);
    // The outside address is not the inside interface's: not answered there.
    let (act, _) = run(&mut w, INSIDE, |b| ns_frame(b, GW_OUT));
    assert_eq!(act, Action::Drop(DropReason::NdpIgnored));
    // A solicitation that crossed a router (hop limit != 255) is invalid.
    let (act, _) = run(&mut w, INSIDE, |b| {
        let n = ns_frame(b, GW_IN);
        b[21] = 64;
        n
    });
    assert_eq!(act, Action::Drop(DropReason::NdpInvalid));
    // So is one with a broken checksum.
    let (act, _) = run(&mut w, INSIDE, |b| {
        let n = ns_frame(b, GW_IN);
        b[60] ^= 1;
        n
    });
    assert_eq!(act, Action::Drop(DropReason::NdpInvalid));
    // An advertisement needs no answer.
    let (act, _) = run(&mut w, INSIDE, |b| {
        ndp::build_na(
            b,
            HOST_MAC,
            GW_IN_MAC,
            a(HOST),
            a(GW_IN),
            ndp::FLAG_SOLICITED,
        )
        .unwrap()
    });
    assert_eq!(act, Action::Drop(DropReason::NdpIgnored));
    assert_eq!(w.counters().drops_for(DropReason::NdpInvalid), 2);
    assert_eq!(w.counters().drops_for(DropReason::NdpIgnored), 2);
}

#[test]
fn echo_request_to_the_gateway_is_answered() {
    let mut w = worker(StaticPolicy::accept_all());
    let k = key(proto::ICMPV6, HOST, 77, GW_IN, 77);
    let (act, f) = run(&mut w, INSIDE, |b| {
        build_icmp6_echo(b, HOST_MAC, GW_IN_MAC, &k, 5, true, 32).unwrap()
    });
    assert_eq!(act, Action::Reply);
    assert_eq!(&f[0..6], &HOST_MAC);
    assert_eq!((v6_src(&f), v6_dst(&f)), (a(GW_IN), a(HOST)));
    assert_eq!(f[54], 129, "echo reply");
    assert_eq!(&f[58..60], &77u16.to_be_bytes(), "identifier kept");
    assert!(icmp_ok(&f), "ICMPv6 checksum verifies");
    // The outside address answers from the inside too (it is global).
    let k = key(proto::ICMPV6, HOST, 78, GW_OUT, 78);
    let (act, f) = run(&mut w, INSIDE, |b| {
        build_icmp6_echo(b, HOST_MAC, GW_IN_MAC, &k, 1, true, 0).unwrap()
    });
    assert_eq!(act, Action::Reply);
    assert!(icmp_ok(&f));
}

#[test]
fn forwarding_is_stateful_and_decrements_the_hop_limit() {
    let mut w = worker(InsideOnly);
    let out = key(proto::TCP, HOST, 40000, REMOTE, 80);
    let (act, f) = run(&mut w, INSIDE, |b| {
        build_tcp6(b, HOST_MAC, GW_IN_MAC, &out, 0x02, 1, 0, 0).unwrap()
    });
    assert_eq!(act, Action::Forward(OUTSIDE));
    assert_eq!(&f[0..6], &ROUTER_MAC, "to the default router's MAC");
    assert_eq!(&f[6..12], &GW_OUT_MAC);
    assert_eq!(f[21], 63, "hop limit decremented");
    assert_eq!((v6_src(&f), v6_dst(&f)), (a(HOST), a(REMOTE)), "no NAT66");
    assert_eq!(w.conntrack6().len(), 1);
    // The reply passes although new inbound connections are refused.
    let back = out.reversed();
    let (act, f) = run(&mut w, OUTSIDE, |b| {
        build_tcp6(b, ROUTER_MAC, GW_OUT_MAC, &back, 0x12, 9, 2, 0).unwrap()
    });
    assert_eq!(act, Action::Forward(INSIDE));
    assert_eq!(&f[0..6], &HOST_MAC);
    assert_eq!(w.counters().fast_path, 1);
    let (act, _) = run(&mut w, INSIDE, |b| {
        build_tcp6(b, HOST_MAC, GW_IN_MAC, &out, 0x10, 2, 10, 0).unwrap()
    });
    assert_eq!(act, Action::Forward(OUTSIDE));
    // A new connection from the outside is dropped by the forward policy.
    let inbound = key(proto::TCP, REMOTE, 5555, HOST, 22);
    let (act, _) = run(&mut w, OUTSIDE, |b| {
        build_tcp6(b, ROUTER_MAC, GW_OUT_MAC, &inbound, 0x02, 1, 0, 0).unwrap()
    });
    assert_eq!(act, Action::Drop(DropReason::PolicyDrop));
    assert_eq!(w.counters().drops_for(DropReason::PolicyDrop), 1);
    // An ICMPv6 error about the connection is related: it reaches the host.
    let mut quoted = vec![0u8; 2048];
    let n = build_tcp6(&mut quoted, HOST_MAC, GW_IN_MAC, &out, 0x10, 2, 10, 0).unwrap();
    let q = quoted[14..n].to_vec();
    let (act, f) = run(&mut w, OUTSIDE, |b| {
        build_icmp6_error(
            b,
            ROUTER_MAC,
            GW_OUT_MAC,
            a("2001:db8:1::1"),
            a(HOST),
            1,
            4,
            0,
            &q,
        )
        .unwrap()
    });
    assert_eq!(act, Action::Forward(INSIDE));
    assert_eq!(&f[0..6], &HOST_MAC);
    // The same error about an unknown connection is not.
    let other = key(proto::TCP, HOST, 40001, REMOTE, 80);
    let n = build_tcp6(&mut quoted, HOST_MAC, GW_IN_MAC, &other, 0x10, 2, 10, 0).unwrap();
    let q = quoted[14..n].to_vec();
    let (act, _) = run(&mut w, OUTSIDE, |b| {
        build_icmp6_error(
            b,
            ROUTER_MAC,
            GW_OUT_MAC,
            a("2001:db8:1::1"),
            a(HOST),
            1,
            4,
            0,
            &q,
        )
        .unwrap()
    });
    assert_eq!(act, Action::Drop(DropReason::Icmp6ErrorUnrelated));
}

#[test]
fn hop_limit_exceeded_is_answered_with_time_exceeded() {
    let mut w = worker(StaticPolicy::accept_all());
    let k = key(proto::UDP, HOST, 3333, REMOTE, 53);
    let mut orig = vec![0u8; 2048];
    let n = build_udp6(&mut orig, HOST_MAC, GW_IN_MAC, &k, 20).unwrap();
    orig[21] = 1;
    let sent = orig[14..n].to_vec();
    let (act, f) = run(&mut w, INSIDE, |b| {
        b[..n].copy_from_slice(&orig[..n]);
        n
    });
    assert_eq!(act, Action::Reply);
    assert_eq!(&f[0..6], &HOST_MAC);
    assert_eq!(&f[6..12], &GW_IN_MAC);
    assert_eq!(
        (v6_src(&f), v6_dst(&f)),
        (a(GW_IN), a(HOST)),
        "from the ingress address"
    );
    assert_eq!(
        (f[54], f[55]),
        (3, 0),
        "time exceeded, hop limit exceeded in transit"
    );
    assert!(icmp_ok(&f), "ICMPv6 checksum verifies (pseudo-header)");
    assert_eq!(&f[62..], &sent[..], "the whole packet is quoted");
    assert_eq!(w.counters().drops_for(DropReason::TtlExpired), 1);
    assert_eq!(w.counters().icmp_errors, 1);
    assert_eq!(w.conntrack6().len(), 0);
}

#[test]
fn oversized_packets_get_packet_too_big_with_the_mtu() {
    let mut w = worker(StaticPolicy::accept_all());
    let k = key(proto::UDP, HOST, 3333, REMOTE, 53);
    // 40 + 8 + 1353 = 1401 > 1400: too big; 1400 exactly fits.
    let (act, f) = run(&mut w, INSIDE, |b| {
        build_udp6(b, HOST_MAC, GW_IN_MAC, &k, 1353).unwrap()
    });
    assert_eq!(act, Action::Reply);
    assert_eq!((f[54], f[55]), (2, 0), "packet too big");
    assert_eq!(&f[58..62], &u32::from(OUT_MTU).to_be_bytes());
    assert!(f.len() - 14 <= 1280, "an error fits in the minimum MTU");
    assert!(icmp_ok(&f));
    assert_eq!(w.counters().drops_for(DropReason::TooBig), 1);
    let (act, _) = run(&mut w, INSIDE, |b| {
        build_udp6(b, HOST_MAC, GW_IN_MAC, &k, 1352).unwrap()
    });
    assert_eq!(act, Action::Forward(OUTSIDE));
    // Established flows are checked too (the MTU is in the adjacency).
    let (act, f) = run(&mut w, INSIDE, |b| {
        build_udp6(b, HOST_MAC, GW_IN_MAC, &k, 1500).unwrap()
    });
    assert_eq!(act, Action::Reply);
    assert_eq!(f[54], 2);
    assert_eq!(w.counters().drops_for(DropReason::TooBig), 2);
}

#[test]
fn missing_next_hop_is_named_and_forgotten_neighbours_stop_traffic() {
    let mut cfg = config();
    cfg.neighbors6.clear();
    let mut w = Worker::new(cfg, Arc::new(StaticPolicy::accept_all())).unwrap();
    let k = key(proto::UDP, HOST, 1000, REMOTE, 53);
    let mut t = TestFrames::default();
    t.push(INSIDE, |b| {
        build_udp6(b, HOST_MAC, GW_IN_MAC, &k, 10).unwrap()
    });
    w.process(1, &mut t);
    assert_eq!(t.acts[0], Action::Drop(DropReason::NoNeighbor));
    assert_eq!(w.missing_next_hop6(0), Some((OUTSIDE, ip(ROUTER_LL))));
    w.set_neighbor6(OUTSIDE, ip(ROUTER_LL), ROUTER_MAC).unwrap();
    let mut t = TestFrames::default();
    t.push(INSIDE, |b| {
        build_udp6(b, HOST_MAC, GW_IN_MAC, &k, 10).unwrap()
    });
    w.process(2, &mut t);
    assert_eq!(t.acts[0], Action::Drop(DropReason::NoNeighbor));
    assert_eq!(
        w.missing_next_hop6(0),
        Some((INSIDE, ip(HOST))),
        "the reply direction's next hop is needed too"
    );
    w.set_neighbor6(INSIDE, ip(HOST), HOST_MAC).unwrap();
    let (act, _) = run(&mut w, INSIDE, |b| {
        build_udp6(b, HOST_MAC, GW_IN_MAC, &k, 10).unwrap()
    });
    assert_eq!(act, Action::Forward(OUTSIDE));
    assert!(w.clear_neighbor6(OUTSIDE, ip(ROUTER_LL)));
    let (act, _) = run(&mut w, INSIDE, |b| {
        build_udp6(b, HOST_MAC, GW_IN_MAC, &k, 10).unwrap()
    });
    assert_eq!(act, Action::Drop(DropReason::NoNeighbor));
    w.set_neighbor6(OUTSIDE, ip(ROUTER_LL), [2, 0, 0, 0, 7, 7])
        .unwrap();
    let (act, f) = run(&mut w, INSIDE, |b| {
        build_udp6(b, HOST_MAC, GW_IN_MAC, &k, 10).unwrap()
    });
    assert_eq!(act, Action::Forward(OUTSIDE));
    assert_eq!(
        &f[0..6],
        &[2, 0, 0, 0, 7, 7],
        "the cached adjacency follows the new MAC"
    );
}

#[test]
fn scope_and_address_rules_are_enforced_and_counted() {
    let mut w = worker(StaticPolicy::accept_all());
    let cases = [
        (
            key(proto::UDP, HOST, 1, "fe80::1234", 2),
            DropReason::Ipv6LinkLocal,
        ),
        (
            key(proto::UDP, "fe80::9", 1, REMOTE, 2),
            DropReason::Ipv6LinkLocal,
        ),
        (
            key(proto::UDP, HOST, 5353, "ff02::fb", 5353),
            DropReason::Ipv6Multicast,
        ),
        (
            key(proto::UDP, "::", 1, REMOTE, 2),
            DropReason::Ipv6BadAddress,
        ),
        (
            key(proto::UDP, HOST, 1, "::1", 2),
            DropReason::Ipv6BadAddress,
        ),
    ];
    for (k, want) in cases {
        let (act, _) = run(&mut w, INSIDE, |b| {
            build_udp6(b, HOST_MAC, GW_IN_MAC, &k, 4).unwrap()
        });
        assert_eq!(act, Action::Drop(want), "{k:?}");
    }
    // RFC 8200 §8.1: a zero UDP checksum is invalid over IPv6.
    let k = key(proto::UDP, HOST, 1, REMOTE, 2);
    let (act, _) = run(&mut w, INSIDE, |b| {
        let n = build_udp6(b, HOST_MAC, GW_IN_MAC, &k, 4).unwrap();
        b[60] = 0;
        b[61] = 0;
        n
    });
    assert_eq!(act, Action::Drop(DropReason::Udp6ZeroChecksum));
    let mut total = 0;
    for r in DropReason::ALL {
        total += w.counters().drops_for(*r);
    }
    assert_eq!(total, 6, "every drop counted once");
}

#[test]
fn corrupted_ipv6_frames_never_panic() {
    let mut w = worker(InsideOnly);
    let mut seeds: Vec<Vec<u8>> = Vec::new();
    let mut b = vec![0u8; 2048];
    let n = ns_frame(&mut b, GW_IN);
    seeds.push(b[..n].to_vec());
    let n = build_tcp6(
        &mut b,
        HOST_MAC,
        GW_IN_MAC,
        &key(6, HOST, 1, REMOTE, 2),
        2,
        0,
        0,
        8,
    )
    .unwrap();
    seeds.push(b[..n].to_vec());
    let n = build_icmp6_echo(
        &mut b,
        HOST_MAC,
        GW_IN_MAC,
        &key(58, HOST, 9, GW_IN, 9),
        1,
        true,
        8,
    )
    .unwrap();
    seeds.push(b[..n].to_vec());
    let q = seeds[1][14..].to_vec();
    let n = build_icmp6_error(
        &mut b,
        ROUTER_MAC,
        GW_OUT_MAC,
        a(REMOTE),
        a(HOST),
        1,
        0,
        0,
        &q,
    )
    .unwrap();
    seeds.push(b[..n].to_vec());
    let mut x = 0x1234_5678_u32;
    for s in &seeds {
        for cut in 0..s.len() {
            let _ = run(&mut w, INSIDE, |b| {
                b[..cut].copy_from_slice(&s[..cut]);
                cut
            });
        }
        for _ in 0..2000 {
            let mut f = s.clone();
            for _ in 0..3 {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                let i = (x as usize) % f.len();
                f[i] = (x >> 8) as u8;
            }
            let iif = (x % 2) as IfIndex;
            let _ = run(&mut w, iif, |b| {
                b[..f.len()].copy_from_slice(&f);
                f.len()
            });
        }
    }
}

/// A packet with an extension header skips the fixed-offset parser; the
/// general path finds the same connection.
#[test]
fn extension_headers_take_the_general_path_to_the_same_connection() {
    let mut w = worker(InsideOnly);
    let out = key(proto::UDP, HOST, 4000, REMOTE, 53);
    let (act, _) = run(&mut w, INSIDE, |b| {
        build_udp6(b, HOST_MAC, GW_IN_MAC, &out, 8).unwrap()
    });
    assert_eq!(act, Action::Forward(OUTSIDE));
    // The reply with an 8-byte destination options header (next header 60)
    // in front of UDP.
    let mut plain = vec![0u8; 2048];
    let n = build_udp6(&mut plain, ROUTER_MAC, GW_OUT_MAC, &out.reversed(), 8).unwrap();
    let (act, f) = run(&mut w, OUTSIDE, |b| {
        b[..54].copy_from_slice(&plain[..54]);
        b[20] = 60;
        b[18..20].copy_from_slice(&(u16::from_be_bytes([plain[18], plain[19]]) + 8).to_be_bytes());
        b[54] = proto::UDP;
        b[55] = 0; // 8 bytes: next header, length 0, PadN
        b[56] = 1;
        b[57] = 4;
        b[62..n + 8].copy_from_slice(&plain[54..n]);
        n + 8
    });
    assert_eq!(
        act,
        Action::Forward(INSIDE),
        "a reply, not a new inbound connection"
    );
    assert_eq!(f[21], 63);
    assert_eq!(w.conntrack6().len(), 1);
    assert_eq!(w.counters().fast_path, 1);
}

/// NAT statements never apply to IPv6 (no NAT66): a masquerade for the
/// egress interface leaves the packet's addresses and ports alone.
#[test]
fn masquerade_does_not_translate_ipv6() {
    let mut p = StaticPolicy::accept_all();
    p.snat = vec![(OUTSIDE, sluice_nat::Translation::Masquerade)];
    let mut w = worker(p);
    let k = key(proto::TCP, HOST, 40000, REMOTE, 443);
    let mut orig = vec![0u8; 2048];
    let n = build_tcp6(&mut orig, HOST_MAC, GW_IN_MAC, &k, 0x02, 1, 0, 0).unwrap();
    let (act, f) = run(&mut w, INSIDE, |b| {
        b[..n].copy_from_slice(&orig[..n]);
        n
    });
    assert_eq!(act, Action::Forward(OUTSIDE));
    assert_eq!(f[21], orig[21] - 1);
    assert_eq!(
        &f[22..],
        &orig[22..n],
        "addresses, ports and checksum unchanged"
    );
    assert_eq!(w.nat().mappings().count(), 0, "no NAT state");
}

/// The fragments of a UDP datagram from the host (Ethernet frames): a
/// fragment header (identification `ident`) in each, `chunk` bytes of the
/// UDP datagram per fragment.
fn udp6_fragments(ident: u32, data_len: usize, chunk: usize, hop_limit: u8) -> Vec<Vec<u8>> {
    let mut udp = vec![0u8; 8 + data_len];
    udp[0..2].copy_from_slice(&5000u16.to_be_bytes());
    udp[2..4].copy_from_slice(&53u16.to_be_bytes());
    udp[4..6].copy_from_slice(&((8 + data_len) as u16).to_be_bytes());
    // Not verified by a router; only zero is refused (RFC 8200 section 8.1).
    udp[6..8].copy_from_slice(&0x1234u16.to_be_bytes());
    let pieces: Vec<&[u8]> = udp.chunks(chunk).collect();
    let n = pieces.len();
    pieces
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let mut f = vec![0u8; 14 + 40 + 8 + p.len()];
            f[0..6].copy_from_slice(&GW_IN_MAC);
            f[6..12].copy_from_slice(&HOST_MAC);
            f[12..14].copy_from_slice(&[0x86, 0xdd]);
            let ip6 = &mut f[14..];
            ip6[0] = 0x60;
            ip6[4..6].copy_from_slice(&((8 + p.len()) as u16).to_be_bytes());
            ip6[6] = 44;
            ip6[7] = hop_limit;
            ip6[8..24].copy_from_slice(&ip(HOST).octets());
            ip6[24..40].copy_from_slice(&ip(REMOTE).octets());
            ip6[40] = 17;
            let off = ((i * chunk) as u16) | u16::from(i + 1 < n);
            ip6[42..44].copy_from_slice(&off.to_be_bytes());
            ip6[44..48].copy_from_slice(&ident.to_be_bytes());
            ip6[48..].copy_from_slice(p);
            f
        })
        .collect()
}

#[test]
fn later_fragments_follow_their_first_fragment() {
    let mut w = worker(InsideOnly);
    let frags = udp6_fragments(0x1234_5678, 2000, 1232, 64);
    assert_eq!(frags.len(), 2);
    let mut t = TestFrames::default();
    for f in &frags {
        t.push(INSIDE, |b| {
            b[..f.len()].copy_from_slice(f);
            f.len()
        });
    }
    w.process(1_000_000_000, &mut t);
    assert_eq!(t.acts, vec![Action::Forward(OUTSIDE); 2]);
    for i in 0..2 {
        let f = t.frame(i);
        assert_eq!(
            &f[0..6],
            &ROUTER_MAC,
            "fragment {i} to the first one's next hop"
        );
        assert_eq!(f[14 + 7], 63, "hop limit decremented");
    }
    // A later fragment of a datagram whose first fragment never passed,
    // and one whose hop limit runs out, are dropped.
    let other = udp6_fragments(0x1234_5679, 2000, 1232, 64);
    let (act, _) = run(&mut w, INSIDE, |b| {
        b[..other[1].len()].copy_from_slice(&other[1]);
        other[1].len()
    });
    assert_eq!(act, Action::Drop(DropReason::Fragment));
    let tired = udp6_fragments(0x1234_5678, 2000, 1232, 1);
    let (act, _) = run(&mut w, INSIDE, |b| {
        b[..tired[1].len()].copy_from_slice(&tired[1]);
        tired[1].len()
    });
    assert_eq!(act, Action::Drop(DropReason::TtlExpired));
    // A flush forgets the datagram.
    w.flush();
    let (act, _) = run(&mut w, INSIDE, |b| {
        b[..frags[1].len()].copy_from_slice(&frags[1]);
        frags[1].len()
    });
    assert_eq!(act, Action::Drop(DropReason::Fragment));
}

/// A packet in a link-layer multicast frame is never forwarded (the
/// kernel's `ip6_forward`), not even for a tracked connection; one in a
/// frame to another station is not for the gateway at all.
#[test]
fn group_and_foreign_frames_are_not_forwarded() {
    let mut w = worker(StaticPolicy::accept_all());
    let k = key(proto::UDP, HOST, 1000, REMOTE, 53);
    let group = [0x33, 0x33, 0, 0, 0, 1];
    let other = [2, 0, 0, 0, 0x77, 0x77];
    let send = |w: &mut Worker, mac: [u8; 6]| {
        run(w, INSIDE, |b| build_udp6(b, HOST_MAC, mac, &k, 4).unwrap()).0
    };
    assert_eq!(send(&mut w, group), Action::Drop(DropReason::LinkBroadcast));
    assert_eq!(send(&mut w, other), Action::Drop(DropReason::OtherHost));
    assert_eq!(send(&mut w, GW_IN_MAC), Action::Forward(OUTSIDE));
    assert_eq!(send(&mut w, group), Action::Drop(DropReason::LinkBroadcast));
    assert_eq!(send(&mut w, other), Action::Drop(DropReason::OtherHost));
    assert_eq!(send(&mut w, GW_IN_MAC), Action::Forward(OUTSIDE));
}

/// A new IPv6 default route (`Worker::set_routes`): the established
/// connection is moved to the new next hop by the walk in `gc`, dropped
/// (no-neighbor, naming that next hop) until it is known, then forwarded
/// to it.
#[test]
fn established_ipv6_connections_follow_a_route_change() {
    const R2_LL: &str = "fe80::2";
    const R2_MAC: [u8; 6] = [2, 0, 0, 0, 8, 9];
    let mut w = worker(InsideOnly);
    let k = key(proto::UDP, HOST, 4600, REMOTE, 53);
    let send = |w: &mut Worker| -> (Action, [u8; 6]) {
        let (act, f) = run(w, INSIDE, |b| {
            build_udp6(b, HOST_MAC, GW_IN_MAC, &k, 20).unwrap()
        });
        (act, f[0..6].try_into().unwrap())
    };
    assert_eq!(send(&mut w), (Action::Forward(OUTSIDE), ROUTER_MAC));
    let r2 = Route6 {
        net: 0,
        len: 0,
        oif: OUTSIDE,
        via: Some(ip(R2_LL)),
    };
    assert!(w.set_routes(&[], &[r2]).is_ok());
    w.gc(2_000_000_000, 4096);
    assert!(!w.rerouting());
    let mut t = TestFrames::default();
    t.push(INSIDE, |b| {
        build_udp6(b, HOST_MAC, GW_IN_MAC, &k, 20).unwrap()
    });
    w.process(2_000_000_000, &mut t);
    assert_eq!(t.acts[0], Action::Drop(DropReason::NoNeighbor));
    assert_eq!(w.missing_next_hop6(0), Some((OUTSIDE, ip(R2_LL))));
    w.set_neighbor6(OUTSIDE, ip(R2_LL), R2_MAC).unwrap();
    assert_eq!(send(&mut w), (Action::Forward(OUTSIDE), R2_MAC));
    assert_eq!(w.conntrack6().len(), 1, "the same connection");
    // A route out of an interface the worker does not have: refused.
    let bad = Route6 { oif: 9, ..r2 };
    assert!(w.set_routes(&[], &[bad]).is_err());
    assert_eq!(send(&mut w), (Action::Forward(OUTSIDE), R2_MAC));
}

/// Filters ICMPv6 by type on every packet (established ones too, nothing
/// accepted up front), as `icmpv6 type echo-request accept; icmpv6 type
/// echo-reply accept` in a forward chain with policy drop does.
struct EchoOnly;

impl Policy for EchoOnly {
    fn decide(&self, hook: Hook, p: &PolicyPacket) -> Decision {
        let ok =
            hook != Hook::Forward || (p.proto == proto::ICMPV6 && matches!(p.icmp, (128 | 129, 0)));
        Decision {
            verdict: if ok { Verdict::Accept } else { Verdict::Drop },
            mark: p.mark,
            nat: None,
            ct_mark: p.ct_mark,
            mss: Default::default(),
            flow_add: false,
            ct_timeout: 0,
        }
    }
    fn has_nat(&self, _: Hook) -> bool {
        false
    }
    fn established_accepted(&self) -> bool {
        false
    }
}

/// An established ICMPv6 echo filtered per packet is seen with its type
/// and code (it was seen as type 0: `icmpv6 type echo-reply accept`
/// dropped every reply; found by `sluice bench forward --ipv6 --latency
/// --rules 100`).
#[test]
fn established_echoes_filtered_per_packet_carry_their_icmpv6_type() {
    let mut w = worker(EchoOnly);
    let k = key(proto::ICMPV6, HOST, 77, REMOTE, 77);
    let echo = |w: &mut Worker, request: bool, seq: u16| {
        let (iif, k, mac, gw) = if request {
            (INSIDE, k, HOST_MAC, GW_IN_MAC)
        } else {
            (OUTSIDE, k.reversed(), ROUTER_MAC, GW_OUT_MAC)
        };
        run(w, iif, |b| {
            build_icmp6_echo(b, mac, gw, &k, seq, request, 32).unwrap()
        })
        .0
    };
    assert_eq!(echo(&mut w, true, 1), Action::Forward(OUTSIDE));
    assert_eq!(w.conntrack6().len(), 1);
    assert_eq!(echo(&mut w, false, 1), Action::Forward(INSIDE), "the reply");
    assert_eq!(
        echo(&mut w, true, 2),
        Action::Forward(OUTSIDE),
        "the next request"
    );
    assert_eq!(echo(&mut w, false, 2), Action::Forward(INSIDE), "its reply");
}

/// IPv6 connections are carried over a restart (`Worker::carried_conns`,
/// `Worker::restore`): a new worker whose policy admits new connections
/// from the inside only forwards the outside's packets of a restored
/// connection, which one that was not given it drops.
#[test]
fn ipv6_connections_survive_a_restart() {
    let k = key(proto::UDP, HOST, 5353, REMOTE, 53);
    let out = |w: &mut Worker| {
        run(w, INSIDE, |b| {
            build_udp6(b, HOST_MAC, GW_IN_MAC, &k, 20).unwrap()
        })
        .0
    };
    let back = |w: &mut Worker| {
        run(w, OUTSIDE, |b| {
            build_udp6(b, ROUTER_MAC, GW_OUT_MAC, &k.reversed(), 20).unwrap()
        })
        .0
    };
    let mut old = worker(InsideOnly);
    assert_eq!(out(&mut old), Action::Forward(OUTSIDE));
    assert_eq!(back(&mut old), Action::Forward(INSIDE));
    let saved = old.carried_conns(1_000_000_000);
    assert_eq!(saved.len(), 1);
    assert!(matches!(saved[0], sluice_engine::SavedConn::V6 { orig, .. } if orig == k));
    let mut new = worker(InsideOnly);
    new.restore(2_000_000, &saved[0]).unwrap();
    assert_eq!(new.conntrack6().len(), 1);
    assert_eq!(back(&mut new), Action::Forward(INSIDE));
    let mut fresh = worker(InsideOnly);
    assert!(matches!(back(&mut fresh), Action::Drop(_)));
}
