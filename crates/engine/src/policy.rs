//! The policy interface: what the ruleset decides for a packet that has no
//! fast-path state (a new connection, or one whose cached decision belongs to
//! an older ruleset generation).
//!
//! Compiled nftables / iptables rulesets (`sluice-classify`) implement
//! [`Policy`]. [`StaticPolicy`] is the Rust-typed policy used by the
//! benchmark and by tests: a default verdict per hook plus NAT rules.

use core::net::{IpAddr, Ipv4Addr};

use sluice_nat::Translation;

use crate::route::IfIndex;

/// Netfilter hooks, in the order a forwarded packet meets them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Hook {
    /// Before routing: DNAT happens here.
    Prerouting,
    /// To the gateway itself.
    Input,
    /// Through the gateway.
    Forward,
    /// From the gateway itself.
    Output,
    /// After routing: SNAT and masquerade happen here.
    Postrouting,
}

/// Conntrack state as seen by the ruleset (`ct state`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CtState {
    /// First packet of a connection.
    New,
    /// A packet of a known connection.
    Established,
    /// An ICMP error about a known connection.
    Related,
    /// A packet conntrack refuses (bad TCP transition, ...), or one it has
    /// not seen yet (what the chains before conntrack see).
    Invalid,
    /// A packet a `notrack` statement exempted from conntrack: no
    /// connection, no NAT.
    Untracked,
}

/// Everything the ruleset may look at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PolicyPacket {
    /// Ingress interface.
    pub iif: IfIndex,
    /// Egress interface, once routing has chosen one.
    pub oif: Option<IfIndex>,
    /// IP version: 4 or 6.
    pub family: u8,
    /// Source address (IPv4 in the low 32 bits).
    pub src: u128,
    /// Destination address (IPv4 in the low 32 bits).
    pub dst: u128,
    /// Upper-layer protocol.
    pub proto: u8,
    /// Source port, or ICMP identifier.
    pub sport: u16,
    /// Destination port, or ICMP identifier.
    pub dport: u16,
    /// TCP flags (0 for other protocols).
    pub tcp_flags: u8,
    /// ICMP type and code (0 for other protocols).
    pub icmp: (u8, u8),
    /// Conntrack state.
    pub ct: CtState,
    /// Connection mark.
    pub ct_mark: u32,
    /// Packet mark.
    pub mark: u32,
    /// Conntrack status bits (`ct status`, netfilter's `IPS_*` values; the
    /// engine sets `IPS_DST_NAT` = 0x20 once prerouting has applied DNAT).
    pub ct_status: u32,
    /// IP total length.
    pub len: u16,
    /// IPv4 TTL or IPv6 hop limit, as received.
    pub ttl: u8,
    /// IPv4 TOS or IPv6 traffic class byte (DSCP in the top 6 bits).
    pub tos: u8,
    /// IPv4's don't-fragment flag (`ip frag-off & 0x4000`; the rules see
    /// a packet as reassembled, so MF and the offset read 0).
    pub df: bool,
    /// How the frame was addressed (`meta pkttype`): 0 to the interface, 1
    /// link-layer broadcast, 2 multicast.
    pub pkttype: u8,
    /// The route type of `dst` (`fib daddr type`, the kernel's `RTN_*`):
    /// 1 unicast, 2 local, 3 broadcast, 5 multicast.
    pub daddr_type: u8,
    /// The route type of `src` (`fib saddr type`).
    pub saddr_type: u8,
    /// The frame's source and destination MAC addresses (`ether saddr`,
    /// `ether daddr`), first byte most significant.
    pub ether: (u64, u64),
    /// `ct direction`: 0 original (a new packet, or one in the direction of
    /// the connection's first), 1 reply.
    pub ct_dir: u8,
    /// Reverse path (`fib saddr [. iif] oif`): whether a route back to the
    /// source leaves through the input interface, and whether any does.
    pub rpf: (bool, bool),
    /// The batch's time, ms on the worker's monotonic clock (for `limit`
    /// rate buckets; the policy reads no clock).
    pub now_ms: u64,
    /// The batch's time, ms since the epoch (UTC): `now_ms` plus the
    /// offset the worker was configured with
    /// ([`crate::EngineConfig::wall_offset_ms`]); for `meta time`, `meta
    /// day`, `meta hour`.
    pub wall_ms: u64,
    /// The connection the packet belongs to: its original direction's
    /// tuple, before NAT (what `ct count` counts, `ct original ...`).
    pub conn: ConnTuple,
    /// Its reply direction's tuple as replies will arrive (`ct reply
    /// ...`): the original reversed, with a DNAT's target as source once
    /// prerouting applied one and the SNAT address as destination for an
    /// established connection that has one.
    pub ct_reply: ConnTuple,
}

