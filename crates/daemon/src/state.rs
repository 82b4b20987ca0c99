//! The connection state file (`state_file`): the connections a stopping
//! gateway saves, which the next start takes back, so that a restart (a new
//! binary, a change that needs one) does not drop them.
//!
//! Binary, little-endian, fixed-size records:
//!
//! ```text
//! header   "SLUICEC1" | workers u16 | policies u16 (at most 255) | 0 u32 |
//!          count u64 | saved at u64 (ms since 1970-01-01 UTC)        32 bytes
//! policy   proto u8 (6, 17) | 0 u8 | timers set u16 (bit k: timer k) |
//!          14 x timer ms u32 (sluice_conntrack::TimeoutKind order;
//!          0 where not set)                                         60 bytes
//! record   worker u16 | family u8 (4, 6) | proto u8 | state u8 |
//!          flags u8 (1 assured, 2 seen reply, 4 flowtable) |
//!          NAT mappings held u8 (1 source side, 2 destination side) |
//!          timeout policy u8 (0 none, else 1-based in the policies) |
//!          mark u32 | packets u32 | ms left u32 |
//!          orig src [16] | orig dst [16] | orig sport u16 | orig dport u16 |
//!          reply src [16] | reply dst [16] | reply sport u16 | reply dport u16
//!                                                                  92 bytes
//! ```
//!
//! The policies (the `ct timeout` policies connections follow, see
//! `sluice_engine::ct_timeout`) come after the header, the records after
//! them. Addresses are big-endian 16-byte fields, an IPv4 one in the last four
//! (the first twelve zero). [`decode`] checks every field and names the
//! first record it refuses; nothing of a refused file is restored.

use sluice_conntrack::{Carried, ProtoState, TimeoutKind, TimeoutPolicy};
use sluice_engine::ct_timeout::CtTimeout;
use sluice_engine::SavedConn;
use sluice_wire::flow::{FlowKey4, FlowKey6};

/// The first bytes of a state file (format version 1).
pub const MAGIC: [u8; 8] = *b"SLUICEC1";
/// Header bytes.
pub const HEADER: usize = 32;
/// Bytes per connection.
pub const RECORD: usize = 92;
/// Bytes per timeout policy.
pub const POLICY: usize = 4 + 4 * TimeoutKind::ALL.len();

const F_ASSURED: u8 = 1;
const F_SEEN_REPLY: u8 = 2;
const F_FLOWTABLE: u8 = 4;

/// A decoded state file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct State {
    /// The number of workers of the gateway that saved it.
    pub workers: u16,
    /// When it was saved, ms since 1970-01-01 UTC.
    pub saved_at_ms: u64,
    /// The timeout policies of the connections: a connection's
    /// `carried.timeout_policy` is 0 or its 1-based position here.
    pub policies: Vec<CtTimeout>,
    /// Each connection with the worker that held it.
    pub conns: Vec<(u16, SavedConn)>,
}

/// Why a state file was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StateError {
    /// It does not start with [`MAGIC`].
    #[error("not a Sluice state file (it does not start with \"SLUICEC1\")")]
    Magic,
    /// Its length is not the header's count of records (and policies).
    #[error("{len} bytes where a header of {count} connections needs {want}")]
    Length {
        /// Bytes read.
        len: usize,
        /// The header's count.
        count: u64,
        /// Bytes that count needs.
        want: u128,
    },
    /// A header field that must be zero is not, or no workers.
    #[error("header: {0}")]
    Header(&'static str),
    /// A policy with a bad field.
    #[error("timeout policy {index}: {what}")]
    Policy {
        /// Its position, from 1.
        index: usize,
        /// What is wrong.
        what: &'static str,
    },
    /// A record with a bad field.
    #[error("connection {index}: {what}")]
    Record {
        /// Its position, from 0.
        index: usize,
        /// What is wrong.
        what: &'static str,
    },
}

