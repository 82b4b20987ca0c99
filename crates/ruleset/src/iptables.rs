//! iptables-restore front end (with ipset save files), lowered into the nft AST.
//!
//! Tables become `ip filter` / `ip nat` / `ip mangle` / `ip raw`; built-in
//! chains become base chains with iptables' hooks and priorities (filter 0,
//! nat PREROUTING/OUTPUT dstnat -100, nat POSTROUTING/INPUT srcnat 100,
//! mangle -150, raw -300). ipsets referenced by `-m set` become named sets in
//! the table that uses them.

use crate::ast::*;
use crate::diag::{suggest, RawDiag};
use crate::nft::{parse_addr_value, parse_nat_target};
use crate::symbols::{self, parse_num};
use std::net::{IpAddr, Ipv4Addr};

const FILE_MAIN: u32 = 0;
const FILE_SETS: u32 = 1;

/// A shell-like word with its 1-based column and length.
#[derive(Debug, Clone)]
struct Word {
    text: String,
    col: u32,
    len: u32,
}

fn tokenize(line: &str) -> Result<Vec<Word>, u32> {
    let chars: Vec<char> = line.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars.get(i).copied().unwrap_or(' ');
        if c.is_whitespace() {
            i += 1;
            continue;
        }
        let start = i;
        let mut text = String::new();
        while let Some(&c) = chars.get(i) {
            if c.is_whitespace() {
                break;
            }
            if c == '"' || c == '\'' {
                let q = c;
                i += 1;
                loop {
                    match chars.get(i) {
                        None => return Err(start as u32 + 1),
                        Some(&d) if d == q => break,
                        Some('\\') if q == '"' && chars.get(i + 1).is_some() => {
                            text.push(chars.get(i + 1).copied().unwrap_or('\\'));
                            i += 2;
                        }
                        Some(&d) => {
                            text.push(d);
                            i += 1;
                        }
                    }
                }
                i += 1;
                continue;
            }
            text.push(c);
            i += 1;
        }
        out.push(Word {
            text,
            col: start as u32 + 1,
            len: (i - start) as u32,
        });
    }
    Ok(out)
}

/// One ipset from an `ipset save` file.
struct IpSet {
    name: String,
    dims: Vec<Dim>,
    v6: bool,
    elems: Vec<Elem>,
}

#[derive(Clone, Copy, PartialEq)]
enum Dim {
    Ip,
    Net,
    Port,
    Mark,
    Iface,
}

fn parse_ipsets(text: &str, diags: &mut Vec<RawDiag>) -> Vec<IpSet> {
    let mut sets: Vec<IpSet> = Vec::new();
    for (ln, line) in text.lines().enumerate() {
        let span = |col: u32, len: u32| Span {
            file: FILE_SETS,
            line: ln as u32 + 1,
            col,
            len,
        };
        let words = match tokenize(line) {
            Ok(w) => w,
            Err(c) => {
                diags.push(RawDiag::new(span(c, 1), "unterminated quote"));
                continue;
            }
        };
        let Some(cmd) = words.first() else { continue };
        if cmd.text.starts_with('#') {
            continue;
        }
        let name = words.get(1);
        match (cmd.text.as_str(), name) {
            ("create" | "-N" | "-exist", Some(name)) => {
                let Some(ty) = words.get(2) else {
                    diags.push(RawDiag::new(span(name.col, name.len), "missing set type"));
                    continue;
                };
                let parts = ty.text.split_once(':').map(|(_, d)| d).unwrap_or("");
                let dims: Option<Vec<Dim>> = parts
                    .split(',')
                    .map(|d| match d {
                        "ip" => Some(Dim::Ip),
                        "net" => Some(Dim::Net),
                        "port" => Some(Dim::Port),
                        "mark" => Some(Dim::Mark),
                        "iface" => Some(Dim::Iface),
                        _ => None,
                    })
                    .collect();
                let method_ok = ty.text.starts_with("hash:") || ty.text.starts_with("bitmap:");
                let Some(dims) = dims.filter(|_| method_ok) else {
                    diags.push(RawDiag::new(
                        span(ty.col, ty.len),
                        format!(
                            "unsupported ipset type '{}' (hash:ip, hash:net, hash:ip,port, ...)",
                            ty.text
                        ),
                    ));
                    continue;
                };
                let v6 = words
                    .windows(2)
                    .any(|w| matches!(w, [a, b] if a.text == "family" && b.text == "inet6"));
                if sets.iter().any(|s| s.name == name.text) {
                    diags.push(RawDiag::new(
                        span(name.col, name.len),
                        format!("duplicate ipset '{}'", name.text),
                    ));
                    continue;
                }
                sets.push(IpSet {
                    name: name.text.clone(),
                    dims,
                    v6,
                    elems: Vec::new(),
                });
            }
            ("add" | "-A", Some(name)) => {
                let Some(set) = sets.iter_mut().find(|s| s.name == name.text) else {
                    diags.push(RawDiag::new(
                        span(name.col, name.len),
                        format!("add to unknown ipset '{}'", name.text),
                    ));
                    continue;
                };
                let Some(e) = words.get(2) else {
                    diags.push(RawDiag::new(span(name.col, name.len), "missing element"));
                    continue;
                };
                let esp = span(e.col, e.len);
                match ipset_elem(&set.dims, &e.text) {
                    Some(key) => set.elems.push(Elem {
                        key,
                        data: None,
                        span: esp,
                        opts: None,
                    }),
                    None => diags.push(RawDiag::new(
                        esp,
                        format!("invalid element '{}' for ipset '{}'", e.text, set.name),
                    )),
                }
            }
            ("flush" | "destroy" | "-F" | "-X", _) => {}
            _ => {
                let help = suggest(&cmd.text, ["create", "add", "flush", "destroy"]);
                diags.push(
                    RawDiag::new(
                        span(cmd.col, cmd.len),
                        format!("unknown ipset command '{}'", cmd.text),
                    )
                    .help(help),
                );
            }
        }
    }
    sets
}

fn ipset_elem(dims: &[Dim], text: &str) -> Option<Value> {
    let parts: Vec<&str> = text.split(',').collect();
    if parts.len() != dims.len() {
        return None;
    }
    let mut vals = Vec::new();
    for (d, p) in dims.iter().zip(parts) {
        match d {
            Dim::Ip | Dim::Net => vals.push(parse_addr_value(p)?),
            Dim::Port => {
                let (proto, port) = match p.split_once(':') {
                    Some((pr, po)) => (
                        symbols::lookup(DataType::InetProto, pr).or_else(|| parse_num(pr))?,
                        po,
                    ),
                    None => (6, p),
                };
                vals.push(Value::Num(proto));
                vals.push(port_value(port)?);
            }
            Dim::Mark => vals.push(Value::Num(parse_num(p)?)),
            Dim::Iface => vals.push(Value::Str(p.to_string())),
        }
    }
    if vals.len() == 1 {
        vals.pop()
    } else {
        Some(Value::Concat(vals))
    }
}

fn port_num(s: &str) -> Option<u64> {
    parse_num(s).or_else(|| symbols::lookup(DataType::InetService, s))
}

/// The bits of `parts` (`SEEN_REPLY`, `ESTABLISHED`, ...) in the symbol
/// table of `dt` (nft's lower-case, dash-separated names), or `None` after
/// reporting each unknown one (with a suggestion among `names`).
fn flag_bits(
    cx: &mut Ctx<'_>,
    a: &Word,
    dt: DataType,
    parts: &[&str],
    names: &[&str],
    what: &str,
) -> Option<u64> {
    let mut bits = 0;
    let mut ok = true;
    for s in parts {
        match symbols::lookup(dt, &s.to_ascii_lowercase().replace('_', "-")) {
            Some(b) => bits |= b,
            None => {
                let help = suggest(s, names.iter().copied());
                cx.err_help(a, format!("unknown connection {what} '{s}'"), help);
                ok = false;
            }
        }
    }
    ok.then_some(bits)
}

/// `80`, `ssh`, `1000-2000`, `1000:2000`, `:1024`, `1024:`.
fn port_value(s: &str) -> Option<Value> {
    let sep = s.find([':', '-']);
    match sep {
        Some(i) if symbols::lookup(DataType::InetService, s).is_none() => {
            let (a, b) = (s.get(..i)?, s.get(i + 1..)?);
            let lo = if a.is_empty() { 0 } else { port_num(a)? };
            let hi = if b.is_empty() { 65535 } else { port_num(b)? };
            Some(Value::Range(
                Box::new(Value::Num(lo)),
                Box::new(Value::Num(hi)),
            ))
        }
        _ => Some(Value::Num(port_num(s)?)),
    }
}

struct Builtin {
    name: &'static str,
    hook: Hook,
    priority: i32,
    chain_type: ChainType,
}

const fn b(name: &'static str, hook: Hook, priority: i32, chain_type: ChainType) -> Builtin {
    Builtin {
        name,
        hook,
        priority,
        chain_type,
    }
}

fn builtins(table: &str) -> &'static [Builtin] {
    use ChainType::*;
    use Hook::*;
    const FILTER: &[Builtin] = &[
        b("INPUT", Input, 0, Filter),
        b("FORWARD", Forward, 0, Filter),
        b("OUTPUT", Output, 0, Filter),
    ];
    const NAT: &[Builtin] = &[
        b("PREROUTING", Prerouting, -100, Nat),
        b("INPUT", Input, 100, Nat),
        b("OUTPUT", Output, -100, Nat),
        b("POSTROUTING", Postrouting, 100, Nat),
    ];
    const MANGLE: &[Builtin] = &[
        b("PREROUTING", Prerouting, -150, Filter),
        b("INPUT", Input, -150, Filter),
        b("FORWARD", Forward, -150, Filter),
        b("OUTPUT", Output, -150, Route),
        b("POSTROUTING", Postrouting, -150, Filter),
    ];
    const RAW: &[Builtin] = &[
        b("PREROUTING", Prerouting, -300, Filter),
        b("OUTPUT", Output, -300, Filter),
    ];
    match table {
        "filter" => FILTER,
        "nat" => NAT,
        "mangle" => MANGLE,
        "raw" => RAW,
        _ => &[],
    }
}

struct Ctx<'a> {
    diags: Vec<RawDiag>,
    sets: &'a [IpSet],
    line: u32,
    /// ip6tables-restore input: `ip6` tables, IPv6 addresses, ICMPv6.
    v6: bool,
}

impl Ctx<'_> {
    fn span(&self, w: &Word) -> Span {
        Span {
            file: FILE_MAIN,
            line: self.line,
            col: w.col,
            len: w.len,
        }
    }
    fn err(&mut self, w: &Word, msg: impl Into<String>) {
        let sp = self.span(w);
        self.diags.push(RawDiag::new(sp, msg));
    }
    fn err_help(&mut self, w: &Word, msg: impl Into<String>, help: Option<String>) {
        let sp = self.span(w);
        self.diags.push(RawDiag::new(sp, msg).help(help));
    }
}

pub(crate) fn parse(text: &str, ipsets: Option<&str>, v6: bool) -> (Vec<Table>, Vec<RawDiag>) {
    let mut diags = Vec::new();
    let sets = ipsets
        .map(|s| parse_ipsets(s, &mut diags))
        .unwrap_or_default();
    let mut cx = Ctx {
        diags,
        sets: &sets,
        line: 0,
        v6,
    };
    let mut tables: Vec<Table> = Vec::new();
    let mut cur: Option<Table> = None;
    let mut cur_word: Option<Word> = None;
    for (ln, line) in text.lines().enumerate() {
        cx.line = ln as u32 + 1;
        // A comment line is skipped whole, quotes and all (as
        // iptables-restore does).
        if line.trim_start().starts_with('#') {
            continue;
        }
        let words = match tokenize(line) {
            Ok(w) => w,
            Err(c) => {
                let w = Word {
                    text: String::new(),
                    col: c,
                    len: 1,
                };
                cx.err(&w, "unterminated quote");
                continue;
            }
        };
        let Some(first) = words.first() else { continue };
        if first.text.starts_with('#') {
            continue;
        }
        if let Some(name) = first.text.strip_prefix('*') {
            if let Some(t) = cur.take() {
                let w = cur_word.clone().unwrap_or_else(|| first.clone());
                cx.err(&w, format!("table '{}' is missing COMMIT", t.name));
            }
            if builtins(name).is_empty() {
                let help = suggest(name, ["filter", "nat", "mangle", "raw"]);
                cx.err_help(first, format!("unsupported table '{name}'"), help);
                continue;
            }
            let span = cx.span(first);
            cur = Some(Table {
                family: if cx.v6 { Family::Ip6 } else { Family::Ip },
                name: name.to_string(),
                chains: Vec::new(),
                sets: Vec::new(),
                maps: Vec::new(),
                objects: Vec::new(),
                flowtables: Vec::new(),
                ct_timeouts: Vec::new(),
                span,
            });
            cur_word = Some(first.clone());
            continue;
        }
        if first.text == "COMMIT" {
            match cur.take() {
                Some(t) => {
                    tables.retain(|x| x.name != t.name);
                    tables.push(t);
                }
                None => cx.err(first, "COMMIT outside of a table"),
            }
            continue;
        }
        let Some(table) = cur.as_mut() else {
            cx.err(first, "expected a table header such as *filter");
            continue;
        };
        if let Some(decl) = first.text.strip_prefix(':') {
            chain_decl(&mut cx, table, decl, &words);
            continue;
        }
        command(&mut cx, table, &words);
    }
    if let Some(t) = cur {
        if let Some(w) = &cur_word {
            cx.err(w, format!("table '{}' is missing COMMIT", t.name));
        }
    }
    (tables, cx.diags)
}

