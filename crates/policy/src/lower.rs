//! Lowering: ruleset AST -> classifier IR, plus the tables the IR refers to
//! by number (rule metadata, NAT actions, pools).
//!
//! Every AST match becomes one or more IR matches; nothing is dropped. What
//! the IR cannot express is an error at the construct's source location.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

use sluice_classify::ir::{
    self, map_v4, Chain, ChainId, ChainKind, ConcatSet, MarkOp, Program, Range, RejectKind, Rule,
    RuleId, Stmt, ValueSet,
};
use sluice_nat::{Pool, PoolId, Translation};
use sluice_ruleset::{
    self as ast, Elem, Family, Field, MapRef, NatAddr, NatKind, RelOp, Ruleset, Span, StmtKind,
    Table, Value,
};

use crate::error::LowerError;
use crate::iface::Interfaces;

/// Protocols that have a port pair at the start of their header (`th`):
/// TCP, UDP, DCCP, SCTP, UDP-Lite.
/// Chains with at least this many rules are lowered in two halves on two
/// threads ([`Lowerer::rules_in_halves`]).
const PAR_LOWER_MIN: usize = 8192;

const PORT_PROTOS: &[u8] = &[6, 17, 33, 132, 136];

/// Where an AST rule came from: `FILE:LINE` in the rule set, or the label
/// of the control command that added it. Formatted on demand
/// ([`std::fmt::Display`]), so loading a large rule set formats nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RuleLocation {
    /// Line `line` of the rule-set file `file`.
    Line {
        /// The file's name (shared by all its rules).
        file: Arc<str>,
        /// 1-based line.
        line: u32,
    },
    /// A label, e.g. `command handle 7`.
    Label(Arc<str>),
}

impl RuleLocation {
    /// The location of `span` in rule set `rs` (as [`Ruleset::location`]).
    pub fn of(rs: &Ruleset, span: Span) -> Self {
        let file = rs
            .files
            .get(span.file as usize)
            .map_or("<input>", String::as_str);
        RuleLocation::Line {
            file: file.into(),
            line: span.line,
        }
    }
}

impl std::fmt::Display for RuleLocation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RuleLocation::Line { file, line } => write!(f, "{file}:{line}"),
            RuleLocation::Label(l) => f.write_str(l),
        }
    }
}

/// Where an IR rule came from.
#[derive(Debug, Clone, PartialEq)]
pub struct RuleInfo {
    /// `FILE:LINE` of the AST rule (or the command that added it).
    pub location: RuleLocation,
    /// The AST rule's source span.
    pub span: Span,
    /// The AST rule, packed ([`RuleInfo::text`] prints it).
    pub rule: ast::PackedRule,
    /// The chain holding the rule.
    pub chain: ChainId,
    /// The exact `reject with` of the rule, if it rejects (the IR keeps only
    /// a coarse [`RejectKind`]).
    pub reject: Option<Option<ast::RejectWith>>,
    /// The AST rule's handle (what `delete rule … handle H` names); every IR
    /// rule lowered from one AST rule shares it.
    pub handle: u64,
}

impl RuleInfo {
    /// The AST rule in canonical nft form (printed on demand, so loading a
    /// large rule set does not format every rule).
    pub fn text(&self) -> String {
        self.rule.text()
    }
}

/// The rules of a rule set, taken out of its chains: `[table][chain][rule]`.
pub(crate) type RuleLists = Vec<Vec<Vec<ast::Rule>>>;

/// Moves every rule of `rs` out of its chain (leaving the declarations).
/// The lowerer keeps each rule packed ([`RuleSource`]), so the AST rules
/// can be freed as soon as they are lowered.
pub(crate) fn take_rules(rs: &mut Ruleset) -> RuleLists {
    rs.tables
        .iter_mut()
        .map(|t| {
            t.chains
                .iter_mut()
                .map(|c| std::mem::take(&mut c.rules))
                .collect()
        })
        .collect()
}

/// Frees what a rule holds (its matches, statements and comment), once it
/// is lowered and kept packed; the span and handle stay.
fn free_rule(r: &mut ast::Rule) {
    r.matches = Vec::new();
    r.stmts = Vec::new();
    r.comment = None;
}

/// What a policy keeps of one AST rule: the rule packed (about 90 bytes
/// instead of the AST's 560 for a typical rule) and the named sets and maps
/// it reads.
#[derive(Debug, Clone)]
pub(crate) struct RuleSource {
    pub packed: ast::PackedRule,
    pub uses: Vec<String>,
}

/// A chain of the lowered program.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChainInfo {
    /// `"FAMILY TABLE CHAIN"`, e.g. `"inet filter input"`.
    pub name: String,
    /// Family of the table (which packets its base chains see).
    pub family: Family,
    /// Hook registration, for base chains.
    pub base: Option<ast::BaseChain>,
}

/// A base chain, in evaluation order (hook, then priority, then declaration).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BaseInfo {
    /// The chain.
    pub chain: ChainId,
    /// Its hook.
    pub hook: ast::Hook,
    /// Its priority.
    pub priority: i32,
    /// `type nat`: only consulted for the first packet of a connection.
    pub nat: bool,
    /// Family of its table.
    pub family: Family,
}

/// The most fields a dynamic set's key may concatenate.
pub const MAX_SET_KEY: usize = 4;

/// A dynamic set's key: the fields' values ([`ir::PacketFields::get`]),
/// unused places zero.
pub type SetKey = [u128; MAX_SET_KEY];

/// A named set the packet path reads or changes (`flags dynamic`,
/// `timeout`, or the target of `add`/`update`/`delete @set`), indexed by
/// [`SetOpSpec::set`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DynSetSpec {
    /// `"FAMILY TABLE SET"`, e.g. `"inet filter ssh"`.
    pub name: String,
    /// Default element timeout, ms (`None`: elements stay until deleted).
    pub timeout_ms: Option<u64>,
    /// The most elements (`size`; default [`DEFAULT_SET_SIZE`]).
    pub size: u32,
    /// The key's types (how its values print).
    pub key_types: Vec<ast::DataType>,
    /// The elements the set is declared with.
    pub elements: Vec<SetKey>,
    /// For each of [`Self::elements`], when it expires, in ms after the
    /// rule set starts (`CompiledPolicy::start_timers`): its `expires`,
    /// else its own `timeout`, else the set's (as the kernel times a
    /// declared element from the load); `None`: never.
    pub expires: Vec<Option<u64>>,
}

/// A named object (`counter NAME { ... }`, `quota NAME { ... }`), indexed
/// by the id in [`ir::Stmt::Obj`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjSpec {
    /// `"FAMILY TABLE NAME"`, e.g. `"inet filter http"`.
    pub name: String,
    /// What it holds when the rule set is loaded.
    pub state: ast::ObjState,
}

impl ObjSpec {
    /// Counter, quota or limit.
    pub fn kind(&self) -> ast::ObjKind {
        self.state.kind()
    }
}

/// One `numgen` match: the generator and the numbers it matches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NumgenSpec {
    /// `random` (else `inc`).
    pub random: bool,
    /// Numbers are drawn from `0..modulus`, then `offset` is added.
    pub modulus: u32,
    pub offset: u32,
    /// The numbers compared with, inclusive ranges.
    pub ranges: Vec<(u128, u128)>,
    /// `!=`: the rule matches numbers outside them.
    pub negate: bool,
}

impl NumgenSpec {
    /// Whether generated number `v` matches.
    pub fn matches(&self, v: u32) -> bool {
        let v = u128::from(v);
        self.ranges.iter().any(|&(lo, hi)| lo <= v && v <= hi) != self.negate
    }
}

/// nft's default size of a set the packet path fills.
pub const DEFAULT_SET_SIZE: u32 = 65_535;

/// What a [`SetOpSpec`] does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SetOpKind {
    /// `KEY @set` (`negate`: `KEY != @set`): a match.
    Lookup {
        /// `!=`.
        negate: bool,
    },
    /// `add @set { ... }`.
    Add,
    /// `update @set { ... }`.
    Update,
    /// `delete @set { ... }`.
    Delete,
}

/// Where one value of a dynamic set's key comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeySrc {
    /// A field of the packet.
    Field(ir::Field),
    /// A constant (`ip saddr . 22`), encoded as the field's values are.
    Const(u128),
}

/// One dynamic-set operation of a rule, indexed by the id in
/// [`ir::Stmt::SetOp`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SetOpSpec {
    /// The set, an index into the dynamic sets.
    pub set: u32,
    /// The key's values.
    pub key: Vec<KeySrc>,
    /// The operation.
    pub kind: SetOpKind,
    /// The element's timeout (`add`/`update`), ms; default: the set's.
    pub timeout_ms: Option<u64>,
    /// A `limit` kept per element.
    pub limit: Option<ast::Limit>,
    /// A `ct count` kept per element (after the `limit` and `quota`).
    pub ct_count: Option<ast::CtCount>,
    /// A byte `quota` kept per element (after the `limit`).
    pub quota: Option<ast::Quota>,
}

/// One NAT action, indexed by the id in [`ir::Verdict::Nat`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NatAction {
    /// What the engine does.
    pub translation: Translation,
    /// The address a trace reports: the DNAT target, or the first address
    /// of an SNAT pool; `None` for masquerade.
    pub addr: Option<Ipv4Addr>,
    /// The port a trace reports: only when the rule fixes a single port.
    pub port: Option<u16>,
    /// `dnat to A-B`: the range each new connection's target is chosen
    /// from ([`NatAction::translation_for`]), and whether the choice is
    /// `persistent`; `translation` and `addr` then hold `A`.
    pub dnat_range: Option<DnatRange>,
    /// `dnat to ADDR:LO-HI`: the port range (`translation`'s port is then
    /// `None`; [`NatAction::translation_for`] chooses).
    pub dnat_ports: Option<(u16, u16)>,
    /// `masquerade to :LO-HI`: the ports the rule allows. Masquerade takes
    /// its ports from the gateway's `[nat] masquerade_ports`, which must
    /// lie within them (the gateway checks,
    /// [`crate::CompiledPolicy::masquerade_port_ranges`]).
    pub masq_ports: Option<(u16, u16)>,
}

/// The addresses of `dnat to A-B [persistent]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DnatRange {
    /// First address.
    pub lo: Ipv4Addr,
    /// Last address.
    pub hi: Ipv4Addr,
    /// `persistent`: the choice depends on the source address only.
    pub persistent: bool,
}

impl NatAction {
    /// The translation for a new connection from `src` to `dst`: for `dnat
    /// to A-B`, the address the kernel's `nf_nat` chooses
    /// (`find_best_ips_proto`): the client's address hashed (`jhash2` of
    /// the tuple's 16-byte source field, keyed with the destination
    /// address unless `persistent`) and scaled onto the range, so a
    /// client goes to the same target every time; otherwise
    /// [`Self::translation`].
    ///
    /// For `dnat to ADDR:LO-HI`, the port as the kernel's `nf_nat` keeps or
    /// chooses it for a destination rewrite (`get_unique_tuple`,
    /// `nf_nat_l4proto_unique_tuple`): the original destination port
    /// `dport` when it lies in the range, else the range's first port
    /// (the kernel would try the next ones only if that tuple were taken,
    /// which needs the same client endpoint twice; Sluice does not model
    /// that).
    pub fn translation_for(&self, src: Ipv4Addr, dst: Ipv4Addr, dport: u16) -> Translation {
        match self.translation {
            Translation::Dnat { addr, port } => Translation::Dnat {
                addr: self.dnat_range.map_or(addr, |r| r.pick(src, dst)),
                port: match self.dnat_ports {
                    Some((lo, hi)) if (lo..=hi).contains(&dport) => Some(dport),
                    Some((lo, _)) => Some(lo),
                    None => port,
                },
            },
            t => t,
        }
    }
}

impl DnatRange {
    /// The kernel's choice for a connection from `src` to `dst`.
    pub fn pick(&self, src: Ipv4Addr, dst: Ipv4Addr) -> Ipv4Addr {
        let (lo, hi) = (u32::from(self.lo), u32::from(self.hi));
        if lo >= hi {
            return self.lo;
        }
        // The tuple's fields as the kernel's u32 words: network-order
        // bytes read in the machine's order (little-endian here, as on the
        // kernels whose choices the oracle compares).
        let word = |a: Ipv4Addr| u32::from_le_bytes(a.octets());
        let key = if self.persistent { 0 } else { word(dst) };
        let j = jhash2(&[word(src), 0, 0, 0], key);
        let dist = hi - lo + 1;
        let off = ((u64::from(j) * u64::from(dist)) >> 32) as u32;
        Ipv4Addr::from(lo + off)
    }
}

