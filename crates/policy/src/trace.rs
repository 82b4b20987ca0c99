//! `sluice trace`: why a packet gets its verdict.
//!
//! A trace follows the hooks a packet meets on its way (forward:
//! prerouting, forward, postrouting; input: prerouting, input; output:
//! output, postrouting; prerouting and postrouting alone), runs every base
//! chain with both the compiled classifier and the linear reference, and
//! reports the matched rules, the deciding rule, the verdict, the NAT action
//! and the final mark. A DNAT in prerouting/output rewrites the destination
//! seen by the later hooks, as in the kernel.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

use sluice_classify::ir::{
    ct, map_v4, ConnId, CtTuple, Family as IrFamily, IfName, PacketFields, RuleId,
};
use sluice_classify::{Outcome, Scratch};
use sluice_engine::CtState;
use sluice_nat::Translation;
use sluice_ruleset::{self as ast};

use crate::policy::{ct_bits, CompiledPolicy, Evaluator, HookVerdict, Stage};

/// A packet description that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct PacketError(pub String);

fn perr<T>(msg: impl Into<String>) -> Result<T, PacketError> {
    Err(PacketError(msg.into()))
}

/// A packet to trace. Missing fields are zero / absent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TracePacket {
    /// The hook whose path is followed (default forward).
    pub hook: ast::Hook,
    /// Input interface name.
    pub iif: Option<String>,
    /// Output interface name.
    pub oif: Option<String>,
    /// Layer-4 protocol number.
    pub proto: u8,
    /// Source address (default 0.0.0.0 / ::).
    pub src: Option<IpAddr>,
    /// Destination address.
    pub dst: Option<IpAddr>,
    /// Source port.
    pub sport: u16,
    /// Destination port.
    pub dport: u16,
    /// TCP flags byte.
    pub tcp_flags: u8,
    /// ICMP type.
    pub icmp_type: u8,
    /// ICMP code.
    pub icmp_code: u8,
    /// Conntrack state (default new).
    pub ct: CtState,
    /// Packet mark.
    pub mark: u32,
    /// Conntrack mark.
    pub ct_mark: u32,
    /// Conntrack status bits (`ct status`); `None` derives them from `ct`
    /// (established: seen-reply) and from NAT applied on the trace's path.
    pub ct_status: Option<u32>,
    /// IPv4 TTL or IPv6 hop limit (default 64).
    pub ttl: u8,
    /// IP total length, header included (`meta length`; `ip length`, and
    /// for IPv6 `ip6 length` is this less 40). `None`: the bare headers
    /// (IP and the protocol's minimal header).
    pub length: Option<u16>,
    /// DiffServ code point (default 0).
    pub dscp: u8,
    /// `meta pkttype`: 0 host (default), 1 broadcast, 2 multicast.
    pub pkttype: u8,
    /// `fib daddr type` (the kernel's `RTN_*`). `None`: from the address
    /// (broadcast, multicast, loopback) and the hook (`input`: local),
    /// else unicast; give it for a packet to one of the gateway's addresses
    /// that is then DNATed onward.
    pub daddr_type: Option<u8>,
    /// `fib saddr type`. `None`: from the address and the hook (`output`:
    /// local), else unicast.
    pub saddr_type: Option<u8>,
    /// The frame's source and destination MAC addresses (`ether saddr`,
    /// `ether daddr`; default 0).
    pub ether: (u64, u64),
    /// `ct direction`: 0 original (default), 1 reply.
    pub ct_dir: u8,
    /// Reverse path: a route back to the source through the input
    /// interface, any route back (`rpf` `ok` (default), `other-iif`,
    /// `none`).
    pub rpf: (bool, bool),
    /// When the packet is seen (`meta time`, `meta day`, `meta hour`),
    /// seconds since the epoch (UTC); `None`: now.
    pub wall_s: Option<u64>,
}

impl Default for TracePacket {
    fn default() -> Self {
        TracePacket {
            hook: ast::Hook::Forward,
            iif: None,
            oif: None,
            proto: 0,
            src: None,
            dst: None,
            sport: 0,
            dport: 0,
            tcp_flags: 0,
            icmp_type: 0,
            icmp_code: 0,
            ct: CtState::New,
            mark: 0,
            ct_mark: 0,
            ct_status: None,
            ttl: 64,
            length: None,
            dscp: 0,
            pkttype: 0,
            daddr_type: None,
            saddr_type: None,
            ether: (0, 0),
            ct_dir: 0,
            rpf: (true, true),
            wall_s: None,
        }
    }
}

/// Parses a packet's time: `YYYY-MM-DD`, `YYYY-MM-DD HH:MM[:SS]` (or with
/// a `T`), UTC, or seconds since the epoch.
pub fn parse_wall_time(s: &str) -> Result<u64, PacketError> {
    sluice_ruleset::timefmt::parse_date_time(s)
        .or_else(|| s.parse().ok())
        .map_or_else(
            || {
                perr(format!(
                    "invalid time '{s}': write YYYY-MM-DD[THH:MM[:SS]] (UTC) or seconds since 1970"
                ))
            },
            Ok,
        )
}

