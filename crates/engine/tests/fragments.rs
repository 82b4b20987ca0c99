//! IPv4 fragments through NAT: the first fragment is translated with its
//! connection, the later ones follow it (same address rewrite, same next
//! hop), in both directions; the datagram reassembled at the far end has a
//! valid UDP checksum. Later fragments without a forwarded first fragment,
//! and with an expired TTL, are dropped with specific reasons.

use std::net::Ipv4Addr;
use std::sync::Arc;

mod common;

use common::TestFrames;
use sluice_engine::{
    Action, CtState, Decision, DropReason, EngineConfig, Hook, IfIndex, Interface, Policy,
    PolicyPacket, Route4, Verdict, Worker,
};
use sluice_nat::{NatConfig, Pool, PoolId, Translation};
use sluice_wire::checksum;

const INSIDE: IfIndex = 0;
const OUTSIDE: IfIndex = 1;
const GW_IN_MAC: [u8; 6] = [2, 0, 0, 0, 0, 1];
const GW_OUT_MAC: [u8; 6] = [2, 0, 0, 0, 0, 2];
const HOST_MAC: [u8; 6] = [2, 0, 0, 0, 9, 9];
const ROUTER_MAC: [u8; 6] = [2, 0, 0, 0, 8, 8];
const HOST: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);
const REMOTE: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 80);
const POOL: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 1);

/// Accepts everything; SNATs new connections to the pool.
struct Snat;

impl Policy for Snat {
    fn decide(&self, hook: Hook, pkt: &PolicyPacket) -> Decision {
        Decision {
            verdict: Verdict::Accept,
            mark: pkt.mark,
            nat: (hook == Hook::Postrouting && pkt.ct == CtState::New)
                .then_some(Translation::Snat { pool: PoolId(0) }),
        }
    }
    fn has_nat(&self, hook: Hook) -> bool {
        hook == Hook::Postrouting
    }
}

fn worker() -> Worker {
    let cfg = EngineConfig {
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
                addrs: vec![(Ipv4Addr::new(203, 0, 113, 1), 24)],
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
        ],
        ct_max: 1000,
        nat: NatConfig {
            pools: vec![Pool::new([POOL]).with_ports(1024..=65535)],
            ..NatConfig::default()
        },
        ..EngineConfig::default()
    };
    Worker::new(cfg, Arc::new(Snat) as Arc<dyn Policy>).unwrap()
}

/// A UDP datagram (header + `data_len` bytes) with a valid checksum.
fn udp_datagram(src: Ipv4Addr, dst: Ipv4Addr, sport: u16, dport: u16, data_len: usize) -> Vec<u8> {
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

fn udp_checksum(src: Ipv4Addr, dst: Ipv4Addr, udp: &[u8]) -> u16 {
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

/// The IPv4 fragments (Ethernet frames) of `datagram`, 1480 bytes of it
/// per fragment.
fn fragments(
    macs: ([u8; 6], [u8; 6]),
    src: Ipv4Addr,
    dst: Ipv4Addr,
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
            ip[9] = 17;
            ip[12..16].copy_from_slice(&src.octets());
            ip[16..20].copy_from_slice(&dst.octets());
            let c16 = checksum::checksum(ip);
            ip[10..12].copy_from_slice(&c16.to_be_bytes());
            f[34..].copy_from_slice(c);
            f
        })
        .collect()
}

fn run(w: &mut Worker, now: u64, iif: IfIndex, frames: &[Vec<u8>]) -> TestFrames {
    let mut t = TestFrames::default();
    for f in frames {
        t.push(iif, |b| {
            b[..f.len()].copy_from_slice(f);
            f.len()
        });
    }
    w.process(now, &mut t);
    t
}

/// Checks every forwarded fragment's IP header and reassembles the
/// datagram: (source, destination, reassembled bytes).
fn reassemble(t: &TestFrames, ident: u16) -> (Ipv4Addr, Ipv4Addr, Vec<u8>) {
    let mut out = Vec::new();
    let mut addrs = None;
    for i in 0..t.bufs.len() {
        let f = t.frame(i);
        let ip = &f[14..34];
        assert!(checksum::verify(ip), "fragment {i}: IP header checksum");
        assert_eq!(
            u16::from_be_bytes([ip[4], ip[5]]),
            ident,
            "identification kept"
        );
        assert_eq!(ip[8], 63, "TTL decremented");
        let a = (
            Ipv4Addr::from([ip[12], ip[13], ip[14], ip[15]]),
            Ipv4Addr::from([ip[16], ip[17], ip[18], ip[19]]),
        );
        assert!(
            addrs.is_none() || addrs == Some(a),
            "fragment {i} addresses {a:?}"
        );
        addrs = Some(a);
        let off = usize::from(u16::from_be_bytes([ip[6], ip[7]]) & 0x1fff) * 8;
        let data = &f[34..];
        if out.len() < off + data.len() {
            out.resize(off + data.len(), 0);
        }
        out[off..off + data.len()].copy_from_slice(data);
    }
    let (s, d) = addrs.unwrap();
    (s, d, out)
}

