//! The internal-side mapping index (`by_int`): internal endpoint (and, under
//! address-and-port-dependent mapping, destination) to external endpoint and
//! session count.
//!
//! This is the one NAT table on the path of every new outbound connection,
//! and at CGN scale it does not fit in the caches (tens of thousands of
//! mappings per worker). It is hand-written instead of a `hashbrown` map
//! for one reason: the engine can *prefetch* the slot a new connection will
//! read ([`IntMap::prefetch`]) a whole batch ahead, and peek at it
//! ([`IntMap::peek_ext`]) to predict the connection's reply key, so that
//! neither this lookup nor the conntrack insert of the reply key waits for
//! memory. `hashbrown` keeps its control bytes apart from its entries (two
//! cache misses per cold lookup) and offers no way to prefetch either. In
//! the `sluice bench nat44` profile at 1 M connections (perf, 2026-11-23,
//! 2-vCPU AMD EPYC KVM guest), the `hashbrown` lookup here was about a fifth
//! of connection-setup time.
//!
//! Layout: open addressing with linear probing over 32-byte slots (two per
//! cache line), at most half full, with backward-shift deletion (no
//! tombstones). The home slot comes from a keyed hash (`hashbrown`'s
//! randomly seeded default hasher) of the protocol, internal endpoint and
//! destination, but not the realm (pool or masquerade address), so that
//! the engine can compute it before policy has chosen the realm; the few
//! mappings one endpoint has in different realms share a probe run. Growth
//! doubles the table and re-inserts (amortized, in the slow path, as the
//! `hashbrown` map it replaces did). That is a pause of the worker: 65-76
//! ms at 1 M mappings on the development VM (`examples/growth.rs`,
//! docs/benchmarks.md, "The NAT tables pause a worker when they double").
//! An incremental growth (the old array kept while each insert and
//! removal moves a few of its slots) removed the pauses but cost `sluice
//! bench nat44` 5-7 % of its setup rate, so it is not used yet.

use core::hash::{BuildHasher, Hasher};

/// Realm kind stored in a slot; 0 marks an empty slot.
const EMPTY: u8 = 0;
/// A pool realm: `realm` is the pool index.
pub(crate) const POOL: u8 = 1;
/// A masquerade realm: `realm` is the egress address.
pub(crate) const MASQ: u8 = 2;

/// The lookup key: the internal side of a mapping.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub(crate) struct IntKey {
    pub kind: u8,
    pub realm: u32,
    pub proto: u8,
    pub int_addr: u32,
    pub int_port: u16,
    pub dst_addr: u32,
    pub dst_port: u16,
}

/// One slot: a key, its external endpoint and the sessions holding it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C, align(32))]
pub(crate) struct Slot {
    int_addr: u32,
    dst_addr: u32,
    realm: u32,
    ext_addr: u32,
    sessions: u32,
    int_port: u16,
    dst_port: u16,
    ext_port: u16,
    proto: u8,
    kind: u8,
}

impl Slot {
    #[inline]
    fn key(&self) -> IntKey {
        IntKey {
            kind: self.kind,
            realm: self.realm,
            proto: self.proto,
            int_addr: self.int_addr,
            int_port: self.int_port,
            dst_addr: self.dst_addr,
            dst_port: self.dst_port,
        }
    }

    #[inline]
    fn is(&self, k: &IntKey) -> bool {
        self.int_addr == k.int_addr
            && self.int_port == k.int_port
            && self.proto == k.proto
            && self.kind == k.kind
            && self.realm == k.realm
            && self.dst_addr == k.dst_addr
            && self.dst_port == k.dst_port
    }

    /// External endpoint (address, port).
    #[inline]
    pub(crate) fn ext(&self) -> (u32, u16) {
        (self.ext_addr, self.ext_port)
    }

    /// Sessions holding the mapping.
    #[inline]
    pub(crate) fn sessions(&self) -> u32 {
        self.sessions
    }

    /// Mutable session count.
    #[inline]
    pub(crate) fn sessions_mut(&mut self) -> &mut u32 {
        &mut self.sessions
    }
}

/// The table. See the module documentation.
#[derive(Clone, Debug)]
pub(crate) struct IntMap {
    slots: Vec<Slot>,
    mask: usize,
    len: usize,
    hasher: hashbrown::DefaultHashBuilder,
}

impl IntMap {
    /// A table for about `cap` mappings before its first growth.
    pub(crate) fn with_capacity(cap: usize) -> Self {
        let n = cap.saturating_mul(2).max(16).next_power_of_two();
        Self {
            slots: vec![Slot::default(); n],
            mask: n - 1,
            len: 0,
            hasher: hashbrown::DefaultHashBuilder::default(),
        }
    }

