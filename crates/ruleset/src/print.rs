//! Canonical printer: `Ruleset -> String` in nft syntax, in the layout of
//! `nft list ruleset` (tabs, sets and maps before chains, one rule per line).
//!
//! Invariant: for any ruleset `r` produced by a parser, printing `r`, parsing
//! the text, and printing again yields the same text (fixed point).

use crate::ast::*;
use crate::symbols;
use std::fmt::Write;

/// Print a whole ruleset.
pub fn print_ruleset(r: &Ruleset) -> String {
    let mut out = String::new();
    for (i, t) in r.tables.iter().enumerate() {
        if i > 0 {
            out.push('\n');
        }
        print_table(&mut out, t);
    }
    out
}

fn print_table(out: &mut String, t: &Table) {
    let _ = writeln!(out, "table {} {} {{", t.family.name(), name(&t.name));
    let mut first = true;
    let mut sep = |out: &mut String| {
        if !first {
            out.push('\n');
        }
        first = false;
    };
    for o in &t.objects {
        sep(out);
        let _ = writeln!(out, "\t{} {} {{", o.kind().name(), name(&o.name));
        if let Some(cm) = &o.comment {
            let _ = writeln!(out, "\t\tcomment {}", quote(cm));
        }
        match &o.state {
            ObjState::Counter { packets, bytes } => {
                let _ = writeln!(out, "\t\tpackets {packets} bytes {bytes}");
            }
            ObjState::Quota(q) => {
                let q = stmt(&StmtKind::Quota(*q));
                let _ = writeln!(out, "\t\t{}", q.strip_prefix("quota ").unwrap_or(&q));
            }
            ObjState::Limit(l) => {
                let l = stmt(&StmtKind::Limit(*l));
                let _ = writeln!(out, "\t\t{}", l.strip_prefix("limit ").unwrap_or(&l));
            }
        }
        out.push_str("\t}\n");
    }
    for s in &t.sets {
        sep(out);
        let _ = writeln!(out, "\tset {} {{", name(&s.name));
        print_key(out, &s.key, s.key_typeof.as_deref(), None);
        if let Some(t) = s.timeout_ms {
            let _ = writeln!(out, "\t\ttimeout {}", crate::ast::format_duration(t));
        }
        if let Some(n) = s.size {
            let _ = writeln!(out, "\t\tsize {n}");
        }
        print_set_tail(
            out,
            &s.flags,
            s.comment.as_deref(),
            &s.elements,
            &s.key,
            None,
        );
        out.push_str("\t}\n");
    }
    for m in &t.maps {
        sep(out);
        let _ = writeln!(out, "\tmap {} {{", name(&m.name));
        // nft takes `typeof` with object data (`: counter`) nowhere: such
        // maps print with their key's types.
        let typeof_key = match m.data {
            DataType::CounterObj | DataType::QuotaObj | DataType::LimitObj => None,
            _ => m.key_typeof.as_deref(),
        };
        print_key(out, &m.key, typeof_key, Some(m.data));
        print_set_tail(
            out,
            &m.flags,
            m.comment.as_deref(),
            &m.elements,
            &m.key,
            Some(m.data),
        );
        out.push_str("\t}\n");
    }
    for f in &t.flowtables {
        sep(out);
        let _ = writeln!(out, "\tflowtable {} {{", name(&f.name));
        // (The ingress hook knows one priority name, `filter`.)
        let prio = match f.priority {
            0 => "filter".to_string(),
            p => p.to_string(),
        };
        let _ = writeln!(out, "\t\thook ingress priority {prio}");
        if !f.devices.is_empty() {
            let devs: Vec<String> = f.devices.iter().map(|d| name(d)).collect();
            let _ = writeln!(out, "\t\tdevices = {{ {} }}", devs.join(", "));
        }
        if f.offload {
            out.push_str("\t\tflags offload\n");
        }
        if f.counter {
            out.push_str("\t\tcounter\n");
        }
        out.push_str("\t}\n");
    }
    for ct in &t.ct_timeouts {
        sep(out);
        let _ = writeln!(out, "\tct timeout {} {{", name(&ct.name));
        let proto = if ct.protocol == 6 { "tcp" } else { "udp" };
        let _ = writeln!(out, "\t\tprotocol {proto}");
        if let Some(f) = ct.l3proto {
            let _ = writeln!(out, "\t\tl3proto {}", f.name());
        }
        let vals: Vec<String> = ct
            .policy
            .iter()
            .map(|(st, v)| format!("{} : {v}", st.name()))
            .collect();
        let _ = writeln!(out, "\t\tpolicy = {{ {} }}", vals.join(", "));
        out.push_str("\t}\n");
    }
    for c in &t.chains {
        sep(out);
        let _ = writeln!(out, "\tchain {} {{", name(&c.name));
        if let Some(b) = &c.base {
            let _ = writeln!(
                out,
                "\t\ttype {} hook {} priority {}; policy {};",
                chain_type(b.chain_type),
                hook(b.hook),
                priority(b.priority, b.hook),
                match b.policy {
                    Policy::Accept => "accept",
                    Policy::Drop => "drop",
                }
            );
        }
        if let Some(cm) = &c.comment {
            let _ = writeln!(out, "\t\tcomment {}", quote(cm));
        }
        for r in &c.rules {
            let _ = writeln!(out, "\t\t{}", rule_to_string(r));
        }
        out.push_str("\t}\n");
    }
    out.push_str("}\n");
}

