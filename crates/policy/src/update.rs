//! Incremental updates: one control command turns a published
//! [`CompiledPolicy`] into the next generation without rebuilding it.
//!
//! The cost of [`CompiledPolicy::apply`] depends on the command, not on the
//! number of rules loaded: parsing the command against the declarations,
//! lowering one rule, O(log n) updates of the persistent rule store and the
//! classifier's incremental insert or delete (which copies only the shards
//! it touches). Two exceptions, both documented where they happen: a rule
//! that adds a NAT verdict or a jump walks the chain graph to keep NAT out of
//! filter chains, and an element change re-lowers the rules that read the
//! set.
//!
//! Every check runs before anything is published: a refused command leaves
//! the running generation exactly as it was.

use std::sync::{Arc, OnceLock};

use sluice_classify::ir::{self, ChainId, RuleId};
use sluice_classify::Placement;
use sluice_ruleset::{self as ast, Command, Diagnostics, RulePos, SetFlag};

use crate::error::CompileError;
use crate::live::{named_uses, without_matches, Entry};
use crate::lower::{reachable, Lowered, Lowerer, RuleLocation, RuleSource};
use crate::policy::{CompiledPolicy, Tables};

/// Why an update was refused. The running policy is unchanged.
#[derive(Debug, Clone, thiserror::Error)]
pub enum UpdateFailure {
    /// The command does not parse or does not fit the rule set.
    #[error("{}", .0.to_string().trim_end())]
    Parse(Diagnostics),
    /// The rule cannot be lowered.
    #[error("{}", .0.to_string().trim_end())]
    Lower(CompileError),
    /// The command is valid nft but cannot be applied here.
    #[error("{0}")]
    Refused(String),
}

/// What an applied command did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Applied {
    /// The handle of the added rule (`add rule` / `insert rule`).
    pub handle: Option<u64>,
    /// IR rules added or removed (a verdict map counts one per element).
    pub ir_rules: usize,
    /// AST rules re-lowered by an element change.
    pub relowered: usize,
}

/// One rule of the running policy, for listings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListedRule {
    /// `delete rule … handle H` names it.
    pub handle: u64,
    /// `"FAMILY TABLE CHAIN"`.
    pub chain: String,
    /// Canonical nft text.
    pub text: String,
    /// Where it came from (`FILE:LINE`, or the control command).
    pub location: Option<String>,
    /// (packets, bytes) matched, for a rule with a `counter` statement.
    pub counter: Option<(u64, u64)>,
}

impl CompiledPolicy {
    /// Records which of `rules` log or set the TCP MSS (their cells carry
    /// the log spec and the MSS).
    pub(crate) fn mark_logs(&self, rules: &[sluice_classify::ir::Rule]) {
        for r in rules {
            for s in &r.stmts {
                match s {
                    sluice_classify::ir::Stmt::Log(l) => self.counters.set_log(r.id, *l),
                    sluice_classify::ir::Stmt::TcpMss(m) => self.counters.set_mss(r.id, *m),
                    sluice_classify::ir::Stmt::FlowAdd(_) => self.counters.set_flow_add(r.id),
                    sluice_classify::ir::Stmt::CtTimeout { id, proto } => {
                        let slot = u8::try_from(*id).unwrap_or(0);
                        self.counters.set_ct_timeout(r.id, *proto, slot);
                    }
                    _ => {}
                }
            }
        }
    }

    /// Gives the rules `handles` the counts their `counter packets N bytes
    /// M` statements name (on their first IR rule).
    pub(crate) fn seed_counters(&self, handles: impl IntoIterator<Item = u64>) {
        for h in handles {
            if let Some(e) = self.store.entry(h) {
                self.seed_entry(e);
            }
        }
    }

    /// [`Self::seed_counters`] for one entry.
    pub(crate) fn seed_entry(&self, e: &crate::live::Entry) {
        if let Some((p, b)) = e.ast.counter() {
            if let (Some(r), true) = (e.rules.first(), p.is_some() || b.is_some()) {
                self.counters.set(r.id, p.unwrap_or(0), b.unwrap_or(0));
            }
        }
        self.mark_logs(&e.rules);
    }
}

