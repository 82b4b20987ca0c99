//! Table-level tests: keys, timeouts, GC, flush, early drop, a model check.

use core::time::Duration;
use std::collections::HashMap;

use proptest::prelude::*;
use sluice_wire::flow::{proto, FlowKey4, FlowKey6};

use crate::*;

type T4 = Table<FlowKey4, u64>;

fn table(max: u32) -> T4 {
    Table::new(Config::new(max, 0xdead_beef_cafe_f00d)).unwrap()
}

fn key(p: u8, i: u32) -> FlowKey4 {
    FlowKey4 {
        src: 0x0a00_0000 | i,
        dst: 0x0808_0808,
        sport: (i % 50_000) as u16 + 1024,
        dport: 80,
        proto: p,
    }
}

/// Reply key after a source NAT to 192.0.2.1.
fn nat_reply(k: &FlowKey4) -> FlowKey4 {
    FlowKey4 {
        src: k.dst,
        dst: 0xc000_0201,
        sport: k.dport,
        dport: k.sport,
        proto: k.proto,
    }
}

fn secs(s: u64) -> Instant {
    Instant::from_secs(s)
}

fn ms(t: Instant, d: u64) -> Instant {
    Instant::from_millis(t.as_millis() + d)
}

fn find(t: &T4, k: &FlowKey4) -> Option<(EntryId, Dir)> {
    t.lookup(t.hash(k), k)
}

fn tcp(f: u8) -> L4Event {
    L4Event::Tcp(TcpFlags(f))
}

const S: u8 = TcpFlags::SYN;
const A: u8 = TcpFlags::ACK;
const F: u8 = TcpFlags::FIN;
const R: u8 = TcpFlags::RST;

fn noop(_: &Entry<FlowKey4, u64>) {}

#[test]
fn entry_fits_the_memory_budget() {
    assert_eq!(core::mem::size_of::<Entry<FlowKey4, u64>>(), 48);
    // The engine's payload: two adjacency indices and two checksum deltas.
    assert_eq!(core::mem::size_of::<Entry<FlowKey4, [u16; 4]>>(), 48);
    assert!(core::mem::size_of::<Entry<FlowKey6, u64>>() <= 96);
    // 96 B per connection, index included, at every size up to 40 M.
    for max in [1_000, 1_000_000, 40_000_000u32] {
        let per = T4::memory_bytes_for(max) as f64 / f64::from(max);
        assert!(per <= 96.0, "{max}: {per} B/conn");
    }
    let per = T4::memory_bytes_for(40_000_000) as f64 / 40e6;
    assert!((81.0..82.0).contains(&per), "{per}");
    // 40 M connections fit comfortably in 24 GiB.
    assert!(T4::memory_bytes_for(40_000_000) < 4 << 30);
}

#[test]
fn prefaulted_table_behaves_like_a_lazy_one() {
    let mut t: T4 = Table::new(Config {
        prefault: true,
        ..Config::new(4096, 7)
    })
    .unwrap();
    let now = secs(1);
    for i in 0..4096 {
        let k = key(proto::UDP, i);
        t.insert(now, k, nat_reply(&k), u64::from(i), &mut noop)
            .unwrap();
    }
    for i in 0..4096 {
        let k = key(proto::UDP, i);
        let (id, d) = find(&t, &k).unwrap();
        assert_eq!((d, *t.entry(id).payload()), (Dir::Original, u64::from(i)));
        assert_eq!(find(&t, &nat_reply(&k)).unwrap(), (id, Dir::Reply));
    }
}

#[test]
fn packed_keys_round_trip() {
    use crate::Key;
    let k4 = FlowKey4 {
        src: 0x0a00_0001,
        dst: 0xcb00_7102,
        sport: 0xfffe,
        dport: 1,
        proto: proto::TCP,
    };
    assert_eq!(FlowKey4::unpack(&k4.pack(), k4.proto()), k4);
    let k6 = FlowKey6 {
        src: 0x2001_0db8_0000_0000_0000_0000_0000_0001,
        dst: u128::MAX - 7,
        sport: 443,
        dport: 0xffff,
        proto: proto::UDP,
    };
    assert_eq!(FlowKey6::unpack(&k6.pack(), k6.proto()), k6);
}

#[test]
fn vacant_insert_skips_the_lookup_only_while_nothing_was_inserted() {
    let mut t = table(16);
    let (a, b) = (key(proto::UDP, 1), key(proto::UDP, 2));
    let va = t.lookup_vacant(t.hash(&a), &a).unwrap_err();
    let va2 = va;
    assert_eq!(va.key(), &a);
    let id = t
        .insert_vacant(secs(0), va, nat_reply(&a), 1, &mut noop)
        .unwrap();
    assert_eq!(find(&t, &a), Some((id, Dir::Original)));
    // Stale: `a` was inserted since; the key is looked up again.
    assert_eq!(
        t.insert_vacant(secs(0), va2, nat_reply(&b), 2, &mut noop),
        Err(InsertError::Exists)
    );
    let vb = t.lookup_vacant(t.hash(&b), &b).unwrap_err();
    // The reply key is still checked.
    assert_eq!(
        t.insert_vacant(secs(0), vb, nat_reply(&a), 3, &mut noop),
        Err(InsertError::Exists)
    );
    assert!(t.lookup_vacant(t.hash(&a), &a).is_ok());
    assert_eq!(t.len(), 1);
}

#[test]
fn keys_of_different_protocols_are_refused() {
    let mut t = table(8);
    let k = key(proto::UDP, 1);
    let mut r = nat_reply(&k);
    r.proto = proto::TCP;
    assert_eq!(
        t.insert(secs(0), k, r, 1, &mut noop),
        Err(InsertError::ProtoMismatch)
    );
    assert_eq!(t.len(), 0);
    assert_eq!(t.index_occupied(), 0);
}

#[test]
fn config_errors() {
    assert_eq!(
        T4::new(Config::new(0, 1)).unwrap_err(),
        ConfigError::ZeroMax
    );
    assert_eq!(
        T4::new(Config::new(u32::MAX, 1)).unwrap_err(),
        ConfigError::TooLarge
    );
}

#[test]
fn two_keys_reach_one_entry_and_remove_removes_both() {
    let mut t = table(64);
    let k = key(proto::UDP, 1);
    let r = nat_reply(&k);
    let id = t.insert(secs(0), k, r, 77, &mut noop).unwrap();
    assert_eq!(find(&t, &k), Some((id, Dir::Original)));
    assert_eq!(find(&t, &r), Some((id, Dir::Reply)));
    assert_eq!(find(&t, &k.reversed()), None);
    assert_eq!(*t.entry(id).payload(), 77);
    assert_eq!(t.entry(id).key(Dir::Reply), r);
    assert_eq!(t.entry(id).proto(), proto::UDP);
    assert_eq!(t.len(), 1);
    assert_eq!(t.index_occupied(), 2);
    // The split lookup agrees.
    let (cid, cdir) = t.candidate(t.hash(&r)).unwrap();
    assert!(t.verify(cid, cdir, &r));

    let e = t.remove(id).unwrap();
    assert_eq!(e.orig(), k);
    assert_eq!(e.reply(), r);
    assert_eq!(find(&t, &k), None);
    assert_eq!(find(&t, &r), None);
    assert_eq!(t.candidate(t.hash(&r)), None);
    assert_eq!(t.len(), 0);
    assert_eq!(t.index_occupied(), 0);
    assert!(t.remove(id).is_none());
    assert!(t.get(id).is_none());
}

#[test]
fn either_key_present_is_exists() {
    let mut t = table(64);
    let k = key(proto::TCP, 1);
    let r = nat_reply(&k);
    t.insert(secs(0), k, r, 0, &mut noop).unwrap();
    assert_eq!(
        t.insert(secs(0), k, k.reversed(), 0, &mut noop),
        Err(InsertError::Exists)
    );
    let other = key(proto::TCP, 2);
    assert_eq!(
        t.insert(secs(0), other, r, 0, &mut noop),
        Err(InsertError::Exists)
    );
    // A new entry whose original key is an existing reply key also clashes.
    assert_eq!(
        t.insert(secs(0), r, other, 0, &mut noop),
        Err(InsertError::Exists)
    );
    assert_eq!(t.len(), 1);
}

