//! CLI tests for `sluice check`, `sluice ruleset print` and `sluice trace`.
//! Paths are relative to the crate directory so outputs are exact.

use std::path::PathBuf;
use std::process::{Command, Output};

fn sluice(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_sluice"))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run sluice: {e}"))
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn tmp(name: &str, contents: &str) -> PathBuf {
    let p = std::env::temp_dir().join(format!("sluice-cli-{}-{name}", std::process::id()));
    std::fs::write(&p, contents).unwrap_or_else(|e| panic!("write {}: {e}", p.display()));
    p
}

#[test]
fn check_accepts_valid_rulesets_of_both_syntaxes() {
    for f in [
        "tests/data/trace.nft",
        "../ruleset/tests/golden/host_firewall.nft",
        "../ruleset/tests/golden/seed001_appendix_b.rules",
    ] {
        let o = sluice(&["check", "-c", f]);
        assert_eq!(o.status.code(), Some(0), "{f}: {}", text(&o.stderr));
    }
    let o = sluice(&[
        "check",
        "-c",
        "../ruleset/tests/golden/seed001_appendix_c.rules",
        "--ipsets",
        "../ruleset/tests/golden/seed001_appendix_c.ipset",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    // Without --ipsets, the sibling FILE.ipset is used.
    let o = sluice(&[
        "check",
        "-c",
        "../ruleset/tests/golden/seed001_appendix_c.rules",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
}

#[test]
fn check_reports_every_parse_error_with_location_and_caret() {
    let o = sluice(&["check", "-c", "tests/data/bad.nft"]);
    assert_eq!(o.status.code(), Some(1));
    let err = text(&o.stderr);
    for want in [
        "tests/data/bad.nft:4:7-11: Error: unknown tcp field 'dprot'; did you mean \"dport\"?\n\t\ttcp dprot 22 accept\n\t\t    ^^^^^\n",
        "tests/data/bad.nft:5:12-21: Error: invalid ipv4_addr '10.0.0.300'",
        "tests/data/bad.nft:6:16-20: Error: unknown statement or expression 'acept'",
        "3 errors",
    ] {
        assert!(err.contains(want), "missing {want:?} in:\n{err}");
    }
}

#[test]
fn check_reports_every_unsupported_construct() {
    let o = sluice(&["check", "-c", "tests/data/unsupported.nft"]);
    assert_eq!(o.status.code(), Some(1));
    let err = text(&o.stderr);
    for want in [
        "tests/data/unsupported.nft:11:16-23: Error: 'redirect' cannot be lowered yet; NAT44 \
         translations are snat, dnat and masquerade\n\t\ttcp dport 80 redirect to :8080\n\
         \t\t             ^^^^^^^^\n",
        "tests/data/unsupported.nft:7:3-9: Error: '>' on interface names cannot be lowered",
        "2 errors",
    ] {
        assert!(err.contains(want), "missing {want:?} in:\n{err}");
    }
}

#[test]
fn check_missing_file_is_a_usage_error() {
    let o = sluice(&["check", "-c", "tests/data/no-such-file.nft"]);
    assert_eq!(o.status.code(), Some(2));
}

#[test]
fn print_is_a_fixed_point_and_translates_iptables() {
    for (f, fmt) in [
        ("tests/data/trace.nft", None),
        ("../ruleset/tests/golden/container_host.rules", None),
        (
            "../ruleset/tests/golden/seed001_appendix_b.rules",
            Some("iptables"),
        ),
    ] {
        let mut args = vec!["ruleset", "print", "-c", f];
        if let Some(fmt) = fmt {
            args.extend(["--format", fmt]);
        }
        let o = sluice(&args);
        assert_eq!(o.status.code(), Some(0), "{f}: {}", text(&o.stderr));
        let once = text(&o.stdout);
        assert!(once.contains("table "), "{f}: {once}");
        let p = tmp("print.nft", &once);
        let path = p.to_string_lossy().to_string();
        let o2 = sluice(&["ruleset", "print", "-c", &path, "--format", "nft"]);
        let _ = std::fs::remove_file(&p);
        assert_eq!(o2.status.code(), Some(0), "{f}: {}", text(&o2.stderr));
        assert_eq!(text(&o2.stdout), once, "{f}: not a fixed point");
    }
    let want = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../ruleset/tests/golden/container_host.rules.out"
    ))
    .unwrap_or_default();
    let o = sluice(&[
        "ruleset",
        "print",
        "-c",
        "../ruleset/tests/golden/container_host.rules",
    ]);
    assert_eq!(text(&o.stdout), want);
}

#[test]
fn trace_single_packet_shows_chains_rules_verdict_and_nat() {
    let o = sluice(&[
        "trace",
        "-c",
        "tests/data/trace.nft",
        "--packet",
        "tcp 10.0.0.2:1234 > 192.0.2.1:80 iif eth0 oif eth1 ct new flags S",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let want = "\
hook prerouting:
  chain ip nat pre (type nat, priority -100)
    policy accept
hook forward:
  chain inet fw forward (type filter, priority 0)
    rule tests/data/trace.nft:16: iifname \"eth0\" jump from_lan
    rule tests/data/trace.nft:22 [inet fw from_lan]: ip saddr @admins meta mark set 0x00000007 accept
    -> accept
hook postrouting:
  chain ip nat post (type nat, priority 100)
    rule tests/data/trace.nft:41: oifname \"eth1\" masquerade
    -> nat
verdict: accept
rule: tests/data/trace.nft:22
nat: masquerade (tests/data/trace.nft:41)
mark: 0x7
conntrack: the new connection starts with 120 s (default timers)
";
    assert_eq!(text(&o.stdout), want);
}

#[test]
fn trace_single_packet_return_falls_to_policy() {
    let o = sluice(&[
        "trace",
        "-c",
        "tests/data/trace.nft",
        "--packet",
        "udp 10.0.0.200:1234 > 192.0.2.1:53 iif eth0 oif eth1 ct new",
    ]);
    assert_eq!(o.status.code(), Some(0));
    let out = text(&o.stdout);
    assert!(out.contains("rule tests/data/trace.nft:23 [inet fw from_lan]: udp dport 53 return\n    policy drop\nverdict: drop\nrule: (chain policy)\n"), "{out}");
}

#[test]
fn trace_bad_packet_spec_is_a_usage_error() {
    let o = sluice(&[
        "trace",
        "-c",
        "tests/data/trace.nft",
        "--packet",
        "tcp 10.0.0.1 <> x",
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o.stderr).contains("SRC[:PORT] > DST[:PORT]"));
}

/// jump + named set + mark, return, drop in a jumped chain, concatenation,
/// reject, dnat, conntrack, IPv6, iif index, ICMP, and two bad lines.
#[test]
fn trace_batch_gives_one_exact_json_line_per_input_line() {
    let o = sluice(&[
        "trace",
        "-c",
        "tests/data/trace.nft",
        "--packets",
        "tests/data/packets.jsonl",
    ]);
    assert_eq!(o.status.code(), Some(1), "bad lines make the exit non-zero");
    let want = r#"{"verdict":"accept","rule":"tests/data/trace.nft:22","nat":{"type":"masquerade","addr":null,"port":null},"mark":7,"timeout":120}
{"verdict":"drop","rule":null,"nat":null,"mark":0}
{"verdict":"drop","rule":"tests/data/trace.nft:24","nat":null,"mark":0}
{"verdict":"accept","rule":"tests/data/trace.nft:17","nat":{"type":"masquerade","addr":null,"port":null},"mark":3,"timeout":120}
{"verdict":"reject","rule":"tests/data/trace.nft:18","nat":null,"mark":0}
{"verdict":"drop","rule":null,"nat":{"type":"dnat","addr":"10.0.0.5","port":80},"mark":0}
{"verdict":"accept","rule":"tests/data/trace.nft:15","nat":null,"mark":0}
{"verdict":"accept","rule":"tests/data/trace.nft:29","nat":null,"mark":0,"timeout":30}
{"verdict":"accept","rule":"tests/data/trace.nft:30","nat":null,"mark":0,"timeout":30}
{"verdict":"accept","rule":null,"nat":null,"mark":0,"timeout":30}
{"error":"line 11: unknown hook 'sideways' (prerouting, input, forward, output, postrouting)"}
{"error":"line 12: invalid JSON: expected ident at line 1 column 2"}
"#;
    assert_eq!(text(&o.stdout), want);
}

#[test]
fn trace_batch_of_good_lines_exits_zero_and_snat_reports_pool_address() {
    let rules = tmp(
        "snat.nft",
        "table ip nat {\n\tchain post {\n\t\ttype nat hook postrouting priority srcnat; policy accept;\n\
         \t\toifname \"wan\" snat to 198.51.100.1-198.51.100.4\n\
         \t\toifname \"wan2\" snat to 198.51.100.9:4000\n\t}\n}\n",
    );
    let pkts = tmp(
        "snat.jsonl",
        "{\"oif\":\"wan\",\"proto\":\"udp\",\"src\":\"10.0.0.1\",\"dst\":\"1.1.1.1\",\"dport\":53}\n\
         {\"oif\":\"wan2\",\"proto\":\"udp\",\"src\":\"10.0.0.1\",\"dst\":\"1.1.1.1\",\"dport\":53}\n\
         {\"oif\":\"wan\",\"proto\":\"udp\",\"src\":\"10.0.0.1\",\"dst\":\"1.1.1.1\",\"dport\":53,\"ct\":\"established\"}\n",
    );
    let (r, p) = (
        rules.to_string_lossy().to_string(),
        pkts.to_string_lossy().to_string(),
    );
    let o = sluice(&["trace", "-c", &r, "--packets", &p]);
    let _ = (std::fs::remove_file(&rules), std::fs::remove_file(&pkts));
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let out = text(&o.stdout);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 3);
    assert_eq!(
        lines.first().copied().unwrap_or_default(),
        r#"{"verdict":"accept","rule":null,"nat":{"type":"snat","addr":"198.51.100.1","port":null},"mark":0,"timeout":30}"#
    );
    assert_eq!(
        lines.get(1).copied().unwrap_or_default(),
        r#"{"verdict":"accept","rule":null,"nat":{"type":"snat","addr":"198.51.100.9","port":4000},"mark":0,"timeout":30}"#
    );
    assert_eq!(
        lines.get(2).copied().unwrap_or_default(),
        r#"{"verdict":"accept","rule":null,"nat":null,"mark":0}"#
    );
}
