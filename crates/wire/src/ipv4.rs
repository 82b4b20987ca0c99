//! IPv4 (RFC 791).

use crate::checksum;
use crate::ip::IpProtocol;
use crate::{EmitError, ParseError, Result};
use core::net::Ipv4Addr;

mod field {
    pub type Field = core::ops::Range<usize>;
    pub const VER_IHL: usize = 0;
    pub const DSCP_ECN: usize = 1;
    pub const LENGTH: Field = 2..4;
    pub const IDENT: Field = 4..6;
    pub const FLG_OFF: Field = 6..8;
    pub const TTL: usize = 8;
    pub const PROTOCOL: usize = 9;
    pub const CHECKSUM: Field = 10..12;
    pub const SRC_ADDR: Field = 12..16;
    pub const DST_ADDR: Field = 16..20;
}

/// Length of an IPv4 header without options.
pub const HEADER_LEN: usize = field::DST_ADDR.end;

/// Flag bit "don't fragment" in the flags/offset word (RFC 791 §3.1).
pub const FLAG_DF: u16 = 0x4000;
/// Flag bit "more fragments".
pub const FLAG_MF: u16 = 0x2000;
/// Fragment offset mask, in 8-octet units.
pub const FRAG_OFFSET_MASK: u16 = 0x1fff;

/// A read/write view of an IPv4 packet.
#[derive(Debug, Clone)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

