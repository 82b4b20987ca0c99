//! The offload prefix run by a small eBPF interpreter (the instructions it
//! uses, the kernel's memory model for ctx, packet, stack and map value),
//! checked against checksums recomputed from scratch.

use std::collections::HashMap;

use super::*;

const CTX: u64 = 0x1000;
const PKT: u64 = 0x10_0000;
const STACK_TOP: u64 = 0x20_0000;
const VAL: u64 = 0x30_0000;
const MAP_FD: i32 = 0x7777;

#[derive(Debug, PartialEq, Eq)]
enum Outcome {
    /// Fell through to the next program with r1 = ctx.
    Miss,
    /// `bpf_redirect(oif, 0)`.
    Redirect(u32),
}

struct Vm<'a> {
    frame: &'a mut Vec<u8>,
    ifindex: u32,
    map: &'a mut HashMap<[u8; KEY_SIZE], [u8; VALUE_SIZE]>,
    stack: [u8; 512],
    /// Key of the value mapped at `VAL`, if any.
    mapped: Option<[u8; KEY_SIZE]>,
}

impl Vm<'_> {
    fn mem(&mut self, addr: u64, size: usize) -> &mut [u8] {
        let len = self.frame.len() as u64;
        if (PKT..PKT + len).contains(&addr) {
            let o = (addr - PKT) as usize;
            return self
                .frame
                .get_mut(o..o + size)
                .unwrap_or_else(|| panic!("unchecked packet access of {size} at {o} (len {len})"));
        }
        if (STACK_TOP - 512..STACK_TOP).contains(&addr) {
            let o = (addr - (STACK_TOP - 512)) as usize;
            return &mut self.stack[o..o + size];
        }
        if (VAL..VAL + VALUE_SIZE as u64).contains(&addr) {
            let k = self.mapped.expect("value access without a lookup");
            let o = (addr - VAL) as usize;
            assert!(o + size <= VALUE_SIZE, "value access beyond its size");
            return &mut self.map.get_mut(&k).expect("mapped")[o..o + size];
        }
        panic!("access of {size} at {addr:#x}");
    }

    fn load(&mut self, addr: u64, size: usize) -> u64 {
        if (CTX..CTX + 24).contains(&addr) {
            assert_eq!(size, 4);
            return match addr - CTX {
                0 => PKT,
                4 => PKT + self.frame.len() as u64,
                12 => u64::from(self.ifindex),
                o => panic!("ctx load at {o}"),
            };
        }
        let b = self.mem(addr, size);
        let mut v = [0u8; 8];
        v[..size].copy_from_slice(b);
        u64::from_ne_bytes(v)
    }

    fn store(&mut self, addr: u64, size: usize, v: u64) {
        let b = v.to_ne_bytes();
        self.mem(addr, size).copy_from_slice(&b[..size]);
    }

    fn run(&mut self, prog: &[BpfInsn]) -> Outcome {
        let mut r = [0u64; 11];
        r[1] = CTX;
        r[10] = STACK_TOP;
        let mut pc = 0usize;
        for _ in 0..10_000 {
            let Some(&i) = prog.get(pc) else {
                assert_eq!(r[1], CTX, "r1 = ctx when falling through");
                return Outcome::Miss;
            };
            pc += 1;
            let (d, s) = (usize::from(i.regs & 0xf), usize::from(i.regs >> 4));
            let k = i64::from(i.imm) as u64;
            let off = i64::from(i.off) as u64;
            let mut jump = |c: bool| {
                if c {
                    pc = (pc as i64 + i64::from(i.off)) as usize;
                }
            };
            match i.code {
                LDX_B => r[d] = self.load(r[s].wrapping_add(off), 1),
                LDX_H => r[d] = self.load(r[s].wrapping_add(off), 2),
                LDX_W => r[d] = self.load(r[s].wrapping_add(off), 4),
                STX_B => self.store(r[d].wrapping_add(off), 1, r[s]),
                STX_H => self.store(r[d].wrapping_add(off), 2, r[s]),
                STX_W => self.store(r[d].wrapping_add(off), 4, r[s]),
                STX_DW => self.store(r[d].wrapping_add(off), 8, r[s]),
                LDX_DW => r[d] = self.load(r[s].wrapping_add(off), 8),
                ADD_K => r[d] = r[d].wrapping_add(k),
                ADD_X => r[d] = r[d].wrapping_add(r[s]),
                AND_K => r[d] &= k,
                RSH_K => r[d] >>= k,
                XOR_K => r[d] ^= k,
                MOV_K => r[d] = k,
                MOV_X => r[d] = r[s],
                TO_BE => {
                    r[d] = match i.imm {
                        16 => u64::from((r[d] as u16).to_be()),
                        32 => u64::from((r[d] as u32).to_be()),
                        n => panic!("be{n}"),
                    }
                }
                JA => jump(true),
                JEQ_K => jump(r[d] == k),
                JNE_K => jump(r[d] != k),
                JLE_K => jump(r[d] <= k),
                JSET_K => jump(r[d] & k != 0),
                JGT_X => jump(r[d] > r[s]),
                LD_IMM64 => {
                    assert_eq!(s, usize::from(PSEUDO_MAP_FD));
                    r[d] = u64::from(i.imm as u32);
                    pc += 1;
                }
                CALL => {
                    match i.imm {
                        HELPER_MAP_LOOKUP => {
                            assert_eq!(r[1], MAP_FD as u64);
                            let mut key = [0u8; KEY_SIZE];
                            key.copy_from_slice(self.mem(r[2], KEY_SIZE));
                            r[0] = if self.map.contains_key(&key) {
                                self.mapped = Some(key);
                                VAL
                            } else {
                                0
                            };
                        }
                        HELPER_REDIRECT => {
                            assert_eq!(r[2], 0, "flags");
                            return Outcome::Redirect(r[1] as u32);
                        }
                        h => panic!("helper {h}"),
                    }
                    // Caller-saved registers are clobbered.
                    for x in &mut r[1..=5] {
                        *x = 0xdead_beef;
                    }
                }
                EXIT => panic!("exit at {}: r0 = {}", pc - 1, r[0]),
                c => panic!("opcode {c:#x} at {}", pc - 1),
            }
        }
        panic!("program did not finish");
    }
}

