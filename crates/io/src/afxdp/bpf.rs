//! The XDP program that feeds AF_XDP sockets, and its loading with raw
//! `bpf(2)` calls (no libbpf, no clang at build time).
//!
//! The program, hand-assembled (eBPF ISA, `struct bpf_insn`):
//!
//! ```text
//! r2 = *(u32 *)(r1 + 16)        ; ctx->rx_queue_index
//! r1 = map_fd ll                ; the XSKMAP (BPF_PSEUDO_MAP_FD)
//! r3 = 2                        ; XDP_PASS: action if no socket for this queue
//! call bpf_redirect_map         ; helper 51
//! exit                          ; r0 = XDP_REDIRECT or XDP_PASS
//! ```
//!
//! Since Linux 5.3 the low bits of `bpf_redirect_map`'s flags are the action
//! returned when the map has no entry, so no explicit lookup is needed.
//! It is attached with `BPF_LINK_CREATE` (attach type `BPF_XDP`): closing
//! the link descriptor detaches it, so a crash cannot leave it behind.
//!
//! In native mode on a kernel with the `bpf_xdp_metadata_rx_vlan_tag`
//! kfunc, the program (this one, the steering program, or either behind
//! the offload) runs behind [`vlan_prefix`] and is loaded bound to its
//! device: a VLAN tag the driver took out of a frame goes back into it.

use std::os::fd::{FromRawFd, OwnedFd};

use super::btf;
use crate::error::IoError;
use crate::steer::{
    Steer, SteerKey, ICMP6, ICMP6_ERRORS_FIRST, ICMP6_ERRORS_LAST, ICMP_ERRORS, ICMP_QUERIES,
    NDP_FIRST, NDP_LAST, QUOTED6,
};
use crate::sys;

const BPF_MAP_CREATE: i32 = 0;
pub(crate) const BPF_MAP_LOOKUP_ELEM: i32 = 1;
pub(crate) const BPF_MAP_UPDATE_ELEM: i32 = 2;
pub(crate) const BPF_MAP_DELETE_ELEM: i32 = 3;
const BPF_PROG_LOAD: i32 = 5;
const BPF_LINK_CREATE: i32 = 28;
const BPF_MAP_TYPE_XSKMAP: u32 = 17;
const BPF_PROG_TYPE_XDP: u32 = 6;
/// `BPF_XDP`, the attach type of an XDP program on a device.
pub(crate) const BPF_XDP: u32 = 37;
const XDP_FLAGS_SKB_MODE: u32 = 1 << 1;
const XDP_FLAGS_DRV_MODE: u32 = 1 << 2;

/// `struct bpf_insn`: opcode, dst (low nibble) / src (high nibble), offset, immediate.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct BpfInsn {
    pub(crate) code: u8,
    pub(crate) regs: u8,
    pub(crate) off: i16,
    pub(crate) imm: i32,
}

pub(crate) const fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> BpfInsn {
    BpfInsn {
        code,
        regs: (src << 4) | dst,
        off,
        imm,
    }
}

/// Index of the `ld_imm64` whose immediate is patched with the map fd.
const MAP_FD_INSN: usize = 1;

/// The program; `imm` of insn [`MAP_FD_INSN`] is replaced by the map fd.
pub(crate) const XSK_REDIRECT_PROG: [BpfInsn; 6] = [
    // BPF_LDX | BPF_MEM | BPF_W: r2 = *(u32 *)(r1 + 16)
    insn(0x61, 2, 1, 16, 0),
    // BPF_LD | BPF_DW | BPF_IMM, src = BPF_PSEUDO_MAP_FD: r1 = map
    insn(0x18, 1, 1, 0, 0),
    insn(0x00, 0, 0, 0, 0),
    // BPF_ALU64 | BPF_MOV | BPF_K: r3 = XDP_PASS
    insn(0xb7, 3, 0, 0, 2),
    // BPF_JMP | BPF_CALL: bpf_redirect_map
    insn(0x85, 0, 0, 0, 51),
    // BPF_JMP | BPF_EXIT
    insn(0x95, 0, 0, 0, 0),
];

// eBPF opcodes (linux/bpf.h, linux/bpf_common.h).
const LDX_B: u8 = 0x71; // BPF_LDX | BPF_MEM | BPF_B
const LDX_H: u8 = 0x69; // BPF_LDX | BPF_MEM | BPF_H
const LDX_W: u8 = 0x61; // BPF_LDX | BPF_MEM | BPF_W
const ADD_K: u8 = 0x07; // BPF_ALU64 | BPF_ADD | BPF_K
const ADD_X: u8 = 0x0f;
const MUL_K: u8 = 0x27;
const AND_K: u8 = 0x57;
const LSH_K: u8 = 0x67;
const RSH_K: u8 = 0x77;
const MOD_K: u8 = 0x97;
const XOR_X: u8 = 0xaf;
const MOV_K: u8 = 0xb7;
const MOV_X: u8 = 0xbf;
const TO_BE: u8 = 0xdc; // BPF_ALU | BPF_END | BPF_TO_BE (imm = 16 or 32)
const JA: u8 = 0x05;
const JEQ_K: u8 = 0x15;
const JGT_K: u8 = 0x25;
const JGE_K: u8 = 0x35;
const JGT_X: u8 = 0x2d;
const JSET_K: u8 = 0x45;
const JNE_K: u8 = 0x55;
const CALL: u8 = 0x85;
const EXIT: u8 = 0x95;
const LD_IMM64: u8 = 0x18;
const STX_W: u8 = 0x63; // BPF_STX | BPF_MEM | BPF_W
const STX_H: u8 = 0x6b; // BPF_STX | BPF_MEM | BPF_H
const ST_DW: u8 = 0x7a; // BPF_ST | BPF_MEM | BPF_DW
/// `src_reg` of a call to a kernel function by BTF id.
const PSEUDO_KFUNC_CALL: u8 = 2;
const HELPER_XDP_ADJUST_HEAD: i32 = 44;
const XDP_DROP: i32 = 1;
/// `prog_flags`: the program is bound to the device `prog_ifindex` names
/// (what a call to an XDP metadata kfunc needs).
const BPF_F_XDP_DEV_BOUND_ONLY: u32 = 1 << 6;
/// The XDP metadata kfunc that returns a frame's outermost VLAN tag when
/// the driver took it out of the frame (Linux 6.8).
const VLAN_TAG_KFUNC: &str = "bpf_xdp_metadata_rx_vlan_tag";
const PSEUDO_MAP_FD: u8 = 1;
const HELPER_REDIRECT_MAP: i32 = 51;
const XDP_PASS: i32 = 2;

