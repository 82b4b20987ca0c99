//! IPv4 fragments through NAT: the first fragment is translated with its
//! connection, the later ones follow it (same address rewrite, same next
//! hop), in both directions; the datagram reassembled at the far end has a
//! valid UDP checksum. Later fragments without a forwarded first fragment,
//! and with an expired TTL, are dropped with specific reasons.

use std::net::Ipv4Addr;
use std::sync::Arc;

mod common;

use common::*;
use sluice_engine::{
    Action, CtState, Decision, DropReason, Hook, IfIndex, Policy, PolicyPacket, Verdict, Worker,
};
use sluice_nat::{PoolId, Translation};
use sluice_wire::checksum;

/// Accepts everything; SNATs new connections to the pool.
struct Snat;

impl Policy for Snat {
    fn decide(&self, hook: Hook, pkt: &PolicyPacket) -> Decision {
        Decision {
            verdict: Verdict::Accept,
            mark: pkt.mark,
            nat: (hook == Hook::Postrouting && pkt.ct == CtState::New)
                .then_some(Translation::Snat { pool: PoolId(0) }),
            ct_mark: pkt.ct_mark,
            mss: Default::default(),
            flow_add: false,
            ct_timeout: 0,
        }
    }
    fn has_nat(&self, hook: Hook) -> bool {
        hook == Hook::Postrouting
    }
}

fn worker() -> Worker {
    Worker::new(nat_gateway(0, 1), Arc::new(Snat) as Arc<dyn Policy>).unwrap()
}

/// The UDP fragments of `datagram`.
fn fragments(
    macs: ([u8; 6], [u8; 6]),
    src: Ipv4Addr,
    dst: Ipv4Addr,
    ident: u16,
    ttl: u8,
    datagram: &[u8],
) -> Vec<Vec<u8>> {
    ipv4_fragments(macs, src, dst, 17, ident, ttl, datagram)
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
