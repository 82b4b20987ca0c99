//! Connection counts for `ct count` in dynamic sets' elements: `add @s {
//! ip saddr ct count over 4 }` (the kernel's `nft_connlimit` on a set
//! element, and iptables `-m connlimit`).
//!
//! Semantics, as the kernel's `nf_conncount`:
//! - A packet that meets the statement counts its connection (by its
//!   original tuple, [`ConnId`]) in the element's list, unless it is
//!   there already; the statement then matches when the list holds at most
//!   N connections, or with `over` more than N.
//! - A connection stops counting when it ends: the engine removes it from
//!   its connection table, or a TCP connection reaches TIME_WAIT or CLOSE
//!   (`already_closed`). The engine reports both
//!   ([`sluice_engine::Policy::conn_closed`]).
//! - A connection whose first packet was counted but which was never
//!   created (a later rule dropped it) stops counting as soon as a packet
//!   of a later millisecond meets the list: the engine confirms the
//!   connections it creates ([`sluice_engine::Policy::conn_confirmed`]),
//!   and unconfirmed ones are dropped from the list then. The kernel keeps
//!   them for up to two jiffies the same way, since its conntrack entry is
//!   confirmed only after the hooks.
//! - Deleting an element (`delete @s`, `nft delete element`, `flush set`)
//!   deletes its count, and an element that expired and is added again
//!   starts from none.
//!
//! Concurrency: every worker and every generation derived by rule updates
//! shares one table behind one mutex. Only the packets that meet a `ct
//! count` statement, and the connections a policy with one creates and
//! ends, take the lock; a policy without `ct count` never does
//! ([`sluice_engine::Policy::counts_connections`]).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use hashbrown::HashMap;
use sluice_classify::ir::ConnId;

use crate::lower::SetKey;

/// An element's count: (dynamic set, key).
type ElemRef = (u32, SetKey);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Member {
    /// Counted at this ms, not yet created.
    Pending(u64),
    /// Created by the engine.
    Confirmed,
}

#[derive(Debug, Clone, Default)]
struct List {
    members: HashMap<ConnId, Member>,
    pending: usize,
}

#[derive(Debug, Clone, Default)]
struct Inner {
    lists: HashMap<ElemRef, List>,
    /// The lists each connection is in.
    of_conn: HashMap<ConnId, Vec<ElemRef>>,
}

/// The connection counts of a policy's dynamic-set elements.
#[derive(Debug, Default)]
pub(crate) struct ConnCounts {
    inner: Mutex<Inner>,
    /// Some list was ever made (lets deletes skip the lock).
    used: AtomicBool,
}

