//! Real-time scheduling for worker threads.
//!
//! On a core that a worker shares with the kernel's receive work (the
//! threaded NAPI of a veth or of a NIC queue bound to that core), the
//! scheduler splits the core fairly between the two. Under overload the
//! kernel then spends its half copying frames into a receive ring that the
//! worker had no time to drain, and drops them there: receive livelock.
//! With the worker at a real-time priority (`SCHED_FIFO`) it runs whenever
//! it has frames and the kernel's receive work runs while it sleeps in
//! `poll`, so the core's time goes to frames that get forwarded. VPP offers
//! the same (`cpu { scheduler-policy fifo scheduler-priority N }`).
//!
//! `sluice bench forward --dut sluice-afxdp --flows 1000 --sender xdp`
//! (2026-11-23 about 17:18 UTC, 2-vCPU AMD EPYC KVM guest, Linux 6.18, the
//! worker made `SCHED_FIFO` 10 by hand with `chrt` during the run,
//! alternating): 0.385 / 0.387 Mpps against 0.158 / 0.183 Mpps; with
//! `worker_priority = 10` in the DUT's configuration (about 17:20 UTC):
//! 0.371 / 0.395 Mpps.
//!
//! A worker sleeps in `poll(2)` whenever it has nothing to do, so it never
//! keeps the core from others while idle; the kernel's real-time
//! throttling (`sched_rt_runtime_us`, 95 % by default) bounds it under
//! overload.

use crate::error::IoError;

/// The highest `SCHED_FIFO` priority on Linux.
pub const MAX_PRIORITY: u8 = 99;

/// Makes the calling thread `SCHED_FIFO` with `priority` (1 to
/// [`MAX_PRIORITY`]). Fails with `EINVAL` outside that range, and with
/// `EPERM` without `CAP_SYS_NICE` or when the thread's cgroup has no
/// real-time budget.
pub fn set_fifo(priority: u8) -> Result<(), IoError> {
    if !(1..=MAX_PRIORITY).contains(&priority) {
        return Err(IoError::Syscall {
            call: "sched_setscheduler(SCHED_FIFO)",
            errno: libc::EINVAL,
        });
    }
    let param = libc::sched_param {
        sched_priority: i32::from(priority),
    };
    // SAFETY: `param` is a valid, initialised sched_param that outlives the
    // call; pid 0 names the calling thread, whose policy is all that changes.
    let r = unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &param) };
    if r != 0 {
        return Err(IoError::Syscall {
            call: "sched_setscheduler(SCHED_FIFO)",
            errno: crate::error::errno(),
        });
    }
    Ok(())
}

/// The calling thread's scheduling policy and priority (`SCHED_OTHER` is
/// 0, `SCHED_FIFO` 1).
pub fn current() -> Result<(i32, i32), IoError> {
    // SAFETY: pid 0 names the calling thread; the call only reads.
    let policy = unsafe { libc::sched_getscheduler(0) };
    if policy < 0 {
        return Err(IoError::Syscall {
            call: "sched_getscheduler",
            errno: crate::error::errno(),
        });
    }
    let mut param = libc::sched_param { sched_priority: 0 };
    // SAFETY: `param` is a live, writable sched_param for the kernel to fill.
    let r = unsafe { libc::sched_getparam(0, &mut param) };
    if r != 0 {
        return Err(IoError::Syscall {
            call: "sched_getparam",
            errno: crate::error::errno(),
        });
    }
    Ok((policy, param.sched_priority))
}

/// The calling thread's scheduling, for status output: `"other"`,
/// `"fifo N"`, or the raw policy and priority for anything else.
pub fn describe() -> String {
    match current() {
        Ok((libc::SCHED_OTHER, _)) => "other".into(),
        Ok((libc::SCHED_FIFO, p)) => format!("fifo {p}"),
        Ok((policy, p)) => format!("policy {policy} priority {p}"),
        Err(e) => format!("unknown ({e})"),
    }
}

/// Whether this process may make a thread `SCHED_FIFO` with `priority`:
/// tries it on a short-lived thread (the caller's own policy is left
/// alone). Lets a daemon refuse a configuration at start rather than in a
/// worker.
pub fn check_fifo(priority: u8) -> Result<(), IoError> {
    std::thread::spawn(move || set_fifo(priority))
        .join()
        .unwrap_or(Err(IoError::Syscall {
            call: "sched_setscheduler(SCHED_FIFO)",
            errno: libc::EAGAIN,
        }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn out_of_range_priorities_are_refused_without_a_system_call() {
        for p in [0u8, 100, 255] {
            match set_fifo(p) {
                Err(IoError::Syscall { errno, .. }) => assert_eq!(errno, libc::EINVAL, "{p}"),
                other => panic!("priority {p}: {other:?}"),
            }
        }
    }

    #[test]
    fn a_thread_becomes_fifo_when_allowed() {
        // Whether this process may use SCHED_FIFO depends on who runs the
        // tests; both outcomes are checked for what they must show.
        let r = std::thread::spawn(|| set_fifo(7).map(|()| current()))
            .join()
            .expect("thread");
        match r {
            Ok(now) => assert_eq!(now.expect("getscheduler"), (libc::SCHED_FIFO, 7)),
            Err(IoError::Syscall { errno, .. }) => assert_eq!(errno, libc::EPERM),
            Err(e) => panic!("{e:?}"),
        }
        // The test thread itself is untouched.
        assert_eq!(current().expect("getscheduler").0, libc::SCHED_OTHER);
        assert_eq!(describe(), "other");
        let fifo = std::thread::spawn(|| set_fifo(7).map(|()| describe()))
            .join()
            .expect("thread");
        if let Ok(d) = fifo {
            assert_eq!(d, "fifo 7");
        }
    }
}
