//! NAT with several workers: `workers = 2` on AF_PACKET, where each
//! interface's fanout group is steered by a classic-BPF program (outside by
//! destination port, inside by source port; see `sluice_io::steer`), and on
//! AF_XDP, where each worker binds a socket to the same queue and the XDP
//! program steers by the same rule; so every NAT reply reaches the worker
//! that owns its external port.
//!
//! Proves: 20 parallel HTTP downloads and 4 parallel pings from two private
//! hosts through SNAT all complete; both workers carry connections and a
//! fair share of the TCP frames (Linux's even `connect()` ports included);
//! no reply is dropped for lack of a mapping (`nat-no-mapping` stays 0).
//! What steering alone cannot place is handed between workers (the engine's
//! handoff): a port forward whose public port (8082, worker 1) and private
//! port (81, worker 0) have different owners serves every download, and a
//! private host hairpinned to another's mapping from a source port of the
//! other worker gets its answer.
//!
//! Running pings on both workers keep their mappings across a reload
//! that moves the SNAT rule to another address (retired mappings), and
//! new ones leave from the new address. With `state_file`, a transfer of
//! parallel streams spread over both workers goes on across a restart,
//! each worker taking back its own connections and mappings; across a
//! restart from two workers to one every stream is kept, and from one to
//! two exactly those whose internal and external ports the new steering
//! puts on one worker.
//!
//! Needs root, `ip`, `nft`, `ethtool`, `ping`, `curl` and `python3`.

mod common;

use std::time::{Duration, Instant};

use common::*;

const RULESET: &str = r#"table ip filter {
  chain forward {
    type filter hook forward priority 0; policy drop;
    ct state established,related accept
    iifname "lan0" oifname "wan0" accept
    iifname "wan0" oifname "lan0" ip daddr 10.0.0.3 tcp dport 81 accept
    iifname "lan0" oifname "lan0" accept
  }
}
table ip nat {
  chain prerouting {
    type nat hook prerouting priority -100; policy accept;
    iifname "wan0" tcp dport 8082 dnat to 10.0.0.3:81
  }
  chain postrouting {
    type nat hook postrouting priority 100; policy accept;
    oifname "wan0" snat to 198.51.100.7
  }
}
"#;

#[test]
#[ignore = "needs root + netns; run by .ci/run with --ignored"]
fn nat_with_two_workers_steers_every_reply_to_its_owner() {
    two_workers("af_packet", "w2", "fanout cbpf group");
}

#[test]
#[ignore = "needs root + netns; run by .ci/run with --ignored"]
fn nat_with_two_workers_on_af_xdp_steers_every_reply_to_its_owner() {
    two_workers("af_xdp", "x2", "steered");
}

/// The topology and its sluice.toml (the rule set above) for two workers.
fn two_worker_config(backend: &str, tag: &str) -> (Topo, std::path::PathBuf) {
    require_root();
    let t = Topo::new(tag);
    t.write_ruleset("gw.nft", RULESET);
    let cfg = t.write_config(backend, "gw.nft", "");
    let toml = read(&cfg).replace("workers = 1", "workers = 2");
    std::fs::write(&cfg, toml).expect("rewrite config");
    (t, cfg)
}

