//! ICMP errors the gateway originates about packets it cannot forward:
//! time exceeded (RFC 792, type 11 code 0) and destination unreachable,
//! fragmentation needed (type 3 code 4, with the next-hop MTU of RFC 1191).
//!
//! [`build_in_place`] turns the offending frame into the error, in its own
//! buffer: the quoted part (the IP header and the first 8 bytes of data,
//! RFC 792) is moved back by 28 bytes, and a new IPv4 + ICMP header is
//! written in front of it. Nothing is allocated, and every access is
//! bounds-checked, so the function cannot panic on packet data.
//!
//! RFC 1812 §4.3.2.7 (and RFC 1122 §3.2.2) list the packets that must never
//! cause an ICMP error; [`build_in_place`] refuses them with a
//! [`Suppressed`] reason:
//!
//! - ICMP error messages themselves (no error about an error);
//! - packets sent to an IP broadcast or multicast address, or in a
//!   link-layer broadcast/multicast frame;
//! - non-initial fragments;
//! - packets whose source is not a unique host (`0.0.0.0/8`,
//!   `127.0.0.0/8`, multicast, `240.0.0.0/4`, limited broadcast).
//!
//! The error is sent back out of the ingress interface to the frame's
//! link-layer source (the previous hop), from that interface's address
//! (RFC 1812 §4.3.2.4).

use sluice_wire::checksum;

/// ICMP type: destination unreachable.
pub const DEST_UNREACHABLE: u8 = 3;
/// ICMP code (type 3): fragmentation needed and DF set (RFC 792, RFC 1191).
pub const FRAG_NEEDED: u8 = 4;
/// ICMP type: time exceeded.
pub const TIME_EXCEEDED: u8 = 11;
/// ICMP code (type 11): time to live exceeded in transit.
pub const TTL_EXCEEDED_IN_TRANSIT: u8 = 0;

/// Bytes of the new IPv4 header (no options) plus the ICMP header.
const PREFIX: usize = 20 + 8;
/// Bytes of the offending datagram's data quoted after its header (RFC 792).
const QUOTED_DATA: usize = 8;

/// Why no ICMP error was built (the packet is still dropped).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Suppressed {
    /// RFC 1812 §4.3.2.7: the packet is one that must not cause an error.
    NotAllowed,
    /// The frame buffer cannot hold the error, or the packet is malformed.
    NoRoom,
}

/// What the error is and who sends it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IcmpError {
    /// ICMP type.
    pub ty: u8,
    /// ICMP code.
    pub code: u8,
    /// Bytes 4..8 of the ICMP header: zero, or for fragmentation needed the
    /// next-hop MTU in the low 16 bits (RFC 1191 §4).
    pub rest: u32,
    /// Source address of the error (the ingress interface's), host order.
    pub src: u32,
    /// MAC of the ingress interface (the new link-layer source).
    pub src_mac: [u8; 6],
}

impl IcmpError {
    /// Time to live exceeded in transit.
    pub const fn ttl_exceeded(src: u32, src_mac: [u8; 6]) -> Self {
        Self {
            ty: TIME_EXCEEDED,
            code: TTL_EXCEEDED_IN_TRANSIT,
            rest: 0,
            src,
            src_mac,
        }
    }

    /// Fragmentation needed and DF set, with the next-hop MTU.
    pub const fn frag_needed(mtu: u16, src: u32, src_mac: [u8; 6]) -> Self {
        Self {
            ty: DEST_UNREACHABLE,
            code: FRAG_NEEDED,
            rest: mtu as u32,
            src,
            src_mac,
        }
    }
}

/// Whether `a` (host order) is a unique unicast host address that may
/// receive an ICMP error (RFC 1812 §4.3.2.7, §5.3.7).
fn unicast_source(a: u32) -> bool {
    let first = a >> 24;
    !(first == 0 || first == 127 || first >= 224)
}

/// Whether `a` is a multicast or the limited broadcast address.
fn multi_or_broadcast(a: u32) -> bool {
    (a >> 28) == 0xe || a == u32::MAX
}

pub(crate) fn rd16(b: &[u8], off: usize) -> Option<u16> {
    let s = b.get(off..off.checked_add(2)?)?;
    Some(u16::from_be_bytes([*s.first()?, *s.get(1)?]))
}

