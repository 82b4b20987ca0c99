//! Per-worker NAT state: port allocation, mapping tables, filtering,
//! pairing and per-subscriber accounting. One [`WorkerNat`] per worker; it
//! is never shared, so nothing here locks.
//!
//! # Session references
//!
//! A conntrack entry is two keys: `orig` (the first packet as it arrived)
//! and `reply` (the translated tuple, reversed). This module never stores
//! sessions. Instead, it derives the mappings a session holds from the two
//! keys, in one function used both when the session is created and when it
//! is released, so the reference counts cannot drift:
//!
//! - source side: if `(orig.src, orig.sport) != (reply.dst, reply.dport)`
//!   and the mapping with external endpoint `(reply.dst, reply.dport)` has
//!   internal endpoint `(orig.src, orig.sport)`, the session holds it;
//! - destination side: if `(orig.dst, orig.dport) != (reply.src,
//!   reply.sport)` and the mapping with external endpoint `(orig.dst,
//!   orig.dport)` has internal endpoint `(reply.src, reply.sport)`, the
//!   session holds it (inbound sessions through a mapping, and the far end
//!   of a hairpinned session).
//!
//! A mapping never maps an endpoint to itself, so a session that was not
//! translated holds nothing and releasing it is a no-op.
//!
//! # What the engine must guarantee
//!
//! - Inbound packets (and `release` of their sessions) go to the worker
//!   given by [`crate::owner_of`] of the external port.
//! - RFC 4787 REQ-1 and REQ-2 hold per worker. They hold for the whole
//!   gateway only if all outbound packets of one internal address reach the
//!   same worker (steer by source address, as VPP NAT44-EI does). Pairing
//!   itself is a keyed hash ([`NatConfig::paired_addr`]), identical on
//!   every worker.
//! - Hairpinning finds mappings held by this worker only.

use core::net::Ipv4Addr;

use hashbrown::HashMap;
use sluice_wire::flow::{proto, FlowKey4};

use crate::config::{
    pair_index, FilteringBehaviour, MappingBehaviour, NatConfig, Pooling, Translation,
};
use crate::error::{ConfigError, NatError};
use crate::event::{NatEvent, NatEventSink, NoopSink};
use crate::intmap::{self, IntKey, IntMap};

mod restore;
use crate::ports::{owner_of, PortSlice, PortSpace};
pub use restore::RestoreRefused;

/// Protocols with a port (or identifier) space: TCP, UDP, ICMP.
const PROTOS: usize = 3;

#[inline]
fn proto_index(p: u8) -> Option<usize> {
    match p {
        proto::TCP => Some(0),
        proto::UDP => Some(1),
        proto::ICMP => Some(2),
        _ => None,
    }
}

/// The external realm a mapping lives in: a pool, or the address of a
/// masquerading egress interface.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Realm {
    Pool(u16),
    Masq(u32),
}

/// Internal side of a mapping. `dst_*` are zero under endpoint-independent
/// mapping.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct MapKey {
    realm: Realm,
    proto: u8,
    int_addr: u32,
    int_port: u16,
    dst_addr: u32,
    dst_port: u16,
}

/// External side of a mapping; unique per worker (and, by the port split,
/// per gateway).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct ExtKey {
    proto: u8,
    addr: u32,
    port: u16,
}

// `Hash` by hand for the two mapping keys: packing the fields into a few
// words hashes in 2-3 writes instead of one write per field (and per enum
// tag) as `derive(Hash)` does; these are hashed several times for every
// new connection. Equal keys pack to equal words, as `Hash` requires.
impl core::hash::Hash for ExtKey {
    #[inline]
    fn hash<H: core::hash::Hasher>(&self, state: &mut H) {
        state.write_u64(
            (u64::from(self.proto) << 48) | (u64::from(self.port) << 32) | u64::from(self.addr),
        );
    }
}

impl core::hash::Hash for MapKey {
    #[inline]
    fn hash<H: core::hash::Hasher>(&self, state: &mut H) {
        let realm = match self.realm {
            Realm::Pool(p) => u64::from(p),
            Realm::Masq(a) => (1 << 32) | u64::from(a),
        };
        state.write_u64(realm | (u64::from(self.proto) << 40));
        state.write_u64((u64::from(self.int_addr) << 32) | u64::from(self.dst_addr));
        state.write_u32((u32::from(self.int_port) << 16) | u32::from(self.dst_port));
    }
}

/// Which bitmap an external port came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Space {
    // `u32`, not `usize`: this sits in every mapping, and 8 bytes less per
    // mapping is 16 bytes less per `by_ext` bucket.
    Pool {
        pool: u16,
        map: u32,
    },
    Masq {
        slot: u16,
        map: u32,
    },
    /// A mapping retired by a pool change ([`WorkerNat::set_pools`]): its
    /// external address or port left the pools. Its sessions count lives
    /// in [`WorkerNat`]'s `retired`, not in `by_int`.
    Retired,
}

/// A mapping retired by a pool change: it serves the sessions it has until
/// the last ends, and no new session (no outbound connection, inbound
/// session or hairpin) takes it.
#[derive(Clone, Copy, Debug)]
struct Retired {
    sessions: u32,
    /// Its port block (external address, first port) when it came from
    /// one: the block's release is logged when its last retired mapping
    /// goes ([`WorkerNat`]'s `retired_blocks`).
    block: Option<(u32, u16)>,
    /// Its port, taken in a bitmap of the current configuration so that
    /// no allocation hands it out (outside any port block's count: see
    /// [`take_raw`]), freed with it.
    hold: Option<Space>,
}

/// A retired port block: its subscriber, last port and retired mappings.
#[derive(Clone, Copy, Debug)]
struct RetiredBlock {
    sub: u32,
    last: u16,
    mappings: u32,
}

/// What [`WorkerNat::set_pools`] did with the live mappings.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolChange {
    /// Mappings whose external address and port are still in a pool: they
    /// stay as they were (now in that pool).
    pub kept: u64,
    /// Mappings whose address or port left the pools: retired (they serve
    /// their sessions until the last ends; no new session takes them).
    pub retired: u64,
}

#[derive(Clone, Copy, Debug)]
struct Mapping {
    key: MapKey,
    space: Space,
}

impl MapKey {
    /// The key of `by_int` ([`IntMap`]).
    #[inline]
    fn int_key(&self) -> IntKey {
        let (kind, realm) = match self.realm {
            Realm::Pool(p) => (intmap::POOL, u32::from(p)),
            Realm::Masq(a) => (intmap::MASQ, a),
        };
        IntKey {
            kind,
            realm,
            proto: self.proto,
            int_addr: self.int_addr,
            int_port: self.int_port,
            dst_addr: self.dst_addr,
            dst_port: self.dst_port,
        }
    }

    /// The mapping key of a `by_int` key.
    #[cfg(test)]
    fn of_int(k: &IntKey) -> Self {
        Self {
            realm: if k.kind == intmap::POOL {
                Realm::Pool(k.realm as u16)
            } else {
                Realm::Masq(k.realm)
            },
            proto: k.proto,
            int_addr: k.int_addr,
            int_port: k.int_port,
            dst_addr: k.dst_addr,
            dst_port: k.dst_port,
        }
    }
}

/// A remote endpoint that a mapping's internal endpoint has talked to
/// (address-dependent filtering uses port 0).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct PermitKey {
    ext: ExtKey,
    raddr: u32,
    rport: u16,
}

#[derive(Clone, Debug)]
struct PoolState {
    addrs: Vec<u32>,
    space: PortSpace,
    /// Port block allocation, when on.
    blocks: Option<Blocks>,
}

/// The port blocks of one pool on one worker (port block allocation,
/// [`NatConfig::port_block_size`]). Block `b` is block `b % per_addr` of
/// address `b / per_addr`: the dense indices `j * size .. (j + 1) * size`
/// of this worker's share of the pool's port range ([`PortSlice`]), in
/// all three protocols' bitmaps. A held block belongs to one subscriber;
/// a free block has no port in use in any protocol, because on a pool with
/// blocks every port is taken through a block.
#[derive(Clone, Debug)]
struct Blocks {
    /// Ports per block.
    size: u32,
    /// Blocks per address (the share's remainder is never used).
    per_addr: u32,
    /// Per block: the subscriber holding it, if any.
    owner: Vec<Option<u32>>,
    /// Per block: its ports in use, all protocols.
    used: Vec<u32>,
    /// Per block: where the next allocation in it starts (next-fit, so a
    /// port just freed is the last reused).
    next: Vec<u32>,
    /// Per address: free blocks, and the next-fit cursor over them.
    free: Vec<u32>,
    cursor: Vec<u32>,
    /// Subscriber -> the blocks it holds, oldest first.
    by_sub: HashMap<u32, Vec<u32>>,
    /// Blocks one subscriber may hold (0: no limit).
    max: u16,
    /// Deterministic NAT: (first subscriber, subscribers); subscriber
    /// `first + i` owns block `i` and no other.
    det: Option<(u32, u64)>,
}

impl Blocks {
    /// Keep the blocks of the addresses `to` keeps, at their new index
    /// (`to[a]`, only ever lower), then `kept` addresses' worth; the
    /// others' blocks go, and with them from their subscribers' lists.
    fn compact(&mut self, to: &[Option<usize>], kept: usize) {
        let pa = self.per_addr as usize;
        for (oa, na) in to.iter().enumerate() {
            let Some(na) = *na else {
                continue;
            };
            if na == oa {
                continue;
            }
            let (src, dst) = (oa * pa..(oa + 1) * pa, na * pa);
            if src.end <= self.owner.len() {
                self.owner.copy_within(src.clone(), dst);
                self.used.copy_within(src.clone(), dst);
                self.next.copy_within(src, dst);
            }
            if let (Some(&f), Some(&c)) = (self.free.get(oa), self.cursor.get(oa)) {
                if let (Some(x), Some(y)) = (self.free.get_mut(na), self.cursor.get_mut(na)) {
                    *x = f;
                    *y = c;
                }
            }
        }
        self.owner.truncate(kept * pa);
        self.used.truncate(kept * pa);
        self.next.truncate(kept * pa);
        self.free.truncate(kept);
        self.cursor.truncate(kept);
        let per = self.per_addr.max(1);
        self.by_sub.retain(|_, v| {
            v.retain_mut(|b| {
                let j = *b % per;
                match to.get((*b / per) as usize).copied().flatten() {
                    Some(na) => match u32::try_from(na).ok().and_then(|na| na.checked_mul(per)) {
                        Some(base) => {
                            *b = base + j;
                            true
                        }
                        None => false,
                    },
                    None => false,
                }
            });
            !v.is_empty()
        });
    }

    /// Blocks of `size` ports over `per_addr` blocks of each of `addrs`
    /// addresses.
    fn new(size: u16, per_addr: u32, addrs: usize, max: u16, det: Option<(u32, u64)>) -> Self {
        let size = u32::from(size.max(1));
        let n = per_addr as usize * addrs;
        Self {
            size,
            per_addr,
            owner: vec![None; n],
            used: vec![0; n],
            next: vec![0; n],
            free: vec![per_addr; addrs],
            cursor: vec![0; addrs],
            by_sub: HashMap::new(),
            max: if det.is_some() { 1 } else { max },
            det,
        }
    }

    /// Deterministic NAT: the block subscriber `sub` owns; `Err` when it is
    /// outside the prefix. `Ok(None)` when the mode is off.
    fn det_block(&self, sub: u32) -> Result<Option<u32>, NatError> {
        let Some((base, count)) = self.det else {
            return Ok(None);
        };
        let i = u64::from(sub.wrapping_sub(base));
        if i < count {
            u32::try_from(i)
                .map(Some)
                .map_err(|_| NatError::OutsidePrefix)
        } else {
            Err(NatError::OutsidePrefix)
        }
    }

    /// Give block `b` to `sub` if it is free (deterministic NAT, and
    /// [`Self::take`]'s search).
    fn take_exact(&mut self, b: u32, sub: u32) -> bool {
        let ai = self.addr_of(b);
        match self.owner.get_mut(b as usize) {
            Some(o @ None) => {
                *o = Some(sub);
                if let Some(f) = self.free.get_mut(ai) {
                    *f -= 1;
                }
                self.by_sub.entry(sub).or_default().push(b);
                true
            }
            _ => false,
        }
    }

    /// The dense index range of block `b`.
    fn range(&self, b: u32) -> (u32, u32) {
        let j = b % self.per_addr.max(1);
        (j * self.size, (j + 1) * self.size)
    }

    /// The address index of block `b`.
    fn addr_of(&self, b: u32) -> usize {
        (b / self.per_addr.max(1)) as usize
    }

    /// The block holding dense index `idx` of address `ai`.
    fn block_of(&self, ai: usize, idx: u32) -> u32 {
        ai as u32 * self.per_addr + idx / self.size
    }

    /// Give a free block of address `ai` to `sub` (next-fit).
    fn take(&mut self, ai: usize, sub: u32) -> Option<u32> {
        if self.free.get(ai).copied().unwrap_or(0) == 0 {
            return None;
        }
        let start = self.cursor.get(ai).copied().unwrap_or(0);
        for k in 0..self.per_addr {
            let j = (start + k) % self.per_addr;
            let b = ai as u32 * self.per_addr + j;
            if self.take_exact(b, sub) {
                if let Some(c) = self.cursor.get_mut(ai) {
                    *c = (j + 1) % self.per_addr;
                }
                return Some(b);
            }
        }
        None
    }

    /// Block `b` is empty: free it. Returns its subscriber.
    fn give_back(&mut self, b: u32) -> Option<u32> {
        let sub = self.owner.get_mut(b as usize)?.take()?;
        let ai = self.addr_of(b);
        if let Some(f) = self.free.get_mut(ai) {
            *f += 1;
        }
        if let Some(n) = self.next.get_mut(b as usize) {
            *n = 0;
        }
        if let hashbrown::hash_map::Entry::Occupied(mut e) = self.by_sub.entry(sub) {
            e.get_mut().retain(|&x| x != b);
            if e.get().is_empty() {
                e.remove();
            }
        }
        Some(sub)
    }

    /// Forget every holder (flush); the bitmaps are reset by the caller.
    fn reset(&mut self) {
        self.owner.fill(None);
        self.used.fill(0);
        self.next.fill(0);
        self.free.fill(self.per_addr);
        self.by_sub.clear();
    }
}

#[derive(Clone, Copy, Debug, Default)]
struct MasqSlot {
    addr: Option<u32>,
    mappings: u32,
}

/// One mapping as reported to the control plane.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MappingInfo {
    /// IP protocol number.
    pub proto: u8,
    /// Internal address.
    pub int_addr: Ipv4Addr,
    /// Internal port or ICMP identifier.
    pub int_port: u16,
    /// External address.
    pub ext_addr: Ipv4Addr,
    /// External port or ICMP identifier.
    pub ext_port: u16,
    /// Sessions holding the mapping.
    pub sessions: u32,
    /// Retired by a pool change ([`WorkerNat::set_pools`]): it serves its
    /// sessions until the last ends, and takes no new one.
    pub retired: bool,
}

/// Counters of one worker.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NatStats {
    /// Mappings alive now.
    pub mappings: u64,
    /// Sessions alive now that hold at least one mapping (static DNAT
    /// sessions hold none).
    pub sessions: u64,
    /// Internal addresses holding at least one session.
    pub subscribers: u64,
    /// Mappings created since start.
    pub mappings_created: u64,
    /// Mappings removed since start.
    pub mappings_removed: u64,
    /// Translations refused for lack of ports.
    pub pool_exhausted: u64,
    /// Sessions refused by the per-subscriber limit.
    pub subscriber_limit: u64,
    /// Inbound packets refused by the filtering behaviour.
    pub filtered: u64,
    /// Hairpinned sessions created.
    pub hairpins: u64,
    /// Port blocks held now (port block allocation).
    pub blocks: u64,
    /// Port blocks handed to subscribers since start.
    pub blocks_allocated: u64,
    /// Port blocks freed since start.
    pub blocks_released: u64,
    /// Translations refused because the subscriber held its maximum of
    /// blocks and they were full.
    pub block_limit: u64,
    /// Deterministic NAT: translations refused because the source was
    /// outside the subscriber prefix.
    pub outside_prefix: u64,
    /// Mappings alive now that a pool change retired (their address or
    /// port left the pools; they serve their sessions until the last ends).
    pub retired: u64,
}

