//! Connections carried over a restart (`Worker::carried_conns`,
//! `Worker::restore`): a worker of a new process, whose policy drops every
//! new connection, forwards the packets of the connections the old one
//! had, both ways, as established; one that was not given them drops
//! them. NAT connections come back on their mappings, with the same
//! external endpoints (and port blocks).

use std::sync::Arc;

mod common;

use common::*;
use sluice_engine::{Action, DropReason, RestoreError, SavedConn, StaticPolicy, Verdict, Worker};
use sluice_nat::{PoolId, Translation};
use sluice_wire::flow::{proto, FlowKey4};

fn worker(p: StaticPolicy) -> Worker {
    Worker::new(nat_gateway(0, 1), Arc::new(p)).unwrap()
}

fn drop_new() -> StaticPolicy {
    StaticPolicy {
        default: Verdict::Drop,
        ..StaticPolicy::accept_all()
    }
}

fn out(w: &mut Worker, now: u64, i: u16) -> Action {
    send(
        w,
        now,
        &udp_frame(HOST_MAC, GW_IN_MAC, INSIDE, &host_flow(i)),
    )
    .0
}

fn back(w: &mut Worker, now: u64, i: u16) -> Action {
    let k = host_flow(i).reversed();
    send(w, now, &udp_frame(ROUTER_MAC, GW_OUT_MAC, OUTSIDE, &k)).0
}

