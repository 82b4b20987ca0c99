//! IPv6 next-hop resolution and neighbour unreachability detection (RFC
//! 4861 §7.2-7.3) for one worker: the NDP twin of [`crate::neigh`].
//!
//! The engine answers neighbor solicitations for the gateway's addresses and
//! drops a packet whose next hop has no link-layer address with
//! `no-neighbor`. This module does the rest:
//!
//! - **Learning** (§7.2.3, §7.2.5). Every received NDP frame is inspected
//!   before the engine sees it: a solicitation for one of the ingress
//!   interface's addresses teaches its source link-layer option, an
//!   advertisement its target link-layer option, when the address is on the
//!   link (link-local, or on one of the interface's prefixes).
//! - **Resolving** (§7.2.2). For a `no-neighbor` drop the missing next hop
//!   (from the engine, else from the frame's destination, then source) is
//!   solicited on its solicited-node group, at most once per [`RETRY`],
//!   [`TRIES`] times, while a copy of the frame is held ([`MAX_PENDING`] per
//!   next hop, [`MAX_TARGETS`] next hops). When the advertisement arrives
//!   the held frames are processed again; when resolution fails they are
//!   discarded.
//! - **Aging** (§7.3). A learnt entry not confirmed for [`REACHABLE`] is
//!   probed with unicast solicitations ([`TRIES`], [`RETRY`] apart); any
//!   solicitation or advertisement from the neighbour confirms it. When the
//!   probes go unanswered the entry is forgotten: the engine marks its
//!   adjacency unresolved and the next packet resolves it again. Static
//!   neighbours never age; a neighbour shared by another worker is aged by
//!   that worker, which tells the others when it forgets it.
//!
//! Limits: frames are assumed untagged, NDP messages without extension
//! headers; router advertisements and redirects are not acted upon (routes
//! are static).

use core::net::Ipv6Addr;
use std::collections::HashMap;

use sluice_engine::{IfIndex, Route6, RouteTable6};
use sluice_wire::ndp::{self, NdpRepr};

use crate::neigh::Todo;

/// Time between solicitations for one next hop (ns).
pub const RETRY: u64 = 1_000_000_000;
/// Solicitations before giving up (RFC 4861 MAX_MULTICAST_SOLICIT and
/// MAX_UNICAST_SOLICIT are 3).
pub const TRIES: u32 = 3;
/// How long a learnt entry stays usable without confirmation before it is
/// probed (RFC 4861 REACHABLE_TIME is 30 s).
pub const REACHABLE: u64 = 30_000_000_000;
/// Frames held per unresolved next hop.
pub const MAX_PENDING: usize = 16;
/// Next hops being resolved at once.
pub const MAX_TARGETS: usize = 256;

/// An interface as the resolver sees it.
#[derive(Clone, Debug, Default)]
pub struct Iface6 {
    /// MAC address (all zero: no interface behind this index).
    pub mac: [u8; 6],
    /// IPv6 addresses with prefix lengths, without the link-local one (it is
    /// derived from `mac`).
    pub addrs: Vec<(Ipv6Addr, u8)>,
}

impl Iface6 {
    fn link_local(&self) -> Option<u128> {
        (self.mac != [0; 6]).then(|| u128::from(ndp::link_local(self.mac)))
    }

    fn owns(&self, a: u128) -> bool {
        self.link_local() == Some(a) || self.addrs.iter().any(|&(x, _)| u128::from(x) == a)
    }

    fn on_link(&self, a: u128) -> bool {
        ndp::is_link_local(a)
            || self
                .addrs
                .iter()
                .any(|&(x, l)| l > 0 && (u128::from(x) ^ a) & crate::config::mask6(l) == 0)
    }

    /// Our address to solicit `target` from.
    fn source_for(&self, target: u128) -> Option<u128> {
        if ndp::is_link_local(target) {
            return self.link_local();
        }
        self.addrs
            .iter()
            .find(|&&(x, l)| (u128::from(x) ^ target) & crate::config::mask6(l) == 0)
            .or(self.addrs.first())
            .map(|&(x, _)| u128::from(x))
            .or_else(|| self.link_local())
    }
}

/// An NDP frame's addresses and message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NdpFrame {
    /// IPv6 source.
    pub src: u128,
    /// IPv6 destination.
    pub dst: u128,
    /// The validated message.
    pub msg: NdpRepr,
}

