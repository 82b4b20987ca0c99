//! `sluice bench forward`: 64-byte frames per second that a device under
//! test (DUT) forwards, with NAT, between two network namespaces on one
//! core; Sluice (AF_XDP, AF_PACKET) side by side with the kernel's
//! forwarding and an nftables masquerade rule, on the same topology, the
//! same sender and the same traffic.
//!
//! # Topology
//!
//! Three namespaces this module creates (names `sluice-fwd-<pid>-{s,d,r}`)
//! and deletes by name afterwards, on error too (`Drop`), and on SIGINT or
//! SIGTERM when the caller passes the interrupt flag. Namespaces left by a
//! run that was killed are deleted at the next start when their PID is gone.
//!
//! ```text
//!  sender ns                 DUT ns                         receiver ns
//!  eth0 ------------ lan<x> 10.0.0.1   203.0.113.1 wan<x> ------------ eth0
//!  sendmmsg sender           [sluice | kernel + nft]              counts rx
//!  10.0.0.2 -> 203.0.113.2   masquerade to 203.0.113.1
//! ```
//!
//! No frame leaves these namespaces. The receiver's veth runs an XDP
//! program that drops every frame ([`sluice_io::xdpgen::XdpSink`]; the veth
//! still counts it in `rx_packets`), so nothing is sent back and the
//! receiver costs what a NIC's transmit would. (Before 2026-11-23 16:40 UTC
//! the receiver's kernel took each frame through GRO and the IP layer and
//! dropped it there, `PACKET_OTHERHOST`: on the DUT core, see below, which
//! then spent about half its time on the receiver with Sluice's offload.)
//! The DUT's next hop (203.0.113.2) is a static neighbour with a MAC that
//! is not the receiver's.
//!
//! # One core for the DUT
//!
//! The DUT gets the last core the process may run on and the sender the
//! first. On veth the receive work of a frame runs in the softirq of the CPU
//! that sent it, so without care the sender's core would do the DUT's
//! receive work. Therefore:
//! - Receive Packet Steering on the DUT's inside veth sends every frame's
//!   receive processing to the DUT core (kernel forwarding and nft; the
//!   AF_PACKET ring copy);
//! - with AF_XDP, the veth's NAPI (where the XDP program and the copy into
//!   the UMEM run) is made threaded and its kernel thread pinned to the DUT
//!   core;
//! - Sluice runs one worker, pinned to the DUT core;
//! - the DUT's own transmit (and the receiver's XDP drop, which veth runs
//!   in the transmitting CPU's softirq) is on the DUT core for every DUT
//!   alike.
//!
//! # Traffic (RFC 4814 §4.5)
//!
//! 64-byte frames on the wire (60 without FCS): Ethernet, IPv4, UDP with 18
//! bytes of payload and a valid checksum. `flows` distinct flows are
//! (source port, destination port) combinations of restricted ranges
//! (RFC 9693 §4.1, at most 50 000 source ports), sent in the pseudorandom
//! order of [`crate::perm::Permutation`], cyclically.
//!
//! # IPv6 (`ipv6`)
//!
//! With [`ForwardOptions::ipv6`] the frames carry the same UDP datagram in
//! an IPv6 header (fd00:1::2 -> 2001:db8:1::2, 84 bytes on the wire; 64
//! cannot hold one), the DUT has fd00:1::1/64 and 2001:db8:1::1/64 and
//! static neighbours for both hosts, and there is no NAT (Sluice has no
//! NAT66, and NAT66 is rare): every DUT runs the same stateful forward
//! chain instead ([`nft_ruleset6`], [`ip6tables_ruleset`]: policy drop,
//! `ct state established,related accept`, new UDP to the receiver
//! accepted), so that each one tracks every flow as the masquerade rule
//! makes it do for IPv4; with `rules` N, seed 001's N-rule chain in IPv6,
//! its last rule `ct state new,established accept` ([`nft_ruleset6`]).
//! With `latency`, `ping -6` between the hosts (addresses fd00:1::2/64
//! and 2001:db8:1::2/64, routes through the DUT, neighbours by NDP), two
//! rules accepting ICMPv6 echo requests and replies after the others.
//!
//! # Method: forwarding rate at saturation
//!
//! 1. *Warm-up.* Every flow is sent once, paced at `warmup_pps`, so that the
//!    DUT creates each flow's connection and NAT mapping. If more than 1 % is
//!    lost, another pass follows at half the rate (at most three passes).
//! 2. *Measurement.* The sender offers at its maximum (an AF_PACKET socket,
//!    qdisc bypass, one `sendmmsg` per batch of 256, see
//!    [`sluice_io::rawsock::BatchSender`]) for a pre-roll of 0.5 s, then for
//!    `duration`. `fps` = frames counted on the
//!    receiver's veth during `duration` / `duration`; `offered_fps` = frames
//!    the sender queued; `loss` = 1 - received / offered.
//! 3. `saturated` is true when at least 1 % was lost, i.e. the DUT and not
//!    the sender was the limit. Otherwise `fps` is only a lower bound.
//!
//! With [`Sender::Xdp`] the measurement's frames (not the warm-up's) are XDP
//! live frames (`BPF_PROG_RUN` with `BPF_F_TEST_XDP_LIVE_FRAMES`, see
//! [`sluice_io::xdpgen`]) redirected into the sender's veth, so they reach
//! the DUT's veth as `xdp_frame`s, as from a NIC's receive ring, not as
//! skbs. Every DUT's inside veth then has GRO on (veth needs NAPI to accept
//! them), RPS off and its threaded NAPI pinned to the DUT core; `sent`
//! moves in steps of `XDP_REPEAT` (2^20) frames.
//!
//! This is the rate one DUT core drains when offered more than it can take.
//!
//! # Method: connection establishment (`setup`)
//!
//! With [`ForwardOptions::setup`] there is no warm-up, and the sender sends
//! each flow once, in the same pseudorandom order, as fast as it can (the
//! XDP sender in whole calls of `XDP_REPEAT` frames that stay within one
//! pass): every frame the DUT forwards opened a new connection and got a
//! new NAT mapping or reused its source's, as RFC 9693's preliminary phase
//! requires of its test frames. `fps` is then the rate of new connections
//! forwarded at saturation (the drain-rate counterpart of RFC 9693 §4.2's
//! maximum connection establishment rate, which searches for the highest
//! loss-free rate); the window ends early when the sender has sent every
//! flow, and the run fails when it did so within the pre-roll (more
//! `flows` are needed: the XDP sender offers 3-8 Mpps, so about 10 M for a
//! 1 s window). `connections` reports the DUT's conntrack count afterwards
//! (`nf_conntrack_count` in the DUT namespace, `sluice ctl conntrack
//! count`), which must be at least the frames received.
//!
//! # Method: RFC 2544 throughput (`zero_loss`)
//!
//! With [`ForwardOptions::zero_loss`], the saturation measurement above is
//! followed by RFC 2544 §26.1's search for the highest offered rate at which
//! no frame is lost: a trial offers a constant paced rate for `duration`,
//! waits 200 ms for frames in flight, and compares the frames the sender
//! queued with the frames the receiver counted. The first trial runs at the
//! saturation rate; then a binary search between 0 and the lowest failing
//! rate, [`SEARCH_STEPS`] trials, keeps the highest passing rate (a
//! resolution of saturation / 2^steps). `fps` is that rate (frames
//! received per second in the passing trial), `saturation_fps` keeps the
//! drain rate, and `method` is `"rfc2544-zero-loss"`. Deviations from
//! RFC 2544: trials last `duration` (3 s by default) instead of 60 s, and
//! one search per point instead of the mean of repeated searches.
#![forbid(unsafe_code)]

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde::Serialize;
use sluice_io::netns::Netns;
use sluice_io::rawsock::{BatchSender, SEND_BATCH_MAX};
use sluice_wire::flow::{proto, FlowKey4, FlowKey6};

use crate::perm::{Permutation, PortRanges};

/// A device under test.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dut {
    /// `sluice run`, AF_XDP backend, one worker.
    SluiceAfXdp,
    /// `sluice run`, AF_PACKET backend, one worker.
    SluiceAfPacket,
    /// `sluice run`, AF_XDP backend with `xdp_offload = true`: established
    /// flows are translated and forwarded by Sluice's XDP program
    /// (`sluice_io::afxdp::offload`), one worker.
    SluiceXdpOffload,
    /// The kernel's IPv4 forwarding with an nftables masquerade rule.
    KernelNftables,
    /// The kernel's IPv4 forwarding with an iptables `MASQUERADE` rule,
    /// loaded with `iptables-legacy-restore` (x_tables, the iptables that
    /// seed 001 measured; Debian's `iptables` command is the nftables-based
    /// `iptables-nft`, which `kernel-nftables` already stands for).
    KernelIptables,
    /// The same with an nftables flowtable on both veths and `flow add`
    /// for TCP and UDP in the forward chain: the kernel's software fast
    /// path for established flows, the counterpart of Sluice's offload.
    /// Needs a kernel with `CONFIG_NF_FLOW_TABLE` (not in the default set:
    /// the development machine's kernel lacks it).
    KernelFlowtable,
    /// No DUT: the DUT namespace drops every frame on its inside veth
    /// (netdev ingress, on the DUT core). Measures the sender's ceiling
    /// (`offered_fps`); `fps` is 0 by design. Not in the default set.
    SenderOnly,
}

impl Dut {
    /// Every DUT, in the default order.
    pub const ALL: [Dut; 5] = [
        Dut::SluiceAfXdp,
        Dut::SluiceAfPacket,
        Dut::SluiceXdpOffload,
        Dut::KernelNftables,
        Dut::KernelIptables,
    ];

    /// The name used on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Dut::SluiceAfXdp => "sluice-afxdp",
            Dut::SluiceAfPacket => "sluice-afpacket",
            Dut::SluiceXdpOffload => "sluice-xdp-offload",
            Dut::KernelNftables => "kernel-nftables",
            Dut::KernelIptables => "kernel-iptables",
            Dut::KernelFlowtable => "kernel-flowtable",
            Dut::SenderOnly => "sender-only",
        }
    }

    /// Parse a name of [`Dut::name`].
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL
            .into_iter()
            .chain([Dut::KernelFlowtable, Dut::SenderOnly])
            .find(|d| d.name() == s)
    }
}

/// How the saturation measurement's frames enter the DUT's inside veth.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Sender {
    /// An AF_PACKET socket, `sendmmsg` of 256-frame batches: each frame is
    /// an skb when it reaches the DUT.
    #[default]
    Socket,
    /// XDP live frames (`BPF_PROG_RUN` with `BPF_F_TEST_XDP_LIVE_FRAMES`)
    /// redirected into the sender's veth: each frame reaches the DUT's veth
    /// as an `xdp_frame` in a page-pool page, like a NIC's receive ring
    /// (see [`sluice_io::xdpgen`]).
    Xdp,
}

impl Sender {
    /// The name used on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Sender::Socket => "socket",
            Sender::Xdp => "xdp",
        }
    }

    /// Parse a name of [`Sender::name`].
    pub fn parse(s: &str) -> Option<Self> {
        [Sender::Socket, Sender::Xdp]
            .into_iter()
            .find(|x| x.name() == s)
    }
}

/// How the receiver takes the frames the DUT forwards.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Receiver {
    /// An XDP program on the receiver's veth drops every frame
    /// ([`sluice_io::xdpgen::XdpSink`]): the cost of a NIC's transmit.
    #[default]
    XdpDrop,
    /// The receiver's kernel takes every frame through GRO and the IP
    /// layer and drops it there (`PACKET_OTHERHOST`), on the DUT core: the
    /// method before 2026-11-23 16:40 UTC, kept to reproduce those figures.
    Stack,
}

impl Receiver {
    /// The name used on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Receiver::XdpDrop => "xdp-drop",
            Receiver::Stack => "stack",
        }
    }

    /// Parse a name of [`Receiver::name`].
    pub fn parse(s: &str) -> Option<Self> {
        [Receiver::XdpDrop, Receiver::Stack]
            .into_iter()
            .find(|x| x.name() == s)
    }
}

/// Frames per `BPF_PROG_RUN` call of the XDP sender (the granularity of
/// its `sent` counter and of stopping: about 0.2-0.3 s at the 3.5-5 Mpps
/// it reaches on the development VM). Each call sets up and tears down a
/// page pool; with 32 k frames per call that overhead held the sender to
/// about 1.1 Mpps and the DUTs' drain rates fell by half or more, with 1 k
/// frames per call the sender offered only 40 k frames/s.
const XDP_REPEAT: u32 = 1 << 20;
/// Frames per kernel batch of the XDP sender (the kernel's maximum).
const XDP_BATCH: u32 = 256;

/// What to measure.
#[derive(Debug, Clone)]
pub struct ForwardOptions {
    /// DUTs, measured in this order.
    pub duts: Vec<Dut>,
    /// Flow counts, each measured on every DUT.
    pub flows: Vec<u64>,
    /// Measured time per point (after a 0.5 s pre-roll).
    pub duration: Duration,
    /// Pace of the warm-up pass (frames per second).
    pub warmup_pps: u64,
    /// Seed of the flow order.
    pub seed: u64,
    /// Also search for RFC 2544's zero-loss throughput (see the module
    /// doc); `fps` is then that rate.
    pub zero_loss: bool,
    /// The sender of the saturation measurement (warm-up and zero-loss
    /// trials always use the paced socket sender).
    pub sender: Sender,
    /// How the receiver takes the forwarded frames.
    pub receiver: Receiver,
    /// Forward filter rule counts, each measured on every DUT and flow
    /// count: 0 is no filter chain (the NAT rule only); N is seed 001's
    /// shape, N - 1 rules that the traffic does not match ahead of one that
    /// accepts it, policy drop ([`nft_ruleset`], [`iptables_ruleset`]).
    pub rules: Vec<usize>,
    /// Measure connection establishment instead of established flows: no
    /// warm-up, and each flow is sent once, so that every frame the DUT
    /// forwards opened a new connection (see the module doc).
    pub setup: bool,
    /// After each point's measurement, the idle round-trip time through
    /// the DUT: [`PINGS`] pings from the sender to the receiver
    /// ([`Latency`]).
    pub latency: bool,
    /// `af_packet_rx` of the `sluice-afpacket` DUT (the gateway's default:
    /// V3).
    pub af_packet_rx: sluice_daemon::config::AfPacketRx,
    /// IPv6 traffic instead of IPv4 (see the module doc, "IPv6"): no NAT,
    /// a stateful forward chain on every DUT.
    pub ipv6: bool,
}

