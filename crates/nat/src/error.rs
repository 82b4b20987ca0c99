//! Error types of the NAT layer: small, `Copy`, and printable.

use core::fmt;

/// Why a translation could not be set up (slow path).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NatError {
    /// No free external port on this worker's slice of the pool (for a paired
    /// pool: of the subscriber's paired address).
    PoolExhausted,
    /// The internal host already holds its maximum number of sessions.
    SubscriberLimit,
    /// Port block allocation: the internal host holds its maximum number of
    /// port blocks and every one is full for this protocol.
    BlockLimit,
    /// Deterministic NAT: the source is outside the configured prefix, so
    /// no block is its.
    OutsidePrefix,
    /// Masquerade was asked for but the egress interface has no address.
    NoEgressAddress,
    /// Every masquerade address slot is bound to another live address.
    MasqueradeSlotsExhausted,
    /// The translation names a pool that the configuration does not define.
    UnknownPool,
    /// Dynamic NAT is only defined for TCP, UDP and ICMP queries.
    UnsupportedProtocol,
}

impl NatError {
    /// A short, stable name for counters and logs.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::PoolExhausted => "nat_pool_exhausted",
            Self::SubscriberLimit => "nat_subscriber_limit",
            Self::BlockLimit => "nat_block_limit",
            Self::OutsidePrefix => "nat_outside_prefix",
            Self::NoEgressAddress => "nat_no_egress_address",
            Self::MasqueradeSlotsExhausted => "nat_masquerade_slots_exhausted",
            Self::UnknownPool => "nat_unknown_pool",
            Self::UnsupportedProtocol => "nat_unsupported_protocol",
        }
    }
}

impl fmt::Display for NatError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = match self {
            Self::PoolExhausted => "NAT pool exhausted",
            Self::SubscriberLimit => "per-subscriber session limit reached",
            Self::BlockLimit => "the subscriber's port blocks are full and it holds its maximum",
            Self::OutsidePrefix => "deterministic NAT: the source is outside the subscriber prefix",
            Self::NoEgressAddress => "masquerade: egress interface has no IPv4 address",
            Self::MasqueradeSlotsExhausted => "masquerade: no free address slot",
            Self::UnknownPool => "unknown NAT pool",
            Self::UnsupportedProtocol => "protocol not supported by dynamic NAT",
        };
        f.write_str(s)
    }
}

impl std::error::Error for NatError {}

