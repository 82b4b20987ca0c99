//! Thin, checked wrappers over the system calls the backends share: file
//! descriptors, `mmap`, socket options and interface lookup.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::ptr::NonNull;

use crate::error::{IfName, IoError};

/// Create a socket; the descriptor is close-on-exec.
pub(crate) fn socket(
    domain: i32,
    ty: i32,
    proto: i32,
    call: &'static str,
) -> Result<OwnedFd, IoError> {
    // SAFETY: socket(2) takes only integers and returns a new descriptor or -1.
    let fd = unsafe { libc::socket(domain, ty | libc::SOCK_CLOEXEC, proto) };
    if fd < 0 {
        return Err(IoError::last(call));
    }
    // SAFETY: `fd` was just returned by socket(2), is open, and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `setsockopt` with a `struct sock_fprog` pointing at `prog` (classic BPF:
/// `SO_ATTACH_FILTER`, `PACKET_FANOUT_DATA`).
pub(crate) fn set_socket_filter(
    fd: RawFd,
    level: i32,
    name: i32,
    prog: &[libc::sock_filter],
    call: &'static str,
) -> Result<(), IoError> {
    let len = u16::try_from(prog.len()).map_err(|_| IoError::Syscall {
        call,
        errno: libc::EINVAL,
    })?;
    let fprog = libc::sock_fprog {
        len,
        filter: prog.as_ptr().cast_mut(),
    };
    // SAFETY: `fprog` is a live `sock_fprog` of the length we pass, and its
    // `filter` points at `len` instructions borrowed for the whole call; the
    // kernel copies the program and writes through neither pointer.
    let r = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            (&fprog as *const libc::sock_fprog).cast(),
            core::mem::size_of::<libc::sock_fprog>() as libc::socklen_t,
        )
    };
    if r < 0 {
        return Err(IoError::last(call));
    }
    Ok(())
}

/// `setsockopt` with a plain-old-data value.
pub(crate) fn setsockopt<T: Copy>(
    fd: RawFd,
    level: i32,
    name: i32,
    val: &T,
    call: &'static str,
) -> Result<(), IoError> {
    // SAFETY: `val` points to a live `T` of exactly the length we pass; the
    // kernel only reads it.
    let r = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            (val as *const T).cast(),
            core::mem::size_of::<T>() as libc::socklen_t,
        )
    };
    if r < 0 {
        return Err(IoError::last(call));
    }
    Ok(())
}

/// `getsockopt` into a plain-old-data value; returns the length the kernel wrote.
pub(crate) fn getsockopt<T: Copy>(
    fd: RawFd,
    level: i32,
    name: i32,
    val: &mut T,
    call: &'static str,
) -> Result<usize, IoError> {
    let mut len = core::mem::size_of::<T>() as libc::socklen_t;
    // SAFETY: `val` is a live, writable `T` and `len` holds its size, so the
    // kernel writes at most that many bytes into it. `T: Copy` POD types used
    // here accept any bit pattern.
    let r = unsafe { libc::getsockopt(fd, level, name, (val as *mut T).cast(), &mut len) };
    if r < 0 {
        return Err(IoError::last(call));
    }
    Ok(len as usize)
}

/// Interface index of `name` in the calling thread's network namespace.
pub(crate) fn ifindex(name: &IfName) -> Result<u32, IoError> {
    let c = name.as_cstr_bytes();
    // SAFETY: `c` is NUL-terminated (IfName guarantees it) and outlives the call.
    let idx = unsafe { libc::if_nametoindex(c.as_ptr().cast()) };
    if idx == 0 {
        let e = crate::error::errno();
        if e == libc::ENODEV || e == libc::ENXIO || e == 0 {
            return Err(IoError::NoSuchInterface(*name));
        }
        return Err(IoError::Syscall {
            call: "if_nametoindex",
            errno: e,
        });
    }
    Ok(idx)
}

