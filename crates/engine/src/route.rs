//! IPv4 and IPv6 routing (longest-prefix match) and adjacencies.
//!
//! Routing is a slow-path operation: it runs once per new connection, and the
//! result (an adjacency index) is cached in the conntrack entry for each
//! direction, so established traffic never looks a route up. An adjacency is
//! what a frame needs to leave: the egress interface and both MAC addresses
//! (VPP's "adjacency"). Updating a neighbour rewrites its adjacency in place,
//! so cached indices stay valid.

use core::net::{Ipv4Addr, Ipv6Addr};

/// Index of an interface in the engine's interface table.
pub type IfIndex = u16;
/// Index of an adjacency.
pub type AdjIndex = u16;

/// One IPv4 route.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Route4 {
    /// Network address (host bits zero).
    pub net: u32,
    /// Prefix length, 0..=32.
    pub len: u8,
    /// Egress interface.
    pub oif: IfIndex,
    /// Next hop; `None` for a connected route (the destination is on-link).
    pub via: Option<Ipv4Addr>,
}

/// Longest-prefix-match table: one sorted run per prefix length, probed from
/// /32 down. At most 33 binary searches per lookup, independent of the number
/// of routes in any one length.
#[derive(Clone, Debug, Default)]
pub struct RouteTable4 {
    by_len: Vec<Vec<Route4>>,
    /// Bit `len` is set when `by_len[len]` holds a route, so a lookup
    /// visits only the prefix lengths in use, longest first.
    lens: u64,
}

/// Mask for a prefix length.
#[inline]
pub fn mask(len: u8) -> u32 {
    if len == 0 {
        0
    } else {
        u32::MAX << (32 - u32::from(len.min(32)))
    }
}

impl RouteTable4 {
    /// An empty table.
    pub fn new() -> Self {
        Self {
            by_len: vec![Vec::new(); 33],
            lens: 0,
        }
    }

    /// Add or replace the route for `net/len`.
    pub fn add(&mut self, mut r: Route4) {
        if self.by_len.len() != 33 {
            self.by_len = vec![Vec::new(); 33];
        }
        r.len = r.len.min(32);
        r.net &= mask(r.len);
        let Some(v) = self.by_len.get_mut(usize::from(r.len)) else {
            return;
        };
        match v.binary_search_by_key(&r.net, |x| x.net) {
            Ok(i) => {
                if let Some(slot) = v.get_mut(i) {
                    *slot = r;
                }
            }
            Err(i) => v.insert(i, r),
        }
        self.lens |= 1 << r.len;
    }

    /// The most specific route covering `dst`.
    pub fn lookup(&self, dst: u32) -> Option<&Route4> {
        let mut lens = self.lens;
        while lens != 0 {
            let len = 63 - lens.leading_zeros() as usize;
            lens &= !(1 << len);
            let v = self.by_len.get(len)?;
            let key = dst & mask(len as u8);
            if let Ok(i) = v.binary_search_by_key(&key, |x| x.net) {
                return v.get(i);
            }
        }
        None
    }

    /// All routes, most specific first.
    pub fn iter(&self) -> impl Iterator<Item = &Route4> {
        self.by_len.iter().rev().flatten()
    }
}

/// One IPv6 route.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Route6 {
    /// Network address (host bits zero).
    pub net: u128,
    /// Prefix length, 0..=128.
    pub len: u8,
    /// Egress interface.
    pub oif: IfIndex,
    /// Next hop (often the router's link-local address, RFC 4861 §8);
    /// `None` for a connected route.
    pub via: Option<Ipv6Addr>,
}

/// Mask for an IPv6 prefix length.
#[inline]
pub fn mask6(len: u8) -> u128 {
    if len == 0 {
        0
    } else {
        u128::MAX << (128 - u32::from(len.min(128)))
    }
}

/// IPv6 longest-prefix-match table, built like [`RouteTable4`]: one sorted
/// run per prefix length, probed longest first, skipping unused lengths.
#[derive(Clone, Debug, Default)]
pub struct RouteTable6 {
    by_len: Vec<Vec<Route6>>,
    /// Bit `len % 64` of word `len / 64` is set when `by_len[len]` is used.
    lens: [u64; 3],
}

impl RouteTable6 {
    /// An empty table.
    pub fn new() -> Self {
        Self {
            by_len: vec![Vec::new(); 129],
            lens: [0; 3],
        }
    }

    /// Add or replace the route for `net/len`.
    pub fn add(&mut self, mut r: Route6) {
        if self.by_len.len() != 129 {
            self.by_len = vec![Vec::new(); 129];
        }
        r.len = r.len.min(128);
        r.net &= mask6(r.len);
        let Some(v) = self.by_len.get_mut(usize::from(r.len)) else {
            return;
        };
        match v.binary_search_by_key(&r.net, |x| x.net) {
            Ok(i) => {
                if let Some(slot) = v.get_mut(i) {
                    *slot = r;
                }
            }
            Err(i) => v.insert(i, r),
        }
        if let Some(w) = self.lens.get_mut(usize::from(r.len / 64)) {
            *w |= 1 << (r.len % 64);
        }
    }

