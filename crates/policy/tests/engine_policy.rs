//! Rule sets through the compiled policy and the engine, on crafted frames.
//!
//! - `tcp option maxseg size set` (iptables `-j TCPMSS`): the MSS option of
//!   a forwarded SYN (and, when the rule runs for established packets, of
//!   the SYN-ACK) is lowered, never raised, with a valid checksum; `rt mtu`
//!   takes the smaller MTU of the two directions' interfaces, less 40 bytes.
//! - IP header fields (`ip ttl`, `ip length`, `ip dscp`): the engine gives
//!   the policy what the packet carries, with the TTL decremented from the
//!   forward hook on, as the kernel does (the kernel oracle checks the same
//!   rules against `sluice trace`).

use std::net::Ipv4Addr;
use std::sync::Arc;

use sluice_engine::{Action, EngineConfig, Frames, IfIndex, Interface, Policy, Route4, Worker};
use sluice_policy::{CompiledPolicy, Interfaces};
use sluice_wire::build::build_tcp4;
use sluice_wire::flow::{proto, FlowKey4};
use sluice_wire::tcp;
use sluice_wire::IpPair;

const LAN: IfIndex = 1;
const WAN: IfIndex = 2;
const GW_LAN_MAC: [u8; 6] = [2, 0, 0, 0, 0, 1];
const GW_WAN_MAC: [u8; 6] = [2, 0, 0, 0, 0, 2];
const HOST_MAC: [u8; 6] = [2, 0, 0, 0, 9, 9];
const ROUTER_MAC: [u8; 6] = [2, 0, 0, 0, 8, 8];
const HOST: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);
const REMOTE: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 80);

#[derive(Default)]
struct Batch {
    bufs: Vec<Vec<u8>>,
    lens: Vec<usize>,
    iifs: Vec<IfIndex>,
    acts: Vec<Action>,
}

impl Frames for Batch {
    fn count(&self) -> usize {
        self.bufs.len()
    }
    fn buf_mut(&mut self, i: usize) -> (&mut [u8], usize) {
        (&mut self.bufs[i][..], self.lens[i])
    }
    fn set_len(&mut self, i: usize, len: usize) {
        self.lens[i] = len;
    }
    fn iif(&self, i: usize) -> IfIndex {
        self.iifs[i]
    }
    fn set_action(&mut self, i: usize, a: Action) {
        self.acts[i] = a;
    }
}

fn gateway(rules: &str, wan_mtu: u16) -> Worker {
    let rs = sluice_ruleset::parse_nft_str("mss.nft", rules).unwrap_or_else(|d| panic!("{d}"));
    let mut ifs = Interfaces::new();
    ifs.insert("lan", u32::from(LAN));
    ifs.insert("wan", u32::from(WAN));
    let policy = CompiledPolicy::compile(&rs, &ifs).unwrap_or_else(|e| panic!("{e}"));
    let iface = |name: &str, mac, addr, mtu| Interface {
        name: name.into(),
        mac,
        addrs: vec![(addr, 24)],
        mtu,
    };
    let cfg = EngineConfig {
        interfaces: vec![
            Interface {
                name: "-".into(),
                mac: [0; 6],
                addrs: vec![],
                mtu: Interface::DEFAULT_MTU,
            },
            iface("lan", GW_LAN_MAC, Ipv4Addr::new(10, 0, 0, 1), 1500),
            iface("wan", GW_WAN_MAC, Ipv4Addr::new(203, 0, 113, 1), wan_mtu),
        ],
        routes: vec![Route4 {
            net: 0,
            len: 0,
            oif: WAN,
            via: Some(Ipv4Addr::new(203, 0, 113, 254)),
        }],
        neighbors: vec![
            (Ipv4Addr::new(203, 0, 113, 254), ROUTER_MAC),
            (HOST, HOST_MAC),
        ],
        ct_max: 100,
        ..EngineConfig::default()
    };
    Worker::new(cfg, Arc::new(policy) as Arc<dyn Policy>).unwrap()
}

/// A TCP segment with `flags` and an MSS option of `mss`.
fn segment(k: &FlowKey4, flags: u8, mss: u16, to_mac: [u8; 6], from_mac: [u8; 6]) -> Vec<u8> {
    let mut b = vec![0u8; 2048];
    let n = build_tcp4(&mut b, from_mac, to_mac, k, flags, 1000, 0, 0).unwrap();
    // Rebuild with options: data offset 6 words, MSS option, checksum.
    let l4 = 34;
    let mut f = b[..n].to_vec();
    f.splice(l4 + 20..l4 + 20, [2, 4, (mss >> 8) as u8, mss as u8]);
    f[l4 + 12] = 6 << 4;
    let ip_len = (f.len() - 14) as u16;
    f[16..18].copy_from_slice(&ip_len.to_be_bytes());
    f[24..26].copy_from_slice(&[0, 0]);
    let c = sluice_wire::checksum::checksum(&f[14..34]);
    f[24..26].copy_from_slice(&c.to_be_bytes());
    f[l4 + 16..l4 + 18].copy_from_slice(&[0, 0]);
    let pair = IpPair::V4 {
        src: k.src,
        dst: k.dst,
    };
    let s = sluice_wire::checksum::add(
        pair.pseudo_sum(6, (f.len() - l4) as u32),
        sluice_wire::checksum::sum(&f[l4..]),
    );
    let c = sluice_wire::checksum::finish(s);
    f[l4 + 16..l4 + 18].copy_from_slice(&c.to_be_bytes());
    f
}