/// Parses a hook name.
pub fn parse_hook(s: &str) -> Result<ast::Hook, PacketError> {
    Ok(match s {
        "prerouting" => ast::Hook::Prerouting,
        "input" => ast::Hook::Input,
        "forward" => ast::Hook::Forward,
        "output" => ast::Hook::Output,
        "postrouting" => ast::Hook::Postrouting,
        _ => {
            return perr(format!(
                "unknown hook '{s}' (prerouting, input, forward, output, postrouting)"
            ))
        }
    })
}

/// Name of a hook.
pub fn hook_name(h: ast::Hook) -> &'static str {
    match h {
        ast::Hook::Prerouting => "prerouting",
        ast::Hook::Input => "input",
        ast::Hook::Forward => "forward",
        ast::Hook::Output => "output",
        ast::Hook::Postrouting => "postrouting",
    }
}

/// Parses `tcp`, `udp`, `icmp`, `icmpv6` (and a few more names) or a number.
pub fn parse_proto(s: &str) -> Result<u8, PacketError> {
    Ok(match s {
        "tcp" => 6,
        "udp" => 17,
        "icmp" => 1,
        "icmpv6" | "ipv6-icmp" => 58,
        "sctp" => 132,
        "dccp" => 33,
        "udplite" => 136,
        "gre" => 47,
        "esp" => 50,
        "ah" => 51,
        _ => match s.parse::<u8>() {
            Ok(n) => n,
            Err(_) => return perr(format!("unknown protocol '{s}'")),
        },
    })
}

/// Parses TCP flags as letters: F S R P A U E C (e.g. `SA`).
pub fn parse_tcp_flags(s: &str) -> Result<u8, PacketError> {
    let mut f = 0u8;
    for c in s.chars() {
        f |= match c.to_ascii_uppercase() {
            'F' => 0x01,
            'S' => 0x02,
            'R' => 0x04,
            'P' => 0x08,
            'A' => 0x10,
            'U' => 0x20,
            'E' => 0x40,
            'C' => 0x80,
            _ => {
                return perr(format!(
                    "unknown TCP flag '{c}' in '{s}' (letters FSRPAUEC)"
                ))
            }
        };
    }
    Ok(f)
}

/// Parses `new`, `established`, `related` or `invalid` (a packet is
/// untracked only when a `notrack` rule makes it so).
pub fn parse_ct(s: &str) -> Result<CtState, PacketError> {
    Ok(match s {
        "new" => CtState::New,
        "established" => CtState::Established,
        "related" => CtState::Related,
        "invalid" => CtState::Invalid,
        _ => {
            return perr(format!(
                "unknown ct state '{s}' (new, established, related, invalid)"
            ))
        }
    })
}

/// Parses a decimal or `0x` hexadecimal `u32`.
pub fn parse_u32(s: &str) -> Result<u32, PacketError> {
    let r = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(h) => u32::from_str_radix(h, 16),
        None => s.parse(),
    };
    r.or_else(|_| perr(format!("'{s}' is not a 32-bit number")))
}

fn parse_u8(s: &str, what: &str) -> Result<u8, PacketError> {
    s.parse()
        .or_else(|_| perr(format!("{what} '{s}' is not a number 0-255")))
}

/// An IP total length (header included), 20-65535.
pub fn parse_length(s: &str) -> Result<u16, PacketError> {
    match s.parse::<u16>() {
        Ok(n) if n >= 20 => Ok(n),
        _ => perr(format!("length '{s}' is not an IP total length 20-65535")),
    }
}

/// A DiffServ code point: a number 0-63 or one of nft's names (`cs1`,
/// `af41`, `ef`, ...).
pub fn parse_dscp(s: &str) -> Result<u8, PacketError> {
    match ast::DataType::Dscp
        .symbol(s)
        .or_else(|| s.parse().ok())
        .and_then(|n| u8::try_from(n).ok())
    {
        Some(n) if n <= 63 => Ok(n),
        _ => perr(format!(
            "dscp '{s}' is not 0-63 or a name (cs0-cs7, af11-af43, ef, va, lephb)"
        )),
    }
}

/// [`sluice_engine::fixed_addr_type`] of an address of the packet; an unset
/// IPv4 address is `0.0.0.0` (broadcast), an unset IPv6 one `::`.
fn addr_type(a: Option<IpAddr>, v6: bool) -> Option<u8> {
    match a {
        Some(a) => sluice_engine::fixed_addr_type(a),
        None if v6 => None,
        None => Some(3),
    }
}

/// A route type: `unicast`, `local`, `broadcast`, `multicast`, ... (the
/// kernel's `RTN_*` names, as nft and iptables `addrtype` spell them, in
/// either case) or a number 0-11.
pub fn parse_addr_type(s: &str) -> Result<u8, PacketError> {
    match ast::DataType::AddrType
        .symbol(&s.to_ascii_lowercase())
        .or_else(|| s.parse().ok())
        .and_then(|n| u8::try_from(n).ok())
    {
        Some(n) if n <= 11 => Ok(n),
        _ => perr(format!(
            "unknown address type '{s}' (unicast, local, broadcast, multicast, ...)"
        )),
    }
}

