//! IPv6 (RFC 8200) and the walk over its extension headers.

use crate::ip::{Frag, IpProtocol};
use crate::{EmitError, ParseError, Result};
use core::net::Ipv6Addr;

mod field {
    pub type Field = core::ops::Range<usize>;
    pub const VER_TC_FLOW: Field = 0..4;
    pub const LENGTH: Field = 4..6;
    pub const NXT_HDR: usize = 6;
    pub const HOP_LIMIT: usize = 7;
    pub const SRC_ADDR: Field = 8..24;
    pub const DST_ADDR: Field = 24..40;

    // Fragment header (RFC 8200 §4.5).
    pub const FRAG_NXT: usize = 0;
    pub const FRAG_OFF_M: Field = 2..4;
    pub const FRAG_IDENT: Field = 4..8;
}

/// Length of the fixed IPv6 header.
pub const HEADER_LEN: usize = field::DST_ADDR.end;
/// Length of the fragment extension header.
pub const FRAG_HEADER_LEN: usize = 8;
/// Longest extension-header chain [`walk_ext_headers`] follows.
pub const MAX_EXT_HEADERS: usize = 8;

fn arr<const N: usize>(b: &[u8]) -> [u8; N] {
    let mut o = [0u8; N];
    o.copy_from_slice(b);
    o
}

/// A read/write view of an IPv6 packet.
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

    /// Ensure no getter will panic: the fixed header fits and so does the
    /// payload length it announces (the buffer may be longer).
    pub fn check_len(&self) -> Result<()> {
        let len = self.buffer.as_ref().len();
        if len < HEADER_LEN {
            Err(ParseError::Truncated)
        } else if HEADER_LEN + usize::from(self.payload_len()) > len {
            Err(ParseError::Ipv6PayloadLen)
        } else {
            Ok(())
        }
    }

    /// Unwrap the buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    fn word0(&self) -> u32 {
        u32::from_be_bytes(arr(&self.buffer.as_ref()[field::VER_TC_FLOW]))
    }
    /// Version nibble.
    pub fn version(&self) -> u8 {
        (self.word0() >> 28) as u8
    }
    /// Traffic class.
    pub fn traffic_class(&self) -> u8 {
        (self.word0() >> 20) as u8
    }
    /// Flow label (20 bits).
    pub fn flow_label(&self) -> u32 {
        self.word0() & 0x000f_ffff
    }
    /// Payload length (extension headers included).
    pub fn payload_len(&self) -> u16 {
        u16::from_be_bytes(arr(&self.buffer.as_ref()[field::LENGTH]))
    }
    /// First next-header value.
    pub fn next_header(&self) -> IpProtocol {
        IpProtocol::from(self.buffer.as_ref()[field::NXT_HDR])
    }
    /// Hop limit.
    pub fn hop_limit(&self) -> u8 {
        self.buffer.as_ref()[field::HOP_LIMIT]
    }
    /// Source address.
    pub fn src_addr(&self) -> Ipv6Addr {
        Ipv6Addr::from(arr::<16>(&self.buffer.as_ref()[field::SRC_ADDR]))
    }
    /// Destination address.
    pub fn dst_addr(&self) -> Ipv6Addr {
        Ipv6Addr::from(arr::<16>(&self.buffer.as_ref()[field::DST_ADDR]))
    }
    /// The payload, `payload_len` bytes after the fixed header (empty if out
    /// of range).
    pub fn payload(&self) -> &[u8] {
        let end = HEADER_LEN + usize::from(self.payload_len());
        self.buffer.as_ref().get(HEADER_LEN..end).unwrap_or(&[])
    }
    /// Walk the extension headers to the upper layer; offsets in the result
    /// are relative to the start of the packet.
    pub fn upper_layer(&self) -> Result<UpperLayer> {
        let mut u = walk_ext_headers(self.payload(), self.buffer.as_ref()[field::NXT_HDR])?;
        u.offset += HEADER_LEN;
        Ok(u)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    fn set_word0(&mut self, v: u32) {
        self.buffer.as_mut()[field::VER_TC_FLOW].copy_from_slice(&v.to_be_bytes());
    }
    /// Set the version nibble.
    pub fn set_version(&mut self, v: u8) {
        let w = self.word0();
        self.set_word0((w & 0x0fff_ffff) | (u32::from(v & 0xf) << 28));
    }
    /// Set the traffic class.
    pub fn set_traffic_class(&mut self, v: u8) {
        let w = self.word0();
        self.set_word0((w & 0xf00f_ffff) | (u32::from(v) << 20));
    }
    /// Set the flow label (masked to 20 bits).
    pub fn set_flow_label(&mut self, v: u32) {
        let w = self.word0();
        self.set_word0((w & 0xfff0_0000) | (v & 0x000f_ffff));
    }
    /// Set the payload length.
    pub fn set_payload_len(&mut self, v: u16) {
        self.buffer.as_mut()[field::LENGTH].copy_from_slice(&v.to_be_bytes());
    }
    /// Set the first next-header value.
    pub fn set_next_header(&mut self, v: IpProtocol) {
        self.buffer.as_mut()[field::NXT_HDR] = v.into();
    }
    /// Set the hop limit.
    pub fn set_hop_limit(&mut self, v: u8) {
        self.buffer.as_mut()[field::HOP_LIMIT] = v;
    }
    /// Set the source address.
    pub fn set_src_addr(&mut self, a: Ipv6Addr) {
        self.buffer.as_mut()[field::SRC_ADDR].copy_from_slice(&a.octets());
    }
    /// Set the destination address.
    pub fn set_dst_addr(&mut self, a: Ipv6Addr) {
        self.buffer.as_mut()[field::DST_ADDR].copy_from_slice(&a.octets());
    }
    /// Mutable payload.
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let end = HEADER_LEN + usize::from(self.payload_len());
        self.buffer
            .as_mut()
            .get_mut(HEADER_LEN..end)
            .unwrap_or(&mut [])
    }
}