/// Sends `f` on `iif`; the action and the frame afterwards.
fn send(w: &mut Worker, iif: IfIndex, f: Vec<u8>) -> (Action, Vec<u8>) {
    send_at(w, iif, f, 1_000_000)
}

/// The MSS option of a forwarded frame, and whether its TCP checksum holds.
fn mss_of(f: &[u8]) -> (u16, bool) {
    let l4 = 34;
    let src = u32::from_be_bytes(f[26..30].try_into().unwrap());
    let dst = u32::from_be_bytes(f[30..34].try_into().unwrap());
    let p = tcp::Packet::new_unchecked(&f[l4..]);
    let o = p.options();
    assert_eq!(&o[..2], &[2, 4], "MSS option kept in place");
    (
        u16::from_be_bytes([o[2], o[3]]),
        p.verify_checksum(&IpPair::V4 { src, dst }),
    )
}

/// The remote server's answer to the translated TCP frame `out` (sent to
/// its source address and port, from port 443).
/// The connection marks of the worker's IPv4 connections.
fn ct_marks(w: &Worker) -> Vec<u32> {
    w.conntrack().iter().map(|(_, e)| e.mark()).collect()
}

fn reply_to(out: &[u8]) -> FlowKey4 {
    FlowKey4 {
        src: u32::from(REMOTE),
        dst: u32::from_be_bytes(out[26..30].try_into().unwrap()),
        sport: 443,
        dport: u16::from_be_bytes(out[34..36].try_into().unwrap()),
        proto: proto::TCP,
    }
}

fn key(sport: u16) -> FlowKey4 {
    FlowKey4 {
        src: u32::from(HOST),
        dst: u32::from(REMOTE),
        sport,
        dport: 443,
        proto: proto::TCP,
    }
}

const CLAMP_FIRST: &str = "table inet f {
  chain fwd {
    type filter hook forward priority filter; policy drop;
    tcp flags syn tcp option maxseg size set rt mtu
    ct state established,related accept
    iifname \"lan\" accept
  }
}
table ip nat {
  chain post { type nat hook postrouting priority srcnat; oifname \"wan\" masquerade }
}";

#[test]
fn rt_mtu_clamps_syn_and_syn_ack_to_the_smaller_mtu() {
    let mut w = gateway(CLAMP_FIRST, 1400);
    let k = key(40_000);
    let (a, out) = send(&mut w, LAN, segment(&k, 0x02, 1460, GW_LAN_MAC, HOST_MAC));
    assert_eq!(a, Action::Forward(WAN));
    assert_eq!(mss_of(&out), (1360, true), "1400 - 40, checksum valid");
    // The SYN-ACK comes back to the masqueraded address: clamped too, as
    // the rule runs before `ct state established accept`.
    let back = reply_to(&out);
    let (a, out) = send(
        &mut w,
        WAN,
        segment(&back, 0x12, 1460, GW_WAN_MAC, ROUTER_MAC),
    );
    assert_eq!(a, Action::Forward(LAN));
    assert_eq!(mss_of(&out), (1360, true));
    // A smaller MSS is never raised.
    let k2 = key(40_001);
    let (a, out) = send(&mut w, LAN, segment(&k2, 0x02, 1200, GW_LAN_MAC, HOST_MAC));
    assert_eq!(a, Action::Forward(WAN));
    assert_eq!(mss_of(&out), (1200, true));
}

#[test]
fn a_fixed_value_and_rt_mtu_give_the_smaller_and_other_packets_are_untouched() {
    let rules = "table inet f {
  chain mangle { type filter hook forward priority mangle; tcp flags syn tcp option maxseg size set 1300 }
  chain fwd { type filter hook forward priority filter; policy accept;
    tcp flags syn tcp option maxseg size set rt mtu }
}";
    let mut w = gateway(rules, 1500);
    let k = key(40_002);
    let (a, out) = send(&mut w, LAN, segment(&k, 0x02, 1460, GW_LAN_MAC, HOST_MAC));
    assert_eq!(a, Action::Forward(WAN));
    assert_eq!(mss_of(&out), (1300, true), "min(1300, 1500 - 40)");
    // Not a SYN (another connection, picked up mid-stream): the rule does
    // not match, the option stays.
    let (a, out) = send(
        &mut w,
        LAN,
        segment(&key(40_004), 0x10, 1460, GW_LAN_MAC, HOST_MAC),
    );
    assert_eq!(a, Action::Forward(WAN));
    assert_eq!(mss_of(&out), (1460, true));
}

