//! A traffic generator that enters a veth as XDP frames, the way a NIC's
//! receive ring hands frames to its driver: `BPF_PROG_RUN` of an XDP
//! program with `BPF_F_TEST_XDP_LIVE_FRAMES` (Linux 5.18+), as
//! xdp-trafficgen does.
//!
//! The kernel builds each frame in a page-pool page from a template, runs
//! the program on it on the calling thread's CPU, and acts on the verdict:
//! the program below returns `bpf_redirect(ifindex)`, so the frame goes to
//! that device's `ndo_xdp_xmit`. On a veth that queues an `xdp_frame` onto
//! the peer's receive ring, which the peer's NAPI drains (the peer needs
//! NAPI: an XDP program attached, or GRO on). No skb exists on the sending
//! side; the peer builds one (like a NIC driver) only if it has no XDP
//! program or its program passes the frame.
//!
//! The program (raw eBPF, see [`program`]) writes the next flow's patch into
//! the frame: 4 bytes at [`PORTS_OFF`] (source and destination port of an
//! IPv4 UDP header without options) and the 2-byte UDP checksum at
//! [`CSUM_OFF`], both taken from an array map of [`flow_entry`] values that
//! userspace filled in the sending order. It also rewrites bytes 0..34
//! (Ethernet and IPv4 headers) and 38..40 (UDP length) from the template
//! (for an IPv6 template, [`udp_offset`] 54: the ports at 54, the checksum
//! at 60, the headers 0..54 and the UDP length at 58):
//! live-frames pages are recycled without their data being reset, and a
//! receiver that forwards the page itself (the kernel's IP forwarding on
//! the skb veth builds around it) rewrites MACs, addresses, TTL and
//! checksums in place. A 1-entry array holds the index of
//! the next flow, incremented modulo the number of flows (one CPU runs the
//! program, so no atomics are needed).
//!
//! ```text
//! r6 = r1                         ; ctx
//! *(u32 *)(r10 - 4) = 0
//! r1 = counter map ll ; r2 = r10 - 4 ; call bpf_map_lookup_elem
//! if r0 == 0 goto drop
//! r7 = *(u32 *)(r0 + 0)           ; this frame's flow
//! r8 = r7 + 1 ; if r8 != flows goto +1 ; r8 = 0
//! *(u32 *)(r0 + 0) = r8
//! *(u32 *)(r10 - 8) = r7
//! r1 = flow map ll ; r2 = r10 - 8 ; call bpf_map_lookup_elem
//! if r0 == 0 goto drop
//! r7 = *(u32 *)(r0 + 0) ; r8 = *(u16 *)(r0 + 4)
//! r2 = ctx->data ; r3 = ctx->data_end ; r4 = r2 + 42
//! if r4 > r3 goto drop
//! *(u32 *)(r2 + 34) = r7 ; *(u16 *)(r2 + 40) = r8
//! *(u32 *)(r2 + 0) = template[0..4] ... *(u16 *)(r2 + 32), *(u16 *)(r2 + 38)
//! r1 = ifindex ; r2 = 0 ; call bpf_redirect ; exit
//! drop: r0 = XDP_DROP ; exit
//! ```

use core::fmt;
use std::os::fd::OwnedFd;

use crate::afxdp::bpf::{
    bpf_raw, insn, link_xdp_native, map_create, map_lookup, map_update, mmapable_array,
    prog_load_xdp, BpfInsn, BPF_MAP_TYPE_ARRAY, BPF_XDP,
};
use crate::error::{IfName, IoError};
use crate::sys;

const BPF_PROG_TEST_RUN: i32 = 10;
/// `BPF_F_TEST_XDP_LIVE_FRAMES`.
const LIVE_FRAMES: u32 = 1 << 1;
/// The kernel's upper bound of `batch_size` (`TEST_XDP_MAX_BATCH`).
pub const MAX_BATCH: u32 = 256;

