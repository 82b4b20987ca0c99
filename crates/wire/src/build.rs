//! Frame builders for tests and the traffic generator.
//!
//! Each builder writes a complete, untagged Ethernet II frame into `buf`
//! with correct IPv4 and L4 checksums (IPv4: TTL 64, identification 0, DF
//! clear) and returns its length. Frames shorter than the 60-byte Ethernet
//! minimum (64 with FCS, IEEE 802.3 §4.2.3.3) are zero-padded to 60; the IP
//! total length does not count the padding. Payload bytes are zero; a caller
//! that writes its own payload afterwards must refill the L4 checksum
//! (through the [`crate::udp`] / [`crate::tcp`] / [`crate::icmp`] views).

use crate::ethernet::{self, EtherType, EthernetAddress, EthernetRepr, Frame, MIN_FRAME_LEN};
use crate::flow::{proto, FlowKey4, FlowKey6};
use crate::icmp::{self, Icmpv4Message};
use crate::ip::{IpPair, IpProtocol};
use crate::ipv4::{self, Ipv4Repr};
use crate::ipv6::{self, Ipv6Repr};
use crate::tcp::{self, TcpRepr};
use crate::udp::{self, UdpRepr};
use crate::EmitError;

type Res = Result<usize, EmitError>;

/// Write Ethernet + IPv4 headers for an `l4_len`-byte payload, zero the L4
/// area and the padding. Returns (L4 offset, frame length).
fn eth_ipv4(
    buf: &mut [u8],
    src_mac: EthernetAddress,
    dst_mac: EthernetAddress,
    src: u32,
    dst: u32,
    protocol: u8,
    l4_len: usize,
) -> Result<(usize, usize), EmitError> {
    let l4_off = ethernet::HEADER_LEN + ipv4::HEADER_LEN;
    let end = l4_off
        .checked_add(l4_len)
        .ok_or(EmitError::PayloadTooLarge)?;
    if ipv4::HEADER_LEN + l4_len > usize::from(u16::MAX) {
        return Err(EmitError::PayloadTooLarge);
    }
    let flen = end.max(MIN_FRAME_LEN);
    let frame = buf.get_mut(..flen).ok_or(EmitError::BufferTooSmall)?;
    frame[l4_off..].fill(0);
    let eth = EthernetRepr {
        src_addr: src_mac,
        dst_addr: dst_mac,
        vlan: None,
        ethertype: EtherType::Ipv4,
    };
    eth.emit(&mut Frame::new_unchecked(&mut *frame))?;
    let ip = Ipv4Repr::new(src.into(), dst.into(), IpProtocol::from(protocol), l4_len);
    ip.emit(&mut ipv4::Packet::new_unchecked(
        &mut frame[ethernet::HEADER_LEN..end],
    ))?;
    Ok((l4_off, flen))
}

/// Write Ethernet + IPv6 headers (hop limit 64, no extension headers).
fn eth_ipv6(
    buf: &mut [u8],
    src_mac: EthernetAddress,
    dst_mac: EthernetAddress,
    src: u128,
    dst: u128,
    protocol: u8,
    l4_len: usize,
) -> Result<(usize, usize), EmitError> {
    let l4_off = ethernet::HEADER_LEN + ipv6::HEADER_LEN;
    let end = l4_off
        .checked_add(l4_len)
        .ok_or(EmitError::PayloadTooLarge)?;
    let flen = end.max(MIN_FRAME_LEN);
    let frame = buf.get_mut(..flen).ok_or(EmitError::BufferTooSmall)?;
    frame[l4_off..].fill(0);
    let eth = EthernetRepr {
        src_addr: src_mac,
        dst_addr: dst_mac,
        vlan: None,
        ethertype: EtherType::Ipv6,
    };
    eth.emit(&mut Frame::new_unchecked(&mut *frame))?;
    let ip = Ipv6Repr {
        src_addr: src.into(),
        dst_addr: dst.into(),
        next_header: IpProtocol::from(protocol),
        payload_len: l4_len,
        hop_limit: 64,
        traffic_class: 0,
        flow_label: 0,
    };
    ip.emit(&mut ipv6::Packet::new_unchecked(
        &mut frame[ethernet::HEADER_LEN..end],
    ))?;
    Ok((l4_off, flen))
}

