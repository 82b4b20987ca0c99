//! Differential tests: the compiled classifier against the linear evaluator.

use std::sync::Arc;

use proptest::prelude::*;
use sluice_classify::gen::{self, Rng};
use sluice_classify::*;

const V4: [u32; 6] = [
    0x0a00_0000,
    0x0a00_0001,
    0x0a00_0005,
    0x0a00_0080,
    0x0a01_0000,
    0xc0a8_0001,
];
const NAMES: [&str; 5] = ["eth0", "eth1", "wlan0", "lo", "eth10"];

fn addr(r: &mut Rng) -> u128 {
    if r.pct(10) {
        0x2001_0db8_u128 << 96 | r.below(4) as u128
    } else {
        map_v4(V4[r.below(V4.len() as u64) as usize])
    }
}

fn rand_match(r: &mut Rng) -> Match {
    let negate = r.pct(20);
    match r.below(14) {
        0 | 1 => {
            let f = [
                Field::Saddr,
                Field::Daddr,
                Field::Saddr,
                Field::Daddr,
                Field::CtOrigDaddr,
                Field::CtReplySaddr,
            ][r.below(6) as usize];
            let n = 1 + r.below(3);
            let rs: Vec<Range> = (0..n)
                .map(|_| {
                    let a = addr(r);
                    let len = [128, 126, 125, 120, 112, 104, 96][r.below(7) as usize];
                    Range::prefix(a, len, 128)
                })
                .collect();
            Match::in_ranges(f, rs, negate)
        }
        // Protocols of every L4 class of the compiled keys (TCP, UDP,
        // ICMP, ICMPv6, others such as SCTP and GRE), and ranges across them.
        2 => Match::in_ranges(
            Field::L4Proto,
            [
                Range::value([6u128, 17, 1, 58, 132][r.below(5) as usize]),
                if r.pct(80) {
                    Range::value([6u128, 17][r.below(2) as usize])
                } else {
                    let lo = r.below(60) as u128;
                    Range::new(lo, lo + r.below(100) as u128)
                },
            ],
            negate,
        ),
        3 | 4 => {
            let f = [
                Field::Sport,
                Field::Dport,
                Field::Sport,
                Field::Dport,
                Field::CtOrigDport,
                Field::CtReplySport,
            ][r.below(6) as usize];
            let n = 1 + r.below(3);
            let rs: Vec<Range> = (0..n)
                .map(|_| match r.below(5) {
                    0 => Range::value(r.below(10) as u128),
                    // Across the split of the L4 classes at port 1024.
                    4 => {
                        let lo = 1000 + r.below(30) as u128;
                        Range::new(lo, lo + r.below(30) as u128)
                    }
                    1 => {
                        let lo = r.below(20) as u128;
                        Range::new(lo, lo + r.below(8) as u128)
                    }
                    2 => Range::new(r.below(10) as u128, 40000),
                    _ => Range::new(1024, 65535),
                })
                .collect();
            Match::in_ranges(f, rs, negate)
        }
        5 => {
            let f = if r.pct(50) {
                Field::IifName
            } else {
                Field::OifName
            };
            let pats: &[&str] = [
                &["eth*"][..],
                &["eth0"],
                &["wlan0", "eth1"],
                &["eth1*", "lo"],
                &["*"],
            ][r.below(5) as usize];
            Match::ifname(f, pats, negate)
        }
        6 => Match::in_ranges(
            Field::CtState,
            [
                ct::NEW,
                ct::ESTABLISHED,
                ct::RELATED,
                ct::INVALID,
                ct::UNTRACKED,
            ]
            .into_iter()
            .filter(|_| r.pct(50))
            .map(|b| Range::value(b as u128)),
            negate,
        ),
        7 => {
            if r.pct(50) {
                Match::Masked {
                    field: Field::CtState,
                    mask: (ct::ESTABLISHED | ct::RELATED) as u128,
                    value: 0,
                    negate: !negate,
                }
            } else {
                // `ct status dnat` / `ct status snat,dnat`: any of the bits.
                Match::Masked {
                    field: Field::CtStatus,
                    mask: [0x20u128, 0x30, 0x02][r.below(3) as usize],
                    value: 0,
                    negate: !negate,
                }
            }
        }
        8 => {
            if r.pct(50) {
                Match::in_ranges(Field::Mark, [Range::value(r.below(4) as u128)], negate)
            } else {
                Match::Masked {
                    field: Field::Mark,
                    mask: 1,
                    value: r.below(2) as u128,
                    negate,
                }
            }
        }
        9 => Match::in_ranges(Field::CtMark, [Range::value(r.below(3) as u128)], negate),
        10 => Match::Masked {
            field: Field::TcpFlags,
            mask: 0x12,
            value: [0x02u128, 0x12, 0x10][r.below(3) as usize],
            negate,
        },
        11 => {
            let els: Vec<Box<[Range]>> = (0..1 + r.below(5))
                .map(|_| {
                    let port = if r.pct(70) {
                        Range::value(r.below(10) as u128)
                    } else {
                        Range::new(0, r.below(20) as u128)
                    };
                    vec![Range::value(addr(r)), port].into_boxed_slice()
                })
                .collect();
            Match::Concat {
                fields: Arc::from(vec![Field::Daddr, Field::Dport]),
                set: Arc::new(ConcatSet::new(els)),
                negate,
            }
        }
        // The IP header and meta fields (ttl, lengths, dscp, pkttype,
        // time of day).
        12 => {
            let (f, rs) = match r.below(12) {
                8 => (
                    Field::Hour,
                    vec![Range::new(r.below(86_400) as u128, r.below(86_400) as u128)],
                ),
                9 => (Field::Day, vec![Range::value(r.below(7) as u128)]),
                10 => {
                    // 2026-11-30, the second day of the packets.
                    let t = 1_795_996_800_000_000_000u128;
                    (Field::Time, vec![Range::new(t, t + 86_400_000_000_000)])
                }
                0 => (Field::Ttl, vec![Range::new(0, r.below(3) as u128)]),
                1 => (Field::IpLen, vec![Range::new(1000, 1500)]),
                2 => (
                    Field::Dscp,
                    vec![Range::value([0u128, 46, 10][r.below(3) as usize])],
                ),
                3 => (
                    Field::Length,
                    vec![Range::new(r.below(1600) as u128, 65535)],
                ),
                4 => (Field::PktType, vec![Range::value(r.below(3) as u128)]),
                6 => (Field::CtDir, vec![Range::value(r.below(2) as u128)]),
                7 => (Field::RpfIif, vec![Range::value(0)]),
                5 => (
                    Field::EtherSaddr,
                    vec![Range::value(0x0200_0000_0000 | r.below(3) as u128)],
                ),
                _ => (
                    if r.pct(50) {
                        Field::DaddrType
                    } else {
                        Field::SaddrType
                    },
                    vec![Range::value(1 + r.below(3) as u128)],
                ),
            };
            Match::in_ranges(f, rs, negate)
        }
        _ => Match::in_ranges(Field::Iif, [Range::value(1 + r.below(3) as u128)], negate),
    }
}

