//! What the engine accepts from the link and from the network before it
//! forwards anything, as the kernel's receive path does:
//!
//! - a frame to another station's MAC address is not for the gateway
//!   (`other-host`), whatever it carries, even a packet of a connection it
//!   tracks;
//! - a packet in a link-layer broadcast or multicast frame is for the
//!   gateway itself or for nobody: it is never forwarded (`link-broadcast`,
//!   RFC 1812 §5.3.4), again not even for a tracked connection; ARP
//!   requests, which are broadcasts, are still answered;
//! - IPv4 addresses the kernel's input routing refuses are dropped
//!   (`martian-source`, `martian-destination`), multicast destinations too
//!   (`ipv4-multicast`: the engine routes no multicast);
//! - broadcasts (the limited broadcast, an interface subnet's broadcast
//!   address, a DHCP discover from `0.0.0.0`) go to the gateway itself,
//!   which answers no echo request sent to them, and are never forwarded.

use std::net::Ipv4Addr;
use std::sync::Arc;

mod common;

use common::*;
use sluice_engine::{Action, DropReason, Route4, StaticPolicy, Worker};
use sluice_nat::{PoolId, Translation};
use sluice_wire::build::{build_icmp4_echo, build_udp4};
use sluice_wire::flow::{proto, FlowKey4};

const OTHER_MAC: [u8; 6] = [2, 0, 0, 0, 0x77, 0x77];
const BROADCAST_MAC: [u8; 6] = [0xff; 6];

fn gateway() -> Worker {
    let mut p = StaticPolicy::accept_all();
    p.snat = vec![(OUTSIDE, Translation::Snat { pool: PoolId(0) })];
    Worker::new(nat_gateway(0, 1), Arc::new(p)).unwrap()
}

fn udp(src: Ipv4Addr, sport: u16, dst: Ipv4Addr, dport: u16) -> FlowKey4 {
    FlowKey4 {
        src: u32::from(src),
        dst: u32::from(dst),
        sport,
        dport,
        proto: proto::UDP,
    }
}

/// An ARP request from the inside host for the gateway's inside address
/// (10.0.0.1), in a frame to `dst_mac`; its length.
fn arp_request(b: &mut [u8], dst_mac: [u8; 6]) -> usize {
    b[..6].copy_from_slice(&dst_mac);
    b[6..12].copy_from_slice(&HOST_MAC);
    b[12..14].copy_from_slice(&[0x08, 0x06]);
    b[14..22].copy_from_slice(&[0, 1, 8, 0, 6, 4, 0, 1]);
    b[22..28].copy_from_slice(&HOST_MAC);
    b[28..32].copy_from_slice(&HOST.octets());
    b[38..42].copy_from_slice(&[10, 0, 0, 1]);
    60
}

/// One UDP frame from an inside host to `dst_mac`; the action taken.
fn send(w: &mut Worker, dst_mac: [u8; 6], k: &FlowKey4) -> Action {
    let mut f = TestFrames::default();
    f.push(INSIDE, |b| build_udp4(b, HOST_MAC, dst_mac, k, 20).unwrap());
    w.process(1_000_000, &mut f);
    f.acts[0]
}

#[test]
fn frames_to_other_stations_are_never_forwarded() {
    let mut w = gateway();
    let k = udp(HOST, 4000, REMOTE, 53);
    assert_eq!(
        send(&mut w, OTHER_MAC, &k),
        Action::Drop(DropReason::OtherHost)
    );
    assert_eq!(w.conntrack().len(), 0, "no connection from a foreign frame");
    // The connection exists once the host sends to the gateway; a copy of
    // its packet to another station is still not forwarded (fast path).
    assert_eq!(send(&mut w, GW_IN_MAC, &k), Action::Forward(OUTSIDE));
    assert_eq!(
        send(&mut w, OTHER_MAC, &k),
        Action::Drop(DropReason::OtherHost)
    );
    assert_eq!(send(&mut w, GW_IN_MAC, &k), Action::Forward(OUTSIDE));
    assert_eq!(w.counters().drops_for(DropReason::OtherHost), 2);
}