/// The kernel's `jhash2` (Bob Jenkins' lookup3 `hashword`, as
/// `include/linux/jhash.h` has it).
fn jhash2(k: &[u32], initval: u32) -> u32 {
    let len = k.len() as u32;
    let (mut a, mut b, mut c) = {
        let v = 0xdead_beef_u32
            .wrapping_add(len.wrapping_shl(2))
            .wrapping_add(initval);
        (v, v, v)
    };
    let mix = |a: &mut u32, b: &mut u32, c: &mut u32| {
        *a = a.wrapping_sub(*c);
        *a ^= c.rotate_left(4);
        *c = c.wrapping_add(*b);
        *b = b.wrapping_sub(*a);
        *b ^= a.rotate_left(6);
        *a = a.wrapping_add(*c);
        *c = c.wrapping_sub(*b);
        *c ^= b.rotate_left(8);
        *b = b.wrapping_add(*a);
        *a = a.wrapping_sub(*c);
        *a ^= c.rotate_left(16);
        *c = c.wrapping_add(*b);
        *b = b.wrapping_sub(*a);
        *b ^= a.rotate_left(19);
        *a = a.wrapping_add(*c);
        *c = c.wrapping_sub(*b);
        *c ^= b.rotate_left(4);
        *b = b.wrapping_add(*a);
    };
    let mut rest = k;
    while rest.len() > 3 {
        a = a.wrapping_add(rest[0]);
        b = b.wrapping_add(rest[1]);
        c = c.wrapping_add(rest[2]);
        mix(&mut a, &mut b, &mut c);
        rest = &rest[3..];
    }
    if rest.is_empty() {
        return c;
    }
    if let Some(&x) = rest.get(2) {
        c = c.wrapping_add(x);
    }
    if let Some(&x) = rest.get(1) {
        b = b.wrapping_add(x);
    }
    a = a.wrapping_add(rest[0]);
    // __jhash_final
    c ^= b;
    c = c.wrapping_sub(b.rotate_left(14));
    a ^= c;
    a = a.wrapping_sub(c.rotate_left(11));
    b ^= a;
    b = b.wrapping_sub(a.rotate_left(25));
    c ^= b;
    c = c.wrapping_sub(b.rotate_left(16));
    a ^= c;
    a = a.wrapping_sub(c.rotate_left(4));
    b ^= a;
    b = b.wrapping_sub(a.rotate_left(14));
    c ^= b;
    c = c.wrapping_sub(b.rotate_left(24));
    c
}

/// The result of lowering a whole rule set.
#[derive(Debug, Clone)]
pub(crate) struct Lowered {
    pub program: Program,
    /// By IR rule id. Shared: the IR rules of one AST rule (a verdict
    /// map's elements) share one, and the rule store keeps them as they are.
    pub rules: Vec<Arc<RuleInfo>>,
    pub chains: Vec<ChainInfo>,
    pub bases: Vec<BaseInfo>,
    pub nat: Vec<NatAction>,
    pub pools: Vec<Pool>,
    pub logs: Vec<ast::Log>,
    pub limits: Vec<ast::Limit>,
    /// Dynamic sets, by the index in [`SetOpSpec::set`].
    pub sets: Vec<DynSetSpec>,
    /// Dynamic-set operations, by the id in [`ir::Stmt::SetOp`].
    pub set_ops: Vec<SetOpSpec>,
    /// `quota` statements, by the id in [`ir::Stmt::Quota`].
    pub quotas: Vec<ast::Quota>,
    /// `numgen` generators, by the id in [`ir::Stmt::Numgen`].
    pub numgens: Vec<NumgenSpec>,
    /// A rule's own `ct count`, by the id in [`ir::Stmt::CtCount`].
    pub ct_counts: Vec<ast::CtCount>,
    /// The `ct timeout` policy slots its rules give connections (one
    /// lease per slot), held as long as the rule set lives.
    pub ct_timeouts: Vec<sluice_engine::ct_timeout::Lease>,
    /// Named objects, by the id in [`ir::Stmt::Obj`] (every lowerer of a
    /// rule set declares the same ones, in table order).
    pub objects: Vec<ObjSpec>,
    /// One per AST rule lowered without error, in handle order.
    pub sources: Vec<RuleSource>,
}

/// How values of a field are encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Num,
    /// An EtherType compared with the packet's family (`meta protocol`):
    /// `ip` is IPv4, `ip6` IPv6, any other type none of the packets the
    /// hooks see.
    EtherType,
    Addr4,
    Addr6,
    Ifname,
    IfIndex,
}

/// An implicit condition a match depends on (nft's payload dependencies).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Dep {
    Proto(u8),
    PortProtos,
    V4,
    V6,
}

impl Dep {
    fn to_match(self) -> ir::Match {
        match self {
            Dep::Proto(p) => ir::Match::eq(ir::Field::L4Proto, u128::from(p)),
            Dep::PortProtos => ir::Match::in_ranges(
                ir::Field::L4Proto,
                PORT_PROTOS.iter().map(|p| Range::value(u128::from(*p))),
                false,
            ),
            Dep::V4 => ir::Match::eq(ir::Field::Family, ir::Family::V4 as u8 as u128),
            Dep::V6 => ir::Match::eq(ir::Field::Family, ir::Family::V6 as u8 as u128),
        }
    }
}

/// IR field, value encoding and dependencies of an AST field in a table of
/// family `fam`. The dependencies are static: lowering a rule allocates
/// nothing per field.
/// The IR field and encoding of a set declared with `type T`: the field
/// whose values have that type (e.g. `ipv4_addr`: `ip saddr`).
fn type_kind(d: ast::DataType, fam: Family) -> Result<(ir::Field, Kind), String> {
    use ast::DataType as D;
    let f = match d {
        D::Ipv4Addr => Field::IpSaddr,
        D::Ipv6Addr => Field::Ip6Saddr,
        D::InetService => Field::TcpDport,
        D::InetProto => Field::MetaL4proto,
        D::Mark => Field::MetaMark,
        D::Ifname => Field::Iifname,
        other => {
            return Err(format!(
                "a set of type {} cannot be used by the packet path yet",
                other.name()
            ))
        }
    };
    let fam = match (d, fam) {
        (D::Ipv4Addr, Family::Inet) => Family::Ip,
        (D::Ipv6Addr, Family::Inet) => Family::Ip6,
        _ => fam,
    };
    spec(f, fam).map(|(i, k, _)| (i, k))
}

fn spec(f: Field, fam: Family) -> Result<(ir::Field, Kind, &'static [Dep]), String> {
    let inet = fam == Family::Inet;
    let v4: &'static [Dep] = if inet { &[Dep::V4] } else { &[] };
    let v6: &'static [Dep] = if inet { &[Dep::V6] } else { &[] };
    let icmp: &'static [Dep] = if inet {
        &[Dep::Proto(1), Dep::V4]
    } else {
        &[Dep::Proto(1)]
    };
    let icmpv6: &'static [Dep] = if inet {
        &[Dep::Proto(58), Dep::V6]
    } else {
        &[Dep::Proto(58)]
    };
    const TCP: &[Dep] = &[Dep::Proto(6)];
    const UDP: &[Dep] = &[Dep::Proto(17)];
    const PORTS: &[Dep] = &[Dep::PortProtos];
    use ir::Field as I;
    Ok(match f {
        Field::Iifname => (I::IifName, Kind::Ifname, &[]),
        Field::Oifname => (I::OifName, Kind::Ifname, &[]),
        Field::Iif => (I::Iif, Kind::IfIndex, &[]),
        Field::Oif => (I::Oif, Kind::IfIndex, &[]),
        Field::MetaL4proto => (I::L4Proto, Kind::Num, &[]),
        Field::MetaNfproto => (I::Family, Kind::Num, &[]),
        Field::MetaProtocol | Field::EtherType => (I::Family, Kind::EtherType, &[]),
        Field::MetaMark => (I::Mark, Kind::Num, &[]),
        Field::CtMark => (I::CtMark, Kind::Num, &[]),
        Field::CtState => (I::CtState, Kind::Num, &[]),
        Field::CtStatus => (I::CtStatus, Kind::Num, &[]),
        Field::IpSaddr => (I::Saddr, Kind::Addr4, v4),
        Field::IpDaddr => (I::Daddr, Kind::Addr4, v4),
        Field::IpProtocol => (I::L4Proto, Kind::Num, v4),
        Field::Ip6Saddr => (I::Saddr, Kind::Addr6, v6),
        Field::Ip6Daddr => (I::Daddr, Kind::Addr6, v6),
        // The first next-header; equal to the layer-4 protocol when the
        // packet carries no extension headers (the only case the engine sees).
        Field::Ip6Nexthdr => (I::L4Proto, Kind::Num, v6),
        Field::TcpSport => (I::Sport, Kind::Num, TCP),
        Field::TcpDport => (I::Dport, Kind::Num, TCP),
        Field::TcpFlags => (I::TcpFlags, Kind::Num, TCP),
        Field::UdpSport => (I::Sport, Kind::Num, UDP),
        Field::UdpDport => (I::Dport, Kind::Num, UDP),
        // `th` reads the first four transport bytes; only protocols that put
        // ports there can match (documented approximation).
        Field::ThSport => (I::Sport, Kind::Num, PORTS),
        Field::ThDport => (I::Dport, Kind::Num, PORTS),
        Field::IcmpType => (I::IcmpType, Kind::Num, icmp),
        Field::IcmpCode => (I::IcmpCode, Kind::Num, icmp),
        Field::Icmpv6Type => (I::IcmpType, Kind::Num, icmpv6),
        Field::Icmpv6Code => (I::IcmpCode, Kind::Num, icmpv6),
        Field::IpTtl => (I::Ttl, Kind::Num, v4),
        Field::Ip6Hoplimit => (I::Ttl, Kind::Num, v6),
        Field::IpLength => (I::IpLen, Kind::Num, v4),
        Field::Ip6Length => (I::IpLen, Kind::Num, v6),
        Field::IpDscp => (I::Dscp, Kind::Num, v4),
        Field::Ip6Dscp => (I::Dscp, Kind::Num, v6),
        Field::MetaLength => (I::Length, Kind::Num, &[]),
        Field::MetaPkttype => (I::PktType, Kind::Num, &[]),
        Field::FibDaddrType => (I::DaddrType, Kind::Num, &[]),
        Field::FibSaddrType => (I::SaddrType, Kind::Num, &[]),
        Field::EtherSaddr => (I::EtherSaddr, Kind::Num, &[]),
        Field::EtherDaddr => (I::EtherDaddr, Kind::Num, &[]),
        Field::CtDirection => (I::CtDir, Kind::Num, &[]),
        Field::FibSaddrIifOif => (I::RpfIif, Kind::Num, &[]),
        Field::FibSaddrOif => (I::RpfAny, Kind::Num, &[]),
        // Only the left side of a `numgen` comparison, which is lowered
        // like a 32-bit number to get the numbers it matches.
        Field::Numgen => (I::Mark, Kind::Num, &[]),
        Field::MetaTime => (I::Time, Kind::Num, &[]),
        Field::MetaDay => (I::Day, Kind::Num, &[]),
        Field::MetaHour => (I::Hour, Kind::Num, &[]),
        Field::CtOrigIpSaddr => (I::CtOrigSaddr, Kind::Addr4, v4),
        Field::CtOrigIpDaddr => (I::CtOrigDaddr, Kind::Addr4, v4),
        Field::CtReplyIpSaddr => (I::CtReplySaddr, Kind::Addr4, v4),
        Field::CtReplyIpDaddr => (I::CtReplyDaddr, Kind::Addr4, v4),
        Field::CtOrigIp6Saddr => (I::CtOrigSaddr, Kind::Addr6, v6),
        Field::CtOrigIp6Daddr => (I::CtOrigDaddr, Kind::Addr6, v6),
        Field::CtReplyIp6Saddr => (I::CtReplySaddr, Kind::Addr6, v6),
        Field::CtReplyIp6Daddr => (I::CtReplyDaddr, Kind::Addr6, v6),
        Field::CtOrigProtoSrc => (I::CtOrigSport, Kind::Num, &[]),
        Field::CtOrigProtoDst => (I::CtOrigDport, Kind::Num, &[]),
        Field::CtReplyProtoSrc => (I::CtReplySport, Kind::Num, &[]),
        Field::CtReplyProtoDst => (I::CtReplyDport, Kind::Num, &[]),
        Field::IpFragOff => (I::FragOff, Kind::Num, v4),
    })
}

