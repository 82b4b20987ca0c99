//! IPv6: forwarding and filtering with neighbor discovery. No NAT66: NAT
//! decisions of `inet` tables are ignored for IPv6 packets.
//!
//! IPv6 connections live in a table of their own (`Table<FlowKey6, _>`,
//! preallocated for [`EngineConfig::ct6_max`], bounded probing, no
//! allocation after construction), with one adjacency cached per direction.
//! A packet of a known connection is forwarded on that adjacency after the
//! conntrack state machine accepted it: hop limit decremented (IPv6 has no
//! header checksum, and nothing else changes), MACs rewritten. The first
//! packet of a connection runs prerouting -> routing (longest prefix match)
//! -> hop limit and MTU checks -> forward -> postrouting filter chains, as
//! the kernel's `ip6_forward` does.
//!
//! Addressed to the gateway: neighbor solicitations for the ingress
//! interface's addresses (its EUI-64 link-local address included, to the
//! address itself or its solicited-node group) are answered with a
//! neighbor advertisement (RFC 4861 §7.2.4), echo requests with echo
//! replies (RFC 4443 §4.2). Both pass the input hook first, as in the
//! kernel. Learning link-layer addresses and resolving next hops is the
//! caller's job (the daemon's resolver), as for ARP.
//!
//! Routers never fragment IPv6 (RFC 8200 §5): a packet larger than the
//! egress MTU is answered with packet too big (RFC 4443 §3.2) carrying the
//! MTU, a packet whose hop limit would reach 0 with time exceeded (§3.3),
//! both rate-limited by the worker's ICMP token bucket and never about an
//! ICMPv6 error or to a non-unicast source (§2.4 (e)).

use super::*;
use sluice_wire::flow::FlowKey6;
use sluice_wire::ndp;

/// RFC 4443 §2.4 (c): an ICMPv6 error must fit in the minimum IPv6 MTU.
const MIN_MTU6: usize = 1280;
/// The hop limit of packets the gateway originates.
const HOP_LIMIT: u8 = 64;
/// ff02::1, all nodes.
const ALL_NODES: u128 = 0xff02_0000_0000_0000_0000_0000_0000_0001;

/// Per-connection data of an IPv6 entry: the adjacency of each direction
/// (index 0 original, 1 reply). Without NAT there is nothing else to cache.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FlowInfo6 {
    pub(super) adj: [AdjIndex; 2],
}

impl FlowInfo6 {
    /// The adjacency packets of direction `dir` leave through.
    pub fn adjacency(&self, dir: Dir) -> AdjIndex {
        self.adj.get(dir_index(dir)).copied().unwrap_or(0)
    }
}

/// What forwarding a packet needs to know about it, from [`dissect`] or
/// [`sluice_wire::dissect_plain6`].
#[derive(Clone, Copy, Debug)]
pub(super) struct Pkt6 {
    /// Offset of the IPv6 header.
    pub(super) l3: usize,
    /// Offset of the upper-layer header (past any extension headers).
    pub(super) l4: usize,
    pub(super) hop_limit: u8,
    pub(super) payload_len: u16,
    /// The conntrack event of the packet.
    pub(super) ev: L4Event,
    /// An ICMPv6 error (or redirect): never answered with an error.
    pub(super) about_error: bool,
    /// The first fragment of a datagram (a fragment header with offset 0
    /// and M set): its later fragments follow it ([`super::frag`]).
    pub(super) first_frag: bool,
}

impl Pkt6 {
    pub(super) fn of(d: &Dissect, hop_limit: u8, payload_len: u16) -> Self {
        Pkt6 {
            l3: usize::from(d.l3_off),
            l4: usize::from(d.l4_off),
            hop_limit,
            payload_len,
            ev: l4_event6(d),
            about_error: match d.l4 {
                L4::IcmpError { .. } => true,
                L4::IcmpOther { ty, .. } => ty < 128 || ty == ndp::REDIRECT,
                _ => false,
            },
            first_frag: d.frag() == sluice_wire::ip::Frag::First,
        }
    }

    /// A frame accepted by `dissect_plain6`.
    pub(super) fn plain(p: &sluice_wire::Plain6) -> Self {
        let ev = match p.key.proto {
            proto::TCP => L4Event::Tcp(TcpFlags(p.l4_byte)),
            proto::UDP => L4Event::Udp,
            _ => L4Event::Icmp {
                request: icmp_is_query_request(true, p.l4_byte),
            },
        };
        Pkt6 {
            l3: usize::from(sluice_wire::Plain6::L3_OFF),
            l4: usize::from(sluice_wire::Plain6::L4_OFF),
            hop_limit: p.hop_limit,
            payload_len: p.payload_len,
            ev,
            about_error: false,
            first_frag: false,
        }
    }
}

/// IPv6 addresses with their interfaces and prefix lengths.
pub(super) type Addrs6 = Vec<(IfIndex, u128, u8)>;

/// The IPv6 addresses of `ifaces` with `addrs6`: each interface's EUI-64
/// link-local address first, then `addrs6` (checked against the
/// interfaces).
fn addr_list(
    ifaces: &[super::Interface],
    addrs6: &[(IfIndex, Ipv6Addr, u8)],
) -> Result<Addrs6, EngineError> {
    let count = ifaces.len();
    let mut addrs = Vec::new();
    for (i, ifc) in ifaces.iter().enumerate() {
        if ifc.mac != [0; 6] {
            let ll = u128::from(ndp::link_local(ifc.mac));
            addrs.push((i as IfIndex, ll, 64));
        }
    }
    for &(oif, a, len) in addrs6 {
        if usize::from(oif) >= count {
            return Err(EngineError::Interface6 {
                what: "address",
                net: a,
                len,
                oif,
                count,
            });
        }
        addrs.push((oif, u128::from(a), len.min(128)));
    }
    Ok(addrs)
}

/// The IPv6 part of a worker.
pub(super) struct State {
    pub(super) ct: Table<FlowKey6, FlowInfo6>,
    /// Addresses per interface with prefix lengths, link-local ones first.
    addrs: Vec<(IfIndex, u128, u8)>,
    routes: RouteTable6,
    neigh: HashMap<(IfIndex, u128), AdjIndex>,
    /// The next hop the current frame's `no-neighbor` drop is waiting for.
    pub(super) missing_nh: Option<(IfIndex, u128)>,
    /// Datagrams whose first fragment was forwarded, to the adjacency it
    /// left by ([`super::frag`]).
    pub(super) frags: super::frag::FragTable<super::frag::DatagramId6, AdjIndex>,
}