fn builtin_base(table: &str, chain: &str, span: Span, policy: Policy) -> Option<BaseChain> {
    builtins(table)
        .iter()
        .find(|b| b.name == chain)
        .map(|b| BaseChain {
            chain_type: b.chain_type,
            hook: b.hook,
            priority: b.priority,
            policy,
            span,
        })
}

fn new_chain(table: &str, name: &str, span: Span, policy: Policy) -> Chain {
    Chain {
        name: name.to_string(),
        base: builtin_base(table, name, span, policy),
        rules: Vec::new(),
        comment: None,
        span,
    }
}

fn chain_decl(cx: &mut Ctx<'_>, t: &mut Table, name: &str, words: &[Word]) {
    let Some(first) = words.first() else { return };
    let span = cx.span(first);
    let is_builtin = builtins(&t.name).iter().any(|b| b.name == name);
    let policy = match words.get(1).map(|w| w.text.as_str()) {
        Some("ACCEPT") => Policy::Accept,
        Some("DROP") => Policy::Drop,
        Some("-") if !is_builtin => Policy::Accept,
        Some(p) => {
            if let Some(w) = words.get(1) {
                let msg = if is_builtin {
                    format!("invalid policy '{p}' for built-in chain {name} (ACCEPT or DROP)")
                } else {
                    format!("user-defined chain {name} cannot have a policy ('-' expected)")
                };
                let help = if is_builtin {
                    suggest(p, ["ACCEPT", "DROP"])
                } else {
                    None
                };
                cx.err_help(w, msg, help);
            }
            return;
        }
        None => {
            cx.err(first, "missing chain policy");
            return;
        }
    };
    if name.is_empty() {
        cx.err(first, "missing chain name");
        return;
    }
    if t.chains.iter().any(|c| c.name == name) {
        cx.err(first, format!("duplicate chain '{name}'"));
        return;
    }
    t.chains.push(new_chain(&t.name, name, span, policy));
}

fn chain_index(cx: &mut Ctx<'_>, t: &mut Table, w: &Word, create_builtin: bool) -> Option<usize> {
    if let Some(i) = t.chains.iter().position(|c| c.name == w.text) {
        return Some(i);
    }
    if create_builtin && builtins(&t.name).iter().any(|b| b.name == w.text) {
        let sp = cx.span(w);
        t.chains
            .push(new_chain(&t.name, &w.text, sp, Policy::Accept));
        return Some(t.chains.len() - 1);
    }
    let help = suggest(&w.text, t.chains.iter().map(|c| c.name.as_str()));
    cx.err_help(
        w,
        format!("no such chain '{}' in table {}", w.text, t.name),
        help,
    );
    None
}

fn command(cx: &mut Ctx<'_>, t: &mut Table, words: &[Word]) {
    let mut words = words;
    // `[packets:bytes] -A ...` from iptables-save -c.
    let mut counters = None;
    if let Some(w) = words.first().filter(|w| w.text.starts_with('[')) {
        match parse_counters(&w.text) {
            Some(c) => counters = Some(c),
            None => cx.err(w, "invalid counters, expected [packets:bytes]"),
        }
        words = words.get(1..).unwrap_or(&[]);
    }
    let Some(cmd) = words.first() else { return };
    let Some(chain_w) = words.get(1) else {
        cx.err(cmd, "missing chain name");
        return;
    };
    match cmd.text.as_str() {
        "-N" | "--new-chain" => {
            if t.chains.iter().any(|c| c.name == chain_w.text) {
                cx.err(chain_w, format!("duplicate chain '{}'", chain_w.text));
            } else {
                let sp = cx.span(chain_w);
                t.chains
                    .push(new_chain(&t.name, &chain_w.text, sp, Policy::Accept));
            }
        }
        "-P" | "--policy" => {
            let Some(ci) = chain_index(cx, t, chain_w, true) else {
                return;
            };
            let policy = match words.get(2).map(|w| w.text.as_str()) {
                Some("ACCEPT") => Policy::Accept,
                Some("DROP") => Policy::Drop,
                _ => {
                    cx.err(
                        words.get(2).unwrap_or(chain_w),
                        "expected policy ACCEPT or DROP",
                    );
                    return;
                }
            };
            match t.chains.get_mut(ci).and_then(|c| c.base.as_mut()) {
                Some(b) => b.policy = policy,
                None => cx.err(chain_w, "policy is only valid on built-in chains"),
            }
        }
        "-A" | "--append" | "-I" | "--insert" => {
            let Some(ci) = chain_index(cx, t, chain_w, true) else {
                return;
            };
            let mut rest = words.get(2..).unwrap_or(&[]);
            let mut pos = None;
            if cmd.text.starts_with("-I") || cmd.text == "--insert" {
                pos = Some(0);
                if let Some(n) = rest.first().and_then(|w| w.text.parse::<usize>().ok()) {
                    pos = Some(n.saturating_sub(1));
                    rest = rest.get(1..).unwrap_or(&[]);
                }
            }
            let span = cx.span(cmd);
            let Some(rule) = rule(cx, &t.name, &mut t.sets, rest, counters, span) else {
                return;
            };
            // `-m nfacct --nfacct-name NAME` names an accounting object
            // that lives outside the rule set (nfacct): the table declares
            // a counter of that name the first time a rule names it.
            for st in &rule.stmts {
                if let StmtKind::ObjRef {
                    kind: ObjKind::Counter,
                    name,
                } = &st.kind
                {
                    if !t.objects.iter().any(|o| o.name == *name) {
                        t.objects.push(Object {
                            name: name.clone(),
                            state: ObjState::Counter {
                                packets: 0,
                                bytes: 0,
                            },
                            comment: None,
                            span: st.span,
                        });
                    }
                }
            }
            if let Some(c) = t.chains.get_mut(ci) {
                match pos {
                    Some(p) => c.rules.insert(p.min(c.rules.len()), rule),
                    None => c.rules.push(rule),
                }
            }
        }
        "-D" | "-R" | "-F" | "-X" | "-Z" | "-E" => {
            cx.err(
                cmd,
                format!("command '{}' is not supported in restore files", cmd.text),
            );
        }
        other => {
            let help = suggest(other, ["-A", "-I", "-N", "-P"]);
            cx.err_help(cmd, format!("unknown command '{other}'"), help);
        }
    }
}

fn parse_counters(s: &str) -> Option<(u64, u64)> {
    let inner = s.strip_prefix('[')?.strip_suffix(']')?;
    let (p, b) = inner.split_once(':')?;
    Some((p.parse().ok()?, b.parse().ok()?))
}

const OPTIONS: &[&str] = &[
    "-s",
    "--source",
    "-d",
    "--destination",
    "-i",
    "--in-interface",
    "-o",
    "--out-interface",
    "-p",
    "--protocol",
    "-m",
    "--match",
    "-j",
    "--jump",
    "-g",
    "--goto",
    "-c",
    "--sport",
    "--dport",
    "--source-port",
    "--destination-port",
    "--sports",
    "--dports",
    "--ctstate",
    "--ctstatus",
    "--ctdir",
    "--ctorigsrc",
    "--ctorigdst",
    "--ctreplsrc",
    "--ctrepldst",
    "--ctorigsrcport",
    "--ctorigdstport",
    "--ctreplsrcport",
    "--ctrepldstport",
    "--state",
    "--src-type",
    "--dst-type",
    "--match-set",
    "--mark",
    "--comment",
    "--tcp-flags",
    "--syn",
    "--icmp-type",
    "--icmpv6-type",
    "--limit",
    "--limit-burst",
    "--quota",
    "--src-range",
    "--dst-range",
    "--length",
    "--ttl-eq",
    "--ttl-lt",
    "--ttl-gt",
    "--hl-eq",
    "--hl-lt",
    "--hl-gt",
    "--pkt-type",
    "--dscp",
    "--dscp-class",
    "--nflog-group",
    "--nflog-prefix",
    "--nflog-range",
    "--nflog-size",
    "--nflog-threshold",
    "--hashlimit",
    "--hashlimit-upto",
    "--hashlimit-above",
    "--hashlimit-burst",
    "--hashlimit-mode",
    "--hashlimit-name",
    "--hashlimit-htable-expire",
    "--hashlimit-htable-max",
    "--hashlimit-htable-size",
    "--hashlimit-htable-gcinterval",
    "--hashlimit-srcmask",
    "--hashlimit-dstmask",
    "--mode",
    "--probability",
    "--every",
    "--packet",
    "--nfacct-name",
    "--datestart",
    "--datestop",
    "--timestart",
    "--timestop",
    "--weekdays",
    "--monthdays",
    "--contiguous",
    "--kerneltz",
    "--localtz",
    "--utc",
    "--connlimit-upto",
    "--connlimit-above",
    "--connlimit-mask",
    "--connlimit-saddr",
    "--connlimit-daddr",
    "--reject-with",
    "--log-prefix",
    "--log-level",
    "--set-mark",
    "--set-xmark",
    "--and-mark",
    "--or-mark",
    "--xor-mark",
    "--set-mss",
    "--clamp-mss-to-pmtu",
    "--save-mark",
    "--restore-mark",
    "--notrack",
    "--zone",
    "--zone-orig",
    "--zone-reply",
    "--helper",
    "--ctevents",
    "--expevents",
    "--timeout",
    "--mac-source",
    "--to-source",
    "--to-destination",
    "--to-ports",
    "--random",
    "--random-fully",
    "--persistent",
];

fn addr_value(s: &str) -> Option<Value> {
    if let Some((a, m)) = s.split_once('/') {
        if m.contains('.') {
            let addr: IpAddr = a.parse().ok()?;
            let mask: Ipv4Addr = m.parse().ok()?;
            let bits = u32::from(mask);
            if bits.leading_ones() + bits.trailing_zeros() != 32 {
                return None;
            }
            return Some(Value::Prefix {
                addr,
                len: bits.leading_ones() as u8,
            });
        }
        // A host prefix is the address (an IPv6 /32 is a network).
        if (m == "32" && !a.contains(':')) || (m == "128" && a.contains(':')) {
            return Some(Value::Addr(a.parse().ok()?));
        }
    }
    parse_addr_value(s)
}