#[test]
fn connections_survive_a_restart_and_nat_ones_keep_their_mappings() {
    let now = 5_000_000_000;
    let mut old = worker(StaticPolicy::accept_all());
    for i in 0..3 {
        assert_eq!(out(&mut old, now, i), Action::Forward(OUTSIDE));
        assert_eq!(back(&mut old, now, i), Action::Forward(INSIDE));
    }
    // Flow 2 goes on once more: an assured stream.
    assert_eq!(out(&mut old, now, 2), Action::Forward(OUTSIDE));
    let later = now + 7_000_000_000;
    let saved = old.carried_conns(later);
    assert_eq!(saved.len(), 3);
    let stream = saved
        .iter()
        .find_map(|s| match s {
            SavedConn::V4 { orig, carried, .. } if orig.sport == 20_002 => Some(*carried),
            _ => None,
        })
        .unwrap();
    assert!(stream.assured && stream.seen_reply);
    // 120 s stream timeout less the 7 s that passed.
    assert_eq!(stream.expires_in_ms, 113_000);

    // The new process: its policy drops new connections, its clock starts
    // near zero.
    let start = 1_000_000;
    let mut new = worker(drop_new());
    for s in &saved {
        new.restore(start, s).unwrap();
    }
    assert_eq!(new.conntrack().len(), 3);
    // The stream expires when it would have: 113 s on.
    let t = sluice_conntrack::Instant::from_millis(start / 1_000_000);
    let left_ms = new
        .conntrack()
        .iter()
        .find(|(_, e)| e.orig().sport == 20_002)
        .map(|(_, e)| e.expires_in(t).as_millis());
    assert_eq!(left_ms, Some(113_000));
    let mut fresh = worker(drop_new());
    for i in 0..3 {
        assert_eq!(back(&mut new, start, i), Action::Forward(INSIDE), "{i}");
        assert_eq!(out(&mut new, start, i), Action::Forward(OUTSIDE), "{i}");
        assert!(matches!(back(&mut fresh, start, i), Action::Drop(_)), "{i}");
    }
    // A new connection is the new policy's to decide.
    assert_eq!(
        out(&mut new, start, 9),
        Action::Drop(DropReason::PolicyDrop)
    );
    // Restored twice: the table has it.
    assert!(matches!(
        new.restore(start, &saved[0]),
        Err(RestoreError::Table(_))
    ));

    // A NAT gateway's connections come back on their mappings.
    let mut p = StaticPolicy::accept_all();
    p.snat = vec![(OUTSIDE, Translation::Snat { pool: PoolId(0) })];
    let nat_worker = |p: StaticPolicy, blocks: u16| {
        let mut cfg = nat_gateway(0, 1);
        cfg.nat.port_block_size = blocks;
        Worker::new(cfg, Arc::new(p)).unwrap()
    };
    let mut nat = nat_worker(p.clone(), 0);
    let (a, f) = send(
        &mut nat,
        now,
        &udp_frame(HOST_MAC, GW_IN_MAC, INSIDE, &host_flow(0)),
    );
    assert_eq!(a, Action::Forward(OUTSIDE));
    let ext_port = u16::from_be_bytes([f[34], f[35]]);
    let answer = FlowKey4 {
        src: u32::from(REMOTE),
        dst: u32::from(POOL),
        sport: 53,
        dport: ext_port,
        proto: proto::UDP,
    };
    let answer_frame = udp_frame(ROUTER_MAC, GW_OUT_MAC, OUTSIDE, &answer);
    assert_eq!(
        send(&mut nat, now, &answer_frame).0,
        Action::Forward(INSIDE)
    );
    let saved = nat.carried_conns(now);
    assert_eq!(saved.len(), 1);
    assert!(matches!(saved[0], SavedConn::V4 { held: 1, .. }));
    // The new process drops new connections: the answer gets in only on
    // the restored connection, translated back to the host.
    let mut p2 = drop_new();
    p2.snat = p.snat.clone();
    let mut nat2 = nat_worker(p2, 0);
    nat2.restore(start, &saved[0]).unwrap();
    let (a, f) = send(&mut nat2, start, &answer_frame);
    assert_eq!(a, Action::Forward(INSIDE));
    assert_eq!(&f[30..34], &HOST.octets(), "translated back to the host");
    // Out again: the same external endpoint (the mapping is the one it was).
    let (a, f) = send(
        &mut nat2,
        start,
        &udp_frame(HOST_MAC, GW_IN_MAC, INSIDE, &host_flow(0)),
    );
    assert_eq!(a, Action::Forward(OUTSIDE));
    assert_eq!(u16::from_be_bytes([f[34], f[35]]), ext_port);
    assert_eq!(&f[26..30], &POOL.octets());
    // The NAT holds the mapping, with its session, and the pool's port
    // is taken.
    let held = |w: &Worker| {
        w.nat()
            .mappings()
            .map(|m| (m.int_addr, m.int_port, m.ext_addr, m.ext_port, m.sessions))
            .collect::<Vec<_>>()
    };
    let want = vec![(HOST, 20_000, POOL, ext_port, 1)];
    assert_eq!(held(&nat2), want);
    let free = |w: &Worker| w.nat().free_ports(POOL, proto::UDP);
    assert_eq!(free(&nat2), free(&nat), "the same ports taken");
    // Restoring it again is refused and changes nothing.
    assert!(nat2.restore(start, &saved[0]).is_err());
    assert_eq!(nat2.conntrack().len(), 1);
    assert_eq!(held(&nat2), want);
    // When it ends, its mapping and port go, as the old process's would.
    nat2.gc(start + 200_000_000_000, 1 << 20);
    assert_eq!(nat2.conntrack().len(), 0);
    assert!(held(&nat2).is_empty());
    assert_eq!(
        free(&nat2),
        free(&nat_worker(StaticPolicy::accept_all(), 0))
    );
    // Under port block allocation the block comes back with the mapping.
    let mut blocked = nat_worker(p.clone(), 64);
    assert_eq!(out(&mut blocked, now, 0), Action::Forward(OUTSIDE));
    let saved = blocked.carried_conns(now);
    assert_eq!(saved.len(), 1);
    let block = |w: &Worker| w.nat().block_by_ext(POOL, ext_port);
    assert!(block(&blocked).is_some());
    let mut blocked2 = nat_worker(p, 64);
    blocked2.restore(start, &saved[0]).unwrap();
    assert_eq!(block(&blocked2), block(&blocked));
    assert_eq!(held(&blocked2), held(&blocked));
}