/// The file for `workers` workers holding `conns`, saved at
/// `saved_at_ms` (ms since 1970-01-01 UTC), the connections' timeout
/// policies numbered from 1 in `policies` (at most 255; those past it are
/// not written, and a connection naming one follows none).
pub fn encode(
    workers: u16,
    saved_at_ms: u64,
    policies: &[CtTimeout],
    conns: &[(u16, SavedConn)],
) -> Vec<u8> {
    let policies = &policies[..policies.len().min(255)];
    let mut b = Vec::with_capacity(HEADER + policies.len() * POLICY + conns.len() * RECORD);
    b.extend_from_slice(&MAGIC);
    b.extend_from_slice(&workers.to_le_bytes());
    b.extend_from_slice(&(policies.len() as u16).to_le_bytes());
    b.extend_from_slice(&[0; 4]);
    b.extend_from_slice(&(conns.len() as u64).to_le_bytes());
    b.extend_from_slice(&saved_at_ms.to_le_bytes());
    for p in policies {
        let mut set = 0u16;
        let mut ms = [0u32; TimeoutKind::ALL.len()];
        for (i, k) in TimeoutKind::ALL.iter().enumerate() {
            if let Some(d) = p.policy.get(*k) {
                set |= 1 << i;
                ms[i] = u32::try_from(d.as_millis()).unwrap_or(i32::MAX as u32);
            }
        }
        b.push(p.proto);
        b.push(0);
        b.extend_from_slice(&set.to_le_bytes());
        for m in ms {
            b.extend_from_slice(&m.to_le_bytes());
        }
    }
    for (w, c) in conns {
        let (family, proto, carried, held, keys) = match c {
            SavedConn::V4 {
                orig,
                reply,
                carried,
                held,
            } => (
                4u8,
                orig.proto,
                carried,
                *held,
                [
                    (
                        u128::from(orig.src),
                        u128::from(orig.dst),
                        orig.sport,
                        orig.dport,
                    ),
                    (
                        u128::from(reply.src),
                        u128::from(reply.dst),
                        reply.sport,
                        reply.dport,
                    ),
                ],
            ),
            SavedConn::V6 {
                orig,
                reply,
                carried,
            } => (
                6u8,
                orig.proto,
                carried,
                0,
                [
                    (orig.src, orig.dst, orig.sport, orig.dport),
                    (reply.src, reply.dst, reply.sport, reply.dport),
                ],
            ),
        };
        b.extend_from_slice(&w.to_le_bytes());
        b.push(family);
        b.push(proto);
        b.push(carried.state.code());
        let flags = [
            (carried.assured, F_ASSURED),
            (carried.seen_reply, F_SEEN_REPLY),
            (carried.flowtable, F_FLOWTABLE),
        ]
        .iter()
        .filter(|(on, _)| *on)
        .fold(0u8, |f, (_, bit)| f | bit);
        b.push(flags);
        b.push(held);
        let policy = usize::from(carried.timeout_policy);
        b.push(if policy <= policies.len() {
            carried.timeout_policy
        } else {
            0
        });
        b.extend_from_slice(&carried.mark.to_le_bytes());
        b.extend_from_slice(&carried.packets.to_le_bytes());
        b.extend_from_slice(&carried.expires_in_ms.to_le_bytes());
        for (src, dst, sport, dport) in keys {
            b.extend_from_slice(&src.to_be_bytes());
            b.extend_from_slice(&dst.to_be_bytes());
            b.extend_from_slice(&sport.to_le_bytes());
            b.extend_from_slice(&dport.to_le_bytes());
        }
    }
    b
}

/// Little-endian fields of a byte slice, bounds-checked.
struct Rd<'a>(&'a [u8]);

impl Rd<'_> {
    fn bytes<const N: usize>(&self, at: usize) -> [u8; N] {
        let mut a = [0u8; N];
        if let Some(s) = self.0.get(at..at + N) {
            a.copy_from_slice(s);
        }
        a
    }
    fn u8(&self, at: usize) -> u8 {
        self.0.get(at).copied().unwrap_or(0)
    }
    fn u16(&self, at: usize) -> u16 {
        u16::from_le_bytes(self.bytes(at))
    }
    fn u32(&self, at: usize) -> u32 {
        u32::from_le_bytes(self.bytes(at))
    }
    fn u64(&self, at: usize) -> u64 {
        u64::from_le_bytes(self.bytes(at))
    }
    fn addr(&self, at: usize) -> u128 {
        u128::from_be_bytes(self.bytes(at))
    }
}

/// The header of the state file at `path` (workers, connections, saved
/// at), and a check that the file has the length it gives; the records
/// are not read (`sluice check`). `Ok(None)`: no file.
pub fn peek(path: &std::path::Path) -> Result<Option<(u16, u64, u64)>, String> {
    use std::io::Read;
    let mut f = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e.to_string()),
    };
    let len = f.metadata().map_err(|e| e.to_string())?.len();
    let mut h = [0u8; HEADER];
    f.read_exact(&mut h)
        .map_err(|_| StateError::Magic.to_string())?;
    let r = Rd(&h);
    if h.get(..8) != Some(&MAGIC[..]) {
        return Err(StateError::Magic.to_string());
    }
    let count = r.u64(16);
    let want = file_len(r.u16(10), count);
    if u128::from(len) != want {
        return Err(StateError::Length {
            len: usize::try_from(len).unwrap_or(usize::MAX),
            count,
            want,
        }
        .to_string());
    }
    Ok(Some((r.u16(8), count, r.u64(24))))
}

