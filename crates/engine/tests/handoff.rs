//! Handoff between workers (the worker module's "Handoff between workers"):
//! a port forward whose translated port belongs to another worker is
//! created on the worker its replies are steered to, and a packet to a NAT
//! external endpoint goes to the worker owning that port.

use std::net::Ipv4Addr;
use std::sync::Arc;

mod common;

use common::*;
use sluice_engine::{
    Action, CtState, Decision, Hook, IfIndex, Policy, PolicyPacket, Verdict, Worker,
};
use sluice_nat::{owner_of, PoolId, Translation};
use sluice_wire::build::build_tcp4;
use sluice_wire::flow::{proto, FlowKey4};

/// The server's MAC (every inside host has the same one).
const SERVER_MAC: [u8; 6] = HOST_MAC;
/// The remote client.
const CLIENT: Ipv4Addr = REMOTE;
/// Forwarded port; `owner_of(8082, 2) == 1`, `owner_of(80, 2) == 0`.
const FWD_PORT: u16 = 8082;

/// `iifname outside tcp dport 8082 dnat to 10.0.0.3:80`, SNAT to the pool
/// for new connections leaving by the outside interface.
struct PortForward;

impl Policy for PortForward {
    fn decide(&self, hook: Hook, pkt: &PolicyPacket) -> Decision {
        let nat = match hook {
            Hook::Prerouting
                if pkt.iif == OUTSIDE
                    && matches!(pkt.proto, proto::TCP | proto::UDP)
                    && pkt.dport == FWD_PORT =>
            {
                Some(Translation::Dnat {
                    addr: SERVER,
                    port: Some(80),
                })
            }
            Hook::Postrouting if pkt.ct == CtState::New && pkt.oif == Some(OUTSIDE) => {
                Some(Translation::Snat { pool: PoolId(0) })
            }
            _ => None,
        };
        Decision {
            verdict: Verdict::Accept,
            mark: pkt.mark,
            nat,
            ct_mark: pkt.ct_mark,
            mss: Default::default(),
            flow_add: false,
            ct_timeout: 0,
        }
    }
    fn has_nat(&self, hook: Hook) -> bool {
        matches!(hook, Hook::Prerouting | Hook::Postrouting)
    }
}

fn worker(id: u16, workers: u16) -> Worker {
    Worker::new(
        nat_gateway(id, workers),
        Arc::new(PortForward) as Arc<dyn Policy>,
    )
    .unwrap()
}

fn tcp(k: &FlowKey4, macs: ([u8; 6], [u8; 6]), flags: u8) -> Vec<u8> {
    let mut b = vec![0u8; 256];
    let n = build_tcp4(&mut b, macs.0, macs.1, k, flags, 1, 1, 0).unwrap();
    b.truncate(n);
    b
}

fn run(w: &mut Worker, handed: bool, iif: IfIndex, frame: &[u8]) -> (Action, Vec<u8>) {
    let mut t = TestFrames::default();
    t.push(iif, |b| {
        b[..frame.len()].copy_from_slice(frame);
        frame.len()
    });
    if handed {
        w.process_handed_off(1_000_000_000, &mut t);
    } else {
        w.process(1_000_000_000, &mut t);
    }
    (t.acts[0], t.frame(0).to_vec())
}

fn key_of(f: &[u8]) -> FlowKey4 {
    sluice_wire::dissect::dissect(f).unwrap().key4().unwrap()
}

const SYN: u8 = 0x02;
const SYN_ACK: u8 = 0x12;
const ACK: u8 = 0x10;