/// Reverse-path result: `ok` (a route back through the input interface),
/// `other-iif` (a route back, through another interface) or `none`.
pub fn parse_rpf(s: &str) -> Result<(bool, bool), PacketError> {
    match s {
        "ok" => Ok((true, true)),
        "other-iif" => Ok((false, true)),
        "none" => Ok((false, false)),
        _ => perr(format!("unknown rpf '{s}' (ok, other-iif, none)")),
    }
}

/// `original` or `reply`.
pub fn parse_ct_direction(s: &str) -> Result<u8, PacketError> {
    match ast::DataType::CtDir.symbol(s) {
        Some(n) => Ok(n as u8),
        None => perr(format!("unknown ct direction '{s}' (original, reply)")),
    }
}

/// A MAC address `aa:bb:cc:dd:ee:ff`, as the low 48 bits of a `u64`.
pub fn parse_mac(s: &str) -> Result<u64, PacketError> {
    sluice_ruleset::parse_mac(s).map_or_else(
        || perr(format!("'{s}' is not a MAC address (aa:bb:cc:dd:ee:ff)")),
        Ok,
    )
}

/// `host` (or `unicast`), `broadcast` or `multicast`.
pub fn parse_pkttype(s: &str) -> Result<u8, PacketError> {
    match ast::DataType::PktType.symbol(s) {
        Some(n) if n <= 2 => Ok(n as u8),
        _ => perr(format!(
            "unknown pkttype '{s}' (host, broadcast, multicast)"
        )),
    }
}

/// `ADDR`, `ADDR:PORT`, `[V6]:PORT` or a bare IPv6 address.
fn parse_endpoint(s: &str) -> Result<(IpAddr, Option<u16>), PacketError> {
    if let Ok(a) = s.parse::<IpAddr>() {
        return Ok((a, None));
    }
    let (a, p) = if let Some(rest) = s.strip_prefix('[') {
        match rest.split_once("]:") {
            Some((a, p)) => (a, p),
            None => (rest.strip_suffix(']').unwrap_or(rest), ""),
        }
    } else {
        match s.rsplit_once(':') {
            Some((a, p)) => (a, p),
            None => (s, ""),
        }
    };
    let addr: IpAddr = a
        .parse()
        .or_else(|_| perr(format!("'{s}' is not an address[:port]")))?;
    if p.is_empty() {
        return Ok((addr, None));
    }
    let port: u16 = p
        .parse()
        .or_else(|_| perr(format!("'{p}' is not a port number")))?;
    Ok((addr, Some(port)))
}

impl TracePacket {
    /// Parses `[PROTO] SRC[:PORT] > DST[:PORT] [iif NAME] [oif NAME] [ct STATE]
    /// [mark N] [ctmark N] [flags FLAGS] [type N] [code N] [hook HOOK] [ttl N]
    /// [length N] [dscp N|NAME] [pkttype host|broadcast|multicast]
    /// [time YYYY-MM-DD[THH:MM[:SS]] | SECONDS]`,
    /// e.g. `tcp 10.0.0.2:1234 > 192.0.2.1:80 iif eth0 oif eth1 ct new flags S`.
    /// IPv6 endpoints with a port are written `[2001:db8::1]:80`.
    pub fn parse(spec: &str) -> Result<Self, PacketError> {
        let toks: Vec<&str> = spec.split_whitespace().collect();
        let mut p = TracePacket::default();
        let mut i = 0usize;
        if let Some(t) = toks.first() {
            if !t.contains('.') && !t.contains(':') {
                p.proto = parse_proto(t)?;
                i = 1;
            }
        }
        match (toks.get(i), toks.get(i + 1), toks.get(i + 2)) {
            (Some(src), Some(&">"), Some(dst)) => {
                let (s, sp) = parse_endpoint(src)?;
                let (d, dp) = parse_endpoint(dst)?;
                p.src = Some(s);
                p.dst = Some(d);
                p.sport = sp.unwrap_or(0);
                p.dport = dp.unwrap_or(0);
                i += 3;
            }
            _ => return perr("expected 'SRC[:PORT] > DST[:PORT]' after the protocol"),
        }
        while let Some(key) = toks.get(i) {
            let Some(val) = toks.get(i + 1) else {
                return perr(format!("'{key}' needs a value"));
            };
            match *key {
                "iif" | "iifname" => p.iif = Some((*val).to_string()),
                "oif" | "oifname" => p.oif = Some((*val).to_string()),
                "ct" => p.ct = parse_ct(val)?,
                "mark" => p.mark = parse_u32(val)?,
                "ctmark" => p.ct_mark = parse_u32(val)?,
                "status" => p.ct_status = Some(parse_ct_status(val)?),
                "flags" => p.tcp_flags = parse_tcp_flags(val)?,
                "type" => p.icmp_type = parse_u8(val, "ICMP type")?,
                "code" => p.icmp_code = parse_u8(val, "ICMP code")?,
                "hook" => p.hook = parse_hook(val)?,
                "ttl" => p.ttl = parse_u8(val, "TTL")?,
                "length" => p.length = Some(parse_length(val)?),
                "dscp" => p.dscp = parse_dscp(val)?,
                "pkttype" => p.pkttype = parse_pkttype(val)?,
                "daddr_type" => p.daddr_type = Some(parse_addr_type(val)?),
                "saddr_type" => p.saddr_type = Some(parse_addr_type(val)?),
                "ether_saddr" => p.ether.0 = parse_mac(val)?,
                "ether_daddr" => p.ether.1 = parse_mac(val)?,
                "ct_direction" => p.ct_dir = parse_ct_direction(val)?,
                "rpf" => p.rpf = parse_rpf(val)?,
                "time" => p.wall_s = Some(parse_wall_time(val)?),
                _ => {
                    return perr(format!(
                        "unknown key '{key}' (iif, oif, ct, status, mark, ctmark, flags, type, code, hook, ttl, length, dscp, pkttype, daddr_type, saddr_type, ether_saddr, ether_daddr, ct_direction, rpf, time)"
                    ))
                }
            }
            i += 2;
        }
        p.check()?;
        Ok(p)
    }