fn rule(
    cx: &mut Ctx<'_>,
    table: &str,
    sets: &mut Vec<Set>,
    words: &[Word],
    counters: Option<(u64, u64)>,
    span: Span,
) -> Option<Rule> {
    let mut r = Rule {
        matches: Vec::new(),
        stmts: Vec::new(),
        handle: None,
        comment: None,
        span,
    };
    let mut counters = counters;
    let mut neg = false;
    let mut proto: Option<(u64, bool, usize, Span, Span)> = None;
    let mut used_l4 = false;
    let mut target: Option<(Word, bool)> = None;
    let mut topts: Vec<(Word, Option<Word>)> = Vec::new();
    let mut limit: Option<Limit> = None;
    let mut limit_span = span;
    let mut hl = HashLimit::default();
    // -m connlimit: (above, count, span), and whether it counts by
    // destination.
    let mut connlimit: Option<(bool, u32, Span)> = None;
    let mut connlimit_daddr = false;
    // -m statistic: mode (and its span), probability or every/packet, and
    // the `!` in front of --probability or --every.
    let mut stat = Statistic::default();
    // -m time, one per `-m time` (a rule may have several, each a match).
    let mut xt_times: Vec<XtTime> = Vec::new();
    let mut skip_unknown = false;
    let mut ok = true;
    let mut i = 0;
    macro_rules! arg {
        ($w:expr) => {{
            i += 1;
            match words.get(i) {
                Some(a) => a.clone(),
                None => {
                    cx.err($w, format!("option {} requires an argument", $w.text));
                    return None;
                }
            }
        }};
    }
    while let Some(w) = words.get(i) {
        let wsp = cx.span(w);
        let push = |r: &mut Rule,
                    left: Vec<Field>,
                    mask: Option<u64>,
                    neg: bool,
                    right: Value,
                    rsp: Span| {
            let op = if neg { RelOp::Ne } else { RelOp::Implicit };
            r.matches.push(Match {
                left: left.into(),
                mask,
                op,
                right,
                span: wsp,
                right_span: rsp,
            });
        };
        match w.text.as_str() {
            "!" => {
                neg = true;
                i += 1;
                continue;
            }
            "-s" | "--source" | "--src" | "-d" | "--destination" | "--dst" => {
                let a = arg!(w);
                let src = w.text.starts_with("-s") || w.text.starts_with("--s");
                let f = addr_field(cx.v6, src);
                let v6 = cx.v6;
                let family_ok = |v: &Value| match v {
                    Value::Addr(a) | Value::Prefix { addr: a, .. } => a.is_ipv6() == v6,
                    Value::Range(a, _) => matches!(&**a, Value::Addr(a) if a.is_ipv6() == v6),
                    _ => true,
                };
                let vals: Option<Vec<Value>> = a.text.split(',').map(addr_value).collect();
                if vals.as_ref().is_some_and(|v| !v.iter().all(family_ok)) {
                    let (want, tool) = if v6 {
                        ("an IPv6", "ip6tables")
                    } else {
                        ("an IPv4", "iptables")
                    };
                    cx.err(
                        &a,
                        format!("'{}' is not {want} address ({tool}-restore input)", a.text),
                    );
                    ok = false;
                }
                match vals.filter(|v| v.iter().all(family_ok)) {
                    Some(mut v) if v.len() == 1 => {
                        push(&mut r, vec![f], None, neg, v.remove(0), cx.span(&a))
                    }
                    Some(v) => {
                        let sp = cx.span(&a);
                        let elems = v
                            .into_iter()
                            .map(|key| Elem {
                                key,
                                data: None,
                                span: sp,
                                opts: None,
                            })
                            .collect();
                        push(&mut r, vec![f], None, neg, Value::Set(elems), sp);
                    }
                    // A family mismatch was reported above.
                    None if a.text.split(',').all(|x| addr_value(x).is_some()) => {}
                    None => {
                        cx.err(
                            &a,
                            format!("invalid address '{}' (host names are not resolved)", a.text),
                        );
                        ok = false;
                    }
                }
            }
            "-i" | "--in-interface" | "-o" | "--out-interface" => {
                let a = arg!(w);
                let f = if w.text.contains('i') {
                    Field::Iifname
                } else {
                    Field::Oifname
                };
                let name = match a.text.strip_suffix('+') {
                    Some(p) => format!("{p}*"),
                    None => a.text.clone(),
                };
                push(&mut r, vec![f], None, neg, Value::Str(name), cx.span(&a));
            }
            "-p" | "--protocol" => {
                let a = arg!(w);
                let mut lower = a.text.to_ascii_lowercase();
                if matches!(lower.as_str(), "icmp6" | "ipv6-icmp") {
                    lower = "icmpv6".into();
                }
                if lower != "all" {
                    match symbols::lookup(DataType::InetProto, &lower).or_else(|| parse_num(&lower))
                    {
                        Some(p) => proto = Some((p, neg, r.matches.len(), wsp, cx.span(&a))),
                        None => {
                            let help = suggest(&lower, symbols::PROTOCOLS.iter().map(|(n, _)| *n));
                            cx.err_help(&a, format!("unknown protocol '{}'", a.text), help);
                            ok = false;
                        }
                    }
                }
            }
            "-m" | "--match" => {
                let a = arg!(w);
                let known = [
                    "tcp",
                    "udp",
                    "icmp",
                    "icmp6",
                    "icmpv6",
                    "multiport",
                    "conntrack",
                    "state",
                    "set",
                    "mark",
                    "comment",
                    "limit",
                    "hashlimit",
                    "connlimit",
                    "statistic",
                    "quota",
                    "iprange",
                    "length",
                    "ttl",
                    "hl",
                    "pkttype",
                    "dscp",
                    "addrtype",
                    "mac",
                    "time",
                    "nfacct",
                ];
                if a.text == "time" {
                    xt_times.push(XtTime {
                        span: Some(cx.span(&a)),
                        ..XtTime::default()
                    });
                }
                if !known.contains(&a.text.as_str()) {
                    // The module's own options are not reported again.
                    skip_unknown = true;
                    let why = match a.text.as_str() {
                        "recent" => Some(
                            "per-address hit lists have no nft equivalent; for rate limits \
                             per source use -m hashlimit",
                        ),
                        "owner" => Some(
                            "socket owners concern locally generated packets, which Sluice \
                             does not have",
                        ),
                        _ => None,
                    };
                    match why {
                        Some(why) => cx.err(
                            &a,
                            format!("match module '{}' is not supported: {why}", a.text),
                        ),
                        None => {
                            let help = suggest(&a.text, known);
                            cx.err_help(&a, format!("unsupported match module '{}'", a.text), help)
                        }
                    }
                    ok = false;
                }
            }
            "--sport"
            | "--source-port"
            | "--dport"
            | "--destination-port"
            | "--sports"
            | "--dports"
            | "--source-ports"
            | "--destination-ports" => {
                let a = arg!(w);
                let src = w.text.starts_with("--s");
                let f = match (proto.map(|p| p.0), src) {
                    (Some(6), true) => Field::TcpSport,
                    (Some(6), false) => Field::TcpDport,
                    (Some(17), true) => Field::UdpSport,
                    (Some(17), false) => Field::UdpDport,
                    _ => {
                        cx.err(w, format!("{} requires -p tcp or -p udp", w.text));
                        ok = false;
                        i += 1;
                        continue;
                    }
                };
                used_l4 = true;
                let multi = w.text.ends_with('s');
                let vals: Option<Vec<Value>> = a.text.split(',').map(port_value).collect();
                match vals {
                    Some(mut v) if v.len() == 1 && !multi => {
                        push(&mut r, vec![f], None, neg, v.remove(0), cx.span(&a))
                    }
                    Some(v) if multi || v.len() > 1 => {
                        let sp = cx.span(&a);
                        let elems = v
                            .into_iter()
                            .map(|key| Elem {
                                key,
                                data: None,
                                span: sp,
                                opts: None,
                            })
                            .collect();
                        push(&mut r, vec![f], None, neg, Value::Set(elems), sp);
                    }
                    _ => {
                        cx.err(&a, format!("invalid port '{}'", a.text));
                        ok = false;
                    }
                }
            }
            // `-m mac --mac-source`: nft's `ether saddr`.
            "--mac-source" => {
                let a = arg!(w);
                match symbols::parse_mac(&a.text) {
                    Some(m) => push(
                        &mut r,
                        vec![Field::EtherSaddr],
                        None,
                        neg,
                        Value::Num(m),
                        cx.span(&a),
                    ),
                    None => {
                        cx.err(&a, format!("invalid MAC address '{}'", a.text));
                        ok = false;
                    }
                }
            }
            // `-m addrtype`: nft's `fib daddr type` / `fib saddr type`.
            "--src-type" | "--dst-type" => {
                let a = arg!(w);
                let f = if w.text == "--src-type" {
                    Field::FibSaddrType
                } else {
                    Field::FibDaddrType
                };
                let mut vals = Vec::new();
                for t in a.text.split(',') {
                    match symbols::lookup(DataType::AddrType, &t.to_ascii_lowercase()) {
                        Some(v) => vals.push(Value::Num(v)),
                        None => {
                            let names: Vec<String> = symbols::ADDRTYPE
                                .iter()
                                .map(|(n, _)| n.to_ascii_uppercase())
                                .collect();
                            let help = suggest(t, names.iter().map(String::as_str));
                            cx.err_help(&a, format!("unknown address type '{t}'"), help);
                            ok = false;
                        }
                    }
                }
                let sp = cx.span(&a);
                let right = if vals.len() == 1 {
                    vals.remove(0)
                } else {
                    Value::Set(
                        vals.into_iter()
                            .map(|key| Elem {
                                key,
                                data: None,
                                span: sp,
                                opts: None,
                            })
                            .collect(),
                    )
                };
                push(&mut r, vec![f], None, neg, right, sp);
            }
            "--ctorigsrc" | "--ctorigdst" | "--ctreplsrc" | "--ctrepldst" => {
                let a = arg!(w);
                let v6 = cx.v6;
                let f = match (&w.text[4..], v6) {
                    ("origsrc", false) => Field::CtOrigIpSaddr,
                    ("origdst", false) => Field::CtOrigIpDaddr,
                    ("replsrc", false) => Field::CtReplyIpSaddr,
                    ("repldst", false) => Field::CtReplyIpDaddr,
                    ("origsrc", true) => Field::CtOrigIp6Saddr,
                    ("origdst", true) => Field::CtOrigIp6Daddr,
                    ("replsrc", true) => Field::CtReplyIp6Saddr,
                    _ => Field::CtReplyIp6Daddr,
                };
                match addr_value(&a.text) {
                    Some(v @ (Value::Addr(ip) | Value::Prefix { addr: ip, .. }))
                        if ip.is_ipv6() == v6 =>
                    {
                        push(&mut r, vec![f], None, neg, v, cx.span(&a))
                    }
                    _ => {
                        let fam = if v6 { "IPv6" } else { "IPv4" };
                        cx.err(
                            &a,
                            format!("invalid {} '{}': one {fam} address[/mask]", w.text, a.text),
                        );
                        ok = false;
                    }
                }
            }
            "--ctorigsrcport" | "--ctorigdstport" | "--ctreplsrcport" | "--ctrepldstport" => {
                let a = arg!(w);
                let f = match w.text.as_str() {
                    "--ctorigsrcport" => Field::CtOrigProtoSrc,
                    "--ctorigdstport" => Field::CtOrigProtoDst,
                    "--ctreplsrcport" => Field::CtReplyProtoSrc,
                    _ => Field::CtReplyProtoDst,
                };
                match port_value(&a.text) {
                    Some(v) => push(&mut r, vec![f], None, neg, v, cx.span(&a)),
                    None => {
                        cx.err(&a, format!("invalid port '{}'", a.text));
                        ok = false;
                    }
                }
            }
            "--ctdir" => {
                let a = arg!(w);
                match symbols::lookup(DataType::CtDir, &a.text.to_ascii_lowercase()) {
                    Some(d) => push(
                        &mut r,
                        vec![Field::CtDirection],
                        None,
                        neg,
                        Value::Num(d),
                        cx.span(&a),
                    ),
                    None => {
                        let help = suggest(&a.text, ["ORIGINAL", "REPLY"]);
                        cx.err_help(&a, format!("unknown --ctdir '{}'", a.text), help);
                        ok = false;
                    }
                }
            }
            "--ctstatus" => {
                let a = arg!(w);
                let names = ["EXPECTED", "SEEN_REPLY", "ASSURED", "CONFIRMED"];
                let parts: Vec<&str> = a.text.split(',').collect();
                // xt_conntrack's status names only (nft's `ct status` has
                // more, which iptables refuses: SNAT and DNAT are
                // `--ctstate` pseudo-states there).
                let unknown = parts
                    .iter()
                    .find(|p| !names.iter().any(|n| n.eq_ignore_ascii_case(p)));
                if let Some(bad) = unknown {
                    let hint =
                        if bad.eq_ignore_ascii_case("snat") || bad.eq_ignore_ascii_case("dnat") {
                            format!("; {bad} is a --ctstate (-m conntrack --ctstate {bad})")
                        } else {
                            String::new()
                        };
                    let help = suggest(bad, names.iter().copied());
                    cx.err_help(
                        &a,
                        format!(
                            "unknown connection status '{bad}': --ctstatus takes EXPECTED, \
                             SEEN_REPLY, ASSURED and CONFIRMED{hint}"
                        ),
                        help,
                    );
                    ok = false;
                }
                let bits = if unknown.is_none() {
                    flag_bits(cx, &a, DataType::CtStatus, &parts, &names, "status")
                } else {
                    None
                };
                match bits {
                    Some(bits) => push(
                        &mut r,
                        vec![Field::CtStatus],
                        None,
                        neg,
                        Value::Num(bits),
                        cx.span(&a),
                    ),
                    None => ok = false,
                }
            }
            "--ctstate" | "--state" => {
                let a = arg!(w);
                // xt_conntrack's SNAT and DNAT pseudo-states are status bits
                // (iptables-translate: `ct status snat|dnat`); mixed with
                // real states they would need an OR across two fields.
                let (nat, states): (Vec<&str>, Vec<&str>) = a
                    .text
                    .split(',')
                    .partition(|s| w.text == "--ctstate" && matches!(*s, "SNAT" | "DNAT"));
                let names = ["NEW", "ESTABLISHED", "RELATED", "INVALID", "UNTRACKED"];
                let (field, bits) = if states.is_empty() {
                    (
                        Field::CtStatus,
                        flag_bits(cx, &a, DataType::CtStatus, &nat, &[], "status"),
                    )
                } else if nat.is_empty() {
                    (
                        Field::CtState,
                        flag_bits(cx, &a, DataType::CtState, &states, &names, "state"),
                    )
                } else {
                    cx.err(
                        &a,
                        "--ctstate mixes SNAT/DNAT (connection status) with states; write \
                         them as two -m conntrack matches",
                    );
                    (Field::CtState, None)
                };
                match bits {
                    Some(bits) => push(
                        &mut r,
                        vec![field],
                        None,
                        neg,
                        Value::Num(bits),
                        cx.span(&a),
                    ),
                    None => ok = false,
                }
            }
            "--match-set" => {
                let name = arg!(w);
                let flags = arg!(w);
                match match_set(cx, table, sets, &name, &flags) {
                    Some(left) => {
                        let right = Value::SetRef(name.text.clone());
                        push(&mut r, left, None, neg, right, cx.span(&name));
                    }
                    None => ok = false,
                }
            }
            "--mark" => {
                let a = arg!(w);
                let (v, m) = match a.text.split_once('/') {
                    Some((v, m)) => (parse_num(v), parse_num(m).map(Some)),
                    None => (parse_num(&a.text), Some(None)),
                };
                match (v, m) {
                    (Some(v), Some(m)) => {
                        let m = m.filter(|m| *m != 0xffff_ffff);
                        let op = match (neg, m) {
                            (true, _) => RelOp::Ne,
                            (false, Some(_)) => RelOp::Eq,
                            (false, None) => RelOp::Implicit,
                        };
                        r.matches.push(Match {
                            left: Field::MetaMark.into(),
                            mask: m,
                            op,
                            right: Value::Num(v),
                            span: wsp,
                            right_span: cx.span(&a),
                        });
                    }
                    _ => {
                        cx.err(&a, format!("invalid mark '{}'", a.text));
                        ok = false;
                    }
                }
            }
            "--comment" => {
                let a = arg!(w);
                r.comment = Some(a.text);
            }
            "--tcp-flags" | "--syn" => {
                let (mask, comp, asp) = if w.text == "--syn" {
                    (1 | 2 | 4 | 16, 2, wsp)
                } else {
                    let m = arg!(w);
                    let c = arg!(w);
                    match (tcp_flags(&m.text), tcp_flags(&c.text)) {
                        (Some(mv), Some(cv)) => (mv, cv, cx.span(&c)),
                        _ => {
                            cx.err(&m, "invalid TCP flags (SYN,ACK,FIN,RST,URG,PSH,ALL,NONE)");
                            ok = false;
                            i += 1;
                            continue;
                        }
                    }
                };
                if proto.map(|p| p.0) != Some(6) {
                    cx.err(w, format!("{} requires -p tcp", w.text));
                    ok = false;
                }
                used_l4 = true;
                let op = if neg { RelOp::Ne } else { RelOp::Eq };
                r.matches.push(Match {
                    left: Field::TcpFlags.into(),
                    mask: Some(mask),
                    op,
                    right: Value::Num(comp),
                    span: wsp,
                    right_span: asp,
                });
            }
            "--icmp-type" if cx.v6 => {
                cx.err(
                    w,
                    "--icmp-type is an iptables option; ip6tables input uses --icmpv6-type",
                );
                ok = false;
                i += 1;
            }
            "--icmpv6-type" if !cx.v6 => {
                cx.err(
                    w,
                    "--icmpv6-type is an ip6tables option (this is iptables-restore input; \
                     give --format ip6tables for an ip6tables-save file)",
                );
                ok = false;
                i += 1;
            }
            "--icmp-type" | "--icmpv6-type" => {
                let a = arg!(w);
                let v6 = w.text == "--icmpv6-type";
                let (type_field, code_field, dt, what) = if v6 {
                    (
                        Field::Icmpv6Type,
                        Field::Icmpv6Code,
                        DataType::Icmpv6Type,
                        "ICMPv6",
                    )
                } else {
                    (Field::IcmpType, Field::IcmpCode, DataType::IcmpType, "ICMP")
                };
                // ip6tables' names (`ip6tables -p icmpv6 -h`) name a type, or
                // a type and a code.
                let named = IP6T_ICMPV6.iter().find(|(n, _, _)| v6 && *n == a.text);
                let (t, c) = match (named, a.text.split_once('/')) {
                    (Some((_, t, c)), _) => (t.to_string(), c.map(|c| c.to_string())),
                    (None, Some((t, c))) => (t.to_string(), Some(c.to_string())),
                    (None, None) => (a.text.clone(), None),
                };
                let tv = parse_num(&t).or_else(|| symbols::lookup(dt, &t));
                let cv = c.as_deref().map(parse_num);
                match (tv, cv) {
                    (Some(tv), None | Some(Some(_))) => {
                        used_l4 = true;
                        let sp = cx.span(&a);
                        push(&mut r, vec![type_field], None, neg, Value::Num(tv), sp);
                        if let Some(Some(cv)) = cv {
                            push(&mut r, vec![code_field], None, neg, Value::Num(cv), sp);
                        }
                    }
                    _ => {
                        let help = if v6 {
                            suggest(&t, IP6T_ICMPV6.iter().map(|(n, _, _)| *n))
                        } else {
                            suggest(&t, symbols::ICMP_TYPES.iter().map(|(n, _)| *n))
                        };
                        cx.err_help(&a, format!("invalid {what} type '{}'", a.text), help);
                        ok = false;
                    }
                }
            }
            // `-m iprange`: an address range.
            "--src-range" | "--dst-range" => {
                let a = arg!(w);
                let src = w.text == "--src-range";
                let f = addr_field(cx.v6, src);
                let range = a.text.split_once('-').and_then(|(lo, hi)| {
                    let (lo, hi): (IpAddr, IpAddr) = (lo.parse().ok()?, hi.parse().ok()?);
                    (lo.is_ipv6() == cx.v6 && hi.is_ipv6() == cx.v6)
                        .then(|| Value::Range(Box::new(Value::Addr(lo)), Box::new(Value::Addr(hi))))
                });
                match range {
                    Some(v) => push(&mut r, vec![f], None, neg, v, cx.span(&a)),
                    None => {
                        let fam = if cx.v6 { "IPv6" } else { "IPv4" };
                        cx.err(&a, format!("invalid {fam} range '{}' (FROM-TO)", a.text));
                        ok = false;
                    }
                }
            }
            // `-m length`: the IP packet's length (nft `meta length`).
            "--length" => {
                let a = arg!(w);
                let v = match a.text.split_once(':') {
                    Some((lo, hi)) => {
                        let lo = if lo.is_empty() {
                            Some(0)
                        } else {
                            parse_num(lo)
                        };
                        let hi = if hi.is_empty() {
                            Some(65535)
                        } else {
                            parse_num(hi)
                        };
                        match (lo, hi) {
                            (Some(l), Some(h)) if l <= h && h <= 65535 => Some(Value::Range(
                                Box::new(Value::Num(l)),
                                Box::new(Value::Num(h)),
                            )),
                            _ => None,
                        }
                    }
                    None => parse_num(&a.text).filter(|n| *n <= 65535).map(Value::Num),
                };
                match v {
                    Some(v) => push(&mut r, vec![Field::MetaLength], None, neg, v, cx.span(&a)),
                    None => {
                        cx.err(
                            &a,
                            format!("invalid length '{}' (N or FROM:TO, 0-65535)", a.text),
                        );
                        ok = false;
                    }
                }
            }
            // `-m ttl` / ip6tables `-m hl`.
            "--ttl-eq" | "--ttl-lt" | "--ttl-gt" | "--hl-eq" | "--hl-lt" | "--hl-gt" => {
                let a = arg!(w);
                let hl = w.text.starts_with("--hl");
                if hl != cx.v6 {
                    let (want, tool) = if cx.v6 {
                        ("--hl-eq/--hl-lt/--hl-gt (-m hl)", "ip6tables")
                    } else {
                        ("--ttl-eq/--ttl-lt/--ttl-gt (-m ttl)", "iptables")
                    };
                    cx.err(w, format!("{} is not an {tool} option; use {want}", w.text));
                    ok = false;
                } else {
                    match parse_num(&a.text).filter(|n| *n <= 255) {
                        Some(n) => {
                            let op = match (&w.text[w.text.len() - 2..], neg) {
                                ("eq", false) => RelOp::Implicit,
                                ("eq", true) => RelOp::Ne,
                                ("lt", _) => RelOp::Lt,
                                _ => RelOp::Gt,
                            };
                            if neg && op != RelOp::Ne {
                                cx.err(w, format!("{} cannot be negated", w.text));
                                ok = false;
                            }
                            r.matches.push(Match {
                                left: if hl { Field::Ip6Hoplimit } else { Field::IpTtl }.into(),
                                mask: None,
                                op,
                                right: Value::Num(n),
                                span: wsp,
                                right_span: cx.span(&a),
                            });
                        }
                        None => {
                            cx.err(&a, format!("invalid TTL '{}' (0-255)", a.text));
                            ok = false;
                        }
                    }
                }
            }
            // `-m pkttype`: xt's `unicast` is the kernel's PACKET_HOST.
            "--pkt-type" => {
                let a = arg!(w);
                let name = match a.text.as_str() {
                    "unicast" => "host",
                    t => t,
                };
                match DataType::PktType.symbol(name) {
                    Some(n) if name != "other" => push(
                        &mut r,
                        vec![Field::MetaPkttype],
                        None,
                        neg,
                        Value::Num(n),
                        cx.span(&a),
                    ),
                    _ => {
                        let help = suggest(&a.text, ["unicast", "broadcast", "multicast"]);
                        cx.err_help(&a, format!("invalid packet type '{}'", a.text), help);
                        ok = false;
                    }
                }
            }
            // `-m dscp`: a code point (0-63) or a class name (CS1, AF41, EF, BE).
            "--dscp" | "--dscp-class" => {
                let a = arg!(w);
                let v = if w.text == "--dscp" {
                    parse_num(&a.text).filter(|n| *n <= 63)
                } else {
                    let lower = a.text.to_ascii_lowercase();
                    let name = if lower == "be" { "cs0" } else { lower.as_str() };
                    DataType::Dscp.symbol(name)
                };
                let f = if cx.v6 { Field::Ip6Dscp } else { Field::IpDscp };
                match v {
                    Some(n) => push(&mut r, vec![f], None, neg, Value::Num(n), cx.span(&a)),
                    None => {
                        cx.err(&a, format!("invalid {} '{}'", w.text, a.text));
                        ok = false;
                    }
                }
            }
            "--quota" => {
                // xt_quota: matches while the bytes left cover the packet;
                // `!` matches once they do not (nft `quota over`).
                let a = arg!(w);
                match parse_num(&a.text) {
                    Some(n) => r.stmts.push(Stmt {
                        kind: StmtKind::Quota(Quota {
                            over: neg,
                            amount: n,
                            unit: ByteUnit::Bytes,
                            used: None,
                        }),
                        span: wsp,
                    }),
                    None => {
                        cx.err(
                            &a,
                            format!("invalid quota '{}' (a number of bytes)", a.text),
                        );
                        ok = false;
                    }
                }
            }
            "--hashlimit" | "--hashlimit-upto" | "--hashlimit-above" => {
                let a = arg!(w);
                hl.span = Some(wsp);
                match parse_rate(&a.text) {
                    Some((rate, unit, per)) => {
                        hl.rate = Some((w.text == "--hashlimit-above", rate, unit, per))
                    }
                    None => {
                        cx.err(
                            &a,
                            format!(
                                "invalid rate '{}', expected N[b|kb|mb]/second|minute|hour|day",
                                a.text
                            ),
                        );
                        ok = false;
                    }
                }
            }
            "--hashlimit-burst" | "--hashlimit-htable-expire" | "--hashlimit-htable-max" => {
                let a = arg!(w);
                let bytes_burst = w.text == "--hashlimit-burst"
                    && a.text.ends_with('b')
                    && a.text
                        .trim_end_matches(['k', 'm', 'b'])
                        .parse::<u64>()
                        .is_ok();
                let v = if bytes_burst {
                    // `--hashlimit-burst 64kb` for a byte rate.
                    let n: u64 = a
                        .text
                        .trim_end_matches(['k', 'm', 'b'])
                        .parse()
                        .unwrap_or(0);
                    Some(if a.text.ends_with("mb") {
                        n.saturating_mul(1 << 20)
                    } else if a.text.ends_with("kb") {
                        n.saturating_mul(1 << 10)
                    } else {
                        n
                    })
                } else {
                    parse_num(&a.text)
                };
                match (w.text.as_str(), v) {
                    ("--hashlimit-burst", Some(n)) => hl.burst = Some(n),
                    ("--hashlimit-htable-expire", Some(n)) if n > 0 => hl.expire_ms = Some(n),
                    ("--hashlimit-htable-max", Some(n)) if n > 0 && n <= u64::from(u32::MAX) => {
                        hl.max = Some(n as u32)
                    }
                    _ => {
                        cx.err(&a, format!("invalid {} value '{}'", w.text, a.text));
                        ok = false;
                    }
                }
            }
            "--hashlimit-htable-size" | "--hashlimit-htable-gcinterval" => {
                // Hash buckets and the garbage-collection interval have no
                // meaning here: elements expire on their own.
                let a = arg!(w);
                if parse_num(&a.text).is_none() {
                    cx.err(&a, format!("invalid {} value '{}'", w.text, a.text));
                    ok = false;
                }
            }
            "--hashlimit-srcmask" | "--hashlimit-dstmask" => {
                let a = arg!(w);
                if a.text != "32" {
                    cx.err(
                        &a,
                        format!(
                            "{} {} is not supported: a dynamic set's key is the whole address",
                            w.text, a.text
                        ),
                    );
                    ok = false;
                }
            }
            "--hashlimit-mode" => {
                let a = arg!(w);
                for m in a.text.split(',') {
                    match m {
                        "srcip" | "dstip" | "srcport" | "dstport" => hl.mode.push(m.to_string()),
                        _ => {
                            let help = suggest(m, ["srcip", "dstip", "srcport", "dstport"]);
                            cx.err_help(&a, format!("unknown hashlimit mode '{m}'"), help);
                            ok = false;
                        }
                    }
                }
            }
            "--connlimit-upto" | "--connlimit-above" => {
                // xt_connlimit: `--connlimit-above N` matches once more than
                // N connections are counted, `--connlimit-upto N` (or `!
                // --connlimit-above N`) while at most N are.
                let a = arg!(w);
                match parse_num(&a.text).and_then(|n| u32::try_from(n).ok()) {
                    Some(n) => {
                        connlimit = Some(((w.text == "--connlimit-above") != neg, n, wsp));
                    }
                    None => {
                        cx.err(
                            &a,
                            format!("invalid {} '{}' (a number of connections)", w.text, a.text),
                        );
                        ok = false;
                    }
                }
            }
            "--mode" => {
                let a = arg!(w);
                match a.text.as_str() {
                    "random" | "nth" => stat.mode = Some((a.text == "random", cx.span(&a))),
                    m => {
                        let help = suggest(m, ["random", "nth"]);
                        cx.err_help(&a, format!("unknown statistic mode '{m}'"), help);
                        ok = false;
                    }
                }
            }
            "--probability" => {
                let a = arg!(w);
                match a.text.parse::<f64>() {
                    Ok(p) if (0.0..=1.0).contains(&p) => {
                        // xt_statistic's fixed point: a 31-bit threshold.
                        stat.probability = Some((p * 2_147_483_648.0).round() as u64);
                        stat.negate = neg;
                    }
                    _ => {
                        cx.err(&a, format!("invalid probability '{}' (0 to 1)", a.text));
                        ok = false;
                    }
                }
            }
            "--every" | "--packet" => {
                let a = arg!(w);
                let n = parse_num(&a.text).and_then(|n| u32::try_from(n).ok());
                match (w.text.as_str(), n) {
                    ("--every", Some(n)) if n > 0 => {
                        stat.every = Some(n);
                        stat.negate = neg;
                    }
                    ("--packet", Some(n)) => stat.packet = Some(n),
                    _ => {
                        cx.err(&a, format!("invalid {} '{}'", w.text, a.text));
                        ok = false;
                    }
                }
            }
            // `-m nfacct`: the named accounting object, as iptables-translate
            // writes it (`counter name NAME`).
            "--nfacct-name" => {
                let a = arg!(w);
                if neg {
                    cx.err(w, "'!' cannot negate --nfacct-name");
                    ok = false;
                } else if a.text.is_empty() || a.text.len() > 31 {
                    cx.err(
                        &a,
                        format!(
                            "invalid accounting object name '{}' (1 to 31 characters)",
                            a.text
                        ),
                    );
                    ok = false;
                } else {
                    r.stmts.push(Stmt {
                        kind: StmtKind::ObjRef {
                            kind: ObjKind::Counter,
                            name: a.text.clone(),
                        },
                        span: wsp,
                    });
                }
            }
            // `-m time` (xt_time).
            "--datestart" | "--datestop" | "--timestart" | "--timestop" | "--contiguous" if neg => {
                if w.text != "--contiguous" {
                    let _ = arg!(w);
                }
                cx.err(w, format!("'!' cannot negate {} (only --weekdays)", w.text));
                ok = false;
            }
            "--datestart" | "--datestop" | "--timestart" | "--timestop" | "--weekdays"
            | "--contiguous"
                if xt_times.is_empty() =>
            {
                if w.text != "--contiguous" {
                    let _ = arg!(w);
                }
                cx.err(w, format!("{} needs -m time before it", w.text));
                ok = false;
            }
            "--datestart" | "--datestop" => {
                let a = arg!(w);
                match (xt_date(&a.text), xt_times.last_mut()) {
                    (Some(s), Some(t)) if w.text == "--datestart" => t.date_start = Some(s),
                    (Some(s), Some(t)) => t.date_stop = Some(s),
                    (Some(_), None) => {}
                    (None, _) => {
                        cx.err(
                            &a,
                            format!(
                                "invalid date '{}' (YYYY[-MM[-DD[Thh[:mm[:ss]]]]], 1970 to 2038-01-19T03:14:07)",
                                a.text
                            ),
                        );
                        ok = false;
                    }
                }
            }
            "--timestart" | "--timestop" => {
                let a = arg!(w);
                match (crate::timefmt::parse_hour(&a.text), xt_times.last_mut()) {
                    (Some(s), Some(t)) if w.text == "--timestart" => t.start = Some(s),
                    (Some(s), Some(t)) => t.stop = Some(s),
                    (Some(_), None) => {}
                    (None, _) => {
                        cx.err(&a, format!("invalid time of day '{}' (hh:mm[:ss])", a.text));
                        ok = false;
                    }
                }
            }
            "--weekdays" => {
                let a = arg!(w);
                match (xt_weekdays(&a.text), xt_times.last_mut()) {
                    // `!` inverts the days, as libxt_time does.
                    (Some(m), Some(t)) => t.weekdays = Some(if neg { !m & 0xfe } else { m }),
                    (Some(_), None) => {}
                    (None, _) => {
                        cx.err(
                            &a,
                            format!(
                                "invalid weekdays '{}' (Mon,Tue,Wed,Thu,Fri,Sat,Sun or 1-7)",
                                a.text
                            ),
                        );
                        ok = false;
                    }
                }
            }
            "--monthdays" => {
                let _ = arg!(w);
                cx.err(
                    w,
                    "--monthdays is not supported: nft has no day-of-month match (use \
                     --datestart/--datestop for dates)",
                );
                ok = false;
            }
            "--contiguous" => {
                if let Some(t) = xt_times.last_mut() {
                    t.contiguous = true;
                }
            }
            "--kerneltz" | "--localtz" => {
                cx.err(
                    w,
                    format!(
                        "{} is not supported: Sluice compares times in UTC (--utc, the default)",
                        w.text
                    ),
                );
                ok = false;
            }
            "--utc" => {}
            "--connlimit-saddr" => connlimit_daddr = false,
            "--connlimit-daddr" => connlimit_daddr = true,
            "--connlimit-mask" => {
                let a = arg!(w);
                let whole = if cx.v6 { "128" } else { "32" };
                if a.text != whole {
                    cx.err(
                        &a,
                        format!(
                            "--connlimit-mask {} is not supported: a dynamic set's key is the \
                             whole address (--connlimit-mask {whole})",
                            a.text
                        ),
                    );
                    ok = false;
                }
            }
            "--hashlimit-name" => {
                let a = arg!(w);
                let valid = !a.text.is_empty()
                    && a.text
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
                    && a.text.starts_with(|c: char| c.is_ascii_alphabetic());
                if valid {
                    hl.name = Some((a.text.clone(), cx.span(&a)));
                } else {
                    cx.err(
                        &a,
                        format!(
                            "hashlimit name '{}' is not a valid set name (letters, digits, _ - .)",
                            a.text
                        ),
                    );
                    ok = false;
                }
            }
            "--limit" => {
                let a = arg!(w);
                limit_span = wsp;
                match parse_limit(&a.text) {
                    Some((rate, per)) => {
                        let burst = limit.and_then(|l| l.burst);
                        limit = Some(Limit {
                            over: false,
                            rate,
                            unit: None,
                            per,
                            burst,
                            burst_unit: None,
                        });
                    }
                    None => {
                        cx.err(
                            &a,
                            format!(
                                "invalid rate '{}', expected N/second|minute|hour|day",
                                a.text
                            ),
                        );
                        ok = false;
                    }
                }
            }
            "--limit-burst" => {
                let a = arg!(w);
                match parse_num(&a.text) {
                    Some(n) => {
                        let mut l = limit.unwrap_or(Limit {
                            over: false,
                            rate: 3,
                            unit: None,
                            per: TimeUnit::Hour,
                            burst: None,
                            burst_unit: None,
                        });
                        l.burst = Some(n);
                        limit = Some(l);
                    }
                    None => {
                        cx.err(&a, "invalid burst");
                        ok = false;
                    }
                }
            }
            "-c" | "--set-counters" => {
                let p = arg!(w);
                let b = arg!(w);
                match (p.text.parse(), b.text.parse()) {
                    (Ok(p), Ok(b)) => counters = Some((p, b)),
                    _ => {
                        cx.err(&p, "invalid counters");
                        ok = false;
                    }
                }
            }
            "-j" | "--jump" | "-g" | "--goto" => {
                let a = arg!(w);
                target = Some((a, w.text.starts_with("-g") || w.text == "--goto"));
            }
            "--reject-with" | "--log-prefix" | "--log-level" | "--set-mark" | "--set-xmark"
            | "--and-mark" | "--or-mark" | "--xor-mark" | "--nflog-group" | "--nflog-prefix"
            | "--nflog-range" | "--nflog-size" | "--nflog-threshold" | "--set-mss"
            | "--to-source" | "--to-destination" | "--to-ports" | "--to" | "--zone"
            | "--zone-orig" | "--zone-reply" | "--helper" | "--ctevents" | "--expevents"
            | "--timeout" => {
                let a = arg!(w);
                topts.push((w.clone(), Some(a)));
            }
            "--random"
            | "--random-fully"
            | "--persistent"
            | "--clamp-mss-to-pmtu"
            | "--save-mark"
            | "--restore-mark"
            | "--notrack" => topts.push((w.clone(), None)),
            _ if skip_unknown && w.text.starts_with("--") => {
                // An option of a module already refused.
                while words
                    .get(i + 1)
                    .is_some_and(|a| !a.text.starts_with('-') && a.text != "!")
                {
                    i += 1;
                }
            }
            other => {
                let norm: String = other.replace(['\u{2013}', '\u{2014}'], "-");
                let help = if OPTIONS.contains(&norm.as_str()) {
                    Some(format!(
                        "did you mean \"{norm}\"? (a typographic dash was used)"
                    ))
                } else {
                    suggest(&norm, OPTIONS.iter().copied())
                };
                cx.err_help(w, format!("unknown option '{other}'"), help);
                ok = false;
                // Skip the option's arguments so they are not reported as options too.
                while words
                    .get(i + 1)
                    .is_some_and(|a| !a.text.starts_with('-') && a.text != "!")
                {
                    i += 1;
                }
            }
        }
        neg = false;
        i += 1;
    }
    if let Some((p, pneg, at, psp, rsp)) = proto {
        if !used_l4 || pneg {
            let op = if pneg { RelOp::Ne } else { RelOp::Implicit };
            // ip6tables' -p is the upper-layer protocol, past extension
            // headers: nft's `meta l4proto` (what ip6tables-translate writes).
            let m = Match {
                left: if cx.v6 {
                    Field::MetaL4proto
                } else {
                    Field::IpProtocol
                }
                .into(),
                mask: None,
                op,
                right: Value::Num(p),
                span: psp,
                right_span: rsp,
            };
            r.matches.insert(at.min(r.matches.len()), m);
        }
    }
    if let Some(l) = limit {
        r.stmts.push(Stmt {
            kind: StmtKind::Limit(l),
            span: limit_span,
        });
    }
    // (An option already refused says enough.)
    if let (Some(hsp), true) = (hl.span.or(hl.name.as_ref().map(|n| n.1)), ok) {
        match hashlimit(&hl, proto.map(|p| p.0), cx.v6, sets, hsp) {
            Ok(st) => r.stmts.push(st),
            Err(e) => {
                cx.diags.push(RawDiag::new(hsp, e));
                ok = false;
            }
        }
    }
    if let (Some((random, msp)), true) = (stat.mode, ok) {
        match statistic(&stat, random, msp) {
            Ok(st) => r.stmts.push(st),
            Err(e) => {
                cx.diags.push(RawDiag::new(msp, e));
                ok = false;
            }
        }
    }
    for t in &xt_times {
        if !ok {
            break;
        }
        let tsp = t.span.unwrap_or(span);
        match xt_time_matches(t, tsp) {
            Ok(ms) => r.matches.extend(ms),
            Err(e) => {
                cx.diags.push(RawDiag::new(tsp, e));
                ok = false;
            }
        }
    }
    if let (Some((over, count, csp)), true) = (connlimit, ok) {
        r.stmts.push(connlimit_stmt(
            over,
            count,
            connlimit_daddr,
            cx.v6,
            sets,
            csp,
        ));
    }
    if let Some((p, b)) = counters {
        r.stmts.push(Stmt {
            kind: StmtKind::Counter {
                packets: Some(p),
                bytes: Some(b),
            },
            span,
        });
    }
    match target {
        Some((t, goto)) => ok &= lower_target(cx, table, &t, goto, &topts, &mut r),
        None => {
            if let Some((w, _)) = topts.first() {
                cx.err(w, format!("option {} requires a target (-j)", w.text));
                ok = false;
            }
        }
    }
    ok.then_some(r)
}