/// Read a state file, checking every field.
pub fn decode(b: &[u8]) -> Result<State, StateError> {
    let r = Rd(b);
    if b.get(..8) != Some(&MAGIC[..]) {
        return Err(StateError::Magic);
    }
    let count = r.u64(16);
    let want = file_len(r.u16(10), count);
    if b.len() as u128 != want {
        return Err(StateError::Length {
            len: b.len(),
            count,
            want,
        });
    }
    let workers = r.u16(8);
    if workers == 0 {
        return Err(StateError::Header("no workers"));
    }
    if r.u32(12) != 0 {
        return Err(StateError::Header("reserved bytes are not zero"));
    }
    let npol = usize::from(r.u16(10));
    if npol > 255 {
        return Err(StateError::Header("more than 255 timeout policies"));
    }
    let start = HEADER + npol * POLICY;
    let mut policies = Vec::with_capacity(npol);
    for (i, pb) in b
        .get(HEADER..start)
        .unwrap_or(&[])
        .chunks_exact(POLICY)
        .enumerate()
    {
        let bad = |what| StateError::Policy { index: i + 1, what };
        let r = Rd(pb);
        let proto = r.u8(0);
        if !matches!(proto, 6 | 17) {
            return Err(bad("protocol is neither TCP nor UDP"));
        }
        if r.u8(1) != 0 {
            return Err(bad("reserved bytes are not zero"));
        }
        let set = r.u16(2);
        if set >> TimeoutKind::ALL.len() != 0 {
            return Err(bad("unknown timers"));
        }
        let mut policy = TimeoutPolicy::default();
        for (k, kind) in TimeoutKind::ALL.iter().enumerate() {
            let ms = r.u32(4 + 4 * k);
            if set & (1 << k) == 0 {
                if ms != 0 {
                    return Err(bad("a timer not set has a value"));
                }
                continue;
            }
            if ms > i32::MAX as u32 {
                return Err(bad("a timer above the longest timeout"));
            }
            policy.set(*kind, std::time::Duration::from_millis(u64::from(ms)));
        }
        policies.push(CtTimeout { proto, policy });
    }
    let mut conns = Vec::with_capacity(b.len() / RECORD);
    for (index, rec) in b
        .get(start..)
        .unwrap_or(&[])
        .chunks_exact(RECORD)
        .enumerate()
    {
        let bad = |what| StateError::Record { index, what };
        let r = Rd(rec);
        let worker = r.u16(0);
        if worker >= workers {
            return Err(bad("worker out of range"));
        }
        let (family, proto) = (r.u8(2), r.u8(3));
        let state =
            ProtoState::from_code(proto, r.u8(4)).ok_or(bad("no such state for its protocol"))?;
        let flags = r.u8(5);
        if flags & !(F_ASSURED | F_SEEN_REPLY | F_FLOWTABLE) != 0 {
            return Err(bad("unknown flags"));
        }
        let held = r.u8(6);
        if held & !3 != 0 {
            return Err(bad("unknown NAT mapping bits"));
        }
        let timeout_policy = r.u8(7);
        if timeout_policy != 0 {
            match policies.get(usize::from(timeout_policy) - 1) {
                None => return Err(bad("timeout policy out of range")),
                Some(p) if p.proto != proto => {
                    return Err(bad("timeout policy of another protocol"))
                }
                Some(_) => {}
            }
        }
        let expires_in_ms = r.u32(16);
        if expires_in_ms > i32::MAX as u32 {
            return Err(bad("time left above the longest timeout"));
        }
        let carried = Carried {
            state,
            assured: flags & F_ASSURED != 0,
            seen_reply: flags & F_SEEN_REPLY != 0,
            flowtable: flags & F_FLOWTABLE != 0,
            mark: r.u32(8),
            packets: r.u32(12),
            expires_in_ms,
            timeout_policy,
        };
        let key = |at: usize| (r.addr(at), r.addr(at + 16), r.u16(at + 32), r.u16(at + 34));
        let (o, p) = (key(20), key(56));
        let conn = match family {
            4 => {
                let v4 =
                    |a: u128| u32::try_from(a).map_err(|_| bad("an IPv4 address above 32 bits"));
                let k = |(s, d, sp, dp): (u128, u128, u16, u16)| -> Result<FlowKey4, StateError> {
                    Ok(FlowKey4 {
                        src: v4(s)?,
                        dst: v4(d)?,
                        sport: sp,
                        dport: dp,
                        proto,
                    })
                };
                let (orig, reply) = (k(o)?, k(p)?);
                if held != 0 && reply == orig.reversed() {
                    return Err(bad("NAT mappings held by an untranslated connection"));
                }
                SavedConn::V4 {
                    orig,
                    reply,
                    carried,
                    held,
                }
            }
            6 if held != 0 => return Err(bad("NAT mappings held by an IPv6 connection")),
            6 => {
                let k = |(s, d, sp, dp): (u128, u128, u16, u16)| FlowKey6 {
                    src: s,
                    dst: d,
                    sport: sp,
                    dport: dp,
                    proto,
                };
                SavedConn::V6 {
                    orig: k(o),
                    reply: k(p),
                    carried,
                }
            }
            _ => return Err(bad("family is neither 4 nor 6")),
        };
        conns.push((worker, conn));
    }
    Ok(State {
        workers,
        saved_at_ms: r.u64(24),
        policies,
        conns,
    })
}