impl NatStats {
    /// Add another worker's counters (the gateway's totals).
    pub fn merge(&mut self, o: &NatStats) {
        self.mappings += o.mappings;
        self.sessions += o.sessions;
        self.subscribers += o.subscribers;
        self.mappings_created += o.mappings_created;
        self.mappings_removed += o.mappings_removed;
        self.pool_exhausted += o.pool_exhausted;
        self.subscriber_limit += o.subscriber_limit;
        self.filtered += o.filtered;
        self.hairpins += o.hairpins;
        self.blocks += o.blocks;
        self.blocks_allocated += o.blocks_allocated;
        self.blocks_released += o.blocks_released;
        self.block_limit += o.block_limit;
        self.outside_prefix += o.outside_prefix;
        self.retired += o.retired;
    }
}

/// NAT state of one worker. `S` receives mapping events.
#[derive(Debug)]
pub struct WorkerNat<S = NoopSink> {
    worker: u16,
    workers: u16,
    mapping: MappingBehaviour,
    filtering: FilteringBehaviour,
    pooling: Pooling,
    hairpinning: bool,
    max_sessions: u32,
    seed: u64,
    /// The pools' states by *slot*: a pool keeps its slot while a change
    /// keeps it ([`Self::set_pools`]), so that its mappings (whose realm
    /// and space name the slot) need no renumbering when other pools come
    /// or go; a slot whose pool left holds a placeholder without
    /// addresses until a new pool takes it.
    pools: Vec<PoolState>,
    /// The configuration's pool `j` is in slot `slot_of[j]`.
    slot_of: Vec<u16>,
    /// External pool address -> (slot, address index).
    pool_addr: HashMap<u32, (u16, usize)>,
    /// One bit per pool address ([`addr_bit`]): most addresses that are no
    /// pool address (the destination of every new outbound connection) are
    /// told apart without a lookup in `pool_addr`.
    pool_bits: u64,
    masq_slots: Vec<MasqSlot>,
    masq_space: PortSpace,
    /// Internal side -> external endpoint and the sessions holding the
    /// mapping. The count lives here, not in [`Mapping`], so that the first
    /// packet of an outbound connection through an existing mapping (every
    /// connection after a host's first from that port) costs one lookup,
    /// which the engine can prefetch ([`Self::prefetch_outbound`]).
    /// Releasing a session, at expiry rather than on a packet's path, pays
    /// the `by_ext` lookup as well.
    by_int: IntMap,
    /// `griddle`'s map, not `hashbrown`'s: it grows incrementally (a few
    /// entries moved per insert), where `hashbrown` re-inserts everything
    /// in the one insert that fills it, which paused the worker 37-78 ms
    /// at 0.9-1.8 M mappings (`examples/growth.rs`).
    by_ext: griddle::HashMap<ExtKey, Mapping>,
    /// Per slot, the mappings of `by_ext` whose port is in its pool's
    /// bitmap (`Space::Pool`): a pool change tells without a scan which
    /// pools it drops have mappings to move, and what it keeps
    /// ([`Self::set_pools`]).
    slot_mappings: Vec<u64>,
    /// Mappings retired by a pool change, by external endpoint.
    retired: HashMap<ExtKey, Retired>,
    /// Port blocks of retired mappings, by (external address, first port).
    retired_blocks: HashMap<(u32, u16), RetiredBlock>,
    /// Sessions per subscriber. A `hashbrown` map: it pauses the worker
    /// when it doubles (23 ms at 1.8 M subscribers on one worker,
    /// `examples/growth.rs 2000000 1`), but it is read and written for
    /// every session, and `griddle`'s map cost `sluice bench nat44` 3 % of
    /// its set-up rate (eight pairs, 2026-11-25).
    subscribers: HashMap<u32, u32>,
    /// Sessions per permit (address- or address-and-port-dependent
    /// filtering): a `griddle` map, as `by_ext`, since it holds about one
    /// key per connection, and `hashbrown` re-inserting them all when full
    /// paused the worker 55 ms at 1.8 M (`examples/growth.rs 2000000 16
    /// address`; now 16 ms, most of it the allocator returning the
    /// previous table's memory to the kernel).
    permits: griddle::HashMap<PermitKey, u32>,
    stats: NatStats,
    sink: S,
    /// The configuration the pools were built from (for
    /// [`Self::set_pools`]).
    config: NatConfig,
    /// Port blocks: the range of every address that has been a pool
    /// address ([`NatConfig::pool_change`]).
    seen: crate::config::SeenRanges,
    /// The last shadow pool number given ([`Self::set_pools`]), counting
    /// down from `u16::MAX` (no configuration has that many pools).
    shadow: u16,
}

impl<S: NatEventSink> WorkerNat<S> {
    /// Build worker `worker`'s state. Every port bitmap is allocated here;
    /// nothing in the port allocator allocates afterwards.
    pub fn new(config: &NatConfig, worker: u16, sink: S) -> Result<Self, ConfigError> {
        config.validate()?;
        if worker >= config.workers {
            return Err(ConfigError::WorkerOutOfRange);
        }
        let pool_addr = pool_index(config)?;
        let pools: Vec<PoolState> = config
            .pools
            .iter()
            .map(|p| PoolState::new(config, p, worker))
            .collect();
        let slot_of = (0..pools.len())
            .map(|i| u16::try_from(i).map_err(|_| ConfigError::TooLarge))
            .collect::<Result<Vec<_>, _>>()?;
        let slots = usize::from(config.masquerade_slots);
        let masq_slice = PortSlice::new(&config.masquerade_ports, worker, config.workers);
        let cap = config.capacity_hint;
        let filtering = config.filtering;
        let permit_cap = if filtering == FilteringBehaviour::EndpointIndependent {
            0
        } else {
            cap
        };
        Ok(Self {
            worker,
            workers: config.workers,
            mapping: config.mapping,
            filtering,
            pooling: config.pooling,
            hairpinning: config.hairpinning,
            max_sessions: config.max_sessions_per_subscriber,
            seed: config.pairing_seed,
            pools,
            slot_of,
            pool_bits: pool_addr.keys().fold(0, |b, &a| b | addr_bit(a)),
            pool_addr,
            masq_slots: vec![MasqSlot::default(); slots],
            masq_space: PortSpace::new(masq_slice, slots * PROTOS),
            by_int: IntMap::with_capacity(cap),
            by_ext: griddle::HashMap::with_capacity(cap),
            slot_mappings: vec![0; config.pools.len()],
            retired: HashMap::new(),
            retired_blocks: HashMap::new(),
            subscribers: HashMap::with_capacity(cap / 4),
            permits: griddle::HashMap::with_capacity(permit_cap),
            stats: NatStats::default(),
            sink,
            config: config.clone(),
            seen: {
                let mut seen = crate::config::SeenRanges::new();
                config.note_ranges(&mut seen);
                seen
            },
            shadow: u16::MAX,
        })
    }

    /// Take `next`'s pools while running (a reload's, or a rule update's
    /// new `snat to`). [`NatConfig::pool_change`] says which changes can
    /// be taken; nothing changes when it refuses. Every live mapping whose
    /// external address is in one of the new pools, with its port in that
    /// pool's range, stays as it is (its port, sessions and, with port
    /// blocks, its block), now in that pool; the others are *retired*:
    /// they serve the sessions they have until the last ends, and no new
    /// session (outbound, inbound or hairpinned) takes them. A new
    /// connection of their internal endpoint gets a new mapping. Sessions
    /// themselves live in conntrack and are untouched. O(mappings).
    ///
    /// When two old pools of one internal endpoint's mappings become one,
    /// the second mapping keeps its place under a realm no rule names (a
    /// *shadow* pool number): it serves its sessions, inbound ones too, and
    /// new outbound connections use the first.
    pub fn set_pools(&mut self, next: &NatConfig) -> Result<PoolChange, ConfigError> {
        self.config.pool_change(next, &self.seen)?;
        self.hairpinning = next.hairpinning;
        self.pooling = next.pooling;
        self.max_sessions = next.max_sessions_per_subscriber;
        for p in &mut self.pools {
            if let Some(b) = &mut p.blocks {
                if b.det.is_none() {
                    b.max = next.max_blocks_per_subscriber;
                }
            }
        }
        if self.config.pools == next.pools {
            self.config = next.clone();
            return Ok(PoolChange::default());
        }
        let pool_addr = pool_index(next)?;
        let mut old = core::mem::take(&mut self.pools);
        let blocks = next.port_block_size > 0;
        let mut change = PoolChange::default();
        // A pool whose port range stays and whose new list is some of its
        // addresses, in their order, then new ones keeps its state: the
        // usual changes (addresses appended when a pool runs short, some
        // taken out, pools renumbered by another rule's change) then cost
        // no re-filing of its mappings; the mappings of its addresses that
        // left are retired, the bitmaps and blocks of the others close up
        // (`PoolState::reshape`), new addresses are appended.
        // `lead(op, np)`: `to[a]`, old address index `a`'s new index if it
        // stays (at least one does).
        // (Not when an address it drops is still a pool address: that
        // one's mappings move, which the slow path below does.)
        let lead = |op: &crate::Pool, np: &crate::Pool| -> Option<Vec<Option<usize>>> {
            if op.ports != np.ports {
                return None;
            }
            let at: HashMap<Ipv4Addr, usize> =
                op.addrs.iter().enumerate().map(|(i, a)| (*a, i)).collect();
            let k = np.addrs.iter().take_while(|&a| at.contains_key(a)).count();
            let rest = np.addrs.get(k..).unwrap_or_default();
            if k == 0 || rest.iter().any(|a| at.contains_key(a)) {
                return None;
            }
            let mut to = vec![None; op.addrs.len()];
            let mut last = None;
            for (ni, a) in np.addrs.iter().take(k).enumerate() {
                let oi = *at.get(a)?;
                if last.is_some_and(|l| l >= oi) {
                    return None;
                }
                last = Some(oi);
                *to.get_mut(oi)? = Some(ni);
            }
            let moves = op
                .addrs
                .iter()
                .zip(&to)
                .any(|(a, t)| t.is_none() && pool_addr.contains_key(&u32::from(*a)));
            (!moves).then_some(to)
        };
        // By the old pool's number first: `by_cfg[i]`, the new pool that
        // old pool `i` serves and its `to`.
        let mut by_cfg: Vec<Option<(u16, Vec<Option<usize>>)>> =
            vec![None; self.config.pools.len()];
        for (j, np) in next.pools.iter().enumerate() {
            let free = |i: usize| by_cfg.get(i).is_some_and(Option::is_none);
            let pick = self
                .config
                .pools
                .get(j)
                .filter(|_| free(j))
                .and_then(|op| Some((j, lead(op, np)?)))
                .or_else(|| {
                    self.config
                        .pools
                        .iter()
                        .enumerate()
                        .filter(|&(i, _)| free(i))
                        .find_map(|(i, op)| Some((i, lead(op, np)?)))
                });
            if let (Some((i, to)), Ok(j)) = (pick, u16::try_from(j)) {
                if let Some(r) = by_cfg.get_mut(i) {
                    *r = Some((j, to));
                }
            }
        }
        // Pools live in slots: a reused pool keeps its slot (and so its
        // mappings their realm and space, whatever its new number: a pool
        // put ahead of it costs nothing); a new one takes a slot no old
        // pool used, or a new slot. `slot_of[j]`: new pool `j`'s slot.
        // `reuse[s]`: the pool in slot `s` is reused in place, as new pool
        // `j`, its old address indices going to `to`.
        let mut reuse: Vec<Option<(u16, Vec<Option<usize>>)>> = vec![None; old.len()];
        let mut slot_of: Vec<u16> = vec![0; next.pools.len()];
        let mut pools: Vec<PoolState> = old.iter().map(|_| PoolState::placeholder()).collect();
        for (i, r) in by_cfg.iter_mut().enumerate() {
            if let (Some((j, to)), Some(&slot)) = (r.take(), self.slot_of.get(i)) {
                if let (Some(x), Some(y)) = (
                    reuse.get_mut(usize::from(slot)),
                    slot_of.get_mut(usize::from(j)),
                ) {
                    *x = Some((j, to));
                    *y = slot;
                }
            }
        }
        for (j, np) in next.pools.iter().enumerate() {
            if reuse.iter().flatten().any(|(to, _)| usize::from(*to) == j) {
                continue;
            }
            // A slot that held no pool before this change (none of the
            // mappings being moved names it), else a new one.
            let free = (0..pools.len()).find(|&s| {
                old.get(s).is_some_and(|o| o.addrs.is_empty())
                    && pools.get(s).is_some_and(|p| p.addrs.is_empty())
            });
            let slot = free.unwrap_or(pools.len());
            let state = PoolState::new(next, np, self.worker);
            match pools.get_mut(slot) {
                Some(p) => *p = state,
                None => pools.push(state),
            }
            if let (Some(y), Ok(slot)) = (slot_of.get_mut(j), u16::try_from(slot)) {
                *y = slot;
            }
        }
        // The address index by slot.
        let pool_addr: HashMap<u32, (u16, usize)> = pool_addr
            .into_iter()
            .map(|(a, (j, ai))| (a, (slot_of.get(usize::from(j)).copied().unwrap_or(j), ai)))
            .collect();
        let reused_to = |pool: u16| reuse.get(usize::from(pool)).and_then(Option::as_ref);
        // Where address `ai` of reused slot `pool` goes (`None`: it left).
        let moved_to = |pool: u16, ai: usize| {
            reused_to(pool).and_then(|(_, to)| to.get(ai).copied().flatten())
        };
        // What needs a scan of the mappings: a reused pool that drops
        // addresses (their mappings retire), a pool not reused that has
        // mappings (`slot_mappings`) or a masquerade address that becomes a
        // pool address (their mappings are filed again). Otherwise
        // (addresses appended, pools added, put ahead of others or taken
        // out while they map nothing, settings) no mapping changes and
        // none is visited: the change costs O(pools and addresses, and
        // retired mappings when a pool goes), whatever the mappings.
        // (A reused pool whose addresses do not all keep their index.)
        let shrinks = reuse
            .iter()
            .flatten()
            .any(|(_, to)| to.iter().enumerate().any(|(oi, t)| *t != Some(oi)));
        self.slot_mappings.resize(pools.len(), 0);
        // A pool dropped (its retired mappings' held ports move, below).
        let drops = reuse
            .iter()
            .zip(&old)
            .any(|(r, o)| r.is_none() && !o.addrs.is_empty());
        let refiles = reuse
            .iter()
            .zip(&self.slot_mappings)
            .any(|(r, &count)| r.is_none() && count > 0)
            || self
                .masq_slots
                .iter()
                .any(|s| s.addr.is_some_and(|a| pool_addr.contains_key(&a)));
        // The mappings of a reused pool's addresses that left retire now,
        // while its old state still says which block each was in; those of
        // its addresses that stay take their address's new index, in place.
        let mut gone: Vec<(ExtKey, Mapping)> = Vec::new();
        if shrinks {
            // (Made `Space::Retired` here, in the pass, rather than looked
            // up again one by one; filed as retired below.)
            let counts = &mut self.slot_mappings;
            for (e, m) in self.by_ext.iter_mut() {
                let Space::Pool { pool, map } = m.space else {
                    continue;
                };
                if reused_to(pool).is_none() {
                    continue;
                }
                let ai = map as usize / PROTOS;
                match moved_to(pool, ai) {
                    Some(ni) if ni == ai => {}
                    Some(ni) => {
                        let pi = map as usize % PROTOS;
                        if let Ok(map) = u32::try_from(ni * PROTOS + pi) {
                            m.space = Space::Pool { pool, map };
                        }
                    }
                    None => {
                        gone.push((*e, *m));
                        m.space = Space::Retired;
                        if let Some(c) = counts.get_mut(usize::from(pool)) {
                            *c = c.saturating_sub(1);
                        }
                    }
                }
            }
        }
        self.retired.reserve(gone.len());
        // (Their `by_int` slots are far apart: each one's load is started
        // a few retirements ahead.)
        const AHEAD: usize = 8;
        for (i, &(ext, m)) in gone.iter().enumerate() {
            if let Some((_, next)) = gone.get(i + AHEAD) {
                self.by_int.prefetch_key(&next.key.int_key());
            }
            let sessions = unfile(&mut self.by_int, &m.key);
            let block = match m.space {
                Space::Pool { pool, map } => retired_block(&old, pool, map, ext.port),
                _ => None,
            };
            self.file_retired(ext, sessions, block, None);
            change.retired += 1;
        }
        // Every other mapping with a port in a pool bitmap, or whose
        // address becomes a pool address, is filed again below, one by
        // one. (Its new key never is another moving mapping's old one: a
        // moved mapping's realm is a slot of the new pools, kept or new,
        // never the slot of a pool not kept, and a masquerade mapping keeps
        // its realm. So each leaves `by_int` just before it is filed again,
        // while its slot there is in the cache: the realm is not hashed.)
        let mut moving: Vec<(ExtKey, MapKey)> = Vec::new();
        if refiles {
            for (ext, m) in &self.by_ext {
                let goes = match m.space {
                    Space::Pool { pool, .. } => reused_to(pool).is_none(),
                    Space::Masq { .. } => pool_addr.contains_key(&ext.addr),
                    Space::Retired => false,
                };
                if goes {
                    moving.push((*ext, m.key));
                }
            }
        }
        for (i, r) in reuse.iter().enumerate() {
            let Some((j, to)) = r else {
                continue;
            };
            if let (Some(o), Some(n), Some(np)) = (
                old.get_mut(i),
                pools.get_mut(i),
                next.pools.get(usize::from(*j)),
            ) {
                core::mem::swap(o, n);
                n.reshape(to, &np.addrs);
            }
        }
        // Ports held for mappings retired earlier move with their address:
        // in a reused pool they are where they were; elsewhere taken again
        // in the new bitmap, or no longer held if their address or port
        // left (an allocation that meets one holds it again).
        // (Nothing to do when every pool keeps its addresses.)
        let holds_move = shrinks || drops || refiles;
        if holds_move {
            for (ext, r) in &mut self.retired {
                if let Some(Space::Pool { pool, map }) = r.hold {
                    let ai = map as usize / PROTOS;
                    r.hold = match reused_to(pool) {
                        Some(_) => moved_to(pool, ai)
                            .and_then(|ni| u32::try_from(ni * PROTOS + map as usize % PROTOS).ok())
                            .map(|map| Space::Pool { pool, map }),
                        None => pool_addr
                            .get(&ext.addr)
                            .and_then(|&t| take_raw(&mut pools, t, map, ext.port)),
                    };
                }
            }
        }
        for (i, &(ext, old_key)) in moving.iter().enumerate() {
            if let Some((_, next)) = moving.get(i + AHEAD) {
                self.by_int.prefetch_key(&next.int_key());
            }
            let sessions = unfile(&mut self.by_int, &old_key);
            let Some(m) = self.by_ext.get(&ext).copied() else {
                continue;
            };
            let target = pool_addr.get(&ext.addr).copied();
            let placed = match (m.space, target) {
                (Space::Pool { pool, map }, Some(t)) => {
                    place(&old, &mut pools, (pool, map), t, ext.port)
                }
                // Masquerade to an address that is a pool address now: its
                // port moves to the pool's bitmap, which masquerade to a
                // pool address shares (without port blocks).
                (Space::Masq { map, .. }, Some(t)) if !blocks => {
                    take_raw(&mut pools, t, map, ext.port)
                }
                _ => None,
            };
            let Some(space) = placed else {
                // Retired: its address or port left the pools.
                let (block, hold) = match (m.space, target) {
                    (Space::Pool { pool, map }, _) => {
                        (retired_block(&old, pool, map, ext.port), None)
                    }
                    // Masquerade onto a pool address with port blocks: the
                    // pool's bitmap keeps its port out of every block.
                    (Space::Masq { map, .. }, Some(t)) => {
                        match take_raw(&mut pools, t, map, ext.port) {
                            Some(h) => {
                                self.free_bit(m.space, ext.port);
                                (None, Some(h))
                            }
                            None => (None, Some(m.space)),
                        }
                    }
                    (s, _) => (None, Some(s)),
                };
                self.retire(ext, sessions, block, hold);
                change.retired += 1;
                continue;
            };
            if let Space::Masq { .. } = m.space {
                // Its masquerade bit is given back (the pool's holds it).
                self.free_bit(m.space, ext.port);
            }
            let mut key = MapKey {
                realm: match (m.key.realm, target) {
                    (Realm::Pool(_), Some((np, _))) => Realm::Pool(np),
                    (r, _) => r,
                },
                ..m.key
            };
            while self.by_int.get(&key.int_key()).is_some() {
                // Another old realm of this endpoint is in this pool now.
                self.shadow = self.shadow.wrapping_sub(1);
                key.realm = Realm::Pool(self.shadow);
            }
            self.by_int
                .insert(key.int_key(), (ext.addr, ext.port), sessions);
            self.count_slot(m.space, false);
            self.count_slot(space, true);
            if let Some(x) = self.by_ext.get_mut(&ext) {
                *x = Mapping { key, space };
            }
        }
        // Every mapping left in a pool's bitmap was kept: those of reused
        // pools, and those filed again.
        change.kept = self.slot_mappings.iter().sum();
        next.note_ranges(&mut self.seen);
        self.pool_bits = pool_addr.keys().fold(0, |b, &a| b | addr_bit(a));
        self.pool_addr = pool_addr;
        self.pools = pools;
        self.slot_of = slot_of;
        self.config = next.clone();
        Ok(change)
    }