    /// Mappings held.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The hash of a key's lookup fields (everything but the realm).
    #[inline]
    pub(crate) fn hash(
        &self,
        proto: u8,
        int_addr: u32,
        int_port: u16,
        dst_addr: u32,
        dst_port: u16,
    ) -> u64 {
        let mut h = self.hasher.build_hasher();
        h.write_u64((u64::from(int_addr) << 32) | u64::from(dst_addr));
        h.write_u64((u64::from(proto) << 32) | (u64::from(int_port) << 16) | u64::from(dst_port));
        h.finish()
    }

    #[inline]
    fn hash_key(&self, k: &IntKey) -> u64 {
        self.hash(k.proto, k.int_addr, k.int_port, k.dst_addr, k.dst_port)
    }

    #[inline]
    fn home(&self, h: u64) -> usize {
        // The high bits: the low ones of some hashers are weaker.
        ((h >> 32) as usize) & self.mask
    }

    /// Start loading the home slot of key `k` into the cache.
    #[inline]
    pub(crate) fn prefetch_key(&self, k: &IntKey) {
        self.prefetch(self.hash_key(k));
    }

    /// Start loading the home slot of hash `h` into the cache.
    #[inline]
    pub(crate) fn prefetch(&self, h: u64) {
        if let Some(s) = self.slots.get(self.home(h)) {
            sluice_io::mem::prefetch(s);
        }
    }

    /// Index of the first slot of `h`'s run that `hit` accepts.
    #[inline]
    fn scan(&self, h: u64, hit: impl Fn(&Slot) -> bool) -> Option<usize> {
        let mut i = self.home(h);
        // At most half full, so the run ends at an empty slot; the bound
        // only guards against a logic error.
        for _ in 0..=self.mask {
            let s = self.slots.get(i)?;
            if s.kind == EMPTY {
                return None;
            }
            if hit(s) {
                return Some(i);
            }
            i = (i + 1) & self.mask;
        }
        None
    }

    /// Index of `k`'s slot, if present.
    #[inline]
    fn find(&self, h: u64, k: &IntKey) -> Option<usize> {
        self.scan(h, |s| s.is(k))
    }

    /// The slot of `k`.
    #[inline]
    pub(crate) fn get(&self, k: &IntKey) -> Option<&Slot> {
        let i = self.find(self.hash_key(k), k)?;
        self.slots.get(i)
    }

    /// The slot of `k`, mutable (its session count).
    #[inline]
    pub(crate) fn get_mut(&mut self, k: &IntKey) -> Option<&mut Slot> {
        let i = self.find(self.hash_key(k), k)?;
        self.slots.get_mut(i)
    }

    /// The external endpoint of the first mapping in `h`'s run whose
    /// lookup fields are these, in any realm: a prediction of the mapping
    /// a new connection will use, before policy picks the realm. Read only.
    #[inline]
    pub(crate) fn peek_ext(
        &self,
        h: u64,
        proto: u8,
        int_addr: u32,
        int_port: u16,
        dst_addr: u32,
        dst_port: u16,
    ) -> Option<(u32, u16)> {
        let i = self.scan(h, |s| {
            s.int_addr == int_addr
                && s.int_port == int_port
                && s.proto == proto
                && s.dst_addr == dst_addr
                && s.dst_port == dst_port
        })?;
        self.slots.get(i).map(Slot::ext)
    }

    /// Insert `k` (which must be absent) with its external endpoint and
    /// session count. Grows the table first if it would be over half full.
    pub(crate) fn insert(&mut self, k: IntKey, ext: (u32, u16), sessions: u32) {
        debug_assert!(k.kind != EMPTY);
        if (self.len + 1) * 2 > self.slots.len() {
            self.grow();
        }
        let slot = Slot {
            int_addr: k.int_addr,
            dst_addr: k.dst_addr,
            realm: k.realm,
            ext_addr: ext.0,
            sessions,
            int_port: k.int_port,
            dst_port: k.dst_port,
            ext_port: ext.1,
            proto: k.proto,
            kind: k.kind,
        };
        self.place(slot);
        self.len += 1;
    }

    /// Put `slot` in the first empty slot of its run.
    fn place(&mut self, slot: Slot) {
        let mut i = self.home(self.hash_key(&slot.key()));
        for _ in 0..=self.mask {
            match self.slots.get_mut(i) {
                Some(s) if s.kind == EMPTY => {
                    *s = slot;
                    return;
                }
                Some(_) => i = (i + 1) & self.mask,
                None => return,
            }
        }
    }

