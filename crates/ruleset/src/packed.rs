//! [`PackedRule`]: one [`Rule`] in a compact byte form, for keeping many
//! rules alive cheaply.
//!
//! A loaded policy keeps every rule for as long as it runs (listings print
//! it, an element change of a named set re-lowers the rules that read it).
//! As an AST, a typical rule (`ip saddr P ip daddr P tcp dport A-B accept`)
//! takes about 560 bytes in four allocations; packed, it takes about 90
//! bytes in one, and the AST can be freed right after lowering.
//!
//! The encoding is private to this module and lossless: [`PackedRule::unpack`]
//! gives back a rule equal to the packed one, spans included. Numbers are
//! LEB128 variable-length integers; the spans of matches, statements and
//! elements store their line relative to the rule's.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;

use crate::ast::*;

/// A [`Rule`] packed into bytes (cheap to clone: the bytes are shared).
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct PackedRule(Arc<[u8]>);

/// Header flag: the rule has a `counter` statement.
const HAS_COUNTER: u8 = 1;
/// Header flag: that counter names its packets or bytes.
const COUNTER_VALUES: u8 = 2;

impl PackedRule {
    /// Packs `r`.
    pub fn pack(r: &Rule) -> Self {
        Self::pack_with(r, &mut Vec::new())
    }

    /// [`Self::pack`]; a rule too large for a stack buffer is encoded in
    /// `scratch` (reuse it across rules).
    pub fn pack_with(r: &Rule, scratch: &mut Vec<u8>) -> Self {
        // Most rules fit the stack buffer: encoding there keeps the write
        // cursor in a register (about 3x fewer instructions than pushing
        // to a vector).
        let a = encode(
            r,
            ArraySink {
                buf: [0; 192],
                n: 0,
                full: false,
            },
        );
        if let (false, Some(b)) = (a.full, a.buf.get(..a.n)) {
            return PackedRule(Arc::from(b));
        }
        scratch.clear();
        encode(r, &mut *scratch);
        PackedRule(Arc::from(scratch.as_slice()))
    }

    /// The rule. `None` only if the bytes are not a packed rule, which
    /// cannot happen for a value built by [`Self::pack`].
    pub fn unpack(&self) -> Option<Rule> {
        let mut rd = Reader {
            b: &self.0,
            pos: 0,
            file: 0,
            line: 0,
        };
        rd.u8()?;
        let span = Span {
            file: rd.u32()?,
            line: rd.u32()?,
            col: rd.u32()?,
            len: rd.u32()?,
        };
        (rd.file, rd.line) = (span.file, span.line);
        let handle = rd.opt_num()?;
        let comment = rd.opt_str()?;
        let n = rd.len()?;
        let mut matches = Vec::with_capacity(n);
        for _ in 0..n {
            matches.push(rd.a_match()?);
        }
        let n = rd.len()?;
        let mut stmts = Vec::with_capacity(n);
        for _ in 0..n {
            let kind = rd.stmt()?;
            let span = rd.span()?;
            stmts.push(Stmt { kind, span });
        }
        (rd.pos == rd.b.len()).then_some(Rule {
            matches,
            stmts,
            handle,
            comment,
            span,
        })
    }

    /// The rule's `counter` statement, if it has one: the packets and
    /// bytes it names. Reads only the header unless it names some.
    pub fn counter(&self) -> Option<(Option<u64>, Option<u64>)> {
        let flags = self.0.first().copied().unwrap_or(0);
        if flags & HAS_COUNTER == 0 {
            None
        } else if flags & COUNTER_VALUES == 0 {
            Some((None, None))
        } else {
            self.unpack().as_ref().and_then(counter_of)
        }
    }

    /// The rule in canonical nft form ([`crate::rule_to_string`]).
    pub fn text(&self) -> String {
        self.unpack()
            .map(|r| crate::rule_to_string(&r))
            .unwrap_or_default()
    }

    /// Size of the packed form in bytes.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Always false: a packed rule has at least a header.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl From<&Rule> for PackedRule {
    fn from(r: &Rule) -> Self {
        PackedRule::pack(r)
    }
}

impl std::fmt::Debug for PackedRule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.unpack() {
            Some(r) => f.debug_tuple("PackedRule").field(&r).finish(),
            None => f.debug_tuple("PackedRule").field(&&self.0[..]).finish(),
        }
    }
}

/// The first `counter` statement of `r`: its (packets, bytes).
fn counter_of(r: &Rule) -> Option<(Option<u64>, Option<u64>)> {
    r.stmts.iter().find_map(|s| match s.kind {
        StmtKind::Counter { packets, bytes } => Some((packets, bytes)),
        _ => None,
    })
}

