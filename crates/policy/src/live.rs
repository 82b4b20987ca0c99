//! The rule store behind a [`CompiledPolicy`]: persistent (structure-
//! sharing) maps from handles to lowered rules, so that one `add rule`,
//! `insert rule`, `delete rule` or set-element change builds the next
//! generation in time independent of the number of rules loaded.
//!
//! # Design
//!
//! * Every AST rule has a *handle* (nft's `handle N`), and lowers to zero or
//!   more IR rules (a verdict map becomes one IR rule per element).
//! * `order` maps `(chain, position)` to handles. Positions are sparse
//!   (`GAP` apart); an insertion takes the midpoint of its neighbours and,
//!   when no gap is left, the chain is relabelled evenly (rare: it needs
//!   about 32 insertions at one spot).
//! * `infos` maps IR rule ids (dense, never reused) to their [`RuleInfo`].
//! * `users` maps a named set or map to the handles of the rules that read
//!   it, so an element change re-lowers only those rules.
//! * All maps are `imbl` persistent collections (hash array mapped tries,
//!   B-trees, RRB vectors): cloning one is O(1) and an update copies
//!   O(log n) nodes, which is what lets a generation be derived from the
//!   published one while workers keep using it. A `Vec` per chain would copy
//!   the whole chain per update (tens of milliseconds at 150 000 rules).
//! * The linear program (the reference evaluator's input) is materialised
//!   from `order` on first use, not on every update.
//! * A load fills the store rule by rule (`imbl` has no bulk construction),
//!   but `order`, which needs only the rule counts, is built on another
//!   thread while the classifier compiles (`policy::load_order`, from 8192
//!   rules), and handles are appended. At 150 000 rules (callgrind,
//!   2026-11-23, 2-vCPU AMD EPYC KVM guest) this took the store's share of
//!   the loading thread from 232 M to 54 M instructions; `order` costs
//!   about 155 M on the other thread.

use std::sync::Arc;

use imbl::{HashMap as PMap, OrdMap, OrdSet, Vector};
use sluice_classify::ir::{self, ChainId, Program, RuleId};
use sluice_ruleset as ast;

use crate::lower::RuleInfo;

/// Distance between neighbouring positions after a (re)label.
pub(crate) const GAP: u64 = 1 << 32;

/// One AST rule of the running policy.
#[derive(Debug, Clone)]
pub(crate) struct Entry {
    /// Table index in the policy's rule set.
    pub table: u32,
    /// Its chain.
    pub chain: ChainId,
    /// Position key in `order`.
    pub pos: u64,
    /// The IR rules it lowered to, in order, without their matches
    /// ([`without_matches`]): ids, statements and verdicts. The matches are
    /// in the classifier; [`crate::CompiledPolicy::program`] lowers them
    /// again from `ast` (at 150 000 rules they are 38 MB, a sixth of a
    /// load's memory).
    pub rules: Box<[ir::Rule]>,
    /// The AST rule, packed (shared with the rule infos; an element
    /// change re-lowers it, listings print it).
    pub ast: ast::PackedRule,
    /// Named sets and maps it reads.
    pub uses: Box<[String]>,
}

/// Entries by handle. Handles are dense and never reused (nft's are too),
/// so a persistent vector indexed by handle does: appending is cheap, which
/// keeps a bulk load fast, and lookups are O(log n) with a wide fan-out.
#[derive(Debug, Clone, Default)]
pub(crate) struct Handles {
    slots: Vector<Option<Arc<Entry>>>,
    live: usize,
}

impl Handles {
    pub fn get(&self, h: &u64) -> Option<&Arc<Entry>> {
        let i = usize::try_from(*h).ok()?;
        self.slots.get(i).and_then(|e| e.as_ref())
    }

    pub fn insert(&mut self, h: u64, e: Arc<Entry>) {
        let Ok(i) = usize::try_from(h) else {
            return;
        };
        while self.slots.len() < i {
            self.slots.push_back(None);
        }
        if self.slots.len() == i {
            // The next handle (every rule of a bulk load): append.
            self.slots.push_back(Some(e));
            self.live += 1;
            return;
        }
        if let Some(slot) = self.slots.get_mut(i) {
            if slot.is_none() {
                self.live += 1;
            }
            *slot = Some(e);
        }
    }

