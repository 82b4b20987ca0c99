//! IPv6 end to end, with real clients through a running gateway (the
//! `sluiced` example binary) on AF_PACKET and on AF_XDP, in the namespace
//! topology of `common` with IPv6 added:
//!
//! ```text
//!  private  fd00:1::2/64 (br0)  -- lan0 [sluice] wan0 --  public 2001:db8:2::2/64, fe80::2,
//!                                                              2001:db8:99::2/64 (eth0)
//!                    fd00:1::1/64 + EUI-64 LL   2001:db8:2::1/64 + EUI-64 LL
//! ```
//!
//! The private host's default route is the gateway's global address, the
//! public host's route to the LAN is the gateway's EUI-64 link-local
//! address, and the gateway's default route (which 2001:db8:99::2 takes) is
//! the public host's link-local fe80::2: every next hop is resolved with
//! NDP, none is static.
//! The gateway namespace's kernel has IPv6 disabled on lan0/wan0, so every
//! answer comes from sluice.
//!
//! Proves: `ping -6` through the gateway and to both of its addresses
//! (global and link-local); an HTTP download over IPv6 (TCP) with the
//! client's own address seen by the server (no NAT66); the `inet` ruleset's
//! IPv6 drop rule blocks the port it forbids and new connections from the
//! outside, while `ct state established,related` lets replies through;
//! hop limit 1 is answered with time exceeded and an oversized packet with
//! packet too big (mtu 1400), which the host's kernel accepts (it learns
//! the path MTU); IPv6 connections show in `conntrack list`.
//! With two workers (AF_PACKET and AF_XDP), IPv6 is spread over both by
//! its addresses: ping, HTTP and iperf3 from sources steered to each
//! worker, an ICMPv6 error from a router steered by the packet it quotes,
//! and a worker other than 0 resolving a next hop, all under a stateful
//! rule set. `notrack` at `priority raw` for echo: after a reload, pings
//! cross untracked, with no IPv6 connection for them. An address added to
//! wan0 by a reload is answered at once, and no longer once a reload takes
//! it away.
//!
//! Needs root, `ip`, `sysctl`, `ethtool`, `ping`, `curl` and `python3`.

mod common;

use std::time::Duration;

use common::*;

const PRIV6: &str = "fd00:1::2";
const GW_LAN6: &str = "fd00:1::1";
/// The public host's address on the WAN link.
const PUB6_LINK: &str = "2001:db8:2::2";
/// The public host's address off the WAN prefix: reached through the
/// gateway's default route, via the public host's link-local fe80::2.
const PUB6: &str = "2001:db8:99::2";
const GW_WAN6: &str = "2001:db8:2::1";

/// Forward: replies; from the LAN TCP 5201 (iperf3) and 8080 (not 8081,
/// dropped by an `ip6` rule first), echo requests. Everything else, in
/// particular anything new from the WAN, is dropped by the policy. The
/// `inet` masquerade rule must not touch IPv6 (no NAT66).
const RULESET: &str = r#"table inet filter {
  chain forward {
    type filter hook forward priority 0; policy drop;
    ct state established,related accept
    ip6 daddr 2001:db8:99::2 tcp dport 8081 drop
    ip6 daddr 2001:db8:99::2 tcp dport 8082 reject with tcp reset
    ip6 daddr 2001:db8:99::2 udp dport 9999 reject
    iifname "lan0" oifname "wan0" tcp dport { 5201, 8080, 8081 } accept
    iifname "lan0" oifname "wan0" icmpv6 type echo-request accept
  }
}
table inet nat {
  chain postrouting {
    type nat hook postrouting priority 100; policy accept;
    oifname "wan0" masquerade
  }
}
"#;

fn gw_mac(t: &Topo, dev: &str) -> [u8; 6] {
    let o = sh(&t.gw, &format!("cat /sys/class/net/{dev}/address"));
    let s = String::from_utf8_lossy(&o.stdout).trim().to_string();
    sluice_daemon::config::mac_from_str(&s)
        .unwrap_or_else(|| panic!("MAC of {dev}: {s:?}\n{}", text(&o)))
}

fn must(ns: &Netns, cmd: &str) {
    let o = sh(ns, cmd);
    assert!(o.status.success(), "{cmd}:\n{}", text(&o));
}

