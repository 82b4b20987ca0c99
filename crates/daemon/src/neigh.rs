//! Next-hop resolution (RFC 826 ARP) for one worker.
//!
//! The engine answers ARP requests for the gateway's own addresses and drops
//! a packet whose next hop has no MAC yet with `no-neighbor`. This module
//! does the rest:
//!
//! - **Learning.** Every received ARP frame is inspected before the engine
//!   sees it. The sender is learnt when it is on a connected subnet of the
//!   ingress interface and the frame is a reply, or a request for one of our
//!   addresses (RFC 826 "merge" rule, restricted to what concerns us).
//! - **Resolving.** For a `no-neighbor` drop, the next hops of the packet's
//!   destination and source are looked up in the same route table the engine
//!   uses; for one that is unknown an ARP request is sent (at most one per
//!   [`RETRY`] per next hop, [`TRIES`] times) and a copy of the frame is held
//!   ([`MAX_PENDING`] per next hop, [`MAX_TARGETS`] next hops). When the
//!   reply arrives the held frames are handed back to be processed again;
//!   when resolution fails they are discarded.
//!
//! Limits: no aging or re-validation of learnt entries (a changed MAC is
//! picked up from the next ARP frame the neighbour sends); the next hop of a
//! DNAT'd packet is taken from its pre-translation destination; frames are
//! assumed untagged (no VLAN).

use core::net::Ipv4Addr;
use std::collections::HashMap;

use sluice_engine::{IfIndex, Route4, RouteTable4};

/// How long between ARP requests for one next hop (ns).
pub const RETRY: u64 = 1_000_000_000;
/// Requests before giving up (the held frames are then dropped).
pub const TRIES: u32 = 3;
/// Frames held per unresolved next hop.
pub const MAX_PENDING: usize = 16;
/// Next hops being resolved at once.
pub const MAX_TARGETS: usize = 256;

const ETH_ARP: u16 = 0x0806;

/// An ARP frame's interesting fields.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Arp {
    /// 1 request, 2 reply.
    pub op: u16,
    /// Sender hardware address.
    pub sha: [u8; 6],
    /// Sender protocol address.
    pub spa: Ipv4Addr,
    /// Target protocol address.
    pub tpa: Ipv4Addr,
}

fn be16(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes([*b.get(at)?, *b.get(at + 1)?]))
}

fn ip_at(b: &[u8], at: usize) -> Option<Ipv4Addr> {
    let s = b.get(at..at + 4)?;
    Some(Ipv4Addr::new(
        *s.first()?,
        *s.get(1)?,
        *s.get(2)?,
        *s.get(3)?,
    ))
}

/// Parse an untagged Ethernet/IPv4 ARP frame (RFC 826).
pub fn parse_arp(f: &[u8]) -> Option<Arp> {
    if be16(f, 12)? != ETH_ARP
        || be16(f, 14)? != 1
        || be16(f, 16)? != 0x0800
        || *f.get(18)? != 6
        || *f.get(19)? != 4
    {
        return None;
    }
    let mut sha = [0u8; 6];
    sha.copy_from_slice(f.get(22..28)?);
    Some(Arp {
        op: be16(f, 20)?,
        sha,
        spa: ip_at(f, 28)?,
        tpa: ip_at(f, 38)?,
    })
}

/// Build a broadcast ARP request (42 bytes, padded to 60).
pub fn arp_request(src_mac: [u8; 6], spa: Ipv4Addr, tpa: Ipv4Addr) -> [u8; 60] {
    let mut f = [0u8; 60];
    let mut w = Vec::with_capacity(42);
    w.extend_from_slice(&[0xff; 6]);
    w.extend_from_slice(&src_mac);
    w.extend_from_slice(&ETH_ARP.to_be_bytes());
    w.extend_from_slice(&[0, 1, 8, 0, 6, 4, 0, 1]);
    w.extend_from_slice(&src_mac);
    w.extend_from_slice(&spa.octets());
    w.extend_from_slice(&[0; 6]);
    w.extend_from_slice(&tpa.octets());
    if let Some(d) = f.get_mut(..w.len()) {
        d.copy_from_slice(&w);
    }
    f
}