fn tcp_flags(s: &str) -> Option<u64> {
    let mut bits = 0;
    for f in s.split(',') {
        bits |= match f.to_ascii_uppercase().as_str() {
            "ALL" => 0x3f,
            "NONE" => 0,
            x => symbols::lookup(DataType::TcpFlag, &x.to_ascii_lowercase())?,
        };
    }
    Some(bits)
}

fn parse_limit(s: &str) -> Option<(u64, TimeUnit)> {
    let (n, u) = s.split_once('/').unwrap_or((s, "second"));
    let per = match u {
        "s" | "sec" | "second" => TimeUnit::Second,
        "m" | "min" | "minute" => TimeUnit::Minute,
        "h" | "hour" => TimeUnit::Hour,
        "d" | "day" => TimeUnit::Day,
        _ => return None,
    };
    Some((n.parse().ok()?, per))
}

/// The source (`src`) or destination address field of the family.
fn addr_field(v6: bool, src: bool) -> Field {
    match (v6, src) {
        (false, true) => Field::IpSaddr,
        (false, false) => Field::IpDaddr,
        (true, true) => Field::Ip6Saddr,
        (true, false) => Field::Ip6Daddr,
    }
}

/// ip6tables' ICMPv6 names (libxt_icmp6): type, and code when the name
/// stands for one.
const IP6T_ICMPV6: &[(&str, &str, Option<&str>)] = &[
    ("destination-unreachable", "1", None),
    ("no-route", "1", Some("0")),
    ("communication-prohibited", "1", Some("1")),
    ("beyond-scope", "1", Some("2")),
    ("address-unreachable", "1", Some("3")),
    ("port-unreachable", "1", Some("4")),
    ("failed-policy", "1", Some("5")),
    ("reject-route", "1", Some("6")),
    ("packet-too-big", "2", None),
    ("time-exceeded", "3", None),
    ("ttl-exceeded", "3", None),
    ("ttl-zero-during-transit", "3", Some("0")),
    ("ttl-zero-during-reassembly", "3", Some("1")),
    ("parameter-problem", "4", None),
    ("bad-header", "4", Some("0")),
    ("unknown-header-type", "4", Some("1")),
    ("unknown-option", "4", Some("2")),
    ("echo-request", "128", None),
    ("ping", "128", None),
    ("echo-reply", "129", None),
    ("pong", "129", None),
    ("router-solicitation", "133", None),
    ("router-advertisement", "134", None),
    ("neighbour-solicitation", "135", None),
    ("neighbor-solicitation", "135", None),
    ("neighbour-advertisement", "136", None),
    ("neighbor-advertisement", "136", None),
    ("redirect", "137", None),
];