/// [`must`] through the gateway: a failure shows the daemon's state too.
fn must_via(ns: &Netns, cmd: &str, d: &Daemon) {
    let o = sh(ns, cmd);
    assert!(o.status.success(), "{cmd}:\n{}\n{}", text(&o), d.context());
}

fn setup(tag: &str, backend: &str, workers: u16) -> (Topo, Daemon, String) {
    require_root();
    let t = Topo::new(tag);
    // The gateway's kernel keeps out of IPv6 on the sluice interfaces.
    for dev in ["lan0", "wan0"] {
        must(
            &t.gw,
            &format!("sysctl -qw net.ipv6.conf.{dev}.disable_ipv6=1"),
        );
    }
    must(
        &t.private,
        "sysctl -qw net.ipv6.conf.all.disable_ipv6=0 net.ipv6.conf.br0.disable_ipv6=0",
    );
    must(
        &t.private,
        &format!("ip -6 addr add {PRIV6}/64 dev br0 nodad"),
    );
    must(
        &t.private,
        &format!("ip -6 route add default via {GW_LAN6}"),
    );
    must(
        &t.public,
        "sysctl -qw net.ipv6.conf.all.disable_ipv6=0 net.ipv6.conf.eth0.disable_ipv6=0",
    );
    must(
        &t.public,
        &format!("ip -6 addr add {PUB6_LINK}/64 dev eth0 nodad"),
    );
    must(
        &t.public,
        &format!("ip -6 addr add {PUB6}/64 dev eth0 nodad"),
    );
    must(&t.public, "ip -6 addr add fe80::2/64 dev eth0 nodad");
    let wan_ll = sluice_wire::ndp::link_local(gw_mac(&t, "wan0"));
    must(
        &t.public,
        &format!("ip -6 route add fd00:1::/64 via {wan_ll} dev eth0"),
    );
    t.write_ruleset("gw6.nft", RULESET);
    let cfg = t.dir.join("sluice.toml");
    // `af_xdp_offload`: AF_XDP with `xdp_offload = true`.
    let (io, offload) = match backend.strip_suffix("_offload") {
        Some(b) => (b, true),
        None => (backend, false),
    };
    std::fs::write(
        &cfg,
        format!(
            r#"ruleset = "gw6.nft"
backend = "{io}"
xdp_offload = {offload}
workers = {workers}
control_socket = "{}"

[[interfaces]]
name = "lan0"
role = "inside"
addresses = ["10.0.0.1/24", "{GW_LAN6}/64"]

[[interfaces]]
name = "wan0"
role = "outside"
addresses = ["203.0.113.1/24", "{GW_WAN6}/64"]
mtu = 1400

[[routes]]
to = "::/0"
via = "fe80::2"
dev = "wan0"
"#,
            t.socket().display()
        ),
    )
    .expect("write toml");
    let d = Daemon::start(&t, &cfg, backend);
    let lan_ll = sluice_wire::ndp::link_local(gw_mac(&t, "lan0")).to_string();
    (t, d, lan_ll)
}

fn curl6(ns: &Netns, port: u16, max_time: u32) -> (bool, String, std::process::Output) {
    let o = sh(
        ns,
        &format!(
            "curl -6 -sS --max-time {max_time} -o /dev/null -w '%{{size_download}}' http://[{PUB6}]:{port}/blob"
        ),
    );
    (
        o.status.success(),
        String::from_utf8_lossy(&o.stdout).to_string(),
        o,
    )
}

