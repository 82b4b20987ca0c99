//! TCP segment headers (RFC 9293 §3.1).

use crate::checksum;
use crate::ip::IpPair;
use crate::{EmitError, ParseError, Result};

mod field {
    pub type Field = core::ops::Range<usize>;
    pub const SRC_PORT: Field = 0..2;
    pub const DST_PORT: Field = 2..4;
    pub const SEQ_NUM: Field = 4..8;
    pub const ACK_NUM: Field = 8..12;
    pub const DATA_OFF: usize = 12;
    pub const FLAGS: usize = 13;
    pub const WIN_SIZE: Field = 14..16;
    pub const CHECKSUM: Field = 16..18;
    pub const URGENT: Field = 18..20;
}

/// Length of a TCP header without options.
pub const HEADER_LEN: usize = field::URGENT.end;
/// Longest TCP header (data offset 15).
pub const MAX_HEADER_LEN: usize = 60;

/// TCP control bits (RFC 9293 §3.1, RFC 3168 for ECE/CWR).
pub mod flags {
    /// No more data from sender.
    pub const FIN: u8 = 0x01;
    /// Synchronize sequence numbers.
    pub const SYN: u8 = 0x02;
    /// Reset the connection.
    pub const RST: u8 = 0x04;
    /// Push function.
    pub const PSH: u8 = 0x08;
    /// Acknowledgment field is significant.
    pub const ACK: u8 = 0x10;
    /// Urgent pointer field is significant.
    pub const URG: u8 = 0x20;
    /// ECN echo.
    pub const ECE: u8 = 0x40;
    /// Congestion window reduced.
    pub const CWR: u8 = 0x80;
}

fn arr<const N: usize>(b: &[u8]) -> [u8; N] {
    let mut o = [0u8; N];
    o.copy_from_slice(b);
    o
}

