//! `sluice-daemon`: the running gateway behind `sluice run`, `sluice check`
//! and `sluice ctl`.
//!
//! # What it owns
//!
//! - [`config`]: the TOML file, validated with `FILE:LINE:COLUMN` errors.
//! - [`run`]: opens every configured interface on the chosen io backend,
//!   keeps the kernel stack off them (nft netdev ingress drop), starts one
//!   run-to-completion worker thread per configured worker
//!   ([`dataplane`]), serves the control socket ([`ctl`]) and handles
//!   signals: SIGTERM/SIGINT stop cleanly (ports closed, XDP detached, the
//!   ingress drop and the socket removed), SIGHUP reloads the configuration
//!   and ruleset.
//! - [`neigh`]: ARP next-hop resolution with held packets.
//! - [`neigh6`]: the same for IPv6 with NDP, plus neighbour aging.
//!
//! # Invariants
//!
//! - Workers own their engine state; the control plane reaches it only
//!   through a bounded command channel per worker, polled between batches,
//!   so the packet path takes no lock.
//! - Policies are published through a [`dataplane::PolicyCell`] (one atomic
//!   swap; workers pick the new generation up between batches). `sluice ctl
//!   nft …` applies one rule or set-element change incrementally
//!   ([`sluice_policy::CompiledPolicy::apply`]); replaced generations are
//!   freed on the control thread, never on a worker.
//! - A reload builds the new policy completely before any worker sees it;
//!   on any error the running policy stays. Connections survive a reload
//!   (the connection table is kept).
//! - Engine interface 0 is a placeholder with no port, so that configured
//!   interface `i` is engine interface `i + 1`: the compiled policy treats
//!   interface index 0 as "no interface".
//!
//! # Limits (today)
//!
//! - With several workers each interface is split between them by a
//!   program that picks the worker from the frame ([`sluice_io::steer`]):
//!   on AF_PACKET the classic-BPF program of a fanout group, on AF_XDP an
//!   XDP program in front of one socket per worker on every receive queue
//!   (the workers share one UMEM). Outside interfaces steer by destination
//!   port (a NAT reply reaches the worker that owns its external port,
//!   `sluice_nat::owner_of`), inside interfaces by source port, ICMP
//!   queries by identifier, ICMP errors by the quoted flow, IPv6 by its
//!   two addresses (ICMPv6 errors by the quoted ones), ARP and NDP to
//!   worker 0, which shares learnt neighbours ([`steer_for`]). Every
//!   interface then needs a `role` (a config error otherwise). What this
//!   cannot steer, hairpinning and DNAT that rewrites the destination
//!   port, the engine hands to the owning worker
//!   ([`sluice_engine::Action::Handoff`]; [`dataplane::Handoff`] carries
//!   the frames); flows between two interfaces of the same role are named
//!   at `warn` at start.
//! - Changes to interface names or roles, workers, backend or NAT
//!   behaviour (mapping, filtering, port blocks, log) need a restart; a
//!   reload applies the ruleset (its NAT pools too, see
//!   `sluice_nat::WorkerNat::set_pools`), NAT switches and limits, static
//!   routes and neighbours, conntrack timeouts and interface addresses,
//!   MAC and MTU, and reports the rest.
//! - NAT44 only: IPv6 is forwarded and filtered, never translated (no
//!   NAT66). An IPv4 packet larger than the egress `mtu` is fragmented on
//!   output without DF and answered with ICMP fragmentation needed with
//!   it (a later fragment with DF, which may not be split and gets no
//!   error, counts as `fragmentation-unsupported`); an IPv6 one gets
//!   packet too big.
//! - A connection is translated by DNAT (or a NAT mapping) or by SNAT, not
//!   both: a postrouting `snat`/`masquerade` does not apply to a DNAT'd
//!   connection. Hairpinning to a NAT mapping maps both ends itself (see
//!   the engine's slow path); hairpinning to a DNAT port forward on a
//!   shared LAN (the kernel's DNAT + masquerade recipe) does not work yet.
#![forbid(unsafe_code)]

pub mod config;
pub mod ctl;
pub mod dataplane;
pub mod ipfix;
pub mod metrics;
pub mod natlog;
pub mod neigh;
pub mod neigh6;
pub mod state;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, SyncSender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use sluice_engine::{EngineConfig, Interface, Policy, Route4, Route6, StaticPolicy, Worker};
use sluice_io::{BackendKind, Batch, Port, PortStats};
use sluice_nat::Translation;

pub use config::{Config, ConfigError, Summary};
use ctl::{CtFilter, CtlFailure, Request};
use dataplane::{Command, WorkerStatus, WorkerThread};

/// Options of [`run`] that do not come from the file.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// Override the file's backend.
    pub backend: Option<config::BackendChoice>,
    /// Override the file's capture path.
    pub capture: Option<PathBuf>,
    /// Override the file's control socket path.
    pub control_socket: Option<PathBuf>,
    /// Do not pin workers to cores.
    pub no_pin: bool,
    /// Stop when this is set (for embedding in tests); signals still work.
    pub stop: Option<Arc<AtomicBool>>,
}

/// Why the gateway could not start (or stopped with an error).
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The configuration or ruleset is invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// An interface could not be opened or read.
    #[error("interface {name}: {reason}")]
    Interface {
        /// Interface name.
        name: String,
        /// What failed.
        reason: String,
    },
    /// The engine refused its configuration.
    #[error("engine")]
    Engine(#[from] sluice_engine::EngineError),
    /// The nft ingress drop could not be installed.
    #[error("nft ingress drop: {0}")]
    IngressDrop(sluice_io::IoError),
    /// The control socket could not be created.
    #[error("control socket {path}: {reason}")]
    Socket {
        /// Socket path.
        path: String,
        /// What failed.
        reason: String,
    },
    /// Signal handlers or threads could not be set up.
    #[error("{0}")]
    Os(String),
}

/// A policy ready to publish.
pub struct LoadedPolicy {
    /// The policy.
    pub policy: Arc<dyn Policy>,
    /// Rules it holds (0 for the built-in policy).
    pub rules: usize,
    /// SNAT pools it needs in the NAT configuration.
    pub pools: Vec<sluice_nat::Pool>,
    /// Where it came from.
    pub source: String,
    /// The compiled rule set, when there is one (incremental updates
    /// derive the next generation from it).
    pub compiled: Option<Arc<sluice_policy::CompiledPolicy>>,
}

/// The interface map the policy is compiled against: configured interface
/// `i` is index `i + 1`.
fn policy_interfaces(cfg: &Config) -> sluice_policy::Interfaces {
    let mut m = sluice_policy::Interfaces::new();
    for (i, ifc) in cfg.interfaces.iter().enumerate() {
        m.insert(&ifc.name, (i + 1) as u32);
    }
    m
}

/// Build the policy for `cfg`, from `ruleset` if given, else from the
/// config's ruleset file, else the built-in accept-all (+ masquerade) policy.
pub fn load_policy(cfg: &Config, ruleset: Option<&Path>) -> Result<LoadedPolicy, ConfigError> {
    match ruleset.or(cfg.ruleset.as_deref()) {
        Some(path) => {
            // nft syntax, or an iptables-save / ip6tables-save file (with
            // its sibling `.ipset` file), as `sluice check` reads them.
            let (rs, _) = sluice_ruleset::parse_ruleset_file(path, None, None)
                .map_err(|d| ConfigError::Ruleset(d.to_string().trim_end().to_string()))?;
            let p = sluice_policy::CompiledPolicy::compile_owned(rs, &policy_interfaces(cfg))
                .map_err(|e| ConfigError::Ruleset(e.to_string().trim_end().to_string()))?;
            let rules = p.rule_count();
            let pools = p.nat_config().pools.clone();
            nat_fits(cfg, &pools)?;
            masquerade_ports_fit(cfg, &p).map_err(ConfigError::Ruleset)?;
            let p = Arc::new(p);
            Ok(LoadedPolicy {
                policy: Arc::clone(&p) as Arc<dyn Policy>,
                rules,
                pools,
                source: path.display().to_string(),
                compiled: Some(p),
            })
        }
        None => {
            let mut p = StaticPolicy::accept_all();
            p.snat = cfg
                .masquerade
                .iter()
                .map(|&i| ((i + 1) as u16, Translation::Masquerade))
                .collect();
            Ok(LoadedPolicy {
                policy: Arc::new(p),
                rules: 0,
                pools: Vec::new(),
                source: "built-in (accept all)".into(),
                compiled: None,
            })
        }
    }
}

/// The `[nat]` settings against the rule set's pools (what every worker's
/// NAT checks at start), as a located configuration error.
/// Whether the gateway's `[nat] masquerade_ports` lie within the port
/// range of every `masquerade to :LO-HI` rule of `p` (its masquerade takes
/// ports from them, so any port it takes is one the rule allows); else
/// why not.
fn masquerade_ports_fit(cfg: &Config, p: &sluice_policy::CompiledPolicy) -> Result<(), String> {
    let have = &cfg.nat.masquerade_ports;
    for (lo, hi) in p.masquerade_port_ranges() {
        if *have.start() < lo || *have.end() > hi {
            return Err(format!(
                "'masquerade to :{lo}-{hi}': Sluice's masquerade takes its ports from \
                 [nat] masquerade_ports ({}-{}), which must lie within {lo}-{hi}; set \
                 masquerade_ports = \"{lo}-{hi}\"",
                have.start(),
                have.end()
            ));
        }
    }
    Ok(())
}

fn nat_fits(cfg: &Config, pools: &[sluice_nat::Pool]) -> Result<(), ConfigError> {
    let nat = worker_nat(cfg, pools);
    nat.validate().map_err(|e| {
        let message = match e {
            sluice_nat::ConfigError::PortBlockTooLarge { pool, share } => format!(
                "nat.port_block_size = {} is larger than a worker's share of the port range of \
                 the NAT pool with {} ({share} ports with {} worker(s))",
                nat.port_block_size,
                pools
                    .get(usize::from(pool))
                    .and_then(|p| p.addrs.first())
                    .map_or_else(|| format!("index {pool}"), ToString::to_string),
                nat.workers
            ),
            sluice_nat::ConfigError::DeterministicTooSmall {
                pool,
                capacity,
                needed,
            } => format!(
                "nat.deterministic: the NAT pool with {} has {capacity} port blocks of {} ports \
                 per worker, fewer than the prefix's {needed} subscribers (add addresses to the \
                 pool, or make the blocks smaller)",
                pools
                    .get(usize::from(pool))
                    .and_then(|p| p.addrs.first())
                    .map_or_else(|| format!("index {pool}"), ToString::to_string),
                nat.port_block_size
            ),
            e => e.to_string(),
        };
        ConfigError::Nat {
            file: cfg.path.display().to_string(),
            message,
        }
    })
}

/// The NAT configuration a gateway file gives its workers: its `[nat]`
/// settings with its rule set's pools (`sluice nat lookup`).
pub fn nat_config(path: &Path) -> Result<sluice_nat::NatConfig, ConfigError> {
    let cfg = config::load(path)?;
    let lp = load_policy(&cfg, None)?;
    Ok(worker_nat(&cfg, &lp.pools))
}

/// `sluice check -c FILE`: validate the configuration and compile its
/// ruleset, touching nothing.
pub fn check(path: &Path) -> Result<Summary, ConfigError> {
    let cfg = config::load(path)?;
    let lp = load_policy(&cfg, None)?;
    Ok(Summary {
        interfaces: cfg.interfaces.len(),
        routes: cfg.routes.len() + cfg.routes6.len(),
        neighbors: cfg.neighbors.len() + cfg.neighbors6.len(),
        workers: cfg.workers,
        backend: cfg.backend,
        af_packet_rx: cfg.af_packet_rx,
        xdp_offload: cfg.xdp_offload,
        worker_priority: cfg.worker_priority,
        heap_reserve_mib: cfg.heap_reserve_mib,
        ruleset: cfg.ruleset.as_ref().map(|p| p.display().to_string()),
        rules: lp.rules,
        nat_pools: lp.pools.len(),
        extras: summary_extras(&cfg),
    })
}

/// What `sluice check` adds to its summary line: the NAT and monitoring
/// features the file turns on, and the memory the connection tables take
/// at start.
fn summary_extras(cfg: &Config) -> Vec<String> {
    let mut v = Vec::new();
    let n = &cfg.nat;
    if n.port_block_size > 0 {
        let mut b = format!("port blocks of {}", n.port_block_size);
        if n.max_blocks_per_subscriber > 0 {
            b.push_str(&format!(
                ", at most {} per subscriber",
                n.max_blocks_per_subscriber
            ));
        }
        v.push(b);
    }
    if let Some((base, len)) = n.deterministic {
        v.push(format!("deterministic NAT for {base}/{len}"));
    }
    if let Some(l) = &cfg.nat_log {
        v.push(format!("NAT log to {}", l.dest));
    }
    if let Some(a) = cfg.metrics_listen {
        v.push(format!("metrics on {a}"));
    }
    v.push(format!(
        "connection tables {} MiB at start",
        conntrack_start_bytes(cfg).div_ceil(1 << 20)
    ));
    if cfg.ct_capacity > cfg.ct_max || cfg.ct6_capacity > cfg.ct6_max {
        v.push(format!(
            "conntrack capacity {} / {} IPv6 (a reload may raise max up to it)",
            cfg.ct_capacity, cfg.ct6_capacity
        ));
    }
    if cfg.xdp_offload {
        v.push(format!(
            "XDP offload tables {} MiB at start",
            offload_start_bytes(cfg).div_ceil(1 << 20)
        ));
    }
    if let Some(p) = &cfg.state_file {
        v.push(match state::peek(p) {
            Ok(None) => format!(
                "connections kept over restarts in {} (none saved now)",
                p.display()
            ),
            Ok(Some((w, n, at))) if w == cfg.workers => format!(
                "{n} connections saved in {} {} s ago, for the next start",
                p.display(),
                wall_ms().saturating_sub(at) / 1000
            ),
            Ok(Some((w, n, at))) => format!(
                "{n} connections saved in {} {} s ago by {w} workers, for the next start \
                 (placed by the steering of {}: a translated one whose internal and \
                 external ports it puts on different workers is not restored)",
                p.display(),
                wall_ms().saturating_sub(at) / 1000,
                cfg.workers
            ),
            Err(e) => format!(
                "state file {}: {e} (set aside at the next start)",
                p.display()
            ),
        });
    }
    v
}

/// A listener for `metrics_listen` (`None`: none), or why it cannot be had
/// (a start or reload error).
fn bind_metrics(
    a: Option<std::net::SocketAddr>,
) -> Result<Option<std::net::TcpListener>, CtlFailure> {
    a.map(|a| {
        std::net::TcpListener::bind(a).map_err(|e| CtlFailure {
            kind: "config",
            message: format!("metrics_listen: cannot listen on {a}: {e}"),
        })
    })
    .transpose()
}

/// Directions the XDP offload's IPv4 and IPv6 tables are sized for: two
/// per connection of `conntrack.capacity` and `capacity_v6` (the
/// maximums, unless set larger).
fn offload_directions(cfg: &Config) -> (u32, u32) {
    let d = |max: u64| u32::try_from(max.saturating_mul(2)).unwrap_or(u32::MAX);
    (d(cfg.ct_capacity), d(cfg.ct6_capacity))
}

/// Bytes the XDP offload's tables take from start (`xdp_offload`; 0 when
/// off).
fn offload_start_bytes(cfg: &Config) -> u64 {
    if !cfg.xdp_offload {
        return 0;
    }
    let (v4, v6) = offload_directions(cfg);
    sluice_io::XdpOffload::bytes_for(v4, v6)
}

/// `heap_reserve_mib`: back that much of the heap with memory now and keep
/// freed heap memory resident (`sluice_io::alloc::reserve_heap`). Refused
/// when the kernel says less memory is available.
fn reserve_heap(mib: u32) -> Result<(), RunError> {
    if mib == 0 {
        return Ok(());
    }
    if let Some(refusal) = reserve_refusal(mib, sluice_io::alloc::available_memory()) {
        return Err(RunError::Os(refusal));
    }
    let r = sluice_io::alloc::reserve_heap((u64::from(mib) << 20) as usize);
    if r.kept {
        tracing::info!(
            mib,
            ms = r.elapsed.as_secs_f64() * 1e3,
            "heap reserved: freed heap memory now stays resident"
        );
    } else {
        tracing::warn!(
            mib,
            "heap_reserve_mib has no effect: this process does not allocate with \
             mimalloc (only the sluice binary does)"
        );
    }
    Ok(())
}

/// One worker's connection-table settings: the gateway's `[conntrack]`
/// split between the workers, the index always backed at start (a lazily
/// backed index makes the first connections after start each fault a
/// fresh page; `sluice_conntrack::Config::prefault_index`).
fn conntrack_engine_config(cfg: &Config) -> EngineConfig {
    let w = u64::from(cfg.workers.max(1));
    EngineConfig {
        ct_max: cfg.ct_max.div_ceil(w),
        ct_capacity: cfg.ct_capacity.div_ceil(w),
        ct6_max: cfg.ct6_max.div_ceil(w),
        ct6_capacity: cfg.ct6_capacity.div_ceil(w),
        ct_prefault: cfg.ct_prefault,
        ct_prefault_index: true,
        timeouts: cfg.timeouts,
        ..EngineConfig::default()
    }
}

/// Bytes the workers back at start for their connection tables (indexes,
/// and with `conntrack.prefault` the IPv4 entries).
fn conntrack_start_bytes(cfg: &Config) -> u64 {
    conntrack_engine_config(cfg).ct_backed_at_start() * u64::from(cfg.workers.max(1))
}

