//! IPv4 fragmentation on output (RFC 791 section 3.2, RFC 1812 section
//! 5.2.6): split a packet larger than the egress MTU, with DF clear, into
//! fragments that fit.
//!
//! [`fragment4`] writes the fragments one at a time into a caller's buffer
//! and hands each to a callback, so nothing is allocated. Every fragment
//! repeats the frame's link-layer header (everything before the IPv4
//! header: Ethernet, and any VLAN tags), carries the whole IP header in
//! the first fragment and, in the later ones, only the options whose copy
//! flag is set (RFC 791: security, loose and strict source route), padded
//! to a multiple of 4 bytes. Data is split at multiples of 8 bytes. A
//! packet that is itself a fragment is split further: the pieces' offsets
//! continue from its offset, and only its last piece keeps its MF flag.

use crate::checksum;

/// Why a packet cannot be fragmented.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FragError {
    /// The frame is not a well-formed IPv4 packet at the given offset.
    Malformed,
    /// DF is set: the sender must be told (ICMP fragmentation needed).
    DontFragment,
    /// The MTU cannot carry the header and 8 bytes of data.
    MtuTooSmall,
    /// The output buffer cannot hold one fragment.
    BufferTooSmall,
    /// The fragment offsets would pass 65528 (the datagram is malformed).
    OffsetOverflow,
}

impl core::fmt::Display for FragError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            FragError::Malformed => "not a well-formed IPv4 packet",
            FragError::DontFragment => "DF is set",
            FragError::MtuTooSmall => "MTU below header + 8 bytes",
            FragError::BufferTooSmall => "buffer smaller than one fragment",
            FragError::OffsetOverflow => "fragment offset past 65528",
        })
    }
}

impl std::error::Error for FragError {}