    /// Rejects inconsistent descriptions (mixed address families).
    pub fn check(&self) -> Result<(), PacketError> {
        if let (Some(s), Some(d)) = (self.src, self.dst) {
            if s.is_ipv4() != d.is_ipv4() {
                return perr("source and destination are of different address families");
            }
        }
        Ok(())
    }

    fn is_v6(&self) -> bool {
        self.src.or(self.dst).is_some_and(|a| a.is_ipv6())
    }

    /// The classifier's view, with interface indexes from `policy`.
    pub fn fields(&self, policy: &CompiledPolicy) -> PacketFields {
        let v6 = self.is_v6();
        let addr = |a: Option<IpAddr>| match a {
            Some(IpAddr::V4(a)) => map_v4(u32::from(a)),
            Some(IpAddr::V6(a)) => u128::from(a),
            None if v6 => 0,
            None => map_v4(0),
        };
        let ifx = |n: &Option<String>| {
            n.as_deref().map_or((0, IfName::default()), |n| {
                (policy.interfaces().index(n).unwrap_or(0), IfName::new(n))
            })
        };
        let (iif, iifname) = ifx(&self.iif);
        let (oif, oifname) = ifx(&self.oif);
        let icmp = matches!(self.proto, 1 | 58);
        let hdr: u16 = if v6 { 40 } else { 20 };
        let length = self.length.unwrap_or(
            hdr + match self.proto {
                6 => 20,
                17 | 1 | 58 => 8,
                _ => 0,
            },
        );
        let wall_s = self.wall_s.unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs())
        });
        // The connection's tuples: the packet's own in its direction (a
        // trace knows no NAT that happened before it), the other one
        // reversed (an ICMP packet's identifier is not given: 0).
        let (sport, dport) = if icmp {
            (0, 0)
        } else {
            (self.sport, self.dport)
        };
        let mine = CtTuple {
            saddr: addr(self.src),
            daddr: addr(self.dst),
            sport,
            dport,
        };
        let other = CtTuple {
            saddr: mine.daddr,
            daddr: mine.saddr,
            sport: mine.dport,
            dport: mine.sport,
        };
        let (ct_orig, ct_reply) = if self.ct_dir == 1 {
            (other, mine)
        } else {
            (mine, other)
        };
        PacketFields {
            ct_orig,
            ct_reply,
            // A traced packet has DF clear (as the oracle's packets).
            frag_off: 0,
            iif,
            oif,
            iifname,
            oifname,
            family: if v6 { IrFamily::V6 } else { IrFamily::V4 },
            saddr: addr(self.src),
            daddr: addr(self.dst),
            l4proto: self.proto,
            sport: if icmp { 0 } else { self.sport },
            dport: if icmp { 0 } else { self.dport },
            tcp_flags: if self.proto == 6 { self.tcp_flags } else { 0 },
            icmp_type: if icmp { self.icmp_type } else { 0 },
            icmp_code: if icmp { self.icmp_code } else { 0 },
            ct_state: ct_bits(self.ct),
            ct_mark: self.ct_mark,
            mark: self.mark,
            ct_status: self.ct_status.unwrap_or(default_ct_status(self.ct)),
            ttl: self.ttl,
            ip_len: if v6 {
                length.saturating_sub(40)
            } else {
                length
            },
            dscp: self.dscp,
            length: u32::from(length),
            pkttype: self.pkttype,
            daddr_type: self.daddr_type.unwrap_or_else(|| {
                addr_type(self.dst, v6).unwrap_or(if self.hook == ast::Hook::Input { 2 } else { 1 })
            }),
            ether_saddr: self.ether.0,
            ether_daddr: self.ether.1,
            ct_dir: self.ct_dir,
            rpf_iif: u8::from(self.rpf.0),
            rpf_any: u8::from(self.rpf.1),
            time_ns: wall_s.saturating_mul(1_000_000_000),
            saddr_type: self.saddr_type.unwrap_or_else(|| {
                addr_type(self.src, v6).unwrap_or(if self.hook == ast::Hook::Output {
                    2
                } else {
                    1
                })
            }),
            // Each traced packet is its own connection's first packet (a
            // trace has no connection table).
            conn: ConnId {
                saddr: addr(self.src),
                daddr: addr(self.dst),
                sport: self.sport,
                dport: self.dport,
                proto: self.proto,
            },
        }
    }
}