/// Offset of the UDP source port in an Ethernet + IPv4 (no options) frame;
/// the destination port follows.
pub const PORTS_OFF: usize = 14 + 20;
/// Offset of the UDP checksum in the same frame.
pub const CSUM_OFF: usize = 14 + 20 + 6;

const HELPER_MAP_LOOKUP: i32 = 1;
const HELPER_REDIRECT: i32 = 23;
const XDP_DROP: i32 = 1;

// eBPF opcodes (linux/bpf.h, linux/bpf_common.h).
const LDX_H: u8 = 0x69;
const LDX_W: u8 = 0x61;
const STX_H: u8 = 0x6b;
const STX_W: u8 = 0x63;
const ST_W: u8 = 0x62;
const ST_H: u8 = 0x6a;
const ADD_K: u8 = 0x07;
const MOV_K: u8 = 0xb7;
const MOV_X: u8 = 0xbf;
const JEQ_K: u8 = 0x15;
const JNE_K: u8 = 0x55;
const JGT_X: u8 = 0x2d;
const CALL: u8 = 0x85;
const EXIT: u8 = 0x95;
const LD_IMM64: u8 = 0x18;
const PSEUDO_MAP_FD: u8 = 1;

/// The map value of one flow: the 4 port bytes and the 2 checksum bytes as
/// they appear on the wire (network byte order), padded to 8 bytes.
pub fn flow_entry(sport: u16, dport: u16, udp_csum: u16) -> [u8; 8] {
    let (s, d, c) = (
        sport.to_be_bytes(),
        dport.to_be_bytes(),
        udp_csum.to_be_bytes(),
    );
    [s[0], s[1], d[0], d[1], c[0], c[1], 0, 0]
}

/// Instructions of the program from [`program`] for an IPv4 template.
pub const PROGRAM_LEN: usize = 46;

/// Header bytes of an IPv4 template the program rewrites in every frame.
pub const HDR_LEN: usize = CSUM_OFF + 2;

/// Offset of the UDP header in a template frame: 54 for IPv6 (ethertype
/// 0x86dd, no extension header), else 34 (IPv4 without options).
pub fn udp_offset(frame: &[u8]) -> usize {
    if frame.get(12..14) == Some(&[0x86, 0xdd][..]) {
        14 + 40
    } else {
        PORTS_OFF
    }
}

/// Instructions of the program for a header of `hdr_len` bytes (the UDP
/// header's end).
fn program_len(hdr_len: usize) -> usize {
    // 30 fixed, the header's 4-byte words before the last two bytes before
    // the UDP header, two 2-byte stores, the 6-instruction tail.
    30 + (hdr_len - 8 - 2) / 4 + 2 + 6
}

