//! Public-API behaviour: error collection, hooks for the compiler, serde form.

use sluice_ruleset::*;
use std::path::PathBuf;

#[test]
fn reports_all_errors_in_a_file_not_only_the_first() {
    let text = "table ip t {\n  chain c {\n    tcp dport 99999 accept\n    ip saddr 1.2.3.4/40 drop\n    jump nowhere\n    bogus stuff\n    ct state nwe accept\n  }\n}\n";
    let d = parse_nft_str("multi.nft", text).expect_err("must fail");
    let lines: Vec<u32> = d.iter().map(|x| x.line).collect();
    assert_eq!(lines, vec![3, 4, 5, 6, 7], "{d}");
    let shown = d.to_string();
    assert!(
        shown.contains(
            "multi.nft:7:14-16: Error: invalid ct_state value 'nwe'; did you mean \"new\"?"
        ),
        "{shown}"
    );
    assert!(shown.contains("5 errors"));
}

#[test]
fn iptables_reports_all_errors() {
    let text = "*filter\n:INPUT DROP [0:0]\n-A INPUT -p tcp --dport 99999 -j ACCEPT\n-A INPUT -j NOPE\n-A INPUT --frob -j DROP\nCOMMIT\n";
    let d = parse_iptables_restore_str("x.rules", text, None).expect_err("must fail");
    assert_eq!(d.len(), 3, "{d}");
}

#[test]
fn base_chains_in_hook_priority_order_and_rule_locations() {
    let text = "table ip a {\n chain late { type filter hook input priority 10; }\n chain pre { type nat hook prerouting priority dstnat; }\n}\ntable ip b {\n chain early { type filter hook input priority raw; policy drop;\n  tcp dport 22 accept\n }\n}\n";
    let r = parse_nft_str("order.nft", text).expect("parses");
    let order: Vec<&str> = r
        .base_chains()
        .iter()
        .map(|b| b.chain.name.as_str())
        .collect();
    assert_eq!(order, vec!["pre", "early", "late"]);
    let input = r.hook_chains(Hook::Input);
    assert_eq!(input.len(), 2);
    let rule = r
        .table(Family::Ip, "b")
        .and_then(|t| t.chain("early"))
        .and_then(|c| c.rules.first())
        .expect("rule");
    assert_eq!(r.rule_location(rule), "order.nft:7");
}

#[test]
fn defines_and_sets_resolve() {
    let text = "define ports = { 22, 80 }\ntable inet f {\n set s { type ipv4_addr; elements = { 10.0.0.1 } }\n chain c { tcp dport $ports ip saddr @s accept }\n}\n";
    let r = parse_nft_str("d.nft", text).expect("parses");
    assert_eq!(
        r.define("ports").map(|d| d.value.as_str()),
        Some("{ 22 , 80 }")
    );
    let t = r.table(Family::Inet, "f").expect("table");
    assert_eq!(t.resolve_set("s").map(<[Elem]>::len), Some(1));
}

#[test]
fn include_loops_are_detected_with_in_memory_files() {
    let mut fs = MemLoader::default();
    fs.files
        .insert(PathBuf::from("/etc/a.nft"), "include \"b.nft\"\n".into());
    fs.files
        .insert(PathBuf::from("/etc/b.nft"), "include \"a.nft\"\n".into());
    let d = parse_nft_with_loader(
        "/etc/a.nft",
        "include \"b.nft\"\n",
        Some(std::path::Path::new("/etc/a.nft")),
        &fs,
    )
    .expect_err("loop");
    assert!(
        d.to_string()
            .contains("include loop: /etc/a.nft -> /etc/b.nft -> /etc/a.nft"),
        "{d}"
    );
}

