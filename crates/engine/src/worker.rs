//! One worker: the pipeline for a batch of frames.
//!
//! A worker owns its connection table, its slice of the NAT port space, its
//! adjacencies and its counters. Nothing on the packet path is shared with
//! another worker.
//!
//! # Handoff between workers
//!
//! With several workers, frames are steered to workers by port
//! (`sluice_io::steer`): on an inside interface by source port, on an
//! outside one by destination port, so a NAT reply reaches the worker that
//! allocated its external port. Two kinds of connection cannot be steered
//! that way, and the slow path passes their frames to the worker that owns
//! them over a queue the daemon keeps. Rules 1 and 3 send a frame where port
//! steering would have (`Action::Steer`: the receiver runs
//! [`Worker::process`], which may hand it on once more); rule 2 decides
//! the connection's final worker (`Action::Handoff`: the receiver runs
//! [`Worker::process_handed_off`], which never passes it on). So a frame
//! moves at most twice:
//!
//! 1. A packet to a NAT external endpoint (a pool address, or one of the
//!    gateway's own addresses, which masquerade uses) whose port belongs
//!    to another worker's slice (`owner_of(dport)`): hairpinning, where an
//!    inside host's packet to a mapping arrives at the worker of its own
//!    source port, and the replies of hairpinned connections. The owner of
//!    the mapping is the owner of the port.
//! 2. A new connection whose destination prerouting rewrites (DNAT, or
//!    hairpinning to a mapping) toward an inside interface: its replies
//!    come back from that inside host and are steered by their source
//!    port, the translated destination port, to `owner_of(that port)`. If
//!    that is another worker, the connection is created there instead, and
//!    every later packet of the original direction (steered here by its
//!    own port) misses here and is handed over again.
//!
//! 3. A first IPv4 fragment (which, like every fragment, is steered by its
//!    addresses so that all fragments of a datagram meet) whose ports name
//!    another worker, when it misses here and neither rule above applies:
//!    it goes to that worker. Whenever a first fragment is passed on, the
//!    fragment table ([`frag`]) sends its later fragments the same way.
//!
//! Prerouting runs on both workers for the first packet of such a
//! connection (its rules have no side effects beyond the verdict). An
//! original-direction packet of a handed-over connection pays a conntrack
//! miss and a prerouting evaluation on the receiving worker before it is
//! handed over.

use core::net::{Ipv4Addr, Ipv6Addr};
use std::collections::VecDeque;
use std::sync::Arc;

use hashbrown::HashMap;
use sluice_conntrack::{
    self as ct, icmp_is_query_request, Dir, EntryId, InsertError, L4Event, Table, TcpFlags,
    Timeouts,
};
use sluice_nat::{NatConfig, NatError, NatEvent, NatEventSink, Translation, WorkerNat};
use sluice_wire::checksum;
use sluice_wire::dissect::{
    dissect, dissect_plain4, dissect_plain6, Dissect, InnerKey, Net, Plain4, Plain6, L4,
};
use sluice_wire::flow::{proto, FlowKey4};
use sluice_wire::ip::Frag;

use crate::drop::{Counters, DropReason};
use crate::icmp_error::{self, IcmpError};
use crate::offload::{NoOffload, OffloadFlow, OffloadFlow6, OffloadOp, OffloadProbe, OffloadQueue};
use crate::policy::{
    ConnTuple, CtState, Hook, MssClamp, Policy, PolicyPacket, RejectWith, Verdict,
};
use crate::route::{AdjIndex, Adjacency, IfIndex, Route4, Route6, RouteTable4, RouteTable6};

mod frag;
mod restart;
mod untracked;
mod v6;
use crate::{Action, Frames, MAX_BATCH, PIPELINE};
pub use restart::{RestoreError, SavedConn};
pub use v6::FlowInfo6;

/// An interface as the engine sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Interface {
    /// Operator-facing name.
    pub name: String,
    /// MAC address.
    pub mac: [u8; 6],
    /// IPv4 addresses with prefix lengths.
    pub addrs: Vec<(Ipv4Addr, u8)>,
    /// IP MTU: the largest IPv4 packet (header included) this interface
    /// sends. A larger packet routed out of it is dropped, and with DF set
    /// answered with ICMP fragmentation needed (RFC 1191).
    pub mtu: u16,
}

impl Interface {
    /// The Ethernet MTU, used when nothing else is known.
    pub const DEFAULT_MTU: u16 = 1500;
    /// The smallest MTU an IPv4 interface may have (RFC 791: every module
    /// must be able to forward a 68-byte datagram without fragmenting).
    pub const MIN_MTU: u16 = 68;
}

/// Everything a worker needs to start.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// Interfaces, indexed by [`IfIndex`].
    pub interfaces: Vec<Interface>,
    /// Static routes (connected routes are derived from interface addresses).
    pub routes: Vec<Route4>,
    /// Static neighbours: IPv4 address to MAC.
    pub neighbors: Vec<(Ipv4Addr, [u8; 6])>,
    /// This worker's index.
    pub worker: u16,
    /// Number of workers.
    pub workers: u16,
    /// Maximum connections this worker tracks (changed while running by
    /// [`Worker::set_ct_max`], up to the capacity).
    pub ct_max: u64,
    /// Connections the IPv4 table is built for (its index is sized and
    /// backed for this many; see `sluice_conntrack::Config::capacity`):
    /// the largest `ct_max` [`Worker::set_ct_max`] takes. 0 (the default):
    /// `ct_max`.
    pub ct_capacity: u64,
    /// Back the IPv4 conntrack table with memory for `ct_max` connections
    /// when the worker is built, so no packet ever waits for a page fault
    /// (see `sluice_conntrack::Config::prefault`). Off by default.
    pub ct_prefault: bool,
    /// Back the conntrack tables' indexes (IPv4 and IPv6) when the worker
    /// is built (see `sluice_conntrack::Config::prefault_index`). Off by
    /// default; the gateway turns it on.
    pub ct_prefault_index: bool,
    /// The wall clock (ms since the epoch, UTC) minus the clock of the
    /// `now_ns` given to [`Worker::process`], in ms: the policy's time of
    /// day is the batch's time plus this. The engine reads no clock; the
    /// caller measures it once (both clocks are slewed alike by NTP, so it
    /// holds until the system clock is stepped). 0 in tests.
    pub wall_offset_ms: i64,
    /// Conntrack timeouts.
    pub timeouts: Timeouts,
    /// Hash seed (random in production; fixed in tests for repeatability).
    pub seed: u64,
    /// NAT pools and behaviour.
    pub nat: NatConfig,
    /// Capacity of the NAT event log ring (oldest events are overwritten
    /// and counted when the control plane does not drain it in time).
    pub nat_log_capacity: usize,
    /// ICMP errors this worker may originate per second, with a burst of
    /// [`ICMP_ERROR_BURST`] (RFC 1812 §4.3.2.8 rate limiting). 0 sends none.
    /// ICMPv4 and ICMPv6 errors share the budget.
    pub icmp_errors_per_sec: u32,
    /// IPv6 addresses with prefix lengths, per interface. Every interface
    /// with a MAC also has the EUI-64 link-local address derived from it
    /// (RFC 4291 appendix A), which need not be listed.
    pub addrs6: Vec<(IfIndex, Ipv6Addr, u8)>,
    /// Static IPv6 routes (connected routes are derived from `addrs6`).
    pub routes6: Vec<Route6>,
    /// Static IPv6 neighbours: (interface, address, MAC).
    pub neighbors6: Vec<(IfIndex, Ipv6Addr, [u8; 6])>,
    /// Maximum IPv6 connections this worker tracks (a table of its own,
    /// preallocated like the IPv4 one).
    pub ct6_max: u64,
    /// [`Self::ct_capacity`] for the IPv6 table (0: `ct6_max`).
    pub ct6_capacity: u64,
    /// Interfaces whose frames are steered to workers by their source port
    /// (the inside role, `sluice_io::steer::SteerKey::Source`): a connection
    /// DNATed toward one of them belongs to `owner_of` its translated
    /// destination port (see the module documentation). Only matters with
    /// several workers.
    pub steered_by_source: Vec<IfIndex>,
    /// Hand established IPv4 TCP/UDP connections to a lower layer
    /// ([`crate::offload`]) through a queue of this many requests; 0 (the
    /// default) offloads nothing.
    pub offload_queue: usize,
}

/// From this many connections of capacity (the table's size: `ct_capacity`,
/// or `ct_max` when that is 0) on, pass 1 of the pipeline
/// prefetches a group's index buckets in a tight loop of their own after
/// dissecting the group; below it, one prefetch per frame as each is
/// dissected.
///
/// Why: every index access of a large table misses the TLB, and on the
/// development VM (2 vCPU KVM guest, AMD EPYC, 2026-11-23) a prefetch
/// seems to hold retirement until its page walk is done. In the tight
/// loop a reorder buffer holds dozens of prefetches, so their walks
/// overlap; with about 50 instructions of dissection between two of them,
/// only a few do. Small tables have cheap walks, and there the tight loop
/// loses to the spread one. `sluice bench nat44 --connections
/// 1M,4M,10M,40M --frames 3M --compare-prefetch 12` and `--connections
/// 4M,6M,8M` (21:27-21:30 UTC; medians of 12 alternating rounds on one
/// table, per frame vs batched, unidirectional Mpps): 1 M 16.7 vs 14.1,
/// 4 M 15.9 vs 13.8 and 15.5 vs 14.9, 6 M 7.1 vs 10.0, 8 M 9.6 vs 12.2,
/// 10 M 10.5 vs 12.1, 40 M 8.3 vs 10.2. Issuing the entry prefetches of
/// pass 2 in a loop of their own as well did not add to that at 10 M or
/// 40 M and cost 40 % at 1 M; not done.
pub const BATCHED_PREFETCH_FROM: u64 = 5_000_000;

/// How pass 1 of the pipeline prefetches the index buckets of a group
/// (see [`BATCHED_PREFETCH_FROM`], which picks one by the table's size).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BucketPrefetch {
    /// One prefetch per frame, as the frame is dissected.
    PerFrame,
    /// The whole group dissected first, then its buckets prefetched in a
    /// loop of their own.
    Batched,
}

/// The gateway's own IPv4 addresses (with their interfaces) and the
/// directed broadcast addresses of `ifaces`' subnets.
#[allow(clippy::type_complexity)]
fn local_tables(ifaces: &[Interface]) -> (Vec<(u32, IfIndex)>, Vec<u32>) {
    let mut local4 = Vec::new();
    let mut bcast4 = Vec::new();
    for (i, ifc) in ifaces.iter().enumerate() {
        for &(a, len) in &ifc.addrs {
            local4.push((u32::from(a), i as IfIndex));
            if (1..=30).contains(&len) {
                bcast4.push(u32::from(a) | (u32::MAX >> len));
            }
        }
    }
    (local4, bcast4)
}

/// Burst size of the ICMP error rate limiter (Linux's `icmp_msgs_burst`).
pub const ICMP_ERROR_BURST: u32 = 50;

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            interfaces: Vec::new(),
            routes: Vec::new(),
            neighbors: Vec::new(),
            worker: 0,
            workers: 1,
            steered_by_source: Vec::new(),
            ct_max: 1 << 20,
            ct_capacity: 0,
            ct_prefault: false,
            ct_prefault_index: false,
            wall_offset_ms: 0,
            timeouts: Timeouts::default(),
            seed: 0x5eed,
            nat: NatConfig::default(),
            nat_log_capacity: 4096,
            icmp_errors_per_sec: 1000,
            addrs6: Vec::new(),
            routes6: Vec::new(),
            neighbors6: Vec::new(),
            ct6_max: 1 << 16,
            ct6_capacity: 0,
            offload_queue: 0,
        }
    }
}

impl EngineConfig {
    /// Bytes of memory a worker built with this configuration backs at
    /// start for its connection tables: the IPv4 and IPv6 indexes with
    /// [`Self::ct_prefault_index`], the IPv4 entries too with
    /// [`Self::ct_prefault`] (the gateway checks it against the memory
    /// available before it starts).
    pub fn ct_backed_at_start(&self) -> u64 {
        let clamp = |n: u64| u32::try_from(n).unwrap_or(u32::MAX);
        let (v4, v6) = (clamp(self.ct_capacity()), clamp(self.ct6_capacity().max(1)));
        let mut b = 0u64;
        if self.ct_prefault {
            b += Table::<FlowKey4, FlowInfo>::memory_bytes_for(v4) as u64;
        } else if self.ct_prefault_index {
            b += Table::<FlowKey4, FlowInfo>::index_bytes_for(v4) as u64;
        }
        if self.ct_prefault_index {
            b += Table::<sluice_wire::flow::FlowKey6, FlowInfo6>::index_bytes_for(v6) as u64;
        }
        b
    }

    /// Connections the IPv4 table is built for: [`Self::ct_capacity`], or
    /// [`Self::ct_max`] when that is 0.
    pub fn ct_capacity(&self) -> u64 {
        nonzero_or(self.ct_capacity, self.ct_max)
    }

    /// The same for the IPv6 table.
    pub fn ct6_capacity(&self) -> u64 {
        nonzero_or(self.ct6_capacity, self.ct6_max)
    }
}

/// `v`, or `or` when `v` is 0.
fn nonzero_or(v: u64, or: u64) -> u64 {
    if v == 0 {
        or
    } else {
        v
    }
}

/// Why a worker could not be built.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The connection table refused its configuration.
    #[error("conntrack: {0}")]
    Conntrack(#[from] ct::ConfigError),
    /// The NAT configuration is invalid.
    #[error("nat: {0}")]
    Nat(#[from] sluice_nat::ConfigError),
    /// More interfaces or neighbours than indices.
    #[error("too many {0} (at most 65535)")]
    TooMany(&'static str),
    /// `ct_max` is larger than the table supports.
    #[error("conntrack maximum {0} exceeds {max}", max = ct::MAX_CONNECTIONS)]
    CtMax(u64),
    /// A route points at an interface that does not exist.
    #[error("route {net}/{len} uses interface index {oif}, but only {count} interfaces exist")]
    RouteInterface {
        /// Network of the route.
        net: Ipv4Addr,
        /// Prefix length.
        len: u8,
        /// Bad index.
        oif: IfIndex,
        /// Interfaces configured.
        count: usize,
    },
    /// An IPv6 route or address names an interface that does not exist.
    #[error(
        "IPv6 {what} {net}/{len} uses interface index {oif}, but only {count} interfaces exist"
    )]
    Interface6 {
        /// "route", "address" or "neighbour".
        what: &'static str,
        /// Network or address.
        net: Ipv6Addr,
        /// Prefix length.
        len: u8,
        /// Bad index.
        oif: IfIndex,
        /// Interfaces configured.
        count: usize,
    },
}

/// Per-connection data cached in the conntrack entry: for each direction
/// (index 0 original, 1 reply) the adjacency, and the checksum deltas of
/// the original direction's rewrite (RFC 1624; IPv4 header and L4, without
/// the TTL decrement). 8 bytes, which makes an IPv4 entry 48 bytes.
///
/// The translated tuple is derived from the entry's keys (the other key,
/// reversed), and the reply direction's deltas from the original ones
/// ([`sluice_nat::reverse_delta`]: one's complement negation), so neither
/// is stored. Storing the original deltas rather than recomputing them
/// from the keys for every packet costs 4 bytes per connection and saves
/// a few dozen instructions per packet; a 48-byte entry also straddles two
/// cache lines less often (1 in 2) than a 44-byte one (2 in 3).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FlowInfo {
    adj: [AdjIndex; 2],
    ip_delta: u16,
    l4_delta: u16,
}

/// A NAT event with the wall-clock time (ms since the epoch, UTC) of the
/// batch, GC pass or flush that caused it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoggedEvent {
    /// ms since 1970-01-01 UTC ([`EngineConfig::wall_offset_ms`] applied).
    pub wall_ms: u64,
    /// The event.
    pub event: NatEvent,
}

/// A bounded ring of NAT events for the control plane to drain and log
/// (RFC 6888 REQ-12 logging). Pushing never allocates after construction.
/// With capacity 0 (no NAT log configured) events are only counted.
#[derive(Debug, Default)]
pub struct NatLog {
    ring: VecDeque<LoggedEvent>,
    cap: usize,
    /// The time stamped on events: the engine sets it once per batch, GC
    /// pass and flush (the engine reads no clock of its own).
    wall_ms: u64,
    /// Events overwritten before they were drained (or, with capacity 0,
    /// not kept at all).
    pub lost: u64,
}

impl NatLog {
    fn with_capacity(cap: usize) -> Self {
        Self {
            ring: VecDeque::with_capacity(cap),
            cap,
            wall_ms: 0,
            lost: 0,
        }
    }

    /// True when no event waits.
    pub fn is_empty(&self) -> bool {
        self.ring.is_empty()
    }

    /// Take every pending event, oldest first.
    pub fn drain(&mut self) -> impl Iterator<Item = LoggedEvent> + '_ {
        self.ring.drain(..)
    }
}

impl NatEventSink for NatLog {
    fn event(&mut self, e: &NatEvent) {
        if self.cap == 0 {
            self.lost += 1;
            return;
        }
        if self.ring.len() == self.cap {
            self.ring.pop_front();
            self.lost += 1;
        }
        self.ring.push_back(LoggedEvent {
            wall_ms: self.wall_ms,
            event: *e,
        });
    }

    /// Without a NAT log (capacity 0) nothing is kept: a flush frees the
    /// NAT's state in bulk (and counts no lost events for it).
    fn keeps_events(&self) -> bool {
        self.cap > 0
    }
}

/// RFC 1624 delta of decrementing the TTL by one: the word (TTL, protocol)
/// changes by -0x0100, i.e. `~m + m'` = 0xfeff.
const TTL_DELTA: u16 = 0xfeff;

