//! Symbolic constants shared by the parsers and the printer (service names,
//! ICMP types, conntrack states, TCP flags, protocols, reject codes).

use crate::ast::DataType;

pub(crate) const SERVICES: &[(&str, u64)] = &[
    ("ftp-data", 20),
    ("ftp", 21),
    ("ssh", 22),
    ("telnet", 23),
    ("smtp", 25),
    ("whois", 43),
    ("domain", 53),
    ("bootps", 67),
    ("bootpc", 68),
    ("tftp", 69),
    ("http", 80),
    ("kerberos", 88),
    ("pop3", 110),
    ("sunrpc", 111),
    ("ntp", 123),
    ("netbios-ns", 137),
    ("netbios-dgm", 138),
    ("netbios-ssn", 139),
    ("imap", 143),
    ("imap2", 143),
    ("snmp", 161),
    ("snmp-trap", 162),
    ("bgp", 179),
    ("ldap", 389),
    ("https", 443),
    ("microsoft-ds", 445),
    ("isakmp", 500),
    ("syslog", 514),
    ("submission", 587),
    ("ldaps", 636),
    ("imaps", 993),
    ("pop3s", 995),
    ("openvpn", 1194),
    ("mysql", 3306),
    ("ms-wbt-server", 3389),
    ("ipsec-nat-t", 4500),
    ("sip", 5060),
    ("postgresql", 5432),
    ("mdns", 5353),
    ("http-alt", 8080),
];

pub(crate) const PROTOCOLS: &[(&str, u64)] = &[
    ("icmp", 1),
    ("igmp", 2),
    ("tcp", 6),
    ("udp", 17),
    ("ipv6", 41),
    ("gre", 47),
    ("esp", 50),
    ("ah", 51),
    ("icmpv6", 58),
    ("sctp", 132),
    ("udplite", 136),
    ("ipip", 4),
    ("dccp", 33),
    ("ipv6-route", 43),
    ("ipv6-frag", 44),
    ("ipv6-nonxt", 59),
    ("ipv6-opts", 60),
    ("ospf", 89),
    ("pim", 103),
    ("vrrp", 112),
    ("l2tp", 115),
    // /etc/protocols alias of icmpv6; listed after it so that the printer
    // keeps "icmpv6" as the canonical name.
    ("ipv6-icmp", 58),
];

pub(crate) const NFPROTO: &[(&str, u64)] = &[("ipv4", 2), ("ipv6", 10)];

/// EtherTypes (`meta protocol`, `ether type`), with nft's names (but
/// `8021ad`, which starts with a digit: write 0x88a8).
pub(crate) const ETHER_TYPES: &[(&str, u64)] = &[
    ("ip", 0x0800),
    ("arp", 0x0806),
    ("vlan", 0x8100),
    ("ip6", 0x86dd),
];

pub(crate) const CT_STATES: &[(&str, u64)] = &[
    ("invalid", 1),
    ("established", 2),
    ("related", 4),
    ("new", 8),
    ("untracked", 64),
];

pub(crate) const CT_STATUS: &[(&str, u64)] = &[
    ("expected", 1),
    ("seen-reply", 2),
    ("assured", 4),
    ("confirmed", 8),
    ("snat", 16),
    ("dnat", 32),
    ("dying", 512),
];

pub(crate) const TCP_FLAGS: &[(&str, u64)] = &[
    ("fin", 1),
    ("syn", 2),
    ("rst", 4),
    ("psh", 8),
    ("ack", 16),
    ("urg", 32),
    ("ecn", 64),
    ("cwr", 128),
];

pub(crate) const ICMP_TYPES: &[(&str, u64)] = &[
    ("echo-reply", 0),
    ("destination-unreachable", 3),
    ("source-quench", 4),
    ("redirect", 5),
    ("echo-request", 8),
    ("router-advertisement", 9),
    ("router-solicitation", 10),
    ("time-exceeded", 11),
    ("parameter-problem", 12),
    ("timestamp-request", 13),
    ("timestamp-reply", 14),
    ("info-request", 15),
    ("info-reply", 16),
    ("address-mask-request", 17),
    ("address-mask-reply", 18),
];

