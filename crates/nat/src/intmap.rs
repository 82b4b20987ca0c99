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
//! mappings one endpoint has in different realms share a probe run.
//!
//! Growth doubles the table *incrementally* (see [`IntMap`]): the old array
//! is kept while every insert moves a few of its slots, in order, into the
//! new one, and a key's hash alone says which array holds it, so a lookup
//! still reads one run. Re-inserting everything at once, as `hashbrown`
//! does and this index did, paused the worker 65-76 ms at 1 M mappings on
//! the development VM; now its growth adds no pause: making 2 M mappings,
//! 16 per subscriber, none takes over 1.4 ms (`examples/growth.rs`;
//! docs/benchmarks.md, "The NAT internal-side index grows without
//! pauses").

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
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, zerocopy::FromBytes)]
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
    #[cfg(test)]
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

/// The hash of a key's lookup fields (everything but the realm).
#[inline]
fn lookup_hash(
    hasher: &hashbrown::DefaultHashBuilder,
    proto: u8,
    int_addr: u32,
    int_port: u16,
    dst_addr: u32,
    dst_port: u16,
) -> u64 {
    let mut h = hasher.build_hasher();
    h.write_u64((u64::from(int_addr) << 32) | u64::from(dst_addr));
    h.write_u64((u64::from(proto) << 32) | (u64::from(int_port) << 16) | u64::from(dst_port));
    h.finish()
}

/// Slots at the end of an array that are nobody's home, for runs to
/// spill into: runs do not wrap around (so that slot order is home order,
/// which growth relies on). An insert whose run would leave the array
/// instead rebuilds the index at twice the size ([`IntMap::rebuild`]); at
/// most half (during a growth, five eighths) full, a run of 256 is far
/// beyond anything seen. (The property test uses two, so that it takes
/// that path often.)
const TAIL: usize = 256;

/// Slots of the old array a growth moves per insert, at least
/// ([`IntMap::migrate`]): visiting its `n` slots takes at most `n / 8`
/// inserts, well within the `n / 2` the new array (`2n` slots, half full
/// at `n`) takes before it grows in its turn, and the old array, half full
/// when the growth began, is never more than five eighths full.
const MIGRATE_STEP: usize = 8;

/// One open-addressing array: `2^bits` slots, the last [`TAIL`] of them
/// nobody's home; linear probing, two slots to a cache line. A hash's home
/// slot is its top 32 bits scaled to the number of homes, which keeps the
/// order of hashes: a growth that reads the old array in order writes the
/// new one in order (home `i` of `n` goes to about `2i` of `2n`). The
/// array's size stays a power of two so that the allocator gives and takes
/// back whole blocks.
#[derive(Clone, Debug)]
struct Table {
    slots: Vec<Slot>,
    /// Number of home slots: `slots.len()` less the tail ([`TAIL`]).
    homes: usize,
    /// Slots below this index are backed ([`Table::back_to`]).
    backed: usize,
    /// While this is a growth's old array: slots below this index are
    /// given back to the kernel ([`Table::release_below`]).
    released: usize,
}

/// Slots a growth backs at a time ([`Table::back_to`]): 64 KiB.
const BACK_CHUNK: usize = 2048;

impl Table {
    /// `2^bits` empty slots, allocated zeroed: with the gateway's
    /// allocator (mimalloc) fresh pages are not written, so a growth does
    /// not pay for zeroing the whole new array at once; it backs them a
    /// chunk at a time as it fills them ([`Table::back_to`]).
    fn new(bits: u32, tail: usize) -> Self {
        use zerocopy::FromZeros;
        let n = 1usize << bits;
        Self {
            slots: Slot::new_vec_zeroed(n).unwrap_or_else(|_| vec![Slot::default(); n]),
            homes: n - tail,
            backed: 0,
            released: 0,
        }
    }

