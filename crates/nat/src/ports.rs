//! Port partitioning between workers and the per-worker port allocator.
//!
//! # Partitioning
//!
//! Every external port number `p` belongs to exactly one worker:
//!
//! ```text
//! owner_of(p) = (p >> 1) mod workers
//! ```
//!
//! The function depends on the port only, not on the pool, the address or
//! the protocol, so an inbound packet can be steered to the worker that
//! holds its mapping from the destination port alone, without any shared
//! state; it is simple enough for a classic-BPF fanout program
//! (`sluice_io::steer` computes the same function). Dropping the low bit
//! matters: Linux hands out even ephemeral ports to `connect()`, in runs of
//! consecutive even ports per destination (RFC 6056 algorithm 3), so a
//! plain `p mod workers` would put every TCP client of a Linux host on the
//! even workers (the inside interface is steered by the same function);
//! `p >> 1` spreads both random and consecutive even (or odd) ports. Worker `w`'s slice of a range `lo..=hi` is the ascending
//! list of the range's ports it owns; [`PortSlice`] indexes it densely.
//!
//! # Allocation
//!
//! A `PortSpace` holds one bitmap per (external address, protocol), sized
//! at construction (one bit per owned port), plus a free count and a
//! next-fit cursor. Allocation scans from the cursor with `trailing_zeros`
//! on 64-port words, so it is O(1) while the bitmap is not nearly full and
//! O(slice / 64) in the worst case; release is O(1). Nothing allocates after
//! construction. The next-fit cursor hands out ports in rotation, so a port
//! just released is the last to be reused (it avoids stale-segment
//! confusion, RFC 6056 section 2.1).

use core::ops::RangeInclusive;

/// The worker that owns external port `ext_port` when `workers` workers
/// share the port space. Pure: `(ext_port >> 1) % workers`
/// (worker 0 if `workers` is 0).
#[inline]
pub const fn owner_of(ext_port: u16, workers: u16) -> u16 {
    if workers == 0 {
        0
    } else {
        (ext_port >> 1) % workers
    }
}

/// How many ports below `x` worker `w` of `workers` owns ([`owner_of`]),
/// in O(1): ports `2q` and `2q + 1` belong to worker `q mod workers`.
pub const fn owned_below(x: u32, w: u16, workers: u16) -> u32 {
    let n = if workers == 0 { 1 } else { workers as u32 };
    let w = w as u32;
    let q = x >> 1;
    let pairs = q / n + if q % n > w { 1 } else { 0 };
    2 * pairs + if x & 1 == 1 && q % n == w { 1 } else { 0 }
}

/// The ports of one range owned by one worker, ascending.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PortSlice {
    ports: Vec<u16>,
    /// [`owned_below`] of the range's first port: a port's dense index is
    /// its own count minus this one.
    base: u32,
    worker: u16,
    workers: u16,
}

impl PortSlice {
    /// Worker `worker`'s share of `range` when there are `workers` workers.
    pub fn new(range: &RangeInclusive<u16>, worker: u16, workers: u16) -> Self {
        let w = workers.max(1);
        let me = worker % w;
        Self {
            ports: range.clone().filter(|&p| owner_of(p, w) == me).collect(),
            base: owned_below(u32::from(*range.start()), me, w),
            worker: me,
            workers: w,
        }
    }

    /// A slice without ports (a pool slot without a pool).
    pub(crate) fn empty() -> Self {
        Self {
            ports: Vec::new(),
            base: 0,
            worker: 0,
            workers: 1,
        }
    }

    /// Number of ports in the slice.
    #[inline]
    pub fn len(&self) -> u32 {
        self.ports.len() as u32
    }

    /// True if the slice holds no port.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.ports.is_empty()
    }

    /// The `idx`-th port, if `idx < len`.
    #[inline]
    pub fn port(&self, idx: u32) -> Option<u16> {
        self.ports.get(idx as usize).copied()
    }

    /// The dense index of `port`, if the slice holds it: arithmetic on
    /// the ownership function ([`owned_below`]), no search.
    #[inline]
    pub fn index(&self, port: u16) -> Option<u32> {
        if owner_of(port, self.workers) != self.worker {
            return None;
        }
        let i = owned_below(u32::from(port), self.worker, self.workers).checked_sub(self.base)?;
        (self.ports.get(i as usize) == Some(&port)).then_some(i)
    }

    /// Every port of the slice, ascending.
    pub fn iter(&self) -> impl Iterator<Item = u16> + '_ {
        self.ports.iter().copied()
    }
}