fn program() -> Vec<BpfInsn> {
    let (mut p, at) = prefix();
    p[at].imm = MAP_FD;
    p
}

fn sum16(b: &[u8]) -> u32 {
    b.chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)])))
        .sum()
}

fn fold(mut s: u32) -> u16 {
    while s > 0xffff {
        s = (s & 0xffff) + (s >> 16);
    }
    s as u16
}

fn ip_csum(ip: &[u8]) -> u16 {
    let mut h = ip[..20].to_vec();
    h[10] = 0;
    h[11] = 0;
    !fold(sum16(&h))
}

fn l4_csum(frame: &[u8]) -> u16 {
    let ip = &frame[14..34];
    let proto = ip[9];
    let len = usize::from(u16::from_be_bytes([ip[2], ip[3]])) - 20;
    let mut l4 = frame[34..34 + len].to_vec();
    let at = if proto == 6 { 16 } else { 6 };
    l4[at] = 0;
    l4[at + 1] = 0;
    let s = sum16(&ip[12..20]) + u32::from(proto) + len as u32 + sum16(&l4);
    let c = !fold(s);
    if proto == 17 && c == 0 {
        0xffff
    } else {
        c
    }
}

/// A valid frame: `proto` 6 or 17, `payload` bytes after the L4 header.
fn frame(proto: u8, src: u32, dst: u32, sport: u16, dport: u16, payload: usize) -> Vec<u8> {
    let l4len = if proto == 6 { 20 } else { 8 } + payload;
    let mut f = vec![0u8; 34 + l4len];
    f[0..6].copy_from_slice(&[2, 0, 0, 0, 0, 1]);
    f[6..12].copy_from_slice(&[2, 0, 0, 0, 0, 2]);
    f[12..14].copy_from_slice(&[0x08, 0x00]);
    f[14] = 0x45;
    f[16..18].copy_from_slice(&((20 + l4len) as u16).to_be_bytes());
    f[18..20].copy_from_slice(&0x1234u16.to_be_bytes());
    f[20] = 0x40; // DF
    f[22] = 64;
    f[23] = proto;
    f[26..30].copy_from_slice(&src.to_be_bytes());
    f[30..34].copy_from_slice(&dst.to_be_bytes());
    f[34..36].copy_from_slice(&sport.to_be_bytes());
    f[36..38].copy_from_slice(&dport.to_be_bytes());
    if proto == 6 {
        f[46] = 0x50;
        f[47] = 0x10; // ACK
    } else {
        f[38..40].copy_from_slice(&(l4len as u16).to_be_bytes());
    }
    for (i, b) in f[34 + l4len - payload..].iter_mut().enumerate() {
        *b = (i as u8).wrapping_mul(37).wrapping_add(proto);
    }
    let c = ip_csum(&f[14..34]);
    f[24..26].copy_from_slice(&c.to_be_bytes());
    let c = l4_csum(&f);
    let at = if proto == 6 { 50 } else { 40 };
    f[at..at + 2].copy_from_slice(&c.to_be_bytes());
    f
}