/// A connection by its original direction's tuple, before NAT (addresses
/// as in [`PolicyPacket`]: IPv4 in the low 32 bits).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct ConnTuple {
    pub src: u128,
    pub dst: u128,
    pub sport: u16,
    pub dport: u16,
    pub proto: u8,
    /// 4 or 6.
    pub family: u8,
}

/// How a reject is answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RejectWith {
    /// Destination unreachable: an IPv4 packet gets ICMP type 3 with code
    /// `v4` (3 port unreachable), an IPv6 one ICMPv6 type 1 with code `v6`
    /// (4 port unreachable).
    Unreachable {
        /// ICMP code.
        v4: u8,
        /// ICMPv6 code.
        v6: u8,
    },
    /// A TCP RST ([`crate::tcp_reset`]); nothing for other protocols.
    TcpReset,
}

/// The filter verdict.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Let it through.
    Accept,
    /// Drop silently.
    Drop,
    /// Drop and answer.
    Reject(RejectWith),
}

/// The decision for one hook.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    /// Filter verdict.
    pub verdict: Verdict,
    /// The packet mark afterwards.
    pub mark: u32,
    /// The connection mark afterwards (`ct mark set`; kept in the
    /// connection's entry).
    pub ct_mark: u32,
    /// NAT for a new connection (only NAT hooks return one).
    pub nat: Option<Translation>,
    /// The `tcp option maxseg size set` statements the packet met.
    pub mss: MssClamp,
    /// A `flow add @ft` statement ran (forward chains): the connection
    /// joins the flowtable, if it may (see the engine's `fast4`).
    pub flow_add: bool,
    /// The last `ct timeout set` the packet met whose policy is of its
    /// protocol: a [`crate::ct_timeout`] slot, 0 for none. The engine gives
    /// it to a connection that this packet creates.
    pub ct_timeout: u8,
}

impl Decision {
    /// Accept `pkt` and change nothing: its marks as they are, no NAT, no
    /// MSS clamp, no flowtable.
    pub fn accept(pkt: &PolicyPacket) -> Self {
        Decision {
            verdict: Verdict::Accept,
            mark: pkt.mark,
            ct_mark: pkt.ct_mark,
            nat: None,
            mss: MssClamp::default(),
            flow_add: false,
            ct_timeout: 0,
        }
    }
}

/// What the chains before conntrack decided ([`Policy::raw`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RawDecision {
    /// Verdict and packet mark (a raw chain has no connection: its `ct
    /// mark` is 0, it has no NAT, and its MSS statements apply as the
    /// later hooks' do).
    pub decision: Decision,
    /// A `notrack` statement ran: the packet bypasses conntrack.
    pub untracked: bool,
}

/// The route type (`fib daddr|saddr type`, the kernel's `RTN_*`) an address
/// has on any box, before its own addresses are looked at: 3 broadcast
/// (`0.0.0.0/8`, 255.255.255.255), 5 multicast, 2 local (loopback); `None`
/// otherwise (local if it is one of the box's addresses, else unicast).
pub fn fixed_addr_type(a: IpAddr) -> Option<u8> {
    match a {
        IpAddr::V4(a) => {
            let a = u32::from(a);
            if a >> 24 == 0 || a == u32::MAX {
                Some(3)
            } else if a >> 28 == 0xe {
                Some(5)
            } else if a >> 24 == 127 {
                Some(2)
            } else {
                None
            }
        }
        IpAddr::V6(a) if a.is_multicast() => Some(5),
        IpAddr::V6(a) if a.is_loopback() => Some(2),
        IpAddr::V6(_) => None,
    }
}

