//! Semantic checks on a parsed [`Ruleset`]: references (chains, sets, maps),
//! value types and ranges, base-chain type/hook combinations, NAT placement,
//! and jump loops. Pure: reads the AST, returns diagnostics.

use crate::ast::*;
use crate::diag::{suggest, RawDiag};
use crate::print::hook as hook_name;
use std::collections::HashMap;
use std::net::IpAddr;

pub(crate) fn validate(r: &Ruleset) -> Vec<RawDiag> {
    let mut v = Validator { diags: Vec::new() };
    for t in &r.tables {
        v.table(t);
    }
    v.diags
}

/// Chains with at least this many rules are checked in two halves on two
/// threads ([`Validator::table`]).
const PAR_VALIDATE_MIN: usize = 8192;

struct Validator {
    diags: Vec<RawDiag>,
}

/// Name lookups for one table: chains, sets, maps.
type Lookups<'a> = (
    HashMap<&'a str, &'a Chain>,
    HashMap<&'a str, &'a Set>,
    HashMap<&'a str, &'a Map>,
);

fn ctx(t: &Table) -> Lookups<'_> {
    (
        t.chains.iter().map(|c| (c.name.as_str(), c)).collect(),
        t.sets.iter().map(|s| (s.name.as_str(), s)).collect(),
        t.maps.iter().map(|m| (m.name.as_str(), m)).collect(),
    )
}

/// True if [`Validator::scalar`] would find nothing wrong with `v` as a
/// value of type `dt` in a match (intervals allowed): the common cases,
/// checked without its bookkeeping. False means "check in full", not "invalid".
fn plainly_valid(dt: DataType, v: &Value) -> bool {
    let num_ok = |n: u64| dt.max_value().is_some_and(|max| n <= max);
    match (dt, v) {
        (DataType::Ipv4Addr, Value::Addr(IpAddr::V4(_))) => true,
        (DataType::Ipv4Addr, Value::Prefix { addr, len }) => addr.is_ipv4() && *len <= 32,
        (DataType::Ipv6Addr, Value::Addr(IpAddr::V6(_))) => true,
        (DataType::Ipv6Addr, Value::Prefix { addr, len }) => addr.is_ipv6() && *len <= 128,
        (_, Value::Num(n)) => num_ok(*n),
        (_, Value::Range(a, b)) => match (a.as_ref(), b.as_ref()) {
            (Value::Num(a), Value::Num(b)) => a <= b && num_ok(*b),
            _ => false,
        },
        _ => false,
    }
}

impl Validator {
    fn err(&mut self, span: Span, msg: impl Into<String>) {
        self.diags.push(RawDiag::new(span, msg));
    }

    /// Elements of (or for) set `s`: each fits the key type.
    fn set_elements(&mut self, s: &Set, elements: &[Elem]) {
        let interval = s.flags.contains(&SetFlag::Interval);
        for e in elements {
            self.value(
                &s.key,
                &e.key,
                e.span,
                interval,
                &format!("set '{}'", s.name),
            );
        }
    }

    /// Elements of (or for) map `m`: keys fit the key type, data the data
    /// type (verdicts name chains of the table).
    fn map_elements(&mut self, chains: &HashMap<&str, &Chain>, m: &Map, elements: &[Elem]) {
        let interval = m.flags.contains(&SetFlag::Interval);
        for e in elements {
            self.value(
                &m.key,
                &e.key,
                e.span,
                interval,
                &format!("map '{}'", m.name),
            );
            if let Some(d) = &e.data {
                self.data(chains, m.data, d, e.span);
            }
        }
    }