    fn grow(&mut self) {
        let n = self.slots.len() * 2;
        let old = core::mem::replace(&mut self.slots, vec![Slot::default(); n]);
        self.mask = n - 1;
        for s in old.into_iter().filter(|s| s.kind != EMPTY) {
            self.place(s);
        }
    }

    /// Remove `k`; returns its slot. Backward-shift deletion: later slots
    /// of the run that may move closer to their home slot do, so lookups
    /// never need tombstones.
    pub(crate) fn remove(&mut self, k: &IntKey) -> Option<Slot> {
        let mut hole = self.find(self.hash_key(k), k)?;
        let removed = *self.slots.get(hole)?;
        let mut j = hole;
        for _ in 0..=self.mask {
            j = (j + 1) & self.mask;
            let Some(&s) = self.slots.get(j) else {
                break;
            };
            if s.kind == EMPTY {
                break;
            }
            let home = self.home(self.hash_key(&s.key()));
            // `s` may fill the hole unless its home lies cyclically in
            // (hole, j].
            let stays = if hole <= j {
                hole < home && home <= j
            } else {
                hole < home || home <= j
            };
            if !stays {
                if let Some(h) = self.slots.get_mut(hole) {
                    *h = s;
                }
                hole = j;
            }
        }
        if let Some(h) = self.slots.get_mut(hole) {
            *h = Slot::default();
        }
        self.len -= 1;
        Some(removed)
    }

    /// Forget everything (keeps the allocation).
    pub(crate) fn clear(&mut self) {
        self.slots.fill(Slot::default());
        self.len = 0;
    }

    /// Every held slot with its key, in no particular order.
    #[cfg(test)]
    pub(crate) fn iter(&self) -> impl Iterator<Item = (IntKey, &Slot)> + '_ {
        self.slots
            .iter()
            .filter(|s| s.kind != EMPTY)
            .map(|s| (s.key(), s))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    fn key(a: u32, p: u16, d: u16, realm: u32) -> IntKey {
        IntKey {
            kind: POOL,
            realm,
            proto: 17,
            int_addr: a,
            int_port: p,
            dst_addr: u32::from(d) * 7,
            dst_port: d,
        }
    }

    proptest! {
        // Against a std HashMap: inserts, removes (backward shift) and
        // growth keep every present key findable with its value, and
        // absent ones absent.
        #[test]
        fn behaves_like_a_map(ops in proptest::collection::vec((0u8..3, 0u32..6, 0u16..40, 0u16..3, 0u32..2), 1..400)) {
            let mut m = IntMap::with_capacity(2);
            let mut r: HashMap<IntKey, (u32, u16)> = HashMap::new();
            for (op, a, p, d, realm) in ops {
                let k = key(a, p, d, realm);
                match op {
                    0 | 1 => {
                        if let std::collections::hash_map::Entry::Vacant(e) = r.entry(k) {
                            let ext = (a ^ 0xff, p.wrapping_add(1000));
                            e.insert(ext);
                            m.insert(k, ext, 1);
                        }
                    }
                    _ => {
                        let got = m.remove(&k).map(|s| s.ext());
                        prop_assert_eq!(got, r.remove(&k));
                    }
                }
                prop_assert_eq!(m.len(), r.len());
            }
            for (k, ext) in &r {
                prop_assert_eq!(m.get(k).map(Slot::ext), Some(*ext));
                let h = m.hash(k.proto, k.int_addr, k.int_port, k.dst_addr, k.dst_port);
                prop_assert!(m.peek_ext(h, k.proto, k.int_addr, k.int_port, k.dst_addr, k.dst_port).is_some());
            }
            prop_assert_eq!(m.iter().count(), r.len());
            for (k, s) in m.iter() {
                prop_assert_eq!(r.get(&k).copied(), Some(s.ext()));
            }
        }
    }

    #[test]
    fn session_counts_and_clear() {
        let mut m = IntMap::with_capacity(4);
        let k = key(1, 2, 3, 0);
        m.insert(k, (9, 9), 1);
        *m.get_mut(&k).unwrap().sessions_mut() += 2;
        assert_eq!(m.get(&k).unwrap().sessions(), 3);
        assert!(
            m.get(&key(1, 2, 3, 1)).is_none(),
            "the realm is part of the key"
        );
        m.clear();
        assert_eq!((m.len(), m.get(&k)), (0, None));
    }
}