/// The generator program: maps by fd, `flows` entries, redirect to
/// `ifindex`; `hdr` is the template up to the end of its UDP header (its
/// length gives the UDP header's offset, 8 bytes before the end, which
/// must be 2 modulo 4: 34 or 54).
pub(crate) fn program(
    counter_fd: i32,
    flows_fd: i32,
    flows: u32,
    ifindex: u32,
    hdr: &[u8],
) -> Vec<BpfInsn> {
    let l4 = hdr.len() - 8;
    debug_assert_eq!(l4 % 4, 2);
    let len = program_len(hdr.len());
    // Jump offsets below are counted by hand; the unit test checks that
    // every jump to `drop` lands on the `r0 = XDP_DROP` at the end.
    let drop_at = len as i64 - 2;
    let mut p: Vec<BpfInsn> = Vec::with_capacity(len);
    let to_drop = |at: usize| (drop_at - at as i64 - 1) as i16;
    p.push(insn(MOV_X, 6, 1, 0, 0)); // 0: r6 = ctx
    p.push(insn(ST_W, 10, 0, -4, 0)); // 1: key 0
    p.push(insn(LD_IMM64, 1, PSEUDO_MAP_FD, 0, counter_fd)); // 2
    p.push(insn(0, 0, 0, 0, 0)); // 3
    p.push(insn(MOV_X, 2, 10, 0, 0)); // 4
    p.push(insn(ADD_K, 2, 0, 0, -4)); // 5
    p.push(insn(CALL, 0, 0, 0, HELPER_MAP_LOOKUP)); // 6
    let at = p.len();
    p.push(insn(JEQ_K, 0, 0, to_drop(at), 0)); // 7
    p.push(insn(LDX_W, 7, 0, 0, 0)); // 8: r7 = index
    p.push(insn(MOV_X, 8, 7, 0, 0)); // 9
    p.push(insn(ADD_K, 8, 0, 0, 1)); // 10
    p.push(insn(JNE_K, 8, 0, 1, flows as i32)); // 11
    p.push(insn(MOV_K, 8, 0, 0, 0)); // 12
    p.push(insn(STX_W, 0, 8, 0, 0)); // 13: counter = next
    p.push(insn(STX_W, 10, 7, -8, 0)); // 14: key = index
    p.push(insn(LD_IMM64, 1, PSEUDO_MAP_FD, 0, flows_fd)); // 15
    p.push(insn(0, 0, 0, 0, 0)); // 16
    p.push(insn(MOV_X, 2, 10, 0, 0)); // 17
    p.push(insn(ADD_K, 2, 0, 0, -8)); // 18
    p.push(insn(CALL, 0, 0, 0, HELPER_MAP_LOOKUP)); // 19
    let at = p.len();
    p.push(insn(JEQ_K, 0, 0, to_drop(at), 0)); // 20
    p.push(insn(LDX_W, 7, 0, 0, 0)); // 21: ports
    p.push(insn(LDX_H, 8, 0, 4, 0)); // 22: checksum
                                     // Packet pointers from the ctx, after the helper calls.
    p.push(insn(LDX_W, 2, 6, 0, 0)); // 23: data
    p.push(insn(LDX_W, 3, 6, 4, 0)); // 24: data_end
    p.push(insn(MOV_X, 4, 2, 0, 0)); // 25
    p.push(insn(ADD_K, 4, 0, 0, hdr.len() as i32)); // 26
    let at = p.len();
    p.push(insn(JGT_X, 4, 3, to_drop(at), 0)); // 27
    p.push(insn(STX_W, 2, 7, l4 as i16, 0)); // 28: ports
    p.push(insn(STX_H, 2, 8, l4 as i16 + 6, 0)); // 29: checksum
                                                 // 30..40: the Ethernet and IPv4 headers and the UDP length, from the
                                                 // template. Live-frames pages are recycled without being reset, and a
                                                 // DUT that forwards the frame's own page (the kernel) rewrote its MACs,
                                                 // addresses, TTL and checksums in place.
    for (k, w) in hdr[..l4 - 2].chunks_exact(4).enumerate() {
        let v = i32::from_ne_bytes([w[0], w[1], w[2], w[3]]);
        p.push(insn(ST_W, 2, 0, 4 * k as i16, v));
    }
    for at in [l4 - 2, l4 + 4] {
        p.push(insn(
            ST_H,
            2,
            0,
            at as i16,
            i32::from(u16::from_ne_bytes([hdr[at], hdr[at + 1]])),
        ));
    }
    // The redirect: r1 = ifindex, r2 = flags 0.
    let mut tail = vec![
        insn(MOV_K, 1, 0, 0, ifindex as i32),
        insn(MOV_K, 2, 0, 0, 0),
        insn(CALL, 0, 0, 0, HELPER_REDIRECT),
        insn(EXIT, 0, 0, 0, 0),
        insn(MOV_K, 0, 0, 0, XDP_DROP),
        insn(EXIT, 0, 0, 0, 0),
    ];
    p.append(&mut tail);
    p
}

