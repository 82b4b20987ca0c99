//! ICMP for IPv4 (RFC 792) and IPv6 (RFC 4443).
//!
//! Both share the same 8-byte header layout: type, code, checksum, and four
//! bytes whose meaning depends on the type (identifier and sequence number
//! for queries; unused, MTU or pointer for errors). One view, [`Packet`],
//! serves both; the message enums and checksum rules differ.

use crate::checksum;
use crate::ip::IpPair;
use crate::{EmitError, ParseError, Result};

enum_with_unknown! {
    /// ICMPv4 message types (RFC 792, RFC 950).
    pub enum Icmpv4Message(u8) {
        /// Echo reply.
        EchoReply = 0,
        /// Destination unreachable (error).
        DstUnreachable = 3,
        /// Source quench (error, deprecated by RFC 6633).
        SourceQuench = 4,
        /// Redirect (error).
        Redirect = 5,
        /// Echo request.
        EchoRequest = 8,
        /// Router advertisement (RFC 1256).
        RouterAdvert = 9,
        /// Router solicitation (RFC 1256).
        RouterSolicit = 10,
        /// Time exceeded (error).
        TimeExceeded = 11,
        /// Parameter problem (error).
        ParamProblem = 12,
        /// Timestamp request.
        Timestamp = 13,
        /// Timestamp reply.
        TimestampReply = 14,
        /// Information request (obsolete).
        InfoRequest = 15,
        /// Information reply (obsolete).
        InfoReply = 16,
        /// Address mask request (RFC 950).
        AddrMaskRequest = 17,
        /// Address mask reply (RFC 950).
        AddrMaskReply = 18,
    }
}

impl Icmpv4Message {
    /// An error message that quotes the offending packet (RFC 792; RFC 1812
    /// §4.3.2.3).
    #[inline]
    pub fn is_error(self) -> bool {
        matches!(
            self,
            Self::DstUnreachable
                | Self::SourceQuench
                | Self::Redirect
                | Self::TimeExceeded
                | Self::ParamProblem
        )
    }

    /// A query/response pair keyed by its identifier (RFC 5508 §3.1: echo,
    /// timestamp, information, address mask).
    #[inline]
    pub fn is_query(self) -> bool {
        matches!(
            self,
            Self::EchoRequest
                | Self::EchoReply
                | Self::Timestamp
                | Self::TimestampReply
                | Self::InfoRequest
                | Self::InfoReply
                | Self::AddrMaskRequest
                | Self::AddrMaskReply
        )
    }
}

enum_with_unknown! {
    /// ICMPv6 message types (RFC 4443, RFC 4861, RFC 2710, RFC 3810).
    pub enum Icmpv6Message(u8) {
        /// Destination unreachable (error).
        DstUnreachable = 1,
        /// Packet too big (error).
        PktTooBig = 2,
        /// Time exceeded (error).
        TimeExceeded = 3,
        /// Parameter problem (error).
        ParamProblem = 4,
        /// Echo request.
        EchoRequest = 128,
        /// Echo reply.
        EchoReply = 129,
        /// MLD query.
        MldQuery = 130,
        /// MLD report.
        MldReport = 131,
        /// MLD done.
        MldDone = 132,
        /// Router solicitation.
        RouterSolicit = 133,
        /// Router advertisement.
        RouterAdvert = 134,
        /// Neighbor solicitation.
        NeighborSolicit = 135,
        /// Neighbor advertisement.
        NeighborAdvert = 136,
        /// Redirect.
        Redirect = 137,
        /// MLDv2 report.
        MldV2Report = 143,
    }
}

impl Icmpv6Message {
    /// An error message (RFC 4443 §2.1: types 0..=127).
    #[inline]
    pub fn is_error(self) -> bool {
        u8::from(self) < 128
    }

    /// Echo request or reply (RFC 4443 §4), keyed by identifier.
    #[inline]
    pub fn is_query(self) -> bool {
        matches!(self, Self::EchoRequest | Self::EchoReply)
    }
}

mod field {
    pub type Field = core::ops::Range<usize>;
    pub const TYPE: usize = 0;
    pub const CODE: usize = 1;
    pub const CHECKSUM: Field = 2..4;
    pub const REST: Field = 4..8;
    pub const ECHO_IDENT: Field = 4..6;
    pub const ECHO_SEQNO: Field = 6..8;
    pub const DATA: usize = 8;
}