/// IPv4 source and destination of an untagged Ethernet/IPv4 frame.
pub fn ipv4_addrs(f: &[u8]) -> Option<(Ipv4Addr, Ipv4Addr)> {
    if be16(f, 12)? != 0x0800 {
        return None;
    }
    Some((ip_at(f, 26)?, ip_at(f, 30)?))
}

/// An interface as the resolver sees it (engine index, MAC, addresses).
#[derive(Clone, Debug)]
pub struct NeighIface {
    /// MAC address.
    pub mac: [u8; 6],
    /// IPv4 addresses with prefix lengths.
    pub addrs: Vec<(Ipv4Addr, u8)>,
}

struct Target {
    oif: IfIndex,
    tries: u32,
    last_sent: u64,
    frames: Vec<(IfIndex, Vec<u8>)>,
}

/// What the worker must do after [`Resolver::on_no_neighbor`] or [`Resolver::tick`].
#[derive(Debug, Default)]
pub struct Todo {
    /// ARP requests to send: (engine interface, frame).
    pub send: Vec<(IfIndex, [u8; 60])>,
    /// Neighbor solicitations to send: (engine interface, frame).
    pub send6: Vec<(IfIndex, [u8; sluice_wire::ndp::FRAME_LEN])>,
    /// IPv6 neighbours that stopped answering: (engine interface, address).
    pub forget6: Vec<(IfIndex, core::net::Ipv6Addr)>,
    /// Held frames dropped because resolution failed or a queue was full.
    pub dropped: u64,
}

/// One worker's resolver state.
pub struct Resolver {
    ifaces: Vec<NeighIface>,
    routes: RouteTable4,
    known: HashMap<Ipv4Addr, [u8; 6]>,
    pending: HashMap<Ipv4Addr, Target>,
}

impl Resolver {
    /// A resolver for engine interfaces `ifaces` (index = engine index) and
    /// static `routes` (connected routes are derived from the addresses,
    /// exactly as the engine does).
    pub fn new(ifaces: Vec<NeighIface>, routes: &[Route4]) -> Self {
        let rt = Self::table(&ifaces, routes);
        Self {
            ifaces,
            routes: rt,
            known: HashMap::new(),
            pending: HashMap::new(),
        }
    }

    fn table(ifaces: &[NeighIface], routes: &[Route4]) -> RouteTable4 {
        let mut rt = RouteTable4::new();
        for (i, ifc) in ifaces.iter().enumerate() {
            for &(a, len) in &ifc.addrs {
                rt.add(Route4 {
                    net: u32::from(a),
                    len,
                    oif: i as IfIndex,
                    via: None,
                });
            }
        }
        for r in routes {
            rt.add(*r);
        }
        rt
    }

    /// Replace the static routes (a reload), as the engine does.
    pub fn set_routes(&mut self, routes: &[Route4]) {
        self.routes = Self::table(&self.ifaces, routes);
    }

    /// The interfaces' IPv4 addresses are now `addrs` (engine index; a
    /// reload), with the static `routes` (the connected ones follow), as
    /// in the engine. Returns a gratuitous ARP request per new address, so
    /// that its neighbours learn it at once.
    pub fn set_addrs(
        &mut self,
        addrs: &[Vec<(Ipv4Addr, u8)>],
        routes: &[Route4],
    ) -> Vec<(IfIndex, [u8; 60])> {
        let mut out = Vec::new();
        for (i, ifc) in self.ifaces.iter_mut().enumerate() {
            let new = addrs.get(i).cloned().unwrap_or_default();
            if ifc.mac != [0; 6] {
                for &(a, _) in &new {
                    if !ifc.addrs.iter().any(|&(b, _)| b == a) {
                        out.push((i as IfIndex, arp_request(ifc.mac, a, a)));
                    }
                }
            }
            ifc.addrs = new;
        }
        self.routes = Self::table(&self.ifaces, routes);
        out
    }