#[test]
fn link_broadcasts_reach_only_the_gateway() {
    let mut w = gateway();
    let k = udp(HOST, 4001, REMOTE, 53);
    assert_eq!(
        send(&mut w, BROADCAST_MAC, &k),
        Action::Drop(DropReason::LinkBroadcast)
    );
    assert_eq!(
        send(&mut w, [0x01, 0x00, 0x5e, 0, 0, 1], &k),
        Action::Drop(DropReason::LinkBroadcast),
        "a multicast frame neither"
    );
    assert_eq!(w.conntrack().len(), 0);
    // Not even for a tracked connection.
    assert_eq!(send(&mut w, GW_IN_MAC, &k), Action::Forward(OUTSIDE));
    assert_eq!(
        send(&mut w, BROADCAST_MAC, &k),
        Action::Drop(DropReason::LinkBroadcast)
    );
    assert_eq!(w.counters().drops_for(DropReason::LinkBroadcast), 3);

    // A broadcast ARP request for the gateway's address is answered; the
    // same request to another station is not for the gateway.
    let mut f = TestFrames::default();
    f.push(INSIDE, |b| arp_request(b, BROADCAST_MAC));
    f.push(INSIDE, |b| arp_request(b, OTHER_MAC));
    w.process(2_000_000, &mut f);
    assert_eq!(f.acts[0], Action::Reply);
    assert_eq!(&f.frame(0)[..6], &HOST_MAC, "the reply goes to the asker");
    assert_eq!(f.acts[1], Action::Drop(DropReason::OtherHost));
}

#[test]
fn martian_and_multicast_addresses_are_refused_as_the_kernel_does() {
    let ip = Ipv4Addr::new;
    let cases = [
        (ip(127, 0, 0, 1), REMOTE, DropReason::MartianSource),
        (ip(0, 0, 0, 0), REMOTE, DropReason::MartianSource),
        (ip(0, 1, 2, 3), REMOTE, DropReason::MartianSource),
        (ip(224, 0, 0, 1), REMOTE, DropReason::MartianSource),
        (ip(255, 255, 255, 255), REMOTE, DropReason::MartianSource),
        (HOST, ip(127, 0, 0, 1), DropReason::MartianDestination),
        (HOST, ip(0, 0, 0, 5), DropReason::MartianDestination),
        (HOST, ip(224, 0, 0, 251), DropReason::Ipv4Multicast),
        (HOST, ip(239, 1, 2, 3), DropReason::Ipv4Multicast),
        // A loopback destination is refused before a loopback source.
        (
            ip(127, 0, 0, 1),
            ip(127, 0, 0, 2),
            DropReason::MartianDestination,
        ),
    ];
    let mut w = gateway();
    for (i, (s, d, want)) in cases.iter().enumerate() {
        let k = udp(*s, 5000 + i as u16, *d, 53);
        assert_eq!(
            send(&mut w, GW_IN_MAC, &k),
            Action::Drop(*want),
            "{s} -> {d}"
        );
    }
    assert_eq!(w.conntrack().len(), 0);
    assert_eq!(w.nat().mappings().count(), 0, "no mapping for a martian");
    // Neither class E nor a broadcast address of a remote network is
    // special to the kernel's routing: both are forwarded.
    for (i, d) in [ip(240, 0, 0, 1), ip(192, 0, 2, 255)].iter().enumerate() {
        let k = udp(HOST, 6000 + i as u16, *d, 53);
        assert_eq!(send(&mut w, GW_IN_MAC, &k), Action::Forward(OUTSIDE));
    }
}

