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
    fn rss_is_reported_on_linux() {
        let r = resident_bytes().expect("statm readable on linux");
        assert!(r > 0);
    }
}
