//! The `sluice` binary: command-line parsing and dispatch only. Every command
//! is implemented in a library crate; this file turns flags into calls and
//! errors into exit codes.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use clap::{Args, Parser, Subcommand};

mod bench;
mod gateway;
mod ruleset_cmd;

/// Sluice: a userspace stateful firewall and NAT44 gateway, and the RFC 2544 /
/// 4814 / 9693 tester that measures it against the kernel.
#[derive(Parser, Debug)]
#[command(name = "sluice", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    cmd: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run a benchmark.
    #[command(subcommand)]
    Bench(BenchCmd),
    /// Check a rule set (parse, validate and lower it) or a gateway
    /// configuration (`*.toml`, including the rule set it names). Exits 0 if
    /// valid, 1 with every error (file:line:col and a caret) if not.
    Check(ConfigArgs),
    /// Run the gateway described by a TOML configuration until SIGTERM.
    Run(RunArgs),
    /// Talk to a running gateway: status, counters, metrics, nat lookup,
    /// conntrack list|count|flush, ruleset replace|list, reload, nft
    /// commands.
    Ctl(CtlArgs),
    /// Rule-set tools.
    #[command(subcommand)]
    Ruleset(RulesetCmd),
    /// Show why packets get their verdict: chains and rules visited, the
    /// deciding rule, the verdict, the NAT action and the final mark.
    Trace(TraceArgs),
    /// NAT tools.
    #[command(subcommand)]
    Nat(NatCmd),
}

#[derive(Subcommand, Debug)]
enum NatCmd {
    /// Deterministic NAT (`nat.deterministic`): the subscriber holding an
    /// external ADDRESS:PORT, or a subscriber's external address and
    /// ports, computed from the configuration alone (no log, no running
    /// gateway). Exits 0 with the answer, 1 when nothing holds it.
    Lookup(NatLookupArgs),
}

#[derive(Args, Debug)]
struct NatLookupArgs {
    /// Gateway configuration (TOML), with the rule set naming the pools.
    #[arg(short = 'c', long = "config", value_name = "FILE")]
    config: PathBuf,
    /// An external endpoint `198.51.100.7:4321`, or a subscriber address
    /// `100.64.3.7`.
    query: String,
}

#[derive(Args, Debug)]
struct RunArgs {
    /// Gateway configuration (TOML).
    #[arg(short = 'c', long = "config", value_name = "FILE")]
    config: PathBuf,
    /// Force a packet I/O backend (default: the file's, else auto: AF_XDP,
    /// falling back to AF_PACKET).
    #[arg(long, value_enum)]
    backend: Option<BackendArg>,
    /// Record what Sluice receives and sends (FILE.<if>.rx.pcap / .tx.pcap).
    #[arg(long, value_name = "FILE.pcap")]
    capture: Option<PathBuf>,
    /// Control socket path (default: the file's, else /run/sluice.sock).
    #[arg(long, value_name = "PATH")]
    socket: Option<PathBuf>,
    /// Do not pin workers to cores.
    #[arg(long)]
    no_pin: bool,
}

#[derive(Clone, Copy, Debug, clap::ValueEnum)]
enum BackendArg {
    /// AF_XDP, else AF_PACKET.
    Auto,
    /// AF_XDP only (also spelt `af_xdp`, as in sluice.toml).
    #[value(alias = "af_xdp")]
    AfXdp,
    /// AF_PACKET only (also spelt `af_packet`, as in sluice.toml).
    #[value(alias = "af_packet")]
    AfPacket,
    /// In-memory ports (no kernel interfaces; control plane only).
    Mem,
}

#[derive(Args, Debug)]
struct CtlArgs {
    /// Control socket of the running gateway.
    #[arg(long, value_name = "PATH", default_value = sluice_daemon::config::DEFAULT_SOCKET)]
    socket: PathBuf,
    /// Print `conntrack list` as `conntrack -L` does, one line per
    /// connection, and `conntrack count` / `flush` as the number (other
    /// requests print their JSON answer).
    #[arg(long)]
    text: bool,
    /// The request, e.g. `status`, `counters`, `conntrack list proto tcp port 80`.
    #[arg(required = true, trailing_var_arg = true)]
    request: Vec<String>,
}

#[derive(Subcommand, Debug)]
enum RulesetCmd {
    /// Print the canonical nft form (iptables input comes out translated).
    Print(ConfigArgs),
}