pub(crate) const ICMPV6_TYPES: &[(&str, u64)] = &[
    ("destination-unreachable", 1),
    ("packet-too-big", 2),
    ("time-exceeded", 3),
    ("parameter-problem", 4),
    ("echo-request", 128),
    ("echo-reply", 129),
    ("mld-listener-query", 130),
    ("mld-listener-report", 131),
    ("mld-listener-done", 132),
    ("nd-router-solicit", 133),
    ("nd-router-advert", 134),
    ("nd-neighbor-solicit", 135),
    ("nd-neighbor-advert", 136),
    ("nd-redirect", 137),
    ("router-renumbering", 138),
    ("mld2-listener-report", 143),
];

/// ICMP destination-unreachable codes usable with `reject with icmp`.
pub(crate) const ICMP_REJECT: &[(&str, u64)] = &[
    ("net-unreachable", 0),
    ("host-unreachable", 1),
    ("prot-unreachable", 2),
    ("port-unreachable", 3),
    ("net-prohibited", 9),
    ("host-prohibited", 10),
    ("admin-prohibited", 13),
];

/// `reject with icmpv6`: every ICMPv6 destination-unreachable code.
pub(crate) const ICMPV6_REJECT: &[(&str, u64)] = ICMPV6_CODES;

pub(crate) const ICMPX_REJECT: &[(&str, u64)] = &[
    ("no-route", 0),
    ("port-unreachable", 1),
    ("host-unreachable", 2),
    ("admin-prohibited", 3),
];

/// DiffServ code points (RFC 2474, RFC 2597, RFC 3246, RFC 5865, RFC 8622),
/// nft's names.
pub(crate) const DSCP: &[(&str, u64)] = &[
    ("cs0", 0x00),
    ("cs1", 0x08),
    ("cs2", 0x10),
    ("cs3", 0x18),
    ("cs4", 0x20),
    ("cs5", 0x28),
    ("cs6", 0x30),
    ("cs7", 0x38),
    ("df", 0x00),
    ("be", 0x00),
    ("lephb", 0x01),
    ("af11", 0x0a),
    ("af12", 0x0c),
    ("af13", 0x0e),
    ("af21", 0x12),
    ("af22", 0x14),
    ("af23", 0x16),
    ("af31", 0x1a),
    ("af32", 0x1c),
    ("af33", 0x1e),
    ("af41", 0x22),
    ("af42", 0x24),
    ("af43", 0x26),
    ("va", 0x2c),
    ("ef", 0x2e),
];

/// `meta pkttype` (the kernel's `PACKET_*`).
pub(crate) const PKTTYPE: &[(&str, u64)] = &[
    ("host", 0),
    ("unicast", 0),
    ("broadcast", 1),
    ("multicast", 2),
    ("other", 3),
];

/// `fib … type` (the kernel's `RTN_*` route types).
pub(crate) const ADDRTYPE: &[(&str, u64)] = &[
    ("unspec", 0),
    ("unicast", 1),
    ("local", 2),
    ("broadcast", 3),
    ("anycast", 4),
    ("multicast", 5),
    ("blackhole", 6),
    ("unreachable", 7),
    ("prohibit", 8),
    ("throw", 9),
    ("nat", 10),
    ("xresolve", 11),
];

/// `icmp code` names (nft's `icmp_code`).
pub(crate) const ICMP_CODES: &[(&str, u64)] = &[
    ("net-unreachable", 0),
    ("host-unreachable", 1),
    ("prot-unreachable", 2),
    ("port-unreachable", 3),
    ("frag-needed", 4),
    ("net-prohibited", 9),
    ("host-prohibited", 10),
    ("admin-prohibited", 13),
];

/// `icmpv6 code` names (nft's `icmpv6_code`).
pub(crate) const ICMPV6_CODES: &[(&str, u64)] = &[
    ("no-route", 0),
    ("admin-prohibited", 1),
    ("addr-unreachable", 3),
    ("port-unreachable", 4),
    ("policy-fail", 5),
    ("reject-route", 6),
];

