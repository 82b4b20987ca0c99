//! XDP flow offload: established IPv4 TCP and UDP flows that the engine
//! hands down are translated and forwarded by the XDP program itself, in
//! the driver's receive path, without a trip through the AF_XDP socket.
//!
//! This is Sluice's counterpart of netfilter's flowtable (`flow add @ft`)
//! and of its hardware offload: the engine decides (policy, NAT, conntrack
//! state) on the first packets of a connection in userspace; once the
//! connection is established and its packets need nothing but the cached
//! rewrite, the worker writes that rewrite into a table the program reads
//! (a BPF array used as a hash table, see [`XdpOffload`]), one entry per
//! direction, keyed by the packet's 5-tuple and ingress interface. The
//! program in front of the socket redirect looks every IPv4 frame up in the
//! table and, on a hit, does what the engine's fast path would do (see
//! `sluice_engine`'s `fast4` and `sluice_nat::apply_dissected`):
//!
//! - the MACs of the next hop and of the egress interface,
//! - the TTL decrement and the new addresses with the IPv4 header checksum
//!   adjusted by the entry's precomputed RFC 1624 delta (TTL included),
//! - the new ports with the TCP or UDP checksum adjusted the same way (a
//!   zero UDP checksum stays zero; a computed zero is sent as all ones),
//! - the entry's packet counter (a plain add: a flow's packets arrive on
//!   one receive queue, so one CPU, at a time; no lock prefix), which the
//!   engine's connection GC reads before it expires an
//!   offloaded connection (has the count moved since it last looked?),
//! - `bpf_redirect` to the egress interface.
//!
//! IPv6 TCP and UDP flows have a table of their own ([`OffloadKey6`]): no
//! NAT66, so a hit only gets the MACs, the hop limit decremented (IPv6 has
//! no header checksum, and the hop limit is not in the upper-layer
//! checksum's pseudo-header), the counter and the redirect, as the
//! engine's `emit6` does.
//!
//! Anything else goes on to the socket redirect, unchanged: a frame to a
//! link-layer broadcast or multicast address (the engine never forwards
//! those), a miss, IPv4
//! with options or fragmented, IPv6 with an extension header, a TTL or
//! hop limit of 1 or less (the engine answers with
//! time exceeded), TCP with SYN, FIN or RST (the engine's state machine
//! must see them, and takes the offload back down when the connection
//! leaves ESTABLISHED), a packet longer than the entry's MTU (the engine
//! fragments or answers with fragmentation needed, or packet too big),
//! VLAN tags.
//!
//! The program (raw eBPF, see [`prefix`]; about 480 instructions, the two
//! probe loops unrolled) is prepended to the socket redirect program of every port
//! of the UMEM; on a miss it
//! restores `r1` and falls through into it. The egress device must accept
//! XDP redirects (`ndo_xdp_xmit`): physical NICs with native XDP do; a veth
//! does when its peer has NAPI (an XDP program, or GRO on).
//!
//! When a key's window of the table is full an install fails and the flow
//! simply stays on the userspace path.

use std::hash::{BuildHasher, Hasher};
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::afxdp::bpf::{mmapable_array, BpfInsn};
use crate::error::IoError;
use crate::sys::{self, Mmap};

/// Bytes per slot of the IPv4 table: one cache line (the mmapable array's
/// values start on a page boundary, so every slot is line-aligned).
pub const SLOT_SIZE: usize = 64;
/// Bytes per slot of the IPv6 table: two cache lines, the key and the
/// rewrite in the first, the packet counter in the second.
pub const SLOT_SIZE6: usize = 128;
/// Slots a key may live in: its home slot and the next `PROBES - 1`.
pub const PROBES: u32 = 8;
/// Fewest and most slots of a table (the most: 1 GiB).
const MIN_SLOTS: u32 = 16;
const MAX_SLOTS: u32 = 1 << 24;
/// `ifindex` field of a slot never used (a lookup stops here).
const EMPTY: u32 = 0;
/// `ifindex` field of a slot whose entry was taken back (a lookup goes
/// on; an install may reuse it).
const TOMBSTONE: u32 = u32::MAX;

/// One direction of an offloaded flow: the packet as it arrives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct OffloadKey {
    /// Kernel ifindex of the receiving interface.
    pub ifindex: u32,
    /// IPv4 source address.
    pub src: u32,
    /// IPv4 destination address.
    pub dst: u32,
    /// Source port.
    pub sport: u16,
    /// Destination port.
    pub dport: u16,
    /// IP protocol: 6 (TCP) or 17 (UDP).
    pub proto: u8,
}

impl OffloadKey {
    /// Slot words 1 and 2 as the program loads them from the frame: the
    /// 8 address bytes and the 4 port bytes (native loads of network-order
    /// bytes), the protocol above the ports.
    fn words(&self) -> [u64; 2] {
        let mut a = [0u8; 8];
        a[..4].copy_from_slice(&self.src.to_be_bytes());
        a[4..].copy_from_slice(&self.dst.to_be_bytes());
        let mut p = [0u8; 4];
        p[..2].copy_from_slice(&self.sport.to_be_bytes());
        p[2..].copy_from_slice(&self.dport.to_be_bytes());
        [
            u64::from_ne_bytes(a),
            u64::from(u32::from_ne_bytes(p)) | u64::from(self.proto) << 32,
        ]
    }
}

/// One direction of an offloaded IPv6 flow: the packet as it arrives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct OffloadKey6 {
    /// Kernel ifindex of the receiving interface.
    pub ifindex: u32,
    /// IPv6 source address.
    pub src: u128,
    /// IPv6 destination address.
    pub dst: u128,
    /// Source port.
    pub sport: u16,
    /// Destination port.
    pub dport: u16,
    /// Next header: 6 (TCP) or 17 (UDP), with no extension header before
    /// it.
    pub proto: u8,
}

impl OffloadKey6 {
    /// Slot words 1-5 as the program loads them from the frame: the
    /// source and the destination address in two native loads each, then
    /// the ports and the protocol as in [`OffloadKey`].
    fn words(&self) -> [u64; 5] {
        let half = |a: u128, hi: bool| {
            let b = a.to_be_bytes();
            let mut w = [0u8; 8];
            w.copy_from_slice(if hi { &b[..8] } else { &b[8..] });
            u64::from_ne_bytes(w)
        };
        let mut p = [0u8; 4];
        p[..2].copy_from_slice(&self.sport.to_be_bytes());
        p[2..].copy_from_slice(&self.dport.to_be_bytes());
        [
            half(self.src, true),
            half(self.src, false),
            half(self.dst, true),
            half(self.dst, false),
            u64::from(u32::from_ne_bytes(p)) | u64::from(self.proto) << 32,
        ]
    }
}

