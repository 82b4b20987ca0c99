//! The one AST both front ends lower into.
//!
//! Every rule, statement, match and set element carries a [`Span`]; spans index
//! [`Ruleset::files`]. Values are stored in their numeric form (ports, ICMP types,
//! conntrack-state bit masks, protocol numbers); the [`Field`] on the left of a
//! match gives the [`DataType`] that tells how to interpret and print them.

use serde::Serialize;
use std::net::IpAddr;

/// A source location: file (index into [`Ruleset::files`]), 1-based line and
/// column (in characters), and the length of the offending token.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize)]
pub struct Span {
    pub file: u32,
    pub line: u32,
    pub col: u32,
    pub len: u32,
}

/// A whole parsed rule set.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Ruleset {
    pub tables: Vec<Table>,
    /// `define NAME = value` in definition order (value as source text).
    pub defines: Vec<Define>,
    /// File names, indexed by [`Span::file`].
    pub files: Vec<String>,
}

/// A `define`d symbol. Uses are expanded at parse time; kept for inspection.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Define {
    pub name: String,
    pub value: String,
    pub span: Span,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Family {
    Ip,
    Ip6,
    Inet,
}

impl Family {
    pub fn name(self) -> &'static str {
        match self {
            Family::Ip => "ip",
            Family::Ip6 => "ip6",
            Family::Inet => "inet",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Table {
    pub family: Family,
    pub name: String,
    pub chains: Vec<Chain>,
    pub sets: Vec<Set>,
    pub maps: Vec<Map>,
    /// Named stateful objects (`counter NAME { ... }`, `quota NAME { ... }`).
    pub objects: Vec<Object>,
    /// Flowtables (`flowtable NAME { hook ingress priority P; devices = {
    /// ... }; }`), the targets of `flow add @NAME`.
    pub flowtables: Vec<Flowtable>,
    /// Conntrack timeout policies (`ct timeout NAME { ... }`), the targets
    /// of `ct timeout set "NAME"`.
    pub ct_timeouts: Vec<CtTimeout>,
    pub span: Span,
}

/// A conntrack timeout policy: `ct timeout NAME { protocol tcp|udp;
/// [l3proto ip|ip6|inet;] policy = { STATE: SECONDS, ... } }`. A `ct
/// timeout set "NAME"` statement gives it to the connection of the packet
/// it runs on, if that is the connection's first packet and of the
/// policy's protocol.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CtTimeout {
    pub name: String,
    /// `protocol`: 6 (tcp) or 17 (udp).
    pub protocol: u8,
    /// `l3proto`, when written (nft then lists it; without it, the table's
    /// family). It selects nothing: the kernel does not compare it with
    /// the packet either.
    pub l3proto: Option<Family>,
    /// `policy = { ... }`: seconds by state (nft's order, the last value of
    /// a state written twice).
    pub policy: Vec<(CtTimeoutState, u32)>,
    pub span: Span,
}

/// The states a `ct timeout` policy names (nft's spelling).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CtTimeoutState {
    SynSent,
    SynRecv,
    Established,
    FinWait,
    CloseWait,
    LastAck,
    TimeWait,
    Close,
    SynSent2,
    Retrans,
    Unack,
    Unreplied,
    Replied,
}

impl CtTimeoutState {
    /// TCP's states, in nft's order.
    pub const TCP: [CtTimeoutState; 11] = [
        Self::SynSent,
        Self::SynRecv,
        Self::Established,
        Self::FinWait,
        Self::CloseWait,
        Self::LastAck,
        Self::TimeWait,
        Self::Close,
        Self::SynSent2,
        Self::Retrans,
        Self::Unack,
    ];
    /// UDP's states.
    pub const UDP: [CtTimeoutState; 2] = [Self::Unreplied, Self::Replied];

    /// The states of IP protocol `proto` (none but TCP's and UDP's).
    pub fn of_protocol(proto: u8) -> &'static [CtTimeoutState] {
        match proto {
            6 => &Self::TCP,
            17 => &Self::UDP,
            _ => &[],
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::SynSent => "syn_sent",
            Self::SynRecv => "syn_recv",
            Self::Established => "established",
            Self::FinWait => "fin_wait",
            Self::CloseWait => "close_wait",
            Self::LastAck => "last_ack",
            Self::TimeWait => "time_wait",
            Self::Close => "close",
            Self::SynSent2 => "syn_sent2",
            Self::Retrans => "retrans",
            Self::Unack => "unack",
            Self::Unreplied => "unreplied",
            Self::Replied => "replied",
        }
    }
}

/// A flowtable: nftables' fast path for established connections, which a
/// `flow add @NAME` statement in a forward chain fills. Sluice keeps the
/// declaration as written; the hook, priority and devices do not change
/// what it does (every interface of the gateway is one of its devices).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Flowtable {
    pub name: String,
    /// `priority` of its ingress hook.
    pub priority: i32,
    /// `devices = { ... }`, as written.
    pub devices: Vec<String>,
    /// `flags offload` (hardware offload: with `xdp_offload` Sluice's XDP
    /// program forwards the connections either way).
    pub offload: bool,
    /// `counter`.
    pub counter: bool,
    pub span: Span,
}

/// The kind of a named stateful object; counters and quotas have separate
/// name spaces, as in nft.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ObjKind {
    Counter,
    Quota,
    Limit,
}

impl ObjKind {
    pub fn name(self) -> &'static str {
        match self {
            ObjKind::Counter => "counter",
            ObjKind::Quota => "quota",
            ObjKind::Limit => "limit",
        }
    }

    /// The data type of an object map's values.
    pub fn datatype(self) -> DataType {
        match self {
            ObjKind::Counter => DataType::CounterObj,
            ObjKind::Quota => DataType::QuotaObj,
            ObjKind::Limit => DataType::LimitObj,
        }
    }

    /// The kind of an object map's data type.
    pub fn of_datatype(dt: DataType) -> Option<ObjKind> {
        match dt {
            DataType::CounterObj => Some(ObjKind::Counter),
            DataType::QuotaObj => Some(ObjKind::Quota),
            DataType::LimitObj => Some(ObjKind::Limit),
            _ => None,
        }
    }
}

