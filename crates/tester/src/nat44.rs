//! `sluice bench nat44`: RFC 9693 stateful NAT44 benchmarking of the
//! in-process engine.
//!
//! The DUT is a [`sluice_engine::Worker`] per core, fed batches in memory, so
//! the numbers are the engine's own cost with no NIC or kernel in the way.
//! The procedure follows RFC 9693 (and RFC 4814 for port selection):
//!
//! 1. **Preliminary phase** (RFC 9693 §4.1): the Initiator sends one frame per
//!    (source port, destination port) combination of the restricted ranges,
//!    each combination exactly once, in pseudorandom order. Every frame must
//!    be translated and create a connection. Frames per second of engine time
//!    is the *maximum connection establishment rate* (§4.2).
//! 2. The Responder learns the translated 4-tuples from what it receives.
//! 3. **Validation**: every learned tuple is sent back from the Responder and
//!    must arrive at the Initiator, translated back to the original tuple. A
//!    connection that the DUT evicted silently fails the run.
//! 4. **Real test phase** (§4.3): established traffic in pseudorandom order,
//!    unidirectional (Initiator to Responder) and bidirectional (alternating);
//!    the result is frames per second of engine time, with zero loss required
//!    (any loss fails validation).
//! 5. **Connection tear-down rate** (§4.5): N / the time to flush N
//!    connections.
//!
//! Bytes per connection are *measured*: growth of the process's resident set
//! between an empty engine and one holding N connections, divided by N.
//! The same run measures the machine's random-memory-access limit
//! ([`crate::memprobe`]) and reports the engine's ns per packet against it.

use core::net::Ipv4Addr;
use std::sync::{Arc, Barrier};
use std::time::Instant;

use sluice_engine::{
    Action, BucketPrefetch, EngineConfig, Interface, Route4, StaticPolicy, Worker,
};
use sluice_wire::flow::{proto, FlowKey4};
use sluice_wire::EthernetAddress;

use crate::batch::Batch;
use crate::memprobe;
use crate::perm::{Permutation, PortRanges};

/// Inside interface index of the benchmark topology.
pub const INSIDE: u16 = 0;
/// Outside interface index of the benchmark topology.
pub const OUTSIDE: u16 = 1;
const GW_IN_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x01];
const GW_OUT_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x02];
const INIT_MAC: [u8; 6] = [0x02, 0, 0, 0, 1, 0x02];
const RESP_MAC: [u8; 6] = [0x02, 0, 0, 0, 2, 0x02];
const GW_IN: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
const GW_OUT: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 1);
const RESPONDER: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 2);
/// The NAT pool address the Responder sees.
pub const POOL: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 1);
/// UDP payload that makes a 64-byte frame (60 bytes plus the 4-byte FCS).
const PAYLOAD_64B: usize = 18;

/// Options of one run.
#[derive(Clone, Debug)]
pub struct Nat44Options {
    /// Connections to create (N).
    pub connections: u64,
    /// Worker cores; each runs its own engine worker on N / cores connections.
    pub cores: usize,
    /// Seed of the pseudorandom orders and of the engine's hash keys.
    pub seed: u64,
    /// Frames per throughput measurement (default: max(N, 2 M)).
    pub throughput_frames: Option<u64>,
    /// Random reads for the memory-limit probe.
    pub probe_reads: u64,
    /// After the real test phase, this many rounds of unidirectional
    /// traffic with each bucket prefetch schedule of the engine in turn
    /// ([`PrefetchComparison`]); 0: none.
    pub prefetch_rounds: u32,
}

impl Default for Nat44Options {
    fn default() -> Self {
        Self {
            connections: 1_000_000,
            cores: 1,
            seed: 0x5eed,
            throughput_frames: None,
            probe_reads: 40_000_000,
            prefetch_rounds: 0,
        }
    }
}