/// The length of a file of `policies` policies and `count` connections.
fn file_len(policies: u16, count: u64) -> u128 {
    HEADER as u128 + u128::from(policies) * POLICY as u128 + u128::from(count) * RECORD as u128
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_conntrack::proto::{TcpState, UdpState};
    use sluice_wire::flow::proto;

    fn sample() -> Vec<(u16, SavedConn)> {
        let c = Carried {
            state: ProtoState::Tcp(TcpState::Established),
            assured: true,
            seen_reply: true,
            flowtable: false,
            mark: 0xdead_beef,
            packets: 77,
            expires_in_ms: 431_999_000,
            timeout_policy: 0,
        };
        let k4 = FlowKey4 {
            src: 0x0a00_0002,
            dst: 0xcb00_7101,
            sport: 40_000,
            dport: 443,
            proto: proto::TCP,
        };
        let k6 = FlowKey6 {
            src: 0x2001_0db8 << 96 | 2,
            dst: 0x2001_0db8 << 96 | 0x1_0000_0001,
            sport: 5353,
            dport: 53,
            proto: proto::UDP,
        };
        vec![
            (
                0,
                SavedConn::V4 {
                    orig: k4,
                    reply: k4.reversed(),
                    carried: c,
                    held: 0,
                },
            ),
            (
                1,
                SavedConn::V4 {
                    orig: k4,
                    // Source NAT to 198.51.100.7:61000.
                    reply: FlowKey4 {
                        dst: 0xc633_6407,
                        dport: 61_000,
                        ..k4.reversed()
                    },
                    carried: Carried {
                        timeout_policy: 1,
                        ..c
                    },
                    held: 1,
                },
            ),
            (
                1,
                SavedConn::V6 {
                    orig: k6,
                    reply: k6.reversed(),
                    carried: Carried {
                        state: ProtoState::Udp(UdpState::Replied),
                        assured: false,
                        flowtable: true,
                        timeout_policy: 2,
                        ..c
                    },
                },
            ),
        ]
    }

    /// A TCP policy (1) and a UDP one (2), as `sample` uses them.
    fn policies() -> Vec<CtTimeout> {
        let d = std::time::Duration::from_millis;
        let mut tcp = TimeoutPolicy::default();
        tcp.set(TimeoutKind::TcpEstablished, d(3_600_000));
        tcp.set(TimeoutKind::TcpSynSent2, d(1));
        let mut udp = TimeoutPolicy::default();
        udp.set(TimeoutKind::Udp, d(0));
        udp.set(TimeoutKind::UdpStream, d(i32::MAX as u64));
        vec![
            CtTimeout {
                proto: 6,
                policy: tcp,
            },
            CtTimeout {
                proto: 17,
                policy: udp,
            },
        ]
    }

    #[test]
    fn a_file_round_trips() {
        let conns = sample();
        let b = encode(2, 1_764_000_000_000, &policies(), &conns);
        assert_eq!(b.len(), HEADER + 2 * POLICY + 3 * RECORD);
        assert_eq!(POLICY, 60);
        assert_eq!(
            decode(&b),
            Ok(State {
                workers: 2,
                saved_at_ms: 1_764_000_000_000,
                policies: policies(),
                conns
            })
        );
        assert_eq!(
            decode(&encode(1, 7, &[], &[])),
            Ok(State {
                workers: 1,
                saved_at_ms: 7,
                policies: vec![],
                conns: vec![]
            })
        );
        // A connection naming a policy the file does not have follows none.
        let s = decode(&encode(2, 7, &policies()[..1], &sample())).unwrap();
        assert_eq!(s.policies.len(), 1);
        let slots: Vec<u8> = s
            .conns
            .iter()
            .map(|(_, c)| match c {
                SavedConn::V4 { carried, .. } | SavedConn::V6 { carried, .. } => {
                    carried.timeout_policy
                }
            })
            .collect();
        assert_eq!(slots, vec![0, 1, 0]);
    }

    /// Every field a file may get wrong is refused with what and where,
    /// and a file cut short or grown is refused whole.
    #[test]
    fn bad_files_are_refused_naming_the_field() {
        let good = encode(2, 5, &policies(), &sample());
        let with = |at: usize, v: u8| {
            let mut b = good.clone();
            b[at] = v;
            decode(&b)
        };
        assert_eq!(decode(b"SLUICEC0"), Err(StateError::Magic));
        assert_eq!(decode(&[]), Err(StateError::Magic));
        assert!(matches!(
            decode(&good[..good.len() - 1]),
            Err(StateError::Length { count: 3, .. })
        ));
        let mut longer = good.clone();
        longer.push(0);
        assert!(matches!(decode(&longer), Err(StateError::Length { .. })));
        // A count whose byte size overflows is a length error, not a crash.
        let mut huge = good.clone();
        huge[16..24].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(matches!(decode(&huge), Err(StateError::Length { .. })));
        assert_eq!(with(8, 0), Err(StateError::Header("no workers")));
        assert!(matches!(with(12, 1), Err(StateError::Header(_))));
        // One policy more in the header: the length no longer fits.
        assert!(matches!(with(10, 3), Err(StateError::Length { .. })));
        let pol = |i: usize, what: &'static str| Err(StateError::Policy { index: i, what });
        let p2 = HEADER + POLICY;
        assert_eq!(with(HEADER, 1), pol(1, "protocol is neither TCP nor UDP"));
        assert_eq!(with(p2 + 1, 1), pol(2, "reserved bytes are not zero"));
        assert_eq!(with(HEADER + 3, 0x40), pol(1, "unknown timers"));
        assert_eq!(with(HEADER + 4, 1), pol(1, "a timer not set has a value"));
        // Timer 11 (UDP stream) of policy 2 is i32::MAX ms: one more is out.
        assert_eq!(
            with(p2 + 4 + 4 * 11 + 3, 0x80),
            pol(2, "a timer above the longest timeout")
        );
        let first = HEADER + 2 * POLICY;
        let second = first + RECORD;
        let rec = |i: usize, what: &'static str| Err(StateError::Record { index: i, what });
        assert_eq!(with(second, 2), rec(1, "worker out of range"));
        assert_eq!(with(first + 2, 5), rec(0, "family is neither 4 nor 6"));
        assert_eq!(
            with(first + 4, 10),
            rec(0, "no such state for its protocol")
        );
        let third = second + RECORD;
        assert_eq!(with(third + 4, 3), rec(2, "no such state for its protocol"));
        assert_eq!(with(first + 6, 4), rec(0, "unknown NAT mapping bits"));
        assert_eq!(
            with(first + 6, 1),
            rec(0, "NAT mappings held by an untranslated connection")
        );
        assert_eq!(
            with(third + 6, 1),
            rec(2, "NAT mappings held by an IPv6 connection")
        );
        assert_eq!(with(second + 6, 3).map(|s| s.conns.len()), Ok(3));
        assert_eq!(with(first + 5, 8), rec(0, "unknown flags"));
        assert_eq!(with(first + 7, 3), rec(0, "timeout policy out of range"));
        assert_eq!(
            with(first + 7, 2),
            rec(0, "timeout policy of another protocol")
        );
        assert_eq!(with(first + 7, 1).map(|s| s.conns.len()), Ok(3));
        assert_eq!(
            with(first + 19, 0x80),
            rec(0, "time left above the longest timeout")
        );
        assert_eq!(with(first + 20, 1), rec(0, "an IPv4 address above 32 bits"));
    }
}