/// `maps` bitmaps over one [`PortSlice`]; a set bit is a port in use.
#[derive(Clone, Debug)]
pub(crate) struct PortSpace {
    slice: PortSlice,
    words_per_map: usize,
    words: Vec<u64>,
    free: Vec<u32>,
    cursor: Vec<u32>,
}

impl PortSpace {
    /// Allocate `maps` empty bitmaps over `slice`.
    pub(crate) fn new(slice: PortSlice, maps: usize) -> Self {
        let len = slice.len();
        let words_per_map = (len as usize).div_ceil(64).max(1);
        let mut s = Self {
            slice,
            words_per_map,
            words: vec![0; words_per_map.saturating_mul(maps)],
            free: vec![len; maps],
            cursor: vec![0; maps],
        };
        for m in 0..maps {
            s.reset(m);
        }
        s
    }

    /// Keep the bitmaps `to` keeps, bitmap `m` becoming `to[m]` (never a
    /// higher index), then `kept` of them (a pool's addresses taken out).
    pub(crate) fn compact(&mut self, to: &[Option<usize>], kept: usize) {
        let wp = self.words_per_map;
        for (om, nm) in to.iter().enumerate() {
            let Some(nm) = *nm else {
                continue;
            };
            if nm == om || (om + 1) * wp > self.words.len() {
                continue;
            }
            self.words.copy_within(om * wp..(om + 1) * wp, nm * wp);
            if let (Some(&f), Some(&c)) = (self.free.get(om), self.cursor.get(om)) {
                if let (Some(x), Some(y)) = (self.free.get_mut(nm), self.cursor.get_mut(nm)) {
                    *x = f;
                    *y = c;
                }
            }
        }
        self.words.truncate(wp.saturating_mul(kept));
        self.free.truncate(kept);
        self.cursor.truncate(kept);
    }

    /// Grow to `maps` bitmaps, the new ones empty (a pool's appended
    /// addresses).
    pub(crate) fn grow(&mut self, maps: usize) {
        let had = self.free.len();
        if maps <= had {
            return;
        }
        self.words
            .resize(self.words_per_map.saturating_mul(maps), 0);
        self.free.resize(maps, 0);
        self.cursor.resize(maps, 0);
        for m in had..maps {
            self.reset(m);
        }
    }

    pub(crate) fn slice(&self) -> &PortSlice {
        &self.slice
    }

    /// Free ports left in bitmap `map`.
    pub(crate) fn free_count(&self, map: usize) -> u32 {
        self.free.get(map).copied().unwrap_or(0)
    }

    /// Mark every port of every bitmap free again.
    pub(crate) fn reset_all(&mut self) {
        for m in 0..self.free.len() {
            self.reset(m);
        }
    }

    /// Mark every port of `map` free again.
    pub(crate) fn reset(&mut self, map: usize) {
        let base = map * self.words_per_map;
        let Some(ws) = self.words.get_mut(base..base + self.words_per_map) else {
            return;
        };
        ws.fill(0);
        // Bits past the end of the slice are permanently "in use".
        let tail = self.slice.len() as usize % 64;
        if tail != 0 {
            if let Some(last) = ws.last_mut() {
                *last = !0u64 << tail;
            }
        } else if self.slice.is_empty() {
            ws.fill(!0);
        }
        if let Some(f) = self.free.get_mut(map) {
            *f = self.slice.len();
        }
        if let Some(c) = self.cursor.get_mut(map) {
            *c = 0;
        }
    }

    /// Take a free port from bitmap `map`, next-fit from the cursor.
    pub(crate) fn alloc(&mut self, map: usize) -> Option<u16> {
        if self.free_count(map) == 0 {
            return None;
        }
        let wp = self.words_per_map;
        let base = map * wp;
        let start = *self.cursor.get(map)?;
        let mut w = start as usize / 64;
        for step in 0..=wp {
            let mask = if step == 0 {
                !0u64 << (start % 64)
            } else {
                !0u64
            };
            let word = self.words.get_mut(base + w)?;
            let avail = !*word & mask;
            if avail != 0 {
                let bit = avail.trailing_zeros();
                *word |= 1u64 << bit;
                let idx = (w as u32) * 64 + bit;
                if let Some(f) = self.free.get_mut(map) {
                    *f -= 1;
                }
                if let Some(c) = self.cursor.get_mut(map) {
                    *c = if idx + 1 >= self.slice.len() {
                        0
                    } else {
                        idx + 1
                    };
                }
                return self.slice.port(idx);
            }
            w = (w + 1) % wp;
        }
        None
    }

