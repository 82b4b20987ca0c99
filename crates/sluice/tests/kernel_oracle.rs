//! The kernel as oracle (issue 3, item 6).
//!
//! Every ruleset of `tests/oracle/corpus/` is loaded into the kernel's
//! nftables (iptables-restore + ipset for `*.rules`) in fresh network
//! namespaces with real veth interfaces; every packet of `NAME.jsonl` is sent
//! through it as a real frame and the kernel's verdict, NAT translation, final
//! mark, conntrack state and, for a new forwarded connection, the seconds
//! its conntrack entry starts with are observed (`tests/oracle/oracle.py`). The same
//! packets go through `sluice trace -c FILE --packets NAME.jsonl`, and the two
//! must agree exactly. So must the traces of the kernel's own listing of
//! every rule set as loaded (`nft list ruleset`, `iptables-save`: what an
//! operator migrating hands Sluice).
//!
//! Run: `cargo test -p sluice --test kernel_oracle -- --ignored --nocapture`
//! (as root). `SLUICE_ORACLE_ONLY=substr` restricts the corpus;
//! `SLUICE_ORACLE_BIN=path` replaces the sluice binary.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

fn oracle_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/oracle")
}

fn have(tool: &str) -> bool {
    Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {tool} >/dev/null 2>&1"))
        .status()
        .is_ok_and(|s| s.success())
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(2).map(|u| u == "0"))
        })
        .unwrap_or(false)
}

fn preflight(rules_files: bool) {
    let mut missing = Vec::new();
    if !is_root() {
        missing.push("root privileges (effective uid 0)".to_string());
    }
    let mut tools = vec![
        ("nft", "nftables"),
        ("ip", "iproute2"),
        ("python3", "python3"),
    ];
    if rules_files {
        tools.push(("iptables-restore", "iptables"));
        tools.push(("ip6tables-restore", "iptables"));
        tools.push(("ipset", "ipset"));
    }
    for (tool, pkg) in tools {
        if !have(tool) {
            missing.push(format!("`{tool}` (Debian package {pkg})"));
        }
    }
    assert!(
        missing.is_empty(),
        "kernel oracle cannot run, missing: {}. This test never passes without the kernel.",
        missing.join(", ")
    );
}

fn read_jsonl(path: &Path) -> Vec<Value> {
    let text =
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .enumerate()
        .map(|(i, l)| {
            serde_json::from_str(l)
                .unwrap_or_else(|e| panic!("{}:{}: bad JSON: {e}: {l}", path.display(), i + 1))
        })
        .collect()
}

fn parse_jsonl(what: &str, text: &str) -> Result<Vec<Value>, String> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .enumerate()
        .map(|(i, l)| {
            serde_json::from_str(l)
                .map_err(|e| format!("{what} line {}: bad JSON ({e}): {l}", i + 1))
        })
        .collect()
}

