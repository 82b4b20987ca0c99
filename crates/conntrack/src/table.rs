//! The connection table: a slab of entries plus the two-key index.

use core::fmt;
use core::time::Duration;

use sluice_io::mem::{advise_huge_pages, populate, prefetch};

use crate::entry::{
    offload_bit, Entry, F_ASSURED, F_FLOWTABLE, F_LIVE, F_OFFLOAD, F_SEEN_REPLY, F_TIMEOUT_POLICY,
};
use crate::index::Index;
use crate::proto::{
    self, CtState, L4Event, ProtoState, TcpFlags, TcpState, Tracked, UdpState, Verdict,
};
use crate::time::{expiry_after, Instant, TimeoutKind, TimeoutPolicy, TimeoutTable, Timeouts};

/// The TCP flags that select netfilter's transition (`get_conntrack_index`)
/// or make a combination invalid; PSH, ECE and CWR do neither.
const TCP_CLASS_BITS: u8 =
    TcpFlags::SYN | TcpFlags::ACK | TcpFlags::FIN | TcpFlags::RST | TcpFlags::URG;
use crate::{Dir, EntryId, Key};

/// Largest supported `max` (entry indices take 31 bits in the index).
pub const MAX_CONNECTIONS: u32 = (1 << 31) - 1;

const NONE: u32 = u32::MAX;

/// Table configuration. There is no hash size to tune: the index is derived
/// from `capacity`.
#[derive(Clone, Copy, Debug)]
pub struct Config {
    /// Maximum number of connections (netfilter `nf_conntrack_max`). May
    /// be changed later with [`Table::set_max`], up to `capacity`.
    pub max: u32,
    /// Connections the table is built for: the index is sized so that it
    /// is at most 55 % full with `capacity` connections, and the slab is
    /// reserved for that many. [`Config::new`] sets it to `max`; a larger
    /// value costs the index's memory (about 33 bytes per connection of
    /// `capacity`) and lets [`Table::set_max`] raise `max` while running
    /// without ever loading the index beyond its design load (netfilter's
    /// `nf_conntrack_max` raised over a fixed `nf_conntrack_buckets` makes
    /// its chains longer instead).
    pub capacity: u32,
    /// Random hash seed, chosen by the caller (core crates never read
    /// randomness). Keys the hash against collision attacks.
    pub seed: u64,
    /// Per-state timeouts.
    pub timeouts: Timeouts,
    /// Let a mid-stream TCP ACK create an ESTABLISHED entry
    /// (`nf_conntrack_tcp_loose`, default on).
    pub tcp_loose: bool,
    /// Back the whole table with memory at [`Table::new`] (see
    /// [`sluice_io::mem::populate`]) instead of page by page as it fills.
    /// Costs the memory of `max` connections up front; saves the page
    /// faults (and the kernel's page zeroing) that would otherwise land on
    /// the packets creating connections. Off by default.
    pub prefault: bool,
    /// Back the index (about 33 bytes per connection of `max`) at
    /// [`Table::new`] even without [`Self::prefault`]. The entries fill in
    /// order, so backing them lazily costs one fault per 2 MiB of entries;
    /// the index is written where each key hashes, so every new connection
    /// lands on a page nothing has touched yet until all of them are
    /// backed, and on huge pages each of those faults zeroes 2 MiB. On the
    /// development VM a flood of new connections through a gateway with
    /// `max` = 32 M (1 GiB of index) set up about 1 000 connections per
    /// second until the index was backed; 0.38-0.43 M with the index backed
    /// at start, 0.49 M with the entries too (`sluice bench forward --setup
    /// --flows 16M`, 2026-11-24). The netfilter counterpart, its
    /// hash table, is allocated whole when conntrack loads. Off by default
    /// here (library users and tests); the gateway turns it on.
    pub prefault_index: bool,
}

impl Config {
    /// `max` connections, netfilter's timeouts, loose TCP pickup.
    pub fn new(max: u32, seed: u64) -> Self {
        Self {
            max,
            capacity: max,
            seed,
            timeouts: Timeouts::default(),
            tcp_loose: true,
            prefault: false,
            prefault_index: false,
        }
    }
}

/// Why a table could not be built.
#[derive(Clone, Copy, PartialEq, Eq, Debug, thiserror::Error)]
pub enum ConfigError {
    /// `max` is zero.
    #[error("conntrack max must be at least 1")]
    ZeroMax,
    /// `max` or `capacity` exceeds [`MAX_CONNECTIONS`].
    #[error("conntrack max exceeds {MAX_CONNECTIONS}")]
    TooLarge,
    /// `max` exceeds the capacity the table was built for.
    #[error("conntrack max {max} exceeds the table's capacity {capacity}")]
    AboveCapacity {
        /// The `max` asked for.
        max: u32,
        /// The table's capacity.
        capacity: u32,
    },
}

/// Why an insert failed.
#[derive(Clone, Copy, PartialEq, Eq, Debug, thiserror::Error)]
pub enum InsertError {
    /// The original or the reply key is already in the table.
    #[error("connection already tracked")]
    Exists,
    /// No room and no entry that may be dropped early.
    #[error("conntrack table full")]
    Full,
    /// The original and the reply key have different protocols.
    #[error("original and reply keys differ in protocol")]
    ProtoMismatch,
}

/// A key that [`Table::lookup_vacant`] found absent, with its hash: lets
/// [`Table::insert_vacant`] skip hashing and looking it up a second time.
/// It stays valid while nothing is inserted into the table that made it;
/// after an insert it is only a key, and `insert_vacant` looks it up again.
/// (Passing it to another table is a logic error: it may skip the check.)
#[derive(Clone, Copy, Debug)]
pub struct Vacant<K> {
    key: K,
    hash: u64,
    stamp: u64,
}

