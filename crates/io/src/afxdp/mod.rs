//! The AF_XDP backend: XDP sockets on one shared UMEM.
//!
//! - [`Umem`]: one anonymous mapping cut into 2048-byte chunks, registered
//!   with the first socket that binds (`XDP_UMEM_REG`); later sockets bind
//!   with `XDP_SHARED_UMEM` (Linux >= 5.10). Free chunks sit in one pool (a
//!   mutex-guarded stack, taken once per batch; uncontended when one worker
//!   drives a UMEM, shared by the workers when several steer one queue).
//! - Fill and completion rings belong to a (device, queue), not to a
//!   socket: the kernel keeps one buffer pool per (device, queue) and UMEM.
//!   The first socket of a UMEM on a queue creates them; a socket of the
//!   same UMEM on another queue or interface creates its own; a socket on
//!   the same queue joins the first one's and may not create any. Receive
//!   takes chunks from the queue's fill ring for whichever socket the XDP
//!   program picks, and completions of every socket on the queue arrive on
//!   its one completion ring. So each queue's two rings sit behind a mutex
//!   that ports only `try_lock` on the packet path (`QueueShare`).
//! - Receive hands UMEM chunks to the [`Batch`] without copying. Transmit of
//!   a frame from the same UMEM hands the chunk to the TX ring without
//!   copying, so forwarding between two ports of one UMEM moves descriptors
//!   only; frames from elsewhere are copied into a free chunk.
//! - One XDP program of [`bpf`] per interface (native mode first, else
//!   generic/SKB mode), detached when the interface's last port drops
//!   (closing the BPF link). Alone on a queue, a socket sits in XSKMAP slot
//!   `queue`. With [`AfXdpConfig::steer`], one socket per worker binds the
//!   same queue and the program computes the owner worker of each frame
//!   exactly as the AF_PACKET fanout program does
//!   ([`crate::steer::worker_for`]) and redirects it to slot
//!   `queue * workers + owner`.
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
//! `queues * 2 * ring_size + sockets * 2 * ring_size` chunks.
//!
//! Closing one port of a shared UMEM loses the chunks that sit in its rings
//! until the UMEM itself is dropped.
//!
//! Missing: unaligned chunks; multi-buffer (jumbo) frames.

pub mod bpf;
mod btf;
pub mod offload;
mod ring;

use std::os::fd::{OwnedFd, RawFd};
use std::sync::{Arc, Mutex, MutexGuard, TryLockError, Weak};

use self::bpf::{Program, XdpAttachment, XdpMode};
use self::ring::{MmapOffsets, Ring, XdpDesc};
use crate::batch::{Batch, FrameMeta, Lender, FRAME_CAP};
use crate::error::{IfName, IoError};
use crate::port::{BackendKind, Port, PortStats};
use crate::steer::Steer;
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

/// Which sockets of a UMEM are bound where; locked while a port opens.
#[derive(Default)]
struct Bindings {
    /// A duplicate of the first bound socket: sockets on other queues name
    /// it in `sxdp_shared_umem_fd`.
    owner: Option<OwnedFd>,
    /// The queues this UMEM's sockets are bound to.
    queues: Vec<Weak<QueueShare>>,
    /// The XDP program of each interface (one per interface: its XSKMAP
    /// has a slot per queue and worker), by ifindex.
    programs: Vec<(u32, Weak<XdpAttachment>)>,
}

/// XSKMAP slots per worker: queues `0..MAP_QUEUES` of an interface can be
/// bound.
pub const MAP_QUEUES: u32 = 64;

struct UmemInner {
    /// Declared first so the sockets close before the unmap (the kernel
    /// pins the pages anyway, so either order is sound).
    bindings: Mutex<Bindings>,
    region: Mmap,
    pool: Mutex<Vec<u64>>,
}

/// The fill and completion rings of one bound queue.
struct FillComp {
    fill: Ring<u64>,
    comp: Ring<u64>,
}

