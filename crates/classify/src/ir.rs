//! The rule IR: packet view, field conditions, statements, verdicts, chains.
//!
//! The IR has no implicit dependencies: `tcp dport 22` lowers to two matches,
//! `l4proto == 6` and `dport == 22`, the way nft itself adds `meta l4proto tcp`.
//! IPv4 addresses are carried as IPv4-mapped IPv6 (`::ffff:a.b.c.d`, RFC 4291
//! §2.5.5.2), so one `u128` field covers both families.

use std::sync::Arc;

use hashbrown::HashSet;

/// Handle of a rule, unique within a program. Traces and verdicts name rules by it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RuleId(pub u64);

/// Index of a chain in [`Program::chains`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ChainId(pub u32);

/// Address family (`meta nfproto`), with the NFPROTO_* values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
#[repr(u8)]
pub enum Family {
    /// NFPROTO_IPV4.
    #[default]
    V4 = 2,
    /// NFPROTO_IPV6.
    V6 = 10,
}

/// An interface name, NUL padded to IFNAMSIZ (16) bytes like the kernel's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct IfName(pub [u8; 16]);

impl IfName {
    /// Builds a name; bytes past 15 are dropped (the kernel's limit).
    pub fn new(name: &str) -> Self {
        let mut b = [0u8; 16];
        for (d, s) in b.iter_mut().zip(name.as_bytes().iter().take(15)) {
            *d = *s;
        }
        IfName(b)
    }
    /// The name as a big-endian integer: a byte prefix of the name is a bit prefix.
    pub fn as_u128(&self) -> u128 {
        u128::from_be_bytes(self.0)
    }
}

/// `ct state` bits, with the values nft uses.
pub mod ct {
    /// Invalid packet.
    pub const INVALID: u8 = 1;
    /// Part of an established connection.
    pub const ESTABLISHED: u8 = 2;
    /// Related to an established connection (ICMP errors, FTP data).
    pub const RELATED: u8 = 4;
    /// First packet of a new connection.
    pub const NEW: u8 = 8;
    /// Marked notrack.
    pub const UNTRACKED: u8 = 64;
    /// The states of a packet that has a connection: `ct mark`, `ct
    /// status` and `ct direction` read it, `ct mark set` writes it. An
    /// invalid or untracked packet has none (the kernel's `nf_ct_get` is
    /// NULL): those expressions stop the rule and `ct mark set` does
    /// nothing.
    pub const WITH_CONNECTION: u8 = ESTABLISHED | RELATED | NEW;

    /// Whether a packet in `state` has a connection.
    #[inline]
    pub const fn has_connection(state: u8) -> bool {
        state & WITH_CONNECTION != 0
    }
}

/// IPv4 address as IPv4-mapped IPv6.
pub const fn map_v4(addr: u32) -> u128 {
    0xffff_u128 << 32 | addr as u128
}

