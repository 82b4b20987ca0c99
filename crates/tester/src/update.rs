//! `sluice bench update`: rule-update cost against a running gateway,
//! through the control socket operators use (`sluice ctl`).
//!
//! The device under test is a real `sluice run` ([`sluice_daemon::run`]) in
//! this process, on the `mem` backend (in-memory ports, so no root and no
//! interfaces are needed; the control plane, the policy compiler and the
//! publication to the worker are the production code). Every figure is a
//! client-side wall-clock time of complete control requests: send the
//! request, the daemon parses, lowers, updates and publishes, reply.
//!
//! Procedure (seed 002's measurements, on Sluice):
//! 1. load a rule set of `objects` ClassBench-style 5-tuple rules with
//!    `ruleset replace` (parse + compile + publish): `load_s`;
//! 2. `insert rule … position H` of one rule before a random loaded rule,
//!    `samples` times, each a separate request: median `insert_us`;
//! 3. `delete rule … handle H` of each inserted rule: median `delete_us`;
//! 4. `add rule` of `appends` rules one at a time to the end of the loaded
//!    chain: total `append_at_150k_s`;
//! 5. seed 002's own test: an empty forward chain (`ruleset replace` with a
//!    rule set that has none), then `appends` one-at-a-time `add rule ip
//!    filter forward ip saddr A accept` (seed 002 ran `iptables -A FORWARD -j
//!    ACCEPT -s A` 3000 times after `iptables -F FORWARD`: 34 s):
//!    `append_3000_s`;
//! 6. step 5 again with a new connection per request:
//!    `append_3000_new_conn_s`.
//!
//! Steps 1-3 and 6 open a connection per request, as separate `sluice ctl`
//! calls do (minus the process start); the appends of steps 4 and 5 go over
//! one kept connection ([`Session`]), each sent only once the previous one
//! was acknowledged, so each is still applied and published on its own.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

/// What to measure.
#[derive(Debug, Clone)]
pub struct UpdateOptions {
    /// Rules loaded before single updates are timed.
    pub objects: usize,
    /// Single inserts (and deletes) timed.
    pub samples: usize,
    /// One-at-a-time appends timed.
    pub appends: usize,
    /// Generator seed.
    pub seed: u64,
    /// The gateway's `heap_reserve_mib`: heap backed with memory when it
    /// starts, so that the load reuses resident pages (0: none).
    pub heap_reserve_mib: u32,
    /// The `sluice` executable: step 7 times the appends of step 5 as one
    /// `sluice ctl` process each, as an operator's script runs them (and
    /// as `--kernel` runs the kernel's tools). `None`: step 7 is skipped.
    pub ctl_exe: Option<PathBuf>,
}

/// The default [`UpdateOptions::heap_reserve_mib`]: enough for the default
/// 150 000-rule load (its peak is about 400 MiB of the process's heap,
/// client side included).
pub const DEFAULT_HEAP_RESERVE_MIB: u32 = 512;

impl Default for UpdateOptions {
    fn default() -> Self {
        UpdateOptions {
            objects: 150_000,
            samples: 200,
            appends: 3000,
            seed: 1,
            heap_reserve_mib: DEFAULT_HEAP_RESERVE_MIB,
            ctl_exe: None,
        }
    }
}