/// What every socket bound to one (interface, queue) of a UMEM shares.
///
/// The kernel keeps one buffer pool per (device, queue): a socket that
/// binds with `XDP_SHARED_UMEM` naming a socket bound to the same device
/// and queue joins that socket's pool and uses its fill and completion
/// rings (it may not create its own: EINVAL), while a socket on another
/// queue or device gets a pool, and rings, of its own
/// (Documentation/networking/af_xdp.rst, "XDP_SHARED_UMEM bind flag").
/// So the fill and completion rings live here, behind a mutex each port
/// only `try_lock`s (a worker that finds it taken skips the refill or
/// reap: the holder is doing it). The interface's XDP program is shared
/// by all its queues: its XSKMAP has one slot per (queue, worker).
struct QueueShare {
    /// Declared first: the program is detached before the rings go (when
    /// this is the interface's last queue).
    xdp: Arc<XdpAttachment>,
    rings: Mutex<FillComp>,
    /// The first socket bound here (a duplicate), named by later ones.
    first: OwnedFd,
    ifindex: u32,
    queue: u32,
    /// The steering of the program, `None` for the one-socket program.
    steer: Option<Steer>,
}

impl QueueShare {
    /// The shared rings, unless another worker is using them right now.
    fn try_rings(&self) -> Option<MutexGuard<'_, FillComp>> {
        match self.rings.try_lock() {
            Ok(g) => Some(g),
            Err(TryLockError::Poisoned(e)) => Some(e.into_inner()),
            Err(TryLockError::WouldBlock) => None,
        }
    }

    fn rings(&self) -> MutexGuard<'_, FillComp> {
        self.rings.lock().unwrap_or_else(|e| e.into_inner())
    }
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
                bindings: Mutex::new(Bindings::default()),
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
    /// Several workers share the queue: steer each frame to the socket of
    /// the worker that owns it. All sockets of the queue must use the same
    /// [`Umem`] and the same [`Steer`].
    pub steer: Option<XdpSteer>,
    /// Put the offload fast path ([`offload`]) in front of the socket
    /// redirect of this port's XDP program. Every port of a UMEM must pass
    /// the same map (or none).
    pub offload: Option<Arc<offload::XdpOffload>>,
}

/// Steering between the sockets several workers bind to one queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct XdpSteer {
    /// How the owner of a frame is found ([`crate::steer::worker_for`]).
    pub steer: Steer,
    /// The worker this socket belongs to (`< steer.workers`).
    pub worker: u16,
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
            steer: None,
            offload: None,
        }
    }
}

/// An AF_XDP port. Field order matters: the XDP program is detached before
/// the rings are unmapped and the socket closed.
pub struct AfXdpPort {
    share: Arc<QueueShare>,
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
    /// This socket's XSKMAP slot.
    slot: u32,
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
    ///
    /// The first socket of a UMEM registers it; later ones bind with
    /// `XDP_SHARED_UMEM`. On a queue this UMEM already serves (several
    /// workers, `cfg.steer` set alike), the socket joins that queue's
    /// fill/completion rings and XDP program (see the module docs);
    /// elsewhere it gets rings and a program of its own.
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
        if let Some(st) = cfg.steer {
            if st.worker >= st.steer.workers {
                return Err(IoError::Unsupported {
                    backend: BackendKind::AfXdp,
                    why: "steered worker index out of range",
                });
            }
        }
        let umem = match &cfg.umem {
            Some(u) => u.clone(),
            None => Umem::new(DEFAULT_UMEM_CHUNKS)?,
        };
        let inner = Arc::clone(&umem.inner);
        let fd = sys::socket(libc::AF_XDP, libc::SOCK_RAW, 0, "socket(AF_XDP)")?;
        let xfd = sys::raw(&fd);
        let steer = cfg.steer.map(|s| s.steer);
        let (workers, worker) = cfg.steer.map_or((1, 0), |s| {
            (u32::from(s.steer.workers), u32::from(s.worker))
        });
        let slot = cfg.queue.saturating_mul(workers).saturating_add(worker);