/// What `-m hashlimit` options a rule gave.
#[derive(Default)]
struct HashLimit {
    /// (above, rate, byte unit, per).
    rate: Option<(bool, u64, Option<ByteUnit>, TimeUnit)>,
    burst: Option<u64>,
    mode: Vec<String>,
    name: Option<(String, Span)>,
    expire_ms: Option<u64>,
    max: Option<u32>,
    span: Option<Span>,
}

/// `N[/unit]` or `N{b,kb,mb}/unit` (a byte rate).
fn parse_rate(s: &str) -> Option<(u64, Option<ByteUnit>, TimeUnit)> {
    let (n, per) = s.split_once('/').unwrap_or((s, "second"));
    let (n, unit) = if let Some(n) = n.strip_suffix("mb") {
        (n, Some(ByteUnit::Mbytes))
    } else if let Some(n) = n.strip_suffix("kb") {
        (n, Some(ByteUnit::Kbytes))
    } else if let Some(n) = n.strip_suffix('b') {
        (n, Some(ByteUnit::Bytes))
    } else {
        (n, None)
    };
    let (rate, per) = parse_limit(&format!("{n}/{per}"))?;
    (rate > 0).then_some((rate, unit, per))
}

/// `-m hashlimit` as iptables-translate writes it: a limit per key in a
/// dynamic set named after `--hashlimit-name`, whose elements expire
/// `--hashlimit-htable-expire` ms (default 10 s) after their last packet:
/// `update @NAME { ip saddr limit rate over 10/minute burst 5 packets }`.
/// Without `--hashlimit-mode` every packet shares one bucket, a plain
/// `limit`.
fn hashlimit(
    hl: &HashLimit,
    proto: Option<u64>,
    v6: bool,
    sets: &mut Vec<Set>,
    span: Span,
) -> Result<Stmt, String> {
    let Some((over, rate, unit, per)) = hl.rate else {
        return Err("-m hashlimit needs --hashlimit-upto or --hashlimit-above".into());
    };
    let limit = Limit {
        over,
        rate,
        unit,
        per,
        burst: Some(hl.burst.unwrap_or(if unit.is_some() { 0 } else { 5 })),
        burst_unit: unit.map(|_| ByteUnit::Bytes),
    };
    if hl.mode.is_empty() {
        return Ok(Stmt {
            kind: StmtKind::Limit(limit),
            span,
        });
    }
    let Some((name, _)) = &hl.name else {
        return Err("-m hashlimit needs --hashlimit-name".into());
    };
    let mut key = Vec::with_capacity(hl.mode.len());
    for m in &hl.mode {
        key.push(match (m.as_str(), proto) {
            ("srcip", _) => addr_field(v6, true),
            ("dstip", _) => addr_field(v6, false),
            ("srcport", Some(6)) => Field::TcpSport,
            ("dstport", Some(6)) => Field::TcpDport,
            ("srcport", Some(17)) => Field::UdpSport,
            ("dstport", Some(17)) => Field::UdpDport,
            (m, _) => return Err(format!("--hashlimit-mode {m} requires -p tcp or -p udp")),
        });
    }
    let timeout = hl.expire_ms.unwrap_or(10_000);
    match sets.iter_mut().find(|s| &s.name == name) {
        Some(s) => {
            if s.key_typeof.as_deref() != Some(key.as_slice()) {
                return Err(format!(
                    "hashlimit '{name}' is used with another --hashlimit-mode in an earlier rule"
                ));
            }
        }
        None => sets.push(Set {
            name: name.clone(),
            key: key.iter().map(|f| f.datatype()).collect(),
            key_typeof: Some(key.clone()),
            flags: vec![SetFlag::Dynamic, SetFlag::Timeout],
            timeout_ms: Some(timeout),
            size: hl.max,
            elements: Vec::new(),
            comment: None,
            span,
        }),
    }
    Ok(Stmt {
        kind: StmtKind::SetUpdate(Box::new(SetUpdate {
            op: SetOp::Update,
            set: name.clone(),
            key: key.into_iter().map(KeyPart::Field).collect(),
            timeout_ms: None,
            limit: Some(limit),
            counter: false,
            ct_count: None,
            quota: None,
        })),
        span,
    })
}

