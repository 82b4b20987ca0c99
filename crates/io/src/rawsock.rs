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
        // SAFETY: sockaddr_ll is plain data; all-zero is valid.
        let mut sll: libc::sockaddr_ll = unsafe { core::mem::zeroed() };
        sll.sll_family = libc::AF_PACKET as u16;
        sll.sll_protocol = sys::htons(libc::ETH_P_ALL as u16);
        sll.sll_ifindex = ifindex as i32;
        // SAFETY: `sll` is a valid sockaddr_ll and we pass its size.
        let r = unsafe {
            libc::bind(
                sys::raw(&fd),
                (&sll as *const libc::sockaddr_ll).cast(),
                core::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
            )
        };
        if r < 0 {
            return Err(IoError::last("bind(AF_PACKET raw)"));
        }
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