/// Why connection tables needing `need` bytes at start are refused with
/// `avail` bytes available (`MemAvailable`; unknown: not refused): backing
/// more than the machine has would get the daemon (or another process)
/// killed by the kernel's OOM killer during start-up.
fn conntrack_refusal(cfg: &Config, need: u64, avail: Option<u64>) -> Option<String> {
    let avail = avail?;
    (need > avail).then(|| {
        let count = |max: u64, cap: u64| {
            if cap > max {
                format!("{max} (capacity {cap})")
            } else {
                max.to_string()
            }
        };
        let roomy = cfg.ct_capacity > cfg.ct_max || cfg.ct6_capacity > cfg.ct6_max;
        format!(
            "conntrack.max = {}, conntrack.max_v6 = {}: the connection tables need {} MiB of \
             memory at start ({}{}), but only {} MiB is available (MemAvailable in \
             /proc/meminfo); lower conntrack.{}{}",
            count(cfg.ct_max, cfg.ct_capacity),
            count(cfg.ct6_max, cfg.ct6_capacity),
            need.div_ceil(1 << 20),
            if cfg.ct_prefault {
                "prefault = true backs the entries too"
            } else {
                "their indexes, about 33 bytes per connection"
            },
            if cfg.xdp_offload {
                ", and xdp_offload's tables 256-512 bytes per IPv4 connection, 512-1024 per IPv6 one"
            } else {
                ""
            },
            avail >> 20,
            if roomy { "capacity" } else { "max" },
            if cfg.ct_prefault {
                " or set prefault = false"
            } else {
                ""
            }
        )
    })
}

/// Why a reserve of `mib` MiB is refused with `avail` bytes available
/// (`MemAvailable`; unknown: not refused).
fn reserve_refusal(mib: u32, avail: Option<u64>) -> Option<String> {
    let avail = avail?;
    (u64::from(mib) << 20 > avail).then(|| {
        format!(
            "heap_reserve_mib = {mib}: only {} MiB of memory is available \
             (MemAvailable in /proc/meminfo); lower it or remove it",
            avail >> 20
        )
    })
}

/// Read an interface's MAC with `ip -o link show dev IF` (works in the
/// calling thread's network namespace, unlike `/sys/class/net`).
pub fn interface_mac(name: &str) -> Result<[u8; 6], String> {
    interface_link(name).map(|(mac, _)| mac)
}

/// Read an interface's MAC and MTU with `ip -o link show dev IF`.
pub fn interface_link(name: &str) -> Result<([u8; 6], u16), String> {
    let out = std::process::Command::new("ip")
        .args(["-o", "link", "show", "dev", name])
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| format!("cannot run ip: {e}"))?;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).trim().to_string());
    }
    parse_ip_link(&String::from_utf8_lossy(&out.stdout))
}

/// The MAC and MTU in one line of `ip -o link show` output.
fn parse_ip_link(text: &str) -> Result<([u8; 6], u16), String> {
    let mut words = text.split_whitespace();
    let mut mtu = None;
    while let Some(w) = words.next() {
        match w {
            "mtu" => mtu = words.next().and_then(|m| m.parse::<u16>().ok()),
            "link/ether" => {
                let mac = words
                    .next()
                    .and_then(config::mac_from_str)
                    .ok_or_else(|| "unparsable link/ether address".to_string())?;
                return Ok((mac, mtu.unwrap_or(Interface::DEFAULT_MTU)));
            }
            _ => {}
        }
    }
    Err("not an Ethernet interface".into())
}

/// How the gateway opens its ports, kept to open them again when an
/// interface comes back ([`reattach`]).
struct PortPlan {
    interfaces: Vec<config::InterfaceConfig>,
    backend: Option<sluice_io::Backend>,
    workers: u16,
    af_packet_rx: config::AfPacketRx,
    fanout_base: u16,
    offload: Option<Arc<sluice_io::XdpOffload>>,
    capture: Option<PathBuf>,
}

impl PortPlan {
    /// Each worker's UMEM: with several workers every worker binds the same
    /// queue of each interface, so they share one (the kernel wants one
    /// buffer pool per queue); with one worker it has a UMEM of its own.
    /// `None` for AF_PACKET and in-memory ports.
    fn umems(&self) -> Vec<Option<sluice_io::Umem>> {
        let n = usize::from(self.workers);
        match self.backend {
            None | Some(sluice_io::Backend::AfPacket) => vec![None; n],
            Some(_) if self.workers > 1 => {
                let u = sluice_io::Umem::new(
                    sluice_io::afxdp::DEFAULT_UMEM_CHUNKS.saturating_mul(u32::from(self.workers)),
                )
                .ok();
                vec![u; n]
            }
            Some(_) => (0..n)
                .map(|_| sluice_io::Umem::new(sluice_io::afxdp::DEFAULT_UMEM_CHUNKS).ok())
                .collect(),
        }
    }

    /// Worker `id`'s port on interface `k`. `again`: a port opened once
    /// already (its capture files are appended to, not replaced).
    fn open(
        &self,
        id: u16,
        k: usize,
        umem: Option<sluice_io::Umem>,
        mem_peers: &mut Vec<sluice_io::memport::MemPeer>,
        again: bool,
    ) -> Result<Box<dyn Port>, RunError> {
        let Some(ifc) = self.interfaces.get(k) else {
            return Err(RunError::Os(format!("no interface {k}")));
        };
        let mut o = sluice_io::OpenOptions {
            port_id: (k + 1) as u16,
            ..Default::default()
        };
        o.af_packet.rx_ring = self.af_packet_rx.ring();
        if self.workers > 1 {
            o.af_packet.fanout_group = Some(self.fanout_base.wrapping_add(k as u16));
            o.af_packet.steer = Some(steer_for(ifc.role, self.workers));
            o.af_xdp.steer = Some(sluice_io::XdpSteer {
                steer: steer_for(ifc.role, self.workers),
                worker: id,
            });
        }
        o.af_xdp.umem = umem;
        o.af_xdp.offload = self.offload.clone();
        let port: Box<dyn Port> = match self.backend {
            None => {
                let (port, peer) = sluice_io::memport::MemPort::new(&ifc.name, o.port_id);
                mem_peers.push(peer);
                Box::new(port)
            }
            Some(b) => {
                let mut r = sluice_io::open(&ifc.name, b, &o);
                // The kernel lets go of a closed AF_XDP socket's queue a
                // little after the close (the socket is released once the
                // XSKMAP and program that named it are freed, after an RCU
                // grace period): a queue closed just now may still be busy.
                let mut waited = Duration::ZERO;
                while again && waited < REOPEN_BUSY_WAIT && matches!(&r, Err(e) if e.is_busy()) {
                    std::thread::sleep(REOPEN_BUSY_STEP);
                    waited += REOPEN_BUSY_STEP;
                    r = sluice_io::open(&ifc.name, b, &o);
                }
                r.map_err(|e| RunError::Interface {
                    name: ifc.name.clone(),
                    reason: e.to_string(),
                })?
            }
        };
        tracing::info!(worker = id, interface = %ifc.name, mode = %port.describe(), "port open");
        if self.offload.is_some() && port.kind() != sluice_io::BackendKind::AfXdp {
            return Err(RunError::Interface {
                name: ifc.name.clone(),
                reason: format!(
                    "xdp_offload needs AF_XDP, but the port opened as {}",
                    port.describe()
                ),
            });
        }
        Ok(match &self.capture {
            Some(base) => {
                let mut b = base.clone().into_os_string();
                if self.workers > 1 {
                    b.push(format!(".w{id}"));
                }
                let cap = if again {
                    sluice_io::pcap::Captured::append(DynPort(port), Path::new(&b))
                } else {
                    sluice_io::pcap::Captured::new(DynPort(port), Path::new(&b))
                };
                Box::new(cap.map_err(|e| RunError::Interface {
                    name: ifc.name.clone(),
                    reason: format!("capture: {e}"),
                })?)
            }
            None => port,
        })
    }
}

/// A boxed port as a sized [`Port`] (for [`sluice_io::pcap::Captured`]).
struct DynPort(Box<dyn Port>);

impl Port for DynPort {
    fn name(&self) -> &str {
        self.0.name()
    }
    fn kind(&self) -> BackendKind {
        self.0.kind()
    }
    fn describe(&self) -> String {
        self.0.describe()
    }
    fn rx_batch(&mut self, batch: &mut Batch) -> usize {
        self.0.rx_batch(batch)
    }
    fn tx_batch(&mut self, batch: &mut Batch, which: &[u16]) -> usize {
        self.0.tx_batch(batch, which)
    }
    fn flush(&mut self) -> Result<(), sluice_io::IoError> {
        self.0.flush()
    }
    fn poll_fd(&self) -> Option<std::os::fd::RawFd> {
        self.0.poll_fd()
    }
    fn stats(&mut self) -> PortStats {
        self.0.stats()
    }
}

/// What a reload of `cfg` over the running `old` configuration does
/// besides publishing the rule set (see [`Control::reload`]).
struct ReloadPlan {
    /// Interfaces' `mac` / `mtu` changed (and nothing but those and
    /// addresses): applied.
    relink: bool,
    /// Interfaces' addresses changed (and nothing but those, `mac` and
    /// `mtu`): applied, with the static routes.
    readdr: bool,
    /// The static routes changed and can be applied.
    apply_routes: bool,
    /// The conntrack timeouts changed.
    timeouts_changed: bool,
    /// `[nat]` switches a running gateway takes changed (and nothing else
    /// of `[nat]`).
    nat_live: bool,
    /// The NAT log's destination or format changed (it was and stays on).
    nat_log: bool,
    /// The control socket's mode or group changed (its path did not).
    socket_mode: bool,
    /// `metrics_listen` changed (set, moved or taken out).
    metrics: bool,
    /// `conntrack.max` or `max_v6` changed, within the running tables'
    /// capacities.
    ct_max: bool,
    /// Why the conntrack maximums or capacities cannot change without a
    /// restart, if they cannot.
    ct_refused: Option<String>,
    /// What changed and needs a restart.
    needs_restart: Vec<&'static str>,
}

impl ReloadPlan {
    fn of(old: &Config, cfg: &Config, st: &Published) -> Self {
        let mut needs_restart = Vec::new();
        // A change of `mac`, `mtu` or addresses is applied (below);
        // anything else about the interfaces (names, roles, how many)
        // needs a restart.
        let bare = |a: &config::InterfaceConfig| config::InterfaceConfig {
            mac: None,
            mtu: None,
            addrs: Vec::new(),
            addrs6: Vec::new(),
            ..a.clone()
        };
        let pairs = || old.interfaces.iter().zip(&cfg.interfaces);
        let applicable = old.interfaces.len() == cfg.interfaces.len()
            && pairs().all(|(a, b)| bare(a) == bare(b));
        let relink = applicable && pairs().any(|(a, b)| a.mac != b.mac || a.mtu != b.mtu);
        let readdr = applicable && pairs().any(|(a, b)| a.addrs != b.addrs || a.addrs6 != b.addrs6);
        if !applicable {
            needs_restart.push("interfaces");
        }
        // Routes are applied below, unless the interfaces they name changed.
        let routes_changed = old.routes != cfg.routes || old.routes6 != cfg.routes6;
        let apply_routes = routes_changed && applicable;
        if routes_changed && !apply_routes {
            needs_restart.push("routes");
        }
        if old.workers != cfg.workers
            || old.backend != cfg.backend
            || old.af_packet_rx != cfg.af_packet_rx
            || old.worker_priority != cfg.worker_priority
            || old.xdp_offload != cfg.xdp_offload
        {
            needs_restart.push("workers/backend");
        }
        if old.control_socket != cfg.control_socket {
            needs_restart.push("control_socket");
        }
        if old.capture != cfg.capture {
            needs_restart.push("capture");
        }
        if old.state_file != cfg.state_file {
            needs_restart.push("state_file");
        }
        // A group given back to the daemon's own (unset) is taken at the
        // next start; a new mode or group is applied.
        let group_unset = old.control_socket_group.is_some() && cfg.control_socket_group.is_none();
        if group_unset {
            needs_restart.push("control_socket_group");
        }
        // The switches read when a session or mapping is made are taken
        // live; the rest of `[nat]` needs a restart.
        let nat_live = old.nat != cfg.nat
            && worker_nat(old, &st.pools)
                .pool_change(&worker_nat(cfg, &st.pools), &st.seen)
                .is_ok();
        // A running NAT log may move to another destination or format;
        // turning it on or off needs a restart (the workers' rings are
        // sized at start).
        let nat_log = old.nat_log != cfg.nat_log && old.nat_log.is_some() && cfg.nat_log.is_some();
        if (old.nat != cfg.nat && !nat_live)
            || old.masquerade != cfg.masquerade
            || (old.nat_log != cfg.nat_log && !nat_log)
        {
            needs_restart.push("nat");
        }
        if old.heap_reserve_mib != cfg.heap_reserve_mib {
            needs_restart.push("heap_reserve_mib");
        }
        // The tables' capacities are built at start; a maximum up to them
        // is applied live (a capacity left unset keeps the running one).
        let ct = ct_reload(old, cfg);
        let ct_max = ct.is_ok() && (old.ct_max != cfg.ct_max || old.ct6_max != cfg.ct6_max);
        if ct.is_err() || old.ct_prefault != cfg.ct_prefault {
            needs_restart.push("conntrack");
        }
        let timeouts_changed = old.timeouts != cfg.timeouts;
        ReloadPlan {
            relink,
            readdr,
            apply_routes,
            timeouts_changed,
            nat_live,
            nat_log,
            socket_mode: old.control_socket == cfg.control_socket
                && (old.control_socket_mode != cfg.control_socket_mode
                    || (old.control_socket_group != cfg.control_socket_group && !group_unset)),
            metrics: old.metrics_listen != cfg.metrics_listen,
            ct_max,
            ct_refused: ct.err(),
            needs_restart,
        }
    }

    /// What it applies, in order (the answer's `applied`).
    fn applied(&self, old: &Config, cfg: &Config) -> Vec<&'static str> {
        let mut a = vec!["ruleset"];
        if self.relink {
            a.push("interfaces (mac, mtu)");
        }
        if self.readdr {
            a.push("interfaces (addresses)");
        }
        if self.timeouts_changed {
            a.push("conntrack timeouts");
        }
        if self.ct_max {
            a.push("conntrack max");
        }
        if self.nat_live {
            a.push("nat settings");
        }
        if self.nat_log {
            a.push("nat log");
        }
        if self.socket_mode {
            a.push("control socket mode");
        }
        if self.metrics {
            a.push("metrics listener");
        }
        if self.apply_routes {
            a.push("routes");
        }
        if old.neighbors != cfg.neighbors || old.neighbors6 != cfg.neighbors6 {
            a.push("neighbors");
        }
        a
    }
}

/// Whether the running tables (built for `old`) take `cfg`'s conntrack
/// maximums: each at most its table's capacity, and a capacity set in
/// `cfg` the running one. Err: why not (a restart is needed).
fn ct_reload(old: &Config, cfg: &Config) -> Result<(), String> {
    let fams = [
        (
            "max",
            "capacity",
            old.ct_capacity,
            cfg.ct_max,
            cfg.ct_capacity,
        ),
        (
            "max_v6",
            "capacity_v6",
            old.ct6_capacity,
            cfg.ct6_max,
            cfg.ct6_capacity,
        ),
    ];
    for ((max_key, cap_key, cap, max, new_cap), set) in fams.into_iter().zip(cfg.ct_capacity_set) {
        if set && new_cap != cap {
            return Err(format!(
                "conntrack.{cap_key} = {new_cap}: the running tables were built for {cap} \
                 connections; a new capacity takes a restart"
            ));
        }
        if max > cap {
            return Err(format!(
                "conntrack.{max_key} = {max} is above the running tables' capacity ({cap}); \
                 set conntrack.{cap_key} at start to raise {max_key} by a reload"
            ));
        }
    }
    Ok(())
}

/// Control-plane state shared by the signal loop and the control socket.
struct Control {
    started: Instant,
    /// The workers' clock (`dataplane::now_ns`), for dynamic sets' expiry.
    epoch: Instant,
    config_path: PathBuf,
    workers: Vec<SyncSender<Command>>,
    state: Mutex<Published>,
    policy: Arc<dataplane::PolicyCell>,
    /// Replaced policies, freed on the control plane once no worker holds
    /// them ([`Control::reap`]).
    retired: Mutex<Vec<Arc<dataplane::PolicyRef>>>,
    /// The NAT log (`nat.log`), if configured.
    nat_log: Option<natlog::NatLogHandle>,
    /// The interfaces' link state (watched by the main loop).
    links: Arc<dataplane::Links>,
    /// Reloads (SIGHUP, `reload`) that applied and that failed, whether
    /// the last one applied, and when (Unix seconds) the running
    /// configuration was last loaded successfully (start or reload).
    reloads: ReloadStats,
    /// Hands the metrics thread a reload's new `metrics_listen` listener
    /// (`None`: stop listening).
    metrics_moves: std::sync::mpsc::Sender<Option<std::net::TcpListener>>,
}

/// See [`Control::reloads`].
#[derive(Debug)]
struct ReloadStats {
    ok: std::sync::atomic::AtomicU64,
    failed: std::sync::atomic::AtomicU64,
    last_ok: AtomicBool,
    last_success_unix: std::sync::atomic::AtomicU64,
}

impl ReloadStats {
    fn new() -> Self {
        Self {
            ok: Default::default(),
            failed: Default::default(),
            last_ok: AtomicBool::new(true),
            last_success_unix: std::sync::atomic::AtomicU64::new(unix_now()),
        }
    }

    fn record(&self, ok: bool) {
        if ok {
            self.ok.fetch_add(1, Ordering::Relaxed);
            self.last_success_unix.store(unix_now(), Ordering::Relaxed);
        } else {
            self.failed.fetch_add(1, Ordering::Relaxed);
        }
        self.last_ok.store(ok, Ordering::Relaxed);
    }

    fn snapshot(&self) -> metrics::Reloads {
        metrics::Reloads {
            ok: self.ok.load(Ordering::Relaxed),
            failed: self.failed.load(Ordering::Relaxed),
            last_ok: self.last_ok.load(Ordering::Relaxed),
            last_success_unix: self.last_success_unix.load(Ordering::Relaxed),
        }
    }
}

/// The static routes as running (`sluice ctl status`; after a reload,
/// what the workers route by besides the connected routes of the
/// interfaces' addresses), IPv4 then IPv6.
fn routes_json(cfg: &Config) -> Vec<Value> {
    let dev = |k: usize| cfg.interfaces.get(k).map(|i| i.name.clone());
    cfg.routes
        .iter()
        .map(|r| json!({"to": format!("{}/{}", r.net, r.len), "via": r.via, "dev": dev(r.dev)}))
        .chain(cfg.routes6.iter().map(
            |r| json!({"to": format!("{}/{}", r.net, r.len), "via": r.via, "dev": dev(r.dev)}),
        ))
        .collect()
}

