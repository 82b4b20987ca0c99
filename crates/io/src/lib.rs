//! `sluice-io`: packet I/O backends (mem, pcap, AF_PACKET, AF_XDP) and the few
//! hardware/OS primitives the fast path needs (prefetch, huge-page advice).
//!
//! This is the only crate in the workspace that contains `unsafe`. Every
//! unsafe block carries a `// SAFETY:` comment that states why it is sound.
//!
//! # What it owns
//!
//! - [`Batch`]: up to [`BATCH_CAP`] frames the engine mutates in place.
//! - [`Port`]: batch receive/transmit over one interface, backend-neutral.
//!   Backends: [`memport`] (in-memory queues, for tests), [`afpacket`]
//!   (TPACKET_V3 rx ring, TPACKET_V2 tx ring) and [`afxdp`] (XDP sockets on a
//!   shared UMEM, zero-copy forwarding between its ports).
//! - [`open`]: choose a backend by name, with `Auto` falling back from
//!   AF_XDP to AF_PACKET.
//! - [`steer`]: which worker owns a frame (NAT replies by destination
//!   port) when several workers share an interface, and the classic-BPF
//!   fanout program that applies it on AF_PACKET; [`afxdp::bpf`] has the
//!   XDP program that applies it on AF_XDP ([`AfXdpConfig::steer`],
//!   [`AfXdpQueues`]).
//! - [`xdpgen`]: a traffic generator that enters a veth as XDP frames
//!   (`BPF_PROG_RUN` with live frames), for `sluice bench forward`.
//! - [`pcap`]: `--capture` (classic pcap, rx and tx in two files).
//! - [`nft::IngressDrop`]: keeps the kernel stack off interfaces an
//!   AF_PACKET port owns.
//! - [`netns`] and [`rawsock`]: namespace and raw-socket helpers for tests
//!   and the tester.
//! - [`alloc::allow_transparent_huge_pages`]: huge pages for the advised
//!   tables again after the global allocator (mimalloc, `no_thp`) disabled
//!   them for the process.
//!
//! # Invariants
//!
//! - Nothing on the packet path (`rx_batch`, `tx_batch`, `flush`, batch
//!   access) allocates or panics on packet data; the only locks are the
//!   per-batch UMEM pool lock (uncontended when one worker drives a UMEM,
//!   shared by the workers when they steer one queue) and, for AF_XDP
//!   sockets of several workers on one queue, that queue's fill/completion
//!   ring lock, which the packet path only `try_lock`s.
//! - A frame's bytes are reachable through exactly one `Batch` or one ring
//!   at a time; see [`batch`] for the ownership rules.
//! - Every kernel object a port creates (sockets, rings, XDP program and
//!   link, promiscuous membership) is released when the port is dropped.
#![deny(unsafe_op_in_unsafe_fn)]
#![deny(clippy::undocumented_unsafe_blocks)]

pub mod afpacket;
pub mod afxdp;
pub mod alloc;
pub mod batch;
pub mod error;
pub mod flock;
pub mod link;
pub mod mem;
pub mod memport;
pub mod netns;
pub mod nft;
pub mod pcap;
pub mod port;
pub mod rawsock;
pub mod sched;
pub mod spin;
pub mod steer;
mod sys;
pub mod unixsock;
pub mod xdpgen;

pub use afpacket::{AfPacketConfig, AfPacketPort, RxRing};
pub use afxdp::bpf::XdpMode;
pub use afxdp::offload::{
    OffloadAction, OffloadAction6, OffloadKey, OffloadKey6, OffloadStats, XdpOffload,
};
pub use afxdp::{AfXdpConfig, AfXdpPort, AfXdpQueues, Umem, XdpSteer};
pub use batch::{Batch, FrameMeta, BATCH_CAP, FRAME_CAP};
pub use error::{IfName, IoError};
pub use port::{wait_readable, BackendKind, PollSet, Port, PortStats};

/// Which backend [`open`] should use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// AF_XDP, else AF_PACKET (the reason is logged at `warn`).
    Auto,
    /// AF_XDP only.
    AfXdp,
    /// AF_PACKET only.
    AfPacket,
}

/// Options for [`open`].
#[derive(Clone, Debug, Default)]
pub struct OpenOptions {
    /// Port number written into every received frame's [`FrameMeta`].
    pub port_id: u16,
    /// AF_PACKET settings (fanout group, promiscuous mode, ring sizes).
    pub af_packet: AfPacketConfig,
    /// AF_XDP settings (queue, shared UMEM, ring size, attach mode).
    pub af_xdp: AfXdpConfig,
}

/// Open `ifname` on `backend`. With [`Backend::Auto`], AF_XDP is tried first
/// and AF_PACKET is used if it fails; the AF_XDP error is logged.
///
/// With [`AfXdpConfig::steer`] (several workers), AF_XDP binds every
/// receive queue of the interface ([`AfXdpQueues`]), not only
/// `opts.af_xdp.queue`.
pub fn open(ifname: &str, backend: Backend, opts: &OpenOptions) -> Result<Box<dyn Port>, IoError> {
    match backend {
        Backend::AfXdp => open_xdp(ifname, opts),
        Backend::AfPacket => Ok(Box::new(AfPacketPort::open(
            ifname,
            opts.port_id,
            &opts.af_packet,
        )?)),
        Backend::Auto => match open_xdp(ifname, opts) {
            Ok(p) => Ok(p),
            Err(e @ (IoError::NoSuchInterface(_) | IoError::BadInterfaceName)) => Err(e),
            Err(e) => {
                tracing::warn!(
                    interface = ifname,
                    "AF_XDP unavailable ({e}); falling back to AF_PACKET"
                );
                Ok(Box::new(AfPacketPort::open(
                    ifname,
                    opts.port_id,
                    &opts.af_packet,
                )?))
            }
        },
    }
}

fn open_xdp(ifname: &str, opts: &OpenOptions) -> Result<Box<dyn Port>, IoError> {
    let cfg = &opts.af_xdp;
    if cfg.steer.is_some() {
        let queues = afxdp::rx_queues(ifname)?;
        if queues > 1 {
            return Ok(Box::new(AfXdpQueues::open(
                ifname,
                opts.port_id,
                cfg,
                queues,
            )?));
        }
    }
    Ok(Box::new(AfXdpPort::open(ifname, opts.port_id, cfg)?))
}
