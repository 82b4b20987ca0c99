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
//! Anything else goes on to the socket redirect, unchanged: a frame to a
//! link-layer broadcast or multicast address (the engine never forwards
//! those), a miss, IPv4
//! with options or fragmented, a TTL of 1 or less (the engine answers with
//! time exceeded), TCP with SYN, FIN or RST (the engine's state machine
//! must see them, and takes the offload back down when the connection
//! leaves ESTABLISHED), a packet longer than the entry's MTU (the engine
//! fragments or answers with fragmentation needed), VLAN tags, IPv6.
//!
//! The program (raw eBPF, see [`prefix`]; about 250 instructions, the probe
//! loop unrolled) is prepended to the socket redirect program of every port
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

/// Bytes per slot: one cache line (the mmapable array's values start on a
/// page boundary, so every slot is line-aligned).
pub const SLOT_SIZE: usize = 64;
const WORDS: usize = SLOT_SIZE / 8;
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
    fn words(&self) -> (u64, u64) {
        let mut a = [0u8; 8];
        a[..4].copy_from_slice(&self.src.to_be_bytes());
        a[4..].copy_from_slice(&self.dst.to_be_bytes());
        let mut p = [0u8; 4];
        p[..2].copy_from_slice(&self.sport.to_be_bytes());
        p[2..].copy_from_slice(&self.dport.to_be_bytes());
        (
            u64::from_ne_bytes(a),
            u64::from(u32::from_ne_bytes(p)) | u64::from(self.proto) << 32,
        )
    }
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
const S_ADDRS: i16 = 8;
const S_PORTS: i16 = 16;
const S_PACKETS: i16 = 24;
const S_DATA: i16 = 32;
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
    let mut w = [0u64; 4];
    for (i, x) in w.iter_mut().enumerate() {
        let mut c = [0u8; 8];
        c.copy_from_slice(&b[i * 8..i * 8 + 8]);
        *x = u64::from_ne_bytes(c);
    }
    w
}

/// Table geometry and the hash the program computes: a slot count that is
/// a power of two and four random odd multipliers. The home slot of a key
/// is the top bits of `(h ^ h >> 32) * m3`, where
/// `h = addrs * m0 + ports * m1 + ifindex * m2` (multiply-shift,
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
    pub(crate) mult: [u64; 4],
}