fn print_key(
    out: &mut String,
    key: &[DataType],
    typeof_: Option<&[Field]>,
    data: Option<DataType>,
) {
    let k = match typeof_ {
        Some(f) => format!("typeof {}", fields(f)),
        None => format!(
            "type {}",
            key.iter().map(|d| d.name()).collect::<Vec<_>>().join(" . ")
        ),
    };
    match data {
        Some(d) => {
            let _ = writeln!(out, "\t\t{k} : {}", d.name());
        }
        None => {
            let _ = writeln!(out, "\t\t{k}");
        }
    }
}

fn print_set_tail(
    out: &mut String,
    flags: &[SetFlag],
    comment: Option<&str>,
    elems: &[Elem],
    key: &[DataType],
    data: Option<DataType>,
) {
    if !flags.is_empty() {
        let f: Vec<&str> = flags
            .iter()
            .map(|f| match f {
                SetFlag::Constant => "constant",
                SetFlag::Interval => "interval",
                SetFlag::Timeout => "timeout",
                SetFlag::Dynamic => "dynamic",
            })
            .collect();
        let _ = writeln!(out, "\t\tflags {}", f.join(","));
    }
    if let Some(c) = comment {
        let _ = writeln!(out, "\t\tcomment {}", quote(c));
    }
    if !elems.is_empty() {
        let items: Vec<String> = elems.iter().map(|e| elem(e, key, data)).collect();
        let one_line = format!("\t\telements = {{ {} }}", items.join(", "));
        if one_line.len() <= 100 {
            let _ = writeln!(out, "{one_line}");
        } else {
            let _ = writeln!(
                out,
                "\t\telements = {{ {},",
                items.first().map(String::as_str).unwrap_or("")
            );
            let rest = items.get(1..).unwrap_or(&[]);
            for (i, it) in rest.iter().enumerate() {
                let end = if i + 1 == rest.len() { " }" } else { "," };
                let _ = writeln!(out, "\t\t\t     {it}{end}");
            }
        }
    }
}

fn elem(e: &Elem, key: &[DataType], data: Option<DataType>) -> String {
    let mut k = value(&e.key, key);
    if let Some(o) = &e.opts {
        if let Some(t) = o.timeout_ms {
            let _ = write!(k, " timeout {}", crate::ast::format_duration(t));
        }
        if let Some(t) = o.expires_ms {
            let _ = write!(k, " expires {}", crate::ast::format_duration(t));
        }
        if let Some(c) = &o.comment {
            let _ = write!(k, " comment {}", quote(c));
        }
    }
    match (&e.data, data) {
        (Some(d), Some(dt)) => format!("{k} : {}", value(d, &[dt])),
        _ => k,
    }
}