#[test]
fn without_a_rule_nothing_changes() {
    let rules =
        "table inet f { chain fwd { type filter hook forward priority filter; policy accept; } }";
    let mut w = gateway(rules, 1400);
    let (a, out) = send(
        &mut w,
        LAN,
        segment(&key(40_003), 0x02, 1460, GW_LAN_MAC, HOST_MAC),
    );
    assert_eq!(a, Action::Forward(WAN));
    assert_eq!(mss_of(&out), (1460, true));
}

/// A UDP frame from the LAN host with `ttl`, `dscp` and `payload` bytes.
fn udp(sport: u16, ttl: u8, dscp: u8, payload: usize) -> Vec<u8> {
    let k = FlowKey4 {
        proto: proto::UDP,
        sport,
        dport: 53,
        ..key(0)
    };
    let mut b = vec![0u8; 2048];
    let n = sluice_wire::build::build_udp4(&mut b, HOST_MAC, GW_LAN_MAC, &k, payload).unwrap();
    let mut f = b[..n].to_vec();
    f[15] = dscp << 2;
    f[22] = ttl;
    f[24..26].copy_from_slice(&[0, 0]);
    let c = sluice_wire::checksum::checksum(&f[14..34]);
    f[24..26].copy_from_slice(&c.to_be_bytes());
    f
}

#[test]
fn ip_header_fields_reach_the_rules_with_the_forward_ttl() {
    let rules = "table inet f {
  chain fwd { type filter hook forward priority filter; policy accept;
    ip ttl 7 drop
    ip length > 1000 drop
    ip dscp { cs1, af41 } drop
  }
  chain pre { type filter hook prerouting priority filter; policy accept;
    ip ttl 5 drop
  }
}";
    let mut w = gateway(rules, 1500);
    let cases = [
        // The forward hook sees the TTL less one: 8 arrives as 7.
        (
            udp(1, 8, 0, 10),
            Action::Drop(sluice_engine::DropReason::PolicyDrop),
        ),
        (udp(2, 7, 0, 10), Action::Forward(WAN)),
        (udp(3, 9, 0, 10), Action::Forward(WAN)),
        // Prerouting sees it as received.
        (
            udp(4, 5, 0, 10),
            Action::Drop(sluice_engine::DropReason::PolicyDrop),
        ),
        // IP total length 20 + 8 + payload.
        (
            udp(5, 64, 0, 973),
            Action::Drop(sluice_engine::DropReason::PolicyDrop),
        ),
        (udp(6, 64, 0, 972), Action::Forward(WAN)),
        (
            udp(7, 64, 34, 10),
            Action::Drop(sluice_engine::DropReason::PolicyDrop),
        ),
        (
            udp(8, 64, 8, 10),
            Action::Drop(sluice_engine::DropReason::PolicyDrop),
        ),
        (udp(9, 64, 46, 10), Action::Forward(WAN)),
    ];
    for (i, (f, want)) in cases.into_iter().enumerate() {
        let (a, _) = send(&mut w, LAN, f);
        assert_eq!(a, want, "case {i}");
    }
}

/// `fib daddr type local` (iptables `-m addrtype --dst-type LOCAL`, as in
/// Docker's port publishing): a packet to the gateway's own address is
/// DNATed onward, and the forward hook then sees the new destination as
/// unicast; a packet to another address is not.
#[test]
fn fib_daddr_type_local_before_and_after_dnat() {
    let rules = "table ip nat {
  chain pre { type nat hook prerouting priority dstnat;
    fib daddr type local tcp dport 8080 dnat to 10.0.0.2:80 }
  chain post { type nat hook postrouting priority srcnat; oifname \"wan\" masquerade }
}
table inet f {
  chain fwd { type filter hook forward priority filter; policy accept;
    fib daddr type local drop
    fib saddr type local drop
  }
}";
    let mut w = gateway(rules, 1500);
    let to = |dst: Ipv4Addr, sport: u16| FlowKey4 {
        src: u32::from(REMOTE),
        dst: u32::from(dst),
        sport,
        dport: 8080,
        proto: proto::TCP,
    };
    let (a, out) = send(
        &mut w,
        WAN,
        segment(
            &to(Ipv4Addr::new(203, 0, 113, 1), 1000),
            0x02,
            1460,
            GW_WAN_MAC,
            ROUTER_MAC,
        ),
    );
    assert_eq!(
        a,
        Action::Forward(LAN),
        "to the gateway: DNATed and forwarded"
    );
    assert_eq!(&out[30..34], &HOST.octets(), "to the DNAT target");
    // Not one of the gateway's addresses: no DNAT, routed back out of the
    // WAN (and not dropped: neither address is local).
    let (a, out) = send(
        &mut w,
        WAN,
        segment(
            &to(Ipv4Addr::new(198, 51, 100, 7), 1001),
            0x02,
            1460,
            GW_WAN_MAC,
            ROUTER_MAC,
        ),
    );
    assert_eq!(a, Action::Forward(WAN));
    assert_eq!(&out[30..34], &[198, 51, 100, 7]);
}

