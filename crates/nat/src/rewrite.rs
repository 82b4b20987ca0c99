//! Packet rewriting: the fast-path half of NAT.
//!
//! A [`Rewrite4`] is computed once per direction when a session is created,
//! from the tuple as it arrives (`from`) and the tuple as it must leave
//! (`to`). It holds the new tuple and two folded checksum deltas (RFC 1624
//! eqn 3): one for the IPv4 header (addresses) and one for the L4 checksum
//! (addresses through the pseudo header, plus ports; for ICMP queries the
//! identifier only, as the ICMP checksum has no pseudo header). The engine
//! may store just the two deltas (4 bytes per direction, see
//! [`Rewrite4::deltas`]) and rebuild `to` from the conntrack keys, then call
//! [`apply_with`].
//!
//! Every function here bounds-checks the whole set of bytes it touches
//! before writing the first one: on error the frame is unchanged. Nothing
//! panics on any input.
//!
//! ICMP errors are translated by [`apply_icmp_error`] (RFC 5508 section 4,
//! RFC 4787 REQ-14 semantics, RFC 5382 REQ-10 for TCP).

use sluice_wire::flow::{proto, FlowKey4};

use crate::csum::{adjust, rd16, rd32, wr16, wr32, Delta};
use crate::error::RewriteError;

/// IPv4 header field offsets (RFC 791).
mod ip {
    pub const VER_IHL: usize = 0;
    pub const FRAG: usize = 6;
    pub const PROTO: usize = 9;
    pub const CSUM: usize = 10;
    pub const SRC: usize = 12;
    pub const DST: usize = 16;
    pub const MIN_LEN: usize = 20;
}

/// Offset of the checksum in each L4 header.
const TCP_CSUM: usize = 16;
const UDP_CSUM: usize = 6;
const ICMP_CSUM: usize = 2;
/// Offset of the identifier in an ICMP query (RFC 792).
const ICMP_ID: usize = 4;

/// A precomputed rewrite of one direction of a session.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Rewrite4 {
    to: FlowKey4,
    ip_delta: u16,
    l4_delta: u16,
}

impl Rewrite4 {
    /// The rewrite turning packets with tuple `from` into tuple `to`.
    /// `from.proto` and `to.proto` must be equal. For ICMP queries the
    /// identifier is `sport` (equal to `dport` in Sluice flow keys).
    pub fn new(from: &FlowKey4, to: &FlowKey4) -> Self {
        let (ip_delta, l4_delta) = deltas(from, to);
        Self {
            to: *to,
            ip_delta,
            l4_delta,
        }
    }

    /// The tuple packets leave with.
    pub fn to(&self) -> &FlowKey4 {
        &self.to
    }

    /// `(ip header delta, l4 checksum delta)`, for [`apply_with`].
    pub fn deltas(&self) -> (u16, u16) {
        (self.ip_delta, self.l4_delta)
    }

    /// Rewrite the packet whose IPv4 header starts at `l3_off` and whose L4
    /// header starts at `l4_off`.
    pub fn apply(
        &self,
        frame: &mut [u8],
        l3_off: usize,
        l4_off: usize,
    ) -> Result<(), RewriteError> {
        apply_with(
            frame,
            l3_off,
            l4_off,
            &self.to,
            (self.ip_delta, self.l4_delta),
        )
    }
}

/// The checksum deltas of rewriting `from` into `to`:
/// `(ip header delta, l4 checksum delta)`.
///
/// It runs once for every new connection, so it sums all changed words in
/// one 64-bit accumulator and folds once, instead of folding after every
/// word as [`Delta`] does. Both give the same value: an end-around-carry sum of
/// non-negative terms is 0 only when every term is 0, and otherwise the
/// value in `1..=0xffff` congruent to the plain sum modulo `0xffff`.
#[inline]
pub fn deltas(from: &FlowKey4, to: &FlowKey4) -> (u16, u16) {
    #[inline(always)]
    fn w16(old: u16, new: u16) -> u64 {
        u64::from(!old) + u64::from(new)
    }
    #[inline(always)]
    fn w32(old: u32, new: u32) -> u64 {
        w16((old >> 16) as u16, (new >> 16) as u16) + w16(old as u16, new as u16)
    }
    #[inline(always)]
    fn fold64(mut s: u64) -> u16 {
        // At most 10 terms below 2^17: two rounds fold any such sum.
        s = (s & 0xffff) + (s >> 16);
        s = (s & 0xffff) + (s >> 16);
        s as u16
    }
    let ip = w32(from.src, to.src) + w32(from.dst, to.dst);
    let l4 = match to.proto {
        proto::TCP | proto::UDP => ip + w16(from.sport, to.sport) + w16(from.dport, to.dport),
        proto::ICMP => w16(from.sport, to.sport),
        _ => 0,
    };
    (fold64(ip), fold64(l4))
}

/// The delta of the opposite rewrite, from the delta `d` of one rewrite:
/// if `d = deltas(from, to).0` (or `.1`), then `reverse_delta(d)` is the
/// corresponding delta of `deltas(&to.reversed(), &from.reversed())`, the
/// rewrite of the reply direction of a NAT session. The reply direction
/// changes the same words back, so its sum is the one's complement
/// negation of `d` (`!d`, with `0xffff` mapping to itself, as the folded
/// sum of a non-zero total is never `0`).
///
/// The one exception is a reverse sum that is exactly zero (every changed
/// word goes from `0xffff` to `0`, e.g. an ICMP identifier 0xffff -> 0):
/// the result is then `0xffff` where [`deltas`] gives `0`. Both are one's
/// complement zero; applied with [`apply_with`] they give the same checksum
/// except for an incoming checksum field of `0xffff`, which becomes `0`
/// instead of staying `0xffff`, the other encoding of the same, valid,
/// checksum (and a UDP checksum is unaffected).
#[inline]
pub fn reverse_delta(d: u16) -> u16 {
    if d == 0xffff {
        0xffff
    } else {
        !d
    }
}

