//! The typed error of this crate: which call failed, and why.

use core::fmt;

use crate::port::BackendKind;

/// An interface name as the kernel stores it (at most 15 bytes, `IFNAMSIZ` - 1).
///
/// It is `Copy` so that [`IoError`] can stay a small `Copy` enum.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct IfName {
    bytes: [u8; 16],
    len: u8,
}

impl IfName {
    /// Maximum length of an interface name in bytes.
    pub const MAX_LEN: usize = 15;

    /// Validate `name` as a Linux interface name: 1 to 15 bytes, no NUL, `/`
    /// or whitespace.
    pub fn new(name: &str) -> Result<Self, IoError> {
        let b = name.as_bytes();
        if b.is_empty()
            || b.len() > Self::MAX_LEN
            || b.iter()
                .any(|&c| c == 0 || c == b'/' || c.is_ascii_whitespace())
        {
            return Err(IoError::BadInterfaceName);
        }
        let mut bytes = [0u8; 16];
        bytes[..b.len()].copy_from_slice(b);
        Ok(Self {
            bytes,
            len: b.len() as u8,
        })
    }

    /// The name as a string.
    pub fn as_str(&self) -> &str {
        // The bytes were copied from a `&str` and cut at a length we checked,
        // but a cut could split a UTF-8 sequence only if we truncated; we never do.
        core::str::from_utf8(&self.bytes[..usize::from(self.len)]).unwrap_or("?")
    }

    /// The name followed by a NUL byte, for C calls.
    pub(crate) fn as_cstr_bytes(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len) + 1]
    }
}

impl fmt::Display for IfName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Debug for IfName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.as_str())
    }
}

/// Everything that can go wrong while opening or driving a port.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IoError {
    /// A system call failed. `call` names the call and, where it helps, the
    /// option (`"setsockopt(PACKET_RX_RING)"`); `errno` is the raw error number.
    Syscall { call: &'static str, errno: i32 },
    /// The interface name is empty, longer than 15 bytes, or contains NUL,
    /// `/` or whitespace.
    BadInterfaceName,
    /// No interface with this name exists in the current network namespace.
    NoSuchInterface(IfName),
    /// The backend cannot be used with these options or on this interface.
    Unsupported {
        backend: BackendKind,
        why: &'static str,
    },
    /// A helper program (`nft`, `ip`) could not be run or exited with an error.
    Subprocess {
        program: &'static str,
        status: Option<i32>,
    },
    /// A file (pcap capture) could not be written or read.
    File { op: &'static str, errno: i32 },
    /// A capture file is not a classic pcap file we can read.
    BadPcap(&'static str),
}

impl IoError {
    /// Build a [`IoError::Syscall`] from the calling thread's `errno`.
    pub(crate) fn last(call: &'static str) -> Self {
        IoError::Syscall {
            call,
            errno: errno(),
        }
    }

    /// Build a [`IoError::File`] from a `std::io::Error`.
    pub(crate) fn file(op: &'static str, e: &std::io::Error) -> Self {
        IoError::File {
            op,
            errno: e.raw_os_error().unwrap_or(0),
        }
    }

    /// Whether the resource is busy (`EBUSY`): e.g. an AF_XDP queue that a
    /// socket closed just now still holds.
    pub fn is_busy(&self) -> bool {
        self.errno() == Some(libc::EBUSY)
    }

    /// The errno carried by this error, if any.
    pub fn errno(&self) -> Option<i32> {
        match *self {
            IoError::Syscall { errno, .. } | IoError::File { errno, .. } => Some(errno),
            _ => None,
        }
    }
}

/// The calling thread's `errno`.
pub(crate) fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

fn strerror(errno: i32) -> String {
    // std formats "Operation not permitted (os error 1)"; keep only the text.
    let s = std::io::Error::from_raw_os_error(errno).to_string();
    match s.rfind(" (os error") {
        Some(i) => s[..i].to_string(),
        None => s,
    }
}

fn errno_name(errno: i32) -> &'static str {
    match errno {
        libc::EPERM => "EPERM",
        libc::ENOENT => "ENOENT",
        libc::EINTR => "EINTR",
        libc::EBADF => "EBADF",
        libc::EAGAIN => "EAGAIN",
        libc::ENOMEM => "ENOMEM",
        libc::EACCES => "EACCES",
        libc::EBUSY => "EBUSY",
        libc::EEXIST => "EEXIST",
        libc::ENODEV => "ENODEV",
        libc::EINVAL => "EINVAL",
        libc::ENOSPC => "ENOSPC",
        libc::ENOBUFS => "ENOBUFS",
        libc::EOPNOTSUPP => "EOPNOTSUPP",
        libc::EAFNOSUPPORT => "EAFNOSUPPORT",
        libc::EADDRINUSE => "EADDRINUSE",
        libc::ENETDOWN => "ENETDOWN",
        libc::ENXIO => "ENXIO",
        libc::E2BIG => "E2BIG",
        _ => "errno",
    }
}

impl fmt::Display for IoError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            IoError::Syscall { call, errno } => write!(
                f,
                "{call} failed: {} ({} {errno})",
                strerror(errno),
                errno_name(errno)
            ),
            IoError::BadInterfaceName => {
                f.write_str("invalid interface name (1 to 15 bytes, no NUL, '/' or spaces)")
            }
            IoError::NoSuchInterface(n) => write!(f, "no interface named {n:?} in this namespace"),
            IoError::Unsupported { backend, why } => write!(f, "{backend} unavailable: {why}"),
            IoError::Subprocess {
                program,
                status: Some(c),
            } => {
                write!(f, "{program} exited with status {c}")
            }
            IoError::Subprocess {
                program,
                status: None,
            } => {
                write!(f, "{program} could not be run or was killed by a signal")
            }
            IoError::File { op, errno } => {
                write!(
                    f,
                    "{op} failed: {} ({} {errno})",
                    strerror(errno),
                    errno_name(errno)
                )
            }
            IoError::BadPcap(why) => write!(f, "not a readable pcap file: {why}"),
        }
    }
}

impl std::error::Error for IoError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_names_the_call_and_errno() {
        let e = IoError::Syscall {
            call: "setsockopt(PACKET_RX_RING)",
            errno: libc::EPERM,
        };
        let s = e.to_string();
        assert!(s.starts_with("setsockopt(PACKET_RX_RING) failed: "), "{s}");
        assert!(s.ends_with("(EPERM 1)"), "{s}");
    }

    #[test]
    fn ifname_validation() {
        assert!(IfName::new("veth0").is_ok());
        assert_eq!(IfName::new(""), Err(IoError::BadInterfaceName));
        assert_eq!(
            IfName::new("a234567890123456"),
            Err(IoError::BadInterfaceName)
        );
        assert_eq!(IfName::new("a/b"), Err(IoError::BadInterfaceName));
        let n = IfName::new("eth1").unwrap();
        assert_eq!(n.as_cstr_bytes(), b"eth1\0");
        assert_eq!(n.to_string(), "eth1");
    }
}
