//! `sluice-nat`: NAT44 for Sluice — address and port pools, per-worker port
//! ranges, mapping and filtering behaviour (RFC 4787, RFC 5382, RFC 6888),
//! packet rewriting with incremental checksums (RFC 1624), and NAT log
//! events.
//!
//! # What it owns
//!
//! - [`config`]: pools, translation kinds, behaviour switches. Plain data.
//! - [`ports`]: the split of the port space between workers
//!   ([`owner_of`]`(port) = (port >> 1) % workers`) and the bitmap allocator.
//! - [`worker`]: [`WorkerNat`], the slow-path state of one worker: mapping
//!   tables, pairing, filtering, per-subscriber limits. Never shared, never
//!   locked. Its internal-side mapping index is a hand-written table the
//!   engine can prefetch a batch ahead (`intmap`; see
//!   [`WorkerNat::prefetch_outbound`]).
//! - [`rewrite`]: the fast path: [`Rewrite4`] / [`apply_with`] and ICMP
//!   error translation ([`apply_icmp_error`]).
//! - [`event`]: mapping created/removed events for CGN logging.
//!
//! # Invariants
//!
//! - An external endpoint `(proto, ext addr, ext port)` belongs to at most
//!   one mapping, and its port is owned by exactly one worker,
//!   `owner_of(port)`. Workers allocate only from their own slice.
//! - A mapping lives exactly as long as at least one session (conntrack
//!   entry) references it; releasing the last session frees the port. The
//!   references a session holds are derived from its two conntrack keys, by
//!   the same function at creation and at release (see [`worker`]). Mapping
//!   lifetime therefore follows conntrack timeouts (RFC 4787 REQ-5 and
//!   RFC 5382 REQ-5 are met by conntrack's UDP and TCP timeouts).
//! - Paired pooling (RFC 4787 REQ-2) is a keyed hash of the internal
//!   address, so every worker pairs a subscriber with the same address.
//! - The port allocator never allocates after construction; nothing here
//!   reads a clock; nothing panics on packet bytes or configuration.
//! - Rewrites check bounds of every byte they touch before writing any: a
//!   failed rewrite leaves the frame untouched.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod config;
mod csum;
pub mod error;
pub mod event;
mod intmap;
pub mod ports;
pub mod rewrite;
#[cfg(test)]
mod testutil;
pub mod worker;

pub use config::{
    FilteringBehaviour, MappingBehaviour, NatConfig, Pool, PoolId, Pooling, SeenRanges,
    Translation, DEFAULT_PORTS,
};
pub use error::{ConfigError, NatError, RewriteError};
pub use event::{BlockView, EventView, MappingView, NatEvent, NatEventSink, NoopSink, VecSink};
pub use ports::{owner_of, PortSlice};
pub use rewrite::{
    apply_dissected, apply_icmp_error, apply_with, deltas, icmp_error_inner_target, reverse_delta,
    Rewrite4,
};
pub use worker::{MappingInfo, NatStats, PoolChange, RestoreRefused, WorkerNat};