/// The `tcp option maxseg size set` statements (iptables `TCPMSS`) a packet
/// met: its TCP MSS option is lowered to the smallest of them, never
/// raised (the kernel's `nft_exthdr` and `xt_TCPMSS`), and a segment
/// without the option is left alone.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MssClamp {
    /// The smallest fixed value set.
    pub value: Option<u16>,
    /// Whether `set rt mtu` was met: the smaller MTU of the routes to the
    /// destination and back to the source, less 40 (IPv4) or 60 (IPv6)
    /// bytes of headers.
    pub rt_mtu: bool,
}

impl MssClamp {
    /// Whether no statement was met.
    pub fn is_none(&self) -> bool {
        self.value.is_none() && !self.rt_mtu
    }

    /// Both sets of statements.
    pub fn and(self, o: MssClamp) -> MssClamp {
        MssClamp {
            value: match (self.value, o.value) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            },
            rt_mtu: self.rt_mtu || o.rt_mtu,
        }
    }

    /// The MSS to clamp to, given what `rt mtu` gives for the packet's
    /// route (the kernel's `get_tcpmss`: 536 when the MTU is not above the
    /// headers).
    pub fn limit(&self, rt_mss: u16) -> Option<u16> {
        let rt = self.rt_mtu.then_some(rt_mss);
        match (self.value, rt) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

/// A ruleset as the engine sees it. Implementations are immutable once
/// published; a new generation is a new value swapped in atomically.
pub trait Policy: Send + Sync {
    /// Evaluate `hook` for `pkt`.
    fn decide(&self, hook: Hook, pkt: &PolicyPacket) -> Decision;
    /// Whether any rule of `hook` can ever apply NAT (lets the engine skip
    /// the NAT hooks entirely for pure firewalls).
    fn has_nat(&self, hook: Hook) -> bool;
    /// The SNAT pools the rule set's `Translation::Snat` actions number
    /// (`PoolId` indexes this list), when it defines them: a worker whose
    /// NAT was built with other pools takes these when it takes the policy
    /// (`sluice_nat::WorkerNat::set_pools`), so that a packet never meets
    /// a policy and pools of different generations. `None` (the default):
    /// the pools stay as configured.
    fn nat_pools(&self) -> Option<&[sluice_nat::Pool]> {
        None
    }
    /// The rule set's flowtables (`flowtable ft { ... }`, filled by `flow
    /// add @ft`): 0 when it has none; otherwise a number that stays the
    /// same across incremental rule updates and changes when the rule set
    /// is replaced (netfilter tears a flowtable's connections down with the
    /// flowtable). The default has none.
    fn flowtables(&self) -> u64 {
        0
    }
    /// Whether the rule set has chains that run before conntrack
    /// (prerouting, priority below -200, e.g. `priority raw`): then the
    /// engine runs [`Policy::raw`] for every packet before it looks the
    /// packet's connection up. The default has none.
    fn has_raw(&self) -> bool {
        false
    }
    /// Runs the chains before conntrack for `pkt` (whose `ct` is
    /// [`CtState::Invalid`]: conntrack has not seen it). Only called when
    /// [`Policy::has_raw`].
    fn raw(&self, pkt: &PolicyPacket) -> RawDecision {
        RawDecision {
            decision: Decision::accept(pkt),
            untracked: false,
        }
    }
    /// Whether the filter chains accept every packet of an established
    /// connection whatever else it carries (as `ct state established
    /// accept` at the head of every filter chain a forwarded packet meets
    /// does). When true, the engine forwards established packets on the
    /// connection's cached state alone; when false it runs the prerouting,
    /// forward and postrouting filter chains for each of them, as netfilter
    /// does. The default, true, is the stateful-ACL model [`StaticPolicy`]
    /// documents.
    fn established_accepted(&self) -> bool {
        true
    }
    /// Whether any rule reads the routing facts of a packet: the address
    /// types (`fib daddr type`, `fib saddr type`) or the reverse path
    /// (`fib saddr . iif oif`). When false the engine does not work them
    /// out (two address classifications and a route lookup per packet that
    /// meets the policy) and [`PolicyPacket`] carries neutral values. The
    /// default, true, is always correct.
    fn needs_routing_facts(&self) -> bool {
        true
    }
    /// Whether any rule counts connections (`ct count`). When true the
    /// engine tells the policy which connections it created
    /// ([`Policy::conn_confirmed`]) and which ended
    /// ([`Policy::conn_closed`]); a counted connection that is never
    /// confirmed (its first packet was dropped) stops counting soon after.
    fn counts_connections(&self) -> bool {
        false
    }
    /// Connection `c`, whose first packet met the policy, was created.
    fn conn_confirmed(&self, c: &ConnTuple) {
        let _ = c;
    }
    /// Connection `c` ended: it was removed from the connection table, or
    /// a TCP connection reached TIME_WAIT or CLOSE (the kernel's
    /// `nf_conncount` counts neither).
    fn conn_closed(&self, c: &ConnTuple) {
        let _ = c;
    }
}

/// A policy written in Rust types: a default verdict for the filter hooks,
/// optional source NAT for traffic leaving through given interfaces, and
/// destination NAT (port forwards). The default verdict applies to new
/// connections; packets of established ones are always accepted (a
/// stateful ACL).
#[derive(Clone, Debug)]
pub struct StaticPolicy {
    /// Verdict for input and forward.
    pub default: Verdict,
    /// Source NAT (`Snat` or `Masquerade`) applied to new connections
    /// leaving through the given interface.
    pub snat: Vec<(IfIndex, Translation)>,
    /// Port forwards: (proto, external port) to (address, port).
    pub dnat: Vec<PortForward>,
}

/// A static port forward.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PortForward {
    /// Protocol.
    pub proto: u8,
    /// Destination address the outside uses (one of the gateway's).
    pub addr: Ipv4Addr,
    /// Destination port the outside uses.
    pub port: u16,
    /// Inside server.
    pub to_addr: Ipv4Addr,
    /// Inside port.
    pub to_port: u16,
}

