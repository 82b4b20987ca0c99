//! The internet checksum.
//!
//! * RFC 1071: the 16-bit ones'-complement sum of the data, complemented.
//!   [`sum`] adds big-endian 64-bit words with end-around carry, which is
//!   equal to the 16-bit sum modulo `0xffff` because 2^16 ≡ 1 (RFC 1071 §2(B),
//!   "byte order independence" and "parallel summation").
//! * Pseudo-header sums for TCP/UDP/ICMPv6 over IPv4 (RFC 9293 §3.1, RFC 768)
//!   and IPv6 (RFC 8200 §8.1).
//! * RFC 1624 incremental update, eqn. 3: `HC' = ~(~HC + ~m + m')`, for 16-bit
//!   and 32-bit fields and for 128-bit IPv6 addresses. A NAT rewrite can
//!   precompute a [`Delta`] once per flow and apply it per packet.
//!
//! Sums are carried as `u64` ("unfolded") until [`fold`] reduces them to 16
//! bits. Any number of unfolded sums may be added with [`add`].

/// Add two unfolded sums with end-around carry.
#[inline(always)]
pub fn add(a: u64, b: u64) -> u64 {
    let (s, c) = a.overflowing_add(b);
    s + u64::from(c)
}

/// The unfolded ones'-complement sum of `data`, taken as big-endian 16-bit
/// words; an odd trailing byte is padded with zero on the right (RFC 1071
/// §4.1). To sum a message in pieces, every piece but the last must have an
/// even length.
#[inline]
pub fn sum(data: &[u8]) -> u64 {
    let mut acc: u64 = 0;
    let mut chunks = data.chunks_exact(32);
    for c in &mut chunks {
        // Four independent words per step; the compiler keeps the carries in
        // flags. `chunks_exact` guarantees the lengths, so no bounds checks.
        let mut w = [0u64; 4];
        for (i, slot) in w.iter_mut().enumerate() {
            let mut b = [0u8; 8];
            b.copy_from_slice(&c[i * 8..i * 8 + 8]);
            *slot = u64::from_be_bytes(b);
        }
        acc = add(acc, add(add(w[0], w[1]), add(w[2], w[3])));
    }
    let rest = chunks.remainder();
    let mut words = rest.chunks_exact(8);
    for c in &mut words {
        let mut b = [0u8; 8];
        b.copy_from_slice(c);
        acc = add(acc, u64::from_be_bytes(b));
    }
    let tail = words.remainder();
    if !tail.is_empty() {
        let mut b = [0u8; 8];
        b[..tail.len()].copy_from_slice(tail);
        acc = add(acc, u64::from_be_bytes(b));
    }
    acc
}

/// Reduce an unfolded sum to 16 bits (ones'-complement addition of its four
/// 16-bit lanes). The result is never `0` unless the input is `0`.
#[inline(always)]
pub fn fold(s: u64) -> u16 {
    let (lo, c) = (s as u32).overflowing_add((s >> 32) as u32);
    let s = lo + u32::from(c);
    let (lo, c) = (s as u16).overflowing_add((s >> 16) as u16);
    lo + u16::from(c)
}

/// Complement a folded sum into the value to store in a checksum field.
#[inline(always)]
pub fn finish(s: u64) -> u16 {
    !fold(s)
}

/// The RFC 1071 checksum of `data` (the checksum field itself must be zero,
/// or excluded, when computing; see [`verify`] for checking).
#[inline]
pub fn checksum(data: &[u8]) -> u16 {
    finish(sum(data))
}

/// Whether `data`, checksum field included, sums to `0xffff` (RFC 1071 §1:
/// "the result is checked by summing ... all 1 bits").
#[inline]
pub fn verify(data: &[u8]) -> bool {
    fold(sum(data)) == 0xffff
}

/// Unfolded sum of the IPv4 pseudo-header: source, destination, zero,
/// protocol, and upper-layer length (RFC 9293 §3.1, RFC 768).
#[inline(always)]
pub fn pseudo_v4(src: u32, dst: u32, proto: u8, len: u16) -> u64 {
    u64::from(src) + u64::from(dst) + u64::from(proto) + u64::from(len)
}

/// Unfolded sum of the IPv6 pseudo-header: source, destination, 32-bit
/// upper-layer length, zero, next header (RFC 8200 §8.1).
#[inline(always)]
pub fn pseudo_v6(src: u128, dst: u128, proto: u8, len: u32) -> u64 {
    let a = add(
        add(src as u64, (src >> 64) as u64),
        add(dst as u64, (dst >> 64) as u64),
    );
    add(a, u64::from(len) + u64::from(proto))
}