/// What the program does to a packet of an [`OffloadKey6`]: no address or
/// port changes (no NAT66).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OffloadAction6 {
    /// Next hop's MAC.
    pub dst_mac: [u8; 6],
    /// Egress interface's MAC.
    pub src_mac: [u8; 6],
    /// Kernel ifindex of the egress interface.
    pub oif: u32,
    /// Largest IPv6 packet (header included) forwarded here (the egress
    /// MTU).
    pub mtu: u16,
}

/// What the program does to a packet of an [`OffloadKey`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OffloadAction {
    /// New IPv4 source address.
    pub src: u32,
    /// New IPv4 destination address.
    pub dst: u32,
    /// New source port.
    pub sport: u16,
    /// New destination port.
    pub dport: u16,
    /// RFC 1624 delta of the IPv4 header checksum, the TTL decrement
    /// included (as `sluice_nat::apply_dissected` takes it).
    pub ip_delta: u16,
    /// RFC 1624 delta of the TCP or UDP checksum.
    pub l4_delta: u16,
    /// Next hop's MAC.
    pub dst_mac: [u8; 6],
    /// Egress interface's MAC.
    pub src_mac: [u8; 6],
    /// Kernel ifindex of the egress interface.
    pub oif: u32,
    /// Largest IPv4 total length forwarded here (the egress MTU).
    pub mtu: u16,
}

/// Counters of one offloaded direction.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OffloadStats {
    /// Packets the program forwarded since the direction was installed.
    pub packets: u64,
}

// Slot layout (byte offsets; the program reads these).
//
// word 0: sequence (bits 0-15, odd while a writer is in the slot), MTU
//         (bits 16-31), ifindex of the key (bits 32-63; EMPTY, TOMBSTONE)
// word 1: source and destination address, as in the frame
// word 2: ports as in the frame, protocol in bits 32-39
// word 3: packets forwarded
// words 4-7: the rewrite (`D_*`), in frame order
const S_W0: i16 = 0;
/// The key's first word (words 1 and 2 in the IPv4 table, 1-5 in the
/// IPv6 one).
const S_KEY: i16 = 8;
const S_PACKETS: i16 = 24;
const S_DATA: i16 = 32;
// IPv6 slot layout (16 words):
//
// word 0: as in the IPv4 table
// words 1-2: source address, words 3-4: destination address, as in the
//         frame
// word 5: ports as in the frame, protocol in bits 32-39
// words 6-7: the rewrite (`D6_*`): MACs and egress ifindex
// word 8: packets forwarded (the second cache line: the lookup and the
//         rewrite read one line, the counter writes the other)
const S6_DATA: i16 = 48;
const S6_PACKETS: i16 = 64;
const D6_DMAC: i16 = 0;
const D6_SMAC: i16 = 6;
const D6_OIF: i16 = 12;
// Rewrite offsets within the data words.
const D_SRC: i16 = 0;
const D_DST: i16 = 4;
const D_PORTS: i16 = 8;
const D_IP_DELTA: i16 = 12;
const D_L4_DELTA: i16 = 14;
const D_DMAC: i16 = 16;
const D_SMAC: i16 = 22;
const D_OIF: i16 = 28;

/// The rewrite words (slot words 4-7): addresses and ports in network
/// order, the checksum deltas byte-swapped the same way (one's complement
/// sums commute with a byte swap, RFC 1071 §2(B), so the program adds them
/// to checksums it loads in native order), the MACs, the egress ifindex
/// native.
fn data_words(a: &OffloadAction) -> [u64; 4] {
    let mut b = [0u8; 32];
    let at = |o: i16| o as usize;
    b[at(D_SRC)..at(D_SRC) + 4].copy_from_slice(&a.src.to_be_bytes());
    b[at(D_DST)..at(D_DST) + 4].copy_from_slice(&a.dst.to_be_bytes());
    b[at(D_PORTS)..at(D_PORTS) + 2].copy_from_slice(&a.sport.to_be_bytes());
    b[at(D_PORTS) + 2..at(D_PORTS) + 4].copy_from_slice(&a.dport.to_be_bytes());
    b[at(D_IP_DELTA)..at(D_IP_DELTA) + 2].copy_from_slice(&a.ip_delta.to_be_bytes());
    b[at(D_L4_DELTA)..at(D_L4_DELTA) + 2].copy_from_slice(&a.l4_delta.to_be_bytes());
    b[at(D_DMAC)..at(D_DMAC) + 6].copy_from_slice(&a.dst_mac);
    b[at(D_SMAC)..at(D_SMAC) + 6].copy_from_slice(&a.src_mac);
    b[at(D_OIF)..at(D_OIF) + 4].copy_from_slice(&a.oif.to_ne_bytes());
    native_words(&b)
}

/// `b` as native-order words, 8 bytes each (how the program loads them).
fn native_words<const B: usize, const W: usize>(b: &[u8; B]) -> [u64; W] {
    let mut w = [0u64; W];
    for (x, c) in w.iter_mut().zip(b.chunks_exact(8)) {
        let mut v = [0u8; 8];
        v.copy_from_slice(c);
        *x = u64::from_ne_bytes(v);
    }
    w
}

/// The IPv6 rewrite words (slot words 6 and 7): the MACs and the egress
/// ifindex, native.
fn data_words6(a: &OffloadAction6) -> [u64; 2] {
    let mut b = [0u8; 16];
    let at = |o: i16| o as usize;
    b[at(D6_DMAC)..at(D6_DMAC) + 6].copy_from_slice(&a.dst_mac);
    b[at(D6_SMAC)..at(D6_SMAC) + 6].copy_from_slice(&a.src_mac);
    b[at(D6_OIF)..at(D6_OIF) + 4].copy_from_slice(&a.oif.to_ne_bytes());
    native_words(&b)
}