/// Parse an untagged Ethernet/IPv6/ICMPv6 NS or NA (no extension headers)
/// and validate it (RFC 4861 §7.1).
pub fn parse_ndp(f: &[u8]) -> Option<NdpFrame> {
    if f.get(12..14)? != [0x86, 0xdd] || *f.get(20)? != 58 {
        return None;
    }
    let plen = usize::from(u16::from_be_bytes([*f.get(18)?, *f.get(19)?]));
    let ty = *f.get(54)?;
    if ty != ndp::NEIGHBOR_SOLICIT && ty != ndp::NEIGHBOR_ADVERT {
        return None;
    }
    let src = u128::from_be_bytes(f.get(22..38)?.try_into().ok()?);
    let dst = u128::from_be_bytes(f.get(38..54)?.try_into().ok()?);
    let msg = ndp::parse(src, dst, *f.get(21)?, f.get(54..54 + plen)?).ok()?;
    Some(NdpFrame { src, dst, msg })
}

/// IPv6 source and destination of an untagged Ethernet/IPv6 frame.
pub fn ipv6_addrs(f: &[u8]) -> Option<(u128, u128)> {
    if f.get(12..14)? != [0x86, 0xdd] {
        return None;
    }
    Some((
        u128::from_be_bytes(f.get(22..38)?.try_into().ok()?),
        u128::from_be_bytes(f.get(38..54)?.try_into().ok()?),
    ))
}

/// Where a neighbour entry comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    /// Configured; never aged.
    Static,
    /// Learnt by this worker from an NDP frame; this worker ages it.
    Learnt,
    /// Learnt by another worker, which ages it and says when it is gone.
    Peer,
}

#[derive(Clone, Copy, Debug)]
struct Known {
    mac: [u8; 6],
    origin: Origin,
    confirmed: u64,
    probes: u32,
    last_probe: u64,
}

struct Target {
    tries: u32,
    last_sent: u64,
    frames: Vec<(IfIndex, Vec<u8>)>,
}

/// One worker's NDP resolver state.
pub struct Resolver6 {
    ifaces: Vec<Iface6>,
    routes: RouteTable6,
    known: HashMap<(IfIndex, u128), Known>,
    pending: HashMap<(IfIndex, u128), Target>,
}

impl Resolver6 {
    /// A resolver for engine interfaces `ifaces` (index = engine index) and
    /// static `routes` (connected routes come from the addresses, as in the
    /// engine).
    pub fn new(ifaces: Vec<Iface6>, routes: &[Route6]) -> Self {
        let rt = Self::table(&ifaces, routes);
        Self {
            ifaces,
            routes: rt,
            known: HashMap::new(),
            pending: HashMap::new(),
        }
    }

    fn table(ifaces: &[Iface6], routes: &[Route6]) -> RouteTable6 {
        let mut rt = RouteTable6::new();
        for (i, ifc) in ifaces.iter().enumerate() {
            for &(a, len) in &ifc.addrs {
                if !ndp::is_link_local(u128::from(a)) {
                    rt.add(Route6 {
                        net: u128::from(a),
                        len,
                        oif: i as IfIndex,
                        via: None,
                    });
                }
            }
        }
        for r in routes {
            rt.add(*r);
        }
        rt
    }

    /// Replace the static routes (a reload), as the engine does.
    pub fn set_routes(&mut self, routes: &[Route6]) {
        self.routes = Self::table(&self.ifaces, routes);
    }