/// A precomputed checksum adjustment: the sum of `~m + m'` over every field
/// that a rewrite changes (RFC 1624 eqn. 3). Build it once per flow with the
/// `with_*` methods and apply it per packet with [`Delta::apply`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Delta(u64);

impl Delta {
    /// No change.
    pub const ZERO: Delta = Delta(0);

    /// Account for a 16-bit field changing from `old` to `new`.
    #[inline]
    pub const fn with16(self, old: u16, new: u16) -> Delta {
        Delta(self.0 + (!old) as u64 + new as u64)
    }

    /// Account for a 32-bit field (e.g. an IPv4 address) changing.
    #[inline]
    pub const fn with32(self, old: u32, new: u32) -> Delta {
        self.with16((old >> 16) as u16, (new >> 16) as u16)
            .with16(old as u16, new as u16)
    }

    /// Account for a 128-bit field (an IPv6 address) changing.
    #[inline]
    pub const fn with128(self, old: u128, new: u128) -> Delta {
        self.with32((old >> 96) as u32, (new >> 96) as u32)
            .with32((old >> 64) as u32, (new >> 64) as u32)
            .with32((old >> 32) as u32, (new >> 32) as u32)
            .with32(old as u32, new as u32)
    }

    /// Combine two deltas (their rewrites both apply).
    #[inline]
    pub fn merge(self, other: Delta) -> Delta {
        Delta(add(self.0, other.0))
    }

    /// The delta folded to 16 bits (cheap to store per flow).
    #[inline]
    pub fn folded(self) -> u16 {
        fold(self.0)
    }

    /// Rebuild a delta from [`Delta::folded`].
    #[inline]
    pub const fn from_folded(v: u16) -> Delta {
        Delta(v as u64)
    }

    /// The new checksum: RFC 1624 eqn. 3, `HC' = ~(~HC + ~m + m')`.
    #[inline(always)]
    pub fn apply(self, hc: u16) -> u16 {
        !fold(add((!hc) as u64, self.0))
    }

    /// As [`Delta::apply`] for a UDP-over-IPv4 checksum: a zero checksum
    /// means "none" and stays zero, and a computed zero is sent as `0xffff`
    /// (RFC 768).
    #[inline(always)]
    pub fn apply_udp(self, hc: u16) -> u16 {
        if hc == 0 {
            return 0;
        }
        match self.apply(hc) {
            0 => 0xffff,
            v => v,
        }
    }
}

/// RFC 1624 eqn. 3 for one 16-bit field changing from `old` to `new`.
#[inline(always)]
pub fn update16(hc: u16, old: u16, new: u16) -> u16 {
    Delta::ZERO.with16(old, new).apply(hc)
}

/// RFC 1624 eqn. 3 for one 32-bit field changing from `old` to `new`.
#[inline(always)]
pub fn update32(hc: u16, old: u32, new: u32) -> u16 {
    Delta::ZERO.with32(old, new).apply(hc)
}