/// The packet as the classifier sees it. Built once per packet by the engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct PacketFields {
    /// Input interface index.
    pub iif: u32,
    /// Output interface index.
    pub oif: u32,
    /// Input interface name.
    pub iifname: IfName,
    /// Output interface name.
    pub oifname: IfName,
    /// Address family.
    pub family: Family,
    /// Source address (IPv4 mapped, see [`map_v4`]).
    pub saddr: u128,
    /// Destination address (IPv4 mapped).
    pub daddr: u128,
    /// Layer-4 protocol number.
    pub l4proto: u8,
    /// Source port (0 when the protocol has none).
    pub sport: u16,
    /// Destination port (0 when the protocol has none).
    pub dport: u16,
    /// TCP flags byte.
    pub tcp_flags: u8,
    /// ICMP / ICMPv6 type.
    pub icmp_type: u8,
    /// ICMP / ICMPv6 code.
    pub icmp_code: u8,
    /// Conntrack state, one of the [`ct`] bits.
    pub ct_state: u8,
    /// Conntrack mark.
    pub ct_mark: u32,
    /// Packet mark (`meta mark`).
    pub mark: u32,
    /// Conntrack status bits (`ct status`), netfilter's `IPS_*` values:
    /// expected 1, seen-reply 2, assured 4, confirmed 8, snat 16, dnat 32,
    /// dying 512.
    pub ct_status: u32,
    /// IPv4 TTL or IPv6 hop limit, as received.
    pub ttl: u8,
    /// The IP header's length field: IPv4 total length, IPv6 payload
    /// length (`ip length`, `ip6 length`).
    pub ip_len: u16,
    /// DiffServ code point (the top 6 bits of the TOS / traffic class).
    pub dscp: u8,
    /// Packet length from the network header on (`meta length`).
    pub length: u32,
    /// `meta pkttype`: 0 host, 1 broadcast, 2 multicast, 3 other host.
    pub pkttype: u8,
    /// `fib daddr type`: the route type of the destination (`RTN_*`: 1
    /// unicast, 2 local, 3 broadcast, 5 multicast).
    pub daddr_type: u8,
    /// `fib saddr type`.
    pub saddr_type: u8,
    /// `ether saddr`: the frame's source MAC, first byte most significant.
    pub ether_saddr: u64,
    /// `ether daddr`.
    pub ether_daddr: u64,
    /// `ct direction`: 0 original, 1 reply.
    pub ct_dir: u8,
    /// `fib saddr . iif oif`: 1 when a route back to the source leaves
    /// through the input interface, else 0 (missing).
    pub rpf_iif: u8,
    /// `fib saddr oif`: 1 when any route back to the source exists.
    pub rpf_any: u8,
    /// The connection the packet belongs to (what `ct count` counts).
    pub conn: ConnId,
    /// When the packet is seen, ns since the epoch (UTC): `meta time`,
    /// and through it `meta day` and `meta hour`.
    pub time_ns: u64,
    /// The connection's original tuple (`ct original ...`): addresses as
    /// `saddr`/`daddr` are (IPv4 mapped), then ports.
    pub ct_orig: CtTuple,
    /// The connection's reply tuple (`ct reply ...`).
    pub ct_reply: CtTuple,
    /// `ip frag-off` as the chains see it: the packet after reassembly,
    /// so the DF flag (0x4000) alone can be set.
    pub frag_off: u16,
}

/// One direction's tuple of a connection, as `ct original` / `ct reply`
/// read it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, Hash)]
pub struct CtTuple {
    /// Source address (IPv4 as IPv4-mapped IPv6).
    pub saddr: u128,
    /// Destination address.
    pub daddr: u128,
    /// Source port (or ICMP identifier).
    pub sport: u16,
    /// Destination port.
    pub dport: u16,
}

/// A connection, by its original direction's tuple as conntrack keeps it
/// (before any NAT): the identity `ct count` counts. Addresses as in
/// [`PacketFields`] (IPv4 mapped).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct ConnId {
    pub saddr: u128,
    pub daddr: u128,
    pub sport: u16,
    pub dport: u16,
    pub proto: u8,
}

/// A field a condition can test. Every field reads as a zero-extended `u128`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Field {
    /// `meta iif`.
    Iif,
    /// `meta oif`.
    Oif,
    /// `meta iifname`, see [`IfName::as_u128`].
    IifName,
    /// `meta oifname`.
    OifName,
    /// `meta nfproto`.
    Family,
    /// Source address.
    Saddr,
    /// Destination address.
    Daddr,
    /// `meta l4proto`.
    L4Proto,
    /// `th sport`.
    Sport,
    /// `th dport`.
    Dport,
    /// `tcp flags`.
    TcpFlags,
    /// ICMP type.
    IcmpType,
    /// ICMP code.
    IcmpCode,
    /// `ct state`.
    CtState,
    /// `ct mark`.
    CtMark,
    /// `meta mark`.
    Mark,
    /// `ct status`.
    CtStatus,
    /// `ip ttl`, `ip6 hoplimit`.
    Ttl,
    /// `ip length`, `ip6 length`.
    IpLen,
    /// `ip dscp`, `ip6 dscp`.
    Dscp,
    /// `meta length`.
    Length,
    /// `meta pkttype`.
    PktType,
    /// `fib daddr type`.
    DaddrType,
    /// `fib saddr type`.
    SaddrType,
    /// `ether saddr`.
    EtherSaddr,
    /// `ether daddr`.
    EtherDaddr,
    /// `ct direction`.
    CtDir,
    /// `fib saddr . iif oif` (present or missing).
    RpfIif,
    /// `fib saddr oif`.
    RpfAny,
    /// `meta time`: ns since the epoch.
    Time,
    /// `meta day`: the day of the week, 0 Sunday.
    Day,
    /// `meta hour`: seconds since midnight.
    Hour,
    /// `ct original ip|ip6 saddr`.
    CtOrigSaddr,
    /// `ct original ip|ip6 daddr`.
    CtOrigDaddr,
    /// `ct reply ip|ip6 saddr`.
    CtReplySaddr,
    /// `ct reply ip|ip6 daddr`.
    CtReplyDaddr,
    /// `ct original proto-src`.
    CtOrigSport,
    /// `ct original proto-dst`.
    CtOrigDport,
    /// `ct reply proto-src`.
    CtReplySport,
    /// `ct reply proto-dst`.
    CtReplyDport,
    /// `ip frag-off`: flags and offset after reassembly.
    FragOff,
}

