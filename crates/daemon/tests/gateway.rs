//! End to end, with real clients through a running gateway (the `sluiced`
//! example binary) on AF_PACKET and on AF_XDP, in the namespace topology of
//! `common` (two private hosts on one LAN, the gateway, a public host):
//!
//! - iperf3 over TCP and over UDP through NAT completes with real throughput;
//! - the drop policy blocks a port the ruleset forbids while an allowed one
//!   works;
//! - a DNAT port forward from the public side reaches a private server;
//!   one to an address range reaches the server the kernel would choose
//!   for the client, every time; `snat to ip saddr map` sends each private
//!   host out from its own address;
//! - hairpinning: a private host reaches another through the other's
//!   external (pool) endpoint, and sees the pool address as the source;
//! - a SIGHUP reload with a changed ruleset keeps a running TCP transfer
//!   alive, and the new rules apply to new connections; one that moves
//!   the SNAT rule to another address keeps the transfer on its old
//!   address and sends new connections from the new one; one that adds
//!   interface addresses has them answered at once, and one that removes
//!   them ends the answers;
//! - a byte quota ahead of the `ct state` rule (a named object) stops a
//!   UDP stream after its bytes, and a named counter added through `sluice
//!   ctl` counts the stream;
//! - a deny list the packet path fills (a dynamic set) blocks a probing
//!   host until an operator deletes its element;
//! - a connection limit per source (`ct count` in a set element) refuses
//!   a client's third concurrent connection, and counts a reset one out;
//! - `reject` answers real clients: curl's connection is refused by a TCP
//!   reset, a UDP socket gets ICMP port unreachable;
//! - `notrack` before conntrack: an exempted UDP exchange crosses the
//!   gateway untranslated and without a connection, next to a tracked one;
//! - `ct timeout` policies: a UDP exchange gets its policy's timer (the
//!   listing names the object), another the default, a reload that
//!   changes the policy leaves the running connection on the old timers,
//!   and a restart with `state_file` brings each back on its own policy;
//! - a flowtable (`flow add @ft`) takes an iperf3 transfer's connections
//!   out of the filter chains after their first established packets;
//! - the NAT log (`nat.log`) records each mapping's creation and removal
//!   with the pool address, `sluice ctl status` counts them, and SIGHUP
//!   reopens a rotated log file; with port block allocation it records
//!   one block per subscriber instead, and the connections' external
//!   ports lie in it (deterministic NAT: the block `nat lookup` computes);
//!   a syslog collector gets RFC 5424 messages and an IPFIX collector RFC
//!   8158 records; a reload moves the log to another file and format;
//! - the gateway answers TTL 1 with ICMP time exceeded and an oversized DF
//!   packet with ICMP fragmentation needed carrying the egress MTU.
//! - frames tagged for VLAN 100 (from a raw socket, the tag carried as
//!   metadata, then in the frame) are neither forwarded nor answered and
//!   count as `vlan-tagged`; priority-tagged ones (VLAN 0) get through.
//! - with `state_file`, an iperf3 transfer goes on across a restart (SIGTERM
//!   and a new start) through a rule set that lets only a SYN start a
//!   connection, forwarded and through source NAT (the same mappings).
//!
//! Needs root, `ip`, `nft`, `ethtool`, `ping`, `curl`, `iperf3`, `timeout`
//! and `python3` (CI installs them).

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::*;

/// Forward: established/related; from the LAN TCP to 5201 (iperf3) and
/// 8081 only, any UDP, echo requests; from the WAN the port forward to
/// 10.0.0.3:80; LAN to LAN (hairpinned traffic). NAT: the port forward, and
/// SNAT to the pool.
const RULESET: &str = r#"table ip filter {
  chain forward {
    type filter hook forward priority 0; policy drop;
    ct state established,related accept
    iifname "lan0" oifname "wan0" tcp dport { 5201, 8081 } accept
    iifname "lan0" oifname "wan0" meta l4proto udp accept
    iifname "lan0" oifname "wan0" icmp type echo-request accept
    iifname "wan0" oifname "lan0" ip daddr 10.0.0.3 tcp dport 80 accept
    iifname "lan0" oifname "lan0" accept
  }
}
table ip nat {
  chain prerouting {
    type nat hook prerouting priority -100; policy accept;
    iifname "wan0" tcp dport 8080 dnat to 10.0.0.3:80
  }
  chain postrouting {
    type nat hook postrouting priority 100; policy accept;
    oifname "wan0" snat to 198.51.100.7
  }
}
"#;

/// Start the topology, the ruleset and the daemon.
fn setup(tag: &str, backend: &str, wan_extra: &str) -> (Topo, Daemon) {
    require_root();
    let t = Topo::new(tag);
    t.write_ruleset("gw.nft", RULESET);
    let cfg = t.write_config(backend, "gw.nft", wan_extra);
    let d = Daemon::start(&t, &cfg, backend);
    (t, d)
}

/// `curl` from `ns`; returns (success, body size).
fn curl(ns: &Netns, url: &str, max_time: u32) -> (bool, String, std::process::Output) {
    let o = sh(
        ns,
        &format!("curl -sS --max-time {max_time} -o /dev/null -w '%{{size_download}}' {url}"),
    );
    (
        o.status.success(),
        String::from_utf8_lossy(&o.stdout).to_string(),
        o,
    )
}

/// `curl` of an `http_server`'s 256 KiB `blob` from `ns`, which must arrive
/// whole (`what` names the case in the failure, with the gateway's
/// context).
fn get_blob(ns: &Netns, url: &str, d: &Daemon, what: &str) {
    let (ok, size, o) = curl(ns, url, 10);
    assert!(
        ok && size == (256 << 10).to_string(),
        "{what}: {}\n{}",
        text(&o),
        d.context()
    );
}

/// How many `GET /blob` requests from `from` the `http_server` named
/// `server` logged.
fn blob_requests(t: &Topo, server: &str, from: &str) -> usize {
    read(&t.dir.join(format!("http-{server}.log")))
        .lines()
        .filter(|l| l.starts_with(from) && l.contains("GET /blob"))
        .count()
}

/// Sets `state_file` in the configuration `cfg` (connections kept over a
/// restart) and returns the file's path.
fn keep_state(t: &Topo, cfg: &std::path::Path) -> std::path::PathBuf {
    let state = t.dir.join("conns.state");
    let text_cfg = std::fs::read_to_string(cfg).expect("config");
    std::fs::write(
        cfg,
        format!("state_file = \"{}\"\n{text_cfg}", state.display()),
    )
    .expect("config with state_file");
    state
}

/// Waits until both TCP connections of an iperf3 test to port 5201 (control
/// and data) are in the gateway's connection table.
fn wait_for_iperf3_connections(d: &Daemon) {
    wait_for("iperf3 transfer", Duration::from_secs(5), || {
        d.ctl("conntrack list proto tcp port 5201")["count"]
            .as_u64()
            .unwrap_or(0)
            >= 2
    });
}

/// The handle of the forward chain's `ct state` rule, from the rule listing.
fn ct_state_rule_handle(d: &Daemon) -> u64 {
    let list = d.ctl("rule list forward");
    list["rules"]
        .as_array()
        .and_then(|a| {
            a.iter().find(|r| {
                r["rule"]
                    .as_str()
                    .is_some_and(|s| s.starts_with("ct state"))
            })
        })
        .and_then(|r| r["handle"].as_u64())
        .unwrap_or_else(|| panic!("no ct state rule in {list}"))
}

/// The `Udp:` counters of `/proc/net/snmp` in `ns` (names and values), to
/// tell a receiver's socket overflow (`RcvbufErrors`) from a loss on the
/// way.
fn udp_snmp(ns: &Netns) -> String {
    let o = sh(ns, "grep '^Udp:' /proc/net/snmp");
    let text = String::from_utf8_lossy(&o.stdout);
    let mut lines = text.lines();
    match (lines.next(), lines.next()) {
        (Some(names), Some(values)) => names
            .split_whitespace()
            .zip(values.split_whitespace())
            .skip(1)
            .map(|(n, v)| format!("{n}={v}"))
            .collect::<Vec<_>>()
            .join(" "),
        _ => format!("(no Udp counters: {})", text.trim()),
    }
}

/// Each gateway port's (interface, rx_frames, tx_frames, rx_kernel_drops).
fn port_frames(d: &Daemon) -> Vec<(String, u64, u64, u64)> {
    let st = d.ctl("status");
    st["worker_status"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|w| w["ports"].as_array().into_iter().flatten())
        .map(|p| {
            (
                p["interface"].as_str().unwrap_or("?").to_string(),
                p["rx_frames"].as_u64().unwrap_or(0),
                p["tx_frames"].as_u64().unwrap_or(0),
                p["rx_kernel_drops"].as_u64().unwrap_or(0),
            )
        })
        .collect()
}

/// The packet counter of the first rule of a `rule list` answer whose
/// text contains `pat`.
fn rule_packets(rules: &serde_json::Value, pat: &str) -> Option<u64> {
    rules["rules"]
        .as_array()
        .and_then(|v| {
            v.iter()
                .find(|r| r["rule"].as_str().is_some_and(|t| t.contains(pat)))
        })
        .and_then(|r| r["packets"].as_u64())
}

/// An iperf3 `-J -i 1` client's report: at least `seconds` one-second
/// intervals, each of which moved more than 100 kB; the report.
fn every_second_moved(o: &std::process::Output, seconds: usize) -> serde_json::Value {
    let j = json(o);
    let intervals = j["intervals"].as_array().expect("intervals");
    assert!(intervals.len() >= seconds, "{} intervals", intervals.len());
    for (i, iv) in intervals.iter().enumerate() {
        let b = iv["sum"]["bytes"].as_u64().unwrap_or(0);
        assert!(b > 100_000, "interval {i} moved only {b} bytes:\n{j}");
    }
    j
}

fn json(o: &std::process::Output) -> serde_json::Value {
    serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("iperf3 -J output is not JSON ({e}):\n{}", text(o)))
}

fn iperf3_tcp_and_udp(backend: &str, tag: &str) {
    let (t, d) = setup(tag, backend, "");
    let _srv = iperf3_server(&t, PUBLIC);

    // TCP, 2 s.
    let t0 = Instant::now();
    let o = sh(
        &t.private,
        &format!("timeout 20 iperf3 -c {PUBLIC} -p 5201 -t 2 -J"),
    );
    assert!(
        o.status.success(),
        "iperf3 TCP failed:\n{}\n{}",
        text(&o),
        d.context()
    );
    let j = json(&o);
    let bps = j["end"]["sum_received"]["bits_per_second"]
        .as_f64()
        .expect("sum_received");
    let bytes = j["end"]["sum_received"]["bytes"].as_u64().expect("bytes");
    eprintln!(
        "{backend}: iperf3 TCP {:.1} Mbit/s ({bytes} bytes) in {:?}",
        bps / 1e6,
        t0.elapsed()
    );
    // Measured 720-750 Mbit/s with the debug build on the 2-vCPU
    // development VM; the bound leaves room for a loaded CI machine.
    assert!(
        bps > 100e6,
        "TCP throughput {:.1} Mbit/s is below 100 Mbit/s\n{}",
        bps / 1e6,
        d.context()
    );

    // UDP, 2 s at 50 Mbit/s offered. One CI run (2026-11-23 14:25 UTC,
    // AF_XDP) lost 11.5 % while the gateway's ports counted no receive
    // drop and forwarded what they received; it did not recur in six
    // runs of this test here, with and without two busy-looping
    // processes. The likely place is the receiving iperf3's socket, whose
    // default buffer (208 KiB, about 90 datagrams) overflows if a loaded
    // 2-core machine deschedules it for 20 ms: `-w 4M` gives both ends'
    // sockets 4 MiB, and a failure now prints the public host's UDP
    // counters (`RcvbufErrors`) and the gateway's port counters around
    // the run, to tell where the datagrams went.
    let snmp_before = udp_snmp(&t.public);
    let ports_before = port_frames(&d);
    let o = sh(
        &t.private,
        &format!("timeout 20 iperf3 -c {PUBLIC} -p 5201 -u -b 50M -l 1200 -w 4M -t 2 -J"),
    );
    assert!(
        o.status.success(),
        "iperf3 UDP failed:\n{}\n{}",
        text(&o),
        d.context()
    );
    let j = json(&o);
    let sum = &j["end"]["sum"];
    let packets = sum["packets"].as_u64().expect("packets");
    let lost = sum["lost_packets"].as_u64().expect("lost_packets");
    let received = packets.saturating_sub(lost);
    let rx_bps = received as f64 * 1200.0 * 8.0 / 2.0;
    eprintln!(
        "{backend}: iperf3 UDP {packets} sent, {lost} lost ({:.1} % loss), {:.1} Mbit/s received",
        sum["lost_percent"].as_f64().unwrap_or(-1.0),
        rx_bps / 1e6
    );
    assert!(packets > 1000, "only {packets} UDP datagrams sent");
    assert!(
        rx_bps > 35e6 && lost * 10 < packets,
        "UDP: {received} of {packets} datagrams arrived ({:.1} Mbit/s)\n\
         public host UDP counters before: {snmp_before}\n\
         public host UDP counters after:  {}\n\
         gateway port frames (rx, tx) before: {ports_before:?}\n\
         gateway port frames (rx, tx) after:  {:?}\n{}",
        rx_bps / 1e6,
        udp_snmp(&t.public),
        port_frames(&d),
        d.context()
    );
    if backend.ends_with("_offload") {
        // The XDP program forwarded the bulk: the engine's fast path saw
        // a small part of the UDP datagrams alone.
        let st = d.ctl("status");
        let installed: u64 = st["worker_status"]
            .as_array()
            .expect("worker_status")
            .iter()
            .map(|w| w["offload"]["installed"].as_u64().expect("offload status"))
            .sum();
        let fast = d.counter("fast_path");
        eprintln!(
            "{backend}: {installed} directions offloaded, {fast} packets on the engine's fast path"
        );
        assert!(installed >= 4, "TCP and UDP, both directions: {st}");
        // The listing shows the UDP connection offloaded, with the
        // datagrams the XDP program forwarded.
        let l = d.ctl("conntrack list proto udp port 5201");
        let fwd: u64 = l["connections"]
            .as_array()
            .expect("connections")
            .iter()
            .filter(|c| c["offloaded"].as_bool() == Some(true))
            .map(|c| c["offload_packets"].as_u64().expect("offload_packets"))
            .sum();
        assert!(
            fwd >= packets / 2,
            "{fwd} offloaded packets of {packets}: {l}"
        );
        assert!(
            fast < packets / 2,
            "{fast} fast-path packets for {packets} datagrams: not offloaded\n{}",
            d.context()
        );
    }
    // Both went through NAT: the server saw the pool address.
    let log = read(&t.dir.join("iperf3-server.log"));
    assert!(
        log.contains(&format!("Accepted connection from {POOL}")),
        "iperf3 server did not see {POOL}:\n{log}"
    );
    assert!(
        !log.contains(PRIV),
        "private address leaked to the server:\n{log}"
    );
}