/// RFC 1624 eqn. 3 for one 128-bit field changing from `old` to `new`.
#[inline]
pub fn update128(hc: u16, old: u128, new: u128) -> u16 {
    Delta::ZERO.with128(old, new).apply(hc)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// RFC 1071 reference: 16-bit words, 32-bit accumulator, fold at the end.
    fn reference(data: &[u8]) -> u16 {
        let mut s: u32 = 0;
        let mut i = 0;
        while i + 1 < data.len() {
            s += u32::from(u16::from_be_bytes([data[i], data[i + 1]]));
            s = (s & 0xffff) + (s >> 16);
            i += 2;
        }
        if i < data.len() {
            s += u32::from(data[i]) << 8;
            s = (s & 0xffff) + (s >> 16);
        }
        while s >> 16 != 0 {
            s = (s & 0xffff) + (s >> 16);
        }
        !(s as u16)
    }

    /// Both 0x0000 and 0xffff are "zero" in ones' complement.
    fn same(a: u16, b: u16) -> bool {
        a == b || (a | b == 0xffff && a & b == 0)
    }

    #[test]
    fn rfc1071_example() {
        // RFC 1071 §3: bytes 00 01 f2 03 f4 f5 f6 f7 sum to ddf2.
        let d = [0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7];
        assert_eq!(fold(sum(&d)), 0xddf2);
        assert_eq!(checksum(&d), !0xddf2);
    }

    #[test]
    fn ipv4_header_known_checksum() {
        // A classic example header with checksum b861.
        let h = [
            0x45, 0x00, 0x00, 0x73, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0xb8, 0x61, 0xc0, 0xa8,
            0x00, 0x01, 0xc0, 0xa8, 0x00, 0xc7,
        ];
        assert!(verify(&h));
        let mut z = h;
        z[10] = 0;
        z[11] = 0;
        assert_eq!(checksum(&z), 0xb861);
    }

    #[test]
    fn pseudo_headers() {
        assert_eq!(fold(pseudo_v4(0xc0a8_0001, 0xc0a8_00c7, 17, 8)), {
            let b = [0xc0, 0xa8, 0, 1, 0xc0, 0xa8, 0, 0xc7, 0, 17, 0, 8];
            fold(sum(&b))
        });
        let src = 0x2001_0db8_0000_0000_0000_0000_0000_0001u128;
        let dst = 0xfe80_0000_0000_0000_0000_0000_dead_beefu128;
        let mut b = [0u8; 40];
        b[..16].copy_from_slice(&src.to_be_bytes());
        b[16..32].copy_from_slice(&dst.to_be_bytes());
        b[32..36].copy_from_slice(&70000u32.to_be_bytes());
        b[39] = 58;
        assert_eq!(fold(pseudo_v6(src, dst, 58, 70000)), fold(sum(&b)));
    }

    proptest! {
        #[test]
        fn sum_matches_reference(data in proptest::collection::vec(any::<u8>(), 0..300)) {
            prop_assert_eq!(checksum(&data), reference(&data));
        }

        #[test]
        fn split_sums_add(data in proptest::collection::vec(any::<u8>(), 0..300), cut in 0usize..150) {
            let cut = (cut * 2).min(data.len() & !1);
            let (a, b) = data.split_at(cut);
            prop_assert_eq!(fold(add(sum(a), sum(b))), fold(sum(&data)));
        }

        /// RFC 1624: incremental update equals full recomputation.
        #[test]
        fn incremental16_matches_full(
            mut data in proptest::collection::vec(any::<u8>(), 4..200),
            at in 0usize..100,
            new in any::<u16>(),
        ) {
            let n = data.len() / 2;
            let at = (at % (n - 1)) + 1; // word 0 holds the checksum
            data[0] = 0;
            data[1] = 0;
            let hc = checksum(&data);
            let old = u16::from_be_bytes([data[2 * at], data[2 * at + 1]]);
            data[2 * at..2 * at + 2].copy_from_slice(&new.to_be_bytes());
            let full = checksum(&data);
            let inc = update16(hc, old, new);
            prop_assert!(same(inc, full), "inc {inc:04x} full {full:04x}");
            data[..2].copy_from_slice(&inc.to_be_bytes());
            prop_assert!(verify(&data));
        }

        #[test]
        fn incremental32_and_delta_match_full(
            mut data in proptest::collection::vec(any::<u8>(), 12..200),
            a in 0usize..100, b in 0usize..100,
            na in any::<u32>(), nb in any::<u16>(),
        ) {
            data[0] = 0;
            data[1] = 0;
            let words = (data.len() - 2) / 4;
            let a = 2 + 4 * (a % words);
            let hc = checksum(&data);
            let oa = u32::from_be_bytes([data[a], data[a + 1], data[a + 2], data[a + 3]]);
            data[a..a + 4].copy_from_slice(&na.to_be_bytes());
            let one = update32(hc, oa, na);
            prop_assert!(same(one, checksum(&data)));
            // A second, 16-bit field, combined into one precomputed delta.
            let halfs = data.len() / 2 - 1;
            let b = 2 + 2 * (b % halfs);
            let ob = u16::from_be_bytes([data[b], data[b + 1]]);
            data[b..b + 2].copy_from_slice(&nb.to_be_bytes());
            let d = Delta::ZERO.with32(oa, na).merge(Delta::ZERO.with16(ob, nb));
            let full = checksum(&data);
            prop_assert!(same(d.apply(hc), full));
            prop_assert!(same(Delta::from_folded(d.folded()).apply(hc), full));
        }

        #[test]
        fn incremental128_matches_full(
            mut data in proptest::collection::vec(any::<u8>(), 40..80),
            new in any::<u128>(),
        ) {
            data[0] = 0;
            data[1] = 0;
            let hc = checksum(&data);
            let mut o = [0u8; 16];
            o.copy_from_slice(&data[8..24]);
            let old = u128::from_be_bytes(o);
            data[8..24].copy_from_slice(&new.to_be_bytes());
            prop_assert!(same(update128(hc, old, new), checksum(&data)));
        }
    }

    #[test]
    fn udp_zero_checksum_is_kept() {
        assert_eq!(Delta::ZERO.with16(1, 2).apply_udp(0), 0);
        // A result of zero is sent as 0xffff.
        let d = Delta::ZERO.with16(0, 0);
        assert_ne!(d.apply_udp(0xffff), 0);
    }
}
