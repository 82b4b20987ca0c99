//! Connections carried over a restart of the gateway: what a worker gives
//! when it stops ([`Worker::carried_conns`]) and takes back when a new
//! process starts ([`Worker::restore`]).
//!
//! Only the conntrack entries travel, with their state, flags, mark,
//! packet count, time left and timeout policy ([`Carried`]); the rest of an entry is the
//! new process's: its next hops are looked up again, and the XDP offload
//! starts empty (an offloaded connection's next packet in the worker
//! installs it again). A translated connection (NAT) takes its mappings
//! back with their very external endpoints (and, under port block
//! allocation, their blocks; [`sluice_nat::WorkerNat::restore_session`]).

use sluice_conntrack::{Carried, InsertError};
use sluice_io::steer::{worker_for, Steer};
use sluice_wire::flow::{FlowKey4, FlowKey6};

use crate::route::IfIndex;

use super::v6::{conn6, FlowInfo6};
use super::{conn4, install_ct_timeout, instant, offload_removals, FlowInfo, Worker};

/// One connection a restart carries over.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SavedConn {
    /// IPv4.
    V4 {
        /// Original direction.
        orig: FlowKey4,
        /// Reply direction (the original reversed, unless translated).
        reply: FlowKey4,
        /// The rest of the entry.
        carried: Carried,
        /// The NAT mappings it holds
        /// ([`sluice_nat::WorkerNat::held_mappings`]; 0 untranslated).
        held: u8,
    },
    /// IPv6.
    V6 {
        /// Original direction.
        orig: FlowKey6,
        /// Reply direction.
        reply: FlowKey6,
        /// The rest of the entry.
        carried: Carried,
    },
}

/// Why a saved connection was not restored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RestoreError {
    /// An IPv6 connection whose reply key is not its original reversed
    /// (IPv6 is not translated).
    #[error("an IPv6 connection with translated keys")]
    Translated,
    /// The NAT did not take its mappings back.
    #[error("NAT: {0}")]
    Nat(#[from] sluice_nat::RestoreRefused),
    /// Its time was up.
    #[error("expired")]
    Expired,
    /// No route towards one of its ends.
    #[error("no route towards one of its ends")]
    NoRoute,
    /// The connection table refused it.
    #[error("{0}")]
    Table(#[from] InsertError),
    /// Restored on another number of workers than saved it ([`home_of`]):
    /// its source is translated (the NAT's external port is in the reply's
    /// worker's slice), and the steering of this many workers sends its
    /// two directions to different workers.
    #[error(
        "its internal and external ports are steered to different workers by {workers} workers"
    )]
    Split {
        /// Workers of this gateway.
        workers: u16,
    },
}

/// [`Worker::home_of`], with `ingress4` / `ingress6` giving the interface
/// packets from an address arrive on. Each direction's packet is steered as
/// [`sluice_io::steer::worker_for`] steers it on its ingress interface;
/// when both go to one worker, that one. Otherwise: with the destination
/// translated and the source not (a port-changing DNAT), the reply's,
/// where a new such connection is made and the original direction's
/// packets are handed over (`Action::Handoff`); with neither translated
/// (two interfaces of one role, which no steering places), the original
/// direction's, where a new one would be made; with the source translated,
/// [`RestoreError::Split`]: the external port must be in its worker's
/// slice and the internal port's worker sees the packets out.
fn home_of(
    s: &SavedConn,
    ingress4: impl Fn(u32) -> Option<IfIndex>,
    ingress6: impl Fn(u128) -> Option<IfIndex>,
    steer: impl Fn(IfIndex) -> Option<Steer>,
) -> Result<u16, RestoreError> {
    let on = |i: Option<IfIndex>, l3: &[u8]| -> Result<(u16, u16), RestoreError> {
        let st = i.and_then(&steer).ok_or(RestoreError::NoRoute)?;
        Ok((worker_for(st, l3), st.workers))
    };
    let (fwd, back, src_nat, dst_nat) = match *s {
        SavedConn::V4 { orig, reply, .. } => (
            on(ingress4(orig.src), &header4(&orig, false))?,
            on(ingress4(reply.src), &header4(&reply, true))?,
            reply.dst != orig.src || reply.dport != orig.sport,
            reply.src != orig.dst || reply.sport != orig.dport,
        ),
        SavedConn::V6 { orig, reply, .. } => (
            on(ingress6(orig.src), &header6(&orig, false))?,
            on(ingress6(reply.src), &header6(&reply, true))?,
            false,
            false,
        ),
    };
    match (fwd.0 == back.0, src_nat, dst_nat) {
        (true, _, _) => Ok(fwd.0),
        (false, false, true) => Ok(back.0),
        (false, false, false) => Ok(fwd.0),
        (false, true, _) => Err(RestoreError::Split { workers: fwd.1 }),
    }
}