#[test]
fn broadcasts_are_for_the_gateway_and_never_forwarded() {
    let mut w = gateway();
    let ip = Ipv4Addr::new;
    // DHCP discover, the limited broadcast, the inside subnet's broadcast
    // (10.0.0.0/24 in `nat_gateway`), as broadcast frames and (for the two
    // broadcast addresses) sent to the gateway's own MAC.
    let cases = [
        (
            BROADCAST_MAC,
            udp(ip(0, 0, 0, 0), 68, Ipv4Addr::BROADCAST, 67),
        ),
        (BROADCAST_MAC, udp(HOST, 137, Ipv4Addr::BROADCAST, 137)),
        (BROADCAST_MAC, udp(HOST, 138, ip(10, 0, 0, 255), 138)),
        (GW_IN_MAC, udp(HOST, 139, Ipv4Addr::BROADCAST, 139)),
        (GW_IN_MAC, udp(HOST, 140, ip(10, 0, 0, 255), 140)),
    ];
    for (mac, k) in cases {
        assert_eq!(
            send(&mut w, mac, &k),
            Action::Drop(DropReason::LocalUnhandled),
            "{k}"
        );
    }
    // No echo reply to a broadcast ping; a ping to the gateway is answered.
    let mut f = TestFrames::default();
    let bping = FlowKey4 {
        src: u32::from(HOST),
        dst: u32::from(ip(10, 0, 0, 255)),
        sport: 7,
        dport: 7,
        proto: proto::ICMP,
    };
    let ping = FlowKey4 {
        dst: u32::from(ip(10, 0, 0, 1)),
        ..bping
    };
    f.push(INSIDE, |b| {
        build_icmp4_echo(b, HOST_MAC, BROADCAST_MAC, &bping, 1, true, 8).unwrap()
    });
    f.push(INSIDE, |b| {
        build_icmp4_echo(b, HOST_MAC, GW_IN_MAC, &ping, 1, true, 8).unwrap()
    });
    w.process(2_000_000, &mut f);
    assert_eq!(f.acts[0], Action::Drop(DropReason::LocalUnhandled));
    assert_eq!(f.acts[1], Action::Reply);
    assert_eq!(w.conntrack().len(), 0);
    assert_eq!(w.counters().tx, 0, "nothing was forwarded");
}

/// Frame `n` bytes long in `b` with a tag (`tpid`, `tci`) inserted after the
/// MAC addresses; the new length.
fn tag(b: &mut [u8], n: usize, tpid: u16, tci: u16) -> usize {
    b.copy_within(12..n, 16);
    b[12..14].copy_from_slice(&tpid.to_be_bytes());
    b[14..16].copy_from_slice(&tci.to_be_bytes());
    n + 4
}

#[test]
fn vlan_tagged_frames_are_neither_forwarded_nor_answered() {
    let mut w = gateway();
    let k = udp(HOST, 4100, REMOTE, 53);
    let mut f = TestFrames::default();
    // VLAN 100 (802.1Q), VLAN 7 in an 802.1ad outer tag, and QinQ 0 / 100.
    f.push(INSIDE, |b| {
        let n = build_udp4(b, HOST_MAC, GW_IN_MAC, &k, 20).unwrap();
        tag(b, n, 0x8100, 100)
    });
    f.push(INSIDE, |b| {
        let n = build_udp4(b, HOST_MAC, GW_IN_MAC, &k, 20).unwrap();
        tag(b, n, 0x88a8, 7)
    });
    f.push(INSIDE, |b| {
        let n = build_udp4(b, HOST_MAC, GW_IN_MAC, &k, 20).unwrap();
        let n = tag(b, n, 0x8100, 100);
        tag(b, n, 0x88a8, 0)
    });
    // An ARP request for the gateway's address, broadcast on VLAN 100.
    f.push(INSIDE, |b| {
        let n = arp_request(b, BROADCAST_MAC);
        tag(b, n, 0x8100, 100)
    });
    w.process(1_000_000, &mut f);
    for (i, a) in f.acts.iter().enumerate() {
        assert_eq!(*a, Action::Drop(DropReason::VlanTagged), "frame {i}");
    }
    assert_eq!(w.conntrack().len(), 0, "no connection from a tagged frame");
    assert_eq!(w.counters().drops_for(DropReason::VlanTagged), 4);

    // Once the connection exists (an untagged frame), a tagged copy of
    // its packets is still dropped (fast path).
    assert_eq!(send(&mut w, GW_IN_MAC, &k), Action::Forward(OUTSIDE));
    let mut f = TestFrames::default();
    f.push(INSIDE, |b| {
        let n = build_udp4(b, HOST_MAC, GW_IN_MAC, &k, 20).unwrap();
        tag(b, n, 0x8100, 0x2000 | 100)
    });
    w.process(2_000_000, &mut f);
    assert_eq!(f.acts[0], Action::Drop(DropReason::VlanTagged));
    assert_eq!(w.counters().drops_for(DropReason::VlanTagged), 5);
}

