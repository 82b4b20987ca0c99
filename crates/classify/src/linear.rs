//! The reference evaluator: a literal walk of every rule, netfilter semantics.
//! It is the oracle the compiled classifier is tested against.

use crate::ir::{ct, ChainId, ChainKind, Policy, Program, RejectKind, RuleId, Stmt, Verdict};
use crate::PacketFields;

/// Jump stack depth, as the kernel's `NFT_JUMP_STACK_SIZE`.
pub const MAX_DEPTH: usize = 16;
/// Chain entries (jump + goto) allowed per evaluation; a guard, never reached
/// by a validated (acyclic) program of sane size.
pub const MAX_CHAIN_ENTRIES: u32 = 4096;

/// Why an evaluation stopped without a verdict.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, thiserror::Error)]
pub enum EvalError {
    /// More than [`MAX_DEPTH`] nested jumps.
    #[error("jump stack depth exceeded")]
    DepthExceeded,
    /// A jump/goto or the start chain does not exist or is not allowed.
    #[error("unknown chain")]
    UnknownChain,
    /// More than [`MAX_CHAIN_ENTRIES`] chain entries.
    #[error("chain entry limit exceeded")]
    ChainLimit,
}

/// Final verdict of one evaluation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Final {
    /// Accept (by rule or policy).
    Accept,
    /// Drop (by rule or policy).
    Drop,
    /// Reject.
    Reject(RejectKind),
    /// NAT action id.
    Nat(u32),
    /// Evaluation error; the engine drops and counts it.
    Error(EvalError),
}

impl From<Policy> for Final {
    fn from(p: Policy) -> Self {
        match p {
            Policy::Accept => Final::Accept,
            Policy::Drop => Final::Drop,
        }
    }
}

/// Result of one evaluation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Outcome {
    /// Verdict.
    pub verdict: Final,
    /// Rule that decided it; `None` for a policy or an error.
    pub rule: Option<RuleId>,
    /// Packet mark after the statements that ran.
    pub mark: u32,
    /// Conntrack mark after the statements that ran.
    pub ct_mark: u32,
    /// `ct state` after the statements that ran ([`Stmt::Notrack`] makes a
    /// packet without a connection untracked).
    pub ct_state: u8,
}

/// Reusable per-worker scratch: the call stack and the trace of matched rules
/// (every rule that matched, in execution order; its statements ran).
#[derive(Clone, Debug, Default)]
pub struct Scratch {
    pub(crate) stack: Vec<(ChainId, u64)>,
    /// Matched rules, in order. Cleared at the start of each evaluation.
    pub trace: Vec<RuleId>,
    /// Rules that did not match because a statement stopped them (a
    /// `limit`, quota, set operation ...) after their `counter` or `log`
    /// statement had run, with which ([`REACHED_COUNTER`],
    /// [`REACHED_LOG`]): the kernel counts and logs their packets. Cleared
    /// with `trace`.
    pub counted: Vec<(RuleId, u8)>,
    /// The compiled classifier's per-lookup merge state.
    pub(crate) heads: Vec<crate::compiled::Head>,
    /// [`crate::Classifier::eval_batch`]: tags and heads of a group.
    pub(crate) tags: Vec<u32>,
    pub(crate) bheads: Vec<crate::compiled::Head>,
    /// Rate limiters for `limit` statements; `None`: every limit is
    /// within its rate (the rule matches).
    pub limit: Option<LimitCtx>,
}

/// [`Scratch::counted`]: the rule's `counter` ran before it stopped.
pub const REACHED_COUNTER: u8 = 1;
/// [`Scratch::counted`]: the rule's `log` ran before it stopped.
pub const REACHED_LOG: u8 = 2;

/// The token buckets of `limit` statements ([`Stmt::Limit`]).
pub trait Limits: Send + Sync {
    /// Whether the rule holding `Stmt::Limit(id)` matches a packet of
    /// `len` bytes at `now_ms`; takes from the bucket.
    fn matches(&self, id: u32, now_ms: u64, len: u32) -> bool;

    /// Whether the rule holding [`Stmt::SetOp`] `id` goes on for packet
    /// `p` of `len` bytes at `now_ms`, after the operation's side effect
    /// (an element added, refreshed or deleted). Without dynamic sets:
    /// `stateless`.
    fn set_op(&self, id: u32, p: &PacketFields, now_ms: u64, len: u32, stateless: bool) -> bool {
        let _ = (id, p, now_ms, len);
        stateless
    }

