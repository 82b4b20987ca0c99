//! Drop reasons: one enum that indexes the counters and names them for
//! operators (the VPP convention). Every frame the engine does not forward or
//! answer increments exactly one of these.

use core::fmt;

macro_rules! drop_reasons {
    ($($(#[$m:meta])* $v:ident => $name:literal,)*) => {
        /// Why a frame was dropped.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        #[repr(u8)]
        pub enum DropReason { $($(#[$m])* $v,)* }

        impl DropReason {
            /// Every reason, in counter order.
            pub const ALL: &'static [DropReason] = &[$(DropReason::$v,)*];
            /// Number of reasons (the length of a counter array).
            pub const COUNT: usize = Self::ALL.len();
            /// The operator-facing name (stable; used in metrics and `ctl`).
            pub const fn name(self) -> &'static str {
                match self { $(DropReason::$v => $name,)* }
            }
        }
    };
}

drop_reasons! {
    /// The frame could not be parsed (truncated, bad header length, ...).
    Malformed => "malformed",
    /// Not IPv4/IPv6/ARP, or a protocol the engine does not forward.
    UnsupportedProtocol => "unsupported-protocol",
    /// The ruleset's verdict was drop.
    PolicyDrop => "policy-drop",
    /// The ruleset's verdict was reject (an ICMP error or TCP RST may be sent).
    PolicyReject => "policy-reject",
    /// Conntrack classified the packet as invalid (e.g. a bad TCP transition).
    CtInvalid => "ct-invalid",
    /// The connection table is full and nothing could be evicted early.
    CtFull => "ct-full",
    /// No NAT port/address was free.
    NatExhausted => "nat-exhausted",
    /// The subscriber reached its session limit.
    NatSubscriberLimit => "nat-subscriber-limit",
    /// An inbound packet matched no session and no mapping allowed it.
    NatNoMapping => "nat-no-mapping",
    /// Inbound packet refused by the NAT filtering behaviour (RFC 4787 REQ-8).
    NatFiltered => "nat-filtered",
    /// The egress interface's link is down (or the interface is gone), as
    /// the gateway last looked: the packet was routed and translated (its
    /// connection and NAT state stay, as the kernel's do when a transmit
    /// fails) but not sent.
    LinkDown => "link-down",
    /// No route to the destination.
    NoRoute => "no-route",
    /// The next hop's link-layer address is not known (yet).
    NoNeighbor => "no-neighbor",
    /// TTL or hop limit expired (an ICMP time-exceeded error is sent, rate
    /// permitting).
    TtlExpired => "ttl-expired",
    /// Fragment that cannot be translated (non-first fragment with no state).
    Fragment => "fragment",
    /// The packet is for the gateway itself but nothing handles it.
    LocalUnhandled => "local-unhandled",
    /// A rewrite failed (checksum area truncated, ...).
    RewriteFailed => "rewrite-failed",
    /// Packet larger than the egress MTU with DF set (an ICMP
    /// fragmentation-needed error is sent, rate permitting).
    TooBig => "too-big",
    /// A later IPv4 fragment larger than the egress MTU with DF set: it
    /// may not be split, and no ICMP error is sent about a later fragment.
    /// (Any other packet above the MTU without DF is fragmented on output.)
    FragmentationUnsupported => "fragmentation-unsupported",
    /// An NDP message that needs no answer from the engine: a neighbor
    /// advertisement (the neighbour resolver learns from it before the
    /// engine sees it), a router solicitation or advertisement, a redirect,
    /// or a solicitation for an address that is not the ingress
    /// interface's.
    NdpIgnored => "ndp-ignored",
    /// An NDP message that fails RFC 4861 §7.1 validation (hop limit not
    /// 255, bad checksum, bad code or options).
    NdpInvalid => "ndp-invalid",
    /// An IPv6 packet to a multicast group (MLD, mDNS, ...): the engine does
    /// not route multicast.
    Ipv6Multicast => "ipv6-multicast",
    /// An IPv6 packet with a link-local source or destination that is not
    /// for the gateway: link-local scope never crosses a router (RFC 4291
    /// §2.5.6).
    Ipv6LinkLocal => "ipv6-link-local",
    /// An IPv6 packet with an unspecified, loopback or multicast source, or
    /// an unspecified or loopback destination (RFC 4291 §2.5.2-2.5.3, §2.7).
    Ipv6BadAddress => "ipv6-bad-address",
    /// A UDP datagram over IPv6 with a zero checksum (RFC 8200 §8.1).
    Udp6ZeroChecksum => "udp6-zero-checksum",
    /// An ICMPv6 error that quotes a packet of no tracked connection.
    Icmp6ErrorUnrelated => "icmp6-error-unrelated",
    /// A frame addressed to another station's MAC address (seen when the
    /// port is promiscuous or a switch floods unknown unicast): not for the
    /// gateway. The kernel drops these as `PACKET_OTHERHOST` before any
    /// hook.
    OtherHost => "other-host",
    /// A frame with an 802.1Q or 802.1ad VLAN tag whose VLAN id is not 0:
    /// Sluice has no VLAN interfaces, so a tagged frame belongs to a VLAN
    /// it is not on. Like the kernel without a VLAN device for the id
    /// (`PACKET_OTHERHOST`), it neither forwards nor answers it (a
    /// priority-tagged frame, VLAN id 0, is handled as untagged).
    VlanTagged => "vlan-tagged",
    /// A packet received in a link-layer broadcast or multicast frame that
    /// would be forwarded: a router does not forward those (RFC 1812
    /// §5.3.4; the kernel's `ip_forward` and `ip6_forward` drop them).
    LinkBroadcast => "link-broadcast",
    /// An IPv4 packet from a source no host may use: multicast, the limited
    /// broadcast, `0.0.0.0/8` (except to the limited broadcast, as DHCP
    /// clients send) or `127.0.0.0/8` (the kernel's `martian_source`).
    MartianSource => "martian-source",
    /// An IPv4 packet to `0.0.0.0/8` or `127.0.0.0/8` (the kernel's
    /// `martian_destination`).
    MartianDestination => "martian-destination",
    /// An IPv4 packet to a multicast group: the engine does not route
    /// multicast and joins no group.
    Ipv4Multicast => "ipv4-multicast",
}

impl fmt::Display for DropReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Per-worker counters. Plain integers: a worker owns its counters and the
/// control plane reads a snapshot, so there is no atomic on the fast path.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Counters {
    /// Frames received.
    pub rx: u64,
    /// Frames forwarded (transmitted).
    pub tx: u64,
    /// Frames handled by the fast path (conntrack hit).
    pub fast_path: u64,
    /// Frames handled by the slow path (conntrack miss).
    pub slow_path: u64,
    /// Connections created.
    pub ct_created: u64,
    /// Frames answered locally (ARP, ICMP echo).
    pub local: u64,
    /// ICMP errors sent about dropped packets (time exceeded, fragmentation
    /// needed). The dropped packet is also counted under its drop reason.
    pub icmp_errors: u64,
    /// ICMP errors not sent because of the rate limit.
    pub icmp_errors_limited: u64,
    /// TCP resets sent for rejected segments (`reject with tcp reset`); the
    /// segment is also counted under `policy-reject`.
    pub tcp_resets: u64,
    /// Frames handed to the worker that owns their connection
    /// ([`crate::Action::Handoff`]).
    pub handed_off: u64,
    /// Packets larger than the egress MTU, with DF clear, sent as
    /// fragments ([`crate::Action::Fragment`]; also counted in `tx`).
    pub fragmented: u64,
    /// Packets a `notrack` statement exempted from conntrack (forwarded,
    /// answered or dropped without a connection).
    pub untracked: u64,
    /// Drops, indexed by `DropReason as usize`.
    pub drops: [u64; DropReason::COUNT],
}

impl Counters {
    /// Count one drop.
    #[inline]
    pub fn drop(&mut self, r: DropReason) {
        // `r as usize < COUNT` by construction of the enum; `get_mut` keeps
        // the fast path free of panicking index operations anyway.
        if let Some(c) = self.drops.get_mut(r as usize) {
            *c += 1;
        }
    }

    /// Drops for one reason.
    pub fn drops_for(&self, r: DropReason) -> u64 {
        self.drops.get(r as usize).copied().unwrap_or(0)
    }

    /// Total drops.
    pub fn total_drops(&self) -> u64 {
        self.drops.iter().sum()
    }

    /// Add another worker's counters (for status snapshots).
    pub fn merge(&mut self, o: &Counters) {
        self.rx += o.rx;
        self.tx += o.tx;
        self.fast_path += o.fast_path;
        self.slow_path += o.slow_path;
        self.ct_created += o.ct_created;
        self.local += o.local;
        self.icmp_errors += o.icmp_errors;
        self.icmp_errors_limited += o.icmp_errors_limited;
        self.tcp_resets += o.tcp_resets;
        self.handed_off += o.handed_off;
        self.fragmented += o.fragmented;
        self.untracked += o.untracked;
        for (a, b) in self.drops.iter_mut().zip(o.drops.iter()) {
            *a += b;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_counters_index_by_reason() {
        let mut names: Vec<_> = DropReason::ALL.iter().map(|r| r.name()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), DropReason::COUNT);
        let mut c = Counters::default();
        c.drop(DropReason::NoRoute);
        c.drop(DropReason::NoRoute);
        assert_eq!(c.drops_for(DropReason::NoRoute), 2);
        assert_eq!(c.total_drops(), 2);
    }
}
