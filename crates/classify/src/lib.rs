//! `sluice-classify`: the compiled packet classifier and the reference linear
//! evaluator that proves it.
//!
//! # What this crate owns
//!
//! * [`ir`]: the rule IR the ruleset crate lowers nft / iptables ASTs into —
//!   [`PacketFields`] (the packet view), [`Match`] conditions (value / CIDR /
//!   range / set as normalized [`ValueSet`]s, negation, masked matches,
//!   interface-name wildcards, concatenated sets), [`Stmt`] non-terminal
//!   statements, [`Verdict`]s, [`Chain`]s and a [`Program`].
//! * [`eval_linear`]: netfilter semantics, literally — walk every rule.
//! * [`Classifier`]: the compiled form (tuple space search with priority
//!   pruning; see [`compiled`] for the algorithm and citations) with
//!   incremental [`Classifier::insert_rule`] / [`Classifier::delete_rule`].
//! * [`gen`]: seeded rule-set and packet generators for tests and benches.
//! * [`bench`](mod@bench): the bodies of `sluice bench rules` / `sluice bench update`
//!   (the caller passes the clock).
//!
//! # Semantics (both evaluators)
//!
//! First match in rule order. A matching rule runs its statements in order
//! (`meta mark set` / `ct mark set` change the packet view seen by later
//! rules), is appended to [`Scratch::trace`], and then applies its verdict;
//! without one, evaluation continues with the next rule. `jump` pushes a
//! return point (at most [`MAX_DEPTH`], else [`EvalError::DepthExceeded`]),
//! `goto` does not; `return` or the end of a regular chain pops; an empty stack
//! (end or `return` of the base chain) applies the base chain's policy.
//!
//! # Invariants
//!
//! * For every program and packet, [`Classifier::eval`] returns the same
//!   [`Outcome`] and trace as [`eval_linear`] (differential tests in `tests/`).
//! * A published [`Classifier`] is immutable; updates run on a shallow clone
//!   and copy only the chunks and shards they touch.
//! * Nothing here panics on packet data, allocates during `eval` (after the
//!   scratch has grown), or reads a clock.
//! * [`Classifier::compile`] of a chain of at least 8192 rules compiles half
//!   of them on a second (scoped) thread; the result does not depend on it.
#![forbid(unsafe_code)]

pub mod bench;
pub mod compiled;
pub mod gen;
pub mod ir;
pub mod linear;
mod persist;

pub use compiled::{Classifier, Placement, UpdateError, BATCH};
pub use ir::*;
pub use linear::{
    eval_linear, EvalError, Final, LimitCtx, Limits, Outcome, Scratch, MAX_CHAIN_ENTRIES,
    MAX_DEPTH, REACHED_COUNTER, REACHED_LOG,
};

/// Anything that classifies: the compiled [`Classifier`] or a [`Program`]
/// walked linearly. Lets a benchmark time both through one loop.
pub trait Evaluate {
    /// Evaluates one packet from base chain `base`.
    fn evaluate(&self, base: ChainId, pkt: &PacketFields, s: &mut Scratch) -> Outcome;
}

impl Evaluate for Classifier {
    #[inline]
    fn evaluate(&self, base: ChainId, pkt: &PacketFields, s: &mut Scratch) -> Outcome {
        self.eval(base, pkt, s)
    }
}

impl Evaluate for Program {
    #[inline]
    fn evaluate(&self, base: ChainId, pkt: &PacketFields, s: &mut Scratch) -> Outcome {
        eval_linear(self, base, pkt, s)
    }
}

/// The body of a lookup benchmark: classifies every packet `rounds` times and
/// returns a checksum of the outcomes (so the work cannot be optimized away).
/// The caller owns the clock: time this call and divide by
/// `pkts.len() * rounds`.
pub fn bench_lookup<E: Evaluate + ?Sized>(
    e: &E,
    base: ChainId,
    pkts: &[PacketFields],
    rounds: usize,
    s: &mut Scratch,
) -> u64 {
    let mut sum = 0u64;
    for _ in 0..rounds {
        for p in pkts {
            let o = e.evaluate(base, p, s);
            sum = sum
                .wrapping_mul(31)
                .wrapping_add(o.rule.map_or(u64::MAX, |r| r.0));
        }
    }
    sum
}
