//! The AF_XDP backend: XDP sockets on one shared UMEM.
//!
//! - [`Umem`]: one anonymous mapping cut into 2048-byte chunks, registered
//!   with the first socket that binds (`XDP_UMEM_REG`); later sockets, on any
//!   interface, bind with `XDP_SHARED_UMEM` and their own fill/completion
//!   rings (Linux >= 5.10). Free chunks sit in one pool (a mutex-guarded
//!   stack, taken once per batch, never contended when one worker drives all
//!   ports of a UMEM).
//! - Receive hands UMEM chunks to the [`Batch`] without copying. Transmit of
//!   a frame from the same UMEM hands the chunk to the TX ring without
//!   copying, so forwarding between two ports of one UMEM moves descriptors
//!   only; frames from elsewhere are copied into a free chunk.
//! - Each port loads the small XDP program of [`bpf`] on its interface
//!   (native mode first, else generic/SKB mode), maps its queue to its socket
//!   and detaches it on drop (closing the BPF link).
//! - Binding asks for zero-copy and lets the kernel fall back to copy mode
//!   where the driver lacks it (veth); `need_wakeup` is on. In copy mode the
//!   kernel transmits at most a small budget of frames (32) per `sendto` and
//!   nothing else drains the TX ring, so a `tx_batch` kicks until the ring has
//!   drained or a kick makes no progress (about one syscall per 32 frames).
//!
//! Sizing: the default rings hold 4096 entries and a private UMEM has 16384
//! chunks (32 MiB). With 2048-entry rings a receiver descheduled for ~7 ms at
//! 0.3 Mpps emptied the fill ring (`rx_fill_ring_empty_descs`) on a loaded
//! 2-vCPU VM; 4096 absorbed it. Give a shared UMEM at least
//! `ports * 2 * ring_size` chunks.
//!
//! Closing one port of a shared UMEM loses the chunks that sit in its fill
//! and TX rings until the UMEM itself is dropped.
//!
//! Missing: several queues of one interface in one process (each port
//! attaches its own program, so a second port on the same interface fails
//! with EBUSY); unaligned chunks; multi-buffer (jumbo) frames.

pub mod bpf;
mod ring;

use std::os::fd::{OwnedFd, RawFd};
use std::sync::{Arc, Mutex};

use self::bpf::{XdpAttachment, XdpMode};
use self::ring::{MmapOffsets, Ring, XdpDesc};
use crate::batch::{Batch, FrameMeta, Lender, FRAME_CAP};
use crate::error::{IfName, IoError};
use crate::port::{BackendKind, Port, PortStats};
use crate::sys::{self, Mmap};

const XDP_PGOFF_RX_RING: i64 = 0;
const XDP_PGOFF_TX_RING: i64 = 0x8000_0000;
const XDP_UMEM_PGOFF_FILL_RING: i64 = 0x1_0000_0000;
const XDP_UMEM_PGOFF_COMPLETION_RING: i64 = 0x1_8000_0000;
const XDP_OPTIONS_ZEROCOPY: u32 = 1;
const CHUNK: u64 = FRAME_CAP as u64;

#[repr(C)]
#[derive(Clone, Copy)]
struct UmemReg {
    addr: u64,
    len: u64,
    chunk_size: u32,
    headroom: u32,
    flags: u32,
    tx_metadata_len: u32,
}

/// The kernel's counters for one XDP socket (`XDP_STATISTICS`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct XdpKernelStats {
    /// Frames dropped for reasons other than a full rx or empty fill ring.
    pub rx_dropped: u64,
    /// Invalid descriptors on the rx side.
    pub rx_invalid_descs: u64,
    /// Invalid descriptors on the tx ring.
    pub tx_invalid_descs: u64,
    /// Frames dropped because the rx ring was full.
    pub rx_ring_full: u64,
    /// Times the fill ring was found empty.
    pub rx_fill_ring_empty_descs: u64,
    /// Times the tx ring was found empty.
    pub tx_ring_empty_descs: u64,
}

struct UmemInner {
    /// A duplicate of the first bound socket: later sockets name it in
    /// `sxdp_shared_umem_fd`. Declared first so it closes before the unmap
    /// (the kernel pins the pages anyway, so either order is sound).
    owner: Mutex<Option<OwnedFd>>,
    region: Mmap,
    pool: Mutex<Vec<u64>>,
}