const RELOPS: [RelOp; 7] = [
    RelOp::Implicit,
    RelOp::Eq,
    RelOp::Ne,
    RelOp::Lt,
    RelOp::Gt,
    RelOp::Le,
    RelOp::Ge,
];
const FAMILIES: [Family; 3] = [Family::Ip, Family::Ip6, Family::Inet];
const BYTE_UNITS: [ByteUnit; 3] = [ByteUnit::Bytes, ByteUnit::Kbytes, ByteUnit::Mbytes];
const SET_OPS: [SetOp; 3] = [SetOp::Add, SetOp::Update, SetOp::Delete];
const TIME_UNITS: [TimeUnit; 5] = [
    TimeUnit::Second,
    TimeUnit::Minute,
    TimeUnit::Hour,
    TimeUnit::Day,
    TimeUnit::Week,
];
const NAT_KINDS: [NatKind; 4] = [
    NatKind::Snat,
    NatKind::Dnat,
    NatKind::Masquerade,
    NatKind::Redirect,
];
const NAT_FLAGS: [NatFlag; 3] = [NatFlag::Random, NatFlag::FullyRandom, NatFlag::Persistent];

/// Where [`Writer`] puts bytes.
trait Sink {
    fn put(&mut self, b: &[u8]);
}

impl Sink for &mut Vec<u8> {
    #[inline]
    fn put(&mut self, b: &[u8]) {
        self.extend_from_slice(b);
    }
}

/// A fixed buffer; `full` once a write did not fit (the bytes are then
/// useless).
struct ArraySink {
    buf: [u8; 192],
    n: usize,
    full: bool,
}

impl Sink for ArraySink {
    #[inline(always)]
    fn put(&mut self, b: &[u8]) {
        match self.buf.get_mut(self.n..self.n + b.len()) {
            Some(d) => {
                d.copy_from_slice(b);
                self.n += b.len();
            }
            None => self.full = true,
        }
    }
}

/// Encodes `r` into `out`.
fn encode<S: Sink>(r: &Rule, out: S) -> S {
    let mut w = Writer {
        out,
        file: r.span.file,
        line: r.span.line,
    };
    let mut flags = 0;
    if let Some((p, b)) = counter_of(r) {
        flags |= HAS_COUNTER;
        if p.is_some() || b.is_some() {
            flags |= COUNTER_VALUES;
        }
    }
    w.u8(flags);
    w.num(u64::from(r.span.file));
    w.num(u64::from(r.span.line));
    w.num(u64::from(r.span.col));
    w.num(u64::from(r.span.len));
    w.opt_num(r.handle);
    w.opt_str(r.comment.as_deref());
    w.num(r.matches.len() as u64);
    for m in &r.matches {
        w.a_match(m);
    }
    w.num(r.stmts.len() as u64);
    for s in &r.stmts {
        w.stmt(&s.kind);
        w.span(s.span);
    }
    w.out
}

struct Writer<S> {
    out: S,
    /// The rule's file and line (spans inside it store theirs relative to
    /// them).
    file: u32,
    line: u32,
}

impl<S: Sink> Writer<S> {
    #[inline(always)]
    fn put1(&mut self, v: u8) {
        self.out.put(&[v]);
    }

    #[inline(always)]
    fn u8(&mut self, v: u8) {
        self.put1(v);
    }

    #[inline]
    fn num(&mut self, v: u64) {
        if v < 0x80 {
            self.put1(v as u8);
        } else {
            self.num_long(v);
        }
    }

    fn num_long(&mut self, mut v: u64) {
        while v >= 0x80 {
            self.put1((v as u8) | 0x80);
            v >>= 7;
        }
        self.put1(v as u8);
    }

    #[inline]
    fn a_match(&mut self, m: &Match) {
        self.fields(&m.left);
        self.opt_num(m.mask);
        self.u8(m.op as u8);
        self.value(&m.right);
        self.span(m.span);
        self.span(m.right_span);
    }

    /// An optional `ct count`: 0 none, else 1 + (1 for `over`) + (2 for
    /// [`CtCount::existing`]), then N.
    fn ct_count(&mut self, c: Option<&CtCount>) {
        match c {
            None => self.u8(0),
            Some(c) => {
                self.u8(1 + u8::from(c.over) + 2 * u8::from(c.existing));
                self.num(u64::from(c.count));
            }
        }
    }

    fn opt_num(&mut self, v: Option<u64>) {
        match v {
            None => self.u8(0),
            Some(v) => {
                self.u8(1);
                self.num(v);
            }
        }
    }

    fn str(&mut self, s: &str) {
        self.num(s.len() as u64);
        self.out.put(s.as_bytes());
    }

    fn opt_str(&mut self, s: Option<&str>) {
        match s {
            None => self.u8(0),
            Some(s) => {
                self.u8(1);
                self.str(s);
            }
        }
    }

    fn opt_index(&mut self, v: Option<u8>) {
        self.u8(v.map_or(0, |v| v + 1));
    }

    /// A span inside the rule: two bytes (column, length) when it is on the
    /// rule's line with a column below 128 and a length below 256 (almost
    /// every one), else 0x80 and the four numbers.
    #[inline]
    fn span(&mut self, s: Span) {
        if s.file == self.file && s.line == self.line && s.col < 0x80 && s.len < 0x100 {
            self.out.put(&[s.col as u8, s.len as u8]);
        } else {
            self.span_long(s);
        }
    }

