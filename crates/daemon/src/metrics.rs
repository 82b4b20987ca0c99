//! Prometheus metrics: the gateway's counters in the text exposition
//! format (version 0.0.4), served over HTTP at `metrics_listen`
//! (`GET /metrics`) and by `sluice ctl metrics`.
//!
//! A scrape asks every worker for its status over the same command queue
//! as `sluice ctl status` (the worker answers between two batches, so a
//! scrape never stops the packet path), then formats. The HTTP server is
//! deliberately small: one connection at a time, one request per
//! connection, `GET /metrics` (and `/`) only, a 2 s read timeout; put a
//! reverse proxy in front of it for TLS or authentication, or bind it to
//! a management address.

use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use sluice_engine::DropReason;

use crate::dataplane::WorkerStatus;

/// A counter family read from a `T`: (name, help, read).
type Counter<T> = (&'static str, &'static str, fn(&T) -> u64);
/// A family of a given kind read from a `T`: (name, kind, help, read).
type Metric<T> = (&'static str, &'static str, &'static str, fn(&T) -> u64);

/// What the control plane adds to the workers' status.
#[derive(Debug, Clone, Default)]
pub struct Info {
    /// Seconds since start.
    pub uptime_s: u64,
    /// Rules of the running rule set.
    pub rules: usize,
    /// Its generation.
    pub generation: u64,
    /// The NAT log's (written, lost, write errors), when configured.
    pub nat_log: Option<(u64, u64, u64)>,
    /// Each interface's name, link state (`up`, `down`, `gone`) and how
    /// often its ports were opened again after it came back.
    pub links: Vec<(String, &'static str, u64)>,
    /// Configuration reloads.
    pub reloads: Reloads,
}

/// Configuration reloads (SIGHUP, `sluice ctl reload`).
#[derive(Debug, Clone, Copy, Default)]
pub struct Reloads {
    /// Reloads that applied.
    pub ok: u64,
    /// Reloads refused (the running configuration was kept).
    pub failed: u64,
    /// Whether the last reload applied (true before any).
    pub last_ok: bool,
    /// When the running configuration was last loaded successfully (start
    /// or reload), Unix seconds.
    pub last_success_unix: u64,
}

/// One metric family being written.
struct Family<'a> {
    out: &'a mut String,
    name: &'a str,
}

impl Family<'_> {
    fn sample(&mut self, labels: &[(&str, &str)], v: u64) {
        let _ = write!(self.out, "{}", self.name);
        if !labels.is_empty() {
            self.out.push('{');
            for (i, (k, val)) in labels.iter().enumerate() {
                if i > 0 {
                    self.out.push(',');
                }
                let _ = write!(self.out, "{k}=\"{}\"", escape(val));
            }
            self.out.push('}');
        }
        let _ = writeln!(self.out, " {v}");
    }
}

fn family<'a>(out: &'a mut String, name: &'a str, kind: &str, help: &str) -> Family<'a> {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
    Family { out, name }
}

