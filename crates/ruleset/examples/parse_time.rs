//! Times `parse_nft_file` (lex/preprocess + parse + validate), best of 3.
//!
//! `cargo run --release -p sluice-ruleset --example parse_time -- FILE.nft`

use std::time::{Duration, Instant};

fn main() {
    let Some(path) = std::env::args().nth(1) else {
        eprintln!("usage: parse_time FILE.nft [RUNS]");
        std::process::exit(2);
    };
    let runs: usize = std::env::args()
        .nth(2)
        .and_then(|s| s.parse().ok())
        .unwrap_or(3);
    let mut best = Duration::MAX;
    let mut rules = 0usize;
    for _ in 0..runs.max(1) {
        let t = Instant::now();
        let r = match sluice_ruleset::parse_nft_file(&path) {
            Ok(r) => r,
            Err(d) => {
                eprint!("{d}");
                std::process::exit(1);
            }
        };
        let dt = t.elapsed();
        rules = r
            .tables
            .iter()
            .flat_map(|t| &t.chains)
            .map(|c| c.rules.len())
            .sum();
        drop(r);
        best = best.min(dt);
    }
    let s = best.as_secs_f64();
    println!(
        "{path}: {rules} rules, best of {runs}: {:.1} ms ({:.0} rules/s)",
        s * 1e3,
        rules as f64 / s
    );
}