/// The checksum deltas of a packet of direction `dir` of a connection:
/// `(IPv4 header delta with the TTL decrement, L4 delta)`, as
/// [`sluice_nat::apply_dissected`] takes them.
#[inline]
fn rewrite_deltas(info: &FlowInfo, dir: Dir) -> (u16, u16) {
    let (ipd, l4d) = match dir {
        Dir::Original => (info.ip_delta, info.l4_delta),
        Dir::Reply => (
            sluice_nat::reverse_delta(info.ip_delta),
            sluice_nat::reverse_delta(info.l4_delta),
        ),
    };
    (checksum::fold(u64::from(ipd) + u64::from(TTL_DELTA)), l4d)
}

/// What the fast path needs of one frame, extracted once in pass 1. Kept
/// small (24 bytes) so that a batch of them stays in L1; the slow path
/// dissects the frame again for everything else.
#[derive(Clone, Copy, Debug, Default)]
struct Meta {
    key: FlowKey4,
    l3: u16,
    l4: u16,
    ttl: u8,
    class: u8,
    tcp_flags: u8,
    icmp_type: u8,
}

/// [`Meta::class`]: the frame did not parse.
const C_BAD: u8 = 0;
/// IPv4 with a flow key the connection table can match (TCP, UDP, ICMP
/// query, other protocols).
const C_V4: u8 = 1;
/// Parsed, but not for the IPv4 fast path (ARP, IPv6, ICMP errors, later
/// fragments, ...).
const C_OTHER: u8 = 2;
/// Plain IPv6 (TCP, UDP, ICMPv6 echo without extension headers): its
/// [`Plain6`] is in the batch scratch.
const C_V6: u8 = 3;
/// A frame to another station's MAC address ([`DropReason::OtherHost`]).
const C_NOT_OURS: u8 = 4;
/// A frame tagged with a VLAN id other than 0 ([`DropReason::VlanTagged`]).
const C_VLAN: u8 = 5;

/// What [`untag`] found in a frame's link-layer header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Tagging {
    /// No VLAN tag: the frame is as the fast path expects it.
    Untagged,
    /// One or two priority tags (VLAN id 0) were removed; the frame is now
    /// this long.
    Stripped(usize),
    /// A tag with a VLAN id other than 0.
    Tagged,
}

/// 802.1Q and 802.1ad tag protocol identifiers.
const TPID_8021Q: [u8; 2] = [0x81, 0x00];
const TPID_8021AD: [u8; 2] = [0x88, 0xa8];

/// The kernel's receive rule for VLAN tags on a device without VLAN
/// sub-interfaces (`__netif_receive_skb_core` with `vlan_do_receive`
/// finding no VLAN device): a tag with VLAN id 0 (priority tagging) is
/// removed and the frame handled as untagged; any other VLAN id makes the
/// frame another host's. Removing a tag moves the frame's bytes after it
/// 4 bytes forward in `buf` (only priority-tagged frames pay that).
#[inline(always)]
fn untag(buf: &mut [u8], len: usize) -> Tagging {
    let mut len = len.min(buf.len());
    let mut stripped = false;
    let tagged = |b: &[u8]| {
        let tpid = b.get(12..14);
        tpid == Some(&TPID_8021Q[..]) || tpid == Some(&TPID_8021AD[..])
    };
    // At most two tags (802.1ad outer + 802.1Q inner) are looked at.
    for _ in 0..2 {
        let Some(b) = buf.get_mut(..len) else {
            return Tagging::Tagged;
        };
        if !tagged(b) {
            break;
        }
        // A tag and an EtherType after it, else the frame is cut short
        // (and no use to anyone).
        let vid = match b.get(14..18) {
            Some(t) => u16::from_be_bytes([t[0] & 0x0f, t[1]]),
            None => return Tagging::Tagged,
        };
        if vid != 0 {
            return Tagging::Tagged;
        }
        b.copy_within(16.., 12);
        len -= 4;
        stripped = true;
    }
    if buf.get(..len).is_some_and(tagged) {
        // A third tag: more than the kernel's receive path takes apart.
        return Tagging::Tagged;
    }
    if stripped {
        Tagging::Stripped(len)
    } else {
        Tagging::Untagged
    }
}

impl Meta {
    /// The common case, parsed by [`dissect_plain4`] (which agrees with
    /// [`dissect`] on every frame it accepts).
    #[inline]
    fn plain(p: &Plain4) -> Self {
        let (tcp_flags, icmp_type) = match p.key.proto {
            proto::TCP => (p.l4_byte, 0),
            proto::ICMP => (0, p.l4_byte),
            _ => (0, 0),
        };
        Meta {
            key: p.key,
            l3: Plain4::L3_OFF,
            l4: Plain4::L4_OFF,
            ttl: p.ttl,
            class: C_V4,
            tcp_flags,
            icmp_type,
        }
    }

    #[inline]
    fn of(d: &Dissect) -> Self {
        let mut m = Meta {
            l3: d.l3_off,
            l4: d.l4_off,
            class: C_OTHER,
            ..Meta::default()
        };
        if let Net::Ipv4 { key, ttl, .. } = d.net {
            m.key = key;
            m.ttl = ttl;
            match d.l4 {
                L4::Tcp { flags, .. } => {
                    m.tcp_flags = flags;
                    m.class = C_V4;
                }
                L4::IcmpQuery { ty, .. } => {
                    m.icmp_type = ty;
                    m.class = C_V4;
                }
                L4::Udp { .. } | L4::Other => m.class = C_V4,
                _ => {}
            }
        }
        m
    }

    #[inline]
    fn event(&self) -> L4Event {
        match self.key.proto {
            proto::TCP => L4Event::Tcp(TcpFlags(self.tcp_flags)),
            proto::UDP => L4Event::Udp,
            proto::ICMP => L4Event::Icmp {
                request: icmp_is_query_request(false, self.icmp_type),
            },
            _ => L4Event::Other,
        }
    }
}

/// Scratch state for one batch: per-frame facts, hashes and lookups.
#[derive(Default)]
struct Scratch {
    meta: Vec<Meta>,
    hash: Vec<u64>,
    hit: Vec<Option<(EntryId, Dir)>>,
    /// Frames dropped with `no-neighbor` whose missing next hop (egress
    /// interface, address) the slow path knows: (frame index, next hop).
    /// A list rather than a slot per frame, so that the frames that never
    /// miss a neighbour (all but a few) cost nothing. Capacity
    /// [`MAX_BATCH`], at most one entry per frame: never reallocates.
    missing: Vec<(u16, (IfIndex, u32))>,
    /// The same for IPv6 next hops.
    missing6: Vec<(u16, (IfIndex, u128))>,
    /// For a [`C_V6`] frame: what the IPv6 fast path needs.
    plain6: Vec<Plain6>,
}

/// One worker.
pub struct Worker {
    id: u16,
    ct: Table<FlowKey4, FlowInfo>,
    nat: WorkerNat<NatLog>,
    /// Pool changes a worker could not take ([`Policy::nat_pools`]; the
    /// control plane checks them first, so this stays 0).
    nat_pools_refused: u64,
    policy: Arc<dyn Policy>,
    /// `!policy.established_accepted()`: run the filter chains for every
    /// packet of an established connection.
    filter_established: bool,
    /// The policy has chains before conntrack ([`Policy::has_raw`]): every
    /// packet meets them first (`untracked`).
    raw: bool,
    /// Established IPv4 packets may take [`Self::hot4`]: the policy neither
    /// filters them (`filter_established`) nor has chains before conntrack
    /// (`raw`), and the worker does not offload. One flag, so that the
    /// per-packet test is one load.
    hot: bool,
    /// [`Policy::flowtables`] of the current policy (0: no flowtable).
    flowtable_gen: u64,
    /// A `flow add` statement ran for the packet being filtered.
    flow_hit: bool,
    /// The packet mark of the frame being decided: 0, or what the chains
    /// before conntrack left; the later hooks start from it.
    pkt_mark: u32,
    /// `policy.counts_connections()`: report created and ended connections
    /// to the policy (`ct count`).
    counts_conns: bool,
    /// Pass 1 issues its index-bucket prefetches in a loop of their own
    /// after dissecting the group, rather than one per frame as it goes
    /// (see [`BATCHED_PREFETCH_FROM`]).
    batched_prefetch: bool,
    ifaces: Vec<Interface>,
    local4: Vec<(u32, IfIndex)>,
    /// The subnet broadcast address of every interface prefix of /30 or
    /// shorter: like the limited broadcast, for the gateway itself (the
    /// kernel's `RTN_BROADCAST` routes), never forwarded.
    bcast4: Vec<u32>,
    /// Every interface's MAC address as the low 48 bits of a little-endian
    /// `u64` (see [`Self::l2_dest`]).
    l2_macs: Vec<u64>,
    /// Per interface, whether its link is down ([`Worker::set_link_up`]).
    link_down: Vec<bool>,
    /// Some interface's link is down: the one check every forwarded frame
    /// pays while all links are up.
    any_link_down: bool,
    /// After a route change ([`Worker::set_routes`]): the next IPv4 and
    /// IPv6 connection-table slots whose cached adjacencies are to be
    /// looked up again (a walk of `GC_BUDGET`-sized steps in
    /// [`Worker::gc_with`]); `None` when there is no walk.
    reroute: [Option<usize>; 2],
    routes: RouteTable4,
    adj: Vec<Adjacency>,
    neigh: HashMap<(IfIndex, u32), AdjIndex>,
    counters: Counters,
    scratch: Scratch,
    icmp: TokenBucket,
    /// The next hop the current frame's `no-neighbor` drop is waiting for.
    missing_nh: Option<(IfIndex, u32)>,
    /// IPv6 state: its own connection table, addresses, routes, neighbours.
    v6: v6::State,
    /// Datagrams whose first fragment was forwarded ([`frag`]).
    frags: frag::FragTable,
    /// Number of workers (handoff targets are `0..workers`).
    workers: u16,
    /// Per interface: steered by source port ([`EngineConfig::steered_by_source`]).
    by_source: Vec<bool>,
    /// The batch being processed was handed over by another worker: it is
    /// never handed off again.
    handed_in: bool,
    /// The current batch's time in ms (for the policy's `limit` buckets).
    now_ms: u64,
    /// The current batch's wall-clock time, ms since the epoch.
    wall_ms: u64,
    /// [`EngineConfig::wall_offset_ms`].
    wall_offset_ms: i64,
    /// Offload requests for the lower layer (`None`: offload is off).
    offload: Option<OffloadQueue>,
}

/// What [`Worker::too_big`] found.
enum TooBig {
    /// The IP total length fits the MTU after all.
    Fits,
    /// DF is clear: forward, fragmented on output.
    Fragment,
    /// Refused (DF set: the ICMP error, or a malformed header).
    Refused(Step),
}

/// A token bucket in thousandths of a token, refilled from the batch time
/// (the engine never reads a clock).
#[derive(Clone, Copy, Debug)]
struct TokenBucket {
    per_sec: u32,
    milli: u64,
    last_ms: u64,
}

impl TokenBucket {
    fn new(per_sec: u32) -> Self {
        Self {
            per_sec,
            milli: u64::from(ICMP_ERROR_BURST) * 1000,
            last_ms: 0,
        }
    }

    /// Take one token at `now_ms` if there is one.
    fn take(&mut self, now_ms: u64) -> bool {
        if self.per_sec == 0 {
            return false;
        }
        let cap = u64::from(ICMP_ERROR_BURST) * 1000;
        let dt = now_ms.saturating_sub(self.last_ms);
        self.last_ms = self.last_ms.max(now_ms);
        self.milli = self
            .milli
            .saturating_add(dt.saturating_mul(u64::from(self.per_sec)))
            .min(cap);
        if self.milli >= 1000 {
            self.milli -= 1000;
            true
        } else {
            false
        }
    }
}

impl core::fmt::Debug for Worker {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Worker")
            .field("id", &self.id)
            .field("connections", &self.ct.len())
            .field("counters", &self.counters)
            .finish_non_exhaustive()
    }
}

impl Worker {
    /// Gives a policy packet the batch's times (monotonic and wall
    /// clock).
    #[inline]
    fn stamp(&self, pp: &mut PolicyPacket) {
        pp.now_ms = self.now_ms;
        pp.wall_ms = self.wall_ms;
        pp.mark = self.pkt_mark;
    }

    /// Build a worker. All memory the fast path uses is allocated here.
    pub fn new(cfg: EngineConfig, policy: Arc<dyn Policy>) -> Result<Self, EngineError> {
        if cfg.interfaces.len() > usize::from(u16::MAX) {
            return Err(EngineError::TooMany("interfaces"));
        }
        let max = u32::try_from(cfg.ct_max).map_err(|_| EngineError::CtMax(cfg.ct_max))?;
        let cap = cfg.ct_capacity();
        let mut ctc = ct::Config::new(max, cfg.seed);
        ctc.capacity = u32::try_from(cap).map_err(|_| EngineError::CtMax(cap))?;
        ctc.timeouts = cfg.timeouts;
        ctc.prefault = cfg.ct_prefault;
        ctc.prefault_index = cfg.ct_prefault_index;
        let table = Table::new(ctc)?;
        let mut natc = cfg.nat.clone();
        natc.workers = cfg.workers.max(1);
        let nat = WorkerNat::new(
            &natc,
            cfg.worker,
            NatLog::with_capacity(cfg.nat_log_capacity),
        )?;

        let routes = route_table4(&cfg.interfaces, &cfg.routes)?;
        let (local4, bcast4) = local_tables(&cfg.interfaces);
        let v6 = v6::State::new(&cfg)?;
        let filter_established = !policy.established_accepted();
        let raw = policy.has_raw();
        let flowtable_gen = policy.flowtables();
        let counts_conns = policy.counts_connections();
        let by_source = (0..cfg.interfaces.len())
            .map(|i| cfg.steered_by_source.contains(&(i as IfIndex)))
            .collect();
        let mut w = Self {
            id: cfg.worker,
            ct: table,
            nat,
            nat_pools_refused: 0,
            policy,
            filter_established,
            raw,
            hot: !filter_established && !raw && cfg.offload_queue == 0,
            flowtable_gen,
            flow_hit: false,
            pkt_mark: 0,
            counts_conns,
            batched_prefetch: cap >= BATCHED_PREFETCH_FROM,
            l2_macs: cfg.interfaces.iter().map(|i| mac48(&i.mac)).collect(),
            link_down: vec![false; cfg.interfaces.len()],
            any_link_down: false,
            reroute: [None, None],
            ifaces: cfg.interfaces,
            local4,
            bcast4,
            routes,
            adj: Vec::new(),
            neigh: HashMap::new(),
            counters: Counters::default(),
            scratch: Scratch {
                meta: vec![Meta::default(); MAX_BATCH],
                hash: vec![0; MAX_BATCH],
                hit: vec![None; MAX_BATCH],
                missing: Vec::with_capacity(MAX_BATCH),
                missing6: Vec::with_capacity(MAX_BATCH),
                plain6: vec![Plain6::default(); MAX_BATCH],
            },
            icmp: TokenBucket::new(cfg.icmp_errors_per_sec),
            missing_nh: None,
            v6,
            frags: frag::FragTable::new(),
            workers: cfg.workers.max(1),
            by_source,
            handed_in: false,
            now_ms: 0,
            wall_ms: 0,
            wall_offset_ms: cfg.wall_offset_ms,
            offload: (cfg.offload_queue > 0).then(|| OffloadQueue::new(cfg.offload_queue)),
        };
        for (ip, mac) in cfg.neighbors {
            w.set_neighbor(ip, mac)?;
        }
        for (oif, ip, mac) in cfg.neighbors6 {
            w.set_neighbor6(oif, ip, mac)?;
        }
        Ok(w)
    }

    /// Learn or update a neighbour. Existing adjacencies are rewritten in
    /// place, so connections that cached them follow the change.
    pub fn set_neighbor(&mut self, ip: Ipv4Addr, mac: [u8; 6]) -> Result<AdjIndex, EngineError> {
        let a = u32::from(ip);
        let oif = self.routes.lookup(a).map(|r| r.oif).unwrap_or(0);
        let (src_mac, mtu) = self
            .ifaces
            .get(usize::from(oif))
            .map(|i| (i.mac, i.mtu))
            .unwrap_or((Default::default(), Interface::DEFAULT_MTU));
        let adj = Adjacency {
            oif,
            src_mac,
            dst_mac: mac,
            resolved: true,
            mtu,
        };
        if let Some(&i) = self.neigh.get(&(oif, a)) {
            let stale = self
                .adj
                .get(usize::from(i))
                .is_some_and(|old| old.resolved && *old != adj);
            if stale {
                // Offloaded directions carry the old MACs.
                self.offload_clear();
            }
            if let Some(slot) = self.adj.get_mut(usize::from(i)) {
                *slot = adj;
            }
            return Ok(i);
        }
        let i =
            AdjIndex::try_from(self.adj.len()).map_err(|_| EngineError::TooMany("neighbours"))?;
        self.adj.push(adj);
        self.neigh.insert((oif, a), i);
        Ok(i)
    }

    /// Forget neighbour `ip`'s MAC (a static neighbour taken out of the
    /// configuration): its adjacency stays allocated but unresolved, so
    /// packets that would use it are dropped as `no-neighbor`, naming it
    /// for the resolver, until it is learnt again. Offloaded directions are
    /// taken back (they carry the MAC). Whether it was known.
    pub fn clear_neighbor(&mut self, ip: Ipv4Addr) -> bool {
        let a = u32::from(ip);
        let oif = self.routes.lookup(a).map(|r| r.oif).unwrap_or(0);
        let Some(&i) = self.neigh.get(&(oif, a)) else {
            return false;
        };
        if let Some(slot) = self.adj.get_mut(usize::from(i)) {
            slot.resolved = false;
            slot.dst_mac = [0; 6];
        }
        self.offload_clear();
        true
    }

