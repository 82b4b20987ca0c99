//! NAT configuration: pools, translation kinds and RFC 4787 / RFC 5382
//! behaviour switches. Plain data; the ruleset compiler builds it.

use core::net::Ipv4Addr;
use core::ops::RangeInclusive;

use crate::error::ConfigError;
use crate::ports::{owned_below, owner_of};

/// Default dynamic port range. RFC 4787 REQ-3 / RFC 6056: well-known ports
/// (below 1024) are not handed out unless a pool asks for them.
pub const DEFAULT_PORTS: RangeInclusive<u16> = 1024..=65535;

/// Index of a [`Pool`] in [`NatConfig::pools`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PoolId(pub u16);

/// A set of external addresses sharing one port range.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pool {
    /// External addresses, in order. Duplicates are rejected by
    /// [`NatConfig::validate`].
    pub addrs: Vec<Ipv4Addr>,
    /// Ports (and ICMP identifiers) handed out on every address.
    pub ports: RangeInclusive<u16>,
}

impl Pool {
    /// A pool of the given addresses with the default port range.
    pub fn new(addrs: impl IntoIterator<Item = Ipv4Addr>) -> Self {
        Self {
            addrs: addrs.into_iter().collect(),
            ports: DEFAULT_PORTS,
        }
    }

    /// A pool of every address in `first..=last` (empty if `last < first`).
    pub fn from_range(first: Ipv4Addr, last: Ipv4Addr) -> Self {
        let (a, b) = (u32::from(first), u32::from(last));
        Self::new((a..=b).map(Ipv4Addr::from))
    }

    /// Replace the port range.
    #[must_use]
    pub fn with_ports(mut self, ports: RangeInclusive<u16>) -> Self {
        self.ports = ports;
        self
    }
}

/// What a NAT rule does to a new connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Translation {
    /// Source NAT to an address and port of a pool.
    Snat {
        /// The pool to allocate from.
        pool: PoolId,
    },
    /// Source NAT to the egress interface's address (given at translate
    /// time), ports from [`NatConfig::masquerade_ports`].
    Masquerade,
    /// Destination NAT / port forward to a static endpoint. `port: None`
    /// keeps the original destination port.
    Dnat {
        /// New destination address.
        addr: Ipv4Addr,
        /// New destination port, if any.
        port: Option<u16>,
    },
}

/// How the external endpoint of a mapping is chosen (RFC 4787 section 4.1).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum MappingBehaviour {
    /// RFC 4787 REQ-1 / RFC 5382 REQ-1: one external endpoint per internal
    /// endpoint, whatever the destination.
    #[default]
    EndpointIndependent,
    /// A new external endpoint per (internal endpoint, destination
    /// address, destination port) ("symmetric NAT").
    AddressAndPortDependent,
}

/// Which inbound packets may open a session through an existing mapping
/// (RFC 4787 section 5).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum FilteringBehaviour {
    /// Anyone may reach the mapped endpoint (RFC 4787 REQ-8 for
    /// application transparency).
    #[default]
    EndpointIndependent,
    /// Only addresses the internal endpoint has sent to (RFC 4787 REQ-8 for
    /// a more stringent policy).
    AddressDependent,
    /// Only address:port pairs the internal endpoint has sent to.
    AddressAndPortDependent,
}

/// How a subscriber's external address is picked (RFC 4787 section 4.1).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Pooling {
    /// RFC 4787 REQ-2: one internal address always maps to the same
    /// external address. When that address has no free port, translation
    /// fails rather than using another address.
    #[default]
    Paired,
    /// Start at the paired address but fall back to any address of the pool.
    Arbitrary,
}

