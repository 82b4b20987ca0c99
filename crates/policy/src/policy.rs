//! [`CompiledPolicy`]: a lowered rule set with netfilter's cross-chain
//! semantics, implementing the engine's [`Policy`] trait.

use std::cell::RefCell;
use std::sync::{Arc, OnceLock};

use sluice_classify::ir::{
    ct, ChainId, ConnId, Family as IrFamily, IfName, PacketFields, Program, RuleId,
};
use sluice_classify::{eval_linear, Classifier, EvalError, Final, Outcome, Scratch};
use sluice_engine::policy::RejectWith;
use sluice_engine::{CtState, Decision, Hook, Policy, PolicyPacket, RawDecision, Verdict};
use sluice_nat::{NatConfig, Translation};
use sluice_ruleset::{self as ast, Family, Ruleset};

use crate::error::{CompileError, LowerError};
use crate::iface::Interfaces;
use crate::live::{without_matches, Entry, Store, GAP};
use crate::lower::{
    reachable, take_rules, BaseInfo, ChainInfo, Lowered, Lowerer, NatAction, RuleInfo,
};

/// Which evaluator runs the chains.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Evaluator {
    /// The compiled classifier (what the engine uses).
    Compiled,
    /// The reference linear walk.
    Linear,
}

/// The final verdict of one hook.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HookVerdict {
    /// Every base chain accepted (or none exists).
    Accept,
    /// A chain dropped, by rule or policy.
    Drop,
    /// A rule rejected; the exact `reject with` (None: the default).
    Reject(Option<ast::RejectWith>),
    /// Evaluation failed (jump depth); the engine drops.
    Error(EvalError),
}

/// The result of running every base chain of one hook.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HookOutcome {
    /// Verdict.
    pub verdict: HookVerdict,
    /// The rule that decided: the dropping/rejecting rule, or for accept
    /// the accepting rule of the last base chain (None when its policy
    /// decided or the hook has no chain).
    pub rule: Option<RuleId>,
    /// NAT action id (into [`CompiledPolicy::nat_actions`]) and its rule.
    pub nat: Option<(u32, RuleId)>,
    /// Packet mark afterwards.
    pub mark: u32,
    /// Conntrack mark afterwards.
    pub ct_mark: u32,
    /// `ct state` afterwards: [`ct::UNTRACKED`] once a `notrack` statement
    /// ran on a packet without a connection.
    pub ct_state: u8,
}

/// The next [`CompiledPolicy::flowtable_gen`] (from 1).
static FLOWTABLE_GEN: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// Conntrack's priority in prerouting (the kernel's
/// `NF_IP_PRI_CONNTRACK`): base chains below it see packets before
/// conntrack does.
pub const CONNTRACK_PRIORITY: i32 = -200;

/// Which base chains of a hook [`CompiledPolicy::run_hook`] runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// Every base chain of the hook.
    All,
    /// The prerouting or output chains before conntrack (priority below
    /// [`CONNTRACK_PRIORITY`], e.g. `priority raw`); none for other hooks.
    BeforeConntrack,
    /// Every base chain of the hook but those.
    AfterConntrack,
}

impl Stage {
    fn runs(self, b: &BaseInfo) -> bool {
        match self {
            Stage::All => true,
            Stage::BeforeConntrack => b.before_conntrack(),
            Stage::AfterConntrack => !b.before_conntrack(),
        }
    }
}

impl BaseInfo {
    /// Whether the chain runs before conntrack: a prerouting or output
    /// chain of priority below [`CONNTRACK_PRIORITY`]. Its packets have no
    /// connection (`ct state` reads `invalid`) and `notrack` acts there.
    pub fn before_conntrack(&self) -> bool {
        matches!(self.hook, ast::Hook::Prerouting | ast::Hook::Output)
            && self.priority < CONNTRACK_PRIORITY
    }
}

/// A compiled rule set: immutable once built, cheap to share as
/// `Arc<CompiledPolicy>` and meant to be published with an atomic swap.
///
/// [`CompiledPolicy::apply`] derives the next generation from this one for a
/// single `add rule` / `insert rule` / `delete rule` / element change; the
/// two share everything the change does not touch (see the `live` module).
#[derive(Debug, Clone)]
pub struct CompiledPolicy {
    pub(crate) meta: Arc<Meta>,
    pub(crate) tables: Arc<Tables>,
    pub(crate) store: Store,
    pub(crate) program: OnceLock<Arc<Program>>,
    pub(crate) classifier: Classifier,
    pub(crate) ifaces: Arc<Interfaces>,
    pub(crate) nat_config: Arc<NatConfig>,
    pub(crate) has_nat: [bool; 5],
    /// Some rule (or dynamic-set key) reads `fib` address types or the
    /// reverse path ([`Policy::needs_routing_facts`]); set at compile time
    /// and by every rule an update inserts, never cleared by a deletion.
    pub(crate) routing_facts: bool,
    /// [`Policy::flowtables`]: 0 without flowtables, else a number of this
    /// compilation's own (kept by the generations an update derives).
    pub(crate) flowtable_gen: u64,
    /// The rule set's declarations: tables, chains (without rules), sets
    /// and maps with their elements. Commands are parsed against it and
    /// rules lowered in its context.
    pub(crate) skeleton: Arc<Ruleset>,
    /// Control commands applied so far (names their rules' locations).
    pub(crate) seq: u64,
    /// Per-rule packet and byte counts, shared with the generations
    /// derived from this one ([`crate::counters`]).
    pub(crate) counters: crate::counters::RuleCounters,
    /// Token buckets of the `limit` statements ([`crate::limits`]), shared
    /// with derived generations.
    pub(crate) limiters: Arc<crate::limits::Limiters>,
    /// The rate budget of `log` lines.
    pub(crate) log_budget: Arc<crate::limits::LogBudget>,
}

/// What an update never changes: chains and their registration.
#[derive(Debug)]
pub(crate) struct Meta {
    pub chains: Vec<ChainInfo>,
    pub kinds: Vec<(String, sluice_classify::ChainKind)>,
    pub bases: Vec<BaseInfo>,
    pub chain_ids: std::collections::HashMap<(usize, String), ChainId>,
}

/// Tables the IR refers to by number; small, copied when a rule appends.
#[derive(Debug, Clone)]
pub(crate) struct Tables {
    pub nat: Vec<NatAction>,
    pub pools: Vec<sluice_nat::Pool>,
    pub logs: Vec<ast::Log>,
    pub limits: Vec<ast::Limit>,
    pub sets: Vec<crate::lower::DynSetSpec>,
    pub set_ops: Vec<crate::lower::SetOpSpec>,
    pub quotas: Vec<ast::Quota>,
    pub numgens: Vec<crate::lower::NumgenSpec>,
    pub ct_counts: Vec<ast::CtCount>,
    pub objects: Vec<crate::lower::ObjSpec>,
    /// Leases of the `ct timeout` slots the rules give (kept, not read).
    pub ct_timeouts: Vec<sluice_engine::ct_timeout::Lease>,
}

/// A named object and its live values ([`CompiledPolicy::objects`]): a
/// counter's packets and bytes, or a quota with its bytes used in `used`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListedObject {
    /// `"FAMILY TABLE NAME"`.
    pub name: String,
    /// The live values.
    pub state: ast::ObjState,
}

impl ListedObject {
    /// Counter, quota or limit.
    pub fn kind(&self) -> ast::ObjKind {
        self.state.kind()
    }
}

/// Whether the object called `full` (`"FAMILY TABLE NAME"`) is the one the
/// operator means by `name`: the full name, `"TABLE NAME"` or `NAME`.
fn object_named(full: &str, name: &str) -> bool {
    full == name || full.ends_with(&format!(" {name}"))
}

/// Rule sets at least this large build the rule store's `order` map
/// ([`load_order`]) on another thread while the rest of the store is built.
const PAR_ORDER_MIN: usize = 8192;

/// The number of rules of each chain: `[table][chain]`.
type RuleCounts = Vec<Vec<usize>>;

/// The `order` map of a freshly loaded store: the `k`-th rule of a chain
/// at position `(k + 1) · GAP`, handles from 1 in table, chain and rule
/// order, chain ids in table and chain order (what [`build_store`]
/// assigns). It needs only the rule counts, so it can be built while
/// [`build_store`] runs: about 150 000 one-by-one `imbl` B-tree inserts
/// (imbl has no bulk construction), a third of the store's build.
fn load_order(rs: &Ruleset, counts: &RuleCounts) -> imbl::OrdMap<(u32, u64), u64> {
    let mut order = imbl::OrdMap::new();
    let mut handle = 1u64;
    let mut cid = 0u32;
    for (ti, t) in rs.tables.iter().enumerate() {
        for ci in 0..t.chains.len() {
            let n = counts.get(ti).and_then(|t| t.get(ci)).copied().unwrap_or(0);
            for k in 0..n {
                order.insert((cid, (k as u64 + 1).saturating_mul(GAP)), handle);
                handle += 1;
            }
            cid += 1;
        }
    }
    order
}

/// Moves the lowered rules into a persistent [`Store`]: handle `h` is the
/// `h`-th AST rule in table, chain, rule order (the order the lowerer
/// numbered them in). The store's `order` is left empty: the caller sets
/// it to [`load_order`]`(rs, counts)`.
fn build_store(rs: &Ruleset, counts: &RuleCounts, lowered: &mut Lowered) -> (Store, Meta) {
    let mut store = Store::default();
    let mut chain_ids = std::collections::HashMap::new();
    let infos: Vec<Arc<RuleInfo>> = std::mem::take(&mut lowered.rules);
    let mut info_vec = imbl::Vector::new();
    for i in &infos {
        info_vec.push_back(Some(Arc::clone(i)));
    }
    store.infos = info_vec;
    let mut sources = std::mem::take(&mut lowered.sources).into_iter();
    let mut handle = 1u64;
    let mut cid = 0u32;
    for (ti, t) in rs.tables.iter().enumerate() {
        for (ci, c) in t.chains.iter().enumerate() {
            chain_ids.insert((ti, c.name.clone()), ChainId(cid));
            let ir_rules = lowered
                .program
                .chains
                .get_mut(cid as usize)
                .map(|c| std::mem::take(&mut c.rules))
                .unwrap_or_default();
            let mut irs = ir_rules.into_iter();
            let n = counts.get(ti).and_then(|t| t.get(ci)).copied().unwrap_or(0);
            for (k, src) in sources.by_ref().take(n).enumerate() {
                // The run of IR rules of this handle, moved out with exact
                // capacity (a rule set holds many; growth slack adds up).
                let n = irs
                    .as_slice()
                    .iter()
                    .take_while(|x| infos.get(x.id.0 as usize).map(|i| i.handle) == Some(handle))
                    .count();
                // Without their matches: the classifier has them now.
                let mine = without_matches(irs.by_ref().take(n).collect());
                store.put_loaded(
                    handle,
                    Entry {
                        table: ti as u32,
                        chain: ChainId(cid),
                        pos: (k as u64 + 1).saturating_mul(GAP),
                        rules: mine,
                        ast: src.packed,
                        uses: src.uses.into_boxed_slice(),
                    },
                );
                handle += 1;
            }
            cid += 1;
        }
    }
    store.next_handle = handle;
    let kinds = lowered
        .program
        .chains
        .iter()
        .map(|c| (c.name.clone(), c.kind))
        .collect();
    let meta = Meta {
        chains: std::mem::take(&mut lowered.chains),
        kinds,
        bases: std::mem::take(&mut lowered.bases),
        chain_ids,
    };
    (store, meta)
}

pub(crate) fn hook_index(h: ast::Hook) -> usize {
    match h {
        ast::Hook::Prerouting => 0,
        ast::Hook::Input => 1,
        ast::Hook::Forward => 2,
        ast::Hook::Output => 3,
        ast::Hook::Postrouting => 4,
    }
}

/// The ruleset hook of an engine hook.
pub fn ast_hook(h: Hook) -> ast::Hook {
    match h {
        Hook::Prerouting => ast::Hook::Prerouting,
        Hook::Input => ast::Hook::Input,
        Hook::Forward => ast::Hook::Forward,
        Hook::Output => ast::Hook::Output,
        Hook::Postrouting => ast::Hook::Postrouting,
    }
}

fn family_sees(table: Family, pkt: IrFamily) -> bool {
    match table {
        Family::Inet => true,
        Family::Ip => pkt == IrFamily::V4,
        Family::Ip6 => pkt == IrFamily::V6,
    }
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::new());
}

impl CompiledPolicy {
    /// Lowers and compiles `rs`. `ifaces` resolves `iif`/`oif` names at
    /// compile time and engine interface indexes to names at run time.
    /// Reports every construct that cannot be lowered, each with its location.
    pub fn compile(rs: &Ruleset, ifaces: &Interfaces) -> Result<Self, CompileError> {
        Self::compile_owned(rs.clone(), ifaces)
    }

    /// [`Self::compile`] taking the rule set by value: its rules move into
    /// the policy instead of being copied (what the daemon does on load).
    pub fn compile_owned(mut rs: Ruleset, ifaces: &Interfaces) -> Result<Self, CompileError> {
        let mut rules = take_rules(&mut rs);
        let rs = rs;
        // The lowerer keeps every rule packed and frees the AST rules as it
        // goes (so that what follows reuses their memory instead of
        // touching fresh pages); their emptied lists go now.
        let (mut lowered, mut errors) = Lowerer::new(&rs, ifaces).run(&mut rules);
        let counts: RuleCounts = rules
            .iter()
            .map(|t| t.iter().map(Vec::len).collect())
            .collect();
        drop(rules);
        if !errors.is_empty() {
            errors.sort_by(|a, b| (&a.file, a.line, a.col).cmp(&(&b.file, b.line, b.col)));
            return Err(CompileError { errors });
        }
        let classifier = Classifier::compile(&lowered.program);
        let classifier = classifier.map_err(|e| {
            let span = match e {
                sluice_classify::UpdateError::BadTarget(id)
                | sluice_classify::UpdateError::Loop(id)
                | sluice_classify::UpdateError::DuplicateRule(id)
                | sluice_classify::UpdateError::UnknownRule(id) => lowered
                    .rules
                    .get(id.0 as usize)
                    .map(|r| r.span)
                    .unwrap_or_default(),
                sluice_classify::UpdateError::UnknownChain(_) => Default::default(),
            };
            CompileError {
                errors: vec![LowerError::new(&rs, span, e.to_string())],
            }
        })?;
        let mut has_nat = [false; 5];
        for b in lowered.bases.iter().filter(|b| b.nat) {
            let any = reachable(&lowered.program, b.chain).into_iter().any(|c| {
                lowered.program.chains.get(c.0 as usize).is_some_and(|c| {
                    c.rules
                        .iter()
                        .any(|r| matches!(r.verdict, Some(sluice_classify::Verdict::Nat(_))))
                })
            });
            if let Some(h) = has_nat.get_mut(hook_index(b.hook)) {
                *h |= any;
            }
        }
        let routing_facts = lowered
            .program
            .chains
            .iter()
            .flat_map(|c| &c.rules)
            .any(reads_routing_facts)
            || set_ops_read_routing_facts(&lowered.set_ops);
        let nat_config = NatConfig {
            pools: lowered.pools.clone(),
            ..NatConfig::default()
        };
        // The store's order map needs only the rule counts: on a large
        // rule set it is built on another thread while this one builds the
        // rest of the store (the other core is idle then; the lowering and
        // the classifier keep both busy).
        let parallel = counts.iter().flatten().sum::<usize>() >= PAR_ORDER_MIN
            && std::thread::available_parallelism().is_ok_and(|t| t.get() > 1);
        let (store, meta) = std::thread::scope(|scope| {
            let later = parallel.then(|| scope.spawn(|| load_order(&rs, &counts)));
            let (mut store, meta) = build_store(&rs, &counts, &mut lowered);
            store.order = match later {
                Some(h) => h.join().unwrap_or_else(|e| std::panic::resume_unwind(e)),
                None => load_order(&rs, &counts),
            };
            debug_assert_eq!(store.order.len() as u64, store.next_handle - 1);
            (store, meta)
        });
        let skeleton = rs;
        Ok(CompiledPolicy {
            meta: Arc::new(meta),
            tables: Arc::new(Tables {
                nat: lowered.nat,
                pools: lowered.pools,
                logs: lowered.logs,
                limits: lowered.limits,
                sets: lowered.sets,
                set_ops: lowered.set_ops,
                quotas: lowered.quotas,
                numgens: lowered.numgens,
                ct_counts: lowered.ct_counts,
                objects: lowered.objects,
                ct_timeouts: lowered.ct_timeouts,
            }),
            store,
            program: OnceLock::new(),
            classifier,
            ifaces: Arc::new(ifaces.clone()),
            nat_config: Arc::new(nat_config),
            has_nat,
            routing_facts,
            flowtable_gen: if skeleton.tables.iter().any(|t| !t.flowtables.is_empty()) {
                FLOWTABLE_GEN.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            } else {
                0
            },
            skeleton: Arc::new(skeleton),
            seq: 0,
            counters: crate::counters::RuleCounters::default(),
            limiters: Arc::default(),
            log_budget: Arc::default(),
        }
        .with_counters())
    }