#[test]
fn priority_tagged_frames_are_handled_untagged() {
    let mut w = gateway();
    let k = udp(HOST, 4200, REMOTE, 53);
    let mut plain = TestFrames::default();
    plain.push(INSIDE, |b| {
        build_udp4(b, HOST_MAC, GW_IN_MAC, &k, 20).unwrap()
    });
    let plain_len = plain.frame(0).len();
    // VLAN id 0 with priority 5 (802.1p), then two priority tags (802.1ad
    // outer, 802.1Q inner): both leave untagged, as the kernel sends them.
    for (round, tags) in [
        &[(0x8100u16, 0xa000u16)][..],
        &[(0x8100, 0), (0x88a8, 0x2000)],
    ]
    .into_iter()
    .enumerate()
    {
        let mut f = TestFrames::default();
        f.push(INSIDE, |b| {
            let mut n = build_udp4(b, HOST_MAC, GW_IN_MAC, &k, 20).unwrap();
            for (tpid, tci) in tags {
                n = tag(b, n, *tpid, *tci);
            }
            n
        });
        w.process(1_000_000 + round as u64, &mut f);
        assert_eq!(f.acts[0], Action::Forward(OUTSIDE), "round {round}");
        let out = f.frame(0);
        assert_eq!(out.len(), plain_len, "round {round}: the tags are gone");
        assert_eq!(
            &out[12..14],
            &[0x08, 0x00],
            "round {round}: IPv4 after the MACs"
        );
        assert_eq!(out[14], 0x45, "round {round}");
    }
    assert_eq!(w.conntrack().len(), 1);
    assert_eq!(w.counters().drops_for(DropReason::VlanTagged), 0);
    // A priority-tagged ARP request for the gateway's address is answered.
    let mut f = TestFrames::default();
    f.push(INSIDE, |b| {
        let n = arp_request(b, BROADCAST_MAC);
        tag(b, n, 0x8100, 0)
    });
    w.process(3_000_000, &mut f);
    assert_eq!(f.acts[0], Action::Reply);
}

#[test]
fn frames_out_of_a_link_that_is_down_are_counted_not_sent() {
    let mut w = gateway();
    let k = udp(HOST, 4300, REMOTE, 53);
    assert_eq!(send(&mut w, GW_IN_MAC, &k), Action::Forward(OUTSIDE));
    assert!(w.link_up(OUTSIDE));
    w.set_link_up(OUTSIDE, false);
    assert!(!w.link_up(OUTSIDE) && w.link_up(INSIDE));
    // The established connection (fast path) and a new one (slow path).
    assert_eq!(
        send(&mut w, GW_IN_MAC, &k),
        Action::Drop(DropReason::LinkDown)
    );
    let k2 = udp(HOST, 4301, REMOTE, 53);
    assert_eq!(
        send(&mut w, GW_IN_MAC, &k2),
        Action::Drop(DropReason::LinkDown)
    );
    assert_eq!(w.counters().drops_for(DropReason::LinkDown), 2);
    // What arrives for the gateway itself is still answered.
    let mut f = TestFrames::default();
    f.push(INSIDE, |b| arp_request(b, BROADCAST_MAC));
    w.process(2_000_000, &mut f);
    assert_eq!(f.acts[0], Action::Reply);
    w.set_link_up(OUTSIDE, true);
    assert_eq!(send(&mut w, GW_IN_MAC, &k), Action::Forward(OUTSIDE));
    assert_eq!(send(&mut w, GW_IN_MAC, &k2), Action::Forward(OUTSIDE));
    assert_eq!(w.counters().drops_for(DropReason::LinkDown), 2);
    // An interface the worker does not have changes nothing.
    w.set_link_up(99, false);
    assert_eq!(send(&mut w, GW_IN_MAC, &k), Action::Forward(OUTSIDE));
}

