//! Memory primitives for the fast path: software prefetch and huge-page advice.
//!
//! These wrap single CPU or kernel calls that need `unsafe`, so that the core
//! crates (conntrack, classify, engine) can stay `#![forbid(unsafe_code)]`.

/// Hint the CPU to bring the cache line holding `r` into L1.
///
/// A prefetch never faults and has no architectural effect, so this is safe
/// for any valid reference. On targets without a prefetch instruction it is a
/// no-op.
#[inline(always)]
pub fn prefetch<T>(r: &T) {
    #[cfg(target_arch = "x86_64")]
    {
        use core::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        // SAFETY: `_mm_prefetch` requires SSE, which is part of the x86_64
        // baseline; a prefetch of any address (here a valid reference) cannot
        // fault or change memory.
        unsafe { _mm_prefetch::<_MM_HINT_T0>((r as *const T).cast::<i8>()) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = r;
    }
}

/// Ask the kernel to back `buf` with transparent huge pages where possible.
///
/// Large tables (conntrack index and entries) are read at random; 2 MiB pages
/// remove most TLB misses. The advice is best effort: errors are ignored, and
/// only the 2 MiB-aligned interior of the slice is advised. Call it before the
/// memory is first touched.
pub fn advise_huge_pages<T>(buf: &mut [T]) {
    #[cfg(target_os = "linux")]
    {
        const HUGE: usize = 2 << 20;
        let start = buf.as_mut_ptr() as usize;
        let len = core::mem::size_of_val(buf);
        let aligned = (start + HUGE - 1) & !(HUGE - 1);
        let end = (start + len) & !(HUGE - 1);
        if end > aligned {
            // SAFETY: [aligned, end) lies inside `buf`, which we borrow
            // mutably, so the range is mapped and owned by this process.
            // MADV_HUGEPAGE only changes how the kernel backs the pages; it
            // never changes their contents.
            unsafe {
                libc::madvise(
                    aligned as *mut libc::c_void,
                    end - aligned,
                    libc::MADV_HUGEPAGE,
                );
            }
        }
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = buf;
    }
}

/// The range of addresses of `buf` that `madvise` is given: from its first
/// page boundary to its end, or with `whole` to its last page boundary
/// (only whole pages). `None` when that is empty.
#[cfg(target_os = "linux")]
fn page_span<T>(buf: &[T], whole: bool) -> Option<(usize, usize)> {
    const PAGE: usize = 4096;
    let start = buf.as_ptr() as usize;
    let end = start + core::mem::size_of_val(buf);
    let aligned = (start + PAGE - 1) & !(PAGE - 1);
    let end = if whole { end & !(PAGE - 1) } else { end };
    (end > aligned).then_some((aligned, end))
}

/// Back every page of `buf` now (`MADV_POPULATE_WRITE`, Linux 5.14+),
/// instead of on first write. Returns whether the kernel did it.
///
/// A large table that is filled at random (the conntrack index) otherwise
/// takes a page fault, and the kernel zeroes a (huge) page, in the middle of
/// packet processing: that is memory allocation on the fast path, only done
/// by the kernel. Call it after [`advise_huge_pages`] so the pages come in
/// huge. The contents do not change: untouched anonymous memory reads as
/// zero before and after. Best effort: on older kernels nothing happens and
/// the pages are faulted in on first touch as before.
pub fn populate<T>(buf: &mut [T]) -> bool {
    #[cfg(target_os = "linux")]
    {
        let Some((aligned, end)) = page_span(buf, false) else {
            return true;
        };
        // SAFETY: [aligned, end) lies inside `buf`, which we borrow mutably,
        // so the range is mapped and owned by this process (madvise rounds
        // the length up to a page; the last page is part of the same
        // mapping). MADV_POPULATE_WRITE only faults the pages in as if they
        // were written without changing their contents.
        let rc = unsafe {
            libc::madvise(
                aligned as *mut libc::c_void,
                end - aligned,
                libc::MADV_POPULATE_WRITE,
            )
        };
        rc == 0
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = buf;
        false
    }
}

/// Give the whole pages inside `buf` back to the kernel now
/// (`MADV_DONTNEED`): they no longer count in the resident set, and read
/// as zero when next touched (a fresh page is faulted in then). Returns
/// whether the kernel did it.
///
/// For a large array that is being emptied in order (the NAT index's old
/// array while a growth moves its slots), so that its memory is returned
/// as it empties, in small steps, instead of all at once by the allocator
/// after the array is freed (a pause of milliseconds per 100 MB) or, as
/// allocators keep freed memory for a while, not at all for a time.
/// `T: FromBytes`: whatever the pages read afterwards (zero for the
/// private anonymous memory an allocator maps; a file's bytes for a file
/// mapping) is a valid `T`.
pub fn discard<T: zerocopy::FromBytes>(buf: &mut [T]) -> bool {
    #[cfg(target_os = "linux")]
    {
        let Some((aligned, end)) = page_span(buf, true) else {
            return true;
        };
        // SAFETY: [aligned, end) is whole pages inside `buf`, which we
        // borrow mutably, so no other reference reads them meanwhile and
        // the range is mapped and owned by this process. MADV_DONTNEED
        // only replaces their contents (with zeros, or the file's bytes),
        // and every byte pattern is a valid `T` (`FromBytes`).
        let rc = unsafe {
            libc::madvise(
                aligned as *mut libc::c_void,
                end - aligned,
                libc::MADV_DONTNEED,
            )
        };
        rc == 0
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = buf;
        false
    }
}

/// Resident set size of this process in bytes, read from `/proc/self/statm`.
/// Returns `None` where that file is not available.
pub fn resident_bytes() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = s.split_whitespace().nth(1)?.parse().ok()?;
    // SAFETY: sysconf has no preconditions; it only reads a system constant.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    Some(pages * u64::try_from(page).ok()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefetch_and_advise_do_not_change_contents() {
        let mut v = vec![7u64; 1 << 20];
        advise_huge_pages(&mut v);
        prefetch(&v[12345]);
        assert!(v.iter().all(|&x| x == 7));
    }

    #[test]
    fn populate_backs_pages_without_changing_contents() {
        // A fresh 64 MiB calloc is untouched; populating it makes it
        // resident (Linux 5.14+, which CI and the target run) and it still
        // reads as zero. Written data survives a second populate.
        let mut v = vec![0u64; 8 << 20];
        let before = resident_bytes().unwrap_or(0);
        assert!(populate(&mut v));
        let after = resident_bytes().unwrap_or(0);
        assert!(
            after >= before + (48 << 20),
            "64 MiB populated, RSS {before} -> {after}"
        );
        assert!(v.iter().all(|&x| x == 0));
        v[777] = 5;
        assert!(populate(&mut v[..1000]));
        assert_eq!(v[777], 5);
        assert!(populate::<u8>(&mut []));
    }

    /// Pages of `buf` resident in memory, by `mincore(2)` (exact, and
    /// blind to what other threads allocate meanwhile).
    fn resident_pages<T>(buf: &[T]) -> usize {
        const PAGE: usize = 4096;
        let start = buf.as_ptr() as usize & !(PAGE - 1);
        let end = buf.as_ptr() as usize + core::mem::size_of_val(buf);
        let mut vec = vec![0u8; (end - start).div_ceil(PAGE)];
        // SAFETY: [start, end) covers `buf`'s pages, which are mapped while
        // we borrow it; `vec` has one byte per page of that range, which is
        // what mincore writes.
        let rc =
            unsafe { libc::mincore(start as *mut libc::c_void, end - start, vec.as_mut_ptr()) };
        assert_eq!(rc, 0, "mincore");
        vec.iter().filter(|&&b| b & 1 == 1).count()
    }

    #[test]
    fn discard_returns_whole_pages_and_leaves_the_edges() {
        // 64 MiB (16 384 pages) written all over: resident. Discarding all
        // but a ragged edge at each end gives back every whole page inside;
        // they read as zero, the partial pages at the edges keep their data.
        let mut v = vec![0u64; 8 << 20];
        v.fill(3);
        let pages = resident_pages(&v);
        assert!(pages >= 16_384, "{pages} pages resident");
        let (lo, hi) = (100, v.len() - 100);
        assert!(discard(&mut v[lo..hi]));
        let left = resident_pages(&v);
        assert!(left <= 3, "{left} pages still resident");
        assert!(v[..lo].iter().all(|&x| x == 3), "the edge before is kept");
        assert!(v[hi..].iter().all(|&x| x == 3), "the edge after is kept");
        // Within the range: whole pages zero, the partial ones kept.
        let zeros = v[lo..hi].iter().filter(|&&x| x == 0).count();
        assert!(zeros >= hi - lo - 1024, "{zeros} of {} zero", hi - lo);
        assert!(v[lo..hi].iter().all(|&x| x == 0 || x == 3));
        assert!(discard::<u64>(&mut []));
    }

    #[test]
    fn rss_is_reported_on_linux() {
        let r = resident_bytes().expect("statm readable on linux");
        assert!(r > 0);
    }
}