/// Where a table's slots keep the key, the counter and the rewrite.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Shape {
    /// Words per slot.
    words: usize,
    /// The key's words are slot words `1..=key`.
    key: usize,
    /// The packet counter's word.
    counter: usize,
    /// The rewrite's first word.
    data: usize,
    /// Index into [`Layout::mult`] of the multiplier of each key word.
    mult: &'static [usize],
}

/// The IPv4 table's slots.
pub(crate) const V4: Shape = Shape {
    words: SLOT_SIZE / 8,
    key: 2,
    counter: (S_PACKETS / 8) as usize,
    data: (S_DATA / 8) as usize,
    mult: &[0, 1],
};

/// The IPv6 table's slots.
pub(crate) const V6: Shape = Shape {
    words: SLOT_SIZE6 / 8,
    key: 5,
    counter: (S6_PACKETS / 8) as usize,
    data: (S6_DATA / 8) as usize,
    mult: &[0, 4, 5, 6, 1],
};

/// Table geometry and the hash the program computes: a slot count that is
/// a power of two and seven random odd multipliers. The home slot of a key
/// is the top bits of `(h ^ h >> 32) * m3`, where
/// `h = addrs * m0 + ports * m1 + ifindex * m2` for IPv4 and
/// `h = src_hi * m0 + src_lo * m4 + dst_hi * m5 + dst_lo * m6 +
/// ports * m1 + ifindex * m2` for IPv6 (multiply-shift,
/// Dietzfelbinger et al. 1997: a universal family for random odd
/// multipliers, and cheap in eBPF). The
/// final xor-shift and multiply (a step of the usual 64-bit finalizers) are
/// there because `h` alone maps keys that differ in consecutive ports, an
/// arithmetic progression, onto a few clusters for some multipliers: 100
/// such keys overflowed an 8-slot window in 15 of 2000 random layouts
/// (the test `consecutive_ports_never_overflow_a_window`), and an install
/// failed in CI. A key whose window of [`PROBES`] slots is full is not
/// offloaded, so a peer that picks colliding flows only keeps its own
/// flows in userspace.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Layout {
    pub(crate) slots: u32,
    pub(crate) mult: [u64; 7],
}

impl Layout {
    /// Slots for `directions` at a load of at most one half.
    fn slots_for(directions: u32) -> u32 {
        directions
            .max(1)
            .saturating_mul(2)
            .checked_next_power_of_two()
            .unwrap_or(MAX_SLOTS)
            .clamp(MIN_SLOTS, MAX_SLOTS)
    }

    /// Room for `directions` at a load of at most one half.
    pub(crate) fn for_directions(directions: u32) -> Self {
        let slots = Self::slots_for(directions);
        let mut mult = [0u64; 7];
        for (i, m) in mult.iter_mut().enumerate() {
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_usize(i);
            *m = h.finish() | 1;
        }
        Self { slots, mult }
    }

    fn shift(&self) -> u32 {
        64 - self.slots.trailing_zeros()
    }

    /// The home slot of the key of `ifindex` and slot words `key` in a
    /// table of `shape`.
    fn home(&self, shape: &Shape, ifindex: u32, key: &[u64]) -> u32 {
        let mut h = u64::from(ifindex).wrapping_mul(self.mult[2]);
        for (w, &m) in key.iter().zip(shape.mult) {
            h = h.wrapping_add(w.wrapping_mul(self.mult[m]));
        }
        ((h ^ h >> 32).wrapping_mul(self.mult[3]) >> self.shift()) as u32
    }
}

/// Where a key is, or where it may go, found by [`probe`].
enum Found {
    /// The slot holding the key, and its word 0.
    At(usize, u64),
    /// Not there; the first reusable slot of the window and its word 0.
    Free(usize, u64),
    /// Not there and no room.
    Full,
    /// A slot of the window is being written: it may hold the key, so look
    /// again.
    Busy,
}

/// How often an install looks again at a window with a slot being written
/// (another worker's write lasts nanoseconds), and a removal, which must
/// not leave a stale entry behind, with yields in between.
const INSTALL_TRIES: u32 = 64;
const REMOVE_TRIES: u32 = 100_000;

/// The table's operations on its words (shared with the XDP programs,
/// which read them without locks; see [`XdpOffload`]). A key is its
/// ifindex and its slot words (`OffloadKey::words`, `OffloadKey6::words`).
#[derive(Clone, Copy)]
pub(crate) struct Table<'a> {
    pub(crate) words: &'a [AtomicU64],
    pub(crate) layout: Layout,
    pub(crate) shape: Shape,
}