    fn table(&mut self, t: &Table) {
        let lookups = ctx(t);
        let (chains, _, _) = &lookups;
        for s in &t.sets {
            self.set_elements(s, &s.elements);
            if !s.flags.contains(&SetFlag::Timeout) && s.timeout_ms.is_none() {
                self.element_timeouts(&s.elements, "needs 'flags timeout' on its set");
            }
        }
        for m in &t.maps {
            self.map_elements(chains, m, &m.elements);
            self.object_names(t, m.data, &m.elements);
            self.element_timeouts(
                &m.elements,
                "is not supported in a map (a map's elements do not expire in Sluice)",
            );
        }
        for c in &t.chains {
            if let Some(b) = &c.base {
                self.base_chain(c, b);
            }
            let parallel = c.rules.len() >= PAR_VALIDATE_MIN
                && std::thread::available_parallelism().is_ok_and(|n| n.get() > 1);
            if parallel {
                // A large chain's second half is checked on another thread;
                // its diagnostics follow the first half's, as in one pass.
                let (first, second) = c.rules.split_at(c.rules.len() / 2);
                let theirs = std::thread::scope(|scope| {
                    let h = scope.spawn(|| {
                        let mut v = Validator { diags: Vec::new() };
                        v.rules(t, &lookups, c, second);
                        v.diags
                    });
                    self.rules(t, &lookups, c, first);
                    h.join().unwrap_or_else(|e| std::panic::resume_unwind(e))
                });
                self.diags.extend(theirs);
            } else {
                self.rules(t, &lookups, c, &c.rules);
            }
        }
        self.loops(t, chains);
    }

    /// An error for each element of `elems` with a `timeout` or `expires`,
    /// saying `why` it cannot have one.
    fn element_timeouts(&mut self, elems: &[Elem], why: &str) {
        for e in elems {
            if e.lifetime_ms().is_some() {
                self.err(e.span, format!("an element's timeout or expiry {why}"));
            }
        }
    }

    /// The matches and statements of `rules`, rules of chain `c`.
    fn rules(&mut self, t: &Table, (chains, sets, maps): &Lookups<'_>, c: &Chain, rules: &[Rule]) {
        // Defragmentation runs at priority -400: only chains before it see
        // fragments, which Sluice does not reassemble for them.
        let before_defrag = c.base.is_some_and(|b| b.priority < -400);
        for r in rules {
            for m in &r.matches {
                self.matches(t, sets, m);
                if before_defrag && m.left.contains(&Field::IpFragOff) {
                    self.err(
                        m.span,
                        "'ip frag-off' in a chain before defragmentation (priority below \
                         -400): Sluice shows every chain the reassembled packet",
                    );
                }
            }
            for s in &r.stmts {
                if let StmtKind::SetUpdate(u) = &s.kind {
                    self.set_update(t, sets, maps, u, s.span);
                }
                self.stmt(t, chains, maps, c, s);
            }
        }
    }

    fn base_chain(&mut self, c: &Chain, b: &BaseChain) {
        let ok = match b.chain_type {
            ChainType::Filter => true,
            // Netfilter NAT hooks: no NAT on forward.
            ChainType::Nat => b.hook != Hook::Forward,
            ChainType::Route => b.hook == Hook::Output,
        };
        if !ok {
            let ty = match b.chain_type {
                ChainType::Nat => "nat",
                ChainType::Route => "route",
                ChainType::Filter => "filter",
            };
            let valid = match b.chain_type {
                ChainType::Nat => "prerouting, input, output, postrouting",
                _ => "output",
            };
            self.diags.push(
                RawDiag::new(
                    b.span,
                    format!(
                        "chain '{}': type {ty} is not valid on hook {}",
                        c.name,
                        hook_name(b.hook)
                    ),
                )
                .help(Some(format!("{ty} chains support: {valid}"))),
            );
        }
    }

    fn family_ok(&mut self, t: &Table, f: Field, span: Span) {
        let bad = matches!(
            (t.family, f.family()),
            (Family::Ip, FieldFamily::V6) | (Family::Ip6, FieldFamily::V4)
        );
        if bad {
            self.err(
                span,
                format!(
                    "'{}' cannot match in a table of family {}",
                    f.name(),
                    t.family.name()
                ),
            );
        }
    }

