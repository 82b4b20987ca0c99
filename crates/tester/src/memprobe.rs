//! The machine's random-memory-access limit, measured in the same run as the
//! engine so that the engine's cost can be stated against it.
//!
//! A connection-table lookup at tens of millions of entries is a handful of
//! random cache-line reads into a table far larger than the caches. The
//! fastest any table can go is bounded by how many *independent* random
//! cache-line reads one core can complete per second over a buffer of the same
//! size. This module measures that: random 64-byte-aligned loads from a
//! buffer, issued with no dependency between them, so the core overlaps as
//! many misses as its fill buffers allow.
//!
//! Plain loads overlap only as far as the core's reorder window reaches; a
//! table lookup that prefetches ahead (as the engine's batch passes do) can
//! keep more misses in flight. The probe therefore also measures the same
//! reads with each address prefetched [`PREFETCH_AHEAD`] reads before it is
//! loaded: on the development VM (2026-11-23) 10 ns per read over 128 MiB
//! against 15 ns plain, 16-19 ns over 3 GiB against 24 ns.

use std::time::Instant;

/// Result of one probe.
#[derive(Clone, Copy, Debug, serde::Serialize)]
pub struct MemLimit {
    /// Buffer size probed, in bytes.
    pub bytes: u64,
    /// Nanoseconds per independent random cache-line read.
    pub independent_ns: f64,
    /// Nanoseconds per dependent (pointer-chasing) random read: the latency.
    pub dependent_ns: f64,
    /// Nanoseconds per independent random read when each address is
    /// prefetched [`PREFETCH_AHEAD`] reads before it is loaded.
    pub prefetched_ns: f64,
}

/// How many reads ahead the prefetched reads prefetch (the best of 8, 16,
/// 32 and 64 in the probe of the module documentation).
pub const PREFETCH_AHEAD: usize = 32;

/// Probe `bytes` of memory with `reads` random reads of each kind.
pub fn probe(bytes: u64, reads: u64, seed: u64) -> MemLimit {
    let lines = (bytes / 64).max(1024) as usize;
    // One u64 per cache line is used; the rest of each line is padding so that
    // every read touches a distinct line. Writing the buffer backs it with
    // real pages (and builds the pointer-chasing cycle).
    let mut buf = vec![0u64; lines * 8];
    sluice_io::mem::advise_huge_pages(&mut buf);
    // Sattolo's algorithm: a single random cycle through every line.
    let mut order: Vec<u32> = (0..lines as u32).collect();
    let mut s = seed | 1;
    for i in (1..lines).rev() {
        s = crate::perm::splitmix64(s);
        let j = (s % i as u64) as usize;
        order.swap(i, j);
    }
    for i in 0..lines {
        let from = order[i] as usize;
        let to = order[(i + 1) % lines] as u64;
        buf[from * 8] = to;
    }
    drop(order);

    // Independent reads: addresses come from a PRNG, not from loaded data.
    let mask_lines = lines as u64;
    // The next random line (an LCG step, then multiply-shift range
    // reduction: no division in the loop).
    let next = |x: &mut u64| {
        *x = x
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (((*x >> 32) * mask_lines) >> 32) as usize
    };
    let mut x = seed;
    let mut sum = 0u64;
    let t = Instant::now();
    for _ in 0..reads {
        let line = next(&mut x);
        sum = sum.wrapping_add(buf[line * 8]);
    }
    let independent_ns = t.elapsed().as_nanos() as f64 / reads as f64;

    // The same reads, each address prefetched PREFETCH_AHEAD reads ahead.
    let mut x = seed ^ 0x5eed;
    let mut ahead = [0usize; PREFETCH_AHEAD];
    for a in ahead.iter_mut() {
        *a = next(&mut x);
        if let Some(w) = buf.get(*a * 8) {
            sluice_io::mem::prefetch(w);
        }
    }
    let t = Instant::now();
    let mut i = 0usize;
    for _ in 0..reads {
        let n = next(&mut x);
        if let Some(w) = buf.get(n * 8) {
            sluice_io::mem::prefetch(w);
        }
        let slot = &mut ahead[i];
        let line = core::mem::replace(slot, n);
        sum = sum.wrapping_add(buf.get(line * 8).copied().unwrap_or(0));
        i = (i + 1) % PREFETCH_AHEAD;
    }
    let prefetched_ns = t.elapsed().as_nanos() as f64 / reads as f64;

    // Dependent reads: each address is the value just loaded.
    let mut p = 0usize;
    let dep_reads = (reads / 8).max(1000);
    let t = Instant::now();
    for _ in 0..dep_reads {
        p = buf[p * 8] as usize;
    }
    let dependent_ns = t.elapsed().as_nanos() as f64 / dep_reads as f64;
    std::hint::black_box((sum, p));
    MemLimit {
        bytes: (lines * 64) as u64,
        independent_ns,
        dependent_ns,
        prefetched_ns,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_covers_the_requested_buffer_and_reports_costs() {
        let m = probe(8 << 20, 100_000, 1);
        assert_eq!(m.bytes, 8 << 20);
        assert!(m.independent_ns.is_finite() && m.independent_ns > 0.0);
        assert!(m.dependent_ns.is_finite() && m.dependent_ns > 0.0);
        assert!(m.prefetched_ns.is_finite() && m.prefetched_ns > 0.0);
    }
}
