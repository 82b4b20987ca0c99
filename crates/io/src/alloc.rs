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
//!
//! [`reserve_heap`] backs part of the heap with memory up front and keeps
//! freed heap memory resident from then on (the gateway's
//! `heap_reserve_mib`), so that a rule-set load reuses pages the process
//! already has instead of faulting in new ones: on this project's
//! measuring VM a first touch of a page costs about 2.6 us (the host
//! supplies it again), and a 150 000-rule load touches about 48 000 pages.

use std::alloc::{GlobalAlloc, Layout};
use std::time::{Duration, Instant};

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

/// mimalloc's `mi_option_purge_delay` (its index in `mi_option_t` of the
/// bundled mimalloc 3; `libmimalloc-sys` has no constant for it): how long
/// freed memory waits before it is returned to the kernel; -1 never.
const MI_OPTION_PURGE_DELAY: mi::mi_option_t = 15;

/// Bytes per block that [`reserve_heap`] allocates and touches: mimalloc's
/// small-and-medium block range, where a rule-set load's allocations live,
/// so the pages freed afterwards are the kind those allocations reuse.
const RESERVE_BLOCK: usize = 64 * 1024 - 64;

/// What [`reserve_heap`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeapReserve {
    /// Bytes allocated, touched and freed again.
    pub bytes: usize,
    /// How long that took.
    pub elapsed: Duration,
    /// Whether the global allocator is mimalloc, which now keeps them
    /// resident. When false (a test binary on the system allocator), the
    /// memory was touched but the allocator may have returned it.
    pub kept: bool,
}

/// Whether `p`, a block of the global allocator, is in mimalloc's heap.
fn is_mimalloc_block(p: *const u8) -> bool {
    // SAFETY: mi_is_in_heap_region only compares the address with the
    // regions mimalloc manages; it reads no memory at `p`.
    unsafe { mi::mi_is_in_heap_region(p.cast()) }
}

/// Backs `bytes` of the heap with memory now and tells mimalloc never to
/// return freed memory to the kernel (its purge delay becomes -1): the
/// blocks are allocated, every page written, and freed, and later
/// allocations of any thread reuse those resident pages. Afterwards the
/// process's resident set does not shrink when memory is freed; it stays
/// at its high-water mark, as a dataplane's preallocated heap does.
pub fn reserve_heap(bytes: usize) -> HeapReserve {
    let t = Instant::now();
    let probe = Box::new(0u8);
    let kept = is_mimalloc_block(&*probe);
    drop(probe);
    if kept {
        // SAFETY: mi_option_set stores a value in mimalloc's option table;
        // the index is `mi_option_purge_delay` of the bundled mimalloc.
        unsafe { mi::mi_option_set(MI_OPTION_PURGE_DELAY, -1) };
    }
    let page = 4096;
    let mut blocks: Vec<Vec<u8>> = Vec::with_capacity(bytes / RESERVE_BLOCK + 1);
    let mut done = 0usize;
    while done < bytes {
        let n = RESERVE_BLOCK.min(bytes - done);
        let mut b = vec![0u8; n];
        // A fresh block may be memory the kernel has not backed yet, which
        // mimalloc need not zero: write every page of it.
        for i in (0..n).step_by(page) {
            b[i] = 1;
        }
        blocks.push(std::hint::black_box(b));
        done += n;
    }
    drop(blocks);
    HeapReserve {
        bytes: done,
        elapsed: t.elapsed(),
        kept,
    }
}

/// The kernel's estimate of memory available for new allocations
/// (`MemAvailable` in /proc/meminfo), in bytes; `None` if unreadable.
pub fn available_memory() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
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
    fn available_memory_is_read() {
        let a = super::available_memory().expect("MemAvailable");
        assert!(a > 1 << 20, "{a}");
    }

    #[test]
    fn a_reserve_on_the_system_allocator_says_it_is_not_kept() {
        // This test binary allocates with the system allocator.
        let r = super::reserve_heap(3 * super::RESERVE_BLOCK + 10);
        assert_eq!(r.bytes, 3 * super::RESERVE_BLOCK + 10);
        assert!(!r.kept);
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