/// A named stateful object of a table (the kernel's `nft_object`): one
/// counter or quota that every rule naming it shares (`counter name "c"`,
/// `quota name "q"`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Object {
    pub name: String,
    pub state: ObjState,
    pub comment: Option<String>,
    pub span: Span,
}

impl Object {
    pub fn kind(&self) -> ObjKind {
        self.state.kind()
    }
}

impl ObjState {
    /// Counter, quota or limit.
    pub fn kind(&self) -> ObjKind {
        match self {
            ObjState::Counter { .. } => ObjKind::Counter,
            ObjState::Quota(_) => ObjKind::Quota,
            ObjState::Limit(_) => ObjKind::Limit,
        }
    }
}

/// What a named object holds when it is loaded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ObjState {
    /// `counter NAME { packets P bytes B }`.
    Counter { packets: u64, bytes: u64 },
    /// `quota NAME { [over | until] N UNIT [used M UNIT] }`.
    Quota(Quota),
    /// `limit NAME { rate [over] N/UNIT [burst B] }`.
    Limit(Limit),
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Chain {
    pub name: String,
    pub base: Option<BaseChain>,
    pub rules: Vec<Rule>,
    pub comment: Option<String>,
    pub span: Span,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct BaseChain {
    pub chain_type: ChainType,
    pub hook: Hook,
    pub priority: i32,
    pub policy: Policy,
    pub span: Span,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ChainType {
    Filter,
    Nat,
    Route,
}

/// Netfilter hooks, in packet-path order (the derived `Ord` is that order).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Hook {
    Prerouting,
    Input,
    Forward,
    Output,
    Postrouting,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Policy {
    Accept,
    Drop,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SetFlag {
    Constant,
    Interval,
    Timeout,
    Dynamic,
}

/// A named set. `key` has more than one entry for concatenated types.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Set {
    pub name: String,
    pub key: Vec<DataType>,
    /// Set when declared with `typeof`; printed back that way.
    pub key_typeof: Option<Vec<Field>>,
    pub flags: Vec<SetFlag>,
    /// `timeout T`: how long an element the packet path adds lives, in ms
    /// (`None`: until deleted).
    pub timeout_ms: Option<u64>,
    /// `size N`: the most elements the set holds.
    pub size: Option<u32>,
    pub elements: Vec<Elem>,
    pub comment: Option<String>,
    pub span: Span,
}

impl Set {
    /// Whether the packet path changes the set (`flags dynamic` or
    /// `timeout`): its lookups read the live elements, not compiled ones.
    pub fn is_dynamic(&self) -> bool {
        self.flags
            .iter()
            .any(|f| matches!(f, SetFlag::Dynamic | SetFlag::Timeout))
            || self.timeout_ms.is_some()
    }
}

/// A named map (`data` is [`DataType::Verdict`] for verdict maps).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Map {
    pub name: String,
    pub key: Vec<DataType>,
    pub key_typeof: Option<Vec<Field>>,
    pub data: DataType,
    pub flags: Vec<SetFlag>,
    pub elements: Vec<Elem>,
    pub comment: Option<String>,
    pub span: Span,
}

/// A set or map element; `data` is present for map elements.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Elem {
    pub key: Value,
    pub data: Option<Value>,
    pub span: Span,
    /// `timeout`, `expires` and `comment`, as `nft list ruleset` prints
    /// them (only in the elements a named set or map is declared with).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub opts: Option<Box<ElemOpts>>,
}

impl Elem {
    /// How long the element lives by its own options: its `expires`, else
    /// its `timeout` (ms); `None` when it has neither.
    pub fn lifetime_ms(&self) -> Option<u64> {
        self.opts
            .as_ref()
            .and_then(|o| o.expires_ms.or(o.timeout_ms))
    }
}

/// The options of an element ([`Elem::opts`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ElemOpts {
    /// `timeout T`: the element's own timeout, ms.
    pub timeout_ms: Option<u64>,
    /// `expires T`: the time it has left, ms (the kernel's listing of a
    /// live element).
    pub expires_ms: Option<u64>,
    /// `comment "C"`.
    pub comment: Option<String>,
}

/// One rule: all `matches` must hold, then `stmts` run in order.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Rule {
    pub matches: Vec<Match>,
    pub stmts: Vec<Stmt>,
    pub handle: Option<u64>,
    pub comment: Option<String>,
    pub span: Span,
}

/// A relational expression `left [& mask] op right`.
///
/// `left` has more than one field for concatenations (`ip daddr . tcp dport`).
/// Semantics of [`RelOp::Implicit`] follow nft: membership when `right` is a set,
/// "any of these bits set" for bit-mask types (ct state, tcp flags) given as a
/// plain value, equality otherwise. With `Ne` on a bit-mask value: "none of these bits".
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Match {
    pub left: Fields,
    pub mask: Option<u64>,
    pub op: RelOp,
    pub right: Value,
    pub span: Span,
    pub right_span: Span,
}

/// The field list on the left of a match: one field, or a concatenation.
/// Reads as a slice (`Deref<Target = [Field]>`); a single field, what almost
/// every match has, is held inline, so a large rule set does not allocate
/// one list per match. Serializes and prints as a list of fields.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Fields(FieldsRepr);

#[derive(Clone, PartialEq, Eq, Hash)]
enum FieldsRepr {
    One(Field),
    /// A boxed slice (16 bytes, not a vector's 24: a match is 104 bytes).
    Many(Box<[Field]>),
}

impl Fields {
    /// The fields, in order.
    pub fn as_slice(&self) -> &[Field] {
        match &self.0 {
            FieldsRepr::One(f) => std::slice::from_ref(f),
            FieldsRepr::Many(v) => v,
        }
    }

