//! A plain AF_PACKET socket, one frame per system call: the reference
//! sender/receiver for tests (and small tools). Not a backend.

use std::os::fd::OwnedFd;

use crate::error::{IfName, IoError};
use crate::sys;

/// A raw packet socket bound to one interface (all protocols), ignoring
/// its own outgoing frames.
#[derive(Debug)]
pub struct RawSocket {
    fd: OwnedFd,
}

impl RawSocket {
    /// Bind to `ifname` in the calling thread's network namespace.
    pub fn open(ifname: &str) -> Result<Self, IoError> {
        let name = IfName::new(ifname)?;
        let ifindex = sys::ifindex(&name)?;
        let fd = sys::socket(libc::AF_PACKET, libc::SOCK_RAW, 0, "socket(AF_PACKET)")?;
        let one: i32 = 1;
        sys::setsockopt(
            sys::raw(&fd),
            libc::SOL_PACKET,
            libc::PACKET_IGNORE_OUTGOING,
            &one,
            "setsockopt(PACKET_IGNORE_OUTGOING)",
        )?;
        bind_ll(
            &fd,
            ifindex,
            sys::htons(libc::ETH_P_ALL as u16),
            "bind(AF_PACKET raw)",
        )?;
        // A test reads thousands of frames after sending them; 16 MiB holds
        // them (SO_RCVBUFFORCE needs CAP_NET_ADMIN; best effort).
        let buf: i32 = 16 << 20;
        let _ = sys::setsockopt(
            sys::raw(&fd),
            libc::SOL_SOCKET,
            libc::SO_RCVBUFFORCE,
            &buf,
            "setsockopt(SO_RCVBUFFORCE)",
        );
        Ok(Self { fd })
    }

    /// Send one frame (blocking).
    pub fn send(&self, frame: &[u8]) -> Result<(), IoError> {
        // SAFETY: `frame` is a valid slice for reads of its length.
        let r = unsafe { libc::send(sys::raw(&self.fd), frame.as_ptr().cast(), frame.len(), 0) };
        if r < 0 {
            return Err(IoError::last("send(AF_PACKET raw)"));
        }
        Ok(())
    }

    /// Receive one frame into `buf`, waiting up to `timeout_ms`. Returns the
    /// frame length, or `None` on timeout.
    pub fn recv(&self, buf: &mut [u8], timeout_ms: i32) -> Result<Option<usize>, IoError> {
        if !sys::poll_in(sys::raw(&self.fd), timeout_ms)? {
            return Ok(None);
        }
        // SAFETY: `buf` is a valid, writable slice of its length.
        let r = unsafe {
            libc::recv(
                sys::raw(&self.fd),
                buf.as_mut_ptr().cast(),
                buf.len(),
                libc::MSG_DONTWAIT,
            )
        };
        if r < 0 {
            let e = crate::error::errno();
            if e == libc::EAGAIN {
                return Ok(None);
            }
            return Err(IoError::Syscall {
                call: "recv(AF_PACKET raw)",
                errno: e,
            });
        }
        Ok(Some(r as usize))
    }
}

/// Most frames one [`BatchSender::send_batch`] call passes to the kernel.
pub const SEND_BATCH_MAX: usize = 256;

/// A transmit-only AF_PACKET socket for traffic generators: one
/// `sendmmsg` per batch of up to [`SEND_BATCH_MAX`] frames, qdisc bypass,
/// a large send buffer. Each frame becomes a linear skb (unlike a
/// `PACKET_TX_RING`, whose skbs point into the ring and are copied again
/// when they cross a veth into another namespace). It is bound with
/// protocol 0, so it receives nothing. Not a backend.
#[derive(Debug)]
pub struct BatchSender {
    fd: OwnedFd,
}

impl BatchSender {
    /// Open on `ifname` in the calling thread's network namespace. The
    /// send buffer is `sndbuf` bytes (`SO_SNDBUFFORCE`, best effort): it
    /// bounds the frames in flight, and hence how far the sender can run
    /// ahead of a slower receiver.
    pub fn open(ifname: &str, sndbuf: i32) -> Result<Self, IoError> {
        let name = IfName::new(ifname)?;
        let ifindex = sys::ifindex(&name)?;
        let fd = sys::socket(libc::AF_PACKET, libc::SOCK_RAW, 0, "socket(AF_PACKET)")?;
        let one: i32 = 1;
        sys::setsockopt(
            sys::raw(&fd),
            libc::SOL_PACKET,
            libc::PACKET_QDISC_BYPASS,
            &one,
            "setsockopt(PACKET_QDISC_BYPASS)",
        )?;
        let _ = sys::setsockopt(
            sys::raw(&fd),
            libc::SOL_SOCKET,
            libc::SO_SNDBUFFORCE,
            &sndbuf,
            "setsockopt(SO_SNDBUFFORCE)",
        );
        bind_ll(&fd, ifindex, 0, "bind(AF_PACKET tx)")?;
        Ok(Self { fd })
    }

    /// Send up to [`SEND_BATCH_MAX`] frames with one `sendmmsg`, blocking
    /// while the send buffer is full. Returns how many the kernel took.
    pub fn send_batch<F: AsRef<[u8]>>(&self, frames: &[F]) -> Result<usize, IoError> {
        let n = frames.len().min(SEND_BATCH_MAX);
        // SAFETY: iovec and mmsghdr are plain data; all-zero is valid (null
        // pointers, zero lengths).
        let mut iov: [libc::iovec; SEND_BATCH_MAX] = unsafe { core::mem::zeroed() };
        // SAFETY: as above.
        let mut msgs: [libc::mmsghdr; SEND_BATCH_MAX] = unsafe { core::mem::zeroed() };
        for ((f, v), m) in frames
            .iter()
            .zip(iov.iter_mut())
            .zip(msgs.iter_mut())
            .take(n)
        {
            let b = f.as_ref();
            v.iov_base = b.as_ptr() as *mut libc::c_void;
            v.iov_len = b.len();
            m.msg_hdr.msg_iov = v;
            m.msg_hdr.msg_iovlen = 1;
        }
        // SAFETY: the first `n` headers each point at one iovec that
        // describes a live, readable frame slice borrowed for this call; the
        // kernel only reads them. The socket is bound, so no address is
        // needed.
        let r = unsafe { libc::sendmmsg(sys::raw(&self.fd), msgs.as_mut_ptr(), n as u32, 0) };
        if r < 0 {
            return Err(IoError::last("sendmmsg(AF_PACKET)"));
        }
        Ok(r as usize)
    }
}

/// Binds an AF_PACKET socket to interface `ifindex` for `protocol` (network
/// byte order; 0: transmit only).
fn bind_ll(fd: &OwnedFd, ifindex: u32, protocol: u16, what: &'static str) -> Result<(), IoError> {
    // SAFETY: sockaddr_ll is plain data; all-zero is valid.
    let mut sll: libc::sockaddr_ll = unsafe { core::mem::zeroed() };
    sll.sll_family = libc::AF_PACKET as u16;
    sll.sll_protocol = protocol;
    sll.sll_ifindex = ifindex as i32;
    // SAFETY: `sll` is a valid sockaddr_ll and we pass its size.
    let r = unsafe {
        libc::bind(
            sys::raw(fd),
            (&sll as *const libc::sockaddr_ll).cast(),
            core::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
        )
    };
    if r < 0 {
        return Err(IoError::last(what));
    }
    Ok(())
}
