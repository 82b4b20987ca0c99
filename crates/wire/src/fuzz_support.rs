//! Shared bodies of the no-panic property tests and the cargo-fuzz targets
//! (`fuzz/fuzz_targets/*.rs`), so that both exercise the same code.
//!
//! Not part of the stable API.

use crate::ip::IpPair;
use crate::{arp, dissect, ethernet, icmp, ipv4, ipv6, tcp, udp, Dissect, L4};

/// Dissect `frame` and check the offset invariants of a successful result.
/// Panics only if an invariant is broken (a bug).
pub fn dissect_and_check(frame: &[u8]) -> Option<Dissect> {
    let d = dissect(frame).ok()?;
    let len = frame.len() as u64;
    let (l3, l4, end) = (
        u64::from(d.l3_off),
        u64::from(d.l4_off),
        u64::from(d.l3_end),
    );
    assert!(
        l3 <= l4 && l4 <= end && end <= len,
        "offsets {d:?} len {len}"
    );
    if let L4::IcmpError {
        inner_l3_off,
        inner_l4_off,
        ..
    } = d.l4
    {
        assert!(l4 + 8 == u64::from(inner_l3_off));
        assert!(inner_l3_off <= inner_l4_off && u64::from(inner_l4_off) <= end);
    }
    let _ = d.verify_ipv4_header(frame);
    Some(d)
}