    /// A `log` statement's line for `pkt` (netfilter's `nf_log` fields),
    /// at most [`crate::limits::LOG_PER_SEC`] a second per policy (shared by the workers
    /// and by the generations derived from it); the rest are counted in
    /// `logs_suppressed`.
    #[cold]
    fn log(&self, spec: u32, pkt: &PolicyPacket) {
        use sluice_classify::Limits;
        if !self.log_budget.matches(0, pkt.now_ms, 0) {
            self.log_budget
                .suppressed
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            return;
        }
        let prefix = self
            .tables
            .logs
            .get(spec as usize)
            .and_then(|l| l.prefix.as_deref())
            .unwrap_or("");
        let name = |i: u32| self.ifaces.name(i).unwrap_or("").to_string();
        let addr = |a: u128| -> std::net::IpAddr {
            if pkt.family == 4 {
                std::net::Ipv4Addr::from(a as u32).into()
            } else {
                std::net::Ipv6Addr::from(a).into()
            }
        };
        tracing::info!(
            target: "sluice::log",
            "{prefix}IN={} OUT={} SRC={} DST={} LEN={} TOS={:#04x} TTL={} PROTO={} SPT={} DPT={} MARK={:#x}",
            name(u32::from(pkt.iif)),
            pkt.oif.map(|o| name(u32::from(o))).unwrap_or_default(),
            addr(pkt.src),
            addr(pkt.dst),
            pkt.len,
            pkt.tos,
            pkt.ttl,
            pkt.proto,
            pkt.sport,
            pkt.dport,
            pkt.mark,
        );
    }

    /// Cells for every rule, seeded from the rules' `counter packets N
    /// bytes M` values.
    fn with_counters(mut self) -> Self {
        let mut l = crate::limits::Limiters::default();
        l.extend_to(&self.tables.limits);
        l.extend_sets(&self.tables.sets, &self.tables.set_ops);
        l.extend_quotas(&self.tables.quotas);
        l.extend_numgens(&self.tables.numgens);
        l.extend_ct_counts(&self.tables.ct_counts);
        l.extend_objects(&self.tables.objects);
        self.limiters = Arc::new(l);
        self.counters.ensure(self.store.infos.len() as u64);
        // Every rule, in handle order (seeding does not depend on the
        // order; a walk of the entries instead of one lookup per handle).
        for e in self.store.handles.entries() {
            self.seed_entry(e);
        }
        self
    }

    /// The lowered program (what the linear evaluator walks).
    ///
    /// Materialised on first use, so updates do not pay for it: the rule
    /// store keeps each rule's IR rules without their matches, which are
    /// lowered again from the packed rule (the same AST, rule set and
    /// interfaces, so the same matches).
    pub fn program(&self) -> &Program {
        self.program.get_or_init(|| {
            let mut low = self.relowerer();
            let mut p = Program::default();
            for (ci, (name, kind)) in self.meta.kinds.iter().enumerate() {
                let mut rules = Vec::new();
                for h in self.store.chain_handles(ChainId(ci as u32)) {
                    if let Some(e) = self.store.entry(h) {
                        rules.extend(Self::with_matches(&mut low, e));
                    }
                }
                p.chains.push(sluice_classify::ir::Chain {
                    name: name.clone(),
                    kind: *kind,
                    rules,
                });
            }
            Arc::new(p)
        })
    }

