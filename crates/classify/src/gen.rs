//! Seeded rule-set and packet generators, shared by tests and benchmarks.
//!
//! * [`seed001_shape`]: the rule set of seed 001 — `n` rules each dropping one
//!   distinct TCP destination port, followed by the rule the traffic matches
//!   (UDP to the iperf3 port 5201). [`seed001_packets`] generates that traffic.
//! * [`host_list`]: `n` rules each dropping one source address (a block
//!   list written as rules, seed 002's `iptables -A FORWARD -s A` shape);
//!   [`host_list_packets`] sends from those addresses and some others.
//! * [`classbench`]: ClassBench-style 5-tuple ACLs (Taylor & Turner, "ClassBench:
//!   a packet classification benchmark", INFOCOM 2005): source and destination
//!   prefixes of mixed lengths drawn around a pool of networks (so prefixes
//!   nest and overlap), protocol exact or wildcard, ports wildcard / exact /
//!   `0-1023` / `1024-65535` / arbitrary ranges. Rules with both addresses
//!   wildcard come last, as in real ACLs (specific before general): spread
//!   uniformly, they shadowed everything behind the first catch-all, so every
//!   packet was decided within the first ~250 rules at 1 000 to 100 000 rules
//!   (median depth 189 at every size); now the depth grows with the set
//!   (median ~550 at 1 000 rules, ~3 500 at 10 000). [`classbench_packets`] builds
//!   headers the way ClassBench's trace generator does: pick a rule, pick a
//!   point inside it (plus some uniformly random headers).

use crate::ir::Chain;
use crate::ir::{
    map_v4, ChainKind, Field, Match, PacketFields, Policy, Program, Range, Rule, RuleId, Verdict,
};

