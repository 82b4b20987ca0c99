//! `sluice bench update --kernel`: seed 002's rule-update measurements on
//! the kernel, with the tools operators run, on this machine, beside
//! Sluice's figures of [`crate::update`].
//!
//! In a network namespace of its own (`sluice-upd-<pid>`, deleted by name
//! afterwards), for each of `nft`, `iptables-legacy` (x_tables, what seed
//! 002 measured) and `iptables-nft`, every step a separate process started
//! from a thread inside the namespace, timed from spawn to exit:
//!
//! 1. load the same `objects` rules [`crate::update`] loads into Sluice (one
//!    forward chain; `nft -f` of the same nft text, `*-restore` of the same
//!    rules in iptables-restore form): `load_s`;
//! 2. `samples` times, insert one rule at the head of the loaded chain
//!    (`nft insert rule`, `-I FORWARD 1`): median `insert_ms`;
//! 3. delete each inserted rule (`nft delete rule … handle H`, `-D FORWARD
//!    1`): median `delete_ms`;
//! 4. seed 002's own test: an empty forward chain, then `appends`
//!    one-at-a-time appends of `ip saddr A accept` (`nft add rule`,
//!    `-A FORWARD -s A -j ACCEPT`): `append_s`.
//!
//! After the load and after the appends the chain's rules are counted
//! (`nft list chain`, `-S FORWARD`); a difference fails the run. The times
//! include each tool's process start, as they do for an operator's script
//! (Sluice's figures are control-socket round trips, without a process
//! start: `sluice ctl` adds about that much).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use serde::Serialize;

use crate::update::{median, GenRule, Rng, UpdateBenchError, UpdateOptions};

/// The kernel tools measured, in order.
pub const TOOLS: [&str; 3] = ["nft", "iptables-legacy", "iptables-nft"];

/// One tool's figures.
#[derive(Debug, Clone, Serialize)]
pub struct KernelUpdateRow {
    /// `nft`, `iptables-legacy` or `iptables-nft`.
    pub tool: &'static str,
    /// Seconds to load `objects` rules.
    pub load_s: f64,
    /// Median milliseconds of one insert with `objects` loaded.
    pub insert_ms: f64,
    /// Median milliseconds of one delete with `objects` loaded.
    pub delete_ms: f64,
    /// Seconds for `appends` one-at-a-time appends to an empty chain.
    pub append_s: f64,
    /// Rules loaded (counted after the load).
    pub objects: usize,
    /// Inserts and deletes timed.
    pub samples: usize,
    /// Appends made (counted after them).
    pub appends: usize,
}

fn fail(what: impl Into<String>, why: impl ToString) -> UpdateBenchError {
    UpdateBenchError::Request(what.into(), why.to_string())
}

/// Runs `prog args`; its stdout, and the seconds it took.
fn timed(prog: &str, args: &[&str]) -> Result<(String, f64), UpdateBenchError> {
    let t = Instant::now();
    let out = Command::new(prog)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| fail(format!("{prog} {}", args.join(" ")), e))?;
    let secs = t.elapsed().as_secs_f64();
    if !out.status.success() {
        return Err(fail(
            format!("{prog} {}", args.join(" ")),
            String::from_utf8_lossy(&out.stderr).trim().to_string(),
        ));
    }
    Ok((String::from_utf8_lossy(&out.stdout).into_owned(), secs))
}

/// The `i`-th appended source address (seed 002's `-s A`).
fn append_addr(i: usize) -> String {
    std::net::Ipv4Addr::from(0x0a00_0000u32.wrapping_add(i as u32 + 1)).to_string()
}

/// The loaded rules in iptables-restore form (the same rules as
/// [`crate::update::ruleset_text`]).
fn restore_text(o: &UpdateOptions) -> String {
    let mut r = Rng(o.seed);
    let mut s = String::with_capacity(o.objects * 90 + 128);
    s.push_str("*filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n");
    for _ in 0..o.objects {
        s.push_str("-A FORWARD ");
        s.push_str(&GenRule::draw(&mut r).iptables().join(" "));
        s.push('\n');
    }
    s.push_str("COMMIT\n");
    s
}

