//! Steering for several workers sharing one interface: the classic-BPF
//! program an AF_PACKET fanout group runs (`PACKET_FANOUT_CBPF`) to pick the
//! worker that owns each frame.
//!
//! # Why
//!
//! NAT splits the external port space between workers: the worker owning
//! port `p` is [`owner_of`]`(p, workers) = (p >> 1) % workers` (the
//! same pure function as `sluice_nat::owner_of`; the daemon tests that they
//! agree).
//! A reply arriving on the public side must reach that worker, because only
//! it holds the mapping and the connection. Hash fanout cannot know this;
//! a cBPF program can compute it from the packet.
//!
//! # The rule
//!
//! Every frame is steered by one 16-bit **key** `k`, to worker
//! [`owner_of`]`(k, workers)`:
//!
//! | frame | [`SteerKey::Destination`] (outside) | [`SteerKey::Source`] (inside) | [`SteerKey::Symmetric`] |
//! |---|---|---|---|
//! | TCP / UDP | destination port | source port | src port ^ dst port |
//! | ICMP query (echo, timestamp, info, mask) | identifier | identifier | identifier |
//! | ICMP error quoting TCP / UDP | quoted **source** port | quoted **destination** port | quoted ports xor'd |
//! | ICMP error quoting an ICMP query | quoted identifier | quoted identifier | quoted identifier |
//! | other IPv4 protocols, and every IPv4 fragment (MF or an offset) | src addr ^ dst addr | same | same |
//! | IPv6 (any next header, extension headers and fragments included) | [`addrs6`] of src and dst | same | same |
//! | ICMPv6 error (types 1-4) right after the fixed header | [`addrs6`] of the **quoted** header | same | same |
//! | NDP (ICMPv6 133-137 right after the fixed header) | worker 0 | worker 0 | worker 0 |
//! | ARP, other non-IP, anything truncated | worker 0 | worker 0 | worker 0 |
//!
//! Why this is consistent, with an inside and an outside interface:
//!
//! - SNAT / masquerade: the worker that sees a subscriber's packet
//!   allocates the external port from its own slice, so the reply's
//!   destination port (outside: `Destination`) names that worker. Steering
//!   inside by source port keeps every flow of one internal endpoint on one
//!   worker, so endpoint-independent mapping (RFC 4787 REQ-1) holds across
//!   workers. ICMP query identifiers are translated into the worker's slice
//!   the same way (RFC 5508 section 3.1).
//! - Un-translated flows (plain forwarding, DNAT that keeps the port): the
//!   reply's destination port is the original source port, or its source
//!   port the original destination port, so both directions meet.
//! - ICMP errors quote the packet that travelled the other way, so they use
//!   the other port of the quoted header (RFC 5508 section 4.2).
//!
//! - IPv6 is never translated here (no NAT66), so it only needs both
//!   directions of a flow, and the ICMPv6 errors about it, to meet. The
//!   key is [`addrs6`]: the xor of the eight 32-bit words of the source
//!   and destination addresses, folded to 16 bits. Xor is symmetric, so a
//!   reply (addresses swapped) meets its request on either interface,
//!   whatever the roles; an ICMPv6 error quotes the packet that caused it,
//!   whose two addresses are the flow's, so keying it by the quoted
//!   addresses brings `related` errors (packet too big, unreachable, time
//!   exceeded, parameter problem) to the flow's worker. Ports would spread
//!   one host pair's flows too, but they are not where a fixed-offset
//!   program can find them when extension headers come first, they are
//!   missing from non-first fragments, and a direction carrying an
//!   extension header the other lacks would split the flow; the addresses
//!   are always at fixed offsets. The price: all traffic between one pair
//!   of hosts goes to one worker. An ICMPv6 error behind an extension
//!   header is steered by its own addresses (RFC 4443 errors come without
//!   them in practice).
//! - NDP (router and neighbour solicitation and advertisement, redirect)
//!   goes to worker 0, like ARP: worker 0 learns every neighbour and shares
//!   it with the other workers (`sluice_daemon` `Command::SetNeighbor6`),
//!   which is how an advertisement answering another worker's solicitation
//!   reaches it.
//!
//! What it cannot steer: DNAT that changes the port to a value on another
//! worker and hairpinning (the engine hands those frames to the owning
//! worker: `sluice_engine`'s `Action::Handoff`), and flows between two
//! interfaces of the same role (the daemon warns).
//!
//! # Program shape
//!
//! Loads are relative to the network header (`SKF_NET_OFF`), so the program
//! does not depend on where the kernel's `skb->data` points when the fanout
//! runs; the IP version nibble tells IPv4 from IPv6 (an ARP frame's first
//! byte is 0). Out-of-bounds loads make the kernel return 0 (worker 0), as
//! [`run`] does. Every IPv4 fragment, the first included (MF set or a
//! non-zero offset), is steered by its addresses, so that all fragments of
//! a datagram reach one worker, which hands the first one to the worker its
//! ports name and the later ones after it (the engine's fragment table);
//! there is no reassembly before the program. IPv6 is steered by addresses
//! only.
//!
//! On AF_XDP the same rule is applied by an XDP program (`afxdp::bpf`),
//! which sees the whole frame: it parses Ethernet (IPv4 and IPv6
//! ethertypes) and one VLAN tag itself, then decides on the IP version
//! nibble as the cBPF program does, every IPv4 fragment by its addresses
//! included. [`worker_for`] is the rule in plain Rust; the tests run
//! both programs against it.

