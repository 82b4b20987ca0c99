//! [`Batch`]: up to [`BATCH_CAP`] frames that the engine mutates in place.
//!
//! A frame's bytes live either in the batch's own arena (copying backends:
//! mem, AF_PACKET) or in memory lent by a backend (AF_XDP: a UMEM chunk).
//! Either way the engine sees `&mut [u8]` and never knows which.
//!
//! Ownership rules, which make the raw pointers below sound:
//! - A lent buffer belongs to the batch from `rx_batch` until the batch is
//!   cleared (the buffer goes back to its lender) or a port transmits it
//!   without copying (the frame becomes *handed over* and its bytes are no
//!   longer reachable through the batch).
//! - The batch holds an `Arc` on every lender it has frames from, so the
//!   memory stays mapped for as long as the batch can reach it, even if the
//!   port that lent it is dropped first.

use std::sync::Arc;

/// Most frames a batch holds.
pub const BATCH_CAP: usize = 256;
/// Bytes per frame buffer (arena slot and UMEM chunk). Frames longer than
/// this (jumbo frames) are dropped at receive and counted.
pub const FRAME_CAP: usize = 2048;

/// Per-frame metadata filled in by the receiving backend.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FrameMeta {
    /// The `port_id` given in `OpenOptions` of the port that received it.
    pub port: u16,
    /// Receive time in ns since the Unix epoch, or 0 when the backend has
    /// none (AF_XDP). AF_PACKET fills it from the kernel's timestamp.
    pub timestamp_ns: u64,
}

/// Something that lends frame buffers to batches and takes them back.
pub(crate) trait Lender: Send + Sync {
    /// Identity of the buffer pool (a UMEM); frames from the same pool can be
    /// handed between ports of that pool without a copy.
    fn pool_id(&self) -> u64;
    /// Take back buffers (by pool address) that the batch no longer needs.
    fn give_back(&self, addrs: &[u64]);
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Origin {
    /// Slot `n` of the batch's own arena.
    Arena(u16),
    /// Lent by `lenders[lender]`; `addr` is the buffer's address in its pool.
    Lent { lender: u8, addr: u64 },
    /// Transmitted without copy; the bytes now belong to a port.
    HandedOver,
}

#[derive(Clone, Copy, Debug)]
struct Slot {
    ptr: *mut u8,
    cap: u32,
    len: u32,
    meta: FrameMeta,
    origin: Origin,
}

/// Up to [`BATCH_CAP`] frames, each a mutable byte buffer with a length and
/// [`FrameMeta`].
///
/// Indices are stable until [`Batch::clear`]: a frame that a port has handed
/// over keeps its index but reads as `None`.
pub struct Batch {
    slots: Vec<Slot>,
    arena: Box<[u8]>,
    free_arena: Vec<u16>,
    lenders: Vec<Arc<dyn Lender>>,
    scratch: Vec<u64>,
}

// SAFETY: the raw pointers in `slots` point into `arena` (owned by this
// value) or into memory kept alive by `lenders` (`Send + Sync`), and the
// ownership rules in the module docs give the batch exclusive use of those
// bytes; moving the batch to another thread moves that exclusive use.
unsafe impl Send for Batch {}

impl Default for Batch {
    fn default() -> Self {
        Self::new()
    }
}

impl core::fmt::Debug for Batch {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Batch")
            .field("len", &self.slots.len())
            .finish()
    }
}

impl Batch {
    /// An empty batch with its arena (`BATCH_CAP * FRAME_CAP` bytes).
    /// Allocates once; nothing on the packet path allocates afterwards.
    pub fn new() -> Self {
        Self {
            slots: Vec::with_capacity(BATCH_CAP),
            arena: vec![0u8; BATCH_CAP * FRAME_CAP].into_boxed_slice(),
            free_arena: (0..BATCH_CAP as u16).rev().collect(),
            lenders: Vec::with_capacity(8),
            scratch: Vec::with_capacity(BATCH_CAP),
        }
    }

