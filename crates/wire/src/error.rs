//! Error types of the wire layer: small `Copy` enums with `Display`.

/// Why a frame, header or `Repr` could not be parsed.
///
/// One variant per distinct cause, so the engine can map each to a drop
/// reason counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
pub enum ParseError {
    /// The buffer ends before a fixed-size header does.
    #[error("truncated header")]
    Truncated,
    /// More VLAN tags than supported (one 802.1Q tag, or an 802.1ad S-tag
    /// followed by one C-tag).
    #[error("too many VLAN tags")]
    VlanDepth,
    /// ARP for something other than Ethernet/IPv4 (RFC 826 htype/ptype/hlen/plen).
    #[error("unsupported ARP hardware or protocol type")]
    ArpFormat,
    /// The IP version nibble does not match the ethertype.
    #[error("bad IP version")]
    IpVersion,
    /// IPv4 IHL below 5 or beyond the buffer (RFC 791 §3.1).
    #[error("bad IPv4 header length")]
    Ipv4HeaderLen,
    /// IPv4 total length below the header length or beyond the buffer.
    #[error("bad IPv4 total length")]
    Ipv4TotalLen,
    /// IPv6 payload length beyond the buffer (RFC 8200 §3).
    #[error("bad IPv6 payload length")]
    Ipv6PayloadLen,
    /// An IPv6 extension header runs past the payload, or hop-by-hop options
    /// are not first (RFC 8200 §4.1).
    #[error("bad IPv6 extension header")]
    Ipv6ExtHeader,
    /// Longer IPv6 extension header chain than supported.
    #[error("IPv6 extension header chain too long")]
    Ipv6ExtChain,
    /// TCP data offset below 5 or beyond the segment (RFC 9293 §3.1).
    #[error("bad TCP data offset")]
    TcpDataOffset,
    /// UDP length field below 8 or beyond the datagram (RFC 768).
    #[error("bad UDP length")]
    UdpLength,
    /// An ICMP error quotes a packet that cannot yield a flow key (RFC 792:
    /// IP header plus the first 8 bytes of its payload are required).
    #[error("unusable packet quoted in ICMP error")]
    IcmpInner,
    /// A checksum does not verify (only checked by `Repr::parse`).
    #[error("bad checksum")]
    Checksum,
    /// A field holds a value the `Repr` cannot represent.
    #[error("malformed field")]
    Malformed,
}

/// Why a `Repr` could not be emitted or a frame built.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
pub enum EmitError {
    /// The output buffer is smaller than `buffer_len`.
    #[error("buffer too small")]
    BufferTooSmall,
    /// The payload does not fit the protocol's length field.
    #[error("payload too large")]
    PayloadTooLarge,
    /// TCP/IP options must be a multiple of 4 bytes and at most 40.
    #[error("bad options length")]
    OptionsLen,
}
