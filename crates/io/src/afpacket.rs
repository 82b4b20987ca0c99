//! The AF_PACKET backend: a TPACKET_V3 receive ring and a TPACKET_V2
//! transmit ring, on two sockets bound to one interface.
//!
//! - Receive: block-based TPACKET_V3 ring (`PACKET_RX_RING`), read without
//!   system calls; a block goes back to the kernel once every frame in it has
//!   been copied into a [`Batch`]. The kernel hands a block over when it is
//!   full or when its timeout (`rx_block_timeout_ms`, at least 1 ms)
//!   expires, so at low rates a frame waits up to that long: `sluice bench
//!   forward --latency` measured a 1.05-1.24 ms median round trip (two
//!   crossings) through the AF_PACKET gateway against 36-46 us through
//!   AF_XDP (2026-11-24). [`RxRing::V2`] is the frame-based TPACKET_V2
//!   ring instead: each frame is handed over as soon as it is written. The socket is bound with protocol
//!   `ETH_P_ALL` only after the ring exists (so no frame of another interface
//!   is ever queued), ignores outgoing frames (`PACKET_IGNORE_OUTGOING`), puts
//!   the interface in promiscuous mode (`PACKET_ADD_MEMBERSHIP`, undone by the
//!   kernel on close) and joins a `PACKET_FANOUT` group when several
//!   workers share the interface: hash mode, or a classic-BPF program
//!   ([`crate::steer`]) that sends each frame to the worker owning it.
//! - Transmit: TPACKET_V2 ring (`PACKET_TX_RING`) on a second socket bound
//!   with protocol 0 (it receives nothing), `PACKET_QDISC_BYPASS` on, one
//!   `sendto` kick per `tx_batch`. Frames are copied into the ring.
//!
//! **The kernel's own stack still sees every frame** an AF_PACKET socket
//! sees: packet taps run before the stack. Sluice owns the frames of its
//! interfaces, so the kernel must not also answer ARP, forward, or send
//! RSTs for them. Install [`crate::nft::IngressDrop`] for the owned
//! interfaces: a netdev-family ingress chain with policy drop, which runs
//! after the packet taps (so AF_PACKET still receives) and before the stack.
//! The root test `afpacket_receives_while_nft_ingress_drops` proves both.

use std::os::fd::{OwnedFd, RawFd};
use std::sync::atomic::{AtomicU32, Ordering};

use crate::batch::{Batch, FrameMeta, FRAME_CAP};
use crate::error::{IfName, IoError};
use crate::port::{BackendKind, Port, PortStats};
use crate::steer::{self, Steer, SteerKey};
use crate::sys::{self, Mmap};

const TPACKET_V2: i32 = 1;
/// linux/if_packet.h: fanout by a classic BPF program.
const PACKET_FANOUT_CBPF: u32 = 6;
/// linux/if_packet.h: the fanout group's program.
const PACKET_FANOUT_DATA: i32 = 22;
const TPACKET_V3: i32 = 2;
const PACKET_MR_PROMISC: u16 = 1;
const TP_STATUS_KERNEL: u32 = 0;
const TP_STATUS_USER: u32 = 1;
const TP_STATUS_AVAILABLE: u32 = 0;
const TP_STATUS_SEND_REQUEST: u32 = 1;
const TP_STATUS_WRONG_FORMAT: u32 = 4;
/// `tp_status` of a received frame whose VLAN tag the kernel took out of
/// the data into `tp_vlan_tci` (it does that before any packet socket
/// sees the frame).
const TP_STATUS_VLAN_VALID: u32 = 1 << 4;
/// `tp_status`: `tp_vlan_tpid` is set (else the tag was 802.1Q).
const TP_STATUS_VLAN_TPID_VALID: u32 = 1 << 6;