fn refused<T>(msg: impl Into<String>) -> Result<T, UpdateFailure> {
    Err(UpdateFailure::Refused(msg.into()))
}

/// Whether IR rule `r` holds a `counter`.
fn has_counter(r: &sluice_classify::ir::Rule) -> bool {
    r.stmts
        .iter()
        .any(|s| matches!(s, sluice_classify::ir::Stmt::Counter))
}

fn same_elem(a: &ast::Elem, b: &ast::Elem) -> bool {
    a.key == b.key && a.data == b.data
}

impl CompiledPolicy {
    /// Parses an nft control command (`add rule …`, `insert rule …`,
    /// `delete rule … handle H`, `add element …`, `delete element …`)
    /// against this policy's declarations; `name` labels diagnostics.
    pub fn parse_command(&self, name: &str, text: &str) -> Result<Command, UpdateFailure> {
        ast::parse_nft_command(&self.skeleton, name, text).map_err(UpdateFailure::Parse)
    }

    /// Parses and applies one command: see [`Self::parse_command`] and
    /// [`Self::apply`].
    pub fn apply_text(
        &self,
        name: &str,
        text: &str,
    ) -> Result<(CompiledPolicy, Applied), UpdateFailure> {
        let cmd = self.parse_command(name, text)?;
        self.apply(&cmd, name)
    }

    /// The next generation with `cmd` applied; `self` is not modified.
    /// `name` labels the locations of added rules (`NAME handle H`).
    pub fn apply(
        &self,
        cmd: &Command,
        name: &str,
    ) -> Result<(CompiledPolicy, Applied), UpdateFailure> {
        let mut next = self.clone();
        next.program = OnceLock::new();
        next.seq += 1;
        let applied = match cmd {
            Command::AddRule {
                family,
                table,
                chain,
                at,
                rule,
            } => {
                let (ti, cid) = self.chain_id(*family, table, chain)?;
                next.add_rule(ti, cid, chain, *at, rule, name)?
            }
            Command::DeleteRule {
                family,
                table,
                chain,
                handle,
            } => {
                let (_, cid) = self.chain_id(*family, table, chain)?;
                next.delete_rule(cid, chain, *handle)?
            }
            Command::AddElements {
                family,
                table,
                set,
                elements,
            } => next.change_elements(*family, table, set, elements, true, name)?,
            Command::DeleteElements {
                family,
                table,
                set,
                elements,
            } => next.change_elements(*family, table, set, elements, false, name)?,
            Command::FlushSet { family, table, set } => {
                next.flush_set(*family, table, set, name)?
            }
            Command::AddObject {
                family,
                table,
                object,
            } => next.add_object(*family, table, object)?,
            Command::DeleteObject {
                family,
                table,
                kind,
                name,
            } => next.delete_object(*family, table, *kind, name)?,
        };
        next.counters.ensure(next.store.infos.len() as u64);
        if next.tables.limits.len() > next.limiters.len()
            || next.tables.set_ops.len() > next.limiters.set_ops()
            || next.tables.quotas.len() > next.limiters.quotas()
            || next.tables.numgens.len() > next.limiters.numgens()
            || next.tables.ct_counts.len() > next.limiters.ct_counts()
            || next.tables.objects.len() > next.limiters.objects()
        {
            let mut l = (*next.limiters).clone();
            l.extend_to(&next.tables.limits);
            l.extend_sets(&next.tables.sets, &next.tables.set_ops);
            l.extend_quotas(&next.tables.quotas);
            l.extend_numgens(&next.tables.numgens);
            l.extend_ct_counts(&next.tables.ct_counts);
            l.extend_objects(&next.tables.objects);
            next.limiters = Arc::new(l);
        }
        if let (Command::AddRule { .. }, Some(h)) = (cmd, applied.handle) {
            next.seed_counters([h]);
        }
        Ok((next, applied))
    }

