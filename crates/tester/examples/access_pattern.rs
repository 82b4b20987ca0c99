//! The memory access pattern of the engine's established fast path, alone:
//! how fast this machine runs it, to compare with `sluice bench nat44`'s
//! ns per packet at the same connection count.
//!
//! `[BATCH=256] [NOISE=1] [FRAMES=1] [WORK=n] [FUSED=1] cargo run --release -p sluice-tester --example access_pattern -- N [GROUP] [ro]`
//!
//! An index of `N * 40 / 77` 64-byte buckets and `N` 48-byte entries (the
//! conntrack table's sizes for `N` connections), both advised for
//! transparent huge pages. Per packet, in the engine's three passes over
//! groups of `GROUP` (default 64) packets, software pipelined as
//! `Worker::process` runs them: pass 1 picks a random bucket and prefetches
//! it; pass 2 reads the bucket, takes the entry id it holds and prefetches
//! both lines the entry may span; pass 3 reads the entry and (unless `ro`)
//! writes a word of it, as the expiry update does. The pipeline restarts
//! every `BATCH` packets (a `process` call; 0: never). With `NOISE`, 256
//! random reads of an `N`-entry `u16` array (the tester's learned ports)
//! run between batches, untimed. With `FRAMES`, each packet also reads and
//! writes 64 bytes of a 512 KiB frame buffer. With `WORK=n`, pass 3 runs a
//! dependent chain of `n` multiply-adds per packet, standing in for the
//! engine's computation. With `FUSED`, the three passes are interleaved per
//! packet instead of per group (same prefetch distances). Nothing else: no
//! hashing beyond a PRNG, no rewrite.
//!
//! 2026-11-23 19:25-19:40 UTC, the 2-vCPU AMD EPYC KVM guest (24 GiB,
//! Linux 6.18): 26-30 ns per packet at 1 M and 10 M, 32-45 ns at 40 M
//! with one pipeline over every packet (`BATCH=0`); 41 ns at 40 M with the
//! default `BATCH=256`, 58-82 with `NOISE`. `sluice bench nat44` in the
//! same hour: 72-129 ns at 1 M, 94-168 ns at 10 M, 251 ns at 40 M. The
//! engine's memory pattern does not explain its cost, nor its growth from
//! 10 M to 40 M (docs/benchmarks.md). With `WORK` (about 19:45 UTC, `ro`):
//! 8 / 27 / 64 ns at 10 connections for `WORK=0/20/40`, 42 / 77 / 98 ns at
//! 1 M and 51 / 111 / 121 ns at 40 M: the memory time adds to the
//! computation instead of hiding under it, on this VM; `FUSED` does not
//! change that (1 M: 33 and 49 ns against 36 and 49 for `WORK=0/20`; 40 M
//! worse, 106 and 154 against 52 and 101).

use std::time::Instant;

use sluice_io::mem::{advise_huge_pages, prefetch};

struct Rng(u64);

impl Rng {
    fn below(&mut self, m: usize) -> usize {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (((self.0 >> 32) * m as u64) >> 32) as usize
    }
}

/// The tables and the per-packet steps of the three passes.
struct Sim {
    index: Vec<u64>,
    ents: Vec<u64>,
    buckets: usize,
    group: usize,
    /// Write a word of each entry (the expiry update).
    write: bool,
    /// Multiply-adds per packet in pass 3 (the computation's stand-in).
    work: u64,
    /// The batch's frames (2 KiB each), when `FRAMES` is set.
    frames: Option<Vec<u8>>,
    /// Bucket and entry of packet `j` of the last three groups.
    bucket_of: [Vec<usize>; 3],
    entry_of: [Vec<usize>; 3],
    pick: Rng,
    sum: u64,
}

impl Sim {
    /// Offset of packet `j` of group `g`'s frame in the batch buffer.
    fn frame_at(&self, g: usize, j: usize) -> usize {
        ((g % 4) * self.group + j) % 256 * 2048
    }

    /// Pass 1: read the frame, pick a random bucket, prefetch it.
    fn pass1(&mut self, k: usize, j: usize) {
        if let Some(f) = &self.frames {
            self.sum = self
                .sum
                .wrapping_add(u64::from(f[self.frame_at(k, j) + 30]));
        }
        let b = self.pick.below(self.buckets);
        self.bucket_of[k % 3][j] = b;
        prefetch(&self.index[b * 8]);
    }