/// The result (`--json` keys).
#[derive(Debug, Clone, Serialize)]
pub struct UpdateReport {
    /// Rules loaded.
    pub objects: usize,
    /// Median µs of one `insert rule` request with `objects` loaded.
    pub insert_us_at_150k: f64,
    /// Median µs of one `delete rule` request with `objects` loaded.
    pub delete_us_at_150k: f64,
    /// 99th percentile of the inserts, µs.
    pub insert_p99_us: f64,
    /// 99th percentile of the deletes, µs.
    pub delete_p99_us: f64,
    /// Median µs the daemon spent applying one insert (its own timer),
    /// without the socket round trip.
    pub insert_apply_us: f64,
    /// Seconds to load `objects` rules with `ruleset replace`.
    pub load_150k_s: f64,
    /// Seconds for `appends` one-at-a-time `add rule … ip saddr A accept`
    /// requests to an empty chain (seed 002's test).
    pub append_3000_s: f64,
    /// [`Self::append_3000_s`] with a new control connection for every
    /// request (as separate `sluice ctl` calls, minus the process start).
    pub append_3000_new_conn_s: f64,
    /// Seconds for `appends` one-at-a-time 5-tuple `add rule` requests to
    /// the end of the chain with `objects` rules loaded.
    pub append_3000_at_150k_s: f64,
    /// [`Self::append_3000_s`] with a `sluice ctl` process for every
    /// append (step 7; `None` without [`UpdateOptions::ctl_exe`]).
    pub append_3000_ctl_process_s: Option<f64>,
    /// Appends made.
    pub appends: usize,
    /// Single inserts and deletes timed.
    pub samples: usize,
    /// The gateway's `heap_reserve_mib`.
    pub heap_reserve_mib: u32,
    /// Seconds from starting the gateway until it answered `status`
    /// (the heap reserve included).
    pub gateway_start_s: f64,
    /// Minor page faults of this process (client and gateway) during the
    /// load; `None` where `/proc/self/stat` is unreadable.
    pub load_page_faults: Option<u64>,
    /// The process's resident set after the load, as the gateway's
    /// `status` reports it (`resident_bytes`).
    pub resident_after_load_bytes: Option<u64>,
}

/// This process's minor page faults so far (`minflt`, field 10 of
/// `/proc/self/stat`).
fn minor_faults() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // The command name (field 2) is in parentheses and may hold spaces.
    let rest = stat.get(stat.rfind(')')? + 1..)?;
    rest.split_whitespace().nth(7)?.parse().ok()
}

/// Errors of the procedure.
#[derive(Debug, thiserror::Error)]
pub enum UpdateBenchError {
    /// Files in the scratch directory.
    #[error("{0}: {1}")]
    Io(String, std::io::Error),
    /// The gateway failed to start or stopped.
    #[error("gateway: {0}")]
    Gateway(String),
    /// A control request failed.
    #[error("control request {0:?}: {1}")]
    Request(String, String),
}

/// A small deterministic generator (SplitMix64).
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// One ClassBench-style 5-tuple rule (prefixes of mixed lengths, a port
/// range or exact port, TCP or UDP, accept or drop).
fn rule(r: &mut Rng) -> String {
    GenRule::draw(r).nft()
}

/// One generated rule, printable in nft and iptables syntax.
pub(crate) struct GenRule {
    src: (std::net::Ipv4Addr, u32),
    dst: (std::net::Ipv4Addr, u32),
    udp: bool,
    /// First and last port, and whether it was drawn as a range (which may
    /// hold one port).
    ports: (u64, u64, bool),
    accept: bool,
}

impl GenRule {
    /// The next rule of `r` (the draws in the order the nft text always
    /// used: protocol, port, verdict, source, destination).
    pub(crate) fn draw(r: &mut Rng) -> Self {
        let prefix = |r: &mut Rng| {
            let len = [8u32, 16, 16, 24, 24, 24, 32, 32][r.below(8) as usize];
            let a = (r.next() as u32) & (u32::MAX << (32 - len));
            (std::net::Ipv4Addr::from(a), len)
        };
        let udp = r.below(4) == 0;
        let ports = match r.below(3) {
            0 => {
                let p = 1 + r.below(1023);
                (p, p, false)
            }
            1 => {
                let lo = 1024 + r.below(60_000);
                (lo, lo + r.below(512), true)
            }
            _ => {
                let p = 1 + r.below(65_534);
                (p, p, false)
            }
        };
        let accept = r.below(5) != 0;
        let src = prefix(r);
        let dst = prefix(r);
        GenRule {
            src,
            dst,
            udp,
            ports,
            accept,
        }
    }

