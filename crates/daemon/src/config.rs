//! The TOML configuration: schema, parsing and validation.
//!
//! Parsing is two steps. [`toml`] + serde turn the text into raw structs
//! whose every operator-written value keeps its byte span
//! ([`toml::Spanned`]); type errors and unknown keys are reported there with
//! toml's span. Validation then turns raw values into typed ones (addresses,
//! prefixes, MACs, interface references) and reports each problem as
//! `FILE:LINE:COLUMN: PATH: MESSAGE`, e.g.
//! `sluice.toml:7:9: routes[1].via: 300.1.1.1 is not an IPv4 address`.
//! Validation has no side effects; [`crate::check`] is the whole of
//! `sluice check`.

use core::net::{Ipv4Addr, Ipv6Addr};
use core::ops::Range;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use toml::Spanned;

/// Default control socket path.
pub const DEFAULT_SOCKET: &str = "/run/sluice.sock";
/// Permission bits of the control socket file unless `control_socket_mode`
/// says otherwise: its owner (root) only.
pub const DEFAULT_SOCKET_MODE: u32 = 0o600;

/// Most workers accepted.
pub const MAX_WORKERS: u16 = 64;

/// Largest `heap_reserve_mib` (256 GiB); the daemon also refuses at start
/// a reserve larger than the memory the kernel says is available.
pub const MAX_HEAP_RESERVE_MIB: u32 = 256 * 1024;

/// Smallest `mtu` accepted (RFC 791: 68 bytes pass unfragmented).
pub const MIN_MTU: u16 = 68;
/// Largest `mtu` accepted: frames live in [`sluice_io::FRAME_CAP`]-byte
/// buffers, less the AF_PACKET ring header, Ethernet and one VLAN tag.
pub const MAX_MTU: u16 = 1960;

/// A configuration problem, with its location when it has one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("{file}: cannot read: {reason}")]
    Read {
        /// The path as given.
        file: String,
        /// The OS error text.
        reason: String,
    },
    /// A located problem in the TOML file.
    #[error("{file}:{line}:{col}: {message}\n{line:>5} | {source_line}\n      | {caret}", caret = caret(*col))]
    At {
        /// The path as given.
        file: String,
        /// 1-based line.
        line: usize,
        /// 1-based column (in characters).
        col: usize,
        /// `PATH: what is wrong`.
        message: String,
        /// The offending line, for the caret display.
        source_line: String,
    },
    /// The nft ruleset did not parse or compile (its own diagnostics).
    #[error("{0}")]
    Ruleset(String),
    /// The `[nat]` settings do not fit the ruleset's NAT pools.
    #[error("{file}: {message}")]
    Nat {
        /// The config file.
        file: String,
        /// What does not fit.
        message: String,
    },
}

fn caret(col: usize) -> String {
    format!("{}^", " ".repeat(col.saturating_sub(1)))
}

impl ConfigError {
    /// The first line only (`FILE:LINE:COL: PATH: MESSAGE`), for logs and
    /// JSON errors.
    pub fn headline(&self) -> String {
        self.to_string()
            .lines()
            .next()
            .unwrap_or_default()
            .to_string()
    }
}

/// Which io backend to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BackendChoice {
    /// AF_XDP, else AF_PACKET.
    #[default]
    Auto,
    /// AF_XDP only.
    AfXdp,
    /// AF_PACKET only.
    AfPacket,
    /// In-memory ports with no kernel interface behind them: the control
    /// plane runs for real, no frame arrives. Needs no privileges; used by
    /// `sluice bench update` and tests.
    Mem,
}

impl BackendChoice {
    /// The io backend, or `None` for [`BackendChoice::Mem`].
    pub fn io(self) -> Option<sluice_io::Backend> {
        match self {
            BackendChoice::Auto => Some(sluice_io::Backend::Auto),
            BackendChoice::AfXdp => Some(sluice_io::Backend::AfXdp),
            BackendChoice::AfPacket => Some(sluice_io::Backend::AfPacket),
            BackendChoice::Mem => None,
        }
    }
}

/// The AF_PACKET receive ring (`af_packet_rx`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AfPacketRx {
    /// TPACKET_V3 blocks, handed over full or after 1 ms.
    #[default]
    V3,
    /// TPACKET_V2 frames, handed over one by one at once.
    V2,
}

impl AfPacketRx {
    /// The value as `af_packet_rx` takes it.
    pub fn name(self) -> &'static str {
        match self {
            AfPacketRx::V3 => "v3",
            AfPacketRx::V2 => "v2",
        }
    }

    /// Parses a value of [`Self::name`].
    pub fn parse(s: &str) -> Option<Self> {
        [AfPacketRx::V3, AfPacketRx::V2]
            .into_iter()
            .find(|r| r.name() == s)
    }

    /// The io crate's ring layout.
    pub fn ring(self) -> sluice_io::RxRing {
        match self {
            AfPacketRx::V3 => sluice_io::RxRing::V3,
            AfPacketRx::V2 => sluice_io::RxRing::V2,
        }
    }
}

// ---------------------------------------------------------------- raw schema

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    ruleset: Option<Spanned<String>>,
    #[serde(default)]
    backend: BackendChoice,
    #[serde(default)]
    af_packet_rx: AfPacketRx,
    xdp_offload: Option<Spanned<bool>>,
    workers: Option<Spanned<i64>>,
    worker_priority: Option<Spanned<i64>>,
    heap_reserve_mib: Option<Spanned<i64>>,
    capture: Option<Spanned<String>>,
    state_file: Option<Spanned<String>>,
    control_socket: Option<Spanned<String>>,
    /// Permission bits of the control socket file (octal digits).
    control_socket_mode: Option<Spanned<String>>,
    /// Group of the control socket file (a name or a number).
    control_socket_group: Option<Spanned<String>>,
    /// Prometheus metrics over HTTP (`ADDR:PORT`).
    metrics_listen: Option<Spanned<String>>,
    #[serde(default)]
    interfaces: Vec<RawInterface>,
    #[serde(default)]
    routes: Vec<RawRoute>,
    #[serde(default)]
    neighbors: Vec<RawNeighbor>,
    #[serde(default)]
    nat: RawNat,
    #[serde(default)]
    conntrack: RawConntrack,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawInterface {
    name: Spanned<String>,
    role: Option<Role>,
    #[serde(default)]
    addresses: Vec<Spanned<String>>,
    mac: Option<Spanned<String>>,
    mtu: Option<Spanned<i64>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRoute {
    to: Spanned<String>,
    via: Option<Spanned<String>>,
    dev: Option<Spanned<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawNeighbor {
    ip: Spanned<String>,
    mac: Spanned<String>,
    /// IPv6 only: the interface (needed for a link-local address).
    dev: Option<Spanned<String>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawNat {
    mapping: Option<Mapping>,
    filtering: Option<Filtering>,
    pooling: Option<PoolingChoice>,
    hairpinning: Option<bool>,
    max_sessions_per_subscriber: Option<Spanned<i64>>,
    masquerade_ports: Option<Spanned<String>>,
    /// Port block allocation: ports per block (0: off).
    port_block_size: Option<Spanned<i64>>,
    /// Deterministic NAT (RFC 7422): the subscriber prefix.
    deterministic: Option<Spanned<String>>,
    max_blocks_per_subscriber: Option<Spanned<i64>>,
    /// NAT log file (RFC 6888 REQ-12): one line per mapping event.
    log: Option<Spanned<String>>,
    log_format: Option<Spanned<LogFormat>>,
    /// Without a ruleset: masquerade traffic leaving these interfaces.
    #[serde(default)]
    masquerade: Vec<Spanned<String>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConntrack {
    max: Option<Spanned<i64>>,
    max_v6: Option<Spanned<i64>>,
    capacity: Option<Spanned<i64>>,
    capacity_v6: Option<Spanned<i64>>,
    prefault: Option<bool>,
    #[serde(default)]
    timeouts: RawTimeouts,
}

/// Timeouts in seconds; each unset one keeps the netfilter default.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTimeouts {
    tcp_syn_sent: Option<Spanned<i64>>,
    tcp_syn_recv: Option<Spanned<i64>>,
    tcp_established: Option<Spanned<i64>>,
    tcp_fin_wait: Option<Spanned<i64>>,
    tcp_close_wait: Option<Spanned<i64>>,
    tcp_last_ack: Option<Spanned<i64>>,
    tcp_time_wait: Option<Spanned<i64>>,
    tcp_close: Option<Spanned<i64>>,
    tcp_unacknowledged: Option<Spanned<i64>>,
    udp: Option<Spanned<i64>>,
    udp_stream: Option<Spanned<i64>>,
    icmp: Option<Spanned<i64>>,
    generic: Option<Spanned<i64>>,
}

/// What an interface faces. Shown in `status`; with several workers it
/// also picks how the interface's frames are steered to workers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Subscribers / the private side.
    Inside,
    /// The public side.
    Outside,
}

/// RFC 4787 mapping behaviour.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
enum Mapping {
    EndpointIndependent,
    AddressAndPortDependent,
}

/// RFC 4787 filtering behaviour.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
enum Filtering {
    EndpointIndependent,
    AddressDependent,
    AddressAndPortDependent,
}

/// The NAT log's line format (`nat.log_format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum LogFormat {
    /// `TIME nat=EVENT key=value ...`
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// Where NAT events go (`nat.log`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LogDest {
    /// A file, appended to (resolved relative to the config file).
    File(PathBuf),
    /// A syslog collector (RFC 5424 over UDP, RFC 5426): `udp://ADDR:PORT`.
    Syslog(std::net::SocketAddr),
    /// An IPFIX collector (RFC 7011 over UDP, RFC 8158 NAT events):
    /// `ipfix://ADDR:PORT`.
    Ipfix(std::net::SocketAddr),
}

impl std::fmt::Display for LogDest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::File(p) => write!(f, "{}", p.display()),
            Self::Syslog(a) => write!(f, "udp://{a}"),
            Self::Ipfix(a) => write!(f, "ipfix://{a}"),
        }
    }
}