pub(crate) fn rd32(b: &[u8], off: usize) -> Option<u32> {
    let s = b.get(off..off.checked_add(4)?)?;
    let mut w = [0u8; 4];
    w.copy_from_slice(s);
    Some(u32::from_be_bytes(w))
}

/// What [`may_answer`] learnt of the offending packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Offender {
    /// Its source address (the error's destination), host order.
    pub src: u32,
    /// Bytes of it to quote (header + up to 8 bytes of data).
    pub quoted: usize,
}

/// Whether the IPv4 packet at `l3` in `frame[..len]` may be answered with an
/// ICMP error (RFC 1812 §4.3.2.7). Reads only.
pub fn may_answer(frame: &[u8], len: usize, l3: usize) -> Result<Offender, Suppressed> {
    let frame = frame.get(..len).ok_or(Suppressed::NoRoom)?;
    // Link-layer broadcast or multicast destination (I/G bit).
    match frame.first() {
        Some(b) if b & 1 == 0 => {}
        _ => return Err(Suppressed::NotAllowed),
    }
    let vihl = *frame.get(l3).ok_or(Suppressed::NoRoom)?;
    let ihl = usize::from(vihl & 0x0f) * 4;
    if vihl >> 4 != 4 || ihl < 20 {
        return Err(Suppressed::NoRoom);
    }
    let total = usize::from(rd16(frame, l3 + 2).ok_or(Suppressed::NoRoom)?);
    let frag = rd16(frame, l3 + 6).ok_or(Suppressed::NoRoom)?;
    let proto = *frame.get(l3 + 9).ok_or(Suppressed::NoRoom)?;
    let src = rd32(frame, l3 + 12).ok_or(Suppressed::NoRoom)?;
    let dst = rd32(frame, l3 + 16).ok_or(Suppressed::NoRoom)?;
    if frag & 0x1fff != 0 || !unicast_source(src) || multi_or_broadcast(dst) {
        return Err(Suppressed::NotAllowed);
    }
    // The packet as the network layer carried it (no Ethernet padding).
    let avail = len.saturating_sub(l3).min(total);
    if avail < ihl {
        return Err(Suppressed::NoRoom);
    }
    if proto == 1 {
        // No error about an ICMP error. Types not known to be queries are
        // treated as errors (the safe side).
        let ty = *frame.get(l3 + ihl).ok_or(Suppressed::NotAllowed)?;
        if !matches!(ty, 0 | 8 | 9 | 10 | 13 | 14 | 15 | 16 | 17 | 18) {
            return Err(Suppressed::NotAllowed);
        }
    }
    Ok(Offender {
        src,
        quoted: avail.min(ihl + QUOTED_DATA),
    })
}