    /// Retire the mapping of `ext` (out of `by_int` already, `sessions`
    /// its count): its block (address, first port, subscriber, last port)
    /// if it came from one, the port `hold` takes for it.
    fn retire(
        &mut self,
        ext: ExtKey,
        sessions: u32,
        block: Option<(u32, u16, u32, u16)>,
        hold: Option<Space>,
    ) {
        self.file_retired(ext, sessions, block, hold);
        if let Some(x) = self.by_ext.get_mut(&ext) {
            let was = core::mem::replace(&mut x.space, Space::Retired);
            self.count_slot(was, false);
        }
    }

    /// [`Self::retire`] but for the mapping itself, whose space the
    /// caller has made `Space::Retired` (and counted out of its slot):
    /// its count, block and hold filed with the retired ones.
    fn file_retired(
        &mut self,
        ext: ExtKey,
        sessions: u32,
        block: Option<(u32, u16, u32, u16)>,
        hold: Option<Space>,
    ) {
        if let Some((addr, first, sub, last)) = block {
            self.retired_blocks
                .entry((addr, first))
                .or_insert(RetiredBlock {
                    sub,
                    last,
                    mappings: 0,
                })
                .mappings += 1;
        }
        self.retired.insert(
            ext,
            Retired {
                sessions,
                block: block.map(|(a, f, _, _)| (a, f)),
                hold,
            },
        );
    }

    /// Count a mapping of `space` in (`add`) or out of its pool slot's
    /// count (`slot_mappings`; nothing for other spaces).
    fn count_slot(&mut self, space: Space, add: bool) {
        if let Space::Pool { pool, .. } = space {
            if let Some(c) = self.slot_mappings.get_mut(usize::from(pool)) {
                *c = if add { *c + 1 } else { c.saturating_sub(1) };
            }
        }
    }

    /// The configuration the pools come from.
    pub fn config(&self) -> &NatConfig {
        &self.config
    }

    /// This worker's index.
    pub fn worker(&self) -> u16 {
        self.worker
    }

    /// The worker owning external port `ext_port` (see [`crate::owner_of`]).
    pub fn owner_of(&self, ext_port: u16) -> u16 {
        owner_of(ext_port, self.workers)
    }

    /// Counters.
    pub fn stats(&self) -> NatStats {
        let mut s = self.stats;
        s.mappings = self.by_ext.len() as u64;
        s.retired = self.retired.len() as u64;
        s.subscribers = self.subscribers.len() as u64;
        s.blocks = self
            .pools
            .iter()
            .filter_map(|p| p.blocks.as_ref())
            .map(|b| b.by_sub.values().map(|v| v.len() as u64).sum::<u64>())
            .sum();
        s
    }

    /// The event sink.
    pub fn sink(&self) -> &S {
        &self.sink
    }

    /// The event sink, mutably (to drain it).
    pub fn sink_mut(&mut self) -> &mut S {
        &mut self.sink
    }

    /// Slow path: set up the translation of a new connection whose first
    /// packet is `orig` (as on the wire). Returns the reply key (the
    /// translated tuple reversed); the engine inserts `(orig, reply)`.
    /// `egress_addr` is the egress interface's address, used by
    /// [`Translation::Masquerade`].
    ///
    /// With hairpinning on, a packet from inside to a mapped external
    /// endpoint is translated twice (RFC 4787 REQ-9, RFC 5382 REQ-8): its
    /// source to the sender's own external endpoint and its destination to
    /// the mapped internal endpoint. The returned reply key then differs
    /// from `orig` in all four fields.
    pub fn translate_outbound(
        &mut self,
        orig: &FlowKey4,
        kind: &Translation,
        egress_addr: Option<Ipv4Addr>,
    ) -> Result<FlowKey4, NatError> {
        match *kind {
            Translation::Dnat { addr, port } => self.dnat(orig, addr, port),
            Translation::Snat { pool } => {
                let Some(&slot) = self.slot_of.get(usize::from(pool.0)) else {
                    return Err(NatError::UnknownPool);
                };
                self.snat(orig, Realm::Pool(slot))
            }
            Translation::Masquerade => match egress_addr {
                Some(a) if !a.is_unspecified() => self.snat(orig, Realm::Masq(u32::from(a))),
                _ => Err(NatError::NoEgressAddress),
            },
        }
    }

    /// Static destination NAT (port forward): the destination becomes
    /// `addr` and, if given, `port` (ICMP queries keep their identifier).
    /// Returns the reply key. Allocates nothing.
    pub fn dnat(
        &mut self,
        orig: &FlowKey4,
        addr: Ipv4Addr,
        port: Option<u16>,
    ) -> Result<FlowKey4, NatError> {
        let mut t = *orig;
        t.dst = u32::from(addr);
        if let (Some(p), false) = (port, orig.proto == proto::ICMP) {
            t.dport = p;
        }
        let reply = t.reversed();
        self.acquire(orig, &reply);
        Ok(reply)
    }

    /// RFC 4787 REQ-9 / RFC 5382 REQ-8 hairpinning, for a packet `orig`
    /// from an internal host to another mapping's external endpoint that
    /// the engine knows came from the inside. `None` when hairpinning is
    /// off, the protocol is not TCP/UDP, or no mapping of this worker has
    /// that external endpoint. Otherwise the sender is mapped in the same
    /// realm (pool or masquerade address) as the target mapping, and the
    /// reply key has both ends translated, as [`Self::translate_outbound`]
    /// does when a SNAT rule meets a mapped destination.
    pub fn hairpin(&mut self, orig: &FlowKey4) -> Option<Result<FlowKey4, NatError>> {
        if !self.hairpinning || (orig.proto != proto::TCP && orig.proto != proto::UDP) {
            return None;
        }
        let ext = ExtKey {
            proto: orig.proto,
            addr: orig.dst,
            port: orig.dport,
        };
        let realm = self.get_mapping(&ext)?.key.realm;
        Some(self.snat(orig, realm))
    }

    /// An inbound packet `key` (as on the outside wire) missed conntrack.
    /// If it is addressed to a mapping of this worker and the filtering
    /// behaviour admits its source, returns `(orig, reply)` for the new
    /// session (the engine inserts it) and takes a reference on the mapping.
    ///
    /// ICMP queries never open inbound sessions: an inbound echo request is
    /// a new query, not a reply.
    pub fn inbound_new(&mut self, key: &FlowKey4) -> Option<(FlowKey4, FlowKey4)> {
        if key.proto != proto::TCP && key.proto != proto::UDP {
            return None;
        }
        let ext = ExtKey {
            proto: key.proto,
            addr: key.dst,
            port: key.dport,
        };
        let m = self.get_mapping(&ext)?;
        let (int_addr, int_port) = (m.key.int_addr, m.key.int_port);
        if !self.admits(ext, key.src, key.sport) {
            self.stats.filtered += 1;
            return None;
        }
        if !self.has_room(int_addr, None) {
            self.stats.subscriber_limit += 1;
            return None;
        }
        let reply = FlowKey4 {
            src: int_addr,
            sport: int_port,
            dst: key.src,
            dport: key.sport,
            proto: key.proto,
        };
        self.acquire(key, &reply);
        Some((*key, reply))
    }

    /// A conntrack entry with keys `(orig, reply)` (as returned by this
    /// worker) is gone. Drops its references; a mapping whose last session
    /// goes is removed and its port freed. Entries that were not translated
    /// are ignored.
    pub fn release(&mut self, orig: &FlowKey4, reply: &FlowKey4) {
        let refs = self.session_refs(orig, reply);
        if refs.iter().all(Option::is_none) {
            return;
        }
        self.stats.sessions = self.stats.sessions.saturating_sub(1);
        for r in refs.into_iter().flatten() {
            let SessionRef {
                ext,
                subscriber,
                raddr,
                rport,
            } = r;
            if let Some(pk) = self.permit_key(ext, raddr, rport) {
                if let griddle::hash_map::Entry::Occupied(mut e) = self.permits.entry(pk) {
                    *e.get_mut() -= 1;
                    if *e.get() == 0 {
                        e.remove();
                    }
                }
            }
            if let hashbrown::hash_map::Entry::Occupied(mut e) = self.subscribers.entry(subscriber)
            {
                *e.get_mut() -= 1;
                if *e.get() == 0 {
                    e.remove();
                }
            }
            let m = self.by_ext.get(&ext).copied();
            let last = match m.and_then(|m| self.count_of(&ext, &m)) {
                Some(n) => {
                    *n = n.saturating_sub(1);
                    *n == 0
                }
                None => false,
            };
            if last {
                self.remove_mapping(ext);
            }
        }
    }

    /// Flush: forget every mapping and free every port. O(mappings); emits
    /// one `MappingRemoved` per mapping (RFC 6888 REQ-12 logging), or with
    /// port blocks one `BlockReleased` per block. When the sink keeps no
    /// events ([`NatEventSink::keeps_events`]: no NAT log) the state is
    /// reset in bulk instead, with the same counters and the same state
    /// afterwards: O(bitmaps and tables' sizes), not a visit per mapping
    /// (1 M mappings: 41 ms one by one, `examples/pool_change.rs`).
    pub fn clear(&mut self) {
        let n = self.by_ext.len() as u64;
        self.slot_mappings.fill(0);
        if !self.sink.keeps_events() {
            let held: u64 = self
                .pools
                .iter()
                .filter_map(|p| p.blocks.as_ref())
                .map(|b| b.owner.iter().filter(|o| o.is_some()).count() as u64)
                .sum();
            self.stats.blocks_released += held + self.retired_blocks.len() as u64;
            self.by_ext.clear();
            for p in &mut self.pools {
                p.space.reset_all();
            }
            self.masq_space.reset_all();
        } else {
            let mut all = core::mem::take(&mut self.by_ext);
            for (ext, m) in all.drain() {
                self.mapping_gone(&m, ext);
            }
            // Keep the table's allocation.
            self.by_ext = all;
        }
        self.retired.clear();
        self.retired_blocks.clear();
        for p in &mut self.pools {
            if let Some(b) = &mut p.blocks {
                b.reset();
            }
        }
        self.by_int.clear();
        self.subscribers.clear();
        self.permits.clear();
        for s in &mut self.masq_slots {
            *s = MasqSlot::default();
        }
        self.stats.mappings_removed += n;
        self.stats.sessions = 0;
    }

    /// The mapping owning external endpoint `ext_addr:ext_port`, if any.
    pub fn mapping_by_ext(
        &self,
        proto: u8,
        ext_addr: Ipv4Addr,
        ext_port: u16,
    ) -> Option<MappingInfo> {
        let ext = ExtKey {
            proto,
            addr: u32::from(ext_addr),
            port: ext_port,
        };
        self.by_ext
            .get(&ext)
            .map(|m| info(m, ext, self.sessions_of(&ext, m)))
    }

    /// The port block holding external `addr:port` (port block
    /// allocation): (subscriber, first port, last port).
    pub fn block_by_ext(&self, addr: Ipv4Addr, port: u16) -> Option<(Ipv4Addr, u16, u16)> {
        let &(pid, ai) = self.pool_addr.get(&u32::from(addr))?;
        let p = self.pools.get(usize::from(pid))?;
        let bl = p.blocks.as_ref()?;
        let idx = p.space.slice().index(port)?;
        let b = bl.block_of(ai, idx);
        if idx / bl.size >= bl.per_addr {
            return None;
        }
        let sub = (*bl.owner.get(b as usize)?)?;
        let (first, last) = block_ports(&p.space, bl, b);
        Some((Ipv4Addr::from(sub), first, last))
    }

    /// The port blocks subscriber `sub` holds: (external address, first
    /// port, last port).
    pub fn blocks_of(&self, sub: Ipv4Addr) -> Vec<(Ipv4Addr, u16, u16)> {
        let mut v = Vec::new();
        for p in &self.pools {
            let Some(bl) = &p.blocks else {
                continue;
            };
            for &b in bl.by_sub.get(&u32::from(sub)).into_iter().flatten() {
                if let Some(&a) = p.addrs.get(bl.addr_of(b)) {
                    let (first, last) = block_ports(&p.space, bl, b);
                    v.push((Ipv4Addr::from(a), first, last));
                }
            }
        }
        v
    }