/// Compares the NAT translation the kernel applied (addresses and ports seen
/// leaving the router) with the one `sluice trace` reports.
fn nat_problem(pkt: &Value, kernel: &Value, sluice: &Value) -> Option<String> {
    let knat = &kernel["nat"];
    let snat = &sluice["nat"];
    let orig_src = (pkt["src"].as_str(), pkt["sport"].as_u64());
    let orig_dst = (pkt["dst"].as_str(), pkt["dport"].as_u64());
    let (ksrc, kdst) = if knat.is_null() {
        (orig_src, orig_dst)
    } else {
        (
            (knat["src"][0].as_str(), knat["src"][1].as_u64()),
            (knat["dst"][0].as_str(), knat["dst"][1].as_u64()),
        )
    };
    if snat.is_null() {
        return (!knat.is_null()).then(|| "kernel translated, sluice reports no NAT".into());
    }
    let ty = snat["type"].as_str().unwrap_or("?");
    let addr = snat["addr"].as_str();
    let port = snat["port"].as_u64();
    let (changed, unchanged, orig_changed, orig_unchanged, which) = match ty {
        "dnat" => (kdst, ksrc, orig_dst, orig_src, "destination"),
        "snat" | "masquerade" => (ksrc, kdst, orig_src, orig_dst, "source"),
        other => return Some(format!("sluice reports unknown NAT type {other:?}")),
    };
    // A second translation (`nat_also`: the source after a DNAT) is
    // checked as one alone on that side; without one, that side must be
    // untouched.
    let also = &sluice["nat_also"];
    if also.is_null() {
        if unchanged != orig_unchanged {
            return Some(format!(
                "kernel also changed the other side ({:?} -> {:?})",
                orig_unchanged, unchanged
            ));
        }
    } else {
        let mut k2 = kernel.clone();
        let mut p2 = pkt.clone();
        // What the second translation sees: the packet after the first
        // (its destination as the kernel left it).
        p2["dst"] = changed.0.map_or(Value::Null, Value::from);
        p2["dport"] = changed.1.map_or(Value::Null, Value::from);
        k2["nat"]["dst"] = serde_json::json!([changed.0, changed.1]);
        let mut s2 = sluice.clone();
        s2["nat"] = also.clone();
        s2["nat_also"] = Value::Null;
        if let Some(p) = nat_problem(&p2, &k2, &s2) {
            return Some(format!("second translation: {p}"));
        }
    }
    let want_addr = match (ty, addr) {
        (_, Some(a)) => Some(a),
        ("masquerade", None) => kernel["oif_addr"].as_str(),
        _ => None,
    };
    if want_addr.is_none() || changed.0 != want_addr {
        return Some(format!(
            "{which} address: kernel {:?}, sluice {ty} to {:?}",
            changed.0, want_addr
        ));
    }
    // ICMP has no ports; otherwise a missing port means "port unchanged".
    if orig_changed.1.is_some() {
        let want_port = port.or(orig_changed.1);
        if changed.1 != want_port {
            return Some(format!(
                "{which} port: kernel {:?}, sluice {ty} port {:?} (original {:?})",
                changed.1, port, orig_changed.1
            ));
        }
    }
    None
}

struct Diff {
    ruleset: String,
    line: usize,
    what: String,
    packet: Value,
    kernel: Value,
    sluice: Value,
}