/// A read/write view of a TCP segment.
#[derive(Debug, Clone)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wrap a buffer without checking its length.
    pub const fn new_unchecked(buffer: T) -> Packet<T> {
        Packet { buffer }
    }

    /// Wrap a buffer and check it with [`Packet::check_len`].
    pub fn new_checked(buffer: T) -> Result<Packet<T>> {
        let p = Self::new_unchecked(buffer);
        p.check_len()?;
        Ok(p)
    }

    /// Ensure no getter will panic: the fixed header fits and
    /// `20 ≤ data offset × 4 ≤ buffer`. The buffer is the whole segment.
    pub fn check_len(&self) -> Result<()> {
        let len = self.buffer.as_ref().len();
        if len < HEADER_LEN {
            return Err(ParseError::Truncated);
        }
        let hl = usize::from(self.header_len());
        if hl < HEADER_LEN || hl > len {
            return Err(ParseError::TcpDataOffset);
        }
        Ok(())
    }

    /// Unwrap the buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// Source port.
    pub fn src_port(&self) -> u16 {
        u16::from_be_bytes(arr(&self.buffer.as_ref()[field::SRC_PORT]))
    }
    /// Destination port.
    pub fn dst_port(&self) -> u16 {
        u16::from_be_bytes(arr(&self.buffer.as_ref()[field::DST_PORT]))
    }
    /// Sequence number.
    pub fn seq_number(&self) -> u32 {
        u32::from_be_bytes(arr(&self.buffer.as_ref()[field::SEQ_NUM]))
    }
    /// Acknowledgment number.
    pub fn ack_number(&self) -> u32 {
        u32::from_be_bytes(arr(&self.buffer.as_ref()[field::ACK_NUM]))
    }
    /// Header length in bytes (data offset × 4).
    pub fn header_len(&self) -> u8 {
        (self.buffer.as_ref()[field::DATA_OFF] >> 4) * 4
    }
    /// The eight control bits (see [`flags`]).
    pub fn flags(&self) -> u8 {
        self.buffer.as_ref()[field::FLAGS]
    }
    /// SYN set.
    pub fn syn(&self) -> bool {
        self.flags() & flags::SYN != 0
    }
    /// ACK set.
    pub fn ack(&self) -> bool {
        self.flags() & flags::ACK != 0
    }
    /// FIN set.
    pub fn fin(&self) -> bool {
        self.flags() & flags::FIN != 0
    }
    /// RST set.
    pub fn rst(&self) -> bool {
        self.flags() & flags::RST != 0
    }
    /// Window size.
    pub fn window_len(&self) -> u16 {
        u16::from_be_bytes(arr(&self.buffer.as_ref()[field::WIN_SIZE]))
    }
    /// Checksum field.
    pub fn checksum(&self) -> u16 {
        u16::from_be_bytes(arr(&self.buffer.as_ref()[field::CHECKSUM]))
    }
    /// Urgent pointer.
    pub fn urgent_at(&self) -> u16 {
        u16::from_be_bytes(arr(&self.buffer.as_ref()[field::URGENT]))
    }
    /// Length of the options area in bytes.
    pub fn options_len(&self) -> usize {
        usize::from(self.header_len()).saturating_sub(HEADER_LEN)
    }
    /// The options area (empty if out of range).
    pub fn options(&self) -> &[u8] {
        let hl = usize::from(self.header_len());
        self.buffer.as_ref().get(HEADER_LEN..hl).unwrap_or(&[])
    }
    /// The payload (empty if out of range).
    pub fn payload(&self) -> &[u8] {
        self.buffer
            .as_ref()
            .get(usize::from(self.header_len())..)
            .unwrap_or(&[])
    }
    /// Whether the checksum over the whole buffer verifies.
    pub fn verify_checksum(&self, ip: &IpPair) -> bool {
        let d = self.buffer.as_ref();
        let Ok(len) = u32::try_from(d.len()) else {
            return false;
        };
        checksum::fold(checksum::add(ip.pseudo_sum(6, len), checksum::sum(d))) == 0xffff
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Set source port.
    pub fn set_src_port(&mut self, v: u16) {
        self.buffer.as_mut()[field::SRC_PORT].copy_from_slice(&v.to_be_bytes());
    }
    /// Set destination port.
    pub fn set_dst_port(&mut self, v: u16) {
        self.buffer.as_mut()[field::DST_PORT].copy_from_slice(&v.to_be_bytes());
    }
    /// Set sequence number.
    pub fn set_seq_number(&mut self, v: u32) {
        self.buffer.as_mut()[field::SEQ_NUM].copy_from_slice(&v.to_be_bytes());
    }
    /// Set acknowledgment number.
    pub fn set_ack_number(&mut self, v: u32) {
        self.buffer.as_mut()[field::ACK_NUM].copy_from_slice(&v.to_be_bytes());
    }
    /// Set header length in bytes (multiple of 4, 20..=60); clears the
    /// reserved bits.
    pub fn set_header_len(&mut self, len: u8) {
        self.buffer.as_mut()[field::DATA_OFF] = (len / 4) << 4;
    }
    /// Set the control bits.
    pub fn set_flags(&mut self, f: u8) {
        self.buffer.as_mut()[field::FLAGS] = f;
    }
    /// Set window size.
    pub fn set_window_len(&mut self, v: u16) {
        self.buffer.as_mut()[field::WIN_SIZE].copy_from_slice(&v.to_be_bytes());
    }
    /// Set checksum field.
    pub fn set_checksum(&mut self, v: u16) {
        self.buffer.as_mut()[field::CHECKSUM].copy_from_slice(&v.to_be_bytes());
    }
    /// Set urgent pointer.
    pub fn set_urgent_at(&mut self, v: u16) {
        self.buffer.as_mut()[field::URGENT].copy_from_slice(&v.to_be_bytes());
    }
    /// Compute the checksum over the whole buffer (header and payload) with
    /// the pseudo-header (RFC 9293 §3.1).
    pub fn fill_checksum(&mut self, ip: &IpPair) {
        self.set_checksum(0);
        let d = self.buffer.as_ref();
        let len = u32::try_from(d.len()).unwrap_or(u32::MAX);
        let c = checksum::finish(checksum::add(ip.pseudo_sum(6, len), checksum::sum(d)));
        self.set_checksum(c);
    }
    /// Mutable options area.
    pub fn options_mut(&mut self) -> &mut [u8] {
        let hl = usize::from(self.header_len());
        self.buffer
            .as_mut()
            .get_mut(HEADER_LEN..hl)
            .unwrap_or(&mut [])
    }
    /// Mutable payload.
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let hl = usize::from(self.header_len());
        self.buffer.as_mut().get_mut(hl..).unwrap_or(&mut [])
    }
}