impl<K> Vacant<K> {
    /// The key that was looked up.
    pub fn key(&self) -> &K {
        &self.key
    }
}

/// The connection table for keys `K` with caller payload `P`.
///
/// Lookups are split so that a worker can pipeline a batch:
/// [`hash`](Self::hash) every key, [`prefetch_bucket`](Self::prefetch_bucket)
/// every hash, then [`lookup`](Self::lookup) (or the cheaper
/// [`candidate`](Self::candidate) + [`prefetch_entry`](Self::prefetch_entry)
/// + [`verify`](Self::verify)), then touch the entries.
pub struct Table<K: Key, P> {
    entries: Vec<Entry<K, P>>,
    index: Index,
    free_head: u32,
    len: u32,
    max: u32,
    capacity: u32,
    seed: [u64; 2],
    /// Compiled timeouts by policy slot ([`Entry::timeout_policy`]): slot
    /// 0 is the table's own, the others are a policy over them (slots no
    /// policy was set for hold the table's own too). Kept in the table
    /// itself, not behind a pointer: an established packet's refresh
    /// reads `timeouts[slot][timer]` at a fixed offset from the table (a
    /// `Box` cost `sluice bench nat44` about 2 % in 24 interleaved pairs).
    timeouts: Timeouts256,
    /// The policies set, by slot (room for all 255 reserved at
    /// [`Self::new`]: setting one never allocates).
    policies: Vec<(u8, TimeoutPolicy)>,
    /// Live entries per policy slot (slot 0 unused): what
    /// [`Self::timeout_slots_held`] reports, so that a slot no connection
    /// holds may be given another policy.
    held: [u32; 256],
    tcp_loose: bool,
    gc_cursor: usize,
    /// Counts inserts, so that a [`Vacant`] knows whether it still holds.
    stamp: u64,
    /// Entries evicted by early drop since the table was built.
    early_drops: u64,
    /// Test hook: hash every key to bucket 0.
    #[cfg(test)]
    pub(crate) degenerate: bool,
}

impl<K: Key, P> fmt::Debug for Table<K, P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Table")
            .field("len", &self.len)
            .field("max", &self.max)
            .field("capacity", &self.capacity)
            .finish()
    }
}

#[inline]
fn fold(a: u64, b: u64) -> u64 {
    let p = u128::from(a) * u128::from(b);
    (p as u64) ^ ((p >> 64) as u64)
}

/// The compiled timeouts of every policy slot.
type Timeouts256 = [TimeoutTable; 256];

/// Counts an entry of policy slot `slot` in (`on`) or out of `held`
/// ([`Table::timeout_slots_held`]). An imbalance would be a bug: it wraps
/// rather than panics, leaving the slot held, which only keeps it from
/// being given another policy.
fn hold(held: &mut [u32; 256], slot: u8, on: bool) {
    let n = &mut held[usize::from(slot)];
    debug_assert!(on || *n > 0, "slot {slot} released more than held");
    *n = if on {
        n.wrapping_add(1)
    } else {
        n.wrapping_sub(1)
    };
}

/// The time a new connection of IP protocol `proto` is left with by its
/// first packet `ev`, under `timeouts` and, if given, `policy` over them:
/// what [`Table::insert`], [`Table::track`] of that packet and
/// [`Table::apply_timeout_policy`] give its entry (for `sluice trace`,
/// which has no table). `None` when the packet does not validly start a
/// connection.
pub fn first_packet_timeout(
    timeouts: &Timeouts,
    policy: Option<&TimeoutPolicy>,
    proto: u8,
    ev: L4Event,
) -> Option<Duration> {
    let base = TimeoutTable::new(timeouts);
    let t = policy.map_or(base, |p| p.over(&base));
    let s = proto::step(ProtoState::initial(proto), false, false, Dir::Original, ev);
    if s.verdict != Verdict::Valid {
        return None;
    }
    let mut ms = t.get(s.timeout?);
    if s.cap_unack {
        ms = ms.min(t.get(TimeoutKind::TcpUnack));
    }
    Some(Duration::from_millis(u64::from(ms)))
}

/// A packet of a live, replied entry that changes nothing but its expiry
/// and packet count, or only makes a replied UDP connection an assured
/// stream: what [`Table::track`]'s established fast path and
/// [`Table::track_established`] take without the full state machine.
#[derive(Clone, Copy)]
struct QuickStep {
    /// The timeout the packet leaves the entry with.
    tmo: TimeoutKind,
    /// UDP `REPLIED` -> `STREAM`, and the entry becomes assured.
    becomes_stream: bool,
}

impl QuickStep {
    /// Update `e` as `proto::step` would for this packet (the caller has
    /// checked that `e` has not expired).
    #[inline(always)]
    fn apply<K: Key, P: Copy + Default>(
        self,
        e: &mut Entry<K, P>,
        now: Instant,
        timeouts: &Timeouts256,
    ) {
        if self.becomes_stream {
            e.state = UDP_STREAM;
            e.flags |= F_ASSURED;
        }
        e.packets = e.packets.wrapping_add(1);
        // The table's own timers: an entry with a policy never takes this
        // path (`quick_step` checks `F_TIMEOUT_POLICY` with the flags it
        // tests anyway; reading the entry's slot here cost `sluice bench
        // nat44` 2.5 % of its established throughput in 24 interleaved
        // pairs, 2026-11-25).
        debug_assert_eq!(e.timeout_policy, 0);
        e.expiry = expiry_after(now, timeouts[0].get(self.tmo));
    }
}