/// A rule of chain `ci` in a program of `nchains`; jumps only go forward, so
/// the chain graph is acyclic.
fn rand_rule(r: &mut Rng, id: u64, ci: usize, nchains: usize) -> Rule {
    let matches = (0..r.below(4)).map(|_| rand_match(r)).collect();
    let mut stmts = Vec::new();
    // Sometimes a counter or a log first, so that a statement after it may
    // stop the rule once it has run (`Scratch::counted`).
    if r.pct(10) {
        stmts.push(if r.pct(50) {
            Stmt::Counter
        } else {
            Stmt::Log(0)
        });
    }
    // Statements that are matches answered by the caller's state (limits,
    // dynamic sets, quotas, number generators, connection counts, named
    // objects), each with its answer without state.
    if r.pct(15) {
        stmts.push(match r.below(6) {
            0 => Stmt::Limit(r.below(4) as u32),
            1 => Stmt::SetOp {
                id: r.below(4) as u32,
                stateless: r.pct(50),
            },
            2 => Stmt::Quota {
                id: r.below(4) as u32,
                stateless: r.pct(50),
            },
            3 => Stmt::Numgen {
                id: r.below(4) as u32,
                stateless: r.pct(50),
            },
            4 => Stmt::Obj {
                id: r.below(4) as u32,
                stateless: r.pct(50),
            },
            _ => Stmt::CtCount {
                id: r.below(4) as u32,
                stateless: r.pct(50),
            },
        });
    }
    if r.pct(30) {
        stmts.push(match r.below(7) {
            0 => Stmt::MarkSet(MarkOp::set(r.below(4) as u32)),
            // Changes `ct state` (an indexed field) for the rules after it.
            6 => Stmt::Notrack,
            4 => Stmt::MarkFromCtMark,
            5 => Stmt::CtMarkFromMark,
            1 => Stmt::MarkSet(MarkOp {
                and: 0xfffe,
                xor: 1,
            }),
            2 => Stmt::CtMarkSet(MarkOp::set(r.below(3) as u32)),
            _ => Stmt::Counter,
        });
    }
    let targets: Vec<u32> = ((ci + 1).max(1)..nchains).map(|c| c as u32).collect();
    let verdict = match r.below(10) {
        0..=2 => None,
        3 => Some(Verdict::Accept),
        4 => Some(Verdict::Drop),
        5 => Some(if r.pct(50) {
            Verdict::Reject(RejectKind::TcpReset)
        } else {
            Verdict::Nat(r.below(3) as u32)
        }),
        6 => Some(Verdict::Return),
        _ if !targets.is_empty() => {
            let t = ChainId(targets[r.below(targets.len() as u64) as usize]);
            Some(if r.pct(60) {
                Verdict::Jump(t)
            } else {
                Verdict::Goto(t)
            })
        }
        _ => None,
    };
    Rule {
        id: RuleId(id),
        matches,
        stmts,
        verdict,
    }
}

