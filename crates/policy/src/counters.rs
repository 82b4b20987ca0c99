//! Per-rule packet and byte counters, kept across rule-set generations.
//!
//! Every IR rule has a cell, indexed by its [`RuleId`] (ids are dense: the
//! lowerer numbers rules from 0 and updates continue from the last one).
//! [`CompiledPolicy::decide`](crate::CompiledPolicy) adds one packet and
//! its IP length to the cell of every rule that matched (the evaluation's
//! trace), with relaxed atomic adds: workers share the cells, no lock is
//! taken, and a reader may see a packet counted before its bytes. Rules
//! without a `counter` statement are counted too but never shown, which is
//! what nft shows.
//!
//! The cells live in fixed chunks of [`CHUNK`] cells behind `Arc`s. A new
//! generation (an incremental update) clones the list of chunks, so it
//! shares every existing cell with the running one and no count is lost
//! while the generations swap; new rules get new chunks, allocated by the
//! control plane, never by a worker. A rule set replace starts from zero
//! (or from the `counter packets N bytes M` values the file gives), as
//! `nft -f` does.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use sluice_classify::ir::RuleId;

/// Cells per chunk.
pub const CHUNK: usize = 1024;

/// The bit of a cell's `mss` word that says the rule has `flow add`.
const FLOW_ADD: u32 = 1 << 31;

#[derive(Debug, Default)]
struct Cell {
    packets: AtomicU64,
    bytes: AtomicU64,
    /// The rule's `log` statement: its id + 1, 0 for none (set by the
    /// control plane when the rule is compiled).
    log: std::sync::atomic::AtomicU32,
    /// The rule's `tcp option maxseg size set` value + 1 (`Stmt::TcpMss`),
    /// 0 for none, in the low 31 bits; [`FLOW_ADD`] when the rule has a
    /// `flow add` statement.
    mss: std::sync::atomic::AtomicU32,
}

/// The counters of every rule of a policy (shared across generations).
#[derive(Debug, Clone, Default)]
pub struct RuleCounters {
    chunks: Vec<Arc<[Cell]>>,
}

impl RuleCounters {
    /// Room for rule ids `0..n` (allocates the missing chunks).
    pub fn ensure(&mut self, n: u64) {
        let want = usize::try_from(n).unwrap_or(usize::MAX).div_ceil(CHUNK);
        while self.chunks.len() < want {
            self.chunks
                .push((0..CHUNK).map(|_| Cell::default()).collect::<Arc<[Cell]>>());
        }
    }

    fn cell(&self, id: RuleId) -> Option<&Cell> {
        let i = usize::try_from(id.0).ok()?;
        self.chunks.get(i / CHUNK)?.get(i % CHUNK)
    }

    /// Set rule `id`'s counts (a `counter packets N bytes M` statement).
    pub fn set(&self, id: RuleId, packets: u64, bytes: u64) {
        if let Some(c) = self.cell(id) {
            c.packets.store(packets, Ordering::Relaxed);
            c.bytes.store(bytes, Ordering::Relaxed);
        }
    }

    /// Rule `id` logs with log spec `log` (`Stmt::Log(log)`).
    pub fn set_log(&self, id: RuleId, log: u32) {
        if let Some(c) = self.cell(id) {
            c.log.store(log.saturating_add(1), Ordering::Relaxed);
        }
    }

    /// Rule `id` sets the TCP MSS (`Stmt::TcpMss(mss)`).
    pub fn set_mss(&self, id: RuleId, mss: u32) {
        if let Some(c) = self.cell(id) {
            c.mss.fetch_and(FLOW_ADD, Ordering::Relaxed);
            c.mss
                .fetch_or(mss.saturating_add(1) & !FLOW_ADD, Ordering::Relaxed);
        }
    }

    /// Rule `id`'s `Stmt::TcpMss` value, if it has one, and whether it has
    /// a `flow add` statement: one load of its cell.
    #[inline]
    pub fn mss_and_flow_add(&self, id: RuleId) -> (Option<u32>, bool) {
        let v = self.cell(id).map_or(0, |c| c.mss.load(Ordering::Relaxed));
        ((v & !FLOW_ADD).checked_sub(1), v & FLOW_ADD != 0)
    }

    /// Rule `id` has a `flow add` statement (`Stmt::FlowAdd`).
    pub fn set_flow_add(&self, id: RuleId) {
        if let Some(c) = self.cell(id) {
            c.mss.fetch_or(FLOW_ADD, Ordering::Relaxed);
        }
    }

    /// Count one packet of `bytes` for rule `id`; returns the rule's log
    /// spec, if it has a `log` statement.
    #[inline]
    pub fn add_and_log(&self, id: RuleId, bytes: u64) -> Option<u32> {
        let c = self.cell(id)?;
        c.packets.fetch_add(1, Ordering::Relaxed);
        c.bytes.fetch_add(bytes, Ordering::Relaxed);
        c.log.load(Ordering::Relaxed).checked_sub(1)
    }

    /// Count one packet of `bytes` for rule `id`.
    #[inline]
    pub fn add(&self, id: RuleId, bytes: u64) {
        if let Some(c) = self.cell(id) {
            c.packets.fetch_add(1, Ordering::Relaxed);
            c.bytes.fetch_add(bytes, Ordering::Relaxed);
        }
    }

    /// Rule `id`'s log spec, if it has a `log` statement.
    #[inline]
    pub fn log_of(&self, id: RuleId) -> Option<u32> {
        self.cell(id)?.log.load(Ordering::Relaxed).checked_sub(1)
    }

    /// Rule `id`'s (packets, bytes).
    pub fn get(&self, id: RuleId) -> (u64, u64) {
        self.cell(id).map_or((0, 0), |c| {
            (
                c.packets.load(Ordering::Relaxed),
                c.bytes.load(Ordering::Relaxed),
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generations_share_cells_and_grow_without_losing_counts() {
        let mut a = RuleCounters::default();
        a.ensure(3);
        a.add_and_log(RuleId(2), 100);
        let mut b = a.clone();
        b.ensure(CHUNK as u64 + 5);
        b.add_and_log(RuleId(2), 60);
        a.add_and_log(RuleId(2), 40);
        assert_eq!(a.get(RuleId(2)), (3, 200));
        assert_eq!(b.get(RuleId(2)), (3, 200), "one cell for both generations");
        b.add_and_log(RuleId(CHUNK as u64 + 4), 1);
        assert_eq!(b.get(RuleId(CHUNK as u64 + 4)), (1, 1));
        assert_eq!(
            a.get(RuleId(CHUNK as u64 + 4)),
            (0, 0),
            "not in the old one"
        );
        a.add_and_log(RuleId(u64::MAX), 1);
        b.set(RuleId(0), 7, 700);
        assert_eq!(a.get(RuleId(0)), (7, 700));
    }
}