    /// Tell the worker whether interface `oif`'s link is up (the gateway
    /// watches its interfaces). While it is down, a frame routed out of it
    /// is dropped as [`DropReason::LinkDown`] instead of being handed to a
    /// port that cannot send it, and no connection through it is
    /// offloaded; going down takes every offloaded direction back (they
    /// return to the XDP program with the next packets once the link is
    /// up again).
    pub fn set_link_up(&mut self, oif: IfIndex, up: bool) {
        let Some(d) = self.link_down.get_mut(usize::from(oif)) else {
            return;
        };
        if *d == up {
            *d = !up;
            if !up {
                self.offload_clear();
            }
        }
        self.any_link_down = self.link_down.iter().any(|d| *d);
    }

    /// Interface `oif` was replaced by a new one (deleted and made again;
    /// the gateway re-opened its ports on it): take its MAC and MTU. Every
    /// adjacency out of it sends with the new source MAC and MTU (the
    /// neighbours' MACs are kept until they answer the gateway's probes),
    /// frames to the new MAC are taken as addressed to the gateway, the
    /// IPv6 link-local address follows the MAC, and offloaded directions
    /// are taken back (they carry the old MACs).
    pub fn relink(&mut self, oif: IfIndex, mac: [u8; 6], mtu: u16) {
        let Some(ifc) = self.ifaces.get_mut(usize::from(oif)) else {
            return;
        };
        let old = core::mem::replace(&mut ifc.mac, mac);
        ifc.mtu = mtu;
        if let Some(m) = self.l2_macs.get_mut(usize::from(oif)) {
            *m = mac48(&mac);
        }
        for a in self.adj.iter_mut().filter(|a| a.oif == oif) {
            a.src_mac = mac;
            a.mtu = mtu;
        }
        self.v6.relink(oif, old, mac);
        self.offload_clear();
    }

    /// Interface `oif`'s MAC as the worker uses it.
    pub fn interface_mac(&self, oif: IfIndex) -> Option<[u8; 6]> {
        self.ifaces.get(usize::from(oif)).map(|i| i.mac)
    }

    /// Replace the static routes (IPv4 and IPv6; the connected routes of
    /// the interfaces' addresses stay). New connections take the new
    /// routes at once; established ones are moved over by a walk of the
    /// connection tables in steps during [`Worker::gc_with`] (each
    /// direction's next hop looked up again; a next hop not known yet gets
    /// an unresolved adjacency, so its packets are dropped as
    /// `no-neighbor` and resolved like any other; a connection whose
    /// destination has no route any more keeps its path until it ends).
    /// Offloaded directions are taken back. Nothing changes on error.
    pub fn set_routes(&mut self, routes: &[Route4], routes6: &[Route6]) -> Result<(), EngineError> {
        let t = route_table4(&self.ifaces, routes)?;
        let t6 = self.v6.routes_with(self.ifaces.len(), routes6)?;
        self.routes = t;
        self.v6.set_routes(t6);
        self.offload_clear();
        self.reroute = [Some(0), Some(0)];
        Ok(())
    }

    /// Replace the interfaces' addresses (a reload's): `addrs[i]` are
    /// interface `i`'s IPv4 addresses (engine index; a missing entry keeps
    /// none), `addrs6` the IPv6 ones as in [`EngineConfig::addrs6`] (the
    /// link-local addresses stay), and the static routes with them, since
    /// the connected routes follow the addresses. The gateway answers for,
    /// and sends from, the new addresses at once (ARP and NDP are the
    /// caller's: its resolvers); masquerade takes an interface's new
    /// address for new connections, while established ones keep theirs
    /// until they end; established connections are moved to their next
    /// hops by the walk of [`Self::set_routes`]. Nothing changes on error.
    pub fn set_addrs(
        &mut self,
        addrs: &[Vec<(Ipv4Addr, u8)>],
        addrs6: &[(IfIndex, Ipv6Addr, u8)],
        routes: &[Route4],
        routes6: &[Route6],
    ) -> Result<(), EngineError> {
        let mut ifaces = self.ifaces.clone();
        for (i, ifc) in ifaces.iter_mut().enumerate() {
            ifc.addrs = addrs.get(i).cloned().unwrap_or_default();
        }
        let t = route_table4(&ifaces, routes)?;
        let v6 = v6::State::addrs_with(&ifaces, addrs6, routes6)?;
        (self.local4, self.bcast4) = local_tables(&ifaces);
        self.ifaces = ifaces;
        self.routes = t;
        self.v6.set_addrs(v6);
        self.offload_clear();
        self.reroute = [Some(0), Some(0)];
        Ok(())
    }

    /// Interface `oif`'s IPv4 addresses as the worker uses them.
    pub fn interface_addrs(&self, oif: IfIndex) -> &[(Ipv4Addr, u8)] {
        self.ifaces
            .get(usize::from(oif))
            .map_or(&[][..], |i| &i.addrs[..])
    }

    /// Replace the conntrack timeouts (IPv4 and IPv6), as a change of
    /// netfilter's timeout sysctls does: a connection keeps its current
    /// expiry until its next packet, which sets it by the new values.
    pub fn set_timeouts(&mut self, t: &ct::Timeouts) {
        self.ct.set_timeouts(t);
        self.v6.ct.set_timeouts(t);
    }

    /// Change the maximum connections of the IPv4 and IPv6 tables while
    /// running, as writing netfilter's `nf_conntrack_max` does: each
    /// between 1 and its table's capacity ([`EngineConfig::ct_capacity`]),
    /// both checked before either changes. Nothing is removed; a table
    /// holding more than its new maximum takes no new connection until
    /// connections end, except in place of one it drops early.
    pub fn set_ct_max(&mut self, v4: u64, v6: u64) -> Result<(), EngineError> {
        let v4 = u32::try_from(v4).map_err(|_| EngineError::CtMax(v4))?;
        let v6 = u32::try_from(v6).map_err(|_| EngineError::CtMax(v6))?;
        self.ct.check_max(v4)?;
        self.v6.ct.check_max(v6)?;
        // Both checked: neither fails.
        self.ct.set_max(v4)?;
        self.v6.ct.set_max(v6)?;
        Ok(())
    }

    /// Whether a walk after a route change is still under way.
    pub fn rerouting(&self) -> bool {
        self.reroute.iter().any(Option::is_some)
    }

    /// The adjacency of the next hop towards `dst` as routed now, made
    /// (unresolved) if the neighbour is not known yet; `None` without a
    /// route or when no more adjacencies fit.
    fn adjacency_towards(&mut self, dst: u32) -> Option<AdjIndex> {
        let (oif, nh) = self.route(dst).ok()?;
        if let Ok(a) = self.neighbor(oif, nh) {
            return Some(a);
        }
        let i = self.unresolved_adjacency(oif)?;
        self.neigh.insert((oif, nh), i);
        Some(i)
    }

    /// A new unresolved adjacency out of `oif` (for a next hop whose MAC is
    /// not known yet; the caller files it under its address). `None` when
    /// no more adjacencies fit.
    pub(super) fn unresolved_adjacency(&mut self, oif: IfIndex) -> Option<AdjIndex> {
        let i = AdjIndex::try_from(self.adj.len()).ok()?;
        let (src_mac, mtu) = self
            .ifaces
            .get(usize::from(oif))
            .map(|i| (i.mac, i.mtu))
            .unwrap_or((Default::default(), Interface::DEFAULT_MTU));
        self.adj.push(Adjacency {
            oif,
            src_mac,
            dst_mac: [0; 6],
            resolved: false,
            mtu,
        });
        Some(i)
    }

    /// Up to `budget` IPv4 connection-table slots of the walk after a
    /// route change.
    fn reroute_step(&mut self, budget: usize) {
        let Some(start) = self.reroute[0] else {
            return;
        };
        let end = start.saturating_add(budget).min(self.ct.slots());
        for raw in start..end {
            let id = EntryId::from_raw(raw as u32);
            let Some(e) = self.ct.get(id) else {
                continue;
            };
            // Packets of the original direction leave towards the reply's
            // source (the destination after any DNAT), replies towards the
            // original source.
            let (orig, reply) = (e.key(Dir::Original), e.key(Dir::Reply));
            let old = e.payload().adj;
            let new = [
                self.adjacency_towards(reply.src).unwrap_or(old[0]),
                self.adjacency_towards(orig.src).unwrap_or(old[1]),
            ];
            if new == old {
                continue;
            }
            let e = self.ct.entry(id);
            if e.is_offloaded(Dir::Original) || e.is_offloaded(Dir::Reply) {
                if !offload_removals(self.offload.as_mut(), e, &self.adj) {
                    self.clear_offload_marks();
                }
                self.ct.set_offloaded(id, [false, false]);
            }
            if let Some(e) = self.ct.get_mut(id) {
                e.payload_mut().adj = new;
            }
        }
        self.reroute[0] = (end < self.ct.slots()).then_some(end);
    }

    /// Whether interface `oif`'s link is up as far as the worker was told.
    pub fn link_up(&self, oif: IfIndex) -> bool {
        !self
            .link_down
            .get(usize::from(oif))
            .copied()
            .unwrap_or(false)
    }

    /// `a`, or [`DropReason::LinkDown`] when it sends out of a link that
    /// is down.
    #[inline(always)]
    fn egress_link(&self, a: Action) -> Action {
        if !self.any_link_down {
            return a;
        }
        match a {
            Action::Forward(o) | Action::Fragment(o, _) if !self.link_up(o) => {
                Action::Drop(DropReason::LinkDown)
            }
            _ => a,
        }
    }

    /// Replace the policy. Established connections keep their entries.
    pub fn set_policy(&mut self, p: Arc<dyn Policy>) {
        if let Some(pools) = p.nat_pools() {
            if pools != self.nat.config().pools.as_slice() {
                let next = sluice_nat::NatConfig {
                    pools: pools.to_vec(),
                    ..self.nat.config().clone()
                };
                if self.nat.set_pools(&next).is_err() {
                    self.nat_pools_refused += 1;
                }
            }
        }
        self.filter_established = !p.established_accepted();
        self.raw = p.has_raw();
        self.hot = !self.filter_established && !self.raw && self.offload.is_none();
        let gen = p.flowtables();
        if gen != self.flowtable_gen {
            // New flowtables (a replaced rule set): the connections in the
            // old ones leave them, as netfilter tears them down.
            if self.flowtable_gen != 0 {
                self.ct.clear_flowtable();
                self.v6.ct.clear_flowtable();
            }
            self.flowtable_gen = gen;
        }
        self.counts_conns = p.counts_connections();
        if self.filter_established || self.raw {
            // Established packets must run the filter chains again.
            self.offload_clear();
        }
        self.policy = p;
    }

    /// The offload requests to apply (`None` when offload is off); drain
    /// them after each batch and after [`Self::gc_with`].
    pub fn offload_ops(&mut self) -> Option<&mut OffloadQueue> {
        self.offload.as_mut()
    }