impl Table<'_> {
    fn slot(&self, s: usize, w: usize) -> &AtomicU64 {
        &self.words[s * self.shape.words + w]
    }

    fn probe(&self, ifindex: u32, key: &[u64]) -> Found {
        let mask = self.layout.slots - 1;
        let home = self.layout.home(&self.shape, ifindex, key);
        let mut free = None;
        for i in 0..PROBES {
            let s = (home.wrapping_add(i) & mask) as usize;
            let w0 = self.slot(s, 0).load(Ordering::Acquire);
            let ifx = (w0 >> 32) as u32;
            if w0 & 1 != 0 {
                return Found::Busy;
            }
            if ifx == EMPTY {
                return match free {
                    Some(f) => Found::Free(f, self.slot(f, 0).load(Ordering::Acquire)),
                    None => Found::Free(s, w0),
                };
            }
            if ifx == TOMBSTONE {
                free.get_or_insert(s);
            } else if ifx == ifindex
                && key
                    .iter()
                    .enumerate()
                    .all(|(j, w)| self.slot(s, 1 + j).load(Ordering::Relaxed) == *w)
            {
                return Found::At(s, w0);
            }
        }
        match free {
            Some(f) => Found::Free(f, self.slot(f, 0).load(Ordering::Acquire)),
            None => Found::Full,
        }
    }

    /// Take slot `s` for writing if its word 0 is still `w0` (even): the
    /// sequence becomes odd, so readers skip the slot until [`Self::release`].
    fn claim(&self, s: usize, w0: u64) -> bool {
        w0 & 1 == 0
            && self
                .slot(s, 0)
                .compare_exchange(w0, w0 + 1, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
    }

    /// End a write begun by [`Self::claim`] of word 0 `w0`.
    fn release(&self, s: usize, w0: u64, mtu: u16, ifindex: u32) {
        let seq = (w0 + 2) & 0xffff;
        let w = seq | u64::from(mtu) << 16 | u64::from(ifindex) << 32;
        self.slot(s, 0).store(w, Ordering::Release);
    }

    /// Install the key of `ifindex` and `key` with rewrite words `data`
    /// and `mtu`, replacing an entry of the same key (counter reset).
    pub(crate) fn install(&self, ifindex: u32, key: &[u64], data: &[u64], mtu: u16) -> bool {
        if ifindex == EMPTY || ifindex == TOMBSTONE {
            return false;
        }
        debug_assert_eq!(key.len(), self.shape.key);
        // Another writer may be in the window or win the race for the
        // slot: look again.
        for _ in 0..INSTALL_TRIES {
            let (s, w0) = match self.probe(ifindex, key) {
                Found::At(s, w0) | Found::Free(s, w0) => (s, w0),
                Found::Full => return false,
                Found::Busy => {
                    std::hint::spin_loop();
                    continue;
                }
            };
            if !self.claim(s, w0) {
                continue;
            }
            for (j, w) in key.iter().enumerate() {
                self.slot(s, 1 + j).store(*w, Ordering::Relaxed);
            }
            self.slot(s, self.shape.counter).store(0, Ordering::Relaxed);
            for (j, d) in data.iter().enumerate() {
                self.slot(s, self.shape.data + j)
                    .store(*d, Ordering::Relaxed);
            }
            self.release(s, w0, mtu, ifindex);
            return true;
        }
        false
    }

    pub(crate) fn remove(&self, ifindex: u32, key: &[u64]) -> bool {
        for _ in 0..REMOVE_TRIES {
            match self.probe(ifindex, key) {
                Found::At(s, w0) => {
                    if self.claim(s, w0) {
                        self.release(s, w0, 0, TOMBSTONE);
                        return true;
                    }
                }
                Found::Free(..) | Found::Full => return false,
                Found::Busy => std::thread::yield_now(),
            }
        }
        tracing::error!(
            ifindex,
            ?key,
            "XDP offload: a slot stayed busy; entry not removed"
        );
        false
    }

    pub(crate) fn stats(&self, ifindex: u32, key: &[u64]) -> Option<OffloadStats> {
        match self.probe(ifindex, key) {
            Found::At(s, _) => Some(OffloadStats {
                packets: self.slot(s, self.shape.counter).load(Ordering::Relaxed),
            }),
            Found::Free(..) | Found::Full | Found::Busy => None,
        }
    }

    pub(crate) fn clear(&self) -> usize {
        let mut n = 0;
        for s in 0..self.layout.slots as usize {
            // A slot another worker is writing is waited for, briefly.
            for _ in 0..10_000 {
                let w0 = self.slot(s, 0).load(Ordering::Acquire);
                let ifx = (w0 >> 32) as u32;
                if ifx == EMPTY || ifx == TOMBSTONE {
                    break;
                }
                if self.claim(s, w0) {
                    self.release(s, w0, 0, TOMBSTONE);
                    n += 1;
                    break;
                }
                std::hint::spin_loop();
            }
        }
        n
    }
}

/// The offload table, shared by the XDP programs of every port of a UMEM
/// and written by the workers.
///
/// It is a `BPF_MAP_TYPE_ARRAY` of 64-byte slots (`BPF_F_MMAPABLE`), an
/// open-addressed hash table with bounded linear probing that the workers
/// write through a shared mapping, without system calls, and the program
/// reads with inlined array lookups. A hit costs the program one cache line
/// (key, counter and rewrite share it), where the kernel's hash map walked
/// a bucket and an element on separate lines: at 2 M offloaded directions
/// that walk was a third of the forwarding core's time (`perf`, `bench
/// forward --flows 1M`, see docs/benchmarks.md).
///
/// Writers and readers meet as in a seqlock: a writer claims a slot by
/// making its sequence odd (compare-and-swap, so workers exclude each
/// other), writes, and makes it even again; the program skips odd slots and
/// copies the rewrite out, then checks that word 0 did not change before it
/// touches the frame, or leaves the frame to the socket. The program's loads
/// are plain loads, which x86-64 does not reorder with each other, so the
/// table is built only there ([`XdpOffload::new`] refuses elsewhere).
/// Entries taken back become tombstones (a lookup goes on past them, an
/// install reuses them), so no reader ever loses a key to a concurrent
/// removal; a lookup stops at a never-used slot or after [`PROBES`] slots.
/// The table holds up to twice the directions asked for, up to 16 M slots
/// (1 GiB); its memory is allocated when it is created.
#[derive(Debug)]
pub struct XdpOffload {
    v4: OffloadMap,
    v6: OffloadMap,
}

/// One of the two tables: its map, its mapping and its geometry.
#[derive(Debug)]
struct OffloadMap {
    map: OwnedFd,
    mem: Mmap,
    layout: Layout,
    shape: Shape,
}

impl OffloadMap {
    fn new(directions: u32, shape: Shape, call: &'static str) -> Result<Self, IoError> {
        let layout = Layout::for_directions(directions.max(1));
        let (map, mem) = mmapable_array((shape.words * 8) as u32, layout.slots, call)?;
        Ok(Self {
            map,
            mem,
            layout,
            shape,
        })
    }

    fn table(&self) -> Table<'_> {
        let words = self.layout.slots as usize * self.shape.words;
        debug_assert!(self.mem.len() >= words * 8);
        // SAFETY: the mapping is page-aligned (so 8-byte aligned), at least
        // `slots * words per slot * 8` bytes long (checked at creation by
        // mmap), and lives as long as `self`, which the returned slice
        // borrows. The memory is shared with the kernel, which reads and
        // writes it concurrently; every access through the slice is
        // atomic, the only sound way to touch memory another agent writes.
        let words =
            unsafe { core::slice::from_raw_parts(self.mem.as_ptr().cast::<AtomicU64>(), words) };
        Table {
            words,
            layout: self.layout,
            shape: self.shape,
        }
    }
}