/// A map statement in a rule being lowered (an object map, or a mark
/// from a map): the number of statements before it, its key, and its
/// (element key, statement the element gives) pairs.
type ObjMapAt = (usize, Vec<Field>, Vec<(Value, Stmt)>);

/// The IR reject of a `reject [with ...]`.
/// The engine's form of a `ct timeout` object: its timers as conntrack's
/// ([`sluice_conntrack::TimeoutKind`]; `unreplied` is UDP's timer before
/// the flow is a stream, `replied` the stream's, `unack` the cap on a TCP
/// connection not yet assured; `retrans` has no timer in Sluice, which does
/// not count retransmissions), and its slot
/// ([`sluice_engine::ct_timeout`]).
pub(crate) fn intern_ct_timeout(
    c: &ast::CtTimeout,
) -> Result<sluice_engine::ct_timeout::Lease, sluice_engine::ct_timeout::Full> {
    sluice_engine::ct_timeout::intern(ct_timeout_spec(c))
}

/// The engine's form of a `ct timeout` object (see [`intern_ct_timeout`]).
pub(crate) fn ct_timeout_spec(c: &ast::CtTimeout) -> sluice_engine::ct_timeout::CtTimeout {
    use ast::CtTimeoutState as S;
    use sluice_conntrack::TimeoutKind as K;
    let mut policy = sluice_conntrack::TimeoutPolicy::default();
    for &(state, secs) in &c.policy {
        let kind = match state {
            S::SynSent => K::TcpSynSent,
            S::SynRecv => K::TcpSynRecv,
            S::Established => K::TcpEstablished,
            S::FinWait => K::TcpFinWait,
            S::CloseWait => K::TcpCloseWait,
            S::LastAck => K::TcpLastAck,
            S::TimeWait => K::TcpTimeWait,
            S::Close => K::TcpClose,
            S::SynSent2 => K::TcpSynSent2,
            S::Unack => K::TcpUnack,
            S::Unreplied => K::Udp,
            S::Replied => K::UdpStream,
            S::Retrans => continue,
        };
        policy.set(kind, std::time::Duration::from_secs(u64::from(secs)));
    }
    sluice_engine::ct_timeout::CtTimeout {
        proto: c.protocol,
        policy,
    }
}

fn reject_kind(w: Option<ast::RejectWith>) -> RejectKind {
    match w {
        Some(ast::RejectWith::TcpReset) => RejectKind::TcpReset,
        Some(
            ast::RejectWith::Icmp(13) | ast::RejectWith::Icmpv6(1) | ast::RejectWith::Icmpx(3),
        ) => RejectKind::IcmpAdminProhibited,
        _ => RejectKind::IcmpPortUnreachable,
    }
}

/// Prepends the (deduplicated) dependency conditions to a rule's matches;
/// the result has exactly the capacity it needs (a rule set holds many).
/// `ms` is left empty.
fn with_deps(deps: &[Dep], ms: &mut Vec<ir::Match>) -> Vec<ir::Match> {
    let mut n = 0;
    for (i, x) in deps.iter().enumerate() {
        if !deps.get(..i).is_some_and(|b| b.contains(x)) {
            n += 1;
        }
    }
    let mut out: Vec<ir::Match> = Vec::with_capacity(n + ms.len());
    for (i, x) in deps.iter().enumerate() {
        if !deps.get(..i).is_some_and(|b| b.contains(x)) {
            out.push(x.to_match());
        }
    }
    out.append(ms);
    out
}

/// The value range of a field's encoding.
fn domain(field: ir::Field, kind: Kind) -> (u128, u128) {
    match kind {
        Kind::Addr4 => (map_v4(0), map_v4(u32::MAX)),
        _ => (0, field.max()),
    }
}

/// An interface-name pattern as a range of [`ir::IfName::as_u128`] values: a
/// trailing `*` matches every name with that prefix.
fn ifname_range(p: &str) -> Range {
    match p.strip_suffix('*') {
        Some(pre) => {
            let bytes = pre.as_bytes();
            let n = bytes.len().min(15);
            let mut b = [0u8; 16];
            for (d, s) in b.iter_mut().zip(bytes.iter().take(n)) {
                *d = *s;
            }
            Range::prefix(u128::from_be_bytes(b), 8 * n as u32, 128)
        }
        None => Range::value(ir::IfName::new(p).as_u128()),
    }
}

/// A terminal action of an AST rule.
enum Term {
    Verdict(Option<ir::Verdict>),
    Reject(Option<ast::RejectWith>),
    Nat(u32),
    /// Map lookup: key fields and (key, verdict) pairs. A miss continues.
    Map(Vec<Field>, Vec<(Value, Option<ir::Verdict>)>),
    /// `numgen random ... vmap`: one rule per element, each a draw (a
    /// `numgen` statement) that gives the element's verdict when it holds;
    /// the draws are conditional, so that the first that holds is an
    /// element as likely as the kernel's one draw would pick it.
    Draws(Vec<(Stmt, Option<ir::Verdict>)>),
}

pub(crate) struct Lowerer<'a> {
    rs: &'a Ruleset,
    ifaces: &'a Interfaces,
    pub errors: Vec<LowerError>,
    chain_ids: HashMap<(usize, &'a str), ChainId>,
    out: Lowered,
    /// First IR rule id this lowerer hands out.
    id_base: u64,
    /// Next AST-rule handle.
    next_handle: u64,
    /// Location override for rules that come from a control command.
    location: Option<RuleLocation>,
    /// The rule set's file names, shared by the locations of their rules.
    files: Vec<Arc<str>>,
    /// Scratch for [`Self::rule`].
    scratch_deps: Vec<Dep>,
    scratch_matches: Vec<ir::Match>,
    scratch_pack: Vec<u8>,
    /// Chains with at least this many rules are lowered in two halves
    /// ([`PAR_LOWER_MIN`]; tests lower it).
    par_min: usize,
    /// Chains whose second half lowered on another thread was used.
    halves: usize,
}

impl<'a> Lowerer<'a> {
    pub fn new(rs: &'a Ruleset, ifaces: &'a Interfaces) -> Self {
        Lowerer {
            rs,
            ifaces,
            errors: Vec::new(),
            chain_ids: HashMap::new(),
            out: Lowered {
                program: Program::default(),
                rules: Vec::new(),
                chains: Vec::new(),
                bases: Vec::new(),
                nat: Vec::new(),
                pools: Vec::new(),
                logs: Vec::new(),
                limits: Vec::new(),
                sets: Vec::new(),
                set_ops: Vec::new(),
                quotas: Vec::new(),
                numgens: Vec::new(),
                ct_counts: Vec::new(),
                ct_timeouts: Vec::new(),
                objects: Vec::new(),
                sources: Vec::new(),
            },
            id_base: 0,
            next_handle: 1,
            location: None,
            files: rs.files.iter().map(|f| Arc::from(f.as_str())).collect(),
            scratch_deps: Vec::new(),
            scratch_matches: Vec::new(),
            scratch_pack: Vec::new(),
            par_min: PAR_LOWER_MIN,
            halves: 0,
        }
    }

    /// A lowerer for rules added to a running policy: IR ids start at
    /// `id_base`, handles at `handle`, and every table the IR refers to by
    /// number (NAT actions, pools, logs, limits, dynamic sets and their
    /// operations, quotas, number generators, connection counts, named
    /// objects) continues the running policy's `tables`.
    pub fn incremental(
        rs: &'a Ruleset,
        ifaces: &'a Interfaces,
        id_base: u64,
        handle: u64,
        tables: &crate::policy::Tables,
        location: RuleLocation,
    ) -> Self {
        let mut l = Lowerer::new(rs, ifaces);
        l.id_base = id_base;
        l.next_handle = handle;
        l.location = Some(location);
        let t = tables.clone();
        (l.out.nat, l.out.pools, l.out.logs, l.out.limits) = (t.nat, t.pools, t.logs, t.limits);
        (l.out.sets, l.out.set_ops, l.out.quotas) = (t.sets, t.set_ops, t.quotas);
        (l.out.numgens, l.out.ct_counts, l.out.objects) = (t.numgens, t.ct_counts, t.objects);
        l.out.ct_timeouts = t.ct_timeouts;
        l.declare();
        l
    }

    /// Lowers one AST rule of chain `cid` in table `ti` (after
    /// [`Self::incremental`]); returns its IR rules, or the errors.
    pub fn lower_one(
        &mut self,
        ti: usize,
        cid: ChainId,
        r: &ast::Rule,
    ) -> Result<Vec<Rule>, Vec<LowerError>> {
        let rs = self.rs;
        let Some(t) = rs.tables.get(ti) else {
            return Err(vec![LowerError::new(rs, r.span, "no such table")]);
        };
        let before = self.errors.len();
        if let Some(c) = self.out.program.chains.get_mut(cid.0 as usize) {
            c.rules.clear();
        }
        self.rule(ti, t, cid, r);
        if self.errors.len() > before {
            return Err(self.errors.split_off(before));
        }
        Ok(self
            .out
            .program
            .chains
            .get_mut(cid.0 as usize)
            .map(|c| std::mem::take(&mut c.rules))
            .unwrap_or_default())
    }

    /// The lowered tables (NAT actions, pools, logs, limits, rule infos).
    pub fn tables(&self) -> &Lowered {
        &self.out
    }

    fn err(&mut self, span: Span, msg: impl Into<String>) {
        self.errors.push(LowerError::new(self.rs, span, msg));
    }

    /// Lowers everything; errors are collected in [`Self::errors`].
    ///
    /// `rules` are the rule set's rules (see [`take_rules`]); `self.rs` is
    /// its declarations. Each rule is emptied ([`free_rule`]) once lowered
    /// without error: the policy keeps it packed ([`Lowered::sources`]),
    /// and freeing it here, on the thread that lowered it, lets the
    /// lowering's own allocations reuse its memory. The lists keep their
    /// lengths.
    pub fn run(self, rules: &mut RuleLists) -> (Lowered, Vec<LowerError>) {
        let (out, errors, _) = self.run_halves(rules);
        (out, errors)
    }

    /// [`Self::run`], also returning how many chains were lowered in two
    /// halves ([`Self::rules_in_halves`]).
    fn run_halves(mut self, rules: &mut RuleLists) -> (Lowered, Vec<LowerError>, usize) {
        let rs = self.rs;
        if !self.declare() {
            return (self.out, self.errors, 0);
        }
        // Pass 2: rules. The output vectors are sized up front (most rules
        // lower to one IR rule): growing them would copy and free large
        // buffers repeatedly.
        let total: usize = rules.iter().flatten().map(Vec::len).sum();
        self.out.rules.reserve(total);
        self.out.sources.reserve(total);
        for (ti, t) in rs.tables.iter().enumerate() {
            for (ci, c) in t.chains.iter().enumerate() {
                let Some(&cid) = self.chain_ids.get(&(ti, c.name.as_str())) else {
                    continue;
                };
                let list = rules.get_mut(ti).and_then(|t| t.get_mut(ci));
                let list = list.map_or(&mut [][..], Vec::as_mut_slice);
                if let Some(c) = self.out.program.chains.get_mut(cid.0 as usize) {
                    c.rules.reserve(list.len());
                }
                if list.len() >= self.par_min
                    && std::thread::available_parallelism().is_ok_and(|n| n.get() > 1)
                {
                    self.rules_in_halves(ti, t, cid, list);
                } else {
                    for r in list {
                        self.rule(ti, t, cid, r);
                        if self.errors.is_empty() {
                            free_rule(r);
                        }
                    }
                }
            }
        }
        self.check_nat_reachability();
        (self.out, self.errors, self.halves)
    }