/// Turn the IPv4 frame in `buf[..len]` (network header at `l3`) into the
/// ICMP error `e` addressed to its sender, in place. `buf` is the whole
/// frame buffer; the error may be longer than the original frame. Returns
/// the new frame length.
///
/// The link-layer header (any VLAN tags included) is kept, with source and
/// destination MACs swapped, so the error leaves on the same link and VLAN.
pub fn build_in_place(
    buf: &mut [u8],
    len: usize,
    l3: usize,
    e: &IcmpError,
) -> Result<usize, Suppressed> {
    let Offender { src, quoted } = may_answer(buf, len, l3)?;
    let icmp_len = 8 + quoted;
    let ip_len = 20 + icmp_len;
    let new_len = l3 + ip_len;
    if buf.len() < new_len || l3 < 12 {
        return Err(Suppressed::NoRoom);
    }
    // From here on every index is below `new_len <= buf.len()`.
    buf.copy_within(l3..l3 + quoted, l3 + PREFIX);

    let ip = buf.get_mut(l3..l3 + 20).ok_or(Suppressed::NoRoom)?;
    ip[0] = 0x45;
    // RFC 1812 §4.3.2.5 / §5.3.2: internetwork control precedence.
    ip[1] = 0xc0;
    ip[2..4].copy_from_slice(&(ip_len as u16).to_be_bytes());
    ip[4..8].fill(0);
    ip[8] = 64;
    ip[9] = 1;
    ip[10..12].fill(0);
    ip[12..16].copy_from_slice(&e.src.to_be_bytes());
    ip[16..20].copy_from_slice(&src.to_be_bytes());
    let c = checksum::checksum(ip);
    ip[10..12].copy_from_slice(&c.to_be_bytes());

    let icmp = buf
        .get_mut(l3 + 20..l3 + 20 + icmp_len)
        .ok_or(Suppressed::NoRoom)?;
    icmp[0] = e.ty;
    icmp[1] = e.code;
    icmp[2..4].fill(0);
    icmp[4..8].copy_from_slice(&e.rest.to_be_bytes());
    let c = checksum::checksum(icmp);
    icmp[2..4].copy_from_slice(&c.to_be_bytes());

    let mac = buf.get_mut(0..12).ok_or(Suppressed::NoRoom)?;
    mac.copy_within(6..12, 0);
    mac[6..12].copy_from_slice(&e.src_mac);
    Ok(new_len)
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_wire::build::{build_icmp4_echo, build_udp4};
    use sluice_wire::flow::{proto, FlowKey4};

    const HOST: [u8; 6] = [2, 0, 0, 0, 0, 9];
    const GW: [u8; 6] = [2, 0, 0, 0, 0, 1];
    const GW_IP: u32 = 0x0a00_0001;

    fn udp(buf: &mut [u8], src: u32, dst: u32, payload: usize) -> usize {
        let k = FlowKey4 {
            src,
            dst,
            sport: 4000,
            dport: 53,
            proto: proto::UDP,
        };
        build_udp4(buf, HOST, GW, &k, payload).unwrap()
    }

    /// A UDP datagram with TTL 1 becomes a time-exceeded error: the exact
    /// bytes of RFC 792's layout, and both checksums verify.
    #[test]
    fn ttl_exceeded_quotes_the_header_and_8_bytes_and_checksums_verify() {
        let mut b = [0u8; 256];
        let n = udp(&mut b, 0x0a00_0002, 0xcb00_7102, 100);
        b[14 + 8] = 1; // TTL 1 (the header checksum is not rechecked)
        let orig: Vec<u8> = b[14..14 + 28].to_vec();
        let e = IcmpError::ttl_exceeded(GW_IP, GW);
        let m = build_in_place(&mut b, n, 14, &e).unwrap();
        assert_eq!(m, 14 + 20 + 8 + 28);
        assert_eq!(&b[0..6], &HOST);
        assert_eq!(&b[6..12], &GW);
        assert_eq!(&b[12..14], &[0x08, 0x00]);
        let ip = &b[14..34];
        assert_eq!(ip[0], 0x45);
        assert_eq!(u16::from_be_bytes([ip[2], ip[3]]), 56);
        assert_eq!((ip[8], ip[9]), (64, 1));
        assert_eq!(&ip[12..16], &[10, 0, 0, 1]);
        assert_eq!(&ip[16..20], &[10, 0, 0, 2]);
        assert!(checksum::verify(ip));
        let icmp = &b[34..m];
        assert_eq!(&icmp[..2], &[11, 0]);
        assert_eq!(&icmp[4..8], &[0; 4]);
        assert_eq!(&icmp[8..], &orig[..]);
        assert!(checksum::verify(icmp));
        // And the whole thing dissects as an ICMP error quoting the flow.
        let d = sluice_wire::dissect(&b[..m]).unwrap();
        assert!(
            matches!(
                d.l4,
                sluice_wire::L4::IcmpError {
                    ty: 11,
                    code: 0,
                    ..
                }
            ),
            "{:?}",
            d.l4
        );
    }

    #[test]
    fn frag_needed_carries_the_next_hop_mtu() {
        let mut b = [0u8; 1600];
        let n = udp(&mut b, 0x0a00_0002, 0xcb00_7102, 1472);
        let e = IcmpError::frag_needed(1400, GW_IP, GW);
        let m = build_in_place(&mut b, n, 14, &e).unwrap();
        assert_eq!(m, 14 + 56);
        let icmp = &b[34..m];
        assert_eq!(&icmp[..2], &[3, 4]);
        // RFC 1191 §4: unused (16 bits) then the next-hop MTU (16 bits).
        assert_eq!(&icmp[4..8], &[0, 0, 0x05, 0x78]);
        assert!(checksum::verify(icmp));
        assert!(checksum::verify(&b[14..34]));
        // The quoted header still says 1500 bytes.
        assert_eq!(u16::from_be_bytes([icmp[10], icmp[11]]), 1500);
    }

    /// A short packet is quoted whole; the error is longer than the frame
    /// it replaces, and the IP options of the original are quoted too.
    #[test]
    fn quotes_options_and_short_packets_whole() {
        let mut b = [0u8; 128];
        // 24-byte header (one NOP..EOL option word), 4 bytes of data.
        let pkt: [u8; 28] = [
            0x46, 0, 0, 28, 0, 1, 0, 0, 1, 17, 0, 0, 10, 0, 0, 2, 192, 0, 2, 1, 1, 1, 1, 0, 0xaa,
            0xbb, 0xcc, 0xdd,
        ];
        b[..6].copy_from_slice(&GW);
        b[6..12].copy_from_slice(&HOST);
        b[12..14].copy_from_slice(&[8, 0]);
        b[14..42].copy_from_slice(&pkt);
        let m = build_in_place(&mut b, 60, 14, &IcmpError::ttl_exceeded(GW_IP, GW)).unwrap();
        assert_eq!(m, 14 + 28 + 28);
        assert_eq!(&b[42..70], &pkt);
        assert!(checksum::verify(&b[34..70]));
    }

    #[test]
    fn forbidden_packets_get_no_error() {
        let e = IcmpError::ttl_exceeded(GW_IP, GW);
        let mut b = [0u8; 256];
        // Source 0.0.0.0, 127.0.0.1, multicast; destination broadcast, multicast.
        for (s, d) in [
            (0, 0xcb00_7102),
            (0x7f00_0001, 0xcb00_7102),
            (0xe000_0001, 0xcb00_7102),
            (0x0a00_0002, u32::MAX),
            (0x0a00_0002, 0xe000_00fb),
        ] {
            let n = udp(&mut b, s, d, 8);
            assert_eq!(
                build_in_place(&mut b, n, 14, &e),
                Err(Suppressed::NotAllowed)
            );
        }
        // Non-initial fragment.
        let n = udp(&mut b, 0x0a00_0002, 0xcb00_7102, 8);
        b[14 + 7] = 0x10;
        assert_eq!(
            build_in_place(&mut b, n, 14, &e),
            Err(Suppressed::NotAllowed)
        );
        // Link-layer broadcast.
        let n = udp(&mut b, 0x0a00_0002, 0xcb00_7102, 8);
        b[..6].fill(0xff);
        assert_eq!(
            build_in_place(&mut b, n, 14, &e),
            Err(Suppressed::NotAllowed)
        );
        // An ICMP error (an ICMP echo is fine).
        let k = FlowKey4 {
            src: 0x0a00_0002,
            dst: 0xcb00_7102,
            sport: 7,
            dport: 7,
            proto: proto::ICMP,
        };
        let n = build_icmp4_echo(&mut b, HOST, GW, &k, 1, true, 8).unwrap();
        assert!(build_in_place(&mut b, n, 14, &e).is_ok());
        let n = build_icmp4_echo(&mut b, HOST, GW, &k, 1, true, 8).unwrap();
        b[34] = 3;
        assert_eq!(
            build_in_place(&mut b, n, 14, &e),
            Err(Suppressed::NotAllowed)
        );
    }

    #[test]
    fn no_room_or_garbage_is_refused_without_panicking() {
        let e = IcmpError::ttl_exceeded(GW_IP, GW);
        let mut b = [0u8; 64];
        let n = udp(&mut b, 0x0a00_0002, 0xcb00_7102, 8);
        // 64-byte buffer: 14 + 28 + 28 = 70 does not fit.
        assert_eq!(build_in_place(&mut b, n, 14, &e), Err(Suppressed::NoRoom));
        for len in 0..n {
            let mut c = [0u8; 64];
            c.copy_from_slice(&b);
            let _ = build_in_place(&mut c, len, 14, &e);
            let _ = build_in_place(&mut c, len, 60, &e);
        }
        let mut z = [0u8; 0];
        assert!(build_in_place(&mut z, 10, 14, &e).is_err());
    }
}