impl ConnCounts {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A poisoned table is still a valid table.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A copy (a trace's throw-away state).
    pub(crate) fn snapshot(&self) -> Self {
        ConnCounts {
            inner: Mutex::new(self.lock().clone()),
            used: AtomicBool::new(self.used.load(Ordering::Relaxed)),
        }
    }

    /// Counts `conn` in the list of element `key` of set `set` at `now_ms`;
    /// the connections the list holds afterwards. `exists`: the packet is
    /// not its connection's first (`ct state` other than new): the
    /// connection was created already and is counted only if it is in the
    /// list, unless `add_existing` (nft's `nft_connlimit` adds only
    /// connections not yet confirmed, iptables' `xt_connlimit` any).
    pub(crate) fn count(
        &self,
        set: u32,
        key: &SetKey,
        conn: &ConnId,
        now_ms: u64,
        exists: bool,
        add_existing: bool,
    ) -> usize {
        self.used.store(true, Ordering::Relaxed);
        let mut g = self.lock();
        let Inner { lists, of_conn } = &mut *g;
        let at = (set, *key);
        let list = lists.entry(at).or_default();
        if list.pending > 0 {
            // First packets of earlier milliseconds whose connections were
            // never created.
            let mut gone = Vec::new();
            list.members.retain(|c, m| match m {
                Member::Pending(ms) if *ms < now_ms && c != conn => {
                    gone.push(*c);
                    false
                }
                _ => true,
            });
            list.pending -= gone.len();
            for c in gone {
                unlink(of_conn, &c, &at);
            }
        }
        if (!exists || add_existing) && !list.members.contains_key(conn) {
            if exists {
                list.members.insert(*conn, Member::Confirmed);
            } else {
                list.members.insert(*conn, Member::Pending(now_ms));
                list.pending += 1;
            }
            of_conn.entry(*conn).or_default().push(at);
        }
        let n = list.members.len();
        if n == 0 {
            lists.remove(&at);
        }
        n
    }

    /// The engine created `conn`: it counts until it ends.
    pub(crate) fn confirm(&self, conn: &ConnId) {
        if !self.used.load(Ordering::Relaxed) {
            return;
        }
        let mut g = self.lock();
        let Inner { lists, of_conn } = &mut *g;
        for at in of_conn.get(conn).into_iter().flatten() {
            if let Some(list) = lists.get_mut(at) {
                if let Some(m) = list.members.get_mut(conn) {
                    if *m != Member::Confirmed {
                        *m = Member::Confirmed;
                        list.pending -= 1;
                    }
                }
            }
        }
    }

    /// `conn` ended: it leaves every list.
    pub(crate) fn close(&self, conn: &ConnId) {
        if !self.used.load(Ordering::Relaxed) {
            return;
        }
        let mut g = self.lock();
        let Inner { lists, of_conn } = &mut *g;
        for at in of_conn.remove(conn).into_iter().flatten() {
            if let Some(list) = lists.get_mut(&at) {
                if let Some(Member::Pending(_)) = list.members.remove(conn) {
                    list.pending -= 1;
                }
                if list.members.is_empty() {
                    lists.remove(&at);
                }
            }
        }
    }

    /// Element `key` of set `set` was deleted: its count goes with it.
    pub(crate) fn forget(&self, set: u32, key: &SetKey) {
        if self.used.load(Ordering::Relaxed) {
            let mut g = self.lock();
            let Inner { lists, of_conn } = &mut *g;
            if let Some(list) = lists.remove(&(set, *key)) {
                for c in list.members.keys() {
                    unlink(of_conn, c, &(set, *key));
                }
            }
        }
    }

    /// Every element of set `set` was deleted (`flush set`).
    pub(crate) fn forget_set(&self, set: u32) {
        if self.used.load(Ordering::Relaxed) {
            let mut g = self.lock();
            let Inner { lists, of_conn } = &mut *g;
            lists.retain(|at, _| at.0 != set);
            of_conn.retain(|_, ats| {
                ats.retain(|at| at.0 != set);
                !ats.is_empty()
            });
        }
    }

    /// The connections counted for element `key` of set `set`.
    pub(crate) fn counted(&self, set: u32, key: &SetKey) -> usize {
        if !self.used.load(Ordering::Relaxed) {
            return 0;
        }
        self.lock()
            .lists
            .get(&(set, *key))
            .map_or(0, |l| l.members.len())
    }
}

/// Takes list `at` off `c`'s lists.
fn unlink(of_conn: &mut HashMap<ConnId, Vec<ElemRef>>, c: &ConnId, at: &ElemRef) {
    if let Some(ats) = of_conn.get_mut(c) {
        ats.retain(|a| a != at);
        if ats.is_empty() {
            of_conn.remove(c);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lower::MAX_SET_KEY;

    fn conn(port: u16) -> ConnId {
        ConnId {
            saddr: 1,
            daddr: 2,
            sport: port,
            dport: 22,
            proto: 6,
        }
    }

    fn key(v: u128) -> SetKey {
        let mut k = [0; MAX_SET_KEY];
        k[0] = v;
        k
    }

    #[test]
    fn counts_each_connection_once_until_it_closes() {
        let c = ConnCounts::default();
        assert_eq!(c.count(0, &key(1), &conn(1), 10, false, false), 1);
        c.confirm(&conn(1));
        // The same connection again (a later packet, or a retransmission).
        assert_eq!(c.count(0, &key(1), &conn(1), 11, false, false), 1);
        assert_eq!(c.count(0, &key(1), &conn(2), 11, false, false), 2);
        c.confirm(&conn(2));
        // Another key counts apart.
        assert_eq!(c.count(0, &key(9), &conn(3), 11, false, false), 1);
        c.confirm(&conn(3));
        c.close(&conn(1));
        assert_eq!(c.counted(0, &key(1)), 1);
        assert_eq!(c.count(0, &key(1), &conn(4), 12, false, false), 2);
        c.close(&conn(2));
        c.close(&conn(4));
        assert_eq!(c.counted(0, &key(1)), 0);
        assert!(c.lock().lists.get(&(0, key(1))).is_none());
        assert!(c.lock().of_conn.get(&conn(2)).is_none());
    }

    #[test]
    fn a_connection_never_created_stops_counting_the_next_millisecond() {
        let c = ConnCounts::default();
        assert_eq!(c.count(0, &key(1), &conn(1), 10, false, false), 1);
        c.confirm(&conn(1));
        // Counted, then dropped by a later rule: never confirmed.
        assert_eq!(c.count(0, &key(1), &conn(2), 10, false, false), 2);
        // Same millisecond: the kernel's grace, it still counts.
        assert_eq!(c.count(0, &key(1), &conn(3), 10, false, false), 3);
        c.confirm(&conn(3));
        // A later millisecond: conn 2 is gone, conn 4 counts.
        assert_eq!(c.count(0, &key(1), &conn(4), 11, false, false), 3);
        assert!(c.lock().of_conn.get(&conn(2)).is_none());
        assert_eq!(c.lock().lists[&(0, key(1))].pending, 1);
        // A packet of an existing connection does not add it.
        assert_eq!(c.count(0, &key(1), &conn(5), 11, true, false), 3);
        assert_eq!(c.count(0, &key(1), &conn(6), 12, false, false), 3);
        assert_eq!(c.count(0, &key(7), &conn(6), 12, true, false), 0);
        assert!(c.lock().lists.get(&(0, key(7))).is_none());
        // iptables' count adds it, as created.
        assert_eq!(c.count(0, &key(7), &conn(6), 12, true, true), 1);
        assert_eq!(c.count(0, &key(7), &conn(8), 13, false, true), 2);
    }

    #[test]
    fn deleting_an_element_or_flushing_its_set_deletes_its_count() {
        let c = ConnCounts::default();
        c.count(0, &key(1), &conn(1), 1, false, false);
        c.count(0, &key(2), &conn(2), 1, false, false);
        c.count(1, &key(1), &conn(1), 1, false, false);
        c.forget(0, &key(1));
        assert_eq!(c.counted(0, &key(1)), 0);
        assert_eq!(c.counted(1, &key(1)), 1);
        assert_eq!(c.lock().of_conn[&conn(1)], vec![(1, key(1))]);
        c.forget_set(0);
        assert_eq!(c.counted(0, &key(2)), 0);
        assert!(c.lock().of_conn.get(&conn(2)).is_none());
        // Closing a connection no list holds is a no-op.
        c.close(&conn(7));
        c.confirm(&conn(7));
        assert_eq!(c.counted(1, &key(1)), 1);
    }
}