#[test]
fn equal_keys_take_one_slot() {
    let mut t = table(8);
    let k = FlowKey4 {
        src: 5,
        dst: 5,
        sport: 9,
        dport: 9,
        proto: proto::ICMP,
    };
    let id = t.insert(secs(0), k, k.reversed(), 0, &mut noop).unwrap();
    assert_eq!(t.index_occupied(), 1);
    assert_eq!(find(&t, &k), Some((id, Dir::Original)));
    t.remove(id).unwrap();
    assert_eq!(t.index_occupied(), 0);
}

/// Drive one TCP packet and check verdict, state and the refreshed timeout.
#[allow(clippy::too_many_arguments)] // one call per line reads as a table
fn step(
    t: &mut T4,
    id: EntryId,
    dir: Dir,
    now: Instant,
    f: u8,
    v: Verdict,
    st: TcpState,
    secs: u64,
) {
    let tr = t.track(id, dir, now, tcp(f));
    assert_eq!(tr.verdict, v, "{dir:?} {f:#x}");
    assert_eq!(tr.state, ProtoState::Tcp(st));
    assert_eq!(
        t.entry(id).expires_in(now),
        Duration::from_secs(secs),
        "{st:?}"
    );
}

#[test]
fn tcp_lifecycle_with_netfilter_timeouts() {
    use Dir::{Original as O, Reply as Rp};
    use TcpState::*;
    let mut t = table(16);
    let k = key(proto::TCP, 1);
    let mut now = secs(100);
    assert!(t.may_create(tcp(S)));
    let id = t.insert(now, k, nat_reply(&k), 0, &mut noop).unwrap();
    assert_eq!(t.entry(id).state(), ProtoState::Tcp(None));

    step(&mut t, id, O, now, S, Verdict::Valid, SynSent, 120);
    assert_eq!(t.track(id, O, now, tcp(S)).ct, CtState::New);
    now = ms(now, 119_999);
    assert!(!t.entry(id).is_expired(now));
    step(&mut t, id, Rp, now, S | A, Verdict::Valid, SynRecv, 60);
    assert!(t.entry(id).seen_reply() && !t.entry(id).is_assured());
    step(&mut t, id, O, now, A, Verdict::Valid, Established, 432_000);
    assert!(t.entry(id).is_assured());
    assert_eq!(t.track(id, O, now, tcp(A)).ct, CtState::Established);
    // Retransmitted SYN/ACK is ignored: no refresh.
    now = ms(now, 1000);
    let tr = t.track(id, Rp, now, tcp(S | A));
    assert_eq!(
        (tr.verdict, tr.ct),
        (Verdict::Ignored, CtState::Established)
    );
    assert_eq!(t.entry(id).expires_in(now), Duration::from_secs(431_999));
    // SYN+FIN is invalid and changes nothing.
    let tr = t.track(id, O, now, tcp(S | F));
    assert_eq!((tr.verdict, tr.ct), (Verdict::Invalid, CtState::Invalid));

    step(&mut t, id, O, now, F | A, Verdict::Valid, FinWait, 120);
    step(&mut t, id, Rp, now, A, Verdict::Valid, CloseWait, 60);
    step(&mut t, id, Rp, now, F | A, Verdict::Valid, LastAck, 30);
    step(&mut t, id, O, now, A, Verdict::Valid, TimeWait, 120);
    // TIME_WAIT expires after exactly 120 s.
    assert!(!t.entry(id).is_expired(ms(now, 119_999)));
    assert!(t.entry(id).is_expired(ms(now, 120_000)));
    assert_eq!(
        t.track(id, O, ms(now, 120_000), tcp(A)).verdict,
        Verdict::Expired
    );
    // A new SYN in TIME_WAIT reopens.
    let tr = t.track(id, O, ms(now, 1000), tcp(S));
    assert_eq!((tr.verdict, tr.ct), (Verdict::Reopen, CtState::New));
}

#[test]
fn tcp_close_wait_last_ack_and_rst_timeouts() {
    use Dir::{Original as O, Reply as Rp};
    use TcpState::*;
    let mut t = table(16);
    let now = secs(5);
    let k = key(proto::TCP, 2);
    let id = t.insert(now, k, nat_reply(&k), 0, &mut noop).unwrap();
    step(&mut t, id, O, now, S, Verdict::Valid, SynSent, 120);
    step(&mut t, id, Rp, now, S | A, Verdict::Valid, SynRecv, 60);
    step(&mut t, id, O, now, A, Verdict::Valid, Established, 432_000);
    step(&mut t, id, Rp, now, F | A, Verdict::Valid, FinWait, 120);
    step(&mut t, id, O, now, A, Verdict::Valid, CloseWait, 60);
    step(&mut t, id, O, now, F | A, Verdict::Valid, LastAck, 30);
    step(&mut t, id, Rp, now, R, Verdict::Valid, Close, 10);
    assert!(t.entry(id).is_expired(ms(now, 10_000)));
    // SYN in CLOSE reopens.
    assert_eq!(t.track(id, O, now, tcp(S)).verdict, Verdict::Reopen);
}

#[test]
fn tcp_simultaneous_open_and_rst_before_reply() {
    use Dir::{Original as O, Reply as Rp};
    use TcpState::*;
    let mut t = table(16);
    let now = secs(1);
    let k = key(proto::TCP, 3);
    let id = t.insert(now, k, nat_reply(&k), 0, &mut noop).unwrap();
    step(&mut t, id, O, now, S, Verdict::Valid, SynSent, 120);
    step(&mut t, id, Rp, now, S, Verdict::Valid, SynSent2, 120);
    step(&mut t, id, O, now, S | A, Verdict::Valid, SynRecv, 60);

    let k = key(proto::TCP, 4);
    let id = t.insert(now, k, nat_reply(&k), 0, &mut noop).unwrap();
    step(&mut t, id, O, now, S, Verdict::Valid, SynSent, 120);
    let tr = t.track(id, Rp, now, tcp(R | A));
    assert_eq!(tr.verdict, Verdict::Close);
    assert!(tr.verdict.must_remove());
    assert!(t.entry(id).is_expired(now));
}

#[test]
fn tcp_loose_pickup_is_capped_until_assured() {
    use Dir::{Original as O, Reply as Rp};
    use TcpState::*;
    let mut t = table(16);
    let now = secs(1);
    let k = key(proto::TCP, 5);
    assert!(t.may_create(tcp(A)));
    assert!(!t.may_create(tcp(F | A)) && !t.may_create(tcp(R)));
    let id = t.insert(now, k, nat_reply(&k), 0, &mut noop).unwrap();
    step(&mut t, id, O, now, A, Verdict::Valid, Established, 300);
    step(&mut t, id, Rp, now, A, Verdict::Valid, Established, 300);
    assert!(!t.entry(id).is_assured());
    step(&mut t, id, O, now, A, Verdict::Valid, Established, 432_000);
    assert!(t.entry(id).is_assured());

    let strict: T4 = Table::new(Config {
        tcp_loose: false,
        ..Config::new(16, 1)
    })
    .unwrap();
    assert!(!strict.may_create(tcp(A)));
    assert!(strict.may_create(tcp(S)));
}

