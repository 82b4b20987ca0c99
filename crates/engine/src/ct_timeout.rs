//! The process's conntrack timeout policies (nft's `ct timeout` objects),
//! by slot.
//!
//! A connection keeps its policy as a one-byte slot in its conntrack entry
//! ([`sluice_conntrack::Entry::timeout_policy`]). A slot must mean the same
//! policy for as long as any connection may hold it, across rule-set
//! generations and on every worker, so slots are handed out here, once per
//! distinct policy (protocol and timers): compiling a rule set ([`intern`],
//! control plane) finds the slot of an equal policy or takes a free one,
//! and gets a [`Lease`] that the compiled rule set keeps; a worker reads a
//! slot ([`get`]) with one atomic load, no lock, when a connection first
//! gets it. A rule set that changes a policy's timers gives new
//! connections a new slot and leaves the connections that already follow
//! the old one with the old timers (as in the kernel, where a connection
//! holds its timeout object).
//!
//! There are [`SLOTS`] slots. When every slot holds a policy, [`intern`]
//! takes back the slots no rule set can give any more (no [`Lease`] of
//! theirs is alive: no compiled rule set, published, being built or still
//! in a worker's hands, names them) and that no connection follows, as the
//! process's [`set_holders`] hook reports from every worker's tables
//! (`sluice_conntrack::Table::timeout_slots_held`). Without the hook (no
//! gateway: `sluice check`, `trace`) nothing is taken back. A rule set that
//! needs a slot when none can be taken back is refused ([`Full`]).
//!
//! Why this is safe: a connection gets a slot only from a rule set that
//! names it, so once no lease of a slot is alive no new connection can get
//! it; the lease check and the reuse both happen under the interning lock,
//! and a dead lease never comes back (only [`intern`] makes one). The
//! holders are asked after that check, so a slot they report free stays
//! free until it is given the new policy. A worker's table keeps its own
//! copy of a slot's timers, which it replaces when the process's policy in
//! that slot differs (`install_ct_timeout`); no connection of that table
//! follows the slot then.

use std::sync::{Arc, Mutex, RwLock, Weak};

use arc_swap::ArcSwapOption;
use sluice_conntrack::TimeoutPolicy;

/// Slots for policies (1-255; 0 is the table's own timeouts).
pub const SLOTS: usize = 255;

/// A policy: the IP protocol it applies to (6 or 17), and its timers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CtTimeout {
    /// IP protocol: a connection of another protocol ignores the policy.
    pub proto: u8,
    /// The timers it sets.
    pub policy: TimeoutPolicy,
}

/// A slot as a compiled rule set holds it: while any clone is alive, the
/// slot keeps its policy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lease(Arc<u8>);

impl Lease {
    /// The slot (1-255).
    pub fn slot(&self) -> u8 {
        *self.0
    }
}

/// What a [`set_holders`] hook reports: the slots some connection
/// follows (bit `s % 64` of word `s / 64`), or `None` when it cannot tell
/// (a worker did not answer).
pub type Holders = dyn Fn() -> Option<[u64; 4]> + Send + Sync;

/// Policies by slot: slots 1 to `M - 1` (0 stays empty).
struct Slots<const M: usize> {
    table: [ArcSwapOption<CtTimeout>; M],
    /// The leases, by slot; serialises [`Slots::intern`] (lookups never
    /// take it).
    leases: Mutex<[Weak<u8>; M]>,
    holders: RwLock<Option<Box<Holders>>>,
}

impl<const M: usize> Slots<M> {
    const fn new() -> Self {
        Self {
            table: [const { ArcSwapOption::const_empty() }; M],
            leases: Mutex::new([const { Weak::new() }; M]),
            holders: RwLock::new(None),
        }
    }