/// Run every view's `new_checked`, all its getters, and every `Repr::parse`
/// on `data`; when a `Repr` parses, emit it into a scratch buffer and parse
/// that again. Must never panic.
pub fn exercise_views(data: &[u8]) {
    let mut scratch = [0u8; 256];
    let pair4 = IpPair::V4 { src: 1, dst: 2 };
    let pair6 = IpPair::V6 { src: 1, dst: 2 };

    if let Ok(f) = ethernet::Frame::new_checked(data) {
        let _ = (f.dst_addr(), f.src_addr(), f.ethertype(), f.payload().len());
        if let Ok(r) = ethernet::EthernetRepr::parse(&f) {
            let n = r.buffer_len();
            let out = &mut scratch[..n];
            assert!(r
                .emit(&mut ethernet::Frame::new_unchecked(&mut *out))
                .is_ok());
            assert_eq!(
                ethernet::EthernetRepr::parse(&ethernet::Frame::new_unchecked(&*out)),
                Ok(r)
            );
        }
    }
    // NDP: any message judged with hop limit 255 (so that the checksum and
    // option checks run); a message that parses emits and parses back.
    for src in [0u128, 1] {
        if let Ok(r) = crate::ndp::parse(src, 2, crate::ndp::HOP_LIMIT, data) {
            let lladdr = r.lladdr.unwrap_or([2, 0, 0, 0, 0, 1]);
            let mut f = [0u8; crate::ndp::FRAME_LEN];
            let n = if r.msg_type == crate::ndp::NEIGHBOR_SOLICIT {
                crate::ndp::build_ns(&mut f, lladdr, 1, r.target, Some([2; 6]))
            } else {
                crate::ndp::build_na(&mut f, lladdr, [2; 6], 1, r.target, r.flags)
            };
            assert_eq!(n, Some(crate::ndp::FRAME_LEN));
        }
    }
    if let Ok(t) = ethernet::VlanTag::new_checked(data) {
        let _ = (t.pcp(), t.dei(), t.vid(), t.ethertype(), t.payload().len());
    }
    if let Ok(p) = arp::Packet::new_checked(data) {
        if let Ok(r) = arp::ArpRepr::parse(&p) {
            let out = &mut scratch[..r.buffer_len()];
            assert!(r.emit(&mut arp::Packet::new_unchecked(&mut *out)).is_ok());
            assert_eq!(
                arp::ArpRepr::parse(&arp::Packet::new_unchecked(&*out)),
                Ok(r)
            );
        }
    }
    if let Ok(p) = ipv4::Packet::new_checked(data) {
        let _ = (
            p.version(),
            p.dscp(),
            p.ecn(),
            p.ident(),
            p.is_fragment(),
            p.frag_offset(),
        );
        let _ = (
            p.ttl(),
            p.protocol(),
            p.src_addr(),
            p.dst_addr(),
            p.options().len(),
        );
        let _ = (
            p.verify_checksum(),
            p.payload().len(),
            p.dont_frag(),
            p.more_frags(),
        );
        if let Ok(r) = ipv4::Ipv4Repr::parse(&p) {
            let out = &mut scratch[..];
            let mut q = ipv4::Packet::new_unchecked(&mut *out);
            if r.emit(&mut q).is_ok() && r.payload_len + 20 <= 256 {
                let q = ipv4::Packet::new_unchecked(&out[..20 + r.payload_len]);
                assert_eq!(ipv4::Ipv4Repr::parse(&q), Ok(r));
            }
        }
    }
    if let Ok(p) = ipv6::Packet::new_checked(data) {
        let _ = (
            p.version(),
            p.traffic_class(),
            p.flow_label(),
            p.next_header(),
            p.hop_limit(),
        );
        let _ = (
            p.src_addr(),
            p.dst_addr(),
            p.payload().len(),
            p.upper_layer(),
        );
        if let Ok(r) = ipv6::Ipv6Repr::parse(&p) {
            let out = &mut scratch[..];
            if r.emit(&mut ipv6::Packet::new_unchecked(&mut *out)).is_ok() && r.payload_len <= 216 {
                let q = ipv6::Packet::new_unchecked(&out[..40 + r.payload_len]);
                assert_eq!(ipv6::Ipv6Repr::parse(&q), Ok(r));
            }
        }
    }
    if let Some(&nh) = data.first() {
        let _ = ipv6::walk_ext_headers(data.get(1..).unwrap_or(&[]), nh);
    }
    if let Ok(h) = ipv6::FragmentHeader::new_checked(data) {
        let _ = (h.next_header(), h.frag_offset(), h.more_frags(), h.ident());
    }
    if let Ok(p) = udp::Packet::new_checked(data) {
        let _ = (
            p.src_port(),
            p.dst_port(),
            p.is_empty(),
            p.checksum(),
            p.payload().len(),
        );
        let _ = (p.verify_checksum(&pair4), p.verify_checksum(&pair6));
        if let Ok(r) = udp::UdpRepr::parse(&p, None) {
            let n = 8 + r.payload_len;
            if let Some(out) = scratch.get_mut(..n) {
                let mut q = udp::Packet::new_unchecked(&mut *out);
                assert!(r.emit(&mut q, Some(&pair4)).is_ok());
                assert!(q.verify_checksum(&pair4));
            }
        }
    }
    if let Ok(p) = tcp::Packet::new_checked(data) {
        let _ = (
            p.src_port(),
            p.dst_port(),
            p.seq_number(),
            p.ack_number(),
            p.flags(),
        );
        let _ = (
            p.syn(),
            p.ack(),
            p.fin(),
            p.rst(),
            p.window_len(),
            p.urgent_at(),
        );
        let _ = (
            p.options_len(),
            p.options().len(),
            p.payload().len(),
            p.checksum(),
        );
        let _ = (p.verify_checksum(&pair4), p.verify_checksum(&pair6));
        // MSS clamping: never panics, and keeps a valid checksum valid.
        if let Some(seg) = scratch.get_mut(..data.len()) {
            seg.copy_from_slice(data);
            let valid = tcp::Packet::new_unchecked(&*seg).verify_checksum(&pair4);
            if tcp::clamp_mss(seg, 536).is_some() && valid {
                assert!(tcp::Packet::new_unchecked(&*seg).verify_checksum(&pair4));
            }
        }
        if let Ok(r) = tcp::TcpRepr::parse(&p, None) {
            let n = r.buffer_len() + r.payload_len;
            if let Some(out) = scratch.get_mut(..n) {
                let mut q = tcp::Packet::new_unchecked(&mut *out);
                assert!(r.emit(&mut q, Some(&pair6)).is_ok());
                assert!(q.verify_checksum(&pair6));
            }
        }
    }
    if let Ok(p) = icmp::Packet::new_checked(data) {
        let _ = (
            p.v4_type(),
            p.v6_type(),
            p.msg_code(),
            p.checksum(),
            p.rest_of_header(),
        );
        let _ = (p.echo_ident(), p.echo_seq_no(), p.mtu(), p.data().len());
        let _ = (p.verify_checksum_v4(), p.verify_checksum_v6(&pair6));
        let _ = icmp::IcmpRepr::parse_v4(&p);
        let _ = icmp::IcmpRepr::parse_v6(&p, &pair6);
        // Re-emit whatever the header says, checksum recomputed.
        let r = icmp::IcmpRepr {
            msg_type: p.msg_type(),
            code: p.msg_code(),
            rest: p.rest_of_header(),
            data: p.data(),
        };
        if let Some(out) = scratch.get_mut(..r.buffer_len()) {
            assert!(r
                .emit_v4(&mut icmp::Packet::new_unchecked(&mut *out))
                .is_ok());
            assert_eq!(
                icmp::IcmpRepr::parse_v4(&icmp::Packet::new_unchecked(&*out)),
                Ok(r)
            );
        }
    }
}