fn chain_type(t: ChainType) -> &'static str {
    match t {
        ChainType::Filter => "filter",
        ChainType::Nat => "nat",
        ChainType::Route => "route",
    }
}

pub(crate) fn hook(h: Hook) -> &'static str {
    match h {
        Hook::Prerouting => "prerouting",
        Hook::Input => "input",
        Hook::Forward => "forward",
        Hook::Output => "output",
        Hook::Postrouting => "postrouting",
    }
}

/// Standard priority names (nft: dstnat only on prerouting, srcnat only on postrouting).
fn priority(p: i32, h: Hook) -> String {
    match (p, h) {
        (-300, _) => "raw".into(),
        (-150, _) => "mangle".into(),
        (-100, Hook::Prerouting) => "dstnat".into(),
        (0, _) => "filter".into(),
        (50, _) => "security".into(),
        (100, Hook::Postrouting) => "srcnat".into(),
        (n, _) => n.to_string(),
    }
}

/// Bare identifier if it lexes as one word, else quoted.
fn name(n: &str) -> String {
    let plain = n
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && n.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
    if plain {
        n.to_string()
    } else {
        quote(n)
    }
}

fn quote(s: &str) -> String {
    format!("\"{}\"", s.replace('"', "\\\""))
}

fn fields(f: &[Field]) -> String {
    f.iter().map(|f| f.name()).collect::<Vec<_>>().join(" . ")
}

/// Print one rule (matches, statements, comment) on one line.
pub fn rule_to_string(r: &Rule) -> String {
    let mut parts: Vec<String> = r.matches.iter().map(match_to_string).collect();
    parts.extend(r.stmts.iter().map(|s| stmt(&s.kind)));
    if let Some(c) = &r.comment {
        parts.push(format!("comment {}", quote(c)));
    }
    parts.join(" ")
}

fn match_to_string(m: &Match) -> String {
    let types: Vec<DataType> = m.left.iter().map(|f| f.datatype()).collect();
    let left = fields(&m.left);
    let right = value(&m.right, &types);
    let single = types.first().copied().filter(|_| types.len() == 1);
    match (m.mask, single) {
        (Some(mask), Some(dt)) if dt.is_bitmask() && matches!(m.op, RelOp::Eq) => {
            format!("{left} {right} / {}", num(mask, dt))
        }
        (Some(mask), Some(dt)) => {
            let ms = if dt.is_bitmask() && mask.count_ones() > 1 {
                let names: Vec<String> = (0..64)
                    .filter(|b| mask & (1u64 << b) != 0)
                    .map(|b| num(1u64 << b, dt))
                    .collect();
                format!("({})", names.join(" | "))
            } else if m.left.as_slice() == [Field::IpFragOff] {
                // nft lists the flags and offset word in hex.
                format!("0x{mask:x}")
            } else {
                num(mask, dt)
            };
            let op = if m.op == RelOp::Implicit {
                "=="
            } else {
                m.op.symbol()
            };
            format!("{left} & {ms} {op} {right}")
        }
        _ if m.op == RelOp::Implicit => format!("{left} {right}"),
        _ => format!("{left} {} {right}", m.op.symbol()),
    }
}

fn num(n: u64, dt: DataType) -> String {
    match dt {
        DataType::Mark => format!("0x{n:08x}"),
        DataType::Time | DataType::Hour | DataType::Day => plain_num(n, dt),
        DataType::EtherAddr => symbols::format_mac(n),
        d if d.is_bitmask() => {
            let tab = symbols::table(d);
            let mut rest = n;
            let mut names = Vec::new();
            for (nm, bit) in tab {
                if rest & bit != 0 {
                    names.push(*nm);
                    rest &= !bit;
                }
            }
            if n == 0 || rest != 0 {
                format!("0x{n:x}")
            } else {
                names.join(",")
            }
        }
        d => symbols::name_of(d, n)
            .map(str::to_string)
            .unwrap_or_else(|| n.to_string()),
    }
}