/// Where the upper-layer header of an IPv6 packet starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct UpperLayer {
    /// Upper-layer protocol: the last next-header value. For a non-first
    /// fragment, the next header of the fragment header.
    pub protocol: u8,
    /// Byte offset of the upper-layer header.
    pub offset: usize,
    /// Fragment position, from a fragment header if one was seen.
    pub frag: Frag,
}

/// Whether `nh` is an extension header with the generic "next header,
/// length in 8-octet units not counting the first 8" layout (RFC 8200 §4,
/// RFC 7045): hop-by-hop, routing, destination options, mobility, HIP, shim6.
#[inline]
pub fn is_generic_ext_header(nh: u8) -> bool {
    matches!(nh, 0 | 43 | 60 | 135 | 139 | 140)
}

/// Walk the extension-header chain in `payload` (the bytes after the fixed
/// header), starting from next-header value `nh`, to the upper layer
/// (RFC 8200 §4). Offsets are relative to `payload`.
///
/// Stops at the first value that is not an extension header (TCP, UDP,
/// ICMPv6, ESP, no-next-header, unknown), or at a non-first fragment.
/// Errors: a header that runs past `payload`, hop-by-hop anywhere but first
/// (RFC 8200 §4.1), or more than [`MAX_EXT_HEADERS`] headers.
#[inline]
pub fn walk_ext_headers(payload: &[u8], mut nh: u8) -> Result<UpperLayer> {
    let mut off = 0usize;
    let mut frag = Frag::None;
    for i in 0..=MAX_EXT_HEADERS {
        let rest = payload.get(off..).ok_or(ParseError::Ipv6ExtHeader)?;
        let (next, len) = match nh {
            0 | 43 | 60 | 135 | 139 | 140 => {
                if nh == 0 && i != 0 {
                    return Err(ParseError::Ipv6ExtHeader);
                }
                let h: &[u8; 2] = rest.first_chunk().ok_or(ParseError::Ipv6ExtHeader)?;
                (h[0], (usize::from(h[1]) + 1) * 8)
            }
            // RFC 4302 §2.2: AH length is in 4-octet units minus 2.
            51 => {
                let h: &[u8; 2] = rest.first_chunk().ok_or(ParseError::Ipv6ExtHeader)?;
                (h[0], (usize::from(h[1]) + 2) * 4)
            }
            44 => {
                let h: &[u8; 8] = rest.first_chunk().ok_or(ParseError::Ipv6ExtHeader)?;
                let off_m = u16::from_be_bytes([h[2], h[3]]);
                let f = Frag::from_mf_offset(off_m & 1 != 0, off_m & 0xfff8);
                if f == Frag::NonFirst {
                    return Ok(UpperLayer {
                        protocol: h[0],
                        offset: off + 8,
                        frag: f,
                    });
                }
                if f == Frag::First {
                    frag = f;
                }
                (h[0], FRAG_HEADER_LEN)
            }
            _ => {
                return Ok(UpperLayer {
                    protocol: nh,
                    offset: off,
                    frag,
                })
            }
        };
        if len > rest.len() {
            return Err(ParseError::Ipv6ExtHeader);
        }
        nh = next;
        off += len;
    }
    Err(ParseError::Ipv6ExtChain)
}