// Registers of the steering program.
const R0: u8 = 0; // scratch
const R1: u8 = 1; // ctx, then scratch
const R2: u8 = 2; // packet start
const R3: u8 = 3; // packet end
const R4: u8 = 4; // network header
const R5: u8 = 5; // L4 header (variable offset)
const R7: u8 = 7; // queue * workers: first map slot of this queue
const R8: u8 = 8; // the key, then the worker
const R9: u8 = 9; // header lengths

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Label {
    L3,
    Vlan,
    Ports,
    Query,
    Error,
    InnerPorts,
    InnerQuery,
    Addrs,
    V6,
    V6Error,
    V6Addrs,
    Fold6,
    Key,
    Out,
}

/// A tiny eBPF assembler with forward labels `L` (each program has its own
/// label type): the steering program below and the offload prefix
/// (`super::offload`).
pub(crate) struct Asm<L> {
    code: Vec<BpfInsn>,
    fixups: Vec<(usize, L)>,
    labels: Vec<(L, usize)>,
}

impl<L: Copy + PartialEq> Asm<L> {
    pub(crate) fn with_capacity(n: usize) -> Self {
        Self {
            code: Vec::with_capacity(n),
            fixups: Vec::new(),
            labels: Vec::new(),
        }
    }
    /// Instructions emitted so far.
    pub(crate) fn len(&self) -> usize {
        self.code.len()
    }
    pub(crate) fn i(&mut self, code: u8, dst: u8, src: u8, off: i16, imm: i32) {
        self.code.push(insn(code, dst, src, off, imm));
    }
    /// A jump to label `to` (resolved by [`Self::finish`]).
    pub(crate) fn jmp(&mut self, code: u8, dst: u8, src: u8, imm: i32, to: L) {
        self.fixups.push((self.code.len(), to));
        self.i(code, dst, src, 0, imm);
    }
    pub(crate) fn label(&mut self, l: L) {
        self.labels.push((l, self.code.len()));
    }
    /// `if reg + len > r3 (data_end) goto to`: a bounds check the verifier
    /// needs before every packet access (`reg` is a packet pointer; r0 is
    /// clobbered).
    pub(crate) fn need(&mut self, reg: u8, len: i32, to: L) {
        self.i(MOV_X, R0, reg, 0, 0);
        self.i(ADD_K, R0, 0, 0, len);
        self.jmp(JGT_X, R0, R3, 0, to);
    }
    /// `dst = be16(*(u16 *)(reg + off))`.
    fn load16(&mut self, dst: u8, reg: u8, off: i16) {
        self.i(LDX_H, dst, reg, off, 0);
        self.i(TO_BE, dst, 0, 0, 16);
    }
    pub(crate) fn finish(mut self) -> Vec<BpfInsn> {
        for &(at, l) in &self.fixups {
            let to = self
                .labels
                .iter()
                .find(|x| x.0 == l)
                .map_or(at + 1, |x| x.1);
            if let Some(ins) = self.code.get_mut(at) {
                ins.off = (to as i64 - at as i64 - 1) as i16;
            }
        }
        self.code
    }
}

/// Load the TCP/UDP key from the header at `R5 + base` (see
/// `crate::steer::program`; `quoted`: the header is quoted by an ICMP
/// error, so it travelled the other way).
fn xdp_ports(a: &mut Asm<Label>, key: SteerKey, base: i16, quoted: bool) {
    match (key, quoted) {
        (SteerKey::Destination, false) | (SteerKey::Source, true) => {
            a.need(R5, i32::from(base) + 4, Label::Out);
            a.load16(R8, R5, base + 2);
        }
        (SteerKey::Source, false) | (SteerKey::Destination, true) => {
            a.need(R5, i32::from(base) + 2, Label::Out);
            a.load16(R8, R5, base);
        }
        (SteerKey::Symmetric, _) => {
            a.need(R5, i32::from(base) + 4, Label::Out);
            a.load16(R8, R5, base);
            a.load16(R0, R5, base + 2);
            a.i(XOR_X, R8, R0, 0, 0);
        }
    }
}