/// Where and how NAT events are logged (`nat.log`, `nat.log_format`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NatLogConfig {
    /// The destination.
    pub dest: LogDest,
    /// Line format.
    pub format: LogFormat,
}

/// RFC 4787 REQ-2 address pooling.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
enum PoolingChoice {
    Paired,
    Arbitrary,
}

// ------------------------------------------------------------- typed config

/// One owned interface.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InterfaceConfig {
    /// Kernel interface name.
    pub name: String,
    /// What it faces.
    pub role: Option<Role>,
    /// IPv4 addresses with prefix lengths.
    pub addrs: Vec<(Ipv4Addr, u8)>,
    /// IPv6 addresses with prefix lengths (the EUI-64 link-local address
    /// is added by the engine).
    pub addrs6: Vec<(Ipv6Addr, u8)>,
    /// MAC override; `None` reads the interface's own.
    pub mac: Option<[u8; 6]>,
    /// IP MTU override; `None` reads the interface's own (else 1500).
    pub mtu: Option<u16>,
}

/// A static route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RouteConfig {
    /// Destination network (host bits cleared).
    pub net: Ipv4Addr,
    /// Prefix length.
    pub len: u8,
    /// Gateway, if not directly connected.
    pub via: Option<Ipv4Addr>,
    /// Index into [`Config::interfaces`].
    pub dev: usize,
}

/// A static IPv6 route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Route6Config {
    /// Destination network (host bits cleared).
    pub net: Ipv6Addr,
    /// Prefix length.
    pub len: u8,
    /// Next hop (global, or link-local with `dev`), if not directly connected.
    pub via: Option<Ipv6Addr>,
    /// Index into [`Config::interfaces`].
    pub dev: usize,
}

/// The whole validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// The file it came from.
    pub path: PathBuf,
    /// Rule-set file, nft or iptables-save / ip6tables-save syntax (resolved
    /// relative to the config file).
    pub ruleset: Option<PathBuf>,
    /// io backend.
    pub backend: BackendChoice,
    /// The AF_PACKET receive ring (`af_packet_rx`).
    pub af_packet_rx: AfPacketRx,
    /// Forward established IPv4 TCP/UDP connections in the XDP program
    /// (`xdp_offload`, AF_XDP only; see `sluice_io::afxdp::offload`).
    pub xdp_offload: bool,
    /// Worker threads.
    pub workers: u16,
    /// Real-time (`SCHED_FIFO`) priority of the worker threads
    /// (`worker_priority`, 1-99); `None`: ordinary scheduling.
    pub worker_priority: Option<u8>,
    /// MiB of heap backed with memory at start and kept resident
    /// (`heap_reserve_mib`, see `sluice_io::alloc::reserve_heap`); 0: none.
    pub heap_reserve_mib: u32,
    /// pcap capture base path.
    pub capture: Option<PathBuf>,
    /// Where the connections are saved at a stop and taken back at the
    /// next start (`state_file`; docs/configuration.md); `None`: not kept.
    pub state_file: Option<PathBuf>,
    /// Control socket path.
    pub control_socket: PathBuf,
    /// Permission bits of the control socket file (`control_socket_mode`,
    /// default 0600: only its owner, root, may connect).
    pub control_socket_mode: u32,
    /// Group of the control socket file (`control_socket_group`, resolved
    /// to its id); `None`: the daemon's.
    pub control_socket_group: Option<u32>,
    /// Where to serve Prometheus metrics over HTTP (`metrics_listen`).
    pub metrics_listen: Option<std::net::SocketAddr>,
    /// Owned interfaces; engine interface `i + 1` is `interfaces[i]`.
    pub interfaces: Vec<InterfaceConfig>,
    /// Static routes.
    pub routes: Vec<RouteConfig>,
    /// Static neighbours.
    pub neighbors: Vec<(Ipv4Addr, [u8; 6])>,
    /// Static IPv6 routes.
    pub routes6: Vec<Route6Config>,
    /// Static IPv6 neighbours: (index into [`Config::interfaces`], address, MAC).
    pub neighbors6: Vec<(usize, Ipv6Addr, [u8; 6])>,
    /// NAT behaviour and limits (pools come from the ruleset).
    pub nat: sluice_nat::NatConfig,
    /// Without a ruleset: indices of interfaces whose egress traffic is masqueraded.
    pub masquerade: Vec<usize>,
    /// The NAT log (`nat.log`), if any.
    pub nat_log: Option<NatLogConfig>,
    /// Conntrack maximum (whole gateway; split between workers). A reload
    /// may change it up to [`Config::ct_capacity`].
    pub ct_max: u64,
    /// Connections the IPv4 tables are built for (`conntrack.capacity`,
    /// default `ct_max`): their indexes are sized and backed at start for
    /// this many; the largest `ct_max` a reload applies.
    pub ct_capacity: u64,
    /// IPv6 conntrack maximum (whole gateway; split between workers).
    pub ct6_max: u64,
    /// [`Config::ct_capacity`] for IPv6 (`conntrack.capacity_v6`).
    pub ct6_capacity: u64,
    /// Whether `conntrack.capacity` and `capacity_v6` were set (unset, a
    /// reload keeps the running tables' capacities and applies any
    /// maximum up to them).
    pub ct_capacity_set: [bool; 2],
    /// Conntrack timeouts.
    pub timeouts: sluice_conntrack::Timeouts,
    /// Back the IPv4 conntrack tables with memory for `ct_max` connections
    /// at start (`conntrack.prefault`), so that no packet that creates a
    /// connection waits for a page fault.
    pub ct_prefault: bool,
}

/// What `sluice check` prints on success.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Summary {
    /// Interfaces configured.
    pub interfaces: usize,
    /// Static routes.
    pub routes: usize,
    /// Static neighbours.
    pub neighbors: usize,
    /// Workers.
    pub workers: u16,
    /// Backend.
    pub backend: BackendChoice,
    /// `af_packet_rx`.
    pub af_packet_rx: AfPacketRx,
    /// `xdp_offload` is on.
    pub xdp_offload: bool,
    /// `worker_priority`, if set.
    pub worker_priority: Option<u8>,
    /// `heap_reserve_mib` (0: none).
    pub heap_reserve_mib: u32,
    /// Ruleset file, if any.
    pub ruleset: Option<String>,
    /// Rules in the compiled ruleset (0 without one).
    pub rules: usize,
    /// SNAT pools the ruleset defines.
    pub nat_pools: usize,
    /// The NAT features on, as `sluice check` lists them (port blocks,
    /// deterministic prefix, log destination, metrics listener).
    pub extras: Vec<String>,
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "ok: {} interfaces, {} routes, {} neighbours, {} workers ({:?}{}{}{}), {}ruleset {} ({} rules, {} NAT pools)",
            self.interfaces,
            self.routes,
            self.neighbors,
            self.workers,
            self.backend,
            // The ring matters only where AF_PACKET can run.
            if self.af_packet_rx == AfPacketRx::V2
                && matches!(self.backend, BackendChoice::Auto | BackendChoice::AfPacket)
            {
                ", AF_PACKET rx TPACKET_V2"
            } else {
                ""
            },
            if self.xdp_offload { ", XDP offload" } else { "" },
            match self.worker_priority {
                Some(p) => format!(", SCHED_FIFO {p}"),
                None => String::new(),
            },
            match self.heap_reserve_mib {
                0 => String::new(),
                m => format!("heap {m} MiB reserved, "),
            },
            self.ruleset.as_deref().unwrap_or("none"),
            self.rules,
            self.nat_pools
        )?;
        for x in &self.extras {
            write!(f, "; {x}")?;
        }
        Ok(())
    }
}