/// SplitMix64: small, seedable, good enough for test data.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// Seeded generator.
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }
    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in `0..n` (0 when `n == 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next_u64() % n
        }
    }
    /// True with probability `pct` percent.
    pub fn pct(&mut self, pct: u64) -> bool {
        self.below(100) < pct
    }
    /// Uniform in `lo..=hi`.
    pub fn in_range(&mut self, lo: u128, hi: u128) -> u128 {
        let span = hi.wrapping_sub(lo).wrapping_add(1);
        let r = (u128::from(self.next_u64()) << 64) | u128::from(self.next_u64());
        if span == 0 {
            r
        } else {
            lo + r % span
        }
    }
}

const TCP: u128 = 6;
const UDP: u128 = 17;
const ICMP: u128 = 1;

/// The seed-001 shape: `n` rules `tcp dport P drop` with distinct ports
/// (past 60 000 rules the ports repeat and each rule also pins a distinct
/// source address), then `udp dport 5201 accept`; policy drop.
pub fn seed001_shape(n: usize) -> Program {
    let mut rules = Vec::with_capacity(n + 1);
    for i in 0..n {
        let port = 10_000 + (i % 50_000) as u128;
        let mut matches = vec![
            Match::eq(Field::L4Proto, TCP),
            Match::eq(Field::Dport, port),
        ];
        if i >= 50_000 {
            matches.push(Match::eq(Field::Saddr, map_v4(0x0a00_0000 + i as u32)));
        }
        rules.push(Rule {
            id: RuleId(i as u64),
            matches,
            stmts: vec![],
            verdict: Some(Verdict::Drop),
        });
    }
    rules.push(Rule {
        id: RuleId(n as u64),
        matches: vec![
            Match::eq(Field::L4Proto, UDP),
            Match::eq(Field::Dport, 5201),
        ],
        stmts: vec![],
        verdict: Some(Verdict::Accept),
    });
    Program {
        chains: vec![Chain {
            name: "input".into(),
            kind: ChainKind::Base(Policy::Drop),
            rules,
        }],
    }
}

/// Traffic for [`seed001_shape`]: UDP to port 5201 from varying sources.
pub fn seed001_packets(count: usize, seed: u64) -> Vec<PacketFields> {
    let mut r = Rng::new(seed);
    (0..count)
        .map(|_| PacketFields {
            saddr: map_v4(0xc0a8_0000 | r.below(65536) as u32),
            daddr: map_v4(0xc0a8_ff01),
            l4proto: UDP as u8,
            sport: 1024 + r.below(60000) as u16,
            dport: 5201,
            ..Default::default()
        })
        .collect()
}

fn prefix_len(r: &mut Rng) -> u32 {
    match r.below(100) {
        0..=14 => 0,
        15..=19 => 8,
        20..=29 => 16,
        30..=49 => 24,
        50..=59 => 28,
        _ => 32,
    }
}

fn port_cond(r: &mut Rng, field: Field, exact_pct: u64, wild_pct: u64) -> Option<Match> {
    const WELL_KNOWN: [u128; 12] = [20, 21, 22, 23, 25, 53, 80, 110, 143, 443, 993, 8080];
    let x = r.below(100);
    let range = if x < wild_pct {
        return None;
    } else if x < wild_pct + exact_pct {
        let v = if r.pct(60) {
            WELL_KNOWN[r.below(WELL_KNOWN.len() as u64) as usize]
        } else {
            r.below(65536) as u128
        };
        Range::value(v)
    } else if x < wild_pct + exact_pct + 10 {
        Range::new(1024, 65535)
    } else if x < wild_pct + exact_pct + 15 {
        Range::new(0, 1023)
    } else {
        let lo = r.below(65000) as u128;
        Range::new(lo, (lo + 1 + r.below(2000) as u128).min(65535))
    };
    Some(Match::in_ranges(field, [range], false))
}

/// `n` ClassBench-style rules in one base chain (policy drop), seeded.
pub fn classbench(n: usize, seed: u64) -> Program {
    let mut r = Rng::new(seed);
    let pool: Vec<u32> = (0..64)
        .map(|_| (r.next_u64() as u32) & 0xffff_0000)
        .collect();
    let addr = |r: &mut Rng| -> Option<Match> {
        let len = prefix_len(r);
        if len == 0 {
            return None;
        }
        let base = pool[r.below(pool.len() as u64) as usize] | (r.next_u64() as u32 & 0xffff);
        Some(Match::in_ranges(
            Field::Saddr,
            [Range::v4_cidr(base, len)],
            false,
        ))
    };
    let mut rules = Vec::with_capacity(n);
    for i in 0..n {
        let mut m = Vec::new();
        if let Some(Match::In { set, negate, .. }) = addr(&mut r) {
            m.push(Match::In {
                field: Field::Saddr,
                set,
                negate,
            });
        }
        if let Some(Match::In { set, negate, .. }) = addr(&mut r) {
            m.push(Match::In {
                field: Field::Daddr,
                set,
                negate,
            });
        }
        let proto = match r.below(100) {
            0..=54 => Some(TCP),
            55..=84 => Some(UDP),
            85..=89 => Some(ICMP),
            _ => None,
        };
        if let Some(p) = proto {
            m.push(Match::eq(Field::L4Proto, p));
            if p != ICMP {
                m.extend(port_cond(&mut r, Field::Sport, 5, 85));
                m.extend(port_cond(&mut r, Field::Dport, 50, 15));
            }
        }
        rules.push(Rule {
            id: RuleId(i as u64),
            matches: m,
            stmts: vec![],
            verdict: Some(if r.pct(70) {
                Verdict::Accept
            } else {
                Verdict::Drop
            }),
        });
    }
    // Real ACLs put their broad rules last: a rule with both addresses
    // wildcard in the middle of a large set would shadow most of what
    // follows it. Keep the address-specific rules first (in generation
    // order), then the address-wildcard ones.
    let wild = |r: &Rule| {
        !r.matches.iter().any(|m| {
            matches!(
                m,
                Match::In {
                    field: Field::Saddr | Field::Daddr,
                    ..
                }
            )
        })
    };
    let (mut rules, tail): (Vec<Rule>, Vec<Rule>) = rules.into_iter().partition(|r| !wild(r));
    rules.extend(tail);
    for (i, r) in rules.iter_mut().enumerate() {
        r.id = RuleId(i as u64);
    }
    Program {
        chains: vec![Chain {
            name: "forward".into(),
            kind: ChainKind::Base(Policy::Drop),
            rules,
        }],
    }
}

/// A random value satisfying an `In` condition (or a random value otherwise).
fn pick(r: &mut Rng, rule: &Rule, f: Field) -> u128 {
    for m in &rule.matches {
        if let Match::In {
            field,
            set,
            negate: false,
        } = m
        {
            if *field == f && !set.ranges().is_empty() {
                let rg = set.ranges()[r.below(set.ranges().len() as u64) as usize];
                return r.in_range(rg.lo, rg.hi.min(f.max()));
            }
        }
    }
    match f {
        Field::Saddr | Field::Daddr => map_v4(r.next_u64() as u32),
        Field::L4Proto => [TCP, UDP, ICMP][r.below(3) as usize],
        _ => r.in_range(0, f.max()),
    }
}

/// Headers for a rule set: 90 % are a random point inside a random rule of
/// chain 0 (ClassBench trace style), 10 % are uniformly random.
pub fn classbench_packets(prog: &Program, count: usize, seed: u64) -> Vec<PacketFields> {
    let mut r = Rng::new(seed);
    let empty = Vec::new();
    let rules = prog.chains.first().map_or(&empty, |c| &c.rules);
    (0..count)
        .map(|_| {
            let fallback = Rule {
                id: RuleId(u64::MAX),
                matches: vec![],
                stmts: vec![],
                verdict: None,
            };
            let rule = if r.pct(90) && !rules.is_empty() {
                &rules[r.below(rules.len() as u64) as usize]
            } else {
                &fallback
            };
            PacketFields {
                saddr: pick(&mut r, rule, Field::Saddr),
                daddr: pick(&mut r, rule, Field::Daddr),
                l4proto: pick(&mut r, rule, Field::L4Proto) as u8,
                sport: pick(&mut r, rule, Field::Sport) as u16,
                dport: pick(&mut r, rule, Field::Dport) as u16,
                ct_state: crate::ir::ct::NEW,
                ..Default::default()
            }
        })
        .collect()
}

/// `n` rules `ip saddr A drop`, A = 10.0.0.0 + i (consecutive addresses, so
/// 256 share every /24), in one base chain with policy accept.
pub fn host_list(n: usize) -> Program {
    host_rules(n, |i| map_v4(0x0a00_0000u32.wrapping_add(i as u32)))
}

/// The first IPv6 host address of [`host_list6`]: `2001:db8::`.
const HOST6: u128 = 0x2001_0db8_u128 << 96;

/// [`host_list`] in IPv6: `ip6 saddr 2001:db8::i drop` (all in one /64).
pub fn host_list6(n: usize) -> Program {
    host_rules(n, |i| HOST6 + i as u128)
}

/// Traffic for [`host_list6`], as [`host_list_packets`].
pub fn host_list6_packets(n: usize, count: usize, seed: u64) -> Vec<PacketFields> {
    host_packets(
        n,
        count,
        seed,
        |i| HOST6 + u128::from(i),
        |r| (0x2001_0db8_0001_u128 << 80) | u128::from(r.next_u64()),
        (0x2001_0db8_00ff_u128 << 80) | 1,
    )
}

/// `count` TCP headers to port 443 from `listed(i)` for a random `i < n`
/// (90 %) or from `other` (10 %), to `daddr`.
fn host_packets(
    n: usize,
    count: usize,
    seed: u64,
    listed: impl Fn(u64) -> u128,
    other: impl Fn(&mut Rng) -> u128,
    daddr: u128,
) -> Vec<PacketFields> {
    let mut r = Rng::new(seed);
    let family = if daddr >> 32 == map_v4(0) >> 32 {
        crate::ir::Family::V4
    } else {
        crate::ir::Family::V6
    };
    (0..count)
        .map(|_| {
            let saddr = if r.pct(90) && n > 0 {
                listed(r.below(n as u64))
            } else {
                other(&mut r)
            };
            PacketFields {
                family,
                saddr,
                daddr,
                l4proto: TCP as u8,
                sport: 1024 + r.below(60000) as u16,
                dport: 443,
                ct_state: crate::ir::ct::NEW,
                ..Default::default()
            }
        })
        .collect()
}

fn host_rules(n: usize, addr: impl Fn(usize) -> u128) -> Program {
    let rules = (0..n)
        .map(|i| Rule {
            id: RuleId(i as u64),
            matches: vec![Match::eq(Field::Saddr, addr(i))],
            stmts: vec![],
            verdict: Some(Verdict::Drop),
        })
        .collect();
    Program {
        chains: vec![Chain {
            name: "forward".into(),
            kind: ChainKind::Base(Policy::Accept),
            rules,
        }],
    }
}

/// Traffic for [`host_list`] of `n` rules: 90 % from a listed address, 10 %
/// from elsewhere.
pub fn host_list_packets(n: usize, count: usize, seed: u64) -> Vec<PacketFields> {
    host_packets(
        n,
        count,
        seed,
        |i| map_v4(0x0a00_0000u32.wrapping_add(i as u32)),
        |r| map_v4(0xc0a8_0000 | r.below(65536) as u32),
        map_v4(0xc633_6401),
    )
}