/// `include` with wildcards, as nft takes it: the matching files of the
/// directory in alphabetical order, names beginning with a dot left out,
/// none matching no error; wildcards in a directory are refused.
#[test]
fn glob_includes_take_the_matching_files_in_order() {
    let mut fs = MemLoader::default();
    let mut add = |p: &str, t: &str| {
        fs.files.insert(PathBuf::from(p), t.to_string());
    };
    add(
        "/etc/n/rules.d/20-web.nft",
        "add rule inet f input tcp dport 80 accept\n",
    );
    add(
        "/etc/n/rules.d/10-ssh.nft",
        "add rule inet f input tcp dport 22 accept\n",
    );
    add("/etc/n/rules.d/.30-hidden.nft", "this is not nft\n");
    add("/etc/n/rules.d/README", "neither is this\n");
    let main = "table inet f { chain input { type filter hook input priority 0; } }\n\
                include \"rules.d/*.nft\"\n\
                include \"empty.d/*.nft\"\n\
                include \"rules.d/[12]?-*.nft\"\n";
    let r = parse_nft_with_loader(
        "/etc/n/main.nft",
        main,
        Some(std::path::Path::new("/etc/n/main.nft")),
        &fs,
    )
    .unwrap_or_else(|d| panic!("{d}"));
    let printed = sluice_ruleset::print_ruleset(&r);
    let ports: Vec<&str> = printed
        .lines()
        .filter_map(|l| l.trim().strip_prefix("tcp dport "))
        .collect();
    // `*.nft` gives 10 then 20 (not the hidden file, nor README),
    // `[12]?-*.nft` the same two again.
    assert_eq!(
        ports,
        ["22 accept", "80 accept", "22 accept", "80 accept"],
        "{printed}"
    );
    let d = parse_nft_with_loader(
        "/etc/n/main.nft",
        "include \"*.d/*.nft\"\n",
        Some(std::path::Path::new("/etc/n/main.nft")),
        &fs,
    )
    .expect_err("wildcard in a directory");
    assert!(
        d.to_string()
            .contains("wildcards are supported in the file name only"),
        "{d}"
    );
}

#[test]
fn flush_ruleset_discards_earlier_tables() {
    let r = parse_nft_str(
        "f.nft",
        "table ip old { }\nflush ruleset\ntable ip new { }\n",
    )
    .expect("parses");
    assert_eq!(r.tables.len(), 1);
    assert_eq!(r.tables.first().map(|t| t.name.as_str()), Some("new"));
}

#[test]
fn ast_serialises_to_json() {
    let r = parse_nft_str(
        "j.nft",
        "table ip t { chain c { ip saddr 10.0.0.0/8 tcp dport 22 counter accept } }\n",
    )
    .expect("parses");
    let j = serde_json::to_string(&r).expect("json");
    assert!(j.contains("\"left\":[\"ip_saddr\"]"), "{j}");
    assert!(j.contains("\"verdict\":\"accept\""), "{j}");
    assert!(j.contains("\"line\":1"), "{j}");
}

#[test]
fn iptables_and_nft_lower_to_the_same_ast_text() {
    let ipt =
        "*filter\n:INPUT DROP [0:0]\n-A INPUT -p tcp --dport 22 -s 10.0.0.0/8 -j ACCEPT\nCOMMIT\n";
    let nft = "table ip filter {\n chain INPUT { type filter hook input priority 0; policy drop;\n  tcp dport 22 ip saddr 10.0.0.0/8 accept\n }\n}\n";
    let a = parse_iptables_restore_str("a.rules", ipt, None)
        .expect("ipt")
        .to_nft();
    let b = parse_nft_str("b.nft", nft).expect("nft").to_nft();
    assert_eq!(a, b);
}

/// Regression: `ipv6-icmp` (the /etc/protocols name of protocol 58) was split
/// at its hyphen into the range `ipv6-icmp` = 41..1 and refused with "range
/// start is greater than range end". Found by the kernel oracle test.
#[test]
fn regression_ipv6_icmp_protocol_alias_is_not_a_range() {
    let text = "table inet f {\n  chain input {\n    type filter hook input priority 0; policy drop;\n    meta l4proto { icmp, ipv6-icmp } accept\n  }\n}\n";
    let rs =
        sluice_ruleset::parse_nft_str("alias.nft", text).expect("ipv6-icmp is a protocol name");
    let printed = sluice_ruleset::print_ruleset(&rs);
    assert!(
        printed.contains("meta l4proto { icmp, icmpv6 } accept"),
        "{printed}"
    );
}