impl UmemInner {
    fn pool(&self) -> std::sync::MutexGuard<'_, Vec<u64>> {
        self.pool.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Lender for UmemInner {
    fn pool_id(&self) -> u64 {
        self.region.as_ptr() as u64
    }

    fn give_back(&self, addrs: &[u64]) {
        self.pool().extend(addrs.iter().map(|a| a & !(CHUNK - 1)));
    }
}

/// A UMEM: packet buffer memory shared by AF_XDP ports (clone to share).
#[derive(Clone)]
pub struct Umem {
    inner: Arc<UmemInner>,
}

impl core::fmt::Debug for Umem {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Umem")
            .field("chunks", &self.chunks())
            .finish()
    }
}

impl Umem {
    /// Allocate `chunks` chunks of 2048 bytes (the kernel pins them at bind).
    pub fn new(chunks: u32) -> Result<Self, IoError> {
        if chunks == 0 {
            return Err(IoError::Unsupported {
                backend: BackendKind::AfXdp,
                why: "UMEM needs chunks",
            });
        }
        let region = Mmap::anonymous(chunks as usize * FRAME_CAP, "mmap(UMEM)")?;
        let pool = (0..u64::from(chunks)).rev().map(|c| c * CHUNK).collect();
        Ok(Self {
            inner: Arc::new(UmemInner {
                region,
                pool: Mutex::new(pool),
                owner: Mutex::new(None),
            }),
        })
    }

    /// Number of chunks.
    pub fn chunks(&self) -> u32 {
        (self.inner.region.len() / FRAME_CAP) as u32
    }

    /// Chunks currently free in the pool (not in a ring or a batch).
    pub fn free_chunks(&self) -> usize {
        self.inner.pool().len()
    }
}

/// AF_XDP settings.
#[derive(Clone, Debug)]
pub struct AfXdpConfig {
    /// Interface queue to bind (veth has only queue 0).
    pub queue: u32,
    /// Share this UMEM (forwarding between its ports needs no copy). `None`
    /// allocates a private one of `DEFAULT_UMEM_CHUNKS`.
    pub umem: Option<Umem>,
    /// Entries in each of the four rings (power of two).
    pub ring_size: u32,
    /// XDP attach mode.
    pub mode: XdpMode,
}

/// Chunks of a private UMEM.
pub const DEFAULT_UMEM_CHUNKS: u32 = 16384;

impl Default for AfXdpConfig {
    fn default() -> Self {
        Self {
            queue: 0,
            umem: None,
            ring_size: 4096,
            mode: XdpMode::Auto,
        }
    }
}

/// An AF_XDP port. Field order matters: the XDP program is detached before
/// the rings are unmapped and the socket closed.
pub struct AfXdpPort {
    xdp: XdpAttachment,
    fill: Ring<u64>,
    comp: Ring<u64>,
    rx: Ring<XdpDesc>,
    tx: Ring<XdpDesc>,
    fd: OwnedFd,
    umem: Arc<UmemInner>,
    lender: Arc<dyn Lender>,
    /// Chunks taken from the pool for copy-transmits, returned on drop.
    stash: Vec<u64>,
    name: IfName,
    port_id: u16,
    queue: u32,
    zero_copy: bool,
    stats: PortStats,
}

fn sockaddr_xdp(flags: u16, ifindex: u32, queue: u32, shared_fd: u32) -> libc::sockaddr_xdp {
    libc::sockaddr_xdp {
        sxdp_family: libc::AF_XDP as u16,
        sxdp_flags: flags,
        sxdp_ifindex: ifindex,
        sxdp_queue_id: queue,
        sxdp_shared_umem_fd: shared_fd,
    }
}