impl Field {
    /// Width of the field in bits.
    pub const fn width(self) -> u32 {
        match self {
            Field::Iif
            | Field::Oif
            | Field::CtMark
            | Field::Mark
            | Field::CtStatus
            | Field::Length
            | Field::Hour => 32,
            Field::Time => 64,
            Field::IpLen => 16,
            Field::EtherSaddr | Field::EtherDaddr => 48,
            Field::IifName
            | Field::OifName
            | Field::Saddr
            | Field::Daddr
            | Field::CtOrigSaddr
            | Field::CtOrigDaddr
            | Field::CtReplySaddr
            | Field::CtReplyDaddr => 128,
            Field::Sport
            | Field::Dport
            | Field::CtOrigSport
            | Field::CtOrigDport
            | Field::CtReplySport
            | Field::CtReplyDport
            | Field::FragOff => 16,
            Field::Family
            | Field::L4Proto
            | Field::TcpFlags
            | Field::IcmpType
            | Field::IcmpCode
            | Field::CtState
            | Field::Ttl
            | Field::Dscp
            | Field::PktType
            | Field::DaddrType
            | Field::SaddrType
            | Field::CtDir
            | Field::RpfIif
            | Field::RpfAny
            | Field::Day => 8,
        }
    }
    /// Largest value of the field.
    pub const fn max(self) -> u128 {
        u128::MAX >> (128 - self.width())
    }
}

impl PacketFields {
    /// Reads one field.
    #[inline]
    pub fn get(&self, f: Field) -> u128 {
        match f {
            Field::Iif => self.iif as u128,
            Field::Oif => self.oif as u128,
            Field::IifName => self.iifname.as_u128(),
            Field::OifName => self.oifname.as_u128(),
            Field::Family => self.family as u8 as u128,
            Field::Saddr => self.saddr,
            Field::Daddr => self.daddr,
            Field::L4Proto => self.l4proto as u128,
            Field::Sport => self.sport as u128,
            Field::Dport => self.dport as u128,
            Field::TcpFlags => self.tcp_flags as u128,
            Field::IcmpType => self.icmp_type as u128,
            Field::IcmpCode => self.icmp_code as u128,
            Field::CtState => self.ct_state as u128,
            Field::CtMark => self.ct_mark as u128,
            Field::Mark => self.mark as u128,
            Field::CtStatus => self.ct_status as u128,
            Field::Ttl => self.ttl as u128,
            Field::IpLen => self.ip_len as u128,
            Field::Dscp => self.dscp as u128,
            Field::Length => self.length as u128,
            Field::PktType => self.pkttype as u128,
            Field::DaddrType => self.daddr_type as u128,
            Field::SaddrType => self.saddr_type as u128,
            Field::EtherSaddr => self.ether_saddr as u128,
            Field::EtherDaddr => self.ether_daddr as u128,
            Field::CtDir => self.ct_dir as u128,
            Field::RpfIif => self.rpf_iif as u128,
            Field::RpfAny => self.rpf_any as u128,
            Field::Time => self.time_ns as u128,
            // 1970-01-01 was a Thursday (day 4).
            Field::Day => ((self.time_ns / NS_PER_DAY + 4) % 7) as u128,
            Field::Hour => ((self.time_ns % NS_PER_DAY) / 1_000_000_000) as u128,
            Field::CtOrigSaddr => self.ct_orig.saddr,
            Field::CtOrigDaddr => self.ct_orig.daddr,
            Field::CtReplySaddr => self.ct_reply.saddr,
            Field::CtReplyDaddr => self.ct_reply.daddr,
            Field::CtOrigSport => self.ct_orig.sport as u128,
            Field::CtOrigDport => self.ct_orig.dport as u128,
            Field::CtReplySport => self.ct_reply.sport as u128,
            Field::CtReplyDport => self.ct_reply.dport as u128,
            Field::FragOff => self.frag_off as u128,
        }
    }
}

