//! The memory access pattern of the engine's established fast path, alone:
//! how fast this machine runs it, to compare with `sluice bench nat44`'s
//! ns per packet at the same connection count.
//!
//! `[BATCH=256] [NOISE=1] cargo run --release -p sluice-tester --example access_pattern -- N [GROUP] [ro]`
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
//! (41 with `BATCH=256`, 58-82 with `NOISE`). `sluice bench nat44` in the
//! same hour: 72-129 ns at 1 M, 94-168 ns at 10 M, 251 ns at 40 M. The
//! engine's memory pattern does not explain its cost, nor its growth from
//! 10 M to 40 M (docs/benchmarks.md). With `WORK` (19:50 UTC, `ro`):
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

fn main() {
    let a: Vec<String> = std::env::args().collect();
    let n: usize = a
        .get(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(1_000_000)
        .max(1);
    let group: usize = a.get(2).and_then(|s| s.parse().ok()).unwrap_or(64).max(1);
    let write = a.get(3).map(String::as_str) != Some("ro");
    // Between batches of 256 packets, 256 random reads of a 2-byte array
    // of N entries (the tester's learned ports) when set.
    let noise = std::env::var_os("NOISE").is_some();
    let learned = vec![1u16; if noise { n } else { 1 }];
    // With FRAMES, every packet also reads (pass 1) and writes (pass 3) 64
    // bytes of its frame in a batch buffer of BATCH frames of 2 KiB (the
    // io crate's frame size), on ordinary pages.
    let frames = std::env::var_os("FRAMES").is_some();
    // With WORK=n, pass 3 also runs a dependent chain of n multiply-adds
    // per packet (about 4n cycles), standing in for the engine's compute.
    let fused = std::env::var_os("FUSED").is_some();
    let work: u64 = std::env::var("WORK")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let mut fbuf = vec![0u8; if frames { 256 * 2048 } else { 2048 }];
    let mut lr = Rng(3);
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
    let packets = 20_000_000usize;
    let groups = packets / group;
    let mut bucket_of = vec![vec![0usize; group]; 3];
    let mut entry_of = vec![vec![0usize; group]; 3];
    let mut sum = 0u64;
    let mut pick = Rng(7);
    let t = Instant::now();
    let mut noise_ns = 0u128;
    // The engine restarts its pipeline in every `process` call (a batch of
    // BATCH packets); BATCH=0 runs one pipeline over every packet.
    let batch: usize = std::env::var("BATCH")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256);
    let per_call = if batch == 0 {
        groups
    } else {
        (batch / group).max(1)
    };
    let mut left = groups;
    while left > 0 {
        let gs = per_call.min(left);
        left -= gs;
        if noise {
            let tn = Instant::now();
            for _ in 0..256 {
                sum = sum.wrapping_add(u64::from(learned[lr.below(learned.len())]));
            }
            noise_ns += tn.elapsed().as_nanos();
        }
        if fused {
            // The three passes interleaved per packet: packet j of group
            // k - 2 acts, packet j of group k - 1 reads its bucket and
            // prefetches its entry, packet j of group k prefetches its
            // bucket; the same distances, prefetches spread out.
            for k in 0..gs + 2 {
                for j in 0..group {
                    if let Some(g) = k.checked_sub(2) {
                        let e = entry_of[g % 3][j];
                        let v = ents[e * 6];
                        sum = sum.wrapping_add(v);
                        let mut w = v;
                        for _ in 0..work {
                            w = std::hint::black_box(w.wrapping_mul(31).wrapping_add(1));
                        }
                        sum = sum.wrapping_add(w);
                        if write {
                            ents[e * 6 + 4] = v.wrapping_add(1);
                        }
                    }
                    if let Some(g) = k.checked_sub(1).filter(|&g| g < gs) {
                        let g = g % 3;
                        let e = index[bucket_of[g][j] * 8] as usize;
                        entry_of[g][j] = e;
                        prefetch(&ents[e * 6]);
                        prefetch(&ents[e * 6 + 5]);
                    }
                    if k < gs {
                        let b = pick.below(buckets);
                        bucket_of[k % 3][j] = b;
                        prefetch(&index[b * 8]);
                    }
                }
            }
            continue;
        }
        for k in 0..gs + 2 {
            if let Some(g) = k.checked_sub(2) {
                for (j, &e) in entry_of[g % 3].iter().enumerate() {
                    let v = ents[e * 6];
                    sum = sum.wrapping_add(v);
                    let mut w = v;
                    for _ in 0..work {
                        w = std::hint::black_box(w.wrapping_mul(31).wrapping_add(1));
                    }
                    sum = sum.wrapping_add(w);
                    if write {
                        ents[e * 6 + 4] = v.wrapping_add(1);
                    }
                    if frames {
                        let f = ((g % 4) * group + j) % 256 * 2048;
                        fbuf[f + 26] = v as u8;
                    }
                }
            }
            if let Some(g) = k.checked_sub(1).filter(|&g| g < gs) {
                let g = g % 3;
                for j in 0..group {
                    let e = index[bucket_of[g][j] * 8] as usize;
                    entry_of[g][j] = e;
                    prefetch(&ents[e * 6]);
                    prefetch(&ents[e * 6 + 5]);
                }
            }
            if k < gs {
                for (j, b) in bucket_of[k % 3].iter_mut().enumerate() {
                    if frames {
                        let f = ((k % 4) * group + j) % 256 * 2048;
                        sum = sum.wrapping_add(u64::from(fbuf[f + 30]));
                    }
                    *b = pick.below(buckets);
                    prefetch(&index[*b * 8]);
                }
            }
        }
    }
    let ns = (t.elapsed().as_nanos() - noise_ns) as f64 / (groups * group) as f64;
    println!("{n} connections, groups of {group}, writes {write}: {ns:.1} ns per packet ({sum})");
}
