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

/// The bit of a cell's `effects` word that says the rule has `flow add`.
const FLOW_ADD: u64 = 1 << 63;
/// The low bits of the `effects` word: the rule's `tcp option maxseg size
/// set` value + 1, 0 for none.
const MSS_BITS: u64 = 0x3_ffff;
/// Where the `ct timeout set` slot for TCP and for UDP connections sit in
/// the `effects` word (8 bits each, 0 for none).
const CT_TIMEOUT_TCP: u32 = 32;
const CT_TIMEOUT_UDP: u32 = 40;

#[derive(Debug, Default)]
struct Cell {
    packets: AtomicU64,
    bytes: AtomicU64,
    /// The rule's `log` statement: its id + 1, 0 for none (set by the
    /// control plane when the rule is compiled).
    log: std::sync::atomic::AtomicU32,
    /// The rule's side effects on the packet and its connection, set by
    /// the control plane when the rule is compiled: its MSS value + 1
    /// ([`MSS_BITS`]), its `ct timeout set` slots per protocol, and
    /// [`FLOW_ADD`].
    effects: AtomicU64,
}

/// What a matched rule does besides counting and logging
/// ([`RuleCounters::effects`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Effects {
    /// `tcp option maxseg size set` (`Stmt::TcpMss`).
    pub mss: Option<u32>,
    /// `flow add @ft`.
    pub flow_add: bool,
    /// The last `ct timeout set` of a TCP policy: its slot, 0 for none.
    pub ct_timeout_tcp: u8,
    /// The same for a UDP policy.
    pub ct_timeout_udp: u8,
}

impl Effects {
    /// The `ct timeout set` slot for a connection of IP protocol `proto`.
    #[inline]
    pub fn ct_timeout(self, proto: u8) -> u8 {
        match proto {
            6 => self.ct_timeout_tcp,
            17 => self.ct_timeout_udp,
            _ => 0,
        }
    }
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

    /// Replace the bits `mask` of rule `id`'s effects word with `bits`.
    fn set_effect(&self, id: RuleId, mask: u64, bits: u64) {
        if let Some(c) = self.cell(id) {
            c.effects.fetch_and(!mask, Ordering::Relaxed);
            c.effects.fetch_or(bits & mask, Ordering::Relaxed);
        }
    }

    /// Rule `id` sets the TCP MSS (`Stmt::TcpMss(mss)`).
    pub fn set_mss(&self, id: RuleId, mss: u32) {
        self.set_effect(id, MSS_BITS, u64::from(mss) + 1);
    }

    /// Rule `id` has a `flow add` statement (`Stmt::FlowAdd`).
    pub fn set_flow_add(&self, id: RuleId) {
        self.set_effect(id, FLOW_ADD, FLOW_ADD);
    }

    /// Rule `id` has a `ct timeout set` of slot `slot` for IP protocol
    /// `proto` (`Stmt::CtTimeout`; a later one of the same protocol
    /// replaces an earlier one, as it would when both run). Other
    /// protocols than TCP and UDP have no policies.
    pub fn set_ct_timeout(&self, id: RuleId, proto: u8, slot: u8) {
        let shift = match proto {
            6 => CT_TIMEOUT_TCP,
            17 => CT_TIMEOUT_UDP,
            _ => return,
        };
        self.set_effect(id, 0xff << shift, u64::from(slot) << shift);
    }

    /// Rule `id`'s side effects: one load of its cell.
    #[inline]
    pub fn effects(&self, id: RuleId) -> Effects {
        let v = self
            .cell(id)
            .map_or(0, |c| c.effects.load(Ordering::Relaxed));
        Effects {
            mss: u32::try_from((v & MSS_BITS).wrapping_sub(1))
                .ok()
                .filter(|_| v & MSS_BITS != 0),
            flow_add: v & FLOW_ADD != 0,
            ct_timeout_tcp: (v >> CT_TIMEOUT_TCP) as u8,
            ct_timeout_udp: (v >> CT_TIMEOUT_UDP) as u8,
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

    #[test]
    fn effects_keep_apart() {
        let mut c = RuleCounters::default();
        c.ensure(2);
        let r = RuleId(1);
        assert_eq!(c.effects(r), Effects::default());
        c.set_mss(r, sluice_classify::ir::TCP_MSS_RT_MTU);
        c.set_ct_timeout(r, 17, 255);
        c.set_flow_add(r);
        c.set_ct_timeout(r, 6, 3);
        c.set_ct_timeout(r, 6, 4);
        c.set_ct_timeout(r, 47, 9);
        let e = c.effects(r);
        assert_eq!(
            e,
            Effects {
                mss: Some(sluice_classify::ir::TCP_MSS_RT_MTU),
                flow_add: true,
                ct_timeout_tcp: 4,
                ct_timeout_udp: 255,
            }
        );
        assert_eq!(
            (e.ct_timeout(6), e.ct_timeout(17), e.ct_timeout(1)),
            (4, 255, 0)
        );
        c.set_mss(r, 0);
        assert_eq!(c.effects(r).mss, Some(0));
        assert_eq!(c.effects(r).ct_timeout_udp, 255);
        assert_eq!(c.effects(RuleId(0)), Effects::default());
        assert_eq!(c.effects(RuleId(99_999)), Effects::default());
    }
}
