//! The engine's per-frame fast parser.
//!
//! [`dissect`] reads an Ethernet frame once, front to back, and returns a
//! small `Copy` summary: VLAN tags, layer offsets, the flow key and an L4
//! summary. It never allocates and never panics; it reads fixed-size arrays
//! (`first_chunk`) so that each header costs one bounds check.
//!
//! Validation (each failure is a distinct [`ParseError`]):
//! * Ethernet: at most two tags (802.1ad S-tag + 802.1Q C-tag, or two 802.1Q).
//! * ARP: Ethernet/IPv4 only (RFC 826).
//! * IPv4 (RFC 791 §3.1): version 4, IHL ≥ 5, `IHL×4 ≤ total length ≤ bytes
//!   available`. The L4 header is read within `total length`, so Ethernet
//!   padding is never taken for payload. The header checksum is *not*
//!   verified here; see [`Dissect::verify_ipv4_header`].
//! * IPv6 (RFC 8200): version 6, `40 + payload length ≤ bytes available`,
//!   extension headers walked with [`crate::ipv6::walk_ext_headers`].
//! * TCP: data offset ≥ 5 and within the segment (this also drops tiny first
//!   fragments that split the TCP header, RFC 1858 §3.1). UDP: length field
//!   ≥ 8 and within the datagram (not checked on a first fragment, whose
//!   length covers the reassembled datagram). ICMP: 8-byte header.
//! * ICMP errors: the quoted packet must hold its IP header and, when it is a
//!   first fragment of TCP/UDP/ICMP, the first 8 bytes of its L4 header
//!   (RFC 792; RFC 4443 §2.4(c)). The quoted packet may be truncated: its own
//!   length fields are not checked against the bytes present.
//!
//! Checksums other than the IPv4 header's are left to the consumer: the NAT
//! fast path updates them incrementally (RFC 1624) and never needs to verify.

use crate::flow::{proto, FlowKey4, FlowKey6};
use crate::ip::Frag;
use crate::ipv6::walk_ext_headers;
use crate::ParseError;

const ETH_IPV4: u16 = 0x0800;
const ETH_ARP: u16 = 0x0806;
const ETH_IPV6: u16 = 0x86dd;
const ETH_VLAN: u16 = 0x8100;
const ETH_QINQ: u16 = 0x88a8;

/// The flow key of the packet quoted by an ICMP error, as its sender sent it
/// (source = the host that sent the offending packet).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum InnerKey {
    /// Quoted IPv4 packet (inside ICMPv4).
    V4(FlowKey4),
    /// Quoted IPv6 packet (inside ICMPv6).
    V6(FlowKey6),
}

/// Network-layer summary.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Net {
    /// Ethernet/IPv4 ARP.
    Arp {
        /// Operation (1 request, 2 reply).
        op: u16,
        /// Sender protocol address, host order.
        spa: u32,
        /// Target protocol address, host order.
        tpa: u32,
    },
    /// IPv4.
    Ipv4 {
        /// Flow key; ports are 0 when the protocol has none or on a
        /// non-first fragment, and both hold the identifier for ICMP queries.
        key: FlowKey4,
        /// Time to live.
        ttl: u8,
        /// Don't-fragment flag.
        df: bool,
        /// Fragment position.
        frag: Frag,
        /// Total length from the header.
        total_len: u16,
        /// Header length in bytes (options included).
        header_len: u8,
    },
    /// IPv6.
    Ipv6 {
        /// Flow key; `proto` is the upper-layer protocol after extension
        /// headers (for a non-first fragment, the fragment header's next
        /// header).
        key: FlowKey6,
        /// Hop limit.
        hop_limit: u8,
        /// Payload length from the header (extension headers included).
        payload_len: u16,
        /// Fragment position, from a fragment header.
        frag: Frag,
    },
    /// Any other ethertype, not parsed further.
    Other(u16),
}

/// Transport-layer summary.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum L4 {
    /// TCP.
    Tcp {
        /// The eight control bits (see [`crate::tcp::flags`]).
        flags: u8,
        /// Header length in bytes (options area = this − 20).
        header_len: u8,
    },
    /// UDP.
    Udp {
        /// The checksum field is zero: "none" over IPv4 (RFC 768), invalid
        /// over IPv6 (RFC 8200 §8.1).
        checksum_zero: bool,
    },
    /// ICMP/ICMPv6 query (echo, timestamp, ...); the key's ports both hold
    /// `id`.
    IcmpQuery {
        /// Type.
        ty: u8,
        /// Code.
        code: u8,
        /// Identifier.
        id: u16,
    },
    /// ICMP/ICMPv6 error quoting a packet; the outer key's ports are 0.
    IcmpError {
        /// Type.
        ty: u8,
        /// Code.
        code: u8,
        /// Frame offset of the quoted IP header.
        inner_l3_off: u16,
        /// Frame offset of the quoted L4 header.
        inner_l4_off: u16,
        /// Key of the quoted packet, as its sender sent it. To find the
        /// connection, look it up as-is: the error travels in the reply
        /// direction of that packet's flow.
        inner: InnerKey,
    },
    /// Another ICMP/ICMPv6 message (router/neighbor discovery, MLD, ...).
    IcmpOther {
        /// Type.
        ty: u8,
        /// Code.
        code: u8,
    },
    /// Another IP protocol (ESP, GRE, SCTP, no-next-header, ...); ports 0.
    Other,
    /// A non-first fragment: no L4 header here; ports 0.
    NonFirstFragment,
    /// No IP layer (ARP, other ethertypes).
    None,
}

/// What [`dissect`] found in one frame. All offsets are from the start of
/// the frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Dissect {
    /// VLAN id of the outermost tag (802.1Q, or the 802.1ad S-tag).
    pub vlan: Option<u16>,
    /// VLAN id of the second tag (QinQ C-tag).
    pub inner_vlan: Option<u16>,
    /// Ethertype of the network layer (after any tags).
    pub ethertype: u16,
    /// Offset of the network-layer header.
    pub l3_off: u16,
    /// Offset of the L4 header (for a non-first fragment, of the fragment
    /// data; for ARP and other ethertypes, equal to `l3_end` or `l3_off`).
    pub l4_off: u16,
    /// End of the network-layer packet: `l3_off` + IPv4 total length or
    /// IPv6 40 + payload length, excluding Ethernet padding. For other
    /// ethertypes, the frame length. (`u32`: a tagged 64 KiB IP packet
    /// ends past `u16::MAX`.)
    pub l3_end: u32,
    /// Network-layer summary.
    pub net: Net,
    /// Transport-layer summary.
    pub l4: L4,
}