/// What the steering key is for frames of one interface.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SteerKey {
    /// The L4 destination port: the public (outside) side, where replies to
    /// NAT mappings arrive.
    Destination,
    /// The L4 source port: the private (inside) side.
    Source,
    /// Both ports xor'd: an interface with no role (consistent only for
    /// flows between two such interfaces).
    Symmetric,
}

/// Steering of one interface's fanout group.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Steer {
    /// Which field picks the worker.
    pub key: SteerKey,
    /// Workers in the group (the members' join order is the worker index).
    pub workers: u16,
}

/// The worker that owns external port `port`: `(port >> 1) % workers` (0
/// if `workers` is 0). Identical to `sluice_nat::owner_of` (dropping the
/// low bit spreads the runs of even ports Linux gives `connect()` over all
/// workers).
#[inline]
pub const fn owner_of(port: u16, workers: u16) -> u16 {
    if workers == 0 {
        0
    } else {
        (port >> 1) % workers
    }
}

/// The worker [`program`] picks for a frame whose network header starts at
/// `l3`: the steering decision in plain Rust, shared by the classic-BPF
/// fanout program (AF_PACKET) and the XDP program (AF_XDP,
/// `afxdp::bpf::steer_program`); both are tested against it. A
/// load past the end of `l3` decides worker 0, as the kernel does for the
/// cBPF program; so does a frame that is neither IPv4 nor IPv6, and NDP.
pub fn worker_for(steer: Steer, l3: &[u8]) -> u16 {
    key_of(steer.key, l3).map_or(0, |k| owner_of(k, steer.workers.max(1)))
}

/// The 16-bit steering key of `l3` (see the table above), `None` when the
/// frame goes to worker 0 without one (not IP, NDP, or truncated).
fn key_of(key: SteerKey, l3: &[u8]) -> Option<u16> {
    if l3.first()? >> 4 == 6 {
        return key_of6(l3);
    }
    let b = |o: usize| l3.get(o).copied();
    let h = |o: usize| {
        Some(u16::from_be_bytes([
            *l3.get(o)?,
            *l3.get(o.checked_add(1)?)?,
        ]))
    };
    let addrs = || Some(fold(word(l3, 12)? ^ word(l3, 16)?));
    let ports = |base: usize, quoted: bool| match (key, quoted) {
        (SteerKey::Destination, false) | (SteerKey::Source, true) => h(base + 2),
        (SteerKey::Source, false) | (SteerKey::Destination, true) => h(base),
        (SteerKey::Symmetric, _) => {
            let a = h(base)?;
            Some(a ^ h(base + 2)?)
        }
    };
    if b(0)? >> 4 != 4 {
        return None;
    }
    if h(6)? & 0x3fff != 0 {
        return addrs();
    }
    let x = usize::from(b(0)? & 0x0f) * 4;
    match b(9)? {
        6 | 17 => ports(x, false),
        1 => {
            let ty = u32::from(b(x)?);
            if ICMP_QUERIES.contains(&ty) {
                h(x + 4)
            } else if ICMP_ERRORS.contains(&ty) {
                let proto = b(x + 8 + 9)?;
                let qx = x + usize::from(b(x + 8)? & 0x0f) * 4;
                match proto {
                    6 | 17 => ports(qx + 8, true),
                    1 => h(qx + 8 + 4),
                    _ => addrs(),
                }
            } else {
                addrs()
            }
        }
        _ => addrs(),
    }
}

/// The IPv6 key (see the table above): [`addrs6`] of the header, or of
/// the header an ICMPv6 error quotes; `None` for NDP and truncated frames.
fn key_of6(l3: &[u8]) -> Option<u16> {
    if *l3.get(6)? == ICMP6 {
        match *l3.get(40)? {
            ICMP6_ERRORS_FIRST..=ICMP6_ERRORS_LAST => return addrs6(l3.get(48..)?),
            NDP_FIRST..=NDP_LAST => return None,
            _ => {}
        }
    }
    addrs6(l3)
}

/// The symmetric IPv6 address key: the xor of the eight big-endian 32-bit
/// words of the source and destination addresses (bytes 8..40 of the
/// header `l3` starts with), folded to 16 bits by xoring its halves.
/// `None` when the addresses are truncated.
pub fn addrs6(l3: &[u8]) -> Option<u16> {
    let mut a = 0u32;
    for i in 0..8 {
        a ^= word(l3, 8 + 4 * i)?;
    }
    Some(fold(a))
}

/// The big-endian 32-bit word at `o`.
fn word(l3: &[u8], o: usize) -> Option<u32> {
    Some(u32::from_be_bytes(
        l3.get(o..o.checked_add(4)?)?.try_into().ok()?,
    ))
}

/// 32 bits to 16: the xor of the two halves.
const fn fold(a: u32) -> u16 {
    ((a >> 16) ^ a) as u16
}

/// One classic BPF instruction (`struct sock_filter`).
pub type Insn = libc::sock_filter;