    /// A lowerer for [`Self::with_matches`].
    fn relowerer(&self) -> Lowerer<'_> {
        Lowerer::incremental(
            &self.skeleton,
            &self.ifaces,
            0,
            1,
            &self.tables,
            crate::lower::RuleLocation::Label("program".into()),
        )
    }

    /// The IR rules of entry `e` with their matches, lowered again.
    fn with_matches(low: &mut Lowerer<'_>, e: &Entry) -> Vec<sluice_classify::ir::Rule> {
        let fresh = e
            .ast
            .unpack()
            .and_then(|r| low.lower_one(e.table as usize, e.chain, &r).ok())
            .unwrap_or_default();
        debug_assert_eq!(fresh.len(), e.rules.len());
        // Never expected (a test pins that the re-lowered program is the
        // loaded one); should it happen, the rules must not turn into
        // match-all rules: they match nothing, and the error says why.
        let consistent = fresh.len() == e.rules.len();
        if !consistent {
            tracing::error!(
                handle = e.rules.first().map(|r| r.id.0),
                "re-lowering a rule for the linear program gave {} IR rules, the store has {}; \
                 they match nothing in the program",
                fresh.len(),
                e.rules.len()
            );
        }
        let never = || {
            vec![sluice_classify::ir::Match::In {
                field: sluice_classify::ir::Field::Family,
                set: sluice_classify::ir::ValueSet::new([]),
                negate: false,
            }]
        };
        let mut fresh = fresh.into_iter();
        e.rules
            .iter()
            .map(|s| sluice_classify::ir::Rule {
                id: s.id,
                matches: match fresh.next() {
                    Some(f) if consistent => f.matches,
                    _ => never(),
                },
                stmts: s.stmts.clone(),
                verdict: s.verdict,
            })
            .collect()
    }

    /// The `ct timeout` object of the rule set whose policy is in slot
    /// `slot` ([`sluice_engine::ct_timeout`]), as `"FAMILY TABLE NAME"`
    /// (the first, if objects of several tables have the same timers);
    /// `None` if no object of this rule set has it (a connection made
    /// under an earlier rule set).
    pub fn ct_timeout_name(&self, slot: u8) -> Option<String> {
        self.skeleton.tables.iter().find_map(|t| {
            t.ct_timeouts
                .iter()
                .find(|c| {
                    sluice_engine::ct_timeout::find(&crate::lower::ct_timeout_spec(c)) == Some(slot)
                })
                .map(|c| format!("{} {} {}", t.family.name(), t.name, c.name))
        })
    }

    /// `log` lines not written because of the rate budget
    /// ([`crate::limits::LOG_PER_SEC`]) since this rule set was loaded.
    pub fn logs_suppressed(&self) -> u64 {
        self.log_budget
            .suppressed
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Number of IR rules (a verdict map counts one per element).
    pub fn rule_count(&self) -> usize {
        self.store.ir_rules
    }

    /// Number of AST rules (what `nft list ruleset` shows).
    pub fn ast_rule_count(&self) -> usize {
        self.store.handles.len()
    }

    /// The compiled classifier.
    pub fn classifier(&self) -> &Classifier {
        &self.classifier
    }

    /// NAT configuration with the pools the rules need (behaviour switches
    /// at their defaults; the daemon overrides them from its own config).
    pub fn nat_config(&self) -> &NatConfig {
        &self.nat_config
    }

    /// The port ranges of its `masquerade to :LO-HI` rules, each once, in
    /// rule order: a gateway runs the rule set only if its `[nat]
    /// masquerade_ports` lie within every one.
    pub fn masquerade_port_ranges(&self) -> Vec<(u16, u16)> {
        let mut out: Vec<(u16, u16)> = Vec::new();
        for r in self.tables.nat.iter().filter_map(|a| a.masq_ports) {
            if !out.contains(&r) {
                out.push(r);
            }
        }
        out
    }

    /// NAT actions, indexed by the id in `Verdict::Nat(id)`.
    pub fn nat_actions(&self) -> &[NatAction] {
        &self.tables.nat
    }

    /// The AST origin of an IR rule.
    pub fn rule_info(&self, id: RuleId) -> Option<&RuleInfo> {
        self.store
            .infos
            .get(id.0 as usize)
            .and_then(|i| i.as_deref())
    }

    /// A chain's name and registration.
    pub fn chain_info(&self, id: ChainId) -> Option<&ChainInfo> {
        self.meta.chains.get(id.0 as usize)
    }

    /// Base chains of `hook`, in evaluation order.
    pub fn base_chains(&self, hook: ast::Hook) -> impl Iterator<Item = &BaseInfo> {
        self.meta.bases.iter().filter(move |b| b.hook == hook)
    }

    /// Whether every filter chain a forwarded packet meets (prerouting,
    /// forward, postrouting; any family) accepts every packet of an
    /// established connection before anything else can happen to it: the
    /// chain's first rule tests nothing but `ct state` (a set that includes
    /// established), has no statement other than `counter`, and accepts; or
    /// the chain has no rules and policy accept. Then the engine may forward
    /// established packets on their connection state alone and still give
    /// netfilter's verdict for every packet (rule counters of that first
    /// rule are the one difference: they count only what reaches the
    /// policy). Otherwise the engine runs the filter chains per packet.
    pub fn established_accepted(&self) -> bool {
        let est = PacketFields {
            ct_state: ct::ESTABLISHED,
            ..PacketFields::default()
        };
        self.meta
            .bases
            .iter()
            .filter(|b| {
                // (The chains before conntrack run for every packet anyway:
                // `Policy::has_raw`.)
                !b.nat
                    && !b.before_conntrack()
                    && matches!(
                        b.hook,
                        ast::Hook::Prerouting | ast::Hook::Forward | ast::Hook::Postrouting
                    )
            })
            .all(|b| {
                let first = self
                    .store
                    .chain_handles(b.chain)
                    .filter_map(|h| self.store.entry(h))
                    .find(|e| !e.rules.is_empty());
                match first {
                    None => matches!(
                        self.meta.kinds.get(b.chain.0 as usize),
                        Some((
                            _,
                            sluice_classify::ChainKind::Base(sluice_classify::ir::Policy::Accept)
                        ))
                    ),
                    Some(e) => {
                        // The store keeps no matches: only a rule that can
                        // pass (it accepts, counts at most, and its AST
                        // matches only `ct state`) is lowered again to test
                        // them. This runs on every publish, so the usual
                        // first rule costs an unpack only.
                        let plausible = e.rules.first().is_some_and(|r| {
                            r.verdict == Some(sluice_classify::ir::Verdict::Accept)
                                && r.stmts
                                    .iter()
                                    .all(|s| matches!(s, sluice_classify::ir::Stmt::Counter))
                        }) && e.ast.unpack().is_some_and(|a| {
                            a.matches
                                .iter()
                                .all(|m| m.left.iter().all(|f| *f == ast::Field::CtState))
                        });
                        if !plausible {
                            return false;
                        }
                        let relowered = Self::with_matches(&mut self.relowerer(), e);
                        let Some(r) = relowered.first() else {
                            return false;
                        };
                        r.verdict == Some(sluice_classify::ir::Verdict::Accept)
                            && r.stmts
                                .iter()
                                .all(|s| matches!(s, sluice_classify::ir::Stmt::Counter))
                            && r.matches.iter().all(|m| {
                                let on_ct_state = match m {
                                    sluice_classify::ir::Match::In { field, .. }
                                    | sluice_classify::ir::Match::Masked { field, .. } => {
                                        *field == sluice_classify::ir::Field::CtState
                                    }
                                    sluice_classify::ir::Match::Concat { .. } => false,
                                };
                                on_ct_state && m.matches(&est)
                            })
                    }
                }
            })
    }

    /// The interface map the policy was compiled with.
    pub fn interfaces(&self) -> &Interfaces {
        &self.ifaces
    }

    /// `log` statement specs, indexed by `Stmt::Log(id)`.
    pub fn logs(&self) -> &[ast::Log] {
        &self.tables.logs
    }

    /// Starts the timers of the elements its dynamic sets are declared
    /// with (`expires`, an element's or the set's `timeout`) at `now_ms`,
    /// the workers' clock: a gateway calls it when it publishes a new rule
    /// set, so they count from then, as the kernel counts them from the
    /// load. Once per set; a set not started starts at its first use.
    pub fn start_timers(&self, now_ms: u64) {
        self.limiters.start_timers(now_ms);
    }

    /// The live elements of dynamic set `name` (`"FAMILY TABLE SET"`, as
    /// [`Self::dynamic_sets`] lists them) at `now_ms` (the workers' clock),
    /// sorted by key; `None` for a set no rule uses.
    pub fn dynamic_set_elements(
        &self,
        name: &str,
        now_ms: u64,
    ) -> Option<Vec<crate::dynset::ListedElem>> {
        let i = self.tables.sets.iter().position(|s| s.name == name)?;
        let key_len = self.tables.sets.get(i)?.key_types.len();
        self.limiters.set_elements(i, key_len, now_ms)
    }

    /// The named objects with their live values, in declaration order;
    /// only those whose kind is `kind` (if given) and whose name is `name`
    /// or ends with `" NAME"` (if given).
    pub fn objects(&self, kind: Option<ast::ObjKind>, name: Option<&str>) -> Vec<ListedObject> {
        self.tables
            .objects
            .iter()
            .enumerate()
            .filter(|(_, o)| !o.name.is_empty() && kind.is_none_or(|k| o.kind() == k))
            .filter(|(_, o)| name.is_none_or(|n| object_named(&o.name, n)))
            .map(|(i, o)| {
                let (packets, bytes) = self.limiters.object(i).map_or((0, 0), |l| l.values());
                ListedObject {
                    name: o.name.clone(),
                    state: match o.state {
                        ast::ObjState::Counter { .. } => ast::ObjState::Counter { packets, bytes },
                        ast::ObjState::Quota(q) => ast::ObjState::Quota(ast::Quota {
                            used: Some((bytes, ast::ByteUnit::Bytes)),
                            ..q
                        }),
                        ast::ObjState::Limit(l) => ast::ObjState::Limit(l),
                    },
                }
            })
            .collect()
    }

    /// Sets the selected named objects (as [`Self::objects`] selects them)
    /// back to zero, as `nft reset counter` / `nft reset quota` do, and
    /// returns their values before.
    pub fn reset_objects(
        &self,
        kind: Option<ast::ObjKind>,
        name: Option<&str>,
    ) -> Vec<ListedObject> {
        let before = self.objects(kind, name);
        for (i, o) in self.tables.objects.iter().enumerate() {
            if !o.name.is_empty()
                && kind.is_none_or(|k| o.kind() == k)
                && name.is_none_or(|n| object_named(&o.name, n))
            {
                if let Some(l) = self.limiters.object(i) {
                    l.reset();
                }
            }
        }
        before
    }

    /// A dynamic set's key as nft writes it (`192.0.2.1 . 22`).
    pub fn format_set_key(&self, set: &str, key: &[u128]) -> String {
        let types = self
            .tables
            .sets
            .iter()
            .find(|s| s.name == set)
            .map(|s| s.key_types.as_slice())
            .unwrap_or(&[]);
        key.iter()
            .enumerate()
            .map(|(i, v)| match types.get(i) {
                Some(ast::DataType::Ipv4Addr) => std::net::Ipv4Addr::from(*v as u32).to_string(),
                Some(ast::DataType::Ipv6Addr) => std::net::Ipv6Addr::from(*v).to_string(),
                Some(ast::DataType::Ifname) => {
                    let b = v.to_be_bytes();
                    let end = b.iter().position(|c| *c == 0).unwrap_or(b.len());
                    format!("\"{}\"", String::from_utf8_lossy(&b[..end]))
                }
                _ => v.to_string(),
            })
            .collect::<Vec<_>>()
            .join(" . ")
    }

    /// The dynamic sets rules use (`"FAMILY TABLE SET"`), in id order.
    pub fn dynamic_sets(&self) -> impl Iterator<Item = &str> {
        self.tables.sets.iter().map(|s| s.name.as_str())
    }

    /// `limit` specs, indexed by `Stmt::Limit(id)`.
    pub fn limits(&self) -> &[ast::Limit] {
        &self.tables.limits
    }

    /// Evaluates one base chain.
    pub fn eval_chain(
        &self,
        ev: Evaluator,
        chain: ChainId,
        p: &PacketFields,
        s: &mut Scratch,
    ) -> Outcome {
        match ev {
            Evaluator::Compiled => self.classifier.eval(chain, p, s),
            Evaluator::Linear => eval_linear(self.program(), chain, p, s),
        }
    }

    /// Runs every base chain of `hook` in priority order with netfilter's
    /// semantics: accept continues with the next base chain, drop and reject
    /// are final; `type nat` chains run only for `ct state new`, and once
    /// one of them translates, the other NAT chains of the hook are skipped.
    /// The mark carries from chain to chain. `visit` sees each chain's
    /// outcome and matched rules.
    #[allow(clippy::too_many_arguments)]
    pub fn run_hook(
        &self,
        hook: ast::Hook,
        stage: Stage,
        pkt: &PacketFields,
        ev: Evaluator,
        s: &mut Scratch,
        mut visit: impl FnMut(&BaseInfo, &Outcome, &[RuleId], &[(RuleId, u8)]),
    ) -> HookOutcome {
        let mut p = *pkt;
        let mut res = HookOutcome {
            verdict: HookVerdict::Accept,
            rule: None,
            nat: None,
            mark: p.mark,
            ct_mark: p.ct_mark,
            ct_state: p.ct_state,
        };
        for b in self.base_chains(hook).filter(|b| stage.runs(b)) {
            // (An untracked packet is not new: NAT chains never see it.)
            let ct_new = p.ct_state & ct::NEW != 0;
            if !family_sees(b.family, p.family) || (b.nat && (!ct_new || res.nat.is_some())) {
                continue;
            }
            let o = self.eval_chain(ev, b.chain, &p, s);
            visit(b, &o, &s.trace, &s.counted);
            p.mark = o.mark;
            p.ct_mark = o.ct_mark;
            p.ct_state = o.ct_state;
            res.mark = o.mark;
            res.ct_mark = o.ct_mark;
            res.ct_state = o.ct_state;
            match o.verdict {
                Final::Accept => res.rule = o.rule,
                Final::Nat(id) => {
                    if let Some(r) = o.rule {
                        res.nat = Some((id, r));
                    }
                }
                Final::Drop => {
                    res.verdict = HookVerdict::Drop;
                    res.rule = o.rule;
                    return res;
                }
                Final::Reject(_) => {
                    let with = o
                        .rule
                        .and_then(|r| self.rule_info(r))
                        .and_then(|i| i.reject)
                        .flatten();
                    res.verdict = HookVerdict::Reject(with);
                    res.rule = o.rule;
                    return res;
                }
                Final::Error(e) => {
                    res.verdict = HookVerdict::Error(e);
                    res.rule = o.rule;
                    return res;
                }
            }
        }
        res
    }

    /// [`Policy::decide`] for the chains of `stage`, with the `ct state`
    /// afterwards.
    fn decide_stage(&self, hook: Hook, stage: Stage, pkt: &PolicyPacket) -> (Decision, u8) {
        let p = self.packet_fields(pkt);
        let bytes = u64::from(pkt.len);
        let mut mss = sluice_engine::MssClamp::default();
        let mut flow_add = false;
        let mut ct_timeout = 0u8;
        let mut run = |s: &mut Scratch| {
            s.limit = (!self.limiters.is_empty()).then(|| sluice_classify::LimitCtx {
                limits: Arc::clone(&self.limiters) as Arc<dyn sluice_classify::Limits>,
                now_ms: pkt.now_ms,
                len: u32::from(pkt.len),
            });
            let o = self.run_hook(
                ast_hook(hook),
                stage,
                &p,
                Evaluator::Compiled,
                s,
                |_, _, matched, counted| {
                    // Rules stopped by a statement after their `counter`
                    // or `log` ran: counted and logged, as the kernel
                    // does.
                    for (id, reached) in counted {
                        if reached & sluice_classify::REACHED_COUNTER != 0 {
                            self.counters.add(*id, bytes);
                        }
                        if reached & sluice_classify::REACHED_LOG != 0 {
                            if let Some(l) = self.counters.log_of(*id) {
                                self.log(l, pkt);
                            }
                        }
                    }
                    for id in matched {
                        if let Some(l) = self.counters.add_and_log(*id, bytes) {
                            self.log(l, pkt);
                        }
                        // The same cell, just read: the rule's MSS,
                        // flowtable and timeout policy statements.
                        let fx = self.counters.effects(*id);
                        if let Some(m) = fx.mss {
                            mss = mss.and(mss_clamp(m));
                        }
                        flow_add |= fx.flow_add;
                        let slot = fx.ct_timeout(pkt.proto);
                        if slot != 0 {
                            ct_timeout = slot;
                        }
                    }
                },
            );
            s.limit = None;
            o
        };
        let o = SCRATCH.with(|cell| match cell.try_borrow_mut() {
            Ok(mut s) => run(&mut s),
            Err(_) => run(&mut Scratch::new()),
        });
        let verdict = match o.verdict {
            HookVerdict::Accept => Verdict::Accept,
            HookVerdict::Drop | HookVerdict::Error(_) => Verdict::Drop,
            HookVerdict::Reject(w) => Verdict::Reject(engine_reject(w)),
        };
        let nat: Option<Translation> = o
            .nat
            .and_then(|(id, _)| self.tables.nat.get(id as usize))
            .map(|a| {
                a.translation_for(
                    std::net::Ipv4Addr::from(pkt.src as u32),
                    std::net::Ipv4Addr::from(pkt.dst as u32),
                    pkt.dport,
                )
            });
        (
            Decision {
                verdict,
                mark: o.mark,
                ct_mark: o.ct_mark,
                nat,
                mss,
                flow_add,
                ct_timeout,
            },
            o.ct_state,
        )
    }

    /// The classifier's view of an engine packet.
    pub fn packet_fields(&self, pkt: &PolicyPacket) -> PacketFields {
        let v6 = pkt.family == 6;
        let (saddr, daddr) = if v6 {
            (pkt.src, pkt.dst)
        } else {
            (
                sluice_classify::map_v4(pkt.src as u32),
                sluice_classify::map_v4(pkt.dst as u32),
            )
        };
        let ported = matches!(pkt.proto, 6 | 17 | 33 | 132 | 136);
        let oif = pkt.oif.map_or(0, u32::from);
        let tuple = |c: &sluice_engine::ConnTuple| {
            let a = |x: u128| {
                if c.family == 6 {
                    x
                } else {
                    sluice_classify::map_v4(x as u32)
                }
            };
            sluice_classify::ir::CtTuple {
                saddr: a(c.src),
                daddr: a(c.dst),
                sport: c.sport,
                dport: c.dport,
            }
        };
        PacketFields {
            iif: u32::from(pkt.iif),
            oif,
            iifname: self.ifaces.ifname(u32::from(pkt.iif)),
            oifname: if oif == 0 {
                IfName::default()
            } else {
                self.ifaces.ifname(oif)
            },
            family: if v6 { IrFamily::V6 } else { IrFamily::V4 },
            saddr,
            daddr,
            l4proto: pkt.proto,
            sport: if ported { pkt.sport } else { 0 },
            dport: if ported { pkt.dport } else { 0 },
            tcp_flags: if pkt.proto == 6 { pkt.tcp_flags } else { 0 },
            icmp_type: pkt.icmp.0,
            icmp_code: pkt.icmp.1,
            ct_state: ct_bits(pkt.ct),
            ct_mark: pkt.ct_mark,
            mark: pkt.mark,
            ct_status: pkt.ct_status,
            ttl: pkt.ttl,
            // IPv6's length field leaves the 40-byte header out.
            ip_len: if v6 {
                pkt.len.saturating_sub(40)
            } else {
                pkt.len
            },
            dscp: pkt.tos >> 2,
            length: u32::from(pkt.len),
            pkttype: pkt.pkttype,
            daddr_type: pkt.daddr_type,
            saddr_type: pkt.saddr_type,
            ether_saddr: pkt.ether.0,
            ether_daddr: pkt.ether.1,
            ct_dir: pkt.ct_dir,
            rpf_iif: u8::from(pkt.rpf.0),
            rpf_any: u8::from(pkt.rpf.1),
            conn: conn_id(&pkt.conn),
            time_ns: pkt.wall_ms.saturating_mul(1_000_000),
            ct_orig: tuple(&pkt.conn),
            ct_reply: tuple(&pkt.ct_reply),
            frag_off: if pkt.df { 0x4000 } else { 0 },
        }
    }
}

/// The classifier's form of an engine connection (IPv4 addresses mapped).
fn conn_id(c: &sluice_engine::ConnTuple) -> ConnId {
    let addr = |a: u128| {
        if c.family == 6 {
            a
        } else {
            sluice_classify::map_v4(a as u32)
        }
    };
    ConnId {
        saddr: addr(c.src),
        daddr: addr(c.dst),
        sport: c.sport,
        dport: c.dport,
        proto: c.proto,
    }
}

/// `ct state` bit of an engine conntrack state.
pub fn ct_bits(c: CtState) -> u8 {
    match c {
        CtState::New => ct::NEW,
        CtState::Established => ct::ESTABLISHED,
        CtState::Related => ct::RELATED,
        CtState::Invalid => ct::INVALID,
        CtState::Untracked => ct::UNTRACKED,
    }
}

/// The engine's reject of an nft `reject with` (the kernel's
/// `nft_reject_icmp_code` and `nft_reject_icmpv6_code` for `icmpx`).
pub fn engine_reject(w: Option<ast::RejectWith>) -> RejectWith {
    match w {
        Some(ast::RejectWith::TcpReset) => RejectWith::TcpReset,
        // A rule with an ICMP type matches one family only (nft adds the
        // dependency); the other code is never used.
        Some(ast::RejectWith::Icmp(c)) => RejectWith::Unreachable { v4: c, v6: 4 },
        Some(ast::RejectWith::Icmpv6(c)) => RejectWith::Unreachable { v4: 3, v6: c },
        // icmpx: 0 no-route, 1 port-unreachable, 2 host-unreachable, 3
        // admin-prohibited.
        Some(ast::RejectWith::Icmpx(c)) => {
            let (v4, v6) = match c {
                0 => (0, 0),
                2 => (1, 3),
                3 => (13, 1),
                _ => (3, 4),
            };
            RejectWith::Unreachable { v4, v6 }
        }
        // nft's and iptables' default: port unreachable.
        None => RejectWith::Unreachable { v4: 3, v6: 4 },
    }
}

/// `fib daddr|saddr type` and the reverse-path fields: what the engine
/// works out only for a policy that reads them.
pub(crate) fn is_routing_fact(f: sluice_classify::ir::Field) -> bool {
    use sluice_classify::ir::Field as F;
    matches!(f, F::DaddrType | F::SaddrType | F::RpfIif | F::RpfAny)
}

/// Whether a dynamic set's key takes a routing fact.
pub(crate) fn set_ops_read_routing_facts(ops: &[crate::lower::SetOpSpec]) -> bool {
    ops.iter().any(|o| {
        o.key
            .iter()
            .any(|k| matches!(k, crate::lower::KeySrc::Field(f) if is_routing_fact(*f)))
    })
}

/// Whether rule `r` matches on a routing fact.
pub(crate) fn reads_routing_facts(r: &sluice_classify::Rule) -> bool {
    use sluice_classify::ir::Match;
    r.matches.iter().any(|m| match m {
        Match::In { field, .. } | Match::Masked { field, .. } => is_routing_fact(*field),
        Match::Concat { fields, .. } => fields.iter().any(|f| is_routing_fact(*f)),
    })
}

impl Policy for CompiledPolicy {
    fn needs_routing_facts(&self) -> bool {
        self.routing_facts
    }

    fn nat_pools(&self) -> Option<&[sluice_nat::Pool]> {
        Some(&self.nat_config.pools)
    }

    fn counts_connections(&self) -> bool {
        self.limiters.counts_connections()
    }

    fn conn_confirmed(&self, c: &sluice_engine::ConnTuple) {
        self.limiters.conn_counts().confirm(&conn_id(c));
    }

    fn conn_closed(&self, c: &sluice_engine::ConnTuple) {
        self.limiters.conn_counts().close(&conn_id(c));
    }

    fn has_raw(&self) -> bool {
        // (Output chains see the gateway's own packets, which the engine
        // does not run through the rule set.)
        self.meta
            .bases
            .iter()
            .any(|b| b.hook == ast::Hook::Prerouting && b.before_conntrack())
    }

    fn flowtables(&self) -> u64 {
        self.flowtable_gen
    }

    fn raw(&self, pkt: &PolicyPacket) -> RawDecision {
        let mut pkt = *pkt;
        pkt.ct = CtState::Invalid;
        let (decision, ct_state) =
            self.decide_stage(Hook::Prerouting, Stage::BeforeConntrack, &pkt);
        RawDecision {
            decision,
            untracked: ct_state == ct::UNTRACKED,
        }
    }

