//! [`WorkerNat::set_pools`]: pools replaced while mappings live.
#![allow(clippy::indexing_slicing, clippy::unwrap_used)]

use super::*;
use crate::config::{Pool, PoolId};
use crate::event::VecSink;
use proptest::prelude::*;
use std::collections::{HashMap as StdMap, HashSet};

fn ip(d: u8) -> Ipv4Addr {
    Ipv4Addr::new(192, 0, 2, d)
}

fn host(h: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, 0, 0, h)
}

fn pool(addrs: &[u8], ports: core::ops::RangeInclusive<u16>) -> Pool {
    Pool::new(addrs.iter().map(|&d| ip(d))).with_ports(ports)
}

fn config(pools: Vec<Pool>, workers: u16, block: u16) -> NatConfig {
    NatConfig {
        pools,
        workers,
        port_block_size: block,
        // Masquerade in the pools' range, so that its ports meet theirs.
        masquerade_ports: 2000..=2023,
        ..NatConfig::default()
    }
}

fn snat(p: u16) -> Translation {
    Translation::Snat { pool: PoolId(p) }
}

fn udp(h: u8, sport: u16, dport: u16) -> FlowKey4 {
    FlowKey4::new(
        proto::UDP,
        host(h),
        sport,
        Ipv4Addr::new(198, 51, 100, 1),
        dport,
    )
}

/// `count` UDP connections of host 1 (source ports 5000 on) through pool
/// 0: (orig, reply) each.
fn open(n: &mut WorkerNat<VecSink>, count: u16) -> Vec<(FlowKey4, FlowKey4)> {
    (0..count)
        .map(|i| {
            let o = udp(1, 5000 + i, 53);
            (o, n.translate_outbound(&o, &snat(0), None).unwrap())
        })
        .collect()
}

fn events(n: &WorkerNat<VecSink>) -> (usize, usize) {
    let e = &n.sink().events;
    (
        e.iter()
            .filter(|e| matches!(e, NatEvent::MappingCreated { .. }))
            .count(),
        e.iter()
            .filter(|e| matches!(e, NatEvent::MappingRemoved { .. }))
            .count(),
    )
}

/// An address taken out of the middle of a pool: only its mappings
/// retire; those of the other addresses keep their endpoints and sessions
/// (their bitmaps and blocks close up behind it), and new connections
/// still pair with the same addresses.
#[test]
fn an_address_out_of_the_middle_retires_only_its_mappings() {
    for block in [0, 4] {
        let c = config(vec![pool(&[1, 2, 3, 4], 2000..=2099)], 1, block);
        let mut n = WorkerNat::new(&c, 0, VecSink::default()).unwrap();
        let mut live = Vec::new();
        for h in 1..60 {
            let o = udp(h, 5000, 53);
            if let Ok(r) = n.translate_outbound(&o, &snat(0), None) {
                live.push((o, r));
            }
        }
        let on = |a: u8| {
            live.iter()
                .filter(|(_, r)| r.dst == u32::from(ip(a)))
                .count() as u64
        };
        let (on2, total) = (on(2), live.len() as u64);
        assert!(on2 > 0 && on(3) > 0 && on(4) > 0, "block {block}");
        let next = config(vec![pool(&[1, 3, 4, 9], 2000..=2099)], 1, block);
        let ch = n.set_pools(&next).unwrap();
        assert_eq!((ch.kept, ch.retired), (total - on2, on2), "block {block}");
        check(&n, &live);
        // A kept mapping serves its host's next connection.
        for (o, r) in live.iter().filter(|(_, r)| r.dst != u32::from(ip(2))) {
            let o2 = udp(o.src_addr().octets()[3], o.sport, 54);
            let r2 = n.translate_outbound(&o2, &snat(0), None).unwrap();
            assert_eq!((r2.dst, r2.dport), (r.dst, r.dport), "block {block}");
            n.release(&o2, &r2);
        }
        // Releasing everything frees every port and block.
        for (o, r) in live.drain(..) {
            n.release(&o, &r);
        }
        let s = n.stats();
        assert_eq!(
            (s.mappings, s.retired, s.blocks),
            (0, 0, 0),
            "block {block}"
        );
        for a in [1, 3, 4, 9] {
            assert_eq!(n.free_ports(ip(a), proto::UDP), Some(100), "block {block}");
        }
    }
}