    /// The running rule set as `nft list ruleset` shows it: every table
    /// with its objects (their live values), sets and maps (declared
    /// elements and those added by control commands; `sluice ctl set list`
    /// shows what the packet path added to dynamic sets) and chains with
    /// their rules in order, each rule's `counter` carrying its live
    /// packets and bytes.
    pub fn running_ruleset(&self) -> ast::Ruleset {
        let mut rs = (*self.skeleton).clone();
        let objects = self.objects(None, None);
        for (ti, t) in rs.tables.iter_mut().enumerate() {
            let prefix = format!("{} {} ", t.family.name(), t.name);
            for o in &mut t.objects {
                let full = format!("{prefix}{}", o.name);
                if let Some(live) = objects
                    .iter()
                    .find(|x| x.kind() == o.kind() && x.name == full)
                {
                    o.state = match (o.state, live.state) {
                        // A quota keeps its own spelling of the amount; the
                        // bytes used are live.
                        (ast::ObjState::Quota(q), ast::ObjState::Quota(l)) => {
                            ast::ObjState::Quota(ast::Quota { used: l.used, ..q })
                        }
                        (_, l) => l,
                    };
                }
            }
            for c in &mut t.chains {
                let Some(cid) = self.meta.chain_ids.get(&(ti, c.name.clone())) else {
                    continue;
                };
                for h in self.store.chain_handles(*cid) {
                    let Some(e) = self.store.entry(h) else {
                        continue;
                    };
                    let Some(mut r) = e.ast.unpack() else {
                        continue;
                    };
                    if e.ast.counter().is_some() {
                        let (p, b) = self.counted(&e.rules);
                        for st in &mut r.stmts {
                            if let ast::StmtKind::Counter { packets, bytes } = &mut st.kind {
                                *packets = Some(p);
                                *bytes = Some(b);
                            }
                        }
                    }
                    c.rules.push(r);
                }
            }
        }
        rs
    }

    /// The packets and bytes an AST rule's `counter` counted: the sums of
    /// those of its IR rules `rules` that hold the counter. (A rule split
    /// in two, the statements before a map lookup in a rule of their own
    /// and the lookup's elements in others, passes a packet that hits the
    /// map through two of them; the counter is in the first only.)
    fn counted(&self, rules: &[sluice_classify::ir::Rule]) -> (u64, u64) {
        rules
            .iter()
            .filter(|r| has_counter(r))
            .fold((0, 0), |(p, b), r| {
                let (rp, rb) = self.counters.get(r.id);
                (p + rp, b + rb)
            })
    }

    /// Every rule in chain order, with its handle.
    pub fn list_rules(&self) -> Vec<ListedRule> {
        let mut out = Vec::with_capacity(self.store.handles.len());
        for (ci, c) in self.meta.chains.iter().enumerate() {
            for h in self.store.chain_handles(ChainId(ci as u32)) {
                let Some(e) = self.store.entry(h) else {
                    continue;
                };
                let info = e.rules.first().and_then(|r| self.rule_info(r.id));
                let counter = e.ast.counter().map(|_| self.counted(&e.rules));
                out.push(ListedRule {
                    handle: h,
                    chain: c.name.clone(),
                    text: e.ast.text(),
                    location: info.map(|i| i.location.to_string()),
                    counter,
                });
            }
        }
        out
    }

    fn table_index(&self, family: ast::Family, table: &str) -> Result<usize, UpdateFailure> {
        match self
            .skeleton
            .tables
            .iter()
            .position(|t| t.family == family && t.name == table)
        {
            Some(ti) => Ok(ti),
            None => refused(format!("no such table '{} {table}'", family.name())),
        }
    }

    fn chain_id(
        &self,
        family: ast::Family,
        table: &str,
        chain: &str,
    ) -> Result<(usize, ChainId), UpdateFailure> {
        let ti = self.table_index(family, table)?;
        match self.meta.chain_ids.get(&(ti, chain.to_string())) {
            Some(c) => Ok((ti, *c)),
            None => refused(format!(
                "no such chain '{chain}' in table '{} {table}'",
                family.name()
            )),
        }
    }