impl Dissect {
    /// The IPv4 flow key, if this is IPv4.
    #[inline]
    pub fn key4(&self) -> Option<FlowKey4> {
        match self.net {
            Net::Ipv4 { key, .. } => Some(key),
            _ => None,
        }
    }

    /// The IPv6 flow key, if this is IPv6.
    #[inline]
    pub fn key6(&self) -> Option<FlowKey6> {
        match self.net {
            Net::Ipv6 { key, .. } => Some(key),
            _ => None,
        }
    }

    /// Fragment position (`Frag::None` for non-IP).
    #[inline]
    pub fn frag(&self) -> Frag {
        match self.net {
            Net::Ipv4 { frag, .. } | Net::Ipv6 { frag, .. } => frag,
            _ => Frag::None,
        }
    }

    /// Verify the IPv4 header checksum of `frame` (the frame this was
    /// dissected from). True for anything that is not IPv4.
    pub fn verify_ipv4_header(&self, frame: &[u8]) -> bool {
        match self.net {
            Net::Ipv4 { header_len, .. } => {
                let s = usize::from(self.l3_off);
                frame
                    .get(s..s + usize::from(header_len))
                    .is_some_and(crate::checksum::verify)
            }
            _ => true,
        }
    }
}

#[inline(always)]
fn be16(a: u8, b: u8) -> u16 {
    u16::from_be_bytes([a, b])
}

#[inline(always)]
fn chunk<const N: usize>(b: &[u8], off: usize) -> Option<&[u8; N]> {
    b.get(off..)?.first_chunk::<N>()
}

#[inline(always)]
fn off16(v: usize) -> Result<u16, ParseError> {
    u16::try_from(v).map_err(|_| ParseError::Truncated)
}

/// Dissect one Ethernet frame (without FCS). See the module docs for what is
/// validated. Never panics, never allocates.
#[inline]
pub fn dissect(frame: &[u8]) -> Result<Dissect, ParseError> {
    // The common frame (untagged IPv4 without options or fragmentation,
    // TCP, UDP or an ICMP query) on fixed offsets: the same result as the
    // general parse, in a third of the instructions.
    if let Some(d) = dissect_plain4_full(frame) {
        return Ok(d);
    }
    dissect_general(frame)
}

/// [`dissect`] of a frame [`dissect_plain4`] accepts, from the same fixed
/// offsets; `None` for any other frame.
#[inline(always)]
fn dissect_plain4_full(frame: &[u8]) -> Option<Dissect> {
    let p = dissect_plain4(frame)?;
    let f: &[u8; 42] = frame.first_chunk()?;
    let total = be16(f[16], f[17]);
    let l4 = match p.key.proto {
        proto::TCP => L4::Tcp {
            flags: p.l4_byte,
            header_len: (frame.get(46)? >> 4) * 4,
        },
        proto::UDP => L4::Udp {
            checksum_zero: f[40] == 0 && f[41] == 0,
        },
        _ => L4::IcmpQuery {
            ty: p.l4_byte,
            code: f[35],
            id: p.key.sport,
        },
    };
    Some(Dissect {
        vlan: None,
        inner_vlan: None,
        ethertype: ETH_IPV4,
        l3_off: Plain4::L3_OFF,
        l4_off: Plain4::L4_OFF,
        l3_end: 14 + u32::from(total),
        net: Net::Ipv4 {
            key: p.key,
            ttl: p.ttl,
            df: f[20] & 0x40 != 0,
            frag: Frag::None,
            total_len: total,
            header_len: 20,
        },
        l4,
    })
}

/// The general parse behind [`dissect`]: VLAN tags, IPv4 options and
/// fragments, IPv6 extension headers, ICMP errors, ARP.
fn dissect_general(frame: &[u8]) -> Result<Dissect, ParseError> {
    let eth: &[u8; 14] = frame.first_chunk().ok_or(ParseError::Truncated)?;
    let mut ty = be16(eth[12], eth[13]);
    let mut off = 14usize;
    let mut vlan = None;
    let mut inner_vlan = None;
    if ty == ETH_VLAN || ty == ETH_QINQ {
        // IEEE 802.1Q §9.6: TCI (PCP, DEI, 12-bit VID), then the next type.
        let t: &[u8; 4] = chunk(frame, off).ok_or(ParseError::Truncated)?;
        vlan = Some(be16(t[0], t[1]) & 0x0fff);
        ty = be16(t[2], t[3]);
        off += 4;
        if ty == ETH_VLAN || ty == ETH_QINQ {
            let t: &[u8; 4] = chunk(frame, off).ok_or(ParseError::Truncated)?;
            inner_vlan = Some(be16(t[0], t[1]) & 0x0fff);
            ty = be16(t[2], t[3]);
            off += 4;
            if ty == ETH_VLAN || ty == ETH_QINQ {
                return Err(ParseError::VlanDepth);
            }
        }
    }
    let mut d = Dissect {
        vlan,
        inner_vlan,
        ethertype: ty,
        l3_off: off as u16,
        l4_off: off as u16,
        l3_end: u32::try_from(frame.len()).unwrap_or(u32::MAX),
        net: Net::Other(ty),
        l4: L4::None,
    };
    // `off` ≤ 22 and the frame holds at least `off` bytes.
    let l3 = frame.get(off..).unwrap_or(&[]);
    match ty {
        ETH_IPV4 => ipv4(l3, off, &mut d)?,
        ETH_IPV6 => ipv6(l3, off, &mut d)?,
        ETH_ARP => arp(l3, off, &mut d)?,
        _ => {}
    }
    Ok(d)
}

/// What [`dissect_plain4`] extracts from a plain IPv4 frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Plain4 {
    /// Flow key, as [`Dissect::key4`] would return it.
    pub key: FlowKey4,
    /// Time to live.
    pub ttl: u8,
    /// TCP: the flags byte; ICMP: the query type; UDP: 0.
    pub l4_byte: u8,
}

impl Plain4 {
    /// Offset of the IPv4 header of a plain frame.
    pub const L3_OFF: u16 = 14;
    /// Offset of the L4 header of a plain frame.
    pub const L4_OFF: u16 = 34;
}