#[derive(Args, Debug)]
struct ConfigArgs {
    /// Rule-set file (nft or iptables-restore syntax).
    #[arg(short = 'c', long = "config", value_name = "FILE")]
    config: PathBuf,
    /// Input syntax; default: iptables if the file has `*filter`-style table
    /// headers (ip6tables when it is an ip6tables-save file or its rules
    /// have IPv6 addresses or ICMPv6), nft otherwise.
    #[arg(long, value_enum)]
    format: Option<ruleset_cmd::Format>,
    /// `ipset save` file providing the sets of `-m set --match-set`
    /// (default: FILE with the extension `.ipset`, if it exists).
    #[arg(long, value_name = "FILE")]
    ipsets: Option<PathBuf>,
}

#[derive(Args, Debug)]
#[command(group = clap::ArgGroup::new("input").required(true).args(["packet", "packets"]))]
struct TraceArgs {
    #[command(flatten)]
    cfg: ConfigArgs,
    /// One packet, e.g. 'tcp 10.0.0.2:1234 > 192.0.2.1:80 iif eth0 oif eth1
    /// ct new [mark N] [flags S] [hook input] [ttl N] [length N] [dscp ef]
    /// [pkttype broadcast]'.
    #[arg(long, value_name = "SPEC")]
    packet: Option<String>,
    /// Batch mode: one JSON object per line in, one JSON result per line out
    /// ("-" reads stdin).
    #[arg(long, value_name = "FILE.jsonl")]
    packets: Option<PathBuf>,
}

#[derive(Subcommand, Debug)]
enum BenchCmd {
    /// RFC 9693 stateful NAT44 benchmark of the in-process engine (no root
    /// needed): connection setup rate, established throughput, tear-down
    /// rate, bytes per connection, against the machine's memory limit.
    Nat44(Nat44Args),
    /// Classification cost (ns/packet) of the compiled classifier and the
    /// linear evaluator at 20, 100, 1 000, 10 000 and 100 000 rules, for
    /// seed 001's shape, ClassBench-style 5-tuple rule sets and a block
    /// list written as host rules.
    Rules(RulesArgs),
    /// Rule-update cost against a running gateway (in-process, mem backend,
    /// no root) through the control socket: load N rules, median insert and
    /// delete of one rule, and one-at-a-time appends (seed 002's test).
    Update(UpdateArgs),
    /// 64-byte frames per second forwarded with NAT on one core, between
    /// network namespaces it builds and removes (needs root): Sluice on
    /// AF_XDP, AF_PACKET and the XDP offload against the kernel with an
    /// nftables or iptables masquerade rule, at saturation, optionally
    /// behind N forward filter rules (seed 001's rule-set shape).
    Forward(ForwardArgs),
}