/// Length of the ICMP header.
pub const HEADER_LEN: usize = field::DATA;

fn arr<const N: usize>(b: &[u8]) -> [u8; N] {
    let mut o = [0u8; N];
    o.copy_from_slice(b);
    o
}

/// A read/write view of an ICMPv4 or ICMPv6 message. The buffer is the
/// whole message.
#[derive(Debug, Clone)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wrap a buffer without checking its length.
    pub const fn new_unchecked(buffer: T) -> Packet<T> {
        Packet { buffer }
    }

    /// Wrap a buffer and check that the 8-byte header fits.
    pub fn new_checked(buffer: T) -> Result<Packet<T>> {
        let p = Self::new_unchecked(buffer);
        p.check_len()?;
        Ok(p)
    }

    /// Ensure no getter will panic.
    pub fn check_len(&self) -> Result<()> {
        if self.buffer.as_ref().len() < HEADER_LEN {
            Err(ParseError::Truncated)
        } else {
            Ok(())
        }
    }

    /// Unwrap the buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// Raw type.
    pub fn msg_type(&self) -> u8 {
        self.buffer.as_ref()[field::TYPE]
    }
    /// Type, as ICMPv4.
    pub fn v4_type(&self) -> Icmpv4Message {
        self.msg_type().into()
    }
    /// Type, as ICMPv6.
    pub fn v6_type(&self) -> Icmpv6Message {
        self.msg_type().into()
    }
    /// Code.
    pub fn msg_code(&self) -> u8 {
        self.buffer.as_ref()[field::CODE]
    }
    /// Checksum field.
    pub fn checksum(&self) -> u16 {
        u16::from_be_bytes(arr(&self.buffer.as_ref()[field::CHECKSUM]))
    }
    /// The four type-specific bytes after the checksum.
    pub fn rest_of_header(&self) -> u32 {
        u32::from_be_bytes(arr(&self.buffer.as_ref()[field::REST]))
    }
    /// Identifier of a query message.
    pub fn echo_ident(&self) -> u16 {
        u16::from_be_bytes(arr(&self.buffer.as_ref()[field::ECHO_IDENT]))
    }
    /// Sequence number of a query message.
    pub fn echo_seq_no(&self) -> u16 {
        u16::from_be_bytes(arr(&self.buffer.as_ref()[field::ECHO_SEQNO]))
    }
    /// MTU of an ICMPv6 packet-too-big (32 bits) or the next-hop MTU of an
    /// ICMPv4 "fragmentation needed" (low 16 bits, RFC 1191).
    pub fn mtu(&self) -> u32 {
        self.rest_of_header()
    }
    /// Data after the header: echo data, or the quoted packet of an error.
    pub fn data(&self) -> &[u8] {
        self.buffer.as_ref().get(field::DATA..).unwrap_or(&[])
    }
    /// ICMPv4 checksum: over the whole message, no pseudo-header (RFC 792).
    pub fn verify_checksum_v4(&self) -> bool {
        checksum::verify(self.buffer.as_ref())
    }
    /// ICMPv6 checksum: over the pseudo-header and the whole message
    /// (RFC 4443 §2.3).
    pub fn verify_checksum_v6(&self, ip: &IpPair) -> bool {
        let d = self.buffer.as_ref();
        let Ok(len) = u32::try_from(d.len()) else {
            return false;
        };
        checksum::fold(checksum::add(ip.pseudo_sum(58, len), checksum::sum(d))) == 0xffff
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Set type.
    pub fn set_msg_type(&mut self, v: u8) {
        self.buffer.as_mut()[field::TYPE] = v;
    }
    /// Set code.
    pub fn set_msg_code(&mut self, v: u8) {
        self.buffer.as_mut()[field::CODE] = v;
    }
    /// Set checksum field.
    pub fn set_checksum(&mut self, v: u16) {
        self.buffer.as_mut()[field::CHECKSUM].copy_from_slice(&v.to_be_bytes());
    }
    /// Set the four type-specific bytes.
    pub fn set_rest_of_header(&mut self, v: u32) {
        self.buffer.as_mut()[field::REST].copy_from_slice(&v.to_be_bytes());
    }
    /// Set the query identifier.
    pub fn set_echo_ident(&mut self, v: u16) {
        self.buffer.as_mut()[field::ECHO_IDENT].copy_from_slice(&v.to_be_bytes());
    }
    /// Set the query sequence number.
    pub fn set_echo_seq_no(&mut self, v: u16) {
        self.buffer.as_mut()[field::ECHO_SEQNO].copy_from_slice(&v.to_be_bytes());
    }
    /// Mutable data.
    pub fn data_mut(&mut self) -> &mut [u8] {
        self.buffer
            .as_mut()
            .get_mut(field::DATA..)
            .unwrap_or(&mut [])
    }
    /// Recompute the ICMPv4 checksum over the whole buffer.
    pub fn fill_checksum_v4(&mut self) {
        self.set_checksum(0);
        let c = checksum::checksum(self.buffer.as_ref());
        self.set_checksum(c);
    }
    /// Recompute the ICMPv6 checksum over pseudo-header and whole buffer.
    pub fn fill_checksum_v6(&mut self, ip: &IpPair) {
        self.set_checksum(0);
        let d = self.buffer.as_ref();
        let len = u32::try_from(d.len()).unwrap_or(u32::MAX);
        let c = checksum::finish(checksum::add(ip.pseudo_sum(58, len), checksum::sum(d)));
        self.set_checksum(c);
    }
}