/// The rules of the forward chain as the tool lists them.
fn count(tool: &str) -> Result<usize, UpdateBenchError> {
    if tool == "nft" {
        let (out, _) = timed("nft", &["list", "chain", "ip", "filter", "forward"])?;
        Ok(out
            .lines()
            .filter(|l| {
                let l = l.trim_end();
                l.ends_with(" accept") || l.ends_with(" drop")
            })
            .count())
    } else {
        let (out, _) = timed(tool, &["-S", "FORWARD"])?;
        Ok(out.lines().filter(|l| l.starts_with("-A FORWARD")).count())
    }
}

fn check_count(tool: &str, step: &str, want: usize) -> Result<usize, UpdateBenchError> {
    let n = count(tool)?;
    if n == want {
        Ok(n)
    } else {
        Err(fail(
            format!("{tool} {step}"),
            format!("{n} rules listed, {want} expected"),
        ))
    }
}

/// Removes every rule the previous tool left (both families of tables).
fn clean() {
    for (p, a) in [
        ("nft", &["flush", "ruleset"][..]),
        ("iptables-legacy", &["-F", "FORWARD"][..]),
    ] {
        let _ = Command::new(p)
            .args(a)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// One tool, in the calling thread's namespace.
fn measure(
    tool: &'static str,
    o: &UpdateOptions,
    samples: usize,
    dir: &Path,
) -> Result<KernelUpdateRow, UpdateBenchError> {
    clean();
    let mut r = Rng(o.seed ^ 0x5eed);
    // 1. Load.
    let load_s = if tool == "nft" {
        let f = dir.join("loaded.nft");
        std::fs::write(&f, crate::update::ruleset_text(o.objects, o.seed))
            .map_err(|e| UpdateBenchError::Io(f.display().to_string(), e))?;
        timed("nft", &["-f", &f.display().to_string()])?.1
    } else {
        let f = dir.join("loaded.rules");
        std::fs::write(&f, restore_text(o))
            .map_err(|e| UpdateBenchError::Io(f.display().to_string(), e))?;
        timed(&format!("{tool}-restore"), &[&f.display().to_string()])?.1
    };
    let objects = check_count(tool, "load", o.objects)?;
    // 2. and 3. Insert at the head, then delete what was inserted.
    let (mut ins, mut del) = (Vec::new(), Vec::new());
    if tool == "nft" {
        // Plain inserts (with `-e -a`, which prints the new rule's handle,
        // one took 257 ms with 20 000 rules loaded on the development VM),
        // then the handles from one listing, not timed.
        for _ in 0..samples {
            let rule = GenRule::draw(&mut r).nft();
            let mut args = vec!["insert", "rule", "ip", "filter", "forward"];
            args.extend(rule.split_whitespace());
            ins.push(timed("nft", &args)?.1);
        }
        let (out, _) = timed("nft", &["-a", "list", "chain", "ip", "filter", "forward"])?;
        let handles: Vec<String> = out
            .lines()
            // Rule lines only (the chain's own line has a handle too).
            .filter(|l| l.contains(" accept # handle ") || l.contains(" drop # handle "))
            .filter_map(|l| l.rsplit("# handle ").next())
            .map(|h| h.trim().to_string())
            .take(samples)
            .collect();
        if handles.len() < samples || handles.iter().any(|h| h.parse::<u64>().is_err()) {
            return Err(fail("nft -a list chain", format!("handles {handles:?}")));
        }
        for h in &handles {
            let (_, t) = timed(
                "nft",
                &["delete", "rule", "ip", "filter", "forward", "handle", h],
            )?;
            del.push(t);
        }
    } else {
        for _ in 0..samples {
            let a = GenRule::draw(&mut r).iptables();
            let mut args = vec!["-I", "FORWARD", "1"];
            args.extend(a.iter().map(String::as_str));
            ins.push(timed(tool, &args)?.1);
            del.push(timed(tool, &["-D", "FORWARD", "1"])?.1);
        }
    }
    check_count(tool, "inserts and deletes", o.objects)?;
    // 4. Seed 002: appends to an empty chain.
    clean();
    if tool == "nft" {
        timed("nft", &["add", "table", "ip", "filter"])?;
        timed(
            "nft",
            &[
                "add",
                "chain",
                "ip",
                "filter",
                "forward",
                "{ type filter hook forward priority 0; policy accept; }",
            ],
        )?;
    } else {
        timed(tool, &["-F", "FORWARD"])?;
    }
    let t = Instant::now();
    for i in 0..o.appends {
        let a = append_addr(i);
        if tool == "nft" {
            timed(
                "nft",
                &[
                    "add", "rule", "ip", "filter", "forward", "ip", "saddr", &a, "accept",
                ],
            )?;
        } else {
            timed(tool, &["-A", "FORWARD", "-j", "ACCEPT", "-s", &a])?;
        }
    }
    let append_s = t.elapsed().as_secs_f64();
    let appends = check_count(tool, "appends", o.appends)?;
    clean();
    Ok(KernelUpdateRow {
        tool,
        load_s,
        insert_ms: median(&mut ins) * 1e3,
        delete_ms: median(&mut del) * 1e3,
        append_s,
        objects,
        samples,
        appends,
    })
}

/// The kernel measurement needs root: an error saying so otherwise.
pub fn check_root() -> Result<(), UpdateBenchError> {
    if crate::forward::is_root() {
        Ok(())
    } else {
        Err(fail(
            "bench update --kernel",
            "needs root (a network namespace, nft and iptables); run it with sudo",
        ))
    }
}

/// Every tool of [`TOOLS`], in a namespace of its own (needs root).
pub fn run(o: &UpdateOptions, samples: usize) -> Result<Vec<KernelUpdateRow>, UpdateBenchError> {
    check_root()?;
    let pid = std::process::id();
    let ns = sluice_io::netns::Netns::create(&format!("sluice-upd-{pid}"))
        .map_err(|e| fail("ip netns add", e))?;
    let dir: PathBuf = std::env::temp_dir().join(format!("sluice-bench-update-kernel-{pid}"));
    std::fs::create_dir_all(&dir)
        .map_err(|e| UpdateBenchError::Io(dir.display().to_string(), e))?;
    let r = std::thread::scope(|s| {
        s.spawn(|| {
            // Processes spawned from this thread start in the namespace.
            ns.enter_this_thread().map_err(|e| fail("setns", e))?;
            TOOLS
                .iter()
                .map(|t| measure(t, o, samples, &dir))
                .collect::<Result<Vec<_>, _>>()
        })
        .join()
        .unwrap_or_else(|_| Err(fail("kernel update bench", "panicked")))
    });
    let _ = std::fs::remove_dir_all(&dir);
    drop(ns);
    r
}

/// The kernel rows as a table.
pub fn table(rows: &[KernelUpdateRow]) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{:<16} {:>10} {:>14} {:>14} {:>12}",
        "kernel tool", "load s", "insert ms p50", "delete ms p50", "appends s"
    );
    for r in rows {
        let _ = writeln!(
            s,
            "{:<16} {:>10.3} {:>14.1} {:>14.1} {:>12.2}",
            r.tool, r.load_s, r.insert_ms, r.delete_ms, r.append_s
        );
    }
    if let Some(r) = rows.first() {
        let _ = writeln!(
            s,
            "(same machine, a namespace of its own: {} rules loaded, {} inserts and deletes with them loaded, {} appends to an empty chain; each step a process of the tool, start included)",
            r.objects, r.samples, r.appends
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn restore_text_holds_the_rules_of_the_nft_text() {
        let o = UpdateOptions {
            objects: 300,
            ..UpdateOptions::default()
        };
        let ipt = restore_text(&o);
        let nft = crate::update::ruleset_text(o.objects, o.seed);
        // Sluice reads both: the same rules, in the same order.
        let a = sluice_ruleset::parse_iptables_restore_str("k.rules", &ipt, None)
            .unwrap_or_else(|d| panic!("{d}"));
        let b = sluice_ruleset::parse_nft_str("k.nft", &nft).unwrap_or_else(|d| panic!("{d}"));
        let rules = |rs: &sluice_ruleset::Ruleset| -> Vec<String> {
            let p = sluice_policy::CompiledPolicy::compile(rs, &sluice_policy::Interfaces::new())
                .unwrap_or_else(|e| panic!("{e}"));
            p.list_rules()
                .into_iter()
                .filter(|r| r.chain.ends_with("forward") || r.chain.ends_with("FORWARD"))
                // The nft text writes hosts as /32, the iptables form bare.
                .map(|r| r.text.replace("/32 ", " "))
                .collect()
        };
        let (x, y) = (rules(&a), rules(&b));
        assert_eq!(x.len(), 300);
        assert_eq!(x, y);
        assert_eq!(append_addr(0), "10.0.0.1");
        assert_eq!(append_addr(2999), "10.0.11.184");
    }
}