    /// Whether the rule holding [`Stmt::Quota`] `id` matches a packet of
    /// `len` bytes, which it adds to the quota's used bytes. Without
    /// quotas: `stateless`.
    fn quota(&self, id: u32, len: u32, stateless: bool) -> bool {
        let _ = (id, len);
        stateless
    }

    /// Whether the rule holding [`Stmt::Obj`] `id` goes on for a packet of
    /// `len` bytes at `now_ms`: a named counter counts it and goes on, a
    /// named quota adds it to its used bytes and answers, a named limit
    /// takes from its bucket. Without objects: `stateless`.
    fn object(&self, id: u32, now_ms: u64, len: u32, stateless: bool) -> bool {
        let _ = (id, now_ms, len);
        stateless
    }

    /// Whether the rule holding [`Stmt::CtCount`] `id` matches packet `p`
    /// at `now_ms`, once its connection is counted. Without connection
    /// counts: `stateless`.
    fn ct_count(&self, id: u32, p: &PacketFields, now_ms: u64, stateless: bool) -> bool {
        let _ = (id, p, now_ms);
        stateless
    }

    /// Whether the rule holding [`Stmt::Numgen`] `id` matches: the next
    /// generated number is in its set. Without generators: `stateless`.
    fn numgen(&self, id: u32, stateless: bool) -> bool {
        let _ = id;
        stateless
    }
}

/// What an evaluation needs for `limit` statements.
#[derive(Clone)]
pub struct LimitCtx {
    /// The buckets.
    pub limits: std::sync::Arc<dyn Limits>,
    /// The packet's time (ms, monotonic).
    pub now_ms: u64,
    /// The packet's length (bytes, for byte rates).
    pub len: u32,
}

impl core::fmt::Debug for LimitCtx {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("LimitCtx")
            .field("now_ms", &self.now_ms)
            .field("len", &self.len)
            .finish_non_exhaustive()
    }
}

impl Scratch {
    /// Empty scratch with room for the usual depth.
    pub fn new() -> Self {
        Scratch {
            stack: Vec::with_capacity(MAX_DEPTH),
            trace: Vec::with_capacity(16),
            counted: Vec::new(),
            heads: Vec::with_capacity(32),
            tags: Vec::new(),
            bheads: Vec::new(),
            limit: None,
        }
    }
}

/// Applies a rule's statements to the packet view (marks); the others are
/// side effects the engine performs from the trace. A `limit` is a match:
/// when one says no (its bucket, `limit`), the rule does not match after
/// all, nothing is applied and `false` is returned.
#[inline]
pub(crate) fn run_stmts(
    stmts: &[Stmt],
    p: &mut PacketFields,
    limit: Option<&LimitCtx>,
    reached: &mut u8,
) -> bool {
    // The statements that are matches, in rule order: the first that says
    // no ends the rule; the side effects of the ones before it stay, as in
    // the kernel (a dynamic set's element is added even if a later limit
    // stops the rule).
    for s in stmts {
        let ok = match (s, limit) {
            (Stmt::Counter, _) => {
                *reached |= REACHED_COUNTER;
                true
            }
            (Stmt::Log(_), _) => {
                *reached |= REACHED_LOG;
                true
            }
            (Stmt::Limit(id), Some(l)) => l.limits.matches(*id, l.now_ms, l.len),
            (Stmt::SetOp { id, stateless }, Some(l)) => {
                l.limits.set_op(*id, p, l.now_ms, l.len, *stateless)
            }
            (Stmt::SetOp { stateless, .. }, None) => *stateless,
            (Stmt::Quota { id, stateless }, Some(l)) => l.limits.quota(*id, l.len, *stateless),
            (Stmt::Quota { stateless, .. }, None) => *stateless,
            (Stmt::Obj { id, stateless }, Some(l)) => {
                l.limits.object(*id, l.now_ms, l.len, *stateless)
            }
            (Stmt::Obj { stateless, .. }, None) => *stateless,
            (Stmt::Numgen { id, stateless }, Some(l)) => l.limits.numgen(*id, *stateless),
            (Stmt::Numgen { stateless, .. }, None) => *stateless,
            (Stmt::CtCount { id, stateless }, Some(l)) => {
                l.limits.ct_count(*id, p, l.now_ms, *stateless)
            }
            (Stmt::CtCount { stateless, .. }, None) => *stateless,
            // `meta mark set ct mark` loads the connection's mark first: a
            // packet without a connection stops the rule there.
            (Stmt::MarkFromCtMark, _) => ct::has_connection(p.ct_state),
            _ => true,
        };
        if !ok {
            return false;
        }
    }
    for s in stmts {
        match s {
            Stmt::MarkSet(op) => p.mark = op.apply(p.mark),
            Stmt::CtMarkSet(op) if ct::has_connection(p.ct_state) => {
                p.ct_mark = op.apply(p.ct_mark);
            }
            Stmt::MarkFromCtMark => p.mark = p.ct_mark,
            Stmt::CtMarkFromMark if ct::has_connection(p.ct_state) => p.ct_mark = p.mark,
            // No connection: nothing to mark.
            Stmt::CtMarkSet(_) | Stmt::CtMarkFromMark => {}
            Stmt::Notrack => {
                if p.ct_state == ct::INVALID {
                    p.ct_state = ct::UNTRACKED;
                }
            }
            Stmt::Counter
            | Stmt::Log(_)
            | Stmt::Limit(_)
            | Stmt::SetOp { .. }
            | Stmt::Quota { .. }
            | Stmt::Obj { .. }
            | Stmt::Numgen { .. }
            | Stmt::CtCount { .. }
            | Stmt::TcpMss(_)
            | Stmt::FlowAdd(_)
            | Stmt::CtTimeout { .. } => {}
        }
    }
    true
}