fn drop_policy(backend: &str, tag: &str) {
    let (t, d) = setup(tag, backend, "");
    let _a = http_server(&t, &t.public, PUBLIC, 8081, "allowed");
    let _b = http_server(&t, &t.public, PUBLIC, 8082, "forbidden");
    get_blob(
        &t.private,
        &format!("http://{PUBLIC}:8081/blob"),
        &d,
        "allowed port failed",
    );
    let before = d.drops("policy-drop");
    let (ok, _, o) = curl(&t.private, &format!("http://{PUBLIC}:8082/blob"), 2);
    assert!(!ok, "forbidden port 8082 answered:\n{}", text(&o));
    // curl exit 28: timed out (the SYN was dropped silently).
    assert_eq!(o.status.code(), Some(28), "{}", text(&o));
    let after = d.drops("policy-drop");
    assert!(
        after > before,
        "policy-drop did not count the SYNs ({before} -> {after})"
    );
    // Nothing of it reached the server.
    let log = read(&t.dir.join("http-forbidden.log"));
    assert!(
        !log.contains("GET /blob"),
        "forbidden request reached the server:\n{log}"
    );
    // And the WAN cannot open connections to the LAN (it has a route to
    // it through the gateway), except through the port forward.
    let before = d.drops("policy-drop");
    let o = sh(&t.public, "ping -n -c 1 -W 1 10.0.0.2");
    assert!(!o.status.success(), "LAN host reachable from the WAN");
    assert!(d.drops("policy-drop") > before, "{}", d.context());
}

fn dnat_port_forward(backend: &str, tag: &str) {
    let (t, d) = setup(tag, backend, "");
    let _srv = http_server(&t, &t.private2, PRIV2, 80, "inside");
    get_blob(
        &t.public,
        &format!("http://{POOL}:8080/blob"),
        &d,
        "port forward failed",
    );
    // The private server saw the public client (DNAT only, no SNAT).
    assert!(
        blob_requests(&t, "inside", PUBLIC) > 0,
        "server log does not show {PUBLIC}:\n{}",
        read(&t.dir.join("http-inside.log"))
    );
    let list = d.ctl("conntrack list proto tcp port 8080");
    let conns = list["connections"].as_array().expect("connections");
    assert!(
        conns.iter().any(|c| c["orig"]["dst"] == POOL
            && c["orig"]["dport"] == 8080
            && c["reply"]["src"] == PRIV2
            && c["reply"]["sport"] == 80),
        "no DNAT connection in {list}"
    );
    // The same forward on the gateway's own WAN address.
    get_blob(
        &t.public,
        "http://203.0.113.1:8080/blob",
        &d,
        "port forward on the WAN address failed",
    );
    // Another port on the pool address is not forwarded.
    let (ok, _, _) = curl(&t.public, &format!("http://{POOL}:8081/"), 2);
    assert!(!ok, "an unforwarded port answered");
}

fn hairpinning(backend: &str, tag: &str) {
    let (t, d) = setup(tag, backend, "");
    udp_hairpin(&t, &d, 5555, 6666);
}

/// Sends tagged frames from the second private host's `eth0` (a raw
/// packet socket; argv: the gateway's MAC, the VLAN id, the count) to the
/// public host through the gateway: ICMP echo requests, then one ARP
/// request for the gateway's address. Prints the number of echo replies
/// that came back (untagged, to a raw ICMP socket) within a second.
const TAGGED_PINGS: &str = r#"
import socket, struct, sys, time
gw = bytes.fromhex(sys.argv[1].replace(':', ''))
vid, count = int(sys.argv[2]), int(sys.argv[3])
me = bytes.fromhex(open('/sys/class/net/eth0/address').read().strip().replace(':', ''))
def csum(b):
    if len(b) % 2: b += b'\0'
    s = sum(struct.unpack('!%dH' % (len(b) // 2), b))
    while s >> 16: s = (s & 0xffff) + (s >> 16)
    return ~s & 0xffff
tag = b'\x81\x00' + struct.pack('!H', vid)
src, dst = socket.inet_aton('10.0.0.3'), socket.inet_aton('203.0.113.2')
icmp_rx = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
icmp_rx.settimeout(0.2)
tx = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
tx.bind(('eth0', 0))
ident = 0x5100 + vid
for seq in range(count):
    icmp = struct.pack('!BBHHH', 8, 0, 0, ident, seq) + b'sluice-vlan-test'
    icmp = icmp[:2] + struct.pack('!H', csum(icmp)) + icmp[4:]
    ip = struct.pack('!BBHHHBBH4s4s', 0x45, 0, 20 + len(icmp), seq, 0, 64, 1, 0, src, dst)
    ip = ip[:10] + struct.pack('!H', csum(ip)) + ip[12:]
    tx.send(gw + me + tag + b'\x08\x00' + ip + icmp)
arp = struct.pack('!HHBBH6s4s6s4s', 1, 0x0800, 6, 4, 1, me, src, b'\0' * 6, socket.inet_aton('10.0.0.1'))
tx.send(b'\xff' * 6 + me + tag + b'\x08\x06' + arp + b'\0' * 18)
replies, end = 0, time.time() + 1.0
while time.time() < end:
    try:
        pkt = icmp_rx.recv(2048)
    except socket.timeout:
        continue
    ihl = (pkt[0] & 15) * 4
    t, _, _, i = struct.unpack('!BBHH', pkt[ihl:ihl + 6])
    if t == 0 and i == ident:
        replies += 1
print(replies)
"#;

/// Frames tagged for a VLAN the gateway is not on (Sluice has no VLAN
/// interfaces): echo requests to the public host in VLAN 100 frames are
/// not forwarded and an ARP request in one is not answered, each counted
/// as `vlan-tagged`; priority-tagged frames (VLAN id 0) are handled as
/// untagged, as the kernel does, and their pings answered. Twice: first
/// with the tag as metadata (the bridge in the private namespace takes it
/// out of the frame and its veth to the gateway, with transmit VLAN
/// offload on, hands it over so, as a NIC with receive VLAN offload does:
/// AF_PACKET gets it as `tp_vlan_tci`, the XDP program from the metadata
/// kfunc), then with offload off, the tag in the frame's bytes.
fn vlan_tagged(backend: &str, tag: &str) {
    let (t, d) = setup(tag, backend, "");
    let o = sh(&t.gw, "cat /sys/class/net/lan0/address");
    let gw_mac = String::from_utf8_lossy(&o.stdout).trim().to_string();
    assert_eq!(gw_mac.len(), 17, "lan0 MAC: {}", text(&o));
    // The untagged path works (and the gateway knows the host's MAC).
    let o = sh(&t.private2, "ping -n -c 1 -W 2 203.0.113.2");
    assert!(
        o.status.success(),
        "untagged ping failed: {}\n{}",
        text(&o),
        d.context()
    );
    let script = t.dir.join("tagged.py");
    std::fs::write(&script, TAGGED_PINGS).expect("write tagged.py");
    let run = |vid: u16| -> u64 {
        let o = sh(
            &t.private2,
            &format!("python3 {} {gw_mac} {vid} 5", script.display()),
        );
        assert!(o.status.success(), "tagged.py: {}", text(&o));
        String::from_utf8_lossy(&o.stdout)
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("tagged.py printed {}", text(&o)))
    };
    for how in ["as metadata", "in the frame"] {
        if how == "in the frame" {
            let o = sh(&t.private, "ethtool -K eth0 txvlan off");
            assert!(
                o.status.success(),
                "ethtool -K eth0 txvlan off: {}",
                text(&o)
            );
        }
        let before = d.drops("vlan-tagged");
        assert_eq!(
            run(100),
            0,
            "tag {how}: pings in VLAN 100 frames were answered\n{}",
            d.context()
        );
        wait_for(
            &format!("tag {how}: 5 pings and an ARP request counted"),
            Duration::from_secs(5),
            || d.drops("vlan-tagged") >= before + 6,
        );
        // Priority-tagged: forwarded, answered; nothing more counted.
        let before = d.drops("vlan-tagged");
        assert_eq!(
            run(0),
            5,
            "tag {how}: priority-tagged pings not all answered\n{}",
            d.context()
        );
        assert_eq!(d.drops("vlan-tagged"), before, "tag {how}: {}", d.context());
    }
}

fn sighup_reload(backend: &str, tag: &str) {
    let (t, d) = setup(tag, backend, "");
    let _srv = iperf3_server(&t, PUBLIC);
    let _h1 = http_server(&t, &t.public, PUBLIC, 8081, "a");
    let _h2 = http_server(&t, &t.public, PUBLIC, 8082, "b");
    // A 5 s TCP transfer, reloaded at about 2 s into a ruleset that no
    // longer allows new connections to 5201 or 8081, but does allow 8082.
    let client = std::thread::scope(|s| {
        let c = s.spawn(|| {
            sh(
                &t.private,
                &format!("timeout 30 iperf3 -c {PUBLIC} -p 5201 -t 5 -i 1 -J"),
            )
        });
        wait_for_iperf3_connections(&d);
        std::thread::sleep(Duration::from_millis(1500));
        std::fs::write(
            t.dir.join("gw.nft"),
            RULESET.replace("tcp dport { 5201, 8081 }", "tcp dport 8082"),
        )
        .expect("new ruleset");
        d.signal("-HUP");
        wait_for("reload", Duration::from_secs(5), || {
            d.ctl("status")["generation"] == 2
        });
        // New rules for new connections, while the transfer runs.
        let (ok81, _, _) = curl(&t.private, &format!("http://{PUBLIC}:8081/"), 2);
        let (ok82, size, o82) = curl(&t.private, &format!("http://{PUBLIC}:8082/blob"), 5);
        let c = c.join().expect("iperf3 thread");
        (c, ok81, ok82, size, o82)
    });
    let (o, ok81, ok82, size, o82) = client;
    assert!(
        o.status.success(),
        "the transfer did not survive the reload:\n{}\n{}",
        text(&o),
        d.context()
    );
    // Data kept flowing in every second, the reload's included.
    let j = every_second_moved(&o, 5);
    let bytes = j["end"]["sum_received"]["bytes"].as_u64().unwrap_or(0);
    eprintln!("{backend}: {bytes} bytes across the reload");
    assert!(
        !ok81,
        "8081 still open for new connections after the reload"
    );
    assert!(
        ok82 && size == (256 << 10).to_string(),
        "8082 not opened by the reload: {}",
        text(&o82)
    );
    assert!(d.log().contains("ruleset published"), "{}", d.log());
}

/// A reload that moves the SNAT rule to another address: the running TCP
/// transfer keeps its mapping on the old address (retired: it serves its
/// connections until they end) and loses no second, while a new
/// connection leaves from the new one; a flush ends the retired mappings.
fn nat_pool_reload(backend: &str, tag: &str) {
    const NEW: &str = "198.51.100.8";
    let (t, d) = setup(tag, backend, "");
    let _srv = iperf3_server(&t, PUBLIC);
    let _h = http_server(&t, &t.public, PUBLIC, 8081, "a");
    let (o, answer, during, conns, web) = std::thread::scope(|s| {
        let c = s.spawn(|| {
            sh(
                &t.private,
                &format!("timeout 30 iperf3 -c {PUBLIC} -p 5201 -t 5 -i 1 -J"),
            )
        });
        wait_for_iperf3_connections(&d);
        std::thread::sleep(Duration::from_millis(1500));
        std::fs::write(
            t.dir.join("gw.nft"),
            RULESET.replace("snat to 198.51.100.7", &format!("snat to {NEW}")),
        )
        .expect("new ruleset");
        let answer = d.ctl("reload");
        wait_for(
            "the workers take the new pool",
            Duration::from_secs(5),
            || d.ctl("status")["nat"]["retired"].as_u64() >= Some(1),
        );
        let during = d.ctl("status");
        let conns = d.ctl("conntrack list proto tcp port 5201");
        let port = conns["connections"][0]["reply"]["dport"]
            .as_u64()
            .unwrap_or(0);
        let lookup = d.ctl(&format!("nat lookup {POOL}:{port} proto tcp"));
        assert_eq!(lookup["mappings"][0]["retired"], true, "{lookup}\n{conns}");
        let web = curl(&t.private, &format!("http://{PUBLIC}:8081/blob"), 5);
        (c.join().expect("iperf3 thread"), answer, during, conns, web)
    });
    assert_eq!(answer["ok"], true, "{answer}");
    assert!(applied(&answer, "nat pools"), "{answer}");
    assert!(
        o.status.success(),
        "the transfer did not survive the pool change:\n{}\n{}",
        text(&o),
        d.context()
    );
    every_second_moved(&o, 5);
    // The transfer's connections kept the old address.
    let list = conns["connections"].as_array().expect("connections");
    assert!(
        !list.is_empty() && list.iter().all(|c| c["reply"]["dst"] == POOL),
        "{conns}"
    );
    assert_eq!(during["nat"]["pools"][0]["addr"], NEW, "{during}");
    assert_eq!(during["nat"]["pools_refused"], 0, "{during}");
    // A new connection leaves from the new address.
    let (ok, size, out) = web;
    assert!(
        ok && size == (256 << 10).to_string(),
        "{}\n{}",
        text(&out),
        d.context()
    );
    assert!(
        blob_requests(&t, "a", NEW) > 0,
        "the server did not see {NEW}:\n{}",
        read(&t.dir.join("http-a.log"))
    );
    assert!(d.log().contains("NAT pools replaced"), "{}", d.log());
    // Flushed, the retired mappings are gone.
    d.ctl("conntrack flush");
    wait_for("no retired mapping", Duration::from_secs(5), || {
        d.ctl("status")["nat"]["retired"] == 0
    });
}

/// A reload that adds an address to wan0 (203.0.113.5) and two to lan0
/// (10.0.0.100, and 192.168.50.1 in a subnet of its own): the gateway
/// answers ARP and pings for them at once while a ping through NAT runs
/// on, and a host in the new subnet is served (its replies routed and its
/// address resolved by the new connected route); a reload that takes them
/// away again ends the answers.
fn address_reload(backend: &str, tag: &str) {
    let (t, d) = setup(tag, backend, "");
    let cfg = t.dir.join("sluice.toml");
    let plain = read(&cfg);
    let more = plain
        .replace(
            "addresses = [\"203.0.113.1/24\"]",
            "addresses = [\"203.0.113.1/24\", \"203.0.113.5/24\"]",
        )
        .replace(
            "addresses = [\"10.0.0.1/24\"]",
            "addresses = [\"10.0.0.1/24\", \"10.0.0.100/24\", \"192.168.50.1/24\"]",
        );
    assert_ne!(more, plain);
    let ping = |ns: &Netns, ip: &str| sh(ns, &format!("ping -c 1 -W 1 {ip}")).status.success();
    assert!(!ping(&t.public, "203.0.113.5"), "not the gateway's yet");
    let o = sh(&t.private, "ip addr add 192.168.50.2/24 dev br0");
    assert!(o.status.success(), "{}", text(&o));
    let from_new = format!("ping -c 1 -W 2 -I 192.168.50.2 {PUBLIC}");
    assert!(
        !sh(&t.private, &from_new).status.success(),
        "no route back to 192.168.50.0/24 yet"
    );
    let (running, answer, after) = std::thread::scope(|s| {
        let p = s.spawn(|| {
            text(&sh(
                &t.private,
                &format!("ping -q -c 30 -i 0.1 -W 1 {PUBLIC} | grep received"),
            ))
        });
        std::thread::sleep(Duration::from_millis(1000));
        std::fs::write(&cfg, &more).expect("rewrite config");
        let answer = d.ctl("reload");
        let after = (
            ping(&t.public, "203.0.113.5"),
            ping(&t.private, "10.0.0.100"),
            sh(&t.private, &from_new).status.success(),
        );
        (p.join().expect("ping thread"), answer, after)
    });
    assert_eq!(answer["ok"], true, "{answer}");
    assert!(applied(&answer, "interfaces (addresses)"), "{answer}");
    assert_eq!(answer["needs_restart"], serde_json::json!([]), "{answer}");
    assert_eq!(
        after,
        (true, true, true),
        "new addresses answered, the new subnet served\n{}",
        d.context()
    );
    let received = ping_received(&running);
    assert!(
        received.len() == 1 && received[0] >= 28,
        "{running}\n{}",
        d.context()
    );
    assert!(
        d.log().contains("interface addresses replaced"),
        "{}",
        d.log()
    );
    // Taken away again.
    std::fs::write(&cfg, &plain).expect("rewrite config");
    let answer = d.ctl("reload");
    assert_eq!(answer["ok"], true, "{answer}");
    assert!(
        !ping(&t.public, "203.0.113.5"),
        "203.0.113.5 still answered"
    );
    assert!(!ping(&t.private, "10.0.0.100"), "10.0.0.100 still answered");
    assert!(ping(&t.private, PUBLIC), "NAT still works\n{}", d.context());
}

fn icmp_errors(backend: &str, tag: &str) {
    // The WAN side's IP MTU is 1400, below the kernel's 1500 on the veth.
    let (t, d) = setup(tag, backend, "mtu = 1400");
    // Normal ping works.
    let o = sh(&t.private, &format!("ping -n -c 1 -W 2 {PUBLIC}"));
    assert!(o.status.success(), "{}\n{}", text(&o), d.context());
    // TTL 1: time exceeded from the gateway's LAN address.
    let o = sh(&t.private, &format!("ping -n -c 1 -t 1 -W 2 {PUBLIC}"));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("From 10.0.0.1") && out.contains("Time to live exceeded"),
        "no time exceeded from 10.0.0.1:\n{}\n{}",
        text(&o),
        d.context()
    );
    // Exactly the MTU passes (1372 + 8 + 20 = 1400).
    let o = sh(
        &t.private,
        &format!("ping -n -c 1 -M do -s 1372 -W 2 {PUBLIC}"),
    );
    assert!(o.status.success(), "1400-byte ping failed:\n{}", text(&o));
    // 1500 with DF: fragmentation needed, mtu 1400.
    let o = sh(
        &t.private,
        &format!("ping -n -c 1 -M do -s 1472 -W 2 {PUBLIC}"),
    );
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("From 10.0.0.1") && out.contains("Frag needed and DF set (mtu = 1400)"),
        "no fragmentation needed with mtu 1400:\n{}\n{}",
        text(&o),
        d.context()
    );
    // The host learnt the path MTU from it.
    let o = sh(&t.private, &format!("ip route get {PUBLIC}"));
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("mtu 1400"),
        "path MTU not learnt:\n{}",
        text(&o)
    );
    // Without DF the gateway fragments (RFC 1812 section 5.2.6): a 1448-byte
    // echo, and a 3028-byte one that the host already sent as 1500 + 1528
    // byte fragments (its first fragment is split again), from the other
    // private host, which has not learnt the path MTU.
    for size in [1420, 3000] {
        let o = sh(
            &t.private2,
            &format!("ping -n -c 2 -i 0.3 -M dont -s {size} -W 2 {PUBLIC}"),
        );
        assert!(
            o.status.success(),
            "{size}-byte ping without DF through the 1400 MTU failed:\n{}\n{}",
            text(&o),
            d.context()
        );
    }
    let c = d.ctl("counters");
    assert!(
        c["counters"]["fragmented"].as_u64().unwrap_or(0) >= 4,
        "the gateway split the packets: {c}"
    );
    // From the public side too: TTL 1 towards the LAN gets time exceeded
    // from the WAN address, although the forward policy would drop it (as
    // netfilter: ip_forward checks the TTL before the forward hook).
    let o = sh(&t.public, "ping -n -c 1 -t 1 -W 2 10.0.0.2");
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("From 203.0.113.1") && out.contains("Time to live exceeded"),
        "{}",
        text(&o)
    );
    assert!(d.drops("ttl-expired") >= 2);
    assert!(d.drops("too-big") >= 1);
    assert!(d.counter("icmp_errors") >= 3);
}

