//! Ethernet II frames (IEEE 802.3 clause 3.2.6 type field) and IEEE 802.1Q
//! VLAN tags, including 802.1ad (QinQ) S-tags.
//!
//! Frames are handled without the FCS, as the NIC delivers them.

use crate::{be16, EmitError, ParseError, Result};
use core::fmt;

enum_with_unknown! {
    /// EtherType values (IEEE registry).
    pub enum EtherType(u16) {
        /// IPv4 (RFC 894).
        Ipv4 = 0x0800,
        /// ARP (RFC 826).
        Arp = 0x0806,
        /// IEEE 802.1Q customer VLAN tag.
        Vlan = 0x8100,
        /// IPv6 (RFC 2464).
        Ipv6 = 0x86dd,
        /// IEEE 802.1ad service VLAN tag (QinQ).
        QinQ = 0x88a8,
    }
}

impl EtherType {
    /// Whether this type introduces a VLAN tag.
    #[inline]
    pub fn is_vlan(self) -> bool {
        matches!(self, EtherType::Vlan | EtherType::QinQ)
    }
}

/// A six-octet Ethernet MAC address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct EthernetAddress(pub [u8; 6]);

impl EthernetAddress {
    /// The broadcast address `ff:ff:ff:ff:ff:ff`.
    pub const BROADCAST: EthernetAddress = EthernetAddress([0xff; 6]);

    /// Whether the group (I/G) bit is set.
    pub fn is_multicast(&self) -> bool {
        self.0[0] & 1 != 0
    }

    /// Whether this is the broadcast address.
    pub fn is_broadcast(&self) -> bool {
        *self == Self::BROADCAST
    }

    /// The raw octets.
    pub fn as_bytes(&self) -> &[u8; 6] {
        &self.0
    }
}

impl From<[u8; 6]> for EthernetAddress {
    fn from(b: [u8; 6]) -> Self {
        EthernetAddress(b)
    }
}

impl fmt::Display for EthernetAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.0;
        write!(
            f,
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            b[0], b[1], b[2], b[3], b[4], b[5]
        )
    }
}

mod field {
    pub type Field = core::ops::Range<usize>;
    pub const DESTINATION: Field = 0..6;
    pub const SOURCE: Field = 6..12;
    pub const ETHERTYPE: Field = 12..14;
    pub const PAYLOAD: usize = 14;
    /// Inside a VLAN tag: priority, DEI, VLAN id.
    pub const TCI: Field = 0..2;
    /// Inside a VLAN tag: the encapsulated type.
    pub const INNER_TYPE: Field = 2..4;
}

/// Length of the Ethernet II header without tags.
pub const HEADER_LEN: usize = field::PAYLOAD;
/// Length of one VLAN tag.
pub const VLAN_TAG_LEN: usize = 4;
/// Minimum frame length without FCS (IEEE 802.3: 64 bytes with FCS).
pub const MIN_FRAME_LEN: usize = 60;

fn get2(b: &[u8], r: field::Field) -> [u8; 2] {
    let mut o = [0u8; 2];
    o.copy_from_slice(&b[r]);
    o
}

/// A read/write view of an Ethernet II frame.
#[derive(Debug, Clone)]
pub struct Frame<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Frame<T> {
    /// Wrap a buffer without checking its length.
    pub const fn new_unchecked(buffer: T) -> Frame<T> {
        Frame { buffer }
    }