    fn intern(&self, p: CtTimeout) -> Result<Lease, Full> {
        let mut leases = self.leases.lock().unwrap_or_else(|e| e.into_inner());
        let lease = |leases: &mut [Weak<u8>; M], slot: usize| -> Result<Lease, Full> {
            let s = u8::try_from(slot).map_err(|_| Full)?;
            let w = leases.get_mut(slot).ok_or(Full)?;
            if let Some(a) = w.upgrade() {
                return Ok(Lease(a));
            }
            let a = Arc::new(s);
            *w = Arc::downgrade(&a);
            Ok(Lease(a))
        };
        let mut free = None;
        for (slot, cell) in self.table.iter().enumerate().skip(1) {
            match cell.load().as_deref() {
                Some(q) if *q == p => return lease(&mut leases, slot),
                Some(_) => {}
                None => {
                    free.get_or_insert(slot);
                }
            }
        }
        let slot = match free {
            Some(s) => s,
            None => self.reclaim(&leases).ok_or(Full)?,
        };
        if let Some(cell) = self.table.get(slot) {
            cell.store(Some(Arc::new(p)));
        }
        lease(&mut leases, slot)
    }

    /// Empties every slot that no lease names and no connection follows
    /// (under the interning lock, `leases`); the first one emptied, if
    /// any.
    fn reclaim(&self, leases: &[Weak<u8>; M]) -> Option<usize> {
        let unleased: Vec<usize> = (1..M)
            .filter(|&s| leases.get(s).is_some_and(|w| w.strong_count() == 0))
            .collect();
        if unleased.is_empty() {
            return None;
        }
        let held = {
            let h = self.holders.read().unwrap_or_else(|e| e.into_inner());
            h.as_ref()?()?
        };
        let mut first = None;
        for s in unleased {
            if held.get(s / 64).is_some_and(|w| w & (1 << (s % 64)) != 0) {
                continue;
            }
            if let Some(cell) = self.table.get(s) {
                cell.store(None);
                first.get_or_insert(s);
            }
        }
        first
    }

    fn find(&self, p: &CtTimeout) -> Option<u8> {
        let slot = self
            .table
            .iter()
            .skip(1)
            .position(|c| c.load().as_deref() == Some(p))?;
        u8::try_from(slot + 1).ok()
    }

    #[inline]
    fn get(&self, slot: u8) -> Option<CtTimeout> {
        if slot == 0 {
            return None;
        }
        self.table
            .get(usize::from(slot))?
            .load()
            .as_deref()
            .copied()
    }

    fn set_holders(&self, f: Box<Holders>) {
        *self.holders.write().unwrap_or_else(|e| e.into_inner()) = Some(f);
    }
}

static SLOTS_TABLE: Slots<{ SLOTS + 1 }> = Slots::new();

/// Every slot holds a policy that a rule set still names or a connection
/// still follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "more than {SLOTS} distinct ct timeout policies in use: the running rule sets' and \
     those connections still follow (a change of a policy's timers takes a new one, the \
     connections that follow the old one keep it until they end)"
)]
pub struct Full;

/// The slot of policy `p` (1-255), leased: the one it already has, or a
/// free one (one taken back if need be, see the module documentation).
pub fn intern(p: CtTimeout) -> Result<Lease, Full> {
    SLOTS_TABLE.intern(p)
}

/// The slot policy `p` has, if it has one (nothing is taken).
pub fn find(p: &CtTimeout) -> Option<u8> {
    SLOTS_TABLE.find(p)
}

/// The policy in slot `slot`, if one is there (never for 0).
#[inline]
pub fn get(slot: u8) -> Option<CtTimeout> {
    SLOTS_TABLE.get(slot)
}