/// A TCP header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TcpRepr<'a> {
    /// Source port.
    pub src_port: u16,
    /// Destination port.
    pub dst_port: u16,
    /// Sequence number.
    pub seq_number: u32,
    /// Acknowledgment number.
    pub ack_number: u32,
    /// Control bits (see [`flags`]).
    pub flags: u8,
    /// Window size.
    pub window_len: u16,
    /// Urgent pointer.
    pub urgent_at: u16,
    /// Raw options, a multiple of 4 bytes, at most 40.
    pub options: &'a [u8],
    /// Payload length.
    pub payload_len: usize,
}

impl<'a> TcpRepr<'a> {
    /// Parse a whole segment; if `ip` is given, the checksum must verify.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(
        p: &Packet<&'a T>,
        ip: Option<&IpPair>,
    ) -> Result<TcpRepr<'a>> {
        p.check_len()?;
        if let Some(ip) = ip {
            if !p.verify_checksum(ip) {
                return Err(ParseError::Checksum);
            }
        }
        let t: &'a T = p.buffer;
        let b: &'a [u8] = t.as_ref();
        let hl = usize::from(p.header_len());
        Ok(TcpRepr {
            src_port: p.src_port(),
            dst_port: p.dst_port(),
            seq_number: p.seq_number(),
            ack_number: p.ack_number(),
            flags: p.flags(),
            window_len: p.window_len(),
            urgent_at: p.urgent_at(),
            options: b.get(HEADER_LEN..hl).unwrap_or(&[]),
            payload_len: b.len() - hl,
        })
    }

    /// Header length, options included.
    pub fn buffer_len(&self) -> usize {
        HEADER_LEN + self.options.len()
    }

    /// Write the header and options. The payload must already be in place
    /// after them: the buffer is taken to be exactly the segment
    /// (`buffer_len() + payload_len` bytes), and with `ip` given, the checksum
    /// is computed over it.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(
        &self,
        p: &mut Packet<T>,
        ip: Option<&IpPair>,
    ) -> core::result::Result<(), EmitError> {
        if self.options.len() % 4 != 0 || self.options.len() > MAX_HEADER_LEN - HEADER_LEN {
            return Err(EmitError::OptionsLen);
        }
        if p.buffer.as_ref().len() < self.buffer_len() + self.payload_len {
            return Err(EmitError::BufferTooSmall);
        }
        p.set_src_port(self.src_port);
        p.set_dst_port(self.dst_port);
        p.set_seq_number(self.seq_number);
        p.set_ack_number(self.ack_number);
        p.set_header_len(self.buffer_len() as u8);
        p.set_flags(self.flags);
        p.set_window_len(self.window_len);
        p.set_urgent_at(self.urgent_at);
        p.options_mut().copy_from_slice(self.options);
        match ip {
            Some(ip) => p.fill_checksum(ip),
            None => p.set_checksum(0),
        }
        Ok(())
    }
}

/// TCP option kind of the maximum segment size (RFC 9293 §3.2).
pub const OPT_MSS: u8 = 2;