/// Found by the iptables_parse fuzz target (2026-11-24): ip6tables' `-s
/// 2001:db8::/32` was read as the single address 2001:db8:: (the IPv4
/// host-prefix shortcut applied to IPv6), and the nft lexer split an
/// address ending in `::` (`2001:db8::`, `::`) before its last colon.
#[test]
fn regression_ipv6_slash_32_is_a_network_and_trailing_double_colons_lex() {
    let rules = "*filter\n:INPUT DROP [0:0]\n-A INPUT -s 2001:db8::/32 -j DROP\n\
                 -A INPUT -s 2001:db8::1/128 -j DROP\nCOMMIT\n";
    let rs = sluice_ruleset::parse_ip6tables_restore_str("r.rules6", rules, None)
        .expect("valid ip6tables-save");
    let printed = sluice_ruleset::print_ruleset(&rs);
    assert!(
        printed.contains("ip6 saddr 2001:db8::/32 drop"),
        "{printed}"
    );
    assert!(printed.contains("ip6 saddr 2001:db8::1 drop"), "{printed}");
    let text = "table ip6 t {\n chain c {\n ip6 saddr 2001:db8:: drop\n \
                ip6 daddr { ::, ::1 } drop\n ip6 saddr ::/0 accept\n }\n}\n";
    let rs = sluice_ruleset::parse_nft_str("t.nft", text).expect("addresses ending in ::");
    let printed = sluice_ruleset::print_ruleset(&rs);
    for want in [
        "ip6 saddr 2001:db8:: drop",
        "ip6 daddr { ::, ::1 } drop",
        "ip6 saddr ::/0 accept",
    ] {
        assert!(printed.contains(want), "{want}: {printed}");
    }
}

/// `tcp option maxseg size set` (nft) and `-j TCPMSS` (iptables) give one
/// statement, printed canonically and parsed back to the same text; bad
/// forms get specific errors.
#[test]
fn tcp_mss_clamping_in_both_syntaxes() {
    let nft = "table ip mangle {\n chain FORWARD { type filter hook forward priority -150; policy accept;\n  tcp flags syn tcp option maxseg size set rt mtu\n  tcp flags syn tcp option maxseg size set 1400\n }\n}\n";
    let rs = parse_nft_str("mss.nft", nft).expect("nft");
    let printed = print_ruleset(&rs);
    assert!(
        printed.contains("tcp option maxseg size set rt mtu")
            && printed.contains("tcp option maxseg size set 1400"),
        "{printed}"
    );
    let again = parse_nft_str("again.nft", &printed).expect("printed form parses");
    assert_eq!(print_ruleset(&again), printed, "fixed point");

    let ipt = "*mangle\n:FORWARD ACCEPT [0:0]\n-A FORWARD -p tcp --tcp-flags SYN,RST SYN -j TCPMSS --clamp-mss-to-pmtu\n-A FORWARD -p tcp --tcp-flags SYN,RST SYN -j TCPMSS --set-mss 1400\nCOMMIT\n";
    let rs = parse_iptables_restore_str("mss.rules", ipt, None).expect("iptables");
    let text = rs.to_nft();
    assert!(
        text.contains("tcp option maxseg size set rt mtu")
            && text.contains("tcp option maxseg size set 1400"),
        "{text}"
    );

    for (bad, want) in [
        (
            "tcp option maxseg size set 70000",
            "invalid MSS '70000': expected 0-65535 or 'rt mtu'",
        ),
        (
            "tcp option maxseg size 1400 accept",
            "matching on TCP options is not supported",
        ),
        (
            "tcp option window size set 5",
            "unsupported TCP option 'window'",
        ),
    ] {
        let text = format!(
            "table ip t {{\n chain c {{ type filter hook forward priority 0;\n  {bad}\n }}\n}}\n"
        );
        let d = parse_nft_str("bad.nft", &text).expect_err(bad).to_string();
        assert!(d.contains(want), "{bad}: {d}");
    }
    let d = parse_nft_str(
        "pre.nft",
        "table ip t {\n chain c { type filter hook prerouting priority 0;\n  tcp option maxseg size set rt mtu\n }\n}\n",
    )
    .expect_err("rt mtu in prerouting")
    .to_string();
    assert!(d.contains("'rt mtu' needs a route"), "{d}");
    let d = parse_iptables_restore_str(
        "x.rules",
        "*mangle\n:FORWARD ACCEPT [0:0]\n-A FORWARD -p tcp -j TCPMSS\nCOMMIT\n",
        None,
    )
    .expect_err("TCPMSS without an option")
    .to_string();
    assert!(d.contains("TCPMSS needs exactly one of"), "{d}");
}