/// Whether the workers can take `pools` as the running NAT pools
/// ([`sluice_nat::NatConfig::pool_change`], the check every worker makes
/// again): the refusal names the rule set and the reason.
fn pools_refusal(source: &str, pools: &[sluice_nat::Pool], st: &Published) -> Option<CtlFailure> {
    if pools == st.pools.as_slice() {
        return None;
    }
    let running = worker_nat(&st.config, &st.pools);
    let next = worker_nat(&st.config, pools);
    running
        .pool_change(&next, &st.seen)
        .err()
        .map(|e| CtlFailure {
            kind: "ruleset",
            message: format!(
            "{source}: its NAT pools cannot replace the running ones: {e} (running ruleset kept)"
        ),
        })
}

fn reloads_json(r: metrics::Reloads) -> Value {
    json!({"ok": r.ok, "failed": r.failed, "last_ok": r.last_ok,
           "last_success_unix": r.last_success_unix})
}

/// Seconds since the Unix epoch (0 if the clock is before it).
fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// What is currently running (for reload decisions and status).
struct Published {
    config: Config,
    source: String,
    rules: usize,
    pools: Vec<sluice_nat::Pool>,
    /// With port blocks, the range of every address that has been a pool
    /// address in this run ([`sluice_nat::NatConfig::pool_change`]).
    seen: sluice_nat::SeenRanges,
    generation: u64,
    /// The running compiled rule set (None: the built-in policy).
    compiled: Option<Arc<sluice_policy::CompiledPolicy>>,
    /// Incremental commands applied since the last full load.
    updates: u64,
}

const CMD_QUEUE: usize = 64;
/// Where the per-interface ownership locks live ([`lock_interfaces`]).
const LOCK_DIR: &str = "/run/sluice";

/// An interface lock held by this gateway ([`lock_interfaces`]): the
/// file is removed when the gateway stops (while still locked, so no other
/// gateway can hold it then).
#[derive(Debug)]
struct InterfaceLock {
    path: PathBuf,
    _file: std::fs::File,
}

impl Drop for InterfaceLock {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Takes an exclusive lock (`flock`) on `DIR/net<namespace inode>-<interface>.lock`
/// for every interface, with this process's id written in it. An interface
/// another running gateway holds (in the same network namespace) is an
/// error naming that gateway's process; a lock directory this process may
/// not write is a warning (nothing is enforced then). A lock is taken on
/// the file the path names after locking (checked by inode): a holder
/// that stopped removed its file, and a lock on a removed file guards
/// nothing.
fn lock_interfaces(
    ifaces: &[config::InterfaceConfig],
    dir: &Path,
) -> Result<Vec<InterfaceLock>, RunError> {
    use std::io::{Read, Seek, Write};
    use std::os::unix::fs::MetadataExt;
    let ns = std::fs::metadata("/proc/self/ns/net").map_or(0, |m| m.ino());
    if let Err(e) = std::fs::create_dir_all(dir) {
        tracing::warn!(
            dir = %dir.display(),
            "interface locks not taken ({e}): a second gateway on the same interfaces would not be refused"
        );
        return Ok(Vec::new());
    }
    let mut held = Vec::new();
    for i in ifaces {
        let path = dir.join(format!("net{ns}-{}.lock", i.name));
        for attempt in 0.. {
            let mut f = match std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(&path)
            {
                Ok(f) => f,
                Err(e) => {
                    tracing::warn!(lock = %path.display(), "interface lock not taken: {e}");
                    break;
                }
            };
            match sluice_io::flock::try_lock_exclusive(&f) {
                Ok(true) => {
                    let same = match (f.metadata(), std::fs::metadata(&path)) {
                        (Ok(a), Ok(b)) => a.ino() == b.ino() && a.dev() == b.dev(),
                        _ => false,
                    };
                    if !same && attempt < 8 {
                        // Its holder removed it as we opened it: again.
                        continue;
                    }
                    let _ = f.set_len(0);
                    let _ = f.rewind();
                    let _ = writeln!(f, "{}", std::process::id());
                    held.push(InterfaceLock {
                        path: path.clone(),
                        _file: f,
                    });
                }
                Ok(false) => {
                    let mut pid = String::new();
                    let _ = f.read_to_string(&mut pid);
                    return Err(RunError::Interface {
                        name: i.name.clone(),
                        reason: format!(
                            "in use by another Sluice gateway (pid {}, lock {})",
                            pid.trim(),
                            path.display()
                        ),
                    });
                }
                Err(e) => {
                    tracing::warn!(lock = %path.display(), "interface lock not taken: {e}");
                }
            }
            break;
        }
    }
    Ok(held)
}

/// How often the main loop looks at the interfaces' link state.
const LINK_POLL: Duration = Duration::from_millis(250);
/// The first wait before opening the ports of an interface that came back
/// again, after a failure; it doubles up to [`REOPEN_RETRY_MAX`].
const REOPEN_RETRY_MIN: Duration = Duration::from_secs(1);
/// The longest wait between two attempts.
const REOPEN_RETRY_MAX: Duration = Duration::from_secs(30);
/// How long a port opened again waits for a queue its closed predecessor
/// still holds (`EBUSY`), in steps of [`REOPEN_BUSY_STEP`].
const REOPEN_BUSY_WAIT: Duration = Duration::from_secs(2);
const REOPEN_BUSY_STEP: Duration = Duration::from_millis(10);

/// Looks at each interface's link (`names[k]`: its name and the kernel
/// index it had at start) and records changes in `links`, logging them.
/// An interface whose index changed was deleted and made again, and one
/// that is there again after it was gone was moved out of the namespace
/// and back: its sockets and XDP program went with the old one. It is
/// reported `gone` and returned (its index recorded in `names`) for
/// [`reattach`]. Interfaces in `reopening` (returned before, their ports
/// not open yet) stay `gone`; those in `reopened` (their ports opened
/// again just now) take their link's state.
fn watch_link_states(
    names: &mut [(String, Option<u32>)],
    links: &dataplane::Links,
    reopening: &std::collections::BTreeSet<usize>,
    reopened: &std::collections::BTreeSet<usize>,
) -> Vec<usize> {
    use sluice_io::link::LinkState;
    let mut back = Vec::new();
    for (k, (name, idx0)) in names.iter_mut().enumerate() {
        let Ok(ifn) = sluice_io::IfName::new(name) else {
            continue;
        };
        let mut st = match sluice_io::link::state(&ifn) {
            Ok(st) => st,
            Err(e) => {
                tracing::warn!(interface = %name, "link state: {e}");
                continue;
            }
        };
        if st != LinkState::Gone {
            let idx = sluice_io::afxdp::offload::ifindex(name).ok();
            // Back: under a new index (deleted and made again), or under
            // its old one after it was gone (moved to another namespace
            // and back, which keeps a free index): either way its sockets
            // and XDP program did not come back with it.
            let was_gone = links.get(k) == LinkState::Gone
                && !reopening.contains(&k)
                && !reopened.contains(&k);
            if idx0.is_some() && idx.is_some() && (idx != *idx0 || was_gone) {
                *idx0 = idx;
                back.push(k);
                st = LinkState::Gone;
            } else if reopening.contains(&k) {
                // There, but its ports are not open (yet).
                if links.set(k, LinkState::Gone) {
                    tracing::error!(
                        interface = %name,
                        "ports not open: packets routed out of it are dropped (link-down) \
                         until they are"
                    );
                }
                continue;
            }
        }
        if !links.set(k, st) {
            continue;
        }
        match st {
            LinkState::Up => tracing::info!(interface = %name, "link up"),
            LinkState::Down => tracing::warn!(
                interface = %name,
                "link down: packets routed out of it are dropped (link-down) until it is up"
            ),
            LinkState::Gone => tracing::error!(
                interface = %name,
                "interface gone (deleted, replaced or moved to another namespace): packets routed \
                 out of it are dropped (link-down); its ports are opened again when an interface \
                 of that name is back"
            ),
        }
    }
    back
}

/// Interfaces `back` were deleted and made again: close their ports in
/// every worker, open them again, and hand them over with the new
/// interfaces' MACs and MTUs. On AF_PACKET only those ports; on AF_XDP
/// every port (a worker's ports share one UMEM, and the frames the kernel
/// held for the old interface's sockets are lost with them, so the UMEMs
/// are new too), so there frames arriving on the other interfaces while
/// their ports are re-opened are lost, as on a link flap. Connections, NAT
/// state and the rule set stay. Returns the interfaces whose ports could
/// not be opened (to try again later).
fn reattach(
    plan: &PortPlan,
    back: &std::collections::BTreeSet<usize>,
    control: &Control,
    ingress: Option<&sluice_io::nft::IngressDrop>,
) -> std::collections::BTreeSet<usize> {
    let workers = &control.workers;
    // `mac` and `mtu` as running (a reload may have changed them since the
    // start, when `plan` was made).
    let running = control
        .state
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .config
        .interfaces
        .clone();
    let mut failed = std::collections::BTreeSet::new();
    let mut relinked = Vec::new();
    for &k in back {
        let Some(ifc) = running.get(k).or_else(|| plan.interfaces.get(k)) else {
            continue;
        };
        match interface_link(&ifc.name) {
            Ok((kmac, kmtu)) => {
                let mtu = ifc
                    .mtu
                    .unwrap_or_else(|| kmtu.clamp(config::MIN_MTU, config::MAX_MTU));
                relinked.push((k, ifc.mac.unwrap_or(kmac), mtu));
            }
            Err(e) => {
                tracing::warn!(interface = %ifc.name, "interface back, but: {e}");
                failed.insert(k);
            }
        }
    }
    let ask = |mk: &dyn Fn(mpsc::Sender<()>) -> Command| {
        for w in workers {
            let (tx, rx) = mpsc::channel();
            if w.send(mk(tx)).is_ok() && rx.recv_timeout(CMD_TIMEOUT).is_err() {
                tracing::error!("a worker did not answer while its ports were re-opened");
            }
        }
    };
    let which: Vec<usize> = match plan.backend {
        Some(sluice_io::Backend::AfPacket) => back.iter().copied().collect(),
        _ => (0..plan.interfaces.len()).collect(),
    };
    // The gap in the re-opened ports' traffic starts here.
    let t0 = Instant::now();
    ask(&|tx| Command::Detach(which.clone(), tx));
    let umems = plan.umems();
    let mut no_peers = Vec::new();
    let mut sets: Vec<Vec<(usize, Box<dyn Port>)>> = Vec::new();
    for id in 0..plan.workers {
        let umem = umems.get(usize::from(id)).cloned().flatten();
        let mut ports: Vec<(usize, Box<dyn Port>)> = Vec::new();
        for (k, ifc) in which
            .iter()
            .filter_map(|&k| Some((k, plan.interfaces.get(k)?)))
        {
            match plan.open(id, k, umem.clone(), &mut no_peers, true) {
                Ok(p) => ports.push((k, p)),
                Err(e) => {
                    tracing::error!(worker = id, interface = %ifc.name, "re-opening the port: {e}");
                    failed.insert(k);
                    let kind = match plan.backend {
                        Some(sluice_io::Backend::AfPacket) => BackendKind::AfPacket,
                        Some(_) => BackendKind::AfXdp,
                        None => BackendKind::Mem,
                    };
                    ports.push((k, Box::new(dataplane::Detached::new(&ifc.name, kind))));
                }
            }
        }
        sets.push(ports);
    }
    let offload_ifindex: Vec<u32> = std::iter::once(0)
        .chain(
            plan.interfaces
                .iter()
                .map(|i| sluice_io::afxdp::offload::ifindex(&i.name).unwrap_or(0)),
        )
        .collect();
    let relinked: Vec<(sluice_engine::IfIndex, [u8; 6], u16)> = relinked
        .into_iter()
        .filter(|(k, _, _)| !failed.contains(k))
        .map(|(k, mac, mtu)| ((k + 1) as sluice_engine::IfIndex, mac, mtu))
        .collect();
    for (w, ports) in workers.iter().zip(sets) {
        let (tx, rx) = mpsc::channel();
        let a = dataplane::Attach {
            ports,
            relinked: relinked.clone(),
            offload_ifindex: Some(offload_ifindex.clone()),
            done: tx,
        };
        if w.send(Command::Attach(Box::new(a))).is_ok() && rx.recv_timeout(CMD_TIMEOUT).is_err() {
            tracing::error!("a worker did not take its re-opened ports in time");
        }
    }
    let took = t0.elapsed();
    for &k in back {
        // After the ports, so that it does not lengthen the other
        // interfaces' gap (an `nft` run).
        if let (Some(i), Some(ifc)) = (ingress, plan.interfaces.get(k)) {
            if let Err(e) = i.rehook(&ifc.name) {
                tracing::warn!(interface = %ifc.name, "ingress drop for the new interface: {e}");
            }
        }
        if !failed.contains(&k) {
            if let Some(ifc) = plan.interfaces.get(k) {
                tracing::info!(
                    interface = %ifc.name,
                    // From closing the old ports to the new ones in use
                    // (on AF_XDP, the other interfaces' gap too).
                    reopened = which.len(),
                    took_ms = took.as_millis() as u64,
                    "interface back: ports opened again"
                );
            }
        }
    }
    failed
}

/// Offload requests a worker queues between two loop turns (more are
/// counted as failed and those connections stay in userspace).
const OFFLOAD_QUEUE: usize = 4096;
const CMD_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a filtered `conntrack flush` or `count` waits for the workers'
/// walks (under the control client's 30 s read timeout; a walk of 40 M
/// slots takes 1221 loop turns, about 0.1 s of walking).
const WALK_TIMEOUT: Duration = Duration::from_secs(25);

impl Control {
    /// Ask every worker and collect the answers.
    fn ask<T>(&self, mk: impl Fn(mpsc::Sender<T>) -> Command) -> Result<Vec<T>, CtlFailure> {
        let mut rxs = Vec::new();
        for w in &self.workers {
            let (tx, rx) = mpsc::channel();
            w.try_send(mk(tx)).map_err(|_| CtlFailure {
                kind: "internal",
                message: "a worker's command queue is full or closed".into(),
            })?;
            rxs.push(rx);
        }
        rxs.into_iter()
            .map(|rx| {
                rx.recv_timeout(CMD_TIMEOUT).map_err(|_| CtlFailure {
                    kind: "internal",
                    message: "a worker did not answer".into(),
                })
            })
            .collect()
    }

    /// Count or remove (`remove`) the connections `f` selects on every
    /// worker ([`Command::Walk`]).
    fn walk(&self, f: &CtFilter, remove: bool) -> Result<u64, CtlFailure> {
        Ok(self
            .ask_walk(|tx| Command::Walk(f.clone(), remove, tx))?
            .into_iter()
            .sum())
    }

    /// [`Self::ask`] for a request every worker answers after a walk of its
    /// tables ([`Command::Walk`], [`Command::List`]): the workers walk at
    /// the same time, each in steps between its batches (a walk asked for
    /// while another runs waits for it), so the answers may take up to
    /// [`WALK_TIMEOUT`].
    fn ask_walk<T>(&self, mk: impl Fn(mpsc::Sender<T>) -> Command) -> Result<Vec<T>, CtlFailure> {
        let mut rxs = Vec::new();
        for w in &self.workers {
            let (tx, rx) = mpsc::channel();
            w.try_send(mk(tx)).map_err(|_| CtlFailure {
                kind: "internal",
                message: "a worker's command queue is full or closed".into(),
            })?;
            rxs.push(rx);
        }
        rxs.into_iter()
            .map(|rx| {
                rx.recv_timeout(WALK_TIMEOUT).map_err(|_| CtlFailure {
                    kind: "internal",
                    message: format!(
                        "a worker did not finish its walk of the connection tables within {} s \
                         (it goes on in the background)",
                        WALK_TIMEOUT.as_secs()
                    ),
                })
            })
            .collect()
    }

    /// Publish `lp` to every worker (the ruleset replace / reload commit).
    fn publish(&self, st: &mut Published, lp: LoadedPolicy) -> Result<(), CtlFailure> {
        if let Some(f) = pools_refusal(&lp.source, &lp.pools, st) {
            return Err(f);
        }
        if let Some(c) = &lp.compiled {
            c.start_timers(dataplane::now_ns(self.epoch) / 1_000_000);
        }
        st.generation = self.retire(self.policy.publish(Arc::clone(&lp.policy)));
        if lp.compiled.is_some() {
            // The built-in policy names no pools: the workers keep theirs.
            if lp.pools != st.pools {
                tracing::info!(pools = lp.pools.len(), "NAT pools replaced");
                worker_nat(&st.config, &lp.pools).note_ranges(&mut st.seen);
            }
            st.pools = lp.pools;
        }
        st.source = lp.source;
        st.rules = lp.rules;
        st.compiled = lp.compiled;
        st.updates = 0;
        tracing::info!(ruleset = %st.source, rules = st.rules, generation = st.generation, "ruleset published");
        Ok(())
    }

    /// Keeps a replaced policy until [`Self::reap`] can free it; returns the
    /// new generation.
    fn retire(&self, (generation, old): (u64, Arc<dataplane::PolicyRef>)) -> u64 {
        self.retired
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(old);
        generation
    }

    /// Frees replaced policies no worker uses any more (called from the
    /// control loop, never from a worker).
    ///
    /// The freed policies are dropped after the lock is released: freeing a
    /// large rule set takes milliseconds, and [`Self::retire`] (every rule
    /// update) takes the same lock.
    fn reap(&self) {
        let dead: Vec<Arc<dataplane::PolicyRef>> = {
            let mut r = self.retired.lock().unwrap_or_else(|e| e.into_inner());
            let (dead, keep) = std::mem::take(&mut *r)
                .into_iter()
                .partition(dataplane::PolicyRef::unused);
            *r = keep;
            dead
        };
        drop(dead);
    }