/// The final verdict of a trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TraceVerdict {
    /// Accepted by every hook on the path.
    Accept,
    /// Dropped (by rule, policy or an evaluation error).
    Drop,
    /// Rejected by a rule.
    Reject,
}

impl TraceVerdict {
    /// `"accept"`, `"drop"` or `"reject"`.
    pub fn name(self) -> &'static str {
        match self {
            TraceVerdict::Accept => "accept",
            TraceVerdict::Drop => "drop",
            TraceVerdict::Reject => "reject",
        }
    }
}

/// Kind of a NAT action.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NatType {
    /// Source NAT to a pool.
    Snat,
    /// Destination NAT.
    Dnat,
    /// Source NAT to the egress interface's address.
    Masquerade,
}

impl NatType {
    /// `"snat"`, `"dnat"` or `"masquerade"`.
    pub fn name(self) -> &'static str {
        match self {
            NatType::Snat => "snat",
            NatType::Dnat => "dnat",
            NatType::Masquerade => "masquerade",
        }
    }
}

/// What a NAT hook would do to the first packet of the connection. For
/// SNAT to a pool, `addr` is the pool's first address and `port` is `None`
/// unless the rule fixes a single port (the real choice depends on the
/// allocator); for masquerade both are `None` (the egress address is known
/// only at run time).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NatReport {
    /// Kind.
    pub kind: NatType,
    /// Address.
    pub addr: Option<Ipv4Addr>,
    /// Port.
    pub port: Option<u16>,
    /// `FILE:LINE` of the NAT rule.
    pub rule: String,
}

/// One matched rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleTrace {
    /// Chain holding the rule (`"inet filter input"`).
    pub chain: String,
    /// `FILE:LINE`.
    pub location: String,
    /// The rule, canonical nft.
    pub text: String,
}

/// One base chain run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChainTrace {
    /// Chain name.
    pub chain: String,
    /// `type nat`.
    pub nat: bool,
    /// Priority.
    pub priority: i32,
    /// Matched rules, in execution order (across jumps).
    pub rules: Vec<RuleTrace>,
    /// What the chain decided: `accept`, `drop`, `reject`, `nat`, `error`.
    pub result: &'static str,
    /// The policy decided (no rule did).
    pub by_policy: bool,
}

/// One hook on the path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HookTrace {
    /// Hook.
    pub hook: ast::Hook,
    /// Base chains run, in order (chains skipped for family or conntrack
    /// state are not listed).
    pub chains: Vec<ChainTrace>,
}

/// The full answer for one packet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Trace {
    /// Hooks on the path, up to the one that decided.
    pub hooks: Vec<HookTrace>,
    /// Final verdict.
    pub verdict: TraceVerdict,
    /// `FILE:LINE` of the deciding rule: the dropping/rejecting rule, or for
    /// accept the accepting rule of the last base chain of the traced hook;
    /// `None` when a chain policy decided.
    pub rule: Option<String>,
    /// The first NAT action on the path (DNAT comes before SNAT).
    pub nat: Option<NatReport>,
    /// Every NAT action on the path.
    pub nat_all: Vec<NatReport>,
    /// Packet mark afterwards.
    pub mark: u32,
    /// A `notrack` statement before conntrack exempted the packet: later
    /// chains saw `ct state untracked`, NAT chains did not run.
    pub untracked: bool,
    /// The timeout, in seconds, that the connection an accepted `ct state
    /// new` packet creates starts with, under netfilter's default timers
    /// and the `ct timeout set` policy of its protocol the packet met last
    /// (UDP's unreplied timer, a TCP SYN's SYN_SENT one, an ICMP echo
    /// request's); `None` for other packets.
    pub timeout: Option<u32>,
    /// A `ct timeout set` gave the connection a policy (the one
    /// [`Self::timeout`] read).
    pub ct_timeout: bool,
    /// An evaluation error (jump stack overflow), reported as drop.
    pub error: Option<String>,
    /// Set when the compiled classifier and the linear reference disagreed
    /// (a classifier bug; debug builds panic instead).
    pub mismatch: Option<String>,
}

/// [`Trace::timeout`]: the timer the first packet `pkt` leaves its
/// connection with, under netfilter's defaults and the policy in `slot`
/// (0: none), in whole seconds.
fn first_timeout(pkt: &TracePacket, slot: u8) -> Option<u32> {
    use sluice_conntrack::{proto::TcpFlags, L4Event};
    let ev = match pkt.proto {
        17 => L4Event::Udp,
        // A SYN alone (a mid-stream pickup is capped as unassured in
        // Sluice, where the kernel would not know yet).
        6 if pkt.tcp_flags & 0x17 == 0x02 => L4Event::Tcp(TcpFlags(pkt.tcp_flags)),
        1 if pkt.icmp_type == 8 => L4Event::Icmp { request: true },
        58 if pkt.icmp_type == 128 => L4Event::Icmp { request: true },
        _ => return None,
    };
    let policy = sluice_engine::ct_timeout::get(slot)
        .filter(|p| p.proto == pkt.proto)
        .map(|p| p.policy);
    let d = sluice_conntrack::first_packet_timeout(
        &Default::default(),
        policy.as_ref(),
        pkt.proto,
        ev,
    )?;
    u32::try_from(d.as_secs()).ok()
}