#[test]
fn a_port_forward_lives_where_its_replies_are_steered() {
    assert_eq!(owner_of(FWD_PORT, 2), 1);
    assert_eq!(owner_of(80, 2), 0);
    let mut w = [worker(0, 2), worker(1, 2)];
    let inbound = FlowKey4 {
        src: u32::from(CLIENT),
        dst: u32::from(PUBLIC),
        sport: 40000,
        dport: FWD_PORT,
        proto: proto::TCP,
    };
    let syn = tcp(&inbound, (ROUTER_MAC, GW_OUT_MAC), SYN);
    // Steered by destination port to worker 1, which hands it to worker 0
    // (the server's replies come from port 80) and keeps nothing.
    let (a, f) = run(&mut w[1], false, OUTSIDE, &syn);
    assert_eq!(a, Action::Handoff(0));
    assert_eq!(f, syn, "a handed-off frame is unchanged");
    assert_eq!(w[1].conntrack().len(), 0);
    assert_eq!(w[1].counters().handed_off, 1);
    // Worker 0 creates the connection and forwards to the server.
    let (a, f) = run(&mut w[0], true, OUTSIDE, &syn);
    assert_eq!(a, Action::Forward(INSIDE));
    let k = key_of(&f);
    assert_eq!((Ipv4Addr::from(k.dst), k.dport), (SERVER, 80));
    assert_eq!(w[0].conntrack().len(), 1);
    // The server's answer, steered by its source port 80 to worker 0.
    let (a, f) = run(
        &mut w[0],
        false,
        INSIDE,
        &tcp(&k.reversed(), (SERVER_MAC, GW_IN_MAC), SYN_ACK),
    );
    assert_eq!(a, Action::Forward(OUTSIDE));
    let back = key_of(&f);
    assert_eq!(
        back,
        inbound.reversed(),
        "the client sees the forwarded port"
    );
    // The client's next packet arrives at worker 1 again and is handed over
    // again; worker 0 finds the connection.
    let ack = tcp(&inbound, (ROUTER_MAC, GW_OUT_MAC), ACK);
    assert_eq!(run(&mut w[1], false, OUTSIDE, &ack).0, Action::Handoff(0));
    let fast = w[0].counters().fast_path;
    assert_eq!(
        run(&mut w[0], true, OUTSIDE, &ack).0,
        Action::Forward(INSIDE)
    );
    assert_eq!(w[0].counters().fast_path, fast + 1);
    assert_eq!(w[1].conntrack().len(), 0);
}

#[test]
fn one_worker_never_hands_off() {
    let mut one = worker(0, 1);
    let inbound = FlowKey4 {
        src: u32::from(CLIENT),
        dst: u32::from(PUBLIC),
        sport: 40000,
        dport: FWD_PORT,
        proto: proto::TCP,
    };
    let (a, _) = run(
        &mut one,
        false,
        OUTSIDE,
        &tcp(&inbound, (ROUTER_MAC, GW_OUT_MAC), SYN),
    );
    assert_eq!(a, Action::Forward(INSIDE));
    assert_eq!(one.counters().handed_off, 0);
}

#[test]
fn a_packet_to_an_external_endpoint_goes_to_the_owner_of_its_port() {
    let mut w = [worker(0, 2), worker(1, 2)];
    // An inside host opens a connection on worker 1 (its source port's
    // owner); the mapping's external port is in worker 1's slice.
    let out = FlowKey4 {
        src: u32::from(HOST),
        dst: u32::from(CLIENT),
        sport: 5002,
        dport: 443,
        proto: proto::TCP,
    };
    assert_eq!(owner_of(5002, 2), 1);
    let (a, f) = run(
        &mut w[1],
        false,
        INSIDE,
        &tcp(&out, (SERVER_MAC, GW_IN_MAC), SYN),
    );
    assert_eq!(a, Action::Forward(OUTSIDE));
    let mapped = key_of(&f);
    assert_eq!(Ipv4Addr::from(mapped.src), POOL);
    assert_eq!(owner_of(mapped.sport, 2), 1);
    // Another inside host, steered to worker 0, sends to that mapping
    // (hairpinning): worker 0 hands it to worker 1.
    let hairpin = FlowKey4 {
        src: u32::from(SERVER),
        dst: u32::from(POOL),
        sport: 6000,
        dport: mapped.sport,
        proto: proto::TCP,
    };
    assert_eq!(owner_of(6000, 2), 0);
    let syn = tcp(&hairpin, (SERVER_MAC, GW_IN_MAC), SYN);
    assert_eq!(run(&mut w[0], false, INSIDE, &syn).0, Action::Steer(1));
    assert_eq!(w[0].conntrack().len(), 0);
    // Worker 1 hairpins it to the mapping's internal endpoint.
    let (a, f) = run(&mut w[1], false, INSIDE, &syn);
    assert_eq!(a, Action::Forward(INSIDE));
    let k = key_of(&f);
    assert_eq!((Ipv4Addr::from(k.dst), k.dport), (HOST, 5002));
    assert_eq!(
        Ipv4Addr::from(k.src),
        POOL,
        "hairpinned with its source mapped"
    );
}

/// IPv4 fragments of a UDP datagram of `k` (Ethernet frames), 1480 data
/// bytes each.
fn udp_fragments(
    k: &FlowKey4,
    macs: ([u8; 6], [u8; 6]),
    ident: u16,
    data_len: usize,
) -> Vec<Vec<u8>> {
    let (src, dst) = (Ipv4Addr::from(k.src), Ipv4Addr::from(k.dst));
    let d = udp_datagram(src, dst, k.sport, k.dport, data_len);
    ipv4_fragments(macs, src, dst, proto::UDP, ident, 64, &d)
}