fn ipv6_end_to_end(backend: &str, tag: &str) {
    let offload = backend.ends_with("_offload");
    let (t, d, lan_ll) = setup(tag, backend, 1);

    // Through the gateway: NS for its global address, NS for the public
    // host's link-local next hop, echo both ways.
    must_via(
        &t.private,
        &format!("ping -6 -n -c 3 -i 0.2 -W 2 {PUB6}"),
        &d,
    );
    // To the gateway itself: global and link-local (EUI-64) addresses.
    must_via(&t.private, &format!("ping -6 -n -c 1 -W 2 {GW_LAN6}"), &d);
    must_via(
        &t.private,
        &format!("ping -6 -n -c 1 -W 2 {lan_ll}%br0"),
        &d,
    );
    must_via(&t.public, &format!("ping -6 -n -c 1 -W 2 {GW_WAN6}"), &d);

    // TCP: a 256 KiB download, and the server sees the private address.
    let _a = http_server(&t, &t.public, PUB6, 8080, "allowed6");
    let _b = http_server(&t, &t.public, PUB6, 8081, "forbidden6");
    let (ok, size, o) = curl6(&t.private, 8080, 10);
    assert!(
        ok && size == (256 << 10).to_string(),
        "HTTP over IPv6 failed: {}\n{}",
        text(&o),
        d.context()
    );
    let log = read(&t.dir.join("http-allowed6.log"));
    assert!(
        log.contains(&format!("{PRIV6} - - ")) && log.contains("GET /blob"),
        "the server should see {PRIV6} (no NAT66):\n{log}"
    );
    let ct = d.ctl(&format!("conntrack list addr {PRIV6}"));
    let entries = ct["connections"].as_array().cloned().unwrap_or_default();
    assert!(
        entries
            .iter()
            .any(|e| e["orig"]["src"] == PRIV6 && e["orig"]["dst"] == PUB6),
        "no IPv6 connection listed: {ct}"
    );

    // The ip6 drop rule: port 8081 is forbidden.
    let before = d.drops("policy-drop");
    let (ok, _, o) = curl6(&t.private, 8081, 2);
    assert!(!ok, "forbidden port 8081 answered:\n{}", text(&o));
    assert_eq!(o.status.code(), Some(28), "{}", text(&o));
    assert!(d.drops("policy-drop") > before, "{}", d.context());
    let log = read(&t.dir.join("http-forbidden6.log"));
    assert!(
        !log.contains("GET /blob"),
        "forbidden request reached the server:\n{log}"
    );
    // `reject with tcp reset`: refused at once (curl exit 7); a plain
    // `reject` of UDP: ICMPv6 port unreachable, which a connected UDP
    // socket reports on its next receive.
    let (ok, _, o) = curl6(&t.private, 8082, 5);
    assert!(!ok);
    assert_eq!(o.status.code(), Some(7), "{}\n{}", text(&o), d.context());
    let o = sh(
        &t.private,
        &format!(
            "timeout 10 python3 -c \"import socket\ns = socket.socket(socket.AF_INET6, \
             socket.SOCK_DGRAM)\ns.settimeout(3)\ns.connect(('{PUB6}', 9999))\n\
             s.send(b'x')\ntry:\n    s.recv(10)\n    print('answer')\nexcept OSError as e:\n    \
             print(type(e).__name__)\""
        ),
    );
    assert_eq!(
        String::from_utf8_lossy(&o.stdout).trim(),
        "ConnectionRefusedError",
        "{}\n{}",
        text(&o),
        d.context()
    );
    assert!(d.drops("policy-reject") >= 2, "{}", d.context());
    // New connections from the WAN are dropped by the policy.
    let before = d.drops("policy-drop");
    let o = sh(&t.public, &format!("ping -6 -n -c 1 -W 1 {PRIV6}"));
    assert!(
        !o.status.success(),
        "LAN host reachable from the WAN over IPv6"
    );
    assert!(d.drops("policy-drop") > before, "{}", d.context());

    // Hop limit 1: time exceeded from the gateway's LAN address.
    let o = sh(&t.private, &format!("ping -6 -n -c 1 -t 1 -W 2 {PUB6}"));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains(&format!("From {GW_LAN6}")) && out.contains("Time exceeded"),
        "no time exceeded from {GW_LAN6}:\n{}\n{}",
        text(&o),
        d.context()
    );
    // Exactly the WAN MTU passes (1352 + 8 + 40 = 1400); 1401 does not:
    // packet too big with mtu 1400, and the host learns the path MTU.
    must_via(
        &t.private,
        &format!("ping -6 -n -c 1 -M do -s 1352 -W 2 {PUB6}"),
        &d,
    );
    let o = sh(
        &t.private,
        &format!("ping -6 -n -c 1 -M do -s 1353 -W 2 {PUB6}"),
    );
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains(&format!("From {GW_LAN6}")) && out.contains("Packet too big: mtu=1400"),
        "no packet too big with mtu 1400:\n{}\n{}",
        text(&o),
        d.context()
    );
    let o = sh(&t.private, &format!("ip -6 route get {PUB6}"));
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("mtu 1400"),
        "path MTU not learnt:\n{}",
        text(&o)
    );
    // A 3000-byte ping: the host fragments it to the path MTU it learnt
    // and the public host answers in fragments too; the later fragments
    // follow their first fragment through the gateway.
    must_via(
        &t.private,
        &format!("ping -6 -n -c 2 -i 0.3 -s 3000 -W 2 {PUB6}"),
        &d,
    );
    assert!(d.drops("ttl-expired") >= 1);
    assert!(d.drops("too-big") >= 1);
    assert!(d.counter("icmp_errors") >= 2);

    // Every next hop was learnt over NDP.
    let st = d.ctl("status");
    let n6 = st["worker_status"][0]["neighbors6"].to_string();
    assert!(n6.contains("\"fe80::2%2\""), "router not learnt: {st}");
    assert!(
        n6.contains(&format!("\"{PRIV6}%1\"")),
        "host not learnt: {st}"
    );

    // Bulk TCP over IPv6: iperf3 for 2 s.
    let _srv = iperf3_server(&t, PUB6);
    let o = sh(
        &t.private,
        &format!("timeout 20 iperf3 -6 -c {PUB6} -p 5201 -t 2 -J"),
    );
    let j: serde_json::Value = serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("iperf3 -J output is not JSON ({e}):\n{}", text(&o)));
    let bps = j["end"]["sum_received"]["bits_per_second"]
        .as_f64()
        .unwrap_or(0.0);
    eprintln!(
        "{backend}: iperf3 -6 TCP through sluice: {:.1} Mbit/s",
        bps / 1e6
    );
    assert!(
        bps > 1e6,
        "iperf3 over IPv6: {bps} bit/s\n{}\n{}",
        text(&o),
        d.context()
    );
    if offload {
        // The XDP program forwarded the bulk of the transfer: both
        // directions were offloaded (and taken back at its FIN), and the
        // gateway's AF_XDP sockets received a small part of its packets.
        let st = d.ctl("status");
        let w = &st["worker_status"][0];
        let installed = w["offload"]["installed"].as_u64().expect("offload status");
        let removed = w["offload"]["removed"].as_u64().expect("offload status");
        assert!(
            installed >= 2 && removed >= 2,
            "offloaded and taken back: {st}"
        );
        let rx: u64 = w["ports"]
            .as_array()
            .expect("ports")
            .iter()
            .map(|p| p["rx_frames"].as_u64().expect("rx_frames"))
            .sum();
        let bytes = j["end"]["sum_received"]["bytes"].as_f64().unwrap_or(0.0);
        // At least this many full-size segments crossed the gateway.
        let segments = (bytes / 1400.0) as u64;
        eprintln!(
            "{backend}: {installed} directions offloaded, at least {segments} segments \
             crossed, {rx} frames into the AF_XDP sockets"
        );
        assert!(
            segments > 1000 && rx * 10 < segments,
            "{rx} frames reached the engine for {segments} segments: not offloaded\n{}",
            d.context()
        );
    }
}

