//! AF_PACKET backend against a real veth pair in a private namespace.
mod common;

use std::time::Duration;

use common::*;
use sluice_io::rawsock::RawSocket;
use sluice_io::{
    open, AfPacketConfig, AfPacketPort, Backend, Batch, FrameMeta, OpenOptions, Port, RxRing,
};

const N: u32 = 1000;

fn transmit_test_frames(port: &mut dyn Port, n: u32, len: usize) {
    let mut batch = Batch::new();
    let mut s = 0;
    while s < n {
        batch.clear();
        let k = (n - s).min(200);
        for j in 0..k {
            assert!(batch.push_copy(&test_frame(s + j, len), FrameMeta::default()));
        }
        let which: Vec<u16> = (0..k as u16).collect();
        let mut done = 0;
        while done < which.len() {
            done += port.tx_batch(&mut batch, &which[done..]);
            port.flush().unwrap();
        }
        s += k;
        std::thread::sleep(Duration::from_millis(2));
    }
}

#[test]
#[ignore = "needs root + netns; run by .ci/run with --ignored"]
fn afpacket_receives_frames_sent_by_peer() {
    let net = TestNet::new("pkt-rx", &["v"]);
    net.run(|| {
        let mut port = AfPacketPort::open("v0", 7, &AfPacketConfig::default()).unwrap();
        let raw = RawSocket::open("v1").unwrap();
        send_frames(&raw, N, 100);
        let mut batch = Batch::new();
        // Metadata: our port id and a kernel timestamp close to now.
        let t0 = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64;
        let mut seen = Vec::new();
        let end = std::time::Instant::now() + Duration::from_secs(5);
        while seen.len() < N as usize && std::time::Instant::now() < end {
            let n = port.rx_batch(&mut batch);
            for i in 0..n {
                let m = batch.meta(i).unwrap();
                assert_eq!(m.port, 7);
                assert!(
                    m.timestamp_ns.abs_diff(t0) < 60_000_000_000,
                    "timestamp {m:?}"
                );
                if let Some(s) = batch.data(i).and_then(parse_test_frame) {
                    seen.push(s);
                }
            }
            batch.clear();
            if n == 0 {
                sluice_io::wait_readable(&port, 10).unwrap();
            }
        }
        assert_all_in_order(&seen, N, "AF_PACKET rx");
        let st = port.stats();
        assert!(st.rx_frames >= u64::from(N));
        assert_eq!(st.rx_kernel_drops, 0);
    });
}

/// The frame-based TPACKET_V2 receive ring: every frame arrives, in order,
/// with its length and metadata, through many wraps of a 64-frame ring
/// (sent in chunks of 40, each read before the next is sent).
#[test]
#[ignore = "needs root + netns; run by .ci/run with --ignored"]
fn afpacket_v2_ring_receives_every_frame_across_wraps() {
    let net = TestNet::new("pkt-v2", &["v"]);
    net.run(|| {
        let cfg = AfPacketConfig {
            rx_ring: RxRing::V2,
            rx_block_size: 1 << 16,
            rx_block_nr: 2,
            ..Default::default()
        };
        let mut port = AfPacketPort::open("v0", 3, &cfg).unwrap();
        assert!(
            port.describe().contains("rx TPACKET_V2"),
            "{}",
            port.describe()
        );
        let raw = RawSocket::open("v1").unwrap();
        let mut batch = Batch::new();
        let mut seen = Vec::new();
        for chunk in 0..25u32 {
            for j in 0..40 {
                raw.send(&test_frame(chunk * 40 + j, 60 + (j as usize % 7) * 100))
                    .expect("raw send");
            }
            let want = (chunk + 1) as usize * 40;
            let end = std::time::Instant::now() + Duration::from_secs(5);
            while seen.len() < want && std::time::Instant::now() < end {
                let n = port.rx_batch(&mut batch);
                for i in 0..n {
                    assert_eq!(batch.meta(i).unwrap().port, 3);
                    let d = batch.data(i).unwrap();
                    if let Some(seq) = parse_test_frame(d) {
                        assert_eq!(d.len(), 60 + (seq as usize % 40 % 7) * 100);
                        seen.push(seq);
                    }
                }
                batch.clear();
                if n == 0 {
                    sluice_io::wait_readable(&port, 10).unwrap();
                }
            }
        }
        assert_all_in_order(&seen, 1000, "AF_PACKET V2 rx");
        assert_eq!(port.stats().rx_kernel_drops, 0);
    });
}

#[test]
#[ignore = "needs root + netns; run by .ci/run with --ignored"]
fn afpacket_transmits_frames_to_peer() {
    let net = TestNet::new("pkt-tx", &["v"]);
    net.run(|| {
        let mut port = AfPacketPort::open("v0", 0, &AfPacketConfig::default()).unwrap();
        let raw = RawSocket::open("v1").unwrap();
        transmit_test_frames(&mut port, N, 128);
        let seen = raw_receive(&raw, N as usize, Duration::from_secs(5));
        assert_all_in_order(&seen, N, "AF_PACKET tx");
        let st = port.stats();
        assert_eq!(st.tx_frames, u64::from(N));
        assert_eq!(st.tx_errors, 0);
        // One kick per tx_batch, not per frame.
        assert!(st.tx_kicks <= u64::from(N) / 50, "kicks {}", st.tx_kicks);
    });
}

