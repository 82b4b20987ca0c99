//! Differential property test: random small nft rule sets (generated as
//! text, parsed, lowered) times random packets. The compiled classifier and
//! the linear reference must agree on every chain run (outcome and matched
//! rules) along the packet's whole hook path: zero mismatches.

use std::net::IpAddr;

use proptest::prelude::*;
use sluice_engine::CtState;
use sluice_policy::{CompiledPolicy, Interfaces, TracePacket};

const MATCHES: &[&str] = &[
    "ip saddr 10.0.0.0/30",
    "ip saddr != 10.0.0.1",
    "ip saddr { 10.0.0.1, 10.0.0.3 }",
    "ip saddr @srcs",
    "ip daddr 10.0.1.0-10.0.1.2",
    "ip6 saddr fe80::/64",
    "tcp dport { 1, 3 }",
    "tcp dport 2",
    "udp dport 1-3",
    "th dport != 2",
    "tcp sport < 3",
    "tcp sport >= 2",
    "meta l4proto udp",
    "ip protocol icmp",
    "icmp type echo-request",
    "iifname \"eth*\"",
    "iifname \"eth1\"",
    "oifname != \"wg0\"",
    "iif \"lo\"",
    "ct state established,related",
    "ct state new",
    "ct state != invalid",
    "ct state { new, invalid }",
    "meta mark 1",
    "meta mark & 0x00000002 == 0x00000002",
    "ct mark 1",
    "tcp flags syn",
    "tcp flags & (syn | ack) == syn",
    "ip daddr . tcp dport { 10.0.1.1 . 2, 10.0.1.2 . 3 }",
    "ip daddr . tcp dport @pairs",
];

const STMTS: &[&str] = &[
    "counter",
    "meta mark set 1",
    "meta mark set 2",
    "ct mark set 1",
];

/// Verdicts; `{sub}` is replaced by a chain the rule may jump to.
const VERDICTS: &[&str] = &[
    "",
    "accept",
    "drop",
    "reject",
    "reject with tcp reset",
    "return",
    "jump {sub}",
    "goto {sub}",
    "tcp dport vmap { 1 : accept, 2 : drop, 3 : jump {sub} }",
    "iifname vmap { \"eth0\" : drop, \"lo\" : goto {sub} }",
];

#[derive(Debug, Clone)]
struct RuleSpec {
    matches: Vec<usize>,
    stmt: Option<usize>,
    verdict: usize,
}

fn rule_strategy() -> impl Strategy<Value = RuleSpec> {
    (
        prop::collection::vec(0..MATCHES.len(), 0..3),
        prop::option::of(0..STMTS.len()),
        0..VERDICTS.len(),
    )
        .prop_map(|(matches, stmt, verdict)| RuleSpec {
            matches,
            stmt,
            verdict,
        })
}

fn render_rule(r: &RuleSpec, sub: Option<&str>) -> String {
    let mut parts: Vec<String> = r
        .matches
        .iter()
        .filter_map(|i| MATCHES.get(*i).map(|s| s.to_string()))
        .collect();
    let v = VERDICTS.get(r.verdict).copied().unwrap_or("");
    // A mark change before a map lookup in a rule that matches on a mark is
    // refused by the lowering (documented); keep the generator clear of it.
    let reads_mark = parts.iter().any(|m| m.contains("mark"));
    if let Some(s) = r.stmt.and_then(|i| STMTS.get(i)) {
        if !(v.contains("vmap") && reads_mark && s.contains("mark")) {
            parts.push(s.to_string());
        }
    }
    match sub {
        Some(sub) => parts.push(v.replace("{sub}", sub)),
        // Chains without a target degrade jumps to accept.
        None if v.contains("{sub}") => parts.push("accept".to_string()),
        None => parts.push(v.to_string()),
    }
    // `reject with tcp reset` needs a TCP match in nft.
    if v == "reject with tcp reset" {
        parts.insert(0, "meta l4proto tcp".to_string());
    }
    parts.join(" ")
}

