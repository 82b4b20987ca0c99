//! Sessions carried over a restart of the gateway
//! ([`WorkerNat::restore_session`]): the new process's NAT takes the
//! mappings and ports the old one's sessions held, exactly, so that the
//! sessions' translated keys (which their conntrack entries keep) stay
//! theirs.

use sluice_wire::flow::FlowKey4;

use super::{block_ports, proto_index, ExtKey, MapKey, Mapping, Realm, Space, WorkerNat, PROTOS};
use crate::config::MappingBehaviour;
use crate::event::{NatEvent, NatEventSink};

/// Why a session was not taken back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RestoreRefused {
    /// Port block allocation: its port's block is another subscriber's
    /// (or, deterministic NAT, not the subscriber's own).
    #[error("its port's block is another subscriber's")]
    BlockTaken,
    /// Its external address is neither a pool address nor one masquerade
    /// may use now.
    #[error("its external address is no longer a NAT address")]
    NotExternal,
    /// Its external port is not this worker's, or is taken by another
    /// mapping.
    #[error("its external port is not free on this worker")]
    PortTaken,
    /// It held a mapping its keys do not translate (a damaged state
    /// file), or, under address-and-port-dependent mapping, the mapping of
    /// its destination side (an inbound or hairpinned session's target)
    /// that no session restored before made again: that mapping's key
    /// holds the destination of the session that made it, which this one
    /// does not tell.
    #[error("its mapping cannot be made again from it")]
    NoMapping,
    /// Another mapping already has the internal side its mapping needs.
    #[error("another mapping holds its internal endpoint")]
    Conflict,
    /// Not TCP, UDP or an ICMP query.
    #[error("protocol not translated by dynamic NAT")]
    Protocol,
    /// No masquerade address slot is free.
    #[error("no free masquerade address slot")]
    MasqueradeSlots,
}

impl<S: NatEventSink> WorkerNat<S> {
    /// Which of the mappings a session with keys `(orig, reply)` may
    /// hold it holds (what a restart saves with it, for
    /// [`Self::restore_session`]): bit 0 its source side's (the mapping a
    /// source NAT made), bit 1 its destination side's (an inbound
    /// session's, or a hairpinned one's target).
    pub fn held_mappings(&self, orig: &FlowKey4, reply: &FlowKey4) -> u8 {
        let [a, b] = self.session_refs(orig, reply);
        u8::from(a.is_some()) | (u8::from(b.is_some()) << 1)
    }

    /// Take back a translated session a restart carried over, with its
    /// conntrack keys `(orig, reply)` as the old process made them and the
    /// mappings it held there (`held`, [`Self::held_mappings`]): each held
    /// mapping is made again with its very external endpoint, unless a
    /// session restored before made it, and the session takes its
    /// references as a new one would. Restore the sessions that hold no
    /// destination-side mapping (bit 1) first: under
    /// address-and-port-dependent mapping such a mapping is only made again
    /// by a session that holds it on its source side. `masq(addr)`: whether
    /// `addr` is an
    /// address masquerade may use (an interface address of the gateway);
    /// an external address in a pool is taken in that pool. Session limits
    /// are not applied (the sessions existed). When it is refused the
    /// mappings, ports and counts are as before (a mapping it made for
    /// one side is removed again; the NAT log records both).
    pub fn restore_session(
        &mut self,
        orig: &FlowKey4,
        reply: &FlowKey4,
        held: u8,
        masq: impl Fn(u32) -> bool,
    ) -> Result<(), RestoreRefused> {
        let cands = Self::session_candidates(orig, reply);
        // Each held mapping to make again: its external endpoint, its
        // internal port, and a flow out of its internal endpoint (whose
        // destination a mapping key under address-and-port-dependent
        // mapping holds).
        let mut want = [None, None];
        for (i, c) in cands.iter().enumerate() {
            if held & (1 << i) == 0 {
                continue;
            }
            let Some((r, int_port)) = c else {
                return Err(RestoreRefused::NoMapping);
            };
            match self.by_ext.get(&r.ext) {
                Some(m) if m.key.int_addr == r.subscriber && m.key.int_port == *int_port => {}
                Some(_) => return Err(RestoreRefused::PortTaken),
                None if i == 1 && self.mapping == MappingBehaviour::AddressAndPortDependent => {
                    return Err(RestoreRefused::NoMapping);
                }
                None => {
                    // The flow out of the internal endpoint: the session
                    // itself for its source side, its reply for the
                    // destination side (endpoint-independent mapping:
                    // the key has no destination).
                    let out = if i == 0 { *orig } else { *reply };
                    want[i] = Some((r.ext, *int_port, out));
                }
            }
        }
        let mut made: [Option<ExtKey>; 2] = [None, None];
        for (i, w) in want.into_iter().enumerate() {
            let Some((ext, int_port, out)) = w else {
                continue;
            };
            if made[0] == Some(ext) {
                continue;
            }
            if let Err(e) = self.remake_mapping(&out, ext, int_port, &masq) {
                // Give back what this session made, so nothing changes.
                for e in made.into_iter().flatten() {
                    self.remove_mapping(e);
                }
                return Err(e);
            }
            made[i] = Some(ext);
        }
        self.acquire(orig, reply);
        Ok(())
    }

