//! The four AF_XDP rings (fill, completion, rx, tx): single-producer,
//! single-consumer arrays shared with the kernel, indexed by free-running
//! u32 producer/consumer counters.
//!
//! Protocol (Documentation/networking/af_xdp.rst): the producer writes
//! descriptors, then publishes `producer` with Release; the consumer reads
//! `producer` with Acquire, reads descriptors, then publishes `consumer`
//! with Release. We cache the other side's counter and refresh it only when
//! the cached view says there is not enough.

use std::os::fd::RawFd;
use std::sync::atomic::{AtomicU32, Ordering};

use crate::error::IoError;
use crate::sys::Mmap;

/// `struct xdp_desc`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct XdpDesc {
    pub addr: u64,
    pub len: u32,
    pub options: u32,
}

/// `struct xdp_ring_offset`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct RingOffset {
    pub producer: u64,
    pub consumer: u64,
    pub desc: u64,
    pub flags: u64,
}

/// `struct xdp_mmap_offsets`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct MmapOffsets {
    pub rx: RingOffset,
    pub tx: RingOffset,
    pub fr: RingOffset,
    pub cr: RingOffset,
}

const XDP_RING_NEED_WAKEUP: u32 = 1;

/// One mapped ring of `T` (u64 addresses or [`XdpDesc`]).
pub(crate) struct Ring<T: Copy> {
    _map: Mmap,
    producer: *const AtomicU32,
    consumer: *const AtomicU32,
    flags: *const AtomicU32,
    desc: *mut T,
    mask: u32,
    size: u32,
    cached_prod: u32,
    cached_cons: u32,
}

// SAFETY: the pointers point into `_map`, which moves with the ring; the
// ring is used by one thread at a time (`&mut self` for every operation).
unsafe impl<T: Copy + Send> Send for Ring<T> {}

impl<T: Copy> Ring<T> {
    /// Map the ring of `size` entries at page offset `pgoff` of socket `fd`.
    pub(crate) fn map(
        fd: RawFd,
        off: &RingOffset,
        size: u32,
        pgoff: i64,
        call: &'static str,
    ) -> Result<Self, IoError> {
        let len = off.desc as usize + size as usize * core::mem::size_of::<T>();
        let map = Mmap::socket_ring(fd, len, pgoff, call)?;
        let base = map.as_ptr();
        // The kernel places the counters, flags and descriptor array at the
        // offsets it reported, all inside `len` and suitably aligned.
        let at = |o: u64| base.wrapping_add(o as usize);
        let producer = at(off.producer).cast::<AtomicU32>().cast_const();
        let consumer = at(off.consumer).cast::<AtomicU32>().cast_const();
        let flags = at(off.flags).cast::<AtomicU32>().cast_const();
        let desc = at(off.desc).cast::<T>();
        let mut r = Self {
            _map: map,
            producer,
            consumer,
            flags,
            desc,
            mask: size - 1,
            size,
            cached_prod: 0,
            cached_cons: 0,
        };
        r.cached_prod = r.prod().load(Ordering::Acquire);
        r.cached_cons = r.cons().load(Ordering::Acquire);
        Ok(r)
    }

    fn prod(&self) -> &AtomicU32 {
        // SAFETY: points at the ring's producer counter inside the live
        // mapping; shared with the kernel, hence accessed atomically.
        unsafe { &*self.producer }
    }

    fn cons(&self) -> &AtomicU32 {
        // SAFETY: as for `prod`, for the consumer counter.
        unsafe { &*self.consumer }
    }

    pub(crate) fn size(&self) -> u32 {
        self.size
    }

    /// Whether the kernel asked for a wakeup (need_wakeup mode).
    pub(crate) fn needs_wakeup(&self) -> bool {
        // SAFETY: as for `prod`, for the flags word.
        unsafe { &*self.flags }.load(Ordering::Relaxed) & XDP_RING_NEED_WAKEUP != 0
    }

    // ---- producer side (fill, tx)

    /// How many entries (at most `want`) can be produced now.
    pub(crate) fn free(&mut self, want: u32) -> u32 {
        let mut free = self.size - self.cached_prod.wrapping_sub(self.cached_cons);
        if free < want {
            self.cached_cons = self.cons().load(Ordering::Acquire);
            free = self.size - self.cached_prod.wrapping_sub(self.cached_cons);
        }
        free.min(want)
    }

    /// Write entry `k` past the producer (k < the last `free` result).
    pub(crate) fn write(&mut self, k: u32, v: T) {
        let i = self.cached_prod.wrapping_add(k) & self.mask;
        // SAFETY: i <= mask < size, inside the descriptor array; the slot is
        // free (the caller checked `free`), so the kernel does not read it.
        unsafe { self.desc.add(i as usize).write_volatile(v) };
    }

    /// Publish `n` written entries.
    pub(crate) fn submit(&mut self, n: u32) {
        self.cached_prod = self.cached_prod.wrapping_add(n);
        self.prod().store(self.cached_prod, Ordering::Release);
    }

    /// Entries produced but not yet consumed by the kernel.
    pub(crate) fn outstanding(&mut self) -> u32 {
        self.cached_cons = self.cons().load(Ordering::Acquire);
        self.cached_prod.wrapping_sub(self.cached_cons)
    }

    // ---- consumer side (rx, completion)

    /// How many entries (at most `max`) can be consumed now.
    pub(crate) fn available(&mut self, max: u32) -> u32 {
        let mut avail = self.cached_prod.wrapping_sub(self.cached_cons);
        if avail < max {
            self.cached_prod = self.prod().load(Ordering::Acquire);
            avail = self.cached_prod.wrapping_sub(self.cached_cons);
        }
        avail.min(max)
    }

    /// Read entry `k` past the consumer (k < the last `available` result).
    pub(crate) fn read(&self, k: u32) -> T {
        let i = self.cached_cons.wrapping_add(k) & self.mask;
        // SAFETY: i < size, inside the array; the entry was published by the
        // kernel (Acquire in `available`) and not yet released back.
        unsafe { self.desc.add(i as usize).read_volatile() }
    }

    /// Give `n` consumed entries back.
    pub(crate) fn release(&mut self, n: u32) {
        self.cached_cons = self.cached_cons.wrapping_add(n);
        self.cons().store(self.cached_cons, Ordering::Release);
    }
}
