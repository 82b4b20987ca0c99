//! Connections carried over a restart (`Worker::carried_conns`,
//! `Worker::restore`): a worker of a new process, whose policy drops every
//! new connection, forwards the packets of the connections the old one
//! had, both ways, as established; one that was not given them drops
//! them. NAT connections are counted and left out.

use std::sync::Arc;

mod common;

use common::*;
use sluice_engine::{Action, DropReason, RestoreError, SavedConn, StaticPolicy, Verdict, Worker};
use sluice_nat::{PoolId, Translation};
use sluice_wire::build::build_udp4;
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

fn frame(from: [u8; 6], to: [u8; 6], iif: u16, k: &FlowKey4) -> (u16, Vec<u8>) {
    let mut b = vec![0u8; 128];
    let n = build_udp4(&mut b, from, to, k, 16).unwrap();
    b.truncate(n);
    (iif, b)
}

fn out_key(i: u16) -> FlowKey4 {
    FlowKey4 {
        src: u32::from(HOST),
        dst: u32::from(REMOTE),
        sport: 20_000 + i,
        dport: 53,
        proto: proto::UDP,
    }
}

fn out(w: &mut Worker, now: u64, i: u16) -> Action {
    send(w, now, &frame(HOST_MAC, GW_IN_MAC, INSIDE, &out_key(i))).0
}

fn back(w: &mut Worker, now: u64, i: u16) -> Action {
    let k = out_key(i).reversed();
    send(w, now, &frame(ROUTER_MAC, GW_OUT_MAC, OUTSIDE, &k)).0
}

#[test]
fn connections_survive_a_restart_and_nat_ones_are_counted() {
    let now = 5_000_000_000;
    let mut old = worker(StaticPolicy::accept_all());
    for i in 0..3 {
        assert_eq!(out(&mut old, now, i), Action::Forward(OUTSIDE));
        assert_eq!(back(&mut old, now, i), Action::Forward(INSIDE));
    }
    // Flow 2 goes on once more: an assured stream.
    assert_eq!(out(&mut old, now, 2), Action::Forward(OUTSIDE));
    let later = now + 7_000_000_000;
    let (saved, left) = old.carried_conns(later);
    assert_eq!((saved.len(), left.translated), (3, 0));
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

    // A NAT gateway's connections are counted, not carried.
    let mut p = StaticPolicy::accept_all();
    p.snat = vec![(OUTSIDE, Translation::Snat { pool: PoolId(0) })];
    let mut nat = worker(p);
    assert_eq!(out(&mut nat, now, 0), Action::Forward(OUTSIDE));
    let (saved, left) = nat.carried_conns(now);
    assert_eq!((saved.len(), left.translated), (0, 1));
}
