//! Times the phases of loading an nft rule set: parse, compile (lower,
//! classifier, rule store). `cargo run --release -p sluice-policy --example
//! load -- FILE`.

use std::time::Instant;

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
    let p = match sluice_policy::CompiledPolicy::compile(
        &rs,
        &sluice_policy::Interfaces::from_ruleset(&rs),
    ) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(1);
        }
    };
    let compile = t.elapsed();
    let rules = p.rule_count();
    let t = Instant::now();
    drop(p);
    let drop_policy = t.elapsed();
    println!(
        "{rules} rules: parse {:.3} s, compile {:.3} s (drop {:.3} s)",
        parse.as_secs_f64(),
        compile.as_secs_f64(),
        drop_policy.as_secs_f64()
    );
}