impl XdpOffload {
    /// Tables for `max_entries` offloaded IPv4 directions and `max_entries6`
    /// IPv6 ones (two per connection).
    pub fn new(max_entries: u32, max_entries6: u32) -> Result<Arc<Self>, IoError> {
        if !cfg!(target_arch = "x86_64") {
            return Err(IoError::Unsupported {
                backend: crate::BackendKind::AfXdp,
                why: "the XDP offload's lock-free table relies on x86-64 load ordering",
            });
        }
        Ok(Arc::new(Self {
            v4: OffloadMap::new(
                max_entries,
                V4,
                "bpf(BPF_MAP_CREATE offload array) and its mmap",
            )?,
            v6: OffloadMap::new(
                max_entries6,
                V6,
                "bpf(BPF_MAP_CREATE IPv6 offload array) and its mmap",
            )?,
        }))
    }

    /// Slots in the IPv4 table (it holds at most this many directions).
    pub fn slots(&self) -> u32 {
        self.v4.layout.slots
    }

    /// Slots in the IPv6 table.
    pub fn slots6(&self) -> u32 {
        self.v6.layout.slots
    }

    /// Bytes of both tables.
    pub fn bytes(&self) -> u64 {
        u64::from(self.v4.layout.slots) * SLOT_SIZE as u64
            + u64::from(self.v6.layout.slots) * SLOT_SIZE6 as u64
    }

    /// Bytes the tables of [`Self::new`]`(max_entries, max_entries6)`
    /// take (allocated when they are created), without creating them.
    pub fn bytes_for(max_entries: u32, max_entries6: u32) -> u64 {
        u64::from(Layout::slots_for(max_entries)) * SLOT_SIZE as u64
            + u64::from(Layout::slots_for(max_entries6)) * SLOT_SIZE6 as u64
    }

    /// Offload one direction, replacing an entry of the same key (counter
    /// reset). `false` when its window of [`PROBES`] slots is full or
    /// busy: the flow then stays on the userspace path.
    pub fn install(&self, k: &OffloadKey, a: &OffloadAction) -> bool {
        self.v4
            .table()
            .install(k.ifindex, &k.words(), &data_words(a), a.mtu)
    }

    /// Take one direction back; `false` if it was not offloaded.
    pub fn remove(&self, k: &OffloadKey) -> bool {
        self.v4.table().remove(k.ifindex, &k.words())
    }

    /// The counters of one direction, `None` if it is not offloaded.
    pub fn stats(&self, k: &OffloadKey) -> Option<OffloadStats> {
        self.v4.table().stats(k.ifindex, &k.words())
    }

    /// [`Self::install`] for an IPv6 direction.
    pub fn install6(&self, k: &OffloadKey6, a: &OffloadAction6) -> bool {
        self.v6
            .table()
            .install(k.ifindex, &k.words(), &data_words6(a), a.mtu)
    }

    /// [`Self::remove`] for an IPv6 direction.
    pub fn remove6(&self, k: &OffloadKey6) -> bool {
        self.v6.table().remove(k.ifindex, &k.words())
    }

    /// [`Self::stats`] for an IPv6 direction.
    pub fn stats6(&self, k: &OffloadKey6) -> Option<OffloadStats> {
        self.v6.table().stats(k.ifindex, &k.words())
    }

    /// Remove every entry of both tables; returns how many there were.
    pub fn clear(&self) -> usize {
        self.v4.table().clear() + self.v6.table().clear()
    }
}

/// Kernel ifindex of `name` in the calling thread's network namespace (the
/// ifindex that offload keys and actions name).
pub fn ifindex(name: &str) -> Result<u32, IoError> {
    sys::ifindex(&crate::error::IfName::new(name)?)
}

/// The kernel driver of interface `name` (`ethtool -i`), if it says. The
/// daemon warns about `veth` egress interfaces: a veth accepts XDP
/// redirects only when its peer has NAPI (GRO on or an XDP program), and
/// drops them silently otherwise.
pub fn driver(name: &str) -> Option<String> {
    sys::driver(&crate::error::IfName::new(name).ok()?)
}

// eBPF opcodes (linux/bpf.h, linux/bpf_common.h).
const LDX_B: u8 = 0x71;
const LDX_H: u8 = 0x69;
const LDX_W: u8 = 0x61;
const STX_B: u8 = 0x73;
const STX_H: u8 = 0x6b;
const STX_W: u8 = 0x63;
const STX_DW: u8 = 0x7b;
const LDX_DW: u8 = 0x79;
const ADD_K: u8 = 0x07;
const ADD_X: u8 = 0x0f;
const MUL_X: u8 = 0x2f;
const OR_X: u8 = 0x4f;
const AND_K: u8 = 0x57;
const LSH_K: u8 = 0x67;
const RSH_K: u8 = 0x77;
const XOR_K: u8 = 0xa7;
const XOR_X: u8 = 0xaf;
const MOV_K: u8 = 0xb7;
const MOV_X: u8 = 0xbf;
const TO_BE: u8 = 0xdc;
const JA: u8 = 0x05;
const JEQ_K: u8 = 0x15;
const JNE_K: u8 = 0x55;
const JNE_X: u8 = 0x5d;
const JGT_X: u8 = 0x2d;
const JLE_K: u8 = 0xb5;
const JSET_K: u8 = 0x45;
const CALL: u8 = 0x85;
const EXIT: u8 = 0x95;
const LD_IMM64: u8 = 0x18;
const PSEUDO_MAP_FD: u8 = 1;
const HELPER_MAP_LOOKUP: i32 = 1;
const HELPER_REDIRECT: i32 = 23;

const R0: u8 = 0;
const R1: u8 = 1;
const R2: u8 = 2; // packet start
const R3: u8 = 3; // packet end
const R4: u8 = 4;
const R5: u8 = 5;
const R6: u8 = 6; // ctx
const R7: u8 = 7; // slot
const R8: u8 = 8; // IP protocol
const R9: u8 = 9; // home slot, then the hit's word 0
const R10: u8 = 10; // frame pointer

