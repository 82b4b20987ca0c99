//! The chains before conntrack and the untracked path: `notrack`.
//!
//! When the rule set has base chains that run before conntrack (prerouting,
//! priority below -200, [`Policy::has_raw`]), every IPv4 and IPv6 packet
//! addressed to the gateway's MAC meets them first, as in netfilter, where
//! they see the packet before `nf_conntrack_in`: `ct state` reads `invalid`
//! (no connection yet). Their drop or reject is final; their mark carries
//! on ([`Worker::pkt_mark`]). A `notrack` statement there makes the packet
//! *untracked*: it never looks up, creates or refreshes a connection, no
//! NAT chain runs for it and nothing rewrites it (an untracked reply of a
//! translated connection is not translated back, as in the kernel); the
//! later chains see `ct state untracked`, and it is routed and forwarded
//! with its TTL decremented, or answered when it is for the gateway.
//!
//! A later fragment (no ports) does not meet the chains before conntrack:
//! it follows its first fragment, untracked or not (the kernel reassembles
//! before the raw chains; Sluice does not, see `frag`). Packets of a rule
//! set with such chains are never offloaded to XDP (the chains must see
//! every packet) and never take the established fast path's shortcut.
//!
//! A frame handed to another worker (hairpinning, port-changing DNAT, a
//! reply that reached the wrong worker) met the chains before conntrack on
//! the worker that received it; the one it is handed to does not run them
//! again (their counters and limits count it once), so a mark they set
//! does not travel with it.
//!
//! The cost: with raw chains, every packet is dissected once more and
//! classified once more, as netfilter classifies it once more.

use sluice_conntrack as ct;
use sluice_wire::dissect::{dissect, Dissect, Net, L4};
use sluice_wire::flow::{proto, FlowKey4, FlowKey6};
use sluice_wire::ndp;

use super::v6::{policy_packet6, Pkt6};
use super::{is_group, policy_packet, Step, Worker};
use crate::drop::DropReason;
use crate::policy::{CtState, Hook, MssClamp, PolicyPacket, Verdict};

/// The hooks of a forwarded packet after routing.
const FORWARD_HOOKS: &[Hook] = &[Hook::Forward, Hook::Postrouting];
use crate::route::IfIndex;
use crate::Action;

impl Worker {
    /// The chains before conntrack for one frame (only when the policy has
    /// them). `Some(step)`: decided here (refused, or untracked and then
    /// forwarded, answered or dropped); `None`: go on with conntrack, the
    /// mark the chains left in [`Worker::pkt_mark`].
    #[cold]
    #[inline(never)]
    pub(super) fn raw_stage(
        &mut self,
        now: ct::Instant,
        buf: &mut [u8],
        len: usize,
        iif: IfIndex,
    ) -> Option<Step> {
        // A frame another worker handed over met the chains before
        // conntrack there.
        if self.handed_in {
            return None;
        }
        // Anything the dissector refuses is the regular path's to drop
        // and count (the kernel drops it before the hooks too).
        let d = dissect(buf.get(..len)?).ok()?;
        match d.net {
            Net::Ipv4 { key, ttl, .. } => {
                if let L4::NonFirstFragment = d.l4 {
                    return None;
                }
                let mut pp = policy_packet(iif, &key, &d, CtState::Invalid, buf);
                self.addr_types4(&mut pp);
                self.stamp(&mut pp);
                let raw = self.policy.raw(&pp);
                self.pkt_mark = raw.decision.mark;
                if raw.decision.verdict != Verdict::Accept {
                    return Some(self.refuse4(
                        now,
                        buf,
                        len,
                        d.l3_off,
                        d.l4_off,
                        iif,
                        raw.decision.verdict,
                    ));
                }
                raw.untracked
                    .then(|| self.untracked4(now, buf, len, iif, &d, &key, ttl, raw.decision.mss))
            }
            Net::Ipv6 {
                key,
                hop_limit,
                payload_len,
                ..
            } => {
                if let L4::NonFirstFragment = d.l4 {
                    return None;
                }
                let mut pp = policy_packet6(iif, &key, &d, CtState::Invalid, payload_len, buf);
                self.addr_types6(iif, &mut pp);
                self.stamp(&mut pp);
                let raw = self.policy.raw(&pp);
                self.pkt_mark = raw.decision.mark;
                let pk = Pkt6::of(&d, hop_limit, payload_len);
                if raw.decision.verdict != Verdict::Accept {
                    return Some(self.refuse6(now, buf, len, iif, &pk, raw.decision.verdict));
                }
                raw.untracked
                    .then(|| self.untracked6(now, buf, len, iif, &d, &key, &pk, raw.decision.mss))
            }
            Net::Arp { .. } | Net::Other(_) => None,
        }
    }

    /// The filter chains of `hooks` for an untracked packet (its NAT
    /// chains never run: it is not new): the mark carries from one to the
    /// next, the MSS statements add up; the verdict of the first that
    /// refuses it.
    fn untracked_hooks(
        &self,
        hooks: &[Hook],
        pp: &mut PolicyPacket,
        mss: &mut MssClamp,
    ) -> Result<(), Verdict> {
        for &hook in hooks {
            let dec = self.policy.decide(hook, pp);
            pp.mark = dec.mark;
            *mss = mss.and(dec.mss);
            if dec.verdict != Verdict::Accept {
                return Err(dec.verdict);
            }
        }
        Ok(())
    }