    fn matches(&mut self, t: &Table, sets: &HashMap<&str, &Set>, m: &Match) {
        // Most matches: one field of the table's family and a plainly valid value.
        if let [f] = m.left.as_slice() {
            let family_ok = !matches!(
                (t.family, f.family()),
                (Family::Ip, FieldFamily::V6) | (Family::Ip6, FieldFamily::V4)
            );
            if family_ok && plainly_valid(f.datatype(), &m.right) {
                return;
            }
        }
        for f in &m.left {
            self.family_ok(t, *f, m.span);
        }
        let types = KeyTypes::of(&m.left);
        let types = types.as_slice();
        match &m.right {
            Value::SetRef(name) => match sets.get(name.as_str()) {
                Some(s) => {
                    if s.key.as_slice() != types {
                        let want: Vec<&str> = types.iter().map(|d| d.name()).collect();
                        let got: Vec<&str> = s.key.iter().map(|d| d.name()).collect();
                        self.err(
                            m.right_span,
                            format!(
                                "datatype mismatch: expression has type {}, set '{name}' has type {}",
                                want.join(" . "),
                                got.join(" . ")
                            ),
                        );
                    }
                }
                None => {
                    let help = suggest(name, sets.keys().copied());
                    self.diags.push(
                        RawDiag::new(m.right_span, format!("no such set '{name}'")).help(help),
                    );
                }
            },
            Value::Set(elems) => {
                if matches!(m.op, RelOp::Lt | RelOp::Gt | RelOp::Le | RelOp::Ge) {
                    self.err(m.span, "relational operators cannot be used with sets");
                }
                for e in elems {
                    self.value(types, &e.key, e.span, true, "anonymous set");
                }
            }
            v => {
                if !matches!(types, [dt] if plainly_valid(*dt, v)) {
                    self.value(types, v, m.right_span, true, "match");
                }
            }
        }
    }

    /// Check a value (or concatenation) against its key types.
    fn value(&mut self, types: &[DataType], v: &Value, span: Span, interval: bool, what: &str) {
        match (v, types) {
            (Value::Concat(vs), _) => {
                if vs.len() != types.len() {
                    self.err(
                        span,
                        format!(
                            "{what}: expected {} concatenated values, found {}",
                            types.len(),
                            vs.len()
                        ),
                    );
                    return;
                }
                for (x, dt) in vs.iter().zip(types) {
                    self.value(std::slice::from_ref(dt), x, span, interval, what);
                }
            }
            (_, [dt]) => self.scalar(*dt, v, span, interval, what),
            _ => self.err(
                span,
                format!("{what}: expected a concatenation of {} values", types.len()),
            ),
        }
    }

    fn scalar(&mut self, dt: DataType, v: &Value, span: Span, interval: bool, what: &str) {
        let need_interval = |s: &mut Self| {
            if !interval {
                s.diags.push(
                    RawDiag::new(
                        span,
                        format!("{what}: ranges and prefixes need an interval set"),
                    )
                    .help(Some("add 'flags interval' to the set".into())),
                );
            }
        };
        match (dt, v) {
            (DataType::Ipv4Addr | DataType::Ipv6Addr, Value::Addr(a)) => {
                self.addr(dt, a.is_ipv6(), span, what)
            }
            (DataType::Ipv4Addr | DataType::Ipv6Addr, Value::Prefix { addr, len }) => {
                self.addr(dt, addr.is_ipv6(), span, what);
                let max = if addr.is_ipv6() { 128 } else { 32 };
                if *len > max {
                    self.err(
                        span,
                        format!("prefix length /{len} is out of range (at most /{max})"),
                    );
                }
                need_interval(self);
            }
            (_, Value::Range(a, b)) => {
                self.scalar(dt, a, span, interval, what);
                self.scalar(dt, b, span, interval, what);
                let lo_gt_hi = match (a.as_ref(), b.as_ref()) {
                    (Value::Num(x), Value::Num(y)) => x > y,
                    (Value::Addr(x), Value::Addr(y)) => x > y,
                    _ => false,
                };
                if lo_gt_hi {
                    self.err(span, "range start is greater than range end");
                }
                need_interval(self);
            }
            (_, Value::Num(n)) => match dt.max_value() {
                Some(max) if *n > max => {
                    let what = if dt == DataType::InetService {
                        "port"
                    } else {
                        dt.name()
                    };
                    self.err(span, format!("{what} value {n} is out of range (0-{max})"));
                }
                Some(_) => {}
                None => self.err(
                    span,
                    format!("datatype mismatch: expected {}, found a number", dt.name()),
                ),
            },
            (DataType::Ifname | DataType::IfaceIndex, Value::Str(_)) => {}
            (DataType::Verdict, Value::Verdict(_)) => {}
            (_, other) => {
                let found = match other {
                    Value::Addr(_) | Value::Prefix { .. } => "an address",
                    Value::Str(_) => "a string",
                    Value::Verdict(_) => "a verdict",
                    Value::Set(_) | Value::SetRef(_) => "a set",
                    _ => "another type",
                };
                self.err(
                    span,
                    format!("datatype mismatch: expected {}, found {found}", dt.name()),
                );
            }
        }
    }