#[test]
fn udp_icmp_generic_timeouts() {
    let mut t = table(16);
    let now = secs(10);
    let k = key(proto::UDP, 1);
    let id = t.insert(now, k, nat_reply(&k), 0, &mut noop).unwrap();
    assert_eq!(t.entry(id).expires_in(now), Duration::from_secs(30));
    let tr = t.track(id, Dir::Original, now, L4Event::Udp);
    assert_eq!(
        (tr.state, tr.ct),
        (ProtoState::Udp(UdpState::Unreplied), CtState::New)
    );
    let tr = t.track(id, Dir::Reply, ms(now, 500), L4Event::Udp);
    assert_eq!(
        (tr.state, tr.ct),
        (ProtoState::Udp(UdpState::Replied), CtState::Established)
    );
    assert_eq!(
        t.entry(id).expires_in(ms(now, 500)),
        Duration::from_secs(30)
    );
    assert!(!t.entry(id).is_assured());
    let tr = t.track(id, Dir::Original, secs(11), L4Event::Udp);
    assert_eq!(tr.state, ProtoState::Udp(UdpState::Stream));
    assert!(t.entry(id).is_assured());
    assert_eq!(t.entry(id).expires_in(secs(11)), Duration::from_secs(120));
    assert!(t.entry(id).is_expired(secs(131)) && !t.entry(id).is_expired(secs(131) - 1));

    let k = key(proto::ICMP, 2);
    assert!(!t.may_create(L4Event::Icmp { request: false }));
    let id = t.insert(now, k, nat_reply(&k), 0, &mut noop).unwrap();
    t.track(id, Dir::Original, now, L4Event::Icmp { request: true });
    assert_eq!(t.entry(id).expires_in(now), Duration::from_secs(30));
    let tr = t.track(id, Dir::Reply, now, L4Event::Icmp { request: false });
    assert_eq!((tr.verdict, tr.ct), (Verdict::Valid, CtState::Established));
    assert!(!t.entry(id).is_assured());

    let k = key(47, 3);
    let id = t.insert(now, k, nat_reply(&k), 0, &mut noop).unwrap();
    assert_eq!(
        t.track(id, Dir::Original, now, L4Event::Other).state,
        ProtoState::Generic
    );
    assert_eq!(t.entry(id).expires_in(now), Duration::from_secs(600));
    assert_eq!(t.entry(id).packets(), 1);
    // A TCP event on a GRE entry is invalid.
    assert_eq!(
        t.track(id, Dir::Original, now, tcp(S)).verdict,
        Verdict::Invalid
    );
}

impl core::ops::Sub<u64> for Instant {
    type Output = Instant;
    fn sub(self, d: u64) -> Instant {
        Instant::from_millis(self.as_millis() - d)
    }
}

#[test]
fn custom_timeouts_apply() {
    let to = Timeouts {
        udp: Duration::from_millis(1500),
        ..Timeouts::default()
    };
    let mut t: T4 = Table::new(Config {
        timeouts: to,
        ..Config::new(8, 3)
    })
    .unwrap();
    let k = key(proto::UDP, 1);
    let id = t.insert(secs(0), k, nat_reply(&k), 0, &mut noop).unwrap();
    t.track(id, Dir::Original, secs(0), L4Event::Udp);
    assert!(t.entry(id).is_expired(Instant::from_millis(1500)));
    t.set_timeouts(&Timeouts::default());
    t.track(id, Dir::Original, secs(1), L4Event::Udp);
    assert_eq!(t.entry(id).expires_in(secs(1)), Duration::from_secs(30));
}

#[test]
fn a_timeout_policy_governs_the_connections_given_it() {
    let mut t = table(16);
    let d = Duration::from_secs;
    let mut udp = TimeoutPolicy::default();
    udp.set(TimeoutKind::Udp, d(10));
    udp.set(TimeoutKind::UdpStream, d(45));
    assert!(!t.set_timeout_policy(0, &udp), "slot 0 is the table's own");
    assert!(t.set_timeout_policy(3, &udp));
    assert_eq!(t.timeout_policy(3), Some(&udp));
    assert_eq!(t.timeout_policy(4), None);

    // The first packet, then the policy (as `ct timeout set` does).
    let now = secs(100);
    let k = key(proto::UDP, 1);
    let id = t.insert(now, k, nat_reply(&k), 0, &mut noop).unwrap();
    t.track(id, Dir::Original, now, L4Event::Udp);
    assert_eq!(t.entry(id).expires_in(now), d(30));
    t.apply_timeout_policy(id, 3, now);
    assert_eq!(t.entry(id).timeout_policy(), 3);
    assert_eq!(t.entry(id).expires_in(now), d(10));
    t.track(id, Dir::Reply, secs(101), L4Event::Udp);
    assert_eq!(t.entry(id).expires_in(secs(101)), d(10));
    // The stream timer, on the fast path too.
    t.track(id, Dir::Original, secs(102), L4Event::Udp);
    assert_eq!(t.entry(id).expires_in(secs(102)), d(45));
    t.track(id, Dir::Original, secs(103), L4Event::Udp);
    assert_eq!(t.entry(id).expires_in(secs(103)), d(45));
    // A connection without the policy keeps the table's timers.
    let k2 = key(proto::UDP, 2);
    let other = t.insert(now, k2, nat_reply(&k2), 0, &mut noop).unwrap();
    t.track(other, Dir::Original, now, L4Event::Udp);
    t.apply_timeout_policy(other, 9, now);
    assert_eq!(t.entry(other).timeout_policy(), 0, "slot 9 holds nothing");
    assert_eq!(t.entry(other).expires_in(now), d(30));

    // TCP: the timers the policy leaves unset follow the table's, also
    // after the table's change; SYN_SENT2 has its own timer.
    let mut tcp_p = TimeoutPolicy::default();
    tcp_p.set(TimeoutKind::TcpSynSent, d(5));
    tcp_p.set(TimeoutKind::TcpEstablished, d(600));
    tcp_p.set(TimeoutKind::TcpSynSent2, d(7));
    assert!(t.set_timeout_policy(200, &tcp_p));
    let k3 = key(proto::TCP, 3);
    let c = t.insert(now, k3, nat_reply(&k3), 0, &mut noop).unwrap();
    t.track(c, Dir::Original, now, tcp(S));
    t.apply_timeout_policy(c, 200, now);
    assert_eq!(t.entry(c).expires_in(now), d(5));
    t.set_timeouts(&Timeouts {
        tcp_syn_recv: d(61),
        tcp_established: d(1),
        ..Timeouts::default()
    });
    t.track(c, Dir::Reply, now, tcp(S | A));
    assert_eq!(
        t.entry(c).expires_in(now),
        d(61),
        "the table's new SYN_RECV"
    );
    t.track(c, Dir::Original, now, tcp(A));
    assert_eq!(t.entry(c).state(), ProtoState::Tcp(TcpState::Established));
    assert_eq!(
        t.entry(c).expires_in(now),
        d(600),
        "the policy's ESTABLISHED"
    );
    t.track(c, Dir::Original, now, tcp(A));
    assert_eq!(t.entry(c).expires_in(now), d(600));
    // Simultaneous open.
    let k4 = key(proto::TCP, 4);
    let c2 = t.insert(now, k4, nat_reply(&k4), 0, &mut noop).unwrap();
    t.track(c2, Dir::Original, now, tcp(S));
    t.apply_timeout_policy(c2, 200, now);
    t.track(c2, Dir::Reply, now, tcp(S));
    assert_eq!(t.entry(c2).state(), ProtoState::Tcp(TcpState::SynSent2));
    assert_eq!(t.entry(c2).expires_in(now), d(7));

    // Changing a slot's policy changes it for the connections in it.
    let mut udp2 = udp;
    udp2.set(TimeoutKind::UdpStream, d(90));
    t.set_timeout_policy(3, &udp2);
    t.track(id, Dir::Original, secs(104), L4Event::Udp);
    assert_eq!(t.entry(id).expires_in(secs(104)), d(90));
}

#[test]
fn packed_states_read_back() {
    use crate::proto::UdpState::*;
    let mut all = vec![ProtoState::Icmp, ProtoState::Generic];
    all.extend([Unreplied, Replied, Stream].map(ProtoState::Udp));
    for c in 0..=9 {
        all.push(ProtoState::from_code(proto::TCP, c).unwrap());
    }
    let mut seen = std::collections::HashSet::new();
    for s in all {
        assert!(seen.insert(s.pack()), "{s:?} shares a code");
        assert_eq!(ProtoState::unpack(s.pack()), s);
    }
}