/// Throughput of established traffic.
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct Throughput {
    /// Alternating Initiator and Responder frames.
    pub bidirectional: f64,
    /// Initiator to Responder frames only.
    pub unidirectional: f64,
}

/// One result row (one value of N). Rates are totals over `cores` workers.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Nat44Result {
    /// N.
    pub connections: u64,
    /// Worker cores used.
    pub cores: usize,
    /// Maximum connection establishment rate (connections per second).
    pub conn_setup_cps: f64,
    /// Established-traffic throughput (frames per second).
    pub throughput_fps: Throughput,
    /// Connection tear-down rate (connections per second).
    pub teardown_cps: f64,
    /// Resident memory per connection, measured.
    pub bytes_per_connection: f64,
    /// "pass" when every frame of every phase was translated correctly and
    /// every connection answered in validation; otherwise "fail".
    pub validation: &'static str,
    /// Frames that were lost or mistranslated over all phases, plus
    /// connections missing from the table after phase 1 or at tear-down.
    pub validation_failures: u64,
    /// Live connections the engine evicted early (to make room for a new
    /// one). Any is a failed run: RFC 9693 forbids losing a connection, and
    /// an evicted one can come back unnoticed (an answer through an
    /// endpoint-independent mapping recreates it).
    pub ct_early_drops: u64,
    /// ns per independent random cache-line read over `memory_probe_bytes`.
    pub memory_limit_ns: f64,
    /// ns per dependent random read (memory latency).
    pub memory_latency_ns: f64,
    /// ns per independent random read when each address is prefetched
    /// ahead ([`memprobe::PREFETCH_AHEAD`]), as a batched lookup can: the
    /// lower, stricter limit.
    pub memory_limit_prefetched_ns: f64,
    /// Size of the probed buffer.
    pub memory_probe_bytes: u64,
    /// Engine ns per established packet (unidirectional).
    pub engine_ns_per_packet: f64,
    /// `engine_ns_per_packet / memory_limit_ns`: the engine's cost in units
    /// of independent random cache-line reads.
    pub engine_cost_in_memory_reads: f64,
    /// `engine_ns_per_packet / memory_limit_prefetched_ns`.
    pub engine_cost_in_prefetched_reads: f64,
    /// Source ports x destination ports used per core (RFC 9693 §4.1).
    pub port_ranges: (u32, u32),
    /// The engine's two bucket prefetch schedules measured against each
    /// other on the same table (only with `prefetch_rounds`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prefetch_comparison: Option<PrefetchComparison>,
}

/// Unidirectional established-traffic throughput with each of the engine's
/// bucket prefetch schedules ([`sluice_engine::BucketPrefetch`]), measured
/// in one process on one table, alternating round by round (the order
/// within a round alternates too). On a noisy machine this is far steadier
/// than comparing separate runs, which also differ in where their memory
/// landed. Rates are totals over the cores (the sum of the cores'
/// medians).
#[derive(Clone, Debug, serde::Serialize)]
pub struct PrefetchComparison {
    /// Rounds measured.
    pub rounds: u32,
    /// Frames per round and schedule.
    pub frames_per_round: u64,
    /// The schedule the engine picks for this table size.
    pub default: &'static str,
    /// Median frames per second, one prefetch per frame.
    pub per_frame_fps: f64,
    /// Median frames per second, buckets prefetched in a loop of their own.
    pub batched_fps: f64,
    /// Every round's rate, per frame (core 0).
    pub per_frame_rounds: Vec<f64>,
    /// Every round's rate, batched (core 0).
    pub batched_rounds: Vec<f64>,
}

/// Errors of a run.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// N cannot be split into restricted port ranges.
    #[error("cannot split {0} connections into restricted port ranges; choose a number with a factor below {1}")]
    Ranges(u64, u32),
    /// The engine refused the configuration.
    #[error("engine: {0}")]
    Engine(String),
    /// Bad option.
    #[error("{0}")]
    Option(String),
}