#[test]
#[ignore = "needs root + netns; run by .ci/run with --ignored"]
fn afpacket_forwards_between_two_interfaces_with_rewrite() {
    let net = TestNet::new("pkt-fwd", &["a", "b"]);
    net.run(|| {
        let mut a = AfPacketPort::open("a0", 0, &AfPacketConfig::default()).unwrap();
        let mut b = AfPacketPort::open("b0", 1, &AfPacketConfig::default()).unwrap();
        let src = RawSocket::open("a1").unwrap();
        let dst = RawSocket::open("b1").unwrap();
        send_frames(&src, N, 200);
        let mut batch = Batch::new();
        let mut fwd = 0;
        let end = std::time::Instant::now() + Duration::from_secs(5);
        let mut which = Vec::new();
        while fwd < N as usize && std::time::Instant::now() < end {
            let n = a.rx_batch(&mut batch);
            which.clear();
            for i in 0..n {
                // In-place rewrite: the source MAC, as a router would.
                let d = batch.data_mut(i).unwrap();
                if d[12..14] == TEST_ETHERTYPE.to_be_bytes() {
                    d[6..12].copy_from_slice(&[0x02, 0, 0, 0, 0, 0x01]);
                    which.push(i as u16);
                }
            }
            fwd += b.tx_batch(&mut batch, &which);
            batch.clear();
            if n == 0 {
                sluice_io::wait_readable(&a, 10).unwrap();
            }
        }
        let seen = raw_receive(&dst, N as usize, Duration::from_secs(5));
        assert_all_in_order(&seen, N, "AF_PACKET a0 -> b0");
    });
}