    fn decide(&self, hook: Hook, pkt: &PolicyPacket) -> Decision {
        self.decide_stage(hook, Stage::AfterConntrack, pkt).0
    }

    fn has_nat(&self, hook: Hook) -> bool {
        self.has_nat
            .get(hook_index(ast_hook(hook)))
            .copied()
            .unwrap_or(false)
    }

    fn established_accepted(&self) -> bool {
        CompiledPolicy::established_accepted(self)
    }
}

/// The engine's form of a `Stmt::TcpMss` value.
fn mss_clamp(m: u32) -> sluice_engine::MssClamp {
    if m == sluice_classify::ir::TCP_MSS_RT_MTU {
        sluice_engine::MssClamp {
            value: None,
            rt_mtu: true,
        }
    } else {
        sluice_engine::MssClamp {
            value: u16::try_from(m).ok(),
            rt_mtu: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::{TracePacket, TraceVerdict};
    use std::net::IpAddr;

    fn compile(text: &str) -> Result<CompiledPolicy, CompileError> {
        let rs = sluice_ruleset::parse_nft_str("t.nft", text)
            .unwrap_or_else(|d| panic!("parse failed:\n{d}"));
        CompiledPolicy::compile(&rs, &Interfaces::from_ruleset(&rs))
    }

    /// A new TCP SYN from 10.0.0.1:1000 to 10.0.0.2:22 on interface 0; the
    /// tests below change what they need.
    fn packet() -> PolicyPacket {
        PolicyPacket {
            iif: 0,
            oif: None,
            family: 4,
            src: 0x0a00_0001,
            dst: 0x0a00_0002,
            proto: 6,
            sport: 1000,
            dport: 22,
            tcp_flags: 2,
            icmp: (0, 0),
            ct: CtState::New,
            ct_mark: 0,
            mark: 0,
            ct_status: 0,
            len: 60,
            ttl: 64,
            df: false,
            tos: 0,
            pkttype: 0,
            daddr_type: 1,
            saddr_type: 1,
            ether: (0, 0),
            ct_dir: 0,
            rpf: (true, true),
            now_ms: 0,
            wall_ms: 0,
            ct_reply: Default::default(),
            conn: sluice_engine::ConnTuple {
                src: 0x0a00_0001,
                dst: 0x0a00_0002,
                sport: 1000,
                dport: 22,
                proto: 6,
                family: 4,
            },
        }
    }

    /// `notrack` before conntrack: the raw stage says untracked, the later
    /// hooks see `ct state untracked`, NAT chains and connection fields
    /// (`ct mark`) do not apply to it, and the chains after conntrack are
    /// not run again by `decide`.
    #[test]
    fn notrack_before_conntrack_makes_the_packet_untracked() {
        let p = compile(
            "table ip raw {\n chain pre {\n  type filter hook prerouting priority raw; policy accept;\n  \
             ip saddr 10.9.9.9 drop\n  ct state invalid meta mark set 7\n  udp dport 53 notrack\n  \
             ct state untracked meta mark set meta mark | 0x100\n }\n}\n\
             table ip filter {\n chain pre2 {\n  type filter hook prerouting priority -150; policy accept;\n  \
             ct state invalid drop\n }\n chain fwd {\n  type filter hook forward priority 0; policy drop;\n  \
             ct mark 0 drop\n  ct state untracked meta mark 0x107 accept\n  ct state new accept\n }\n}\n\
             table ip nat {\n chain post {\n  type nat hook postrouting priority srcnat;\n  masquerade\n }\n}\n",
        )
        .expect("compiles");
        assert!(p.has_raw());
        assert!(
            !compile(
                "table ip t { chain c { type filter hook prerouting priority -200; notrack; } }"
            )
            .expect("compiles")
            .has_raw(),
            "priority -200 is conntrack's own: after it"
        );
        let mut dns = packet();
        dns.proto = 17;
        dns.dport = 53;
        let raw = p.raw(&dns);
        assert!(raw.untracked);
        assert_eq!(raw.decision.verdict, Verdict::Accept);
        // `ct state invalid` matched before conntrack (no connection yet),
        // then `notrack`, then `ct state untracked` in the same chain.
        assert_eq!(raw.decision.mark, 0x107);
        let mut later = dns;
        later.ct = CtState::Untracked;
        later.mark = raw.decision.mark;
        // Prerouting after conntrack: `ct state invalid drop` does not see
        // an untracked packet as invalid.
        assert_eq!(p.decide(Hook::Prerouting, &later).verdict, Verdict::Accept);
        // Forward: `ct mark 0 drop` needs a connection, so it does not
        // match; the untracked rule accepts.
        assert_eq!(p.decide(Hook::Forward, &later).verdict, Verdict::Accept);
        // No masquerade for an untracked packet.
        assert_eq!(p.decide(Hook::Postrouting, &later).nat, None);
        // A tracked packet: not untracked, marked 7 before conntrack, and
        // `ct mark 0 drop` applies to its new connection.
        let web = packet();
        let raw = p.raw(&web);
        assert!(!raw.untracked);
        assert_eq!(raw.decision.mark, 7);
        assert_eq!(p.decide(Hook::Forward, &web).verdict, Verdict::Drop);
        assert!(p.decide(Hook::Postrouting, &web).nat.is_some());
        // The raw stage's drop; `decide(Prerouting)` does not run the raw
        // chain again.
        let mut spoof = packet();
        spoof.src = 0x0a09_0909;
        assert_eq!(p.raw(&spoof).decision.verdict, Verdict::Drop);
        assert_eq!(p.decide(Hook::Prerouting, &spoof).verdict, Verdict::Accept);
        // The trace shows the same.
        let t = p.trace(&pkt(17, "10.0.0.1", 1000, "10.0.0.2", 53));
        assert!(t.untracked, "{t}");
        assert_eq!(t.verdict, TraceVerdict::Accept, "{t}");
        assert!(t.nat.is_none(), "{t}");
        assert_eq!(t.mark, 0x107, "{t}");
        let t = p.trace(&pkt(17, "10.0.0.1", 1000, "10.0.0.2", 54));
        assert!(!t.untracked, "{t}");
        assert_eq!(t.verdict, TraceVerdict::Drop, "ct mark 0 drop: {t}");
    }

    /// An output chain below -200 runs before conntrack too (the trace's
    /// output path); the engine's raw stage is for prerouting only.
    #[test]
    fn notrack_in_an_output_chain_untracks_the_traced_packet() {
        let p = compile(
            "table ip raw {\n chain out {\n  type filter hook output priority raw;\n  \
             udp sport 53 notrack\n }\n}\ntable ip f {\n chain o {\n  \
             type filter hook output priority 0; policy drop;\n  ct state untracked accept\n }\n}\n",
        )
        .expect("compiles");
        assert!(!p.has_raw(), "no prerouting chain before conntrack");
        let mut pk = pkt(17, "10.0.0.1", 53, "10.0.0.9", 5000);
        pk.hook = ast::Hook::Output;
        let t = p.trace(&pk);
        assert!(t.untracked, "{t}");
        assert_eq!(t.verdict, TraceVerdict::Accept, "{t}");
        pk.sport = 54;
        let t = p.trace(&pk);
        assert!(!t.untracked, "{t}");
        assert_eq!(t.verdict, TraceVerdict::Drop, "{t}");
    }

    /// `flow add @ft`: the forward decision of a matching packet says so;
    /// the flowtables' generation is new with every compilation and kept
    /// by incremental updates.
    #[test]
    fn flow_add_is_reported_and_the_flowtables_generation_survives_updates() {
        let text =
            "table inet f {\n flowtable ft { hook ingress priority 0; devices = { eth0 }; }\n \
                    chain fwd {\n  type filter hook forward priority 0; policy accept;\n  \
                    meta l4proto { tcp, udp } flow add @ft\n  ct state established accept\n }\n}\n";
        let p = compile(text).expect("compiles");
        let mut est = packet();
        est.ct = CtState::Established;
        assert!(p.decide(Hook::Forward, &est).flow_add);
        let mut icmp = est;
        icmp.proto = 1;
        assert!(!p.decide(Hook::Forward, &icmp).flow_add);
        assert!(!p.decide(Hook::Prerouting, &est).flow_add);
        let gen = p.flowtables();
        assert_ne!(gen, 0);
        assert_ne!(compile(text).expect("compiles").flowtables(), gen);
        let q = p
            .apply_text("cmd", "add rule inet f fwd udp dport 9 drop")
            .expect("applies");
        assert_eq!(q.0.flowtables(), gen);
        assert_eq!(
            pol("table ip t { chain c { type filter hook forward priority 0; } }").flowtables(),
            0
        );
    }

    fn pol(text: &str) -> CompiledPolicy {
        compile(text).unwrap_or_else(|e| panic!("compile failed:\n{e}"))
    }

    /// The store keeps no matches; the linear program lowers them again
    /// from the packed rules and must be the program the load lowered
    /// (sets, maps, verdict maps, NAT, interfaces, concatenations).
    #[test]
    fn program_relowers_the_loaded_matches() {
        let text = "table inet f {\n\
             set s { type ipv4_addr; flags interval; elements = { 10.0.0.0/8, 192.0.2.1 } }\n\
             map m { type inet_service : verdict; elements = { 22 : accept, 23 : jump o } }\n\
             chain o { ip daddr . tcp dport { 10.0.0.1 . 80, 10.0.0.2 . 443 } counter accept }\n\
             chain fwd { type filter hook forward priority 0; policy drop;\n\
               ct state established,related accept\n\
               iifname \"lan*\" ip saddr @s tcp dport vmap @m\n\
               meta mark set 3 udp dport vmap { 53 : accept, 54 : drop }\n\
               tcp flags & (syn | ack) == syn ip6 saddr fe80::/10 log prefix \"x\" drop\n\
               ip saddr != 10.1.0.0/16 tcp dport 1000-2000 limit rate 5/second jump o\n\
             }\n\
             }\n\
             table ip nat { chain pre { type nat hook prerouting priority -100;\n\
               tcp dport 8080 dnat to 10.0.0.2:80\n\
               dnat to ip daddr map { 192.0.2.1 : 10.0.0.3 } } }\n";
        let rs = sluice_ruleset::parse_nft_str("t.nft", text).unwrap_or_else(|d| panic!("{d}"));
        let ifaces = Interfaces::from_ruleset(&rs);
        let mut decls = rs.clone();
        let mut rules = take_rules(&mut decls);
        let (lowered, errors) = Lowerer::new(&decls, &ifaces).run(&mut rules);
        assert!(errors.is_empty(), "{errors:?}");
        let p = CompiledPolicy::compile(&rs, &ifaces).unwrap_or_else(|e| panic!("{e}"));
        // Compared printed, without a concatenated set's hash set (printed
        // in no fixed order; its elements are printed in order too).
        let stable = |d: String| {
            let mut out = String::new();
            let mut rest = d.as_str();
            while let Some(i) = rest.find("exact: {") {
                out.push_str(&rest[..i]);
                rest = &rest[i..];
                let end = rest.find('}').map_or(rest.len(), |e| e + 1);
                rest = &rest[end..];
            }
            out + rest
        };
        assert_eq!(
            stable(format!("{:?}", p.program())),
            stable(format!("{:?}", lowered.program))
        );
        assert!(
            p.program()
                .chains
                .iter()
                .map(|c| c.rules.len())
                .sum::<usize>()
                >= 11
        );
    }

    #[test]
    fn established_accepted_only_when_every_filter_chain_accepts_them_first() {
        let f = |body: &str, policy: &str| {
            format!(
                "table inet f {{ chain fwd {{ type filter hook forward priority 0; policy {policy};\n{body} }} }}"
            )
        };
        let yes = [
            f(
                "ct state established,related accept\ntcp dport 22 accept",
                "drop",
            ),
            f("ct state { established, related } counter accept", "drop"),
            f("ct state established accept", "drop"),
            f("ct state != new accept", "drop"),
            f("", "accept"),
        ];
        for t in &yes {
            assert!(pol(t).established_accepted(), "should hold for {t}");
        }
        let no = [
            // Established packets reach the port rules and the policy.
            f("ct state new tcp dport 22 accept", "drop"),
            f("tcp dport 22 accept\nct state established accept", "drop"),
            // More than ct state, or a mark change, or not accept.
            f("ct state established ip saddr 10.0.0.0/8 accept", "drop"),
            f("ct state established meta mark set 1 accept", "drop"),
            f("ct state established drop", "accept"),
            f("ct state new accept", "accept"),
            f("", "drop"),
        ];
        for t in &no {
            assert!(!pol(t).established_accepted(), "should not hold for {t}");
        }
        // Every filter chain of every forwarding hook must qualify; NAT
        // chains and the input hook do not count.
        let both = "table ip a { chain fwd { type filter hook forward priority 0; policy drop;\n\
                    ct state established accept }\n\
                    chain post { type filter hook postrouting priority 0; policy accept;\n\
                    oifname \"eth9\" drop } }";
        assert!(!pol(both).established_accepted());
        let nat = "table ip a { chain fwd { type filter hook forward priority 0; policy drop;\n\
                   ct state established accept }\n\
                   chain post { type nat hook postrouting priority 100;\n\
                   oifname \"eth9\" masquerade }\n\
                   chain inp { type filter hook input priority 0; policy drop; } }";
        assert!(pol(nat).established_accepted());
        // An update can change the answer.
        let p = pol(&f("ct state established accept", "drop"));
        let (q, _) = p
            .apply_text("cmd", "insert rule inet f fwd tcp dport 23 drop")
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(p.established_accepted());
        assert!(!q.established_accepted());
    }

    fn pkt(proto: u8, src: &str, sport: u16, dst: &str, dport: u16) -> TracePacket {
        TracePacket {
            proto,
            src: src.parse::<IpAddr>().ok(),
            dst: dst.parse::<IpAddr>().ok(),
            sport,
            dport,
            ..TracePacket::default()
        }
    }

    fn fwd(body: &str) -> CompiledPolicy {
        pol(&format!(
            "table inet t {{\n chain f {{\n type filter hook forward priority 0; policy drop;\n{body}\n }}\n}}\n"
        ))
    }

    fn verdict(p: &CompiledPolicy, pk: &TracePacket) -> (TraceVerdict, Option<String>) {
        let t = p.trace(pk);
        assert!(t.mismatch.is_none(), "{t}");
        (t.verdict, t.rule)
    }

    #[test]
    fn tcp_port_implies_protocol() {
        let p = fwd("tcp dport 22 accept");
        let tcp = pkt(6, "10.0.0.1", 1, "10.0.0.2", 22);
        let udp = pkt(17, "10.0.0.1", 1, "10.0.0.2", 22);
        assert_eq!(
            verdict(&p, &tcp),
            (TraceVerdict::Accept, Some("t.nft:4".into()))
        );
        assert_eq!(verdict(&p, &udp), (TraceVerdict::Drop, None));
    }

    #[test]
    fn ip_saddr_in_inet_implies_ipv4() {
        let p = fwd("ip saddr 10.0.0.0/8 accept\nip saddr != 10.0.0.0/8 accept");
        let mapped = pkt(6, "::ffff:10.0.0.1", 1, "::1", 2);
        assert_eq!(verdict(&p, &mapped).0, TraceVerdict::Drop);
        let v4 = pkt(6, "10.0.0.1", 1, "10.0.0.2", 2);
        assert_eq!(verdict(&p, &v4).0, TraceVerdict::Accept);
    }

    #[test]
    fn ip_tables_do_not_see_ipv6_packets() {
        let p = pol("table ip t { chain f { type filter hook forward priority 0; policy drop; } }");
        assert_eq!(
            verdict(&p, &pkt(6, "2001:db8::1", 1, "2001:db8::2", 2)).0,
            TraceVerdict::Accept
        );
        assert_eq!(
            verdict(&p, &pkt(6, "10.0.0.1", 1, "10.0.0.2", 2)).0,
            TraceVerdict::Drop
        );
    }

    #[test]
    fn bitmask_and_masked_matches_follow_nft() {
        let p = fwd("ct state established,related accept\n\
             tcp flags & (fin | syn | rst | ack) != syn drop\n\
             ct state != invalid tcp dport < 1024 accept");
        let mut est = pkt(6, "10.0.0.1", 1, "10.0.0.2", 5000);
        est.ct = CtState::Established;
        assert_eq!(verdict(&p, &est).0, TraceVerdict::Accept);
        let mut synack = pkt(6, "10.0.0.1", 1, "10.0.0.2", 80);
        synack.tcp_flags = 0x12;
        assert_eq!(
            verdict(&p, &synack),
            (TraceVerdict::Drop, Some("t.nft:5".into()))
        );
        let mut syn = synack.clone();
        syn.tcp_flags = 0x02;
        assert_eq!(
            verdict(&p, &syn),
            (TraceVerdict::Accept, Some("t.nft:6".into()))
        );
        syn.dport = 1024;
        assert_eq!(verdict(&p, &syn), (TraceVerdict::Drop, None));
    }

    #[test]
    fn interface_wildcards_and_negation() {
        let p = fwd("iifname != \"eth*\" drop\niifname \"eth1\" accept");
        let mut a = pkt(6, "10.0.0.1", 1, "10.0.0.2", 2);
        a.iif = Some("eth1".into());
        assert_eq!(verdict(&p, &a).1, Some("t.nft:5".into()));
        a.iif = Some("wg0".into());
        assert_eq!(verdict(&p, &a).1, Some("t.nft:4".into()));
    }

    #[test]
    fn vmap_keeps_first_match_order_and_miss_continues() {
        let p = fwd(
            "counter tcp dport vmap { 22 : accept, 23 : drop, 24 : continue }\n\
             tcp dport 22 drop\n\
             meta l4proto tcp accept",
        );
        let mut k = pkt(6, "10.0.0.1", 1, "10.0.0.2", 22);
        assert_eq!(
            verdict(&p, &k),
            (TraceVerdict::Accept, Some("t.nft:4".into()))
        );
        k.dport = 23;
        assert_eq!(
            verdict(&p, &k),
            (TraceVerdict::Drop, Some("t.nft:4".into()))
        );
        k.dport = 24;
        assert_eq!(
            verdict(&p, &k),
            (TraceVerdict::Accept, Some("t.nft:6".into()))
        );
        k.dport = 99;
        let t = p.trace(&k);
        // The counter ran (rule 4 matched) although the lookup missed.
        let first = t
            .hooks
            .get(1)
            .and_then(|h| h.chains.first())
            .and_then(|c| c.rules.first());
        assert_eq!(first.map(|r| r.location.as_str()), Some("t.nft:4"));
        assert_eq!(t.rule.as_deref(), Some("t.nft:6"));
    }

    #[test]
    fn base_chains_run_by_priority_accept_continues_drop_is_final() {
        let p = pol(
            "table inet a { chain late { type filter hook forward priority 10; policy accept;\n\
             tcp dport 1 drop } }\n\
             table inet b { chain early { type filter hook forward priority -10; policy accept;\n\
             tcp dport 1 accept\n tcp dport 2 drop } }",
        );
        let mut k = pkt(6, "10.0.0.1", 1, "10.0.0.2", 1);
        let t = p.trace(&k);
        assert_eq!(t.verdict, TraceVerdict::Drop);
        assert_eq!(t.rule.as_deref(), Some("t.nft:2"));
        let names: Vec<&str> = t
            .hooks
            .iter()
            .flat_map(|h| h.chains.iter().map(|c| c.chain.as_str()))
            .collect();
        assert_eq!(names, ["inet b early", "inet a late"]);
        k.dport = 2;
        assert_eq!(
            verdict(&p, &k),
            (TraceVerdict::Drop, Some("t.nft:5".into()))
        );
    }

    #[test]
    fn nat_chains_only_see_new_connections_and_first_nat_wins() {
        let p = pol(
            "table ip n { chain a { type nat hook prerouting priority -100; policy accept;\n\
             tcp dport 80 dnat to 10.0.0.5:8080 }\n\
             chain b { type nat hook prerouting priority -90; policy accept;\n\
             tcp dport 80 dnat to 10.0.0.6 } }",
        );
        let mut k = pkt(6, "192.0.2.1", 1, "198.51.100.1", 80);
        let t = p.trace(&k);
        let n = t.nat.unwrap_or_else(|| panic!("no nat"));
        assert_eq!((n.addr, n.port), ("10.0.0.5".parse().ok(), Some(8080)));
        assert_eq!(t.nat_all.len(), 1);
        k.ct = CtState::Established;
        assert!(p.trace(&k).nat.is_none());
    }

    #[test]
    fn dnat_changes_what_later_hooks_see() {
        let p = pol(
            "table ip n { chain pre { type nat hook prerouting priority -100; policy accept;\n\
             tcp dport 80 dnat to 10.0.0.5:8080 }\n\
             chain f { type filter hook forward priority 0; policy drop;\n\
             ip daddr 10.0.0.5 tcp dport 8080 accept } }",
        );
        assert_eq!(
            verdict(&p, &pkt(6, "192.0.2.1", 1, "198.51.100.1", 80)),
            (TraceVerdict::Accept, Some("t.nft:4".into()))
        );
    }

    #[test]
    fn dnat_map_and_pools() {
        let p = pol(
            "table ip n {\n map fwd { type inet_service : ipv4_addr; elements = { 2222 : 10.0.0.20, 8443 : 10.0.0.21 } }\n\
             chain pre { type nat hook prerouting priority -100; policy accept;\n\
             dnat to tcp dport map @fwd }\n\
             chain post { type nat hook postrouting priority 100; policy accept;\n\
             oifname \"a\" snat to 192.0.2.1-192.0.2.3:1024-2047\n oifname \"b\" snat to 192.0.2.1-192.0.2.3:1024-2047 } }",
        );
        let t = p.trace(&pkt(6, "1.1.1.1", 1, "2.2.2.2", 8443));
        assert_eq!(t.nat.and_then(|n| n.addr), "10.0.0.21".parse().ok());
        assert!(p.trace(&pkt(6, "1.1.1.1", 1, "2.2.2.2", 9)).nat.is_none());
        assert_eq!(p.nat_config().pools.len(), 1, "identical pools are shared");
        let pool = p
            .nat_config()
            .pools
            .first()
            .cloned()
            .unwrap_or_else(|| panic!("pool"));
        assert_eq!((pool.addrs.len(), pool.ports), (3, 1024..=2047));
    }

    #[test]
    fn nat_reachable_from_a_filter_chain_is_refused() {
        let e = compile(
            "table ip n { chain sub { dnat to 10.0.0.1 }\n\
             chain pre { type nat hook prerouting priority -100; policy accept; jump sub }\n\
             chain f { type filter hook forward priority 0; policy accept; jump sub } }",
        );
        let e = e.err().unwrap_or_default();
        assert_eq!(e.errors.len(), 1, "{e}");
        assert!(e.to_string().contains("t.nft:1:"), "{e}");
        assert!(
            e.to_string()
                .contains("reachable from filter chain 'ip n f'"),
            "{e}"
        );
    }

    #[test]
    fn unknown_iif_is_an_error_but_unknown_iifname_is_not() {
        let rs = sluice_ruleset::parse_nft_str(
            "t.nft",
            "table ip t { chain c { type filter hook input priority 0;\n iif \"eth9\" accept\n iifname \"eth9\" accept } }",
        )
        .unwrap_or_else(|d| panic!("{d}"));
        let e = CompiledPolicy::compile(&rs, &Interfaces::new())
            .err()
            .unwrap_or_default();
        assert_eq!(e.errors.len(), 1, "{e}");
        assert_eq!(e.errors.first().map(|e| e.line), Some(2));
    }

    #[test]
    fn every_error_is_reported_at_once() {
        let e = compile(
            "table ip t { chain c { type nat hook prerouting priority 0;\n redirect to :1000-2000\n iifname > \"eth0\" drop\n iifname < \"eth9\" accept\n redirect to :5-6 } }",
        )
        .err()
        .unwrap_or_default();
        let lines: Vec<u32> = e.errors.iter().map(|e| e.line).collect();
        assert_eq!(lines, [2, 3, 4, 5], "{e}");
    }

    #[test]
    fn ct_status_dnat_matches_after_prerouting_dnat() {
        let p = compile(
            "table ip t {\n chain pre { type nat hook prerouting priority dstnat; policy accept;\n tcp dport 8080 dnat to 10.0.0.5:80 }\n chain fwd { type filter hook forward priority 0; policy drop;\n ct status dnat accept } }",
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let pkt = |dport| {
            TracePacket::parse(&format!(
                "tcp 192.0.2.9:4000 > 203.0.113.1:{dport} ct new flags S"
            ))
            .unwrap_or_else(|e| panic!("{e}"))
        };
        assert_eq!(p.trace(&pkt(8080)).verdict, TraceVerdict::Accept);
        assert_eq!(p.trace(&pkt(8081)).verdict, TraceVerdict::Drop);
    }

    #[test]
    fn engine_decide_uses_interface_map_marks_and_reject_codes() {
        let rs = sluice_ruleset::parse_nft_str(
            "t.nft",
            "table ip t { chain f { type filter hook forward priority 0; policy accept;\n\
             iifname \"lan*\" meta mark set 5\n\
             oif \"wan\" tcp dport 23 reject with tcp reset\n\
             udp dport 9 reject with icmp host-prohibited } \n\
             chain p { type nat hook postrouting priority 100; policy accept;\n\
             oifname \"wan\" masquerade } }",
        )
        .unwrap_or_else(|d| panic!("{d}"));
        let mut ifs = Interfaces::new();
        ifs.insert("lan0", 3);
        ifs.insert("wan", 4);
        let p = CompiledPolicy::compile(&rs, &ifs).unwrap_or_else(|e| panic!("{e}"));
        let mut pp = PolicyPacket {
            iif: 3,
            oif: Some(4),
            dport: 23,
            ..packet()
        };
        let d = p.decide(Hook::Forward, &pp);
        assert_eq!(
            (d.verdict, d.mark),
            (Verdict::Reject(RejectWith::TcpReset), 5)
        );
        pp.proto = 17;
        pp.dport = 9;
        let d = p.decide(Hook::Forward, &pp);
        assert_eq!(
            d.verdict,
            Verdict::Reject(RejectWith::Unreachable { v4: 10, v6: 4 })
        );
        let d = p.decide(Hook::Postrouting, &pp);
        assert_eq!(d.nat, Some(Translation::Masquerade));
        assert!(p.has_nat(Hook::Postrouting));
        assert!(!p.has_nat(Hook::Prerouting));
        pp.ct = CtState::Established;
        assert_eq!(p.decide(Hook::Postrouting, &pp).nat, None);
    }

    #[test]
    fn rule_counters_count_matches_across_generations() {
        let p = pol(
            "table ip t {\n set s { type ipv4_addr; elements = { 10.0.0.9 } }\n chain f {\n type filter hook forward priority 0; policy accept;\n tcp dport 22 counter packets 5 bytes 500 drop\n ip saddr @s counter accept\n tcp dport 80 accept\n }\n}\n",
        );
        let pk = |dport: u16, src: u128| PolicyPacket {
            src,
            dport,
            ..packet()
        };
        let counts = |p: &CompiledPolicy| -> Vec<Option<(u64, u64)>> {
            p.list_rules().iter().map(|r| r.counter).collect()
        };
        assert_eq!(counts(&p), [Some((5, 500)), Some((0, 0)), None]);
        for _ in 0..3 {
            assert_eq!(
                p.decide(Hook::Forward, &pk(22, 0x0a00_0001)).verdict,
                Verdict::Drop
            );
        }
        p.decide(Hook::Forward, &pk(80, 0x0a00_0001));
        assert_eq!(counts(&p), [Some((8, 680)), Some((0, 0)), None]);
        // A new generation shares the cells: counts made on either show.
        let (q, a) = p
            .apply_text("cmd", "add rule ip t f udp dport 53 counter accept")
            .unwrap_or_else(|e| panic!("{e}"));
        p.decide(Hook::Forward, &pk(22, 0x0a00_0001));
        q.decide(Hook::Forward, &pk(22, 0x0a00_0001));
        assert_eq!(
            counts(&q),
            [Some((10, 800)), Some((0, 0)), None, Some((0, 0))]
        );
        assert!(a.handle.is_some());
        // A set change re-lowers the rule that reads the set; its count
        // moves with it.
        q.decide(Hook::Forward, &pk(443, 0x0a00_0009));
        let (r, a) = q
            .apply_text("cmd", "add element ip t s { 10.0.0.7 }")
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(a.relowered, 1);
        assert_eq!(counts(&r)[1], Some((1, 60)));
        r.decide(Hook::Forward, &pk(443, 0x0a00_0007));
        assert_eq!(counts(&r)[1], Some((2, 120)));
    }

    #[test]
    fn limit_is_a_match_on_shared_buckets() {
        let p = pol(
            "table ip t {\n chain f {\n type filter hook forward priority 0; policy drop;\n icmp type echo-request limit rate 2/second burst 2 packets counter accept\n tcp dport 25 limit rate over 1/second burst 1 packets drop\n tcp dport 25 accept\n }\n}\n",
        );
        let pk = |proto: u8, dport: u16, now_ms: u64| PolicyPacket {
            proto,
            dport,
            icmp: (8, 0),
            len: 84,
            now_ms,
            ..packet()
        };
        let v = |p: &CompiledPolicy, proto, dport, t| {
            p.decide(Hook::Forward, &pk(proto, dport, t)).verdict
        };
        // Two pings a second pass; the third falls through to the policy.
        assert_eq!(
            [v(&p, 1, 0, 1000), v(&p, 1, 0, 1000), v(&p, 1, 0, 1000)],
            [Verdict::Accept, Verdict::Accept, Verdict::Drop]
        );
        assert_eq!(
            v(&p, 1, 0, 1500),
            Verdict::Accept,
            "half a second refills one"
        );
        // Only matching packets count.
        assert_eq!(p.list_rules()[0].counter, Some((3, 252)));
        // `over`: the first SMTP packet in a second is accepted, the next
        // one is over the rate and dropped.
        assert_eq!(
            [v(&p, 6, 25, 2000), v(&p, 6, 25, 2000)],
            [Verdict::Accept, Verdict::Drop]
        );
        // An update keeps the buckets: still empty in the new generation.
        let (q, _) = p
            .apply_text(
                "cmd",
                "add rule ip t f udp dport 53 limit rate 1/minute accept",
            )
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(v(&q, 6, 25, 2000), Verdict::Drop);
        assert_eq!(v(&q, 1, 0, 1500), Verdict::Drop);
        assert_eq!(v(&q, 17, 53, 0), Verdict::Accept);
        // The trace ignores limits (every limit within its rate).
        assert!(p
            .trace(&pkt(1, "10.0.0.1", 0, "10.0.0.2", 0))
            .mismatch
            .is_none());
    }

    /// A rule set with dynamic sets: a per-source SSH meter, a deny list
    /// that a probe of port 23 puts the source on for 10 s, and a set of
    /// two at most.
    const DYNAMIC: &str = "table inet f {\n\
        set ssh { type ipv4_addr; flags dynamic; }\n\
        set deny { type ipv4_addr; flags dynamic,timeout; timeout 10s; elements = { 192.0.2.9 } }\n\
        set two { typeof ip saddr . tcp dport; flags dynamic; size 2; }\n\
        chain input { type filter hook input priority 0; policy drop;\n\
          ip saddr @deny drop\n\
          tcp dport 23 update @deny { ip saddr } drop\n\
          tcp dport 22 ct state new add @ssh { ip saddr limit rate over 2/minute burst 3 packets } drop\n\
          tcp dport 22 accept\n\
          tcp dport 80 add @two { ip saddr . tcp dport } accept\n\
          tcp dport 81 delete @deny { ip saddr } accept\n\
          ip saddr != @deny tcp dport 82 accept\n\
        }\n}\n";

    fn input(p: &CompiledPolicy, src: u32, dport: u16, now_ms: u64) -> Verdict {
        p.decide(
            Hook::Input,
            &PolicyPacket {
                src: u128::from(src),
                dport,
                now_ms,
                ..packet()
            },
        )
        .verdict
    }

    #[test]
    fn a_dynamic_set_meters_each_source_on_its_own() {
        let p = pol(DYNAMIC);
        let (a, b) = (0x0a00_0001, 0x0a00_0003);
        // A burst of 3 at 2/minute: three new SSH connections pass, the
        // fourth is over the rate; another source has its own element.
        let four: Vec<Verdict> = (0..4).map(|_| input(&p, a, 22, 1000)).collect();
        assert_eq!(
            four,
            [
                Verdict::Accept,
                Verdict::Accept,
                Verdict::Accept,
                Verdict::Drop
            ]
        );
        assert_eq!(input(&p, b, 22, 1000), Verdict::Accept);
        // Half a minute later one token is back.
        assert_eq!(input(&p, a, 22, 31_000), Verdict::Accept);
        assert_eq!(input(&p, a, 22, 31_000), Verdict::Drop);
        let listed = p
            .dynamic_set_elements("inet f ssh", 31_000)
            .unwrap_or_else(|| panic!("no set"));
        assert_eq!(listed.len(), 2);
        assert_eq!(listed[0].key, vec![u128::from(a) | 0xffff << 32]);
        assert_eq!((listed[0].packets, listed[0].expires_in_ms), (6, None));
    }

    /// The elements a dynamic set is declared with expire as the kernel's:
    /// after their `expires` (a listing of a live set), else their own
    /// `timeout`, else the set's, from when the rule set starts; in a set
    /// with `flags timeout` and no timeout of its own, an element without
    /// either stays.
    #[test]
    fn declared_elements_expire_by_their_expiry_their_timeout_or_the_sets() {
        let p = pol("table inet f {\n\
            set s { type ipv4_addr; timeout 1h; elements = { 10.0.0.1 expires 5s, \
              10.0.0.2 timeout 20s, 10.0.0.3 timeout 20s expires 8s, 10.0.0.4 } }\n\
            set k { type ipv4_addr; flags timeout; elements = { 10.0.0.5, 10.0.0.6 expires 3s } }\n\
            chain input { type filter hook input priority 0; policy accept;\n\
              ip saddr @s drop\n\
              ip saddr @k drop\n\
            }\n}\n");
        // The gateway publishes it at 100 s on its clock.
        p.start_timers(100_000);
        p.start_timers(900_000);
        let at = |src: u32, ms: u64| input(&p, 0x0a00_0000 | src, 22, 100_000 + ms);
        assert_eq!(at(6, 2_999), Verdict::Drop);
        assert_eq!(at(6, 3_000), Verdict::Accept, "expires 3s");
        assert_eq!(at(1, 4_999), Verdict::Drop);
        assert_eq!(at(1, 5_000), Verdict::Accept, "expires 5s");
        assert_eq!(at(3, 7_999), Verdict::Drop);
        assert_eq!(at(3, 8_000), Verdict::Accept, "expires before its timeout");
        assert_eq!(at(2, 19_999), Verdict::Drop);
        assert_eq!(at(2, 20_000), Verdict::Accept, "its own timeout");
        assert_eq!(at(4, 3_599_999), Verdict::Drop);
        assert_eq!(at(4, 3_600_000), Verdict::Accept, "the set's hour");
        assert_eq!(at(5, 99_000_000), Verdict::Drop, "no timeout: stays");
        let listed = p
            .dynamic_set_elements("inet f k", 100_000 + 99_000_000)
            .unwrap_or_else(|| panic!("no set"));
        assert_eq!(
            listed.iter().map(|e| e.expires_in_ms).collect::<Vec<_>>(),
            [None],
            "10.0.0.6 gone, 10.0.0.5 without expiry"
        );
    }

    /// `meta mark set KEY map` / `ct mark set KEY map`: the element's mark,
    /// a key the map does not hold ending the rule (a counter before it
    /// counting either way); a map keyed by the mark it sets is refused.
    #[test]
    fn marks_from_maps_and_misses_end_the_rule() {
        let p = pol("table inet f {\n\
            map m { type ipv4_addr : mark; elements = { 10.0.0.1 : 0x11 } }\n\
            chain input { type filter hook input priority 0; policy accept;\n\
              counter meta mark set ip saddr map @m drop\n\
              tcp dport 22 ct mark set tcp dport map { 22 : 0x7 } drop\n\
            }\n}\n");
        let d = |src: u32| {
            p.decide(
                Hook::Input,
                &PolicyPacket {
                    src: u128::from(src),
                    dport: 80,
                    ..packet()
                },
            )
        };
        let hit = d(0x0a00_0001);
        assert_eq!((hit.verdict, hit.mark), (Verdict::Drop, 0x11));
        let miss = d(0x0a00_0002);
        assert_eq!(
            (miss.verdict, miss.mark),
            (Verdict::Accept, 0),
            "the rule ended"
        );
        let c = p.list_rules();
        assert_eq!(
            c.first()
                .and_then(|r| r.counter)
                .map(|(packets, _)| packets),
            Some(2),
            "the counter before the map: {c:?}"
        );
        // The same split for a verdict map: its counter counts each packet
        // once, hit or miss.
        let v = pol("table inet f {\n\
            chain input { type filter hook input priority 0; policy accept;\n\
              counter tcp dport vmap { 80 : drop }\n\
            }\n}\n");
        for dport in [80, 81] {
            v.decide(Hook::Input, &PolicyPacket { dport, ..packet() });
        }
        assert_eq!(
            v.list_rules()
                .first()
                .and_then(|r| r.counter)
                .map(|(p, _)| p),
            Some(2)
        );
        let e = compile(
            "table inet f {\n chain c { type filter hook input priority 0;\n \
             meta mark set meta mark map { 1 : 2, 2 : 3 }\n }\n}\n",
        )
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
        assert!(e.contains("keyed by the mark it sets"), "{e}");
    }

    /// `numgen random mod N vmap`: each element taken as often as the
    /// share of the N numbers it holds (kube-proxy's load balancing), the
    /// numbers no element holds ending the rule; `inc` is refused.
    #[test]
    fn numgen_vmap_shares_as_the_kernels_one_draw() {
        let p = pol("table inet f {\n\
            chain a { meta mark set 1 accept }\n\
            chain b { meta mark set 2 accept }\n\
            chain input { type filter hook input priority 0; policy accept;\n\
              counter numgen random mod 8 offset 4 vmap { 4-5 : jump a, 6-9 : goto b, 99 : drop }\n\
            }\n}\n");
        let mut n = [0u32; 3];
        for i in 0..8000u32 {
            let d = p.decide(
                Hook::Input,
                &PolicyPacket {
                    src: u128::from(i),
                    ..packet()
                },
            );
            assert_eq!(d.verdict, Verdict::Accept);
            n[d.mark as usize] += 1;
        }
        // 2 of 8 to a, 4 of 8 to b, 2 of 8 (10 and 11) to none.
        for (got, want) in n.iter().zip([2000, 2000, 4000]) {
            assert!(got.abs_diff(want) < 250, "{n:?}");
        }
        let rules = p.list_rules();
        assert_eq!(
            rules.iter().find_map(|r| r.counter).map(|(p, _)| p),
            Some(8000),
            "counted once each: {rules:?}"
        );
        let e = compile(
            "table inet f {\n chain a { accept }\n chain c { type filter hook input priority 0;\n \
             numgen inc mod 2 vmap { 0 : jump a }\n }\n}\n",
        )
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
        assert!(e.contains("'numgen inc ... vmap' cannot be lowered"), "{e}");
    }

    #[test]
    fn a_deny_list_fills_from_the_packet_path_and_times_out() {
        let p = pol(DYNAMIC);
        let a = 0x0a00_0001;
        assert_eq!(input(&p, a, 22, 0), Verdict::Accept);
        assert_eq!(input(&p, 0xc000_0209, 22, 9_999), Verdict::Drop, "declared");
        // A probe of port 23 puts the source on the list for 10 s.
        assert_eq!(input(&p, a, 23, 1000), Verdict::Drop);
        assert_eq!(input(&p, a, 22, 1000), Verdict::Drop);
        assert_eq!(input(&p, a, 82, 1000), Verdict::Drop, "!= @deny");
        assert_eq!(input(&p, a, 22, 10_999), Verdict::Drop);
        assert_eq!(input(&p, a, 22, 11_000), Verdict::Accept, "expired");
        assert_eq!(input(&p, a, 82, 11_000), Verdict::Accept);
        // A listed source's probes never reach the update (the deny rule
        // drops them first): listed from 20 s to 30 s.
        assert_eq!(input(&p, a, 23, 20_000), Verdict::Drop);
        assert_eq!(input(&p, a, 23, 25_000), Verdict::Drop);
        assert_eq!(input(&p, a, 22, 29_999), Verdict::Drop);
        assert_eq!(input(&p, a, 22, 30_000), Verdict::Accept);
        // The declared element had the set's 10 s from the rule set's
        // start (its first use, at 0), as in the kernel.
        assert_eq!(input(&p, 0xc000_0209, 22, 30_000), Verdict::Accept);
        // Without the deny rule: `update` refreshes the timeout, and
        // `delete` takes the element out.
        let q = pol(&DYNAMIC.replace("ip saddr @deny drop\n", ""));
        assert_eq!(input(&q, a, 23, 0), Verdict::Drop);
        assert_eq!(input(&q, a, 23, 5000), Verdict::Drop);
        assert_eq!(input(&q, a, 82, 14_999), Verdict::Drop, "refreshed at 5 s");
        assert_eq!(input(&q, a, 82, 15_000), Verdict::Accept);
        assert_eq!(input(&q, a, 23, 20_000), Verdict::Drop);
        assert_eq!(input(&q, a, 82, 20_000), Verdict::Drop);
        assert_eq!(input(&q, a, 81, 20_000), Verdict::Accept);
        assert_eq!(input(&q, a, 82, 20_000), Verdict::Accept, "deleted");
        // Without state (the trace) every dynamic set is empty.
        assert!(p
            .trace(&pkt(6, "10.0.0.1", 1000, "10.0.0.2", 22))
            .mismatch
            .is_none());
    }

    #[test]
    fn a_full_dynamic_set_stops_the_rule_and_updates_keep_the_elements() {
        let p = pol(DYNAMIC);
        let srcs = [0x0a00_0001u32, 0x0a00_0002, 0x0a00_0003];
        let v: Vec<Verdict> = srcs.iter().map(|s| input(&p, *s, 80, 0)).collect();
        assert_eq!(
            v,
            [Verdict::Accept, Verdict::Accept, Verdict::Drop],
            "size 2: the third source falls through to the policy"
        );
        assert_eq!(input(&p, srcs[0], 80, 0), Verdict::Accept, "already in");
        // A rule update keeps the live elements (and the meters).
        assert_eq!(input(&p, srcs[0], 23, 0), Verdict::Drop);
        let (q, _) = p
            .apply_text("cmd", "add rule inet f input udp dport 53 accept")
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(input(&q, srcs[0], 22, 1), Verdict::Drop, "still denied");
        assert_eq!(input(&q, srcs[2], 80, 1), Verdict::Drop, "still full");
        // A rule added later may use a dynamic set no rule used before.
        let (r, _) = q
            .apply_text(
                "cmd",
                "insert rule inet f input ip saddr @ssh tcp dport 8080 accept",
            )
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(input(&r, srcs[1], 8080, 2), Verdict::Drop, "not metered");
        assert_eq!(input(&r, srcs[1], 22, 2), Verdict::Accept);
        assert_eq!(input(&r, srcs[1], 8080, 2), Verdict::Accept, "metered now");
    }

    #[test]
    fn control_plane_elements_change_the_live_dynamic_set() {
        let p = pol(DYNAMIC);
        let (a, b) = (0x0a00_0001u32, 0x0a00_0007u32);
        assert_eq!(input(&p, a, 23, 0), Verdict::Drop);
        assert_eq!(input(&p, a, 22, 0), Verdict::Drop, "listed by the probe");
        // An operator takes a source off the deny list and puts another on.
        let (q, _) = p
            .apply_text("cmd", "delete element inet f deny { 10.0.0.1 }")
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(input(&q, a, 22, 1), Verdict::Accept);
        let (r, _) = q
            .apply_text("cmd", "add element inet f deny { 10.0.0.7, 192.0.2.10 }")
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(input(&r, b, 22, 1), Verdict::Drop);
        assert_eq!(
            input(&r, b, 22, 10_000),
            Verdict::Drop,
            "added by hand: the set's 10 s from the first use, at 1 ms"
        );
        assert_eq!(input(&r, b, 22, 10_001), Verdict::Accept);
        let listed = r
            .dynamic_set_elements("inet f deny", 2)
            .unwrap_or_else(|| panic!("no set"));
        let keys: Vec<String> = listed
            .iter()
            .map(|e| r.format_set_key("inet f deny", &e.key))
            .collect();
        assert_eq!(keys, ["10.0.0.7", "192.0.2.9", "192.0.2.10"]);
        // With a timeout of its own; `expires` before it; a gateway
        // starts the timer when it publishes the change.
        let (t, _) = r
            .apply_text(
                "cmd",
                "add element inet f deny { 10.0.0.8 timeout 1h, 10.0.0.9 timeout 1h expires 2s }",
            )
            .unwrap_or_else(|e| panic!("{e}"));
        t.start_timers(50_000);
        assert_eq!(
            input(&t, 0x0a00_0008, 22, 50_000 + 3_599_999),
            Verdict::Drop
        );
        assert_eq!(input(&t, 0x0a00_0009, 22, 51_999), Verdict::Drop);
        assert_eq!(input(&t, 0x0a00_0009, 22, 52_000), Verdict::Accept);
        assert_eq!(
            input(&t, 0x0a00_0008, 22, 50_000 + 3_600_000),
            Verdict::Accept
        );
        // Not in a set without timeouts, nor in a static one.
        assert!(r
            .apply_text("cmd", "add element inet f ssh { 10.0.0.1 timeout 1m }")
            .is_err());
        // Deleting what is in neither the declaration nor the live set is
        // refused, and so is a range in a dynamic set.
        assert!(r
            .apply_text("cmd", "delete element inet f deny { 10.9.9.9 }")
            .is_err());
        assert!(r
            .apply_text("cmd", "add element inet f deny { 10.0.0.0-10.0.0.9 }")
            .is_err());
        // `flush set` empties it, declared and live elements alike.
        let (f, _) = r
            .apply_text("cmd", "flush set inet f deny")
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(input(&f, b, 22, 3), Verdict::Accept);
        assert_eq!(
            input(&f, 0xc000_0209, 22, 3),
            Verdict::Accept,
            "declared one too"
        );
        assert_eq!(
            f.dynamic_set_elements("inet f deny", 3).map(|v| v.len()),
            Some(0)
        );
        assert!(r.apply_text("cmd", "flush set inet f nosuch").is_err());
        // On a static set it relowers the rules that read it.
        let st = pol(
            "table ip t {\n set s { type ipv4_addr; elements = { 10.0.0.1 } }\n \
             chain c { type filter hook input priority 0; policy accept; ip saddr @s drop }\n}\n",
        );
        assert_eq!(input(&st, a, 22, 0), Verdict::Drop);
        let (st2, _) = st
            .apply_text("cmd", "flush set ip t s")
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(input(&st2, a, 22, 0), Verdict::Accept);
        // A dynamic set no rule uses yet keeps what is added for later.
        let lone = "table ip t {\n set s { type ipv4_addr; flags dynamic; }\n \
                    chain c { type filter hook input priority 0; policy accept; }\n}\n";
        let (l1, _) = pol(lone)
            .apply_text("cmd", "add element ip t s { 10.0.0.1 }")
            .unwrap_or_else(|e| panic!("{e}"));
        let (l2, _) = l1
            .apply_text("cmd", "add rule ip t c ip saddr @s drop")
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(input(&l2, a, 22, 0), Verdict::Drop);
        assert_eq!(input(&l2, b, 22, 0), Verdict::Accept);
    }

    /// The golden file's port knocking (the nftables wiki's rules): 123,
    /// 234, 345, 456 each within a second of the last open SSH for 10 s.
    #[test]
    fn port_knocking_through_concatenated_keys_with_constants() {
        let p = pol(include_str!("../../ruleset/tests/golden/dynamic_sets.nft"));
        // Published at time 0: the declared elements' timers start.
        p.start_timers(0);
        let a = 0x0a00_0001;
        let b = 0x0a00_0005;
        assert_eq!(input(&p, a, 22, 0), Verdict::Drop, "no knock");
        for (i, port) in [123u16, 234, 345, 456].into_iter().enumerate() {
            // Each knock falls through to the policy (drop), as in the wiki.
            assert_eq!(input(&p, a, port, 500 * i as u64), Verdict::Drop);
        }
        assert_eq!(input(&p, a, 22, 2000), Verdict::Accept, "knocked");
        assert_eq!(input(&p, b, 22, 2000), Verdict::Drop, "another source");
        assert_eq!(input(&p, a, 22, 11_499), Verdict::Accept);
        assert_eq!(input(&p, a, 22, 11_500), Verdict::Drop, "10 s after 456");
        // Out of order, or too slow, opens nothing.
        for (t, port) in [
            (20_000, 123u16),
            (20_100, 345),
            (20_200, 234),
            (20_300, 456),
        ] {
            input(&p, b, port, t);
        }
        assert_eq!(input(&p, b, 22, 20_400), Verdict::Drop, "out of order");
        for (t, port) in [(30_000, 123u16), (31_000, 234)] {
            input(&p, b, port, t);
        }
        assert_eq!(input(&p, b, 345, 31_500), Verdict::Drop);
        assert_eq!(input(&p, b, 456, 32_000), Verdict::Drop);
        assert_eq!(input(&p, b, 22, 32_100), Verdict::Drop, "234 came 1 s late");
        // Probes of closed ports put the source on the deny list.
        assert_eq!(input(&p, b, 3389, 40_000), Verdict::Drop);
        let listed = p
            .dynamic_set_elements("inet filter denylist", 40_000)
            .unwrap_or_else(|| panic!("no set"));
        let keys: Vec<u128> = listed.iter().map(|e| e.key[0]).collect();
        assert_eq!(keys, [0xffff_0a00_0005, 0xffff_c633_6442]);
        assert_eq!(listed[0].expires_in_ms, Some(3_600_000));
        assert_eq!(
            listed[1].expires_in_ms,
            Some(3_600_000 - 40_000),
            "declared: the set's hour, from the start"
        );
    }

    #[test]
    fn quota_counts_the_bytes_of_its_rule_and_updates_keep_them() {
        let p = pol(
            "table ip t {\n chain f {\n type filter hook forward priority 0; policy accept;\n \
             udp dport 7000 quota over 200 bytes drop\n \
             udp dport 7001 quota until 100 bytes used 40 bytes accept\n \
             udp dport 7001 drop\n }\n}\n",
        );
        let v = |p: &CompiledPolicy, dport| {
            p.decide(
                Hook::Forward,
                &PolicyPacket {
                    proto: 17,
                    dport,
                    len: 60,
                    ..packet()
                },
            )
            .verdict
        };
        // 60, 120, 180 bytes used: within; 240: over.
        let over: Vec<Verdict> = (0..4).map(|_| v(&p, 7000)).collect();
        assert_eq!(
            over,
            [
                Verdict::Accept,
                Verdict::Accept,
                Verdict::Accept,
                Verdict::Drop
            ]
        );
        // 40 used at load: 100 after the first (exactly the quota: still
        // within, as the kernel counts it), 160 after the second.
        assert_eq!(v(&p, 7001), Verdict::Accept);
        assert_eq!(v(&p, 7001), Verdict::Drop);
        // Other packets do not count; an update keeps the used bytes.
        let (q, _) = p
            .apply_text("cmd", "add rule ip t f tcp dport 1 accept")
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(v(&q, 7000), Verdict::Drop);
        assert_eq!(v(&q, 7001), Verdict::Drop);
        // Without state (a single trace) a quota is not used up.
        assert!(p
            .trace(&pkt(17, "10.0.0.1", 1000, "10.0.0.2", 7000))
            .mismatch
            .is_none());
    }

    #[test]
    fn named_objects_are_shared_by_their_rules_and_kept_across_updates() {
        use ast::{ObjKind, ObjState};
        let p = pol("table ip t {\n counter web { packets 10 bytes 1000 }\n \
             quota cap { over 200 bytes used 20 bytes }\n quota small { 100 bytes }\n \
             chain f {\n type filter hook forward priority 0; policy accept;\n \
             udp dport 80 counter name \"web\" quota name cap drop\n \
             udp dport 443 counter name web quota name \"cap\" drop\n \
             udp dport 8080 quota name small counter name web\n }\n}\n");
        let v = |p: &CompiledPolicy, dport| {
            p.decide(
                Hook::Forward,
                &PolicyPacket {
                    proto: 17,
                    dport,
                    len: 60,
                    ..packet()
                },
            )
            .verdict
        };
        // One quota for both rules: 80, 140 within; 200 exactly (within, as
        // the kernel counts it); 260 over, whichever port.
        assert_eq!(v(&p, 80), Verdict::Accept);
        assert_eq!(v(&p, 443), Verdict::Accept);
        assert_eq!(v(&p, 80), Verdict::Accept);
        assert_eq!(v(&p, 443), Verdict::Drop);
        let web = |p: &CompiledPolicy| p.objects(Some(ObjKind::Counter), Some("web"));
        // The counter comes before the quota in those rules: four packets.
        assert_eq!(
            web(&p)[0].state,
            ObjState::Counter {
                packets: 14,
                bytes: 1240
            }
        );
        // After a quota: a packet the quota stops is not counted (60 bytes
        // within 100, 120 not).
        assert_eq!(v(&p, 8080), Verdict::Accept);
        assert_eq!(v(&p, 8080), Verdict::Accept);
        assert_eq!(
            web(&p)[0].state,
            ObjState::Counter {
                packets: 15,
                bytes: 1300
            }
        );
        // An added rule names the same objects and the values stay.
        let (q, _) = p
            .apply_text(
                "cmd",
                "add rule ip t f udp dport 53 counter name web accept",
            )
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(v(&q, 53), Verdict::Accept);
        assert_eq!(v(&q, 80), Verdict::Drop);
        assert_eq!(
            web(&q)[0].state,
            ObjState::Counter {
                packets: 17,
                bytes: 1420
            }
        );
        let listed = q.objects(None, None);
        assert_eq!(listed.len(), 3);
        assert_eq!(listed[0].name, "ip t web");
        assert_eq!(listed[1].name, "ip t cap");
        match listed[1].state {
            ObjState::Quota(c) => assert_eq!((c.bytes(), c.used_bytes()), (200, 320)),
            ref o => panic!("{o:?}"),
        }
        // A rule naming an object the table does not have is refused.
        let e = refusal(&q, "add rule ip t f udp dport 1 counter name nope");
        assert!(e.contains("no counter 'nope' in table ip t"), "{e}");
        // Reset: the values before, then zero; the quota admits again.
        let before = q.reset_objects(Some(ObjKind::Quota), Some("t cap"));
        assert_eq!(before.len(), 1);
        assert_eq!(v(&q, 80), Verdict::Accept);
        assert_eq!(q.objects(Some(ObjKind::Quota), None).len(), 2);
        assert!(q.objects(Some(ObjKind::Quota), Some("web")).is_empty());
    }

    #[test]
    fn time_of_day_day_of_week_and_date_come_from_the_packets_wall_clock() {
        let p = pol(
            "table ip t {\n chain f {\n type filter hook forward priority 0; policy drop;\n \
             meta hour \"22:00\"-\"06:00\" drop\n \
             meta day { \"Saturday\", \"Sunday\" } drop\n \
             meta hour \"09:00\"-\"17:00\" meta day \"Monday\"-\"Friday\" accept\n \
             meta time >= \"2026-12-01\" accept\n }\n}\n",
        );
        let at = |s: &str| {
            let secs = sluice_ruleset::timefmt::parse_date_time(s).unwrap_or_else(|| panic!("{s}"));
            p.decide(
                Hook::Forward,
                &PolicyPacket {
                    wall_ms: secs * 1000,
                    ..packet()
                },
            )
            .verdict
        };
        // 2026-11-23 was a Monday.
        assert_eq!(at("2026-11-23 10:00"), Verdict::Accept);
        assert_eq!(at("2026-11-23 17:00:00"), Verdict::Accept);
        assert_eq!(at("2026-11-23 17:00:01"), Verdict::Drop);
        assert_eq!(at("2026-11-28 10:00"), Verdict::Drop, "Saturday");
        // "22:00"-"06:00" is the day outside 06:00-22:00: both ends are
        // outside it, as nft writes it.
        assert_eq!(at("2026-12-02 23:30"), Verdict::Drop);
        assert_eq!(at("2026-12-02 06:00"), Verdict::Accept, "after Dec 1");
        assert_eq!(at("2026-12-02 05:59:59"), Verdict::Drop);
    }

    /// What `p` says refusing control command `cmd` (empty if it took it).
    fn refusal(p: &CompiledPolicy, cmd: &str) -> String {
        p.apply_text("cmd", cmd)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default()
    }

    #[test]
    fn the_running_rule_set_prints_with_live_counters_and_objects() {
        let p = pol(
            "table ip t {\n counter c { }\n quota q { over 1000 bytes }\n \
             chain f {\n type filter hook forward priority 0; policy accept;\n \
             udp dport 53 counter counter name c quota name q drop\n }\n}\n",
        );
        for _ in 0..2 {
            p.decide(
                Hook::Forward,
                &PolicyPacket {
                    proto: 17,
                    dport: 53,
                    len: 60,
                    ..packet()
                },
            );
        }
        let (q, _) = p
            .apply_text("cmd", "add rule ip t f tcp dport 22 drop")
            .unwrap_or_else(|e| panic!("{e}"));
        let text = sluice_ruleset::print_ruleset(&q.running_ruleset());
        for want in [
            "\tcounter c {\n\t\tpackets 2 bytes 120\n\t}",
            "\tquota q {\n\t\tover 1000 bytes used 120 bytes\n\t}",
            "udp dport 53 counter packets 2 bytes 120 counter name \"c\" quota name \"q\" drop",
            "tcp dport 22 drop",
        ] {
            assert!(text.contains(want), "{want:?} not in\n{text}");
        }
        // What it prints loads again.
        sluice_ruleset::parse_nft_str("running.nft", &text).unwrap_or_else(|d| panic!("{d}"));
    }

    #[test]
    fn a_named_limit_is_one_bucket_for_every_rule_naming_it() {
        let p = pol(
            "table ip t {\n limit ssh { rate 1/minute burst 3 packets }\n \
             chain f {\n type filter hook forward priority 0; policy drop;\n \
             tcp dport 22 limit name \"ssh\" accept\n \
             tcp dport 2222 limit name ssh accept\n }\n}\n",
        );
        let v = |p: &CompiledPolicy, dport, now_ms| {
            p.decide(
                Hook::Forward,
                &PolicyPacket {
                    dport,
                    now_ms,
                    ..packet()
                },
            )
            .verdict
        };
        // A burst of 3 for both ports together, then one a minute.
        let got: Vec<Verdict> = [22, 2222, 22, 2222]
            .iter()
            .map(|d| v(&p, *d, 1000))
            .collect();
        assert_eq!(
            got,
            [
                Verdict::Accept,
                Verdict::Accept,
                Verdict::Accept,
                Verdict::Drop
            ]
        );
        assert_eq!(v(&p, 2222, 61_000), Verdict::Accept);
        assert_eq!(v(&p, 22, 61_001), Verdict::Drop);
        // A trace stays within the rate.
        assert!(p
            .trace(&pkt(6, "10.0.0.1", 1000, "10.0.0.2", 22))
            .mismatch
            .is_none());
    }

    #[test]
    fn object_maps_pick_each_keys_object_and_follow_element_changes() {
        use ast::{ObjKind, ObjState};
        let p = pol(
            "table ip t {\n counter a { }\n counter b { }\n quota qa { over 100 bytes }\n \
             map m { type ipv4_addr : counter; elements = { 10.0.0.1 : \"a\" } }\n \
             chain f {\n type filter hook forward priority 0; policy accept;\n \
             udp dport 9 counter counter name ip saddr map @m drop\n \
             quota name ip saddr map { 10.0.0.1 : \"qa\" } drop\n }\n}\n",
        );
        let v = |p: &CompiledPolicy, src: u128, dport| {
            p.decide(
                Hook::Forward,
                &PolicyPacket {
                    src,
                    proto: 17,
                    dport,
                    len: 60,
                    ..packet()
                },
            )
            .verdict
        };
        let count =
            |p: &CompiledPolicy, n: &str| match p.objects(Some(ObjKind::Counter), Some(n))[0].state
            {
                ObjState::Counter { packets, .. } => packets,
                ref o => panic!("{o:?}"),
            };
        // 10.0.0.1 maps to `a` and the rule goes on to its verdict.
        assert_eq!(v(&p, 0x0a00_0001, 9), Verdict::Drop);
        assert_eq!(count(&p, "a"), 1);
        // Its quota: 60 bytes within 100, then 120 over.
        assert_eq!(v(&p, 0x0a00_0001, 10), Verdict::Accept);
        assert_eq!(v(&p, 0x0a00_0001, 11), Verdict::Drop);
        // Not in either map: each rule ends at its map.
        assert_eq!(v(&p, 0x0a00_0002, 9), Verdict::Accept);
        assert_eq!(count(&p, "a"), 1);
        // An element added to the named map takes effect, the counts stay.
        let (q, _) = p
            .apply_text("cmd", "add element ip t m { 10.0.0.2 : \"b\" }")
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(v(&q, 0x0a00_0002, 9), Verdict::Drop);
        assert_eq!((count(&q, "a"), count(&q, "b")), (1, 1));
        let e = refusal(&p, "add element ip t m { 10.0.0.3 : \"zz\" }");
        assert!(e.contains("no counter 'zz'"), "{e}");
        // Objects in use by a map's element or an anonymous object map stay.
        let e = refusal(&q, "delete counter ip t b");
        assert!(e.contains("in use by an element of map 'm'"), "{e}");
        let e = refusal(&q, "delete quota ip t qa");
        assert!(e.contains("in use by rule handle 2"), "{e}");
        // A statement that may stop the rule cannot come before the map:
        // the element rules would run without it.
        let rs = sluice_ruleset::parse_nft_str(
            "t.nft",
            "table ip t {\n counter a { }\n quota q { over 10 bytes }\n chain f {\n \
             type filter hook forward priority 0; policy accept;\n \
             quota name q counter name ip saddr map { 10.0.0.1 : \"a\" } drop\n }\n}\n",
        )
        .unwrap_or_else(|d| panic!("{d}"));
        let e = CompiledPolicy::compile(&rs, &Interfaces::from_ruleset(&rs))
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            e.contains("only counters and logs can come before an object or mark map"),
            "{e}"
        );
    }

    #[test]
    fn named_objects_are_added_and_deleted_on_a_running_policy() {
        use ast::{ObjKind, ObjState};
        let p = pol("table ip t {\n chain f {\n type filter hook forward priority 0; policy accept;\n }\n}\n");
        let apply = |p: &CompiledPolicy, c: &str| {
            p.apply_text("cmd", c)
                .map(|(q, _)| q)
                .map_err(|e| e.to_string())
        };
        let e = apply(&p, "add rule ip t f counter name cust1")
            .err()
            .unwrap_or_default();
        assert!(e.contains("no counter 'cust1'"), "{e}");
        let p = apply(&p, "add counter ip t cust1").unwrap_or_else(|e| panic!("{e}"));
        let p =
            apply(&p, "add quota ip t cap1 { over 100 bytes }").unwrap_or_else(|e| panic!("{e}"));
        let e = apply(&p, "add counter ip t cust1")
            .err()
            .unwrap_or_default();
        assert!(e.contains("duplicate counter 'cust1'"), "{e}");
        let p = apply(
            &p,
            "add rule ip t f udp dport 5000 counter name cust1 quota name cap1 drop",
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let v = |p: &CompiledPolicy| {
            p.decide(
                Hook::Forward,
                &PolicyPacket {
                    proto: 17,
                    dport: 5000,
                    len: 60,
                    ..packet()
                },
            )
            .verdict
        };
        assert_eq!(v(&p), Verdict::Accept);
        assert_eq!(v(&p), Verdict::Drop);
        assert_eq!(
            p.objects(Some(ObjKind::Counter), None)[0].state,
            ObjState::Counter {
                packets: 2,
                bytes: 120
            }
        );
        // In use: refused, nothing changes.
        let e = apply(&p, "delete counter ip t cust1")
            .err()
            .unwrap_or_default();
        assert!(e.contains("in use by rule handle 1"), "{e}");
        let e = apply(&p, "delete quota ip t cust1")
            .err()
            .unwrap_or_default();
        assert!(e.contains("no such quota 'cust1'"), "{e}");
        let p = apply(&p, "delete rule ip t f handle 1").unwrap_or_else(|e| panic!("{e}"));
        let p = apply(&p, "delete counter ip t cust1").unwrap_or_else(|e| panic!("{e}"));
        assert!(p.objects(Some(ObjKind::Counter), None).is_empty());
        // The same name again starts from zero.
        let p = apply(&p, "add counter ip t cust1 { packets 7 bytes 70 }")
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            p.objects(Some(ObjKind::Counter), None)[0].state,
            ObjState::Counter {
                packets: 7,
                bytes: 70
            }
        );
        let p = apply(&p, "add rule ip t f udp dport 5000 counter name cust1")
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(v(&p), Verdict::Accept);
        assert_eq!(
            p.objects(None, Some("cust1"))[0].state,
            ObjState::Counter {
                packets: 8,
                bytes: 130
            }
        );
    }

    /// TCP from `src:sport` to 10.0.0.2:22.
    fn ssh_conn(src: u128, sport: u16) -> sluice_engine::ConnTuple {
        sluice_engine::ConnTuple {
            src,
            dst: 0x0a00_0002,
            sport,
            dport: 22,
            proto: 6,
            family: 4,
        }
    }

    /// The forward verdict for the first packet of [`ssh_conn`] at `ms`;
    /// the connection is confirmed when accepted, as the engine does once
    /// it created it.
    fn new_ssh_conn(p: &CompiledPolicy, src: u128, sport: u16, ms: u64) -> Verdict {
        use sluice_engine::Policy as _;
        let c = ssh_conn(src, sport);
        let v = p
            .decide(
                Hook::Forward,
                &PolicyPacket {
                    src,
                    sport,
                    now_ms: ms,
                    conn: c,
                    ..packet()
                },
            )
            .verdict;
        if v == Verdict::Accept {
            p.conn_confirmed(&c);
        }
        v
    }

    #[test]
    fn ct_count_counts_open_connections_per_element() {
        use sluice_engine::Policy as _;
        let p = pol(
            "table ip t {\n set per_src { type ipv4_addr; flags dynamic; }\n \
             chain f {\n type filter hook forward priority 0; policy accept;\n \
             tcp dport 22 ct state new add @per_src { ip saddr ct count over 2 } reject with tcp reset\n \
             tcp dport 25 ct count over 1 drop\n \
             }\n}\n",
        );
        assert!(p.counts_connections());
        assert!(
            !pol("table ip t { chain f { type filter hook forward priority 0; } }")
                .counts_connections()
        );
        let conn = ssh_conn;
        let new = new_ssh_conn;
        let rst = Verdict::Reject(RejectWith::TcpReset);
        assert_eq!(new(&p, 1, 1000, 0), Verdict::Accept);
        assert_eq!(new(&p, 1, 1001, 0), Verdict::Accept);
        assert_eq!(new(&p, 1, 1002, 0), rst, "a third from the same source");
        assert_eq!(new(&p, 2, 1000, 0), Verdict::Accept, "another source");
        // `ctl set list` shows each element's open connections (the
        // refused one still counts within its millisecond).
        let listed = p
            .dynamic_set_elements("ip t per_src", 0)
            .unwrap_or_else(|| panic!("no set"));
        let conns: Vec<(u128, Option<u64>)> =
            listed.iter().map(|e| (e.key[0], e.connections)).collect();
        assert_eq!(
            conns,
            [(0xffff_0000_0001, Some(3)), (0xffff_0000_0002, Some(1))]
        );
        // The refused one stops counting a millisecond later; one of the
        // two open ones closes: room for one more, not two.
        p.conn_closed(&conn(1, 1000));
        assert_eq!(new(&p, 1, 1003, 1), Verdict::Accept);
        assert_eq!(new(&p, 1, 1004, 2), rst);
        // An update keeps the counts.
        let (q, _) = p
            .apply_text("cmd", "add rule ip t f tcp dport 1 accept")
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(new(&q, 1, 1005, 3), rst);
        // Deleting the element deletes its count.
        let (q, _) = q
            .apply_text("cmd", "delete element ip t per_src { 0.0.0.1 }")
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(new(&q, 1, 1006, 4), Verdict::Accept);
        assert_eq!(new(&q, 1, 1007, 4), Verdict::Accept);
        assert_eq!(new(&q, 1, 1008, 4), rst);
        let _ = q;
        // A rule's own count: one list for every source.
        let smtp = |p: &CompiledPolicy, src: u128, sport: u16| {
            let mut c = conn(src, sport);
            c.dport = 25;
            p.decide(
                Hook::Forward,
                &PolicyPacket {
                    src,
                    sport,
                    dport: 25,
                    now_ms: 10,
                    conn: c,
                    ..packet()
                },
            )
            .verdict
        };
        assert_eq!(smtp(&p, 7, 1), Verdict::Accept);
        assert_eq!(smtp(&p, 8, 1), Verdict::Drop, "a second source, same rule");
        assert!(
            pol("table ip t { chain f { type filter hook forward priority 0; ct count 3 } }")
                .counts_connections()
        );
    }

    #[test]
    fn an_expired_element_comes_back_without_its_connections() {
        let p = pol(
            "table ip t {\n set s { type ipv4_addr; flags dynamic; timeout 1s; }\n \
             chain f {\n type filter hook forward priority 0; policy accept;\n \
             tcp dport 22 add @s { ip saddr ct count over 1 } drop\n }\n}\n",
        );
        let new = |sport: u16, ms: u64| new_ssh_conn(&p, 0x0a00_0001, sport, ms);
        assert_eq!(new(1, 0), Verdict::Accept);
        assert_eq!(new(2, 10), Verdict::Drop, "two open, over one");
        // The element expired at 1 s (connection 1 is still open): added
        // again, it starts from none, as the kernel's new element does.
        assert_eq!(new(3, 2_000), Verdict::Accept);
    }

    #[test]
    fn numgen_counts_per_rule_and_draws_at_the_asked_rate() {
        let p = pol(
            "table ip t {\n chain f {\n type filter hook forward priority 0; policy accept;\n \
             udp dport 1 numgen inc mod 3 offset 5 6 drop\n \
             udp dport 2 numgen random mod 2147483648 < 536870912 drop\n }\n}\n",
        );
        let v = |p: &CompiledPolicy, dport| {
            p.decide(
                Hook::Forward,
                &PolicyPacket {
                    proto: 17,
                    dport,
                    ..packet()
                },
            )
            .verdict
        };
        // 5, 6, 7, 5, 6, 7: the second of every three matches.
        let seq: Vec<bool> = (0..6).map(|_| v(&p, 1) == Verdict::Drop).collect();
        assert_eq!(seq, [false, true, false, false, true, false]);
        // An update keeps the counter (next is 5, then 6).
        let (q, _) = p
            .apply_text("cmd", "add rule ip t f tcp dport 1 accept")
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(v(&q, 1), Verdict::Accept);
        assert_eq!(v(&q, 1), Verdict::Drop);
        // Probability 1/4.
        let n = 40_000;
        let hits = (0..n).filter(|_| v(&p, 2) == Verdict::Drop).count();
        assert!((9_000..11_000).contains(&hits), "{hits} of {n}");
    }

    #[test]
    fn routing_facts_are_asked_for_only_when_a_rule_reads_them() {
        use sluice_engine::Policy as _;
        let plain = pol(
            "table ip t {\n chain f {\n type filter hook forward priority 0; policy accept;\n \
             tcp dport 22 drop\n }\n}\n",
        );
        assert!(!plain.needs_routing_facts());
        let fib = pol(
            "table ip t {\n chain f {\n type filter hook prerouting priority 0; policy accept;\n \
             fib saddr . iif oif missing drop\n }\n}\n",
        );
        assert!(fib.needs_routing_facts());
        let typ = pol(
            "table ip t {\n chain f {\n type filter hook input priority 0; policy accept;\n \
             fib daddr type broadcast drop\n }\n}\n",
        );
        assert!(typ.needs_routing_facts());
        // An update that adds such a rule turns it on; one that does not,
        // does not.
        let (same, _) = plain
            .apply_text("cmd", "add rule ip t f udp dport 53 accept")
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(!same.needs_routing_facts());
        let (now, _) = plain
            .apply_text("cmd", "add rule ip t f fib daddr type local drop")
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(now.needs_routing_facts());
    }

    #[test]
    fn a_log_before_a_statement_that_stops_the_rule_still_logs() {
        // Each quota is used up by the first packet (60 bytes over 10):
        // the rule stops at it, after its log for port 22, before its log
        // for port 23.
        let p = pol(
            "table ip t {\n chain f {\n type filter hook forward priority 0; policy accept;\n \
             tcp dport 22 log prefix \"before: \" quota until 10 bytes drop\n \
             tcp dport 23 quota until 10 bytes log prefix \"after: \" drop\n }\n}\n",
        );
        let at = |dport| PolicyPacket {
            dport,
            now_ms: 5000,
            ..packet()
        };
        for _ in 0..150 {
            assert_eq!(p.decide(Hook::Forward, &at(23)).verdict, Verdict::Accept);
        }
        assert_eq!(
            p.logs_suppressed(),
            0,
            "no line: the log comes after the quota"
        );
        for _ in 0..150 {
            assert_eq!(p.decide(Hook::Forward, &at(22)).verdict, Verdict::Accept);
        }
        assert_eq!(
            p.logs_suppressed(),
            50,
            "a line each: 100 a second, the rest counted"
        );
    }

    #[test]
    fn log_rules_are_marked_and_their_lines_rate_limited() {
        let p = pol(
            "table ip t {\n chain f {\n type filter hook forward priority 0; policy accept;\n tcp dport 22 log prefix \"ssh: \" accept\n tcp dport 23 accept\n }\n}\n",
        );
        let rules: Vec<RuleId> = p
            .store
            .chain_handles(ChainId(0))
            .filter_map(|h| p.store.entry(h).and_then(|e| e.rules.first().map(|r| r.id)))
            .collect();
        assert_eq!(rules.len(), 2);
        assert_eq!(
            p.counters.add_and_log(rules[0], 60),
            Some(0),
            "the ssh rule logs"
        );
        assert_eq!(p.counters.add_and_log(rules[1], 60), None);
        let pk = PolicyPacket {
            now_ms: 5000,
            ..packet()
        };
        for _ in 0..150 {
            assert_eq!(p.decide(Hook::Forward, &pk).verdict, Verdict::Accept);
        }
        let suppressed = || p.logs_suppressed();
        assert_eq!(suppressed(), 50, "100 lines a second, the rest counted");
        // A derived generation shares the budget.
        let (q, _) = p
            .apply_text("cmd", "add rule ip t f udp dport 53 log accept")
            .unwrap_or_else(|e| panic!("{e}"));
        q.decide(Hook::Forward, &pk);
        assert_eq!(suppressed(), 51);
    }
}