fn two_workers(backend: &str, tag: &str, steered: &str) {
    let (t, cfg) = two_worker_config(backend, tag);
    let d = Daemon::start(&t, &cfg, backend);
    let log = d.log();
    let opened = log.lines().filter(|l| l.contains("port open")).count();
    assert_eq!(opened, 4, "two ports per worker:\n{log}");
    assert_eq!(
        log.lines()
            .filter(|l| l.contains("port open") && l.contains(steered))
            .count(),
        4,
        "every port of the {backend} backend is steered:\n{log}"
    );
    assert!(!log.contains("falling back"), "{log}");

    // A 256 KiB blob on the public host.
    let _srv = http_server(&t, &t.public, PUBLIC, 8000, "public");
    // The gateway resolves the hosts on first use; one warm-up each way.
    wait_for(
        "first ping through the gateway",
        Duration::from_secs(10),
        || {
            sh(&t.private, &format!("ping -c 1 -W 1 {PUBLIC}"))
                .status
                .success()
        },
    );

    let t0 = Instant::now();
    let curls = |n: usize| {
        format!(
            "for i in $(seq {n}); do curl -sS --max-time 15 -o /dev/null -w '%{{size_download}}\\n' \
             http://{PUBLIC}:8000/blob & done; wait"
        )
    };
    let pings = format!(
        "for i in 1 2 3 4; do (ping -q -c 3 -i 0.2 -W 2 {PUBLIC} >/dev/null && echo ok) & done; wait"
    );
    let (a, b, p) = std::thread::scope(|s| {
        let a = s.spawn(|| text(&sh(&t.private, &curls(12))));
        let b = s.spawn(|| text(&sh(&t.private2, &curls(8))));
        let p = s.spawn(|| text(&sh(&t.private, &pings)));
        (
            a.join().expect("curl a"),
            b.join().expect("curl b"),
            p.join().expect("ping"),
        )
    });
    let sizes: Vec<&str> = a
        .lines()
        .chain(b.lines())
        .filter(|l| !l.is_empty())
        .collect();
    let full = sizes.iter().filter(|s| **s == "262144").count();
    assert_eq!(
        full,
        20,
        "every download completes ({:?}): {sizes:?}\n{a}\n{b}\n{}",
        t0.elapsed(),
        d.context()
    );
    assert_eq!(
        p.lines().filter(|l| *l == "ok").count(),
        4,
        "every ping is answered: {p}\n{}",
        d.context()
    );

    let st = d.ctl("status");
    let ws = st["worker_status"]
        .as_array()
        .unwrap_or_else(|| panic!("worker_status in {st}"));
    assert_eq!(ws.len(), 2, "{st}");
    for w in ws {
        assert!(
            w["connections"].as_u64().unwrap_or(0) > 0,
            "worker {} carries connections: {st}",
            w["worker"]
        );
    }
    // TCP itself is spread, not only the pings: Linux gives `connect()`
    // even source ports, which a plain `port % 2` would steer all to
    // worker 0 (regression). Each worker reads a share of lan0: 20
    // downloads split between two workers by their source ports put 4 or
    // fewer on one worker about once in a hundred runs (one CI run saw
    // 15 %), 2 or fewer once in several thousand; the regression put 0
    // there.
    let lan_rx: Vec<u64> = ws
        .iter()
        .map(|w| w["ports"][0]["rx_frames"].as_u64().unwrap_or(0))
        .collect();
    let total: u64 = lan_rx.iter().sum();
    assert!(
        lan_rx.iter().all(|&n| n * 10 >= total),
        "each worker reads at least 10 % of lan0's frames: {lan_rx:?}"
    );
    assert_eq!(d.drops("nat-no-mapping"), 0, "{}", d.context());

    // 4000-byte pings without DF, fragmented by the hosts both ways: every
    // fragment is steered by its addresses, the first handed to the worker
    // its identifier names, the later ones after it. Ten identifiers, so
    // both workers own some.
    let o = sh(
        &t.private,
        &format!(
            "for i in $(seq 10); do (ping -n -c 2 -i 0.2 -M dont -s 4000 -W 2 {PUBLIC} >/dev/null && echo ok) & done; wait"
        ),
    );
    assert_eq!(
        text(&o).lines().filter(|l| *l == "ok").count(),
        10,
        "fragmented pings through two workers:\n{}\n{}",
        text(&o),
        d.context()
    );

    // The port forward: steered to worker 1 by its public port, handed to
    // worker 0, where the server's replies (source port 81) arrive.
    assert_eq!(sluice_nat::owner_of(8082, 2), 1);
    assert_eq!(sluice_nat::owner_of(81, 2), 0);
    let _fwd = http_server(&t, &t.private2, PRIV2, 81, "forwarded");
    let out = sh(
        &t.public,
        "for i in $(seq 6); do curl -sS --max-time 15 -o /dev/null -w '%{size_download}\n'          http://203.0.113.1:8082/blob & done; wait",
    );
    let got = text(&out);
    assert_eq!(
        got.lines().filter(|l| *l == "262144").count(),
        6,
        "every download through the port forward completes: {got}\n{}",
        d.context()
    );
    let c = d.ctl("counters");
    let handed: Vec<u64> = c["workers"]
        .as_array()
        .map(|ws| {
            ws.iter()
                .map(|w| w["handed_off"].as_u64().unwrap_or(0))
                .collect()
        })
        .unwrap_or_default();
    assert!(
        handed.get(1).copied().unwrap_or(0) >= 6,
        "worker 1 handed the forward's packets to worker 0: {handed:?}\n{c}"
    );

    // Hairpinning across workers: A's mapping (source port 5555, worker 1)
    // reached by B from port 6664 (worker 0): worker 0 hands B's datagram
    // to worker 1, which owns A's external port.
    assert_eq!(sluice_nat::owner_of(5555, 2), 1);
    assert_eq!(sluice_nat::owner_of(6664, 2), 0);
    let ext_port = udp_hairpin(&t, &d, 5555, 6664);
    assert_eq!(
        sluice_nat::owner_of(ext_port as u16, 2),
        1,
        "A's port slice"
    );
}

