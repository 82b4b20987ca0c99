//! `sluice-conntrack`: the connection table (one entry, two keys), protocol
//! state machines with netfilter semantics, timeouts, incremental GC and bulk
//! flush.
//!
//! # What it owns
//!
//! * [`Table`]: a slab of [`Entry`] values indexed by `u32` ([`EntryId`]),
//!   plus an open-addressing index that maps both the original and the reply
//!   key of every connection to its entry and [`Dir`]. After NAT the reply key
//!   is the translated one, so one lookup classifies a packet of either
//!   direction.
//! * The state machines ([`proto`]): TCP as `nf_conntrack_proto_tcp`, UDP,
//!   ICMP queries, generic; [`Timeouts`] defaulting to netfilter's.
//! * Time as an [`Instant`] passed in by the caller (ms); see [`time`].
//!
//! It does not own NAT: each entry carries an opaque `Copy` payload `P`
//! (e.g. the precomputed rewrite), and every entry the table drops on its own
//! (early drop, GC, filtered flush) is reported through a callback so the
//! owner of the payload can release what it refers to.
//!
//! # Invariants
//!
//! * A live entry is reachable by exactly its two keys (one if they are
//!   equal); removal takes both out of the index.
//! * Probing is bounded: a lookup reads at most 32 buckets (32 cache lines),
//!   almost always 1. The hash is keyed with a caller-supplied random seed.
//! * No stop-the-world work: the index is allocated once for the table's
//!   capacity (`max`, unless built larger so that `max` can be raised while
//!   running, [`Table::set_max`]) and never rehashed; GC is incremental
//!   with a budget; flush is a memset.
//! * When the table or a probe window is full, only unassured (or expired)
//!   entries are dropped early; assured ones are never evicted.
//! * No per-entry timers: expiry is a 32-bit ms tick in the entry, checked by
//!   [`Table::track`] and by GC.
//! * No allocation after [`Table::new`]; no panics on packet data.
//!
//! # Memory per connection (IPv4 keys)
//!
//! | part  | bytes | why |
//! |-------|-------|-----|
//! | entry | 40 + payload | 2 x 12 B packed keys (no protocol, no padding), expiry, mark, packets, state, timeout policy, flags, one protocol byte |
//! | index | 33.2  | two 8 B slots per connection in 64 B buckets of 7 slots, 55 % full at capacity |
//! | total | 81.2 with the engine's 8 B payload or a `u64` (48 B entry) | netfilter: 385 B + 8 B per bucket |
//!
//! The index is allocated for the capacity up front (calloc, so pages are
//! backed as they are first written, advised for huge pages); the slab is
//! reserved for the capacity and filled as connections arrive. (The figures
//! per connection are for a table built for its `max`; one built with room
//! to grow pays the index's 33.2 B for every connection of capacity.) 40 M connections take 3.25 GB
//! (3.0 GiB) with the engine's payload. With IPv6 keys an entry is 88 B
//! plus the payload.
//!
//! An entry stores its keys packed ([`Key::Packed`]) and the protocol once:
//! both directions of a connection have the same protocol (NAT never
//! changes it; [`Table::insert`] refuses keys that differ), so the 3 bytes
//! of padding and the protocol byte of each 16-byte `FlowKey4` are not
//! stored. Lookups compare packed keys; [`Entry::orig`] and
//! [`Entry::reply`] rebuild a key by value.
//!
//! 48-byte entries straddle two cache lines 1 time in 2;
//! [`Table::prefetch_entry`] prefetches both. Aligning entries to 64 B would
//! save that second line but cost 16 B per connection.
//!
//! # Fast-path use (per batch)
//!
//! ```
//! use sluice_conntrack::{Config, Dir, Instant, L4Event, Table, TcpFlags, Verdict};
//! use sluice_wire::flow::{proto, FlowKey4};
//!
//! let mut t: Table<FlowKey4, u64> = Table::new(Config::new(1024, 0x1234)).unwrap();
//! let now = Instant::from_secs(1);
//! let k = FlowKey4 { src: 1, dst: 2, sport: 1000, dport: 80, proto: proto::TCP };
//! let syn = L4Event::Tcp(TcpFlags(TcpFlags::SYN));
//! assert!(t.may_create(syn));
//! let id = t.insert(now, k, k.reversed(), 0, &mut |_| {}).unwrap();
//! assert_eq!(t.track(id, Dir::Original, now, syn).verdict, Verdict::Valid);
//!
//! // Later, a batch: hash, prefetch, look up, touch.
//! let batch = [k.reversed()];
//! let hashes: Vec<u64> = batch.iter().map(|k| t.hash(k)).collect();
//! hashes.iter().for_each(|&h| t.prefetch_bucket(h));
//! let (id, dir) = t.lookup(hashes[0], &batch[0]).unwrap();
//! assert_eq!(dir, Dir::Reply);
//! let synack = L4Event::Tcp(TcpFlags(TcpFlags::SYN | TcpFlags::ACK));
//! assert_eq!(t.track(id, dir, now, synack).verdict, Verdict::Valid);
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod entry;
mod index;
pub mod proto;
mod table;
pub mod time;