/// The flags of interface `name` (`SIOCGIFFLAGS`: `IFF_UP`,
/// `IFF_RUNNING`, ...), or `None` when there is no such interface.
pub(crate) fn if_flags(name: &IfName) -> Result<Option<u32>, IoError> {
    // SAFETY: a plain socket(2) call; the descriptor is owned right after.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(IoError::Syscall {
            call: "socket(AF_INET, SOCK_DGRAM)",
            errno: crate::error::errno(),
        });
    }
    // SAFETY: `fd` was just returned by socket(2) and nothing else owns it.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: `ifreq` is plain data (a name and a union of integers and
    // addresses), for which all-zero bytes are valid.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    let c = name.as_cstr_bytes();
    for (d, s) in req.ifr_name.iter_mut().zip(c.iter()) {
        *d = *s as libc::c_char;
    }
    // SAFETY: `req` is a live ifreq with a NUL-terminated name (IfName is
    // at most 15 bytes and `ifr_name` is 16, zeroed); SIOCGIFFLAGS writes
    // only `ifr_flags` inside it.
    let r = unsafe { libc::ioctl(raw(&fd), libc::SIOCGIFFLAGS, &mut req) };
    if r < 0 {
        let e = crate::error::errno();
        if e == libc::ENODEV || e == libc::ENXIO {
            return Ok(None);
        }
        return Err(IoError::Syscall {
            call: "ioctl(SIOCGIFFLAGS)",
            errno: e,
        });
    }
    // SAFETY: SIOCGIFFLAGS filled the `ifru_flags` member of the union.
    Ok(Some(u32::from(unsafe { req.ifr_ifru.ifru_flags } as u16)))
}

/// Send with no payload: the "kick" that tells the kernel a TX ring has work.
/// Returns the errno on failure (callers decide which ones matter).
pub(crate) fn kick_tx(fd: RawFd) -> Result<(), i32> {
    // SAFETY: a zero-length sendto with null buffer and address is valid for
    // packet and XDP sockets; nothing is read from user memory.
    let r = unsafe {
        libc::sendto(
            fd,
            core::ptr::null(),
            0,
            libc::MSG_DONTWAIT,
            core::ptr::null(),
            0,
        )
    };
    if r < 0 {
        return Err(crate::error::errno());
    }
    Ok(())
}

/// Wait up to `timeout_ms` for `fd` to become readable. Returns whether it is.
pub(crate) fn poll_in(fd: RawFd, timeout_ms: i32) -> Result<bool, IoError> {
    let mut p = [libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    }];
    poll_any(&mut p, timeout_ms)
}

/// Wait up to `timeout_ms` for any of `fds` (with `events` set) to be
/// readable. Returns whether one is (false on the timeout or EINTR).
pub(crate) fn poll_any(fds: &mut [libc::pollfd], timeout_ms: i32) -> Result<bool, IoError> {
    for p in fds.iter_mut() {
        p.revents = 0;
    }
    // SAFETY: `fds` is a live, writable slice of pollfd structures and we
    // pass its length, so the kernel reads and writes only within it.
    let r = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout_ms) };
    if r < 0 {
        let e = crate::error::errno();
        if e == libc::EINTR {
            return Ok(false);
        }
        return Err(IoError::Syscall {
            call: "poll",
            errno: e,
        });
    }
    // A socket with a pending error (a packet socket gets ENETDOWN when
    // its interface goes down, ENODEV when it goes away) is reported by
    // every poll until the error is read: take it, so that the next poll
    // sleeps again instead of returning at once forever.
    for p in fds.iter() {
        if p.revents & libc::POLLERR != 0 {
            let mut err: libc::c_int = 0;
            let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
            // SAFETY: `err` and `len` are live locals of the sizes given;
            // SO_ERROR writes an int and clears the socket's pending error.
            unsafe {
                libc::getsockopt(
                    p.fd,
                    libc::SOL_SOCKET,
                    libc::SO_ERROR,
                    (&mut err as *mut libc::c_int).cast::<libc::c_void>(),
                    &mut len,
                )
            };
        }
    }
    Ok(fds.iter().any(|p| p.revents & libc::POLLIN != 0))
}