/// The steering XDP program for `steer`: it computes the owner worker of
/// each frame exactly as [`crate::steer::worker_for`] (the classic-BPF
/// fanout program's decision) and redirects the frame to the socket at
/// XSKMAP slot `rx_queue_index * workers + owner`, or passes it to the
/// kernel stack when that slot is empty. It parses Ethernet with at most
/// one 802.1Q / 802.1ad tag (the kernel strips one tag before an AF_PACKET
/// fanout program runs); behind an IPv4 or IPv6 ethertype it reads the IP
/// version nibble, as the cBPF program does, and goes on with the IPv4 or
/// the IPv6 rule. Every packet load is preceded by a bounds check against
/// `data_end` (an out-of-bounds frame, like one of another ethertype such
/// as ARP, goes to worker 0). Returns the program and the index of the `ld_imm64` to
/// patch with the map fd.
pub(crate) fn steer_program(steer: Steer) -> (Vec<BpfInsn>, usize) {
    use Label::*;
    let workers = i32::from(steer.workers.max(1));
    let mut a = Asm::with_capacity(160);
    // r7 = ctx->rx_queue_index * workers; r2/r3 = data/data_end; r8 = 0.
    a.i(LDX_W, R7, R1, 16, 0);
    a.i(MUL_K, R7, 0, 0, workers);
    a.i(LDX_W, R2, R1, 0, 0);
    a.i(LDX_W, R3, R1, 4, 0);
    a.i(MOV_K, R8, 0, 0, 0);
    // Ethernet: IPv4 at 14, or after one VLAN tag at 18.
    a.need(R2, 14, Label::Out);
    a.i(MOV_X, R4, R2, 0, 0);
    a.i(ADD_K, R4, 0, 0, 14);
    a.load16(R0, R2, 12);
    a.jmp(JEQ_K, R0, 0, 0x0800, L3);
    a.jmp(JEQ_K, R0, 0, 0x86dd, L3);
    a.jmp(JEQ_K, R0, 0, 0x8100, Vlan);
    a.jmp(JNE_K, R0, 0, 0x88a8, Out);
    a.label(Vlan);
    a.need(R2, 18, Label::Out);
    a.i(ADD_K, R4, 0, 0, 4);
    a.load16(R0, R2, 16);
    a.jmp(JEQ_K, R0, 0, 0x0800, L3);
    a.jmp(JNE_K, R0, 0, 0x86dd, Out);
    // The version nibble picks the rule, as in the cBPF program.
    a.label(L3);
    a.need(R4, 1, Label::Out);
    a.i(LDX_B, R9, R4, 0, 0);
    a.i(MOV_X, R0, R9, 0, 0);
    a.i(RSH_K, R0, 0, 0, 4);
    a.jmp(JEQ_K, R0, 0, 6, V6);
    a.jmp(JNE_K, R0, 0, 4, Out);
    // IPv4: fragment offset, header length, protocol.
    a.need(R4, 8, Label::Out);
    a.load16(R0, R4, 6);
    a.jmp(JSET_K, R0, 0, 0x3fff, Addrs);
    a.i(AND_K, R9, 0, 0, 0x0f);
    a.i(LSH_K, R9, 0, 0, 2);
    a.i(MOV_X, R5, R4, 0, 0);
    a.i(ADD_X, R5, R9, 0, 0);
    a.need(R4, 10, Label::Out);
    a.i(LDX_B, R0, R4, 9, 0);
    a.jmp(JEQ_K, R0, 0, 6, Ports);
    a.jmp(JEQ_K, R0, 0, 17, Ports);
    a.jmp(JNE_K, R0, 0, 1, Addrs);
    a.need(R5, 1, Label::Out);
    a.i(LDX_B, R0, R5, 0, 0);
    for t in ICMP_QUERIES {
        a.jmp(JEQ_K, R0, 0, t as i32, Query);
    }
    for t in ICMP_ERRORS {
        a.jmp(JEQ_K, R0, 0, t as i32, Error);
    }
    a.jmp(JA, 0, 0, 0, Addrs);

    a.label(Ports);
    xdp_ports(&mut a, steer.key, 0, false);
    a.jmp(JA, 0, 0, 0, Key);

    a.label(Query);
    a.need(R5, 6, Label::Out);
    a.load16(R8, R5, 4);
    a.jmp(JA, 0, 0, 0, Key);

    // ICMP error: the quoted IPv4 header at R5 + 8, its L4 header at
    // R5 + 8 + its length (R5 moves by that length).
    a.label(Error);
    a.need(R5, 8 + 10, Label::Out);
    a.i(LDX_B, R1, R5, 8 + 9, 0);
    a.i(LDX_B, R9, R5, 8, 0);
    a.i(AND_K, R9, 0, 0, 0x0f);
    a.i(LSH_K, R9, 0, 0, 2);
    a.i(ADD_X, R5, R9, 0, 0);
    a.jmp(JEQ_K, R1, 0, 6, InnerPorts);
    a.jmp(JEQ_K, R1, 0, 17, InnerPorts);
    a.jmp(JEQ_K, R1, 0, 1, InnerQuery);
    a.jmp(JA, 0, 0, 0, Addrs);
    a.label(InnerPorts);
    xdp_ports(&mut a, steer.key, 8, true);
    a.jmp(JA, 0, 0, 0, Key);
    a.label(InnerQuery);
    a.need(R5, 8 + 6, Label::Out);
    a.load16(R8, R5, 8 + 4);
    a.jmp(JA, 0, 0, 0, Key);

    // IPv6: every path reads the addresses at 8..40, so a header shorter
    // than 40 bytes goes to worker 0 whatever follows. ICMPv6 right after
    // the fixed header: an error is keyed by the quoted header's addresses
    // (R5 = R4 + 48), NDP goes to worker 0; the rest by their own (R5 = R4).
    a.label(V6);
    a.need(R4, 40, Label::Out);
    a.i(LDX_B, R0, R4, 6, 0);
    a.jmp(JNE_K, R0, 0, i32::from(ICMP6), V6Addrs);
    a.need(R4, 41, Label::Out);
    a.i(LDX_B, R0, R4, 40, 0);
    a.jmp(JGT_K, R0, 0, i32::from(NDP_LAST), V6Addrs);
    a.jmp(JGE_K, R0, 0, i32::from(NDP_FIRST), Out);
    a.jmp(JGT_K, R0, 0, i32::from(ICMP6_ERRORS_LAST), V6Addrs);
    a.jmp(JGE_K, R0, 0, i32::from(ICMP6_ERRORS_FIRST), V6Error);
    a.jmp(JA, 0, 0, 0, V6Addrs);
    a.label(V6Error);
    a.need(R4, QUOTED6 as i32 + 40, Label::Out);
    a.i(MOV_X, R5, R4, 0, 0);
    a.i(ADD_K, R5, 0, 0, QUOTED6 as i32);
    a.jmp(JA, 0, 0, 0, Fold6);
    a.label(V6Addrs);
    a.i(MOV_X, R5, R4, 0, 0);
    // The xor of the eight address words at R5 + 8, in host order; one
    // byte swap of the result is the xor of the big-endian words.
    a.label(Fold6);
    a.i(LDX_W, R8, R5, 8, 0);
    for i in 1..8 {
        a.i(LDX_W, R0, R5, 8 + 4 * i, 0);
        a.i(XOR_X, R8, R0, 0, 0);
    }
    a.i(TO_BE, R8, 0, 0, 32);
    a.i(MOV_X, R0, R8, 0, 0);
    a.i(RSH_K, R0, 0, 0, 16);
    a.i(XOR_X, R8, R0, 0, 0);
    a.i(AND_K, R8, 0, 0, 0xffff);
    a.jmp(JA, 0, 0, 0, Key);

    // Anything else: a symmetric function of the addresses.
    a.label(Addrs);
    a.need(R4, 20, Label::Out);
    a.i(LDX_W, R8, R4, 12, 0);
    a.i(TO_BE, R8, 0, 0, 32);
    a.i(LDX_W, R0, R4, 16, 0);
    a.i(TO_BE, R0, 0, 0, 32);
    a.i(XOR_X, R8, R0, 0, 0);
    a.i(MOV_X, R0, R8, 0, 0);
    a.i(RSH_K, R0, 0, 0, 16);
    a.i(XOR_X, R8, R0, 0, 0);
    a.i(AND_K, R8, 0, 0, 0xffff);

    // owner_of(key) = (key >> 1) % workers.
    a.label(Key);
    a.i(RSH_K, R8, 0, 0, 1);
    a.i(MOD_K, R8, 0, 0, workers);

    // bpf_redirect_map(&xskmap, queue * workers + worker, XDP_PASS).
    a.label(Out);
    a.i(ADD_X, R8, R7, 0, 0);
    let map_at = a.len();
    a.i(LD_IMM64, R1, PSEUDO_MAP_FD, 0, 0);
    a.i(0, 0, 0, 0, 0);
    a.i(MOV_X, R2, R8, 0, 0);
    a.i(MOV_K, R3, 0, 0, XDP_PASS);
    a.i(CALL, 0, 0, 0, HELPER_REDIRECT_MAP);
    a.i(EXIT, 0, 0, 0, 0);
    (a.finish(), map_at)
}

