//! IPv6 Neighbor Discovery (RFC 4861): neighbor solicitations and
//! advertisements with their link-layer address options, the addresses NDP
//! derives (solicited-node multicast, its Ethernet group address, the
//! EUI-64 link-local address) and builders for complete frames.
//!
//! [`parse`] applies the receive-side validity checks of RFC 4861 §7.1.1
//! and §7.1.2 that do not need interface state; it never panics on any byte
//! string. Frames built here carry hop limit 255 (RFC 4861 §7.1) and a
//! correct ICMPv6 checksum (RFC 4443 §2.3).

use core::net::Ipv6Addr;

use crate::checksum;
use crate::flow::proto;

/// ICMPv6 type of a router solicitation.
pub const ROUTER_SOLICIT: u8 = 133;
/// ICMPv6 type of a router advertisement.
pub const ROUTER_ADVERT: u8 = 134;
/// ICMPv6 type of a neighbor solicitation.
pub const NEIGHBOR_SOLICIT: u8 = 135;
/// ICMPv6 type of a neighbor advertisement.
pub const NEIGHBOR_ADVERT: u8 = 136;
/// ICMPv6 type of a redirect.
pub const REDIRECT: u8 = 137;

/// Option type: source link-layer address (RFC 4861 §4.6.1).
pub const OPT_SOURCE_LLADDR: u8 = 1;
/// Option type: target link-layer address (RFC 4861 §4.6.1).
pub const OPT_TARGET_LLADDR: u8 = 2;

/// NA flag: the sender is a router.
pub const FLAG_ROUTER: u8 = 0x80;
/// NA flag: sent in response to a solicitation.
pub const FLAG_SOLICITED: u8 = 0x40;
/// NA flag: override an existing cache entry.
pub const FLAG_OVERRIDE: u8 = 0x20;

/// Hop limit every NDP message is sent with and must arrive with.
pub const HOP_LIMIT: u8 = 255;

/// Length of an NS or NA with one link-layer address option (ICMPv6 bytes).
pub const MSG_LEN: usize = 32;
/// Length of the Ethernet frame [`build_ns`] and [`build_na`] write.
pub const FRAME_LEN: usize = 14 + 40 + MSG_LEN;

/// The link-local prefix fe80::/10.
pub fn is_link_local(a: u128) -> bool {
    a >> 118 == 0x3fa
}

/// Multicast ff00::/8.
pub fn is_multicast(a: u128) -> bool {
    a >> 120 == 0xff
}

/// The solicited-node multicast address of `a`: ff02::1:ff00:0/104 plus the
/// low 24 bits of `a` (RFC 4291 §2.7.1).
pub fn solicited_node(a: u128) -> u128 {
    0xff02_0000_0000_0000_0000_0001_ff00_0000 | (a & 0x00ff_ffff)
}

/// Whether `a` is a solicited-node multicast address.
pub fn is_solicited_node(a: u128) -> bool {
    a & !0x00ff_ffff == 0xff02_0000_0000_0000_0000_0001_ff00_0000
}

/// The Ethernet group address of IPv6 multicast `a`: 33:33 and its low 32
/// bits (RFC 2464 §7).
pub fn multicast_mac(a: u128) -> [u8; 6] {
    let b = (a as u32).to_be_bytes();
    [0x33, 0x33, b[0], b[1], b[2], b[3]]
}

/// The link-local address fe80::/64 with the modified EUI-64 interface
/// identifier of `mac` (RFC 4291 appendix A, RFC 2464 §4-5).
pub fn link_local(mac: [u8; 6]) -> Ipv6Addr {
    let iid = [
        mac[0] ^ 0x02,
        mac[1],
        mac[2],
        0xff,
        0xfe,
        mac[3],
        mac[4],
        mac[5],
    ];
    let mut o = [0u8; 16];
    o[0] = 0xfe;
    o[1] = 0x80;
    o[8..].copy_from_slice(&iid);
    Ipv6Addr::from(o)
}

/// What a neighbor solicitation or advertisement says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct NdpRepr {
    /// [`NEIGHBOR_SOLICIT`] or [`NEIGHBOR_ADVERT`].
    pub msg_type: u8,
    /// NA flags ([`FLAG_ROUTER`], ...); 0 in an NS.
    pub flags: u8,
    /// The target address.
    pub target: u128,
    /// The source (NS) or target (NA) link-layer address option, if present.
    pub lladdr: Option<[u8; 6]>,
}

