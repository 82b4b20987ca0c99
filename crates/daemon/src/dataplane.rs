//! One worker thread: its ports, its engine [`Worker`], its ARP resolver,
//! run to completion.
//!
//! Loop: drain the command channel (never blocks) -> for each port:
//! `rx_batch`, learn from ARP and NDP, `process` with one monotonic clock reading
//! per batch, transmit `Forward` frames to their port and `Reply` frames
//! back out of the ingress port, hand `no-neighbor` drops to the resolver ->
//! incremental GC, ARP and NDP retransmits and IPv6 neighbour aging every
//! [`HOUSEKEEPING_NS`] -> when
//! nothing arrived, wait up to 1 ms on one port's descriptor.
//!
//! The packet path takes no lock: the control plane talks to the worker
//! only through its bounded command channel, polled between batches.
//!
//! With several workers, a frame the engine hands to another worker
//! ([`Action::Handoff`]) is copied into one of this worker's preallocated
//! buffers and sent over the owner's bounded handoff channel ([`Handoff`]);
//! the owner drains its channel once per loop turn, processes the frames
//! as one batch ([`Worker::process_handed_off`]) and sends each buffer
//! back to the worker it came from. Nothing is allocated after start; a
//! frame that finds no free buffer or a full channel is dropped and counted
//! (`handoff_dropped` in `status`).

use core::net::{Ipv4Addr, Ipv6Addr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, Sender, SyncSender, TrySendError};
use std::sync::Arc;
use std::time::Instant;

use sluice_engine::offload::{OffloadOp, OffloadProbe};
use sluice_engine::{
    Action, DropReason, Frames, IfIndex, Policy, Route4, Route6, Worker, MAX_BATCH,
};
use sluice_io::{
    BackendKind, Batch, OffloadAction, OffloadAction6, OffloadKey, OffloadKey6, Port, PortStats,
    XdpOffload,
};
use sluice_wire::flow::{FlowKey4, FlowKey6};

use crate::ctl::{CtEntry, CtFilter};
use crate::neigh::{parse_arp, Resolver, Todo};
use crate::neigh6::{parse_ndp, Origin, Resolver6};

/// Buffers each worker owns for handing frames to other workers.
pub const HANDOFF_BUFFERS: usize = 512;
/// Messages a worker's handoff channel holds.
pub const HANDOFF_QUEUE: usize = 2 * HANDOFF_BUFFERS;
/// Bytes of a handoff buffer (the largest frame the ports receive).
pub const HANDOFF_FRAME: usize = 2048;

/// A message between workers.
pub enum HandoffMsg {
    /// A frame for the receiving worker to process, received by worker
    /// `from` on interface `iif`, in `buf`.
    Frame {
        /// The worker that sent it (and gets `buf` back).
        from: u16,
        /// [`Action::Steer`]: processed as if steered here (it may be
        /// handed on once more); else [`Action::Handoff`], decided here.
        steer: bool,
        /// Ingress interface.
        iif: IfIndex,
        /// The frame.
        buf: Vec<u8>,
    },
    /// A buffer coming back to its owner.
    Return(Vec<u8>),
}

/// A worker's side of the handoff between workers.
pub struct Handoff {
    inbox: Receiver<HandoffMsg>,
    /// Every worker's inbox, by worker index.
    outboxes: Vec<SyncSender<HandoffMsg>>,
    free: Vec<Vec<u8>>,
    /// Frames that could not be handed over (no buffer, channel full, too
    /// long).
    dropped: u64,
}

impl Handoff {
    /// `inbox`: this worker's channel; `outboxes`: every worker's, by index.
    pub fn new(inbox: Receiver<HandoffMsg>, outboxes: Vec<SyncSender<HandoffMsg>>) -> Self {
        let free = if outboxes.len() > 1 {
            (0..HANDOFF_BUFFERS)
                .map(|_| Vec::with_capacity(HANDOFF_FRAME))
                .collect()
        } else {
            Vec::new()
        };
        Self {
            inbox,
            outboxes,
            free,
            dropped: 0,
        }
    }

    /// Send frame `data` (received on `iif`) to worker `to`.
    fn send(&mut self, from: u16, to: u16, steer: bool, iif: IfIndex, data: &[u8]) {
        let (Some(out), true) = (
            self.outboxes.get(usize::from(to)),
            data.len() <= HANDOFF_FRAME,
        ) else {
            self.dropped += 1;
            return;
        };
        let Some(mut buf) = self.free.pop() else {
            self.dropped += 1;
            return;
        };
        buf.clear();
        buf.extend_from_slice(data);
        if let Err(TrySendError::Full(m) | TrySendError::Disconnected(m)) =
            out.try_send(HandoffMsg::Frame {
                from,
                steer,
                iif,
                buf,
            })
        {
            self.dropped += 1;
            let (HandoffMsg::Frame { buf, .. } | HandoffMsg::Return(buf)) = m;
            self.free.push(buf);
        }
    }

    /// Give `buf` back to worker `to` (kept here if its channel is full).
    fn give_back(&mut self, to: u16, buf: Vec<u8>) {
        match self.outboxes.get(usize::from(to)) {
            Some(out) => {
                if let Err(TrySendError::Full(m) | TrySendError::Disconnected(m)) =
                    out.try_send(HandoffMsg::Return(buf))
                {
                    let (HandoffMsg::Frame { buf, .. } | HandoffMsg::Return(buf)) = m;
                    self.free.push(buf);
                }
            }
            None => self.free.push(buf),
        }
    }
}

/// Housekeeping period (GC slice, ARP retries).
pub const HOUSEKEEPING_NS: u64 = 10_000_000;
/// Connection entries GC looks at per housekeeping slice.
pub const GC_BUDGET: usize = 4096;
/// Table slots a filtered `conntrack flush` or `count` looks at per loop
/// turn: a median 52 us counting and 88 us removing on the development
/// VM (`sluice-engine`'s `walk` example, 40 M connections), so no batch
/// waits longer than that, and a walk of 40 M slots takes 1221 turns.
pub const WALK_BUDGET: usize = 32_768;

/// A request to a worker, answered on the enclosed channel.
pub enum Command {
    /// Counters, port stats, table size.
    Status(Sender<WorkerStatus>),
    /// List connections matching the filter (at most `limit`), by a walk
    /// as for [`Command::Walk`].
    List(CtFilter, usize, Sender<Vec<CtEntry>>),
    /// Remove every connection; answers how many were removed.
    Flush(Sender<u64>),
    /// Count (`false`) or remove (`true`) the connections the filter
    /// selects, by a walk of the tables in steps between batches
    /// ([`WALK_BUDGET`] slots each, one walk after the other); answers
    /// how many when the walk ends.
    Walk(CtFilter, bool, Sender<u64>),
    /// Who holds a NAT external endpoint, or what a subscriber holds.
    NatLookup(NatQuery, Sender<serde_json::Value>),
    /// A neighbour learnt by another worker or configured statically.
    SetNeighbor(Ipv4Addr, [u8; 6]),
    /// An IPv6 neighbour (interface, address, MAC, static) learnt by
    /// another worker or configured statically.
    SetNeighbor6(IfIndex, Ipv6Addr, [u8; 6], bool),
    /// An IPv6 neighbour another worker learnt and found unreachable.
    ForgetNeighbor6(IfIndex, Ipv6Addr),
    /// Close the ports of these interfaces (indexes into the ports; an
    /// interface came back and the control plane opens them again, see
    /// [`Attach`]); answered once they are closed. Until
    /// [`Command::Attach`], frames routed out of them are counted as
    /// transmit drops.
    Detach(Vec<usize>, Sender<()>),
    /// Take a new set of ports.
    Attach(Box<Attach>),
    /// Replace the static routes (IPv4, IPv6): a reload. Answers the
    /// engine's refusal, if any (nothing changed then).
    SetRoutes(Box<(Vec<Route4>, Vec<Route6>)>, Sender<Result<(), String>>),
    /// A reload's interface addresses (IPv4 per engine interface, IPv6 as
    /// `EngineConfig::addrs6`) with the static routes (`Worker::set_addrs`);
    /// the resolvers follow and new IPv4 addresses are announced.
    SetAddrs(Box<AddrChange>, Sender<Result<(), String>>),
    /// A reload's `[nat]` switches (`Worker::set_nat_settings`).
    SetNat(Box<sluice_nat::NatConfig>, Sender<Result<(), String>>),
    /// Forget static neighbours taken out of the configuration (a reload):
    /// IPv4 addresses, and IPv6 (interface, address) pairs.
    ForgetStatic(Box<ForgetStatic>),
    /// Replace the conntrack timeouts (a reload).
    SetTimeouts(Box<sluice_conntrack::Timeouts>, Sender<()>),
    /// Change the worker's conntrack maximums, IPv4 and IPv6 (a reload;
    /// `Worker::set_ct_max`).
    SetCtMax(u64, u64, Sender<Result<(), String>>),
    /// The `ct timeout` policy slots the worker's connections follow
    /// (`Worker::ct_timeout_slots_held`), for `sluice_engine::ct_timeout`
    /// to take back the others.
    CtTimeoutsHeld(Sender<[u64; 4]>),
}