impl StaticPolicy {
    /// Accept everything, no NAT.
    pub fn accept_all() -> Self {
        Self {
            default: Verdict::Accept,
            snat: Vec::new(),
            dnat: Vec::new(),
        }
    }
}

impl Policy for StaticPolicy {
    fn decide(&self, hook: Hook, pkt: &PolicyPacket) -> Decision {
        let mut d = Decision::accept(pkt);
        match hook {
            Hook::Input | Hook::Forward => d.verdict = self.default,
            Hook::Prerouting => {
                d.nat = self
                    .dnat
                    .iter()
                    .find(|f| {
                        f.proto == pkt.proto
                            && u128::from(u32::from(f.addr)) == pkt.dst
                            && f.port == pkt.dport
                    })
                    .map(|f| Translation::Dnat {
                        addr: f.to_addr,
                        port: Some(f.to_port),
                    });
            }
            Hook::Postrouting => {
                d.nat = pkt
                    .oif
                    .and_then(|oif| self.snat.iter().find(|(o, _)| *o == oif).map(|(_, t)| *t));
            }
            Hook::Output => {}
        }
        d
    }

    /// Its verdicts never read routing facts.
    fn needs_routing_facts(&self) -> bool {
        false
    }

    fn has_nat(&self, hook: Hook) -> bool {
        match hook {
            Hook::Prerouting => !self.dnat.is_empty(),
            Hook::Postrouting => !self.snat.is_empty(),
            _ => false,
        }
    }
}