    /// Take port `port` of address `ai` of pool `pid` (bitmap `map`) for
    /// a mapping of subscriber `sub`; under port block allocation its
    /// block too, which must be free (then it becomes the subscriber's,
    /// logged as a new block) or the subscriber's already, and under
    /// deterministic NAT the subscriber's own. The subscriber's block
    /// limit is not applied (it held the block). Nothing changes when
    /// refused.
    fn take_pool_port(
        &mut self,
        pid: u16,
        ai: usize,
        map: usize,
        port: u16,
        sub: u32,
    ) -> Result<(), RestoreRefused> {
        let Self {
            pools,
            stats,
            sink,
            worker,
            ..
        } = self;
        let pool = pools
            .get_mut(usize::from(pid))
            .ok_or(RestoreRefused::NotExternal)?;
        let Some(bl) = pool.blocks.as_mut() else {
            return pool
                .space
                .take(map, port)
                .map(|_| ())
                .ok_or(RestoreRefused::PortTaken);
        };
        let idx = pool
            .space
            .slice()
            .index(port)
            .ok_or(RestoreRefused::PortTaken)?;
        if idx >= bl.per_addr * bl.size {
            // The share's remainder, which no block covers.
            return Err(RestoreRefused::PortTaken);
        }
        let b = bl.block_of(ai, idx);
        // Deterministic NAT: only the subscriber's own block.
        match bl.det_block(sub) {
            Ok(None) => {}
            Ok(Some(d)) if d == b => {}
            _ => return Err(RestoreRefused::BlockTaken),
        }
        let fresh = match bl.owner.get(b as usize) {
            Some(Some(o)) if *o == sub => false,
            Some(None) => true,
            _ => return Err(RestoreRefused::BlockTaken),
        };
        if pool.space.take(map, port).is_none() {
            return Err(RestoreRefused::PortTaken);
        }
        if fresh {
            bl.take_exact(b, sub);
            stats.blocks_allocated += 1;
            let (first_port, last_port) = block_ports(&pool.space, bl, b);
            if let Some(&addr) = pool.addrs.get(ai) {
                sink.event(&NatEvent::BlockAllocated {
                    int_addr: std::net::Ipv4Addr::from(sub),
                    ext_addr: std::net::Ipv4Addr::from(addr),
                    first_port,
                    last_port,
                    worker: *worker,
                });
            }
        }
        if let Some(u) = bl.used.get_mut(b as usize) {
            *u += 1;
        }
        Ok(())
    }