/// The tag to put back into a received frame: TPID and TCI in network
/// order, when `status` says the kernel took one out.
fn vlan_tag(status: u32, tci: u16, tpid: u16) -> Option<[u8; 4]> {
    if status & TP_STATUS_VLAN_VALID == 0 {
        return None;
    }
    let tpid = if status & TP_STATUS_VLAN_TPID_VALID != 0 && tpid != 0 {
        tpid
    } else {
        0x8100
    };
    let (p, t) = (tpid.to_be_bytes(), tci.to_be_bytes());
    Some([p[0], p[1], t[0], t[1]])
}
/// Data offset in a TPACKET_V2 TX frame: TPACKET2_HDRLEN - sizeof(sockaddr_ll)
/// = TPACKET_ALIGN(32) + 20 - 20.
const TX_DATA_OFF: usize = 32;

#[repr(C)]
#[derive(Clone, Copy)]
struct TpacketReq {
    block_size: u32,
    block_nr: u32,
    frame_size: u32,
    frame_nr: u32,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct TpacketReq3 {
    block_size: u32,
    block_nr: u32,
    frame_size: u32,
    frame_nr: u32,
    retire_blk_tov: u32,
    sizeof_priv: u32,
    feature_req_word: u32,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct PacketMreq {
    ifindex: i32,
    ty: u16,
    alen: u16,
    address: [u8; 8],
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct TpacketStatsV3 {
    packets: u32,
    drops: u32,
    freeze_q_cnt: u32,
}

/// The receive ring's layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum RxRing {
    /// TPACKET_V3 blocks: the kernel fills a block and hands it over whole,
    /// when it is full or its timeout expires (fewer wake-ups at high
    /// rates; up to the timeout's delay per frame at low ones).
    #[default]
    V3,
    /// TPACKET_V2 frames: each frame is handed over as soon as it is
    /// written (no added delay at low rates; a wake-up per frame when the
    /// worker sleeps).
    V2,
}

/// Ring sizes and worker settings for AF_PACKET.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AfPacketConfig {
    /// Receive block size in bytes (multiple of the page size).
    pub rx_block_size: u32,
    /// Number of receive blocks.
    pub rx_block_nr: u32,
    /// Milliseconds after which the kernel retires a partly filled block
    /// ([`RxRing::V3`] only).
    pub rx_block_timeout_ms: u32,
    /// Block-based (V3) or frame-based (V2) receive ring; the V2 ring has
    /// the same size (`rx_block_size` x `rx_block_nr`, in frames of 2 KiB).
    pub rx_ring: RxRing,
    /// Transmit ring frames (each 2048 bytes).
    pub tx_frames: u32,
    /// Join this `PACKET_FANOUT` group (defrag on) so that several workers
    /// split the interface's traffic. Members are numbered in join order.
    pub fanout_group: Option<u16>,
    /// How the group picks a member: `None` is `PACKET_FANOUT_HASH` (by
    /// flow), `Some` a classic-BPF program (`PACKET_FANOUT_CBPF`, see
    /// [`crate::steer`]) that sends each frame to the worker owning it. Every
    /// member of one group must use the same setting.
    pub steer: Option<Steer>,
    /// Put the interface in promiscuous mode while the port is open.
    pub promisc: bool,
}

impl Default for AfPacketConfig {
    fn default() -> Self {
        Self {
            rx_block_size: 1 << 18,
            rx_block_nr: 64,
            rx_block_timeout_ms: 1,
            rx_ring: RxRing::V3,
            tx_frames: 1024,
            fanout_group: None,
            steer: None,
            promisc: true,
        }
    }
}

/// An AF_PACKET port. See the module docs.
pub struct AfPacketPort {
    name: IfName,
    port_id: u16,
    rx_fd: OwnedFd,
    rx_ring: Mmap,
    block_size: usize,
    block_nr: usize,
    cur_block: usize,
    /// Frames left in the current block (0 = not inside a block).
    left_in_block: u32,
    /// Offset of the next frame header inside the current block.
    next_off: usize,
    /// A TPACKET_V2 receive ring: frames of [`FRAME_CAP`] bytes.
    rx_v2: bool,
    /// Frames of the V2 ring, and the next one to read.
    rx_frame_nr: usize,
    rx_head: usize,
    tx_fd: OwnedFd,
    tx_ring: Mmap,
    tx_frame_nr: usize,
    tx_head: usize,
    tx_unkicked: bool,
    stats: PortStats,
    fanout: Option<u16>,
    steer: Option<Steer>,
}

fn bind_ll(fd: RawFd, proto: u16, ifindex: u32, call: &'static str) -> Result<(), IoError> {
    // SAFETY: sockaddr_ll is plain data; all-zero is a valid value.
    let mut sll: libc::sockaddr_ll = unsafe { core::mem::zeroed() };
    sll.sll_family = libc::AF_PACKET as u16;
    sll.sll_protocol = sys::htons(proto);
    sll.sll_ifindex = ifindex as i32;
    // SAFETY: `sll` is a valid sockaddr_ll and we pass its exact size.
    let r = unsafe {
        libc::bind(
            fd,
            (&sll as *const libc::sockaddr_ll).cast(),
            core::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
        )
    };
    if r < 0 {
        return Err(IoError::last(call));
    }
    Ok(())
}

impl AfPacketPort {
    /// Open `ifname` (in the calling thread's network namespace). Received
    /// frames carry `port_id` in their [`FrameMeta`].
    pub fn open(ifname: &str, port_id: u16, cfg: &AfPacketConfig) -> Result<Self, IoError> {
        let name = IfName::new(ifname)?;
        let ifindex = sys::ifindex(&name)?;
        let page = 4096u32;
        if cfg.rx_block_size == 0
            || cfg.rx_block_size % page != 0
            || cfg.rx_block_nr == 0
            || (cfg.rx_block_size as usize) < FRAME_CAP
            || cfg.tx_frames == 0
        {
            return Err(IoError::Unsupported {
                backend: BackendKind::AfPacket,
                why: "ring sizes must be non-zero and blocks a multiple of 4096 bytes",
            });
        }

        // --- receive socket: protocol 0 until the ring exists.
        let rx_fd = sys::socket(libc::AF_PACKET, libc::SOCK_RAW, 0, "socket(AF_PACKET)")?;
        let rfd = sys::raw(&rx_fd);
        let rx_frame_nr = cfg.rx_block_size / FRAME_CAP as u32 * cfg.rx_block_nr;
        match cfg.rx_ring {
            RxRing::V3 => {
                sys::setsockopt(
                    rfd,
                    libc::SOL_PACKET,
                    libc::PACKET_VERSION,
                    &TPACKET_V3,
                    "setsockopt(PACKET_VERSION=V3)",
                )?;
                let req3 = TpacketReq3 {
                    block_size: cfg.rx_block_size,
                    block_nr: cfg.rx_block_nr,
                    frame_size: FRAME_CAP as u32,
                    frame_nr: rx_frame_nr,
                    retire_blk_tov: cfg.rx_block_timeout_ms,
                    sizeof_priv: 0,
                    feature_req_word: 0,
                };
                sys::setsockopt(
                    rfd,
                    libc::SOL_PACKET,
                    libc::PACKET_RX_RING,
                    &req3,
                    "setsockopt(PACKET_RX_RING)",
                )?;
            }
            RxRing::V2 => {
                sys::setsockopt(
                    rfd,
                    libc::SOL_PACKET,
                    libc::PACKET_VERSION,
                    &TPACKET_V2,
                    "setsockopt(PACKET_VERSION=V2)",
                )?;
                let req = TpacketReq {
                    block_size: cfg.rx_block_size,
                    block_nr: cfg.rx_block_nr,
                    frame_size: FRAME_CAP as u32,
                    frame_nr: rx_frame_nr,
                };
                sys::setsockopt(
                    rfd,
                    libc::SOL_PACKET,
                    libc::PACKET_RX_RING,
                    &req,
                    "setsockopt(PACKET_RX_RING)",
                )?;
            }
        }
        let rx_len = cfg.rx_block_size as usize * cfg.rx_block_nr as usize;
        let rx_ring = Mmap::socket_ring(rfd, rx_len, 0, "mmap(PACKET_RX_RING)")?;
        let one: i32 = 1;
        sys::setsockopt(
            rfd,
            libc::SOL_PACKET,
            libc::PACKET_IGNORE_OUTGOING,
            &one,
            "setsockopt(PACKET_IGNORE_OUTGOING)",
        )?;
        bind_ll(rfd, libc::ETH_P_ALL as u16, ifindex, "bind(AF_PACKET rx)")?;
        if cfg.promisc {
            let mreq = PacketMreq {
                ifindex: ifindex as i32,
                ty: PACKET_MR_PROMISC,
                alen: 0,
                address: [0; 8],
            };
            sys::setsockopt(
                rfd,
                libc::SOL_PACKET,
                libc::PACKET_ADD_MEMBERSHIP,
                &mreq,
                "setsockopt(PACKET_ADD_MEMBERSHIP promisc)",
            )?;
        }
        if let Some(group) = cfg.fanout_group {
            let ty = match cfg.steer {
                None => libc::PACKET_FANOUT_HASH,
                Some(_) => PACKET_FANOUT_CBPF,
            };
            // No PACKET_FANOUT_FLAG_DEFRAG: the steering program sends all
            // fragments of a datagram to one worker by its addresses, and
            // the engine forwards fragments without reassembly.
            let mode = ty;
            let arg: u32 = u32::from(group) | (mode << 16);
            sys::setsockopt(
                rfd,
                libc::SOL_PACKET,
                libc::PACKET_FANOUT,
                &arg,
                "setsockopt(PACKET_FANOUT)",
            )?;
            if let Some(st) = cfg.steer {
                // The program belongs to the group: every member sets the
                // same one (the last write wins, and they are identical).
                // Until it is set the kernel sends every frame to member 0.
                sys::set_socket_filter(
                    rfd,
                    libc::SOL_PACKET,
                    PACKET_FANOUT_DATA,
                    &steer::program(st),
                    "setsockopt(PACKET_FANOUT_DATA)",
                )?;
            }
        }

        // --- transmit socket: protocol 0 so it never receives.
        let tx_fd = sys::socket(libc::AF_PACKET, libc::SOCK_RAW, 0, "socket(AF_PACKET)")?;
        let tfd = sys::raw(&tx_fd);
        sys::setsockopt(
            tfd,
            libc::SOL_PACKET,
            libc::PACKET_VERSION,
            &TPACKET_V2,
            "setsockopt(PACKET_VERSION=V2)",
        )?;
        sys::setsockopt(
            tfd,
            libc::SOL_PACKET,
            libc::PACKET_QDISC_BYPASS,
            &one,
            "setsockopt(PACKET_QDISC_BYPASS)",
        )?;
        let per_block = (1u32 << 16) / FRAME_CAP as u32;
        let tx_blocks = cfg.tx_frames.div_ceil(per_block);
        let req = TpacketReq {
            block_size: 1 << 16,
            block_nr: tx_blocks,
            frame_size: FRAME_CAP as u32,
            frame_nr: tx_blocks * per_block,
        };
        sys::setsockopt(
            tfd,
            libc::SOL_PACKET,
            libc::PACKET_TX_RING,
            &req,
            "setsockopt(PACKET_TX_RING)",
        )?;
        let tx_ring = Mmap::socket_ring(
            tfd,
            (1usize << 16) * tx_blocks as usize,
            0,
            "mmap(PACKET_TX_RING)",
        )?;
        bind_ll(tfd, 0, ifindex, "bind(AF_PACKET tx)")?;

        Ok(Self {
            name,
            port_id,
            rx_fd,
            rx_ring,
            block_size: cfg.rx_block_size as usize,
            block_nr: cfg.rx_block_nr as usize,
            cur_block: 0,
            left_in_block: 0,
            next_off: 0,
            rx_v2: cfg.rx_ring == RxRing::V2,
            rx_frame_nr: rx_frame_nr as usize,
            rx_head: 0,
            tx_fd,
            tx_ring,
            tx_frame_nr: req.frame_nr as usize,
            tx_head: 0,
            tx_unkicked: false,
            stats: PortStats::default(),
            fanout: cfg.fanout_group,
            steer: cfg.steer,
        })
    }

