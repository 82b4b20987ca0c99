//! TCP resets the gateway sends for a rejected TCP segment (`reject with
//! tcp reset`, iptables `-j REJECT --reject-with tcp-reset`), built as the
//! kernel's `nf_send_reset` / `nf_send_reset6` build them:
//!
//! - from the segment's destination to its source, ports swapped;
//! - if the segment carries ACK, the reset's sequence number is its
//!   acknowledgment number and the reset carries RST alone; otherwise the
//!   reset has sequence 0, acknowledges the segment's sequence number plus
//!   its SYN, FIN and data, and carries RST and ACK (RFC 9293 §3.10.7.1);
//! - a 20-byte TCP header with a zero window and no options; an IPv4
//!   header with DF set, identification 0 and TTL 64, or an IPv6 header
//!   with hop limit 64;
//! - never in answer to a reset, to a non-initial fragment, to a segment
//!   whose checksum is wrong, or to a packet sent to a broadcast or
//!   multicast address (link-layer or IP).
//!
//! [`build_in_place`] turns the frame into the reset in its own buffer: the
//! link-layer header is kept (any VLAN tags too) with the MACs swapped, so
//! the reset leaves on the link and VLAN the segment came from, to the
//! previous hop. Nothing is allocated and every access is bounds-checked.

use sluice_wire::checksum;

use crate::icmp_error::{rd16, rd32, Suppressed};

const RST: u8 = 0x04;
const SYN: u8 = 0x02;
const FIN: u8 = 0x01;
const ACK: u8 = 0x10;

fn rd128(b: &[u8], off: usize) -> Option<u128> {
    let s = b.get(off..off.checked_add(16)?)?;
    let mut w = [0u8; 16];
    w.copy_from_slice(s);
    Some(u128::from_be_bytes(w))
}

/// The network layer of the rejected segment.
#[derive(Clone, Copy)]
enum Net {
    V4 { src: u32, dst: u32 },
    V6 { src: u128, dst: u128 },
}

impl Net {
    fn pseudo(&self, len: u32) -> u64 {
        match *self {
            Net::V4 { src, dst } => checksum::pseudo_v4(src, dst, 6, len as u16),
            Net::V6 { src, dst } => checksum::pseudo_v6(src, dst, 6, len),
        }
    }
}