fn arr<const N: usize>(b: &[u8]) -> [u8; N] {
    let mut o = [0u8; N];
    o.copy_from_slice(b);
    o
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

    /// Ensure no getter will panic: the fixed header fits, IHL ≥ 5 and the
    /// header fits, and `header_len ≤ total_len ≤ buffer length` (the buffer
    /// may be longer, e.g. Ethernet padding).
    pub fn check_len(&self) -> Result<()> {
        let len = self.buffer.as_ref().len();
        if len < HEADER_LEN {
            return Err(ParseError::Truncated);
        }
        let hl = self.header_len() as usize;
        if hl < HEADER_LEN || hl > len {
            return Err(ParseError::Ipv4HeaderLen);
        }
        let tl = self.total_len() as usize;
        if tl < hl || tl > len {
            return Err(ParseError::Ipv4TotalLen);
        }
        Ok(())
    }

    /// Unwrap the buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// Version nibble.
    pub fn version(&self) -> u8 {
        self.buffer.as_ref()[field::VER_IHL] >> 4
    }
    /// Header length in bytes (IHL × 4).
    pub fn header_len(&self) -> u8 {
        (self.buffer.as_ref()[field::VER_IHL] & 0x0f) * 4
    }
    /// DSCP (6 bits).
    pub fn dscp(&self) -> u8 {
        self.buffer.as_ref()[field::DSCP_ECN] >> 2
    }
    /// ECN (2 bits).
    pub fn ecn(&self) -> u8 {
        self.buffer.as_ref()[field::DSCP_ECN] & 3
    }
    /// Total length.
    pub fn total_len(&self) -> u16 {
        u16::from_be_bytes(arr(&self.buffer.as_ref()[field::LENGTH]))
    }
    /// Identification.
    pub fn ident(&self) -> u16 {
        u16::from_be_bytes(arr(&self.buffer.as_ref()[field::IDENT]))
    }
    fn flg_off(&self) -> u16 {
        u16::from_be_bytes(arr(&self.buffer.as_ref()[field::FLG_OFF]))
    }
    /// Don't-fragment flag.
    pub fn dont_frag(&self) -> bool {
        self.flg_off() & FLAG_DF != 0
    }
    /// More-fragments flag.
    pub fn more_frags(&self) -> bool {
        self.flg_off() & FLAG_MF != 0
    }
    /// Fragment offset in bytes.
    pub fn frag_offset(&self) -> u16 {
        (self.flg_off() & FRAG_OFFSET_MASK) << 3
    }
    /// Whether this packet is a fragment (MF set or offset non-zero).
    pub fn is_fragment(&self) -> bool {
        self.flg_off() & (FLAG_MF | FRAG_OFFSET_MASK) != 0
    }
    /// Time to live.
    pub fn ttl(&self) -> u8 {
        self.buffer.as_ref()[field::TTL]
    }
    /// Protocol of the payload.
    pub fn protocol(&self) -> IpProtocol {
        IpProtocol::from(self.buffer.as_ref()[field::PROTOCOL])
    }
    /// Header checksum.
    pub fn checksum(&self) -> u16 {
        u16::from_be_bytes(arr(&self.buffer.as_ref()[field::CHECKSUM]))
    }
    /// Source address.
    pub fn src_addr(&self) -> Ipv4Addr {
        Ipv4Addr::from(arr::<4>(&self.buffer.as_ref()[field::SRC_ADDR]))
    }
    /// Destination address.
    pub fn dst_addr(&self) -> Ipv4Addr {
        Ipv4Addr::from(arr::<4>(&self.buffer.as_ref()[field::DST_ADDR]))
    }
    /// The options area (empty if IHL is 5 or out of range).
    pub fn options(&self) -> &[u8] {
        self.buffer
            .as_ref()
            .get(HEADER_LEN..self.header_len() as usize)
            .unwrap_or(&[])
    }
    /// The header checksum verifies (RFC 791 §3.1).
    pub fn verify_checksum(&self) -> bool {
        self.buffer
            .as_ref()
            .get(..self.header_len() as usize)
            .is_some_and(checksum::verify)
    }
    /// The payload: from the end of the header to `total_len` (empty if the
    /// lengths are inconsistent).
    pub fn payload(&self) -> &[u8] {
        let (h, t) = (self.header_len() as usize, self.total_len() as usize);
        self.buffer.as_ref().get(h..t).unwrap_or(&[])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Set the version nibble.
    pub fn set_version(&mut self, v: u8) {
        let b = &mut self.buffer.as_mut()[field::VER_IHL];
        *b = (*b & 0x0f) | (v << 4);
    }
    /// Set the header length in bytes (must be a multiple of 4, 20..=60).
    pub fn set_header_len(&mut self, len: u8) {
        let b = &mut self.buffer.as_mut()[field::VER_IHL];
        *b = (*b & 0xf0) | ((len / 4) & 0x0f);
    }
    /// Set DSCP and ECN.
    pub fn set_dscp_ecn(&mut self, dscp: u8, ecn: u8) {
        self.buffer.as_mut()[field::DSCP_ECN] = (dscp << 2) | (ecn & 3);
    }
    /// Set total length.
    pub fn set_total_len(&mut self, v: u16) {
        self.buffer.as_mut()[field::LENGTH].copy_from_slice(&v.to_be_bytes());
    }
    /// Set identification.
    pub fn set_ident(&mut self, v: u16) {
        self.buffer.as_mut()[field::IDENT].copy_from_slice(&v.to_be_bytes());
    }
    /// Set DF, MF and the fragment offset (in bytes, multiple of 8).
    pub fn set_frag(&mut self, df: bool, mf: bool, offset: u16) {
        let v = (if df { FLAG_DF } else { 0 })
            | (if mf { FLAG_MF } else { 0 })
            | ((offset >> 3) & FRAG_OFFSET_MASK);
        self.buffer.as_mut()[field::FLG_OFF].copy_from_slice(&v.to_be_bytes());
    }
    /// Set time to live.
    pub fn set_ttl(&mut self, v: u8) {
        self.buffer.as_mut()[field::TTL] = v;
    }
    /// Set protocol.
    pub fn set_protocol(&mut self, v: IpProtocol) {
        self.buffer.as_mut()[field::PROTOCOL] = v.into();
    }
    /// Set the checksum field.
    pub fn set_checksum(&mut self, v: u16) {
        self.buffer.as_mut()[field::CHECKSUM].copy_from_slice(&v.to_be_bytes());
    }
    /// Set source address.
    pub fn set_src_addr(&mut self, a: Ipv4Addr) {
        self.buffer.as_mut()[field::SRC_ADDR].copy_from_slice(&a.octets());
    }
    /// Set destination address.
    pub fn set_dst_addr(&mut self, a: Ipv4Addr) {
        self.buffer.as_mut()[field::DST_ADDR].copy_from_slice(&a.octets());
    }
    /// Recompute the header checksum over `header_len` bytes.
    pub fn fill_checksum(&mut self) {
        self.set_checksum(0);
        let hl = self.header_len() as usize;
        let c = self.buffer.as_ref().get(..hl).map_or(0, checksum::checksum);
        self.set_checksum(c);
    }
    /// Mutable options area.
    pub fn options_mut(&mut self) -> &mut [u8] {
        let hl = self.header_len() as usize;
        self.buffer
            .as_mut()
            .get_mut(HEADER_LEN..hl)
            .unwrap_or(&mut [])
    }
    /// Mutable payload.
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let (h, t) = (self.header_len() as usize, self.total_len() as usize);
        self.buffer.as_mut().get_mut(h..t).unwrap_or(&mut [])
    }
}