/// [`deltas`] word by word with [`Delta`] (the reference in tests).
#[cfg(test)]
fn deltas_reference(from: &FlowKey4, to: &FlowKey4) -> (u16, u16) {
    let mut ipd = Delta::default();
    ipd.addr(from.src, to.src);
    ipd.addr(from.dst, to.dst);
    let l4 = match to.proto {
        // RFC 9293 section 3.1 / RFC 768: the pseudo header holds both
        // addresses, so the L4 delta includes the IP delta.
        proto::TCP | proto::UDP => {
            let mut d = ipd;
            d.word(from.sport, to.sport);
            d.word(from.dport, to.dport);
            d
        }
        // RFC 792: the ICMP checksum covers the ICMP message only.
        proto::ICMP => {
            let mut d = Delta::default();
            d.word(from.sport, to.sport);
            d
        }
        _ => Delta::default(),
    };
    (ipd.value(), l4.value())
}

/// Checked view of an IPv4 header inside `frame`.
struct Ip {
    proto: u8,
    /// Not the first fragment: there is no L4 header.
    later_fragment: bool,
    hdr_len: usize,
}

fn parse_ip(frame: &[u8], off: usize) -> Result<Ip, RewriteError> {
    let end = off
        .checked_add(ip::MIN_LEN)
        .ok_or(RewriteError::Truncated)?;
    let h = frame.get(off..end).ok_or(RewriteError::Truncated)?;
    let vi = *h.get(ip::VER_IHL).ok_or(RewriteError::Truncated)?;
    let hdr_len = usize::from(vi & 0x0f) * 4;
    if vi >> 4 != 4 || hdr_len < ip::MIN_LEN {
        return Err(RewriteError::NotIpv4);
    }
    if frame.len() < off + hdr_len {
        return Err(RewriteError::Truncated);
    }
    let frag = rd16(frame, off + ip::FRAG).ok_or(RewriteError::Truncated)?;
    let proto = *h.get(ip::PROTO).ok_or(RewriteError::Truncated)?;
    Ok(Ip {
        proto,
        later_fragment: frag & 0x1fff != 0,
        hdr_len,
    })
}

/// The end offset the L4 rewrite of `proto` needs, from `l4_off`.
fn l4_need(proto: u8) -> usize {
    match proto {
        proto::TCP => TCP_CSUM + 2,
        proto::UDP | proto::ICMP => 8,
        _ => 0,
    }
}

/// Rewrite a packet to tuple `to` with precomputed `deltas` (from
/// [`deltas`] or [`Rewrite4::deltas`]), incrementally (RFC 1624):
/// addresses and the IPv4 header checksum; for the first fragment also
/// ports (or the ICMP identifier) and the L4 checksum. A UDP checksum of
/// zero means "none" and stays zero (RFC 768); a computed zero is sent as
/// `0xffff`. Non-first fragments carry no L4 header and get the IP part
/// only.
pub fn apply_with(
    frame: &mut [u8],
    l3_off: usize,
    l4_off: usize,
    to: &FlowKey4,
    deltas: (u16, u16),
) -> Result<(), RewriteError> {
    let h = parse_ip(frame, l3_off)?;
    if h.proto != to.proto {
        return Err(RewriteError::ProtocolMismatch);
    }
    let with_l4 = !h.later_fragment && l4_need(to.proto) > 0;
    if with_l4 {
        if l4_off < l3_off + h.hdr_len {
            return Err(RewriteError::Truncated);
        }
        let end = l4_off
            .checked_add(l4_need(to.proto))
            .ok_or(RewriteError::Truncated)?;
        if frame.len() < end {
            return Err(RewriteError::Truncated);
        }
    }
    // All offsets below are now in bounds.
    let t = RewriteError::Truncated;
    let ipc = rd16(frame, l3_off + ip::CSUM).ok_or(t)?;
    wr32(frame, l3_off + ip::SRC, to.src).ok_or(t)?;
    wr32(frame, l3_off + ip::DST, to.dst).ok_or(t)?;
    wr16(frame, l3_off + ip::CSUM, adjust(ipc, deltas.0)).ok_or(t)?;
    if !with_l4 {
        return Ok(());
    }
    match to.proto {
        proto::TCP | proto::UDP => {
            wr16(frame, l4_off, to.sport).ok_or(t)?;
            wr16(frame, l4_off + 2, to.dport).ok_or(t)?;
            let (coff, udp) = if to.proto == proto::TCP {
                (TCP_CSUM, false)
            } else {
                (UDP_CSUM, true)
            };
            let c = rd16(frame, l4_off + coff).ok_or(t)?;
            if let Some(n) = l4_checksum(c, deltas.1, udp) {
                wr16(frame, l4_off + coff, n).ok_or(t)?;
            }
        }
        _ => {
            wr16(frame, l4_off + ICMP_ID, to.sport).ok_or(t)?;
            let c = rd16(frame, l4_off + ICMP_CSUM).ok_or(t)?;
            wr16(frame, l4_off + ICMP_CSUM, adjust(c, deltas.1)).ok_or(t)?;
        }
    }
    Ok(())
}

