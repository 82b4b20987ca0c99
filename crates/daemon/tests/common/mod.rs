//! Shared harness of the gateway end-to-end tests: namespaces, the daemon,
//! background servers, the control socket.
//!
//! Topology (every name carries the prefix `sluice-gw-<pid>-<tag>`, and each
//! namespace is deleted by name on drop, even on failure):
//!
//! ```text
//!  private (10.0.0.2 on br0) ---+
//!                 br0 -- eth0 --|-- lan0 [gw: sluice] wan0 -- eth0  public (203.0.113.2)
//!  private2 (10.0.0.3) -- vp2 --+      10.0.0.1   203.0.113.1
//! ```
//!
//! The two private hosts share one LAN (a bridge in the private namespace),
//! so hairpinning is tested on a single inside link. The public host routes
//! the pool 198.51.100.0/24 to the gateway. No traffic leaves these
//! namespaces. Processes are killed by the PID we started, never by name.
// Each test binary uses part of the harness.
#![allow(dead_code)]

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

pub use sluice_io::netns::Netns;

/// The SNAT pool address the rulesets use.
pub const POOL: &str = "198.51.100.7";
/// Private host A.
pub const PRIV: &str = "10.0.0.2";
/// Private host B (the DNAT target and the hairpin peer).
pub const PRIV2: &str = "10.0.0.3";
/// The public host.
pub const PUBLIC: &str = "203.0.113.2";

pub fn require_root() {
    let out = Command::new("id").arg("-u").output().expect("run id -u");
    let uid = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert_eq!(
        uid, "0",
        "this test needs root (network namespaces, AF_PACKET, nft); run it as root with --ignored"
    );
}

/// Run `sh -c CMD` in `ns` and wait for it.
pub fn sh(ns: &Netns, cmd: &str) -> Output {
    Command::new("ip")
        .args(["netns", "exec", ns.name(), "sh", "-c", cmd])
        .stdin(Stdio::null())
        .output()
        .expect("spawn ip netns exec")
}