#[test]
#[ignore = "needs root + netns; run by .ci/run with --ignored"]
fn an_interface_that_comes_back_is_served_by_both_workers_again_af_packet() {
    comes_back("af_packet", "wb");
}

#[test]
#[ignore = "needs root + netns; run by .ci/run with --ignored"]
fn an_interface_that_comes_back_is_served_by_both_workers_again_af_xdp() {
    comes_back("af_xdp", "xb");
}

/// wan0 deleted and made again under a gateway with two workers: every
/// worker's ports are opened again (on AF_XDP both share a new UMEM and
/// bind the same queue again), and traffic from both private hosts, whose
/// replies are steered to either worker, goes through.
fn comes_back(backend: &str, tag: &str) {
    let (t, cfg) = two_worker_config(backend, tag);
    let d = Daemon::start(&t, &cfg, backend);
    let o = sh(&t.gw, "ip link del wan0");
    assert!(o.status.success(), "{}", text(&o));
    wait_for("wan0 reported gone", Duration::from_secs(5), || {
        d.link(1) == "gone"
    });
    t.recreate_wan();
    wait_for("wan0 back up", Duration::from_secs(10), || {
        d.link(1) == "up"
    });
    let log = d.log();
    // Two ports per worker at start; then wan0's again (AF_PACKET) or
    // both again (AF_XDP: new UMEMs).
    let again = if backend == "af_packet" { 2 } else { 4 };
    assert_eq!(
        log.lines().filter(|l| l.contains("port open")).count(),
        4 + again,
        "{log}"
    );
    assert!(log.contains("interface back: ports opened again"), "{log}");
    wait_for_ping(&t.private2, "203.0.113.2", "a ping through the new wan0");
    // Pings from both hosts, with several identifiers (so their replies
    // are steered to both workers), all answered.
    let pings: Vec<_> = (0..4)
        .map(|i| {
            let ns = if i % 2 == 0 { &t.private } else { &t.private2 };
            std::process::Command::new("ip")
                .args([
                    "netns",
                    "exec",
                    ns.name(),
                    "ping",
                    "-n",
                    "-c",
                    "3",
                    "-i",
                    "0.2",
                ])
                .args(["-W", "2", "203.0.113.2"])
                .output()
        })
        .collect();
    for p in pings {
        let o = p.expect("run ping");
        assert!(o.status.success(), "{}\n{}", text(&o), d.context());
    }
}

#[test]
#[ignore = "needs root + netns; run by .ci/run with --ignored"]
fn running_pings_on_both_workers_follow_a_route_reload_af_packet() {
    route_reload_two("af_packet", "wr");
}

#[test]
#[ignore = "needs root + netns; run by .ci/run with --ignored"]
fn running_pings_on_both_workers_follow_a_route_reload_af_xdp() {
    route_reload_two("af_xdp", "xr");
}

