//! `sluice-engine`: the per-worker packet pipeline. It composes wire parsing,
//! conntrack, NAT and the policy, and does no I/O.
//!
//! ```text
//! batch -> dissect all -> hash + prefetch buckets -> lookup + prefetch entries
//!   (misses: prefetch the NAT mapping slot, then the predicted reply bucket)
//!   hit  -> fast path: track state, apply the cached rewrite and adjacency
//!   miss -> slow path: prerouting (DNAT) -> route -> filter -> postrouting (SNAT)
//!           -> conntrack insert -> rewrite
//! ```
//!
//! Invariants:
//! - The fast path never allocates, locks, reads a clock or panics; time is
//!   passed in by the caller.
//! - Every frame ends with exactly one [`Action`]; every drop increments one
//!   [`DropReason`] counter. A dropped frame turned into an ICMP error
//!   (TTL expired, too big with DF set) ends as [`Action::Reply`] and still
//!   counts its drop reason.
//! - A worker owns its connection table and its slice of the NAT port space,
//!   so nothing is shared between workers on the packet path.
#![forbid(unsafe_code)]

pub mod ct_timeout;
pub mod drop;
pub mod icmp_error;
pub mod offload;
pub mod policy;
pub mod route;
pub mod tcp_reset;
pub mod worker;

pub use drop::{Counters, DropReason};
pub use policy::{
    fixed_addr_type, ConnTuple, CtState, Decision, Hook, MssClamp, Policy, PolicyPacket,
    PortForward, RawDecision, StaticPolicy, Verdict,
};
pub use route::{AdjIndex, Adjacency, IfIndex, Route4, Route6, RouteTable4, RouteTable6};
pub use worker::{
    BucketPrefetch, EngineConfig, EngineError, Interface, LoggedEvent, NatLog, RestoreError,
    SavedConn, Walk, Worker, REINSTALL_EVERY,
};

/// Largest batch the engine processes in one call.
pub const MAX_BATCH: usize = 256;

/// Frames the engine pipelines together inside a batch (see
/// [`Worker::process`]). With 64, the lines the first passes bring in
/// (frame headers, index buckets, entries: about 15 KB) stay in a 32 KB
/// L1 until pass 3 uses them; over a whole 256-frame batch they did not.
/// Callgrind's cache model, `sluice bench nat44 --connections 100k
/// --frames 1000000` (2026-11-23): 6.2 L1 data misses per packet with the
/// passes over all 256 frames, 4.8 in groups of 64 (1 % more
/// instructions); most of the rest are the frames themselves, which the
/// tester wrote a whole batch earlier. 64 prefetches in flight still
/// exceed what one core can track at once.
pub const PIPELINE: usize = 64;

/// What happens to a frame after processing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Action {
    /// Not processed yet.
    #[default]
    Pending,
    /// Transmit on this interface (the frame was rewritten in place).
    Forward(IfIndex),
    /// Transmit back out of the ingress interface (a reply built in place:
    /// ARP reply, ICMP echo reply, or an ICMP error about the dropped frame,
    /// which is then also counted under its [`DropReason`]).
    Reply,
    /// Dropped, for this reason.
    Drop(DropReason),
    /// Belongs to a connection that lives on another worker (or will be
    /// created there): pass the frame, unchanged, to that worker, which
    /// processes it with [`Worker::process_handed_off`]. Only with several
    /// workers; see the worker's module documentation.
    Handoff(u16),
    /// Belongs to another worker the way port steering would have decided
    /// (a packet to a NAT external port of that worker, a first fragment
    /// whose ports name it): pass the frame, unchanged, to that worker,
    /// which processes it with [`Worker::process`] as if it had been
    /// steered there (it may hand it on once more, with
    /// [`Action::Handoff`]).
    Steer(u16),
    /// Transmit on this interface, split into IPv4 fragments of at most
    /// this many bytes (the egress MTU; DF was clear; the frame was
    /// rewritten in place first). The io layer splits it
    /// (`sluice_wire::frag::fragment4`).
    Fragment(IfIndex, u16),
}

/// A batch of frames the engine can rewrite in place. Implemented by the io
/// backends and by the tester.
pub trait Frames {
    /// Number of frames in the batch (at most [`MAX_BATCH`] are processed).
    fn count(&self) -> usize;
    /// The whole buffer of frame `i` (its capacity, which may exceed its
    /// length) and its current length.
    fn buf_mut(&mut self, i: usize) -> (&mut [u8], usize);
    /// Set the length of frame `i` (a reply may be longer than the request).
    fn set_len(&mut self, i: usize, len: usize);
    /// Ingress interface of frame `i`.
    fn iif(&self, i: usize) -> IfIndex;
    /// Record the outcome for frame `i`.
    fn set_action(&mut self, i: usize, a: Action);
}