/// The hooks a packet meets on the path of `hook`.
pub fn path(hook: ast::Hook) -> &'static [ast::Hook] {
    use ast::Hook::*;
    match hook {
        Prerouting => &[Prerouting],
        Input => &[Prerouting, Input],
        Forward => &[Prerouting, Forward, Postrouting],
        Output => &[Output, Postrouting],
        Postrouting => &[Postrouting],
    }
}

type Visits = Vec<(sluice_classify::ChainId, Outcome, Vec<RuleId>)>;

/// What a sequence of traced packets shares: the elements of the rule
/// set's dynamic sets (`add @s`, `ip saddr @s`), so that a packet sees
/// what the ones before it added, as in the kernel, and their connection
/// counts (each traced packet is its own connection's first packet, which
/// counts once it is accepted; a trace sees no connection end). Plain
/// `limit` statements stay within their rate in a trace.
#[derive(Debug)]
pub struct TraceState {
    sets: Arc<crate::limits::SetsOnly>,
}

impl CompiledPolicy {
    /// Fresh trace state: every dynamic set with its declared elements,
    /// their timers started at time 0 (the trace's clock, as if the rule
    /// set had just been loaded).
    pub fn trace_state(&self) -> TraceState {
        let mut l = crate::limits::Limiters::default();
        l.extend_sets(&self.tables.sets, &self.tables.set_ops);
        l.extend_quotas(&self.tables.quotas);
        l.extend_numgens(&self.tables.numgens);
        l.extend_ct_counts(&self.tables.ct_counts);
        l.extend_objects(&self.tables.objects);
        l.start_timers(0);
        TraceState {
            sets: Arc::new(crate::limits::SetsOnly(l)),
        }
    }

    /// Traces one packet along the path of its hook, every dynamic set
    /// empty.
    pub fn trace(&self, pkt: &TracePacket) -> Trace {
        self.trace_in(pkt, None)
    }

    /// Traces one packet at `now_ms` with the dynamic sets of `state`,
    /// which it updates.
    pub fn trace_stateful(&self, pkt: &TracePacket, state: &TraceState, now_ms: u64) -> Trace {
        self.trace_in(pkt, Some((state, now_ms)))
    }