/// What `-m time` options a rule gave (times of day in seconds since
/// midnight, dates in seconds since the epoch, weekdays as xt_time's mask:
/// bit 1 Monday to bit 7 Sunday).
#[derive(Default)]
struct XtTime {
    span: Option<Span>,
    date_start: Option<u64>,
    date_stop: Option<u64>,
    start: Option<u64>,
    stop: Option<u64>,
    weekdays: Option<u8>,
    contiguous: bool,
}

/// xt_time's dates: `YYYY[-MM[-DD[Thh[:mm[:ss]]]]]`, the parts left out
/// being the first month, day, and midnight; at most 2038-01-19T03:14:07,
/// as iptables takes them (its parser refuses later dates).
fn xt_date(s: &str) -> Option<u64> {
    let (date, time) = match s.split_once('T') {
        Some((d, t)) => (d, Some(t)),
        None => (s, None),
    };
    let mut parts = date.split('-');
    let y = parts.next()?;
    let m = parts.next().unwrap_or("01");
    let d = parts.next().unwrap_or("01");
    if parts.next().is_some() {
        return None;
    }
    let time = match time {
        Some(t) if t.matches(':').count() == 0 => format!("{t}:00"),
        Some(t) => t.to_string(),
        None => "00:00".to_string(),
    };
    crate::timefmt::parse_date_time(&format!("{y}-{m}-{d} {time}"))
        .filter(|s| *s <= i32::MAX as u64)
}

/// xt_time's `--weekdays`: names (`Mon` ... `Sun`, or whole) or numbers
/// 1 (Monday) to 7, comma separated, as a mask (bit 1 Monday).
fn xt_weekdays(s: &str) -> Option<u8> {
    const NAMES: [&str; 7] = ["mon", "tue", "wed", "thu", "fri", "sat", "sun"];
    let mut mask = 0u8;
    for d in s.split(',') {
        let lower = d.to_ascii_lowercase();
        let i = match lower.parse::<u8>() {
            Ok(n @ 1..=7) => n,
            Ok(_) => return None,
            Err(_) => {
                let full = crate::timefmt::parse_day(d).map(|n| if n == 0 { 7 } else { n as u8 });
                match NAMES.iter().position(|n| *n == lower) {
                    Some(i) => i as u8 + 1,
                    None => full?,
                }
            }
        };
        mask |= 1 << i;
    }
    (mask != 0).then_some(mask)
}