/// Frame offsets (Ethernet, IPv4 without options).
const ETH_TYPE: i16 = 12;
const IP: i16 = 14;
const IP_LEN: i16 = IP + 2;
const IP_FRAG: i16 = IP + 6;
const IP_TTL: i16 = IP + 8;
const IP_PROTO: i16 = IP + 9;
const IP_CSUM: i16 = IP + 10;
const IP_SRC: i16 = IP + 12;
const IP_DST: i16 = IP + 16;
const L4: i16 = IP + 20;
const UDP_CSUM: i16 = L4 + 6;
const TCP_FLAGS: i16 = L4 + 13;
const TCP_CSUM: i16 = L4 + 16;
/// Frame offsets (Ethernet, IPv6 without extension headers).
const IP6: i16 = 14;
const IP6_PLEN: i16 = IP6 + 4;
const IP6_NEXT: i16 = IP6 + 6;
const IP6_HLIM: i16 = IP6 + 7;
const IP6_SRC: i16 = IP6 + 8;
const L4_6: i16 = IP6 + 40;
const TCP6_FLAGS: i16 = L4_6 + 13;
/// Stack: the key's words (as in slot words 1 and 2, and the ifindex),
/// the slot index a lookup asks for, and the hit's rewrite words.
const K_ADDRS: i16 = -8;
const K_PORTS: i16 = -16;
const K_IFINDEX: i16 = -24;
const K_SLOT: i16 = -28;
const DATA: i16 = -64;
/// Stack: an IPv6 key's address words (its ports, protocol and ifindex
/// are where an IPv4 key's are).
const K6_ADDRS: i16 = -96;

/// Slot words 1-5 of an IPv6 key: where the program keeps each on the
/// stack.
const K6_STACK: [i16; 5] = [
    K6_ADDRS + 24,
    K6_ADDRS + 16,
    K6_ADDRS + 8,
    K6_ADDRS,
    K_PORTS,
];

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Label {
    Key,
    Next(u32),
    Hit,
    Bounded,
    TcpCsum,
    Count,
    Ipv6,
    Key6,
    Next6(u32),
    Hit6,
    Miss,
}

type Asm = crate::afxdp::bpf::Asm<Label>;

/// The offload prefix's own instruction patterns.
trait Emit {
    /// `if r2 + len > r3 goto Miss`.
    fn need_miss(&mut self, len: i32);
    /// `r2 = ctx->data; r3 = ctx->data_end`.
    fn packet(&mut self);
    /// `dst = imm` (64-bit constant, two instructions).
    fn imm64(&mut self, dst: u8, v: u64);
    /// `*(u16 *)(r2 + at) = ~(~*(u16 *)(r2 + at) + delta)` folded, with
    /// the delta at data offset `delta`; leaves the result in r0. `udp`: a
    /// zero checksum is left alone (UDP without checksum) and a computed
    /// zero becomes 0xffff.
    fn adjust(&mut self, at: i16, delta: i16, udp: bool);
    /// `*(size *)(r2 + at) = ` the rewrite's bytes at data offset `from`.
    fn copy(&mut self, ldx: u8, stx: u8, at: i16, from: i16);
}

impl Emit for Asm {
    fn need_miss(&mut self, len: i32) {
        self.need(R2, len, Label::Miss);
    }
    fn packet(&mut self) {
        self.i(LDX_W, R2, R6, 0, 0);
        self.i(LDX_W, R3, R6, 4, 0);
    }
    fn imm64(&mut self, dst: u8, v: u64) {
        self.i(LD_IMM64, dst, 0, 0, v as u32 as i32);
        self.i(0, 0, 0, 0, (v >> 32) as u32 as i32);
    }
    fn adjust(&mut self, at: i16, delta: i16, udp: bool) {
        self.i(LDX_H, R0, R2, at, 0);
        if udp {
            self.jmp(JEQ_K, R0, 0, 0, Label::Count);
        }
        self.i(XOR_K, R0, 0, 0, 0xffff);
        self.i(LDX_H, R1, R10, DATA + delta, 0);
        self.i(ADD_X, R0, R1, 0, 0);
        self.i(MOV_X, R1, R0, 0, 0);
        self.i(RSH_K, R1, 0, 0, 16);
        self.i(AND_K, R0, 0, 0, 0xffff);
        self.i(ADD_X, R0, R1, 0, 0);
        self.i(XOR_K, R0, 0, 0, 0xffff);
        self.i(AND_K, R0, 0, 0, 0xffff);
        if udp {
            self.i(JNE_K, R0, 0, 1, 0);
            self.i(MOV_K, R0, 0, 0, 0xffff);
        }
        self.i(STX_H, R2, R0, at, 0);
    }
    fn copy(&mut self, ldx: u8, stx: u8, at: i16, from: i16) {
        self.i(ldx, R0, R10, DATA + from, 0);
        self.i(stx, R2, R0, at, 0);
    }
}

