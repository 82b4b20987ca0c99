//! One connection: both keys, the caller's payload, state and expiry.

use core::time::Duration;

use crate::proto::ProtoState;
use crate::time::{is_expired, remaining_ms, Instant};
use crate::{Dir, Key};

pub(crate) const F_LIVE: u8 = 1;
pub(crate) const F_ASSURED: u8 = 2;
pub(crate) const F_SEEN_REPLY: u8 = 4;
/// The original direction is offloaded (see [`Table::set_offloaded`](crate::Table::set_offloaded)).
pub(crate) const F_OFFLOAD_ORIG: u8 = 8;
/// The reply direction is offloaded.
pub(crate) const F_OFFLOAD_REPLY: u8 = 16;
pub(crate) const F_OFFLOAD: u8 = F_OFFLOAD_ORIG | F_OFFLOAD_REPLY;
/// The connection is in a flowtable (`flow add @ft`, see
/// [`Table::set_in_flowtable`](crate::Table::set_in_flowtable)).
pub(crate) const F_FLOWTABLE: u8 = 32;
/// The entry follows a timeout policy (its `timeout_policy` is not 0): the
/// established fast path, which refreshes from the table's own timers,
/// leaves it to the general one.
pub(crate) const F_TIMEOUT_POLICY: u8 = 64;

/// The state of a connection that a restart of the gateway carries over
/// ([`Entry::carried`], [`Table::restore`](crate::Table::restore)): all of
/// the entry but its keys, its payload (the engine's, rebuilt) and its
/// offload marks (the new process's offload starts empty).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Carried {
    /// Protocol state.
    pub state: ProtoState,
    /// Assured (never dropped early).
    pub assured: bool,
    /// A reply was seen.
    pub seen_reply: bool,
    /// In a flowtable.
    pub flowtable: bool,
    /// `ct mark`.
    pub mark: u32,
    /// Packets tracked.
    pub packets: u32,
    /// Milliseconds until it expires.
    pub expires_in_ms: u32,
    /// Its timeout policy's slot ([`Entry::timeout_policy`]; 0 for the
    /// table's own timeouts). A restore keeps it only if the table holds a
    /// policy in that slot.
    pub timeout_policy: u8,
}

/// One connection.
///
/// Layout (`repr(C)`, so the size is predictable). Both keys are stored
/// packed ([`Key::Packed`]: the key without its protocol, with no padding)
/// and the protocol once, since the two directions of a connection always
/// share it. For `FlowKey4` keys that is 12 + 12 (keys), then the payload,
/// 4 (expiry), 4 (mark), 4 (packets), 1 (state), 1 (timeout policy), 1
/// (flags) and 1 (protocol): 40 bytes plus the payload. The engine's payload (two 2-byte
/// adjacency indices and two 2-byte checksum deltas) or a `u64` makes 48.
/// With `FlowKey6` keys it is 88 bytes plus the payload.
///
/// Keys are immutable once inserted (the index points at them); only the
/// payload and the mark can be changed through [`Table::entry_mut`](crate::Table::entry_mut).
#[derive(Clone, Copy, Debug, Default)]
#[repr(C)]
pub struct Entry<K: Key, P> {
    /// Original and reply key, packed ([`Dir`] as index).
    pub(crate) keys: [K::Packed; 2],
    pub(crate) payload: P,
    /// Expiry tick (ms, wrapping; see [`crate::time`]).
    pub(crate) expiry: u32,
    /// `ct mark`; holds the next free index while the slot is free.
    pub(crate) mark: u32,
    pub(crate) packets: u32,
    /// [`ProtoState::pack`]ed.
    pub(crate) state: u8,
    /// The timeout policy slot ([`Table::set_timeout_policy`](crate::Table::set_timeout_policy));
    /// 0 is the table's own timeouts.
    pub(crate) timeout_policy: u8,
    pub(crate) flags: u8,
    /// IP protocol of both keys.
    pub(crate) proto: u8,
}

impl<K: Key, P: Copy + Default> Entry<K, P> {
    /// Key of the original direction (as the first packet was seen).
    #[inline]
    pub fn orig(&self) -> K {
        self.key(Dir::Original)
    }