/// Which program a port's interface runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Program {
    /// Each queue to its one socket (slot = queue).
    PerQueue,
    /// Several sockets per queue, one per worker, by [`steer_program`].
    Steered(Steer),
}

/// How the XDP program is attached.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum XdpMode {
    /// Native (driver) mode, else generic (SKB) mode.
    Auto,
    /// Native mode only.
    Native,
    /// Generic (SKB) mode only.
    Generic,
}

/// `bpf(cmd, attr)` for a command that returns a new descriptor. The
/// contract of [`bpf_raw`] applies.
pub(crate) fn bpf<A>(cmd: i32, attr: &mut A, call: &'static str) -> Result<OwnedFd, IoError> {
    let r = bpf_raw(cmd, attr, call)?;
    // SAFETY: these commands return a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(r) })
}

/// `bpf(cmd, attr)`. Crate-internal contract (the callers in `afxdp` and
/// `xdpgen` keep it): `A` is the `repr(C)` `bpf_attr` prefix of `cmd`, fully
/// initialised, and every address in it (instructions, map keys and values,
/// `data_in`, `ctx_in`, log buffers) points to memory that stays alive and
/// is large enough for the whole call; output pointers are 0 or writable.
pub(crate) fn bpf_raw<A>(cmd: i32, attr: &mut A, call: &'static str) -> Result<i32, IoError> {
    // SAFETY: `attr` is a live, fully initialised `repr(C)` bpf_attr prefix
    // for `cmd`, and we pass its exact size; the kernel zero-extends it and
    // may write back into it (within that size).
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            (attr as *mut A).cast::<libc::c_void>(),
            core::mem::size_of::<A>() as u32,
        )
    };
    if r < 0 {
        return Err(IoError::last(call));
    }
    Ok(r as i32)
}

#[repr(C)]
struct MapCreateAttr {
    map_type: u32,
    key_size: u32,
    value_size: u32,
    max_entries: u32,
    map_flags: u32,
}

#[repr(C)]
struct MapElemAttr {
    map_fd: u32,
    _pad: u32,
    key: u64,
    value: u64,
    flags: u64,
}

#[repr(C)]
struct ProgLoadAttr {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    kern_version: u32,
    prog_flags: u32,
    prog_name: [u8; 16],
    prog_ifindex: u32,
    expected_attach_type: u32,
}

/// A new BPF map (`BPF_MAP_CREATE`) with 4-byte keys.
pub(crate) fn map_create(
    map_type: u32,
    value_size: u32,
    max_entries: u32,
    call: &'static str,
) -> Result<OwnedFd, IoError> {
    map_create_kv(map_type, 4, value_size, max_entries, 0, call)
}

/// A new BPF map (`BPF_MAP_CREATE`) with `key_size`-byte keys and
/// `map_flags` (e.g. `BPF_F_NO_PREALLOC`).
pub(crate) fn map_create_kv(
    map_type: u32,
    key_size: u32,
    value_size: u32,
    max_entries: u32,
    map_flags: u32,
    call: &'static str,
) -> Result<OwnedFd, IoError> {
    let mut m = MapCreateAttr {
        map_type,
        key_size,
        value_size,
        max_entries,
        map_flags,
    };
    bpf(BPF_MAP_CREATE, &mut m, call)
}

/// `BPF_MAP_TYPE_ARRAY`.
pub(crate) const BPF_MAP_TYPE_ARRAY: u32 = 2;
/// `BPF_MAP_CREATE` flag: the array's values can be mmap'ed.
const BPF_F_MMAPABLE: u32 = 1 << 10;

