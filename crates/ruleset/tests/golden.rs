//! Golden tests: every input under `tests/golden/` is parsed, printed, and compared
//! with its `.out` file; the printed form must be a fixed point of parse+print.
//! Inputs under `tests/golden/errors/` must fail with exactly the `.err` text.
//! Set `UPDATE_GOLDEN=1` to rewrite the expected files.

use sluice_ruleset::{
    parse_nft_str, parse_ruleset_file, rule_to_string, Diagnostics, InputFormat, PackedRule,
    Ruleset,
};
use std::fs;
use std::path::{Path, PathBuf};

fn inputs(dir: &str) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = fs::read_dir(dir)
        .map(|d| d.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    v.retain(|p| {
        matches!(
            p.extension().and_then(|e| e.to_str()),
            Some("nft" | "rules" | "rules6")
        )
    });
    v.sort();
    v
}

fn parse(path: &Path) -> Result<Ruleset, Diagnostics> {
    let name = path.to_string_lossy().to_string();
    let text = fs::read_to_string(path).unwrap_or_default();
    let format = match path.extension().and_then(|e| e.to_str()) {
        Some("rules") => InputFormat::Iptables,
        Some("rules6") => InputFormat::Ip6tables,
        _ => return parse_nft_str(&name, &text),
    };
    // The sibling `.ipset` file is read as `sluice check` reads it.
    parse_ruleset_file(path, Some(format), None).map(|(rs, _)| rs)
}

fn check(expected: &Path, actual: &str, failures: &mut Vec<String>) {
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        fs::write(expected, actual).unwrap_or_else(|e| panic!("write {}: {e}", expected.display()));
        return;
    }
    let want = fs::read_to_string(expected).unwrap_or_default();
    if want != actual {
        failures.push(format!(
            "{} differs:\n--- expected\n{want}\n--- actual\n{actual}",
            expected.display()
        ));
    }
}

fn with_ext(p: &Path, ext: &str) -> PathBuf {
    let mut s = p.as_os_str().to_owned();
    s.push(ext);
    PathBuf::from(s)
}

#[test]
fn golden_canonical_output_and_fixed_point() {
    let files = inputs("tests/golden");
    assert!(files.len() >= 8, "golden inputs missing");
    let mut failures = Vec::new();
    for p in files {
        let r = match parse(&p) {
            Ok(r) => r,
            Err(d) => {
                failures.push(format!("{} failed to parse:\n{d}", p.display()));
                continue;
            }
        };
        let printed = r.to_nft();
        check(&with_ext(&p, ".out"), &printed, &mut failures);
        match parse_nft_str("reprint.nft", &printed) {
            Ok(r2) => {
                if r2.to_nft() != printed {
                    failures.push(format!(
                        "{}: printed form is not a fixed point",
                        p.display()
                    ));
                }
            }
            Err(d) => failures.push(format!(
                "{}: printed form does not parse:\n{d}",
                p.display()
            )),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// A loaded policy keeps its rules packed ([`PackedRule`]) and lists them
/// from that form: every golden rule (both front ends) must come back
/// equal, spans included, and print the same.
#[test]
fn golden_rules_round_trip_through_their_packed_form() {
    let mut rules = 0;
    for p in inputs("tests/golden") {
        let Ok(r) = parse(&p) else { continue };
        for c in r.tables.iter().flat_map(|t| &t.chains) {
            for rule in &c.rules {
                let packed = PackedRule::pack(rule);
                assert_eq!(packed.unpack().as_ref(), Some(rule), "{}", p.display());
                assert_eq!(packed.text(), rule_to_string(rule));
                rules += 1;
            }
        }
    }
    assert!(rules >= 50, "only {rules} golden rules");
}

#[test]
fn golden_diagnostics() {
    let files = inputs("tests/golden/errors");
    assert!(files.len() >= 5, "error inputs missing");
    let mut failures = Vec::new();
    for p in files {
        match parse(&p) {
            Ok(_) => failures.push(format!("{} parsed but should fail", p.display())),
            Err(d) => check(&with_ext(&p, ".err"), &d.to_string(), &mut failures),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