/// A read/write view of an IPv6 fragment header (RFC 8200 §4.5).
#[derive(Debug, Clone)]
pub struct FragmentHeader<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> FragmentHeader<T> {
    /// Wrap a buffer without checking its length.
    pub const fn new_unchecked(buffer: T) -> Self {
        FragmentHeader { buffer }
    }
    /// Wrap a buffer and check that 8 bytes fit.
    pub fn new_checked(buffer: T) -> Result<Self> {
        let h = Self::new_unchecked(buffer);
        h.check_len()?;
        Ok(h)
    }
    /// Ensure no getter will panic.
    pub fn check_len(&self) -> Result<()> {
        if self.buffer.as_ref().len() < FRAG_HEADER_LEN {
            Err(ParseError::Truncated)
        } else {
            Ok(())
        }
    }
    /// Next header after reassembly.
    pub fn next_header(&self) -> IpProtocol {
        IpProtocol::from(self.buffer.as_ref()[field::FRAG_NXT])
    }
    /// Fragment offset in bytes.
    pub fn frag_offset(&self) -> u16 {
        u16::from_be_bytes(arr(&self.buffer.as_ref()[field::FRAG_OFF_M])) & 0xfff8
    }
    /// More-fragments flag.
    pub fn more_frags(&self) -> bool {
        self.buffer.as_ref()[field::FRAG_OFF_M.end - 1] & 1 != 0
    }
    /// Identification.
    pub fn ident(&self) -> u32 {
        u32::from_be_bytes(arr(&self.buffer.as_ref()[field::FRAG_IDENT]))
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> FragmentHeader<T> {
    /// Write the whole header.
    pub fn set(&mut self, next: IpProtocol, offset: u16, more: bool, ident: u32) {
        let b = self.buffer.as_mut();
        b[field::FRAG_NXT] = next.into();
        b[1] = 0;
        b[field::FRAG_OFF_M].copy_from_slice(&((offset & 0xfff8) | u16::from(more)).to_be_bytes());
        b[field::FRAG_IDENT].copy_from_slice(&ident.to_be_bytes());
    }
}

/// An IPv6 fixed header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Ipv6Repr {
    /// Source address.
    pub src_addr: Ipv6Addr,
    /// Destination address.
    pub dst_addr: Ipv6Addr,
    /// First next-header value.
    pub next_header: IpProtocol,
    /// Payload length (extension headers included).
    pub payload_len: usize,
    /// Hop limit.
    pub hop_limit: u8,
    /// Traffic class.
    pub traffic_class: u8,
    /// Flow label (20 bits).
    pub flow_label: u32,
}

impl Ipv6Repr {
    /// Parse the fixed header.
    pub fn parse<T: AsRef<[u8]>>(p: &Packet<T>) -> Result<Ipv6Repr> {
        p.check_len()?;
        if p.version() != 6 {
            return Err(ParseError::IpVersion);
        }
        Ok(Ipv6Repr {
            src_addr: p.src_addr(),
            dst_addr: p.dst_addr(),
            next_header: p.next_header(),
            payload_len: usize::from(p.payload_len()),
            hop_limit: p.hop_limit(),
            traffic_class: p.traffic_class(),
            flow_label: p.flow_label(),
        })
    }