    /// Pass 2: read the bucket, prefetch both lines of its entry.
    fn pass2(&mut self, g: usize, j: usize) {
        let e = self.index[self.bucket_of[g % 3][j] * 8] as usize;
        self.entry_of[g % 3][j] = e;
        prefetch(&self.ents[e * 6]);
        prefetch(&self.ents[e * 6 + 5]);
    }

    /// Pass 3: read the entry, compute, write the entry and the frame.
    fn pass3(&mut self, g: usize, j: usize) {
        let e = self.entry_of[g % 3][j];
        let v = self.ents[e * 6];
        let mut w = v;
        for _ in 0..self.work {
            w = std::hint::black_box(w.wrapping_mul(31).wrapping_add(1));
        }
        self.sum = self.sum.wrapping_add(v).wrapping_add(w);
        if self.write {
            self.ents[e * 6 + 4] = v.wrapping_add(1);
        }
        let at = self.frame_at(g, j);
        if let Some(f) = &mut self.frames {
            f[at + 26] = v as u8;
        }
    }
}

fn env_num(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    let a: Vec<String> = std::env::args().collect();
    let n: usize = a
        .get(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(1_000_000)
        .max(1);
    let group: usize = a.get(2).and_then(|s| s.parse().ok()).unwrap_or(64).max(1);
    let noise = std::env::var_os("NOISE").is_some();
    let fused = std::env::var_os("FUSED").is_some();
    let batch = env_num("BATCH", 256);
    let buckets = (n * 40 / 77).max(1);
    let mut index = vec![0u64; buckets * 8];
    advise_huge_pages(&mut index[..]);
    let mut ents = vec![0u64; n * 6];
    advise_huge_pages(&mut ents[..]);
    let mut r = Rng(99);
    for b in 0..buckets {
        index[b * 8] = r.below(n) as u64;
    }
    for (e, w) in ents.chunks_mut(6).enumerate() {
        w[0] = e as u64;
    }
    let mut sim = Sim {
        index,
        ents,
        buckets,
        group,
        write: a.get(3).map(String::as_str) != Some("ro"),
        work: env_num("WORK", 0) as u64,
        frames: std::env::var_os("FRAMES").map(|_| vec![0u8; 256 * 2048]),
        bucket_of: std::array::from_fn(|_| vec![0; group]),
        entry_of: std::array::from_fn(|_| vec![0; group]),
        pick: Rng(7),
        sum: 0,
    };
    let learned = vec![1u16; if noise { n } else { 1 }];
    let mut lr = Rng(3);
    let groups = 20_000_000 / group;
    // The engine restarts its pipeline in every `process` call.
    let per_call = if batch == 0 {
        groups
    } else {
        (batch / group).max(1)
    };
    let t = Instant::now();
    let mut noise_ns = 0u128;
    let mut left = groups;
    while left > 0 {
        let gs = per_call.min(left);
        left -= gs;
        if noise {
            let tn = Instant::now();
            for _ in 0..256 {
                let v = learned[lr.below(learned.len())];
                sim.sum = sim.sum.wrapping_add(u64::from(v));
            }
            noise_ns += tn.elapsed().as_nanos();
        }
        // Group k: pass 3 of group k - 2, pass 2 of group k - 1, pass 1 of
        // group k; per group, or (FUSED) interleaved packet by packet.
        for k in 0..gs + 2 {
            let passes = [
                (3, k.checked_sub(2)),
                (2, k.checked_sub(1).filter(|&g| g < gs)),
                (1, (k < gs).then_some(k)),
            ];
            let mut step = |pass: u8, g: Option<usize>, j: usize| match (pass, g) {
                (3, Some(g)) => sim.pass3(g, j),
                (2, Some(g)) => sim.pass2(g, j),
                (1, Some(g)) => sim.pass1(g, j),
                _ => {}
            };
            if fused {
                for j in 0..group {
                    for (pass, g) in passes {
                        step(pass, g, j);
                    }
                }
            } else {
                for (pass, g) in passes {
                    for j in 0..group {
                        step(pass, g, j);
                    }
                }
            }
        }
    }
    let ns = (t.elapsed().as_nanos() - noise_ns) as f64 / (groups * group) as f64;
    println!(
        "{n} connections, groups of {group}, writes {}: {ns:.1} ns per packet ({})",
        sim.write, sim.sum
    );
}