/// Why an NDP message is not valid (RFC 4861 §7.1.1 / §7.1.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NdpError {
    /// Not an NS or NA.
    NotNeighbor,
    /// Shorter than 24 bytes, or an option runs past the end.
    Truncated,
    /// Hop limit is not 255: the message crossed a router.
    HopLimit,
    /// Code is not 0.
    Code,
    /// The ICMPv6 checksum does not verify.
    Checksum,
    /// The target is a multicast address.
    MulticastTarget,
    /// An option has length 0.
    ZeroLengthOption,
    /// An NS from the unspecified address carries a source link-layer
    /// option, or is not sent to a solicited-node address.
    BadDad,
    /// An NA to a multicast address has the solicited flag set.
    SolicitedMulticast,
}

impl core::fmt::Display for NdpError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            NdpError::NotNeighbor => "not a neighbor solicitation or advertisement",
            NdpError::Truncated => "truncated",
            NdpError::HopLimit => "hop limit is not 255",
            NdpError::Code => "code is not 0",
            NdpError::Checksum => "bad ICMPv6 checksum",
            NdpError::MulticastTarget => "multicast target",
            NdpError::ZeroLengthOption => "option of length 0",
            NdpError::BadDad => "bad duplicate address detection probe",
            NdpError::SolicitedMulticast => "solicited advertisement to a multicast address",
        })
    }
}

/// ICMPv6 checksum over the pseudo-header and `msg` (whose checksum field
/// is included as it is).
pub fn icmp6_sum(src: u128, dst: u128, msg: &[u8]) -> u16 {
    let len = u32::try_from(msg.len()).unwrap_or(u32::MAX);
    checksum::finish(checksum::add(
        checksum::pseudo_v6(src, dst, proto::ICMPV6, len),
        checksum::sum(msg),
    ))
}

/// Parse and validate the ICMPv6 message `msg` (from its type byte to the
/// end of the IPv6 payload) of a packet from `src` to `dst` with hop limit
/// `hop_limit`.
pub fn parse(src: u128, dst: u128, hop_limit: u8, msg: &[u8]) -> Result<NdpRepr, NdpError> {
    let ty = *msg.first().ok_or(NdpError::Truncated)?;
    if ty != NEIGHBOR_SOLICIT && ty != NEIGHBOR_ADVERT {
        return Err(NdpError::NotNeighbor);
    }
    if msg.len() < 24 {
        return Err(NdpError::Truncated);
    }
    if hop_limit != HOP_LIMIT {
        return Err(NdpError::HopLimit);
    }
    if msg.get(1) != Some(&0) {
        return Err(NdpError::Code);
    }
    if icmp6_sum(src, dst, msg) != 0 {
        return Err(NdpError::Checksum);
    }
    let flags = if ty == NEIGHBOR_ADVERT {
        msg.get(4).copied().unwrap_or(0) & 0xe0
    } else {
        0
    };
    let mut t = [0u8; 16];
    t.copy_from_slice(msg.get(8..24).ok_or(NdpError::Truncated)?);
    let target = u128::from_be_bytes(t);
    if is_multicast(target) {
        return Err(NdpError::MulticastTarget);
    }
    let want = if ty == NEIGHBOR_SOLICIT {
        OPT_SOURCE_LLADDR
    } else {
        OPT_TARGET_LLADDR
    };
    let mut lladdr = None;
    let mut opts = msg.get(24..).unwrap_or(&[]);
    while !opts.is_empty() {
        let (Some(&ot), Some(&ol)) = (opts.first(), opts.get(1)) else {
            return Err(NdpError::Truncated);
        };
        let olen = usize::from(ol) * 8;
        if olen == 0 {
            return Err(NdpError::ZeroLengthOption);
        }
        let o = opts.get(..olen).ok_or(NdpError::Truncated)?;
        if ot == want && olen == 8 {
            let mut m = [0u8; 6];
            m.copy_from_slice(o.get(2..8).ok_or(NdpError::Truncated)?);
            lladdr = Some(m);
        }
        opts = opts.get(olen..).unwrap_or(&[]);
    }
    if ty == NEIGHBOR_SOLICIT && src == 0 && (lladdr.is_some() || !is_solicited_node(dst)) {
        return Err(NdpError::BadDad);
    }
    if ty == NEIGHBOR_ADVERT && is_multicast(dst) && flags & FLAG_SOLICITED != 0 {
        return Err(NdpError::SolicitedMulticast);
    }
    Ok(NdpRepr {
        msg_type: ty,
        flags,
        target,
        lladdr,
    })
}