    /// The interfaces' IPv6 addresses are now `addrs6` ((engine interface,
    /// address, prefix length); a reload), with the static `routes`, as in
    /// the engine (link-local addresses stay: they come from the MACs).
    /// Returns an unsolicited neighbor advertisement per new address (RFC
    /// 4861 §7.2.6: to all nodes, override set), so that its neighbours
    /// learn it at once.
    pub fn set_addrs(
        &mut self,
        addrs6: &[(IfIndex, Ipv6Addr, u8)],
        routes: &[Route6],
    ) -> Vec<(IfIndex, [u8; ndp::FRAME_LEN])> {
        let mut out = Vec::new();
        for (i, ifc) in self.ifaces.iter_mut().enumerate() {
            let new: Vec<(Ipv6Addr, u8)> = addrs6
                .iter()
                .filter(|&&(o, _, _)| usize::from(o) == i)
                .map(|&(_, a, l)| (a, l))
                .collect();
            if ifc.mac != [0; 6] {
                for &(a, _) in &new {
                    if ifc.addrs.iter().any(|&(b, _)| b == a) {
                        continue;
                    }
                    let mut f = [0u8; ndp::FRAME_LEN];
                    let all_nodes = u128::from(Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 1));
                    if ndp::build_na(
                        &mut f,
                        ifc.mac,
                        ndp::multicast_mac(all_nodes),
                        u128::from(a),
                        all_nodes,
                        ndp::FLAG_ROUTER | ndp::FLAG_OVERRIDE,
                    )
                    .is_some()
                    {
                        out.push((i as IfIndex, f));
                    }
                }
            }
            ifc.addrs = new;
        }
        self.routes = Self::table(&self.ifaces, routes);
        out
    }

    /// Neighbours known: (interface, address, MAC, static).
    pub fn known(&self) -> impl Iterator<Item = (IfIndex, Ipv6Addr, [u8; 6], bool)> + '_ {
        self.known
            .iter()
            .map(|(&(o, a), k)| (o, Ipv6Addr::from(a), k.mac, k.origin == Origin::Static))
    }

    /// Next hops being resolved and the frames held for them.
    pub fn pending(&self) -> (usize, usize) {
        (
            self.pending.len(),
            self.pending.values().map(|t| t.frames.len()).sum(),
        )
    }

    /// Record a neighbour at time `now` (a static entry stays static).
    /// Returns the frames held for it.
    pub fn set_known(
        &mut self,
        now: u64,
        oif: IfIndex,
        ip: Ipv6Addr,
        mac: [u8; 6],
        origin: Origin,
    ) -> Vec<(IfIndex, Vec<u8>)> {
        let a = u128::from(ip);
        let origin = match self.known.get(&(oif, a)) {
            Some(k) if k.origin == Origin::Static => Origin::Static,
            _ => origin,
        };
        self.known.insert(
            (oif, a),
            Known {
                mac,
                origin,
                confirmed: now,
                probes: 0,
                last_probe: 0,
            },
        );
        self.pending
            .remove(&(oif, a))
            .map(|t| t.frames)
            .unwrap_or_default()
    }

    /// An NDP frame received on `iif` at `now`: refresh what it confirms
    /// and return the neighbour to program (new or changed).
    pub fn learn(
        &mut self,
        now: u64,
        iif: IfIndex,
        f: &NdpFrame,
    ) -> Option<(IfIndex, Ipv6Addr, [u8; 6])> {
        let ifc = self.ifaces.get(usize::from(iif))?;
        let (who, mac) = match f.msg.msg_type {
            // §7.2.3: a solicitation for one of our addresses from a
            // specified source teaches that source.
            ndp::NEIGHBOR_SOLICIT if f.src != 0 && ifc.owns(f.msg.target) => (f.src, f.msg.lladdr),
            ndp::NEIGHBOR_ADVERT if !ifc.owns(f.msg.target) => (f.msg.target, f.msg.lladdr),
            _ => return None,
        };
        if !ifc.on_link(who) || ndp::is_multicast(who) {
            return None;
        }
        let k = self.known.get_mut(&(iif, who));
        match (k, mac) {
            (Some(k), Some(m)) if k.mac == m => {
                k.confirmed = now;
                k.probes = 0;
                None
            }
            // An advertisement without the option confirms reachability
            // (§7.2.5) but teaches nothing.
            (Some(k), None) => {
                if f.msg.flags & ndp::FLAG_SOLICITED != 0 {
                    k.confirmed = now;
                    k.probes = 0;
                }
                None
            }
            (Some(k), Some(_)) if k.origin == Origin::Static => None,
            // §7.2.5: an advertisement without the override flag does not
            // replace a known, different link-layer address.
            (Some(_), Some(_))
                if f.msg.msg_type == ndp::NEIGHBOR_ADVERT
                    && f.msg.flags & ndp::FLAG_OVERRIDE == 0 =>
            {
                None
            }
            (_, Some(m)) if m != [0; 6] && m[0] & 1 == 0 => Some((iif, Ipv6Addr::from(who), m)),
            _ => None,
        }
    }

    /// Interface `oif` was replaced by a new one with MAC `mac`: use it (the
    /// link-local address follows), and forget the neighbours behind it
    /// that were learnt (their MACs may have changed; the next packet to
    /// one solicits it again). Returns the forgotten addresses, for the
    /// engine.
    pub fn relink(&mut self, oif: IfIndex, mac: [u8; 6]) -> Vec<Ipv6Addr> {
        let Some(ifc) = self.ifaces.get_mut(usize::from(oif)) else {
            return Vec::new();
        };
        ifc.mac = mac;
        let mut gone: Vec<Ipv6Addr> = self
            .known
            .iter()
            .filter(|(&(o, _), k)| o == oif && k.origin != Origin::Static)
            .map(|(&(_, a), _)| Ipv6Addr::from(a))
            .collect();
        gone.sort_unstable();
        for a in &gone {
            self.known.remove(&(oif, u128::from(*a)));
        }
        gone
    }

    /// Forget `ip` on `oif` whatever its origin (a static neighbour taken
    /// out of the configuration); whether it was known.
    pub fn forget(&mut self, oif: IfIndex, ip: Ipv6Addr) -> bool {
        self.known.remove(&(oif, u128::from(ip))).is_some()
    }

    /// Another worker found `ip` unreachable: forget it if we only had it
    /// from a peer. Returns whether it was forgotten.
    pub fn forget_peer(&mut self, oif: IfIndex, ip: Ipv6Addr) -> bool {
        let k = (oif, u128::from(ip));
        if self.known.get(&k).is_some_and(|n| n.origin == Origin::Peer) {
            self.known.remove(&k);
            return true;
        }
        false
    }

    fn next_hop(&self, dst: u128) -> Option<(IfIndex, u128)> {
        let r = self.routes.lookup(dst)?;
        Some((r.oif, r.via.map_or(dst, u128::from)))
    }

    fn resolved(&self, k: &(IfIndex, u128)) -> bool {
        self.known.contains_key(k)
    }

    /// A frame dropped with `no-neighbor` on ingress `iif`: hold a copy and
    /// solicit the missing next hop (rate-limited). `hint` is the next hop
    /// the engine found missing.
    pub fn on_no_neighbor(
        &mut self,
        now: u64,
        iif: IfIndex,
        frame: &[u8],
        hint: Option<(IfIndex, Ipv6Addr)>,
        todo: &mut Todo,
    ) {
        let Some((src, dst)) = ipv6_addrs(frame) else {
            todo.dropped += 1;
            return;
        };
        let missing = hint
            .map(|(o, a)| (o, u128::from(a)))
            .into_iter()
            .chain([dst, src].into_iter().filter_map(|a| self.next_hop(a)))
            .find(|k| !self.resolved(k));
        let Some(key) = missing else {
            todo.dropped += 1;
            return;
        };
        if !self.pending.contains_key(&key) && self.pending.len() >= MAX_TARGETS {
            todo.dropped += 1;
            return;
        }
        let t = self.pending.entry(key).or_insert(Target {
            tries: 0,
            last_sent: 0,
            frames: Vec::new(),
        });
        if t.frames.len() < MAX_PENDING {
            t.frames.push((iif, frame.to_vec()));
        } else {
            todo.dropped += 1;
        }
        if t.tries == 0 {
            t.tries = 1;
            t.last_sent = now;
            if let Some(ns) = self.solicit(key.0, key.1, None) {
                todo.send6.push((key.0, ns));
            }
        }
    }

    fn solicit(
        &self,
        oif: IfIndex,
        target: u128,
        unicast: Option<[u8; 6]>,
    ) -> Option<[u8; ndp::FRAME_LEN]> {
        let ifc = self.ifaces.get(usize::from(oif))?;
        let src = ifc.source_for(target)?;
        let mut f = [0u8; ndp::FRAME_LEN];
        ndp::build_ns(&mut f, ifc.mac, src, target, unicast)?;
        Some(f)
    }

    /// Retransmit solicitations, give up on next hops that never answered,
    /// probe stale entries and forget unreachable ones (into
    /// `todo.forget6`).
    pub fn tick(&mut self, now: u64, todo: &mut Todo) {
        let mut give_up = Vec::new();
        let mut resend = Vec::new();
        for (k, t) in &mut self.pending {
            if now.saturating_sub(t.last_sent) < RETRY {
                continue;
            }
            if t.tries >= TRIES {
                give_up.push(*k);
            } else {
                t.tries += 1;
                t.last_sent = now;
                resend.push((*k, None));
            }
        }
        for k in give_up {
            if let Some(t) = self.pending.remove(&k) {
                todo.dropped += t.frames.len() as u64;
                tracing::debug!(next_hop = %Ipv6Addr::from(k.1), "NDP resolution failed");
            }
        }
        let mut forget = Vec::new();
        for (k, n) in &mut self.known {
            if n.origin != Origin::Learnt
                || now.saturating_sub(n.confirmed) < REACHABLE
                || now.saturating_sub(n.last_probe) < RETRY
            {
                continue;
            }
            if n.probes >= TRIES {
                forget.push(*k);
            } else {
                n.probes += 1;
                n.last_probe = now;
                resend.push((*k, Some(n.mac)));
            }
        }
        for k in forget {
            self.known.remove(&k);
            todo.forget6.push((k.0, Ipv6Addr::from(k.1)));
            tracing::debug!(neighbour = %Ipv6Addr::from(k.1), "IPv6 neighbour unreachable");
        }
        for ((oif, a), unicast) in resend {
            if let Some(ns) = self.solicit(oif, a, unicast) {
                todo.send6.push((oif, ns));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GW_MAC: [u8; 6] = [2, 0, 0, 0, 0, 2];
    const R_MAC: [u8; 6] = [2, 9, 9, 9, 9, 9];

    fn a(s: &str) -> u128 {
        u128::from(s.parse::<Ipv6Addr>().unwrap())
    }

    fn resolver() -> Resolver6 {
        Resolver6::new(
            vec![
                Iface6::default(),
                Iface6 {
                    mac: [2, 0, 0, 0, 0, 1],
                    addrs: vec![("fd00:1::1".parse().unwrap(), 64)],
                },
                Iface6 {
                    mac: GW_MAC,
                    addrs: vec![("2001:db8::1".parse().unwrap(), 64)],
                },
            ],
            &[Route6 {
                net: 0,
                len: 0,
                oif: 2,
                via: Some("fe80::1".parse().unwrap()),
            }],
        )
    }

    fn v6_frame(src: &str, dst: &str) -> Vec<u8> {
        let mut f = vec![0u8; 54];
        f[12] = 0x86;
        f[13] = 0xdd;
        f[22..38].copy_from_slice(&a(src).to_be_bytes());
        f[38..54].copy_from_slice(&a(dst).to_be_bytes());
        f
    }

    fn na(target: &str, mac: [u8; 6]) -> NdpFrame {
        let mut b = [0u8; 128];
        let n = ndp::build_na(
            &mut b,
            mac,
            GW_MAC,
            a(target),
            u128::from(ndp::link_local(GW_MAC)),
            ndp::FLAG_SOLICITED | ndp::FLAG_ROUTER,
        )
        .unwrap();
        parse_ndp(&b[..n]).expect("valid NA")
    }

    #[test]
    fn resolves_the_link_local_router_holds_frames_and_releases_them() {
        let mut r = resolver();
        let mut todo = Todo::default();
        let f = v6_frame("fd00:1::2", "2001:db8:5::5");
        r.on_no_neighbor(5, 1, &f, None, &mut todo);
        r.on_no_neighbor(6, 1, &f, None, &mut todo);
        assert_eq!(todo.send6.len(), 1, "rate-limited to one solicitation");
        let (oif, ns) = todo.send6[0];
        assert_eq!(oif, 2);
        let p = parse_ndp(&ns).expect("valid NS");
        assert_eq!(p.msg.target, a("fe80::1"));
        assert_eq!(p.dst, a("ff02::1:ff00:1"), "to the solicited-node group");
        assert_eq!(
            p.src,
            u128::from(ndp::link_local(GW_MAC)),
            "from our link-local address"
        );
        assert_eq!(p.msg.lladdr, Some(GW_MAC));
        assert_eq!(&ns[0..6], &[0x33, 0x33, 0xff, 0, 0, 1]);
        // Link-local addresses are per link: the same address advertised
        // on the inside is another neighbour and releases nothing.
        let (o, ip, mac) = r.learn(7, 1, &na("fe80::1", R_MAC)).unwrap();
        assert_eq!(o, 1);
        assert!(r.set_known(7, o, ip, mac, Origin::Learnt).is_empty());
        assert_eq!(r.pending(), (1, 2));
        // A global address off the interface's prefixes is not learnt.
        assert_eq!(r.learn(7, 1, &na("2001:db8:9::1", R_MAC)), None, "off-link");
        let (o, ip, mac) = r.learn(7, 2, &na("fe80::1", R_MAC)).unwrap();
        assert_eq!((o, ip, mac), (2, "fe80::1".parse().unwrap(), R_MAC));
        let held = r.set_known(7, o, ip, mac, Origin::Learnt);
        assert_eq!(held.len(), 2);
        assert_eq!(r.learn(8, 2, &na("fe80::1", R_MAC)), None, "already known");
        // Now the inside host is the missing next hop.
        let mut todo = Todo::default();
        r.on_no_neighbor(9, 1, &f, None, &mut todo);
        let p = parse_ndp(&todo.send6[0].1).unwrap();
        assert_eq!(p.msg.target, a("fd00:1::2"));
        assert_eq!(p.src, a("fd00:1::1"), "from our address on its prefix");
    }

    #[test]
    fn solicitations_for_us_teach_the_sender_others_do_not() {
        let mut r = resolver();
        let mut b = [0u8; 128];
        let host_mac = [2, 5, 5, 5, 5, 5];
        let n = ndp::build_ns(&mut b, host_mac, a("fd00:1::2"), a("fd00:1::1"), None).unwrap();
        let ns = parse_ndp(&b[..n]).unwrap();
        assert_eq!(
            r.learn(1, 1, &ns),
            Some((1, "fd00:1::2".parse().unwrap(), host_mac))
        );
        let n = ndp::build_ns(&mut b, host_mac, a("fd00:1::2"), a("fd00:1::3"), None).unwrap();
        assert_eq!(
            r.learn(1, 1, &parse_ndp(&b[..n]).unwrap()),
            None,
            "not our target"
        );
        // Off-link sources are not learnt.
        let n = ndp::build_ns(&mut b, host_mac, a("fd00:9::2"), a("fd00:1::1"), None).unwrap();
        assert_eq!(r.learn(1, 1, &parse_ndp(&b[..n]).unwrap()), None);
        // Tampered frames do not parse.
        let n = ndp::build_ns(&mut b, host_mac, a("fd00:1::2"), a("fd00:1::1"), None).unwrap();
        b[21] = 254;
        assert_eq!(parse_ndp(&b[..n]), None, "hop limit 254");
    }

    #[test]
    fn gives_up_after_tries() {
        let mut r = resolver();
        let mut todo = Todo::default();
        r.on_no_neighbor(0, 1, &v6_frame("fd00:1::2", "fd00:1::3"), None, &mut todo);
        for k in 1..=u64::from(TRIES) {
            r.tick(k * RETRY, &mut todo);
        }
        assert_eq!(todo.send6.len(), TRIES as usize);
        assert_eq!(todo.dropped, 1);
        assert_eq!(r.pending(), (0, 0));
    }

    #[test]
    fn a_replaced_interface_forgets_its_learnt_neighbours() {
        let mut r = resolver();
        r.set_known(0, 2, a6("fe80::1"), R_MAC, Origin::Learnt);
        r.set_known(0, 2, a6("fe80::7"), [2, 7, 0, 0, 0, 7], Origin::Peer);
        r.set_known(0, 2, a6("2001:db8::9"), [2, 9, 0, 0, 0, 9], Origin::Static);
        r.set_known(0, 1, a6("fd00:1::2"), [2, 1, 0, 0, 0, 2], Origin::Learnt);
        let new_mac = [2, 0, 0, 0, 7, 7];
        assert_eq!(r.relink(2, new_mac), vec![a6("fe80::1"), a6("fe80::7")]);
        let left: Vec<Ipv6Addr> = r.known().map(|(_, a, _, _)| a).collect();
        assert_eq!(left.len(), 2, "{left:?}");
        assert!(left.contains(&a6("2001:db8::9")) && left.contains(&a6("fd00:1::2")));
        assert_eq!(
            r.ifaces[2].link_local(),
            Some(u128::from(ndp::link_local(new_mac)))
        );
        assert!(r.relink(9, new_mac).is_empty(), "no such interface");
    }

    fn a6(s: &str) -> Ipv6Addr {
        s.parse().unwrap()
    }

    #[test]
    fn stale_entries_are_probed_then_forgotten_unless_confirmed() {
        let mut r = resolver();
        let ll: Ipv6Addr = "fe80::1".parse().unwrap();
        r.set_known(0, 2, ll, R_MAC, Origin::Learnt);
        r.set_known(
            0,
            1,
            "fd00:1::9".parse().unwrap(),
            [2, 1, 1, 1, 1, 1],
            Origin::Static,
        );
        let from_peer: Ipv6Addr = "fe80::7".parse().unwrap();
        r.set_known(0, 2, from_peer, [2, 7, 0, 0, 0, 7], Origin::Peer);
        let mut todo = Todo::default();
        r.tick(REACHABLE - 1, &mut todo);
        assert!(todo.send6.is_empty(), "fresh");
        // Stale: unicast probes to the known MAC, one per RETRY.
        r.tick(REACHABLE, &mut todo);
        r.tick(REACHABLE + 1, &mut todo);
        assert_eq!(todo.send6.len(), 1);
        assert_eq!(&todo.send6[0].1[0..6], &R_MAC, "unicast probe");
        let p = parse_ndp(&todo.send6[0].1).unwrap();
        assert_eq!(p.dst, a("fe80::1"));
        // An advertisement confirms it.
        assert_eq!(r.learn(REACHABLE + 2, 2, &na("fe80::1", R_MAC)), None);
        // One without the override flag does not change the address; one
        // with it does.
        let mut b = [0u8; 128];
        let ll_gw = u128::from(ndp::link_local(GW_MAC));
        let other = [2, 7, 7, 7, 7, 7];
        let n = ndp::build_na(
            &mut b,
            other,
            GW_MAC,
            a("fe80::1"),
            ll_gw,
            ndp::FLAG_SOLICITED,
        )
        .unwrap();
        assert_eq!(
            r.learn(REACHABLE + 2, 2, &parse_ndp(&b[..n]).unwrap()),
            None
        );
        let n = ndp::build_na(
            &mut b,
            other,
            GW_MAC,
            a("fe80::1"),
            ll_gw,
            ndp::FLAG_OVERRIDE,
        )
        .unwrap();
        assert_eq!(
            r.learn(REACHABLE + 2, 2, &parse_ndp(&b[..n]).unwrap()),
            Some((2, ll, other))
        );
        let mut todo = Todo::default();
        r.tick(REACHABLE + RETRY, &mut todo);
        assert!(todo.send6.is_empty(), "confirmed again");
        // Unanswered probes: forgotten, the static entry stays.
        let t0 = 2 * REACHABLE + 2;
        for k in 0..=u64::from(TRIES) {
            r.tick(t0 + k * RETRY, &mut todo);
        }
        assert_eq!(todo.send6.len(), TRIES as usize);
        assert_eq!(
            todo.forget6,
            vec![(2, ll)],
            "peers' entries are the peers' to age"
        );
        let mut left: Vec<_> = r.known().map(|k| (k.1, k.3)).collect();
        left.sort();
        assert_eq!(
            left,
            vec![("fd00:1::9".parse().unwrap(), true), (from_peer, false)],
            "static neighbours never age"
        );
        assert!(
            !r.forget_peer(1, "fd00:1::9".parse().unwrap()),
            "static stays"
        );
        assert!(r.forget_peer(2, from_peer));
        assert_eq!(r.known().count(), 1);
    }

    /// New IPv6 addresses (a reload): an unsolicited advertisement for each
    /// new one only (to all nodes, override set, not solicited), and the new
    /// subnet is on-link.
    #[test]
    fn new_addresses_are_advertised_and_routed() {
        let mut r = resolver();
        let v6 = vec![
            (1, "fd00:1::1".parse().unwrap(), 64),
            (1, "fd00:9::1".parse().unwrap(), 64),
            (2, "2001:db8::1".parse().unwrap(), 64),
        ];
        let out = r.set_addrs(&v6, &[]);
        assert_eq!(out.len(), 1);
        let (oif, f) = out[0];
        assert_eq!(oif, 1);
        let p = parse_ndp(&f).expect("a valid NA");
        assert_eq!(p.dst, a("ff02::1"));
        assert_eq!(p.msg.msg_type, ndp::NEIGHBOR_ADVERT);
        assert_eq!(p.msg.target, a("fd00:9::1"));
        assert_eq!(p.msg.lladdr, Some([2, 0, 0, 0, 0, 1]));
        assert_eq!(p.msg.flags & ndp::FLAG_SOLICITED, 0);
        assert_ne!(p.msg.flags & ndp::FLAG_OVERRIDE, 0);
        assert_eq!(r.next_hop(a("fd00:9::7")), Some((1, a("fd00:9::7"))));
        assert!(
            r.set_addrs(&v6, &[]).is_empty(),
            "nothing new the second time"
        );
    }
}