/// Eth + IPv4 + UDP from `key` (its `proto` is ignored), `payload_len` zero
/// bytes, UDP checksum filled in. Returns the frame length (≥ 60).
pub fn build_udp4(
    buf: &mut [u8],
    src_mac: impl Into<EthernetAddress>,
    dst_mac: impl Into<EthernetAddress>,
    key: &FlowKey4,
    payload_len: usize,
) -> Res {
    let ulen = udp::HEADER_LEN + payload_len;
    let (l4, flen) = eth_ipv4(
        buf,
        src_mac.into(),
        dst_mac.into(),
        key.src,
        key.dst,
        proto::UDP,
        ulen,
    )?;
    let seg = buf
        .get_mut(l4..l4 + ulen)
        .ok_or(EmitError::BufferTooSmall)?;
    let r = UdpRepr {
        src_port: key.sport,
        dst_port: key.dport,
        payload_len,
    };
    r.emit(
        &mut udp::Packet::new_unchecked(seg),
        Some(&IpPair::V4 {
            src: key.src,
            dst: key.dst,
        }),
    )?;
    Ok(flen)
}

/// Eth + IPv4 + TCP (20-byte header, window 65535) with `flags` (see
/// [`crate::tcp::flags`]), sequence and acknowledgment numbers.
#[allow(clippy::too_many_arguments)]
pub fn build_tcp4(
    buf: &mut [u8],
    src_mac: impl Into<EthernetAddress>,
    dst_mac: impl Into<EthernetAddress>,
    key: &FlowKey4,
    flags: u8,
    seq: u32,
    ack: u32,
    payload_len: usize,
) -> Res {
    let tlen = tcp::HEADER_LEN + payload_len;
    let (l4, flen) = eth_ipv4(
        buf,
        src_mac.into(),
        dst_mac.into(),
        key.src,
        key.dst,
        proto::TCP,
        tlen,
    )?;
    let seg = buf
        .get_mut(l4..l4 + tlen)
        .ok_or(EmitError::BufferTooSmall)?;
    let r = TcpRepr {
        src_port: key.sport,
        dst_port: key.dport,
        seq_number: seq,
        ack_number: ack,
        flags,
        window_len: 0xffff,
        urgent_at: 0,
        options: &[],
        payload_len,
    };
    r.emit(
        &mut tcp::Packet::new_unchecked(seg),
        Some(&IpPair::V4 {
            src: key.src,
            dst: key.dst,
        }),
    )?;
    Ok(flen)
}

/// Eth + IPv4 + ICMP echo request (or reply) with identifier `key.sport`,
/// sequence number `seq` and `payload_len` zero bytes of data.
pub fn build_icmp4_echo(
    buf: &mut [u8],
    src_mac: impl Into<EthernetAddress>,
    dst_mac: impl Into<EthernetAddress>,
    key: &FlowKey4,
    seq: u16,
    request: bool,
    payload_len: usize,
) -> Res {
    let ilen = icmp::HEADER_LEN + payload_len;
    let (l4, flen) = eth_ipv4(
        buf,
        src_mac.into(),
        dst_mac.into(),
        key.src,
        key.dst,
        proto::ICMP,
        ilen,
    )?;
    let seg = buf
        .get_mut(l4..l4 + ilen)
        .ok_or(EmitError::BufferTooSmall)?;
    let ty = if request {
        Icmpv4Message::EchoRequest
    } else {
        Icmpv4Message::EchoReply
    };
    let mut p = icmp::Packet::new_unchecked(seg);
    p.set_msg_type(ty.into());
    p.set_msg_code(0);
    p.set_echo_ident(key.sport);
    p.set_echo_seq_no(seq);
    p.fill_checksum_v4();
    Ok(flen)
}