/// `notrack` for IPv6 echo at `priority raw` (neighbour discovery keeps
/// going through the chains untouched): after a reload to that rule set,
/// pings cross the gateway as untracked packets, accepted by `ct state
/// untracked`, and no IPv6 connection is created for them.
fn ipv6_notrack(backend: &str, tag: &str) {
    let (t, d, _) = setup(tag, backend, 1);
    let rules = format!(
        "table ip6 raw {{\n  chain prerouting {{\n    \
         type filter hook prerouting priority raw; policy accept;\n    \
         icmpv6 type {{ echo-request, echo-reply }} notrack\n  }}\n}}\n{}",
        RULESET.replace(
            "    ct state established,related accept\n",
            "    ct state established,related accept\n    \
             ct state untracked icmpv6 type { echo-request, echo-reply } counter accept\n",
        )
    );
    std::fs::write(t.dir.join("gw6.nft"), rules).expect("new ruleset");
    d.signal("-HUP");
    wait_for("reload", Duration::from_secs(5), || {
        d.ctl("status")["generation"] == 2
    });
    must_via(
        &t.private,
        &format!("ping -6 -n -c 3 -i 0.2 -W 2 {PUB6}"),
        &d,
    );
    let l = d.ctl("conntrack list");
    let conns = l["connections"].as_array().cloned().unwrap_or_default();
    assert!(
        !conns.iter().any(|c| c["proto"] == 58),
        "{backend}: no connection for untracked echo: {l}"
    );
    assert!(d.counter("untracked") >= 6, "{}", d.context());
}

