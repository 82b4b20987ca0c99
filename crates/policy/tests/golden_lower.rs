//! Every ruleset under `crates/ruleset/tests/golden/` lowers and compiles,
//! except those listed in `EXPECTED_UNSUPPORTED` with their exact errors
//! (none today).

use std::fs;
use std::path::{Path, PathBuf};

use sluice_policy::{CompiledPolicy, Interfaces};
use sluice_ruleset::{parse_iptables_restore_str, parse_nft_str, Ruleset};

const GOLDEN: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../ruleset/tests/golden");

/// (file name, expected lowering errors: "LINE:COL: message").
const EXPECTED_UNSUPPORTED: &[(&str, &[&str])] = &[];

fn inputs() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = fs::read_dir(GOLDEN)
        .map(|d| d.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    v.retain(|p| {
        matches!(
            p.extension().and_then(|e| e.to_str()),
            Some("nft" | "rules")
        )
    });
    v.sort();
    v
}

fn parse(path: &Path) -> Ruleset {
    let name = path.to_string_lossy().to_string();
    let text = fs::read_to_string(path).unwrap_or_default();
    let r = if path.extension().and_then(|e| e.to_str()) == Some("rules") {
        let ipset = fs::read_to_string(path.with_extension("ipset")).ok();
        parse_iptables_restore_str(&name, &text, ipset.as_deref())
    } else {
        parse_nft_str(&name, &text)
    };
    r.unwrap_or_else(|d| panic!("{name} does not parse:\n{d}"))
}

#[test]
fn every_golden_ruleset_lowers_or_fails_as_expected() {
    let files = inputs();
    assert!(files.len() >= 8, "golden inputs missing");
    let mut failures = Vec::new();
    for p in files {
        let rs = parse(&p);
        let fname = p.file_name().and_then(|f| f.to_str()).unwrap_or_default();
        let expected: Vec<&str> = EXPECTED_UNSUPPORTED
            .iter()
            .find(|(f, _)| *f == fname)
            .map(|(_, e)| e.to_vec())
            .unwrap_or_default();
        let got: Vec<String> = match CompiledPolicy::compile(&rs, &Interfaces::from_ruleset(&rs)) {
            Ok(pol) => {
                assert!(!pol.program().chains.is_empty(), "{fname}: no chains");
                Vec::new()
            }
            Err(e) => e
                .errors
                .iter()
                .map(|e| format!("{}:{}: {}", e.line, e.col, e.message))
                .collect(),
        };
        if got != expected {
            failures.push(format!("{fname}: expected {expected:?}, got {got:?}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// router_nat compiles, and its NAT rules produce the expected table and
/// pools.
#[test]
fn router_nat_compiles_with_nat_table() {
    let path = Path::new(GOLDEN).join("router_nat.nft");
    let text = fs::read_to_string(&path).unwrap_or_default();
    let rs = parse_nft_str(&path.to_string_lossy(), &text).unwrap_or_else(|d| panic!("{d}"));
    let pol = CompiledPolicy::compile(&rs, &Interfaces::from_ruleset(&rs))
        .unwrap_or_else(|e| panic!("{e}"));
    // dnat to web server, two port-forward map entries, masquerade, snat.
    assert_eq!(pol.nat_actions().len(), 5, "{:?}", pol.nat_actions());
    assert_eq!(pol.nat_config().pools.len(), 1);
    use sluice_engine::{Hook, Policy};
    assert!(pol.has_nat(Hook::Prerouting));
    assert!(pol.has_nat(Hook::Postrouting));
    assert!(!pol.has_nat(Hook::Forward));
}
