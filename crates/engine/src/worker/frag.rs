//! IPv4 fragments through NAT without reassembly.
//!
//! Only the first fragment of a datagram carries the L4 header, so only it
//! can be looked up in the connection table and translated. Netfilter
//! reassembles every datagram before conntrack (`nf_defrag_ipv4`) and
//! fragments it again on output. Sluice forwards fragments as they are
//! (RFC 4787 REQ-14 asks a NAT to handle fragments, in or out of order, and
//! RFC 6888 REQ-11 the same of a CGN; this table does the in-order part).
//!
//! When the first fragment of a datagram (MF set, offset 0) is forwarded,
//! the worker remembers, under the datagram's identity as received (source,
//! destination, protocol, IP identification; RFC 791), the addresses it
//! was translated to and the adjacency it left by. The later fragments of
//! that datagram get the same address rewrite (the IP header only: the L4
//! checksum, which covers the whole datagram, was already adjusted in the
//! first fragment), the TTL decrement and the same next hop. A fragment
//! that arrives before its first fragment, or after the entry expired or
//! was overwritten, is dropped (`fragment`).
//!
//! With several workers, every fragment of a datagram is steered by its
//! addresses (`sluice_io::steer`), so all of them reach one worker. If its
//! ports name another worker, that worker owns the connection: the first
//! fragment is handed to it, and the table remembers the handoff so that
//! the later fragments follow it there, in order, over the same channel.
//!
//! The table is fixed-size and direct-mapped (a colliding datagram
//! overwrites the older entry), allocated when the worker is built: no
//! allocation and no unbounded state per packet. Entries expire after
//! [`FRAG_TIMEOUT_MS`], Linux's `ipfrag_time` default.

use sluice_conntrack::Instant;

use crate::route::AdjIndex;

/// Slots in a worker's fragment table (a power of two).
pub(crate) const FRAG_SLOTS: usize = 1024;

/// How long after its first fragment a datagram's later fragments are
/// still translated: 30 s, Linux's `net.ipv4.ipfrag_time`.
pub(crate) const FRAG_TIMEOUT_MS: u64 = 30_000;

/// A datagram as received: source, destination, protocol, identification.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct DatagramId {
    pub src: u32,
    pub dst: u32,
    pub proto: u8,
    pub ident: u16,
}

/// An IPv6 datagram as received: source, destination and the fragment
/// header's identification (RFC 8200 section 4.5).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct DatagramId6 {
    pub src: u128,
    pub dst: u128,
    pub ident: u32,
}

/// A key of a [`FragTable`].
pub(crate) trait FragKey: Copy + Default + Eq {
    /// 64 mixed bits of the key.
    fn mix(&self) -> u64;
}

impl FragKey for DatagramId {
    fn mix(&self) -> u64 {
        (u64::from(self.src) << 32 | u64::from(self.dst))
            ^ (u64::from(self.ident) << 8 | u64::from(self.proto))
                .wrapping_mul(0x9e37_79b9_7f4a_7c15)
    }
}

impl FragKey for DatagramId6 {
    fn mix(&self) -> u64 {
        let fold = |a: u128| (a as u64) ^ ((a >> 64) as u64).rotate_left(17);
        fold(self.src)
            ^ fold(self.dst).rotate_left(31)
            ^ u64::from(self.ident).wrapping_mul(0x9e37_79b9_7f4a_7c15)
    }
}

/// What happens to the later fragments of a datagram.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FragAction {
    /// Rewritten and forwarded here, like the first fragment.
    Rewrite(FragRewrite),
    /// Handed to this worker, like the first fragment (with several
    /// workers all fragments of a datagram are steered by its addresses to
    /// one worker, which hands them to the worker their ports name).
    Handoff(u16),
    /// Steered to this worker, like the first fragment
    /// ([`crate::Action::Steer`]).
    Steer(u16),
}

impl Default for FragAction {
    fn default() -> Self {
        FragAction::Handoff(0)
    }
}

/// The rewrite the later fragments of a datagram get.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct FragRewrite {
    /// Translated source address.
    pub src: u32,
    /// Translated destination address.
    pub dst: u32,
    /// The adjacency the first fragment left by.
    pub adj: AdjIndex,
}

#[derive(Clone, Copy, Debug, Default)]
struct Slot<K, A> {
    id: K,
    to: A,
    /// Expiry in ms; 0 = empty.
    expires_ms: u64,
}

/// The per-worker table of datagrams whose first fragment was forwarded:
/// IPv4 ([`DatagramId`] to [`FragAction`]) and IPv6 ([`DatagramId6`] to
/// the adjacency, no NAT).
#[derive(Debug)]
pub(crate) struct FragTable<K = DatagramId, A = FragAction> {
    slots: Vec<Slot<K, A>>,
}

impl<K: FragKey, A: Copy + Default> FragTable<K, A> {
    pub(crate) fn new() -> Self {
        Self {
            slots: vec![Slot::default(); FRAG_SLOTS],
        }
    }

    fn index(id: &K) -> usize {
        let h = id.mix().wrapping_mul(0xff51_afd7_ed55_8ccd);
        (h >> 54) as usize & (FRAG_SLOTS - 1)
    }

    /// The first fragment of `id` was forwarded as `to` at `now`.
    pub(crate) fn remember(&mut self, id: K, to: A, now: Instant) {
        if let Some(s) = self.slots.get_mut(Self::index(&id)) {
            *s = Slot {
                id,
                to,
                expires_ms: now.as_millis().saturating_add(FRAG_TIMEOUT_MS).max(1),
            };
        }
    }

    /// The rewrite for a later fragment of `id`, if its first fragment was
    /// forwarded and has not expired.
    pub(crate) fn find(&self, id: &K, now: Instant) -> Option<A> {
        let s = self.slots.get(Self::index(id))?;
        (s.expires_ms > now.as_millis() && s.id == *id).then_some(s.to)
    }

    /// Forget every datagram (on a flush of the connection table).
    pub(crate) fn clear(&mut self) {
        self.slots.fill(Slot::default());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remembers_until_expiry_and_matches_the_whole_identity() {
        let mut t: FragTable = FragTable::new();
        let id = DatagramId {
            src: 0x0a00_0002,
            dst: 0xcb00_7102,
            proto: 17,
            ident: 0x1234,
        };
        let to = FragAction::Rewrite(FragRewrite {
            src: 0xc633_6401,
            dst: 0xcb00_7102,
            adj: 3,
        });
        let t0 = Instant::from_secs(100);
        assert_eq!(t.find(&id, t0), None);
        t.remember(id, to, t0);
        assert_eq!(t.find(&id, t0), Some(to));
        assert_eq!(
            t.find(&id, Instant::from_millis(100_000 + FRAG_TIMEOUT_MS - 1)),
            Some(to)
        );
        assert_eq!(
            t.find(&id, Instant::from_millis(100_000 + FRAG_TIMEOUT_MS)),
            None
        );
        for other in [
            DatagramId {
                ident: 0x1235,
                ..id
            },
            DatagramId { proto: 6, ..id },
            DatagramId {
                src: 0x0a00_0003,
                ..id
            },
            DatagramId {
                dst: 0xcb00_7103,
                ..id
            },
        ] {
            assert_eq!(t.find(&other, t0), None, "{other:?}");
        }
        t.clear();
        assert_eq!(t.find(&id, t0), None);
    }
}