    /// Lowers a large chain's rules: the second half on another thread,
    /// by a lowerer of its own, while this one lowers the first. Its IR
    /// rules and rule infos then follow this lowerer's, with their ids and
    /// handles moved up (what lowering them here would have numbered them).
    /// That is exact only when its rules added nothing to the shared tables
    /// (NAT actions, pools, logs, limits: their ids would differ) and
    /// failed nowhere; otherwise the second half is lowered again here, so
    /// the result, errors included, is always the sequential one.
    ///
    /// Both threads free their rules as they lower them ([`Self::run`]);
    /// the other thread only while it can still be absorbed, so that a
    /// second half lowered again here reads the rules it freed back from
    /// their packed forms (lossless) and the rest from the AST.
    fn rules_in_halves(&mut self, ti: usize, t: &Table, cid: ChainId, list: &mut [ast::Rule]) {
        let (first, second) = list.split_at_mut(list.len() / 2);
        let (rs, ifaces, files) = (self.rs, self.ifaces, self.files.clone());
        // Every rule of the first half takes one handle.
        let first_handle = self.next_handle + first.len() as u64;
        let (other, freed, second) = std::thread::scope(|scope| {
            let h = scope.spawn(move || {
                let mut l = Lowerer::new(rs, ifaces);
                l.next_handle = first_handle;
                l.files = files;
                l.declare();
                if let Some(c) = l.out.program.chains.get_mut(cid.0 as usize) {
                    c.rules.reserve(second.len());
                }
                l.out.rules.reserve(second.len());
                l.out.sources.reserve(second.len());
                let mut freed = 0;
                for r in second.iter_mut() {
                    l.rule(ti, t, cid, r);
                    if freed + 1 == l.out.sources.len() && l.absorbable() {
                        free_rule(r);
                        freed += 1;
                    }
                }
                (l, freed, second)
            });
            for r in first {
                self.rule(ti, t, cid, r);
                if self.errors.is_empty() {
                    free_rule(r);
                }
            }
            h.join().unwrap_or_else(|e| std::panic::resume_unwind(e))
        });
        let sources = match self.absorb(other, first_handle, cid) {
            Ok(()) => {
                self.halves += 1;
                return;
            }
            Err(sources) => sources,
        };
        for (i, r) in second.iter_mut().enumerate() {
            if i < freed {
                match sources.get(i).and_then(|s| s.packed.unpack()) {
                    Some(full) => self.rule(ti, t, cid, &full),
                    None => self.err(t.span, "internal: a packed rule does not unpack"),
                }
            } else {
                self.rule(ti, t, cid, r);
            }
            if self.errors.is_empty() {
                free_rule(r);
            }
        }
    }

    /// Whether [`Self::absorb`] would take what this lowerer has lowered so
    /// far: no errors, nothing added to a shared table. Once false, it
    /// stays false.
    fn absorbable(&self) -> bool {
        self.errors.is_empty()
            && self.out.nat.is_empty()
            && self.out.pools.is_empty()
            && self.out.logs.is_empty()
            && self.out.limits.is_empty()
            && self.out.sets.is_empty()
            && self.out.set_ops.is_empty()
            && self.out.quotas.is_empty()
            && self.out.numgens.is_empty()
            && self.out.ct_counts.is_empty()
            && self.out.ct_timeouts.is_empty()
    }

    /// Appends what `other` (a fresh lowerer: ids from 0, handles from
    /// `first_handle`)
    /// lowered into chain `cid` after this lowerer's rules; if it failed or
    /// added to a shared table, changes nothing and gives back its
    /// [`Lowered::sources`].
    fn absorb(
        &mut self,
        other: Lowerer<'_>,
        first_handle: u64,
        cid: ChainId,
    ) -> Result<(), Vec<RuleSource>> {
        if !other.absorbable() {
            return Err(other.out.sources);
        }
        let Lowerer {
            out: o,
            next_handle,
            ..
        } = other;
        let Some(mine) = self.out.program.chains.get_mut(cid.0 as usize) else {
            return Err(o.sources);
        };
        let Some(theirs) = o.program.chains.into_iter().nth(cid.0 as usize) else {
            return Err(o.sources);
        };
        let ids = self.id_base + self.out.rules.len() as u64;
        // `other` numbered its handles from `first_handle`, which is what
        // this lowerer hands out next unless a rule of the first half
        // failed before taking one (then the result is an error anyway, but
        // the numbering stays the sequential one): the shift is added
        // modulo 2^64, so it moves handles down as well as up.
        let handles = self.next_handle.wrapping_sub(first_handle);
        mine.rules.extend(theirs.rules.into_iter().map(|mut r| {
            r.id = RuleId(r.id.0 + ids);
            r
        }));
        if handles == 0 {
            self.out.rules.extend(o.rules);
        } else {
            self.out.rules.extend(o.rules.into_iter().map(|mut i| {
                let info = Arc::make_mut(&mut i);
                info.handle = info.handle.wrapping_add(handles);
                i
            }));
        }
        self.out.sources.extend(o.sources);
        self.next_handle += next_handle - first_handle;
        Ok(())
    }

    /// Pass 1: chains get ids (so jumps can refer forward), base chains are
    /// ordered. False when the rule set has too many chains.
    fn declare(&mut self) -> bool {
        let rs = self.rs;
        for (ti, t) in rs.tables.iter().enumerate() {
            for c in &t.chains {
                let Ok(n) = u32::try_from(self.out.program.chains.len()) else {
                    self.err(c.span, "too many chains");
                    return false;
                };
                let id = ChainId(n);
                self.chain_ids.insert((ti, c.name.as_str()), id);
                let kind = match &c.base {
                    Some(b) => ChainKind::Base(match b.policy {
                        ast::Policy::Accept => ir::Policy::Accept,
                        ast::Policy::Drop => ir::Policy::Drop,
                    }),
                    None => ChainKind::Regular,
                };
                self.out.program.chains.push(Chain {
                    name: format!("{} {} {}", t.family.name(), t.name, c.name),
                    kind,
                    rules: Vec::new(),
                });
                self.out.chains.push(ChainInfo {
                    name: format!("{} {} {}", t.family.name(), t.name, c.name),
                    family: t.family,
                    base: c.base,
                });
                if let Some(b) = &c.base {
                    self.out.bases.push(BaseInfo {
                        chain: id,
                        hook: b.hook,
                        priority: b.priority,
                        nat: b.chain_type == ast::ChainType::Nat,
                        family: t.family,
                    });
                }
            }
        }
        // Stable: ties keep declaration order, as `Ruleset::base_chains`.
        self.out.bases.sort_by_key(|b| (b.hook, b.priority));
        // Named objects: the ones a running policy has keep their ids (an
        // incremental lowerer starts with them).
        for t in &rs.tables {
            for o in &t.objects {
                let name = format!("{} {} {}", t.family.name(), t.name, o.name);
                if !self
                    .out
                    .objects
                    .iter()
                    .any(|x| x.kind() == o.kind() && x.name == name)
                {
                    self.out.objects.push(ObjSpec {
                        name,
                        state: o.state,
                    });
                }
            }
        }
        true
    }

    /// The id of the named object `name` of kind `kind` in table `t`.
    fn object(&self, t: &Table, kind: ast::ObjKind, name: &str) -> Result<u32, String> {
        let full = format!("{} {} {}", t.family.name(), t.name, name);
        match self
            .out
            .objects
            .iter()
            .position(|o| o.kind() == kind && o.name == full)
        {
            Some(i) => u32::try_from(i).map_err(|_| "too many named objects".into()),
            None => Err(format!(
                "no {} '{name}' in table {} {}",
                kind.name(),
                t.family.name(),
                t.name
            )),
        }
    }

    fn rule(&mut self, ti: usize, t: &Table, cid: ChainId, r: &ast::Rule) {
        // Scratch vectors reused across rules; the IR rule gets an exact copy.
        let mut deps = std::mem::take(&mut self.scratch_deps);
        let mut matches = std::mem::take(&mut self.scratch_matches);
        deps.clear();
        matches.clear();
        self.rule_with(ti, t, cid, r, &mut deps, &mut matches);
        matches.clear();
        self.scratch_deps = deps;
        self.scratch_matches = matches;
    }