    /// The offloaded directions of connection `e` of this worker's table,
    /// as (interface their packets arrive on, their tuple): the keys the
    /// lower layer knows them by.
    pub fn offloaded_directions(
        &self,
        e: &ct::Entry<FlowKey4, FlowInfo>,
    ) -> impl Iterator<Item = (IfIndex, FlowKey4)> + '_ {
        let e = *e;
        [Dir::Original, Dir::Reply]
            .into_iter()
            .filter(move |d| e.is_offloaded(*d))
            .map(move |d| (offload_iif(&e, &self.adj, d), e.key(d)))
    }

    /// Take every offloaded direction back.
    fn offload_clear(&mut self) {
        if let Some(q) = &mut self.offload {
            q.push_must(OffloadOp::Clear);
            self.clear_offload_marks();
        }
    }

    /// Clear the offload marks of every connection, IPv4 and IPv6 (a
    /// `Clear` was queued: it takes back every direction of both tables).
    fn clear_offload_marks(&mut self) {
        self.ct.clear_offloaded();
        self.v6.ct.clear_offloaded();
    }

    /// How pass 1 prefetches index buckets: chosen from `ct_max` when the
    /// worker is built ([`BATCHED_PREFETCH_FROM`]).
    pub fn bucket_prefetch(&self) -> BucketPrefetch {
        if self.batched_prefetch {
            BucketPrefetch::Batched
        } else {
            BucketPrefetch::PerFrame
        }
    }

    /// Override the bucket prefetch schedule (what `sluice bench nat44
    /// --compare-prefetch` measures); it changes no decision, only the
    /// order of the prefetches.
    pub fn set_bucket_prefetch(&mut self, p: BucketPrefetch) {
        self.batched_prefetch = p == BucketPrefetch::Batched;
    }

    /// This worker's counters.
    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// The connection table (for listing and statistics).
    pub fn conntrack(&self) -> &Table<FlowKey4, FlowInfo> {
        &self.ct
    }

    /// For frame `i` of the last batch, dropped with
    /// [`DropReason::NoNeighbor`]: the next hop whose link-layer address is
    /// missing (egress interface, address), when known. After DNAT or
    /// hairpinning this is not where the frame's own destination leads, so
    /// the neighbour resolver needs it from here.
    pub fn missing_next_hop(&self, i: usize) -> Option<(IfIndex, Ipv4Addr)> {
        self.scratch
            .missing
            .iter()
            .find(|(j, _)| usize::from(*j) == i)
            .map(|&(_, (o, a))| (o, Ipv4Addr::from(a)))
    }

    /// The NAT state (for statistics and mapping listings).
    pub fn nat(&self) -> &WorkerNat<NatLog> {
        &self.nat
    }

    /// Pending NAT events.
    pub fn nat_log(&mut self) -> &mut NatLog {
        self.nat.sink_mut()
    }

    /// Set the engine's clock outside a batch (before [`Self::flush`], so
    /// that the NAT events of a flush carry its time; [`Self::process`] and
    /// [`Self::gc`] set it themselves).
    pub fn set_clock(&mut self, now_ns: u64) {
        self.now_ms = instant(now_ns).as_millis();
        self.wall_ms = self.now_ms.saturating_add_signed(self.wall_offset_ms);
        self.nat.sink_mut().wall_ms = self.wall_ms;
    }

    /// Remove every connection and NAT mapping in bulk; returns how many
    /// connections were removed.
    pub fn flush(&mut self) -> u64 {
        if let Some(q) = &mut self.offload {
            q.push_must(OffloadOp::Clear);
        }
        if self.counts_conns {
            // The counts are the policy's, shared by every worker: take out
            // this worker's connections one by one (only a policy with `ct
            // count` pays for it).
            for (_, e) in self.ct.iter() {
                self.policy.conn_closed(&conn4(&e.orig()));
            }
            for (_, e) in self.v6.ct.iter() {
                self.policy.conn_closed(&v6::conn6(&e.orig()));
            }
        }
        let n = self.ct.flush() + self.v6.ct.flush();
        self.nat.clear();
        self.frags.clear();
        self.v6.frags.clear();
        n as u64
    }

    /// One step of a walk over both connection tables (`conntrack list`,
    /// `count` or `flush` with a filter): looks at no more than `budget`
    /// slots from where `w` stopped, counts the connections `m4` / `m6`
    /// select (given each live entry and its id, which they may note) and,
    /// with `w.remove`, removes them as an expiry would (NAT mapping
    /// released, offloaded directions taken back, connection counts told).
    /// Returns whether the walk is done. Connections made behind the
    /// cursor while it runs are not seen (as with netfilter's `conntrack
    /// -D`); the walk never pauses the worker for more than `budget`
    /// slots.
    pub fn walk_step(
        &mut self,
        w: &mut Walk,
        budget: usize,
        m4: &mut dyn FnMut(EntryId, &ct::Entry<FlowKey4, FlowInfo>) -> bool,
        m6: &mut dyn FnMut(EntryId, &ct::Entry<sluice_wire::flow::FlowKey6, v6::FlowInfo6>) -> bool,
    ) -> bool {
        let mut left = budget;
        while left > 0 && w.next4 < self.ct.slots() {
            let end = w.next4.saturating_add(left).min(self.ct.slots());
            for raw in w.next4..end {
                let id = EntryId::from_raw(raw as u32);
                if self.ct.get(id).is_some_and(|e| m4(id, e)) {
                    w.matched += 1;
                    if w.remove {
                        self.remove(id);
                    }
                }
            }
            left -= end - w.next4;
            w.next4 = end;
        }
        while left > 0 && w.next6 < self.v6.ct.slots() {
            let end = w.next6.saturating_add(left).min(self.v6.ct.slots());
            for raw in w.next6..end {
                let id = EntryId::from_raw(raw as u32);
                if self.v6.ct.get(id).is_some_and(|e| m6(id, e)) {
                    w.matched += 1;
                    if w.remove {
                        self.remove6(id);
                    }
                }
            }
            left -= end - w.next6;
            w.next6 = end;
        }
        w.next4 >= self.ct.slots() && w.next6 >= self.v6.ct.slots()
    }

    /// Remove expired connections, looking at no more than `budget` entries.
    pub fn gc(&mut self, now_ns: u64, budget: usize) -> usize {
        self.gc_with(now_ns, budget, &mut NoOffload)
    }

    /// [`Self::gc`] for a worker with offload: before an offloaded
    /// connection expires, `probe` says when the lower layer last forwarded
    /// one of its packets; one used within its idle timeout stays.
    pub fn gc_with(&mut self, now_ns: u64, budget: usize, probe: &mut dyn OffloadProbe) -> usize {
        let now = instant(now_ns);
        self.set_clock(now_ns);
        self.reroute_step(budget);
        self.reroute6_step(budget);
        let nat = &mut self.nat;
        let (q, adj) = (&mut self.offload, &self.adj);
        let counted = self.counts_conns.then_some(&*self.policy);
        let mut overflow = false;
        let n = self.ct.gc_offloaded(
            now,
            budget,
            &mut |e| {
                last_use(
                    e,
                    |d| offload_iif(e, adj, d),
                    |i, k| probe.last_used_ns(i, k),
                )
            },
            &mut |e| {
                nat.release(&e.orig(), &e.reply());
                overflow |= !offload_removals(q.as_mut(), e, adj);
                if let Some(p) = counted {
                    p.conn_closed(&conn4(&e.orig()));
                }
            },
        );
        let mut overflow6 = false;
        let n6 = self.v6.ct.gc_offloaded(
            now,
            budget,
            &mut |e| {
                last_use(
                    e,
                    |d| offload_iif(e, adj, d),
                    |i, k| probe.last_used6_ns(i, k),
                )
            },
            &mut |e| {
                overflow6 |= !offload_removals(q.as_mut(), e, adj);
                if let Some(p) = counted {
                    p.conn_closed(&v6::conn6(&e.orig()));
                }
            },
        );
        if overflow || overflow6 {
            self.clear_offload_marks();
        }
        n + n6
    }

    /// Take the NAT switches of `settings` (a reload's `[nat]`:
    /// hairpinning, pooling, the per-subscriber limits; see
    /// `sluice_nat::NatConfig::pool_change`), the pools staying the
    /// policy's. Nothing changes on error.
    pub fn set_nat_settings(
        &mut self,
        settings: &NatConfig,
    ) -> Result<(), sluice_nat::ConfigError> {
        let cur = self.nat.config();
        let next = NatConfig {
            pools: cur.pools.clone(),
            workers: cur.workers,
            ..settings.clone()
        };
        self.nat.set_pools(&next).map(|_| ())
    }

    /// NAT pool changes this worker could not take (it kept its pools; the
    /// control plane checks every change first, so this stays 0).
    pub fn nat_pools_refused(&self) -> u64 {
        self.nat_pools_refused
    }

    /// Process a batch (at most [`MAX_BATCH`] frames; any beyond are dropped
    /// as malformed input from the caller). `now_ns` is a monotonic clock
    /// reading in nanoseconds, taken once per batch by the caller.
    pub fn process<F: Frames>(&mut self, now_ns: u64, frames: &mut F) {
        let now = instant(now_ns);
        self.now_ms = now.as_millis();
        self.wall_ms = self.now_ms.saturating_add_signed(self.wall_offset_ms);
        self.nat.sink_mut().wall_ms = self.wall_ms;
        let total = frames.count();
        let n = total.min(MAX_BATCH);
        self.counters.rx += total as u64;
        for i in n..total {
            frames.set_action(i, Action::Drop(DropReason::Malformed));
            self.counters.drop(DropReason::Malformed);
        }

        // The scratch arrays are moved out of `self` for the batch so that
        // pass 3 can borrow them while calling `&mut self` methods; moving a
        // `Vec` is a pointer swap and `Vec::new()` does not allocate.
        let mut sc = core::mem::take(&mut self.scratch);
        // The passes walk the scratch arrays with zipped iterators over
        // `..n` (no per-element bounds checks); they are `MAX_BATCH` long.
        let Scratch {
            meta,
            hash,
            hit,
            missing,
            missing6,
            plain6,
        } = &mut sc;
        let meta = meta.get_mut(..n).unwrap_or_default();
        let hash = hash.get_mut(..n).unwrap_or_default();
        let hit = hit.get_mut(..n).unwrap_or_default();
        missing.clear();
        missing6.clear();
        self.missing_nh = None;
        self.v6.missing_nh = None;
        let plain6 = plain6.get_mut(..n).unwrap_or_default();
        // The passes run over groups of [`PIPELINE`] frames, software
        // pipelined: while pass 3 acts on group k, the entries of group
        // k + 1 (prefetched by its pass 2) and the index buckets of group
        // k + 2 (prefetched by its pass 1) are on their way, so memory and
        // computation overlap instead of taking turns. A group is long
        // enough for its misses to overlap, short enough that what its
        // first passes bring into L1 (frame headers, index buckets,
        // entries) is still there in its pass 3. Pass 2 of a group runs
        // after pass 3 of the group before it, so its lookups see every
        // connection the earlier frames of the batch created or removed.
        let groups = n.div_ceil(PIPELINE);
        let span = |g: usize| g * PIPELINE..((g + 1) * PIPELINE).min(n);
        let mut done = 0;
        for k in 0..groups + 2 {
            if let Some(g) = k.checked_sub(2) {
                let r = span(g);
                done = self.pass3(
                    now,
                    frames,
                    r.start,
                    meta.get(r.clone()).unwrap_or_default(),
                    hash.get(r.clone()).unwrap_or_default(),
                    hit.get(r.clone()).unwrap_or_default(),
                    plain6.get(r.clone()).unwrap_or_default(),
                    missing,
                    missing6,
                );
            }
            if let Some(g) = k.checked_sub(1).filter(|&g| g < groups) {
                let r = span(g);
                self.pass2(
                    meta.get(r.clone()).unwrap_or_default(),
                    hash.get(r.clone()).unwrap_or_default(),
                    hit.get_mut(r.clone()).unwrap_or_default(),
                );
            }
            if k < groups {
                let r = span(k);
                self.pass1(
                    frames,
                    r.start,
                    meta.get_mut(r.clone()).unwrap_or_default(),
                    hash.get_mut(r.clone()).unwrap_or_default(),
                    plain6.get_mut(r.clone()).unwrap_or_default(),
                );
            }
        }
        // Only if the scratch arrays were shorter than the batch (they are
        // not): nothing was decided for these frames.
        for i in done..n {
            frames.set_action(i, Action::Drop(DropReason::Malformed));
            self.counters.drop(DropReason::Malformed);
        }
        self.scratch = sc;
    }

    /// Pass 1 over the frames `base..` of one group: dissect, hash,
    /// prefetch the index buckets.
    #[inline(always)]
    fn pass1<F: Frames>(
        &mut self,
        frames: &mut F,
        base: usize,
        meta: &mut [Meta],
        hash: &mut [u64],
        plain6: &mut [Plain6],
    ) {
        // Pass 1: dissect, hash, prefetch the index buckets.
        for (j, ((slot, h), p6)) in meta
            .iter_mut()
            .zip(hash.iter_mut())
            .zip(plain6.iter_mut())
            .enumerate()
        {
            let i = base + j;
            let iif = frames.iif(i);
            let (buf, mut len) = frames.buf_mut(i);
            // One compare for an untagged frame (the EtherType is on the
            // frame's first line, which the MAC check below reads anyway).
            if len > 12 && matches!(buf.get(12), Some(0x81 | 0x88)) {
                match untag(buf, len) {
                    Tagging::Untagged => {}
                    Tagging::Stripped(n) => {
                        len = n;
                        frames.set_len(i, n);
                    }
                    Tagging::Tagged => {
                        *slot = Meta {
                            class: C_VLAN,
                            ..Meta::default()
                        };
                        continue;
                    }
                }
            }
            let (buf, _) = frames.buf_mut(i);
            let frame = buf.get(..len).unwrap_or(&[]);
            // Only frames to the interface's own address take the fast
            // path: group frames (broadcast, multicast) go to the slow path,
            // which delivers them to the gateway or drops them
            // (`link-broadcast`); frames to other stations are dropped.
            match self.l2_dest(frame, iif) {
                L2_HOST => {}
                c => {
                    *slot = Meta {
                        class: if c == L2_GROUP { C_OTHER } else { C_NOT_OURS },
                        ..Meta::default()
                    };
                    continue;
                }
            }
            if let Some(p) = dissect_plain4(frame) {
                *slot = Meta::plain(&p);
                *h = self.ct.hash(&p.key);
                if !self.batched_prefetch {
                    self.ct.prefetch_bucket(*h);
                }
                continue;
            }
            let m = if frame.get(12..14) == Some(&[0x86, 0xdd][..]) {
                match dissect_plain6(frame) {
                    Some(p) => {
                        *p6 = p;
                        Meta {
                            class: C_V6,
                            ..Meta::default()
                        }
                    }
                    // Other IPv6 goes to the slow path, which dissects it
                    // (once).
                    _ => Meta {
                        class: C_OTHER,
                        ..Meta::default()
                    },
                }
            } else {
                match dissect(frame) {
                    Ok(d) => Meta::of(&d),
                    Err(_) => Meta::default(),
                }
            };
            *slot = m;
            if m.class == C_V4 {
                *h = self.ct.hash(&m.key);
            } else if m.class == C_V6 {
                *h = self.v6.ct.hash(&p6.key);
            }
            if !self.batched_prefetch {
                self.prefetch_bucket(m.class, *h);
            }
        }
        if self.batched_prefetch {
            for (m, &h) in meta.iter().zip(hash.iter()) {
                self.prefetch_bucket(m.class, h);
            }
        }
    }

    /// Start loading the index bucket of hash `h` of a frame of class
    /// `class`, if it has one.
    #[inline(always)]
    fn prefetch_bucket(&self, class: u8, h: u64) {
        if class == C_V4 {
            self.ct.prefetch_bucket(h);
        } else if class == C_V6 {
            self.v6.ct.prefetch_bucket(h);
        }
    }

    /// Pass 2 over one group: find candidates in the (now cached) buckets;
    /// prefetch entries. For an IPv4 miss (most likely a new connection),
    /// prefetch the NAT mapping slot source NAT would read, then (2b) the
    /// conntrack bucket of the reply key that mapping predicts.
    #[inline(always)]
    fn pass2(&mut self, meta: &[Meta], hash: &[u64], hit: &mut [Option<(EntryId, Dir)>]) {
        // Pass 2: find candidates in the (now cached) buckets; prefetch
        // entries. For an IPv4 miss (most likely a new connection), start
        // loading the NAT mapping slot source NAT would read.
        let mut misses4 = 0usize;
        for ((m, &h), hit) in meta.iter().zip(hash.iter()).zip(hit.iter_mut()) {
            *hit = None;
            if m.class == C_V4 {
                if let Some((id, dir)) = self.ct.candidate(h) {
                    self.ct.prefetch_entry(id);
                    *hit = Some((id, dir));
                } else {
                    self.nat.prefetch_outbound(&m.key);
                    misses4 += 1;
                }
            } else if m.class == C_V6 {
                if let Some((id, dir)) = self.v6.ct.candidate(h) {
                    self.v6.ct.prefetch_entry(id);
                    *hit = Some((id, dir));
                }
            }
        }
        // Pass 2b, for the misses: the reply key source NAT will most likely
        // give (from the mapping slot, cached by now); start loading its
        // conntrack bucket, which the insert reads. A wrong guess costs a
        // wasted prefetch only.
        if misses4 > 0 {
            for (m, hit) in meta.iter().zip(hit.iter()) {
                if m.class == C_V4 && hit.is_none() {
                    if let Some(r) = self.nat.predict_outbound_reply(&m.key) {
                        self.ct.prefetch_bucket(self.ct.hash(&r));
                    }
                }
            }
        }
    }

    /// Pass 3 over the frames `base..` of one group: act. Returns one past
    /// the last frame decided.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn pass3<F: Frames>(
        &mut self,
        now: ct::Instant,
        frames: &mut F,
        base: usize,
        meta: &[Meta],
        hash: &[u64],
        hit: &[Option<(EntryId, Dir)>],
        plain6: &[Plain6],
        missing: &mut Vec<(u16, (IfIndex, u32))>,
        missing6: &mut Vec<(u16, (IfIndex, u128))>,
    ) -> usize {
        let mut done = base;
        // Pass 3: act.
        let scratch = meta
            .iter()
            .zip(hash.iter())
            .zip(hit.iter())
            .zip(plain6.iter());
        for (j, (((m, &h), &cand), p6)) in scratch.enumerate() {
            let i = base + j;
            done = i + 1;
            let iif = frames.iif(i);
            let (buf, len) = frames.buf_mut(i);
            // The common case first, with nothing generic around it: a
            // packet of an established IPv4 connection that needs nothing
            // but its rewrite.
            if let (C_V4, Some((id, dir)), true) = (m.class, cand, self.hot) {
                if let Some(action) = self.hot4(now, buf, len, m, id, dir) {
                    let action = self.egress_link(action);
                    self.counters.fast_path += 1;
                    match action {
                        Action::Drop(r) => self.counters.drop(r),
                        _ => self.counters.tx += 1,
                    }
                    frames.set_action(i, action);
                    continue;
                }
            }
            let step = if m.class == C_V6 {
                self.one6(now, buf, len, iif, p6, h, cand)
            } else {
                self.one(now, buf, len, iif, m, h, cand)
            };
            // The slow path names a missing next hop only for frames it
            // drops with `no-neighbor` (or queues); taken at once so that
            // it never carries over to the next frame.
            if self.missing_nh.is_some() || self.v6.missing_nh.is_some() {
                let at = i as u16;
                if let Some(nh) = self.missing_nh.take() {
                    missing.push((at, nh));
                }
                if let Some(nh) = self.v6.missing_nh.take() {
                    missing6.push((at, nh));
                }
            }
            let action = match step {
                Step::Done(a) => self.egress_link(a),
                Step::Reply(newlen) => {
                    frames.set_len(i, newlen);
                    Action::Reply
                }
                Step::Error(newlen, r) => {
                    frames.set_len(i, newlen);
                    self.counters.drop(r);
                    self.counters.icmp_errors += 1;
                    frames.set_action(i, Action::Reply);
                    continue;
                }
                Step::Reset(newlen) => {
                    frames.set_len(i, newlen);
                    self.counters.drop(DropReason::PolicyReject);
                    self.counters.tcp_resets += 1;
                    frames.set_action(i, Action::Reply);
                    continue;
                }
            };
            match action {
                Action::Drop(r) => self.counters.drop(r),
                Action::Forward(_) => self.counters.tx += 1,
                Action::Reply => self.counters.local += 1,
                Action::Handoff(_) | Action::Steer(_) => self.counters.handed_off += 1,
                Action::Fragment(..) => {
                    self.counters.tx += 1;
                    self.counters.fragmented += 1;
                }
                Action::Pending => {}
            }
            frames.set_action(i, action);
        }
        done
    }

    /// [`Self::process`] for frames another worker handed over
    /// ([`Action::Handoff`]): they are decided here, never handed on.
    pub fn process_handed_off<F: Frames>(&mut self, now_ns: u64, frames: &mut F) {
        self.handed_in = true;
        self.process(now_ns, frames);
        self.handed_in = false;
    }

    /// Rule 1 of the handoff (module documentation): the worker owning a
    /// packet to a NAT external endpoint, when it is not this one.
    #[inline]
    fn external_owner(&self, key: &FlowKey4) -> Option<u16> {
        if self.workers <= 1 || self.handed_in {
            return None;
        }
        if !matches!(key.proto, proto::TCP | proto::UDP | proto::ICMP) {
            return None;
        }
        let w = sluice_nat::owner_of(key.dport, self.workers);
        (w != self.id && (self.nat.is_pool_addr(key.dst) || self.is_local(key.dst).is_some()))
            .then_some(w)
    }

    #[allow(clippy::too_many_arguments)]
    #[inline]
    fn one(
        &mut self,
        now: ct::Instant,
        buf: &mut [u8],
        len: usize,
        iif: IfIndex,
        m: &Meta,
        h: u64,
        cand: Option<(EntryId, Dir)>,
    ) -> Step {
        self.pkt_mark = 0;
        if self.raw && m.class != C_NOT_OURS && m.class != C_BAD && m.class != C_VLAN {
            if let Some(step) = self.raw_stage(now, buf, len, iif) {
                return step;
            }
        }
        if m.class == C_V4 {
            let hit = match cand {
                Some((id, dir)) if self.ct.verify(id, dir, &m.key) => Some((id, dir)),
                Some(_) => self.ct.lookup(h, &m.key),
                None => None,
            };
            if let Some((id, dir)) = hit {
                return self.fast4(now, buf, len, iif, m, id, dir);
            }
        } else if m.class == C_BAD {
            return Step::Done(Action::Drop(DropReason::Malformed));
        } else if m.class == C_NOT_OURS {
            return Step::Done(Action::Drop(DropReason::OtherHost));
        } else if m.class == C_VLAN {
            return Step::Done(Action::Drop(DropReason::VlanTagged));
        }
        self.slow(now, buf, len, iif)
    }

    /// A [`C_V6`] frame: the IPv6 fast path on a conntrack hit, else the
    /// slow path.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    fn one6(
        &mut self,
        now: ct::Instant,
        buf: &mut [u8],
        len: usize,
        iif: IfIndex,
        p: &Plain6,
        h: u64,
        cand: Option<(EntryId, Dir)>,
    ) -> Step {
        self.pkt_mark = 0;
        if self.raw {
            if let Some(step) = self.raw_stage(now, buf, len, iif) {
                return step;
            }
        }
        let hit = match cand {
            Some((id, dir)) if self.v6.ct.verify(id, dir, &p.key) => Some((id, dir)),
            Some(_) => self.v6.ct.lookup(h, &p.key),
            None => None,
        };
        if let Some((id, dir)) = hit {
            if let Some(s) = self.fast6(now, buf, len, iif, &v6::Pkt6::plain(p), id, dir) {
                return s;
            }
        }
        self.slow(now, buf, len, iif)
    }

    /// Everything that is not a conntrack hit: dissect again (the scratch
    /// record holds only what the fast path needs) and dispatch.
    fn slow(&mut self, now: ct::Instant, buf: &mut [u8], len: usize, iif: IfIndex) -> Step {
        let d = match buf
            .get(..len)
            .map_or(Err(sluice_wire::ParseError::Truncated), dissect)
        {
            Ok(d) => d,
            Err(_) => return Step::Done(Action::Drop(DropReason::Malformed)),
        };
        match d.net {
            Net::Ipv4 { key, ttl, .. } => self.slow4(now, buf, len, iif, &d, &key, ttl),
            Net::Arp { op, spa, tpa } => self.arp(buf, len, iif, op, spa, tpa),
            Net::Ipv6 {
                key,
                hop_limit,
                payload_len,
                ..
            } => self.slow6(now, buf, len, iif, &d, &key, hop_limit, payload_len),
            Net::Other(_) => Step::Done(Action::Drop(DropReason::UnsupportedProtocol)),
        }
    }

    /// The fast path's common case, decided in one visit to the entry
    /// ([`Table::track_established`]): a packet that conntrack only counts
    /// and refreshes (or, the first after a UDP reply, makes an assured
    /// stream), with a TTL to spare, not a first fragment, within
    /// the MTU of a resolved next hop, on a worker that neither filters
    /// established traffic nor offloads. `Some(Forward)` (or, for a frame
    /// the rewrite refuses, `Some(Drop)`, counted like [`Self::fast4`]
    /// counts it); `None`, with nothing changed, for everything else,
    /// which [`Self::one`] then decides.
    #[inline(always)]
    fn hot4(
        &mut self,
        now: ct::Instant,
        buf: &mut [u8],
        len: usize,
        m: &Meta,
        id: EntryId,
        dir: Dir,
    ) -> Option<Action> {
        let l3 = usize::from(m.l3);
        if m.ttl <= 1 || !matches!(buf.get(l3 + 6), Some(b) if b & 0x3f == 0) {
            return None;
        }
        let ip_len = len.saturating_sub(l3);
        let adjs = &self.adj;
        let (to, deltas, a) = self
            .ct
            .track_established(id, dir, &m.key, now, m.event(), |e| {
                let info = e.payload();
                let a = *adjs.get(usize::from(*info.adj.get(dir_index(dir))?))?;
                if !a.resolved || ip_len > usize::from(a.mtu) {
                    return None;
                }
                Some((
                    e.key(dir.opposite()).reversed(),
                    rewrite_deltas(info, dir),
                    a,
                ))
            })?;
        if sluice_nat::apply_dissected(buf, l3, usize::from(m.l4), &to, deltas, true).is_err() {
            return Some(Action::Drop(DropReason::RewriteFailed));
        }
        a.write_macs(buf);
        Some(Action::Forward(a.oif))
    }

    /// The fast path: a packet of a known connection.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    fn fast4(
        &mut self,
        now: ct::Instant,
        buf: &mut [u8],
        len: usize,
        iif: IfIndex,
        m: &Meta,
        id: EntryId,
        dir: Dir,
    ) -> Step {
        let tracked = self.ct.track(id, dir, now, m.event());
        match tracked.verdict {
            ct::Verdict::Invalid => return Step::Done(Action::Drop(DropReason::CtInvalid)),
            ct::Verdict::Reopen | ct::Verdict::Expired => {
                self.remove(id);
                return self.slow(now, buf, len, iif);
            }
            ct::Verdict::Valid | ct::Verdict::Ignored | ct::Verdict::Close => {}
        }
        if self.counts_conns && closed_state(tracked.state) {
            self.policy.conn_closed(&conn4(&self.ct.entry(id).orig()));
        }
        let mut mss = MssClamp::default();
        // A connection in a flowtable skips the filter chains while it
        // stays up; a TCP FIN or RST (or a state past ESTABLISHED) takes it
        // out and meets them, as netfilter's flowtable hands such packets
        // back to the classic path.
        let flowing = self.flowtable_gen != 0 && self.ct.entry(id).in_flowtable();
        let in_flow = flowing && flow_continues(tracked.state, m.tcp_flags);
        if flowing && !in_flow {
            self.ct.set_in_flowtable(id, false);
        }
        let filter = self.filter_established && !in_flow;
        self.flow_hit = false;
        if filter {
            match self.filter_established4(buf, len, iif, m, id, dir, Hook::Prerouting) {
                Ok(c) => mss = mss.and(c),
                Err(v) => return self.refuse4(now, buf, len, m.l3, m.l4, iif, v),
            }
        }
        if m.ttl <= 1 {
            return self.icmp_error(now, buf, len, usize::from(m.l3), iif, None);
        }
        if filter {
            for hook in [Hook::Forward, Hook::Postrouting] {
                match self.filter_established4(buf, len, iif, m, id, dir, hook) {
                    Ok(c) => mss = mss.and(c),
                    Err(v) => return self.refuse4(now, buf, len, m.l3, m.l4, iif, v),
                }
            }
            // `flow add @ft` ran: the connection joins the flowtable if
            // netfilter's `nft_flow_offload` would take it (TCP
            // established without FIN or RST, or UDP).
            if self.flow_hit
                && matches!(m.key.proto, proto::TCP | proto::UDP)
                && flow_continues(tracked.state, m.tcp_flags)
            {
                self.ct.set_in_flowtable(id, true);
            }
        }
        self.counters.fast_path += 1;
        let e = self.ct.entry(id);
        let to = e.key(dir.opposite()).reversed();
        let info = e.payload();
        let deltas = rewrite_deltas(info, dir);
        let adj = info.adj.get(dir_index(dir)).copied().unwrap_or(0);
        if !mss.is_none() && m.key.proto == proto::TCP {
            // The routes of the two directions: their adjacencies' MTUs.
            let back = info
                .adj
                .get(dir_index(dir.opposite()))
                .copied()
                .unwrap_or(0);
            let rt = self.adj_mtu(adj).min(self.adj_mtu(back));
            clamp_mss(buf, len, usize::from(m.l4), mss, rt, 40);
        }
        let step = self.emit(now, buf, len, iif, m.l3, m.l4, &to, deltas, adj);
        if tracked.verdict == ct::Verdict::Close {
            self.remove(id);
        } else if self.offload.is_some()
            && !self.raw
            && matches!(step, Step::Done(Action::Forward(_)))
        {
            self.offload_after(id, dir, iif, tracked.state);
        }
        step
    }

    /// The filter chains of `hook` for a packet of an established
    /// connection (only when the policy does not accept all of them up
    /// front, see [`Policy::established_accepted`]). The packet is seen the
    /// way netfilter's hooks see it: as received at prerouting; with the
    /// destination already translated back (reply) or forward (original,
    /// DNAT) and the source not yet translated at forward and postrouting.
    /// The `tcp option maxseg size set` statements met, or the reason to
    /// drop the packet.
    #[allow(clippy::too_many_arguments)]
    #[cold]
    #[inline(never)]
    fn filter_established4(
        &mut self,
        buf: &[u8],
        len: usize,
        iif: IfIndex,
        m: &Meta,
        id: EntryId,
        dir: Dir,
        hook: Hook,
    ) -> Result<MssClamp, Verdict> {
        let e = self.ct.entry(id);
        let (orig, reply) = (e.orig(), e.reply());
        let di = dir_index(dir);
        let oif = e
            .payload()
            .adj
            .get(di)
            .and_then(|a| self.adj.get(usize::from(*a)))
            .map(|a| a.oif);
        let mut status = ct_status(e.seen_reply(), e.is_assured());
        // IPS_SRC_NAT, IPS_DST_NAT.
        if reply.dst != orig.src || reply.dport != orig.sport {
            status |= 0x10;
        }
        if reply.src != orig.dst || reply.sport != orig.dport {
            status |= 0x20;
        }
        let ct_mark = e.mark();
        let (src, sport, dst, dport) = match (hook, dir) {
            (Hook::Prerouting, _) => (m.key.src, m.key.sport, m.key.dst, m.key.dport),
            (_, Dir::Original) => (orig.src, orig.sport, reply.src, reply.sport),
            (_, Dir::Reply) => (reply.src, reply.sport, orig.src, orig.sport),
        };
        let l3 = usize::from(m.l3);
        let mut pp = PolicyPacket {
            iif,
            oif: if hook == Hook::Prerouting { None } else { oif },
            family: 4,
            src: u128::from(src),
            dst: u128::from(dst),
            proto: m.key.proto,
            sport,
            dport,
            tcp_flags: m.tcp_flags,
            // The code from the packet (the type is the dissector's).
            icmp: (
                m.icmp_type,
                if m.key.proto == proto::ICMP {
                    buf.get(usize::from(m.l4) + 1).copied().unwrap_or(0)
                } else {
                    0
                },
            ),
            ct: CtState::Established,
            ct_mark,
            mark: self.pkt_mark,
            ct_status: status,
            len: read16(buf, l3 + 2).unwrap_or(len.saturating_sub(l3) as u16),
            // Decremented before the forward hook (`ip_forward`).
            ttl: if hook == Hook::Prerouting {
                m.ttl
            } else {
                m.ttl.saturating_sub(1)
            },
            df: buf.get(l3 + 6).is_some_and(|b| b & 0x40 != 0),
            tos: buf.get(l3 + 1).copied().unwrap_or(0),
            pkttype: 0,
            daddr_type: 0,
            saddr_type: 0,
            ether: frame_macs(buf),
            ct_dir: u8::from(dir == Dir::Reply),
            rpf: (true, true),
            now_ms: self.now_ms,
            wall_ms: self.wall_ms,
            ct_reply: conn4(&reply),
            conn: conn4(&orig),
        };
        // `src` is the received packet's source in every hook (the
        // original tuple's for the original direction, the reply's for
        // replies), so the reverse path is the received packet's.
        self.addr_types4(&mut pp);
        let dec = self.policy.decide(hook, &pp);
        // The next hook starts from the mark this one left.
        self.pkt_mark = dec.mark;
        self.flow_hit |= dec.flow_add;
        if dec.ct_mark != ct_mark {
            // `ct mark set` on an established packet: the connection keeps
            // it.
            self.ct.entry_mut(id).set_mark(dec.ct_mark);
        }
        match dec.verdict {
            Verdict::Accept => Ok(dec.mss),
            v => Err(v),
        }
    }

    /// Rewrite the packet to `to`, decrement the TTL and set the MACs of
    /// adjacency `adj`; a packet larger than the egress MTU is refused
    /// before it is touched.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    fn emit(
        &mut self,
        now: ct::Instant,
        buf: &mut [u8],
        len: usize,
        iif: IfIndex,
        l3: u16,
        l4: u16,
        to: &FlowKey4,
        deltas: (u16, u16),
        adj: AdjIndex,
    ) -> Step {
        let Some(&a) = self.adj.get(usize::from(adj)) else {
            return Step::Done(Action::Drop(DropReason::NoNeighbor));
        };
        if !a.resolved {
            self.missing_nh = self.next_hop_of(adj);
            return Step::Done(Action::Drop(DropReason::NoNeighbor));
        }
        let l3 = usize::from(l3);
        // The frame length bounds the IP total length (it only adds
        // Ethernet padding, which no frame near an MTU carries). A first
        // fragment has MF (0x20 in the byte at l3 + 6); later fragments
        // never get here.
        if len.saturating_sub(l3) > usize::from(a.mtu)
            || buf.get(l3 + 6).is_some_and(|b| b & 0x3f != 0)
        {
            return self.emit_unusual(now, buf, len, iif, l3, l4, to, deltas, adj);
        }
        // `l3` / `l4` come from `dissect` (or `dissect_plain4`) of a packet
        // whose key has `to.proto` and that is not a later fragment: what
        // `apply_dissected` requires. The deltas include the TTL decrement.
        if sluice_nat::apply_dissected(buf, l3, usize::from(l4), to, deltas, true).is_err() {
            return Step::Done(Action::Drop(DropReason::RewriteFailed));
        }
        a.write_macs(buf);
        Step::Done(Action::Forward(a.oif))
    }

    /// [`Self::emit`] for a packet above the egress MTU or a first
    /// fragment: fragmentation needed (DF) or on-output fragmentation
    /// ([`Action::Fragment`]), and the fragment table.
    #[allow(clippy::too_many_arguments)]
    #[cold]
    #[inline(never)]
    fn emit_unusual(
        &mut self,
        now: ct::Instant,
        buf: &mut [u8],
        len: usize,
        iif: IfIndex,
        l3: usize,
        l4: u16,
        to: &FlowKey4,
        deltas: (u16, u16),
        adj: AdjIndex,
    ) -> Step {
        let Some(&a) = self.adj.get(usize::from(adj)) else {
            return Step::Done(Action::Drop(DropReason::NoNeighbor));
        };
        let mut split = false;
        if len.saturating_sub(l3) > usize::from(a.mtu) {
            match self.too_big(now, buf, len, l3, iif, a.mtu) {
                TooBig::Fits => {}
                TooBig::Fragment => split = true,
                TooBig::Refused(s) => return s,
            }
        }
        // A first fragment (MF set, offset 0): its datagram's identity as
        // received, so that the later fragments follow it ([`frag`]).
        let first_frag = match read16(buf, l3 + 6) {
            Some(ff) if ff & 0x3fff == 0x2000 => datagram_id(buf, l3, to.proto),
            _ => None,
        };
        if sluice_nat::apply_dissected(buf, l3, usize::from(l4), to, deltas, true).is_err() {
            return Step::Done(Action::Drop(DropReason::RewriteFailed));
        }
        if let Some(id) = first_frag {
            self.remember_first_fragment(id, to, adj, now);
        }
        a.write_macs(buf);
        Step::Done(if split {
            Action::Fragment(a.oif, a.mtu)
        } else {
            Action::Forward(a.oif)
        })
    }

    /// A later fragment (offset > 0) of the datagram `key` names (ports 0):
    /// translated and forwarded like its first fragment, if that one was
    /// ([`frag`]); otherwise dropped (`fragment`). No ICMP error is ever
    /// sent about a later fragment (RFC 1812 section 4.3.2.7 allows errors
    /// about first fragments only), so an expired TTL or a fragment too big
    /// for the egress MTU is a plain drop.
    #[cold]
    #[inline(never)]
    fn later_fragment(
        &mut self,
        now: ct::Instant,
        buf: &mut [u8],
        len: usize,
        d: &Dissect,
        key: &FlowKey4,
        ttl: u8,
    ) -> Step {
        let l3 = usize::from(d.l3_off);
        let Some(ident) = read16(buf, l3 + 4) else {
            return Step::Done(Action::Drop(DropReason::Malformed));
        };
        let id = frag::DatagramId {
            src: key.src,
            dst: key.dst,
            proto: key.proto,
            ident,
        };
        let to = match self.frags.find(&id, now) {
            Some(frag::FragAction::Rewrite(to)) => to,
            Some(frag::FragAction::Handoff(w)) if !self.handed_in => {
                return Step::Done(Action::Handoff(w))
            }
            Some(frag::FragAction::Steer(w)) if !self.handed_in => {
                return Step::Done(Action::Steer(w))
            }
            _ => return Step::Done(Action::Drop(DropReason::Fragment)),
        };
        if ttl <= 1 {
            return Step::Done(Action::Drop(DropReason::TtlExpired));
        }
        let Some(&a) = self.adj.get(usize::from(to.adj)) else {
            return Step::Done(Action::Drop(DropReason::NoNeighbor));
        };
        if !a.resolved {
            return Step::Done(Action::Drop(DropReason::NoNeighbor));
        }
        let total = read16(buf, l3 + 2).map_or(len.saturating_sub(l3), usize::from);
        let split = total > usize::from(a.mtu);
        if split && read16(buf, l3 + 6).is_some_and(|f| f & 0x4000 != 0) {
            return Step::Done(Action::Drop(DropReason::FragmentationUnsupported));
        }
        let (Some(hc), Some(old_ttl_proto)) = (read16(buf, l3 + 10), read16(buf, l3 + 8)) else {
            return Step::Done(Action::Drop(DropReason::Malformed));
        };
        let new_ttl_proto = old_ttl_proto.wrapping_sub(0x0100);
        let hc = checksum::Delta::ZERO
            .with32(key.src, to.src)
            .with32(key.dst, to.dst)
            .with16(old_ttl_proto, new_ttl_proto)
            .apply(hc);
        write32(buf, l3 + 12, to.src);
        write32(buf, l3 + 16, to.dst);
        write16(buf, l3 + 8, new_ttl_proto);
        write16(buf, l3 + 10, hc);
        a.write_macs(buf);
        Step::Done(if split {
            Action::Fragment(a.oif, a.mtu)
        } else {
            Action::Forward(a.oif)
        })
    }

    /// The packet at `l3` is larger than `mtu`, judging by its frame length;
    /// check its header: it fits after all, it is to be fragmented on
    /// output (DF clear: [`Action::Fragment`], RFC 1812 section 5.2.6), or
    /// it is refused with RFC 1191 fragmentation needed (DF set).
    #[cold]
    #[inline(never)]
    fn too_big(
        &mut self,
        now: ct::Instant,
        buf: &mut [u8],
        len: usize,
        l3: usize,
        iif: IfIndex,
        mtu: u16,
    ) -> TooBig {
        let Some(total) = read16(buf, l3 + 2) else {
            return TooBig::Refused(Step::Done(Action::Drop(DropReason::Malformed)));
        };
        if total <= mtu {
            return TooBig::Fits;
        }
        let df = read16(buf, l3 + 6).is_some_and(|f| f & 0x4000 != 0);
        if !df {
            return TooBig::Fragment;
        }
        TooBig::Refused(self.icmp_error(now, buf, len, l3, iif, Some(mtu)))
    }

    /// Drop the packet at `l3` and, when allowed (RFC 1812 §4.3.2.7) and
    /// within the rate limit, turn it into an ICMP error to its sender from
    /// the ingress interface: fragmentation needed with `mtu` when `mtu` is
    /// given, else time exceeded.
    #[cold]
    #[inline(never)]
    fn icmp_error(
        &mut self,
        now: ct::Instant,
        buf: &mut [u8],
        len: usize,
        l3: usize,
        iif: IfIndex,
        mtu: Option<u16>,
    ) -> Step {
        let (reason, ty, code, rest) = match mtu {
            Some(m) => (
                DropReason::TooBig,
                icmp_error::DEST_UNREACHABLE,
                icmp_error::FRAG_NEEDED,
                u32::from(m),
            ),
            None => (
                DropReason::TtlExpired,
                icmp_error::TIME_EXCEEDED,
                icmp_error::TTL_EXCEEDED_IN_TRANSIT,
                0,
            ),
        };
        self.icmp_answer(now, buf, len, l3, iif, (ty, code, rest), reason)
    }

    /// Drop the packet at `l3` for `reason` and, when allowed and within
    /// the rate limit, turn it into the ICMP error `(type, code, rest of
    /// header)` to its sender, from the ingress interface.
    #[allow(clippy::too_many_arguments)]
    #[cold]
    #[inline(never)]
    fn icmp_answer(
        &mut self,
        now: ct::Instant,
        buf: &mut [u8],
        len: usize,
        l3: usize,
        iif: IfIndex,
        (ty, code, rest): (u8, u8, u32),
        reason: DropReason,
    ) -> Step {
        let sender = read32(buf, l3 + 12).unwrap_or(0);
        let Some((src, mac)) = self.ifaces.get(usize::from(iif)).and_then(|i| {
            // The address on the sender's subnet, else the first one.
            let on_link = i
                .addrs
                .iter()
                .find(|&&(a, l)| (u32::from(a) ^ sender) & crate::route::mask(l) == 0);
            on_link
                .or(i.addrs.first())
                .map(|&(a, _)| (u32::from(a), i.mac))
        }) else {
            return Step::Done(Action::Drop(reason));
        };
        let e = IcmpError {
            ty,
            code,
            rest,
            src,
            src_mac: mac,
        };
        // Check what may be sent before spending a token on it.
        if icmp_error::may_answer(buf, len, l3).is_err() {
            return Step::Done(Action::Drop(reason));
        }
        if !self.icmp.take(now.as_millis()) {
            self.counters.icmp_errors_limited += 1;
            return Step::Done(Action::Drop(reason));
        }
        match icmp_error::build_in_place(buf, len, l3, &e) {
            Ok(n) => Step::Error(n, reason),
            Err(_) => Step::Done(Action::Drop(reason)),
        }
    }

    /// A packet the rules refused with verdict `v`: dropped
    /// (`policy-drop`), or rejected (`policy-reject`) and answered as the
    /// kernel's `reject` answers it: a TCP reset ([`crate::tcp_reset`]) or
    /// an ICMP destination unreachable (rate limited like every ICMP error
    /// the gateway sends) to its sender.
    #[allow(clippy::too_many_arguments)]
    #[cold]
    #[inline(never)]
    fn refuse4(
        &mut self,
        now: ct::Instant,
        buf: &mut [u8],
        len: usize,
        l3: u16,
        l4: u16,
        iif: IfIndex,
        v: Verdict,
    ) -> Step {
        let (l3, l4) = (usize::from(l3), usize::from(l4));
        match v {
            Verdict::Accept | Verdict::Drop => Step::Done(Action::Drop(DropReason::PolicyDrop)),
            // The builder refuses what is not TCP.
            Verdict::Reject(RejectWith::TcpReset) => self.reset(buf, len, l3, l4, iif),
            Verdict::Reject(RejectWith::Unreachable { v4, .. }) => self.icmp_answer(
                now,
                buf,
                len,
                l3,
                iif,
                (icmp_error::DEST_UNREACHABLE, v4, 0),
                DropReason::PolicyReject,
            ),
        }
    }

    /// A rejected TCP segment (network header at `l3`, TCP at `l4`)
    /// turned into the reset that answers it ([`crate::tcp_reset`]), out of
    /// ingress interface `iif`; dropped when it may not be answered.
    fn reset(&self, buf: &mut [u8], len: usize, l3: usize, l4: usize, iif: IfIndex) -> Step {
        let built = self
            .ifaces
            .get(usize::from(iif))
            .and_then(|i| crate::tcp_reset::build_in_place(buf, len, l3, l4, i.mac).ok());
        match built {
            Some(n) => Step::Reset(n),
            None => Step::Done(Action::Drop(DropReason::PolicyReject)),
        }
    }

    fn remove(&mut self, id: EntryId) {
        if let Some(e) = self.ct.remove(id) {
            self.nat.release(&e.orig(), &e.reply());
            if self.counts_conns {
                self.policy.conn_closed(&conn4(&e.orig()));
            }
            if !offload_removals(self.offload.as_mut(), &e, &self.adj) {
                self.clear_offload_marks();
            }
        }
    }

    /// After a fast-path packet of `dir` on entry `id` arriving on `iif`
    /// was forwarded: offload both directions if they qualify (see
    /// [`crate::offload`]), or take them back when a TCP connection left
    /// ESTABLISHED.
    #[cold]
    #[inline(never)]
    fn offload_after(&mut self, id: EntryId, dir: Dir, iif: IfIndex, state: ct::ProtoState) {
        let Some(q) = &mut self.offload else {
            return;
        };
        let e = self.ct.entry(id);
        let (fe, adj, down) = (self.filter_established, &self.adj, &self.link_down);
        match offload_plan(q, e, dir, iif, state, fe, adj, down) {
            OffloadPlan::Nothing => {}
            OffloadPlan::TakeBack => {
                let ok = offload_removals(Some(q), e, adj);
                self.ct.set_offloaded(id, [false, false]);
                if !ok {
                    self.clear_offload_marks();
                }
            }
            OffloadPlan::Install(out, back) => {
                let info = *e.payload();
                for (d, a) in [(dir, out), (dir.opposite(), back)] {
                    let (ip_delta, l4_delta) = rewrite_deltas(&info, d);
                    q.push_install(OffloadFlow {
                        iif: offload_iif(e, adj, d),
                        key: e.key(d),
                        to: e.key(d.opposite()).reversed(),
                        ip_delta,
                        l4_delta,
                        adj: a,
                    });
                }
                self.ct.set_offloaded(id, [true, true]);
            }
        }
    }

    /// The route type of `a` as `fib daddr type` gives it (the kernel's
    /// `inet_addr_type`: `0.0.0.0/8` and the limited broadcast are
    /// broadcast, multicast is multicast, the local table's addresses are
    /// local or broadcast, anything else unicast).
    fn addr_type4(&self, a: u32) -> u8 {
        if let Some(t) = crate::policy::fixed_addr_type(Ipv4Addr::from(a).into()) {
            t
        } else if self.is_local(a).is_some() {
            2
        } else if self.bcast4.contains(&a) {
            3
        } else {
            1
        }
    }

    /// `fib daddr type` and `fib saddr type` of a packet about to meet the
    /// policy.
    /// Left at their neutral values when no rule reads them
    /// ([`Policy::needs_routing_facts`]).
    #[inline(never)]
    fn addr_types4(&self, pp: &mut PolicyPacket) {
        if !self.policy.needs_routing_facts() {
            return;
        }
        pp.daddr_type = self.addr_type4(pp.dst as u32);
        pp.saddr_type = self.addr_type4(pp.src as u32);
        pp.rpf = self.rpf4(pp.iif, pp.src as u32);
    }

    /// `fib saddr . iif oif` and `fib saddr oif` of a packet from `src`
    /// received on `iif`: does the route back to `src` leave through
    /// `iif`, does any route to it exist.
    fn rpf4(&self, iif: IfIndex, src: u32) -> (bool, bool) {
        match self.route(src) {
            Ok((oif, _)) => (oif == iif, true),
            Err(_) => (false, false),
        }
    }

    /// The MTU of adjacency `adj`'s interface.
    fn adj_mtu(&self, adj: AdjIndex) -> u16 {
        self.adj
            .get(usize::from(adj))
            .map_or(Interface::DEFAULT_MTU, |a| a.mtu)
    }

    fn is_local(&self, a: u32) -> Option<IfIndex> {
        self.local4.iter().find(|(l, _)| *l == a).map(|&(_, i)| i)
    }

    /// Whether an IPv4 packet from `src` to `dst` is a broadcast for the
    /// gateway: to the limited broadcast, to the subnet broadcast of one of
    /// its prefixes, or from and to `0.0.0.0` (the kernel's `brd_input`).
    fn is_broadcast4(&self, src: u32, dst: u32) -> bool {
        dst == u32::MAX || (src == 0 && dst == 0) || self.bcast4.contains(&dst)
    }

    /// How frame `frame`'s destination MAC address relates to interface
    /// `iif`: [`L2_HOST`] (its own address, or an interface the worker does
    /// not know, which it leaves to the later checks), [`L2_GROUP`]
    /// (broadcast or multicast) or [`L2_OTHER`].
    #[inline(always)]
    fn l2_dest(&self, frame: &[u8], iif: IfIndex) -> u8 {
        // One 8-byte load and compare: the destination MAC is the frame's
        // first 6 bytes (a frame too short for that is malformed anyway).
        let Some(w) = frame.first_chunk::<8>() else {
            return L2_HOST;
        };
        let dst = u64::from_le_bytes(*w) & MAC48;
        match self.l2_macs.get(usize::from(iif)) {
            Some(&m) if m != dst => {
                if dst & 1 != 0 {
                    L2_GROUP
                } else {
                    L2_OTHER
                }
            }
            _ => L2_HOST,
        }
    }

    /// Route `dst`: the egress interface and the next hop.
    fn route(&self, dst: u32) -> Result<(IfIndex, u32), DropReason> {
        let r = self.routes.lookup(dst).ok_or(DropReason::NoRoute)?;
        Ok((r.oif, r.via.map(u32::from).unwrap_or(dst)))
    }

    /// The next hop adjacency `adj` stands for (a walk of the neighbours:
    /// only for a packet dropped for an unresolved one, so that the
    /// resolver asks for that next hop).
    #[cold]
    fn next_hop_of(&self, adj: AdjIndex) -> Option<(IfIndex, u32)> {
        self.neigh.iter().find(|(_, &i)| i == adj).map(|(&k, _)| k)
    }

    /// The adjacency of next hop `nh` on `oif`.
    fn neighbor(&self, oif: IfIndex, nh: u32) -> Result<AdjIndex, DropReason> {
        self.neigh
            .get(&(oif, nh))
            .copied()
            .ok_or(DropReason::NoNeighbor)
    }

    /// The slow path: the first packet of a connection (or an ICMP error
    /// about one, or a packet for the gateway itself).
    #[allow(clippy::too_many_arguments)]
    fn slow4(
        &mut self,
        now: ct::Instant,
        buf: &mut [u8],
        len: usize,
        iif: IfIndex,
        d: &Dissect,
        key: &FlowKey4,
        ttl: u8,
    ) -> Step {
        // Before the connection table is consulted (a group frame never
        // takes the fast path).
        let broadcast = match self.receive4(buf, key) {
            Ok(b) => b,
            Err(r) => return Step::Done(Action::Drop(r)),
        };
        // A packet that missed in pass 2 may belong to a connection created
        // by an earlier packet of this batch; its bucket is cached by now.
        if let L4::NonFirstFragment = d.l4 {
            // No L4 header: never looked up by its (port-less) key.
            self.counters.slow_path += 1;
            return self.later_fragment(now, buf, len, d, key, ttl);
        }
        let h = self.ct.hash(key);
        let vacant = match self.ct.lookup_vacant(h, key) {
            Ok((id, dir)) => return self.fast4(now, buf, len, iif, &Meta::of(d), id, dir),
            Err(v) => v,
        };
        self.counters.slow_path += 1;
        if let L4::IcmpError {
            inner: InnerKey::V4(inner),
            ..
        } = d.l4
        {
            return Step::Done(self.related4(buf, iif, d, key, &inner, ttl));
        }
        if let Some(w) = self.external_owner(key) {
            return self.hand_off(Action::Steer(w), buf, d, key, now);
        }
        let ev = l4_event(d);
        let mut pp = policy_packet(iif, key, d, CtState::New, buf);
        self.addr_types4(&mut pp);
        self.stamp(&mut pp);
        if broadcast {
            // For the gateway, which serves nothing on a broadcast address:
            // the input hook sees it, then it is dropped (`local-unhandled`).
            return self.local4(now, buf, len, iif, d, key, &pp);
        }
        // Whether prerouting rewrote the destination (DNAT, or hairpinning
        // to a mapping): handoff rule 2.
        let mut dst_rewritten = false;

        // An inbound packet to an existing mapping (endpoint-independent
        // filtering decides whether it may open a session).
        let mut reply = None;
        if let Some(m) = self
            .nat
            .mapping_by_ext(key.proto, Ipv4Addr::from(key.dst), key.dport)
        {
            // RFC 4787 REQ-9: a packet that arrives on the link the
            // mapping's internal host is reached through comes from the
            // inside; it is hairpinned, with its source mapped too, so that
            // the target answers through the gateway even on a shared LAN.
            // Anything else is an inbound packet to the mapping.
            let from_inside = self.route(u32::from(m.int_addr)).map(|(o, _)| o) == Ok(iif);
            match from_inside.then(|| self.nat.hairpin(key)).flatten() {
                Some(Ok(r)) => {
                    reply = Some(r);
                    dst_rewritten = true;
                    pp.ct_reply = conn4(&r);
                    // Later hooks see the translated destination, as after
                    // DNAT, and `ct status` dnat + snat.
                    pp.dst = u128::from(r.src);
                    pp.dport = r.sport;
                    pp.ct_status |= 0x30;
                }
                Some(Err(e)) => return Step::Done(Action::Drop(nat_drop(e))),
                None => match self.nat.inbound_new(key) {
                    Some((_, r)) => reply = Some(r),
                    None => return Step::Done(Action::Drop(DropReason::NatFiltered)),
                },
            }
        } else if self.is_local(key.dst).is_some() && !self.dnat_applies(&pp) {
            // (A port forward on one of the gateway's own addresses is
            // forwarded, as in the kernel, where DNAT runs in prerouting
            // before the local/forward decision.)
            return self.local4(now, buf, len, iif, d, key, &pp);
        }
        if !self.ct.may_create(ev) {
            self.release_pending(key, reply.as_ref());
            return Step::Done(Action::Drop(DropReason::CtInvalid));
        }

        // Prerouting: filter chains, and DNAT for a new connection not
        // already bound to a mapping.
        let dec = self.policy.decide(Hook::Prerouting, &pp);
        pp.mark = dec.mark;
        pp.ct_mark = dec.ct_mark;
        let mut mss = dec.mss;
        let mut ct_timeout = dec.ct_timeout;
        if dec.verdict != Verdict::Accept {
            self.release_pending(key, reply.as_ref());
            return self.refuse4(now, buf, len, d.l3_off, d.l4_off, iif, dec.verdict);
        }
        if reply.is_none() {
            if let Some(Translation::Dnat { addr, port }) = dec.nat {
                match self.nat.dnat(key, addr, port) {
                    Ok(r) => {
                        reply = Some(r);
                        dst_rewritten = true;
                        pp.ct_reply = conn4(&r);
                        // Later hooks see the translated destination and
                        // `ct status dnat`, as in the kernel.
                        pp.dst = u128::from(r.src);
                        pp.dport = r.sport;
                        pp.ct_status |= 0x20;
                        pp.daddr_type = self.addr_type4(r.src);
                    }
                    Err(e) => return Step::Done(Action::Drop(nat_drop(e))),
                }
            }
        }
        // Where the packet goes after any DNAT.
        let dst_after = reply.map(|r| r.src).unwrap_or(key.dst);
        let (oif, nh) = match self.route(dst_after) {
            Ok(x) => x,
            Err(r) => {
                self.release_pending(key, reply.as_ref());
                return Step::Done(Action::Drop(r));
            }
        };
        if let Some(r) = reply.filter(|_| dst_rewritten) {
            if let Some(w) = self.reply_owner(oif, &r) {
                self.release_pending(key, Some(&r));
                return self.hand_off(Action::Handoff(w), buf, d, key, now);
            }
        }
        // Handoff rule 3: a first fragment (steered by its addresses) that
        // neither rule above sends on lives where its ports name.
        if d.frag() == Frag::First && reply.is_none() {
            if let Some(w) = self.port_owner(iif, key) {
                return self.hand_off(Action::Steer(w), buf, d, key, now);
            }
        }
        let adj_out = match self.egress4(now, buf, len, usize::from(d.l3_off), iif, ttl, (oif, nh))
        {
            Ok(a) => a,
            Err(s) => {
                self.release_pending(key, reply.as_ref());
                return s;
            }
        };
        pp.oif = Some(oif);
        // The TTL is decremented before the forward hook (`ip_forward`).
        pp.ttl = pp.ttl.saturating_sub(1);
        // Forward filter.
        let dec = self.policy.decide(Hook::Forward, &pp);
        pp.mark = dec.mark;
        pp.ct_mark = dec.ct_mark;
        mss = mss.and(dec.mss);
        ct_timeout = later_ct_timeout(ct_timeout, dec.ct_timeout);
        if dec.verdict != Verdict::Accept {
            self.release_pending(key, reply.as_ref());
            return self.refuse4(now, buf, len, d.l3_off, d.l4_off, iif, dec.verdict);
        }
        // Postrouting: filter chains, and SNAT / masquerade for connections
        // not yet translated by a mapping or DNAT.
        let dec = self.policy.decide(Hook::Postrouting, &pp);
        pp.mark = dec.mark;
        pp.ct_mark = dec.ct_mark;
        mss = mss.and(dec.mss);
        ct_timeout = later_ct_timeout(ct_timeout, dec.ct_timeout);
        if dec.verdict != Verdict::Accept {
            self.release_pending(key, reply.as_ref());
            return self.refuse4(now, buf, len, d.l3_off, d.l4_off, iif, dec.verdict);
        }
        if reply.is_none() {
            if let Some(t @ (Translation::Snat { .. } | Translation::Masquerade)) = dec.nat {
                let egress = self
                    .ifaces
                    .get(usize::from(oif))
                    .and_then(|i| i.addrs.first())
                    .map(|&(a, _)| a);
                match self.nat.translate_outbound(key, &t, egress) {
                    Ok(r) => reply = Some(r),
                    Err(e) => return Step::Done(Action::Drop(nat_drop(e))),
                }
            }
        }
        let reply = reply.unwrap_or_else(|| key.reversed());
        // The reply key is certain only now; its index bucket is a random
        // cache line that `insert` reads and writes. Pass 2b prefetched it
        // when an existing mapping predicted the key; for a new mapping (or
        // DNAT) start loading it here, so that the miss at least overlaps
        // the routing and delta work below.
        self.ct.prefetch_bucket(self.ct.hash(&reply));
        // The reply direction is translated back to the original source and
        // leaves towards it.
        let adj_back = match self.route(key.src) {
            Ok((oif, nh)) => {
                let a = self.neighbor(oif, nh);
                if a.is_err() {
                    self.missing_nh = Some((oif, nh));
                }
                a
            }
            Err(r) => Err(r),
        };
        let adj_back = match adj_back {
            Ok(a) => a,
            Err(r) => {
                self.nat.release(key, &reply);
                return Step::Done(Action::Drop(r));
            }
        };
        let to_orig = reply.reversed();
        let (ip_delta, l4_delta) = sluice_nat::deltas(key, &to_orig);
        let info = FlowInfo {
            adj: [adj_out, adj_back],
            ip_delta,
            l4_delta,
        };
        let nat = &mut self.nat;
        let (q, adjs) = (&mut self.offload, &self.adj);
        let counted = self.counts_conns.then_some(&*self.policy);
        let mut overflow = false;
        let inserted = self
            .ct
            .insert_vacant_tracked(now, vacant, reply, info, ev, &mut |e| {
                nat.release(&e.orig(), &e.reply());
                overflow |= !offload_removals(q.as_mut(), e, adjs);
                if let Some(p) = counted {
                    p.conn_closed(&conn4(&e.orig()));
                }
            });
        if overflow {
            self.clear_offload_marks();
        }
        let (id, t) = match inserted {
            Ok(x) => x,
            Err(e) => {
                self.nat.release(key, &reply);
                return Step::Done(Action::Drop(match e {
                    InsertError::Full => DropReason::CtFull,
                    InsertError::Exists | InsertError::ProtoMismatch => DropReason::CtInvalid,
                }));
            }
        };
        self.counters.ct_created += 1;
        if t.verdict == ct::Verdict::Invalid {
            self.remove(id);
            return Step::Done(Action::Drop(DropReason::CtInvalid));
        }
        if self.counts_conns {
            self.policy.conn_confirmed(&conn4(key));
        }
        // The connection mark the rules set (`ct mark set`); the packet
        // mark is the packet's own and is not kept.
        if pp.ct_mark != 0 {
            self.ct.entry_mut(id).set_mark(pp.ct_mark);
        }
        if ct_timeout != 0 {
            give_ct_timeout(&mut self.ct, id, ct_timeout, now);
        }
        if !mss.is_none() && key.proto == proto::TCP {
            let rt = self.adj_mtu(adj_out).min(self.adj_mtu(adj_back));
            clamp_mss(buf, len, usize::from(d.l4_off), mss, rt, 40);
        }
        self.emit(
            now,
            buf,
            len,
            iif,
            d.l3_off,
            d.l4_off,
            &to_orig,
            rewrite_deltas(&info, Dir::Original),
            adj_out,
        )
    }

    /// RFC 1812 §5.3.1 and §4.3.2.3 / RFC 1191: what the kernel's
    /// `ip_forward` checks after routing and before the forward hook, so a
    /// forbidden packet still gets its ICMP error, as with netfilter: the
    /// TTL, the egress MTU (fragmentation needed, or fragmented on output),
    /// and the next hop's link-layer address (a missing one is named in
    /// `missing_nh`). The adjacency to forward on, or what to do instead.
    #[allow(clippy::too_many_arguments)]
    fn egress4(
        &mut self,
        now: ct::Instant,
        buf: &mut [u8],
        len: usize,
        l3: usize,
        iif: IfIndex,
        ttl: u8,
        (oif, nh): (IfIndex, u32),
    ) -> Result<AdjIndex, Step> {
        if ttl <= 1 {
            return Err(self.icmp_error(now, buf, len, l3, iif, None));
        }
        let mtu = self
            .ifaces
            .get(usize::from(oif))
            .map_or(Interface::DEFAULT_MTU, |i| i.mtu);
        if len.saturating_sub(l3) > usize::from(mtu) {
            if let TooBig::Refused(s) = self.too_big(now, buf, len, l3, iif, mtu) {
                return Err(s);
            }
        }
        self.neighbor(oif, nh).map_err(|r| {
            self.missing_nh = Some((oif, nh));
            Step::Done(Action::Drop(r))
        })
    }

    /// The kernel's input routing checks: a martian source or destination
    /// is refused, and a link-layer group frame is for the gateway itself
    /// or nobody. Whether the packet is an IPv4 broadcast.
    fn receive4(&self, buf: &[u8], key: &FlowKey4) -> Result<bool, DropReason> {
        if let Some(r) = martian4(key.src, key.dst) {
            return Err(r);
        }
        let broadcast = self.is_broadcast4(key.src, key.dst);
        if is_group(buf) && !broadcast && self.is_local(key.dst).is_none() {
            return Err(DropReason::LinkBroadcast);
        }
        Ok(broadcast)
    }

    /// A first fragment was forwarded as `to` on `adj`: its datagram's
    /// later fragments follow.
    #[cold]
    #[inline(never)]
    fn remember_first_fragment(
        &mut self,
        id: frag::DatagramId,
        to: &FlowKey4,
        adj: AdjIndex,
        now: ct::Instant,
    ) {
        let rw = frag::FragRewrite {
            src: to.src,
            dst: to.dst,
            adj,
        };
        self.frags.remember(id, frag::FragAction::Rewrite(rw), now);
    }

    /// Hands the packet on (`how`: [`Action::Handoff`] or
    /// [`Action::Steer`]); a first fragment's datagram is filed so that its
    /// later fragments, which arrive here too, go the same way.
    fn hand_off(
        &mut self,
        how: Action,
        buf: &[u8],
        d: &Dissect,
        key: &FlowKey4,
        now: ct::Instant,
    ) -> Step {
        let to = match how {
            Action::Handoff(w) => frag::FragAction::Handoff(w),
            Action::Steer(w) => frag::FragAction::Steer(w),
            _ => return Step::Done(how),
        };
        if d.frag() == Frag::First {
            if let Some(ident) = read16(buf, usize::from(d.l3_off) + 4) {
                let id = frag::DatagramId {
                    src: key.src,
                    dst: key.dst,
                    proto: key.proto,
                    ident,
                };
                self.frags.remember(id, to, now);
            }
        }
        Step::Done(how)
    }

    /// Rule 3 of the handoff (module documentation): the worker that port
    /// steering would have picked for a first fragment (which was steered
    /// by its addresses), when it is not this one: by source port on an
    /// interface steered by source, else by destination port (an ICMP
    /// query's identifier is both).
    fn port_owner(&self, iif: IfIndex, key: &FlowKey4) -> Option<u16> {
        if self.workers <= 1 || self.handed_in {
            return None;
        }
        if !matches!(key.proto, proto::TCP | proto::UDP | proto::ICMP) {
            return None;
        }
        let by_source = self
            .by_source
            .get(usize::from(iif))
            .copied()
            .unwrap_or(false);
        let port = if by_source { key.sport } else { key.dport };
        let w = sluice_nat::owner_of(port, self.workers);
        (w != self.id).then_some(w)
    }

    /// Rule 2 of the handoff (module documentation): the worker the replies
    /// of a connection whose destination was rewritten will be steered to,
    /// when it is not this one. `reply` is the reply key; it leaves by
    /// `oif` and its replies come back in there.
    fn reply_owner(&self, oif: IfIndex, reply: &FlowKey4) -> Option<u16> {
        if self.workers <= 1 || self.handed_in {
            return None;
        }
        if !matches!(reply.proto, proto::TCP | proto::UDP) {
            return None;
        }
        if !self
            .by_source
            .get(usize::from(oif))
            .copied()
            .unwrap_or(false)
        {
            return None;
        }
        let w = sluice_nat::owner_of(reply.sport, self.workers);
        (w != self.id).then_some(w)
    }

    /// Whether prerouting would DNAT this packet (slow path, packets to the
    /// gateway's own addresses only).
    fn dnat_applies(&self, pp: &PolicyPacket) -> bool {
        self.policy.has_nat(Hook::Prerouting)
            && matches!(
                self.policy.decide(Hook::Prerouting, pp).nat,
                Some(Translation::Dnat { .. })
            )
    }

    /// Undo a NAT reservation made for a packet that was then dropped.
    fn release_pending(&mut self, key: &FlowKey4, reply: Option<&FlowKey4>) {
        if let Some(r) = reply {
            self.nat.release(key, r);
        }
    }

    /// An ICMP error quoting a packet of a tracked connection (ct state
    /// related): translate the quoted packet and the outer header.
    fn related4(
        &mut self,
        buf: &mut [u8],
        iif: IfIndex,
        d: &Dissect,
        key: &FlowKey4,
        inner: &FlowKey4,
        ttl: u8,
    ) -> Action {
        let h = self.ct.hash(inner);
        let Some((id, dir)) = self.ct.lookup(h, inner) else {
            return Action::Drop(DropReason::NatNoMapping);
        };
        if ttl <= 1 {
            return Action::Drop(DropReason::TtlExpired);
        }
        let e = self.ct.entry(id);
        let (orig, reply) = (e.orig(), e.reply());
        let adj = e
            .payload()
            .adj
            .get(dir_index(dir.opposite()))
            .copied()
            .unwrap_or(0);
        let mut pp = policy_packet(iif, key, d, CtState::Related, buf);
        self.addr_types4(&mut pp);
        self.stamp(&mut pp);
        // A related packet's connection is the one it is about.
        pp.conn = conn4(&orig);
        pp.ct_reply = conn4(&reply);
        if self.policy.decide(Hook::Forward, &pp).verdict != Verdict::Accept {
            return Action::Drop(DropReason::PolicyDrop);
        }
        let Some(inner_to) = sluice_nat::icmp_error_inner_target(&orig, &reply, &inner.reversed())
            .map(|t| t.reversed())
        else {
            return Action::Drop(DropReason::NatNoMapping);
        };
        // Resolve the adjacency before touching the frame, so that a frame
        // dropped here leaves unmodified.
        let Some(a) = self
            .adj
            .get(usize::from(adj))
            .copied()
            .filter(|a| a.resolved)
        else {
            return Action::Drop(DropReason::NoNeighbor);
        };
        let l3 = usize::from(d.l3_off);
        if sluice_nat::apply_icmp_error(buf, l3, usize::from(d.l4_off), inner, &inner_to).is_err() {
            return Action::Drop(DropReason::RewriteFailed);
        }
        // TTL decrement (the TTL is the high byte of the TTL/protocol word).
        if let (Some(w), Some(c)) = (read16(buf, l3 + 8), read16(buf, l3 + 10)) {
            let nw = w.wrapping_sub(0x0100);
            write16(buf, l3 + 8, nw);
            write16(buf, l3 + 10, checksum::update16(c, w, nw));
        }
        a.write_macs(buf);
        Action::Forward(a.oif)
    }

    /// A packet for one of the gateway's own addresses.
    #[allow(clippy::too_many_arguments)]
    fn local4(
        &mut self,
        now: ct::Instant,
        buf: &mut [u8],
        len: usize,
        iif: IfIndex,
        d: &Dissect,
        key: &FlowKey4,
        pp: &PolicyPacket,
    ) -> Step {
        let dec = self.policy.decide(Hook::Input, pp);
        if dec.verdict != Verdict::Accept {
            return self.refuse4(now, buf, len, d.l3_off, d.l4_off, iif, dec.verdict);
        }
        match d.l4 {
            // RFC 792: echo request (8) -> echo reply (0) to the sender; not
            // to a broadcast (the kernel's `icmp_echo_ignore_broadcasts`).
            L4::IcmpQuery { ty: 8, .. } if self.is_local(key.dst).is_some() => {
                let l3 = usize::from(d.l3_off);
                let l4 = usize::from(d.l4_off);
                let Some(src_mac) = self.ifaces.get(usize::from(iif)).map(|i| i.mac) else {
                    return Step::Done(Action::Drop(DropReason::LocalUnhandled));
                };
                let (Some(ttl_w), Some(ipc), Some(type_w), Some(icc)) = (
                    read16(buf, l3 + 8),
                    read16(buf, l3 + 10),
                    read16(buf, l4),
                    read16(buf, l4 + 2),
                ) else {
                    return Step::Done(Action::Drop(DropReason::Malformed));
                };
                // Swap addresses (checksum-neutral), TTL := 64, type := echo
                // reply (0); RFC 1624 updates for the changed words.
                write32(buf, l3 + 12, key.dst);
                write32(buf, l3 + 16, key.src);
                let new_ttl_w = (64 << 8) | (ttl_w & 0x00ff);
                write16(buf, l3 + 8, new_ttl_w);
                write16(buf, l3 + 10, checksum::update16(ipc, ttl_w, new_ttl_w));
                let reply_w = type_w & 0x00ff;
                write16(buf, l4, reply_w);
                write16(buf, l4 + 2, checksum::update16(icc, type_w, reply_w));
                swap_macs(buf, src_mac);
                Step::Reply(len)
            }
            _ => Step::Done(Action::Drop(DropReason::LocalUnhandled)),
        }
    }

    /// ARP: answer requests for the gateway's addresses on the interface
    /// they belong to; learn nothing else here (resolution is the io layer's
    /// neighbour manager's job).
    fn arp(
        &mut self,
        buf: &mut [u8],
        len: usize,
        iif: IfIndex,
        op: u16,
        spa: u32,
        tpa: u32,
    ) -> Step {
        if op != 1 || self.is_local(tpa).is_none() {
            return Step::Done(Action::Drop(DropReason::LocalUnhandled));
        }
        let Some(my_mac) = self.ifaces.get(usize::from(iif)).map(|i| i.mac) else {
            return Step::Done(Action::Drop(DropReason::LocalUnhandled));
        };
        let Some(arp) = buf.get_mut(14..42) else {
            return Step::Done(Action::Drop(DropReason::Malformed));
        };
        // RFC 826: op := reply; target := old sender; sender := us.
        let mut sha = [0u8; 6];
        sha.copy_from_slice(&arp[8..14]);
        arp[6..8].copy_from_slice(&2u16.to_be_bytes());
        arp[18..24].copy_from_slice(&sha);
        arp[24..28].copy_from_slice(&spa.to_be_bytes());
        arp[8..14].copy_from_slice(&my_mac);
        arp[14..18].copy_from_slice(&tpa.to_be_bytes());
        if let Some(m) = buf.get_mut(0..12) {
            m[..6].copy_from_slice(&sha);
            m[6..].copy_from_slice(&my_mac);
        }
        Step::Reply(len)
    }
}