    /// Number of frames, handed-over ones included.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Whether the batch holds no frames.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// How many more frames fit.
    pub fn room(&self) -> usize {
        BATCH_CAP - self.slots.len()
    }

    /// The bytes of frame `i`, or `None` if out of range or handed over.
    pub fn data(&self, i: usize) -> Option<&[u8]> {
        let s = self.slots.get(i)?;
        if s.origin == Origin::HandedOver {
            return None;
        }
        // SAFETY: per the module rules the batch exclusively owns `cap >= len`
        // bytes at `ptr` (arena or lent buffer kept mapped by `lenders`), and
        // `&self` prevents concurrent mutation through this batch.
        Some(unsafe { core::slice::from_raw_parts(s.ptr, s.len as usize) })
    }

    /// The bytes of frame `i`, mutable, or `None` if out of range or handed over.
    pub fn data_mut(&mut self, i: usize) -> Option<&mut [u8]> {
        let s = self.slots.get(i)?;
        if s.origin == Origin::HandedOver {
            return None;
        }
        // SAFETY: as in `data`; `&mut self` makes this the only reference, and
        // distinct slots never share bytes (distinct arena slots or distinct
        // lent buffers).
        Some(unsafe { core::slice::from_raw_parts_mut(s.ptr, s.len as usize) })
    }

    /// Metadata of frame `i`.
    pub fn meta(&self, i: usize) -> Option<FrameMeta> {
        self.slots.get(i).map(|s| s.meta)
    }

    /// Buffer capacity of frame `i` (the most `set_len` accepts).
    pub fn capacity_of(&self, i: usize) -> usize {
        self.slots.get(i).map_or(0, |s| s.cap as usize)
    }

    /// Change the length of frame `i` (to trim, or to grow into the buffer
    /// for an emitted reply). Returns false if `len` exceeds the capacity or
    /// the frame is handed over. Grown bytes hold stale data.
    pub fn set_len(&mut self, i: usize, len: usize) -> bool {
        match self.slots.get_mut(i) {
            Some(s) if s.origin != Origin::HandedOver && len <= s.cap as usize => {
                s.len = len as u32;
                true
            }
            _ => false,
        }
    }

    /// Whether frame `i` was transmitted without copy (its bytes are gone).
    pub fn is_handed_over(&self, i: usize) -> bool {
        self.slots
            .get(i)
            .is_some_and(|s| s.origin == Origin::HandedOver)
    }

    /// Append a copy of `bytes`. Returns false when the batch is full or the
    /// frame is longer than [`FRAME_CAP`].
    pub fn push_copy(&mut self, bytes: &[u8], meta: FrameMeta) -> bool {
        if bytes.len() > FRAME_CAP || self.slots.len() >= BATCH_CAP {
            return false;
        }
        let Some(n) = self.free_arena.pop() else {
            return false;
        };
        let off = usize::from(n) * FRAME_CAP;
        let buf = &mut self.arena[off..off + FRAME_CAP];
        buf[..bytes.len()].copy_from_slice(bytes);
        self.slots.push(Slot {
            ptr: buf.as_mut_ptr(),
            cap: FRAME_CAP as u32,
            len: bytes.len() as u32,
            meta,
            origin: Origin::Arena(n),
        });
        true
    }

    /// Append a copy of `bytes` with the 802.1Q/802.1ad tag `tag` (TPID
    /// and TCI, network order) put back after the two MAC addresses: a
    /// frame whose tag the kernel moved into metadata (AF_PACKET's
    /// `tp_vlan_tci`) as it was on the wire. Returns false when the batch
    /// is full, or the frame is shorter than two MAC addresses or, tagged,
    /// longer than [`FRAME_CAP`].
    pub fn push_copy_tagged(&mut self, bytes: &[u8], tag: [u8; 4], meta: FrameMeta) -> bool {
        let len = bytes.len() + 4;
        if bytes.len() < 12 || len > FRAME_CAP || self.slots.len() >= BATCH_CAP {
            return false;
        }
        let Some(n) = self.free_arena.pop() else {
            return false;
        };
        let off = usize::from(n) * FRAME_CAP;
        let Some(buf) = self.arena.get_mut(off..off + FRAME_CAP) else {
            self.free_arena.push(n);
            return false;
        };
        let (macs, rest) = bytes.split_at(12);
        if let Some(d) = buf.get_mut(..12) {
            d.copy_from_slice(macs);
        }
        if let Some(d) = buf.get_mut(12..16) {
            d.copy_from_slice(&tag);
        }
        if let Some(d) = buf.get_mut(16..len) {
            d.copy_from_slice(rest);
        }
        self.slots.push(Slot {
            ptr: buf.as_mut_ptr(),
            cap: FRAME_CAP as u32,
            len: len as u32,
            meta,
            origin: Origin::Arena(n),
        });
        true
    }