/// The whole NAT configuration, shared (read-only) by every worker.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NatConfig {
    /// SNAT pools, indexed by [`PoolId`].
    pub pools: Vec<Pool>,
    /// Port range used for masquerade.
    pub masquerade_ports: RangeInclusive<u16>,
    /// How many distinct egress addresses a worker can masquerade to at
    /// once (each costs one bitmap per protocol, allocated up front).
    pub masquerade_slots: u16,
    /// Mapping behaviour.
    pub mapping: MappingBehaviour,
    /// Filtering behaviour.
    pub filtering: FilteringBehaviour,
    /// Address pooling behaviour.
    pub pooling: Pooling,
    /// RFC 4787 REQ-9 / RFC 5382 REQ-8: translate inside-to-inside traffic
    /// addressed to a mapped external endpoint.
    pub hairpinning: bool,
    /// Maximum sessions per internal address on one worker; 0 = unlimited
    /// (RFC 6888 REQ-4: a CGN must be able to limit per-subscriber use).
    pub max_sessions_per_subscriber: u32,
    /// Number of workers sharing the port space (see [`owner_of`]).
    pub workers: u16,
    /// Key of the subscriber -> external address pairing hash.
    pub pairing_seed: u64,
    /// Mappings to reserve table space for, per worker.
    pub capacity_hint: usize,
    /// Port block allocation (bulk port allocation): 0 = off; else a
    /// subscriber's pool mappings take their ports from blocks of this
    /// many ports of one address, held by the subscriber for all
    /// protocols, and the NAT log records one event per block instead of
    /// one per mapping. See [`crate::worker`].
    pub port_block_size: u16,
    /// Port blocks one subscriber may hold per pool and worker; 0 = as many
    /// as are free.
    pub max_blocks_per_subscriber: u16,
    /// Deterministic NAT (RFC 7422), with port blocks: the subscribers of
    /// this prefix (base address, length) each own one fixed block of
    /// every pool, computed from their address, so that an external
    /// address and port name the subscriber without any log
    /// ([`NatConfig::deterministic_subscriber`]). Sources outside the
    /// prefix are not translated by pools.
    pub deterministic: Option<(Ipv4Addr, u8)>,
}

impl Default for NatConfig {
    fn default() -> Self {
        Self {
            pools: Vec::new(),
            masquerade_ports: DEFAULT_PORTS,
            masquerade_slots: 4,
            mapping: MappingBehaviour::default(),
            filtering: FilteringBehaviour::default(),
            pooling: Pooling::default(),
            hairpinning: true,
            max_sessions_per_subscriber: 0,
            workers: 1,
            pairing_seed: 0x5eed_0f51_u64,
            capacity_hint: 1024,
            port_block_size: 0,
            max_blocks_per_subscriber: 0,
            deterministic: None,
        }
    }
}

impl NatConfig {
    /// The worker owning external port `ext_port`; see [`owner_of`].
    #[inline]
    pub const fn owner_of(&self, ext_port: u16) -> u16 {
        owner_of(ext_port, self.workers)
    }

    /// The external address paired with internal address `int_addr` in
    /// `pool` (RFC 4787 REQ-2). A keyed hash of the internal address, so
    /// every worker computes the same pairing without shared state.
    pub fn paired_addr(&self, pool: PoolId, int_addr: Ipv4Addr) -> Option<Ipv4Addr> {
        let p = self.pools.get(usize::from(pool.0))?;
        let n = p.addrs.len();
        if n == 0 {
            return None;
        }
        p.addrs
            .get(pair_index(self.pairing_seed, u32::from(int_addr), n))
            .copied()
    }