/// Eth + IPv4 + ICMP error (`ty`/`code`, `rest` = bytes 4..8, e.g. the MTU
/// for "fragmentation needed") from `src` to `dst`, quoting `quoted` (an IP
/// packet from its header on, possibly truncated).
#[allow(clippy::too_many_arguments)]
pub fn build_icmp4_error(
    buf: &mut [u8],
    src_mac: impl Into<EthernetAddress>,
    dst_mac: impl Into<EthernetAddress>,
    src: u32,
    dst: u32,
    ty: u8,
    code: u8,
    rest: u32,
    quoted: &[u8],
) -> Res {
    let r = icmp::IcmpRepr::error(ty, code, rest, quoted);
    let ilen = r.buffer_len();
    let (l4, flen) = eth_ipv4(
        buf,
        src_mac.into(),
        dst_mac.into(),
        src,
        dst,
        proto::ICMP,
        ilen,
    )?;
    let seg = buf
        .get_mut(l4..l4 + ilen)
        .ok_or(EmitError::BufferTooSmall)?;
    r.emit_v4(&mut icmp::Packet::new_unchecked(seg))?;
    Ok(flen)
}

/// Eth + IPv6 + UDP from `key`, `payload_len` zero bytes, checksum filled in.
pub fn build_udp6(
    buf: &mut [u8],
    src_mac: impl Into<EthernetAddress>,
    dst_mac: impl Into<EthernetAddress>,
    key: &FlowKey6,
    payload_len: usize,
) -> Res {
    let ulen = udp::HEADER_LEN + payload_len;
    let (l4, flen) = eth_ipv6(
        buf,
        src_mac.into(),
        dst_mac.into(),
        key.src,
        key.dst,
        proto::UDP,
        ulen,
    )?;
    let seg = buf
        .get_mut(l4..l4 + ulen)
        .ok_or(EmitError::BufferTooSmall)?;
    let r = UdpRepr {
        src_port: key.sport,
        dst_port: key.dport,
        payload_len,
    };
    r.emit(
        &mut udp::Packet::new_unchecked(seg),
        Some(&IpPair::V6 {
            src: key.src,
            dst: key.dst,
        }),
    )?;
    Ok(flen)
}

/// Eth + IPv6 + TCP (20-byte header) with `flags`.
#[allow(clippy::too_many_arguments)]
pub fn build_tcp6(
    buf: &mut [u8],
    src_mac: impl Into<EthernetAddress>,
    dst_mac: impl Into<EthernetAddress>,
    key: &FlowKey6,
    flags: u8,
    seq: u32,
    ack: u32,
    payload_len: usize,
) -> Res {
    let tlen = tcp::HEADER_LEN + payload_len;
    let (l4, flen) = eth_ipv6(
        buf,
        src_mac.into(),
        dst_mac.into(),
        key.src,
        key.dst,
        proto::TCP,
        tlen,
    )?;
    let seg = buf
        .get_mut(l4..l4 + tlen)
        .ok_or(EmitError::BufferTooSmall)?;
    let r = TcpRepr {
        src_port: key.sport,
        dst_port: key.dport,
        seq_number: seq,
        ack_number: ack,
        flags,
        window_len: 0xffff,
        urgent_at: 0,
        options: &[],
        payload_len,
    };
    r.emit(
        &mut tcp::Packet::new_unchecked(seg),
        Some(&IpPair::V6 {
            src: key.src,
            dst: key.dst,
        }),
    )?;
    Ok(flen)
}

/// Eth + IPv6 + ICMPv6 echo request (or reply) with identifier `key.sport`,
/// sequence number `seq` and `payload_len` zero bytes of data.
pub fn build_icmp6_echo(
    buf: &mut [u8],
    src_mac: impl Into<EthernetAddress>,
    dst_mac: impl Into<EthernetAddress>,
    key: &FlowKey6,
    seq: u16,
    request: bool,
    payload_len: usize,
) -> Res {
    let ilen = icmp::HEADER_LEN + payload_len;
    let (l4, flen) = eth_ipv6(
        buf,
        src_mac.into(),
        dst_mac.into(),
        key.src,
        key.dst,
        proto::ICMPV6,
        ilen,
    )?;
    let seg = buf
        .get_mut(l4..l4 + ilen)
        .ok_or(EmitError::BufferTooSmall)?;
    let mut p = icmp::Packet::new_unchecked(seg);
    p.set_msg_type(if request { 128 } else { 129 });
    p.set_msg_code(0);
    p.set_echo_ident(key.sport);
    p.set_echo_seq_no(seq);
    p.fill_checksum_v6(&IpPair::V6 {
        src: key.src,
        dst: key.dst,
    });
    Ok(flen)
}