#[test]
fn fragments_follow_their_first_fragment_both_ways() {
    let mut w = worker();
    let out = udp_datagram(HOST, REMOTE, 5000, 53, 3500);
    let frags = fragments((HOST_MAC, GW_IN_MAC), HOST, REMOTE, 0x4242, 64, &out);
    assert_eq!(frags.len(), 3);
    let t = run(&mut w, 1_000_000_000, INSIDE, &frags);
    assert_eq!(t.acts, vec![Action::Forward(OUTSIDE); 3]);
    let (s, d, udp) = reassemble(&t, 0x4242);
    assert_eq!((s, d), (POOL, REMOTE), "every fragment SNATed to the pool");
    assert_eq!(udp.len(), out.len());
    assert_eq!(&udp[8..], &out[8..], "payload untouched");
    let xport = u16::from_be_bytes([udp[0], udp[1]]);
    assert_eq!(
        u16::from_be_bytes([udp[6], udp[7]]),
        udp_checksum(POOL, REMOTE, &udp),
        "the reassembled datagram's UDP checksum verifies"
    );
    for f in &t.bufs {
        assert_eq!(&f[0..6], &ROUTER_MAC, "next hop of the first fragment");
    }

    // The reply, fragmented by the remote, reaches the host.
    let back = udp_datagram(REMOTE, POOL, 53, xport, 3000);
    let frags = fragments((ROUTER_MAC, GW_OUT_MAC), REMOTE, POOL, 0x0101, 64, &back);
    let t = run(&mut w, 1_100_000_000, OUTSIDE, &frags);
    assert_eq!(t.acts, vec![Action::Forward(INSIDE); 3]);
    let (s, d, udp) = reassemble(&t, 0x0101);
    assert_eq!((s, d), (REMOTE, HOST));
    assert_eq!(u16::from_be_bytes([udp[2], udp[3]]), 5000);
    assert_eq!(
        u16::from_be_bytes([udp[6], udp[7]]),
        udp_checksum(REMOTE, HOST, &udp)
    );
    assert_eq!(w.conntrack().len(), 1, "one connection for both datagrams");
}

#[test]
fn later_fragments_without_their_first_are_dropped() {
    let mut w = worker();
    let out = udp_datagram(HOST, REMOTE, 5001, 53, 3500);
    let frags = fragments((HOST_MAC, GW_IN_MAC), HOST, REMOTE, 7, 64, &out);
    // Out of order: the later fragments before the first.
    let t = run(
        &mut w,
        1_000_000_000,
        INSIDE,
        &[frags[1].clone(), frags[2].clone()],
    );
    assert_eq!(t.acts, vec![Action::Drop(DropReason::Fragment); 2]);
    // A first fragment, then a later fragment of another datagram.
    let other = fragments((HOST_MAC, GW_IN_MAC), HOST, REMOTE, 8, 64, &out);
    let t = run(
        &mut w,
        1_000_000_000,
        INSIDE,
        &[frags[0].clone(), other[1].clone()],
    );
    assert_eq!(
        t.acts,
        [Action::Forward(OUTSIDE), Action::Drop(DropReason::Fragment)]
    );
    // The datagram's own later fragment, after 30 s: expired.
    let t = run(&mut w, 31_000_000_000, INSIDE, &[frags[1].clone()]);
    assert_eq!(t.acts, [Action::Drop(DropReason::Fragment)]);
    // TTL 1: dropped, no ICMP error about a later fragment.
    let ttl1 = fragments((HOST_MAC, GW_IN_MAC), HOST, REMOTE, 9, 1, &out);
    let first = fragments((HOST_MAC, GW_IN_MAC), HOST, REMOTE, 9, 64, &out);
    let t = run(
        &mut w,
        32_000_000_000,
        INSIDE,
        &[first[0].clone(), ttl1[1].clone()],
    );
    assert_eq!(
        t.acts,
        [
            Action::Forward(OUTSIDE),
            Action::Drop(DropReason::TtlExpired)
        ]
    );
    assert!(w.counters().total_drops() >= 5, "{:?}", w.counters());
}

#[test]
fn a_flush_forgets_the_fragments_too() {
    let mut w = worker();
    let out = udp_datagram(HOST, REMOTE, 5002, 53, 2000);
    let frags = fragments((HOST_MAC, GW_IN_MAC), HOST, REMOTE, 11, 64, &out);
    let t = run(&mut w, 1_000_000_000, INSIDE, &frags[..1]);
    assert_eq!(t.acts, [Action::Forward(OUTSIDE)]);
    w.flush();
    let t = run(&mut w, 1_000_000_000, INSIDE, &frags[1..]);
    assert_eq!(t.acts, [Action::Drop(DropReason::Fragment)]);
}