/// Pools live in slots: a pool put ahead of another leaves the other's
/// mappings as they are (the same realm and space, nothing renumbered or
/// visited), a new connection through its new number finds them, and a
/// slot whose pool left is taken by the next new pool.
#[test]
fn a_pool_keeps_its_slot_when_others_come_and_go() {
    let a = pool(&[1, 2], 2000..=2099);
    let c = config(vec![a.clone()], 1, 0);
    let mut n = WorkerNat::new(&c, 0, VecSink::default()).unwrap();
    let live = open(&mut n, 20);
    let before: Vec<Mapping> = live
        .iter()
        .map(|(_, r)| {
            n.by_ext[&ExtKey {
                proto: proto::UDP,
                addr: r.dst,
                port: r.dport,
            }]
        })
        .collect();
    // B put ahead: A is pool 1 now, still in slot 0; B takes slot 1.
    let b = pool(&[7], 3000..=3099);
    let ch = n
        .set_pools(&config(vec![b.clone(), a.clone()], 1, 0))
        .unwrap();
    assert_eq!((ch.kept, ch.retired), (20, 0));
    assert_eq!(n.slot_of, vec![1, 0]);
    for ((_, r), m) in live.iter().zip(&before) {
        let now = n.by_ext[&ExtKey {
            proto: proto::UDP,
            addr: r.dst,
            port: r.dport,
        }];
        assert_eq!((now.key, now.space), (m.key, m.space));
    }
    // Host 1's next connection through A (number 1) takes its mapping
    // (endpoint-independent mapping, RFC 4787 REQ-1).
    let (o, r) = live[0];
    let o2 = udp(1, o.sport, 99);
    let r2 = n.translate_outbound(&o2, &snat(1), None).unwrap();
    assert_eq!((r2.dst, r2.dport), (r.dst, r.dport));
    // Through B (number 0): B's address.
    let r3 = n
        .translate_outbound(&udp(2, 7000, 53), &snat(0), None)
        .unwrap();
    assert_eq!(r3.dst, u32::from(ip(7)));
    n.release(&o2, &r2);
    // B leaves (its slot is empty), then C comes: it takes B's old slot.
    n.set_pools(&config(vec![a.clone()], 1, 0)).unwrap();
    assert_eq!(n.slot_of, vec![0]);
    assert!(n.pools[1].addrs.is_empty());
    let cpool = pool(&[9], 4000..=4099);
    n.set_pools(&config(vec![a, cpool], 1, 0)).unwrap();
    assert_eq!(n.slot_of, vec![0, 1]);
    assert_eq!(n.pools.len(), 2);
    let r4 = n
        .translate_outbound(&udp(3, 7000, 53), &snat(1), None)
        .unwrap();
    assert_eq!(r4.dst, u32::from(ip(9)));
    // (B's mapping retired, serving its session.)
    let extra = [(udp(2, 7000, 53), r3), (udp(3, 7000, 53), r4)];
    check(&n, &[live.as_slice(), &extra].concat());
    assert_eq!(n.stats().retired, 1);
}

/// A mapping on an address that stays keeps its endpoint, sessions and
/// port; one on an address that goes retires: its sessions go on, new
/// connections of its endpoint get a new mapping, and it is removed (and
/// logged) with its last session.
#[test]
fn kept_and_retired_mappings() {
    let c = config(vec![pool(&[1, 2], 2000..=2099)], 1, 0);
    let mut n = WorkerNat::new(&c, 0, VecSink::default()).unwrap();
    // Find one subscriber paired with each address.
    let mut by_addr: StdMap<u32, (FlowKey4, FlowKey4)> = StdMap::new();
    for h in 1..40 {
        let o = udp(h, 5000, 53);
        let r = n.translate_outbound(&o, &snat(0), None).unwrap();
        by_addr.entry(r.dst).or_insert((o, r));
        if by_addr.len() == 2 {
            break;
        }
    }
    let (o1, r1) = by_addr[&u32::from(ip(1))];
    let (o2, r2) = by_addr[&u32::from(ip(2))];
    // Address 1 leaves, 3 joins, and the pool moves to index 1.
    let next = config(
        vec![pool(&[7], 3000..=3099), pool(&[2, 3], 2000..=2099)],
        1,
        0,
    );
    let ch = n.set_pools(&next).unwrap();
    assert_eq!(ch.retired, 1);
    assert!(ch.kept >= 1);
    assert_eq!(n.stats().retired, 1);
    assert!(!n.is_pool_addr(u32::from(ip(1))));
    // The kept mapping: same endpoint for a new connection of its host,
    // through the pool's new index.
    let o2b = udp(o2.src_addr().octets()[3], 5000, 54);
    let r2b = n.translate_outbound(&o2b, &snat(1), None).unwrap();
    assert_eq!((r2b.dst, r2b.dport), (r2.dst, r2.dport));
    assert_eq!(
        n.mapping_by_ext(proto::UDP, ip(2), r2.dport)
            .unwrap()
            .sessions,
        2
    );
    // The retired one: no new session takes it, not even inbound.
    let inbound = FlowKey4::new(
        proto::UDP,
        Ipv4Addr::new(203, 0, 113, 9),
        7,
        ip(1),
        r1.dport,
    );
    assert!(n.inbound_new(&inbound).is_none());
    let listed = n.mapping_by_ext(proto::UDP, ip(1), r1.dport).unwrap();
    assert!(listed.retired, "listed as retired");
    assert!(
        !n.mapping_by_ext(proto::UDP, ip(2), r2.dport)
            .unwrap()
            .retired
    );
    let o1b = udp(o1.src_addr().octets()[3], 5000, 55);
    let r1b = n.translate_outbound(&o1b, &snat(1), None).unwrap();
    assert_ne!(r1b.dst, u32::from(ip(1)));
    assert_eq!(
        n.mapping_by_ext(proto::UDP, ip(1), r1.dport)
            .unwrap()
            .sessions,
        1
    );
    let (created, removed) = events(&n);
    n.release(&o1, &r1);
    assert!(n.mapping_by_ext(proto::UDP, ip(1), r1.dport).is_none());
    assert_eq!(events(&n), (created, removed + 1), "its removal is logged");
    assert_eq!(n.stats().retired, 0);
    // Ports balance: everything released frees every port.
    for (o, r) in [(o2, r2), (o2b, r2b), (o1b, r1b)] {
        n.release(&o, &r);
    }
    for (o, r) in by_addr.values() {
        n.release(o, r);
    }
    assert_eq!(n.stats().mappings, 0);
    for a in [2, 3] {
        assert_eq!(n.free_ports(ip(a), proto::UDP), Some(100));
    }
    let (created, removed) = events(&n);
    assert_eq!(created, removed);
}