impl State {
    pub(super) fn new(cfg: &EngineConfig) -> Result<Self, EngineError> {
        let max = u32::try_from(cfg.ct6_max).map_err(|_| EngineError::CtMax(cfg.ct6_max))?;
        let cap = cfg.ct6_capacity();
        let mut ctc = ct::Config::new(max.max(1), cfg.seed ^ 0x6666_6666_6666_6666);
        ctc.capacity = u32::try_from(cap)
            .map_err(|_| EngineError::CtMax(cap))?
            .max(1);
        ctc.timeouts = cfg.timeouts;
        ctc.prefault_index = cfg.ct_prefault_index;
        let table = Table::new(ctc)?;
        let count = cfg.interfaces.len();
        let addrs = addr_list(&cfg.interfaces, &cfg.addrs6)?;
        let routes = route_table6(&addrs, count, &cfg.routes6)?;
        for &(oif, a, _) in &cfg.neighbors6 {
            if usize::from(oif) >= count {
                return Err(EngineError::Interface6 {
                    what: "neighbour",
                    net: a,
                    len: 128,
                    oif,
                    count,
                });
            }
        }
        Ok(Self {
            ct: table,
            addrs,
            routes,
            neigh: HashMap::new(),
            missing_nh: None,
            frags: super::frag::FragTable::new(),
        })
    }

    /// Interface `oif`'s MAC changed from `old` to `mac`: its link-local
    /// address (derived from the MAC) follows.
    pub(super) fn relink(&mut self, oif: IfIndex, old: [u8; 6], mac: [u8; 6]) {
        if old == mac {
            return;
        }
        let old_ll = (old != [0; 6]).then(|| u128::from(ndp::link_local(old)));
        let new_ll = u128::from(ndp::link_local(mac));
        match self
            .addrs
            .iter_mut()
            .find(|(i, a, _)| *i == oif && Some(*a) == old_ll)
        {
            Some(e) if mac != [0; 6] => e.1 = new_ll,
            Some(_) => self
                .addrs
                .retain(|&(i, a, _)| i != oif || Some(a) != old_ll),
            None if mac != [0; 6] => {
                // Link-local addresses first.
                let at = self
                    .addrs
                    .iter()
                    .position(|&(_, a, _)| !ndp::is_link_local(a));
                self.addrs
                    .insert(at.unwrap_or(self.addrs.len()), (oif, new_ll, 64));
            }
            None => {}
        }
    }

    /// The route table with `routes` as the static routes (the connected
    /// routes of the global addresses as at start), for `count` interfaces.
    pub(super) fn routes_with(
        &self,
        count: usize,
        routes: &[Route6],
    ) -> Result<RouteTable6, EngineError> {
        route_table6(&self.addrs, count, routes)
    }

    pub(super) fn set_routes(&mut self, t: RouteTable6) {
        self.routes = t;
    }

    /// The addresses `addrs6` would give (link-local ones of `ifaces`
    /// first) and their route table with static `routes`, checked; for
    /// [`Self::set_addrs`].
    pub(super) fn addrs_with(
        ifaces: &[super::Interface],
        addrs6: &[(IfIndex, Ipv6Addr, u8)],
        routes: &[Route6],
    ) -> Result<(Addrs6, RouteTable6), EngineError> {
        let addrs = addr_list(ifaces, addrs6)?;
        let t = route_table6(&addrs, ifaces.len(), routes)?;
        Ok((addrs, t))
    }

    /// Take addresses and routes from [`Self::addrs_with`].
    pub(super) fn set_addrs(&mut self, (addrs, t): (Addrs6, RouteTable6)) {
        self.addrs = addrs;
        self.routes = t;
    }

    /// Whether `a` is assigned to interface `iif`.
    fn on_iface(&self, iif: IfIndex, a: u128) -> bool {
        self.addrs.iter().any(|&(i, x, _)| i == iif && x == a)
    }

    /// Whether `a` is one of the gateway's addresses as seen from `iif`:
    /// any global address, or a link-local address of `iif` itself.
    pub(super) fn is_local(&self, iif: IfIndex, a: u128) -> bool {
        self.addrs
            .iter()
            .any(|&(i, x, _)| x == a && (i == iif || !ndp::is_link_local(a)))
    }

    /// The source address for a message to `peer` out of `oif`: the address
    /// of `oif` on `peer`'s prefix, else its first global one, else its
    /// link-local one (RFC 6724 rules 2 and 8, simplified). A link-local
    /// peer always gets the link-local address.
    fn source_for(&self, oif: IfIndex, peer: u128) -> Option<u128> {
        let mine = || self.addrs.iter().filter(move |&&(i, _, _)| i == oif);
        if ndp::is_link_local(peer) {
            return mine()
                .find(|&&(_, a, _)| ndp::is_link_local(a))
                .map(|x| x.1);
        }
        mine()
            .find(|&&(_, a, l)| !ndp::is_link_local(a) && (a ^ peer) & crate::route::mask6(l) == 0)
            .or_else(|| mine().find(|&&(_, a, _)| !ndp::is_link_local(a)))
            .or_else(|| mine().next())
            .map(|x| x.1)
    }

    /// Route `dst`: the egress interface and the next hop.
    pub(super) fn route(&self, dst: u128) -> Result<(IfIndex, u128), DropReason> {
        let r = self.routes.lookup(dst).ok_or(DropReason::NoRoute)?;
        Ok((r.oif, r.via.map(u128::from).unwrap_or(dst)))
    }
}

/// The IPv6 route table: the connected routes of the global addresses in
/// `addrs`, then the static `routes` (each naming one of `count`
/// interfaces).
fn route_table6(
    addrs: &[(IfIndex, u128, u8)],
    count: usize,
    routes: &[Route6],
) -> Result<RouteTable6, EngineError> {
    let mut t = RouteTable6::new();
    for &(oif, a, len) in addrs {
        if !ndp::is_link_local(a) {
            t.add(Route6 {
                net: a,
                len,
                oif,
                via: None,
            });
        }
    }
    for r in routes {
        if usize::from(r.oif) >= count {
            return Err(EngineError::Interface6 {
                what: "route",
                net: Ipv6Addr::from(r.net),
                len: r.len,
                oif: r.oif,
                count,
            });
        }
        t.add(*r);
    }
    Ok(t)
}

impl Worker {
    /// [`Worker::adjacency_towards`] for IPv6.
    pub(super) fn adjacency_towards6(&mut self, dst: u128) -> Option<AdjIndex> {
        let (oif, nh) = self.v6.route(dst).ok()?;
        if let Some(&a) = self.v6.neigh.get(&(oif, nh)) {
            return Some(a);
        }
        let i = self.unresolved_adjacency(oif)?;
        self.v6.neigh.insert((oif, nh), i);
        Some(i)
    }

    /// [`Worker::reroute_step`] for the IPv6 connection table.
    pub(super) fn reroute6_step(&mut self, budget: usize) {
        let Some(start) = self.reroute[1] else {
            return;
        };
        let end = start.saturating_add(budget).min(self.v6.ct.slots());
        for raw in start..end {
            let id = EntryId::from_raw(raw as u32);
            let Some(e) = self.v6.ct.get(id) else {
                continue;
            };
            let (orig, reply) = (e.key(Dir::Original), e.key(Dir::Reply));
            let old = e.payload().adj;
            let new = [
                self.adjacency_towards6(reply.src).unwrap_or(old[0]),
                self.adjacency_towards6(orig.src).unwrap_or(old[1]),
            ];
            if new != old {
                let e = self.v6.ct.entry(id);
                if e.is_offloaded(Dir::Original) || e.is_offloaded(Dir::Reply) {
                    if !offload_removals(self.offload.as_mut(), e, &self.adj) {
                        self.clear_offload_marks();
                    }
                    self.v6.ct.set_offloaded(id, [false, false]);
                }
                if let Some(e) = self.v6.ct.get_mut(id) {
                    e.payload_mut().adj = new;
                }
            }
        }
        self.reroute[1] = (end < self.v6.ct.slots()).then_some(end);
    }