    /// Appends a field (a concatenation grows).
    pub fn push(&mut self, f: Field) {
        match &mut self.0 {
            FieldsRepr::One(a) => self.0 = FieldsRepr::Many(Box::new([*a, f])),
            FieldsRepr::Many(v) => {
                let mut all = std::mem::take(v).into_vec();
                all.push(f);
                *v = all.into_boxed_slice();
            }
        }
    }
}

impl From<Field> for Fields {
    fn from(f: Field) -> Self {
        Fields(FieldsRepr::One(f))
    }
}

impl From<Vec<Field>> for Fields {
    fn from(v: Vec<Field>) -> Self {
        match v.as_slice() {
            [f] => Fields(FieldsRepr::One(*f)),
            _ => Fields(FieldsRepr::Many(v.into_boxed_slice())),
        }
    }
}

impl std::ops::Deref for Fields {
    type Target = [Field];
    fn deref(&self) -> &[Field] {
        self.as_slice()
    }
}

impl<'a> IntoIterator for &'a Fields {
    type Item = &'a Field;
    type IntoIter = std::slice::Iter<'a, Field>;
    fn into_iter(self) -> Self::IntoIter {
        self.as_slice().iter()
    }
}

impl std::fmt::Debug for Fields {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.as_slice()).finish()
    }
}

impl Serialize for Fields {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.as_slice().serialize(s)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum RelOp {
    Implicit,
    Eq,
    Ne,
    Lt,
    Gt,
    Le,
    Ge,
}

impl RelOp {
    pub fn symbol(self) -> &'static str {
        match self {
            RelOp::Implicit => "",
            RelOp::Eq => "==",
            RelOp::Ne => "!=",
            RelOp::Lt => "<",
            RelOp::Gt => ">",
            RelOp::Le => "<=",
            RelOp::Ge => ">=",
        }
    }
}

/// Packet and metadata fields a rule can match on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Field {
    Iifname,
    Oifname,
    Iif,
    Oif,
    MetaL4proto,
    MetaNfproto,
    /// `meta protocol`: the frame's EtherType (`ip`, `ip6`, ...).
    MetaProtocol,
    MetaMark,
    IpSaddr,
    IpDaddr,
    IpProtocol,
    IpTtl,
    Ip6Saddr,
    Ip6Daddr,
    Ip6Nexthdr,
    TcpSport,
    TcpDport,
    TcpFlags,
    UdpSport,
    UdpDport,
    ThSport,
    ThDport,
    IcmpType,
    IcmpCode,
    Icmpv6Type,
    Icmpv6Code,
    CtState,
    CtStatus,
    CtMark,
    IpLength,
    IpDscp,
    Ip6Hoplimit,
    Ip6Length,
    Ip6Dscp,
    MetaLength,
    MetaPkttype,
    FibDaddrType,
    FibSaddrType,
    EtherSaddr,
    EtherDaddr,
    /// `ether type`: the frame's EtherType (as `meta protocol` for the
    /// untagged frames Sluice takes).
    EtherType,
    CtDirection,
    /// `fib saddr . iif oif`: a route back to the source through the input
    /// interface (strict reverse-path check).
    FibSaddrIifOif,
    /// `fib saddr oif`: any route back to the source (loose).
    FibSaddrOif,
    /// The number `numgen` generates: only the left side of a
    /// [`Numgen`]'s comparison, never a packet field.
    Numgen,
    /// `meta time`: when the packet is seen, ns since the epoch (UTC).
    MetaTime,
    /// `meta day`: the day of the week it is seen, 0 Sunday (UTC).
    MetaDay,
    /// `meta hour`: the time of day it is seen, seconds since midnight
    /// (UTC).
    MetaHour,
    /// `ct original|reply ip|ip6 saddr|daddr`, `ct original|reply
    /// proto-src|proto-dst`: a tuple of the packet's connection (the
    /// original direction as its first packet had it, before NAT; the
    /// reply direction as replies arrive, NAT included).
    CtOrigIpSaddr,
    CtOrigIpDaddr,
    CtReplyIpSaddr,
    CtReplyIpDaddr,
    CtOrigIp6Saddr,
    CtOrigIp6Daddr,
    CtReplyIp6Saddr,
    CtReplyIp6Daddr,
    CtOrigProtoSrc,
    CtOrigProtoDst,
    CtReplyProtoSrc,
    CtReplyProtoDst,
    /// `ip frag-off`: the flags and fragment offset as the chains see
    /// them, after reassembly (offset 0, MF clear).
    IpFragOff,
}

/// Which network-layer family a field requires.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FieldFamily {
    Any,
    V4,
    V6,
}

impl Field {
    /// All fields, for lookups and suggestions.
    pub const ALL: [Field; 61] = [
        Field::Iifname,
        Field::Oifname,
        Field::Iif,
        Field::Oif,
        Field::MetaL4proto,
        Field::MetaNfproto,
        Field::MetaProtocol,
        Field::MetaMark,
        Field::IpSaddr,
        Field::IpDaddr,
        Field::IpProtocol,
        Field::IpTtl,
        Field::Ip6Saddr,
        Field::Ip6Daddr,
        Field::Ip6Nexthdr,
        Field::TcpSport,
        Field::TcpDport,
        Field::TcpFlags,
        Field::UdpSport,
        Field::UdpDport,
        Field::ThSport,
        Field::ThDport,
        Field::IcmpType,
        Field::IcmpCode,
        Field::Icmpv6Type,
        Field::Icmpv6Code,
        Field::CtState,
        Field::CtStatus,
        Field::CtMark,
        Field::IpLength,
        Field::IpDscp,
        Field::Ip6Hoplimit,
        Field::Ip6Length,
        Field::Ip6Dscp,
        Field::MetaLength,
        Field::MetaPkttype,
        Field::FibDaddrType,
        Field::FibSaddrType,
        Field::EtherSaddr,
        Field::EtherDaddr,
        Field::EtherType,
        Field::CtDirection,
        Field::FibSaddrIifOif,
        Field::FibSaddrOif,
        Field::Numgen,
        Field::MetaTime,
        Field::MetaDay,
        Field::MetaHour,
        Field::CtOrigIpSaddr,
        Field::CtOrigIpDaddr,
        Field::CtReplyIpSaddr,
        Field::CtReplyIpDaddr,
        Field::CtOrigIp6Saddr,
        Field::CtOrigIp6Daddr,
        Field::CtReplyIp6Saddr,
        Field::CtReplyIp6Daddr,
        Field::CtOrigProtoSrc,
        Field::CtOrigProtoDst,
        Field::CtReplyProtoSrc,
        Field::CtReplyProtoDst,
        Field::IpFragOff,
    ];

