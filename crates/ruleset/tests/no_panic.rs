//! Arbitrary input never panics either parser (and printing what parses is a fixed point).

use proptest::prelude::*;
use sluice_ruleset::{parse_ip6tables_restore_str, parse_iptables_restore_str, parse_nft_str};

const NFT_WORDS: &[&str] = &[
    "table",
    "ip",
    "inet",
    "ip6",
    "chain",
    "set",
    "map",
    "type",
    "hook",
    "input",
    "priority",
    "policy",
    "{",
    "}",
    ";",
    "\n",
    "tcp",
    "dport",
    "22",
    "ip",
    "saddr",
    "10.0.0.0/8",
    "@s",
    "accept",
    "drop",
    "jump",
    "c",
    "ct",
    "state",
    "new,established",
    "{ 1 , 2 }",
    ".",
    ":",
    "vmap",
    "snat",
    "to",
    "1.2.3.4:80",
    "limit",
    "rate",
    "10/second",
    "counter",
    "define",
    "x",
    "=",
    "$x",
    "\"eth*\"",
    "elements",
    "flags",
    "interval",
    "ipv4_addr",
    "-",
    "&",
    "|",
    "(",
    ")",
    "/",
    "syn",
    "!=",
    "include",
    "flush",
    "ruleset",
    "add",
    "update",
    "delete",
    "count",
    "over",
    "numgen",
    "inc",
    "random",
    "mod",
    "offset",
    "dynamic",
    "timeout",
    "1m30s",
    "size",
    "over",
    "@s {",
    "ip saddr . 22",
];

fn words(pool: &'static [&'static str]) -> impl Strategy<Value = String> {
    prop::collection::vec(prop::sample::select(pool), 0..60).prop_map(|v| v.join(" "))
}

const IPT_WORDS: &[&str] = &[
    "*filter",
    "*nat",
    "COMMIT",
    "\n",
    ":INPUT",
    "ACCEPT",
    "DROP",
    "[0:0]",
    "-A",
    "-I",
    "-N",
    "-P",
    "INPUT",
    "-p",
    "tcp",
    "--dport",
    "22:80",
    "-s",
    "1.2.3.4/24",
    "!",
    "-j",
    "-m",
    "set",
    "--match-set",
    "s",
    "src,dst",
    "--ctstate",
    "NEW",
    "-i",
    "eth+",
    "SNAT",
    "--to-source",
    "1.2.3.4",
    "\"x",
    "MASQUERADE",
    "-",
    "hashlimit",
    "--hashlimit-above",
    "--hashlimit-upto",
    "3/min",
    "--hashlimit-mode",
    "srcip,dstport",
    "--hashlimit-name",
    "--hashlimit-burst",
    "--hashlimit-htable-expire",
    "connlimit",
    "statistic",
    "--mode",
    "nth",
    "--every",
    "--packet",
    "--probability",
    "0.5",
    "--connlimit-above",
    "--connlimit-upto",
    "--connlimit-mask",
    "--connlimit-daddr",
    "2001:db8::/32",
    "ipv6-icmp",
    "--icmpv6-type",
    "neighbour-solicitation",
    "REJECT",
    "--reject-with",
    "icmp6-adm-prohibited",
];

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, .. ProptestConfig::default() })]

    #[test]
    fn nft_arbitrary_bytes(s in "\\PC{0,200}") {
        let _ = parse_nft_str("fuzz.nft", &s);
    }

    #[test]
    fn nft_token_soup(s in words(NFT_WORDS)) {
        if let Ok(r) = parse_nft_str("fuzz.nft", &s) {
            let p = r.to_nft();
            let again = parse_nft_str("again.nft", &p).map(|r| r.to_nft());
            prop_assert_eq!(again.ok(), Some(p));
        }
    }

    #[test]
    fn iptables_arbitrary(s in "\\PC{0,200}", sets in proptest::option::of("\\PC{0,80}")) {
        let _ = parse_iptables_restore_str("fuzz.rules", &s, sets.as_deref());
    }

    #[test]
    fn iptables_token_soup(s in words(IPT_WORDS)) {
        let sets = Some("create s hash:ip,port\nadd s 1.2.3.4,tcp:80\n");
        for r in [
            parse_iptables_restore_str("fuzz.rules", &s, sets),
            parse_ip6tables_restore_str("fuzz.rules", &s, sets),
        ]
        .into_iter()
        .flatten()
        {
            let p = r.to_nft();
            let again = parse_nft_str("fuzz.nft", &p).map(|r| r.to_nft());
            prop_assert_eq!(again.ok(), Some(p));
        }
    }
}