    /// Forget `ip` (a static neighbour taken out of the configuration);
    /// whether it was known.
    pub fn forget(&mut self, ip: Ipv4Addr) -> bool {
        self.known.remove(&ip).is_some()
    }

    /// Neighbours known (static or learnt).
    pub fn known(&self) -> impl Iterator<Item = (&Ipv4Addr, &[u8; 6])> {
        self.known.iter()
    }

    /// Next hops being resolved and the frames held for them.
    pub fn pending(&self) -> (usize, usize) {
        (
            self.pending.len(),
            self.pending.values().map(|t| t.frames.len()).sum(),
        )
    }

    /// Record a neighbour known from elsewhere (static config, another worker).
    /// Returns frames held for it, to process again.
    pub fn set_known(&mut self, ip: Ipv4Addr, mac: [u8; 6]) -> Vec<(IfIndex, Vec<u8>)> {
        self.known.insert(ip, mac);
        self.pending
            .remove(&ip)
            .map(|t| t.frames)
            .unwrap_or_default()
    }

    fn is_local(&self, ip: Ipv4Addr) -> bool {
        self.ifaces
            .iter()
            .any(|i| i.addrs.iter().any(|&(a, _)| a == ip))
    }

    /// An ARP frame received on `iif`: the neighbour to learn, if any
    /// (new or changed).
    pub fn learn(&self, iif: IfIndex, arp: &Arp) -> Option<(Ipv4Addr, [u8; 6])> {
        let ifc = self.ifaces.get(usize::from(iif))?;
        let on_link = ifc.addrs.iter().any(|&(a, l)| {
            l > 0
                && u32::from(a) & crate::config::mask(l)
                    == u32::from(arp.spa) & crate::config::mask(l)
        });
        let concerns_us = arp.op == 2 || (arp.op == 1 && self.is_local(arp.tpa));
        if !on_link
            || !concerns_us
            || arp.spa.is_unspecified()
            || self.is_local(arp.spa)
            || arp.sha == [0; 6]
            || arp.sha[0] & 1 == 1
        {
            return None;
        }
        match self.known.get(&arp.spa) {
            Some(m) if *m == arp.sha => None,
            _ => Some((arp.spa, arp.sha)),
        }
    }

    /// The next hop and egress interface for `dst`.
    fn next_hop(&self, dst: Ipv4Addr) -> Option<(IfIndex, Ipv4Addr)> {
        let r = self.routes.lookup(u32::from(dst))?;
        Some((r.oif, r.via.unwrap_or(dst)))
    }