    /// Every mapping of this worker, in no particular order.
    pub fn mappings(&self) -> impl Iterator<Item = MappingInfo> + '_ {
        self.by_ext
            .iter()
            .map(|(e, m)| info(m, *e, self.sessions_of(e, m)))
    }

    /// The mappings of internal address `sub` (a subscriber), in no
    /// particular order: [`Self::mappings`] filtered on the mapping itself
    /// before it is described (its session count looked up), so a lookup
    /// of one subscriber among millions of mappings costs a scan of the
    /// map, not a description of every mapping.
    pub fn mappings_of(&self, sub: Ipv4Addr) -> impl Iterator<Item = MappingInfo> + '_ {
        let sub = u32::from(sub);
        self.by_ext
            .iter()
            .filter(move |(_, m)| m.key.int_addr == sub)
            .map(|(e, m)| info(m, *e, self.sessions_of(e, m)))
    }

    /// The destination part of the mapping key of `orig`: none (zeros)
    /// under endpoint-independent mapping, RFC 4787 REQ-1 / RFC 5382 REQ-1
    /// (the mapping is keyed by the internal endpoint only).
    #[inline]
    fn mapped_destination(&self, orig: &FlowKey4) -> (u32, u16) {
        match self.mapping {
            MappingBehaviour::EndpointIndependent => (0, 0),
            MappingBehaviour::AddressAndPortDependent => (orig.dst, orig.dport),
        }
    }

    /// The `by_int` hash [`Self::snat`] would compute for the first packet
    /// `orig` of an outbound connection (any realm).
    #[inline]
    fn outbound_hash(&self, orig: &FlowKey4) -> u64 {
        let (dst_addr, dst_port) = self.mapped_destination(orig);
        self.by_int
            .hash(orig.proto, orig.src, orig.sport, dst_addr, dst_port)
    }

    /// Start loading the mapping slot that source NAT of `orig`, the first
    /// packet of a new connection, would read. For the engine's batch
    /// pipeline: issued a batch ahead, the lookup in
    /// [`Self::translate_outbound`] then hits the cache. Reads nothing.
    #[inline]
    pub fn prefetch_outbound(&self, orig: &FlowKey4) {
        self.by_int.prefetch(self.outbound_hash(orig));
    }

    /// The reply key source NAT of `orig` would most likely give, read from
    /// an existing mapping of its internal endpoint (in whatever realm
    /// comes first), so that the engine can prefetch the reply key's
    /// conntrack bucket before policy and NAT run. `None` when the
    /// endpoint has no mapping yet. A guess, never used to translate: a
    /// wrong one only wastes a prefetch. Changes nothing.
    #[inline]
    pub fn predict_outbound_reply(&self, orig: &FlowKey4) -> Option<FlowKey4> {
        let (dst_addr, dst_port) = self.mapped_destination(orig);
        let (addr, port) = self.by_int.peek_ext(
            self.outbound_hash(orig),
            orig.proto,
            orig.src,
            orig.sport,
            dst_addr,
            dst_port,
        )?;
        Some(FlowKey4 {
            src: orig.dst,
            sport: if orig.proto == proto::ICMP {
                port
            } else {
                orig.dport
            },
            dst: addr,
            dport: port,
            proto: orig.proto,
        })
    }

    /// Whether `addr` is an address of one of the pools (the same on every
    /// worker).
    #[inline]
    pub fn is_pool_addr(&self, addr: u32) -> bool {
        self.pool_bits & addr_bit(addr) != 0 && self.pool_addr.contains_key(&addr)
    }

    /// Free ports of this worker on `ext_addr` for `proto` (pool addresses
    /// and currently bound masquerade addresses).
    pub fn free_ports(&self, ext_addr: Ipv4Addr, proto: u8) -> Option<u32> {
        let pi = proto_index(proto)?;
        let a = u32::from(ext_addr);
        if let Some(&(pid, ai)) = self.pool_addr.get(&a) {
            return Some(
                self.pools
                    .get(usize::from(pid))?
                    .space
                    .free_count(ai * PROTOS + pi),
            );
        }
        let slot = self.masq_slots.iter().position(|s| s.addr == Some(a))?;
        Some(self.masq_space.free_count(slot * PROTOS + pi))
    }

    /// Every pool address with the size of this worker's share of its
    /// pool's port range and, with port blocks, (free blocks, blocks) of
    /// the address; pools in order.
    pub fn pool_addresses(&self) -> impl Iterator<Item = (Ipv4Addr, u32, Option<(u32, u32)>)> + '_ {
        self.pools.iter().flat_map(|p| {
            let n = p.space.slice().len();
            p.addrs.iter().enumerate().map(move |(ai, &a)| {
                let blocks = p
                    .blocks
                    .as_ref()
                    .map(|b| (b.free.get(ai).copied().unwrap_or(0), b.per_addr));
                (Ipv4Addr::from(a), n, blocks)
            })
        })
    }

    /// Ports of this worker's slice per (address, protocol) in `pool`.
    pub fn ports_per_addr(&self, pool: crate::PoolId) -> Option<u32> {
        let slot = self.slot_of.get(usize::from(pool.0))?;
        Some(self.pools.get(usize::from(*slot))?.space.slice().len())
    }

    // ---- internals -------------------------------------------------------

    /// Can `addr` be the external address of a mapping of this worker? True
    /// for pool addresses and bound masquerade addresses: a mapping's
    /// external address is one of those for as long as the mapping lives
    /// (a masquerade slot stays bound while it has mappings).
    #[inline]
    fn is_external(&self, addr: u32) -> bool {
        self.is_pool_addr(addr) || self.masq_slots.iter().any(|s| s.addr == Some(addr))
    }

    /// The mapping with external endpoint `ext`. Checks the (small, cached)
    /// set of external addresses first, so that the first packet of an
    /// ordinary outbound connection, whose destination is no external
    /// address, does not probe the large `by_ext` table (a cache miss per
    /// new connection once it outgrows the caches).
    #[inline]
    fn get_mapping(&self, ext: &ExtKey) -> Option<&Mapping> {
        if !self.is_external(ext.addr) {
            return None;
        }
        self.by_ext.get(ext).filter(|m| m.space != Space::Retired)
    }

    /// Sessions holding mapping `m` (external endpoint `ext`).
    fn sessions_of(&self, ext: &ExtKey, m: &Mapping) -> u32 {
        if m.space == Space::Retired {
            return self.retired.get(ext).map_or(0, |r| r.sessions);
        }
        self.by_int
            .get(&m.key.int_key())
            .map_or(0, |v| v.sessions())
    }

    /// The session count of mapping `m` (external endpoint `ext`).
    fn count_of(&mut self, ext: &ExtKey, m: &Mapping) -> Option<&mut u32> {
        if m.space == Space::Retired {
            return self.retired.get_mut(ext).map(|r| &mut r.sessions);
        }
        self.by_int
            .get_mut(&m.key.int_key())
            .map(|v| v.sessions_mut())
    }

    fn snat(&mut self, orig: &FlowKey4, realm: Realm) -> Result<FlowKey4, NatError> {
        let pi = proto_index(orig.proto).ok_or(NatError::UnsupportedProtocol)?;
        let icmp = orig.proto == proto::ICMP;
        // RFC 4787 REQ-9 / RFC 5382 REQ-8: hairpinning. Hairpinned sessions
        // skip filtering: both ends are subscribers of this NAT.
        let hairpin = if self.hairpinning && !icmp {
            let ext = ExtKey {
                proto: orig.proto,
                addr: orig.dst,
                port: orig.dport,
            };
            self.get_mapping(&ext)
                .map(|m| (m.key.int_addr, m.key.int_port))
        } else {
            None
        };
        if !self.has_room(orig.src, hairpin.map(|h| h.0)) {
            self.stats.subscriber_limit += 1;
            return Err(NatError::SubscriberLimit);
        }
        let (dst_addr, dst_port) = self.mapped_destination(orig);
        let key = MapKey {
            realm,
            proto: orig.proto,
            int_addr: orig.src,
            int_port: orig.sport,
            dst_addr,
            dst_port,
        };
        // The session takes its reference on the source mapping here, in
        // the same lookup that finds the mapping (see `by_int`).
        let ext = match self.by_int.get_mut(&key.int_key()) {
            Some(v) => {
                *v.sessions_mut() += 1;
                let (addr, port) = v.ext();
                ExtKey {
                    proto: key.proto,
                    addr,
                    port,
                }
            }
            None => self.create_mapping(key, pi)?,
        };
        let mut t = *orig;
        t.src = ext.addr;
        t.sport = ext.port;
        if icmp {
            // ICMP query keys carry the identifier in both port fields.
            t.dport = ext.port;
        }
        if let Some((a, p)) = hairpin {
            t.dst = a;
            t.dport = p;
            self.stats.hairpins += 1;
        }
        let reply = t.reversed();
        if hairpin.is_none() && !icmp {
            // The destination is untranslated, so the session holds the
            // source mapping only ([`Self::session_candidates`] gives
            // candidate 0 alone), already counted above.
            self.count_reference(&SessionRef {
                ext,
                subscriber: orig.src,
                raddr: orig.dst,
                rport: orig.dport,
            });
            self.stats.sessions += 1;
        } else {
            self.acquire_counted(orig, &reply, true);
        }
        Ok(reply)
    }

    /// Create the mapping of internal side `key`, held by one session (the
    /// caller's).
    fn create_mapping(&mut self, key: MapKey, pi: usize) -> Result<ExtKey, NatError> {
        let (space, addr, port) = loop {
            let (space, addr, port) = self.alloc_ext(&key, pi)?;
            if let Space::Masq { slot, .. } = space {
                if let Some(s) = self.masq_slots.get_mut(usize::from(slot)) {
                    s.mappings += 1;
                }
            }
            let ext = ExtKey {
                proto: key.proto,
                addr,
                port,
            };
            match self.retired.get_mut(&ext) {
                None => break (space, addr, port),
                // A mapping retired by a pool change still has this
                // external endpoint (its address came back, or is a
                // masquerade address now): the port stays taken for it,
                // freed with it, and the allocation goes on. A hold it
                // had elsewhere (another bitmap) is given back.
                Some(r) => {
                    let old = r.hold.replace(space);
                    self.uncount_in_block(space, port);
                    if let Some(h) = old {
                        self.free_bit(h, port);
                    }
                }
            }
        };
        let ext = ExtKey {
            proto: key.proto,
            addr,
            port,
        };
        self.by_int.insert(key.int_key(), (addr, port), 1);
        self.by_ext.insert(ext, Mapping { key, space });
        self.count_slot(space, true);
        self.stats.mappings_created += 1;
        // With port blocks the block's event stands for its mappings.
        if !self.in_blocks(space) {
            self.sink.event(&NatEvent::MappingCreated {
                proto: key.proto,
                int_addr: Ipv4Addr::from(key.int_addr),
                int_port: key.int_port,
                ext_addr: Ipv4Addr::from(addr),
                ext_port: port,
                worker: self.worker,
            });
        }
        Ok(ext)
    }

    /// An external endpoint for mapping `key` (protocol index `pi`): its
    /// port taken from the bitmap it belongs to.
    fn alloc_ext(&mut self, key: &MapKey, pi: usize) -> Result<(Space, u32, u16), NatError> {
        Ok(match key.realm {
            Realm::Pool(pid) if self.has_blocks(pid) => {
                let (ai, addr, port) = self.block_port(pid, None, key, pi)?;
                let map = u32::try_from(ai * PROTOS + pi).map_err(|_| NatError::UnknownPool)?;
                (Space::Pool { pool: pid, map }, addr, port)
            }
            Realm::Pool(pid) => {
                let pool = self
                    .pools
                    .get_mut(usize::from(pid))
                    .ok_or(NatError::UnknownPool)?;
                let n = pool.addrs.len();
                // RFC 4787 REQ-2: paired pooling; the address is a pure
                // function of the internal address.
                let start = pair_index(self.seed, key.int_addr, n);
                let tries = match self.pooling {
                    Pooling::Paired => n.min(1),
                    Pooling::Arbitrary => n,
                };
                let mut found = None;
                for k in 0..tries {
                    let ai = (start + k) % n;
                    let Some(&addr) = pool.addrs.get(ai) else {
                        continue;
                    };
                    let map = ai * PROTOS + pi;
                    let Ok(map32) = u32::try_from(map) else {
                        continue;
                    };
                    if let Some(port) = alloc_port(&mut pool.space, map, addr, key) {
                        found = Some((
                            Space::Pool {
                                pool: pid,
                                map: map32,
                            },
                            addr,
                            port,
                        ));
                        break;
                    }
                }
                match found {
                    Some(f) => f,
                    None => {
                        self.stats.pool_exhausted += 1;
                        return Err(NatError::PoolExhausted);
                    }
                }
            }
            Realm::Masq(addr) => {
                let shared = self.pool_addr.get(&addr).copied();
                let got = if let Some((pid, ai)) = shared.filter(|&(pid, _)| self.has_blocks(pid)) {
                    // A pool address with port blocks: its ports come from
                    // the subscriber's blocks on that address.
                    let (ai, _, port) = self.block_port(pid, Some(ai), key, pi)?;
                    u32::try_from(ai * PROTOS + pi)
                        .ok()
                        .map(|map| (Space::Pool { pool: pid, map }, port))
                } else if let Some((pid, ai)) = shared {
                    // The egress address is also a pool address: share its
                    // bitmap so the two can never hand out the same port.
                    let map = ai * PROTOS + pi;
                    u32::try_from(map).ok().and_then(|map32| {
                        self.pools
                            .get_mut(usize::from(pid))
                            .and_then(|p| alloc_port(&mut p.space, map, addr, key))
                            .map(|port| {
                                (
                                    Space::Pool {
                                        pool: pid,
                                        map: map32,
                                    },
                                    port,
                                )
                            })
                    })
                } else {
                    let slot = self.masq_slot(addr)?;
                    let map = usize::from(slot) * PROTOS + pi;
                    u32::try_from(map).ok().and_then(|map32| {
                        alloc_port(&mut self.masq_space, map, addr, key)
                            .map(|port| (Space::Masq { slot, map: map32 }, port))
                    })
                };
                match got {
                    Some((space, port)) => (space, addr, port),
                    None => {
                        self.stats.pool_exhausted += 1;
                        return Err(NatError::PoolExhausted);
                    }
                }
            }
        })
    }

    /// Whether pool `pid` allocates in port blocks.
    fn has_blocks(&self, pid: u16) -> bool {
        self.pools
            .get(usize::from(pid))
            .is_some_and(|p| p.blocks.is_some())
    }

    /// Whether a mapping's port came from a port block.
    fn in_blocks(&self, space: Space) -> bool {
        matches!(space, Space::Pool { pool, .. } if self.has_blocks(pool))
    }

    /// Port block allocation: a port for mapping `key` (protocol index
    /// `pi`) from the subscriber's blocks in pool `pid`, newest first, on
    /// address index `only` if given, else on the paired address (or, with
    /// arbitrary pooling, any address); when they are full, a new block
    /// (logged). Returns (address index, address, port).
    fn block_port(
        &mut self,
        pid: u16,
        only: Option<usize>,
        key: &MapKey,
        pi: usize,
    ) -> Result<(usize, u32, u16), NatError> {
        let Self {
            pools,
            stats,
            sink,
            worker,
            pooling,
            seed,
            ..
        } = self;
        let pool = pools
            .get_mut(usize::from(pid))
            .ok_or(NatError::UnknownPool)?;
        let PoolState {
            addrs,
            space,
            blocks,
        } = pool;
        let bl = blocks.as_mut().ok_or(NatError::UnknownPool)?;
        let n = addrs.len();
        let start = pair_index(*seed, key.int_addr, n);
        let det_mode = bl.det.is_some();
        let allowed = |ai: usize| match only {
            Some(x) => ai == x,
            None => det_mode || *pooling == Pooling::Arbitrary || ai == start,
        };
        let sub = key.int_addr;
        // One lookup of the subscriber's blocks; the newest is tried first
        // and almost always has room, the older ones only when it has not.
        let (held, newest) = bl
            .by_sub
            .get(&sub)
            .map_or((0, None), |v| (v.len(), v.last().copied()));
        for k in (0..held).rev() {
            let b = if k + 1 == held {
                newest
            } else {
                bl.by_sub.get(&sub).and_then(|v| v.get(k)).copied()
            };
            let Some(b) = b else {
                continue;
            };
            let ai = bl.addr_of(b);
            let Some(&addr) = addrs.get(ai).filter(|_| allowed(ai)) else {
                continue;
            };
            if let Some(port) = port_in_block(space, bl, b, ai * PROTOS + pi, addr, key) {
                return Ok((ai, addr, port));
            }
        }
        if bl.max != 0 && held >= usize::from(bl.max) {
            stats.block_limit += 1;
            return Err(NatError::BlockLimit);
        }
        // Deterministic NAT: the subscriber's own block, on its address.
        let det = match bl.det_block(sub) {
            Ok(d) => d,
            Err(e) => {
                stats.outside_prefix += 1;
                return Err(e);
            }
        };
        let det_ai = det.map(|b| bl.addr_of(b));
        let tries: &mut dyn Iterator<Item = usize> = match (det_ai, only, *pooling) {
            (Some(a), Some(x), _) if a != x => &mut core::iter::empty(),
            (Some(a), _, _) => &mut core::iter::once(a),
            (None, Some(x), _) => &mut core::iter::once(x),
            (None, None, Pooling::Paired) => &mut core::iter::once(start),
            (None, None, Pooling::Arbitrary) => &mut (0..n).map(|k| (start + k) % n),
        };
        for ai in tries {
            let Some(&addr) = addrs.get(ai) else {
                continue;
            };
            let b = match det {
                Some(b) if bl.take_exact(b, sub) => b,
                Some(_) => continue,
                None => match bl.take(ai, sub) {
                    Some(b) => b,
                    None => continue,
                },
            };
            stats.blocks_allocated += 1;
            let (first_port, last_port) = block_ports(space, bl, b);
            sink.event(&NatEvent::BlockAllocated {
                int_addr: Ipv4Addr::from(sub),
                ext_addr: Ipv4Addr::from(addr),
                first_port,
                last_port,
                worker: *worker,
            });
            if let Some(port) = port_in_block(space, bl, b, ai * PROTOS + pi, addr, key) {
                return Ok((ai, addr, port));
            }
            // Only a one-port block holding the subscriber's own endpoint
            // can get here: hand it back.
            bl.give_back(b);
            stats.blocks_released += 1;
            sink.event(&NatEvent::BlockReleased {
                int_addr: Ipv4Addr::from(sub),
                ext_addr: Ipv4Addr::from(addr),
                first_port,
                last_port,
                worker: *worker,
            });
        }
        stats.pool_exhausted += 1;
        Err(NatError::PoolExhausted)
    }

    /// The masquerade slot bound to `addr`, binding a free one if needed.
    fn masq_slot(&mut self, addr: u32) -> Result<u16, NatError> {
        let idx = match self.masq_slots.iter().position(|s| s.addr == Some(addr)) {
            Some(i) => i,
            None => {
                let i = self
                    .masq_slots
                    .iter()
                    .position(|s| s.mappings == 0)
                    .ok_or(NatError::MasqueradeSlotsExhausted)?;
                if let Some(s) = self.masq_slots.get_mut(i) {
                    *s = MasqSlot {
                        addr: Some(addr),
                        mappings: 0,
                    };
                }
                i
            }
        };
        u16::try_from(idx).map_err(|_| NatError::MasqueradeSlotsExhausted)
    }

    fn remove_mapping(&mut self, ext: ExtKey) {
        let Some(m) = self.by_ext.remove(&ext) else {
            return;
        };
        if m.space != Space::Retired {
            self.by_int.remove(&m.key.int_key());
        }
        self.count_slot(m.space, false);
        self.mapping_gone(&m, ext);
        self.stats.mappings_removed += 1;
    }

    /// Mapping `m` (external endpoint `ext`, already out of `by_ext`) is
    /// gone: free its port (and a retired one's hold), unbind an emptied
    /// masquerade slot, and log it.
    fn mapping_gone(&mut self, m: &Mapping, ext: ExtKey) {
        if m.space != Space::Retired {
            self.free_mapping_port(m, ext);
            self.masq_unref(m.space);
            return;
        }
        let Some(r) = self.retired.remove(&ext) else {
            return;
        };
        if let Some(h) = r.hold {
            self.free_bit(h, ext.port);
        }
        match r.block {
            None => self.sink.event(&removed_event(self.worker, &m.key, ext)),
            Some((addr, first)) => {
                if let hashbrown::hash_map::Entry::Occupied(mut e) =
                    self.retired_blocks.entry((addr, first))
                {
                    e.get_mut().mappings -= 1;
                    if e.get().mappings == 0 {
                        let b = e.remove();
                        self.stats.blocks_released += 1;
                        self.sink.event(&NatEvent::BlockReleased {
                            int_addr: Ipv4Addr::from(b.sub),
                            ext_addr: Ipv4Addr::from(addr),
                            first_port: first,
                            last_port: b.last,
                            worker: self.worker,
                        });
                    }
                }
            }
        }
    }

    /// Free `port`'s bit in `space` alone, outside any port block's count
    /// (a retired mapping's hold; a masquerade port moving to a pool's
    /// bitmap), unbinding an emptied masquerade slot.
    fn free_bit(&mut self, space: Space, port: u16) {
        match space {
            Space::Pool { pool, map } => {
                if let Some(p) = self.pools.get_mut(usize::from(pool)) {
                    p.space.release(map as usize, port);
                }
            }
            Space::Masq { map, .. } => {
                self.masq_space.release(map as usize, port);
                self.masq_unref(space);
            }
            Space::Retired => {}
        }
    }

    /// An allocation gave `port` of `space`, which a retired mapping still
    /// has: with port blocks, the block the allocation counted it in
    /// forgets it (and is freed, logged, when that was its only use), so
    /// that the bit alone stays taken for the retired mapping.
    fn uncount_in_block(&mut self, space: Space, port: u16) {
        let Space::Pool { pool, map } = space else {
            return;
        };
        let Some(p) = self.pools.get_mut(usize::from(pool)) else {
            return;
        };
        let (Some(bl), Some(idx)) = (p.blocks.as_mut(), p.space.slice().index(port)) else {
            return;
        };
        let ai = map as usize / PROTOS;
        let b = bl.block_of(ai, idx);
        let Some(u) = bl.used.get_mut(b as usize) else {
            return;
        };
        *u = u.saturating_sub(1);
        if *u > 0 {
            return;
        }
        let (first_port, last_port) = block_ports(&p.space, bl, b);
        if let (Some(sub), Some(&a)) = (bl.give_back(b), p.addrs.get(ai)) {
            self.stats.blocks_released += 1;
            self.sink.event(&NatEvent::BlockReleased {
                int_addr: Ipv4Addr::from(sub),
                ext_addr: Ipv4Addr::from(a),
                first_port,
                last_port,
                worker: self.worker,
            });
        }
    }

    /// A user of a masquerade slot's bitmap is gone; the slot is unbound
    /// with its last.
    fn masq_unref(&mut self, space: Space) {
        if let Space::Masq { slot, .. } = space {
            if let Some(s) = self.masq_slots.get_mut(usize::from(slot)) {
                s.mappings = s.mappings.saturating_sub(1);
                if s.mappings == 0 {
                    s.addr = None;
                }
            }
        }
    }

    /// Free the port of mapping `m` (external endpoint `ext`) and log it:
    /// the mapping's removal, or with port blocks the release of its block
    /// when it was the block's last.
    fn free_mapping_port(&mut self, m: &Mapping, ext: ExtKey) {
        let blocked = self.in_blocks(m.space);
        if let Some(e) = free_port(
            &mut self.pools,
            &mut self.masq_space,
            m.space,
            ext.port,
            self.worker,
        ) {
            self.stats.blocks_released += 1;
            self.sink.event(&e);
        }
        if !blocked {
            self.sink.event(&removed_event(self.worker, &m.key, ext));
        }
    }

    /// The mappings a session with keys `(orig, reply)` may hold, before
    /// checking that they exist: for each side whose endpoint is
    /// translated, the external key and the reference (whose subscriber is
    /// the internal address the mapping must have, with `int_port`).
    fn session_candidates(orig: &FlowKey4, reply: &FlowKey4) -> [Option<(SessionRef, u16)>; 2] {
        let mut out = [None, None];
        if (orig.src, orig.sport) != (reply.dst, reply.dport) {
            let ext = ExtKey {
                proto: orig.proto,
                addr: reply.dst,
                port: reply.dport,
            };
            out[0] = Some((
                SessionRef {
                    ext,
                    subscriber: orig.src,
                    raddr: orig.dst,
                    rport: orig.dport,
                },
                orig.sport,
            ));
        }
        if (orig.dst, orig.dport) != (reply.src, reply.sport) {
            let ext = ExtKey {
                proto: orig.proto,
                addr: orig.dst,
                port: orig.dport,
            };
            out[1] = Some((
                SessionRef {
                    ext,
                    subscriber: reply.src,
                    raddr: reply.dst,
                    rport: reply.dport,
                },
                reply.sport,
            ));
        }
        out
    }

    /// The mappings held by a session with keys `(orig, reply)`; see the
    /// module docs. Used by [`Self::release`]; [`Self::acquire`] does the
    /// same check while taking its references.
    fn session_refs(&self, orig: &FlowKey4, reply: &FlowKey4) -> [Option<SessionRef>; 2] {
        Self::session_candidates(orig, reply).map(|c| {
            c.filter(|(r, int_port)| {
                self.by_ext
                    .get(&r.ext)
                    .is_some_and(|m| m.key.int_addr == r.subscriber && m.key.int_port == *int_port)
            })
            .map(|(r, _)| r)
        })
    }

    fn acquire(&mut self, orig: &FlowKey4, reply: &FlowKey4) {
        self.acquire_counted(orig, reply, false);
    }

    /// Take the session's references on the mappings it holds. With
    /// `source_counted`, [`Self::snat`] has already counted the session on
    /// the source mapping (candidate 0, which it knows exists).
    fn acquire_counted(&mut self, orig: &FlowKey4, reply: &FlowKey4, source_counted: bool) {
        let mut any = false;
        for (i, c) in Self::session_candidates(orig, reply)
            .into_iter()
            .enumerate()
        {
            let Some((r, int_port)) = c else {
                continue;
            };
            if !(i == 0 && source_counted) {
                let Some(m) = self
                    .by_ext
                    .get(&r.ext)
                    .copied()
                    .filter(|m| m.key.int_addr == r.subscriber && m.key.int_port == int_port)
                else {
                    continue;
                };
                match self.count_of(&r.ext, &m) {
                    Some(n) => *n += 1,
                    None => continue,
                }
            }
            any = true;
            self.count_reference(&r);
        }
        if any {
            self.stats.sessions += 1;
        }
    }

    /// The subscriber and filtering counts of one reference a new session
    /// takes on a mapping (whose own session count the caller did).
    #[inline]
    fn count_reference(&mut self, r: &SessionRef) {
        *self.subscribers.entry(r.subscriber).or_insert(0) += 1;
        if let Some(pk) = self.permit_key(r.ext, r.raddr, r.rport) {
            *self.permits.entry(pk).or_insert(0) += 1;
        }
    }

    fn permit_key(&self, ext: ExtKey, raddr: u32, rport: u16) -> Option<PermitKey> {
        match self.filtering {
            FilteringBehaviour::EndpointIndependent => None,
            FilteringBehaviour::AddressDependent => Some(PermitKey {
                ext,
                raddr,
                rport: 0,
            }),
            FilteringBehaviour::AddressAndPortDependent => Some(PermitKey { ext, raddr, rport }),
        }
    }

    /// RFC 4787 REQ-8: does the filtering behaviour let `raddr:rport` open
    /// a session through mapping `ext`?
    fn admits(&self, ext: ExtKey, raddr: u32, rport: u16) -> bool {
        match self.permit_key(ext, raddr, rport) {
            None => true,
            Some(pk) => self.permits.contains_key(&pk),
        }
    }

    /// RFC 6888 REQ-4: may `a` (and `b`, if any) take one more session each?
    fn has_room(&self, a: u32, b: Option<u32>) -> bool {
        if self.max_sessions == 0 {
            return true;
        }
        let count = |x: u32| self.subscribers.get(&x).copied().unwrap_or(0);
        let need_a = 1 + u32::from(b == Some(a));
        count(a).saturating_add(need_a) <= self.max_sessions
            && b.is_none_or(|b| count(b) < self.max_sessions)
    }
}