/// [`apply_with`] for a packet the caller has dissected already (the fast
/// path): the IPv4 header at `l3_off` is at least 20 bytes, ends at or
/// before `l4_off`, carries protocol `to.proto` and is not a later
/// fragment, and the L4 header at `l4_off` is as long as the rewrite needs
/// (TCP 18 bytes up to the checksum, UDP and ICMP 8), all of which
/// [`sluice_wire::dissect`] guarantees for a TCP, UDP or ICMP query packet
/// it returns a key for. With `dec_ttl` the TTL is decremented too, and
/// `deltas.0` must include that change.
///
/// It writes the same bytes as [`apply_with`] followed by the TTL
/// decrement, without parsing the header again: each header is bounds
/// checked once, and on error the frame is unchanged.
#[inline(always)]
pub fn apply_dissected(
    frame: &mut [u8],
    l3_off: usize,
    l4_off: usize,
    to: &FlowKey4,
    deltas: (u16, u16),
    dec_ttl: bool,
) -> Result<(), RewriteError> {
    let t = RewriteError::Truncated;
    let (head, l4) = frame.split_at_mut_checked(l4_off).ok_or(t)?;
    let ip: &mut [u8; 20] = head
        .get_mut(l3_off..)
        .and_then(|s| s.first_chunk_mut())
        .ok_or(t)?;
    match to.proto {
        proto::TCP => {
            let l4: &mut [u8; TCP_CSUM + 2] = l4.first_chunk_mut().ok_or(t)?;
            rewrite_ip(ip, to, deltas.0, dec_ttl);
            l4[0..2].copy_from_slice(&to.sport.to_be_bytes());
            l4[2..4].copy_from_slice(&to.dport.to_be_bytes());
            let c = u16::from_be_bytes([l4[16], l4[17]]);
            if let Some(n) = l4_checksum(c, deltas.1, false) {
                l4[16..18].copy_from_slice(&n.to_be_bytes());
            }
        }
        proto::UDP => {
            let l4: &mut [u8; 8] = l4.first_chunk_mut().ok_or(t)?;
            rewrite_ip(ip, to, deltas.0, dec_ttl);
            l4[0..2].copy_from_slice(&to.sport.to_be_bytes());
            l4[2..4].copy_from_slice(&to.dport.to_be_bytes());
            let c = u16::from_be_bytes([l4[6], l4[7]]);
            if let Some(n) = l4_checksum(c, deltas.1, true) {
                l4[6..8].copy_from_slice(&n.to_be_bytes());
            }
        }
        proto::ICMP => {
            let l4: &mut [u8; 8] = l4.first_chunk_mut().ok_or(t)?;
            rewrite_ip(ip, to, deltas.0, dec_ttl);
            l4[ICMP_ID..ICMP_ID + 2].copy_from_slice(&to.sport.to_be_bytes());
            let c = u16::from_be_bytes([l4[ICMP_CSUM], l4[ICMP_CSUM + 1]]);
            l4[ICMP_CSUM..ICMP_CSUM + 2].copy_from_slice(&adjust(c, deltas.1).to_be_bytes());
        }
        _ => rewrite_ip(ip, to, deltas.0, dec_ttl),
    }
    Ok(())
}

/// Addresses, TTL and header checksum of a bounds-checked IPv4 header.
#[inline(always)]
fn rewrite_ip(ip: &mut [u8; 20], to: &FlowKey4, delta: u16, dec_ttl: bool) {
    if dec_ttl {
        ip[8] = ip[8].wrapping_sub(1);
    }
    ip[ip::SRC..ip::SRC + 4].copy_from_slice(&to.src.to_be_bytes());
    ip[ip::DST..ip::DST + 4].copy_from_slice(&to.dst.to_be_bytes());
    let c = u16::from_be_bytes([ip[ip::CSUM], ip[ip::CSUM + 1]]);
    ip[ip::CSUM..ip::CSUM + 2].copy_from_slice(&adjust(c, delta).to_be_bytes());
}

/// The new L4 checksum, or `None` to leave it alone (UDP without checksum).
#[inline]
fn l4_checksum(old: u16, delta: u16, udp: bool) -> Option<u16> {
    if udp && old == 0 {
        // RFC 768: zero means the sender computed no checksum.
        return None;
    }
    let n = adjust(old, delta);
    // RFC 768: a computed zero is transmitted as all ones.
    Some(if udp && n == 0 { 0xffff } else { n })
}

/// For an ICMP error quoting a packet with tuple `inner` (as found in the
/// error), which belongs to the session `(orig, reply)`: the tuple the
/// quoted packet must be rewritten to. The quoted packet is one that
/// crossed the NAT already translated, so it is the reverse of a key:
/// `reply.reversed()` goes back to `orig`, `orig.reversed()` to `reply`.
pub fn icmp_error_inner_target(
    orig: &FlowKey4,
    reply: &FlowKey4,
    inner: &FlowKey4,
) -> Option<FlowKey4> {
    if *inner == reply.reversed() {
        Some(*orig)
    } else if *inner == orig.reversed() {
        Some(*reply)
    } else {
        None
    }
}