    fn span_long(&mut self, s: Span) {
        self.u8(0x80);
        self.num(u64::from(s.file));
        // Zig-zag: a span on an earlier line than the rule is possible in
        // principle (a rule spans lines, its parts keep their own lines).
        let d = i64::from(s.line) - i64::from(self.line);
        self.num(((d << 1) ^ (d >> 63)) as u64);
        self.num(u64::from(s.col));
        self.num(u64::from(s.len));
    }

    #[inline]
    fn fields(&mut self, fs: &[Field]) {
        if let [f] = fs {
            self.out.put(&[1, *f as u8]);
            return;
        }
        self.num(fs.len() as u64);
        for f in fs {
            self.u8(*f as u8);
        }
    }

    fn addr(&mut self, a: &IpAddr) {
        match a {
            IpAddr::V4(a) => {
                self.u8(4);
                self.out.put(&a.octets());
            }
            IpAddr::V6(a) => {
                self.u8(6);
                self.out.put(&a.octets());
            }
        }
    }

    #[inline]
    fn value(&mut self, v: &Value) {
        match v {
            Value::Num(n) => {
                self.u8(0);
                self.num(*n);
            }
            Value::Addr(a) => {
                self.u8(1);
                self.addr(a);
            }
            Value::Prefix {
                addr: IpAddr::V4(a),
                len,
            } => {
                let [a, b, c, d] = a.octets();
                self.out.put(&[2, 4, a, b, c, d, *len]);
            }
            Value::Prefix { addr, len } => {
                self.u8(2);
                self.addr(addr);
                self.u8(*len);
            }
            Value::Str(s) => {
                self.u8(3);
                self.str(s);
            }
            Value::Range(a, b) => {
                self.u8(4);
                self.value(a);
                self.value(b);
            }
            Value::Concat(vs) => {
                self.u8(5);
                self.num(vs.len() as u64);
                for v in vs {
                    self.value(v);
                }
            }
            Value::Set(es) => {
                self.u8(6);
                self.elems(es);
            }
            Value::SetRef(n) => {
                self.u8(7);
                self.str(n);
            }
            Value::Verdict(v) => {
                self.u8(8);
                self.verdict(v);
            }
        }
    }

    fn elems(&mut self, es: &[Elem]) {
        self.num(es.len() as u64);
        for e in es {
            self.value(&e.key);
            match &e.data {
                None => self.u8(0),
                Some(d) => {
                    self.u8(1);
                    self.value(d);
                }
            }
            self.span(e.span);
        }
    }

    #[inline]
    fn verdict(&mut self, v: &Verdict) {
        match v {
            Verdict::Accept => self.u8(0),
            Verdict::Drop => self.u8(1),
            Verdict::Return => self.u8(2),
            Verdict::Continue => self.u8(3),
            Verdict::Jump(c) => {
                self.u8(4);
                self.str(c);
            }
            Verdict::Goto(c) => {
                self.u8(5);
                self.str(c);
            }
        }
    }

    fn map_ref(&mut self, m: &MapRef) {
        match m {
            MapRef::Named(n) => {
                self.u8(0);
                self.str(n);
            }
            MapRef::Anon(es) => {
                self.u8(1);
                self.elems(es);
            }
        }
    }