    fn rule_with(
        &mut self,
        ti: usize,
        t: &Table,
        cid: ChainId,
        r: &ast::Rule,
        deps: &mut Vec<Dep>,
        matches: &mut Vec<ir::Match>,
    ) {
        let mut ok = true;
        let mut pre: Vec<Stmt> = Vec::new();
        for m in &r.matches {
            // A dynamic set's lookup reads the live elements: a match the
            // policy's state answers, in rule order before the statements.
            if let Value::SetRef(name) = &m.right {
                if let Some(set) = t.sets.iter().find(|s| &s.name == name) {
                    if set.is_dynamic() {
                        match self.set_lookup(t, set, m, deps) {
                            Ok(st) => pre.push(st),
                            Err(e) => {
                                self.err(m.span, e);
                                ok = false;
                            }
                        }
                        continue;
                    }
                }
            }
            match self.lower_match(t, m, deps) {
                Ok(m) => matches.push(m),
                Err(e) => {
                    self.err(m.span, e);
                    ok = false;
                }
            }
        }
        // `ct mark`, `ct status` and `ct direction` read the packet's
        // connection: on a packet without one (invalid, untracked) the
        // kernel's `nft_ct` stops the rule, whatever the comparison.
        if matches.iter().any(reads_connection) {
            use sluice_classify::ir::ct;
            matches.push(ir::Match::in_ranges(
                ir::Field::CtState,
                [ct::NEW, ct::ESTABLISHED, ct::RELATED].map(|b| ir::Range::value(u128::from(b))),
                false,
            ));
        }
        let mut term: Option<Term> = None;
        // An object map: where its statement goes among `pre`, the key and
        // (element key, object id) pairs.
        let mut objmap: Option<ObjMapAt> = None;
        for s in &r.stmts {
            let res: Result<Option<Term>, String> = match &s.kind {
                StmtKind::Counter { .. } => {
                    pre.push(Stmt::Counter);
                    Ok(None)
                }
                StmtKind::Log(l) => {
                    let id = self.out.logs.len() as u32;
                    self.out.logs.push(l.clone());
                    pre.push(Stmt::Log(id));
                    Ok(None)
                }
                StmtKind::Limit(l) => {
                    let id = self.out.limits.len() as u32;
                    self.out.limits.push(*l);
                    pre.push(Stmt::Limit(id));
                    Ok(None)
                }
                StmtKind::Quota(q) => match u32::try_from(self.out.quotas.len()) {
                    Ok(id) => {
                        self.out.quotas.push(*q);
                        pre.push(Stmt::Quota {
                            id,
                            stateless: !q.over,
                        });
                        Ok(None)
                    }
                    Err(_) => Err("too many quotas".into()),
                },
                StmtKind::SetUpdate(u) => self.set_update(t, u, deps).map(|st| {
                    pre.push(st);
                    None
                }),
                StmtKind::Numgen(n) => self.numgen(t, n, deps).map(|st| {
                    pre.push(st);
                    None
                }),
                StmtKind::ObjMap { kind, key, map } if objmap.is_none() => {
                    self.obj_map(t, *kind, map).map(|entries| {
                        let entries = entries
                            .into_iter()
                            .map(|(k, id)| (k, self.obj_stmt(id)))
                            .collect();
                        objmap = Some((pre.len(), key.clone(), entries));
                        None
                    })
                }
                StmtKind::MarkMap { ct, key, .. }
                    if key.contains(if *ct {
                        &Field::CtMark
                    } else {
                        &Field::MetaMark
                    }) =>
                {
                    // Its elements become rules in turn: a mark one sets
                    // could select the next one's key.
                    Err("a mark map keyed by the mark it sets cannot be lowered".into())
                }
                StmtKind::MarkMap { ct, key, map } if objmap.is_none() => {
                    self.mark_map(t, *ct, map).map(|entries| {
                        objmap = Some((pre.len(), key.clone(), entries));
                        None
                    })
                }
                StmtKind::ObjMap { .. } | StmtKind::MarkMap { .. } => {
                    Err("one object or mark map per rule can be lowered".into())
                }
                StmtKind::ObjRef { kind, name } => self.object(t, *kind, name).map(|id| {
                    pre.push(self.obj_stmt(id));
                    None
                }),
                StmtKind::CtCount(c) => match u32::try_from(self.out.ct_counts.len()) {
                    Ok(id) => {
                        self.out.ct_counts.push(*c);
                        pre.push(Stmt::CtCount {
                            id,
                            // Without state the packet's connection is
                            // the only one.
                            stateless: (c.count < 1) == c.over,
                        });
                        Ok(None)
                    }
                    Err(_) => Err("too many ct count statements".into()),
                },
                StmtKind::MetaMarkSet(v) => {
                    pre.push(Stmt::MarkSet(MarkOp::set(*v)));
                    Ok(None)
                }
                StmtKind::CtMarkSet(v) => {
                    pre.push(Stmt::CtMarkSet(MarkOp::set(*v)));
                    Ok(None)
                }
                StmtKind::MetaMarkMod { and, xor } => {
                    pre.push(Stmt::MarkSet(MarkOp {
                        and: *and,
                        xor: *xor,
                    }));
                    Ok(None)
                }
                StmtKind::CtMarkMod { and, xor } => {
                    pre.push(Stmt::CtMarkSet(MarkOp {
                        and: *and,
                        xor: *xor,
                    }));
                    Ok(None)
                }
                StmtKind::MetaMarkFromCt => {
                    pre.push(Stmt::MarkFromCtMark);
                    Ok(None)
                }
                StmtKind::CtMarkFromMeta => {
                    pre.push(Stmt::CtMarkFromMark);
                    Ok(None)
                }
                StmtKind::Notrack => {
                    pre.push(Stmt::Notrack);
                    Ok(None)
                }
                StmtKind::FlowAdd(name) => {
                    match t.flowtables.iter().position(|f| f.name == *name) {
                        Some(i) => {
                            pre.push(Stmt::FlowAdd(i as u32));
                            Ok(None)
                        }
                        None => Err(format!("no flowtable '{name}' in this table")),
                    }
                }
                // Kernel rule tracing; `sluice trace` is Sluice's.
                StmtKind::NftraceSet(_) => Ok(None),
                StmtKind::CtTimeoutSet(name) => {
                    match t.ct_timeouts.iter().find(|c| c.name == *name) {
                        Some(c) => match intern_ct_timeout(c) {
                            Ok(lease) => {
                                pre.push(Stmt::CtTimeout {
                                    id: u32::from(lease.slot()),
                                    proto: c.protocol,
                                });
                                // The rule set holds the slot for as long
                                // as it lives (`sluice_engine::ct_timeout`).
                                if !self
                                    .out
                                    .ct_timeouts
                                    .iter()
                                    .any(|l| l.slot() == lease.slot())
                                {
                                    self.out.ct_timeouts.push(lease);
                                }
                                Ok(None)
                            }
                            Err(e) => Err(e.to_string()),
                        },
                        None => Err(format!("no ct timeout '{name}' in this table")),
                    }
                }
                StmtKind::TcpMssSet(m) => {
                    // nft adds `meta l4proto tcp` for a TCP option
                    // statement: the rule does not match other packets.
                    deps.push(Dep::Proto(6));
                    pre.push(Stmt::TcpMss(match m {
                        ast::TcpMss::RtMtu => sluice_classify::ir::TCP_MSS_RT_MTU,
                        ast::TcpMss::Value(v) => u32::from(*v),
                    }));
                    Ok(None)
                }
                StmtKind::Verdict(v) => self.verdict(ti, v).map(|v| Some(Term::Verdict(v))),
                StmtKind::Reject(w) => Ok(Some(Term::Reject(*w))),
                StmtKind::Nat(n) => self.nat(t, n),
                StmtKind::VerdictMap { key, map } => self.vmap(ti, t, key, map),
                StmtKind::NumgenVmap {
                    random,
                    modulus,
                    offset,
                    map,
                } => self.numgen_vmap(ti, t, (*random, *modulus, *offset), map, r.span, deps),
            };
            match res {
                Ok(Some(tm)) => {
                    // Statements after a terminal one never run.
                    term = Some(tm);
                    break;
                }
                Ok(None) => {}
                Err(e) => {
                    self.err(s.span, e);
                    ok = false;
                    break;
                }
            }
        }
        if !ok {
            return;
        }
        let reject = match &term {
            Some(Term::Reject(w)) => Some(*w),
            _ => None,
        };
        let handle = self.next_handle;
        self.next_handle += 1;
        let packed = ast::PackedRule::pack_with(r, &mut self.scratch_pack);
        self.out.sources.push(RuleSource {
            packed: packed.clone(),
            uses: crate::live::named_uses(r),
        });
        let info = Arc::new(RuleInfo {
            location: match (&self.location, self.files.get(r.span.file as usize)) {
                (Some(l), _) => l.clone(),
                (None, Some(f)) => RuleLocation::Line {
                    file: Arc::clone(f),
                    line: r.span.line,
                },
                (None, None) => RuleLocation::of(self.rs, r.span),
            },
            span: r.span,
            rule: packed,
            chain: cid,
            reject,
            handle,
        });
        if let Some((split, key, entries)) = objmap {
            let verdict = match term {
                None => None,
                Some(Term::Verdict(v)) => v,
                Some(Term::Reject(w)) => Some(ir::Verdict::Reject(reject_kind(w))),
                Some(Term::Nat(id)) => Some(ir::Verdict::Nat(id)),
                Some(Term::Map(..) | Term::Draws(..)) => {
                    self.err(
                        r.span,
                        "an object map and a verdict or NAT map in one rule cannot be lowered; \
                         split the rule",
                    );
                    return;
                }
            };
            self.obj_map_rules(
                cid, info, t, r, deps, matches, pre, split, &key, &entries, verdict,
            );
            return;
        }
        match term {
            None => {
                let m = with_deps(deps, matches);
                self.push_rule(cid, info, m, pre, None);
            }
            Some(Term::Verdict(v)) => {
                let m = with_deps(deps, matches);
                self.push_rule(cid, info, m, pre, v);
            }
            Some(Term::Reject(w)) => {
                let m = with_deps(deps, matches);
                self.push_rule(cid, info, m, pre, Some(ir::Verdict::Reject(reject_kind(w))));
            }
            Some(Term::Nat(id)) => {
                let m = with_deps(deps, matches);
                self.push_rule(cid, info, m, pre, Some(ir::Verdict::Nat(id)));
            }
            Some(Term::Map(key, entries)) => {
                // `stmts… KEY vmap {k: v}`: the statements run whether or not
                // the lookup hits, so they get a rule of their own; the
                // per-element rules then repeat the rule's conditions. That
                // is exact unless a statement changes a mark those
                // conditions read (the key itself is read after the change
                // in the kernel too), so only that case is refused.
                if !pre.is_empty() {
                    let reads = |f: Field| r.matches.iter().any(|m| m.left.contains(&f));
                    if pre.iter().any(|s| match s {
                        Stmt::MarkSet(_) | Stmt::MarkFromCtMark => reads(Field::MetaMark),
                        Stmt::CtMarkSet(_) | Stmt::CtMarkFromMark => reads(Field::CtMark),
                        _ => false,
                    }) {
                        self.err(
                            r.span,
                            "a mark change before a map lookup, in a rule that also matches \
                             on that mark, cannot be lowered; split the rule",
                        );
                        return;
                    }
                    let m = with_deps(deps, &mut matches.clone());
                    self.push_rule(cid, Arc::clone(&info), m, pre, None);
                }
                let mut kdeps = deps.clone();
                let mut rules = Vec::new();
                for (k, v) in &entries {
                    match self.key_match(t, &key, k, &mut kdeps) {
                        Ok(km) => {
                            let mut ms = matches.clone();
                            ms.push(km);
                            rules.push((ms, *v));
                        }
                        Err(e) => {
                            self.err(r.span, e);
                            return;
                        }
                    }
                }
                for (mut ms, v) in rules {
                    let m = with_deps(&kdeps, &mut ms);
                    self.push_rule(cid, Arc::clone(&info), m, Vec::new(), v);
                }
            }
            Some(Term::Draws(draws)) => {
                // The statements before run once, in a rule of their own
                // (they run whatever the draw gives); each element's rule
                // repeats the conditions, draws, and on success gives its
                // verdict; when none holds the rule ends.
                if !pre.is_empty() {
                    if pre
                        .iter()
                        .any(|s| !matches!(s, Stmt::Counter | Stmt::Log(_)))
                    {
                        self.err(
                            r.span,
                            "only counters and logs can come before 'numgen ... vmap' in a \
                             rule; move the other statements to a rule of their own",
                        );
                        return;
                    }
                    let m = with_deps(deps, &mut matches.clone());
                    self.push_rule(cid, Arc::clone(&info), m, pre, None);
                }
                for (st, v) in draws {
                    let m = with_deps(deps, &mut matches.clone());
                    self.push_rule(cid, Arc::clone(&info), m, vec![st], v);
                }
            }
        }
    }

    /// The IR rules of a rule with an object map: the statements before
    /// the map in a rule of their own (they run whether or not the key is
    /// found, as in the kernel), then one rule per element, its key added
    /// to the conditions, with the element's object and the statements and
    /// verdict after the map (a key the map does not hold ends the rule).
    #[allow(clippy::too_many_arguments)]
    fn obj_map_rules(
        &mut self,
        cid: ChainId,
        info: Arc<RuleInfo>,
        t: &Table,
        r: &ast::Rule,
        deps: &[Dep],
        matches: &[ir::Match],
        pre: Vec<Stmt>,
        split: usize,
        key: &[Field],
        entries: &[(Value, Stmt)],
        verdict: Option<ir::Verdict>,
    ) {
        let (before, after) = pre.split_at(split.min(pre.len()));
        if !before.is_empty() {
            // Anything else could stop the rule (a limit, a quota, a named
            // quota) or change what its conditions read (a mark), which the
            // rule of its own would not carry over to the element rules.
            if before
                .iter()
                .any(|s| !matches!(s, Stmt::Counter | Stmt::Log(_)))
            {
                self.err(
                    r.span,
                    "only counters and logs can come before an object or mark map in a \
                     rule; move the other statements after it",
                );
                return;
            }
            let m = with_deps(deps, &mut matches.to_vec());
            self.push_rule(cid, Arc::clone(&info), m, before.to_vec(), None);
        }
        let mut kdeps = deps.to_vec();
        let mut rules = Vec::new();
        for (k, st) in entries {
            match self.key_match(t, key, k, &mut kdeps) {
                Ok(km) => {
                    let mut ms = matches.to_vec();
                    ms.push(km);
                    let mut stmts = Vec::with_capacity(after.len() + 1);
                    stmts.push(*st);
                    stmts.extend_from_slice(after);
                    rules.push((ms, stmts));
                }
                Err(e) => {
                    self.err(r.span, e);
                    return;
                }
            }
        }
        for (mut ms, stmts) in rules {
            let m = with_deps(&kdeps, &mut ms);
            self.push_rule(cid, Arc::clone(&info), m, stmts, verdict);
        }
    }

    /// The statement naming object `id`, with its answer without state: a
    /// counter goes on, a limit is within its rate, a quota is not used up.
    fn obj_stmt(&self, id: u32) -> Stmt {
        let stateless = match self.out.objects.get(id as usize).map(|o| o.state) {
            Some(ast::ObjState::Quota(q)) => !q.over,
            _ => true,
        };
        Stmt::Obj { id, stateless }
    }

    /// The (element key, mark statement) pairs of a mark map (`ct`: `ct
    /// mark set`).
    fn mark_map(&self, t: &Table, ct: bool, map: &MapRef) -> Result<Vec<(Value, Stmt)>, String> {
        let mut out = Vec::new();
        for e in self.map_elems(t, map)? {
            let m = match &e.data {
                Some(Value::Num(n)) => u32::try_from(*n)
                    .map_err(|_| format!("mark map value {n} does not fit 32 bits"))?,
                _ => return Err("mark map element without a mark".into()),
            };
            let op = MarkOp::set(m);
            out.push((
                e.key.clone(),
                if ct {
                    Stmt::CtMarkSet(op)
                } else {
                    Stmt::MarkSet(op)
                },
            ));
        }
        Ok(out)
    }

    /// The (element key, object id) pairs of an object map.
    fn obj_map(
        &self,
        t: &Table,
        kind: ast::ObjKind,
        map: &MapRef,
    ) -> Result<Vec<(Value, u32)>, String> {
        let mut out = Vec::new();
        for e in self.map_elems(t, map)? {
            match &e.data {
                Some(Value::Str(n)) => out.push((e.key.clone(), self.object(t, kind, n)?)),
                _ => {
                    return Err(format!(
                        "{} map element without a {}",
                        kind.name(),
                        kind.name()
                    ))
                }
            }
        }
        Ok(out)
    }