// ----------------------------------------------------------------- parsing

/// Locates byte spans in the source for error messages.
struct Src<'a> {
    file: String,
    text: &'a str,
}

impl Src<'_> {
    fn at(&self, span: Range<usize>, message: String) -> ConfigError {
        let start = span.start.min(self.text.len());
        let before = self.text.get(..start).unwrap_or_default();
        let line = before.matches('\n').count() + 1;
        let line_start = before.rfind('\n').map_or(0, |i| i + 1);
        let col = self
            .text
            .get(line_start..start)
            .map_or(1, |s| s.chars().count() + 1);
        let source_line = self
            .text
            .get(line_start..)
            .and_then(|s| s.lines().next())
            .unwrap_or_default()
            .to_string();
        ConfigError::At {
            file: self.file.clone(),
            line,
            col,
            message,
            source_line,
        }
    }

    fn err<T>(&self, v: &Spanned<T>, path: &str, what: impl fmt::Display) -> ConfigError {
        self.at(v.span(), format!("{path}: {what}"))
    }
}

/// Read and validate the configuration at `path` (the ruleset is not read).
pub fn load(path: &Path) -> Result<Config, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|e| ConfigError::Read {
        file: path.display().to_string(),
        reason: e.to_string(),
    })?;
    parse(path, &text)
}