#[derive(Clone, Copy, Debug)]
struct SessionRef {
    ext: ExtKey,
    subscriber: u32,
    raddr: u32,
    rport: u16,
}

impl PoolState {
    /// [`WorkerNat::set_pools`]: this pool's addresses become `addrs`
    /// (same port range): old address `a` becomes `to[a]` if it stays
    /// (the kept ones first, in their order, so an index only moves
    /// down), and the new ones follow. The bitmaps and port blocks of the
    /// kept addresses move with them, those of the others go (the caller
    /// has retired their mappings), the new ones start empty.
    fn reshape(&mut self, to: &[Option<usize>], addrs: &[Ipv4Addr]) {
        let kept = to.iter().flatten().count();
        // Every address keeps its index (addresses appended at most):
        // nothing moves, and the subscribers' block lists are not visited.
        let same = to.iter().enumerate().all(|(a, t)| *t == Some(a));
        let maps: Vec<Option<usize>> = (0..to.len() * PROTOS)
            .map(|m| {
                to.get(m / PROTOS)
                    .copied()
                    .flatten()
                    .map(|a| a * PROTOS + m % PROTOS)
            })
            .collect();
        if !same {
            self.space.compact(&maps, kept * PROTOS);
        }
        self.space.grow(addrs.len() * PROTOS);
        if let Some(b) = &mut self.blocks {
            if !same {
                b.compact(to, kept);
            }
            let n = addrs.len();
            let blocks = b.per_addr as usize * n;
            b.owner.resize(blocks, None);
            b.used.resize(blocks, 0);
            b.next.resize(blocks, 0);
            b.free.resize(n, b.per_addr);
            b.cursor.resize(n, 0);
        }
        self.addrs = addrs.iter().map(|a| u32::from(*a)).collect();
    }

    /// Pool `p` of `config` on `worker`, empty.
    fn new(config: &NatConfig, p: &crate::Pool, worker: u16) -> Self {
        let slice = PortSlice::new(&p.ports, worker, config.workers);
        let addrs: Vec<u32> = p.addrs.iter().map(|a| u32::from(*a)).collect();
        let blocks = (config.port_block_size > 0).then(|| {
            let det = config
                .deterministic
                .map(|(base, len)| (u32::from(base), 1u64 << (32 - u32::from(len.min(32)))));
            let per_addr = if det.is_some() {
                config.det_blocks_per_addr(p)
            } else {
                slice.len() / u32::from(config.port_block_size)
            };
            Blocks::new(
                config.port_block_size,
                per_addr,
                addrs.len(),
                config.max_blocks_per_subscriber,
                det,
            )
        });
        let space = PortSpace::new(slice, addrs.len() * PROTOS);
        Self {
            addrs,
            space,
            blocks,
        }
    }

    /// A slot without a pool: no address, no port.
    fn placeholder() -> Self {
        Self {
            addrs: Vec::new(),
            space: PortSpace::new(PortSlice::empty(), 0),
            blocks: None,
        }
    }
}

/// The address index of `config`'s pools: external address -> (pool,
/// address index).
fn pool_index(config: &NatConfig) -> Result<HashMap<u32, (u16, usize)>, ConfigError> {
    let mut pool_addr = HashMap::new();
    for (pi, p) in config.pools.iter().enumerate() {
        let pid = u16::try_from(pi).map_err(|_| ConfigError::TooLarge)?;
        for (ai, a) in p.addrs.iter().enumerate() {
            pool_addr.insert(u32::from(*a), (pid, ai));
        }
    }
    Ok(pool_addr)
}

/// The bit of `addr` in [`WorkerNat`]'s pool address filter: a
/// multiplicative hash to 6 bits.
#[inline]
fn addr_bit(addr: u32) -> u64 {
    1 << (addr.wrapping_mul(0x9e37_79b1) >> 26)
}

/// Allocate a port of `map`, never the internal endpoint itself (a mapping
/// onto itself would be indistinguishable from no translation).
fn alloc_port(space: &mut PortSpace, map: usize, ext_addr: u32, key: &MapKey) -> Option<u16> {
    let p = space.alloc(map)?;
    if ext_addr == key.int_addr && p == key.int_port {
        let q = space.alloc(map);
        space.release(map, p);
        q
    } else {
        Some(p)
    }
}