/// A port that leaves the range retires its mapping, whose port the new
/// range cannot give out again.
#[test]
fn a_shrunk_range_retires_the_ports_outside_it() {
    let c = config(vec![pool(&[1], 2000..=2009)], 1, 0);
    let mut n = WorkerNat::new(&c, 0, VecSink::default()).unwrap();
    let live = open(&mut n, 10);
    let ch = n
        .set_pools(&config(vec![pool(&[1], 2000..=2004)], 1, 0))
        .unwrap();
    assert_eq!((ch.kept, ch.retired), (5, 5));
    assert_eq!(n.free_ports(ip(1), proto::UDP), Some(0));
    assert!(n.is_pool_addr(u32::from(ip(1))));
    for (o, r) in live {
        n.release(&o, &r);
    }
    assert_eq!(n.free_ports(ip(1), proto::UDP), Some(5));
    assert_eq!(n.stats().mappings, 0);
}

/// An address that leaves and comes back: its retired mappings' endpoints
/// are never handed out twice.
#[test]
fn a_returning_address_skips_retired_endpoints() {
    let c = config(vec![pool(&[1], 2000..=2003)], 1, 0);
    let mut n = WorkerNat::new(&c, 0, VecSink::default()).unwrap();
    let live = open(&mut n, 2);
    n.set_pools(&config(vec![pool(&[2], 2000..=2003)], 1, 0))
        .unwrap();
    n.set_pools(&config(vec![pool(&[1], 2000..=2003)], 1, 0))
        .unwrap();
    let mut fresh = Vec::new();
    for i in 0..4 {
        let o = udp(3, 6000 + i, 53);
        match n.translate_outbound(&o, &snat(0), None) {
            Ok(r) => fresh.push((o, r)),
            Err(e) => assert_eq!(e, NatError::PoolExhausted),
        }
    }
    // Two ports are the retired mappings'; the other two are new.
    assert_eq!(fresh.len(), 2);
    let old: HashSet<_> = live.iter().map(|(_, r)| r.dport).collect();
    for (_, r) in &fresh {
        assert!(!old.contains(&r.dport));
    }
    for (o, r) in live.into_iter().chain(fresh) {
        n.release(&o, &r);
    }
    assert_eq!(n.free_ports(ip(1), proto::UDP), Some(4));
    assert_eq!(n.stats().mappings, 0);
    let (created, removed) = events(&n);
    assert_eq!(created, removed);
}