const NS_PER_DAY: u64 = 86_400 * 1_000_000_000;

/// An inclusive range of field values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Range {
    /// Lowest value.
    pub lo: u128,
    /// Highest value (inclusive).
    pub hi: u128,
}

impl Range {
    /// `lo..=hi`; the bounds are swapped when given backwards.
    pub fn new(lo: u128, hi: u128) -> Self {
        if lo <= hi {
            Range { lo, hi }
        } else {
            Range { lo: hi, hi: lo }
        }
    }
    /// One value.
    pub const fn value(v: u128) -> Self {
        Range { lo: v, hi: v }
    }
    /// The prefix `v/len` of a field `width` bits wide (`len` is clamped to `width`).
    pub fn prefix(v: u128, len: u32, width: u32) -> Self {
        let width = width.clamp(1, 128);
        let len = len.min(width);
        let field_max = u128::MAX >> (128 - width);
        let host = field_max.checked_shr(len).unwrap_or(0);
        let lo = v & field_max & !host;
        Range { lo, hi: lo | host }
    }
    /// An IPv4 CIDR as a mapped-address range.
    pub fn v4_cidr(addr: u32, len: u32) -> Self {
        Range::prefix(map_v4(addr), 96 + len.min(32), 128)
    }
    /// Whether `v` is inside.
    #[inline]
    pub fn contains(&self, v: u128) -> bool {
        self.lo <= v && v <= self.hi
    }
}

/// A normalized set of values: sorted, disjoint, non-adjacent ranges. Covers a
/// single value, a CIDR, a range, an anonymous set and a named set's contents
/// (share a named set between rules by cloning the `ValueSet`; a set of more
/// than one range is an `Arc`). A single range, what most matches are, is
/// held inline: no allocation.
#[derive(Clone)]
pub struct ValueSet(SetRepr);

#[derive(Clone)]
enum SetRepr {
    One(Range),
    Many(Arc<[Range]>),
}

impl PartialEq for ValueSet {
    fn eq(&self, other: &Self) -> bool {
        self.ranges() == other.ranges()
    }
}

impl Eq for ValueSet {}

impl std::hash::Hash for ValueSet {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.ranges().hash(state);
    }
}

impl std::fmt::Debug for ValueSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("ValueSet").field(&self.ranges()).finish()
    }
}