    /// Give the pages of the slots below `end` back to the kernel, whole
    /// [`BACK_CHUNK`]s at a time ([`sluice_io::mem::discard`]): the old
    /// array of a growth, whose slots below the cursor are all empty (all
    /// zero, as the pages read afterwards). Its memory so goes back as the
    /// growth moves on, instead of all at once when it ends, which the
    /// allocator did with a delay (`sluice bench nat44` read 2 MB more at
    /// 1 M connections in about half the runs) or in one go (milliseconds
    /// per 100 MB).
    #[inline]
    fn release_below(&mut self, end: usize) {
        let to = end - end % BACK_CHUNK;
        if to > self.released {
            if let Some(chunk) = self.slots.get_mut(self.released..to) {
                sluice_io::mem::discard(chunk);
            }
            self.released = to;
        }
    }

    /// log2 of the number of slots.
    #[inline]
    fn bits(&self) -> u32 {
        self.slots.len().trailing_zeros()
    }

    /// A new array twice the size, with the same tail.
    fn doubled(&self) -> Self {
        Self::new(self.bits() + 1, self.slots.len() - self.homes)
    }

    /// Back the pages of the slots below `end` (rounded up to a
    /// [`BACK_CHUNK`]) that are not yet, in one call
    /// ([`sluice_io::mem::populate`]). Left to page faults, a fresh page
    /// is first read (mapped to the zero page) and then written (copied):
    /// two faults per page, which cost the incremental growth ~60 ns per
    /// mapping over the one of an array zeroed at once (`examples/growth.rs`,
    /// 183 k against 118 k page faults over 2 M mappings).
    #[inline]
    fn back_to(&mut self, end: usize) {
        if end <= self.backed {
            return;
        }
        let to = end.max(self.backed + BACK_CHUNK).min(self.slots.len());
        if let Some(chunk) = self.slots.get_mut(self.backed..to) {
            sluice_io::mem::populate(chunk);
        }
        self.backed = to;
    }

    #[inline]
    fn home(&self, h: u64) -> usize {
        // The top bits (the low ones of some hashers are weaker), times
        // the number of homes (below 2^32), over 2^32: below `homes`.
        (((h >> 32) * self.homes as u64) >> 32) as usize
    }

    /// Index of the first slot of `h`'s run that `hit` accepts.
    #[inline]
    fn scan(&self, h: u64, hit: impl Fn(&Slot) -> bool) -> Option<usize> {
        let mut i = self.home(h);
        while let Some(s) = self.slots.get(i) {
            if s.kind == EMPTY {
                return None;
            }
            if hit(s) {
                return Some(i);
            }
            i += 1;
        }
        None
    }

    /// Put `slot` (hash `h`) in the first empty slot of its run; gives it
    /// back if the run reaches the end of the array.
    #[inline]
    fn place(&mut self, h: u64, slot: Slot) -> Result<(), Slot> {
        let mut i = self.home(h);
        while let Some(s) = self.slots.get_mut(i) {
            if s.kind == EMPTY {
                *s = slot;
                return Ok(());
            }
            i += 1;
        }
        Err(slot)
    }

    /// Empty slot `hole` by backward-shift deletion: later slots of the
    /// run whose home is at or before the hole move into it (`hash` gives
    /// a slot's hash), so lookups never need tombstones. Nothing moves
    /// before its home.
    fn remove_at(&mut self, mut hole: usize, hash: impl Fn(&Slot) -> u64) {
        let mut j = hole + 1;
        while let Some(&s) = self.slots.get(j) {
            if s.kind == EMPTY {
                break;
            }
            if self.home(hash(&s)) <= hole {
                if let Some(h) = self.slots.get_mut(hole) {
                    *h = s;
                }
                hole = j;
            }
            j += 1;
        }
        if let Some(h) = self.slots.get_mut(hole) {
            *h = Slot::default();
        }
    }
}