#[test]
fn fragments_steered_by_address_follow_their_first_fragment_to_the_port_owner() {
    let mut w = [worker(0, 2), worker(1, 2)];
    let k = FlowKey4 {
        src: u32::from(HOST),
        dst: u32::from(CLIENT),
        sport: 5002,
        dport: 53,
        proto: proto::UDP,
    };
    assert_eq!(owner_of(5002, 2), 1);
    let frags = udp_fragments(&k, (SERVER_MAC, GW_IN_MAC), 0x7777, 3500);
    assert_eq!(frags.len(), 3);
    // Address steering brought all three to worker 0: the first goes to
    // worker 1 (its source port's owner), the later ones after it.
    let mut t = TestFrames::default();
    for f in &frags {
        t.push(INSIDE, |b| {
            b[..f.len()].copy_from_slice(f);
            f.len()
        });
    }
    w[0].process(1_000_000_000, &mut t);
    assert_eq!(t.acts, vec![Action::Steer(1); 3]);
    assert_eq!(
        w[0].conntrack().len(),
        0,
        "no connection on the wrong worker"
    );
    // Worker 1 creates the connection and translates all three alike.
    let mut t = TestFrames::default();
    for f in &frags {
        t.push(INSIDE, |b| {
            b[..f.len()].copy_from_slice(f);
            f.len()
        });
    }
    w[1].process(1_000_000_000, &mut t);
    assert_eq!(t.acts, vec![Action::Forward(OUTSIDE); 3]);
    for i in 0..3 {
        let f = t.frame(i);
        assert_eq!(
            &f[26..30],
            &POOL.octets(),
            "fragment {i} translated to the pool"
        );
        assert!(sluice_wire::checksum::verify(&f[14..34]));
    }
    assert_eq!(w[1].conntrack().len(), 1);
    // A later fragment of an unknown datagram is not handed anywhere.
    let other = udp_fragments(&k, (SERVER_MAC, GW_IN_MAC), 0x7778, 3500);
    let mut t = TestFrames::default();
    t.push(INSIDE, |b| {
        b[..other[1].len()].copy_from_slice(&other[1]);
        other[1].len()
    });
    w[0].process(1_000_000_000, &mut t);
    assert_eq!(t.acts, [Action::Drop(sluice_engine::DropReason::Fragment)]);
}

#[test]
fn fragments_to_a_port_forward_end_on_the_worker_of_the_private_port() {
    let mut w = [worker(0, 2), worker(1, 2)];
    let k = FlowKey4 {
        src: u32::from(CLIENT),
        dst: u32::from(PUBLIC),
        sport: 40000,
        dport: FWD_PORT,
        proto: proto::UDP,
    };
    let frags = udp_fragments(&k, (ROUTER_MAC, GW_OUT_MAC), 0x5151, 3000);
    let batch = |fs: &[Vec<u8>]| {
        let mut t = TestFrames::default();
        for f in fs {
            t.push(OUTSIDE, |b| {
                b[..f.len()].copy_from_slice(f);
                f.len()
            });
        }
        t
    };
    // Address steering brought them to worker 0: the public port 8082
    // belongs to worker 1, so they are steered there...
    let mut t = batch(&frags);
    w[0].process(1_000_000_000, &mut t);
    assert_eq!(t.acts, vec![Action::Steer(1); 3]);
    // ... which DNATs to port 81 and hands them to worker 0, where the
    // server's replies (source port 81) arrive ...
    let mut t = batch(&frags);
    w[1].process(1_000_000_000, &mut t);
    assert_eq!(t.acts, vec![Action::Handoff(0); 3]);
    // ... which creates the connection and forwards all three.
    let mut t = batch(&frags);
    w[0].process_handed_off(1_000_000_000, &mut t);
    assert_eq!(t.acts, vec![Action::Forward(INSIDE); 3]);
    for i in 0..3 {
        assert_eq!(
            &t.frame(i)[30..34],
            &SERVER.octets(),
            "fragment {i} to the server"
        );
    }
    assert_eq!((w[0].conntrack().len(), w[1].conntrack().len()), (1, 0));
    // An unfragmented packet of the same flow takes the same way and finds
    // the connection.
    let mut b = vec![0u8; 128];
    let n = sluice_wire::build::build_udp4(&mut b, ROUTER_MAC, GW_OUT_MAC, &k, 10).unwrap();
    let (a, _) = run(&mut w[1], false, OUTSIDE, &b[..n]);
    assert_eq!(a, Action::Handoff(0));
    let fast = w[0].counters().fast_path;
    let (a, _) = run(&mut w[0], true, OUTSIDE, &b[..n]);
    assert_eq!(a, Action::Forward(INSIDE));
    assert_eq!(w[0].counters().fast_path, fast + 1);
}