/// Return a mapping's port. With port blocks, the port's block loses a
/// user, and when that was its last the block is freed: the returned
/// event says so.
fn free_port(
    pools: &mut [PoolState],
    masq: &mut PortSpace,
    space: Space,
    port: u16,
    worker: u16,
) -> Option<NatEvent> {
    match space {
        Space::Pool { pool, map } => {
            let p = pools.get_mut(usize::from(pool))?;
            let idx = p.space.release_at(map as usize, port)?;
            let bl = p.blocks.as_mut()?;
            let ai = map as usize / PROTOS;
            let b = bl.block_of(ai, idx);
            let used = bl.used.get_mut(b as usize)?;
            *used = used.saturating_sub(1);
            if *used > 0 {
                return None;
            }
            let (first_port, last_port) = block_ports(&p.space, bl, b);
            let sub = bl.give_back(b)?;
            Some(NatEvent::BlockReleased {
                int_addr: Ipv4Addr::from(sub),
                ext_addr: Ipv4Addr::from(*p.addrs.get(ai)?),
                first_port,
                last_port,
                worker,
            })
        }
        Space::Masq { map, .. } => {
            masq.release(map as usize, port);
            None
        }
        Space::Retired => None,
    }
}

/// [`WorkerNat::set_pools`]: take the mapping of internal side `key` out
/// of `by_int`; its session count.
fn unfile(by_int: &mut IntMap, key: &MapKey) -> u32 {
    by_int.remove(&key.int_key()).map_or(0, |v| v.sessions())
}

/// [`WorkerNat::set_pools`]: take `port` in new pool `np`'s address `nai`
/// for the protocol of old bitmap `map`, as a bit alone: in no port
/// block's count (a retired mapping's hold, or a masquerade mapping moving
/// to a pool without port blocks). `None` when it is outside the range or
/// taken.
fn take_raw(
    pools: &mut [PoolState],
    (np, nai): (u16, usize),
    map: u32,
    port: u16,
) -> Option<Space> {
    let nmap = nai * PROTOS + map as usize % PROTOS;
    pools.get_mut(usize::from(np))?.space.take(nmap, port)?;
    Some(Space::Pool {
        pool: np,
        map: u32::try_from(nmap).ok()?,
    })
}

/// [`WorkerNat::set_pools`]: take `port` for a mapping that had it in
/// bitmap `map` of old pool `pool`, in the new pool `np`'s address `nai`
/// (the same protocol). With port blocks the block at the same place is
/// the subscriber's: taken for it if free (continuing the old block's
/// allocation, already logged, so not logged again), refused if another's.
/// `None` when the port is outside the new pool's range.
fn place(
    old: &[PoolState],
    pools: &mut [PoolState],
    (pool, map): (u16, u32),
    (np, nai): (u16, usize),
    port: u16,
) -> Option<Space> {
    let op = old.get(usize::from(pool))?;
    let nmap = nai * PROTOS + map as usize % PROTOS;
    let npool = pools.get_mut(usize::from(np))?;
    let sub = match (&op.blocks, &npool.blocks) {
        (None, None) => None,
        (Some(ob), Some(_)) => {
            let idx = op.space.slice().index(port)?;
            Some(
                (*ob.owner
                    .get(ob.block_of(map as usize / PROTOS, idx) as usize)?)?,
            )
        }
        _ => return None,
    };
    let idx = npool.space.take(nmap, port)?;
    if let (Some(sub), Some(nb)) = (sub, npool.blocks.as_mut()) {
        let b = nb.block_of(nai, idx);
        let ok = idx / nb.size < nb.per_addr
            && match nb.owner.get(b as usize) {
                Some(None) => nb.take_exact(b, sub),
                Some(Some(s)) => *s == sub,
                None => false,
            };
        if !ok {
            npool.space.release(nmap, port);
            return None;
        }
        if let Some(u) = nb.used.get_mut(b as usize) {
            *u += 1;
        }
    }
    Some(Space::Pool {
        pool: np,
        map: u32::try_from(nmap).ok()?,
    })
}

/// The port block of old pool `pool`'s bitmap `map` holding `port`:
/// (address, first port, subscriber, last port); `None` without port
/// blocks.
fn retired_block(
    old: &[PoolState],
    pool: u16,
    map: u32,
    port: u16,
) -> Option<(u32, u16, u32, u16)> {
    let p = old.get(usize::from(pool))?;
    let bl = p.blocks.as_ref()?;
    let ai = map as usize / PROTOS;
    let b = bl.block_of(ai, p.space.slice().index(port)?);
    let sub = (*bl.owner.get(b as usize)?)?;
    let (first, last) = block_ports(&p.space, bl, b);
    Some((*p.addrs.get(ai)?, first, sub, last))
}

/// The first and last port of block `b`.
fn block_ports(space: &PortSpace, bl: &Blocks, b: u32) -> (u16, u16) {
    let (lo, hi) = bl.range(b);
    let s = space.slice();
    (
        s.port(lo).unwrap_or(0),
        s.port(hi.saturating_sub(1)).unwrap_or(0),
    )
}

/// A port of block `b` in bitmap `map` (next-fit within the block), never
/// the internal endpoint itself; counts it as the block's.
fn port_in_block(
    space: &mut PortSpace,
    bl: &mut Blocks,
    b: u32,
    map: usize,
    ext_addr: u32,
    key: &MapKey,
) -> Option<u16> {
    let (lo, hi) = bl.range(b);
    let from = lo + bl.next.get(b as usize).copied().unwrap_or(0);
    let (mut port, mut idx) = space.alloc_in(map, lo, hi, from)?;
    if ext_addr == key.int_addr && port == key.int_port {
        let other = space.alloc_in(map, lo, hi, idx + 1);
        space.release(map, port);
        (port, idx) = other?;
    }
    if let Some(u) = bl.used.get_mut(b as usize) {
        *u += 1;
    }
    if let Some(n) = bl.next.get_mut(b as usize) {
        *n = (idx + 1 - lo) % bl.size;
    }
    Some(port)
}

fn removed_event(worker: u16, key: &MapKey, ext: ExtKey) -> NatEvent {
    NatEvent::MappingRemoved {
        proto: key.proto,
        int_addr: Ipv4Addr::from(key.int_addr),
        int_port: key.int_port,
        ext_addr: Ipv4Addr::from(ext.addr),
        ext_port: ext.port,
        worker,
    }
}

fn info(m: &Mapping, ext: ExtKey, sessions: u32) -> MappingInfo {
    let key = &m.key;
    MappingInfo {
        retired: m.space == Space::Retired,
        proto: key.proto,
        int_addr: Ipv4Addr::from(key.int_addr),
        int_port: key.int_port,
        ext_addr: Ipv4Addr::from(ext.addr),
        ext_port: ext.port,
        sessions,
    }
}

#[cfg(test)]
mod pool_change_tests;

#[cfg(test)]
mod tests {
    #![allow(clippy::indexing_slicing, clippy::unwrap_used)]
    use super::*;
    use crate::config::{Pool, PoolId, DEFAULT_PORTS};
    use crate::event::VecSink;
    use crate::rewrite::Rewrite4;
    use proptest::prelude::*;
    use std::collections::{HashMap as StdMap, HashSet};

    const SNAT: Translation = Translation::Snat { pool: PoolId(0) };

    fn ip(a: u8, b: u8, c: u8, d: u8) -> Ipv4Addr {
        Ipv4Addr::new(a, b, c, d)
    }

    fn cfg(addrs: u8, ports: core::ops::RangeInclusive<u16>, workers: u16) -> NatConfig {
        NatConfig {
            pools: vec![Pool::new((1..=addrs).map(|i| ip(192, 0, 2, i))).with_ports(ports)],
            workers,
            ..NatConfig::default()
        }
    }

    fn nat(c: &NatConfig, w: u16) -> WorkerNat<VecSink> {
        WorkerNat::new(c, w, VecSink::default()).unwrap()
    }

    fn out(p: u8, host: u8, sport: u16, dst: Ipv4Addr, dport: u16) -> FlowKey4 {
        let dport = if p == proto::ICMP { sport } else { dport };
        FlowKey4::new(p, ip(10, 0, 0, host), sport, dst, dport)
    }

    #[test]
    fn eim_reuses_external_endpoint_across_destinations() {
        let c = cfg(4, DEFAULT_PORTS, 1);
        let mut n = nat(&c, 0);
        let a = n
            .translate_outbound(&out(proto::UDP, 1, 5000, ip(8, 8, 8, 8), 53), &SNAT, None)
            .unwrap();
        let b = n
            .translate_outbound(&out(proto::UDP, 1, 5000, ip(9, 9, 9, 9), 53), &SNAT, None)
            .unwrap();
        let d = n
            .translate_outbound(&out(proto::UDP, 1, 5000, ip(9, 9, 9, 9), 54), &SNAT, None)
            .unwrap();
        // RFC 4787 REQ-1: same internal endpoint -> same external endpoint.
        assert_eq!((a.dst, a.dport), (b.dst, b.dport));
        assert_eq!((a.dst, a.dport), (d.dst, d.dport));
        assert_eq!(n.stats().mappings, 1);
        assert_eq!(n.stats().sessions, 3);
        assert_eq!(
            n.mapping_by_ext(proto::UDP, a.dst_addr(), a.dport)
                .unwrap()
                .sessions,
            3
        );
        assert_eq!(n.sink().events.len(), 1);
    }

    /// A subscriber's mappings are exactly those of all the worker's
    /// mappings with its internal address, session counts included.
    #[test]
    fn mappings_of_a_subscriber_are_its_mappings() {
        let c = cfg(4, DEFAULT_PORTS, 1);
        let mut n = nat(&c, 0);
        for host in 1..=5u8 {
            for sport in 0..u16::from(host) * 3 {
                for p in [proto::UDP, proto::TCP] {
                    n.translate_outbound(
                        &out(p, host, 5000 + sport, ip(8, 8, 8, 8), 53),
                        &SNAT,
                        None,
                    )
                    .unwrap();
                }
            }
        }
        // Two sessions on one mapping.
        n.translate_outbound(&out(proto::UDP, 2, 5000, ip(9, 9, 9, 9), 53), &SNAT, None)
            .unwrap();
        let key = |m: &MappingInfo| (m.proto, m.int_port, m.ext_addr, m.ext_port, m.sessions);
        for host in 0..=6u8 {
            let sub = ip(10, 0, 0, host);
            let mut want: Vec<_> = n
                .mappings()
                .filter(|m| m.int_addr == sub)
                .map(|m| key(&m))
                .collect();
            let mut got: Vec<_> = n.mappings_of(sub).map(|m| key(&m)).collect();
            want.sort_unstable();
            got.sort_unstable();
            assert_eq!(got, want, "{sub}");
            assert_eq!(
                got.len(),
                usize::from(host) * 6 * usize::from(host <= 5),
                "{sub}"
            );
        }
        assert!(n.mappings_of(ip(10, 0, 0, 2)).any(|m| m.sessions == 2));
    }

    #[test]
    fn pool_address_filter_has_no_false_negatives() {
        let c = cfg(200, DEFAULT_PORTS, 1);
        let n = nat(&c, 0);
        for a in &c.pools[0].addrs {
            assert!(n.is_pool_addr(u32::from(*a)), "{a}");
        }
        // Other addresses: exact whatever the filter bit says.
        for x in 0..=255u8 {
            let a = ip(192, 0, 2, x);
            assert_eq!(n.is_pool_addr(u32::from(a)), (1..=200).contains(&x), "{a}");
            assert!(!n.is_pool_addr(u32::from(ip(10, 9, x, 1))));
        }
    }

    #[test]
    fn predicted_reply_is_the_reply_of_an_existing_mapping() {
        for mapping in [
            MappingBehaviour::EndpointIndependent,
            MappingBehaviour::AddressAndPortDependent,
        ] {
            let mut c = cfg(2, DEFAULT_PORTS, 1);
            c.mapping = mapping;
            let mut n = nat(&c, 0);
            for p in [proto::UDP, proto::TCP, proto::ICMP] {
                let first = out(p, 1, 5000, ip(8, 8, 8, 8), 53);
                assert_eq!(n.predict_outbound_reply(&first), None, "no mapping yet");
                n.prefetch_outbound(&first);
                n.translate_outbound(&first, &SNAT, None).unwrap();
                // The next connection of the endpoint (same destination for
                // APDM, which maps per destination).
                let next = match mapping {
                    MappingBehaviour::EndpointIndependent => out(p, 1, 5000, ip(9, 9, 9, 9), 54),
                    MappingBehaviour::AddressAndPortDependent => first,
                };
                let guess = n.predict_outbound_reply(&next);
                let r = n.translate_outbound(&next, &SNAT, None).unwrap();
                assert_eq!(guess, Some(r), "{p}");
            }
        }
    }

    #[test]
    fn apdm_gets_one_mapping_per_destination() {
        let mut c = cfg(1, DEFAULT_PORTS, 1);
        c.mapping = MappingBehaviour::AddressAndPortDependent;
        let mut n = nat(&c, 0);
        let a = n
            .translate_outbound(&out(proto::TCP, 1, 5000, ip(8, 8, 8, 8), 80), &SNAT, None)
            .unwrap();
        let b = n
            .translate_outbound(&out(proto::TCP, 1, 5000, ip(8, 8, 8, 8), 443), &SNAT, None)
            .unwrap();
        assert_ne!(a.dport, b.dport);
        assert_eq!(n.stats().mappings, 2);
    }

    #[test]
    fn reply_key_reaches_the_originating_host() {
        let c = cfg(2, DEFAULT_PORTS, 1);
        let mut n = nat(&c, 0);
        let orig = out(proto::TCP, 7, 40000, ip(203, 0, 113, 9), 443);
        let reply = n.translate_outbound(&orig, &SNAT, None).unwrap();
        assert_eq!((reply.src, reply.sport), (orig.dst, orig.dport));
        assert!(c.pools[0].addrs.contains(&reply.dst_addr()));
        // The fast path rewrites a reply packet (tuple `reply`) into the
        // reverse of `orig`: it reaches 10.0.0.7:40000.
        let back = Rewrite4::new(&reply, &orig.reversed());
        assert_eq!(back.to().dst_addr(), ip(10, 0, 0, 7));
        assert_eq!(back.to().dport, 40000);
    }

    #[test]
    fn icmp_query_mapping_rewrites_identifier_in_both_fields() {
        let c = cfg(1, DEFAULT_PORTS, 1);
        let mut n = nat(&c, 0);
        let orig = out(proto::ICMP, 3, 77, ip(8, 8, 8, 8), 77);
        let reply = n.translate_outbound(&orig, &SNAT, None).unwrap();
        assert_eq!(reply.sport, reply.dport, "ICMP keys hold the id twice");
        assert_eq!(reply.src, orig.dst);
        assert_eq!(
            n.inbound_new(&reply.reversed().reversed()),
            None,
            "no inbound ICMP sessions"
        );
        n.release(&orig, &reply);
        assert_eq!(n.stats().mappings, 0);
    }

    #[test]
    fn paired_pooling_same_external_address_for_a_host() {
        let c = cfg(16, DEFAULT_PORTS, 4);
        let mut workers: Vec<_> = (0..4).map(|w| nat(&c, w)).collect();
        for host in 1..50u8 {
            let mut addrs = HashSet::new();
            for (i, n) in workers.iter_mut().enumerate() {
                for port in 0..5u16 {
                    let o = out(
                        proto::UDP,
                        host,
                        1000 + port * 7 + i as u16,
                        ip(1, 1, 1, 1),
                        53,
                    );
                    addrs.insert(n.translate_outbound(&o, &SNAT, None).unwrap().dst);
                }
            }
            // RFC 4787 REQ-2, on every worker.
            assert_eq!(addrs.len(), 1, "host {host}");
            let want = c.paired_addr(PoolId(0), ip(10, 0, 0, host)).unwrap();
            assert!(addrs.contains(&u32::from(want)));
        }
    }

    #[test]
    fn pool_exhaustion_is_an_error_then_release_recovers() {
        let c = cfg(1, 5000..=5009, 1);
        let mut n = nat(&c, 0);
        let mut sessions = Vec::new();
        for p in 0..10 {
            let o = out(proto::TCP, 1, 20000 + p, ip(8, 8, 8, 8), 80);
            sessions.push((o, n.translate_outbound(&o, &SNAT, None).unwrap()));
        }
        let o = out(proto::TCP, 1, 30000, ip(8, 8, 8, 8), 80);
        assert_eq!(
            n.translate_outbound(&o, &SNAT, None),
            Err(NatError::PoolExhausted)
        );
        assert_eq!(n.stats().pool_exhausted, 1);
        // Other protocols have their own port space.
        assert!(n
            .translate_outbound(&out(proto::UDP, 1, 1, ip(8, 8, 8, 8), 53), &SNAT, None)
            .is_ok());
        assert_eq!(n.free_ports(ip(192, 0, 2, 1), proto::TCP), Some(0));
        let (o0, r0) = sessions[3];
        n.release(&o0, &r0);
        assert_eq!(n.free_ports(ip(192, 0, 2, 1), proto::TCP), Some(1));
        let again = n.translate_outbound(&o, &SNAT, None).unwrap();
        assert_eq!(again.dport, r0.dport, "the freed port is reused");
    }