    fn push_rule(
        &mut self,
        cid: ChainId,
        info: Arc<RuleInfo>,
        matches: Vec<ir::Match>,
        stmts: Vec<Stmt>,
        verdict: Option<ir::Verdict>,
    ) {
        let id = RuleId(self.id_base + self.out.rules.len() as u64);
        self.out.rules.push(info);
        if let Some(c) = self.out.program.chains.get_mut(cid.0 as usize) {
            c.rules.push(Rule {
                id,
                matches,
                stmts,
                verdict,
            });
        }
    }

    fn verdict(&self, ti: usize, v: &ast::Verdict) -> Result<Option<ir::Verdict>, String> {
        Ok(match v {
            ast::Verdict::Accept => Some(ir::Verdict::Accept),
            ast::Verdict::Drop => Some(ir::Verdict::Drop),
            ast::Verdict::Return => Some(ir::Verdict::Return),
            ast::Verdict::Continue => None,
            ast::Verdict::Jump(n) | ast::Verdict::Goto(n) => {
                let id = self
                    .chain_ids
                    .get(&(ti, n.as_str()))
                    .copied()
                    .ok_or_else(|| format!("no such chain '{n}'"))?;
                if matches!(v, ast::Verdict::Jump(_)) {
                    Some(ir::Verdict::Jump(id))
                } else {
                    Some(ir::Verdict::Goto(id))
                }
            }
        })
    }

    fn map_elems<'t>(&self, t: &'t Table, map: &'t MapRef) -> Result<&'t [Elem], String> {
        match map {
            MapRef::Anon(e) => Ok(e),
            MapRef::Named(n) => t
                .map(n)
                .map(|m| m.elements.as_slice())
                .ok_or_else(|| format!("no such map '{n}'")),
        }
    }

    fn vmap(
        &self,
        ti: usize,
        t: &Table,
        key: &[Field],
        map: &MapRef,
    ) -> Result<Option<Term>, String> {
        let mut entries = Vec::new();
        for e in self.map_elems(t, map)? {
            let v = match &e.data {
                Some(Value::Verdict(v)) => self.verdict(ti, v)?,
                _ => return Err("verdict map element without a verdict".to_string()),
            };
            entries.push((e.key.clone(), v));
        }
        Ok(Some(Term::Map(key.to_vec(), entries)))
    }

    /// `numgen random mod N [offset O] vmap { V : VERDICT, ... }` as
    /// conditional draws: with `left` the numbers no earlier element
    /// holds (of the `N` the generator gives, `O` to `O + N - 1`), an
    /// element holding `c` of them is taken by a draw `numgen random mod
    /// left < c`, which holds with the probability `c / left` that the
    /// kernel's one draw lands on it given it missed the earlier ones; so
    /// each element is taken with probability `c / N`, and the rule ends
    /// (no element) with the probability of the numbers no element holds.
    /// `numgen inc` would need one counter read by several rules and is
    /// refused.
    fn numgen_vmap(
        &mut self,
        ti: usize,
        t: &Table,
        (random, modulus, offset): (bool, u32, u32),
        map: &MapRef,
        span: ast::Span,
        deps: &mut Vec<Dep>,
    ) -> Result<Option<Term>, String> {
        if !random {
            return Err(
                "'numgen inc ... vmap' cannot be lowered (one counter read by several \
                        rules); use 'numgen random', or 'numgen inc' compared with each value \
                        in rules of their own"
                    .into(),
            );
        }
        let (lo, hi) = (
            u64::from(offset),
            u64::from(offset) + u64::from(modulus) - 1,
        );
        let mut left = u64::from(modulus);
        let mut draws = Vec::new();
        for e in self.map_elems(t, map)? {
            let v = match &e.data {
                Some(Value::Verdict(v)) => self.verdict(ti, v)?,
                _ => return Err("verdict map element without a verdict".to_string()),
            };
            let (a, b) = match &e.key {
                Value::Num(x) => (*x, *x),
                Value::Range(a, b) => match (&**a, &**b) {
                    (Value::Num(a), Value::Num(b)) => (*a, *b),
                    _ => return Err("numgen map keys are numbers or ranges".to_string()),
                },
                _ => return Err("numgen map keys are numbers or ranges".to_string()),
            };
            let c = b.min(hi).saturating_add(1).saturating_sub(a.max(lo));
            if c == 0 || left == 0 {
                continue;
            }
            let draw = ast::Numgen {
                random: true,
                modulus: u32::try_from(left).map_err(|_| "numgen modulus out of range")?,
                offset: 0,
                m: ast::Match {
                    left: Field::Numgen.into(),
                    mask: None,
                    op: ast::RelOp::Lt,
                    right: Value::Num(c),
                    span,
                    right_span: span,
                },
            };
            draws.push((self.numgen(t, &draw, deps)?, v));
            left -= c;
        }
        Ok(Some(Term::Draws(draws)))
    }

    fn nat(&mut self, t: &Table, n: &ast::Nat) -> Result<Option<Term>, String> {
        let v4 = |a: &IpAddr| match a {
            IpAddr::V4(a) => Ok(*a),
            IpAddr::V6(_) => Err("IPv6 NAT cannot be lowered: Sluice translates NAT44 only"),
        };
        let single_port = n.ports.and_then(|(lo, hi)| (lo == hi).then_some(lo));
        match n.kind {
            NatKind::Redirect => Err("'redirect' cannot be lowered yet; NAT44 translations \
                                      are snat, dnat and masquerade"
                .to_string()),
            NatKind::Masquerade => {
                if let Some((lo, hi)) = n.ports {
                    if lo > hi {
                        return Err(format!("masquerade port range {lo}-{hi} is empty"));
                    }
                }
                Ok(Some(Term::Nat(self.nat_action(NatAction {
                    translation: Translation::Masquerade,
                    addr: None,
                    port: None,
                    dnat_range: None,
                    dnat_ports: None,
                    masq_ports: n.ports,
                }))))
            }
            NatKind::Snat => {
                let (first, last) = match &n.addr {
                    Some(NatAddr::Single(a)) => (v4(a)?, v4(a)?),
                    Some(NatAddr::Range(a, b)) => (v4(a)?, v4(b)?),
                    Some(NatAddr::Map { key, map }) => {
                        // One rule per element, each with the element's
                        // address as its pool (as `dnat to … map`).
                        let mut entries = Vec::new();
                        for e in self.map_elems(t, map)? {
                            let a = match &e.data {
                                Some(Value::Addr(a)) => v4(a)?,
                                _ => return Err("snat map element is not an address".to_string()),
                            };
                            let id = self.snat_action(a, a, n.ports, single_port)?;
                            entries.push((e.key.clone(), Some(ir::Verdict::Nat(id))));
                        }
                        return Ok(Some(Term::Map(key.clone(), entries)));
                    }
                    None => return Err("snat without an address".to_string()),
                };
                Ok(Some(Term::Nat(self.snat_action(
                    first,
                    last,
                    n.ports,
                    single_port,
                )?)))
            }
            NatKind::Dnat => {
                let dnat_ports = n.ports.filter(|(lo, hi)| lo != hi);
                if dnat_ports.is_some_and(|(lo, hi)| lo > hi) {
                    return Err("dnat port range is empty".to_string());
                }
                let mut dnat_range = None;
                let addr = match &n.addr {
                    Some(NatAddr::Single(a)) => v4(a)?,
                    Some(NatAddr::Range(a, b)) if a == b => v4(a)?,
                    Some(NatAddr::Range(a, b)) => {
                        let (lo, hi) = (v4(a)?, v4(b)?);
                        if lo > hi {
                            return Err(format!("dnat address range {lo}-{hi} is empty"));
                        }
                        dnat_range = Some(DnatRange {
                            lo,
                            hi,
                            persistent: n.flags.contains(&ast::NatFlag::Persistent),
                        });
                        lo
                    }
                    Some(NatAddr::Map { key, map }) => {
                        let mut entries = Vec::new();
                        for e in self.map_elems(t, map)? {
                            let a = match &e.data {
                                Some(Value::Addr(a)) => v4(a)?,
                                _ => return Err("dnat map element is not an address".to_string()),
                            };
                            let id = self.nat_action(NatAction {
                                translation: Translation::Dnat {
                                    addr: a,
                                    port: single_port,
                                },
                                addr: Some(a),
                                port: single_port,
                                dnat_range: None,
                                dnat_ports,
                                masq_ports: None,
                            });
                            entries.push((e.key.clone(), Some(ir::Verdict::Nat(id))));
                        }
                        return Ok(Some(Term::Map(key.clone(), entries)));
                    }
                    None => return Err("dnat without an address".to_string()),
                };
                Ok(Some(Term::Nat(self.nat_action(NatAction {
                    translation: Translation::Dnat {
                        addr,
                        port: single_port,
                    },
                    addr: Some(addr),
                    port: single_port,
                    dnat_range,
                    dnat_ports,
                    masq_ports: None,
                }))))
            }
        }
    }

    /// The NAT action of `snat to FIRST-LAST[:PORTS]`, its pool made or
    /// found.
    fn snat_action(
        &mut self,
        first: Ipv4Addr,
        last: Ipv4Addr,
        ports: Option<(u16, u16)>,
        single_port: Option<u16>,
    ) -> Result<u32, String> {
        let span = u32::from(last).wrapping_sub(u32::from(first));
        if u32::from(last) < u32::from(first) || span >= 65_536 {
            return Err("snat address range is empty or larger than a /16".to_string());
        }
        let mut pool = Pool::from_range(first, last);
        if let Some((lo, hi)) = ports {
            pool = pool.with_ports(lo..=hi);
        }
        let idx = match self.out.pools.iter().position(|p| *p == pool) {
            Some(i) => i,
            None => {
                self.out.pools.push(pool);
                self.out.pools.len() - 1
            }
        };
        let pool_id = PoolId(u16::try_from(idx).map_err(|_| "too many snat pools".to_string())?);
        Ok(self.nat_action(NatAction {
            translation: Translation::Snat { pool: pool_id },
            addr: Some(first),
            port: single_port,
            dnat_range: None,
            dnat_ports: None,
            masq_ports: None,
        }))
    }

    fn nat_action(&mut self, a: NatAction) -> u32 {
        if let Some(i) = self.out.nat.iter().position(|x| *x == a) {
            return i as u32;
        }
        self.out.nat.push(a);
        (self.out.nat.len() - 1) as u32
    }

    /// One scalar value (or a prefix / range of them) as a range.
    fn scalar(&self, field: ir::Field, kind: Kind, v: &Value) -> Result<Range, String> {
        match (kind, v) {
            (Kind::Num, Value::Num(n)) => {
                let n = u128::from(*n);
                if n > field.max() {
                    return Err(format!("value {n} is out of range"));
                }
                Ok(Range::value(n))
            }
            (Kind::EtherType, Value::Num(n)) => Ok(Range::value(match *n {
                0x0800 => ir::Family::V4 as u128,
                0x86dd => ir::Family::V6 as u128,
                // No packet of an IP hook has another family.
                _ => 0,
            })),
            (Kind::EtherType, Value::Range(a, b)) => {
                // A range holding both is every packet; one of them, that
                // family; neither, none.
                let (a, b) = match (&**a, &**b) {
                    (Value::Num(a), Value::Num(b)) => (*a, *b),
                    _ => return Err("an EtherType range takes numbers".into()),
                };
                let has = |t: u64| a <= t && t <= b;
                Ok(match (has(0x0800), has(0x86dd)) {
                    (true, true) => Range::new(ir::Family::V4 as u128, ir::Family::V6 as u128),
                    (true, false) => Range::value(ir::Family::V4 as u128),
                    (false, true) => Range::value(ir::Family::V6 as u128),
                    (false, false) => Range::value(0),
                })
            }
            (Kind::IfIndex, Value::Num(n)) => Ok(Range::value(u128::from(*n))),
            (Kind::IfIndex, Value::Str(s)) => match self.ifaces.index(s) {
                Some(i) => Ok(Range::value(u128::from(i))),
                None => Err(format!(
                    "interface '{s}' does not exist; iif/oif need a known interface \
                     (use iifname/oifname for interfaces that come and go)"
                )),
            },
            (Kind::Ifname, Value::Str(s)) => Ok(ifname_range(s)),
            (Kind::Addr4, Value::Addr(IpAddr::V4(a))) => Ok(Range::value(map_v4(u32::from(*a)))),
            (Kind::Addr6, Value::Addr(IpAddr::V6(a))) => Ok(Range::value(u128::from(*a))),
            (Kind::Addr4, Value::Prefix { addr, len }) => match addr {
                IpAddr::V4(a) => Ok(Range::v4_cidr(u32::from(*a), u32::from(*len))),
                IpAddr::V6(_) => Err("IPv6 prefix where an IPv4 address is expected".into()),
            },
            (Kind::Addr6, Value::Prefix { addr, len }) => match addr {
                IpAddr::V6(a) => Ok(Range::prefix(u128::from(*a), u32::from(*len), 128)),
                IpAddr::V4(_) => Err("IPv4 prefix where an IPv6 address is expected".into()),
            },
            (_, Value::Range(a, b)) => {
                let lo = self.scalar(field, kind, a)?;
                let hi = self.scalar(field, kind, b)?;
                Ok(Range::new(lo.lo, hi.hi))
            }
            (_, other) => Err(format!("unexpected value {other:?} for this field")),
        }
    }