/// The [`QuickStep`] for packet `ev` on entry `e`, if it is one: a UDP
/// stream or a TCP ESTABLISHED connection's bare ACK (netfilter maps ES ->
/// ES) on a live, assured, replied entry, or any UDP packet on a live,
/// replied entry in `REPLIED`. These are the results `proto::step` gives
/// for them (verdict valid, `ct state` established).
/// Timer `tmo` of policy slot `slot` (the uncommon case of a refresh).
#[cold]
#[inline(never)]
fn policy_timer(timeouts: &Timeouts256, slot: u8, tmo: TimeoutKind) -> u32 {
    timeouts[usize::from(slot)].get(tmo)
}

const UDP_STREAM: u8 = ProtoState::Udp(UdpState::Stream).pack();
const UDP_REPLIED: u8 = ProtoState::Udp(UdpState::Replied).pack();
const TCP_ESTABLISHED: u8 = ProtoState::Tcp(TcpState::Established).pack();

#[inline(always)]
fn quick_step<K: Key, P: Copy + Default>(e: &Entry<K, P>, ev: L4Event) -> Option<QuickStep> {
    const HOT: u8 = F_LIVE | F_ASSURED | F_SEEN_REPLY;
    const REPLIED: u8 = F_LIVE | F_SEEN_REPLY;
    let hot = e.flags & (HOT | F_TIMEOUT_POLICY) == HOT;
    let (tmo, becomes_stream) = match (e.state, ev) {
        (UDP_STREAM, L4Event::Udp) if hot => (TimeoutKind::UdpStream, false),
        (TCP_ESTABLISHED, L4Event::Tcp(f)) if hot && f.0 & TCP_CLASS_BITS == TcpFlags::ACK => {
            (TimeoutKind::TcpEstablished, false)
        }
        (UDP_REPLIED, L4Event::Udp) if e.flags & (REPLIED | F_TIMEOUT_POLICY) == REPLIED => {
            (TimeoutKind::UdpStream, true)
        }
        _ => return None,
    };
    Some(QuickStep {
        tmo,
        becomes_stream,
    })
}

/// One packet of direction `dir` on the live entry `e`: the protocol
/// step, the packet count, the state, flags and expiry (the body of
/// [`Table::track`] for every case but its established fast path).
#[inline(always)]
fn step_entry<K: Key, P: Copy + Default>(
    timeouts: &Timeouts256,
    e: &mut Entry<K, P>,
    dir: Dir,
    now: Instant,
    ev: L4Event,
) -> Tracked {
    if e.is_expired(now) {
        return Tracked {
            verdict: Verdict::Expired,
            state: e.state(),
            ct: CtState::New,
        };
    }
    e.packets = e.packets.wrapping_add(1);
    let seen_reply = e.seen_reply();
    let s = proto::step(e.state(), seen_reply, e.is_assured(), dir, ev);
    let ct = match s.verdict {
        Verdict::Invalid => CtState::Invalid,
        Verdict::Reopen | Verdict::Expired => CtState::New,
        _ if dir == Dir::Reply || seen_reply => CtState::Established,
        _ => CtState::New,
    };
    if matches!(
        s.verdict,
        Verdict::Valid | Verdict::Ignored | Verdict::Close
    ) {
        e.state = s.state.pack();
        if s.assured {
            e.flags |= F_ASSURED;
        }
        if dir == Dir::Reply {
            e.flags |= F_SEEN_REPLY;
        }
        if s.verdict == Verdict::Close {
            e.expiry = now.tick();
        } else if let Some(t) = s.timeout {
            // Slot 0 by a branch (see `QuickStep::apply`).
            let timer = |k| {
                if e.timeout_policy == 0 {
                    timeouts[0].get(k)
                } else {
                    policy_timer(timeouts, e.timeout_policy, k)
                }
            };
            let mut ms = timer(t);
            if s.cap_unack {
                ms = ms.min(timer(TimeoutKind::TcpUnack));
            }
            e.expiry = expiry_after(now, ms);
        }
    }
    Tracked {
        verdict: s.verdict,
        state: e.state(),
        ct,
    }
}