/// `fib daddr type` / `fib saddr type` (nft) and `-m addrtype` (iptables)
/// are one match; other fib forms get a specific error.
#[test]
fn fib_address_types_in_both_syntaxes() {
    let ipt = "*nat\n:PREROUTING ACCEPT [0:0]\n:DOCKER - [0:0]\n-A PREROUTING -m addrtype --dst-type LOCAL -j DOCKER\n-A PREROUTING -m addrtype ! --src-type LOCAL,BROADCAST -j RETURN\nCOMMIT\n";
    let text = parse_iptables_restore_str("d.rules", ipt, None)
        .expect("iptables")
        .to_nft();
    assert!(text.contains("fib daddr type local jump DOCKER"), "{text}");
    assert!(
        text.contains("fib saddr type != { local, broadcast } return"),
        "{text}"
    );
    let again = parse_nft_str("again.nft", &text).expect("printed form parses");
    assert_eq!(again.to_nft(), text, "fixed point");
    let d = parse_iptables_restore_str(
        "x.rules",
        "*nat\n:PREROUTING ACCEPT [0:0]\n-A PREROUTING -m addrtype --dst-type LOCALL -j ACCEPT\nCOMMIT\n",
        None,
    )
    .expect_err("bad type")
    .to_string();
    assert!(
        d.contains("unknown address type 'LOCALL'") && d.contains("did you mean \"LOCAL\"?"),
        "{d}"
    );
    for (bad, want) in [
        (
            "fib daddr . iif type local drop",
            "unsupported fib form: 'fib daddr type', 'fib saddr type' and",
        ),
        ("fib dst type local drop", "unknown fib field 'dst'"),
    ] {
        let text = format!(
            "table inet t {{\n chain c {{ type filter hook prerouting priority 0;\n  {bad}\n }}\n}}\n"
        );
        let d = parse_nft_str("bad.nft", &text).expect_err(bad).to_string();
        assert!(d.contains(want), "{bad}: {d}");
    }
}

/// `log flags` in its forms, printed canonically and parsed back.
#[test]
fn log_flags_parse_and_print() {
    for (input, want) in [
        (
            "log prefix \"x: \" level info flags all",
            "log prefix \"x: \" level info flags all",
        ),
        (
            "log flags tcp sequence,options",
            "log flags tcp sequence,options",
        ),
        (
            "log flags ip options flags ether",
            "log flags ip options flags ether",
        ),
        ("log flags skuid", "log flags skuid"),
        (
            "log flags tcp sequence,options flags ip options flags skuid flags ether",
            "log flags all",
        ),
    ] {
        let text = format!(
            "table inet t {{\n chain c {{ type filter hook input priority 0;\n  {input}\n }}\n}}\n"
        );
        let printed = print_ruleset(&parse_nft_str("l.nft", &text).expect(input));
        assert!(printed.contains(want), "{input}: {printed}");
        let again = parse_nft_str("again.nft", &printed).expect("printed form parses");
        assert_eq!(print_ruleset(&again), printed, "fixed point");
    }
    let d = parse_nft_str(
        "bad.nft",
        "table inet t {\n chain c {\n  log flags tcp seq\n }\n}\n",
    )
    .expect_err("bad flag")
    .to_string();
    assert!(d.contains("unknown tcp log flag 'seq'"), "{d}");
}

