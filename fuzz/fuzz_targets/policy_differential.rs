#![no_main]
//! Differential fuzzing of the compiled classifier on rule sets the nft
//! grammar produces: whatever parses and compiles, every packet traced
//! through it visits the same chains and rules and gets the same verdict
//! from the compiled classifier as from the linear reference evaluator
//! (`Trace::mismatch`; with debug assertions the trace itself panics), and
//! nothing panics.
//!
//! Input: the rule set's text, then a 0 byte, then packets of 8 bytes each
//! (protocol, addresses, ports, interfaces, ct state, hook, mark, TCP
//! flags drawn from small pools, so that they meet the rule sets' values).
use libfuzzer_sys::fuzz_target;

const ADDRS: [&str; 8] = [
    "10.0.0.1",
    "10.0.0.2",
    "10.1.2.3",
    "192.168.1.10",
    "192.0.2.1",
    "198.51.100.7",
    "203.0.113.9",
    "172.16.5.4",
];
const ADDRS6: [&str; 4] = ["2001:db8::1", "2001:db8::2", "fe80::1", "2001:db8:1::10"];
const PORTS: [u16; 16] = [
    22, 53, 80, 123, 443, 1023, 1024, 1234, 3128, 5201, 8080, 8443, 10000, 40000, 50000, 65535,
];
const IFACES: [&str; 6] = ["eth0", "eth1", "wan0", "lan0", "lo", "veth9"];
const CT: [&str; 5] = ["new", "established", "related", "invalid", "untracked"];
const HOOKS: [&str; 5] = ["prerouting", "input", "forward", "output", "postrouting"];
const PROTOS: [&str; 6] = ["tcp", "udp", "icmp", "tcp", "udp", "sctp"];
const FLAGS: [&str; 4] = ["S", "SA", "A", "FA"];

fn packet_spec(b: &[u8]) -> String {
    let g = |i: usize| usize::from(b.get(i).copied().unwrap_or(0));
    let proto = PROTOS[g(0) % PROTOS.len()];
    let v6 = g(0) & 0x80 != 0;
    let (src, dst) = if v6 {
        (ADDRS6[g(1) % 4], ADDRS6[(g(1) >> 2) % 4])
    } else {
        (ADDRS[g(1) % 8], ADDRS[(g(1) >> 3) % 8])
    };
    let (sp, dp) = (PORTS[g(2) % 16], PORTS[(g(2) >> 4) % 16]);
    let ep = |a: &str, p: u16| {
        if proto == "icmp" {
            a.to_string()
        } else if v6 {
            format!("[{a}]:{p}")
        } else {
            format!("{a}:{p}")
        }
    };
    let proto = if v6 && proto == "icmp" {
        "icmpv6"
    } else {
        proto
    };
    let mut s = format!(
        "{proto} {} > {} iif {} oif {} ct {} hook {} mark {}",
        ep(src, sp),
        ep(dst, dp),
        IFACES[g(3) % 6],
        IFACES[(g(3) >> 3) % 6],
        CT[g(4) % 5],
        HOOKS[(g(4) >> 3) % 5],
        g(5) % 4,
    );
    if proto == "tcp" {
        s.push_str(" flags ");
        s.push_str(FLAGS[g(6) % 4]);
    }
    if proto.starts_with("icmp") {
        s.push_str(&format!(
            " type {} code 0",
            [0, 3, 8, 11, 128, 129][g(6) % 6]
        ));
    }
    s.push_str(&format!(" ttl {}", 1 + g(7) % 64));
    s
}

fuzz_target!(|data: &[u8]| {
    let (text, pkts) = match data.iter().position(|b| *b == 0) {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &[][..]),
    };
    let Ok(text) = std::str::from_utf8(text) else {
        return;
    };
    let Ok(rs) = sluice_ruleset::parse_nft_str("fuzz.nft", text) else {
        return;
    };
    let ifaces = sluice_policy::Interfaces::from_ruleset(&rs);
    let Ok(policy) = sluice_policy::CompiledPolicy::compile(&rs, &ifaces) else {
        return;
    };
    let mut n = 0;
    for c in pkts.chunks(8).take(64) {
        let Ok(p) = sluice_policy::TracePacket::parse(&packet_spec(c)) else {
            continue;
        };
        let t = policy.trace(&p);
        assert!(t.mismatch.is_none(), "{:?}", t.mismatch);
        n += 1;
    }
    // Without packets, a few fixed ones.
    if n == 0 {
        for i in 0u8..8 {
            let b = [37, 11, 53, 1, 7, 1, 1, 1].map(|k: u8| k.wrapping_mul(i));
            if let Ok(p) = sluice_policy::TracePacket::parse(&packet_spec(&b)) {
                let t = policy.trace(&p);
                assert!(t.mismatch.is_none(), "{:?}", t.mismatch);
            }
        }
    }
});