/// Echo requests of a latency measurement, after [`PING_WARMUP`] that
/// are not counted (ARP resolution on the way).
pub const PINGS: usize = 200;
/// Echo requests sent first and not counted.
pub const PING_WARMUP: usize = 10;

/// Idle round-trip times through the DUT (`ping`, 5 ms apart, from the
/// sender's namespace to the receiver's, translated by the DUT both ways).
#[derive(Debug, Clone, Serialize)]
pub struct Latency {
    /// Echo requests counted.
    pub sent: usize,
    /// Replies among them.
    pub received: usize,
    /// Round-trip times in microseconds.
    pub min_us: f64,
    /// Median.
    pub median_us: f64,
    /// 99th percentile (nearest rank).
    pub p99_us: f64,
    /// Maximum.
    pub max_us: f64,
}

/// Trials of the zero-loss binary search after the first one.
pub const SEARCH_STEPS: u32 = 6;

impl Default for ForwardOptions {
    fn default() -> Self {
        Self {
            duts: Dut::ALL.to_vec(),
            flows: vec![1_000, 1_000_000],
            duration: Duration::from_secs(3),
            warmup_pps: 200_000,
            seed: 0x5eed,
            zero_loss: false,
            sender: Sender::Socket,
            receiver: Receiver::XdpDrop,
            rules: vec![0],
            setup: false,
            latency: false,
            af_packet_rx: sluice_daemon::config::AfPacketRx::V3,
            ipv6: false,
        }
    }
}

/// The `worker_priority` (`SCHED_FIFO`) of Sluice's worker in every
/// Sluice DUT: the worker shares the DUT core with the kernel's receive
/// work, and at ordinary priority the kernel spends half the core filling
/// a ring the worker has no time to drain (`sluice_io::sched`). An
/// operator running Sluice on one core would set it the same way.
pub const WORKER_PRIORITY: u8 = 10;

/// One measured point.
#[derive(Debug, Clone, Serialize)]
pub struct ForwardResult {
    /// DUT name ([`Dut::name`]).
    pub dut: String,
    /// Distinct flows.
    pub flows: u64,
    /// Rules in the DUT's forward filter chain (0: none; see
    /// [`ForwardOptions::rules`]).
    pub rules: usize,
    /// Frames per second forwarded: at saturation (received by the
    /// receiver), or with `method` `"rfc2544-zero-loss"` the highest rate
    /// forwarded without loss.
    pub fps: f64,
    /// Frames per second received at saturation (equal to `fps` unless a
    /// zero-loss search ran).
    pub saturation_fps: f64,
    /// Zero-loss trials run: (offered fps, frames sent, frames received).
    pub trials: Vec<(f64, u64, u64)>,
    /// Frames per second the sender offered.
    pub offered_fps: f64,
    /// 1 - received / offered during the measurement.
    pub loss: f64,
    /// True when the DUT, not the sender, was the limit (loss >= 1 %).
    pub saturated: bool,
    /// Frames offered during the measurement.
    pub sent: u64,
    /// Frames received during the measurement.
    pub received: u64,
    /// Measured seconds.
    pub seconds: f64,
    /// Warm-up passes over all flows.
    pub warmup_passes: u32,
    /// Loss of the last warm-up pass (flows that may lack state).
    pub warmup_loss: f64,
    /// How the rate is measured.
    pub method: &'static str,
    /// IP version of the traffic: 4 or 6.
    pub ip_version: u8,
    /// Frame size on the wire, FCS included.
    pub frame_bytes: u32,
    /// The DUT's core.
    pub dut_core: usize,
    /// The sender's core.
    pub sender_core: usize,
    /// How the DUT ran (backend mode, where its receive work ran).
    pub dut_mode: String,
    /// The saturation measurement's sender ([`Sender::name`]).
    pub sender: &'static str,
    /// How the receiver took the frames ([`Receiver::name`]).
    pub receiver: &'static str,
    /// Fraction of the DUT core's time spent busy (user, system, irq,
    /// softirq; /proc/stat) during the saturation measurement: everything
    /// that ran there (NAPI, softirq, Sluice's worker, the receiver's drop).
    pub dut_core_busy: f64,
    /// With [`ForwardOptions::setup`]: the connections the DUT tracks after
    /// the run (its conntrack table's count), at least the frames it
    /// forwarded when every forwarded frame opened one.
    pub connections: Option<u64>,
    /// With [`ForwardOptions::latency`]: round-trip times through the DUT.
    pub latency: Option<Latency>,
    /// Forwarding capacity of the DUT core: `saturation_fps /
    /// dut_core_busy`, frames per second of busy DUT-core time. Equal to
    /// the drain rate when the core is saturated; above it when the core
    /// idled while frames were lost (veth wake-ups: the DUT could not keep
    /// its core busy, the sender's overflow was dropped meanwhile).
    pub capacity_fps: f64,
}

/// Why a run failed.
#[derive(Debug, thiserror::Error)]
pub enum ForwardError {
    /// Not running as root.
    #[error("bench forward needs root (network namespaces, veth, AF_PACKET, AF_XDP, nft)")]
    NotRoot,
    /// The flow count cannot be split into port ranges.
    #[error("{0} flows cannot be split into source x destination port ranges")]
    Flows(u64),
    /// Setting up or reading the topology failed.
    #[error("{what}: {reason}")]
    Setup {
        /// What was being done.
        what: String,
        /// Why it failed.
        reason: String,
    },
    /// Interrupted (SIGINT/SIGTERM); everything was removed.
    #[error("interrupted; namespaces removed")]
    Interrupted,
}

fn setup_err(what: impl Into<String>, reason: impl ToString) -> ForwardError {
    ForwardError::Setup {
        what: what.into(),
        reason: reason.to_string(),
    }
}

// ------------------------------------------------------------------ traffic

/// Frame length without FCS (64 on the wire).
pub const FRAME_LEN: usize = 60;
/// UDP payload that makes a 60-byte frame.
const PAYLOAD: usize = FRAME_LEN - 14 - 20 - 8;
const SENDER_MAC: [u8; 6] = [0x02, 0x53, 0x4c, 0x46, 0x00, 0x01];
const LAN_MAC: [u8; 6] = [0x02, 0x53, 0x4c, 0x46, 0x00, 0x02];
const WAN_MAC: [u8; 6] = [0x02, 0x53, 0x4c, 0x46, 0x00, 0x03];
const RECV_MAC: [u8; 6] = [0x02, 0x53, 0x4c, 0x46, 0x00, 0x04];
/// The DUT's next hop: not the receiver's MAC, so the receiver drops early.
const NEXT_HOP_MAC: [u8; 6] = [0x02, 0x53, 0x4c, 0x46, 0x00, 0x99];
const SENDER_IP: [u8; 4] = [10, 0, 0, 2];
const RECV_IP: [u8; 4] = [203, 0, 113, 2];
/// With `--ipv6`: the sender, the receiver, and the DUT's two addresses.
const SENDER_IP6: &str = "fd00:1::2";
const RECV_IP6: &str = "2001:db8:1::2";
const LAN_IP6: &str = "fd00:1::1";
const WAN_IP6: &str = "2001:db8:1::1";
/// IPv6 frame length without FCS: the IPv4 frames' UDP datagram (18
/// bytes of payload) in an IPv6 header, 84 bytes on the wire.
pub const FRAME_LEN6: usize = 14 + 40 + 8 + PAYLOAD;
/// The sender's socket send buffer: about 5000 frames in flight, more than
/// the DUT core's receive backlog (`netdev_max_backlog`, 1000), so that a
/// DUT slower than the sender loses frames instead of pacing it.
const SNDBUF: i32 = 4 << 20;
/// Sender and receiver interface names (in their own namespaces).
const HOST_IF: &str = "eth0";
/// Byte offsets in the IPv4 frame (an IPv6 frame's are 20 bytes later).
const SPORT_OFF: usize = 34;

fn mac_str(m: [u8; 6]) -> String {
    m.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// A UDP frame (60 bytes with IPv4, [`FRAME_LEN6`] with IPv6) with both
/// ports 0, and the one's-complement sum its checksum covers, so that a
/// flow's frame is two port writes and an incremental checksum (RFC 1624).
#[derive(Clone, Copy)]
pub struct Template {
    frame: [u8; FRAME_LEN6],
    len: usize,
    /// Offset of the UDP header.
    l4: usize,
    sum: u32,
}

impl Template {
    /// The sender's IPv4 frame template.
    pub fn new() -> Self {
        Self::for_version(false)
    }

    /// The sender's IPv4 or (`ipv6`) IPv6 frame template.
    pub fn for_version(ipv6: bool) -> Self {
        let mut frame = [0u8; FRAME_LEN6];
        let (s, d) = (
            sluice_wire::EthernetAddress(SENDER_MAC),
            sluice_wire::EthernetAddress(LAN_MAC),
        );
        let (n, l4) = if ipv6 {
            let key = FlowKey6 {
                src: u128::from(ip6(SENDER_IP6)),
                dst: u128::from(ip6(RECV_IP6)),
                sport: 0,
                dport: 0,
                proto: proto::UDP,
            };
            (
                sluice_wire::build::build_udp6(&mut frame, s, d, &key, PAYLOAD),
                SPORT_OFF + 20,
            )
        } else {
            let key = FlowKey4 {
                src: u32::from_be_bytes(SENDER_IP),
                dst: u32::from_be_bytes(RECV_IP),
                sport: 0,
                dport: 0,
                proto: proto::UDP,
            };
            (
                sluice_wire::build::build_udp4(&mut frame, s, d, &key, PAYLOAD),
                SPORT_OFF,
            )
        };
        let len = n.unwrap_or(0);
        debug_assert_eq!(len, if ipv6 { FRAME_LEN6 } else { FRAME_LEN });
        let c = u16::from_be_bytes([frame[l4 + 6], frame[l4 + 7]]);
        Self {
            frame,
            len,
            l4,
            sum: u32::from(!c),
        }
    }

    /// Write the ports and the checksum of flow (`sport`, `dport`) into
    /// `f`, a copy of the template.
    #[inline]
    pub fn patch(&self, f: &mut [u8], sport: u16, dport: u16) {
        let mut s = self.sum + u32::from(sport) + u32::from(dport);
        s = (s & 0xffff) + (s >> 16);
        s = (s & 0xffff) + (s >> 16);
        let mut c = !(s as u16);
        if c == 0 {
            c = 0xffff;
        }
        if let Some(b) = f.get_mut(self.l4..self.l4 + 8) {
            b[0..2].copy_from_slice(&sport.to_be_bytes());
            b[2..4].copy_from_slice(&dport.to_be_bytes());
            b[6..8].copy_from_slice(&c.to_be_bytes());
        }
    }

    /// The template bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.frame[..self.len]
    }

    /// The UDP checksum bytes of a patched frame `f`.
    fn checksum(&self, f: &[u8]) -> u16 {
        u16::from_be_bytes([f[self.l4 + 6], f[self.l4 + 7]])
    }
}

fn ip6(s: &str) -> std::net::Ipv6Addr {
    s.parse().unwrap_or(std::net::Ipv6Addr::UNSPECIFIED)
}

impl Default for Template {
    fn default() -> Self {
        Self::new()
    }
}

/// The (source, destination) ports of `n` flows in pseudorandom order.
pub fn flow_ports(n: u64, seed: u64) -> Result<Vec<(u16, u16)>, ForwardError> {
    let ranges = PortRanges::for_connections(n, 50_000).ok_or(ForwardError::Flows(n))?;
    let perm = Permutation::new(n, seed);
    Ok((0..n).map(|i| ranges.pair(perm.at(i))).collect())
}

/// The XDP sender's flow table: for each flow, in sending order, the port
/// and UDP checksum bytes [`Template::patch`] writes (so both senders send
/// the same frames, with a valid checksum).
pub fn xdp_flow_entries(ports: &[(u16, u16)], ipv6: bool) -> Vec<[u8; 8]> {
    let tpl = Template::for_version(ipv6);
    let mut f = tpl.bytes().to_vec();
    ports
        .iter()
        .map(|&(sp, dp)| {
            tpl.patch(&mut f, sp, dp);
            sluice_io::xdpgen::flow_entry(sp, dp, tpl.checksum(&f))
        })
        .collect()
}

// ----------------------------------------------------------------- commands

fn run_cmd(program: &str, args: &[&str]) -> Result<String, ForwardError> {
    let o = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| setup_err(format!("{program} {}", args.join(" ")), e))?;
    if !o.status.success() {
        return Err(setup_err(
            format!("{program} {}", args.join(" ")),
            format!(
                "{}: {}",
                o.status,
                String::from_utf8_lossy(&o.stderr).trim()
            ),
        ));
    }
    Ok(String::from_utf8_lossy(&o.stdout).into_owned())
}