/// Refused changes leave everything as it was.
#[test]
fn refused_changes_change_nothing() {
    // Deterministic NAT: no pool change.
    let mut d = config(vec![pool(&[1], 1024..=65535)], 1, 1000);
    d.deterministic = Some((Ipv4Addr::new(10, 0, 0, 0), 26));
    let mut n = WorkerNat::new(&d, 0, VecSink::default()).unwrap();
    let mut d2 = d.clone();
    d2.pools = vec![pool(&[1, 2], 1024..=65535)];
    assert_eq!(n.set_pools(&d2), Err(ConfigError::DeterministicPoolChange));
    // Port blocks: a kept address keeps its range.
    let b = config(vec![pool(&[1, 2], 2000..=2099)], 1, 10);
    let mut n = WorkerNat::new(&b, 0, VecSink::default()).unwrap();
    let o = udp(1, 5000, 53);
    let r = n.translate_outbound(&o, &snat(0), None).unwrap();
    let moved = config(vec![pool(&[2], 2000..=2199)], 1, 10);
    assert_eq!(
        n.set_pools(&moved),
        Err(ConfigError::BlockRangeChange { addr: ip(2) })
    );
    // Other settings.
    let mut other = b.clone();
    other.filtering = FilteringBehaviour::AddressDependent;
    assert_eq!(n.set_pools(&other), Err(ConfigError::SettingsChange));
    assert_eq!(n.config(), &b);
    assert_eq!(
        n.mapping_by_ext(proto::UDP, r.dst_addr(), r.dport)
            .unwrap()
            .sessions,
        1
    );
    // Invalid pools.
    let empty = config(vec![Pool::new([])], 1, 10);
    assert_eq!(n.set_pools(&empty), Err(ConfigError::EmptyPool { pool: 0 }));
    n.release(&o, &r);
    assert_eq!(n.stats().mappings, 0);
}

/// Port blocks: a kept address keeps its blocks (a subscriber's next
/// mapping goes into its block); a removed address's block is released,
/// and logged, with its last retired mapping.
#[test]
fn port_blocks_are_kept_or_released_once() {
    let c = config(vec![pool(&[1, 2], 2000..=2099)], 1, 10);
    // 2 keeps its place in the list, so its subscribers keep their
    // pairing (a subscriber's new mappings follow its pairing in the new
    // pool).
    let next = config(vec![pool(&[3, 2], 2000..=2099)], 1, 10);
    let mut n = WorkerNat::new(&c, 0, VecSink::default()).unwrap();
    let mut live = Vec::new();
    for h in 1..60u8 {
        let o = udp(h, 5000, 53);
        if let Ok(r) = n.translate_outbound(&o, &snat(0), None) {
            live.push((o, r));
        }
    }
    n.set_pools(&next).unwrap();
    // A subscriber paired with 2 before and after keeps its block there.
    let (first, _) = live
        .iter()
        .map(|(o, r)| (*r, o.src_addr()))
        .find(|(r, h)| r.dst_addr() == ip(2) && next.paired_addr(PoolId(0), *h) == Some(ip(2)))
        .unwrap();
    let h = live.iter().find(|(_, r)| *r == first).unwrap().0.src_addr();
    let o = udp(h.octets()[3], 5001, 53);
    let r = n.translate_outbound(&o, &snat(0), None).unwrap();
    assert_eq!(r.dst_addr(), ip(2));
    assert_eq!(
        (r.dport - 2000) / 10,
        (first.dport - 2000) / 10,
        "same block"
    );
    live.push((o, r));
    let count = |n: &WorkerNat<VecSink>, alloc: bool| {
        n.sink()
            .events
            .iter()
            .filter(|e| match e {
                NatEvent::BlockAllocated { .. } => alloc,
                NatEvent::BlockReleased { .. } => !alloc,
                _ => false,
            })
            .count()
    };
    let before = count(&n, true);
    for (o, r) in live {
        n.release(&o, &r);
    }
    assert_eq!(count(&n, true), before, "no block allocated for a kept one");
    assert_eq!(
        count(&n, false),
        count(&n, true),
        "every block released once"
    );
    assert_eq!(n.stats().blocks, 0);
    assert_eq!(n.free_ports(ip(2), proto::UDP), Some(100));
}

/// The pool configurations the property test moves between (two workers,
/// so each holds every other port): addresses come and go, pools merge,
/// split and change places, a range shrinks.
fn layouts(block: u16) -> Vec<NatConfig> {
    let r = 2000..=2023;
    let mut v = vec![
        config(vec![pool(&[1, 2, 3], r.clone())], 2, block),
        // Addresses appended: the pool keeps its state.
        config(vec![pool(&[1, 2, 3, 6], r.clone())], 2, block),
        config(
            vec![pool(&[1, 2, 3, 6], r.clone()), pool(&[7], r.clone())],
            2,
            block,
        ),
        // Renumbered (its state moves to index 1), and shortened at its
        // end.
        config(
            vec![pool(&[7], r.clone()), pool(&[1, 2, 3], r.clone())],
            2,
            block,
        ),
        config(
            vec![pool(&[8], r.clone()), pool(&[1, 2], r.clone())],
            2,
            block,
        ),
        config(vec![pool(&[2, 3, 4, 5], r.clone())], 2, block),
        config(
            vec![pool(&[4], r.clone()), pool(&[1, 2], r.clone())],
            2,
            block,
        ),
        config(vec![pool(&[1], r.clone()), pool(&[3], r.clone())], 2, block),
        // An address taken out of the middle (the others close up), with
        // one appended; the first one taken out.
        config(vec![pool(&[1, 3, 6], r.clone())], 2, block),
        config(vec![pool(&[2, 3, 6], r.clone())], 2, block),
        // Reordered: the state cannot be kept, the mappings are filed again.
        config(vec![pool(&[3, 1, 2], r.clone())], 2, block),
    ];
    if block == 0 {
        v.push(config(vec![pool(&[3], 2008..=2023)], 2, block));
        v.push(config(
            vec![pool(&[1, 3], 2004..=2011), pool(&[5], r)],
            2,
            block,
        ));
    }
    v
}