/// Eth + IPv6 + ICMPv6 error (`ty` < 128) from `src` to `dst` quoting
/// `quoted`.
#[allow(clippy::too_many_arguments)]
pub fn build_icmp6_error(
    buf: &mut [u8],
    src_mac: impl Into<EthernetAddress>,
    dst_mac: impl Into<EthernetAddress>,
    src: u128,
    dst: u128,
    ty: u8,
    code: u8,
    rest: u32,
    quoted: &[u8],
) -> Res {
    let r = icmp::IcmpRepr::error(ty, code, rest, quoted);
    let ilen = r.buffer_len();
    let (l4, flen) = eth_ipv6(
        buf,
        src_mac.into(),
        dst_mac.into(),
        src,
        dst,
        proto::ICMPV6,
        ilen,
    )?;
    let seg = buf
        .get_mut(l4..l4 + ilen)
        .ok_or(EmitError::BufferTooSmall)?;
    r.emit_v6(
        &mut icmp::Packet::new_unchecked(seg),
        &IpPair::V6 { src, dst },
    )?;
    Ok(flen)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checksum;
    use crate::dissect::{dissect, InnerKey, Net, L4};
    use core::net::Ipv4Addr;

    const A: EthernetAddress = EthernetAddress([2, 0, 0, 0, 0, 1]);
    const B: EthernetAddress = EthernetAddress([2, 0, 0, 0, 0, 2]);

    fn key() -> FlowKey4 {
        FlowKey4::new(
            proto::UDP,
            Ipv4Addr::new(10, 0, 0, 1),
            1024,
            Ipv4Addr::new(198, 18, 0, 1),
            7,
        )
    }

    #[test]
    fn udp4_is_a_valid_64_byte_frame() {
        // 14 + 20 + 8 + 18 = 60 bytes without FCS, 64 with.
        let mut buf = [0xaau8; 128];
        let n = build_udp4(&mut buf, A, B, &key(), 18).unwrap();
        assert_eq!(n, 60);
        let d = dissect(&buf[..n]).unwrap();
        assert_eq!(d.key4(), Some(key()));
        assert!(d.verify_ipv4_header(&buf[..n]));
        let ip = IpPair::V4 {
            src: key().src,
            dst: key().dst,
        };
        assert!(udp::Packet::new_checked(&buf[34..60])
            .unwrap()
            .verify_checksum(&ip));
        // A short payload is padded with zeros, and the IP length excludes it.
        let mut buf = [0xaau8; 60];
        let n = build_udp4(&mut buf, A, B, &key(), 0).unwrap();
        assert_eq!(n, 60);
        assert!(buf[42..].iter().all(|&b| b == 0));
        assert_eq!(dissect(&buf).unwrap().l3_end, 42);
        assert_eq!(
            build_udp4(&mut [0u8; 59], A, B, &key(), 0),
            Err(EmitError::BufferTooSmall)
        );
        assert_eq!(
            build_udp4(&mut [0u8; 59], A, B, &key(), 70000),
            Err(EmitError::PayloadTooLarge)
        );
    }

    #[test]
    fn tcp4_and_echo() {
        let mut buf = [0u8; 100];
        let k = FlowKey4 {
            proto: proto::TCP,
            ..key()
        };
        let n = build_tcp4(&mut buf, A, B, &k, tcp::flags::SYN, 1, 0, 0).unwrap();
        let d = dissect(&buf[..n]).unwrap();
        assert_eq!(d.key4(), Some(k));
        assert_eq!(
            d.l4,
            L4::Tcp {
                flags: tcp::flags::SYN,
                header_len: 20
            }
        );
        let ip = IpPair::V4 {
            src: k.src,
            dst: k.dst,
        };
        assert!(tcp::Packet::new_checked(&buf[34..54])
            .unwrap()
            .verify_checksum(&ip));

        let k = FlowKey4 {
            proto: proto::ICMP,
            sport: 77,
            dport: 77,
            ..key()
        };
        let n = build_icmp4_echo(&mut buf, A, B, &k, 3, true, 32).unwrap();
        assert_eq!(n, 14 + 20 + 8 + 32);
        let d = dissect(&buf[..n]).unwrap();
        assert_eq!(d.key4(), Some(k));
        assert_eq!(
            d.l4,
            L4::IcmpQuery {
                ty: 8,
                code: 0,
                id: 77
            }
        );
        assert!(checksum::verify(&buf[34..n]));
    }

    #[test]
    fn icmp4_error_quotes_its_packet() {
        let mut orig = [0u8; 60];
        build_udp4(&mut orig, A, B, &key(), 4).unwrap();
        let mut buf = [0u8; 128];
        // Port unreachable from the destination back to the sender, quoting
        // the IP header + 8 bytes (RFC 792).
        let n = build_icmp4_error(&mut buf, B, A, key().dst, key().src, 3, 3, 0, &orig[14..42])
            .unwrap();
        let d = dissect(&buf[..n]).unwrap();
        match d.l4 {
            L4::IcmpError {
                ty: 3,
                code: 3,
                inner_l3_off: 42,
                inner_l4_off: 62,
                inner,
            } => {
                assert_eq!(inner, InnerKey::V4(key()));
            }
            other => panic!("{other:?}"),
        }
        assert!(checksum::verify(&buf[34..n]));
    }

    #[test]
    fn v6_builders() {
        let k = FlowKey6::new(
            proto::UDP,
            "2001:db8::1".parse().unwrap(),
            5,
            "2001:db8::2".parse().unwrap(),
            6,
        );
        let mut buf = [0u8; 200];
        let n = build_udp6(&mut buf, A, B, &k, 10).unwrap();
        assert_eq!(n, 14 + 40 + 18);
        let d = dissect(&buf[..n]).unwrap();
        assert_eq!(d.key6(), Some(k));
        let ip = IpPair::V6 {
            src: k.src,
            dst: k.dst,
        };
        assert!(udp::Packet::new_checked(&buf[54..n])
            .unwrap()
            .verify_checksum(&ip));
        let mut orig = [0u8; 200];
        let kt = FlowKey6 {
            proto: proto::TCP,
            ..k
        };
        let m = build_tcp6(&mut orig, A, B, &kt, tcp::flags::ACK, 9, 9, 0).unwrap();
        let n = build_icmp6_error(&mut buf, B, A, k.dst, k.src, 1, 4, 0, &orig[14..m]).unwrap();
        let d = dissect(&buf[..n]).unwrap();
        assert!(matches!(d.net, Net::Ipv6 { .. }));
        assert!(matches!(d.l4, L4::IcmpError { inner: InnerKey::V6(i), .. } if i == kt));
        let p = icmp::Packet::new_checked(&buf[54..n]).unwrap();
        assert!(p.verify_checksum_v6(&IpPair::V6 {
            src: k.dst,
            dst: k.src
        }));
    }

    proptest::proptest! {
        /// Any key and payload length: the frame dissects back to the key,
        /// and both checksums verify.
        #[test]
        fn udp4_roundtrip(src: u32, dst: u32, sport: u16, dport: u16, len in 0usize..300) {
            let k = FlowKey4 { src, dst, sport, dport, proto: proto::UDP };
            let mut buf = [0u8; 400];
            let n = build_udp4(&mut buf, [2, 0, 0, 0, 0, 1], B, &k, len).unwrap();
            proptest::prop_assert_eq!(n, (42 + len).max(60));
            let d = dissect(&buf[..n]).unwrap();
            proptest::prop_assert_eq!(d.key4(), Some(k));
            proptest::prop_assert!(d.verify_ipv4_header(&buf[..n]));
            let ip = IpPair::V4 { src, dst };
            let seg = &buf[34..42 + len];
            proptest::prop_assert!(udp::Packet::new_checked(seg).unwrap().verify_checksum(&ip));
        }
    }
}