    /// Learn or update an IPv6 neighbour on `oif`. Existing adjacencies
    /// are rewritten in place, so connections that cached them follow.
    pub fn set_neighbor6(
        &mut self,
        oif: IfIndex,
        ip: Ipv6Addr,
        mac: [u8; 6],
    ) -> Result<AdjIndex, EngineError> {
        let a = u128::from(ip);
        let (src_mac, mtu) = self
            .ifaces
            .get(usize::from(oif))
            .map(|i| (i.mac, i.mtu))
            .unwrap_or((Default::default(), Interface::DEFAULT_MTU));
        let adj = Adjacency {
            oif,
            src_mac,
            dst_mac: mac,
            resolved: true,
            mtu,
        };
        if let Some(&i) = self.v6.neigh.get(&(oif, a)) {
            let stale = self
                .adj
                .get(usize::from(i))
                .is_some_and(|old| old.resolved && *old != adj);
            if stale {
                // Offloaded directions carry the old MAC.
                self.offload_clear();
            }
            if let Some(slot) = self.adj.get_mut(usize::from(i)) {
                *slot = adj;
            }
            return Ok(i);
        }
        let i =
            AdjIndex::try_from(self.adj.len()).map_err(|_| EngineError::TooMany("neighbours"))?;
        self.adj.push(adj);
        self.v6.neigh.insert((oif, a), i);
        Ok(i)
    }

    /// Forget an IPv6 neighbour's link-layer address (it stopped answering
    /// reachability probes). Its adjacency stays allocated but unresolved,
    /// so packets that would use it are dropped with `no-neighbor` and the
    /// resolver is asked again; offloaded directions are taken back (they
    /// carry the MAC). Returns whether it was known.
    pub fn clear_neighbor6(&mut self, oif: IfIndex, ip: Ipv6Addr) -> bool {
        let Some(&i) = self.v6.neigh.get(&(oif, u128::from(ip))) else {
            return false;
        };
        if let Some(slot) = self.adj.get_mut(usize::from(i)) {
            slot.resolved = false;
            slot.dst_mac = [0; 6];
        }
        self.offload_clear();
        true
    }