/// With two workers, a reload that moves 192.0.2.0/24 from one router to
/// another (the public host under a second address) moves the running
/// pings of both workers: every worker took the new routes and walked its
/// own connections.
fn route_reload_two(backend: &str, tag: &str) {
    let (t, cfg) = two_worker_config(backend, tag);
    let plain = read(&cfg);
    let via = |gw: &str| format!("{plain}\n[[routes]]\nto = \"192.0.2.0/24\"\nvia = \"{gw}\"\n");
    std::fs::write(&cfg, via("203.0.113.2")).expect("rewrite config");
    let d = Daemon::start(&t, &cfg, backend);
    let o = sh(
        &t.public,
        "ip addr add 192.0.2.1/32 dev lo && ip link set lo up && ip addr add 203.0.113.3/24 dev eth0",
    );
    assert!(o.status.success(), "{}", text(&o));
    for ns in [&t.private, &t.private2] {
        wait_for_ping(ns, "192.0.2.1", "a first ping");
    }
    // Four pings from each host (eight identifiers, steered to both
    // workers), 30 requests each over 3 s; the reload after 1 s.
    let pings =
        "for i in 1 2 3 4; do (ping -q -c 30 -i 0.1 -W 1 192.0.2.1 | grep received) & done; wait";
    let (a, b) = std::thread::scope(|s| {
        let a = s.spawn(|| text(&sh(&t.private, pings)));
        let b = s.spawn(|| text(&sh(&t.private2, pings)));
        std::thread::sleep(Duration::from_millis(1000));
        std::fs::write(&cfg, via("203.0.113.3")).expect("rewrite config");
        let r = d.ctl("reload");
        assert_eq!(r["ok"], true, "{r}");
        assert!(applied(&r, "routes"), "{r}");
        (a.join().expect("pings a"), b.join().expect("pings b"))
    });
    let received = ping_received(&format!("{a}\n{b}"));
    assert_eq!(received.len(), 8, "{a}\n{b}");
    assert!(
        received.iter().all(|&n| n >= 24),
        "{received:?}\n{}",
        d.context()
    );
    let st = d.ctl("status");
    let ws = st["worker_status"].as_array().cloned().unwrap_or_default();
    assert_eq!(ws.len(), 2, "{st}");
    for (i, w) in ws.iter().enumerate() {
        assert!(
            w["connections"].as_u64().unwrap_or(0) > 0,
            "both workers carry pings: {st}"
        );
        assert!(
            d.knows_neighbor(i, "203.0.113.3"),
            "worker {i} knows the new router: {st}"
        );
    }
}

#[test]
#[ignore = "needs root + netns; run by .ci/run with --ignored"]
fn running_pings_on_both_workers_keep_their_mappings_across_a_pool_change_af_packet() {
    pool_reload_two("af_packet", "wp");
}

#[test]
#[ignore = "needs root + netns; run by .ci/run with --ignored"]
fn running_pings_on_both_workers_keep_their_mappings_across_a_pool_change_af_xdp() {
    pool_reload_two("af_xdp", "xp");
}

