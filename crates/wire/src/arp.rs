//! ARP for Ethernet/IPv4 (RFC 826).

use crate::ethernet::{EtherType, EthernetAddress};
use crate::{be16, EmitError, ParseError, Result};
use core::net::Ipv4Addr;

enum_with_unknown! {
    /// ARP operation codes (RFC 826, RFC 5227).
    pub enum Operation(u16) {
        /// Request.
        Request = 1,
        /// Reply.
        Reply = 2,
    }
}

mod field {
    pub type Field = core::ops::Range<usize>;
    pub const HTYPE: Field = 0..2;
    pub const PTYPE: Field = 2..4;
    pub const HLEN: usize = 4;
    pub const PLEN: usize = 5;
    pub const OPER: Field = 6..8;
    pub const SHA: Field = 8..14;
    pub const SPA: Field = 14..18;
    pub const THA: Field = 18..24;
    pub const TPA: Field = 24..28;
}

/// Length of an Ethernet/IPv4 ARP packet.
pub const PACKET_LEN: usize = field::TPA.end;
/// Hardware type "Ethernet" (RFC 826).
pub const HTYPE_ETHERNET: u16 = 1;

/// A read/write view of an Ethernet/IPv4 ARP packet.
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

    /// Wrap a buffer and check that the fixed 28 bytes fit.
    pub fn new_checked(buffer: T) -> Result<Packet<T>> {
        let p = Self::new_unchecked(buffer);
        p.check_len()?;
        Ok(p)
    }

    /// Ensure no getter will panic.
    pub fn check_len(&self) -> Result<()> {
        if self.buffer.as_ref().len() < PACKET_LEN {
            Err(ParseError::Truncated)
        } else {
            Ok(())
        }
    }

    /// Unwrap the buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// Hardware type.
    pub fn hardware_type(&self) -> u16 {
        be16(arr(&self.buffer.as_ref()[field::HTYPE]))
    }
    /// Protocol type.
    pub fn protocol_type(&self) -> EtherType {
        EtherType::from(be16(arr(&self.buffer.as_ref()[field::PTYPE])))
    }
    /// Hardware address length.
    pub fn hardware_len(&self) -> u8 {
        self.buffer.as_ref()[field::HLEN]
    }
    /// Protocol address length.
    pub fn protocol_len(&self) -> u8 {
        self.buffer.as_ref()[field::PLEN]
    }
    /// Operation.
    pub fn operation(&self) -> Operation {
        Operation::from(be16(arr(&self.buffer.as_ref()[field::OPER])))
    }
    /// Sender hardware address.
    pub fn source_hardware_addr(&self) -> EthernetAddress {
        EthernetAddress(arr(&self.buffer.as_ref()[field::SHA]))
    }
    /// Sender protocol address.
    pub fn source_protocol_addr(&self) -> Ipv4Addr {
        Ipv4Addr::from(arr::<4>(&self.buffer.as_ref()[field::SPA]))
    }
    /// Target hardware address.
    pub fn target_hardware_addr(&self) -> EthernetAddress {
        EthernetAddress(arr(&self.buffer.as_ref()[field::THA]))
    }
    /// Target protocol address.
    pub fn target_protocol_addr(&self) -> Ipv4Addr {
        Ipv4Addr::from(arr::<4>(&self.buffer.as_ref()[field::TPA]))
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Set hardware type.
    pub fn set_hardware_type(&mut self, v: u16) {
        self.buffer.as_mut()[field::HTYPE].copy_from_slice(&v.to_be_bytes());
    }
    /// Set protocol type.
    pub fn set_protocol_type(&mut self, v: EtherType) {
        self.buffer.as_mut()[field::PTYPE].copy_from_slice(&u16::from(v).to_be_bytes());
    }
    /// Set hardware address length.
    pub fn set_hardware_len(&mut self, v: u8) {
        self.buffer.as_mut()[field::HLEN] = v;
    }
    /// Set protocol address length.
    pub fn set_protocol_len(&mut self, v: u8) {
        self.buffer.as_mut()[field::PLEN] = v;
    }
    /// Set operation.
    pub fn set_operation(&mut self, v: Operation) {
        self.buffer.as_mut()[field::OPER].copy_from_slice(&u16::from(v).to_be_bytes());
    }
    /// Set sender hardware address.
    pub fn set_source_hardware_addr(&mut self, a: EthernetAddress) {
        self.buffer.as_mut()[field::SHA].copy_from_slice(&a.0);
    }
    /// Set sender protocol address.
    pub fn set_source_protocol_addr(&mut self, a: Ipv4Addr) {
        self.buffer.as_mut()[field::SPA].copy_from_slice(&a.octets());
    }
    /// Set target hardware address.
    pub fn set_target_hardware_addr(&mut self, a: EthernetAddress) {
        self.buffer.as_mut()[field::THA].copy_from_slice(&a.0);
    }
    /// Set target protocol address.
    pub fn set_target_protocol_addr(&mut self, a: Ipv4Addr) {
        self.buffer.as_mut()[field::TPA].copy_from_slice(&a.octets());
    }
}

