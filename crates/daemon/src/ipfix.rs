//! IPFIX export of NAT events (RFC 7011 messages, RFC 8158 information
//! elements), for `nat.log = "ipfix://ADDR:PORT"`.
//!
//! Two templates:
//!
//! * 256, mappings (`natEvent` 8 / 9, NAT44 BIB create / delete):
//!   `observationTimeMilliseconds` (323), `natEvent` (230),
//!   `protocolIdentifier` (4), `sourceIPv4Address` (8),
//!   `sourceTransportPort` (7), `postNATSourceIPv4Address` (225),
//!   `postNAPTSourceTransportPort` (227): 22 bytes a record.
//! * 257, port blocks (`natEvent` 16 / 17, port block allocation /
//!   de-allocation): `observationTimeMilliseconds`, `natEvent`,
//!   `sourceIPv4Address`, `postNATSourceIPv4Address`, `portRangeStart`
//!   (361), `portRangeEnd` (362), `portRangeStepSize` (363),
//!   `portRangeNumPorts` (364): 22 bytes a record. With several workers
//!   a block is the ports of the range its worker owns (see
//!   `sluice_nat::owner_of`), which a step size cannot say: the record
//!   carries step 1 and the block's size as the number of ports.
//!
//! Over UDP the templates go first and then again every
//! [`TEMPLATE_EVERY`] messages (RFC 7011 section 8.4: a collector that
//! started late, or lost the first datagram, learns them). Messages stay
//! below [`MAX_MESSAGE`] bytes, so one fits an Ethernet MTU.

use sluice_engine::LoggedEvent;
use sluice_nat::{EventView, NatEvent};

/// Largest message (with IPv4 and UDP headers it fits 1500 bytes).
pub const MAX_MESSAGE: usize = 1400;
/// Templates are sent again after this many messages.
pub const TEMPLATE_EVERY: u32 = 64;
/// Template id of mapping records.
pub const T_MAPPING: u16 = 256;
/// Template id of port block records.
pub const T_BLOCK: u16 = 257;

/// (information element id, length) of each template's fields.
const MAPPING_FIELDS: [(u16, u16); 7] = [
    (323, 8),
    (230, 1),
    (4, 1),
    (8, 4),
    (7, 2),
    (225, 4),
    (227, 2),
];
const BLOCK_FIELDS: [(u16, u16); 8] = [
    (323, 8),
    (230, 1),
    (8, 4),
    (225, 4),
    (361, 2),
    (362, 2),
    (363, 2),
    (364, 2),
];
/// Record lengths: the sums of the fields' lengths.
const MAPPING_LEN: usize = 22;
const BLOCK_LEN: usize = 25;

/// The exporter's state for one collector.
#[derive(Debug)]
pub struct Exporter {
    /// Observation domain id.
    pub domain: u32,
    /// Data records exported so far (the next message's sequence number).
    pub sequence: u32,
    /// Messages since the templates were last sent.
    since_templates: u32,
    /// Block size, for `portRangeNumPorts`.
    block_size: u16,
}

fn put16(b: &mut Vec<u8>, v: u16) {
    b.extend_from_slice(&v.to_be_bytes());
}

fn put32(b: &mut Vec<u8>, v: u32) {
    b.extend_from_slice(&v.to_be_bytes());
}

/// Write `v` at `at` (a length field reserved earlier).
fn patch16(b: &mut [u8], at: usize, v: u16) {
    if let Some(x) = b.get_mut(at..at + 2) {
        x.copy_from_slice(&v.to_be_bytes());
    }
}

fn template_set(b: &mut Vec<u8>) {
    let start = b.len();
    put16(b, 2); // template set
    put16(b, 0); // its length, patched below
    for (id, fields) in [
        (T_MAPPING, &MAPPING_FIELDS[..]),
        (T_BLOCK, &BLOCK_FIELDS[..]),
    ] {
        put16(b, id);
        put16(b, fields.len() as u16);
        for &(ie, len) in fields {
            put16(b, ie);
            put16(b, len);
        }
    }
    let len = (b.len() - start) as u16;
    patch16(b, start + 2, len);
}

/// The template of an event's record.
fn template_of(e: &NatEvent) -> u16 {
    match e.view() {
        EventView::Mapping(_) => T_MAPPING,
        EventView::Block(_) => T_BLOCK,
    }
}