    /// The offloaded directions of IPv6 connection `e` of this worker's
    /// table, as (interface their packets arrive on, their tuple): the keys
    /// the lower layer knows them by.
    pub fn offloaded_directions6(
        &self,
        e: &ct::Entry<FlowKey6, FlowInfo6>,
    ) -> impl Iterator<Item = (IfIndex, FlowKey6)> + '_ {
        let e = *e;
        [Dir::Original, Dir::Reply]
            .into_iter()
            .filter(move |d| e.is_offloaded(*d))
            .map(move |d| (offload_iif(&e, &self.adj, d), e.key(d)))
    }

    /// The IPv6 connection table.
    pub fn conntrack6(&self) -> &Table<FlowKey6, FlowInfo6> {
        &self.v6.ct
    }

    /// The IPv6 twin of [`Worker::missing_next_hop`].
    pub fn missing_next_hop6(&self, i: usize) -> Option<(IfIndex, Ipv6Addr)> {
        self.scratch
            .missing6
            .iter()
            .find(|(j, _)| usize::from(*j) == i)
            .map(|&(_, (o, a))| (o, Ipv6Addr::from(a)))
    }

    /// The IPv6 addresses of interface `iif` (its link-local one first).
    pub fn addresses6(&self, iif: IfIndex) -> impl Iterator<Item = (Ipv6Addr, u8)> + '_ {
        self.v6
            .addrs
            .iter()
            .filter(move |x| x.0 == iif)
            .map(|&(_, a, l)| (Ipv6Addr::from(a), l))
    }

    pub(super) fn neighbor6(&self, oif: IfIndex, nh: u128) -> Result<AdjIndex, DropReason> {
        let i = self
            .v6
            .neigh
            .get(&(oif, nh))
            .copied()
            .ok_or(DropReason::NoNeighbor)?;
        match self.adj.get(usize::from(i)) {
            Some(a) if a.resolved => Ok(i),
            _ => Err(DropReason::NoNeighbor),
        }
    }

    /// Every IPv6 frame: NDP, connections, local delivery, new connections.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn slow6(
        &mut self,
        now: ct::Instant,
        buf: &mut [u8],
        len: usize,
        iif: IfIndex,
        d: &Dissect,
        key: &FlowKey6,
        hop_limit: u8,
        payload_len: u16,
    ) -> Step {
        if let L4::IcmpOther { ty, .. } = d.l4 {
            if (ndp::ROUTER_SOLICIT..=ndp::REDIRECT).contains(&ty) {
                return self.ndp(buf, len, iif, d, key, hop_limit, payload_len, ty);
            }
        }
        // A link-layer group frame is for the gateway itself or not at all
        // (a group frame never takes the fast path, see `pass1`).
        if super::is_group(buf) && !self.v6.is_local(iif, key.dst) && !ndp::is_multicast(key.dst) {
            return Step::Done(Action::Drop(DropReason::LinkBroadcast));
        }
        let pk = Pkt6::of(d, hop_limit, payload_len);
        let h = self.v6.ct.hash(key);
        if let Some((id, dir)) = self.v6.ct.lookup(h, key) {
            if let Some(s) = self.fast6(now, buf, len, iif, &pk, id, dir) {
                return s;
            }
        }
        self.counters.slow_path += 1;
        let drop = |r| Step::Done(Action::Drop(r));
        if self.v6.is_local(iif, key.dst) {
            return self.local6(now, buf, len, iif, d, key, &pk, CtState::New);
        }
        if let Some(r) = unforwardable6(key) {
            return drop(r);
        }
        match d.l4 {
            L4::IcmpError {
                inner: InnerKey::V6(inner),
                ..
            } => return self.related6(buf, len, iif, d, key, &inner, hop_limit, payload_len),
            L4::NonFirstFragment => return self.later_fragment6(now, buf, len, iif, &pk, key),
            L4::Udp {
                checksum_zero: true,
            } => return drop(DropReason::Udp6ZeroChecksum),
            _ => {}
        }
        let ev = pk.ev;
        if !self.v6.ct.may_create(ev) {
            return drop(DropReason::CtInvalid);
        }
        let mut pp = policy_packet6(iif, key, d, CtState::New, payload_len, buf);
        self.addr_types6(iif, &mut pp);
        self.stamp(&mut pp);
        // Prerouting filter chains (NAT does not apply to IPv6).
        let dec = self.policy.decide(Hook::Prerouting, &pp);
        pp.mark = dec.mark;
        pp.ct_mark = dec.ct_mark;
        let mut mss = dec.mss;
        let mut ct_timeout = dec.ct_timeout;
        if dec.verdict != Verdict::Accept {
            return self.refuse6(now, buf, len, iif, &pk, dec.verdict);
        }
        let (oif, nh) = match self.v6.route(key.dst) {
            Ok(x) => x,
            Err(r) => return drop(r),
        };
        let adj_out = match self.egress6(now, buf, len, iif, &pk, (oif, nh)) {
            Ok(a) => a,
            Err(s) => return s,
        };
        pp.oif = Some(oif);
        // The hop limit is decremented before the forward hook
        // (`ip6_forward`).
        pp.ttl = pp.ttl.saturating_sub(1);
        let dec = self.policy.decide(Hook::Forward, &pp);
        pp.mark = dec.mark;
        pp.ct_mark = dec.ct_mark;
        mss = mss.and(dec.mss);
        ct_timeout = later_ct_timeout(ct_timeout, dec.ct_timeout);
        if dec.verdict != Verdict::Accept {
            return self.refuse6(now, buf, len, iif, &pk, dec.verdict);
        }
        let dec = self.policy.decide(Hook::Postrouting, &pp);
        pp.mark = dec.mark;
        pp.ct_mark = dec.ct_mark;
        mss = mss.and(dec.mss);
        ct_timeout = later_ct_timeout(ct_timeout, dec.ct_timeout);
        if dec.verdict != Verdict::Accept {
            return self.refuse6(now, buf, len, iif, &pk, dec.verdict);
        }
        let adj_back = match self.v6.route(key.src) {
            Ok((o, n)) => match self.neighbor6(o, n) {
                Ok(a) => a,
                Err(r) => {
                    self.v6.missing_nh = Some((o, n));
                    return drop(r);
                }
            },
            Err(r) => return drop(r),
        };
        let info = FlowInfo6 {
            adj: [adj_out, adj_back],
        };
        let counted = self.counts_conns.then_some(&*self.policy);
        let (q, adjs) = (&mut self.offload, &self.adj);
        let mut overflow = false;
        let inserted = self
            .v6
            .ct
            .insert(now, *key, key.reversed(), info, &mut |e| {
                overflow |= !offload_removals(q.as_mut(), e, adjs);
                if let Some(p) = counted {
                    p.conn_closed(&conn6(&e.orig()));
                }
            });
        if overflow {
            self.clear_offload_marks();
        }
        let id = match inserted {
            Ok(id) => id,
            Err(InsertError::Full) => return drop(DropReason::CtFull),
            Err(InsertError::Exists | InsertError::ProtoMismatch) => {
                return drop(DropReason::CtInvalid)
            }
        };
        self.counters.ct_created += 1;
        let t = self.v6.ct.track(id, Dir::Original, now, ev);
        if t.verdict == ct::Verdict::Invalid {
            self.v6.ct.remove(id);
            return drop(DropReason::CtInvalid);
        }
        if self.counts_conns {
            self.policy.conn_confirmed(&conn6(key));
        }
        // The connection mark the rules set (`ct mark set`).
        if pp.ct_mark != 0 {
            self.v6.ct.entry_mut(id).set_mark(pp.ct_mark);
        }
        if ct_timeout != 0 {
            give_ct_timeout(&mut self.v6.ct, id, ct_timeout, now);
        }
        self.clamp_mss6(buf, len, &pk, mss, [adj_out, adj_back]);
        self.emit6(now, buf, len, iif, &pk, adj_out)
    }

    /// RFC 8200 §3 / RFC 4443 §3.3 and §3.2, checked after routing and
    /// before the forward hook as in the kernel's `ip6_forward`: the hop
    /// limit, the egress MTU (packet too big) and the next hop's link-layer
    /// address (a missing one is named in `missing_nh`). The adjacency to
    /// forward on, or what to do instead.
    pub(super) fn egress6(
        &mut self,
        now: ct::Instant,
        buf: &mut [u8],
        len: usize,
        iif: IfIndex,
        pk: &Pkt6,
        (oif, nh): (IfIndex, u128),
    ) -> Result<AdjIndex, Step> {
        if pk.hop_limit <= 1 {
            return Err(self.icmp6_error(now, buf, len, iif, pk, None));
        }
        let mtu = self
            .ifaces
            .get(usize::from(oif))
            .map_or(Interface::DEFAULT_MTU, |i| i.mtu);
        if 40 + usize::from(pk.payload_len) > usize::from(mtu) {
            return Err(self.icmp6_error(now, buf, len, iif, pk, Some(mtu)));
        }
        self.neighbor6(oif, nh).map_err(|r| {
            self.v6.missing_nh = Some((oif, nh));
            Step::Done(Action::Drop(r))
        })
    }

    /// An IPv6 packet the rules refused with verdict `v`: dropped, or
    /// rejected and answered with a TCP reset or an ICMPv6 destination
    /// unreachable, as [`Worker::refuse4`] does for IPv4.
    #[cold]
    #[inline(never)]
    pub(super) fn refuse6(
        &mut self,
        now: ct::Instant,
        buf: &mut [u8],
        len: usize,
        iif: IfIndex,
        pk: &Pkt6,
        v: Verdict,
    ) -> Step {
        match v {
            Verdict::Accept | Verdict::Drop => Step::Done(Action::Drop(DropReason::PolicyDrop)),
            // The upper-layer protocol is known here only past the
            // extension headers (the builder cannot see it).
            Verdict::Reject(RejectWith::TcpReset) if matches!(pk.ev, L4Event::Tcp(_)) => {
                self.reset(buf, len, pk.l3, pk.l4, iif)
            }
            Verdict::Reject(RejectWith::TcpReset) => {
                Step::Done(Action::Drop(DropReason::PolicyReject))
            }
            // ICMPv6 destination unreachable (type 1).
            Verdict::Reject(RejectWith::Unreachable { v6, .. }) => {
                self.icmp6_answer(now, buf, len, iif, pk, (1, v6, 0), DropReason::PolicyReject)
            }
        }
    }

    /// Remove IPv6 connection `id`, telling a policy that counts
    /// connections.
    pub(super) fn remove6(&mut self, id: EntryId) {
        if let Some(e) = self.v6.ct.remove(id) {
            if self.counts_conns {
                self.policy.conn_closed(&conn6(&e.orig()));
            }
            if !offload_removals(self.offload.as_mut(), &e, &self.adj) {
                self.clear_offload_marks();
            }
        }
    }

    /// [`Worker::offload_after`] for an IPv6 connection: after a
    /// fast-path packet of `dir` on entry `id` arriving on `iif` was
    /// forwarded, offload both directions if they qualify, or take them
    /// back when a TCP connection left ESTABLISHED.
    #[cold]
    #[inline(never)]
    fn offload_after6(&mut self, id: EntryId, dir: Dir, iif: IfIndex, state: ct::ProtoState) {
        let Some(q) = &mut self.offload else {
            return;
        };
        let e = self.v6.ct.entry(id);
        let (fe, adj, down) = (self.filter_established, &self.adj, &self.link_down);
        match super::offload_plan(q, e, dir, iif, state, fe, adj, down) {
            super::OffloadPlan::Nothing => {}
            super::OffloadPlan::TakeBack => {
                let ok = offload_removals(Some(q), e, adj);
                self.v6.ct.set_offloaded(id, [false, false]);
                if !ok {
                    self.clear_offload_marks();
                }
            }
            super::OffloadPlan::Install(out, back) => {
                for (d, a) in [(dir, out), (dir.opposite(), back)] {
                    q.push_install6(OffloadFlow6 {
                        iif: offload_iif(e, adj, d),
                        key: e.key(d),
                        adj: a,
                    });
                }
                self.v6.ct.set_offloaded(id, [true, true]);
            }
        }
    }

    /// A packet of a known connection. `None`: the entry was removed (a
    /// TCP SYN reopening a closed connection, or expired); treat the packet
    /// as new.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    pub(super) fn fast6(
        &mut self,
        now: ct::Instant,
        buf: &mut [u8],
        len: usize,
        iif: IfIndex,
        pk: &Pkt6,
        id: EntryId,
        dir: Dir,
    ) -> Option<Step> {
        let tracked = self.v6.ct.track(id, dir, now, pk.ev);
        match tracked.verdict {
            ct::Verdict::Invalid => return Some(Step::Done(Action::Drop(DropReason::CtInvalid))),
            ct::Verdict::Reopen | ct::Verdict::Expired => {
                self.remove6(id);
                return None;
            }
            ct::Verdict::Valid | ct::Verdict::Ignored | ct::Verdict::Close => {}
        }
        if self.counts_conns && super::closed_state(tracked.state) {
            self.policy
                .conn_closed(&conn6(&self.v6.ct.entry(id).orig()));
        }
        let mut mss = MssClamp::default();
        // A connection in a flowtable skips the filter chains while it
        // stays up (as `Worker::fast4`).
        let flags = match pk.ev {
            L4Event::Tcp(f) => f.0,
            _ => 0,
        };
        let flowing = self.flowtable_gen != 0 && self.v6.ct.entry(id).in_flowtable();
        let in_flow = flowing && super::flow_continues(tracked.state, flags);
        if flowing && !in_flow {
            self.v6.ct.set_in_flowtable(id, false);
        }
        let filter = self.filter_established && !in_flow;
        self.flow_hit = false;
        if filter {
            match self.filter_established6(buf, iif, pk, id, dir, Hook::Prerouting) {
                Ok(c) => mss = mss.and(c),
                Err(v) => return Some(self.refuse6(now, buf, len, iif, pk, v)),
            }
        }
        if pk.hop_limit <= 1 {
            return Some(self.icmp6_error(now, buf, len, iif, pk, None));
        }
        if filter {
            for hook in [Hook::Forward, Hook::Postrouting] {
                match self.filter_established6(buf, iif, pk, id, dir, hook) {
                    Ok(c) => mss = mss.and(c),
                    Err(v) => return Some(self.refuse6(now, buf, len, iif, pk, v)),
                }
            }
            let proto = self.v6.ct.entry(id).proto();
            if self.flow_hit
                && matches!(proto, proto::TCP | proto::UDP)
                && super::flow_continues(tracked.state, flags)
            {
                self.v6.ct.set_in_flowtable(id, true);
            }
        }
        self.counters.fast_path += 1;
        let info = self.v6.ct.entry(id).payload();
        let adj = info.adjacency(dir);
        let back = info.adjacency(dir.opposite());
        self.clamp_mss6(buf, len, pk, mss, [adj, back]);
        let step = self.emit6(now, buf, len, iif, pk, adj);
        if tracked.verdict == ct::Verdict::Close {
            self.remove6(id);
        } else if self.offload.is_some()
            && !self.raw
            && !pk.first_frag
            && matches!(step, Step::Done(Action::Forward(_)))
        {
            self.offload_after6(id, dir, iif, tracked.state);
        }
        Some(step)
    }

    /// The filter chains of `hook` for a packet of an established IPv6
    /// connection, when the policy does not accept those up front (see
    /// [`Policy::established_accepted`]); no NAT, so every hook sees the
    /// packet as received. The `tcp option maxseg size set` statements met,
    /// or the reason to drop the packet.
    #[cold]
    #[inline(never)]
    fn filter_established6(
        &mut self,
        buf: &[u8],
        iif: IfIndex,
        pk: &Pkt6,
        id: EntryId,
        dir: Dir,
        hook: Hook,
    ) -> Result<MssClamp, Verdict> {
        let e = self.v6.ct.entry(id);
        let key = e.key(dir);
        let oif = (hook != Hook::Prerouting)
            .then(|| self.adj.get(usize::from(e.payload().adjacency(dir))))
            .flatten()
            .map(|a| a.oif);
        let status = ct_status(e.seen_reply(), e.is_assured());
        let tcp_flags = match pk.ev {
            L4Event::Tcp(f) => f.0,
            _ => 0,
        };
        let mut pp = PolicyPacket {
            iif,
            oif,
            family: 6,
            src: key.src,
            dst: key.dst,
            proto: key.proto,
            sport: key.sport,
            dport: key.dport,
            tcp_flags,
            // An echo (or other ICMPv6 query) of a connection: its type and
            // code, for `icmpv6 type` rules.
            icmp: if key.proto == proto::ICMPV6 {
                (
                    buf.get(pk.l4).copied().unwrap_or(0),
                    buf.get(pk.l4 + 1).copied().unwrap_or(0),
                )
            } else {
                (0, 0)
            },
            ct: CtState::Established,
            ct_mark: e.mark(),
            mark: self.pkt_mark,
            ct_status: status,
            len: pk.payload_len.saturating_add(40),
            ttl: if hook == Hook::Prerouting {
                pk.hop_limit
            } else {
                pk.hop_limit.saturating_sub(1)
            },
            df: false,
            tos: traffic_class(buf, pk.l3),
            pkttype: 0,
            daddr_type: 0,
            saddr_type: 0,
            ether: super::frame_macs(buf),
            ct_dir: u8::from(dir == Dir::Reply),
            rpf: (true, true),
            now_ms: self.now_ms,
            wall_ms: self.wall_ms,
            ct_reply: conn6(&e.reply()),
            conn: conn6(&e.orig()),
        };
        self.addr_types6(iif, &mut pp);
        let ct_mark = pp.ct_mark;
        let dec = self.policy.decide(hook, &pp);
        // The next hook starts from the mark this one left.
        self.pkt_mark = dec.mark;
        self.flow_hit |= dec.flow_add;
        if dec.ct_mark != ct_mark {
            // `ct mark set` on an established packet: the connection keeps
            // it.
            self.v6.ct.entry_mut(id).set_mark(dec.ct_mark);
        }
        match dec.verdict {
            Verdict::Accept => Ok(dec.mss),
            v => Err(v),
        }
    }

    /// The route type of `a` as `fib daddr type` gives it for a packet
    /// received on `iif`: multicast, local (the gateway's own addresses and
    /// `::1`) or unicast.
    fn addr_type6(&self, iif: IfIndex, a: u128) -> u8 {
        if let Some(t) = crate::policy::fixed_addr_type(Ipv6Addr::from(a).into()) {
            t
        } else if self.v6.is_local(iif, a) {
            2
        } else {
            1
        }
    }

    /// `fib daddr type` and `fib saddr type` of a packet about to meet the
    /// policy (left neutral when no rule reads them).
    pub(super) fn addr_types6(&self, iif: IfIndex, pp: &mut PolicyPacket) {
        if !self.policy.needs_routing_facts() {
            return;
        }
        pp.daddr_type = self.addr_type6(iif, pp.dst);
        pp.saddr_type = self.addr_type6(iif, pp.src);
        pp.rpf = self.rpf6(iif, pp.src);
    }

    /// [`Worker::rpf4`] for IPv6. A link-local source is on the input
    /// interface's link (the kernel has `fe80::/64` on every interface).
    fn rpf6(&self, iif: IfIndex, src: u128) -> (bool, bool) {
        if ndp::is_link_local(src) {
            return (true, true);
        }
        match self.v6.route(src) {
            Ok((oif, _)) => (oif == iif, true),
            Err(_) => (false, false),
        }
    }

    /// [`clamp_mss`] for an IPv6 packet whose TCP header follows the IPv6
    /// header (a segment behind extension headers is left alone); `adjs`
    /// are the adjacencies of the two directions.
    pub(super) fn clamp_mss6(
        &self,
        buf: &mut [u8],
        len: usize,
        pk: &Pkt6,
        mss: MssClamp,
        adjs: [AdjIndex; 2],
    ) {
        if mss.is_none() || buf.get(pk.l3 + 6) != Some(&proto::TCP) {
            return;
        }
        let rt = self.adj_mtu(adjs[0]).min(self.adj_mtu(adjs[1]));
        clamp_mss(buf, len, pk.l3 + 40, mss, rt, 60);
    }

    /// Forward the packet at `l3` on adjacency `adj`: MTU check, hop limit
    /// decrement, MACs.
    #[inline]
    pub(super) fn emit6(
        &mut self,
        now: ct::Instant,
        buf: &mut [u8],
        len: usize,
        iif: IfIndex,
        pk: &Pkt6,
        adj: AdjIndex,
    ) -> Step {
        let Some(&a) = self.adj.get(usize::from(adj)).filter(|a| a.resolved) else {
            // So that the resolver asks for this next hop (a cold walk).
            self.v6.missing_nh = self
                .v6
                .neigh
                .iter()
                .find(|(_, &i)| i == adj)
                .map(|(&k, _)| k);
            return Step::Done(Action::Drop(DropReason::NoNeighbor));
        };
        if 40 + usize::from(pk.payload_len) > usize::from(a.mtu) {
            return self.icmp6_error(now, buf, len, iif, pk, Some(a.mtu));
        }
        let Some(hl) = buf.get_mut(pk.l3 + 7) else {
            return Step::Done(Action::Drop(DropReason::Malformed));
        };
        *hl = hl.saturating_sub(1);
        a.write_macs(buf);
        if pk.first_frag {
            self.remember_frag6(buf, pk.l3, adj, now);
        }
        Step::Done(Action::Forward(a.oif))
    }

    /// Files the datagram of the first fragment at `l3` (already
    /// forwarded on `adj`) so that its later fragments follow.
    #[cold]
    fn remember_frag6(&mut self, buf: &[u8], l3: usize, adj: AdjIndex, now: ct::Instant) {
        let Some(ip) = buf.get(l3..) else { return };
        let (Some(src), Some(dst), Some(ident)) = (
            read128(buf, l3 + 8),
            read128(buf, l3 + 24),
            sluice_wire::ipv6::fragment_ident(ip),
        ) else {
            return;
        };
        let id = super::frag::DatagramId6 { src, dst, ident };
        self.v6.frags.remember(id, adj, now);
    }

    /// A later IPv6 fragment: forwarded on its first fragment's adjacency
    /// (hop limit decrement; no NAT, so nothing else changes) if that one
    /// was forwarded, else dropped (`fragment`). A later fragment whose hop
    /// limit runs out is dropped without an error (its first fragment got
    /// one); one too big for the egress MTU gets packet too big.
    #[cold]
    #[inline(never)]
    fn later_fragment6(
        &mut self,
        now: ct::Instant,
        buf: &mut [u8],
        len: usize,
        iif: IfIndex,
        pk: &Pkt6,
        key: &FlowKey6,
    ) -> Step {
        let ident = buf.get(pk.l3..).and_then(sluice_wire::ipv6::fragment_ident);
        let Some(ident) = ident else {
            return Step::Done(Action::Drop(DropReason::Malformed));
        };
        let id = super::frag::DatagramId6 {
            src: key.src,
            dst: key.dst,
            ident,
        };
        let Some(adj) = self.v6.frags.find(&id, now) else {
            return Step::Done(Action::Drop(DropReason::Fragment));
        };
        if pk.hop_limit <= 1 {
            return Step::Done(Action::Drop(DropReason::TtlExpired));
        }
        let later = Pkt6 {
            first_frag: false,
            ..*pk
        };
        self.emit6(now, buf, len, iif, &later, adj)
    }

    /// An ICMPv6 error about a packet of a tracked connection (ct state
    /// related): forwarded towards the quoted packet's sender.
    #[allow(clippy::too_many_arguments)]
    fn related6(
        &mut self,
        buf: &mut [u8],
        len: usize,
        iif: IfIndex,
        d: &Dissect,
        key: &FlowKey6,
        inner: &FlowKey6,
        hop_limit: u8,
        payload_len: u16,
    ) -> Step {
        let h = self.v6.ct.hash(inner);
        let Some((id, dir)) = self.v6.ct.lookup(h, inner) else {
            return Step::Done(Action::Drop(DropReason::Icmp6ErrorUnrelated));
        };
        if hop_limit <= 1 {
            return Step::Done(Action::Drop(DropReason::TtlExpired));
        }
        let adj = self.v6.ct.entry(id).payload().adjacency(dir.opposite());
        let mut pp = policy_packet6(iif, key, d, CtState::Related, payload_len, buf);
        self.addr_types6(iif, &mut pp);
        self.stamp(&mut pp);
        pp.oif = self.adj.get(usize::from(adj)).map(|a| a.oif);
        if let Some(r) = refused(self.policy.decide(Hook::Forward, &pp).verdict) {
            return Step::Done(Action::Drop(r));
        }
        let Some(&a) = self.adj.get(usize::from(adj)).filter(|a| a.resolved) else {
            return Step::Done(Action::Drop(DropReason::NoNeighbor));
        };
        // An error is at most 1280 bytes (RFC 4443 §2.4 (c)); a smaller MTU
        // on the way back is not worth another error.
        if len.saturating_sub(usize::from(d.l3_off)) > usize::from(a.mtu).max(MIN_MTU6) {
            return Step::Done(Action::Drop(DropReason::TooBig));
        }
        let l3 = usize::from(d.l3_off);
        if let Some(hl) = buf.get_mut(l3 + 7) {
            *hl = hl.saturating_sub(1);
        }
        a.write_macs(buf);
        Step::Done(Action::Forward(a.oif))
    }

    /// A packet for one of the gateway's IPv6 addresses.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn local6(
        &mut self,
        now: ct::Instant,
        buf: &mut [u8],
        len: usize,
        iif: IfIndex,
        d: &Dissect,
        key: &FlowKey6,
        pk: &Pkt6,
        ct_state: CtState,
    ) -> Step {
        let payload_len = pk.payload_len;
        let mut pp = policy_packet6(iif, key, d, ct_state, payload_len, buf);
        self.addr_types6(iif, &mut pp);
        self.stamp(&mut pp);
        let v = self.policy.decide(Hook::Input, &pp).verdict;
        if v != Verdict::Accept {
            return self.refuse6(now, buf, len, iif, pk, v);
        }
        match d.l4 {
            // RFC 4443 §4.2: echo request (128) -> echo reply (129), same
            // identifier, sequence number and data, back to the sender.
            L4::IcmpQuery { ty: 128, .. } => {
                let l3 = usize::from(d.l3_off);
                let l4 = usize::from(d.l4_off);
                let Some(my_mac) = self.ifaces.get(usize::from(iif)).map(|i| i.mac) else {
                    return Step::Done(Action::Drop(DropReason::LocalUnhandled));
                };
                let (Some(type_w), Some(c)) = (read16(buf, l4), read16(buf, l4 + 2)) else {
                    return Step::Done(Action::Drop(DropReason::Malformed));
                };
                // Swapping the addresses leaves the pseudo-header sum as it
                // is; only the type word changes (RFC 1624).
                write128(buf, l3 + 8, key.dst);
                write128(buf, l3 + 24, key.src);
                if let Some(hl) = buf.get_mut(l3 + 7) {
                    *hl = HOP_LIMIT;
                }
                let reply_w = (129 << 8) | (type_w & 0x00ff);
                write16(buf, l4, reply_w);
                write16(buf, l4 + 2, checksum::update16(c, type_w, reply_w));
                swap_macs(buf, my_mac);
                Step::Reply(len)
            }
            _ => Step::Done(Action::Drop(DropReason::LocalUnhandled)),
        }
    }

    /// NDP: answer a valid neighbor solicitation for an address of the
    /// ingress interface; everything else is counted and dropped (the
    /// resolver has already learnt from it).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn ndp(
        &mut self,
        buf: &mut [u8],
        len: usize,
        iif: IfIndex,
        d: &Dissect,
        key: &FlowKey6,
        hop_limit: u8,
        payload_len: u16,
        ty: u8,
    ) -> Step {
        let drop = |r| Step::Done(Action::Drop(r));
        if ty != ndp::NEIGHBOR_SOLICIT {
            return drop(DropReason::NdpIgnored);
        }
        let l3 = usize::from(d.l3_off);
        let l4 = usize::from(d.l4_off);
        let end = (l3 + 40 + usize::from(payload_len)).min(len);
        let Some(msg) = buf.get(l4..end) else {
            return drop(DropReason::NdpInvalid);
        };
        let ns = match ndp::parse(key.src, key.dst, hop_limit, msg) {
            Ok(r) => r,
            Err(_) => return drop(DropReason::NdpInvalid),
        };
        // RFC 4861 §7.2.3: answer only for our own (here: the ingress
        // interface's) addresses; the destination is the target itself or
        // its solicited-node group.
        if !self.v6.on_iface(iif, ns.target)
            || (key.dst != ns.target && key.dst != ndp::solicited_node(ns.target))
        {
            return drop(DropReason::NdpIgnored);
        }
        let mut pp = policy_packet6(iif, key, d, CtState::New, payload_len, buf);
        self.addr_types6(iif, &mut pp);
        self.stamp(&mut pp);
        if let Some(r) = refused(self.policy.decide(Hook::Input, &pp).verdict) {
            return drop(r);
        }
        let Some(my_mac) = self.ifaces.get(usize::from(iif)).map(|i| i.mac) else {
            return drop(DropReason::LocalUnhandled);
        };
        // The reply is written untagged at offset 0.
        if l3 != 14 {
            return drop(DropReason::LocalUnhandled);
        }
        // RFC 4861 §7.2.4: to the solicitor, solicited; a DAD probe (from
        // the unspecified address) is answered to all nodes, unsolicited.
        // We are a router, and override the solicitor's cache.
        let (dst, dst_mac, flags) = if key.src == 0 {
            (
                ALL_NODES,
                ndp::multicast_mac(ALL_NODES),
                ndp::FLAG_ROUTER | ndp::FLAG_OVERRIDE,
            )
        } else {
            let mut eth_src = [0u8; 6];
            if let Some(s) = buf.get(6..12) {
                eth_src.copy_from_slice(s);
            }
            (
                key.src,
                ns.lladdr.unwrap_or(eth_src),
                ndp::FLAG_ROUTER | ndp::FLAG_SOLICITED | ndp::FLAG_OVERRIDE,
            )
        };
        match ndp::build_na(buf, my_mac, dst_mac, ns.target, dst, flags) {
            Some(n) => Step::Reply(n),
            None => drop(DropReason::Malformed),
        }
    }

    /// Drop the packet at `l3` and, when RFC 4443 §2.4 (e) allows and the
    /// rate limit has a token, turn it into an ICMPv6 error to its sender
    /// from the ingress interface: packet too big with `mtu` when given,
    /// else time exceeded (hop limit exceeded in transit).
    #[cold]
    #[inline(never)]
    pub(super) fn icmp6_error(
        &mut self,
        now: ct::Instant,
        buf: &mut [u8],
        len: usize,
        iif: IfIndex,
        pk: &Pkt6,
        mtu: Option<u16>,
    ) -> Step {
        let (reason, ty, rest) = match mtu {
            Some(m) => (DropReason::TooBig, 2, u32::from(m)),
            None => (DropReason::TtlExpired, 3, 0),
        };
        self.icmp6_answer(now, buf, len, iif, pk, (ty, 0, rest), reason)
    }

    /// Drop the packet for `reason` and, when allowed (RFC 4443 §2.4 (e))
    /// and within the rate limit, turn it into the ICMPv6 error `(type,
    /// code, rest of header)` to its sender. Only packet too big (type 2)
    /// answers a packet sent to a multicast address.
    #[allow(clippy::too_many_arguments)]
    #[cold]
    #[inline(never)]
    fn icmp6_answer(
        &mut self,
        now: ct::Instant,
        buf: &mut [u8],
        len: usize,
        iif: IfIndex,
        pk: &Pkt6,
        (ty, code, rest): (u8, u8, u32),
        reason: DropReason,
    ) -> Step {
        let l3 = pk.l3;
        let dropped = Step::Done(Action::Drop(reason));
        let (Some(sender), Some(dst)) = (read128(buf, l3 + 8), read128(buf, l3 + 24)) else {
            return dropped;
        };
        if pk.about_error
            || sender == 0
            || ndp::is_multicast(sender)
            || (ndp::is_multicast(dst) && ty != 2)
        {
            return dropped;
        }
        let Some(src) = self.v6.source_for(iif, sender) else {
            return dropped;
        };
        let Some(my_mac) = self.ifaces.get(usize::from(iif)).map(|i| i.mac) else {
            return dropped;
        };
        if !self.icmp.take(now.as_millis()) {
            self.counters.icmp_errors_limited += 1;
            return dropped;
        }
        match icmp6_error_in_place(buf, len, l3, ty, code, rest, src, my_mac) {
            Some(n) => Step::Error(n, reason),
            None => dropped,
        }
    }
}