/// The fast-path parser for the common case: an untagged Ethernet frame
/// carrying an unfragmented IPv4 packet without options (IHL 5) with a TCP
/// segment, a UDP datagram or an ICMP query. Returns `None` for anything
/// else, valid or not, and the caller falls back to [`dissect`].
///
/// For every frame it accepts, [`dissect`] succeeds with `l3_off` =
/// [`Plain4::L3_OFF`], `l4_off` = [`Plain4::L4_OFF`], `Frag::None` and the
/// same key, TTL and L4 facts: the checks are the same ones (RFC 791 total
/// length, TCP data offset, UDP length, 8-byte ICMP header), on fixed
/// offsets, so that the whole parse is a handful of compares. Never panics.
#[inline]
pub fn dissect_plain4(frame: &[u8]) -> Option<Plain4> {
    let f: &[u8; 42] = frame.first_chunk()?;
    // Ethertype IPv4, version 4 and IHL 5, no MF flag and offset 0.
    if be16(f[12], f[13]) != ETH_IPV4 || f[14] != 0x45 || be16(f[20], f[21]) & 0x3fff != 0 {
        return None;
    }
    let total = usize::from(be16(f[16], f[17]));
    // RFC 791 §3.1; the 20-byte header is followed by at least 8 bytes.
    if total < 28 || total > frame.len() - 14 {
        return None;
    }
    let seg = total - 20;
    let proto_ = f[23];
    let mut key = FlowKey4 {
        src: u32::from_be_bytes([f[26], f[27], f[28], f[29]]),
        dst: u32::from_be_bytes([f[30], f[31], f[32], f[33]]),
        sport: be16(f[34], f[35]),
        dport: be16(f[36], f[37]),
        proto: proto_,
    };
    let l4_byte = match proto_ {
        proto::UDP => {
            let ulen = usize::from(be16(f[38], f[39]));
            if ulen < 8 || ulen > seg {
                return None;
            }
            0
        }
        proto::TCP => {
            let t: &[u8; 54] = frame.first_chunk()?;
            let hl = usize::from(t[46] >> 4) * 4;
            if seg < 20 || hl < 20 || hl > seg {
                return None;
            }
            t[47]
        }
        proto::ICMP => {
            let ty = f[34];
            if !icmp_is_query(ty, false) {
                return None;
            }
            let id = be16(f[38], f[39]);
            key.sport = id;
            key.dport = id;
            ty
        }
        _ => return None,
    };
    Some(Plain4 {
        key,
        ttl: f[22],
        l4_byte,
    })
}

/// What [`dissect_plain6`] extracts from a plain IPv6 frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Plain6 {
    /// Flow key, as [`dissect`] would return it.
    pub key: FlowKey6,
    /// Hop limit.
    pub hop_limit: u8,
    /// Payload length from the header.
    pub payload_len: u16,
    /// TCP: the flags byte; ICMPv6: the echo type; UDP: 0.
    pub l4_byte: u8,
}

impl Plain6 {
    /// Offset of the IPv6 header of a plain frame.
    pub const L3_OFF: u16 = 14;
    /// Offset of the L4 header of a plain frame.
    pub const L4_OFF: u16 = 54;
}

/// The IPv6 twin of [`dissect_plain4`]: an untagged Ethernet frame carrying
/// an IPv6 packet without extension headers with a TCP segment, a UDP
/// datagram with a non-zero checksum, or an ICMPv6 echo request or reply.
/// Returns `None` for anything else, valid or not.
///
/// For every frame it accepts, [`dissect`] succeeds with `l3_off` =
/// [`Plain6::L3_OFF`], `l4_off` = [`Plain6::L4_OFF`], `Frag::None` and the
/// same key, hop limit, payload length and L4 facts (RFC 8200 payload
/// length, TCP data offset, UDP length, 8-byte ICMPv6 header). Never panics.
#[inline]
pub fn dissect_plain6(frame: &[u8]) -> Option<Plain6> {
    let f: &[u8; 62] = frame.first_chunk()?;
    if be16(f[12], f[13]) != ETH_IPV6 || f[14] >> 4 != 6 {
        return None;
    }
    let plen = usize::from(be16(f[18], f[19]));
    if plen < 8 || plen > frame.len() - 54 {
        return None;
    }
    let nh = f[20];
    let mut key = FlowKey6 {
        src: u128::from_be_bytes(arr16(f, 22)),
        dst: u128::from_be_bytes(arr16(f, 38)),
        sport: be16(f[54], f[55]),
        dport: be16(f[56], f[57]),
        proto: nh,
    };
    let l4_byte = match nh {
        proto::UDP => {
            let ulen = usize::from(be16(f[58], f[59]));
            // A zero checksum is invalid over IPv6 (RFC 8200 §8.1): the
            // slow path counts it.
            if ulen < 8 || ulen > plen || (f[60] == 0 && f[61] == 0) {
                return None;
            }
            0
        }
        proto::TCP => {
            let t: &[u8; 74] = frame.first_chunk()?;
            let hl = usize::from(t[66] >> 4) * 4;
            if plen < 20 || hl < 20 || hl > plen {
                return None;
            }
            t[67]
        }
        proto::ICMPV6 => {
            let ty = f[54];
            if !icmp_is_query(ty, true) {
                return None;
            }
            let id = be16(f[58], f[59]);
            key.sport = id;
            key.dport = id;
            ty
        }
        _ => return None,
    };
    Some(Plain6 {
        key,
        hop_limit: f[21],
        payload_len: plen as u16,
        l4_byte,
    })
}

#[inline(always)]
fn arp(l3: &[u8], off: usize, d: &mut Dissect) -> Result<(), ParseError> {
    let a: &[u8; 28] = l3.first_chunk().ok_or(ParseError::Truncated)?;
    // RFC 826: htype 1 (Ethernet), ptype 0x0800, hlen 6, plen 4.
    if be16(a[0], a[1]) != 1 || be16(a[2], a[3]) != ETH_IPV4 || a[4] != 6 || a[5] != 4 {
        return Err(ParseError::ArpFormat);
    }
    d.net = Net::Arp {
        op: be16(a[6], a[7]),
        spa: u32::from_be_bytes([a[14], a[15], a[16], a[17]]),
        tpa: u32::from_be_bytes([a[24], a[25], a[26], a[27]]),
    };
    d.l4_off = (off + 28) as u16;
    d.l3_end = (off + 28) as u32;
    Ok(())
}

