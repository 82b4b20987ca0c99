//! The process's conntrack timeout policies (nft's `ct timeout` objects),
//! by slot.
//!
//! A connection keeps its policy as a one-byte slot in its conntrack entry
//! ([`sluice_conntrack::Entry::timeout_policy`]). A slot must mean the same
//! policy for as long as any connection may hold it, across rule-set
//! generations and on every worker, so slots are handed out here, once per
//! distinct policy (protocol and timers) for the life of the process:
//! compiling a rule set ([`intern`], control plane) finds the slot of an
//! equal policy or takes a free one; a worker reads a slot ([`get`]) with
//! one atomic load, no lock, when a connection first gets it. A slot is
//! never given another policy, so a rule set that changes a policy's
//! timers leaves the connections that already follow it with the old
//! timers (as in the kernel, where a connection holds its timeout object).
//! There are [`SLOTS`] slots; a rule set that would need more is refused
//! ([`Full`]) until the gateway restarts.

use std::sync::{Mutex, OnceLock};

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

/// Policies by slot: slots 1 to `M - 1` (0 stays empty).
struct Slots<const M: usize> {
    table: [OnceLock<CtTimeout>; M],
    /// Serialises [`Slots::intern`] (lookups never take it).
    intern: Mutex<()>,
}

impl<const M: usize> Slots<M> {
    const fn new() -> Self {
        Self {
            table: [const { OnceLock::new() }; M],
            intern: Mutex::new(()),
        }
    }

    fn intern(&self, p: CtTimeout) -> Result<u8, Full> {
        let _guard = self.intern.lock().unwrap_or_else(|e| e.into_inner());
        for (slot, cell) in self.table.iter().enumerate().skip(1) {
            let slot = u8::try_from(slot).map_err(|_| Full)?;
            match cell.get() {
                Some(q) if *q == p => return Ok(slot),
                Some(_) => {}
                None => {
                    // Under the lock no one else sets it.
                    let _ = cell.set(p);
                    return Ok(slot);
                }
            }
        }
        Err(Full)
    }

    fn find(&self, p: &CtTimeout) -> Option<u8> {
        let slot = self.table.iter().skip(1).position(|c| c.get() == Some(p))?;
        u8::try_from(slot + 1).ok()
    }

    #[inline]
    fn get(&self, slot: u8) -> Option<&CtTimeout> {
        if slot == 0 {
            return None;
        }
        self.table.get(usize::from(slot))?.get()
    }
}

static SLOTS_TABLE: Slots<{ SLOTS + 1 }> = Slots::new();

/// Every slot holds a policy: the process has seen [`SLOTS`] distinct ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "more than {SLOTS} distinct ct timeout policies since the gateway started (each change \
     of a policy's timers takes a new one, the connections that follow the old one keep it); \
     restart the gateway to start again from none"
)]
pub struct Full;

/// The slot of policy `p` (1-255): the one it already has, or a free one.
pub fn intern(p: CtTimeout) -> Result<u8, Full> {
    SLOTS_TABLE.intern(p)
}

/// The slot policy `p` has, if it has one (nothing is taken).
pub fn find(p: &CtTimeout) -> Option<u8> {
    SLOTS_TABLE.find(p)
}

/// The policy in slot `slot`, if one was given it (never for 0).
#[inline]
pub fn get(slot: u8) -> Option<&'static CtTimeout> {
    SLOTS_TABLE.get(slot)
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::time::Duration;
    use sluice_conntrack::TimeoutKind;

    #[test]
    fn equal_policies_share_a_slot_and_slots_never_change() {
        let mut a = TimeoutPolicy::default();
        a.set(TimeoutKind::Udp, Duration::from_secs(7_654_321));
        let pa = CtTimeout {
            proto: 17,
            policy: a,
        };
        let s = intern(pa).unwrap();
        assert_ne!(s, 0);
        assert_eq!(intern(pa), Ok(s));
        assert_eq!(get(s), Some(&pa));
        // Another protocol or another timer: another slot.
        let pt = CtTimeout { proto: 6, ..pa };
        let st = intern(pt).unwrap();
        assert_ne!(st, s);
        let mut b = a;
        b.set(TimeoutKind::UdpStream, Duration::from_secs(1));
        let sb = intern(CtTimeout {
            proto: 17,
            policy: b,
        })
        .unwrap();
        assert!(sb != s && sb != st);
        assert_eq!(get(s), Some(&pa), "the first slot keeps its policy");
        assert_eq!(get(0), None);
    }

    #[test]
    fn a_full_table_refuses_new_policies_and_keeps_serving_its_own() {
        let t: Slots<4> = Slots::new();
        let p = |secs| {
            let mut q = TimeoutPolicy::default();
            q.set(TimeoutKind::Udp, Duration::from_secs(secs));
            CtTimeout {
                proto: 17,
                policy: q,
            }
        };
        assert_eq!(t.intern(p(1)), Ok(1));
        assert_eq!(t.intern(p(2)), Ok(2));
        assert_eq!(t.intern(p(3)), Ok(3));
        assert_eq!(t.intern(p(4)), Err(Full));
        assert_eq!(t.intern(p(2)), Ok(2));
        assert_eq!(t.find(&p(2)), Some(2));
        assert_eq!(t.find(&p(4)), None);
        assert_eq!(t.get(3), Some(&p(3)));
        assert_eq!(t.get(4), None);
        assert!(Full.to_string().contains("restart the gateway"));
    }
}