#[test]
#[ignore = "needs root, netns and nftables; run by .ci/run with --ignored"]
fn kernel_oracle() {
    let dir = oracle_dir();
    let corpus = dir.join("corpus");
    let only = std::env::var("SLUICE_ORACLE_ONLY").ok();
    let mut files: Vec<PathBuf> = std::fs::read_dir(&corpus)
        .unwrap_or_else(|e| panic!("reading {}: {e}", corpus.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| {
            matches!(
                p.extension().and_then(|e| e.to_str()),
                Some("nft" | "rules" | "rules6")
            )
        })
        .filter(|p| {
            only.as_deref()
                .is_none_or(|o| p.to_string_lossy().contains(o))
        })
        .collect();
    files.sort();
    assert!(
        !files.is_empty(),
        "empty kernel-oracle corpus in {}",
        corpus.display()
    );
    preflight(
        files
            .iter()
            .any(|f| f.extension().is_some_and(|e| e == "rules" || e == "rules6")),
    );

    let out = std::env::temp_dir().join(format!("sluice-oracle-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    std::fs::create_dir_all(&out).unwrap();

    // 1. the kernel
    let t0 = std::time::Instant::now();
    let status = Command::new("python3")
        .arg(dir.join("oracle.py"))
        .arg("--out")
        .arg(&out)
        .args(&files)
        .status()
        .expect("running tests/oracle/oracle.py");
    assert!(status.success(), "oracle.py (kernel side) failed: {status}");
    let kernel_secs = t0.elapsed().as_secs_f64();

    // 2. sluice, 3. compare
    // SLUICE_ORACLE_BIN replaces the binary (to check that the comparison bites).
    let sluice =
        std::env::var("SLUICE_ORACLE_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_sluice").into());
    let mut diffs: Vec<Diff> = Vec::new();
    let mut harness: Vec<String> = Vec::new();
    // rulesets sluice could not trace at all: each is a difference
    let mut failed: Vec<String> = Vec::new();
    let mut unchecked = 0usize;
    let mut total = 0usize;
    // New forwarded connections whose starting timeout was compared.
    let mut timeouts_checked = 0usize;
    let mut per_ruleset = String::new();
    // Each rule set, and the kernel's listing of it as loaded (`nft list
    // ruleset`, or `iptables-save` / `ip6tables-save` of an iptables one;
    // written by oracle.py): what an operator migrating gives Sluice must
    // give the same results.
    let mut jobs: Vec<(PathBuf, String, String)> = Vec::new();
    for file in &files {
        let stem = file.file_stem().unwrap().to_string_lossy().to_string();
        let name = file.file_name().unwrap().to_string_lossy().to_string();
        jobs.push((file.clone(), stem.clone(), name.clone()));
        let ext = file.extension().unwrap_or_default().to_string_lossy();
        let listing = out.join(format!("{stem}.listing.{ext}"));
        assert!(
            listing.exists(),
            "oracle.py wrote no kernel listing of {name}"
        );
        jobs.push((listing, stem, format!("{name} (listed)")));
    }
    let listings = jobs.len() - files.len();
    for (file, stem, label) in &jobs {
        let (file, stem) = (file, stem.clone());
        let pk_path = corpus.join(format!("{stem}.jsonl"));
        let packets = read_jsonl(&pk_path);
        let kernel = read_jsonl(&out.join(format!("{stem}.kernel.jsonl")));
        assert_eq!(packets.len(), kernel.len(), "{stem}: kernel result count");
        total += packets.len();
        let mut cmd = Command::new(&sluice);
        cmd.arg("trace")
            .arg("-c")
            .arg(file)
            .arg("--packets")
            .arg(&pk_path);
        let ipsets = corpus.join(format!("{stem}.ipset"));
        if ipsets.exists() {
            cmd.arg("--ipsets").arg(&ipsets);
        }
        if file.extension().is_some_and(|e| e == "rules6") {
            cmd.arg("--format").arg("ip6tables");
        }
        let run = cmd.output().expect("running sluice trace");
        let traced = if run.status.success() {
            parse_jsonl("sluice trace output", &String::from_utf8_lossy(&run.stdout))
        } else {
            Err(format!(
                "sluice trace exited with {}: {}",
                run.status,
                String::from_utf8_lossy(&run.stderr).trim()
            ))
        };
        let traced = match traced {
            Ok(t) if t.len() == packets.len() => t,
            Ok(t) => {
                failed.push(format!(
                    "{label}: sluice trace wrote {} results for {} packets",
                    t.len(),
                    packets.len()
                ));
                unchecked += packets.len();
                continue;
            }
            Err(e) => {
                failed.push(format!("{label}: {e}"));
                unchecked += packets.len();
                continue;
            }
        };
        let before = diffs.len();
        for (i, ((p, k), s)) in packets.iter().zip(&kernel).zip(&traced).enumerate() {
            let mut push = |what: String| {
                diffs.push(Diff {
                    ruleset: label.clone(),
                    line: i + 1,
                    what,
                    packet: p.clone(),
                    kernel: k.clone(),
                    sluice: s.clone(),
                })
            };
            if let Some(e) = k.get("error") {
                harness.push(format!("{stem}.jsonl:{}: oracle: {e}", i + 1));
                continue;
            }
            let want_ct = p["ct"].as_str().unwrap_or("new");
            let kv = k["verdict"].as_str().unwrap_or("?");
            let sv = s["verdict"].as_str().unwrap_or("<missing>");
            // A `notrack` rule before conntrack: the kernel's conntrack
            // state is `untracked`, and the trace must say the packet was.
            let k_untracked = k["ct"].as_str() == Some("untracked");
            let s_untracked = s["untracked"].as_bool() == Some(true);
            if k_untracked != s_untracked {
                push(format!(
                    "conntrack: kernel {}, sluice {}",
                    k["ct"],
                    if s_untracked { "untracked" } else { "tracked" }
                ));
                continue;
            }
            // Dropped before conntrack (a chain at priority raw): the
            // kernel recorded no state; the verdicts are compared below.
            let before_ct = k["ct"].is_null() && kv == "drop";
            if !k_untracked && !before_ct && k["ct"].as_str() != Some(want_ct) {
                harness.push(format!(
                    "{stem}.jsonl:{}: the kernel gave this packet ct state {}, the corpus says {want_ct} (fix the corpus)",
                    i + 1,
                    k["ct"]
                ));
                continue;
            }
            if kv != sv {
                push(format!("verdict: kernel {kv}, sluice {sv}"));
                continue;
            }
            if kv != "accept" {
                continue;
            }
            if let Some(problem) = nat_problem(p, k, s) {
                push(format!("nat: {problem}"));
                continue;
            }
            if let Some(km) = k["mark"].as_u64() {
                if s["mark"].as_u64() != Some(km) {
                    push(format!("mark: kernel {km:#x}, sluice {}", s["mark"]));
                    continue;
                }
            }
            // The timeout a new forwarded connection starts with (netfilter's
            // defaults, or its `ct timeout` policy's): the kernel's entry,
            // read a moment after the packet, has at most that left, and
            // no more than 3 s less.
            if let (Some(st), "new", Some("forward")) =
                (s["timeout"].as_u64(), want_ct, p["hook"].as_str())
            {
                timeouts_checked += 1;
                match k["timeout"].as_u64() {
                    Some(kt) if kt <= st && kt + 3 >= st => {}
                    Some(kt) => push(format!("timeout: kernel {kt} s left, sluice {st} s")),
                    None => push(format!(
                        "timeout: no kernel conntrack entry found, sluice {st} s"
                    )),
                }
            }
        }
        let _ = writeln!(
            per_ruleset,
            "  {:<37} {:>4} packets {:>4} differences",
            label,
            packets.len(),
            diffs.len() - before
        );
    }

    let mut report = String::new();
    let _ = writeln!(
        report,
        "kernel oracle: {} rulesets and the kernel's listings of {} of them, {} packet results \
         compared ({} new connections' timeouts), {} differences, {} rulesets sluice could not trace ({} packets \
         unchecked), {} harness problems (kernel side {:.1}s)",
        files.len(),
        listings,
        total,
        timeouts_checked,
        diffs.len(),
        failed.len(),
        unchecked,
        harness.len(),
        kernel_secs
    );
    report.push_str(&per_ruleset);
    for d in diffs.iter().take(15) {
        let _ = writeln!(
            report,
            "DIFF {}, packet {}: {}\n    packet: {}\n    kernel: {}\n    sluice: {}",
            d.ruleset, d.line, d.what, d.packet, d.kernel, d.sluice
        );
    }
    if diffs.len() > 15 {
        let _ = writeln!(report, "... {} more differences", diffs.len() - 15);
    }
    for f in &failed {
        let _ = writeln!(report, "SLUICE FAILED {f}");
    }
    for h in harness.iter().take(15) {
        let _ = writeln!(report, "HARNESS {h}");
    }
    eprintln!("{report}");
    let _ = std::fs::remove_dir_all(&out);
    assert!(
        diffs.is_empty() && failed.is_empty() && harness.is_empty(),
        "kernel oracle failed: {} differences, {} rulesets sluice could not trace, {} harness problems \
         (details above)",
        diffs.len(),
        failed.len(),
        harness.len()
    );
}