    #[inline]
    fn stmt(&mut self, k: &StmtKind) {
        match k {
            StmtKind::Counter { packets, bytes } => {
                self.u8(0);
                self.opt_num(*packets);
                self.opt_num(*bytes);
            }
            StmtKind::Verdict(v) => {
                self.u8(1);
                self.verdict(v);
            }
            StmtKind::Reject(w) => {
                self.u8(2);
                match w {
                    None => self.u8(0),
                    Some(RejectWith::Icmp(c)) => {
                        self.u8(1);
                        self.u8(*c);
                    }
                    Some(RejectWith::Icmpv6(c)) => {
                        self.u8(2);
                        self.u8(*c);
                    }
                    Some(RejectWith::Icmpx(c)) => {
                        self.u8(3);
                        self.u8(*c);
                    }
                    Some(RejectWith::TcpReset) => self.u8(4),
                }
            }
            StmtKind::Log(l) => {
                self.u8(3);
                self.opt_str(l.prefix.as_deref());
                self.opt_index(l.level.map(|l| l as u8));
                self.opt_num(l.group.map(u64::from));
                self.u8(l.flags);
            }
            StmtKind::Limit(l) => {
                self.u8(4);
                self.u8(u8::from(l.over));
                self.num(l.rate);
                self.opt_index(l.unit.map(|u| u as u8));
                self.u8(l.per as u8);
                self.opt_num(l.burst);
                self.opt_index(l.burst_unit.map(|u| u as u8));
            }
            StmtKind::MetaMarkSet(m) => {
                self.u8(5);
                self.num(u64::from(*m));
            }
            StmtKind::CtMarkSet(m) => {
                self.u8(6);
                self.num(u64::from(*m));
            }
            StmtKind::TcpMssSet(TcpMss::RtMtu) => self.u8(9),
            StmtKind::MetaMarkFromCt => self.u8(11),
            StmtKind::CtMarkFromMeta => self.u8(12),
            StmtKind::Notrack => self.u8(21),
            StmtKind::FlowAdd(ft) => {
                self.u8(22);
                self.str(ft);
            }
            StmtKind::CtTimeoutSet(name) => {
                self.u8(23);
                self.str(name);
            }
            StmtKind::NftraceSet(on) => {
                self.u8(24);
                self.u8(*on);
            }
            StmtKind::MetaMarkMod { and, xor } => {
                self.u8(15);
                self.num(u64::from(*and));
                self.num(u64::from(*xor));
            }
            StmtKind::CtMarkMod { and, xor } => {
                self.u8(16);
                self.num(u64::from(*and));
                self.num(u64::from(*xor));
            }
            StmtKind::Quota(q) => {
                self.u8(14);
                self.u8(u8::from(q.over));
                self.num(q.amount);
                self.u8(q.unit as u8);
                match q.used {
                    None => self.u8(0),
                    Some((n, u)) => {
                        self.u8(1);
                        self.num(n);
                        self.u8(u as u8);
                    }
                }
            }
            StmtKind::CtCount(c) => {
                self.u8(18);
                self.ct_count(Some(c));
            }
            StmtKind::ObjRef { kind, name } => {
                self.u8(19);
                self.u8(match kind {
                    ObjKind::Counter => 0,
                    ObjKind::Quota => 1,
                    ObjKind::Limit => 2,
                });
                self.str(name);
            }
            StmtKind::Numgen(n) => {
                self.u8(17);
                self.u8(u8::from(n.random));
                self.num(u64::from(n.modulus));
                self.num(u64::from(n.offset));
                self.a_match(&n.m);
            }
            StmtKind::SetUpdate(u) => {
                self.u8(13);
                self.u8(u.op as u8);
                self.str(&u.set);
                self.num(u.key.len() as u64);
                for k in &u.key {
                    match k {
                        KeyPart::Field(f) => {
                            self.u8(0);
                            self.fields(std::slice::from_ref(f));
                        }
                        KeyPart::Const(v) => {
                            self.u8(1);
                            self.value(v);
                        }
                    }
                }
                self.opt_num(u.timeout_ms);
                match &u.limit {
                    None => self.u8(0),
                    Some(l) => {
                        self.u8(1);
                        self.stmt(&StmtKind::Limit(*l));
                    }
                }
                self.u8(u8::from(u.counter));
                self.ct_count(u.ct_count.as_ref());
                match &u.quota {
                    None => self.u8(0),
                    Some(q) => {
                        self.u8(1);
                        self.stmt(&StmtKind::Quota(*q));
                    }
                }
            }

            StmtKind::TcpMssSet(TcpMss::Value(v)) => {
                self.u8(10);
                self.num(u64::from(*v));
            }
            StmtKind::Nat(n) => {
                self.u8(7);
                self.u8(n.kind as u8);
                self.opt_index(n.family.map(|f| f as u8));
                match &n.addr {
                    None => self.u8(0),
                    Some(NatAddr::Single(a)) => {
                        self.u8(1);
                        self.addr(a);
                    }
                    Some(NatAddr::Range(a, b)) => {
                        self.u8(2);
                        self.addr(a);
                        self.addr(b);
                    }
                    Some(NatAddr::Map { key, map }) => {
                        self.u8(3);
                        self.fields(key);
                        self.map_ref(map);
                    }
                }
                match n.ports {
                    None => self.u8(0),
                    Some((lo, hi)) => {
                        self.u8(1);
                        self.num(u64::from(lo));
                        self.num(u64::from(hi));
                    }
                }
                self.num(n.flags.len() as u64);
                for f in &n.flags {
                    self.u8(*f as u8);
                }
            }
            StmtKind::VerdictMap { key, map } => {
                self.u8(8);
                self.fields(key);
                self.map_ref(map);
            }
            StmtKind::NumgenVmap {
                random,
                modulus,
                offset,
                map,
            } => {
                self.u8(26);
                self.u8(u8::from(*random));
                self.num(u64::from(*modulus));
                self.num(u64::from(*offset));
                self.map_ref(map);
            }
            StmtKind::MarkMap { ct, key, map } => {
                self.u8(25);
                self.u8(u8::from(*ct));
                self.fields(key);
                self.map_ref(map);
            }
            StmtKind::ObjMap { kind, key, map } => {
                self.u8(20);
                self.u8(match kind {
                    ObjKind::Counter => 0,
                    ObjKind::Quota => 1,
                    ObjKind::Limit => 2,
                });
                self.fields(key);
                self.map_ref(map);
            }
        }
    }
}