    /// Return every buffer to where it came from and empty the batch.
    /// Takes one lock per lender (a UMEM pool), never allocates.
    pub fn clear(&mut self) {
        for l in 0..self.lenders.len() {
            self.scratch.clear();
            for s in &self.slots {
                if let Origin::Lent { lender, addr } = s.origin {
                    if usize::from(lender) == l {
                        self.scratch.push(addr);
                    }
                }
            }
            if !self.scratch.is_empty() {
                self.lenders[l].give_back(&self.scratch);
            }
        }
        for s in &self.slots {
            if let Origin::Arena(n) = s.origin {
                self.free_arena.push(n);
            }
        }
        self.slots.clear();
    }

    /// Register `lender` (once) and return its index for [`Origin::Lent`].
    pub(crate) fn lender_index(&mut self, lender: &Arc<dyn Lender>) -> Option<u8> {
        if let Some(i) = self.lenders.iter().position(|l| Arc::ptr_eq(l, lender)) {
            return u8::try_from(i).ok();
        }
        // Drop lenders no frame refers to any more before adding one.
        if self.slots.is_empty() {
            self.lenders.clear();
        }
        if self.lenders.len() >= 255 {
            return None;
        }
        self.lenders.push(Arc::clone(lender));
        u8::try_from(self.lenders.len() - 1).ok()
    }

    /// Append a lent buffer.
    ///
    /// # Safety
    /// `ptr` must be valid for reads and writes of `cap` bytes for as long as
    /// the lender `lender` (registered with [`Batch::lender_index`]) is alive,
    /// and nobody else (kernel included) may access those bytes until the
    /// buffer is given back through [`Lender::give_back`] or taken with
    /// [`Batch::take_lent`]. `len <= cap` and the batch must have room.
    pub(crate) unsafe fn push_lent(
        &mut self,
        ptr: *mut u8,
        cap: u32,
        len: u32,
        meta: FrameMeta,
        lender: u8,
        addr: u64,
    ) {
        debug_assert!(len <= cap && self.slots.len() < BATCH_CAP);
        self.slots.push(Slot {
            ptr,
            cap,
            len,
            meta,
            origin: Origin::Lent { lender, addr },
        });
    }

    /// If frame `i` is a buffer lent from pool `pool_id`, take it out of the
    /// batch (it becomes handed over) and return `(data address in the pool,
    /// data length)`. The caller now owns the buffer.
    pub(crate) fn take_lent(
        &mut self,
        i: usize,
        pool_id: u64,
        base: *mut u8,
    ) -> Option<(u64, u32)> {
        let s = self.slots.get_mut(i)?;
        let Origin::Lent { lender, .. } = s.origin else {
            return None;
        };
        if self.lenders.get(usize::from(lender))?.pool_id() != pool_id {
            return None;
        }
        s.origin = Origin::HandedOver;
        // The data may start after the chunk start (headroom); send from it.
        let off = (s.ptr as usize).wrapping_sub(base as usize) as u64;
        Some((off, s.len))
    }
}