impl Layout {
    /// Room for `directions` at a load of at most one half.
    pub(crate) fn for_directions(directions: u32) -> Self {
        let slots = directions
            .saturating_mul(2)
            .checked_next_power_of_two()
            .unwrap_or(MAX_SLOTS)
            .clamp(MIN_SLOTS, MAX_SLOTS);
        let mut mult = [0u64; 4];
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

    fn home(&self, k: &OffloadKey) -> u32 {
        let (a, p) = k.words();
        let h = a
            .wrapping_mul(self.mult[0])
            .wrapping_add(p.wrapping_mul(self.mult[1]))
            .wrapping_add(u64::from(k.ifindex).wrapping_mul(self.mult[2]));
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
/// which read them without locks; see [`XdpOffload`]).
#[derive(Clone, Copy)]
pub(crate) struct Table<'a> {
    pub(crate) words: &'a [AtomicU64],
    pub(crate) layout: Layout,
}

impl Table<'_> {
    fn slot(&self, s: usize, w: usize) -> &AtomicU64 {
        &self.words[s * WORDS + w]
    }

    fn probe(&self, k: &OffloadKey) -> Found {
        let (a, p) = k.words();
        let mask = self.layout.slots - 1;
        let home = self.layout.home(k);
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
            } else if ifx == k.ifindex
                && self.slot(s, 1).load(Ordering::Relaxed) == a
                && self.slot(s, 2).load(Ordering::Relaxed) == p
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

    pub(crate) fn install(&self, k: &OffloadKey, act: &OffloadAction) -> bool {
        if k.ifindex == EMPTY || k.ifindex == TOMBSTONE {
            return false;
        }
        let (a, p) = k.words();
        // Another writer may be in the window or win the race for the
        // slot: look again.
        for _ in 0..INSTALL_TRIES {
            let (s, w0) = match self.probe(k) {
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
            self.slot(s, 1).store(a, Ordering::Relaxed);
            self.slot(s, 2).store(p, Ordering::Relaxed);
            self.slot(s, 3).store(0, Ordering::Relaxed);
            for (i, d) in data_words(act).into_iter().enumerate() {
                self.slot(s, 4 + i).store(d, Ordering::Relaxed);
            }
            self.release(s, w0, act.mtu, k.ifindex);
            return true;
        }
        false
    }

    pub(crate) fn remove(&self, k: &OffloadKey) -> bool {
        for _ in 0..REMOVE_TRIES {
            match self.probe(k) {
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
        tracing::error!(?k, "XDP offload: a slot stayed busy; entry not removed");
        false
    }

    pub(crate) fn stats(&self, k: &OffloadKey) -> Option<OffloadStats> {
        match self.probe(k) {
            Found::At(s, _) => Some(OffloadStats {
                packets: self.slot(s, 3).load(Ordering::Relaxed),
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
    map: OwnedFd,
    mem: Mmap,
    layout: Layout,
}

impl XdpOffload {
    /// A table for `max_entries` offloaded directions (two per
    /// connection).
    pub fn new(max_entries: u32) -> Result<Arc<Self>, IoError> {
        if !cfg!(target_arch = "x86_64") {
            return Err(IoError::Unsupported {
                backend: crate::BackendKind::AfXdp,
                why: "the XDP offload's lock-free table relies on x86-64 load ordering",
            });
        }
        let layout = Layout::for_directions(max_entries.max(1));
        let (map, mem) = mmapable_array(
            SLOT_SIZE as u32,
            layout.slots,
            "bpf(BPF_MAP_CREATE offload array) and its mmap",
        )?;
        Ok(Arc::new(Self { map, mem, layout }))
    }

    fn table(&self) -> Table<'_> {
        debug_assert!(self.mem.len() >= self.layout.slots as usize * SLOT_SIZE);
        // SAFETY: the mapping is page-aligned (so 8-byte aligned), at least
        // `slots * SLOT_SIZE` bytes long (checked at creation by mmap), and
        // lives as long as `self`, which the returned slice borrows. The
        // memory is shared with the kernel, which reads and writes it
        // concurrently; every access through the slice is atomic, the only
        // sound way to touch memory another agent writes.
        let words = unsafe {
            core::slice::from_raw_parts(
                self.mem.as_ptr().cast::<AtomicU64>(),
                self.layout.slots as usize * WORDS,
            )
        };
        Table {
            words,
            layout: self.layout,
        }
    }

    /// Slots in the table (it holds at most this many directions).
    pub fn slots(&self) -> u32 {
        self.layout.slots
    }

    /// Offload one direction, replacing an entry of the same key (counter
    /// reset). `false` when its window of [`PROBES`] slots is full or
    /// busy: the flow then stays on the userspace path.
    pub fn install(&self, k: &OffloadKey, a: &OffloadAction) -> bool {
        self.table().install(k, a)
    }

    /// Take one direction back; `false` if it was not offloaded.
    pub fn remove(&self, k: &OffloadKey) -> bool {
        self.table().remove(k)
    }

    /// The counters of one direction, `None` if it is not offloaded.
    pub fn stats(&self, k: &OffloadKey) -> Option<OffloadStats> {
        self.table().stats(k)
    }

    /// Remove every entry; returns how many there were.
    pub fn clear(&self) -> usize {
        self.table().clear()
    }

    pub(crate) fn fd(&self) -> i32 {
        sys::raw(&self.map)
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
/// Stack: the key's words (as in slot words 1 and 2, and the ifindex),
/// the slot index a lookup asks for, and the hit's rewrite words.
const K_ADDRS: i16 = -8;
const K_PORTS: i16 = -16;
const K_IFINDEX: i16 = -24;
const K_SLOT: i16 = -28;
const DATA: i16 = -64;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Label {
    Key,
    Next(u32),
    Hit,
    Bounded,
    TcpCsum,
    Count,
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

/// The offload prefix for a table of `layout`. It ends, at label `Miss`,
/// with `r1 = ctx` and falls through to whatever follows it (the socket
/// redirect program). Returns the instructions and the indices of the
/// `ld_imm64`s to patch with the table's map fd.
pub(crate) fn prefix(layout: &Layout) -> (Vec<BpfInsn>, Vec<usize>) {
    use Label::*;
    let mut a = Asm::with_capacity(320);
    a.i(MOV_X, R6, R1, 0, 0);
    a.packet();
    // Ethernet + IPv4 without options + 8 bytes of L4 header.
    a.need_miss(i32::from(L4) + 8);
    // A link-layer broadcast or multicast frame (the I/G bit of the
    // destination) is never forwarded: the engine takes it.
    a.i(LDX_B, R0, R2, 0, 0);
    a.jmp(JSET_K, R0, 0, 1, Miss);
    a.i(LDX_H, R0, R2, ETH_TYPE, 0);
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
    a.imm64(R1, layout.mult[0]);
    a.i(MUL_X, R0, R1, 0, 0);
    a.i(LDX_W, R4, R2, L4, 0);
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
    // The window, unrolled: stop at a never-used slot, skip a slot being
    // written, compare ifindex, addresses, ports and protocol.
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
        a.jmp(JEQ_K, R0, 0, 0, Miss);
        a.i(LDX_DW, R1, R0, S_W0, 0);
        a.i(MOV_X, R2, R1, 0, 0);
        a.i(RSH_K, R2, 0, 0, 32);
        a.jmp(JEQ_K, R2, 0, EMPTY as i32, Miss);
        a.i(LDX_DW, R3, R10, K_IFINDEX, 0);
        a.jmp(JNE_X, R2, R3, 0, Next(i));
        a.jmp(JSET_K, R1, 0, 1, Next(i));
        for (slot, stack) in [(S_ADDRS, K_ADDRS), (S_PORTS, K_PORTS)] {
            a.i(LDX_DW, R2, R0, slot, 0);
            a.i(LDX_DW, R3, R10, stack, 0);
            a.jmp(JNE_X, R2, R3, 0, Next(i));
        }
        a.i(MOV_X, R7, R0, 0, 0);
        a.i(MOV_X, R9, R1, 0, 0);
        a.jmp(JA, 0, 0, 0, Hit);
        a.label(Next(i));
    }
    a.jmp(JA, 0, 0, 0, Miss);
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
    a.i(MOV_X, R1, R9, 0, 0);
    a.i(RSH_K, R1, 0, 0, 16);
    a.i(AND_K, R1, 0, 0, 0xffff);
    a.jmp(JGT_X, R0, R1, 0, Miss);
    // Ethernet: destination, source.
    a.copy(LDX_W, STX_W, 0, D_DMAC);
    a.copy(LDX_H, STX_H, 4, D_DMAC + 4);
    a.copy(LDX_H, STX_H, 6, D_SMAC);
    a.copy(LDX_W, STX_W, 8, D_SMAC + 2);
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
    a.i(LDX_DW, R0, R7, S_PACKETS, 0);
    a.i(ADD_K, R0, 0, 0, 1);
    a.i(STX_DW, R7, R0, S_PACKETS, 0);
    a.i(LDX_W, R1, R10, DATA + D_OIF, 0);
    a.i(MOV_K, R2, 0, 0, 0);
    a.i(CALL, 0, 0, 0, HELPER_REDIRECT);
    a.i(EXIT, 0, 0, 0, 0);
    a.label(Miss);
    a.i(MOV_X, R1, R6, 0, 0);
    (a.finish(), maps)
}

/// `prefix` for `offload`'s table, patched with its map, followed by
/// `program` (whose `ld_imm64` at `map_at` is moved along); returns the
/// index it moved to.
pub(crate) fn prepend(
    offload: &XdpOffload,
    program: Vec<BpfInsn>,
    map_at: usize,
) -> (Vec<BpfInsn>, usize) {
    let (mut p, maps) = prefix(&offload.layout);
    for at in maps {
        if let Some(i) = p.get_mut(at) {
            i.imm = offload.fd();
        }
    }
    let shift = p.len();
    p.extend(program);
    (p, map_at + shift)
}

#[cfg(test)]
mod tests;