/// The offload prefix for an IPv4 table of `l4` and an IPv6 table of `l6`.
/// It ends, at label `Miss`, with `r1 = ctx` and falls through to whatever
/// follows it (the socket redirect program). Returns the instructions and
/// the indices of the `ld_imm64`s to patch with each table's map fd.
pub(crate) fn prefix(l4: &Layout, l6: &Layout) -> (Vec<BpfInsn>, Vec<usize>, Vec<usize>) {
    use Label::*;
    let mut a = Asm::with_capacity(560);
    a.i(MOV_X, R6, R1, 0, 0);
    a.packet();
    // Ethernet + IPv4 without options + 8 bytes of L4 header (shorter
    // than any IPv6 frame the program forwards).
    a.need_miss(i32::from(L4) + 8);
    // A link-layer broadcast or multicast frame (the I/G bit of the
    // destination) is never forwarded: the engine takes it.
    a.i(LDX_B, R0, R2, 0, 0);
    a.jmp(JSET_K, R0, 0, 1, Miss);
    a.i(LDX_H, R0, R2, ETH_TYPE, 0);
    a.jmp(JEQ_K, R0, 0, i32::from(0x86ddu16.to_be()), Ipv6);
    a.jmp(JNE_K, R0, 0, i32::from(0x0800u16.to_be()), Miss);
    a.i(LDX_B, R0, R2, IP, 0);
    a.jmp(JNE_K, R0, 0, 0x45, Miss);
    // MF or a fragment offset (native load of the big-endian word).
    a.i(LDX_H, R0, R2, IP_FRAG, 0);
    a.jmp(JSET_K, R0, 0, i32::from(0x3fffu16.to_be()), Miss);
    a.i(LDX_B, R0, R2, IP_TTL, 0);
    a.jmp(JLE_K, R0, 0, 1, Miss);
    a.i(LDX_B, R8, R2, IP_PROTO, 0);
    a.jmp(JEQ_K, R8, 0, 17, Key);
    a.jmp(JNE_K, R8, 0, 6, Miss);
    a.need_miss(i32::from(L4) + 20);
    a.i(LDX_B, R0, R2, TCP_FLAGS, 0);
    // FIN, SYN, RST.
    a.jmp(JSET_K, R0, 0, 0x07, Miss);
    a.label(Key);
    // The key's words on the stack, and the home slot (Layout::home).
    a.i(LDX_DW, R0, R2, IP_SRC, 0);
    a.i(STX_DW, R10, R0, K_ADDRS, 0);
    a.imm64(R1, l4.mult[0]);
    a.i(MUL_X, R0, R1, 0, 0);
    a.ports_and_home(L4, l4);
    let maps = a.window(l4, &V4, &[K_ADDRS, K_PORTS], Next, Hit);
    a.label(Hit);
    // Seqlock read: copy the rewrite out, then check that word 0 (sequence,
    // MTU, ifindex) is what it was when the key matched.
    for w in 0..4i16 {
        a.i(LDX_DW, R0, R7, S_DATA + 8 * w, 0);
        a.i(STX_DW, R10, R0, DATA + 8 * w, 0);
    }
    a.i(LDX_DW, R0, R7, S_W0, 0);
    a.jmp(JNE_X, R0, R9, 0, Miss);
    // The helper calls clobbered r1-r5: reload and re-check the bounds
    // before the first write (TCP needs its checksum at 50..52).
    a.packet();
    a.need_miss(i32::from(L4) + 8);
    a.jmp(JNE_K, R8, 0, 6, Bounded);
    a.need_miss(i32::from(L4) + 20);
    a.label(Bounded);
    // Longer than the egress MTU (word 0, bits 16-31): the engine decides.
    a.i(LDX_H, R0, R2, IP_LEN, 0);
    a.i(TO_BE, R0, 0, 0, 16);
    a.mtu_check();
    a.macs(D_DMAC, D_SMAC);
    // IPv4: TTL, addresses, header checksum.
    a.i(LDX_B, R0, R2, IP_TTL, 0);
    a.i(ADD_K, R0, 0, 0, -1);
    a.i(STX_B, R2, R0, IP_TTL, 0);
    a.copy(LDX_W, STX_W, IP_SRC, D_SRC);
    a.copy(LDX_W, STX_W, IP_DST, D_DST);
    a.adjust(IP_CSUM, D_IP_DELTA, false);
    // Ports and the L4 checksum.
    a.copy(LDX_W, STX_W, L4, D_PORTS);
    a.jmp(JEQ_K, R8, 0, 6, TcpCsum);
    a.adjust(UDP_CSUM, D_L4_DELTA, true);
    a.jmp(JA, 0, 0, 0, Count);
    a.label(TcpCsum);
    a.adjust(TCP_CSUM, D_L4_DELTA, false);
    a.label(Count);
    a.count_and_redirect(S_PACKETS, D_OIF);

    // IPv6: version 6, no extension header, TCP or UDP.
    a.label(Ipv6);
    a.need_miss(i32::from(L4_6) + 8);
    a.i(LDX_B, R0, R2, IP6, 0);
    a.i(AND_K, R0, 0, 0, 0xf0);
    a.jmp(JNE_K, R0, 0, 0x60, Miss);
    a.i(LDX_B, R0, R2, IP6_HLIM, 0);
    a.jmp(JLE_K, R0, 0, 1, Miss);
    a.i(LDX_B, R8, R2, IP6_NEXT, 0);
    a.jmp(JEQ_K, R8, 0, 17, Key6);
    a.jmp(JNE_K, R8, 0, 6, Miss);
    a.need_miss(i32::from(L4_6) + 20);
    a.i(LDX_B, R0, R2, TCP6_FLAGS, 0);
    a.jmp(JSET_K, R0, 0, 0x07, Miss);
    a.label(Key6);
    // The addresses in four words (on the stack as `K6_STACK` says),
    // each times its multiplier (`V6.mult`).
    for (j, (&stack, &m)) in K6_STACK.iter().zip(V6.mult).take(4).enumerate() {
        let r = if j == 0 { R0 } else { R4 };
        a.i(LDX_DW, r, R2, IP6_SRC + 8 * j as i16, 0);
        a.i(STX_DW, R10, r, stack, 0);
        a.imm64(R1, l6.mult[m]);
        a.i(MUL_X, r, R1, 0, 0);
        if j > 0 {
            a.i(ADD_X, R0, R4, 0, 0);
        }
    }
    a.ports_and_home(L4_6, l6);
    let maps6 = a.window(l6, &V6, &K6_STACK, Next6, Hit6);
    a.label(Hit6);
    for w in 0..2i16 {
        a.i(LDX_DW, R0, R7, S6_DATA + 8 * w, 0);
        a.i(STX_DW, R10, R0, DATA + 8 * w, 0);
    }
    a.i(LDX_DW, R0, R7, S_W0, 0);
    a.jmp(JNE_X, R0, R9, 0, Miss);
    a.packet();
    a.need_miss(i32::from(L4_6) + 8);
    // The packet's length: payload length plus the fixed header.
    a.i(LDX_H, R0, R2, IP6_PLEN, 0);
    a.i(TO_BE, R0, 0, 0, 16);
    a.i(ADD_K, R0, 0, 0, 40);
    a.mtu_check();
    a.macs(D6_DMAC, D6_SMAC);
    a.i(LDX_B, R0, R2, IP6_HLIM, 0);
    a.i(ADD_K, R0, 0, 0, -1);
    a.i(STX_B, R2, R0, IP6_HLIM, 0);
    a.count_and_redirect(S6_PACKETS, D6_OIF);

    a.label(Miss);
    a.i(MOV_X, R1, R6, 0, 0);
    (a.finish(), maps, maps6)
}

