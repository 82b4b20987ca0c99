//! Quick criterion bench: compiled vs linear ns/packet for both generated shapes.
//! `cargo bench -p sluice-classify --bench lookup`

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use sluice_classify::gen;
use sluice_classify::*;

fn lookup(c: &mut Criterion) {
    let mut g = c.benchmark_group("classify");
    g.sample_size(10);
    for n in [20usize, 1_000, 10_000] {
        for shape in ["seed001", "classbench"] {
            let (prog, pkts) = if shape == "seed001" {
                (gen::seed001_shape(n), gen::seed001_packets(256, 1))
            } else {
                let p = gen::classbench(n, 7);
                let k = gen::classbench_packets(&p, 256, 8);
                (p, k)
            };
            let cls = Classifier::compile(&prog).expect("compile");
            let mut s = Scratch::new();
            g.throughput(Throughput::Elements(pkts.len() as u64));
            g.bench_with_input(
                BenchmarkId::new(format!("{shape}/compiled"), n),
                &n,
                |b, _| b.iter(|| bench_lookup(&cls, ChainId(0), &pkts, 1, &mut s)),
            );
            if n <= 1_000 {
                g.bench_with_input(
                    BenchmarkId::new(format!("{shape}/linear"), n),
                    &n,
                    |b, _| b.iter(|| bench_lookup(&prog, ChainId(0), &pkts, 1, &mut s)),
                );
            }
        }
    }
    g.finish();
}

criterion_group!(benches, lookup);
criterion_main!(benches);