/// An interface replaced by a new one with another MAC and MTU
/// (`Worker::relink`): frames to the new MAC are the gateway's, frames to
/// the old one another station's; established and new connections leave
/// with the new source MAC and respect the new MTU; the connection table is
/// kept.
#[test]
fn a_replaced_interface_takes_its_new_mac_and_mtu() {
    const NEW_MAC: [u8; 6] = [2, 0, 0, 0, 7, 7];
    let mut w = gateway();
    let k = udp(HOST, 4400, REMOTE, 53);
    let out_mac = |w: &mut Worker, dst: [u8; 6], k: &FlowKey4| -> (Action, [u8; 6]) {
        let mut f = TestFrames::default();
        f.push(INSIDE, |b| build_udp4(b, HOST_MAC, dst, k, 20).unwrap());
        w.process(1_000_000, &mut f);
        let src: [u8; 6] = f.frame(0)[6..12].try_into().unwrap();
        (f.acts[0], src)
    };
    assert_eq!(
        out_mac(&mut w, GW_IN_MAC, &k),
        (Action::Forward(OUTSIDE), GW_OUT_MAC)
    );
    let conns = w.conntrack().len();
    // The inside interface comes back with NEW_MAC, the outside one with
    // the same MAC and a smaller MTU.
    w.relink(INSIDE, NEW_MAC, 1500);
    w.relink(OUTSIDE, GW_OUT_MAC, 100);
    assert_eq!(w.conntrack().len(), conns, "connections kept");
    assert_eq!(
        send(&mut w, GW_IN_MAC, &k),
        Action::Drop(DropReason::OtherHost),
        "the old MAC is no longer the gateway's"
    );
    // 20 bytes of payload: a 48-byte IP packet fits in 100.
    assert_eq!(
        out_mac(&mut w, NEW_MAC, &k),
        (Action::Forward(OUTSIDE), GW_OUT_MAC)
    );
    let mut f = TestFrames::default();
    f.push(INSIDE, |b| {
        build_udp4(b, HOST_MAC, NEW_MAC, &k, 200).unwrap()
    });
    w.process(1_000_000, &mut f);
    assert_ne!(
        f.acts[0],
        Action::Forward(OUTSIDE),
        "a 228-byte packet above the new MTU of 100"
    );
    // The inside interface's new MAC is the source of what leaves by it.
    w.relink(OUTSIDE, NEW_MAC, 1500);
    let k2 = udp(HOST, 4401, REMOTE, 53);
    assert_eq!(
        out_mac(&mut w, NEW_MAC, &k2),
        (Action::Forward(OUTSIDE), NEW_MAC)
    );
    assert_eq!(
        out_mac(&mut w, NEW_MAC, &k),
        (Action::Forward(OUTSIDE), NEW_MAC)
    );
    // An interface the worker does not have changes nothing.
    w.relink(99, [2, 9, 9, 9, 9, 9], 1500);
    assert_eq!(
        out_mac(&mut w, NEW_MAC, &k),
        (Action::Forward(OUTSIDE), NEW_MAC)
    );
}