    /// Header length: 40.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Write the fixed header.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(
        &self,
        p: &mut Packet<T>,
    ) -> core::result::Result<(), EmitError> {
        if p.buffer.as_ref().len() < HEADER_LEN {
            return Err(EmitError::BufferTooSmall);
        }
        let len = u16::try_from(self.payload_len).map_err(|_| EmitError::PayloadTooLarge)?;
        p.set_word0(
            0x6000_0000 | (u32::from(self.traffic_class) << 20) | (self.flow_label & 0xf_ffff),
        );
        p.set_payload_len(len);
        p.set_next_header(self.next_header);
        p.set_hop_limit(self.hop_limit);
        p.set_src_addr(self.src_addr);
        p.set_dst_addr(self.dst_addr);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 2001:db8::1 -> 2001:db8::2, hop-by-hop (8) + fragment (first, M=1)
    /// + destination options (8) + UDP (8).
    static EXT_CHAIN: [u8; 72] = [
        0x60, 0x00, 0x00, 0x00, 0x00, 0x20, 0x00, 0x40, // ver, len 32, nh HbH, hlim 64
        0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, // src
        0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2, // dst
        44, 0, 1, 4, 0, 0, 0, 0, // HbH -> frag, PadN
        60, 0, 0x00, 0x01, 0xde, 0xad, 0xbe, 0xef, // frag -> dstopts, offset 0, M=1
        17, 0, 1, 4, 0, 0, 0, 0, // dstopts -> UDP
        0x04, 0xd2, 0x00, 0x35, 0x00, 0x08, 0x00, 0x00, // UDP
    ];

    #[test]
    fn walk_to_udp() {
        let p = Packet::new_checked(&EXT_CHAIN[..]).unwrap();
        assert_eq!(p.version(), 6);
        assert_eq!(p.payload_len(), 32);
        assert_eq!(p.src_addr(), "2001:db8::1".parse::<Ipv6Addr>().unwrap());
        let u = p.upper_layer().unwrap();
        assert_eq!(
            u,
            UpperLayer {
                protocol: 17,
                offset: 64,
                frag: Frag::First
            }
        );
        let f = FragmentHeader::new_checked(&EXT_CHAIN[48..]).unwrap();
        assert_eq!(
            (f.more_frags(), f.frag_offset(), f.ident()),
            (true, 0, 0xdeadbeef)
        );
        assert_eq!(f.next_header(), IpProtocol::Ipv6Opts);
    }

    #[test]
    fn non_first_fragment_stops() {
        let mut b = EXT_CHAIN;
        b[50] = 0x05; // offset 0x0500 & 0xfff8 = 1280
        let u = Packet::new_unchecked(&b[..]).upper_layer().unwrap();
        assert_eq!(
            u,
            UpperLayer {
                protocol: 60,
                offset: 56,
                frag: Frag::NonFirst
            }
        );
    }

    #[test]
    fn ah_length_and_errors() {
        // AH with payload length 1: (1 + 2) * 4 = 12 bytes, then TCP.
        let ah = [6u8, 1, 0, 0, 0, 0, 0, 1, 0, 0, 0, 1];
        assert_eq!(walk_ext_headers(&ah, 51).unwrap().offset, 12);
        assert_eq!(
            walk_ext_headers(&ah[..11], 51),
            Err(ParseError::Ipv6ExtHeader)
        );
        // Hop-by-hop not first.
        let two = [0u8, 0, 0, 0, 0, 0, 0, 0, 17, 0, 0, 0, 0, 0, 0, 0];
        assert_eq!(walk_ext_headers(&two, 60), Err(ParseError::Ipv6ExtHeader));
        // An endless chain of destination options.
        let chain = [60u8, 0, 0, 0, 0, 0, 0, 0].repeat(12);
        assert_eq!(walk_ext_headers(&chain, 60), Err(ParseError::Ipv6ExtChain));
        // Payload length beyond the buffer.
        assert_eq!(
            Packet::new_checked(&EXT_CHAIN[..71]).err(),
            Some(ParseError::Ipv6PayloadLen)
        );
        assert_eq!(
            Packet::new_checked(&EXT_CHAIN[..39]).err(),
            Some(ParseError::Truncated)
        );
    }

    #[test]
    fn emit_roundtrip() {
        let p = Packet::new_checked(&EXT_CHAIN[..]).unwrap();
        let r = Ipv6Repr::parse(&p).unwrap();
        let mut b = [0u8; 72];
        r.emit(&mut Packet::new_unchecked(&mut b[..])).unwrap();
        assert_eq!(b[..40], EXT_CHAIN[..40]);
    }
}

/// The identification of the fragment header of the IPv6 packet `ip6`
/// (starting at its fixed header), found by walking the extension headers
/// as [`walk_ext_headers`] does; `None` without one or when truncated.
pub fn fragment_ident(ip6: &[u8]) -> Option<u32> {
    let mut nh = *ip6.get(6)?;
    let mut off = 40usize;
    for _ in 0..=MAX_EXT_HEADERS {
        let h = ip6.get(off..)?;
        let len = match nh {
            44 => {
                let f: &[u8; 8] = h.first_chunk()?;
                return Some(u32::from_be_bytes([f[4], f[5], f[6], f[7]]));
            }
            0 | 43 | 60 | 135 | 139 | 140 => (usize::from(*h.get(1)?) + 1) * 8,
            51 => (usize::from(*h.get(1)?) + 2) * 4,
            _ => return None,
        };
        nh = *h.first()?;
        off = off.checked_add(len)?;
    }
    None
}

#[cfg(test)]
mod fragment_ident_tests {
    use super::*;

    #[test]
    fn finds_the_identification_behind_other_headers() {
        let mut p = vec![0u8; 40 + 8 + 8 + 8];
        p[0] = 0x60;
        p[6] = 0; // hop-by-hop
        p[40] = 44; // next: fragment
        p[41] = 0; // 8 bytes
        p[48] = 17;
        p[52..56].copy_from_slice(&0xdead_beefu32.to_be_bytes());
        assert_eq!(fragment_ident(&p), Some(0xdead_beef));
        p[6] = 17;
        assert_eq!(fragment_ident(&p), None, "no fragment header");
        p[6] = 0;
        assert_eq!(fragment_ident(&p[..50]), None, "truncated");
        for n in 0..p.len() {
            let _ = fragment_ident(&p[..n]);
        }
    }
}