#[derive(Clone, Debug)]
enum Op {
    Out {
        pool: u16,
        p: u8,
        host: u8,
        sport: u16,
        dport: u16,
    },
    In {
        pick: usize,
        src: u8,
        sport: u16,
    },
    Release {
        pick: usize,
    },
    Pools {
        layout: usize,
    },
}

fn arb_op() -> impl Strategy<Value = Op> {
    let p = prop_oneof![Just(proto::TCP), Just(proto::UDP), Just(proto::ICMP)];
    prop_oneof![
        6 => (0u16..4, p, 1u8..8, 1u16..6, 1u16..3)
            .prop_map(|(pool, p, host, sport, dport)| Op::Out { pool, p, host, sport, dport }),
        1 => (any::<usize>(), 1u8..4, 1u16..3).prop_map(|(pick, src, sport)| Op::In { pick, src, sport }),
        3 => any::<usize>().prop_map(|pick| Op::Release { pick }),
        1 => any::<usize>().prop_map(|layout| Op::Pools { layout }),
    ]
}

/// The invariants of a worker whose pools may have changed.
fn check(n: &WorkerNat<VecSink>, live: &[(FlowKey4, FlowKey4)]) {
    // Every mapping is in `by_int` (live) or `retired`, never both.
    assert_eq!(n.by_int.len() + n.retired.len(), n.by_ext.len());
    // Each configured pool in a slot of its own, holding its addresses;
    // every other slot empty; the address index by slot.
    let mut slots: Vec<u16> = n.slot_of.clone();
    slots.sort_unstable();
    slots.dedup();
    assert_eq!(slots.len(), n.config.pools.len());
    for (s, st) in n.pools.iter().enumerate() {
        match n.slot_of.iter().position(|&x| usize::from(x) == s) {
            Some(j) => {
                let want: Vec<u32> = n.config.pools[j]
                    .addrs
                    .iter()
                    .map(|&a| u32::from(a))
                    .collect();
                assert_eq!(st.addrs, want, "slot {s}");
                for (ai, a) in want.iter().enumerate() {
                    assert_eq!(n.pool_addr.get(a), Some(&(s as u16, ai)));
                }
            }
            None => assert!(st.addrs.is_empty(), "slot {s} has no pool"),
        }
    }
    assert_eq!(
        n.pool_addr.len(),
        n.config.pools.iter().map(|p| p.addrs.len()).sum::<usize>()
    );
    // The counts a pool change reads instead of scanning, per slot.
    let mut in_slots = vec![0u64; n.pools.len()];
    for m in n.by_ext.values() {
        if let Space::Pool { pool, .. } = m.space {
            in_slots[usize::from(pool)] += 1;
        }
    }
    assert_eq!(n.slot_mappings, in_slots);
    for (e, m) in &n.by_ext {
        let retired = m.space == Space::Retired;
        assert_eq!(retired, n.retired.contains_key(e));
        if !retired {
            let v = n.by_int.get(&m.key.int_key()).unwrap();
            assert_eq!(v.ext(), (e.addr, e.port));
            // A live mapping's address and port are the current pools'
            // (or a masquerade address's).
            // (`pool` is a slot: the configuration's pool in it.)
            if let Space::Pool { pool, .. } = m.space {
                let j = n.slot_of.iter().position(|&s| s == pool).unwrap();
                let p = &n.config.pools[j];
                assert!(p.addrs.contains(&Ipv4Addr::from(e.addr)));
                assert!(p.ports.contains(&e.port));
            }
        }
    }
    // Session counts equal what the live sessions hold.
    let mut held: StdMap<ExtKey, u32> = StdMap::new();
    for (o, r) in live {
        for s in n.session_refs(o, r).into_iter().flatten() {
            *held.entry(s.ext).or_default() += 1;
        }
    }
    for (e, m) in &n.by_ext {
        assert_eq!(
            held.get(e).copied().unwrap_or(0),
            n.sessions_of(e, m),
            "{e:?}"
        );
    }
    // Ports in use + free = the slice, for every current pool address:
    // in use are the live mappings' and the retired ones' holds.
    for (pi, p) in n.config.pools.iter().enumerate() {
        for a in &p.addrs {
            for pr in [proto::TCP, proto::UDP, proto::ICMP] {
                let a32 = u32::from(*a);
                let used = n
                    .by_ext
                    .iter()
                    .filter(|(e, m)| {
                        e.addr == a32
                            && e.proto == pr
                            && match m.space {
                                Space::Retired => {
                                    matches!(n.retired[*e].hold, Some(Space::Pool { .. }))
                                }
                                _ => true,
                            }
                    })
                    .count() as u32;
                let total = n.ports_per_addr(PoolId(pi as u16)).unwrap();
                assert_eq!(n.free_ports(*a, pr).unwrap() + used, total, "{a} {pr}");
            }
        }
    }
    // Reply keys (conntrack keys) are distinct.
    let replies: HashSet<_> = live.iter().map(|(_, r)| *r).collect();
    assert_eq!(replies.len(), live.len());
}