    /// `sluice ctl nat lookup`: the live mappings and port blocks of an
    /// external endpoint (asked of the worker owning its port) or of an
    /// internal address (asked of every worker).
    fn nat_lookup(&self, query: &str, proto: Option<&str>) -> Result<Value, CtlFailure> {
        let proto = match proto {
            None => None,
            Some("tcp") => Some(6u8),
            Some("udp") => Some(17),
            Some("icmp") => Some(1),
            Some(p) => {
                return Err(CtlFailure::bad(format!(
                    "proto {p}: expected tcp, udp or icmp"
                )))
            }
        };
        let q = match query.rsplit_once(':') {
            Some((a, p)) => {
                let addr = a.parse().map_err(|_| {
                    CtlFailure::bad(format!("{a} is not an IPv4 address (ADDRESS:PORT)"))
                })?;
                let port = p
                    .parse()
                    .map_err(|_| CtlFailure::bad(format!("{p} is not a port (ADDRESS:PORT)")))?;
                dataplane::NatQuery::Endpoint(addr, port, proto)
            }
            None if proto.is_some() => {
                return Err(CtlFailure::bad(
                    "proto applies to an external endpoint (ADDRESS:PORT)",
                ))
            }
            None => dataplane::NatQuery::Subscriber(query.parse().map_err(|_| {
                CtlFailure::bad(format!(
                    "{query} is neither ADDRESS:PORT nor an internal IPv4 address"
                ))
            })?),
        };
        // An endpoint's port has one owner; a subscriber's mappings and
        // blocks may be on any worker.
        let answers = match q {
            dataplane::NatQuery::Endpoint(_, port, _) => {
                let owner = usize::from(sluice_nat::owner_of(port, self.workers.len() as u16));
                let w = self.workers.get(owner).ok_or_else(|| CtlFailure {
                    kind: "internal",
                    message: "no worker owns the port".into(),
                })?;
                let (tx, rx) = mpsc::channel();
                w.try_send(Command::NatLookup(q, tx))
                    .map_err(|_| CtlFailure {
                        kind: "internal",
                        message: "a worker's command queue is full or closed".into(),
                    })?;
                vec![rx.recv_timeout(CMD_TIMEOUT).map_err(|_| CtlFailure {
                    kind: "internal",
                    message: "a worker did not answer".into(),
                })?]
            }
            dataplane::NatQuery::Subscriber(_) => self.ask(|tx| Command::NatLookup(q, tx))?,
        };
        let pick = |k: &str| -> Vec<Value> {
            answers
                .iter()
                .filter_map(|a| a.get(k).and_then(Value::as_array))
                .flatten()
                .cloned()
                .collect()
        };
        Ok(json!({"ok": true, "mappings": pick("mappings"), "blocks": pick("blocks")}))
    }

    /// The Prometheus exposition (`sluice ctl metrics`, `metrics_listen`).
    fn metrics(&self) -> Result<String, CtlFailure> {
        let ws = self.ask(Command::Status)?;
        let info = {
            let st = self.state.lock().unwrap_or_else(|e| e.into_inner());
            metrics::Info {
                uptime_s: self.started.elapsed().as_secs(),
                rules: st.rules,
                generation: st.generation,
                nat_log: self.nat_log.as_ref().map(natlog::NatLogHandle::counts),
                links: st
                    .config
                    .interfaces
                    .iter()
                    .enumerate()
                    .map(|(k, i)| {
                        (
                            i.name.clone(),
                            self.links.get(k).name(),
                            self.links.reopened(k),
                        )
                    })
                    .collect(),
                reloads: self.reloads.snapshot(),
            }
        };
        Ok(metrics::render(&ws, &info))
    }

    /// SIGHUP / `reload`: re-read the config file and its ruleset, and
    /// reopen the NAT log (log rotation); counted in [`Control::reloads`].
    fn reload(&self) -> Result<Value, CtlFailure> {
        let r = self.reload_inner();
        self.reloads.record(r.is_ok());
        r
    }

    /// `reload check`: what a reload would do now, without doing it (the
    /// file and its rule set are loaded and checked as a reload would).
    /// The configuration file and its rule set, loaded and checked (what
    /// a reload and `reload check` start from).
    fn load_file(&self) -> Result<(Config, LoadedPolicy), CtlFailure> {
        let cfg = config::load(&self.config_path).map_err(|e| CtlFailure {
            kind: "config",
            message: e.to_string(),
        })?;
        let lp = load_policy(&cfg, None).map_err(|e| CtlFailure {
            kind: "ruleset",
            message: e.to_string(),
        })?;
        Ok((cfg, lp))
    }

    fn reload_check(&self) -> Result<Value, CtlFailure> {
        let (cfg, lp) = self.load_file()?;
        let st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(f) = pools_refusal(&lp.source, &lp.pools, &st) {
            return Err(f);
        }
        let plan = ReloadPlan::of(&st.config, &cfg, &st);
        if let (Some(l), Some(c), true) = (&self.nat_log, &cfg.nat_log, plan.nat_log) {
            // As a reload would: a destination it cannot open refuses it.
            l.open_dest(c).map_err(|e| CtlFailure {
                kind: "config",
                message: e,
            })?;
        }
        if plan.metrics {
            // As a reload would: an address it cannot listen on refuses it.
            drop(bind_metrics(cfg.metrics_listen)?);
        }
        let mut applied = plan.applied(&st.config, &cfg);
        if lp.compiled.is_some() && lp.pools != st.pools {
            applied.push("nat pools");
        }
        let mut answer = json!({"ok": true, "ruleset": lp.source, "rules": lp.rules,
                               "applied": applied,
                               "needs_restart": plan.needs_restart});
        if let Some(why) = plan.ct_refused {
            answer["why"] = json!({"conntrack": why});
        }
        Ok(answer)
    }

    fn reload_inner(&self) -> Result<Value, CtlFailure> {
        if let Some(l) = &self.nat_log {
            l.reopen();
        }
        let (cfg, lp) = self.load_file()?;
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let plan = ReloadPlan::of(&st.config, &cfg, &st);
        let mut applied = plan.applied(&st.config, &cfg);
        if lp.compiled.is_some() && lp.pools != st.pools {
            applied.push("nat pools");
        }
        let ReloadPlan {
            relink,
            readdr,
            apply_routes,
            timeouts_changed,
            nat_live,
            nat_log,
            socket_mode,
            metrics,
            ct_max,
            ct_refused,
            needs_restart,
        } = plan;
        // The new NAT log destination is opened before anything changes:
        // one that cannot be opened refuses the reload.
        let new_log = match (&self.nat_log, &cfg.nat_log) {
            (Some(l), Some(c)) if nat_log => Some(l.open_dest(c).map_err(|e| CtlFailure {
                kind: "config",
                message: e,
            })?),
            _ => None,
        };
        // So is a new metrics address: bound now, served from the end of
        // the reload on.
        let new_metrics = if metrics {
            Some(bind_metrics(cfg.metrics_listen)?)
        } else {
            None
        };
        self.publish(&mut st, lp)?;
        if relink {
            self.relink(&mut st, &cfg)?;
        }
        if socket_mode {
            // As at start (`bind_with_mode`): the group first, then the
            // mode, on the socket file itself.
            let p = &st.config.control_socket;
            let set = || -> std::io::Result<()> {
                if let Some(g) = cfg.control_socket_group {
                    std::os::unix::fs::chown(p, None, Some(g))?;
                }
                std::fs::set_permissions(
                    p,
                    std::os::unix::fs::PermissionsExt::from_mode(cfg.control_socket_mode & 0o777),
                )
            };
            set().map_err(|e| CtlFailure {
                kind: "config",
                message: format!(
                    "control_socket_mode / control_socket_group: {}: {e}",
                    p.display()
                ),
            })?;
            st.config.control_socket_mode = cfg.control_socket_mode;
            if cfg.control_socket_group.is_some() {
                st.config.control_socket_group = cfg.control_socket_group;
            }
            tracing::info!(
                mode = format!("{:o}", cfg.control_socket_mode),
                "reload: control socket mode applied"
            );
        }
        if let (Some(l), Some(d)) = (&self.nat_log, new_log) {
            l.retarget(d).map_err(|e| CtlFailure {
                kind: "config",
                message: e,
            })?;
            st.config.nat_log = cfg.nat_log.clone();
        }
        if nat_live {
            let n = worker_nat(&cfg, &st.pools);
            let answers = self.ask(|tx| Command::SetNat(Box::new(n.clone()), tx))?;
            if let Some(Err(e)) = answers.into_iter().find(Result::is_err) {
                return Err(CtlFailure {
                    kind: "config",
                    message: format!("nat: {e}"),
                });
            }
            st.config.nat = cfg.nat.clone();
            tracing::info!("reload: nat settings replaced");
        }
        if timeouts_changed {
            let t = cfg.timeouts;
            self.ask(|tx| Command::SetTimeouts(Box::new(t), tx))?;
            st.config.timeouts = cfg.timeouts;
            tracing::info!("reload: conntrack timeouts replaced");
        }
        if ct_max {
            // Within every worker's capacities (`ct_reload`), so no worker
            // refuses (one that did would change nothing, and all would
            // refuse alike).
            let w = u64::from(st.config.workers.max(1));
            let (v4, v6) = (cfg.ct_max.div_ceil(w), cfg.ct6_max.div_ceil(w));
            let answers = self.ask(|tx| Command::SetCtMax(v4, v6, tx))?;
            if let Some(Err(e)) = answers.into_iter().find(Result::is_err) {
                return Err(CtlFailure {
                    kind: "config",
                    message: format!("conntrack: {e}"),
                });
            }
            st.config.ct_max = cfg.ct_max;
            st.config.ct6_max = cfg.ct6_max;
            tracing::info!(
                max = cfg.ct_max,
                max_v6 = cfg.ct6_max,
                "reload: conntrack maximums replaced"
            );
        }
        if readdr {
            // The addresses with the static routes (the connected ones
            // follow the addresses), checked when the file was loaded.
            let mut v4 = vec![Vec::new()];
            v4.extend(cfg.interfaces.iter().map(|i| i.addrs.clone()));
            let change = dataplane::AddrChange {
                v4,
                v6: engine_addrs6(&cfg),
                routes: engine_routes(&cfg),
                routes6: engine_routes6(&cfg),
            };
            let answers = self.ask(|tx| Command::SetAddrs(Box::new(change.clone()), tx))?;
            if let Some(Err(e)) = answers.into_iter().find(Result::is_err) {
                return Err(CtlFailure {
                    kind: "config",
                    message: format!("interface addresses: {e}"),
                });
            }
            for (a, b) in st.config.interfaces.iter_mut().zip(&cfg.interfaces) {
                a.addrs = b.addrs.clone();
                a.addrs6 = b.addrs6.clone();
            }
            st.config.routes = cfg.routes.clone();
            st.config.routes6 = cfg.routes6.clone();
            tracing::info!("reload: interface addresses replaced");
        } else if apply_routes {
            // After the rule set (whose refusal keeps everything): the
            // routes were checked against the interfaces when the file was
            // loaded, so no worker refuses them (one that did would change
            // nothing, and every worker would refuse alike).
            let v4 = engine_routes(&cfg);
            let v6 = engine_routes6(&cfg);
            let answers =
                self.ask(|tx| Command::SetRoutes(Box::new((v4.clone(), v6.clone())), tx))?;
            if let Some(Err(e)) = answers.into_iter().find(Result::is_err) {
                return Err(CtlFailure {
                    kind: "config",
                    message: format!("routes: {e}"),
                });
            }
            st.config.routes = cfg.routes.clone();
            st.config.routes6 = cfg.routes6.clone();
            tracing::info!(
                routes = cfg.routes.len(),
                routes6 = cfg.routes6.len(),
                "reload: static routes replaced"
            );
        }
        // Static neighbours taken out of the file are forgotten (learnt
        // again by ARP / NDP if they answer), before the others are set.
        let gone4: Vec<core::net::Ipv4Addr> = st
            .config
            .neighbors
            .iter()
            .map(|&(ip, _)| ip)
            .filter(|ip| !cfg.neighbors.iter().any(|(n, _)| n == ip))
            .collect();
        let gone6: Vec<(sluice_engine::IfIndex, core::net::Ipv6Addr)> = st
            .config
            .neighbors6
            .iter()
            .filter(|&&(d, ip, _)| {
                !cfg.neighbors6
                    .iter()
                    .any(|&(d2, ip2, _)| (d2, ip2) == (d, ip))
            })
            .map(|&(d, ip, _)| ((d + 1) as sluice_engine::IfIndex, ip))
            .collect();
        if !gone4.is_empty() || !gone6.is_empty() {
            tracing::info!(
                neighbors = gone4.len() + gone6.len(),
                "reload: static neighbours removed"
            );
            for w in &self.workers {
                let f = Box::new((gone4.clone(), gone6.clone()));
                if w.send(Command::ForgetStatic(f)).is_err() {
                    tracing::error!("reload: a worker is gone");
                }
            }
        }
        for &(ip, mac) in &cfg.neighbors {
            for w in &self.workers {
                let _ = w.try_send(Command::SetNeighbor(ip, mac));
            }
        }
        for &(dev, ip, mac) in &cfg.neighbors6 {
            for w in &self.workers {
                let _ = w.try_send(Command::SetNeighbor6((dev + 1) as u16, ip, mac, true));
            }
        }
        if let Some(l) = new_metrics {
            if self.metrics_moves.send(l).is_err() {
                tracing::error!("reload: the metrics thread is gone");
            }
            st.config.metrics_listen = cfg.metrics_listen;
            tracing::info!(listen = ?cfg.metrics_listen, "reload: metrics listener replaced");
        }
        if !needs_restart.is_empty() {
            tracing::warn!(
                "reload: changes to {} need a restart and were not applied",
                needs_restart.join(", ")
            );
        }
        if let Some(why) = &ct_refused {
            tracing::warn!("reload: {why}");
        }
        let ruleset = cfg.ruleset.clone();
        st.config.ruleset = ruleset;
        st.config.neighbors = cfg.neighbors;
        st.config.neighbors6 = cfg.neighbors6;
        let mut answer = json!({"ok": true, "generation": st.generation, "ruleset": st.source,
                               "rules": st.rules, "applied": applied,
                               "needs_restart": needs_restart});
        if let Some(why) = ct_refused {
            answer["why"] = json!({"conntrack": why});
        }
        Ok(answer)
    }

    /// A reload that changed only interfaces' `mac` / `mtu`: the workers
    /// take the new values as for an interface that came back
    /// ([`Worker::relink`]: source MAC, MAC filter, MTU, link-local
    /// address; a gratuitous ARP for a new MAC), without touching the
    /// ports. An unset `mac` / `mtu` is the kernel's.
    fn relink(&self, st: &mut Published, cfg: &Config) -> Result<(), CtlFailure> {
        // The file's values are the running ones from here on, whether the
        // interface takes them now or when it is back.
        let mut relinked = Vec::new();
        for (k, (a, b)) in st.config.interfaces.iter().zip(&cfg.interfaces).enumerate() {
            if a.mac == b.mac && a.mtu == b.mtu {
                continue;
            }
            let (kmac, kmtu) = if cfg.backend == config::BackendChoice::Mem {
                ([0x02, 0x53, 0x4c, 0, 0, k as u8 + 1], 1500)
            } else {
                match interface_link(&b.name) {
                    Ok(l) => l,
                    Err(e) => {
                        // Gone now: the new values are taken when it is
                        // back (`reattach` reads the running configuration).
                        tracing::warn!(interface = %b.name,
                            "reload: mac / mtu not applied now ({e}); applied when it is back");
                        continue;
                    }
                }
            };
            let mtu = b
                .mtu
                .unwrap_or_else(|| kmtu.clamp(config::MIN_MTU, config::MAX_MTU));
            if b.mtu.is_some_and(|m| m > kmtu) {
                tracing::warn!(interface = %b.name, mtu = mtu, kernel_mtu = kmtu,
                    "configured mtu is above the interface's: the kernel may drop larger frames");
            }
            relinked.push((
                (k + 1) as sluice_engine::IfIndex,
                b.mac.unwrap_or(kmac),
                mtu,
            ));
        }
        let r = relinked.clone();
        self.ask(|tx| {
            Command::Attach(Box::new(dataplane::Attach {
                ports: Vec::new(),
                relinked: r.clone(),
                offload_ifindex: None,
                done: tx,
            }))
        })?;
        for (a, b) in st.config.interfaces.iter_mut().zip(&cfg.interfaces) {
            a.mac = b.mac;
            a.mtu = b.mtu;
        }
        tracing::info!(
            interfaces = relinked.len(),
            "reload: interface MAC / MTU applied"
        );
        Ok(())
    }

    fn handle(&self, req: Request) -> Value {
        match self.handle_inner(req) {
            Ok(v) => v,
            Err(f) => f.to_json(),
        }
    }