/// The table. See the module documentation.
///
/// Growth is incremental. A full array is replaced by one twice its size
/// and kept as `old` while every insert moves at least [`MIGRATE_STEP`] of
/// its slots into the new one, in index order from `cursor`, always
/// finishing the run it is in; so no call pays for the whole table (a
/// growth that re-inserted everything at once paused the worker 65-76 ms
/// at 1 M mappings). A mapping is in exactly one of the two arrays, which
/// its hash alone tells: in the old one if its home there is at or after
/// the cursor, else in the new one. That holds because runs do not wrap,
/// every slot of the old array below the cursor is empty (a step stops only
/// at an empty slot, so it never leaves a run half moved), and an insert
/// puts a key whose old home is at or after the cursor into the old array,
/// where neither it nor a backward shift moves it before its home. So a
/// lookup reads one run in one array, as without a growth, and a growth
/// reads the old array and writes the new one in order (home `i` goes to
/// about `2i`): one pass of streaming memory traffic, spread over the
/// inserts.
#[derive(Clone, Debug)]
pub(crate) struct IntMap {
    cur: Table,
    /// While growing: the previous array and the next slot of it to move.
    old: Option<(Table, usize)>,
    len: usize,
    hasher: hashbrown::DefaultHashBuilder,
}

impl IntMap {
    /// A table for about `cap` mappings before its first growth.
    pub(crate) fn with_capacity(cap: usize) -> Self {
        Self::with_tail(cap, TAIL)
    }

