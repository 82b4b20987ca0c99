//! Shared helpers for the root tests: a namespace with veth pairs, test
//! frames, and receive loops. Each test builds its own namespace named
//! `sluice-io-test-<pid>-<test>` and deletes it on drop (also on panic).
#![allow(dead_code)]

use std::time::{Duration, Instant};

use sluice_io::netns::Netns;
use sluice_io::rawsock::RawSocket;
use sluice_io::{wait_readable, Batch, Port};

/// Ethertype of test frames (IEEE 802 local experimental 1), ignored by the
/// kernel stack.
pub const TEST_ETHERTYPE: u16 = 0x88b5;
const MAGIC: &[u8; 8] = b"sluiceIO";

/// Fail (not pass, not skip) when not root: these tests are run on purpose
/// with `--ignored` and must not report success without having run.
pub fn require_root() {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let euid = status
        .lines()
        .find(|l| l.starts_with("Uid:"))
        .and_then(|l| l.split_whitespace().nth(2))
        .unwrap_or("?");
    assert_eq!(
        euid, "0",
        "this test needs root (CAP_NET_ADMIN, CAP_NET_RAW, CAP_BPF) to create network \
         namespaces, veth pairs, packet and XDP sockets; run it as root via .ci/run \
         (cargo test -p sluice-io -- --ignored). Effective uid is {euid}."
    );
}

/// A namespace with veth pairs `<p>0 <-> <p>1` for each prefix, all up.
pub struct TestNet {
    pub ns: Netns,
}

impl TestNet {
    pub fn new(test: &str, pairs: &[&str]) -> TestNet {
        require_root();
        let name = format!("sluice-io-test-{}-{test}", std::process::id());
        let ns = Netns::create(&name).unwrap_or_else(|e| panic!("create netns {name}: {e}"));
        for p in pairs {
            let (a, b) = (format!("{p}0"), format!("{p}1"));
            ns.ip(&["link", "add", &a, "type", "veth", "peer", "name", &b])
                .expect("add veth");
            for d in [&a, &b] {
                ns.ip(&["link", "set", d, "up"]).expect("veth up");
            }
        }
        // Quiet the links: no IPv6 autoconfiguration chatter (best effort).
        let _ = ns.run(|| std::fs::write("/proc/sys/net/ipv6/conf/all/disable_ipv6", "1"));
        TestNet { ns }
    }

    /// Run `f` on a thread inside the namespace.
    pub fn run<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        self.ns.run(f).expect("enter netns")
    }
}

/// A test frame: broadcast, experimental ethertype, magic, sequence, padding.
pub fn test_frame(seq: u32, len: usize) -> Vec<u8> {
    let mut f = vec![0u8; len.max(60)];
    f[0..6].copy_from_slice(&[0xff; 6]);
    f[6..12].copy_from_slice(&[0x02, 0, 0, 0, 0, 0x01]);
    f[12..14].copy_from_slice(&TEST_ETHERTYPE.to_be_bytes());
    f[14..22].copy_from_slice(MAGIC);
    f[22..26].copy_from_slice(&seq.to_be_bytes());
    for (i, b) in f.iter_mut().enumerate().skip(26) {
        *b = (i as u32 ^ seq) as u8;
    }
    f
}

/// The sequence number of a test frame, if `f` is one and intact.
pub fn parse_test_frame(f: &[u8]) -> Option<u32> {
    if f.len() < 60 || f[12..14] != TEST_ETHERTYPE.to_be_bytes() || &f[14..22] != MAGIC {
        return None;
    }
    let seq = u32::from_be_bytes([f[22], f[23], f[24], f[25]]);
    (test_frame(seq, f.len()) == f).then_some(seq)
}