impl AfXdpPort {
    /// Open queue `cfg.queue` of `ifname` (in the calling thread's network
    /// namespace). Received frames carry `port_id` in their [`FrameMeta`].
    pub fn open(ifname: &str, port_id: u16, cfg: &AfXdpConfig) -> Result<Self, IoError> {
        let name = IfName::new(ifname)?;
        let ifindex = sys::ifindex(&name)?;
        let rs = cfg.ring_size;
        if rs == 0 || !rs.is_power_of_two() {
            return Err(IoError::Unsupported {
                backend: BackendKind::AfXdp,
                why: "ring size must be a power of two",
            });
        }
        let umem = match &cfg.umem {
            Some(u) => u.clone(),
            None => Umem::new(DEFAULT_UMEM_CHUNKS)?,
        };
        let inner = Arc::clone(&umem.inner);
        let fd = sys::socket(libc::AF_XDP, libc::SOCK_RAW, 0, "socket(AF_XDP)")?;
        let xfd = sys::raw(&fd);

        // Hold the owner lock through bind so only one socket registers.
        let mut owner = inner.owner.lock().unwrap_or_else(|e| e.into_inner());
        if owner.is_none() {
            let reg = UmemReg {
                addr: inner.region.as_ptr() as u64,
                len: inner.region.len() as u64,
                chunk_size: FRAME_CAP as u32,
                headroom: 0,
                flags: 0,
                tx_metadata_len: 0,
            };
            sys::setsockopt(
                xfd,
                libc::SOL_XDP,
                libc::XDP_UMEM_REG,
                &reg,
                "setsockopt(XDP_UMEM_REG)",
            )?;
        }
        for (opt, call) in [
            (libc::XDP_UMEM_FILL_RING, "setsockopt(XDP_UMEM_FILL_RING)"),
            (
                libc::XDP_UMEM_COMPLETION_RING,
                "setsockopt(XDP_UMEM_COMPLETION_RING)",
            ),
            (libc::XDP_RX_RING, "setsockopt(XDP_RX_RING)"),
            (libc::XDP_TX_RING, "setsockopt(XDP_TX_RING)"),
        ] {
            sys::setsockopt(xfd, libc::SOL_XDP, opt, &rs, call)?;
        }
        let mut off = MmapOffsets::default();
        sys::getsockopt(
            xfd,
            libc::SOL_XDP,
            libc::XDP_MMAP_OFFSETS,
            &mut off,
            "getsockopt(XDP_MMAP_OFFSETS)",
        )?;
        let fill = Ring::<u64>::map(
            xfd,
            &off.fr,
            rs,
            XDP_UMEM_PGOFF_FILL_RING,
            "mmap(XDP fill ring)",
        )?;
        let comp = Ring::<u64>::map(
            xfd,
            &off.cr,
            rs,
            XDP_UMEM_PGOFF_COMPLETION_RING,
            "mmap(XDP completion ring)",
        )?;
        let rx = Ring::<XdpDesc>::map(xfd, &off.rx, rs, XDP_PGOFF_RX_RING, "mmap(XDP rx ring)")?;
        let tx = Ring::<XdpDesc>::map(xfd, &off.tx, rs, XDP_PGOFF_TX_RING, "mmap(XDP tx ring)")?;

        let sa = match owner.as_ref() {
            // Shared sockets may not pass mode flags; they inherit them.
            Some(o) => sockaddr_xdp(
                libc::XDP_SHARED_UMEM,
                ifindex,
                cfg.queue,
                sys::raw(o) as u32,
            ),
            // No COPY/ZEROCOPY flag: the kernel tries zero-copy, else copy.
            None => sockaddr_xdp(libc::XDP_USE_NEED_WAKEUP, ifindex, cfg.queue, 0),
        };
        // SAFETY: `sa` is a valid sockaddr_xdp and we pass its size.
        let r = unsafe {
            libc::bind(
                xfd,
                (&sa as *const libc::sockaddr_xdp).cast(),
                core::mem::size_of::<libc::sockaddr_xdp>() as libc::socklen_t,
            )
        };
        if r < 0 {
            return Err(IoError::last("bind(AF_XDP)"));
        }
        if owner.is_none() {
            let dup = fd
                .try_clone()
                .map_err(|e| IoError::file("dup(AF_XDP socket)", &e))?;
            *owner = Some(dup);
        }
        drop(owner);

        let mut opts = 0u32;
        sys::getsockopt(
            xfd,
            libc::SOL_XDP,
            libc::XDP_OPTIONS,
            &mut opts,
            "getsockopt(XDP_OPTIONS)",
        )?;
        let xdp = XdpAttachment::attach(ifindex, cfg.mode, cfg.queue + 1)?;
        xdp.set_socket(cfg.queue, xfd)?;
        let lender: Arc<dyn Lender> = inner.clone();
        let mut port = Self {
            xdp,
            fill,
            comp,
            rx,
            tx,
            fd,
            umem: inner,
            lender,
            stash: Vec::with_capacity(rs as usize),
            name,
            port_id,
            queue: cfg.queue,
            zero_copy: opts & XDP_OPTIONS_ZEROCOPY != 0,
            stats: PortStats::default(),
        };
        port.refill();
        Ok(port)
    }

