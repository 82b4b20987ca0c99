//! Named network namespaces for tests and the tester's DUT setups.
//!
//! [`Netns::create`] runs `ip netns add`, [`Netns::run`] runs a closure on a
//! fresh thread that has entered the namespace (`setns` changes only the
//! calling thread, so the caller's own namespace is never changed), and drop
//! runs `ip netns del`. Only namespaces created through this type are ever
//! deleted by it.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::process::{Command, Stdio};

use crate::error::IoError;

/// A named network namespace, deleted on drop.
#[derive(Debug)]
pub struct Netns {
    name: String,
    file: File,
}

/// Run `ip ARGS...`, failing with the exit status.
pub fn ip(args: &[&str]) -> Result<(), IoError> {
    let st = Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .status()
        .map_err(|_| IoError::Subprocess {
            program: "ip",
            status: None,
        })?;
    if !st.success() {
        return Err(IoError::Subprocess {
            program: "ip",
            status: st.code(),
        });
    }
    Ok(())
}

impl Netns {
    /// Create namespace `name` (fails if it exists) and bring its `lo` up.
    pub fn create(name: &str) -> Result<Self, IoError> {
        ip(&["netns", "add", name])?;
        let file = match File::open(format!("/run/netns/{name}")) {
            Ok(f) => f,
            Err(e) => {
                let _ = ip(&["netns", "del", name]);
                return Err(IoError::file("open(/run/netns)", &e));
            }
        };
        let ns = Self {
            name: name.to_string(),
            file,
        };
        ns.ip(&["link", "set", "lo", "up"])?;
        Ok(ns)
    }

    /// The namespace name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Run `ip -n NAME ARGS...`.
    pub fn ip(&self, args: &[&str]) -> Result<(), IoError> {
        let mut a = vec!["-n", self.name.as_str()];
        a.extend_from_slice(args);
        ip(&a)
    }

    /// Move the calling thread into this namespace. Prefer [`Netns::run`].
    pub fn enter_this_thread(&self) -> Result<(), IoError> {
        // SAFETY: setns takes a descriptor we own (kept open by `self.file`)
        // and a namespace type; it only changes this thread's namespace.
        let r = unsafe { libc::setns(self.file.as_raw_fd(), libc::CLONE_NEWNET) };
        if r < 0 {
            return Err(IoError::last("setns(CLONE_NEWNET)"));
        }
        Ok(())
    }

    /// Run `f` on a new thread inside this namespace and return its result.
    /// A panic in `f` is propagated.
    pub fn run<T: Send>(&self, f: impl FnOnce() -> T + Send) -> Result<T, IoError> {
        std::thread::scope(|s| {
            let h = s.spawn(|| {
                self.enter_this_thread()?;
                Ok(f())
            });
            match h.join() {
                Ok(r) => r,
                Err(p) => std::panic::resume_unwind(p),
            }
        })
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = ip(&["netns", "del", &self.name]);
    }
}
