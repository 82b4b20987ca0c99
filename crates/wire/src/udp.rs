//! UDP (RFC 768).

use crate::checksum;
use crate::ip::IpPair;
use crate::{EmitError, ParseError, Result};

mod field {
    pub type Field = core::ops::Range<usize>;
    pub const SRC_PORT: Field = 0..2;
    pub const DST_PORT: Field = 2..4;
    pub const LENGTH: Field = 4..6;
    pub const CHECKSUM: Field = 6..8;
}

/// Length of the UDP header.
pub const HEADER_LEN: usize = field::CHECKSUM.end;

fn get16(b: &[u8], r: field::Field) -> u16 {
    let mut o = [0u8; 2];
    o.copy_from_slice(&b[r]);
    u16::from_be_bytes(o)
}

/// A read/write view of a UDP datagram.
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

    /// Ensure no getter will panic: the header fits and `8 ≤ length ≤ buffer`.
    pub fn check_len(&self) -> Result<()> {
        let len = self.buffer.as_ref().len();
        if len < HEADER_LEN {
            return Err(ParseError::Truncated);
        }
        let l = usize::from(self.len());
        if l < HEADER_LEN || l > len {
            return Err(ParseError::UdpLength);
        }
        Ok(())
    }

    /// Unwrap the buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// Source port.
    pub fn src_port(&self) -> u16 {
        get16(self.buffer.as_ref(), field::SRC_PORT)
    }
    /// Destination port.
    pub fn dst_port(&self) -> u16 {
        get16(self.buffer.as_ref(), field::DST_PORT)
    }
    /// Length field (header included).
    pub fn len(&self) -> u16 {
        get16(self.buffer.as_ref(), field::LENGTH)
    }
    /// Whether the length field says "header only".
    pub fn is_empty(&self) -> bool {
        usize::from(self.len()) <= HEADER_LEN
    }
    /// Checksum field (0: none, IPv4 only).
    pub fn checksum(&self) -> u16 {
        get16(self.buffer.as_ref(), field::CHECKSUM)
    }
    /// The payload up to the length field (empty if out of range).
    pub fn payload(&self) -> &[u8] {
        self.buffer
            .as_ref()
            .get(HEADER_LEN..usize::from(self.len()))
            .unwrap_or(&[])
    }
    /// Whether the checksum verifies against the pseudo-header. A zero
    /// checksum over IPv4 means "not computed" and verifies (RFC 768); over
    /// IPv6 it is invalid (RFC 8200 §8.1).
    pub fn verify_checksum(&self, ip: &IpPair) -> bool {
        if self.checksum() == 0 {
            return matches!(ip, IpPair::V4 { .. });
        }
        let Some(d) = self.buffer.as_ref().get(..usize::from(self.len())) else {
            return false;
        };
        let s = checksum::add(ip.pseudo_sum(17, u32::from(self.len())), checksum::sum(d));
        checksum::fold(s) == 0xffff
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
    /// Set the length field.
    pub fn set_len(&mut self, v: u16) {
        self.buffer.as_mut()[field::LENGTH].copy_from_slice(&v.to_be_bytes());
    }
    /// Set the checksum field.
    pub fn set_checksum(&mut self, v: u16) {
        self.buffer.as_mut()[field::CHECKSUM].copy_from_slice(&v.to_be_bytes());
    }
    /// Compute the checksum over header and payload (up to the length field)
    /// with the pseudo-header; a computed zero is sent as `0xffff` (RFC 768).
    pub fn fill_checksum(&mut self, ip: &IpPair) {
        self.set_checksum(0);
        let len = self.len();
        let s = match self.buffer.as_ref().get(..usize::from(len)) {
            Some(d) => checksum::add(ip.pseudo_sum(17, u32::from(len)), checksum::sum(d)),
            None => return,
        };
        let c = match checksum::finish(s) {
            0 => 0xffff,
            c => c,
        };
        self.set_checksum(c);
    }
    /// Mutable payload.
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let end = usize::from(self.len());
        self.buffer
            .as_mut()
            .get_mut(HEADER_LEN..end)
            .unwrap_or(&mut [])
    }
}

