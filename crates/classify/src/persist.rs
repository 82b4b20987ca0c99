//! Copy-on-write building blocks for immutable generations.
//!
//! Cloning either structure costs one `Arc` increment per chunk or shard; a
//! write copies only the chunk or shard it touches (`Arc::make_mut`), so the
//! next generation shares everything else with the published one.

use std::hash::{BuildHasher, Hasher};
use std::sync::Arc;

use hashbrown::HashMap;

/// Hasher for keys that are already well-mixed `u64` fingerprints.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct IdBuild;

/// See [`IdBuild`].
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct IdHasher(u64);

impl BuildHasher for IdBuild {
    type Hasher = IdHasher;
    fn build_hasher(&self) -> IdHasher {
        IdHasher(0)
    }
}

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(*b);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = v;
    }
}

/// murmur3 finalizer.
#[inline]
pub(crate) fn fmix(mut h: u64) -> u64 {
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

const SHARDS: usize = 256;
const RESHARD_AT: usize = 1024;

pub(crate) type Shard<V> = HashMap<u64, V, IdBuild>;

/// A hash map keyed by mixed `u64`, split into shards once it outgrows
/// [`RESHARD_AT`] entries (1 shard, then 256; the split copies at most 1024
/// entries). A write copies one shard.
#[derive(Clone, Debug)]
pub(crate) struct Sharded<V> {
    shards: Vec<Arc<Shard<V>>>,
    len: usize,
}

impl<V: Clone> Sharded<V> {
    pub(crate) fn new() -> Self {
        Sharded {
            shards: vec![Arc::new(HashMap::with_hasher(IdBuild))],
            len: 0,
        }
    }
    /// An empty map presized for `n` entries (bulk loads skip rehashing).
    pub(crate) fn with_capacity(n: usize) -> Self {
        if n <= RESHARD_AT {
            return Sharded {
                shards: vec![Arc::new(HashMap::with_capacity_and_hasher(n, IdBuild))],
                len: 0,
            };
        }
        let per = n / SHARDS + n / (4 * SHARDS) + 8;
        Sharded {
            shards: (0..SHARDS)
                .map(|_| Arc::new(HashMap::with_capacity_and_hasher(per, IdBuild)))
                .collect(),
            len: 0,
        }
    }
    #[inline]
    fn idx(&self, h: u64) -> usize {
        if self.shards.len() == 1 {
            0
        } else {
            // hashbrown uses the low bits (index) and the top 7 bits (tag).
            (h >> 24) as usize & (SHARDS - 1)
        }
    }
    #[inline]
    pub(crate) fn get(&self, h: u64) -> Option<&V> {
        self.shards.get(self.idx(h))?.get(&h)
    }
    fn shard_mut(&mut self, h: u64) -> Option<&mut Shard<V>> {
        let i = self.idx(h);
        self.shards.get_mut(i).map(Arc::make_mut)
    }
    pub(crate) fn insert(&mut self, h: u64, v: V) {
        if let Some(s) = self.shard_mut(h) {
            if s.insert(h, v).is_none() {
                self.len += 1;
            }
        }
        if self.shards.len() == 1 && self.len > RESHARD_AT {
            let old = std::mem::take(&mut self.shards);
            self.shards = (0..SHARDS)
                .map(|_| Arc::new(HashMap::with_hasher(IdBuild)))
                .collect();
            for s in old {
                for (k, v) in s.iter() {
                    let i = self.idx(*k);
                    if let Some(dst) = self.shards.get_mut(i) {
                        Arc::make_mut(dst).insert(*k, v.clone());
                    }
                }
            }
        }
    }
    pub(crate) fn remove(&mut self, h: u64) -> Option<V> {
        let v = self.shard_mut(h)?.remove(&h);
        if v.is_some() {
            self.len -= 1;
        }
        v
    }
}

const CHUNK: usize = 1024;

/// A vector in `Arc`'d chunks of 1024; a write copies one chunk.
#[derive(Clone, Debug)]
pub(crate) struct ChunkVec<T> {
    chunks: Vec<Arc<Vec<T>>>,
    len: usize,
}

impl<T: Clone> ChunkVec<T> {
    pub(crate) fn new() -> Self {
        ChunkVec {
            chunks: Vec::new(),
            len: 0,
        }
    }
    #[inline]
    pub(crate) fn get(&self, i: usize) -> Option<&T> {
        self.chunks.get(i / CHUNK)?.get(i % CHUNK)
    }
    pub(crate) fn get_mut(&mut self, i: usize) -> Option<&mut T> {
        Arc::make_mut(self.chunks.get_mut(i / CHUNK)?).get_mut(i % CHUNK)
    }
    pub(crate) fn push(&mut self, v: T) -> usize {
        let i = self.len;
        match self.chunks.last_mut() {
            Some(c) if c.len() < CHUNK => Arc::make_mut(c).push(v),
            _ => {
                let mut c = Vec::with_capacity(CHUNK);
                c.push(v);
                self.chunks.push(Arc::new(c));
            }
        }
        self.len += 1;
        i
    }
}

const FIXED_CHUNK: usize = 1024;

/// A fixed-length array in `Arc`'d chunks of (at most) 1024 elements; a
/// write copies one chunk. A lookup is two dependent loads.
#[derive(Clone, Debug)]
pub(crate) struct Chunks<T> {
    chunks: Vec<Arc<[T]>>,
}

impl<T: Clone> Chunks<T> {
    /// `len` copies of `v`.
    pub(crate) fn filled(len: usize, v: T) -> Self {
        let mut chunks = Vec::with_capacity(len.div_ceil(FIXED_CHUNK));
        let mut left = len;
        while left > 0 {
            let n = left.min(FIXED_CHUNK);
            chunks.push((0..n).map(|_| v.clone()).collect());
            left -= n;
        }
        Chunks { chunks }
    }
    #[inline]
    pub(crate) fn get(&self, i: usize) -> Option<&T> {
        self.chunks.get(i / FIXED_CHUNK)?.get(i % FIXED_CHUNK)
    }
    pub(crate) fn get_mut(&mut self, i: usize) -> Option<&mut T> {
        let c = self.chunks.get_mut(i / FIXED_CHUNK)?;
        if Arc::get_mut(c).is_none() {
            // Shared with another generation: copy this chunk only.
            *c = c.iter().cloned().collect();
        }
        Arc::get_mut(c)?.get_mut(i % FIXED_CHUNK)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sharded_reshards_and_keeps_old_generation() {
        let mut m: Sharded<u32> = Sharded::new();
        for i in 0..3000u64 {
            m.insert(fmix(i), i as u32);
        }
        let old = m.clone();
        m.remove(fmix(5));
        m.insert(fmix(7), 70);
        assert_eq!(old.get(fmix(5)), Some(&5));
        assert_eq!(old.get(fmix(7)), Some(&7));
        assert_eq!(m.get(fmix(5)), None);
        assert_eq!(m.get(fmix(7)), Some(&70));
        assert_eq!(m.len, 2999);
    }

    #[test]
    fn chunks_cow() {
        let mut v = Chunks::filled(3000, 0u32);
        let old = v.clone();
        if let Some(x) = v.get_mut(2999) {
            *x = 7;
        }
        assert_eq!(old.get(2999), Some(&0));
        assert_eq!(v.get(2999), Some(&7));
        assert_eq!(v.get(3000), None);
    }

    #[test]
    fn chunkvec_cow() {
        let mut v = ChunkVec::new();
        for i in 0..3000 {
            v.push(i);
        }
        let old = v.clone();
        if let Some(x) = v.get_mut(2500) {
            *x = 7;
        }
        assert_eq!(old.get(2500), Some(&2500));
        assert_eq!(v.get(2500), Some(&7));
        assert_eq!(v.len, 3000);
    }
}