    /// The element keys of the right-hand side when it is a set.
    fn set_elems<'t>(&self, t: &'t Table, v: &'t Value) -> Result<Option<Vec<&'t Value>>, String> {
        match v {
            Value::Set(e) => Ok(Some(e.iter().map(|e| &e.key).collect())),
            Value::SetRef(n) => t
                .resolve_set(n)
                .map(|e| Some(e.iter().map(|e| &e.key).collect()))
                .ok_or_else(|| format!("no such set '{n}'")),
            _ => Ok(None),
        }
    }

    /// The index of dynamic set `set` of table `t`, registered (with its
    /// declared elements) on first use.
    fn dyn_set(&mut self, t: &Table, set: &ast::Set) -> Result<u32, String> {
        let name = format!("{} {} {}", t.family.name(), t.name, set.name);
        if let Some(i) = self.out.sets.iter().position(|s| s.name == name) {
            return Ok(i as u32);
        }
        if set.key.len() > MAX_SET_KEY {
            return Err(format!(
                "set '{}': a set the packet path uses takes at most {MAX_SET_KEY} \
                 concatenated fields",
                set.name
            ));
        }
        let elements = self.set_elem_keys(t, set, &set.elements)?;
        let Ok(i) = u32::try_from(self.out.sets.len()) else {
            return Err("too many dynamic sets".into());
        };
        let expires = set
            .elements
            .iter()
            .map(|e| e.lifetime_ms().or(set.timeout_ms))
            .collect();
        self.out.sets.push(DynSetSpec {
            name,
            timeout_ms: set.timeout_ms,
            size: set.size.unwrap_or(DEFAULT_SET_SIZE),
            key_types: set.key.clone(),
            elements,
            expires,
        });
        Ok(i)
    }

    /// Elements of dynamic set `set` of table `t` as keys (the values in
    /// the encodings of the key's fields).
    pub(crate) fn set_elem_keys(
        &self,
        t: &Table,
        set: &ast::Set,
        elems: &[Elem],
    ) -> Result<Vec<SetKey>, String> {
        let fields: Vec<(ir::Field, Kind)> = match &set.key_typeof {
            Some(f) => f
                .iter()
                .map(|f| spec(*f, t.family).map(|(i, k, _)| (i, k)))
                .collect::<Result<_, _>>()?,
            None => set
                .key
                .iter()
                .map(|d| type_kind(*d, t.family))
                .collect::<Result<_, _>>()?,
        };
        let mut out = Vec::with_capacity(elems.len());
        for e in elems {
            // The same conversion as a set's elements in a match.
            let ranges = match fields.as_slice() {
                [(f, k)] => vec![self.scalar(*f, *k, &e.key)?].into_boxed_slice(),
                _ => self.concat_elem(&fields, &e.key)?,
            };
            let mut key: SetKey = [0; MAX_SET_KEY];
            for (slot, r) in key.iter_mut().zip(ranges.iter()) {
                if r.lo != r.hi {
                    return Err(format!(
                        "set '{}': a set the packet path uses holds single values, \
                         not ranges or prefixes",
                        set.name
                    ));
                }
                *slot = r.lo;
            }
            out.push(key);
        }
        Ok(out)
    }

    /// The key fields of a dynamic-set operation (with their dependencies).
    fn set_key(
        &self,
        t: &Table,
        key: &[Field],
        deps: &mut Vec<Dep>,
    ) -> Result<Vec<KeySrc>, String> {
        if key.len() > MAX_SET_KEY {
            return Err(format!(
                "a set key takes at most {MAX_SET_KEY} concatenated fields"
            ));
        }
        Ok(self
            .concat_fields(t, key, deps)?
            .into_iter()
            .map(|(f, _)| KeySrc::Field(f))
            .collect())
    }

    /// The key of an `add`/`update`/`delete` on `set`: fields and
    /// constants (in the set's key types' encodings).
    fn update_key(
        &self,
        t: &Table,
        set: &ast::Set,
        key: &[ast::KeyPart],
        deps: &mut Vec<Dep>,
    ) -> Result<Vec<KeySrc>, String> {
        if key.len() > MAX_SET_KEY {
            return Err(format!(
                "a set key takes at most {MAX_SET_KEY} concatenated fields"
            ));
        }
        let mut out = Vec::with_capacity(key.len());
        for (i, k) in key.iter().enumerate() {
            out.push(match k {
                ast::KeyPart::Field(f) => {
                    let (field, _, d) = spec(*f, t.family)?;
                    deps.extend_from_slice(d);
                    KeySrc::Field(field)
                }
                ast::KeyPart::Const(v) => {
                    let dt = set
                        .key
                        .get(i)
                        .copied()
                        .ok_or_else(|| format!("set '{}': the key is too long", set.name))?;
                    let (field, kind) = match set.key_typeof.as_ref().and_then(|f| f.get(i)) {
                        Some(f) => spec(*f, t.family).map(|(f, k, _)| (f, k))?,
                        None => type_kind(dt, t.family)?,
                    };
                    let r = self.scalar(field, kind, v)?;
                    if r.lo != r.hi {
                        return Err("a constant in a set key must be a single value".into());
                    }
                    KeySrc::Const(r.lo)
                }
            });
        }
        Ok(out)
    }

    fn push_set_op(&mut self, op: SetOpSpec, stateless: bool) -> Result<Stmt, String> {
        let Ok(id) = u32::try_from(self.out.set_ops.len()) else {
            return Err("too many set operations".into());
        };
        self.out.set_ops.push(op);
        Ok(Stmt::SetOp { id, stateless })
    }

    /// `KEY [!=] @set` on a dynamic set.
    fn set_lookup(
        &mut self,
        t: &Table,
        set: &ast::Set,
        m: &ast::Match,
        deps: &mut Vec<Dep>,
    ) -> Result<Stmt, String> {
        let negate = match (m.mask, m.op) {
            (None, RelOp::Implicit | RelOp::Eq) => false,
            (None, RelOp::Ne) => true,
            _ => {
                return Err(format!(
                    "only '@{0}' and '!= @{0}' can look up a dynamic set",
                    set.name
                ))
            }
        };
        let key = self.set_key(t, &m.left, deps)?;
        let id = self.dyn_set(t, set)?;
        self.push_set_op(
            SetOpSpec {
                set: id,
                key,
                kind: SetOpKind::Lookup { negate },
                timeout_ms: None,
                limit: None,
                ct_count: None,
                quota: None,
            },
            // Without state every dynamic set is empty.
            negate,
        )
    }

    /// `numgen inc|random mod N [offset O] OP VALUE`.
    fn numgen(&mut self, t: &Table, n: &ast::Numgen, deps: &mut Vec<Dep>) -> Result<Stmt, String> {
        let (ranges, negate) = match self.lower_match(t, &n.m, deps)? {
            ir::Match::In { set, negate, .. } => {
                (set.ranges().iter().map(|r| (r.lo, r.hi)).collect(), negate)
            }
            _ => return Err("numgen compares with a value, a range or a set".into()),
        };
        let spec = NumgenSpec {
            random: n.random,
            modulus: n.modulus,
            offset: n.offset,
            ranges,
            negate,
        };
        // Without state: the generator's first number (`inc`'s is the
        // offset; `random` is taken to start there too).
        let stateless = spec.matches(n.offset);
        let id = u32::try_from(self.out.numgens.len()).map_err(|_| "too many numgen matches")?;
        self.out.numgens.push(spec);
        Ok(Stmt::Numgen { id, stateless })
    }

    /// `add | update | delete @set { ... }`.
    fn set_update(
        &mut self,
        t: &Table,
        u: &ast::SetUpdate,
        deps: &mut Vec<Dep>,
    ) -> Result<Stmt, String> {
        let Some(set) = t.sets.iter().find(|s| s.name == u.set) else {
            return Err(format!("no such set '{}'", u.set));
        };
        let key = self.update_key(t, set, &u.key, deps)?;
        let id = self.dyn_set(t, set)?;
        self.push_set_op(
            SetOpSpec {
                set: id,
                key,
                kind: match u.op {
                    ast::SetOp::Add => SetOpKind::Add,
                    ast::SetOp::Update => SetOpKind::Update,
                    ast::SetOp::Delete => SetOpKind::Delete,
                },
                timeout_ms: u.timeout_ms,
                limit: u.limit,
                ct_count: u.ct_count,
                quota: u.quota,
            },
            // Without state an element's count is the packet's connection
            // and its quota has only the packet's bytes (taken as none).
            u.ct_count.is_none_or(|c| (c.count < 1) == c.over)
                && u.quota
                    .is_none_or(|q| (q.used_bytes() > q.bytes()) == q.over),
        )
    }

    fn lower_match(
        &self,
        t: &Table,
        m: &ast::Match,
        deps: &mut Vec<Dep>,
    ) -> Result<ir::Match, String> {
        let first = match m.left.as_slice() {
            [] => return Err("match without a field".to_string()),
            [f] => *f,
            _ => return self.concat_match(t, m, deps),
        };
        let (field, kind, d) = spec(first, t.family)?;
        let bitmask = first.datatype().is_bitmask();
        let max = field.max();
        let out = match (m.mask, m.op, &m.right) {
            (Some(mask), op, Value::Num(v)) => {
                let negate = match op {
                    RelOp::Implicit | RelOp::Eq => false,
                    RelOp::Ne => true,
                    _ => {
                        return Err(format!(
                            "masked comparison with '{}' cannot be lowered",
                            op.symbol()
                        ))
                    }
                };
                ir::Match::Masked {
                    field,
                    mask: u128::from(mask) & max,
                    value: u128::from(*v),
                    negate,
                }
            }
            (Some(_), _, _) => {
                return Err("a masked match against a set cannot be lowered".to_string())
            }
            // nft: a plain flag list on a bit-mask type means "any of these bits".
            (None, RelOp::Implicit, Value::Num(v)) if bitmask => ir::Match::Masked {
                field,
                mask: u128::from(*v) & max,
                value: 0,
                negate: true,
            },
            (None, RelOp::Ne, Value::Num(v)) if bitmask => ir::Match::Masked {
                field,
                mask: u128::from(*v) & max,
                value: 0,
                negate: false,
            },
            (None, RelOp::Implicit | RelOp::Eq | RelOp::Ne, v) => {
                let set = match self.set_elems(t, v)? {
                    Some(keys) => ValueSet::new(
                        keys.into_iter()
                            .map(|k| self.scalar(field, kind, k))
                            .collect::<Result<Vec<_>, _>>()?,
                    ),
                    None => ValueSet::new([self.scalar(field, kind, v)?]),
                };
                ir::Match::In {
                    field,
                    set,
                    negate: m.op == RelOp::Ne,
                }
            }
            (None, op, v) => {
                if matches!(kind, Kind::Ifname | Kind::IfIndex) {
                    return Err(format!(
                        "'{}' on interface names cannot be lowered",
                        op.symbol()
                    ));
                }
                let r = self.scalar(field, kind, v)?;
                let (dlo, dhi) = domain(field, kind);
                let range = match op {
                    RelOp::Lt => (r.lo > dlo).then(|| Range::new(dlo, r.lo - 1)),
                    RelOp::Le => Some(Range::new(dlo, r.hi)),
                    RelOp::Gt => (r.hi < dhi).then(|| Range::new(r.hi + 1, dhi)),
                    _ => Some(Range::new(r.lo, dhi)),
                };
                ir::Match::In {
                    field,
                    set: ValueSet::new(range),
                    negate: false,
                }
            }
        };
        deps.extend_from_slice(d);
        Ok(out)
    }