/// The IPv4 and transport header a packet of `k` starts with, as far as
/// the steering reads it (an ICMP query: a request in the original
/// direction, its reply in the other).
fn header4(k: &FlowKey4, reply: bool) -> [u8; 28] {
    let mut h = [0u8; 28];
    h[0] = 0x45;
    h[3] = 28;
    h[8] = 64;
    h[9] = k.proto;
    h[12..16].copy_from_slice(&k.src.to_be_bytes());
    h[16..20].copy_from_slice(&k.dst.to_be_bytes());
    if k.proto == sluice_wire::flow::proto::ICMP {
        h[20] = if reply { 0 } else { 8 };
        h[24..26].copy_from_slice(&k.sport.to_be_bytes());
    } else {
        h[20..22].copy_from_slice(&k.sport.to_be_bytes());
        h[22..24].copy_from_slice(&k.dport.to_be_bytes());
    }
    h
}

/// [`header4`] for IPv6 (the steering reads the addresses, and the ICMPv6
/// type to tell errors and NDP from the rest).
fn header6(k: &FlowKey6, reply: bool) -> [u8; 48] {
    let mut h = [0u8; 48];
    h[0] = 0x60;
    h[5] = 8;
    h[6] = k.proto;
    h[7] = 64;
    h[8..24].copy_from_slice(&k.src.to_be_bytes());
    h[24..40].copy_from_slice(&k.dst.to_be_bytes());
    if k.proto == sluice_wire::flow::proto::ICMPV6 {
        h[40] = if reply { 129 } else { 128 };
        h[44..46].copy_from_slice(&k.sport.to_be_bytes());
    } else {
        h[40..42].copy_from_slice(&k.sport.to_be_bytes());
        h[42..44].copy_from_slice(&k.dport.to_be_bytes());
    }
    h
}

impl Worker {
    /// The worker that takes back saved connection `s` when the gateway
    /// that saved it had another number of workers: where this gateway's
    /// steering (`steer`: each interface's, by index) sends its packets,
    /// as a connection made now would be placed. The interface a packet
    /// from an address arrives on is the one this worker routes towards
    /// it. Each direction's packet is steered as
    /// [`sluice_io::steer::worker_for`] steers it on that interface; when
    /// both go to one worker, that one. Otherwise: with the destination
    /// translated and the source not (a port-changing DNAT), the reply's,
    /// where a new such connection is made and the original direction's
    /// packets are handed over; with neither translated (two interfaces
    /// of one role, which no steering places), the original direction's,
    /// where a new one would be made; with the source translated,
    /// [`RestoreError::Split`]: its external port must be in its worker's
    /// slice and its internal port's worker sees the packets out.
    pub fn home_of(
        &self,
        s: &SavedConn,
        steer: impl Fn(IfIndex) -> Option<Steer>,
    ) -> Result<u16, RestoreError> {
        home_of(
            s,
            |a| self.route(a).ok().map(|r| r.0),
            |a| self.v6.route(a).ok().map(|r| r.0),
            steer,
        )
    }

    /// The `ct timeout` policy slots this worker's connections (IPv4 and
    /// IPv6) follow, as a bitmap (`sluice_conntrack::Table::timeout_slots_held`):
    /// what the process's slot registry may not give another policy
    /// (`crate::ct_timeout::set_holders`).
    pub fn ct_timeout_slots_held(&self) -> [u64; 4] {
        let (a, b) = (
            self.ct.timeout_slots_held(),
            self.v6.ct.timeout_slots_held(),
        );
        [a[0] | b[0], a[1] | b[1], a[2] | b[2], a[3] | b[3]]
    }