#[test]
#[ignore = "needs root + netns; run by .ci/run with --ignored"]
fn afpacket_cbpf_fanout_steers_by_destination_port() {
    use sluice_io::steer::{owner_of, Steer, SteerKey};
    let net = TestNet::new("pkt-cbpf", &["v"]);
    net.run(|| {
        let workers = 3u16;
        let cfg = AfPacketConfig {
            fanout_group: Some(4243),
            steer: Some(Steer {
                key: SteerKey::Destination,
                workers,
            }),
            ..AfPacketConfig::default()
        };
        let mut ports: Vec<AfPacketPort> = (0..workers)
            .map(|_| AfPacketPort::open("v0", 0, &cfg).unwrap())
            .collect();
        assert!(ports[0].describe().contains("fanout cbpf group 4243"));
        let raw = RawSocket::open("v1").unwrap();
        // UDP and TCP frames to 60 destination ports; the kernel's verdict
        // must be the owner of each destination port.
        for f in 0..60u16 {
            let mut fr = vec![0u8; 60];
            fr[0..6].copy_from_slice(&[0x02, 0, 0, 0, 0, 0x02]);
            fr[6..12].copy_from_slice(&[0x02, 0, 0, 0, 0, 0x01]);
            fr[12..14].copy_from_slice(&[0x08, 0x00]);
            fr[14] = 0x45;
            fr[16..18].copy_from_slice(&46u16.to_be_bytes());
            fr[22] = 64;
            fr[23] = if f % 2 == 0 { 17 } else { 6 };
            fr[26..30].copy_from_slice(&[10, 9, 0, 1]);
            fr[30..34].copy_from_slice(&[10, 9, 0, 2]);
            fr[34..36].copy_from_slice(&443u16.to_be_bytes());
            fr[36..38].copy_from_slice(&(20000 + f).to_be_bytes());
            raw.send(&fr).unwrap();
        }
        let mut seen = 0;
        for (w, p) in ports.iter_mut().enumerate() {
            let mut b = Batch::new();
            for _ in 0..40 {
                let n = p.rx_batch(&mut b);
                for i in 0..n {
                    let Some(d) = b.data(i) else { continue };
                    if d.len() < 38 || d[12..14] != [8, 0] {
                        continue;
                    }
                    let dport = u16::from_be_bytes([d[36], d[37]]);
                    assert_eq!(
                        usize::from(owner_of(dport, workers)),
                        w,
                        "dport {dport} reached worker {w}"
                    );
                    seen += 1;
                }
                b.clear();
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        assert_eq!(seen, 60, "each frame reaches exactly its owner");
    });
}

/// IPv6 through the kernel's cBPF fanout: every frame reaches exactly the
/// worker `steer::worker_for` names (by the addresses, an ICMPv6 error by
/// the quoted ones, NDP to worker 0), and the IPv6 frames are spread over
/// all three workers.
#[test]
#[ignore = "needs root + netns; run by .ci/run with --ignored"]
fn afpacket_cbpf_fanout_spreads_ipv6_by_addresses() {
    use sluice_io::steer::{worker_for, Steer, SteerKey};
    let net = TestNet::new("pkt-cbpf6", &["v"]);
    net.run(|| {
        let workers = 3u16;
        let steer = Steer {
            key: SteerKey::Source,
            workers,
        };
        let cfg = AfPacketConfig {
            fanout_group: Some(4244),
            steer: Some(steer),
            ..AfPacketConfig::default()
        };
        let mut ports: Vec<AfPacketPort> = (0..workers)
            .map(|_| AfPacketPort::open("v0", 0, &cfg).unwrap())
            .collect();
        let raw = RawSocket::open("v1").unwrap();
        let sent = ipv6_steering_frames(1);
        for f in &sent {
            raw.send(f).unwrap();
        }
        let mut got = vec![Vec::new(); sent.len()];
        for (w, p) in ports.iter_mut().enumerate() {
            let mut b = Batch::new();
            for _ in 0..40 {
                let n = p.rx_batch(&mut b);
                for i in 0..n {
                    let Some(d) = b.data(i) else { continue };
                    if let Some(k) = sent.iter().position(|f| f[..] == d[..]) {
                        got[k].push(w);
                    }
                }
                b.clear();
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        let mut used = [false; 3];
        for (f, at) in sent.iter().zip(&got) {
            let want = usize::from(worker_for(steer, &f[14..]));
            assert_eq!(at, &[want], "frame {f:02x?}");
            used[want] = true;
            if f[20] == 58 && (f[54] == 135 || f[54] == 136) {
                assert_eq!(want, 0, "NDP to worker 0");
            }
        }
        assert_eq!(used, [true; 3], "IPv6 spread over every worker");
    });
}

#[test]
#[ignore = "needs root + netns; run by .ci/run with --ignored"]
fn afpacket_fanout_splits_flows_between_two_workers() {
    let net = TestNet::new("pkt-fanout", &["v"]);
    net.run(|| {
        let cfg = AfPacketConfig {
            fanout_group: Some(4242),
            ..AfPacketConfig::default()
        };
        let mut w0 = AfPacketPort::open("v0", 0, &cfg).unwrap();
        let mut w1 = AfPacketPort::open("v0", 0, &cfg).unwrap();
        assert!(w0.describe().contains("fanout hash group 4242"));
        let raw = RawSocket::open("v1").unwrap();
        // IPv4/UDP frames with 64 different source ports: 64 flows.
        let flows = 64u16;
        for f in 0..flows {
            let mut fr = vec![0u8; 60];
            fr[0..6].copy_from_slice(&[0x02, 0, 0, 0, 0, 0x02]);
            fr[6..12].copy_from_slice(&[0x02, 0, 0, 0, 0, 0x01]);
            fr[12..14].copy_from_slice(&[0x08, 0x00]);
            fr[14] = 0x45;
            fr[16..18].copy_from_slice(&46u16.to_be_bytes());
            fr[22] = 64;
            fr[23] = 17;
            fr[26..30].copy_from_slice(&[10, 9, 0, 1]);
            fr[30..34].copy_from_slice(&[10, 9, 0, 2]);
            fr[34..36].copy_from_slice(&(10000 + f).to_be_bytes());
            fr[36..38].copy_from_slice(&9u16.to_be_bytes());
            fr[38..40].copy_from_slice(&26u16.to_be_bytes());
            raw.send(&fr).unwrap();
        }
        let count_udp = |p: &mut AfPacketPort| {
            let mut b = Batch::new();
            let mut c = 0;
            for _ in 0..50 {
                let n = p.rx_batch(&mut b);
                c += (0..n)
                    .filter(|&i| b.data(i).is_some_and(|d| d[12..14] == [8, 0]))
                    .count();
                b.clear();
                std::thread::sleep(Duration::from_millis(5));
            }
            c
        };
        let (c0, c1) = (count_udp(&mut w0), count_udp(&mut w1));
        assert_eq!(
            c0 + c1,
            usize::from(flows),
            "each frame goes to exactly one worker"
        );
        assert!(
            c0 > 0 && c1 > 0,
            "hash fanout used both workers: {c0} / {c1}"
        );
    });
}

#[test]
#[ignore = "needs root + netns; run by .ci/run with --ignored"]
fn open_by_name_reports_missing_interface_and_backend() {
    let net = TestNet::new("pkt-open", &["v"]);
    net.run(|| {
        let opts = OpenOptions::default();
        let e = open("nosuch0", Backend::AfPacket, &opts).err().unwrap();
        assert_eq!(
            e.to_string(),
            "no interface named \"nosuch0\" in this namespace"
        );
        let p = open("v0", Backend::AfPacket, &opts).unwrap();
        assert_eq!(p.kind(), sluice_io::BackendKind::AfPacket);
        assert_eq!(p.name(), "v0");
    });
}
