//! The open-addressing index: key hash -> (entry index, direction).
//!
//! Hand-written rather than `hashbrown` because the fast path needs two things
//! hashbrown does not offer: prefetching a bucket from a precomputed hash for
//! a whole batch before probing, and a hard bound on probe length (so a full
//! or attacked table degrades into early drops, never into long scans).
//!
//! Layout: 64-byte, cache-line-aligned buckets of 8 words. Words 0..7 are
//! slots; word 7 is the bucket's *overflow count*. A slot is
//! `tag << 32 | dir << 31 | entry index` (0 = empty; the tag always has bit 0
//! set, so a used slot is never 0). The home bucket comes from the high 32
//! bits of the hash (multiply-shift range reduction, no power of two needed),
//! the tag from the low 32 bits.
//!
//! Probing is linear over at most [`WINDOW`] buckets. The overflow count of a
//! bucket is the number of slots stored past it by keys whose probe passed
//! over it (as in folly's F14), so a lookup stops at the first bucket whose
//! count is zero and removal needs no tombstones. `WINDOW - 1` spare buckets
//! follow the last home bucket, so probes never wrap.
//!
//! Sizing: the index is allocated once, for the configured maximum, at a
//! load of 0.55 when the table is full (two slots per connection):
//! `ceil(40 * max / 77)` buckets, about 33.2 B per connection. It is
//! allocated zeroed (calloc: pages are backed lazily) and advised for huge
//! pages before first touch. There is never a rehash.
//!
//! Why 0.55 and 32 buckets: bounded linear probing has a heavy tail. A
//! simulation of filling to `max` (random hashes, 4 M slots) gives, for the
//! last 10 % of inserts, a full window in 3.3e-2 of them at (0.75 load, 4
//! buckets), 4.4e-3 at (0.75, 8), 5e-5 at (0.6, 8) and 2.5e-6 at (0.55, 8).
//! 2.5e-6 was too much: filling to 40 M connections (80 M keys) met about
//! 21 full 8-bucket windows per fill (two seeds), each one an early drop of a
//! live connection while the table was not full, which `sluice bench nat44
//! --connections 40M --frames 20M` caught on 2026-11-23. The same
//! simulation with unbounded windows (11 seeds, 40 M connections) put the
//! longest probe at 9 to 13 buckets, so a 32-bucket window leaves a wide
//! margin; it costs nothing on a lookup, which stops at the first bucket
//! whose overflow count is zero, and at 0.55 a hit reads its home bucket
//! alone about 98 % of the time. A full window is not an error: it
//! triggers early drop in that window, and only a window of assured
//! entries makes the insert fail. Early drop searches the window's first
//! [`DROP_SCAN`] buckets for its victim, so its cost did not grow with the
//! window.

use sluice_io::mem::{advise_huge_pages, populate, prefetch};

use crate::Dir;

/// Slots per bucket.
pub(crate) const SLOTS: usize = 7;
const WORDS: usize = 8;
const CTRL: usize = 7;
/// Buckets probed at most per key.
pub(crate) const WINDOW: usize = 32;
/// Buckets of a window that early drop searches for a victim (the window's
/// first ones: when the window is full they are full too, and when the
/// table is full any entry of the window frees a slot in it).
pub(crate) const DROP_SCAN: usize = 8;
const IDX_MASK: u64 = 0x7fff_ffff;
const DIR_BIT: u64 = 1 << 31;

pub(crate) struct Index {
    words: Vec<u64>,
    /// Word offset of bucket 0 (makes buckets 64-byte aligned).
    base: usize,
    /// Home buckets (the range of `home`).
    buckets: u64,
}

#[inline]
fn tag_of(h: u64) -> u64 {
    u64::from(h as u32 | 1) << 32
}

#[inline]
fn slot_value(h: u64, idx: u32, dir: Dir) -> u64 {
    tag_of(h) | if dir == Dir::Reply { DIR_BIT } else { 0 } | u64::from(idx)
}

#[inline]
fn decode(slot: u64) -> (u32, Dir) {
    let dir = if slot & DIR_BIT != 0 {
        Dir::Reply
    } else {
        Dir::Original
    };
    ((slot & IDX_MASK) as u32, dir)
}

impl Index {
    /// Home buckets for `max` connections.
    pub(crate) fn buckets_for(max: u32) -> u64 {
        (u64::from(max) * 40).div_ceil(77).max(1)
    }

    /// Bytes allocated for `max` connections.
    pub(crate) fn bytes_for(max: u32) -> usize {
        ((Self::buckets_for(max) as usize + WINDOW - 1) * WORDS + WORDS - 1) * 8
    }

    pub(crate) fn new(max: u32) -> Self {
        let buckets = Self::buckets_for(max);
        let total = (buckets as usize + WINDOW - 1) * WORDS + WORDS - 1;
        // `vec![0; n]` allocates zeroed memory (calloc), which large
        // allocations get as untouched pages.
        let mut words = vec![0u64; total];
        advise_huge_pages(&mut words[..]);
        let addr = words.as_ptr() as usize;
        let base = ((64 - addr % 64) % 64) / 8;
        Self {
            words,
            base,
            buckets,
        }
    }

    #[inline]
    fn home(&self, h: u64) -> usize {
        (((h >> 32) * self.buckets) >> 32) as usize
    }

    #[inline]
    fn at(&self, bucket: usize) -> usize {
        self.base + bucket * WORDS
    }