        // Held through bind so that one socket registers the UMEM and one
        // socket creates each queue's rings and program.
        let mut bind = inner.bindings.lock().unwrap_or_else(|e| e.into_inner());
        bind.queues.retain(|w| w.strong_count() > 0);
        let joined = bind
            .queues
            .iter()
            .filter_map(Weak::upgrade)
            .find(|q| q.ifindex == ifindex && q.queue == cfg.queue);
        if let Some(q) = &joined {
            if q.steer.is_none() || q.steer != steer {
                return Err(IoError::Unsupported {
                    backend: BackendKind::AfXdp,
                    why: "queue already bound by this UMEM without the same steering",
                });
            }
        }
        if joined.is_none() && bind.owner.is_none() {
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
        let mut opts: Vec<(i32, &'static str)> = Vec::with_capacity(4);
        if joined.is_none() {
            // A socket joining a queue must not have fill/completion rings
            // of its own (EINVAL): it uses the first socket's.
            opts.push((libc::XDP_UMEM_FILL_RING, "setsockopt(XDP_UMEM_FILL_RING)"));
            opts.push((
                libc::XDP_UMEM_COMPLETION_RING,
                "setsockopt(XDP_UMEM_COMPLETION_RING)",
            ));
        }
        opts.push((libc::XDP_RX_RING, "setsockopt(XDP_RX_RING)"));
        opts.push((libc::XDP_TX_RING, "setsockopt(XDP_TX_RING)"));
        for (opt, call) in opts {
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
        let own_rings = if joined.is_none() {
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
            Some(FillComp { fill, comp })
        } else {
            None
        };
        let rx = Ring::<XdpDesc>::map(xfd, &off.rx, rs, XDP_PGOFF_RX_RING, "mmap(XDP rx ring)")?;
        let tx = Ring::<XdpDesc>::map(xfd, &off.tx, rs, XDP_PGOFF_TX_RING, "mmap(XDP tx ring)")?;

        let shared_fd = match (&joined, &bind.owner) {
            (Some(q), _) => Some(sys::raw(&q.first)),
            (None, Some(o)) => Some(sys::raw(o)),
            (None, None) => None,
        };
        let sa = match shared_fd {
            // Shared sockets may not pass mode flags; they inherit them.
            Some(o) => sockaddr_xdp(libc::XDP_SHARED_UMEM, ifindex, cfg.queue, o as u32),
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
        let dup = || {
            fd.try_clone()
                .map_err(|e| IoError::file("dup(AF_XDP socket)", &e))
        };
        if bind.owner.is_none() {
            bind.owner = Some(dup()?);
        }

        let mut opts = 0u32;
        sys::getsockopt(
            xfd,
            libc::SOL_XDP,
            libc::XDP_OPTIONS,
            &mut opts,
            "getsockopt(XDP_OPTIONS)",
        )?;
        let share = match (joined, own_rings) {
            (Some(q), _) => q,
            (None, Some(rings)) => {
                bind.programs.retain(|p| p.1.strong_count() > 0);
                let known = bind
                    .programs
                    .iter()
                    .find(|p| p.0 == ifindex)
                    .and_then(|p| p.1.upgrade());
                let xdp = match known {
                    Some(x) if x.steer() == steer => x,
                    Some(_) => {
                        return Err(IoError::Unsupported {
                            backend: BackendKind::AfXdp,
                            why:
                                "interface already runs this UMEM's XDP program with other steering",
                        })
                    }
                    None => {
                        let (program, slots) = match steer {
                            Some(s) => (Program::Steered(s), MAP_QUEUES.saturating_mul(workers)),
                            None => (Program::PerQueue, MAP_QUEUES.max(cfg.queue + 1)),
                        };
                        let x = Arc::new(XdpAttachment::attach(
                            ifindex,
                            cfg.mode,
                            program,
                            slots,
                            cfg.offload.as_deref(),
                        )?);
                        bind.programs.push((ifindex, Arc::downgrade(&x)));
                        x
                    }
                };
                let q = Arc::new(QueueShare {
                    xdp,
                    rings: Mutex::new(rings),
                    first: dup()?,
                    ifindex,
                    queue: cfg.queue,
                    steer,
                });
                bind.queues.push(Arc::downgrade(&q));
                q
            }
            (None, None) => {
                return Err(IoError::Unsupported {
                    backend: BackendKind::AfXdp,
                    why: "no fill ring",
                })
            }
        };
        share.xdp.set_socket(slot, xfd)?;
        drop(bind);
        let lender: Arc<dyn Lender> = inner.clone();
        let mut port = Self {
            share,
            rx,
            tx,
            fd,
            umem: inner,
            lender,
            stash: Vec::with_capacity(rs as usize),
            name,
            port_id,
            queue: cfg.queue,
            slot,
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
        self.share.xdp.native()
    }

    /// Keep the (queue's shared) fill ring topped up from the pool: one
    /// pool lock per call, and only when at least 1/8 of the ring is empty.
    /// Returns whether the kernel asked for a wakeup. Skipped when another
    /// worker holds the queue's rings (it is refilling them).
    fn refill(&mut self) -> bool {
        let Some(mut r) = self.share.try_rings() else {
            return false;
        };
        let fill = &mut r.fill;
        let size = fill.size();
        let free = fill.free(size);
        if free >= size / 8 {
            let mut pool = self.umem.pool();
            let n = (free as usize).min(pool.len()) as u32;
            for k in 0..n {
                if let Some(a) = pool.pop() {
                    fill.write(k, a);
                }
            }
            drop(pool);
            fill.submit(n);
        }
        fill.needs_wakeup()
    }

    /// Move finished transmits (of every socket on this queue) back to the
    /// pool. `wait`: take the rings even if another worker holds them.
    fn reap(&mut self, wait: bool) {
        let guard = if wait {
            Some(self.share.rings())
        } else {
            self.share.try_rings()
        };
        let Some(mut r) = guard else { return };
        let comp = &mut r.comp;
        let n = comp.available(comp.size());
        if n == 0 {
            return;
        }
        let mut pool = self.umem.pool();
        for k in 0..n {
            pool.push(comp.read(k) & !(CHUNK - 1));
        }
        drop(pool);
        comp.release(n);
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
        let steer = match self.share.steer {
            Some(s) => format!(" steered {:?} slot {}/{}", s.key, self.slot, s.workers),
            None => String::new(),
        };
        format!(
            "af_xdp {} queue {}{steer} {}-xdp{} {} (link fd {})",
            self.name,
            self.queue,
            if self.share.xdp.native() {
                "native"
            } else {
                "generic"
            },
            if self.share.xdp.vlan_meta() {
                " vlan-meta"
            } else {
                ""
            },
            if self.zero_copy { "zero-copy" } else { "copy" },
            self.share.xdp.link_fd()
        )
    }

    fn rx_batch(&mut self, batch: &mut Batch) -> usize {
        let room = batch.room() as u32;
        if room == 0 {
            return 0;
        }
        let n = self.rx.available(room);
        if n == 0 {
            if self.refill() {
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
        self.reap(false);
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
        self.reap(true);
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
        // The queue's first socket stays open (other sockets name it) and
        // the program may outlive this port: take the socket out of the
        // map, or frames steered to it would fill a ring nobody reads.
        let _ = self.share.xdp.clear_socket(self.slot);
        self.umem.pool().append(&mut self.stash);
        // The UMEM's last socket: close the owner duplicate too, so that
        // the queue the first socket was bound to is free for another UMEM
        // (the gateway opens all its ports again, on new UMEMs, when an
        // interface comes back) even while frames of this one are still in
        // batches. A later socket of this UMEM registers it again.
        let mut b = self.umem.bindings.lock().unwrap_or_else(|e| e.into_inner());
        let others = Arc::strong_count(&self.share) > 1
            || b.queues
                .iter()
                .filter_map(Weak::upgrade)
                .any(|q| !Arc::ptr_eq(&q, &self.share));
        if !others {
            b.owner = None;
        }
    }
}

/// The receive queues of `ifname` the driver uses (rx plus combined
/// channels, `ETHTOOL_GCHANNELS`); 1 when it does not say.
pub fn rx_queues(ifname: &str) -> Result<u32, IoError> {
    let name = IfName::new(ifname)?;
    sys::ifindex(&name)?;
    Ok(sys::rx_queues(&name).unwrap_or(1))
}

/// One worker's share of every receive queue of an interface: with
/// several workers ([`AfXdpConfig::steer`]) each worker binds a socket to
/// each queue, since the NIC spreads frames over its queues by its own
/// hash and the XDP program can only redirect a frame to a socket of the
/// queue it arrived on. Receive polls the queues in turn; transmit uses
/// queue `worker % queues`. [`Port::poll_fd`] is the first queue's socket,
/// so an idle worker notices frames on the other queues only at its next
/// poll timeout.
pub struct AfXdpQueues {
    ports: Vec<AfXdpPort>,
    next: usize,
    tx: usize,
}

impl AfXdpQueues {
    /// Open queues `0..queues` of `ifname` with `cfg` (its `queue` is
    /// ignored); `queues` is usually [`rx_queues`].
    pub fn open(
        ifname: &str,
        port_id: u16,
        cfg: &AfXdpConfig,
        queues: u32,
    ) -> Result<Self, IoError> {
        let umem = match &cfg.umem {
            Some(u) => u.clone(),
            None => Umem::new(DEFAULT_UMEM_CHUNKS)?,
        };
        let mut ports = Vec::with_capacity(queues as usize);
        for q in 0..queues.max(1) {
            let c = AfXdpConfig {
                queue: q,
                umem: Some(umem.clone()),
                ..cfg.clone()
            };
            ports.push(AfXdpPort::open(ifname, port_id, &c)?);
        }
        let worker = cfg.steer.map_or(0, |s| usize::from(s.worker));
        Ok(Self {
            tx: worker % ports.len(),
            ports,
            next: 0,
        })
    }

    /// The per-queue ports.
    pub fn queues_mut(&mut self) -> &mut [AfXdpPort] {
        &mut self.ports
    }
}

impl Port for AfXdpQueues {
    fn name(&self) -> &str {
        self.ports.first().map_or("", |p| p.name())
    }

    fn kind(&self) -> BackendKind {
        BackendKind::AfXdp
    }

    fn describe(&self) -> String {
        let d: Vec<String> = self.ports.iter().map(Port::describe).collect();
        d.join("; ")
    }

    fn rx_batch(&mut self, batch: &mut Batch) -> usize {
        let n = self.ports.len();
        let mut got = 0;
        for k in 0..n {
            if batch.room() == 0 {
                break;
            }
            if let Some(p) = self.ports.get_mut((self.next + k) % n) {
                got += p.rx_batch(batch);
            }
        }
        self.next = (self.next + 1) % n.max(1);
        got
    }

    fn tx_batch(&mut self, batch: &mut Batch, which: &[u16]) -> usize {
        match self.ports.get_mut(self.tx) {
            Some(p) => p.tx_batch(batch, which),
            None => 0,
        }
    }

    fn flush(&mut self) -> Result<(), IoError> {
        for p in &mut self.ports {
            p.flush()?;
        }
        Ok(())
    }

    fn poll_fd(&self) -> Option<RawFd> {
        self.ports.first().and_then(Port::poll_fd)
    }

    fn stats(&mut self) -> PortStats {
        let mut t = PortStats::default();
        for p in &mut self.ports {
            let s = p.stats();
            t.rx_frames += s.rx_frames;
            t.rx_bytes += s.rx_bytes;
            t.rx_kernel_drops += s.rx_kernel_drops;
            t.rx_oversize += s.rx_oversize;
            t.tx_frames += s.tx_frames;
            t.tx_bytes += s.tx_bytes;
            t.tx_ring_full += s.tx_ring_full;
            t.tx_errors += s.tx_errors;
            t.tx_kicks += s.tx_kicks;
        }
        t
    }
}