/// With two workers, a reload that moves the SNAT rule to another address
/// while pings of both workers run: every worker takes the new pool and
/// retires its mappings on the old address, whose echo replies still reach
/// the worker holding each (steered by identifier), so no ping loses more
/// than a reply or two; a new ping leaves from the new address.
fn pool_reload_two(backend: &str, tag: &str) {
    const NEW: &str = "198.51.100.8";
    let (t, cfg) = two_worker_config(backend, tag);
    let d = Daemon::start(&t, &cfg, backend);
    for ns in [&t.private, &t.private2] {
        wait_for_ping(ns, PUBLIC, "a first ping");
    }
    let pings = format!(
        "for i in 1 2 3 4; do (ping -q -c 30 -i 0.1 -W 1 {PUBLIC} | grep received) & done; wait"
    );
    let (a, b, during) = std::thread::scope(|s| {
        let a = s.spawn(|| text(&sh(&t.private, &pings)));
        let b = s.spawn(|| text(&sh(&t.private2, &pings)));
        std::thread::sleep(Duration::from_millis(1000));
        t.write_ruleset(
            "gw.nft",
            &RULESET.replace("snat to 198.51.100.7", &format!("snat to {NEW}")),
        );
        let r = d.ctl("reload");
        assert_eq!(r["ok"], true, "{r}");
        wait_for(
            "both workers retire their pings' mappings",
            Duration::from_secs(5),
            || d.ctl("status")["nat"]["retired"].as_u64() >= Some(8),
        );
        let during = d.ctl("status");
        (
            a.join().expect("pings a"),
            b.join().expect("pings b"),
            during,
        )
    });
    let received = ping_received(&format!("{a}\n{b}"));
    assert_eq!(received.len(), 8, "{a}\n{b}");
    assert!(
        received.iter().all(|&n| n >= 27),
        "{received:?}\n{}",
        d.context()
    );
    let ws = during["worker_status"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(ws.len(), 2, "{during}");
    for w in &ws {
        assert!(
            w["nat_retired"].as_u64().unwrap_or(0) > 0,
            "both workers hold retired mappings: {during}"
        );
    }
    assert_eq!(during["nat"]["pools"][0]["addr"], NEW, "{during}");
    // A new ping leaves from the new address.
    let o = sh(&t.private, &format!("ping -c 1 -W 2 -p 5eed {PUBLIC}"));
    assert!(o.status.success(), "{}", text(&o));
    let l = d.ctl("conntrack list proto icmp");
    let conns = l["connections"].as_array().cloned().unwrap_or_default();
    assert!(
        conns.iter().any(|c| c["reply"]["dst"] == NEW),
        "no connection from {NEW}: {l}"
    );
}

#[test]
#[ignore = "needs root + netns; run by .ci/run with --ignored"]
fn a_restart_keeps_both_workers_connections_af_packet() {
    restart_across("af_packet", "s2", 2, 2);
}

#[test]
#[ignore = "needs root + netns; run by .ci/run with --ignored"]
fn a_restart_keeps_both_workers_connections_af_xdp() {
    restart_across("af_xdp", "t2", 2, 2);
}

#[test]
#[ignore = "needs root + netns; run by .ci/run with --ignored"]
fn a_restart_from_two_workers_to_one_keeps_every_connection_af_packet() {
    restart_across("af_packet", "r21", 2, 1);
}

#[test]
#[ignore = "needs root + netns; run by .ci/run with --ignored"]
fn a_restart_from_one_worker_to_two_keeps_what_steering_allows_af_xdp() {
    restart_across("af_xdp", "r12", 1, 2);
}

/// `state_file` from a gateway of `from` workers to one of `to`: an
/// iperf3 transfer of 6 parallel TCP streams through SNAT (source ports,
/// so the streams spread over the workers by the steering), through a
/// rule set that lets only a SYN start a connection, is saved and taken
/// back. With as many workers, each worker takes back its own connections
/// with their mappings (two workers: both hold streams). With another
/// number, each connection goes to the worker the new steering sends it
/// to: a stream whose internal and external ports the new steering puts
/// on different workers cannot be served (its two directions meet no
/// worker) and is not restored; every other one is, on the worker owning
/// its external port, with its very mapping. The kept streams carry on and
/// no new connection is made; with nothing split (always with as many
/// workers, or going to one) the whole transfer completes.
fn restart_across(backend: &str, tag: &str, from: u16, to: u16) {
    let (t, cfg) = two_worker_config(backend, tag);
    let ruleset = RULESET.replace(
        "iifname \"lan0\" oifname \"wan0\" accept",
        "iifname \"lan0\" oifname \"wan0\" tcp flags & (syn | ack) == syn accept\n    iifname \"lan0\" oifname \"wan0\" icmp type echo-request accept",
    );
    t.write_ruleset("gw.nft", &ruleset);
    let state = t.dir.join("conns.state");
    let base = read(&cfg);
    let with_workers = |n: u16| {
        let toml = format!("state_file = \"{}\"\n{base}", state.display())
            .replace("workers = 2", &format!("workers = {n}"));
        std::fs::write(&cfg, toml).expect("config with state_file");
    };
    with_workers(from);
    let mut d = Daemon::start(&t, &cfg, backend);
    wait_for_ping(&t.private, PUBLIC, "a first ping");
    let _srv = iperf3_server(&t, PUBLIC);
    std::thread::scope(|s| {
        let c = s.spawn(|| {
            sh(
                &t.private,
                &format!(
                    "timeout {} iperf3 -c {PUBLIC} -p 5201 -t 8 -i 1 -P 6 -J",
                    // A split stream stalls the client until the timeout.
                    if from == to { 40 } else { 25 }
                ),
            )
        });
        wait_for("the streams", Duration::from_secs(5), || {
            d.ctl("conntrack list proto tcp port 5201")["count"]
                .as_u64()
                .unwrap_or(0)
                >= 7
        });
        std::thread::sleep(Duration::from_millis(1500));
        let before = tcp_mappings(&d.ctl("nat lookup 10.0.0.2"));
        d.stop();
        with_workers(to);
        let d2 = Daemon::start(&t, &cfg, backend);
        check_restart(&d2, &before, (from, to), || {
            c.join().expect("iperf3 thread")
        });
    });
}

/// The TCP mappings of a `nat lookup` answer: (internal port, external
/// port, worker), sorted.
fn tcp_mappings(v: &serde_json::Value) -> Vec<(u64, u64, u64)> {
    let mut m: Vec<(u64, u64, u64)> = v["mappings"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter(|m| m["proto"] == 6)
                .map(|m| {
                    let n = |k: &str| m[k].as_u64().unwrap_or(u64::MAX);
                    (n("int_port"), n("ext_port"), n("worker"))
                })
                .collect()
        })
        .unwrap_or_default();
    m.sort();
    m
}