fn ns_exec(ns: &Netns, args: &[&str]) -> Result<String, ForwardError> {
    let mut a = vec!["netns", "exec", ns.name()];
    a.extend_from_slice(args);
    run_cmd("ip", &a)
}

fn ns_ip(ns: &Netns, args: &[&str]) -> Result<(), ForwardError> {
    ns.ip(args)
        .map_err(|e| setup_err(format!("ip -n {} {}", ns.name(), args.join(" ")), e))
}

/// `rx_packets` of `dev` in `ns` (from `ip -s -j link`).
fn rx_packets(ns: &Netns, dev: &str) -> Result<u64, ForwardError> {
    let out = run_cmd("ip", &["-n", ns.name(), "-s", "-j", "link", "show", dev])?;
    let v: serde_json::Value =
        serde_json::from_str(&out).map_err(|e| setup_err("ip -s -j link output", e))?;
    v[0]["stats64"]["rx"]["packets"]
        .as_u64()
        .ok_or_else(|| setup_err("ip -s -j link output", "no stats64.rx.packets"))
}

/// Sleep `d`, returning early with [`ForwardError::Interrupted`].
fn sleep(d: Duration, stop: &AtomicBool) -> Result<(), ForwardError> {
    let end = Instant::now() + d;
    loop {
        if stop.load(Ordering::Relaxed) {
            return Err(ForwardError::Interrupted);
        }
        let now = Instant::now();
        if now >= end {
            return Ok(());
        }
        std::thread::sleep((end - now).min(Duration::from_millis(50)));
    }
}

// ----------------------------------------------------------------- topology

const NS_PREFIX: &str = "sluice-fwd-";

/// Delete namespaces of earlier runs whose process is gone.
fn remove_stale_namespaces() {
    let Ok(dir) = std::fs::read_dir("/run/netns") else {
        return;
    };
    for e in dir.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(rest) = name.strip_prefix(NS_PREFIX) else {
            continue;
        };
        let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if pid != std::process::id() && !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = sluice_io::netns::ip(&["netns", "del", &name]);
        }
    }
}

struct Topo {
    sender: Netns,
    dut: Arc<Netns>,
    /// The receiver's dropping XDP program (detached before the namespace
    /// goes).
    sink: Option<sluice_io::xdpgen::XdpSink>,
    recv: Netns,
    lan: String,
    wan: String,
    dir: PathBuf,
    /// IPv6 traffic (`--ipv6`).
    ipv6: bool,
}

impl Topo {
    fn new(
        tag: &str,
        dut_core: usize,
        receiver: Receiver,
        ipv6: bool,
    ) -> Result<Self, ForwardError> {
        let pid = std::process::id();
        let ns = |s: &str| {
            let name = format!("{NS_PREFIX}{pid}-{tag}{s}");
            Netns::create(&name).map_err(|e| setup_err(format!("ip netns add {name}"), e))
        };
        let sender = ns("s")?;
        let dut = Arc::new(ns("d")?);
        let recv = ns("r")?;
        // Interface names unique on the machine: the threaded-NAPI kernel
        // thread is found by its name.
        let lan = format!("fl{pid:x}{tag}");
        let wan = format!("fw{pid:x}{tag}");
        let dir = std::env::temp_dir().join(format!("{NS_PREFIX}{pid}-{tag}"));
        let mut t = Self {
            sender,
            dut,
            sink: None,
            recv,
            lan,
            wan,
            dir,
            ipv6,
        };
        std::fs::create_dir_all(&t.dir).map_err(|e| setup_err("temporary directory", e))?;
        let d = &*t.dut;
        ns_ip(
            d,
            &[
                "link",
                "add",
                &t.lan,
                "address",
                &mac_str(LAN_MAC),
                "type",
                "veth",
                "peer",
                "name",
                HOST_IF,
                "address",
                &mac_str(SENDER_MAC),
                "netns",
                t.sender.name(),
            ],
        )?;
        ns_ip(
            d,
            &[
                "link",
                "add",
                &t.wan,
                "address",
                &mac_str(WAN_MAC),
                "type",
                "veth",
                "peer",
                "name",
                HOST_IF,
                "address",
                &mac_str(RECV_MAC),
                "netns",
                t.recv.name(),
            ],
        )?;
        for (n, dev) in [(d, t.lan.as_str()), (d, t.wan.as_str())] {
            ns_ip(n, &["link", "set", dev, "up"])?;
        }
        ns_ip(&t.sender, &["addr", "add", "10.0.0.2/24", "dev", HOST_IF])?;
        ns_ip(&t.sender, &["link", "set", HOST_IF, "up"])?;
        ns_ip(&t.recv, &["addr", "add", "203.0.113.2/24", "dev", HOST_IF])?;
        ns_ip(&t.recv, &["link", "set", HOST_IF, "up"])?;
        // The receiver's veth needs NAPI, so that the DUT's egress veth
        // accepts XDP redirects (Sluice's offload) as a NIC would.
        match receiver {
            // An XDP program that drops every frame
            // ([`sluice_io::xdpgen::XdpSink`]; the frames still count in
            // `rx_packets`) gives it NAPI. veth runs the receiver's side of
            // a transmit on the transmitting CPU, the DUT core, where a
            // frame taken through the receiver's GRO and IP layers before
            // its drop cost about as much as the forwarding itself (`perf
            // record -C <dut core>`: about half of the samples with
            // Sluice's offload).
            Receiver::XdpDrop => {
                let sink = t
                    .recv
                    .run(|| sluice_io::xdpgen::XdpSink::attach(HOST_IF))
                    .map_err(|e| setup_err("receiver XDP sink", e))?
                    .map_err(|e| setup_err("receiver XDP sink", e))?;
                t.sink = Some(sink);
            }
            // GRO on gives it NAPI, and its kernel drops the frames.
            Receiver::Stack => {
                ns_exec(&t.recv, &["ethtool", "-K", HOST_IF, "gro", "on"])?;
            }
        }
        // Receive Packet Steering: the DUT's receive work on the DUT core.
        let mask = format!("{:x}", 1u128 << dut_core.min(127));
        ns_exec(
            d,
            &[
                "sh",
                "-c",
                &format!(
                    "echo {mask} > /sys/class/net/{}/queues/rx-0/rps_cpus",
                    t.lan
                ),
            ],
        )?;
        Ok(t)
    }
}

impl Drop for Topo {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
        // The namespaces (and with them the veth pairs) are deleted by name
        // when the `Netns` fields drop.
    }
}

/// Raises the global `nf_conntrack_max` for the kernel DUT and restores it.
struct ConntrackMax {
    old: Option<String>,
}

const CT_MAX: &str = "/proc/sys/net/netfilter/nf_conntrack_max";

impl ConntrackMax {
    fn at_least(n: u64) -> Self {
        let old = std::fs::read_to_string(CT_MAX).ok();
        let cur: u64 = old
            .as_deref()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0);
        if old.is_some() && cur < n && std::fs::write(CT_MAX, n.to_string()).is_ok() {
            return Self { old };
        }
        Self { old: None }
    }
}

impl Drop for ConntrackMax {
    fn drop(&mut self) {
        if let Some(v) = &self.old {
            let _ = std::fs::write(CT_MAX, v.trim());
        }
    }
}

// --------------------------------------------------------------------- DUTs

/// A running Sluice gateway in the DUT namespace, stopped on drop.
struct SluiceDut {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<Result<(), String>>>,
    sock: PathBuf,
}

impl SluiceDut {
    fn start(
        t: &Topo,
        backend: sluice_daemon::config::BackendChoice,
        offload: bool,
        (flows, rules, icmp): (u64, usize, bool),
        af_packet_rx: sluice_daemon::config::AfPacketRx,
        dut_core: usize,
        interrupted: &AtomicBool,
    ) -> Result<Self, ForwardError> {
        let nft = t.dir.join("fwd.nft");
        let text = if t.ipv6 {
            nft_ruleset6(&t.lan, &t.wan, rules, false, icmp)
        } else {
            nft_ruleset(&t.lan, &t.wan, rules, false, icmp)
        };
        std::fs::write(&nft, text).map_err(|e| setup_err("write ruleset", e))?;
        let sock = t.dir.join("ctl.sock");
        let cfg = t.dir.join("sluice.toml");
        let bname = match backend {
            sluice_daemon::config::BackendChoice::AfXdp => "af_xdp",
            _ => "af_packet",
        };
        // With `--ipv6` the same box with an IPv6 address on each side,
        // the two IPv6 neighbours, and the IPv6 table sized for the flows.
        let (lan6, wan6, neigh6) = if t.ipv6 {
            (
                format!(", \"{LAN_IP6}/64\""),
                format!(", \"{WAN_IP6}/64\""),
                format!(
                    "[[neighbors]]\nip = \"{RECV_IP6}\"\nmac = \"{}\"\n\n\
                     [[neighbors]]\nip = \"{SENDER_IP6}\"\nmac = \"{}\"\n\n",
                    mac_str(NEXT_HOP_MAC),
                    mac_str(SENDER_MAC)
                ),
            )
        } else {
            Default::default()
        };
        std::fs::write(
            &cfg,
            format!(
                "ruleset = \"fwd.nft\"\nbackend = \"{bname}\"\naf_packet_rx = \"{}\"\nxdp_offload = {offload}\nworkers = 1\nworker_priority = {WORKER_PRIORITY}\ncontrol_socket = \"{}\"\n\n\
                 [[interfaces]]\nname = \"{}\"\nrole = \"inside\"\naddresses = [\"10.0.0.1/24\"{lan6}]\n\n\
                 [[interfaces]]\nname = \"{}\"\nrole = \"outside\"\naddresses = [\"203.0.113.1/24\"{wan6}]\n\n\
                 [[neighbors]]\nip = \"203.0.113.2\"\nmac = \"{}\"\n\n\
                 [[neighbors]]\nip = \"10.0.0.2\"\nmac = \"{}\"\n\n{neigh6}[conntrack]\nmax = {}\nmax_v6 = {}\n",
                af_packet_rx.name(),
                sock.display(),
                t.lan,
                t.wan,
                mac_str(NEXT_HOP_MAC),
                mac_str(SENDER_MAC),
                // The table of the traffic's IP version sized for the
                // flows, the other at its default.
                if t.ipv6 { 65_536 } else { (flows * 2).max(65_536) },
                if t.ipv6 { (flows * 2).max(65_536) } else { 65_536 }
            ),
        )
        .map_err(|e| setup_err("write sluice.toml", e))?;
        let stop = Arc::new(AtomicBool::new(false));
        let ns = Arc::clone(&t.dut);
        let opts = sluice_daemon::RunOptions {
            backend: Some(backend),
            stop: Some(Arc::clone(&stop)),
            ..Default::default()
        };
        let thread = std::thread::Builder::new()
            .name("bench-dut".into())
            .spawn(move || {
                // The worker is pinned to the first core this thread may
                // use: make that the DUT core.
                core_affinity::set_for_current(core_affinity::CoreId { id: dut_core });
                ns.enter_this_thread().map_err(|e| e.to_string())?;
                sluice_daemon::run(&cfg, &opts).map_err(|e| e.to_string())
            })
            .map_err(|e| setup_err("spawn the DUT thread", e))?;
        let mut d = Self {
            stop,
            thread: Some(thread),
            sock,
        };
        let t0 = Instant::now();
        while !d.sock.exists() {
            if d.thread.as_ref().is_some_and(JoinHandle::is_finished) {
                let r = d.thread.take().map(JoinHandle::join);
                let why = match r {
                    Some(Ok(Err(e))) => e,
                    _ => "the gateway stopped".into(),
                };
                return Err(setup_err("sluice run", why));
            }
            if t0.elapsed() > Duration::from_secs(20) {
                return Err(setup_err("sluice run", "did not start within 20 s"));
            }
            sleep(Duration::from_millis(20), interrupted)?;
        }
        // The forward rules and the masquerade rule.
        let loaded = d
            .ctl(&["status"])
            .and_then(|v| v["rules"].as_u64())
            .ok_or_else(|| setup_err("sluice ctl status", "no rule count"))?;
        let asked = if t.ipv6 {
            rules6(rules, icmp)
        } else {
            forward_rules(rules, icmp) + 1
        };
        if loaded != asked as u64 {
            return Err(setup_err(
                "sluice run",
                format!("{loaded} rules loaded, {asked} asked for"),
            ));
        }
        Ok(d)
    }

    /// One control request; the JSON answer.
    fn ctl(&self, words: &[&str]) -> Option<serde_json::Value> {
        let args: Vec<String> = words.iter().map(|s| s.to_string()).collect();
        let req = sluice_daemon::ctl::request_from_args(&args).ok()?;
        let resp = sluice_daemon::ctl::client(&self.sock, &req).ok()?;
        serde_json::from_str(&resp).ok()
    }

    /// Non-zero counters of the gateway, compactly.
    fn counters_summary(&self) -> String {
        let Some(v) = self.ctl(&["counters"]) else {
            return "unavailable".into();
        };
        let mut out = Vec::new();
        flatten_nonzero("", &v["counters"], &mut out);
        out.join(" ")
    }

    /// The ports' modes as the gateway describes them.
    fn modes(&self) -> String {
        let Some(v) = self.ctl(&["status"]) else {
            return String::new();
        };
        let mut out = Vec::new();
        collect_modes(&v, &mut out);
        out.join("; ")
    }
}

fn collect_modes(v: &serde_json::Value, out: &mut Vec<String>) {
    match v {
        serde_json::Value::Object(m) => {
            for (k, x) in m {
                match (k.as_str(), x) {
                    ("mode", serde_json::Value::String(s)) => out.push(s.clone()),
                    _ => collect_modes(x, out),
                }
            }
        }
        serde_json::Value::Array(a) => a.iter().for_each(|x| collect_modes(x, out)),
        _ => {}
    }
}