    #[test]
    fn paired_pool_does_not_spill_but_arbitrary_does() {
        let mut c = cfg(2, 5000..=5000, 1);
        let host_on = |c: &NatConfig, a: Ipv4Addr| {
            (1..=255u8)
                .find(|h| c.paired_addr(PoolId(0), ip(10, 0, 0, *h)) == Some(a))
                .unwrap()
        };
        let h = host_on(&c, ip(192, 0, 2, 1));
        let mut n = nat(&c, 0);
        n.translate_outbound(&out(proto::UDP, h, 1, ip(8, 8, 8, 8), 53), &SNAT, None)
            .unwrap();
        let second = out(proto::UDP, h, 2, ip(8, 8, 8, 8), 53);
        assert_eq!(
            n.translate_outbound(&second, &SNAT, None),
            Err(NatError::PoolExhausted)
        );
        c.pooling = Pooling::Arbitrary;
        let mut n = nat(&c, 0);
        let a = n
            .translate_outbound(&out(proto::UDP, h, 1, ip(8, 8, 8, 8), 53), &SNAT, None)
            .unwrap();
        let b = n.translate_outbound(&second, &SNAT, None).unwrap();
        assert_ne!(a.dst, b.dst);
    }

    #[test]
    fn workers_allocate_disjoint_ports_owned_by_themselves() {
        let c = cfg(1, 1024..=1100, 3);
        let mut ext = HashSet::new();
        for w in 0..3 {
            let mut n = nat(&c, w);
            let mut k = 0;
            while let Ok(r) = n.translate_outbound(
                &out(proto::TCP, 1, 10000 + k, ip(8, 8, 8, 8), 80),
                &SNAT,
                None,
            ) {
                assert_eq!(c.owner_of(r.dport), w);
                assert_eq!(n.owner_of(r.dport), w);
                assert!(ext.insert(r.dport), "port {} handed out twice", r.dport);
                k += 1;
            }
        }
        assert_eq!(ext.len(), 77, "the workers together use the whole range");
    }

    #[test]
    fn filtering_behaviours() {
        let remote = ip(198, 51, 100, 1);
        for (f, same_addr_other_port, other_addr) in [
            (FilteringBehaviour::EndpointIndependent, true, true),
            (FilteringBehaviour::AddressDependent, true, false),
            (FilteringBehaviour::AddressAndPortDependent, false, false),
        ] {
            let mut c = cfg(1, DEFAULT_PORTS, 1);
            c.filtering = f;
            let mut n = nat(&c, 0);
            let orig = out(proto::UDP, 1, 4000, remote, 3478);
            let reply = n.translate_outbound(&orig, &SNAT, None).unwrap();
            let (ea, ep) = (reply.dst_addr(), reply.dport);
            // A second destination keeps the mapping alive throughout.
            let orig2 = out(proto::UDP, 1, 4000, ip(198, 51, 100, 2), 3478);
            let reply2 = n.translate_outbound(&orig2, &SNAT, None).unwrap();
            assert_eq!((reply2.dst, reply2.dport), (reply.dst, reply.dport));
            let from = |a: Ipv4Addr, p: u16| FlowKey4::new(proto::UDP, a, p, ea, ep);
            let mut opened = Vec::new();
            let r = n.inbound_new(&from(remote, 9999));
            assert_eq!(r.is_some(), same_addr_other_port, "{f:?}");
            opened.extend(r);
            let r = n.inbound_new(&from(ip(203, 0, 113, 5), 3478));
            assert_eq!(r.is_some(), other_addr, "{f:?}");
            opened.extend(r);
            assert_eq!(
                n.stats().filtered,
                u64::from(!same_addr_other_port) + u64::from(!other_addr)
            );
            // No mapping at all: never admitted.
            assert!(n
                .inbound_new(&FlowKey4::new(
                    proto::UDP,
                    remote,
                    3478,
                    ea,
                    ep.wrapping_add(1)
                ))
                .is_none());
            for (o, r) in opened {
                n.release(&o, &r);
            }
            // Once the session to `remote` is gone, its permit goes too.
            n.release(&orig, &reply);
            let back = n.inbound_new(&from(remote, 3478));
            assert_eq!(
                back.is_some(),
                f == FilteringBehaviour::EndpointIndependent,
                "{f:?}"
            );
            assert!(
                n.inbound_new(&from(ip(198, 51, 100, 2), 3478)).is_some(),
                "{f:?}"
            );
        }
    }

    #[test]
    fn inbound_session_keeps_mapping_alive() {
        let c = cfg(1, DEFAULT_PORTS, 1);
        let mut n = nat(&c, 0);
        let orig = out(proto::TCP, 1, 4000, ip(8, 8, 8, 8), 80);
        let reply = n.translate_outbound(&orig, &SNAT, None).unwrap();
        let inb = FlowKey4::new(
            proto::TCP,
            ip(5, 5, 5, 5),
            6000,
            reply.dst_addr(),
            reply.dport,
        );
        let (io, ir) = n.inbound_new(&inb).unwrap();
        assert_eq!(io, inb);
        assert_eq!((ir.src_addr(), ir.sport), (ip(10, 0, 0, 1), 4000));
        assert_eq!((ir.dst, ir.dport), (inb.src, inb.sport));
        n.release(&orig, &reply);
        assert_eq!(n.stats().mappings, 1, "inbound session still holds it");
        n.release(&io, &ir);
        assert_eq!(n.stats().mappings, 0);
        assert_eq!(n.stats().sessions, 0);
        // Releasing an unknown or untranslated entry is a no-op.
        n.release(&orig, &orig.reversed());
        n.release(&orig, &reply);
        assert_eq!(n.stats().mappings_removed, 1);
    }

    #[test]
    fn hairpinning_translates_both_ends() {
        let c = cfg(4, DEFAULT_PORTS, 1);
        let mut n = nat(&c, 0);
        // Host 2 has a mapping (e.g. a peer-to-peer client).
        let o2 = out(proto::UDP, 2, 7000, ip(8, 8, 8, 8), 3478);
        let r2 = n.translate_outbound(&o2, &SNAT, None).unwrap();
        // Host 1 sends to host 2's external endpoint.
        let o1 = FlowKey4::new(proto::UDP, ip(10, 0, 0, 1), 6000, r2.dst_addr(), r2.dport);
        let r1 = n.translate_outbound(&o1, &SNAT, None).unwrap();
        // RFC 4787 REQ-9: host 2 sees host 1's external endpoint.
        assert_eq!((r1.src_addr(), r1.sport), (ip(10, 0, 0, 2), 7000));
        let m1 = n
            .mapping_by_ext(proto::UDP, r1.dst_addr(), r1.dport)
            .unwrap();
        assert_eq!((m1.int_addr, m1.int_port), (ip(10, 0, 0, 1), 6000));
        assert_eq!(n.stats().hairpins, 1);
        assert_eq!(
            n.mapping_by_ext(proto::UDP, r2.dst_addr(), r2.dport)
                .unwrap()
                .sessions,
            2
        );
        n.release(&o2, &r2);
        n.release(&o1, &r1);
        assert_eq!(n.stats().mappings, 0);
        // The same through `hairpin` (the engine's entry point for a packet
        // known to come from the inside): same realm, both ends translated.
        let r2 = n.translate_outbound(&o2, &SNAT, None).unwrap();
        let o1 = FlowKey4::new(proto::UDP, ip(10, 0, 0, 1), 6000, r2.dst_addr(), r2.dport);
        let r1 = n.hairpin(&o1).unwrap().unwrap();
        assert_eq!((r1.src_addr(), r1.sport), (ip(10, 0, 0, 2), 7000));
        // The sender got a mapping of its own, in the same pool.
        let m1 = n
            .mapping_by_ext(proto::UDP, r1.dst_addr(), r1.dport)
            .unwrap();
        assert_eq!((m1.int_addr, m1.int_port), (ip(10, 0, 0, 1), 6000));
        n.release(&o1, &r1);
        n.release(&o2, &r2);
        assert_eq!(n.stats().mappings, 0);
        // No mapping there, or ICMP: not a hairpin.
        let o3 = FlowKey4::new(proto::UDP, ip(10, 0, 0, 1), 6000, ip(8, 8, 8, 8), 53);
        assert!(n.hairpin(&o3).is_none());
        // Hairpinning off: plain SNAT.
        let mut c = c;
        c.hairpinning = false;
        let mut n = nat(&c, 0);
        let r2 = n.translate_outbound(&o2, &SNAT, None).unwrap();
        let o1 = FlowKey4::new(proto::UDP, ip(10, 0, 0, 1), 6000, r2.dst_addr(), r2.dport);
        let r1 = n.translate_outbound(&o1, &SNAT, None).unwrap();
        assert_eq!((r1.src, r1.sport), (o1.dst, o1.dport));
        assert!(n.hairpin(&o1).is_none());
    }

    #[test]
    fn subscriber_limit() {
        let mut c = cfg(1, DEFAULT_PORTS, 1);
        c.max_sessions_per_subscriber = 3;
        let mut n = nat(&c, 0);
        let mut s = Vec::new();
        for p in 0..3 {
            let o = out(proto::TCP, 1, 100 + p, ip(8, 8, 8, 8), 80);
            s.push((o, n.translate_outbound(&o, &SNAT, None).unwrap()));
        }
        let o = out(proto::TCP, 1, 200, ip(8, 8, 8, 8), 80);
        assert_eq!(
            n.translate_outbound(&o, &SNAT, None),
            Err(NatError::SubscriberLimit)
        );
        let inb = FlowKey4::new(
            proto::TCP,
            ip(5, 5, 5, 5),
            1,
            s[0].1.dst_addr(),
            s[0].1.dport,
        );
        assert_eq!(n.inbound_new(&inb), None);
        assert!(n
            .translate_outbound(&out(proto::TCP, 2, 200, ip(8, 8, 8, 8), 80), &SNAT, None)
            .is_ok());
        n.release(&s[0].0, &s[0].1);
        assert!(n.translate_outbound(&o, &SNAT, None).is_ok());
        assert_eq!(n.stats().subscriber_limit, 2);
    }

    #[test]
    fn masquerade_slots() {
        let mut c = cfg(1, DEFAULT_PORTS, 2);
        c.masquerade_slots = 1;
        let mut n = nat(&c, 1);
        let o = out(proto::TCP, 1, 100, ip(8, 8, 8, 8), 80);
        let m = Translation::Masquerade;
        assert_eq!(
            n.translate_outbound(&o, &m, None),
            Err(NatError::NoEgressAddress)
        );
        assert_eq!(
            n.translate_outbound(&o, &m, Some(Ipv4Addr::UNSPECIFIED)),
            Err(NatError::NoEgressAddress)
        );
        let r = n
            .translate_outbound(&o, &m, Some(ip(100, 64, 0, 1)))
            .unwrap();
        assert_eq!(r.dst_addr(), ip(100, 64, 0, 1));
        assert_eq!(n.owner_of(r.dport), 1);
        let o2 = out(proto::TCP, 1, 101, ip(8, 8, 8, 8), 80);
        assert_eq!(
            n.translate_outbound(&o2, &m, Some(ip(100, 64, 0, 2))),
            Err(NatError::MasqueradeSlotsExhausted)
        );
        // Masquerading to a pool address shares the pool's bitmap.
        let rp = n
            .translate_outbound(&o2, &m, Some(ip(192, 0, 2, 1)))
            .unwrap();
        assert_eq!(rp.dst_addr(), ip(192, 0, 2, 1));
        n.release(&o, &r);
        // The slot is free again: a new egress address (DHCP renumbering).
        let r3 = n
            .translate_outbound(&o, &m, Some(ip(100, 64, 0, 2)))
            .unwrap();
        assert_eq!(r3.dst_addr(), ip(100, 64, 0, 2));
        assert_eq!(
            n.translate_outbound(&o, &Translation::Snat { pool: PoolId(5) }, None),
            Err(NatError::UnknownPool)
        );
        let gre = FlowKey4::new(47, ip(10, 0, 0, 1), 0, ip(8, 8, 8, 8), 0);
        assert_eq!(
            n.translate_outbound(&gre, &SNAT, None),
            Err(NatError::UnsupportedProtocol)
        );
    }

    #[test]
    fn dnat_port_forward() {
        let c = cfg(1, DEFAULT_PORTS, 1);
        let mut n = nat(&c, 0);
        let orig = FlowKey4::new(proto::TCP, ip(5, 5, 5, 5), 50000, ip(192, 0, 2, 1), 8080);
        let t = Translation::Dnat {
            addr: ip(10, 0, 0, 80),
            port: Some(80),
        };
        let reply = n.translate_outbound(&orig, &t, None).unwrap();
        assert_eq!(
            reply,
            FlowKey4::new(proto::TCP, ip(10, 0, 0, 80), 80, ip(5, 5, 5, 5), 50000)
        );
        let keep = n.dnat(&orig, ip(10, 0, 0, 80), None).unwrap();
        assert_eq!(keep.sport, 8080);
        assert_eq!(n.stats().sessions, 0, "static DNAT holds no mapping");
        n.release(&orig, &reply);
    }

    #[test]
    fn clear_frees_everything_and_logs() {
        let c = cfg(2, 3000..=3999, 1);
        let mut n = nat(&c, 0);
        for h in 1..20 {
            for p in 0..5 {
                let o = out(proto::UDP, h, 1000 + p, ip(8, 8, 8, 8), 53);
                n.translate_outbound(&o, &SNAT, None).unwrap();
            }
        }
        assert_eq!(n.stats().mappings, 95);
        let room = n.by_ext.capacity();
        n.clear();
        let s = n.stats();
        assert_eq!((s.mappings, s.sessions, s.subscribers), (0, 0, 0));
        // The external-side table keeps its allocation.
        assert_eq!(n.by_ext.capacity(), room);
        assert_eq!(n.free_ports(ip(192, 0, 2, 1), proto::UDP), Some(1000));
        assert_eq!(n.free_ports(ip(192, 0, 2, 2), proto::UDP), Some(1000));
        let removed = n
            .sink()
            .events
            .iter()
            .filter(|e| matches!(e, NatEvent::MappingRemoved { .. }))
            .count();
        assert_eq!(removed, 95);
    }

    /// The block events of `n` not yet seen (from `seen` on), applied to
    /// the model `held`: (external address, first port) -> (subscriber,
    /// last port). Fails on a block given twice or freed by another owner.
    fn replay_blocks(
        n: &WorkerNat<VecSink>,
        seen: &mut usize,
        held: &mut StdMap<(Ipv4Addr, u16), (Ipv4Addr, u16)>,
    ) {
        for e in n.sink().events.iter().skip(*seen) {
            match *e {
                NatEvent::BlockAllocated {
                    int_addr,
                    ext_addr,
                    first_port,
                    last_port,
                    ..
                } => assert!(
                    held.insert((ext_addr, first_port), (int_addr, last_port))
                        .is_none(),
                    "block {ext_addr}:{first_port} given twice"
                ),
                NatEvent::BlockReleased {
                    int_addr,
                    ext_addr,
                    first_port,
                    last_port,
                    ..
                } => assert_eq!(
                    held.remove(&(ext_addr, first_port)),
                    Some((int_addr, last_port)),
                    "block {ext_addr}:{first_port} freed but not held"
                ),
                ref m => panic!("per-mapping event with port blocks on: {m:?}"),
            }
        }
        *seen = n.sink().events.len();
    }