/// The checks of [`restart_across`] on the gateway `d2` of `to` workers
/// (the saving one had `from`), given the mappings `before` the restart
/// (internal port, external port, worker) and the iperf3 client's end.
fn check_restart(
    d2: &Daemon,
    before: &[(u64, u64, u64)],
    (from, to): (u16, u16),
    client: impl FnOnce() -> std::process::Output,
) {
    use sluice_nat::owner_of;
    assert!(before.len() >= 7, "{before:?}");
    // What the new steering keeps: internal and external port on one
    // worker, which holds it.
    let kept: Vec<(u64, u64, u64)> = before
        .iter()
        .filter(|(i, e, _)| owner_of(*i as u16, to) == owner_of(*e as u16, to))
        .map(|&(i, e, _)| (i, e, u64::from(owner_of(e as u16, to))))
        .collect();
    let after = tcp_mappings(&d2.ctl("nat lookup 10.0.0.2"));
    assert_eq!(after, kept, "before {before:?}\n{}", d2.context());
    let log = d2.log();
    let placed = log.contains("saved connections placed by this gateway's steering");
    if from == to {
        assert!(!placed, "{log}");
        assert_eq!(
            log.matches("connections restored").count(),
            usize::from(to),
            "each worker restored its own:\n{log}"
        );
        let workers: std::collections::BTreeSet<u64> = after.iter().map(|m| m.2).collect();
        assert_eq!(
            workers.len(),
            usize::from(to),
            "every worker holds streams: {after:?}"
        );
    } else {
        assert!(placed, "{log}");
    }
    let split = before.len() - kept.len();
    if split > 0 {
        // (The count there includes the pings' connections.)
        assert!(
            log.contains(&format!(
                "\"its internal and external ports are steered to different workers by {to} workers\": "
            )),
            "{split} split:\n{log}"
        );
    }
    // The kept ones carry on: their packets grow; nothing new is tracked.
    let packets = || -> u64 {
        let l = d2.ctl("conntrack list proto tcp port 5201");
        l["connections"]
            .as_array()
            .map(|a| a.iter().filter_map(|c| c["packets"].as_u64()).sum())
            .unwrap_or(0)
    };
    if !kept.is_empty() {
        let p0 = packets();
        std::thread::sleep(Duration::from_millis(1000));
        assert!(packets() > p0, "restored streams move:\n{}", d2.context());
    }
    assert_eq!(
        d2.ctl("conntrack list proto tcp port 5201")["count"].as_u64(),
        Some(kept.len() as u64),
        "{}",
        d2.context()
    );
    let o = client();
    if split == 0 {
        assert!(
            o.status.success(),
            "the transfer did not survive the restart:\n{}\n{}",
            text(&o),
            d2.context()
        );
    }
}