/// A `BPF_MAP_TYPE_ARRAY` of `entries` values of `value_size` bytes (a
/// multiple of 8) created `BPF_F_MMAPABLE`, and its values mapped shared
/// into this process: value `i` at byte `i * value_size`, written by
/// this process without system calls and read by the programs using the
/// map.
pub(crate) fn mmapable_array(
    value_size: u32,
    entries: u32,
    call: &'static str,
) -> Result<(OwnedFd, sys::Mmap), IoError> {
    let map = map_create_kv(
        BPF_MAP_TYPE_ARRAY,
        4,
        value_size,
        entries,
        BPF_F_MMAPABLE,
        call,
    )?;
    let mem = sys::Mmap::socket_ring(
        sys::raw(&map),
        entries as usize * value_size as usize,
        0,
        call,
    )?;
    Ok((map, mem))
}

/// `BPF_MAP_*_ELEM` and `BPF_MAP_GET_NEXT_KEY` with a key of any size:
/// `key` must be exactly the map's key size, `value` the address of a
/// buffer of the map's value size (or of its key size for
/// `BPF_MAP_GET_NEXT_KEY`; 0 for a delete). `key` 0 (null) is allowed for
/// `BPF_MAP_GET_NEXT_KEY` (the first key).
pub(crate) fn map_elem_raw(
    cmd: i32,
    map: &OwnedFd,
    key: u64,
    value: u64,
    flags: u64,
    call: &'static str,
) -> Result<(), IoError> {
    let mut a = MapElemAttr {
        map_fd: sys::raw(map) as u32,
        _pad: 0,
        key,
        value,
        flags,
    };
    bpf_raw(cmd, &mut a, call).map(|_| ())
}

/// `BPF_MAP_*_ELEM` on `key` of `map`; `value` is the address of the value
/// (0 for a delete), valid for the map's value size.
fn map_elem(
    cmd: i32,
    map: &OwnedFd,
    key: u32,
    value: u64,
    call: &'static str,
) -> Result<(), IoError> {
    map_elem_raw(cmd, map, &key as *const u32 as u64, value, 0, call)
}

/// Writes `value` (exactly the map's value size) at `key` of `map`.
pub(crate) fn map_update(
    map: &OwnedFd,
    key: u32,
    value: &[u8],
    call: &'static str,
) -> Result<(), IoError> {
    map_elem(BPF_MAP_UPDATE_ELEM, map, key, value.as_ptr() as u64, call)
}

/// Reads the value at `key` of `map` into `value` (exactly the map's value
/// size).
pub(crate) fn map_lookup(
    map: &OwnedFd,
    key: u32,
    value: &mut [u8],
    call: &'static str,
) -> Result<(), IoError> {
    map_elem(
        BPF_MAP_LOOKUP_ELEM,
        map,
        key,
        value.as_mut_ptr() as u64,
        call,
    )
}

/// Empties `key` of `map`.
pub(crate) fn map_delete(map: &OwnedFd, key: u32, call: &'static str) -> Result<(), IoError> {
    map_elem(BPF_MAP_DELETE_ELEM, map, key, 0, call)
}

/// Loads an XDP program named `name` (at most 15 bytes). If the verifier
/// rejects it, loads it again with a log and returns the log with the
/// error.
pub(crate) fn prog_load_xdp(
    insns: &[BpfInsn],
    name: &[u8],
    expected_attach_type: u32,
    call: &'static str,
) -> Result<OwnedFd, (IoError, String)> {
    prog_load_xdp_on(insns, name, expected_attach_type, None, call)
}