/// An IPv4 header without options.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Ipv4Repr {
    /// Source address.
    pub src_addr: Ipv4Addr,
    /// Destination address.
    pub dst_addr: Ipv4Addr,
    /// Payload protocol.
    pub protocol: IpProtocol,
    /// Payload length (total length minus header length).
    pub payload_len: usize,
    /// Time to live.
    pub ttl: u8,
    /// Identification.
    pub ident: u16,
    /// Don't-fragment flag.
    pub dont_frag: bool,
    /// More-fragments flag.
    pub more_frags: bool,
    /// Fragment offset in bytes.
    pub frag_offset: u16,
    /// DSCP (6 bits).
    pub dscp: u8,
    /// ECN (2 bits).
    pub ecn: u8,
}

impl Ipv4Repr {
    /// A plain, unfragmented header with TTL 64 and DF clear.
    pub fn new(src: Ipv4Addr, dst: Ipv4Addr, protocol: IpProtocol, payload_len: usize) -> Self {
        Ipv4Repr {
            src_addr: src,
            dst_addr: dst,
            protocol,
            payload_len,
            ttl: 64,
            ident: 0,
            dont_frag: false,
            more_frags: false,
            frag_offset: 0,
            dscp: 0,
            ecn: 0,
        }
    }

    /// Parse and verify the header checksum. Options are skipped (read them
    /// through the view).
    pub fn parse<T: AsRef<[u8]>>(p: &Packet<T>) -> Result<Ipv4Repr> {
        p.check_len()?;
        if p.version() != 4 {
            return Err(ParseError::IpVersion);
        }
        if !p.verify_checksum() {
            return Err(ParseError::Checksum);
        }
        Ok(Ipv4Repr {
            src_addr: p.src_addr(),
            dst_addr: p.dst_addr(),
            protocol: p.protocol(),
            payload_len: usize::from(p.total_len()) - usize::from(p.header_len()),
            ttl: p.ttl(),
            ident: p.ident(),
            dont_frag: p.dont_frag(),
            more_frags: p.more_frags(),
            frag_offset: p.frag_offset(),
            dscp: p.dscp(),
            ecn: p.ecn(),
        })
    }