/// A label value as the format wants it: `\`, `"` and newlines escaped.
fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// The whole exposition.
pub fn render(ws: &[WorkerStatus], info: &Info) -> String {
    let mut o = String::with_capacity(8192);
    let workers: Vec<String> = ws.iter().map(|w| w.worker.to_string()).collect();
    let per_worker =
        |o: &mut String, name: &str, kind: &str, help: &str, f: &dyn Fn(&WorkerStatus) -> u64| {
            let mut fam = family(o, name, kind, help);
            for (w, id) in ws.iter().zip(&workers) {
                fam.sample(&[("worker", id)], f(w));
            }
        };
    family(
        &mut o,
        "sluice_uptime_seconds",
        "gauge",
        "Seconds since the gateway started.",
    )
    .sample(&[], info.uptime_s);
    family(
        &mut o,
        "sluice_ruleset_rules",
        "gauge",
        "Rules of the running rule set.",
    )
    .sample(&[], info.rules as u64);
    family(
        &mut o,
        "sluice_ruleset_generation",
        "gauge",
        "Generation of the running rule set (1 at start, +1 per replace or reload).",
    )
    .sample(&[], info.generation);
    let mut fam = family(
        &mut o,
        "sluice_config_reloads_total",
        "counter",
        "Configuration reloads (SIGHUP, sluice ctl reload) by result: ok, or failed (the running configuration kept).",
    );
    fam.sample(&[("result", "ok")], info.reloads.ok);
    fam.sample(&[("result", "failed")], info.reloads.failed);
    family(
        &mut o,
        "sluice_config_last_reload_successful",
        "gauge",
        "1 if the last configuration reload applied (or none was tried), 0 if it failed.",
    )
    .sample(&[], u64::from(info.reloads.last_ok));
    family(
        &mut o,
        "sluice_config_last_reload_success_timestamp_seconds",
        "gauge",
        "When the running configuration was last loaded successfully (start or reload), Unix seconds.",
    )
    .sample(&[], info.reloads.last_success_unix);
    let mut fam = family(
        &mut o,
        "sluice_interface_link_up",
        "gauge",
        "1 while an interface's link is up; 0 while it is down or gone (label state).",
    );
    for (name, state, _) in &info.links {
        fam.sample(
            &[("interface", name), ("state", state)],
            u64::from(*state == "up"),
        );
    }
    let mut fam = family(
        &mut o,
        "sluice_interface_reopened_total",
        "counter",
        "Times an interface's ports were opened again after it was deleted and made again, or moved out of the namespace and back.",
    );
    for (name, _, n) in &info.links {
        fam.sample(&[("interface", name)], *n);
    }
    let engine: [Counter<sluice_engine::Counters>; 12] = [
        (
            "sluice_rx_frames_total",
            "Frames the engine received.",
            |c| c.rx,
        ),
        (
            "sluice_tx_frames_total",
            "Frames the engine forwarded or sent.",
            |c| c.tx,
        ),
        (
            "sluice_fast_path_frames_total",
            "Frames of known connections.",
            |c| c.fast_path,
        ),
        (
            "sluice_slow_path_frames_total",
            "Frames that missed conntrack.",
            |c| c.slow_path,
        ),
        (
            "sluice_connections_created_total",
            "Connections created.",
            |c| c.ct_created,
        ),
        (
            "sluice_local_frames_total",
            "Frames answered by the gateway (ARP, NDP, echo).",
            |c| c.local,
        ),
        ("sluice_icmp_errors_sent_total", "ICMP errors sent.", |c| {
            c.icmp_errors
        }),
        (
            "sluice_icmp_errors_limited_total",
            "ICMP errors not sent because of the rate limit.",
            |c| c.icmp_errors_limited,
        ),
        (
            "sluice_tcp_resets_sent_total",
            "TCP resets sent by reject.",
            |c| c.tcp_resets,
        ),
        (
            "sluice_handed_off_frames_total",
            "Frames handed to the worker owning their connection.",
            |c| c.handed_off,
        ),
        (
            "sluice_fragmented_packets_total",
            "Packets fragmented on output.",
            |c| c.fragmented,
        ),
        (
            "sluice_untracked_packets_total",
            "Packets exempted from conntrack by notrack.",
            |c| c.untracked,
        ),
    ];
    for (name, help, f) in engine {
        per_worker(&mut o, name, "counter", help, &|w| f(&w.counters));
    }
    {
        let mut fam = family(
            &mut o,
            "sluice_drops_total",
            "counter",
            "Frames dropped, by reason.",
        );
        for (w, id) in ws.iter().zip(&workers) {
            for r in DropReason::ALL {
                fam.sample(
                    &[("worker", id), ("reason", r.name())],
                    w.counters.drops_for(*r),
                );
            }
        }
    }
    {
        let mut fam = family(
            &mut o,
            "sluice_conntrack_entries",
            "gauge",
            "Connections tracked.",
        );
        for (w, id) in ws.iter().zip(&workers) {
            fam.sample(&[("worker", id), ("family", "ipv4")], w.connections as u64);
            fam.sample(&[("worker", id), ("family", "ipv6")], w.connections6 as u64);
        }
    }
    type PerFamily = fn(&WorkerStatus) -> [usize; 2];
    let limits: [(&str, &str, PerFamily); 2] = [
        (
            "sluice_conntrack_max",
            "Connections a table takes (conntrack.max, split between the workers).",
            |w| w.ct_max,
        ),
        (
            "sluice_conntrack_capacity",
            "Connections a table was built for (the largest max a reload can set).",
            |w| w.ct_capacity,
        ),
    ];
    for (name, help, get) in limits {
        let mut fam = family(&mut o, name, "gauge", help);
        for (w, id) in ws.iter().zip(&workers) {
            let [v4, v6] = get(w);
            fam.sample(&[("worker", id), ("family", "ipv4")], v4 as u64);
            fam.sample(&[("worker", id), ("family", "ipv6")], v6 as u64);
        }
    }
    per_worker(
        &mut o,
        "sluice_conntrack_early_drops_total",
        "counter",
        "Unassured connections evicted to make room (table full).",
        &|w| w.ct_early_drops,
    );
    let nat: [Metric<sluice_nat::NatStats>; 15] = [
        ("sluice_nat_mappings", "gauge", "NAT mappings alive.", |n| {
            n.mappings
        }),
        (
            "sluice_nat_sessions",
            "gauge",
            "Connections holding a NAT mapping.",
            |n| n.sessions,
        ),
        (
            "sluice_nat_subscribers",
            "gauge",
            "Internal addresses holding a session.",
            |n| n.subscribers,
        ),
        (
            "sluice_nat_mappings_created_total",
            "counter",
            "NAT mappings created.",
            |n| n.mappings_created,
        ),
        (
            "sluice_nat_mappings_removed_total",
            "counter",
            "NAT mappings removed.",
            |n| n.mappings_removed,
        ),
        (
            "sluice_nat_pool_exhausted_total",
            "counter",
            "Translations refused for lack of ports.",
            |n| n.pool_exhausted,
        ),
        (
            "sluice_nat_subscriber_limit_total",
            "counter",
            "Sessions refused by the per-subscriber limit.",
            |n| n.subscriber_limit,
        ),
        (
            "sluice_nat_filtered_total",
            "counter",
            "Inbound packets refused by the filtering behaviour.",
            |n| n.filtered,
        ),
        (
            "sluice_nat_hairpins_total",
            "counter",
            "Hairpinned sessions created.",
            |n| n.hairpins,
        ),
        (
            "sluice_nat_port_blocks",
            "gauge",
            "Port blocks held by subscribers.",
            |n| n.blocks,
        ),
        (
            "sluice_nat_port_blocks_allocated_total",
            "counter",
            "Port blocks handed out.",
            |n| n.blocks_allocated,
        ),
        (
            "sluice_nat_port_blocks_released_total",
            "counter",
            "Port blocks freed.",
            |n| n.blocks_released,
        ),
        (
            "sluice_nat_port_block_limit_total",
            "counter",
            "Translations refused at max_blocks_per_subscriber.",
            |n| n.block_limit,
        ),
        (
            "sluice_nat_outside_prefix_total",
            "counter",
            "Deterministic NAT: sources outside the subscriber prefix.",
            |n| n.outside_prefix,
        ),
        (
            "sluice_nat_retired_mappings",
            "gauge",
            "Mappings whose address or port left the pools in a reload, alive until their last session ends.",
            |n| n.retired,
        ),
    ];
    for (name, kind, help, f) in nat {
        per_worker(&mut o, name, kind, help, &|w| f(&w.nat));
    }
    {
        let mut fam = family(
            &mut o,
            "sluice_nat_pool_ports",
            "gauge",
            "Ports of a pool address in this worker's share of its pool's range.",
        );
        for (w, id) in ws.iter().zip(&workers) {
            for p in &w.pools {
                fam.sample(&[("worker", id), ("address", &p.addr.to_string())], p.ports);
            }
        }
    }
    {
        let mut fam = family(
            &mut o,
            "sluice_nat_pool_free_ports",
            "gauge",
            "Free ports (ICMP: identifiers) of a pool address, per worker and protocol.",
        );
        for (w, id) in ws.iter().zip(&workers) {
            for p in &w.pools {
                let a = p.addr.to_string();
                for (proto, free) in ["tcp", "udp", "icmp"].iter().zip(p.free) {
                    fam.sample(
                        &[("worker", id), ("address", &a), ("protocol", proto)],
                        free,
                    );
                }
            }
        }
    }
    if let Some((written, lost, errors)) = info.nat_log {
        family(
            &mut o,
            "sluice_nat_log_lines_total",
            "counter",
            "NAT log lines written.",
        )
        .sample(&[], written);
        family(
            &mut o,
            "sluice_nat_log_lost_total",
            "counter",
            "NAT events never written (ring or queue full, write failed).",
        )
        .sample(&[], lost);
        family(
            &mut o,
            "sluice_nat_log_write_errors_total",
            "counter",
            "Failed NAT log writes.",
        )
        .sample(&[], errors);
    }
    let ports: [Counter<crate::dataplane::PortStatus>; 7] = [
        (
            "sluice_port_rx_frames_total",
            "Frames received on a port.",
            |p| p.rx_frames,
        ),
        (
            "sluice_port_rx_bytes_total",
            "Bytes received on a port.",
            |p| p.rx_bytes,
        ),
        (
            "sluice_port_rx_kernel_drops_total",
            "Frames the kernel dropped before the port's ring.",
            |p| p.rx_kernel_drops,
        ),
        (
            "sluice_port_tx_frames_total",
            "Frames sent on a port.",
            |p| p.tx_frames,
        ),
        ("sluice_port_tx_bytes_total", "Bytes sent on a port.", |p| {
            p.tx_bytes
        }),
        (
            "sluice_port_tx_ring_full_total",
            "Frames the transmit ring had no room for.",
            |p| p.tx_ring_full,
        ),
        ("sluice_port_tx_errors_total", "Transmit errors.", |p| {
            p.tx_errors
        }),
    ];
    for (name, help, f) in ports {
        let mut fam = family(&mut o, name, "counter", help);
        for (w, id) in ws.iter().zip(&workers) {
            for p in &w.ports {
                fam.sample(&[("worker", id), ("interface", &p.interface)], f(p));
            }
        }
    }
    per_worker(
        &mut o,
        "sluice_tx_dropped_total",
        "counter",
        "Frames a port did not accept after one retry.",
        &|w| w.tx_dropped,
    );
    per_worker(
        &mut o,
        "sluice_arp_dropped_total",
        "counter",
        "Frames held for a next hop that did not resolve.",
        &|w| w.arp_dropped,
    );
    per_worker(
        &mut o,
        "sluice_handoff_dropped_total",
        "counter",
        "Frames that could not be handed to their owner worker.",
        &|w| w.handoff_dropped,
    );
    if ws.iter().any(|w| w.offload.is_some()) {
        let off: [Counter<crate::dataplane::OffloadStatus>; 3] = [
            (
                "sluice_offload_installed_total",
                "Directions handed to the XDP offload.",
                |s| s.installed,
            ),
            (
                "sluice_offload_removed_total",
                "Directions taken back from the XDP offload.",
                |s| s.removed,
            ),
            (
                "sluice_offload_failed_total",
                "Offload installs that found no room.",
                |s| s.failed,
            ),
        ];
        for (name, help, f) in off {
            per_worker(&mut o, name, "counter", help, &|w| {
                w.offload.as_ref().map_or(0, f)
            });
        }
    }
    o
}