/// Append the record of `e` (its template's fields, in order).
fn put_record(m: &mut Vec<u8>, e: &LoggedEvent, block_size: u16) {
    m.extend_from_slice(&e.wall_ms.to_be_bytes());
    match e.event.view() {
        EventView::Mapping(v) => {
            // NAT44 BIB create / delete (RFC 8158 table 2).
            m.push(if v.created { 8 } else { 9 });
            m.push(v.proto);
            m.extend_from_slice(&v.int.0.octets());
            put16(m, v.int.1);
            m.extend_from_slice(&v.ext.0.octets());
            put16(m, v.ext.1);
        }
        EventView::Block(v) => {
            // Port block allocation / de-allocation.
            m.push(if v.allocated { 16 } else { 17 });
            m.extend_from_slice(&v.int_addr.octets());
            m.extend_from_slice(&v.ext_addr.octets());
            put16(m, v.ports.0);
            put16(m, v.ports.1);
            put16(m, 1);
            put16(m, block_size);
        }
    }
}

impl Exporter {
    /// An exporter for observation domain `domain`; `block_size` is
    /// `nat.port_block_size` (0 without port blocks).
    pub fn new(domain: u32, block_size: u16) -> Self {
        Self {
            domain,
            sequence: 0,
            since_templates: TEMPLATE_EVERY,
            block_size,
        }
    }

    /// The messages carrying `events` (oldest first), exported at
    /// `export_s` (seconds since the epoch), each with its count of data
    /// records.
    pub fn messages(&mut self, events: &[LoggedEvent], export_s: u32) -> Vec<(Vec<u8>, u64)> {
        let mut out = Vec::new();
        let mut rest = events;
        while !rest.is_empty() {
            let mut m = Vec::with_capacity(MAX_MESSAGE);
            put16(&mut m, 10);
            put16(&mut m, 0); // message length, patched below
            put32(&mut m, export_s);
            put32(&mut m, self.sequence);
            put32(&mut m, self.domain);
            if self.since_templates >= TEMPLATE_EVERY {
                template_set(&mut m);
                self.since_templates = 0;
            }
            self.since_templates += 1;
            // One data set per run of records of one template.
            let mut set: Option<(u16, usize)> = None;
            let mut n = 0u64;
            while let Some((e, tail)) = rest.split_first() {
                let tid = template_of(&e.event);
                let len = if tid == T_BLOCK {
                    BLOCK_LEN
                } else {
                    MAPPING_LEN
                };
                let same = set.is_some_and(|(t, _)| t == tid);
                if m.len() + len + if same { 0 } else { 4 } > MAX_MESSAGE {
                    break;
                }
                if !same {
                    close_set(&mut m, set);
                    set = Some((tid, m.len()));
                    put16(&mut m, tid);
                    put16(&mut m, 0);
                }
                put_record(&mut m, e, self.block_size);
                self.sequence = self.sequence.wrapping_add(1);
                n += 1;
                rest = tail;
            }
            close_set(&mut m, set);
            let len = m.len() as u16;
            patch16(&mut m, 2, len);
            out.push((m, n));
        }
        out
    }
}