/// An ICMP message of either version: type, code, the four type-specific
/// bytes, and the data (echo payload or quoted packet).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IcmpRepr<'a> {
    /// Raw type (see [`Icmpv4Message`] / [`Icmpv6Message`]).
    pub msg_type: u8,
    /// Code.
    pub code: u8,
    /// Type-specific bytes 4..8: `ident << 16 | seq` for queries.
    pub rest: u32,
    /// Data after the header.
    pub data: &'a [u8],
}

impl<'a> IcmpRepr<'a> {
    /// An ICMPv4 echo request.
    pub fn echo_request_v4(ident: u16, seq: u16, data: &'a [u8]) -> Self {
        Self::query(Icmpv4Message::EchoRequest.into(), ident, seq, data)
    }

    /// An ICMPv6 echo request.
    pub fn echo_request_v6(ident: u16, seq: u16, data: &'a [u8]) -> Self {
        Self::query(Icmpv6Message::EchoRequest.into(), ident, seq, data)
    }

    /// A query message (echo and friends) of the given raw type.
    pub fn query(msg_type: u8, ident: u16, seq: u16, data: &'a [u8]) -> Self {
        IcmpRepr {
            msg_type,
            code: 0,
            rest: (u32::from(ident) << 16) | u32::from(seq),
            data,
        }
    }

    /// An error message quoting `quoted` (the offending packet from its IP
    /// header on; RFC 792 asks for at least the header and 8 bytes, RFC 1812
    /// §4.3.2.3 and RFC 4443 §2.4(c) for as much as fits).
    pub fn error(msg_type: u8, code: u8, rest: u32, quoted: &'a [u8]) -> Self {
        IcmpRepr {
            msg_type,
            code,
            rest,
            data: quoted,
        }
    }

    /// The query identifier (meaningful for queries only).
    pub fn ident(&self) -> u16 {
        (self.rest >> 16) as u16
    }

    /// The query sequence number (meaningful for queries only).
    pub fn seq_no(&self) -> u16 {
        self.rest as u16
    }

    fn parse_unverified(p: &Packet<&'a [u8]>) -> Result<Self> {
        p.check_len()?;
        let b: &'a [u8] = p.buffer;
        Ok(IcmpRepr {
            msg_type: p.msg_type(),
            code: p.msg_code(),
            rest: p.rest_of_header(),
            data: b.get(HEADER_LEN..).unwrap_or(&[]),
        })
    }

    /// Parse an ICMPv4 message and verify its checksum.
    pub fn parse_v4(p: &Packet<&'a [u8]>) -> Result<Self> {
        let r = Self::parse_unverified(p)?;
        if !p.verify_checksum_v4() {
            return Err(ParseError::Checksum);
        }
        Ok(r)
    }

    /// Parse an ICMPv6 message and verify its checksum.
    pub fn parse_v6(p: &Packet<&'a [u8]>, ip: &IpPair) -> Result<Self> {
        let r = Self::parse_unverified(p)?;
        if !p.verify_checksum_v6(ip) {
            return Err(ParseError::Checksum);
        }
        Ok(r)
    }