/// `ct mark set` marks the connection, not the packet: the reply sees it
/// (and the packet mark, which is the packet's own, is not kept); set on
/// an established packet, it stays for the next one.
#[test]
fn ct_mark_set_is_kept_by_the_connection() {
    let rules = "table inet f {
  chain fwd { type filter hook forward priority filter; policy drop;
    ct state new ct mark set 0x5 meta mark set 0x9 accept
    ct state established ct mark 0x5 meta mark 0 ct mark set 0x6 accept
    ct state established ct mark 0x6 accept
  }
}";
    let mut w = gateway(rules, 1500);
    let k = key(41_000);
    let (a, out) = send(&mut w, LAN, segment(&k, 0x02, 1460, GW_LAN_MAC, HOST_MAC));
    assert_eq!(a, Action::Forward(WAN));
    let back = reply_to(&out);
    // The SYN-ACK: ct mark 5, packet mark 0 (second rule, which sets 6).
    let (a, _) = send(
        &mut w,
        WAN,
        segment(&back, 0x12, 1460, GW_WAN_MAC, ROUTER_MAC),
    );
    assert_eq!(a, Action::Forward(LAN));
    // The ACK: ct mark 6 now (third rule).
    let (a, _) = send(&mut w, LAN, segment(&k, 0x10, 1460, GW_LAN_MAC, HOST_MAC));
    assert_eq!(a, Action::Forward(WAN));
    assert_eq!(ct_marks(&w), vec![6]);
}

/// Connmark save and restore: the first packet's mark is saved to the
/// connection; the reply restores it into its own packet mark.
#[test]
fn connmark_saves_and_restores_the_mark() {
    let rules = "table inet f {
  chain fwd { type filter hook forward priority filter; policy drop;
    ct state new meta mark set 0x3 ct mark set meta mark accept
    ct state established meta mark set ct mark
    meta mark 0x3 accept
  }
}";
    let mut w = gateway(rules, 1500);
    let k = key(42_000);
    let (a, out) = send(&mut w, LAN, segment(&k, 0x02, 1460, GW_LAN_MAC, HOST_MAC));
    assert_eq!(a, Action::Forward(WAN));
    let back = reply_to(&out);
    let (a, _) = send(
        &mut w,
        WAN,
        segment(&back, 0x12, 1460, GW_WAN_MAC, ROUTER_MAC),
    );
    assert_eq!(
        a,
        Action::Forward(LAN),
        "the restored mark accepts the reply"
    );
    assert_eq!(ct_marks(&w), vec![3]);
}

/// `ether saddr` sees the frame's source MAC, on the first packet and on
/// established ones.
#[test]
fn ether_saddr_matches_the_frame() {
    let rules = "table inet f {
  chain fwd { type filter hook forward priority filter; policy accept;
    ether saddr 02:00:00:00:09:09 udp dport 7 drop
  }
}";
    let mut w = gateway(rules, 1500);
    let (a, _) = send(&mut w, LAN, udp(2000, 64, 0, 10));
    assert_eq!(a, Action::Forward(WAN), "dport 53");
    let mut f = udp(2001, 64, 0, 10);
    f[36..38].copy_from_slice(&7u16.to_be_bytes());
    f[40..42].copy_from_slice(&[0, 0]);
    let (a, _) = send(&mut w, LAN, f.clone());
    assert_eq!(
        a,
        Action::Drop(sluice_engine::DropReason::PolicyDrop),
        "HOST_MAC, dport 7"
    );
    f[6..12].copy_from_slice(&[2, 0, 0, 0, 9, 8]);
    let (a, _) = send(&mut w, LAN, f);
    assert_eq!(a, Action::Forward(WAN), "another source MAC");
}

/// `ct direction`: the reply of a connection is `reply`, its original
/// direction `original`.
#[test]
fn ct_direction_tells_replies_apart() {
    let rules = "table inet f {
  chain fwd { type filter hook forward priority filter; policy accept;
    ct state established ct direction reply tcp flags & (syn|ack) == ack drop
  }
}";
    let mut w = gateway(rules, 1500);
    let k = key(43_000);
    let (a, out) = send(&mut w, LAN, segment(&k, 0x02, 1460, GW_LAN_MAC, HOST_MAC));
    assert_eq!(a, Action::Forward(WAN));
    let back = reply_to(&out);
    let (a, _) = send(
        &mut w,
        WAN,
        segment(&back, 0x12, 1460, GW_WAN_MAC, ROUTER_MAC),
    );
    assert_eq!(a, Action::Forward(LAN), "SYN-ACK: not a bare ACK");
    let (a, _) = send(&mut w, LAN, segment(&k, 0x10, 1460, GW_LAN_MAC, HOST_MAC));
    assert_eq!(a, Action::Forward(WAN), "original direction");
    let (a, _) = send(
        &mut w,
        WAN,
        segment(&back, 0x10, 1460, GW_WAN_MAC, ROUTER_MAC),
    );
    assert_eq!(
        a,
        Action::Drop(sluice_engine::DropReason::PolicyDrop),
        "a reply ACK"
    );
}