impl ValueSet {
    /// Normalizes any collection of ranges.
    pub fn new<I: IntoIterator<Item = Range>>(ranges: I) -> Self {
        let mut it = ranges.into_iter();
        // One range (the common case: a value, prefix or range match) needs
        // no sorting or merging, and is held inline.
        let (Some(a), b) = (it.next(), it.next()) else {
            return ValueSet(SetRepr::Many(Arc::new([])));
        };
        let Some(b) = b else {
            return ValueSet(SetRepr::One(a));
        };
        let mut v: Vec<Range> = [a, b].into_iter().chain(it).collect();
        v.sort_unstable();
        // Merge overlapping and adjacent ranges in place (`r` follows `last`).
        v.dedup_by(|r, last| {
            if r.lo <= last.hi.saturating_add(1) {
                last.hi = last.hi.max(r.hi);
                true
            } else {
                false
            }
        });
        ValueSet::from_sorted(v)
    }
    /// From normalized ranges.
    fn from_sorted(v: Vec<Range>) -> Self {
        match v.as_slice() {
            [one] => ValueSet(SetRepr::One(*one)),
            _ => ValueSet(SetRepr::Many(v.into())),
        }
    }
    /// A single value.
    pub fn value(v: u128) -> Self {
        ValueSet::new([Range::value(v)])
    }
    /// The ranges, sorted and disjoint.
    pub fn ranges(&self) -> &[Range] {
        match &self.0 {
            SetRepr::One(r) => std::slice::from_ref(r),
            SetRepr::Many(v) => v,
        }
    }
    /// Membership by binary search.
    #[inline]
    pub fn contains(&self, v: u128) -> bool {
        let r = self.ranges();
        if r.len() <= 4 {
            return r.iter().any(|x| x.contains(v));
        }
        let i = r.partition_point(|x| x.hi < v);
        r.get(i).is_some_and(|x| x.lo <= v)
    }
    /// The complement within `0..=max`.
    pub fn complement(&self, max: u128) -> Self {
        let mut out = Vec::with_capacity(self.ranges().len() + 1);
        let mut next = Some(0u128);
        for r in self.ranges() {
            let Some(n) = next else { break };
            if r.lo > max {
                break;
            }
            if r.lo > n {
                out.push(Range {
                    lo: n,
                    hi: r.lo - 1,
                });
            }
            next = r.hi.checked_add(1);
        }
        if let Some(n) = next {
            if n <= max {
                out.push(Range { lo: n, hi: max });
            }
        }
        ValueSet::from_sorted(out)
    }
}

/// Elements of a concatenated set, e.g. `(daddr . dport)`. Each element holds one
/// range per component. Fully exact elements (up to 4 components) are also kept
/// in a hash set for the compiled path; the reference path scans `elements`.
#[derive(Clone, Debug)]
pub struct ConcatSet {
    elements: Vec<Box<[Range]>>,
    exact: HashSet<[u128; 4]>,
    ranged: Vec<Box<[Range]>>,
}

impl ConcatSet {
    /// Builds a set; every element must have the same number of components.
    pub fn new(elements: Vec<Box<[Range]>>) -> Self {
        let mut exact = HashSet::new();
        let mut ranged = Vec::new();
        for e in &elements {
            if e.len() <= 4 && e.iter().all(|r| r.lo == r.hi) {
                let mut k = [0u128; 4];
                for (d, r) in k.iter_mut().zip(e.iter()) {
                    *d = r.lo;
                }
                exact.insert(k);
            } else {
                ranged.push(e.clone());
            }
        }
        ConcatSet {
            elements,
            exact,
            ranged,
        }
    }
    /// All elements.
    pub fn elements(&self) -> &[Box<[Range]>] {
        &self.elements
    }
    /// Reference membership: a literal scan of every element.
    pub fn contains_scan(&self, vals: &[u128]) -> bool {
        self.elements
            .iter()
            .any(|e| e.len() == vals.len() && e.iter().zip(vals).all(|(r, v)| r.contains(*v)))
    }
    /// Fast membership: hash probe for exact elements, then a scan of the ranged ones.
    pub fn contains(&self, vals: &[u128]) -> bool {
        if vals.len() <= 4 {
            let mut k = [0u128; 4];
            for (d, v) in k.iter_mut().zip(vals) {
                *d = *v;
            }
            if self.exact.contains(&k) {
                return true;
            }
        }
        self.ranged
            .iter()
            .any(|e| e.len() == vals.len() && e.iter().zip(vals).all(|(r, v)| r.contains(*v)))
    }
}

/// One condition of a rule. A rule matches when all its conditions hold.
#[derive(Clone, Debug)]
pub enum Match {
    /// The field's value is in the set (or not, when `negate`).
    In {
        /// Tested field.
        field: Field,
        /// Accepted values.
        set: ValueSet,
        /// `!=` / `!= { … }`.
        negate: bool,
    },
    /// `field & mask == value` (or `!=`): tcp flags, marks, ct state bits.
    /// `tcp flags & (syn|ack) != 0` is `Masked { value: 0, negate: true }`.
    Masked {
        /// Tested field.
        field: Field,
        /// Mask.
        mask: u128,
        /// Expected value after masking.
        value: u128,
        /// Invert the result.
        negate: bool,
    },
    /// Concatenated-set membership: `(f0 . f1 …) in set`.
    Concat {
        /// Components, in order.
        fields: Arc<[Field]>,
        /// The set.
        set: Arc<ConcatSet>,
        /// `!=`.
        negate: bool,
    },
}

