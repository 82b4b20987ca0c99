//! The backend-neutral [`Port`] trait and its statistics.

use core::fmt;
use std::os::fd::RawFd;

use crate::batch::Batch;
use crate::error::IoError;

/// Which backend a port runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BackendKind {
    /// In-memory queues ([`crate::memport`]), for tests.
    Mem,
    /// `AF_PACKET` with a TPACKET_V3 receive ring and a TPACKET_V2 transmit ring.
    AfPacket,
    /// `AF_XDP` sockets on a shared UMEM, fed by a small XDP program.
    AfXdp,
}

impl fmt::Display for BackendKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            BackendKind::Mem => "mem",
            BackendKind::AfPacket => "af_packet",
            BackendKind::AfXdp => "af_xdp",
        })
    }
}

/// Counters of one port. Backends that the kernel counts for (drops in the
/// ring) read them on [`Port::stats`], which may make a system call.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PortStats {
    /// Frames delivered into batches.
    pub rx_frames: u64,
    /// Bytes delivered into batches.
    pub rx_bytes: u64,
    /// Frames dropped by the kernel because the ring was full (AF_PACKET
    /// `tp_drops`, AF_XDP `rx_dropped + rx_ring_full + fill ring empty`).
    pub rx_kernel_drops: u64,
    /// Frames longer than [`crate::FRAME_CAP`], dropped at receive.
    pub rx_oversize: u64,
    /// Frames accepted by `tx_batch` (queued to the kernel or the peer).
    pub tx_frames: u64,
    /// Bytes accepted by `tx_batch`.
    pub tx_bytes: u64,
    /// Frames not accepted because the TX ring (or buffer pool) was full.
    pub tx_ring_full: u64,
    /// Frames the kernel rejected (AF_PACKET `TP_STATUS_WRONG_FORMAT`, AF_XDP
    /// invalid descriptors).
    pub tx_errors: u64,
    /// Transmit kicks (`sendto` system calls).
    pub tx_kicks: u64,
}

/// A packet port: one interface (one queue of it, or one worker's sockets on
/// all its queues) on one backend.
///
/// A port is driven by one thread. Nothing here blocks or allocates; the
/// only lock another thread can hold is the UMEM pool's, when several
/// AF_XDP workers share a UMEM (held for one bulk move of chunk addresses;
/// the shared fill/completion rings are only `try_lock`ed). The only
/// system calls on the fast path are the transmit
/// kick (at most one per `tx_batch`/`flush`) and, for AF_XDP in need-wakeup
/// mode, a receive wakeup when the kernel asks for one.
pub trait Port: Send {
    /// Interface name (or a label for mem ports).
    fn name(&self) -> &str;

    /// Backend kind.
    fn kind(&self) -> BackendKind;

    /// Human-readable mode, e.g. `"af_xdp native-xdp copy queue 0"`.
    fn describe(&self) -> String;

    /// Receive up to `batch.room()` frames, appended to `batch`. Returns how
    /// many were appended; 0 when nothing is waiting. Never blocks.
    fn rx_batch(&mut self, batch: &mut Batch) -> usize;

    /// Transmit the frames of `batch` at indices `which`, in order.
    ///
    /// Returns how many were accepted; it stops at the first one that does
    /// not fit (ring full) so the caller may retry the rest after
    /// [`Port::flush`]. Handed-over and out-of-range indices are skipped and
    /// not counted. A frame from this port's own buffer pool (AF_XDP, same
    /// UMEM) is handed over without a copy and reads as `None` afterwards;
    /// any other frame is copied and stays in the batch. One kick per call.
    fn tx_batch(&mut self, batch: &mut Batch, which: &[u16]) -> usize;

    /// Kick the kernel for anything still queued and reap transmit completions.
    fn flush(&mut self) -> Result<(), IoError>;

    /// A descriptor that polls readable when frames are waiting, if any.
    fn poll_fd(&self) -> Option<RawFd>;

    /// Counters; may read kernel counters with a system call.
    fn stats(&mut self) -> PortStats;
}

/// The receive descriptors of a worker's ports, to sleep until any of them
/// has frames: one `poll(2)` over all of them. Waiting on one port at a time
/// leaves a frame that arrives on another waiting for the timeout.
#[derive(Debug)]
pub struct PollSet {
    fds: Vec<libc::pollfd>,
}

impl PollSet {
    /// The descriptors of `ports` that have one ([`Port::poll_fd`]).
    pub fn new<'a>(ports: impl IntoIterator<Item = &'a dyn Port>) -> Self {
        let fds = ports
            .into_iter()
            .filter_map(|p| p.poll_fd())
            .map(|fd| libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        Self { fds }
    }

    /// Whether no port has a descriptor (a caller then sleeps instead).
    pub fn is_empty(&self) -> bool {
        self.fds.is_empty()
    }

    /// Waits up to `timeout_ms` for any of the descriptors to be readable.
    /// Returns whether one is (false on the timeout or a signal).
    pub fn wait(&mut self, timeout_ms: i32) -> Result<bool, IoError> {
        crate::sys::poll_any(&mut self.fds, timeout_ms)
    }
}

/// Wait up to `timeout_ms` for `port` to have frames (poll on its descriptor).
/// Ports without a descriptor (mem) return `Ok(true)` at once.
pub fn wait_readable(port: &dyn Port, timeout_ms: i32) -> Result<bool, IoError> {
    match port.poll_fd() {
        Some(fd) => crate::sys::poll_in(fd, timeout_ms),
        None => Ok(true),
    }
}
