//! Flow keys: the 5-tuples that conntrack and NAT index by.
//!
//! A key describes one direction of a connection as it appears on the wire.
//! Addresses are stored in host byte order so that comparisons and hashing are
//! plain integer work; `From`/`Into` convert to `std::net` types.
//!
//! ICMP query messages (echo, timestamp, ...) are keyed by their identifier:
//! both `sport` and `dport` hold the identifier, so reversing a key (swapping
//! source and destination) yields the key of the reply.

use core::net::{Ipv4Addr, Ipv6Addr};

/// IP protocol numbers used throughout Sluice.
pub mod proto {
    /// ICMP for IPv4 (RFC 792).
    pub const ICMP: u8 = 1;
    /// TCP (RFC 9293).
    pub const TCP: u8 = 6;
    /// UDP (RFC 768).
    pub const UDP: u8 = 17;
    /// ICMP for IPv6 (RFC 4443).
    pub const ICMPV6: u8 = 58;
}

/// One direction of an IPv4 connection.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Default, PartialOrd, Ord)]
#[repr(C)]
pub struct FlowKey4 {
    /// Source address, host byte order.
    pub src: u32,
    /// Destination address, host byte order.
    pub dst: u32,
    /// Source port (TCP/UDP) or ICMP query identifier.
    pub sport: u16,
    /// Destination port (TCP/UDP) or ICMP query identifier.
    pub dport: u16,
    /// IP protocol number (see [`proto`]).
    pub proto: u8,
}

impl FlowKey4 {
    /// Build a key from `std::net` addresses.
    pub fn new(proto: u8, src: Ipv4Addr, sport: u16, dst: Ipv4Addr, dport: u16) -> Self {
        Self {
            src: u32::from(src),
            dst: u32::from(dst),
            sport,
            dport,
            proto,
        }
    }

    /// The key of the same connection seen in the other direction.
    #[inline]
    pub fn reversed(&self) -> Self {
        Self {
            src: self.dst,
            dst: self.src,
            sport: self.dport,
            dport: self.sport,
            proto: self.proto,
        }
    }

    /// Source address as `Ipv4Addr`.
    pub fn src_addr(&self) -> Ipv4Addr {
        Ipv4Addr::from(self.src)
    }

    /// Destination address as `Ipv4Addr`.
    pub fn dst_addr(&self) -> Ipv4Addr {
        Ipv4Addr::from(self.dst)
    }

    /// The key packed into two words, for hashing. Injective.
    #[inline]
    pub fn words(&self) -> [u64; 2] {
        [
            (u64::from(self.src) << 32) | u64::from(self.dst),
            (u64::from(self.sport) << 32) | (u64::from(self.dport) << 16) | u64::from(self.proto),
        ]
    }
}

impl core::fmt::Display for FlowKey4 {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(
            f,
            "proto {} {}:{} -> {}:{}",
            self.proto,
            self.src_addr(),
            self.sport,
            self.dst_addr(),
            self.dport
        )
    }
}

/// One direction of an IPv6 connection.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Default, PartialOrd, Ord)]
#[repr(C)]
pub struct FlowKey6 {
    /// Source address, host byte order.
    pub src: u128,
    /// Destination address, host byte order.
    pub dst: u128,
    /// Source port (TCP/UDP) or ICMPv6 query identifier.
    pub sport: u16,
    /// Destination port (TCP/UDP) or ICMPv6 query identifier.
    pub dport: u16,
    /// Upper-layer protocol number after extension headers.
    pub proto: u8,
}

impl FlowKey6 {
    /// Build a key from `std::net` addresses.
    pub fn new(proto: u8, src: Ipv6Addr, sport: u16, dst: Ipv6Addr, dport: u16) -> Self {
        Self {
            src: u128::from(src),
            dst: u128::from(dst),
            sport,
            dport,
            proto,
        }
    }

    /// The key of the same connection seen in the other direction.
    #[inline]
    pub fn reversed(&self) -> Self {
        Self {
            src: self.dst,
            dst: self.src,
            sport: self.dport,
            dport: self.sport,
            proto: self.proto,
        }
    }

    /// The key folded into two words, for hashing. Not injective; use it only
    /// as hash input and compare whole keys for equality.
    #[inline]
    pub fn words(&self) -> [u64; 2] {
        let s = (self.src as u64) ^ ((self.src >> 64) as u64).rotate_left(17);
        let d = (self.dst as u64) ^ ((self.dst >> 64) as u64).rotate_left(29);
        [
            s ^ d.rotate_left(32),
            (u64::from(self.sport) << 32) | (u64::from(self.dport) << 16) | u64::from(self.proto),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reverse_is_involution_and_icmp_id_survives() {
        let k = FlowKey4::new(
            proto::ICMP,
            Ipv4Addr::new(10, 0, 0, 1),
            7,
            Ipv4Addr::new(8, 8, 8, 8),
            7,
        );
        assert_eq!(k.reversed().reversed(), k);
        assert_eq!(k.reversed().sport, 7);
        assert_eq!(k.reversed().src_addr(), Ipv4Addr::new(8, 8, 8, 8));
    }

    #[test]
    fn words_are_injective_on_fields() {
        let a = FlowKey4 {
            src: 1,
            dst: 2,
            sport: 3,
            dport: 4,
            proto: 17,
        };
        let b = FlowKey4 {
            src: 1,
            dst: 2,
            sport: 4,
            dport: 3,
            proto: 17,
        };
        assert_ne!(a.words(), b.words());
    }
}