    /// Canonical nft spelling (`"ip saddr"`).
    pub fn name(self) -> &'static str {
        match self {
            Field::Iifname => "iifname",
            Field::Oifname => "oifname",
            Field::Iif => "iif",
            Field::Oif => "oif",
            Field::MetaL4proto => "meta l4proto",
            Field::MetaNfproto => "meta nfproto",
            Field::MetaProtocol => "meta protocol",
            Field::MetaMark => "meta mark",
            Field::IpSaddr => "ip saddr",
            Field::IpDaddr => "ip daddr",
            Field::IpProtocol => "ip protocol",
            Field::IpTtl => "ip ttl",
            Field::Ip6Saddr => "ip6 saddr",
            Field::Ip6Daddr => "ip6 daddr",
            Field::Ip6Nexthdr => "ip6 nexthdr",
            Field::TcpSport => "tcp sport",
            Field::TcpDport => "tcp dport",
            Field::TcpFlags => "tcp flags",
            Field::UdpSport => "udp sport",
            Field::UdpDport => "udp dport",
            Field::ThSport => "th sport",
            Field::ThDport => "th dport",
            Field::IcmpType => "icmp type",
            Field::IcmpCode => "icmp code",
            Field::Icmpv6Type => "icmpv6 type",
            Field::Icmpv6Code => "icmpv6 code",
            Field::CtState => "ct state",
            Field::CtStatus => "ct status",
            Field::CtMark => "ct mark",
            Field::IpLength => "ip length",
            Field::IpDscp => "ip dscp",
            Field::Ip6Hoplimit => "ip6 hoplimit",
            Field::Ip6Length => "ip6 length",
            Field::Ip6Dscp => "ip6 dscp",
            Field::MetaLength => "meta length",
            Field::MetaPkttype => "meta pkttype",
            Field::FibDaddrType => "fib daddr type",
            Field::FibSaddrType => "fib saddr type",
            Field::EtherSaddr => "ether saddr",
            Field::EtherType => "ether type",
            Field::EtherDaddr => "ether daddr",
            Field::CtDirection => "ct direction",
            Field::FibSaddrIifOif => "fib saddr . iif oif",
            Field::FibSaddrOif => "fib saddr oif",
            Field::Numgen => "numgen",
            Field::MetaTime => "meta time",
            Field::MetaDay => "meta day",
            Field::MetaHour => "meta hour",
            Field::CtOrigIpSaddr => "ct original ip saddr",
            Field::CtOrigIpDaddr => "ct original ip daddr",
            Field::CtReplyIpSaddr => "ct reply ip saddr",
            Field::CtReplyIpDaddr => "ct reply ip daddr",
            Field::CtOrigIp6Saddr => "ct original ip6 saddr",
            Field::CtOrigIp6Daddr => "ct original ip6 daddr",
            Field::CtReplyIp6Saddr => "ct reply ip6 saddr",
            Field::CtReplyIp6Daddr => "ct reply ip6 daddr",
            Field::CtOrigProtoSrc => "ct original proto-src",
            Field::CtOrigProtoDst => "ct original proto-dst",
            Field::CtReplyProtoSrc => "ct reply proto-src",
            Field::CtReplyProtoDst => "ct reply proto-dst",
            Field::IpFragOff => "ip frag-off",
        }
    }

    pub fn datatype(self) -> DataType {
        match self {
            Field::Iifname | Field::Oifname => DataType::Ifname,
            Field::Iif | Field::Oif => DataType::IfaceIndex,
            Field::MetaL4proto | Field::IpProtocol | Field::Ip6Nexthdr => DataType::InetProto,
            Field::MetaNfproto => DataType::NfProto,
            Field::MetaProtocol | Field::EtherType => DataType::EtherType,
            Field::MetaMark | Field::CtMark => DataType::Mark,
            Field::IpSaddr | Field::IpDaddr => DataType::Ipv4Addr,
            Field::Ip6Saddr | Field::Ip6Daddr => DataType::Ipv6Addr,
            Field::IpTtl | Field::Ip6Hoplimit => DataType::Integer8,
            Field::IcmpCode => DataType::IcmpCode,
            Field::Icmpv6Code => DataType::Icmpv6Code,
            Field::IpLength | Field::Ip6Length | Field::IpFragOff => DataType::Integer16,
            Field::MetaLength | Field::Numgen => DataType::Integer32,
            Field::IpDscp | Field::Ip6Dscp => DataType::Dscp,
            Field::MetaPkttype => DataType::PktType,
            Field::MetaTime => DataType::Time,
            Field::MetaDay => DataType::Day,
            Field::MetaHour => DataType::Hour,
            Field::CtOrigIpSaddr
            | Field::CtOrigIpDaddr
            | Field::CtReplyIpSaddr
            | Field::CtReplyIpDaddr => DataType::Ipv4Addr,
            Field::CtOrigIp6Saddr
            | Field::CtOrigIp6Daddr
            | Field::CtReplyIp6Saddr
            | Field::CtReplyIp6Daddr => DataType::Ipv6Addr,
            Field::CtOrigProtoSrc
            | Field::CtOrigProtoDst
            | Field::CtReplyProtoSrc
            | Field::CtReplyProtoDst => DataType::InetService,
            Field::FibDaddrType | Field::FibSaddrType => DataType::AddrType,
            Field::EtherSaddr | Field::EtherDaddr => DataType::EtherAddr,
            Field::CtDirection => DataType::CtDir,
            Field::FibSaddrIifOif | Field::FibSaddrOif => DataType::FibPresence,
            Field::TcpSport
            | Field::TcpDport
            | Field::UdpSport
            | Field::UdpDport
            | Field::ThSport
            | Field::ThDport => DataType::InetService,
            Field::TcpFlags => DataType::TcpFlag,
            Field::IcmpType => DataType::IcmpType,
            Field::Icmpv6Type => DataType::Icmpv6Type,
            Field::CtState => DataType::CtState,
            Field::CtStatus => DataType::CtStatus,
        }
    }

    pub fn family(self) -> FieldFamily {
        match self {
            Field::IpSaddr
            | Field::IpDaddr
            | Field::IpProtocol
            | Field::IpTtl
            | Field::IpLength
            | Field::IpDscp
            | Field::IpFragOff => FieldFamily::V4,
            Field::Ip6Hoplimit | Field::Ip6Length | Field::Ip6Dscp => FieldFamily::V6,
            Field::IcmpType | Field::IcmpCode => FieldFamily::V4,
            Field::Ip6Saddr | Field::Ip6Daddr | Field::Ip6Nexthdr => FieldFamily::V6,
            Field::Icmpv6Type | Field::Icmpv6Code => FieldFamily::V6,
            Field::CtOrigIpSaddr
            | Field::CtOrigIpDaddr
            | Field::CtReplyIpSaddr
            | Field::CtReplyIpDaddr => FieldFamily::V4,
            Field::CtOrigIp6Saddr
            | Field::CtOrigIp6Daddr
            | Field::CtReplyIp6Saddr
            | Field::CtReplyIp6Daddr => FieldFamily::V6,
            _ => FieldFamily::Any,
        }
    }
}