/// A reload that adds 2001:db8:2::5/64 to wan0: the public host pings it
/// at once (the gateway answers its neighbor solicitation and the echo,
/// and announced the address), while pings through the gateway go on; a
/// reload that takes it away ends the answers.
fn ipv6_address_reload(backend: &str, tag: &str) {
    const NEW6: &str = "2001:db8:2::5";
    let (t, d, _) = setup(tag, backend, 1);
    let cfg = t.dir.join("sluice.toml");
    let plain = read(&cfg);
    let more = plain.replace(
        &format!("\"{GW_WAN6}/64\"]"),
        &format!("\"{GW_WAN6}/64\", \"{NEW6}/64\"]"),
    );
    assert_ne!(more, plain);
    let ping = |ip: &str| {
        sh(&t.public, &format!("ping -6 -n -c 1 -W 2 {ip}"))
            .status
            .success()
    };
    assert!(!ping(NEW6), "not the gateway's yet");
    std::fs::write(&cfg, &more).expect("rewrite config");
    let r = d.ctl("reload");
    assert!(applied(&r, "interfaces (addresses)"), "{r}");
    assert!(ping(NEW6), "{NEW6} answered\n{}", d.context());
    must_via(&t.private, &format!("ping -6 -n -c 2 -W 2 {PUB6}"), &d);
    std::fs::write(&cfg, &plain).expect("rewrite config");
    let r = d.ctl("reload");
    assert_eq!(r["ok"], true, "{r}");
    assert!(!ping(NEW6), "{NEW6} still answered");
    assert!(ping(GW_WAN6), "{GW_WAN6} answered\n{}", d.context());
}

#[test]
#[ignore = "needs root + netns; run by .ci/run with --ignored"]
fn ipv6_address_added_and_removed_by_a_reload_af_packet() {
    ipv6_address_reload("af_packet", "v6ra");
}

#[test]
#[ignore = "needs root + netns; run by .ci/run with --ignored"]
fn ipv6_address_added_and_removed_by_a_reload_af_xdp() {
    ipv6_address_reload("af_xdp", "v6rx");
}

#[test]
#[ignore = "needs root + netns; run by .ci/run with --ignored"]
fn ipv6_notrack_pings_cross_untracked_af_packet() {
    ipv6_notrack("af_packet", "v6na");
}

#[test]
#[ignore = "needs root + netns; run by .ci/run with --ignored"]
fn ipv6_notrack_pings_cross_untracked_af_xdp() {
    ipv6_notrack("af_xdp", "v6nx");
}

#[test]
#[ignore = "needs root + netns; run by .ci/run with --ignored"]
fn ipv6_ping_http_drop_rule_and_icmpv6_errors_af_packet() {
    ipv6_end_to_end("af_packet", "v6a");
}

#[test]
#[ignore = "needs root + netns; run by .ci/run with --ignored"]
fn ipv6_ping_http_drop_rule_and_icmpv6_errors_af_xdp() {
    ipv6_end_to_end("af_xdp", "v6x");
}

/// The same with `xdp_offload`: established IPv6 TCP connections are
/// forwarded by the XDP program, and everything the engine must see (NDP,
/// echo, errors, the hop limit and MTU checks, fragments) still reaches it.
#[test]
#[ignore = "needs root + netns; run by .ci/run with --ignored"]
fn ipv6_ping_http_drop_rule_and_icmpv6_errors_af_xdp_offload() {
    ipv6_end_to_end("af_xdp_offload", "v6o");
}

/// With two workers on AF_PACKET, IPv6 is spread over both workers by its
/// addresses, and every flow still meets its connection.
#[test]
#[ignore = "needs root + netns; run by .ci/run with --ignored"]
fn ipv6_with_two_workers_is_spread_over_both() {
    ipv6_on_both_workers("v6w", "af_packet");
}

/// The same on AF_XDP, steered by the XDP program.
#[test]
#[ignore = "needs root + netns; run by .ci/run with --ignored"]
fn ipv6_with_two_workers_on_af_xdp_is_spread_over_both() {
    ipv6_on_both_workers("v6y", "af_xdp");
}

