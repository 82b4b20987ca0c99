//! The connection tables' maximum changed while running
//! (`Worker::set_ct_max`, what a reload of `conntrack.max` does): raised up
//! to the capacity the tables were built for, it lets new connections in
//! at once; lowered below the connections tracked, it removes none and
//! refuses new ones; out of range, it changes nothing.

use std::sync::Arc;

mod common;

use common::*;
use sluice_conntrack::ConfigError;
use sluice_engine::{Action, DropReason, EngineError, StaticPolicy, Worker};
use sluice_nat::{PoolId, Translation};
use sluice_wire::flow::{proto, FlowKey4};

fn gateway(max: u64, capacity: u64) -> Worker {
    let mut p = StaticPolicy::accept_all();
    p.snat = vec![(OUTSIDE, Translation::Snat { pool: PoolId(0) })];
    let mut cfg = nat_gateway(0, 1);
    cfg.ct_max = max;
    cfg.ct_capacity = capacity;
    Worker::new(cfg, Arc::new(p)).unwrap()
}

/// Sends flow `i`'s first datagram out; on success answers it and sends a
/// second one, which makes the connection an assured UDP stream. The
/// first datagram's action.
fn connect(w: &mut Worker, now: u64, i: u16) -> Action {
    let k = host_flow(i);
    let (a, out) = send(w, now, &udp_frame(HOST_MAC, GW_IN_MAC, INSIDE, &k));
    if a != Action::Forward(OUTSIDE) {
        return a;
    }
    let port = u16::from_be_bytes([out[34], out[35]]);
    let reply = FlowKey4 {
        src: u32::from(REMOTE),
        dst: u32::from(POOL),
        sport: 53,
        dport: port,
        proto: proto::UDP,
    };
    let (r, _) = send(w, now, &udp_frame(ROUTER_MAC, GW_OUT_MAC, OUTSIDE, &reply));
    assert_eq!(r, Action::Forward(INSIDE), "reply of flow {i}");
    assert_eq!(again(w, now, i), Action::Forward(OUTSIDE));
    a
}

/// Flow `i`'s next datagram out.
fn again(w: &mut Worker, now: u64, i: u16) -> Action {
    send(
        w,
        now,
        &udp_frame(HOST_MAC, GW_IN_MAC, INSIDE, &host_flow(i)),
    )
    .0
}

#[test]
fn max_raised_and_lowered_while_running() {
    let now = 1_000_000_000;
    let mut w = gateway(10, 40);
    assert_eq!(w.conntrack().capacity(), 40);
    for i in 0..10 {
        assert_eq!(connect(&mut w, now, i), Action::Forward(OUTSIDE));
    }
    // Full: ten assured streams, none to drop early.
    assert_eq!(connect(&mut w, now, 10), Action::Drop(DropReason::CtFull));
    assert_eq!(w.counters().drops_for(DropReason::CtFull), 1);

    // Above the IPv4 table's capacity, or an IPv6 maximum above its own:
    // refused, neither changes.
    let v6 = w.conntrack6().max() as u64;
    assert!(matches!(
        w.set_ct_max(41, v6),
        Err(EngineError::Conntrack(ConfigError::AboveCapacity {
            max: 41,
            capacity: 40
        }))
    ));
    assert!(matches!(
        w.set_ct_max(40, v6 + 1),
        Err(EngineError::Conntrack(ConfigError::AboveCapacity { .. }))
    ));
    assert!(matches!(
        w.set_ct_max(0, v6),
        Err(EngineError::Conntrack(ConfigError::ZeroMax))
    ));
    assert_eq!(w.conntrack().max(), 10);
    assert_eq!(connect(&mut w, now, 10), Action::Drop(DropReason::CtFull));

    // Raised to the capacity: thirty more connections get in.
    w.set_ct_max(40, v6).unwrap();
    for i in 10..40 {
        assert_eq!(connect(&mut w, now, i), Action::Forward(OUTSIDE), "{i}");
    }
    assert_eq!(w.conntrack().len(), 40);
    assert_eq!(connect(&mut w, now, 40), Action::Drop(DropReason::CtFull));

    // Lowered below what is tracked: every connection still forwards, no
    // new one gets in, nothing was evicted.
    w.set_ct_max(5, v6).unwrap();
    for i in 0..40 {
        assert_eq!(again(&mut w, now, i), Action::Forward(OUTSIDE), "{i}");
    }
    assert_eq!(connect(&mut w, now, 41), Action::Drop(DropReason::CtFull));
    assert_eq!(w.conntrack().len(), 40);
    assert_eq!(w.conntrack().early_drops(), 0);
    assert_eq!(w.counters().drops_for(DropReason::CtFull), 4);
}