impl Match {
    /// `field == v`.
    pub fn eq(field: Field, v: u128) -> Self {
        Match::In {
            field,
            set: ValueSet::value(v),
            negate: false,
        }
    }
    /// `field in {ranges}`.
    pub fn in_ranges<I: IntoIterator<Item = Range>>(field: Field, ranges: I, negate: bool) -> Self {
        Match::In {
            field,
            set: ValueSet::new(ranges),
            negate,
        }
    }
    /// Interface name patterns; a trailing `*` matches any name with that
    /// prefix (nft compares only the bytes before the `*`).
    pub fn ifname(field: Field, patterns: &[&str], negate: bool) -> Self {
        let ranges = patterns.iter().map(|p| match p.strip_suffix('*') {
            Some(pre) => {
                let pre = &pre.as_bytes()[..pre.len().min(15)];
                let mut b = [0u8; 16];
                b[..pre.len()].copy_from_slice(pre);
                Range::prefix(u128::from_be_bytes(b), 8 * pre.len() as u32, 128)
            }
            None => Range::value(IfName::new(p).as_u128()),
        });
        Match::in_ranges(field, ranges, negate)
    }
    /// Reference semantics, evaluated literally.
    pub fn matches(&self, p: &PacketFields) -> bool {
        match self {
            Match::In { field, set, negate } => {
                let v = p.get(*field);
                set.ranges().iter().any(|r| r.contains(v)) != *negate
            }
            Match::Masked {
                field,
                mask,
                value,
                negate,
            } => (p.get(*field) & mask == *value) != *negate,
            Match::Concat {
                fields,
                set,
                negate,
            } => {
                let vals: Vec<u128> = fields.iter().map(|f| p.get(*f)).collect();
                set.contains_scan(&vals) != *negate
            }
        }
    }
}

/// `mark = (mark & and) ^ xor`; `mark set 5` is `{ and: 0, xor: 5 }`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MarkOp {
    /// Bits kept.
    pub and: u32,
    /// Bits flipped after masking.
    pub xor: u32,
}

impl MarkOp {
    /// `set v`.
    pub const fn set(v: u32) -> Self {
        MarkOp { and: 0, xor: v }
    }
    /// Applies the operation.
    pub const fn apply(self, m: u32) -> u32 {
        (m & self.and) ^ self.xor
    }
}