/// The engine's bucket prefetch schedules, in the order of a
/// [`CoreOut::prefetch`] round.
const SCHEDULES: [BucketPrefetch; 2] = [BucketPrefetch::PerFrame, BucketPrefetch::Batched];

struct CoreOut {
    /// Per round, fps with each of [`SCHEDULES`], with `prefetch_rounds`.
    prefetch: Vec<[f64; 2]>,
    setup_s: f64,
    uni_s: f64,
    uni_frames: u64,
    bi_s: f64,
    bi_frames: u64,
    flushed: u64,
    flush_s: f64,
    failures: u64,
    early_drops: u64,
}

/// The engine configuration of the benchmark topology for worker `w`.
pub fn topology(w: u16, cores: u16, max_conns: u64, seed: u64) -> EngineConfig {
    let iface = |name: &str, mac, addr| Interface {
        name: name.into(),
        mac,
        addrs: vec![(addr, 24)],
        mtu: Interface::DEFAULT_MTU,
    };
    let connected = |addr: Ipv4Addr, oif| Route4 {
        net: u32::from(addr) & 0xffff_ff00,
        len: 24,
        oif,
        via: None,
    };
    let nat = sluice_nat::NatConfig {
        pools: vec![sluice_nat::Pool::new([POOL]).with_ports(1024..=65535)],
        workers: cores,
        ..sluice_nat::NatConfig::default()
    };
    EngineConfig {
        interfaces: vec![
            iface("inside", GW_IN_MAC, GW_IN),
            iface("outside", GW_OUT_MAC, GW_OUT),
        ],
        routes: vec![connected(GW_IN, INSIDE), connected(GW_OUT, OUTSIDE)],
        neighbors: (0..cores)
            .map(|c| (initiator(c), INIT_MAC))
            .chain(std::iter::once((RESPONDER, RESP_MAC)))
            .collect(),
        worker: w,
        workers: cores,
        ct_max: max_conns,
        ct_prefault: true,
        seed: seed ^ u64::from(w),
        timeouts: bench_timeouts(),
        nat,
        ..EngineConfig::default()
    }
}

/// Conntrack timeouts of the benchmark DUT: netfilter's defaults, except
/// that UDP connections live for a day. RFC 9693 requires that no connection
/// expires during a test (seed 000 raised `nf_conntrack_udp_timeout` on the
/// kernel for the same reason); phase 1 at 40 M connections alone takes
/// longer than the default 30 s.
pub fn bench_timeouts() -> sluice_conntrack::Timeouts {
    let day = std::time::Duration::from_secs(86_400);
    sluice_conntrack::Timeouts {
        udp: day,
        udp_stream: day,
        ..sluice_conntrack::Timeouts::default()
    }
}

/// The policy of the benchmark: accept, and SNAT everything leaving OUTSIDE
/// to pool 0 of [`topology`] ([`POOL`], ports 1024-65535,
/// endpoint-independent mapping).
pub fn policy() -> StaticPolicy {
    let mut p = StaticPolicy::accept_all();
    p.snat = vec![(
        OUTSIDE,
        sluice_nat::Translation::Snat {
            pool: sluice_nat::PoolId(0),
        },
    )];
    p
}

fn initiator(core: u16) -> Ipv4Addr {
    Ipv4Addr::new(10, 0, 0, 2u8.wrapping_add(core as u8))
}