/// A UDP header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct UdpRepr {
    /// Source port.
    pub src_port: u16,
    /// Destination port.
    pub dst_port: u16,
    /// Payload length.
    pub payload_len: usize,
}

impl UdpRepr {
    /// Parse; if `ip` is given, the checksum must verify.
    pub fn parse<T: AsRef<[u8]>>(p: &Packet<T>, ip: Option<&IpPair>) -> Result<UdpRepr> {
        p.check_len()?;
        if let Some(ip) = ip {
            if !p.verify_checksum(ip) {
                return Err(ParseError::Checksum);
            }
        }
        Ok(UdpRepr {
            src_port: p.src_port(),
            dst_port: p.dst_port(),
            payload_len: usize::from(p.len()) - HEADER_LEN,
        })
    }

    /// Header length: 8.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Write the header. The payload must already be in place after it: with
    /// `ip` given, the checksum is computed over it; without, it is zero
    /// ("none", IPv4 only).
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(
        &self,
        p: &mut Packet<T>,
        ip: Option<&IpPair>,
    ) -> core::result::Result<(), EmitError> {
        let total = HEADER_LEN + self.payload_len;
        let len = u16::try_from(total).map_err(|_| EmitError::PayloadTooLarge)?;
        if p.buffer.as_ref().len() < total {
            return Err(EmitError::BufferTooSmall);
        }
        p.set_src_port(self.src_port);
        p.set_dst_port(self.dst_port);
        p.set_len(len);
        match ip {
            Some(ip) => p.fill_checksum(ip),
            None => p.set_checksum(0),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const IP: IpPair = IpPair::V4 {
        src: 0xc0a8_0001,
        dst: 0xc0a8_00c7,
    };

    /// 1234 -> 53, 4 bytes of payload, checksum computed by hand.
    static DGRAM: [u8; 12] = [
        0x04, 0xd2, 0x00, 0x35, 0x00, 0x0c, 0x00, 0x00, 0xde, 0xad, 0xbe, 0xef,
    ];

    #[test]
    fn fill_and_verify() {
        let mut b = DGRAM;
        let mut p = Packet::new_checked(&mut b[..]).unwrap();
        p.fill_checksum(&IP);
        assert!(p.verify_checksum(&IP));
        // Reference: RFC 1071 over pseudo-header + datagram.
        let mut all = vec![0xc0, 0xa8, 0, 1, 0xc0, 0xa8, 0, 0xc7, 0, 17, 0, 12];
        all.extend_from_slice(&DGRAM);
        assert_eq!(p.checksum(), checksum::checksum(&all));
        let r = UdpRepr::parse(&p, Some(&IP)).unwrap();
        assert_eq!(
            r,
            UdpRepr {
                src_port: 1234,
                dst_port: 53,
                payload_len: 4
            }
        );
        assert_eq!(p.payload(), &[0xde, 0xad, 0xbe, 0xef]);
    }

    #[test]
    fn zero_checksum() {
        let p = Packet::new_checked(&DGRAM[..]).unwrap();
        assert!(p.verify_checksum(&IP));
        assert!(!p.verify_checksum(&IpPair::V6 { src: 1, dst: 2 }));
    }

    #[test]
    fn lengths() {
        assert_eq!(
            Packet::new_checked(&DGRAM[..7]).err(),
            Some(ParseError::Truncated)
        );
        assert_eq!(
            Packet::new_checked(&DGRAM[..11]).err(),
            Some(ParseError::UdpLength)
        );
        let mut b = DGRAM;
        b[5] = 7;
        assert_eq!(
            Packet::new_checked(&b[..]).err(),
            Some(ParseError::UdpLength)
        );
    }

    #[test]
    fn emit_roundtrip() {
        let mut b = DGRAM;
        let r = UdpRepr {
            src_port: 1234,
            dst_port: 53,
            payload_len: 4,
        };
        r.emit(&mut Packet::new_unchecked(&mut b[..]), Some(&IP))
            .unwrap();
        assert!(Packet::new_checked(&b[..]).unwrap().verify_checksum(&IP));
        assert_eq!(
            r.emit(&mut Packet::new_unchecked(&mut b[..11]), None),
            Err(EmitError::BufferTooSmall)
        );
    }
}