/// `-m time` as nft's `meta time`, `meta hour` and `meta day`, exactly as
/// the kernel's `xt_time` decides it (UTC):
///
/// * dates: the second is between `--datestart` and `--datestop`,
///   inclusive: `meta time >= START meta time < STOP+1s` (each only when
///   given);
/// * times of day: `--timestart` before `--timestop` is the range between
///   them, inclusive; a start after the stop wraps midnight (the time is at
///   or after the start, or at or before the stop), which is the day
///   outside `STOP+1s`-`START-1s`; equal ones, like the defaults
///   00:00:00-23:59:59, match the whole day and add nothing;
/// * `--weekdays`: the day of the packet's time. With `--contiguous`, a
///   time after midnight of a wrapped range counts as the day before, which
///   nft cannot say: refused together with a day list.
fn xt_time_matches(t: &XtTime, span: Span) -> Result<Vec<Match>, String> {
    let m = |op: RelOp, field: Field, right: Value| Match {
        left: field.into(),
        mask: None,
        op,
        right,
        span,
        right_span: span,
    };
    let range = |a: u64, b: u64| Value::Range(Box::new(Value::Num(a)), Box::new(Value::Num(b)));
    const NS: u64 = 1_000_000_000;
    let mut out = Vec::new();
    let (start, stop) = (
        t.start.unwrap_or(0),
        t.stop.unwrap_or(crate::timefmt::DAY_SECS - 1),
    );
    let wraps = start > stop;
    let days = t.weekdays.unwrap_or(0xfe);
    if t.contiguous && wraps && days != 0xfe {
        return Err(
            "--contiguous with --weekdays is not supported: after midnight it counts the day \
             before, which nft's meta day cannot say"
                .into(),
        );
    }
    if t.contiguous && !wraps && start != stop {
        return Err("--contiguous needs --timestart after --timestop (as iptables says)".into());
    }
    if let (Some(a), Some(b)) = (t.date_start, t.date_stop) {
        if a > b {
            return Err("--datestart is after --datestop: the rule would never match".into());
        }
    }
    if let Some(a) = t.date_start.filter(|a| *a > 0) {
        out.push(m(RelOp::Ge, Field::MetaTime, Value::Num(a * NS)));
    }
    if let Some(b) = t.date_stop {
        out.push(m(RelOp::Lt, Field::MetaTime, Value::Num((b + 1) * NS)));
    }
    if start < stop && (start, stop) != (0, crate::timefmt::DAY_SECS - 1) {
        out.push(m(RelOp::Implicit, Field::MetaHour, range(start, stop)));
    } else if wraps && start - stop >= 2 {
        out.push(m(RelOp::Ne, Field::MetaHour, range(stop + 1, start - 1)));
    }
    if days != 0xfe {
        // xt's bit 7 is Sunday, nft's day 0.
        let set: Vec<u64> = (1..=7u64)
            .filter(|d| days & (1 << d) != 0)
            .map(|d| d % 7)
            .collect();
        let right = match set.as_slice() {
            [d] => Value::Num(*d),
            _ => Value::Set(
                set.iter()
                    .map(|d| Elem {
                        key: Value::Num(*d),
                        data: None,
                        span,
                        opts: None,
                    })
                    .collect(),
            ),
        };
        out.push(m(RelOp::Implicit, Field::MetaDay, right));
    }
    Ok(out)
}

/// What `-m statistic` options a rule gave.
#[derive(Default)]
struct Statistic {
    /// (random, span of the mode).
    mode: Option<(bool, Span)>,
    /// `--probability`, as xt_statistic's 31-bit threshold.
    probability: Option<u64>,
    every: Option<u32>,
    packet: Option<u32>,
    negate: bool,
}

/// `-m statistic` as the kernel's `xt_statistic` decides it, in nft's
/// `numgen`, as iptables-translate writes it: `--mode random --probability
/// P` matches when a 31-bit random number is below `P * 2^31`, which is
/// `numgen random mod 2147483648 < T`; `--mode nth --every N --packet P`
/// matches packets P+1, P+1+N, ... (iptables starts the module's counter
/// at `N - 1 - P`), which is `numgen inc mod N P` (the first number is 0).
/// The kernel oracle's `statistic.rules` checks both against the module.
fn statistic(st: &Statistic, random: bool, span: Span) -> Result<Stmt, String> {
    let (modulus, op, value) = if random {
        let Some(t) = st.probability else {
            return Err("--mode random needs --probability".into());
        };
        let op = if st.negate { RelOp::Ge } else { RelOp::Lt };
        (1u32 << 31, op, t)
    } else {
        let (Some(n), Some(p)) = (st.every, st.packet) else {
            return Err("--mode nth needs --every and --packet (as iptables does)".into());
        };
        if p >= n {
            return Err(format!("--packet {p} must be less than --every {n}"));
        }
        let op = if st.negate {
            RelOp::Ne
        } else {
            RelOp::Implicit
        };
        (n, op, u64::from(p))
    };
    Ok(Stmt {
        kind: StmtKind::Numgen(Box::new(Numgen {
            random,
            modulus,
            offset: 0,
            m: Match {
                left: Field::Numgen.into(),
                mask: None,
                op,
                right: Value::Num(value),
                span,
                right_span: span,
            },
        })),
        span,
    })
}

/// `-m connlimit` as iptables-translate writes it: a dynamic set of its
/// own per rule (`connlimit0`, `connlimit1`, ... in the table), and `add
/// @connlimitN { ip saddr ct count over N }`.
fn connlimit_stmt(
    over: bool,
    count: u32,
    daddr: bool,
    v6: bool,
    sets: &mut Vec<Set>,
    span: Span,
) -> Stmt {
    let field = addr_field(v6, !daddr);
    let name = (0..)
        .map(|i| format!("connlimit{i}"))
        .find(|n| sets.iter().all(|s| &s.name != n))
        .unwrap_or_default();
    sets.push(Set {
        name: name.clone(),
        key: vec![field.datatype()],
        key_typeof: Some(vec![field]),
        flags: vec![SetFlag::Dynamic],
        timeout_ms: None,
        size: None,
        elements: Vec::new(),
        comment: None,
        span,
    });
    Stmt {
        kind: StmtKind::SetUpdate(Box::new(SetUpdate {
            op: SetOp::Add,
            set: name,
            key: vec![KeyPart::Field(field)],
            timeout_ms: None,
            limit: None,
            counter: false,
            quota: None,
            ct_count: Some(CtCount {
                count,
                over,
                existing: true,
            }),
        })),
        span,
    }
}

fn match_set(
    cx: &mut Ctx<'_>,
    table: &str,
    sets: &mut Vec<Set>,
    name: &Word,
    flags: &Word,
) -> Option<Vec<Field>> {
    let Some(ipset) = cx.sets.iter().find(|s| s.name == name.text) else {
        let help = suggest(&name.text, cx.sets.iter().map(|s| s.name.as_str()));
        let msg = if cx.sets.is_empty() {
            format!("unknown ipset '{}' (no ipset file given)", name.text)
        } else {
            format!("unknown ipset '{}'", name.text)
        };
        cx.err_help(name, msg, help);
        return None;
    };
    let dirs: Vec<&str> = flags.text.split(',').collect();
    let mut left = Vec::new();
    let mut key = Vec::new();
    for (n, d) in ipset.dims.iter().enumerate() {
        let src = match dirs.get(n) {
            Some(&"src") => true,
            Some(&"dst") => false,
            _ => {
                cx.err(
                    flags,
                    format!(
                        "ipset '{}' needs {} src/dst flags",
                        ipset.name,
                        ipset.dims.len()
                    ),
                );
                return None;
            }
        };
        match d {
            Dim::Ip | Dim::Net => {
                left.push(addr_field(ipset.v6, src));
                key.push(if ipset.v6 {
                    DataType::Ipv6Addr
                } else {
                    DataType::Ipv4Addr
                });
            }
            Dim::Port => {
                left.push(Field::MetaL4proto);
                left.push(if src { Field::ThSport } else { Field::ThDport });
                key.push(DataType::InetProto);
                key.push(DataType::InetService);
            }
            Dim::Mark => {
                left.push(Field::MetaMark);
                key.push(DataType::Mark);
            }
            Dim::Iface => {
                left.push(if src { Field::Iifname } else { Field::Oifname });
                key.push(DataType::Ifname);
            }
        }
    }
    if !sets.iter().any(|s| s.name == ipset.name) {
        let interval =
            ipset.dims.contains(&Dim::Net) || ipset.elems.iter().any(|e| has_interval(&e.key));
        sets.push(Set {
            name: ipset.name.clone(),
            key,
            key_typeof: None,
            flags: if interval {
                vec![SetFlag::Interval]
            } else {
                Vec::new()
            },
            timeout_ms: None,
            size: None,
            elements: ipset.elems.clone(),
            comment: None,
            span: cx.span(name),
        });
    }
    let _ = table;
    Some(left)
}

fn has_interval(v: &Value) -> bool {
    match v {
        Value::Prefix { .. } | Value::Range(..) => true,
        Value::Concat(vs) => vs.iter().any(has_interval),
        _ => false,
    }
}