/// Evaluates `pkt` from base chain `base` by walking every rule in order.
pub fn eval_linear(prog: &Program, base: ChainId, pkt: &PacketFields, s: &mut Scratch) -> Outcome {
    let mut p = *pkt;
    s.trace.clear();
    s.counted.clear();
    s.stack.clear();
    let out = |v: Final, rule: Option<RuleId>, p: &PacketFields| Outcome {
        verdict: v,
        rule,
        mark: p.mark,
        ct_mark: p.ct_mark,
        ct_state: p.ct_state,
    };
    let policy = match prog.chains.get(base.0 as usize).map(|c| c.kind) {
        Some(ChainKind::Base(pol)) => pol,
        _ => return out(Final::Error(EvalError::UnknownChain), None, &p),
    };
    let mut chain = base;
    let mut idx = 0usize;
    let mut entries = 0u32;
    loop {
        let Some(c) = prog.chains.get(chain.0 as usize) else {
            return out(Final::Error(EvalError::UnknownChain), None, &p);
        };
        let mut hit = None;
        while let Some(r) = c.rules.get(idx) {
            if r.matches.iter().all(|m| m.matches(&p)) {
                hit = Some(r);
                break;
            }
            idx += 1;
        }
        let Some(r) = hit else {
            // End of chain: regular chains return, base chain applies policy.
            match s.stack.pop() {
                Some((c, i)) => {
                    chain = c;
                    idx = i as usize;
                    continue;
                }
                None => return out(policy.into(), None, &p),
            }
        };
        idx += 1;
        let mut reached = 0;
        if !run_stmts(&r.stmts, &mut p, s.limit.as_ref(), &mut reached) {
            if reached != 0 {
                s.counted.push((r.id, reached));
            }
            continue;
        }
        s.trace.push(r.id);
        match r.verdict {
            None => {}
            Some(Verdict::Accept) => return out(Final::Accept, Some(r.id), &p),
            Some(Verdict::Drop) => return out(Final::Drop, Some(r.id), &p),
            Some(Verdict::Reject(k)) => return out(Final::Reject(k), Some(r.id), &p),
            Some(Verdict::Nat(n)) => return out(Final::Nat(n), Some(r.id), &p),
            Some(Verdict::Return) => match s.stack.pop() {
                Some((c, i)) => {
                    chain = c;
                    idx = i as usize;
                }
                None => return out(policy.into(), None, &p),
            },
            Some(v @ (Verdict::Jump(t) | Verdict::Goto(t))) => {
                entries += 1;
                if entries > MAX_CHAIN_ENTRIES {
                    return out(Final::Error(EvalError::ChainLimit), Some(r.id), &p);
                }
                if matches!(v, Verdict::Jump(_)) {
                    if s.stack.len() >= MAX_DEPTH {
                        return out(Final::Error(EvalError::DepthExceeded), Some(r.id), &p);
                    }
                    s.stack.push((chain, idx as u64));
                }
                match prog.chains.get(t.0 as usize).map(|c| c.kind) {
                    Some(ChainKind::Regular) => {}
                    _ => return out(Final::Error(EvalError::UnknownChain), Some(r.id), &p),
                }
                chain = t;
                idx = 0;
            }
        }
    }
}