    fn addr(&mut self, dt: DataType, is_v6: bool, span: Span, what: &str) {
        if (dt == DataType::Ipv4Addr) == is_v6 {
            let (want, got) = if is_v6 {
                ("IPv4", "IPv6")
            } else {
                ("IPv6", "IPv4")
            };
            self.err(
                span,
                format!(
                    "{what}: {got} address where an {want} address ({}) is expected",
                    dt.name()
                ),
            );
        }
    }

    /// The data of an object map's elements name objects of the table of
    /// the map's kind.
    fn object_names(&mut self, t: &Table, data: DataType, elements: &[Elem]) {
        let Some(kind) = ObjKind::of_datatype(data) else {
            return;
        };
        for e in elements {
            match &e.data {
                Some(Value::Str(n)) => {
                    if !t.objects.iter().any(|o| o.kind() == kind && o.name == *n) {
                        let help = suggest(
                            n,
                            t.objects
                                .iter()
                                .filter(|o| o.kind() == kind)
                                .map(|o| o.name.as_str()),
                        );
                        self.diags.push(
                            RawDiag::new(
                                e.span,
                                format!(
                                    "no {} '{n}' in table {} {}",
                                    kind.name(),
                                    t.family.name(),
                                    t.name
                                ),
                            )
                            .help(help),
                        );
                    }
                }
                _ => self.err(e.span, format!("expected the name of a {}", kind.name())),
            }
        }
    }

    fn data(&mut self, chains: &HashMap<&str, &Chain>, dt: DataType, d: &Value, span: Span) {
        match d {
            Value::Verdict(v) => self.verdict_target(chains, v, span),
            // Object names: checked against the table's objects
            // (`Self::object_names`).
            Value::Str(_) if ObjKind::of_datatype(dt).is_some() => {}
            v => self.scalar(dt, v, span, false, "map data"),
        }
    }

    fn verdict_target(&mut self, chains: &HashMap<&str, &Chain>, v: &Verdict, span: Span) {
        let target = match v {
            Verdict::Jump(c) | Verdict::Goto(c) => c,
            _ => return,
        };
        match chains.get(target.as_str()) {
            None => {
                let help = suggest(target, chains.keys().copied());
                self.diags.push(
                    RawDiag::new(span, format!("unknown chain '{target}' in jump/goto")).help(help),
                );
            }
            Some(c) if c.base.is_some() => {
                self.err(span, format!("cannot jump to base chain '{target}'"));
            }
            Some(_) => {}
        }
    }

    /// `add | update | delete @set { KEY ... }`: a set (not a map) of the
    /// key's type that the packet path may change.
    fn set_update(
        &mut self,
        t: &Table,
        sets: &HashMap<&str, &Set>,
        maps: &HashMap<&str, &Map>,
        u: &SetUpdate,
        span: Span,
    ) {
        for k in &u.key {
            if let KeyPart::Field(f) = k {
                self.family_ok(t, *f, span);
            }
        }
        let Some(s) = sets.get(u.set.as_str()) else {
            if maps.contains_key(u.set.as_str()) {
                self.err(
                    span,
                    format!("'{}' is a map; '{}' works on sets", u.set, u.op.name()),
                );
            } else {
                let help = suggest(&u.set, sets.keys().copied());
                self.diags
                    .push(RawDiag::new(span, format!("no such set '{}'", u.set)).help(help));
            }
            return;
        };
        // A constant takes the set's type at its place, and must be a
        // value of it.
        let types: Vec<DataType> = u
            .key
            .iter()
            .enumerate()
            .map(|(i, k)| match k {
                KeyPart::Field(f) => f.datatype(),
                KeyPart::Const(_) => s.key.get(i).copied().unwrap_or(DataType::Verdict),
            })
            .collect();
        for (k, dt) in u.key.iter().zip(&types) {
            if let KeyPart::Const(v) = k {
                self.value(&[*dt], v, span, false, "set key");
            }
        }
        if s.key != types {
            let want: Vec<&str> = types.iter().map(|d| d.name()).collect();
            let got: Vec<&str> = s.key.iter().map(|d| d.name()).collect();
            self.err(
                span,
                format!(
                    "datatype mismatch: key has type {}, set '{}' has type {}",
                    want.join(" . "),
                    u.set,
                    got.join(" . ")
                ),
            );
        }
        if s.flags.contains(&SetFlag::Constant) {
            self.err(
                span,
                format!(
                    "set '{}' is constant; the packet path cannot change it",
                    u.set
                ),
            );
        }
        if s.flags.contains(&SetFlag::Interval) {
            self.err(
                span,
                format!(
                    "set '{}' has flags interval; the packet path adds single keys \
                     only (drop the interval flag)",
                    u.set
                ),
            );
        }
        if !s.is_dynamic() {
            self.diags.push(
                RawDiag::new(
                    span,
                    format!(
                        "set '{}' is not dynamic; the packet path changes only sets \
                         declared with 'flags dynamic' or a timeout",
                        u.set
                    ),
                )
                .help(Some(format!("add 'flags dynamic' to set '{}'", u.set))),
            );
        } else if u.timeout_ms.is_some()
            && !s.flags.contains(&SetFlag::Timeout)
            && s.timeout_ms.is_none()
        {
            self.err(
                span,
                format!(
                    "set '{}' has no timeouts; give it 'flags timeout' or a 'timeout' \
                     for element timeouts",
                    u.set
                ),
            );
        }
    }