fn rand_program(r: &mut Rng, next_id: &mut u64) -> Program {
    let nchains = 1 + r.below(4) as usize;
    let chains = (0..nchains)
        .map(|ci| Chain {
            name: format!("c{ci}"),
            kind: if ci == 0 {
                ChainKind::Base(if r.pct(50) {
                    Policy::Accept
                } else {
                    Policy::Drop
                })
            } else {
                ChainKind::Regular
            },
            rules: (0..r.below(14))
                .map(|_| {
                    *next_id += 1;
                    rand_rule(r, *next_id, ci, nchains)
                })
                .collect(),
        })
        .collect();
    Program { chains }
}

fn rand_packet(r: &mut Rng) -> PacketFields {
    let port = |r: &mut Rng| {
        if r.pct(80) {
            r.below(24) as u16
        } else {
            r.below(65536) as u16
        }
    };
    let tuple = |r: &mut Rng| CtTuple {
        saddr: addr(r),
        daddr: addr(r),
        sport: port(r),
        dport: port(r),
    };
    PacketFields {
        ct_orig: tuple(r),
        ct_reply: tuple(r),
        frag_off: [0u16, 0x4000][r.below(2) as usize],
        iif: 1 + r.below(3) as u32,
        oif: 1 + r.below(3) as u32,
        iifname: IfName::new(NAMES[r.below(5) as usize]),
        oifname: IfName::new(NAMES[r.below(5) as usize]),
        family: Family::V4,
        saddr: addr(r),
        daddr: addr(r),
        l4proto: [6u8, 17, 1, 6, 17, 58, 132, 47][r.below(8) as usize],
        sport: if r.pct(80) {
            r.below(24) as u16
        } else {
            r.below(65536) as u16
        },
        dport: match r.below(10) {
            0..=6 => r.below(24) as u16,
            7 => 1000 + r.below(60) as u16,
            _ => r.below(65536) as u16,
        },
        tcp_flags: [0x02u8, 0x12, 0x10, 0x11][r.below(4) as usize],
        icmp_type: 0,
        icmp_code: 0,
        ct_state: [
            ct::NEW,
            ct::ESTABLISHED,
            ct::RELATED,
            ct::INVALID,
            ct::UNTRACKED,
        ][r.below(5) as usize],
        ct_mark: r.below(3) as u32,
        mark: r.below(4) as u32,
        ct_status: [0u32, 0x20, 0x10, 0x0a][r.below(4) as usize],
        ttl: r.below(4) as u8,
        ip_len: [40u16, 1000, 1400, 1500][r.below(4) as usize],
        dscp: [0u8, 46, 10, 8][r.below(4) as usize],
        length: r.below(1600) as u32,
        pkttype: r.below(3) as u8,
        daddr_type: [1u8, 2, 3][r.below(3) as usize],
        saddr_type: [1u8, 2][r.below(2) as usize],
        ether_saddr: 0x0200_0000_0000 | r.below(3),
        ether_daddr: 0x0200_0000_0010,
        ct_dir: r.below(2) as u8,
        rpf_iif: r.below(2) as u8,
        rpf_any: 1,
        conn: ConnId::default(),
        // 2026-11-29 and 2026-11-30 (UTC).
        time_ns: 1_795_910_400_000_000_000 + r.below(172_800) * 1_000_000_000,
    }
}