/// Turn the TCP segment in `buf[..len]` (network header at `l3`, TCP
/// header at `l4`) into the reset that answers it, from `src_mac` (the
/// ingress interface's MAC). Returns the new frame length.
pub fn build_in_place(
    buf: &mut [u8],
    len: usize,
    l3: usize,
    l4: usize,
    src_mac: [u8; 6],
) -> Result<usize, Suppressed> {
    let frame = buf.get(..len).ok_or(Suppressed::NoRoom)?;
    // Link-layer broadcast or multicast destination (I/G bit).
    match frame.first() {
        Some(b) if b & 1 == 0 => {}
        _ => return Err(Suppressed::NotAllowed),
    }
    let version = frame.get(l3).ok_or(Suppressed::NoRoom)? >> 4;
    // The network packet as carried (no link-layer padding).
    let (net, end) = match version {
        4 => {
            let total = usize::from(rd16(frame, l3 + 2).ok_or(Suppressed::NoRoom)?);
            let frag = rd16(frame, l3 + 6).ok_or(Suppressed::NoRoom)?;
            if *frame.get(l3 + 9).ok_or(Suppressed::NoRoom)? != 6 || frag & 0x1fff != 0 {
                return Err(Suppressed::NotAllowed);
            }
            let src = rd32(frame, l3 + 12).ok_or(Suppressed::NoRoom)?;
            let dst = rd32(frame, l3 + 16).ok_or(Suppressed::NoRoom)?;
            if dst >> 28 == 0xe || dst == u32::MAX || src >> 28 == 0xe || src == u32::MAX {
                return Err(Suppressed::NotAllowed);
            }
            (Net::V4 { src, dst }, l3 + total)
        }
        6 => {
            let payload = usize::from(rd16(frame, l3 + 4).ok_or(Suppressed::NoRoom)?);
            let src = rd128(frame, l3 + 8).ok_or(Suppressed::NoRoom)?;
            let dst = rd128(frame, l3 + 24).ok_or(Suppressed::NoRoom)?;
            if dst >> 120 == 0xff || src >> 120 == 0xff {
                return Err(Suppressed::NotAllowed);
            }
            (Net::V6 { src, dst }, l3 + 40 + payload)
        }
        _ => return Err(Suppressed::NoRoom),
    };
    if end > len || l4 < l3 || end < l4 + 20 {
        return Err(Suppressed::NoRoom);
    }
    let seg = frame.get(l4..end).ok_or(Suppressed::NoRoom)?;
    let flags = *seg.get(13).ok_or(Suppressed::NoRoom)?;
    let doff = usize::from(seg.get(12).ok_or(Suppressed::NoRoom)? >> 4) * 4;
    if flags & RST != 0 || doff < 20 || doff > seg.len() {
        return Err(Suppressed::NotAllowed);
    }
    // A segment with a wrong checksum gets no answer.
    let sum = checksum::add(net.pseudo(seg.len() as u32), checksum::sum(seg));
    if checksum::fold(sum) != 0xffff {
        return Err(Suppressed::NotAllowed);
    }
    let sport = rd16(seg, 0).ok_or(Suppressed::NoRoom)?;
    let dport = rd16(seg, 2).ok_or(Suppressed::NoRoom)?;
    let seq = rd32(seg, 4).ok_or(Suppressed::NoRoom)?;
    let ack = rd32(seg, 8).ok_or(Suppressed::NoRoom)?;
    let (rseq, rack, rflags) = if flags & ACK != 0 {
        (ack, 0, RST)
    } else {
        let data = (seg.len() - doff) as u32;
        let n = data + u32::from(flags & SYN != 0) + u32::from(flags & FIN != 0);
        (0, seq.wrapping_add(n), RST | ACK)
    };

    // The reset: network header then 20 bytes of TCP.
    let (hdr, rnet) = match net {
        Net::V4 { src, dst } => (20, Net::V4 { src: dst, dst: src }),
        Net::V6 { src, dst } => (40, Net::V6 { src: dst, dst: src }),
    };
    let tcp_at = l3 + hdr;
    let new_len = tcp_at + 20;
    if buf.len() < new_len || l3 < 12 {
        return Err(Suppressed::NoRoom);
    }
    let ip = buf.get_mut(l3..tcp_at).ok_or(Suppressed::NoRoom)?;
    match rnet {
        Net::V4 { src, dst } => {
            ip[0] = 0x45;
            ip[1] = 0;
            ip[2..4].copy_from_slice(&40u16.to_be_bytes());
            ip[4..6].fill(0);
            // DF.
            ip[6..8].copy_from_slice(&0x4000u16.to_be_bytes());
            ip[8] = 64;
            ip[9] = 6;
            ip[10..12].fill(0);
            ip[12..16].copy_from_slice(&src.to_be_bytes());
            ip[16..20].copy_from_slice(&dst.to_be_bytes());
            let c = checksum::checksum(ip);
            ip[10..12].copy_from_slice(&c.to_be_bytes());
        }
        Net::V6 { src, dst } => {
            ip[0..4].copy_from_slice(&[0x60, 0, 0, 0]);
            ip[4..6].copy_from_slice(&20u16.to_be_bytes());
            ip[6] = 6;
            ip[7] = 64;
            ip[8..24].copy_from_slice(&src.to_be_bytes());
            ip[24..40].copy_from_slice(&dst.to_be_bytes());
        }
    }
    let tcp = buf.get_mut(tcp_at..new_len).ok_or(Suppressed::NoRoom)?;
    tcp[0..2].copy_from_slice(&dport.to_be_bytes());
    tcp[2..4].copy_from_slice(&sport.to_be_bytes());
    tcp[4..8].copy_from_slice(&rseq.to_be_bytes());
    tcp[8..12].copy_from_slice(&rack.to_be_bytes());
    tcp[12] = 5 << 4;
    tcp[13] = rflags;
    tcp[14..20].fill(0);
    let c = checksum::finish(checksum::add(rnet.pseudo(20), checksum::sum(tcp)));
    tcp[16..18].copy_from_slice(&c.to_be_bytes());

    let mac = buf.get_mut(0..12).ok_or(Suppressed::NoRoom)?;
    mac.copy_within(6..12, 0);
    mac[6..12].copy_from_slice(&src_mac);
    Ok(new_len)
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_wire::build::build_tcp4;
    use sluice_wire::flow::{proto, FlowKey4};
    use sluice_wire::tcp;
    use sluice_wire::IpPair;

    const HOST: [u8; 6] = [2, 0, 0, 0, 0, 9];
    const GW: [u8; 6] = [2, 0, 0, 0, 0, 1];

    fn seg(buf: &mut [u8], flags: u8, seq: u32, ack: u32) -> usize {
        let k = FlowKey4 {
            src: 0x0a00_0002,
            dst: 0xcb00_7150,
            sport: 40_000,
            dport: 22,
            proto: proto::TCP,
        };
        build_tcp4(buf, HOST, GW, &k, flags, seq, ack, 0).unwrap()
    }

    fn check(b: &[u8], n: usize) -> (u32, u32, u8) {
        assert_eq!(n, 14 + 40);
        assert_eq!(&b[0..6], &HOST);
        assert_eq!(&b[6..12], &GW);
        let ip = &b[14..34];
        assert!(checksum::verify(ip));
        assert_eq!(u16::from_be_bytes([ip[2], ip[3]]), 40);
        assert_eq!((ip[6], ip[8], ip[9]), (0x40, 64, 6));
        assert_eq!(&ip[12..16], &[203, 0, 113, 80]);
        assert_eq!(&ip[16..20], &[10, 0, 0, 2]);
        let t = tcp::Packet::new_unchecked(&b[34..54]);
        assert!(t.verify_checksum(&IpPair::V4 {
            src: 0xcb00_7150,
            dst: 0x0a00_0002
        }));
        assert_eq!((t.src_port(), t.dst_port()), (22, 40_000));
        (t.seq_number(), t.ack_number(), b[34 + 13])
    }

    /// A SYN is answered with RST+ACK acknowledging it; a segment with
    /// ACK with a RST whose sequence number is its acknowledgment.
    #[test]
    fn syn_and_ack_segments_get_the_kernels_reset() {
        let mut b = [0u8; 256];
        let n = seg(&mut b, SYN, 1000, 0);
        let m = build_in_place(&mut b, n, 14, 34, GW).unwrap();
        assert_eq!(check(&b, m), (0, 1001, RST | ACK));
        let mut b = [0u8; 256];
        let n = seg(&mut b, ACK, 5000, 7000);
        let m = build_in_place(&mut b, n, 14, 34, GW).unwrap();
        assert_eq!(check(&b, m), (7000, 0, RST));
    }

    #[test]
    fn no_reset_for_a_reset_a_bad_checksum_or_a_group_frame() {
        let mut b = [0u8; 256];
        let n = seg(&mut b, RST | ACK, 1, 2);
        assert_eq!(
            build_in_place(&mut b, n, 14, 34, GW),
            Err(Suppressed::NotAllowed)
        );
        let mut b = [0u8; 256];
        let n = seg(&mut b, SYN, 1, 0);
        b[34 + 16] ^= 1;
        assert_eq!(
            build_in_place(&mut b, n, 14, 34, GW),
            Err(Suppressed::NotAllowed)
        );
        let mut b = [0u8; 256];
        let n = seg(&mut b, SYN, 1, 0);
        b[0] |= 1;
        assert_eq!(
            build_in_place(&mut b, n, 14, 34, GW),
            Err(Suppressed::NotAllowed)
        );
    }

    /// Any byte string: an error or a reset, never a panic.
    #[test]
    fn garbage_never_panics() {
        let mut r = 0x9e37_79b9_7f4a_7c15u64;
        for len in 0..120 {
            let mut b = [0u8; 160];
            for x in b.iter_mut() {
                r ^= r << 13;
                r ^= r >> 7;
                r ^= r << 17;
                *x = r as u8;
            }
            b[0] &= 0xfe;
            b[14] = if len % 2 == 0 { 0x45 } else { 0x60 };
            let _ = build_in_place(&mut b, len, 14, 34 + len % 7, GW);
            let _ = build_in_place(&mut b, len, len % 20, 34, GW);
        }
    }
}