    /// Wrap a buffer and check that the header fits.
    pub fn new_checked(buffer: T) -> Result<Frame<T>> {
        let f = Self::new_unchecked(buffer);
        f.check_len()?;
        Ok(f)
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

    /// Header length (no tags: the tag, if any, is part of the payload).
    pub const fn header_len() -> usize {
        HEADER_LEN
    }

    /// Destination address.
    pub fn dst_addr(&self) -> EthernetAddress {
        let mut a = [0u8; 6];
        a.copy_from_slice(&self.buffer.as_ref()[field::DESTINATION]);
        EthernetAddress(a)
    }

    /// Source address.
    pub fn src_addr(&self) -> EthernetAddress {
        let mut a = [0u8; 6];
        a.copy_from_slice(&self.buffer.as_ref()[field::SOURCE]);
        EthernetAddress(a)
    }

    /// The type field (a TPID when the frame is tagged).
    pub fn ethertype(&self) -> EtherType {
        EtherType::from(be16(get2(self.buffer.as_ref(), field::ETHERTYPE)))
    }

    /// Everything after the 14-byte header.
    pub fn payload(&self) -> &[u8] {
        self.buffer.as_ref().get(field::PAYLOAD..).unwrap_or(&[])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Frame<T> {
    /// Set the destination address.
    pub fn set_dst_addr(&mut self, a: EthernetAddress) {
        self.buffer.as_mut()[field::DESTINATION].copy_from_slice(&a.0);
    }

    /// Set the source address.
    pub fn set_src_addr(&mut self, a: EthernetAddress) {
        self.buffer.as_mut()[field::SOURCE].copy_from_slice(&a.0);
    }

    /// Set the type field.
    pub fn set_ethertype(&mut self, t: EtherType) {
        self.buffer.as_mut()[field::ETHERTYPE].copy_from_slice(&u16::from(t).to_be_bytes());
    }

    /// Mutable payload.
    pub fn payload_mut(&mut self) -> &mut [u8] {
        self.buffer
            .as_mut()
            .get_mut(field::PAYLOAD..)
            .unwrap_or(&mut [])
    }
}

/// A read/write view of one 4-byte VLAN tag (IEEE 802.1Q §9.6), starting
/// after the TPID: tag control information, then the encapsulated type.
#[derive(Debug, Clone)]
pub struct VlanTag<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> VlanTag<T> {
    /// Wrap a buffer without checking its length.
    pub const fn new_unchecked(buffer: T) -> VlanTag<T> {
        VlanTag { buffer }
    }

    /// Wrap a buffer and check that the tag fits.
    pub fn new_checked(buffer: T) -> Result<VlanTag<T>> {
        let t = Self::new_unchecked(buffer);
        t.check_len()?;
        Ok(t)
    }

    /// Ensure no getter will panic.
    pub fn check_len(&self) -> Result<()> {
        if self.buffer.as_ref().len() < VLAN_TAG_LEN {
            Err(ParseError::Truncated)
        } else {
            Ok(())
        }
    }

    /// Unwrap the buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    fn tci(&self) -> u16 {
        be16(get2(self.buffer.as_ref(), field::TCI))
    }

    /// Priority code point (3 bits).
    pub fn pcp(&self) -> u8 {
        (self.tci() >> 13) as u8
    }

    /// Drop eligible indicator.
    pub fn dei(&self) -> bool {
        self.tci() & 0x1000 != 0
    }

    /// VLAN identifier (12 bits).
    pub fn vid(&self) -> u16 {
        self.tci() & 0x0fff
    }

    /// The encapsulated type.
    pub fn ethertype(&self) -> EtherType {
        EtherType::from(be16(get2(self.buffer.as_ref(), field::INNER_TYPE)))
    }

    /// Everything after the tag.
    pub fn payload(&self) -> &[u8] {
        self.buffer.as_ref().get(VLAN_TAG_LEN..).unwrap_or(&[])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> VlanTag<T> {
    /// Set priority, DEI and VLAN id (`vid` is masked to 12 bits).
    pub fn set_tci(&mut self, pcp: u8, dei: bool, vid: u16) {
        let tci = (u16::from(pcp & 7) << 13) | (u16::from(dei) << 12) | (vid & 0x0fff);
        self.buffer.as_mut()[field::TCI].copy_from_slice(&tci.to_be_bytes());
    }

    /// Set the encapsulated type.
    pub fn set_ethertype(&mut self, t: EtherType) {
        self.buffer.as_mut()[field::INNER_TYPE].copy_from_slice(&u16::from(t).to_be_bytes());
    }
}

/// An Ethernet II header, optionally with one 802.1Q tag.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct EthernetRepr {
    /// Source address.
    pub src_addr: EthernetAddress,
    /// Destination address.
    pub dst_addr: EthernetAddress,
    /// VLAN id of a single 802.1Q tag (priority 0), if any.
    pub vlan: Option<u16>,
    /// Type of the payload (after the tag, if any).
    pub ethertype: EtherType,
}

impl EthernetRepr {
    /// Parse the header and, if the type is 0x8100, one 802.1Q tag. Other
    /// tag types (QinQ) are left in `ethertype`; walk them with [`VlanTag`].
    pub fn parse<T: AsRef<[u8]>>(frame: &Frame<T>) -> Result<EthernetRepr> {
        frame.check_len()?;
        let mut ethertype = frame.ethertype();
        let mut vlan = None;
        if ethertype == EtherType::Vlan {
            let tag = VlanTag::new_checked(frame.payload())?;
            vlan = Some(tag.vid());
            ethertype = tag.ethertype();
        }
        Ok(EthernetRepr {
            src_addr: frame.src_addr(),
            dst_addr: frame.dst_addr(),
            vlan,
            ethertype,
        })
    }

    /// Header length, tag included.
    pub fn buffer_len(&self) -> usize {
        HEADER_LEN + if self.vlan.is_some() { VLAN_TAG_LEN } else { 0 }
    }

    /// Write the header (and tag) at the start of `frame`.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(
        &self,
        frame: &mut Frame<T>,
    ) -> core::result::Result<(), EmitError> {
        if frame.buffer.as_ref().len() < self.buffer_len() {
            return Err(EmitError::BufferTooSmall);
        }
        frame.set_src_addr(self.src_addr);
        frame.set_dst_addr(self.dst_addr);
        match self.vlan {
            None => frame.set_ethertype(self.ethertype),
            Some(vid) => {
                frame.set_ethertype(EtherType::Vlan);
                let mut tag = VlanTag::new_unchecked(frame.payload_mut());
                tag.set_tci(0, false, vid);
                tag.set_ethertype(self.ethertype);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    static TAGGED: [u8; 22] = [
        0x02, 0, 0, 0, 0, 0x02, // dst
        0x02, 0, 0, 0, 0, 0x01, // src
        0x81, 0x00, 0xa0, 0x64, // 802.1Q, pcp 5, vid 100
        0x08, 0x00, // IPv4
        0x45, 0x00, 0x00, 0x14,
    ];

    #[test]
    fn parse_tagged() {
        let f = Frame::new_checked(&TAGGED[..]).unwrap();
        assert_eq!(f.ethertype(), EtherType::Vlan);
        assert_eq!(f.src_addr().to_string(), "02:00:00:00:00:01");
        let tag = VlanTag::new_checked(f.payload()).unwrap();
        assert_eq!((tag.pcp(), tag.dei(), tag.vid()), (5, false, 100));
        assert_eq!(tag.ethertype(), EtherType::Ipv4);
        let r = EthernetRepr::parse(&f).unwrap();
        assert_eq!(r.vlan, Some(100));
        assert_eq!(r.ethertype, EtherType::Ipv4);
        assert_eq!(r.buffer_len(), 18);
    }

    #[test]
    fn emit_roundtrip() {
        let r = EthernetRepr {
            src_addr: EthernetAddress([2, 0, 0, 0, 0, 1]),
            dst_addr: EthernetAddress([2, 0, 0, 0, 0, 2]),
            vlan: Some(100),
            ethertype: EtherType::Ipv4,
        };
        let mut buf = [0u8; 18];
        r.emit(&mut Frame::new_unchecked(&mut buf[..])).unwrap();
        assert_eq!(&buf[..12], &TAGGED[..12]);
        assert_eq!(&buf[12..14], &[0x81, 0x00]);
        assert_eq!(
            EthernetRepr::parse(&Frame::new_unchecked(&buf[..])).unwrap(),
            r
        );
        let mut short = [0u8; 17];
        assert_eq!(
            r.emit(&mut Frame::new_unchecked(&mut short[..])),
            Err(EmitError::BufferTooSmall)
        );
    }

    #[test]
    fn short_and_enum() {
        assert_eq!(
            Frame::new_checked(&TAGGED[..13]).err(),
            Some(ParseError::Truncated)
        );
        assert_eq!(EtherType::from(0x1234), EtherType::Unknown(0x1234));
        assert_eq!(u16::from(EtherType::QinQ), 0x88a8);
        assert!(EtherType::from(0x88a8).is_vlan());
    }
}