    fn handle_inner(&self, req: Request) -> Result<Value, CtlFailure> {
        match req {
            Request::Status => {
                let ws = self.ask(Command::Status)?;
                let st = self.state.lock().unwrap_or_else(|e| e.into_inner());
                let ifaces: Vec<Value> = st
                    .config
                    .interfaces
                    .iter()
                    .enumerate()
                    .map(|(k, i)| {
                        json!({"name": i.name, "role": i.role,
                               "link": self.links.get(k).name(),
                               "reopened": self.links.reopened(k),
                               "addresses": i.addrs.iter().map(|(a, l)| format!("{a}/{l}"))
                                   .chain(i.addrs6.iter().map(|(a, l)| format!("{a}/{l}")))
                                   .collect::<Vec<_>>()})
                    })
                    .collect();
                Ok(json!({
                    "ok": true,
                    "uptime_s": self.started.elapsed().as_secs(),
                    "reloads": reloads_json(self.reloads.snapshot()),
                    "workers": ws.len(),
                    "ruleset": st.source,
                    "rules": st.rules,
                    "generation": st.generation,
                    "retired_generations": self.retired.lock().unwrap_or_else(|e| e.into_inner()).len(),
                    "logs_suppressed": st.compiled.as_ref().map_or(0, |c| c.logs_suppressed()),
                    "heap_reserve_mib": st.config.heap_reserve_mib,
                    "resident_bytes": sluice_io::mem::resident_bytes(),
                    "interfaces": ifaces,
                    "routes": routes_json(&st.config),
                    "nat": nat_json(&ws),
                    "nat_log": self.nat_log.as_ref().map(natlog::NatLogHandle::status),
                    "worker_status": ws.iter().map(worker_json).collect::<Vec<_>>(),
                }))
            }
            Request::Metrics => Ok(json!({"ok": true, "metrics": self.metrics()?})),
            Request::NatLookup { query, proto } => self.nat_lookup(&query, proto.as_deref()),
            Request::Counters => {
                let ws = self.ask(Command::Status)?;
                let mut total = sluice_engine::Counters::default();
                for w in &ws {
                    total.merge(&w.counters);
                }
                Ok(json!({"ok": true, "counters": counters_json(&total),
                          "workers": ws.iter().map(|w| counters_json(&w.counters)).collect::<Vec<_>>()}))
            }
            Request::ConntrackList {
                proto,
                addr,
                port,
                state,
                mark,
                limit,
            } => {
                let f = CtFilter::new(proto.as_deref(), addr.as_deref(), port)?
                    .with(state.as_deref(), mark.as_deref())?;
                let limit = limit.unwrap_or(ctl::DEFAULT_LIMIT);
                let lists = self.ask_walk(|tx| Command::List(f.clone(), limit, tx))?;
                let mut all: Vec<_> = lists.into_iter().flatten().take(limit).collect();
                if all.iter().any(|c| c.timeout_slot != 0) {
                    let st = self.state.lock().unwrap_or_else(|e| e.into_inner());
                    for c in all.iter_mut().filter(|c| c.timeout_slot != 0) {
                        c.timeout_policy = Some(
                            st.compiled
                                .as_ref()
                                .and_then(|p| p.ct_timeout_name(c.timeout_slot))
                                .unwrap_or_else(|| "(policy of an earlier rule set)".to_string()),
                        );
                    }
                }
                Ok(json!({"ok": true, "count": all.len(), "connections": all}))
            }
            Request::ConntrackCount {
                proto,
                addr,
                port,
                state,
                mark,
            } => {
                let f = CtFilter::new(proto.as_deref(), addr.as_deref(), port)?
                    .with(state.as_deref(), mark.as_deref())?;
                if !f.is_empty() {
                    let n = self.walk(&f, false)?;
                    return Ok(json!({"ok": true, "count": n}));
                }
                let ws = self.ask(Command::Status)?;
                let n: usize = ws.iter().map(|w| w.connections).sum();
                let n6: usize = ws.iter().map(|w| w.connections6).sum();
                let early: u64 = ws.iter().map(|w| w.ct_early_drops).sum();
                Ok(json!({"ok": true, "count": n + n6, "ipv4": n, "ipv6": n6,
                          "early_drops": early}))
            }
            Request::ConntrackFlush {
                proto,
                addr,
                port,
                state,
                mark,
            } => {
                let f = CtFilter::new(proto.as_deref(), addr.as_deref(), port)?
                    .with(state.as_deref(), mark.as_deref())?;
                if f.is_empty() {
                    let n: u64 = self.ask(Command::Flush)?.into_iter().sum();
                    return Ok(json!({"ok": true, "flushed": n}));
                }
                let n = self.walk(&f, true)?;
                tracing::info!(flushed = n, filter = ?f, "conntrack flush");
                Ok(json!({"ok": true, "flushed": n}))
            }
            Request::RulesetReplace { path } => {
                let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
                let lp =
                    load_policy(&st.config, Some(Path::new(&path))).map_err(|e| CtlFailure {
                        kind: "ruleset",
                        message: e.to_string(),
                    })?;
                self.publish(&mut st, lp)?;
                Ok(json!({"ok": true, "generation": st.generation, "rules": st.rules}))
            }
            Request::Reload => self.reload(),
            Request::ReloadCheck => self.reload_check(),
            Request::RulesetList => {
                let st = self.state.lock().unwrap_or_else(|e| e.into_inner());
                match &st.compiled {
                    Some(p) => Ok(json!({"ok": true, "generation": st.generation,
                                         "ruleset": sluice_ruleset::print_ruleset(&p.running_ruleset())})),
                    None => Err(CtlFailure {
                        kind: "ruleset",
                        message: "the gateway runs the built-in policy (no rule set file)".into(),
                    }),
                }
            }
            Request::Nft { command } => self.nft(&command),
            Request::NftFile { path } => self.nft_file(&path),
            Request::SetList { set } => {
                let st = self.state.lock().unwrap_or_else(|e| e.into_inner());
                let Some(p) = &st.compiled else {
                    return Ok(json!({"ok": true, "sets": []}));
                };
                let now_ms = dataplane::now_ns(self.epoch) / 1_000_000;
                let names: Vec<String> = p
                    .dynamic_sets()
                    .filter(|n| match set.as_deref() {
                        None => true,
                        Some(s) => *n == s || n.ends_with(&format!(" {s}")),
                    })
                    .map(str::to_string)
                    .collect();
                if let (Some(s), true) = (&set, names.is_empty()) {
                    return Err(CtlFailure::bad(format!(
                        "no dynamic set '{s}' in use (dynamic sets: {})",
                        p.dynamic_sets().collect::<Vec<_>>().join(", ")
                    )));
                }
                let sets: Vec<Value> = names
                    .iter()
                    .map(|n| {
                        let elems = p.dynamic_set_elements(n, now_ms).unwrap_or_default();
                        let list: Vec<Value> = elems
                            .iter()
                            .map(|e| {
                                json!({"key": p.format_set_key(n, &e.key),
                                       "expires_ms": e.expires_in_ms,
                                       "packets": e.packets, "bytes": e.bytes,
                                       "connections": e.connections})
                            })
                            .collect();
                        json!({"set": n, "count": list.len(), "elements": list})
                    })
                    .collect();
                Ok(json!({"ok": true, "sets": sets}))
            }
            Request::ObjectList { kind, name, reset } => {
                let kind = match kind.as_deref() {
                    None => None,
                    Some("counter") => Some(sluice_ruleset::ast::ObjKind::Counter),
                    Some("quota") => Some(sluice_ruleset::ast::ObjKind::Quota),
                    Some("limit") => Some(sluice_ruleset::ast::ObjKind::Limit),
                    Some(k) => {
                        return Err(CtlFailure::bad(format!(
                            "object kind '{k}': expected 'counter', 'quota' or 'limit'"
                        )))
                    }
                };
                let st = self.state.lock().unwrap_or_else(|e| e.into_inner());
                let Some(p) = &st.compiled else {
                    return Ok(json!({"ok": true, "objects": []}));
                };
                let list = if reset {
                    p.reset_objects(kind, name.as_deref())
                } else {
                    p.objects(kind, name.as_deref())
                };
                if let (Some(n), true) = (&name, list.is_empty()) {
                    let what = kind.map_or("counter or quota", |k| k.name());
                    return Err(CtlFailure::bad(format!("no {what} '{n}' in the rule set")));
                }
                let objects: Vec<Value> = list.iter().map(object_json).collect();
                Ok(json!({"ok": true, "objects": objects}))
            }
            Request::RuleList { chain } => {
                let st = self.state.lock().unwrap_or_else(|e| e.into_inner());
                let Some(p) = &st.compiled else {
                    return Ok(json!({"ok": true, "rules": []}));
                };
                let rules: Vec<Value> = p
                    .list_rules()
                    .into_iter()
                    .filter(|r| match chain.as_deref() {
                        None => true,
                        Some(c) => r.chain == c || r.chain.ends_with(&format!(" {c}")),
                    })
                    .map(|r| {
                        let mut v = json!({"handle": r.handle, "chain": r.chain, "rule": r.text,
                                           "location": r.location});
                        if let Some((p, b)) = r.counter {
                            v["packets"] = json!(p);
                            v["bytes"] = json!(b);
                        }
                        v
                    })
                    .collect();
                Ok(json!({"ok": true, "count": rules.len(), "rules": rules}))
            }
        }
    }

    /// The running compiled rule set, or why there is none to change.
    fn changeable(st: &Published) -> Result<Arc<sluice_policy::CompiledPolicy>, CtlFailure> {
        st.compiled.clone().ok_or_else(|| CtlFailure {
            kind: "ruleset",
            message: "the gateway runs the built-in policy; load an nft rule set (ruleset \
                      replace, or `ruleset` in the config) before changing rules"
                .into(),
        })
    }

    /// Publishes `next` by atomic swap as the running rule set.
    fn publish_change(
        &self,
        st: &mut Published,
        source: &str,
        next: sluice_policy::CompiledPolicy,
    ) -> Result<(), CtlFailure> {
        // A rule with a new `snat to` adds a pool.
        let pools = &next.nat_config().pools;
        if let Some(f) = pools_refusal(source, pools, st) {
            return Err(f);
        }
        if let Err(m) = masquerade_ports_fit(&st.config, &next) {
            return Err(CtlFailure {
                kind: "ruleset",
                message: format!("{source}: {m} (running ruleset kept)"),
            });
        }
        if *pools != st.pools {
            tracing::info!(pools = pools.len(), "NAT pools replaced");
            worker_nat(&st.config, pools).note_ranges(&mut st.seen);
            st.pools = pools.clone();
        }
        // Elements added with a timeout count it from now.
        next.start_timers(dataplane::now_ns(self.epoch) / 1_000_000);
        let next = Arc::new(next);
        st.generation = self.retire(self.policy.publish(Arc::clone(&next) as Arc<dyn Policy>));
        st.rules = next.rule_count();
        st.compiled = Some(next);
        st.updates += 1;
        Ok(())
    }

    /// `sluice ctl nft -f FILE`: every command of the file applied to the
    /// generation the ones before it made, then published once; on a
    /// failing line nothing is published and the error names the line.
    fn nft_file(&self, path: &str) -> Result<Value, CtlFailure> {
        let t0 = Instant::now();
        let text = std::fs::read_to_string(path).map_err(|e| CtlFailure {
            kind: "ruleset",
            message: format!("{path}: {e}"),
        })?;
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let cur = Self::changeable(&st)?;
        let mut next: Option<sluice_policy::CompiledPolicy> = None;
        let mut handles = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let cmd = line.trim();
            if cmd.is_empty() || cmd.starts_with('#') {
                continue;
            }
            let at = format!("{path}:{}", i + 1);
            let base = next.as_ref().unwrap_or(&cur);
            let (n, applied) = base.apply_text(&at, cmd).map_err(|e| CtlFailure {
                kind: "ruleset",
                message: format!("{at}: {e} (nothing applied)"),
            })?;
            handles.push(applied.handle);
            next = Some(n);
        }
        let Some(next) = next else {
            return Err(CtlFailure::bad(format!("{path}: no command in the file")));
        };
        self.publish_change(&mut st, path, next)?;
        let us = t0.elapsed().as_secs_f64() * 1e6;
        tracing::debug!(
            path,
            commands = handles.len(),
            generation = st.generation,
            us,
            "rule set updated from a file"
        );
        Ok(
            json!({"ok": true, "generation": st.generation, "applied": handles.len(),
                  "handles": handles, "rules": st.rules, "apply_us": us}),
        )
    }

    /// One nft control command (`add rule`, `insert rule`, `delete rule`,
    /// `add element`, `delete element`), applied incrementally and
    /// published by atomic swap. A refused command changes nothing.
    fn nft(&self, command: &str) -> Result<Value, CtlFailure> {
        let t0 = Instant::now();
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let cur = Self::changeable(&st)?;
        let (next, applied) = cur.apply_text("command", command).map_err(|e| CtlFailure {
            kind: "ruleset",
            message: e.to_string(),
        })?;
        self.publish_change(&mut st, "command", next)?;
        let us = t0.elapsed().as_secs_f64() * 1e6;
        tracing::debug!(command, generation = st.generation, us, "rule set updated");
        Ok(
            json!({"ok": true, "generation": st.generation, "handle": applied.handle,
                  "ir_rules": applied.ir_rules, "relowered": applied.relowered,
                  "rules": st.rules, "apply_us": us}),
        )
    }
}

/// One named object as `sluice ctl counter|quota list` shows it.
fn object_json(o: &sluice_policy::ListedObject) -> Value {
    use sluice_ruleset::ast::ObjState;
    match o.state {
        ObjState::Counter { packets, bytes } => {
            json!({"counter": o.name, "packets": packets, "bytes": bytes})
        }
        ObjState::Quota(q) => json!({
            "quota": o.name,
            "bytes": q.bytes(),
            "over": q.over,
            "used": q.used_bytes(),
            // Whether the quota's rules match now: `over` ones once the
            // bytes are used up, the others until then.
            "exceeded": q.used_bytes() > q.bytes(),
        }),
        ObjState::Limit(l) => {
            let rule = sluice_ruleset::ast::Rule {
                matches: Vec::new(),
                stmts: vec![sluice_ruleset::ast::Stmt {
                    kind: sluice_ruleset::ast::StmtKind::Limit(l),
                    span: Default::default(),
                }],
                handle: None,
                comment: None,
                span: Default::default(),
            };
            let text = sluice_ruleset::rule_to_string(&rule);
            let rate = text.strip_prefix("limit ").unwrap_or(&text);
            json!({"limit": o.name, "rate": rate})
        }
    }
}

fn counters_json(c: &sluice_engine::Counters) -> Value {
    let drops: serde_json::Map<String, Value> = sluice_engine::DropReason::ALL
        .iter()
        .map(|r| (r.name().to_string(), json!(c.drops_for(*r))))
        .collect();
    json!({"rx": c.rx, "tx": c.tx, "fast_path": c.fast_path, "slow_path": c.slow_path,
           "ct_created": c.ct_created, "local": c.local, "icmp_errors": c.icmp_errors,
           "icmp_errors_limited": c.icmp_errors_limited, "tcp_resets": c.tcp_resets,
           "handed_off": c.handed_off,
           "fragmented": c.fragmented,
           "untracked": c.untracked,
           "drops_total": c.total_drops(),
           "drops": drops})
}

/// The NAT counters of every worker, summed, and per worker.
fn nat_json(ws: &[WorkerStatus]) -> Value {
    let one = |n: &sluice_nat::NatStats| {
        json!({"mappings": n.mappings, "sessions": n.sessions, "subscribers": n.subscribers,
               "mappings_created": n.mappings_created, "mappings_removed": n.mappings_removed,
               "pool_exhausted": n.pool_exhausted, "subscriber_limit": n.subscriber_limit,
               "filtered": n.filtered, "hairpins": n.hairpins, "blocks": n.blocks,
               "blocks_allocated": n.blocks_allocated, "blocks_released": n.blocks_released,
               "block_limit": n.block_limit, "outside_prefix": n.outside_prefix,
               "retired": n.retired})
    };
    let mut t = sluice_nat::NatStats::default();
    for w in ws {
        t.merge(&w.nat);
    }
    let mut v = one(&t);
    v["pools_refused"] = json!(ws.iter().map(|w| w.nat_pools_refused).sum::<u64>());
    // Per pool address (every worker lists the same ones), the workers'
    // shares summed.
    let addrs = ws.first().map_or(&[][..], |w| &w.pools[..]);
    v["pools"] = json!(addrs
        .iter()
        .map(|p| {
            let shares: Vec<_> = ws
                .iter()
                .filter_map(|w| w.pools.iter().find(|q| q.addr == p.addr))
                .collect();
            let free = |i: usize| shares.iter().map(|q| q.free[i]).sum::<u64>();
            let mut a = json!({"addr": p.addr.to_string(),
                   "ports": shares.iter().map(|q| q.ports).sum::<u64>(),
                   "free": {"tcp": free(0), "udp": free(1), "icmp": free(2)}});
            if p.blocks.is_some() {
                let (f, n) = shares
                    .iter()
                    .filter_map(|q| q.blocks)
                    .fold((0, 0), |(f, n), (a, b)| (f + a, n + b));
                a["blocks"] = json!({"free": f, "total": n});
            }
            a
        })
        .collect::<Vec<_>>());
    v["workers"] = json!(ws.iter().map(|w| one(&w.nat)).collect::<Vec<_>>());
    v
}

fn worker_json(w: &WorkerStatus) -> Value {
    json!({"worker": w.worker, "connections": w.connections, "ports": w.ports,
           "neighbors": w.neighbors, "arp_pending": w.arp_pending,
           "neighbors6": w.neighbors6, "ndp_pending": w.ndp_pending,
           "connections6": w.connections6, "ct_early_drops": w.ct_early_drops,
           "ct_max": w.ct_max[0], "ct_max6": w.ct_max[1],
           "ct_capacity": w.ct_capacity[0], "ct_capacity6": w.ct_capacity[1],
           "arp_dropped": w.arp_dropped, "tx_dropped": w.tx_dropped,
           "handoff_dropped": w.handoff_dropped, "offload": w.offload,
           "scheduler": w.scheduler, "nat_mappings": w.nat.mappings,
           "nat_retired": w.nat.retired,
           "drops_total": w.counters.total_drops()})
}

/// How a worker's share of an interface is chosen with several workers
/// (see [`sluice_io::steer`]): outside interfaces by destination port (a
/// NAT reply reaches the worker owning its external port), inside ones by
/// source port (every flow of one internal endpoint stays on one worker,
/// and an untranslated reply meets its connection).
pub fn steer_for(role: Option<config::Role>, workers: u16) -> sluice_io::steer::Steer {
    use sluice_io::steer::SteerKey;
    sluice_io::steer::Steer {
        key: match role {
            Some(config::Role::Outside) => SteerKey::Destination,
            Some(config::Role::Inside) => SteerKey::Source,
            None => SteerKey::Symmetric,
        },
        workers,
    }
}

/// The combinations several workers cannot steer, each named at `warn`
/// once at start.
fn warn_unsteered(cfg: &config::Config) {
    let n = cfg.workers;
    if n <= 1 || cfg.backend == config::BackendChoice::Mem {
        return;
    }
    for role in [config::Role::Inside, config::Role::Outside] {
        let same: Vec<&str> = cfg
            .interfaces
            .iter()
            .filter(|i| i.role == Some(role))
            .map(|i| i.name.as_str())
            .collect();
        if same.len() > 1 {
            tracing::warn!(
                workers = n,
                interfaces = ?same,
                "interfaces share one role: with several workers a connection forwarded between \
                 two of them is steered by a different port in each direction and can be split \
                 between workers (its replies then miss the connection)"
            );
        }
    }
}