/// Static neighbours taken out of the configuration
/// ([`Command::ForgetStatic`]): IPv4 addresses, and IPv6 (interface,
/// address) pairs.
pub type ForgetStatic = (Vec<Ipv4Addr>, Vec<(IfIndex, Ipv6Addr)>);

/// A worker's new ports after an interface came back ([`Command::Attach`]).
pub struct Attach {
    /// The new ports, by index (those [`Command::Detach`] closed); a
    /// [`Detached`] one for an interface that could not be opened.
    pub ports: Vec<(usize, Box<dyn Port>)>,
    /// Interfaces replaced by new ones: (engine interface, MAC, MTU).
    pub relinked: Vec<(IfIndex, [u8; 6], u16)>,
    /// Kernel ifindex of every engine interface, for the offload (`None`:
    /// unchanged).
    pub offload_ifindex: Option<Vec<u32>>,
    /// Answered once the ports are in use.
    pub done: Sender<()>,
}

/// A port that is not there: its interface is gone, or the gateway is
/// re-opening its ports. It receives nothing and sends nothing.
pub struct Detached {
    name: String,
    kind: BackendKind,
}

impl Detached {
    /// In place of a port on interface `name` of backend `kind`.
    pub fn new(name: &str, kind: BackendKind) -> Self {
        Self {
            name: name.to_string(),
            kind,
        }
    }
}

impl Port for Detached {
    fn name(&self) -> &str {
        &self.name
    }
    fn kind(&self) -> BackendKind {
        self.kind
    }
    fn describe(&self) -> String {
        "detached (not open)".into()
    }
    fn rx_batch(&mut self, _: &mut Batch) -> usize {
        0
    }
    fn tx_batch(&mut self, _: &mut Batch, _: &[u16]) -> usize {
        0
    }
    fn flush(&mut self) -> Result<(), sluice_io::IoError> {
        Ok(())
    }
    fn poll_fd(&self) -> Option<std::os::fd::RawFd> {
        None
    }
    fn stats(&mut self) -> PortStats {
        PortStats::default()
    }
}

/// A `sluice ctl nat lookup` question.
#[derive(Debug, Clone, Copy)]
pub enum NatQuery {
    /// The mappings (every protocol, or `proto`) and the port block of an
    /// external endpoint.
    Endpoint(Ipv4Addr, u16, Option<u8>),
    /// The mappings and port blocks of an internal address.
    Subscriber(Ipv4Addr),
}

fn mapping_json(m: &sluice_nat::MappingInfo, worker: u16) -> serde_json::Value {
    serde_json::json!({"proto": m.proto, "int_addr": m.int_addr, "int_port": m.int_port,
        "ext_addr": m.ext_addr, "ext_port": m.ext_port, "sessions": m.sessions,
        "retired": m.retired, "worker": worker})
}

/// One worker's answer to a [`NatQuery`]: `{"mappings": [...], "blocks":
/// [...]}`.
fn nat_lookup<S: sluice_nat::NatEventSink>(
    nat: &sluice_nat::WorkerNat<S>,
    q: NatQuery,
    worker: u16,
) -> serde_json::Value {
    let block = |sub: Ipv4Addr, ext: Ipv4Addr, first: u16, last: u16| {
        serde_json::json!({"int_addr": sub, "ext_addr": ext, "first_port": first,
            "last_port": last, "worker": worker})
    };
    match q {
        NatQuery::Endpoint(addr, port, proto) => {
            let mappings: Vec<_> = [6u8, 17, 1]
                .into_iter()
                .filter(|p| proto.is_none_or(|q| q == *p))
                .filter_map(|p| nat.mapping_by_ext(p, addr, port))
                .map(|m| mapping_json(&m, worker))
                .collect();
            let blocks: Vec<_> = nat
                .block_by_ext(addr, port)
                .map(|(sub, f, l)| block(sub, addr, f, l))
                .into_iter()
                .collect();
            serde_json::json!({"mappings": mappings, "blocks": blocks})
        }
        NatQuery::Subscriber(sub) => {
            let mappings: Vec<_> = nat
                .mappings_of(sub)
                .map(|m| mapping_json(&m, worker))
                .collect();
            let blocks: Vec<_> = nat
                .blocks_of(sub)
                .into_iter()
                .map(|(ext, f, l)| block(sub, ext, f, l))
                .collect();
            serde_json::json!({"mappings": mappings, "blocks": blocks})
        }
    }
}

/// A snapshot of one worker.
#[derive(Debug, Clone, serde::Serialize)]
pub struct WorkerStatus {
    /// Worker index.
    pub worker: u16,
    /// Engine counters.
    pub counters: sluice_engine::Counters,
    /// Connections tracked.
    pub connections: usize,
    /// IPv6 connections tracked.
    pub connections6: usize,
    /// Live connections (IPv4 and IPv6) evicted early to make room for new
    /// ones since the worker started (netfilter's `early_drop`).
    pub ct_early_drops: u64,
    /// The IPv4 and IPv6 tables' maximums (a reload may change them).
    pub ct_max: [usize; 2],
    /// The connections the IPv4 and IPv6 tables were built for.
    pub ct_capacity: [usize; 2],
    /// Ports: (interface, backend description, stats).
    pub ports: Vec<PortStatus>,
    /// Neighbours known.
    pub neighbors: Vec<(Ipv4Addr, String)>,
    /// Next hops being resolved, frames held.
    pub arp_pending: (usize, usize),
    /// IPv6 neighbours known: (address%interface index, MAC, static).
    pub neighbors6: Vec<(String, String, bool)>,
    /// IPv6 next hops being resolved, frames held.
    pub ndp_pending: (usize, usize),
    /// Held frames dropped because resolution failed.
    pub arp_dropped: u64,
    /// Frames a port did not accept (ring full) after one retry.
    pub tx_dropped: u64,
    /// Frames that could not be handed to their owner worker (no free
    /// buffer, its channel full).
    pub handoff_dropped: u64,
    /// XDP offload (`xdp_offload = true`), if on.
    pub offload: Option<OffloadStatus>,
    /// NAT pool changes the worker could not take (see
    /// `sluice_engine::Worker::nat_pools_refused`).
    pub nat_pools_refused: u64,
    /// NAT counters.
    #[serde(skip)]
    pub nat: sluice_nat::NatStats,
    /// This worker's ports on each pool address.
    pub pools: Vec<PoolAddrStatus>,
    /// The worker thread's scheduling as the kernel reports it: `"other"`
    /// or `"fifo N"` (`worker_priority`).
    pub scheduler: String,
}