/// A deny list the packet path fills (`update @probers { ip saddr }`): a
/// probe of port 23 puts the private host on it, after which its new
/// connections are dropped while the other private host's are not;
/// `sluice ctl set list` shows the element, and deleting it through the
/// control socket lets the host through again.
fn deny_list(backend: &str, tag: &str) {
    require_root();
    let t = Topo::new(tag);
    let rules = RULESET
        .replace(
            "table ip filter {\n",
            "table ip filter {\n  set probers { type ipv4_addr; flags dynamic,timeout; timeout 1h; }\n",
        )
        .replace(
            "    ct state established,related accept\n",
            "    ct state established,related accept\n    ip saddr @probers drop\n    \
             iifname \"lan0\" tcp dport 23 update @probers { ip saddr } drop\n",
        );
    t.write_ruleset("gw.nft", &rules);
    let cfg = t.write_config(backend, "gw.nft", "");
    let d = Daemon::start(&t, &cfg, backend);
    let _h = http_server(&t, &t.public, PUBLIC, 8081, "a");
    let url = format!("http://{PUBLIC}:8081/blob");
    assert!(
        curl(&t.private, &url, 5).0,
        "8081 closed at start\n{}",
        d.context()
    );
    let empty = d.ctl("set list probers");
    assert_eq!(empty["sets"][0]["count"], 0, "{empty}");
    // The probe's SYN is dropped (curl times out) and lists its source.
    let (ok, _, o) = curl(&t.private, &format!("http://{PUBLIC}:23/"), 2);
    assert_eq!(
        o.status.code(),
        Some(28),
        "probe answered: {ok} {}",
        text(&o)
    );
    let list = d.ctl("set list ip filter probers");
    assert_eq!(list["sets"][0]["set"], "ip filter probers", "{list}");
    assert_eq!(list["sets"][0]["elements"][0]["key"], PRIV, "{list}");
    let left = list["sets"][0]["elements"][0]["expires_ms"]
        .as_u64()
        .unwrap_or(0);
    assert!(
        left > 3_500_000 && left <= 3_600_000,
        "expiry {left} ms\n{list}"
    );
    // Now the allowed port is closed to it, not to the other host.
    let (ok, _, _) = curl(&t.private, &url, 2);
    assert!(!ok, "a listed host still connects\n{}", d.context());
    assert!(
        curl(&t.private2, &url, 5).0,
        "the host that did not probe is blocked\n{}",
        d.context()
    );
    // The operator lifts it.
    let rm = d.ctl(&format!(
        "nft delete element ip filter probers {{ {PRIV} }}"
    ));
    assert_eq!(rm["ok"], true, "{rm}");
    assert_eq!(d.ctl("set list probers")["sets"][0]["count"], 0);
    assert!(
        curl(&t.private, &url, 5).0,
        "deleting the element did not let the host through\n{}",
        d.context()
    );
    // A ban tool's entry: an element with a timeout of its own (and one
    // with the set's hour), timed from the change.
    let add =
        d.ctl("nft add element ip filter probers { 198.51.100.99 timeout 30s, 198.51.100.98 }");
    assert_eq!(add["ok"], true, "{add}");
    let list = d.ctl("set list probers");
    let left = |addr: &str| {
        list["sets"][0]["elements"]
            .as_array()
            .and_then(|es| es.iter().find(|e| e["key"] == addr))
            .and_then(|e| e["expires_ms"].as_u64())
            .unwrap_or_else(|| panic!("{addr}: {list}"))
    };
    assert!((25_000..=30_000).contains(&left("198.51.100.99")), "{list}");
    assert!(
        (3_595_000..=3_600_000).contains(&left("198.51.100.98")),
        "{list}"
    );
}

/// A byte quota ahead of the `ct state` rule, so the filter chain runs for
/// every packet of the connection: `quota over 400 kbytes drop` on UDP to
/// 5201 lets an iperf3 UDP stream through until 400 KiB have passed and
/// drops the rest. The quota is a named object of the rule set, and a
/// named counter added through `sluice ctl` ahead of it counts every
/// datagram of the stream.
fn quota(backend: &str, tag: &str) {
    require_root();
    let t = Topo::new(tag);
    let rules = RULESET
        .replace(
            "table ip filter {\n",
            "table ip filter {\n  quota wan { over 400 kbytes }\n  limit lw { rate 10/second }\n",
        )
        .replace(
            "    ct state established,related accept\n",
            "    iifname \"lan0\" udp dport 5201 quota name \"wan\" drop\n    \
             ct state established,related accept\n",
        );
    t.write_ruleset("gw.nft", &rules);
    let cfg = t.write_config(backend, "gw.nft", "");
    let d = Daemon::start(&t, &cfg, backend);
    for cmd in [
        "nft add counter ip filter udp5201",
        "nft insert rule ip filter forward iifname lan0 udp dport 5201 counter name udp5201",
    ] {
        let r = d.ctl(cmd);
        assert_eq!(r["ok"], true, "{cmd}: {r}");
    }
    let _srv = iperf3_server(&t, PUBLIC);
    // About 1.2 MB offered in 3 s, 1200-byte datagrams (1228 bytes of IP).
    // iperf3 cannot see datagrams lost at the end of a stream (its loss
    // comes from gaps in sequence numbers), so the public host's own UDP
    // counter says what arrived.
    let in_datagrams = || -> u64 {
        udp_snmp(&t.public)
            .split_whitespace()
            .find_map(|kv| kv.strip_prefix("InDatagrams="))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    let before = in_datagrams();
    let o = sh(
        &t.private,
        &format!("timeout 20 iperf3 -c {PUBLIC} -p 5201 -u -b 3200K -l 1200 -t 3 -J"),
    );
    assert!(o.status.success(), "iperf3: {}\n{}", text(&o), d.context());
    let arrived = in_datagrams().saturating_sub(before);
    let sent = json(&o)["end"]["sum"]["packets"].as_u64().expect("packets");
    // 400 KiB of 1228-byte packets is 333 of them (the 334th is over);
    // iperf3 sends a datagram or two of its own handshake first.
    assert!(
        sent > 600 && (330..=340).contains(&arrived),
        "{backend}: {sent} sent, {arrived} arrived (quota: 333)\n{}\n{}",
        d.ctl("rule list forward"),
        d.context()
    );
    assert!(d.drops("policy-drop") + 340 >= sent, "{}", d.context());
    // Every datagram met the counter; the quota has used what passed it.
    let c = d.ctl("counter list udp5201");
    let counted = c["objects"][0]["packets"].as_u64().unwrap_or(0);
    assert!(
        (sent..=sent + 4).contains(&counted),
        "{backend}: {sent} sent, {counted} counted: {c}"
    );
    let q = d.ctl("quota list wan");
    assert_eq!(q["objects"][0]["exceeded"], true, "{q}");
    assert!(
        q["objects"][0]["used"].as_u64().unwrap_or(0) >= sent * 1228,
        "{q}"
    );
    // The running rule set, as nft lists it: the added counter and rule,
    // the live values.
    let rl = d.ctl("ruleset list");
    let text = rl["ruleset"].as_str().unwrap_or_default();
    assert!(
        text.contains(&format!("counter udp5201 {{\n\t\tpackets {counted} bytes "))
            && text.contains("iifname \"lan0\" udp dport 5201 counter name \"udp5201\"\n")
            && text.contains("quota wan {\n\t\tover 400 kbytes used "),
        "{text}"
    );
    sluice_ruleset::parse_nft_str("running.nft", text).expect("the listing loads again");
    let l = d.ctl("limit list lw");
    assert_eq!(l["objects"][0]["rate"], "rate 10/second", "{l}");
}

/// Connection limits per source (`-m connlimit`, nft `ct count` in a set
/// element): with `ct count over 2` a real client's third concurrent TCP
/// connection to the public host is refused by the gateway (a TCP reset);
/// once it resets
/// one of its two (the gateway sees the RST and stops counting it), a new
/// one connects; the other private host counts apart.
fn connlimit(backend: &str, tag: &str) {
    require_root();
    let t = Topo::new(tag);
    let rules = RULESET
        .replace(
            "table ip filter {\n",
            "table ip filter {\n  set per_src { type ipv4_addr; flags dynamic; }\n",
        )
        .replace(
            "    ct state established,related accept\n",
            "    ct state established,related accept\n    iifname \"lan0\" tcp dport 8082 \
             add @per_src { ip saddr ct count over 2 } reject with tcp reset\n    \
             iifname \"lan0\" oifname \"wan0\" tcp dport 8082 accept\n",
        );
    t.write_ruleset("gw.nft", &rules);
    let cfg = t.write_config(backend, "gw.nft", "");
    let d = Daemon::start(&t, &cfg, backend);
    // A server that accepts and holds every connection.
    let server = t.dir.join("hold.py");
    std::fs::write(
        &server,
        format!(
            "import socket\ns = socket.socket()\n\
             s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n\
             s.bind(('{PUBLIC}', 8082))\ns.listen(64)\nheld = []\n\
             while True:\n    held.append(s.accept()[0])\n"
        ),
    )
    .expect("write server");
    let _srv = spawn(
        &t.public,
        &["python3", server.to_str().expect("path")],
        &t.dir.join("hold.log"),
        None,
    );
    wait_for("holding server", Duration::from_secs(10), || {
        sh(&t.public, "ss -ltn 'sport = :8082' | grep -q 8082")
            .status
            .success()
    });
    // Three connections held open, then the first reset (SO_LINGER 0),
    // then a fourth: each attempt prints ok or the error's name.
    let client = t.dir.join("conns.py");
    std::fs::write(
        &client,
        format!(
            "import socket, struct, time\n\
             def conn():\n    c = socket.socket()\n    c.settimeout(3)\n    \
             try:\n        c.connect(('{PUBLIC}', 8082))\n        return c, 'ok'\n    \
             except OSError as e:\n        return None, type(e).__name__\n\
             held, out = [], []\n\
             for _ in range(3):\n    c, r = conn()\n    out.append(r)\n    \
             if c: held.append(c)\n\
             held[0].setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack('ii', 1, 0))\n\
             held[0].close()\ntime.sleep(0.5)\n\
             c, r = conn()\nout.append(r)\nprint(' '.join(out))\n"
        ),
    )
    .expect("write client");
    let py = |ns: &Netns| {
        let o = sh(ns, &format!("timeout 30 python3 {}", client.display()));
        String::from_utf8_lossy(&o.stdout).trim().to_string()
    };
    let got = py(&t.private);
    assert_eq!(
        got,
        "ok ok ConnectionRefusedError ok",
        "{backend}\n{}\n{}",
        d.ctl("set list per_src"),
        d.context()
    );
    let list = d.ctl("set list per_src");
    assert_eq!(list["sets"][0]["elements"][0]["key"], PRIV, "{list}");
    // The other host has a count of its own.
    let got2 = py(&t.private2);
    assert_eq!(got2, "ok ok ConnectionRefusedError ok", "{}", d.context());
}

/// `reject` answers the client as the kernel's does: `reject with tcp
/// reset` refuses curl's connection at once (exit 7, not a timeout), and a
/// plain `reject` of UDP reaches a connected UDP socket as ICMP port
/// unreachable (ConnectionRefusedError on its next receive). The reset
/// rule also tests `meta time`, `day` and `hour`: the gateway's workers see
/// the wall clock (a clock of 1970 would take the rule before it).
fn reject(backend: &str, tag: &str) {
    require_root();
    let t = Topo::new(tag);
    let rules = RULESET.replace(
        "    ct state established,related accept\n",
        "    ct state established,related accept\n    \
         iifname \"lan0\" tcp dport 8083 meta time < \"2020-01-01\" counter accept\n    \
         iifname \"lan0\" tcp dport 8083 meta time >= \"2020-01-01\" meta day 0-6 \
         meta hour \"00:00\"-\"23:59:59\" counter reject with tcp reset\n    \
         iifname \"lan0\" udp dport 9999 reject\n",
    );
    t.write_ruleset("gw.nft", &rules);
    let cfg = t.write_config(backend, "gw.nft", "");
    let d = Daemon::start(&t, &cfg, backend);
    let started = Instant::now();
    let (ok, _, o) = curl(&t.private, &format!("http://{PUBLIC}:8083/"), 5);
    assert!(!ok);
    assert_eq!(
        o.status.code(),
        Some(7),
        "{backend}: curl {} (7: connection refused)\n{}",
        text(&o),
        d.context()
    );
    // The time rules: the reset came from the rule for after 2020.
    let rules = d.ctl("rule list forward");
    let count = |pat: &str| rule_packets(&rules, pat);
    assert_eq!(count("meta time < "), Some(0), "{rules}");
    assert!(count("meta time >= ").is_some_and(|n| n >= 1), "{rules}");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "refused at once"
    );
    let client = t.dir.join("udp.py");
    std::fs::write(
        &client,
        format!(
            "import socket\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n\
             s.settimeout(3)\ns.connect(('{PUBLIC}', 9999))\ns.send(b'x')\n\
             try:\n    s.recv(10)\n    print('answer')\n\
             except OSError as e:\n    print(type(e).__name__)\n"
        ),
    )
    .expect("write client");
    let o = sh(
        &t.private,
        &format!("timeout 10 python3 {}", client.display()),
    );
    assert_eq!(
        String::from_utf8_lossy(&o.stdout).trim(),
        "ConnectionRefusedError",
        "{backend}\n{}",
        d.context()
    );
    let st = d.ctl("status");
    assert!(d.drops("policy-reject") >= 2, "{st}");
}