/// The same with `xdp_offload`: the offload prefix in front of the
/// steering program, one IPv6 table for both workers.
#[test]
#[ignore = "needs root + netns; run by .ci/run with --ignored"]
fn ipv6_with_two_workers_on_af_xdp_offload_is_spread_over_both() {
    ipv6_on_both_workers("v6z", "af_xdp_offload");
}

/// A prefix behind the public host, which answers packets to it with an
/// ICMPv6 destination unreachable (no route) from its own address.
const UNREACHABLE6: &str = "2001:db8:77::";

/// The worker the steering programs pick for an IPv6 packet from `src` to
/// `dst` (on either interface: the IPv6 key does not depend on the role).
fn worker6(src: &str, dst: &str) -> u16 {
    let a = |s: &str| s.parse::<std::net::Ipv6Addr>().expect("address").octets();
    let mut h = vec![0x60, 0, 0, 0, 0, 20, 6, 64];
    h.extend_from_slice(&a(src));
    h.extend_from_slice(&a(dst));
    h.extend_from_slice(&[0; 20]);
    let inside = sluice_daemon::steer_for(Some(sluice_daemon::config::Role::Inside), 2);
    let outside = sluice_daemon::steer_for(Some(sluice_daemon::config::Role::Outside), 2);
    let w = sluice_io::steer::worker_for(inside, &h);
    assert_eq!(w, sluice_io::steer::worker_for(outside, &h));
    w
}

/// Private addresses `fd00:1::N` whose flows to `PUB6` the steering puts on
/// worker 0 and on worker 1, and a destination in `UNREACHABLE6` to which
/// an echo from the first is on a worker other than the one the public
/// host's error (from `PUB6_LINK`) would reach if it were steered by its
/// own addresses rather than the quoted ones. (Xor keys: whether the two differ depends on the destination and
/// the router's address, not on the source.)
fn pick_addresses() -> (String, String, String) {
    let cands: Vec<String> = (0x10..0x80).map(|n| format!("fd00:1::{n:x}")).collect();
    let on = |w: u16| {
        cands
            .iter()
            .find(|c| worker6(c, PUB6) == w)
            .cloned()
            .expect("a source for each worker")
    };
    let src0 = on(0);
    let dst = (1..0x80)
        .map(|n| format!("{UNREACHABLE6}{n:x}"))
        .find(|d| {
            let w = worker6(&src0, d);
            worker6(PUB6_LINK, &src0) != w
        })
        .expect("a destination whose error is steered only by the quoted packet");
    (src0, on(1), dst)
}