/// The NAT configuration the workers run: `cfg`'s `[nat]` settings with
/// `pools`.
fn worker_nat(cfg: &Config, pools: &[sluice_nat::Pool]) -> sluice_nat::NatConfig {
    let mut nat = cfg.nat.clone();
    nat.pools = pools.to_vec();
    nat.workers = cfg.workers;
    nat
}

/// The engine configuration of worker `id`.
fn engine_config(
    cfg: &Config,
    macs: &[[u8; 6]],
    mtus: &[u16],
    pools: &[sluice_nat::Pool],
    id: u16,
) -> EngineConfig {
    let mut interfaces = vec![Interface {
        name: "-".into(),
        mac: [0; 6],
        addrs: Vec::new(),
        mtu: Interface::DEFAULT_MTU,
    }];
    for (i, ifc) in cfg.interfaces.iter().enumerate() {
        interfaces.push(Interface {
            name: ifc.name.clone(),
            mac: macs.get(i).copied().unwrap_or_default(),
            addrs: ifc.addrs.clone(),
            mtu: mtus.get(i).copied().unwrap_or(Interface::DEFAULT_MTU),
        });
    }
    let nat = worker_nat(cfg, pools);
    EngineConfig {
        interfaces,
        routes: engine_routes(cfg),
        neighbors: cfg.neighbors.clone(),
        addrs6: engine_addrs6(cfg),
        routes6: engine_routes6(cfg),
        neighbors6: cfg
            .neighbors6
            .iter()
            .map(|&(dev, ip, mac)| ((dev + 1) as u16, ip, mac))
            .collect(),
        worker: id,
        workers: cfg.workers,
        // Engine interface k + 1 is config interface k.
        steered_by_source: cfg
            .interfaces
            .iter()
            .enumerate()
            .filter(|(_, i)| i.role == Some(config::Role::Inside))
            .map(|(k, _)| (k + 1) as sluice_engine::IfIndex)
            .collect(),
        seed: random_seed(),
        nat,
        ..conntrack_engine_config(cfg)
    }
}

fn engine_routes(cfg: &Config) -> Vec<Route4> {
    cfg.routes
        .iter()
        .map(|r| Route4 {
            net: u32::from(r.net),
            len: r.len,
            oif: (r.dev + 1) as u16,
            via: r.via,
        })
        .collect()
}

fn engine_addrs6(cfg: &Config) -> Vec<(u16, core::net::Ipv6Addr, u8)> {
    cfg.interfaces
        .iter()
        .enumerate()
        .flat_map(|(i, ifc)| ifc.addrs6.iter().map(move |&(a, l)| ((i + 1) as u16, a, l)))
        .collect()
}

fn engine_routes6(cfg: &Config) -> Vec<Route6> {
    cfg.routes6
        .iter()
        .map(|r| Route6 {
            net: u128::from(r.net),
            len: r.len,
            oif: (r.dev + 1) as u16,
            via: r.via,
        })
        .collect()
}

/// A hash seed from the std hasher's per-process random keys (no unsafe, no
/// extra dependency).
fn random_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(std::process::id().into());
    h.finish()
}

/// Removes the control socket file on drop.
struct SocketFile(PathBuf);

impl Drop for SocketFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// `sluice run -c FILE`: run the gateway until SIGTERM/SIGINT (or
/// `opts.stop`). Returns after a clean shutdown.
pub fn run(config_path: &Path, opts: &RunOptions) -> Result<(), RunError> {
    let mut cfg = config::load(config_path)?;
    if let Some(b) = opts.backend {
        cfg.backend = b;
    }
    if let Some(c) = &opts.capture {
        cfg.capture = Some(c.clone());
    }
    if let Some(s) = &opts.control_socket {
        cfg.control_socket = s.clone();
    }
    // Before the first rule set is compiled, so that it too takes its
    // memory from the reserve.
    reserve_heap(cfg.heap_reserve_mib)?;
    if let Some(refusal) = conntrack_refusal(
        &cfg,
        conntrack_start_bytes(&cfg) + offload_start_bytes(&cfg),
        sluice_io::alloc::available_memory(),
    ) {
        return Err(RunError::Os(refusal));
    }
    let lp = load_policy(&cfg, None)?;
    tracing::info!(ruleset = %lp.source, rules = lp.rules, "policy compiled");

    // Signals first, so a SIGTERM during start-up is not lost.
    let mut signals = signal_hook::iterator::Signals::new([
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGHUP,
    ])
    .map_err(|e| RunError::Os(format!("signal handlers: {e}")))?;

    // MACs and MTUs: configured, else the kernel's.
    let mut macs = Vec::new();
    let mut mtus = Vec::new();
    for ifc in &cfg.interfaces {
        let (kmac, kmtu) = if cfg.backend == config::BackendChoice::Mem {
            // In-memory ports: a locally administered address, Ethernet's MTU.
            ([0x02, 0x53, 0x4c, 0, 0, macs.len() as u8 + 1], 1500)
        } else {
            interface_link(&ifc.name).map_err(|reason| RunError::Interface {
                name: ifc.name.clone(),
                reason,
            })?
        };
        let mtu = match ifc.mtu {
            Some(m) => {
                if m > kmtu {
                    tracing::warn!(interface = %ifc.name, mtu = m, kernel_mtu = kmtu,
                        "configured mtu is above the interface's: the kernel may drop larger frames");
                }
                m
            }
            None => kmtu.clamp(config::MIN_MTU, config::MAX_MTU),
        };
        macs.push(ifc.mac.unwrap_or(kmac));
        mtus.push(mtu);
    }

    // Engines first (they validate routes and NAT), then ports.
    let stop = opts
        .stop
        .clone()
        .unwrap_or_else(|| Arc::new(AtomicBool::new(false)));
    let epoch = Instant::now();
    // The wall clock at `now_ns`'s zero, for the rule set's `meta time`,
    // `day` and `hour` (`now_ns` starts at 1 s).
    let wall_offset_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .saturating_sub(1000);
    // A worker priority the process may not use is refused here, before
    // any interface is touched, not found out by a worker.
    if let Some(p) = cfg.worker_priority {
        sluice_io::sched::check_fifo(p).map_err(|e| {
            RunError::Os(format!(
                "worker_priority = {p}: {e} (SCHED_FIFO needs CAP_SYS_NICE and a real-time \
                 budget in the process's cgroup; remove worker_priority to run workers at \
                 ordinary priority)"
            ))
        })?;
    }
    let cores = if opts.no_pin {
        None
    } else {
        core_affinity::get_core_ids()
    };
    // One gateway per interface: a second one on the same interfaces (a
    // double start, two configurations naming one port) would split or
    // steal its frames. Held until the process ends, crash included.
    let _owner_locks = if cfg.backend == config::BackendChoice::Mem {
        Vec::new()
    } else {
        lock_interfaces(&cfg.interfaces, Path::new(LOCK_DIR))?
    };
    let names: Vec<&str> = cfg.interfaces.iter().map(|i| i.name.as_str()).collect();
    let ingress = if cfg.backend == config::BackendChoice::Mem {
        None
    } else {
        Some(sluice_io::nft::IngressDrop::install(&names).map_err(RunError::IngressDrop)?)
    };
    if let Some(c) = &lp.compiled {
        c.start_timers(dataplane::now_ns(epoch) / 1_000_000);
    }
    let cell = Arc::new(dataplane::PolicyCell::new(Arc::clone(&lp.policy)));
    // Bound before anything starts, so that a taken port is a start error.
    let metrics_listener = bind_metrics(cfg.metrics_listen).map_err(|e| RunError::Os(e.message))?;
    let (metrics_moves, metrics_rx) = std::sync::mpsc::channel();
    let nat_logger = match &cfg.nat_log {
        Some(c) => {
            Some(natlog::NatLogger::start(c, cfg.nat.port_block_size).map_err(RunError::Os)?)
        }
        None => None,
    };
    // The mem backend's wire sides, kept open while the gateway runs.
    let mut mem_peers = Vec::new();
    let fanout_base = (std::process::id() as u16).wrapping_mul(8);
    warn_unsteered(&cfg);
    // Both AF_XDP (a steering XDP program in front of one socket per worker
    // on each queue) and AF_PACKET (a steering cBPF fanout program) send
    // each frame to the worker that owns it.
    let io_backend = cfg.backend.io();
    // With several workers every worker binds the same queue of each
    // interface, so they share one UMEM (the kernel wants one buffer pool
    // per queue); with one worker it has a UMEM of its own, as before.
    // One offload map for every worker and port.
    let offload = if cfg.xdp_offload {
        let (max, max6) = offload_directions(&cfg);
        let t = sluice_io::XdpOffload::new(max, max6)
            .map_err(|e| RunError::Os(format!("XDP offload table: {e}")))?;
        tracing::info!(
            slots = t.slots(),
            slots_v6 = t.slots6(),
            mib = t.bytes() >> 20,
            "XDP offload tables"
        );
        Some(t)
    } else {
        None
    };
    // Kernel ifindex of engine interface `i` (0: none).
    let mut offload_ifindex = vec![0u32];
    if offload.is_some() {
        for ifc in &cfg.interfaces {
            if sluice_io::afxdp::offload::driver(&ifc.name).as_deref() == Some("veth") {
                tracing::warn!(
                    interface = %ifc.name,
                    "xdp_offload on a veth: its peer must have GRO on (ethtool -K PEER gro on) \
                     or an XDP program, or the offloaded flows it sends are dropped"
                );
            }
            offload_ifindex.push(sluice_io::afxdp::offload::ifindex(&ifc.name).map_err(|e| {
                RunError::Interface {
                    name: ifc.name.clone(),
                    reason: e.to_string(),
                }
            })?);
        }
    }

    let plan = PortPlan {
        interfaces: cfg.interfaces.clone(),
        backend: io_backend,
        workers: cfg.workers,
        af_packet_rx: cfg.af_packet_rx,
        fanout_base,
        offload: offload.clone(),
        capture: cfg.capture.clone(),
    };
    let umems = plan.umems();

    // The interfaces' link state, watched from here on (not for in-memory
    // ports, which have no kernel interface).
    let links = Arc::new(dataplane::Links::new(cfg.interfaces.len()));
    let cfg_backend = cfg.backend;
    let mut link_names: Vec<(String, Option<u32>)> = cfg
        .interfaces
        .iter()
        .map(|i| {
            let idx = (cfg_backend != config::BackendChoice::Mem)
                .then(|| sluice_io::afxdp::offload::ifindex(&i.name).ok())
                .flatten();
            (i.name.clone(), idx)
        })
        .collect();
    let mut reopening = std::collections::BTreeSet::new();
    if cfg_backend != config::BackendChoice::Mem {
        watch_link_states(&mut link_names, &links, &reopening, &Default::default());
    }

    // The connections a previous run saved (`state_file`), by worker; and
    // where this run saves its own when it stops (a reload that changes
    // the path is taken at the next start).
    let mut carried = load_state(&cfg);
    let state_path = cfg.state_file.clone();
    let mut threads = Vec::new();
    let mut senders = Vec::new();
    let mut receivers = Vec::new();
    for _ in 0..cfg.workers {
        let (tx, rx) = mpsc::sync_channel(CMD_QUEUE);
        senders.push(tx);
        receivers.push(rx);
    }
    let (hand_tx, hand_rx): (Vec<_>, Vec<_>) = (0..cfg.workers)
        .map(|_| mpsc::sync_channel(dataplane::HANDOFF_QUEUE))
        .unzip();
    let mut hand_rx = hand_rx.into_iter();
    for (id, rx) in (0..cfg.workers).zip(receivers) {
        let mut ecfg = engine_config(&cfg, &macs, &mtus, &lp.pools, id);
        ecfg.wall_offset_ms = wall_offset_ms;
        // Without a NAT log the engine only counts its events.
        ecfg.nat_log_capacity = if nat_logger.is_some() {
            natlog::RING_EVENTS
        } else {
            0
        };
        if offload.is_some() {
            ecfg.offload_queue = OFFLOAD_QUEUE;
        }
        let mut engine = Worker::new(ecfg, Arc::clone(&lp.policy))?;
        if let Some((from, conns)) = carried.resteer.take() {
            place_saved(&engine, &cfg, from, conns, &mut carried.by_worker);
        }
        if let Some(conns) = carried.by_worker.get_mut(usize::from(id)) {
            restore_worker(&mut engine, id, std::mem::take(conns), epoch);
        }
        let mut ports: Vec<Box<dyn Port>> = Vec::new();
        let umem = umems.get(usize::from(id)).cloned().flatten();
        for k in 0..cfg.interfaces.len() {
            ports.push(plan.open(id, k, umem.clone(), &mut mem_peers, false)?);
        }
        let mut nifs = vec![neigh::NeighIface {
            mac: [0; 6],
            addrs: Vec::new(),
        }];
        for (i, ifc) in cfg.interfaces.iter().enumerate() {
            nifs.push(neigh::NeighIface {
                mac: macs.get(i).copied().unwrap_or_default(),
                addrs: ifc.addrs.clone(),
            });
        }
        let mut resolver = neigh::Resolver::new(nifs, &engine_routes(&cfg));
        for &(ip, mac) in &cfg.neighbors {
            resolver.set_known(ip, mac);
        }
        let mut nifs6 = vec![neigh6::Iface6::default()];
        for (i, ifc) in cfg.interfaces.iter().enumerate() {
            nifs6.push(neigh6::Iface6 {
                mac: macs.get(i).copied().unwrap_or_default(),
                addrs: ifc.addrs6.clone(),
            });
        }
        let mut resolver6 = neigh6::Resolver6::new(nifs6, &engine_routes6(&cfg));
        for &(dev, ip, mac) in &cfg.neighbors6 {
            resolver6.set_known(0, (dev + 1) as u16, ip, mac, neigh6::Origin::Static);
        }
        let peers = senders
            .iter()
            .enumerate()
            .filter(|&(j, _)| j != usize::from(id))
            .map(|(_, s)| s.clone())
            .collect();
        let wt = WorkerThread {
            id,
            save_state: cfg.state_file.is_some(),
            engine,
            ports,
            resolver,
            resolver6,
            commands: rx,
            peers,
            handoff: dataplane::Handoff::new(
                hand_rx
                    .next()
                    .ok_or_else(|| RunError::Os("handoff channel missing".into()))?,
                hand_tx.clone(),
            ),
            stop: Arc::clone(&stop),
            epoch,
            core: cores
                .as_ref()
                .and_then(|c| c.get(usize::from(id) % c.len().max(1)).copied()),
            priority: cfg.worker_priority,
            policy: Arc::clone(&cell),
            policy_generation: cell.generation(),
            offload: offload.as_ref().map(|m| dataplane::OffloadLink {
                map: Arc::clone(m),
                ifindex: offload_ifindex.clone(),
                now_ns: 0,
                seen: Default::default(),
                seen6: Default::default(),
                status: Default::default(),
            }),
            nat_log: nat_logger.as_ref().map(|l| l.handle().link()),
            links: Arc::clone(&links),
            ports_changed: false,
            walks: Default::default(),
        };
        let h = std::thread::Builder::new()
            .name(format!("sluice-w{id}"))
            .spawn(move || wt.run())
            .map_err(|e| RunError::Os(format!("spawn worker: {e}")))?;
        threads.push(h);
    }

    // The ports hold their UMEMs; once the ports go (an interface came
    // back and they were opened again on new ones), so does the memory.
    drop(umems);
    // The restored connections hold their `ct timeout` slots now; from
    // here on a slot no rule set names and no connection follows may take
    // another policy, the workers telling which they follow.
    drop(std::mem::take(&mut carried.leases));
    let holders = senders.clone();
    sluice_engine::ct_timeout::set_holders(move || ct_timeouts_held(&holders));

    // Control socket.
    let sock = cfg.control_socket.clone();
    if sock.exists() {
        // A stale socket from a crashed run: refuse if something answers.
        if std::os::unix::net::UnixStream::connect(&sock).is_ok() {
            stop.store(true, Ordering::Relaxed);
            join_all(threads);
            return Err(RunError::Socket {
                path: sock.display().to_string(),
                reason: "another daemon is listening".into(),
            });
        }
        let _ = std::fs::remove_file(&sock);
    }
    let listener = match sluice_io::unixsock::bind_with_mode(
        &sock,
        cfg.control_socket_mode,
        cfg.control_socket_group,
    ) {
        Ok(l) => l,
        Err(e) => {
            stop.store(true, Ordering::Relaxed);
            join_all(threads);
            return Err(RunError::Socket {
                path: sock.display().to_string(),
                reason: e.to_string(),
            });
        }
    };
    let sock_guard = SocketFile(sock.clone());
    let control = Arc::new(Control {
        started: Instant::now(),
        epoch,
        config_path: config_path.to_path_buf(),
        workers: senders,
        state: Mutex::new(Published {
            source: lp.source.clone(),
            rules: lp.rules,
            pools: lp.pools.clone(),
            seen: {
                let mut seen = sluice_nat::SeenRanges::new();
                worker_nat(&cfg, &lp.pools).note_ranges(&mut seen);
                seen
            },
            generation: cell.generation(),
            config: cfg,
            compiled: lp.compiled.clone(),
            updates: 0,
        }),
        policy: cell,
        retired: Mutex::new(Vec::new()),
        nat_log: nat_logger.as_ref().map(natlog::NatLogger::handle),
        links: Arc::clone(&links),
        reloads: ReloadStats::new(),
        metrics_moves,
    });
    // From here the cell, the workers and `Published` hold the policy; a
    // reference kept here would pin the start-up rule set in memory after
    // the first replace.
    drop(lp);
    tracing::info!(socket = %sock.display(), "running");

    let ctl_stop = Arc::clone(&stop);
    let ctl_control = Arc::clone(&control);
    let ctl_thread = std::thread::Builder::new()
        .name("sluice-ctl".into())
        .spawn(move || ctl::serve(listener, &ctl_stop, &|r| ctl_control.handle(r)))
        .map_err(|e| RunError::Os(format!("spawn control thread: {e}")))?;

    // Always running, so that a reload may set `metrics_listen` too.
    let metrics_thread = {
        let (st, c) = (Arc::clone(&stop), Arc::clone(&control));
        if let Some(l) = &metrics_listener {
            tracing::info!(listen = ?l.local_addr().ok(), "metrics");
        }
        Some(
            std::thread::Builder::new()
                .name("sluice-metrics".into())
                .spawn(move || {
                    metrics::serve(metrics_listener, &metrics_rx, &st, &|| c.metrics().ok())
                })
                .map_err(|e| RunError::Os(format!("spawn metrics thread: {e}")))?,
        )
    };

    let handle = signals.handle();
    let watch_links = cfg_backend != config::BackendChoice::Mem;
    let mut last_links = Instant::now();
    // Re-opening the ports of interfaces that came back: when to try again
    // after a failure, and how long to wait after the next one.
    let mut retry_at: Option<Instant> = None;
    let mut backoff = REOPEN_RETRY_MIN;
    while !stop.load(Ordering::Relaxed) {
        if watch_links && last_links.elapsed() >= LINK_POLL {
            last_links = Instant::now();
            let none = std::collections::BTreeSet::new();
            let back = watch_link_states(&mut link_names, &links, &reopening, &none);
            if !back.is_empty() {
                reopening.extend(back);
                retry_at = None;
            }
            if !reopening.is_empty() && retry_at.is_none_or(|t| Instant::now() >= t) {
                let tried = std::mem::take(&mut reopening);
                reopening = reattach(&plan, &tried, &control, ingress.as_ref());
                let opened: std::collections::BTreeSet<usize> =
                    tried.difference(&reopening).copied().collect();
                for &k in &opened {
                    links.count_reopen(k);
                }
                if reopening.is_empty() {
                    backoff = REOPEN_RETRY_MIN;
                    retry_at = None;
                } else {
                    tracing::warn!(
                        retry_in_s = backoff.as_secs(),
                        "ports not opened again; trying again later"
                    );
                    retry_at = Some(Instant::now() + backoff);
                    backoff = (backoff * 2).min(REOPEN_RETRY_MAX);
                }
                // Up or down now, for the engine.
                watch_link_states(&mut link_names, &links, &reopening, &opened);
            }
        }
        for sig in signals.pending() {
            match sig {
                signal_hook::consts::SIGHUP => match control.reload() {
                    Ok(v) => tracing::info!("reload: {v}"),
                    Err(f) => {
                        tracing::error!("reload failed, running configuration kept: {}", f.message)
                    }
                },
                _ => {
                    tracing::info!(signal = sig, "shutting down");
                    stop.store(true, Ordering::Relaxed);
                }
            }
        }
        control.reap();
        std::thread::sleep(Duration::from_millis(50));
    }
    handle.close();
    stop.store(true, Ordering::Relaxed);
    let saved = join_all(threads);
    if let Some(path) = &state_path {
        save_state(path, &saved);
    }
    // The workers drained their rings as they stopped.
    if let Some(l) = nat_logger {
        l.stop();
    }
    ctl::wake(&sock);
    let _ = ctl_thread.join();
    if let Some(t) = metrics_thread {
        let _ = t.join();
    }
    drop(sock_guard);
    if let Some(Err(e)) = ingress.map(|i| i.remove()) {
        tracing::warn!("removing the nft ingress drop: {e}");
    }
    drop(mem_peers);
    tracing::info!("stopped");
    Ok(())
}

