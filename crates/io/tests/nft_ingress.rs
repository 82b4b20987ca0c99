//! The nft netdev ingress drop keeps the kernel stack off an interface while
//! AF_PACKET still receives its frames (packet taps run before ingress).
mod common;

use std::time::Duration;

use common::*;
use sluice_io::nft::IngressDrop;
use sluice_io::rawsock::RawSocket;
use sluice_io::{AfPacketConfig, AfPacketPort, Batch, Port};

/// ARP request "who-has 10.77.0.1 tell 10.77.0.2" from 02:..:01.
fn arp_request() -> Vec<u8> {
    let mut f = vec![0u8; 60];
    f[0..6].copy_from_slice(&[0xff; 6]);
    f[6..12].copy_from_slice(&[0x02, 0, 0, 0, 0, 0x01]);
    f[12..14].copy_from_slice(&[0x08, 0x06]);
    f[14..22].copy_from_slice(&[0, 1, 8, 0, 6, 4, 0, 1]);
    f[22..28].copy_from_slice(&[0x02, 0, 0, 0, 0, 0x01]);
    f[28..32].copy_from_slice(&[10, 77, 0, 2]);
    f[38..42].copy_from_slice(&[10, 77, 0, 1]);
    f
}

/// Whether an ARP reply for 10.77.0.1 arrives on `raw` within 500 ms.
fn arp_reply_seen(raw: &RawSocket) -> bool {
    raw.send(&arp_request()).unwrap();
    let mut buf = [0u8; 2048];
    let end = std::time::Instant::now() + Duration::from_millis(500);
    while std::time::Instant::now() < end {
        if let Some(n) = raw.recv(&mut buf, 50).unwrap() {
            if n >= 42
                && buf[12..14] == [8, 6]
                && buf[20..22] == [0, 2]
                && buf[28..32] == [10, 77, 0, 1]
            {
                return true;
            }
        }
    }
    false
}

fn count_arp(port: &mut AfPacketPort) -> usize {
    let mut b = Batch::new();
    let mut c = 0;
    for _ in 0..20 {
        let n = port.rx_batch(&mut b);
        c += (0..n)
            .filter(|&i| {
                b.data(i)
                    .is_some_and(|d| d[12..14] == [8, 6] && d[20..22] == [0, 1])
            })
            .count();
        b.clear();
        std::thread::sleep(Duration::from_millis(5));
    }
    c
}

#[test]
#[ignore = "needs root + netns; run by .ci/run with --ignored"]
fn afpacket_receives_while_nft_ingress_drops() {
    let net = TestNet::new("nft", &["v"]);
    net.ns
        .ip(&["addr", "add", "10.77.0.1/24", "dev", "v0"])
        .unwrap();
    net.run(|| {
        let raw = RawSocket::open("v1").unwrap();
        let mut port = AfPacketPort::open("v0", 0, &AfPacketConfig::default()).unwrap();
        // Baseline: the stack answers ARP, and AF_PACKET sees the request.
        assert!(
            arp_reply_seen(&raw),
            "baseline: kernel should answer ARP on v0"
        );
        assert!(count_arp(&mut port) >= 1);

        let guard =
            IngressDrop::install(&["v0"]).expect("nft (package nftables) must be installed");
        assert!(
            !arp_reply_seen(&raw),
            "with the ingress drop the kernel must not answer"
        );
        assert!(
            count_arp(&mut port) >= 1,
            "AF_PACKET must still see the frame"
        );

        guard.remove().unwrap();
        assert!(
            arp_reply_seen(&raw),
            "after removal the kernel answers again"
        );
    });
}

#[test]
#[ignore = "needs root + netns; run by .ci/run with --ignored"]
fn ingress_drop_is_removed_on_drop() {
    let net = TestNet::new("nft-drop", &["v"]);
    net.run(|| {
        {
            let _g = IngressDrop::install(&["v0", "v1"]).unwrap();
            let out = std::process::Command::new("nft")
                .args(["list", "table", "netdev", "sluice"])
                .output()
                .unwrap();
            let text = String::from_utf8_lossy(&out.stdout);
            assert!(
                text.contains("chain in_v0") && text.contains("chain in_v1"),
                "{text}"
            );
        }
        let out = std::process::Command::new("nft")
            .args(["list", "table", "netdev", "sluice"])
            .output()
            .unwrap();
        assert!(!out.status.success(), "table still present after drop");
    });
}