/// Sets the process's hook that reports the slots connections follow,
/// across every worker (the gateway sets it once its workers run). Until
/// it is set, no slot is taken back.
pub fn set_holders(f: impl Fn() -> Option<[u64; 4]> + Send + Sync + 'static) {
    SLOTS_TABLE.set_holders(Box::new(f));
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::time::Duration;
    use sluice_conntrack::TimeoutKind;
    use std::sync::atomic::{AtomicU64, Ordering};

    fn udp(secs: u64) -> CtTimeout {
        let mut q = TimeoutPolicy::default();
        q.set(TimeoutKind::Udp, Duration::from_secs(secs));
        CtTimeout {
            proto: 17,
            policy: q,
        }
    }

    #[test]
    fn equal_policies_share_a_slot_and_slots_never_change() {
        let mut a = TimeoutPolicy::default();
        a.set(TimeoutKind::Udp, Duration::from_secs(7_654_321));
        let pa = CtTimeout {
            proto: 17,
            policy: a,
        };
        let s = intern(pa).unwrap();
        assert_ne!(s.slot(), 0);
        assert_eq!(intern(pa).unwrap().slot(), s.slot());
        assert_eq!(get(s.slot()), Some(pa));
        // Another protocol or another timer: another slot.
        let pt = CtTimeout { proto: 6, ..pa };
        let st = intern(pt).unwrap();
        assert_ne!(st.slot(), s.slot());
        let mut b = a;
        b.set(TimeoutKind::UdpStream, Duration::from_secs(1));
        let sb = intern(CtTimeout {
            proto: 17,
            policy: b,
        })
        .unwrap();
        assert!(sb.slot() != s.slot() && sb.slot() != st.slot());
        assert_eq!(get(s.slot()), Some(pa), "the first slot keeps its policy");
        assert_eq!(get(0), None);
    }

    #[test]
    fn a_full_table_without_holders_refuses_new_policies_and_keeps_its_own() {
        let t: Slots<4> = Slots::new();
        let leases: Vec<Lease> = (1..=3).map(|n| t.intern(udp(n)).unwrap()).collect();
        assert_eq!(
            leases.iter().map(Lease::slot).collect::<Vec<_>>(),
            [1, 2, 3]
        );
        assert_eq!(t.intern(udp(4)).unwrap_err(), Full);
        assert_eq!(t.intern(udp(2)).unwrap().slot(), 2);
        drop(leases);
        // No lease, but no hook to tell which slots connections follow:
        // nothing is taken back.
        assert_eq!(t.intern(udp(4)).unwrap_err(), Full);
        assert_eq!(t.find(&udp(2)), Some(2));
        assert_eq!(t.find(&udp(4)), None);
        assert_eq!(t.get(3), Some(udp(3)));
        assert_eq!(t.get(4), None);
        assert!(Full.to_string().contains("in use"));
    }

    /// A slot is taken back only when no lease names it and no connection
    /// follows it; one that is still named or followed keeps its policy.
    #[test]
    fn slots_no_rule_set_names_and_no_connection_follows_are_reused() {
        static HELD: AtomicU64 = AtomicU64::new(0);
        let t: Slots<4> = Slots::new();
        t.set_holders(Box::new(|| Some([HELD.load(Ordering::SeqCst), 0, 0, 0])));
        let l1 = t.intern(udp(1)).unwrap();
        let l2 = t.intern(udp(2)).unwrap();
        let l3 = t.intern(udp(3)).unwrap();
        // Every slot leased: nothing to take back.
        assert_eq!(t.intern(udp(4)).unwrap_err(), Full);
        // Slot 2's rule set is gone, but a connection follows it.
        drop(l2);
        HELD.store(1 << 2, Ordering::SeqCst);
        assert_eq!(t.intern(udp(4)).unwrap_err(), Full);
        assert_eq!(t.get(2), Some(udp(2)));
        // The connection ended: slot 2 takes the new policy.
        HELD.store(0, Ordering::SeqCst);
        let l4 = t.intern(udp(4)).unwrap();
        assert_eq!(l4.slot(), 2);
        assert_eq!(t.get(2), Some(udp(4)));
        assert_eq!(t.find(&udp(2)), None);
        // Leased slots were left alone.
        assert_eq!((t.get(1), t.get(3)), (Some(udp(1)), Some(udp(3))));
        // A policy still in a slot whose lease died is found again, not
        // reclaimed, and leased anew.
        drop(l3);
        let again = t.intern(udp(3)).unwrap();
        assert_eq!(again.slot(), 3);
        // Holders that cannot tell: nothing is taken back.
        drop((l1, again));
        t.set_holders(Box::new(|| None));
        assert_eq!(t.intern(udp(5)).unwrap_err(), Full);
        // All unleased and unheld slots are emptied at once.
        t.set_holders(Box::new(|| Some([0; 4])));
        assert_eq!(t.intern(udp(5)).unwrap().slot(), 1);
        assert_eq!(t.get(3), None, "emptied with slot 1");
        assert_eq!(t.get(2), Some(udp(4)), "leased by l4");
        assert_eq!(t.intern(udp(6)).unwrap().slot(), 3);
    }
}