/// A gateway of one worker saves its connections; one of 2, 3 or 4
/// workers takes them back where its steering sends them
/// (`Worker::home_of`): every restored connection's packets, steered as
/// the AF_PACKET and AF_XDP programs steer them
/// (`sluice_io::steer::worker_for` on the frame), reach the worker that
/// holds it (a port forward's inbound ones by a handoff, as for a
/// connection made there), go out as before (the same external port) and
/// make no new connection; the SNAT ones refused are exactly those whose
/// internal and external ports the new steering splits.
#[test]
fn a_restart_with_another_number_of_workers_places_connections_where_steered() {
    use sluice_engine::{RestoreError, SavedConn};
    use sluice_io::steer::{worker_for, Steer, SteerKey};
    let now = 1_000_000_000;
    let mut old = worker(0, 1);
    let out_key = |i: u16| FlowKey4 {
        src: u32::from(HOST),
        dst: u32::from(CLIENT),
        sport: 30_000 + 3 * i,
        dport: 443,
        proto: proto::TCP,
    };
    // To the port forward on the gateway's address, or routed to the
    // server.
    let in_key = |j: u16, port: u16| FlowKey4 {
        src: u32::from(CLIENT),
        dst: u32::from(if port == FWD_PORT { PUBLIC } else { SERVER }),
        sport: 40_000 + 5 * j,
        dport: port,
        proto: proto::TCP,
    };
    let server_key = |j: u16, port: u16| FlowKey4 {
        src: u32::from(SERVER),
        dst: u32::from(CLIENT),
        sport: port,
        dport: 40_000 + 5 * j,
        proto: proto::TCP,
    };
    let to_gw = (ROUTER_MAC, GW_OUT_MAC);
    let from_host = (HOST_MAC, GW_IN_MAC);
    // 40 SNAT connections (their external ports from the one worker's
    // whole range), 8 through the port forward, 4 routed to the server
    // untranslated (port 22).
    let mut ext = Vec::new();
    for i in 0..40 {
        let (a, f) = run(&mut old, false, INSIDE, &tcp(&out_key(i), from_host, SYN));
        assert_eq!(a, Action::Forward(OUTSIDE));
        let e = key_of(&f).sport;
        let answer = FlowKey4 {
            src: u32::from(CLIENT),
            dst: u32::from(POOL),
            sport: 443,
            dport: e,
            proto: proto::TCP,
        };
        let (a, _) = run(&mut old, false, OUTSIDE, &tcp(&answer, to_gw, SYN_ACK));
        assert_eq!(a, Action::Forward(INSIDE));
        ext.push((answer, e));
    }
    for j in 0..12 {
        let (port, to) = if j < 8 { (FWD_PORT, 80) } else { (22, 22) };
        let (a, _) = run(&mut old, false, OUTSIDE, &tcp(&in_key(j, port), to_gw, SYN));
        assert_eq!(a, Action::Forward(INSIDE));
        let (a, _) = run(
            &mut old,
            false,
            INSIDE,
            &tcp(&server_key(j, to), from_host, SYN_ACK),
        );
        assert_eq!(a, Action::Forward(OUTSIDE));
    }
    // 20 pings (SNAT translates their identifiers).
    let echo = |k: &FlowKey4, macs: ([u8; 6], [u8; 6]), request: bool| {
        let mut b = vec![0u8; 128];
        let n =
            sluice_wire::build::build_icmp4_echo(&mut b, macs.0, macs.1, k, 1, request, 8).unwrap();
        b.truncate(n);
        b
    };
    let ping_key = |i: u16| FlowKey4 {
        src: u32::from(HOST),
        dst: u32::from(CLIENT),
        sport: 900 + 7 * i,
        dport: 900 + 7 * i,
        proto: proto::ICMP,
    };
    let mut ids = Vec::new();
    for i in 0..20 {
        let (a, f) = run(
            &mut old,
            false,
            INSIDE,
            &echo(&ping_key(i), from_host, true),
        );
        assert_eq!(a, Action::Forward(OUTSIDE));
        let id = key_of(&f).sport;
        let answer = FlowKey4 {
            src: u32::from(CLIENT),
            dst: u32::from(POOL),
            sport: id,
            dport: id,
            proto: proto::ICMP,
        };
        let (a, _) = run(&mut old, false, OUTSIDE, &echo(&answer, to_gw, false));
        assert_eq!(a, Action::Forward(INSIDE));
        ids.push((answer, id));
    }
    let saved = old.carried_conns(now);
    assert_eq!(saved.len(), 72);
    let later = 2 * now;
    for n in 2..=4u16 {
        let steer = |i: IfIndex| {
            Some(Steer {
                key: if i == INSIDE {
                    SteerKey::Source
                } else {
                    SteerKey::Destination
                },
                workers: n,
            })
        };
        let mut w: Vec<Worker> = (0..n).map(|id| worker(id, n)).collect();
        let mut split = std::collections::BTreeSet::new();
        for s in &saved {
            match w[0].home_of(s, steer) {
                Ok(h) => w[usize::from(h)].restore(later, s).unwrap(),
                Err(RestoreError::Split { workers }) => {
                    assert_eq!(workers, n);
                    let SavedConn::V4 { orig, .. } = s else {
                        panic!("{s:?}")
                    };
                    split.insert(orig.sport);
                }
                Err(e) => panic!("{s:?}: {e}"),
            }
        }
        let held = |w: &[Worker]| w.iter().map(|w| w.conntrack().len()).sum::<usize>();
        assert_eq!(held(&w), 72 - split.len());
        // Steer a frame as the programs do, run it there and follow a
        // handoff.
        let mut through = |iif: IfIndex, frame: Vec<u8>| {
            let mut at = usize::from(worker_for(steer(iif).unwrap(), &frame[14..]));
            let (mut a, mut f) = run(&mut w[at], false, iif, &frame);
            if let Action::Handoff(h) = a {
                at = usize::from(h);
                (a, f) = run(&mut w[at], true, iif, &frame);
            }
            (a, key_of(&f), at)
        };
        for (i, (answer, e)) in (0..40).zip(&ext) {
            let k = out_key(i);
            let split_here = owner_of(k.sport, n) != owner_of(*e, n);
            assert_eq!(split.contains(&k.sport), split_here, "{k:?} {e} {n}");
            if split_here {
                continue;
            }
            let (a, f, at) = through(INSIDE, tcp(&k, from_host, ACK));
            assert_eq!(a, Action::Forward(OUTSIDE), "{k:?} {n}");
            assert_eq!((f.src, f.sport), (u32::from(POOL), *e), "{k:?} {n}");
            let (a, f, at2) = through(OUTSIDE, tcp(answer, to_gw, ACK));
            assert_eq!(a, Action::Forward(INSIDE));
            assert_eq!((f.dst, f.dport), (k.src, k.sport));
            assert_eq!(at, at2);
        }
        for j in 0..12 {
            let (port, to) = if j < 8 { (FWD_PORT, 80) } else { (22, 22) };
            let (a, f, at) = through(OUTSIDE, tcp(&in_key(j, port), to_gw, ACK));
            assert_eq!(a, Action::Forward(INSIDE));
            assert_eq!((f.dst, f.dport), (u32::from(SERVER), to));
            let (a, f, at2) = through(INSIDE, tcp(&server_key(j, to), from_host, ACK));
            assert_eq!(a, Action::Forward(OUTSIDE));
            let dst = in_key(j, port).dst;
            assert_eq!((f.src, f.sport), (dst, port));
            assert_eq!(at, at2);
        }
        for (i, (answer, id)) in (0..20).zip(&ids) {
            let k = ping_key(i);
            let split_here = owner_of(k.sport, n) != owner_of(*id, n);
            assert_eq!(split.contains(&k.sport), split_here, "{k:?} {id} {n}");
            if split_here {
                continue;
            }
            let (a, f, at) = through(INSIDE, echo(&k, from_host, true));
            assert_eq!(a, Action::Forward(OUTSIDE), "{k:?} {n}");
            assert_eq!((f.src, f.sport), (u32::from(POOL), *id), "{k:?} {n}");
            let (a, f, at2) = through(OUTSIDE, echo(answer, to_gw, false));
            assert_eq!(a, Action::Forward(INSIDE));
            assert_eq!((f.dst, f.dport), (k.src, k.sport));
            assert_eq!(at, at2);
        }
        assert_eq!(
            held(&w),
            72 - split.len(),
            "no new connection ({n} workers)"
        );
        // Some of each kind: TCP ports 30 000+ and identifiers below 1000.
        assert!(split.iter().any(|p| *p >= 30_000), "{n}: {split:?}");
        assert!(split.iter().any(|p| *p < 1000), "{n}: {split:?}");
        assert!(split.len() < 60, "{n}: {split:?}");
    }
}