/// RFC 1624 delta from the old to the new 16-bit words.
fn delta(old: &[u8], new: &[u8]) -> u16 {
    fold(
        sum16(new)
            + old
                .chunks(2)
                .map(|c| u32::from(!u16::from_be_bytes([c[0], c[1]])))
                .sum::<u32>(),
    )
}

fn action(f: &[u8], src: u32, dst: u32, sport: u16, dport: u16) -> OffloadAction {
    let mut old = Vec::new();
    old.extend_from_slice(&f[26..34]);
    let mut new = Vec::new();
    new.extend_from_slice(&src.to_be_bytes());
    new.extend_from_slice(&dst.to_be_bytes());
    let ip_addr = delta(&old, &new);
    // TTL 64 -> 63 in the (TTL, protocol) word.
    let ttl = delta(&[f[22], f[23]], &[f[22].wrapping_sub(1), f[23]]);
    let mut old4 = old.clone();
    old4.extend_from_slice(&f[34..38]);
    let mut new4 = new.clone();
    new4.extend_from_slice(&sport.to_be_bytes());
    new4.extend_from_slice(&dport.to_be_bytes());
    OffloadAction {
        src,
        dst,
        sport,
        dport,
        ip_delta: fold(u32::from(ip_addr) + u32::from(ttl)),
        l4_delta: delta(&old4, &new4),
        dst_mac: [0x02, 0xaa, 0xbb, 0xcc, 0xdd, 0xee],
        src_mac: [0x02, 0x11, 0x22, 0x33, 0x44, 0x55],
        oif: 7,
        mtu: 1500,
    }
}

fn key_of(f: &[u8], ifindex: u32) -> OffloadKey {
    let w = |o: usize| u32::from_be_bytes([f[o], f[o + 1], f[o + 2], f[o + 3]]);
    OffloadKey {
        ifindex,
        src: w(26),
        dst: w(30),
        sport: u16::from_be_bytes([f[34], f[35]]),
        dport: u16::from_be_bytes([f[36], f[37]]),
        proto: f[23],
    }
}

fn run(
    map: &mut HashMap<[u8; KEY_SIZE], [u8; VALUE_SIZE]>,
    f: &mut Vec<u8>,
    ifindex: u32,
) -> Outcome {
    let mut vm = Vm {
        frame: f,
        ifindex,
        map,
        stack: [0; 512],
        mapped: None,
    };
    vm.run(&program())
}