// Classic BPF opcodes (linux/bpf_common.h, linux/filter.h).
const LD: u16 = 0x00;
const LDX: u16 = 0x01;
const ST: u16 = 0x02;
const ALU: u16 = 0x04;
const JMP: u16 = 0x05;
const RET: u16 = 0x06;
const MISC: u16 = 0x07;
const W: u16 = 0x00;
const H: u16 = 0x08;
const B: u16 = 0x10;
const ABS: u16 = 0x20;
const IND: u16 = 0x40;
const MEM: u16 = 0x60;
const MSH: u16 = 0xa0;
const ADD: u16 = 0x00;
const LSH: u16 = 0x60;
const RSH: u16 = 0x70;
const AND: u16 = 0x50;
const MOD: u16 = 0x90;
const XOR: u16 = 0xa0;
const JA: u16 = 0x00;
const JEQ: u16 = 0x10;
const JGT: u16 = 0x20;
const JGE: u16 = 0x30;
const JSET: u16 = 0x40;
const K: u16 = 0x00;
const X: u16 = 0x08;
const RET_A: u16 = 0x10;
const TAX: u16 = 0x00;

/// `SKF_NET_OFF`: loads at `NET + k` read byte `k` of the network header.
const NET: u32 = (-0x0010_0000i32) as u32;

/// Jump target while assembling.
#[derive(Clone, Copy)]
enum T {
    Next,
    L(Label),
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Label {
    Ports,
    Query,
    Error,
    InnerPorts,
    InnerQuery,
    Addrs,
    Fold,
    V6,
    V6Error,
    V6Addrs,
    Key,
    Zero,
}

struct Asm {
    code: Vec<(u16, T, T, u32, Option<Label>)>,
}

impl Asm {
    fn op(&mut self, code: u16, k: u32) {
        self.code.push((code, T::Next, T::Next, k, None));
    }
    fn jmp(&mut self, code: u16, k: u32, jt: T, jf: T) {
        self.code.push((code, jt, jf, k, None));
    }
    fn ja(&mut self, to: Label) {
        // `ja` uses k as the offset; resolved like jt.
        self.code.push((JMP | JA, T::L(to), T::Next, 0, None));
    }
    fn label(&mut self, l: Label) {
        // Marks the next instruction.
        self.code.push((u16::MAX, T::Next, T::Next, 0, Some(l)));
    }