/// [`prog_load_xdp`], bound to the device `dev_bound` (an ifindex) when
/// given (`BPF_F_XDP_DEV_BOUND_ONLY`: it may then call that driver's XDP
/// metadata kfuncs, and attach to that device only, in native mode).
fn prog_load_xdp_on(
    insns: &[BpfInsn],
    name: &[u8],
    expected_attach_type: u32,
    dev_bound: Option<u32>,
    call: &'static str,
) -> Result<OwnedFd, (IoError, String)> {
    let license = b"Dual MIT/GPL\0";
    let mut prog_name = [0u8; 16];
    for (d, s) in prog_name.iter_mut().take(15).zip(name) {
        *d = *s;
    }
    let mut p = ProgLoadAttr {
        prog_type: BPF_PROG_TYPE_XDP,
        insn_cnt: insns.len() as u32,
        insns: insns.as_ptr() as u64,
        license: license.as_ptr() as u64,
        log_level: 0,
        log_size: 0,
        log_buf: 0,
        kern_version: 0,
        prog_flags: if dev_bound.is_some() {
            BPF_F_XDP_DEV_BOUND_ONLY
        } else {
            0
        },
        prog_name,
        prog_ifindex: dev_bound.unwrap_or(0),
        expected_attach_type,
    };
    bpf(BPF_PROG_LOAD, &mut p, call).map_err(|e| {
        let mut log = vec![0u8; 1 << 16];
        p.log_level = 1;
        p.log_size = log.len() as u32;
        p.log_buf = log.as_mut_ptr() as u64;
        let _ = bpf_raw(BPF_PROG_LOAD, &mut p, call);
        let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
        (e, String::from_utf8_lossy(&log[..end]).into_owned())
    })
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum VlanLabel {
    Drop,
    Go,
}

/// The instructions put in front of the program when the kernel has the
/// VLAN metadata kfunc (BTF id `kfunc`): a frame whose outermost VLAN tag
/// the driver took out of it (receive VLAN offload; a veth hands over the
/// tag its sender left to "hardware" so) gets the tag back in front of its
/// EtherType, so that the program and the engine see it as it was on the
/// wire (the engine drops what is tagged for a VLAN, `vlan-tagged`, and
/// handles priority tags; without this an XDP program sees such a frame
/// untagged). The kfunc answers -ENODATA for an untagged frame and
/// -EOPNOTSUPP on a driver that does not implement it; either way the
/// frame goes on unchanged. A frame that cannot take the 4 bytes
/// (`bpf_xdp_adjust_head` failing: the driver left less than 4 bytes of
/// headroom, which XDP drivers do not) is dropped.
///
/// ```text
/// r6 = r1; *(u64 *)(r10 - 8) = 0
/// r2 = r10 - 8 (TPID); r3 = r10 - 6 (TCI)
/// call bpf_xdp_metadata_rx_vlan_tag
/// r1 = r6; if r0 != 0 goto go
/// r2 = -4; call bpf_xdp_adjust_head; if r0 != 0 goto drop
/// r1 = r6; r2 = data; r3 = data_end; if r2 + 18 > r3 goto drop
/// move the MACs 4 bytes down; the TPID at 12, the TCI (big-endian) at 14
/// r1 = r6; goto go
/// drop: return XDP_DROP
/// go: (the program, ctx in r1)
/// ```
fn vlan_prefix(kfunc: u32) -> Vec<BpfInsn> {
    use VlanLabel::*;
    const R6: u8 = 6;
    const R10: u8 = 10;
    let mut a = Asm::with_capacity(40);
    a.i(MOV_X, R6, R1, 0, 0);
    a.i(ST_DW, R10, 0, -8, 0);
    a.i(MOV_X, R2, R10, 0, 0);
    a.i(ADD_K, R2, 0, 0, -8);
    a.i(MOV_X, R3, R10, 0, 0);
    a.i(ADD_K, R3, 0, 0, -6);
    a.i(CALL, 0, PSEUDO_KFUNC_CALL, 0, kfunc as i32);
    a.i(MOV_X, R1, R6, 0, 0);
    a.jmp(JNE_K, R0, 0, 0, Go);
    a.i(MOV_K, R2, 0, 0, -4);
    a.i(CALL, 0, 0, 0, HELPER_XDP_ADJUST_HEAD);
    a.jmp(JNE_K, R0, 0, 0, Drop);
    a.i(MOV_X, R1, R6, 0, 0);
    a.i(LDX_W, R2, R1, 0, 0);
    a.i(LDX_W, R3, R1, 4, 0);
    a.i(MOV_X, R4, R2, 0, 0);
    a.i(ADD_K, R4, 0, 0, 18);
    a.jmp(JGT_X, R4, R3, 0, Drop);
    for at in [0i16, 4, 8] {
        a.i(LDX_W, R0, R2, at + 4, 0);
        a.i(STX_W, R2, R0, at, 0);
    }
    a.i(LDX_H, R0, R10, -8, 0);
    a.i(STX_H, R2, R0, 12, 0);
    a.i(LDX_H, R0, R10, -6, 0);
    a.i(TO_BE, R0, 0, 0, 16);
    a.i(STX_H, R2, R0, 14, 0);
    a.i(MOV_X, R1, R6, 0, 0);
    a.jmp(JA, 0, 0, 0, Go);
    a.label(Drop);
    a.i(MOV_K, R0, 0, 0, XDP_DROP);
    a.i(EXIT, 0, 0, 0, 0);
    a.label(Go);
    a.finish()
}

#[repr(C)]
struct LinkCreateAttr {
    prog_fd: u32,
    target_ifindex: u32,
    attach_type: u32,
    flags: u32,
}

/// Attaches `prog` to `ifindex` (in the calling thread's network
/// namespace) through a BPF link, in the mode `flags` names
/// (`XDP_FLAGS_DRV_MODE` or `XDP_FLAGS_SKB_MODE`); closing the returned
/// link detaches it.
fn link_xdp(
    prog: &OwnedFd,
    ifindex: u32,
    flags: u32,
    call: &'static str,
) -> Result<OwnedFd, IoError> {
    let mut l = LinkCreateAttr {
        prog_fd: sys::raw(prog) as u32,
        target_ifindex: ifindex,
        attach_type: BPF_XDP,
        flags,
    };
    bpf(BPF_LINK_CREATE, &mut l, call)
}

/// [`link_xdp`] in native (driver) mode.
pub(crate) fn link_xdp_native(prog: &OwnedFd, ifindex: u32) -> Result<OwnedFd, IoError> {
    link_xdp(
        prog,
        ifindex,
        XDP_FLAGS_DRV_MODE,
        "bpf(BPF_LINK_CREATE xdp native)",
    )
}

/// A loaded and attached program with its XSKMAP. Dropping it detaches the
/// program (the link closes first, then the program and map).
#[derive(Debug)]
pub(crate) struct XdpAttachment {
    link: OwnedFd,
    _prog: OwnedFd,
    map: OwnedFd,
    native: bool,
    /// The program runs behind [`vlan_prefix`].
    vlan_meta: bool,
    program: Program,
}

impl XdpAttachment {
    /// Create the map of `slots` sockets, load `program` and attach it to
    /// `ifindex`.
    pub(crate) fn attach(
        ifindex: u32,
        mode: XdpMode,
        program: Program,
        slots: u32,
        offload: Option<&super::offload::XdpOffload>,
    ) -> Result<Self, IoError> {
        let map = map_create(
            BPF_MAP_TYPE_XSKMAP,
            4,
            slots.max(1),
            "bpf(BPF_MAP_CREATE XSKMAP)",
        )?;
        let (prog_insns, map_at) = match program {
            Program::PerQueue => (XSK_REDIRECT_PROG.to_vec(), MAP_FD_INSN),
            Program::Steered(s) => steer_program(s),
        };
        let (mut prog_insns, map_at) = match offload {
            Some(o) => super::offload::prepend(o, prog_insns, map_at),
            None => (prog_insns, map_at),
        };
        if let Some(i) = prog_insns.get_mut(map_at) {
            i.imm = sys::raw(&map);
        }
        // In native mode, first the program behind the VLAN prefix, bound
        // to the device (a metadata kfunc needs that, and a device-bound
        // program attaches in native mode only).
        let kfunc = match mode {
            XdpMode::Generic => None,
            XdpMode::Native | XdpMode::Auto => btf::vmlinux_func(VLAN_TAG_KFUNC),
        };
        if let Some(id) = kfunc {
            let mut with_vlan = vlan_prefix(id);
            with_vlan.extend_from_slice(&prog_insns);
            match prog_load_xdp_on(
                &with_vlan,
                b"sluice_xsk",
                BPF_XDP,
                Some(ifindex),
                "bpf(BPF_PROG_LOAD xdp dev-bound)",
            ) {
                Ok(prog) => match link_xdp_native(&prog, ifindex) {
                    Ok(link) => {
                        return Ok(Self {
                            link,
                            _prog: prog,
                            map,
                            native: true,
                            vlan_meta: true,
                            program,
                        })
                    }
                    Err(e) if mode == XdpMode::Native => return Err(e),
                    Err(e) => tracing::info!("native XDP attach failed ({e}); trying generic (SKB) mode"),
                },
                Err((e, log)) => tracing::warn!(
                    "XDP program with the VLAN metadata check rejected ({e}); loading it without (verifier log:\n{log})"
                ),
            }
        }
        let prog = prog_load_xdp(
            &prog_insns,
            b"sluice_xsk",
            BPF_XDP,
            "bpf(BPF_PROG_LOAD xdp)",
        )
        .map_err(|(e, log)| {
            tracing::error!("XDP program rejected: {e}; verifier log:\n{log}");
            e
        })?;
        let try_mode = |flags: u32, call: &'static str| link_xdp(&prog, ifindex, flags, call);
        let (link, native) = match mode {
            XdpMode::Native => (
                try_mode(XDP_FLAGS_DRV_MODE, "bpf(BPF_LINK_CREATE xdp native)")?,
                true,
            ),
            XdpMode::Generic => (
                try_mode(XDP_FLAGS_SKB_MODE, "bpf(BPF_LINK_CREATE xdp generic)")?,
                false,
            ),
            XdpMode::Auto => {
                match try_mode(XDP_FLAGS_DRV_MODE, "bpf(BPF_LINK_CREATE xdp native)") {
                    Ok(l) => (l, true),
                    Err(e) => {
                        tracing::info!("native XDP attach failed ({e}); trying generic (SKB) mode");
                        (
                            try_mode(XDP_FLAGS_SKB_MODE, "bpf(BPF_LINK_CREATE xdp generic)")?,
                            false,
                        )
                    }
                }
            }
        };
        tracing::warn!(
            ifindex,
            "XDP program without the VLAN metadata check ({}): a frame whose VLAN tag the driver \
             takes out (receive VLAN offload) reaches Sluice untagged; turn that offload off \
             (`ethtool -K IF rxvlan off`)",
            if kfunc.is_none() {
                "no bpf_xdp_metadata_rx_vlan_tag in this kernel, or generic mode asked for"
            } else {
                "generic mode"
            }
        );
        Ok(Self {
            link,
            _prog: prog,
            map,
            native,
            vlan_meta: false,
            program,
        })
    }

    /// Whether the program puts back the VLAN tags the driver took out.
    pub(crate) fn vlan_meta(&self) -> bool {
        self.vlan_meta
    }

    /// Point map slot `slot` at socket `xsk_fd`.
    pub(crate) fn set_socket(&self, slot: u32, xsk_fd: i32) -> Result<(), IoError> {
        map_update(
            &self.map,
            slot,
            &(xsk_fd as u32).to_ne_bytes(),
            "bpf(BPF_MAP_UPDATE_ELEM xskmap)",
        )
    }

    /// Empty map slot `slot` (its frames then go to the kernel stack).
    pub(crate) fn clear_socket(&self, slot: u32) -> Result<(), IoError> {
        map_delete(&self.map, slot, "bpf(BPF_MAP_DELETE_ELEM xskmap)")
    }

    /// The steering of the program (`None`: one socket per queue).
    pub(crate) fn steer(&self) -> Option<Steer> {
        match self.program {
            Program::PerQueue => None,
            Program::Steered(s) => Some(s),
        }
    }

    pub(crate) fn native(&self) -> bool {
        self.native
    }

    pub(crate) fn link_fd(&self) -> i32 {
        sys::raw(&self.link)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn program_encoding_matches_the_isa() {
        // Byte images as `llvm-objdump -d` prints them for the same program.
        let bytes: Vec<[u8; 8]> = XSK_REDIRECT_PROG
            .iter()
            .map(|i| {
                let mut b = [0u8; 8];
                b[0] = i.code;
                b[1] = i.regs;
                b[2..4].copy_from_slice(&i.off.to_le_bytes());
                b[4..8].copy_from_slice(&i.imm.to_le_bytes());
                b
            })
            .collect();
        assert_eq!(bytes[0], [0x61, 0x12, 0x10, 0, 0, 0, 0, 0]);
        assert_eq!(bytes[1], [0x18, 0x11, 0, 0, 0, 0, 0, 0]);
        assert_eq!(bytes[2], [0; 8]);
        assert_eq!(bytes[3], [0xb7, 0x03, 0, 0, 2, 0, 0, 0]);
        assert_eq!(bytes[4], [0x85, 0, 0, 0, 51, 0, 0, 0]);
        assert_eq!(bytes[5], [0x95, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(core::mem::size_of::<BpfInsn>(), 8);
    }

    /// Run `prog` on `frame` arriving on `queue` the way the kernel does,
    /// for the instructions the steering program uses. Returns the map slot
    /// passed to `bpf_redirect_map`. Panics on a packet load outside the
    /// frame (a bounds check is missing) or an unknown instruction.
    fn exec(prog: &[BpfInsn], frame: &[u8], queue: u32) -> u32 {
        const CTX: u64 = 0x1000;
        const PKT: u64 = 0x10_0000;
        let len = frame.len() as u64;
        let load = |addr: u64, size: usize| -> u64 {
            if (CTX..CTX + 24).contains(&addr) {
                return match addr - CTX {
                    0 => PKT,
                    4 => PKT + len,
                    16 => u64::from(queue),
                    o => panic!("ctx load at {o}"),
                };
            }
            let off = addr.checked_sub(PKT).expect("load below the packet") as usize;
            let b = frame
                .get(off..off + size)
                .unwrap_or_else(|| panic!("unchecked load of {size} at {off} (len {len})"));
            let mut v = [0u8; 8];
            v[..size].copy_from_slice(b);
            // Host byte order, like the kernel's loads.
            match size {
                1 => u64::from(b[0]),
                2 => u64::from(u16::from_ne_bytes([b[0], b[1]])),
                _ => u64::from(u32::from_ne_bytes([b[0], b[1], b[2], b[3]])),
            }
        };
        let mut r = [0u64; 11];
        r[1] = CTX;
        let mut pc = 0usize;
        for _ in 0..10_000 {
            let i = prog[pc];
            pc += 1;
            let (d, s) = (usize::from(i.regs & 0xf), usize::from(i.regs >> 4));
            let k = i64::from(i.imm) as u64;
            let jump = |c: bool, pc: &mut usize| {
                if c {
                    *pc = (*pc as i64 + i64::from(i.off)) as usize;
                }
            };
            match i.code {
                LDX_B => r[d] = load(r[s].wrapping_add(i64::from(i.off) as u64), 1),
                LDX_H => r[d] = load(r[s].wrapping_add(i64::from(i.off) as u64), 2),
                LDX_W => r[d] = load(r[s].wrapping_add(i64::from(i.off) as u64), 4),
                ADD_K => r[d] = r[d].wrapping_add(k),
                ADD_X => r[d] = r[d].wrapping_add(r[s]),
                MUL_K => r[d] = r[d].wrapping_mul(k),
                AND_K => r[d] &= k,
                LSH_K => r[d] <<= k,
                RSH_K => r[d] >>= k,
                MOD_K => r[d] %= k,
                XOR_X => r[d] ^= r[s],
                MOV_K => r[d] = k,
                MOV_X => r[d] = r[s],
                TO_BE => {
                    r[d] = match i.imm {
                        16 => u64::from((r[d] as u16).to_be()),
                        32 => u64::from((r[d] as u32).to_be()),
                        n => panic!("be{n}"),
                    }
                }
                JA => jump(true, &mut pc),
                JEQ_K => jump(r[d] == k, &mut pc),
                JNE_K => jump(r[d] != k, &mut pc),
                JGT_K => jump(r[d] > k, &mut pc),
                JGE_K => jump(r[d] >= k, &mut pc),
                JSET_K => jump(r[d] & k != 0, &mut pc),
                JGT_X => jump(r[d] > r[s], &mut pc),
                LD_IMM64 => {
                    assert_eq!(s, usize::from(PSEUDO_MAP_FD));
                    r[d] = u64::from(i.imm as u32) | (u64::from(prog[pc].imm as u32) << 32);
                    pc += 1;
                }
                CALL => {
                    assert_eq!(i.imm, HELPER_REDIRECT_MAP);
                    assert_eq!(r[1], 0x7777, "map fd in r1");
                    assert_eq!(r[3], XDP_PASS as u64, "flags: pass when the slot is empty");
                    assert!(r[2] <= u64::from(u32::MAX));
                    return r[2] as u32;
                }
                c => panic!("opcode {c:#x} at {}", pc - 1),
            }
        }
        panic!("program did not finish");
    }

    fn ether(ethertype: u16, vlan: Option<u16>, l3: &[u8]) -> Vec<u8> {
        let mut f = vec![0x02, 0, 0, 0, 0, 2, 0x02, 0, 0, 0, 0, 1];
        if let Some(outer) = vlan {
            f.extend_from_slice(&outer.to_be_bytes());
            f.extend_from_slice(&[0, 42]);
        }
        f.extend_from_slice(&ethertype.to_be_bytes());
        f.extend_from_slice(l3);
        f
    }

    #[test]
    fn steering_program_decides_like_the_cbpf_program() {
        use crate::steer::{tests::corpus, worker_for};
        let frames = corpus();
        for key in [SteerKey::Destination, SteerKey::Source, SteerKey::Symmetric] {
            for workers in [1u16, 2, 3, 7] {
                let s = Steer { key, workers };
                let (mut prog, map_at) = steer_program(s);
                prog[map_at].imm = 0x7777;
                for queue in [0u32, 3] {
                    let base = queue * u32::from(workers);
                    for l3 in &frames {
                        let want = base + u32::from(worker_for(s, l3));
                        // Behind either IP ethertype the version nibble
                        // decides, as for the cBPF program.
                        for et in [0x0800, 0x86dd] {
                            for vlan in [None, Some(0x8100), Some(0x88a8)] {
                                let f = ether(et, vlan, l3);
                                assert_eq!(exec(&prog, &f, queue), want, "{s:?} {f:02x?}");
                            }
                        }
                        // ARP, a tag inside a tag: worker 0.
                        for (et, vlan) in [(0x0806, None), (0x8100, Some(0x88a8))] {
                            assert_eq!(exec(&prog, &ether(et, vlan, l3), queue), base);
                        }
                    }
                    // Truncated Ethernet and VLAN headers: worker 0.
                    let f = ether(0x0800, Some(0x8100), &[0x45; 30]);
                    for len in 0..18 {
                        assert_eq!(exec(&prog, &f[..len], queue), base, "len {len}");
                    }
                }
            }
        }
    }

    #[test]
    fn steering_program_is_well_formed() {
        for key in [SteerKey::Destination, SteerKey::Source, SteerKey::Symmetric] {
            let (p, map_at) = steer_program(Steer { key, workers: 4 });
            assert!(p.len() < 4096);
            assert_eq!(p.last().map(|i| i.code), Some(EXIT));
            assert_eq!(p[map_at].code, LD_IMM64);
            assert_eq!(p[map_at].regs, (PSEUDO_MAP_FD << 4) | R1);
            assert_eq!(p[map_at + 1], insn(0, 0, 0, 0, 0));
            for (n, i) in p.iter().enumerate() {
                if i.code & 0x07 == 0x05 && i.code != CALL && i.code != EXIT {
                    let to = n as i64 + 1 + i64::from(i.off);
                    assert!(
                        to > n as i64 && to < p.len() as i64,
                        "jump at {n}: forward only, inside"
                    );
                }
            }
        }
    }
}