#[test]
fn gc_removes_exactly_the_expired_within_budget() {
    let mut t = table(1000);
    let t0 = secs(0);
    // 300 UDP (30 s), 300 ICMP (30 s, then refreshed at 20 s), 300 generic (600 s).
    let mut ids = Vec::new();
    for i in 0..900u32 {
        let p = [proto::UDP, proto::ICMP, 47][(i % 3) as usize];
        let k = key(p, i);
        ids.push((
            p,
            t.insert(t0, k, nat_reply(&k), u64::from(i), &mut noop)
                .unwrap(),
        ));
    }
    for &(p, id) in &ids {
        if p == proto::ICMP {
            t.track(id, Dir::Original, secs(20), L4Event::Icmp { request: true });
        }
    }
    let now = secs(31);
    let mut removed = Vec::new();
    let n = t.gc(now, 450, &mut |e| removed.push(*e.payload()));
    assert_eq!(n, removed.len());
    assert_eq!(n, 150, "half the slab holds half the UDP entries");
    let n2 = t.gc(now, 450, &mut |e| removed.push(*e.payload()));
    assert_eq!(n + n2, 300);
    assert!(removed.iter().all(|&i| i % 3 == 0));
    assert_eq!(t.len(), 600);
    assert_eq!(t.gc(now, 10_000, &mut noop), 0);
    // At 51 s the ICMP entries are gone too.
    assert_eq!(t.gc(secs(51), 10_000, &mut noop), 300);
    assert_eq!(t.len(), 300);
    assert!(t.iter().all(|(_, e)| e.orig().proto == 47));
    assert_eq!(t.index_occupied(), 600);
    assert_eq!(t.gc(secs(0), 0, &mut noop), 0);
}

#[test]
fn flush_and_flush_matching() {
    let mut t = table(200);
    for i in 0..150 {
        let k = key(if i % 2 == 0 { proto::TCP } else { proto::UDP }, i);
        let id = t.insert(secs(0), k, nat_reply(&k), 0, &mut noop).unwrap();
        t.entry_mut(id).set_mark(i);
    }
    let mut seen = 0;
    let n = t.flush_matching(|e| e.mark() < 50, &mut |_| seen += 1);
    assert_eq!((n, seen, t.len()), (50, 50, 100));
    assert_eq!(find(&t, &key(proto::TCP, 10)), None);
    assert!(find(&t, &key(proto::TCP, 60)).is_some());
    assert_eq!(t.iter().count(), 100);

    assert_eq!(t.flush(), 100);
    assert_eq!(t.len(), 0);
    assert_eq!(t.index_occupied(), 0);
    assert_eq!(t.iter().count(), 0);
    assert_eq!(find(&t, &key(proto::TCP, 60)), None);
    // The table is usable again, up to max.
    for i in 0..200 {
        let k = key(proto::UDP, i);
        t.insert(secs(1), k, nat_reply(&k), 0, &mut noop).unwrap();
    }
    assert_eq!(t.len(), 200);
}

/// Make entry `id` an assured TCP connection.
fn establish(t: &mut T4, id: EntryId, now: Instant) {
    t.track(id, Dir::Original, now, tcp(S));
    t.track(id, Dir::Reply, now, tcp(S | A));
    t.track(id, Dir::Original, now, tcp(A));
    assert!(t.entry(id).is_assured());
}

#[test]
fn full_table_keeps_established_connections_working() {
    let max = 4096u32;
    let mut t = table(max);
    let now = secs(1);
    let mut est = Vec::new();
    // Fill to max: half assured TCP, half unanswered SYNs.
    for i in 0..max {
        let k = key(proto::TCP, i);
        let id = t
            .insert(now, k, nat_reply(&k), u64::from(i), &mut noop)
            .unwrap();
        if i % 2 == 0 {
            establish(&mut t, id, now);
            est.push(k);
        } else {
            t.track(id, Dir::Original, now, tcp(S));
        }
    }
    assert_eq!(t.len(), max as usize);
    // New connections evict unassured ones (or fail with Full), never assured.
    let mut evicted = 0;
    let mut full = 0;
    for i in max..2 * max {
        let k = key(proto::TCP, i);
        let mut on_evict = |e: &Entry<FlowKey4, u64>| {
            assert!(!e.is_assured());
            evicted += 1;
        };
        match t.insert(now, k, nat_reply(&k), 0, &mut on_evict) {
            Ok(id) => {
                t.track(id, Dir::Original, now, tcp(S));
            }
            Err(InsertError::Full) => full += 1,
            Err(e) => panic!("{e}"),
        }
        assert!(t.len() <= max as usize);
    }
    assert!(evicted > 0);
    assert_eq!(evicted + full, max as usize);
    assert_eq!(t.early_drops(), evicted as u64);
    // Every established connection still works, in both directions.
    for k in &est {
        let (id, dir) = find(&t, k).unwrap();
        assert_eq!(dir, Dir::Original);
        assert_eq!(t.track(id, dir, now, tcp(A)).verdict, Verdict::Valid);
        let (id2, dir) = find(&t, &nat_reply(k)).unwrap();
        assert_eq!((id2, dir), (id, Dir::Reply));
    }
    // Once everything is assured, inserts fail with Full.
    let live: Vec<EntryId> = t.iter().map(|(id, _)| id).collect();
    for id in live {
        if !t.entry(id).is_assured() {
            t.track(id, Dir::Reply, now, tcp(S | A));
            t.track(id, Dir::Original, now, tcp(A));
        }
    }
    let k = key(proto::TCP, 3 * max);
    assert_eq!(
        t.insert(now, k, nat_reply(&k), 0, &mut noop),
        Err(InsertError::Full)
    );
    // Expired entries are reclaimed even if assured.
    let late = secs(1 + 432_001);
    let mut evicted_assured = false;
    let r = t.insert(late, k, nat_reply(&k), 0, &mut |e| {
        evicted_assured = e.is_assured()
    });
    assert!(r.is_ok() && evicted_assured);
    // An expired victim is not a live connection dropped early.
    assert_eq!(t.early_drops(), evicted as u64);
}

/// Insert the TCP connections of `range` into `t`, each established (or
/// only a SYN seen, when `!assured`), pushing them to `ids`; how many were
/// refused as `Full`.
fn fill(
    t: &mut T4,
    ids: &mut Vec<(EntryId, FlowKey4)>,
    range: core::ops::Range<u32>,
    assured: bool,
    evicted: &mut usize,
) -> usize {
    let now = secs(1);
    let mut full = 0;
    for i in range {
        let k = key(proto::TCP, i);
        match t.insert(now, k, nat_reply(&k), 0, &mut |_| *evicted += 1) {
            Ok(id) => {
                if assured {
                    establish(t, id, now);
                } else {
                    t.track(id, Dir::Original, now, tcp(S));
                }
                ids.push((id, k));
            }
            Err(InsertError::Full) => full += 1,
            Err(e) => panic!("{e}"),
        }
    }
    full
}

#[test]
fn max_changes_within_capacity_while_running() {
    let mut cfg = Config::new(1000, 0xdead_beef_cafe_f00d);
    cfg.capacity = 4000;
    let mut t = T4::new(cfg).unwrap();
    assert_eq!((t.max(), t.capacity()), (1000, 4000));
    // Built for its capacity: the same memory as a table of 4000.
    assert_eq!(t.memory_bytes(), T4::memory_bytes_for(4000));
    let (mut ids, mut ev) = (Vec::new(), 0);
    // Full at 1000 assured connections: the 1001st is refused.
    assert_eq!(fill(&mut t, &mut ids, 0..1001, true, &mut ev), 1);
    assert_eq!(t.len(), 1000);
    // Raised to the capacity: 3000 more fit, then the table is full again.
    t.set_max(4000).unwrap();
    assert_eq!(fill(&mut t, &mut ids, 2000..5001, true, &mut ev), 1);
    assert_eq!(t.len(), 4000);
    // Above the capacity, or zero: refused, nothing changes.
    assert_eq!(
        t.set_max(4001),
        Err(ConfigError::AboveCapacity {
            max: 4001,
            capacity: 4000
        })
    );
    assert_eq!(t.set_max(0), Err(ConfigError::ZeroMax));
    assert_eq!(t.max(), 4000);
    // Lowered below the live count: nothing is removed, every connection
    // still answers, and no new one gets in while the table holds max or
    // more (all assured: refused).
    t.set_max(500).unwrap();
    assert_eq!(fill(&mut t, &mut ids, 9000..9010, true, &mut ev), 10);
    assert_eq!((t.len(), ev), (4000, 0));
    for (id, k) in &ids {
        assert_eq!(find(&t, k), Some((*id, Dir::Original)));
    }
    // Connections that end make room only once the count is below max.
    for (id, _) in ids.iter().take(3501) {
        assert!(t.remove(*id).is_some());
    }
    assert_eq!(t.len(), 499);
    assert_eq!(fill(&mut t, &mut ids, 9100..9102, true, &mut ev), 1);
    assert_eq!(t.len(), 500);
}

