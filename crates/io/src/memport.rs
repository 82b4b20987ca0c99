//! The mem backend: a [`Port`] over in-memory queues, for tests and for the
//! embedded tester DUT. It needs no privileges.
//!
//! [`MemPort::new`] returns the port and a [`MemPeer`] (the "wire side") that
//! injects frames the port will receive and collects the frames it sends.
//! [`mem_link`] joins two ports back to back like a veth pair.
//!
//! This backend allocates a `Vec` per transmitted frame and locks a mutex per
//! batch; it is a test tool, not a fast path.

use std::collections::VecDeque;
use std::os::fd::RawFd;
use std::sync::{Arc, Mutex};

use crate::batch::{Batch, FrameMeta};
use crate::error::IoError;
use crate::port::{BackendKind, Port, PortStats};

/// Frames a queue holds before it drops (like a full ring).
pub const MEM_QUEUE_CAP: usize = 65536;

#[derive(Default)]
struct Queue {
    frames: VecDeque<(Vec<u8>, u64)>,
    dropped: u64,
}

type Shared = Arc<Mutex<Queue>>;

fn lock(q: &Shared) -> std::sync::MutexGuard<'_, Queue> {
    // A poisoned queue still holds valid frames; keep going.
    q.lock().unwrap_or_else(|e| e.into_inner())
}

fn enqueue(q: &Shared, bytes: &[u8], ts: u64) -> bool {
    let mut g = lock(q);
    if g.frames.len() >= MEM_QUEUE_CAP {
        g.dropped += 1;
        return false;
    }
    g.frames.push_back((bytes.to_vec(), ts));
    true
}

/// An in-memory port.
pub struct MemPort {
    name: String,
    port_id: u16,
    rx: Shared,
    tx: Shared,
    stats: PortStats,
}

/// The wire side of a [`MemPort`].
#[derive(Clone)]
pub struct MemPeer {
    to_port: Shared,
    from_port: Shared,
}

impl MemPeer {
    /// Queue a frame for the port to receive, with timestamp `ts_ns`.
    /// Returns false if the queue is full (the frame is dropped and counted).
    pub fn inject(&self, frame: &[u8], ts_ns: u64) -> bool {
        enqueue(&self.to_port, frame, ts_ns)
    }

    /// Take the oldest frame the port transmitted.
    pub fn collect(&self) -> Option<Vec<u8>> {
        lock(&self.from_port).frames.pop_front().map(|(f, _)| f)
    }

    /// Take every frame the port transmitted so far.
    pub fn collect_all(&self) -> Vec<Vec<u8>> {
        lock(&self.from_port)
            .frames
            .drain(..)
            .map(|(f, _)| f)
            .collect()
    }

    /// Frames injected but not yet received by the port.
    pub fn pending(&self) -> usize {
        lock(&self.to_port).frames.len()
    }
}

impl MemPort {
    /// A port named `name` whose received frames carry `port_id`.
    pub fn new(name: &str, port_id: u16) -> (MemPort, MemPeer) {
        let rx: Shared = Arc::default();
        let tx: Shared = Arc::default();
        let peer = MemPeer {
            to_port: Arc::clone(&rx),
            from_port: Arc::clone(&tx),
        };
        (
            MemPort {
                name: name.to_string(),
                port_id,
                rx,
                tx,
                stats: PortStats::default(),
            },
            peer,
        )
    }
}

/// Two ports wired back to back: what `a` transmits, `b` receives, and back.
pub fn mem_link(a: (&str, u16), b: (&str, u16)) -> (MemPort, MemPort) {
    let ab: Shared = Arc::default();
    let ba: Shared = Arc::default();
    let pa = MemPort {
        name: a.0.to_string(),
        port_id: a.1,
        rx: Arc::clone(&ba),
        tx: Arc::clone(&ab),
        stats: PortStats::default(),
    };
    let pb = MemPort {
        name: b.0.to_string(),
        port_id: b.1,
        rx: ab,
        tx: ba,
        stats: PortStats::default(),
    };
    (pa, pb)
}