    /// Every connection of this worker, to carry over a restart, as of
    /// `now` (ns, the clock [`Worker::process`] is given).
    pub fn carried_conns(&self, now: u64) -> Vec<SavedConn> {
        let now = instant(now);
        let mut out = Vec::with_capacity(self.ct.len() + self.v6.ct.len());
        for (_, e) in self.ct.iter() {
            let (orig, reply) = (e.orig(), e.reply());
            let nat = reply != orig.reversed();
            out.push(SavedConn::V4 {
                orig,
                reply,
                carried: e.carried(now),
                held: if nat {
                    self.nat.held_mappings(&orig, &reply)
                } else {
                    0
                },
            });
        }
        for (_, e) in self.v6.ct.iter() {
            out.push(SavedConn::V6 {
                orig: e.orig(),
                reply: e.reply(),
                carried: e.carried(now),
            });
        }
        out
    }

    /// Take back a connection a restart carried over, at `now` (ns) on
    /// this process's clock. Run before the worker sees traffic.
    pub fn restore(&mut self, now: u64, s: &SavedConn) -> Result<(), RestoreError> {
        let now = instant(now);
        match *s {
            SavedConn::V4 {
                orig,
                reply,
                carried,
                held,
            } => {
                if carried.expires_in_ms == 0 {
                    return Err(RestoreError::Expired);
                }
                let nat = reply != orig.reversed();
                let adj = [
                    self.adjacency_towards(reply.src),
                    self.adjacency_towards(orig.src),
                ];
                let [Some(out), Some(back)] = adj else {
                    return Err(RestoreError::NoRoute);
                };
                if nat {
                    let ifaces = &self.ifaces;
                    let masq = |a: u32| {
                        ifaces
                            .iter()
                            .any(|i| i.addrs.iter().any(|&(x, _)| u32::from(x) == a))
                    };
                    self.nat.restore_session(&orig, &reply, held, masq)?;
                }
                let (ip_delta, l4_delta) = sluice_nat::deltas(&orig, &reply.reversed());
                let info = FlowInfo {
                    adj: [out, back],
                    ip_delta,
                    l4_delta,
                };
                // The connection keeps its policy only if the table holds it
                // (see `Table::restore`).
                install_ct_timeout(&mut self.ct, carried.timeout_policy, orig.proto);
                let nat_t = &mut self.nat;
                let (q, adjs) = (&mut self.offload, &self.adj);
                let counted = self.counts_conns.then_some(&*self.policy);
                let mut overflow = false;
                let r = self.ct.restore(now, orig, reply, info, &carried, &mut |e| {
                    nat_t.release(&e.orig(), &e.reply());
                    overflow |= !offload_removals(q.as_mut(), e, adjs);
                    if let Some(p) = counted {
                        p.conn_closed(&conn4(&e.orig()));
                    }
                });
                if overflow {
                    self.clear_offload_marks();
                }
                if let Err(e) = r {
                    if nat {
                        // The session's NAT references go with it.
                        self.nat.release(&orig, &reply);
                    }
                    return Err(e.into());
                }
                if self.counts_conns {
                    self.policy.conn_confirmed(&conn4(&orig));
                }
            }
            SavedConn::V6 {
                orig,
                reply,
                carried,
            } => {
                if reply != orig.reversed() {
                    return Err(RestoreError::Translated);
                }
                if carried.expires_in_ms == 0 {
                    return Err(RestoreError::Expired);
                }
                let adj = [
                    self.adjacency_towards6(reply.src),
                    self.adjacency_towards6(orig.src),
                ];
                let [Some(out), Some(back)] = adj else {
                    return Err(RestoreError::NoRoute);
                };
                let info = FlowInfo6 { adj: [out, back] };
                install_ct_timeout(&mut self.v6.ct, carried.timeout_policy, orig.proto);
                let (q, adjs) = (&mut self.offload, &self.adj);
                let counted = self.counts_conns.then_some(&*self.policy);
                let mut overflow = false;
                let r = self
                    .v6
                    .ct
                    .restore(now, orig, reply, info, &carried, &mut |e| {
                        overflow |= !offload_removals(q.as_mut(), e, adjs);
                        if let Some(p) = counted {
                            p.conn_closed(&conn6(&e.orig()));
                        }
                    });
                if overflow {
                    self.clear_offload_marks();
                }
                r?;
                if self.counts_conns {
                    self.policy.conn_confirmed(&conn6(&orig));
                }
            }
        }
        self.counters.ct_created += 1;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_io::steer::SteerKey;
    use sluice_wire::build;
    use sluice_wire::flow::proto;

    /// The headers `home_of` steers by steer as the frames of the
    /// connection do: TCP, UDP, ICMP and ICMPv6 echoes, other protocols,
    /// each direction, under every key and several worker counts.
    #[test]
    fn synthesized_headers_steer_as_real_frames() {
        let mut b = [0u8; 256];
        let (m1, m2) = ([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2]);
        for (i, p) in [proto::TCP, proto::UDP, proto::ICMP, 47]
            .into_iter()
            .enumerate()
        {
            let i = i as u32;
            let k = FlowKey4 {
                src: 0x0a00_0002 + i * 77,
                dst: 0xc000_0250 ^ (i << 9),
                sport: 40_001 + 13 * i as u16,
                dport: if p == proto::ICMP {
                    40_001 + 13 * i as u16
                } else {
                    443
                },
                proto: p,
            };
            for reply in [false, true] {
                let k = if reply { k.reversed() } else { k };
                let n = match p {
                    proto::TCP => build::build_tcp4(&mut b, m1, m2, &k, 0x10, 1, 1, 0),
                    proto::UDP => build::build_udp4(&mut b, m1, m2, &k, 8),
                    proto::ICMP => build::build_icmp4_echo(&mut b, m1, m2, &k, 1, !reply, 8),
                    _ => {
                        let mut h = header4(&k, reply);
                        h[9] = p;
                        b[14..42].copy_from_slice(&h);
                        Ok(42)
                    }
                }
                .unwrap();
                let frame = &b[14..n];
                for key in [SteerKey::Source, SteerKey::Destination, SteerKey::Symmetric] {
                    for workers in [2, 3, 5] {
                        let st = Steer { key, workers };
                        assert_eq!(
                            worker_for(st, &header4(&k, reply)),
                            worker_for(st, frame),
                            "{k:?} {st:?}"
                        );
                    }
                }
            }
            let k6 = FlowKey6 {
                src: (0x2001_0db8_u128 << 96) + u128::from(i) * 0x1_0000_0001,
                dst: (0x2001_0db8_0001_u128 << 80) ^ u128::from(i << 7),
                sport: 50_000 + i as u16,
                dport: if p == proto::ICMP {
                    50_000 + i as u16
                } else {
                    53
                },
                proto: if p == proto::ICMP { proto::ICMPV6 } else { p },
            };
            for reply in [false, true] {
                let k = if reply { k6.reversed() } else { k6 };
                let n = match k.proto {
                    proto::TCP => build::build_tcp6(&mut b, m1, m2, &k, 0x10, 1, 1, 0),
                    proto::UDP => build::build_udp6(&mut b, m1, m2, &k, 8),
                    proto::ICMPV6 => build::build_icmp6_echo(&mut b, m1, m2, &k, 1, !reply, 8),
                    _ => continue,
                }
                .unwrap();
                let frame = &b[14..n];
                for key in [SteerKey::Source, SteerKey::Destination, SteerKey::Symmetric] {
                    let st = Steer { key, workers: 3 };
                    assert_eq!(
                        worker_for(st, &header6(&k, reply)),
                        worker_for(st, frame),
                        "{k:?} {st:?}"
                    );
                }
            }
        }
    }

    /// IPv6 connections go where both directions meet; a connection
    /// towards an address with no route is refused as the restore would.
    #[test]
    fn ipv6_meets_and_no_route_is_refused() {
        let c = Carried {
            state: sluice_conntrack::ProtoState::Tcp(sluice_conntrack::TcpState::Established),
            assured: true,
            seen_reply: true,
            flowtable: false,
            mark: 0,
            packets: 9,
            expires_in_ms: 1000,
            timeout_policy: 0,
        };
        let orig = FlowKey6 {
            src: 0x2001_0db8_u128 << 96 | 5,
            dst: 0x2001_0db8_0002_u128 << 80 | 9,
            sport: 40_000,
            dport: 443,
            proto: proto::TCP,
        };
        let s = SavedConn::V6 {
            orig,
            reply: orig.reversed(),
            carried: c,
        };
        let steer = |i: IfIndex| {
            Some(Steer {
                key: if i == 0 {
                    SteerKey::Source
                } else {
                    SteerKey::Destination
                },
                workers: 4,
            })
        };
        let want = worker_for(steer(0).unwrap(), &header6(&orig, false));
        let by_prefix = |a: u128| Some(IfIndex::from(a >> 80 & 0xffff != 0));
        assert_eq!(home_of(&s, |_| None, by_prefix, steer), Ok(want));
        assert_eq!(
            home_of(&s, |_| None, |_| None, steer),
            Err(RestoreError::NoRoute)
        );
    }
}