#[test]
fn lowered_max_early_drops_unassured_connections() {
    let mut cfg = Config::new(4000, 7);
    cfg.capacity = 4000;
    let mut t = T4::new(cfg).unwrap();
    let (mut ids, mut ev) = (Vec::new(), 0);
    assert_eq!(fill(&mut t, &mut ids, 0..2000, false, &mut ev), 0);
    t.set_max(1000).unwrap();
    // 2000 live, max 1000: each new connection takes an unassured one's
    // place (or is refused); the count never grows.
    let full = fill(&mut t, &mut ids, 5000..6000, false, &mut ev);
    assert!(ev > 900, "{ev} evicted, {full} refused");
    assert_eq!(ev + full, 1000);
    assert_eq!(t.len(), 2000);
    assert_eq!(t.early_drops(), ev as u64);
}

#[test]
fn capacity_below_max_is_refused() {
    let mut cfg = Config::new(1000, 1);
    cfg.capacity = 999;
    assert_eq!(
        T4::new(cfg).err(),
        Some(ConfigError::AboveCapacity {
            max: 1000,
            capacity: 999
        })
    );
    cfg.capacity = MAX_CONNECTIONS + 1;
    assert_eq!(T4::new(cfg).err(), Some(ConfigError::TooLarge));
}

#[test]
fn full_probe_window_early_drops_then_reports_full() {
    let mut t = table(1000);
    t.degenerate = true; // every key hashes to bucket 0: windows collide
    let now = secs(1);
    let cap = index_window_slots();
    let mut ids = Vec::new();
    // Each connection needs two slots in the same window.
    for i in 0..(cap / 2) as u32 {
        let k = key(proto::TCP, i);
        ids.push(t.insert(now, k, nat_reply(&k), 0, &mut noop).unwrap());
    }
    assert_eq!(t.index_occupied(), cap);
    for &id in &ids {
        assert_eq!(
            t.lookup(t.hash(&t.entry(id).orig()), &t.entry(id).orig()),
            Some((id, Dir::Original))
        );
    }
    // Unassured: the next insert evicts one (the one closest to expiry).
    let k = key(proto::TCP, 500);
    let mut ev = Vec::new();
    let id = t
        .insert(ms(now, 10), k, nat_reply(&k), 0, &mut |e| ev.push(e.orig()))
        .unwrap();
    assert_eq!(ev.len(), 1);
    assert_eq!(t.early_drops(), 1, "a live connection was dropped early");
    assert!(find(&t, &k).is_some() && find(&t, &nat_reply(&k)).is_some());
    establish(&mut t, id, now);
    for &id in &ids {
        if t.get(id).is_some() {
            establish(&mut t, id, now);
        }
    }
    let k = key(proto::TCP, 501);
    assert_eq!(
        t.insert(now, k, nat_reply(&k), 0, &mut noop),
        Err(InsertError::Full)
    );
    assert_eq!(t.index_occupied(), cap);
    assert_eq!(t.len(), cap / 2);
    // Removing everything leaves a clean index.
    let live: Vec<EntryId> = t.iter().map(|(id, _)| id).collect();
    for id in live {
        t.remove(id).unwrap();
    }
    assert_eq!((t.index_occupied(), t.index_overflow_total()), (0, 0));
}

fn index_window_slots() -> usize {
    crate::index::WINDOW * crate::index::SLOTS
}

#[test]
fn ipv6_keys_work() {
    let mut t: Table<FlowKey6, u32> = Table::new(Config::new(64, 9)).unwrap();
    let k = FlowKey6 {
        src: 1 << 100,
        dst: 2,
        sport: 5,
        dport: 53,
        proto: proto::UDP,
    };
    let id = t.insert(secs(0), k, k.reversed(), 1, &mut |_| {}).unwrap();
    assert_eq!(
        t.lookup(t.hash(&k.reversed()), &k.reversed()),
        Some((id, Dir::Reply))
    );
}

#[derive(Clone, Debug)]
enum Op {
    Insert(u8, u8),
    Remove(u8),
    Lookup(u8),
    Gc(u8),
    SetMax(u8),
}

fn small_key(i: u8) -> FlowKey4 {
    FlowKey4 {
        src: u32::from(i % 16),
        dst: 99,
        sport: u16::from(i / 16),
        dport: 7,
        proto: proto::UDP,
    }
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (any::<u8>(), any::<u8>()).prop_map(|(a, b)| Op::Insert(a, b)),
        2 => any::<u8>().prop_map(Op::Remove),
        2 => any::<u8>().prop_map(Op::Lookup),
        1 => any::<u8>().prop_map(Op::Gc),
        1 => any::<u8>().prop_map(Op::SetMax),
    ]
}

proptest! {
    /// Insert / lookup / remove against a `HashMap` model. Small tables and a
    /// degenerate hash exercise early drop and the probe bound; evictions are
    /// applied to the model through `on_evict`. The maximum changes now
    /// and then, within a capacity of up to twice the first one: an insert
    /// never grows a table at or above its maximum.
    #[test]
    fn matches_hashmap_model(max in 1u32..40, extra in 0u32..40, degenerate in any::<bool>(), ops in prop::collection::vec(op(), 1..200)) {
        let mut cfg = Config::new(max, 0xdead_beef_cafe_f00d);
        cfg.capacity = max + extra.min(max);
        let cap = cfg.capacity;
        let mut t = T4::new(cfg).unwrap();
        t.degenerate = degenerate;
        // key -> (payload, dir)
        let mut model: HashMap<FlowKey4, (u64, Dir)> = HashMap::new();
        let mut next = 0u64;
        let now = secs(1);
        for op in ops {
            match op {
                Op::Insert(a, b) => {
                    let (o, r) = (small_key(a), small_key(b));
                    next += 1;
                    let mut evicted = Vec::new();
                    let (before, at_max) = (t.len(), t.len() >= t.max());
                    let res = t.insert(now, o, r, next, &mut |e| evicted.push((e.orig(), e.reply())));
                    if at_max {
                        prop_assert!(t.len() <= before);
                    }
                    for (eo, er) in evicted {
                        prop_assert!(model.remove(&eo).is_some());
                        if eo != er { prop_assert!(model.remove(&er).is_some()); }
                    }
                    let clash = model.contains_key(&o) || model.contains_key(&r);
                    match res {
                        Ok(_) => {
                            prop_assert!(!clash);
                            model.insert(o, (next, Dir::Original));
                            if o != r { model.insert(r, (next, Dir::Reply)); }
                        }
                        Err(InsertError::Exists) => prop_assert!(clash),
                        Err(InsertError::Full) => prop_assert!(!clash),
                        Err(InsertError::ProtoMismatch) => prop_assert!(false, "same protocol"),
                    }
                }
                Op::Remove(a) => {
                    let k = small_key(a);
                    let found = t.lookup(t.hash(&k), &k);
                    prop_assert_eq!(found.is_some(), model.contains_key(&k));
                    if let Some((id, _)) = found {
                        let e = t.remove(id).unwrap();
                        model.remove(&e.orig());
                        model.remove(&e.reply());
                    }
                }
                Op::Lookup(a) => {
                    let k = small_key(a);
                    let got = t.lookup(t.hash(&k), &k).map(|(id, d)| (*t.entry(id).payload(), d));
                    prop_assert_eq!(got, model.get(&k).copied());
                }
                Op::Gc(b) => {
                    // Nothing has expired at `now`.
                    prop_assert_eq!(t.gc(now, usize::from(b), &mut |_| {}), 0);
                }
                Op::SetMax(b) => {
                    prop_assert!(t.set_max(cap + 1).is_err());
                    let m = 1 + u32::from(b) % cap;
                    prop_assert!(t.set_max(m).is_ok());
                    prop_assert_eq!(t.max(), m as usize);
                }
            }
            prop_assert!(t.len() <= cap as usize);
            prop_assert_eq!(t.index_occupied(), model.len());
            let distinct: std::collections::HashSet<u64> = model.values().map(|v| v.0).collect();
            prop_assert_eq!(t.len(), distinct.len());
        }
        for (k, &(p, d)) in &model {
            let (id, dir) = t.lookup(t.hash(k), k).unwrap();
            prop_assert_eq!((*t.entry(id).payload(), dir), (p, d));
        }
        let n = t.len();
        prop_assert_eq!(t.flush(), n);
        prop_assert_eq!((t.index_occupied(), t.index_overflow_total()), (0, 0));
    }
}