    fn stmt(
        &mut self,
        t: &Table,
        chains: &HashMap<&str, &Chain>,
        maps: &HashMap<&str, &Map>,
        c: &Chain,
        s: &Stmt,
    ) {
        match &s.kind {
            StmtKind::Verdict(v) => self.verdict_target(chains, v, s.span),
            StmtKind::VerdictMap { key, map } => {
                for f in key {
                    self.family_ok(t, *f, s.span);
                }
                self.map_ref(chains, maps, key, map, DataType::Verdict, s.span);
            }
            StmtKind::Nat(n) => self.nat(t, chains, maps, c, n, s.span),
            StmtKind::NumgenVmap { map, .. } => {
                self.map_ref(
                    chains,
                    maps,
                    &[Field::Numgen],
                    map,
                    DataType::Verdict,
                    s.span,
                );
            }
            StmtKind::MarkMap { key, map, .. } => {
                for f in key {
                    self.family_ok(t, *f, s.span);
                }
                self.map_ref(chains, maps, key, map, DataType::Mark, s.span);
            }
            StmtKind::ObjMap { kind, key, map } => {
                for f in key {
                    self.family_ok(t, *f, s.span);
                }
                self.map_ref(chains, maps, key, map, kind.datatype(), s.span);
                if let MapRef::Anon(elems) = &**map {
                    self.object_names(t, kind.datatype(), elems);
                }
            }
            StmtKind::ObjRef { kind, name }
                if !t
                    .objects
                    .iter()
                    .any(|o| o.kind() == *kind && o.name == *name) =>
            {
                let help = suggest(
                    name,
                    t.objects
                        .iter()
                        .filter(|o| o.kind() == *kind)
                        .map(|o| o.name.as_str()),
                );
                let msg = format!(
                    "no {k} '{name}' in table {} {}; declare it with '{k} {name} {{ ... }}'",
                    t.family.name(),
                    t.name,
                    k = kind.name()
                );
                self.diags.push(RawDiag::new(s.span, msg).help(help));
            }
            StmtKind::Reject(Some(RejectWith::Icmp(_))) if t.family == Family::Ip6 => {
                self.err(
                    s.span,
                    "'reject with icmp' in an ip6 table; use icmpv6 or icmpx",
                );
            }
            StmtKind::Reject(Some(RejectWith::Icmpv6(_))) if t.family == Family::Ip => {
                self.err(
                    s.span,
                    "'reject with icmpv6' in an ip table; use icmp or icmpx",
                );
            }
            StmtKind::FlowAdd(name) if !t.flowtables.iter().any(|f| f.name == *name) => {
                let help = suggest(name, t.flowtables.iter().map(|f| f.name.as_str()));
                let msg = format!(
                    "no flowtable '{name}' in table {} {}; declare it with 'flowtable \
                     {name} {{ hook ingress priority 0; devices = {{ ... }}; }}'",
                    t.family.name(),
                    t.name
                );
                self.diags.push(RawDiag::new(s.span, msg).help(help));
            }
            StmtKind::CtTimeoutSet(name) if !t.ct_timeouts.iter().any(|c| c.name == *name) => {
                let help = suggest(name, t.ct_timeouts.iter().map(|c| c.name.as_str()));
                let msg = format!(
                    "no ct timeout '{name}' in table {} {}; declare it with 'ct timeout \
                     {name} {{ protocol udp; policy = {{ unreplied: 30, replied: 120 }} }}'",
                    t.family.name(),
                    t.name
                );
                self.diags.push(RawDiag::new(s.span, msg).help(help));
            }
            // The kernel's nft_flow_offload validation.
            StmtKind::FlowAdd(_) if c.base.is_some_and(|b| b.hook != Hook::Forward) => {
                self.err(s.span, "'flow add' is valid in forward chains only");
            }
            // The kernel's nft_notrack validation.
            StmtKind::Notrack
                if c.base
                    .is_some_and(|b| !matches!(b.hook, Hook::Prerouting | Hook::Output)) =>
            {
                self.err(
                    s.span,
                    "'notrack' is valid in prerouting and output chains only (conntrack \
                     has seen the packet everywhere else); use a prerouting chain at \
                     'priority raw'",
                );
            }
            // The kernel's nft_rt validation: a route exists only from
            // forward on.
            StmtKind::TcpMssSet(TcpMss::RtMtu)
                if c.base
                    .is_some_and(|b| matches!(b.hook, Hook::Prerouting | Hook::Input)) =>
            {
                self.err(
                    s.span,
                    "'rt mtu' needs a route: it is valid in forward, output and \
                     postrouting chains only",
                );
            }
            _ => {}
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn map_ref(
        &mut self,
        chains: &HashMap<&str, &Chain>,
        maps: &HashMap<&str, &Map>,
        key: &[Field],
        map: &MapRef,
        data: DataType,
        span: Span,
    ) {
        let types = KeyTypes::of(key);
        let types = types.as_slice();
        match map {
            MapRef::Named(n) => match maps.get(n.as_str()) {
                None => {
                    let help = suggest(n, maps.keys().copied());
                    self.diags
                        .push(RawDiag::new(span, format!("no such map '{n}'")).help(help));
                }
                Some(m) => {
                    if m.key.as_slice() != types || m.data != data {
                        self.err(
                            span,
                            format!(
                                "datatype mismatch: map '{n}' maps {} to {}",
                                keyname(&m.key),
                                m.data.name()
                            ),
                        );
                    }
                }
            },
            MapRef::Anon(elems) => {
                for e in elems {
                    self.value(types, &e.key, e.span, true, "anonymous map");
                    if let Some(d) = &e.data {
                        self.data(chains, data, d, e.span);
                    }
                }
            }
        }
    }

    fn nat(
        &mut self,
        t: &Table,
        chains: &HashMap<&str, &Chain>,
        maps: &HashMap<&str, &Map>,
        c: &Chain,
        n: &Nat,
        span: Span,
    ) {
        if let Some(b) = &c.base {
            let kind = match n.kind {
                NatKind::Snat => "snat",
                NatKind::Dnat => "dnat",
                NatKind::Masquerade => "masquerade",
                NatKind::Redirect => "redirect",
            };
            if b.chain_type != ChainType::Nat {
                self.err(span, format!("{kind} is only valid in chains of type nat"));
            } else {
                let hook_ok = match n.kind {
                    NatKind::Snat | NatKind::Masquerade => {
                        matches!(b.hook, Hook::Postrouting | Hook::Input)
                    }
                    NatKind::Dnat | NatKind::Redirect => {
                        matches!(b.hook, Hook::Prerouting | Hook::Output)
                    }
                };
                if !hook_ok {
                    let valid = match n.kind {
                        NatKind::Snat | NatKind::Masquerade => "postrouting, input",
                        _ => "prerouting, output",
                    };
                    self.diags.push(
                        RawDiag::new(
                            span,
                            format!("{kind} is not valid on hook {}", hook_name(b.hook)),
                        )
                        .help(Some(format!("{kind} works on: {valid}"))),
                    );
                }
            }
        }
        let want_v6 = match (t.family, n.family) {
            (_, Some(Family::Ip6)) | (Family::Ip6, None) => Some(true),
            (_, Some(Family::Ip)) | (Family::Ip, None) => Some(false),
            _ => None,
        };
        let check = |s: &mut Self, a: &std::net::IpAddr| {
            if let Some(v6) = want_v6 {
                if a.is_ipv6() != v6 {
                    s.err(
                        span,
                        format!(
                            "NAT address {a} does not match the {} family",
                            if v6 { "ip6" } else { "ip" }
                        ),
                    );
                }
            }
        };
        match &n.addr {
            Some(NatAddr::Single(a)) => check(self, a),
            Some(NatAddr::Range(a, b)) => {
                check(self, a);
                check(self, b);
                if a.is_ipv6() != b.is_ipv6() || a > b {
                    self.err(span, "invalid NAT address range");
                }
            }
            Some(NatAddr::Map { key, map }) => {
                let data = if want_v6 == Some(true) {
                    DataType::Ipv6Addr
                } else {
                    DataType::Ipv4Addr
                };
                self.map_ref(chains, maps, key, map, data, span);
            }
            None => {}
        }
        if let Some((lo, hi)) = n.ports {
            if lo > hi {
                self.err(span, "invalid NAT port range");
            }
        }
    }

    /// Report chains that jump to themselves, directly or transitively.
    fn loops(&mut self, t: &Table, chains: &HashMap<&str, &Chain>) {
        let mut edges: HashMap<&str, Vec<(&str, Span)>> = HashMap::new();
        for c in &t.chains {
            let e = edges.entry(c.name.as_str()).or_default();
            for r in &c.rules {
                for s in &r.stmts {
                    let mut add = |v: &Verdict, sp: Span| {
                        if let Verdict::Jump(x) | Verdict::Goto(x) = v {
                            if let Some((k, _)) = chains.get_key_value(x.as_str()) {
                                e.push((*k, sp));
                            }
                        }
                    };
                    match &s.kind {
                        StmtKind::Verdict(v) => add(v, s.span),
                        StmtKind::VerdictMap { map, .. } | StmtKind::NumgenVmap { map, .. } => {
                            match &**map {
                                MapRef::Anon(elems) => {
                                    for el in elems {
                                        if let Some(Value::Verdict(v)) = &el.data {
                                            add(v, s.span);
                                        }
                                    }
                                }
                                MapRef::Named(m) => {
                                    if let Some(m) = t.maps.iter().find(|x| &x.name == m) {
                                        for el in &m.elements {
                                            if let Some(Value::Verdict(v)) = &el.data {
                                                add(v, s.span);
                                            }
                                        }
                                    }
                                }
                            }
                        }
                        _ => {}
                    }
                }
            }
        }
        // Iterative DFS with colours; report each back edge once.
        let mut colour: HashMap<&str, u8> = HashMap::new();
        for c in &t.chains {
            let start = c.name.as_str();
            if colour.get(start).copied().unwrap_or(0) != 0 {
                continue;
            }
            let mut stack: Vec<(&str, usize)> = vec![(start, 0)];
            colour.insert(start, 1);
            while let Some((node, idx)) = stack.pop() {
                let out = edges.get(node).map(Vec::as_slice).unwrap_or(&[]);
                match out.get(idx) {
                    None => {
                        colour.insert(node, 2);
                    }
                    Some(&(next, sp)) => {
                        stack.push((node, idx + 1));
                        match colour.get(next).copied().unwrap_or(0) {
                            0 => {
                                colour.insert(next, 1);
                                stack.push((next, 0));
                            }
                            1 => {
                                let mut path: Vec<&str> = stack.iter().map(|(n, _)| *n).collect();
                                if let Some(p) = path.iter().position(|n| *n == next) {
                                    path.drain(..p);
                                }
                                path.push(next);
                                self.err(sp, format!("jump loop: {}", path.join(" -> ")));
                            }
                            _ => {}
                        }
                    }
                }
            }
        }
    }
}

fn keyname(k: &[DataType]) -> String {
    k.iter().map(|d| d.name()).collect::<Vec<_>>().join(" . ")
}

/// Validates a control command in the context of the running rule set: the
/// same checks [`validate`] makes on a rule or element in a file (jump
/// loops excepted: the policy checks them when it applies the command).
pub(crate) fn validate_command(r: &Ruleset, cmd: &crate::command::Command) -> Vec<RawDiag> {
    use crate::command::Command;
    let mut v = Validator { diags: Vec::new() };
    let (family, table) = match cmd {
        Command::AddRule { family, table, .. }
        | Command::DeleteRule { family, table, .. }
        | Command::AddElements { family, table, .. }
        | Command::DeleteElements { family, table, .. }
        | Command::FlushSet { family, table, .. }
        | Command::AddObject { family, table, .. }
        | Command::DeleteObject { family, table, .. } => (*family, table),
    };
    let Some(t) = r
        .tables
        .iter()
        .find(|t| t.family == family && t.name == *table)
    else {
        // The parser resolved the table against the same rule set.
        return v.diags;
    };
    let (chains, sets, maps) = ctx(t);
    match cmd {
        Command::AddRule { chain, rule, .. } => {
            if let Some(c) = chains.get(chain.as_str()) {
                for m in &rule.matches {
                    v.matches(t, &sets, m);
                }
                for s in &rule.stmts {
                    v.stmt(t, &chains, &maps, c, s);
                }
            }
        }
        Command::DeleteRule { .. }
        | Command::FlushSet { .. }
        | Command::AddObject { .. }
        | Command::DeleteObject { .. } => {}
        Command::AddElements { set, elements, .. }
        | Command::DeleteElements { set, elements, .. } => {
            if let Some(s) = sets.get(set.as_str()) {
                v.set_elements(s, elements);
            } else if let Some(m) = maps.get(set.as_str()) {
                v.map_elements(&chains, m, elements);
                v.object_names(t, m.data, elements);
            }
        }
    }
    v.diags
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A chain checked in two halves reports every error, in order, as
    /// one pass does.
    #[test]
    fn a_large_chain_checked_in_halves_reports_in_order() {
        let n = PAR_VALIDATE_MIN + 100;
        let bad = [3, n / 2 - 1, n / 2, n - 1];
        let mut text = String::from("table ip t { chain c {\n");
        for i in 0..n {
            if bad.contains(&i) {
                text.push_str(&format!(" tcp dport {} accept\n", 70000 + i));
            } else {
                text.push_str(&format!(" tcp dport {} accept\n", i % 60000));
            }
        }
        text.push_str("} }\n");
        let Err(d) = crate::parse_nft_str("t.nft", &text) else {
            panic!("parsed");
        };
        let lines: Vec<u32> = d.items.iter().map(|i| i.line).collect();
        let want: Vec<u32> = bad.iter().map(|i| *i as u32 + 2).collect();
        assert_eq!(lines, want);
    }

    #[test]
    fn plainly_valid_values_pass_the_full_check() {
        let v4 = IpAddr::from([10, 0, 0, 0]);
        let v6 = IpAddr::from([0xfe80, 0, 0, 0, 0, 0, 0, 1]);
        let range = |a: u64, b: u64| Value::Range(Box::new(Value::Num(a)), Box::new(Value::Num(b)));
        let values = [
            Value::Addr(v4),
            Value::Addr(v6),
            Value::Prefix { addr: v4, len: 8 },
            Value::Prefix { addr: v4, len: 32 },
            Value::Prefix { addr: v4, len: 33 },
            Value::Prefix { addr: v6, len: 64 },
            Value::Prefix { addr: v6, len: 129 },
            Value::Num(0),
            Value::Num(255),
            Value::Num(256),
            Value::Num(65_535),
            Value::Num(65_536),
            Value::Num(u64::from(u32::MAX) + 1),
            range(1, 2),
            range(2, 1),
            range(1, 65_536),
            Value::Range(Box::new(Value::Addr(v4)), Box::new(Value::Addr(v4))),
            Value::Str("eth0".into()),
        ];
        let mut valid = 0;
        for dt in DataType::ALL {
            for v in &values {
                if plainly_valid(dt, v) {
                    valid += 1;
                    let mut val = Validator { diags: Vec::new() };
                    val.scalar(dt, v, Span::default(), true, "match");
                    assert!(val.diags.is_empty(), "{dt:?} {v:?}: {:?}", val.diags);
                }
            }
        }
        assert!(valid > 20, "{valid}");
    }
}