#[derive(Args, Debug)]
struct ForwardArgs {
    /// Devices under test, comma separated: sluice-afxdp, sluice-afpacket,
    /// sluice-xdp-offload, kernel-nftables, kernel-iptables
    /// (iptables-legacy); also kernel-flowtable (needs CONFIG_NF_FLOW_TABLE)
    /// and sender-only.
    #[arg(long, value_delimiter = ',', value_parser = parse_dut,
          default_value = "sluice-afxdp,sluice-afpacket,sluice-xdp-offload,kernel-nftables,kernel-iptables")]
    dut: Vec<sluice_tester::forward::Dut>,
    /// Distinct flows, comma separated (each must split into source x
    /// destination port ranges, e.g. 1000 or 1M).
    #[arg(long, value_delimiter = ',', value_parser = parse_count,
          default_values_t = [1_000u64, 1_000_000])]
    flows: Vec<u64>,
    /// Forward filter rule counts, comma separated (e.g. 0,1k,10k): 0 is
    /// the NAT rule only; N puts N - 1 rules the traffic does not match
    /// (`udp dport P ip daddr D accept`) ahead of one that accepts it in a
    /// forward chain with policy drop, the same rules for every DUT (seed
    /// 001's rule-set shape; at most 1M).
    #[arg(long, value_delimiter = ',', value_parser = parse_rules,
          default_values_t = [0usize])]
    rules: Vec<usize>,
    /// Measure connection establishment: no warm-up, every flow sent once,
    /// so each forwarded frame is a new connection (RFC 9693's setup
    /// phase, at saturation). Use enough --flows that the sender does not
    /// run out within pre-roll and window (about 10M for --duration 1 with
    /// --sender xdp).
    #[arg(long, conflicts_with = "zero_loss")]
    setup: bool,
    /// After each point, the idle round trip through the DUT: 200 pings
    /// from the sender to the receiver, 5 ms apart (after 10 not counted);
    /// with --rules, two rules accepting echo requests and replies follow
    /// the N rules.
    #[arg(long)]
    latency: bool,
    /// The sluice-afpacket DUT's receive ring (`af_packet_rx`): v3 (block
    /// ring, the default) or v2 (frame ring).
    #[arg(long, value_parser = parse_af_packet_rx, default_value = "v3")]
    af_packet_rx: sluice_daemon::config::AfPacketRx,
    /// IPv6 traffic (84-byte frames: the same UDP datagram in an IPv6
    /// header) through every DUT, no NAT: a stateful forward chain
    /// (`ct state established,related accept`, new UDP to the receiver
    /// accepted) on Sluice and the kernel alike; with --rules N, seed
    /// 001's N-rule chain in IPv6 (the last rule stateful); with
    /// --latency, ping -6 through it (two ICMPv6 echo rules follow).
    #[arg(long)]
    ipv6: bool,
    /// Measured seconds per point (after a 0.5 s pre-roll).
    #[arg(long, default_value_t = 3.0)]
    duration: f64,
    /// Pace of the warm-up pass that creates every flow's state (frames/s).
    #[arg(long, value_parser = parse_count, default_value = "200k")]
    warmup_rate: u64,
    /// Seed of the pseudorandom flow order.
    #[arg(long, default_value_t = 0x5eed)]
    seed: u64,
    /// After the saturation run, search for RFC 2544's zero-loss
    /// throughput (binary search of paced trials of --duration each); fps
    /// is then that rate and saturation_fps the drain rate.
    #[arg(long)]
    zero_loss: bool,
    /// Sender of the saturation measurement: socket (AF_PACKET sendmmsg,
    /// frames reach the DUT as skbs) or xdp (BPF_PROG_RUN live XDP frames
    /// redirected into the sender's veth, like a NIC's receive ring; Linux
    /// 5.18+). Warm-up and zero-loss trials use the socket sender.
    #[arg(long, value_parser = parse_sender, default_value = "socket")]
    sender: sluice_tester::forward::Sender,
    /// How the receiver takes the forwarded frames: xdp-drop (an XDP
    /// program drops them on its veth, as cheap as a NIC's transmit) or
    /// stack (its GRO and IP layers drop them, on the DUT core; the method
    /// of figures before 2026-11-23 16:40 UTC).
    #[arg(long, value_parser = parse_receiver, default_value = "xdp-drop")]
    receiver: sluice_tester::forward::Receiver,
    /// Write the results as JSON: {"results": [{dut, flows, fps, ...}]}.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
}

fn parse_dut(s: &str) -> Result<sluice_tester::forward::Dut, String> {
    sluice_tester::forward::Dut::parse(s.trim()).ok_or_else(|| {
        format!(
            "'{s}': expected sluice-afxdp, sluice-afpacket, sluice-xdp-offload, \
             kernel-nftables, kernel-iptables, kernel-flowtable or sender-only"
        )
    })
}

/// A forward rule count of `bench forward --rules`: 0 to 1M.
fn parse_rules(s: &str) -> Result<usize, String> {
    if s.trim() == "0" {
        return Ok(0);
    }
    let n = parse_count(s)?;
    if n > 1_000_000 {
        return Err(format!("'{s}': at most 1M forward rules"));
    }
    usize::try_from(n).map_err(|_| format!("'{s}': too large"))
}

fn parse_af_packet_rx(s: &str) -> Result<sluice_daemon::config::AfPacketRx, String> {
    sluice_daemon::config::AfPacketRx::parse(s.trim())
        .ok_or_else(|| format!("'{s}': expected v3 or v2"))
}

fn parse_receiver(s: &str) -> Result<sluice_tester::forward::Receiver, String> {
    sluice_tester::forward::Receiver::parse(s.trim())
        .ok_or_else(|| format!("'{s}': expected xdp-drop or stack"))
}

fn parse_sender(s: &str) -> Result<sluice_tester::forward::Sender, String> {
    sluice_tester::forward::Sender::parse(s.trim())
        .ok_or_else(|| format!("'{s}': expected socket or xdp"))
}