/// Run the procedure for one N.
pub fn run(opts: &Nat44Options) -> Result<Nat44Result, BenchError> {
    let cores = opts.cores.max(1);
    if cores > 64 {
        return Err(BenchError::Option(format!("--cores {cores}: at most 64")));
    }
    let per_core = opts.connections / cores as u64;
    if per_core == 0 || per_core * cores as u64 != opts.connections {
        return Err(BenchError::Option(format!(
            "--connections {} is not a positive multiple of --cores {cores}",
            opts.connections
        )));
    }
    // Each worker owns 1/cores of the pool's 64512 ports; with
    // endpoint-independent mapping every source port needs one of them.
    let max_sports = (64_512 / cores as u32).min(50_000) - 16;
    let ranges = PortRanges::for_connections(per_core, max_sports)
        .ok_or(BenchError::Ranges(per_core, max_sports))?;
    let tput_frames = opts.throughput_frames.unwrap_or(per_core.max(2_000_000));

    // Tester-side memory is allocated and touched before the baseline so
    // that the RSS growth is the engine's alone.
    let mut learned: Vec<Vec<u16>> = (0..cores).map(|_| learned_ports(per_core)).collect();
    let mut batches: Vec<Batch> = (0..cores).map(|_| Batch::new()).collect();
    // Resident sizes are read with the allocator's freed memory returned to
    // the kernel first, so they count live memory only.
    sluice_io::alloc::release_freed_memory();
    let base_rss = sluice_io::mem::resident_bytes().unwrap_or(0);

    let pol: Arc<dyn sluice_engine::Policy> = Arc::new(policy());
    let mut workers = Vec::with_capacity(cores);
    for w in 0..cores {
        let cfg = topology(w as u16, cores as u16, per_core, opts.seed);
        workers.push(Worker::new(cfg, pol.clone()).map_err(|e| BenchError::Engine(e.to_string()))?);
    }
    let workers_default = workers
        .first()
        .map_or(BucketPrefetch::PerFrame, Worker::bucket_prefetch);

    let barrier = Barrier::new(cores + 1);
    let mut full_rss = 0u64;
    let outs: Vec<CoreOut> = std::thread::scope(|s| {
        let handles: Vec<_> = workers
            .iter_mut()
            .zip(learned.iter_mut())
            .zip(batches.iter_mut())
            .enumerate()
            .map(|(c, ((wk, learned), batch))| {
                let barrier = &barrier;
                s.spawn(move || {
                    run_core(
                        c as u16,
                        wk,
                        learned,
                        batch,
                        ranges,
                        tput_frames,
                        opts.prefetch_rounds,
                        opts.seed,
                        barrier,
                    )
                })
            })
            .collect();
        barrier.wait();
        sluice_io::alloc::release_freed_memory();
        full_rss = sluice_io::mem::resident_bytes().unwrap_or(0);
        barrier.wait();
        handles.into_iter().filter_map(|h| h.join().ok()).collect()
    });
    drop(workers);
    if outs.len() != cores {
        return Err(BenchError::Engine("a worker thread panicked".into()));
    }

    let engine_bytes = full_rss.saturating_sub(base_rss);
    let probe_bytes = engine_bytes.max(64 << 20);
    let mem = memprobe::probe(probe_bytes, opts.probe_reads, opts.seed);

    let sum = |f: &dyn Fn(&CoreOut) -> f64| outs.iter().map(f).sum::<f64>();
    let setup = sum(&|o| per_core as f64 / o.setup_s);
    let uni = sum(&|o| o.uni_frames as f64 / o.uni_s);
    let bi = sum(&|o| o.bi_frames as f64 / o.bi_s);
    let teardown = sum(&|o| o.flushed as f64 / o.flush_s.max(1e-9));
    let failures: u64 = outs.iter().map(|o| o.failures).sum();
    let early_drops: u64 = outs.iter().map(|o| o.early_drops).sum();
    let flushed: u64 = outs.iter().map(|o| o.flushed).sum();
    let engine_ns = 1e9 / (uni / cores as f64);
    Ok(Nat44Result {
        connections: opts.connections,
        cores,
        conn_setup_cps: setup,
        throughput_fps: Throughput {
            bidirectional: bi,
            unidirectional: uni,
        },
        teardown_cps: teardown,
        bytes_per_connection: engine_bytes as f64 / opts.connections as f64,
        validation: if failures == 0 && early_drops == 0 && flushed == opts.connections {
            "pass"
        } else {
            "fail"
        },
        validation_failures: failures + (opts.connections - flushed.min(opts.connections)),
        ct_early_drops: early_drops,
        memory_limit_ns: mem.independent_ns,
        memory_latency_ns: mem.dependent_ns,
        memory_limit_prefetched_ns: mem.prefetched_ns,
        memory_probe_bytes: mem.bytes,
        engine_ns_per_packet: engine_ns,
        engine_cost_in_memory_reads: engine_ns / mem.independent_ns,
        engine_cost_in_prefetched_reads: engine_ns / mem.prefetched_ns,
        port_ranges: (ranges.sports, ranges.dports),
        prefetch_comparison: (opts.prefetch_rounds > 0).then(|| {
            let default = match workers_default {
                BucketPrefetch::PerFrame => "per-frame",
                BucketPrefetch::Batched => "batched",
            };
            let med = |i: usize| {
                outs.iter()
                    .map(|o| median(o.prefetch.iter().map(|p| p[i])))
                    .sum::<f64>()
            };
            let rounds = |i: usize| -> Vec<f64> {
                outs.first()
                    .map(|o| o.prefetch.iter().map(|p| p[i]).collect())
                    .unwrap_or_default()
            };
            PrefetchComparison {
                rounds: opts.prefetch_rounds,
                frames_per_round: tput_frames,
                default,
                per_frame_fps: med(0),
                batched_fps: med(1),
                per_frame_rounds: rounds(0),
                batched_rounds: rounds(1),
            }
        }),
    })
}