/// Send `n` test frames of `len` bytes on `sock`, pacing a little so the
/// veth backlog (1000) and the XDP ptr_ring (256) never overflow.
pub fn send_frames(sock: &RawSocket, n: u32, len: usize) {
    for s in 0..n {
        sock.send(&test_frame(s, len)).expect("raw send");
        if s % 64 == 63 {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

/// Receive through `port` until `n` test frames arrived or `timeout`.
/// Returns the sequence numbers seen, in order.
pub fn receive_test_frames(port: &mut dyn Port, n: usize, timeout: Duration) -> Vec<u32> {
    let mut batch = Batch::new();
    let mut seen = Vec::new();
    let end = Instant::now() + timeout;
    while seen.len() < n && Instant::now() < end {
        let got = port.rx_batch(&mut batch);
        for i in 0..got {
            if let Some(s) = batch.data(i).and_then(parse_test_frame) {
                seen.push(s);
            }
        }
        batch.clear();
        if got == 0 {
            let _ = wait_readable(port, 10);
        }
    }
    seen
}

/// Read test frames from a raw socket until `n` or `timeout`.
pub fn raw_receive(sock: &RawSocket, n: usize, timeout: Duration) -> Vec<u32> {
    let mut buf = vec![0u8; 4096];
    let mut seen = Vec::new();
    let end = Instant::now() + timeout;
    while seen.len() < n && Instant::now() < end {
        if let Some(len) = sock.recv(&mut buf, 20).expect("raw recv") {
            if let Some(s) = parse_test_frame(&buf[..len]) {
                seen.push(s);
            }
        }
    }
    seen
}

pub fn assert_all_in_order(seen: &[u32], n: u32, what: &str) {
    let want: Vec<u32> = (0..n).collect();
    assert_eq!(
        seen.len(),
        n as usize,
        "{what}: got {} of {n} frames",
        seen.len()
    );
    assert_eq!(seen, &want[..], "{what}: frames out of order or repeated");
}

/// An Ethernet/IPv6 frame from `fd00::S` to `2001:db8::D` (S, D: the
/// last address bytes) with next header `nh` and `payload`.
pub fn ipv6_frame(nh: u8, s: u8, d: u8, payload: &[u8]) -> Vec<u8> {
    let mut fr = vec![0x02, 0, 0, 0, 0, 0x02, 0x02, 0, 0, 0, 0, 0x01, 0x86, 0xdd];
    fr.extend_from_slice(&[0x60, 0, 0, 0]);
    fr.extend_from_slice(&(payload.len() as u16).to_be_bytes());
    fr.extend_from_slice(&[nh, 64]);
    fr.extend_from_slice(&[0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, s]);
    fr.extend_from_slice(&[0x20, 1, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, d]);
    fr.extend_from_slice(payload);
    fr
}

/// IPv6 frames of the shapes the steering programs tell apart, each with
/// its id in the last two bytes (after the IPv6 payload): UDP and TCP
/// between 24 host pairs, ICMPv6 echo, ICMPv6 errors quoting a UDP packet
/// (keyed by the quoted addresses), TCP behind a hop-by-hop header, a
/// non-first fragment, and NDP (neighbour solicitation and advertisement,
/// for worker 0). At least 60 bytes each.
pub fn ipv6_steering_frames(first_id: u16) -> Vec<Vec<u8>> {
    let mut v = Vec::new();
    let udp = [0x13, 0x89, 0x13, 0x8b, 0, 8, 0, 0];
    let tcp = [
        0x9c, 0x40, 0x01, 0xbb, 0, 0, 0, 1, 0, 0, 0, 0, 0x50, 0x02, 0, 0, 0, 0, 0, 0,
    ];
    for h in 0..24u8 {
        v.push(ipv6_frame(if h % 2 == 0 { 17 } else { 6 }, h, 7, &tcp));
        v.push(ipv6_frame(58, 7 + h, h, &[128, 0, 0, 0, 0, h, 0, 1]));
        // Time exceeded / unreachable from a router (fd00::fe) to the
        // sender, quoting a UDP packet of host pair (h, 9).
        let quoted = &ipv6_frame(17, h, 9, &udp)[14..];
        let mut err = vec![if h % 2 == 0 { 3 } else { 1 }, 0, 0, 0, 0, 0, 0, 0];
        err.extend_from_slice(quoted);
        v.push(ipv6_frame(58, 0xfe, h, &err));
    }
    let mut hbh = vec![6, 0, 5, 2, 0, 0, 1, 0];
    hbh.extend_from_slice(&tcp);
    v.push(ipv6_frame(0, 3, 4, &hbh));
    v.push(ipv6_frame(
        44,
        5,
        6,
        &[17, 0, 0x05, 0xc9, 0, 0, 0, 1, 0xaa, 0xaa, 0xaa, 0xaa],
    ));
    for ty in [135u8, 136] {
        let mut m = vec![ty, 0, 0, 0, 0, 0, 0, 0];
        m.extend_from_slice(&[0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
        v.push(ipv6_frame(58, 2, 1, &m));
    }
    for (i, f) in v.iter_mut().enumerate() {
        f.resize(f.len().max(58), 0);
        f.extend_from_slice(&(first_id + i as u16).to_be_bytes());
    }
    v
}