#[derive(Args, Debug)]
struct UpdateArgs {
    /// Rules loaded before single updates are timed.
    #[arg(long, value_parser = parse_count, default_value = "150000")]
    objects: u64,
    /// Single inserts (and deletes) timed.
    #[arg(long, default_value_t = 200)]
    samples: usize,
    /// One-at-a-time appends timed (to an empty chain, seed 002, on one kept
    /// connection and with a connection each; and with the objects loaded).
    #[arg(long, default_value_t = 3000)]
    appends: usize,
    /// The gateway's `heap_reserve_mib` (MiB of heap backed with memory at
    /// start and kept resident; 0: none).
    #[arg(long, value_name = "MIB",
          default_value_t = sluice_tester::update::DEFAULT_HEAP_RESERVE_MIB,
          value_parser = clap::value_parser!(u32).range(0..=i64::from(sluice_daemon::config::MAX_HEAP_RESERVE_MIB)))]
    heap_reserve_mib: u32,
    /// Also measure the kernel on this machine, as root, in a network
    /// namespace of its own: the same load, inserts and deletes with it
    /// loaded, and seed 002's appends, with nft, iptables-legacy and
    /// iptables-nft (one process per step).
    #[arg(long)]
    kernel: bool,
    /// Inserts and deletes timed per kernel tool with the rules loaded
    /// (each can take a second).
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u16).range(1..=1000))]
    kernel_samples: u16,
    /// Write the results as JSON (insert_us_at_150k, delete_us_at_150k,
    /// load_150k_s, append_3000_s, append_3000_new_conn_s,
    /// append_3000_at_150k_s, ...; with --kernel, "kernel": one object
    /// per tool).
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
}

#[derive(Args, Debug)]
struct RulesArgs {
    /// Rule counts, comma separated.
    #[arg(long, value_delimiter = ',', value_parser = parse_count,
          default_values_t = [20u64, 100, 1_000, 10_000, 100_000])]
    counts: Vec<u64>,
    /// Write the results as JSON: {"rules": [{shape, count, compiled_ns, linear_ns}, ...]}.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
}

#[derive(Args, Debug)]
struct Nat44Args {
    /// Connection counts to measure, comma separated (default: a sweep that
    /// finishes in about a minute). Each count must split into restricted
    /// port ranges, e.g. 1000000 or 40000000.
    #[arg(long, value_delimiter = ',', value_parser = parse_count)]
    connections: Vec<u64>,
    /// Worker cores; each runs its own engine on connections / cores.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=64))]
    cores: u16,
    /// Frames per throughput measurement (default: max(connections, 2000000)).
    #[arg(long, value_parser = parse_count)]
    frames: Option<u64>,
    /// Seed for the pseudorandom port orders and hash keys.
    #[arg(long, default_value_t = 0x5eed)]
    seed: u64,
    /// Write the results as JSON (an object for one count, an array for a sweep).
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// After the real test phase, measure the engine's two bucket prefetch
    /// schedules against each other on the same table: ROUNDS rounds of
    /// --frames unidirectional frames with each, alternating (JSON key
    /// `prefetch_comparison`).
    #[arg(long, value_name = "ROUNDS", value_parser = clap::value_parser!(u32).range(1..=1000))]
    compare_prefetch: Option<u32>,
}

/// Parse a count, accepting `_` separators and k/M/G suffixes.
fn parse_count(s: &str) -> Result<u64, String> {
    let t: String = s.trim().chars().filter(|&c| c != '_').collect();
    let (num, mul) = match t.chars().last() {
        Some('k' | 'K') => (&t[..t.len() - 1], 1_000),
        Some('M' | 'm') => (&t[..t.len() - 1], 1_000_000),
        Some('G' | 'g') => (&t[..t.len() - 1], 1_000_000_000),
        _ => (t.as_str(), 1),
    };
    let n: u64 = num
        .parse()
        .map_err(|_| format!("'{s}' is not a count (examples: 1000000, 4M, 40_000_000)"))?;
    let v = n
        .checked_mul(mul)
        .ok_or_else(|| format!("'{s}' is too large"))?;
    if v == 0 {
        return Err(format!("'{s}': must be at least 1"));
    }
    Ok(v)
}

/// mimalloc, without huge pages for its own heap (see `sluice_io::alloc`).
/// The control plane allocates many small objects per rule; against glibc's
/// malloc (one arena), `sluice bench update` loaded 150 000 rules in
/// 0.56-0.71 s instead of 0.59-0.85 s and made seed 002's 3000 appends in
/// 0.19-0.52 s instead of 0.38-0.75 s (six runs each, 2026-11-23,
/// docs/benchmarks.md).
#[global_allocator]
static GLOBAL: sluice_io::alloc::Allocator = sluice_io::alloc::Allocator;

fn main() -> ExitCode {
    // mimalloc's `no_thp` disabled transparent huge pages for the whole
    // process when it started; the conntrack tables ask for them.
    sluice_io::alloc::allow_transparent_huge_pages();
    let cli = Cli::parse();
    init_logging(matches!(cli.cmd, Command::Run(_)));
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("sluice: error: {e:#}");
            ExitCode::from(2)
        }
    }
}