/// `notrack` before conntrack: UDP to and from port 7777 is exempted; the
/// public server sees the private address (no SNAT), its answer comes
/// back through the gateway untranslated, and no connection is created;
/// port 7778 next to it is tracked and translated as usual.
fn notrack(backend: &str, tag: &str) {
    require_root();
    let t = Topo::new(tag);
    let rules = format!(
        "table ip raw {{\n  chain prerouting {{\n    \
         type filter hook prerouting priority raw; policy accept;\n    \
         udp dport 7777 notrack\n    udp sport 7777 notrack\n  }}\n}}\n{}",
        RULESET.replace(
            "    ct state established,related accept\n",
            "    ct state established,related accept\n    \
             ct state untracked udp dport 7777 counter accept\n    \
             ct state untracked oifname \"lan0\" udp sport 7777 counter accept\n",
        )
    );
    t.write_ruleset("gw.nft", &rules);
    let cfg = t.write_config(backend, "gw.nft", "");
    let d = Daemon::start(&t, &cfg, backend);
    // A UDP server on the public host that answers each datagram with the
    // source address it saw.
    let server = t.dir.join("who.py");
    std::fs::write(
        &server,
        format!(
            "import socket, select\nss = []\nfor port in (7777, 7778):\n    \
             s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n    \
             s.bind(('{PUBLIC}', port))\n    ss.append(s)\nwhile True:\n    \
             for s in select.select(ss, [], [])[0]:\n        \
             data, src = s.recvfrom(2048)\n        \
             s.sendto(src[0].encode(), src)\n"
        ),
    )
    .expect("write server");
    let _srv = spawn(
        &t.public,
        &["python3", &server.display().to_string()],
        &t.dir.join("who.log"),
        None,
    );
    let ask = |port: u16| {
        let o = sh(
            &t.private,
            &format!(
                "timeout 10 python3 -c 'import socket, time\nfor i in range(20):\n    \
                 s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(0.5)\n    \
                 s.sendto(b\"who\", (\"{PUBLIC}\", {port}))\n    \
                 try:\n        print(s.recvfrom(100)[0].decode()); break\n    \
                 except OSError:\n        time.sleep(0.2)'"
            ),
        );
        String::from_utf8_lossy(&o.stdout).trim().to_string()
    };
    let untracked = ask(7777);
    assert_eq!(
        untracked,
        PRIV,
        "{backend}: the server should see the private address (no NAT)\n{}",
        d.context()
    );
    let tracked = ask(7778);
    assert_eq!(
        tracked,
        POOL,
        "{backend}: port 7778 is translated\n{}",
        d.context()
    );
    let l = d.ctl("conntrack list proto udp");
    let conns = l["connections"].as_array().cloned().unwrap_or_default();
    assert!(
        conns.iter().any(|c| c["orig"]["dport"] == 7778),
        "the tracked flow has its connection: {l}"
    );
    assert!(
        !conns
            .iter()
            .any(|c| c["orig"]["dport"] == 7777 || c["orig"]["sport"] == 7777),
        "no connection for the untracked flow: {l}"
    );
    assert!(d.counter("untracked") >= 2, "{}", d.context());
    // Both forward rules counted: the query out, the answer back in.
    let rules = d.ctl("rule list forward");
    let count = |pat: &str| rule_packets(&rules, pat);
    assert!(count("udp dport 7777").is_some_and(|n| n >= 1), "{rules}");
    assert!(count("udp sport 7777").is_some_and(|n| n >= 1), "{rules}");
}

/// `snat to ip saddr map`: each private host leaves from its own address
/// (the public server's log shows which), a pool per element.
fn snat_map(backend: &str, tag: &str) {
    require_root();
    let t = Topo::new(tag);
    let rules = RULESET.replace(
        "    oifname \"wan0\" snat to 198.51.100.7\n",
        "    oifname \"wan0\" snat to ip saddr map { 10.0.0.2 : 198.51.100.7, 10.0.0.3 : 198.51.100.8 }\n",
    );
    assert_ne!(rules, RULESET);
    t.write_ruleset("gw.nft", &rules);
    let cfg = t.write_config(backend, "gw.nft", "");
    let d = Daemon::start(&t, &cfg, backend);
    let _srv = http_server(&t, &t.public, PUBLIC, 8081, "pub");
    for (ns, from) in [(&t.private, "198.51.100.7"), (&t.private2, "198.51.100.8")] {
        get_blob(ns, &format!("http://{PUBLIC}:8081/blob"), &d, backend);
        assert!(
            blob_requests(&t, "pub", from) > 0,
            "{backend}: no request from {from}:\n{}",
            read(&t.dir.join("http-pub.log"))
        );
    }
}

/// `dnat to A-B`: connections from the public host to a forwarded port
/// reach the private server the kernel's `nf_nat` would choose for that
/// client and destination (`DnatRange::pick`), every time.
fn dnat_range(backend: &str, tag: &str) {
    require_root();
    let t = Topo::new(tag);
    let rules = RULESET
        .replace(
            "ip daddr 10.0.0.3 tcp dport 80 accept",
            "ip daddr { 10.0.0.2, 10.0.0.3 } tcp dport 80 accept",
        )
        .replace(
            "    iifname \"wan0\" tcp dport 8080 dnat to 10.0.0.3:80\n",
            "    iifname \"wan0\" tcp dport 8080 dnat to 10.0.0.3:80\n    \
             iifname \"wan0\" tcp dport 8090 dnat to 10.0.0.2-10.0.0.3:80\n",
        );
    t.write_ruleset("gw.nft", &rules);
    let cfg = t.write_config(backend, "gw.nft", "");
    let d = Daemon::start(&t, &cfg, backend);
    let _a = http_server(&t, &t.private, PRIV, 80, "b2");
    let _b = http_server(&t, &t.private2, PRIV2, 80, "b3");
    let range = sluice_policy::DnatRange {
        lo: PRIV.parse().unwrap(),
        hi: PRIV2.parse().unwrap(),
        persistent: false,
    };
    let seen = |name: &str| blob_requests(&t, name, PUBLIC);
    for dst in [POOL, "203.0.113.1"] {
        let want = range.pick(PUBLIC.parse().unwrap(), dst.parse().unwrap());
        let before = (seen("b2"), seen("b3"));
        for _ in 0..3 {
            get_blob(
                &t.public,
                &format!("http://{dst}:8090/blob"),
                &d,
                &format!("{backend}: dnat range to {dst}"),
            );
        }
        let after = (seen("b2"), seen("b3"));
        let got = if want.to_string() == PRIV {
            (after.0 - before.0, after.1 - before.1)
        } else {
            (after.1 - before.1, after.0 - before.0)
        };
        assert_eq!(got, (3, 0), "{backend}: to {dst}: all three at {want}");
    }
}

/// `ct timeout` policies: a UDP exchange to a port whose rule sets the
/// policy gets the policy's timer (77 s unreplied) and the listing names
/// the object; one to another port keeps the default 30 s. A reload that
/// changes the policy's timer leaves the running connection on the old
/// timers (listed as an earlier rule set's policy) and gives new
/// connections the new one; a restart with `state_file` brings both
/// back on their own policies.
fn ct_timeout(backend: &str, tag: &str) {
    require_root();
    let t = Topo::new(tag);
    let rules2 = |secs: u32, replied: u32| {
        RULESET
            .replace(
                "table ip filter {\n",
                &format!(
                    "table ip filter {{\n  ct timeout sip {{ protocol udp; policy = {{ \
                     unreplied: {secs}, replied: {replied} }} }}\n"
                ),
            )
            .replace(
                "    ct state established,related accept\n",
                "    iifname \"lan0\" udp dport 7780 ct timeout set \"sip\"\n    \
                 ct state established,related accept\n",
            )
    };
    let rules = |secs: u32| rules2(secs, 600);
    t.write_ruleset("gw.nft", &rules(77));
    let cfg = t.write_config(backend, "gw.nft", "");
    let state = keep_state(&t, &cfg);
    let mut d = Daemon::start(&t, &cfg, backend);
    // A UDP server on the public host that answers each datagram.
    let server = t.dir.join("echo.py");
    std::fs::write(
        &server,
        format!(
            "import socket, select\nss = []\nfor port in (7780, 7781):\n    \
             s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n    \
             s.bind(('{PUBLIC}', port))\n    ss.append(s)\nwhile True:\n    \
             for s in select.select(ss, [], [])[0]:\n        \
             data, src = s.recvfrom(2048)\n        s.sendto(data, src)\n"
        ),
    )
    .expect("write server");
    let _srv = spawn(
        &t.public,
        &["python3", &server.display().to_string()],
        &t.dir.join("echo.log"),
        None,
    );
    // One exchange from a fresh socket; its source port.
    let ask = |port: u16, d: &Daemon| -> u64 {
        let o = sh(
            &t.private,
            &format!(
                "timeout 10 python3 -c 'import socket, time\nfor i in range(20):\n    \
                 s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(0.5)\n    \
                 s.sendto(b\"x\", (\"{PUBLIC}\", {port}))\n    \
                 try:\n        s.recvfrom(100); print(s.getsockname()[1]); break\n    \
                 except OSError:\n        time.sleep(0.2)'"
            ),
        );
        String::from_utf8_lossy(&o.stdout)
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{backend}: no answer from {port}\n{}", d.context()))
    };
    let conn = |d: &Daemon, sport: u64| -> serde_json::Value {
        let l = d.ctl("conntrack list proto udp");
        l["connections"]
            .as_array()
            .and_then(|cs| cs.iter().find(|c| c["orig"]["sport"] == sport).cloned())
            .unwrap_or_else(|| panic!("{backend}: no connection from port {sport}: {l}"))
    };
    let left = |c: &serde_json::Value| c["expires_in"].as_u64().unwrap_or(0);
    let with = ask(7780, &d);
    let without = ask(7781, &d);
    let (cw, co) = (conn(&d, with), conn(&d, without));
    assert!(
        (70..=77).contains(&left(&cw)),
        "{backend}: the policy's 77 s: {cw}"
    );
    assert_eq!(cw["timeout_policy"], "ip filter sip", "{cw}");
    assert!(
        (25..=30).contains(&left(&co)),
        "{backend}: the default 30 s: {co}"
    );
    assert!(co.get("timeout_policy").is_none(), "{co}");
    // The running rule set lists the object and the rule naming it.
    let rl = d.ctl("ruleset list");
    let listed = rl["ruleset"].as_str().unwrap_or_default();
    assert!(
        listed.contains("ct timeout sip {\n\t\tprotocol udp\n")
            && listed.contains("policy = { unreplied : 77, replied : 600 }")
            && listed.contains("udp dport 7780 ct timeout set \"sip\""),
        "{listed}"
    );
    // The reload: 55 s for new connections, the old one keeps 77 s.
    t.write_ruleset("gw.nft", &rules(55));
    d.signal("-HUP");
    wait_for("reload", Duration::from_secs(5), || {
        d.ctl("status")["generation"] == 2
    });
    let cw = conn(&d, with);
    assert!(left(&cw) > 55, "{backend}: still on 77 s: {cw}");
    assert_eq!(
        cw["timeout_policy"], "(policy of an earlier rule set)",
        "{cw}"
    );
    let fresh_port = ask(7780, &d);
    let fresh = conn(&d, fresh_port);
    assert!(
        (50..=55).contains(&left(&fresh)),
        "{backend}: the new 55 s: {fresh}"
    );
    assert_eq!(fresh["timeout_policy"], "ip filter sip", "{fresh}");
    // A restart (`state_file`) brings both back on their own policies.
    d.stop();
    assert!(state.exists(), "no state file\n{}", d.log());
    let d2 = Daemon::start(&t, &cfg, backend);
    let (cw, fresh, co) = (conn(&d2, with), conn(&d2, fresh_port), conn(&d2, without));
    assert_eq!(
        cw["timeout_policy"], "(policy of an earlier rule set)",
        "{cw}"
    );
    assert_eq!(fresh["timeout_policy"], "ip filter sip", "{fresh}");
    assert!(co.get("timeout_policy").is_none(), "{co}");
    assert!(left(&cw) > 50 && left(&fresh) <= 55, "{cw}\n{fresh}");
    // 300 rule sets, each changing the policy's timer, replaced one after
    // the other (more distinct policies than the 255 slots): each is taken,
    // the slots of those no rule set names and no connection follows being
    // given to the next ones, while the two running connections keep
    // theirs and their timers. (Slots are the same whatever the backend;
    // run on one.)
    if backend != "af_packet" {
        return;
    }
    let churn = t.dir.join("churn.nft");
    for k in 0..300u32 {
        std::fs::write(&churn, rules2(1000 + k, 2000 + k)).expect("write rule set");
        let r = d2.ctl(&format!("ruleset replace {}", churn.display()));
        assert!(
            r["generation"].as_u64().is_some(),
            "rule set {k} refused: {r}\n{}",
            d2.context()
        );
    }
    let (cw2, fresh2) = (conn(&d2, with), conn(&d2, fresh_port));
    assert_eq!(
        cw2["timeout_policy"], "(policy of an earlier rule set)",
        "{cw2}"
    );
    assert_eq!(
        fresh2["timeout_policy"], "(policy of an earlier rule set)",
        "{fresh2}"
    );
    assert!(
        left(&cw2) <= left(&cw) && left(&cw2) > 20,
        "still on 77 s: {cw}\n{cw2}"
    );
    assert!(left(&fresh2) <= 55, "still on 55 s: {fresh2}");
    let late = conn(&d2, ask(7780, &d2));
    // The last rule set's timers: 1299 s unreplied, 2299 s once a stream
    // (when a retried exchange made one).
    let want = if late["state_name"] == "STREAM" {
        2290..=2299
    } else {
        1290..=1299
    };
    assert!(
        want.contains(&left(&late)),
        "the last rule set's timers: {late}"
    );
    assert_eq!(late["timeout_policy"], "ip filter sip", "{late}");
}