fn flatten_nonzero(path: &str, v: &serde_json::Value, out: &mut Vec<String>) {
    match v {
        serde_json::Value::Object(m) => {
            for (k, x) in m {
                let p = if path.is_empty() {
                    k.clone()
                } else {
                    format!("{path}.{k}")
                };
                flatten_nonzero(&p, x, out);
            }
        }
        serde_json::Value::Number(n) if n.as_u64() != Some(0) => out.push(format!("{path}={n}")),
        _ => {}
    }
}

impl Drop for SluiceDut {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.thread.take() {
            let _ = h.join();
        }
    }
}

/// First destination port of the forward rules that the traffic does not
/// match (seed 001's appendix B numbers its port rules from 40000). The
/// traffic's destination ports are below it ([`check_rule_ports`]).
pub const RULE_PORT_BASE: u16 = 40_000;
/// Destination ports the non-matching rules use per address.
const RULE_PORTS: usize = 65_536 - RULE_PORT_BASE as usize;

/// Rule `i` of the rules that the traffic does not match: a destination
/// address and a UDP destination port. The first [`RULE_PORTS`] use the
/// traffic's own destination (so each rule's check reaches its port
/// comparison, as seed 001's `-p tcp --dport P -d <server>` rules do for
/// the server's traffic), and ports 40000-65535; later ones move to
/// addresses of RFC 2544's benchmarking range 198.18.0.0/15.
pub fn miss_rule(i: usize) -> ([u8; 4], u16) {
    let port = RULE_PORT_BASE + (i % RULE_PORTS) as u16;
    let block = i / RULE_PORTS;
    let addr = if block == 0 {
        RECV_IP
    } else {
        let b = u32::from_be_bytes([198, 18, 0, 0]) + block as u32;
        b.to_be_bytes()
    };
    (addr, port)
}

fn ip_str(a: [u8; 4]) -> String {
    std::net::Ipv4Addr::from(a).to_string()
}

/// The traffic's destination ports must stay below [`RULE_PORT_BASE`] when
/// there are rules, so that no rule but the last matches it.
fn check_rule_ports(flows: u64, rules: usize) -> Result<(), ForwardError> {
    if rules == 0 {
        return Ok(());
    }
    let r = PortRanges::for_connections(flows, 50_000).ok_or(ForwardError::Flows(flows))?;
    let top = u64::from(r.dport_min) + u64::from(r.dports) - 1;
    if top >= u64::from(RULE_PORT_BASE) {
        return Err(setup_err(
            "--rules",
            format!(
                "{flows} flows use destination ports up to {top}; the forward rules start at port {RULE_PORT_BASE}"
            ),
        ));
    }
    Ok(())
}

/// The nftables rule set of Sluice and of `kernel-nftables` (one text):
/// `oifname WAN masquerade` in a `nat` postrouting chain; with `rules` > 0
/// a forward filter chain (policy drop) of `rules - 1` rules `udp dport P
/// ip daddr D accept` that the traffic does not match ([`miss_rule`]) and,
/// last, `ip daddr 203.0.113.2 meta l4proto udp accept`, which it does:
/// seed 001's rule-set shape (appendix B, the rule for the test traffic at
/// the bottom as RFC 3511 asks). With `flowtable`, a flowtable on both
/// veths and `flow add` first in the forward chain.
pub fn nft_ruleset(lan: &str, wan: &str, rules: usize, flowtable: bool, icmp: bool) -> String {
    let mut s = String::from("table ip sluicebench {\n");
    if flowtable {
        let _ = write!(
            s,
            "  flowtable ft {{\n    hook ingress priority 0; devices = {{ \"{lan}\", \"{wan}\" }};\n  }}\n"
        );
    }
    if flowtable || rules > 0 {
        let policy = if rules > 0 { "drop" } else { "accept" };
        let _ = write!(
            s,
            "  chain forward {{\n    type filter hook forward priority 0; policy {policy};\n"
        );
        if flowtable {
            s.push_str("    ip protocol { tcp, udp } flow add @ft\n");
        }
        for i in 0..rules.saturating_sub(1) {
            let (a, p) = miss_rule(i);
            let _ = writeln!(s, "    udp dport {p} ip daddr {} accept", ip_str(a));
        }
        if rules > 0 {
            let _ = writeln!(
                s,
                "    ip daddr {} meta l4proto udp accept",
                ip_str(RECV_IP)
            );
            if icmp {
                s.push_str("    icmp type echo-request accept\n    icmp type echo-reply accept\n");
            }
        }
        s.push_str("  }\n");
    }
    let _ = write!(
        s,
        "  chain postrouting {{\n    type nat hook postrouting priority 100; policy accept;\n    oifname \"{wan}\" masquerade\n  }}\n}}\n"
    );
    s
}

/// The IPv6 rule set of every DUT with `--ipv6` (one text for Sluice and
/// `kernel-nftables`): no NAT, a stateful forward chain, policy drop. With
/// `rules` 0, `ct state established,related accept` and new UDP
/// connections to the receiver accepted, so that every DUT tracks every
/// flow as the IPv4 masquerade makes it do. With `rules` N > 0, seed 001's
/// shape as for IPv4 ([`nft_ruleset`]): N - 1 rules `udp dport P ip6 daddr
/// D accept` that the traffic does not match ([`miss_rule6`]), then
/// `ip6 daddr RECEIVER meta l4proto udp ct state new,established accept`
/// (every packet walks the chain, and every DUT tracks every flow). With
/// `flowtable`, a flowtable on both veths and `flow add` first.
pub fn nft_ruleset6(lan: &str, wan: &str, rules: usize, flowtable: bool, icmp: bool) -> String {
    let mut s = String::from("table ip6 sluicebench {\n");
    if flowtable {
        let _ = write!(
            s,
            "  flowtable ft {{\n    hook ingress priority 0; devices = {{ \"{lan}\", \"{wan}\" }};\n  }}\n"
        );
    }
    s.push_str("  chain forward {\n    type filter hook forward priority 0; policy drop;\n");
    if flowtable {
        s.push_str("    meta l4proto { tcp, udp } flow add @ft\n");
    }
    if rules == 0 {
        let _ = write!(
            s,
            "    ct state established,related accept\n    ip6 daddr {RECV_IP6} meta l4proto udp ct state new accept\n"
        );
    } else {
        for i in 0..rules - 1 {
            let (a, p) = miss_rule6(i);
            let _ = writeln!(s, "    udp dport {p} ip6 daddr {a} accept");
        }
        let _ = writeln!(
            s,
            "    ip6 daddr {RECV_IP6} meta l4proto udp ct state new,established accept"
        );
    }
    if icmp {
        s.push_str("    icmpv6 type echo-request accept\n    icmpv6 type echo-reply accept\n");
    }
    s.push_str("  }\n}\n");
    s
}

/// Rule `i` of the IPv6 rules the traffic does not match: as
/// [`miss_rule`], the receiver's address first, then addresses of RFC
/// 5180's benchmarking prefix 2001:2::/48.
pub fn miss_rule6(i: usize) -> (std::net::Ipv6Addr, u16) {
    let port = RULE_PORT_BASE + (i % RULE_PORTS) as u16;
    let block = i / RULE_PORTS;
    let addr = if block == 0 {
        ip6(RECV_IP6)
    } else {
        std::net::Ipv6Addr::from(u128::from(ip6("2001:2::")) + block as u128)
    };
    (addr, port)
}

/// Rules in the forward chain of [`nft_ruleset6`] (without `flow add`;
/// with `icmp`, the two echo rules of a latency measurement).
fn rules6(rules: usize, icmp: bool) -> usize {
    let n = if rules == 0 { 2 } else { rules };
    n + if icmp { 2 } else { 0 }
}

/// The same in ip6tables-restore form, for `kernel-iptables` with
/// `--ipv6`.
pub fn ip6tables_ruleset(rules: usize, icmp: bool) -> String {
    let mut s =
        String::from("*filter\n:INPUT ACCEPT [0:0]\n:FORWARD DROP [0:0]\n:OUTPUT ACCEPT [0:0]\n");
    if rules == 0 {
        let _ = write!(
            s,
            "-A FORWARD -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT\n\
             -A FORWARD -d {RECV_IP6}/128 -p udp -m conntrack --ctstate NEW -j ACCEPT\n"
        );
    } else {
        for i in 0..rules - 1 {
            let (a, p) = miss_rule6(i);
            let _ = writeln!(
                s,
                "-A FORWARD -d {a}/128 -p udp -m udp --dport {p} -j ACCEPT"
            );
        }
        let _ = writeln!(
            s,
            "-A FORWARD -d {RECV_IP6}/128 -p udp -m conntrack --ctstate NEW,ESTABLISHED -j ACCEPT"
        );
    }
    if icmp {
        s.push_str(
            "-A FORWARD -p ipv6-icmp -m icmp6 --icmpv6-type 128 -j ACCEPT\n\
             -A FORWARD -p ipv6-icmp -m icmp6 --icmpv6-type 129 -j ACCEPT\n",
        );
    }
    s.push_str("COMMIT\n");
    s
}

/// The same rule set in iptables-restore form, for `kernel-iptables`:
/// `-A POSTROUTING -o WAN -j MASQUERADE` in the nat table and, with
/// `rules` > 0, the FORWARD chain (policy DROP) of [`nft_ruleset`]'s
/// rules, `-d D -p udp -m udp --dport P -j ACCEPT` (seed 001's form).
pub fn iptables_ruleset(wan: &str, rules: usize, icmp: bool) -> String {
    let mut s = String::new();
    if rules > 0 {
        s.push_str("*filter\n:INPUT ACCEPT [0:0]\n:FORWARD DROP [0:0]\n:OUTPUT ACCEPT [0:0]\n");
        for i in 0..rules - 1 {
            let (a, p) = miss_rule(i);
            let _ = writeln!(
                s,
                "-A FORWARD -d {}/32 -p udp -m udp --dport {p} -j ACCEPT",
                ip_str(a)
            );
        }
        let _ = writeln!(s, "-A FORWARD -d {}/32 -p udp -j ACCEPT", ip_str(RECV_IP));
        if icmp {
            s.push_str(
                "-A FORWARD -p icmp -m icmp --icmp-type 8 -j ACCEPT\n-A FORWARD -p icmp -m icmp --icmp-type 0 -j ACCEPT\n",
            );
        }
        s.push_str("COMMIT\n");
    }
    let _ = write!(
        s,
        "*nat\n:PREROUTING ACCEPT [0:0]\n:INPUT ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\n-A POSTROUTING -o {wan} -j MASQUERADE\nCOMMIT\n"
    );
    s
}

/// Kernel forwarding for the kernel DUT `dut` in the DUT namespace: the
/// masquerade rule, `rules` forward rules (see [`nft_ruleset`]) and, for
/// `kernel-flowtable`, the flowtable; with iptables-legacy for
/// `kernel-iptables`. Returns how the rules were loaded and checked.
fn start_kernel(t: &Topo, dut: Dut, rules: usize, icmp: bool) -> Result<String, ForwardError> {
    if t.ipv6 {
        return start_kernel6(t, dut, rules, icmp);
    }
    let d = &*t.dut;
    ns_ip(d, &["addr", "add", "10.0.0.1/24", "dev", &t.lan])?;
    ns_ip(d, &["addr", "add", "203.0.113.1/24", "dev", &t.wan])?;
    ns_ip(
        d,
        &[
            "neigh",
            "replace",
            "203.0.113.2",
            "lladdr",
            &mac_str(NEXT_HOP_MAC),
            "dev",
            &t.wan,
            "nud",
            "permanent",
        ],
    )?;
    ns_ip(
        d,
        &[
            "neigh",
            "replace",
            "10.0.0.2",
            "lladdr",
            &mac_str(SENDER_MAC),
            "dev",
            &t.lan,
            "nud",
            "permanent",
        ],
    )?;
    ns_exec(d, &["sysctl", "-qw", "net.ipv4.ip_forward=1"])?;
    if dut == Dut::KernelIptables {
        let f = t.dir.join("kernel.rules");
        std::fs::write(&f, iptables_ruleset(&t.wan, rules, icmp))
            .map_err(|e| setup_err("write iptables rules", e))?;
        ns_exec(d, &["iptables-legacy-restore", &f.display().to_string()]).map_err(|e| {
            setup_err(
                dut.name(),
                format!(
                    "iptables-legacy-restore failed (it needs the iptables package and a kernel \
                     with CONFIG_IP_NF_IPTABLES_LEGACY; leave kernel-iptables out of --dut \
                     otherwise): {e}"
                ),
            )
        })?;
        if rules > 0 {
            let listed = ns_exec(d, &["iptables-legacy", "-S", "FORWARD"])?;
            let n = listed
                .lines()
                .filter(|l| l.starts_with("-A FORWARD"))
                .count();
            check_loaded("kernel-iptables", n, forward_rules(rules, icmp))?;
        }
        return Ok("iptables-legacy (x_tables) MASQUERADE".into());
    }
    let flowtable = dut == Dut::KernelFlowtable;
    let nft = t.dir.join("kernel.nft");
    std::fs::write(&nft, nft_ruleset(&t.lan, &t.wan, rules, flowtable, icmp))
        .map_err(|e| setup_err("write nft", e))?;
    ns_exec(d, &["nft", "-f", &nft.display().to_string()]).map_err(|e| {
        if flowtable {
            setup_err(
                dut.name(),
                format!(
                    "the kernel refused the flowtable (built without CONFIG_NF_FLOW_TABLE?): {e}"
                ),
            )
        } else {
            e
        }
    })?;
    if rules > 0 {
        let listed = ns_exec(d, &["nft", "list", "chain", "ip", "sluicebench", "forward"])?;
        let n = listed
            .lines()
            .filter(|l| l.trim_end().ends_with(" accept") && !l.contains("policy"))
            .count();
        check_loaded(dut.name(), n, forward_rules(rules, icmp))?;
    }
    Ok(if flowtable {
        "nft masquerade + flowtable (flow add @ft)".into()
    } else {
        "nft masquerade".into()
    })
}