/// New static routes (`Worker::set_routes`, a reload): new connections
/// take them at once; an established one is moved over by the walk in
/// `gc`, waits (no-neighbor, naming the new next hop for the resolver)
/// until that next hop is known, then leaves by it, the same connection.
/// A route naming an interface the worker does not have is refused and
/// changes nothing.
#[test]
fn established_connections_follow_a_route_change() {
    const R2: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 253);
    const R2_MAC: [u8; 6] = [2, 0, 0, 0, 8, 9];
    let mut w = gateway();
    let k = udp(HOST, 4500, REMOTE, 53);
    let out = |w: &mut Worker, k: &FlowKey4| -> (Action, [u8; 6]) {
        let mut f = TestFrames::default();
        f.push(INSIDE, |b| {
            build_udp4(b, HOST_MAC, GW_IN_MAC, k, 20).unwrap()
        });
        w.process(1_000_000, &mut f);
        let dst: [u8; 6] = f.frame(0)[0..6].try_into().unwrap();
        (f.acts[0], dst)
    };
    assert_eq!(out(&mut w, &k), (Action::Forward(OUTSIDE), ROUTER_MAC));
    let conns = w.conntrack().len();
    let via = |r: Ipv4Addr| Route4 {
        net: 0,
        len: 0,
        oif: OUTSIDE,
        via: Some(r),
    };
    assert!(w.set_routes(&[via(R2)], &[]).is_ok());
    assert!(w.rerouting());
    // Until the walk reaches it, the connection keeps its next hop.
    assert_eq!(out(&mut w, &k), (Action::Forward(OUTSIDE), ROUTER_MAC));
    w.gc(2_000_000, 4096);
    assert!(!w.rerouting(), "1000 slots in one step of 4096");
    let mut f = TestFrames::default();
    f.push(INSIDE, |b| {
        build_udp4(b, HOST_MAC, GW_IN_MAC, &k, 20).unwrap()
    });
    w.process(2_000_000, &mut f);
    assert_eq!(f.acts[0], Action::Drop(DropReason::NoNeighbor));
    assert_eq!(w.missing_next_hop(0), Some((OUTSIDE, R2)));
    w.set_neighbor(R2, R2_MAC).unwrap();
    assert_eq!(out(&mut w, &k), (Action::Forward(OUTSIDE), R2_MAC));
    assert_eq!(w.conntrack().len(), conns, "the same connection");
    let k2 = udp(HOST, 4501, REMOTE, 53);
    assert_eq!(out(&mut w, &k2), (Action::Forward(OUTSIDE), R2_MAC));
    // Refused: interface 7 does not exist; the routes stay.
    let bad = Route4 {
        net: u32::from(Ipv4Addr::new(192, 0, 2, 0)),
        len: 24,
        oif: 7,
        via: None,
    };
    assert!(w.set_routes(&[via(ROUTER_PUBLIC), bad], &[]).is_err());
    assert!(!w.rerouting());
    let k3 = udp(HOST, 4502, REMOTE, 53);
    assert_eq!(out(&mut w, &k3), (Action::Forward(OUTSIDE), R2_MAC));
    // Back to the first router, known all along: no wait.
    assert!(w.set_routes(&[via(ROUTER_PUBLIC)], &[]).is_ok());
    w.gc(3_000_000, 4096);
    assert_eq!(out(&mut w, &k), (Action::Forward(OUTSIDE), ROUTER_MAC));
    assert_eq!(out(&mut w, &k3), (Action::Forward(OUTSIDE), ROUTER_MAC));
    // No route any more: new connections are refused, established ones
    // keep their path until they end.
    assert!(w.set_routes(&[], &[]).is_ok());
    w.gc(4_000_000, 4096);
    assert_eq!(out(&mut w, &k), (Action::Forward(OUTSIDE), ROUTER_MAC));
    let k4 = udp(HOST, 4503, REMOTE, 53);
    assert_eq!(out(&mut w, &k4).0, Action::Drop(DropReason::NoRoute));
}

const ROUTER_PUBLIC: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 254);