    /// Check the configuration. Workers must pass it before use.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.workers == 0 {
            return Err(ConfigError::NoWorkers);
        }
        if self.pools.len() > usize::from(u16::MAX) {
            return Err(ConfigError::TooLarge);
        }
        let mut seen = hashbrown::HashSet::new();
        for (i, p) in self.pools.iter().enumerate() {
            let pool = u16::try_from(i).map_err(|_| ConfigError::TooLarge)?;
            if p.addrs.is_empty() {
                return Err(ConfigError::EmptyPool { pool });
            }
            if p.addrs.len() > 1 << 20 {
                return Err(ConfigError::TooLarge);
            }
            if range_len(&p.ports) < u32::from(self.workers) {
                return Err(ConfigError::PortRangeTooSmall { pool });
            }
            for a in &p.addrs {
                if !seen.insert(*a) {
                    return Err(ConfigError::OverlappingPools { pool });
                }
            }
        }
        if self.port_block_size > 0 {
            for (i, p) in self.pools.iter().enumerate() {
                let share = min_share(&p.ports, self.workers);
                if share < u32::from(self.port_block_size) {
                    return Err(ConfigError::PortBlockTooLarge {
                        pool: i as u16,
                        share,
                    });
                }
            }
        }
        if let Some((_, len)) = self.deterministic {
            if self.port_block_size == 0 {
                return Err(ConfigError::DeterministicNeedsBlocks);
            }
            let needed = det_count(len);
            for (i, p) in self.pools.iter().enumerate() {
                let capacity = p.addrs.len() as u64 * u64::from(self.det_blocks_per_addr(p));
                if capacity < needed {
                    return Err(ConfigError::DeterministicTooSmall {
                        pool: i as u16,
                        capacity,
                        needed,
                    });
                }
            }
        }
        if self.masquerade_slots > 0 && range_len(&self.masquerade_ports) < u32::from(self.workers)
        {
            return Err(ConfigError::MasqueradeRangeTooSmall);
        }
        Ok(())
    }
}

/// The port range of every address that has been in a pool of a running
/// gateway with port blocks ([`NatConfig::pool_change`]).
pub type SeenRanges = hashbrown::HashMap<Ipv4Addr, RangeInclusive<u16>>;

impl NatConfig {
    /// Add `self`'s pool addresses to `seen` (with port blocks only: the
    /// ranges matter for nothing else).
    pub fn note_ranges(&self, seen: &mut SeenRanges) {
        if self.port_block_size == 0 {
            return;
        }
        for p in &self.pools {
            for a in &p.addrs {
                seen.insert(*a, p.ports.clone());
            }
        }
    }

    /// Whether a running gateway built with `self` can take `next`
    /// ([`crate::WorkerNat::set_pools`]): `next` is valid, differs from
    /// `self` in its pools and the switches read when a session or mapping
    /// is made (`hairpinning`, `pooling`, `max_sessions_per_subscriber`,
    /// `max_blocks_per_subscriber`) alone, and moves no port block (deterministic
    /// NAT's pools never change; with port blocks an address that stays
    /// keeps its port range, and one that left the pools earlier in the
    /// run, `seen`, does not come back: blocks of its retired mappings may
    /// still be in use). Pure:
    /// the control plane asks before it publishes, every worker again
    /// before it applies.
    pub fn pool_change(&self, next: &NatConfig, seen: &SeenRanges) -> Result<(), ConfigError> {
        next.validate()?;
        // What a running worker can take besides the pools: switches read
        // only when a session or mapping is made.
        let fixed = |c: &NatConfig| NatConfig {
            pools: Vec::new(),
            hairpinning: true,
            max_sessions_per_subscriber: 0,
            max_blocks_per_subscriber: 0,
            pooling: Pooling::default(),
            ..c.clone()
        };
        let same = fixed(self) == fixed(next);
        if !same {
            return Err(ConfigError::SettingsChange);
        }
        if self.pools == next.pools {
            return Ok(());
        }
        if self.deterministic.is_some() {
            return Err(ConfigError::DeterministicPoolChange);
        }
        if self.port_block_size > 0 {
            let old: hashbrown::HashMap<Ipv4Addr, &RangeInclusive<u16>> = self
                .pools
                .iter()
                .flat_map(|p| p.addrs.iter().map(move |a| (*a, &p.ports)))
                .collect();
            for p in &next.pools {
                for a in &p.addrs {
                    match old.get(a) {
                        Some(r) if **r != p.ports => {
                            return Err(ConfigError::BlockRangeChange { addr: *a });
                        }
                        None if seen.contains_key(a) => {
                            return Err(ConfigError::BlockAddressReturns { addr: *a });
                        }
                        _ => {}
                    }
                }
            }
        }
        Ok(())
    }
}

/// Subscribers of a deterministic prefix of length `len`.
fn det_count(len: u8) -> u64 {
    1u64 << (32 - u32::from(len.min(32)))
}