/// [`start_kernel`] with `--ipv6`: the kernel's IPv6 forwarding with the
/// stateful forward chain of [`nft_ruleset6`] (or [`ip6tables_ruleset`]
/// with iptables-legacy).
fn start_kernel6(t: &Topo, dut: Dut, rules: usize, icmp: bool) -> Result<String, ForwardError> {
    let d = &*t.dut;
    for (addr, dev) in [(LAN_IP6, &t.lan), (WAN_IP6, &t.wan)] {
        ns_ip(
            d,
            &[
                "-6",
                "addr",
                "add",
                &format!("{addr}/64"),
                "dev",
                dev,
                "nodad",
            ],
        )?;
    }
    for (ip, mac, dev) in [
        (RECV_IP6, NEXT_HOP_MAC, &t.wan),
        (SENDER_IP6, SENDER_MAC, &t.lan),
    ] {
        ns_ip(
            d,
            &[
                "-6",
                "neigh",
                "replace",
                ip,
                "lladdr",
                &mac_str(mac),
                "dev",
                dev,
                "nud",
                "permanent",
            ],
        )?;
    }
    ns_exec(d, &["sysctl", "-qw", "net.ipv6.conf.all.forwarding=1"])?;
    if dut == Dut::KernelIptables {
        let f = t.dir.join("kernel6.rules");
        std::fs::write(&f, ip6tables_ruleset(rules, icmp))
            .map_err(|e| setup_err("write ip6tables rules", e))?;
        ns_exec(d, &["ip6tables-legacy-restore", &f.display().to_string()]).map_err(|e| {
            setup_err(
                dut.name(),
                format!("ip6tables-legacy-restore failed (the iptables package and a kernel with CONFIG_IP6_NF_IPTABLES_LEGACY): {e}"),
            )
        })?;
        let listed = ns_exec(d, &["ip6tables-legacy", "-S", "FORWARD"])?;
        let n = listed
            .lines()
            .filter(|l| l.starts_with("-A FORWARD"))
            .count();
        check_loaded(dut.name(), n, rules6(rules, icmp))?;
        return Ok("ip6tables-legacy (x_tables) conntrack forward chain".into());
    }
    let flowtable = dut == Dut::KernelFlowtable;
    let nft = t.dir.join("kernel6.nft");
    std::fs::write(&nft, nft_ruleset6(&t.lan, &t.wan, rules, flowtable, icmp))
        .map_err(|e| setup_err("write nft", e))?;
    ns_exec(d, &["nft", "-f", &nft.display().to_string()])?;
    let listed = ns_exec(
        d,
        &["nft", "list", "chain", "ip6", "sluicebench", "forward"],
    )?;
    let n = listed
        .lines()
        .filter(|l| l.trim_end().ends_with(" accept") && !l.contains("policy"))
        .count();
    check_loaded(dut.name(), n, rules6(rules, icmp))?;
    Ok(if flowtable {
        "nft ct state forward chain + flowtable (flow add @ft)".into()
    } else {
        "nft ct state forward chain".into()
    })
}

/// The forward chain in a DUT's mode string.
fn filter_note(rules: usize) -> String {
    match rules {
        0 => String::new(),
        n => format!(
            "; forward chain of {n} rules, policy drop, the last one matching (loaded and counted)"
        ),
    }
}

/// Forward rules a DUT lists for `rules` (with `icmp`, the two echo rules
/// of a latency measurement follow them).
fn forward_rules(rules: usize, icmp: bool) -> usize {
    if rules > 0 && icmp {
        rules + 2
    } else {
        rules
    }
}

/// The DUT lists as many forward rules as were asked for.
fn check_loaded(dut: &str, listed: usize, rules: usize) -> Result<(), ForwardError> {
    if listed == rules {
        Ok(())
    } else {
        Err(setup_err(
            dut,
            format!("{listed} forward rules loaded, {rules} asked for"),
        ))
    }
}

/// Make the veth NAPI of `dev` threaded and pin its kernel threads to
/// `core`. Returns how many threads were pinned.
fn pin_napi_threads(t: &Topo, dev: &str, core: usize) -> Result<usize, ForwardError> {
    ns_exec(
        &t.dut,
        &[
            "sh",
            "-c",
            &format!("echo 1 > /sys/class/net/{dev}/threaded"),
        ],
    )?;
    // The kernel names the thread "napi/<dev>-<id>" (truncated to 15 bytes).
    let prefix: String = format!("napi/{dev}-").chars().take(15).collect();
    let mut pinned = 0;
    for _ in 0..20 {
        let Ok(dir) = std::fs::read_dir("/proc") else {
            break;
        };
        for e in dir.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if !name.bytes().all(|b| b.is_ascii_digit()) {
                continue;
            }
            let comm = std::fs::read_to_string(e.path().join("comm")).unwrap_or_default();
            if comm.trim_end().starts_with(&prefix) {
                run_cmd("taskset", &["-pc", &core.to_string(), &name])?;
                pinned += 1;
            }
        }
        if pinned > 0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(pinned)
}

// ------------------------------------------------------------------- sender

/// What the sender thread does.
#[derive(Clone, Copy)]
enum Pace {
    /// Every flow once, at most this many frames per second.
    OncePaced(u64),
    /// Cyclically over the flows at this many frames per second until
    /// stopped.
    Paced(u64),
    /// As fast as possible until stopped.
    Flat,
    /// Every flow once, as fast as possible.
    OnceFlat,
}

/// Pins the calling thread to the sender core and moves it into the
/// sender namespace.
fn enter_sender(t: &Topo, core: usize) -> Result<(), ForwardError> {
    core_affinity::set_for_current(core_affinity::CoreId { id: core });
    t.sender
        .enter_this_thread()
        .map_err(|e| setup_err("enter the sender namespace", e))
}

/// Send on the sender's veth until the plan is done or `stop`; `sent`
/// counts queued frames as they go.
fn sender(
    t: &Topo,
    core: usize,
    flows: &[(u16, u16)],
    pace: Pace,
    stop: &AtomicBool,
    sent: &AtomicU64,
) -> Result<(), ForwardError> {
    enter_sender(t, core)?;
    let tx = BatchSender::open(HOST_IF, SNDBUF).map_err(|e| setup_err("sender AF_PACKET", e))?;
    let tpl = Template::for_version(t.ipv6);
    let burst = match pace {
        Pace::OncePaced(_) | Pace::Paced(_) => 32,
        Pace::Flat | Pace::OnceFlat => SEND_BATCH_MAX,
    };
    let mut frames = vec![tpl.bytes().to_vec(); burst];
    let start = Instant::now();
    let mut next = 0usize;
    let mut total = 0u64;
    let limit = match pace {
        Pace::OncePaced(_) | Pace::OnceFlat => flows.len() as u64,
        Pace::Paced(_) | Pace::Flat => u64::MAX,
    };
    let mut errors = 0u32;
    while total < limit && !stop.load(Ordering::Relaxed) {
        let k = (burst as u64).min(limit - total) as usize;
        for f in &mut frames[..k] {
            let (sp, dp) = flows[next];
            next += 1;
            if next == flows.len() {
                next = 0;
            }
            tpl.patch(f, sp, dp);
        }
        let mut done = 0;
        while done < k && !stop.load(Ordering::Relaxed) {
            match tx.send_batch(&frames[done..k]) {
                Ok(n) => {
                    done += n;
                    errors = 0;
                }
                // ENOBUFS and the like: the kernel is momentarily out of
                // room; anything persistent is a failure.
                Err(e) => {
                    errors += 1;
                    if errors > 100_000 {
                        return Err(setup_err("sender sendmmsg", e));
                    }
                    std::thread::yield_now();
                }
            }
        }
        total += done as u64;
        sent.store(total, Ordering::Relaxed);
        if let Pace::OncePaced(pps) | Pace::Paced(pps) = pace {
            let due = Duration::from_secs_f64(total as f64 / pps.max(1) as f64);
            while start.elapsed() < due && !stop.load(Ordering::Relaxed) {
                std::hint::spin_loop();
            }
        }
    }
    Ok(())
}

/// The XDP sender: live XDP frames redirected into the sender's veth, as
/// fast as the sender core runs them, until `stop`; `sent` counts frames
/// in steps of [`XDP_REPEAT`].
fn xdp_sender(
    t: &Topo,
    core: usize,
    entries: &[[u8; 8]],
    once: bool,
    stop: &AtomicBool,
    sent: &AtomicU64,
) -> Result<(), ForwardError> {
    // BPF_PROG_RUN runs on the calling thread's CPU, and resolves the
    // ingress and redirect interfaces in its network namespace.
    enter_sender(t, core)?;
    let tpl = Template::for_version(t.ipv6);
    let gen = sluice_io::xdpgen::LiveFrames::new(HOST_IF, tpl.bytes(), entries, XDP_BATCH)
        .map_err(|e| setup_err("xdp sender", e))?;
    let mut total = 0u64;
    // With `once`, whole calls that stay within one pass over the flows.
    let limit = if once {
        entries.len() as u64 / u64::from(XDP_REPEAT) * u64::from(XDP_REPEAT)
    } else {
        u64::MAX
    };
    while !stop.load(Ordering::Relaxed) && total < limit {
        match gen.run(XDP_REPEAT) {
            Ok(()) => {
                total += u64::from(XDP_REPEAT);
                sent.store(total, Ordering::Relaxed);
            }
            // A signal (SIGINT) cut the run short: the caller sees the
            // interrupt flag.
            Err(sluice_io::xdpgen::LiveFramesError::Interrupted) => {}
            Err(e) => return Err(setup_err("xdp sender", e)),
        }
    }
    Ok(())
}

/// The idle round trip through the DUT: the receiver stops dropping
/// (its XDP program detached) and takes the next hop's MAC so that its
/// kernel answers, the sender routes 203.0.113.0/24 via the DUT, and
/// `ping` sends [`PING_WARMUP`] + [`PINGS`] echo requests 5 ms apart;
/// the first [`PING_WARMUP`] are not counted.
fn latency(t: &mut Topo, interrupted: &AtomicBool) -> Result<Latency, ForwardError> {
    t.sink = None;
    ns_ip(
        &t.recv,
        &[
            "link",
            "set",
            "dev",
            HOST_IF,
            "address",
            &mac_str(NEXT_HOP_MAC),
        ],
    )?;
    let target = if t.ipv6 {
        // The hosts' IPv6 addresses and routes through the DUT (whose
        // addresses they resolve by NDP).
        for (ns, addr, net, via) in [
            (&t.sender, SENDER_IP6, "2001:db8:1::/64", LAN_IP6),
            (&t.recv, RECV_IP6, "fd00:1::/64", WAN_IP6),
        ] {
            ns_ip(
                ns,
                &[
                    "-6",
                    "addr",
                    "add",
                    &format!("{addr}/64"),
                    "dev",
                    HOST_IF,
                    "nodad",
                ],
            )?;
            ns_ip(ns, &["-6", "route", "replace", net, "via", via])?;
        }
        RECV_IP6
    } else {
        ns_ip(
            &t.sender,
            &["route", "replace", "203.0.113.0/24", "via", "10.0.0.1"],
        )?;
        "203.0.113.2"
    };
    if interrupted.load(Ordering::Relaxed) {
        return Err(ForwardError::Interrupted);
    }
    let count = (PING_WARMUP + PINGS).to_string();
    let out = ns_exec(
        &t.sender,
        &["ping", "-n", "-c", &count, "-i", "0.005", "-W", "1", target],
    )?;
    Ok(latency_of(&out))
}

/// The [`Latency`] of `ping -n` output: replies with `icmp_seq` above
/// [`PING_WARMUP`].
fn latency_of(out: &str) -> Latency {
    let mut rtt: Vec<f64> = out
        .lines()
        .filter_map(|l| {
            let seq: usize = l
                .split("icmp_seq=")
                .nth(1)?
                .split_whitespace()
                .next()?
                .parse()
                .ok()?;
            let ms: f64 = l
                .split("time=")
                .nth(1)?
                .split_whitespace()
                .next()?
                .parse()
                .ok()?;
            (seq > PING_WARMUP).then_some(ms * 1000.0)
        })
        .collect();
    rtt.sort_by(f64::total_cmp);
    let at = |q: f64| -> f64 {
        if rtt.is_empty() {
            return f64::NAN;
        }
        let i = ((q * rtt.len() as f64).ceil() as usize).clamp(1, rtt.len()) - 1;
        rtt.get(i).copied().unwrap_or(f64::NAN)
    };
    Latency {
        sent: PINGS,
        received: rtt.len(),
        min_us: rtt.first().copied().unwrap_or(f64::NAN),
        median_us: at(0.5),
        p99_us: at(0.99),
        max_us: rtt.last().copied().unwrap_or(f64::NAN),
    }
}