/// Value types (nft "datatypes").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DataType {
    Ipv4Addr,
    Ipv6Addr,
    InetService,
    InetProto,
    NfProto,
    /// `ether_type`: an EtherType (`ip`, `ip6`, `arp`, `vlan`, ...).
    EtherType,
    Ifname,
    IfaceIndex,
    Mark,
    CtState,
    CtStatus,
    TcpFlag,
    IcmpType,
    Icmpv6Type,
    Integer8,
    Verdict,
    Integer16,
    Integer32,
    Dscp,
    PktType,
    AddrType,
    IcmpCode,
    Icmpv6Code,
    EtherAddr,
    CtDir,
    FibPresence,
    /// `meta time`: ns since the epoch, written `"2019-06-06 17:00:00"`.
    Time,
    /// `meta day`: 0 (Sunday) to 6, written `"Monday"`.
    Day,
    /// `meta hour`: seconds since midnight, written `"17:00"`.
    Hour,
    /// A named counter, as an object map's data (`: counter`).
    CounterObj,
    /// A named quota, as an object map's data (`: quota`).
    QuotaObj,
    /// A named limit, as an object map's data (`: limit`).
    LimitObj,
}

impl DataType {
    pub const ALL: [DataType; 32] = [
        DataType::Ipv4Addr,
        DataType::Ipv6Addr,
        DataType::InetService,
        DataType::InetProto,
        DataType::NfProto,
        DataType::EtherType,
        DataType::Ifname,
        DataType::IfaceIndex,
        DataType::Mark,
        DataType::CtState,
        DataType::CtStatus,
        DataType::TcpFlag,
        DataType::IcmpType,
        DataType::Icmpv6Type,
        DataType::Integer8,
        DataType::Verdict,
        DataType::Integer16,
        DataType::Integer32,
        DataType::Dscp,
        DataType::PktType,
        DataType::AddrType,
        DataType::IcmpCode,
        DataType::Icmpv6Code,
        DataType::EtherAddr,
        DataType::CtDir,
        DataType::FibPresence,
        DataType::Time,
        DataType::Day,
        DataType::Hour,
        DataType::CounterObj,
        DataType::QuotaObj,
        DataType::LimitObj,
    ];

    /// nft type name as used in `set { type ... }`.
    pub fn name(self) -> &'static str {
        match self {
            DataType::Ipv4Addr => "ipv4_addr",
            DataType::Ipv6Addr => "ipv6_addr",
            DataType::InetService => "inet_service",
            DataType::InetProto => "inet_proto",
            DataType::NfProto => "nf_proto",
            DataType::EtherType => "ether_type",
            DataType::Ifname => "ifname",
            DataType::IfaceIndex => "iface_index",
            DataType::Mark => "mark",
            DataType::CtState => "ct_state",
            DataType::CtStatus => "ct_status",
            DataType::TcpFlag => "tcp_flag",
            DataType::IcmpType => "icmp_type",
            DataType::Icmpv6Type => "icmpv6_type",
            DataType::Integer8 => "integer",
            DataType::Verdict => "verdict",
            // Unique names for `type` in set declarations; nft calls all
            // three "integer" and tells them apart by size.
            DataType::Integer16 => "integer16",
            DataType::Integer32 => "integer32",
            DataType::Dscp => "dscp",
            DataType::PktType => "pkt_type",
            DataType::AddrType => "fib_addrtype",
            DataType::IcmpCode => "icmp_code",
            DataType::Icmpv6Code => "icmpv6_code",
            DataType::EtherAddr => "ether_addr",
            DataType::CtDir => "ct_dir",
            DataType::FibPresence => "fib_presence",
            DataType::Time => "time",
            DataType::Day => "day",
            DataType::Hour => "hour",
            DataType::CounterObj => "counter",
            DataType::QuotaObj => "quota",
            DataType::LimitObj => "limit",
        }
    }

    /// Largest numeric value of this type, if numeric.
    pub fn max_value(self) -> Option<u64> {
        match self {
            DataType::InetService => Some(u64::from(u16::MAX)),
            DataType::InetProto
            | DataType::NfProto
            | DataType::TcpFlag
            | DataType::IcmpType
            | DataType::Icmpv6Type
            | DataType::Integer8 => Some(u64::from(u8::MAX)),
            DataType::Integer16 | DataType::EtherType => Some(u64::from(u16::MAX)),
            DataType::Integer32 => Some(u64::from(u32::MAX)),
            DataType::Dscp => Some(63),
            DataType::PktType => Some(3),
            DataType::AddrType => Some(11),
            DataType::IcmpCode | DataType::Icmpv6Code => Some(u64::from(u8::MAX)),
            DataType::EtherAddr => Some((1 << 48) - 1),
            DataType::CtDir | DataType::FibPresence => Some(1),
            DataType::Time => Some(u64::MAX),
            DataType::Day => Some(6),
            DataType::Hour => Some(crate::timefmt::DAY_SECS - 1),
            DataType::Mark | DataType::CtState | DataType::CtStatus => Some(u64::from(u32::MAX)),
            _ => None,
        }
    }

    /// The value of symbol `name` of this type (`ef` for `dscp`, `local`
    /// for `fib_addrtype`, ...), as the parsers read it.
    pub fn symbol(self, name: &str) -> Option<u64> {
        crate::symbols::lookup(self, name)
    }

    /// Bit-mask types accept `a,b,c` lists and masks.
    pub fn is_bitmask(self) -> bool {
        matches!(
            self,
            DataType::CtState | DataType::CtStatus | DataType::TcpFlag
        )
    }
}