/// Outcome of one frame inside the worker.
enum Step {
    Done(Action),
    /// A reply was built in place; the new frame length.
    Reply(usize),
    /// The frame was dropped for this reason and turned into an ICMP error
    /// to its sender, of this length.
    Error(usize, DropReason),
    /// The frame was rejected (`policy-reject`) and turned into a TCP reset
    /// to its sender, of this length.
    Reset(usize),
}

/// A walk of [`Worker::walk_step`] over both connection tables.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Walk {
    /// Remove the connections selected (`conntrack flush`), or only count
    /// them (`conntrack count`).
    pub remove: bool,
    /// Connections selected so far.
    pub matched: u64,
    next4: usize,
    next6: usize,
}

impl Walk {
    /// A walk from the start that removes (`remove`) or counts.
    pub fn new(remove: bool) -> Self {
        Self {
            remove,
            ..Self::default()
        }
    }
}

#[inline]
/// The interface packets of direction `dir` of `e` arrive on: the one its
/// opposite direction leaves by (offload requires symmetric routing).
fn offload_iif<K: OffloadKey>(e: &ct::Entry<K, K::Info>, adj: &[Adjacency], dir: Dir) -> IfIndex {
    let a = K::adjacency(e.payload(), dir.opposite());
    adj.get(usize::from(a)).map_or(0, |a| a.oif)
}