/// Non-terminal statements. They run in rule order; the classifier applies the
/// mark changes (later rules see them) and reports the rest through the trace.
/// `limit` is a match: the evaluation asks the caller's buckets
/// ([`crate::Limits`], through [`crate::Scratch::limit`]); without them every
/// limit is within its rate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Stmt {
    /// `counter`.
    Counter,
    /// `log` (opaque id of the log spec).
    Log(u32),
    /// `meta mark set`.
    MarkSet(MarkOp),
    /// `meta mark set ct mark` (iptables `CONNMARK --restore-mark`).
    MarkFromCtMark,
    /// `ct mark set meta mark` (iptables `CONNMARK --save-mark`).
    CtMarkFromMark,
    /// `ct mark set`.
    CtMarkSet(MarkOp),
    /// `limit` (opaque id of the limiter).
    Limit(u32),
    /// `quota` (opaque id): a match on the bytes the rule has seen, the
    /// caller's state answers ([`crate::Limits::quota`]); `stateless` is
    /// the answer without state (a quota not yet used up).
    Quota {
        /// The quota.
        id: u32,
        /// The result when the evaluation has no state.
        stateless: bool,
    },
    /// `ct count [over] N` in a rule (opaque id): a match on the open
    /// connections the rule counted, the caller's state answers
    /// ([`crate::Limits::ct_count`]); `stateless` is the answer without
    /// state (the packet's own connection the only one).
    CtCount {
        /// The statement.
        id: u32,
        /// The result when the evaluation has no state.
        stateless: bool,
    },
    /// `numgen inc|random mod N ... OP VALUE` (opaque id): a match on a
    /// generated number, the caller's state answers
    /// ([`crate::Limits::numgen`]); `stateless` is the answer without
    /// state (the generator's first number).
    Numgen {
        /// The generator.
        id: u32,
        /// The result when the evaluation has no state.
        stateless: bool,
    },
    /// A dynamic set's lookup (`ip saddr @s`) or update (`add`, `update`,
    /// `delete @s { ... }`), opaque id of the operation: a match the
    /// caller's state answers ([`crate::Limits::set_op`]); `stateless` is
    /// the answer without state (every dynamic set empty).
    SetOp {
        /// The operation.
        id: u32,
        /// The result when the evaluation has no state.
        stateless: bool,
    },
    /// A named object of the rule set (opaque id): `counter name "c"`
    /// counts the packet, `quota name "q"` is a match on its bytes; the
    /// caller's state does both ([`crate::Limits::object`]). `stateless`
    /// is the answer without state (a counter always goes on; a quota is
    /// not yet used up).
    Obj {
        /// The object.
        id: u32,
        /// The result when the evaluation has no state.
        stateless: bool,
    },
    /// `tcp option maxseg size set`: [`TCP_MSS_RT_MTU`] for `rt mtu`, else
    /// the value. A side effect on the packet the engine performs; the
    /// classifier's fields do not change.
    TcpMss(u32),
    /// `flow add @ft` (opaque id of the flowtable): a side effect the
    /// engine performs (the connection joins the flowtable); the
    /// classifier's fields do not change.
    FlowAdd(u32),
    /// `ct timeout set "NAME"` (opaque id of the policy, and the IP
    /// protocol it is for): a side effect the engine performs on a new
    /// connection of that protocol; the classifier's fields do not change.
    CtTimeout {
        /// The policy.
        id: u32,
        /// Its IP protocol.
        proto: u8,
    },
    /// `notrack` (iptables `-j CT --notrack`): a packet that has no
    /// connection yet (`ct state` reads [`ct::INVALID`], as before
    /// conntrack) becomes [`ct::UNTRACKED`]; on any other packet it does
    /// nothing (the kernel's `nft_notrack`).
    Notrack,
}

/// [`Stmt::TcpMss`] of `rt mtu`.
pub const TCP_MSS_RT_MTU: u32 = 0x1_0000;

/// `reject with …`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RejectKind {
    /// ICMP port unreachable (default).
    IcmpPortUnreachable,
    /// ICMP admin prohibited.
    IcmpAdminProhibited,
    /// TCP reset.
    TcpReset,
}

/// Verdicts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Verdict {
    /// `accept`.
    Accept,
    /// `drop`.
    Drop,
    /// `reject`.
    Reject(RejectKind),
    /// `jump chain`: push a return point.
    Jump(ChainId),
    /// `goto chain`: no return point.
    Goto(ChainId),
    /// `return`.
    Return,
    /// A NAT action, opaque to the classifier (terminal).
    Nat(u32),
}

/// A rule: conditions, statements, optional verdict.
#[derive(Clone, Debug)]
pub struct Rule {
    /// Handle.
    pub id: RuleId,
    /// Conjunction of conditions.
    pub matches: Vec<Match>,
    /// Non-terminal statements, run in order when the rule matches.
    pub stmts: Vec<Stmt>,
    /// Verdict; `None` continues with the next rule.
    pub verdict: Option<Verdict>,
}

/// Base chain policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Policy {
    /// `policy accept`.
    Accept,
    /// `policy drop`.
    Drop,
}

/// Base chains have a policy; regular chains are only reachable by jump/goto.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ChainKind {
    /// Hooked chain.
    Base(Policy),
    /// Regular chain.
    Regular,
}

/// An ordered list of rules.
#[derive(Clone, Debug)]
pub struct Chain {
    /// Name, for diagnostics.
    pub name: String,
    /// Base or regular.
    pub kind: ChainKind,
    /// Rules in evaluation order.
    pub rules: Vec<Rule>,
}

/// A set of chains; [`ChainId`] `n` is `chains[n]`.
#[derive(Clone, Debug, Default)]
pub struct Program {
    /// The chains.
    pub chains: Vec<Chain>,
}