/// `Classifier::eval_batch` against the linear evaluator, packet by packet
/// (outcome and trace), and every index reported once, in order.
fn check_batch(prog: &Program, c: &Classifier, pkts: &[PacketFields]) -> Result<(), String> {
    let (mut s1, mut s2) = (Scratch::new(), Scratch::new());
    let mut next = 0;
    let mut err = None;
    c.eval_batch(ChainId(0), pkts, &mut s2, |i, b, trace| {
        if i != next {
            err.get_or_insert(format!("index {i}, expected {next}"));
        }
        next += 1;
        let p = &pkts[i];
        let a = eval_linear(prog, ChainId(0), p, &mut s1);
        if (a != b || s1.trace != trace) && err.is_none() {
            err = Some(format!(
                "batch mismatch on {p:?}\nlinear   {a:?} {:?}\nbatch    {b:?} {trace:?}",
                s1.trace
            ));
        }
    });
    if next != pkts.len() {
        err.get_or_insert(format!("{next} outcomes for {} packets", pkts.len()));
    }
    err.map_or(Ok(()), Err)
}

/// State whose answers are a pure function of the statement and the
/// packet, so that both evaluators see the same answers whatever order
/// they ask in.
struct PureState;

impl Limits for PureState {
    fn matches(&self, id: u32, _now_ms: u64, _len: u32) -> bool {
        id % 2 == 0
    }

    fn set_op(&self, id: u32, p: &PacketFields, _now_ms: u64, _len: u32, _s: bool) -> bool {
        (u32::from(p.dport) ^ id) % 3 != 0
    }

    fn quota(&self, id: u32, _len: u32, _stateless: bool) -> bool {
        id % 3 != 1
    }

    fn numgen(&self, id: u32, _stateless: bool) -> bool {
        id % 2 == 1
    }

    fn object(&self, id: u32, _now_ms: u64, _len: u32, _stateless: bool) -> bool {
        id % 4 != 2
    }

    fn ct_count(&self, id: u32, p: &PacketFields, _now_ms: u64, _s: bool) -> bool {
        (u32::from(p.sport) + id) % 3 != 0
    }
}

/// [`check`]'s single-packet comparison with [`PureState`] answering.
fn check_with_state(prog: &Program, c: &Classifier, pkts: &[PacketFields]) -> Result<(), String> {
    let (mut s1, mut s2) = (Scratch::new(), Scratch::new());
    let ctx = LimitCtx {
        limits: Arc::new(PureState),
        now_ms: 0,
        len: 64,
    };
    s1.limit = Some(ctx.clone());
    s2.limit = Some(ctx);
    for p in pkts {
        let a = eval_linear(prog, ChainId(0), p, &mut s1);
        let b = c.eval(ChainId(0), p, &mut s2);
        if a != b || s1.trace != s2.trace || s1.counted != s2.counted {
            return Err(format!(
                "mismatch with state on {p:?}\nlinear   {a:?} {:?}\ncompiled {b:?} {:?}",
                s1.trace, s2.trace
            ));
        }
    }
    Ok(())
}