/// A flowtable (`flow add @ft` ahead of `ct state established accept`, as
/// OpenWrt's fw4 writes it): an iperf3 TCP transfer's connections join it
/// after their first established packets, so the counted `flow add` rule
/// sees a handful of packets of the thousands forwarded, the connection
/// listing says `flowtable`, and with `xdp_offload` the XDP program
/// carries them even though the rule set filters established packets.
fn flowtable(backend: &str, tag: &str) {
    require_root();
    let t = Topo::new(tag);
    let rules = RULESET
        .replace(
            "table ip filter {\n",
            "table ip filter {\n  flowtable ft {\n    hook ingress priority 0; devices = { lan0, wan0 };\n  }\n",
        )
        .replace(
            "    ct state established,related accept\n",
            "    meta l4proto { tcp, udp } counter flow add @ft\n    \
             ct state established,related accept\n",
        );
    t.write_ruleset("gw.nft", &rules);
    let cfg = t.write_config(backend, "gw.nft", "");
    let d = Daemon::start(&t, &cfg, backend);
    let _srv = iperf3_server(&t, PUBLIC);
    let flow_rule = || {
        let rules = d.ctl("rule list forward");
        rule_packets(&rules, "flow add")
            .unwrap_or_else(|| panic!("no flow add rule counter: {rules}"))
    };
    let packets = |l: &serde_json::Value| -> u64 {
        l["connections"]
            .as_array()
            .map_or(0, |v| v.iter().filter_map(|c| c["packets"].as_u64()).sum())
    };
    // Two looks one second apart in the middle of a 4 s transfer.
    let (o, looks) = std::thread::scope(|s| {
        let c = s.spawn(|| {
            sh(
                &t.private,
                &format!("timeout 30 iperf3 -c {PUBLIC} -p 5201 -t 4 -J"),
            )
        });
        wait_for_iperf3_connections(&d);
        std::thread::sleep(Duration::from_millis(800));
        let first = (flow_rule(), d.ctl("conntrack list proto tcp port 5201"));
        std::thread::sleep(Duration::from_millis(1000));
        let second = (flow_rule(), d.ctl("conntrack list proto tcp port 5201"));
        (c.join().expect("iperf3 thread"), (first, second))
    });
    assert!(o.status.success(), "{}\n{}", text(&o), d.context());
    let ((rule1, list1), (rule2, list2)) = looks;
    let conns = list2["connections"].as_array().cloned().unwrap_or_default();
    assert!(
        conns.len() >= 2 && conns.iter().all(|c| c["flowtable"] == true),
        "{backend}: the transfer's connections should be in the flowtable: {list2}"
    );
    if backend == "af_xdp_offload" {
        assert!(
            conns.iter().any(|c| c["offloaded"] == true),
            "flowtable connections go to the XDP offload: {list2}"
        );
    } else {
        // Every packet went through the engine (the XDP program forwards
        // the offloaded ones without counting them here).
        assert!(
            packets(&list2) > packets(&list1) + 1000,
            "{backend}: the transfer moved: {list1} / {list2}"
        );
    }
    // The counted `flow add` rule saw the connections' first packets only:
    // nothing in that second of transfer (a FIN takes a connection out of
    // the flowtable; the packets after it meet the rule again).
    assert!(
        (2..50).contains(&rule1) && rule2 == rule1,
        "{backend}: the flow add rule saw {rule1} then {rule2} packets\n{}",
        d.context()
    );
}

/// The lines of the NAT log at `p` that contain every one of `pats`.
fn log_lines(p: &std::path::Path, pats: &[&str]) -> Vec<String> {
    read(p)
        .lines()
        .filter(|l| pats.iter().all(|x| l.contains(x)))
        .map(String::from)
        .collect()
}

fn nat_log(backend: &str, tag: &str) {
    let (t, d) = setup(tag, backend, "\n[nat]\nlog = \"nat.log\"\n");
    let log = t.dir.join("nat.log");
    // An ICMP echo and a UDP datagram from a fixed source port: two
    // mappings onto the pool address.
    let o = sh(&t.private, &format!("ping -c 2 -W 2 {PUBLIC}"));
    assert!(o.status.success(), "ping: {}\n{}", text(&o), d.context());
    let o = sh(
        &t.private,
        &format!(
            "python3 -c \"import socket; s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM); \
             s.bind(('10.0.0.2', 40001)); s.sendto(b'x', ('{PUBLIC}', 9))\""
        ),
    );
    assert!(o.status.success(), "udp send: {}", text(&o));
    let created_udp = [
        "nat=mapping-created",
        "proto=udp",
        "int=10.0.0.2:40001",
        "ext=198.51.100.7:",
    ];
    let created_icmp = [
        "nat=mapping-created",
        "proto=icmp",
        "int=10.0.0.2:",
        "ext=198.51.100.7:",
    ];
    wait_for("the NAT log lines", Duration::from_secs(5), || {
        !log_lines(&log, &created_udp).is_empty() && !log_lines(&log, &created_icmp).is_empty()
    });
    // The time stamp is the batch's wall-clock time.
    let line = log_lines(&log, &created_udp).remove(0);
    let stamp = line.split(' ').next().unwrap_or_default().to_string();
    let now = Command::new("date")
        .args(["-u", "+%Y-%m-%dT%H:%M"])
        .output()
        .expect("date");
    let minute = String::from_utf8_lossy(&now.stdout).trim().to_string();
    assert!(
        stamp.len() == 24 && stamp.ends_with('Z') && stamp.get(..13) == minute.get(..13),
        "time stamp {stamp} (now {minute})"
    );
    let st = d.ctl("status");
    assert!(st["nat"]["mappings"].as_u64() >= Some(2), "{st}");
    assert_eq!(st["nat"]["pools"][0]["addr"], "198.51.100.7", "{st}");
    assert!(st["nat_log"]["written"].as_u64() >= Some(2), "{st}");
    assert_eq!(st["nat_log"]["lost"], 0, "{st}");
    let ext_port: u16 = line
        .split("ext=198.51.100.7:")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .and_then(|p| p.parse().ok())
        .expect("external port in the log line");
    // The public host saw the datagram from that endpoint: the log names
    // the external endpoint the far end sees.
    let free_udp = st["nat"]["pools"][0]["free"]["udp"].as_u64().unwrap_or(0);
    assert!(
        free_udp < st["nat"]["pools"][0]["ports"].as_u64().unwrap_or(0),
        "{st}"
    );
    // A flush removes both mappings, logged with the same endpoints.
    let f = d.ctl("conntrack flush");
    assert_eq!(f["ok"], true, "{f}");
    let removed_udp = [
        "nat=mapping-removed".to_string(),
        "proto=udp".into(),
        "int=10.0.0.2:40001".into(),
        format!("ext=198.51.100.7:{ext_port} "),
    ];
    let removed_udp: Vec<&str> = removed_udp.iter().map(String::as_str).collect();
    wait_for("the removal lines", Duration::from_secs(5), || {
        !log_lines(&log, &removed_udp).is_empty()
    });
    assert_eq!(d.ctl("status")["nat"]["mappings"], 0);
    // Rotation: the file is renamed, SIGHUP reopens the configured path.
    let rotated = t.dir.join("nat.log.1");
    std::fs::rename(&log, &rotated).expect("rotate");
    d.signal("-HUP");
    wait_for("reload", Duration::from_secs(5), || {
        d.ctl("status")["generation"] == 2
    });
    let o = sh(&t.private, &format!("ping -c 1 -W 2 {PUBLIC}"));
    assert!(o.status.success(), "ping after rotation: {}", text(&o));
    wait_for("a line in the reopened log", Duration::from_secs(5), || {
        !log_lines(&log, &created_icmp).is_empty()
    });
    assert!(log_lines(&rotated, &["nat=mapping-created"]).len() >= 2);
    assert!(d.log().contains("NAT log reopened"), "{}", d.log());
    // A reload that moves the log to another file in JSON: the next
    // mapping is written there, and no longer to the old one.
    let cfg = t.dir.join("sluice.toml");
    let toml = read(&cfg).replace(
        "log = \"nat.log\"",
        "log = \"nat2.log\"\nlog_format = \"json\"",
    );
    std::fs::write(&cfg, toml).expect("rewrite config");
    let r = d.ctl("reload");
    assert!(applied(&r, "nat log"), "{r}");
    let before = log_lines(&log, &["nat=mapping-created"]).len();
    let o = sh(
        &t.private,
        &format!(
            "python3 -c \"import socket; s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM); \
             s.bind(('10.0.0.2', 40002)); s.sendto(b'x', ('{PUBLIC}', 9))\""
        ),
    );
    assert!(o.status.success(), "udp send: {}", text(&o));
    let log2 = t.dir.join("nat2.log");
    wait_for("the mapping in the new log", Duration::from_secs(5), || {
        !log_lines(
            &log2,
            &["\"event\":\"mapping-created\"", "\"int_port\":40002"],
        )
        .is_empty()
    });
    assert_eq!(log_lines(&log, &["nat=mapping-created"]).len(), before);
    assert!(
        d.log().contains("NAT log now written to a new destination"),
        "{}",
        d.log()
    );
}

/// Port block allocation: one block for the host's ICMP, UDP and TCP
/// mappings, logged once (JSON), the connections' external ports inside
/// it; a flush frees it.
///
/// With `deterministic`, the block is the one `nat.deterministic` gives the
/// host (RFC 7422), as `sluice nat lookup` computes it.
fn port_blocks(backend: &str, tag: &str, deterministic: bool) {
    let det = if deterministic {
        "deterministic = \"10.0.0.0/24\"\n"
    } else {
        ""
    };
    let (t, d) = setup(
        tag,
        backend,
        &format!("\n[nat]\nlog = \"nat.log\"\nlog_format = \"json\"\nport_block_size = 128\nmax_blocks_per_subscriber = 2\n{det}"),
    );
    let _h = http_server(&t, &t.public, PUBLIC, 8081, "a");
    let log = t.dir.join("nat.log");
    let o = sh(&t.private, &format!("ping -c 1 -W 2 {PUBLIC}"));
    assert!(o.status.success(), "ping: {}\n{}", text(&o), d.context());
    for _ in 0..3 {
        let (ok, _, o) = curl(&t.private, &format!("http://{PUBLIC}:8081/"), 5);
        assert!(ok, "curl: {}\n{}", text(&o), d.context());
    }
    let lines = || -> Vec<serde_json::Value> {
        read(&log)
            .lines()
            .map(|l| serde_json::from_str(l).expect("a JSON log line"))
            .collect()
    };
    wait_for("the block line", Duration::from_secs(5), || {
        !lines().is_empty()
    });
    let evs = lines();
    assert_eq!(evs.len(), 1, "one event for every mapping: {evs:?}");
    let b = &evs[0];
    assert_eq!(b["event"], "block-allocated", "{b}");
    assert_eq!(
        (b["int_addr"].as_str(), b["ext_addr"].as_str()),
        (Some("10.0.0.2"), Some("198.51.100.7"))
    );
    let (first, last) = (
        b["first_port"].as_u64().unwrap_or(0),
        b["last_port"].as_u64().unwrap_or(0),
    );
    assert_eq!(last - first + 1, 128, "{b}");
    if deterministic {
        let nat = sluice_daemon::nat_config(&t.dir.join("sluice.toml")).expect("nat config");
        let (addr, ranges) = nat
            .deterministic_block(sluice_nat::PoolId(0), "10.0.0.2".parse().expect("ip"))
            .expect("10.0.0.2's block");
        assert_eq!(addr.to_string(), "198.51.100.7");
        assert_eq!(ranges, vec![(first as u16, last as u16)], "{b}");
    }
    let list = d.ctl("conntrack list");
    let conns = list["connections"].as_array().expect("connections");
    assert!(conns.len() >= 4, "{list}");
    for c in conns {
        let port = c["reply"]["dport"].as_u64().unwrap_or(0);
        assert!(
            (first..=last).contains(&port),
            "external port {port} outside {first}-{last}: {c}"
        );
    }
    // Live lookups: an external endpoint's mapping and block, and what the
    // host holds.
    let ext_port = conns[0]["reply"]["dport"].as_u64().unwrap_or(0);
    let proto = match conns[0]["proto"].as_u64() {
        Some(6) => "tcp",
        Some(17) => "udp",
        _ => "icmp",
    };
    let l = d.ctl(&format!("nat lookup 198.51.100.7:{ext_port} proto {proto}"));
    assert_eq!(l["mappings"][0]["int_addr"], "10.0.0.2", "{l}");
    assert_eq!(l["mappings"][0]["ext_port"], ext_port, "{l}");
    assert_eq!(l["blocks"][0]["first_port"], first, "{l}");
    assert_eq!(l["blocks"][0]["int_addr"], "10.0.0.2", "{l}");
    let h = d.ctl("nat lookup 10.0.0.2");
    assert!(h["mappings"].as_array().map_or(0, Vec::len) >= 4, "{h}");
    assert_eq!(h["blocks"].as_array().map(Vec::len), Some(1), "{h}");
    let bad = d.ctl("nat lookup 198.51.100.7:http");
    assert_eq!(
        bad["error"]["message"], "http is not a port (ADDRESS:PORT)",
        "{bad}"
    );
    let st = d.ctl("status");
    assert_eq!(st["nat"]["blocks"], 1, "{st}");
    assert_eq!(st["nat"]["pools"][0]["blocks"]["total"], 504, "{st}");
    assert_eq!(st["nat"]["pools"][0]["blocks"]["free"], 503, "{st}");
    let f = d.ctl("conntrack flush");
    assert_eq!(f["ok"], true, "{f}");
    wait_for("the release line", Duration::from_secs(5), || {
        lines().len() == 2
    });
    let r = &lines()[1];
    assert_eq!(r["event"], "block-released", "{r}");
    assert_eq!(r["first_port"], b["first_port"]);
    assert_eq!(d.ctl("status")["nat"]["blocks"], 0);
}

#[test]
#[ignore = "needs root + netns; run by .ci/run with --ignored"]
fn port_blocks_af_packet() {
    port_blocks("af_packet", "ba", false);
}

#[test]
#[ignore = "needs root + netns; run by .ci/run with --ignored"]
fn deterministic_port_blocks_af_packet() {
    port_blocks("af_packet", "bd", true);
}

#[test]
#[ignore = "needs root + netns; run by .ci/run with --ignored"]
fn port_blocks_af_xdp() {
    port_blocks("af_xdp", "bx", false);
}