/// The first packet and translation of `Op::Out` (pools 0 and 1 of the
/// `pools` there are, or masquerade to an egress address that some
/// layouts have in a pool (5) or none has (9)); `None` when the packet is
/// one of a live session.
fn out_packet(
    (pool, p, h, sport, dport): (u16, u8, u8, u16, u16),
    pools: u16,
    live: &[(FlowKey4, FlowKey4)],
) -> Option<(FlowKey4, Translation, Option<Ipv4Addr>)> {
    let dport = if p == proto::ICMP { sport } else { dport };
    let o = FlowKey4::new(p, host(h), sport, Ipv4Addr::new(198, 51, 100, 1), dport);
    if live.iter().any(|(lo, lr)| *lo == o || lr.reversed() == o) {
        return None;
    }
    let (t, egress) = match pool {
        0 | 1 => (snat(pool % pools), None),
        k => (
            Translation::Masquerade,
            Some(ip(if k == 2 { 5 } else { 9 })),
        ),
    };
    Some((o, t, egress))
}

/// The packet of `Op::In`: from outside to the external endpoint of live
/// session `pick`; `None` without sessions, for ICMP, or when the packet
/// is one of a live session.
fn in_packet(live: &[(FlowKey4, FlowKey4)], pick: usize, src: u8, sport: u16) -> Option<FlowKey4> {
    let &(_, r) = live.get(pick % live.len().max(1))?;
    if r.proto == proto::ICMP {
        return None;
    }
    let k = FlowKey4::new(
        r.proto,
        Ipv4Addr::new(203, 0, 113, src),
        sport,
        r.dst_addr(),
        r.dport,
    );
    (!live.iter().any(|(lo, lr)| *lo == k || *lr == k)).then_some(k)
}