/// The most of a request the server reads.
const MAX_REQUEST: u64 = 8192;

/// Serve `GET /metrics` on `listener` until `stop` is set (checked every
/// 100 ms). `body` renders the exposition; `None` answers 503. A listener
/// received on `moves` replaces the current one (a reload's new
/// `metrics_listen`, bound by the reload); `None` stops listening.
pub fn serve(
    listener: Option<TcpListener>,
    moves: &std::sync::mpsc::Receiver<Option<TcpListener>>,
    stop: &AtomicBool,
    body: &dyn Fn() -> Option<String>,
) {
    let nonblocking = |l: Option<TcpListener>| {
        l.and_then(|l| match l.set_nonblocking(true) {
            Ok(()) => Some(l),
            Err(e) => {
                tracing::error!("metrics listener: {e}");
                None
            }
        })
    };
    let mut listener = nonblocking(listener);
    while !stop.load(Ordering::Relaxed) {
        while let Ok(next) = moves.try_recv() {
            listener = nonblocking(next);
            tracing::info!(
                listen = ?listener.as_ref().and_then(|l| l.local_addr().ok()),
                "metrics listener replaced"
            );
        }
        let Some(l) = &listener else {
            std::thread::sleep(Duration::from_millis(100));
            continue;
        };
        let conn = match l.accept() {
            Ok((c, _)) => c,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(100));
                continue;
            }
            Err(e) => {
                tracing::warn!("metrics accept: {e}");
                std::thread::sleep(Duration::from_millis(100));
                continue;
            }
        };
        let _ = conn.set_nonblocking(false);
        let _ = conn.set_read_timeout(Some(Duration::from_secs(2)));
        let _ = conn.set_write_timeout(Some(Duration::from_secs(2)));
        // A request line and headers of at most 8 KiB: a client that
        // streams more (or never ends its line) is not read further.
        let mut r = BufReader::new(std::io::Read::take(&conn, MAX_REQUEST));
        let mut line = String::new();
        if r.read_line(&mut line).is_err() {
            continue;
        }
        // Skip the headers (up to the blank line).
        let mut h = String::new();
        while r.read_line(&mut h).map(|n| n > 2).unwrap_or(false) {
            h.clear();
        }
        let mut it = line.split_whitespace();
        let (method, path) = (it.next().unwrap_or(""), it.next().unwrap_or(""));
        let (status, ctype, text) = match (method, path.split('?').next().unwrap_or("")) {
            ("GET", "/metrics" | "/") => match body() {
                Some(b) => ("200 OK", "text/plain; version=0.0.4; charset=utf-8", b),
                None => (
                    "503 Service Unavailable",
                    "text/plain; charset=utf-8",
                    "the workers did not answer\n".to_string(),
                ),
            },
            ("GET", _) => (
                "404 Not Found",
                "text/plain; charset=utf-8",
                "only /metrics is served\n".to_string(),
            ),
            _ => (
                "405 Method Not Allowed",
                "text/plain; charset=utf-8",
                "only GET is served\n".to_string(),
            ),
        };
        let mut w = &conn;
        let _ = write!(
            w,
            "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{text}",
            text.len()
        );
        // Close gracefully: what the client still sends (up to 64 KiB, for
        // at most 200 ms) is read and dropped, so that the close is not a
        // reset that could discard the answer on its way.
        let _ = conn.shutdown(std::net::Shutdown::Write);
        let _ = conn.set_read_timeout(Some(Duration::from_millis(200)));
        let _ = std::io::copy(
            &mut std::io::Read::take(&conn, 1 << 16),
            &mut std::io::sink(),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status() -> WorkerStatus {
        let mut counters = sluice_engine::Counters {
            rx: 10,
            tx: 7,
            ..Default::default()
        };
        counters.drop(DropReason::PolicyDrop);
        WorkerStatus {
            worker: 0,
            counters,
            connections: 3,
            connections6: 1,
            ct_early_drops: 0,
            ct_max: [1000, 100],
            ct_capacity: [4000, 100],
            ports: vec![],
            neighbors: vec![],
            arp_pending: (0, 0),
            neighbors6: vec![],
            ndp_pending: (0, 0),
            arp_dropped: 0,
            tx_dropped: 0,
            handoff_dropped: 0,
            offload: None,
            nat_pools_refused: 0,
            nat: sluice_nat::NatStats {
                mappings: 2,
                ..Default::default()
            },
            pools: vec![crate::dataplane::PoolAddrStatus {
                addr: std::net::Ipv4Addr::new(198, 51, 100, 7),
                ports: 64512,
                free: [64510, 64511, 64512],
                blocks: None,
            }],
            scheduler: "other".into(),
        }
    }

    #[test]
    fn exposition_has_help_type_and_labelled_samples() {
        let text = render(
            &[status()],
            &Info {
                uptime_s: 5,
                rules: 4,
                generation: 1,
                nat_log: Some((9, 0, 0)),
                links: vec![("lan0".into(), "up", 0), ("wan0".into(), "down", 3)],
                reloads: Reloads {
                    ok: 2,
                    failed: 1,
                    last_ok: false,
                    last_success_unix: 1_795_000_000,
                },
            },
        );
        for want in [
            "# TYPE sluice_rx_frames_total counter\nsluice_rx_frames_total{worker=\"0\"} 10\n",
            "sluice_drops_total{worker=\"0\",reason=\"policy-drop\"} 1\n",
            "sluice_conntrack_entries{worker=\"0\",family=\"ipv6\"} 1\n",
            "sluice_conntrack_max{worker=\"0\",family=\"ipv4\"} 1000\n",
            "sluice_conntrack_capacity{worker=\"0\",family=\"ipv4\"} 4000\n",
            "sluice_nat_mappings{worker=\"0\"} 2\n",
            "sluice_nat_pool_free_ports{worker=\"0\",address=\"198.51.100.7\",protocol=\"udp\"} 64511\n",
            "sluice_nat_log_lines_total 9\n",
            "sluice_uptime_seconds 5\n",
            "sluice_interface_link_up{interface=\"lan0\",state=\"up\"} 1\n",
            "sluice_interface_link_up{interface=\"wan0\",state=\"down\"} 0\n",
            "sluice_interface_reopened_total{interface=\"wan0\"} 3\n",
            "sluice_config_reloads_total{result=\"ok\"} 2\n",
            "sluice_config_reloads_total{result=\"failed\"} 1\n",
            "sluice_config_last_reload_successful 0\n",
            "sluice_config_last_reload_success_timestamp_seconds 1795000000\n",
        ] {
            assert!(text.contains(want), "missing {want:?} in\n{text}");
        }
        // Every sample line is `name{labels} value` or `name value`, and
        // every family is declared once.
        let mut declared = std::collections::HashSet::new();
        for l in text.lines() {
            if let Some(rest) = l.strip_prefix("# TYPE ") {
                let name = rest.split(' ').next().unwrap_or_default();
                assert!(declared.insert(name.to_string()), "{name} declared twice");
            } else if !l.starts_with("# HELP ") {
                let (name, value) = l.rsplit_once(' ').unwrap_or_default();
                let base = name.split('{').next().unwrap_or_default();
                assert!(declared.contains(base), "{l}: undeclared");
                assert!(value.parse::<u64>().is_ok(), "{l}");
            }
        }
        assert_eq!(escape("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }

    #[test]
    fn http_server_answers_metrics_404_and_405() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("{e}"));
        let addr = listener.local_addr().unwrap_or_else(|e| panic!("{e}"));
        let stop = AtomicBool::new(false);
        let ask = |req: &str| -> String {
            use std::io::Read;
            let mut c = std::net::TcpStream::connect(addr).unwrap_or_else(|e| panic!("{e}"));
            c.write_all(req.as_bytes()).unwrap_or_default();
            let mut s = String::new();
            let _ = c.read_to_string(&mut s);
            s
        };
        let (_tx, rx) = std::sync::mpsc::channel();
        let st = &stop;
        std::thread::scope(|sc| {
            sc.spawn(move || serve(Some(listener), &rx, st, &|| Some("sluice_up 1\n".into())));
            let ok = ask("GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
            assert!(ok.starts_with("HTTP/1.1 200 OK\r\n"), "{ok}");
            assert!(
                ok.contains("version=0.0.4") && ok.ends_with("\r\n\r\nsluice_up 1\n"),
                "{ok}"
            );
            let nf = ask("GET /other HTTP/1.0\r\n\r\n");
            assert!(nf.starts_with("HTTP/1.1 404"), "{nf}");
            let na = ask("POST /metrics HTTP/1.1\r\n\r\n");
            assert!(na.starts_with("HTTP/1.1 405"), "{na}");
            // A request line that never ends: read up to the limit, then
            // answered (not a method the server knows), and the server
            // goes on serving.
            let long = ask(&"A".repeat(40_000));
            assert!(long.starts_with("HTTP/1.1 405"), "{long}");
            let again = ask("GET /metrics HTTP/1.1\r\n\r\n");
            assert!(again.starts_with("HTTP/1.1 200 OK"), "{again}");
            stop.store(true, Ordering::Relaxed);
        });
    }

    /// A listener handed over on the channel replaces the running one (the
    /// old address stops answering, the new one serves); `None` stops
    /// serving; a server started without one takes one later.
    #[test]
    fn http_server_moves_to_a_new_listener_and_stops_on_none() {
        let get = |addr: std::net::SocketAddr| -> Option<String> {
            use std::io::Read;
            let mut c = std::net::TcpStream::connect(addr).ok()?;
            c.write_all(b"GET /metrics HTTP/1.1\r\n\r\n").ok()?;
            let mut s = String::new();
            c.read_to_string(&mut s).ok()?;
            Some(s)
        };
        let until = |f: &dyn Fn() -> bool| {
            let t = std::time::Instant::now();
            while !f() {
                assert!(t.elapsed() < Duration::from_secs(5), "timed out");
                std::thread::sleep(Duration::from_millis(20));
            }
        };
        let bind = || TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("{e}"));
        let (a, b) = (bind(), bind());
        let (aa, ba) = (
            a.local_addr().unwrap_or_else(|e| panic!("{e}")),
            b.local_addr().unwrap_or_else(|e| panic!("{e}")),
        );
        let stop = AtomicBool::new(false);
        let (tx, rx) = std::sync::mpsc::channel();
        let st = &stop;
        std::thread::scope(|sc| {
            sc.spawn(move || serve(None, &rx, st, &|| Some("sluice_up 1\n".into())));
            tx.send(Some(a)).unwrap_or_default();
            until(&|| get(aa).is_some_and(|r| r.starts_with("HTTP/1.1 200 OK")));
            tx.send(Some(b)).unwrap_or_default();
            until(&|| get(ba).is_some_and(|r| r.starts_with("HTTP/1.1 200 OK")));
            assert!(get(aa).is_none(), "the old address still answers");
            tx.send(None).unwrap_or_default();
            until(&|| get(ba).is_none());
            stop.store(true, Ordering::Relaxed);
        });
    }
}