/// The parts the IPv4 and the IPv6 path share.
trait Paths {
    /// With `r0` the hash of the addresses so far and `r8` the protocol:
    /// the ports (at frame offset `l4`) and protocol word, the ifindex,
    /// both on the stack and into the hash, then the home slot into `r9`.
    fn ports_and_home(&mut self, l4: i16, layout: &Layout);
    /// The window of `layout`'s table of `shape`, unrolled: stop at a
    /// never-used slot, skip a slot being written, compare the ifindex and
    /// the key words (slot words 1.. against `stack`). On a match `r7` is
    /// the slot and `r9` its word 0, and it goes to `hit`. Returns the
    /// indices of the map `ld_imm64`s.
    fn window(
        &mut self,
        layout: &Layout,
        shape: &Shape,
        stack: &[i16],
        next: fn(u32) -> Label,
        hit: Label,
    ) -> Vec<usize>;
    /// `if r0 > MTU (word 0 in r9, bits 16-31) goto Miss`.
    fn mtu_check(&mut self);
    /// The Ethernet destination and source from the rewrite.
    fn macs(&mut self, dmac: i16, smac: i16);
    /// Count the packet in slot word `packets` and redirect it to the
    /// ifindex at rewrite offset `oif`.
    fn count_and_redirect(&mut self, packets: i16, oif: i16);
}

impl Paths for Asm {
    fn ports_and_home(&mut self, l4: i16, layout: &Layout) {
        let a = self;
        a.i(LDX_W, R4, R2, l4, 0);
        a.i(MOV_X, R5, R8, 0, 0);
        a.i(LSH_K, R5, 0, 0, 32);
        a.i(OR_X, R4, R5, 0, 0);
        a.i(STX_DW, R10, R4, K_PORTS, 0);
        a.imm64(R1, layout.mult[1]);
        a.i(MUL_X, R4, R1, 0, 0);
        a.i(ADD_X, R0, R4, 0, 0);
        // ctx->ingress_ifindex
        a.i(LDX_W, R4, R6, 12, 0);
        a.i(STX_DW, R10, R4, K_IFINDEX, 0);
        a.imm64(R1, layout.mult[2]);
        a.i(MUL_X, R4, R1, 0, 0);
        a.i(ADD_X, R0, R4, 0, 0);
        a.i(MOV_X, R4, R0, 0, 0);
        a.i(RSH_K, R4, 0, 0, 32);
        a.i(XOR_X, R0, R4, 0, 0);
        a.imm64(R1, layout.mult[3]);
        a.i(MUL_X, R0, R1, 0, 0);
        a.i(RSH_K, R0, 0, 0, layout.shift() as i32);
        a.i(MOV_X, R9, R0, 0, 0);
    }

    fn window(
        &mut self,
        layout: &Layout,
        shape: &Shape,
        stack: &[i16],
        next: fn(u32) -> Label,
        hit: Label,
    ) -> Vec<usize> {
        let a = self;
        debug_assert_eq!(stack.len(), shape.key);
        let mut maps = Vec::with_capacity(PROBES as usize);
        for i in 0..PROBES {
            a.i(MOV_X, R0, R9, 0, 0);
            if i > 0 {
                a.i(ADD_K, R0, 0, 0, i as i32);
            }
            a.i(AND_K, R0, 0, 0, (layout.slots - 1) as i32);
            a.i(STX_W, R10, R0, K_SLOT, 0);
            maps.push(a.len());
            a.i(LD_IMM64, R1, PSEUDO_MAP_FD, 0, 0);
            a.i(0, 0, 0, 0, 0);
            a.i(MOV_X, R2, R10, 0, 0);
            a.i(ADD_K, R2, 0, 0, i32::from(K_SLOT));
            a.i(CALL, 0, 0, 0, HELPER_MAP_LOOKUP);
            a.jmp(JEQ_K, R0, 0, 0, Label::Miss);
            a.i(LDX_DW, R1, R0, S_W0, 0);
            a.i(MOV_X, R2, R1, 0, 0);
            a.i(RSH_K, R2, 0, 0, 32);
            a.jmp(JEQ_K, R2, 0, EMPTY as i32, Label::Miss);
            a.i(LDX_DW, R3, R10, K_IFINDEX, 0);
            a.jmp(JNE_X, R2, R3, 0, next(i));
            a.jmp(JSET_K, R1, 0, 1, next(i));
            for (j, &at) in stack.iter().enumerate() {
                a.i(LDX_DW, R2, R0, S_KEY + 8 * j as i16, 0);
                a.i(LDX_DW, R3, R10, at, 0);
                a.jmp(JNE_X, R2, R3, 0, next(i));
            }
            a.i(MOV_X, R7, R0, 0, 0);
            a.i(MOV_X, R9, R1, 0, 0);
            a.jmp(JA, 0, 0, 0, hit);
            a.label(next(i));
        }
        a.jmp(JA, 0, 0, 0, Label::Miss);
        maps
    }

    fn mtu_check(&mut self) {
        self.i(MOV_X, R1, R9, 0, 0);
        self.i(RSH_K, R1, 0, 0, 16);
        self.i(AND_K, R1, 0, 0, 0xffff);
        self.jmp(JGT_X, R0, R1, 0, Label::Miss);
    }

    fn macs(&mut self, dmac: i16, smac: i16) {
        self.copy(LDX_W, STX_W, 0, dmac);
        self.copy(LDX_H, STX_H, 4, dmac + 4);
        self.copy(LDX_H, STX_H, 6, smac);
        self.copy(LDX_W, STX_W, 8, smac + 2);
    }

    fn count_and_redirect(&mut self, packets: i16, oif: i16) {
        self.i(LDX_DW, R0, R7, packets, 0);
        self.i(ADD_K, R0, 0, 0, 1);
        self.i(STX_DW, R7, R0, packets, 0);
        self.i(LDX_W, R1, R10, DATA + oif, 0);
        self.i(MOV_K, R2, 0, 0, 0);
        self.i(CALL, 0, 0, 0, HELPER_REDIRECT);
        self.i(EXIT, 0, 0, 0, 0);
    }
}

/// `prefix` for `offload`'s tables, patched with their maps, followed by
/// `program` (whose `ld_imm64` at `map_at` is moved along); returns the
/// index it moved to.
pub(crate) fn prepend(
    offload: &XdpOffload,
    program: Vec<BpfInsn>,
    map_at: usize,
) -> (Vec<BpfInsn>, usize) {
    let (mut p, maps, maps6) = prefix(&offload.v4.layout, &offload.v6.layout);
    for (at, fd) in maps
        .into_iter()
        .map(|at| (at, &offload.v4.map))
        .chain(maps6.into_iter().map(|at| (at, &offload.v6.map)))
    {
        if let Some(i) = p.get_mut(at) {
            i.imm = sys::raw(fd);
        }
    }
    let shift = p.len();
    p.extend(program);
    (p, map_at + shift)
}

#[cfg(test)]
mod tests;