    /// Header length: 20.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Write the 20-byte header with its checksum. The payload is not touched.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(
        &self,
        p: &mut Packet<T>,
    ) -> core::result::Result<(), EmitError> {
        if p.buffer.as_ref().len() < HEADER_LEN {
            return Err(EmitError::BufferTooSmall);
        }
        let total =
            u16::try_from(HEADER_LEN + self.payload_len).map_err(|_| EmitError::PayloadTooLarge)?;
        p.set_version(4);
        p.set_header_len(HEADER_LEN as u8);
        p.set_dscp_ecn(self.dscp, self.ecn);
        p.set_total_len(total);
        p.set_ident(self.ident);
        p.set_frag(self.dont_frag, self.more_frags, self.frag_offset);
        p.set_ttl(self.ttl);
        p.set_protocol(self.protocol);
        p.set_src_addr(self.src_addr);
        p.set_dst_addr(self.dst_addr);
        p.fill_checksum();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 10.0.0.1 -> 10.0.0.2, UDP, 8 bytes of payload, one NOP/EOL option word.
    static WITH_OPTIONS: [u8; 32] = [
        0x46, 0x00, 0x00, 0x20, 0x12, 0x34, 0x40, 0x00, 0x40, 0x11, 0x00, 0x00, 10, 0, 0, 1, 10, 0,
        0, 2, 0x01, 0x01, 0x01, 0x00, // options
        0x04, 0xd2, 0x00, 0x35, 0x00, 0x08, 0x00, 0x00, // udp
    ];

    fn fixed() -> [u8; 32] {
        let mut b = WITH_OPTIONS;
        Packet::new_unchecked(&mut b[..]).fill_checksum();
        b
    }

    #[test]
    fn getters() {
        let b = fixed();
        let p = Packet::new_checked(&b[..]).unwrap();
        assert_eq!(p.header_len(), 24);
        assert_eq!(p.options(), &[1, 1, 1, 0]);
        assert!(p.dont_frag() && !p.more_frags() && !p.is_fragment());
        assert_eq!(p.protocol(), IpProtocol::Udp);
        assert_eq!(p.payload().len(), 8);
        assert!(p.verify_checksum());
        let r = Ipv4Repr::parse(&p).unwrap();
        assert_eq!(r.payload_len, 8);
        assert_eq!(r.ident, 0x1234);
    }

    #[test]
    fn fragments() {
        let mut b = fixed();
        Packet::new_unchecked(&mut b[..]).set_frag(false, true, 1480);
        let p = Packet::new_unchecked(&b[..]);
        assert!(p.more_frags() && p.is_fragment());
        assert_eq!(p.frag_offset(), 1480);
    }

    #[test]
    fn length_errors() {
        let mut b = fixed();
        assert_eq!(
            Packet::new_checked(&b[..19]).err(),
            Some(ParseError::Truncated)
        );
        b[0] = 0x44;
        assert_eq!(
            Packet::new_checked(&b[..]).err(),
            Some(ParseError::Ipv4HeaderLen)
        );
        b[0] = 0x4f;
        assert_eq!(
            Packet::new_checked(&b[..]).err(),
            Some(ParseError::Ipv4HeaderLen)
        );
        b[0] = 0x46;
        b[3] = 0x21;
        assert_eq!(
            Packet::new_checked(&b[..]).err(),
            Some(ParseError::Ipv4TotalLen)
        );
        b[3] = 0x10;
        assert_eq!(
            Packet::new_checked(&b[..]).err(),
            Some(ParseError::Ipv4TotalLen)
        );
    }

    #[test]
    fn bad_checksum_and_version() {
        let mut b = fixed();
        b[11] ^= 1;
        assert_eq!(
            Ipv4Repr::parse(&Packet::new_unchecked(&b[..])),
            Err(ParseError::Checksum)
        );
        let mut b = fixed();
        b[0] = 0x66;
        assert_eq!(
            Ipv4Repr::parse(&Packet::new_unchecked(&b[..])),
            Err(ParseError::IpVersion)
        );
    }

    #[test]
    fn emit_roundtrip() {
        let mut r = Ipv4Repr::new(
            Ipv4Addr::new(192, 168, 0, 1),
            Ipv4Addr::new(192, 168, 0, 199),
            IpProtocol::Udp,
            95,
        );
        r.dont_frag = true;
        let mut b = [0u8; 115];
        r.emit(&mut Packet::new_unchecked(&mut b[..])).unwrap();
        // The RFC 1071-era example header: 45 00 00 73 00 00 40 00 40 11 b8 61.
        assert_eq!(
            &b[..12],
            &[0x45, 0, 0, 0x73, 0, 0, 0x40, 0, 0x40, 0x11, 0xb8, 0x61]
        );
        assert_eq!(
            Ipv4Repr::parse(&Packet::new_checked(&b[..]).unwrap()).unwrap(),
            r
        );
        r.payload_len = 70000;
        assert_eq!(
            r.emit(&mut Packet::new_unchecked(&mut b[..])),
            Err(EmitError::PayloadTooLarge)
        );
    }
}