fn run(ops: Vec<Op>, w: u16, block: u16) {
    let layouts = layouts(block);
    let mut n = WorkerNat::new(&layouts[0], w, VecSink::default()).unwrap();
    let mut live: Vec<(FlowKey4, FlowKey4)> = Vec::new();
    for op in ops {
        match op {
            Op::Out {
                pool,
                p,
                host: h,
                sport,
                dport,
            } => {
                let pools = n.config.pools.len() as u16;
                let Some((o, t, egress)) = out_packet((pool, p, h, sport, dport), pools, &live)
                else {
                    continue;
                };
                match n.translate_outbound(&o, &t, egress) {
                    Ok(r) => {
                        assert!(
                            !live.iter().any(|(lo, lr)| *lr == r || lo.reversed() == r),
                            "reply key collides"
                        );
                        let m = n.mapping_by_ext(p, r.dst_addr(), r.dport).unwrap();
                        assert_eq!((u32::from(m.int_addr), m.int_port), (o.src, o.sport));
                        live.push((o, r));
                    }
                    Err(e) => assert!(
                        matches!(
                            e,
                            NatError::PoolExhausted
                                | NatError::BlockLimit
                                | NatError::MasqueradeSlotsExhausted
                        ),
                        "{e:?}"
                    ),
                }
            }
            Op::In { pick, src, sport } => {
                let Some(k) = in_packet(&live, pick, src, sport) else {
                    continue;
                };
                if let Some((io, ir)) = n.inbound_new(&k) {
                    if live
                        .iter()
                        .any(|(lo, lr)| *lr == ir || *lo == ir.reversed())
                    {
                        // Two mappings of one internal endpoint (in two
                        // pools): conntrack refuses the second session's
                        // key, and the engine lets its references go.
                        n.release(&io, &ir);
                    } else {
                        live.push((io, ir));
                    }
                }
            }
            Op::Release { pick } => {
                if live.is_empty() {
                    continue;
                }
                let (o, r) = live.swap_remove(pick % live.len());
                n.release(&o, &r);
            }
            Op::Pools { layout } => {
                let before = n.config.clone();
                match n.set_pools(&layouts[layout % layouts.len()]) {
                    Ok(_) => {}
                    Err(ConfigError::BlockAddressReturns { .. }) if block > 0 => {
                        assert_eq!(n.config, before, "a refused change changes nothing");
                    }
                    Err(e) => panic!("{e}"),
                }
            }
        }
        check(&n, &live);
    }
    for (o, r) in live.drain(..) {
        n.release(&o, &r);
    }
    let s = n.stats();
    assert_eq!(
        (s.mappings, s.sessions, s.subscribers, s.retired, s.blocks),
        (0, 0, 0, 0, 0)
    );
    assert!(n.retired_blocks.is_empty());
    assert!(n
        .masq_slots
        .iter()
        .all(|s| s.addr.is_none() && s.mappings == 0));
    for m in 0..n.masq_slots.len() * PROTOS {
        assert_eq!(
            n.masq_space.free_count(m),
            n.masq_space.slice().len(),
            "masquerade bitmap {m}"
        );
    }
    for (pi, p) in n.config.pools.iter().enumerate() {
        for a in &p.addrs {
            let total = n.ports_per_addr(PoolId(pi as u16)).unwrap();
            assert_eq!(n.free_ports(*a, proto::UDP), Some(total));
        }
    }
    // The log balances: every mapping created is removed, every block
    // allocated is released, once, with the ports it was given with.
    let mut blocks: StdMap<(Ipv4Addr, u16), (Ipv4Addr, u16)> = StdMap::new();
    let mut maps: StdMap<(u8, Ipv4Addr, u16), (Ipv4Addr, u16)> = StdMap::new();
    for e in &n.sink().events {
        match *e {
            NatEvent::MappingCreated {
                proto,
                int_addr,
                int_port,
                ext_addr,
                ext_port,
                ..
            } => {
                assert!(maps
                    .insert((proto, ext_addr, ext_port), (int_addr, int_port))
                    .is_none());
            }
            NatEvent::MappingRemoved {
                proto,
                int_addr,
                int_port,
                ext_addr,
                ext_port,
                ..
            } => {
                assert_eq!(
                    maps.remove(&(proto, ext_addr, ext_port)),
                    Some((int_addr, int_port))
                );
            }
            NatEvent::BlockAllocated {
                int_addr,
                ext_addr,
                first_port,
                last_port,
                ..
            } => {
                assert!(
                    blocks
                        .insert((ext_addr, first_port), (int_addr, last_port))
                        .is_none(),
                    "block {ext_addr}:{first_port} given twice"
                );
            }
            NatEvent::BlockReleased {
                int_addr,
                ext_addr,
                first_port,
                last_port,
                ..
            } => {
                assert_eq!(
                    blocks.remove(&(ext_addr, first_port)),
                    Some((int_addr, last_port)),
                    "block {ext_addr}:{first_port} released but not held"
                );
            }
        }
    }
    assert!(maps.is_empty(), "mappings never removed: {maps:?}");
    assert!(blocks.is_empty(), "blocks never released: {blocks:?}");
}