/// Splits the IPv4 packet at `frame[l3..]` into fragments of at most `mtu`
/// bytes of IP packet each. Each fragment, link-layer header included, is
/// built in `buf` and passed to `emit` (its length in bytes). Returns the
/// number of fragments. `frame` ends where the IP packet ends (its IP
/// total length decides; anything after it, such as Ethernet padding, is
/// ignored). Nothing is emitted when an error is returned.
pub fn fragment4(
    frame: &[u8],
    l3: usize,
    mtu: u16,
    buf: &mut [u8],
    mut emit: impl FnMut(&[u8]),
) -> Result<usize, FragError> {
    let ip = frame.get(l3..).ok_or(FragError::Malformed)?;
    let b0 = *ip.first().ok_or(FragError::Malformed)?;
    let ihl = usize::from(b0 & 0x0f) * 4;
    if b0 >> 4 != 4 || ihl < 20 || ip.len() < ihl {
        return Err(FragError::Malformed);
    }
    let total = usize::from(u16::from_be_bytes([ip[2], ip[3]]));
    if total < ihl || total > ip.len() {
        return Err(FragError::Malformed);
    }
    let ff = u16::from_be_bytes([ip[6], ip[7]]);
    if ff & 0x4000 != 0 {
        return Err(FragError::DontFragment);
    }
    let more = ff & 0x2000 != 0;
    let base = usize::from(ff & 0x1fff) * 8;
    // The later fragments' header: the fixed part and the copied options.
    let mut later_hdr = [0u8; 60];
    later_hdr[..20].copy_from_slice(&ip[..20]);
    let mut later_len = 20;
    let mut o = 20;
    while o < ihl {
        let t = ip[o];
        match t {
            0 => break,
            1 => o += 1,
            _ => {
                let len = usize::from(*ip.get(o + 1).ok_or(FragError::Malformed)?);
                if len < 2 || o + len > ihl {
                    return Err(FragError::Malformed);
                }
                if t & 0x80 != 0 {
                    later_hdr[later_len..later_len + len].copy_from_slice(&ip[o..o + len]);
                    later_len += len;
                }
                o += len;
            }
        }
    }
    // Pad with end-of-options (zeros) to a multiple of 4.
    let later_len = later_len.div_ceil(4) * 4;
    let mtu = usize::from(mtu);
    let data = &ip[ihl..total];
    // Data per fragment: a multiple of 8 that fits with the larger header.
    let per_first = (mtu.saturating_sub(ihl)) & !7;
    let per_later = (mtu.saturating_sub(later_len)) & !7;
    if per_first == 0 || per_later == 0 {
        return Err(FragError::MtuTooSmall);
    }
    if buf.len() < l3 + ihl.max(later_len) + per_first.max(per_later).min(data.len()) {
        return Err(FragError::BufferTooSmall);
    }
    // Every piece's offset must fit 13 bits (8-byte units); checked before
    // anything is emitted.
    {
        let mut at = 0usize;
        let mut first = true;
        while at < data.len() {
            if (base + at) / 8 > 0x1fff {
                return Err(FragError::OffsetOverflow);
            }
            at += if first { per_first } else { per_later };
            first = false;
        }
    }
    let link = &frame[..l3];
    let mut off = 0usize;
    let mut n = 0usize;
    while off < data.len() || (n == 0 && data.is_empty()) {
        let (hdr, hlen, per): (&[u8], usize, usize) = if n == 0 {
            (&ip[..ihl], ihl, per_first)
        } else {
            (&later_hdr[..later_len], later_len, per_later)
        };
        let take = per.min(data.len() - off);
        let last = off + take >= data.len();
        let out = &mut buf[..l3 + hlen + take];
        out[..l3].copy_from_slice(link);
        let h = &mut out[l3..l3 + hlen];
        h.copy_from_slice(hdr);
        h[0] = 0x40 | (hlen / 4) as u8;
        h[2..4].copy_from_slice(&((hlen + take) as u16).to_be_bytes());
        let frag_off = ((base + off) / 8) as u16;
        let mf = if last { more } else { true };
        h[6..8].copy_from_slice(&(frag_off | if mf { 0x2000 } else { 0 }).to_be_bytes());
        h[10] = 0;
        h[11] = 0;
        let c = checksum::checksum(h);
        h[10..12].copy_from_slice(&c.to_be_bytes());
        out[l3 + hlen..].copy_from_slice(&data[off..off + take]);
        emit(out);
        off += take;
        n += 1;
        if data.is_empty() {
            break;
        }
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn packet(link: usize, options: &[u8], data_len: usize, ff: u16) -> Vec<u8> {
        let ihl = 20 + options.len().div_ceil(4) * 4;
        let mut f = vec![0u8; link + ihl + data_len];
        for (i, b) in f[..link].iter_mut().enumerate() {
            *b = i as u8 | 0x80;
        }
        let ip = &mut f[link..];
        ip[0] = 0x40 | (ihl / 4) as u8;
        ip[2..4].copy_from_slice(&((ihl + data_len) as u16).to_be_bytes());
        ip[4..6].copy_from_slice(&0xbeefu16.to_be_bytes());
        ip[6..8].copy_from_slice(&ff.to_be_bytes());
        ip[8] = 63;
        ip[9] = 17;
        ip[12..16].copy_from_slice(&[10, 0, 0, 2]);
        ip[16..20].copy_from_slice(&[192, 0, 2, 80]);
        ip[20..20 + options.len()].copy_from_slice(options);
        for (i, b) in ip[ihl..].iter_mut().enumerate() {
            *b = (i * 13 + 7) as u8;
        }
        let c = checksum::checksum(&ip[..ihl]);
        ip[10..12].copy_from_slice(&c.to_be_bytes());
        f
    }

    /// (offset in bytes, MF, header, data) of each fragment.
    fn split(f: &[u8], link: usize, mtu: u16) -> Vec<(usize, bool, Vec<u8>, Vec<u8>)> {
        let mut buf = vec![0u8; 4096];
        let mut out = Vec::new();
        let n = fragment4(f, link, mtu, &mut buf, |fr| {
            assert_eq!(&fr[..link], &f[..link], "link header repeated");
            let ip = &fr[link..];
            let ihl = usize::from(ip[0] & 15) * 4;
            assert!(
                ip.len() <= usize::from(mtu),
                "fragment {} > mtu {mtu}",
                ip.len()
            );
            assert_eq!(usize::from(u16::from_be_bytes([ip[2], ip[3]])), ip.len());
            assert!(checksum::verify(&ip[..ihl]), "header checksum");
            let ff = u16::from_be_bytes([ip[6], ip[7]]);
            out.push((
                usize::from(ff & 0x1fff) * 8,
                ff & 0x2000 != 0,
                ip[..ihl].to_vec(),
                ip[ihl..].to_vec(),
            ));
        })
        .unwrap();
        assert_eq!(n, out.len());
        out
    }

    #[test]
    fn splits_at_multiples_of_eight_and_reassembles() {
        let f = packet(14, &[], 3000, 0);
        let fr = split(&f, 14, 1400);
        assert_eq!(fr.len(), 3);
        assert_eq!(
            fr.iter().map(|x| x.3.len()).collect::<Vec<_>>(),
            [1376, 1376, 248]
        );
        assert_eq!(fr.iter().map(|x| x.0).collect::<Vec<_>>(), [0, 1376, 2752]);
        assert_eq!(
            fr.iter().map(|x| x.1).collect::<Vec<_>>(),
            [true, true, false]
        );
        let data: Vec<u8> = fr.iter().flat_map(|x| x.3.clone()).collect();
        assert_eq!(&data[..], &f[34..]);
    }

    #[test]
    fn a_fragment_is_split_further_and_keeps_its_mf_on_the_last_piece() {
        // Offset 185 (1480 bytes), MF set: a middle fragment.
        let f = packet(14, &[], 1480, 0x2000 | 185);
        let fr = split(&f, 14, 1000);
        assert_eq!(
            fr.iter().map(|x| x.0).collect::<Vec<_>>(),
            [1480, 1480 + 976]
        );
        assert!(
            fr.iter().all(|x| x.1),
            "MF on every piece of a middle fragment"
        );
        let f = packet(14, &[], 1480, 185);
        let fr = split(&f, 14, 1000);
        assert_eq!(fr.iter().map(|x| x.1).collect::<Vec<_>>(), [true, false]);
    }

    #[test]
    fn later_fragments_carry_only_copied_options() {
        // Record route (7, not copied), then loose source route (131,
        // copied), then end of options.
        let opts = [7, 7, 4, 0, 0, 0, 0, 131, 7, 4, 1, 2, 3, 4, 0, 0];
        let f = packet(14, &opts, 2000, 0);
        let fr = split(&f, 14, 1000);
        assert_eq!(fr[0].2.len(), 36, "the first fragment keeps every option");
        for x in &fr[1..] {
            assert_eq!(x.2.len(), 28, "header 20 + LSRR 7 padded to 8");
            assert_eq!(&x.2[20..27], &opts[7..14]);
            assert_eq!(x.2[27], 0);
        }
        let data: Vec<u8> = fr.iter().flat_map(|x| x.3.clone()).collect();
        assert_eq!(&data[..], &f[14 + 36..]);
    }

    #[test]
    fn refuses_df_small_mtus_and_malformed_packets() {
        let mut buf = vec![0u8; 4096];
        let f = packet(14, &[], 2000, 0x4000);
        assert_eq!(
            fragment4(&f, 14, 1400, &mut buf, |_| {}),
            Err(FragError::DontFragment)
        );
        let f = packet(14, &[], 2000, 0);
        assert_eq!(
            fragment4(&f, 14, 27, &mut buf, |_| {}),
            Err(FragError::MtuTooSmall)
        );
        assert_eq!(
            fragment4(&f, 14, 1400, &mut buf[..100], |_| {}),
            Err(FragError::BufferTooSmall)
        );
        assert_eq!(
            fragment4(&f[..30], 14, 1400, &mut buf, |_| {}),
            Err(FragError::Malformed)
        );
        let mut bad = f.clone();
        bad[14] = 0x46; // IHL 24, but options run past it: fine; now a bad length
        bad[14 + 20] = 7;
        bad[14 + 21] = 9;
        assert_eq!(
            fragment4(&bad, 14, 1400, &mut buf, |_| {}),
            Err(FragError::Malformed)
        );
        // Offset overflow: a fragment at 65000 with 1000 bytes.
        let f = packet(14, &[], 1000, 8125);
        assert_eq!(
            fragment4(&f, 14, 200, &mut buf, |_| {}),
            Err(FragError::OffsetOverflow)
        );
    }

    proptest! {
        #[test]
        fn fragments_fit_verify_and_reassemble(
            link in prop_oneof![Just(14usize), Just(18usize)],
            data_len in 0usize..4000,
            mtu in 28u16..2000,
            base in 0u16..100,
            more in any::<bool>(),
        ) {
            let ff = base | if more { 0x2000 } else { 0 };
            let f = packet(link, &[], data_len, ff);
            let fr = split(&f, link, mtu);
            let mut expect = usize::from(base) * 8;
            let mut data = Vec::new();
            for (i, x) in fr.iter().enumerate() {
                prop_assert_eq!(x.0, expect);
                let last = i + 1 == fr.len();
                prop_assert_eq!(x.1, if last { more } else { true });
                if !last {
                    prop_assert_eq!(x.3.len() % 8, 0);
                }
                prop_assert_eq!(&x.2[4..6], &f[link + 4..link + 6], "identification");
                expect += x.3.len();
                data.extend_from_slice(&x.3);
            }
            prop_assert_eq!(&data[..], &f[link + 20..]);
        }

        #[test]
        fn never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..200), l3 in 0usize..30, mtu in 0u16..300) {
            let mut buf = vec![0u8; 512];
            let _ = fragment4(&bytes, l3, mtu, &mut buf, |_| {});
        }
    }
}