    fn block_ptr(&self) -> *mut u8 {
        // cur_block < block_nr, so the offset stays inside the mapping.
        self.rx_ring
            .as_ptr()
            .wrapping_add(self.cur_block * self.block_size)
    }

    fn block_status(&self) -> &AtomicU32 {
        // SAFETY: the block descriptor starts every block and block_status is
        // the aligned u32 at offset 8 (tpacket_block_desc.hdr.bh1); the
        // kernel writes it concurrently, which is why we read it atomically.
        // The mapping lives as long as `self`.
        unsafe { &*self.block_ptr().add(8).cast::<AtomicU32>() }
    }

    fn release_block(&mut self) {
        // Hand the block back; Release orders our reads of it before.
        self.block_status()
            .store(TP_STATUS_KERNEL, Ordering::Release);
        self.left_in_block = 0;
        self.cur_block = (self.cur_block + 1) % self.block_nr;
    }

    fn rx_status(&self, i: usize) -> &AtomicU32 {
        // SAFETY: frame i < rx_frame_nr starts at i * FRAME_CAP inside the
        // mapping (blocks hold a whole number of frames, no gaps); tp_status
        // is its first aligned u32, shared with the kernel, hence atomic.
        unsafe { &*self.rx_ring.as_ptr().add(i * FRAME_CAP).cast::<AtomicU32>() }
    }