/// Parse and validate configuration `text`; `path` names it in errors and
/// anchors relative paths.
pub fn parse(path: &Path, text: &str) -> Result<Config, ConfigError> {
    let src = Src {
        file: path.display().to_string(),
        text,
    };
    let raw: RawConfig = toml::from_str(text).map_err(|e| {
        let msg = e.message().trim().to_string();
        src.at(e.span().unwrap_or(0..0), msg)
    })?;
    let base = path.parent().unwrap_or(Path::new("."));
    let rel = |s: &str| -> PathBuf {
        let p = Path::new(s);
        if p.is_absolute() {
            p.to_path_buf()
        } else {
            base.join(p)
        }
    };

    let workers = match &raw.workers {
        None => 1,
        Some(w) => match u16::try_from(*w.get_ref()) {
            Ok(n) if (1..=MAX_WORKERS).contains(&n) => n,
            _ => {
                return Err(src.err(
                    w,
                    "workers",
                    format!("{} is not between 1 and {MAX_WORKERS}", w.get_ref()),
                ))
            }
        },
    };
    let worker_priority = match &raw.worker_priority {
        None => None,
        Some(p) => match u8::try_from(*p.get_ref()) {
            Ok(n) if (1..=sluice_io::sched::MAX_PRIORITY).contains(&n) => Some(n),
            _ => {
                return Err(src.err(
                    p,
                    "worker_priority",
                    format!(
                        "{} is not a SCHED_FIFO priority (1-{})",
                        p.get_ref(),
                        sluice_io::sched::MAX_PRIORITY
                    ),
                ))
            }
        },
    };
    let heap_reserve_mib = match &raw.heap_reserve_mib {
        None => 0,
        Some(m) => match u32::try_from(*m.get_ref()) {
            Ok(n) if n <= MAX_HEAP_RESERVE_MIB => n,
            _ => {
                return Err(src.err(
                    m,
                    "heap_reserve_mib",
                    format!(
                        "{} is not between 0 and {MAX_HEAP_RESERVE_MIB} (MiB)",
                        m.get_ref()
                    ),
                ))
            }
        },
    };
    let nonempty = |v: &Spanned<String>, p: &str| -> Result<PathBuf, ConfigError> {
        if v.get_ref().is_empty() {
            Err(src.err(v, p, "must not be empty"))
        } else {
            Ok(rel(v.get_ref()))
        }
    };
    let ruleset = raw
        .ruleset
        .as_ref()
        .map(|v| nonempty(v, "ruleset"))
        .transpose()?;
    let capture = raw
        .capture
        .as_ref()
        .map(|v| nonempty(v, "capture"))
        .transpose()?;
    let state_file = raw
        .state_file
        .as_ref()
        .map(|v| nonempty(v, "state_file"))
        .transpose()?;
    let metrics_listen = match &raw.metrics_listen {
        None => None,
        Some(v) => Some(v.get_ref().parse::<std::net::SocketAddr>().map_err(|_| {
            src.err(
                v,
                "metrics_listen",
                format!(
                    "{} is not ADDRESS:PORT (e.g. \"127.0.0.1:9108\" or \"[::1]:9108\")",
                    v.get_ref()
                ),
            )
        })?),
    };
    let control_socket = match &raw.control_socket {
        Some(v) => nonempty(v, "control_socket")?,
        None => PathBuf::from(DEFAULT_SOCKET),
    };
    let control_socket_mode = match &raw.control_socket_mode {
        None => DEFAULT_SOCKET_MODE,
        Some(v) => {
            let t = v.get_ref().trim();
            let m = u32::from_str_radix(t.strip_prefix("0o").unwrap_or(t), 8)
                .ok()
                .filter(|m| *m <= 0o777 && !t.is_empty())
                .ok_or_else(|| {
                    src.err(
                        v,
                        "control_socket_mode",
                        format!(
                            "{:?} is not a file mode in octal digits (e.g. \"0660\")",
                            v.get_ref()
                        ),
                    )
                })?;
            if m & 0o007 != 0 {
                return Err(src.err(
                    v,
                    "control_socket_mode",
                    format!(
                        "{t} gives other users access: whoever may connect can replace the rule \
                         set and flush connections; grant a group instead (e.g. \"0660\" with \
                         control_socket_group)"
                    ),
                ));
            }
            if m & 0o200 == 0 {
                return Err(src.err(
                    v,
                    "control_socket_mode",
                    format!("{t} does not let the owner connect (connecting needs write permission, 0200)"),
                ));
            }
            m
        }
    };
    let control_socket_group = match &raw.control_socket_group {
        None => None,
        Some(v) => match sluice_io::unixsock::group_id(v.get_ref()) {
            Ok(Some(g)) => Some(g),
            Ok(None) => {
                return Err(src.err(
                    v,
                    "control_socket_group",
                    format!("no group {:?} on this system", v.get_ref()),
                ))
            }
            Err(e) => {
                return Err(src.err(v, "control_socket_group", format!("{:?}: {e}", v.get_ref())))
            }
        },
    };

    // Interfaces.
    if raw.interfaces.is_empty() {
        return Err(src.at(
            0..0,
            "interfaces: at least one [[interfaces]] is needed".into(),
        ));
    }
    let mut interfaces: Vec<InterfaceConfig> = Vec::new();
    for (i, ri) in raw.interfaces.iter().enumerate() {
        let name = ri.name.get_ref();
        let p = format!("interfaces[{i}]");
        if sluice_io::IfName::new(name).is_err() || name.is_empty() {
            return Err(src.err(
                &ri.name,
                &format!("{p}.name"),
                format!(
                    "{name:?} is not a valid interface name (1-15 bytes, no '/', NUL or spaces)"
                ),
            ));
        }
        if interfaces.iter().any(|x| &x.name == name) {
            return Err(src.err(
                &ri.name,
                &format!("{p}.name"),
                format!("interface {name} is listed twice"),
            ));
        }
        let mut addrs = Vec::new();
        let mut addrs6 = Vec::new();
        for (j, a) in ri.addresses.iter().enumerate() {
            let at = |m| src.err(a, &format!("{p}.addresses[{j}]"), m);
            if a.get_ref().contains(':') {
                let (ip, len) = parse_cidr6(a.get_ref()).map_err(at)?;
                check_unicast6(ip).map_err(at)?;
                addrs6.push((ip, len));
            } else {
                let (ip, len) = parse_cidr(a.get_ref()).map_err(at)?;
                addrs.push((ip, len));
            }
        }
        let mac = ri
            .mac
            .as_ref()
            .map(|m| parse_mac(m.get_ref()).map_err(|e| src.err(m, &format!("{p}.mac"), e)))
            .transpose()?;
        let mtu = match &ri.mtu {
            None => None,
            Some(m) => match u16::try_from(*m.get_ref()) {
                Ok(n) if (MIN_MTU..=MAX_MTU).contains(&n) => Some(n),
                _ => {
                    return Err(src.err(
                        m,
                        &format!("{p}.mtu"),
                        format!("{} is not between {MIN_MTU} and {MAX_MTU}", m.get_ref()),
                    ))
                }
            },
        };
        // Several workers split each interface by its role (see
        // `sluice_io::steer`): without one, NAT replies and the two
        // directions of a flow could not be brought to the same worker.
        // (In-memory ports are per worker: nothing to split.)
        if workers > 1 && ri.role.is_none() && raw.backend != BackendChoice::Mem {
            return Err(src.err(
                &ri.name,
                &format!("{p}.role"),
                format!(
                    "interface {name} needs role = \"inside\" or \"outside\" when workers > 1 \
                     (frames are steered to workers by source port on inside interfaces and by \
                     destination port on outside ones)"
                ),
            ));
        }
        interfaces.push(InterfaceConfig {
            name: name.clone(),
            role: ri.role,
            addrs,
            addrs6,
            mac,
            mtu,
        });
    }
    let iface_index = |v: &Spanned<String>, p: &str| -> Result<usize, ConfigError> {
        interfaces
            .iter()
            .position(|x| &x.name == v.get_ref())
            .ok_or_else(|| {
                let known: Vec<&str> = interfaces.iter().map(|x| x.name.as_str()).collect();
                src.err(
                    v,
                    p,
                    format!(
                        "unknown interface {:?} (configured: {})",
                        v.get_ref(),
                        known.join(", ")
                    ),
                )
            })
    };
    let connected = |ip: Ipv4Addr| -> Option<usize> {
        interfaces
            .iter()
            .position(|x| x.addrs.iter().any(|&(a, l)| same_net(a, ip, l) && l > 0))
    };

    let connected6 = |ip: Ipv6Addr| -> Option<usize> {
        interfaces.iter().position(|x| {
            x.addrs6
                .iter()
                .any(|&(a, l)| l > 0 && (u128::from(a) ^ u128::from(ip)) & mask6(l) == 0)
        })
    };

    // Routes.
    let mut routes = Vec::new();
    let mut routes6 = Vec::new();
    for (i, rr) in raw.routes.iter().enumerate() {
        let p = format!("routes[{i}]");
        if rr.to.get_ref().contains(':') {
            let (net, len) =
                parse_cidr6(rr.to.get_ref()).map_err(|m| src.err(&rr.to, &format!("{p}.to"), m))?;
            let net_masked = Ipv6Addr::from(u128::from(net) & mask6(len));
            if net_masked != net {
                return Err(src.err(
                    &rr.to,
                    &format!("{p}.to"),
                    format!("{net}/{len} has host bits set (did you mean {net_masked}/{len}?)"),
                ));
            }
            let via = rr
                .via
                .as_ref()
                .map(|v| {
                    parse_ip6(v.get_ref())
                        .and_then(|a| check_unicast6(a).map(|()| a))
                        .map_err(|m| src.err(v, &format!("{p}.via"), m))
                })
                .transpose()?;
            let dev = match (&rr.dev, via) {
                (Some(d), _) => iface_index(d, &format!("{p}.dev"))?,
                (None, Some(gw)) => match (gw.is_unicast_link_local(), connected6(gw)) {
                    (false, Some(d)) => d,
                    (link_local, _) => {
                        let Some(v) = rr.via.as_ref() else {
                            return Err(src.err(&rr.to, &p, "needs via or dev"));
                        };
                        let why = if link_local {
                            "is link-local"
                        } else {
                            "is on no interface's IPv6 prefix"
                        };
                        return Err(src.err(
                            v,
                            &format!("{p}.via"),
                            format!("{gw} {why}; add dev = \"...\""),
                        ));
                    }
                },
                (None, None) => {
                    return Err(src.err(&rr.to, &p, "needs via = \"GATEWAY\" or dev = \"IFNAME\""))
                }
            };
            routes6.push(Route6Config { net, len, via, dev });
            continue;
        }
        if let Some(v) = rr.via.as_ref().filter(|v| v.get_ref().contains(':')) {
            return Err(src.err(
                v,
                &format!("{p}.via"),
                format!("{} is an IPv6 next hop for an IPv4 route", v.get_ref()),
            ));
        }
        let (net, len) =
            parse_cidr(rr.to.get_ref()).map_err(|m| src.err(&rr.to, &format!("{p}.to"), m))?;
        let net_masked = Ipv4Addr::from(u32::from(net) & mask(len));
        if net_masked != net {
            return Err(src.err(
                &rr.to,
                &format!("{p}.to"),
                format!("{net}/{len} has host bits set (did you mean {net_masked}/{len}?)"),
            ));
        }
        let via = rr
            .via
            .as_ref()
            .map(|v| parse_ip(v.get_ref()).map_err(|m| src.err(v, &format!("{p}.via"), m)))
            .transpose()?;
        let dev = match (&rr.dev, via) {
            (Some(d), _) => iface_index(d, &format!("{p}.dev"))?,
            (None, Some(gw)) => match connected(gw) {
                Some(d) => d,
                None => {
                    let Some(v) = rr.via.as_ref() else {
                        return Err(src.err(&rr.to, &p, "needs via or dev"));
                    };
                    return Err(src.err(
                        v,
                        &format!("{p}.via"),
                        format!("{gw} is on no interface's subnet; add dev = \"...\""),
                    ));
                }
            },
            (None, None) => {
                return Err(src.err(&rr.to, &p, "needs via = \"GATEWAY\" or dev = \"IFNAME\""))
            }
        };
        routes.push(RouteConfig { net, len, via, dev });
    }

    // Neighbours.
    let mut neighbors = Vec::new();
    let mut neighbors6 = Vec::new();
    for (i, rn) in raw.neighbors.iter().enumerate() {
        let p = format!("neighbors[{i}]");
        let mac =
            parse_mac(rn.mac.get_ref()).map_err(|m| src.err(&rn.mac, &format!("{p}.mac"), m))?;
        if rn.ip.get_ref().contains(':') {
            let ip = parse_ip6(rn.ip.get_ref())
                .and_then(|a| check_unicast6(a).map(|()| a))
                .map_err(|m| src.err(&rn.ip, &format!("{p}.ip"), m))?;
            let dev = match &rn.dev {
                Some(d) => iface_index(d, &format!("{p}.dev"))?,
                None => match connected6(ip).filter(|_| !ip.is_unicast_link_local()) {
                    Some(d) => d,
                    None => {
                        return Err(src.err(
                            &rn.ip,
                            &format!("{p}.ip"),
                            format!(
                                "{ip} is link-local or on no interface's IPv6 prefix; add dev = \"...\""
                            ),
                        ))
                    }
                },
            };
            neighbors6.push((dev, ip, mac));
            continue;
        }
        if let Some(d) = &rn.dev {
            return Err(src.err(d, &format!("{p}.dev"), "is only for IPv6 neighbours"));
        }
        let ip = parse_ip(rn.ip.get_ref()).map_err(|m| src.err(&rn.ip, &format!("{p}.ip"), m))?;
        neighbors.push((ip, mac));
    }

    // NAT.
    let mut nat = sluice_nat::NatConfig {
        workers: workers.max(1),
        ..Default::default()
    };
    if let Some(m) = raw.nat.mapping {
        nat.mapping = match m {
            Mapping::EndpointIndependent => sluice_nat::MappingBehaviour::EndpointIndependent,
            Mapping::AddressAndPortDependent => {
                sluice_nat::MappingBehaviour::AddressAndPortDependent
            }
        };
    }
    if let Some(f) = raw.nat.filtering {
        nat.filtering = match f {
            Filtering::EndpointIndependent => sluice_nat::FilteringBehaviour::EndpointIndependent,
            Filtering::AddressDependent => sluice_nat::FilteringBehaviour::AddressDependent,
            Filtering::AddressAndPortDependent => {
                sluice_nat::FilteringBehaviour::AddressAndPortDependent
            }
        };
    }
    if let Some(p) = raw.nat.pooling {
        nat.pooling = match p {
            PoolingChoice::Paired => sluice_nat::Pooling::Paired,
            PoolingChoice::Arbitrary => sluice_nat::Pooling::Arbitrary,
        };
    }
    if let Some(h) = raw.nat.hairpinning {
        nat.hairpinning = h;
    }
    if let Some(l) = &raw.nat.max_sessions_per_subscriber {
        nat.max_sessions_per_subscriber = u32::try_from(*l.get_ref()).map_err(|_| {
            src.err(
                l,
                "nat.max_sessions_per_subscriber",
                format!("{} is not between 0 and {}", l.get_ref(), u32::MAX),
            )
        })?;
    }
    for (v, name, field) in [
        (
            &raw.nat.port_block_size,
            "nat.port_block_size",
            &mut nat.port_block_size,
        ),
        (
            &raw.nat.max_blocks_per_subscriber,
            "nat.max_blocks_per_subscriber",
            &mut nat.max_blocks_per_subscriber,
        ),
    ] {
        if let Some(v) = v {
            *field = u16::try_from(*v.get_ref()).map_err(|_| {
                src.err(
                    v,
                    name,
                    format!("{} is not between 0 and 65535", v.get_ref()),
                )
            })?;
        }
    }
    if let Some(d) = &raw.nat.deterministic {
        let (net, len) = parse_cidr(d.get_ref()).map_err(|m| src.err(d, "nat.deterministic", m))?;
        let m = if len == 0 {
            0
        } else {
            u32::MAX << (32 - u32::from(len))
        };
        let masked = Ipv4Addr::from(u32::from(net) & m);
        if masked != net {
            return Err(src.err(
                d,
                "nat.deterministic",
                format!("{net}/{len} has host bits set (did you mean {masked}/{len}?)"),
            ));
        }
        if len < 8 {
            return Err(src.err(
                d,
                "nat.deterministic",
                format!("/{len} is too large a subscriber prefix (at most /8, 16 M subscribers)"),
            ));
        }
        if nat.port_block_size == 0 {
            return Err(src.err(
                d,
                "nat.deterministic",
                "needs nat.port_block_size (the block of ports each subscriber owns)",
            ));
        }
        nat.deterministic = Some((net, len));
    }
    if nat.max_blocks_per_subscriber > 0 && nat.port_block_size == 0 {
        if let Some(v) = &raw.nat.max_blocks_per_subscriber {
            return Err(src.err(
                v,
                "nat.max_blocks_per_subscriber",
                "needs nat.port_block_size (port block allocation is off)",
            ));
        }
    }
    if let Some(r) = &raw.nat.masquerade_ports {
        nat.masquerade_ports =
            parse_port_range(r.get_ref()).map_err(|m| src.err(r, "nat.masquerade_ports", m))?;
    }
    let nat_log = match (&raw.nat.log, &raw.nat.log_format) {
        (Some(l), f) => Some(NatLogConfig {
            dest: {
                let v = l.get_ref();
                let collector = |a: &str, what: &str, eg: &str| {
                    a.parse::<std::net::SocketAddr>().map_err(|_| {
                        src.err(
                            l,
                            "nat.log",
                            format!("{a} is not ADDRESS:PORT of {what} (e.g. \"{eg}\")"),
                        )
                    })
                };
                if let Some(a) = v.strip_prefix("udp://") {
                    LogDest::Syslog(collector(a, "a syslog collector", "udp://192.0.2.10:514")?)
                } else if let Some(a) = v.strip_prefix("ipfix://") {
                    LogDest::Ipfix(collector(
                        a,
                        "an IPFIX collector",
                        "ipfix://192.0.2.10:4739",
                    )?)
                } else {
                    LogDest::File(nonempty(l, "nat.log")?)
                }
            },
            format: f.as_ref().map(|f| *f.get_ref()).unwrap_or_default(),
        }),
        (None, Some(f)) => {
            return Err(src.err(
                f,
                "nat.log_format",
                "is set but nat.log (the file to write) is not",
            ))
        }
        (None, None) => None,
    };
    let mut masquerade = Vec::new();
    for (i, m) in raw.nat.masquerade.iter().enumerate() {
        masquerade.push(iface_index(m, &format!("nat.masquerade[{i}]"))?);
    }

    // Conntrack.
    let ct_max = ct_count(&src, &raw.conntrack.max, "conntrack.max")?.unwrap_or(1 << 20);
    let ct6_max = ct_count(&src, &raw.conntrack.max_v6, "conntrack.max_v6")?.unwrap_or(1 << 16);
    let capacity = |v: &Option<Spanned<i64>>, path: &str, key: &str, max: u64| match (
        ct_count(&src, v, path)?,
        v,
    ) {
        (Some(c), Some(sp)) if c < max => Err(src.err(
            sp,
            path,
            format!(
                "{c} is below conntrack.{key} ({max}); the capacity is the largest \
                     {key} a reload can set, at least {key} itself"
            ),
        )),
        (c, _) => Ok(c.unwrap_or(max)),
    };
    let ct_capacity = capacity(&raw.conntrack.capacity, "conntrack.capacity", "max", ct_max)?;
    let ct6_capacity = capacity(
        &raw.conntrack.capacity_v6,
        "conntrack.capacity_v6",
        "max_v6",
        ct6_max,
    )?;
    let timeouts = timeouts(&src, &raw.conntrack.timeouts)?;
    let xdp_offload = match &raw.xdp_offload {
        Some(o) if *o.get_ref() => {
            if matches!(raw.backend, BackendChoice::AfPacket | BackendChoice::Mem) {
                return Err(src.err(
                    o,
                    "xdp_offload",
                    format!(
                        "xdp_offload needs the AF_XDP backend (backend = \"af_xdp\" or \"auto\"), not {:?}",
                        raw.backend
                    ),
                ));
            }
            true
        }
        _ => false,
    };

    Ok(Config {
        path: path.to_path_buf(),
        ruleset,
        backend: raw.backend,
        af_packet_rx: raw.af_packet_rx,
        xdp_offload,
        workers,
        worker_priority,
        heap_reserve_mib,
        capture,
        state_file,
        control_socket,
        control_socket_mode,
        control_socket_group,
        metrics_listen,
        interfaces,
        routes,
        neighbors,
        routes6,
        neighbors6,
        nat,
        masquerade,
        nat_log,
        ct_max,
        ct_capacity,
        ct_prefault: raw.conntrack.prefault.unwrap_or(false),
        ct6_max,
        ct6_capacity,
        ct_capacity_set: [
            raw.conntrack.capacity.is_some(),
            raw.conntrack.capacity_v6.is_some(),
        ],
        timeouts,
    })
}

