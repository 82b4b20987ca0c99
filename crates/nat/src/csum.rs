//! Private incremental Internet checksum helpers (RFC 1624).
//!
//! `sluice-wire` owns the shared checksum code; this crate keeps its own
//! tiny copy so the NAT fast path depends on nothing but flow keys.

/// Fold a 32-bit one's complement sum to 16 bits with end-around carry.
/// A nonzero input never folds to zero.
#[inline]
pub(crate) const fn fold(s: u32) -> u16 {
    // Two end-around carries fold any u32: after the first the sum is at
    // most 0xffff + 0xffff = 0x1fffe, after the second at most 0xffff.
    // Branch-free, unlike a loop.
    let s = (s & 0xffff) + (s >> 16);
    let s = (s & 0xffff) + (s >> 16);
    s as u16
}

/// Sum of `~m + m'` over every changed 16-bit word `m -> m'`
/// (RFC 1624 eqn 3: `HC' = ~(~HC + ~m + m')`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Delta(u32);

impl Delta {
    /// Account for one 16-bit word changing from `old` to `new`.
    #[inline]
    pub(crate) fn word(&mut self, old: u16, new: u16) {
        self.0 = u32::from(fold(self.0 + u32::from(!old) + u32::from(new)));
    }

    /// Account for one 32-bit field (two words) changing.
    #[inline]
    pub(crate) fn addr(&mut self, old: u32, new: u32) {
        self.word((old >> 16) as u16, (new >> 16) as u16);
        self.word(old as u16, new as u16);
    }

    /// Add another delta.
    #[inline]
    pub(crate) fn add(&mut self, other: u16) {
        self.0 = u32::from(fold(self.0 + u32::from(other)));
    }

    /// The folded delta.
    #[inline]
    pub(crate) const fn value(self) -> u16 {
        self.0 as u16
    }
}

/// Apply a folded delta to checksum `csum` (RFC 1624 eqn 3).
///
/// If `csum` was produced by a full computation (RFC 1071) over the old
/// data, the result equals a full computation over the new data: the sum
/// folds to a nonzero value, so the result is never `0xffff`.
#[inline]
pub(crate) const fn adjust(csum: u16, delta: u16) -> u16 {
    !fold(!csum as u32 + delta as u32)
}

#[inline]
pub(crate) fn rd16(b: &[u8], off: usize) -> Option<u16> {
    let s = b.get(off..off.checked_add(2)?)?;
    Some(u16::from_be_bytes([*s.first()?, *s.get(1)?]))
}

#[inline]
pub(crate) fn rd32(b: &[u8], off: usize) -> Option<u32> {
    let s = b.get(off..off.checked_add(4)?)?;
    let mut a = [0u8; 4];
    a.copy_from_slice(s);
    Some(u32::from_be_bytes(a))
}

#[inline]
pub(crate) fn wr16(b: &mut [u8], off: usize, v: u16) -> Option<()> {
    b.get_mut(off..off.checked_add(2)?)?
        .copy_from_slice(&v.to_be_bytes());
    Some(())
}

#[inline]
pub(crate) fn wr32(b: &mut [u8], off: usize, v: u32) -> Option<()> {
    b.get_mut(off..off.checked_add(4)?)?
        .copy_from_slice(&v.to_be_bytes());
    Some(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc1624_example() {
        // RFC 1624 section 4: HC = 0xdd2f, m = 0x5555 -> m' = 0x3285,
        // expected HC' = 0x0000.
        let mut d = Delta::default();
        d.word(0x5555, 0x3285);
        assert_eq!(adjust(0xdd2f, d.value()), 0x0000);
    }

    #[test]
    fn bounds_checked_access() {
        let mut b = [0u8; 3];
        assert_eq!(rd16(&b, 2), None);
        assert_eq!(wr32(&mut b, 0, 1), None);
        assert_eq!(rd16(&b, usize::MAX), None);
        assert_eq!(wr16(&mut b, 1, 0xabcd), Some(()));
        assert_eq!(b, [0, 0xab, 0xcd]);
    }
}