    /// The most specific route covering `dst`.
    pub fn lookup(&self, dst: u128) -> Option<&Route6> {
        for wi in (0..3usize).rev() {
            let mut w = self.lens.get(wi).copied().unwrap_or(0);
            while w != 0 {
                let bit = 63 - w.leading_zeros() as usize;
                w &= !(1 << bit);
                let len = wi * 64 + bit;
                let Some(v) = self.by_len.get(len) else {
                    continue;
                };
                let key = dst & mask6(len as u8);
                if let Ok(i) = v.binary_search_by_key(&key, |x| x.net) {
                    return v.get(i);
                }
            }
        }
        None
    }

    /// All routes, most specific first.
    pub fn iter(&self) -> impl Iterator<Item = &Route6> {
        self.by_len.iter().rev().flatten()
    }
}

/// What a frame needs to leave through an interface.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Adjacency {
    /// Egress interface.
    pub oif: IfIndex,
    /// Source MAC (the egress interface's).
    pub src_mac: [u8; 6],
    /// Destination MAC (the next hop's); all zero while unresolved.
    pub dst_mac: [u8; 6],
    /// Whether `dst_mac` is known.
    pub resolved: bool,
    /// IP MTU of the egress interface (largest IPv4 total length it sends),
    /// copied here so the fast path checks it without another lookup.
    pub mtu: u16,
}

impl Adjacency {
    /// Address the Ethernet frame in `buf` to the next hop: destination and
    /// source MAC (a frame shorter than 12 bytes is left alone).
    #[inline(always)]
    pub fn write_macs(&self, buf: &mut [u8]) {
        if let Some(m) = buf.get_mut(0..12) {
            m[..6].copy_from_slice(&self.dst_mac);
            m[6..].copy_from_slice(&self.src_mac);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(net: [u8; 4], len: u8, oif: u16) -> Route4 {
        Route4 {
            net: u32::from(Ipv4Addr::from(net)),
            len,
            oif,
            via: None,
        }
    }

    #[test]
    fn longest_prefix_wins_and_default_catches_the_rest() {
        let mut t = RouteTable4::new();
        t.add(r([0, 0, 0, 0], 0, 9));
        t.add(r([10, 0, 0, 0], 8, 1));
        t.add(r([10, 1, 0, 0], 16, 2));
        t.add(r([10, 1, 2, 3], 32, 3));
        let l = |a: [u8; 4]| t.lookup(u32::from(Ipv4Addr::from(a))).map(|r| r.oif);
        assert_eq!(l([10, 1, 2, 3]), Some(3));
        assert_eq!(l([10, 1, 2, 4]), Some(2));
        assert_eq!(l([10, 2, 0, 1]), Some(1));
        assert_eq!(l([192, 0, 2, 1]), Some(9));
    }

    fn r6(net: &str, len: u8, oif: u16) -> Route6 {
        Route6 {
            net: u128::from(net.parse::<Ipv6Addr>().unwrap()),
            len,
            oif,
            via: None,
        }
    }

    #[test]
    fn v6_longest_prefix_wins_across_all_length_words() {
        let mut t = RouteTable6::new();
        let l = |t: &RouteTable6, a: &str| {
            t.lookup(u128::from(a.parse::<Ipv6Addr>().unwrap()))
                .map(|r| r.oif)
        };
        assert_eq!(l(&t, "2001:db8::1"), None);
        t.add(r6("::", 0, 9));
        t.add(r6("2001:db8::", 32, 1));
        t.add(r6("2001:db8:1::", 48, 2));
        t.add(r6("2001:db8:1:2::", 64, 3));
        t.add(r6("2001:db8:1:2::80", 121, 4));
        t.add(r6("2001:db8:1:2::81", 128, 5));
        assert_eq!(l(&t, "2001:db8:1:2::81"), Some(5));
        assert_eq!(l(&t, "2001:db8:1:2::82"), Some(4));
        assert_eq!(l(&t, "2001:db8:1:2::1"), Some(3));
        assert_eq!(l(&t, "2001:db8:1:3::1"), Some(2));
        assert_eq!(l(&t, "2001:db8:2::1"), Some(1));
        assert_eq!(l(&t, "fd00::1"), Some(9));
        // Host bits are cleared and a second add replaces.
        t.add(r6("2001:db8:1:2::1", 64, 7));
        assert_eq!(l(&t, "2001:db8:1:2::1"), Some(7));
        assert_eq!(t.iter().count(), 6);
        assert_eq!(mask6(0), 0);
        assert_eq!(mask6(128), u128::MAX);
        assert_eq!(mask6(200), u128::MAX);
    }

    #[test]
    fn replacing_a_route_keeps_one_entry_and_host_bits_are_cleared() {
        let mut t = RouteTable4::new();
        t.add(r([10, 0, 0, 7], 8, 1));
        t.add(r([10, 0, 0, 0], 8, 2));
        assert_eq!(t.iter().count(), 1);
        assert_eq!(
            t.lookup(u32::from(Ipv4Addr::new(10, 9, 9, 9)))
                .map(|r| r.oif),
            Some(2)
        );
        assert!(RouteTable4::new().lookup(1).is_none());
    }
}