/// One pool address as one worker sees it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct PoolAddrStatus {
    /// The address.
    pub addr: Ipv4Addr,
    /// This worker's share of the pool's port range.
    pub ports: u64,
    /// Free ports of that share: TCP, UDP, ICMP identifiers.
    pub free: [u64; 3],
    /// With port blocks: (free blocks, blocks) of that share.
    pub blocks: Option<(u64, u64)>,
}

fn pool_status<S: sluice_nat::NatEventSink>(nat: &sluice_nat::WorkerNat<S>) -> Vec<PoolAddrStatus> {
    nat.pool_addresses()
        .map(|(addr, ports, blocks)| PoolAddrStatus {
            addr,
            ports: u64::from(ports),
            free: [6u8, 17, 1].map(|p| u64::from(nat.free_ports(addr, p).unwrap_or(0))),
            blocks: blocks.map(|(f, n)| (u64::from(f), u64::from(n))),
        })
        .collect()
}

/// One worker's XDP offload counters.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct OffloadStatus {
    /// Directions handed to the XDP program.
    pub installed: u64,
    /// Directions taken back.
    pub removed: u64,
    /// Installs that found no room (the key's window of the table full)
    /// or that the queue had no room for.
    pub failed: u64,
    /// Times every direction was taken back (policy, neighbour, flush).
    pub clears: u64,
}

/// The XDP offload map as one worker drives it: it applies the engine's
/// [`OffloadOp`]s and answers the engine's GC from the map's counters.
pub struct OffloadLink {
    /// The map (shared by every worker and port).
    pub map: Arc<XdpOffload>,
    /// Kernel ifindex of engine interface `i` (0: none).
    pub ifindex: Vec<u32>,
    /// Engine time of the current housekeeping turn (what the GC probe
    /// answers for a direction that was used).
    pub now_ns: u64,
    /// Per offloaded direction, its packet count when the GC last looked.
    pub seen: std::collections::HashMap<OffloadKey, u64>,
    /// The same for IPv6 directions.
    pub seen6: std::collections::HashMap<OffloadKey6, u64>,
    /// Counters.
    pub status: OffloadStatus,
}

impl OffloadLink {
    /// Kernel ifindex of engine interface `i` (0: none).
    fn kernel_ifindex(&self, i: IfIndex) -> u32 {
        self.ifindex.get(usize::from(i)).copied().unwrap_or(0)
    }

    fn key(&self, iif: IfIndex, k: &FlowKey4) -> OffloadKey {
        OffloadKey {
            ifindex: self.kernel_ifindex(iif),
            src: k.src,
            dst: k.dst,
            sport: k.sport,
            dport: k.dport,
            proto: k.proto,
        }
    }

    fn key6(&self, iif: IfIndex, k: &FlowKey6) -> OffloadKey6 {
        OffloadKey6 {
            ifindex: self.kernel_ifindex(iif),
            src: k.src,
            dst: k.dst,
            sport: k.sport,
            dport: k.dport,
            proto: k.proto,
        }
    }

    /// An install's outcome in the counters (the first failure logged).
    fn installed(&mut self, ok: bool) {
        if ok {
            self.status.installed += 1;
            return;
        }
        if self.status.failed == 0 {
            tracing::warn!(
                "XDP offload install failed (no room in the table); such flows stay in userspace"
            );
        }
        self.status.failed += 1;
    }

    /// Apply every request the engine queued, in order (writes into the
    /// shared table, no system call).
    fn apply(&mut self, engine: &mut Worker) {
        let Some(q) = engine.offload_ops() else {
            return;
        };
        if q.is_empty() && q.dropped == 0 {
            return;
        }
        self.status.failed += core::mem::take(&mut q.dropped);
        for op in q.drain() {
            match op {
                OffloadOp::Install(f) => {
                    let k = self.key(f.iif, &f.key);
                    let a = OffloadAction {
                        src: f.to.src,
                        dst: f.to.dst,
                        sport: f.to.sport,
                        dport: f.to.dport,
                        ip_delta: f.ip_delta,
                        l4_delta: f.l4_delta,
                        dst_mac: f.adj.dst_mac,
                        src_mac: f.adj.src_mac,
                        oif: self.kernel_ifindex(f.adj.oif),
                        mtu: f.adj.mtu,
                    };
                    // An install starts the direction's counter at 0 (an
                    // install again too): the GC's last look starts over.
                    self.seen.remove(&k);
                    let ok = k.ifindex != 0 && a.oif != 0 && self.map.install(&k, &a);
                    self.installed(ok);
                }
                OffloadOp::Install6(f) => {
                    let k = self.key6(f.iif, &f.key);
                    let a = OffloadAction6 {
                        dst_mac: f.adj.dst_mac,
                        src_mac: f.adj.src_mac,
                        oif: self.kernel_ifindex(f.adj.oif),
                        mtu: f.adj.mtu,
                    };
                    self.seen6.remove(&k);
                    let ok = k.ifindex != 0 && a.oif != 0 && self.map.install6(&k, &a);
                    self.installed(ok);
                }
                OffloadOp::Remove { iif, key } => {
                    let k = self.key(iif, &key);
                    self.seen.remove(&k);
                    if self.map.remove(&k) {
                        self.status.removed += 1;
                    }
                }
                OffloadOp::Remove6 { iif, key } => {
                    let k = self.key6(iif, &key);
                    self.seen6.remove(&k);
                    if self.map.remove6(&k) {
                        self.status.removed += 1;
                    }
                }
                OffloadOp::Clear => {
                    self.seen.clear();
                    self.seen6.clear();
                    self.status.clears += 1;
                    self.map.clear();
                }
            }
        }
    }
}

/// The program keeps no clock (a clock read per packet costs more than the
/// answer is worth): a direction counts as used now when its packet count
/// moved since the GC last looked at it (or since it was installed). An
/// idle offloaded connection therefore expires between one and two idle
/// timeouts after its last packet, where the engine's own entries expire
/// after one (netfilter's flowtable also ages offloaded flows coarsely).
impl OffloadProbe for OffloadLink {
    fn last_used_ns(&mut self, iif: IfIndex, key: &FlowKey4) -> Option<u64> {
        let k = self.key(iif, key);
        let st = self.map.stats(&k)?;
        let before = self.seen.insert(k, st.packets).unwrap_or(0);
        // `!=`, not `>`: an install starts the counter over, and a count
        // that went back is a use too (at worst one idle timeout more).
        (st.packets != before).then_some(self.now_ns)
    }

    fn last_used6_ns(&mut self, iif: IfIndex, key: &FlowKey6) -> Option<u64> {
        let k = self.key6(iif, key);
        let st = self.map.stats6(&k)?;
        let before = self.seen6.insert(k, st.packets).unwrap_or(0);
        (st.packets != before).then_some(self.now_ns)
    }
}

/// The listing of IPv4 connection `e` of worker `id`, with what the XDP
/// offload forwarded of it (one map lookup per offloaded direction).
fn listing4(
    engine: &Worker,
    offload: Option<&OffloadLink>,
    id: u16,
    e: &sluice_conntrack::Entry<FlowKey4, sluice_engine::worker::FlowInfo>,
    now: sluice_conntrack::Instant,
) -> Option<CtEntry> {
    let mut c = CtEntry::of(id, e, now)?;
    if let (Some(o), true) = (offload, c.offloaded) {
        c.offload_packets = Some(
            engine
                .offloaded_directions(e)
                .filter_map(|(iif, k)| o.map.stats(&o.key(iif, &k)))
                .map(|st| st.packets)
                .sum(),
        );
    }
    Some(c)
}