    /// Copies one received frame (kernel time stamp `sec`.`nsec`; `tag`:
    /// the VLAN tag the kernel took out of it, put back) into `batch` and
    /// counts it; whether it fitted. The engine decides what a tagged frame
    /// is (Sluice has no VLAN interfaces: it drops any tag but VLAN 0), so
    /// it must see the frame as it came.
    fn push_rx(
        &mut self,
        batch: &mut Batch,
        data: &[u8],
        sec: u32,
        nsec: u32,
        tag: Option<[u8; 4]>,
    ) -> bool {
        let meta = FrameMeta {
            port: self.port_id,
            timestamp_ns: u64::from(sec) * 1_000_000_000 + u64::from(nsec),
        };
        let pushed = match tag {
            None => batch.push_copy(data, meta),
            Some(t) => batch.push_copy_tagged(data, t, meta),
        };
        if pushed {
            self.stats.rx_frames += 1;
            self.stats.rx_bytes += data.len() as u64;
            true
        } else {
            self.stats.rx_oversize += 1;
            false
        }
    }

    /// [`Port::rx_batch`] for a TPACKET_V2 ring: frames in ring order
    /// while the kernel has handed them over.
    fn rx_batch_v2(&mut self, batch: &mut Batch) -> usize {
        let mut n = 0;
        while batch.room() > 0 {
            let i = self.rx_head;
            let status = self.rx_status(i).load(Ordering::Acquire);
            if status & TP_STATUS_USER == 0 {
                break;
            }
            let f = self.rx_ring.as_ptr().wrapping_add(i * FRAME_CAP);
            // SAFETY: the frame is ours (TP_STATUS_USER, Acquire above) and
            // the tpacket2_hdr fields read (aligned u32 at 8, 16, 20 and u16
            // at 12, 24, 26) lie within its first 28 of FRAME_CAP bytes.
            let (snaplen, mac, sec, nsec, tci, tpid) = unsafe {
                (
                    f.add(8).cast::<u32>().read_volatile(),
                    f.add(12).cast::<u16>().read_volatile(),
                    f.add(16).cast::<u32>().read_volatile(),
                    f.add(20).cast::<u32>().read_volatile(),
                    f.add(24).cast::<u16>().read_volatile(),
                    f.add(26).cast::<u16>().read_volatile(),
                )
            };
            let tag = vlan_tag(status, tci, tpid);
            let (start, len) = (usize::from(mac), snaplen as usize);
            if start + len <= FRAME_CAP {
                // SAFETY: [start, start+len) lies within this frame (checked
                // above), which is ours until its status goes back.
                let data = unsafe { core::slice::from_raw_parts(f.add(start), len) };
                n += usize::from(self.push_rx(batch, data, sec, nsec, tag));
            } else {
                // A corrupt header: never read outside the frame.
                self.stats.rx_oversize += 1;
            }
            // Hand the frame back; Release orders our reads of it before.
            self.rx_status(i).store(TP_STATUS_KERNEL, Ordering::Release);
            self.rx_head = (i + 1) % self.rx_frame_nr;
        }
        n
    }