struct Reader<'b> {
    b: &'b [u8],
    pos: usize,
    file: u32,
    line: u32,
}

impl Reader<'_> {
    fn u8(&mut self) -> Option<u8> {
        let v = *self.b.get(self.pos)?;
        self.pos += 1;
        Some(v)
    }

    fn num(&mut self) -> Option<u64> {
        let mut v = 0u64;
        let mut shift = 0u32;
        loop {
            let b = self.u8()?;
            v |= u64::from(b & 0x7f).checked_shl(shift)?;
            if b & 0x80 == 0 {
                return Some(v);
            }
            shift += 7;
            if shift > 63 {
                return None;
            }
        }
    }

    fn u32(&mut self) -> Option<u32> {
        u32::try_from(self.num()?).ok()
    }

    fn u16(&mut self) -> Option<u16> {
        u16::try_from(self.num()?).ok()
    }

    /// A count of items that follow (each takes at least one byte).
    fn len(&mut self) -> Option<usize> {
        let n = usize::try_from(self.num()?).ok()?;
        (n <= self.b.len() - self.pos.min(self.b.len())).then_some(n)
    }

    fn a_match(&mut self) -> Option<Match> {
        let left = self.fields()?.into();
        let mask = self.opt_num()?;
        let op = *RELOPS.get(usize::from(self.u8()?))?;
        let right = self.value()?;
        let span = self.span()?;
        let right_span = self.span()?;
        Some(Match {
            left,
            mask,
            op,
            right,
            span,
            right_span,
        })
    }

    /// See the encoder's `ct_count`.
    fn ct_count(&mut self) -> Option<Option<CtCount>> {
        let b = match self.u8()? {
            0 => return Some(None),
            b @ 1..=4 => b - 1,
            _ => return None,
        };
        let count = u32::try_from(self.num()?).ok()?;
        Some(Some(CtCount {
            count,
            over: b & 1 != 0,
            existing: b & 2 != 0,
        }))
    }

    fn opt_num(&mut self) -> Option<Option<u64>> {
        match self.u8()? {
            0 => Some(None),
            1 => self.num().map(Some),
            _ => None,
        }
    }

    fn bytes(&mut self, n: usize) -> Option<&[u8]> {
        let s = self.b.get(self.pos..self.pos.checked_add(n)?)?;
        self.pos += n;
        Some(s)
    }

    fn str(&mut self) -> Option<String> {
        let n = self.len()?;
        let s = self.bytes(n)?;
        std::str::from_utf8(s).ok().map(str::to_string)
    }

    fn opt_str(&mut self) -> Option<Option<String>> {
        match self.u8()? {
            0 => Some(None),
            1 => self.str().map(Some),
            _ => None,
        }
    }

    /// An optional index into `table`.
    fn opt_index<T: Copy>(&mut self, table: &[T]) -> Option<Option<T>> {
        match self.u8()? {
            0 => Some(None),
            i => table.get(usize::from(i) - 1).copied().map(Some),
        }
    }

    fn span(&mut self) -> Option<Span> {
        match self.u8()? {
            0x80 => {}
            col @ 0..0x80 => {
                return Some(Span {
                    file: self.file,
                    line: self.line,
                    col: u32::from(col),
                    len: u32::from(self.u8()?),
                })
            }
            _ => return None,
        }
        let file = self.u32()?;
        let z = self.num()?;
        let d = ((z >> 1) as i64) ^ -((z & 1) as i64);
        let line = u32::try_from(i64::from(self.line).checked_add(d)?).ok()?;
        Some(Span {
            file,
            line,
            col: self.u32()?,
            len: self.u32()?,
        })
    }

    fn fields(&mut self) -> Option<Vec<Field>> {
        let n = self.len()?;
        let mut v = Vec::with_capacity(n);
        for _ in 0..n {
            v.push(*Field::ALL.get(usize::from(self.u8()?))?);
        }
        Some(v)
    }

    fn addr(&mut self) -> Option<IpAddr> {
        match self.u8()? {
            4 => {
                let o: [u8; 4] = self.bytes(4)?.try_into().ok()?;
                Some(IpAddr::V4(Ipv4Addr::from(o)))
            }
            6 => {
                let o: [u8; 16] = self.bytes(16)?.try_into().ok()?;
                Some(IpAddr::V6(Ipv6Addr::from(o)))
            }
            _ => None,
        }
    }

    fn value(&mut self) -> Option<Value> {
        Some(match self.u8()? {
            0 => Value::Num(self.num()?),
            1 => Value::Addr(self.addr()?),
            2 => Value::Prefix {
                addr: self.addr()?,
                len: self.u8()?,
            },
            3 => Value::Str(self.str()?),
            4 => Value::Range(Box::new(self.value()?), Box::new(self.value()?)),
            5 => {
                let n = self.len()?;
                let mut vs = Vec::with_capacity(n);
                for _ in 0..n {
                    vs.push(self.value()?);
                }
                Value::Concat(vs)
            }
            6 => Value::Set(self.elems()?),
            7 => Value::SetRef(self.str()?),
            8 => Value::Verdict(self.verdict()?),
            _ => return None,
        })
    }

    fn elems(&mut self) -> Option<Vec<Elem>> {
        let n = self.len()?;
        let mut es = Vec::with_capacity(n);
        for _ in 0..n {
            let key = self.value()?;
            let data = match self.u8()? {
                0 => None,
                1 => Some(self.value()?),
                _ => return None,
            };
            let span = self.span()?;
            es.push(Elem {
                key,
                data,
                span,
                opts: None,
            });
        }
        Some(es)
    }

    fn verdict(&mut self) -> Option<Verdict> {
        Some(match self.u8()? {
            0 => Verdict::Accept,
            1 => Verdict::Drop,
            2 => Verdict::Return,
            3 => Verdict::Continue,
            4 => Verdict::Jump(self.str()?),
            5 => Verdict::Goto(self.str()?),
            _ => return None,
        })
    }

    fn map_ref(&mut self) -> Option<MapRef> {
        Some(match self.u8()? {
            0 => MapRef::Named(self.str()?),
            1 => MapRef::Anon(self.elems()?),
            _ => return None,
        })
    }

    fn stmt(&mut self) -> Option<StmtKind> {
        Some(match self.u8()? {
            0 => StmtKind::Counter {
                packets: self.opt_num()?,
                bytes: self.opt_num()?,
            },
            1 => StmtKind::Verdict(self.verdict()?),
            2 => StmtKind::Reject(match self.u8()? {
                0 => None,
                1 => Some(RejectWith::Icmp(self.u8()?)),
                2 => Some(RejectWith::Icmpv6(self.u8()?)),
                3 => Some(RejectWith::Icmpx(self.u8()?)),
                4 => Some(RejectWith::TcpReset),
                _ => return None,
            }),
            3 => StmtKind::Log(Log {
                prefix: self.opt_str()?,
                level: self.opt_index(&LogLevel::ALL)?,
                group: match self.opt_num()? {
                    None => None,
                    Some(g) => Some(u16::try_from(g).ok()?),
                },
                flags: self.u8()?,
            }),
            4 => StmtKind::Limit(Limit {
                over: match self.u8()? {
                    0 => false,
                    1 => true,
                    _ => return None,
                },
                rate: self.num()?,
                unit: self.opt_index(&BYTE_UNITS)?,
                per: *TIME_UNITS.get(usize::from(self.u8()?))?,
                burst: self.opt_num()?,
                burst_unit: self.opt_index(&BYTE_UNITS)?,
            }),
            5 => StmtKind::MetaMarkSet(self.u32()?),
            6 => StmtKind::CtMarkSet(self.u32()?),
            7 => {
                let kind = *NAT_KINDS.get(usize::from(self.u8()?))?;
                let family = self.opt_index(&FAMILIES)?;
                let addr = match self.u8()? {
                    0 => None,
                    1 => Some(NatAddr::Single(self.addr()?)),
                    2 => Some(NatAddr::Range(self.addr()?, self.addr()?)),
                    3 => Some(NatAddr::Map {
                        key: self.fields()?,
                        map: self.map_ref()?,
                    }),
                    _ => return None,
                };
                let ports = match self.u8()? {
                    0 => None,
                    1 => Some((self.u16()?, self.u16()?)),
                    _ => return None,
                };
                let n = self.len()?;
                let mut flags = Vec::with_capacity(n);
                for _ in 0..n {
                    flags.push(*NAT_FLAGS.get(usize::from(self.u8()?))?);
                }
                StmtKind::Nat(Box::new(Nat {
                    kind,
                    family,
                    addr,
                    ports,
                    flags,
                }))
            }
            8 => StmtKind::VerdictMap {
                key: self.fields()?,
                map: Box::new(self.map_ref()?),
            },
            20 => {
                let kind = match self.u8()? {
                    0 => ObjKind::Counter,
                    1 => ObjKind::Quota,
                    2 => ObjKind::Limit,
                    _ => return None,
                };
                StmtKind::ObjMap {
                    kind,
                    key: self.fields()?,
                    map: Box::new(self.map_ref()?),
                }
            }
            26 => StmtKind::NumgenVmap {
                random: match self.u8()? {
                    0 => false,
                    1 => true,
                    _ => return None,
                },
                modulus: u32::try_from(self.num()?).ok()?,
                offset: u32::try_from(self.num()?).ok()?,
                map: Box::new(self.map_ref()?),
            },
            25 => StmtKind::MarkMap {
                ct: match self.u8()? {
                    0 => false,
                    1 => true,
                    _ => return None,
                },
                key: self.fields()?,
                map: Box::new(self.map_ref()?),
            },
            9 => StmtKind::TcpMssSet(TcpMss::RtMtu),
            10 => StmtKind::TcpMssSet(TcpMss::Value(self.u16()?)),
            11 => StmtKind::MetaMarkFromCt,
            12 => StmtKind::CtMarkFromMeta,
            21 => StmtKind::Notrack,
            22 => StmtKind::FlowAdd(self.str()?),
            23 => StmtKind::CtTimeoutSet(self.str()?),
            24 => StmtKind::NftraceSet(self.u8()?),
            15 => StmtKind::MetaMarkMod {
                and: self.u32()?,
                xor: self.u32()?,
            },
            16 => StmtKind::CtMarkMod {
                and: self.u32()?,
                xor: self.u32()?,
            },
            14 => {
                let over = match self.u8()? {
                    0 => false,
                    1 => true,
                    _ => return None,
                };
                let amount = self.num()?;
                let unit = *BYTE_UNITS.get(usize::from(self.u8()?))?;
                let used = match self.u8()? {
                    0 => None,
                    1 => Some((self.num()?, *BYTE_UNITS.get(usize::from(self.u8()?))?)),
                    _ => return None,
                };
                StmtKind::Quota(Quota {
                    over,
                    amount,
                    unit,
                    used,
                })
            }
            18 => StmtKind::CtCount(self.ct_count()??),
            19 => {
                let kind = match self.u8()? {
                    0 => ObjKind::Counter,
                    1 => ObjKind::Quota,
                    2 => ObjKind::Limit,
                    _ => return None,
                };
                StmtKind::ObjRef {
                    kind,
                    name: self.str()?,
                }
            }
            17 => {
                let random = match self.u8()? {
                    0 => false,
                    1 => true,
                    _ => return None,
                };
                let modulus = u32::try_from(self.num()?).ok()?;
                let offset = u32::try_from(self.num()?).ok()?;
                let m = self.a_match()?;
                StmtKind::Numgen(Box::new(Numgen {
                    random,
                    modulus,
                    offset,
                    m,
                }))
            }
            13 => {
                let op = *SET_OPS.get(usize::from(self.u8()?))?;
                let set = self.str()?;
                let n = self.len()?;
                let mut key = Vec::with_capacity(n.min(8));
                for _ in 0..n {
                    key.push(match self.u8()? {
                        0 => KeyPart::Field(*self.fields()?.first()?),
                        1 => KeyPart::Const(self.value()?),
                        _ => return None,
                    });
                }
                let timeout_ms = self.opt_num()?;
                let limit = match self.u8()? {
                    0 => None,
                    1 => match self.stmt()? {
                        StmtKind::Limit(l) => Some(l),
                        _ => return None,
                    },
                    _ => return None,
                };
                let counter = match self.u8()? {
                    0 => false,
                    1 => true,
                    _ => return None,
                };
                let ct_count = self.ct_count()?;
                let quota = match self.u8()? {
                    0 => None,
                    1 => match self.stmt()? {
                        StmtKind::Quota(q) => Some(q),
                        _ => return None,
                    },
                    _ => return None,
                };
                StmtKind::SetUpdate(Box::new(SetUpdate {
                    op,
                    set,
                    key,
                    timeout_ms,
                    limit,
                    counter,
                    ct_count,
                    quota,
                }))
            }

            _ => return None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The tables the decoder indexes agree with the `as u8` the encoder
    /// writes (declaration order).
    #[test]
    fn enum_tables_follow_declaration_order() {
        for (i, o) in SET_OPS.iter().enumerate() {
            assert_eq!(*o as usize, i);
        }
        for (i, f) in Field::ALL.iter().enumerate() {
            assert_eq!(*f as usize, i);
        }
        for (i, l) in LogLevel::ALL.iter().enumerate() {
            assert_eq!(*l as usize, i);
        }
        for (i, o) in RELOPS.iter().enumerate() {
            assert_eq!(*o as usize, i);
        }
        for (i, f) in FAMILIES.iter().enumerate() {
            assert_eq!(*f as usize, i);
        }
        for (i, u) in BYTE_UNITS.iter().enumerate() {
            assert_eq!(*u as usize, i);
        }
        for (i, u) in TIME_UNITS.iter().enumerate() {
            assert_eq!(*u as usize, i);
        }
        for (i, k) in NAT_KINDS.iter().enumerate() {
            assert_eq!(*k as usize, i);
        }
        for (i, f) in NAT_FLAGS.iter().enumerate() {
            assert_eq!(*f as usize, i);
        }
    }

    const TEXT: &str = r#"
define lan = { 10.0.0.0/8, 192.168.0.0/16 }
table inet t {
    set s { type ipv4_addr . inet_service; flags interval; elements = { 10.0.0.1 . 80 } }
    map m { type ipv4_addr : ipv4_addr; elements = { 10.0.0.1 : 10.9.9.9 } }
    map vm { type inet_service : verdict; elements = { 22 : accept } }
    chain c { }
    chain input {
        type filter hook input priority 0; policy drop;
        ip saddr $lan tcp dport { 22, 80-90 } ct state established,related counter accept comment "a \"quoted\" comment"
        ip6 saddr fe80::/10 ip6 daddr ::1 meta l4proto != 17 udp dport 53 counter packets 12 bytes 3456 drop
        ip saddr . tcp dport @s log prefix "hit: " level warn group 3 jump c
        tcp flags & (syn | ack) == syn limit rate over 10 mbytes/second burst 2 kbytes reject with tcp reset
        iifname "eth*" meta mark set 0x10 ct mark set 7 limit rate 5/minute goto c
        tcp dport vmap { 22 : accept, 23 : drop, 24 : jump c }
        tcp dport vmap @vm
        icmp type echo-request reject with icmp type admin-prohibited
        ip ttl 1-10 meta mark 0xff ip saddr 10.0.0.1 ip daddr != 10.0.0.0-10.0.0.255 return
        ip daddr . tcp dport { 192.0.2.1 . 443, 192.0.2.2 . 80-88 } continue
        iifname "a-very-long-interface-name*" oifname "another-long-name" ip saddr 192.168.100.100 ip daddr 192.168.200.200 tcp sport 1024-65535 tcp dport 443 counter accept comment "columns past 128"
    }
    chain pre {
        type nat hook prerouting priority -100;
        tcp dport 8080 dnat ip to 10.0.0.2:80
        dnat ip to ip daddr map @m
        dnat ip to ip saddr map { 10.0.0.1 : 10.1.1.1, 10.0.0.2 : 10.1.1.2 }
    }
    chain post {
        type nat hook postrouting priority 100;
        oifname "wan" snat ip to 192.0.2.1-192.0.2.9:1024-65535 random,persistent
        oifname "wan2" masquerade fully-random
    }
    chain out {
        type nat hook output priority -100;
        redirect to :3128
    }
}
"#;

    #[test]
    fn every_rule_round_trips_with_its_spans() {
        let rs = crate::parse_nft_str("t.nft", TEXT).unwrap_or_else(|d| panic!("{d}"));
        let mut n = 0;
        let mut scratch = Vec::new();
        for t in &rs.tables {
            for c in &t.chains {
                for r in &c.rules {
                    let p = PackedRule::pack(&r.clone());
                    assert_eq!(p.unpack().as_ref(), Some(r));
                    assert_eq!(PackedRule::pack_with(r, &mut scratch), p);
                    assert_eq!(p.text(), crate::rule_to_string(r));
                    assert_eq!(p.counter(), counter_of(r));
                    n += 1;
                }
            }
        }
        assert_eq!(n, 17);
    }

    /// A rule larger than the stack buffer is encoded in the scratch vector.
    #[test]
    fn a_large_rule_round_trips() {
        let set: Vec<String> = (0..100).map(|i| format!("10.0.{i}.1")).collect();
        let text = format!(
            "table ip t {{ chain c {{ ip saddr {{ {} }} counter accept }} }}",
            set.join(", ")
        );
        let rs = crate::parse_nft_str("t.nft", &text).unwrap_or_else(|d| panic!("{d}"));
        let r = &rs.tables[0].chains[0].rules[0];
        let p = PackedRule::pack(r);
        assert!(p.len() > 192, "{} bytes", p.len());
        assert_eq!(p.unpack().as_ref(), Some(r));
    }

    #[test]
    fn counters_are_read_from_the_header() {
        let rs = crate::parse_nft_str(
            "t.nft",
            "table ip t { chain c { counter accept\n counter packets 1 bytes 2 drop\n accept } }",
        )
        .unwrap_or_else(|d| panic!("{d}"));
        let got: Vec<_> = rs.tables[0].chains[0]
            .rules
            .iter()
            .map(|r| PackedRule::pack(r).counter())
            .collect();
        assert_eq!(
            got,
            vec![Some((None, None)), Some((Some(1), Some(2))), None]
        );
    }

    #[test]
    fn a_typical_rule_packs_small() {
        let rs = crate::parse_nft_str(
            "t.nft",
            "table ip t { chain c {\n ip saddr 215.0.0.0/8 ip daddr 53.126.61.0/24 tcp dport 11614-11881 accept\n } }",
        )
        .unwrap_or_else(|d| panic!("{d}"));
        let p = PackedRule::pack(&rs.tables[0].chains[0].rules[0]);
        assert!(p.len() <= 72, "{} bytes", p.len());
    }

    #[test]
    fn truncated_or_foreign_bytes_do_not_unpack() {
        let rs = crate::parse_nft_str("t.nft", TEXT).unwrap_or_else(|d| panic!("{d}"));
        for r in &rs.tables[0].chains[1].rules {
            let p = PackedRule::pack(r);
            for n in 0..p.0.len() {
                assert_eq!(PackedRule(Arc::from(&p.0[..n])).unpack(), None);
            }
        }
        assert_eq!(PackedRule(Arc::from(&[0xffu8; 40][..])).unpack(), None);
    }
}