    fn concat_fields(
        &self,
        t: &Table,
        fields: &[Field],
        deps: &mut Vec<Dep>,
    ) -> Result<Vec<(ir::Field, Kind)>, String> {
        let mut out = Vec::with_capacity(fields.len());
        for f in fields {
            let (field, kind, d) = spec(*f, t.family)?;
            deps.extend_from_slice(d);
            out.push((field, kind));
        }
        Ok(out)
    }

    fn concat_elem(
        &self,
        fields: &[(ir::Field, Kind)],
        key: &Value,
    ) -> Result<Box<[Range]>, String> {
        match key {
            Value::Concat(vs) if vs.len() == fields.len() => fields
                .iter()
                .zip(vs)
                .map(|((f, k), v)| self.scalar(*f, *k, v))
                .collect::<Result<Vec<_>, _>>()
                .map(Vec::into_boxed_slice),
            _ => Err(format!(
                "element is not a concatenation of {} values",
                fields.len()
            )),
        }
    }

    fn concat_match(
        &self,
        t: &Table,
        m: &ast::Match,
        deps: &mut Vec<Dep>,
    ) -> Result<ir::Match, String> {
        if m.mask.is_some() {
            return Err("a masked concatenation cannot be lowered".to_string());
        }
        let negate = match m.op {
            RelOp::Implicit | RelOp::Eq => false,
            RelOp::Ne => true,
            op => {
                return Err(format!(
                    "'{}' on a concatenation cannot be lowered",
                    op.symbol()
                ))
            }
        };
        let mut d = Vec::new();
        let fields = self.concat_fields(t, &m.left, &mut d)?;
        let keys: Vec<&Value> = match self.set_elems(t, &m.right)? {
            Some(k) => k,
            None => vec![&m.right],
        };
        let elems = keys
            .into_iter()
            .map(|k| self.concat_elem(&fields, k))
            .collect::<Result<Vec<_>, _>>()?;
        deps.extend(d);
        Ok(ir::Match::Concat {
            fields: fields.iter().map(|(f, _)| *f).collect::<Arc<[_]>>(),
            set: Arc::new(ConcatSet::new(elems)),
            negate,
        })
    }

    /// The condition "map key == `k`" for one map element.
    fn key_match(
        &self,
        t: &Table,
        key: &[Field],
        k: &Value,
        deps: &mut Vec<Dep>,
    ) -> Result<ir::Match, String> {
        match key {
            [f] => {
                let (field, kind, d) = spec(*f, t.family)?;
                let r = self.scalar(field, kind, k)?;
                deps.extend_from_slice(d);
                Ok(ir::Match::In {
                    field,
                    set: ValueSet::new([r]),
                    negate: false,
                })
            }
            _ => {
                let mut d = Vec::new();
                let fields = self.concat_fields(t, key, &mut d)?;
                let e = self.concat_elem(&fields, k)?;
                deps.extend(d);
                Ok(ir::Match::Concat {
                    fields: fields.iter().map(|(f, _)| *f).collect::<Arc<[_]>>(),
                    set: Arc::new(ConcatSet::new(vec![e])),
                    negate: false,
                })
            }
        }
    }

    /// NAT is only valid in `type nat` chains (and regular chains reached
    /// only from them): a filter base chain that can reach a NAT rule is an
    /// error, as in nft.
    fn check_nat_reachability(&mut self) {
        let bases = self.out.bases.clone();
        for b in bases.iter().filter(|b| !b.nat) {
            let reach = reachable(&self.out.program, b.chain);
            for c in reach {
                let Some(chain) = self.out.program.chains.get(c.0 as usize) else {
                    continue;
                };
                let nat_rules: Vec<RuleId> = chain
                    .rules
                    .iter()
                    .filter(|r| matches!(r.verdict, Some(ir::Verdict::Nat(_))))
                    .map(|r| r.id)
                    .collect();
                for id in nat_rules {
                    let Some(info) = self.out.rules.get(id.0 as usize).cloned() else {
                        continue;
                    };
                    let base = self
                        .out
                        .chains
                        .get(b.chain.0 as usize)
                        .map(|c| c.name.clone())
                        .unwrap_or_default();
                    let msg = format!(
                        "NAT rule is reachable from filter chain '{base}'; NAT is only \
                         valid in chains of type nat"
                    );
                    if !self
                        .errors
                        .iter()
                        .any(|e| e.line == info.span.line && e.message == msg)
                    {
                        self.err(info.span, msg);
                    }
                }
            }
        }
    }
}

/// Chains reachable from `start` by jump/goto, `start` included.
pub(crate) fn reachable(prog: &Program, start: ChainId) -> Vec<ChainId> {
    let mut seen = vec![start];
    let mut todo = vec![start];
    while let Some(c) = todo.pop() {
        let Some(chain) = prog.chains.get(c.0 as usize) else {
            continue;
        };
        for r in &chain.rules {
            if let Some(ir::Verdict::Jump(t) | ir::Verdict::Goto(t)) = r.verdict {
                if !seen.contains(&t) {
                    seen.push(t);
                    todo.push(t);
                }
            }
        }
    }
    seen
}

/// Whether a match reads a field of the packet's connection (not `ct state`).
fn reads_connection(m: &ir::Match) -> bool {
    let conn = |f: &ir::Field| {
        matches!(
            f,
            ir::Field::CtMark
                | ir::Field::CtStatus
                | ir::Field::CtDir
                | ir::Field::CtOrigSaddr
                | ir::Field::CtOrigDaddr
                | ir::Field::CtReplySaddr
                | ir::Field::CtReplyDaddr
                | ir::Field::CtOrigSport
                | ir::Field::CtOrigDport
                | ir::Field::CtReplySport
                | ir::Field::CtReplyDport
        )
    };
    match m {
        ir::Match::In { field, .. } | ir::Match::Masked { field, .. } => conn(field),
        ir::Match::Concat { fields, .. } => fields.iter().any(conn),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `dnat to A-B` chooses as the kernel does: these choices are the
    /// kernel's, read by the kernel oracle (`dnat_range.nft`, 2026-11-25),
    /// so the hash and its scaling stay what `nf_nat` computes.
    #[test]
    fn dnat_ranges_choose_as_the_kernel_does() {
        let a = |s: &str| s.parse::<Ipv4Addr>().unwrap();
        let r = |lo, hi, persistent| DnatRange {
            lo: a(lo),
            hi: a(hi),
            persistent,
        };
        let (c1, c2, d) = (a("198.51.165.243"), a("198.51.202.167"), a("203.0.113.1"));
        let web = r("10.9.0.10", "10.9.0.17", false);
        assert_eq!(web.pick(c1, d), a("10.9.0.10"));
        assert_eq!(web.pick(c2, d), a("10.9.0.12"));
        assert_eq!(
            r("10.9.0.20", "10.9.0.22", false).pick(c1, d),
            a("10.9.0.20")
        );
        let dns = r("10.9.1.0", "10.9.1.254", true);
        assert_eq!(dns.pick(c1, d), a("10.9.1.93"));
        // Persistent: the destination does not matter; otherwise it may.
        assert_eq!(dns.pick(c1, a("192.0.2.80")), a("10.9.1.93"));
        // A client always gets the same one; a one-address range is that.
        assert_eq!(web.pick(c1, d), web.pick(c1, d));
        assert_eq!(r("10.9.2.7", "10.9.2.7", false).pick(c1, d), a("10.9.2.7"));
        // Many clients spread over the whole range.
        let hit: std::collections::BTreeSet<Ipv4Addr> = (0..2000u32)
            .map(|i| web.pick(Ipv4Addr::from(0xc633_0000 | i), d))
            .collect();
        assert_eq!(hit.len(), 8, "{hit:?}");
        let t = NatAction {
            translation: Translation::Dnat {
                addr: a("10.9.0.10"),
                port: Some(8080),
            },
            addr: Some(a("10.9.0.10")),
            port: Some(8080),
            dnat_range: Some(web),
            dnat_ports: None,
            masq_ports: None,
        };
        assert_eq!(
            t.translation_for(c2, d, 1),
            Translation::Dnat {
                addr: a("10.9.0.12"),
                port: Some(8080)
            }
        );
        // A port range: the original port when in it, else the first one
        // (the kernel's choices for these in `dnat_range.nft`).
        let ports = NatAction {
            translation: Translation::Dnat {
                addr: a("10.9.3.1"),
                port: None,
            },
            addr: Some(a("10.9.3.1")),
            port: None,
            dnat_range: None,
            dnat_ports: Some((9000, 9010)),
            masq_ports: None,
        };
        for (dport, want) in [
            (9005, 9005),
            (9015, 9000),
            (9000, 9000),
            (9010, 9010),
            (9011, 9000),
        ] {
            assert_eq!(
                ports.translation_for(c1, d, dport),
                Translation::Dnat {
                    addr: a("10.9.3.1"),
                    port: Some(want)
                },
                "{dport}"
            );
        }
    }

    /// `n` rules of every kind the lowerer numbers: plain, counters, set
    /// lookups, verdict maps (several IR rules each), jumps; rule `at` is
    /// `extra` instead (if not empty).
    fn ruleset(n: usize, at: usize, extra: &str) -> String {
        let mut s = String::from(
            "table ip t {\n set s {\n  type ipv4_addr\n  elements = { 10.0.0.1 }\n }\n \
             chain other {\n  tcp dport 1 accept\n }\n chain fwd {\n  \
             type filter hook forward priority 0; policy accept;\n",
        );
        for i in 0..n {
            let r = match i % 5 {
                0 => format!(
                    "ip saddr 10.{}.{}.0/24 tcp dport {} accept",
                    i / 256 % 256,
                    i % 256,
                    i % 60000 + 1
                ),
                1 => format!("ip daddr 10.0.{}.{} counter drop", i / 256 % 256, i % 256),
                2 => "ip saddr @s udp dport 53 accept".to_string(),
                3 => "tcp dport vmap { 22 : accept, 23 : drop }".to_string(),
                _ => format!("ip saddr 192.168.{}.0/24 jump other", i % 256),
            };
            s.push_str("  ");
            s.push_str(if i == at && !extra.is_empty() {
                extra
            } else {
                &r
            });
            s.push('\n');
        }
        s.push_str(" }\n}\n");
        s
    }

    fn lower(text: &str, par_min: usize) -> (String, usize) {
        let mut rs = sluice_ruleset::parse_nft_str("t.nft", text).expect("parses");
        let mut rules = take_rules(&mut rs);
        let ifaces = Interfaces::from_ruleset(&rs);
        let mut l = Lowerer::new(&rs, &ifaces);
        l.par_min = par_min;
        let (out, errors, halves) = l.run_halves(&mut rules);
        (format!("{out:?} {errors:?}"), halves)
    }

    /// A chain lowered in two halves on two threads gives the sequential
    /// lowering's rules, ids, handles, tables and errors, also when the
    /// second half adds a log, a limit or a NAT action (then it is lowered
    /// again) or fails.
    #[test]
    fn halves_lower_as_one() {
        let n = 1200;
        let cases = [
            (0, "", 1),
            (900, "", 1),
            (900, "log prefix \"x\" accept", 0),
            (900, "limit rate 10/second accept", 0),
            (300, "log prefix \"y\" accept", 1),
            (
                900,
                "meta mark 5 meta mark set 1 tcp dport vmap { 1 : accept }",
                0,
            ),
            (
                300,
                "meta mark 5 meta mark set 1 tcp dport vmap { 1 : accept }",
                1,
            ),
            // Fails before taking a handle: the second half's handles,
            // numbered from where the first half should end, move down.
            (300, "iif \"nosuchif\" accept", 1),
        ];
        for (at, extra, halves) in cases {
            let text = ruleset(n, at, extra);
            let (seq, h0) = lower(&text, usize::MAX);
            let (par, h1) = lower(&text, 1000);
            assert_eq!(h0, 0);
            assert_eq!(h1, halves, "rule {at}: {extra}");
            assert!(seq == par, "rule {at}: {extra}: the halves differ");
        }
    }
}
