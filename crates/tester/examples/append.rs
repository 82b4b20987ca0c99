//! Times one-at-a-time appends applied directly to a compiled policy (no
//! control socket), to separate the update's own cost from the round trip:
//! `cargo run --release -p sluice-tester --example append -- [LOADED] [APPENDS]`
//! (`SEED002=1` appends seed 002's `ip saddr A accept` rules instead).

use std::time::Instant;

fn main() {
    let mut args = std::env::args().skip(1);
    let loaded: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(0);
    let appends: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(3000);
    let text = sluice_tester::update::ruleset_text(loaded, 1);
    if let Ok(path) = std::env::var("WRITE_RULESET") {
        // The loaded rule set as a file, for `sluice-policy`'s `load` example.
        std::fs::write(&path, &text).expect("write the rule set");
    }
    let rs = sluice_ruleset::parse_nft_str("loaded.nft", &text).expect("generated rule set parses");
    let t = Instant::now();
    let mut p =
        sluice_policy::CompiledPolicy::compile(&rs, &sluice_policy::Interfaces::from_ruleset(&rs))
            .expect("generated rule set compiles");
    let compile = t.elapsed().as_secs_f64();
    // `SEED002=1`: seed 002's rules (`ip saddr A accept`), as `sluice bench
    // update` appends them to an empty chain; else ClassBench-style rules.
    let cmds: Vec<String> = if std::env::var_os("SEED002").is_some() {
        (0..appends)
            .map(|i| {
                let a = std::net::Ipv4Addr::from(0x0a00_0000u32 + i as u32);
                format!("add rule ip filter forward ip saddr {a} accept")
            })
            .collect()
    } else {
        sluice_tester::update::rules(appends, 7)
            .into_iter()
            .map(|r| format!("add rule ip filter forward {r}"))
            .collect()
    };
    let t = Instant::now();
    for c in &cmds {
        let (next, _) = p.apply_text("command", c).expect("append applies");
        p = next;
    }
    let s = t.elapsed().as_secs_f64();
    println!(
        "{loaded} loaded (compile {compile:.3} s): {appends} appends in {s:.3} s, {:.1} us each; {} rules",
        s * 1e6 / appends.max(1) as f64,
        p.rule_count()
    );
}