/// A connection count of `[conntrack]` (`path`), if set: between 1 and
/// the largest table.
fn ct_count(
    src: &Src<'_>,
    v: &Option<Spanned<i64>>,
    path: &str,
) -> Result<Option<u64>, ConfigError> {
    let Some(m) = v else {
        return Ok(None);
    };
    match u64::try_from(*m.get_ref()) {
        Ok(n) if n >= 1 && n <= u64::from(sluice_conntrack::MAX_CONNECTIONS) => Ok(Some(n)),
        _ => Err(src.err(
            m,
            path,
            format!(
                "{} is not between 1 and {}",
                m.get_ref(),
                sluice_conntrack::MAX_CONNECTIONS
            ),
        )),
    }
}

fn timeouts(src: &Src<'_>, t: &RawTimeouts) -> Result<sluice_conntrack::Timeouts, ConfigError> {
    let mut out = sluice_conntrack::Timeouts::default();
    let fields: [(&str, &Option<Spanned<i64>>, &mut Duration); 13] = [
        ("tcp_syn_sent", &t.tcp_syn_sent, &mut out.tcp_syn_sent),
        ("tcp_syn_recv", &t.tcp_syn_recv, &mut out.tcp_syn_recv),
        (
            "tcp_established",
            &t.tcp_established,
            &mut out.tcp_established,
        ),
        ("tcp_fin_wait", &t.tcp_fin_wait, &mut out.tcp_fin_wait),
        ("tcp_close_wait", &t.tcp_close_wait, &mut out.tcp_close_wait),
        ("tcp_last_ack", &t.tcp_last_ack, &mut out.tcp_last_ack),
        ("tcp_time_wait", &t.tcp_time_wait, &mut out.tcp_time_wait),
        ("tcp_close", &t.tcp_close, &mut out.tcp_close),
        (
            "tcp_unacknowledged",
            &t.tcp_unacknowledged,
            &mut out.tcp_unacknowledged,
        ),
        ("udp", &t.udp, &mut out.udp),
        ("udp_stream", &t.udp_stream, &mut out.udp_stream),
        ("icmp", &t.icmp, &mut out.icmp),
        ("generic", &t.generic, &mut out.generic),
    ];
    for (name, v, slot) in fields {
        if let Some(v) = v {
            let s = *v.get_ref();
            if !(1..=30 * 24 * 3600).contains(&s) {
                return Err(src.err(
                    v,
                    &format!("conntrack.timeouts.{name}"),
                    format!("{s} is not between 1 and 2592000 seconds"),
                ));
            }
            *slot = Duration::from_secs(s.unsigned_abs());
        }
    }
    Ok(out)
}