impl NatConfig {
    /// Blocks per address and worker in deterministic mode: the same on
    /// every worker (the smallest share's), so that a subscriber's block
    /// has one index on all of them.
    pub(crate) fn det_blocks_per_addr(&self, p: &Pool) -> u32 {
        min_share(&p.ports, self.workers) / u32::from(self.port_block_size.max(1))
    }

    /// Deterministic NAT (RFC 7422): the subscriber holding external
    /// endpoint `addr:port` of `pool`, from the configuration alone.
    /// `None` when deterministic NAT is off, the endpoint is not one of
    /// the pool's, or no subscriber's block holds it.
    pub fn deterministic_subscriber(
        &self,
        pool: PoolId,
        addr: Ipv4Addr,
        port: u16,
    ) -> Option<Ipv4Addr> {
        let (base, len) = self.deterministic?;
        let p = self.pools.get(usize::from(pool.0))?;
        let ai = p.addrs.iter().position(|a| *a == addr)? as u64;
        if !p.ports.contains(&port) {
            return None;
        }
        let w = owner_of(port, self.workers);
        let idx = owned_below(u32::from(port), w, self.workers)
            - owned_below(u32::from(*p.ports.start()), w, self.workers);
        let per = self.det_blocks_per_addr(p);
        let j = idx / u32::from(self.port_block_size.max(1));
        if j >= per {
            return None;
        }
        let i = ai * u64::from(per) + u64::from(j);
        (i < det_count(len)).then(|| Ipv4Addr::from(u32::from(base).wrapping_add(i as u32)))
    }

    /// Deterministic NAT: the external address of subscriber `sub` in
    /// `pool` and its block's ports on each worker (first, last; with
    /// several workers only the ports of the range that worker owns).
    pub fn deterministic_block(
        &self,
        pool: PoolId,
        sub: Ipv4Addr,
    ) -> Option<(Ipv4Addr, Vec<(u16, u16)>)> {
        let (base, len) = self.deterministic?;
        let i = u64::from(u32::from(sub).wrapping_sub(u32::from(base)));
        if i >= det_count(len) {
            return None;
        }
        let p = self.pools.get(usize::from(pool.0))?;
        let per = u64::from(self.det_blocks_per_addr(p));
        if per == 0 {
            return None;
        }
        let addr = *p.addrs.get(usize::try_from(i / per).ok()?)?;
        let size = u32::from(self.port_block_size);
        let j = (i % per) as u32;
        let ranges = (0..self.workers)
            .filter_map(|w| {
                let s = crate::ports::PortSlice::new(&p.ports, w, self.workers);
                Some((s.port(j * size)?, s.port((j + 1) * size - 1)?))
            })
            .collect();
        Some((addr, ranges))
    }
}

/// The smallest number of ports of `r` any one of `workers` workers owns.
fn min_share(r: &RangeInclusive<u16>, workers: u16) -> u32 {
    if r.start() > r.end() {
        return 0;
    }
    let (lo, hi) = (u32::from(*r.start()), u32::from(*r.end()) + 1);
    (0..workers.max(1))
        .map(|w| owned_below(hi, w, workers) - owned_below(lo, w, workers))
        .min()
        .unwrap_or(0)
}

fn range_len(r: &RangeInclusive<u16>) -> u32 {
    if r.start() > r.end() {
        0
    } else {
        u32::from(*r.end()) - u32::from(*r.start()) + 1
    }
}