    /// Make the mapping of `out`'s source (a flow out of its internal
    /// endpoint; internal port `int_port`) with external endpoint `ext`
    /// again, its port taken in the bitmap it belongs to, with no session
    /// yet.
    fn remake_mapping(
        &mut self,
        out: &FlowKey4,
        ext: ExtKey,
        int_port: u16,
        masq: &impl Fn(u32) -> bool,
    ) -> Result<(), RestoreRefused> {
        let pi = proto_index(out.proto).ok_or(RestoreRefused::Protocol)?;
        let (dst_addr, dst_port) = self.mapped_destination(out);
        // Checked before anything is taken.
        let int_of = |realm| MapKey {
            realm,
            proto: out.proto,
            int_addr: out.src,
            int_port,
            dst_addr,
            dst_port,
        };
        let (realm, space) = match self.pool_addr.get(&ext.addr).copied() {
            Some((pid, _))
                if self
                    .by_int
                    .get(&int_of(Realm::Pool(pid)).int_key())
                    .is_some() =>
            {
                return Err(RestoreRefused::Conflict)
            }
            Some((pid, ai)) => {
                let map = ai * PROTOS + pi;
                let map32 = u32::try_from(map).map_err(|_| RestoreRefused::PortTaken)?;
                self.take_pool_port(pid, ai, map, ext.port, out.src)?;
                (
                    Realm::Pool(pid),
                    Space::Pool {
                        pool: pid,
                        map: map32,
                    },
                )
            }
            None if masq(ext.addr)
                && self
                    .by_int
                    .get(&int_of(Realm::Masq(ext.addr)).int_key())
                    .is_some() =>
            {
                return Err(RestoreRefused::Conflict)
            }
            None if masq(ext.addr) => {
                let slot = self
                    .masq_slot(ext.addr)
                    .map_err(|_| RestoreRefused::MasqueradeSlots)?;
                let map = usize::from(slot) * PROTOS + pi;
                let map32 = u32::try_from(map).map_err(|_| RestoreRefused::PortTaken)?;
                self.masq_space
                    .take(map, ext.port)
                    .ok_or(RestoreRefused::PortTaken)?;
                if let Some(s) = self.masq_slots.get_mut(usize::from(slot)) {
                    s.mappings += 1;
                }
                (Realm::Masq(ext.addr), Space::Masq { slot, map: map32 })
            }
            None => return Err(RestoreRefused::NotExternal),
        };
        let key = int_of(realm);
        self.by_int.insert(key.int_key(), (ext.addr, ext.port), 0);
        self.by_ext.insert(ext, Mapping { key, space });
        self.count_slot(space, true);
        self.stats.mappings_created += 1;
        // With port blocks the block's event stands for its mappings.
        if self.in_blocks(space) {
            return Ok(());
        }
        self.sink.event(&NatEvent::MappingCreated {
            proto: key.proto,
            int_addr: std::net::Ipv4Addr::from(key.int_addr),
            int_port: key.int_port,
            ext_addr: std::net::Ipv4Addr::from(ext.addr),
            ext_port: ext.port,
            worker: self.worker,
        });
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::indexing_slicing, clippy::unwrap_used)]
    use super::*;
    use crate::config::{FilteringBehaviour, MappingBehaviour, NatConfig, Pool, PoolId};
    use crate::event::VecSink;
    use crate::Translation;
    use proptest::prelude::*;
    use sluice_wire::flow::proto;
    use std::net::Ipv4Addr;

    /// The gateway's own (masquerade) address.
    const IFACE: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 1);

    fn config(mapping: u8, filtering: u8) -> NatConfig {
        config_blocks(mapping, filtering, 0)
    }

    /// `blocks`: 0 none, 1 blocks of 8 ports, 2 the same, deterministic.
    fn config_blocks(mapping: u8, filtering: u8, blocks: u8) -> NatConfig {
        NatConfig {
            port_block_size: if blocks == 0 { 0 } else { 8 },
            deterministic: (blocks == 2).then_some((Ipv4Addr::new(10, 0, 0, 0), 29)),
            pools: vec![
                Pool::new([Ipv4Addr::new(192, 0, 2, 1), Ipv4Addr::new(192, 0, 2, 2)])
                    .with_ports(1024..=1100),
            ],
            mapping: if mapping == 0 {
                MappingBehaviour::EndpointIndependent
            } else {
                MappingBehaviour::AddressAndPortDependent
            },
            filtering: match filtering {
                0 => FilteringBehaviour::EndpointIndependent,
                1 => FilteringBehaviour::AddressDependent,
                _ => FilteringBehaviour::AddressAndPortDependent,
            },
            masquerade_ports: 2000..=2100,
            hairpinning: true,
            ..NatConfig::default()
        }
    }

    /// Everything a restore must give back: mappings with their session
    /// counts, free ports of every external address, per-subscriber and
    /// per-permit session counts, the session total.
    type Snapshot = (
        Vec<(u8, Ipv4Addr, u16, Ipv4Addr, u16, u32)>,
        Vec<Option<u32>>,
        Vec<(u32, u32)>,
        Vec<(String, u32)>,
        u64,
        Vec<(Vec<Option<u32>>, Vec<u32>, u32)>,
    );

    fn snapshot(n: &WorkerNat<VecSink>) -> Snapshot {
        let mut maps: Vec<_> = n
            .mappings()
            .map(|m| {
                (
                    m.proto, m.int_addr, m.int_port, m.ext_addr, m.ext_port, m.sessions,
                )
            })
            .collect();
        maps.sort_unstable();
        let free = [Ipv4Addr::new(192, 0, 2, 1), Ipv4Addr::new(192, 0, 2, 2)]
            .iter()
            .flat_map(|&a| [proto::TCP, proto::UDP, proto::ICMP].map(|p| n.free_ports(a, p)))
            .collect();
        let mut subs: Vec<_> = n.subscribers.iter().map(|(a, b)| (*a, *b)).collect();
        subs.sort_unstable();
        let mut permits: Vec<_> = n
            .permits
            .iter()
            .map(|(k, v)| (format!("{k:?}"), *v))
            .collect();
        permits.sort_unstable();
        // Port blocks: owners, ports in use, free count per pool.
        let blocks = n
            .pools
            .iter()
            .filter_map(|p| p.blocks.as_ref())
            .map(|b| (b.owner.clone(), b.used.clone(), b.free.iter().sum()))
            .collect();
        (maps, free, subs, permits, n.stats().sessions, blocks)
    }

    proptest! {
        // A NAT's live sessions (outbound through the pool and through
        // masquerade, inbound ones, hairpinned ones, ICMP queries; under
        // every mapping and filtering behaviour, with and without port
        // blocks, deterministic or not), taken back one by one in
        // any order into a new NAT of the same configuration, give it the
        // same mappings, ports, counts; and releasing them all empties
        // both alike.
        #[test]
        fn restored_sessions_give_the_same_nat(
            mapping in 0u8..2,
            filtering in 0u8..3,
            blocks in 0u8..3,
            ops in proptest::collection::vec((0u8..6, 1u8..5, 0u16..4, 0u8..3), 1..60),
            order in any::<u64>(),
        ) {
            let c = config_blocks(mapping, filtering, blocks);
            let mut old = WorkerNat::new(&c, 0, VecSink::default()).unwrap();
            let mut live: Vec<(FlowKey4, FlowKey4)> = Vec::new();
            for (op, host, port, remote) in ops {
                let int = Ipv4Addr::new(10, 0, 0, host);
                let rem = Ipv4Addr::new(198, 51, 100, remote);
                let r = match op {
                    0 | 1 => {
                        let k = FlowKey4::new(proto::UDP, int, 5000 + port, rem, 53);
                        let t = if op == 0 { Translation::Snat { pool: PoolId(0) } } else { Translation::Masquerade };
                        old.translate_outbound(&k, &t, Some(IFACE)).ok().map(|r| (k, r))
                    }
                    2 => {
                        let k = FlowKey4::new(proto::ICMP, int, 7 + port, rem, 7 + port);
                        old.translate_outbound(&k, &Translation::Snat { pool: PoolId(0) }, None).ok().map(|r| (k, r))
                    }
                    3 => {
                        // Inbound to a live mapping's external endpoint.
                        live.iter().find(|(k, r)| k.proto == proto::UDP && r.dst != k.src).map(|(_, r)| (r.dst, r.dport)).and_then(|(a, p)| {
                            let k = FlowKey4 { src: u32::from(rem), sport: 40 + port, dst: a, dport: p, proto: proto::UDP };
                            old.inbound_new(&k)
                        })
                    }
                    4 => {
                        // Hairpinned to a live mapping.
                        live.iter().find(|(k, r)| k.proto == proto::UDP && r.dst != k.src).map(|(_, r)| (r.dst, r.dport)).and_then(|(a, p)| {
                            let k = FlowKey4 { src: u32::from(int), sport: 6000 + port, dst: a, dport: p, proto: proto::UDP };
                            old.hairpin(&k).and_then(Result::ok).map(|r| (k, r))
                        })
                    }
                    _ => {
                        if !live.is_empty() {
                            let (k, r) = live.remove(usize::from(port) % live.len());
                            old.release(&k, &r);
                        }
                        None
                    }
                };
                if let Some(s) = r {
                    live.push(s);
                }
            }
            let mut new = WorkerNat::new(&c, 0, VecSink::default()).unwrap();
            // Any order: rotate by `order`.
            let k = if live.is_empty() { 0 } else { (order % live.len() as u64) as usize };
            let mut shuffled = live.clone();
            shuffled.rotate_left(k);
            if order & 1 == 1 {
                shuffled.reverse();
            }
            // Sessions that hold no destination-side mapping first, as the
            // engine restores them.
            shuffled.sort_by_key(|(o, r)| old.held_mappings(o, r) & 2 != 0);
            let mut refused = Vec::new();
            for (o, r) in &shuffled {
                let held = old.held_mappings(o, r);
                match new.restore_session(o, r, held, |a| a == u32::from(IFACE)) {
                    Ok(()) => {}
                    Err(RestoreRefused::NoMapping) if mapping == 1 && held & 2 != 0 => {
                        refused.push((*o, *r));
                    }
                    Err(e) => prop_assert!(false, "{:?} {:?}: {}", o, r, e),
                }
            }
            // What could not be restored ends in the old NAT too: then
            // the two are alike.
            for (o, r) in &refused {
                old.release(o, r);
            }
            prop_assert_eq!(snapshot(&new), snapshot(&old));
            for s in &live {
                if let Some(i) = refused.iter().position(|x| x == s) {
                    refused.swap_remove(i);
                    continue;
                }
                old.release(&s.0, &s.1);
                new.release(&s.0, &s.1);
            }
            prop_assert_eq!(snapshot(&new), snapshot(&old));
            prop_assert!(new.mappings().next().is_none(), "left: {:?}\nlive {:?}\nrefused {:?}", snapshot(&new), live, refused);
        }
    }

    /// Refused, and nothing changes: an external address that is neither
    /// a pool's nor masquerade's, a port another mapping holds, port block
    /// allocation.
    #[test]
    fn refusals_change_nothing() {
        let c = config(0, 0);
        let mut old = WorkerNat::new(&c, 0, VecSink::default()).unwrap();
        let k = FlowKey4::new(
            proto::UDP,
            Ipv4Addr::new(10, 0, 0, 1),
            5000,
            Ipv4Addr::new(198, 51, 100, 1),
            53,
        );
        let r = old
            .translate_outbound(&k, &Translation::Snat { pool: PoolId(0) }, None)
            .unwrap();
        let mut new = WorkerNat::new(&c, 0, VecSink::default()).unwrap();
        let before = snapshot(&new);
        let elsewhere = FlowKey4 {
            dst: u32::from(Ipv4Addr::new(192, 0, 2, 99)),
            ..r
        };
        assert_eq!(
            new.restore_session(&k, &elsewhere, 1, |_| false),
            Err(RestoreRefused::NotExternal)
        );
        assert_eq!(snapshot(&new), before);
        // Another host's session on the same external endpoint first.
        let other = FlowKey4 {
            src: u32::from(Ipv4Addr::new(10, 0, 0, 2)),
            ..k
        };
        new.restore_session(&other, &r, 1, |_| false).unwrap();
        let after = snapshot(&new);
        assert_eq!(
            new.restore_session(&k, &r, 1, |_| false),
            Err(RestoreRefused::PortTaken)
        );
        assert_eq!(snapshot(&new), after);
        // Two held mappings, the second not makeable (its address is no
        // NAT address): the first, made already, is taken back.
        let hair = FlowKey4::new(
            proto::UDP,
            Ipv4Addr::new(10, 0, 0, 3),
            5000,
            Ipv4Addr::new(203, 0, 113, 50),
            7000,
        );
        let hair_reply = FlowKey4::new(
            proto::UDP,
            Ipv4Addr::new(10, 0, 0, 4),
            6000,
            Ipv4Addr::new(192, 0, 2, 2),
            1050,
        );
        assert_eq!(
            new.restore_session(&hair, &hair_reply, 3, |_| false),
            Err(RestoreRefused::NotExternal)
        );
        assert_eq!(snapshot(&new), after);
        // A port outside this worker's slice.
        let out_of_range = FlowKey4 { dport: 40_000, ..r };
        assert_eq!(
            new.restore_session(&k, &out_of_range, 1, |_| false),
            Err(RestoreRefused::PortTaken)
        );
        assert_eq!(snapshot(&new), after);
        // Port blocks: a port of another subscriber's block is refused;
        // under deterministic NAT so is one outside the subscriber's own.
        for det in [false, true] {
            let mut blocks = config(0, 0);
            blocks.port_block_size = 8;
            if det {
                blocks.deterministic = Some((Ipv4Addr::new(10, 0, 0, 0), 29));
            }
            let mut b = WorkerNat::new(&blocks, 0, VecSink::default()).unwrap();
            let r1 = b
                .translate_outbound(&k, &Translation::Snat { pool: PoolId(0) }, None)
                .unwrap();
            let mut b2 = WorkerNat::new(&blocks, 0, VecSink::default()).unwrap();
            b2.restore_session(&k, &r1, 1, |_| false).unwrap();
            assert_eq!(snapshot(&b2), snapshot(&b));
            let before = snapshot(&b2);
            let next_port = FlowKey4 {
                dport: r1.dport + 1,
                ..r1
            };
            assert_eq!(
                b2.restore_session(&other, &next_port, 1, |_| false),
                Err(RestoreRefused::BlockTaken),
                "deterministic {det}"
            );
            assert_eq!(snapshot(&b2), before);
        }
    }
}