    fn lowerer<'a>(&'a self, handle: u64, location: RuleLocation) -> Lowerer<'a> {
        Lowerer::incremental(
            &self.skeleton,
            &self.ifaces,
            self.store.infos.len() as u64,
            handle,
            &self.tables,
            location,
        )
    }

    /// Inserts IR rules after the IR rule before position `pos`.
    fn place(&mut self, cid: ChainId, pos: u64, rules: &[ir::Rule]) -> Result<(), UpdateFailure> {
        self.routing_facts |= rules.iter().any(crate::policy::reads_routing_facts);
        self.routing_facts |= crate::policy::set_ops_read_routing_facts(&self.tables.set_ops);
        let mut at = match self.store.ir_before(cid, pos) {
            Some(id) => Placement::After(id),
            None => Placement::Front,
        };
        for r in rules {
            if let Err(e) = self.classifier.insert_rule(cid, at, r) {
                let msg = match e {
                    sluice_classify::UpdateError::Loop(_) => {
                        "this jump or goto would create a loop".to_string()
                    }
                    sluice_classify::UpdateError::BadTarget(_) => {
                        "jump and goto must target a regular chain".to_string()
                    }
                    other => other.to_string(),
                };
                return refused(msg);
            }
            at = Placement::After(r.id);
        }
        Ok(())
    }

    fn add_rule(
        &mut self,
        ti: usize,
        cid: ChainId,
        chain: &str,
        at: RulePos,
        rule: &ast::Rule,
        name: &str,
    ) -> Result<Applied, UpdateFailure> {
        let handle = self.store.next_handle;
        let missing = |what: String| UpdateFailure::Refused(what);
        let (lo, hi) = match at {
            RulePos::Back => (self.store.last_pos(cid), None),
            RulePos::Front => (None, self.store.nth(cid, 0)),
            RulePos::AfterHandle(h) | RulePos::BeforeHandle(h) => {
                let (lo, p, hi) = self.store.around(cid, h).ok_or_else(|| {
                    missing(format!("no rule with handle {h} in chain '{chain}'"))
                })?;
                if matches!(at, RulePos::AfterHandle(_)) {
                    (Some(p), hi)
                } else {
                    (lo, Some(p))
                }
            }
            RulePos::AfterIndex(i) | RulePos::BeforeIndex(i) => {
                let p = self
                    .store
                    .nth(cid, i)
                    .ok_or_else(|| missing(format!("chain '{chain}' has no rule at index {i}")))?;
                let (lo, hi) = self.store.neighbours(cid, p);
                if matches!(at, RulePos::AfterIndex(_)) {
                    (Some(p), hi)
                } else {
                    (lo, Some(p))
                }
            }
        };
        let (irs, low_tables) = {
            let mut low = self.lowerer(
                handle,
                RuleLocation::Label(format!("{name} handle {handle}").into()),
            );
            let irs = low.lower_one(ti, cid, rule).map_err(|mut es| {
                for e in &mut es {
                    e.file = name.to_string();
                }
                UpdateFailure::Lower(CompileError { errors: es })
            })?;
            (irs, low.tables().clone())
        };
        // What the lowerer kept of the rule (packed, shared with its infos).
        let src = match low_tables.sources.last() {
            Some(s) => s.clone(),
            None => RuleSource {
                packed: ast::PackedRule::pack(rule),
                uses: named_uses(rule),
            },
        };
        self.adopt_lowered(&low_tables)?;
        let pos = self.store.position_between(cid, lo, hi);
        self.place(cid, pos, &irs)?;
        let graph_change = irs.iter().any(|r| {
            matches!(
                r.verdict,
                Some(ir::Verdict::Nat(_) | ir::Verdict::Jump(_) | ir::Verdict::Goto(_))
            )
        });
        let n = irs.len();
        self.store.put(
            handle,
            Entry {
                table: ti as u32,
                chain: cid,
                pos,
                rules: without_matches(irs),
                ast: src.packed,
                uses: src.uses.into_boxed_slice(),
            },
        );
        self.store.next_handle = handle + 1;
        if graph_change {
            self.check_nat_placement()?;
        }
        Ok(Applied {
            handle: Some(handle),
            ir_rules: n,
            relowered: 0,
        })
    }

    /// Takes the lowerer's tables (NAT actions, pools, logs, limits, rule
    /// infos) into this generation. A new SNAT pool is appended (the
    /// numbers of the others stay); the gateway checks that its NAT can
    /// take it before it publishes.
    fn adopt_lowered(&mut self, out: &Lowered) -> Result<(), UpdateFailure> {
        if out.pools.len() != self.nat_config.pools.len() {
            self.nat_config = Arc::new(sluice_nat::NatConfig {
                pools: out.pools.clone(),
                ..(*self.nat_config).clone()
            });
        }
        if out.nat.len() != self.tables.nat.len()
            || out.logs.len() != self.tables.logs.len()
            || out.limits.len() != self.tables.limits.len()
            || out.sets.len() != self.tables.sets.len()
            || out.set_ops.len() != self.tables.set_ops.len()
            || out.quotas.len() != self.tables.quotas.len()
            || out.numgens.len() != self.tables.numgens.len()
            || out.ct_counts.len() != self.tables.ct_counts.len()
            || out.objects.len() != self.tables.objects.len()
            || out.ct_timeouts.len() != self.tables.ct_timeouts.len()
        {
            self.tables = Arc::new(Tables {
                nat: out.nat.clone(),
                pools: out.pools.clone(),
                logs: out.logs.clone(),
                limits: out.limits.clone(),
                sets: out.sets.clone(),
                set_ops: out.set_ops.clone(),
                quotas: out.quotas.clone(),
                numgens: out.numgens.clone(),
                ct_counts: out.ct_counts.clone(),
                objects: out.objects.clone(),
                ct_timeouts: out.ct_timeouts.clone(),
            });
        }
        let base = self.store.infos.len() as u64;
        for (i, info) in out.rules.iter().enumerate() {
            self.store
                .set_info(RuleId(base + i as u64), Arc::clone(info));
        }
        Ok(())
    }

    /// NAT stays in `type nat` chains: no filter base chain may reach a NAT
    /// rule. Also turns on NAT hooks that now reach one. Walks the chain
    /// graph (O(rules)); only NAT and jump rules pay for it. The program is
    /// built for the check and dropped, not cached in this generation.
    fn check_nat_placement(&mut self) -> Result<(), UpdateFailure> {
        let prog = &self.store.shape(&self.meta.kinds);
        let has_nat_rule = |c: ChainId| {
            prog.chains.get(c.0 as usize).is_some_and(|ch| {
                ch.rules
                    .iter()
                    .any(|r| matches!(r.verdict, Some(ir::Verdict::Nat(_))))
            })
        };
        let mut has_nat = self.has_nat;
        for b in &self.meta.bases {
            let reach = reachable(prog, b.chain);
            let any = reach.iter().any(|c| has_nat_rule(*c));
            if any && !b.nat {
                let base = self
                    .meta
                    .chains
                    .get(b.chain.0 as usize)
                    .map(|c| c.name.clone())
                    .unwrap_or_default();
                return refused(format!(
                    "a NAT rule would be reachable from filter chain '{base}'; NAT is only \
                     valid in chains of type nat"
                ));
            }
            if any {
                if let Some(h) = has_nat.get_mut(crate::policy::hook_index(b.hook)) {
                    *h = true;
                }
            }
        }
        self.has_nat = has_nat;
        Ok(())
    }

    fn delete_rule(
        &mut self,
        cid: ChainId,
        chain: &str,
        handle: u64,
    ) -> Result<Applied, UpdateFailure> {
        match self.store.entry(handle) {
            Some(e) if e.chain == cid => {}
            _ => return refused(format!("no rule with handle {handle} in chain '{chain}'")),
        }
        let Some(e) = self.store.take(handle) else {
            return refused(format!("no rule with handle {handle} in chain '{chain}'"));
        };
        for r in &e.rules {
            if let Err(err) = self.classifier.delete_rule(cid, r.id) {
                return refused(format!("internal: {err}"));
            }
        }
        Ok(Applied {
            handle: Some(handle),
            ir_rules: e.rules.len(),
            relowered: 0,
        })
    }

    /// `flush set`: every element goes, the declared ones and, for a
    /// dynamic set, the live ones the packet path added.
    fn flush_set(
        &mut self,
        family: ast::Family,
        table: &str,
        set: &str,
        name: &str,
    ) -> Result<Applied, UpdateFailure> {
        let ti = self.table_index(family, table)?;
        let Some(decl) = self
            .skeleton
            .tables
            .get(ti)
            .and_then(|t| t.sets.iter().find(|s| s.name == set))
        else {
            return refused(format!("no such set '{set}'"));
        };
        if decl.is_dynamic() {
            let full = format!("{} {table} {set}", family.name());
            if let Some(i) = self.tables.sets.iter().position(|s| s.name == full) {
                if let Some(live) = self.limiters.set(i) {
                    live.clear();
                }
                self.limiters.conn_counts().forget_set(i as u32);
            }
            let mut sk = (*self.skeleton).clone();
            if let Some(s) = sk
                .tables
                .get_mut(ti)
                .and_then(|t| t.sets.iter_mut().find(|s| s.name == set))
            {
                s.elements.clear();
            }
            self.skeleton = Arc::new(sk);
            return Ok(Applied {
                handle: None,
                ir_rules: 0,
                relowered: 0,
            });
        }
        if decl.flags.contains(&SetFlag::Constant) {
            return refused(format!(
                "set '{set}' is constant; its elements cannot change"
            ));
        }
        let elements = decl.elements.clone();
        if elements.is_empty() {
            return Ok(Applied {
                handle: None,
                ir_rules: 0,
                relowered: 0,
            });
        }
        self.change_elements(family, table, set, &elements, false, name)
    }

    /// `add element` / `delete element` on a dynamic set: the live
    /// elements change at once (an added one expires as a declared one:
    /// its `expires`, its `timeout`, else the set's, from the change's
    /// publication); the declared elements in the skeleton follow, for a
    /// set no rule uses yet. No rule is lowered again: lookups read the
    /// live set.
    #[allow(clippy::too_many_arguments)]
    fn change_dynamic(
        &mut self,
        family: ast::Family,
        ti: usize,
        mut sk: ast::Ruleset,
        set: &str,
        elements: &[ast::Elem],
        add: bool,
        name: &str,
    ) -> Result<Applied, UpdateFailure> {
        let Some(t) = sk.tables.get(ti) else {
            return refused(format!("no such table in family {}", family.name()));
        };
        let Some(decl) = t.sets.iter().find(|s| s.name == set) else {
            return refused(format!("no such set '{set}'"));
        };
        if add
            && !decl.flags.contains(&SetFlag::Timeout)
            && decl.timeout_ms.is_none()
            && elements.iter().any(|e| e.lifetime_ms().is_some())
        {
            return refused(format!(
                "{name}: an element's timeout or expiry needs 'flags timeout' on set '{set}'"
            ));
        }
        let decl_timeout = decl.timeout_ms;
        let full = format!("{} {} {}", family.name(), t.name, set);
        let keys = {
            let l = self.lowerer(self.store.next_handle, RuleLocation::Label(name.into()));
            l.set_elem_keys(t, decl, elements)
                .or_else(|e| refused(format!("{name}: {e}")))?
        };
        let live_at = self.tables.sets.iter().position(|s| s.name == full);
        let live = live_at.and_then(|i| self.limiters.set(i));
        if let Some(live) = live {
            if add && !live.has_room(keys.len()) {
                return refused(format!(
                    "set '{set}' is full; delete elements or give it a larger size"
                ));
            }
        }
        let Some(elems) = sk
            .tables
            .get_mut(ti)
            .and_then(|t| t.sets.iter_mut().find(|s| s.name == set))
            .map(|s| &mut s.elements)
        else {
            return refused(format!("no such set '{set}'"));
        };
        let mut missing = Vec::new();
        for (e, k) in elements.iter().zip(&keys) {
            let have = elems.iter().position(|x| same_elem(x, e));
            match (add, have) {
                (true, None) => elems.push(e.clone()),
                (false, Some(i)) => {
                    elems.remove(i);
                }
                _ => {}
            }
            // An element lives its `expires`, else its `timeout`, else the
            // set's timeout, from when the gateway publishes the change
            // (`start_timers`), as the kernel's; without any, until
            // deleted.
            let timed = e.lifetime_ms().or(decl_timeout);
            let in_live = live.is_some_and(|l| {
                if add {
                    l.insert_added(k, timed);
                    true
                } else {
                    if let Some(i) = live_at {
                        self.limiters.conn_counts().forget(i as u32, k);
                    }
                    l.delete(k)
                }
            });
            if !add && have.is_none() && !in_live {
                missing.push(e);
            }
        }
        if let Some(e) = missing.first() {
            return refused(format!(
                "{name}:{}:{}: element is not in set '{set}'",
                e.span.line, e.span.col
            ));
        }
        self.skeleton = Arc::new(sk);
        Ok(Applied {
            handle: None,
            ir_rules: 0,
            relowered: 0,
        })
    }

    /// `add counter|quota`: the object joins its table (the parser
    /// refused a name already taken) and starts with its declared values.
    fn add_object(
        &mut self,
        family: ast::Family,
        table: &str,
        object: &ast::Object,
    ) -> Result<Applied, UpdateFailure> {
        let ti = self.table_index(family, table)?;
        let mut sk = (*self.skeleton).clone();
        let Some(t) = sk.tables.get_mut(ti) else {
            return refused(format!("no such table '{} {table}'", family.name()));
        };
        t.objects.push(object.clone());
        self.skeleton = Arc::new(sk);
        let mut tables = (*self.tables).clone();
        tables.objects.push(crate::lower::ObjSpec {
            name: format!("{} {table} {}", family.name(), object.name),
            state: object.state,
        });
        self.tables = Arc::new(tables);
        Ok(Applied {
            handle: None,
            ir_rules: 0,
            relowered: 0,
        })
    }

    /// `delete counter|quota`: refused while a rule of the table names the
    /// object (as the kernel refuses with EBUSY). Its id is retired, not
    /// reused: a later object of the same name starts afresh.
    fn delete_object(
        &mut self,
        family: ast::Family,
        table: &str,
        kind: ast::ObjKind,
        name: &str,
    ) -> Result<Applied, UpdateFailure> {
        let ti = self.table_index(family, table)?;
        let chains: Vec<(String, ChainId)> = self
            .meta
            .chain_ids
            .iter()
            .filter(|((t, _), _)| *t == ti)
            .map(|((_, c), id)| (c.clone(), *id))
            .collect();
        for (chain, cid) in chains {
            for h in self.store.chain_handles(cid) {
                let Some(r) = self.store.entry(h).and_then(|e| e.ast.unpack()) else {
                    continue;
                };
                let names = |es: &[ast::Elem]| {
                    es.iter()
                        .any(|e| matches!(&e.data, Some(ast::Value::Str(n)) if n == name))
                };
                let uses = r.stmts.iter().any(|s| match &s.kind {
                    ast::StmtKind::ObjRef { kind: k, name: n } => *k == kind && n == name,
                    ast::StmtKind::ObjMap { kind: k, map, .. } => {
                        *k == kind && matches!(&**map, ast::MapRef::Anon(es) if names(es))
                    }
                    _ => false,
                });
                if uses {
                    return refused(format!(
                        "{} '{name}' is in use by rule handle {h} in chain '{chain}'; \
                         delete that rule first",
                        kind.name()
                    ));
                }
            }
        }
        let mut sk = (*self.skeleton).clone();
        if let Some(t) = sk.tables.get_mut(ti) {
            if let Some(m) = t.maps.iter().find(|m| {
                m.data == kind.datatype()
                    && m.elements
                        .iter()
                        .any(|e| matches!(&e.data, Some(ast::Value::Str(n)) if n == name))
            }) {
                return refused(format!(
                    "{} '{name}' is in use by an element of map '{}'; delete that element first",
                    kind.name(),
                    m.name
                ));
            }
            t.objects.retain(|o| !(o.kind() == kind && o.name == name));
        }
        self.skeleton = Arc::new(sk);
        let full = format!("{} {table} {name}", family.name());
        let mut tables = (*self.tables).clone();
        for o in &mut tables.objects {
            if o.kind() == kind && o.name == full {
                // Retired: no name matches an empty one.
                o.name.clear();
            }
        }
        self.tables = Arc::new(tables);
        Ok(Applied {
            handle: None,
            ir_rules: 0,
            relowered: 0,
        })
    }

    fn change_elements(
        &mut self,
        family: ast::Family,
        table: &str,
        set: &str,
        elements: &[ast::Elem],
        add: bool,
        name: &str,
    ) -> Result<Applied, UpdateFailure> {
        let ti = self.table_index(family, table)?;
        let mut sk = (*self.skeleton).clone();
        let Some(t) = sk.tables.get_mut(ti) else {
            return refused(format!("no such table '{} {table}'", family.name()));
        };
        if t.sets.iter().any(|s| s.name == set && s.is_dynamic()) {
            return self.change_dynamic(family, ti, sk, set, elements, add, name);
        }
        let (flags, elems) = if let Some(s) = t.sets.iter_mut().find(|s| s.name == set) {
            (s.flags.clone(), &mut s.elements)
        } else if let Some(m) = t.maps.iter_mut().find(|m| m.name == set) {
            (m.flags.clone(), &mut m.elements)
        } else {
            return refused(format!("no such set '{set}'"));
        };
        if flags.contains(&SetFlag::Constant) {
            return refused(format!(
                "set '{set}' is constant; its elements cannot change"
            ));
        }
        if elements.iter().any(|e| e.lifetime_ms().is_some()) {
            return refused(format!(
                "{name}: an element's timeout or expiry needs a set with 'flags timeout' \
                 ('{set}' has none, or is a map)"
            ));
        }
        for e in elements {
            let have = elems.iter().position(|x| same_elem(x, e));
            match (add, have) {
                (true, None) => elems.push(e.clone()),
                (true, Some(_)) => {}
                (false, Some(i)) => {
                    elems.remove(i);
                }
                (false, None) => {
                    return refused(format!(
                        "{name}:{}:{}: element is not in set '{set}'",
                        e.span.line, e.span.col
                    ))
                }
            }
        }
        self.skeleton = Arc::new(sk);
        let users: Vec<u64> = self
            .store
            .users
            .get(&(ti, set.to_string()))
            .map(|s| s.iter().copied().collect())
            .unwrap_or_default();
        let mut ir_rules = 0;
        for h in &users {
            let Some(old) = self.store.entry(*h).cloned() else {
                continue;
            };
            let Some(rule) = old.ast.unpack() else {
                return refused(format!("internal: rule handle {h} does not unpack"));
            };
            let location = old
                .rules
                .first()
                .and_then(|r| self.rule_info(r.id))
                .map(|i| i.location.clone())
                .unwrap_or_else(|| RuleLocation::of(&self.skeleton, rule.span));
            let (irs, out) = {
                let mut low = self.lowerer(*h, location);
                let irs = low
                    .lower_one(old.table as usize, old.chain, &rule)
                    .map_err(|es| UpdateFailure::Lower(CompileError { errors: es }))?;
                (irs, low.tables().clone())
            };
            self.adopt_lowered(&out)?;
            let _ = self.store.take(*h);
            for r in &old.rules {
                if let Err(err) = self.classifier.delete_rule(old.chain, r.id) {
                    return refused(format!("internal: {err}"));
                }
            }
            self.place(old.chain, old.pos, &irs)?;
            ir_rules += irs.len();
            // The re-lowered rule keeps its counts (moved to its new first
            // IR rule; a packet counted on the old ones while the running
            // generation still uses them is not carried over).
            self.counters.ensure(self.store.infos.len() as u64);
            let counted = self.counted(&old.rules);
            if let Some(r) = irs.iter().find(|r| has_counter(r)).or(irs.first()) {
                self.counters.set(r.id, counted.0, counted.1);
            }
            self.mark_logs(&irs);
            self.store.put(
                *h,
                Entry {
                    rules: without_matches(irs),
                    ..(*old).clone()
                },
            );
        }
        Ok(Applied {
            handle: None,
            ir_rules,
            relowered: users.len(),
        })
    }
}
