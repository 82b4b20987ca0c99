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

use std::alloc::{GlobalAlloc, Layout};

use libmimalloc_sys as mi;

/// The global allocator of the `sluice` binary: mimalloc (see the module
/// documentation).
///
/// Hand-written over `libmimalloc-sys` rather than `mimalloc::MiMalloc`,
/// which sends every call through mimalloc's aligned entry points
/// (`mi_malloc_aligned`, `mi_realloc_aligned`). For alignments up to 8,
/// which mimalloc gives every block, this calls the plain ones, whose fast
/// path is shorter: a 150 000-rule load makes millions of small
/// allocations. `sluice-policy`'s `load` example at 150 000 rules
/// (2026-11-23 16:34 UTC, 2-vCPU AMD EPYC KVM guest, Linux 6.18; five
/// alternating runs, together with the preprocessor's `memchr` scan)
/// compiled in 0.197-0.257 s against 0.253-0.294 s with `MiMalloc`.
pub struct Allocator;

/// The alignment every mimalloc block has (`MI_INTPTR_SIZE` on 64-bit).
const PLAIN_ALIGN: usize = 8;

// SAFETY: every method forwards to mimalloc, which returns blocks of at least
// the requested size and alignment (the aligned entry points beyond
// PLAIN_ALIGN), or null on failure; `dealloc` and `realloc` only ever receive
// pointers these methods returned, as GlobalAlloc's contract requires.
unsafe impl GlobalAlloc for Allocator {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if layout.align() <= PLAIN_ALIGN {
            // SAFETY: mi_malloc takes any size and returns null or a block
            // aligned to at least PLAIN_ALIGN.
            unsafe { mi::mi_malloc(layout.size()).cast() }
        } else {
            // SAFETY: the alignment is a power of two (Layout's invariant).
            unsafe { mi::mi_malloc_aligned(layout.size(), layout.align()).cast() }
        }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if layout.align() <= PLAIN_ALIGN {
            // SAFETY: as in `alloc`; mi_zalloc also zeroes the block.
            unsafe { mi::mi_zalloc(layout.size()).cast() }
        } else {
            // SAFETY: as in `alloc`.
            unsafe { mi::mi_zalloc_aligned(layout.size(), layout.align()).cast() }
        }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, _layout: Layout) {
        // SAFETY: `ptr` came from this allocator (GlobalAlloc's contract),
        // so from mimalloc, whose mi_free takes any of its blocks.
        unsafe { mi::mi_free(ptr.cast()) }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if layout.align() <= PLAIN_ALIGN {
            // SAFETY: `ptr` is a live mimalloc block (GlobalAlloc's
            // contract); mi_realloc keeps at least PLAIN_ALIGN alignment.
            unsafe { mi::mi_realloc(ptr.cast(), new_size).cast() }
        } else {
            // SAFETY: as above, with the block's own alignment.
            unsafe { mi::mi_realloc_aligned(ptr.cast(), new_size, layout.align()).cast() }
        }
    }
}

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
    use std::alloc::{GlobalAlloc, Layout};

    use super::Allocator;

    #[test]
    fn blocks_have_the_asked_size_alignment_and_contents() {
        for align in [1usize, 2, 8, 16, 64, 4096] {
            for size in [1usize, 7, 8, 24, 100, 4096, 1 << 20] {
                let layout = Layout::from_size_align(size, align).expect("layout");
                // SAFETY: non-zero sizes; every pointer is freed once with
                // its layout, and accesses stay within the sizes asked.
                unsafe {
                    let z = Allocator.alloc_zeroed(layout);
                    assert!(!z.is_null());
                    assert_eq!(z as usize % align, 0, "{size} {align}");
                    assert!(std::slice::from_raw_parts(z, size).iter().all(|&b| b == 0));
                    Allocator.dealloc(z, layout);
                    let p = Allocator.alloc(layout);
                    assert!(!p.is_null());
                    assert_eq!(p as usize % align, 0, "{size} {align}");
                    std::ptr::write_bytes(p, 0xa5, size);
                    let q = Allocator.realloc(p, layout, size * 3);
                    assert!(!q.is_null());
                    assert_eq!(q as usize % align, 0, "realloc {size} {align}");
                    assert!(std::slice::from_raw_parts(q, size)
                        .iter()
                        .all(|&b| b == 0xa5));
                    Allocator.dealloc(q, Layout::from_size_align(size * 3, align).expect("layout"));
                }
            }
        }
    }

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