/// A flush without a log (in bulk: [`NatEventSink::keeps_events`] false)
/// against one mapping by mapping, after the same history of connections,
/// inbound sessions, releases and pool changes: the same counters, every
/// port and block free, nothing left; afterwards both translate alike.
fn flush_alike(ops: Vec<Op>, w: u16, block: u16) {
    let layouts = layouts(block);
    let mut a = WorkerNat::new(&layouts[0], w, VecSink::default()).unwrap();
    let mut b = WorkerNat::new(&layouts[0], w, NoopSink).unwrap();
    let mut live: Vec<(FlowKey4, FlowKey4)> = Vec::new();
    for op in ops {
        match op {
            Op::Out {
                pool,
                p,
                host: h,
                sport,
                dport,
            } => {
                let pools = a.config.pools.len() as u16;
                let Some((o, t, egress)) = out_packet((pool, p, h, sport, dport), pools, &live)
                else {
                    continue;
                };
                let (ra, rb) = (
                    a.translate_outbound(&o, &t, egress),
                    b.translate_outbound(&o, &t, egress),
                );
                assert_eq!(ra, rb);
                if let Ok(r) = ra {
                    live.push((o, r));
                }
            }
            Op::In { pick, src, sport } => {
                let Some(k) = in_packet(&live, pick, src, sport) else {
                    continue;
                };
                let (ia, ib) = (a.inbound_new(&k), b.inbound_new(&k));
                assert_eq!(ia, ib);
                if let Some((io, ir)) = ia {
                    if live
                        .iter()
                        .any(|(lo, lr)| *lr == ir || *lo == ir.reversed())
                    {
                        a.release(&io, &ir);
                        b.release(&io, &ir);
                    } else {
                        live.push((io, ir));
                    }
                }
            }
            Op::Release { pick } => {
                if live.is_empty() {
                    continue;
                }
                let (o, r) = live.swap_remove(pick % live.len());
                a.release(&o, &r);
                b.release(&o, &r);
            }
            Op::Pools { layout } => {
                let next = &layouts[layout % layouts.len()];
                assert_eq!(a.set_pools(next), b.set_pools(next));
            }
        }
    }
    assert_eq!(a.stats(), b.stats());
    let room = (a.by_ext.capacity(), b.by_ext.capacity());
    a.clear();
    b.clear();
    // Both keep the external-side table's allocation.
    assert_eq!((a.by_ext.capacity(), b.by_ext.capacity()), room);
    assert_eq!(a.stats(), b.stats());
    let s = b.stats();
    assert_eq!(
        (s.mappings, s.sessions, s.subscribers, s.retired, s.blocks),
        (0, 0, 0, 0, 0)
    );
    assert!(b.by_ext.is_empty() && b.retired.is_empty() && b.retired_blocks.is_empty());
    assert_eq!(
        (b.by_int.len(), b.subscribers.len(), b.permits.len()),
        (0, 0, 0)
    );
    assert_eq!(b.slot_mappings, a.slot_mappings);
    for (pi, p) in b.config.pools.iter().enumerate() {
        let total = b.ports_per_addr(PoolId(pi as u16)).unwrap();
        for addr in &p.addrs {
            for pr in [proto::TCP, proto::UDP, proto::ICMP] {
                assert_eq!(a.free_ports(*addr, pr), Some(total));
                assert_eq!(b.free_ports(*addr, pr), Some(total));
            }
        }
    }
    for m in 0..b.masq_slots.len() * PROTOS {
        assert_eq!(b.masq_space.free_count(m), b.masq_space.slice().len());
    }
    assert!(b
        .masq_slots
        .iter()
        .all(|s| s.addr.is_none() && s.mappings == 0));
    for (x, y) in a.pools.iter().zip(&b.pools) {
        let free = |p: &PoolState| {
            p.blocks
                .as_ref()
                .map(|b| (b.free.clone(), b.owner.clone(), b.used.clone()))
        };
        assert_eq!(free(x), free(y));
    }
    // Both take new connections alike (the ports may differ: a flush one
    // by one leaves the allocation cursors where they were).
    for h in 1..6 {
        let o = FlowKey4::new(proto::UDP, host(h), 7, Ipv4Addr::new(198, 51, 100, 1), 53);
        assert_eq!(
            a.translate_outbound(&o, &snat(0), None).is_ok(),
            b.translate_outbound(&o, &snat(0), None).is_ok()
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn a_flush_in_bulk_leaves_what_one_by_one_leaves(ops in proptest::collection::vec(arb_op(), 1..160), w in 0u16..2, blocks in any::<bool>()) {
        flush_alike(ops, w, if blocks { 4 } else { 0 });
    }

    #[test]
    fn pool_changes_keep_the_invariants(ops in proptest::collection::vec(arb_op(), 1..160), w in 0u16..2) {
        run(ops, w, 0);
    }

    #[test]
    fn pool_changes_keep_the_block_invariants(ops in proptest::collection::vec(arb_op(), 1..160), w in 0u16..2) {
        run(ops, w, 4);
    }
}

/// The switches a running worker takes with its pools: a lower
/// per-subscriber limit refuses the next session at once, hairpinning
/// turned off stops it for new sessions; the mapping behaviour is refused.
#[test]
fn live_switches_are_taken_and_the_others_refused() {
    let c = config(vec![pool(&[1], 2000..=2099)], 1, 0);
    let mut n = WorkerNat::new(&c, 0, VecSink::default()).unwrap();
    let o1 = udp(1, 5000, 53);
    let r1 = n.translate_outbound(&o1, &snat(0), None).unwrap();
    let mut next = c.clone();
    next.max_sessions_per_subscriber = 1;
    next.hairpinning = false;
    assert_eq!(n.set_pools(&next), Ok(PoolChange::default()));
    assert_eq!(n.config(), &next);
    assert_eq!(
        n.translate_outbound(&udp(1, 5001, 53), &snat(0), None),
        Err(NatError::SubscriberLimit)
    );
    // Host 2 to host 1's external endpoint: not hairpinned any more.
    let to_mapping = FlowKey4::new(proto::UDP, host(2), 6000, r1.dst_addr(), r1.dport);
    assert!(n.hairpin(&to_mapping).is_none());
    let mut other = next.clone();
    other.mapping = MappingBehaviour::AddressAndPortDependent;
    assert_eq!(n.set_pools(&other), Err(ConfigError::SettingsChange));
    assert_eq!(n.config(), &next);
    n.release(&o1, &r1);
    assert_eq!(n.stats().mappings, 0);
}
