//! Allocator settings for processes that run the gateway's control plane.

/// Makes every thread allocate from glibc's main heap (`M_ARENA_MAX` = 1);
/// returns false when the C library refused or is not glibc.
///
/// glibc gives each new thread an arena of its own, and grows such an arena
/// one page at a time, with one `mprotect` per 4 KiB (the `M_TOP_PAD` slack
/// applies to the main heap only). A rule-set load allocates a few hundred
/// MiB on the control thread: `sluice bench update` (150 000 rules) made
/// about 115 000 `mprotect` calls; with one arena it makes 13 (and 3 500
/// `brk`), the process's system time falls from 0.99-1.16 s to 0.56-0.69 s,
/// its page faults from 201 000 to 148 000 (memory freed on one thread is
/// reused by the next), and the load took 0.76-1.17 s instead of 1.27-1.82 s
/// (`perf stat`, three alternating runs each, 2026-11-23 02:23 UTC, 2-vCPU
/// AMD EPYC KVM guest, Linux 6.18, load average 4-5). Workers do not
/// allocate on the packet path, so sharing the arena costs them nothing.
///
/// Call it first thing in `main`, before any thread starts: a thread that
/// already has an arena keeps it.
pub fn one_malloc_arena() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallopt(3) takes two integers and only changes the
        // allocator's tuning parameters (under its own lock); M_ARENA_MAX
        // with a positive value is a documented, valid setting.
        unsafe { libc::mallopt(libc::M_ARENA_MAX, 1) == 1 }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn one_arena_is_accepted() {
        assert_eq!(
            super::one_malloc_arena(),
            cfg!(all(target_os = "linux", target_env = "gnu"))
        );
        let v: Vec<u64> = (0..1000).collect();
        assert_eq!(v.iter().sum::<u64>(), 499_500);
    }
}
