//! Times `parse_nft_file` (lex/preprocess + parse + validate) on one file:
//! best wall time of N runs (default 3), and the best on-CPU time of the
//! thread (Linux `/proc/thread-self/schedstat`; not counting time spent
//! waiting for a CPU, which is steadier on a loaded machine).
//!
//! `cargo run --release -p sluice-ruleset --example parse_time -- FILE.nft [N]`

use std::time::{Duration, Instant};

/// Nanoseconds this thread has spent on a CPU, if the kernel says.
fn cpu_ns() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    s.split_whitespace().next()?.parse().ok()
}

fn main() {
    let Some(path) = std::env::args().nth(1) else {
        eprintln!("usage: parse_time FILE.nft [RUNS]");
        std::process::exit(2);
    };
    let runs: usize = std::env::args()
        .nth(2)
        .and_then(|s| s.parse().ok())
        .unwrap_or(3)
        .max(1);
    let mut best = Duration::MAX;
    let mut best_cpu = u64::MAX;
    let mut rules = 0usize;
    for _ in 0..runs {
        let c0 = cpu_ns();
        let t = Instant::now();
        let r = match sluice_ruleset::parse_nft_file(&path) {
            Ok(r) => r,
            Err(d) => {
                eprint!("{d}");
                std::process::exit(1);
            }
        };
        let dt = t.elapsed();
        if let (Some(a), Some(b)) = (c0, cpu_ns()) {
            best_cpu = best_cpu.min(b.saturating_sub(a));
        }
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
    let cpu = if best_cpu == u64::MAX {
        String::new()
    } else {
        format!(", cpu {:.1} ms", best_cpu as f64 / 1e6)
    };
    println!(
        "{path}: {rules} rules, best of {runs}: {:.1} ms ({:.0} rules/s){cpu}",
        s * 1e3,
        rules as f64 / s
    );
}