    /// Every entry, by handle (a sequential walk, not one lookup each).
    pub fn entries(&self) -> impl Iterator<Item = &Arc<Entry>> + '_ {
        self.slots.iter().flatten()
    }

    pub fn remove(&mut self, h: &u64) -> Option<Arc<Entry>> {
        let i = usize::try_from(*h).ok()?;
        let old = self.slots.get_mut(i)?.take();
        if old.is_some() {
            self.live -= 1;
        }
        old
    }

    pub fn len(&self) -> usize {
        self.live
    }
}

/// The persistent rule store.
#[derive(Debug, Clone, Default)]
pub(crate) struct Store {
    pub handles: Handles,
    pub order: OrdMap<(u32, u64), u64>,
    pub infos: Vector<Option<Arc<RuleInfo>>>,
    pub users: PMap<(usize, String), OrdSet<u64>>,
    pub next_handle: u64,
    /// Number of IR rules.
    pub ir_rules: usize,
}

/// `rules` without their matches, as an [`Entry`] keeps them.
pub(crate) fn without_matches(mut rules: Vec<ir::Rule>) -> Box<[ir::Rule]> {
    for r in &mut rules {
        r.matches = Vec::new();
    }
    rules.into_boxed_slice()
}

/// Named sets and maps an AST rule reads.
pub(crate) fn named_uses(r: &ast::Rule) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut add = |n: &str| {
        if !out.iter().any(|x| x == n) {
            out.push(n.to_string());
        }
    };
    for m in &r.matches {
        if let ast::Value::SetRef(n) = &m.right {
            add(n);
        }
    }
    for s in &r.stmts {
        match &s.kind {
            ast::StmtKind::VerdictMap { map, .. }
            | ast::StmtKind::ObjMap { map, .. }
            | ast::StmtKind::MarkMap { map, .. }
            | ast::StmtKind::NumgenVmap { map, .. } => {
                if let ast::MapRef::Named(n) = &**map {
                    add(n);
                }
            }
            ast::StmtKind::Nat(nat) => {
                if let Some(ast::NatAddr::Map {
                    map: ast::MapRef::Named(n),
                    ..
                }) = &nat.addr
                {
                    add(n);
                }
            }
            _ => {}
        }
    }
    out
}