/// A shared memory mapping, unmapped on drop.
///
/// The region is either anonymous (UMEM) or a ring mapped from a socket. Its
/// bytes are shared with the kernel, so this type never hands out Rust
/// references to them; users read and write through raw pointers under the
/// ring protocols documented where they are used.
#[derive(Debug)]
pub(crate) struct Mmap {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is plain memory owned by this value; moving it to
// another thread moves the right to unmap it. Access to the bytes is through
// raw pointers whose synchronisation is the user's responsibility.
unsafe impl Send for Mmap {}
// SAFETY: `&Mmap` only exposes the base pointer and length, never references
// to the bytes themselves.
unsafe impl Sync for Mmap {}

impl Mmap {
    /// Map `len` bytes of `fd` at `offset`, shared, read-write, populated.
    pub(crate) fn socket_ring(
        fd: RawFd,
        len: usize,
        offset: i64,
        call: &'static str,
    ) -> Result<Self, IoError> {
        Self::map(fd, len, offset, libc::MAP_SHARED | libc::MAP_POPULATE, call)
    }

    /// Map `len` bytes of anonymous, private, zeroed memory.
    pub(crate) fn anonymous(len: usize, call: &'static str) -> Result<Self, IoError> {
        Self::map(
            -1,
            len,
            0,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE,
            call,
        )
    }

    fn map(
        fd: RawFd,
        len: usize,
        offset: i64,
        flags: i32,
        call: &'static str,
    ) -> Result<Self, IoError> {
        // SAFETY: we ask for a fresh mapping (no MAP_FIXED), so no existing
        // memory is affected; the result is checked against MAP_FAILED.
        let p = unsafe {
            libc::mmap(
                core::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                flags,
                fd,
                offset as libc::off_t,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(IoError::last(call));
        }
        let ptr = NonNull::new(p.cast::<u8>()).ok_or(IoError::Syscall { call, errno: 0 })?;
        Ok(Self { ptr, len })
    }

    pub(crate) fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }
}

impl Drop for Mmap {
    fn drop(&mut self) {
        // SAFETY: ptr/len are exactly what mmap returned and the mapping has
        // not been unmapped before (we own it).
        unsafe {
            libc::munmap(self.ptr.as_ptr().cast(), self.len);
        }
    }
}

/// Borrow an `OwnedFd`'s raw number (short helper for call sites).
pub(crate) fn raw(fd: &OwnedFd) -> RawFd {
    fd.as_raw_fd()
}

/// `htons` for the protocol numbers AF_PACKET wants in network byte order.
pub(crate) const fn htons(v: u16) -> u16 {
    v.to_be()
}

/// `struct ethtool_channels`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct EthtoolChannels {
    cmd: u32,
    max_rx: u32,
    max_tx: u32,
    max_other: u32,
    max_combined: u32,
    rx_count: u32,
    tx_count: u32,
    other_count: u32,
    combined_count: u32,
}

/// `struct ifreq` with its union as the `ifr_data` pointer.
#[repr(C)]
struct IfreqData {
    name: [u8; libc::IFNAMSIZ],
    data: *mut libc::c_void,
    _pad: [u8; 16],
}

const ETHTOOL_GCHANNELS: u32 = 0x3c;
const ETHTOOL_GDRVINFO: u32 = 0x03;

/// `struct ethtool_drvinfo`.
#[repr(C)]
#[derive(Clone, Copy)]
struct EthtoolDrvinfo {
    cmd: u32,
    driver: [u8; 32],
    version: [u8; 32],
    fw_version: [u8; 32],
    bus_info: [u8; 32],
    erom_version: [u8; 32],
    reserved2: [u8; 12],
    n_priv_flags: u32,
    n_stats: u32,
    testinfo_len: u32,
    eedump_len: u32,
    regdump_len: u32,
}