/// What the offload needs of the keys and per-connection data of a
/// connection table, IPv4's and IPv6's, so that one code path decides
/// offloads, names them and takes them back for both.
pub(crate) trait OffloadKey: ct::Key {
    /// The table's per-connection data.
    type Info: Copy + Default;
    /// The adjacency packets of direction `dir` leave through.
    fn adjacency(info: &Self::Info, dir: Dir) -> AdjIndex;
    /// The request taking back the direction of tuple `key` arriving on
    /// `iif`.
    fn remove(iif: IfIndex, key: Self) -> OffloadOp;
}

impl OffloadKey for FlowKey4 {
    type Info = FlowInfo;
    fn adjacency(info: &FlowInfo, dir: Dir) -> AdjIndex {
        info.adj[dir_index(dir)]
    }
    fn remove(iif: IfIndex, key: Self) -> OffloadOp {
        OffloadOp::Remove { iif, key }
    }
}

/// What [`Worker::offload_after`] and its IPv6 twin do with a connection
/// after a packet forwarded on its fast path ([`offload_plan`]).
pub(crate) enum OffloadPlan {
    /// Nothing (offloaded and staying so, or not eligible).
    Nothing,
    /// Take both directions back (a TCP connection left ESTABLISHED, or
    /// the policy no longer lets it through up front).
    TakeBack,
    /// Offload both: the adjacencies of the packet's direction and of the
    /// opposite one.
    Install(Adjacency, Adjacency),
}

