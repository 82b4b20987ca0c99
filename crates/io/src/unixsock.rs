//! A Unix listening socket whose file is never more open than asked.
//!
//! `bind(2)` creates the socket file with the mode the process umask
//! leaves (a umask of 0022 gives 0755; 0002 or 0 would let other users
//! connect to a control socket, which can replace the rule set). Here the
//! file is created under a umask of 0177 (so at most 0600 from the start),
//! then given the group and the mode asked for: at no moment is it more
//! open than the final mode. Connecting needs write permission on the file.

use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixListener;
use std::path::Path;

/// Binds a listening Unix socket at `path`, then sets its group to `gid`
/// (when given) and its mode to `mode` (permission bits only).
pub fn bind_with_mode(path: &Path, mode: u32, gid: Option<u32>) -> std::io::Result<UnixListener> {
    // SAFETY: umask only swaps the process's file mode creation mask; it
    // cannot fail and touches no memory.
    let old = unsafe { libc::umask(0o177) };
    let bound = UnixListener::bind(path);
    // SAFETY: as above; the previous mask is restored.
    unsafe { libc::umask(old) };
    let l = bound?;
    let set = || -> std::io::Result<()> {
        if let Some(g) = gid {
            std::os::unix::fs::chown(path, None, Some(g))?;
        }
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode & 0o777))
    };
    if let Err(e) = set() {
        let _ = std::fs::remove_file(path);
        return Err(e);
    }
    Ok(l)
}

/// The id of the group `name` (the system's group database, NSS included),
/// or of the numeric id `name` is; `None` when there is no such group.
pub fn group_id(name: &str) -> std::io::Result<Option<u32>> {
    if let Ok(n) = name.parse::<u32>() {
        return Ok(Some(n));
    }
    let cname = std::ffi::CString::new(name)
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidInput, "NUL in group name"))?;
    let mut buf = vec![0u8; 4096];
    loop {
        // SAFETY: `struct group` is plain data (integers and pointers), for
        // which all-zero bytes are a valid value.
        let mut grp: libc::group = unsafe { std::mem::zeroed() };
        let mut result: *mut libc::group = std::ptr::null_mut();
        // SAFETY: `grp` and `result` are plain out-parameters; `buf` is a
        // live buffer of `buf.len()` bytes that getgrnam_r fills and that
        // outlives the call; `cname` is NUL-terminated. Only `gr_gid` is
        // read afterwards (no pointer into `buf`).
        let rc = unsafe {
            libc::getgrnam_r(
                cname.as_ptr(),
                &mut grp,
                buf.as_mut_ptr().cast::<libc::c_char>(),
                buf.len(),
                &mut result,
            )
        };
        if rc == libc::ERANGE && buf.len() < 1 << 20 {
            buf.resize(buf.len() * 2, 0);
            continue;
        }
        if rc != 0 {
            return Err(std::io::Error::from_raw_os_error(rc));
        }
        return Ok((!result.is_null()).then_some(grp.gr_gid));
    }
}

/// The user id of the process at the other end of a connected Unix
/// socket (`SO_PEERCRED`: its credentials when it connected); `None` if
/// the kernel does not say.
pub fn peer_uid(s: &std::os::unix::net::UnixStream) -> Option<u32> {
    use std::os::fd::AsRawFd;
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` is a live ucred and `len` its size; SO_PEERCRED writes
    // at most `len` bytes into it and the new length into `len`.
    let r = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast::<libc::c_void>(),
            &mut len,
        )
    };
    (r == 0 && len as usize == std::mem::size_of::<libc::ucred>()).then_some(cred.uid)
}

/// This process's effective user id.
pub fn euid() -> u32 {
    // SAFETY: geteuid cannot fail and touches no memory.
    unsafe { libc::geteuid() }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn socket_gets_the_mode_and_group_asked_for() {
        let dir = std::env::temp_dir().join(format!("sluice-unixsock-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        // SAFETY: getegid cannot fail and touches no memory.
        let gid = unsafe { libc::getegid() };
        let p = dir.join("a.sock");
        let _a = bind_with_mode(&p, 0o600, None).unwrap();
        assert_eq!(std::fs::metadata(&p).unwrap().mode() & 0o777, 0o600);
        let q = dir.join("b.sock");
        let _b = bind_with_mode(&q, 0o660, Some(gid)).unwrap();
        let m = std::fs::metadata(&q).unwrap();
        assert_eq!(m.mode() & 0o777, 0o660);
        assert_eq!(m.gid(), gid);
        // Binding over an existing file fails and leaves it alone.
        assert!(bind_with_mode(&p, 0o600, None).is_err());
        assert!(p.exists());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn peer_of_a_socket_pair_is_this_process() {
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        assert_eq!(peer_uid(&a), Some(euid()));
    }

    #[test]
    fn groups_by_name_and_number() {
        assert_eq!(group_id("0").unwrap(), Some(0));
        assert_eq!(group_id("root").unwrap(), Some(0));
        assert_eq!(group_id("sluice-no-such-group-x").unwrap(), None);
        assert!(group_id("a\0b").is_err());
    }
}