impl Port for MemPort {
    fn name(&self) -> &str {
        &self.name
    }

    fn kind(&self) -> BackendKind {
        BackendKind::Mem
    }

    fn describe(&self) -> String {
        format!("mem {}", self.name)
    }

    fn rx_batch(&mut self, batch: &mut Batch) -> usize {
        let mut q = lock(&self.rx);
        let mut n = 0;
        while batch.room() > 0 {
            let Some((f, ts)) = q.frames.pop_front() else {
                break;
            };
            if batch.push_copy(
                &f,
                FrameMeta {
                    port: self.port_id,
                    timestamp_ns: ts,
                },
            ) {
                n += 1;
                self.stats.rx_frames += 1;
                self.stats.rx_bytes += f.len() as u64;
            } else {
                self.stats.rx_oversize += 1;
            }
        }
        n
    }

    fn tx_batch(&mut self, batch: &mut Batch, which: &[u16]) -> usize {
        let mut n = 0;
        for &i in which {
            let Some(data) = batch.data(usize::from(i)) else {
                continue;
            };
            let ts = batch.meta(usize::from(i)).map_or(0, |m| m.timestamp_ns);
            if !enqueue(&self.tx, data, ts) {
                self.stats.tx_ring_full += 1;
                break;
            }
            n += 1;
            self.stats.tx_frames += 1;
            self.stats.tx_bytes += data.len() as u64;
        }
        n
    }

    fn flush(&mut self) -> Result<(), IoError> {
        Ok(())
    }

    fn poll_fd(&self) -> Option<RawFd> {
        None
    }

    fn stats(&mut self) -> PortStats {
        let mut s = self.stats;
        s.rx_kernel_drops = lock(&self.rx).dropped;
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inject_receive_mutate_transmit_collect() {
        let (mut p, peer) = MemPort::new("m0", 3);
        assert!(peer.inject(&[1, 2, 3, 4], 77));
        assert!(peer.inject(&[5, 6], 78));
        let mut b = Batch::new();
        assert_eq!(p.rx_batch(&mut b), 2);
        assert_eq!(
            b.meta(0),
            Some(FrameMeta {
                port: 3,
                timestamp_ns: 77
            })
        );
        b.data_mut(0).unwrap()[0] = 9;
        assert_eq!(p.tx_batch(&mut b, &[1, 0, 200]), 2);
        assert_eq!(peer.collect_all(), vec![vec![5, 6], vec![9, 2, 3, 4]]);
        let s = p.stats();
        assert_eq!((s.rx_frames, s.tx_frames, s.tx_bytes), (2, 2, 6));
        assert_eq!(p.rx_batch(&mut b), 0);
    }

    #[test]
    fn rx_stops_at_batch_room() {
        let (mut p, peer) = MemPort::new("m0", 0);
        for i in 0..300u16 {
            peer.inject(&i.to_be_bytes(), 0);
        }
        let mut b = Batch::new();
        assert_eq!(p.rx_batch(&mut b), crate::BATCH_CAP);
        assert_eq!(peer.pending(), 300 - crate::BATCH_CAP);
        b.clear();
        assert_eq!(p.rx_batch(&mut b), 300 - crate::BATCH_CAP);
        assert_eq!(b.data(0).unwrap(), &256u16.to_be_bytes());
    }

    #[test]
    fn linked_ports_forward_both_ways() {
        let (mut a, mut b) = mem_link(("a", 0), ("b", 1));
        let mut batch = Batch::new();
        batch.push_copy(&[0xaa; 60], FrameMeta::default());
        assert_eq!(a.tx_batch(&mut batch, &[0]), 1);
        batch.clear();
        assert_eq!(b.rx_batch(&mut batch), 1);
        assert_eq!(batch.meta(0).unwrap().port, 1);
        assert_eq!(b.tx_batch(&mut batch, &[0]), 1);
        batch.clear();
        assert_eq!(a.rx_batch(&mut batch), 1);
        assert_eq!(batch.data(0).unwrap(), &[0xaa; 60][..]);
    }
}