    /// The kernel's counters for this socket (zero if they cannot be read).
    pub fn kernel_stats(&self) -> XdpKernelStats {
        let mut st = XdpKernelStats::default();
        let _ = sys::getsockopt(
            sys::raw(&self.fd),
            libc::SOL_XDP,
            libc::XDP_STATISTICS,
            &mut st,
            "getsockopt(XDP_STATISTICS)",
        );
        st
    }

    /// Whether the socket runs in zero-copy mode.
    pub fn zero_copy(&self) -> bool {
        self.zero_copy
    }

    /// Whether the XDP program runs in native (driver) mode.
    pub fn native_xdp(&self) -> bool {
        self.xdp.native()
    }

    /// Keep the fill ring topped up from the pool (one lock per call, and
    /// only when at least 1/8 of the ring is empty).
    fn refill(&mut self) {
        let size = self.fill.size();
        let free = self.fill.free(size);
        if free < size / 8 {
            return;
        }
        let mut pool = self.umem.pool();
        let n = (free as usize).min(pool.len()) as u32;
        for k in 0..n {
            if let Some(a) = pool.pop() {
                self.fill.write(k, a);
            }
        }
        drop(pool);
        self.fill.submit(n);
    }

    /// Move finished transmits back to the pool.
    fn reap(&mut self) {
        let n = self.comp.available(self.comp.size());
        if n == 0 {
            return;
        }
        let mut pool = self.umem.pool();
        for k in 0..n {
            pool.push(self.comp.read(k) & !(CHUNK - 1));
        }
        drop(pool);
        self.comp.release(n);
    }

    fn kick_tx(&mut self) {
        if self.zero_copy {
            // The driver drains the ring itself; kick only when asked.
            if self.tx.needs_wakeup() && self.tx.outstanding() > 0 {
                self.kick_once();
            }
            return;
        }
        // Copy mode: each sendto transmits a bounded budget of frames
        // synchronously (32 by default), and nothing else drains the ring, so
        // kick until it is empty or a kick makes no progress.
        let mut before = self.tx.outstanding();
        while before > 0 {
            if !self.kick_once() {
                break;
            }
            let after = self.tx.outstanding();
            if after >= before {
                break;
            }
            before = after;
        }
    }

    /// One `sendto`. Returns false if the kernel cannot take more now.
    /// EAGAIN is how copy mode says "budget used up, call again", so it
    /// counts as progress; the caller's progress check ends the loop.
    fn kick_once(&mut self) -> bool {
        self.stats.tx_kicks += 1;
        match sys::kick_tx(sys::raw(&self.fd)) {
            Ok(()) => true,
            Err(e) if e == libc::EAGAIN => true,
            Err(e) => {
                if e != libc::EBUSY && e != libc::ENOBUFS && e != libc::EINTR {
                    self.stats.tx_errors += 1;
                }
                false
            }
        }
    }
}

impl Port for AfXdpPort {
    fn name(&self) -> &str {
        self.name.as_str()
    }

    fn kind(&self) -> BackendKind {
        BackendKind::AfXdp
    }

    fn describe(&self) -> String {
        format!(
            "af_xdp {} queue {} {}-xdp {} (link fd {})",
            self.name,
            self.queue,
            if self.xdp.native() {
                "native"
            } else {
                "generic"
            },
            if self.zero_copy { "zero-copy" } else { "copy" },
            self.xdp.link_fd()
        )
    }

