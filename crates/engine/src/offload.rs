//! Flow offload requests: the worker hands established connections whose
//! packets need nothing but the cached rewrite to a lower layer (the io
//! crate's XDP offload map), and takes them back when that stops being
//! true. The engine does no I/O: it queues [`OffloadOp`]s that the caller
//! drains after each batch and applies, and its connection GC asks an
//! [`OffloadProbe`] when the lower layer last forwarded a packet of an
//! offloaded connection before it expires it.
//!
//! A direction is offloaded when a packet of an IPv4 or IPv6 TCP or UDP
//! connection takes the fast path with
//! - the policy accepting established packets up front (no filter chain
//!   runs per established packet, [`crate::Policy::established_accepted`]);
//! - TCP in ESTABLISHED (the lower layer passes SYN, FIN and RST up, so the
//!   state machine still sees every transition, and the worker takes both
//!   directions back when the connection leaves ESTABLISHED); UDP in any
//!   state, as netfilter's flowtable does;
//! - symmetric routing: the packet arrived on the interface its reply
//!   leaves by (the offload key includes the ingress interface);
//! - both adjacencies resolved and the packet forwarded, not fragmented,
//!   not hairpinned through another worker.
//!
//! IPv6 connections ([`OffloadFlow6`]) have nothing to rewrite but the
//! MACs and the hop limit (no NAT66), and the lower layer keeps them in a
//! table of their own.
//!
//! Both directions are installed at once. They are removed when the entry
//! goes (close, GC, early drop, RST), all of them when the policy stops
//! accepting established packets up front, a neighbour's MAC changes or
//! the table is flushed ([`OffloadOp::Clear`]). Installing never blocks a
//! packet: when the queue is full the request is counted in
//! [`OffloadQueue::dropped`] and the connection stays on the userspace path.

use std::collections::VecDeque;

use sluice_wire::flow::{FlowKey4, FlowKey6};

use crate::route::{Adjacency, IfIndex};

/// One direction to offload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OffloadFlow {
    /// Interface its packets arrive on.
    pub iif: IfIndex,
    /// Their tuple as they arrive.
    pub key: FlowKey4,
    /// The tuple they leave with.
    pub to: FlowKey4,
    /// RFC 1624 delta of the IPv4 header checksum, TTL decrement included.
    pub ip_delta: u16,
    /// RFC 1624 delta of the TCP or UDP checksum.
    pub l4_delta: u16,
    /// Where they leave: interface, MACs, MTU.
    pub adj: Adjacency,
}

/// One direction of an IPv6 connection to offload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OffloadFlow6 {
    /// Interface its packets arrive on.
    pub iif: IfIndex,
    /// Their tuple (they leave with the same).
    pub key: FlowKey6,
    /// Where they leave: interface, MACs, MTU.
    pub adj: Adjacency,
}

/// A request to the lower layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OffloadOp {
    /// Offload one direction.
    Install(OffloadFlow),
    /// Take one direction back.
    Remove {
        /// Interface its packets arrive on.
        iif: IfIndex,
        /// Their tuple as they arrive.
        key: FlowKey4,
    },
    /// Offload one IPv6 direction.
    Install6(OffloadFlow6),
    /// Take one IPv6 direction back.
    Remove6 {
        /// Interface its packets arrive on.
        iif: IfIndex,
        /// Their tuple.
        key: FlowKey6,
    },
    /// Take every direction back, IPv4 and IPv6.
    Clear,
}

/// Answers the GC: when did the lower layer last forward a packet of this
/// direction? In the engine's clock (the `now_ns` passed to
/// [`crate::Worker::process`]); `None` when never or unknown.
pub trait OffloadProbe {
    /// Last use of direction `key` arriving on `iif`.
    fn last_used_ns(&mut self, iif: IfIndex, key: &FlowKey4) -> Option<u64>;
    /// Last use of IPv6 direction `key` arriving on `iif`.
    fn last_used6_ns(&mut self, iif: IfIndex, key: &FlowKey6) -> Option<u64>;
}

/// A probe for a worker without a lower layer: nothing was ever used.
pub struct NoOffload;

impl OffloadProbe for NoOffload {
    fn last_used_ns(&mut self, _: IfIndex, _: &FlowKey4) -> Option<u64> {
        None
    }
    fn last_used6_ns(&mut self, _: IfIndex, _: &FlowKey6) -> Option<u64> {
        None
    }
}

/// The bounded queue of requests (allocated once).
#[derive(Debug)]
pub struct OffloadQueue {
    ops: VecDeque<OffloadOp>,
    cap: usize,
    /// Install requests not queued because the queue was full.
    pub dropped: u64,
}

impl OffloadQueue {
    pub(crate) fn new(cap: usize) -> Self {
        Self {
            ops: VecDeque::with_capacity(cap.max(2)),
            cap: cap.max(2),
            dropped: 0,
        }
    }

    /// Room for `n` more requests.
    #[inline]
    pub(crate) fn has_room(&self, n: usize) -> bool {
        self.ops.len() + n <= self.cap
    }

    /// Queue a request that must not be lost (a removal): when the queue is
    /// full, everything queued is replaced by one `Clear`, which covers it.
    pub(crate) fn push_must(&mut self, op: OffloadOp) -> bool {
        if self.ops.len() < self.cap {
            self.ops.push_back(op);
            true
        } else {
            self.ops.clear();
            self.ops.push_back(OffloadOp::Clear);
            false
        }
    }

    pub(crate) fn push_install(&mut self, f: OffloadFlow) {
        self.ops.push_back(OffloadOp::Install(f));
    }

    pub(crate) fn push_install6(&mut self, f: OffloadFlow6) {
        self.ops.push_back(OffloadOp::Install6(f));
    }

    /// Take every pending request, in order.
    pub fn drain(&mut self) -> impl Iterator<Item = OffloadOp> + '_ {
        self.ops.drain(..)
    }

    /// Requests pending.
    pub fn len(&self) -> usize {
        self.ops.len()
    }

    /// No request pending.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }
}