/// Numeric form only (for range bounds, where names could contain '-').
fn plain_num(n: u64, dt: DataType) -> String {
    match dt {
        DataType::Mark => format!("0x{n:08x}"),
        DataType::EtherAddr => symbols::format_mac(n),
        d if d.is_bitmask() => format!("0x{n:x}"),
        DataType::Time => quote(&crate::timefmt::format_date_time(n / 1_000_000_000)),
        DataType::Hour => quote(&crate::timefmt::format_hour(n)),
        DataType::Day => match crate::timefmt::DAYS.get(n as usize) {
            Some(d) => quote(d),
            None => n.to_string(),
        },
        _ => n.to_string(),
    }
}

fn value(v: &Value, types: &[DataType]) -> String {
    let dt = types.first().copied().unwrap_or(DataType::Integer8);
    match v {
        Value::Num(n) => num(*n, dt),
        Value::Addr(a) => a.to_string(),
        Value::Prefix { addr, len } => format!("{addr}/{len}"),
        Value::Str(s) => quote(s),
        Value::Range(a, b) => {
            let f = |x: &Value| match x {
                Value::Num(n) => plain_num(*n, dt),
                other => value(other, &[dt]),
            };
            format!("{}-{}", f(a), f(b))
        }
        Value::Concat(vs) => vs
            .iter()
            .enumerate()
            .map(|(i, x)| value(x, &[types.get(i).copied().unwrap_or(dt)]))
            .collect::<Vec<_>>()
            .join(" . "),
        Value::Set(elems) => {
            let items: Vec<String> = elems.iter().map(|e| elem(e, types, None)).collect();
            format!("{{ {} }}", items.join(", "))
        }
        Value::SetRef(s) => format!("@{}", name(s)),
        Value::Verdict(v) => verdict(v),
    }
}

/// `(mark & and) ^ xor` in nft's listing form.
fn mark_mod(m: &str, and: u32, xor: u32) -> String {
    if xor == 0 {
        format!("{m} set {m} & 0x{and:08x}")
    } else if and == u32::MAX {
        format!("{m} set {m} ^ 0x{xor:08x}")
    } else if and & xor == 0 && and | xor == u32::MAX {
        format!("{m} set {m} | 0x{xor:08x}")
    } else if and & xor == 0 {
        format!("{m} set {m} & 0x{:08x} | 0x{xor:08x}", and | xor)
    } else {
        format!("{m} set {m} & 0x{and:08x} ^ 0x{xor:08x}")
    }
}

fn verdict(v: &Verdict) -> String {
    match v {
        Verdict::Accept => "accept".into(),
        Verdict::Drop => "drop".into(),
        Verdict::Return => "return".into(),
        Verdict::Continue => "continue".into(),
        Verdict::Jump(c) => format!("jump {}", name(c)),
        Verdict::Goto(c) => format!("goto {}", name(c)),
    }
}

fn map_ref(m: &MapRef, key: &[Field], data: DataType) -> String {
    match m {
        MapRef::Named(n) => format!("@{}", name(n)),
        MapRef::Anon(elems) => {
            let types: Vec<DataType> = key.iter().map(|f| f.datatype()).collect();
            let items: Vec<String> = elems.iter().map(|e| elem(e, &types, Some(data))).collect();
            format!("{{ {} }}", items.join(", "))
        }
    }
}

