//! XDP flow offload: established IPv4 TCP and UDP flows that the engine
//! hands down are translated and forwarded by the XDP program itself, in
//! the driver's receive path, without a trip through the AF_XDP socket.
//!
//! This is Sluice's counterpart of netfilter's flowtable (`flow add @ft`)
//! and of its hardware offload: the engine decides (policy, NAT, conntrack
//! state) on the first packets of a connection in userspace; once the
//! connection is established and its packets need nothing but the cached
//! rewrite, the worker writes that rewrite into a BPF hash map, one entry
//! per direction, keyed by the packet's 5-tuple and ingress interface. The
//! program in front of the socket redirect looks every IPv4 frame up in the
//! map and, on a hit, does what the engine's fast path would do (see
//! `sluice_engine`'s `fast4` and `sluice_nat::apply_dissected`):
//!
//! - the MACs of the next hop and of the egress interface,
//! - the TTL decrement and the new addresses with the IPv4 header checksum
//!   adjusted by the entry's precomputed RFC 1624 delta (TTL included),
//! - the new ports with the TCP or UDP checksum adjusted the same way (a
//!   zero UDP checksum stays zero; a computed zero is sent as all ones),
//! - the entry's packet and byte counters (plain adds: a flow's packets
//!   arrive on one receive queue, so one CPU, at a time; no lock prefix),
//!   which the engine's connection GC reads before it expires an
//!   offloaded connection (has the count moved since it last looked?),
//! - `bpf_redirect` to the egress interface.
//!
//! Anything else goes on to the socket redirect, unchanged: a miss, IPv4
//! with options or fragmented, a TTL of 1 or less (the engine answers with
//! time exceeded), TCP with SYN, FIN or RST (the engine's state machine
//! must see them, and takes the offload back down when the connection
//! leaves ESTABLISHED), a packet longer than the entry's MTU (the engine
//! fragments or answers with fragmentation needed), VLAN tags, IPv6.
//!
//! The program (raw eBPF, see [`prefix`]; 80 instructions) is prepended to
//! the socket redirect program of every port of the UMEM; on a miss it
//! restores `r1` and falls through into it. The egress device must accept
//! XDP redirects (`ndo_xdp_xmit`): physical NICs with native XDP do; a veth
//! does when its peer has NAPI (an XDP program, or GRO on).
//!
//! Map: `BPF_MAP_TYPE_HASH` without preallocation (`BPF_F_NO_PREALLOC`),
//! 20-byte [`key`]s, 64-byte [`value`]s. When it is full an install fails
//! and the flow simply stays on the userspace path.

use std::os::fd::OwnedFd;
use std::sync::Arc;

use crate::afxdp::bpf::{
    map_create_kv, map_elem_raw, BpfInsn, BPF_MAP_DELETE_ELEM, BPF_MAP_GET_NEXT_KEY,
    BPF_MAP_LOOKUP_ELEM, BPF_MAP_UPDATE_ELEM,
};
use crate::error::IoError;
use crate::sys;

const BPF_MAP_TYPE_HASH: u32 = 1;
const BPF_MAP_UPDATE_BATCH: i32 = 26;

/// `bpf_attr` of the `BPF_MAP_*_BATCH` commands.
#[repr(C)]
struct BatchAttr {
    in_batch: u64,
    out_batch: u64,
    keys: u64,
    values: u64,
    count: u32,
    map_fd: u32,
    elem_flags: u64,
    flags: u64,
}
const BPF_F_NO_PREALLOC: u32 = 1;

/// Size of a map key.
pub const KEY_SIZE: usize = 20;
/// Size of a map value.
pub const VALUE_SIZE: usize = 64;

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
    /// Packets the program forwarded.
    pub packets: u64,
    /// Bytes (IPv4 total length plus the Ethernet header) the program forwarded.
    pub bytes: u64,
}

/// The key's bytes as the program builds them on its stack: addresses and
/// ports in network order, then the protocol and the ifindex as native
/// `u32`s.
pub fn key(k: &OffloadKey) -> [u8; KEY_SIZE] {
    let mut b = [0u8; KEY_SIZE];
    b[0..4].copy_from_slice(&k.src.to_be_bytes());
    b[4..8].copy_from_slice(&k.dst.to_be_bytes());
    b[8..10].copy_from_slice(&k.sport.to_be_bytes());
    b[10..12].copy_from_slice(&k.dport.to_be_bytes());
    b[12..16].copy_from_slice(&u32::from(k.proto).to_ne_bytes());
    b[16..20].copy_from_slice(&k.ifindex.to_ne_bytes());
    b
}