/// Proves that IPv6 runs on both workers with a stateful rule set (new
/// connections from the WAN are dropped, so a flow whose directions met on
/// different workers would fail): ping -6, HTTP and iperf3 over IPv6 from
/// a source steered to each worker; worker 1 resolves the public next hop
/// itself (its NS, worker 0 learning the NA and telling it, the held echo
/// released); an ICMPv6 error from a router about a flow reaches the
/// flow's worker and is forwarded as related; each connection is listed on
/// the worker the steering rule names, and both workers carry IPv6
/// connections.
fn ipv6_on_both_workers(tag: &str, backend: &str) {
    let (t, d, _) = setup(tag, backend, 2);
    let (src0, src1, unreachable) = pick_addresses();
    for a in [&src0, &src1] {
        must(&t.private, &format!("ip -6 addr add {a}/64 dev br0 nodad"));
    }
    // The first IPv6 packet through the gateway is steered to worker 1,
    // which holds it while it solicits the public host's link-local next
    // hop; the advertisement goes to worker 0 (NDP), which shares it.
    must_via(
        &t.private,
        &format!("ping -6 -n -c 1 -W 5 -I {src1} {PUB6}"),
        &d,
    );
    let st = d.ctl("status");
    let n6 = |w: usize| st["worker_status"][w]["neighbors6"].to_string();
    assert!(
        n6(1).contains("\"fe80::2%2\"") && n6(0).contains("\"fe80::2%2\""),
        "next hop known to both workers: {st}"
    );

    let _h = http_server(&t, &t.public, PUB6, 8080, "spread6");
    let _srv = iperf3_server(&t, PUB6);
    for (w, src) in [(0, &src0), (1, &src1)] {
        let o = sh(
            &t.private,
            &format!("ping -6 -n -c 3 -i 0.2 -W 2 -I {src} {PUB6}"),
        );
        assert!(
            o.status.success(),
            "ping -6 from {src} (worker {w}):\n{}\n{}",
            text(&o),
            d.context()
        );
        for _ in 0..3 {
            let o = sh(
                &t.private,
                &format!(
                    "curl -6 -sS --max-time 10 --interface {src} -o /dev/null \
                     -w '%{{size_download}}' http://[{PUB6}]:8080/blob"
                ),
            );
            assert!(
                o.status.success() && o.stdout == (256 << 10).to_string().as_bytes(),
                "HTTP over IPv6 from {src} (worker {w}): {}\n{}",
                text(&o),
                d.context()
            );
        }
        let o = sh(
            &t.private,
            &format!("timeout 20 iperf3 -6 -c {PUB6} -B {src} -p 5201 -t 2 -J"),
        );
        let j: serde_json::Value = serde_json::from_slice(&o.stdout)
            .unwrap_or_else(|e| panic!("iperf3 -J output is not JSON ({e}):\n{}", text(&o)));
        let bps = j["end"]["sum_received"]["bits_per_second"]
            .as_f64()
            .unwrap_or(0.0);
        eprintln!(
            "{backend}: iperf3 -6 TCP from {src} (worker {w}): {:.1} Mbit/s",
            bps / 1e6
        );
        assert!(
            bps > 1e6,
            "iperf3 over IPv6 from {src} (worker {w}): {bps} bit/s\n{}\n{}",
            text(&o),
            d.context()
        );
    }
    if backend.ends_with("_offload") {
        // Both workers handed their established connections to the one
        // IPv6 table.
        let st = d.ctl("status");
        for w in 0..2 {
            let installed = st["worker_status"][w]["offload"]["installed"]
                .as_u64()
                .expect("offload status");
            assert!(installed >= 2, "worker {w} offloaded nothing: {st}");
        }
    }

    // An ICMPv6 error from a router (the public host, forwarding, with no
    // route to UNREACHABLE6, answering from PUB6_LINK: the preferred
    // source of its route back) is steered by the packet it quotes: it
    // meets the echo's connection and is forwarded as related. Steered by
    // its own addresses it would reach the other worker, which holds no
    // connection, and the policy would drop it.
    let wan_ll = sluice_wire::ndp::link_local(gw_mac(&t, "wan0"));
    must(
        &t.public,
        &format!(
            "sysctl -qw net.ipv6.conf.all.forwarding=1 && \
             ip -6 route add unreachable {UNREACHABLE6}/64 && \
             ip -6 route change fd00:1::/64 via {wan_ll} dev eth0 src {PUB6_LINK}"
        ),
    );
    let o = sh(
        &t.private,
        &format!("ping -6 -n -c 1 -W 2 -I {src0} {unreachable}"),
    );
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains(&format!("From {PUB6_LINK}")) && out.contains("Destination unreachable"),
        "no destination unreachable for {src0} -> {unreachable}:\n{}\n{}",
        text(&o),
        d.context()
    );

    // Every connection lives on the worker the steering rule names, and
    // both directions of it were seen there (assured).
    let st = d.ctl("status");
    let ws = st["worker_status"].as_array().cloned().unwrap_or_default();
    assert_eq!(ws.len(), 2, "{st}");
    let conns6: Vec<u64> = ws
        .iter()
        .map(|w| w["connections6"].as_u64().unwrap_or(0))
        .collect();
    assert!(
        conns6.iter().all(|&n| n >= 5),
        "IPv6 connections on each worker: {conns6:?}\n{st}"
    );
    for src in [&src0, &src1] {
        let ct = d.ctl(&format!("conntrack list addr {src}"));
        let entries = ct["connections"].as_array().cloned().unwrap_or_default();
        let mine: Vec<_> = entries
            .iter()
            .filter(|e| e["orig"]["src"] == src.as_str())
            .collect();
        assert!(!mine.is_empty(), "no connection from {src}: {ct}");
        for e in mine {
            let dst = e["orig"]["dst"].as_str().unwrap_or_default();
            assert_eq!(
                e["worker"].as_u64(),
                Some(u64::from(worker6(src, dst))),
                "connection on the steered worker: {e}"
            );
            if e["proto"] == 6 {
                assert_eq!(e["assured"], true, "both directions on one worker: {e}");
            }
        }
    }
    assert_eq!(d.drops("policy-drop"), 0, "{}", d.context());
}