#[cfg(test)]
mod tests;

use sluice_wire::flow::{FlowKey4, FlowKey6};

pub use entry::{Carried, Entry};
pub use proto::{
    icmp_is_query_request, CtState, L4Event, ProtoState, TcpFlags, TcpState, Tracked, UdpState,
    Verdict,
};
pub use table::{
    first_packet_timeout, Config, ConfigError, InsertError, Table, Vacant, MAX_CONNECTIONS,
};
pub use time::{Instant, TimeoutKind, TimeoutPolicy, Timeouts};

/// A flow key the table can index.
pub trait Key: Copy + Eq + Default + core::fmt::Debug {
    /// The key without its protocol and without padding, as an [`Entry`]
    /// stores it (the entry keeps one protocol for both keys).
    type Packed: Copy + Eq + Default + core::fmt::Debug;
    /// The key as two words for hashing (need not be injective; keys are
    /// compared whole).
    fn words(&self) -> [u64; 2];
    /// IP protocol number.
    fn proto(&self) -> u8;
    /// Everything but the protocol. `unpack(&k.pack(), k.proto()) == k`.
    fn pack(&self) -> Self::Packed;
    /// The key back from [`pack`](Self::pack) and its protocol.
    fn unpack(p: &Self::Packed, proto: u8) -> Self;
}

impl Key for FlowKey4 {
    /// `[src, dst, sport << 16 | dport]`: 12 bytes instead of 16.
    type Packed = [u32; 3];
    #[inline]
    fn words(&self) -> [u64; 2] {
        FlowKey4::words(self)
    }
    #[inline]
    fn proto(&self) -> u8 {
        self.proto
    }
    #[inline]
    fn pack(&self) -> [u32; 3] {
        [
            self.src,
            self.dst,
            (u32::from(self.sport) << 16) | u32::from(self.dport),
        ]
    }
    #[inline]
    fn unpack(p: &[u32; 3], proto: u8) -> Self {
        FlowKey4 {
            src: p[0],
            dst: p[1],
            sport: (p[2] >> 16) as u16,
            dport: p[2] as u16,
            proto,
        }
    }
}

impl Key for FlowKey6 {
    /// Source and destination as 32-bit words (most significant first),
    /// then `sport << 16 | dport`: 36 bytes, 4-byte aligned, instead of 48.
    type Packed = [u32; 9];
    #[inline]
    fn words(&self) -> [u64; 2] {
        FlowKey6::words(self)
    }
    #[inline]
    fn proto(&self) -> u8 {
        self.proto
    }
    #[inline]
    fn pack(&self) -> [u32; 9] {
        let w = |a: u128, i: u32| (a >> (96 - 32 * i)) as u32;
        [
            w(self.src, 0),
            w(self.src, 1),
            w(self.src, 2),
            w(self.src, 3),
            w(self.dst, 0),
            w(self.dst, 1),
            w(self.dst, 2),
            w(self.dst, 3),
            (u32::from(self.sport) << 16) | u32::from(self.dport),
        ]
    }
    #[inline]
    fn unpack(p: &[u32; 9], proto: u8) -> Self {
        let a = |i: usize| {
            (u128::from(p[i]) << 96)
                | (u128::from(p[i + 1]) << 64)
                | (u128::from(p[i + 2]) << 32)
                | u128::from(p[i + 3])
        };
        FlowKey6 {
            src: a(0),
            dst: a(4),
            sport: (p[8] >> 16) as u16,
            dport: p[8] as u16,
            proto,
        }
    }
}

/// Direction of a packet relative to the connection's first packet.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
#[repr(u8)]
pub enum Dir {
    /// Same direction as the packet that created the entry.
    Original = 0,
    /// The other direction.
    Reply = 1,
}

impl Dir {
    /// The other direction.
    pub fn opposite(self) -> Self {
        match self {
            Self::Original => Self::Reply,
            Self::Reply => Self::Original,
        }
    }
}

/// Index of an entry in the table's slab. Valid until the entry is removed.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, PartialOrd, Ord)]
pub struct EntryId(pub(crate) u32);

impl EntryId {
    /// The slab index.
    #[inline]
    pub fn index(self) -> usize {
        self.0 as usize
    }

    /// The raw value (for storing in per-packet metadata).
    #[inline]
    pub fn raw(self) -> u32 {
        self.0
    }

    /// Rebuild from [`raw`](Self::raw).
    #[inline]
    pub fn from_raw(raw: u32) -> Self {
        Self(raw)
    }
}