// Value layout (offsets used by the program).
const V_SRC: i16 = 0;
const V_DST: i16 = 4;
const V_PORTS: i16 = 8;
const V_IP_DELTA: i16 = 12;
const V_L4_DELTA: i16 = 14;
const V_DMAC: i16 = 16;
const V_SMAC: i16 = 22;
const V_OIF: i16 = 28;
const V_MTU: i16 = 32;
const V_PACKETS: i16 = 40;
const V_BYTES: i16 = 48;

/// The value's bytes: everything the program writes into the frame in
/// frame (network) order; the checksum deltas byte-swapped the same way,
/// since one's complement sums commute with a byte swap (RFC 1071 §2(B)),
/// so the program adds them to checksums it loads in native order; the
/// ifindex and MTU native; zeroed counters.
pub fn value(a: &OffloadAction) -> [u8; VALUE_SIZE] {
    let mut b = [0u8; VALUE_SIZE];
    let at = |o: i16| o as usize;
    b[at(V_SRC)..at(V_SRC) + 4].copy_from_slice(&a.src.to_be_bytes());
    b[at(V_DST)..at(V_DST) + 4].copy_from_slice(&a.dst.to_be_bytes());
    b[at(V_PORTS)..at(V_PORTS) + 2].copy_from_slice(&a.sport.to_be_bytes());
    b[at(V_PORTS) + 2..at(V_PORTS) + 4].copy_from_slice(&a.dport.to_be_bytes());
    b[at(V_IP_DELTA)..at(V_IP_DELTA) + 2].copy_from_slice(&a.ip_delta.to_be_bytes());
    b[at(V_L4_DELTA)..at(V_L4_DELTA) + 2].copy_from_slice(&a.l4_delta.to_be_bytes());
    b[at(V_DMAC)..at(V_DMAC) + 6].copy_from_slice(&a.dst_mac);
    b[at(V_SMAC)..at(V_SMAC) + 6].copy_from_slice(&a.src_mac);
    b[at(V_OIF)..at(V_OIF) + 4].copy_from_slice(&a.oif.to_ne_bytes());
    b[at(V_MTU)..at(V_MTU) + 4].copy_from_slice(&u32::from(a.mtu).to_ne_bytes());
    b
}

fn stats_of(v: &[u8; VALUE_SIZE]) -> OffloadStats {
    let u = |o: i16| {
        let o = o as usize;
        let mut w = [0u8; 8];
        w.copy_from_slice(&v[o..o + 8]);
        u64::from_ne_bytes(w)
    };
    OffloadStats {
        packets: u(V_PACKETS),
        bytes: u(V_BYTES),
    }
}

/// The offload map, shared by the XDP programs of every port of a UMEM
/// and written by the workers.
#[derive(Debug)]
pub struct XdpOffload {
    map: OwnedFd,
    max_entries: u32,
}

impl XdpOffload {
    /// A map for at most `max_entries` offloaded directions (two per
    /// connection).
    pub fn new(max_entries: u32) -> Result<Arc<Self>, IoError> {
        let map = map_create_kv(
            BPF_MAP_TYPE_HASH,
            KEY_SIZE as u32,
            VALUE_SIZE as u32,
            max_entries.max(1),
            BPF_F_NO_PREALLOC,
            "bpf(BPF_MAP_CREATE offload hash)",
        )?;
        Ok(Arc::new(Self {
            map,
            max_entries: max_entries.max(1),
        }))
    }

    /// Capacity in directions.
    pub fn max_entries(&self) -> u32 {
        self.max_entries
    }

    /// Offload one direction (replacing an entry of the same key, counters
    /// reset). Fails with `E2BIG` when the map is full.
    pub fn install(&self, k: &OffloadKey, a: &OffloadAction) -> Result<(), IoError> {
        let kb = key(k);
        let vb = value(a);
        map_elem_raw(
            BPF_MAP_UPDATE_ELEM,
            &self.map,
            kb.as_ptr() as u64,
            vb.as_ptr() as u64,
            0,
            "bpf(BPF_MAP_UPDATE_ELEM offload)",
        )
    }

    /// Offload many directions with one `BPF_MAP_UPDATE_BATCH` (Linux
    /// 5.6+): `keys` and `values` as built by [`key`] and [`value`], the
    /// same number of each. Returns how many were written; on an error
    /// (the map full: `E2BIG`) the ones before it are in and the count says
    /// how many.
    pub fn install_batch(
        &self,
        keys: &[[u8; KEY_SIZE]],
        values: &[[u8; VALUE_SIZE]],
    ) -> (usize, Option<IoError>) {
        let n = keys.len().min(values.len());
        if n == 0 {
            return (0, None);
        }
        let mut a = BatchAttr {
            in_batch: 0,
            out_batch: 0,
            keys: keys.as_ptr() as u64,
            values: values.as_ptr() as u64,
            count: n as u32,
            map_fd: sys::raw(&self.map) as u32,
            elem_flags: 0,
            flags: 0,
        };
        match crate::afxdp::bpf::bpf_raw(
            BPF_MAP_UPDATE_BATCH,
            &mut a,
            "bpf(BPF_MAP_UPDATE_BATCH offload)",
        ) {
            Ok(_) => (n, None),
            Err(e) => ((a.count as usize).min(n), Some(e)),
        }
    }

