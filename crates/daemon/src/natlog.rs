//! The NAT log (RFC 6888 REQ-12: a CGN must be able to log the creation
//! and removal of its address and port mappings, so that an external
//! address and port at a given time can be traced to a subscriber).
//!
//! Each worker's engine stamps its mapping events into a bounded ring
//! ([`sluice_engine::NatLog`], the time of the batch that caused them).
//! Every housekeeping turn (10 ms) the worker moves what its ring holds
//! into one batch on a bounded channel ([`NatLogLink::drain`]); one logger
//! thread formats the batches and appends them to `nat.log`, flushing
//! after each burst. Nothing on the packet path formats, allocates or
//! waits: a full ring overwrites its oldest event and a full channel drops
//! the batch, and both are counted as `lost` (`sluice ctl status`).
//!
//! SIGHUP (and `sluice ctl reload`) reopens the file, so that logrotate's
//! `postrotate kill -HUP` works; a file that cannot be reopened keeps the
//! old one and the error is logged.

use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender};
use std::sync::Arc;
use std::thread::JoinHandle;

use sluice_engine::{LoggedEvent, NatLog};
use sluice_nat::EventView;
use sluice_ruleset::timefmt::format_rfc3339_ms;

use crate::config::{LogDest, LogFormat, NatLogConfig};

/// Events each worker's ring holds between two drains when a NAT log is
/// configured (a worker creating 3 M mappings/s fills 30 000 per 10 ms
/// housekeeping turn); 24 bytes each.
pub const RING_EVENTS: usize = 1 << 17;
/// Batches waiting for the logger thread.
const QUEUE: usize = 256;

/// What the logger thread is told.
pub enum LogMsg {
    /// One worker's drained events, oldest first.
    Events(Vec<LoggedEvent>),
    /// Reopen the file (SIGHUP).
    Reopen,
    /// Write to another destination from now on (a reload's `nat.log`),
    /// already opened, in its format: what is queued before goes to the
    /// old one, which is flushed and closed.
    Retarget(Box<(Out, String, LogFormat)>),
    /// Flush and stop.
    Stop,
}

/// Counters shared by the workers and the logger thread.
#[derive(Debug, Default)]
pub struct NatLogStats {
    /// Lines written.
    pub written: AtomicU64,
    /// Events never written: overwritten in a worker's ring, dropped with a
    /// batch the channel had no room for, or lost with a failed write.
    pub lost: AtomicU64,
    /// Failed writes (each logged).
    pub write_errors: AtomicU64,
}

/// A worker's end of the NAT log.
pub struct NatLogLink {
    tx: SyncSender<LogMsg>,
    stats: Arc<NatLogStats>,
    /// The ring's `lost` count already added to `stats.lost`.
    ring_lost: u64,
}

impl NatLogLink {
    /// Move every event of `ring` to the logger (one batch), and count what
    /// the ring lost since the last call.
    pub fn drain(&mut self, ring: &mut NatLog) {
        if ring.lost != self.ring_lost {
            self.stats
                .lost
                .fetch_add(ring.lost.wrapping_sub(self.ring_lost), Ordering::Relaxed);
            self.ring_lost = ring.lost;
        }
        if ring.is_empty() {
            return;
        }
        let batch: Vec<LoggedEvent> = ring.drain().collect();
        let n = batch.len() as u64;
        // A full queue (or a stopped logger) loses the batch, counted.
        if self.tx.try_send(LogMsg::Events(batch)).is_err() {
            self.stats.lost.fetch_add(n, Ordering::Relaxed);
        }
    }
}

/// The control plane's end of the NAT log: links for workers, reopen,
/// status.
#[derive(Clone)]
pub struct NatLogHandle {
    tx: SyncSender<LogMsg>,
    stats: Arc<NatLogStats>,
    /// The destination written now (a reload may change it).
    config: Arc<std::sync::Mutex<NatLogConfig>>,
    block_size: u16,
}

/// A NAT log destination opened for [`NatLogHandle::retarget`].
pub struct NewDest {
    out: Out,
    config: NatLogConfig,
}