#[test]
fn a_hit_is_translated_with_valid_checksums_and_counted() {
    for proto in [6u8, 17] {
        for payload in [0usize, 1, 18, 1000] {
            let mut f = frame(proto, 0x0a00_0002, 0xcb00_7102, 40_000, 53, payload);
            let a = action(&f, 0xcb00_7101, 0xcb00_7102, 61_234, 53);
            let k = key_of(&f, 3);
            let mut map = HashMap::new();
            map.insert(key(&k), value(&a));
            let len = f.len() as u64;
            assert_eq!(run(&mut map, &mut f, 3), Outcome::Redirect(7));
            assert_eq!(f[0..6], a.dst_mac);
            assert_eq!(f[6..12], a.src_mac);
            assert_eq!(f[22], 63, "TTL");
            assert_eq!(key_of(&f, 3).src, a.src);
            assert_eq!(key_of(&f, 3).sport, a.sport);
            assert_eq!(u16::from_be_bytes([f[24], f[25]]), ip_csum(&f[14..34]));
            let at = if proto == 6 { 50 } else { 40 };
            assert_eq!(
                u16::from_be_bytes([f[at], f[at + 1]]),
                l4_csum(&f),
                "{proto} {payload}"
            );
            let st = stats_of(&map[&key(&k)]);
            assert_eq!(
                st,
                OffloadStats {
                    packets: 1,
                    bytes: len,
                }
            );
        }
    }
}

#[test]
fn a_zero_udp_checksum_stays_zero() {
    let mut f = frame(17, 0x0a00_0002, 0xcb00_7102, 40_000, 53, 18);
    f[40] = 0;
    f[41] = 0;
    let a = action(&f, 0xcb00_7101, 0xcb00_7102, 61_234, 53);
    let mut map = HashMap::new();
    map.insert(key(&key_of(&f, 3)), value(&a));
    assert_eq!(run(&mut map, &mut f, 3), Outcome::Redirect(7));
    assert_eq!(f[40..42], [0, 0]);
    assert_eq!(u16::from_be_bytes([f[24], f[25]]), ip_csum(&f[14..34]));
}

#[test]
fn everything_else_falls_through_untouched() {
    let base = frame(6, 0x0a00_0002, 0xcb00_7102, 40_000, 80, 10);
    let a = action(&base, 0xcb00_7101, 0xcb00_7102, 61_234, 80);
    let mut map = HashMap::new();
    map.insert(key(&key_of(&base, 3)), value(&a));
    type Edit = Box<dyn Fn(&mut Vec<u8>)>;
    let cases: Vec<(&str, Edit, u32)> = vec![
        ("other ifindex", Box::new(|_| {}), 4),
        ("other port", Box::new(|f| f[35] ^= 1), 3),
        ("SYN", Box::new(|f| f[47] = 0x02), 3),
        ("FIN", Box::new(|f| f[47] = 0x11), 3),
        ("RST", Box::new(|f| f[47] = 0x14), 3),
        ("TTL 1", Box::new(|f| f[22] = 1), 3),
        ("options", Box::new(|f| f[14] = 0x46), 3),
        ("more fragments", Box::new(|f| f[20] = 0x20), 3),
        ("fragment offset", Box::new(|f| f[21] = 1), 3),
        ("ARP", Box::new(|f| f[13] = 0x06), 3),
        (
            "VLAN",
            Box::new(|f| f[12..14].copy_from_slice(&[0x81, 0])),
            3,
        ),
        (
            "above the MTU",
            Box::new(|f| f[16..18].copy_from_slice(&1501u16.to_be_bytes())),
            3,
        ),
    ];
    for (what, edit, ifindex) in cases {
        let mut f = base.clone();
        edit(&mut f);
        let want = f.clone();
        assert_eq!(run(&mut map, &mut f, ifindex), Outcome::Miss, "{what}");
        assert_eq!(f, want, "{what}: frame untouched");
    }
    // Truncated frames: every length below a TCP header's end.
    for len in 0..54 {
        let mut f = base[..len].to_vec();
        assert_eq!(run(&mut map, &mut f, 3), Outcome::Miss, "len {len}");
        assert_eq!(f, base[..len], "len {len}");
    }
    // A UDP frame needs only its 8-byte header.
    let mut u = frame(17, 0x0a00_0002, 0xcb00_7102, 40_000, 53, 0);
    let a = action(&u, 0xcb00_7101, 0xcb00_7102, 61_234, 53);
    map.insert(key(&key_of(&u, 3)), value(&a));
    assert_eq!(u.len(), 42);
    assert_eq!(run(&mut map, &mut u, 3), Outcome::Redirect(7));
    for len in 0..42 {
        let mut f = u[..len].to_vec();
        assert_eq!(run(&mut map, &mut f, 3), Outcome::Miss, "len {len}");
    }
}