/// Base chains at forward (two, different priorities) plus `c1` -> `c2`.
fn render_ruleset(
    base: &[RuleSpec],
    base2: &[RuleSpec],
    c1: &[RuleSpec],
    c2: &[RuleSpec],
    policy_drop: bool,
) -> String {
    let pol = if policy_drop { "drop" } else { "accept" };
    let mut s = String::from(
        "table inet t {\n\
         \tset srcs { type ipv4_addr; flags interval; elements = { 10.0.0.2-10.0.0.3 } }\n\
         \tset pairs { type ipv4_addr . inet_service; elements = { 10.0.1.0 . 1, 10.0.1.1 . 3 } }\n",
    );
    s.push_str(&format!(
        "\tchain fwd {{\n\t\ttype filter hook forward priority 0; policy {pol};\n"
    ));
    for r in base {
        s.push_str(&format!("\t\t{}\n", render_rule(r, Some("c1"))));
    }
    s.push_str("\t}\n\tchain fwd2 {\n\t\ttype filter hook forward priority 5; policy accept;\n");
    for r in base2 {
        s.push_str(&format!("\t\t{}\n", render_rule(r, Some("c2"))));
    }
    s.push_str("\t}\n\tchain c1 {\n");
    for r in c1 {
        s.push_str(&format!("\t\t{}\n", render_rule(r, Some("c2"))));
    }
    s.push_str("\t}\n\tchain c2 {\n");
    for r in c2 {
        s.push_str(&format!("\t\t{}\n", render_rule(r, None)));
    }
    s.push_str("\t}\n}\n");
    s
}

fn packet_strategy() -> impl Strategy<Value = TracePacket> {
    (
        prop::sample::select(vec![1u8, 6, 17, 58]),
        prop::sample::select(vec![
            "10.0.0.0",
            "10.0.0.1",
            "10.0.0.2",
            "10.0.0.3",
            "10.0.0.4",
            "fe80::1",
            "2001:db8::1",
        ]),
        prop::sample::select(vec!["10.0.1.0", "10.0.1.1", "10.0.1.2", "10.0.1.3"]),
        0u16..5,
        0u16..5,
        prop::sample::select(vec![0u8, 0x02, 0x12, 0x10, 0x01]),
        prop::sample::select(vec![
            CtState::New,
            CtState::Established,
            CtState::Related,
            CtState::Invalid,
        ]),
        0u32..4,
        0u32..2,
        prop::sample::select(vec!["eth0", "eth1", "lo", "wg0", "ppp0"]),
        prop::sample::select(vec!["eth0", "wg0", "ppp0"]),
        prop::sample::select(vec![0u8, 8]),
    )
        .prop_map(
            |(proto, src, dst, sport, dport, flags, ct, mark, ct_mark, iif, oif, itype)| {
                let src: Option<IpAddr> = src.parse().ok();
                let v6 = src.is_some_and(|a| a.is_ipv6());
                let dst: Option<IpAddr> = if v6 {
                    "2001:db8::2".parse().ok()
                } else {
                    dst.parse().ok()
                };
                TracePacket {
                    proto,
                    src,
                    dst,
                    sport,
                    dport,
                    tcp_flags: flags,
                    ct,
                    mark,
                    ct_mark,
                    iif: Some(iif.to_string()),
                    oif: Some(oif.to_string()),
                    icmp_type: itype,
                    ..TracePacket::default()
                }
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1024, ..ProptestConfig::default() })]

    #[test]
    fn compiled_policy_matches_linear_reference(
        base in prop::collection::vec(rule_strategy(), 0..6),
        base2 in prop::collection::vec(rule_strategy(), 0..3),
        c1 in prop::collection::vec(rule_strategy(), 0..5),
        c2 in prop::collection::vec(rule_strategy(), 0..4),
        policy_drop in any::<bool>(),
        pkts in prop::collection::vec(packet_strategy(), 1..24),
    ) {
        let text = render_ruleset(&base, &base2, &c1, &c2, policy_drop);
        let rs = sluice_ruleset::parse_nft_str("gen.nft", &text);
        prop_assert!(rs.is_ok(), "generated rule set does not parse:\n{text}\n{:?}", rs.err());
        let rs = rs.unwrap_or_default();
        let pol = CompiledPolicy::compile(&rs, &Interfaces::from_ruleset(&rs));
        prop_assert!(pol.is_ok(), "does not lower:\n{text}\n{:?}", pol.err());
        let Ok(pol) = pol else { return Ok(()) };
        for p in &pkts {
            // `trace` runs both evaluators and asserts equality (debug builds);
            // `mismatch` is the release-build report of the same check.
            let t = pol.trace(p);
            prop_assert!(t.mismatch.is_none(), "{text}\n{p:?}\n{t}");
        }
    }
}