fn check(prog: &Program, c: &Classifier, pkts: &[PacketFields]) -> Result<(), String> {
    check_batch(prog, c, pkts)?;
    check_with_state(prog, c, pkts)?;
    let (mut s1, mut s2) = (Scratch::new(), Scratch::new());
    for p in pkts {
        let a = eval_linear(prog, ChainId(0), p, &mut s1);
        let b = c.eval(ChainId(0), p, &mut s2);
        if a != b || s1.trace != s2.trace {
            return Err(format!(
                "mismatch on {p:?}\nlinear   {a:?} {:?}\ncompiled {b:?} {:?}",
                s1.trace, s2.trace
            ));
        }
    }
    Ok(())
}

/// L4-class keying of the compiled chains: decided by the rules, on, off.
const CLASS_KEYS: [Option<bool>; 3] = [None, Some(true), Some(false)];

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn compiled_equals_linear_on_random_programs(seed in any::<u64>()) {
        let mut r = Rng::new(seed);
        let mut id = 0;
        let prog = rand_program(&mut r, &mut id);
        // Chains with and without the L4 class in their keys (as the rules
        // decide, forced on, forced off).
        let c = Classifier::compile_keyed(&prog, CLASS_KEYS[(seed % 3) as usize]).unwrap();
        let pkts: Vec<_> = (0..150).map(|_| rand_packet(&mut r)).collect();
        if let Err(e) = check(&prog, &c, &pkts) {
            prop_assert!(false, "{}\n{:#?}", e, prog);
        }
    }

    #[test]
    fn updates_interleaved_with_lookups_equal_linear(seed in any::<u64>()) {
        let mut r = Rng::new(seed);
        let mut id = 0;
        let mut prog = rand_program(&mut r, &mut id);
        let mut c = Classifier::compile_keyed(&prog, CLASS_KEYS[(seed % 3) as usize]).unwrap();
        let snapshot = (prog.clone(), Arc::new(c.clone()));
        let n = prog.chains.len();
        for _ in 0..60 {
            let ci = r.below(n as u64) as usize;
            let rules = &mut prog.chains[ci].rules;
            if r.pct(40) && !rules.is_empty() {
                let k = r.below(rules.len() as u64) as usize;
                let gone = rules.remove(k);
                c.delete_rule(ChainId(ci as u32), gone.id).unwrap();
            } else {
                id += 1;
                let rule = rand_rule(&mut r, id, ci, n);
                let (k, at) = if rules.is_empty() || r.pct(20) {
                    if r.pct(50) { (0, Placement::Front) } else { (rules.len(), Placement::Back) }
                } else {
                    let k = r.below(rules.len() as u64) as usize;
                    if r.pct(50) {
                        (k, Placement::Before(rules[k].id))
                    } else {
                        (k + 1, Placement::After(rules[k].id))
                    }
                };
                rules.insert(k, rule.clone());
                c.insert_rule(ChainId(ci as u32), at, &rule).unwrap();
            }
            let pkts: Vec<_> = (0..30).map(|_| rand_packet(&mut r)).collect();
            if let Err(e) = check(&prog, &c, &pkts) {
                prop_assert!(false, "{}", e);
            }
        }
        // The published generation did not change under the updates.
        let pkts: Vec<_> = (0..100).map(|_| rand_packet(&mut r)).collect();
        if let Err(e) = check(&snapshot.0, &snapshot.1, &pkts) {
            prop_assert!(false, "old generation changed: {}", e);
        }
    }
}