/// The median of some rates (0 for none).
fn median(v: impl Iterator<Item = f64>) -> f64 {
    let mut v: Vec<f64> = v.collect();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// Key of the Initiator's frame for combination `c`.
fn init_key(core: u16, ranges: &PortRanges, c: u64) -> FlowKey4 {
    let (sp, dp) = ranges.pair(c);
    FlowKey4 {
        src: u32::from(initiator(core)),
        dst: u32::from(RESPONDER),
        sport: sp,
        dport: dp,
        proto: proto::UDP,
    }
}

fn build(buf: &mut [u8], src_mac: [u8; 6], dst_mac: [u8; 6], key: &FlowKey4) -> Option<usize> {
    sluice_wire::build::build_udp4(
        buf,
        EthernetAddress(src_mac),
        EthernetAddress(dst_mac),
        key,
        PAYLOAD_64B,
    )
    .ok()
}

fn key_of(frame: &[u8]) -> Option<FlowKey4> {
    sluice_wire::dissect(frame).ok()?.key4()
}

/// The Responder's learned ports for `n` connections, all unknown
/// (`u16::MAX`), on transparent huge pages where the kernel has them.
///
/// The tester reads this array at random, once per frame (building the
/// Responder's frames, checking the Initiator's). On 4 KiB pages, at 40 M
/// connections (80 MB) each of those reads takes a TLB entry of its own and
/// evicts one of the engine's, between two batches, so that the engine paid
/// for the tester's page walks in its timed section; at 1 M (2 MB) the
/// array's 512 pages stay in the TLB and the engine never saw it.
fn learned_ports(n: u64) -> Vec<u16> {
    // `vec![0; n]` is calloc: untouched pages, advised before first touch.
    let mut v = vec![0u16; n as usize];
    sluice_io::mem::advise_huge_pages(&mut v[..]);
    v.fill(u16::MAX);
    v
}

/// Feed `batch` to the worker; returns engine seconds.
#[inline]
fn timed(wk: &mut Worker, batch: &mut Batch, clock: &Instant) -> f64 {
    let now = clock.elapsed().as_nanos() as u64;
    let t = Instant::now();
    wk.process(now, batch);
    t.elapsed().as_secs_f64()
}

#[allow(clippy::too_many_arguments)]
fn run_core(
    core: u16,
    wk: &mut Worker,
    learned: &mut [u16],
    batch: &mut Batch,
    ranges: PortRanges,
    tput_frames: u64,
    prefetch_rounds: u32,
    seed: u64,
    barrier: &Barrier,
) -> CoreOut {
    let n = learned.len() as u64;
    let clock = Instant::now();
    let order = Permutation::new(n, seed ^ 0x1111 ^ u64::from(core));
    let mut failures = 0u64;

    // Phase 1: every combination once, in pseudorandom order.
    let mut setup_s = 0.0;
    let mut idx: Vec<u64> = Vec::with_capacity(sluice_engine::MAX_BATCH);
    let mut i = 0u64;
    while i < n {
        batch.clear();
        idx.clear();
        while !batch.is_full() && i < n {
            let c = order.at(i);
            let key = init_key(core, &ranges, c);
            if batch.push(INSIDE, |b| build(b, INIT_MAC, GW_IN_MAC, &key)) {
                idx.push(c);
            }
            i += 1;
        }
        setup_s += timed(wk, batch, &clock);
        for (j, &c) in idx.iter().enumerate() {
            let want = init_key(core, &ranges, c);
            match batch.get(j) {
                Some((f, Action::Forward(OUTSIDE))) => match key_of(f) {
                    Some(k)
                        if k.src == u32::from(POOL)
                            && k.dst == want.dst
                            && k.dport == want.dport
                            && k.proto == want.proto =>
                    {
                        if let Some(l) = learned.get_mut(c as usize) {
                            *l = k.sport;
                        }
                    }
                    _ => failures += 1,
                },
                _ => failures += 1,
            }
        }
    }
    // Every connection of phase 1 must be in the table: one evicted early
    // (and recreated later by its answer) would otherwise go unseen.
    failures += n.saturating_sub(wk.conntrack().len() as u64);
    // The allocator keeps what this thread freed (a NAT index's array
    // after its growth) in this thread's heap: returned here, so that the
    // resident size the main thread reads next counts live memory only.
    sluice_io::alloc::release_freed_memory();
    barrier.wait();
    barrier.wait();

    // Validation: every learned tuple must come back to the Initiator.
    let mut c = 0u64;
    while c < n {
        batch.clear();
        let first = c;
        while !batch.is_full() && c < n {
            let k = resp_key(&ranges, learned, c);
            batch.push(OUTSIDE, |b| build(b, RESP_MAC, GW_OUT_MAC, &k));
            c += 1;
        }
        timed(wk, batch, &clock);
        for j in 0..batch.len() {
            let want = init_key(core, &ranges, first + j as u64).reversed();
            if !matches!(batch.get(j), Some((f, Action::Forward(INSIDE))) if key_of(f) == Some(want))
            {
                failures += 1;
            }
        }
    }

    // Real test phase.
    let traffic = Permutation::new(n, seed ^ 0x2222 ^ u64::from(core));
    let mut measure = |wk: &mut Worker, bidirectional: bool| {
        established(
            wk,
            batch,
            &ranges,
            learned,
            core,
            &traffic,
            tput_frames,
            bidirectional,
            &clock,
        )
    };
    let (uni_s, uni_frames, f1) = measure(wk, false);
    let (bi_s, bi_frames, f2) = measure(wk, true);
    failures += f1 + f2;

    // The prefetch schedules against each other, on this table, in
    // alternating order.
    let default = wk.bucket_prefetch();
    let mut prefetch = Vec::with_capacity(prefetch_rounds as usize);
    for round in 0..prefetch_rounds {
        let mut fps = [0.0f64; 2];
        let order = if round % 2 == 0 { [0, 1] } else { [1, 0] };
        for i in order {
            wk.set_bucket_prefetch(SCHEDULES[i]);
            let (s, f, fail) = measure(wk, false);
            failures += fail;
            fps[i] = f as f64 / s;
        }
        prefetch.push(fps);
    }
    wk.set_bucket_prefetch(default);

    let early_drops = wk.conntrack().early_drops();
    // Tear-down.
    let t = Instant::now();
    let flushed = wk.flush();
    let flush_s = t.elapsed().as_secs_f64();
    CoreOut {
        prefetch,
        setup_s,
        uni_s,
        uni_frames,
        bi_s,
        bi_frames,
        flushed,
        flush_s,
        failures,
        early_drops,
    }
}

fn resp_key(ranges: &PortRanges, learned: &[u16], c: u64) -> FlowKey4 {
    let (_, dp) = ranges.pair(c);
    let ext = learned.get(c as usize).copied().unwrap_or(0);
    FlowKey4 {
        src: u32::from(RESPONDER),
        dst: u32::from(POOL),
        sport: dp,
        dport: ext,
        proto: proto::UDP,
    }
}

#[allow(clippy::too_many_arguments)]
fn established(
    wk: &mut Worker,
    batch: &mut Batch,
    ranges: &PortRanges,
    learned: &[u16],
    core: u16,
    order: &Permutation,
    frames: u64,
    bidirectional: bool,
    clock: &Instant,
) -> (f64, u64, u64) {
    let n = learned.len() as u64;
    let mut secs = 0.0;
    let mut failures = 0u64;
    let mut sent = 0u64;
    let mut conns: Vec<(u64, bool)> = Vec::with_capacity(sluice_engine::MAX_BATCH);
    while sent < frames {
        batch.clear();
        conns.clear();
        while !batch.is_full() && sent < frames {
            let from_responder = bidirectional && sent % 2 == 1;
            let c = order.at((if bidirectional { sent / 2 } else { sent }) % n);
            let ok = if from_responder {
                let k = resp_key(ranges, learned, c);
                batch.push(OUTSIDE, |b| build(b, RESP_MAC, GW_OUT_MAC, &k))
            } else {
                let k = init_key(core, ranges, c);
                batch.push(INSIDE, |b| build(b, INIT_MAC, GW_IN_MAC, &k))
            };
            if ok {
                conns.push((c, from_responder));
            }
            sent += 1;
        }
        secs += timed(wk, batch, clock);
        for (j, &(c, from_responder)) in conns.iter().enumerate() {
            let ok = match batch.get(j) {
                Some((f, Action::Forward(o))) => {
                    let k = key_of(f);
                    if from_responder {
                        o == INSIDE && k == Some(init_key(core, ranges, c).reversed())
                    } else {
                        o == OUTSIDE
                            && k.is_some_and(|k| {
                                k.src == u32::from(POOL)
                                    && Some(&k.sport) == learned.get(c as usize)
                            })
                    }
                }
                _ => false,
            };
            if !ok {
                failures += 1;
            }
        }
    }
    (secs, sent, failures)
}

/// The default sweep of `sluice bench nat44` (about 13 s on the 2-vCPU
/// development VM, 2026-11-23).
pub const DEFAULT_SWEEP: &[u64] = &[100_000, 1_000_000, 4_000_000];

/// One line on a [`PrefetchComparison`]: both medians with their rounds'
/// range, and the engine's default for the table size.
pub fn prefetch_line(connections: u64, c: &PrefetchComparison) -> String {
    let range = |v: &[f64]| {
        let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = v.iter().copied().fold(0.0, f64::max);
        format!("{:.2}-{:.2}", lo / 1e6, hi / 1e6)
    };
    format!(
        "bucket prefetch at {connections} connections ({} rounds of {} frames, default {}): \
         per-frame {:.2} M fps [{}], batched {:.2} M fps [{}] (medians, rounds' range of core 0)",
        c.rounds,
        c.frames_per_round,
        c.default,
        c.per_frame_fps / 1e6,
        range(&c.per_frame_rounds),
        c.batched_fps / 1e6,
        range(&c.batched_rounds),
    )
}

/// Render results as a table.
pub fn table(rows: &[Nat44Result]) -> String {
    let mut s = String::new();
    s.push_str(&format!(
        "{:>11} {:>5} {:>12} {:>12} {:>12} {:>12} {:>9} {:>8} {:>8} {:>8} {:>8} {:>8} {:>6}\n",
        "connections",
        "cores",
        "setup cps",
        "uni fps",
        "bidir fps",
        "teardown",
        "B/conn",
        "ns/pkt",
        "mem ns",
        "pkt/mem",
        "pf ns",
        "pkt/pf",
        "valid"
    ));
    for r in rows {
        s.push_str(&format!(
            "{:>11} {:>5} {:>12.0} {:>12.0} {:>12.0} {:>12.0} {:>9.1} {:>8.1} {:>8.2} {:>8.1} {:>8.2} {:>8.1} {:>6}\n",
            r.connections,
            r.cores,
            r.conn_setup_cps,
            r.throughput_fps.unidirectional,
            r.throughput_fps.bidirectional,
            r.teardown_cps,
            r.bytes_per_connection,
            r.engine_ns_per_packet,
            r.memory_limit_ns,
            r.engine_cost_in_memory_reads,
            r.memory_limit_prefetched_ns,
            r.engine_cost_in_prefetched_reads,
            r.validation
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_run_validates_every_connection() {
        let opts = Nat44Options {
            connections: 2_000,
            cores: 1,
            seed: 9,
            throughput_frames: Some(5_000),
            probe_reads: 10_000,
            prefetch_rounds: 0,
        };
        let r = run(&opts).unwrap();
        assert_eq!(r.validation_failures, 0, "{r:?}");
        assert_eq!(r.ct_early_drops, 0, "{r:?}");
        assert_eq!(r.validation, "pass");
        assert!(r.conn_setup_cps > 0.0 && r.teardown_cps > 0.0);
        assert!(r.prefetch_comparison.is_none());
    }

    #[test]
    fn prefetch_comparison_runs_both_schedules_on_validated_traffic() {
        let opts = Nat44Options {
            connections: 2_000,
            cores: 2,
            seed: 5,
            throughput_frames: Some(3_000),
            probe_reads: 10_000,
            prefetch_rounds: 3,
        };
        let r = run(&opts).unwrap();
        // Every frame of the extra rounds is checked like the real test
        // phase's.
        assert_eq!(r.validation, "pass", "{r:?}");
        let c = r.prefetch_comparison.clone().expect("requested");
        assert_eq!((c.rounds, c.frames_per_round), (3, 3_000));
        assert_eq!(c.default, "per-frame");
        assert_eq!(c.per_frame_rounds.len(), 3);
        assert_eq!(c.batched_rounds.len(), 3);
        assert!(c
            .per_frame_rounds
            .iter()
            .chain(&c.batched_rounds)
            .all(|&f| f > 0.0));
        assert!(c.per_frame_fps > 0.0 && c.batched_fps > 0.0);
        let line = prefetch_line(r.connections, &c);
        assert!(
            line.contains("per-frame") && line.contains("batched"),
            "{line}"
        );
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(json["prefetch_comparison"]["rounds"], 3);
    }

    #[test]
    fn median_of_rates() {
        assert_eq!(median([3.0, 1.0, 2.0].into_iter()), 2.0);
        assert_eq!(median([4.0, 1.0, 2.0, 3.0].into_iter()), 2.5);
        assert_eq!(median(core::iter::empty()), 0.0);
    }

    #[test]
    fn two_cores_split_the_connections_and_validate() {
        let opts = Nat44Options {
            connections: 4_000,
            cores: 2,
            seed: 3,
            throughput_frames: Some(4_000),
            probe_reads: 10_000,
            prefetch_rounds: 0,
        };
        let r = run(&opts).unwrap();
        assert_eq!(r.validation, "pass", "{r:?}");
    }
}