/// How often a packet of an offloaded direction that reaches the engine
/// installs the connection again ([`offload_plan`]): every this many
/// packets of the connection the engine tracks.
pub const REINSTALL_EVERY: u32 = 64;

/// Whether connection `e`, after a packet of `dir` arriving on `iif` that
/// its fast path forwarded with TCP/UDP state `state`, goes to the lower
/// layer (see [`crate::offload`]): TCP ESTABLISHED or UDP, the policy
/// accepting established packets up front or the connection in a
/// flowtable (whose packets skip the filter chains), both adjacencies
/// resolved, symmetric routing, both links up, room in the queue (an
/// eligible connection without room is counted in `q.dropped`); or, for
/// a connection already offloaded, installed again every
/// [`REINSTALL_EVERY`]th packet the engine sees of an offloaded direction.
#[allow(clippy::too_many_arguments)]
pub(crate) fn offload_plan<K: OffloadKey>(
    q: &mut OffloadQueue,
    e: &ct::Entry<K, K::Info>,
    dir: Dir,
    iif: IfIndex,
    state: ct::ProtoState,
    filter_established: bool,
    adj: &[Adjacency],
    link_down: &[bool],
) -> OffloadPlan {
    let offloaded = e.is_offloaded(Dir::Original) || e.is_offloaded(Dir::Reply);
    let eligible = (!filter_established || e.in_flowtable())
        && matches!(
            state,
            ct::ProtoState::Tcp(ct::TcpState::Established) | ct::ProtoState::Udp(_)
        );
    if offloaded {
        if !eligible {
            return OffloadPlan::TakeBack;
        }
        // The lower layer forwards this direction, yet the engine got a
        // packet of it: normal for a few packets after the install and for
        // what the lower layer leaves to the engine, but also what follows
        // when the table lost the direction (a clear by another worker
        // sharing it, an install that found no room). Every
        // `REINSTALL_EVERY`th packet installs both directions again (an
        // overwrite when they are there); the marks stay set, so what is
        // installed is always taken back.
        if !(e.is_offloaded(dir) && e.packets() % REINSTALL_EVERY == 0) {
            return OffloadPlan::Nothing;
        }
    }
    if !eligible || !q.has_room(2) {
        if eligible {
            q.dropped += 1;
        }
        return OffloadPlan::Nothing;
    }
    let info = e.payload();
    let (Some(&out), Some(&back)) = (
        adj.get(usize::from(K::adjacency(info, dir))),
        adj.get(usize::from(K::adjacency(info, dir.opposite()))),
    ) else {
        return OffloadPlan::Nothing;
    };
    // Symmetric routing: the reply of this packet arrives where this one
    // leaves, and this one arrived where the reply leaves.
    let down = |o: IfIndex| link_down.get(usize::from(o)).copied().unwrap_or(false);
    if !out.resolved || !back.resolved || back.oif != iif || down(out.oif) || down(back.oif) {
        return OffloadPlan::Nothing;
    }
    OffloadPlan::Install(out, back)
}