#[test]
fn classbench_2000_rules_compiled_equals_linear() {
    for seed in [1, 2] {
        let prog = gen::classbench(2000, seed);
        let c = Classifier::compile(&prog).unwrap();
        let pkts = gen::classbench_packets(&prog, 4000, seed + 100);
        check(&prog, &c, &pkts).unwrap();
    }
}

/// A chain long enough to be compiled on two threads (`PAR_COMPILE_MIN`)
/// classifies as the linear walk does.
#[test]
fn classbench_10000_rules_compiled_in_parallel_equals_linear() {
    let mut prog = gen::classbench(10_000, 5);
    let mut c = Classifier::compile(&prog).unwrap();
    let pkts = gen::classbench_packets(&prog, 1000, 105);
    check(&prog, &c, &pkts).unwrap();
    // Deletes and inserts find the rules of both halves (the id index is
    // built on the other thread, the tables from the bulk fill).
    let extra = gen::classbench(100, 6);
    let mut r = Rng::new(11);
    for (i, mut rule) in extra.chains[0].rules.iter().cloned().enumerate() {
        rule.id = RuleId(1_000_000 + i as u64);
        let rules = &mut prog.chains[0].rules;
        let k = r.below(rules.len() as u64) as usize;
        let gone = rules.remove(k);
        c.delete_rule(ChainId(0), gone.id).unwrap();
        let k = r.below(rules.len() as u64) as usize;
        c.insert_rule(ChainId(0), Placement::Before(rules[k].id), &rule)
            .unwrap();
        rules.insert(k, rule);
    }
    check(&prog, &c, &pkts).unwrap();
}

#[test]
fn classbench_updates_at_1000_rules_equal_linear() {
    let mut prog = gen::classbench(1000, 9);
    let mut c = Classifier::compile(&prog).unwrap();
    let extra = gen::classbench(300, 10);
    let mut r = Rng::new(3);
    for (i, mut rule) in extra.chains[0].rules.iter().cloned().enumerate() {
        rule.id = RuleId(1_000_000 + i as u64);
        let rules = &mut prog.chains[0].rules;
        let k = r.below(rules.len() as u64) as usize;
        c.insert_rule(ChainId(0), Placement::Before(rules[k].id), &rule)
            .unwrap();
        rules.insert(k, rule);
        let k = r.below(rules.len() as u64) as usize;
        let gone = rules.remove(k);
        c.delete_rule(ChainId(0), gone.id).unwrap();
    }
    let pkts = gen::classbench_packets(&prog, 4000, 77);
    check(&prog, &c, &pkts).unwrap();
}

#[test]
fn seed001_shape_1000_rules_compiled_equals_linear() {
    let prog = gen::seed001_shape(1000);
    let c = Classifier::compile(&prog).unwrap();
    let mut pkts = gen::seed001_packets(500, 1);
    // Plus TCP packets that hit the port rules.
    for p in 9990..11010u16 {
        pkts.push(PacketFields {
            l4proto: 6,
            dport: p,
            ..Default::default()
        });
    }
    check(&prog, &c, &pkts).unwrap();
    assert!(c.tuple_count(ChainId(0)).is_some_and(|t| t <= 2));
}

/// A block list as rules: 256 host rules share every /24, so keys past the
/// collision limit go to /32 tuples; compiled, then appended to and thinned
/// one rule at a time (the order seed 002 and `sluice ctl` use).
#[test]
fn host_list_rules_at_32_bits_equal_linear_under_updates() {
    let mut prog = gen::host_list(2000);
    let c = Classifier::compile(&prog).unwrap();
    let pkts = gen::host_list_packets(2000, 3000, 5);
    check(&prog, &c, &pkts).unwrap();
    // Few tuples: the /24 one the first 32 hosts of a /24 fill, the /32 one.
    assert!(c.tuple_count(ChainId(0)).is_some_and(|t| t <= 2));
    // Built empty, filled by appends, some deleted.
    let mut c = Classifier::compile(&Program {
        chains: vec![Chain {
            name: "forward".into(),
            kind: ChainKind::Base(Policy::Accept),
            rules: vec![],
        }],
    })
    .unwrap();
    let all = std::mem::take(&mut prog.chains[0].rules);
    let mut r = Rng::new(11);
    for rule in all {
        c.insert_rule(ChainId(0), Placement::Back, &rule).unwrap();
        prog.chains[0].rules.push(rule);
        if r.pct(10) {
            let rules = &mut prog.chains[0].rules;
            let k = r.below(rules.len() as u64) as usize;
            let gone = rules.remove(k);
            c.delete_rule(ChainId(0), gone.id).unwrap();
        }
    }
    check(&prog, &c, &pkts).unwrap();
    assert!(c.tuple_count(ChainId(0)).is_some_and(|t| t <= 2));
}