    fn tx_status(&self, i: usize) -> &AtomicU32 {
        // SAFETY: frame i < tx_frame_nr starts at i * FRAME_CAP inside the
        // mapping (blocks hold a whole number of frames, no gaps); tp_status
        // is its first aligned u32, shared with the kernel, hence atomic.
        unsafe { &*self.tx_ring.as_ptr().add(i * FRAME_CAP).cast::<AtomicU32>() }
    }

    fn kick(&mut self) {
        self.stats.tx_kicks += 1;
        self.tx_unkicked = false;
        if let Err(e) = sys::kick_tx(sys::raw(&self.tx_fd)) {
            if e != libc::EAGAIN && e != libc::ENOBUFS && e != libc::EINTR {
                self.stats.tx_errors += 1;
            }
        }
    }
}

impl Port for AfPacketPort {
    fn name(&self) -> &str {
        self.name.as_str()
    }

    fn kind(&self) -> BackendKind {
        BackendKind::AfPacket
    }

    fn describe(&self) -> String {
        format!(
            "af_packet {} rx TPACKET_{} {}x{} KiB, tx TPACKET_V2 {} frames qdisc-bypass{}",
            self.name,
            if self.rx_v2 { "V2" } else { "V3" },
            self.block_nr,
            self.block_size / 1024,
            self.tx_frame_nr,
            match (self.fanout, self.steer) {
                (Some(g), None) => format!(", fanout hash group {g}"),
                (Some(g), Some(st)) => format!(
                    ", fanout cbpf group {g} steered by {} over {} workers",
                    match st.key {
                        SteerKey::Destination => "destination port",
                        SteerKey::Source => "source port",
                        SteerKey::Symmetric => "both ports",
                    },
                    st.workers
                ),
                (None, _) => String::new(),
            }
        )
    }