/// One RFC 2544 trial: `pps` for `duration`, then 200 ms for frames in
/// flight; returns (frames sent, frames received).
fn trial(
    t: &Topo,
    sender_core: usize,
    ports: &[(u16, u16)],
    pps: u64,
    duration: Duration,
    interrupted: &AtomicBool,
) -> Result<(u64, u64), ForwardError> {
    let rx0 = rx_packets(&t.recv, HOST_IF)?;
    let sent = AtomicU64::new(0);
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        let h = s.spawn(|| sender(t, sender_core, ports, Pace::Paced(pps), &stop, &sent));
        let r = sleep(duration, interrupted);
        stop.store(true, Ordering::Relaxed);
        let joined = h
            .join()
            .unwrap_or_else(|_| Err(setup_err("sender", "panicked")));
        joined.and(r)
    })?;
    sleep(Duration::from_millis(200), interrupted)?;
    let got = rx_packets(&t.recv, HOST_IF)?.saturating_sub(rx0);
    Ok((sent.load(Ordering::Relaxed), got))
}

// -------------------------------------------------------------------- a run

/// The cores: (DUT, sender).
fn cores() -> (usize, usize) {
    let ids: Vec<usize> = core_affinity::get_core_ids()
        .unwrap_or_default()
        .into_iter()
        .map(|c| c.id)
        .collect();
    match (ids.first(), ids.last()) {
        (Some(&f), Some(&l)) => (l, f),
        _ => (0, 0),
    }
}

/// Whether this process runs as root (effective uid 0).
pub(crate) fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(2).map(|u| u == "0"))
        })
        .unwrap_or(false)
}

/// Measure every (DUT, flows) point. `interrupted` is polled throughout
/// (set it from a SIGINT handler); `progress` gets one line per step.
pub fn run(
    opts: &ForwardOptions,
    interrupted: &AtomicBool,
    progress: &mut dyn FnMut(&str),
) -> Result<Vec<ForwardResult>, ForwardError> {
    if !is_root() {
        return Err(ForwardError::NotRoot);
    }
    if opts.setup && opts.zero_loss {
        return Err(setup_err(
            "--setup",
            "not with --zero-loss: every trial of the search would need flows the DUT has not seen",
        ));
    }
    remove_stale_namespaces();
    let (dut_core, sender_core) = cores();
    if dut_core == sender_core {
        progress("warning: one core only: the sender and the DUT share it");
    }
    let mut out = Vec::new();
    for &flows in &opts.flows {
        for &rules in &opts.rules {
            check_rule_ports(flows, rules)?;
        }
    }
    for (ri, &rules) in opts.rules.iter().enumerate() {
        for (fi, &flows) in opts.flows.iter().enumerate() {
            let ports = flow_ports(flows, opts.seed)?;
            let entries = match opts.sender {
                Sender::Xdp => xdp_flow_entries(&ports, opts.ipv6),
                Sender::Socket => Vec::new(),
            };
            for (di, &dut) in opts.duts.iter().enumerate() {
                let with = match rules {
                    0 => String::new(),
                    n => format!(", {n} forward rules"),
                };
                progress(&format!(
                    "bench forward: {} with {flows} flows{with} (DUT core {dut_core}, sender core {sender_core}, {} sender) ...",
                    dut.name(),
                    opts.sender.name()
                ));
                let tag = format!("{ri}{fi}{di}");
                let r = point(
                    opts,
                    dut,
                    (flows, rules),
                    &ports,
                    &entries,
                    &tag,
                    (dut_core, sender_core),
                    interrupted,
                    progress,
                )?;
                progress(&format!(
                    "  {:.3} Mpps forwarded, {:.3} Mpps offered, loss {:.1} %",
                    r.fps / 1e6,
                    r.offered_fps / 1e6,
                    r.loss * 100.0
                ));
                out.push(r);
            }
        }
    }
    Ok(out)
}

