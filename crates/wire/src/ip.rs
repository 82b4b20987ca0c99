//! Definitions shared by IPv4 and IPv6: protocol numbers and address pairs
//! for pseudo-header checksums.

use crate::checksum;

enum_with_unknown! {
    /// IP protocol / IPv6 next-header numbers (IANA "Assigned Internet
    /// Protocol Numbers").
    pub enum IpProtocol(u8) {
        /// IPv6 hop-by-hop options (RFC 8200 §4.3).
        HopByHop = 0,
        /// ICMP (RFC 792).
        Icmp = 1,
        /// TCP (RFC 9293).
        Tcp = 6,
        /// UDP (RFC 768).
        Udp = 17,
        /// IPv6 routing header (RFC 8200 §4.4).
        Ipv6Route = 43,
        /// IPv6 fragment header (RFC 8200 §4.5).
        Ipv6Frag = 44,
        /// Encapsulating security payload (RFC 4303).
        Esp = 50,
        /// Authentication header (RFC 4302).
        Ah = 51,
        /// ICMPv6 (RFC 4443).
        Icmpv6 = 58,
        /// IPv6 "no next header" (RFC 8200 §4.7).
        Ipv6NoNxt = 59,
        /// IPv6 destination options (RFC 8200 §4.6).
        Ipv6Opts = 60,
    }
}

/// The source and destination addresses of an IP packet, in host byte
/// order, as needed for the transport pseudo-header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IpPair {
    /// IPv4 source and destination.
    V4 {
        /// Source address.
        src: u32,
        /// Destination address.
        dst: u32,
    },
    /// IPv6 source and destination.
    V6 {
        /// Source address.
        src: u128,
        /// Destination address.
        dst: u128,
    },
}

impl IpPair {
    /// The unfolded ones'-complement sum of the pseudo-header for an upper
    /// layer of protocol `proto` and `len` bytes (RFC 9293 §3.1, RFC 768,
    /// RFC 8200 §8.1).
    #[inline]
    pub fn pseudo_sum(&self, proto: u8, len: u32) -> u64 {
        match *self {
            IpPair::V4 { src, dst } => checksum::pseudo_v4(src, dst, proto, len as u16),
            IpPair::V6 { src, dst } => checksum::pseudo_v6(src, dst, proto, len),
        }
    }
}

/// Where a packet sits in fragmentation (RFC 791 §2.3, RFC 8200 §4.5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Frag {
    /// Not a fragment (IPv6 atomic fragments, RFC 6946, count as this).
    #[default]
    None,
    /// First fragment (offset 0, more fragments follow): the L4 header is here.
    First,
    /// A later fragment: no L4 header.
    NonFirst,
}

impl Frag {
    /// From the IPv4-style "more fragments" flag and offset.
    #[inline(always)]
    pub fn from_mf_offset(mf: bool, offset: u16) -> Frag {
        if offset != 0 {
            Frag::NonFirst
        } else if mf {
            Frag::First
        } else {
            Frag::None
        }
    }

    /// Whether the packet is a fragment at all.
    #[inline]
    pub fn is_fragment(self) -> bool {
        self != Frag::None
    }
}