/// The logger thread and its channel.
pub struct NatLogger {
    handle: NatLogHandle,
    thread: Option<JoinHandle<()>>,
}

fn open(path: &Path) -> std::io::Result<File> {
    OpenOptions::new().create(true).append(true).open(path)
}

/// RFC 5424 PRI of the syslog messages: facility local0 (16), severity
/// informational (6).
const SYSLOG_PRI: u32 = 16 * 8 + 6;

/// The logger thread's output.
pub struct Out(OutKind);

/// [`Out`]'s destinations.
enum OutKind {
    File {
        path: PathBuf,
        w: BufWriter<File>,
    },
    /// One RFC 5424 message per event, one UDP datagram each (RFC 5426).
    Syslog {
        sock: UdpSocket,
        to: SocketAddr,
        /// `HOSTNAME APP-NAME PROCID MSGID -` after the time stamp.
        header: String,
        buf: String,
    },
    /// IPFIX messages over UDP ([`crate::ipfix`]), a batch at a time.
    Ipfix {
        sock: UdpSocket,
        to: SocketAddr,
        exporter: crate::ipfix::Exporter,
    },
}

/// A UDP socket of `to`'s family.
fn udp_for(to: &SocketAddr) -> Result<UdpSocket, String> {
    let bind: SocketAddr = if to.is_ipv4() {
        (std::net::Ipv4Addr::UNSPECIFIED, 0).into()
    } else {
        (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
    };
    UdpSocket::bind(bind).map_err(|e| format!("nat.log: cannot open a UDP socket for {to}: {e}"))
}

impl Out {
    fn open(dest: &LogDest, block_size: u16) -> Result<Self, String> {
        OutKind::open(dest, block_size).map(Out)
    }
}

impl OutKind {
    fn open(dest: &LogDest, block_size: u16) -> Result<Self, String> {
        match dest {
            LogDest::File(path) => {
                let f = open(path).map_err(|e| {
                    format!("nat.log: cannot open {} for appending: {e}", path.display())
                })?;
                Ok(OutKind::File {
                    path: path.clone(),
                    w: BufWriter::with_capacity(1 << 16, f),
                })
            }
            LogDest::Ipfix(to) => Ok(OutKind::Ipfix {
                sock: udp_for(to)?,
                to: *to,
                // Observation domain 1: one exporting process per gateway.
                exporter: crate::ipfix::Exporter::new(1, block_size),
            }),
            LogDest::Syslog(to) => {
                let sock = udp_for(to)?;
                let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
                    .map(|h| h.trim().to_string())
                    .ok()
                    .filter(|h| !h.is_empty() && h.is_ascii() && !h.contains(' '))
                    .unwrap_or_else(|| "-".into());
                Ok(OutKind::Syslog {
                    sock,
                    to: *to,
                    header: format!("{host} sluice {} NAT -", std::process::id()),
                    buf: String::with_capacity(512),
                })
            }
        }
    }

    /// One event's line (without newline), stamped `wall_ms`.
    fn line(&mut self, wall_ms: u64, line: &str) -> std::io::Result<()> {
        match self {
            OutKind::File { w, .. } => {
                w.write_all(line.as_bytes())?;
                w.write_all(b"\n")
            }
            OutKind::Ipfix { .. } => Ok(()),
            OutKind::Syslog {
                sock,
                to,
                header,
                buf,
            } => {
                use std::fmt::Write as _;
                buf.clear();
                let _ = write!(
                    buf,
                    "<{SYSLOG_PRI}>1 {} {header} {line}",
                    format_rfc3339_ms(wall_ms)
                );
                sock.send_to(buf.as_bytes(), *to).map(|_| ())
            }
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            OutKind::File { w, .. } => w.flush(),
            OutKind::Syslog { .. } | OutKind::Ipfix { .. } => Ok(()),
        }
    }

    /// One batch of events: (written, lost, the first error).
    fn batch(
        &mut self,
        evs: &[LoggedEvent],
        format: LogFormat,
        line: &mut String,
    ) -> (u64, u64, Option<std::io::Error>) {
        let (mut ok, mut lost) = (0u64, 0u64);
        let mut err = None;
        if let OutKind::Ipfix { sock, to, exporter } = self {
            let now_s = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs() as u32);
            for (m, n) in exporter.messages(evs, now_s) {
                match sock.send_to(&m, *to) {
                    Ok(_) => ok += n,
                    Err(x) => {
                        lost += n;
                        err.get_or_insert(x);
                    }
                }
            }
            return (ok, lost, err);
        }
        for e in evs {
            line.clear();
            format_event(line, e, format);
            // A file stops at its first failed write (the rest of the
            // batch is lost); a datagram's failure is that datagram's.
            if err.is_some() && matches!(self, OutKind::File { .. }) {
                lost += 1;
                continue;
            }
            match self.line(e.wall_ms, line) {
                Ok(()) => ok += 1,
                Err(x) => {
                    lost += 1;
                    err.get_or_insert(x);
                }
            }
        }
        (ok, lost, err)
    }

    /// SIGHUP: reopen a file (log rotation); nothing for syslog.
    fn reopen(&mut self) {
        let OutKind::File { path, w } = self else {
            return;
        };
        let _ = w.flush();
        match open(path) {
            Ok(f) => {
                *w = BufWriter::with_capacity(1 << 16, f);
                tracing::info!(path = %path.display(), "NAT log reopened");
            }
            Err(e) => tracing::error!(
                path = %path.display(),
                "NAT log not reopened ({e}); still writing the old file"
            ),
        }
    }
}