/// Netmask of a prefix length (0..=32).
pub fn mask(len: u8) -> u32 {
    if len == 0 {
        0
    } else {
        u32::MAX << (32 - u32::from(len.min(32)))
    }
}

fn same_net(a: Ipv4Addr, b: Ipv4Addr, len: u8) -> bool {
    u32::from(a) & mask(len) == u32::from(b) & mask(len)
}

fn parse_ip(s: &str) -> Result<Ipv4Addr, String> {
    s.parse::<Ipv4Addr>()
        .map_err(|_| format!("{s} is not an IPv4 address"))
}

/// `A.B.C.D/LEN`; a bare address means /32.
fn parse_cidr(s: &str) -> Result<(Ipv4Addr, u8), String> {
    let (a, l) = match s.split_once('/') {
        Some((a, l)) => (a, Some(l)),
        None => (s, None),
    };
    let ip = a
        .parse::<Ipv4Addr>()
        .map_err(|_| format!("{a} is not an IPv4 address (expected A.B.C.D/LEN)"))?;
    let len = match l {
        None => 32,
        Some(l) => match l.parse::<u8>() {
            Ok(n) if n <= 32 => n,
            _ => return Err(format!("/{l} is not a prefix length (0-32)")),
        },
    };
    Ok((ip, len))
}

/// Netmask of an IPv6 prefix length (0..=128).
pub fn mask6(len: u8) -> u128 {
    if len == 0 {
        0
    } else {
        u128::MAX << (128 - u32::from(len.min(128)))
    }
}

fn parse_ip6(s: &str) -> Result<Ipv6Addr, String> {
    s.parse::<Ipv6Addr>()
        .map_err(|_| format!("{s} is not an IPv6 address"))
}

/// An address an interface, route or neighbour may use: not unspecified,
/// loopback or multicast.
fn check_unicast6(a: Ipv6Addr) -> Result<(), String> {
    if a.is_unspecified() || a.is_loopback() || a.is_multicast() {
        Err(format!("{a} is not a unicast address"))
    } else {
        Ok(())
    }
}

/// `ADDR/LEN` for IPv6; a bare address means /128.
fn parse_cidr6(s: &str) -> Result<(Ipv6Addr, u8), String> {
    let (a, l) = match s.split_once('/') {
        Some((a, l)) => (a, Some(l)),
        None => (s, None),
    };
    let ip = a
        .parse::<Ipv6Addr>()
        .map_err(|_| format!("{a} is not an IPv6 address (expected ADDR/LEN)"))?;
    let len = match l {
        None => 128,
        Some(l) => match l.parse::<u8>() {
            Ok(n) if n <= 128 => n,
            _ => return Err(format!("/{l} is not an IPv6 prefix length (0-128)")),
        },
    };
    Ok((ip, len))
}

fn parse_mac(s: &str) -> Result<[u8; 6], String> {
    let mut out = [0u8; 6];
    let mut parts = s.split(':');
    for b in &mut out {
        let p = parts.next().unwrap_or_default();
        if p.len() != 2 {
            return Err(format!(
                "{s} is not a MAC address (expected xx:xx:xx:xx:xx:xx)"
            ));
        }
        *b = u8::from_str_radix(p, 16)
            .map_err(|_| format!("{s} is not a MAC address (expected xx:xx:xx:xx:xx:xx)"))?;
    }
    if parts.next().is_some() {
        return Err(format!(
            "{s} is not a MAC address (expected xx:xx:xx:xx:xx:xx)"
        ));
    }
    Ok(out)
}

fn parse_port_range(s: &str) -> Result<core::ops::RangeInclusive<u16>, String> {
    let bad = || format!("{s} is not a port range (expected FIRST-LAST, 1-65535)");
    let (a, b) = s.split_once('-').ok_or_else(bad)?;
    let a: u16 = a.trim().parse().map_err(|_| bad())?;
    let b: u16 = b.trim().parse().map_err(|_| bad())?;
    if a == 0 || a > b {
        return Err(bad());
    }
    Ok(a..=b)
}

/// Format a MAC address as `xx:xx:xx:xx:xx:xx`.
pub fn fmt_mac(m: &[u8; 6]) -> String {
    format!(
        "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
        m[0], m[1], m[2], m[3], m[4], m[5]
    )
}

