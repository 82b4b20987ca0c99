//! Allocator settings for the `sluice` process.
//!
//! The binary's global allocator is mimalloc, built with its `no_thp`
//! feature: mimalloc then never asks for transparent huge pages for its own
//! heap. A rule-set load allocates a few hundred MiB of small objects; with
//! mimalloc's heap on huge pages, a load after the machine sat idle for a
//! few seconds took 1.4-1.5 s instead of 0.3-0.4 s on this project's
//! measuring VM, whose balloon driver reports free 8 MiB blocks to the host
//! (`page_reporting.page_reporting_order=11`), so the next huge-page fault
//! waits for the host to supply the memory again (`sluice bench update`,
//! 2026-11-23, see docs/benchmarks.md). Small pages come from fragments the
//! guest still holds.
//!
//! mimalloc implements `no_thp` with `prctl(PR_SET_THP_DISABLE)`, which
//! also turns off the huge pages that the conntrack tables ask for
//! ([`crate::mem::advise_huge_pages`]), for the whole process.
//! [`allow_transparent_huge_pages`] turns that back on; mimalloc has already
//! recorded that it must not advise huge pages itself, so only the explicitly
//! advised tables get them.
//!
//! mimalloc keeps freed memory for about a second before it returns it to
//! the kernel; [`release_freed_memory`] returns it now, so that a resident
//! set size read just after is the live heap (`sluice bench nat44`'s bytes
//! per connection).

/// The global allocator of the `sluice` binary (mimalloc; see the module
/// documentation).
pub use mimalloc::MiMalloc as Allocator;

/// Returns the memory that the allocators hold for reuse after frees to the
/// kernel: mimalloc's (`mi_collect(true)`, which does nothing if mimalloc is
/// not the global allocator) and glibc's (`malloc_trim(0)`).
pub fn release_freed_memory() {
    // SAFETY: mi_collect takes a flag and only walks and purges mimalloc's
    // own free pages; it is documented as safe to call at any time.
    unsafe { libmimalloc_sys::mi_collect(true) };
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: malloc_trim(3) takes a padding size and only releases
        // glibc's free heap memory; it is safe to call at any time.
        unsafe { libc::malloc_trim(0) };
    }
}

/// Clears the process's `PR_SET_THP_DISABLE` flag so that regions advised
/// with `MADV_HUGEPAGE` get transparent huge pages again. Returns whether the
/// flag is now clear (false off Linux, or if the kernel refused).
///
/// Call it first thing in `main`: the flag is inherited by child processes,
/// and the conntrack tables are advised when they are created.
pub fn allow_transparent_huge_pages() -> bool {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: prctl(2) with PR_SET_THP_DISABLE takes an integer flag and
        // three zero arguments; it changes only this process's THP policy.
        let set = unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 0, 0, 0, 0) };
        // SAFETY: PR_GET_THP_DISABLE takes four zero arguments and returns
        // the flag; it changes nothing.
        let now = unsafe { libc::prctl(libc::PR_GET_THP_DISABLE, 0, 0, 0, 0) };
        set == 0 && now == 0
    }
    #[cfg(not(target_os = "linux"))]
    {
        false
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_thp_disable_flag_can_be_cleared() {
        assert_eq!(
            super::allow_transparent_huge_pages(),
            cfg!(target_os = "linux")
        );
        #[cfg(target_os = "linux")]
        {
            // SAFETY: as in `allow_transparent_huge_pages`.
            let flag = unsafe { libc::prctl(libc::PR_GET_THP_DISABLE, 0, 0, 0, 0) };
            assert_eq!(flag, 0);
        }
    }
}