/// The IPv6 block list: 2000 hosts in one /64, past the collision limit at
/// /128.
#[test]
fn ipv6_host_list_rules_at_128_bits_equal_linear() {
    let prog = gen::host_list6(2000);
    let c = Classifier::compile(&prog).unwrap();
    check(&prog, &c, &gen::host_list6_packets(2000, 3000, 6)).unwrap();
    assert!(c.tuple_count(ChainId(0)).is_some_and(|t| t <= 2));
}

#[test]
fn jump_depth_exceeded_is_reported_identically() {
    let n = MAX_DEPTH + 3;
    let chains = (0..n)
        .map(|i| Chain {
            name: format!("c{i}"),
            kind: if i == 0 {
                ChainKind::Base(Policy::Accept)
            } else {
                ChainKind::Regular
            },
            rules: if i + 1 < n {
                vec![Rule {
                    id: RuleId(i as u64),
                    matches: vec![],
                    stmts: vec![Stmt::Counter],
                    verdict: Some(Verdict::Jump(ChainId(i as u32 + 1))),
                }]
            } else {
                vec![]
            },
        })
        .collect();
    let prog = Program { chains };
    let c = Classifier::compile(&prog).unwrap();
    let mut s = Scratch::new();
    let o = eval_linear(&prog, ChainId(0), &PacketFields::default(), &mut s);
    assert_eq!(o.verdict, Final::Error(EvalError::DepthExceeded));
    assert_eq!(o.rule, Some(RuleId(MAX_DEPTH as u64)));
    check(&prog, &c, &[PacketFields::default()]).unwrap();
}

#[test]
fn mark_set_is_seen_by_later_rules() {
    let r = |id, matches, stmts, verdict| Rule {
        id: RuleId(id),
        matches,
        stmts,
        verdict,
    };
    let prog = Program {
        chains: vec![Chain {
            name: "in".into(),
            kind: ChainKind::Base(Policy::Drop),
            rules: vec![
                r(
                    1,
                    vec![Match::eq(Field::Mark, 7)],
                    vec![],
                    Some(Verdict::Accept),
                ),
                r(2, vec![], vec![Stmt::MarkSet(MarkOp::set(7))], None),
                r(
                    3,
                    vec![Match::eq(Field::Mark, 0)],
                    vec![],
                    Some(Verdict::Drop),
                ),
                r(
                    4,
                    vec![Match::eq(Field::Mark, 7)],
                    vec![Stmt::Counter],
                    Some(Verdict::Accept),
                ),
            ],
        }],
    };
    let c = Classifier::compile(&prog).unwrap();
    let mut s = Scratch::new();
    let o = c.eval(ChainId(0), &PacketFields::default(), &mut s);
    assert_eq!(
        (o.verdict, o.rule, o.mark),
        (Final::Accept, Some(RuleId(4)), 7)
    );
    assert_eq!(s.trace, vec![RuleId(2), RuleId(4)]);
    check(&prog, &c, &[PacketFields::default()]).unwrap();
}

