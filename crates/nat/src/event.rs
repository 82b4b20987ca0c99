//! NAT log events (RFC 6888 REQ-12: a CGN must be able to log the
//! creation and removal of address/port mappings).
//!
//! Events carry no timestamp: time is passed in elsewhere, and the sink (the
//! engine's logger) stamps them when it receives them.

use core::net::Ipv4Addr;

/// One mapping event. `worker` is the worker whose port slice holds the
/// external port.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NatEvent {
    /// A new (internal endpoint -> external endpoint) mapping.
    MappingCreated {
        /// IP protocol number.
        proto: u8,
        /// Internal (subscriber) address.
        int_addr: Ipv4Addr,
        /// Internal port or ICMP identifier.
        int_port: u16,
        /// External (pool) address.
        ext_addr: Ipv4Addr,
        /// External port or ICMP identifier.
        ext_port: u16,
        /// Owning worker.
        worker: u16,
    },
    /// The last session of a mapping went away; the port is free again.
    MappingRemoved {
        /// IP protocol number.
        proto: u8,
        /// Internal (subscriber) address.
        int_addr: Ipv4Addr,
        /// Internal port or ICMP identifier.
        int_port: u16,
        /// External (pool) address.
        ext_addr: Ipv4Addr,
        /// External port or ICMP identifier.
        ext_port: u16,
        /// Owning worker.
        worker: u16,
    },
    /// Port block allocation (`NatConfig::port_block_size`): a block of
    /// external ports on one address now belongs to a subscriber, for all
    /// of its TCP, UDP and ICMP mappings. Replaces the per-mapping events.
    BlockAllocated {
        /// Internal (subscriber) address.
        int_addr: Ipv4Addr,
        /// External (pool) address.
        ext_addr: Ipv4Addr,
        /// First port of the block.
        first_port: u16,
        /// Last port of the block. With several workers the block holds
        /// only the ports from `first_port` to `last_port` that `worker`
        /// owns (see [`crate::owner_of`]).
        last_port: u16,
        /// Owning worker.
        worker: u16,
    },
    /// The subscriber's last mapping in the block went away; the block is
    /// free again.
    BlockReleased {
        /// Internal (subscriber) address.
        int_addr: Ipv4Addr,
        /// External (pool) address.
        ext_addr: Ipv4Addr,
        /// First port of the block.
        first_port: u16,
        /// Last port of the block.
        last_port: u16,
        /// Owning worker.
        worker: u16,
    },
}

/// A mapping event's fields ([`NatEvent::view`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MappingView {
    /// Created (else removed).
    pub created: bool,
    /// IP protocol number.
    pub proto: u8,
    /// Internal endpoint.
    pub int: (Ipv4Addr, u16),
    /// External endpoint.
    pub ext: (Ipv4Addr, u16),
    /// Owning worker.
    pub worker: u16,
}

/// A port block event's fields ([`NatEvent::view`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockView {
    /// Allocated (else released).
    pub allocated: bool,
    /// Internal (subscriber) address.
    pub int_addr: Ipv4Addr,
    /// External address.
    pub ext_addr: Ipv4Addr,
    /// First and last port.
    pub ports: (u16, u16),
    /// Owning worker.
    pub worker: u16,
}

/// An event as one of its two shapes, for the writers of logs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventView {
    /// A mapping created or removed.
    Mapping(MappingView),
    /// A port block allocated or released.
    Block(BlockView),
}

impl NatEvent {
    /// The event's fields by shape.
    pub fn view(&self) -> EventView {
        match *self {
            Self::MappingCreated {
                proto,
                int_addr,
                int_port,
                ext_addr,
                ext_port,
                worker,
            }
            | Self::MappingRemoved {
                proto,
                int_addr,
                int_port,
                ext_addr,
                ext_port,
                worker,
            } => EventView::Mapping(MappingView {
                created: matches!(self, Self::MappingCreated { .. }),
                proto,
                int: (int_addr, int_port),
                ext: (ext_addr, ext_port),
                worker,
            }),
            Self::BlockAllocated {
                int_addr,
                ext_addr,
                first_port,
                last_port,
                worker,
            }
            | Self::BlockReleased {
                int_addr,
                ext_addr,
                first_port,
                last_port,
                worker,
            } => EventView::Block(BlockView {
                allocated: matches!(self, Self::BlockAllocated { .. }),
                int_addr,
                ext_addr,
                ports: (first_port, last_port),
                worker,
            }),
        }
    }
}

/// Receives NAT events. Called on the slow path only.
pub trait NatEventSink {
    /// Handle one event.
    fn event(&mut self, e: &NatEvent);

    /// Whether the events are kept (logged) at all. A sink that discards
    /// them says `false`, and a flush ([`crate::WorkerNat::clear`]) then
    /// frees everything in bulk instead of mapping by mapping, emitting
    /// nothing.
    fn keeps_events(&self) -> bool {
        true
    }
}

/// Discards every event.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoopSink;

impl NatEventSink for NoopSink {
    #[inline]
    fn event(&mut self, _e: &NatEvent) {}

    fn keeps_events(&self) -> bool {
        false
    }
}

/// Collects every event, for tests and small tools.
#[derive(Clone, Debug, Default)]
pub struct VecSink {
    /// Events in arrival order.
    pub events: Vec<NatEvent>,
}

impl NatEventSink for VecSink {
    fn event(&mut self, e: &NatEvent) {
        self.events.push(*e);
    }
}

impl<S: NatEventSink + ?Sized> NatEventSink for &mut S {
    fn event(&mut self, e: &NatEvent) {
        (**self).event(e);
    }
}
