//! Test helpers: an RFC 1071 reference checksum and packet builders.
#![allow(clippy::indexing_slicing, clippy::unwrap_used)]

use sluice_wire::flow::{proto, FlowKey4};

/// RFC 1071 Internet checksum over the concatenation of `parts`
/// (computed from scratch; the reference for the incremental code).
pub(crate) fn csum_ref(parts: &[&[u8]]) -> u16 {
    let bytes: Vec<u8> = parts.iter().flat_map(|p| p.iter().copied()).collect();
    let mut sum: u64 = 0;
    for c in bytes.chunks(2) {
        let w = if c.len() == 2 {
            u16::from_be_bytes([c[0], c[1]])
        } else {
            u16::from(c[0]) << 8
        };
        sum += u64::from(w);
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

pub(crate) fn rd16(b: &[u8], o: usize) -> u16 {
    u16::from_be_bytes([b[o], b[o + 1]])
}

pub(crate) fn rd32(b: &[u8], o: usize) -> u32 {
    u32::from_be_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]])
}

/// Shape of a built packet.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Shape {
    /// IPv4 header length in 32-bit words (5..=15).
    pub ihl: u8,
    /// Emit UDP without checksum.
    pub udp_no_csum: bool,
    /// Fragment offset field (in 8-byte units).
    pub frag_off: u16,
}

impl Default for Shape {
    fn default() -> Self {
        Self {
            ihl: 5,
            udp_no_csum: false,
            frag_off: 0,
        }
    }
}

/// The L4 header of `key` with a zero checksum.
fn l4_header(key: &FlowKey4, payload_len: usize) -> Vec<u8> {
    match key.proto {
        proto::TCP => {
            let mut h = vec![0u8; 20];
            h[0..2].copy_from_slice(&key.sport.to_be_bytes());
            h[2..4].copy_from_slice(&key.dport.to_be_bytes());
            h[4..8].copy_from_slice(&0x1234_5678u32.to_be_bytes());
            h[12] = 5 << 4;
            h[13] = 0x18;
            h[14..16].copy_from_slice(&0xffffu16.to_be_bytes());
            h
        }
        proto::UDP => {
            let mut h = vec![0u8; 8];
            h[0..2].copy_from_slice(&key.sport.to_be_bytes());
            h[2..4].copy_from_slice(&key.dport.to_be_bytes());
            h[4..6].copy_from_slice(&((8 + payload_len) as u16).to_be_bytes());
            h
        }
        _ => {
            // ICMP echo request, identifier = sport.
            let mut h = vec![8u8, 0, 0, 0, 0, 0, 0, 1];
            h[4..6].copy_from_slice(&key.sport.to_be_bytes());
            h
        }
    }
}

/// An IPv4 datagram (no link header) for `key` with correct checksums.
pub(crate) fn datagram(key: &FlowKey4, payload: &[u8], shape: Shape) -> Vec<u8> {
    let hl = usize::from(shape.ihl) * 4;
    let mut l4 = l4_header(key, payload.len());
    l4.extend_from_slice(payload);
    let total = hl + l4.len();
    let mut ip = vec![1u8; hl]; // options: NOP
    ip[0] = 0x40 | shape.ihl;
    ip[1] = 0;
    ip[2..4].copy_from_slice(&(total as u16).to_be_bytes());
    ip[4..6].copy_from_slice(&0xbeefu16.to_be_bytes());
    ip[6..8].copy_from_slice(&(shape.frag_off & 0x1fff).to_be_bytes());
    ip[8] = 64;
    ip[9] = key.proto;
    ip[10] = 0;
    ip[11] = 0;
    ip[12..16].copy_from_slice(&key.src.to_be_bytes());
    ip[16..20].copy_from_slice(&key.dst.to_be_bytes());
    let c = csum_ref(&[&ip]);
    ip[10..12].copy_from_slice(&c.to_be_bytes());
    let c = l4_full_checksum(key.src, key.dst, key.proto, &l4);
    let coff = l4_csum_off(key.proto);
    let c = if key.proto == proto::UDP && shape.udp_no_csum {
        0
    } else {
        c
    };
    l4[coff..coff + 2].copy_from_slice(&c.to_be_bytes());
    ip.extend_from_slice(&l4);
    ip
}

pub(crate) fn l4_csum_off(p: u8) -> usize {
    match p {
        proto::TCP => 16,
        proto::UDP => 6,
        _ => 2,
    }
}

/// Full L4 checksum over `l4` (its checksum field must be zero).
pub(crate) fn l4_full_checksum(src: u32, dst: u32, p: u8, l4: &[u8]) -> u16 {
    match p {
        proto::TCP | proto::UDP => {
            let mut ph = Vec::with_capacity(12);
            ph.extend_from_slice(&src.to_be_bytes());
            ph.extend_from_slice(&dst.to_be_bytes());
            ph.push(0);
            ph.push(p);
            ph.extend_from_slice(&(l4.len() as u16).to_be_bytes());
            let c = csum_ref(&[&ph, l4]);
            if p == proto::UDP && c == 0 {
                0xffff
            } else {
                c
            }
        }
        _ => csum_ref(&[l4]),
    }
}

/// Recompute the IPv4 header checksum of the datagram at `ip`.
pub(crate) fn ip_checksum_of(ip: &[u8]) -> u16 {
    let hl = usize::from(ip[0] & 0x0f) * 4;
    let mut h = ip[..hl].to_vec();
    h[10] = 0;
    h[11] = 0;
    csum_ref(&[&h])
}

/// Recompute the L4 checksum of the (complete, unfragmented) datagram.
pub(crate) fn l4_checksum_of(ip: &[u8]) -> u16 {
    let hl = usize::from(ip[0] & 0x0f) * 4;
    let total = usize::from(rd16(ip, 2));
    let p = ip[9];
    let mut l4 = ip[hl..total].to_vec();
    let coff = l4_csum_off(p);
    l4[coff] = 0;
    l4[coff + 1] = 0;
    l4_full_checksum(rd32(ip, 12), rd32(ip, 16), p, &l4)
}

/// Wrap `quoted` (a datagram, possibly truncated) in an ICMP error of type
/// `ty` from `src` to `dst`, with correct checksums.
pub(crate) fn icmp_error(src: u32, dst: u32, ty: u8, code: u8, quoted: &[u8]) -> Vec<u8> {
    let mut icmp = vec![ty, code, 0, 0, 0, 0, 0, 0];
    icmp.extend_from_slice(quoted);
    let c = csum_ref(&[&icmp]);
    icmp[2..4].copy_from_slice(&c.to_be_bytes());
    let total = 20 + icmp.len();
    let mut ip = vec![0x45, 0xc0, 0, 0, 0, 0, 0, 0, 64, proto::ICMP, 0, 0];
    ip[2..4].copy_from_slice(&(total as u16).to_be_bytes());
    ip.extend_from_slice(&src.to_be_bytes());
    ip.extend_from_slice(&dst.to_be_bytes());
    let c = csum_ref(&[&ip]);
    ip[10..12].copy_from_slice(&c.to_be_bytes());
    ip.extend_from_slice(&icmp);
    ip
}