fn stmt(s: &StmtKind) -> String {
    match s {
        StmtKind::Counter { packets, bytes } => {
            let mut s = String::from("counter");
            if let Some(p) = packets {
                let _ = write!(s, " packets {p}");
            }
            if let Some(b) = bytes {
                let _ = write!(s, " bytes {b}");
            }
            s
        }
        StmtKind::Verdict(v) => verdict(v),
        StmtKind::Reject(None) => "reject".into(),
        StmtKind::Reject(Some(w)) => match w {
            RejectWith::TcpReset => "reject with tcp reset".into(),
            RejectWith::Icmp(c) => format!("reject with icmp {}", code(symbols::ICMP_REJECT, *c)),
            RejectWith::Icmpv6(c) => {
                format!("reject with icmpv6 {}", code(symbols::ICMPV6_REJECT, *c))
            }
            RejectWith::Icmpx(c) => {
                format!("reject with icmpx {}", code(symbols::ICMPX_REJECT, *c))
            }
        },
        StmtKind::Log(l) => {
            let mut s = String::from("log");
            if let Some(p) = &l.prefix {
                let _ = write!(s, " prefix {}", quote(p));
            }
            if let Some(lv) = l.level {
                let _ = write!(s, " level {}", lv.name());
            }
            if let Some(g) = l.group {
                let _ = write!(s, " group {g}");
            }
            use crate::ast::log_flags as f;
            if l.flags == f::ALL {
                s.push_str(" flags all");
            } else {
                let tcp: Vec<&str> = [(f::TCP_SEQ, "sequence"), (f::TCP_OPT, "options")]
                    .iter()
                    .filter(|(b, _)| l.flags & b != 0)
                    .map(|(_, n)| *n)
                    .collect();
                if !tcp.is_empty() {
                    let _ = write!(s, " flags tcp {}", tcp.join(","));
                }
                for (b, n) in [
                    (f::IP_OPT, "ip options"),
                    (f::UID, "skuid"),
                    (f::MAC, "ether"),
                ] {
                    if l.flags & b != 0 {
                        let _ = write!(s, " flags {n}");
                    }
                }
            }
            s
        }
        StmtKind::Quota(q) => {
            let mut s = String::from("quota ");
            if q.over {
                s.push_str("over ");
            }
            let _ = write!(s, "{} {}", q.amount, q.unit.name());
            if let Some((n, u)) = q.used {
                let _ = write!(s, " used {n} {}", u.name());
            }
            s
        }
        StmtKind::CtCount(c) => ct_count(c),
        StmtKind::ObjRef { kind, name } => format!("{} name {}", kind.name(), quote(name)),
        StmtKind::Numgen(n) => {
            // The comparison as a match prints `numgen OP VALUE`.
            let cmp = match_to_string(&n.m);
            let cmp = cmp.strip_prefix("numgen").unwrap_or(&cmp);
            let offset = if n.offset == 0 {
                String::new()
            } else {
                format!(" offset {}", n.offset)
            };
            let kind = if n.random { "random" } else { "inc" };
            format!("numgen {kind} mod {}{offset}{cmp}", n.modulus)
        }
        StmtKind::SetUpdate(u) => {
            let key: Vec<String> = u
                .key
                .iter()
                .map(|k| match k {
                    KeyPart::Field(f) => fields(std::slice::from_ref(f)),
                    KeyPart::Const(v) => value(v, &[DataType::Integer8]),
                })
                .collect();
            let mut s = format!("{} @{} {{ {}", u.op.name(), name(&u.set), key.join(" . "));
            if let Some(t) = u.timeout_ms {
                let _ = write!(s, " timeout {}", crate::ast::format_duration(t));
            }
            if let Some(l) = &u.limit {
                let _ = write!(s, " {}", stmt(&StmtKind::Limit(*l)));
            }
            if let Some(q) = &u.quota {
                let _ = write!(s, " {}", stmt(&StmtKind::Quota(*q)));
            }
            if u.counter {
                s.push_str(" counter");
            }
            if let Some(c) = &u.ct_count {
                let _ = write!(s, " {}", ct_count(c));
            }
            s.push_str(" }");
            s
        }
        StmtKind::Limit(l) => {
            let mut s = String::from("limit rate ");
            if l.over {
                s.push_str("over ");
            }
            match l.unit {
                Some(u) => {
                    let _ = write!(s, "{} {}/{}", l.rate, u.name(), l.per.name());
                }
                None => {
                    let _ = write!(s, "{}/{}", l.rate, l.per.name());
                }
            }
            if let Some(b) = l.burst {
                let _ = write!(
                    s,
                    " burst {b} {}",
                    l.burst_unit.map_or("packets", |u| u.name())
                );
            }
            s
        }
        StmtKind::MetaMarkSet(m) => format!("meta mark set 0x{m:08x}"),
        StmtKind::MetaMarkMod { and, xor } => mark_mod("meta mark", *and, *xor),
        StmtKind::CtMarkMod { and, xor } => mark_mod("ct mark", *and, *xor),
        StmtKind::CtMarkSet(m) => format!("ct mark set 0x{m:08x}"),
        StmtKind::MetaMarkFromCt => "meta mark set ct mark".to_string(),
        StmtKind::Notrack => "notrack".to_string(),
        StmtKind::FlowAdd(ft) => format!("flow add @{}", name(ft)),
        StmtKind::CtTimeoutSet(n) => format!("ct timeout set {}", quote(n)),
        StmtKind::NftraceSet(on) => format!("meta nftrace set {on}"),
        StmtKind::CtMarkFromMeta => "ct mark set meta mark".to_string(),
        StmtKind::TcpMssSet(TcpMss::RtMtu) => "tcp option maxseg size set rt mtu".to_string(),
        StmtKind::TcpMssSet(TcpMss::Value(v)) => format!("tcp option maxseg size set {v}"),
        StmtKind::Nat(n) => nat(n),
        StmtKind::VerdictMap { key, map } => {
            format!(
                "{} vmap {}",
                fields(key),
                map_ref(map, key, DataType::Verdict)
            )
        }
        StmtKind::NumgenVmap {
            random,
            modulus,
            offset,
            map,
        } => {
            let offset = if *offset == 0 {
                String::new()
            } else {
                format!(" offset {offset}")
            };
            format!(
                "numgen {} mod {modulus}{offset} vmap {}",
                if *random { "random" } else { "inc" },
                map_ref(map, &[Field::Numgen], DataType::Verdict)
            )
        }
        StmtKind::MarkMap { ct, key, map } => format!(
            "{} set {} map {}",
            if *ct { "ct mark" } else { "meta mark" },
            fields(key),
            map_ref(map, key, DataType::Mark)
        ),
        StmtKind::ObjMap { kind, key, map } => format!(
            "{} name {} map {}",
            kind.name(),
            fields(key),
            map_ref(map, key, kind.datatype())
        ),
    }
}