    fn rx_batch(&mut self, batch: &mut Batch) -> usize {
        if self.rx_v2 {
            return self.rx_batch_v2(batch);
        }
        let mut n = 0;
        while batch.room() > 0 {
            let blk = self.block_ptr();
            if self.left_in_block == 0 {
                if self.block_status().load(Ordering::Acquire) & TP_STATUS_USER == 0 {
                    break;
                }
                // SAFETY: the block is ours (TP_STATUS_USER, Acquire above);
                // num_pkts and offset_to_first_pkt are aligned u32 at 12 and 16.
                let (num, first) = unsafe {
                    (
                        blk.add(12).cast::<u32>().read_volatile(),
                        blk.add(16).cast::<u32>().read_volatile(),
                    )
                };
                if num == 0 {
                    self.release_block();
                    continue;
                }
                self.left_in_block = num;
                self.next_off = first as usize;
            }
            if self.next_off + 40 > self.block_size {
                // A corrupt offset: never read outside the block.
                self.release_block();
                continue;
            }
            // SAFETY: next_off + 40 <= block_size, so the tpacket3_hdr fields
            // read here (all aligned u32/u16 within the first 38 bytes) lie in
            // this block, which the kernel does not touch while it is ours.
            let (next, sec, nsec, snaplen, status, mac, tci, tpid) = unsafe {
                let h = blk.add(self.next_off);
                (
                    h.cast::<u32>().read_volatile(),
                    h.add(4).cast::<u32>().read_volatile(),
                    h.add(8).cast::<u32>().read_volatile(),
                    h.add(12).cast::<u32>().read_volatile(),
                    h.add(20).cast::<u32>().read_volatile(),
                    h.add(24).cast::<u16>().read_volatile(),
                    h.add(32).cast::<u32>().read_volatile(),
                    h.add(36).cast::<u16>().read_volatile(),
                )
            };
            let tag = vlan_tag(status, tci as u16, tpid);
            let start = self.next_off + usize::from(mac);
            let len = snaplen as usize;
            if start + len > self.block_size {
                self.release_block();
                continue;
            }
            // SAFETY: [start, start+len) lies within this block (checked
            // above) and the block is ours until release_block.
            let data = unsafe { core::slice::from_raw_parts(blk.add(start), len) };
            n += usize::from(self.push_rx(batch, data, sec, nsec, tag));
            self.left_in_block -= 1;
            self.next_off += next as usize;
            if self.left_in_block == 0 {
                self.release_block();
            }
        }
        n
    }