    /// Take one direction back; `false` if it was not offloaded.
    pub fn remove(&self, k: &OffloadKey) -> Result<bool, IoError> {
        let kb = key(k);
        match map_elem_raw(
            BPF_MAP_DELETE_ELEM,
            &self.map,
            kb.as_ptr() as u64,
            0,
            0,
            "bpf(BPF_MAP_DELETE_ELEM offload)",
        ) {
            Ok(()) => Ok(true),
            Err(e) if e.errno() == Some(libc::ENOENT) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// The counters of one direction, `None` if it is not offloaded.
    pub fn stats(&self, k: &OffloadKey) -> Result<Option<OffloadStats>, IoError> {
        let kb = key(k);
        let mut vb = [0u8; VALUE_SIZE];
        match map_elem_raw(
            BPF_MAP_LOOKUP_ELEM,
            &self.map,
            kb.as_ptr() as u64,
            vb.as_mut_ptr() as u64,
            0,
            "bpf(BPF_MAP_LOOKUP_ELEM offload)",
        ) {
            Ok(()) => Ok(Some(stats_of(&vb))),
            Err(e) if e.errno() == Some(libc::ENOENT) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Remove every entry; returns how many there were.
    pub fn clear(&self) -> Result<usize, IoError> {
        let mut n = 0;
        let mut next = [0u8; KEY_SIZE];
        loop {
            // Always ask for the first key: the previous one is deleted.
            match map_elem_raw(
                BPF_MAP_GET_NEXT_KEY,
                &self.map,
                0,
                next.as_mut_ptr() as u64,
                0,
                "bpf(BPF_MAP_GET_NEXT_KEY offload)",
            ) {
                Ok(()) => {}
                Err(e) if e.errno() == Some(libc::ENOENT) => return Ok(n),
                Err(e) => return Err(e),
            }
            map_elem_raw(
                BPF_MAP_DELETE_ELEM,
                &self.map,
                next.as_ptr() as u64,
                0,
                0,
                "bpf(BPF_MAP_DELETE_ELEM offload)",
            )?;
            n += 1;
        }
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
const AND_K: u8 = 0x57;
const RSH_K: u8 = 0x77;
const XOR_K: u8 = 0xa7;
const MOV_K: u8 = 0xb7;
const MOV_X: u8 = 0xbf;
const TO_BE: u8 = 0xdc;
const JA: u8 = 0x05;
const JEQ_K: u8 = 0x15;
const JNE_K: u8 = 0x55;
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
const R6: u8 = 6; // ctx
const R7: u8 = 7; // map value
const R8: u8 = 8; // IP protocol
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
/// Stack offset of the key.
const KEY: i16 = -24;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Label {
    Key,
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
    /// `*(u16 *)(r2 + at) = ~(~*(u16 *)(r2 + at) + delta)` folded, with
    /// the delta at `r7 + delta`; leaves the result in r0. `udp`: a zero
    /// checksum is left alone (UDP without checksum) and a computed zero
    /// becomes 0xffff.
    fn adjust(&mut self, at: i16, delta: i16, udp: bool);
    /// `*(size *)(r2 + at) = *(size *)(r7 + from)`.
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
    fn adjust(&mut self, at: i16, delta: i16, udp: bool) {
        self.i(LDX_H, R0, R2, at, 0);
        if udp {
            self.jmp(JEQ_K, R0, 0, 0, Label::Count);
        }
        self.i(XOR_K, R0, 0, 0, 0xffff);
        self.i(LDX_H, R1, R7, delta, 0);
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
        self.i(ldx, R0, R7, from, 0);
        self.i(stx, R2, R0, at, 0);
    }
}

/// The offload prefix. It ends, at label `Miss`, with `r1 = ctx` and falls
/// through to whatever follows it (the socket redirect program). Returns
/// the instructions and the index of the `ld_imm64` to patch with the map
/// fd.
pub(crate) fn prefix() -> (Vec<BpfInsn>, usize) {
    use Label::*;
    let mut a = Asm::with_capacity(96);
    a.i(MOV_X, R6, R1, 0, 0);
    a.packet();
    // Ethernet + IPv4 without options + 8 bytes of L4 header.
    a.need_miss(i32::from(L4) + 8);
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
    for (off, from) in [(KEY, IP_SRC), (KEY + 4, IP_DST), (KEY + 8, L4)] {
        a.i(LDX_W, R0, R2, from, 0);
        a.i(STX_W, R10, R0, off, 0);
    }
    a.i(STX_W, R10, R8, KEY + 12, 0);
    // ctx->ingress_ifindex
    a.i(LDX_W, R0, R6, 12, 0);
    a.i(STX_W, R10, R0, KEY + 16, 0);
    let map_at = a.len();
    a.i(LD_IMM64, R1, PSEUDO_MAP_FD, 0, 0);
    a.i(0, 0, 0, 0, 0);
    a.i(MOV_X, R2, R10, 0, 0);
    a.i(ADD_K, R2, 0, 0, i32::from(KEY));
    a.i(CALL, 0, 0, 0, HELPER_MAP_LOOKUP);
    a.jmp(JEQ_K, R0, 0, 0, Miss);
    a.i(MOV_X, R7, R0, 0, 0);
    // The helper call clobbered r1-r5: reload and re-check the bounds
    // before the first write (TCP needs its checksum at 50..52).
    a.packet();
    a.need_miss(i32::from(L4) + 8);
    a.jmp(JNE_K, R8, 0, 6, Bounded);
    a.need_miss(i32::from(L4) + 20);
    a.label(Bounded);
    // Longer than the egress MTU: the engine decides.
    a.i(LDX_H, R0, R2, IP_LEN, 0);
    a.i(TO_BE, R0, 0, 0, 16);
    a.i(LDX_W, R1, R7, V_MTU, 0);
    a.jmp(JGT_X, R0, R1, 0, Miss);
    // Ethernet: destination, source.
    a.copy(LDX_W, STX_W, 0, V_DMAC);
    a.copy(LDX_H, STX_H, 4, V_DMAC + 4);
    a.copy(LDX_H, STX_H, 6, V_SMAC);
    a.copy(LDX_W, STX_W, 8, V_SMAC + 2);
    // IPv4: TTL, addresses, header checksum.
    a.i(LDX_B, R0, R2, IP_TTL, 0);
    a.i(ADD_K, R0, 0, 0, -1);
    a.i(STX_B, R2, R0, IP_TTL, 0);
    a.copy(LDX_W, STX_W, IP_SRC, V_SRC);
    a.copy(LDX_W, STX_W, IP_DST, V_DST);
    a.adjust(IP_CSUM, V_IP_DELTA, false);
    // Ports and the L4 checksum.
    a.copy(LDX_W, STX_W, L4, V_PORTS);
    a.jmp(JEQ_K, R8, 0, 6, TcpCsum);
    a.adjust(UDP_CSUM, V_L4_DELTA, true);
    a.jmp(JA, 0, 0, 0, Count);
    a.label(TcpCsum);
    a.adjust(TCP_CSUM, V_L4_DELTA, false);
    a.label(Count);
    // Bytes: the IPv4 total length plus the Ethernet header.
    a.i(LDX_H, R1, R2, IP_LEN, 0);
    a.i(TO_BE, R1, 0, 0, 16);
    a.i(ADD_K, R1, 0, 0, i32::from(IP));
    a.i(LDX_DW, R0, R7, V_BYTES, 0);
    a.i(ADD_X, R0, R1, 0, 0);
    a.i(STX_DW, R7, R0, V_BYTES, 0);
    a.i(LDX_DW, R0, R7, V_PACKETS, 0);
    a.i(ADD_K, R0, 0, 0, 1);
    a.i(STX_DW, R7, R0, V_PACKETS, 0);
    a.i(LDX_W, R1, R7, V_OIF, 0);
    a.i(MOV_K, R2, 0, 0, 0);
    a.i(CALL, 0, 0, 0, HELPER_REDIRECT);
    a.i(EXIT, 0, 0, 0, 0);
    a.label(Miss);
    a.i(MOV_X, R1, R6, 0, 0);
    (a.finish(), map_at)
}

/// `prefix` patched with `offload`'s map, followed by `program` (whose
/// `ld_imm64` at `map_at` is moved along); returns the index it moved to.
pub(crate) fn prepend(
    offload: &XdpOffload,
    program: Vec<BpfInsn>,
    map_at: usize,
) -> (Vec<BpfInsn>, usize) {
    let (mut p, at) = prefix();
    if let Some(i) = p.get_mut(at) {
        i.imm = offload.fd();
    }
    let shift = p.len();
    p.extend(program);
    (p, map_at + shift)
}

#[cfg(test)]
mod tests;