/// Rewrite the IPv6 packet at `l3` (frame length `len`) in place into an
/// ICMPv6 error of type `ty` / `code` (bytes 4..8 = `rest`) from `src` to
/// the packet's source, quoting as much of it as fits in 1280 bytes (RFC
/// 4443 §2.4 (c)) and the buffer. The link-layer header is kept (tags
/// included) with the MACs swapped, `my_mac` as source. Returns the new
/// frame length.
#[allow(clippy::too_many_arguments)]
pub fn icmp6_error_in_place(
    buf: &mut [u8],
    len: usize,
    l3: usize,
    ty: u8,
    code: u8,
    rest: u32,
    src: u128,
    my_mac: [u8; 6],
) -> Option<usize> {
    let sender = read128(buf, l3 + 8)?;
    let plen = usize::from(read16(buf, l3 + 4)?);
    let packet = len.checked_sub(l3)?.min(40 + plen);
    let room = buf.len().checked_sub(l3 + 48)?;
    let quote = packet.min(MIN_MTU6 - 48).min(room);
    if quote < 40 {
        return None;
    }
    buf.copy_within(l3..l3 + quote, l3 + 48);
    let h = buf.get_mut(l3..l3 + 48)?;
    h.fill(0);
    h[0] = 0x60;
    h[4..6].copy_from_slice(&((8 + quote) as u16).to_be_bytes());
    h[6] = proto::ICMPV6;
    h[7] = HOP_LIMIT;
    h[8..24].copy_from_slice(&src.to_be_bytes());
    h[24..40].copy_from_slice(&sender.to_be_bytes());
    h[40] = ty;
    h[41] = code;
    h[44..48].copy_from_slice(&rest.to_be_bytes());
    let end = l3 + 48 + quote;
    let c = ndp::icmp6_sum(src, sender, buf.get(l3 + 40..end)?);
    write16(buf, l3 + 42, c);
    swap_macs(buf, my_mac);
    Some(end)
}