/// Keyed hash of an internal address onto `0..n` (splitmix64 finaliser).
pub(crate) fn pair_index(seed: u64, int_addr: u32, n: usize) -> usize {
    let mut z = seed ^ u64::from(int_addr).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    // Multiply-shift range reduction: unbiased enough and panic-free.
    ((u128::from(z) * n as u128) >> 64) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> NatConfig {
        NatConfig {
            pools: vec![Pool::from_range(
                Ipv4Addr::new(192, 0, 2, 0),
                Ipv4Addr::new(192, 0, 2, 3),
            )],
            workers: 4,
            ..NatConfig::default()
        }
    }

    #[test]
    fn validate_accepts_default_and_rejects_bad() {
        assert_eq!(cfg().validate(), Ok(()));
        let mut c = cfg();
        c.workers = 0;
        assert_eq!(c.validate(), Err(ConfigError::NoWorkers));
        let mut c = cfg();
        c.pools.push(Pool::new([Ipv4Addr::new(192, 0, 2, 1)]));
        assert_eq!(c.validate(), Err(ConfigError::OverlappingPools { pool: 1 }));
        let mut c = cfg();
        c.pools.push(Pool::new([]));
        assert_eq!(c.validate(), Err(ConfigError::EmptyPool { pool: 1 }));
        let mut c = cfg();
        c.pools[0].ports = 5000..=5002;
        assert_eq!(
            c.validate(),
            Err(ConfigError::PortRangeTooSmall { pool: 0 })
        );
        let mut c = cfg();
        c.pools[0].ports = 1024..=2047;
        c.port_block_size = 256;
        assert_eq!(c.validate(), Ok(()));
        c.port_block_size = 257;
        assert_eq!(
            c.validate(),
            Err(ConfigError::PortBlockTooLarge {
                pool: 0,
                share: 256
            })
        );
    }

    #[test]
    fn deterministic_blocks_are_a_bijection() {
        for workers in [1u16, 2, 3] {
            let mut c = cfg();
            c.workers = workers;
            c.pools[0].ports = 1024..=65535;
            c.port_block_size = 1000;
            c.deterministic = Some((Ipv4Addr::new(100, 64, 0, 0), 26));
            assert_eq!(c.validate(), Ok(()), "{workers} workers");
            let per = c.det_blocks_per_addr(&c.pools[0]);
            for i in 0..64u32 {
                let sub = Ipv4Addr::from(0x6440_0000 + i);
                let (addr, ranges) = c.deterministic_block(PoolId(0), sub).unwrap();
                assert_eq!(addr, c.pools[0].addrs[(i / per) as usize]);
                assert_eq!(ranges.len(), usize::from(workers));
                for (w, &(first, last)) in ranges.iter().enumerate() {
                    for port in first..=last {
                        if owner_of(port, workers) as usize != w {
                            continue;
                        }
                        assert_eq!(
                            c.deterministic_subscriber(PoolId(0), addr, port),
                            Some(sub),
                            "{workers} workers, {addr}:{port}"
                        );
                    }
                }
            }
            // Outside the prefix, outside the pool.
            assert_eq!(
                c.deterministic_block(PoolId(0), Ipv4Addr::new(100, 64, 0, 64)),
                None
            );
            assert_eq!(
                c.deterministic_subscriber(PoolId(0), Ipv4Addr::new(192, 0, 2, 9), 2000),
                None
            );
            assert_eq!(
                c.deterministic_subscriber(PoolId(0), Ipv4Addr::new(192, 0, 2, 0), 80),
                None
            );
        }
        let mut c = cfg();
        c.port_block_size = 1000;
        c.deterministic = Some((Ipv4Addr::new(100, 64, 0, 0), 24));
        // 4 addresses x 16 blocks of 1000 of a 4-worker share: 64 < 256.
        assert!(matches!(
            c.validate(),
            Err(ConfigError::DeterministicTooSmall { needed: 256, .. })
        ));
        c.port_block_size = 0;
        assert_eq!(c.validate(), Err(ConfigError::DeterministicNeedsBlocks));
    }

    #[test]
    fn pairing_is_stable_and_in_pool() {
        let c = cfg();
        for i in 0..1000u32 {
            let int = Ipv4Addr::from(0x0a00_0000 + i);
            let a = c.paired_addr(PoolId(0), int);
            assert_eq!(a, c.paired_addr(PoolId(0), int));
            assert!(a.is_some_and(|a| c.pools[0].addrs.contains(&a)));
        }
        assert_eq!(c.paired_addr(PoolId(9), Ipv4Addr::LOCALHOST), None);
    }
}
