//! Pseudorandom enumeration of port combinations (RFC 4814 §4.5, RFC 9693 §4.1).
//!
//! RFC 4814 asks testers to draw UDP/TCP ports pseudorandomly rather than
//! incrementing them, because a DUT that hashes ports can look much better on
//! sequential input than on real traffic. RFC 9693's preliminary phase
//! additionally needs every (source port, destination port) combination of the
//! restricted ranges exactly once, so that each test frame creates exactly one
//! new connection. A random *permutation* gives both properties.
//!
//! [`Permutation`] is a keyed 4-round Feistel network over the smallest even
//! power of two that covers the domain, with cycle walking to stay inside it.
//! It needs no memory and no allocation, so 40 M connections cost nothing to
//! enumerate.

/// A keyed bijection on `0..len`.
#[derive(Clone, Copy, Debug)]
pub struct Permutation {
    len: u64,
    half_bits: u32,
    keys: [u64; 4],
}

impl Permutation {
    /// A permutation of `0..len` selected by `seed`.
    pub fn new(len: u64, seed: u64) -> Self {
        let bits = 64 - len.saturating_sub(1).leading_zeros();
        let half_bits = bits.div_ceil(2).max(1);
        let mut s = seed;
        let mut keys = [0u64; 4];
        for k in &mut keys {
            s = splitmix64(s);
            *k = s;
        }
        Self {
            len,
            half_bits,
            keys,
        }
    }

    /// Number of elements.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// True when the domain is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The element at position `i` (`i < len`). Every value in `0..len`
    /// appears exactly once as `i` ranges over `0..len`.
    #[inline]
    pub fn at(&self, i: u64) -> u64 {
        let mut x = i;
        loop {
            x = self.feistel(x);
            if x < self.len {
                return x;
            }
        }
    }

    #[inline]
    fn feistel(&self, x: u64) -> u64 {
        let mask = (1u64 << self.half_bits) - 1;
        let mut l = x >> self.half_bits;
        let mut r = x & mask;
        for k in self.keys {
            let f = splitmix64(r ^ k) & mask;
            let nl = r;
            r = (l ^ f) & mask;
            l = nl;
        }
        (l << self.half_bits) | r
    }
}

/// SplitMix64 finaliser: a fast, well-mixed 64-bit hash.
#[inline]
pub fn splitmix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Restricted port ranges of RFC 9693 §4.1: the source range is the large one
/// (tens of thousands), the destination range the small one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PortRanges {
    /// First source port.
    pub sport_min: u16,
    /// Number of source ports.
    pub sports: u32,
    /// First destination port.
    pub dport_min: u16,
    /// Number of destination ports.
    pub dports: u32,
}

impl PortRanges {
    /// Ranges that give exactly `n` combinations, preferring the RFC's shape:
    /// a source range of at most `max_sports` ports and the smallest
    /// destination range that makes the product exact. Returns `None` when
    /// `n` cannot be expressed (e.g. a prime larger than `max_sports`).
    pub fn for_connections(n: u64, max_sports: u32) -> Option<Self> {
        if n == 0 {
            return None;
        }
        let mut dports = n.div_ceil(u64::from(max_sports)).max(1);
        while dports <= 60_000 {
            if n % dports == 0 {
                let sports = u32::try_from(n / dports).ok()?;
                if sports <= max_sports {
                    let dports = u32::try_from(dports).ok()?;
                    return Some(Self {
                        sport_min: 1024,
                        sports,
                        dport_min: 1,
                        dports,
                    });
                }
            }
            dports += 1;
        }
        None
    }

    /// Total number of combinations.
    pub fn combinations(&self) -> u64 {
        u64::from(self.sports) * u64::from(self.dports)
    }

    /// The (source, destination) port pair of combination `c`.
    #[inline]
    pub fn pair(&self, c: u64) -> (u16, u16) {
        let s = (c % u64::from(self.sports)) as u16;
        let d = (c / u64::from(self.sports)) as u16;
        (
            self.sport_min.wrapping_add(s),
            self.dport_min.wrapping_add(d),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn permutation_is_a_bijection() {
        for len in [1u64, 2, 3, 17, 1000, 4096, 65_537] {
            let p = Permutation::new(len, 42);
            let mut seen = vec![false; len as usize];
            for i in 0..len {
                let v = p.at(i) as usize;
                assert!(!seen[v], "value {v} twice for len {len}");
                seen[v] = true;
            }
            assert!(seen.iter().all(|&b| b));
        }
    }

    #[test]
    fn permutation_is_not_the_identity() {
        let p = Permutation::new(10_000, 7);
        let fixed = (0..10_000).filter(|&i| p.at(i) == i).count();
        assert!(fixed < 100, "{fixed} fixed points: not pseudorandom");
    }

    #[test]
    fn ranges_for_forty_million_follow_the_rfc_shape() {
        let r = PortRanges::for_connections(40_000_000, 50_000).unwrap();
        assert_eq!(r.combinations(), 40_000_000);
        assert!(r.sports <= 50_000 && r.dports <= 1000);
    }

    proptest! {
        #[test]
        fn pairs_cover_every_combination_once(sports in 1u32..50, dports in 1u32..50) {
            let r = PortRanges { sport_min: 1024, sports, dport_min: 1, dports };
            let mut seen = std::collections::HashSet::new();
            for c in 0..r.combinations() {
                prop_assert!(seen.insert(r.pair(c)));
            }
        }
    }
}