/// The NAT log to a collector (a UDP receiver on the gateway namespace's
/// loopback that writes each datagram as a line of hex): `udp://` gets one
/// RFC 5424 message per mapping event, `ipfix://` IPFIX messages whose
/// template 256 records carry the mapping (natEvent 8, NAT44 BIB create).
fn nat_log_to_collector(scheme: &str, tag: &str) {
    require_root();
    let t = Topo::new(tag);
    t.gw.ip(&["link", "set", "lo", "up"]).expect("lo up");
    let got = t.dir.join("collector.txt");
    let _rx = spawn(
        &t.gw,
        &[
            "python3",
            "-c",
            &format!(
                "import socket\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n\
                 s.bind(('127.0.0.1', 5514))\nf = open('{}', 'a')\nwhile True:\n    \
                 f.write(s.recv(4096).hex() + '\\n')\n    f.flush()\n",
                got.display()
            ),
        ],
        &t.dir.join("collector-rx.log"),
        None,
    );
    t.write_ruleset("gw.nft", RULESET);
    let cfg = t.write_config(
        "af_packet",
        "gw.nft",
        &format!("\n[nat]\nlog = \"{scheme}://127.0.0.1:5514\"\n"),
    );
    let d = Daemon::start(&t, &cfg, "af_packet");
    std::thread::sleep(Duration::from_millis(300));
    let o = sh(&t.private, &format!("ping -c 1 -W 2 {PUBLIC}"));
    assert!(o.status.success(), "ping: {}\n{}", text(&o), d.context());
    let datagrams = || -> Vec<Vec<u8>> {
        read(&got)
            .lines()
            .map(|l| {
                (0..l.len() / 2)
                    .filter_map(|i| u8::from_str_radix(l.get(2 * i..2 * i + 2)?, 16).ok())
                    .collect()
            })
            .collect()
    };
    wait_for("a datagram", Duration::from_secs(5), || {
        !datagrams().is_empty()
    });
    let first = datagrams().remove(0);
    if scheme == "udp" {
        let line = String::from_utf8_lossy(&first).to_string();
        assert!(line.starts_with("<134>1 20"), "{line}");
        assert!(
            line.contains(" sluice ") && line.contains(" NAT - "),
            "{line}"
        );
        assert!(
            line.contains("nat=mapping-created proto=icmp int=10.0.0.2:")
                && line.contains("ext=198.51.100.7:"),
            "{line}"
        );
    } else {
        let be16 = |i: usize| {
            first
                .get(i..i + 2)
                .map_or(0, |b| u16::from_be_bytes([b[0], b[1]]))
        };
        assert_eq!(be16(0), 10, "IPFIX version: {first:?}");
        assert_eq!(usize::from(be16(2)), first.len());
        assert_eq!(be16(16), 2, "templates first");
        let data = 16 + usize::from(be16(18));
        assert_eq!(be16(data), 256, "a mapping data set");
        // Record: time (8), natEvent, protocol, source, port, post-NAT
        // source, port.
        let r = first.get(data + 4..data + 4 + 22).expect("one record");
        assert_eq!((r[8], r[9]), (8, 1), "NAT44 BIB create, ICMP");
        assert_eq!(&r[10..14], &[10, 0, 0, 2]);
        assert_eq!(&r[16..20], &[198, 51, 100, 7]);
    }
    let st = d.ctl("status");
    assert_eq!(
        st["nat_log"]["path"],
        format!("{scheme}://127.0.0.1:5514"),
        "{st}"
    );
    assert_eq!(st["nat_log"]["lost"], 0, "{st}");
}

#[test]
#[ignore = "needs root + netns; run by .ci/run with --ignored"]
fn nat_log_to_syslog_af_packet() {
    nat_log_to_collector("udp", "ls");
}

#[test]
#[ignore = "needs root + netns; run by .ci/run with --ignored"]
fn nat_log_to_ipfix_af_packet() {
    nat_log_to_collector("ipfix", "li");
}

#[test]
#[ignore = "needs root + netns; run by .ci/run with --ignored"]
fn nat_log_records_mappings_af_packet() {
    nat_log("af_packet", "la");
}

#[test]
#[ignore = "needs root + netns; run by .ci/run with --ignored"]
fn nat_log_records_mappings_af_xdp() {
    nat_log("af_xdp", "lx");
}

/// Each test on AF_PACKET, on AF_XDP, and on AF_XDP with `xdp_offload`
/// (module `offload`: the same name, established flows forwarded by the
/// XDP program).
/// `conntrack count` and `conntrack flush` with a filter (netfilter's
/// `conntrack -L` / `-D` with a selection): only the connections the
/// filter names are counted or removed (with the offload, their XDP
/// entries are taken back), a flow whose connection was flushed makes a
/// new one with its next packet, and a bad filter is refused with the
/// reason and removes nothing.
fn conntrack_filtered(backend: &str, tag: &str) {
    let (t, d) = setup(tag, backend, "");
    // Three datagrams to `port`: a UDP connection (offloaded, with the
    // offload, from its second packet on).
    let send = |port: u16| {
        let o = sh(
            &t.private,
            &format!(
                "python3 -c \"import socket\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n\
                 for _ in range(3):\n    s.sendto(b'x', ('{PUBLIC}', {port}))\""
            ),
        );
        assert!(o.status.success(), "{}", text(&o));
    };
    let count = |filter: &str| -> u64 {
        let r = d.ctl(format!("conntrack count {filter}").trim());
        r["count"]
            .as_u64()
            .unwrap_or_else(|| panic!("conntrack count {filter}: {r}"))
    };
    for p in [9101, 9102, 9103] {
        send(p);
    }
    wait_ping(&t, &d);
    wait_for("three UDP connections", Duration::from_secs(5), || {
        count("proto udp port 9101") + count("proto udp port 9102") + count("proto udp port 9103")
            == 3
    });
    assert_eq!(count("port 9102"), 1);
    let all = count("");
    assert!(all >= 4, "three UDP flows and the ping: {all}");
    let bad = d.ctl("conntrack flush addr nope");
    assert_eq!(bad["ok"], false, "{bad}");
    assert_eq!(
        bad["error"]["message"], "addr: \"nope\" is not an IP address",
        "{bad}"
    );
    assert_eq!(count(""), all, "a refused flush removes nothing");
    let f = d.ctl("conntrack flush proto udp port 9102");
    assert_eq!(f["flushed"], 1, "{f}");
    assert_eq!(count("port 9102"), 0);
    assert_eq!(count(""), all - 1);
    let l = d.ctl("conntrack list proto udp");
    let mut ports: Vec<u64> = l["connections"]
        .as_array()
        .expect("connections")
        .iter()
        .filter_map(|c| c["orig"]["dport"].as_u64())
        .collect();
    ports.sort_unstable();
    assert_eq!(ports, [9101, 9103], "{l}");
    // Nothing answers on those ports: unreplied, in netfilter's words too.
    for c in l["connections"].as_array().expect("connections") {
        assert_eq!(c["state_name"], "UNREPLIED", "{c}");
        assert_eq!(c["seen_reply"], false, "{c}");
    }
    // By state and mark: the two UDP flows are unreplied, none marked.
    assert_eq!(count("proto udp state unreplied"), 2);
    assert_eq!(count("proto udp state STREAM"), 0);
    assert_eq!(count("proto udp mark 0"), 2);
    assert_eq!(count("mark 0x1/0x1"), 0);
    let bad = d.ctl("conntrack count state OPEN");
    assert_eq!(bad["ok"], false, "{bad}");
    if backend.ends_with("_offload") {
        let st = d.ctl("status");
        let w = &st["worker_status"][0]["offload"];
        assert!(
            w["installed"].as_u64() >= Some(6) && w["removed"].as_u64() >= Some(2),
            "the flushed connection's directions taken back: {st}"
        );
    }
    // The flushed flow's next packet makes a new connection.
    send(9102);
    wait_for("a new connection for 9102", Duration::from_secs(5), || {
        count("port 9102") == 1
    });
    // Everything of the private host, nothing else.
    let mine = count(&format!("addr {PRIV}"));
    assert!(mine >= 4, "{mine}");
    let f = d.ctl(&format!("conntrack flush addr {PRIV}"));
    assert_eq!(f["flushed"].as_u64(), Some(mine), "{f}");
    assert_eq!(count(&format!("addr {PRIV}")), 0);
    assert_eq!(count(""), all - mine);
}

/// A ping through the gateway that answered (its ICMP connection).
fn wait_ping(t: &Topo, d: &Daemon) {
    let o = sh(&t.private, &format!("ping -n -c 1 -W 2 {PUBLIC}"));
    assert!(o.status.success(), "{}\n{}", text(&o), d.context());
}

macro_rules! both_backends {
    ($f:ident, $tag:literal, $packet:ident, $xdp:ident) => {
        #[test]
        #[ignore = "needs root + netns; run by .ci/run with --ignored"]
        fn $packet() {
            $f("af_packet", concat!($tag, "a"));
        }

        #[test]
        #[ignore = "needs root + netns; run by .ci/run with --ignored"]
        fn $xdp() {
            $f("af_xdp", concat!($tag, "x"));
        }

        mod $xdp {
            #[test]
            #[ignore = "needs root + netns; run by .ci/run with --ignored"]
            fn offload() {
                super::$f("af_xdp_offload", concat!($tag, "o"));
            }
        }
    };
}

both_backends!(
    conntrack_filtered,
    "k",
    conntrack_count_and_flush_with_a_filter_af_packet,
    conntrack_count_and_flush_with_a_filter_af_xdp
);
both_backends!(
    iperf3_tcp_and_udp,
    "i",
    iperf3_tcp_and_udp_through_nat_af_packet,
    iperf3_tcp_and_udp_through_nat_af_xdp
);
both_backends!(
    drop_policy,
    "d",
    drop_policy_blocks_a_forbidden_port_af_packet,
    drop_policy_blocks_a_forbidden_port_af_xdp
);
both_backends!(
    dnat_port_forward,
    "f",
    dnat_port_forward_reaches_a_private_server_af_packet,
    dnat_port_forward_reaches_a_private_server_af_xdp
);
both_backends!(
    hairpinning,
    "h",
    hairpinning_through_the_pool_address_af_packet,
    hairpinning_through_the_pool_address_af_xdp
);
both_backends!(
    vlan_tagged,
    "v",
    vlan_tagged_frames_are_dropped_and_counted_af_packet,
    vlan_tagged_frames_are_dropped_and_counted_af_xdp
);
both_backends!(
    link_states,
    "l",
    link_down_and_gone_are_reported_and_counted_af_packet,
    link_down_and_gone_are_reported_and_counted_af_xdp
);
both_backends!(
    route_reload,
    "o",
    reload_applies_new_routes_timeouts_and_mtu_af_packet,
    reload_applies_new_routes_timeouts_and_mtu_af_xdp
);
both_backends!(
    route_moves,
    "m",
    a_running_ping_follows_a_route_change_af_packet,
    a_running_ping_follows_a_route_change_af_xdp
);
both_backends!(
    sighup_reload,
    "r",
    sighup_reload_keeps_a_tcp_transfer_and_applies_new_rules_af_packet,
    sighup_reload_keeps_a_tcp_transfer_and_applies_new_rules_af_xdp
);
both_backends!(
    nat_pool_reload,
    "s",
    reload_moves_snat_to_a_new_address_and_keeps_the_running_transfer_af_packet,
    reload_moves_snat_to_a_new_address_and_keeps_the_running_transfer_af_xdp
);
both_backends!(
    address_reload,
    "e",
    reload_adds_and_removes_interface_addresses_af_packet,
    reload_adds_and_removes_interface_addresses_af_xdp
);
both_backends!(
    deny_list,
    "y",
    deny_list_filled_by_probes_and_lifted_by_ctl_af_packet,
    deny_list_filled_by_probes_and_lifted_by_ctl_af_xdp
);
both_backends!(
    quota,
    "q",
    quota_ahead_of_ct_state_stops_a_udp_stream_af_packet,
    quota_ahead_of_ct_state_stops_a_udp_stream_af_xdp
);
both_backends!(
    connlimit,
    "c",
    connlimit_refuses_a_third_connection_per_source_af_packet,
    connlimit_refuses_a_third_connection_per_source_af_xdp
);
both_backends!(
    reject,
    "j",
    reject_answers_with_a_reset_or_port_unreachable_af_packet,
    reject_answers_with_a_reset_or_port_unreachable_af_xdp
);
both_backends!(
    notrack,
    "n",
    notrack_forwards_untranslated_without_a_connection_af_packet,
    notrack_forwards_untranslated_without_a_connection_af_xdp
);
both_backends!(
    snat_map,
    "sm",
    snat_map_gives_each_host_its_address_af_packet,
    snat_map_gives_each_host_its_address_af_xdp
);
both_backends!(
    dnat_range,
    "dr",
    dnat_to_a_range_reaches_the_kernels_choice_of_backend_af_packet,
    dnat_to_a_range_reaches_the_kernels_choice_of_backend_af_xdp
);
both_backends!(
    ct_timeout,
    "ct",
    ct_timeout_policies_time_new_connections_and_survive_a_reload_af_packet,
    ct_timeout_policies_time_new_connections_and_survive_a_reload_af_xdp
);
both_backends!(
    flowtable,
    "w",
    flowtable_connections_skip_the_filter_chains_af_packet,
    flowtable_connections_skip_the_filter_chains_af_xdp
);
both_backends!(
    icmp_errors,
    "t",
    ttl_exceeded_and_frag_needed_from_the_gateway_af_packet,
    ttl_exceeded_and_frag_needed_from_the_gateway_af_xdp
);

/// `sluice ctl nft …` against the running gateway: a rule inserted after
/// the `ct state` rule closes a port to new connections while a running
/// transfer carries on; deleting it by handle reopens the port; adding and
/// deleting an element of a named set does the same for an address.
fn live_rule_updates(backend: &str, tag: &str) {
    require_root();
    let t = Topo::new(tag);
    let rules = RULESET
        .replace(
            "table ip filter {\n",
            "table ip filter {\n  set blocked { type ipv4_addr; }\n",
        )
        .replace(
            "    ct state established,related accept\n",
            "    ct state established,related accept\n    ip daddr @blocked drop\n",
        );
    t.write_ruleset("gw.nft", &rules);
    let cfg = t.write_config(backend, "gw.nft", "");
    let d = Daemon::start(&t, &cfg, backend);
    let _srv = iperf3_server(&t, PUBLIC);
    let _h = http_server(&t, &t.public, PUBLIC, 8081, "a");
    let url = format!("http://{PUBLIC}:8081/blob");
    assert!(curl(&t.private, &url, 5).0, "8081 closed at start");
    let ct = ct_state_rule_handle(&d);
    let (o, closed, reopened, blocked, unblocked) = std::thread::scope(|s| {
        let c = s.spawn(|| {
            sh(
                &t.private,
                &format!("timeout 30 iperf3 -c {PUBLIC} -p 5201 -t 4 -i 1 -J"),
            )
        });
        wait_for_iperf3_connections(&d);
        // Close 8081 and, for good measure, 5201 itself: the running
        // transfer is established, so the ct state rule still accepts it.
        let a = d.ctl(&format!(
            "nft add rule ip filter forward position {ct} tcp dport {{ 5201, 8081 }} drop"
        ));
        assert_eq!(a["ok"], true, "{a}");
        let h = a["handle"].as_u64().expect("handle");
        let closed = !curl(&t.private, &url, 2).0;
        let del = d.ctl(&format!("nft delete rule ip filter forward handle {h}"));
        assert_eq!(del["ok"], true, "{del}");
        let reopened = curl(&t.private, &url, 5).0;
        let add = d.ctl(&format!("nft add element ip filter blocked {{ {PUBLIC} }}"));
        assert_eq!(add["ok"], true, "{add}");
        let blocked = !curl(&t.private, &url, 2).0;
        let rm = d.ctl(&format!(
            "nft delete element ip filter blocked {{ {PUBLIC} }}"
        ));
        assert_eq!(rm["ok"], true, "{rm}");
        let unblocked = curl(&t.private, &url, 5).0;
        (
            c.join().expect("iperf3 thread"),
            closed,
            reopened,
            blocked,
            unblocked,
        )
    });
    assert!(closed, "the added rule did not close 8081\n{}", d.context());
    assert!(
        reopened,
        "deleting the rule did not reopen 8081\n{}",
        d.context()
    );
    assert!(
        blocked,
        "the set element did not block {PUBLIC}\n{}",
        d.context()
    );
    assert!(
        unblocked,
        "deleting the element did not unblock\n{}",
        d.context()
    );
    assert!(
        o.status.success(),
        "the established transfer did not survive the updates:\n{}\n{}",
        text(&o),
        d.context()
    );
    every_second_moved(&o, 0);
    // A refused command changes nothing and says why.
    let bad = d.ctl("nft delete rule ip filter forward handle 99999");
    assert_eq!(bad["ok"], false, "{bad}");
    assert!(bad.to_string().contains("handle 99999"), "{bad}");
    assert!(
        curl(&t.private, &url, 5).0,
        "a refused command changed the rules"
    );
    assert!(d.drops("policy-drop") >= 2, "{}", d.context());
}