fn l4_event6(d: &Dissect) -> L4Event {
    match d.l4 {
        L4::Tcp { flags, .. } => L4Event::Tcp(TcpFlags(flags)),
        L4::Udp { .. } => L4Event::Udp,
        L4::IcmpQuery { ty, .. } => L4Event::Icmp {
            request: icmp_is_query_request(true, ty),
        },
        _ => L4Event::Other,
    }
}

pub(super) fn policy_packet6(
    iif: IfIndex,
    key: &FlowKey6,
    d: &Dissect,
    ct: CtState,
    payload_len: u16,
    buf: &[u8],
) -> PolicyPacket {
    let l3 = usize::from(d.l3_off);
    let (tcp_flags, icmp) = match d.l4 {
        L4::Tcp { flags, .. } => (flags, (0, 0)),
        L4::IcmpQuery { ty, code, .. }
        | L4::IcmpError { ty, code, .. }
        | L4::IcmpOther { ty, code } => (0, (ty, code)),
        _ => (0, (0, 0)),
    };
    PolicyPacket {
        iif,
        oif: None,
        family: 6,
        src: key.src,
        dst: key.dst,
        proto: key.proto,
        sport: key.sport,
        dport: key.dport,
        tcp_flags,
        icmp,
        ct,
        ct_mark: 0,
        mark: 0,
        ct_status: 0,
        len: payload_len.saturating_add(40),
        ttl: buf.get(l3 + 7).copied().unwrap_or(0),
        df: false,
        tos: traffic_class(buf, l3),
        pkttype: super::pkttype(buf),
        // The worker's: `Worker::addr_types6`.
        daddr_type: 0,
        saddr_type: 0,
        ether: super::frame_macs(buf),
        ct_dir: 0,
        // The worker's: `Worker::addr_types6`.
        rpf: (true, true),
        now_ms: 0,
        wall_ms: 0,
        ct_reply: conn6(&key.reversed()),
        conn: conn6(key),
    }
}