fn close_set(m: &mut [u8], set: Option<(u16, usize)>) {
    if let Some((_, at)) = set {
        let len = (m.len() - at) as u16;
        patch16(m, at + 2, len);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::indexing_slicing)]
    use super::*;
    use std::net::Ipv4Addr;

    fn u16at(b: &[u8], i: usize) -> u16 {
        u16::from_be_bytes([b[i], b[i + 1]])
    }

    fn u32at(b: &[u8], i: usize) -> u32 {
        u32::from_be_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]])
    }

    /// A small collector: the templates it learnt (id -> field lengths)
    /// and every data record as (template, bytes).
    fn decode(
        msgs: &[Vec<u8>],
        templates: &mut std::collections::HashMap<u16, Vec<(u16, u16)>>,
    ) -> Vec<(u16, Vec<u8>)> {
        let mut recs = Vec::new();
        let mut seq_expected = None;
        for m in msgs {
            assert_eq!(u16at(m, 0), 10, "version");
            assert_eq!(usize::from(u16at(m, 2)), m.len(), "message length");
            assert!(m.len() <= MAX_MESSAGE);
            let seq = u32at(m, 8);
            if let Some(s) = seq_expected {
                assert_eq!(seq, s, "sequence numbers count data records");
            }
            let mut n = 0u32;
            let mut i = 16;
            while i < m.len() {
                let (id, len) = (u16at(m, i), usize::from(u16at(m, i + 2)));
                assert!(len >= 4 && i + len <= m.len(), "set length");
                let body = &m[i + 4..i + len];
                if id == 2 {
                    let mut j = 0;
                    while j < body.len() {
                        let (tid, count) = (u16at(body, j), usize::from(u16at(body, j + 2)));
                        let fields = (0..count)
                            .map(|k| (u16at(body, j + 4 + 4 * k), u16at(body, j + 6 + 4 * k)))
                            .collect();
                        templates.insert(tid, fields);
                        j += 4 + 4 * count;
                    }
                } else {
                    let t = templates.get(&id).expect("data before its template");
                    let rl: usize = t.iter().map(|&(_, l)| usize::from(l)).sum();
                    assert_eq!(body.len() % rl, 0, "whole records");
                    for r in body.chunks(rl) {
                        recs.push((id, r.to_vec()));
                        n += 1;
                    }
                }
                i += len;
            }
            seq_expected = Some(seq.wrapping_add(n));
        }
        recs
    }

    #[test]
    fn messages_decode_to_the_events() {
        let ev = |i: u32, block: bool| LoggedEvent {
            wall_ms: 1_795_000_000_000 + u64::from(i),
            event: if block {
                NatEvent::BlockAllocated {
                    int_addr: Ipv4Addr::from(0x6440_0000 + i),
                    ext_addr: Ipv4Addr::new(198, 51, 100, 7),
                    first_port: 1024,
                    last_port: 1151,
                    worker: 0,
                }
            } else {
                NatEvent::MappingRemoved {
                    proto: 17,
                    int_addr: Ipv4Addr::from(0x0a00_0000 + i),
                    int_port: 40000,
                    ext_addr: Ipv4Addr::new(198, 51, 100, 7),
                    ext_port: 1030 + i as u16,
                    worker: 0,
                }
            },
        };
        let events: Vec<LoggedEvent> = (0..300).map(|i| ev(i, i % 7 == 3)).collect();
        let mut x = Exporter::new(7, 128);
        let msgs: Vec<Vec<u8>> = x
            .messages(&events, 1_795_000_000)
            .into_iter()
            .map(|(m, _)| m)
            .collect();
        assert!(msgs.len() > 4, "{} messages", msgs.len());
        let mut t = std::collections::HashMap::new();
        let recs = decode(&msgs, &mut t);
        assert_eq!(t[&T_MAPPING], MAPPING_FIELDS.to_vec());
        assert_eq!(t[&T_BLOCK], BLOCK_FIELDS.to_vec());
        assert_eq!(recs.len(), 300);
        assert_eq!(x.sequence, 300);
        for (i, (tid, r)) in recs.iter().enumerate() {
            let i = i as u32;
            assert_eq!(
                u64::from_be_bytes(r[..8].try_into().unwrap_or_default()),
                1_795_000_000_000 + u64::from(i)
            );
            if i % 7 == 3 {
                assert_eq!(*tid, T_BLOCK);
                assert_eq!(r[8], 16);
                assert_eq!(u32at(r, 9), 0x6440_0000 + i);
                assert_eq!(
                    (u16at(r, 17), u16at(r, 19), u16at(r, 21), u16at(r, 23)),
                    (1024, 1151, 1, 128)
                );
            } else {
                assert_eq!(*tid, T_MAPPING);
                assert_eq!((r[8], r[9]), (9, 17));
                assert_eq!(u32at(r, 10), 0x0a00_0000 + i);
                assert_eq!(u16at(r, 20), 1030 + i as u16);
            }
        }
        // Templates again after TEMPLATE_EVERY messages, and only then.
        let more: Vec<LoggedEvent> = (0..2000).map(|i| ev(i, false)).collect();
        let msgs2: Vec<Vec<u8>> = x
            .messages(&more, 1_795_000_001)
            .into_iter()
            .map(|(m, _)| m)
            .collect();
        let with_t = msgs2.iter().filter(|m| u16at(m, 16) == 2).count();
        assert_eq!(
            with_t,
            (msgs.len() + msgs2.len()).div_ceil(TEMPLATE_EVERY as usize) - 1
        );
        let mut t2 = t.clone();
        assert_eq!(decode(&msgs2, &mut t2).len(), 2000);
        assert_eq!(u32at(&msgs2[0], 8), 300);
    }
}