/// [`listing4`] for an IPv6 connection.
fn listing6(
    engine: &Worker,
    offload: Option<&OffloadLink>,
    id: u16,
    e: &sluice_conntrack::Entry<FlowKey6, sluice_engine::worker::FlowInfo6>,
    now: sluice_conntrack::Instant,
) -> Option<CtEntry> {
    let mut c = CtEntry::of6(id, e, now)?;
    if let (Some(o), true) = (offload, c.offloaded) {
        c.offload_packets = Some(
            engine
                .offloaded_directions6(e)
                .filter_map(|(iif, k)| o.map.stats6(&o.key6(iif, &k)))
                .map(|st| st.packets)
                .sum(),
        );
    }
    Some(c)
}

/// One port's status.
#[derive(Debug, Clone, serde::Serialize)]
pub struct PortStatus {
    /// Interface name.
    pub interface: String,
    /// Backend kind.
    pub backend: String,
    /// Mode description.
    pub mode: String,
    /// rx/tx counters.
    pub rx_frames: u64,
    /// Bytes received.
    pub rx_bytes: u64,
    /// Kernel drops on receive.
    pub rx_kernel_drops: u64,
    /// Frames transmitted.
    pub tx_frames: u64,
    /// Bytes transmitted.
    pub tx_bytes: u64,
    /// Transmit ring full.
    pub tx_ring_full: u64,
    /// Transmit errors.
    pub tx_errors: u64,
}

fn port_status(p: &mut dyn Port) -> PortStatus {
    let s: PortStats = p.stats();
    let kind: BackendKind = p.kind();
    PortStatus {
        interface: p.name().to_string(),
        backend: kind.to_string(),
        mode: p.describe(),
        rx_frames: s.rx_frames,
        rx_bytes: s.rx_bytes,
        rx_kernel_drops: s.rx_kernel_drops,
        tx_frames: s.tx_frames,
        tx_bytes: s.tx_bytes,
        tx_ring_full: s.tx_ring_full,
        tx_errors: s.tx_errors,
    }
}

/// A [`Batch`] as the engine's [`Frames`]: the engine sees each frame's
/// whole buffer, lengths are kept aside and written back afterwards.
struct BatchFrames<'a> {
    batch: &'a mut Batch,
    lens: &'a mut [usize; MAX_BATCH],
    actions: &'a mut [Action; MAX_BATCH],
}

impl<'a> BatchFrames<'a> {
    fn new(
        batch: &'a mut Batch,
        lens: &'a mut [usize; MAX_BATCH],
        actions: &'a mut [Action; MAX_BATCH],
    ) -> Self {
        for i in 0..batch.len().min(MAX_BATCH) {
            let len = batch.data(i).map_or(0, <[u8]>::len);
            if let Some(l) = lens.get_mut(i) {
                *l = len;
            }
            let cap = batch.capacity_of(i);
            batch.set_len(i, cap);
        }
        Self {
            batch,
            lens,
            actions,
        }
    }

    fn finish(self) {
        for i in 0..self.batch.len().min(MAX_BATCH) {
            let len = self.lens.get(i).copied().unwrap_or(0);
            self.batch.set_len(i, len);
        }
    }
}

impl Frames for BatchFrames<'_> {
    fn count(&self) -> usize {
        self.batch.len().min(MAX_BATCH)
    }
    fn buf_mut(&mut self, i: usize) -> (&mut [u8], usize) {
        let len = self.lens.get(i).copied().unwrap_or(0);
        match self.batch.data_mut(i) {
            Some(b) => (b, len),
            None => (&mut [], 0),
        }
    }
    fn set_len(&mut self, i: usize, len: usize) {
        if let Some(l) = self.lens.get_mut(i) {
            *l = len.min(self.batch.capacity_of(i));
        }
    }
    fn iif(&self, i: usize) -> IfIndex {
        self.batch.meta(i).map_or(0, |m| m.port)
    }
    fn set_action(&mut self, i: usize, a: Action) {
        if let Some(x) = self.actions.get_mut(i) {
            *x = a;
        }
    }
}

/// Everything a worker thread owns.
pub struct WorkerThread {
    /// Worker index.
    pub id: u16,
    /// Whether [`WorkerThread::run`] gives the connections it holds when it
    /// stops (`state_file`).
    pub save_state: bool,
    /// The engine.
    pub engine: Worker,
    /// Ports; `ports[k]` serves engine interface `k + 1`.
    pub ports: Vec<Box<dyn Port>>,
    /// ARP resolution.
    pub resolver: Resolver,
    /// NDP resolution and IPv6 neighbour aging.
    pub resolver6: Resolver6,
    /// Commands from the control plane and peers.
    pub commands: Receiver<Command>,
    /// Peers, to share learnt neighbours.
    pub peers: Vec<SyncSender<Command>>,
    /// Frames to and from other workers.
    pub handoff: Handoff,
    /// Set to stop.
    pub stop: Arc<AtomicBool>,
    /// Clock origin shared by all workers.
    pub epoch: Instant,
    /// CPU to pin to.
    pub core: Option<core_affinity::CoreId>,
    /// `SCHED_FIFO` priority (`worker_priority`), checked at start.
    pub priority: Option<u8>,
    /// The published policy.
    pub policy: Arc<PolicyCell>,
    /// The generation of the policy the engine was built with. A worker
    /// compares the cell's generation with this one, not with the one it
    /// finds when its thread starts: a rule change published between the
    /// engine's construction and the thread's first turn (the control
    /// socket opens while worker threads are still starting) would
    /// otherwise never reach it.
    pub policy_generation: u64,
    /// XDP offload (`None`: off).
    pub offload: Option<OffloadLink>,
    /// The NAT log (`None`: none configured; the engine only counts).
    pub nat_log: Option<crate::natlog::NatLogLink>,
    /// The interfaces' link state, as the control plane sees it.
    pub links: Arc<Links>,
    /// The ports were replaced ([`Command::Detach`], [`Command::Attach`]):
    /// the poll set is rebuilt. `false` at start.
    pub ports_changed: bool,
    /// `conntrack list` and filtered `count` and `flush` requests
    /// ([`Command::List`], [`Command::Walk`]), the first in progress.
    /// Empty at start.
    pub walks: std::collections::VecDeque<WalkJob>,
}

/// A walk of a worker's connection tables for a control request, done in
/// steps of [`WALK_BUDGET`] slots between batches.
pub struct WalkJob {
    walk: sluice_engine::Walk,
    filter: CtFilter,
    answer: WalkAnswer,
}

/// What a [`WalkJob`] answers.
enum WalkAnswer {
    /// How many it selected (counted or removed).
    Count(Sender<u64>),
    /// The first `limit` it selected, listed.
    List {
        limit: usize,
        found: Vec<CtEntry>,
        tx: Sender<Vec<CtEntry>>,
    },
}

/// The link state of the gateway's interfaces as the control plane last
/// saw it (it polls them, `sluice_io::link::state`), for the workers: each
/// compares `generation` once per loop turn and, when it moved, tells its
/// engine ([`Worker::set_link_up`]). Entry `k` is engine interface `k + 1`.
pub struct Links {
    generation: AtomicU64,
    states: Vec<std::sync::atomic::AtomicU8>,
    /// Per interface, how often its ports were opened again after it came
    /// back.
    reopened: Vec<AtomicU64>,
}

