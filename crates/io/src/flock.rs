//! An exclusive advisory lock on a file (`flock`), for what must run once
//! per machine or namespace. (`std::fs::File::try_lock` would do, from
//! Rust 1.89; the workspace supports 1.85.)

use std::os::fd::AsRawFd;

/// Takes an exclusive `flock` on `f` without waiting: `Ok(true)` when
/// taken, `Ok(false)` when another open file holds it. The lock goes when
/// every descriptor of this open file is closed (the process ending
/// included).
pub fn try_lock_exclusive(f: &std::fs::File) -> std::io::Result<bool> {
    // SAFETY: `f` is an open file for the duration of the call; flock only
    // acts on its descriptor and touches no memory.
    let r = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if r == 0 {
        return Ok(true);
    }
    let e = std::io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
        Ok(false)
    } else {
        Err(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_open_file_does_not_get_the_lock() {
        let p = std::env::temp_dir().join(format!("sluice-flock-{}", std::process::id()));
        let a = std::fs::File::create(&p).unwrap();
        let b = std::fs::File::open(&p).unwrap();
        assert!(try_lock_exclusive(&a).unwrap());
        assert!(!try_lock_exclusive(&b).unwrap());
        drop(a);
        assert!(try_lock_exclusive(&b).unwrap());
        let _ = std::fs::remove_file(&p);
    }
}