    fn trace_in(&self, pkt: &TracePacket, state: Option<(&TraceState, u64)>) -> Trace {
        let mut p = pkt.fields(self);
        let mut s = Scratch::new();
        // `meta length`, what the kernel charges a quota.
        let len = p.length;
        // The linear reference runs on a copy of the sets, so that only the
        // compiled run's changes stay.
        let ctx = |sets: Arc<crate::limits::SetsOnly>, now_ms| sluice_classify::LimitCtx {
            limits: sets as Arc<dyn sluice_classify::Limits>,
            now_ms,
            len,
        };
        let mut out = Trace {
            hooks: Vec::new(),
            verdict: TraceVerdict::Accept,
            rule: None,
            nat: None,
            nat_all: Vec::new(),
            mark: p.mark,
            untracked: false,
            timeout: None,
            ct_timeout: false,
            error: None,
            mismatch: None,
        };
        // The last `ct timeout set` of the packet's protocol it met on its
        // connection's first packet (0: none).
        let mut slot = 0u8;
        // The packet's `ct state` as given, which the chains before
        // conntrack do not see yet (they see `invalid`: no connection).
        let given_ct = p.ct_state;
        'hooks: for &hook in path(pkt.hook) {
            // A forwarded packet's TTL / hop limit is decremented before
            // the forward hook (`ip_forward`, `ip6_forward`).
            if hook == ast::Hook::Forward {
                p.ttl = p.ttl.saturating_sub(1);
            }
            let stages: &[Stage] = if matches!(hook, ast::Hook::Prerouting | ast::Hook::Output) {
                &[Stage::BeforeConntrack, Stage::AfterConntrack]
            } else {
                &[Stage::All]
            };
            let mut chains = Vec::new();
            for &stage in stages {
                if stage == Stage::BeforeConntrack {
                    p.ct_state = ct::INVALID;
                }
                let mut lin: Visits = Vec::new();
                s.limit = state.map(|(st, now)| {
                    let copy = crate::limits::SetsOnly(st.sets.0.snapshot());
                    ctx(Arc::new(copy), now)
                });
                let lo = self.run_hook(hook, stage, &p, Evaluator::Linear, &mut s, |b, o, t, _| {
                    lin.push((b.chain, *o, t.to_vec()))
                });
                let mut comp: Visits = Vec::new();
                s.limit = state.map(|(st, now)| ctx(Arc::clone(&st.sets), now));
                let co = self.run_hook(
                    hook,
                    stage,
                    &p,
                    Evaluator::Compiled,
                    &mut s,
                    |b, o, t, _| comp.push((b.chain, *o, t.to_vec())),
                );
                s.limit = None;
                debug_assert_eq!(
                    lin, comp,
                    "compiled classifier disagrees with linear evaluator"
                );
                debug_assert_eq!(lo, co);
                if lin != comp || lo != co {
                    out.mismatch = Some(format!(
                        "hook {}: linear {lin:?} / {lo:?} vs compiled {comp:?} / {co:?}",
                        hook_name(hook)
                    ));
                }
                chains.extend(comp.iter().map(|(c, o, t)| self.chain_trace(*c, o, t)));
                if stage != Stage::BeforeConntrack && given_ct == ct::NEW {
                    for id in comp.iter().flat_map(|(_, _, t)| t) {
                        let s = self.counters.effects(*id).ct_timeout(pkt.proto);
                        if s != 0 {
                            slot = s;
                        }
                    }
                }
                if stage == Stage::BeforeConntrack {
                    // `notrack` ran: conntrack leaves the packet alone.
                    out.untracked = co.ct_state == ct::UNTRACKED;
                    p.ct_state = if out.untracked {
                        ct::UNTRACKED
                    } else {
                        given_ct
                    };
                }
                p.mark = co.mark;
                p.ct_mark = co.ct_mark;
                out.mark = co.mark;
                if let Some((id, rule)) = co.nat {
                    if let Some(a) = self.nat_actions().get(id as usize) {
                        // The packet's own addresses: the tuple `nf_nat`
                        // hashes for `dnat to A-B`.
                        let v4 = |x: Option<IpAddr>| match x {
                            Some(IpAddr::V4(a)) => a,
                            _ => std::net::Ipv4Addr::UNSPECIFIED,
                        };
                        let translation = a.translation_for(v4(pkt.src), v4(pkt.dst), pkt.dport);
                        let (mut report_addr, mut report_port) = (a.addr, a.port);
                        let kind = match translation {
                            Translation::Snat { .. } => {
                                p.ct_status |= IPS_SRC_NAT;
                                NatType::Snat
                            }
                            Translation::Masquerade => {
                                p.ct_status |= IPS_SRC_NAT;
                                NatType::Masquerade
                            }
                            Translation::Dnat { addr, port } => {
                                // Later hooks see the translated destination and
                                // `ct status dnat`, as in the kernel.
                                p.ct_status |= IPS_DST_NAT;
                                report_addr = Some(addr);
                                report_port = port;
                                p.daddr = map_v4(u32::from(addr));
                                // Replies now come from the target.
                                p.ct_reply.saddr = p.daddr;
                                // A DNAT target is not one of the gateway's
                                // addresses (the path goes on through forward).
                                p.daddr_type =
                                    addr_type(Some(IpAddr::V4(addr)), false).unwrap_or(1);
                                if let Some(port) = port {
                                    if matches!(p.l4proto, 6 | 17 | 33 | 132 | 136) {
                                        p.dport = port;
                                        p.ct_reply.sport = port;
                                    }
                                }
                                NatType::Dnat
                            }
                        };
                        out.nat_all.push(NatReport {
                            kind,
                            addr: report_addr,
                            port: report_port,
                            rule: self.location(rule),
                        });
                    }
                }
                let decided = |v| (v, co.rule.map(|r| self.location(r)));
                match co.verdict {
                    HookVerdict::Accept => {
                        if hook == pkt.hook {
                            out.rule = co.rule.map(|r| self.location(r));
                        }
                    }
                    HookVerdict::Drop => {
                        (out.verdict, out.rule) = decided(TraceVerdict::Drop);
                        out.hooks.push(HookTrace { hook, chains });
                        break 'hooks;
                    }
                    HookVerdict::Reject(_) => {
                        (out.verdict, out.rule) = decided(TraceVerdict::Reject);
                        out.hooks.push(HookTrace { hook, chains });
                        break 'hooks;
                    }
                    HookVerdict::Error(e) => {
                        (out.verdict, out.rule) = decided(TraceVerdict::Drop);
                        out.error = Some(e.to_string());
                        out.hooks.push(HookTrace { hook, chains });
                        break 'hooks;
                    }
                }
            }
            out.hooks.push(HookTrace { hook, chains });
        }
        out.nat = out.nat_all.first().cloned();
        if out.verdict == TraceVerdict::Accept && given_ct == ct::NEW && !out.untracked {
            out.ct_timeout = slot != 0;
            out.timeout = first_timeout(pkt, slot);
        }
        // An accepted first packet creates its connection: it counts for
        // `ct count` from now on, as the engine's confirmation makes it.
        if let (Some((st, _)), TraceVerdict::Accept) = (state, out.verdict) {
            if p.ct_state == sluice_classify::ir::ct::NEW {
                st.sets.0.conn_counts().confirm(&p.conn);
            }
        }
        out
    }

    fn location(&self, r: RuleId) -> String {
        self.rule_info(r)
            .map(|i| i.location.to_string())
            .unwrap_or_else(|| format!("<rule {}>", r.0))
    }

    fn chain_trace(&self, c: sluice_classify::ChainId, o: &Outcome, t: &[RuleId]) -> ChainTrace {
        let info = self.chain_info(c);
        let rules = t
            .iter()
            .map(|r| {
                let ri = self.rule_info(*r);
                RuleTrace {
                    chain: ri
                        .and_then(|i| self.chain_info(i.chain))
                        .map(|c| c.name.clone())
                        .unwrap_or_default(),
                    location: self.location(*r),
                    text: ri.map(|i| i.text()).unwrap_or_default(),
                }
            })
            .collect();
        ChainTrace {
            chain: info.map(|i| i.name.clone()).unwrap_or_default(),
            nat: info
                .and_then(|i| i.base)
                .is_some_and(|b| b.chain_type == ast::ChainType::Nat),
            priority: info.and_then(|i| i.base).map_or(0, |b| b.priority),
            rules,
            result: match o.verdict {
                sluice_classify::Final::Accept => "accept",
                sluice_classify::Final::Drop => "drop",
                sluice_classify::Final::Reject(_) => "reject",
                sluice_classify::Final::Nat(_) => "nat",
                sluice_classify::Final::Error(_) => "error",
            },
            by_policy: o.rule.is_none(),
        }
    }
}