fn code(tab: &[(&'static str, u64)], c: u8) -> String {
    symbols::code_name(tab, c)
        .map(str::to_string)
        .unwrap_or_else(|| c.to_string())
}

fn nat(n: &Nat) -> String {
    let mut s = String::from(match n.kind {
        NatKind::Snat => "snat",
        NatKind::Dnat => "dnat",
        NatKind::Masquerade => "masquerade",
        NatKind::Redirect => "redirect",
    });
    if let Some(f) = n.family {
        let _ = write!(s, " {}", f.name());
    }
    let ports = n.ports.map(|(a, b)| {
        if a == b {
            a.to_string()
        } else {
            format!("{a}-{b}")
        }
    });
    match (&n.addr, &ports) {
        (Some(NatAddr::Map { key, map }), _) => {
            let data = if n.family == Some(Family::Ip6) {
                DataType::Ipv6Addr
            } else {
                DataType::Ipv4Addr
            };
            let _ = write!(s, " to {} map {}", fields(key), map_ref(map, key, data));
        }
        (Some(a), p) => {
            let (text, v6) = match a {
                NatAddr::Single(x) => (x.to_string(), x.is_ipv6()),
                NatAddr::Range(x, y) => (format!("{x}-{y}"), x.is_ipv6()),
                NatAddr::Map { .. } => (String::new(), false),
            };
            match p {
                Some(p) if v6 => {
                    let _ = write!(s, " to [{text}]:{p}");
                }
                Some(p) => {
                    let _ = write!(s, " to {text}:{p}");
                }
                None => {
                    let _ = write!(s, " to {text}");
                }
            }
        }
        (None, Some(p)) => {
            let _ = write!(s, " to :{p}");
        }
        (None, None) => {}
    }
    if !n.flags.is_empty() {
        let f: Vec<&str> = n
            .flags
            .iter()
            .map(|f| match f {
                NatFlag::Random => "random",
                NatFlag::FullyRandom => "fully-random",
                NatFlag::Persistent => "persistent",
            })
            .collect();
        let _ = write!(s, " {}", f.join(","));
    }
    s
}

/// `ct count [over] N`.
fn ct_count(c: &crate::ast::CtCount) -> String {
    if c.over {
        format!("ct count over {}", c.count)
    } else {
        format!("ct count {}", c.count)
    }
}
