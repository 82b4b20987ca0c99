//! Route changes (`Worker::set_routes`, a reload) against a reference:
//! after any sequence of route tables, and the walk that `gc` advances,
//! every established connection leaves exactly where a longest-prefix
//! match over the current table (written here, linearly) sends it: the
//! router's MAC, or dropped for want of a route (kept on its old path) or
//! of a neighbour. The same connection throughout: no connection is lost
//! or created by a route change.

mod common;

use std::net::Ipv4Addr;
use std::sync::Arc;

use common::*;
use proptest::prelude::*;
use sluice_engine::{Action, DropReason, Route4, StaticPolicy, Worker};
use sluice_nat::{PoolId, Translation};
use sluice_wire::build::build_udp4;
use sluice_wire::flow::{proto, FlowKey4};

/// Routers on the outside subnet: .250 to .253 are known neighbours,
/// .249 is not (its packets wait for ARP).
fn router(i: u8) -> Ipv4Addr {
    Ipv4Addr::new(203, 0, 113, 249 + i % 5)
}
fn router_mac(i: u8) -> Option<[u8; 6]> {
    (i % 5 != 0).then_some([2, 0, 0, 0, 0x40, i % 5])
}

/// Destinations: 192.0.2.0/24 and 198.18.0.0/16, so that /8 to /32
/// prefixes of them overlap.
fn dest(i: u16) -> Ipv4Addr {
    if i % 2 == 0 {
        Ipv4Addr::new(192, 0, 2, (i / 2) as u8)
    } else {
        Ipv4Addr::new(198, 18, (i % 7) as u8, (i / 2) as u8)
    }
}

fn table() -> impl Strategy<Value = Vec<(u16, u8, u8)>> {
    // (destination whose prefix it is, prefix length, router)
    proptest::collection::vec((0u16..64, prop_oneof![Just(0u8), 8u8..=32], 0u8..5), 0..6)
}

fn routes(t: &[(u16, u8, u8)]) -> Vec<Route4> {
    t.iter()
        .map(|&(d, len, r)| Route4 {
            net: u32::from(dest(d)) & if len == 0 { 0 } else { u32::MAX << (32 - len) },
            len,
            oif: OUTSIDE,
            via: Some(router(r)),
        })
        .collect()
}

/// The reference: the router of the longest matching prefix (the last
/// one listed among equals, as a later `add` replaces an earlier one).
fn reference(rs: &[Route4], dst: Ipv4Addr) -> Option<u8> {
    let mut best: Option<(u8, u8)> = None;
    for r in rs {
        let m = if r.len == 0 {
            0
        } else {
            u32::MAX << (32 - r.len)
        };
        if u32::from(dst) & m == r.net && best.is_none_or(|(l, _)| r.len >= l) {
            let via = r.via.map(|v| v.octets()[3] - 249).unwrap_or(0);
            best = Some((r.len, via));
        }
    }
    best.map(|(_, v)| v)
}

fn send(w: &mut Worker, k: &FlowKey4, now: u64) -> (Action, [u8; 6]) {
    let mut f = TestFrames::default();
    f.push(INSIDE, |b| {
        build_udp4(b, HOST_MAC, GW_IN_MAC, k, 20).unwrap()
    });
    w.process(now, &mut f);
    (f.acts[0], f.frame(0)[0..6].try_into().unwrap())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test]
    fn established_connections_follow_every_route_change(
        first in table(),
        changes in proptest::collection::vec(table(), 1..4),
        flows in proptest::collection::vec(0u16..64, 1..12),
    ) {
        let mut p = StaticPolicy::accept_all();
        p.snat = vec![(OUTSIDE, Translation::Snat { pool: PoolId(0) })];
        let mut cfg = nat_gateway(0, 1);
        cfg.routes = routes(&first);
        cfg.neighbors.retain(|(ip, _)| ip.octets()[..3] != [203, 0, 113]);
        for i in 1..5u8 {
            cfg.neighbors.push((router(i), router_mac(i).unwrap()));
        }
        let mut w = Worker::new(cfg, Arc::new(p)).unwrap();
        let mut now = 1_000_000_000u64;
        // Connections that exist (created while a route and a neighbour
        // were there), with the router they were created through.
        let mut live: Vec<(FlowKey4, u8)> = Vec::new();
        let mut rs = routes(&first);
        for (n, &d) in flows.iter().enumerate() {
            let k = FlowKey4 {
                src: u32::from(HOST),
                dst: u32::from(dest(d)),
                sport: 5000 + n as u16,
                dport: 53,
                proto: proto::UDP,
            };
            let (act, mac) = send(&mut w, &k, now);
            match reference(&rs, dest(d)) {
                Some(r) if router_mac(r).is_some() => {
                    prop_assert_eq!(act, Action::Forward(OUTSIDE));
                    prop_assert_eq!(Some(mac), router_mac(r));
                    live.push((k, r));
                }
                Some(_) => prop_assert_eq!(act, Action::Drop(DropReason::NoNeighbor)),
                None => prop_assert_eq!(act, Action::Drop(DropReason::NoRoute)),
            }
        }
        let conns = w.conntrack().len();
        prop_assert_eq!(conns, live.len());
        for t in &changes {
            rs = routes(t);
            prop_assert!(w.set_routes(&rs, &[]).is_ok());
            now += 10_000_000;
            w.gc(now, 4096);
            prop_assert!(!w.rerouting());
            for (k, was) in live.iter_mut() {
                let (act, mac) = send(&mut w, k, now);
                match reference(&rs, Ipv4Addr::from(k.dst)) {
                    Some(r) => match router_mac(r) {
                        Some(m) => {
                            prop_assert_eq!(act, Action::Forward(OUTSIDE));
                            prop_assert_eq!(mac, m);
                            *was = r;
                        }
                        None => {
                            prop_assert_eq!(act, Action::Drop(DropReason::NoNeighbor));
                            // The resolver is told which next hop to ask.
                            prop_assert_eq!(w.missing_next_hop(0), Some((OUTSIDE, router(r))));
                            *was = r;
                        }
                    },
                    // No route: the connection keeps the path it had.
                    None => match router_mac(*was) {
                        Some(m) => {
                            prop_assert_eq!(act, Action::Forward(OUTSIDE));
                            prop_assert_eq!(mac, m);
                        }
                        None => prop_assert_eq!(act, Action::Drop(DropReason::NoNeighbor)),
                    },
                }
            }
            prop_assert_eq!(w.conntrack().len(), conns, "no connection lost or made");
        }
    }
}