/// Lowers the MSS option of the TCP segment `seg` (its header first, as
/// much of the segment as the buffer holds) to `limit` when it is larger,
/// and updates the checksum (RFC 1624; the option's value may sit at an
/// odd offset, so the update covers the two aligned 16-bit words around
/// it). Never raises the MSS and never adds the option (the kernel's
/// `nft_exthdr` and `xt_TCPMSS`, except that the latter adds one). Returns
/// the old value when it changed something. A malformed option list is
/// left alone.
pub fn clamp_mss(seg: &mut [u8], limit: u16) -> Option<u16> {
    let hl = usize::from(*seg.get(field::DATA_OFF)? >> 4) * 4;
    if hl < HEADER_LEN || hl > seg.len() {
        return None;
    }
    let mut at = HEADER_LEN;
    while at < hl {
        match *seg.get(at)? {
            0 => return None,
            1 => at += 1,
            kind => {
                let olen = usize::from(*seg.get(at + 1)?);
                if olen < 2 || at + olen > hl {
                    return None;
                }
                if kind == OPT_MSS && olen == 4 {
                    let v = at + 2;
                    let old = u16::from_be_bytes([*seg.get(v)?, *seg.get(v + 1)?]);
                    if old <= limit {
                        return None;
                    }
                    // The aligned 32-bit span that holds the value.
                    let w = v & !1;
                    let span = w..w + 4;
                    let before = u32::from_be_bytes(seg.get(span.clone())?.try_into().ok()?);
                    seg.get_mut(v..v + 2)?.copy_from_slice(&limit.to_be_bytes());
                    let after = u32::from_be_bytes(seg.get(span)?.try_into().ok()?);
                    let c = u16::from_be_bytes([
                        *seg.get(field::CHECKSUM.start)?,
                        *seg.get(field::CHECKSUM.start + 1)?,
                    ]);
                    let c = checksum::update32(c, before, after);
                    seg.get_mut(field::CHECKSUM)?
                        .copy_from_slice(&c.to_be_bytes());
                    return Some(old);
                }
                at += olen;
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    const IP: IpPair = IpPair::V4 {
        src: 0x0a00_0001,
        dst: 0x0a00_0002,
    };

    /// SYN 40000 -> 80 with MSS 1460 and two NOPs + SACK-permitted.
    static SYN: [u8; 28] = [
        0x9c, 0x40, 0x00, 0x50, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x70, 0x02, 0xff,
        0xff, 0x00, 0x00, 0x00, 0x00, // header, data offset 7
        0x02, 0x04, 0x05, 0xb4, 0x01, 0x01, 0x04, 0x02, // options
    ];

    #[test]
    fn getters() {
        let p = Packet::new_checked(&SYN[..]).unwrap();
        assert_eq!((p.src_port(), p.dst_port()), (40000, 80));
        assert_eq!(p.header_len(), 28);
        assert_eq!(p.options_len(), 8);
        assert!(p.syn() && !p.ack() && !p.fin() && !p.rst());
        assert_eq!(p.flags(), flags::SYN);
        assert!(p.payload().is_empty());
    }

    #[test]
    fn roundtrip_with_checksum() {
        let mut b = SYN;
        let r = TcpRepr::parse(&Packet::new_checked(&SYN[..]).unwrap(), None).unwrap();
        assert_eq!(r.options.len(), 8);
        r.emit(&mut Packet::new_unchecked(&mut b[..]), Some(&IP))
            .unwrap();
        let p = Packet::new_checked(&b[..]).unwrap();
        assert!(p.verify_checksum(&IP));
        assert_eq!(TcpRepr::parse(&p, Some(&IP)).unwrap(), r);
        b[0] ^= 1;
        let p = Packet::new_checked(&b[..]).unwrap();
        assert_eq!(TcpRepr::parse(&p, Some(&IP)), Err(ParseError::Checksum));
    }

    #[test]
    fn data_offset_errors() {
        let mut b = SYN;
        b[12] = 0x40;
        assert_eq!(
            Packet::new_checked(&b[..]).err(),
            Some(ParseError::TcpDataOffset)
        );
        b[12] = 0x80;
        assert_eq!(
            Packet::new_checked(&b[..]).err(),
            Some(ParseError::TcpDataOffset)
        );
        assert_eq!(
            Packet::new_checked(&b[..19]).err(),
            Some(ParseError::Truncated)
        );
        let r = TcpRepr {
            options: &[1, 2, 3],
            ..TcpRepr::parse(&Packet::new_unchecked(&SYN[..]), None).unwrap()
        };
        assert_eq!(
            r.emit(&mut Packet::new_unchecked(&mut b[..]), None),
            Err(EmitError::OptionsLen)
        );
    }

    /// A SYN with `opts`, its checksum valid between 10.0.0.2 and 10.0.0.1.
    fn syn_with(opts: &[u8]) -> Vec<u8> {
        let hl = HEADER_LEN + opts.len();
        let mut seg = vec![0u8; hl + 3];
        seg[0..2].copy_from_slice(&1234u16.to_be_bytes());
        seg[2..4].copy_from_slice(&80u16.to_be_bytes());
        seg[12] = ((hl / 4) as u8) << 4;
        seg[13] = flags::SYN;
        seg[HEADER_LEN..hl].copy_from_slice(opts);
        seg[hl..].copy_from_slice(b"abc");
        let pair = IpPair::V4 {
            src: 0x0a00_0002,
            dst: 0x0a00_0001,
        };
        let c = checksum::finish(checksum::add(
            pair.pseudo_sum(6, seg.len() as u32),
            checksum::sum(&seg),
        ));
        seg[16..18].copy_from_slice(&c.to_be_bytes());
        assert!(Packet::new_unchecked(&seg[..]).verify_checksum(&pair));
        seg
    }

    #[test]
    fn clamp_mss_lowers_never_raises_and_keeps_the_checksum() {
        let pair = IpPair::V4 {
            src: 0x0a00_0002,
            dst: 0x0a00_0001,
        };
        // MSS first (aligned), after one NOP (odd offset), after SACK-permitted.
        for opts in [
            &[2, 4, 0x05, 0xb4, 1, 1, 4, 2][..],
            &[1, 2, 4, 0x05, 0xb4, 1, 1, 1][..],
            &[4, 2, 2, 4, 0x05, 0xb4, 0, 0][..],
        ] {
            let mut seg = syn_with(opts);
            assert_eq!(clamp_mss(&mut seg, 1400), Some(1460), "{opts:?}");
            let p = Packet::new_unchecked(&seg[..]);
            assert!(p.verify_checksum(&pair), "{opts:?}");
            assert!(
                p.options().windows(4).any(|w| w == [2, 4, 0x05, 0x78]),
                "{opts:?}"
            );
            let again = seg.clone();
            assert_eq!(clamp_mss(&mut seg, 1400), None, "equal: unchanged");
            assert_eq!(clamp_mss(&mut seg, 1500), None, "never raised");
            assert_eq!(seg, again);
        }
        // No MSS option, an end of list before it, a malformed length.
        for opts in [
            &[1, 1, 4, 2][..],
            &[0, 0, 2, 4, 0x05, 0xb4, 0, 0][..],
            &[3, 9, 2, 4, 0x05, 0xb4, 0, 0][..],
        ] {
            let mut seg = syn_with(opts);
            let before = seg.clone();
            assert_eq!(clamp_mss(&mut seg, 536), None, "{opts:?}");
            assert_eq!(seg, before);
        }
    }

    proptest::proptest! {
        #[test]
        fn clamp_mss_never_panics(mut seg in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..80), limit: u16) {
            let _ = clamp_mss(&mut seg, limit);
        }
    }
}