/// Why the generator could not be set up or run.
#[derive(Debug, Clone)]
pub enum LiveFramesError {
    /// A `bpf(2)` call or another system call failed.
    Sys(IoError),
    /// The verifier rejected the program.
    Rejected {
        /// The failed `BPF_PROG_LOAD`.
        error: IoError,
        /// The verifier's log.
        log: String,
    },
    /// `BPF_PROG_RUN` refused live frames (kernel older than 5.18, or an
    /// argument it does not accept).
    NotSupported(IoError),
    /// The arguments cannot describe a run (empty flow list, frame too
    /// short for the patch, batch too large).
    BadArgument(&'static str),
    /// A signal interrupted the run (`EINTR`); how many frames it sent
    /// is unknown.
    Interrupted,
}

impl fmt::Display for LiveFramesError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LiveFramesError::Sys(e) => write!(f, "{e}"),
            LiveFramesError::Rejected { error, log } => write!(
                f,
                "the XDP generator program was rejected: {error}; verifier log:\n{log}"
            ),
            LiveFramesError::NotSupported(e) => write!(
                f,
                "BPF_PROG_RUN live frames (BPF_F_TEST_XDP_LIVE_FRAMES, Linux 5.18+) not supported by this kernel: {e}"
            ),
            LiveFramesError::BadArgument(why) => write!(f, "XDP live-frames generator: {why}"),
            LiveFramesError::Interrupted => f.write_str("BPF_PROG_RUN interrupted by a signal"),
        }
    }
}

impl std::error::Error for LiveFramesError {}

impl From<IoError> for LiveFramesError {
    fn from(e: IoError) -> Self {
        LiveFramesError::Sys(e)
    }
}

/// The `test` member of `union bpf_attr` (`BPF_PROG_TEST_RUN`).
#[repr(C)]
struct TestRunAttr {
    prog_fd: u32,
    retval: u32,
    data_size_in: u32,
    data_size_out: u32,
    data_in: u64,
    data_out: u64,
    repeat: u32,
    duration: u32,
    ctx_size_in: u32,
    ctx_size_out: u32,
    ctx_in: u64,
    ctx_out: u64,
    flags: u32,
    cpu: u32,
    batch_size: u32,
    _pad: u32,
}

/// `struct xdp_md`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct XdpMd {
    data: u32,
    data_end: u32,
    data_meta: u32,
    ingress_ifindex: u32,
    rx_queue_index: u32,
    egress_ifindex: u32,
}

/// A loaded generator: frames of `frame`, patched with each flow in turn,
/// redirected out of one interface.
#[derive(Debug)]
pub struct LiveFrames {
    prog: OwnedFd,
    _flows: OwnedFd,
    counter: OwnedFd,
    frame: Vec<u8>,
    ifindex: u32,
    batch: u32,
}