/// Why a NAT configuration was rejected.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ConfigError {
    /// `workers` is zero.
    NoWorkers,
    /// The worker index is not below `workers`.
    WorkerOutOfRange,
    /// Pool `pool` has no address.
    EmptyPool {
        /// Index of the offending pool.
        pool: u16,
    },
    /// Pool `pool` has fewer ports than there are workers, so some worker
    /// would own none.
    PortRangeTooSmall {
        /// Index of the offending pool.
        pool: u16,
    },
    /// An address appears in two pools (or twice in one).
    OverlappingPools {
        /// Index of the offending pool.
        pool: u16,
    },
    /// More pools, or more addresses in a pool, than the tables index.
    TooLarge,
    /// The masquerade port range has fewer ports than there are workers.
    MasqueradeRangeTooSmall,
    /// Deterministic NAT without port blocks.
    DeterministicNeedsBlocks,
    /// Pool `pool` has fewer deterministic blocks than the prefix has
    /// subscribers.
    DeterministicTooSmall {
        /// Index of the offending pool.
        pool: u16,
        /// Blocks of the pool (per worker).
        capacity: u64,
        /// Addresses of the prefix.
        needed: u64,
    },
    /// A worker's share of pool `pool`'s port range is smaller than one
    /// port block.
    PortBlockTooLarge {
        /// Index of the offending pool.
        pool: u16,
        /// Ports of the smallest worker share.
        share: u32,
    },
    /// A running gateway's pools and some switches may change
    /// ([`crate::NatConfig::pool_change`]), its other NAT settings not.
    SettingsChange,
    /// Deterministic NAT: the pools cannot change while running (every
    /// subscriber's block would move).
    DeterministicPoolChange,
    /// Port block allocation: `addr` stays a pool address but its port
    /// range changes, so the blocks held on it cannot stay where they are.
    BlockRangeChange {
        /// The address.
        addr: core::net::Ipv4Addr,
    },
    /// Port block allocation: `addr` left the pools earlier in this run
    /// and cannot come back (blocks of its retired mappings may live on).
    BlockAddressReturns {
        /// The address.
        addr: core::net::Ipv4Addr,
    },
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NoWorkers => f.write_str("nat: workers must be at least 1"),
            Self::WorkerOutOfRange => f.write_str("nat: worker index out of range"),
            Self::EmptyPool { pool } => write!(f, "nat: pool {pool} has no address"),
            Self::PortRangeTooSmall { pool } => {
                write!(f, "nat: pool {pool} has fewer ports than workers")
            }
            Self::OverlappingPools { pool } => {
                write!(f, "nat: pool {pool} shares an address with another pool")
            }
            Self::TooLarge => f.write_str("nat: too many pools or pool addresses"),
            Self::MasqueradeRangeTooSmall => {
                f.write_str("nat: masquerade port range has fewer ports than workers")
            }
            Self::DeterministicNeedsBlocks => {
                f.write_str("nat: deterministic needs port_block_size (the block each subscriber owns)")
            }
            Self::DeterministicTooSmall { pool, capacity, needed } => write!(
                f,
                "nat: pool {pool} has {capacity} port blocks per worker for the {needed} subscribers of the deterministic prefix"
            ),
            Self::PortBlockTooLarge { pool, share } => write!(
                f,
                "nat: port_block_size is larger than a worker's share of pool {pool}'s port range ({share} ports)"
            ),
            Self::SettingsChange => f.write_str(
                "nat: only the pools, hairpinning, pooling, max_sessions_per_subscriber and max_blocks_per_subscriber can change while running; the other NAT settings need a restart",
            ),
            Self::DeterministicPoolChange => f.write_str(
                "nat: deterministic NAT pools cannot change while running (every subscriber's port block would move); restart",
            ),
            Self::BlockRangeChange { addr } => write!(
                f,
                "nat: port blocks: {addr} stays a pool address but its port range changes, so the blocks held on it cannot stay; keep its range, or restart"
            ),
            Self::BlockAddressReturns { addr } => write!(
                f,
                "nat: port blocks: {addr} left the pools earlier and cannot come back while running (its retired port blocks may still be in use); restart"
            ),
        }
    }
}

impl std::error::Error for ConfigError {}

/// Why a packet rewrite was refused. The packet is left unmodified
/// whenever one of these is returned before any byte was written; see
/// [`crate::rewrite`] for the exact guarantee.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RewriteError {
    /// The frame is shorter than the headers the rewrite must touch.
    Truncated,
    /// The bytes at `l3_off` are not an IPv4 header with a sane IHL.
    NotIpv4,
    /// The packet is not an ICMP error, or its quoted packet is unusable.
    NotIcmpError,
    /// The packet's protocol is not the one the rewrite was built for.
    ProtocolMismatch,
}

impl RewriteError {
    /// A short, stable name for drop counters.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Truncated => "nat_rewrite_truncated",
            Self::NotIpv4 => "nat_rewrite_not_ipv4",
            Self::NotIcmpError => "nat_rewrite_not_icmp_error",
            Self::ProtocolMismatch => "nat_rewrite_protocol_mismatch",
        }
    }
}

impl fmt::Display for RewriteError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = match self {
            Self::Truncated => "packet too short for NAT rewrite",
            Self::NotIpv4 => "not an IPv4 header",
            Self::NotIcmpError => "not a translatable ICMP error",
            Self::ProtocolMismatch => "packet protocol does not match the rewrite",
        };
        f.write_str(s)
    }
}

impl std::error::Error for RewriteError {}
