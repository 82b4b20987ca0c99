//! Incremental updates (`add rule`, `insert rule`, `delete rule`, element
//! changes) give exactly the policy a full compile of the same rule set
//! gives, and a refused command changes nothing.

use std::net::Ipv4Addr;

use proptest::prelude::*;
use sluice_policy::{CompiledPolicy, Interfaces, TracePacket, TraceVerdict, UpdateFailure};

const BASE: &str = "table inet filter {\n\
  set blocked { type ipv4_addr; flags interval; elements = { 192.0.2.0/24 } }\n\
  map ports { type inet_service : verdict; elements = { 22 : accept, 23 : drop } }\n\
  chain forward { type filter hook forward priority 0; policy accept;\n\
    ip saddr @blocked drop\n\
  }\n\
  chain web { tcp dport 80 accept\n tcp dport 8080 drop }\n\
}\n\
table ip nat {\n\
  chain post { type nat hook postrouting priority 100; policy accept; }\n\
}\n";

fn compile(text: &str) -> CompiledPolicy {
    let rs = sluice_ruleset::parse_nft_str("t.nft", text).unwrap_or_else(|d| panic!("{d}"));
    CompiledPolicy::compile(&rs, &Interfaces::from_ruleset(&rs)).unwrap_or_else(|e| panic!("{e}"))
}

fn apply(p: &CompiledPolicy, cmd: &str) -> CompiledPolicy {
    match p.apply_text("ctl", cmd) {
        Ok((n, _)) => n,
        Err(e) => panic!("{cmd}: {e}"),
    }
}

fn pkt(spec: &str) -> TracePacket {
    TracePacket::parse(spec).unwrap_or_else(|e| panic!("{spec}: {e}"))
}

fn verdict(p: &CompiledPolicy, spec: &str) -> TraceVerdict {
    let t = p.trace(&pkt(spec));
    assert_eq!(t.mismatch, None, "compiled and linear disagree");
    t.verdict
}

/// The rules of `chain` in order, as (handle, text).
fn chain_rules(p: &CompiledPolicy, chain: &str) -> Vec<(u64, String)> {
    p.list_rules()
        .into_iter()
        .filter(|r| r.chain == chain)
        .map(|r| (r.handle, r.text))
        .collect()
}

#[test]
fn add_insert_positions_and_delete_by_handle() {
    let p = compile(BASE);
    let base = chain_rules(&p, "inet filter forward");
    assert_eq!(base.len(), 1);
    let h0 = base[0].0;
    let p = apply(&p, "add rule inet filter forward tcp dport 22 drop");
    let p = apply(&p, "insert rule inet filter forward tcp dport 25 drop");
    let p = apply(
        &p,
        &format!("add rule inet filter forward position {h0} tcp dport 26 drop"),
    );
    let p = apply(
        &p,
        &format!("insert rule inet filter forward position {h0} tcp dport 27 drop"),
    );
    let p = apply(&p, "add rule inet filter forward index 0 tcp dport 28 drop");
    let texts: Vec<String> = chain_rules(&p, "inet filter forward")
        .into_iter()
        .map(|r| r.1)
        .collect();
    assert_eq!(
        texts,
        [
            "tcp dport 25 drop",
            "tcp dport 28 drop",
            "tcp dport 27 drop",
            "ip saddr @blocked drop",
            "tcp dport 26 drop",
            "tcp dport 22 drop",
        ]
    );
    let fwd = "tcp 10.0.0.2:1000 > 198.51.100.1:22 ct new";
    assert_eq!(verdict(&p, fwd), TraceVerdict::Drop);
    let h22 = chain_rules(&p, "inet filter forward")
        .into_iter()
        .find(|r| r.1 == "tcp dport 22 drop")
        .map(|r| r.0)
        .unwrap_or_else(|| panic!("rule missing"));
    let q = apply(&p, &format!("delete rule inet filter forward handle {h22}"));
    assert_eq!(verdict(&q, fwd), TraceVerdict::Accept);
    // The old generation is untouched.
    assert_eq!(verdict(&p, fwd), TraceVerdict::Drop);
    assert_eq!(q.ast_rule_count(), p.ast_rule_count() - 1);
}

#[test]
fn element_changes_relower_the_rules_that_read_the_set() {
    let p = compile(BASE);
    let from = "tcp 198.51.100.9:1000 > 203.0.113.1:443 ct new";
    assert_eq!(verdict(&p, from), TraceVerdict::Accept);
    let q = apply(&p, "add element inet filter blocked { 198.51.100.0/28 }");
    assert_eq!(verdict(&q, from), TraceVerdict::Drop);
    let r = apply(&q, "delete element inet filter blocked { 198.51.100.0/28 }");
    assert_eq!(verdict(&r, from), TraceVerdict::Accept);
    // A verdict map.
    let p = apply(&p, "add rule inet filter forward tcp dport vmap @ports");
    let telnet = "tcp 10.0.0.2:1000 > 203.0.113.1:24 ct new";
    assert_eq!(verdict(&p, telnet), TraceVerdict::Accept);
    let p = apply(&p, "add element inet filter ports { 24 : drop }");
    assert_eq!(verdict(&p, telnet), TraceVerdict::Drop);
}