    /// `ip saddr P ip daddr Q tcp|udp dport N[-M] accept|drop`.
    pub(crate) fn nft(&self) -> String {
        let port = if self.ports.2 {
            format!("{}-{}", self.ports.0, self.ports.1)
        } else {
            self.ports.0.to_string()
        };
        format!(
            "ip saddr {}/{} ip daddr {}/{} {} dport {port} {}",
            self.src.0,
            self.src.1,
            self.dst.0,
            self.dst.1,
            if self.udp { "udp" } else { "tcp" },
            if self.accept { "accept" } else { "drop" }
        )
    }

    /// The same rule as iptables arguments after `-A FORWARD`.
    pub(crate) fn iptables(&self) -> Vec<String> {
        let proto = if self.udp { "udp" } else { "tcp" };
        let port = if self.ports.2 {
            format!("{}:{}", self.ports.0, self.ports.1)
        } else {
            self.ports.0.to_string()
        };
        [
            "-s",
            &format!("{}/{}", self.src.0, self.src.1),
            "-d",
            &format!("{}/{}", self.dst.0, self.dst.1),
            "-p",
            proto,
            "-m",
            proto,
            "--dport",
            &port,
            "-j",
            if self.accept { "ACCEPT" } else { "DROP" },
        ]
        .iter()
        .map(|x| x.to_string())
        .collect()
    }
}

/// `n` generated rules (the statement text after `add rule … forward`).
pub fn rules(n: usize, seed: u64) -> Vec<String> {
    let mut r = Rng(seed);
    (0..n).map(|_| rule(&mut r)).collect()
}

/// The loaded rule set: `n` rules in one forward chain.
pub fn ruleset_text(n: usize, seed: u64) -> String {
    let mut r = Rng(seed);
    let mut s = String::with_capacity(n * 80 + 256);
    s.push_str(
        "table ip filter {\n  chain forward {\n    type filter hook forward priority 0; policy accept;\n",
    );
    for _ in 0..n {
        let _ = writeln!(s, "    {}", rule(&mut r));
    }
    s.push_str("  }\n}\n");
    s
}

pub(crate) fn median(v: &mut [f64]) -> f64 {
    percentile(v, 0.5)
}

fn percentile(v: &mut [f64], q: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let i = ((v.len() - 1) as f64 * q).round() as usize;
    v.get(i).copied().unwrap_or(f64::NAN)
}

/// A running gateway on the mem backend; stopped on drop.
struct Gateway {
    dir: PathBuf,
    socket: PathBuf,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<Result<(), String>>>,
}