#[test]
fn the_prefix_is_well_formed() {
    let (p, at) = prefix();
    assert_eq!(p[at].code, LD_IMM64);
    assert_eq!(p[at].regs, (PSEUDO_MAP_FD << 4) | R1);
    assert_eq!(p.last().map(|i| i.code), Some(MOV_X), "ends with r1 = ctx");
    for (n, i) in p.iter().enumerate() {
        if i.code & 0x07 == 0x05 && i.code != CALL && i.code != EXIT {
            let to = n as i64 + 1 + i64::from(i.off);
            assert!(
                to > n as i64 && to <= p.len() as i64,
                "jump at {n}: forward, inside or to the end"
            );
        }
    }
}

proptest::proptest! {
    /// Any byte string, installed as a flow or not: the program never reads
    /// or writes outside the frame (the interpreter panics if it does), a
    /// miss leaves the frame as it was, and a hit keeps its length and
    /// leaves a valid IPv4 header checksum when the frame had one.
    #[test]
    fn any_frame_is_handled_within_its_bounds(
        mut f in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..120),
        ipv4 in proptest::prelude::any::<bool>(),
        install in proptest::prelude::any::<bool>(),
    ) {
        if ipv4 && f.len() >= 54 {
            f[12] = 0x08;
            f[13] = 0x00;
            f[14] = 0x45;
            let tot = (f.len() - 14) as u16;
            f[16..18].copy_from_slice(&tot.to_be_bytes());
            f[20] &= 0x40;
            f[21] = 0;
            f[22] = f[22].max(2);
            f[23] = if f[23] & 1 == 0 { 6 } else { 17 };
            if f[23] == 6 {
                f[47] &= !0x07;
            }
            let c = ip_csum(&f[14..34]);
            f[24..26].copy_from_slice(&c.to_be_bytes());
        }
        let mut map = HashMap::new();
        if install && f.len() >= 38 {
            let a = action(&f, 0xcb00_7101, 0xcb00_7102, 61_234, 53);
            map.insert(key(&key_of(&f, 3)), value(&a));
        }
        let before = f.clone();
        let out = run(&mut map, &mut f, 3);
        if ipv4 && install && before.len() >= 54 {
            // A plain IPv4 TCP/UDP frame of an installed flow is a hit.
            proptest::prop_assert_eq!(&out, &Outcome::Redirect(7));
        }
        match out {
            Outcome::Miss => proptest::prop_assert_eq!(&f, &before),
            Outcome::Redirect(oif) => {
                proptest::prop_assert_eq!(oif, 7);
                proptest::prop_assert_eq!(f.len(), before.len());
                if ip_csum(&before[14..34]) == u16::from_be_bytes([before[24], before[25]]) {
                    proptest::prop_assert_eq!(
                        u16::from_be_bytes([f[24], f[25]]),
                        ip_csum(&f[14..34])
                    );
                }
            }
        }
    }
}