impl Store {
    /// The handles of `chain` in order.
    pub fn chain_handles(&self, chain: ChainId) -> impl Iterator<Item = u64> + '_ {
        self.order
            .range((chain.0, 0)..=(chain.0, u64::MAX))
            .map(|(_, h)| *h)
    }

    /// The entry of a handle.
    pub fn entry(&self, handle: u64) -> Option<&Arc<Entry>> {
        self.handles.get(&handle)
    }

    /// The neighbours of position `pos` in `chain`: the last key below it
    /// and the first key above it.
    pub fn neighbours(&self, chain: ChainId, pos: u64) -> (Option<u64>, Option<u64>) {
        let below = self
            .order
            .range((chain.0, 0)..(chain.0, pos))
            .next_back()
            .map(|((_, p), _)| *p);
        let above = self
            .order
            .range((chain.0, pos.saturating_add(1))..=(chain.0, u64::MAX))
            .next()
            .map(|((_, p), _)| *p);
        (below, above)
    }

    /// A free position strictly between `lo` and `hi` (`None`: the chain's
    /// ends), relabelling the chain when the gap is exhausted (the result is
    /// then right after the rule that was at `lo`, at its new position).
    pub fn position_between(&mut self, chain: ChainId, lo: Option<u64>, hi: Option<u64>) -> u64 {
        match (lo, hi) {
            (None, None) => GAP,
            (Some(l), None) => l.saturating_add(GAP),
            (None, Some(h)) if h > 1 => h / 2,
            (Some(l), Some(h)) if h - l > 1 => l + (h - l) / 2,
            _ => {
                // No gap: relabel the chain evenly, keep the slot open.
                let lo_handle = lo.and_then(|l| self.order.get(&(chain.0, l)).copied());
                self.relabel(chain);
                match lo_handle.and_then(|h| self.handles.get(&h)) {
                    Some(e) => e.pos + GAP / 2,
                    None => GAP / 2,
                }
            }
        }
    }

    /// Gives the rules of `chain` positions `GAP`, `2 GAP`, … (O(n log n);
    /// amortised over the ~32 insertions that exhaust a gap).
    fn relabel(&mut self, chain: ChainId) {
        let hs: Vec<u64> = self.chain_handles(chain).collect();
        for (k, h) in hs.iter().enumerate() {
            if let Some(e) = self.handles.get(h).cloned() {
                self.order.remove(&(chain.0, e.pos));
                let mut e = (*e).clone();
                e.pos = (k as u64 + 1).saturating_mul(GAP);
                self.order.insert((chain.0, e.pos), *h);
                self.handles.insert(*h, Arc::new(e));
            }
        }
    }

    /// The position keys around the handle `h` of `chain`.
    pub fn around(&self, chain: ChainId, h: u64) -> Option<(Option<u64>, u64, Option<u64>)> {
        let e = self.handles.get(&h)?;
        if e.chain != chain {
            return None;
        }
        let (lo, hi) = self.neighbours(chain, e.pos);
        Some((lo, e.pos, hi))
    }

    /// Position key of the last rule of `chain`.
    pub fn last_pos(&self, chain: ChainId) -> Option<u64> {
        self.order
            .range((chain.0, 0)..=(chain.0, u64::MAX))
            .next_back()
            .map(|((_, p), _)| *p)
    }

    /// Position key of the `index`-th rule of `chain`.
    pub fn nth(&self, chain: ChainId, index: usize) -> Option<u64> {
        self.order
            .range((chain.0, 0)..=(chain.0, u64::MAX))
            .nth(index)
            .map(|((_, p), _)| *p)
    }

    /// The last IR rule of the nearest handle before position `pos` in
    /// `chain` that has IR rules (the classifier placement anchor).
    pub fn ir_before(&self, chain: ChainId, pos: u64) -> Option<RuleId> {
        self.order
            .range((chain.0, 0)..(chain.0, pos))
            .rev()
            .filter_map(|(_, h)| self.handles.get(h))
            .find_map(|e| e.rules.last().map(|r| r.id))
    }

    /// Records `e` under handle `h`.
    pub fn put(&mut self, h: u64, e: Entry) {
        self.order.insert((e.chain.0, e.pos), h);
        self.put_loaded(h, e);
    }

    /// [`Self::put`] without the `order` entry (a load builds `order`
    /// separately, see `policy::load_order`).
    pub fn put_loaded(&mut self, h: u64, e: Entry) {
        self.ir_rules += e.rules.len();
        for n in &e.uses {
            let mut s = self
                .users
                .get(&(e.table as usize, n.clone()))
                .cloned()
                .unwrap_or_default();
            s.insert(h);
            self.users.insert((e.table as usize, n.clone()), s);
        }
        self.handles.insert(h, Arc::new(e));
    }

    /// Forgets handle `h`; returns its entry.
    pub fn take(&mut self, h: u64) -> Option<Arc<Entry>> {
        let e = self.handles.remove(&h)?;
        self.ir_rules = self.ir_rules.saturating_sub(e.rules.len());
        self.order.remove(&(e.chain.0, e.pos));
        for r in &e.rules {
            if let Some(slot) = self.infos.get_mut(r.id.0 as usize) {
                *slot = None;
            }
        }
        for n in &e.uses {
            let key = (e.table as usize, n.clone());
            if let Some(mut s) = self.users.get(&key).cloned() {
                s.remove(&h);
                if s.is_empty() {
                    self.users.remove(&key);
                } else {
                    self.users.insert(key, s);
                }
            }
        }
        Some(e)
    }

    /// Records the info of IR rule `id`.
    pub fn set_info(&mut self, id: RuleId, info: Arc<RuleInfo>) {
        let i = id.0 as usize;
        while self.infos.len() <= i {
            self.infos.push_back(None);
        }
        if let Some(slot) = self.infos.get_mut(i) {
            *slot = Some(info);
        }
    }

    /// Every chain's IR rules in order, without their matches (what the
    /// entries keep): the shape of the chain graph, for checks that read
    /// only verdicts.
    pub fn shape(&self, chains: &[(String, ir::ChainKind)]) -> Program {
        let mut p = Program::default();
        for (ci, (name, kind)) in chains.iter().enumerate() {
            let rules = self
                .chain_handles(ChainId(ci as u32))
                .filter_map(|h| self.handles.get(&h))
                .flat_map(|e| e.rules.iter().cloned())
                .collect();
            p.chains.push(ir::Chain {
                name: name.clone(),
                kind: *kind,
                rules,
            });
        }
        p
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An entry is 64 bytes (80 with its `Arc` counts, a mimalloc size
    /// class): one per rule of a loaded rule set.
    #[test]
    fn an_entry_is_64_bytes() {
        assert!(
            std::mem::size_of::<Entry>() <= 64,
            "{}",
            std::mem::size_of::<Entry>()
        );
    }
}