fn first_event() -> impl Strategy<Value = (u8, L4Event)> {
    prop_oneof![
        any::<u8>().prop_map(|f| (proto::TCP, L4Event::Tcp(TcpFlags(f)))),
        Just((proto::UDP, L4Event::Udp)),
        any::<bool>().prop_map(|request| (proto::ICMP, L4Event::Icmp { request })),
        Just((47, L4Event::Other)),
    ]
}

proptest! {
    /// `insert_vacant_tracked` leaves the entry, and returns the result,
    /// exactly as `insert_vacant` followed by `track` of the first packet:
    /// for every protocol and first event (TCP: every flag byte), with the
    /// default timeouts and with zero ones (a first packet that finds its
    /// new entry expired).
    #[test]
    fn tracked_insert_equals_insert_then_track(
        (p, ev) in first_event(),
        zero in any::<bool>(),
        loose in any::<bool>(),
        at in 0u64..5_000_000,
    ) {
        let mut cfg = Config::new(64, 77);
        cfg.tcp_loose = loose;
        if zero {
            cfg.timeouts = Timeouts {
                tcp_syn_sent: Duration::ZERO,
                udp: Duration::ZERO,
                icmp: Duration::ZERO,
                generic: Duration::ZERO,
                ..Timeouts::default()
            };
        }
        let mut a: T4 = Table::new(cfg).unwrap();
        let mut b: T4 = Table::new(cfg).unwrap();
        let now = Instant::from_millis(at);
        let k = key(p, 5);
        let va = a.lookup_vacant(a.hash(&k), &k).unwrap_err();
        let ia = a.insert_vacant(now, va, nat_reply(&k), 9, &mut noop).unwrap();
        let ta = a.track(ia, Dir::Original, now, ev);
        let vb = b.lookup_vacant(b.hash(&k), &k).unwrap_err();
        let (ib, tb) = b.insert_vacant_tracked(now, vb, nat_reply(&k), 9, ev, &mut noop).unwrap();
        prop_assert_eq!(ia, ib);
        prop_assert_eq!(ta, tb);
        let (ea, eb) = (a.entry(ia), b.entry(ib));
        prop_assert_eq!(
            (ea.state, ea.flags, ea.expiry, ea.packets, ea.mark, ea.orig(), ea.reply(), ea.payload),
            (eb.state, eb.flags, eb.expiry, eb.packets, eb.mark, eb.orig(), eb.reply(), eb.payload)
        );
        prop_assert_eq!(find(&b, &nat_reply(&k)), Some((ib, Dir::Reply)));
    }
}

/// One packet of a connection in [`established_equals_track`]: its
/// protocol's event (TCP: any flag byte), its direction (true: reply), the
/// milliseconds since the previous packet, and whether the caller accepts
/// it on the established path.
fn packet(p: u8) -> impl Strategy<Value = (L4Event, bool, u64, bool)> {
    let ev = match p {
        proto::TCP => prop_oneof![
            // Mostly the handshake and bare ACKs, so connections get
            // established; any flag byte now and then.
            Just(S),
            Just(S | A),
            Just(A),
            Just(A),
            Just(A),
            any::<u8>(),
        ]
        .prop_map(tcp)
        .boxed(),
        proto::UDP => Just(L4Event::Udp).boxed(),
        proto::ICMP => any::<bool>()
            .prop_map(|request| L4Event::Icmp { request })
            .boxed(),
        _ => Just(L4Event::Other).boxed(),
    };
    (
        ev,
        any::<bool>(),
        prop_oneof![0u64..2_000, 0u64..400_000],
        prop::bool::weighted(0.8),
    )
}

proptest! {
    /// `track_established`, and `track` with its established fast path,
    /// agree with the full state machine (`track_general`, which runs
    /// `proto::step`): a table that tries `track_established` first and
    /// falls back to `verify` + `track` whenever it returns `None` (or the
    /// caller refuses) ends every step exactly like one that only ever
    /// calls `verify` + `track_general`, returns the same results, and
    /// `track_established` takes a packet only where the state machine
    /// says valid and established (established packets, and a replied UDP
    /// connection's first packet after the reply).
    #[test]
    fn established_equals_track(
        (p, pkts) in prop_oneof![Just(proto::TCP), Just(proto::UDP), Just(proto::ICMP), Just(47u8)]
            .prop_flat_map(|p| (Just(p), prop::collection::vec(packet(p), 1..40))),
        wrong_key in any::<bool>(),
    ) {
        let mut a = table(64);
        let mut b = table(64);
        let k = key(p, 5);
        let mut now = secs(3);
        let ia = a.insert(now, k, nat_reply(&k), 9, &mut noop).unwrap();
        let ib = b.insert(now, k, nat_reply(&k), 9, &mut noop).unwrap();
        let mut taken = 0;
        for (ev, reply, dt, accept) in pkts {
            now = ms(now, dt);
            let dir = if reply { Dir::Reply } else { Dir::Original };
            let mut pk = if reply { nat_reply(&k) } else { k };
            if wrong_key {
                pk.dport ^= 1;
            }
            let got = a.track_established(ia, dir, &pk, now, ev, |e| {
                accept.then_some((e.orig(), e.payload))
            });
            let ta = (got.is_none() && a.verify(ia, dir, &pk)).then(|| a.track(ia, dir, now, ev));
            let valid = b.verify(ib, dir, &pk);
            if valid {
                let tb = b.track_general(ib, dir, now, ev);
                if let Some(ta) = ta {
                    prop_assert_eq!(ta, tb);
                }
                if got.is_some() {
                    taken += 1;
                    prop_assert_eq!((tb.verdict, tb.ct), (Verdict::Valid, CtState::Established));
                }
            } else {
                prop_assert!(got.is_none());
            }
            if let Some((orig, payload)) = got {
                prop_assert_eq!((orig, payload), (k, 9));
                prop_assert!(accept);
            }
            let (ea, eb) = (a.entry(ia), b.entry(ib));
            prop_assert_eq!(
                (ea.state, ea.flags, ea.expiry, ea.packets),
                (eb.state, eb.flags, eb.expiry, eb.packets)
            );
        }
        // Some cases must take the established path at all.
        if wrong_key {
            prop_assert_eq!(taken, 0);
        }
    }
}