impl fmt::Display for NatReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.kind.name())?;
        match (self.addr, self.port) {
            (Some(a), Some(p)) => write!(f, " to {a}:{p}")?,
            (Some(a), None) => write!(f, " to {a}")?,
            (None, Some(p)) => write!(f, " to :{p}")?,
            (None, None) => {}
        }
        write!(f, " ({})", self.rule)
    }
}

impl fmt::Display for Trace {
    /// Human-readable form: hooks, chains, matched rules, then the result.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for h in &self.hooks {
            writeln!(f, "hook {}:", hook_name(h.hook))?;
            if h.chains.is_empty() {
                writeln!(f, "  (no base chain)")?;
            }
            for c in &h.chains {
                writeln!(
                    f,
                    "  chain {} (type {}, priority {})",
                    c.chain,
                    if c.nat { "nat" } else { "filter" },
                    c.priority
                )?;
                for r in &c.rules {
                    let inner = if r.chain == c.chain {
                        String::new()
                    } else {
                        format!(" [{}]", r.chain)
                    };
                    writeln!(f, "    rule {}{inner}: {}", r.location, r.text)?;
                }
                if c.by_policy {
                    writeln!(f, "    policy {}", c.result)?;
                } else {
                    writeln!(f, "    -> {}", c.result)?;
                }
            }
        }
        writeln!(f, "verdict: {}", self.verdict.name())?;
        match &self.rule {
            Some(r) => writeln!(f, "rule: {r}")?,
            None => writeln!(f, "rule: (chain policy)")?,
        }
        if self.nat_all.is_empty() {
            writeln!(f, "nat: none")?;
        }
        for n in &self.nat_all {
            writeln!(f, "nat: {n}")?;
        }
        writeln!(f, "mark: {:#x}", self.mark)?;
        if let Some(t) = self.timeout {
            let by = if self.ct_timeout {
                "its ct timeout policy"
            } else {
                "default timers"
            };
            writeln!(f, "conntrack: the new connection starts with {t} s ({by})")?;
        }
        if self.untracked {
            writeln!(
                f,
                "conntrack: untracked (notrack before conntrack: no connection, no NAT)"
            )?;
        }
        if let Some(e) = &self.error {
            writeln!(f, "error: {e}")?;
        }
        if let Some(m) = &self.mismatch {
            writeln!(f, "MISMATCH between compiled and linear evaluation: {m}")?;
        }
        Ok(())
    }
}

/// netfilter `IPS_SRC_NAT`.
pub const IPS_SRC_NAT: u32 = 0x10;
/// netfilter `IPS_DST_NAT`.
pub const IPS_DST_NAT: u32 = 0x20;

/// The `ct status` bits a packet has when the input does not say: a packet
/// of an established connection has seen a reply.
pub fn default_ct_status(ct: CtState) -> u32 {
    match ct {
        CtState::Established => 0x02,
        _ => 0,
    }
}

/// Parse `ct status` bits: a number, or names joined by `,` or `|`
/// (expected, seen-reply, assured, confirmed, snat, dnat, dying).
pub fn parse_ct_status(s: &str) -> Result<u32, PacketError> {
    if let Ok(n) = parse_u32(s) {
        return Ok(n);
    }
    let mut bits = 0;
    for name in s.split([',', '|']).map(str::trim).filter(|x| !x.is_empty()) {
        bits |= match name {
            "expected" => 0x01,
            "seen-reply" => 0x02,
            "assured" => 0x04,
            "confirmed" => 0x08,
            "snat" => IPS_SRC_NAT,
            "dnat" => IPS_DST_NAT,
            "dying" => 0x200,
            _ => {
                return perr(format!(
                    "unknown ct status '{name}' (expected, seen-reply, assured, confirmed, snat, dnat, dying, or a number)"
                ))
            }
        };
    }
    Ok(bits)
}