impl LiveFrames {
    /// Load the program for `flows` ([`flow_entry`] values, in sending
    /// order), which transmits copies of `frame` out of `ifname` (in the
    /// calling thread's network namespace), `batch` frames per kernel
    /// batch (0: the kernel's default, 64; at most [`MAX_BATCH`]).
    pub fn new(
        ifname: &str,
        frame: &[u8],
        flows: &[[u8; 8]],
        batch: u32,
    ) -> Result<Self, LiveFramesError> {
        if flows.is_empty() {
            return Err(LiveFramesError::BadArgument("no flows"));
        }
        let n = u32::try_from(flows.len())
            .ok()
            .filter(|&n| n <= i32::MAX as u32)
            .ok_or(LiveFramesError::BadArgument("too many flows"))?;
        let hdr_len = udp_offset(frame) + 8;
        if frame.len() < hdr_len {
            return Err(LiveFramesError::BadArgument(
                "the frame is too short for its UDP header",
            ));
        }
        if batch > MAX_BATCH {
            return Err(LiveFramesError::BadArgument("batch larger than 256"));
        }
        let name = IfName::new(ifname)?;
        let ifindex = sys::ifindex(&name)?;
        let counter = map_create(
            BPF_MAP_TYPE_ARRAY,
            4,
            1,
            "bpf(BPF_MAP_CREATE generator counter)",
        )?;
        // Filled through a mapping of the array, not one BPF_MAP_UPDATE_ELEM
        // per flow: about 1 us per call made 16 M flows a 16 s wait.
        let (flow_map, mem) =
            mmapable_array(8, n, "bpf(BPF_MAP_CREATE generator flows) and its mmap")?;
        let bytes = flows.len() * 8;
        // SAFETY: the mapping is `bytes` long (the array's values, 8 bytes
        // each for `n` = `flows.len()` entries), writable, and no program
        // reads the map yet; `flows` is `bytes` long and cannot overlap a
        // fresh mapping.
        unsafe {
            core::ptr::copy_nonoverlapping(flows.as_ptr().cast::<u8>(), mem.as_ptr(), bytes);
        }
        drop(mem);
        map_update(&counter, 0, &0u32.to_ne_bytes(), UPDATE)?;
        let insns = program(
            sys::raw(&counter),
            sys::raw(&flow_map),
            n,
            ifindex,
            &frame[..hdr_len],
        );
        // Attach type 0: the program is only run by BPF_PROG_RUN.
        let prog = prog_load_xdp(&insns, b"sluice_gen", 0, "bpf(BPF_PROG_LOAD xdp generator)")
            .map_err(|(error, log)| LiveFramesError::Rejected { error, log })?;
        Ok(Self {
            prog,
            _flows: flow_map,
            counter,
            frame: frame.to_vec(),
            ifindex,
            batch,
        })
    }