/// New conntrack timeouts (`Worker::set_timeouts`, a reload): a connection
/// keeps its expiry until its next packet, which sets it by the new ones.
#[test]
fn new_timeouts_apply_from_a_connections_next_packet() {
    const S: u64 = 1_000_000_000;
    let mut w = gateway();
    let k = udp(HOST, 4700, REMOTE, 53);
    let at = |w: &mut Worker, t: u64| {
        let mut f = TestFrames::default();
        f.push(INSIDE, |b| {
            build_udp4(b, HOST_MAC, GW_IN_MAC, &k, 20).unwrap()
        });
        w.process(t, &mut f);
        assert_eq!(f.acts[0], Action::Forward(OUTSIDE));
    };
    at(&mut w, S);
    let short = sluice_conntrack::Timeouts {
        udp: std::time::Duration::from_secs(5),
        ..Default::default()
    };
    w.set_timeouts(&short);
    // Still the default 30 s from the first packet: alive at 20 s.
    w.gc(20 * S, 4096);
    assert_eq!(w.conntrack().len(), 1);
    // The next packet (at 20 s) gives it 5 s: gone at 26 s.
    at(&mut w, 20 * S);
    w.gc(24 * S, 4096);
    assert_eq!(w.conntrack().len(), 1);
    w.gc(26 * S, 4096);
    assert_eq!(w.conntrack().len(), 0);
}

/// A static neighbour taken out of the configuration
/// (`Worker::clear_neighbor`): its connections wait (no-neighbor, naming
/// it for the resolver) until it is learnt again, then go on.
#[test]
fn a_forgotten_neighbour_is_resolved_again() {
    const LEARNT: [u8; 6] = [2, 0, 0, 0, 8, 0x42];
    let mut w = gateway();
    let k = udp(HOST, 4800, REMOTE, 53);
    assert_eq!(send(&mut w, GW_IN_MAC, &k), Action::Forward(OUTSIDE));
    assert!(w.clear_neighbor(ROUTER_PUBLIC));
    assert!(
        !w.clear_neighbor(Ipv4Addr::new(203, 0, 113, 99)),
        "never known"
    );
    let mut f = TestFrames::default();
    f.push(INSIDE, |b| {
        build_udp4(b, HOST_MAC, GW_IN_MAC, &k, 20).unwrap()
    });
    w.process(2_000_000, &mut f);
    assert_eq!(f.acts[0], Action::Drop(DropReason::NoNeighbor));
    assert_eq!(w.missing_next_hop(0), Some((OUTSIDE, ROUTER_PUBLIC)));
    w.set_neighbor(ROUTER_PUBLIC, LEARNT).unwrap();
    let mut f = TestFrames::default();
    f.push(INSIDE, |b| {
        build_udp4(b, HOST_MAC, GW_IN_MAC, &k, 20).unwrap()
    });
    w.process(3_000_000, &mut f);
    assert_eq!(f.acts[0], Action::Forward(OUTSIDE));
    assert_eq!(&f.frame(0)[0..6], &LEARNT);
}