/// Write an untagged Ethernet + IPv6 + NS/NA frame of [`FRAME_LEN`] bytes.
#[allow(clippy::too_many_arguments)]
fn build(
    buf: &mut [u8],
    src_mac: [u8; 6],
    dst_mac: [u8; 6],
    src: u128,
    dst: u128,
    ty: u8,
    flags: u8,
    target: u128,
    opt: u8,
) -> Option<usize> {
    let f = buf.get_mut(..FRAME_LEN)?;
    f.fill(0);
    f[0..6].copy_from_slice(&dst_mac);
    f[6..12].copy_from_slice(&src_mac);
    f[12..14].copy_from_slice(&0x86ddu16.to_be_bytes());
    f[14] = 0x60;
    f[18..20].copy_from_slice(&(MSG_LEN as u16).to_be_bytes());
    f[20] = proto::ICMPV6;
    f[21] = HOP_LIMIT;
    f[22..38].copy_from_slice(&src.to_be_bytes());
    f[38..54].copy_from_slice(&dst.to_be_bytes());
    let m = &mut f[54..];
    m[0] = ty;
    m[4] = flags;
    m[8..24].copy_from_slice(&target.to_be_bytes());
    m[24] = opt;
    m[25] = 1;
    m[26..32].copy_from_slice(&src_mac);
    let c = icmp6_sum(src, dst, m);
    m[2..4].copy_from_slice(&c.to_be_bytes());
    Some(FRAME_LEN)
}

/// A neighbor solicitation for `target` from `src` (our address on the
/// link) with our link-layer address as source option. `unicast`: the
/// neighbour's known MAC, for a reachability probe sent to `target` itself
/// (RFC 4861 §7.3.3); `None` sends to the solicited-node group of `target`
/// (address resolution, §7.2.2). Returns the frame length, or `None` when
/// `buf` is shorter than [`FRAME_LEN`].
pub fn build_ns(
    buf: &mut [u8],
    src_mac: [u8; 6],
    src: u128,
    target: u128,
    unicast: Option<[u8; 6]>,
) -> Option<usize> {
    let (dst, dst_mac) = match unicast {
        Some(m) => (target, m),
        None => {
            let g = solicited_node(target);
            (g, multicast_mac(g))
        }
    };
    build(
        buf,
        src_mac,
        dst_mac,
        src,
        dst,
        NEIGHBOR_SOLICIT,
        0,
        target,
        OPT_SOURCE_LLADDR,
    )
}