/// Reverse-path filtering: `fib saddr . iif oif missing drop` drops a LAN
/// packet whose source routes back through the WAN (spoofed); the loose
/// form `fib saddr oif missing` accepts it (the default route covers it).
#[test]
fn fib_saddr_iif_oif_is_a_strict_reverse_path_check() {
    let strict = "table inet f {
  chain raw { type filter hook prerouting priority raw; policy accept;
    fib saddr . mark . iif oif missing drop
  }
}";
    let loose = "table inet f {
  chain raw { type filter hook prerouting priority raw; policy accept;
    fib saddr oif missing drop
  }
}";
    let spoofed = |sport| {
        let mut f = udp(sport, 64, 0, 10);
        f[26..30].copy_from_slice(&[192, 0, 2, 99]);
        f[24..26].copy_from_slice(&[0, 0]);
        let c = sluice_wire::checksum::checksum(&f[14..34]);
        f[24..26].copy_from_slice(&c.to_be_bytes());
        f[40..42].copy_from_slice(&[0, 0]);
        f
    };
    let mut w = gateway(strict, 1500);
    let (a, _) = send(&mut w, LAN, udp(3000, 64, 0, 10));
    assert_eq!(
        a,
        Action::Forward(WAN),
        "10.0.0.2 routes back through the LAN"
    );
    let (a, _) = send(&mut w, LAN, spoofed(3001));
    assert_eq!(
        a,
        Action::Drop(sluice_engine::DropReason::PolicyDrop),
        "spoofed"
    );
    let mut w = gateway(loose, 1500);
    let (a, _) = send(&mut w, LAN, spoofed(3002));
    assert_eq!(
        a,
        Action::Forward(WAN),
        "loose: the default route is a route"
    );
}

/// A byte quota ahead of the `ct state` rule counts every packet of the
/// connection (the filter chain runs per packet) and drops once it is
/// exceeded: 100-byte packets under `quota over 1000 bytes`, ten pass.
#[test]
fn a_quota_ahead_of_ct_state_counts_established_packets() {
    let rules = "table ip f {
  chain fwd { type filter hook forward priority filter; policy drop;
    udp dport 53 quota over 1000 bytes drop
    ct state established,related accept
    udp dport 53 accept
  }
}";
    let mut w = gateway(rules, 1500);
    let verdicts: Vec<Action> = (0..12)
        .map(|_| send(&mut w, LAN, udp(7, 64, 0, 72)).0)
        .collect();
    let passed = verdicts
        .iter()
        .filter(|a| matches!(a, Action::Forward(_)))
        .count();
    assert_eq!(passed, 10, "{verdicts:?}");
}

/// Sends `f` on `iif` at `now_ns`; the action and the frame afterwards.
fn send_at(w: &mut Worker, iif: IfIndex, f: Vec<u8>, now_ns: u64) -> (Action, Vec<u8>) {
    let len = f.len();
    let mut buf = f;
    buf.resize(2048, 0);
    let mut b = Batch {
        bufs: vec![buf],
        lens: vec![len],
        iifs: vec![iif],
        acts: vec![Action::Pending],
    };
    w.process(now_ns, &mut b);
    let n = b.lens[0];
    (b.acts[0], b.bufs[0][..n].to_vec())
}

