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
use sluice_wire::flow::{FlowKey4, FlowKey6};

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
}

impl Worker {
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