    /// Back every page of the index now (see [`Config::prefault`]).
    ///
    /// [`Config::prefault`]: crate::Config::prefault
    pub(crate) fn populate(&mut self) {
        populate(&mut self.words[..]);
    }

    #[inline]
    pub(crate) fn prefetch(&self, h: u64) {
        if let Some(w) = self.words.get(self.at(self.home(h))) {
            prefetch(w);
        }
    }

    /// First slot in the probe sequence of `h` whose tag matches and for
    /// which `eq` holds.
    #[inline]
    pub(crate) fn find(&self, h: u64, mut eq: impl FnMut(u32, Dir) -> bool) -> Option<(u32, Dir)> {
        let tag = tag_of(h);
        let home = self.home(h);
        for b in home..home + WINDOW {
            let w = self.at(b);
            let bucket = &self.words[w..w + WORDS];
            for &slot in &bucket[..SLOTS] {
                if slot & !0xffff_ffff == tag {
                    let (idx, dir) = decode(slot);
                    if eq(idx, dir) {
                        return Some((idx, dir));
                    }
                }
            }
            if bucket[CTRL] == 0 {
                break;
            }
        }
        None
    }

    /// Store `(idx, dir)` for hash `h` in the first free slot of its window.
    /// False if the window is full.
    pub(crate) fn insert(&mut self, h: u64, idx: u32, dir: Dir) -> bool {
        let home = self.home(h);
        for b in home..home + WINDOW {
            let w = self.at(b);
            if let Some(s) = self.words[w..w + SLOTS].iter().position(|&s| s == 0) {
                self.words[w + s] = slot_value(h, idx, dir);
                for passed in home..b {
                    let c = self.at(passed) + CTRL;
                    self.words[c] += 1;
                }
                return true;
            }
        }
        false
    }

    /// Remove the slot holding `(idx, dir)` for hash `h`. False if absent.
    pub(crate) fn remove(&mut self, h: u64, idx: u32, dir: Dir) -> bool {
        let want = slot_value(h, idx, dir);
        let home = self.home(h);
        for b in home..home + WINDOW {
            let w = self.at(b);
            if let Some(s) = self.words[w..w + SLOTS].iter().position(|&s| s == want) {
                self.words[w + s] = 0;
                for passed in home..b {
                    let c = self.at(passed) + CTRL;
                    self.words[c] -= 1;
                }
                return true;
            }
        }
        false
    }

    /// Call `f` for every entry that occupies a slot in the first
    /// [`DROP_SCAN`] buckets of the window of `h`.
    pub(crate) fn for_each_in_window(&self, h: u64, mut f: impl FnMut(u32)) {
        let home = self.home(h);
        let start = self.at(home);
        for (i, &slot) in self.words[start..start + DROP_SCAN * WORDS]
            .iter()
            .enumerate()
        {
            if i % WORDS != CTRL && slot != 0 {
                f(decode(slot).0);
            }
        }
    }

    /// Zero every bucket (bulk, one memset).
    pub(crate) fn clear(&mut self) {
        self.words.fill(0);
    }

    /// Occupied slots (test and debug use; O(size)).
    #[cfg(test)]
    pub(crate) fn occupied(&self) -> usize {
        let start = self.base;
        let n = (self.buckets as usize + WINDOW - 1) * WORDS;
        self.words[start..start + n]
            .iter()
            .enumerate()
            .filter(|&(i, &s)| i % WORDS != CTRL && s != 0)
            .count()
    }

    /// Sum of overflow counts (test use).
    #[cfg(test)]
    pub(crate) fn overflow_total(&self) -> u64 {
        let n = self.buckets as usize + WINDOW - 1;
        (0..n).map(|b| self.words[self.at(b) + CTRL]).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_cache_line_aligned() {
        for max in [1, 7, 100, 4096] {
            let ix = Index::new(max);
            assert_eq!(ix.words[ix.base..].as_ptr() as usize % 64, 0);
            assert!(ix.words.len() >= ix.at(ix.buckets as usize + WINDOW - 1));
        }
    }

    #[test]
    fn overflow_counts_track_displacement_and_removal() {
        let mut ix = Index::new(100);
        // All hashes map to home bucket 0 (high bits zero), distinct tags.
        let hs: Vec<u64> = (0..20u64).map(|i| i * 2 + 1).collect();
        for (i, &h) in hs.iter().enumerate() {
            assert!(ix.insert(h, i as u32, Dir::Original));
        }
        // 20 slots: 7 in bucket 0, 7 in bucket 1 (passed 0), 6 in bucket 2
        // (passed 0 and 1): 7 + 2 * 6 = 19.
        assert_eq!(ix.overflow_total(), 19);
        for (i, &h) in hs.iter().enumerate() {
            assert_eq!(
                ix.find(h, |idx, _| idx == i as u32),
                Some((i as u32, Dir::Original))
            );
        }
        for (i, &h) in hs.iter().enumerate().rev() {
            assert!(ix.remove(h, i as u32, Dir::Original));
        }
        assert_eq!(ix.overflow_total(), 0);
        assert_eq!(ix.occupied(), 0);
    }

    #[test]
    fn window_is_bounded() {
        let mut ix = Index::new(100);
        for i in 0..(WINDOW * SLOTS) as u32 {
            assert!(ix.insert(u64::from(i) * 2 + 1, i, Dir::Reply));
        }
        assert!(!ix.insert(999, 999, Dir::Reply));
        let mut seen = 0;
        ix.for_each_in_window(1, |_| seen += 1);
        assert_eq!(seen, DROP_SCAN * SLOTS);
    }
}