/// What each worker thread gave when it stopped (see
/// [`WorkerThread::run`]), in worker order; `None` for one that panicked or
/// saved nothing.
fn join_all(threads: Vec<std::thread::JoinHandle<Option<Carry>>>) -> Vec<Option<Carry>> {
    threads
        .into_iter()
        .map(|t| {
            t.join().unwrap_or_else(|_| {
                tracing::error!("a worker thread panicked");
                None
            })
        })
        .collect()
}

/// A worker's connections for a restart.
type Carry = Vec<sluice_engine::SavedConn>;

/// Now, ms since 1970-01-01 UTC (0 if the clock is before it).
fn wall_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// `c` as it is `ms` later: that much less time left (none: expired).
fn aged(mut c: sluice_engine::SavedConn, ms: u64) -> sluice_engine::SavedConn {
    let (sluice_engine::SavedConn::V4 { carried, .. }
    | sluice_engine::SavedConn::V6 { carried, .. }) = &mut c;
    let left = u64::from(carried.expires_in_ms).saturating_sub(ms);
    carried.expires_in_ms = u32::try_from(left).unwrap_or(u32::MAX);
    c
}

/// The connections a previous run saved to `state_file`, by worker; the
/// file is removed once read (it describes that run's last moment only).
/// A file that cannot be read or is refused is kept, renamed
/// `FILE.refused`, and the gateway starts without its connections: a
/// restart must not fail over them.
fn load_state(cfg: &Config) -> SavedState {
    let mut saved = SavedState {
        by_worker: vec![Vec::new(); usize::from(cfg.workers)],
        ..SavedState::default()
    };
    let Some(path) = &cfg.state_file else {
        return saved;
    };
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            tracing::info!(path = %path.display(), "no saved connections");
            return saved;
        }
        Err(e) => {
            tracing::error!(path = %path.display(), "saved connections not read: {e}");
            return saved;
        }
    };
    let refuse = |why: String| {
        let kept = path.with_extension("refused");
        let _ = std::fs::rename(path, &kept);
        tracing::error!(
            path = %path.display(),
            kept = %kept.display(),
            "saved connections not restored: {why}"
        );
    };
    match state::decode(&bytes) {
        Err(e) => refuse(e.to_string()),
        Ok(s) => {
            // The time the gateway was down counts against each
            // connection's time left, as it would have on a running one
            // (a clock set back counts as none).
            let down = wall_ms().saturating_sub(s.saved_at_ms);
            tracing::info!(
                path = %path.display(),
                connections = s.conns.len(),
                saved_ms_ago = down,
                "saved connections read"
            );
            // The file's timeout policies take this process's slots, held
            // until the workers have taken the connections back.
            let slots: Vec<u8> = s
                .policies
                .iter()
                .map(|p| match sluice_engine::ct_timeout::intern(*p) {
                    Ok(l) => {
                        let slot = l.slot();
                        saved.leases.push(l);
                        slot
                    }
                    Err(e) => {
                        tracing::warn!("a saved connection's timeout policy not restored: {e}");
                        0
                    }
                })
                .collect();
            for (w, mut c) in s.conns {
                let carried = match &mut c {
                    sluice_engine::SavedConn::V4 { carried, .. }
                    | sluice_engine::SavedConn::V6 { carried, .. } => carried,
                };
                carried.timeout_policy = match carried.timeout_policy {
                    0 => 0,
                    n => slots.get(usize::from(n) - 1).copied().unwrap_or(0),
                };
                let c = aged(c, down);
                if s.workers != cfg.workers {
                    saved
                        .resteer
                        .get_or_insert_with(|| (s.workers, Vec::new()))
                        .1
                        .push(c);
                } else if let Some(v) = saved.by_worker.get_mut(usize::from(w)) {
                    v.push(c);
                }
            }
            if let Err(e) = std::fs::remove_file(path) {
                tracing::warn!(path = %path.display(), "saved connections read, file not removed: {e}");
            }
        }
    }
    saved
}

/// The connections a previous run saved (`state_file`).
#[derive(Debug, Default, PartialEq, Eq)]
struct SavedState {
    /// By the worker that holds them: the one that saved them, when the
    /// gateway that saved them had as many workers.
    by_worker: Vec<Vec<sluice_engine::SavedConn>>,
    /// Saved by a gateway with another number of workers (that number and
    /// the connections): placed by this one's steering ([`place_saved`])
    /// before any worker takes its own.
    resteer: Option<(u16, Vec<sluice_engine::SavedConn>)>,
    /// The slots of their `ct timeout` policies, held until the workers
    /// have them (`sluice_engine::ct_timeout`).
    leases: Vec<sluice_engine::ct_timeout::Lease>,
}

/// Files the connections a gateway of `from` workers saved with the
/// worker of this one (`cfg.workers`) that its steering sends them to
/// (`Worker::home_of`, asked of `engine`, whose routes tell which
/// interface each end is behind), and logs how many went where and why
/// the others did not.
fn place_saved(
    engine: &Worker,
    cfg: &Config,
    from: u16,
    conns: Vec<sluice_engine::SavedConn>,
    by_worker: &mut [Vec<sluice_engine::SavedConn>],
) {
    // Engine interface k + 1 is config interface k.
    let steer = |i: sluice_engine::IfIndex| {
        let k = usize::from(i).checked_sub(1)?;
        cfg.interfaces
            .get(k)
            .map(|ifc| steer_for(ifc.role, cfg.workers))
    };
    let total = conns.len();
    let mut not_placed = std::collections::BTreeMap::<String, u64>::new();
    for c in conns {
        match engine.home_of(&c, steer) {
            Ok(w) => match by_worker.get_mut(usize::from(w)) {
                Some(v) => v.push(c),
                None => *not_placed.entry(format!("no worker {w}")).or_default() += 1,
            },
            Err(e) => *not_placed.entry(e.to_string()).or_default() += 1,
        }
    }
    let placed: Vec<usize> = by_worker.iter().map(Vec::len).collect();
    tracing::info!(
        saved_by_workers = from,
        workers = cfg.workers,
        connections = total,
        per_worker = ?placed,
        not_placed = ?not_placed,
        "saved connections placed by this gateway's steering"
    );
}

/// The `ct timeout` slots the connections of every worker follow
/// ([`Command::CtTimeoutsHeld`]); `None` when a worker does not answer
/// within [`CMD_TIMEOUT`] (then no slot is taken back).
fn ct_timeouts_held(workers: &[mpsc::SyncSender<Command>]) -> Option<[u64; 4]> {
    let mut rxs = Vec::new();
    for w in workers {
        let (tx, rx) = mpsc::channel();
        w.try_send(Command::CtTimeoutsHeld(tx)).ok()?;
        rxs.push(rx);
    }
    let mut held = [0u64; 4];
    for rx in rxs {
        let b = rx.recv_timeout(CMD_TIMEOUT).ok()?;
        for (h, x) in held.iter_mut().zip(b) {
            *h |= x;
        }
    }
    Some(held)
}

/// Give worker `id` the connections saved for it, before it sees traffic.
fn restore_worker(
    engine: &mut Worker,
    id: u16,
    mut conns: Vec<sluice_engine::SavedConn>,
    epoch: Instant,
) {
    let now = dataplane::now_ns(epoch);
    // Those that hold no NAT mapping on their destination side first: a
    // mapping such a session holds is made again by the sessions holding
    // it on their source side (`WorkerNat::restore_session`).
    conns.sort_by_key(|c| matches!(c, sluice_engine::SavedConn::V4 { held, .. } if held & 2 != 0));
    let (mut restored, mut why) = (0u64, std::collections::BTreeMap::<String, u64>::new());
    for c in &conns {
        match engine.restore(now, c) {
            Ok(()) => restored += 1,
            Err(e) => *why.entry(e.to_string()).or_default() += 1,
        }
    }
    if conns.is_empty() {
        return;
    }
    tracing::info!(worker = id, restored, not_restored = ?why, "connections restored");
}