    /// Header plus data.
    pub fn buffer_len(&self) -> usize {
        HEADER_LEN + self.data.len()
    }

    fn emit_fields<T: AsRef<[u8]> + AsMut<[u8]>>(
        &self,
        p: &mut Packet<T>,
    ) -> core::result::Result<(), EmitError> {
        if p.buffer.as_ref().len() != self.buffer_len() {
            return Err(EmitError::BufferTooSmall);
        }
        p.set_msg_type(self.msg_type);
        p.set_msg_code(self.code);
        p.set_rest_of_header(self.rest);
        p.data_mut().copy_from_slice(self.data);
        Ok(())
    }

    /// Write an ICMPv4 message with its checksum. The buffer must be exactly
    /// [`IcmpRepr::buffer_len`] bytes (the checksum covers all of it).
    pub fn emit_v4<T: AsRef<[u8]> + AsMut<[u8]>>(
        &self,
        p: &mut Packet<T>,
    ) -> core::result::Result<(), EmitError> {
        self.emit_fields(p)?;
        p.fill_checksum_v4();
        Ok(())
    }

    /// Write an ICMPv6 message with its checksum; the buffer must be exactly
    /// [`IcmpRepr::buffer_len`] bytes.
    pub fn emit_v6<T: AsRef<[u8]> + AsMut<[u8]>>(
        &self,
        p: &mut Packet<T>,
        ip: &IpPair,
    ) -> core::result::Result<(), EmitError> {
        self.emit_fields(p)?;
        p.fill_checksum_v6(ip);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Echo request, id 0x1234, seq 1, data "abcd", checksum precomputed.
    static ECHO: [u8; 12] = [
        8, 0, 0x21, 0x04, 0x12, 0x34, 0x00, 0x01, b'a', b'b', b'c', b'd',
    ];

    #[test]
    fn echo_v4() {
        let p = Packet::new_checked(&ECHO[..]).unwrap();
        assert_eq!(p.v4_type(), Icmpv4Message::EchoRequest);
        assert!(p.v4_type().is_query() && !p.v4_type().is_error());
        assert_eq!((p.echo_ident(), p.echo_seq_no()), (0x1234, 1));
        let r = IcmpRepr::parse_v4(&p).unwrap();
        assert_eq!(r, IcmpRepr::echo_request_v4(0x1234, 1, b"abcd"));
        let mut b = [0u8; 12];
        r.emit_v4(&mut Packet::new_unchecked(&mut b[..])).unwrap();
        assert_eq!(b, ECHO);
    }

    #[test]
    fn echo_v6_checksum() {
        let ip = IpPair::V6 { src: 1, dst: 2 };
        let r = IcmpRepr::echo_request_v6(7, 9, b"xy");
        let mut b = [0u8; 10];
        r.emit_v6(&mut Packet::new_unchecked(&mut b[..]), &ip)
            .unwrap();
        let p = Packet::new_checked(&b[..]).unwrap();
        assert!(p.verify_checksum_v6(&ip));
        assert!(!p.verify_checksum_v6(&IpPair::V6 { src: 1, dst: 3 }));
        assert_eq!(IcmpRepr::parse_v6(&p, &ip).unwrap(), r);
        assert!(p.v6_type().is_query());
        assert!(Icmpv6Message::PktTooBig.is_error());
    }

    #[test]
    fn errors() {
        let mut b = ECHO;
        b[2] ^= 0xff;
        assert_eq!(
            IcmpRepr::parse_v4(&Packet::new_unchecked(&b[..])),
            Err(ParseError::Checksum)
        );
        assert_eq!(
            Packet::new_checked(&ECHO[..7]).err(),
            Some(ParseError::Truncated)
        );
        assert!(Icmpv4Message::from(11).is_error());
        assert_eq!(Icmpv4Message::from(200), Icmpv4Message::Unknown(200));
        let mut small = [0u8; 11];
        let r = IcmpRepr::echo_request_v4(1, 1, b"abcd");
        assert_eq!(
            r.emit_v4(&mut Packet::new_unchecked(&mut small[..])),
            Err(EmitError::BufferTooSmall)
        );
    }
}