#[inline(always)]
fn ipv4(l3: &[u8], off: usize, d: &mut Dissect) -> Result<(), ParseError> {
    let h: &[u8; 20] = l3.first_chunk().ok_or(ParseError::Truncated)?;
    if h[0] >> 4 != 4 {
        return Err(ParseError::IpVersion);
    }
    let hl = usize::from(h[0] & 0x0f) * 4;
    if hl < 20 {
        return Err(ParseError::Ipv4HeaderLen);
    }
    let total = usize::from(be16(h[2], h[3]));
    // RFC 791 §3.1: the total length covers header and data.
    if total < hl || total > l3.len() {
        return Err(ParseError::Ipv4TotalLen);
    }
    let ff = be16(h[6], h[7]);
    let frag = Frag::from_mf_offset(ff & 0x2000 != 0, ff & 0x1fff);
    let mut key = FlowKey4 {
        src: u32::from_be_bytes([h[12], h[13], h[14], h[15]]),
        dst: u32::from_be_bytes([h[16], h[17], h[18], h[19]]),
        sport: 0,
        dport: 0,
        proto: h[9],
    };
    let l4_off = off + hl;
    d.l4_off = l4_off as u16;
    d.l3_end = (off + total) as u32;
    d.l4 = if frag == Frag::NonFirst {
        L4::NonFirstFragment
    } else {
        let seg = l3.get(hl..total).unwrap_or(&[]);
        let (ports, l4) = transport(seg, key.proto, false, frag, l4_off)?;
        key.sport = ports.0;
        key.dport = ports.1;
        l4
    };
    d.net = Net::Ipv4 {
        key,
        ttl: h[8],
        df: ff & 0x4000 != 0,
        frag,
        total_len: total as u16,
        header_len: hl as u8,
    };
    Ok(())
}

#[inline(always)]
fn ipv6(l3: &[u8], off: usize, d: &mut Dissect) -> Result<(), ParseError> {
    let h: &[u8; 40] = l3.first_chunk().ok_or(ParseError::Truncated)?;
    if h[0] >> 4 != 6 {
        return Err(ParseError::IpVersion);
    }
    let plen = usize::from(be16(h[4], h[5]));
    let payload = l3.get(40..40 + plen).ok_or(ParseError::Ipv6PayloadLen)?;
    let ul = walk_ext_headers(payload, h[6])?;
    let mut key = FlowKey6 {
        src: u128::from_be_bytes(arr16(h, 8)),
        dst: u128::from_be_bytes(arr16(h, 24)),
        sport: 0,
        dport: 0,
        proto: ul.protocol,
    };
    let l4_off = off + 40 + ul.offset;
    d.l4_off = off16(l4_off)?;
    d.l3_end = (off + 40 + plen) as u32;
    d.l4 = if ul.frag == Frag::NonFirst {
        L4::NonFirstFragment
    } else {
        let seg = payload.get(ul.offset..).unwrap_or(&[]);
        let (ports, l4) = transport(seg, key.proto, true, ul.frag, l4_off)?;
        key.sport = ports.0;
        key.dport = ports.1;
        l4
    };
    d.net = Net::Ipv6 {
        key,
        hop_limit: h[7],
        payload_len: plen as u16,
        frag: ul.frag,
    };
    Ok(())
}

#[inline(always)]
fn arr16(h: &[u8], at: usize) -> [u8; 16] {
    let mut o = [0u8; 16];
    // Callers pass fixed-size arrays that hold `at..at + 16`.
    if let Some(s) = h.get(at..at + 16) {
        o.copy_from_slice(s);
    }
    o
}

/// ICMP types keyed by identifier (RFC 5508 §3.1; RFC 4443 §4).
#[inline(always)]
fn icmp_is_query(ty: u8, v6: bool) -> bool {
    if v6 {
        matches!(ty, 128 | 129)
    } else {
        matches!(ty, 0 | 8 | 13 | 14 | 15 | 16 | 17 | 18)
    }
}

/// ICMP error types (RFC 792; RFC 4443 §2.1: types below 128).
#[inline(always)]
fn icmp_is_error(ty: u8, v6: bool) -> bool {
    if v6 {
        ty < 128
    } else {
        matches!(ty, 3 | 4 | 5 | 11 | 12)
    }
}

/// Parse the L4 header in `seg` (bounded by the IP length). Returns the
/// ports for the key and the summary.
#[inline(always)]
fn transport(
    seg: &[u8],
    proto_: u8,
    v6: bool,
    frag: Frag,
    l4_off: usize,
) -> Result<((u16, u16), L4), ParseError> {
    match proto_ {
        proto::TCP => {
            let t: &[u8; 20] = seg.first_chunk().ok_or(ParseError::Truncated)?;
            let hl = usize::from(t[12] >> 4) * 4;
            if hl < 20 || hl > seg.len() {
                return Err(ParseError::TcpDataOffset);
            }
            let ports = (be16(t[0], t[1]), be16(t[2], t[3]));
            Ok((
                ports,
                L4::Tcp {
                    flags: t[13],
                    header_len: hl as u8,
                },
            ))
        }
        proto::UDP => {
            let u: &[u8; 8] = seg.first_chunk().ok_or(ParseError::Truncated)?;
            let ulen = usize::from(be16(u[4], u[5]));
            // RFC 768: length counts header and data. A first fragment holds
            // only part of the datagram the length describes.
            if ulen < 8 || (frag == Frag::None && ulen > seg.len()) {
                return Err(ParseError::UdpLength);
            }
            let ports = (be16(u[0], u[1]), be16(u[2], u[3]));
            Ok((
                ports,
                L4::Udp {
                    checksum_zero: u[6] == 0 && u[7] == 0,
                },
            ))
        }
        p if p == if v6 { proto::ICMPV6 } else { proto::ICMP } => {
            let m: &[u8; 8] = seg.first_chunk().ok_or(ParseError::Truncated)?;
            let (ty, code) = (m[0], m[1]);
            if icmp_is_query(ty, v6) {
                let id = be16(m[4], m[5]);
                Ok(((id, id), L4::IcmpQuery { ty, code, id }))
            } else if icmp_is_error(ty, v6) {
                let quoted = seg.get(8..).unwrap_or(&[]);
                let inner_l3 = l4_off + 8;
                let (inner, inner_l4) = if v6 {
                    let (k, o) = inner6(quoted)?;
                    (InnerKey::V6(k), o)
                } else {
                    let (k, o) = inner4(quoted)?;
                    (InnerKey::V4(k), o)
                };
                Ok((
                    (0, 0),
                    L4::IcmpError {
                        ty,
                        code,
                        inner_l3_off: off16(inner_l3)?,
                        inner_l4_off: off16(inner_l3 + inner_l4)?,
                        inner,
                    },
                ))
            } else {
                Ok(((0, 0), L4::IcmpOther { ty, code }))
            }
        }
        _ => Ok(((0, 0), L4::Other)),
    }
}