/// `fib … oif missing | exists`.
pub(crate) const FIB_PRESENCE: &[(&str, u64)] = &[("missing", 0), ("exists", 1)];

/// `ct direction`.
pub(crate) const CT_DIR: &[(&str, u64)] = &[("original", 0), ("reply", 1)];

/// Symbol table for a data type (empty for non-symbolic types).
pub(crate) fn table(dt: DataType) -> &'static [(&'static str, u64)] {
    match dt {
        DataType::InetService => SERVICES,
        DataType::InetProto => PROTOCOLS,
        DataType::NfProto => NFPROTO,
        DataType::EtherType => ETHER_TYPES,
        DataType::CtState => CT_STATES,
        DataType::CtStatus => CT_STATUS,
        DataType::TcpFlag => TCP_FLAGS,
        DataType::IcmpType => ICMP_TYPES,
        DataType::Icmpv6Type => ICMPV6_TYPES,
        DataType::Dscp => DSCP,
        DataType::PktType => PKTTYPE,
        DataType::AddrType => ADDRTYPE,
        DataType::IcmpCode => ICMP_CODES,
        DataType::Icmpv6Code => ICMPV6_CODES,
        DataType::CtDir => CT_DIR,
        DataType::FibPresence => FIB_PRESENCE,
        _ => &[],
    }
}

pub(crate) fn lookup(dt: DataType, name: &str) -> Option<u64> {
    table(dt).iter().find(|(n, _)| *n == name).map(|(_, v)| *v)
}

/// Name printed for a value, where nft prints names (not for ports).
pub(crate) fn name_of(dt: DataType, v: u64) -> Option<&'static str> {
    if dt == DataType::InetService {
        return None;
    }
    table(dt).iter().find(|(_, x)| *x == v).map(|(n, _)| *n)
}

pub(crate) fn code_name(tab: &[(&'static str, u64)], code: u8) -> Option<&'static str> {
    tab.iter()
        .find(|(_, c)| *c == u64::from(code))
        .map(|(n, _)| *n)
}

pub(crate) fn code_lookup(tab: &[(&str, u64)], name: &str) -> Option<u8> {
    tab.iter()
        .find(|(n, _)| *n == name)
        .and_then(|(_, c)| u8::try_from(*c).ok())
}

/// Parse a MAC address `aa:bb:cc:dd:ee:ff` (or with `-`) into the low 48
/// bits of a `u64`, first byte most significant.
pub(crate) fn parse_mac(s: &str) -> Option<u64> {
    let parts: Vec<&str> = s.split([':', '-']).collect();
    if parts.len() != 6 {
        return None;
    }
    let mut v = 0u64;
    for p in parts {
        if p.is_empty() || p.len() > 2 {
            return None;
        }
        v = v << 8 | u64::from_str_radix(p, 16).ok()?;
    }
    Some(v)
}

/// A MAC address as [`parse_mac`] reads it, in its canonical form.
pub(crate) fn format_mac(v: u64) -> String {
    let b = v.to_be_bytes();
    format!(
        "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
        b[2], b[3], b[4], b[5], b[6], b[7]
    )
}

/// Parse a decimal or `0x` hexadecimal number.
///
/// (No symbol name in the tables above starts with a digit, so a word that
/// does is a number or a numeric range: the parser relies on it.)
pub(crate) fn parse_num(s: &str) -> Option<u64> {
    if let Some(h) = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        u64::from_str_radix(h, 16).ok()
    } else if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) {
        s.parse().ok()
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_symbol_name_starts_with_a_digit() {
        let tables = DataType::ALL.iter().map(|dt| table(*dt));
        let codes = [ICMP_REJECT, ICMPV6_REJECT, ICMPX_REJECT];
        let names = tables
            .flat_map(|t| t.iter().map(|(n, _)| *n))
            .chain(codes.iter().flat_map(|t| t.iter().map(|(n, _)| *n)));
        for n in names {
            assert!(!n.starts_with(|c: char| c.is_ascii_digit()), "{n}");
        }
    }
}