/// Write the connections the workers gave (`state_file`): to `FILE.tmp`,
/// then renamed over `FILE`, so that a file is whole or absent.
fn save_state(path: &Path, saved: &[Option<Carry>]) {
    let mut conns = Vec::new();
    for (w, s) in saved.iter().enumerate() {
        let Some(c) = s else {
            continue;
        };
        let w = u16::try_from(w).unwrap_or(u16::MAX);
        conns.extend(c.iter().map(|c| (w, *c)));
    }
    // The connections' timeout policies, by this process's slot, go to
    // the file numbered from 1.
    let mut policies = Vec::new();
    let mut number = [0u8; 256];
    for (_, c) in &mut conns {
        let carried = match c {
            sluice_engine::SavedConn::V4 { carried, .. }
            | sluice_engine::SavedConn::V6 { carried, .. } => carried,
        };
        let slot = usize::from(carried.timeout_policy);
        if slot != 0 && number[slot] == 0 {
            if let Some(p) = sluice_engine::ct_timeout::get(carried.timeout_policy) {
                policies.push(p);
                number[slot] = u8::try_from(policies.len()).unwrap_or(0);
            }
        }
        carried.timeout_policy = number[slot];
    }
    let workers = u16::try_from(saved.len()).unwrap_or(u16::MAX);
    let bytes = state::encode(workers, wall_ms(), &policies, &conns);
    let tmp = path.with_extension("tmp");
    let r = std::fs::write(&tmp, &bytes).and_then(|()| std::fs::rename(&tmp, path));
    match r {
        Ok(()) => tracing::info!(
            path = %path.display(),
            connections = conns.len(),
            "connections saved for the next start"
        ),
        Err(e) => tracing::error!(path = %path.display(), "connections not saved: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A saved established TCP connection's carried state (1 s left).
    fn established_tcp() -> sluice_conntrack::Carried {
        sluice_conntrack::Carried {
            state: sluice_conntrack::ProtoState::Tcp(sluice_conntrack::TcpState::Established),
            assured: true,
            seen_reply: true,
            flowtable: false,
            mark: 0,
            packets: 9,
            expires_in_ms: 1000,
            timeout_policy: 0,
        }
    }

    /// A fresh directory for test `tag`, the state file path in it, and a
    /// configuration with `workers` workers that keeps its connections
    /// there.
    fn state_file_config(tag: &str, workers: u16) -> (PathBuf, PathBuf, Config) {
        let dir = std::env::temp_dir().join(format!("sluice-{tag}-state-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("conns.state");
        let cfg = config::parse(
            &dir.join("sluice.toml"),
            &format!(
                "state_file = \"{}\"\nworkers = {workers}\n[[interfaces]]\nname = \"lan0\"\nrole = \"inside\"\n[[interfaces]]\nname = \"wan0\"\nrole = \"outside\"\n",
                path.display()
            ),
        )
        .unwrap();
        (dir, path, cfg)
    }

    /// `state_file` at start: a missing file restores nothing; a good one
    /// gives each worker its connections and is removed (one saved by a
    /// gateway with another number of workers gives them all to be placed
    /// by this one's steering); one that does not decode is kept as
    /// `FILE.refused` and restores nothing.
    #[test]
    fn a_state_file_is_restored_once_or_refused_and_kept() {
        use sluice_engine::SavedConn;
        use sluice_wire::flow::{proto, FlowKey4};
        let (dir, path, cfg) = state_file_config("restore", 2);
        assert_eq!(cfg.state_file.as_deref(), Some(path.as_path()));
        let nothing = SavedState {
            by_worker: vec![Vec::new(), Vec::new()],
            ..SavedState::default()
        };
        assert_eq!(load_state(&cfg), nothing);
        let k = FlowKey4 {
            src: 0x0a00_0002,
            dst: 0xcb00_7102,
            sport: 4000,
            dport: 80,
            proto: proto::TCP,
        };
        let c = SavedConn::V4 {
            orig: k,
            reply: k.reversed(),
            carried: established_tcp(),
            held: 0,
        };
        // Saved 400 ms ago: 400 ms less left.
        std::fs::write(&path, state::encode(2, wall_ms() - 400, &[], &[(1, c)])).unwrap();
        let got = load_state(&cfg).by_worker;
        assert!(got[0].is_empty());
        let [SavedConn::V4 { carried, orig, .. }] = got[1][..] else {
            panic!("{got:?}");
        };
        assert_eq!(orig, k);
        assert!(
            (500..=600).contains(&carried.expires_in_ms),
            "{}",
            carried.expires_in_ms
        );
        assert!(!path.exists(), "read once, then removed");
        // Saved longer ago than it had left: expired (the engine refuses
        // it); saved "in the future" (a clock set back): none counted.
        std::fs::write(&path, state::encode(2, wall_ms() - 5000, &[], &[(0, c)])).unwrap();
        assert!(matches!(
            load_state(&cfg).by_worker[0][..],
            [SavedConn::V4 { carried, .. }] if carried.expires_in_ms == 0
        ));
        std::fs::write(&path, state::encode(2, wall_ms() + 60_000, &[], &[(0, c)])).unwrap();
        assert_eq!(load_state(&cfg).by_worker[0], vec![c]);
        // Saved by three workers: all to be placed, none given yet.
        std::fs::write(
            &path,
            state::encode(3, wall_ms() + 60_000, &[], &[(2, c), (0, c)]),
        )
        .unwrap();
        assert_eq!(
            load_state(&cfg),
            SavedState {
                by_worker: vec![Vec::new(), Vec::new()],
                resteer: Some((3, vec![c, c])),
                leases: Vec::new(),
            }
        );
        assert!(!path.exists(), "read once, then removed");
        let refused = path.with_extension("refused");
        for bad in [
            b"not a state file".to_vec(),
            state::encode(3, 0, &[], &[(3, c)]),
        ] {
            std::fs::write(&path, &bad).unwrap();
            assert_eq!(load_state(&cfg), nothing);
            assert!(!path.exists());
            assert_eq!(std::fs::read(&refused).unwrap(), bad, "kept as it was");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// `masquerade to :LO-HI` runs only where `[nat] masquerade_ports`
    /// lie within LO-HI (libvirt's `to :1024-65535` with the default), and
    /// a live rule is held to the same.
    #[test]
    fn masquerade_port_ranges_must_hold_the_configured_ports() {
        let cfg = |ports: &str| {
            config::parse(
                Path::new("sluice.toml"),
                &format!(
                    "[nat]\nmasquerade_ports = \"{ports}\"\n[[interfaces]]\nname = \"wan0\"\n"
                ),
            )
            .unwrap()
        };
        let pol = |to: &str| {
            let rs = sluice_ruleset::parse_nft_str(
                "t.nft",
                &format!(
                    "table ip n {{\n chain p {{ type nat hook postrouting priority 100;\n \
                     oifname \"wan0\" masquerade to :{to}\n masquerade\n }}\n}}\n"
                ),
            )
            .unwrap();
            sluice_policy::CompiledPolicy::compile(
                &rs,
                &sluice_policy::Interfaces::from_ruleset(&rs),
            )
            .unwrap()
        };
        assert_eq!(
            masquerade_ports_fit(&cfg("1024-65535"), &pol("1024-65535")),
            Ok(())
        );
        assert_eq!(
            masquerade_ports_fit(&cfg("2000-60000"), &pol("1024-65535")),
            Ok(())
        );
        let e = masquerade_ports_fit(&cfg("1024-65535"), &pol("3000-4000")).unwrap_err();
        assert!(
            e.contains("masquerade_ports (1024-65535), which must lie within 3000-4000")
                && e.contains("set masquerade_ports = \"3000-4000\""),
            "{e}"
        );
        assert_eq!(pol("3000-4000").masquerade_port_ranges(), [(3000, 4000)]);
    }

    /// Connections saved by a gateway with another number of workers go to
    /// the worker this one's steering sends them to: an untranslated one
    /// to the worker of its inside port, a translated one to the worker of
    /// its external port when its internal port's is the same, else none.
    #[test]
    fn saved_connections_are_placed_by_this_gateways_steering() {
        use sluice_engine::SavedConn;
        use sluice_wire::flow::{proto, FlowKey4};
        let cfg = config::parse(
            Path::new("sluice.toml"),
            "workers = 4\n[[interfaces]]\nname = \"lan0\"\nrole = \"inside\"\naddresses = [\"10.0.0.1/24\"]\n\
             [[interfaces]]\nname = \"wan0\"\nrole = \"outside\"\naddresses = [\"203.0.113.1/24\"]\n\
             [[routes]]\nto = \"0.0.0.0/0\"\nvia = \"203.0.113.254\"\n",
        )
        .unwrap();
        let engine = Worker::new(
            engine_config(&cfg, &[], &[], &[], 0),
            Arc::new(sluice_engine::StaticPolicy::accept_all()),
        )
        .unwrap();
        let carried = established_tcp();
        let orig = |sport: u16| FlowKey4 {
            src: 0x0a00_0002,
            dst: 0xc633_6402,
            sport,
            dport: 443,
            proto: proto::TCP,
        };
        let snat = |sport: u16, ext: u16| SavedConn::V4 {
            orig: orig(sport),
            reply: FlowKey4 {
                src: 0xc633_6402,
                dst: 0xcb00_7101,
                sport: 443,
                dport: ext,
                proto: proto::TCP,
            },
            carried,
            held: 1,
        };
        let plain = |sport: u16| SavedConn::V4 {
            orig: orig(sport),
            reply: orig(sport).reversed(),
            carried,
            held: 0,
        };
        // Ports 2q and 2q + 1 go to worker q % 4.
        let conns = vec![
            plain(2 * 5),
            snat(2 * 6, 2 * 10 + 1),
            snat(2 * 7, 2 * 8),
            plain(2 * 7 + 1),
        ];
        let mut by_worker = vec![Vec::new(); 4];
        place_saved(&engine, &cfg, 1, conns.clone(), &mut by_worker);
        assert_eq!(
            by_worker,
            vec![vec![], vec![conns[0]], vec![conns[1]], vec![conns[3]]],
            "the SNAT one from port 14 to 16 splits (workers 3 and 0)"
        );
    }

    /// A connection's `ct timeout` policy goes to the file with it and
    /// comes back as this process's slot of the same policy (the file
    /// numbers its policies from 1, the process's slots differ).
    #[test]
    fn timeout_policies_are_saved_and_restored_with_their_connections() {
        use sluice_conntrack::{TimeoutKind, TimeoutPolicy};
        use sluice_engine::ct_timeout::{self, CtTimeout};
        use sluice_engine::SavedConn;
        use sluice_wire::flow::{proto, FlowKey4};
        let (dir, path, cfg) = state_file_config("policies", 2);
        let policy = |secs| {
            let mut p = TimeoutPolicy::default();
            p.set(TimeoutKind::UdpStream, std::time::Duration::from_secs(secs));
            CtTimeout {
                proto: proto::UDP,
                policy: p,
            }
        };
        // Two policies; the first is not used by any saved connection.
        let (_unused, used) = (
            ct_timeout::intern(policy(86_401)).unwrap(),
            ct_timeout::intern(policy(86_402)).unwrap(),
        );
        let (unused, used) = (_unused.slot(), used.slot());
        assert_ne!(unused, used);
        let conn = |sport, slot| {
            let k = FlowKey4 {
                src: 0x0a00_0002,
                dst: 0xcb00_7102,
                sport,
                dport: 5060,
                proto: proto::UDP,
            };
            SavedConn::V4 {
                orig: k,
                reply: k.reversed(),
                carried: sluice_conntrack::Carried {
                    state: sluice_conntrack::ProtoState::Udp(sluice_conntrack::UdpState::Stream),
                    assured: true,
                    seen_reply: true,
                    flowtable: false,
                    mark: 0,
                    packets: 3,
                    expires_in_ms: 60_000,
                    timeout_policy: slot,
                },
                held: 0,
            }
        };
        save_state(
            &path,
            &[
                Some(vec![conn(1, used), conn(2, 0)]),
                Some(vec![conn(3, used)]),
            ],
        );
        let file = state::decode(&std::fs::read(&path).unwrap()).unwrap();
        assert_eq!(
            file.policies,
            vec![policy(86_402)],
            "only the policy in use"
        );
        let got = load_state(&cfg).by_worker;
        let slots: Vec<u8> = got
            .iter()
            .flatten()
            .map(|c| match c {
                SavedConn::V4 { carried, .. } | SavedConn::V6 { carried, .. } => {
                    carried.timeout_policy
                }
            })
            .collect();
        assert_eq!(slots, vec![used, 0, used], "the same policy's slot");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// `sluice check`'s summary tells what a start would do with the state
    /// file: none, the connections it would restore, or why it would set
    /// the file aside.
    #[test]
    fn check_describes_the_state_file() {
        let (dir, path, cfg) = state_file_config("check", 1);
        let line = |cfg: &Config| {
            summary_extras(cfg)
                .into_iter()
                .find(|l| l.contains("conns.state"))
                .unwrap_or_default()
        };
        assert!(line(&cfg).contains("none saved now"), "{}", line(&cfg));
        std::fs::write(&path, state::encode(1, wall_ms() - 3000, &[], &[])).unwrap();
        assert!(
            line(&cfg).starts_with("0 connections saved in"),
            "{}",
            line(&cfg)
        );
        assert!(line(&cfg).contains(" 3 s ago"), "{}", line(&cfg));
        std::fs::write(&path, state::encode(2, 0, &[], &[])).unwrap();
        assert!(
            line(&cfg).contains("by 2 workers, for the next start (placed by the steering of 1"),
            "{}",
            line(&cfg)
        );
        std::fs::write(&path, b"junk").unwrap();
        assert!(
            line(&cfg).contains("not a Sluice state file"),
            "{}",
            line(&cfg)
        );
        let mut b = state::encode(1, 0, &[], &[]);
        b.push(0);
        std::fs::write(&path, b).unwrap();
        assert!(
            line(&cfg).contains("33 bytes where a header of 0"),
            "{}",
            line(&cfg)
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A second gateway on an interface a running one holds is refused,
    /// naming the holder; the lock goes with its holder.
    #[test]
    fn an_interface_has_one_gateway() {
        let cfg = config::parse(
            Path::new("sluice.toml"),
            "[[interfaces]]\nname = \"lan0\"\n[[interfaces]]\nname = \"wan0\"\n",
        )
        .unwrap();
        let dir = std::env::temp_dir().join(format!("sluice-locks-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let first = lock_interfaces(&cfg.interfaces, &dir).unwrap();
        assert_eq!(first.len(), 2);
        let e = lock_interfaces(&cfg.interfaces, &dir)
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("interface lan0: in use by another Sluice gateway (pid ")
                && e.contains(&std::process::id().to_string()),
            "{e}"
        );
        let paths: Vec<PathBuf> = first.iter().map(|l| l.path.clone()).collect();
        assert!(paths.iter().all(|p| p.exists()));
        drop(first);
        assert!(
            paths.iter().all(|p| !p.exists()),
            "lock files removed at stop"
        );
        assert_eq!(lock_interfaces(&cfg.interfaces, &dir).unwrap().len(), 2);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// The workers' NAT configuration, which `sluice nat lookup` and the
    /// `[nat]` check use too, has their count: the port split decides
    /// which ports a deterministic block holds (`nat lookup` used to
    /// compute with one worker whatever the file said).
    #[test]
    fn the_workers_nat_configuration_has_their_count() {
        let cfg = config::parse(
            Path::new("sluice.toml"),
            "workers = 2\n[[interfaces]]\nname = \"lan0\"\nrole = \"inside\"\n\
             [[interfaces]]\nname = \"wan0\"\nrole = \"outside\"\n",
        )
        .unwrap();
        let pools = vec![sluice_nat::Pool::new([core::net::Ipv4Addr::new(
            198, 51, 100, 7,
        )])];
        let n = worker_nat(&cfg, &pools);
        assert_eq!((n.workers, &n.pools), (2, &pools));
    }

    /// The steering program and NAT agree on who owns a port: a reply to
    /// any external port reaches the worker that allocated it.
    #[test]
    fn steering_agrees_with_nat_port_ownership() {
        for workers in 1..=16u16 {
            let prog = sluice_io::steer::program(steer_for(Some(config::Role::Outside), workers));
            let inside = sluice_io::steer::program(steer_for(Some(config::Role::Inside), workers));
            for port in (0..=65535u16).step_by(257).chain([1024, 65535]) {
                let owner = sluice_nat::owner_of(port, workers);
                assert_eq!(sluice_io::steer::owner_of(port, workers), owner);
                // 203.0.113.2:443 -> 198.51.100.7:port, TCP.
                let mut f = vec![0x45, 0, 0, 40, 0, 0, 0x40, 0, 64, 6, 0, 0];
                f.extend_from_slice(&[203, 0, 113, 2, 198, 51, 100, 7]);
                f.extend_from_slice(&443u16.to_be_bytes());
                f.extend_from_slice(&port.to_be_bytes());
                f.extend_from_slice(&[0; 16]);
                assert_eq!(sluice_io::steer::run(&prog, &f), u32::from(owner));
                // The rule the AF_XDP program applies (proven equal to it
                // in sluice-io) agrees too.
                let out = steer_for(Some(config::Role::Outside), workers);
                assert_eq!(sluice_io::steer::worker_for(out, &f), owner);
                // The untranslated other direction: 10.0.0.2:port -> 203.0.113.2:443.
                let mut g = vec![0x45, 0, 0, 40, 0, 0, 0x40, 0, 64, 6, 0, 0];
                g.extend_from_slice(&[10, 0, 0, 2, 203, 0, 113, 2]);
                g.extend_from_slice(&port.to_be_bytes());
                g.extend_from_slice(&443u16.to_be_bytes());
                g.extend_from_slice(&[0; 16]);
                assert_eq!(sluice_io::steer::run(&inside, &g), u32::from(owner));
                let inn = steer_for(Some(config::Role::Inside), workers);
                assert_eq!(sluice_io::steer::worker_for(inn, &g), owner);
            }
        }
    }

    #[test]
    fn a_heap_reserve_above_the_available_memory_is_refused() {
        assert_eq!(reserve_refusal(512, Some(1 << 30)), None);
        assert_eq!(reserve_refusal(1024, Some(1 << 30)), None);
        assert_eq!(
            reserve_refusal(1025, Some(1 << 30)).as_deref(),
            Some(
                "heap_reserve_mib = 1025: only 1024 MiB of memory is available \
                 (MemAvailable in /proc/meminfo); lower it or remove it"
            )
        );
        assert_eq!(reserve_refusal(1025, None), None);
    }

    #[test]
    fn connection_tables_larger_than_the_available_memory_are_refused() {
        let dir = std::env::temp_dir();
        let text =
            "backend = \"mem\"\n[conntrack]\nmax = 1000000000\n[[interfaces]]\nname = \"t0\"\n";
        let cfg = config::parse(&dir.join("sluice.toml"), text).expect("config");
        let need = conntrack_start_bytes(&cfg);
        // About 33 bytes per connection of the index, plus IPv6's default.
        assert!(need > 30_000_000_000 && need < 36_000_000_000, "{need}");
        assert_eq!(conntrack_refusal(&cfg, need, Some(need)), None);
        assert_eq!(conntrack_refusal(&cfg, need, None), None);
        let m = conntrack_refusal(&cfg, need, Some(8 << 30)).expect("refused");
        assert!(
            m.starts_with(
                "conntrack.max = 1000000000, conntrack.max_v6 = 65536: the connection tables need "
            ) && m.contains("only 8192 MiB is available")
                && m.ends_with("lower conntrack.max"),
            "{m}"
        );
        let text = "backend = \"mem\"\n[conntrack]\nmax = 1000000\nprefault = true\n[[interfaces]]\nname = \"t0\"\n";
        let cfg = config::parse(&dir.join("sluice.toml"), text).expect("config");
        // Entries too: more than the index alone.
        let full = conntrack_start_bytes(&cfg);
        assert!(full > 70_000_000, "{full}");
        let m = conntrack_refusal(&cfg, full, Some(1 << 20)).expect("refused");
        assert!(m.ends_with("or set prefault = false"), "{m}");
        // A capacity above the maximum is what the tables are built for.
        let text = "backend = \"mem\"\n[conntrack]\nmax = 1000000\ncapacity = 4000000\n[[interfaces]]\nname = \"t0\"\n";
        let cfg = config::parse(&dir.join("sluice.toml"), text).expect("config");
        let roomy = conntrack_start_bytes(&cfg);
        assert!(roomy > 4 * 30_000_000 && roomy < 4 * 36_000_000, "{roomy}");
        let m = conntrack_refusal(&cfg, roomy, Some(1 << 20)).expect("refused");
        assert!(
            m.starts_with("conntrack.max = 1000000 (capacity 4000000), conntrack.max_v6 = 65536:")
                && m.ends_with("lower conntrack.capacity"),
            "{m}"
        );
    }

    /// With `xdp_offload` the offload's tables count too: reported by
    /// `sluice check` and added to what the memory check needs.
    #[test]
    fn xdp_offload_tables_are_reported_and_counted() {
        let dir = std::env::temp_dir();
        let text = "backend = \"af_xdp\"\nxdp_offload = true\n[conntrack]\nmax = 1000000\n\
                    [[interfaces]]\nname = \"t0\"\n";
        let cfg = config::parse(&dir.join("sluice.toml"), text).expect("config");
        // 2 M IPv4 directions: 4 M slots of 64 bytes; 128 k IPv6 ones: 256 k
        // slots of 128 bytes.
        assert_eq!(offload_start_bytes(&cfg), (256 << 20) + (32 << 20));
        let extras = summary_extras(&cfg);
        assert!(
            extras
                .iter()
                .any(|x| x == "XDP offload tables 288 MiB at start"),
            "{extras:?}"
        );
        let need = conntrack_start_bytes(&cfg) + offload_start_bytes(&cfg);
        let m = conntrack_refusal(&cfg, need, Some(100 << 20)).expect("refused");
        assert!(m.contains("xdp_offload's tables"), "{m}");
        // Off: nothing reported, nothing counted.
        let text = text.replace("xdp_offload = true", "xdp_offload = false");
        let cfg = config::parse(&dir.join("sluice.toml"), &text).expect("config");
        assert_eq!(offload_start_bytes(&cfg), 0);
        assert!(!summary_extras(&cfg)
            .iter()
            .any(|x| x.contains("XDP offload")));
    }

    /// The whole path: a gateway asked for conntrack tables larger than
    /// the machine's memory refuses to start, naming the setting.
    #[test]
    fn run_refuses_connection_tables_the_machine_cannot_hold() {
        let dir = std::env::temp_dir().join(format!("sluice-ct-refusal-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let cfg = dir.join("sluice.toml");
        std::fs::write(
            &cfg,
            format!(
                "backend = \"mem\"\ncontrol_socket = {:?}\n[conntrack]\nmax = 2147483647\n\
                 [[interfaces]]\nname = \"t0\"\naddresses = [\"192.0.2.1/24\"]\n",
                dir.join("ctl.sock").display().to_string()
            ),
        )
        .expect("config");
        let avail = sluice_io::alloc::available_memory().expect("MemAvailable");
        assert!(
            avail < 60 << 30,
            "this test needs less than 60 GiB available"
        );
        let r = run(&cfg, &RunOptions::default());
        let _ = std::fs::remove_dir_all(&dir);
        match r {
            Err(RunError::Os(m)) => assert!(m.starts_with("conntrack.max = 2147483647"), "{m}"),
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    /// The whole path: a gateway asked for more heap than the machine has
    /// refuses to start, naming the setting, before it touches anything.
    #[test]
    fn run_refuses_a_heap_reserve_the_machine_cannot_hold() {
        let avail = sluice_io::alloc::available_memory().expect("MemAvailable");
        let mib = config::MAX_HEAP_RESERVE_MIB;
        assert!(
            avail < u64::from(mib) << 20,
            "this test needs less than {mib} MiB of available memory"
        );
        let dir = std::env::temp_dir().join(format!("sluice-heap-refusal-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let cfg = dir.join("sluice.toml");
        std::fs::write(
            &cfg,
            format!(
                "backend = \"mem\"\nheap_reserve_mib = {mib}\ncontrol_socket = {:?}\n\
                 [[interfaces]]\nname = \"t0\"\naddresses = [\"192.0.2.1/24\"]\n",
                dir.join("ctl.sock").display().to_string()
            ),
        )
        .expect("config");
        let r = run(&cfg, &RunOptions::default());
        let _ = std::fs::remove_dir_all(&dir);
        match r {
            Err(RunError::Os(m)) => assert!(
                m.starts_with(&format!("heap_reserve_mib = {mib}: only "))
                    && m.contains("MiB of memory is available"),
                "{m}"
            ),
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn ip_link_output_gives_mac_and_mtu() {
        let line = "7: wan0@if6: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 1400 qdisc noqueue state UP mode DEFAULT group default qlen 1000\\    link/ether 02:11:22:33:44:55 brd ff:ff:ff:ff:ff:ff link-netns x";
        assert_eq!(
            parse_ip_link(line),
            Ok(([2, 0x11, 0x22, 0x33, 0x44, 0x55], 1400))
        );
        assert!(
            parse_ip_link("1: lo: <LOOPBACK> mtu 65536 link/loopback 00:00:00:00:00:00").is_err()
        );
    }
}