impl Links {
    /// `n` interfaces, all up.
    pub fn new(n: usize) -> Self {
        Links {
            generation: AtomicU64::new(0),
            states: (0..n)
                .map(|_| std::sync::atomic::AtomicU8::new(LINK_UP))
                .collect(),
            reopened: (0..n).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// Interface `k`'s ports were opened again.
    pub fn count_reopen(&self, k: usize) {
        if let Some(c) = self.reopened.get(k) {
            c.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// How often interface `k`'s ports were opened again.
    pub fn reopened(&self, k: usize) -> u64 {
        self.reopened
            .get(k)
            .map_or(0, |c| c.load(Ordering::Relaxed))
    }

    /// Records interface `k`'s state; whether it changed.
    pub fn set(&self, k: usize, st: sluice_io::link::LinkState) -> bool {
        let v = link_code(st);
        let Some(a) = self.states.get(k) else {
            return false;
        };
        if a.swap(v, Ordering::Relaxed) == v {
            return false;
        }
        self.generation.fetch_add(1, Ordering::Release);
        true
    }

    /// Interface `k`'s state.
    pub fn get(&self, k: usize) -> sluice_io::link::LinkState {
        match self.states.get(k).map(|a| a.load(Ordering::Relaxed)) {
            Some(LINK_DOWN) => sluice_io::link::LinkState::Down,
            Some(LINK_GONE) => sluice_io::link::LinkState::Gone,
            _ => sluice_io::link::LinkState::Up,
        }
    }

    fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    fn apply(&self, engine: &mut Worker) {
        for k in 0..self.states.len() {
            let up = self.get(k) == sluice_io::link::LinkState::Up;
            engine.set_link_up((k + 1) as IfIndex, up);
        }
    }
}

const LINK_UP: u8 = 0;
const LINK_DOWN: u8 = 1;
const LINK_GONE: u8 = 2;

fn link_code(st: sluice_io::link::LinkState) -> u8 {
    match st {
        sluice_io::link::LinkState::Up => LINK_UP,
        sluice_io::link::LinkState::Down => LINK_DOWN,
        sluice_io::link::LinkState::Gone => LINK_GONE,
    }
}

/// [`Command::SetAddrs`]: the interfaces' addresses and the static routes.
#[derive(Clone, Debug)]
pub struct AddrChange {
    /// IPv4 addresses per engine interface (index 0 is no interface).
    pub v4: Vec<Vec<(Ipv4Addr, u8)>>,
    /// IPv6 addresses: (engine interface, address, prefix length).
    pub v6: Vec<(IfIndex, core::net::Ipv6Addr, u8)>,
    /// Static IPv4 routes.
    pub routes: Vec<Route4>,
    /// Static IPv6 routes.
    pub routes6: Vec<Route6>,
}

/// The published policy. The control plane swaps in a new generation with
/// one atomic store ([`PolicyCell::publish`]); each worker compares the
/// generation number once per loop turn (one relaxed-cost atomic load) and
/// picks the new policy up before its next batch, so a packet sees the old
/// policy or the new one, never a mix, and the control plane never waits
/// for a worker.
pub struct PolicyCell {
    generation: AtomicU64,
    current: arc_swap::ArcSwap<PolicyRef>,
}

/// A policy as stored in the [`PolicyCell`].
pub struct PolicyRef(pub Arc<dyn Policy>);

impl PolicyRef {
    /// Nothing but the holder of `this` refers to the policy any more.
    pub fn unused(this: &Arc<PolicyRef>) -> bool {
        Arc::strong_count(this) == 1 && Arc::strong_count(&this.0) == 1
    }
}

impl PolicyCell {
    /// A cell holding `p` as generation 1.
    pub fn new(p: Arc<dyn Policy>) -> Self {
        PolicyCell {
            generation: AtomicU64::new(1),
            current: arc_swap::ArcSwap::from_pointee(PolicyRef(p)),
        }
    }

    /// Publishes `p`; returns its generation and the policy it replaced.
    /// The caller keeps the old one until no worker uses it
    /// ([`PolicyRef::unused`]), so that freeing a large rule set never
    /// happens on a worker thread.
    pub fn publish(&self, p: Arc<dyn Policy>) -> (u64, Arc<PolicyRef>) {
        let old = self.current.swap(Arc::new(PolicyRef(p)));
        (self.generation.fetch_add(1, Ordering::AcqRel) + 1, old)
    }

    /// The generation of the newest policy.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// The newest policy.
    pub fn load(&self) -> Arc<dyn Policy> {
        Arc::clone(&self.current.load().0)
    }
}

/// Monotonic ns since `epoch`, offset by one second so 0 is never a time.
pub fn now_ns(epoch: Instant) -> u64 {
    u64::try_from(epoch.elapsed().as_nanos())
        .unwrap_or(u64::MAX)
        .saturating_add(1_000_000_000)
}

struct Scratch {
    batch: Option<Batch>,
    lens: [usize; MAX_BATCH],
    actions: [Action; MAX_BATCH],
    out: Vec<Vec<u16>>,
    todo: Todo,
    arp_dropped: u64,
    tx_dropped: u64,
    ctl: Option<Batch>,
    arp: Option<Batch>,
    hand: Option<Batch>,
    steer: Option<Batch>,
    /// Fragments of one packet being split ([`Action::Fragment`]).
    frag: Option<Batch>,
    /// Where each fragment is built.
    frag_buf: Vec<u8>,
    /// `0, 1, 2, ...`: the indices of a whole batch.
    all: Vec<u16>,
    /// Packets that could not be split (malformed) and fragments a port
    /// did not take.
    frag_dropped: u64,
}

impl WorkerThread {
    /// Run until `stop` is set. Ports are closed (XDP detached) on return.
    /// Run until `stop`; then, with `save_state`, the connections a restart
    /// carries over.
    pub fn run(mut self) -> Option<Vec<sluice_engine::SavedConn>> {
        if let Some(c) = self.core {
            if !core_affinity::set_for_current(c) {
                tracing::warn!(worker = self.id, core = c.id, "could not pin worker");
            }
        }
        if let Some(p) = self.priority {
            // Checked at start (`sluice_io::sched::check_fifo`); a failure
            // now leaves the worker at ordinary priority, loudly.
            match sluice_io::sched::set_fifo(p) {
                Ok(()) => tracing::info!(worker = self.id, priority = p, "worker runs SCHED_FIFO"),
                Err(e) => tracing::error!(
                    worker = self.id,
                    priority = p,
                    "worker_priority not applied: {e}; running at ordinary priority"
                ),
            }
        }
        let nports = self.ports.len();
        let mut s = Scratch {
            batch: Some(Batch::new()),
            lens: [0; MAX_BATCH],
            actions: [Action::Pending; MAX_BATCH],
            out: (0..nports).map(|_| Vec::with_capacity(MAX_BATCH)).collect(),
            todo: Todo::default(),
            arp_dropped: 0,
            tx_dropped: 0,
            ctl: Some(Batch::new()),
            arp: Some(Batch::new()),
            hand: Some(Batch::new()),
            steer: Some(Batch::new()),
            frag: Some(Batch::new()),
            frag_buf: vec![0; HANDOFF_FRAME],
            all: (0..MAX_BATCH as u16).collect(),
            frag_dropped: 0,
        };
        let mut pollset = sluice_io::PollSet::new(self.ports.iter().map(|p| p.as_ref()));
        let mut last_house = 0u64;
        let mut policy_gen = self.policy_generation;
        let mut link_gen = 0u64;
        let mut gone = vec![false; nports];
        while !self.stop.load(Ordering::Relaxed) {
            let g = self.policy.generation();
            if g != policy_gen {
                policy_gen = g;
                self.engine.set_policy(self.policy.load());
            }
            let g = self.links.generation();
            if g != link_gen || self.ports_changed {
                link_gen = g;
                self.links.apply(&mut self.engine);
                // A port whose interface is gone is neither read nor
                // waited on: its socket would report an error at once, and
                // forever (an AF_PACKET worker spun at 100 % of its core).
                let now_gone: Vec<bool> = (0..nports)
                    .map(|k| self.links.get(k) == sluice_io::link::LinkState::Gone)
                    .collect();
                if now_gone != gone || self.ports_changed {
                    self.ports_changed = false;
                    gone = now_gone;
                    pollset = sluice_io::PollSet::new(
                        self.ports
                            .iter()
                            .zip(&gone)
                            .filter(|(_, g)| !**g)
                            .map(|(p, _)| p.as_ref()),
                    );
                }
            }
            self.commands(&mut s);
            let mut got = self.handed_in(&mut s);
            for k in 0..nports {
                if gone.get(k).copied().unwrap_or(false) {
                    continue;
                }
                got += self.one_port(k, &mut s);
            }
            let now = now_ns(self.epoch);
            if !self.walks.is_empty() {
                self.walk_step(now);
            }
            if now.saturating_sub(last_house) >= HOUSEKEEPING_NS {
                last_house = now;
                match &mut self.offload {
                    Some(o) => {
                        o.now_ns = now;
                        self.engine.gc_with(now, GC_BUDGET, o);
                    }
                    None => {
                        self.engine.gc(now, GC_BUDGET);
                    }
                }
                self.resolver.tick(now, &mut s.todo);
                self.resolver6.tick(now, &mut s.todo);
                for (oif, ip) in core::mem::take(&mut s.todo.forget6) {
                    self.engine.clear_neighbor6(oif, ip);
                    for p in &self.peers {
                        let _ = p.try_send(Command::ForgetNeighbor6(oif, ip));
                    }
                }
                self.send_arp(&mut s);
                for p in &mut self.ports {
                    let _ = p.flush();
                }
                if let Some(l) = &mut self.nat_log {
                    l.drain(self.engine.nat_log());
                }
            }
            if let Some(o) = &mut self.offload {
                o.apply(&mut self.engine);
            }
            // (A walk in progress goes on at once.)
            if got == 0 && nports > 0 && self.walks.is_empty() {
                // Sleep until any port has frames, for at most 1 ms (the
                // housekeeping and command checks above run at least that
                // often).
                if pollset.is_empty() {
                    std::thread::sleep(std::time::Duration::from_millis(1));
                } else {
                    let _ = pollset.wait(1);
                }
            }
        }
        for p in &mut self.ports {
            let _ = p.flush();
        }
        if let Some(l) = &mut self.nat_log {
            l.drain(self.engine.nat_log());
        }
        tracing::info!(worker = self.id, "worker stopped");
        self.save_state
            .then(|| self.engine.carried_conns(now_ns(self.epoch)))
    }

    /// One step of the first walk; answers and drops it when it is done
    /// (or, for a listing, has found its `limit`).
    fn walk_step(&mut self, now: u64) {
        let Some(job) = self.walks.front_mut() else {
            return;
        };
        self.engine.set_clock(now);
        // A listing notes the ids of what it selects (up to what it still
        // wants) and lists them after the step, with the offload's
        // counters (the engine is busy during the step).
        let want = match &job.answer {
            WalkAnswer::List { limit, found, .. } => limit.saturating_sub(found.len()),
            WalkAnswer::Count(_) => 0,
        };
        let (mut hits4, mut hits6) = (Vec::new(), Vec::new());
        let taken = core::cell::Cell::new(0usize);
        let f = &job.filter;
        let done = self.engine.walk_step(
            &mut job.walk,
            WALK_BUDGET,
            &mut |id, e| {
                let s = f.matches4(e);
                if s && taken.get() < want {
                    taken.set(taken.get() + 1);
                    hits4.push(id);
                }
                s
            },
            &mut |id, e| {
                let s = f.matches6(e);
                if s && taken.get() < want {
                    taken.set(taken.get() + 1);
                    hits6.push(id);
                }
                s
            },
        );
        let at = sluice_conntrack::Instant::from_millis(now / 1_000_000);
        let (engine, offload, id) = (&self.engine, &self.offload, self.id);
        let full = match &mut job.answer {
            WalkAnswer::List { limit, found, .. } => {
                for i in hits4 {
                    if let Some(e) = engine.conntrack().get(i) {
                        found.extend(listing4(engine, offload.as_ref(), id, e, at));
                    }
                }
                for i in hits6 {
                    if let Some(e) = engine.conntrack6().get(i) {
                        found.extend(listing6(engine, offload.as_ref(), id, e, at));
                    }
                }
                found.len() >= *limit
            }
            WalkAnswer::Count(_) => false,
        };
        if done || full {
            if let Some(job) = self.walks.pop_front() {
                match job.answer {
                    WalkAnswer::Count(tx) => {
                        let _ = tx.send(job.walk.matched);
                    }
                    WalkAnswer::List { found, tx, .. } => {
                        let _ = tx.send(found);
                    }
                }
            }
        }
    }

    fn commands(&mut self, s: &mut Scratch) {
        while let Ok(c) = self.commands.try_recv() {
            match c {
                Command::Status(tx) => {
                    let ports = self
                        .ports
                        .iter_mut()
                        .map(|p| port_status(p.as_mut()))
                        .collect();
                    let _ = tx.send(WorkerStatus {
                        worker: self.id,
                        counters: self.engine.counters().clone(),
                        connections: self.engine.conntrack().len(),
                        connections6: self.engine.conntrack6().len(),
                        ct_early_drops: self.engine.conntrack().early_drops()
                            + self.engine.conntrack6().early_drops(),
                        ct_max: [
                            self.engine.conntrack().max(),
                            self.engine.conntrack6().max(),
                        ],
                        ct_capacity: [
                            self.engine.conntrack().capacity(),
                            self.engine.conntrack6().capacity(),
                        ],
                        ports,
                        neighbors: self
                            .resolver
                            .known()
                            .map(|(ip, m)| (*ip, crate::config::fmt_mac(m)))
                            .collect(),
                        arp_pending: self.resolver.pending(),
                        neighbors6: self
                            .resolver6
                            .known()
                            .map(|(o, ip, m, fixed)| {
                                (format!("{ip}%{o}"), crate::config::fmt_mac(&m), fixed)
                            })
                            .collect(),
                        ndp_pending: self.resolver6.pending(),
                        arp_dropped: s.arp_dropped,
                        tx_dropped: s.tx_dropped + s.frag_dropped,
                        handoff_dropped: self.handoff.dropped,
                        offload: self.offload.as_ref().map(|o| o.status.clone()),
                        nat: self.engine.nat().stats(),
                        nat_pools_refused: self.engine.nat_pools_refused(),
                        pools: pool_status(self.engine.nat()),
                        // Read on this (the worker's) thread.
                        scheduler: sluice_io::sched::describe(),
                    });
                }
                Command::List(f, limit, tx) => self.walks.push_back(WalkJob {
                    walk: sluice_engine::Walk::new(false),
                    filter: f,
                    answer: WalkAnswer::List {
                        limit,
                        found: Vec::new(),
                        tx,
                    },
                }),
                Command::NatLookup(q, tx) => {
                    let _ = tx.send(nat_lookup(self.engine.nat(), q, self.id));
                }
                Command::Flush(tx) => {
                    self.engine.set_clock(now_ns(self.epoch));
                    let _ = tx.send(self.engine.flush());
                }
                Command::Walk(f, remove, tx) => self.walks.push_back(WalkJob {
                    walk: sluice_engine::Walk::new(remove),
                    filter: f,
                    answer: WalkAnswer::Count(tx),
                }),
                Command::SetNeighbor(ip, mac) => self.learnt(ip, mac, false, s),
                Command::SetNeighbor6(oif, ip, mac, fixed) => {
                    let origin = if fixed { Origin::Static } else { Origin::Peer };
                    self.learnt6(oif, ip, mac, origin, false, s)
                }
                Command::ForgetNeighbor6(oif, ip) => {
                    if self.resolver6.forget_peer(oif, ip) {
                        self.engine.clear_neighbor6(oif, ip);
                    }
                }
                Command::Detach(which, done) => {
                    for (_, p) in self
                        .ports
                        .iter_mut()
                        .enumerate()
                        .filter(|(k, _)| which.contains(k))
                    {
                        let _ = p.flush();
                        let d = Detached::new(p.name(), p.kind());
                        // The old port closes here (its XDP program and
                        // socket go) before the control plane opens the
                        // new ones on the same queues.
                        *p = Box::new(d);
                    }
                    self.ports_changed = true;
                    let _ = done.send(());
                }
                Command::Attach(a) => self.attach(*a, s),
                Command::ForgetStatic(f) => {
                    let (v4, v6) = *f;
                    for ip in v4 {
                        self.resolver.forget(ip);
                        self.engine.clear_neighbor(ip);
                    }
                    for (oif, ip) in v6 {
                        self.resolver6.forget(oif, ip);
                        self.engine.clear_neighbor6(oif, ip);
                    }
                }
                Command::SetTimeouts(t, done) => {
                    self.engine.set_timeouts(&t);
                    let _ = done.send(());
                }
                Command::CtTimeoutsHeld(reply) => {
                    let _ = reply.send(self.engine.ct_timeout_slots_held());
                }
                Command::SetAddrs(a, done) => {
                    let AddrChange {
                        v4,
                        v6,
                        routes,
                        routes6,
                    } = *a;
                    let res = self
                        .engine
                        .set_addrs(&v4, &v6, &routes, &routes6)
                        .map_err(|e| e.to_string());
                    if res.is_ok() {
                        for (oif, f) in self.resolver.set_addrs(&v4, &routes) {
                            s.todo.send.push((oif, f));
                        }
                        for (oif, f) in self.resolver6.set_addrs(&v6, &routes6) {
                            s.todo.send6.push((oif, f));
                        }
                        self.send_arp(s);
                    }
                    let _ = done.send(res);
                }
                Command::SetCtMax(v4, v6, done) => {
                    let res = self.engine.set_ct_max(v4, v6).map_err(|e| e.to_string());
                    let _ = done.send(res);
                }
                Command::SetNat(n, done) => {
                    let res = self.engine.set_nat_settings(&n).map_err(|e| e.to_string());
                    let _ = done.send(res);
                }
                Command::SetRoutes(r, done) => {
                    let (v4, v6) = *r;
                    let res = self.engine.set_routes(&v4, &v6).map_err(|e| e.to_string());
                    if res.is_ok() {
                        self.resolver.set_routes(&v4);
                        self.resolver6.set_routes(&v6);
                    }
                    let _ = done.send(res);
                }
            }
        }
    }

    /// Take the ports of [`Command::Attach`]; tell the engine and the
    /// resolvers about replaced interfaces, and announce them.
    fn attach(&mut self, a: Attach, s: &mut Scratch) {
        let Attach {
            ports,
            relinked,
            offload_ifindex,
            done,
        } = a;
        let reopened = !ports.is_empty();
        for (k, p) in ports {
            if let Some(slot) = self.ports.get_mut(k) {
                *slot = p;
            }
        }
        self.ports_changed |= reopened;
        if let (Some(o), Some(ix)) = (&mut self.offload, offload_ifindex) {
            o.ifindex = ix;
            o.seen.clear();
        }
        for (oif, mac, mtu) in relinked {
            let new_mac = self.engine.interface_mac(oif) != Some(mac);
            self.engine.relink(oif, mac, mtu);
            if !new_mac && !reopened {
                // Only the MTU changed (a reload): nothing to announce.
                continue;
            }
            for ip in self.resolver6.relink(oif, mac) {
                self.engine.clear_neighbor6(oif, ip);
            }
            // Every worker announces the interface and probes the
            // neighbours it knows behind it (with several workers, a few
            // duplicate ARP frames).
            for f in self.resolver.relink(oif, mac) {
                s.todo.send.push((oif, f));
            }
        }
        self.send_arp(s);
        let _ = done.send(());
    }

    /// A neighbour became known: program the engine, tell peers (when we
    /// learnt it ourselves) and process the frames held for it.
    fn learnt(&mut self, ip: Ipv4Addr, mac: [u8; 6], tell_peers: bool, s: &mut Scratch) {
        if let Err(e) = self.engine.set_neighbor(ip, mac) {
            tracing::warn!(worker = self.id, %ip, "cannot add neighbour: {e}");
            return;
        }
        tracing::debug!(worker = self.id, %ip, mac = %crate::config::fmt_mac(&mac), "neighbour");
        if tell_peers {
            for p in &self.peers {
                if let Err(TrySendError::Full(_)) = p.try_send(Command::SetNeighbor(ip, mac)) {
                    tracing::warn!("peer command queue full; neighbour {ip} not shared");
                }
            }
        }
        let held = self.resolver.set_known(ip, mac);
        self.reprocess(held, s);
    }

    /// Process frames held for a neighbour again.
    fn reprocess(&mut self, held: Vec<(IfIndex, Vec<u8>)>, s: &mut Scratch) {
        if held.is_empty() {
            return;
        }
        // Process the held frames again, as one batch of their own. (A
        // neighbour learnt while held frames are being re-processed waits
        // for its own frames' next retry.)
        let Some(mut ctl) = s.ctl.take() else {
            s.arp_dropped += held.len() as u64;
            return;
        };
        ctl.clear();
        for (iif, f) in &held {
            let meta = sluice_io::FrameMeta {
                port: *iif,
                timestamp_ns: 0,
            };
            if !ctl.push_copy(f, meta) {
                s.arp_dropped += 1;
            }
        }
        let now = now_ns(self.epoch);
        self.process_and_send(now, &mut ctl, s, false, false);
        ctl.clear();
        s.ctl = Some(ctl);
    }

    /// An IPv6 neighbour became known: the same as [`Self::learnt`].
    fn learnt6(
        &mut self,
        oif: IfIndex,
        ip: Ipv6Addr,
        mac: [u8; 6],
        origin: Origin,
        tell_peers: bool,
        s: &mut Scratch,
    ) {
        if let Err(e) = self.engine.set_neighbor6(oif, ip, mac) {
            tracing::warn!(worker = self.id, %ip, "cannot add neighbour: {e}");
            return;
        }
        tracing::debug!(worker = self.id, %ip, mac = %crate::config::fmt_mac(&mac), "neighbour");
        if tell_peers {
            for p in &self.peers {
                if let Err(TrySendError::Full(_)) =
                    p.try_send(Command::SetNeighbor6(oif, ip, mac, false))
                {
                    tracing::warn!("peer command queue full; neighbour {ip} not shared");
                }
            }
        }
        let now = now_ns(self.epoch);
        let held = self.resolver6.set_known(now, oif, ip, mac, origin);
        self.reprocess(held, s);
    }

    fn one_port(&mut self, k: usize, s: &mut Scratch) -> usize {
        let Some(mut batch) = s.batch.take() else {
            return 0;
        };
        batch.clear();
        let n = match self.ports.get_mut(k) {
            Some(p) => p.rx_batch(&mut batch),
            None => 0,
        };
        if n > 0 {
            // ARP and NDP learning, before the engine rewrites requests
            // into replies.
            let now = now_ns(self.epoch);
            for i in 0..batch.len() {
                let iif = batch.meta(i).map_or(0, |m| m.port);
                let learn = batch
                    .data(i)
                    .and_then(parse_arp)
                    .and_then(|a| self.resolver.learn(iif, &a));
                if let Some((ip, mac)) = learn {
                    self.learnt(ip, mac, true, s);
                }
                let learn6 = batch
                    .data(i)
                    .and_then(parse_ndp)
                    .and_then(|f| self.resolver6.learn(now, iif, &f));
                if let Some((oif, ip, mac)) = learn6 {
                    self.learnt6(oif, ip, mac, Origin::Learnt, true, s);
                }
            }
            self.process_and_send(now, &mut batch, s, true, false);
        }
        batch.clear();
        s.batch = Some(batch);
        n
    }

    /// Frames other workers handed to this one (at most a batch per loop
    /// turn): processed as one batch; their buffers go back at once.
    /// Returns how many frames there were.
    fn handed_in(&mut self, s: &mut Scratch) -> usize {
        let (Some(mut hand), Some(mut steer)) = (s.hand.take(), s.steer.take()) else {
            return 0;
        };
        hand.clear();
        steer.clear();
        let mut n = 0;
        while hand.room() > 0 && steer.room() > 0 {
            let Ok(m) = self.handoff.inbox.try_recv() else {
                break;
            };
            match m {
                HandoffMsg::Return(buf) => self.handoff.free.push(buf),
                HandoffMsg::Frame {
                    from,
                    steer: steered,
                    iif,
                    buf,
                } => {
                    let meta = sluice_io::FrameMeta {
                        port: iif,
                        timestamp_ns: 0,
                    };
                    let b = if steered { &mut steer } else { &mut hand };
                    if b.push_copy(&buf, meta) {
                        n += 1;
                    } else {
                        self.handoff.dropped += 1;
                    }
                    self.handoff.give_back(from, buf);
                }
            }
        }
        let now = now_ns(self.epoch);
        if !steer.is_empty() {
            self.process_and_send(now, &mut steer, s, true, false);
        }
        if !hand.is_empty() {
            self.process_and_send(now, &mut hand, s, true, true);
        }
        hand.clear();
        steer.clear();
        s.hand = Some(hand);
        s.steer = Some(steer);
        n
    }

    /// Run the engine on `batch` and transmit the result. `hold` lets
    /// `no-neighbor` drops wait for ARP (not for frames that already waited).
    /// `handed`: the frames came from another worker
    /// ([`Worker::process_handed_off`]).
    fn process_and_send(
        &mut self,
        now: u64,
        batch: &mut Batch,
        s: &mut Scratch,
        hold: bool,
        handed: bool,
    ) {
        let count = batch.len().min(MAX_BATCH);
        {
            let mut fr = BatchFrames::new(batch, &mut s.lens, &mut s.actions);
            if handed {
                self.engine.process_handed_off(now, &mut fr);
            } else {
                self.engine.process(now, &mut fr);
            }
            fr.finish();
        }
        for o in &mut s.out {
            o.clear();
        }
        for i in 0..count {
            let action = s.actions.get(i).copied().unwrap_or_default();
            let out = match action {
                Action::Forward(oif) => usize::from(oif).checked_sub(1),
                Action::Reply => batch
                    .meta(i)
                    .and_then(|m| usize::from(m.port).checked_sub(1)),
                Action::Fragment(oif, mtu) => {
                    if let Some(f) = batch.data(i) {
                        self.send_fragmented(oif, mtu, f, s);
                    }
                    None
                }
                Action::Handoff(w) | Action::Steer(w) => {
                    let iif = batch.meta(i).map_or(0, |m| m.port);
                    if let Some(f) = batch.data(i) {
                        let steer = matches!(action, Action::Steer(_));
                        self.handoff.send(self.id, w, steer, iif, f);
                    }
                    None
                }
                Action::Drop(DropReason::NoNeighbor) if hold => {
                    let iif = batch.meta(i).map_or(0, |m| m.port);
                    if let Some(f) = batch.data(i) {
                        if f.get(12..14) == Some(&[0x86, 0xdd][..]) {
                            let hint = self.engine.missing_next_hop6(i);
                            self.resolver6
                                .on_no_neighbor(now, iif, f, hint, &mut s.todo);
                        } else {
                            let hint = self.engine.missing_next_hop(i);
                            self.resolver.on_no_neighbor(now, iif, f, hint, &mut s.todo);
                        }
                    }
                    None
                }
                _ => None,
            };
            if let Some(q) = out.and_then(|k| s.out.get_mut(k)) {
                q.push(i as u16);
            }
        }
        for (k, which) in s.out.iter().enumerate() {
            if which.is_empty() {
                continue;
            }
            let Some(p) = self.ports.get_mut(k) else {
                continue;
            };
            let mut done = p.tx_batch(batch, which);
            if done < which.len() {
                let _ = p.flush();
                done += which.get(done..).map_or(0, |rest| p.tx_batch(batch, rest));
            }
            s.tx_dropped += (which.len() - done.min(which.len())) as u64;
        }
        self.send_arp(s);
    }

    /// Split `frame` (IPv4, already rewritten) into fragments of at most
    /// `mtu` bytes and transmit them on `oif`.
    fn send_fragmented(&mut self, oif: IfIndex, mtu: u16, frame: &[u8], s: &mut Scratch) {
        let Some(port) = usize::from(oif)
            .checked_sub(1)
            .and_then(|k| self.ports.get_mut(k))
        else {
            s.frag_dropped += 1;
            return;
        };
        let Some(l3) = sluice_wire::dissect::dissect(frame)
            .ok()
            .map(|d| usize::from(d.l3_off))
        else {
            s.frag_dropped += 1;
            return;
        };
        let Some(mut fb) = s.frag.take() else {
            s.frag_dropped += 1;
            return;
        };
        fb.clear();
        let meta = sluice_io::FrameMeta::default();
        let all = &s.all;
        let mut lost = 0u64;
        let r = sluice_wire::frag::fragment4(frame, l3, mtu, &mut s.frag_buf, |piece| {
            if fb.room() == 0 {
                let n = fb.len();
                let done = port.tx_batch(&mut fb, all.get(..n).unwrap_or(&[]));
                lost += (n - done.min(n)) as u64;
                fb.clear();
            }
            if !fb.push_copy(piece, meta) {
                lost += 1;
            }
        });
        let n = fb.len();
        if n > 0 {
            let done = port.tx_batch(&mut fb, all.get(..n).unwrap_or(&[]));
            lost += (n - done.min(n)) as u64;
        }
        let _ = port.flush();
        if r.is_err() {
            lost += 1;
        }
        s.frag_dropped += lost;
        fb.clear();
        s.frag = Some(fb);
    }

    fn send_arp(&mut self, s: &mut Scratch) {
        s.arp_dropped += core::mem::take(&mut s.todo.dropped);
        if s.todo.send.is_empty() && s.todo.send6.is_empty() {
            return;
        }
        let Some(mut b) = s.arp.take() else {
            return;
        };
        let arp = s.todo.send.iter().map(|(o, f)| (*o, &f[..]));
        let ndp = s.todo.send6.iter().map(|(o, f)| (*o, &f[..]));
        for (oif, req) in arp.chain(ndp) {
            b.clear();
            if !b.push_copy(req, sluice_io::FrameMeta::default()) {
                continue;
            }
            if let Some(p) = usize::from(oif)
                .checked_sub(1)
                .and_then(|k| self.ports.get_mut(k))
            {
                p.tx_batch(&mut b, &[0]);
                let _ = p.flush();
            }
        }
        s.todo.send.clear();
        s.todo.send6.clear();
        b.clear();
        s.arp = Some(b);
    }
}