/// A value on the right-hand side of a match, in a set, or in a map.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Value {
    /// Numbers of every numeric type (ports, marks, bit masks, ICMP types...).
    Num(u64),
    Addr(IpAddr),
    Prefix {
        addr: IpAddr,
        len: u8,
    },
    /// Interface name; a trailing `*` is a wildcard.
    Str(String),
    Range(Box<Value>, Box<Value>),
    Concat(Vec<Value>),
    /// Anonymous set `{ a, b }`.
    Set(Vec<Elem>),
    /// Named set reference `@name`.
    SetRef(String),
    Verdict(Verdict),
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    Accept,
    Drop,
    Return,
    Continue,
    Jump(String),
    Goto(String),
}

/// A statement with its span.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Stmt {
    pub kind: StmtKind,
    pub span: Span,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StmtKind {
    Counter {
        packets: Option<u64>,
        bytes: Option<u64>,
    },
    Verdict(Verdict),
    Reject(Option<RejectWith>),
    Log(Log),
    Limit(Limit),
    MetaMarkSet(u32),
    CtMarkSet(u32),
    /// `meta mark set ct mark` (iptables `CONNMARK --restore-mark`).
    MetaMarkFromCt,
    /// `ct mark set meta mark` (iptables `CONNMARK --save-mark`).
    CtMarkFromMeta,
    /// `flow add @NAME` (`flow offload @NAME`): the packet's connection
    /// joins flowtable NAME (only in forward chains): its later packets
    /// skip the filter chains while it stays established.
    FlowAdd(String),
    /// `ct timeout set "NAME"`: the connection follows the table's timeout
    /// policy NAME ([`CtTimeout`]).
    CtTimeoutSet(String),
    /// `meta nftrace set 0|1` (also `nftrace set`): turns the kernel's
    /// rule tracing (`nft monitor trace`) on or off for the packet. Kept
    /// and printed; it does nothing in Sluice, whose `sluice trace` shows
    /// the same path for a described packet.
    NftraceSet(u8),
    /// `notrack` (iptables `-j CT --notrack`, `-j NOTRACK`): conntrack
    /// leaves the packet alone (`ct state untracked`, no NAT). Only
    /// prerouting and output chains may hold it, and it acts only before
    /// conntrack (priority below -200, e.g. `priority raw`).
    Notrack,
    /// `meta mark set meta mark & A | O ^ X`, kept as `(mark & and) ^
    /// xor` (iptables `MARK --set-xmark V/M`, `--or-mark`, ...).
    MetaMarkMod {
        and: u32,
        xor: u32,
    },
    /// `ct mark set ct mark & A | O ^ X` (iptables `CONNMARK --set-xmark
    /// V/M`, ...).
    CtMarkMod {
        and: u32,
        xor: u32,
    },
    /// Boxed, like the map of [`StmtKind::VerdictMap`]: the two largest
    /// variants would otherwise make every statement of a rule set as large
    /// as they are (104 bytes instead of 56).
    Nat(Box<Nat>),
    /// `KEY vmap { v : verdict, ... }` or `KEY vmap @m`.
    VerdictMap {
        key: Vec<Field>,
        map: Box<MapRef>,
    },
    /// `tcp option maxseg size set rt mtu | N` (iptables `-j TCPMSS`): the
    /// MSS option of a TCP segment is lowered to the value, never raised.
    TcpMssSet(TcpMss),
    /// `add | update | delete @set { KEY [timeout T] [limit ...] [counter] }`
    /// (nft's dynamic set statement).
    SetUpdate(Box<SetUpdate>),
    /// `quota [over | until] N UNIT [used N UNIT]`.
    Quota(Quota),
    /// `numgen inc|random mod N [offset O] OP VALUE`: a match on a
    /// generated number (iptables `-m statistic`).
    Numgen(Box<Numgen>),
    /// `ct count [over] N` in a rule: the open connections of every packet
    /// that met it (one count per rule, the kernel's `nft_connlimit`).
    CtCount(CtCount),
    /// `counter name NAME` / `quota name NAME`: a named object of the
    /// rule's table, shared with every other rule that names it.
    ObjRef {
        kind: ObjKind,
        name: String,
    },
    /// `counter name KEY map { k : "name", ... }` (or `map @m`): the
    /// object the packet's key maps to; a key the map does not hold ends
    /// the rule, as the kernel's `nft_objref` map does.
    ObjMap {
        kind: ObjKind,
        key: Vec<Field>,
        map: Box<MapRef>,
    },
    /// `meta mark set KEY map { k : MARK, ... }` (or `map @m`; `ct mark
    /// set` with `ct`): the mark the packet's key maps to; a key the map
    /// does not hold ends the rule, as the kernel's `nft_lookup` of a map
    /// does.
    MarkMap {
        ct: bool,
        key: Vec<Field>,
        map: Box<MapRef>,
    },
    /// `numgen random|inc mod N [offset O] vmap { V : VERDICT, ... }`
    /// (kube-proxy's Service load balancing in its nftables mode): the
    /// verdict of the generated number; a number the map does not hold
    /// ends the rule.
    NumgenVmap {
        random: bool,
        modulus: u32,
        offset: u32,
        map: Box<MapRef>,
    },
}