#[test]
fn refused_commands_name_the_problem_and_change_nothing() {
    let p = compile(BASE);
    let err = |cmd: &str| match p.apply_text("ctl", cmd) {
        Ok(_) => panic!("{cmd}: accepted"),
        Err(e) => e.to_string(),
    };
    assert!(err("delete rule inet filter forward handle 999").contains("handle 999"));
    assert!(err("add rule inet filter forward position 999 accept").contains("handle 999"));
    assert!(err("add rule inet filter forward index 5 accept").contains("index 5"));
    assert!(err("add rule inet filter web jump web").contains("loop"));
    assert!(err("add rule inet filter forward tcp dport 1 masquerade").contains("nat"));
    assert!(err("delete element inet filter blocked { 10.9.9.9 }").contains("not in set"));
    assert!(err("add rule inet filter forward ip saddr @nosuch drop").contains("nosuch"));
    let e = p.apply_text("ctl", "add rule inet filter forwad accept");
    assert!(matches!(e, Err(UpdateFailure::Parse(_))));
    // Nothing changed.
    assert_eq!(p.list_rules().len(), compile(BASE).list_rules().len());
    // A rule with a new SNAT address appends a pool (the others keep their
    // numbers); the gateway checks that its NAT can take it.
    let before = p.nat_config().pools.clone();
    let s = apply(&p, "add rule ip nat post snat to 198.51.100.7");
    let pools = &s.nat_config().pools;
    assert_eq!(pools.len(), before.len() + 1);
    assert_eq!(&pools[..before.len()], &before[..]);
    assert_eq!(
        pools[before.len()].addrs,
        vec![Ipv4Addr::new(198, 51, 100, 7)]
    );
    assert_eq!(
        p.nat_config().pools,
        before,
        "the old generation keeps its pools"
    );
    // A jump is fine when it makes no loop; masquerade in a nat chain too.
    let q = apply(&p, "add rule inet filter forward tcp dport 80 jump web");
    let q = apply(&q, "add rule ip nat post oifname \"eth1\" masquerade");
    assert_eq!(
        verdict(&q, "tcp 10.0.0.2:1000 > 203.0.113.1:8080 ct new"),
        TraceVerdict::Accept
    );
    assert_eq!(
        verdict(&q, "tcp 10.0.0.2:1000 > 203.0.113.1:80 ct new"),
        TraceVerdict::Accept
    );
}

#[derive(Debug, Clone)]
enum Op {
    Add {
        front: bool,
        anchor: Option<usize>,
        port: u16,
        verdict: bool,
    },
    Delete(usize),
    Elem {
        add: bool,
        host: u8,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (any::<bool>(), proptest::option::of(0usize..64), 1u16..12, any::<bool>())
            .prop_map(|(front, anchor, port, verdict)| Op::Add { front, anchor, port, verdict }),
        2 => (0usize..64).prop_map(Op::Delete),
        1 => (any::<bool>(), 0u8..8).prop_map(|(add, host)| Op::Elem { add, host }),
    ]
}

/// The same rule set as text: the base with the chain's current rules and
/// the set's current elements.
fn as_text(rules: &[(u64, String)], elems: &[u8]) -> String {
    let body: String = rules.iter().map(|(_, t)| format!("    {t}\n")).collect();
    let el: Vec<String> = elems.iter().map(|h| format!("10.1.0.{h}")).collect();
    let set = if el.is_empty() {
        String::new()
    } else {
        format!("; elements = {{ {} }}", el.join(", "))
    };
    format!(
        "table inet filter {{\n  set hosts {{ type ipv4_addr{set} }}\n\
         chain forward {{ type filter hook forward priority 0; policy accept;\n{body}  }}\n}}\n"
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Random command sequences: after every command, the incremental
    /// generation and a full compile of the equivalent text agree on every
    /// probe packet (verdict, deciding rule text and mark).
    #[test]
    fn incremental_equals_full_compile(ops in proptest::collection::vec(op(), 1..40)) {
        let mut p = compile(&as_text(&[], &[]));
        let mut elems: Vec<u8> = Vec::new();
        for op in ops {
            let rules = chain_rules(&p, "inet filter forward");
            let cmd = match op {
                Op::Add { front, anchor, port, verdict } => {
                    let v = if verdict { "drop" } else { "meta mark set 7 accept" };
                    let m = if port % 3 == 0 { format!("ip saddr @hosts tcp dport {port}") }
                            else { format!("tcp dport {}-{}", port, port + 2) };
                    let verb = if front { "insert" } else { "add" };
                    match anchor.and_then(|a| rules.get(a % rules.len().max(1))) {
                        Some((h, _)) => format!("{verb} rule inet filter forward position {h} {m} {v}"),
                        None => format!("{verb} rule inet filter forward {m} {v}"),
                    }
                }
                Op::Delete(i) => match rules.get(i % rules.len().max(1)) {
                    Some((h, _)) => format!("delete rule inet filter forward handle {h}"),
                    None => continue,
                },
                Op::Elem { add, host } => {
                    if add == elems.contains(&host) { continue; }
                    if add { elems.push(host) } else { elems.retain(|h| *h != host) }
                    format!("{} element inet filter hosts {{ 10.1.0.{host} }}",
                            if add { "add" } else { "delete" })
                }
            };
            p = apply(&p, &cmd);
            let full = compile(&as_text(&chain_rules(&p, "inet filter forward"), &elems));
            for host in 0..8u8 {
                for port in 0..16u16 {
                    let spec = format!("tcp 10.1.0.{host}:999 > 203.0.113.1:{port} ct new");
                    let (a, b) = (p.trace(&pkt(&spec)), full.trace(&pkt(&spec)));
                    prop_assert_eq!(a.mismatch.clone(), None);
                    prop_assert_eq!(a.verdict, b.verdict, "{} after {}", spec, cmd);
                    prop_assert_eq!(a.mark, b.mark, "{} after {}", spec, cmd);
                    let matched = |t: &sluice_policy::Trace| -> Vec<String> {
                        t.hooks.iter().flat_map(|h| h.chains.iter())
                            .flat_map(|c| c.rules.iter().map(|r| r.text.clone()))
                            .collect()
                    };
                    prop_assert_eq!(matched(&a), matched(&b), "{} after {}", spec, cmd);
                }
            }
        }
    }
}