    /// An untracked IPv4 packet after the chains before conntrack: the
    /// receive checks, then the gateway's own (input hook) or routed
    /// through the prerouting, forward and postrouting filter chains and
    /// forwarded unchanged but for its TTL.
    #[allow(clippy::too_many_arguments)]
    #[cold]
    #[inline(never)]
    fn untracked4(
        &mut self,
        now: ct::Instant,
        buf: &mut [u8],
        len: usize,
        iif: IfIndex,
        d: &Dissect,
        key: &FlowKey4,
        ttl: u8,
        raw_mss: MssClamp,
    ) -> Step {
        let broadcast = match self.receive4(buf, key) {
            Ok(b) => b,
            Err(r) => return Step::Done(Action::Drop(r)),
        };
        self.counters.untracked += 1;
        let mut pp = policy_packet(iif, key, d, CtState::Untracked, buf);
        self.addr_types4(&mut pp);
        self.stamp(&mut pp);
        // Prerouting after conntrack: its filter chains (the NAT chains
        // never see an untracked packet).
        let mut mss = raw_mss;
        if let Err(v) = self.untracked_hooks(&[Hook::Prerouting], &mut pp, &mut mss) {
            return self.refuse4(now, buf, len, d.l3_off, d.l4_off, iif, v);
        }
        if broadcast || self.is_local(key.dst).is_some() {
            return self.local4(now, buf, len, iif, d, key, &pp);
        }
        let (oif, nh) = match self.route(key.dst) {
            Ok(x) => x,
            Err(r) => return Step::Done(Action::Drop(r)),
        };
        let adj = match self.egress4(now, buf, len, usize::from(d.l3_off), iif, ttl, (oif, nh)) {
            Ok(a) => a,
            Err(s) => return s,
        };
        pp.oif = Some(oif);
        pp.ttl = pp.ttl.saturating_sub(1);
        if let Err(v) = self.untracked_hooks(FORWARD_HOOKS, &mut pp, &mut mss) {
            return self.refuse4(now, buf, len, d.l3_off, d.l4_off, iif, v);
        }
        if !mss.is_none() && key.proto == proto::TCP {
            // `rt mtu`: the route out and, when it resolves, the route back.
            let back = self
                .route(key.src)
                .ok()
                .and_then(|(o, n)| self.neighbor(o, n).ok())
                .map_or(u16::MAX, |a| self.adj_mtu(a));
            let rt = self.adj_mtu(adj).min(back);
            super::clamp_mss(buf, len, usize::from(d.l4_off), mss, rt, 40);
        }
        // Nothing is translated: the rewrite writes back the addresses and
        // ports (for ICMP, the identifier word, whatever the message; an
        // error's quoted packet is left alone) and the deltas are the
        // TTL's alone.
        let same = if key.proto == proto::ICMP {
            let Some(w) = super::read16(buf, usize::from(d.l4_off) + 4) else {
                return Step::Done(Action::Drop(DropReason::Malformed));
            };
            FlowKey4 { sport: w, ..*key }
        } else {
            *key
        };
        self.emit(
            now,
            buf,
            len,
            iif,
            d.l3_off,
            d.l4_off,
            &same,
            (super::TTL_DELTA, 0),
            adj,
        )
    }

    /// An untracked IPv6 packet after the chains before conntrack, as
    /// [`Self::untracked4`] for IPv4 (neighbour discovery is answered as
    /// always).
    #[allow(clippy::too_many_arguments)]
    #[cold]
    #[inline(never)]
    fn untracked6(
        &mut self,
        now: ct::Instant,
        buf: &mut [u8],
        len: usize,
        iif: IfIndex,
        d: &Dissect,
        key: &FlowKey6,
        pk: &Pkt6,
        raw_mss: MssClamp,
    ) -> Step {
        let drop = |r| Step::Done(Action::Drop(r));
        if let L4::IcmpOther { ty, .. } = d.l4 {
            if (ndp::ROUTER_SOLICIT..=ndp::REDIRECT).contains(&ty) {
                return self.ndp(buf, len, iif, d, key, pk.hop_limit, pk.payload_len, ty);
            }
        }
        let local = self.v6.is_local(iif, key.dst);
        if is_group(buf) && !local && !ndp::is_multicast(key.dst) {
            return drop(DropReason::LinkBroadcast);
        }
        self.counters.untracked += 1;
        if local {
            return self.local6(now, buf, len, iif, d, key, pk, CtState::Untracked);
        }
        if let Some(r) = super::v6::unforwardable6(key) {
            return drop(r);
        }
        let mut pp = policy_packet6(iif, key, d, CtState::Untracked, pk.payload_len, buf);
        self.addr_types6(iif, &mut pp);
        self.stamp(&mut pp);
        let mut mss = raw_mss;
        if let Err(v) = self.untracked_hooks(&[Hook::Prerouting], &mut pp, &mut mss) {
            return self.refuse6(now, buf, len, iif, pk, v);
        }
        let (oif, nh) = match self.v6.route(key.dst) {
            Ok(x) => x,
            Err(r) => return drop(r),
        };
        let adj = match self.egress6(now, buf, len, iif, pk, (oif, nh)) {
            Ok(a) => a,
            Err(s) => return s,
        };
        pp.oif = Some(oif);
        pp.ttl = pp.ttl.saturating_sub(1);
        if let Err(v) = self.untracked_hooks(FORWARD_HOOKS, &mut pp, &mut mss) {
            return self.refuse6(now, buf, len, iif, pk, v);
        }
        if !mss.is_none() {
            let back = self
                .v6
                .route(key.src)
                .ok()
                .and_then(|(o, n)| self.neighbor6(o, n).ok())
                .unwrap_or(adj);
            self.clamp_mss6(buf, len, pk, mss, [adj, back]);
        }
        self.emit6(now, buf, len, iif, pk, adj)
    }
}