/// Log lines (the gateway's start, link changes, reload failures, the
/// warnings of every command) go to stderr, with timestamps, in color only
/// on a terminal. The level comes from `SLUICE_LOG`, else `RUST_LOG`
/// (`tracing_subscriber`'s filter syntax, e.g. `debug` or
/// `sluice_daemon=debug`), else `info` for `sluice run` and `warn` for the
/// other commands, whose results are their own output.
fn init_logging(daemon: bool) {
    use std::io::IsTerminal;
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_env("SLUICE_LOG")
        .or_else(|_| EnvFilter::try_from_default_env())
        .unwrap_or_else(|_| EnvFilter::new(if daemon { "info" } else { "warn" }));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .try_init();
}

fn run(cli: Cli) -> Result<ExitCode> {
    match cli.cmd {
        Command::Bench(BenchCmd::Nat44(a)) => {
            let counts = if a.connections.is_empty() {
                sluice_tester::nat44::DEFAULT_SWEEP.to_vec()
            } else {
                a.connections.clone()
            };
            bench::nat44(
                &counts,
                a.cores,
                a.frames,
                a.seed,
                a.compare_prefetch.unwrap_or(0),
                a.json.as_deref(),
            )
        }
        Command::Check(c) if gateway::is_gateway_config(&c.config) => gateway::check(&c.config),
        Command::Check(c) => ruleset_cmd::check(&c.config, c.format, c.ipsets.as_deref()),
        Command::Run(r) => gateway::run(
            &r.config,
            r.backend.map(|b| match b {
                BackendArg::Auto => sluice_daemon::config::BackendChoice::Auto,
                BackendArg::AfXdp => sluice_daemon::config::BackendChoice::AfXdp,
                BackendArg::AfPacket => sluice_daemon::config::BackendChoice::AfPacket,
                BackendArg::Mem => sluice_daemon::config::BackendChoice::Mem,
            }),
            r.capture.as_deref(),
            r.socket.as_deref(),
            r.no_pin,
        ),
        Command::Ctl(c) => gateway::ctl(&c.socket, &c.request, c.text),
        Command::Nat(NatCmd::Lookup(a)) => gateway::nat_lookup(&a.config, &a.query),
        Command::Bench(BenchCmd::Rules(a)) => bench::rules(&a.counts, a.json.as_deref()),
        Command::Bench(BenchCmd::Update(a)) => bench::update(
            &sluice_tester::update::UpdateOptions {
                objects: usize::try_from(a.objects).unwrap_or(usize::MAX),
                samples: a.samples.max(1),
                appends: a.appends,
                heap_reserve_mib: a.heap_reserve_mib,
                // With the kernel's tools as processes, Sluice's appends as
                // `sluice ctl` processes too.
                ctl_exe: if a.kernel {
                    Some(anyhow::Context::context(
                        std::env::current_exe(),
                        "locating the sluice executable",
                    )?)
                } else {
                    None
                },
                ..Default::default()
            },
            a.kernel.then_some(usize::from(a.kernel_samples)),
            a.json.as_deref(),
        ),
        Command::Bench(BenchCmd::Forward(a)) => {
            if !(a.duration.is_finite() && a.duration > 0.0 && a.duration <= 3600.0) {
                anyhow::bail!("--duration {}: expected seconds in (0, 3600]", a.duration);
            }
            bench::forward(
                &sluice_tester::forward::ForwardOptions {
                    duts: a.dut,
                    flows: a.flows,
                    duration: std::time::Duration::from_secs_f64(a.duration),
                    warmup_pps: a.warmup_rate,
                    seed: a.seed,
                    zero_loss: a.zero_loss,
                    sender: a.sender,
                    receiver: a.receiver,
                    rules: a.rules,
                    setup: a.setup,
                    latency: a.latency,
                    af_packet_rx: a.af_packet_rx,
                    ipv6: a.ipv6,
                },
                a.json.as_deref(),
            )
        }
        Command::Ruleset(RulesetCmd::Print(c)) => {
            ruleset_cmd::print(&c.config, c.format, c.ipsets.as_deref())
        }
        Command::Trace(t) => ruleset_cmd::trace(
            &t.cfg.config,
            t.cfg.format,
            t.cfg.ipsets.as_deref(),
            t.packet.as_deref(),
            t.packets.as_deref(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn counts_accept_suffixes_and_reject_garbage() {
        assert_eq!(parse_count("4M"), Ok(4_000_000));
        assert_eq!(parse_count("40_000_000"), Ok(40_000_000));
        assert_eq!(parse_count("10k"), Ok(10_000));
        assert!(parse_count("0").is_err());
        assert!(parse_count("lots").is_err());
        assert!(parse_count("99999999999999G").is_err());
    }
}