/// Summary slots must stay lower bounds (and their cached lowest entries
/// exact) through relabels, deletions of slot minima and summary rebuilds.
#[test]
fn summaries_survive_relabels_and_deletes_of_slot_minima() {
    let mut prog = gen::classbench(3000, 21);
    let mut c = Classifier::compile(&prog).unwrap();
    let extra = gen::classbench(1500, 22);
    let mut r = Rng::new(5);
    let anchor = prog.chains[0].rules[10].id;
    for (i, mut rule) in extra.chains[0].rules.iter().cloned().enumerate() {
        rule.id = RuleId(2_000_000 + i as u64);
        let rules = &mut prog.chains[0].rules;
        // Always right after the same rule: exhausts the gap, forces relabels.
        let k = rules.iter().position(|x| x.id == anchor).unwrap() + 1;
        c.insert_rule(ChainId(0), Placement::After(anchor), &rule)
            .unwrap();
        rules.insert(k, rule);
        // Delete early rules: they are the lowest entries of their slots.
        if i % 2 == 0 {
            let k = r.below(40.min(rules.len() as u64)) as usize;
            if rules[k].id != anchor {
                let gone = rules.remove(k);
                c.delete_rule(ChainId(0), gone.id).unwrap();
            }
        }
    }
    let pkts = gen::classbench_packets(&prog, 6000, 23);
    check(&prog, &c, &pkts).unwrap();
}

/// Many rules share a natural key: past the collision limit, keys are filed
/// in coarser tuples (or overflow their own); inserts and deletes at random
/// positions file against the live tables. Results must not change.
#[test]
fn collision_limit_placement_with_updates_equals_linear() {
    let mut r = Rng::new(41);
    let rule = |r: &mut Rng, id: u64| {
        let mut m = Vec::new();
        if r.pct(80) {
            let host = 0x0a01_0200 | r.below(8) as u32;
            let len = [32, 32, 28, 24, 20, 16, 8][r.below(7) as usize];
            m.push(Match::in_ranges(
                Field::Daddr,
                [Range::v4_cidr(host, len)],
                false,
            ));
        }
        if r.pct(60) {
            let src = 0xc0a8_0000 | r.below(4) as u32;
            let len = [32, 24, 16, 8][r.below(4) as usize];
            m.push(Match::in_ranges(
                Field::Saddr,
                [Range::v4_cidr(src, len)],
                false,
            ));
        }
        if r.pct(50) {
            m.push(Match::eq(Field::L4Proto, 6));
            m.push(Match::eq(
                Field::Dport,
                [80u128, 443, 22][r.below(3) as usize],
            ));
        }
        Rule {
            id: RuleId(id),
            matches: m,
            stmts: vec![],
            verdict: Some(if r.pct(50) {
                Verdict::Accept
            } else {
                Verdict::Drop
            }),
        }
    };
    let rules: Vec<Rule> = (0..400).map(|i| rule(&mut r, i)).collect();
    let mut prog = Program {
        chains: vec![Chain {
            name: "in".into(),
            kind: ChainKind::Base(Policy::Drop),
            rules,
        }],
    };
    let mut c = Classifier::compile(&prog).unwrap();
    let pkt = |r: &mut Rng| PacketFields {
        saddr: map_v4(0xc0a8_0000 | r.below(6) as u32),
        daddr: map_v4(0x0a01_0200 | r.below(12) as u32),
        l4proto: [6u8, 17][r.below(2) as usize],
        sport: 40000,
        dport: [80u16, 443, 22, 25][r.below(4) as usize],
        ..Default::default()
    };
    let pkts: Vec<_> = (0..500).map(|_| pkt(&mut r)).collect();
    check(&prog, &c, &pkts).unwrap();
    for i in 0..400u64 {
        let rules = &mut prog.chains[0].rules;
        let new = rule(&mut r, 10_000 + i);
        let k = r.below(rules.len() as u64) as usize;
        c.insert_rule(ChainId(0), Placement::Before(rules[k].id), &new)
            .unwrap();
        rules.insert(k, new);
        if i % 3 == 0 {
            let k = r.below(rules.len() as u64) as usize;
            let gone = rules.remove(k);
            c.delete_rule(ChainId(0), gone.id).unwrap();
        }
        if i % 50 == 0 {
            check(&prog, &c, &pkts).unwrap();
        }
    }
    check(&prog, &c, &pkts).unwrap();
}
