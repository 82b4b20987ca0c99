//! Times the phases of loading an nft rule set: parse, compile (lower,
//! classifier, rule store; by value, as the daemon does). `cargo run --release -p sluice-policy --example
//! load -- FILE [--no-updates]` (`--no-updates`: skip the single-update
//! timing, e.g. to profile the load alone). It allocates with the `sluice`
//! binary's allocator (mimalloc).

use std::time::Instant;

/// The `sluice` binary's allocator, so that the phases cost what they cost
/// in the gateway.
#[global_allocator]
static GLOBAL: sluice_io::alloc::Allocator = sluice_io::alloc::Allocator;

fn main() {
    let Some(path) = std::env::args().nth(1) else {
        eprintln!("usage: load FILE.nft");
        std::process::exit(2);
    };
    let t = Instant::now();
    let rs = match sluice_ruleset::parse_nft_file(&path) {
        Ok(rs) => rs,
        Err(d) => {
            eprintln!("{d}");
            std::process::exit(1);
        }
    };
    let parse = t.elapsed();
    let t = Instant::now();
    // By value, as the daemon loads (no copy of the rules).
    let ifaces = sluice_policy::Interfaces::from_ruleset(&rs);
    let p = match sluice_policy::CompiledPolicy::compile_owned(rs, &ifaces) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(1);
        }
    };
    let compile = t.elapsed();
    let rules = p.rule_count();
    // Single updates on the loaded policy (no socket): insert at the front
    // of the first chain that has rules, then delete it again.
    let updates = std::env::args().nth(2).as_deref() != Some("--no-updates");
    let first = if updates {
        p.list_rules().into_iter().next()
    } else {
        None
    };
    let mut apply = Vec::new();
    if let Some(r) = first {
        let mut parts = r.chain.splitn(3, ' ');
        let (fam, table, chain) = (
            parts.next().unwrap_or_default(),
            parts.next().unwrap_or_default(),
            parts.next().unwrap_or_default(),
        );
        let mut cur = p.clone();
        for i in 0..1000u32 {
            let cmd = format!(
                "insert rule {fam} {table} {chain} position {} ip saddr 10.{}.{}.0/24 tcp dport {} accept",
                r.handle,
                i / 256,
                i % 256,
                1 + i
            );
            let t = Instant::now();
            match cur.apply_text("bench", &cmd) {
                Ok((next, _)) => cur = next,
                Err(e) => {
                    eprintln!("{cmd}: {e}");
                    std::process::exit(1);
                }
            }
            apply.push(t.elapsed().as_secs_f64() * 1e6);
        }
        apply.sort_by(f64::total_cmp);
    }
    let t = Instant::now();
    drop(p);
    let drop_policy = t.elapsed();
    println!(
        "{rules} rules: parse {:.3} s, compile {:.3} s (drop {:.3} s)",
        parse.as_secs_f64(),
        compile.as_secs_f64(),
        drop_policy.as_secs_f64()
    );
    if let (Some(med), Some(p99)) = (
        apply.get(apply.len() / 2),
        apply.get(apply.len() * 99 / 100),
    ) {
        println!("insert (apply only): median {med:.1} us, p99 {p99:.1} us");
    }
}