/// `-m connlimit --connlimit-above 2` as nft writes it: at most two open
/// connections per source. The engine tells the policy which connections
/// it created and which ended (a TCP reset, expiry, a flush), and a first
/// packet the rule dropped stops counting a millisecond later.
#[test]
fn ct_count_in_a_set_element_limits_open_connections_per_source() {
    let rules = "table ip f {
  set per_src { type ipv4_addr; flags dynamic; }
  chain fwd { type filter hook forward priority filter; policy drop;
    ct state established,related accept
    tcp flags syn add @per_src { ip saddr ct count over 2 } drop
    iifname \"lan\" accept
  }
}";
    let mut w = gateway(rules, 1500);
    let ms = 1_000_000u64;
    let syn = |p| segment(&key(p), 0x02, 1460, GW_LAN_MAC, HOST_MAC);
    let fwd = Action::Forward(WAN);
    assert_eq!(send_at(&mut w, LAN, syn(1000), ms).0, fwd);
    assert_eq!(send_at(&mut w, LAN, syn(1001), ms).0, fwd);
    assert!(matches!(
        send_at(&mut w, LAN, syn(1002), ms).0,
        Action::Drop(_)
    ));
    // A retransmitted SYN of an open connection is not a new one.
    assert_eq!(send_at(&mut w, LAN, syn(1000), ms).0, fwd);
    // The client resets connection 1000: it no longer counts. 1002 was
    // dropped, so from the next millisecond it does not count either.
    let rst = segment(&key(1000), 0x04, 1460, GW_LAN_MAC, HOST_MAC);
    assert_eq!(send_at(&mut w, LAN, rst, 2 * ms).0, fwd);
    assert_eq!(send_at(&mut w, LAN, syn(1003), 3 * ms).0, fwd);
    assert!(matches!(
        send_at(&mut w, LAN, syn(1004), 3 * ms).0,
        Action::Drop(_)
    ));
    // Unanswered SYNs expire (SYN_SENT, 120 s): the GC ends them.
    let later = 3 * ms + 121_000 * ms;
    assert!(w.gc(later, 1000) >= 2);
    assert_eq!(send_at(&mut w, LAN, syn(1005), later).0, fwd);
    assert_eq!(send_at(&mut w, LAN, syn(1006), later).0, fwd);
    assert!(matches!(
        send_at(&mut w, LAN, syn(1007), later).0,
        Action::Drop(_)
    ));
    // A flush ends every connection.
    w.flush();
    assert_eq!(send_at(&mut w, LAN, syn(1008), later + ms).0, fwd);
    assert_eq!(send_at(&mut w, LAN, syn(1009), later + ms).0, fwd);
    assert!(matches!(
        send_at(&mut w, LAN, syn(1010), later + ms).0,
        Action::Drop(_)
    ));
}

/// `reject` answers the sender as the kernel's does: a TCP reset for
/// `reject with tcp reset` (RST+ACK acknowledging a SYN and its data), an ICMP
/// destination unreachable with the rule's code otherwise (port
/// unreachable by default), sent back out of the ingress interface to the
/// frame's source; the packet counts as `policy-reject`.
#[test]
fn reject_answers_with_a_reset_or_an_icmp_unreachable() {
    let rules = "table ip f {
  chain fwd { type filter hook forward priority filter; policy accept;
    tcp dport 443 reject with tcp reset
    udp dport 53 reject
    tcp dport 444 reject with icmp type admin-prohibited
  }
}";
    let mut w = gateway(rules, 1500);
    let k = key(40_000);
    let (a, out) = send(&mut w, LAN, segment(&k, 0x02, 1460, GW_LAN_MAC, HOST_MAC));
    assert_eq!(a, Action::Reply);
    assert_eq!(&out[0..6], &HOST_MAC, "back to the sender's MAC");
    assert_eq!(&out[6..12], &GW_LAN_MAC);
    let ip = &out[14..34];
    assert_eq!(
        (ip[9], &ip[12..16], &ip[16..20]),
        (6, &[192, 0, 2, 80][..], &[10, 0, 0, 2][..])
    );
    let t = tcp::Packet::new_unchecked(&out[34..54]);
    assert_eq!((t.src_port(), t.dst_port()), (443, 40_000));
    // `segment` carries 6 bytes of data (the minimum frame's padding,
    // counted in its IP length): the SYN, seq 1000, is acknowledged with
    // 1000 + 1 + 6.
    assert_eq!(
        (t.seq_number(), t.ack_number(), out[34 + 13]),
        (0, 1007, 0x14)
    );
    assert!(t.verify_checksum(&IpPair::V4 {
        src: u32::from(REMOTE),
        dst: u32::from(HOST)
    }));
    assert_eq!(w.counters().tcp_resets, 1);

    let (a, out) = send(&mut w, LAN, udp(5000, 64, 0, 20));
    assert_eq!(a, Action::Reply);
    // ICMP type 3 code 3 from the gateway's LAN address, quoting the
    // datagram.
    assert_eq!(
        (out[14 + 9], &out[26..30], &out[30..34]),
        (1, &[10, 0, 0, 1][..], &[10, 0, 0, 2][..])
    );
    assert_eq!((out[34], out[35]), (3, 3));
    assert_eq!(
        &out[34 + 8 + 12..34 + 8 + 20],
        &[10, 0, 0, 2, 192, 0, 2, 80]
    );

    let mut k2 = key(40_001);
    k2.dport = 444;
    let (a, out) = send(&mut w, LAN, segment(&k2, 0x02, 1460, GW_LAN_MAC, HOST_MAC));
    assert_eq!(a, Action::Reply);
    assert_eq!((out[34], out[35]), (3, 13));
    assert_eq!(
        w.counters()
            .drops_for(sluice_engine::DropReason::PolicyReject),
        3
    );
    assert_eq!(w.counters().icmp_errors, 2);
}