/// When the lower layer last forwarded a packet of one of `e`'s offloaded
/// directions (`used`, asked with the interface `iif` says each arrives
/// on), and whether one of them was a reply: what
/// [`ct::Table::gc_offloaded`] asks before it expires `e`.
fn last_use<K: ct::Key, P: Copy + Default>(
    e: &ct::Entry<K, P>,
    iif: impl Fn(Dir) -> IfIndex,
    mut used: impl FnMut(IfIndex, &K) -> Option<u64>,
) -> Option<(ct::Instant, bool)> {
    let mut last: Option<u64> = None;
    let mut replied = false;
    for dir in [Dir::Original, Dir::Reply] {
        if e.is_offloaded(dir) {
            if let Some(t) = used(iif(dir), &e.key(dir)) {
                last = Some(last.map_or(t, |l| l.max(t)));
                replied |= dir == Dir::Reply;
            }
        }
    }
    last.map(|t| (instant(t), replied))
}

/// Queue the removal of `e`'s offloaded directions. `false` when the queue
/// overflowed into a `Clear` (the caller clears every entry's marks).
fn offload_removals<K: OffloadKey>(
    q: Option<&mut OffloadQueue>,
    e: &ct::Entry<K, K::Info>,
    adj: &[Adjacency],
) -> bool {
    let Some(q) = q else {
        return true;
    };
    let mut ok = true;
    for dir in [Dir::Original, Dir::Reply] {
        if e.is_offloaded(dir) {
            ok &= q.push_must(K::remove(offload_iif(e, adj, dir), e.key(dir)));
        }
    }
    ok
}

/// The `ct timeout set` a later hook met wins over an earlier one's (each
/// runs on the unconfirmed connection in turn, as in the kernel).
#[inline]
pub(crate) fn later_ct_timeout(earlier: u8, later: u8) -> u8 {
    if later != 0 {
        later
    } else {
        earlier
    }
}

/// Give the new connection `id` the timeout policy in slot `slot` (see
/// [`crate::ct_timeout`]). A policy of another protocol than the
/// connection's is ignored, as in the kernel.
#[cold]
#[inline(never)]
pub(crate) fn give_ct_timeout<K: ct::Key, P: Copy + Default>(
    table: &mut ct::Table<K, P>,
    id: ct::EntryId,
    slot: u8,
    now: ct::Instant,
) {
    let proto = table.entry(id).proto();
    if install_ct_timeout(table, slot, proto) {
        table.apply_timeout_policy(id, slot, now);
    }
}

/// Make sure `table` holds the policy of slot `slot` (the first
/// connection that gets a slot puts its policy in the table; no
/// allocation: the table reserved room for every slot). A slot the process
/// has given another policy since (`crate::ct_timeout`: only once no
/// connection follows it) has its timers replaced. False, changing
/// nothing, when the process has no policy in that slot or it is for
/// another protocol than `proto`.
pub(crate) fn install_ct_timeout<K: ct::Key, P: Copy + Default>(
    table: &mut ct::Table<K, P>,
    slot: u8,
    proto: u8,
) -> bool {
    let Some(p) = crate::ct_timeout::get(slot).filter(|p| p.proto == proto) else {
        return false;
    };
    if table.timeout_policy(slot) != Some(&p.policy) {
        table.set_timeout_policy(slot, &p.policy);
    }
    true
}

fn instant(now_ns: u64) -> ct::Instant {
    ct::Instant::from_millis(now_ns / 1_000_000)
}

#[inline]
fn dir_index(d: Dir) -> usize {
    match d {
        Dir::Original => 0,
        Dir::Reply => 1,
    }
}

#[inline]
fn l4_event(d: &Dissect) -> L4Event {
    match d.l4 {
        L4::Tcp { flags, .. } => L4Event::Tcp(TcpFlags(flags)),
        L4::Udp { .. } => L4Event::Udp,
        L4::IcmpQuery { ty, .. } => L4Event::Icmp {
            request: icmp_is_query_request(false, ty),
        },
        _ => L4Event::Other,
    }
}

/// The drop reason for a refusing verdict, `None` for accept.
fn refused(v: Verdict) -> Option<DropReason> {
    match v {
        Verdict::Accept => None,
        Verdict::Drop => Some(DropReason::PolicyDrop),
        Verdict::Reject(_) => Some(DropReason::PolicyReject),
    }
}

fn nat_drop(e: NatError) -> DropReason {
    match e {
        NatError::SubscriberLimit | NatError::BlockLimit => DropReason::NatSubscriberLimit,
        _ => DropReason::NatExhausted,
    }
}

fn policy_packet(
    iif: IfIndex,
    key: &FlowKey4,
    d: &Dissect,
    ct: CtState,
    buf: &[u8],
) -> PolicyPacket {
    let (tcp_flags, icmp) = match d.l4 {
        L4::Tcp { flags, .. } => (flags, (0, 0)),
        L4::IcmpQuery { ty, code, .. }
        | L4::IcmpError { ty, code, .. }
        | L4::IcmpOther { ty, code } => (0, (ty, code)),
        _ => (0, (0, 0)),
    };
    let (len, ttl) = match d.net {
        Net::Ipv4 { total_len, ttl, .. } => (total_len, ttl),
        _ => (0, 0),
    };
    PolicyPacket {
        iif,
        oif: None,
        family: 4,
        ttl,
        df: buf
            .get(usize::from(d.l3_off) + 6)
            .is_some_and(|b| b & 0x40 != 0),
        tos: buf.get(usize::from(d.l3_off) + 1).copied().unwrap_or(0),
        pkttype: pkttype(buf),
        // The worker's: `Worker::addr_types4`.
        daddr_type: 0,
        saddr_type: 0,
        ether: frame_macs(buf),
        ct_dir: 0,
        // The worker's: `Worker::addr_types4`.
        rpf: (true, true),
        src: u128::from(key.src),
        dst: u128::from(key.dst),
        proto: key.proto,
        sport: key.sport,
        dport: key.dport,
        tcp_flags,
        icmp,
        ct,
        ct_mark: 0,
        mark: 0,
        ct_status: 0,
        len,
        now_ms: 0,
        wall_ms: 0,
        ct_reply: conn4(&key.reversed()),
        conn: conn4(key),
    }
}

/// Whether a connection in state `s` stays in (or may join) a flowtable
/// with a packet of TCP flags `flags`: UDP and other protocols always, TCP
/// while ESTABLISHED and the packet has neither FIN nor RST
/// (`nft_flow_offload`, `nf_flow_offload_tcp_state`).
fn flow_continues(s: ct::ProtoState, flags: u8) -> bool {
    match s {
        ct::ProtoState::Tcp(t) => t == ct::TcpState::Established && flags & 0x05 == 0,
        _ => true,
    }
}

/// A TCP connection in TIME_WAIT or CLOSE: one `ct count` no longer counts
/// (the kernel's `nf_conncount` `already_closed`).
fn closed_state(s: ct::ProtoState) -> bool {
    matches!(
        s,
        ct::ProtoState::Tcp(ct::TcpState::TimeWait | ct::TcpState::Close)
    )
}

/// Connection `k` as the policy counts it (`ct count`).
fn conn4(k: &FlowKey4) -> ConnTuple {
    ConnTuple {
        src: u128::from(k.src),
        dst: u128::from(k.dst),
        sport: k.sport,
        dport: k.dport,
        proto: k.proto,
        family: 4,
    }
}

/// The identity of the IPv4 datagram at `l3` as received (kept out of the
/// fast path: only first fragments get here).
fn datagram_id(buf: &[u8], l3: usize, proto: u8) -> Option<frag::DatagramId> {
    Some(frag::DatagramId {
        src: read32(buf, l3 + 12)?,
        dst: read32(buf, l3 + 16)?,
        proto,
        ident: read16(buf, l3 + 4)?,
    })
}

/// The frame's (source, destination) MAC addresses, first byte most
/// significant.
fn frame_macs(buf: &[u8]) -> (u64, u64) {
    let mac = |r: core::ops::Range<usize>| {
        buf.get(r)
            .map_or(0, |b| b.iter().fold(0u64, |v, x| v << 8 | u64::from(*x)))
    };
    (mac(6..12), mac(0..6))
}

/// `meta pkttype` of the frame in `buf` (one that reached the policy is to
/// the interface or to a group): 0 host, 1 broadcast, 2 multicast.
fn pkttype(buf: &[u8]) -> u8 {
    match buf.get(..6) {
        Some([0xff, 0xff, 0xff, 0xff, 0xff, 0xff]) => 1,
        _ if is_group(buf) => 2,
        _ => 0,
    }
}

/// `ct status` of a confirmed connection (netfilter's `IPS_*` bits):
/// IPS_CONFIRMED, plus IPS_SEEN_REPLY and IPS_ASSURED as they hold. The
/// NAT bits are the caller's.
fn ct_status(seen_reply: bool, assured: bool) -> u32 {
    0x8 | if seen_reply { 0x2 } else { 0 } | if assured { 0x4 } else { 0 }
}

/// [`Worker::l2_dest`]: the frame is to the interface's own MAC address.
const L2_HOST: u8 = 0;
/// To a group address (broadcast or multicast: the I/G bit is set).
const L2_GROUP: u8 = 1;
/// To another station.
const L2_OTHER: u8 = 2;

/// Applies the `tcp option maxseg size set` statements `mss` to the TCP
/// segment at `l4` of the frame (`len` bytes): its MSS option is lowered to
/// their limit. `rt_mtu` is the smaller MTU of the routes of the two
/// directions, `hdrs` the IP and TCP header bytes `rt mtu` takes off it
/// (40 for IPv4, 60 for IPv6; the kernel's `get_tcpmss`, which gives 536
/// when the MTU is not larger).
#[cold]
#[inline(never)]
fn clamp_mss(buf: &mut [u8], len: usize, l4: usize, mss: MssClamp, rt_mtu: u16, hdrs: u16) {
    let rt = if rt_mtu > hdrs { rt_mtu - hdrs } else { 536 };
    if let (Some(limit), Some(seg)) = (mss.limit(rt), buf.get_mut(l4..len)) {
        sluice_wire::tcp::clamp_mss(seg, limit);
    }
}

/// The low 48 bits of a `u64`.
const MAC48: u64 = (1 << 48) - 1;

/// A MAC address as [`Worker::l2_dest`] compares it.
/// The IPv4 route table: the connected routes of `ifaces`' addresses, then
/// the static `routes` (each naming one of `ifaces`).
fn route_table4(ifaces: &[Interface], routes: &[Route4]) -> Result<RouteTable4, EngineError> {
    let mut t = RouteTable4::new();
    for (i, ifc) in ifaces.iter().enumerate() {
        for &(a, len) in &ifc.addrs {
            t.add(Route4 {
                net: u32::from(a),
                len,
                oif: i as IfIndex,
                via: None,
            });
        }
    }
    for r in routes {
        if usize::from(r.oif) >= ifaces.len() {
            return Err(EngineError::RouteInterface {
                net: Ipv4Addr::from(r.net),
                len: r.len,
                oif: r.oif,
                count: ifaces.len(),
            });
        }
        t.add(*r);
    }
    Ok(t)
}

fn mac48(m: &[u8; 6]) -> u64 {
    let mut w = [0u8; 8];
    w[..6].copy_from_slice(m);
    u64::from_le_bytes(w)
}

/// Whether the frame in `buf` went to a link-layer group address.
fn is_group(buf: &[u8]) -> bool {
    buf.first().is_some_and(|b| b & 1 != 0)
}

/// The IPv4 addresses the kernel's input routing (`ip_route_input_slow`)
/// refuses, in its order: a multicast destination (the engine joins no
/// group and routes no multicast), a multicast or limited-broadcast source;
/// then, unless the packet is a broadcast to the limited broadcast address
/// (or from and to `0.0.0.0`), a source in `0.0.0.0/8`, a destination in
/// `0.0.0.0/8`, a destination or else a source in `127.0.0.0/8`.
fn martian4(src: u32, dst: u32) -> Option<DropReason> {
    let multicast = |a: u32| a >> 28 == 0xe;
    if multicast(dst) {
        return Some(DropReason::Ipv4Multicast);
    }
    if multicast(src) || src == u32::MAX {
        return Some(DropReason::MartianSource);
    }
    if dst == u32::MAX || (src == 0 && dst == 0) {
        return None;
    }
    if src >> 24 == 0 {
        return Some(DropReason::MartianSource);
    }
    if dst >> 24 == 0 || dst >> 24 == 127 {
        return Some(DropReason::MartianDestination);
    }
    if src >> 24 == 127 {
        return Some(DropReason::MartianSource);
    }
    None
}

fn read16(b: &[u8], off: usize) -> Option<u16> {
    b.get(off..off + 2)
        .map(|s| u16::from_be_bytes([s[0], s[1]]))
}

fn read32(b: &[u8], off: usize) -> Option<u32> {
    b.get(off..off + 4)
        .map(|s| u32::from_be_bytes([s[0], s[1], s[2], s[3]]))
}

fn write16(b: &mut [u8], off: usize, v: u16) {
    if let Some(s) = b.get_mut(off..off + 2) {
        s.copy_from_slice(&v.to_be_bytes());
    }
}

fn write32(b: &mut [u8], off: usize, v: u32) {
    if let Some(s) = b.get_mut(off..off + 4) {
        s.copy_from_slice(&v.to_be_bytes());
    }
}

fn swap_macs(buf: &mut [u8], my_mac: [u8; 6]) {
    if let Some(m) = buf.get_mut(0..12) {
        let mut src = [0u8; 6];
        src.copy_from_slice(&m[6..12]);
        m[..6].copy_from_slice(&src);
        m[6..].copy_from_slice(&my_mac);
    }
}

#[cfg(test)]
mod untag_tests {
    use super::{untag, Tagging};

    /// A 60-byte frame: MACs, then `tags` (TPID, TCI), then IPv4 (0x0800).
    fn frame(tags: &[(u16, u16)]) -> (Vec<u8>, usize) {
        let mut b = vec![0xee; 12];
        for (tpid, tci) in tags {
            b.extend_from_slice(&tpid.to_be_bytes());
            b.extend_from_slice(&tci.to_be_bytes());
        }
        b.extend_from_slice(&[0x08, 0x00, 0x45]);
        b.resize(60, 0x11);
        let n = b.len();
        b.resize(2048, 0x81);
        (b, n)
    }

    #[test]
    fn untag_follows_the_kernels_receive_rule() {
        let (mut b, n) = frame(&[]);
        assert_eq!(untag(&mut b, n), Tagging::Untagged);
        let (mut b, n) = frame(&[(0x8100, 0xe000)]);
        assert_eq!(untag(&mut b, n), Tagging::Stripped(56));
        assert_eq!(&b[12..15], &[0x08, 0x00, 0x45]);
        let (mut b, n) = frame(&[(0x88a8, 0), (0x8100, 0x1000)]);
        assert_eq!(untag(&mut b, n), Tagging::Stripped(52));
        assert_eq!(&b[12..15], &[0x08, 0x00, 0x45]);
        for tags in [
            &[(0x8100u16, 1u16)][..],
            &[(0x88a8, 7)],
            &[(0x88a8, 0), (0x8100, 100)],
            &[(0x8100, 0), (0x8100, 0), (0x8100, 0)],
        ] {
            let (mut b, n) = frame(tags);
            assert_eq!(untag(&mut b, n), Tagging::Tagged, "{tags:x?}");
        }
        // A tag cut short, and a length beyond the buffer: no panic.
        let (mut b, _) = frame(&[(0x8100, 0)]);
        assert_eq!(untag(&mut b, 16), Tagging::Tagged);
        assert_eq!(untag(&mut b, 13), Tagging::Untagged);
        let mut short = vec![0u8; 14];
        short[12] = 0x81;
        assert_eq!(untag(&mut short, 100), Tagging::Tagged);
    }
}