    /// [`Self::with_capacity`] with `tail` (below 16) slots at the end of
    /// each array instead of [`TAIL`] (tests).
    fn with_tail(cap: usize, tail: usize) -> Self {
        let n = cap
            .saturating_mul(2)
            .saturating_add(tail)
            .max(16)
            .next_power_of_two();
        Self {
            cur: Table::new(n.trailing_zeros(), tail),
            old: None,
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
        lookup_hash(&self.hasher, proto, int_addr, int_port, dst_addr, dst_port)
    }

    #[inline]
    fn hash_key(&self, k: &IntKey) -> u64 {
        self.hash(k.proto, k.int_addr, k.int_port, k.dst_addr, k.dst_port)
    }

    /// The array that holds (or would hold) a key of hash `h`.
    #[inline]
    fn table(&self, h: u64) -> &Table {
        match &self.old {
            Some((old, cursor)) if old.home(h) >= *cursor => old,
            _ => &self.cur,
        }
    }

    /// [`Self::table`], mutable.
    #[inline]
    fn table_mut(&mut self, h: u64) -> &mut Table {
        match &mut self.old {
            Some((old, cursor)) if old.home(h) >= *cursor => old,
            _ => &mut self.cur,
        }
    }

    /// Start loading the home slot of key `k` into the cache.
    #[inline]
    pub(crate) fn prefetch_key(&self, k: &IntKey) {
        self.prefetch(self.hash_key(k));
    }

    /// Start loading the home slot of hash `h` into the cache.
    #[inline]
    pub(crate) fn prefetch(&self, h: u64) {
        let t = self.table(h);
        if let Some(s) = t.slots.get(t.home(h)) {
            sluice_io::mem::prefetch(s);
        }
    }

    /// The slot of `k`.
    #[inline]
    pub(crate) fn get(&self, k: &IntKey) -> Option<&Slot> {
        let h = self.hash_key(k);
        let t = self.table(h);
        let i = t.scan(h, |s| s.is(k))?;
        t.slots.get(i)
    }

    /// The slot of `k`, mutable (its session count).
    #[inline]
    pub(crate) fn get_mut(&mut self, k: &IntKey) -> Option<&mut Slot> {
        let h = self.hash_key(k);
        let t = self.table_mut(h);
        let i = t.scan(h, |s| s.is(k))?;
        t.slots.get_mut(i)
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
        let t = self.table(h);
        let i = t.scan(h, |s| {
            s.int_addr == int_addr
                && s.int_port == int_port
                && s.proto == proto
                && s.dst_addr == dst_addr
                && s.dst_port == dst_port
        })?;
        t.slots.get(i).map(Slot::ext)
    }

    /// Insert `k` (which must be absent) with its external endpoint and
    /// session count. Moves a step of a growth under way, and starts one
    /// if the table would be over half full.
    pub(crate) fn insert(&mut self, k: IntKey, ext: (u32, u16), sessions: u32) {
        debug_assert!(k.kind != EMPTY);
        self.migrate(MIGRATE_STEP);
        if (self.len + 1) * 2 > self.cur.homes {
            // A growth under way is finished first (not reached with
            // `MIGRATE_STEP` 8: see there).
            self.migrate(usize::MAX);
            let bigger = self.cur.doubled();
            let old = core::mem::replace(&mut self.cur, bigger);
            self.old = Some((old, 0));
            self.migrate(MIGRATE_STEP);
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
        self.len += 1;
        let h = self.hash_key(&k);
        if let Err(slot) = self.table_mut(h).place(h, slot) {
            self.rebuild(Some(slot));
        }
    }

    /// Move at least `step` slots of the old array (while growing), then
    /// on to the end of the run it is in.
    fn migrate(&mut self, step: usize) {
        let Some((old, cursor)) = &mut self.old else {
            return;
        };
        let mut moved = 0usize;
        let mut spilled = None;
        // The slots this step fills (home `i` goes to about `2i`, at most
        // `TAIL + 1` further; runs reach a little further) are backed
        // ahead of it.
        self.cur
            .back_to(cursor.saturating_add(step).saturating_mul(2) + BACK_CHUNK);
        while let Some(s) = old.slots.get_mut(*cursor) {
            if s.kind == EMPTY {
                if moved >= step {
                    // The old array's pages the cursor has passed are
                    // empty: returned to the kernel a chunk at a time.
                    old.release_below(*cursor);
                    return;
                }
            } else {
                let slot = core::mem::take(s);
                let h = slot_hash(&self.hasher, &slot);
                if let Err(slot) = self.cur.place(h, slot) {
                    spilled = Some(slot);
                    break;
                }
            }
            *cursor += 1;
            moved += 1;
        }
        if spilled.is_some() {
            self.rebuild(spilled);
        } else {
            self.old = None;
        }
    }

    /// Put every mapping (and `extra`) in a new array twice the size of
    /// the current one, at once: a run that would leave an array ([`TAIL`])
    /// does not happen in practice.
    #[cold]
    fn rebuild(&mut self, extra: Option<Slot>) {
        let mut all: Vec<Slot> = self.cur.slots.to_vec();
        if let Some((old, _)) = self.old.take() {
            all.extend(old.slots);
        }
        all.extend(extra);
        all.retain(|s| s.kind != EMPTY);
        let mut t = self.cur.doubled();
        'again: loop {
            t.back_to(usize::MAX);
            for &s in &all {
                if t.place(slot_hash(&self.hasher, &s), s).is_err() {
                    t = t.doubled();
                    continue 'again;
                }
            }
            self.cur = t;
            return;
        }
    }

    /// Remove `k`; returns its slot.
    pub(crate) fn remove(&mut self, k: &IntKey) -> Option<Slot> {
        let h = self.hash_key(k);
        let hasher = &self.hasher;
        let t = match &mut self.old {
            Some((old, cursor)) if old.home(h) >= *cursor => old,
            _ => &mut self.cur,
        };
        let i = t.scan(h, |s| s.is(k))?;
        let removed = *t.slots.get(i)?;
        t.remove_at(i, |s| slot_hash(hasher, s));
        self.len -= 1;
        Some(removed)
    }

    /// Forget everything (keeps the current array's allocation; a growth
    /// under way ends).
    pub(crate) fn clear(&mut self) {
        self.cur.slots.fill(Slot::default());
        self.old = None;
        self.len = 0;
    }

    /// Every held slot with its key, in no particular order.
    #[cfg(test)]
    pub(crate) fn iter(&self) -> impl Iterator<Item = (IntKey, &Slot)> + '_ {
        self.cur
            .slots
            .iter()
            .chain(self.old.iter().flat_map(|(t, _)| t.slots.iter()))
            .filter(|s| s.kind != EMPTY)
            .map(|s| (s.key(), s))
    }
}

/// [`lookup_hash`] of a held slot.
#[inline]
fn slot_hash(hasher: &hashbrown::DefaultHashBuilder, s: &Slot) -> u64 {
    lookup_hash(
        hasher, s.proto, s.int_addr, s.int_port, s.dst_addr, s.dst_port,
    )
}