/// Connmark: `meta mark set ct mark` / `ct mark set meta mark` (nft) and
/// `-j CONNMARK --restore-mark / --save-mark / --set-mark` (iptables).
#[test]
fn connmark_save_and_restore_in_both_syntaxes() {
    let nft = "table inet t {\n chain c { type filter hook prerouting priority mangle;\n  meta mark set ct mark\n  ct mark set meta mark\n  ct mark set mark\n  mark set ct mark\n }\n}\n";
    let printed = print_ruleset(&parse_nft_str("c.nft", nft).expect("nft"));
    assert_eq!(
        printed.matches("meta mark set ct mark").count(),
        2,
        "{printed}"
    );
    assert_eq!(
        printed.matches("ct mark set meta mark").count(),
        2,
        "{printed}"
    );
    let again = parse_nft_str("again.nft", &printed).expect("printed form parses");
    assert_eq!(print_ruleset(&again), printed, "fixed point");
    let ipt = "*mangle\n:PREROUTING ACCEPT [0:0]\n-A PREROUTING -j CONNMARK --restore-mark\n-A PREROUTING -m mark --mark 0 -j MARK --set-mark 7\n-A PREROUTING -j CONNMARK --save-mark\n-A PREROUTING -j CONNMARK --set-mark 9\nCOMMIT\n";
    let text = parse_iptables_restore_str("c.rules", ipt, None)
        .expect("iptables")
        .to_nft();
    for want in [
        "meta mark set ct mark",
        "ct mark set meta mark",
        "ct mark set 0x00000009",
    ] {
        assert!(text.contains(want), "{want}: {text}");
    }
    let d = parse_iptables_restore_str(
        "x.rules",
        "*mangle\n:PREROUTING ACCEPT [0:0]\n-A PREROUTING -j CONNMARK --save-mark --restore-mark\nCOMMIT\n",
        None,
    )
    .expect_err("both")
    .to_string();
    assert!(d.contains("CONNMARK needs exactly one of"), "{d}");
}

/// `ether saddr` / `ether daddr` (nft) and `-m mac --mac-source` (iptables).
#[test]
fn ether_addresses_in_both_syntaxes() {
    let nft = "table inet t {\n set macs { type ether_addr; elements = { 02:00:00:00:BE:EF, 02:00:00:00:be:f0 } }\n chain c { type filter hook forward priority 0;\n  ether saddr @macs drop\n  ether daddr != 00:11:22:33:44:55 accept\n }\n}\n";
    let printed = print_ruleset(&parse_nft_str("e.nft", nft).expect("nft"));
    for want in [
        "02:00:00:00:be:ef, 02:00:00:00:be:f0",
        "ether saddr @macs drop",
        "ether daddr != 00:11:22:33:44:55 accept",
    ] {
        assert!(printed.contains(want), "{want}: {printed}");
    }
    let again = parse_nft_str("again.nft", &printed).expect("printed form parses");
    assert_eq!(print_ruleset(&again), printed, "fixed point");
    let text = parse_iptables_restore_str(
        "m.rules",
        "*filter\n:FORWARD ACCEPT [0:0]\n-A FORWARD -m mac ! --mac-source 02:00:00:00:be:ef -j DROP\nCOMMIT\n",
        None,
    )
    .expect("iptables")
    .to_nft();
    assert!(
        text.contains("ether saddr != 02:00:00:00:be:ef drop"),
        "{text}"
    );
    let d = parse_nft_str(
        "bad.nft",
        "table inet t {\n chain c {\n  ether saddr 02:00:00:be:ef drop\n }\n}\n",
    )
    .expect_err("5 bytes")
    .to_string();
    assert!(d.contains("invalid ether_addr '02:00:00:be:ef'"), "{d}");
}

#[test]
fn ct_direction_parses_and_prints() {
    let nft = "table inet t {\n chain c { type filter hook forward priority 0;\n  ct direction reply ct state established accept\n  ct direction != original drop\n }\n}\n";
    let printed = print_ruleset(&parse_nft_str("d.nft", nft).expect("nft"));
    assert!(
        printed.contains("ct direction reply ct state established accept"),
        "{printed}"
    );
    assert!(
        printed.contains("ct direction != original drop"),
        "{printed}"
    );
    let again = parse_nft_str("again.nft", &printed).expect("printed form parses");
    assert_eq!(print_ruleset(&again), printed, "fixed point");
}

/// Statements nft has and Sluice does not get a reason, not a guess.
#[test]
fn known_but_unsupported_statements_say_why() {
    let text = "table inet t {\n chain c {\n  synproxy mss 1460\n  ip daddr 10.0.0.1 dup to 10.0.0.2\n  queue num 0\n }\n}\n";
    let d = parse_nft_str("u.nft", text)
        .expect_err("unsupported")
        .to_string();
    for want in [
        "u.nft:3:3-10: Error: 'synproxy' is not supported: SYN proxying is not implemented",
        "u.nft:4:21-23: Error: 'dup' is not supported",
        "u.nft:5:3-7: Error: 'queue' is not supported",
        "3 errors",
    ] {
        assert!(d.contains(want), "{want}: {d}");
    }
}