    /// Key of the reply direction (after NAT: the translated tuple, reversed).
    #[inline]
    pub fn reply(&self) -> K {
        self.key(Dir::Reply)
    }

    /// Key of direction `dir`.
    #[inline]
    pub fn key(&self, dir: Dir) -> K {
        K::unpack(&self.keys[dir as usize], self.proto)
    }

    /// IP protocol of the connection (both keys have it).
    #[inline]
    pub fn proto(&self) -> u8 {
        self.proto
    }

    /// True if the key of direction `dir` is `k`, compared packed.
    #[inline]
    pub(crate) fn has_key(&self, dir: Dir, k: &K) -> bool {
        self.proto == k.proto() && self.keys[dir as usize] == k.pack()
    }

    /// The caller's payload (e.g. precomputed NAT rewrites).
    #[inline]
    pub fn payload(&self) -> &P {
        &self.payload
    }

    /// Mutable payload.
    #[inline]
    pub fn payload_mut(&mut self) -> &mut P {
        &mut self.payload
    }

    /// `ct mark`.
    #[inline]
    pub fn mark(&self) -> u32 {
        self.mark
    }

    /// Set `ct mark`.
    #[inline]
    pub fn set_mark(&mut self, mark: u32) {
        self.mark = mark;
    }

    /// Protocol state.
    #[inline]
    pub fn state(&self) -> ProtoState {
        ProtoState::unpack(self.state)
    }

    /// The timeout policy the connection follows: 0 for the table's own
    /// timeouts, else the slot a `ct timeout set` gave it
    /// ([`Table::apply_timeout_policy`](crate::Table::apply_timeout_policy)).
    #[inline]
    pub fn timeout_policy(&self) -> u8 {
        self.timeout_policy
    }

    /// Assured connections are never dropped early when the table is full.
    #[inline]
    pub fn is_assured(&self) -> bool {
        self.flags & F_ASSURED != 0
    }

    /// A packet was seen in the reply direction.
    #[inline]
    pub fn seen_reply(&self) -> bool {
        self.flags & F_SEEN_REPLY != 0
    }

    /// Whether the connection is in a flowtable (`flow add @ft`): its
    /// packets skip the filter chains while it stays established.
    #[inline]
    pub fn in_flowtable(&self) -> bool {
        self.flags & F_FLOWTABLE != 0
    }

    /// Whether direction `dir` is offloaded: its packets are forwarded by
    /// a lower layer (XDP) that the table does not see, so before expiring
    /// the entry the GC asks when that layer last used it
    /// ([`Table::gc_offloaded`](crate::Table::gc_offloaded)).
    #[inline]
    pub fn is_offloaded(&self, dir: Dir) -> bool {
        self.flags & offload_bit(dir) != 0
    }

    /// Packets tracked in both directions (wraps at 2^32).
    #[inline]
    pub fn packets(&self) -> u32 {
        self.packets
    }

    /// True once the entry's timeout has run out at `now`.
    #[inline]
    pub fn is_expired(&self, now: Instant) -> bool {
        is_expired(self.expiry, now)
    }

    /// Time left before the entry expires (zero if it has).
    pub fn expires_in(&self, now: Instant) -> Duration {
        Duration::from_millis(u64::from(remaining_ms(self.expiry, now)))
    }

    /// What a restart carries of the connection besides its keys and
    /// payload ([`Table::restore`](crate::Table::restore)).
    pub fn carried(&self, now: Instant) -> Carried {
        Carried {
            state: self.state(),
            assured: self.is_assured(),
            seen_reply: self.seen_reply(),
            flowtable: self.in_flowtable(),
            mark: self.mark,
            packets: self.packets,
            expires_in_ms: remaining_ms(self.expiry, now),
            timeout_policy: self.timeout_policy,
        }
    }

    #[inline]
    pub(crate) fn is_live(&self) -> bool {
        self.flags & F_LIVE != 0
    }
}

/// The flag of an offloaded direction.
#[inline]
pub(crate) fn offload_bit(dir: Dir) -> u8 {
    match dir {
        Dir::Original => F_OFFLOAD_ORIG,
        Dir::Reply => F_OFFLOAD_REPLY,
    }
}