/// An ethtool request (`SIOCETHTOOL`) on `name`. `T` is the `repr(C)`
/// ethtool struct of the command that `cmd` (its first `u32`) names;
/// `false` when the call fails.
fn ethtool<T: Copy>(name: &IfName, cmd: &mut T) -> bool {
    let Ok(fd) = socket(libc::AF_UNIX, libc::SOCK_DGRAM, 0, "socket(AF_UNIX)") else {
        return false;
    };
    let mut ifr = IfreqData {
        name: [0; libc::IFNAMSIZ],
        data: (cmd as *mut T).cast(),
        _pad: [0; 16],
    };
    let c = name.as_cstr_bytes();
    let n = c.len().min(libc::IFNAMSIZ - 1);
    ifr.name[..n].copy_from_slice(&c[..n]);
    // SAFETY: `ifr` is a live ifreq whose name is NUL-terminated and whose
    // data pointer points at `cmd`, a live ethtool struct of the command
    // its first word names (the callers pair them); the kernel reads that
    // word and writes at most the struct, nothing else.
    let r = unsafe { libc::ioctl(raw(&fd), libc::SIOCETHTOOL, &mut ifr as *mut IfreqData) };
    r >= 0
}

/// The driver of `name` (`ETHTOOL_GDRVINFO`, what `ethtool -i` prints),
/// or `None` when it cannot be read.
pub(crate) fn driver(name: &IfName) -> Option<String> {
    let mut info = EthtoolDrvinfo {
        cmd: ETHTOOL_GDRVINFO,
        driver: [0; 32],
        version: [0; 32],
        fw_version: [0; 32],
        bus_info: [0; 32],
        erom_version: [0; 32],
        reserved2: [0; 12],
        n_priv_flags: 0,
        n_stats: 0,
        testinfo_len: 0,
        eedump_len: 0,
        regdump_len: 0,
    };
    if !ethtool(name, &mut info) {
        return None;
    }
    let end = info.driver.iter().position(|&b| b == 0).unwrap_or(32);
    Some(String::from_utf8_lossy(&info.driver[..end]).into_owned())
}

/// The receive queues of `name` in use (`ETHTOOL_GCHANNELS`: rx plus
/// combined channels), or `None` when the driver does not say.
pub(crate) fn rx_queues(name: &IfName) -> Option<u32> {
    let mut ch = EthtoolChannels {
        cmd: ETHTOOL_GCHANNELS,
        ..EthtoolChannels::default()
    };
    if !ethtool(name, &mut ch) {
        return None;
    }
    let q = ch.rx_count.saturating_add(ch.combined_count);
    (q > 0).then_some(q)
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::os::fd::{AsRawFd, RawFd};
    use std::os::unix::net::UnixStream;

    fn pfd(fd: RawFd) -> libc::pollfd {
        libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        }
    }

    #[test]
    fn poll_any_wakes_for_any_descriptor_and_times_out_otherwise() {
        let (mut a1, b1) = UnixStream::pair().expect("pair");
        let (mut a2, b2) = UnixStream::pair().expect("pair");
        let mut fds = [pfd(b1.as_raw_fd()), pfd(b2.as_raw_fd())];
        // Nothing queued: the timeout.
        assert!(!super::poll_any(&mut fds, 10).expect("poll"));
        // Data on the second descriptor only: readable, and it is the one
        // reported.
        a2.write_all(b"x").expect("write");
        assert!(super::poll_any(&mut fds, 1000).expect("poll"));
        assert_eq!(fds[0].revents & libc::POLLIN, 0);
        assert_ne!(fds[1].revents & libc::POLLIN, 0);
        // Stale revents are cleared on the next call.
        a1.write_all(b"y").expect("write");
        assert!(super::poll_any(&mut fds, 1000).expect("poll"));
        assert_ne!(fds[0].revents & libc::POLLIN, 0);
        drop((b1, b2));
    }
}