/// New interface addresses (`Worker::set_addrs`, a reload): the gateway
/// answers pings to its new address and no longer to the old one; a
/// masquerading connection keeps its old external address until it ends
/// while a new one leaves from the new address; the connected route of
/// the new subnet replaces the old one. Refused input changes nothing.
#[test]
fn new_interface_addresses_are_taken_and_masquerade_follows() {
    const NEW_PUBLIC: Ipv4Addr = Ipv4Addr::new(203, 0, 114, 1);
    let mut p = StaticPolicy::accept_all();
    p.snat = vec![(OUTSIDE, Translation::Masquerade)];
    let mut cfg = nat_gateway(0, 1);
    cfg.neighbors
        .push((Ipv4Addr::new(203, 0, 114, 254), ROUTER_MAC));
    let mut w = Worker::new(cfg, Arc::new(p)).unwrap();
    let out = |w: &mut Worker, k: &FlowKey4| -> (Action, u32) {
        let mut f = TestFrames::default();
        f.push(INSIDE, |b| {
            build_udp4(b, HOST_MAC, GW_IN_MAC, k, 20).unwrap()
        });
        w.process(1_000_000, &mut f);
        let src = u32::from_be_bytes(f.frame(0)[26..30].try_into().unwrap());
        (f.acts[0], src)
    };
    let ping = |w: &mut Worker, dst: Ipv4Addr| -> Action {
        let k = FlowKey4 {
            src: u32::from(HOST),
            dst: u32::from(dst),
            sport: 9,
            dport: 9,
            proto: proto::ICMP,
        };
        let mut f = TestFrames::default();
        f.push(INSIDE, |b| {
            build_icmp4_echo(b, HOST_MAC, GW_IN_MAC, &k, 1, true, 8).unwrap()
        });
        w.process(1_000_000, &mut f);
        f.acts[0]
    };
    let old = udp(HOST, 4600, REMOTE, 53);
    assert_eq!(
        out(&mut w, &old),
        (Action::Forward(OUTSIDE), u32::from(PUBLIC))
    );
    assert_eq!(ping(&mut w, PUBLIC), Action::Reply);
    // The outside interface is renumbered into 203.0.114.0/24, its default
    // route through that subnet's router.
    let routes = [Route4 {
        net: 0,
        len: 0,
        oif: OUTSIDE,
        via: Some(Ipv4Addr::new(203, 0, 114, 254)),
    }];
    let addrs = vec![
        vec![(Ipv4Addr::new(10, 0, 0, 1), 24)],
        vec![(NEW_PUBLIC, 24)],
    ];
    // A route out of an interface the worker does not have is refused,
    // and changes nothing.
    let bad = [Route4 {
        oif: 7,
        ..routes[0]
    }];
    assert!(w.set_addrs(&addrs, &[], &bad, &[]).is_err());
    assert_eq!(w.interface_addrs(OUTSIDE), &[(PUBLIC, 24)]);
    w.set_addrs(&addrs, &[], &routes, &[]).unwrap();
    assert_eq!(w.interface_addrs(OUTSIDE), &[(NEW_PUBLIC, 24)]);
    assert_eq!(ping(&mut w, NEW_PUBLIC), Action::Reply);
    assert_ne!(
        ping(&mut w, PUBLIC),
        Action::Reply,
        "the old address is not ours"
    );
    // Let the route walk move the established connection to the new
    // router; it keeps its external address.
    while w.rerouting() {
        w.gc(2_000_000, 4096);
    }
    assert_eq!(
        out(&mut w, &old),
        (Action::Forward(OUTSIDE), u32::from(PUBLIC))
    );
    let new = udp(HOST, 4601, REMOTE, 53);
    assert_eq!(
        out(&mut w, &new),
        (Action::Forward(OUTSIDE), u32::from(NEW_PUBLIC))
    );
}

/// A reload's NAT switches (`Worker::set_nat_settings`): a per-subscriber
/// session limit is enforced from the next new connection on, the
/// established ones untouched; a setting a running worker cannot take is
/// refused and changes nothing.
#[test]
fn nat_switches_are_taken_live() {
    let mut w = gateway();
    let first = udp(HOST, 4700, REMOTE, 53);
    assert_eq!(send(&mut w, GW_IN_MAC, &first), Action::Forward(OUTSIDE));
    let mut n = nat_gateway(0, 1).nat;
    n.max_sessions_per_subscriber = 1;
    w.set_nat_settings(&n).unwrap();
    assert_eq!(send(&mut w, GW_IN_MAC, &first), Action::Forward(OUTSIDE));
    assert_eq!(
        send(&mut w, GW_IN_MAC, &udp(HOST, 4701, REMOTE, 53)),
        Action::Drop(DropReason::NatSubscriberLimit)
    );
    let mut bad = n.clone();
    bad.mapping = sluice_nat::MappingBehaviour::AddressAndPortDependent;
    assert!(w.set_nat_settings(&bad).is_err());
    assert_eq!(
        send(&mut w, GW_IN_MAC, &udp(HOST, 4702, REMOTE, 53)),
        Action::Drop(DropReason::NatSubscriberLimit),
        "the refused change kept the limit"
    );
}