impl Drop for Batch {
    fn drop(&mut self) {
        self.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[test]
    fn push_mutate_and_clear() {
        let mut b = Batch::new();
        assert!(b.is_empty());
        assert!(b.push_copy(
            &[1, 2, 3],
            FrameMeta {
                port: 4,
                timestamp_ns: 9
            }
        ));
        b.data_mut(0).unwrap()[1] = 7;
        assert_eq!(b.data(0).unwrap(), &[1, 7, 3]);
        assert_eq!(b.meta(0).unwrap().port, 4);
        assert!(b.set_len(0, 2));
        assert_eq!(b.data(0).unwrap(), &[1, 7]);
        assert!(!b.set_len(0, FRAME_CAP + 1));
        assert!(b.data(1).is_none());
        b.clear();
        assert!(b.is_empty());
    }

    #[test]
    fn full_batch_rejects_and_oversize_rejects() {
        let mut b = Batch::new();
        assert!(!b.push_copy(&[0u8; FRAME_CAP + 1], FrameMeta::default()));
        for i in 0..BATCH_CAP {
            assert!(b.push_copy(&[i as u8; 60], FrameMeta::default()));
        }
        assert_eq!(b.room(), 0);
        assert!(!b.push_copy(&[0u8; 60], FrameMeta::default()));
        // Frames do not alias: each still holds its own byte.
        for i in 0..BATCH_CAP {
            assert_eq!(b.data(i).unwrap()[59], i as u8);
        }
        b.clear();
        for _ in 0..BATCH_CAP {
            assert!(b.push_copy(&[0u8; 60], FrameMeta::default()));
        }
    }

    struct Pool(Mutex<Vec<u64>>);
    impl Lender for Pool {
        fn pool_id(&self) -> u64 {
            42
        }
        fn give_back(&self, addrs: &[u64]) {
            self.0.lock().unwrap().extend_from_slice(addrs);
        }
    }

    #[test]
    fn lent_frames_go_back_on_clear_unless_taken() {
        let mut mem = vec![0u8; 4 * FRAME_CAP];
        let base = mem.as_mut_ptr();
        let pool = Arc::new(Pool(Mutex::new(Vec::new())));
        let lender: Arc<dyn Lender> = pool.clone();
        let mut b = Batch::new();
        let li = b.lender_index(&lender).unwrap();
        for k in 0..3u64 {
            // SAFETY: each pointer is a distinct FRAME_CAP-sized piece of
            // `mem`, which outlives the batch's use of it in this test.
            unsafe {
                b.push_lent(
                    base.add(k as usize * FRAME_CAP + 256),
                    (FRAME_CAP - 256) as u32,
                    60,
                    FrameMeta::default(),
                    li,
                    k * FRAME_CAP as u64,
                )
            };
        }
        b.data_mut(1).unwrap()[0] = 0xab;
        assert_eq!(b.take_lent(1, 7, base), None, "other pool: must copy");
        assert_eq!(b.take_lent(1, 42, base), Some((FRAME_CAP as u64 + 256, 60)));
        assert!(b.is_handed_over(1));
        assert!(b.data(1).is_none());
        b.clear();
        assert_eq!(*pool.0.lock().unwrap(), vec![0, 2 * FRAME_CAP as u64]);
        assert_eq!(mem[FRAME_CAP + 256], 0xab);
    }

    #[test]
    fn push_copy_tagged_puts_the_tag_after_the_macs() {
        let mut b = Batch::new();
        let frame: Vec<u8> = (0u8..60).collect();
        assert!(b.push_copy_tagged(&frame, [0x81, 0x00, 0x00, 0x64], FrameMeta::default()));
        let d = b.data(0).unwrap();
        assert_eq!(d.len(), 64);
        assert_eq!(&d[..12], &frame[..12]);
        assert_eq!(&d[12..16], &[0x81, 0x00, 0x00, 0x64]);
        assert_eq!(&d[16..], &frame[12..]);
        // Too short for the MACs, or too long once tagged: refused.
        assert!(!b.push_copy_tagged(&frame[..11], [0x81, 0, 0, 1], FrameMeta::default()));
        let big = vec![0u8; FRAME_CAP - 3];
        assert!(!b.push_copy_tagged(&big, [0x81, 0, 0, 1], FrameMeta::default()));
        assert_eq!(b.len(), 1);
    }
}