/// `numgen inc|random mod N [offset O]` compared with a value, range or set
/// (the kernel's `nft_numgen`): `inc` counts 0, 1, ... N-1 and around, one
/// step per packet that reaches it, shared by every packet of the rule;
/// `random` draws uniformly from 0..N. `offset` is added. It is a match
/// evaluated with the rule's statements, in order, after its other
/// matches.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Numgen {
    pub random: bool,
    pub modulus: u32,
    pub offset: u32,
    /// The comparison, its left side [`Field::Numgen`].
    pub m: Match,
}

/// `ct count [over] N`, in a rule or in a dynamic set's element (the
/// kernel's `nft_connlimit`): a match on the connections counted by the
/// rule or for the element that are still open, this packet's own
/// included. Without `over` the rule matches while they are at most
/// `count`; with `over` once they are more.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub struct CtCount {
    pub count: u32,
    pub over: bool,
    /// Also count a connection first met on a later packet (iptables
    /// `-m connlimit`: Linux's `xt_connlimit` adds any connection it meets,
    /// `nft_connlimit` only one not yet confirmed, that is one meeting the
    /// statement with its first packet). nft syntax cannot say it: the
    /// printed form drops it.
    pub existing: bool,
}

/// `quota [over | until] N UNIT [used N UNIT]` (the kernel's `nft_quota`):
/// every packet adds its length to the bytes used; the rule matches while
/// the used bytes stay under the quota, or with `over` once they reach it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Quota {
    pub over: bool,
    pub amount: u64,
    pub unit: ByteUnit,
    /// Bytes already used when the rule is loaded.
    pub used: Option<(u64, ByteUnit)>,
}

impl Quota {
    /// The quota in bytes.
    pub fn bytes(&self) -> u64 {
        self.amount.saturating_mul(self.unit.bytes())
    }

    /// The bytes used at load.
    pub fn used_bytes(&self) -> u64 {
        self.used.map_or(0, |(n, u)| n.saturating_mul(u.bytes()))
    }
}

/// What [`SetUpdate`] does with the packet's key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SetOp {
    /// `add`: insert the key unless present (an existing element keeps its
    /// expiry).
    Add,
    /// `update`: insert the key, or give an existing element a fresh
    /// timeout.
    Update,
    /// `delete`: remove the key if present.
    Delete,
}

impl SetOp {
    pub fn name(self) -> &'static str {
        match self {
            SetOp::Add => "add",
            SetOp::Update => "update",
            SetOp::Delete => "delete",
        }
    }
}

/// `add | update | delete @set { KEY [timeout T] [limit ...] [quota ...]
/// [counter] [ct count [over] N] }`. The statement is also a match, as in
/// the kernel's `nft_dynset`: the rule stops when the set is full or the
/// element's `limit`, `quota` or `ct count` does not match (they run in
/// that order).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SetUpdate {
    pub op: SetOp,
    pub set: String,
    /// The key (a concatenation when more than one part).
    pub key: Vec<KeyPart>,
    /// The element's timeout in ms (default: the set's `timeout`).
    pub timeout_ms: Option<u64>,
    /// A `limit` kept per element.
    pub limit: Option<Limit>,
    /// A `counter` kept per element.
    pub counter: bool,
    /// A `ct count` kept per element (iptables `-m connlimit`).
    pub ct_count: Option<CtCount>,
    /// A byte `quota` kept per element.
    pub quota: Option<Quota>,
}

/// One part of a [`SetUpdate`]'s key: a field of the packet, or a constant
/// (`add @knock { ip saddr . 234 }`).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum KeyPart {
    Field(Field),
    /// A number or an address, of the set's key type at that place.
    Const(Value),
}

/// `1d2h3m4s500ms` → milliseconds: nft's time format (at least one part,
/// each unit at most once, in this order).
pub fn parse_duration(s: &str) -> Option<u64> {
    const UNITS: [(&str, u64); 5] = [
        ("d", 86_400_000),
        ("h", 3_600_000),
        ("ms", 1),
        ("m", 60_000),
        ("s", 1000),
    ];
    let mut rest = s;
    let mut total: u64 = 0;
    let mut last_rank = 0usize;
    if rest.is_empty() {
        return None;
    }
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return None;
        }
        let n: u64 = rest.get(..digits)?.parse().ok()?;
        rest = rest.get(digits..)?;
        let (unit, mult) = UNITS.iter().find(|(u, _)| rest.starts_with(u))?;
        // d < h < m < s < ms in the order they may appear.
        let rank = match *unit {
            "d" => 1,
            "h" => 2,
            "m" => 3,
            "s" => 4,
            _ => 5,
        };
        if rank <= last_rank {
            return None;
        }
        last_rank = rank;
        total = total.checked_add(n.checked_mul(*mult)?)?;
        rest = rest.get(unit.len()..)?;
    }
    Some(total)
}

/// Milliseconds in nft's time format (`90000` → `1m30s`).
pub fn format_duration(ms: u64) -> String {
    if ms == 0 {
        return "0s".into();
    }
    let mut out = String::new();
    let mut left = ms;
    for (unit, mult) in [
        ("d", 86_400_000u64),
        ("h", 3_600_000),
        ("m", 60_000),
        ("s", 1000),
        ("ms", 1),
    ] {
        let n = left / mult;
        if n > 0 {
            out.push_str(&format!("{n}{unit}"));
            left -= n * mult;
        }
    }
    out
}