#[test]
fn established_path_takes_stream_and_established_packets() {
    let mut t = table(16);
    let now = secs(10);
    let k = key(proto::UDP, 1);
    let id = t.insert(now, k, nat_reply(&k), 7, &mut noop).unwrap();
    let ev = L4Event::Udp;
    // Unreplied: not taken.
    assert!(t
        .track_established(id, Dir::Original, &k, now, ev, |_| Some(()))
        .is_none());
    t.track(id, Dir::Original, now, ev);
    assert_eq!(t.entry(id).packets(), 1);
    t.track(id, Dir::Reply, now, ev);
    // Replied: the next packet makes it an assured stream, unless the
    // caller refuses it.
    assert!(t
        .track_established(id, Dir::Original, &k, now, ev, |_| None::<()>)
        .is_none());
    assert_eq!(t.entry(id).state(), ProtoState::Udp(UdpState::Replied));
    assert!(!t.entry(id).is_assured());
    assert!(t
        .track_established(id, Dir::Original, &k, now, ev, |_| Some(()))
        .is_some());
    assert_eq!(t.entry(id).state(), ProtoState::Udp(UdpState::Stream));
    assert!(t.entry(id).is_assured());
    assert_eq!(t.entry(id).packets(), 3);
    assert_eq!(t.entry(id).expires_in(now), Duration::from_secs(120));
    // Stream and assured: taken, counted and refreshed.
    let later = secs(70);
    let before = t.entry(id).packets();
    assert_eq!(
        t.track_established(id, Dir::Reply, &nat_reply(&k), later, ev, |e| Some(
            *e.payload()
        )),
        Some(7)
    );
    assert_eq!(t.entry(id).packets(), before + 1);
    assert_eq!(t.entry(id).expires_in(later), Duration::from_secs(120));
    // Refused by the caller: untouched.
    let untouched = secs(80);
    assert!(t
        .track_established(
            id,
            Dir::Reply,
            &nat_reply(&k),
            untouched,
            ev,
            |_| None::<()>
        )
        .is_none());
    assert_eq!(t.entry(id).packets(), before + 1);
    assert_eq!(t.entry(id).expires_in(later), Duration::from_secs(120));
    // Expired: left to `track`.
    assert!(t
        .track_established(id, Dir::Original, &k, secs(500), ev, |_| Some(()))
        .is_none());

    // TCP: an established connection's bare ACK only.
    let k = key(proto::TCP, 2);
    let id = t.insert(now, k, nat_reply(&k), 0, &mut noop).unwrap();
    t.track(id, Dir::Original, now, tcp(S));
    t.track(id, Dir::Reply, now, tcp(S | A));
    t.track(id, Dir::Original, now, tcp(A));
    assert_eq!(t.entry(id).state(), ProtoState::Tcp(TcpState::Established));
    assert!(t
        .track_established(id, Dir::Original, &k, now, tcp(A), |_| Some(()))
        .is_some());
    assert!(t
        .track_established(id, Dir::Original, &k, now, tcp(A | F), |_| Some(()))
        .is_none());
    assert!(t
        .track_established(id, Dir::Original, &k, now, tcp(R), |_| Some(()))
        .is_none());
}

/// A connection carried over a restart (`Entry::carried`, `Table::restore`)
/// comes back in the state, flags, mark and packet count it had, expiring
/// as much later as it had left, and goes on from there as the original
/// would have.
#[test]
fn a_restored_connection_takes_up_where_it_left_off() {
    let mut a = table(16);
    let k = key(proto::TCP, 7);
    let r = nat_reply(&k);
    let t0 = secs(100);
    let id = a.insert(t0, k, r, 5, &mut noop).unwrap();
    a.track(id, Dir::Original, t0, tcp(S));
    a.track(id, Dir::Reply, t0, tcp(S | A));
    a.track(id, Dir::Original, t0, tcp(A));
    a.track(id, Dir::Reply, t0, tcp(A));
    a.entry_mut(id).set_mark(0x42);
    let t1 = secs(160);
    let c = a.entry(id).carried(t1);
    assert_eq!(c.state, ProtoState::Tcp(TcpState::Established));
    assert!(c.assured && c.seen_reply && !c.flowtable);
    assert_eq!((c.mark, c.packets), (0x42, 4));
    // A new process: its clock starts anew.
    let mut b = table(16);
    let u0 = secs(3);
    let id2 = b.restore(u0, k, r, 9, &c, &mut noop).unwrap();
    let e = b.entry(id2);
    assert_eq!(e.carried(u0), c, "everything carried comes back");
    assert_eq!(*e.payload(), 9, "the payload is the new process's");
    assert_eq!(find(&b, &r), Some((id2, Dir::Reply)));
    // It goes on as the original: a FIN moves it on, from the same state.
    let (ta, tb) = (
        a.track(id, Dir::Original, t1, tcp(F | A)),
        b.track(id2, Dir::Original, u0, tcp(F | A)),
    );
    assert_eq!((ta.state, ta.ct), (tb.state, tb.ct));
    // A state of another protocol, or keys already there, are refused.
    let udp = Carried {
        state: ProtoState::Udp(UdpState::Stream),
        ..c
    };
    let k2 = key(proto::TCP, 8);
    assert_eq!(
        b.restore(u0, k2, nat_reply(&k2), 0, &udp, &mut noop),
        Err(InsertError::ProtoMismatch)
    );
    assert_eq!(
        b.restore(u0, k, r, 0, &c, &mut noop),
        Err(InsertError::Exists)
    );
    // A timeout policy comes back where the table holds it, and is
    // followed from the next packet; a slot the table lacks is dropped.
    let mut p = TimeoutPolicy::default();
    p.set(TimeoutKind::TcpFinWait, Duration::from_secs(9));
    b.set_timeout_policy(5, &p);
    let with = |slot, n| {
        let k = key(proto::TCP, n);
        (
            k,
            Carried {
                timeout_policy: slot,
                ..c
            },
        )
    };
    let (k5, c5) = with(5, 20);
    let id5 = b
        .restore(u0, k5, nat_reply(&k5), 0, &c5, &mut noop)
        .unwrap();
    assert_eq!(b.entry(id5).carried(u0), c5);
    b.track(id5, Dir::Original, u0, tcp(F | A));
    assert_eq!(b.entry(id5).expires_in(u0), Duration::from_secs(9));
    let (k6, c6) = with(6, 21);
    let id6 = b
        .restore(u0, k6, nat_reply(&k6), 0, &c6, &mut noop)
        .unwrap();
    assert_eq!(b.entry(id6).timeout_policy(), 0);
    b.track(id6, Dir::Original, u0, tcp(F | A));
    assert_eq!(b.entry(id6).expires_in(u0), Duration::from_secs(120));
}

/// Every protocol state survives its number (`ProtoState::code`), and
/// codes a protocol has no state for are refused.
#[test]
fn state_codes_round_trip() {
    for p in [proto::TCP, proto::UDP, proto::ICMP, proto::ICMPV6, 47] {
        let mut seen = 0;
        for c in 0..=255u8 {
            if let Some(s) = ProtoState::from_code(p, c) {
                assert_eq!(s.code(), c);
                assert_eq!(
                    core::mem::discriminant(&s),
                    core::mem::discriminant(&ProtoState::initial(p))
                );
                seen += 1;
            }
        }
        let want = match p {
            proto::TCP => 10,
            proto::UDP => 3,
            _ => 1,
        };
        assert_eq!(seen, want, "proto {p}");
    }
}

/// A timeout policy over TCP's and UDP's timers (seconds, some unset);
/// SYN_SENT2 follows SYN_SENT, as it does in a table's own timeouts, so
/// that [`policy_timeouts`] can express the same timers as a table's.
fn timeout_policy() -> impl Strategy<Value = TimeoutPolicy> {
    use crate::time::TimeoutKind as K;
    let kinds = [
        K::TcpSynSent,
        K::TcpSynRecv,
        K::TcpEstablished,
        K::TcpFinWait,
        K::TcpCloseWait,
        K::TcpLastAck,
        K::TcpTimeWait,
        K::TcpClose,
        K::TcpUnack,
        K::Udp,
        K::UdpStream,
    ];
    prop::collection::vec(prop::option::of(1u64..900), kinds.len()).prop_map(move |v| {
        let mut p = TimeoutPolicy::default();
        for (k, s) in kinds.iter().zip(v) {
            if let Some(s) = s {
                p.set(*k, Duration::from_secs(s));
                if *k == K::TcpSynSent {
                    p.set(K::TcpSynSent2, Duration::from_secs(s));
                }
            }
        }
        p
    })
}