impl NatLogger {
    /// Open the destination (an error names it) and start the thread.
    pub fn start(config: &NatLogConfig, block_size: u16) -> Result<Self, String> {
        let Out(out) = Out::open(&config.dest, block_size)?;
        let (tx, rx) = mpsc::sync_channel(QUEUE);
        let stats = Arc::new(NatLogStats::default());
        let st = Arc::clone(&stats);
        let (dest, format) = (config.dest.to_string(), config.format);
        let thread = std::thread::Builder::new()
            .name("sluice-natlog".into())
            .spawn(move || run(rx, out, &dest, format, &st))
            .map_err(|e| format!("nat.log: cannot start the logger thread: {e}"))?;
        tracing::info!(dest = %config.dest, "NAT log open");
        Ok(Self {
            handle: NatLogHandle {
                tx,
                stats,
                config: Arc::new(std::sync::Mutex::new(config.clone())),
                block_size,
            },
            thread: Some(thread),
        })
    }

    /// The handle the control plane keeps.
    pub fn handle(&self) -> NatLogHandle {
        self.handle.clone()
    }

    /// Write what is queued and stop (after the workers have stopped and
    /// drained their rings).
    pub fn stop(mut self) {
        let _ = self.handle.tx.send(LogMsg::Stop);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl NatLogHandle {
    /// A link for one worker.
    pub fn link(&self) -> NatLogLink {
        NatLogLink {
            tx: self.tx.clone(),
            stats: Arc::clone(&self.stats),
            ring_lost: 0,
        }
    }

    /// Ask the thread to reopen the file (SIGHUP).
    pub fn reopen(&self) {
        let _ = self.tx.send(LogMsg::Reopen);
    }

    /// The destination and format written now.
    pub fn config(&self) -> NatLogConfig {
        self.config
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Open `config`'s destination for [`Self::retarget`] (a reload checks
    /// it before it changes anything): an error names it.
    pub fn open_dest(&self, config: &NatLogConfig) -> Result<NewDest, String> {
        Ok(NewDest {
            out: Out::open(&config.dest, self.block_size)?,
            config: config.clone(),
        })
    }

    /// Write to `new` from now on (a reload); events queued before go to
    /// the old destination, which is flushed and closed.
    pub fn retarget(&self, new: NewDest) -> Result<(), String> {
        let NewDest { out, config } = new;
        self.tx
            .send(LogMsg::Retarget(Box::new((
                out,
                config.dest.to_string(),
                config.format,
            ))))
            .map_err(|_| "nat.log: the logger thread is gone".to_string())?;
        tracing::info!(dest = %config.dest, "NAT log now written to a new destination");
        *self.config.lock().unwrap_or_else(|e| e.into_inner()) = config;
        Ok(())
    }

    /// (lines written, events lost, write errors).
    pub fn counts(&self) -> (u64, u64, u64) {
        (
            self.stats.written.load(Ordering::Relaxed),
            self.stats.lost.load(Ordering::Relaxed),
            self.stats.write_errors.load(Ordering::Relaxed),
        )
    }

    /// `sluice ctl status`'s `nat_log` object.
    pub fn status(&self) -> serde_json::Value {
        let config = self.config();
        serde_json::json!({
            "path": config.dest.to_string(),
            "format": match config.format { LogFormat::Text => "text", LogFormat::Json => "json" },
            "written": self.stats.written.load(Ordering::Relaxed),
            "lost": self.stats.lost.load(Ordering::Relaxed),
            "write_errors": self.stats.write_errors.load(Ordering::Relaxed),
        })
    }
}

fn run(
    rx: Receiver<LogMsg>,
    mut out: OutKind,
    dest: &str,
    mut format: LogFormat,
    stats: &NatLogStats,
) {
    let mut dest = dest.to_string();
    let mut line = String::with_capacity(256);
    let mut failing = false;
    let note = |r: std::io::Result<()>, n: u64, failing: &mut bool, dest: &str| match r {
        Ok(()) => {
            stats.written.fetch_add(n, Ordering::Relaxed);
            *failing = false;
        }
        Err(e) => {
            stats.write_errors.fetch_add(1, Ordering::Relaxed);
            stats.lost.fetch_add(n, Ordering::Relaxed);
            if !*failing {
                tracing::error!(dest, "NAT log write failed: {e}");
            }
            *failing = true;
        }
    };
    while let Ok(first) = rx.recv() {
        // Everything queued now, then one flush.
        let mut msg = Some(first);
        let mut stop = false;
        while let Some(m) = msg.take() {
            match m {
                LogMsg::Events(evs) => {
                    let (ok, lost, err) = out.batch(&evs, format, &mut line);
                    match err {
                        None => note(Ok(()), ok, &mut failing, &dest),
                        Some(x) => {
                            stats.written.fetch_add(ok, Ordering::Relaxed);
                            note(Err(x), lost, &mut failing, &dest);
                        }
                    }
                }
                LogMsg::Reopen => out.reopen(),
                LogMsg::Retarget(b) => {
                    let (Out(new), d, f) = *b;
                    note(out.flush(), 0, &mut failing, &dest);
                    out = new;
                    dest = d;
                    format = f;
                    failing = false;
                }
                LogMsg::Stop => stop = true,
            }
            if !stop {
                msg = rx.try_recv().ok();
            }
        }
        note(out.flush(), 0, &mut failing, &dest);
        if stop {
            break;
        }
    }
}

fn proto_name(p: u8) -> String {
    match p {
        6 => "tcp".into(),
        17 => "udp".into(),
        1 => "icmp".into(),
        n => n.to_string(),
    }
}

/// One log line (without its newline).
///
/// Text: `TIME nat=mapping-created proto=tcp int=10.0.0.2:40000
/// ext=198.51.100.1:1030 worker=0`. JSON: the same fields as an object,
/// the addresses and ports apart.
pub fn format_event(out: &mut String, e: &LoggedEvent, format: LogFormat) {
    use std::fmt::Write as _;
    let time = format_rfc3339_ms(e.wall_ms);
    let mapping = |name: &str, proto: u8, int: (Ipv4Addr, u16), ext: (Ipv4Addr, u16), worker| {
        let proto = proto_name(proto);
        match format {
            LogFormat::Text => format!(
                "{time} nat={name} proto={proto} int={}:{} ext={}:{} worker={worker}",
                int.0, int.1, ext.0, ext.1
            ),
            LogFormat::Json => serde_json::json!({
                "time": time, "event": name, "proto": proto,
                "int_addr": int.0.to_string(), "int_port": int.1,
                "ext_addr": ext.0.to_string(), "ext_port": ext.1,
                "worker": worker,
            })
            .to_string(),
        }
    };
    let block = |name: &str, int: Ipv4Addr, ext: Ipv4Addr, ports: (u16, u16), worker| match format {
        LogFormat::Text => format!(
            "{time} nat={name} int={int} ext={ext} ports={}-{} worker={worker}",
            ports.0, ports.1
        ),
        LogFormat::Json => serde_json::json!({
            "time": time, "event": name,
            "int_addr": int.to_string(), "ext_addr": ext.to_string(),
            "first_port": ports.0, "last_port": ports.1, "worker": worker,
        })
        .to_string(),
    };
    let line = match e.event.view() {
        EventView::Mapping(v) => mapping(
            if v.created {
                "mapping-created"
            } else {
                "mapping-removed"
            },
            v.proto,
            v.int,
            v.ext,
            v.worker,
        ),
        EventView::Block(v) => block(
            if v.allocated {
                "block-allocated"
            } else {
                "block-released"
            },
            v.int_addr,
            v.ext_addr,
            v.ports,
            v.worker,
        ),
    };
    let _ = out.write_str(&line);
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_nat::NatEvent;

    fn created() -> LoggedEvent {
        LoggedEvent {
            wall_ms: 1_795_000_000_123,
            event: NatEvent::MappingCreated {
                proto: 6,
                int_addr: Ipv4Addr::new(10, 0, 0, 2),
                int_port: 40000,
                ext_addr: Ipv4Addr::new(198, 51, 100, 1),
                ext_port: 1030,
                worker: 1,
            },
        }
    }

    #[test]
    fn text_and_json_lines() {
        let mut s = String::new();
        format_event(&mut s, &created(), LogFormat::Text);
        assert_eq!(
            s,
            "2026-11-18T11:06:40.123Z nat=mapping-created proto=tcp int=10.0.0.2:40000 \
             ext=198.51.100.1:1030 worker=1"
        );
        s.clear();
        format_event(&mut s, &created(), LogFormat::Json);
        let v: serde_json::Value = serde_json::from_str(&s).unwrap_or_default();
        assert_eq!(v["event"], "mapping-created");
        assert_eq!(v["time"], "2026-11-18T11:06:40.123Z");
        assert_eq!(v["int_addr"], "10.0.0.2");
        assert_eq!(v["ext_port"], 1030);
        assert_eq!(v["proto"], "tcp");
        let block = LoggedEvent {
            wall_ms: 0,
            event: NatEvent::BlockAllocated {
                int_addr: Ipv4Addr::new(100, 64, 0, 9),
                ext_addr: Ipv4Addr::new(198, 51, 100, 1),
                first_port: 1024,
                last_port: 1535,
                worker: 0,
            },
        };
        s.clear();
        format_event(&mut s, &block, LogFormat::Text);
        assert_eq!(
            s,
            "1970-01-01T00:00:00.000Z nat=block-allocated int=100.64.0.9 ext=198.51.100.1 \
             ports=1024-1535 worker=0"
        );
        s.clear();
        format_event(&mut s, &block, LogFormat::Json);
        let v: serde_json::Value = serde_json::from_str(&s).unwrap_or_default();
        assert_eq!(v["event"], "block-allocated");
        assert_eq!(v["last_port"], 1535);
    }

    #[test]
    fn logger_writes_reopens_and_counts() {
        let dir = std::env::temp_dir().join(format!("sluice-natlog-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&dir);
        let path = dir.join("nat.log");
        let _ = std::fs::remove_file(&path);
        let cfg = NatLogConfig {
            dest: LogDest::File(path.clone()),
            format: LogFormat::Text,
        };
        let logger = NatLogger::start(&cfg, 0).unwrap_or_else(|e| panic!("{e}"));
        let h = logger.handle();
        let mut link = h.link();
        let mut ring = NatLog::default();
        // A ring of capacity 0 loses everything it is given: counted.
        sluice_nat::NatEventSink::event(&mut ring, &created().event);
        link.drain(&mut ring);
        link.tx
            .send(LogMsg::Events(vec![created(), created()]))
            .unwrap_or_default();
        // Rotate: the old file is renamed, SIGHUP reopens the path.
        let rotated = dir.join("nat.log.1");
        let _ = std::fs::remove_file(&rotated);
        // Wait until the two lines are written before renaming.
        for _ in 0..200 {
            if h.stats.written.load(Ordering::Relaxed) == 2 {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        std::fs::rename(&path, &rotated).unwrap_or_default();
        h.reopen();
        link.tx
            .send(LogMsg::Events(vec![created()]))
            .unwrap_or_default();
        logger.stop();
        let st = h.status();
        let old = std::fs::read_to_string(&rotated).unwrap_or_default();
        let new = std::fs::read_to_string(&path).unwrap_or_default();
        assert_eq!(old.lines().count(), 2, "{old}");
        assert_eq!(new.lines().count(), 1, "{new}");
        assert!(new.contains("nat=mapping-created proto=tcp"), "{new}");
        assert_eq!(st["lost"], 1);
        assert_eq!(st["written"], 3);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A logger sending to a UDP socket on loopback: (the socket, its
    /// address, the logger).
    fn udp_logger(
        dest: fn(SocketAddr) -> LogDest,
        block_size: u16,
    ) -> (UdpSocket, SocketAddr, NatLogger) {
        let rx = UdpSocket::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("{e}"));
        let to = rx.local_addr().unwrap_or_else(|e| panic!("{e}"));
        let _ = rx.set_read_timeout(Some(std::time::Duration::from_secs(5)));
        let logger = NatLogger::start(
            &NatLogConfig {
                dest: dest(to),
                format: LogFormat::Text,
            },
            block_size,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        (rx, to, logger)
    }

    #[test]
    fn syslog_datagrams_are_rfc5424() {
        let (rx, to, logger) = udp_logger(LogDest::Syslog, 0);
        let h = logger.handle();
        h.tx.send(LogMsg::Events(vec![created(), created()]))
            .unwrap_or_default();
        let mut got = Vec::new();
        let mut buf = [0u8; 1500];
        for _ in 0..2 {
            let n = rx.recv(&mut buf).unwrap_or(0);
            got.push(String::from_utf8_lossy(&buf[..n]).to_string());
        }
        logger.stop();
        let pid = std::process::id();
        for d in &got {
            assert!(
                d.starts_with("<134>1 2026-11-18T11:06:40.123Z ")
                    && d.contains(&format!(" sluice {pid} NAT - 2026-11-18T11:06:40.123Z nat=mapping-created proto=tcp int=10.0.0.2:40000 ")),
                "{d}"
            );
        }
        assert_eq!(h.status()["written"], 2);
        assert_eq!(h.status()["path"], format!("udp://{to}"));
    }

    #[test]
    fn ipfix_datagrams_carry_templates_and_records() {
        let (rx, to, logger) = udp_logger(LogDest::Ipfix, 128);
        let h = logger.handle();
        h.tx.send(LogMsg::Events(vec![created(), created(), created()]))
            .unwrap_or_default();
        let mut buf = [0u8; 2000];
        let n = rx.recv(&mut buf).unwrap_or(0);
        logger.stop();
        let m = buf.get(..n).unwrap_or_default();
        let be16 = |i: usize| {
            m.get(i..i + 2)
                .map_or(0, |b| u16::from_be_bytes([b[0], b[1]]))
        };
        assert_eq!((be16(0), usize::from(be16(2))), (10, n), "IPFIX header");
        assert_eq!(be16(16), 2, "the first message starts with the templates");
        // Template set, then one data set of 3 mapping records (22 bytes).
        let data = 16 + usize::from(be16(18));
        assert_eq!(
            (be16(data), be16(data + 2)),
            (crate::ipfix::T_MAPPING, 4 + 3 * 22)
        );
        assert_eq!(n, data + 4 + 3 * 22);
        assert_eq!(h.status()["written"], 3);
        assert_eq!(h.status()["path"], format!("ipfix://{to}"));
    }

    #[test]
    fn unopenable_file_is_a_clear_error() {
        let cfg = NatLogConfig {
            dest: LogDest::File(PathBuf::from("/nonexistent-dir/nat.log")),
            format: LogFormat::Json,
        };
        let e = NatLogger::start(&cfg, 0).err().unwrap_or_default();
        assert!(
            e.starts_with("nat.log: cannot open /nonexistent-dir/nat.log for appending:"),
            "{e}"
        );
    }
}