/// Translate an ICMP error (destination unreachable, source quench,
/// redirect, time exceeded, parameter problem) whose outer IPv4 header is
/// at `l3_off` and ICMP header at `l4_off`, quoting a packet with tuple
/// `inner_from`, so that the quoted packet reads `inner_to` (see
/// [`icmp_error_inner_target`]).
///
/// RFC 5508 section 4.2 / RFC 4787 REQ-14 / RFC 5382 REQ-10: rewrites
/// - the quoted IPv4 header's addresses and its header checksum,
/// - the quoted ports (or ICMP identifier), and the quoted L4 checksum when
///   the quoted bytes contain it (a zero UDP checksum stays zero),
/// - the outer destination when the quoted source changed, and the outer
///   source when the quoted destination changed (so an error generated by
///   an internal router leaves with the NAT's address), with the outer
///   header checksum,
/// - the ICMP checksum, by accumulating every 16-bit word changed above
///   (the ICMP checksum covers the whole quoted packet, without a pseudo
///   header).
pub fn apply_icmp_error(
    frame: &mut [u8],
    l3_off: usize,
    l4_off: usize,
    inner_from: &FlowKey4,
    inner_to: &FlowKey4,
) -> Result<(), RewriteError> {
    let t = RewriteError::Truncated;
    let outer = parse_ip(frame, l3_off)?;
    if outer.proto != proto::ICMP || outer.later_fragment {
        return Err(RewriteError::NotIcmpError);
    }
    if l4_off < l3_off + outer.hdr_len {
        return Err(t);
    }
    let ty = *frame.get(l4_off).ok_or(t)?;
    // RFC 792 / RFC 1812: error types that quote a packet.
    if !matches!(ty, 3 | 4 | 5 | 11 | 12) {
        return Err(RewriteError::NotIcmpError);
    }
    let il3 = l4_off.checked_add(8).ok_or(t)?;
    let inner = parse_ip(frame, il3)?;
    if inner.proto != inner_from.proto || inner_to.proto != inner_from.proto {
        return Err(RewriteError::ProtocolMismatch);
    }
    let il4 = il3 + inner.hdr_len;
    let with_l4 = !inner.later_fragment && l4_need(inner.proto) > 0;
    if with_l4 && frame.len() < il4 + 8 {
        // RFC 792: at least 64 bits of the quoted datagram's data.
        return Err(t);
    }
    // Validation done; every access below is in bounds.
    let mut icmp = Delta::default();

    // Quoted IP header.
    let mut iipd = Delta::default();
    let isrc = rd32(frame, il3 + ip::SRC).ok_or(t)?;
    let idst = rd32(frame, il3 + ip::DST).ok_or(t)?;
    iipd.addr(isrc, inner_to.src);
    iipd.addr(idst, inner_to.dst);
    icmp.add(iipd.value());
    wr32(frame, il3 + ip::SRC, inner_to.src).ok_or(t)?;
    wr32(frame, il3 + ip::DST, inner_to.dst).ok_or(t)?;
    let ic = rd16(frame, il3 + ip::CSUM).ok_or(t)?;
    let nic = adjust(ic, iipd.value());
    icmp.word(ic, nic);
    wr16(frame, il3 + ip::CSUM, nic).ok_or(t)?;

    // Quoted L4 header.
    if with_l4 {
        match inner.proto {
            proto::TCP | proto::UDP => {
                let mut l4d = iipd;
                let sp = rd16(frame, il4).ok_or(t)?;
                let dp = rd16(frame, il4 + 2).ok_or(t)?;
                l4d.word(sp, inner_to.sport);
                l4d.word(dp, inner_to.dport);
                icmp.word(sp, inner_to.sport);
                icmp.word(dp, inner_to.dport);
                wr16(frame, il4, inner_to.sport).ok_or(t)?;
                wr16(frame, il4 + 2, inner_to.dport).ok_or(t)?;
                let udp = inner.proto == proto::UDP;
                let coff = il4 + if udp { UDP_CSUM } else { TCP_CSUM };
                // A truncated quoted TCP header may lack its checksum.
                if let Some(c) = rd16(frame, coff) {
                    if let Some(n) = l4_checksum(c, l4d.value(), udp) {
                        icmp.word(c, n);
                        wr16(frame, coff, n).ok_or(t)?;
                    }
                }
            }
            _ => {
                let id = rd16(frame, il4 + ICMP_ID).ok_or(t)?;
                let mut l4d = Delta::default();
                l4d.word(id, inner_to.sport);
                icmp.word(id, inner_to.sport);
                wr16(frame, il4 + ICMP_ID, inner_to.sport).ok_or(t)?;
                let c = rd16(frame, il4 + ICMP_CSUM).ok_or(t)?;
                let n = adjust(c, l4d.value());
                icmp.word(c, n);
                wr16(frame, il4 + ICMP_CSUM, n).ok_or(t)?;
            }
        }
    }

    // Outer header: the error travels against the quoted packet.
    let mut oipd = Delta::default();
    if inner_from.src != inner_to.src {
        let d = rd32(frame, l3_off + ip::DST).ok_or(t)?;
        oipd.addr(d, inner_to.src);
        wr32(frame, l3_off + ip::DST, inner_to.src).ok_or(t)?;
    }
    if inner_from.dst != inner_to.dst {
        let s = rd32(frame, l3_off + ip::SRC).ok_or(t)?;
        oipd.addr(s, inner_to.dst);
        wr32(frame, l3_off + ip::SRC, inner_to.dst).ok_or(t)?;
    }
    let oc = rd16(frame, l3_off + ip::CSUM).ok_or(t)?;
    wr16(frame, l3_off + ip::CSUM, adjust(oc, oipd.value())).ok_or(t)?;

    let c = rd16(frame, l4_off + ICMP_CSUM).ok_or(t)?;
    wr16(frame, l4_off + ICMP_CSUM, adjust(c, icmp.value())).ok_or(t)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::indexing_slicing, clippy::unwrap_used)]
    use super::*;
    use crate::testutil::{self as tu, Shape};
    use proptest::prelude::*;

    const ETH: usize = 14;

    fn frame_of(dgram: &[u8]) -> Vec<u8> {
        let mut f = vec![0xaa; ETH];
        f.extend_from_slice(dgram);
        f
    }

    fn key(p: u8, s: u32, sp: u16, d: u32, dp: u16) -> FlowKey4 {
        let (sp, dp) = if p == proto::ICMP { (sp, sp) } else { (sp, dp) };
        FlowKey4 {
            src: s,
            dst: d,
            sport: sp,
            dport: dp,
            proto: p,
        }
    }

    /// Rewrite, then check every field and every checksum against a full
    /// recompute.
    fn check_rewrite(from: FlowKey4, to: FlowKey4, payload: &[u8], shape: Shape) {
        let mut f = frame_of(&tu::datagram(&from, payload, shape));
        let l4 = ETH + usize::from(shape.ihl) * 4;
        Rewrite4::new(&from, &to).apply(&mut f, ETH, l4).unwrap();
        let ip = &f[ETH..];
        assert_eq!(tu::rd32(ip, 12), to.src);
        assert_eq!(tu::rd32(ip, 16), to.dst);
        assert_eq!(tu::rd16(ip, 10), tu::ip_checksum_of(ip), "ip checksum");
        let l4b = &f[l4..];
        match to.proto {
            proto::ICMP => assert_eq!(tu::rd16(l4b, 4), to.sport),
            _ => {
                assert_eq!(tu::rd16(l4b, 0), to.sport);
                assert_eq!(tu::rd16(l4b, 2), to.dport);
            }
        }
        let c = tu::rd16(l4b, tu::l4_csum_off(to.proto));
        if to.proto == proto::UDP && shape.udp_no_csum {
            assert_eq!(c, 0, "RFC 768: zero UDP checksum stays zero");
        } else {
            assert_eq!(c, tu::l4_checksum_of(ip), "l4 checksum");
        }
    }

    #[test]
    fn tcp_snat_fixture() {
        let from = key(proto::TCP, 0x0a00_0001, 40000, 0x0808_0808, 443);
        let to = key(proto::TCP, 0xc000_0201, 1025, 0x0808_0808, 443);
        check_rewrite(from, to, b"GET / HTTP/1.1\r\n", Shape::default());
    }

    #[test]
    fn udp_zero_checksum_stays_zero() {
        let from = key(proto::UDP, 0x0a00_0001, 5353, 0x0101_0101, 53);
        let to = key(proto::UDP, 0xc000_0201, 2000, 0x0101_0101, 53);
        check_rewrite(
            from,
            to,
            b"abc",
            Shape {
                udp_no_csum: true,
                ..Shape::default()
            },
        );
    }

    #[test]
    fn icmp_query_id_rewrite_ignores_addresses() {
        let from = key(proto::ICMP, 0x0a00_0001, 7, 0x0808_0808, 7);
        let to = key(proto::ICMP, 0xc000_0201, 4099, 0x0808_0808, 4099);
        check_rewrite(from, to, &[0x55; 56], Shape::default());
    }

    #[test]
    fn later_fragment_gets_ip_rewrite_only() {
        let from = key(proto::UDP, 0x0a00_0001, 1000, 0x0101_0101, 53);
        let to = key(proto::UDP, 0xc000_0201, 2000, 0x0101_0101, 53);
        let mut f = frame_of(&tu::datagram(
            &from,
            b"xyzw",
            Shape {
                frag_off: 3,
                ..Shape::default()
            },
        ));
        let before = f[ETH + 20..].to_vec();
        Rewrite4::new(&from, &to)
            .apply(&mut f, ETH, ETH + 20)
            .unwrap();
        assert_eq!(
            &f[ETH + 20..],
            &before[..],
            "no L4 header in a later fragment"
        );
        assert_eq!(tu::rd32(&f[ETH..], 12), to.src);
        assert_eq!(tu::rd16(&f[ETH..], 10), tu::ip_checksum_of(&f[ETH..]));
    }

    #[test]
    fn errors_leave_frame_untouched() {
        let from = key(proto::TCP, 1, 2, 3, 4);
        let to = key(proto::TCP, 5, 6, 7, 8);
        let rw = Rewrite4::new(&from, &to);
        let full = frame_of(&tu::datagram(&from, b"", Shape::default()));
        // The TCP rewrite needs the ports and the checksum (18 bytes).
        for cut in 0..ETH + 20 + 18 {
            let mut f = full[..cut].to_vec();
            assert_eq!(
                rw.apply(&mut f, ETH, ETH + 20),
                Err(RewriteError::Truncated)
            );
            assert_eq!(&f[..], &full[..cut]);
        }
        let mut f = full[..ETH + 38].to_vec();
        assert_eq!(rw.apply(&mut f, ETH, ETH + 20), Ok(()));
        let mut f = full.clone();
        assert_eq!(
            rw.apply(&mut f, ETH, ETH + 8),
            Err(RewriteError::Truncated),
            "l4 inside l3"
        );
        let mut f = full.clone();
        f[ETH] = 0x65;
        assert_eq!(rw.apply(&mut f, ETH, ETH + 20), Err(RewriteError::NotIpv4));
        let udp = Rewrite4::new(&key(proto::UDP, 1, 2, 3, 4), &key(proto::UDP, 1, 2, 3, 5));
        let mut f = full.clone();
        assert_eq!(
            udp.apply(&mut f, ETH, ETH + 20),
            Err(RewriteError::ProtocolMismatch)
        );
        assert_eq!(f, full);
        assert_eq!(
            rw.apply(&mut f, usize::MAX - 3, usize::MAX),
            Err(RewriteError::Truncated)
        );
    }

    #[test]
    fn deltas_and_apply_with_match_apply() {
        let from = key(proto::UDP, 0x0a00_0002, 1111, 0x0909_0909, 9999);
        let to = key(proto::UDP, 0xc633_6401, 61000, 0x0909_0909, 9999);
        let rw = Rewrite4::new(&from, &to);
        assert_eq!(rw.deltas(), deltas(&from, &to));
        let d = tu::datagram(&from, b"hello", Shape::default());
        let (mut a, mut b) = (frame_of(&d), frame_of(&d));
        rw.apply(&mut a, ETH, ETH + 20).unwrap();
        apply_with(&mut b, ETH, ETH + 20, &to, rw.deltas()).unwrap();
        assert_eq!(a, b);
        assert!(core::mem::size_of::<Rewrite4>() <= 24);
    }

    // ---- ICMP errors ------------------------------------------------------

    /// The session of an outbound UDP flow int:ip -> R:rp translated to A:P.
    struct Sess {
        orig: FlowKey4,
        reply: FlowKey4,
    }

    fn sess(p: u8) -> Sess {
        let orig = key(p, 0x0a00_0005, 33000, 0xcb00_7107, 53);
        let translated = key(p, 0xc000_0201, 1029, 0xcb00_7107, 53);
        Sess {
            orig,
            reply: translated.reversed(),
        }
    }

    /// Check an ICMP error after translation, field by field.
    fn check_icmp_error(
        f: &[u8],
        want_outer_src: u32,
        want_outer_dst: u32,
        inner: FlowKey4,
        inner_full: bool,
    ) {
        let ip = &f[ETH..];
        assert_eq!(tu::rd32(ip, 12), want_outer_src, "outer src");
        assert_eq!(tu::rd32(ip, 16), want_outer_dst, "outer dst");
        assert_eq!(
            tu::rd16(ip, 10),
            tu::ip_checksum_of(ip),
            "outer ip checksum"
        );
        let icmp = &ip[20..];
        let mut z = icmp.to_vec();
        z[2] = 0;
        z[3] = 0;
        assert_eq!(tu::rd16(icmp, 2), tu::csum_ref(&[&z]), "icmp checksum");
        let q = &icmp[8..];
        assert_eq!(tu::rd32(q, 12), inner.src, "inner src");
        assert_eq!(tu::rd32(q, 16), inner.dst, "inner dst");
        assert_eq!(tu::rd16(q, 10), tu::ip_checksum_of(q), "inner ip checksum");
        let l4 = &q[20..];
        match inner.proto {
            proto::ICMP => {
                assert_eq!(tu::rd16(l4, 4), inner.sport, "inner id");
                if inner_full {
                    assert_eq!(
                        tu::rd16(l4, 2),
                        tu::l4_checksum_of(q),
                        "inner icmp checksum"
                    );
                }
            }
            _ => {
                assert_eq!(tu::rd16(l4, 0), inner.sport, "inner sport");
                assert_eq!(tu::rd16(l4, 2), inner.dport, "inner dport");
                if inner_full {
                    assert_eq!(
                        tu::rd16(l4, tu::l4_csum_off(inner.proto)),
                        tu::l4_checksum_of(q),
                        "inner l4 checksum"
                    );
                }
            }
        }
    }

    fn inbound_error_case(p: u8, quote_len: Option<usize>, router: u32) {
        let s = sess(p);
        // The translated outbound packet, as seen by the remote side.
        let wire = s.reply.reversed();
        let quoted = tu::datagram(&wire, b"0123456789abcdef", Shape::default());
        let q = match quote_len {
            Some(n) => &quoted[..n],
            None => &quoted[..],
        };
        let mut f = frame_of(&tu::icmp_error(router, wire.src, 3, 3, q));
        let target = icmp_error_inner_target(&s.orig, &s.reply, &wire).unwrap();
        assert_eq!(target, s.orig);
        apply_icmp_error(&mut f, ETH, ETH + 20, &wire, &target).unwrap();
        // RFC 5508: the error reaches the internal host and quotes the
        // packet as that host sent it.
        check_icmp_error(&f, router, s.orig.src, s.orig, quote_len.is_none());
    }

    #[test]
    fn icmp_error_udp_full_quote() {
        inbound_error_case(proto::UDP, None, 0xcb00_7107);
    }

    #[test]
    fn icmp_error_udp_from_router_8_bytes() {
        inbound_error_case(proto::UDP, Some(28), 0x6440_0001);
    }

    #[test]
    fn icmp_error_tcp_truncated_without_checksum() {
        inbound_error_case(proto::TCP, Some(28), 0x6440_0001);
        inbound_error_case(proto::TCP, None, 0xcb00_7107);
    }

    #[test]
    fn icmp_error_about_echo() {
        inbound_error_case(proto::ICMP, None, 0x6440_0001);
    }

    #[test]
    fn icmp_error_udp_zero_checksum_quoted() {
        let s = sess(proto::UDP);
        let wire = s.reply.reversed();
        let quoted = tu::datagram(
            &wire,
            b"zz",
            Shape {
                udp_no_csum: true,
                ..Shape::default()
            },
        );
        let mut f = frame_of(&tu::icmp_error(0x6440_0001, wire.src, 11, 0, &quoted));
        apply_icmp_error(&mut f, ETH, ETH + 20, &wire, &s.orig).unwrap();
        assert_eq!(
            tu::rd16(&f[ETH + 28 + 20..], 6),
            0,
            "RFC 768: zero stays zero"
        );
        let icmp = &f[ETH + 20..];
        let mut z = icmp.to_vec();
        z[2] = 0;
        z[3] = 0;
        assert_eq!(tu::rd16(icmp, 2), tu::csum_ref(&[&z]));
    }

    #[test]
    fn icmp_error_from_internal_router_leaves_with_nat_address() {
        // An inside router Y reports a problem with an inbound (translated)
        // reply packet R -> int. The error must leave as A -> R, quoting
        // R -> A:P.
        let s = sess(proto::UDP);
        let wire = s.orig.reversed();
        let quoted = tu::datagram(&wire, b"data", Shape::default());
        let y = 0x0a00_00fe;
        let mut f = frame_of(&tu::icmp_error(y, wire.src, 11, 0, &quoted));
        let target = icmp_error_inner_target(&s.orig, &s.reply, &wire).unwrap();
        assert_eq!(target, s.reply);
        apply_icmp_error(&mut f, ETH, ETH + 20, &wire, &target).unwrap();
        check_icmp_error(&f, s.reply.dst, s.reply.src, s.reply, true);
    }

    #[test]
    fn icmp_error_rejects_garbage_without_writing() {
        let s = sess(proto::UDP);
        let wire = s.reply.reversed();
        let quoted = tu::datagram(&wire, b"", Shape::default());
        let full = frame_of(&tu::icmp_error(1, wire.src, 3, 3, &quoted));
        for cut in 0..full.len() {
            let mut f = full[..cut].to_vec();
            assert!(apply_icmp_error(&mut f, ETH, ETH + 20, &wire, &s.orig).is_err());
            assert_eq!(&f[..], &full[..cut]);
        }
        let mut f = full.clone();
        f[ETH + 20] = 8; // echo request, not an error
        assert_eq!(
            apply_icmp_error(&mut f, ETH, ETH + 20, &wire, &s.orig),
            Err(RewriteError::NotIcmpError)
        );
        let tcp = sess(proto::TCP).orig;
        assert_eq!(
            apply_icmp_error(&mut f, ETH, ETH + 20, &tcp, &tcp),
            Err(RewriteError::NotIcmpError)
        );
    }

    fn arb_proto() -> impl Strategy<Value = u8> {
        prop_oneof![Just(proto::TCP), Just(proto::UDP), Just(proto::ICMP)]
    }

    proptest! {
        #[test]
        fn deltas_match_word_by_word_folding(
            a in any::<[u32; 4]>(), p in any::<[u16; 4]>(), pr in 0usize..4,
        ) {
            let pr = [proto::TCP, proto::UDP, proto::ICMP, 47][pr];
            let from = FlowKey4 { src: a[0], dst: a[1], sport: p[0], dport: p[1], proto: pr };
            let to = FlowKey4 { src: a[2], dst: a[3], sport: p[2], dport: p[3], proto: pr };
            prop_assert_eq!(deltas(&from, &to), deltas_reference(&from, &to));
            // Unchanged fields, and changes that cancel out.
            prop_assert_eq!(deltas(&from, &from), deltas_reference(&from, &from));
            let swapped = FlowKey4 { src: from.dst, dst: from.src, ..from };
            prop_assert_eq!(deltas(&from, &swapped), deltas_reference(&from, &swapped));
        }

        #[test]
        fn reverse_delta_is_the_delta_of_the_reply_rewrite(
            a in prop_oneof![any::<[u32; 4]>(), Just([0, 0, u32::MAX, u32::MAX]), Just([u32::MAX; 4]), Just([0; 4])],
            p in prop_oneof![any::<[u16; 4]>(), Just([0, 0, u16::MAX, u16::MAX]), Just([u16::MAX, u16::MAX, 0, 0])],
            pr in 0usize..4,
        ) {
            let pr = [proto::TCP, proto::UDP, proto::ICMP, 47][pr];
            // ICMP query keys carry the identifier in both port fields.
            let icmp = pr == proto::ICMP;
            let from = FlowKey4 { src: a[0], dst: a[1], sport: p[0], dport: if icmp { p[0] } else { p[1] }, proto: pr };
            let to = FlowKey4 { src: a[2], dst: a[3], sport: p[2], dport: if icmp { p[2] } else { p[3] }, proto: pr };
            let (ip, l4) = deltas(&from, &to);
            let (rip, rl4) = deltas(&to.reversed(), &from.reversed());
            // Equal, or both one's complement zero (the documented exception).
            let same = |derived: u16, exact: u16| derived == exact || (derived == 0xffff && exact == 0);
            prop_assert!(same(reverse_delta(ip), rip), "{ip:#x} {rip:#x}");
            prop_assert!(same(reverse_delta(l4), rl4), "{l4:#x} {rl4:#x}");
        }

        // Every checksum after `apply` equals a full RFC 1071 recompute.
        #[test]
        fn apply_matches_full_recompute(
            p in arb_proto(),
            a in any::<[u32; 4]>(),
            ports in any::<[u16; 4]>(),
            payload in proptest::collection::vec(any::<u8>(), 0..80),
            ihl in 5u8..=9,
            udp_no_csum in any::<bool>(),
        ) {
            let from = key(p, a[0], ports[0], a[1], ports[1]);
            let to = key(p, a[2], ports[2], a[3], ports[3]);
            check_rewrite(from, to, &payload, Shape { ihl, udp_no_csum, frag_off: 0 });
            // And back again: a round trip restores the original bytes'
            // checksums too.
            check_rewrite(to, from, &payload, Shape { ihl, udp_no_csum, frag_off: 0 });
        }

        // The fast-path rewrite writes exactly what `apply_with` does (plus
        // the TTL decrement, whose change the caller folds into the delta).
        #[test]
        fn apply_dissected_equals_apply_with(
            p in arb_proto(),
            a in any::<[u32; 4]>(),
            ports in any::<[u16; 4]>(),
            payload in proptest::collection::vec(any::<u8>(), 0..40),
            ihl in 5u8..=9,
            udp_no_csum in any::<bool>(),
            dec_ttl in any::<bool>(),
        ) {
            let from = key(p, a[0], ports[0], a[1], ports[1]);
            let to = key(p, a[2], ports[2], a[3], ports[3]);
            let f0 = frame_of(&tu::datagram(&from, &payload, Shape { ihl, udp_no_csum, frag_off: 0 }));
            let l4 = ETH + usize::from(ihl) * 4;
            let (ipd, l4d) = deltas(&from, &to);
            let mut want = f0.clone();
            apply_with(&mut want, ETH, l4, &to, (ipd, l4d)).unwrap();
            let mut ipd2 = ipd;
            if dec_ttl {
                let w = tu::rd16(&want[ETH..], 8);
                let nw = w.wrapping_sub(0x0100);
                want[ETH + 8] = (nw >> 8) as u8;
                let c = tu::rd16(&want[ETH..], 10);
                let mut d = crate::csum::Delta::default();
                d.word(w, nw);
                let c = crate::csum::adjust(c, d.value());
                want[ETH + 10..ETH + 12].copy_from_slice(&c.to_be_bytes());
                let mut d2 = crate::csum::Delta::default();
                d2.add(ipd);
                d2.add(d.value());
                ipd2 = d2.value();
            }
            let mut got = f0.clone();
            apply_dissected(&mut got, ETH, l4, &to, (ipd2, l4d), dec_ttl).unwrap();
            prop_assert_eq!(&got[ETH + 12..], &want[ETH + 12..]);
            prop_assert_eq!(&got[..ETH + 10], &want[..ETH + 10]);
            prop_assert_eq!(tu::rd16(&got[ETH..], 10), tu::ip_checksum_of(&got[ETH..]));
            // Short frames: an error and no change.
            for cut in [l4, l4 + 4] {
                let mut f = f0[..cut].to_vec();
                prop_assert!(apply_dissected(&mut f, ETH, l4, &to, (ipd, l4d), dec_ttl).is_err());
                prop_assert_eq!(&f[..], &f0[..cut]);
            }
        }

        // Only one side changes (the SNAT / DNAT shapes the engine uses).
        #[test]
        fn one_sided_rewrites(p in arb_proto(), a in any::<[u32; 3]>(), ports in any::<[u16; 3]>(), snat in any::<bool>()) {
            let from = key(p, a[0], ports[0], a[1], ports[1]);
            let to = if snat { key(p, a[2], ports[2], a[1], ports[1]) } else { key(p, a[0], ports[0], a[2], ports[2]) };
            check_rewrite(from, to, b"x", Shape::default());
        }

        // ICMP error translation verified field by field, for random
        // sessions, both directions, and quote lengths.
        #[test]
        fn icmp_error_matches_full_recompute(
            p in arb_proto(),
            a in any::<[u32; 4]>(),
            ports in any::<[u16; 3]>(),
            inbound in any::<bool>(),
            full in any::<bool>(),
            payload in proptest::collection::vec(any::<u8>(), 0..40),
        ) {
            let orig = key(p, a[0], ports[0], a[1], ports[1]);
            let reply = key(p, a[1], ports[1], a[2], ports[2]);
            let wire = if inbound { reply.reversed() } else { orig.reversed() };
            let quoted = tu::datagram(&wire, &payload, Shape::default());
            let q = if full { &quoted[..] } else { &quoted[..28] };
            let mut f = frame_of(&tu::icmp_error(a[3], wire.src, 3, 1, q));
            let target = icmp_error_inner_target(&orig, &reply, &wire);
            prop_assert!(target.is_some());
            let target = target.unwrap();
            prop_assert!(apply_icmp_error(&mut f, ETH, ETH + 20, &wire, &target).is_ok());
            let osrc = if wire.dst != target.dst { target.dst } else { a[3] };
            let odst = if wire.src != target.src { target.src } else { wire.src };
            check_icmp_error(&f, osrc, odst, target, full);
        }

        // No input makes the rewrites panic.
        #[test]
        fn never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..120), l3 in 0usize..40, l4 in 0usize..80, k in any::<[u32; 2]>()) {
            let mut b = bytes.clone();
            let from = key(proto::UDP, k[0], 1, k[1], 2);
            let to = key(proto::UDP, k[1], 3, k[0], 4);
            let _ = Rewrite4::new(&from, &to).apply(&mut b, l3, l4);
            let mut b = bytes;
            let _ = apply_icmp_error(&mut b, l3, l4, &from, &to);
        }
    }
}