/// Why a packet not for the gateway may not be forwarded: a multicast
/// destination, an unspecified, loopback or multicast source, or a
/// link-local address (RFC 4291 §2.5.6).
impl super::OffloadKey for FlowKey6 {
    type Info = FlowInfo6;
    fn adjacency(info: &FlowInfo6, dir: Dir) -> AdjIndex {
        info.adjacency(dir)
    }
    fn remove(iif: IfIndex, key: Self) -> OffloadOp {
        OffloadOp::Remove6 { iif, key }
    }
}

pub(super) fn unforwardable6(key: &FlowKey6) -> Option<DropReason> {
    if ndp::is_multicast(key.dst) {
        Some(DropReason::Ipv6Multicast)
    } else if key.src == 0 || key.src == 1 || ndp::is_multicast(key.src) || key.dst <= 1 {
        Some(DropReason::Ipv6BadAddress)
    } else if ndp::is_link_local(key.src) || ndp::is_link_local(key.dst) {
        Some(DropReason::Ipv6LinkLocal)
    } else {
        None
    }
}

/// Connection `k` as the policy counts it (`ct count`).
pub(super) fn conn6(k: &FlowKey6) -> ConnTuple {
    ConnTuple {
        src: k.src,
        dst: k.dst,
        sport: k.sport,
        dport: k.dport,
        proto: k.proto,
        family: 6,
    }
}

/// The traffic class of the IPv6 header at `l3` (its bits 4-11).
fn traffic_class(buf: &[u8], l3: usize) -> u8 {
    match buf.get(l3..l3 + 2) {
        Some(&[a, b]) => (a << 4) | (b >> 4),
        _ => 0,
    }
}

fn read128(b: &[u8], off: usize) -> Option<u128> {
    let s = b.get(off..off + 16)?;
    let mut a = [0u8; 16];
    a.copy_from_slice(s);
    Some(u128::from_be_bytes(a))
}

fn write128(b: &mut [u8], off: usize, v: u128) {
    if let Some(s) = b.get_mut(off..off + 16) {
        s.copy_from_slice(&v.to_be_bytes());
    }
}