    /// Take a free port of `map` whose dense index is in `lo..hi`, the
    /// first free one from `from` on, wrapping around to `lo` (next-fit
    /// within a port block). Returns the port and its index.
    pub(crate) fn alloc_in(
        &mut self,
        map: usize,
        lo: u32,
        hi: u32,
        from: u32,
    ) -> Option<(u16, u32)> {
        let hi = hi.min(self.slice.len());
        if lo >= hi || self.free_count(map) == 0 {
            return None;
        }
        let from = if (lo..hi).contains(&from) { from } else { lo };
        let idx = self
            .first_free(map, from, hi)
            .or_else(|| self.first_free(map, lo, from))?;
        let base = map * self.words_per_map;
        let word = self.words.get_mut(base + idx as usize / 64)?;
        *word |= 1u64 << (idx % 64);
        if let Some(f) = self.free.get_mut(map) {
            *f -= 1;
        }
        Some((self.slice.port(idx)?, idx))
    }

    /// The first clear bit of `map` in `from..to`.
    fn first_free(&self, map: usize, from: u32, to: u32) -> Option<u32> {
        let base = map * self.words_per_map;
        let mut i = from;
        while i < to {
            let w = *self.words.get(base + i as usize / 64)?;
            let mut avail = !w & (!0u64 << (i % 64));
            let word_end = (i / 64 + 1) * 64;
            if to < word_end {
                avail &= (1u64 << (to % 64)) - 1;
            }
            if avail != 0 {
                return Some((i / 64) * 64 + avail.trailing_zeros());
            }
            i = word_end;
        }
        None
    }

    /// Take `port` in bitmap `map` (a mapping that keeps its port across a
    /// pool change). `None` when it is outside the slice or already taken.
    pub(crate) fn take(&mut self, map: usize, port: u16) -> Option<u32> {
        let idx = self.slice.index(port)?;
        let word = self
            .words
            .get_mut(map * self.words_per_map + idx as usize / 64)?;
        let bit = 1u64 << (idx % 64);
        if *word & bit != 0 {
            return None;
        }
        *word |= bit;
        if let Some(f) = self.free.get_mut(map) {
            *f -= 1;
        }
        Some(idx)
    }

    /// Return `port` to bitmap `map`. False if it was not allocated there.
    pub(crate) fn release(&mut self, map: usize, port: u16) -> bool {
        self.release_at(map, port).is_some()
    }