/// The value of [`StmtKind::TcpMssSet`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TcpMss {
    /// `rt mtu` (`--clamp-mss-to-pmtu`): the smaller MTU of the routes to
    /// the destination and back to the source, less the IP and TCP headers.
    RtMtu,
    /// A fixed value (`--set-mss N`).
    Value(u16),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RejectWith {
    /// ICMP destination-unreachable code.
    Icmp(u8),
    /// ICMPv6 destination-unreachable code.
    Icmpv6(u8),
    /// Family-independent code (nft `icmpx`): 0 no-route, 1 port-unreachable,
    /// 2 host-unreachable, 3 admin-prohibited.
    Icmpx(u8),
    TcpReset,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Log {
    pub prefix: Option<String>,
    pub level: Option<LogLevel>,
    pub group: Option<u16>,
    /// `flags ...`, the kernel's `NF_LOG_*` bits ([`log_flags`]).
    pub flags: u8,
}

/// `log flags` bits (the kernel's `NF_LOG_*`).
pub mod log_flags {
    /// `tcp sequence`.
    pub const TCP_SEQ: u8 = 0x01;
    /// `tcp options`.
    pub const TCP_OPT: u8 = 0x02;
    /// `ip options`.
    pub const IP_OPT: u8 = 0x04;
    /// `skuid`.
    pub const UID: u8 = 0x08;
    /// `ether`.
    pub const MAC: u8 = 0x20;
    /// `all`.
    pub const ALL: u8 = TCP_SEQ | TCP_OPT | IP_OPT | UID | MAC;
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LogLevel {
    Emerg,
    Alert,
    Crit,
    Err,
    Warn,
    Notice,
    Info,
    Debug,
    Audit,
}

impl LogLevel {
    pub const ALL: [LogLevel; 9] = [
        LogLevel::Emerg,
        LogLevel::Alert,
        LogLevel::Crit,
        LogLevel::Err,
        LogLevel::Warn,
        LogLevel::Notice,
        LogLevel::Info,
        LogLevel::Debug,
        LogLevel::Audit,
    ];
    pub fn name(self) -> &'static str {
        match self {
            LogLevel::Emerg => "emerg",
            LogLevel::Alert => "alert",
            LogLevel::Crit => "crit",
            LogLevel::Err => "err",
            LogLevel::Warn => "warn",
            LogLevel::Notice => "notice",
            LogLevel::Info => "info",
            LogLevel::Debug => "debug",
            LogLevel::Audit => "audit",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum TimeUnit {
    Second,
    Minute,
    Hour,
    Day,
    Week,
}

impl TimeUnit {
    pub fn name(self) -> &'static str {
        match self {
            TimeUnit::Second => "second",
            TimeUnit::Minute => "minute",
            TimeUnit::Hour => "hour",
            TimeUnit::Day => "day",
            TimeUnit::Week => "week",
        }
    }
    pub fn seconds(self) -> u64 {
        match self {
            TimeUnit::Second => 1,
            TimeUnit::Minute => 60,
            TimeUnit::Hour => 3600,
            TimeUnit::Day => 86_400,
            TimeUnit::Week => 604_800,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ByteUnit {
    Bytes,
    Kbytes,
    Mbytes,
}

impl ByteUnit {
    pub fn name(self) -> &'static str {
        match self {
            ByteUnit::Bytes => "bytes",
            ByteUnit::Kbytes => "kbytes",
            ByteUnit::Mbytes => "mbytes",
        }
    }

    /// Bytes per unit.
    pub fn bytes(self) -> u64 {
        match self {
            ByteUnit::Bytes => 1,
            ByteUnit::Kbytes => 1024,
            ByteUnit::Mbytes => 1024 * 1024,
        }
    }
}

/// `limit rate [over] N[ unit]/per [burst B unit]`. `unit == None` means packets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Limit {
    pub over: bool,
    pub rate: u64,
    pub unit: Option<ByteUnit>,
    pub per: TimeUnit,
    pub burst: Option<u64>,
    pub burst_unit: Option<ByteUnit>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum NatKind {
    Snat,
    Dnat,
    Masquerade,
    Redirect,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum NatFlag {
    Random,
    FullyRandom,
    Persistent,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Nat {
    pub kind: NatKind,
    /// `snat ip to ...` in inet tables.
    pub family: Option<Family>,
    pub addr: Option<NatAddr>,
    /// Inclusive port range (`lo == hi` for a single port).
    pub ports: Option<(u16, u16)>,
    pub flags: Vec<NatFlag>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum NatAddr {
    Single(IpAddr),
    Range(IpAddr, IpAddr),
    /// `dnat to ip daddr map @m` / `map { ... }`; map data is an address.
    Map {
        key: Vec<Field>,
        map: MapRef,
    },
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MapRef {
    Named(String),
    Anon(Vec<Elem>),
}

/// The data types of a (possibly concatenated) key, computed from its fields
/// without a heap allocation for keys of up to four fields (the parser and
/// the validator need them once per match).
#[derive(Debug, Clone)]
pub(crate) struct KeyTypes {
    inline: [DataType; 4],
    len: usize,
    heap: Vec<DataType>,
}

impl KeyTypes {
    pub(crate) fn of(fields: &[Field]) -> Self {
        let mut k = KeyTypes {
            inline: [DataType::Verdict; 4],
            len: fields.len(),
            heap: Vec::new(),
        };
        if fields.len() <= k.inline.len() {
            for (slot, f) in k.inline.iter_mut().zip(fields) {
                *slot = f.datatype();
            }
        } else {
            k.heap = fields.iter().map(|f| f.datatype()).collect();
        }
        k
    }

    pub(crate) fn as_slice(&self) -> &[DataType] {
        self.inline.get(..self.len).unwrap_or(&self.heap)
    }
}