impl Gateway {
    fn start(dir: &Path, heap_reserve_mib: u32) -> Result<Gateway, UpdateBenchError> {
        let io = |what: &Path| {
            let w = what.display().to_string();
            move |e| UpdateBenchError::Io(w, e)
        };
        std::fs::create_dir_all(dir).map_err(io(dir))?;
        let empty = dir.join("empty.nft");
        std::fs::write(&empty, ruleset_text(0, 0)).map_err(io(&empty))?;
        let socket = dir.join("ctl.sock");
        let cfg = dir.join("sluice.toml");
        let text = format!(
            "backend = \"mem\"\nworkers = 1\nheap_reserve_mib = {heap_reserve_mib}\n\
             ruleset = {:?}\ncontrol_socket = {:?}\n\n\
             [[interfaces]]\nname = \"bench0\"\naddresses = [\"192.0.2.1/24\"]\n",
            empty.display().to_string(),
            socket.display().to_string()
        );
        std::fs::write(&cfg, text).map_err(io(&cfg))?;
        let stop = Arc::new(AtomicBool::new(false));
        let opts = sluice_daemon::RunOptions {
            no_pin: true,
            stop: Some(Arc::clone(&stop)),
            ..Default::default()
        };
        let thread = std::thread::Builder::new()
            .name("bench-gateway".into())
            .spawn(move || sluice_daemon::run(&cfg, &opts).map_err(|e| e.to_string()))
            .map_err(|e| UpdateBenchError::Gateway(e.to_string()))?;
        let mut g = Gateway {
            dir: dir.to_path_buf(),
            socket,
            stop,
            thread: Some(thread),
        };
        let t0 = Instant::now();
        while g.request(r#"{"cmd":"status"}"#).is_err() {
            if g.thread.as_ref().is_some_and(|t| t.is_finished()) {
                let e = g.thread.take().map(|t| t.join());
                return Err(UpdateBenchError::Gateway(format!("exited: {e:?}")));
            }
            if t0.elapsed() > Duration::from_secs(10) {
                return Err(UpdateBenchError::Gateway("did not start in 10 s".into()));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        Ok(g)
    }

    /// One request on its own connection; the answer must say `"ok": true`.
    fn request(&self, req: &str) -> Result<serde_json::Value, UpdateBenchError> {
        let fail = |m: String| UpdateBenchError::Request(req.chars().take(120).collect(), m);
        let text =
            sluice_daemon::ctl::client(&self.socket, req).map_err(|e| fail(e.to_string()))?;
        let v: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| fail(format!("bad answer: {e}")))?;
        if v.get("ok") != Some(&serde_json::Value::Bool(true)) {
            return Err(fail(text));
        }
        Ok(v)
    }

    /// The running rule count must be `n`.
    fn expect_rules(&self, n: u64) -> Result<(), UpdateBenchError> {
        let v = self.request(r#"{"cmd":"status"}"#)?;
        if v.get("rules").and_then(|r| r.as_u64()) != Some(n) {
            return Err(UpdateBenchError::Request(
                "status".into(),
                format!("rule count {:?}, expected {n}", v.get("rules")),
            ));
        }
        Ok(())
    }

    /// Waits (at most 30 s) until the gateway holds no replaced policy
    /// generation any more.
    fn wait_idle(&self) -> Result<(), UpdateBenchError> {
        let t0 = Instant::now();
        loop {
            let v = self.request(r#"{"cmd":"status"}"#)?;
            if v.get("retired_generations").and_then(|r| r.as_u64()) == Some(0) {
                return Ok(());
            }
            if t0.elapsed() > Duration::from_secs(30) {
                return Err(UpdateBenchError::Request(
                    "status".into(),
                    format!(
                        "{:?} replaced generations still held after 30 s",
                        v.get("retired_generations")
                    ),
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Replace the rule set with the empty one at `empty` and wait until
    /// the gateway has freed the replaced generations (its control loop
    /// does that in the background), so that the clock starts on an idle
    /// gateway.
    fn reset_to(&self, empty: &Path) -> Result<(), UpdateBenchError> {
        self.request(
            &serde_json::json!({"cmd": "ruleset-replace", "path": empty.display().to_string()})
                .to_string(),
        )?;
        self.expect_rules(0)?;
        self.wait_idle()
    }

    fn nft(&self, cmd: &str) -> Result<(serde_json::Value, f64), UpdateBenchError> {
        let req = serde_json::json!({"cmd": "nft", "command": cmd}).to_string();
        let t = Instant::now();
        let v = self.request(&req)?;
        Ok((v, t.elapsed().as_secs_f64() * 1e6))
    }

    /// One connection for a series of requests ([`Session`]).
    fn session(&self) -> Result<Session, UpdateBenchError> {
        let io = |e: std::io::Error| UpdateBenchError::Io(self.socket.display().to_string(), e);
        let w = std::os::unix::net::UnixStream::connect(&self.socket).map_err(io)?;
        w.set_read_timeout(Some(Duration::from_secs(30)))
            .map_err(io)?;
        let r = std::io::BufReader::new(w.try_clone().map_err(io)?);
        Ok(Session {
            w,
            r,
            line: String::new(),
            answer: String::new(),
        })
    }
}

/// A control connection kept open for a series of requests, as a
/// long-running client (an orchestrator, a script holding a connection)
/// would: each request is sent only once the answer to the previous one
/// has arrived, so every request is still applied and acknowledged on its
/// own, one at a time.
struct Session {
    w: std::os::unix::net::UnixStream,
    r: std::io::BufReader<std::os::unix::net::UnixStream>,
    line: String,
    answer: String,
}

impl Session {
    /// `nft` request `cmd`; the answer must say `"ok":true`.
    fn nft(&mut self, cmd: &str) -> Result<(), UpdateBenchError> {
        use std::io::{BufRead, Write};
        let fail = |m: String| UpdateBenchError::Request(cmd.chars().take(120).collect(), m);
        self.line.clear();
        self.line.push_str(r#"{"cmd":"nft","command":"#);
        self.line
            .push_str(&serde_json::Value::from(cmd).to_string());
        self.line.push_str("}\n");
        self.w
            .write_all(self.line.as_bytes())
            .map_err(|e| fail(format!("write: {e}")))?;
        self.answer.clear();
        // As `sluice ctl` does: poll briefly for the answer before blocking
        // (`sluice_daemon::ctl::SPIN`).
        sluice_io::spin::wait_readable(
            std::os::fd::AsFd::as_fd(self.r.get_ref()),
            sluice_daemon::ctl::SPIN,
        );
        self.r
            .read_line(&mut self.answer)
            .map_err(|e| fail(format!("read: {e}")))?;
        if self.answer.is_empty() {
            return Err(fail("the daemon closed the connection".into()));
        }
        if !self.answer.starts_with(r#"{"ok":true"#) {
            let v: serde_json::Value =
                serde_json::from_str(&self.answer).map_err(|e| fail(format!("bad answer: {e}")))?;
            if v.get("ok") != Some(&serde_json::Value::Bool(true)) {
                return Err(fail(self.answer.trim_end().to_string()));
            }
        }
        Ok(())
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Runs the procedure.
pub fn run(o: &UpdateOptions) -> Result<UpdateReport, UpdateBenchError> {
    let dir = std::env::temp_dir().join(format!("sluice-bench-update-{}", std::process::id()));
    let t = Instant::now();
    let g = Gateway::start(&dir, o.heap_reserve_mib)?;
    let gateway_start_s = t.elapsed().as_secs_f64();
    let status = g.request(r#"{"cmd":"status"}"#)?;
    let reserved = status.get("heap_reserve_mib").and_then(|v| v.as_u64());
    if reserved != Some(u64::from(o.heap_reserve_mib)) {
        return Err(UpdateBenchError::Request(
            "status".into(),
            format!(
                "heap_reserve_mib {reserved:?}, expected {}",
                o.heap_reserve_mib
            ),
        ));
    }
    let big = dir.join("loaded.nft");
    std::fs::write(&big, ruleset_text(o.objects, o.seed))
        .map_err(|e| UpdateBenchError::Io(big.display().to_string(), e))?;

    // 1. Load.
    let req = serde_json::json!({"cmd": "ruleset-replace", "path": big.display().to_string()})
        .to_string();
    let faults0 = minor_faults();
    let t = Instant::now();
    let v = g.request(&req)?;
    let load_s = t.elapsed().as_secs_f64();
    let load_page_faults = minor_faults()
        .zip(faults0)
        .map(|(b, a)| b.saturating_sub(a));
    let loaded = v.get("rules").and_then(|r| r.as_u64()).unwrap_or(0);
    if loaded != o.objects as u64 {
        return Err(UpdateBenchError::Request(
            "ruleset-replace".into(),
            format!("{loaded} rules loaded, expected {}", o.objects),
        ));
    }
    let resident_after_load_bytes = g
        .request(r#"{"cmd":"status"}"#)?
        .get("resident_bytes")
        .and_then(|v| v.as_u64());
    let list = g.request(r#"{"cmd":"rule-list"}"#)?;
    let handles: Vec<u64> = list
        .get("rules")
        .and_then(|r| r.as_array())
        .map(|a| {
            a.iter()
                .filter_map(|x| x.get("handle").and_then(|h| h.as_u64()))
                .collect()
        })
        .unwrap_or_default();
    if handles.len() != o.objects {
        return Err(UpdateBenchError::Request(
            "rule-list".into(),
            format!("{} handles listed, expected {}", handles.len(), o.objects),
        ));
    }

    // 2. Inserts at random positions.
    let mut rng = Rng(o.seed ^ 0x5eed);
    let mut ins = Vec::with_capacity(o.samples);
    let mut apply = Vec::with_capacity(o.samples);
    let mut added = Vec::with_capacity(o.samples);
    for _ in 0..o.samples {
        let at = handles
            .get(rng.below(handles.len() as u64) as usize)
            .copied()
            .unwrap_or(1);
        let cmd = format!(
            "insert rule ip filter forward position {at} {}",
            rule(&mut rng)
        );
        let (v, us) = g.nft(&cmd)?;
        ins.push(us);
        if let Some(a) = v.get("apply_us").and_then(|x| x.as_f64()) {
            apply.push(a);
        }
        match v.get("handle").and_then(|h| h.as_u64()) {
            Some(h) => added.push(h),
            None => {
                return Err(UpdateBenchError::Request(
                    cmd,
                    "no handle in the answer".into(),
                ))
            }
        }
    }
    // 3. Deletes.
    let mut del = Vec::with_capacity(added.len());
    for h in &added {
        let (_, us) = g.nft(&format!("delete rule ip filter forward handle {h}"))?;
        del.push(us);
    }
    // 4. Appends, one request each, on one connection.
    let cmds: Vec<String> = (0..o.appends)
        .map(|_| format!("add rule ip filter forward {}", rule(&mut rng)))
        .collect();
    let mut session = g.session()?;
    let t = Instant::now();
    for c in &cmds {
        session.nft(c)?;
    }
    let append_at_150k_s = t.elapsed().as_secs_f64();
    drop(session);
    g.expect_rules((o.objects + o.appends) as u64)?;
    // 5. Seed 002: appends to an empty chain.
    let empty = dir.join("empty.nft");
    // Seed 002 starts from a fresh, idle table.
    g.reset_to(&empty)?;
    let cmds: Vec<String> = (0..o.appends)
        .map(|i| {
            let a = std::net::Ipv4Addr::from(0x0a00_0000u32 + i as u32);
            format!("add rule ip filter forward ip saddr {a} accept")
        })
        .collect();
    let mut session = g.session()?;
    let t = Instant::now();
    for c in &cmds {
        session.nft(c)?;
    }
    let append_s = t.elapsed().as_secs_f64();
    drop(session);
    g.expect_rules(o.appends as u64)?;
    // 6. Step 5 again with a new connection per request, as separate
    // `sluice ctl` calls would make them (minus the process start).
    g.reset_to(&empty)?;
    let t = Instant::now();
    for c in &cmds {
        g.nft(c)?;
    }
    let append_conn_s = t.elapsed().as_secs_f64();
    g.expect_rules(o.appends as u64)?;
    // 7. Step 5 again with a `sluice ctl` process per append.
    let append_ctl_s = match &o.ctl_exe {
        Some(exe) => {
            g.reset_to(&empty)?;
            let sock = g.socket.display().to_string();
            let t = Instant::now();
            for c in &cmds {
                let out = std::process::Command::new(exe)
                    .args(["ctl", "--socket", &sock, "nft"])
                    .args(c.split_whitespace())
                    .stdin(std::process::Stdio::null())
                    .output()
                    .map_err(|e| UpdateBenchError::Request(c.clone(), e.to_string()))?;
                if !out.status.success() {
                    return Err(UpdateBenchError::Request(
                        c.clone(),
                        String::from_utf8_lossy(&out.stderr).trim().to_string(),
                    ));
                }
            }
            let s = t.elapsed().as_secs_f64();
            g.expect_rules(o.appends as u64)?;
            Some(s)
        }
        None => None,
    };
    drop(g);
    Ok(UpdateReport {
        objects: o.objects,
        insert_us_at_150k: median(&mut ins.clone()),
        delete_us_at_150k: median(&mut del.clone()),
        insert_p99_us: percentile(&mut ins, 0.99),
        delete_p99_us: percentile(&mut del, 0.99),
        insert_apply_us: median(&mut apply),
        load_150k_s: load_s,
        append_3000_s: append_s,
        append_3000_new_conn_s: append_conn_s,
        append_3000_at_150k_s: append_at_150k_s,
        append_3000_ctl_process_s: append_ctl_s,
        appends: o.appends,
        samples: o.samples,
        heap_reserve_mib: o.heap_reserve_mib,
        gateway_start_s,
        load_page_faults,
        resident_after_load_bytes,
    })
}

/// The report as a table.
pub fn table(r: &UpdateReport) -> String {
    format!(
        "metric                                   value      target\n\
         load {n} rules (ruleset replace)      {:>8.3} s  <= 0.3 s\n\
         insert one rule, median (p99)           {:>8.1} us ({:.1})  <= 1000 us\n\
         delete one rule, median (p99)           {:>8.1} us ({:.1})  <= 1000 us\n\
         insert, daemon apply time, median       {:>8.1} us\n\
         {a} appends to an empty chain (seed 002) {:>8.3} s  < 0.5 s\n\
         {a} appends, a new connection each       {:>8.3} s\n\
         {a} appends with {n} rules loaded     {:>8.3} s\n\
         {ctl}\
         (gateway: heap_reserve_mib = {h}, started in {:.3} s; \
         page faults during the load: {f}; resident after it: {m} MiB)\n",
        r.load_150k_s,
        r.insert_us_at_150k,
        r.insert_p99_us,
        r.delete_us_at_150k,
        r.delete_p99_us,
        r.insert_apply_us,
        r.append_3000_s,
        r.append_3000_new_conn_s,
        r.append_3000_at_150k_s,
        r.gateway_start_s,
        ctl = r
            .append_3000_ctl_process_s
            .map_or_else(String::new, |s| format!(
                "{} appends, a `sluice ctl` process each {:>6.3} s\n",
                r.appends, s
            )),
        n = r.objects,
        a = r.appends,
        h = r.heap_reserve_mib,
        f = r
            .load_page_faults
            .map_or_else(|| "unknown".to_string(), |f| f.to_string()),
        m = r
            .resident_after_load_bytes
            .map_or_else(|| "unknown".to_string(), |b| (b >> 20).to_string()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_rule_sets_parse_and_compile() {
        let text = ruleset_text(500, 7);
        let rs = sluice_ruleset::parse_nft_str("gen.nft", &text).unwrap_or_else(|d| panic!("{d}"));
        let p = sluice_policy::CompiledPolicy::compile(&rs, &sluice_policy::Interfaces::new())
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(p.rule_count(), 500);
    }

    #[test]
    fn small_run_against_a_real_gateway() {
        let r = run(&UpdateOptions {
            objects: 2000,
            samples: 20,
            appends: 50,
            seed: 3,
            heap_reserve_mib: 16,
            ctl_exe: None,
        })
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(r.objects, 2000);
        // The gateway answered `status` with the reserve it was given.
        assert_eq!(r.heap_reserve_mib, 16);
        assert!(r.gateway_start_s > 0.0);
        assert!(r.load_page_faults.is_some());
        assert!(r.resident_after_load_bytes.is_some_and(|b| b > 1 << 20));
        assert!(r.insert_us_at_150k.is_finite() && r.insert_us_at_150k > 0.0);
        assert!(r.delete_us_at_150k.is_finite() && r.delete_us_at_150k > 0.0);
        assert!(r.load_150k_s > 0.0 && r.append_3000_s > 0.0 && r.append_3000_at_150k_s > 0.0);
        assert!(r.append_3000_new_conn_s > 0.0);
        let j = serde_json::to_value(&r).unwrap_or_default();
        for k in [
            "insert_us_at_150k",
            "delete_us_at_150k",
            "load_150k_s",
            "append_3000_s",
            "append_3000_new_conn_s",
            "append_3000_at_150k_s",
            "heap_reserve_mib",
            "gateway_start_s",
            "load_page_faults",
            "resident_after_load_bytes",
        ] {
            assert!(j.get(k).is_some_and(|v| v.is_number()), "{k}");
        }
    }
}