/// An Ethernet/IPv4 ARP message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ArpRepr {
    /// Operation.
    pub operation: Operation,
    /// Sender hardware address.
    pub source_hardware_addr: EthernetAddress,
    /// Sender protocol address.
    pub source_protocol_addr: Ipv4Addr,
    /// Target hardware address.
    pub target_hardware_addr: EthernetAddress,
    /// Target protocol address.
    pub target_protocol_addr: Ipv4Addr,
}

impl ArpRepr {
    /// Parse; anything but Ethernet (htype 1, hlen 6) / IPv4 (ptype 0x0800,
    /// plen 4) is [`ParseError::ArpFormat`].
    pub fn parse<T: AsRef<[u8]>>(p: &Packet<T>) -> Result<ArpRepr> {
        p.check_len()?;
        if p.hardware_type() != HTYPE_ETHERNET
            || p.protocol_type() != EtherType::Ipv4
            || p.hardware_len() != 6
            || p.protocol_len() != 4
        {
            return Err(ParseError::ArpFormat);
        }
        Ok(ArpRepr {
            operation: p.operation(),
            source_hardware_addr: p.source_hardware_addr(),
            source_protocol_addr: p.source_protocol_addr(),
            target_hardware_addr: p.target_hardware_addr(),
            target_protocol_addr: p.target_protocol_addr(),
        })
    }

    /// Always 28.
    pub const fn buffer_len(&self) -> usize {
        PACKET_LEN
    }

    /// Write the packet.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(
        &self,
        p: &mut Packet<T>,
    ) -> core::result::Result<(), EmitError> {
        if p.check_len().is_err() {
            return Err(EmitError::BufferTooSmall);
        }
        p.set_hardware_type(HTYPE_ETHERNET);
        p.set_protocol_type(EtherType::Ipv4);
        p.set_hardware_len(6);
        p.set_protocol_len(4);
        p.set_operation(self.operation);
        p.set_source_hardware_addr(self.source_hardware_addr);
        p.set_source_protocol_addr(self.source_protocol_addr);
        p.set_target_hardware_addr(self.target_hardware_addr);
        p.set_target_protocol_addr(self.target_protocol_addr);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    static REQUEST: [u8; 28] = [
        0x00, 0x01, 0x08, 0x00, 0x06, 0x04, 0x00, 0x01, // eth/ipv4 request
        0x02, 0x00, 0x00, 0x00, 0x00, 0x01, 10, 0, 0, 1, // sender
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 10, 0, 0, 2, // target
    ];

    #[test]
    fn parse_emit_roundtrip() {
        let r = ArpRepr::parse(&Packet::new_checked(&REQUEST[..]).unwrap()).unwrap();
        assert_eq!(r.operation, Operation::Request);
        assert_eq!(r.source_protocol_addr, Ipv4Addr::new(10, 0, 0, 1));
        assert_eq!(r.target_protocol_addr, Ipv4Addr::new(10, 0, 0, 2));
        let mut buf = [0u8; 28];
        r.emit(&mut Packet::new_unchecked(&mut buf[..])).unwrap();
        assert_eq!(buf, REQUEST);
    }

    #[test]
    fn rejects_non_ethernet_ipv4() {
        let mut b = REQUEST;
        b[5] = 16;
        assert_eq!(
            ArpRepr::parse(&Packet::new_unchecked(&b[..])),
            Err(ParseError::ArpFormat)
        );
        assert_eq!(
            Packet::new_checked(&REQUEST[..27]).err(),
            Some(ParseError::Truncated)
        );
    }
}