fn splitmix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl<K: Key, P: Copy + Default> Table<K, P> {
    /// Build a table for `cfg.capacity` connections, tracking at most
    /// `cfg.max`. The entry slab is reserved (not touched, unless
    /// [`Config::prefault`]) and the index allocated zeroed, both advised
    /// for huge pages; see [`memory_bytes`](Self::memory_bytes).
    pub fn new(cfg: Config) -> Result<Self, ConfigError> {
        if cfg.max == 0 {
            return Err(ConfigError::ZeroMax);
        }
        if cfg.max > MAX_CONNECTIONS || cfg.capacity > MAX_CONNECTIONS {
            return Err(ConfigError::TooLarge);
        }
        if cfg.max > cfg.capacity {
            return Err(ConfigError::AboveCapacity {
                max: cfg.max,
                capacity: cfg.capacity,
            });
        }
        let mut entries = Vec::with_capacity(cfg.capacity as usize);
        advise_huge_pages(entries.spare_capacity_mut());
        let mut index = Index::new(cfg.capacity);
        if cfg.prefault {
            populate(entries.spare_capacity_mut());
        }
        if cfg.prefault || cfg.prefault_index {
            index.populate();
        }
        Ok(Self {
            entries,
            index,
            free_head: NONE,
            len: 0,
            max: cfg.max,
            capacity: cfg.capacity,
            seed: [
                splitmix(cfg.seed),
                splitmix(cfg.seed ^ 0x5851_f42d_4c95_7f2d),
            ],
            timeouts: [TimeoutTable::new(&cfg.timeouts); 256],
            policies: Vec::with_capacity(255),
            held: [0; 256],
            tcp_loose: cfg.tcp_loose,
            gc_cursor: 0,
            stamp: 0,
            early_drops: 0,
            #[cfg(test)]
            degenerate: false,
        })
    }

    /// Replace the timeouts. Entries keep their current expiry until their
    /// next packet.
    pub fn set_timeouts(&mut self, t: &Timeouts) {
        let base = TimeoutTable::new(t);
        self.timeouts.fill(base);
        for (slot, p) in &self.policies {
            self.timeouts[usize::from(*slot)] = p.over(&base);
        }
    }

    /// Put timeout policy `p` in slot `slot` (1-255; 0 is the table's own
    /// timeouts, and is refused): the connections
    /// [`apply_timeout_policy`](Self::apply_timeout_policy) gives that slot
    /// follow `p`'s timers from their next packet on, the table's own for
    /// the timers `p` leaves unset. A slot that held another policy
    /// changes for the connections already in it. Returns false for slot 0.
    pub fn set_timeout_policy(&mut self, slot: u8, p: &TimeoutPolicy) -> bool {
        if slot == 0 {
            return false;
        }
        self.timeouts[usize::from(slot)] = p.over(&self.timeouts[0]);
        match self.policies.iter_mut().find(|(s, _)| *s == slot) {
            Some(e) => e.1 = *p,
            None => self.policies.push((slot, *p)),
        }
        true
    }

    /// The policy in slot `slot`, if one was set.
    pub fn timeout_policy(&self, slot: u8) -> Option<&TimeoutPolicy> {
        self.policies
            .iter()
            .find(|(s, _)| *s == slot)
            .map(|(_, p)| p)
    }

    /// Make connection `id` follow the policy in slot `slot` (0: the
    /// table's own timeouts), as nft's `ct timeout set` does for a
    /// connection's first packet: its expiry is set again, from `now`, to
    /// what the policy gives its current state (capped, for a TCP
    /// connection not assured yet, by the policy's
    /// [`TimeoutKind::TcpUnack`]), and its later packets use the policy.
    /// Nothing happens for a slot that holds no policy, or for an entry
    /// that is not live.
    pub fn apply_timeout_policy(&mut self, id: EntryId, slot: u8, now: Instant) {
        if slot != 0 && self.timeout_policy(slot).is_none() {
            return;
        }
        let Some(e) = self.entries.get_mut(id.index()).filter(|e| e.is_live()) else {
            return;
        };
        let old = (e.flags & F_TIMEOUT_POLICY != 0).then_some(e.timeout_policy);
        e.timeout_policy = slot;
        if slot == 0 {
            e.flags &= !F_TIMEOUT_POLICY;
        } else {
            e.flags |= F_TIMEOUT_POLICY;
        }
        if let Some(o) = old {
            hold(&mut self.held, o, false);
        }
        if slot != 0 {
            hold(&mut self.held, slot, true);
        }
        let t = &self.timeouts[usize::from(slot)];
        let state = e.state();
        let mut ms = t.get(state.idle_timeout(e.is_assured()));
        if matches!(state, ProtoState::Tcp(_)) && !e.is_assured() {
            ms = ms.min(t.get(TimeoutKind::TcpUnack));
        }
        e.expiry = expiry_after(now, ms);
    }

    /// Live connections.
    #[inline]
    pub fn len(&self) -> usize {
        self.len as usize
    }

    /// Live connections evicted early (to make room for a new one) since
    /// the table was built: netfilter's `early_drop` statistic. Each one
    /// was a connection that stopped working before its timeout.
    #[inline]
    pub fn early_drops(&self) -> u64 {
        self.early_drops
    }

    /// True when no connection is tracked.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Configured maximum.
    #[inline]
    pub fn max(&self) -> usize {
        self.max as usize
    }

    /// The connections the table was built for: the largest `max`
    /// [`set_max`](Self::set_max) takes.
    #[inline]
    pub fn capacity(&self) -> usize {
        self.capacity as usize
    }

    /// Change the maximum while running (netfilter's `nf_conntrack_max`
    /// written at run time), between 1 and [`capacity`](Self::capacity);
    /// O(1). A maximum below the connections tracked removes none of them:
    /// while the table holds `max` or more, a new connection takes the
    /// place of an unassured one of its probe window (early drop) or is
    /// refused, as when the table is full.
    pub fn set_max(&mut self, max: u32) -> Result<(), ConfigError> {
        self.check_max(max)?;
        self.max = max;
        Ok(())
    }

    /// Whether [`set_max`](Self::set_max) would take `max`, changing
    /// nothing.
    pub fn check_max(&self, max: u32) -> Result<(), ConfigError> {
        if max == 0 {
            return Err(ConfigError::ZeroMax);
        }
        if max > self.capacity {
            return Err(ConfigError::AboveCapacity {
                max,
                capacity: self.capacity,
            });
        }
        Ok(())
    }

    /// Bytes allocated for the slab and the index when the table is full
    /// to its capacity (the index is allocated up front; the slab is
    /// reserved up front).
    pub fn memory_bytes(&self) -> usize {
        Self::memory_bytes_for(self.capacity)
    }

    /// [`memory_bytes`](Self::memory_bytes) for a table built for
    /// `capacity` connections.
    pub fn memory_bytes_for(capacity: u32) -> usize {
        capacity as usize * core::mem::size_of::<Entry<K, P>>() + Index::bytes_for(capacity)
    }

    /// The index's part of [`memory_bytes_for`](Self::memory_bytes_for):
    /// what [`Config::prefault_index`] backs at [`Table::new`].
    pub fn index_bytes_for(capacity: u32) -> usize {
        Index::bytes_for(capacity)
    }

    // ---- fast path -------------------------------------------------------

    /// Keyed hash of `k`.
    #[inline]
    pub fn hash(&self, k: &K) -> u64 {
        let [a, b] = k.words();
        let h = fold(
            fold(a ^ self.seed[0], b ^ self.seed[1]),
            0x9e37_79b9_7f4a_7c15 ^ self.seed[0],
        );
        #[cfg(test)]
        if self.degenerate {
            return h & 0xffff_ffff;
        }
        h
    }

    /// Prefetch the home bucket of hash `h`.
    #[inline]
    pub fn prefetch_bucket(&self, h: u64) {
        self.index.prefetch(h);
    }

    /// Find the entry that has `k` (of hash `h`) as one of its keys.
    #[inline]
    pub fn lookup(&self, h: u64, k: &K) -> Option<(EntryId, Dir)> {
        let entries = &self.entries;
        self.index
            .find(h, |idx, dir| {
                entries.get(idx as usize).is_some_and(|e| e.has_key(dir, k))
            })
            .map(|(i, d)| (EntryId(i), d))
    }

    /// [`lookup`](Self::lookup) that, on a miss, returns the proof of absence
    /// [`insert_vacant`](Self::insert_vacant) takes.
    #[inline]
    pub fn lookup_vacant(&self, h: u64, k: &K) -> Result<(EntryId, Dir), Vacant<K>> {
        self.lookup(h, k).ok_or(Vacant {
            key: *k,
            hash: h,
            stamp: self.stamp,
        })
    }

    /// The first entry whose tag matches `h`, reading only the index. A
    /// `None` is a definite miss; a `Some` must be confirmed with
    /// [`verify`](Self::verify) (a 31-bit tag collision is possible), falling
    /// back to [`lookup`](Self::lookup) if it fails.
    #[inline]
    pub fn candidate(&self, h: u64) -> Option<(EntryId, Dir)> {
        self.index
            .find(h, |_, _| true)
            .map(|(i, d)| (EntryId(i), d))
    }

    /// True if entry `id` has key `k` in direction `dir`.
    #[inline]
    pub fn verify(&self, id: EntryId, dir: Dir, k: &K) -> bool {
        self.entries
            .get(id.index())
            .is_some_and(|e| e.is_live() && e.has_key(dir, k))
    }

    /// Prefetch entry `id` (both cache lines it may span).
    #[inline]
    pub fn prefetch_entry(&self, id: EntryId) {
        if let Some(e) = self.entries.get(id.index()) {
            prefetch(&e.keys);
            prefetch(&e.proto);
        }
    }

    /// Entry `id`. Panics if `id` was never handed out by this table.
    #[inline]
    pub fn entry(&self, id: EntryId) -> &Entry<K, P> {
        &self.entries[id.index()]
    }

    /// Mutable entry `id` (payload and mark). Panics like [`entry`](Self::entry).
    #[inline]
    pub fn entry_mut(&mut self, id: EntryId) -> &mut Entry<K, P> {
        &mut self.entries[id.index()]
    }

    /// Entry `id` if it is live.
    pub fn get(&self, id: EntryId) -> Option<&Entry<K, P>> {
        self.entries.get(id.index()).filter(|e| e.is_live())
    }

    /// Mutable entry `id` if it is live.
    pub fn get_mut(&mut self, id: EntryId) -> Option<&mut Entry<K, P>> {
        self.entries.get_mut(id.index()).filter(|e| e.is_live())
    }

    /// Entry slots handed out so far, live or free: every live entry's id
    /// is below this (a walk in steps of its own, such as a re-route after
    /// a route change, goes up to it).
    pub fn slots(&self) -> usize {
        self.entries.len()
    }

    /// May a packet with this L4 event create a new entry? (TCP: SYN; with
    /// `tcp_loose`, a pure ACK; never FIN/RST. ICMP: requests only.)
    pub fn may_create(&self, ev: L4Event) -> bool {
        proto::may_create(ev, self.tcp_loose)
    }

    /// Run one packet of direction `dir` through entry `id`'s state machine:
    /// validate it, update the state and assured flag, refresh the expiry,
    /// count it. Call it for the first packet too, right after
    /// [`insert`](Self::insert) (netfilter's `new()` then `packet()`).
    #[inline]
    pub fn track(&mut self, id: EntryId, dir: Dir, now: Instant, ev: L4Event) -> Tracked {
        // The established fast path ([`quick_step`]): only the expiry, the
        // packet count and at most a replied UDP connection's state move;
        // the result is what `proto::step` would return.
        if let Some(e) = self.entries.get_mut(id.index()) {
            if !e.is_expired(now) {
                if let Some(q) = quick_step(e, ev) {
                    q.apply(e, now, &self.timeouts);
                    return Tracked {
                        verdict: Verdict::Valid,
                        state: e.state(),
                        ct: CtState::Established,
                    };
                }
            }
        }
        self.track_general(id, dir, now, ev)
    }

    /// [`verify`](Self::verify) and [`track`](Self::track) in one visit
    /// to the entry, for the packets `track` takes on its established fast
    /// path ([`quick_step`]: counters and expiry only, or a replied UDP
    /// connection's first packet after the reply, which makes it an assured
    /// stream), for a caller that can finish the packet only under
    /// conditions of its own.
    ///
    /// If entry `id` is live, has `k` in direction `dir`, and the packet
    /// (`ev`) is one of those, `accept` is called with the entry. When it
    /// returns `Some`, the entry is updated exactly as `track` would update
    /// it (verdict valid, `ct state` established), and `accept`'s value is
    /// returned. In every other case the table is left untouched and `None`
    /// returned, so the caller can take its general path
    /// ([`verify`](Self::verify), [`lookup`](Self::lookup),
    /// [`track`](Self::track)) as if this had not been called.
    #[inline(always)]
    pub fn track_established<R>(
        &mut self,
        id: EntryId,
        dir: Dir,
        k: &K,
        now: Instant,
        ev: L4Event,
        accept: impl FnOnce(&Entry<K, P>) -> Option<R>,
    ) -> Option<R> {
        let e = self.entries.get_mut(id.index())?;
        if !e.has_key(dir, k) || e.is_expired(now) {
            return None;
        }
        let q = quick_step(e, ev)?;
        let r = accept(e)?;
        q.apply(e, now, &self.timeouts);
        Some(r)
    }

    /// [`track`](Self::track) for every case but the established fast path:
    /// the full state machine (`proto::step`).
    #[inline(never)]
    pub(crate) fn track_general(
        &mut self,
        id: EntryId,
        dir: Dir,
        now: Instant,
        ev: L4Event,
    ) -> Tracked {
        let timeouts = &self.timeouts;
        let Some(e) = self.entries.get_mut(id.index()).filter(|e| e.is_live()) else {
            return Tracked {
                verdict: Verdict::Invalid,
                state: ProtoState::Generic,
                ct: CtState::Invalid,
            };
        };
        step_entry(timeouts, e, dir, now, ev)
    }

    // ---- slow path -------------------------------------------------------

    /// Insert a connection reachable by `orig` and `reply` (which must have
    /// the same protocol: the entry stores it once). The entry starts
    /// in its protocol's initial state with that state's timeout; run the
    /// first packet through [`track`](Self::track).
    ///
    /// When the table is full (`len >= max`) or a key's probe window has no
    /// free slot, an entry from the probe windows is dropped early: an
    /// expired one if any, otherwise the unassured one closest to expiry
    /// (netfilter's `early_drop`). It is reported to `on_evict` (so NAT can
    /// release its port). Assured entries are never dropped; if no entry may
    /// be dropped the insert fails with [`InsertError::Full`].
    pub fn insert(
        &mut self,
        now: Instant,
        orig: K,
        reply: K,
        payload: P,
        on_evict: &mut impl FnMut(&Entry<K, P>),
    ) -> Result<EntryId, InsertError> {
        let h1 = self.hash(&orig);
        self.insert_hashed(now, orig, h1, true, reply, payload, |_, _| (), on_evict)
            .map(|(id, ())| id)
    }

    /// [`insert`](Self::insert) with the original key from
    /// [`lookup_vacant`](Self::lookup_vacant): when nothing was inserted
    /// since, the original key is known to be absent and is neither hashed
    /// nor looked up again.
    pub fn insert_vacant(
        &mut self,
        now: Instant,
        orig: Vacant<K>,
        reply: K,
        payload: P,
        on_evict: &mut impl FnMut(&Entry<K, P>),
    ) -> Result<EntryId, InsertError> {
        let check = orig.stamp != self.stamp;
        self.insert_hashed(
            now,
            orig.key,
            orig.hash,
            check,
            reply,
            payload,
            |_, _| (),
            on_evict,
        )
        .map(|(id, ())| id)
    }

    /// [`insert_vacant`](Self::insert_vacant) and then
    /// [`track`](Self::track) of the connection's first packet (event `ev`,
    /// original direction), in one: the entry is written once, already in
    /// the state that packet leaves it in. The result is exactly that of
    /// the two calls; a caller that gets [`Verdict::Invalid`] removes the
    /// entry, as after `track`.
    pub fn insert_vacant_tracked(
        &mut self,
        now: Instant,
        orig: Vacant<K>,
        reply: K,
        payload: P,
        ev: L4Event,
        on_evict: &mut impl FnMut(&Entry<K, P>),
    ) -> Result<(EntryId, Tracked), InsertError> {
        let check = orig.stamp != self.stamp;
        self.insert_hashed(
            now,
            orig.key,
            orig.hash,
            check,
            reply,
            payload,
            |timeouts, e| step_entry(timeouts, e, Dir::Original, now, ev),
            on_evict,
        )
    }

    #[allow(clippy::too_many_arguments)]
    fn insert_hashed<T>(
        &mut self,
        now: Instant,
        orig: K,
        h1: u64,
        check_orig: bool,
        reply: K,
        payload: P,
        first: impl FnOnce(&Timeouts256, &mut Entry<K, P>) -> T,
        on_evict: &mut impl FnMut(&Entry<K, P>),
    ) -> Result<(EntryId, T), InsertError> {
        if orig.proto() != reply.proto() {
            return Err(InsertError::ProtoMismatch);
        }
        let h2 = self.hash(&reply);
        let same = orig == reply;
        if (check_orig && self.lookup(h1, &orig).is_some())
            || (!same && self.lookup(h2, &reply).is_some())
        {
            return Err(InsertError::Exists);
        }
        self.stamp = self.stamp.wrapping_add(1);
        // `>=`: a `max` lowered below the live count keeps the table from
        // growing (each new connection takes an evicted one's place).
        if self.len >= self.max && !self.early_drop(now, &[h1, h2], NONE, on_evict) {
            return Err(InsertError::Full);
        }
        let state = ProtoState::initial(orig.proto());
        let mut entry = Entry {
            keys: [orig.pack(), reply.pack()],
            payload,
            expiry: expiry_after(now, self.timeouts[0].get(state.initial_timeout())),
            mark: 0,
            packets: 0,
            state: state.pack(),
            timeout_policy: 0,
            flags: F_LIVE,
            proto: orig.proto(),
        };
        // What the caller does to the new entry before it is stored (the
        // first packet's tracking, or nothing).
        let tracked = first(&self.timeouts, &mut entry);
        let policy = (entry.flags & F_TIMEOUT_POLICY != 0).then_some(entry.timeout_policy);
        let idx = self.alloc(entry);
        if let Some(s) = policy {
            hold(&mut self.held, s, true);
        }
        if !self.place(now, h1, idx, Dir::Original, on_evict) {
            self.release(idx);
            return Err(InsertError::Full);
        }
        if !same && !self.place(now, h2, idx, Dir::Reply, on_evict) {
            self.index.remove(h1, idx, Dir::Original);
            self.release(idx);
            return Err(InsertError::Full);
        }
        Ok((EntryId(idx), tracked))
    }

    /// Insert a connection a restart carried over (see [`Carried`]): as
    /// [`insert`](Self::insert), but the entry takes the carried state,
    /// flags, mark, packet count and time left (at most
    /// [`crate::time::MAX_TIMEOUT`]) instead of starting fresh. A state of
    /// another protocol than the keys' is refused
    /// ([`InsertError::ProtoMismatch`]).
    pub fn restore(
        &mut self,
        now: Instant,
        orig: K,
        reply: K,
        payload: P,
        c: &crate::entry::Carried,
        on_evict: &mut impl FnMut(&Entry<K, P>),
    ) -> Result<EntryId, InsertError> {
        if core::mem::discriminant(&ProtoState::initial(orig.proto()))
            != core::mem::discriminant(&c.state)
        {
            return Err(InsertError::ProtoMismatch);
        }
        let h1 = self.hash(&orig);
        let ms = c.expires_in_ms.min(i32::MAX as u32);
        // Kept only if this table holds a policy in that slot.
        let slot = if c.timeout_policy != 0 && self.timeout_policy(c.timeout_policy).is_some() {
            c.timeout_policy
        } else {
            0
        };
        self.insert_hashed(
            now,
            orig,
            h1,
            true,
            reply,
            payload,
            |_, e| {
                e.state = c.state.pack();
                if slot != 0 {
                    e.timeout_policy = slot;
                    e.flags |= F_TIMEOUT_POLICY;
                }
                e.mark = c.mark;
                e.packets = c.packets;
                e.expiry = expiry_after(now, ms);
                for (on, bit) in [
                    (c.assured, F_ASSURED),
                    (c.seen_reply, F_SEEN_REPLY),
                    (c.flowtable, F_FLOWTABLE),
                ] {
                    if on {
                        e.flags |= bit;
                    }
                }
            },
            on_evict,
        )
        .map(|(id, ())| id)
    }

    /// Remove entry `id`, returning it; `None` if it is not live.
    pub fn remove(&mut self, id: EntryId) -> Option<Entry<K, P>> {
        self.get(id)?;
        Some(self.remove_idx(id.0))
    }

    /// Incremental GC: visit up to `budget` slab slots from where the last
    /// call stopped, remove the expired entries and report each to
    /// `on_remove`. Returns how many were removed. A full cycle takes
    /// `max / budget` calls.
    pub fn gc(
        &mut self,
        now: Instant,
        budget: usize,
        on_remove: &mut impl FnMut(&Entry<K, P>),
    ) -> usize {
        self.gc_offloaded(now, budget, &mut |_| None, on_remove)
    }

    /// Mark which directions of entry `id` are offloaded (`[original,
    /// reply]`); the marks go with the entry when it is removed.
    pub fn set_offloaded(&mut self, id: EntryId, dirs: [bool; 2]) {
        if let Some(e) = self.entries.get_mut(id.index()).filter(|e| e.is_live()) {
            e.flags &= !F_OFFLOAD;
            if dirs[0] {
                e.flags |= offload_bit(Dir::Original);
            }
            if dirs[1] {
                e.flags |= offload_bit(Dir::Reply);
            }
        }
    }

    /// Puts connection `id` into the flowtable, or takes it out.
    pub fn set_in_flowtable(&mut self, id: EntryId, on: bool) {
        if let Some(e) = self.entries.get_mut(id.index()).filter(|e| e.is_live()) {
            if on {
                e.flags |= F_FLOWTABLE;
            } else {
                e.flags &= !F_FLOWTABLE;
            }
        }
    }

    /// Takes every connection out of the flowtable (the flowtables were
    /// replaced). A walk of the whole table.
    pub fn clear_flowtable(&mut self) {
        for e in self.entries.iter_mut() {
            e.flags &= !F_FLOWTABLE;
        }
    }

    /// Clear the offload marks of every entry (visits the whole slab; for
    /// rare events such as a policy or neighbour change that takes every
    /// offload back).
    pub fn clear_offloaded(&mut self) {
        for e in self.entries.iter_mut() {
            e.flags &= !F_OFFLOAD;
        }
    }

    /// [`gc`](Self::gc) for a table with offloaded entries: an expired
    /// entry with an offloaded direction is first offered to `last_used`,
    /// which returns when the lower layer last forwarded a packet of it
    /// (`None`: never, or not known) and whether it forwarded any in the
    /// reply direction. A reply the table did not see still counts as one
    /// (UDP becomes an assured stream, as its packets would have made it).
    /// If the last use plus the entry's idle timeout is still ahead, the
    /// entry's expiry moves there and it stays; otherwise it is removed
    /// like any other.
    pub fn gc_offloaded(
        &mut self,
        now: Instant,
        budget: usize,
        last_used: &mut impl FnMut(&Entry<K, P>) -> Option<(Instant, bool)>,
        on_remove: &mut impl FnMut(&Entry<K, P>),
    ) -> usize {
        let n = self.entries.len();
        if n == 0 {
            return 0;
        }
        let mut cur = if self.gc_cursor >= n {
            0
        } else {
            self.gc_cursor
        };
        let mut removed = 0;
        for _ in 0..budget.min(n) {
            let e = &self.entries[cur];
            if e.is_live() && e.is_expired(now) {
                let used = if e.flags & F_OFFLOAD != 0 {
                    last_used(e)
                } else {
                    None
                };
                let refreshed = used.map(|(t, replied)| {
                    let e = &mut self.entries[cur];
                    if replied && !e.seen_reply() {
                        e.flags |= F_SEEN_REPLY | F_ASSURED;
                        if let ProtoState::Udp(_) = e.state() {
                            e.state = UDP_STREAM;
                        }
                    }
                    let tmo = e.state().idle_timeout(e.is_assured());
                    expiry_after(t, self.timeouts[usize::from(e.timeout_policy)].get(tmo))
                });
                match refreshed {
                    Some(x) if !crate::time::is_expired(x, now) => self.entries[cur].expiry = x,
                    _ => {
                        let e = self.remove_idx(cur as u32);
                        on_remove(&e);
                        removed += 1;
                    }
                }
            }
            cur += 1;
            if cur == n {
                cur = 0;
            }
        }
        self.gc_cursor = cur;
        removed
    }

    /// Remove every entry in bulk: the slab is reset and the index zeroed
    /// with one memset, nothing is visited entry by entry. Returns how many
    /// entries there were. (NAT state must be flushed by its owner.)
    pub fn flush(&mut self) -> usize {
        let n = self.len as usize;
        self.entries.clear();
        self.index.clear();
        self.free_head = NONE;
        self.len = 0;
        self.held = [0; 256];
        self.gc_cursor = 0;
        n
    }

    /// Remove every entry for which `pred` holds, reporting each to
    /// `on_remove`. Visits the whole slab. Returns how many were removed.
    pub fn flush_matching(
        &mut self,
        mut pred: impl FnMut(&Entry<K, P>) -> bool,
        on_remove: &mut impl FnMut(&Entry<K, P>),
    ) -> usize {
        let mut removed = 0;
        for i in 0..self.entries.len() {
            let e = &self.entries[i];
            if e.is_live() && pred(e) {
                let e = self.remove_idx(i as u32);
                on_remove(&e);
                removed += 1;
            }
        }
        removed
    }

    /// The policy slots some live entry follows, as a bitmap (bit `s % 64`
    /// of word `s / 64` for slot `s`; never slot 0). Exact after every
    /// change: entries count in and out as they get a policy and go.
    pub fn timeout_slots_held(&self) -> [u64; 4] {
        let mut b = [0u64; 4];
        for (s, n) in self.held.iter().enumerate() {
            if *n > 0 {
                b[s / 64] |= 1 << (s % 64);
            }
        }
        b
    }

    /// Live entries in slab order.
    pub fn iter(&self) -> impl Iterator<Item = (EntryId, &Entry<K, P>)> + '_ {
        self.entries
            .iter()
            .enumerate()
            .filter(|(_, e)| e.is_live())
            .map(|(i, e)| (EntryId(i as u32), e))
    }

    // ---- internals -------------------------------------------------------

    fn alloc(&mut self, e: Entry<K, P>) -> u32 {
        self.len += 1;
        if self.free_head != NONE {
            let idx = self.free_head;
            let slot = &mut self.entries[idx as usize];
            self.free_head = slot.mark;
            *slot = e;
            idx
        } else {
            // len <= capacity (an insert at len >= max evicts first) and
            // every slot below entries.len() is live or free, so the
            // reserved capacity is never exceeded (no reallocation).
            self.entries.push(e);
            (self.entries.len() - 1) as u32
        }
    }

    /// Return slot `idx` (already out of the index) to the free list.
    fn release(&mut self, idx: u32) {
        let e = &mut self.entries[idx as usize];
        let policy = (e.flags & F_TIMEOUT_POLICY != 0).then_some(e.timeout_policy);
        e.flags = 0;
        e.mark = self.free_head;
        self.free_head = idx;
        self.len -= 1;
        if let Some(s) = policy {
            hold(&mut self.held, s, false);
        }
    }

    fn remove_idx(&mut self, idx: u32) -> Entry<K, P> {
        let e = self.entries[idx as usize];
        let h1 = self.hash(&e.orig());
        let removed = self.index.remove(h1, idx, Dir::Original);
        debug_assert!(removed);
        if e.keys[0] != e.keys[1] {
            let h2 = self.hash(&e.reply());
            let removed = self.index.remove(h2, idx, Dir::Reply);
            debug_assert!(removed);
        }
        self.release(idx);
        e
    }

    fn place(
        &mut self,
        now: Instant,
        h: u64,
        idx: u32,
        dir: Dir,
        on_evict: &mut impl FnMut(&Entry<K, P>),
    ) -> bool {
        if self.index.insert(h, idx, dir) {
            return true;
        }
        self.early_drop(now, &[h], idx, on_evict) && self.index.insert(h, idx, dir)
    }

    /// Evict one entry referenced from the probe windows of `hashes`
    /// (excluding `exclude`): an expired one, else the unassured one with
    /// the least time left. False if there is none.
    fn early_drop(
        &mut self,
        now: Instant,
        hashes: &[u64],
        exclude: u32,
        on_evict: &mut impl FnMut(&Entry<K, P>),
    ) -> bool {
        let entries = &self.entries;
        let mut expired = NONE;
        let mut best = NONE;
        let mut best_left = u32::MAX;
        for &h in hashes {
            self.index.for_each_in_window(h, |idx| {
                if idx == exclude || expired != NONE {
                    return;
                }
                let e = &entries[idx as usize];
                if e.is_expired(now) {
                    expired = idx;
                } else if !e.is_assured() {
                    let left = crate::time::remaining_ms(e.expiry, now);
                    if left < best_left {
                        best_left = left;
                        best = idx;
                    }
                }
            });
        }
        let victim = if expired != NONE { expired } else { best };
        if victim == NONE {
            return false;
        }
        let e = self.remove_idx(victim);
        if expired == NONE {
            self.early_drops += 1;
        }
        on_evict(&e);
        true
    }

    #[cfg(test)]
    pub(crate) fn index_occupied(&self) -> usize {
        self.index.occupied()
    }

    #[cfg(test)]
    pub(crate) fn index_overflow_total(&self) -> u64 {
        self.index.overflow_total()
    }
}
