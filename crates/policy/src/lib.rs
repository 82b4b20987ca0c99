//! `sluice-policy`: compiles a parsed [`sluice_ruleset::Ruleset`] into the
//! policy the engine runs, and explains its decisions (`sluice trace`).
//!
//! # What this crate owns
//!
//! * Lowering ([`CompiledPolicy::compile`]): AST -> [`sluice_classify::Program`].
//!   Implicit dependencies are made explicit the way nft adds them
//!   (`tcp dport 22` -> `l4proto == tcp`, `dport == 22`; `ip saddr` in an
//!   `inet` table -> `nfproto == ipv4`); named and anonymous sets become
//!   `ValueSet`s or `ConcatSet`s; verdict maps and `dnat to … map` become
//!   one rule per element (map keys are disjoint, a miss continues, so
//!   first-match order is preserved). NAT statements become
//!   `Verdict::Nat(id)` into a table of [`NatAction`]s, whose SNAT pools form
//!   [`CompiledPolicy::nat_config`].
//! * Netfilter's cross-chain semantics ([`CompiledPolicy::run_hook`]): the
//!   base chains of a hook run in priority order; accept continues with the
//!   next base chain, drop and reject are final; a chain's policy applies
//!   when no rule decides; `type nat` chains run only for `ct state new`,
//!   and the first NAT chain that translates ends NAT for the hook.
//! * [`CompiledPolicy`] implements [`sluice_engine::Policy`].
//! * [`CompiledPolicy::trace`]: the verdict of a described packet along its
//!   hook path, with the matched rules and the deciding rule's `FILE:LINE`.
//!
//! # Invariants
//!
//! * No match is ever dropped: a construct the IR cannot express is a
//!   [`LowerError`] at its source location, and every such error in the
//!   rule set is reported at once ([`CompileError`]). Refused today:
//!   `redirect`, IPv6 NAT, `numgen inc ... vmap`,
//!   masks on sets or concatenations, ordering comparisons on interfaces,
//!   a mark change before a map lookup in a rule matching that mark, and NAT reachable
//!   from a filter chain.
//! * Approximations (documented, verdict-preserving for the traffic the
//!   engine handles): `th sport/dport` match only
//!   TCP/UDP/DCCP/SCTP/UDP-Lite; `ip6 nexthdr` is the layer-4 protocol.
//! * `limit rate [over]` is a match on token buckets shared by the workers
//!   ([`limits`]); the trace treats every limit as within its rate.
//! * `counter` counts per rule at run time ([`counters`]); `log` writes a
//!   line per matching packet (rate-limited, [`limits::LogBudget`]).
//! * Incremental updates ([`CompiledPolicy::apply`], from nft's `add rule`,
//!   `insert rule`, `delete rule … handle H`, `add element`, `delete
//!   element`) derive the next generation from the running one in time
//!   independent of the number of rules (see `live` and `update`); a refused
//!   command leaves the running generation untouched.
//! * A [`CompiledPolicy`] is immutable; a new rule set is a new value,
//!   published by atomic swap (`arc-swap` in the daemon).
//! * The trace evaluates with the compiled classifier *and* the linear
//!   reference; they must agree (debug builds assert it).
//! * Nothing here panics on configuration or packet input.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod conncount;
pub mod counters;
pub mod dynset;
mod error;
mod iface;
pub mod limits;
mod live;
mod lower;
mod policy;
mod trace;
mod update;

pub use error::{CompileError, LowerError};
pub use iface::Interfaces;
pub use lower::{BaseInfo, ChainInfo, DnatRange, NatAction, RuleInfo, RuleLocation};
pub use policy::{
    ast_hook, ct_bits, engine_reject, CompiledPolicy, Evaluator, HookOutcome, HookVerdict,
    ListedObject,
};
pub use trace::{
    default_ct_status, hook_name, parse_addr_type, parse_ct, parse_ct_direction, parse_ct_status,
    parse_dscp, parse_hook, parse_length, parse_mac, parse_pkttype, parse_proto, parse_rpf,
    parse_tcp_flags, parse_u32, parse_wall_time, path, ChainTrace, HookTrace, NatReport, NatType,
    PacketError, RuleTrace, Trace, TracePacket, TraceState, TraceVerdict,
};
pub use update::{Applied, ListedRule, UpdateFailure};
