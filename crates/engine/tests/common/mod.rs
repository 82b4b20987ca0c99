//! Shared test batch for the engine's integration tests.
// Each test binary uses part of it.
#![allow(dead_code)]

use sluice_engine::{Action, Frames, IfIndex};

/// A minimal batch: owned 2 KiB buffers (room for the ICMP errors the
/// engine writes in place), their lengths, ingress interfaces and actions.
#[derive(Default)]
pub struct TestFrames {
    pub bufs: Vec<Vec<u8>>,
    pub lens: Vec<usize>,
    pub iifs: Vec<IfIndex>,
    pub acts: Vec<Action>,
}

impl TestFrames {
    /// Appends a frame that `f` writes into a zeroed buffer (returns its length).
    pub fn push(&mut self, iif: IfIndex, f: impl FnOnce(&mut [u8]) -> usize) {
        let mut b = vec![0u8; 2048];
        let n = f(&mut b);
        self.bufs.push(b);
        self.lens.push(n);
        self.iifs.push(iif);
        self.acts.push(Action::Pending);
    }

    /// Frame `i` as it is now.
    pub fn frame(&self, i: usize) -> &[u8] {
        &self.bufs[i][..self.lens[i]]
    }
}

impl Frames for TestFrames {
    fn count(&self) -> usize {
        self.bufs.len()
    }
    fn buf_mut(&mut self, i: usize) -> (&mut [u8], usize) {
        (&mut self.bufs[i][..], self.lens[i])
    }
    fn set_len(&mut self, i: usize, len: usize) {
        self.lens[i] = len;
    }
    fn iif(&self, i: usize) -> IfIndex {
        self.iifs[i]
    }
    fn set_action(&mut self, i: usize, a: Action) {
        self.acts[i] = a;
    }
}