both_backends!(
    live_rule_updates,
    "u",
    ctl_nft_rule_and_element_updates_apply_live_af_packet,
    ctl_nft_rule_and_element_updates_apply_live_af_xdp
);

/// Netfilter runs the filter chains for every packet: a rule inserted
/// *ahead of* `ct state established,related accept` stops a running
/// transfer at once (the engine then evaluates established packets per
/// packet), and deleting it lets the same connection resume.
fn rule_ahead_of_ct_state_stops_a_running_transfer(backend: &str, tag: &str) {
    require_root();
    let t = Topo::new(tag);
    t.write_ruleset("gw.nft", RULESET);
    let cfg = t.write_config(backend, "gw.nft", "");
    let d = Daemon::start(&t, &cfg, backend);
    let _srv = iperf3_server(&t, PUBLIC);
    let ct = ct_state_rule_handle(&d);
    let (o, drops_while_blocked) = std::thread::scope(|s| {
        let c = s.spawn(|| {
            sh(
                &t.private,
                &format!("timeout 40 iperf3 -c {PUBLIC} -p 5201 -t 9 -i 1 -J"),
            )
        });
        wait_for_iperf3_connections(&d);
        std::thread::sleep(Duration::from_millis(1500));
        let before = d.drops("policy-drop");
        // `insert … position H` puts the rule before handle H.
        let a = d.ctl(&format!(
            "nft insert rule ip filter forward position {ct} tcp dport 5201 drop"
        ));
        assert_eq!(a["ok"], true, "{a}");
        let h = a["handle"].as_u64().expect("handle");
        std::thread::sleep(Duration::from_millis(2000));
        let drops = d.drops("policy-drop").saturating_sub(before);
        let del = d.ctl(&format!("nft delete rule ip filter forward handle {h}"));
        assert_eq!(del["ok"], true, "{del}");
        (c.join().expect("iperf3 thread"), drops)
    });
    assert!(
        drops_while_blocked > 0,
        "no established packet was dropped by the rule ahead of ct state\n{}",
        d.context()
    );
    assert!(
        o.status.success(),
        "the transfer did not resume after the rule was deleted:\n{}\n{}",
        text(&o),
        d.context()
    );
    let j = json(&o);
    let bytes: Vec<u64> = j["intervals"]
        .as_array()
        .expect("intervals")
        .iter()
        .map(|iv| iv["sum"]["bytes"].as_u64().unwrap_or(0))
        .collect();
    assert!(bytes.len() >= 8, "{bytes:?}");
    assert!(
        bytes.iter().any(|b| *b < 20_000),
        "no interval was stopped by the rule: {bytes:?}"
    );
    assert!(
        bytes.iter().rev().take(2).all(|b| *b > 100_000),
        "the transfer did not resume: {bytes:?}\n{}",
        d.context()
    );
}

both_backends!(
    rule_ahead_of_ct_state_stops_a_running_transfer,
    "v",
    rule_ahead_of_ct_state_stops_and_resumes_a_transfer_af_packet,
    rule_ahead_of_ct_state_stops_and_resumes_a_transfer_af_xdp
);

/// `worker_priority = 10`: the worker thread runs `SCHED_FIFO` at priority
/// 10 (read from /proc), and the gateway still forwards (a ping through
/// NAT and an iperf3 TCP transfer).
fn worker_priority(backend: &str, tag: &str) {
    require_root();
    let t = Topo::new(tag);
    t.write_ruleset("gw.nft", RULESET);
    let cfg = t.write_config(backend, "gw.nft", "");
    let base = std::fs::read_to_string(&cfg).expect("config");
    std::fs::write(&cfg, format!("worker_priority = 10\n{base}")).expect("config");
    let d = Daemon::start(&t, &cfg, backend);
    let pid = d.child.pid();
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).expect("tasks");
    let mut workers = Vec::new();
    for task in tasks.flatten() {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if comm.trim() == "sluice-w0" {
            // /proc/PID/task/TID/stat: the policy and the real-time
            // priority are fields 41 and 40 (after the `(comm)` field).
            let stat = std::fs::read_to_string(task.path().join("stat")).expect("stat");
            let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or_default();
            let f: Vec<&str> = rest.split_whitespace().collect();
            // `rest` starts at field 3.
            let field = |n: usize| f.get(n - 3).map(|v| v.to_string());
            workers.push((field(40), field(41)));
        }
    }
    assert_eq!(
        workers,
        vec![(Some("10".to_string()), Some("1".to_string()))],
        "worker (rt_priority, policy); SCHED_FIFO is 1\n{}",
        d.context()
    );
    let st = d.ctl("status");
    assert_eq!(
        st["worker_status"][0]["scheduler"].as_str(),
        Some("fifo 10"),
        "{st}"
    );
    assert!(
        d.log().contains("worker runs SCHED_FIFO"),
        "no log line:\n{}",
        d.log()
    );
    let out = sh(&t.private, &format!("ping -c 3 -i 0.3 -W 2 {PUBLIC}"));
    assert!(
        out.status.success(),
        "ping:\n{}\n{}",
        text(&out),
        d.context()
    );
    // A paced transfer: a real-time worker busy at full rate would take
    // its core from the tests running beside this one (they share cores).
    let _srv = iperf3_server(&t, PUBLIC);
    let o = sh(
        &t.private,
        &format!("timeout 20 iperf3 -c {PUBLIC} -p 5201 -b 40M -t 1 -J"),
    );
    assert!(o.status.success(), "iperf3:\n{}\n{}", text(&o), d.context());
    let bytes = json(&o)["end"]["sum_received"]["bytes"]
        .as_u64()
        .expect("bytes");
    assert!(bytes > 1 << 20, "{bytes} bytes in 1 s\n{}", d.context());
}

#[test]
#[ignore = "needs root + netns; run by .ci/run with --ignored"]
fn worker_priority_runs_the_worker_sched_fifo_af_packet() {
    worker_priority("af_packet", "pa");
}

#[test]
#[ignore = "needs root + netns; run by .ci/run with --ignored"]
fn worker_priority_runs_the_worker_sched_fifo_af_xdp() {
    worker_priority("af_xdp", "px");
}

/// The gateway watches its interfaces' links: set down, the WAN link is
/// reported (`sluice ctl status`, the log) and what is routed out of it is
/// dropped and counted (`link-down`) instead of failing in the port; up
/// again, traffic flows again; deleted, it is reported gone and the
/// gateway keeps serving (the control socket answers, SIGTERM stops it).
fn link_states(backend: &str, tag: &str) {
    let (t, mut d) = setup(tag, backend, "");
    // CPU time (user + system, clock ticks) the gateway process spends in
    // 2 s: a worker that spins on a socket in error uses all of it (200
    // ticks at the usual 100 per second), an idle one a few.
    let busy = |d: &Daemon| -> u64 {
        let o = Command::new("pgrep")
            .args(["-P", &d.child.pid().to_string()])
            .output()
            .expect("pgrep");
        let pid = String::from_utf8_lossy(&o.stdout)
            .trim()
            .parse::<u32>()
            .unwrap_or(d.child.pid());
        let ticks = || -> u64 {
            let st = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let f: Vec<&str> = st
                .rsplit(')')
                .next()
                .unwrap_or_default()
                .split_whitespace()
                .collect();
            let at = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
            at(11) + at(12)
        };
        let t0 = ticks();
        std::thread::sleep(Duration::from_secs(2));
        ticks() - t0
    };
    assert_eq!(d.link(1), "up", "{}", d.context());
    let o = sh(&t.private2, "ping -n -c 1 -W 2 203.0.113.2");
    assert!(o.status.success(), "{}\n{}", text(&o), d.context());

    let o = sh(&t.gw, "ip link set wan0 down");
    assert!(o.status.success(), "{}", text(&o));
    wait_for("wan0 reported down", Duration::from_secs(5), || {
        d.link(1) == "down"
    });
    let before = d.drops("link-down");
    let o = sh(&t.private2, "ping -n -c 2 -i 0.2 -W 1 203.0.113.2");
    assert!(!o.status.success(), "ping through a down link answered");
    assert!(d.drops("link-down") >= before + 2, "{}", d.context());
    assert!(d.log().contains("link down"), "{}", d.log());
    let b = busy(&d);
    assert!(
        b < 100,
        "the idle gateway used {b} ticks in 2 s with wan0 down"
    );

    let o = sh(&t.gw, "ip link set wan0 up");
    assert!(o.status.success(), "{}", text(&o));
    wait_for("wan0 reported up", Duration::from_secs(5), || {
        d.link(1) == "up"
    });
    wait_for_ping(&t.private2, "203.0.113.2", "a ping through wan0 again");

    // A connection the gateway tracks, which must outlive the interface.
    let udp_flows = |d: &Daemon| -> u64 {
        d.ctl("conntrack list proto udp port 9999")["count"]
            .as_u64()
            .unwrap_or(0)
    };
    let o = sh(
        &t.private2,
        "python3 -c \"import socket; s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM); \
         s.bind(('10.0.0.3', 4242)); s.sendto(b'x', ('203.0.113.2', 9999))\"",
    );
    assert!(o.status.success(), "{}", text(&o));
    wait_for("the UDP flow tracked", Duration::from_secs(5), || {
        udp_flows(&d) == 1
    });

    let o = sh(&t.gw, "ip link del wan0");
    assert!(o.status.success(), "{}", text(&o));
    wait_for("wan0 reported gone", Duration::from_secs(5), || {
        d.link(1) == "gone"
    });
    assert!(d.log().contains("interface gone"), "{}", d.log());
    let b = busy(&d);
    assert!(
        b < 100,
        "the idle gateway used {b} ticks in 2 s with wan0 gone"
    );
    let before = d.drops("link-down");
    let o = sh(&t.private2, "ping -n -c 1 -W 1 203.0.113.2");
    assert!(!o.status.success());
    assert!(d.drops("link-down") > before, "{}", d.context());

    // wan0 comes back (a new veth pair: new MACs on both ends): the gateway
    // opens its ports again, announces its new MAC and forwards, with the
    // connections it had.
    t.recreate_wan();
    wait_for("wan0 back up", Duration::from_secs(10), || {
        d.link(1) == "up"
    });
    assert!(
        d.log().contains("interface back: ports opened again"),
        "{}",
        d.log()
    );
    wait_for_ping(&t.private2, "203.0.113.2", "a ping through the new wan0");
    assert_eq!(udp_flows(&d), 1, "the connection outlived the interface");
    // AF_PACKET re-opens only wan0's port; AF_XDP every port (new UMEM).
    let lan_opens = d
        .log()
        .lines()
        .filter(|l| l.contains("port open") && l.contains("lan0"))
        .count();
    let expect = if backend == "af_packet" { 1 } else { 2 };
    assert_eq!(lan_opens, expect, "{}", d.log());
    let st = d.ctl("status");
    let mode = st["worker_status"][0]["ports"][1]["mode"]
        .as_str()
        .unwrap_or("?")
        .to_string();
    assert!(
        mode.starts_with(backend.trim_end_matches("_offload")) && !mode.contains("detached"),
        "{st}"
    );
    // The public host knows the gateway by the new wan0's MAC (the
    // gateway's announcement and ARP answers carry it).
    let word_after = |out: &str, key: &str| -> String {
        let w: Vec<&str> = out.split_whitespace().collect();
        w.iter()
            .position(|x| *x == key)
            .and_then(|i| w.get(i + 1))
            .map(|x| x.to_string())
            .unwrap_or_default()
    };
    let wan_mac = word_after(&text(&sh(&t.gw, "ip -o link show dev wan0")), "link/ether");
    let seen = word_after(
        &text(&sh(&t.public, "ip neigh show 203.0.113.1 dev eth0")),
        "lladdr",
    );
    assert!(
        !wan_mac.is_empty() && seen == wan_mac,
        "{seen} != {wan_mac}"
    );

    // Moved to another namespace and back (it keeps its index): its
    // ports are opened again too.
    let backs = |d: &Daemon| {
        d.log()
            .matches("interface back: ports opened again")
            .count()
    };
    let n = backs(&d);
    let o = sh(
        &t.gw,
        &format!("ip link set wan0 netns {}", t.private.name()),
    );
    assert!(o.status.success(), "{}", text(&o));
    wait_for("wan0 gone", Duration::from_secs(5), || d.link(1) == "gone");
    let o = sh(
        &t.private,
        &format!("ip link set wan0 netns {} && true", t.gw.name()),
    );
    assert!(o.status.success(), "{}", text(&o));
    let o = sh(&t.gw, "ip link set wan0 up");
    assert!(o.status.success(), "{}", text(&o));
    wait_for("wan0 opened again", Duration::from_secs(10), || {
        backs(&d) == n + 1 && d.link(1) == "up"
    });
    wait_for_ping(&t.private2, "203.0.113.2", "a ping after the move");
    assert_eq!(udp_flows(&d), 1, "the connection outlived the move");
    let st = d.ctl("status");
    assert_eq!(st["interfaces"][1]["reopened"], 2, "{st}");
    assert_eq!(st["interfaces"][0]["reopened"], 0, "{st}");
    d.signal("-TERM");
    let st = d.child.0.as_mut().map(|c| c.wait());
    assert!(
        matches!(st, Some(Ok(s)) if s.success()),
        "exit after SIGTERM: {st:?}\n{}",
        d.log()
    );
}