/// Parse a MAC address (`xx:xx:xx:xx:xx:xx`).
pub fn mac_from_str(s: &str) -> Option<[u8; 6]> {
    parse_mac(s).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
ruleset = "gw.nft"
backend = "af_packet"
af_packet_rx = "v2"
workers = 1
worker_priority = 20
heap_reserve_mib = 256

[[interfaces]]
name = "lan0"
role = "inside"
addresses = ["10.0.0.1/24"]

[[interfaces]]
name = "wan0"
role = "outside"
addresses = ["203.0.113.1/24"]
mac = "02:00:00:00:00:02"
mtu = 1400

[[routes]]
to = "0.0.0.0/0"
via = "203.0.113.254"

[[neighbors]]
ip = "203.0.113.254"
mac = "02:aa:bb:cc:dd:ee"

[nat]
filtering = "address-dependent"
max_sessions_per_subscriber = 1000
masquerade_ports = "2000-60000"
log = "nat.log"
log_format = "json"
port_block_size = 512
max_blocks_per_subscriber = 4

[conntrack]
max = 65536
prefault = true
timeouts = { udp = 60, tcp_established = 3600 }
"#;

    fn err(text: &str) -> String {
        match parse(Path::new("sluice.toml"), text) {
            Ok(_) => panic!("accepted: {text}"),
            Err(e) => e.headline(),
        }
    }

    #[test]
    fn several_workers_need_interface_roles() {
        let e = err("workers = 2\n[[interfaces]]\nname = \"lan0\"\nrole = \"inside\"\n[[interfaces]]\nname = \"wan0\"\n");
        assert!(
            e.starts_with("sluice.toml:6:8: interfaces[1].role: interface wan0 needs role"),
            "{e}"
        );
        let ok = parse(
            Path::new("sluice.toml"),
            "workers = 1\n[[interfaces]]\nname = \"wan0\"\n",
        );
        assert!(ok.is_ok(), "one worker needs no role");
        assert_eq!(ok.map(|c| c.af_packet_rx).ok(), Some(AfPacketRx::V3));
        let mem = parse(
            Path::new("sluice.toml"),
            "backend = \"mem\"\nworkers = 2\n[[interfaces]]\nname = \"wan0\"\n",
        );
        assert!(mem.is_ok(), "in-memory ports are not split");
    }

    #[test]
    fn good_config_parses() {
        let c = parse(Path::new("/etc/sluice/sluice.toml"), GOOD).unwrap();
        assert_eq!(c.ruleset.as_deref(), Some(Path::new("/etc/sluice/gw.nft")));
        assert_eq!(c.backend, BackendChoice::AfPacket);
        assert_eq!(c.af_packet_rx, AfPacketRx::V2);
        assert_eq!(
            AfPacketRx::parse(c.af_packet_rx.name()),
            Some(c.af_packet_rx)
        );
        assert_eq!(c.worker_priority, Some(20));
        assert_eq!(c.heap_reserve_mib, 256);
        assert_eq!(c.interfaces.len(), 2);
        assert_eq!(c.interfaces[1].mac, Some([2, 0, 0, 0, 0, 2]));
        assert_eq!(
            (c.interfaces[0].mtu, c.interfaces[1].mtu),
            (None, Some(1400))
        );
        assert_eq!(
            c.routes[0],
            RouteConfig {
                net: Ipv4Addr::UNSPECIFIED,
                len: 0,
                via: Some(Ipv4Addr::new(203, 0, 113, 254)),
                dev: 1
            }
        );
        assert_eq!(c.neighbors.len(), 1);
        assert_eq!(c.nat.max_sessions_per_subscriber, 1000);
        let log = c.nat_log.as_ref().expect("nat.log");
        assert!(
            matches!(&log.dest, LogDest::File(p) if p.ends_with("nat.log") && p.is_absolute() == c.path.is_absolute())
        );
        assert_eq!(log.format, LogFormat::Json);
        assert_eq!(
            (c.nat.port_block_size, c.nat.max_blocks_per_subscriber),
            (512, 4)
        );
        assert_eq!(c.nat.masquerade_ports, 2000..=60000);
        assert_eq!(
            c.nat.filtering,
            sluice_nat::FilteringBehaviour::AddressDependent
        );
        assert_eq!(c.ct_max, 65536);
        // Unset, the capacities are the maximums.
        assert_eq!((c.ct_capacity, c.ct6_capacity), (65536, c.ct6_max));
        assert!(c.ct_prefault);
        assert_eq!(c.timeouts.udp, Duration::from_secs(60));
        assert_eq!(c.control_socket, PathBuf::from(DEFAULT_SOCKET));
        assert_eq!(c.control_socket_mode, 0o600);
        assert_eq!(c.control_socket_group, None);
        let c = parse(
            Path::new("sluice.toml"),
            "control_socket_mode = \"0660\"\ncontrol_socket_group = \"root\"\n[[interfaces]]\nname = \"wan0\"\n",
        )
        .unwrap();
        assert_eq!(
            (c.control_socket_mode, c.control_socket_group),
            (0o660, Some(0))
        );
    }

    #[test]
    fn example_config_is_valid() {
        let text = include_str!("../examples/sluice.toml");
        let c = parse(Path::new("examples/sluice.toml"), text).unwrap();
        assert!(!c.interfaces.is_empty());
    }

    #[test]
    fn bad_route_gateway_has_line_and_column() {
        let text = "[[interfaces]]\nname = \"wan0\"\naddresses = [\"203.0.113.1/24\"]\n\n[[routes]]\nto = \"10.9.0.0/16\"\nvia = \"203.0.113.9\"\n[[routes]]\nto = \"0.0.0.0/0\"\nvia = \"300.1.1.1\"\n";
        assert_eq!(
            err(text),
            "sluice.toml:10:7: routes[1].via: 300.1.1.1 is not an IPv4 address"
        );
    }

    #[test]
    fn unknown_field_is_located() {
        let e = err("[[interfaces]]\nname = \"a\"\nadress = []\n");
        assert!(
            e.starts_with("sluice.toml:3:1: unknown field `adress`"),
            "{e}"
        );
    }

    #[test]
    fn wrong_type_is_located() {
        let e = err("workers = \"two\"\n[[interfaces]]\nname = \"a\"\n");
        assert!(e.starts_with("sluice.toml:1:11: invalid type"), "{e}");
    }

    #[test]
    fn each_semantic_error_is_located() {
        let base = "[[interfaces]]\nname = \"lan0\"\naddresses = [\"10.0.0.1/24\"]\n";
        let cases: &[(&str, &str)] = &[
            ("workers = 0\n", "sluice.toml:1:11: workers: 0 is not between 1 and 64"),
            (
                "worker_priority = 0\n",
                "sluice.toml:1:19: worker_priority: 0 is not a SCHED_FIFO priority (1-99)",
            ),
            (
                "worker_priority = 100\n",
                "sluice.toml:1:19: worker_priority: 100 is not a SCHED_FIFO priority (1-99)",
            ),
            (
                "worker_priority = \"high\"\n",
                "sluice.toml:1:19: invalid type: string \"high\", expected i64",
            ),
            (
                "heap_reserve_mib = -1\n",
                "sluice.toml:1:20: heap_reserve_mib: -1 is not between 0 and 262144 (MiB)",
            ),
            (
                "heap_reserve_mib = 262145\n",
                "sluice.toml:1:20: heap_reserve_mib: 262145 is not between 0 and 262144 (MiB)",
            ),
            (
                "heap_reserve_mib = \"512M\"\n",
                "sluice.toml:1:20: invalid type: string \"512M\", expected i64",
            ),
            ("backend = \"dpdk\"\n", "sluice.toml:1:11: unknown variant `dpdk`"),
            (
                "af_packet_rx = \"v4\"\n",
                "sluice.toml:1:16: unknown variant `v4`, expected `v3` or `v2`",
            ),
            (
                "backend = \"af_packet\"\nxdp_offload = true\n",
                "sluice.toml:2:15: xdp_offload: xdp_offload needs the AF_XDP backend",
            ),
            ("xdp_offload = 1\n", "sluice.toml:1:15: invalid type: integer `1`, expected a boolean"),
            ("ruleset = \"\"\n", "sluice.toml:1:11: ruleset: must not be empty"),
            ("state_file = \"\"\n", "sluice.toml:1:14: state_file: must not be empty"),
            (
                "state_file = 3\n",
                "sluice.toml:1:14: invalid type: integer `3`, expected a string",
            ),
            (
                "control_socket_mode = \"0666\"\n",
                "sluice.toml:1:23: control_socket_mode: 0666 gives other users access",
            ),
            (
                "control_socket_mode = \"rw\"\n",
                "sluice.toml:1:23: control_socket_mode: \"rw\" is not a file mode in octal digits",
            ),
            (
                "control_socket_mode = \"01600\"\n",
                "sluice.toml:1:23: control_socket_mode: \"01600\" is not a file mode in octal digits",
            ),
            (
                "control_socket_mode = \"0460\"\n",
                "sluice.toml:1:23: control_socket_mode: 0460 does not let the owner connect",
            ),
            (
                "control_socket_group = \"sluice-no-such-group-x\"\n",
                "sluice.toml:1:24: control_socket_group: no group \"sluice-no-such-group-x\" on this system",
            ),
            (
                "metrics_listen = \"localhost\"\n",
                "sluice.toml:1:18: metrics_listen: localhost is not ADDRESS:PORT",
            ),
            (
                "[[interfaces]]\nname = \"lan0\"\n",
                "sluice.toml:6:8: interfaces[1].name: interface lan0 is listed twice",
            ),
            (
                "[[interfaces]]\nname = \"x\"\naddresses = [\"10.0.0.1/33\"]\n",
                "sluice.toml:7:14: interfaces[1].addresses[0]: /33 is not a prefix length (0-32)",
            ),
            (
                "[[interfaces]]\nname = \"x\"\nmac = \"02:00:00\"\n",
                "sluice.toml:7:7: interfaces[1].mac: 02:00:00 is not a MAC address",
            ),
            (
                "[[interfaces]]\nname = \"x\"\nmtu = 40\n",
                "sluice.toml:7:7: interfaces[1].mtu: 40 is not between 68 and 1960",
            ),
            (
                "[[interfaces]]\nname = \"x\"\nmtu = 9000\n",
                "sluice.toml:7:7: interfaces[1].mtu: 9000 is not between 68 and 1960",
            ),
            (
                "[[routes]]\nto = \"10.1.0.1/16\"\ndev = \"lan0\"\n",
                "sluice.toml:6:6: routes[0].to: 10.1.0.1/16 has host bits set (did you mean 10.1.0.0/16?)",
            ),
            (
                "[[routes]]\nto = \"0.0.0.0/0\"\ndev = \"eth9\"\n",
                "sluice.toml:7:7: routes[0].dev: unknown interface \"eth9\" (configured: lan0)",
            ),
            (
                "[[routes]]\nto = \"0.0.0.0/0\"\nvia = \"192.0.2.1\"\n",
                "sluice.toml:7:7: routes[0].via: 192.0.2.1 is on no interface's subnet",
            ),
            (
                "[[routes]]\nto = \"0.0.0.0/0\"\n",
                "sluice.toml:6:6: routes[0]: needs via",
            ),
            (
                "[[neighbors]]\nip = \"10.0.0.9\"\nmac = \"zz:00:00:00:00:00\"\n",
                "sluice.toml:7:7: neighbors[0].mac: zz:00:00:00:00:00 is not a MAC address",
            ),
            (
                "[nat]\nmax_sessions_per_subscriber = -1\n",
                "sluice.toml:6:31: nat.max_sessions_per_subscriber: -1 is not between 0",
            ),
            (
                "[nat]\nmasquerade_ports = \"9-1\"\n",
                "sluice.toml:6:20: nat.masquerade_ports: 9-1 is not a port range",
            ),
            (
                "[nat]\nport_block_size = 70000\n",
                "sluice.toml:6:19: nat.port_block_size: 70000 is not between 0 and 65535",
            ),
            (
                "[nat]\ndeterministic = \"100.64.0.1/24\"\nport_block_size = 250\n",
                "sluice.toml:6:17: nat.deterministic: 100.64.0.1/24 has host bits set (did you mean 100.64.0.0/24?)",
            ),
            (
                "[nat]\ndeterministic = \"100.64.0.0/24\"\n",
                "sluice.toml:6:17: nat.deterministic: needs nat.port_block_size",
            ),
            (
                "[nat]\nmax_blocks_per_subscriber = 2\n",
                "sluice.toml:6:29: nat.max_blocks_per_subscriber: needs nat.port_block_size",
            ),
            (
                "[nat]\nlog = \"udp://collector:514\"\n",
                "sluice.toml:6:7: nat.log: collector:514 is not ADDRESS:PORT of a syslog collector",
            ),
            (
                "[nat]\nlog = \"ipfix://192.0.2.10\"\n",
                "sluice.toml:6:7: nat.log: 192.0.2.10 is not ADDRESS:PORT of an IPFIX collector",
            ),
            (
                "[nat]\nlog_format = \"json\"\n",
                "sluice.toml:6:14: nat.log_format: is set but nat.log (the file to write) is not",
            ),
            (
                "[nat]\nlog = \"nat.log\"\nlog_format = \"xml\"\n",
                "sluice.toml:7:14: unknown variant `xml`, expected `text` or `json`",
            ),
            (
                "[nat]\nmapping = \"cone\"\n",
                "sluice.toml:6:11: unknown variant `cone`",
            ),
            (
                "[conntrack]\nmax = 0\n",
                "sluice.toml:6:7: conntrack.max: 0 is not between 1",
            ),
            (
                "[conntrack.timeouts]\nudp = 0\n",
                "sluice.toml:6:7: conntrack.timeouts.udp: 0 is not between 1 and 2592000 seconds",
            ),
        ];
        for (extra, want) in cases {
            // Top-level keys must come before the first table.
            let text = if extra.starts_with('[') {
                format!("{base}\n{extra}")
            } else {
                format!("{extra}{base}")
            };
            let got = err(&text);
            assert!(got.starts_with(want), "got  {got}\nwant {want}\nfor {text}");
        }
    }

    const V6: &str = r#"
[[interfaces]]
name = "lan0"
addresses = ["10.0.0.1/24", "fd00:1::1/64"]

[[interfaces]]
name = "wan0"
addresses = ["203.0.113.1/24", "2001:db8:ffff::1/64"]

[[routes]]
to = "::/0"
via = "fe80::1"
dev = "wan0"

[[routes]]
to = "2001:db8:5::/48"
via = "2001:db8:ffff::fe"

[[neighbors]]
ip = "fe80::1"
mac = "02:aa:bb:cc:dd:ee"
dev = "wan0"

[[neighbors]]
ip = "fd00:1::9"
mac = "02:aa:bb:cc:dd:09"

[conntrack]
max_v6 = 4096
capacity_v6 = 8192
"#;

    #[test]
    fn ipv6_addresses_routes_and_neighbours_parse() {
        let c = parse(Path::new("sluice.toml"), V6).unwrap();
        assert_eq!(
            c.interfaces[0].addrs,
            vec![(Ipv4Addr::new(10, 0, 0, 1), 24)]
        );
        assert_eq!(
            c.interfaces[0].addrs6,
            vec![("fd00:1::1".parse().unwrap(), 64)]
        );
        assert!(c.routes.is_empty());
        assert_eq!(
            c.routes6,
            vec![
                Route6Config {
                    net: Ipv6Addr::UNSPECIFIED,
                    len: 0,
                    via: Some("fe80::1".parse().unwrap()),
                    dev: 1
                },
                Route6Config {
                    net: "2001:db8:5::".parse().unwrap(),
                    len: 48,
                    via: Some("2001:db8:ffff::fe".parse().unwrap()),
                    dev: 1
                }
            ]
        );
        assert_eq!(
            c.neighbors6,
            vec![
                (
                    1,
                    "fe80::1".parse().unwrap(),
                    [2, 0xaa, 0xbb, 0xcc, 0xdd, 0xee]
                ),
                (
                    0,
                    "fd00:1::9".parse().unwrap(),
                    [2, 0xaa, 0xbb, 0xcc, 0xdd, 0x09]
                )
            ]
        );
        assert_eq!((c.ct6_max, c.ct6_capacity), (4096, 8192));
    }

    #[test]
    fn each_ipv6_error_is_located() {
        let base = "[[interfaces]]\nname = \"lan0\"\naddresses = [\"fd00:1::1/64\"]\n";
        let cases: &[(&str, &str)] = &[
            (
                "[[interfaces]]\nname = \"x\"\naddresses = [\"fd00:2::1/129\"]\n",
                "sluice.toml:7:14: interfaces[1].addresses[0]: /129 is not an IPv6 prefix length (0-128)",
            ),
            (
                "[[interfaces]]\nname = \"x\"\naddresses = [\"fd00::zz/64\"]\n",
                "sluice.toml:7:14: interfaces[1].addresses[0]: fd00::zz is not an IPv6 address",
            ),
            (
                "[[interfaces]]\nname = \"x\"\naddresses = [\"ff02::1/64\"]\n",
                "sluice.toml:7:14: interfaces[1].addresses[0]: ff02::1 is not a unicast address",
            ),
            (
                "[[routes]]\nto = \"fd00:9::1/64\"\ndev = \"lan0\"\n",
                "sluice.toml:6:6: routes[0].to: fd00:9::1/64 has host bits set (did you mean fd00:9::/64?)",
            ),
            (
                "[[routes]]\nto = \"::/0\"\nvia = \"fe80::1\"\n",
                "sluice.toml:7:7: routes[0].via: fe80::1 is link-local; add dev = \"...\"",
            ),
            (
                "[[routes]]\nto = \"::/0\"\nvia = \"2001:db8::1\"\n",
                "sluice.toml:7:7: routes[0].via: 2001:db8::1 is on no interface's IPv6 prefix",
            ),
            (
                "[[routes]]\nto = \"::/0\"\nvia = \"10.0.0.1\"\n",
                "sluice.toml:7:7: routes[0].via: 10.0.0.1 is not an IPv6 address",
            ),
            (
                "[[routes]]\nto = \"0.0.0.0/0\"\nvia = \"fd00:1::2\"\n",
                "sluice.toml:7:7: routes[0].via: fd00:1::2 is an IPv6 next hop for an IPv4 route",
            ),
            (
                "[[neighbors]]\nip = \"fe80::2\"\nmac = \"02:00:00:00:00:01\"\n",
                "sluice.toml:6:6: neighbors[0].ip: fe80::2 is link-local or on no interface's IPv6 prefix",
            ),
            (
                "[[neighbors]]\nip = \"10.0.0.2\"\nmac = \"02:00:00:00:00:01\"\ndev = \"lan0\"\n",
                "sluice.toml:8:7: neighbors[0].dev: is only for IPv6 neighbours",
            ),
            (
                "[conntrack]\nmax_v6 = 0\n",
                "sluice.toml:6:10: conntrack.max_v6: 0 is not between 1",
            ),
            (
                "[conntrack]\nmax = 5000\ncapacity = 4000\n",
                "sluice.toml:7:12: conntrack.capacity: 4000 is below conntrack.max (5000)",
            ),
            (
                "[conntrack]\ncapacity_v6 = 100\n",
                "sluice.toml:6:15: conntrack.capacity_v6: 100 is below conntrack.max_v6 (65536)",
            ),
            (
                "[conntrack]\ncapacity = -1\n",
                "sluice.toml:6:12: conntrack.capacity: -1 is not between 1",
            ),
        ];
        for (extra, want) in cases {
            let text = format!("{base}\n{extra}");
            let got = err(&text);
            assert!(got.starts_with(want), "got  {got}\nwant {want}\nfor {text}");
        }
    }

    #[test]
    fn no_interfaces_is_an_error() {
        assert!(err("workers = 1\n").contains("at least one [[interfaces]]"));
    }

    #[test]
    fn error_display_has_caret() {
        let e = parse(
            Path::new("s.toml"),
            "workers = 99\n[[interfaces]]\nname=\"a\"\n",
        )
        .unwrap_err();
        let s = e.to_string();
        assert!(
            s.contains("    1 | workers = 99\n      |           ^"),
            "{s}"
        );
    }
}