/// kube-proxy's Service load balancing (`-m statistic --mode random`, read
/// as `numgen random`) through the engine: each new connection to the
/// Service address is DNATed to one of three endpoints, about a third
/// each; a connection keeps its endpoint.
#[test]
fn numgen_random_spreads_new_connections_over_dnat_endpoints() {
    let rules = "table ip nat {
  chain pre { type nat hook prerouting priority dstnat; policy accept;
    ip daddr 192.0.2.80 tcp dport 443 jump svc
  }
  chain svc {
    numgen random mod 2147483648 < 715827883 jump sep_a
    numgen random mod 2147483648 < 1073741824 jump sep_b
    jump sep_c
  }
  chain sep_a { dnat to 198.18.0.1:8443 }
  chain sep_b { dnat to 198.18.0.2:8443 }
  chain sep_c { dnat to 198.18.0.3:8443 }
}";
    let mut w = gateway(rules, 1500);
    let mut per = std::collections::HashMap::new();
    for sport in 0..3000u16 {
        let (a, out) = send(
            &mut w,
            LAN,
            segment(&key(10_000 + sport), 0x02, 1460, GW_LAN_MAC, HOST_MAC),
        );
        assert_eq!(a, Action::Forward(WAN));
        *per.entry(out[33]).or_insert(0u32) += 1;
    }
    assert_eq!(per.len(), 3, "{per:?}");
    for (ep, n) in &per {
        assert!(
            (850..1150).contains(n),
            "endpoint .{ep}: {n} of 3000: {per:?}"
        );
    }
    // A later packet of a connection goes where its first went (not drawn
    // again: NAT rules see only a connection's first packet).
    for sport in [20_000, 20_001, 20_002] {
        let (_, first) = send(
            &mut w,
            LAN,
            segment(&key(sport), 0x02, 1460, GW_LAN_MAC, HOST_MAC),
        );
        // Retransmissions of the SYN: the same connection.
        for _ in 0..5 {
            let (a, again) = send(
                &mut w,
                LAN,
                segment(&key(sport), 0x02, 1460, GW_LAN_MAC, HOST_MAC),
            );
            assert_eq!(a, Action::Forward(WAN));
            assert_eq!(first[30..34], again[30..34]);
        }
    }
}

/// `ct timeout set`: a new connection follows the policy of its protocol
/// that its first packet met last (a policy of the other protocol is
/// ignored), its first expiry included; a packet of an established
/// connection changes nothing (the kernel gives a policy to unconfirmed
/// connections only); a connection no policy named keeps the defaults.
#[test]
fn ct_timeout_set_gives_new_connections_their_policy() {
    let rules = "table inet f {
  ct timeout sip { protocol udp; policy = { unreplied: 7, replied: 90 } }
  ct timeout web { protocol tcp; policy = { syn_sent: 4, established: 3600 } }
  chain pre { type filter hook prerouting priority filter;
    udp dport 53 ct timeout set \"sip\"
    ct timeout set \"web\"
  }
  chain fwd { type filter hook forward priority filter; policy accept;
    ct state established ct timeout set \"sip\"
  }
}";
    let mut w = gateway(rules, 1500);
    let at = |ms: u64| sluice_conntrack::Instant::from_millis(ms);
    let left = |w: &Worker, sport: u16, now: u64| -> u64 {
        let (_, e) = w
            .conntrack()
            .iter()
            .find(|(_, e)| e.orig().sport == sport)
            .expect("a connection");
        e.expires_in(at(now)).as_secs()
    };
    // UDP to port 53: the UDP policy, not undone by the TCP one after it.
    let (a, out) = send_at(&mut w, LAN, udp(40_000, 64, 0, 20), 1_000_000);
    assert_eq!(a, Action::Forward(WAN));
    assert_eq!(left(&w, 40_000, 1), 7);
    // Its reply and the next packet: the policy's stream timer.
    let back = FlowKey4 {
        proto: proto::UDP,
        sport: 53,
        ..reply_to(&out)
    };
    let mut b = vec![0u8; 2048];
    let n = sluice_wire::build::build_udp4(&mut b, ROUTER_MAC, GW_WAN_MAC, &back, 20).unwrap();
    let (a, _) = send_at(&mut w, WAN, b[..n].to_vec(), 2_000_000);
    assert_eq!(a, Action::Forward(LAN));
    assert_eq!(left(&w, 40_000, 2), 7, "replied: still the first timer");
    send_at(&mut w, LAN, udp(40_000, 64, 0, 20), 3_000_000);
    assert_eq!(left(&w, 40_000, 3), 90);

    // UDP to another port: only the TCP policy met, so the defaults; the
    // established packets meet `ct timeout set "sip"` too late.
    let other = |sport| {
        let mut f = udp(sport, 64, 0, 20);
        f[36..38].copy_from_slice(&99u16.to_be_bytes());
        f[40..42].copy_from_slice(&[0, 0]); // UDP checksum 0: none
        f
    };
    let (a, out) = send_at(&mut w, LAN, other(40_001), 1_000_000);
    assert_eq!(a, Action::Forward(WAN));
    assert_eq!(left(&w, 40_001, 1), 30);
    let back = FlowKey4 {
        proto: proto::UDP,
        sport: 99,
        ..reply_to(&out)
    };
    let n = sluice_wire::build::build_udp4(&mut b, ROUTER_MAC, GW_WAN_MAC, &back, 20).unwrap();
    send_at(&mut w, WAN, b[..n].to_vec(), 2_000_000);
    send_at(&mut w, LAN, other(40_001), 3_000_000);
    assert_eq!(left(&w, 40_001, 3), 120, "the default stream timer");

    // TCP: the TCP policy from the SYN on.
    let k = key(41_000);
    let (a, out) = send(&mut w, LAN, segment(&k, 0x02, 1460, GW_LAN_MAC, HOST_MAC));
    assert_eq!(a, Action::Forward(WAN));
    assert_eq!(left(&w, 41_000, 1), 4);
    let back = reply_to(&out);
    send(
        &mut w,
        WAN,
        segment(&back, 0x12, 1460, GW_WAN_MAC, ROUTER_MAC),
    );
    assert_eq!(
        left(&w, 41_000, 1),
        60,
        "SYN_RECV: the policy leaves the default"
    );
    send(&mut w, LAN, segment(&k, 0x10, 1460, GW_LAN_MAC, HOST_MAC));
    assert_eq!(left(&w, 41_000, 1), 3600);

    // Across a restart the connections keep their policies: a new worker
    // takes them back, and their next packets refresh to the policy's
    // timers (the UDP stream 90 s, not the default 120 s).
    let saved = w.carried_conns(4_000_000);
    assert_eq!(saved.len(), 3);
    let mut w2 = gateway(rules, 1500);
    for c in &saved {
        w2.restore(4_000_000, c).expect("restored");
    }
    let policy_of = |w: &Worker, sport: u16| {
        w.conntrack()
            .iter()
            .find(|(_, e)| e.orig().sport == sport)
            .map(|(_, e)| e.timeout_policy())
    };
    assert_ne!(policy_of(&w2, 40_000), Some(0));
    assert_eq!(policy_of(&w2, 40_000), policy_of(&w, 40_000));
    assert_eq!(policy_of(&w2, 40_001), Some(0));
    send_at(&mut w2, LAN, udp(40_000, 64, 0, 20), 5_000_000);
    assert_eq!(left(&w2, 40_000, 5), 90);
    send_at(&mut w2, LAN, other(40_001), 5_000_000);
    assert_eq!(left(&w2, 40_001, 5), 120);
}