    /// Run the program `repeat` times on the calling thread's CPU: that
    /// many frames are built and redirected (or dropped by the
    /// redirect's target when its ring is full). Returns when done.
    pub fn run(&self, repeat: u32) -> Result<(), LiveFramesError> {
        let mut ctx = XdpMd {
            data: 0,
            data_end: self.frame.len() as u32,
            ingress_ifindex: self.ifindex,
            ..XdpMd::default()
        };
        let mut a = TestRunAttr {
            prog_fd: sys::raw(&self.prog) as u32,
            retval: 0,
            data_size_in: self.frame.len() as u32,
            data_size_out: 0,
            data_in: self.frame.as_ptr() as u64,
            data_out: 0,
            repeat: repeat.max(1),
            duration: 0,
            ctx_size_in: core::mem::size_of::<XdpMd>() as u32,
            ctx_size_out: 0,
            ctx_in: (&mut ctx as *mut XdpMd) as u64,
            ctx_out: 0,
            flags: LIVE_FRAMES,
            cpu: 0,
            batch_size: self.batch,
            _pad: 0,
        };
        match bpf_raw(
            BPF_PROG_TEST_RUN,
            &mut a,
            "bpf(BPF_PROG_RUN, BPF_F_TEST_XDP_LIVE_FRAMES)",
        ) {
            Ok(_) => Ok(()),
            Err(e) if e.errno() == Some(libc::EINTR) => Err(LiveFramesError::Interrupted),
            Err(e) if matches!(e.errno(), Some(libc::EINVAL) | Some(libc::EOPNOTSUPP)) => {
                Err(LiveFramesError::NotSupported(e))
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Index of the flow the next frame carries.
    pub fn next_flow(&self) -> Result<u32, LiveFramesError> {
        let mut value = [0u8; 4];
        map_lookup(
            &self.counter,
            0,
            &mut value,
            "bpf(BPF_MAP_LOOKUP_ELEM generator counter)",
        )?;
        Ok(u32::from_ne_bytes(value))
    }
}

const UPDATE: &str = "bpf(BPF_MAP_UPDATE_ELEM generator)";

/// A traffic sink: an XDP program that drops every frame, attached in
/// native mode to an interface; detached when dropped.
///
/// On a veth the peer's transmit then ends in the program (the frame is
/// counted in the interface's `rx_packets` and freed) instead of in the
/// receiving kernel's GRO and IP layers, which run on the transmitting
/// CPU: the cost of a NIC's transmit, not of a second host's stack.
#[derive(Debug)]
pub struct XdpSink {
    _link: OwnedFd,
    _prog: OwnedFd,
}

/// The sink's program: `r0 = XDP_DROP; exit`.
fn sink_program() -> [BpfInsn; 2] {
    const XDP_DROP: i32 = 1;
    [insn(0xb7, 0, 0, 0, XDP_DROP), insn(0x95, 0, 0, 0, 0)]
}

impl XdpSink {
    /// Attaches the dropping program to `ifname` in the calling thread's
    /// network namespace.
    pub fn attach(ifname: &str) -> Result<Self, LiveFramesError> {
        let name = IfName::new(ifname)?;
        let ifindex = sys::ifindex(&name)?;
        let prog = prog_load_xdp(
            &sink_program(),
            b"sluice_sink",
            BPF_XDP,
            "bpf(BPF_PROG_LOAD xdp sink)",
        )
        .map_err(|(error, log)| LiveFramesError::Rejected { error, log })?;
        let link = link_xdp_native(&prog, ifindex)?;
        Ok(Self {
            _link: link,
            _prog: prog,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn program_has_the_documented_shape() {
        let mut hdr = [0u8; HDR_LEN];
        for (i, b) in hdr.iter_mut().enumerate() {
            *b = i as u8;
        }
        let p = program(7, 8, 1000, 42, &hdr);
        assert_eq!(p.len(), PROGRAM_LEN);
        assert_eq!(core::mem::size_of::<TestRunAttr>(), 80);
        assert_eq!(core::mem::size_of::<XdpMd>(), 24);
        // Both map loads are ld_imm64 with BPF_PSEUDO_MAP_FD and the fds.
        for (at, fd) in [(2, 7), (15, 8)] {
            assert_eq!(p[at].code, LD_IMM64);
            assert_eq!(p[at].regs, (PSEUDO_MAP_FD << 4) | 1);
            assert_eq!(p[at].imm, fd);
            assert_eq!(p[at + 1], insn(0, 0, 0, 0, 0));
        }
        // Every conditional jump to `drop` lands on r0 = XDP_DROP.
        let drop_at = PROGRAM_LEN - 2;
        assert_eq!(p[drop_at], insn(MOV_K, 0, 0, 0, XDP_DROP));
        for at in [7usize, 20, 27] {
            assert_eq!(at as i64 + 1 + i64::from(p[at].off), drop_at as i64);
        }
        // The wrap-around compares with the flow count; the redirect's
        // target is the interface.
        assert_eq!(p[11], insn(JNE_K, 8, 0, 1, 1000));
        assert_eq!(p[drop_at - 4], insn(MOV_K, 1, 0, 0, 42));
        assert_eq!(p[drop_at - 2], insn(CALL, 0, 0, 0, HELPER_REDIRECT));
        // Bounds check before the writes covers the checksum's last byte.
        assert_eq!(p[26].imm, 42);
        assert_eq!(p[28].off, 34);
        assert_eq!(p[29].off, 40);
        // The header stores cover bytes 0..34 and 38..40 with the template.
        let mut img = [0xffu8; HDR_LEN];
        for i in &p[30..40] {
            let off = i.off as usize;
            let b = i.imm.to_ne_bytes();
            match i.code {
                ST_W => img[off..off + 4].copy_from_slice(&b),
                ST_H => img[off..off + 2].copy_from_slice(&b[..2]),
                c => panic!("opcode {c:#x}"),
            }
            assert_eq!(i.regs & 0xf, 2);
        }
        assert_eq!(&img[..34], &hdr[..34]);
        assert_eq!(&img[38..40], &hdr[38..40]);
        assert_eq!(&img[34..38], &[0xff; 4]);
    }

    /// For an IPv6 template: the patch at 54 and 60, the header stores
    /// cover bytes 0..54 and 58..60, the bounds check the UDP header's end.
    #[test]
    fn an_ipv6_template_moves_the_patch_and_the_header_stores() {
        let mut f = [0u8; 80];
        f[12] = 0x86;
        f[13] = 0xdd;
        for (i, b) in f.iter_mut().enumerate().skip(14) {
            *b = i as u8;
        }
        assert_eq!(udp_offset(&f), 54);
        assert_eq!(udp_offset(&[0u8; 60]), 34);
        let hdr = &f[..62];
        let p = program(7, 8, 1000, 42, hdr);
        assert_eq!(p.len(), program_len(62));
        assert_eq!(p.len(), 51);
        let drop_at = p.len() - 2;
        assert_eq!(p[drop_at], insn(MOV_K, 0, 0, 0, XDP_DROP));
        for at in [7usize, 20, 27] {
            assert_eq!(at as i64 + 1 + i64::from(p[at].off), drop_at as i64);
        }
        assert_eq!(p[26].imm, 62);
        assert_eq!((p[28].code, p[28].off), (STX_W, 54));
        assert_eq!((p[29].code, p[29].off), (STX_H, 60));
        let mut img = [0xffu8; 62];
        for i in &p[30..drop_at - 4] {
            let off = i.off as usize;
            let b = i.imm.to_ne_bytes();
            match i.code {
                ST_W => img[off..off + 4].copy_from_slice(&b),
                ST_H => img[off..off + 2].copy_from_slice(&b[..2]),
                c => panic!("opcode {c:#x}"),
            }
        }
        assert_eq!(&img[..54], &hdr[..54]);
        assert_eq!(&img[58..60], &hdr[58..60]);
        assert_eq!(&img[54..58], &[0xff; 4]);
        assert_eq!(&img[60..62], &[0xff; 2]);
    }

    #[test]
    fn flow_entries_are_wire_bytes() {
        assert_eq!(
            flow_entry(0x1234, 0xabcd, 0xbeef),
            [0x12, 0x34, 0xab, 0xcd, 0xbe, 0xef, 0, 0]
        );
    }

    /// A little-endian store of the loaded words puts the entry's bytes at
    /// the frame offsets unchanged (loads and stores are the same width and
    /// byte order).
    #[test]
    fn patch_is_a_byte_copy() {
        let e = flow_entry(1025, 7, 0x1f2e);
        let mut frame = [0u8; 60];
        let ports = u32::from_ne_bytes([e[0], e[1], e[2], e[3]]);
        let csum = u16::from_ne_bytes([e[4], e[5]]);
        frame[PORTS_OFF..PORTS_OFF + 4].copy_from_slice(&ports.to_ne_bytes());
        frame[CSUM_OFF..CSUM_OFF + 2].copy_from_slice(&csum.to_ne_bytes());
        assert_eq!(&frame[34..36], &1025u16.to_be_bytes());
        assert_eq!(&frame[36..38], &7u16.to_be_bytes());
        assert_eq!(&frame[40..42], &0x1f2eu16.to_be_bytes());
    }

    #[test]
    fn bad_arguments_are_errors() {
        let f = [0u8; 60];
        assert!(matches!(
            LiveFrames::new("lo", &f, &[], 0),
            Err(LiveFramesError::BadArgument(_))
        ));
        assert!(matches!(
            LiveFrames::new("lo", &f[..20], &[[0; 8]], 0),
            Err(LiveFramesError::BadArgument(_))
        ));
        assert!(matches!(
            LiveFrames::new("lo", &f, &[[0; 8]], 999),
            Err(LiveFramesError::BadArgument(_))
        ));
    }
}
