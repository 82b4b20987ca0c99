//! `sluice check -c sluice.toml`, `sluice run` and `sluice ctl` from the
//! command line: exit codes and error text on good and bad input.

use std::path::PathBuf;
use std::process::{Command, Output};

fn sluice() -> Command {
    Command::new(env!("CARGO_BIN_EXE_sluice"))
}

fn example() -> PathBuf {
    PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../daemon/examples/sluice.toml"
    ))
}

#[test]
fn check_accepts_the_example_gateway_config() {
    let out = sluice()
        .args(["check", "-c"])
        .arg(example())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.starts_with("ok: 2 interfaces"), "{text}");
    // 1 M IPv4 and 64 k IPv6 connections: their indexes, about 33 bytes
    // per connection.
    assert!(
        text.trim_end()
            .ends_with("; connection tables 36 MiB at start"),
        "{text}"
    );
}

#[test]
fn check_reports_a_bad_route_with_file_line_and_caret() {
    let dir = std::env::temp_dir().join(format!("sluice-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = std::fs::read_to_string(example()).unwrap();
    let bad = src.replace("0.0.0.0/0", "0.0.0.0/33");
    assert_ne!(src, bad, "example config has no default route to break");
    let path = dir.join("bad.toml");
    std::fs::write(&path, bad).unwrap();
    let nft = example().with_extension("nft");
    std::fs::copy(&nft, dir.join(nft.file_name().unwrap())).unwrap();
    let out = sluice().args(["check", "-c"]).arg(&path).output().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("bad.toml:") && err.contains("/33 is not a prefix length"),
        "{err}"
    );
    assert!(err.contains('^'), "no caret: {err}");
}

/// Runs `sluice check -c` on copies of the example config (with its
/// ruleset beside them) in which the line `find` is replaced by each of
/// `variants`; returns the 1-based line number of `find` and the outputs.
fn check_example_with(tag: &str, find: &str, variants: &[&str]) -> (usize, Vec<Output>) {
    let dir = std::env::temp_dir().join(format!("sluice-cli-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = std::fs::read_to_string(example()).unwrap();
    let nft = example().with_extension("nft");
    std::fs::copy(&nft, dir.join(nft.file_name().unwrap())).unwrap();
    let line = src
        .lines()
        .position(|l| l == find)
        .unwrap_or_else(|| panic!("the example has no line {find:?}"))
        + 1;
    let outs = variants
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let path = dir.join(format!("{i}.toml"));
            std::fs::write(
                &path,
                src.replacen(&format!("{find}\n"), &format!("{v}\n"), 1),
            )
            .unwrap();
            sluice().args(["check", "-c"]).arg(&path).output().unwrap()
        })
        .collect();
    let _ = std::fs::remove_dir_all(&dir);
    (line, outs)
}

/// [`check_example_with`] with one variant that must pass and one that must
/// be refused (exit 1): returns the line of `find`, the accepted check's
/// stdout and the refused check's stderr.
fn check_good_and_bad(tag: &str, find: &str, good: &str, bad: &str) -> (usize, String, String) {
    let (line, outs) = check_example_with(tag, find, &[good, bad]);
    let (ok, refused) = (&outs[0], &outs[1]);
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    assert_eq!(refused.status.code(), Some(1));
    (
        line,
        String::from_utf8_lossy(&ok.stdout).into_owned(),
        String::from_utf8_lossy(&refused.stderr).into_owned(),
    )
}

/// `xdp_offload` shows in the summary with AF_XDP and is refused, with
/// its line, on AF_PACKET.
#[test]
fn check_shows_xdp_offload_and_refuses_it_without_af_xdp() {
    let (line, text, err) = check_good_and_bad(
        "off",
        "backend = \"auto\"",
        "backend = \"af_xdp\"\nxdp_offload = true",
        "backend = \"af_packet\"\nxdp_offload = true",
    );
    assert!(text.contains("(AfXdp, XDP offload)"), "{text}");
    assert!(
        err.contains(&format!("1.toml:{}:", line + 1))
            && err.contains("xdp_offload needs the AF_XDP backend"),
        "{err}"
    );
}

/// A conntrack capacity above the maximum shows in the summary, with the
/// memory it backs; one below the maximum is refused with its line.
#[test]
fn check_shows_the_conntrack_capacity_and_refuses_one_below_max() {
    let (line, text, err) = check_good_and_bad(
        "ctcap",
        "max = 1048576                        # whole gateway, split between workers",
        "max = 1048576\ncapacity = 4194304",
        "max = 1048576\ncapacity = 1000",
    );
    assert!(
        text.contains("conntrack capacity 4194304 / 65536 IPv6 (a reload may raise max up to it)")
            && text.contains("connection tables 136 MiB at start"),
        "{text}"
    );
    assert!(
        err.contains(&format!("1.toml:{}:", line + 1))
            && err.contains("conntrack.capacity: 1000 is below conntrack.max (1048576)"),
        "{err}"
    );
}

/// `af_packet_rx = "v2"` shows in the summary; an unknown ring is refused
/// with its line and the values allowed.
#[test]
fn check_shows_the_af_packet_ring_and_refuses_an_unknown_one() {
    let (line, text, err) = check_good_and_bad(
        "rx",
        "af_packet_rx = \"v3\"",
        "af_packet_rx = \"v2\"",
        "af_packet_rx = \"v4\"",
    );
    assert!(text.contains("(Auto, AF_PACKET rx TPACKET_V2)"), "{text}");
    assert!(
        err.contains(&format!(
            "1.toml:{line}:16: unknown variant `v4`, expected `v3` or `v2`"
        )),
        "{err}"
    );
}

/// `worker_priority` shows in the summary; an out-of-range one is refused
/// with its line and the allowed range.
#[test]
fn check_shows_worker_priority_and_refuses_one_out_of_range() {
    let (line, text, err) = check_good_and_bad(
        "prio",
        "# worker_priority = 10",
        "worker_priority = 10",
        "worker_priority = 150",
    );
    assert!(text.contains(", SCHED_FIFO 10)"), "{text}");
    assert!(
        err.contains(&format!(
            "1.toml:{line}:19: worker_priority: 150 is not a SCHED_FIFO priority (1-99)"
        )),
        "{err}"
    );
}

/// `heap_reserve_mib` shows in the summary; a negative one is refused with
/// its line and the allowed range.
#[test]
fn check_shows_the_heap_reserve_and_refuses_a_negative_one() {
    let (line, text, err) = check_good_and_bad(
        "heap",
        "# heap_reserve_mib = 512",
        "heap_reserve_mib = 512",
        "heap_reserve_mib = -5",
    );
    assert!(
        text.contains("), heap 512 MiB reserved, ruleset "),
        "{text}"
    );
    assert!(
        err.contains(&format!(
            "1.toml:{line}:20: heap_reserve_mib: -5 is not between 0 and 262144 (MiB)"
        )),
        "{err}"
    );
}

#[test]
fn run_with_a_missing_config_fails_with_one_clear_message() {
    let out = sluice()
        .args(["run", "-c", "/nonexistent/sluice.toml"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.matches("cannot read").count(), 1, "{err}");
}

#[test]
fn ctl_without_a_running_gateway_says_which_socket() {
    let out = sluice()
        .args(["ctl", "--socket", "/nonexistent/sluice.sock", "status"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/sluice.sock"));
}

/// The gateway takes an iptables-save file as its rule set (detected from
/// its table headers, with the sibling `.ipset` file), and reports its
/// errors with their own file, line and caret.
#[test]
fn check_accepts_an_iptables_save_rule_set_and_reports_its_errors() {
    let dir = std::env::temp_dir().join(format!("sluice-cli-ipt-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = std::fs::read_to_string(example()).unwrap();
    let cfg = src.replace("ruleset = \"sluice.nft\"", "ruleset = \"rules.v4\"");
    assert_ne!(src, cfg, "the example names no sluice.nft");
    std::fs::write(dir.join("gw.toml"), cfg).unwrap();
    std::fs::write(
        dir.join("rules.v4"),
        "# Generated by iptables-save\n*filter\n:INPUT DROP [0:0]\n:FORWARD DROP [0:0]\n\
         :OUTPUT ACCEPT [0:0]\n-A FORWARD -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT\n\
         -A FORWARD -i lan0 -o wan0 -m set --match-set allowed src -j ACCEPT\nCOMMIT\n\
         *nat\n:POSTROUTING ACCEPT [0:0]\n-A POSTROUTING -o wan0 -j MASQUERADE\nCOMMIT\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("rules.ipset"),
        "create allowed hash:net family inet\nadd allowed 10.0.0.0/24\n",
    )
    .unwrap();
    let ok = sluice()
        .args(["check", "-c"])
        .arg(dir.join("gw.toml"))
        .output()
        .unwrap();
    std::fs::write(
        dir.join("rules.v4"),
        "*filter\n:FORWARD DROP [0:0]\n-A FORWARD -p tcp --dport 99999 -j ACCEPT\nCOMMIT\n",
    )
    .unwrap();
    let bad = sluice()
        .args(["check", "-c"])
        .arg(dir.join("gw.toml"))
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    let text = String::from_utf8_lossy(&ok.stdout);
    assert!(text.contains("rules.v4 (3 rules"), "{text}");
    assert_eq!(bad.status.code(), Some(1));
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(
        err.contains("rules.v4:3:") && err.contains("99999"),
        "{err}"
    );
    assert!(err.contains('^'), "no caret: {err}");
}

/// [`check_good_and_bad`] with `good` and `bad` added to the example's
/// `[nat]` table: the refused check's stderr.
fn check_nat_lines(tag: &str, good: &str, bad: &str) -> String {
    let find = "masquerade_ports = \"1024-65535\"";
    check_good_and_bad(
        tag,
        find,
        &format!("{find}\n{good}"),
        &format!("{find}\n{bad}"),
    )
    .2
}

/// Port block allocation: a block that fits every worker's share of the
/// ruleset's pool passes; one larger than a share is refused naming the
/// pool's address.
#[test]
fn check_refuses_a_port_block_larger_than_a_workers_share() {
    let err = check_nat_lines(
        "pba",
        "port_block_size = 512\nmax_blocks_per_subscriber = 4",
        "port_block_size = 65000",
    );
    assert!(
        err.contains("nat.port_block_size = 65000 is larger than a worker's share of the port range of the NAT pool with 198.51.100.7 (64512 ports with 1 worker(s))"),
        "{err}"
    );
}

/// A gateway on in-memory ports (no interfaces touched): `sluice ctl
/// status` and `reload` print their JSON (`status` once printed only its
/// rule set's file name), `sluice ctl metrics` and `GET /metrics` on
/// `metrics_listen` the Prometheus text, with the NAT pool's ports and
/// port blocks; SIGTERM stops it cleanly.
#[test]
fn ctl_status_metrics_and_http_metrics_on_a_mem_gateway() {
    use std::io::{Read, Write};
    let dir = std::env::temp_dir().join(format!("sluice-cli-mem-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let nft = example().with_extension("nft");
    std::fs::copy(&nft, dir.join("sluice.nft")).unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .unwrap()
        .port();
    let sock = dir.join("ctl.sock");
    std::fs::write(
        dir.join("gw.toml"),
        format!(
            "ruleset = \"sluice.nft\"\nbackend = \"mem\"\ncontrol_socket = \"{}\"\n\
             metrics_listen = \"127.0.0.1:{port}\"\n\n\
             [[interfaces]]\nname = \"lan0\"\nrole = \"inside\"\naddresses = [\"10.0.0.1/24\"]\n\n\
             [[interfaces]]\nname = \"wan0\"\nrole = \"outside\"\naddresses = [\"203.0.113.1/24\"]\n\n\
             [nat]\nlog = \"nat.log\"\nport_block_size = 256\n",
            sock.display()
        ),
    )
    .unwrap();
    let mut child = sluice()
        .args(["run", "-c"])
        .arg(dir.join("gw.toml"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let ctl = |w: &[&str]| ctl_at(&sock, w);
    wait_started(&mut child, &sock);
    // The control socket is its owner's only (`control_socket_mode`'s
    // default), whatever the umask.
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&sock).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "control socket mode {mode:o}");
    }
    let status: serde_json::Value =
        serde_json::from_slice(&ctl(&["status"]).stdout).expect("status prints JSON");
    assert_eq!(status["ok"], true, "{status}");
    assert_eq!(
        status["nat"]["pools"][0]["addr"], "198.51.100.7",
        "{status}"
    );
    assert_eq!(
        status["nat"]["pools"][0]["blocks"]["total"], 252,
        "{status}"
    );
    assert!(status["nat_log"]["path"]
        .as_str()
        .unwrap_or("")
        .ends_with("nat.log"));
    let reload: serde_json::Value =
        serde_json::from_slice(&ctl(&["reload"]).stdout).expect("reload prints JSON");
    assert_eq!(reload["generation"], 2, "{reload}");
    // `nft -f FILE`: all the file's commands as one change, or none.
    let rules = |what: &str| -> u64 {
        let s: serde_json::Value =
            serde_json::from_slice(&ctl(&["status"]).stdout).expect("status prints JSON");
        s["rules"].as_u64().unwrap_or_else(|| panic!("{what}: {s}"))
    };
    let before = rules("before");
    let bad = dir.join("bad.nft");
    std::fs::write(
        &bad,
        "# two good lines, then a typo\nadd rule ip filter forward tcp dport 22 accept\n\n\
         insert rule ip filter forward udp dport 53 accept\nadd rule ip filter forwrd drop\n",
    )
    .unwrap();
    let o = ctl(&["nft", "-f", &bad.display().to_string()]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr).to_string() + &String::from_utf8_lossy(&o.stdout);
    assert!(
        err.contains(&format!("{}:5: ", bad.display())) && err.contains("(nothing applied)"),
        "{err}"
    );
    assert_eq!(rules("after the refused file"), before);
    let good = dir.join("good.nft");
    std::fs::write(
        &good,
        "add rule ip filter forward tcp dport 22 accept\ninsert rule ip filter forward udp dport 53 accept\n",
    )
    .unwrap();
    let o = ctl(&["nft", "-f", &good.display().to_string()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("nft -f prints JSON");
    assert_eq!(v["applied"], 2, "{v}");
    assert_eq!(v["generation"], 3, "one generation for the whole file: {v}");
    assert_eq!(rules("after the file"), before + 2);
    // NAT pools on a running gateway (port blocks on): a rule with a new
    // `snat to` address adds a pool; a reload that would move the blocks of
    // a kept address (a new port range) is refused with its reason and
    // keeps the running rule set; an address that left cannot come back.
    let snat9 = [
        "nft",
        "add",
        "rule",
        "ip",
        "nat",
        "postrouting",
        "ip",
        "saddr",
        "10.9.0.0/16",
        "snat",
        "to",
        "198.51.100.9",
    ];
    let o = ctl(&snat9);
    assert!(o.status.success(), "{}", json(&o));
    let st = json(&ctl(&["status"]));
    assert_eq!(st["nat"]["pools"][1]["addr"], "198.51.100.9", "{st}");
    assert_eq!(st["generation"], 4, "{st}");
    let nft_text = std::fs::read_to_string(dir.join("sluice.nft")).unwrap();
    std::fs::write(
        dir.join("sluice.nft"),
        nft_text.replace("snat to 198.51.100.7", "snat to 198.51.100.7:2000-3000"),
    )
    .unwrap();
    let o = ctl(&["reload"]);
    let r = json(&o);
    assert!(!o.status.success(), "{r}");
    assert!(
        r.to_string()
            .contains("198.51.100.7 stays a pool address but its port range changes"),
        "{r}"
    );
    assert_eq!(json(&ctl(&["status"]))["generation"], 4);
    std::fs::write(dir.join("sluice.nft"), &nft_text).unwrap();
    let r = json(&ctl(&["reload"]));
    assert_eq!(r["generation"], 5, "{r}");
    assert!(applied(&r, "nat pools"), "{r}");
    let o = ctl(&snat9);
    assert!(!o.status.success());
    assert!(
        json(&o)
            .to_string()
            .contains("198.51.100.9 left the pools earlier and cannot come back"),
        "{}",
        json(&o)
    );
    assert_eq!(json(&ctl(&["status"]))["generation"], 5);
    // `[nat]`: a new per-subscriber limit is taken live, a new mapping
    // behaviour needs a restart (and is said to).
    let toml = std::fs::read_to_string(dir.join("gw.toml")).unwrap();
    let with = |extra: &str| {
        toml.replace(
            "port_block_size = 256\n",
            &format!("port_block_size = 256\n{extra}\n"),
        )
    };
    std::fs::write(
        dir.join("gw.toml"),
        with("max_sessions_per_subscriber = 500"),
    )
    .unwrap();
    // `reload check` says so without reloading.
    let c = json(&ctl(&["reload", "check"]));
    assert!(applied(&c, "nat settings"), "{c}");
    assert_eq!(json(&ctl(&["status"]))["generation"], 5);
    let r = json(&ctl(&["reload"]));
    assert!(applied(&r, "nat settings"), "{r}");
    assert_eq!(r["needs_restart"], serde_json::json!([]), "{r}");
    std::fs::write(
        dir.join("gw.toml"),
        with("max_sessions_per_subscriber = 500\nmapping = \"address-and-port-dependent\""),
    )
    .unwrap();
    let r = json(&ctl(&["reload"]));
    assert_eq!(r["needs_restart"], serde_json::json!(["nat"]), "{r}");
    assert_eq!(r["generation"], 7, "{r}");
    // The NAT log moves to another file; one that cannot be opened
    // refuses the reload, changing nothing.
    let toml = std::fs::read_to_string(dir.join("gw.toml")).unwrap();
    std::fs::write(
        dir.join("gw.toml"),
        toml.replace("log = \"nat.log\"", "log = \"nat2.log\""),
    )
    .unwrap();
    let r = json(&ctl(&["reload"]));
    assert!(applied(&r, "nat log"), "{r}");
    let st = json(&ctl(&["status"]));
    assert!(
        st["nat_log"]["path"]
            .as_str()
            .unwrap_or("")
            .ends_with("nat2.log"),
        "{st}"
    );
    assert!(dir.join("nat2.log").exists());
    std::fs::write(
        dir.join("gw.toml"),
        toml.replace(
            "log = \"nat.log\"",
            "log = \"/nonexistent-sluice-dir/nat.log\"",
        ),
    )
    .unwrap();
    let o = ctl(&["reload"]);
    assert!(!o.status.success());
    assert!(json(&o).to_string().contains("cannot open"), "{}", json(&o));
    let st = json(&ctl(&["status"]));
    assert!(
        st["nat_log"]["path"]
            .as_str()
            .unwrap_or("")
            .ends_with("nat2.log"),
        "{st}"
    );
    assert_eq!(st["generation"], 8, "{st}");
    // The control socket's mode is applied by a reload; a capture file,
    // which a reload cannot start, is reported as needing a restart
    // (both were once ignored without a word).
    std::fs::write(
        dir.join("gw.toml"),
        format!("control_socket_mode = \"0660\"\ncapture = \"cap\"\n{toml}"),
    )
    .unwrap();
    let r = json(&ctl(&["reload"]));
    assert!(applied(&r, "control socket mode"), "{r}");
    // (`nat`: the mapping behaviour written above still waits for one.)
    assert_eq!(
        r["needs_restart"],
        serde_json::json!(["capture", "nat"]),
        "{r}"
    );
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&sock).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o660, "control socket mode {mode:o}");
    }
    let m = ctl(&["metrics"]);
    let text = String::from_utf8_lossy(&m.stdout).to_string();
    assert!(text.starts_with("# HELP sluice_uptime_seconds"), "{text}");
    assert!(text.contains("sluice_ruleset_generation 9\n"), "{text}");
    assert!(
        text.contains("sluice_nat_retired_mappings{worker=\"0\"} 0\n"),
        "{text}"
    );
    assert!(
        text.contains(
            "sluice_nat_pool_free_ports{worker=\"0\",address=\"198.51.100.7\",protocol=\"tcp\"} 64512\n"
        ),
        "{text}"
    );
    let mut c = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    c.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .unwrap();
    let mut http = String::new();
    c.read_to_string(&mut http).unwrap();
    assert!(http.starts_with("HTTP/1.1 200 OK\r\n"), "{http}");
    assert!(
        http.contains("\r\n\r\n# HELP sluice_uptime_seconds"),
        "{http}"
    );
    assert!(
        http.contains("sluice_nat_port_blocks{worker=\"0\"} 0\n"),
        "{http}"
    );
    let st = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(st.success());
    let code = child.wait().unwrap();
    let mut err = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut err);
    }
    let log_exists = dir.join("nat.log").exists();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(code.success(), "exit {code:?}: {err}");
    assert!(log_exists, "nat.log not created: {err}");
    // `sluice run` logs its start and stop to stderr (it once logged
    // nothing: no subscriber was installed).
    for want in ["running", "shutting down", "stopped"] {
        assert!(
            err.contains(want),
            "no {want:?} in the gateway's log:\n{err}"
        );
    }
}

/// `sluice ctl --socket SOCK WORDS...`.
fn ctl_at(sock: &std::path::Path, words: &[&str]) -> Output {
    sluice()
        .arg("ctl")
        .arg("--socket")
        .arg(sock)
        .args(words)
        .output()
        .unwrap()
}

/// Waits up to 10 s for the gateway `child` to answer `status` on `sock`.
fn wait_started(child: &mut std::process::Child, sock: &std::path::Path) {
    let start = std::time::Instant::now();
    while !ctl_at(sock, &["status"]).status.success() {
        assert!(
            start.elapsed().as_secs() < 10,
            "gateway did not start: {:?}",
            child.try_wait()
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// An answer's JSON, or its output as text when it is not JSON.
fn json(o: &Output) -> serde_json::Value {
    serde_json::from_slice(&o.stdout).unwrap_or_else(|_| {
        serde_json::json!({"stdout": String::from_utf8_lossy(&o.stdout),
                           "stderr": String::from_utf8_lossy(&o.stderr)})
    })
}

/// Whether a reload's (or `reload check`'s) answer lists `what` among
/// what it `applied`.
fn applied(answer: &serde_json::Value, what: &str) -> bool {
    answer["applied"]
        .as_array()
        .is_some_and(|a| a.iter().any(|x| x == what))
}

/// `sluice nat lookup -c CFG QUERY`.
fn nat_lookup(cfg: &std::path::Path, query: &str) -> Output {
    sluice()
        .args(["nat", "lookup", "-c"])
        .arg(cfg)
        .arg(query)
        .output()
        .unwrap()
}

/// Deterministic NAT: `sluice nat lookup` maps a subscriber to its address
/// and ports and an external endpoint back to the subscriber, from the
/// configuration alone; a pool too small for the prefix is refused by
/// `sluice check`.
#[test]
fn nat_lookup_maps_deterministic_blocks_both_ways() {
    let find = "masquerade_ports = \"1024-65535\"";
    let err = check_nat_lines(
        "det",
        "port_block_size = 1000\ndeterministic = \"100.64.0.0/26\"",
        "port_block_size = 1000\ndeterministic = \"100.64.0.0/25\"",
    );
    assert!(
        err.contains("nat.deterministic: the NAT pool with 198.51.100.7 has 64 port blocks of 1000 ports per worker, fewer than the prefix's 128 subscribers"),
        "{err}"
    );
    let dir = std::env::temp_dir().join(format!("sluice-cli-natl-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = std::fs::read_to_string(example()).unwrap();
    std::fs::copy(example().with_extension("nft"), dir.join("sluice.nft")).unwrap();
    let cfg = dir.join("gw.toml");
    std::fs::write(
        &cfg,
        src.replacen(
            &format!("{find}\n"),
            &format!("{find}\nport_block_size = 1000\ndeterministic = \"100.64.0.0/26\"\n"),
            1,
        ),
    )
    .unwrap();
    let lookup = |q: &str| {
        let o = nat_lookup(&cfg, q);
        (
            o.status.code(),
            String::from_utf8_lossy(&o.stdout).trim().to_string(),
        )
    };
    // Subscriber 3 owns the fourth block: ports 4024-5023.
    let fwd = lookup("100.64.0.3");
    let back = lookup("198.51.100.7:4500");
    let edge = lookup("198.51.100.7:5024");
    let outside = lookup("100.64.0.64");
    let remainder = lookup("198.51.100.7:65535");
    let bad = lookup("198.51.100.7:http");
    std::fs::write(&cfg, &src).unwrap();
    let off = sluice()
        .args(["nat", "lookup", "-c"])
        .arg(&cfg)
        .arg("100.64.0.3")
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(
        fwd,
        (Some(0), "100.64.0.3 -> 198.51.100.7 ports 4024-5023".into())
    );
    assert_eq!(back, (Some(0), "198.51.100.7:4500 -> 100.64.0.3".into()));
    assert_eq!(edge, (Some(0), "198.51.100.7:5024 -> 100.64.0.4".into()));
    assert_eq!(outside.0, Some(1), "{outside:?}");
    assert!(outside
        .1
        .contains("outside the subscriber prefix 100.64.0.0/26"));
    assert_eq!(remainder.0, Some(1), "{remainder:?}");
    assert_eq!(bad.0, Some(2), "{bad:?}");
    assert_eq!(off.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&off.stderr).contains("nat.deterministic is not set"),
        "{off:?}"
    );
}

/// The carrier-grade NAT example (`examples/cgnat.toml`) checks, lists its
/// NAT features, and maps its last subscriber both ways.
#[test]
fn cgnat_example_checks_and_maps_its_subscribers() {
    let cfg = example().with_file_name("cgnat.toml");
    let out = sluice().args(["check", "-c"]).arg(&cfg).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("; port blocks of 500; deterministic NAT for 100.64.0.0/22; NAT log to /var/log/sluice/nat.log; metrics on 127.0.0.1:9108"),
        "{text}"
    );
    let lookup = |q: &str| {
        String::from_utf8_lossy(&nat_lookup(&cfg, q).stdout)
            .trim()
            .to_string()
    };
    assert_eq!(
        lookup("100.64.3.255"),
        "100.64.3.255 -> 198.51.100.15 worker 0: ports 64024-65021, worker 1: ports 64026-65023"
    );
    assert_eq!(
        lookup("198.51.100.15:65000"),
        "198.51.100.15:65000 -> 100.64.3.255"
    );
    assert_eq!(
        lookup("198.51.100.0:1024"),
        "198.51.100.0:1024 -> 100.64.0.0"
    );
}

/// A gateway whose control socket lets a group in (`control_socket_mode =
/// "0660"`, `control_socket_group = "nogroup"`): a member (`nobody`) may
/// ask for the status but may not make the daemon read a file
/// (`ruleset replace /etc/shadow` is refused, the file's lines never
/// echoed); a user outside the group cannot connect at all. Needs root
/// (`setpriv` to other users).
#[test]
#[ignore = "needs root (setpriv); run by .ci/run with --ignored"]
fn control_socket_group_members_may_not_name_files() {
    let dir = std::env::temp_dir().join(format!("sluice-cli-grp-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let nft = example().with_extension("nft");
    std::fs::copy(&nft, dir.join("sluice.nft")).unwrap();
    let sock = dir.join("ctl.sock");
    std::fs::write(
        dir.join("gw.toml"),
        format!(
            "ruleset = \"sluice.nft\"\nbackend = \"mem\"\ncontrol_socket = \"{}\"\n\
             control_socket_mode = \"0660\"\ncontrol_socket_group = \"nogroup\"\n\n\
             [[interfaces]]\nname = \"lan0\"\nrole = \"inside\"\naddresses = [\"10.0.0.1/24\"]\n\n\
             [[interfaces]]\nname = \"wan0\"\nrole = \"outside\"\naddresses = [\"203.0.113.1/24\"]\n",
            sock.display()
        ),
    )
    .unwrap();
    let mut child = sluice()
        .args(["run", "-c"])
        .arg(dir.join("gw.toml"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let as_user = |gid: &str, words: &[&str]| -> Output {
        Command::new("setpriv")
            .args(["--reuid=65534", &format!("--regid={gid}"), "--clear-groups"])
            .arg(env!("CARGO_BIN_EXE_sluice"))
            .arg("ctl")
            .arg("--socket")
            .arg(&sock)
            .args(words)
            .output()
            .expect("run setpriv")
    };
    wait_started(&mut child, &sock);
    {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(&sock).unwrap();
        assert_eq!((m.mode() & 0o777, m.gid()), (0o660, 65534));
    }
    let o = as_user("65534", &["status"]);
    assert!(o.status.success(), "a group member's status: {o:?}");
    let o = as_user("65534", &["ruleset", "replace", "/etc/shadow"]);
    let out = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(!o.status.success(), "{out}");
    assert!(out.contains("may not name one"), "{out}");
    assert!(
        !out.contains("root:"),
        "a line of /etc/shadow came back: {out}"
    );
    let o = as_user("65533", &["status"]);
    assert!(
        !o.status.success(),
        "a user outside the group connected: {o:?}"
    );
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&dir);
}

/// A mem-backend gateway's configuration in `dir`/gw.toml: `extra`
/// (top-level keys first, then any tables) ahead of two interfaces.
fn write_config(dir: &std::path::Path, sock: &std::path::Path, extra: &str) {
    std::fs::write(
        dir.join("gw.toml"),
        format!(
            "ruleset = \"sluice.nft\"\nbackend = \"mem\"\ncontrol_socket = \"{}\"\n{extra}\n\
             [[interfaces]]\nname = \"lan0\"\nrole = \"inside\"\naddresses = [\"10.0.0.1/24\"]\n\n\
             [[interfaces]]\nname = \"wan0\"\nrole = \"outside\"\naddresses = [\"203.0.113.1/24\"]\n",
            sock.display()
        ),
    )
    .unwrap();
}

/// A gateway on in-memory ports (`backend = "mem"`, no root needed) with
/// the example rule set, run from a directory of its own; `extra` is
/// added to the top of its configuration, and [`MemGateway::write`]
/// rewrites it for a reload.
struct MemGateway {
    dir: PathBuf,
    sock: PathBuf,
    child: std::process::Child,
}

impl MemGateway {
    fn start(tag: &str, extra: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("sluice-cli-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::copy(example().with_extension("nft"), dir.join("sluice.nft")).unwrap();
        let sock = dir.join("ctl.sock");
        write_config(&dir, &sock, extra);
        let mut child = sluice()
            .args(["run", "-c"])
            .arg(dir.join("gw.toml"))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        wait_started(&mut child, &sock);
        MemGateway { dir, sock, child }
    }

    /// Rewrite the configuration with `extra` (see [`write_config`]).
    fn write(&self, extra: &str) {
        write_config(&self.dir, &self.sock, extra);
    }

    fn ctl(&self, words: &[&str]) -> Output {
        ctl_at(&self.sock, words)
    }

    /// SIGTERM; asserts a clean exit and returns the gateway's log.
    fn stop(&mut self) -> String {
        use std::io::Read;
        let st = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(st.success());
        let code = self.child.wait().unwrap();
        let mut err = String::new();
        if let Some(mut e) = self.child.stderr.take() {
            let _ = e.read_to_string(&mut err);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
        assert!(code.success(), "exit {code:?}: {err}");
        err
    }
}

impl Drop for MemGateway {
    /// A test that failed before [`MemGateway::stop`] leaves no gateway
    /// running.
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `metrics_listen` on a running gateway: a reload moves the listener (the
/// new address serves, the old one no longer answers), refuses an address
/// it cannot listen on with the reason and changes nothing, and takes the
/// listener away when the setting goes; `reload check` says the same
/// without doing it.
#[test]
fn a_reload_moves_sets_and_removes_the_metrics_listener() {
    use std::io::{Read, Write};
    let free = || {
        std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .unwrap()
            .port()
    };
    let (a, b) = (free(), free());
    let m = |metrics: Option<u16>| {
        metrics.map_or(String::new(), |p| {
            format!("metrics_listen = \"127.0.0.1:{p}\"\n")
        })
    };
    let mut gw = MemGateway::start("metrics", &m(Some(a)));
    let write = |metrics: Option<u16>| gw.write(&m(metrics));
    let ctl = |w: &[&str]| gw.ctl(w);
    let sock = gw.sock.clone();
    // Whether port `p` serves the metrics.
    let serves = |p: u16| -> bool {
        let Ok(mut c) = std::net::TcpStream::connect(("127.0.0.1", p)) else {
            return false;
        };
        let _ = c.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n");
        let mut http = String::new();
        let _ = c.read_to_string(&mut http);
        http.starts_with("HTTP/1.1 200 OK\r\n") && http.contains("sluice_uptime_seconds")
    };
    // The thread takes a new listener within 100 ms.
    let soon = |f: &dyn Fn() -> bool| -> bool {
        let t = std::time::Instant::now();
        while t.elapsed() < std::time::Duration::from_secs(3) {
            if f() {
                return true;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        false
    };
    assert!(serves(a));
    write(Some(b));
    let c = json(&ctl(&["reload", "check"]));
    assert!(applied(&c, "metrics listener"), "{c}");
    assert!(serves(a) && !serves(b), "reload check changed nothing");
    let r = json(&ctl(&["reload"]));
    assert!(applied(&r, "metrics listener"), "{r}");
    assert_eq!(r["needs_restart"], serde_json::json!([]), "{r}");
    assert!(soon(&|| serves(b)), "the new address serves");
    assert!(soon(&|| !serves(a)), "the old address no longer answers");
    // A port someone else holds: refused, with the reason; the running
    // listener and rule set stay.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let t = taken.local_addr().unwrap().port();
    write(Some(t));
    let gen = json(&ctl(&["status"]))["generation"].clone();
    for cmd in [&["reload", "check"][..], &["reload"][..]] {
        let o = ctl(cmd);
        assert!(!o.status.success(), "{cmd:?}");
        let text =
            String::from_utf8_lossy(&o.stdout).to_string() + &String::from_utf8_lossy(&o.stderr);
        assert!(
            text.contains(&format!("metrics_listen: cannot listen on 127.0.0.1:{t}")),
            "{cmd:?}: {text}"
        );
    }
    assert_eq!(
        json(&ctl(&["status"]))["generation"],
        gen,
        "nothing applied"
    );
    assert!(serves(b));
    drop(taken);
    // Taken out: no listener.
    write(None);
    let r = json(&ctl(&["reload"]));
    assert!(applied(&r, "metrics listener"), "{r}");
    assert!(soon(&|| !serves(b)), "no listener once the setting is gone");
    // And set again.
    write(Some(a));
    let r = json(&ctl(&["reload"]));
    assert!(applied(&r, "metrics listener"), "{r}");
    assert!(soon(&|| serves(a)));
    // `--text`: a count as its number, an (empty) listing as no lines, a
    // filtered flush as the number removed; other answers stay JSON.
    let text = |w: &[&str]| -> String {
        let o = sluice()
            .arg("ctl")
            .arg("--socket")
            .arg(&sock)
            .arg("--text")
            .args(w)
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "{w:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8_lossy(&o.stdout).to_string()
    };
    assert_eq!(text(&["conntrack", "count"]), "0\n");
    assert_eq!(text(&["conntrack", "count", "proto", "udp"]), "0\n");
    assert_eq!(text(&["conntrack", "list", "proto", "tcp"]), "");
    assert_eq!(text(&["conntrack", "flush", "addr", "10.0.0.7"]), "0\n");
    assert!(text(&["status"]).starts_with("{\""));
    let err = gw.stop();
    assert!(err.contains("metrics listener replaced"), "{err}");
}

/// `conntrack.max` and `max_v6` on a running gateway: a reload applies a
/// new maximum up to the capacity the tables were built with
/// (`conntrack.capacity`), split between the workers as at start, and
/// shown by `status`; a maximum above it, or a new capacity, is left for a
/// restart with the reason; a capacity below the maximum is a
/// configuration error that changes nothing.
#[test]
fn a_reload_changes_the_conntrack_maximum_within_the_capacity() {
    let ct = |max: &str| format!("workers = 2\n[conntrack]\n{max}\n");
    let mut gw = MemGateway::start("ctmax", &ct("max = 1000\ncapacity = 4000"));
    // Per worker: (ct_max, ct_capacity, ct_max6).
    let limits = || -> Vec<(u64, u64, u64)> {
        let st = json(&gw.ctl(&["status"]));
        st["worker_status"]
            .as_array()
            .unwrap_or_else(|| panic!("{st}"))
            .iter()
            .map(|w| {
                (
                    w["ct_max"].as_u64().unwrap(),
                    w["ct_capacity"].as_u64().unwrap(),
                    w["ct_max6"].as_u64().unwrap(),
                )
            })
            .collect()
    };
    assert_eq!(limits(), vec![(500, 2000, 32768); 2]);
    // Raised within the capacity, IPv6's lowered: `reload check` says so
    // and changes nothing, the reload applies it.
    gw.write(&ct("max = 3000\ncapacity = 4000\nmax_v6 = 100"));
    let c = json(&gw.ctl(&["reload", "check"]));
    assert!(applied(&c, "conntrack max"), "{c}");
    assert_eq!(c["needs_restart"], serde_json::json!([]), "{c}");
    assert_eq!(limits(), vec![(500, 2000, 32768); 2]);
    let r = json(&gw.ctl(&["reload"]));
    assert!(applied(&r, "conntrack max"), "{r}");
    assert_eq!(r["needs_restart"], serde_json::json!([]), "{r}");
    assert_eq!(limits(), vec![(1500, 2000, 50); 2]);
    // A capacity below the maximum: the file is refused, nothing changes.
    gw.write(&ct("max = 5000\ncapacity = 4000"));
    let gen = json(&gw.ctl(&["status"]))["generation"].clone();
    let o = gw.ctl(&["reload"]);
    assert!(!o.status.success());
    let text = String::from_utf8_lossy(&o.stdout).to_string() + &String::from_utf8_lossy(&o.stderr);
    assert!(
        text.contains("conntrack.capacity: 4000 is below conntrack.max (5000)"),
        "{text}"
    );
    assert_eq!(json(&gw.ctl(&["status"]))["generation"], gen);
    assert_eq!(limits(), vec![(1500, 2000, 50); 2]);
    // Above the running capacity (the capacity left unset): the rest of
    // the reload applies, the maximum waits for a restart, and says why.
    gw.write(&ct("max = 5000"));
    let r = json(&gw.ctl(&["reload"]));
    assert_eq!(r["needs_restart"], serde_json::json!(["conntrack"]), "{r}");
    assert!(!applied(&r, "conntrack max"), "{r}");
    let why = r["why"]["conntrack"].as_str().unwrap_or_default();
    assert!(
        why.contains("conntrack.max = 5000 is above the running tables' capacity (4000)"),
        "{r}"
    );
    assert_eq!(limits(), vec![(1500, 2000, 50); 2]);
    // Lowered, the capacity unset: the running capacity stays and the
    // maximum applies.
    gw.write(&ct("max = 200"));
    let r = json(&gw.ctl(&["reload"]));
    assert!(applied(&r, "conntrack max"), "{r}");
    assert_eq!(limits(), vec![(100, 2000, 32768); 2]);
    // A new capacity takes a restart.
    gw.write(&ct("max = 200\ncapacity = 8000"));
    let r = json(&gw.ctl(&["reload"]));
    assert_eq!(r["needs_restart"], serde_json::json!(["conntrack"]), "{r}");
    assert!(
        r["why"]["conntrack"].as_str().is_some_and(
            |w| w.contains("conntrack.capacity = 8000: the running tables were built for 4000")
        ),
        "{r}"
    );
    assert_eq!(limits(), vec![(100, 2000, 32768); 2]);
    let err = gw.stop();
    assert!(err.contains("reload: conntrack maximums replaced"), "{err}");
}