    #[test]
    fn port_blocks_are_logged_once_and_hold_the_ports() {
        let mut c = cfg(2, 1024..=2047, 1);
        c.port_block_size = 64;
        let mut n = nat(&c, 0);
        let mut sessions = Vec::new();
        // 64 TCP and 10 UDP mappings of one host: one block, shared by
        // the protocols, then a second when its 64 TCP ports are used.
        for p in 0..65 {
            let o = out(proto::TCP, 1, 30000 + p, ip(8, 8, 8, 8), 80);
            sessions.push((o, n.translate_outbound(&o, &SNAT, None).unwrap()));
        }
        for p in 0..10 {
            let o = out(proto::UDP, 1, 30000 + p, ip(8, 8, 8, 8), 53);
            sessions.push((o, n.translate_outbound(&o, &SNAT, None).unwrap()));
        }
        let (mut seen, mut held) = (0, StdMap::new());
        replay_blocks(&n, &mut seen, &mut held);
        assert_eq!(held.len(), 2, "{held:?}");
        let paired = c.paired_addr(PoolId(0), ip(10, 0, 0, 1)).unwrap();
        for (o, r) in &sessions {
            let inside = held.iter().any(|(&(a, first), &(sub, last))| {
                a == r.dst_addr() && sub == o.src_addr() && (first..=last).contains(&r.dport)
            });
            assert!(inside, "{r:?} outside the host's blocks {held:?}");
            assert_eq!(r.dst_addr(), paired, "paired pooling");
        }
        let st = n.stats();
        assert_eq!((st.blocks, st.blocks_allocated, st.mappings), (2, 2, 75));
        // Live lookups by external endpoint and by subscriber agree with
        // the events.
        let (o, r) = sessions[70];
        let (sub, first, last) = n.block_by_ext(r.dst_addr(), r.dport).unwrap();
        assert_eq!(sub, o.src_addr());
        assert_eq!(held.get(&(r.dst_addr(), first)), Some(&(sub, last)));
        let mut mine = n.blocks_of(o.src_addr());
        mine.sort_unstable();
        let mut logged: Vec<_> = held.iter().map(|(&(a, f), &(_, l))| (a, f, l)).collect();
        logged.sort_unstable();
        assert_eq!(mine, logged);
        assert_eq!(n.block_by_ext(ip(192, 0, 2, 9), 1024), None);
        // A second host gets a block of its own.
        let o = out(proto::UDP, 2, 5000, ip(8, 8, 8, 8), 53);
        let r = n.translate_outbound(&o, &SNAT, None).unwrap();
        replay_blocks(&n, &mut seen, &mut held);
        assert_eq!(held.len(), 3);
        n.release(&o, &r);
        replay_blocks(&n, &mut seen, &mut held);
        assert_eq!(held.len(), 2, "its last mapping freed its block");
        for (o, r) in sessions.drain(..) {
            n.release(&o, &r);
        }
        replay_blocks(&n, &mut seen, &mut held);
        assert!(held.is_empty());
        let st = n.stats();
        assert_eq!((st.blocks, st.blocks_released, st.mappings), (0, 3, 0));
        for a in &c.pools[0].addrs {
            assert_eq!(n.free_ports(*a, proto::TCP), Some(1024));
        }
    }

    #[test]
    fn port_block_limit_refuses_then_other_protocols_still_fit() {
        let mut c = cfg(1, 1024..=1151, 1);
        c.port_block_size = 32;
        c.max_blocks_per_subscriber = 1;
        let mut n = nat(&c, 0);
        for p in 0..32 {
            let o = out(proto::TCP, 1, 30000 + p, ip(8, 8, 8, 8), 80);
            n.translate_outbound(&o, &SNAT, None).unwrap();
        }
        let o = out(proto::TCP, 1, 40000, ip(8, 8, 8, 8), 80);
        assert_eq!(
            n.translate_outbound(&o, &SNAT, None),
            Err(NatError::BlockLimit)
        );
        assert_eq!(n.stats().block_limit, 1);
        // The block's UDP ports are the subscriber's too.
        let o = out(proto::UDP, 1, 40000, ip(8, 8, 8, 8), 53);
        let r = n.translate_outbound(&o, &SNAT, None).unwrap();
        assert!((1024..=1055).contains(&r.dport), "{r:?}");
        // Other hosts take the other three blocks, then the pool is out.
        for h in 2..=4 {
            let o = out(proto::TCP, h, 1, ip(8, 8, 8, 8), 80);
            n.translate_outbound(&o, &SNAT, None).unwrap();
        }
        let o = out(proto::TCP, 5, 1, ip(8, 8, 8, 8), 80);
        assert_eq!(
            n.translate_outbound(&o, &SNAT, None),
            Err(NatError::PoolExhausted)
        );
        // A flush frees every block, logged.
        n.clear();
        let released = n
            .sink()
            .events
            .iter()
            .filter(|e| matches!(e, NatEvent::BlockReleased { .. }))
            .count();
        assert_eq!(released, 4);
        assert_eq!(n.stats().blocks, 0);
        let o = out(proto::TCP, 5, 1, ip(8, 8, 8, 8), 80);
        assert!(n.translate_outbound(&o, &SNAT, None).is_ok());
    }

    #[test]
    fn deterministic_nat_gives_each_subscriber_its_computed_block() {
        for workers in [1u16, 2] {
            let mut c = cfg(2, 1024..=2047, workers);
            c.port_block_size = 64;
            c.deterministic = Some((ip(10, 0, 0, 0), 32 - 3)); // 8 subscribers
            assert_eq!(c.validate(), Ok(()));
            for w in 0..workers {
                let mut n = nat(&c, w);
                for host in 0..8u8 {
                    let sub = ip(10, 0, 0, host);
                    let (addr, ranges) = c.deterministic_block(PoolId(0), sub).unwrap();
                    let (first, last) = ranges[usize::from(w)];
                    for p in 0..3 {
                        let o = out(proto::UDP, host, 7000 + p, ip(8, 8, 8, 8), 53);
                        let r = n.translate_outbound(&o, &SNAT, None).unwrap();
                        assert_eq!(r.dst_addr(), addr, "host {host} worker {w}");
                        assert!(
                            (first..=last).contains(&r.dport),
                            "{r:?} not in {first}-{last}"
                        );
                        assert_eq!(owner_of(r.dport, workers), w);
                        assert_eq!(
                            c.deterministic_subscriber(PoolId(0), r.dst_addr(), r.dport),
                            Some(sub)
                        );
                    }
                }
                // Outside the prefix: refused, counted.
                let o = out(proto::UDP, 8, 7000, ip(8, 8, 8, 8), 53);
                assert_eq!(
                    n.translate_outbound(&o, &SNAT, None),
                    Err(NatError::OutsidePrefix)
                );
                assert_eq!(n.stats().outside_prefix, 1);
                // One block per subscriber: when it is full, refused.
                let mut got = 3;
                let err = loop {
                    let o = out(proto::UDP, 0, 9000 + got, ip(8, 8, 8, 8), 53);
                    match n.translate_outbound(&o, &SNAT, None) {
                        Ok(_) => got += 1,
                        Err(e) => break e,
                    }
                };
                assert_eq!((err, got), (NatError::BlockLimit, 64));
            }
        }
    }

    #[test]
    fn masquerade_to_a_pool_address_uses_its_blocks() {
        let mut c = cfg(1, 1024..=1087, 1);
        c.port_block_size = 16;
        let mut n = nat(&c, 0);
        let o = out(proto::UDP, 1, 7000, ip(8, 8, 8, 8), 53);
        let r = n
            .translate_outbound(&o, &Translation::Masquerade, Some(ip(192, 0, 2, 1)))
            .unwrap();
        let o2 = out(proto::UDP, 1, 7001, ip(8, 8, 8, 8), 53);
        let r2 = n.translate_outbound(&o2, &SNAT, None).unwrap();
        let (mut seen, mut held) = (0, StdMap::new());
        replay_blocks(&n, &mut seen, &mut held);
        assert_eq!(held.len(), 1, "one block for both: {held:?}");
        assert!((1024..=1039).contains(&r.dport) && (1024..=1039).contains(&r2.dport));
    }

    #[test]
    fn config_errors() {
        let c = cfg(1, DEFAULT_PORTS, 2);
        assert_eq!(
            WorkerNat::new(&c, 2, NoopSink).err(),
            Some(ConfigError::WorkerOutOfRange)
        );
        assert_eq!(NatError::PoolExhausted.to_string(), "NAT pool exhausted");
    }

    // ---- property tests -------------------------------------------------

    #[derive(Clone, Debug)]
    enum Op {
        Out {
            p: u8,
            host: u8,
            sport: u16,
            dst: u8,
            dport: u16,
        },
        In {
            pick: usize,
            src: u8,
            sport: u16,
        },
        Release {
            pick: usize,
        },
    }

    fn arb_op() -> impl Strategy<Value = Op> {
        let p = prop_oneof![Just(proto::TCP), Just(proto::UDP), Just(proto::ICMP)];
        prop_oneof![
            4 => (p, 1u8..8, 1u16..6, 1u8..4, 1u16..3)
                .prop_map(|(p, host, sport, dst, dport)| Op::Out { p, host, sport, dst, dport }),
            1 => (any::<usize>(), 1u8..4, 1u16..3).prop_map(|(pick, src, sport)| Op::In { pick, src, sport }),
            3 => any::<usize>().prop_map(|pick| Op::Release { pick }),
        ]
    }

    fn check_invariants(
        n: &WorkerNat<VecSink>,
        c: &NatConfig,
        w: u16,
        live: &[(FlowKey4, FlowKey4)],
    ) {
        // Unique external endpoint per mapping; the two indexes agree.
        assert_eq!(n.by_int.len(), n.by_ext.len());
        let in_pools = n
            .by_ext
            .values()
            .filter(|m| matches!(m.space, Space::Pool { .. }))
            .count();
        assert_eq!(n.slot_mappings.iter().sum::<u64>(), in_pools as u64);
        for (k, v) in n.by_int.iter() {
            let k = &MapKey::of_int(&k);
            let e = &ExtKey {
                proto: k.proto,
                addr: v.ext().0,
                port: v.ext().1,
            };
            let m = n.by_ext.get(e).unwrap();
            assert_eq!(m.key, *k);
            assert!(v.sessions() > 0, "no mapping without a session");
            assert_eq!(owner_of(e.port, c.workers), w);
            // RFC 4787 REQ-2.
            assert_eq!(
                Some(Ipv4Addr::from(e.addr)),
                c.paired_addr(PoolId(0), Ipv4Addr::from(k.int_addr))
            );
        }
        // Session refcounts equal what the live sessions hold.
        let mut held: StdMap<ExtKey, u32> = StdMap::new();
        for (o, r) in live {
            for s in n.session_refs(o, r).into_iter().flatten() {
                *held.entry(s.ext).or_default() += 1;
            }
        }
        for (e, m) in &n.by_ext {
            assert_eq!(held.get(e).copied().unwrap_or(0), n.sessions_of(e, m));
        }
        // Ports in use + free = slice size.
        for a in &c.pools[0].addrs {
            for p in [proto::TCP, proto::UDP, proto::ICMP] {
                let used = n
                    .by_ext
                    .keys()
                    .filter(|e| e.addr == u32::from(*a) && e.proto == p)
                    .count() as u32;
                let total = n.ports_per_addr(PoolId(0)).unwrap();
                assert_eq!(n.free_ports(*a, p).unwrap() + used, total);
            }
        }
        // Reply keys are distinct (they are conntrack keys).
        let replies: HashSet<_> = live.iter().map(|(_, r)| *r).collect();
        assert_eq!(replies.len(), live.len());
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]

        #[test]
        fn port_block_invariants(
            ops in proptest::collection::vec((0u8..3, 1u8..6, 0u16..24, 0u8..4, 0usize..64), 1..200),
            w in 0u16..2,
            arbitrary in any::<bool>(),
            max in 0u16..3,
        ) {
            let mut c = cfg(2, 2000..=2063, 2);
            c.port_block_size = 8;
            c.max_blocks_per_subscriber = max;
            if arbitrary {
                c.pooling = Pooling::Arbitrary;
            }
            let mut n = nat(&c, w);
            let mut live: Vec<(FlowKey4, FlowKey4)> = Vec::new();
            let (mut seen, mut held) = (0usize, StdMap::new());
            for (pi, host, sport, op, pick) in ops {
                if op == 0 && !live.is_empty() {
                    let (o, r) = live.swap_remove(pick % live.len());
                    n.release(&o, &r);
                } else {
                    let p = [proto::TCP, proto::UDP, proto::ICMP][usize::from(pi)];
                    let o = out(p, host, sport, ip(198, 51, 100, 1), 80);
                    if live.iter().any(|(lo, _)| *lo == o) {
                        continue;
                    }
                    match n.translate_outbound(&o, &SNAT, None) {
                        Ok(r) => live.push((o, r)),
                        Err(NatError::BlockLimit) => prop_assert!(max > 0),
                        Err(e) => prop_assert_eq!(e, NatError::PoolExhausted),
                    }
                }
                replay_blocks(&n, &mut seen, &mut held);
                // Every live mapping's port is in a block its host holds,
                // and owned by this worker.
                for (o, r) in &live {
                    prop_assert_eq!(owner_of(r.dport, 2), w);
                    let inside = held.iter().any(|(&(a, first), &(sub, last))| {
                        a == r.dst_addr() && sub == o.src_addr() && (first..=last).contains(&r.dport)
                    });
                    prop_assert!(inside, "{:?} outside its host's blocks {:?}", r, held);
                }
                if max > 0 {
                    for h in 1..6u8 {
                        let k = held.values().filter(|(sub, _)| *sub == ip(10, 0, 0, h)).count();
                        prop_assert!(k <= usize::from(max));
                    }
                }
                prop_assert_eq!(n.stats().blocks, held.len() as u64);
            }
            for (o, r) in live.drain(..) {
                n.release(&o, &r);
            }
            replay_blocks(&n, &mut seen, &mut held);
            prop_assert!(held.is_empty());
            for a in &c.pools[0].addrs {
                prop_assert_eq!(n.free_ports(*a, proto::UDP), Some(32));
            }
        }

        #[test]
        fn nat_invariants_hold(ops in proptest::collection::vec(arb_op(), 1..120), w in 0u16..2, filt in 0u8..3) {
            let mut c = cfg(3, 2000..=2011, 2);
            c.filtering = [FilteringBehaviour::EndpointIndependent, FilteringBehaviour::AddressDependent,
                FilteringBehaviour::AddressAndPortDependent][usize::from(filt)];
            let mut n = nat(&c, w);
            let mut live: Vec<(FlowKey4, FlowKey4)> = Vec::new();
            // Endpoint-independent mapping reference: int endpoint -> ext.
            let mut eim: StdMap<(u8, u32, u16), (u32, u16)> = StdMap::new();
            for op in ops {
                match op {
                    Op::Out { p, host, sport, dst, dport } => {
                        let o = out(p, host, sport, ip(198, 51, 100, dst), dport);
                        if live.iter().any(|(lo, lr)| *lo == o || lr.reversed() == o) {
                            continue; // conntrack would hit
                        }
                        match n.translate_outbound(&o, &SNAT, None) {
                            Ok(r) => {
                                // The reply goes back to the sender.
                                let m = n.mapping_by_ext(p, r.dst_addr(), r.dport).unwrap();
                                prop_assert_eq!((u32::from(m.int_addr), m.int_port), (o.src, o.sport));
                                // RFC 4787 REQ-1 while the mapping lives.
                                if let Some(prev) = eim.get(&(p, o.src, o.sport)) {
                                    prop_assert_eq!(*prev, (r.dst, r.dport));
                                }
                                eim.insert((p, o.src, o.sport), (r.dst, r.dport));
                                if live.iter().any(|(lo, lr)| *lr == r || lo.reversed() == r) {
                                    prop_assert!(false, "reply key collides");
                                }
                                live.push((o, r));
                            }
                            Err(e) => prop_assert_eq!(e, NatError::PoolExhausted),
                        }
                    }
                    Op::In { pick, src, sport } => {
                        if live.is_empty() { continue; }
                        let (_, r) = live[pick % live.len()];
                        if r.proto == proto::ICMP { continue; }
                        let k = FlowKey4::new(r.proto, ip(203, 0, 113, src), sport, r.dst_addr(), r.dport);
                        if live.iter().any(|(lo, lr)| *lo == k || *lr == k) { continue; }
                        if let Some((io, ir)) = n.inbound_new(&k) {
                            prop_assert_eq!(io, k);
                            let m = n.mapping_by_ext(k.proto, k.dst_addr(), k.dport).unwrap();
                            prop_assert_eq!((ir.src_addr(), ir.sport), (m.int_addr, m.int_port));
                            live.push((io, ir));
                        }
                    }
                    Op::Release { pick } => {
                        if live.is_empty() { continue; }
                        let (o, r) = live.swap_remove(pick % live.len());
                        n.release(&o, &r);
                    }
                }
                // Forget EIM reference entries whose mapping died.
                eim.retain(|(p, a, port), _| n.by_int.iter().any(|(k, _)| k.proto == *p && k.int_addr == *a && k.int_port == *port));
                check_invariants(&n, &c, w, &live);
            }
            for (o, r) in live.drain(..) {
                n.release(&o, &r);
            }
            let s = n.stats();
            prop_assert_eq!((s.mappings, s.sessions, s.subscribers), (0, 0, 0));
            prop_assert!(n.permits.is_empty());
            let created = n.sink().events.iter().filter(|e| matches!(e, NatEvent::MappingCreated { .. })).count();
            prop_assert_eq!(created as u64, s.mappings_removed);
            for a in &c.pools[0].addrs {
                prop_assert_eq!(n.free_ports(*a, proto::UDP), Some(6));
            }
        }
    }
}