const _: () = assert!(core::mem::size_of::<Slot>() == 32);

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

    /// The invariants of [`IntMap`]: the length; no slot of the old array
    /// below the cursor held, no held one there whose home is before it;
    /// every held slot at or after its home with no empty slot between.
    fn check(m: &IntMap) -> Result<(), TestCaseError> {
        let runs_ok = |t: &Table| -> Result<(), TestCaseError> {
            for (i, s) in t.slots.iter().enumerate() {
                if s.kind == EMPTY {
                    continue;
                }
                let home = t.home(slot_hash(&m.hasher, s));
                prop_assert!(home <= i, "slot {} before its home {}", i, home);
                prop_assert!(t.slots[home..i].iter().all(|s| s.kind != EMPTY));
            }
            Ok(())
        };
        runs_ok(&m.cur)?;
        if let Some((old, cursor)) = &m.old {
            runs_ok(old)?;
            prop_assert!(old.slots[..*cursor].iter().all(|s| s.kind == EMPTY));
            for s in old.slots.iter().filter(|s| s.kind != EMPTY) {
                prop_assert!(old.home(slot_hash(&m.hasher, s)) >= *cursor);
            }
        }
        prop_assert_eq!(m.iter().count(), m.len());
        Ok(())
    }

    proptest! {
        // Against a std HashMap: inserts, removes (backward shift), growth
        // (moving slots while inserts and removes go on) and rebuilds (runs
        // into the tail, two slots here) keep every present key
        // findable with its value, and absent ones absent.
        #[test]
        fn behaves_like_a_map(ops in proptest::collection::vec((0u8..3, 0u32..6, 0u16..40, 0u16..3, 0u32..2), 1..400)) {
            let mut m = IntMap::with_tail(2, 2);
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
                check(&m)?;
                prop_assert_eq!(m.get(&k).map(Slot::ext), r.get(&k).copied());
            }
            for (k, ext) in &r {
                prop_assert_eq!(m.get(k).map(Slot::ext), Some(*ext));
                let h = m.hash(k.proto, k.int_addr, k.int_port, k.dst_addr, k.dst_port);
                prop_assert!(m.peek_ext(h, k.proto, k.int_addr, k.int_port, k.dst_addr, k.dst_port).is_some());
            }
            for (k, s) in m.iter() {
                prop_assert_eq!(r.get(&k).copied(), Some(s.ext()));
            }
        }
    }

    #[test]
    fn a_growth_moves_slots_a_step_at_a_time() {
        let mut m = IntMap::with_capacity(512);
        let homes = m.cur.homes;
        let cursor = |m: &IntMap| m.old.as_ref().map(|(_, c)| *c);
        let mut seen_growing = 0;
        for i in 0..4000u32 {
            let (before, size) = (cursor(&m), m.cur.slots.len());
            m.insert(key(i, 7, 1, 0), (i, 1), 1);
            // (Within one growth: not across a rebuild, should one happen.)
            if let (Some(b), Some(a), true) = (before, cursor(&m), size == m.cur.slots.len()) {
                seen_growing += 1;
                // A step: at least MIGRATE_STEP slots, then to the end of a
                // run (short, the table at most five eighths full).
                assert!(
                    a >= b + MIGRATE_STEP && a <= b + MIGRATE_STEP + TAIL,
                    "{b} -> {a}"
                );
            }
            if i % 97 == 0 {
                assert_eq!(
                    m.remove(&key(i / 2, 7, 1, 0)).map(|s| s.ext()),
                    Some((i / 2, 1))
                );
                m.insert(key(i / 2, 7, 1, 0), (i / 2, 1), 1);
            }
        }
        assert!(
            seen_growing > 100,
            "growths spread over inserts ({seen_growing})"
        );
        assert!(m.cur.homes > homes);
        for i in 0..4000u32 {
            assert_eq!(m.get(&key(i, 7, 1, 0)).map(|s| s.ext()), Some((i, 1)));
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