    /// A frame dropped with `no-neighbor` on ingress `iif`: hold a copy and
    /// ask for the missing next hop (rate-limited). `hint` is the next hop
    /// the engine found missing (egress interface, address), which after
    /// DNAT or hairpinning is not where the frame's own addresses lead;
    /// without it the frame's destination, then its source, is resolved.
    pub fn on_no_neighbor(
        &mut self,
        now: u64,
        iif: IfIndex,
        frame: &[u8],
        hint: Option<(IfIndex, Ipv4Addr)>,
        todo: &mut Todo,
    ) {
        let Some((src, dst)) = ipv4_addrs(frame) else {
            todo.dropped += 1;
            return;
        };
        let missing = hint
            .into_iter()
            .chain([dst, src].into_iter().filter_map(|a| self.next_hop(a)))
            .find(|(_, nh)| !self.known.contains_key(nh));
        let Some((oif, nh)) = missing else {
            // Both next hops are known (a DNAT target, or a race with
            // learning): nothing to resolve.
            todo.dropped += 1;
            return;
        };
        if !self.pending.contains_key(&nh) && self.pending.len() >= MAX_TARGETS {
            todo.dropped += 1;
            return;
        }
        let t = self.pending.entry(nh).or_insert(Target {
            oif,
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
            if let Some(req) = self.request(oif, nh) {
                todo.send.push((oif, req));
            }
        }
    }

    fn request(&self, oif: IfIndex, tpa: Ipv4Addr) -> Option<[u8; 60]> {
        let ifc = self.ifaces.get(usize::from(oif))?;
        let spa = ifc
            .addrs
            .iter()
            .find(|&&(a, l)| {
                u32::from(a) & crate::config::mask(l) == u32::from(tpa) & crate::config::mask(l)
            })
            .or(ifc.addrs.first())
            .map(|&(a, _)| a)?;
        Some(arp_request(ifc.mac, spa, tpa))
    }

    /// Interface `oif` was replaced by a new one with MAC `mac`: use it, and
    /// return the ARP requests to send out of it: a gratuitous one per
    /// address (so that neighbours learn the new MAC) and a probe of every
    /// known neighbour behind it (its MAC may have changed too; the reply
    /// updates it through [`Resolver::learn`]).
    pub fn relink(&mut self, oif: IfIndex, mac: [u8; 6]) -> Vec<[u8; 60]> {
        let Some(ifc) = self.ifaces.get_mut(usize::from(oif)) else {
            return Vec::new();
        };
        ifc.mac = mac;
        let mut out: Vec<[u8; 60]> = ifc
            .addrs
            .iter()
            .map(|&(a, _)| arp_request(mac, a, a))
            .collect();
        let mut behind: Vec<Ipv4Addr> = self
            .known
            .keys()
            .copied()
            .filter(|&ip| {
                self.next_hop(ip)
                    .is_some_and(|(o, nh)| o == oif && nh == ip)
            })
            .collect();
        behind.sort_unstable();
        out.extend(behind.into_iter().filter_map(|ip| self.request(oif, ip)));
        out
    }

    /// Retransmit requests and give up on next hops that never answered.
    pub fn tick(&mut self, now: u64, todo: &mut Todo) {
        let mut give_up = Vec::new();
        let mut resend = Vec::new();
        for (ip, t) in &mut self.pending {
            if now.saturating_sub(t.last_sent) < RETRY {
                continue;
            }
            if t.tries >= TRIES {
                give_up.push(*ip);
            } else {
                t.tries += 1;
                t.last_sent = now;
                resend.push((t.oif, *ip));
            }
        }
        for ip in give_up {
            if let Some(t) = self.pending.remove(&ip) {
                todo.dropped += t.frames.len() as u64;
                tracing::debug!(next_hop = %ip, "ARP resolution failed");
            }
        }
        for (oif, ip) in resend {
            if let Some(req) = self.request(oif, ip) {
                todo.send.push((oif, req));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resolver() -> Resolver {
        Resolver::new(
            vec![
                NeighIface {
                    mac: [0; 6],
                    addrs: vec![],
                },
                NeighIface {
                    mac: [2, 0, 0, 0, 0, 1],
                    addrs: vec![(Ipv4Addr::new(10, 0, 0, 1), 24)],
                },
                NeighIface {
                    mac: [2, 0, 0, 0, 0, 2],
                    addrs: vec![(Ipv4Addr::new(203, 0, 113, 1), 24)],
                },
            ],
            &[Route4 {
                net: 0,
                len: 0,
                oif: 2,
                via: Some(Ipv4Addr::new(203, 0, 113, 254)),
            }],
        )
    }

    #[test]
    fn a_replaced_interface_announces_itself_and_probes_its_neighbours() {
        let mut r = resolver();
        let gw = Ipv4Addr::new(203, 0, 113, 254);
        let host = Ipv4Addr::new(10, 0, 0, 2);
        r.set_known(gw, [2, 0, 0, 0, 9, 9]);
        r.set_known(host, [2, 0, 0, 0, 8, 8]);
        let new_mac = [2, 0, 0, 0, 7, 7];
        let out = r.relink(2, new_mac);
        let arps: Vec<Arp> = out.iter().map(|f| parse_arp(f).expect("ARP")).collect();
        assert_eq!(arps.len(), 2, "{arps:?}");
        // Gratuitous: who-has our own address, from the new MAC.
        assert_eq!(arps[0].op, 1);
        assert_eq!(
            (arps[0].spa, arps[0].tpa),
            (Ipv4Addr::new(203, 0, 113, 1), Ipv4Addr::new(203, 0, 113, 1))
        );
        assert_eq!(arps[0].sha, new_mac);
        assert_eq!(&out[0][6..12], &new_mac, "Ethernet source");
        // The known next hop behind it is probed; the host on the other
        // interface is not.
        assert_eq!(
            (arps[1].spa, arps[1].tpa),
            (Ipv4Addr::new(203, 0, 113, 1), gw)
        );
        // A reply with a new MAC is learnt.
        let reply = Arp {
            op: 2,
            sha: [2, 0, 0, 0, 6, 6],
            spa: gw,
            tpa: Ipv4Addr::new(203, 0, 113, 1),
        };
        assert_eq!(r.learn(2, &reply), Some((gw, [2, 0, 0, 0, 6, 6])));
        assert!(r.relink(9, new_mac).is_empty(), "no such interface");
    }

    fn ipv4_frame(src: [u8; 4], dst: [u8; 4]) -> Vec<u8> {
        let mut f = vec![0u8; 34];
        f[12] = 8;
        f[26..30].copy_from_slice(&src);
        f[30..34].copy_from_slice(&dst);
        f
    }

    #[test]
    fn request_parses_back() {
        let f = arp_request(
            [2, 0, 0, 0, 0, 2],
            Ipv4Addr::new(203, 0, 113, 1),
            Ipv4Addr::new(203, 0, 113, 254),
        );
        let a = parse_arp(&f).unwrap();
        assert_eq!(a.op, 1);
        assert_eq!(a.sha, [2, 0, 0, 0, 0, 2]);
        assert_eq!(a.spa, Ipv4Addr::new(203, 0, 113, 1));
        assert_eq!(a.tpa, Ipv4Addr::new(203, 0, 113, 254));
        assert!(parse_arp(&f[..30]).is_none());
        assert!(parse_arp(&[]).is_none());
    }

    #[test]
    fn resolves_gateway_holds_frames_and_releases_them() {
        let mut r = resolver();
        let mut todo = Todo::default();
        let f = ipv4_frame([10, 0, 0, 2], [8, 8, 8, 8]);
        r.on_no_neighbor(5, 1, &f, None, &mut todo);
        r.on_no_neighbor(6, 1, &f, None, &mut todo);
        assert_eq!(todo.send.len(), 1, "rate-limited to one request");
        let (oif, req) = todo.send[0];
        assert_eq!(oif, 2);
        assert_eq!(
            parse_arp(&req).unwrap().tpa,
            Ipv4Addr::new(203, 0, 113, 254)
        );
        let reply = Arp {
            op: 2,
            sha: [2, 9, 9, 9, 9, 9],
            spa: Ipv4Addr::new(203, 0, 113, 254),
            tpa: Ipv4Addr::new(203, 0, 113, 1),
        };
        assert_eq!(r.learn(1, &reply), None, "wrong interface");
        let (ip, mac) = r.learn(2, &reply).unwrap();
        let held = r.set_known(ip, mac);
        assert_eq!(held.len(), 2);
        assert_eq!(r.learn(2, &reply), None, "already known");
        // Now the source side is the missing one.
        let mut todo = Todo::default();
        r.on_no_neighbor(7, 1, &f, None, &mut todo);
        assert_eq!(
            parse_arp(&todo.send[0].1).unwrap().tpa,
            Ipv4Addr::new(10, 0, 0, 2)
        );
    }

    /// Regression: a frame to a DNAT'd address was dropped without an ARP
    /// request when both of its own addresses' next hops were known.
    #[test]
    fn dnat_target_is_resolved_from_the_engine_hint() {
        let mut r = resolver();
        r.set_known(Ipv4Addr::new(203, 0, 113, 254), [2, 9, 9, 9, 9, 9]);
        r.set_known(Ipv4Addr::new(10, 0, 0, 2), [2, 8, 8, 8, 8, 8]);
        let f = ipv4_frame([10, 0, 0, 2], [8, 8, 8, 8]);
        let mut todo = Todo::default();
        r.on_no_neighbor(0, 2, &f, None, &mut todo);
        assert!(todo.send.is_empty());
        assert_eq!(todo.dropped, 1);
        let hint = Some((1, Ipv4Addr::new(10, 0, 0, 3)));
        r.on_no_neighbor(0, 2, &f, hint, &mut todo);
        assert_eq!(todo.send.len(), 1);
        assert_eq!(todo.send[0].0, 1);
        assert_eq!(
            parse_arp(&todo.send[0].1).unwrap().tpa,
            Ipv4Addr::new(10, 0, 0, 3)
        );
        let held = r.set_known(Ipv4Addr::new(10, 0, 0, 3), [2, 7, 7, 7, 7, 7]);
        assert_eq!(held.len(), 1);
    }

    #[test]
    fn gives_up_after_tries() {
        let mut r = resolver();
        let mut todo = Todo::default();
        r.on_no_neighbor(
            0,
            1,
            &ipv4_frame([10, 0, 0, 2], [10, 0, 0, 3]),
            None,
            &mut todo,
        );
        for k in 1..=TRIES as u64 {
            r.tick(k * RETRY, &mut todo);
        }
        assert_eq!(todo.send.len(), TRIES as usize);
        assert_eq!(todo.dropped, 1);
        assert_eq!(r.pending(), (0, 0));
    }

    #[test]
    fn requests_for_us_teach_the_sender_but_others_do_not() {
        let r = resolver();
        let mut a = Arp {
            op: 1,
            sha: [2, 5, 5, 5, 5, 5],
            spa: Ipv4Addr::new(10, 0, 0, 2),
            tpa: Ipv4Addr::new(10, 0, 0, 1),
        };
        assert!(r.learn(1, &a).is_some());
        a.tpa = Ipv4Addr::new(10, 0, 0, 3);
        assert!(r.learn(1, &a).is_none());
    }

    /// New addresses (a reload): a gratuitous ARP for each new one only,
    /// and the new connected subnet is on-link (its hosts resolved from
    /// the new address), the removed one no longer.
    #[test]
    fn new_addresses_are_announced_and_routed() {
        let mut r = resolver();
        let v4 = vec![
            vec![],
            vec![
                (Ipv4Addr::new(10, 0, 0, 1), 24),
                (Ipv4Addr::new(192, 168, 50, 1), 24),
            ],
            vec![],
        ];
        let out = r.set_addrs(&v4, &[]);
        assert_eq!(out.len(), 1);
        let (oif, f) = out[0];
        assert_eq!(oif, 1);
        assert_eq!(&f[28..32], &[192, 168, 50, 1], "sender");
        assert_eq!(&f[38..42], &[192, 168, 50, 1], "target: gratuitous");
        assert_eq!(
            r.next_hop(Ipv4Addr::new(192, 168, 50, 9)),
            Some((1, Ipv4Addr::new(192, 168, 50, 9)))
        );
        let req = r.request(1, Ipv4Addr::new(192, 168, 50, 9)).unwrap();
        assert_eq!(
            &req[28..32],
            &[192, 168, 50, 1],
            "asked from the new address"
        );
        assert_eq!(
            r.next_hop(Ipv4Addr::new(203, 0, 113, 9)),
            None,
            "203.0.113.0/24 gone"
        );
        assert!(
            r.set_addrs(&v4, &[]).is_empty(),
            "nothing new the second time"
        );
    }
}