/// Ports of a quoted packet's L4 header, which must hold 8 bytes (RFC 792).
#[inline]
fn inner_ports(l4: &[u8], proto_: u8, v6: bool) -> Result<(u16, u16), ParseError> {
    let icmp = if v6 { proto::ICMPV6 } else { proto::ICMP };
    if proto_ != proto::TCP && proto_ != proto::UDP && proto_ != icmp {
        return Ok((0, 0));
    }
    let h: &[u8; 8] = l4.first_chunk().ok_or(ParseError::IcmpInner)?;
    if proto_ == icmp {
        if icmp_is_query(h[0], v6) {
            let id = be16(h[4], h[5]);
            return Ok((id, id));
        }
        return Ok((0, 0));
    }
    Ok((be16(h[0], h[1]), be16(h[2], h[3])))
}

/// Key of a quoted IPv4 packet and the offset of its L4 header within `q`.
#[inline]
fn inner4(q: &[u8]) -> Result<(FlowKey4, usize), ParseError> {
    let h: &[u8; 20] = q.first_chunk().ok_or(ParseError::IcmpInner)?;
    let hl = usize::from(h[0] & 0x0f) * 4;
    if h[0] >> 4 != 4 || hl < 20 || usize::from(be16(h[2], h[3])) < hl {
        return Err(ParseError::IcmpInner);
    }
    let l4 = q.get(hl..).ok_or(ParseError::IcmpInner)?;
    let non_first = be16(h[6], h[7]) & 0x1fff != 0;
    let (sport, dport) = if non_first {
        (0, 0)
    } else {
        inner_ports(l4, h[9], false)?
    };
    let key = FlowKey4 {
        src: u32::from_be_bytes([h[12], h[13], h[14], h[15]]),
        dst: u32::from_be_bytes([h[16], h[17], h[18], h[19]]),
        sport,
        dport,
        proto: h[9],
    };
    Ok((key, hl))
}