fn lower_target(
    cx: &mut Ctx<'_>,
    table: &str,
    t: &Word,
    goto: bool,
    opts: &[(Word, Option<Word>)],
    r: &mut Rule,
) -> bool {
    let span = cx.span(t);
    let opt = |name: &str| {
        opts.iter()
            .find(|(w, _)| w.text == name)
            .and_then(|(_, a)| a.clone())
    };
    let has = |name: &str| opts.iter().any(|(w, _)| w.text == name);
    // Every target option given must be one of this target's: anything
    // else would be dropped without a word.
    let own: Option<&[&str]> = match t.text.as_str() {
        "ACCEPT" | "DROP" | "RETURN" | "NOTRACK" => Some(&[]),
        "REJECT" => Some(&["--reject-with"]),
        "LOG" => Some(&["--log-prefix", "--log-level"]),
        "NFLOG" => Some(&[
            "--nflog-group",
            "--nflog-prefix",
            "--nflog-range",
            "--nflog-size",
            "--nflog-threshold",
        ]),
        "MARK" => Some(&[
            "--set-mark",
            "--set-xmark",
            "--and-mark",
            "--or-mark",
            "--xor-mark",
        ]),
        "CONNMARK" => Some(&[
            "--set-mark",
            "--set-xmark",
            "--and-mark",
            "--or-mark",
            "--xor-mark",
            "--save-mark",
            "--restore-mark",
        ]),
        "TCPMSS" => Some(&["--set-mss", "--clamp-mss-to-pmtu"]),
        "CT" => Some(&[
            "--notrack",
            "--zone",
            "--zone-orig",
            "--zone-reply",
            "--helper",
            "--ctevents",
            "--expevents",
            "--timeout",
        ]),
        "SNAT" => Some(&[
            "--to-source",
            "--to",
            "--random",
            "--random-fully",
            "--persistent",
        ]),
        "DNAT" => Some(&["--to-destination", "--to", "--random", "--persistent"]),
        "MASQUERADE" => Some(&["--to-ports", "--random", "--random-fully"]),
        "REDIRECT" => Some(&["--to-ports", "--random"]),
        // A user chain takes none; an unknown built-in target is refused
        // below.
        c if !c.chars().all(|c| c.is_ascii_uppercase()) => Some(&[]),
        _ => None,
    };
    if let Some(own) = own {
        let mut bad = false;
        for (w, _) in opts.iter().filter(|(w, _)| !own.contains(&w.text.as_str())) {
            cx.err(
                w,
                format!("option '{}' does not belong to target {}", w.text, t.text),
            );
            bad = true;
        }
        if bad {
            return false;
        }
    }
    let mut push = |k: StmtKind| r.stmts.push(Stmt { kind: k, span });
    let kind = match t.text.as_str() {
        "ACCEPT" => StmtKind::Verdict(Verdict::Accept),
        "DROP" => StmtKind::Verdict(Verdict::Drop),
        "RETURN" => StmtKind::Verdict(Verdict::Return),
        "REJECT" => match opt("--reject-with") {
            None => StmtKind::Reject(None),
            Some(w) if cx.v6 => {
                // ip6t_REJECT's names, with and without the icmp6- prefix.
                let code = match w.text.as_str() {
                    "tcp-reset" => Some(RejectWith::TcpReset),
                    "icmp6-no-route" | "no-route" => Some(RejectWith::Icmpv6(0)),
                    "icmp6-adm-prohibited" | "adm-prohibited" => Some(RejectWith::Icmpv6(1)),
                    "icmp6-addr-unreachable" | "addr-unreach" => Some(RejectWith::Icmpv6(3)),
                    "icmp6-port-unreachable" | "port-unreach" => Some(RejectWith::Icmpv6(4)),
                    _ => None,
                };
                match code {
                    Some(c) => StmtKind::Reject(Some(c)),
                    None => {
                        let names = [
                            "icmp6-no-route",
                            "icmp6-adm-prohibited",
                            "icmp6-addr-unreachable",
                            "icmp6-port-unreachable",
                            "tcp-reset",
                        ];
                        let help = suggest(&w.text, names);
                        cx.err_help(
                            &w,
                            format!("invalid ip6tables --reject-with '{}'", w.text),
                            help,
                        );
                        return false;
                    }
                }
            }
            Some(w) => {
                let code = match w.text.as_str() {
                    "tcp-reset" => Some(RejectWith::TcpReset),
                    x => x
                        .strip_prefix("icmp-")
                        .and_then(|n| {
                            let n = if n == "proto-unreachable" {
                                "prot-unreachable"
                            } else {
                                n
                            };
                            symbols::code_lookup(symbols::ICMP_REJECT, n)
                        })
                        .map(RejectWith::Icmp),
                };
                match code {
                    Some(c) => StmtKind::Reject(Some(c)),
                    None => {
                        let names: Vec<String> = symbols::ICMP_REJECT
                            .iter()
                            .map(|(n, _)| format!("icmp-{n}"))
                            .chain(std::iter::once("tcp-reset".to_string()))
                            .collect();
                        let help = suggest(&w.text, names.iter().map(String::as_str));
                        cx.err_help(&w, format!("invalid --reject-with '{}'", w.text), help);
                        return false;
                    }
                }
            }
        },
        // xt_NFLOG: a log line to netlink group N; Sluice writes it as it
        // writes LOG's (the group is kept and printed).
        "NFLOG" => {
            let group = match opt("--nflog-group") {
                None => 0,
                Some(w) => match parse_num(&w.text).and_then(|n| u16::try_from(n).ok()) {
                    Some(g) => g,
                    None => {
                        cx.err(&w, format!("invalid --nflog-group '{}' (0-65535)", w.text));
                        return false;
                    }
                },
            };
            StmtKind::Log(Log {
                prefix: opt("--nflog-prefix").map(|w| w.text),
                level: None,
                group: Some(group),
                flags: 0,
            })
        }
        "LOG" => {
            let level = match opt("--log-level") {
                None => None,
                Some(w) => {
                    let lv = match w.text.as_str() {
                        "0" | "emerg" => Some(LogLevel::Emerg),
                        "1" | "alert" => Some(LogLevel::Alert),
                        "2" | "crit" => Some(LogLevel::Crit),
                        "3" | "err" | "error" => Some(LogLevel::Err),
                        "4" | "warn" | "warning" => Some(LogLevel::Warn),
                        "5" | "notice" => Some(LogLevel::Notice),
                        "6" | "info" => Some(LogLevel::Info),
                        "7" | "debug" => Some(LogLevel::Debug),
                        _ => None,
                    };
                    if lv.is_none() {
                        cx.err(&w, format!("invalid log level '{}'", w.text));
                        return false;
                    }
                    lv
                }
            };
            StmtKind::Log(Log {
                prefix: opt("--log-prefix").map(|w| w.text),
                level,
                group: None,
                flags: 0,
            })
        }
        // xt_MARK and xt_CONNMARK's mark changes: `--set-xmark V/M` is
        // (mark & ~M) ^ V, `--set-mark V/M` (mark & ~M) | V, `--and-mark`,
        // `--or-mark`, `--xor-mark`; a full mask is a plain set.
        "MARK" | "CONNMARK"
            if [
                "--set-mark",
                "--set-xmark",
                "--and-mark",
                "--or-mark",
                "--xor-mark",
            ]
            .iter()
            .any(|o| has(o)) =>
        {
            let ct = t.text == "CONNMARK";
            let ops: Vec<Word> = [
                "--set-mark",
                "--set-xmark",
                "--and-mark",
                "--or-mark",
                "--xor-mark",
            ]
            .iter()
            .filter_map(|o| {
                opt(o).map(|w| Word {
                    text: format!("{o} {}", w.text),
                    ..w
                })
            })
            .collect();
            if ops.len() != 1 || (ct && (has("--save-mark") || has("--restore-mark"))) {
                cx.err(
                    t,
                    format!(
                        "{} needs exactly one of --set-mark, --set-xmark, --and-mark, \
                         --or-mark, --xor-mark{}",
                        t.text,
                        if ct {
                            ", --save-mark and --restore-mark"
                        } else {
                            ""
                        }
                    ),
                );
                return false;
            }
            let w = &ops[0];
            let (o, arg) = w.text.split_once(' ').unwrap_or((&w.text, ""));
            let (v, m) = match arg.split_once('/') {
                Some((v, m)) => (parse_num(v), parse_num(m)),
                None => (parse_num(arg), Some(0xffff_ffff)),
            };
            let (Some(v), Some(m)) = (
                v.and_then(|v| u32::try_from(v).ok()),
                m.and_then(|m| u32::try_from(m).ok()),
            ) else {
                cx.err(
                    w,
                    format!("invalid mark '{arg}' for {o} (VALUE[/MASK], 32-bit)"),
                );
                return false;
            };
            if matches!(o, "--and-mark" | "--or-mark" | "--xor-mark") && arg.contains('/') {
                cx.err(w, format!("{o} takes a value without a mask"));
                return false;
            }
            let (and, xor) = match o {
                "--set-xmark" => (!m, v),
                "--set-mark" => (!m & !v, v),
                "--and-mark" => (v, 0),
                "--or-mark" => (!v, v),
                _ => (u32::MAX, v),
            };
            match (ct, and) {
                (false, 0) => StmtKind::MetaMarkSet(xor),
                (true, 0) => StmtKind::CtMarkSet(xor),
                (false, _) => StmtKind::MetaMarkMod { and, xor },
                (true, _) => StmtKind::CtMarkMod { and, xor },
            }
        }
        "MARK" => {
            cx.err(
                t,
                "MARK needs --set-mark, --set-xmark, --and-mark, --or-mark or --xor-mark",
            );
            return false;
        }
        // xt_CONNMARK's copies, full-mask forms only.
        "CONNMARK" => match (has("--save-mark"), has("--restore-mark")) {
            (true, false) => StmtKind::CtMarkFromMeta,
            (false, true) => StmtKind::MetaMarkFromCt,
            _ => {
                cx.err(
                    t,
                    "CONNMARK needs exactly one of --set-mark, --save-mark and --restore-mark",
                );
                return false;
            }
        },
        // xt_CT's --notrack (iptables-translate: `notrack`) and the older
        // NOTRACK target; both are raw-table targets.
        "CT" | "NOTRACK" => {
            if table != "raw" {
                cx.err(t, format!("{} is only valid in the raw table", t.text));
                return false;
            }
            if let Some((w, _)) = opts.iter().find(|(w, _)| w.text == "--timeout") {
                cx.err(
                    w,
                    "CT --timeout names a timeout policy made outside the rules (nfct add \
                     timeout), which an iptables-restore file cannot carry; write the rule \
                     set in nft syntax with a 'ct timeout NAME { protocol udp; policy = { \
                     unreplied: 30, replied: 120 } }' object and 'ct timeout set \"NAME\"'",
                );
                return false;
            }
            const CT_OTHER: [(&str, &str); 7] = [
                ("--zone", "conntrack zones"),
                ("--zone-orig", "conntrack zones"),
                ("--zone-reply", "conntrack zones"),
                ("--helper", "conntrack helpers"),
                ("--timeout", "conntrack timeout policies"),
                ("--ctevents", "conntrack event masks"),
                ("--expevents", "conntrack event masks"),
            ];
            if let Some((w, what)) = CT_OTHER.iter().find_map(|(o, what)| {
                opts.iter()
                    .find(|(w, _)| w.text == *o)
                    .map(|(w, _)| (w, what))
            }) {
                cx.err(w, format!("CT {}: {what} are not implemented", w.text));
                return false;
            }
            if t.text == "CT" && !has("--notrack") {
                cx.err(
                    t,
                    "CT needs --notrack (conntrack zones, helpers, timeouts and event \
                     masks are not implemented)",
                );
                return false;
            }
            StmtKind::Notrack
        }
        // xt_TCPMSS; unlike it, Sluice never adds an MSS option to a SYN
        // that has none (nft's `tcp option maxseg size set` does not
        // either).
        "TCPMSS" => match (opt("--set-mss"), has("--clamp-mss-to-pmtu")) {
            (Some(w), false) => match parse_num(&w.text).and_then(|n| u16::try_from(n).ok()) {
                Some(n) => StmtKind::TcpMssSet(TcpMss::Value(n)),
                None => {
                    cx.err(
                        &w,
                        format!("invalid --set-mss '{}': expected 0-65535", w.text),
                    );
                    return false;
                }
            },
            (None, true) => StmtKind::TcpMssSet(TcpMss::RtMtu),
            _ => {
                cx.err(
                    t,
                    "TCPMSS needs exactly one of --set-mss N and --clamp-mss-to-pmtu",
                );
                return false;
            }
        },
        "SNAT" | "DNAT" | "MASQUERADE" | "REDIRECT" => {
            let kind = match t.text.as_str() {
                "SNAT" => NatKind::Snat,
                "DNAT" => NatKind::Dnat,
                "MASQUERADE" => NatKind::Masquerade,
                _ => NatKind::Redirect,
            };
            if table != "nat" {
                cx.err(t, format!("{} is only valid in the nat table", t.text));
                return false;
            }
            if cx.v6 {
                cx.err(
                    t,
                    format!(
                        "{}: Sluice does not translate IPv6 (no NAT66); IPv6 is forwarded \
                         and filtered only",
                        t.text
                    ),
                );
                return false;
            }
            let mut nat = Nat {
                kind,
                family: None,
                addr: None,
                ports: None,
                flags: Vec::new(),
            };
            let to = match kind {
                NatKind::Snat => opt("--to-source").or_else(|| opt("--to")),
                NatKind::Dnat => opt("--to-destination").or_else(|| opt("--to")),
                _ => opt("--to-ports"),
            };
            match (kind, to) {
                (NatKind::Snat | NatKind::Dnat, None) => {
                    cx.err(
                        t,
                        format!(
                            "{} needs --to-{}",
                            t.text,
                            if kind == NatKind::Snat {
                                "source"
                            } else {
                                "destination"
                            }
                        ),
                    );
                    return false;
                }
                (_, Some(w)) => {
                    let text = if matches!(kind, NatKind::Masquerade | NatKind::Redirect) {
                        format!(":{}", w.text)
                    } else {
                        w.text.clone()
                    };
                    match parse_nat_target(&text) {
                        Some((a, p)) => {
                            nat.addr = a;
                            nat.ports = p;
                        }
                        None => {
                            cx.err(&w, format!("invalid NAT target '{}'", w.text));
                            return false;
                        }
                    }
                }
                _ => {}
            }
            if has("--random") {
                nat.flags.push(NatFlag::Random);
            }
            if has("--random-fully") {
                nat.flags.push(NatFlag::FullyRandom);
            }
            if has("--persistent") {
                nat.flags.push(NatFlag::Persistent);
            }
            StmtKind::Nat(Box::new(nat))
        }
        chain => {
            if chain.chars().all(|c| c.is_ascii_uppercase()) && !opts.is_empty() {
                cx.err(t, format!("unsupported target '{chain}'"));
                return false;
            }
            let v = if goto {
                Verdict::Goto(chain.to_string())
            } else {
                Verdict::Jump(chain.to_string())
            };
            StmtKind::Verdict(v)
        }
    };
    push(kind);
    true
}
