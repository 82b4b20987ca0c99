//! One-shot measurement against the classification and update budgets.
//! `cargo run --release -p sluice-classify --example measure [max_rules]`

use std::time::Instant;

use sluice_classify::gen;
use sluice_classify::*;

fn ns_per_pkt<E: Evaluate>(e: &E, pkts: &[PacketFields], budget_evals: usize) -> f64 {
    let mut s = Scratch::new();
    let rounds = (budget_evals / pkts.len()).max(1);
    let _ = bench_lookup(e, ChainId(0), pkts, 1, &mut s);
    let t = Instant::now();
    let sum = bench_lookup(e, ChainId(0), pkts, rounds, &mut s);
    let ns = t.elapsed().as_nanos() as f64 / (pkts.len() * rounds) as f64;
    std::hint::black_box(sum);
    ns
}

fn main() {
    let max: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(100_000);
    println!("shape      rules  tuples  compiled_ns  linear_ns");
    for &n in [20usize, 100, 1_000, 10_000, 100_000]
        .iter()
        .filter(|n| **n <= max)
    {
        for shape in ["seed001", "classbench"] {
            let (prog, pkts) = if shape == "seed001" {
                (gen::seed001_shape(n), gen::seed001_packets(4096, 1))
            } else {
                let p = gen::classbench(n, 7);
                let k = gen::classbench_packets(&p, 4096, 8);
                (p, k)
            };
            let c = Classifier::compile(&prog).expect("compile");
            let cns = ns_per_pkt(&c, &pkts, 400_000);
            let lin_budget = (40_000_000 / n).clamp(4096, 400_000);
            let lns = ns_per_pkt(&prog, &pkts, lin_budget);
            println!(
                "{shape:<10} {n:>6}  {:>6}  {cns:>11.1}  {lns:>9.1}",
                c.tuple_count(ChainId(0)).unwrap_or(0)
            );
        }
    }
    // Updates with 150 000 rules loaded.
    let n = 150_000;
    for shape in ["seed001", "classbench"] {
        let prog = if shape == "seed001" {
            gen::seed001_shape(n)
        } else {
            gen::classbench(n, 3)
        };
        let t = Instant::now();
        let c = Classifier::compile(&prog).expect("compile");
        let load = t.elapsed();
        let extra = gen::classbench(200, 99);
        let mut ins = Vec::new();
        let mut del = Vec::new();
        let mut cur = c;
        for (i, r) in extra.chains[0].rules.iter().enumerate() {
            let mut r = r.clone();
            r.id = RuleId(10_000_000 + i as u64);
            let at = Placement::Before(RuleId((i as u64 * 7919) % n as u64));
            let t = Instant::now();
            let mut next = cur.clone();
            next.insert_rule(ChainId(0), at, &r).expect("insert");
            ins.push(t.elapsed().as_nanos() as f64 / 1e3);
            let t = Instant::now();
            let mut next2 = next.clone();
            next2
                .delete_rule(ChainId(0), RuleId((i as u64 * 104_729) % n as u64))
                .expect("delete");
            del.push(t.elapsed().as_nanos() as f64 / 1e3);
            // Keep the previous generation alive, as a reader would.
            std::hint::black_box(&cur);
            cur = next2;
        }
        ins.sort_by(f64::total_cmp);
        del.sort_by(f64::total_cmp);
        let q = |v: &[f64], p: f64| v[((v.len() - 1) as f64 * p) as usize];
        println!(
            "{shape}: load {n} rules {:.3} s; insert p50 {:.0} us p99 {:.0} us max {:.0} us; delete p50 {:.0} us p99 {:.0} us max {:.0} us",
            load.as_secs_f64(),
            q(&ins, 0.5), q(&ins, 0.99), q(&ins, 1.0),
            q(&del, 0.5), q(&del, 0.99), q(&del, 1.0)
        );
    }
}