    fn finish(self) -> Vec<Insn> {
        let mut pos = Vec::new();
        let mut n = 0usize;
        for c in &self.code {
            match c.4 {
                Some(l) => pos.push((l, n)),
                None => n += 1,
            }
        }
        let at = |l: Label| pos.iter().find(|p| p.0 == l).map_or(0, |p| p.1);
        let mut out = Vec::with_capacity(n);
        for &(code, jt, jf, k, l) in &self.code {
            if l.is_some() {
                continue;
            }
            let i = out.len();
            let off = |t: T| match t {
                T::Next => 0,
                T::L(l) => at(l) - (i + 1),
            };
            if code == JMP | JA {
                out.push(Insn {
                    code,
                    jt: 0,
                    jf: 0,
                    k: off(jt) as u32,
                });
            } else {
                out.push(Insn {
                    code,
                    jt: off(jt) as u8,
                    jf: off(jf) as u8,
                    k,
                });
            }
        }
        out
    }
}

/// ICMP types whose message carries an identifier (RFC 792: echo reply 0,
/// echo 8, timestamp 13/14, information 15/16; RFC 950: address mask
/// 17/18).
pub(crate) const ICMP_QUERIES: [u32; 8] = [0, 8, 13, 14, 15, 16, 17, 18];
/// ICMP error types that quote the offending datagram (RFC 792, RFC 1812
/// section 4.3.2.3): unreachable 3, source quench 4, redirect 5, time
/// exceeded 11, parameter problem 12.
pub(crate) const ICMP_ERRORS: [u32; 5] = [3, 4, 5, 11, 12];
/// IPv6 next header of ICMPv6 (RFC 4443).
pub(crate) const ICMP6: u8 = 58;
/// ICMPv6 errors that quote the invoking packet (RFC 4443 section 3):
/// destination unreachable 1, packet too big 2, time exceeded 3, parameter
/// problem 4. The quoted header starts 8 bytes into the message.
pub(crate) const ICMP6_ERRORS_FIRST: u8 = 1;
/// See [`ICMP6_ERRORS_FIRST`].
pub(crate) const ICMP6_ERRORS_LAST: u8 = 4;
/// NDP messages (RFC 4861 section 4): router solicitation 133, router
/// advertisement 134, neighbour solicitation 135, neighbour advertisement
/// 136, redirect 137. They go to worker 0.
pub(crate) const NDP_FIRST: u8 = 133;
/// See [`NDP_FIRST`].
pub(crate) const NDP_LAST: u8 = 137;
/// Offset of the quoted IPv6 header in an ICMPv6 error after a fixed IPv6
/// header: 40 + the 8-byte ICMPv6 error header.
pub(crate) const QUOTED6: u32 = 48;

/// Build the fanout program for `steer`. It returns the worker index
/// ([`owner_of`] of the key); the kernel takes the result modulo the group
/// size.
pub fn program(steer: Steer) -> Vec<Insn> {
    let workers = u32::from(steer.workers.max(1));
    let mut a = Asm { code: Vec::new() };
    use Label::*;
    // IPv4, IPv6 or neither (the version nibble)?
    a.op(LD | B | ABS, NET);
    a.op(ALU | RSH | K, 4);
    a.jmp(JMP | JEQ | K, 6, T::L(V6), T::Next);
    a.jmp(JMP | JEQ | K, 4, T::Next, T::L(Zero));
    // Every fragment (MF or an offset): by addresses, so all fragments of
    // a datagram meet on one worker (later ones have no L4 header).
    a.op(LD | H | ABS, NET + 6);
    a.jmp(JMP | JSET | K, 0x3fff, T::L(Addrs), T::Next);
    // X = outer header length.
    a.op(LDX | B | MSH, NET);
    a.op(LD | B | ABS, NET + 9);
    a.jmp(JMP | JEQ | K, 6, T::L(Ports), T::Next);
    a.jmp(JMP | JEQ | K, 17, T::L(Ports), T::Next);
    a.jmp(JMP | JEQ | K, 1, T::Next, T::L(Addrs));
    a.op(LD | B | IND, NET);
    for t in ICMP_QUERIES {
        a.jmp(JMP | JEQ | K, t, T::L(Query), T::Next);
    }
    for t in ICMP_ERRORS {
        a.jmp(JMP | JEQ | K, t, T::L(Error), T::Next);
    }
    a.ja(Addrs);

    // TCP / UDP: the ports at X.
    a.label(Ports);
    ports(&mut a, steer.key, NET, false);
    a.ja(Key);

    a.label(Query);
    a.op(LD | H | IND, NET + 4);
    a.ja(Key);

    // ICMP error: the quoted header starts at X + 8.
    a.label(Error);
    a.op(LD | B | IND, NET + 8 + 9);
    a.op(ST, 0); // M[0] = quoted protocol
    a.op(LD | B | IND, NET + 8);
    a.op(ALU | AND | K, 0x0f);
    a.op(ALU | LSH | K, 2);
    a.op(ALU | ADD | X, 0);
    a.op(MISC | TAX, 0); // X = outer + quoted header lengths
    a.op(LD | MEM, 0);
    a.jmp(JMP | JEQ | K, 6, T::L(InnerPorts), T::Next);
    a.jmp(JMP | JEQ | K, 17, T::L(InnerPorts), T::Next);
    a.jmp(JMP | JEQ | K, 1, T::L(InnerQuery), T::L(Addrs));
    a.label(InnerPorts);
    ports(&mut a, steer.key, NET + 8, true);
    a.ja(Key);
    a.label(InnerQuery);
    a.op(LD | H | IND, NET + 8 + 4);
    a.ja(Key);

    // IPv6: ICMPv6 right after the fixed header may be an error (keyed by
    // the quoted addresses) or NDP (worker 0); anything else is keyed by
    // its own addresses.
    a.label(V6);
    a.op(LD | B | ABS, NET + 6);
    a.jmp(JMP | JEQ | K, u32::from(ICMP6), T::Next, T::L(V6Addrs));
    a.op(LD | B | ABS, NET + 40);
    a.jmp(JMP | JGT | K, u32::from(NDP_LAST), T::L(V6Addrs), T::Next);
    a.jmp(JMP | JGE | K, u32::from(NDP_FIRST), T::L(Zero), T::Next);
    a.jmp(
        JMP | JGT | K,
        u32::from(ICMP6_ERRORS_LAST),
        T::L(V6Addrs),
        T::Next,
    );
    a.jmp(
        JMP | JGE | K,
        u32::from(ICMP6_ERRORS_FIRST),
        T::L(V6Error),
        T::L(V6Addrs),
    );
    a.label(V6Error);
    xor_addrs6(&mut a, NET + QUOTED6);
    a.ja(Fold);
    a.label(V6Addrs);
    xor_addrs6(&mut a, NET);
    a.ja(Fold);

    // Anything else: a symmetric function of the addresses.
    a.label(Addrs);
    a.op(LD | W | ABS, NET + 12);
    a.op(MISC | TAX, 0);
    a.op(LD | W | ABS, NET + 16);
    a.op(ALU | XOR | X, 0);
    // A (32 bits) -> 16: the xor of its halves.
    a.label(Fold);
    a.op(MISC | TAX, 0);
    a.op(ALU | RSH | K, 16);
    a.op(ALU | XOR | X, 0);
    a.op(ALU | AND | K, 0xffff);

    // owner_of(A): (A >> 1) % workers.
    a.label(Key);
    a.op(ALU | RSH | K, 1);
    a.op(ALU | MOD | K, workers);
    a.op(RET | RET_A, 0);
    a.label(Zero);
    a.op(RET | K, 0);
    a.finish()
}

/// A = the xor of the eight address words of the IPv6 header at `base`
/// ([`addrs6`] before the fold).
fn xor_addrs6(a: &mut Asm, base: u32) {
    a.op(LD | W | ABS, base + 8);
    for i in 1..8 {
        a.op(MISC | TAX, 0);
        a.op(LD | W | ABS, base + 8 + 4 * i);
        a.op(ALU | XOR | X, 0);
    }
}

/// Load the key from the L4 header at `X + base`. `quoted`: the header is
/// quoted by an ICMP error, so it travelled the other way.
fn ports(a: &mut Asm, key: SteerKey, base: u32, quoted: bool) {
    match (key, quoted) {
        (SteerKey::Destination, false) | (SteerKey::Source, true) => {
            a.op(LD | H | IND, base + 2);
        }
        (SteerKey::Source, false) | (SteerKey::Destination, true) => {
            a.op(LD | H | IND, base);
        }
        (SteerKey::Symmetric, _) => {
            a.op(LD | H | IND, base);
            a.op(ST, 1);
            a.op(LD | H | IND, base + 2);
            a.op(LDX | MEM, 1);
            a.op(ALU | XOR | X, 0);
        }
    }
}

/// Run `prog` on `l3` (a frame from its IP header on) the way the kernel
/// does for a fanout group: the return value, 0 when a load is out of
/// bounds or the program is malformed. For tests and `sluice check`-style
/// inspection; not used on the packet path.
pub fn run(prog: &[Insn], l3: &[u8]) -> u32 {
    let load = |k: u32, size: usize| -> Option<u32> {
        let off = usize::try_from(k.wrapping_sub(NET)).ok()?;
        let b = l3.get(off..off.checked_add(size)?)?;
        Some(b.iter().fold(0u32, |v, &x| (v << 8) | u32::from(x)))
    };
    let (mut acc, mut x, mut mem) = (0u32, 0u32, [0u32; 16]);
    let mut pc = 0usize;
    for _ in 0..4096 {
        let Some(i) = prog.get(pc) else { return 0 };
        pc += 1;
        let size = match i.code & 0x18 {
            H => 2,
            B => 1,
            _ => 4,
        };
        match i.code & 0x07 {
            LD => match i.code & 0xe0 {
                ABS => match load(i.k, size) {
                    Some(v) => acc = v,
                    None => return 0,
                },
                IND => match load(x.wrapping_add(i.k), size) {
                    Some(v) => acc = v,
                    None => return 0,
                },
                MEM => acc = mem[i.k as usize % 16],
                _ => return 0,
            },
            LDX => match i.code & 0xe0 {
                MSH => match load(i.k, 1) {
                    Some(v) => x = (v & 0xf) << 2,
                    None => return 0,
                },
                MEM => x = mem[i.k as usize % 16],
                _ => return 0,
            },
            ST => mem[i.k as usize % 16] = acc,
            ALU => {
                let v = if i.code & X != 0 { x } else { i.k };
                acc = match i.code & 0xf0 {
                    ADD => acc.wrapping_add(v),
                    LSH => acc.wrapping_shl(v),
                    RSH => acc.wrapping_shr(v),
                    AND => acc & v,
                    XOR => acc ^ v,
                    MOD if v != 0 => acc % v,
                    _ => return 0,
                };
            }
            JMP => {
                let taken = match i.code & 0xf0 {
                    JA => {
                        pc += i.k as usize;
                        continue;
                    }
                    JEQ => acc == i.k,
                    JGT => acc > i.k,
                    JGE => acc >= i.k,
                    JSET => acc & i.k != 0,
                    _ => return 0,
                };
                pc += usize::from(if taken { i.jt } else { i.jf });
            }
            RET => return if i.code & RET_A != 0 { acc } else { i.k },
            MISC => {
                if i.code & 0xf8 == TAX {
                    x = acc;
                } else {
                    acc = x;
                }
            }
            _ => return 0,
        }
    }
    0
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    fn ipv4(proto: u8, src: [u8; 4], dst: [u8; 4], l4: &[u8]) -> Vec<u8> {
        let mut p = vec![0x45, 0, 0, 0, 0, 0, 0x40, 0, 64, proto, 0, 0];
        p.extend_from_slice(&src);
        p.extend_from_slice(&dst);
        p.extend_from_slice(l4);
        let len = p.len() as u16;
        p[2..4].copy_from_slice(&len.to_be_bytes());
        p
    }

    fn ports(sport: u16, dport: u16) -> Vec<u8> {
        let mut l4 = sport.to_be_bytes().to_vec();
        l4.extend_from_slice(&dport.to_be_bytes());
        l4.extend_from_slice(&[0; 16]);
        l4
    }

    fn icmp(ty: u8, id: u16) -> Vec<u8> {
        let mut l4 = vec![ty, 0, 0, 0];
        l4.extend_from_slice(&id.to_be_bytes());
        l4.extend_from_slice(&[0, 1]);
        l4
    }

    const IN: [u8; 4] = [10, 0, 0, 2];
    const EXT: [u8; 4] = [198, 51, 100, 7];
    const PUB: [u8; 4] = [203, 0, 113, 2];

    fn steer(key: SteerKey, workers: u16) -> Vec<Insn> {
        program(Steer { key, workers })
    }

    /// Frames of every shape the program distinguishes, truncated at
    /// every length, plus pseudo-random mutations of them.
    pub(crate) fn corpus() -> Vec<Vec<u8>> {
        let mut first_frag = ipv4(17, IN, PUB, &ports(40000, 53));
        first_frag[6] = 0x20;
        let mut base = vec![
            first_frag,
            ipv4(6, IN, PUB, &ports(40000, 443)),
            ipv4(17, PUB, EXT, &ports(53, 61001)),
            ipv4(1, PUB, EXT, &icmp(0, 4099)),
            ipv4(1, IN, PUB, &icmp(8, 77)),
            ipv4(1, IN, PUB, &icmp(13, 1234)),
            ipv4(1, IN, PUB, &icmp(9, 1234)),
            ipv4(47, IN, PUB, &[0; 8]),
            vec![0x60, 0, 0, 0, 0, 8, 17, 64],
            vec![0x00, 0x01, 0x08, 0x00, 6, 4],
        ];
        for (proto, l4) in [
            (6u8, ports(50001, 80)[..8].to_vec()),
            (17, ports(80, 50002)[..8].to_vec()),
            (1, icmp(8, 777)),
            (47, vec![0; 8]),
        ] {
            let quoted = ipv4(proto, EXT, PUB, &l4);
            for ty in [3u8, 11, 12] {
                let mut e = vec![ty, 0, 0, 0, 0, 0, 0, 0];
                e.extend_from_slice(&quoted);
                base.push(ipv4(1, [192, 0, 2, 9], EXT, &e));
            }
        }
        base.extend(corpus6());
        let mut opt = ipv4(17, IN, PUB, &[1, 1, 1, 1]);
        opt[0] = 0x46;
        opt.extend_from_slice(&ports(1001, 53));
        base.push(opt);
        let mut frag = ipv4(6, IN, PUB, &ports(1, 2));
        frag[6..8].copy_from_slice(&[0x20, 0x10]);
        base.push(frag);
        let mut out = Vec::new();
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        for f in &base {
            for len in 0..=f.len() {
                out.push(f[..len].to_vec());
            }
            for _ in 0..200 {
                let mut g = f.clone();
                for _ in 0..3 {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    let at = (seed >> 8) as usize % g.len();
                    g[at] = (seed >> 40) as u8;
                }
                out.push(g);
            }
        }
        out
    }

    const IN6: [u8; 16] = [0xfd, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2];
    const PUB6: [u8; 16] = [0x20, 1, 0x0d, 0xb8, 0, 0x99, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2];
    const RTR6: [u8; 16] = [0x20, 1, 0x0d, 0xb8, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];

    /// An IPv6 header (next header `nh`) followed by `payload`.
    pub(crate) fn ipv6(nh: u8, src: [u8; 16], dst: [u8; 16], payload: &[u8]) -> Vec<u8> {
        let mut p = vec![0x60, 0x0a, 0xbc, 0xde];
        p.extend_from_slice(&(payload.len() as u16).to_be_bytes());
        p.extend_from_slice(&[nh, 64]);
        p.extend_from_slice(&src);
        p.extend_from_slice(&dst);
        p.extend_from_slice(payload);
        p
    }

    /// An ICMPv6 message: type, code, checksum, then `rest`.
    fn icmp6(ty: u8, rest: &[u8]) -> Vec<u8> {
        let mut m = vec![ty, 0, 0x12, 0x34];
        m.extend_from_slice(rest);
        m
    }

    /// An ICMPv6 error of type `ty` from `from` to `to` quoting `quoted`.
    fn icmp6_error(ty: u8, from: [u8; 16], to: [u8; 16], quoted: &[u8]) -> Vec<u8> {
        let mut rest = vec![0, 0, 5, 0x78]; // unused / MTU / pointer
        rest.extend_from_slice(quoted);
        ipv6(ICMP6, from, to, &icmp6(ty, &rest))
    }

    /// IPv6 frames of every shape the programs distinguish: TCP, UDP, ICMPv6
    /// echo, errors quoting each of them (whole and cut short), NDP, other
    /// informational ICMPv6, extension headers (hop-by-hop, a fragment
    /// header, an error behind one), a non-first fragment.
    pub(crate) fn corpus6() -> Vec<Vec<u8>> {
        let tcp = ipv6(6, IN6, PUB6, &ports(40000, 443));
        let udp = ipv6(17, PUB6, IN6, &ports(53, 61001));
        let echo = ipv6(ICMP6, IN6, PUB6, &icmp6(128, &[0x10, 0x01, 0, 1]));
        let mut v = vec![
            tcp.clone(),
            udp.clone(),
            echo.clone(),
            ipv6(ICMP6, PUB6, IN6, &icmp6(129, &[0x10, 0x01, 0, 1])),
            ipv6(ICMP6, IN6, PUB6, &icmp6(0, &[0; 8])),
            ipv6(ICMP6, IN6, PUB6, &icmp6(5, &[0; 8])),
            ipv6(ICMP6, IN6, PUB6, &icmp6(127, &[0; 8])),
            ipv6(ICMP6, IN6, PUB6, &icmp6(130, &[0; 20])),
            ipv6(ICMP6, IN6, PUB6, &icmp6(132, &[0; 20])),
            ipv6(ICMP6, IN6, PUB6, &icmp6(138, &[0; 20])),
            ipv6(ICMP6, IN6, PUB6, &icmp6(255, &[0; 20])),
            ipv6(59, IN6, PUB6, &[]),
        ];
        for ty in NDP_FIRST..=NDP_LAST {
            let mut m = vec![0; 4];
            m.extend_from_slice(&PUB6);
            m.extend_from_slice(&[1, 1, 2, 0, 0, 0, 0, 9]);
            v.push(ipv6(ICMP6, RTR6, IN6, &icmp6(ty, &m)));
        }
        for quoted in [&tcp, &udp, &echo] {
            for ty in ICMP6_ERRORS_FIRST..=ICMP6_ERRORS_LAST {
                v.push(icmp6_error(ty, RTR6, IN6, quoted));
                v.push(icmp6_error(ty, RTR6, PUB6, &quoted[..44]));
            }
        }
        // Hop-by-hop options (router alert) before TCP and before an
        // ICMPv6 error; a fragment header before UDP; a non-first fragment.
        let hbh = |nh: u8, inner: &[u8]| {
            let mut p = vec![nh, 0, 5, 2, 0, 0, 1, 0];
            p.extend_from_slice(inner);
            p
        };
        v.push(ipv6(0, IN6, PUB6, &hbh(6, &ports(40000, 443))));
        let err = icmp6(1, &[&[0, 0, 0, 0][..], &tcp].concat());
        v.push(ipv6(0, RTR6, IN6, &hbh(ICMP6, &err)));
        let frag = |off: u16, inner: &[u8]| {
            let mut p = vec![17, 0];
            p.extend_from_slice(&(off << 3 | 1).to_be_bytes());
            p.extend_from_slice(&[0, 0, 0x42, 0x42]);
            p.extend_from_slice(inner);
            p
        };
        v.push(ipv6(44, IN6, PUB6, &frag(0, &ports(5353, 5353))));
        v.push(ipv6(44, IN6, PUB6, &frag(185, &[0xaa; 24])));
        v
    }

    fn all_steers() -> Vec<Steer> {
        let keys = [SteerKey::Destination, SteerKey::Source, SteerKey::Symmetric];
        keys.iter()
            .flat_map(|&key| [1u16, 2, 3, 7].map(|workers| Steer { key, workers }))
            .collect()
    }

    #[test]
    fn ipv6_both_directions_and_their_errors_meet_on_one_worker() {
        let flows = [
            (6u8, ports(40000, 443)),
            (17, ports(5353, 53)),
            (ICMP6, icmp6(128, &[0x10, 0x01, 0, 1])),
        ];
        for s in all_steers() {
            let p = program(s);
            let mut seen = std::collections::BTreeSet::new();
            for host in 0..32u8 {
                let mut src = IN6;
                src[15] = host;
                for (nh, l4) in &flows {
                    let fwd = ipv6(*nh, src, PUB6, l4);
                    let rev = ipv6(*nh, PUB6, src, l4);
                    let w = worker_for(s, &fwd);
                    seen.insert(w);
                    assert_eq!(worker_for(s, &rev), w, "{s:?} reply");
                    assert_eq!(run(&p, &fwd), u32::from(w));
                    // Errors about either direction, from a router on
                    // either side, and the same flow behind a hop-by-hop
                    // header.
                    for ty in ICMP6_ERRORS_FIRST..=ICMP6_ERRORS_LAST {
                        for (q, to) in [(&fwd, src), (&rev, PUB6)] {
                            let e = icmp6_error(ty, RTR6, to, q);
                            assert_eq!(worker_for(s, &e), w, "{s:?} error {ty}");
                            assert_eq!(run(&p, &e), u32::from(w));
                        }
                    }
                    let mut h = vec![*nh, 0, 5, 2, 0, 0, 1, 0];
                    h.extend_from_slice(l4);
                    assert_eq!(worker_for(s, &ipv6(0, src, PUB6, &h)), w);
                }
                // The key is the folded xor of the addresses.
                let k = addrs6(&ipv6(59, src, PUB6, &[]));
                assert_eq!(k, addrs6(&ipv6(59, PUB6, src, &[])));
                let fwd = ipv6(6, src, PUB6, &ports(1, 2));
                assert_eq!(k.map(|k| owner_of(k, s.workers)), Some(worker_for(s, &fwd)));
            }
            assert_eq!(seen.len(), usize::from(s.workers), "{s:?}: {seen:?}");
        }
    }

    #[test]
    fn ndp_and_truncated_ipv6_go_to_worker_zero() {
        for s in all_steers() {
            let p = program(s);
            for ty in NDP_FIRST..=NDP_LAST {
                let f = ipv6(ICMP6, RTR6, IN6, &icmp6(ty, &[0; 20]));
                assert_eq!(worker_for(s, &f), 0, "NDP type {ty}");
                assert_eq!(run(&p, &f), 0);
            }
            let tcp = ipv6(6, IN6, PUB6, &ports(40000, 443));
            let err = icmp6_error(1, RTR6, IN6, &tcp);
            for (f, whole) in [(&tcp, 40), (&err, 88)] {
                for len in 0..whole {
                    assert_eq!(worker_for(s, &f[..len]), 0, "{s:?} len {len}");
                    assert_eq!(run(&p, &f[..len]), 0);
                }
            }
            // ICMPv6 with no type byte.
            assert_eq!(worker_for(s, &ipv6(ICMP6, IN6, PUB6, &[])), 0);
        }
    }

    #[test]
    fn program_and_reference_decide_alike() {
        let frames = corpus();
        for key in [SteerKey::Destination, SteerKey::Source, SteerKey::Symmetric] {
            for workers in [1u16, 2, 3, 7] {
                let s = Steer { key, workers };
                let p = program(s);
                for f in &frames {
                    assert_eq!(
                        run(&p, f),
                        u32::from(worker_for(s, f)),
                        "{key:?} workers {workers} frame {f:02x?}"
                    );
                }
            }
        }
    }

    #[test]
    fn jumps_stay_inside_and_program_ends_with_ret() {
        for key in [SteerKey::Destination, SteerKey::Source, SteerKey::Symmetric] {
            let p = steer(key, 4);
            // Conditional jump offsets are 8 bits: a program of at most
            // 256 instructions cannot have one truncated.
            assert!(p.len() <= 256, "{} instructions", p.len());
            assert_eq!(p.last().map(|i| i.code & 0x07), Some(RET));
            for (n, i) in p.iter().enumerate() {
                if i.code & 0x07 == JMP {
                    let far = if i.code & 0xf0 == JA {
                        i.k as usize
                    } else {
                        usize::from(i.jt.max(i.jf))
                    };
                    assert!(n + 1 + far < p.len(), "jump at {n} leaves the program");
                }
            }
        }
    }

    #[test]
    fn tcp_udp_steer_by_role_port() {
        for w in 1..=8u16 {
            for (sport, dport) in [(40000u16, 443u16), (1025, 65535), (5201, 33333)] {
                for proto in [6u8, 17] {
                    let out = ipv4(proto, PUB, EXT, &ports(dport, sport));
                    let inn = ipv4(proto, IN, PUB, &ports(sport, dport));
                    let d = steer(SteerKey::Destination, w);
                    let s = steer(SteerKey::Source, w);
                    assert_eq!(run(&d, &out), u32::from(owner_of(sport, w)));
                    assert_eq!(run(&s, &inn), u32::from(owner_of(sport, w)));
                    let y = steer(SteerKey::Symmetric, w);
                    assert_eq!(run(&y, &out), run(&y, &inn));
                    assert_eq!(run(&y, &out), u32::from(owner_of(sport ^ dport, w)));
                }
            }
        }
    }

    #[test]
    fn options_move_the_l4_header() {
        let mut p = ipv4(17, IN, PUB, &[0, 0, 0, 0]);
        p.truncate(20);
        p[0] = 0x46;
        p.extend_from_slice(&[1, 1, 1, 1]); // NOP options
        p.extend_from_slice(&ports(1001, 53));
        let o = |p: u16| u32::from(owner_of(p, 4));
        assert_eq!(run(&steer(SteerKey::Source, 4), &p), o(1001));
        assert_eq!(run(&steer(SteerKey::Destination, 4), &p), o(53));
    }

    #[test]
    fn icmp_queries_steer_by_identifier() {
        for ty in ICMP_QUERIES {
            let p = ipv4(1, PUB, EXT, &icmp(ty as u8, 4099));
            for key in [SteerKey::Destination, SteerKey::Source, SteerKey::Symmetric] {
                let o = u32::from(owner_of(4099, 3));
                assert_eq!(run(&steer(key, 3), &p), o, "type {ty}");
            }
        }
    }

    #[test]
    fn icmp_errors_steer_by_the_quoted_flow() {
        // Outside: time exceeded quoting our translated packet EXT:sport -> PUB:80.
        let quoted = ipv4(6, EXT, PUB, &ports(50001, 80)[..8]);
        let mut l4 = vec![11, 0, 0, 0, 0, 0, 0, 0];
        l4.extend_from_slice(&quoted);
        let p = ipv4(1, [192, 0, 2, 9], EXT, &l4);
        let o = |p: u16, w: u16| u32::from(owner_of(p, w));
        assert_eq!(run(&steer(SteerKey::Destination, 4), &p), o(50001, 4));
        // Inside: unreachable from a subscriber, quoting PUB:80 -> IN:50002.
        let quoted = ipv4(17, PUB, IN, &ports(80, 50002)[..8]);
        let mut l4 = vec![3, 3, 0, 0, 0, 0, 0, 0];
        l4.extend_from_slice(&quoted);
        let p = ipv4(1, IN, PUB, &l4);
        assert_eq!(run(&steer(SteerKey::Source, 4), &p), o(50002, 4));
        // Quoting an echo request: its identifier.
        let quoted = ipv4(1, EXT, PUB, &icmp(8, 777));
        let mut l4 = vec![3, 1, 0, 0, 0, 0, 0, 0];
        l4.extend_from_slice(&quoted);
        let p = ipv4(1, [192, 0, 2, 9], EXT, &l4);
        assert_eq!(run(&steer(SteerKey::Destination, 5), &p), o(777, 5));
    }

    #[test]
    fn other_traffic_is_symmetric_or_worker_zero() {
        let a = ipv4(47, IN, PUB, &[0; 8]);
        let b = ipv4(47, PUB, IN, &[0; 8]);
        let p = steer(SteerKey::Source, 4);
        assert_eq!(run(&p, &a), run(&steer(SteerKey::Destination, 4), &b));
        assert!(run(&p, &a) < 4);
        // Fragments, the first one (MF, offset 0) included: addresses,
        // like other protocols, so a datagram's fragments meet.
        let mut f = ipv4(6, IN, PUB, &ports(1, 2));
        f[6..8].copy_from_slice(&[0x00, 0x10]);
        assert_eq!(run(&p, &f), run(&p, &a));
        let mut first = ipv4(6, IN, PUB, &ports(1, 2));
        first[6..8].copy_from_slice(&[0x20, 0x00]);
        assert_eq!(run(&p, &first), run(&p, &a));
        let rule = Steer {
            key: SteerKey::Source,
            workers: 4,
        };
        assert_eq!(worker_for(rule, &first), worker_for(rule, &a));
        // ARP (not IPv4) and truncated frames: worker 0.
        assert_eq!(run(&p, &[0x00, 0x01, 0x08, 0x00, 6, 4]), 0);
        assert_eq!(run(&p, &ipv4(6, IN, PUB, &[0x9c])), 0);
    }
}