#[allow(clippy::too_many_arguments)]
fn point(
    opts: &ForwardOptions,
    dut: Dut,
    (flows, rules): (u64, usize),
    ports: &[(u16, u16)],
    entries: &[[u8; 8]],
    tag: &str,
    (dut_core, sender_core): (usize, usize),
    interrupted: &AtomicBool,
    progress: &mut dyn FnMut(&str),
) -> Result<ForwardResult, ForwardError> {
    let mut topo = Topo::new(tag, dut_core, opts.receiver, opts.ipv6)?;
    // Declared after `topo`, so it stops before the namespaces go.
    let mut sluice = None;
    let mut _ct_max = None;
    let mut dut_mode = match dut {
        Dut::KernelNftables | Dut::KernelFlowtable | Dut::KernelIptables => {
            let how = start_kernel(&topo, dut, rules, opts.latency)?;
            // The masquerade rule has loaded nf_conntrack by now.
            _ct_max = Some(ConntrackMax::at_least(flows + flows / 4 + 65_536));
            let read = |k: &str| {
                ns_exec(&topo.dut, &["sysctl", "-n", k])
                    .map(|s| s.trim().to_string())
                    .unwrap_or_else(|_| "?".into())
            };
            format!(
                "kernel ip_forward + {how}{}, RPS to the DUT core, nf_conntrack_max {}, buckets {}",
                filter_note(rules),
                read("net.netfilter.nf_conntrack_max"),
                read("net.netfilter.nf_conntrack_buckets")
            )
        }
        Dut::SenderOnly => {
            let name =
                sluice_io::IfName::new(&topo.lan).map_err(|e| setup_err("interface name", e))?;
            let script = sluice_io::nft::ingress_drop_script(&[name]);
            let f = topo.dir.join("drop.nft");
            std::fs::write(&f, script + "\n").map_err(|e| setup_err("write nft", e))?;
            ns_exec(&topo.dut, &["nft", "-f", &f.display().to_string()])?;
            "no DUT: netdev ingress drop on the inside veth, RPS to the DUT core".into()
        }
        Dut::SluiceAfXdp | Dut::SluiceAfPacket | Dut::SluiceXdpOffload => {
            let xdp = dut != Dut::SluiceAfPacket;
            let backend = if xdp {
                sluice_daemon::config::BackendChoice::AfXdp
            } else {
                sluice_daemon::config::BackendChoice::AfPacket
            };
            let offload = dut == Dut::SluiceXdpOffload;
            let s = SluiceDut::start(
                &topo,
                backend,
                offload,
                (flows, rules, opts.latency),
                opts.af_packet_rx,
                dut_core,
                interrupted,
            )?;
            let mut mode = s.modes();
            mode.push_str(&filter_note(rules));
            mode.push_str(&format!("; worker SCHED_FIFO {WORKER_PRIORITY}"));
            if offload && rules > 0 {
                // The offload takes established flows only when the policy
                // accepts them up front (sluice_engine::offload).
                mode.push_str("; XDP offload on but idle (the forward chain filters every packet)");
            } else if offload {
                mode.push_str("; XDP offload of established flows");
            }
            if xdp {
                let n = pin_napi_threads(&topo, &topo.lan, dut_core)?;
                if n == 0 {
                    progress("  warning: no threaded NAPI thread found: XDP receive runs on the sender's core");
                    mode.push_str("; XDP receive in the sender core's softirq");
                } else {
                    mode.push_str(&format!("; threaded NAPI ({n}) on the DUT core"));
                }
            } else {
                mode.push_str("; RPS to the DUT core");
            }
            sluice = Some(s);
            mode
        }
    };
    if opts.sender == Sender::Xdp {
        // veth queues redirected xdp_frames only onto a peer with NAPI: an
        // XDP program (the AF_XDP DUT's) or GRO on. Every DUT gets GRO on
        // and its NAPI thread on the DUT core, where the veth runs the XDP
        // program or builds the skb, as a NIC driver's NAPI poll does.
        ns_exec(&topo.dut, &["ethtool", "-K", &topo.lan, "gro", "on"])?;
        // The NAPI thread already runs on the DUT core: no RPS hand-off
        // (a NIC's receive processing runs in its NAPI poll too).
        ns_exec(
            &topo.dut,
            &[
                "sh",
                "-c",
                &format!("echo 0 > /sys/class/net/{}/queues/rx-0/rps_cpus", topo.lan),
            ],
        )?;
        if matches!(dut, Dut::SluiceAfXdp | Dut::SluiceXdpOffload) {
            dut_mode.push_str("; GRO on, RPS off");
        } else {
            let n = pin_napi_threads(&topo, &topo.lan, dut_core)?;
            if n == 0 {
                return Err(setup_err(
                    "xdp sender",
                    format!("no threaded NAPI thread of {} found", topo.lan),
                ));
            }
            dut_mode.push_str(&format!(
                "; GRO on, RPS off, threaded NAPI ({n}) on the DUT core"
            ));
        }
    }

    // Warm-up: every flow once, paced; again slower if much was lost.
    // Then every flow once more at the rate that worked: the second packet
    // of a connection is the first an offloading DUT (Sluice's XDP
    // offload, a kernel flowtable) hands to its fast path, so the
    // measurement starts with every flow established on it.
    let mut pps = opts.warmup_pps.max(1000);
    let mut passes = 0;
    let mut warmup_loss = 0.0;
    let warm_pass = |pps: u64| -> Result<f64, ForwardError> {
        let rx0 = rx_packets(&topo.recv, HOST_IF)?;
        let sent = AtomicU64::new(0);
        let stop = AtomicBool::new(false);
        std::thread::scope(|s| {
            let h = s.spawn(|| {
                sender(
                    &topo,
                    sender_core,
                    ports,
                    Pace::OncePaced(pps),
                    &stop,
                    &sent,
                )
            });
            while !h.is_finished() {
                if interrupted.load(Ordering::Relaxed) {
                    stop.store(true, Ordering::Relaxed);
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            h.join()
                .unwrap_or_else(|_| Err(setup_err("sender", "panicked")))
        })?;
        sleep(Duration::from_millis(300), interrupted)?;
        let got = rx_packets(&topo.recv, HOST_IF)?.saturating_sub(rx0);
        let n = sent.load(Ordering::Relaxed).max(1);
        Ok(1.0 - (got as f64 / n as f64).min(1.0))
    };
    loop {
        if dut == Dut::SenderOnly || opts.setup {
            break;
        }
        passes += 1;
        warmup_loss = warm_pass(pps)?;
        if warmup_loss <= 0.01 || passes >= 3 {
            break;
        }
        progress(&format!(
            "  warm-up pass {passes} at {pps} fps lost {:.1} %, again at half the rate",
            warmup_loss * 100.0
        ));
        pps /= 2;
    }
    if dut != Dut::SenderOnly && !opts.setup {
        let second = warm_pass(pps)?;
        if second > 0.01 {
            progress(&format!(
                "  warm-up second packets at {pps} fps lost {:.1} %",
                second * 100.0
            ));
        }
    }

    // Measurement at the sender's maximum.
    let sent = AtomicU64::new(0);
    let stop = AtomicBool::new(false);
    let m = std::thread::scope(|s| {
        let h = s.spawn(|| match opts.sender {
            Sender::Socket => {
                let pace = if opts.setup {
                    Pace::OnceFlat
                } else {
                    Pace::Flat
                };
                sender(&topo, sender_core, ports, pace, &stop, &sent)
            }
            Sender::Xdp => xdp_sender(&topo, sender_core, entries, opts.setup, &stop, &sent),
        });
        let r = (|| {
            // The pre-roll starts with the first frames (the XDP sender
            // fills its flow table first: a second at 1 M flows).
            let t0 = Instant::now();
            while sent.load(Ordering::Relaxed) == 0 && !h.is_finished() {
                if t0.elapsed() > Duration::from_secs(60) {
                    return Err(setup_err("sender", "sent nothing within 60 s"));
                }
                sleep(Duration::from_millis(5), interrupted)?;
            }
            sleep(Duration::from_millis(500), interrupted)?;
            if opts.setup && h.is_finished() {
                return Err(setup_err(
                    "--setup",
                    format!("the sender sent all {flows} flows within the 0.5 s pre-roll: use more --flows"),
                ));
            }
            let (rx0, tx0, t0) = (
                rx_packets(&topo.recv, HOST_IF)?,
                sent.load(Ordering::Relaxed),
                Instant::now(),
            );
            let c0 = cpu_times(dut_core);
            // With `setup` the window ends early when the sender has sent
            // every flow once (later frames would repeat flows).
            let end = t0 + opts.duration;
            loop {
                let now = Instant::now();
                if now >= end || (opts.setup && h.is_finished()) {
                    break;
                }
                sleep((end - now).min(Duration::from_millis(10)), interrupted)?;
            }
            let c1 = cpu_times(dut_core);
            let (rx1, tx1, t1) = (
                rx_packets(&topo.recv, HOST_IF)?,
                sent.load(Ordering::Relaxed),
                Instant::now(),
            );
            let busy = match (c0, c1) {
                (Some((b0, a0)), Some((b1, a1))) if a1 > a0 => {
                    (b1.saturating_sub(b0)) as f64 / (a1 - a0) as f64
                }
                _ => f64::NAN,
            };
            Ok((
                rx1.saturating_sub(rx0),
                tx1.saturating_sub(tx0),
                t1 - t0,
                busy,
            ))
        })();
        stop.store(true, Ordering::Relaxed);
        let joined = h
            .join()
            .unwrap_or_else(|_| Err(setup_err("sender", "panicked")));
        joined.and(r)
    });
    let (received, sent, dt, dut_core_busy) = m?;
    if opts.setup && dt + Duration::from_millis(20) < opts.duration {
        progress(&format!(
            "  the sender finished its pass over the flows after {:.2} s of the window",
            dt.as_secs_f64()
        ));
    }
    // Connections the DUT tracks now: with `setup`, one per flow that got
    // through, so at least the frames received.
    let connections = if !opts.setup {
        None
    } else if let Some(s) = &sluice {
        s.ctl(&["conntrack", "count"])
            .and_then(|v| v["count"].as_u64())
    } else if matches!(
        dut,
        Dut::KernelNftables | Dut::KernelFlowtable | Dut::KernelIptables
    ) {
        ns_exec(
            &topo.dut,
            &["sysctl", "-n", "net.netfilter.nf_conntrack_count"],
        )
        .ok()
        .and_then(|v| v.trim().parse().ok())
    } else {
        None
    };
    let secs = dt.as_secs_f64().max(1e-9);
    let saturation_fps = received as f64 / secs;
    let capacity_fps = if dut_core_busy > 0.0 {
        saturation_fps / dut_core_busy.min(1.0)
    } else {
        f64::NAN
    };
    // RFC 2544 §26.1: the highest rate without loss, by binary search.
    let mut trials = Vec::new();
    let mut fps = saturation_fps;
    if opts.zero_loss && dut != Dut::SenderOnly {
        let (mut lo, mut hi) = (0u64, saturation_fps as u64);
        let mut best = 0.0;
        let mut rate = hi;
        for step in 0..=SEARCH_STEPS {
            if rate == 0 {
                break;
            }
            let (s, r) = trial(&topo, sender_core, ports, rate, opts.duration, interrupted)?;
            trials.push((rate as f64, s, r));
            let pass = s > 0 && r >= s;
            progress(&format!(
                "  zero-loss trial {step}: {:.3} Mpps offered, {s} sent, {r} received: {}",
                rate as f64 / 1e6,
                if pass { "pass" } else { "loss" }
            ));
            if pass {
                lo = rate;
                best = s as f64 / opts.duration.as_secs_f64().max(1e-9);
                if step == 0 {
                    break;
                }
            } else {
                hi = rate;
            }
            rate = lo + (hi - lo) / 2;
        }
        fps = best;
    }
    let latency = if opts.latency && dut != Dut::SenderOnly {
        let l = latency(&mut topo, interrupted)?;
        progress(&format!(
            "  round trip through the DUT: median {:.0} us, p99 {:.0} us ({} of {} answered)",
            l.median_us, l.p99_us, l.received, l.sent
        ));
        Some(l)
    } else {
        None
    };
    if let Some(s) = &sluice {
        progress(&format!("  gateway counters: {}", s.counters_summary()));
    }
    drop(sluice);
    drop(topo);
    let loss = if sent == 0 {
        0.0
    } else {
        1.0 - (received as f64 / sent as f64).min(1.0)
    };
    Ok(ForwardResult {
        dut: dut.name().to_string(),
        flows,
        rules,
        fps,
        saturation_fps,
        trials,
        offered_fps: sent as f64 / secs,
        loss,
        saturated: loss >= 0.01,
        sent,
        received,
        seconds: secs,
        warmup_passes: passes,
        warmup_loss,
        method: if opts.setup {
            "setup-saturation"
        } else if opts.zero_loss && dut != Dut::SenderOnly {
            "rfc2544-zero-loss"
        } else {
            "saturation"
        },
        ip_version: if opts.ipv6 { 6 } else { 4 },
        frame_bytes: if opts.ipv6 { FRAME_LEN6 as u32 + 4 } else { 64 },
        dut_core,
        sender_core,
        dut_mode,
        sender: opts.sender.name(),
        receiver: opts.receiver.name(),
        dut_core_busy,
        capacity_fps,
        connections,
        latency,
    })
}

/// Jiffies of CPU `core` from /proc/stat: (busy, all), where busy is user,
/// nice, system, irq and softirq, and all adds idle, iowait and steal
/// (time the hypervisor gave to someone else is not the DUT's work).
fn cpu_times(core: usize) -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let name = format!("cpu{core}");
    let line = stat
        .lines()
        .find(|l| l.split_whitespace().next() == Some(name.as_str()))?;
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(|x| x.parse().unwrap_or(0))
        .collect();
    let at = |i: usize| v.get(i).copied().unwrap_or(0);
    // user nice system idle iowait irq softirq steal
    let busy = at(0) + at(1) + at(2) + at(5) + at(6);
    Some((busy, busy + at(3) + at(4) + at(7)))
}

/// The results as a table.
pub fn table(rows: &[ForwardResult]) -> String {
    let mut s = String::new();
    let mut senders: Vec<&str> = rows.iter().map(|r| r.sender).collect();
    senders.dedup();
    let mut receivers: Vec<&str> = rows.iter().map(|r| r.receiver).collect();
    receivers.dedup();
    if !senders.is_empty() {
        let how = match receivers.as_slice() {
            ["xdp-drop"] => " (an XDP program drops every frame on the receiver's veth)",
            ["stack"] => " (the receiver's GRO and IP layers drop every frame)",
            _ => "",
        };
        let _ = writeln!(
            s,
            "sender of the saturation measurement: {} (warm-up and zero-loss trials: socket); \
             receiver: {}{how}",
            senders.join(", "),
            receivers.join(", ")
        );
    }
    if rows.iter().any(|r| r.ip_version == 6) {
        let _ = writeln!(
            s,
            "traffic: IPv6 UDP, {} bytes on the wire, no NAT: every DUT runs the stateful forward \
             chain of --ipv6 (rules 0: ct state established,related accept, new UDP to the receiver \
             accepted; N: seed 001's N rules, the last one `ct state new,established accept`)",
            FRAME_LEN6 + 4
        );
    }
    let _ = writeln!(
        s,
        "{:<18} {:>9} {:>6} {:>10} {:>10} {:>10} {:>7} {:>9} {:>10} {:>7} {:>9}",
        "dut",
        "flows",
        "rules",
        "fwd Mpps",
        "drain Mpps",
        "offer Mpps",
        "loss %",
        "saturated",
        "warmup loss",
        "busy %",
        "cap Mpps"
    );
    for r in rows {
        let _ = writeln!(
            s,
            "{:<18} {:>9} {:>6} {:>10.3} {:>10.3} {:>10.3} {:>7.1} {:>9} {:>10.1}% {:>7.1} {:>9.3}",
            r.dut,
            r.flows,
            r.rules,
            r.fps / 1e6,
            r.saturation_fps / 1e6,
            r.offered_fps / 1e6,
            r.loss * 100.0,
            if r.saturated { "yes" } else { "NO" },
            r.warmup_loss * 100.0,
            r.dut_core_busy * 100.0,
            r.capacity_fps / 1e6
        );
    }
    let _ = writeln!(
        s,
        "rules: forward filter rules (0: the NAT rule only, or with IPv6 the stateful chain); \
         busy %: the DUT core's busy time during the measurement; cap Mpps: drain Mpps / busy, \
         frames per second of busy DUT-core time"
    );
    if rows.iter().any(|r| r.method == "rfc2544-zero-loss") {
        let _ = writeln!(
            s,
            "fwd Mpps: RFC 2544 zero-loss throughput; drain Mpps, offer Mpps, loss: the saturation run"
        );
    }
    if rows.iter().any(|r| r.latency.is_some()) {
        let _ = writeln!(
            s,
            "idle round trip through the DUT (ping, {PINGS} echo requests 5 ms apart after {PING_WARMUP} not counted), us:"
        );
        for r in rows {
            if let Some(l) = &r.latency {
                let _ = writeln!(
                    s,
                    "{:<18} {:>9} flows {:>6} rules: min {:>8.1} median {:>8.1} p99 {:>8.1} max {:>8.1} ({} of {} answered)",
                    r.dut, r.flows, r.rules, l.min_us, l.median_us, l.p99_us, l.max_us, l.received, l.sent
                );
            }
        }
    }
    if rows.iter().any(|r| r.method == "setup-saturation") {
        let _ = writeln!(
            s,
            "connection establishment (--setup): no warm-up, every flow sent once, so fwd Mpps is \
             new connections set up (and translated) per second at saturation"
        );
        for r in rows {
            if let Some(c) = r.connections {
                let _ = writeln!(
                    s,
                    "{} at {} flows{}: {c} connections tracked after the run, {} frames received in the window{}",
                    r.dut,
                    r.flows,
                    if r.rules > 0 { format!(", {} rules", r.rules) } else { String::new() },
                    r.received,
                    if c < r.received { " (fewer: flows repeated?)" } else { "" }
                );
            }
        }
    }
    let find = |d: Dut, f: u64, n: usize| {
        rows.iter()
            .find(|r| r.dut == d.name() && r.flows == f && r.rules == n)
    };
    let fps = |d: Dut, f: u64, n: usize| find(d, f, n).map(|r| r.fps);
    let cap = |d: Dut, f: u64, n: usize| {
        find(d, f, n)
            .map(|r| r.capacity_fps)
            .filter(|c| c.is_finite())
    };
    let mut flows: Vec<u64> = rows.iter().map(|r| r.flows).collect();
    flows.sort_unstable();
    flows.dedup();
    let mut counts: Vec<usize> = rows.iter().map(|r| r.rules).collect();
    counts.sort_unstable();
    counts.dedup();
    // Issue 4's targets concern established IPv4 flows through NAT, not
    // `--setup` or IPv6 runs.
    let targets = !rows
        .iter()
        .any(|r| r.method == "setup-saturation" || r.ip_version == 6);
    let sluice = [
        Dut::SluiceAfXdp,
        Dut::SluiceAfPacket,
        Dut::SluiceXdpOffload,
        Dut::KernelFlowtable,
    ];
    for &n in &counts {
        let at = if n == 0 {
            String::new()
        } else {
            format!(", {n} rules")
        };
        for &f in &flows {
            for kernel in [Dut::KernelNftables, Dut::KernelIptables] {
                let Some(k) = fps(kernel, f, n).filter(|&k| k > 0.0) else {
                    continue;
                };
                for d in sluice {
                    if let Some(v) = fps(d, f, n) {
                        let c = match (cap(d, f, n), cap(kernel, f, n)) {
                            (Some(a), Some(b)) if b > 0.0 => format!("{:.2}x", a / b),
                            _ => "-".into(),
                        };
                        let _ =
                            writeln!(
                            s,
                            "{} / {} at {f} flows{at}: {:.2}x drained, {c} per busy core second{}",
                            d.name(),
                            kernel.name(),
                            v / k,
                            if n == 0 && targets { " (target >= 2x)" } else { "" }
                        );
                    }
                }
            }
        }
        if let (Some(&lo), Some(&hi)) = (flows.first(), flows.last()) {
            if lo != hi {
                for d in Dut::ALL {
                    if let (Some(a), Some(b)) = (fps(d, lo, n), fps(d, hi, n)) {
                        if a > 0.0 {
                            let _ = writeln!(
                                s,
                                "{}{at}: {lo} -> {hi} flows: {:+.1} %{}",
                                d.name(),
                                (b / a - 1.0) * 100.0,
                                if n == 0 && targets {
                                    " (target >= -20 % for Sluice)"
                                } else {
                                    ""
                                }
                            );
                        }
                    }
                }
            }
        }
    }
    // Seed 001's question: what the rule count costs each DUT.
    if let (Some(&lo), Some(&hi)) = (counts.first(), counts.last()) {
        if lo != hi {
            for &f in &flows {
                for d in Dut::ALL.into_iter().chain([Dut::KernelFlowtable]) {
                    if let (Some(a), Some(b)) = (fps(d, f, lo), fps(d, f, hi)) {
                        if a > 0.0 {
                            let _ = writeln!(
                                s,
                                "{} at {f} flows: {lo} -> {hi} rules: {:+.1} % ({:.1}x fewer frames)",
                                d.name(),
                                (b / a - 1.0) * 100.0,
                                if b > 0.0 { a / b } else { f64::INFINITY }
                            );
                        }
                    }
                }
            }
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_times_reads_this_machines_cores() {
        let (busy, all) = cpu_times(0).expect("cpu0 in /proc/stat");
        assert!(all > 0 && busy <= all, "{busy} {all}");
        assert!(cpu_times(100_000).is_none());
    }

    /// The frame `build_udp4` / `build_udp6` makes for flow (`sp`, `dp`).
    fn built(ipv6: bool, sp: u16, dp: u16) -> Vec<u8> {
        let mut want = vec![0u8; FRAME_LEN6];
        let (s, d) = (
            sluice_wire::EthernetAddress(SENDER_MAC),
            sluice_wire::EthernetAddress(LAN_MAC),
        );
        let n = if ipv6 {
            let key = FlowKey6 {
                src: u128::from(ip6(SENDER_IP6)),
                dst: u128::from(ip6(RECV_IP6)),
                sport: sp,
                dport: dp,
                proto: proto::UDP,
            };
            sluice_wire::build::build_udp6(&mut want, s, d, &key, PAYLOAD).unwrap()
        } else {
            let key = FlowKey4 {
                src: u32::from_be_bytes(SENDER_IP),
                dst: u32::from_be_bytes(RECV_IP),
                sport: sp,
                dport: dp,
                proto: proto::UDP,
            };
            sluice_wire::build::build_udp4(&mut want, s, d, &key, PAYLOAD).unwrap()
        };
        want.truncate(n);
        want
    }

    #[test]
    fn patched_frame_matches_a_built_one() {
        for ipv6 in [false, true] {
            let tpl = Template::for_version(ipv6);
            assert_eq!(tpl.bytes().len(), if ipv6 { FRAME_LEN6 } else { FRAME_LEN });
            for (sp, dp) in [(1024u16, 1u16), (65535, 65535), (40000, 7), (1, 0xfffe)] {
                let mut f = tpl.bytes().to_vec();
                tpl.patch(&mut f, sp, dp);
                assert_eq!(f, built(ipv6, sp, dp), "IPv6 {ipv6}: ports {sp} {dp}");
            }
        }
        // The IPv6 frame carries the IPv4 frame's UDP datagram (ports,
        // length and payload; the checksum covers another pseudo-header).
        let (six, four) = (built(true, 5, 6), built(false, 5, 6));
        assert_eq!(six[54..60], four[34..40]);
        assert_eq!(six[62..], four[42..]);
        assert_eq!(FRAME_LEN6 + 4, 84);
    }

    #[test]
    fn xdp_flow_entries_patch_like_the_socket_sender() {
        assert_eq!(SPORT_OFF, sluice_io::xdpgen::PORTS_OFF);
        for ipv6 in [false, true] {
            let tpl = Template::for_version(ipv6);
            let ports_at = sluice_io::xdpgen::udp_offset(tpl.bytes());
            assert_eq!(ports_at, if ipv6 { 54 } else { 34 });
            let ports = flow_ports(1000, 7).unwrap();
            let entries = xdp_flow_entries(&ports, ipv6);
            assert_eq!(entries.len(), ports.len());
            for (&(sp, dp), e) in ports.iter().zip(&entries) {
                let mut want = tpl.bytes().to_vec();
                tpl.patch(&mut want, sp, dp);
                // What the XDP program does to its copy of the template.
                let mut got = tpl.bytes().to_vec();
                got[ports_at..ports_at + 4].copy_from_slice(&e[..4]);
                got[ports_at + 6..ports_at + 8].copy_from_slice(&e[4..6]);
                assert_eq!(got, want, "IPv6 {ipv6}: ports {sp} {dp}");
            }
        }
    }

    #[test]
    fn ipv6_rule_sets_are_stateful_and_parse() {
        let nft = nft_ruleset6("fl0", "fw0", 0, false, false);
        assert!(nft.contains("ct state established,related accept"), "{nft}");
        assert!(nft.contains(&format!(
            "ip6 daddr {RECV_IP6} meta l4proto udp ct state new accept"
        )));
        assert!(nft.contains("policy drop"));
        let ft = nft_ruleset6("fl0", "fw0", 0, true, false);
        assert!(ft.contains("flow add @ft") && ft.contains("devices = { \"fl0\", \"fw0\" }"));
        let ipt = ip6tables_ruleset(0, false);
        assert_eq!(
            ipt.lines().filter(|l| l.starts_with("-A FORWARD")).count(),
            rules6(0, false)
        );
        // Sluice reads both texts alike: new UDP to the receiver and
        // anything established pass, other new traffic is dropped, and
        // established packets are accepted up front (so the offload may
        // take them).
        use sluice_policy::{CompiledPolicy, Interfaces, TracePacket};
        let compile = |rs: sluice_ruleset::Ruleset| {
            let ifs = Interfaces::from_ruleset(&rs);
            CompiledPolicy::compile(&rs, &ifs).unwrap_or_else(|e| panic!("{e}"))
        };
        let a = compile(
            sluice_ruleset::parse_nft_str("b6.nft", &nft).unwrap_or_else(|d| panic!("{d}")),
        );
        let b = compile(
            sluice_ruleset::parse_ip6tables_restore_str("b6.rules", &ipt, None)
                .unwrap_or_else(|d| panic!("{d}")),
        );
        // Seed 001's shape: every packet walks the chain (nothing accepted
        // up front), the last rule decides, stateful.
        let n = 5;
        let nft5 = nft_ruleset6("fl0", "fw0", n, false, false);
        let ipt5 = ip6tables_ruleset(n, false);
        assert_eq!(
            ipt5.lines().filter(|l| l.starts_with("-A FORWARD")).count(),
            rules6(n, false)
        );
        let c = compile(
            sluice_ruleset::parse_nft_str("b6-5.nft", &nft5).unwrap_or_else(|d| panic!("{d}")),
        );
        let d = compile(
            sluice_ruleset::parse_ip6tables_restore_str("b6-5.rules", &ipt5, None)
                .unwrap_or_else(|d| panic!("{d}")),
        );
        for p in [&c, &d] {
            assert!(!p.established_accepted());
            for (spec, verdict) in [
                (format!("udp [{SENDER_IP6}]:1000 > [{RECV_IP6}]:53 iif fl0 oif fw0 ct new"), "Accept"),
                (format!("udp [{SENDER_IP6}]:1000 > [{RECV_IP6}]:53 iif fl0 oif fw0 ct established"), "Accept"),
                (format!("udp [{SENDER_IP6}]:1000 > [2001:db8:1::9]:53 iif fl0 oif fw0 ct established"), "Drop"),
            ] {
                let pkt = TracePacket::parse(&format!("{spec} hook forward"))
                    .unwrap_or_else(|e| panic!("{spec}: {e}"));
                let t = p.trace(&pkt);
                assert_eq!(format!("{:?}", t.verdict), verdict, "{spec}");
            }
        }
        assert_eq!(miss_rule6(0), (ip6(RECV_IP6), RULE_PORT_BASE));
        assert_eq!(miss_rule6(RULE_PORTS).0, ip6("2001:2::1"));
        for p in [&a, &b] {
            assert!(p.established_accepted());
            for (spec, verdict) in [
                (
                    format!("udp [{SENDER_IP6}]:1000 > [{RECV_IP6}]:53 iif fl0 oif fw0 ct new"),
                    "Accept",
                ),
                (
                    format!(
                        "udp [{RECV_IP6}]:53 > [{SENDER_IP6}]:1000 iif fw0 oif fl0 ct established"
                    ),
                    "Accept",
                ),
                (
                    format!("udp [{SENDER_IP6}]:1000 > [2001:db8:1::9]:53 iif fl0 oif fw0 ct new"),
                    "Drop",
                ),
                (
                    format!("tcp [{SENDER_IP6}]:1000 > [{RECV_IP6}]:80 iif fl0 oif fw0 ct new"),
                    "Drop",
                ),
            ] {
                let pkt = TracePacket::parse(&format!("{spec} hook forward"))
                    .unwrap_or_else(|e| panic!("{spec}: {e}"));
                let t = p.trace(&pkt);
                assert_eq!(format!("{:?}", t.verdict), verdict, "{spec}");
            }
        }
    }

    #[test]
    fn sender_names_round_trip() {
        for x in [Sender::Socket, Sender::Xdp] {
            assert_eq!(Sender::parse(x.name()), Some(x));
        }
        assert_eq!(Sender::parse("nope"), None);
    }

    #[test]
    fn flows_are_distinct() {
        let p = flow_ports(1000, 1).unwrap();
        let set: std::collections::HashSet<_> = p.iter().collect();
        assert_eq!(set.len(), 1000);
    }

    #[test]
    fn dut_names_round_trip() {
        for d in Dut::ALL {
            assert_eq!(Dut::parse(d.name()), Some(d));
        }
        assert_eq!(Dut::parse("nope"), None);
    }

    /// Sluice's verdict and deciding line for `spec` under both rule-set
    /// texts of `rules` rules (nft and iptables-restore), which must agree.
    /// Sluice's policies of the nft text (`b.nft`) and the iptables text
    /// (`b.rules`) of `rules` forward rules.
    fn compile_both(
        rules: usize,
        icmp: bool,
    ) -> (sluice_policy::CompiledPolicy, sluice_policy::CompiledPolicy) {
        use sluice_policy::{CompiledPolicy, Interfaces};
        let nft = nft_ruleset("lan0", "wan0", rules, false, icmp);
        let ipt = iptables_ruleset("wan0", rules, icmp);
        let compile = |rs: sluice_ruleset::Ruleset| {
            let ifs = Interfaces::from_ruleset(&rs);
            CompiledPolicy::compile(&rs, &ifs).unwrap_or_else(|e| panic!("{e}"))
        };
        let a =
            compile(sluice_ruleset::parse_nft_str("b.nft", &nft).unwrap_or_else(|d| panic!("{d}")));
        let b = compile(
            sluice_ruleset::parse_iptables_restore_str("b.rules", &ipt, None)
                .unwrap_or_else(|d| panic!("{d}")),
        );
        (a, b)
    }

    fn both_forms(rules: usize) -> impl Fn(&str) -> (String, Option<usize>) {
        use sluice_policy::TracePacket;
        let (a, b) = compile_both(rules, false);
        // Forward rules start on line 4 of the nft text (after the table,
        // chain and hook lines) and on line 5 of the iptables text.
        let idx = |rule: Option<String>, first: usize| {
            rule.map(|r| r.rsplit(':').next().unwrap().parse::<usize>().unwrap() - first)
        };
        move |spec: &str| {
            let pkt = TracePacket::parse(spec).unwrap_or_else(|e| panic!("{spec}: {e}"));
            let (x, y) = (a.trace(&pkt), b.trace(&pkt));
            assert_eq!(x.mismatch, None);
            assert_eq!(y.mismatch, None);
            assert_eq!(
                format!("{:?}", x.verdict),
                format!("{:?}", y.verdict),
                "{spec}"
            );
            let (i, j) = (idx(x.rule.clone(), 4), idx(y.rule.clone(), 5));
            assert_eq!(i, j, "{spec}");
            if format!("{:?}", x.verdict) == "Accept" {
                // The accepted traffic is masqueraded in both.
                let kind =
                    |t: &sluice_policy::Trace| t.nat.as_ref().map(|n| format!("{:?}", n.kind));
                assert_eq!(kind(&x), Some("Masquerade".into()), "{spec}");
                assert_eq!(kind(&y), kind(&x), "{spec}");
            }
            (format!("{:?}", x.verdict), i)
        }
    }

    #[test]
    fn forward_rules_let_only_the_last_one_match_the_traffic() {
        // One more rule than a block of ports, so that addresses of the
        // benchmarking range appear too.
        let n = RULE_PORTS + 3;
        let v = both_forms(n);
        // Every destination port of 1 M flows reaches the last rule.
        let r = PortRanges::for_connections(1_000_000, 50_000).unwrap();
        for dport in [r.dport_min, r.dport_min + r.dports as u16 - 1] {
            for sport in [1024, 51_023] {
                let spec = format!("udp 10.0.0.2:{sport} > 203.0.113.2:{dport} iif lan0 oif wan0");
                assert_eq!(v(&spec), ("Accept".into(), Some(n - 1)), "{spec}");
            }
        }
        // The other rules are what miss_rule says they are.
        for i in [0, 1, RULE_PORTS - 1, RULE_PORTS, RULE_PORTS + 1] {
            let (a, p) = miss_rule(i);
            let spec = format!("udp 10.0.0.2:1024 > {}:{p} iif lan0 oif wan0", ip_str(a));
            assert_eq!(v(&spec), ("Accept".into(), Some(i)), "{spec}");
        }
        assert_eq!(miss_rule(RULE_PORTS), ([198, 18, 0, 1], RULE_PORT_BASE));
        // Anything else meets the policy.
        let tcp = "tcp 10.0.0.2:1024 > 203.0.113.2:1 iif lan0 oif wan0";
        assert_eq!(v(tcp), ("Drop".into(), None));
        // No forward chain without rules: the NAT rule only.
        let v0 = both_forms(0);
        assert_eq!(v0(tcp).0, "Accept");
        assert!(check_rule_ports(1_000_000, 10_000).is_ok());
        assert!(check_rule_ports(50_000 * 40_000, 10).is_err());
        assert!(check_rule_ports(50_000 * 40_000, 0).is_ok());
    }

    #[test]
    fn ping_output_gives_round_trip_times_after_the_warm_up() {
        let mut out = String::from("PING 203.0.113.2 (203.0.113.2) 56(84) bytes of data.\n");
        for seq in 1..=PING_WARMUP + 4 {
            // Warm-up replies are slow (ARP); counted ones 0.1-0.4 ms.
            let ms = if seq <= PING_WARMUP {
                50.0
            } else {
                (seq - PING_WARMUP) as f64 / 10.0
            };
            out.push_str(&format!(
                "64 bytes from 203.0.113.2: icmp_seq={seq} ttl=63 time={ms:.3} ms\n"
            ));
        }
        out.push_str("--- 203.0.113.2 ping statistics ---\n");
        let l = latency_of(&out);
        assert_eq!((l.sent, l.received), (PINGS, 4));
        assert_eq!((l.min_us, l.max_us), (100.0, 400.0));
        assert_eq!(l.median_us, 200.0);
        assert_eq!(l.p99_us, 400.0);
        let none = latency_of("");
        assert_eq!(none.received, 0);
        assert!(none.median_us.is_nan());
    }

    #[test]
    fn echo_rules_follow_the_forward_rules() {
        use sluice_policy::TracePacket;
        let n = 50;
        let (a, b) = compile_both(n, true);
        for (spec, nft_line, ipt_line) in [
            (
                "icmp 10.0.0.2 > 203.0.113.2 type 8 code 0 iif lan0 oif wan0",
                4 + n,
                5 + n,
            ),
            (
                "icmp 203.0.113.2 > 10.0.0.2 type 0 code 0 iif wan0 oif lan0",
                5 + n,
                6 + n,
            ),
            (
                "udp 10.0.0.2:1024 > 203.0.113.2:1 iif lan0 oif wan0",
                3 + n,
                4 + n,
            ),
        ] {
            let pkt = TracePacket::parse(spec).unwrap_or_else(|e| panic!("{spec}: {e}"));
            let (x, y) = (a.trace(&pkt), b.trace(&pkt));
            assert_eq!(x.rule, Some(format!("b.nft:{nft_line}")), "{spec}");
            assert_eq!(y.rule, Some(format!("b.rules:{ipt_line}")), "{spec}");
        }
        assert_eq!(forward_rules(n, true), n + 2);
        assert_eq!(forward_rules(0, true), 0);
    }

    #[test]
    fn ruleset_is_one_masquerade_rule() {
        let r = nft_ruleset("lan0", "wan0", 0, false, false);
        assert!(r.contains("oifname \"wan0\" masquerade"));
        assert!(!r.contains("forward"), "{r}");
        sluice_ruleset::parse_nft_str("t.nft", &r).unwrap();
    }
}
