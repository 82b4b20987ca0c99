//! A fixed batch of frame buffers that the tester hands to an in-process DUT.

use sluice_engine::{Action, Frames, IfIndex, MAX_BATCH};

/// Capacity of one frame buffer: room for the largest reply the engine builds
/// from a minimum-size frame (an ICMP error quoting it).
pub const FRAME_CAP: usize = 256;

/// `MAX_BATCH` frame buffers with their lengths, ingress interfaces and the
/// engine's actions. Allocated once; reused for every batch.
pub struct Batch {
    bufs: Vec<[u8; FRAME_CAP]>,
    lens: Vec<usize>,
    iifs: Vec<IfIndex>,
    actions: Vec<Action>,
    n: usize,
}

impl Default for Batch {
    fn default() -> Self {
        Self::new()
    }
}

impl Batch {
    /// An empty batch.
    pub fn new() -> Self {
        Self {
            bufs: vec![[0u8; FRAME_CAP]; MAX_BATCH],
            lens: vec![0; MAX_BATCH],
            iifs: vec![0; MAX_BATCH],
            actions: vec![Action::Pending; MAX_BATCH],
            n: 0,
        }
    }

    /// Forget all frames.
    pub fn clear(&mut self) {
        self.n = 0;
    }

    /// Whether another frame fits.
    pub fn is_full(&self) -> bool {
        self.n == MAX_BATCH
    }

    /// Number of frames.
    pub fn len(&self) -> usize {
        self.n
    }

    /// True when there are no frames.
    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// Append a frame: `fill` writes it into the buffer and returns its length.
    /// Returns `false` (and appends nothing) when the batch is full or `fill`
    /// fails.
    pub fn push(&mut self, iif: IfIndex, fill: impl FnOnce(&mut [u8]) -> Option<usize>) -> bool {
        let i = self.n;
        let (Some(buf), Some(len), Some(ifs), Some(act)) = (
            self.bufs.get_mut(i),
            self.lens.get_mut(i),
            self.iifs.get_mut(i),
            self.actions.get_mut(i),
        ) else {
            return false;
        };
        match fill(buf) {
            Some(l) if l <= FRAME_CAP => {
                *len = l;
                *ifs = iif;
                *act = Action::Pending;
                self.n += 1;
                true
            }
            _ => false,
        }
    }

    /// Frame `i` as it is now, and the engine's action for it.
    pub fn get(&self, i: usize) -> Option<(&[u8], Action)> {
        let buf = self.bufs.get(i)?;
        let len = *self.lens.get(i)?;
        Some((buf.get(..len)?, *self.actions.get(i)?))
    }
}

impl Frames for Batch {
    fn count(&self) -> usize {
        self.n
    }

    fn buf_mut(&mut self, i: usize) -> (&mut [u8], usize) {
        let len = self.lens.get(i).copied().unwrap_or(0);
        match self.bufs.get_mut(i) {
            Some(b) => (&mut b[..], len),
            None => (&mut [], 0),
        }
    }

    fn set_len(&mut self, i: usize, len: usize) {
        if let Some(l) = self.lens.get_mut(i) {
            *l = len.min(FRAME_CAP);
        }
    }

    fn iif(&self, i: usize) -> IfIndex {
        self.iifs.get(i).copied().unwrap_or(0)
    }

    fn set_action(&mut self, i: usize, a: Action) {
        if let Some(x) = self.actions.get_mut(i) {
            *x = a;
        }
    }
}