    /// [`Self::release`], giving the port's dense index.
    pub(crate) fn release_at(&mut self, map: usize, port: u16) -> Option<u32> {
        let idx = self.slice.index(port)?;
        let word = self
            .words
            .get_mut(map * self.words_per_map + idx as usize / 64)?;
        let bit = 1u64 << (idx % 64);
        if *word & bit == 0 {
            return None;
        }
        *word &= !bit;
        if let Some(f) = self.free.get_mut(map) {
            *f += 1;
        }
        Some(idx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn slice_geometry() {
        let s = PortSlice::new(&(1024..=65535), 1, 4);
        // 1024, 1025 -> 512 (owner 0); 1026, 1027 -> 513 (owner 1).
        assert_eq!(s.port(0), Some(1026));
        assert_eq!(s.index(1027), Some(1));
        assert_eq!(s.index(1034), Some(2));
        assert_eq!(s.index(1028), None);
        assert_eq!(s.index(1019), None);
        let empty = PortSlice::new(&(10..=10), 0, 4);
        assert!(empty.is_empty());
    }

    /// Regression: Linux picks even ephemeral ports for `connect()`, in
    /// runs of consecutive even ports to one destination; with
    /// `p % workers` two workers split them 100 / 0 (and so did folding in
    /// the high byte, for runs within 256 ports).
    #[test]
    fn even_ports_spread_over_workers() {
        for workers in [2u16, 3, 4, 6] {
            for (start, count) in [(32768u16, 14116usize), (40000, 24), (40001, 24)] {
                let mut n = vec![0u32; usize::from(workers)];
                for p in (start..).step_by(2).take(count) {
                    n[usize::from(owner_of(p, workers))] += 1;
                }
                let (lo, hi) = (n.iter().min().copied(), n.iter().max().copied());
                assert!(
                    hi.unwrap_or(0) - lo.unwrap_or(0) <= 1,
                    "{workers} {start}: {n:?}"
                );
            }
        }
    }

    #[test]
    fn alloc_all_then_exhaust_then_release() {
        let slice = PortSlice::new(&(1000..=1129), 0, 1);
        let mut sp = PortSpace::new(slice, 2);
        let mut got: Vec<u16> = (0..130).filter_map(|_| sp.alloc(1)).collect();
        assert_eq!(got.len(), 130);
        assert_eq!(sp.alloc(1), None);
        assert_eq!(sp.free_count(0), 130, "other bitmap untouched");
        got.sort_unstable();
        assert_eq!(got, (1000..=1129).collect::<Vec<_>>());
        assert!(sp.release(1, 1077));
        assert!(!sp.release(1, 1077), "double free refused");
        assert_eq!(sp.alloc(1), Some(1077));
    }

    #[test]
    fn owned_below_counts_like_the_slices() {
        for workers in 1u16..=5 {
            for w in 0..workers {
                let mut n = 0u32;
                for x in 0u32..3000 {
                    assert_eq!(owned_below(x, w, workers), n, "x {x} w {w}/{workers}");
                    if owner_of(x as u16, workers) == w {
                        n += 1;
                    }
                }
            }
        }
    }

    #[test]
    fn alloc_in_stays_in_its_block_and_wraps() {
        // 200 ports, blocks of 64: block 1 is indices 64..128.
        let mut sp = PortSpace::new(PortSlice::new(&(3000..=3199), 0, 1), 2);
        let mut got = Vec::new();
        while let Some((p, i)) = sp.alloc_in(1, 64, 128, 100) {
            assert!((64..128).contains(&i) && p == 3000 + i as u16);
            got.push(i);
        }
        assert_eq!(got.len(), 64);
        assert_eq!(got[0], 100, "starts at the hint");
        assert_eq!(got[28], 64, "wraps to the block's start");
        assert_eq!(sp.free_count(1), 200 - 64);
        assert_eq!(sp.free_count(0), 200, "other bitmap untouched");
        assert!(sp.release(1, 3070));
        assert_eq!(sp.alloc_in(1, 64, 128, 64), Some((3070, 70)));
        // The last, partial block: indices 192..200 only.
        assert_eq!(sp.alloc_in(0, 192, 256, 250), Some((3192, 192)));
        assert_eq!(sp.alloc_in(0, 256, 320, 0), None);
    }

    #[test]
    fn next_fit_does_not_reuse_immediately() {
        let mut sp = PortSpace::new(PortSlice::new(&(2000..=2009), 0, 1), 1);
        let a = sp.alloc(0);
        assert!(a.is_some_and(|p| sp.release(0, p)));
        assert_ne!(sp.alloc(0), a);
    }

    proptest! {
        // Per-worker slices are disjoint, cover the range, and owner_of agrees.
        #[test]
        fn slices_partition_range(lo in 0u16..=65535, span in 0u16..3000, workers in 1u16..=24) {
            let hi = lo.saturating_add(span);
            let range = lo..=hi;
            let mut seen = std::collections::HashSet::new();
            for w in 0..workers {
                let s = PortSlice::new(&range, w, workers);
                for p in s.iter() {
                    prop_assert!(range.contains(&p));
                    prop_assert_eq!(owner_of(p, workers), w);
                    prop_assert_eq!(s.port(s.index(p).unwrap_or(u32::MAX)), Some(p));
                    prop_assert!(seen.insert(p), "port {} in two slices", p);
                }
            }
            prop_assert_eq!(seen.len(), usize::from(hi - lo) + 1);
        }

        #[test]
        fn alloc_release_model(ops in proptest::collection::vec((any::<bool>(), 0usize..64), 1..400)) {
            let slice = PortSlice::new(&(5000..=5099), 2, 3);
            let mut sp = PortSpace::new(slice.clone(), 1);
            let mut held: Vec<u16> = Vec::new();
            for (alloc, pick) in ops {
                if alloc {
                    match sp.alloc(0) {
                        Some(p) => {
                            prop_assert!(!held.contains(&p));
                            prop_assert_eq!(owner_of(p, 3), 2);
                            held.push(p);
                        }
                        None => prop_assert_eq!(held.len() as u32, slice.len()),
                    }
                } else if !held.is_empty() {
                    let p = held.swap_remove(pick % held.len());
                    prop_assert!(sp.release(0, p));
                }
                prop_assert_eq!(sp.free_count(0) as usize, slice.len() as usize - held.len());
            }
        }
    }
}