    fn tx_batch(&mut self, batch: &mut Batch, which: &[u16]) -> usize {
        let mut n = 0;
        for &i in which {
            let Some(data) = batch.data(usize::from(i)) else {
                continue;
            };
            if data.len() > FRAME_CAP - TX_DATA_OFF {
                self.stats.tx_errors += 1;
                continue;
            }
            let st = self.tx_status(self.tx_head).load(Ordering::Acquire);
            if st == TP_STATUS_WRONG_FORMAT {
                self.stats.tx_errors += 1;
            } else if st != TP_STATUS_AVAILABLE {
                self.stats.tx_ring_full += 1;
                break;
            }
            let frame = self.tx_ring.as_ptr().wrapping_add(self.tx_head * FRAME_CAP);
            // SAFETY: the frame slot is AVAILABLE (or rejected), so the kernel
            // does not read it; the data area [32, 32+len) and tp_len at 4 are
            // inside the 2048-byte slot (len checked above).
            unsafe {
                core::ptr::copy_nonoverlapping(data.as_ptr(), frame.add(TX_DATA_OFF), data.len());
                frame.add(4).cast::<u32>().write_volatile(data.len() as u32);
            }
            self.tx_status(self.tx_head)
                .store(TP_STATUS_SEND_REQUEST, Ordering::Release);
            self.tx_head = (self.tx_head + 1) % self.tx_frame_nr;
            self.stats.tx_frames += 1;
            self.stats.tx_bytes += data.len() as u64;
            n += 1;
            self.tx_unkicked = true;
        }
        if self.tx_unkicked {
            self.kick();
        }
        n
    }

    fn flush(&mut self) -> Result<(), IoError> {
        if self.tx_unkicked {
            self.kick();
        }
        Ok(())
    }

    fn poll_fd(&self) -> Option<RawFd> {
        Some(sys::raw(&self.rx_fd))
    }

    fn stats(&mut self) -> PortStats {
        let mut st = TpacketStatsV3::default();
        // PACKET_STATISTICS returns and resets the kernel's counters.
        if sys::getsockopt(
            sys::raw(&self.rx_fd),
            libc::SOL_PACKET,
            libc::PACKET_STATISTICS,
            &mut st,
            "getsockopt(PACKET_STATISTICS)",
        )
        .is_ok()
        {
            self.stats.rx_kernel_drops += u64::from(st.drops);
        }
        self.stats
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vlan_tag_of_the_ring_header() {
        assert_eq!(vlan_tag(TP_STATUS_USER, 100, 0), None, "no tag taken out");
        assert_eq!(
            vlan_tag(TP_STATUS_USER | TP_STATUS_VLAN_VALID, 0x2064, 0),
            Some([0x81, 0x00, 0x20, 0x64]),
            "802.1Q when the TPID is not given"
        );
        assert_eq!(
            vlan_tag(
                TP_STATUS_USER | TP_STATUS_VLAN_VALID | TP_STATUS_VLAN_TPID_VALID,
                7,
                0x88a8
            ),
            Some([0x88, 0xa8, 0x00, 0x07])
        );
    }
}