/// `dnat to A-B`: the engine sends each new connection to the backend the
/// kernel would choose for its client (`DnatRange::pick`, checked against
/// the kernel by the oracle), the same one for every connection of a
/// client.
#[test]
fn dnat_to_a_range_sends_each_client_to_its_backend() {
    let rules = "table ip nat {
  chain pre { type nat hook prerouting priority dstnat;
    iifname \"wan\" tcp dport 8080 dnat to 10.0.0.10-10.0.0.13:80
  }
}";
    let range = sluice_policy::DnatRange {
        lo: Ipv4Addr::new(10, 0, 0, 10),
        hi: Ipv4Addr::new(10, 0, 0, 13),
        persistent: false,
    };
    let gw = Ipv4Addr::new(203, 0, 113, 1);
    let mut w = gateway(rules, 1500);
    for b in 10..=13 {
        w.set_neighbor(Ipv4Addr::new(10, 0, 0, b), [2, 0, 0, 0, 7, b])
            .unwrap();
    }
    let mut chosen = std::collections::BTreeSet::new();
    for (i, client) in [
        Ipv4Addr::new(192, 0, 2, 80),
        Ipv4Addr::new(198, 51, 100, 7),
        Ipv4Addr::new(198, 51, 100, 99),
        Ipv4Addr::new(100, 64, 3, 1),
        Ipv4Addr::new(100, 64, 3, 2),
        Ipv4Addr::new(100, 64, 3, 3),
    ]
    .into_iter()
    .enumerate()
    {
        let want = range.pick(client, gw);
        for n in 0..2u16 {
            let k = FlowKey4 {
                src: u32::from(client),
                dst: u32::from(gw),
                sport: 30_000 + i as u16 * 2 + n,
                dport: 8080,
                proto: proto::TCP,
            };
            let (a, out) = send(&mut w, WAN, segment(&k, 0x02, 1460, GW_WAN_MAC, ROUTER_MAC));
            assert_eq!(a, Action::Forward(LAN), "{client}");
            let to = Ipv4Addr::new(out[30], out[31], out[32], out[33]);
            assert_eq!(to, want, "{client}");
            assert_eq!(&out[36..38], &80u16.to_be_bytes(), "{client}");
            assert_eq!(out[5], want.octets()[3], "the chosen backend's MAC");
        }
        chosen.insert(want);
    }
    assert!(chosen.len() >= 2, "{chosen:?}");
}