/// The table timeouts that are `p` over the defaults.
fn policy_timeouts(p: &TimeoutPolicy) -> Timeouts {
    use crate::time::TimeoutKind as K;
    let d = Timeouts::default();
    let or = |k, v| p.get(k).unwrap_or(v);
    Timeouts {
        tcp_syn_sent: or(K::TcpSynSent, d.tcp_syn_sent),
        tcp_syn_recv: or(K::TcpSynRecv, d.tcp_syn_recv),
        tcp_established: or(K::TcpEstablished, d.tcp_established),
        tcp_fin_wait: or(K::TcpFinWait, d.tcp_fin_wait),
        tcp_close_wait: or(K::TcpCloseWait, d.tcp_close_wait),
        tcp_last_ack: or(K::TcpLastAck, d.tcp_last_ack),
        tcp_time_wait: or(K::TcpTimeWait, d.tcp_time_wait),
        tcp_close: or(K::TcpClose, d.tcp_close),
        tcp_unacknowledged: or(K::TcpUnack, d.tcp_unacknowledged),
        udp: or(K::Udp, d.udp),
        udp_stream: or(K::UdpStream, d.udp_stream),
        ..d
    }
}

proptest! {
    /// A connection given a timeout policy after its first packet (as `ct
    /// timeout set` does) moves exactly as the same connection in a table
    /// whose own timeouts are that policy over the defaults: same state,
    /// flags (but the policy's), packet count and expiry after every
    /// packet, whether the packets take the established path
    /// (`track_established`, which leaves a policy's connections to the
    /// general path) or `track`.
    #[test]
    fn a_policy_times_a_connection_as_table_timeouts_would(
        (p, pkts) in prop_oneof![Just(proto::TCP), Just(proto::UDP)]
            .prop_flat_map(|p| (Just(p), prop::collection::vec(packet(p), 1..40))),
        policy in timeout_policy(),
        first in any::<u8>(),
    ) {
        let mut with = table(64);
        assert!(with.set_timeout_policy(9, &policy));
        let mut plain: T4 = Table::new(Config {
            timeouts: policy_timeouts(&policy),
            ..Config::new(64, 0xdead_beef_cafe_f00d)
        })
        .unwrap();
        let k = key(p, 5);
        let mut now = secs(3);
        let iw = with.insert(now, k, nat_reply(&k), 9, &mut noop).unwrap();
        let ip = plain.insert(now, k, nat_reply(&k), 9, &mut noop).unwrap();
        let ev = if p == proto::TCP { tcp(first | S) } else { L4Event::Udp };
        let tw = with.track(iw, Dir::Original, now, ev);
        let tp = plain.track(ip, Dir::Original, now, ev);
        prop_assert_eq!(tw, tp);
        prop_assume!(tw.verdict == Verdict::Valid);
        with.apply_timeout_policy(iw, 9, now);
        prop_assert_eq!(with.entry(iw).timeout_policy(), 9);
        // What `sluice trace` computes without a table, both ways.
        prop_assert_eq!(
            Some(with.entry(iw).expires_in(now)),
            first_packet_timeout(&Timeouts::default(), Some(&policy), p, ev)
        );
        prop_assert_eq!(
            Some(plain.entry(ip).expires_in(now)),
            first_packet_timeout(&policy_timeouts(&policy), None, p, ev)
        );
        let same = |a: &T4, b: &T4| {
            let (ea, eb) = (a.entry(iw), b.entry(ip));
            (
                (ea.state, ea.flags & !crate::entry::F_TIMEOUT_POLICY, ea.expiry, ea.packets),
                (eb.state, eb.flags, eb.expiry, eb.packets),
            )
        };
        let (x, y) = same(&with, &plain);
        prop_assert_eq!(x, y);
        for (ev, reply, dt, accept) in pkts {
            now = ms(now, dt);
            let dir = if reply { Dir::Reply } else { Dir::Original };
            let pk = if reply { nat_reply(&k) } else { k };
            let got = with.track_established(iw, dir, &pk, now, ev, |_| accept.then_some(()));
            prop_assert!(got.is_none(), "a policy's connection left to the general path");
            let tw = with.track(iw, dir, now, ev);
            let tp = plain.track(ip, dir, now, ev);
            prop_assert_eq!(tw, tp);
            let (x, y) = same(&with, &plain);
            prop_assert_eq!(x, y);
            if matches!(tw.verdict, Verdict::Close | Verdict::Reopen | Verdict::Expired) {
                break;
            }
        }
    }
}

/// One step of [`slots_held_are_exact`].
#[derive(Clone, Debug)]
enum SlotOp {
    Insert(u32),
    Restore(u32, u8),
    Apply(u32, u8),
    Remove(u32),
    Gc(u64),
    FlushSlot(u8),
    Flush,
}

fn slot_op() -> impl Strategy<Value = SlotOp> {
    // Slots 1-3 hold policies, 9 none (a policy of a slot the table does
    // not hold is not given).
    let slot = prop_oneof![Just(0u8), Just(1), Just(2), Just(3), Just(9)];
    prop_oneof![
        4 => (0..12u32).prop_map(SlotOp::Insert),
        2 => (0..12u32, slot.clone()).prop_map(|(i, s)| SlotOp::Restore(i, s)),
        4 => (0..12u32, slot.clone()).prop_map(|(i, s)| SlotOp::Apply(i, s)),
        2 => (0..12u32).prop_map(SlotOp::Remove),
        1 => (1..90u64).prop_map(SlotOp::Gc),
        1 => slot.prop_map(SlotOp::FlushSlot),
        1 => Just(SlotOp::Flush),
    ]
}

proptest! {
    /// `timeout_slots_held` is exactly the slots the live entries follow,
    /// after any sequence of inserts (early drops in a full table among
    /// them), restores, policy changes, removals, GC and flushes.
    #[test]
    fn slots_held_are_exact(ops in prop::collection::vec(slot_op(), 1..80)) {
        let mut t = table(6);
        let mut p = TimeoutPolicy::default();
        p.set(TimeoutKind::Udp, Duration::from_secs(20));
        for s in 1..=3 {
            assert!(t.set_timeout_policy(s, &p));
        }
        let mut now = secs(10);
        let carried = |slot: u8| crate::entry::Carried {
            state: ProtoState::initial(proto::UDP),
            assured: false,
            seen_reply: false,
            flowtable: false,
            mark: 0,
            packets: 1,
            expires_in_ms: 30_000,
            timeout_policy: slot,
        };
        for op in ops {
            match op {
                SlotOp::Insert(i) => {
                    let k = key(proto::UDP, i);
                    let _ = t.insert(now, k, nat_reply(&k), 0, &mut noop);
                }
                SlotOp::Restore(i, s) => {
                    let k = key(proto::UDP, 100 + i);
                    let _ = t.restore(now, k, nat_reply(&k), 0, &carried(s), &mut noop);
                }
                SlotOp::Apply(i, s) => {
                    for k in [key(proto::UDP, i), key(proto::UDP, 100 + i)] {
                        if let Some((id, _)) = find(&t, &k) {
                            t.apply_timeout_policy(id, s, now);
                        }
                    }
                }
                SlotOp::Remove(i) => {
                    if let Some((id, _)) = find(&t, &key(proto::UDP, i)) {
                        t.remove(id);
                    }
                }
                SlotOp::Gc(dt) => {
                    now = secs(now.as_millis() / 1000 + dt);
                    t.gc(now, 64, &mut noop);
                }
                SlotOp::FlushSlot(s) => {
                    t.flush_matching(|e| e.timeout_policy() == s, &mut noop);
                }
                SlotOp::Flush => {
                    t.flush();
                }
            }
            let mut want = [0u64; 4];
            for (_, e) in t.iter() {
                let s = usize::from(e.timeout_policy());
                if s != 0 {
                    want[s / 64] |= 1 << (s % 64);
                }
            }
            prop_assert_eq!(t.timeout_slots_held(), want);
        }
    }
}