/// A second gateway on the interfaces a running one holds (a double
/// start: same namespace, another control socket) is refused at start,
/// naming the first one's process, and the first keeps forwarding.
#[test]
#[ignore = "needs root + netns; run by .ci/run with --ignored"]
fn a_second_gateway_on_the_same_interfaces_is_refused() {
    let (t, d) = setup("2", "af_packet", "");
    let cfg = t.dir.join("sluice.toml");
    let second = t.dir.join("second.toml");
    let toml = std::fs::read_to_string(&cfg)
        .expect("read sluice.toml")
        .replace(
            &t.socket().display().to_string(),
            &t.dir.join("ctl2.sock").display().to_string(),
        );
    std::fs::write(&second, toml).expect("write second.toml");
    for backend in ["af_packet", "af_xdp"] {
        let o = Command::new("timeout")
            .args(["20", "ip", "netns", "exec", t.gw.name()])
            .arg(example_bin())
            .arg("run")
            .arg(&second)
            .arg(backend)
            .output()
            .expect("run a second gateway");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            !o.status.success(),
            "{backend}: the second gateway started:\n{err}"
        );
        assert!(
            err.contains(&format!(
                "interface lan0: in use by another Sluice gateway (pid {}",
                d.child.pid()
            )),
            "{backend}: {err}"
        );
    }
    let o = sh(&t.private2, "ping -n -c 1 -W 2 203.0.113.2");
    assert!(o.status.success(), "{}\n{}", text(&o), d.context());
}

/// A reload with a new static route (and new conntrack timeouts, a
/// smaller MTU on wan0, answered with fragmentation needed, and a static
/// neighbour added and removed again): a
/// network the gateway had no route to (192.0.2.0/24, behind the public
/// host) is reached after it, without a restart; a ping that was dropped
/// as `no-route` before goes through, and when a SIGHUP takes the route
/// away again new connections are refused.
fn route_reload(backend: &str, tag: &str) {
    let (t, d) = setup(tag, backend, "");
    let o = sh(
        &t.public,
        "ip addr add 192.0.2.1/32 dev lo && ip link set lo up",
    );
    assert!(o.status.success(), "{}", text(&o));
    // The host knows the gateway's MAC first (ping sends after ARP).
    wait_for_ping(&t.private2, "10.0.0.1", "the gateway answers");
    let before = d.drops("no-route");
    let o = sh(&t.private2, "ping -n -c 1 -W 1 192.0.2.1");
    assert!(!o.status.success(), "answered without a route");
    assert!(
        d.drops("no-route") > before,
        "{}\n{}",
        text(&o),
        d.context()
    );
    let cfg = t.dir.join("sluice.toml");
    let plain = read(&cfg);
    let big_ping = |ns: &Netns| sh(ns, "ping -n -c 1 -M do -s 1472 -W 2 203.0.113.2");
    let o = big_ping(&t.private2);
    assert!(o.status.success(), "{}\n{}", text(&o), d.context());
    // With new conntrack timeouts and a smaller MTU on wan0 (the last
    // interface of the file, whose table the appended key joins); all
    // apply without a restart.
    std::fs::write(
        &cfg,
        format!(
            "{plain}mtu = 1400\n\n[[routes]]\nto = \"192.0.2.0/24\"\nvia = \"203.0.113.2\"\n\n\
             [conntrack.timeouts]\nudp = 45\n"
        ),
    )
    .expect("rewrite sluice.toml");
    // `reload check` tells what a reload would do, and does nothing.
    let c = d.ctl("reload check");
    assert_eq!(c["ok"], true, "{c}");
    assert_eq!(
        c["applied"],
        serde_json::json!([
            "ruleset",
            "interfaces (mac, mtu)",
            "conntrack timeouts",
            "routes"
        ]),
        "{c}"
    );
    assert_eq!(
        d.ctl("status")["generation"],
        1,
        "nothing applied by the check"
    );
    let r = d.ctl("reload");
    assert_eq!(r["ok"], true, "{r}");
    assert_eq!(r["needs_restart"], serde_json::json!([]), "{r}");
    assert_eq!(
        r["applied"],
        serde_json::json!([
            "ruleset",
            "interfaces (mac, mtu)",
            "conntrack timeouts",
            "routes"
        ]),
        "{r}"
    );
    let log = d.log();
    assert!(log.contains("reload: static routes replaced"), "{log}");
    assert!(log.contains("reload: conntrack timeouts replaced"), "{log}");
    assert!(log.contains("reload: interface MAC / MTU applied"), "{log}");
    let st = d.ctl("status");
    assert_eq!(
        st["routes"],
        serde_json::json!([{"to": "192.0.2.0/24", "via": "203.0.113.2", "dev": "wan0"}]),
        "{st}"
    );
    assert!(!log.contains("need a restart"), "{log}");
    let o = big_ping(&t.private2);
    let out = text(&o);
    assert!(
        !o.status.success() && out.contains("Frag needed and DF set (mtu = 1400)"),
        "{out}\n{}",
        d.context()
    );
    wait_for_ping(&t.private2, "192.0.2.1", "a ping over the new route");
    std::fs::write(&cfg, &plain).expect("rewrite sluice.toml");
    d.signal("-HUP");
    wait_for("the route removed", Duration::from_secs(5), || {
        d.log().matches("reload: static routes replaced").count() == 2
    });
    // The kernel's MTU again (1500), for a host that did not learn 1400.
    let o = big_ping(&t.private);
    assert!(o.status.success(), "{}\n{}", text(&o), d.context());
    // A reload of a broken file is refused, keeps everything, and is
    // counted; the next good one clears the alarm.
    std::fs::write(&cfg, format!("{plain}\nworkers = \"two\"\n")).expect("rewrite");
    let c = d.ctl("reload check");
    assert_eq!(c["ok"], false, "{c}");
    let r = d.ctl("reload");
    assert_eq!(r["ok"], false, "{r}");
    let metric = |d: &Daemon, name: &str| -> String {
        let m = d.ctl("metrics");
        m["metrics"]
            .as_str()
            .unwrap_or_default()
            .lines()
            .find(|l| l.starts_with(name))
            .unwrap_or_default()
            .to_string()
    };
    assert_eq!(
        metric(&d, "sluice_config_last_reload_successful"),
        "sluice_config_last_reload_successful 0"
    );
    assert_eq!(
        metric(&d, "sluice_config_reloads_total{result=\"failed\"}"),
        "sluice_config_reloads_total{result=\"failed\"} 1"
    );
    assert_eq!(d.ctl("status")["reloads"]["ok"], 2, "ctl reload and SIGHUP");
    std::fs::write(&cfg, &plain).expect("rewrite");
    assert_eq!(d.ctl("reload")["ok"], true);
    assert_eq!(
        metric(&d, "sluice_config_last_reload_successful"),
        "sluice_config_last_reload_successful 1"
    );
    // A static neighbour with a wrong MAC breaks the path to the public
    // host; taking it out of the file again lets ARP find the right one.
    std::fs::write(
        &cfg,
        format!("{plain}\n[[neighbors]]\nip = \"203.0.113.2\"\nmac = \"02:00:00:00:00:99\"\n"),
    )
    .expect("rewrite");
    assert_eq!(d.ctl("reload")["ok"], true);
    let o = sh(&t.private2, "ping -n -c 1 -W 1 203.0.113.2");
    assert!(!o.status.success(), "answered through a wrong MAC");
    std::fs::write(&cfg, &plain).expect("rewrite");
    assert_eq!(d.ctl("reload")["ok"], true);
    assert!(
        d.log().contains("reload: static neighbours removed"),
        "{}",
        d.log()
    );
    wait_for_ping(
        &t.private2,
        "203.0.113.2",
        "a ping after the neighbour was removed",
    );
    let before = d.drops("no-route");
    // A new connection (another host) finds no route.
    wait_for_ping(&t.private, "10.0.0.1", "the gateway answers");
    let o = sh(&t.private, "ping -n -c 1 -W 1 192.0.2.1");
    assert!(!o.status.success(), "answered after the route went away");
    assert!(d.drops("no-route") > before, "{}", d.context());
}

/// An established connection moves with a reload that changes its route:
/// a ping running through 203.0.113.2 goes on through 203.0.113.3 (the same
/// host under a second address: the gateway must resolve it, which it does
/// only because the running ping's connection was moved there), one
/// connection throughout, at most a few replies lost.
fn route_moves(backend: &str, tag: &str) {
    let (t, d) = setup(tag, backend, "");
    let o = sh(
        &t.public,
        "ip addr add 192.0.2.1/32 dev lo && ip link set lo up && ip addr add 203.0.113.3/24 dev eth0",
    );
    assert!(o.status.success(), "{}", text(&o));
    let cfg = t.dir.join("sluice.toml");
    let plain = read(&cfg);
    let via = |gw: &str| format!("{plain}\n[[routes]]\nto = \"192.0.2.0/24\"\nvia = \"{gw}\"\n");
    std::fs::write(&cfg, via("203.0.113.2")).expect("rewrite");
    assert_eq!(d.ctl("reload")["ok"], true);
    wait_for_ping(&t.private2, "192.0.2.1", "a ping over the first route");
    assert!(d.knows_neighbor(0, "203.0.113.2") && !d.knows_neighbor(0, "203.0.113.3"));
    let ns = t.private2.name().to_string();
    let ping = std::thread::spawn(move || {
        Command::new("ip")
            .args(["netns", "exec", &ns, "ping", "-n", "-c", "40", "-i", "0.1"])
            .args(["-W", "1", "192.0.2.1"])
            .output()
            .expect("run ping")
    });
    std::thread::sleep(Duration::from_millis(1500));
    let icmp = |d: &Daemon| {
        d.ctl("conntrack list proto icmp")["count"]
            .as_u64()
            .unwrap_or(0)
    };
    let before = icmp(&d);
    std::fs::write(&cfg, via("203.0.113.3")).expect("rewrite");
    assert_eq!(d.ctl("reload")["ok"], true);
    let o = ping.join().expect("ping thread");
    let out = text(&o);
    let received = ping_received(&out);
    assert!(
        received.len() == 1 && received[0] >= 36,
        "{out}\n{}",
        d.context()
    );
    assert!(
        d.knows_neighbor(0, "203.0.113.3"),
        "the moved connection resolved the new router: {}",
        d.context()
    );
    assert_eq!(icmp(&d), before, "the same connections: {}", d.context());
}

/// A restart with `state_file`: the gateway saves its connections when it
/// stops (SIGTERM) and the next start takes them back, so an iperf3
/// transfer through it goes on across the restart, although the rule set
/// only lets a SYN from the LAN start a connection (without the saved
/// state its mid-stream segments would be new connections, and dropped).
/// With `nat` the transfer is source-translated to the pool address, and
/// after the restart the host's mappings are the ones it had.
fn restart_keeps_connections(backend: &str, tag: &str, nat: bool, extra: &str) {
    require_root();
    let t = Topo::new(tag);
    let snat = if nat {
        "table ip nat {\n  chain postrouting {\n    type nat hook postrouting priority 100; policy accept;\n    oifname \"wan0\" snat to 198.51.100.7\n  }\n}\n"
    } else {
        ""
    };
    t.write_ruleset(
        "gw.nft",
        &format!(
            r#"table ip filter {{
  chain forward {{
    type filter hook forward priority 0; policy drop;
    ct state established,related accept
    iifname "lan0" oifname "wan0" tcp dport 5201 tcp flags & (syn | ack) == syn accept
    iifname "lan0" oifname "wan0" icmp type echo-request accept
  }}
}}
{snat}"#
        ),
    );
    let cfg = t.write_config(backend, "gw.nft", extra);
    let state = keep_state(&t, &cfg);
    let mut d = Daemon::start(&t, &cfg, backend);
    wait_ping(&t, &d);
    let _srv = iperf3_server(&t, PUBLIC);
    let (o, d2) = std::thread::scope(|s| {
        let c = s.spawn(|| {
            sh(
                &t.private,
                &format!("timeout 40 iperf3 -c {PUBLIC} -p 5201 -t 8 -i 1 -J"),
            )
        });
        wait_for_iperf3_connections(&d);
        std::thread::sleep(Duration::from_millis(1500));
        let before = d.ctl("nat lookup 10.0.0.2");
        d.stop();
        assert!(
            d.log().contains("connections saved for the next start"),
            "{}",
            d.log()
        );
        assert!(state.exists(), "no state file");
        let d2 = Daemon::start(&t, &cfg, backend);
        if nat {
            // The same mappings (iperf3's two connections' ports), before
            // the transfer resumes.
            let after = d2.ctl("nat lookup 10.0.0.2");
            assert_eq!(after["mappings"], before["mappings"], "{before}\n{after}");
            let tcp = after["mappings"]
                .as_array()
                .map_or(0, |a| a.iter().filter(|m| m["proto"] == 6).count());
            assert_eq!(tcp, 2, "{after}");
            assert_eq!(after["blocks"], before["blocks"], "{before}\n{after}");
            if extra.contains("port_block_size") {
                assert!(
                    after["blocks"].as_array().is_some_and(|b| !b.is_empty()),
                    "{after}"
                );
            }
        }
        (c.join().expect("iperf3 thread"), d2)
    });
    assert!(
        o.status.success(),
        "the transfer did not survive the restart:\n{}\n{}",
        text(&o),
        d2.context()
    );
    let j = json(&o);
    let moved_late: Vec<u64> = j["intervals"]
        .as_array()
        .map(|a| {
            a.iter()
                .rev()
                .take(3)
                .map(|i| i["sum"]["bytes"].as_u64().unwrap_or(0))
                .collect()
        })
        .unwrap_or_default();
    assert!(
        moved_late.len() == 3 && moved_late.iter().all(|&b| b > 0),
        "no data in the last seconds, after the restart: {moved_late:?}\n{}",
        d2.context()
    );
    // The log without its colours.
    let mut log = String::new();
    let mut esc = false;
    for ch in d2.log().chars() {
        match (esc, ch) {
            (false, '\u{1b}') => esc = true,
            (true, 'm') => esc = false,
            (true, _) => {}
            (false, c) => log.push(c),
        }
    }
    let restored = log
        .lines()
        .find(|l| l.contains("connections restored"))
        .unwrap_or_default()
        .to_string();
    assert!(
        restored.contains("restored=2") || restored.contains("restored=3"),
        "iperf3's control and data connections (and the ping's) restored: {restored}\n{log}"
    );
    assert!(!state.exists(), "the state file is removed once read");
    // The new gateway lists them.
    let list = d2.ctl("conntrack list");
    let n5201 = list["connections"]
        .as_array()
        .map(|a| a.iter().filter(|c| c["orig"]["dport"] == 5201).count())
        .unwrap_or(0);
    assert!(n5201 >= 2, "{list}");
}

fn restart_keeps_forwarded(backend: &str, tag: &str) {
    restart_keeps_connections(backend, tag, false, "");
}

fn restart_keeps_translated(backend: &str, tag: &str) {
    restart_keeps_connections(backend, tag, true, "");
}

/// Port block allocation: the mappings come back in their blocks.
#[test]
#[ignore = "needs root + netns; run by .ci/run with --ignored"]
fn a_restart_keeps_nat_connections_in_port_blocks_af_packet() {
    restart_keeps_connections("af_packet", "tb", true, "\n[nat]\nport_block_size = 64\n");
}

both_backends!(
    restart_keeps_forwarded,
    "s",
    a_restart_keeps_connections_with_state_file_af_packet,
    a_restart_keeps_connections_with_state_file_af_xdp
);
both_backends!(
    restart_keeps_translated,
    "t",
    a_restart_keeps_nat_connections_with_state_file_af_packet,
    a_restart_keeps_nat_connections_with_state_file_af_xdp
);