/// Stdout and stderr of an output, for messages.
pub fn text(o: &Output) -> String {
    format!(
        "status {}\nstdout:\n{}\nstderr:\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

pub fn example_bin() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("target dir")
        .to_path_buf();
    let p = dir.join("examples").join("sluiced");
    assert!(
        p.exists(),
        "{} is missing: build it with `cargo build -p sluice-daemon --examples` (cargo test builds it)",
        p.display()
    );
    p
}

/// Kills (SIGKILL) a child we started, by its PID, unless already reaped.
pub struct Guard(pub Option<Child>);

impl Guard {
    pub fn pid(&self) -> u32 {
        self.0.as_ref().map(Child::id).expect("child")
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        if let Some(c) = &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Start `argv` in `ns` (`ip netns exec` execs it, so the PID is the
/// program's), stdout and stderr to `log`.
pub fn spawn(ns: &Netns, argv: &[&str], log: &Path, cwd: Option<&Path>) -> Guard {
    let out = std::fs::File::create(log).expect("log file");
    let err = out.try_clone().expect("log file");
    let mut c = Command::new("ip");
    c.args(["netns", "exec", ns.name()])
        .args(argv)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err);
    if let Some(d) = cwd {
        c.current_dir(d);
    }
    Guard(Some(c.spawn().expect("spawn in netns")))
}

/// Whether a reload's (or `reload check`'s) answer lists `what` among
/// what it `applied`.
pub fn applied(answer: &serde_json::Value, what: &str) -> bool {
    answer["applied"]
        .as_array()
        .is_some_and(|a| a.iter().any(|x| x == what))
}

pub fn wait_for(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while t0.elapsed() < timeout {
        if f() {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("timed out waiting for {what}");
}

/// Wait up to 10 s until a one-packet ping from `ns` to `dst` is answered.
pub fn wait_for_ping(ns: &Netns, dst: &str, what: &str) {
    wait_for(what, Duration::from_secs(10), || {
        sh(ns, &format!("ping -n -c 1 -W 1 {dst}")).status.success()
    });
}

/// The replies counted in ping summaries ("N packets transmitted, M
/// received, ..."), one per summary line in `out`.
pub fn ping_received(out: &str) -> Vec<u32> {
    out.lines()
        .filter_map(|l| {
            l.split(", ").find_map(|p| {
                p.strip_suffix(" received")
                    .and_then(|n| n.trim().parse().ok())
            })
        })
        .collect()
}

pub fn read(p: &Path) -> String {
    let mut s = String::new();
    if let Ok(mut f) = std::fs::File::open(p) {
        let _ = f.read_to_string(&mut s);
    }
    s
}

pub struct Topo {
    pub private: Netns,
    pub private2: Netns,
    pub gw: Netns,
    pub public: Netns,
    pub dir: PathBuf,
}

fn ethtool_tx_off(ns: &Netns, dev: &str) {
    // The hosts' kernels leave TCP/UDP checksums to "hardware" on veth
    // (CHECKSUM_PARTIAL); an AF_PACKET gateway would forward them
    // unfinished. Make the hosts compute them, as a real NIC would. GRO on
    // gives the hosts' veths NAPI, so that the gateway's veths accept XDP
    // redirects to them (`xdp_offload`), as a NIC does.
    let st = Command::new("ip")
        .args([
            "netns",
            "exec",
            ns.name(),
            "ethtool",
            "-K",
            dev,
            "tx",
            "off",
            "gro",
            "on",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("run ethtool (Debian package ethtool)");
    assert!(st.success(), "ethtool -K {dev} tx off failed");
}

impl Topo {
    pub fn new(tag: &str) -> Self {
        let pid = std::process::id();
        let name = |s: &str| format!("sluice-gw-{pid}-{tag}{s}");
        let private = Netns::create(&name("p")).expect("create private ns");
        let private2 = Netns::create(&name("q")).expect("create private2 ns");
        let gw = Netns::create(&name("g")).expect("create gw ns");
        let public = Netns::create(&name("u")).expect("create public ns");
        let ok = |r: Result<(), sluice_io::IoError>, what: &str| {
            r.unwrap_or_else(|e| panic!("{what}: {e}"));
        };
        ok(
            gw.ip(&[
                "link",
                "add",
                "lan0",
                "type",
                "veth",
                "peer",
                "name",
                "eth0",
                "netns",
                private.name(),
            ]),
            "veth lan",
        );
        ok(
            private.ip(&[
                "link",
                "add",
                "vp2",
                "type",
                "veth",
                "peer",
                "name",
                "eth0",
                "netns",
                private2.name(),
            ]),
            "veth p2",
        );
        ok(gw.ip(&["link", "set", "lan0", "up"]), "up");
        ok(
            private.ip(&["link", "add", "br0", "type", "bridge"]),
            "bridge",
        );
        for i in ["eth0", "vp2"] {
            ok(private.ip(&["link", "set", i, "master", "br0"]), "enslave");
            ok(private.ip(&["link", "set", i, "up"]), "up");
        }
        ok(private.ip(&["link", "set", "br0", "up"]), "up");
        ok(
            private.ip(&["addr", "add", "10.0.0.2/24", "dev", "br0"]),
            "addr",
        );
        ok(
            private.ip(&["route", "add", "default", "via", "10.0.0.1"]),
            "route",
        );
        ok(
            private2.ip(&["addr", "add", "10.0.0.3/24", "dev", "eth0"]),
            "addr",
        );
        ok(private2.ip(&["link", "set", "eth0", "up"]), "up");
        ok(
            private2.ip(&["route", "add", "default", "via", "10.0.0.1"]),
            "route",
        );
        for (ns, dev) in [
            (&private, "eth0"),
            (&private, "vp2"),
            (&private, "br0"),
            (&private2, "eth0"),
        ] {
            ethtool_tx_off(ns, dev);
        }
        let dir = std::env::temp_dir().join(format!("sluice-gw-{pid}-{tag}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("tmp dir");
        let t = Self {
            private,
            private2,
            gw,
            public,
            dir,
        };
        t.make_wan();
        t
    }

    /// `wan0` and the public host's `eth0`: a veth pair (new MACs on
    /// both ends each time), the public host at 203.0.113.2 routing the
    /// pool and the LAN through the gateway.
    fn make_wan(&self) {
        let ok = |r: Result<(), sluice_io::IoError>, what: &str| {
            r.unwrap_or_else(|e| panic!("{what}: {e}"));
        };
        ok(
            self.gw.ip(&[
                "link",
                "add",
                "wan0",
                "type",
                "veth",
                "peer",
                "name",
                "eth0",
                "netns",
                self.public.name(),
            ]),
            "veth wan",
        );
        ok(self.gw.ip(&["link", "set", "wan0", "up"]), "up");
        ok(
            self.public
                .ip(&["addr", "add", "203.0.113.2/24", "dev", "eth0"]),
            "addr",
        );
        ok(self.public.ip(&["link", "set", "eth0", "up"]), "up");
        // The pool; and the LAN, so that the drop policy, not a missing
        // route, is what keeps the public host out of it.
        for net in ["198.51.100.0/24", "10.0.0.0/24"] {
            ok(
                self.public.ip(&["route", "add", net, "via", "203.0.113.1"]),
                "route",
            );
        }
        ethtool_tx_off(&self.public, "eth0");
    }

    /// Make `wan0` and the public host's `eth0` again, as [`Topo::new`]
    /// does (after a test deleted them).
    pub fn recreate_wan(&self) {
        self.make_wan();
    }

    pub fn socket(&self) -> PathBuf {
        self.dir.join("ctl.sock")
    }

    /// Write `NAME.nft` and return its path.
    pub fn write_ruleset(&self, name: &str, text: &str) -> PathBuf {
        let p = self.dir.join(name);
        std::fs::write(&p, text).expect("write nft");
        p
    }

    /// Write `sluice.toml` using ruleset file `ruleset` (relative to the
    /// test directory); `wan_extra` is added to the wan0 interface table
    /// (e.g. `mtu = 1400`).
    /// `backend`: `af_packet`, `af_xdp`, or `af_xdp_offload` (AF_XDP with
    /// `xdp_offload = true`).
    pub fn write_config(&self, backend: &str, ruleset: &str, wan_extra: &str) -> PathBuf {
        let cfg = self.dir.join("sluice.toml");
        let (backend, offload) = match backend.strip_suffix("_offload") {
            Some(b) => (b, true),
            None => (backend, false),
        };
        std::fs::write(
            &cfg,
            format!(
                "ruleset = \"{ruleset}\"\nbackend = \"{backend}\"\nxdp_offload = {offload}\nworkers = 1\ncontrol_socket = \"{}\"\n\n[[interfaces]]\nname = \"lan0\"\nrole = \"inside\"\naddresses = [\"10.0.0.1/24\"]\n\n[[interfaces]]\nname = \"wan0\"\nrole = \"outside\"\naddresses = [\"203.0.113.1/24\"]\n{wan_extra}\n",
                self.socket().display()
            ),
        )
        .expect("write toml");
        cfg
    }
}

impl Drop for Topo {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
        // The interface locks of a gateway the test killed (SIGKILL: it
        // could not remove them), named by the gateway namespace's inode.
        use std::os::unix::fs::MetadataExt;
        if let Ok(m) = std::fs::metadata(format!("/run/netns/{}", self.gw.name())) {
            let prefix = format!("net{}-", m.ino());
            if let Ok(dir) = std::fs::read_dir("/run/sluice") {
                for e in dir.flatten() {
                    if e.file_name().to_string_lossy().starts_with(&prefix) {
                        let _ = std::fs::remove_file(e.path());
                    }
                }
            }
        }
    }
}

/// An iperf3 server on the public host, bound to `addr` port 5201 (its log
/// `iperf3-server.log` in the test directory), once it listens.
pub fn iperf3_server(t: &Topo, addr: &str) -> Guard {
    let g = spawn(
        &t.public,
        &["iperf3", "-s", "-B", addr, "-p", "5201"],
        &t.dir.join("iperf3-server.log"),
        None,
    );
    wait_for("iperf3 server", Duration::from_secs(10), || {
        sh(&t.public, "ss -ltn 'sport = :5201' | grep -q 5201")
            .status
            .success()
    });
    g
}

/// The running gateway.
pub struct Daemon {
    pub child: Guard,
    pub log: PathBuf,
    pub sock: PathBuf,
}

impl Daemon {
    /// Start `sluiced run CFG BACKEND` in the gateway namespace and wait for
    /// its control socket.
    pub fn start(t: &Topo, cfg: &Path, backend: &str) -> Self {
        let bin = example_bin();
        let log = t.dir.join("daemon.log");
        let lf = std::fs::File::create(&log).expect("log");
        let child = Command::new("ip")
            .args(["netns", "exec", t.gw.name()])
            .arg(&bin)
            .arg("run")
            .arg(cfg)
            .arg(backend.trim_end_matches("_offload"))
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(lf)
            .spawn()
            .expect("start daemon");
        let mut d = Self {
            child: Guard(Some(child)),
            log,
            sock: t.socket(),
        };
        let t0 = Instant::now();
        while !d.sock.exists() {
            if let Some(c) = &mut d.child.0 {
                if let Ok(Some(st)) = c.try_wait() {
                    panic!("daemon exited early ({st}):\n{}", d.log());
                }
            }
            assert!(
                t0.elapsed() < Duration::from_secs(15),
                "daemon did not start:\n{}",
                d.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        d
    }

    pub fn log(&self) -> String {
        read(&self.log)
    }

    pub fn ctl(&self, words: &str) -> serde_json::Value {
        let args: Vec<String> = words.split(' ').map(String::from).collect();
        let req = sluice_daemon::ctl::request_from_args(&args).expect("request");
        let resp = sluice_daemon::ctl::client(&self.sock, &req).expect("ctl answer");
        serde_json::from_str(&resp).expect("JSON response")
    }

    /// Drop counter `reason` (summed over workers).
    pub fn drops(&self, reason: &str) -> u64 {
        let c = self.ctl("counters");
        c["counters"]["drops"][reason]
            .as_u64()
            .unwrap_or_else(|| panic!("no drop counter {reason} in {c}"))
    }

    pub fn counter(&self, name: &str) -> u64 {
        let c = self.ctl("counters");
        c["counters"][name]
            .as_u64()
            .unwrap_or_else(|| panic!("no counter {name} in {c}"))
    }

    pub fn signal(&self, sig: &str) {
        let st = Command::new("kill")
            .args([sig, &self.child.pid().to_string()])
            .status()
            .expect("kill");
        assert!(st.success(), "kill {sig}");
    }

    /// Stop it as an operator does (SIGTERM) and wait for a clean exit.
    pub fn stop(&mut self) {
        self.signal("-TERM");
        if let Some(c) = &mut self.child.0 {
            let st = c.wait().expect("wait for the gateway");
            assert!(st.success(), "gateway exit {st}:\n{}", self.log());
        }
    }

    /// Interface `k`'s link state as `sluice ctl status` shows it.
    pub fn link(&self, k: usize) -> String {
        self.ctl("status")["interfaces"][k]["link"]
            .as_str()
            .unwrap_or("?")
            .to_string()
    }

    /// Whether worker `w` knows IPv4 neighbour `ip` (`sluice ctl status`).
    pub fn knows_neighbor(&self, w: usize, ip: &str) -> bool {
        self.ctl("status")["worker_status"][w]["neighbors"]
            .as_array()
            .is_some_and(|n| n.iter().any(|e| e[0] == ip))
    }

    /// Context for assertion messages: status and the daemon log.
    pub fn context(&self) -> String {
        let status = sluice_daemon::ctl::request_from_args(&["status".to_string()])
            .ok()
            .and_then(|r| sluice_daemon::ctl::client(&self.sock, &r).ok())
            .unwrap_or_default();
        let counters = sluice_daemon::ctl::request_from_args(&["counters".to_string()])
            .ok()
            .and_then(|r| sluice_daemon::ctl::client(&self.sock, &r).ok())
            .unwrap_or_default();
        format!(
            "counters: {counters}\nstatus: {status}\ndaemon log:\n{}",
            self.log()
        )
    }
}

/// Python's `http.server` handler, without the reverse DNS lookup that
/// `python3 -m http.server` does at start (`getfqdn`), which would wait for
/// a resolver these namespaces cannot reach. Logs "CLIENT - - [...] GET ...".
const HTTP_SERVER: &str = r#"
import http.server, socket, socketserver, sys
class S(http.server.ThreadingHTTPServer):
    address_family = socket.AF_INET6 if ":" in sys.argv[1] else socket.AF_INET
    def server_bind(self):
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = self.server_address[:2]
S((sys.argv[1], int(sys.argv[2])), http.server.SimpleHTTPRequestHandler).serve_forever()
"#;

/// An HTTP server in `ns` on `addr:port` (IPv4 or IPv6), serving a 256 KiB
/// `blob`; waits until it answers locally.
pub fn http_server(t: &Topo, ns: &Netns, addr: &str, port: u16, name: &str) -> Guard {
    let www = t.dir.join(format!("www-{name}"));
    std::fs::create_dir_all(&www).expect("www");
    std::fs::write(www.join("blob"), vec![0x5au8; 256 << 10]).expect("blob");
    let script = t.dir.join("http_server.py");
    std::fs::write(&script, HTTP_SERVER).expect("script");
    let script = script.display().to_string();
    let port_s = port.to_string();
    let log = t.dir.join(format!("http-{name}.log"));
    let g = spawn(ns, &["python3", &script, addr, &port_s], &log, Some(&www));
    let host = if addr.contains(':') {
        format!("[{addr}]")
    } else {
        addr.to_string()
    };
    let t0 = Instant::now();
    while !sh(
        ns,
        &format!("curl -s -o /dev/null --max-time 1 http://{host}:{port}/"),
    )
    .status
    .success()
    {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "http server {addr}:{port} did not start:\n{}\n{}",
            read(&log),
            text(&sh(ns, "ip addr; ss -ltnp"))
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    g
}

/// UDP endpoint in a namespace: bind `bind`, optionally send to `first`,
/// then wait for one datagram (3 s), print its source, answer it, and
/// (with `expect_answer`) wait for the answer to that and print its source.
const UDP_PEER: &str = r#"
import socket, sys
bind, first, mode = sys.argv[1], sys.argv[2], sys.argv[3]
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
h, p = bind.split(":"); s.bind((h, int(p)))
s.settimeout(6)
if first != "-":
    h, p = first.split(":")
    for _ in range(3):
        s.sendto(b"open", (h, int(p)))
if mode == "serve":
    while True:
        data, src = s.recvfrom(2048)
        if data == b"hairpin":
            print("from %s:%d" % src, flush=True)
            s.sendto(b"back", src)
            break
else:
    data, src = s.recvfrom(2048)
    print("answer %s from %s:%d" % (data.decode(), src[0], src[1]), flush=True)
"#;

/// Hairpinning through the pool address (RFC 4787 REQ-9): private host A
/// opens a UDP mapping from port `a_port` to the public host; private host
/// B sends from port `b_port` to A's external endpoint, A must see B's
/// external endpoint (the pool address), and B must get A's answer from
/// A's external endpoint. Returns A's external port.
pub fn udp_hairpin(t: &Topo, d: &Daemon, a_port: u16, b_port: u16) -> u64 {
    let script = t.dir.join("udp_peer.py");
    std::fs::write(&script, UDP_PEER).expect("script");
    let script = script.display().to_string();
    // A opens a mapping: UDP from 10.0.0.2:a_port to the public host.
    let a_log = t.dir.join("a.log");
    let mut a = spawn(
        &t.private,
        &[
            "python3",
            &script,
            &format!("{PRIV}:{a_port}"),
            &format!("{PUBLIC}:9"),
            "serve",
        ],
        &a_log,
        None,
    );
    let mut ext_port = None;
    wait_for("A's NAT mapping", Duration::from_secs(5), || {
        let l = d.ctl(&format!("conntrack list proto udp port {a_port}"));
        ext_port = l["connections"].as_array().and_then(|v| {
            v.iter()
                .find(|c| c["orig"]["src"] == PRIV && c["orig"]["sport"] == a_port)
                .and_then(|c| c["reply"]["dport"].as_u64())
        });
        ext_port.is_some()
    });
    let ext_port = ext_port.expect("mapping");
    // B sends to A's external endpoint; A must see B's external endpoint
    // (the pool address), and B must get A's answer from A's external
    // endpoint (RFC 4787 REQ-9).
    let o = sh(
        &t.private2,
        &format!(
            "timeout 10 python3 -c 'import socket; s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind((\"{PRIV2}\", {b_port})); s.settimeout(5); s.sendto(b\"hairpin\", (\"{POOL}\", {ext_port})); d, src = s.recvfrom(2048); print(\"answer %s from %s:%d\" % (d.decode(), src[0], src[1]))'"
        ),
    );
    let st = a.0.as_mut().and_then(|c| c.wait().ok());
    let a_out = read(&a_log);
    assert!(
        o.status.success(),
        "B got no answer through the hairpin:\n{}\nA: {st:?} {a_out}\n{}",
        text(&o),
        d.context()
    );
    let b_out = String::from_utf8_lossy(&o.stdout);
    assert!(
        b_out.contains(&format!("answer back from {POOL}:{ext_port}")),
        "B: {b_out}"
    );
    assert!(
        a_out.contains(&format!("from {POOL}:")),
        "A saw the hairpinned datagram from somewhere else: {a_out}"
    );
    assert!(
        !a_out.contains(PRIV2),
        "B's private address leaked: {a_out}"
    );
    ext_port
}