/// Key of a quoted IPv6 packet and the offset of its L4 header within `q`.
#[inline]
fn inner6(q: &[u8]) -> Result<(FlowKey6, usize), ParseError> {
    let h: &[u8; 40] = q.first_chunk().ok_or(ParseError::IcmpInner)?;
    if h[0] >> 4 != 6 {
        return Err(ParseError::IcmpInner);
    }
    // The quote may be truncated: walk what is there, up to the payload length.
    let plen = usize::from(be16(h[4], h[5]));
    let rest = q.get(40..).unwrap_or(&[]);
    let payload = rest.get(..plen).unwrap_or(rest);
    let ul = walk_ext_headers(payload, h[6]).map_err(|_| ParseError::IcmpInner)?;
    let (sport, dport) = if ul.frag == Frag::NonFirst {
        (0, 0)
    } else {
        inner_ports(payload.get(ul.offset..).unwrap_or(&[]), ul.protocol, true)?
    };
    let key = FlowKey6 {
        src: u128::from_be_bytes(arr16(h, 8)),
        dst: u128::from_be_bytes(arr16(h, 24)),
        sport,
        dport,
        proto: ul.protocol,
    };
    Ok((key, 40 + ul.offset))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fuzz_support::{dissect_and_check, exercise_views};
    use proptest::prelude::*;

    /// Eth + IPv4 (DF) + UDP 1024 -> 7, 2 bytes of data, padded to 60.
    static UDP4: [u8; 60] = [
        0x02, 0, 0, 0, 0, 0x02, 0x02, 0, 0, 0, 0, 0x01, 0x08, 0x00, // eth
        0x45, 0x00, 0x00, 0x1e, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0x00, 0x00, // ip
        10, 0, 0, 1, 198, 18, 0, 1, //
        0x04, 0x00, 0x00, 0x07, 0x00, 0x0a, 0x12, 0x34, b'h', b'i', // udp
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, // padding
    ];

    /// `dissect_plain4` agrees with `dissect` on every frame it accepts.
    fn plain_agrees(frame: &[u8]) -> bool {
        let Some(p) = dissect_plain4(frame) else {
            return false;
        };
        let d = dissect(frame).expect("plain frames dissect");
        assert_eq!(d.l3_off, Plain4::L3_OFF);
        assert_eq!(d.l4_off, Plain4::L4_OFF);
        assert_eq!(d.vlan, None);
        let Net::Ipv4 { key, ttl, frag, .. } = d.net else {
            panic!("not ipv4: {d:?}");
        };
        assert_eq!((key, ttl, frag), (p.key, p.ttl, Frag::None));
        match d.l4 {
            L4::Tcp { flags, .. } => assert_eq!(flags, p.l4_byte),
            L4::Udp { .. } => assert_eq!(p.l4_byte, 0),
            L4::IcmpQuery { ty, .. } => assert_eq!(ty, p.l4_byte),
            other => panic!("plain4 accepted {other:?}"),
        }
        true
    }

    /// The fast path inside `dissect` gives exactly what the general parse
    /// gives, on every frame it takes.
    fn full_agrees(frame: &[u8]) -> bool {
        let Some(d) = dissect_plain4_full(frame) else {
            return false;
        };
        assert_eq!(Ok(d), dissect_general(frame), "{frame:02x?}");
        true
    }

    proptest! {
        #[test]
        fn plain4_full_equals_general(
            base in 0usize..3,
            edits in proptest::collection::vec((0usize..60, any::<u8>()), 0..4),
            len in 28usize..=60,
        ) {
            let mut f = UDP4;
            match base {
                1 => {
                    f[16..18].copy_from_slice(&40u16.to_be_bytes());
                    f[23] = 6;
                    f[46] = 0x50;
                    f[47] = 0x12;
                }
                2 => {
                    f[23] = 1;
                    f[34] = 8;
                    f[35] = 0;
                }
                _ => {}
            }
            for (i, b) in edits {
                f[i] = b;
            }
            let frame = &f[..len];
            full_agrees(frame);
            // Whatever the fast path says, `dissect` is the general parse.
            prop_assert_eq!(dissect(frame), dissect_general(frame));
        }
    }

    #[test]
    fn plain4_matches_dissect_on_fixtures() {
        assert!(full_agrees(&UDP4));
        assert!(plain_agrees(&UDP4));
        assert!(!plain_agrees(&VLAN_TCP4));
        assert!(!plain_agrees(&QINQ_ARP));
        assert!(!plain_agrees(&ICMP4_ERR));
        let mut tcp = [0u8; 60];
        tcp[..14].copy_from_slice(&UDP4[..14]);
        tcp[14..34].copy_from_slice(&UDP4[14..34]);
        tcp[16..18].copy_from_slice(&40u16.to_be_bytes());
        tcp[23] = 6;
        tcp[46] = 0x50;
        tcp[47] = 0x12;
        assert!(plain_agrees(&tcp));
        // Data offset beyond the segment, fragment bits, options: refused.
        let mut bad = tcp;
        bad[46] = 0x60;
        assert!(!plain_agrees(&bad));
        let mut frag = UDP4;
        frag[20] |= 0x20;
        assert!(!plain_agrees(&frag));
    }

    /// `dissect_plain6` agrees with `dissect` on every frame it accepts.
    fn plain6_agrees(frame: &[u8]) -> bool {
        let Some(p) = dissect_plain6(frame) else {
            return false;
        };
        let d = dissect(frame).expect("plain IPv6 frames dissect");
        assert_eq!(d.l3_off, Plain6::L3_OFF);
        assert_eq!(d.l4_off, Plain6::L4_OFF);
        assert_eq!(d.vlan, None);
        let Net::Ipv6 {
            key,
            hop_limit,
            payload_len,
            frag,
        } = d.net
        else {
            panic!("not ipv6: {d:?}");
        };
        assert_eq!(
            (key, hop_limit, payload_len, frag),
            (p.key, p.hop_limit, p.payload_len, Frag::None)
        );
        match d.l4 {
            L4::Tcp { flags, .. } => assert_eq!(flags, p.l4_byte),
            L4::Udp { checksum_zero } => {
                assert_eq!(p.l4_byte, 0);
                assert!(!checksum_zero);
            }
            L4::IcmpQuery { ty, .. } => assert_eq!(ty, p.l4_byte),
            other => panic!("plain6 accepted {other:?}"),
        }
        true
    }

    #[test]
    fn plain6_matches_dissect_on_built_frames() {
        use crate::build::{build_icmp6_echo, build_icmp6_error, build_tcp6, build_udp6};
        let k = FlowKey6 {
            src: 0xfd00_0001 << 96 | 2,
            dst: 0x2001_0db8 << 96 | 0x80,
            sport: 40000,
            dport: 53,
            proto: proto::UDP,
        };
        let mut b = [0u8; 256];
        let n = build_udp6(&mut b, [2; 6], [4; 6], &k, 10).unwrap();
        assert!(plain6_agrees(&b[..n]));
        // Zero UDP checksum, truncated payload, extension header: refused.
        let mut z = b;
        z[60] = 0;
        z[61] = 0;
        assert!(!plain6_agrees(&z[..n]));
        assert!(!plain6_agrees(&b[..n - 1]));
        let mut ext = b;
        ext[20] = 0; // hop-by-hop options
        assert!(!plain6_agrees(&ext[..n]));
        let n = build_tcp6(&mut b, [2; 6], [4; 6], &k, 0x12, 1, 2, 0).unwrap();
        assert!(plain6_agrees(&b[..n]));
        let mut bad = b;
        bad[66] = 0x60;
        assert!(!plain6_agrees(&bad[..n]));
        let n = build_icmp6_echo(&mut b, [2; 6], [4; 6], &k, 7, true, 4).unwrap();
        assert!(plain6_agrees(&b[..n]));
        assert_eq!(dissect_plain6(&b[..n]).unwrap().key.sport, k.sport);
        let q = b[14..n].to_vec();
        let n = build_icmp6_error(&mut b, [2; 6], [4; 6], 1, 2, 1, 0, 0, &q).unwrap();
        assert!(!plain6_agrees(&b[..n]), "errors take the general path");
    }

    proptest! {
        #[test]
        fn plain6_never_disagrees_with_dissect(
            mut bytes in proptest::collection::vec(any::<u8>(), 0..120),
            proto_ in prop_oneof![Just(6u8), Just(17u8), Just(58u8), any::<u8>()],
            icmp_ty in prop_oneof![Just(128u8), Just(129u8), any::<u8>()],
        ) {
            if bytes.len() >= 62 {
                bytes[12] = 0x86;
                bytes[13] = 0xdd;
                bytes[14] = 0x60 | (bytes[14] & 0x0f);
                bytes[20] = proto_;
                let plen = (bytes.len() - 54) as u16;
                bytes[18..20].copy_from_slice(&plen.to_be_bytes());
                if proto_ == 58 {
                    bytes[54] = icmp_ty;
                }
            }
            plain6_agrees(&bytes);
        }

        #[test]
        fn plain4_never_disagrees_with_dissect(
            mut bytes in proptest::collection::vec(any::<u8>(), 0..80),
            proto_ in prop_oneof![Just(1u8), Just(6u8), Just(17u8), any::<u8>()],
        ) {
            // Bias towards frames that get past the first checks.
            if bytes.len() >= 24 {
                bytes[12] = 0x08;
                bytes[13] = 0x00;
                bytes[14] = 0x45;
                bytes[20] &= 0x40;
                bytes[21] = 0;
                bytes[23] = proto_;
                let total = (bytes.len() - 14) as u16;
                bytes[16..18].copy_from_slice(&total.to_be_bytes());
            }
            plain_agrees(&bytes);
        }
    }

    /// Eth + 802.1Q vid 100 + IPv4 with one option word + TCP SYN with MSS.
    static VLAN_TCP4: [u8; 66] = [
        0x02, 0, 0, 0, 0, 0x02, 0x02, 0, 0, 0, 0, 0x01, 0x81, 0x00, 0x00, 0x64, 0x08, 0x00, 0x46,
        0x00, 0x00, 0x30, 0x00, 0x01, 0x00, 0x00, 0x40, 0x06, 0x00, 0x00, // ip, IHL 6
        192, 168, 1, 10, 93, 184, 216, 34, 0x01, 0x01, 0x01, 0x00, //
        0xc3, 0x50, 0x01, 0xbb, 0, 0, 0, 1, 0, 0, 0, 0, 0x60, 0x02, 0xff, 0xff, 0, 0, 0, 0, 0x02,
        0x04, 0x05, 0xb4, // MSS option
    ];

    /// Eth + 802.1ad S-tag 10 + 802.1Q C-tag 20 + ARP request, padded.
    static QINQ_ARP: [u8; 60] = [
        0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02, 0, 0, 0, 0, 0x01, 0x88, 0xa8, 0x00, 0x0a, 0x81,
        0x00, 0x00, 0x14, 0x08, 0x06, // tags, ARP
        0x00, 0x01, 0x08, 0x00, 0x06, 0x04, 0x00, 0x01, 0x02, 0, 0, 0, 0, 0x01, 10, 0, 0, 1, 0, 0,
        0, 0, 0, 0, 10, 0, 0, 2, //
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    ];

    /// Eth + IPv4 ICMP port unreachable 198.18.0.1 -> 10.0.0.1 quoting the
    /// UDP4 datagram, truncated to IP header + 8 bytes.
    static ICMP4_ERR: [u8; 70] = [
        0x02, 0, 0, 0, 0, 0x01, 0x02, 0, 0, 0, 0, 0x02, 0x08, 0x00, //
        0x45, 0x00, 0x00, 0x38, 0x00, 0x00, 0x00, 0x00, 0x40, 0x01, 0x00, 0x00, //
        198, 18, 0, 1, 10, 0, 0, 1, //
        0x03, 0x03, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // icmp
        0x45, 0x00, 0x00, 0x1e, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0x00, 0x00, // quoted ip
        10, 0, 0, 1, 198, 18, 0, 1, //
        0x04, 0x00, 0x00, 0x07, 0x00, 0x0a, 0x12, 0x34, // quoted udp
    ];

    /// Eth + IPv6 + hop-by-hop + fragment (first) + TCP ACK 443 -> 50000.
    static TCP6_EXT: [u8; 90] = [
        0x02, 0, 0, 0, 0, 0x02, 0x02, 0, 0, 0, 0, 0x01, 0x86, 0xdd, //
        0x60, 0x00, 0x00, 0x00, 0x00, 0x24, 0x00, 0x3f, // len 36, nh HbH, hlim 63
        0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, //
        0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2, //
        44, 0, 1, 4, 0, 0, 0, 0, // HbH -> frag
        6, 0, 0x00, 0x01, 0, 0, 0, 9, // frag -> TCP, offset 0, M
        0x01, 0xbb, 0xc3, 0x50, 0, 0, 0, 1, 0, 0, 0, 1, 0x50, 0x10, 0x01, 0x00, 0, 0, 0, 0,
    ];

    /// Eth + IPv6 + ICMPv6 echo request id 0x0abc.
    static ECHO6: [u8; 62] = [
        0x02, 0, 0, 0, 0, 0x02, 0x02, 0, 0, 0, 0, 0x01, 0x86, 0xdd, //
        0x60, 0x00, 0x00, 0x00, 0x00, 0x08, 58, 0x40, //
        0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, //
        0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2, //
        128, 0, 0, 0, 0x0a, 0xbc, 0x00, 0x01,
    ];

    fn fixtures() -> [&'static [u8]; 6] {
        [&UDP4, &VLAN_TCP4, &QINQ_ARP, &ICMP4_ERR, &TCP6_EXT, &ECHO6]
    }

    #[test]
    fn udp4() {
        let d = dissect(&UDP4).unwrap();
        assert_eq!((d.vlan, d.l3_off, d.l4_off, d.l3_end), (None, 14, 34, 44));
        let key = FlowKey4 {
            src: 0x0a00_0001,
            dst: 0xc612_0001,
            sport: 1024,
            dport: 7,
            proto: 17,
        };
        assert_eq!(
            d.net,
            Net::Ipv4 {
                key,
                ttl: 64,
                df: true,
                frag: Frag::None,
                total_len: 30,
                header_len: 20
            }
        );
        assert_eq!(
            d.l4,
            L4::Udp {
                checksum_zero: false
            }
        );
    }

    #[test]
    fn vlan_tcp4_with_options() {
        let d = dissect(&VLAN_TCP4).unwrap();
        assert_eq!(
            (d.vlan, d.inner_vlan, d.l3_off, d.l4_off),
            (Some(100), None, 18, 42)
        );
        assert_eq!(
            d.l4,
            L4::Tcp {
                flags: crate::tcp::flags::SYN,
                header_len: 24
            }
        );
        let k = d.key4().unwrap();
        assert_eq!((k.sport, k.dport, k.proto), (50000, 443, 6));
        assert_eq!(k.dst_addr(), core::net::Ipv4Addr::new(93, 184, 216, 34));
    }

    #[test]
    fn qinq_arp() {
        let d = dissect(&QINQ_ARP).unwrap();
        assert_eq!((d.vlan, d.inner_vlan, d.l3_off), (Some(10), Some(20), 22));
        assert_eq!(
            d.net,
            Net::Arp {
                op: 1,
                spa: 0x0a00_0001,
                tpa: 0x0a00_0002
            }
        );
        assert_eq!(d.l4, L4::None);
        let mut b = QINQ_ARP;
        b[27] = 16; // plen
        assert_eq!(dissect(&b), Err(ParseError::ArpFormat));
    }

    #[test]
    fn icmp4_error_inner_key_as_sent() {
        let d = dissect(&ICMP4_ERR).unwrap();
        let outer = d.key4().unwrap();
        assert_eq!((outer.sport, outer.dport, outer.proto), (0, 0, 1));
        let inner = FlowKey4 {
            src: 0x0a00_0001,
            dst: 0xc612_0001,
            sport: 1024,
            dport: 7,
            proto: 17,
        };
        assert_eq!(
            d.l4,
            L4::IcmpError {
                ty: 3,
                code: 3,
                inner_l3_off: 42,
                inner_l4_off: 62,
                inner: InnerKey::V4(inner)
            }
        );
        // Seven bytes of quoted UDP are not enough (RFC 792 promises 8).
        let mut b = ICMP4_ERR;
        b[17] -= 1;
        assert_eq!(dissect(&b[..69]), Err(ParseError::IcmpInner));
        // Quoted IHL < 5.
        let mut b = ICMP4_ERR;
        b[42] = 0x44;
        assert_eq!(dissect(&b), Err(ParseError::IcmpInner));
    }

    #[test]
    fn icmp4_error_about_echo_keys_by_id() {
        let mut b = ICMP4_ERR;
        b[51] = 1; // quoted proto ICMP
        b[62..70].copy_from_slice(&[8, 0, 0, 0, 0x55, 0x66, 0, 1]);
        match dissect(&b).unwrap().l4 {
            L4::IcmpError {
                inner: InnerKey::V4(k),
                ..
            } => {
                assert_eq!((k.sport, k.dport, k.proto), (0x5566, 0x5566, 1));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn ipv6_extension_headers() {
        let d = dissect(&TCP6_EXT).unwrap();
        assert_eq!((d.l3_off, d.l4_off, d.l3_end), (14, 70, 90));
        match d.net {
            Net::Ipv6 {
                key,
                hop_limit: 63,
                payload_len: 36,
                frag: Frag::First,
            } => {
                assert_eq!((key.sport, key.dport, key.proto), (443, 50000, 6));
                assert_eq!(key.src, 0x2001_0db8_0000_0000_0000_0000_0000_0001);
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            d.l4,
            L4::Tcp {
                flags: crate::tcp::flags::ACK,
                header_len: 20
            }
        );
        // Non-first fragment: no ports, proto from the fragment header.
        let mut b = TCP6_EXT;
        b[64] = 0x05;
        let d = dissect(&b).unwrap();
        assert_eq!(d.l4, L4::NonFirstFragment);
        assert_eq!(d.frag(), Frag::NonFirst);
        assert_eq!(d.key6().map(|k| (k.sport, k.proto)), Some((0, 6)));
    }

    #[test]
    fn icmp6_echo() {
        let d = dissect(&ECHO6).unwrap();
        assert_eq!(
            d.l4,
            L4::IcmpQuery {
                ty: 128,
                code: 0,
                id: 0x0abc
            }
        );
        let k = d.key6().unwrap();
        assert_eq!((k.sport, k.dport, k.proto), (0x0abc, 0x0abc, 58));
        let mut b = ECHO6;
        b[54] = 135; // neighbor solicitation
        assert_eq!(dissect(&b).unwrap().l4, L4::IcmpOther { ty: 135, code: 0 });
    }

    #[test]
    fn ipv4_fragments() {
        let mut b = UDP4;
        b[20] = 0x20; // MF, offset 0: first fragment; UDP length not checked
        b[38] = 0x05;
        let d = dissect(&b).unwrap();
        assert_eq!(d.frag(), Frag::First);
        assert_eq!(d.key4().map(|k| k.sport), Some(1024));
        b[21] = 0x10; // offset 16 * 8
        let d = dissect(&b).unwrap();
        assert_eq!((d.frag(), d.l4), (Frag::NonFirst, L4::NonFirstFragment));
        assert_eq!(d.key4().map(|k| (k.sport, k.dport)), Some((0, 0)));
    }

    #[test]
    fn every_error_variant() {
        let e = |b: &[u8]| dissect(b).err();
        assert_eq!(e(&UDP4[..13]), Some(ParseError::Truncated));
        assert_eq!(e(&VLAN_TCP4[..16]), Some(ParseError::Truncated));
        let mut b = QINQ_ARP;
        b[20] = 0x81;
        b[21] = 0x00;
        assert_eq!(e(&b), Some(ParseError::VlanDepth));
        let mut b = UDP4;
        b[14] = 0x65;
        assert_eq!(e(&b), Some(ParseError::IpVersion));
        b[14] = 0x44;
        assert_eq!(e(&b), Some(ParseError::Ipv4HeaderLen));
        let mut b = UDP4;
        b[17] = 61; // total length beyond the 46 bytes present
        assert_eq!(e(&b), Some(ParseError::Ipv4TotalLen));
        b[17] = 19;
        assert_eq!(e(&b), Some(ParseError::Ipv4TotalLen));
        let mut b = UDP4;
        b[39] = 11; // UDP length beyond the IP payload (padding does not count)
        assert_eq!(e(&b), Some(ParseError::UdpLength));
        b[39] = 7;
        assert_eq!(e(&b), Some(ParseError::UdpLength));
        let mut b = UDP4;
        b[17] = 27; // IP payload of 7 bytes: UDP header cut
        assert_eq!(e(&b), Some(ParseError::Truncated));
        let mut b = VLAN_TCP4;
        b[54] = 0x40;
        assert_eq!(e(&b), Some(ParseError::TcpDataOffset));
        b[54] = 0x70;
        assert_eq!(e(&b), Some(ParseError::TcpDataOffset));
        assert_eq!(e(&TCP6_EXT[..89]), Some(ParseError::Ipv6PayloadLen));
        let mut b = TCP6_EXT;
        b[55] = 2; // HbH claims 24 bytes, running into the TCP header end
        b[19] = 0x1c;
        assert_eq!(e(&b[..82]), Some(ParseError::Ipv6ExtHeader));
    }

    #[test]
    fn other_ethertype_and_protocol() {
        let mut b = UDP4;
        b[12] = 0x88;
        b[13] = 0xcc; // LLDP
        let d = dissect(&b).unwrap();
        assert_eq!((d.net, d.l4, d.l3_end), (Net::Other(0x88cc), L4::None, 60));
        let mut b = UDP4;
        b[23] = 47; // GRE
        let d = dissect(&b).unwrap();
        assert_eq!(d.l4, L4::Other);
        assert_eq!(d.key4().map(|k| (k.sport, k.proto)), Some((0, 47)));
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 2048, ..ProptestConfig::default() })]

        /// No byte string makes `dissect` or any checked view panic.
        #[test]
        fn arbitrary_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..160)) {
            let _ = dissect_and_check(&data);
            exercise_views(&data);
            for off in [14usize, 18, 22, 34, 54] {
                if let Some(rest) = data.get(off..) {
                    exercise_views(rest);
                }
            }
        }

        /// Valid frames with a few bytes changed and a random cut reach the
        /// deep paths (options, extension headers, quoted packets).
        #[test]
        fn mutated_fixtures_never_panic(
            which in 0usize..6,
            edits in proptest::collection::vec((any::<usize>(), any::<u8>()), 0..4),
            cut in any::<usize>(),
        ) {
            let mut b = fixtures()[which].to_vec();
            for (at, v) in edits {
                let i = at % b.len();
                b[i] = v;
            }
            b.truncate(cut % (b.len() + 1) + if cut % 2 == 0 { b.len() } else { 0 });
            let _ = dissect_and_check(&b);
            for off in [14usize, 18, 22, 34, 42, 54] {
                if let Some(rest) = b.get(off..) {
                    exercise_views(rest);
                }
            }
        }
    }

    #[test]
    fn fixtures_pass_invariants() {
        for f in fixtures() {
            assert!(dissect_and_check(f).is_some());
        }
    }
}