/// A neighbor advertisement for `target` (ours) with our link-layer address
/// as target option, from `target` to `dst`.
pub fn build_na(
    buf: &mut [u8],
    src_mac: [u8; 6],
    dst_mac: [u8; 6],
    target: u128,
    dst: u128,
    flags: u8,
) -> Option<usize> {
    build(
        buf,
        src_mac,
        dst_mac,
        target,
        dst,
        NEIGHBOR_ADVERT,
        flags,
        target,
        OPT_TARGET_LLADDR,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAC: [u8; 6] = [0x52, 0x54, 0x00, 0x12, 0x34, 0x56];

    fn a(s: &str) -> u128 {
        u128::from(s.parse::<Ipv6Addr>().unwrap())
    }

    #[test]
    fn derived_addresses_match_rfc_examples() {
        // RFC 4291 §2.5.1 / appendix A: the universal/local bit is inverted
        // and ff:fe is inserted in the middle.
        assert_eq!(
            link_local(MAC),
            "fe80::5054:ff:fe12:3456".parse::<Ipv6Addr>().unwrap()
        );
        assert!(is_link_local(u128::from(link_local(MAC))));
        assert!(!is_link_local(a("fec0::1")));
        assert_eq!(
            solicited_node(a("fd00:1::1234:5678")),
            a("ff02::1:ff34:5678")
        );
        assert!(is_solicited_node(a("ff02::1:ff34:5678")));
        assert!(!is_solicited_node(a("ff02::1")));
        assert_eq!(
            multicast_mac(a("ff02::1:ff34:5678")),
            [0x33, 0x33, 0xff, 0x34, 0x56, 0x78]
        );
        assert!(is_multicast(a("ff02::1")) && !is_multicast(a("fd00::1")));
    }

    #[test]
    fn ns_round_trips_and_its_checksum_verifies() {
        let mut b = [0u8; 128];
        let src = a("fd00:1::1");
        let target = a("fd00:1::2");
        let n = build_ns(&mut b, MAC, src, target, None).unwrap();
        assert_eq!(n, FRAME_LEN);
        assert_eq!(&b[0..6], &[0x33, 0x33, 0xff, 0, 0, 2]);
        let dst = u128::from_be_bytes(b[38..54].try_into().unwrap());
        assert_eq!(dst, a("ff02::1:ff00:2"));
        assert_eq!(b[21], 255);
        // RFC 4443 §2.3: the checksum covers the pseudo-header.
        assert_eq!(icmp6_sum(src, dst, &b[54..n]), 0);
        let r = parse(src, dst, 255, &b[54..n]).unwrap();
        assert_eq!(
            r,
            NdpRepr {
                msg_type: NEIGHBOR_SOLICIT,
                flags: 0,
                target,
                lladdr: Some(MAC)
            }
        );
        // The same message judged against another pseudo-header fails.
        assert_eq!(
            parse(a("fd00:1::9"), dst, 255, &b[54..n]),
            Err(NdpError::Checksum)
        );
        // Unicast probe: sent to the target and its MAC.
        let n = build_ns(&mut b, MAC, src, target, Some([2, 0, 0, 0, 0, 9])).unwrap();
        assert_eq!(&b[0..6], &[2, 0, 0, 0, 0, 9]);
        assert_eq!(parse(src, target, 255, &b[54..n]).unwrap().target, target);
    }

    #[test]
    fn na_round_trips_with_flags() {
        let mut b = [0u8; 128];
        let t = a("fd00:1::1");
        let d = a("fd00:1::2");
        let f = FLAG_ROUTER | FLAG_SOLICITED | FLAG_OVERRIDE;
        let n = build_na(&mut b, MAC, [2; 6], t, d, f).unwrap();
        let r = parse(t, d, 255, &b[54..n]).unwrap();
        assert_eq!(r.msg_type, NEIGHBOR_ADVERT);
        assert_eq!(r.flags, f);
        assert_eq!(r.lladdr, Some(MAC));
        assert!(build_na(&mut [0u8; 40], MAC, [2; 6], t, d, f).is_none());
    }

    #[test]
    fn invalid_messages_are_refused_not_panicked_on() {
        let mut b = [0u8; 128];
        let src = a("fd00:1::1");
        let target = a("fd00:1::2");
        let n = build_ns(&mut b, MAC, src, target, None).unwrap();
        let dst = a("ff02::1:ff00:2");
        let msg = b[54..n].to_vec();
        assert_eq!(parse(src, dst, 64, &msg), Err(NdpError::HopLimit));
        assert_eq!(parse(src, dst, 255, &msg[..20]), Err(NdpError::Truncated));
        assert_eq!(parse(src, dst, 255, &[]), Err(NdpError::Truncated));
        assert_eq!(
            parse(src, dst, 255, &[128, 0, 0, 0]),
            Err(NdpError::NotNeighbor)
        );
        let mut bad = msg.clone();
        bad[1] = 1;
        assert_eq!(parse(src, dst, 255, &bad), Err(NdpError::Code));
        // DAD probe (unspecified source) must carry no source option.
        let c = icmp6_sum(0, dst, &{
            let mut m = msg.clone();
            m[2] = 0;
            m[3] = 0;
            m
        });
        let mut dad = msg.clone();
        dad[2..4].copy_from_slice(&c.to_be_bytes());
        assert_eq!(parse(0, dst, 255, &dad), Err(NdpError::BadDad));
        // Zero-length option, with a fixed-up checksum.
        let mut z = msg.clone();
        z[25] = 0;
        z[2] = 0;
        z[3] = 0;
        let c = icmp6_sum(src, dst, &z);
        z[2..4].copy_from_slice(&c.to_be_bytes());
        assert_eq!(parse(src, dst, 255, &z), Err(NdpError::ZeroLengthOption));
        // Every truncation and every single-byte corruption: no panic.
        for cut in 0..msg.len() {
            let _ = parse(src, dst, 255, &msg[..cut]);
        }
        for i in 0..msg.len() {
            let mut m = msg.clone();
            m[i] ^= 0xff;
            let _ = parse(src, dst, 255, &m);
        }
    }
}