    fn rx_batch(&mut self, batch: &mut Batch) -> usize {
        let room = batch.room() as u32;
        if room == 0 {
            return 0;
        }
        let n = self.rx.available(room);
        if n == 0 {
            self.refill();
            if self.fill.needs_wakeup() {
                // SAFETY: a zero-length, non-blocking recvfrom with null
                // buffer and address only asks the kernel to run the queue.
                unsafe {
                    libc::recvfrom(
                        sys::raw(&self.fd),
                        core::ptr::null_mut(),
                        0,
                        libc::MSG_DONTWAIT,
                        core::ptr::null_mut(),
                        core::ptr::null_mut(),
                    );
                }
            }
            return 0;
        }
        let Some(li) = batch.lender_index(&self.lender) else {
            return 0;
        };
        let base = self.umem.region.as_ptr();
        let umem_len = self.umem.region.len() as u64;
        let mut got = 0;
        for k in 0..n {
            let d = self.rx.read(k);
            let chunk = d.addr & !(CHUNK - 1);
            let cap = CHUNK - (d.addr - chunk);
            if chunk + CHUNK > umem_len || u64::from(d.len) > cap {
                // Never trust an address outside the UMEM; drop the chunk.
                self.stats.rx_oversize += 1;
                continue;
            }
            let meta = FrameMeta {
                port: self.port_id,
                timestamp_ns: 0,
            };
            // SAFETY: [d.addr, chunk + CHUNK) lies inside the UMEM (checked),
            // which `lender` keeps mapped; the kernel passed this chunk to us
            // on the rx ring and will not touch it until we put it on a fill
            // or tx ring, which happens only after the batch gives it back
            // (give_back) or hands it over (take_lent). The batch has room.
            unsafe {
                batch.push_lent(
                    base.add(d.addr as usize),
                    cap as u32,
                    d.len,
                    meta,
                    li,
                    chunk,
                );
            }
            got += 1;
            self.stats.rx_frames += 1;
            self.stats.rx_bytes += u64::from(d.len);
        }
        self.rx.release(n);
        self.refill();
        got
    }

    fn tx_batch(&mut self, batch: &mut Batch, which: &[u16]) -> usize {
        self.reap();
        let want = which.len().min(self.tx.size() as usize) as u32;
        let free = self.tx.free(want);
        let base = self.umem.region.as_ptr();
        let pool_id = self.lender.pool_id();
        let mut n = 0u32;
        for &i in which {
            let i = usize::from(i);
            let Some(len) = batch.data(i).map(<[u8]>::len) else {
                continue;
            };
            if n == free {
                self.stats.tx_ring_full += 1;
                break;
            }
            let desc = if let Some((addr, len)) = batch.take_lent(i, pool_id, base) {
                XdpDesc {
                    addr,
                    len,
                    options: 0,
                }
            } else {
                if self.stash.is_empty() {
                    let mut pool = self.umem.pool();
                    let take = pool.len().min(64);
                    let at = pool.len() - take;
                    self.stash.extend(pool.drain(at..));
                }
                let Some(chunk) = self.stash.pop() else {
                    self.stats.tx_ring_full += 1;
                    break;
                };
                let Some(data) = batch.data(i) else { continue };
                // SAFETY: `chunk` came from the pool, so it is a whole chunk
                // inside the UMEM owned by nobody else; len <= FRAME_CAP = CHUNK.
                unsafe {
                    core::ptr::copy_nonoverlapping(data.as_ptr(), base.add(chunk as usize), len);
                }
                XdpDesc {
                    addr: chunk,
                    len: len as u32,
                    options: 0,
                }
            };
            self.tx.write(n, desc);
            n += 1;
            self.stats.tx_frames += 1;
            self.stats.tx_bytes += len as u64;
        }
        if n > 0 {
            self.tx.submit(n);
            self.kick_tx();
        }
        n as usize
    }

    fn flush(&mut self) -> Result<(), IoError> {
        self.kick_tx();
        self.reap();
        Ok(())
    }

    fn poll_fd(&self) -> Option<RawFd> {
        Some(sys::raw(&self.fd))
    }

    fn stats(&mut self) -> PortStats {
        let st = self.kernel_stats();
        self.stats.rx_kernel_drops = st.rx_dropped + st.rx_ring_full;
        self.stats.tx_errors = self.stats.tx_errors.max(st.tx_invalid_descs);
        self.stats
    }
}

impl Drop for AfXdpPort {
    fn drop(&mut self) {
        self.umem.pool().append(&mut self.stash);
    }
}
