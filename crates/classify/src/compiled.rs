//! The compiled classifier: per-chain tuple space search with rule-position
//! priorities, a per-slot priority summary, and copy-on-write tables.
//!
//! # Algorithm
//!
//! Tuple space search (Srinivasan, Suri, Varghese, SIGCOMM 1999) with the
//! coarse tuples, collision-limited key placement and priority pruning of
//! TupleMerge (Daly, Liu, Torng, "TupleMerge: Fast Software Packet Processing
//! for Online Packet Classification", ToN 2019), the family of schemes VPP's
//! ACL plugin uses in its hash-match mode, plus a priority summary in front of
//! every table (the per-table max-priority pruning of PartitionSort/TupleMerge,
//! applied per hash slot instead of per table):
//!
//! * Indexed fields: saddr, daddr, dport, iifname, oifname, mark, ct state,
//!   and sport only when the rule indexes nothing else. In a chain where at
//!   least three in four rules have a protocol or destination-port
//!   condition ([`keys_class`], decided when the chain is built), every key
//!   also holds an *L4 class* ([`L4_CLASSES`]: TCP below and from port
//!   1024, the same for UDP, ICMP/ICMPv6, anything else): a rule is filed
//!   once per class a packet it matches can be in (a rule without protocol
//!   or port condition six times), so the class splits every bucket without
//!   adding a tuple (a protocol level would have doubled them). It is the
//!   key hash's seed, computed once per packet. At 100 000 ClassBench-style
//!   rules it cut the entries scanned per lookup from 9.8 to 4.1 (most
//!   candidates of a shared key failed on the protocol or the destination
//!   port) for 62 % more entries (101 047 to 163 500); 4 classes (no port
//!   split) were 7 % slower at 10 000 and 100 000 rules. Keying it in every
//!   chain made a host list (150 000 `ip saddr A drop`, `sluice-policy`'s
//!   `load` example) compile in 0.191 s instead of 0.089 and peak at
//!   331 MB instead of 160, for nothing; with the per-chain rule 0.087 s
//!   and 152 MB. A chain built empty, and then filled by updates, does not
//!   key the class until it is compiled again (a reload).
//!   Each condition on an indexed field is prefix-expanded (small ranges, ≤ 16
//!   values, are enumerated exactly; negations are complemented first) and
//!   every prefix length is rounded *down* to a level of a coarse ladder.
//!   Addresses have a family-aware ladder: an IPv4 (mapped) prefix is keyed at
//!   /32, /24, /16, /8 or not at all, an IPv6 prefix at /128, /64, /32 or
//!   not at all; a host address (/32, /128) goes to a tuple that keys it at
//!   /24 (/64) only while that bucket holds fewer than `HOST_COLLIDE` (4)
//!   hosts, then to a host tuple (a block list written as host rules, 256
//!   to a /24, scanned up to 256 entries per lookup when /24 was the finest
//!   level: 215-263 ns per lookup at 1 000-100 000 rules against 44 at 20;
//!   now 37-50, `probe hosts N 20 single 5`, 2026-11-24; the ClassBench-style
//!   sets make no host tuple and are unchanged). Ports, names,
//!   marks: wildcard or exact. The levels of a key are its *natural
//!   signature*.
//! * A *tuple* is a vector of levels with one hash table. A rule gets one key
//!   per element of the cross product of its expansions (capped at 256;
//!   dimensions that would exceed the cap stay wildcard). TupleMerge's
//!   placement: a key is filed in the most specific existing tuple whose
//!   levels are all at most its own and whose bucket for it holds fewer than
//!   `COLLIDE` (32) entries; only when there is none does it get (or create)
//!   the tuple of its natural signature. So rules share few tuples
//!   (ClassBench-style sets: 6 at 20 rules, 11 at 10 000, 16 at 100 000),
//!   and a bucket holds at most `COLLIDE` entries unless that many rules
//!   share a natural key. The limit is high because a crowded bucket costs
//!   little: it is sorted by position and cut short at the best match so
//!   far, while every extra tuple costs every lookup a probe (8 gave 13 and
//!   18 tuples and 6–9 % more instructions per lookup at 10 000 and
//!   100 000 rules; 4 was worse still, 64 no better than 32). Where each key
//!   went is kept with the rule, so delete and relabel find it. Everything
//!   not indexed (the exact protocol, ranges that round to 0, masks, flags, ct
//!   mark, concat sets, the part of a prefix below its level) is checked by
//!   verifying each candidate against the whole rule, so fingerprint
//!   collisions and coarse keys are harmless.
//! * A table is open hashing by *slot* (the low bits of the fingerprint's high
//!   half; two slots per entry, rounded up to a power of two, load 1/4 to
//!   1/2, so that few keys share a slot):
//!   slot `s` holds, sorted by position, every entry whose key lands there.
//!   An entry (56 bytes) carries its position, the key's 32-bit tag, the
//!   rule's 5-tuple box in IPv4 form, the rule's handle, and the rule: most
//!   verifications are a few compares on the entry's own cache line
//!   (protocol and destination port first: they reject most candidates),
//!   and the rule is read only when it has IPv6 bounds or conditions
//!   outside the 5-tuple, or when the lookup ends on it and it has
//!   statements or a verdict other than accept and drop (a flag in the box
//!   says "no statements, accept" or "no statements, drop", so the common
//!   ACL rule is decided from the entry: one dependent miss fewer). The
//!   *summary* is `sums[s]`, 4 bytes per slot (so the summaries of all
//!   tuples stay cache resident: 117 KB at 10 000 ClassBench rules, 1.2 MB
//!   at 100 000; the list references take 16 bytes per slot): the
//!   high 32 bits of the first position of slot `s` (saturated to 24 bits),
//!   and a check byte, the top byte of the tag when every entry of the slot
//!   has one tag (a *pure* slot), else 0. A key whose check byte differs from
//!   a pure slot's is certainly absent, so a slot shared with another key is
//!   skipped without reading its list. Both are exact after every update.
//! * A lookup hashes the packet once per (field, level) lane and takes the
//!   tuples in increasing `min_pos` (their first position): before probing a
//!   tuple (combine its lanes, read its summary word), it visits every
//!   pending candidate slot whose bound is below that tuple's `min_pos`, in
//!   increasing bound, scanning each up to the best match found so far; once
//!   the best match is at or before the next tuple's `min_pos`, no later
//!   tuple can hold a better one and the lookup ends without probing them
//!   (the priority-sorted subtables of Open vSwitch's classifier, Pfaff et
//!   al., NSDI 2015, with TupleMerge's pruning, here on first positions).
//!   The remaining candidates are visited in increasing bound until the next
//!   bound is not below the best match. ClassBench-style sets put
//!   address-wildcard rules last, so their tuples start late and a packet
//!   decided by an address-specific rule never probes them (8.2 of 11
//!   tuples probed on average at 10 000 rules, 8.8 of 16 at 100 000).
//! * Rule order is kept as sparse `u64` positions (initially 2^32 apart;
//!   an insertion takes the midpoint). When no gap is left, a window of
//!   neighbours is widened by doubling until it is sparse enough and relabelled
//!   evenly (the order-maintenance scheme of Dietz & Sleator, STOC 1987, in its
//!   simple amortized form). Relabelling preserves the relative order of all
//!   rules. Insert and delete touch only the rule's own slots (and, rarely, a
//!   relabelled window or a rehash when a tuple doubles).
//! * A [`Classifier`] is an immutable generation once published. `clone()` is
//!   shallow (chunks and slot lists are `Arc`s) and an update copies only the
//!   chunks and lists it writes. [`Classifier::compile`] files the keys in
//!   rule order exactly as inserts would, then bulk-builds every table at
//!   its final size (a stable counting sort of the entries by slot, each
//!   list and summary chunk allocated once, entries moved). A chain of at
//!   least `PAR_COMPILE_MIN` (8192) rules has its second half compiled,
//!   and its rule-id index built, on a second thread while this one
//!   compiles and files the first half. At 150 000 ClassBench-style rules
//!   (callgrind, 2026-11-23, 2-vCPU AMD EPYC KVM guest, 24 GiB, Linux
//!   6.18; `sluice-policy`'s `load` example) the main thread's share fell
//!   from 599 M to 443 M instructions (table fill 140 M → 76 M, rule
//!   compilation 452 M → 403 M over both threads).
//!
//! # Cost model
//!
//! A lookup costs (lanes hashed) + (tuples probed × one summary load) +
//! (slots visited × (one list load + entries scanned × one inline
//! verification)). The tuple count grows with the rule count as more level
//! combinations are needed (ClassBench-style: 6 → 8 → 10 → 11 → 16 at
//! 20 → 100 → 1 000 → 10 000 → 100 000 rules), but priority-sorted probing
//! stops early: 3.6 → 6.4 → 8.0 → 8.2 → 8.6 tuples probed per lookup.
//! Candidate slots visited stay about 1–2 (0.95 → 1.0 → 1.3 → 1.6 → 1.5),
//! entries scanned grow with the crowding of the shared keys (1.05 → 1.2 →
//! 1.8 → 2.8 → 4.2; before the L4 class was keyed 1.0 → 1.3 → 2.4 → 6.0 →
//! 9.8, most rejected by the protocol or destination-port compare).
//! Averages from the
//! ignored test `lookup_stats` (`cargo test --release -p sluice-classify
//! --lib lookup_stats -- --ignored --nocapture`).
//!
//! **2026-11-24** (same machine, load average 0.2-0.5, nothing else
//! running): the L4 class in every key, the packet no longer copied per
//! lookup (only when a rule's statements change it), chunk arrays behind
//! thin pointers (no bounds check inside a chunk) and a tuple's lanes
//! inline. Instructions per lookup inside `Classifier::eval` (callgrind
//! `--toggle-collect`, `probe classbench N 4 single`, 5 × 4096 lookups):
//! 934 / 1547 at 20 / 10 000 rules before, 878 / 1449 / 1612 at 20 /
//! 10 000 / 100 000 after. Wall clock, `probe classbench N 20 single 5`,
//! three interleaved runs each: 49.9-50.2 / 114.0-116.0 / 171.3-175.2 ns
//! at 20 / 10 000 / 100 000 rules before, 41.6-42.1 / 95.8-97.0 /
//! 128.0-130.4 after (seed 001: 27.6-28.6 before, 23.9-24.5 after). The
//! ratios to 20 rules are 2.3x and 3.1x: every size got faster, the
//! 20-rule case most in relative terms (the packet copy was a fixed cost).
//! With 32 distinct headers (`HDRS=32`, cache resident) 33.8 / 58.0 /
//! 71.4 ns at 20 / 10 000 / 100 000 rules: the misses of 4096 headers add
//! 40-65 ns at 10 000 and 100 000 rules, and the instruction path alone is
//! 1.7x / 2.1x the 20-rule one. Tried the same day and not kept: 2-byte
//! summary words (a one-byte bound, exact below rule 64, then 16 steps per
//! power of two) to halve their footprint: 128-129 / 162-166 ns at
//! 10 000 / 100 000 rules against 95-97 / 134-138 with 4-byte words (three
//! interleaved runs); the coarser bounds visit more slots than the smaller
//! arrays save.
//!
//! Measured with cachegrind (2026-11-23, 2-vCPU AMD EPYC KVM guest, 24 GiB,
//! Linux 6.18; `valgrind --tool=cachegrind --cache-sim=yes --D1=32768,8,64
//! --LL=524288,8,64` on `examples/probe.rs`, rounds 6 − 2, divided by
//! 4 × 4096; ClassBench shape, 4096 trace-style headers), instructions per
//! packet at 20 / 100 / 1 000 / 10 000 / 100 000 rules: 894 / 1153 / 1391 /
//! 1599 / 1801 (before entries carried the handle and the accept/drop
//! flag and before load 1/4 to 1/2: 927 / 1215 / 1540 / 1727 / 1920), so
//! 1.8x the 20-rule count at 10 000 rules and 2.0x at 100 000. The seed-001
//! shape (one tuple) stays flat at 528 / 536 / 528 (20 / 10 000 /
//! 100 000). The instruction ratio
//! is not the time ratio: with 4096 headers the lines a lookup touches (the
//! header itself, about 1.5 misses per packet in the model, which has no
//! hardware prefetcher; the summary words of the probed tuples, the visited
//! lists and entries, the matched rule when it has statements) no longer
//! fit in a 512 KB L2 from about 10 000 rules (LL read misses per packet:
//! 3.0 at 10 000 rules and 6.8 at 100 000, none at 20; before: 4.1 and 6.6;
//! L1 read misses 15.0 and 36.7, 1.5 at 20). Wall clock on that machine
//! (interleaved `probe … single 10` runs, minima; shared, load average
//! 2.8–3.0, 02:35 UTC): 83 / 219 / 332 ns at 20 / 10 000 / 100 000 rules,
//! 2.6x and 4.0x (before: 86 / 275 / 361 ns, 3.2x and 4.2x). Measure the
//! time with
//! `cargo run --release -p sluice-classify --example measure` or
//! `sluice bench rules` (docs/benchmarks.md has the wall-clock figures).
//!
//! Tried on 2026-11-23 (at load 1/2 to 1) and not kept
//! (docs/benchmarks.md): TupleMerge's
//! relaxation of new tuples to /8 (or /16) address levels halves the
//! tuples probed at 10 000 rules (8.2 → 4.7) but triples the entries
//! scanned (7.2 → 20) and was slower at 10 000 and 100 000 rules; a
//! branch-free probe loop (unsorted pending slots, selected by minimum)
//! cut simulated mispredictions by a quarter but added 150–280
//! instructions per packet and was slower; prefetching the first entry of
//! every candidate slot (at probe time, or before the first visit) did not
//! measurably help.
//!
//! Also tried on 2026-11-23 (03:59–04:45 UTC) and not kept
//! (docs/benchmarks.md has the tables). Cachegrind as above, per packet at
//! 20 / 10 000 / 100 000 ClassBench rules; the single lookup as kept:
//! 894 / 1599 / 1801 instructions, D1 data read misses 1.5 / 15.2 / 26.6,
//! LL data read misses 0 / 3.07 / 7.53 (the `rd` parts of cachegrind's
//! D1 and LLd totals; at 100 000 rules they differ from the 36.7 and 6.8
//! above, taken from another pair of runs), and (`--branch-sim=yes`) 7.9 / 23.1 / 27.3 mispredicted
//! branches. The growth is likely as much branches as misses (no
//! performance counters in this guest to tell them apart):
//! 8 of the 11 tuples at 10 000 rules hold a rule among the first 84, so
//! first-position pruning cannot skip them for a packet decided later, and
//! every probe, pending-slot check and candidate verification is a
//! data-dependent branch.
//!
//! * An interleaved batch lookup (asynchronous memory access chaining,
//!   Kocberber et al., VLDB 2015): 4, 8 or 16 lookups in flight, each the
//!   single lookup's probe and visit sequence with its early stop, cut
//!   into steps that prefetch the next line (summary word, list
//!   reference, first entry) and yield. 1274 / 2264 / 2482 instructions
//!   and 13.6 / 32.2 / 38.7 mispredictions (the state dispatch of every
//!   step is one more unpredictable branch); wall clock (interleaved
//!   `probe … batch 10` runs, minima, load average 2.2) 149–153 /
//!   319–340 / 411–454 ns against 81 / 210 / 331 ns single and 91 / 234 /
//!   460 ns for the three-pass batch.
//! * A software-pipelined batch (hash the packet 4 or 8 ahead and prefetch
//!   its summary words, then run the single lookup on the stored tags):
//!   1140 / 1930 / 2372 instructions (on top of the slot records below);
//!   slower at 20 rules (138–147 against 93–104 ns), not measurably faster
//!   at 10 000 and 100 000 under load average 4–4.5.
//! * The same prefetch of all the tuples' summary words inside the single
//!   lookup: 1124 / 1898 / 2326 instructions, 115 against 85 ns at 20
//!   rules.
//! * Slot records (64 bytes: a copy of the slot's first entry beside the
//!   list reference, so visiting a one-entry slot reads one line instead
//!   of a list reference and then an entry that may straddle two):
//!   904 / 1631 / 1852 instructions, D1 read misses 1.5 / 12.6 / 24.1, LL
//!   0 / 2.06 / 6.12, but wall clock (8 interleaved runs, load average
//!   3.9–4.7, minima) 84.4 / 198.3 / 348.8 against 81.3 / 206.6 / 354.3 ns,
//!   medians no better, for 48 more bytes per slot (about 14 MB more at
//!   100 000 ClassBench rules) and about 0.1 s more to compile 150 000
//!   seed-001 rules.
//! * A box check without its early return (one branch per candidate
//!   instead of three): 1793 instead of 1637 instructions at 10 000 rules
//!   and no fewer mispredictions (23.2 against 23.7).
//! * (2026-11-23 17:44 UTC, same machine.) A one-byte check per slot in
//!   front of the summary words (0 empty, the pure slot's check byte, or
//!   "mixed"; a quarter of their size, so that the probes of tuples that
//!   do not hold the packet stay in L2): `measure`, two alternating runs,
//!   97-104 / 256-259 / 367-395 ns at 20 / 10 000 / 100 000 ClassBench
//!   rules against 85-90 / 209-219 / 334-357 without. The extra load and
//!   branch per probe cost more than the summary reads they replace.
//! * (2026-11-23 18:49 UTC, same machine.) The prefetch of every tuple's
//!   summary word before the probe loop, only in chains of more than 10
//!   tuples (so the 20-rule case is untouched): `probe classbench N 20
//!   single 5`, three alternating runs, 252-403 / 384-688 ns at 10 000 /
//!   100 000 rules against 217-359 / 339-406 without. Not faster.
//!
//! * (2026-11-24 19:05 UTC.) New tuples relaxed to one address lane at /24
//!   (the destination when both have one) without ports, when that bucket
//!   has room: at 10 000 / 100 000 ClassBench rules only the (/8, /24)
//!   tuple folds into the (*, /24) one, 11 → 10 and 16 → 15 tuples, 8.17 →
//!   7.17 and 8.58 → 7.58 probed, entries scanned unchanged
//!   (`lookup_stats`); the tuples of rules with both addresses shorter than
//!   /24 (/16 with /8, /16 with a port, ...) still hold rules among the
//!   first hundred, so they are still probed. Not timed, not kept.
//!
//! * (2026-11-24 20:58-21:06 UTC.) A per-packet first-position filter: for
//!   the packet's source /16 and destination /16 (hashed to 64-4096
//!   buckets, one 64-byte row of 16 per-tuple bounds each, rules wider
//!   than 256 /16s in a wide row), a lower bound of the first position each
//!   tuple can match the packet at, `max(min(source row, source wide),
//!   min(destination row, destination wide))` from the rules' boxes; a
//!   tuple is not probed when the best match so far is at or before that
//!   bound, or when no rule of it allows the packet's addresses. With
//!   perfect knowledge of the best match it would leave 4.4 of 11 tuples
//!   to probe at 10 000 rules (8.2 now) and 4.9 of 16 at 100 000; in the
//!   lookup as written 6.1 and 6.8 were probed (1.25 at 20 rules). Slower
//!   all the same: `probe classbench N 200 single 5`, 42-45 / 103-114 /
//!   135-148 ns at 20 / 10 000 / 100 000 rules against 42 / 95 / 128
//!   without; with 32 headers (`HDRS=32`) 33-34 / 65-67 / 76-80 against
//!   35 / 60 / 73. The per-tuple skip is one more data-dependent branch
//!   and the rows (4096 buckets: 512 KB) a miss per lookup; with 256
//!   buckets, and with only the "no rule here" skip, no better. Not kept.
//!
//! * (2026-11-25 13:55 UTC.) Per-L4-class first positions (each tuple's
//!   first rule among the rules of the packet's class, the class already
//!   computed for the key seed, so that a tuple whose early rules are of
//!   other classes is probed later or not at all): estimated with
//!   `lookup_stats` (tuples whose per-class first position is below the
//!   packet's best match), 3.61 / 8.17 / 8.58 tuples probed at 20 /
//!   10 000 / 100 000 ClassBench rules would become 1.90 / 7.62 / 8.03. It
//!   helps the 20-rule case most, so the ratios the targets measure would
//!   grow; not built.
//!
//! A lookup prefetches the list reference of every candidate slot when it
//! finds it, so the list miss overlaps the probes of the remaining tuples.
//! [`Classifier::eval_batch`] runs the same lookup over groups of [`BATCH`]
//! packets in three passes (hash all and prefetch every tuple's summary
//! slot; read the summaries and prefetch each candidate slot's first
//! entry; resolve), so the misses of a group overlap; it probes every
//! tuple (no early stop), so it costs more instructions (cachegrind as
//! above: 1180 / 1937 / 2674 per packet at 20 / 10 000 / 100 000 ClassBench
//! rules) and is reported as a separate figure.
//!
//! The evaluation loop is the same as the reference evaluator's: a
//! non-terminal rule runs its statements (a mark change is visible to the
//! next lookup) and the search resumes at `position + 1`.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::ir::{
    ChainId, ChainKind, ConcatSet, Field, Match, PacketFields, Program, Range, Rule, RuleId, Stmt,
    ValueSet, Verdict,
};
use crate::linear::{run_stmts, EvalError, Final, Outcome, Scratch, MAX_CHAIN_ENTRIES, MAX_DEPTH};
use crate::persist::{fmix, ChunkVec, Chunks, IdBuild, Sharded};

const NDIM: usize = 9;
const DIM_FIELDS: [Field; NDIM] = [
    Field::Saddr,
    Field::Daddr,
    Field::L4Proto,
    Field::Sport,
    Field::Dport,
    Field::IifName,
    Field::OifName,
    Field::Mark,
    Field::CtState,
];
/// The index of `f` in [`DIM_FIELDS`].
fn dim_of(f: Field) -> Option<usize> {
    let d = match f {
        Field::Saddr => 0,
        Field::Daddr => 1,
        Field::L4Proto => 2,
        Field::Sport => 3,
        Field::Dport => 4,
        Field::IifName => 5,
        Field::OifName => 6,
        Field::Mark => 7,
        Field::CtState => 8,
        _ => return None,
    };
    debug_assert_eq!(DIM_FIELDS.get(d), Some(&f));
    Some(d)
}
/// Address levels (bits of the mapped address): IPv6 /32, /64 and /128;
/// IPv4 /8, /16, /24 and /32. Host levels (/32, /128) are a new tuple's only
/// for keys whose /24 or /64 bucket is crowded ([`place`]).
const ADDR_LEVELS: &[u32] = &[0, 32, 64, 104, 112, 120, 128];
/// The level of a host address (IPv4 /32, IPv6 /128): the whole mapped
/// address.
const HOST_LEVEL: usize = 6;
/// The IPv4-mapped prefix `::ffff:0:0/96`.
const V4_MAPPED: u128 = 0xffff_u128 << 32;

fn levels(dim: usize) -> &'static [u32] {
    match dim {
        0 | 1 => ADDR_LEVELS,
        2 | 8 => &[0, 8],
        3 | 4 => &[0, 16],
        5 | 6 => &[0, 128],
        _ => &[0, 32],
    }
}

/// Level index for the prefix `v/plen` of dimension `dim`: the highest level
/// not longer than the prefix; addresses use the ladder of their family.
fn level_of(dim: usize, v: u128, plen: u32) -> usize {
    let lv = levels(dim);
    if dim <= 1 && plen >= 96 && v >> 32 == V4_MAPPED >> 32 {
        // IPv4: /32, /24, /16, /8 or nothing (shorter prefixes are
        // verified only).
        return match plen {
            128.. => HOST_LEVEL,
            120.. => 5,
            112.. => 4,
            104.. => 3,
            _ => 0,
        };
    }
    let li = lv.iter().rposition(|l| *l <= plen).unwrap_or(0);
    if dim <= 1 {
        // IPv6: /128 (a host), /64, /32 or nothing.
        if plen >= 128 {
            HOST_LEVEL
        } else {
            li.min(2)
        }
    } else {
        li
    }
}

/// Ranges narrower than this are enumerated value by value.
const ENUM_SMALL: u128 = 16;
/// Per-dimension expansion cap.
const DIM_CAP: usize = 256;
/// Cross-product cap per rule.
const CROSS_CAP: usize = 256;
/// Initial distance between positions.
const GAP: u64 = 1 << 32;
const NIL: u32 = u32::MAX;
const SEED: u64 = 0x243f_6a88_85a3_08d3;
/// Hash lanes per packet: (field, level) pairs in use, at most one per
/// non-zero level of every dimension.
const MAX_LANES: usize = 16;
/// Packets per group of [`Classifier::eval_batch`].
pub const BATCH: usize = 32;
/// Summary bound of an empty slot (bounds are 24 bits).
const EMPTY: u32 = 0xff_ffff;

type Sig = [u8; NDIM];

fn lvl_mask(level: u32, width: u32) -> u128 {
    let fm = u128::MAX >> (128 - width);
    fm & !fm.checked_shr(level).unwrap_or(0)
}

/// Hash of one (field, masked value) lane.
#[inline]
fn lane_hash(dim: usize, v: u128) -> u64 {
    let h = (SEED ^ dim as u64 ^ v as u64)
        .wrapping_mul(0x9e37_79b9_7f4a_7c15)
        .rotate_left(29);
    (h ^ (v >> 64) as u64)
        .wrapping_mul(0xd6e8_feb8_6659_fd93)
        .rotate_left(29)
}

/// Folds a lane hash into a tuple key hash (lanes in dimension order).
#[inline]
fn combine(h: u64, lane: u64) -> u64 {
    (h.rotate_left(23) ^ lane).wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

/// Final step of a key hash: folds the well-mixed high bits of the last
/// multiply into the low bits.
#[inline]
fn finish(h: u64) -> u64 {
    h ^ (h >> 29)
}

/// Summary bound of a position: a lower bound, coarse (the high 32 bits,
/// saturated to 24 bits: rule positions stay below `2^24 · GAP` unless a
/// chain holds millions of rules, and a saturated bound is still a lower
/// bound).
#[inline]
fn bound_of(pos: u64) -> u32 {
    (pos >> 32).min(u64::from(EMPTY - 1)) as u32
}

/// Errors of compile and update operations.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum UpdateError {
    /// The chain does not exist.
    #[error("unknown chain {0:?}")]
    UnknownChain(ChainId),
    /// A jump/goto targets a missing or base chain.
    #[error("rule {0:?}: jump/goto target is not a regular chain")]
    BadTarget(RuleId),
    /// The jump/goto would close a loop.
    #[error("rule {0:?}: jump/goto creates a loop")]
    Loop(RuleId),
    /// A rule with this id is already in the chain.
    #[error("duplicate rule {0:?}")]
    DuplicateRule(RuleId),
    /// No rule with this id in the chain.
    #[error("unknown rule {0:?}")]
    UnknownRule(RuleId),
}

/// Where to insert a rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    /// First in the chain (`insert rule`).
    Front,
    /// Last in the chain (`add rule`).
    Back,
    /// Right before the rule with this handle.
    Before(RuleId),
    /// Right after the rule with this handle (`add rule … position H`).
    After(RuleId),
}

#[derive(Clone, Debug)]
enum Check {
    Range {
        field: Field,
        lo: u128,
        hi: u128,
    },
    Set {
        field: Field,
        set: ValueSet,
    },
    Masked {
        field: Field,
        mask: u128,
        value: u128,
        negate: bool,
    },
    Concat {
        fields: Arc<[Field]>,
        set: Arc<ConcatSet>,
        negate: bool,
    },
}

impl Check {
    fn cost(&self) -> u8 {
        match self {
            Check::Range { .. } | Check::Masked { .. } => 0,
            Check::Set { .. } => 1,
            Check::Concat { .. } => 2,
        }
    }
    #[inline]
    fn holds(&self, p: &PacketFields) -> bool {
        match self {
            Check::Range { field, lo, hi } => {
                let v = p.get(*field);
                *lo <= v && v <= *hi
            }
            Check::Set { field, set } => set.contains(p.get(*field)),
            Check::Masked {
                field,
                mask,
                value,
                negate,
            } => (p.get(*field) & mask == *value) != *negate,
            Check::Concat {
                fields,
                set,
                negate,
            } => {
                let mut buf = [0u128; 8];
                let hit = if fields.len() <= buf.len() {
                    for (d, f) in buf.iter_mut().zip(fields.iter()) {
                        *d = p.get(*f);
                    }
                    set.contains(buf.get(..fields.len()).unwrap_or(&[]))
                } else {
                    let v: Vec<u128> = fields.iter().map(|f| p.get(*f)).collect();
                    set.contains(&v)
                };
                hit != *negate
            }
        }
    }
}

/// The 5-tuple part of a rule as inclusive bounds, checked inline.
#[derive(Clone, Copy, Debug)]
struct Quick {
    saddr: [u128; 2],
    daddr: [u128; 2],
    sport: [u16; 2],
    dport: [u16; 2],
    proto: [u8; 2],
}

impl Quick {
    const ALL: Quick = Quick {
        saddr: [0, u128::MAX],
        daddr: [0, u128::MAX],
        sport: [0, u16::MAX],
        dport: [0, u16::MAX],
        proto: [0, u8::MAX],
    };

    #[inline]
    fn holds(&self, p: &PacketFields) -> bool {
        (self.proto[0] <= p.l4proto)
            & (p.l4proto <= self.proto[1])
            & (self.dport[0] <= p.dport)
            & (p.dport <= self.dport[1])
            & (self.sport[0] <= p.sport)
            & (p.sport <= self.sport[1])
            && self.saddr[0] <= p.saddr
            && p.saddr <= self.saddr[1]
            && self.daddr[0] <= p.daddr
            && p.daddr <= self.daddr[1]
    }

    /// Narrows the box by `lo..=hi` on `field`; false when the field is not
    /// part of the box.
    fn narrow(&mut self, field: Field, lo: u128, hi: u128) -> bool {
        fn cut<T: Copy + Ord + TryFrom<u128>>(b: &mut [T; 2], lo: u128, hi: u128) -> bool {
            // Bounds come from checks already clipped to the field width.
            match (T::try_from(lo), T::try_from(hi)) {
                (Ok(l), Ok(h)) => {
                    b[0] = b[0].max(l);
                    b[1] = b[1].min(h);
                    true
                }
                _ => false,
            }
        }
        match field {
            Field::Saddr => cut(&mut self.saddr, lo, hi),
            Field::Daddr => cut(&mut self.daddr, lo, hi),
            Field::Sport => cut(&mut self.sport, lo, hi),
            Field::Dport => cut(&mut self.dport, lo, hi),
            Field::L4Proto => cut(&mut self.proto, lo, hi),
            _ => false,
        }
    }
}

/// A rule in compiled form.
#[derive(Debug)]
struct CRule {
    quick: Quick,
    /// `quick` in inline form, copied into every table entry of the rule.
    lean: Lean,
    /// Conditions the box does not cover.
    extra: Box<[Check]>,
    id: RuleId,
    stmts: Box<[Stmt]>,
    verdict: Option<Verdict>,
}

/// Reusable buffers of [`CRule::compile`] and [`index_keys`]:
/// building a chain allocates nothing per rule for its temporaries.
#[derive(Default)]
struct BuildScratch {
    checks: Vec<Check>,
    /// Expansions of all dimensions, back to back ([`expand_dim_into`]).
    vals: Vec<(u128, u8)>,
    /// (dimension, start, end) of each expansion in `vals`.
    dims: Vec<(usize, usize, usize)>,
    /// The natural keys of the last compiled rule.
    keys: Vec<NatKey>,
    /// Whether keys hold the L4 class (the chain's [`CChain::classed`]).
    classed: bool,
}

impl CRule {
    #[inline]
    fn matches(&self, p: &PacketFields) -> bool {
        self.quick.holds(p) && self.extra.iter().all(|c| c.holds(p))
    }

    /// The compiled rule; its natural index keys ([`index_keys`]) are left
    /// in `sc.keys`.
    fn compile(r: &Rule, sc: &mut BuildScratch) -> CRule {
        let checks = &mut sc.checks;
        checks.clear();
        for m in &r.matches {
            match m {
                Match::In { field, set, negate } => {
                    let max = field.max();
                    let owned;
                    let s = if *negate {
                        owned = set.complement(max);
                        &owned
                    } else if set.ranges().last().is_none_or(|x| x.hi <= max) {
                        set
                    } else {
                        // Values above the field's width can never occur.
                        owned =
                            ValueSet::new(set.ranges().iter().filter(|x| x.lo <= max).map(|x| {
                                Range {
                                    lo: x.lo,
                                    hi: x.hi.min(max),
                                }
                            }));
                        &owned
                    };
                    match s.ranges() {
                        [one] if one.lo == 0 && one.hi == max => {}
                        [one] => checks.push(Check::Range {
                            field: *field,
                            lo: one.lo,
                            hi: one.hi,
                        }),
                        _ => checks.push(Check::Set {
                            field: *field,
                            set: s.clone(),
                        }),
                    }
                }
                Match::Masked {
                    field,
                    mask,
                    value,
                    negate,
                } => checks.push(Check::Masked {
                    field: *field,
                    mask: *mask,
                    value: *value,
                    negate: *negate,
                }),
                Match::Concat {
                    fields,
                    set,
                    negate,
                } => checks.push(Check::Concat {
                    fields: fields.clone(),
                    set: set.clone(),
                    negate: *negate,
                }),
            }
        }
        checks.sort_by_key(Check::cost);
        index_keys(checks, sc.classed, &mut sc.vals, &mut sc.dims, &mut sc.keys);
        let mut quick = Quick::ALL;
        let mut extra = Vec::new();
        for c in checks.drain(..) {
            match c {
                Check::Range { field, lo, hi } if quick.narrow(field, lo, hi) => {}
                // An empty set never matches: an empty box says so.
                Check::Set { ref set, .. } if set.ranges().is_empty() => quick.proto = [1, 0],
                c => extra.push(c),
            }
        }
        let mut lean = Lean::of(&quick, extra.is_empty());
        if r.stmts.is_empty() {
            lean.flags |= match r.verdict {
                Some(Verdict::Accept) => F_ACCEPT,
                Some(Verdict::Drop) => F_DROP,
                _ => 0,
            };
        }
        CRule {
            quick,
            lean,
            extra: extra.into(),
            id: r.id,
            stmts: r.stmts.clone().into(),
            verdict: r.verdict,
        }
    }
}

/// Rules of a chain compiled in one go: rule `i` of `rules` has the
/// natural keys `keys[ends[i - 1]..ends[i]]` (from 0 for the first).
struct CompiledRules {
    rules: Vec<Arc<CRule>>,
    keys: Vec<NatKey>,
    ends: Vec<usize>,
}

/// Chains at least this long are compiled on two threads ([`CChain::build`]).
const PAR_COMPILE_MIN: usize = 8192;

/// Compiles rules in order (the part of a chain another thread compiles).
fn compile_part(rules: &[Rule], classed: bool) -> CompiledRules {
    let mut sc = BuildScratch {
        classed,
        ..BuildScratch::default()
    };
    let mut out = CompiledRules {
        rules: Vec::with_capacity(rules.len()),
        keys: Vec::with_capacity(rules.len()),
        ends: Vec::with_capacity(rules.len()),
    };
    for r in rules {
        out.rules.push(Arc::new(CRule::compile(r, &mut sc)));
        out.keys.extend_from_slice(&sc.keys);
        out.ends.push(out.keys.len());
    }
    out
}

/// Calls `f(value, prefix_len)` for the minimal prefix cover of `r`; stops
/// (returning `false`) after `cap` prefixes or when `f` returns `false`.
fn prefixes(r: Range, width: u32, cap: usize, mut f: impl FnMut(u128, u32) -> bool) -> bool {
    let (mut lo, hi) = (r.lo, r.hi);
    let span = |s: u32| u128::MAX.checked_shr(128 - s).unwrap_or(0);
    let mut n = 0;
    loop {
        // The largest block of 2^s values that starts at `lo` (aligned:
        // s <= trailing zeros of lo) and ends at or before `hi`
        // (2^s <= hi - lo + 1), in constant time.
        let aligned = if lo == 0 {
            width
        } else {
            lo.trailing_zeros().min(width)
        };
        let fits = hi
            .saturating_sub(lo)
            .checked_add(1)
            .map_or(128, |c| 127 - c.leading_zeros());
        let s = aligned.min(fits);
        if !f(lo, width - s) {
            return false;
        }
        n += 1;
        let end = lo + span(s);
        if end >= hi {
            return true;
        }
        if n >= cap {
            return false;
        }
        lo = end + 1;
    }
}

/// Index keys of one dimension: `(masked value, level index)`, or `None` when
/// the dimension stays wildcard (the tests' form of [`expand_dim_into`]).
#[cfg(test)]
fn expand_dim(dim: usize, ranges: &[Range]) -> Option<Vec<(u128, u8)>> {
    let mut out = Vec::new();
    expand_dim_into(dim, ranges, &mut out).then_some(out)
}

/// [`expand_dim`] appending to `out`: the keys go after its current
/// contents, sorted and deduplicated; false (with `out` as it was) when the
/// dimension stays wildcard.
fn expand_dim_into(dim: usize, ranges: &[Range], out: &mut Vec<(u128, u8)>) -> bool {
    let base = out.len();
    let lv = levels(dim);
    let width = DIM_FIELDS[dim].width();
    let full = (lv.len() - 1) as u8;
    for r in ranges {
        // Prefix cover rounded down to the levels (pushed to `out` directly,
        // taken back if unused); a small range that would round to wildcard
        // is enumerated value by value instead.
        let start = out.len();
        let mut rwild = false;
        let small = r.hi - r.lo < ENUM_SMALL;
        let ok = prefixes(*r, width, DIM_CAP, |v, plen| {
            let li = level_of(dim, v, plen);
            rwild |= li == 0;
            let l = lv.get(li).copied().unwrap_or(0);
            out.push((v & lvl_mask(l, width), li as u8));
            // A wildcard prefix of a range too large to enumerate makes
            // the whole dimension wildcard: the rest is not needed.
            small || !rwild
        });
        if (rwild || !ok) && small {
            out.truncate(start);
            let m = lvl_mask(lv.get(full as usize).copied().unwrap_or(0), width);
            out.extend((r.lo..=r.hi).map(|v| (v & m, full)));
        } else if !ok || rwild {
            out.truncate(base);
            return false;
        }
        if out.len() - base > DIM_CAP {
            out.truncate(base);
            return false;
        }
    }
    if let Some(tail) = out.get_mut(base..) {
        tail.sort_unstable();
    }
    dedup_from(out, base);
    true
}

/// Removes consecutive duplicates from `v[base..]`.
fn dedup_from<T: PartialEq + Copy>(v: &mut Vec<T>, base: usize) {
    let mut w = base;
    for i in base..v.len() {
        let Some(x) = v.get(i).copied() else { break };
        if w == base || v.get(w - 1) != Some(&x) {
            if let Some(d) = v.get_mut(w) {
                *d = x;
            }
            w += 1;
        }
    }
    v.truncate(w);
}

/// Fingerprint of a key: the lane hashes of its non-wildcard dimensions,
/// combined in dimension order (the lookup computes the same per tuple).
fn key_hash(sig: &Sig, vals: &[u128; NDIM]) -> u64 {
    let mut h = if sig[2] != 0 {
        class_seed(vals[2])
    } else {
        SEED
    };
    for d in 0..NDIM {
        if sig[d] != 0 && d != 2 {
            h = combine(h, lane_hash(d, vals[d]));
        }
    }
    finish(h)
}

/// A natural index key: the most specific level of every indexed dimension
/// (its signature) and the values masked to those levels.
type NatKey = (Sig, [u128; NDIM]);

/// A protocol or destination-port condition as the L4 class needs it: a
/// single range (from a range check) or a set's ranges.
type L4Cond<'a> = (Range, Option<&'a [Range]>);

/// The natural index keys of a rule: the cross product of its dimensions'
/// expansions (no keys at all when a condition can never hold).
/// The keys go to `keys`; `vals` and `dims` are scratch.
fn index_keys(
    checks: &[Check],
    classed: bool,
    vals: &mut Vec<(u128, u8)>,
    dims: &mut Vec<(usize, usize, usize)>,
    keys: &mut Vec<NatKey>,
) {
    vals.clear();
    dims.clear();
    keys.clear();
    // The protocol and destination-port conditions (for the L4 class).
    let mut l4: [Option<L4Cond>; 2] = [None, None];
    // The first range or set check of each dimension, in one pass.
    let mut first: [Option<&Check>; NDIM] = [None; NDIM];
    for c in checks {
        if let Check::Range { field, .. } | Check::Set { field, .. } = c {
            if let Some(slot) = dim_of(*field).and_then(|d| first.get_mut(d)) {
                slot.get_or_insert(c);
            }
        }
    }
    for (d, found) in first.into_iter().enumerate() {
        let one;
        let rs = match found {
            Some(Check::Range { lo, hi, .. }) => {
                one = [Range { lo: *lo, hi: *hi }];
                &one[..]
            }
            Some(Check::Set { set, .. }) => set.ranges(),
            _ => continue,
        };
        if d == 2 || d == 4 {
            // The protocol and the destination port feed the L4 class (below).
            l4[d / 4] = Some(match found {
                Some(Check::Set { set, .. }) => (Range { lo: 0, hi: 0 }, Some(set.ranges())),
                _ => (rs.first().copied().unwrap_or(Range { lo: 0, hi: 0 }), None),
            });
            if d == 2 {
                continue;
            }
        }
        let start = vals.len();
        if expand_dim_into(d, rs, vals) {
            if vals.len() == start {
                // The condition can never hold: no entry at all.
                return;
            }
            dims.push((d, start, vals.len()));
        }
    }
    // The source port is indexed only when nothing else is (fewer tuples).
    if dims.iter().any(|(d, _, _)| *d != 3) {
        dims.retain(|(d, _, _)| *d != 3);
    }
    // In a chain that keys the L4 class, every key carries one of the
    // rule's classes (dimension 2, at its exact level): one key per class a
    // matching packet can be in. No class at all: the rule never matches.
    let start = vals.len();
    let [proto, dport] = l4.each_ref().map(|x| {
        x.as_ref()
            .map(|(one, many)| many.unwrap_or(std::slice::from_ref(one)))
    });
    for c in 0..L4_CLASSES {
        if class_allowed(c, proto, dport) {
            vals.push((c as u128, 1));
        }
    }
    if vals.len() == start {
        // No packet of any class can match: no entry at all.
        return;
    }
    if !classed {
        // The chain does not key the class: one key, class wildcard.
        vals.truncate(start);
    }
    let classes = (2, start, vals.len());
    dims.sort_by_key(|(_, a, b)| b - a);
    let mut product = (classes.2 - classes.1).max(1);
    dims.retain(|(_, a, b)| {
        if product * (b - a) <= CROSS_CAP {
            product *= b - a;
            true
        } else {
            false
        }
    });
    if classed {
        dims.push(classes);
    }
    // The cross product: key `i` takes, in every dimension, the digit of
    // `i` in the mixed radix of the expansions.
    keys.reserve(product);
    for i in 0..product {
        let (mut sig, mut kv) = ([0u8; NDIM], [0u128; NDIM]);
        let mut rest = i;
        for &(d, a, b) in dims.iter() {
            let n = (b - a).max(1);
            if let (Some(&(v, l)), Some(s), Some(x)) =
                (vals.get(a + rest % n), sig.get_mut(d), kv.get_mut(d))
            {
                *s = l;
                *x = v;
            }
            rest /= n;
        }
        keys.push((sig, kv));
    }
    keys.sort_unstable();
    keys.dedup();
}

/// L4 classes: TCP and UDP each split at destination port 1024, ICMP and
/// ICMPv6, everything else. In a chain that keys them ([`keys_class`]),
/// every key holds the class of the packets it stands for (dimension 2,
/// the protocol's), so a bucket holds only rules a packet of that class
/// can match: at 100 000 ClassBench-style rules most candidates of a
/// shared key used to fail on the protocol or the destination port. A rule
/// without such conditions is filed once per class; no tuple is added
/// (every key of the chain has the class).
const L4_CLASSES: usize = 6;

/// Whether a chain of `rules` keys the L4 class: when at least three in
/// four of its rules have a protocol or destination-port condition. A rule
/// without either is filed once per class (six keys), so a chain of such
/// rules (a host list, `ip saddr A drop` 150 000 times) would get six times
/// the entries, 2.1x the compile time and the memory, and gain nothing.
fn keys_class(rules: &[Rule]) -> bool {
    let l4 = rules
        .iter()
        .filter(|r| {
            r.matches.iter().any(|m| {
                matches!(
                    m,
                    Match::In {
                        field: Field::L4Proto | Field::Dport,
                        ..
                    }
                )
            })
        })
        .count();
    !rules.is_empty() && 4 * l4 >= 3 * rules.len()
}

/// The L4 class of a packet (see [`L4_CLASSES`]).
#[inline]
fn l4_class(proto: u8, dport: u16) -> u128 {
    let high = u128::from(dport >= 1024);
    match proto {
        6 => high,
        17 => 2 + high,
        1 | 58 => 4,
        _ => 5,
    }
}

/// The start of the key hash of class `c`: the class is folded in once
/// per packet, not hashed as a lane by every tuple.
#[inline]
fn class_seed(c: u128) -> u64 {
    SEED ^ (c as u64 + 1).wrapping_mul(0xa076_1d64_78bd_642f)
}

/// Whether some packet of class `c` satisfies the protocol ranges `proto`
/// and the destination-port ranges `dport` (`None`: no condition).
fn class_allowed(c: usize, proto: Option<&[Range]>, dport: Option<&[Range]>) -> bool {
    let any = |rs: Option<&[Range]>, lo: u128, hi: u128| {
        rs.is_none_or(|rs| rs.iter().any(|r| r.lo <= hi && lo <= r.hi))
    };
    let ports = |lo, hi| any(dport, lo, hi);
    match c {
        0 => any(proto, 6, 6) && ports(0, 1023),
        1 => any(proto, 6, 6) && ports(1024, 65535),
        2 => any(proto, 17, 17) && ports(0, 1023),
        3 => any(proto, 17, 17) && ports(1024, 65535),
        4 => any(proto, 1, 1) || any(proto, 58, 58),
        _ => proto.is_none_or(|rs| {
            rs.iter().any(|r| {
                let hi = r.hi.min(255);
                let special = [1u128, 6, 17, 58]
                    .iter()
                    .filter(|v| r.lo <= **v && **v <= hi)
                    .count() as u128;
                r.lo <= hi && hi - r.lo + 1 > special
            })
        }),
    }
}

/// Whether a key of signature `k` can be filed in a tuple of signature `t`:
/// every level of `t` is at most the key's.
fn fits(t: &Sig, k: &Sig) -> bool {
    t.iter().zip(k.iter()).all(|(a, b)| a <= b)
}

/// Bits of key a tuple of signature `t` keeps (its specificity).
fn spec(t: &Sig) -> u32 {
    t.iter()
        .enumerate()
        .map(|(d, l)| levels(d).get(*l as usize).copied().unwrap_or(0))
        .sum()
}

/// The fingerprint of a natural key filed in a tuple of signature `t`.
fn key_in(t: &Sig, k: &NatKey) -> u64 {
    let mut vals = [0u128; NDIM];
    for d in 0..NDIM {
        if t[d] != 0 {
            let lv = levels(d).get(t[d] as usize).copied().unwrap_or(0);
            vals[d] = k.1[d] & lvl_mask(lv, DIM_FIELDS[d].width());
        }
    }
    key_hash(t, &vals)
}

/// Collision limit: a key is filed in the most specific existing tuple that
/// it fits and whose bucket for it holds fewer entries than this; when there
/// is none, in the tuple of its own signature (TupleMerge's placement rule).
const COLLIDE: usize = 32;

/// How many host keys (IPv4 /32, IPv6 /128) a bucket of the tuple with the
/// key's signature but its host addresses at /24 (/64) takes before the
/// host tuple takes them: a lookup scans the hosts a coarse bucket keeps,
/// and for IPv6 reads each candidate's rule (the inline box holds IPv4
/// bounds only). Block lists of host rules (`probe hosts|hosts6 N 20 single
/// 5`, 2026-11-24): with [`COLLIDE`] (32) here IPv4 44 / 76 / 50 ns at 20 /
/// 100 / 1 000 rules, IPv6 77 / 178 / 212 / 259 ns at 20 / 1 000 / 10 000 /
/// 100 000; with 4 IPv4 41 / 44 / 37 and IPv6 58 / 68 / 91 / 144. The
/// ClassBench-style sets never reach it (no host tuple is made).
const HOST_COLLIDE: usize = 4;

/// Files the natural keys of one rule (see [`COLLIDE`]); `sigs` are the
/// chain's tuples by decreasing specificity and `load(t, fp)` the entries of
/// bucket `fp` of tuple `t`. Keys that land in the same bucket are filed once.
fn place(
    sigs: &[Sig],
    nat: &[NatKey],
    load: impl Fn(&Sig, u64) -> usize,
    out: &mut Vec<(Sig, u64)>,
) {
    out.clear();
    for k in nat {
        // The key with its host addresses at /24 (IPv4) or /64 (IPv6): a
        // tuple of exactly that signature takes at most `HOST_COLLIDE` of
        // them per bucket before a host tuple is made.
        let mut capped = k.0;
        for (l, v) in capped.iter_mut().zip(k.1).take(2) {
            if usize::from(*l) == HOST_LEVEL {
                *l = if v >> 32 == V4_MAPPED >> 32 { 5 } else { 2 };
            }
        }
        let mut at = None;
        for t in sigs {
            if fits(t, &k.0) {
                let fp = key_in(t, k);
                let limit = if capped != k.0 && *t == capped {
                    HOST_COLLIDE
                } else {
                    COLLIDE
                };
                if load(t, fp) < limit {
                    at = Some((*t, fp));
                    break;
                }
            }
        }
        let at = at.unwrap_or_else(|| {
            // A new tuple: host addresses at /24 (IPv4) or /64 (IPv6)
            // while that bucket has room, as hosts once it is crowded.
            if capped != k.0 {
                let fp = key_in(&capped, k);
                if load(&capped, fp) < HOST_COLLIDE {
                    return (capped, fp);
                }
            }
            (k.0, key_in(&k.0, k))
        });
        if !out.contains(&at) {
            out.push(at);
        }
    }
}

/// Inserts `sig` into `sigs`, kept by decreasing specificity.
fn add_sig(sigs: &mut Vec<Sig>, sig: Sig) {
    if !sigs.contains(&sig) {
        let key = |t: &Sig| (std::cmp::Reverse(spec(t)), *t);
        let i = sigs.partition_point(|t| key(t) < key(&sig));
        sigs.insert(i, sig);
    }
}

/// [`Lean`] flag: any source address.
const F_SANY: u8 = 1;
/// [`Lean`] flag: any destination address.
const F_DANY: u8 = 2;
/// [`Lean`] flag: the box is necessary but not sufficient; the compiled rule
/// is checked too (IPv6 bounds, or conditions outside the 5-tuple).
const F_FULL: u8 = 4;
/// [`Lean`] flag: the rule has no statements and accepts (the lookup's
/// caller decides from the entry alone, without reading the rule).
const F_ACCEPT: u8 = 8;
/// [`Lean`] flag: the rule has no statements and drops.
const F_DROP: u8 = 16;

/// The 5-tuple box of a rule in IPv4 form (28 bytes), stored inline in every
/// table entry, so that verifying a candidate reads no other cache line.
#[derive(Clone, Copy, Debug)]
struct Lean {
    flags: u8,
    proto: [u8; 2],
    sport: [u16; 2],
    dport: [u16; 2],
    saddr: [u32; 2],
    daddr: [u32; 2],
}

/// A packet as [`Lean::holds`] reads it.
#[derive(Clone, Copy, Debug)]
struct LeanKey {
    s4: u32,
    d4: u32,
    s_v4: bool,
    d_v4: bool,
    sport: u16,
    dport: u16,
    proto: u8,
}

impl LeanKey {
    #[inline]
    fn of(p: &PacketFields) -> Self {
        LeanKey {
            s4: p.saddr as u32,
            d4: p.daddr as u32,
            s_v4: p.saddr >> 32 == V4_MAPPED >> 32,
            d_v4: p.daddr >> 32 == V4_MAPPED >> 32,
            sport: p.sport,
            dport: p.dport,
            proto: p.l4proto,
        }
    }
}

impl Lean {
    /// The box of `q`; `exact` when the rule has no conditions outside it.
    fn of(q: &Quick, exact: bool) -> Lean {
        let mut flags = if exact { 0 } else { F_FULL };
        let mut never = false;
        let mut addr = |a: [u128; 2], any: u8| -> [u32; 2] {
            if a[0] > a[1] {
                never = true;
                [1, 0]
            } else if a == [0, u128::MAX] {
                flags |= any;
                [0, u32::MAX]
            } else if a[0] >> 32 == V4_MAPPED >> 32 && a[1] >> 32 == V4_MAPPED >> 32 {
                [a[0] as u32, a[1] as u32]
            } else {
                flags |= any | F_FULL;
                [0, u32::MAX]
            }
        };
        let saddr = addr(q.saddr, F_SANY);
        let daddr = addr(q.daddr, F_DANY);
        Lean {
            flags,
            // An empty address range never holds: an empty proto range says so.
            proto: if never { [1, 0] } else { q.proto },
            sport: q.sport,
            dport: q.dport,
            saddr,
            daddr,
        }
    }

    /// Whether the packet is in the box. The protocol and the destination
    /// port, which reject most candidates of a crowded bucket (entries that
    /// share a key differ mostly there), are checked first.
    #[inline]
    fn holds(&self, k: &LeanKey) -> bool {
        if !((self.proto[0] <= k.proto)
            & (k.proto <= self.proto[1])
            & (self.dport[0] <= k.dport)
            & (k.dport <= self.dport[1]))
        {
            return false;
        }
        let s = (self.flags & F_SANY != 0)
            | (k.s_v4 & (self.saddr[0] <= k.s4) & (k.s4 <= self.saddr[1]));
        let d = (self.flags & F_DANY != 0)
            | (k.d_v4 & (self.daddr[0] <= k.d4) & (k.d4 <= self.daddr[1]));
        s & d & (self.sport[0] <= k.sport) & (k.sport <= self.sport[1])
    }
}

/// One table entry (56 bytes): a rule's position, the tag of the key it is
/// filed under, the rule's inline box, its handle, and the chain slot that
/// holds the rule. A rule without statements whose verdict is accept or
/// drop says so in its box flags, so a lookup that ends on it never reads
/// the rule itself.
///
/// The entry is plain data (`Copy`): an update copies a slot list with a
/// `memcpy`, and freeing the replaced list touches no reference count. With
/// an `Arc` of the rule in every entry, a crowded list (seed 002's host
/// rules share a /24 key, 256 to a list, in each of six L4 classes when
/// the chain keys them) cost two atomic operations per entry copied and
/// freed: 20.5 µs per append against 14.0 (`SEED002=1 cargo run --release
/// -p sluice-tester --example append`, 2026-11-24, with the class keyed in
/// every chain). A rule whose box is not sufficient is read through its
/// slot (one more dependent load than through the entry's own `Arc`).
#[derive(Clone, Copy, Debug)]
struct Ent {
    pos: u64,
    tag: u32,
    slot: u32,
    lean: Lean,
    id: RuleId,
}

impl Ent {
    fn new(fp: u64, pos: u64, rule: &CRule, slot: u32) -> Self {
        Ent {
            pos,
            tag: tag_of(fp),
            slot,
            lean: rule.lean,
            id: rule.id,
        }
    }

    /// Whether the packet matches the entry's rule (`chain` holds it).
    #[inline(always)]
    fn matches(&self, k: &LeanKey, p: &PacketFields, chain: &CChain) -> bool {
        self.lean.holds(k) && (self.lean.flags & F_FULL == 0 || self.full_match(p, chain))
    }

    /// The whole rule's check, for a box that is not sufficient (kept out of
    /// line: the inline check is in every probe loop).
    #[inline(never)]
    fn full_match(&self, p: &PacketFields, chain: &CChain) -> bool {
        chain.rule_at(self.slot).is_some_and(|r| r.matches(p))
    }

    fn is(&self, pos: u64, slot: u32) -> bool {
        self.pos == pos && self.slot == slot
    }
}

/// The tag of a fingerprint: its high half (the low bits of the tag select
/// the slot, the rest filters entries of other keys sharing the slot).
#[inline]
fn tag_of(fp: u64) -> u32 {
    (fp >> 32) as u32
}

/// The 8-bit tag check of a summary word: the top byte of the tag (above
/// the slot bits of any table under 2^24 slots), never 0.
#[inline]
fn tag8(tag: u32) -> u32 {
    let x = tag >> 24;
    x | u32::from(x == 0)
}

/// The summary word of a slot list `v` (sorted by position), 4 bytes: the
/// [`bound_of`] its first position in the high 24 bits; in the low byte the
/// [`tag8`] of the entries' common tag when they all share one (a *pure*
/// slot), else 0. `u32::MAX` when the list is empty.
fn summary(v: &[Ent]) -> u32 {
    match v.first() {
        None => u32::MAX,
        Some(f) => {
            let pure = v.iter().all(|e| e.tag == f.tag);
            let x = if pure { tag8(f.tag) } else { 0 };
            bound_of(f.pos) << 8 | x
        }
    }
}

/// The bound a summary word gives a key of tag `tag` landing in its slot:
/// [`EMPTY`] when the slot is empty, or pure with a tag of another check
/// byte (so certainly another tag).
#[inline]
fn sum_bound(w: u32, tag: u32) -> u32 {
    let x = w & 0xff;
    if x == 0 || x == tag8(tag) {
        w >> 8
    } else {
        EMPTY
    }
}

/// Inserts `h` into `heads[..n]`, kept sorted by bound; returns the new
/// length (`n` when `heads` is full).
#[inline]
fn push_sorted(heads: &mut [Head], n: usize, h: Head) -> usize {
    let Some(hs) = heads.get_mut(..=n) else {
        return n;
    };
    let mut i = n;
    while i > 0 {
        let Some(p) = hs.get(i - 1).copied() else {
            break;
        };
        if p.bound <= h.bound {
            break;
        }
        if let Some(x) = hs.get_mut(i) {
            *x = p;
        }
        i -= 1;
    }
    if let Some(x) = hs.get_mut(i) {
        *x = h;
    }
    n + 1
}

/// A packet's hashes: one per lane of the chain, and the seed of its L4
/// class (every key holds the class, [`L4_CLASSES`]).
struct PacketHash {
    lanes: [u64; MAX_LANES],
    seed: u64,
}

/// Slots for a table of `n` entries: a power of two, load factor 1/4 to 1/2
/// (at 1/2 to 1, more keys shared a slot: at 10 000 ClassBench rules 4.6
/// candidate slots, 2.3 visited and 7.2 entries scanned per lookup instead
/// of 4.1, 2.0 and 6.0, and 7–16 % more time per lookup; at 1/8 to 1/4 the
/// larger summaries and lists cost more misses than the sparser slots save).
fn slots_for(n: usize) -> usize {
    (2 * n).max(16).next_power_of_two()
}

/// A tuple: one hash table for every rule key of one signature (level
/// vector), plus its priority summary.
///
/// The table is open hashing by slot: slot `tag & mask` holds, sorted by
/// position, every entry whose key tag lands there (several keys may share a
/// slot; the tag and the box tell them apart). `bounds` is the summary:
/// `bounds[s]` is [`bound_of`] the first (lowest) position of slot `s`, or
/// [`EMPTY`]. Both are exact after every update.
#[derive(Clone, Debug)]
struct Tuple {
    sig: Sig,
    /// Chain lane of every non-wildcard dimension, in dimension order
    /// (`lanes[..nlanes]`; inline, so a probe reads no other line).
    lanes: [u8; NDIM],
    nlanes: u8,
    /// Lower bound of the positions held (exact after inserts, stale-low after deletes).
    min_pos: u64,
    /// Upper bound of the positions held.
    max_pos: u64,
    entries: usize,
    /// Slots − 1.
    mask: usize,
    sums: Chunks<u32>,
    lists: Chunks<Option<Arc<[Ent]>>>,
}

impl Tuple {
    fn new(sig: Sig, chain_lanes: &mut Vec<(u8, u128)>, capacity: usize) -> Self {
        let mut lanes = Vec::new();
        for (d, l) in sig.iter().enumerate() {
            // The L4 class (dimension 2) is the hash's seed, not a lane.
            if *l == 0 || d == 2 {
                continue;
            }
            let lv = levels(d).get(*l as usize).copied().unwrap_or(0);
            let lane = (d as u8, lvl_mask(lv, DIM_FIELDS[d].width()));
            let i = match chain_lanes.iter().position(|x| *x == lane) {
                Some(i) => i,
                None => {
                    chain_lanes.push(lane);
                    chain_lanes.len() - 1
                }
            };
            lanes.push(i as u8);
        }
        let n = slots_for(capacity);
        let nlanes = lanes.len() as u8;
        let mut inline = [0u8; NDIM];
        for (d, l) in inline.iter_mut().zip(lanes) {
            *d = l;
        }
        Tuple {
            sig,
            lanes: inline,
            nlanes,
            min_pos: u64::MAX,
            max_pos: 0,
            entries: 0,
            mask: n - 1,
            sums: Chunks::filled(n, u32::MAX),
            lists: Chunks::filled(n, None),
        }
    }

    /// The fingerprint of the packet's key in this tuple.
    #[inline]
    fn fingerprint(&self, ph: &PacketHash) -> u64 {
        let mut h = ph.seed;
        for l in self.lanes.iter().take(self.nlanes.into()) {
            h = combine(h, ph.lanes[usize::from(*l) % MAX_LANES]);
        }
        finish(h)
    }

    #[inline]
    fn slot(&self, tag: u32) -> usize {
        tag as usize & self.mask
    }

    /// The summary bound of slot `s` for a key of tag `tag`: [`EMPTY`] when
    /// the slot holds no entry of that tag as far as the summary tells.
    #[inline]
    fn bound(&self, s: usize, tag: u32) -> u32 {
        sum_bound(self.sums.get(s).copied().unwrap_or(u32::MAX), tag)
    }

    #[inline]
    fn list(&self, s: usize) -> &[Ent] {
        self.lists.get(s).and_then(|l| l.as_deref()).unwrap_or(&[])
    }

    /// Entries in the bucket of `fp`.
    fn load(&self, fp: u64) -> usize {
        let tag = tag_of(fp);
        self.list(self.slot(tag))
            .iter()
            .filter(|e| e.tag == tag)
            .count()
    }

    /// Replaces slot `s` with `v` (sorted by position) and updates its bound.
    /// Replaces slot `s` with `v` (sorted by position) and updates its
    /// bound.
    fn set_list(&mut self, s: usize, v: Vec<Ent>) {
        let v: Arc<[Ent]> = v.into();
        if let Some(b) = self.sums.get_mut(s) {
            *b = summary(&v);
        }
        if let Some(l) = self.lists.get_mut(s) {
            *l = if v.is_empty() { None } else { Some(v) };
        }
    }

    /// Replaces the table's contents with `ents` (`self.mask + 1` slots):
    /// one list per slot, sorted by position. A stable counting sort by
    /// slot (the callers pass entries in position order, or at least in
    /// position order within each future slot; a run that is not gets
    /// sorted), then every list and summary chunk is built once at its
    /// final size, the entries moved, not cloned.
    fn fill(&mut self, ents: Vec<Ent>) {
        let n = self.mask + 1;
        let mask = self.mask;
        let slot = |e: &Ent| e.tag as usize & mask;
        // starts[s]..starts[s + 1]: the indices (in `order`) of slot `s`.
        let mut starts = vec![0u32; n + 1];
        for e in &ents {
            if let Some(c) = starts.get_mut(slot(e) + 1) {
                *c += 1;
            }
        }
        for s in 1..=n {
            let prev = starts.get(s - 1).copied().unwrap_or(0);
            if let Some(c) = starts.get_mut(s) {
                *c += prev;
            }
        }
        let mut next: Vec<u32> = starts.clone();
        let mut order = vec![0u32; ents.len()];
        for (i, e) in ents.iter().enumerate() {
            if let Some(c) = next.get_mut(slot(e)) {
                if let Some(o) = order.get_mut(*c as usize) {
                    *o = i as u32;
                }
                *c += 1;
            }
        }
        drop(next);
        let mut ents: Vec<Option<Ent>> = ents.into_iter().map(Some).collect();
        let lists = Chunks::from_fn(n, |s| {
            let (a, b) = (
                starts.get(s).copied().unwrap_or(0) as usize,
                starts.get(s + 1).copied().unwrap_or(0) as usize,
            );
            let idx = order.get(a..b).unwrap_or_default();
            if idx.is_empty() {
                return None;
            }
            let mut take = idx
                .iter()
                .filter_map(|&i| ents.get_mut(i as usize).and_then(Option::take));
            if idx.len() == 1 {
                // Most slots: one allocation, at the list's final size.
                return take.next().map(|e| std::iter::once(e).collect());
            }
            let mut v: Vec<Ent> = take.collect();
            if !v.is_sorted_by_key(|e| e.pos) {
                v.sort_by_key(|e| e.pos);
            }
            Some(Arc::from(v))
        });
        self.sums = Chunks::from_fn(n, |s| {
            lists
                .get(s)
                .and_then(|l| l.as_deref())
                .map_or(u32::MAX, summary)
        });
        self.lists = lists;
    }

    fn add(&mut self, fp: u64, pos: u64, rule: &CRule, slot: u32) {
        self.min_pos = self.min_pos.min(pos);
        self.max_pos = self.max_pos.max(pos);
        self.entries += 1;
        let s = self.slot(tag_of(fp));
        let held = self.lists.get(s).cloned().flatten();
        let old = held.as_deref().unwrap_or(&[]);
        let (a, b) = old.split_at(old.partition_point(|e| e.pos < pos));
        let new = Ent::new(fp, pos, rule, slot);
        // Built at its final length (copying the list and then inserting
        // into it grew the vector: one more copy of a crowded list).
        let mut v = Vec::with_capacity(old.len() + 1);
        v.extend_from_slice(a);
        v.push(new);
        v.extend_from_slice(b);
        self.set_list(s, v);
        if 2 * self.entries > self.mask + 1 {
            // Over load 1/2: rehash into twice the slots.
            self.resize();
        }
    }

    fn remove(&mut self, fp: u64, pos: u64, slot: u32) {
        let s = self.slot(tag_of(fp));
        let old = self.list(s);
        if old.iter().any(|e| e.is(pos, slot)) {
            let v: Vec<Ent> = old.iter().filter(|e| !e.is(pos, slot)).copied().collect();
            self.set_list(s, v);
            self.entries = self.entries.saturating_sub(1);
        }
    }

    /// The rule of chain slot `slot` moved from `old` to `new` (a relabel,
    /// which keeps the order of all rules once it is complete; until then a
    /// slot is re-sorted).
    fn moved(&mut self, fp: u64, slot: u32, old: u64, new: u64) {
        self.min_pos = self.min_pos.min(new);
        self.max_pos = self.max_pos.max(new);
        let s = self.slot(tag_of(fp));
        let mut v = self.list(s).to_vec();
        for e in v.iter_mut() {
            if e.is(old, slot) {
                e.pos = new;
            }
        }
        v.sort_by_key(|e| e.pos);
        self.set_list(s, v);
    }

    /// Rehashes into [`slots_for`] the current entry count (after growth).
    fn resize(&mut self) {
        let mut ents = Vec::with_capacity(self.entries);
        for c in 0..=self.mask {
            ents.extend(self.list(c).iter().copied());
        }
        self.mask = slots_for(ents.len()) - 1;
        self.fill(ents);
    }
}

#[derive(Clone, Debug)]
struct Slot {
    pos: u64,
    prev: u32,
    next: u32,
    rule: Option<Arc<CRule>>,
    /// Where the rule's keys are filed: (tuple signature, fingerprint).
    keys: SlotKeys,
}

/// The keys of a [`Slot`]; one key, what most rules have, is held inline.
#[derive(Clone, Debug)]
enum SlotKeys {
    One((Sig, u64)),
    Many(Arc<[(Sig, u64)]>),
}

impl SlotKeys {
    fn new(keys: &[(Sig, u64)]) -> Self {
        match keys {
            [one] => SlotKeys::One(*one),
            _ => SlotKeys::Many(keys.into()),
        }
    }

    fn as_slice(&self) -> &[(Sig, u64)] {
        match self {
            SlotKeys::One(k) => std::slice::from_ref(k),
            SlotKeys::Many(v) => v,
        }
    }
}

#[derive(Clone, Debug)]
struct CChain {
    name: Arc<str>,
    kind: ChainKind,
    slots: ChunkVec<Slot>,
    head: u32,
    tail: u32,
    free: Vec<u32>,
    by_id: IdIndex,
    tuples: Vec<Arc<Tuple>>,
    /// (dimension, mask) hashed once per lookup; tuples combine them.
    lanes: Vec<(u8, u128)>,
    len: usize,
    /// Jump/goto targets of this chain's rules, with counts.
    edges: BTreeMap<u32, u32>,
    /// Whether every key holds the packet's L4 class ([`L4_CLASSES`]),
    /// decided when the chain is built ([`keys_class`]) and kept for its
    /// life: a chain built empty does not.
    classed: bool,
}

fn id_key(id: RuleId) -> u64 {
    fmix(id.0 ^ SEED)
}

/// Rule id -> slot. A chain built from rules whose ids run consecutively
/// (what a rule-set load gives: rule `i` in slot `i`, slots never move)
/// stores that range (`dense`) and only the later changes (`changed`: an
/// id's slot, or `None` once deleted): at 150 000 rules a persistent map
/// of every id was 14 MB and 150 000 inserts.
#[derive(Clone, Debug)]
struct IdIndex {
    /// First id and count of the consecutive ids in slots `0..count`.
    dense: (u64, u64),
    changed: Sharded<Option<u32>>,
}

impl IdIndex {
    fn new() -> Self {
        IdIndex {
            dense: (0, 0),
            changed: Sharded::new(),
        }
    }

    /// The index of a chain built from `rules` (rule `i` in slot `i`).
    fn of(rules: &[Rule]) -> Self {
        let mut m = IdIndex::new();
        let first = rules.first().map_or(0, |r| r.id.0);
        let consecutive = rules
            .iter()
            .enumerate()
            .all(|(i, r)| first.checked_add(i as u64) == Some(r.id.0));
        if consecutive && u32::try_from(rules.len()).is_ok() {
            m.dense = (first, rules.len() as u64);
        } else {
            for (i, r) in rules.iter().enumerate() {
                m.insert(r.id, i as u32);
            }
        }
        m
    }

    fn get(&self, id: RuleId) -> Option<u32> {
        if let Some(s) = self.changed.get(id_key(id)) {
            return *s;
        }
        let (first, n) = self.dense;
        let k = id.0.checked_sub(first)?;
        (k < n).then_some(k as u32)
    }

    fn insert(&mut self, id: RuleId, slot: u32) {
        self.changed.insert(id_key(id), Some(slot));
    }

    fn remove(&mut self, id: RuleId) -> Option<u32> {
        let s = self.get(id)?;
        let (first, n) = self.dense;
        if id.0.checked_sub(first).is_some_and(|k| k < n) {
            self.changed.insert(id_key(id), None);
        } else {
            self.changed.remove(id_key(id));
        }
        Some(s)
    }
}

/// A tuple whose summary slot for the packet is not empty: a candidate of
/// a lookup's merge. Every position in the slot is at least `bound << 32`.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Head {
    bound: u32,
    tag: u32,
    tuple: u32,
}

impl CChain {
    fn new(name: &str, kind: ChainKind) -> Self {
        CChain {
            name: name.into(),
            kind,
            slots: ChunkVec::new(),
            head: NIL,
            tail: NIL,
            free: Vec::new(),
            by_id: IdIndex::new(),
            tuples: Vec::new(),
            lanes: Vec::new(),
            len: 0,
            edges: BTreeMap::new(),
            classed: false,
        }
    }

    /// Builds a chain from validated rules in one pass: positions
    /// `GAP, 2·GAP, …`, keys filed in rule order as inserts would file
    /// them, then every table built presized.
    fn build(name: &str, kind: ChainKind, rules: &[Rule], class_keys: Option<bool>) -> Self {
        let mut c = CChain::new(name, kind);
        c.classed = class_keys.unwrap_or_else(|| keys_class(rules));
        let classed = c.classed;
        let n = rules.len();
        let mut sigs: Vec<Sig> = Vec::new();
        // Bucket loads by (signature, fingerprint), folded into one u64 (a
        // rare fold collision only makes a placement less even).
        let lkey =
            |sig: &Sig, fp: u64| fp ^ fmix(sig.iter().fold(0u64, |a, l| a << 4 | u64::from(*l)));
        let mut load: hashbrown::HashMap<u64, u32, IdBuild> =
            hashbrown::HashMap::with_capacity_and_hasher(n, IdBuild);
        let mut groups: Vec<(Sig, Vec<Ent>)> = Vec::new();
        let mut placed: Vec<(Sig, u64)> = Vec::new();
        // Files rule `i` (compiled, with its natural keys) as inserts would.
        let mut file = |i: usize, r: &Rule, cr: Arc<CRule>, nat: &[NatKey]| {
            let pos = (i as u64 + 1) * GAP;
            place(
                &sigs,
                nat,
                |t, fp| load.get(&lkey(t, fp)).copied().unwrap_or(0) as usize,
                &mut placed,
            );
            for (sig, fp) in &placed {
                add_sig(&mut sigs, *sig);
                *load.entry(lkey(sig, *fp)).or_insert(0) += 1;
                let g = match groups.iter().position(|(g, _)| g == sig) {
                    Some(g) => g,
                    None => {
                        groups.push((*sig, Vec::new()));
                        groups.len() - 1
                    }
                };
                if let Some((_, v)) = groups.get_mut(g) {
                    v.push(Ent::new(*fp, pos, &cr, i as u32));
                }
            }
            if let Some(Verdict::Jump(t) | Verdict::Goto(t)) = r.verdict {
                *c.edges.entry(t.0).or_insert(0) += 1;
            }
            let s = c.slots.push(Slot {
                pos,
                prev: if i == 0 { NIL } else { i as u32 - 1 },
                next: if i + 1 < n { i as u32 + 1 } else { NIL },
                rule: Some(cr),
                keys: SlotKeys::new(&placed),
            });
            debug_assert_eq!(s, i);
        };
        // Compiling a rule depends on nothing else, so the second half of a
        // large chain is compiled on another thread while this one compiles
        // and files the first half; filing stays sequential, in rule order.
        let parallel =
            n >= PAR_COMPILE_MIN && std::thread::available_parallelism().is_ok_and(|t| t.get() > 1);
        let (first, second) = rules.split_at(if parallel { n / 2 } else { n });
        std::thread::scope(|scope| {
            let later =
                (!second.is_empty()).then(|| scope.spawn(move || compile_part(second, classed)));
            let mut sc = BuildScratch {
                classed,
                ..BuildScratch::default()
            };
            for (i, r) in first.iter().enumerate() {
                let cr = Arc::new(CRule::compile(r, &mut sc));
                file(i, r, cr, &sc.keys);
            }
            if let Some(h) = later {
                let part = h.join().unwrap_or_else(|e| std::panic::resume_unwind(e));
                let mut start = 0;
                for (k, (r, (cr, &end))) in second
                    .iter()
                    .zip(part.rules.into_iter().zip(&part.ends))
                    .enumerate()
                {
                    let nat = part.keys.get(start..end).unwrap_or_default();
                    start = end;
                    file(first.len() + k, r, cr, nat);
                }
            }
        });
        c.by_id = IdIndex::of(rules);
        if n > 0 {
            c.head = 0;
            c.tail = n as u32 - 1;
        }
        c.len = n;
        groups.sort_unstable_by_key(|(sig, _)| *sig);
        for (sig, ents) in groups {
            // Sized by `fill`, not here (the empty table would be discarded).
            let mut t = Tuple::new(sig, &mut c.lanes, 0);
            for e in &ents {
                t.min_pos = t.min_pos.min(e.pos);
                t.max_pos = t.max_pos.max(e.pos);
            }
            t.entries = ents.len();
            t.mask = slots_for(ents.len()) - 1;
            t.fill(ents);
            c.tuples.push(Arc::new(t));
        }
        c.tuples.sort_by_key(|t| t.min_pos);
        c
    }

    fn slot(&self, s: u32) -> Option<&Slot> {
        self.slots.get(s as usize)
    }

    /// The rule in slot `s`.
    #[inline]
    fn rule_at(&self, s: u32) -> Option<&CRule> {
        self.slot(s).and_then(|x| x.rule.as_deref())
    }

    fn pos_of(&self, s: u32) -> Option<u64> {
        self.slot(s).map(|x| x.pos)
    }

    /// Hashes the packet once per lane of the chain.
    #[inline]
    fn lane_hashes(&self, p: &PacketFields) -> PacketHash {
        let pv: [u128; NDIM] = [
            p.saddr,
            p.daddr,
            p.l4proto as u128,
            p.sport as u128,
            p.dport as u128,
            p.iifname.as_u128(),
            p.oifname.as_u128(),
            p.mark as u128,
            p.ct_state as u128,
        ];
        let mut lh = [0u64; MAX_LANES];
        for (h, (d, m)) in lh.iter_mut().zip(self.lanes.iter()) {
            *h = lane_hash(*d as usize, pv.get(*d as usize).copied().unwrap_or(0) & m);
        }
        PacketHash {
            lanes: lh,
            seed: if self.classed {
                class_seed(l4_class(p.l4proto, p.dport))
            } else {
                SEED
            },
        }
    }

    /// The lowest-positioned matching rule at or after `start`.
    #[inline(always)]
    fn first_match(
        &self,
        p: &PacketFields,
        start: u64,
        heads: &mut Vec<Head>,
    ) -> Option<(u64, &Ent)> {
        let lh = self.lane_hashes(p);
        if heads.len() < self.tuples.len() {
            heads.resize(self.tuples.len(), Head::default());
        }
        let k = LeanKey::of(p);
        let mut best = u64::MAX;
        let mut hit: Option<&Ent> = None;
        // Pending candidate slots: heads[lo..n], sorted by bound. Tuples come
        // by increasing `min_pos`: before a tuple is probed, every pending
        // slot that starts below its `min_pos` is visited, and once the best
        // match is at or below it, neither it nor any later tuple can hold a
        // better one (priority-sorted tuple search).
        let (mut lo, mut n) = (0usize, 0usize);
        for (ti, t) in self.tuples.iter().enumerate() {
            if t.max_pos < start {
                continue;
            }
            while lo < n {
                let Some(hd) = heads.get(lo).copied() else {
                    break;
                };
                if u64::from(hd.bound) << 32 >= t.min_pos.min(best) {
                    break;
                }
                lo += 1;
                self.visit(hd, start, &k, p, &mut best, &mut hit);
            }
            if best <= t.min_pos {
                return hit.map(|r| (best, r));
            }
            let tag = tag_of(t.fingerprint(&lh));
            let s = t.slot(tag);
            let b = t.bound(s, tag);
            if b != EMPTY {
                // The slot is likely visited: start loading its list while
                // the next tuples are probed.
                if let Some(l) = t.lists.get(s) {
                    sluice_io::mem::prefetch(l);
                }
                let h = Head {
                    bound: b,
                    tag,
                    tuple: ti as u32,
                };
                if let Some(pend) = heads.get_mut(lo..) {
                    n = lo + push_sorted(pend, n - lo, h);
                }
            }
        }
        for hd in heads.get(lo..n).unwrap_or(&[]) {
            if u64::from(hd.bound) << 32 >= best {
                break;
            }
            self.visit(*hd, start, &k, p, &mut best, &mut hit);
        }
        hit.map(|r| (best, r))
    }

    /// Scans the slot of head `hd` for a match at or after `start` and
    /// below `best`; the first one found becomes the best.
    #[inline(always)]
    fn visit<'a>(
        &'a self,
        hd: Head,
        start: u64,
        k: &LeanKey,
        p: &PacketFields,
        best: &mut u64,
        hit: &mut Option<&'a Ent>,
    ) {
        let Some(t) = self.tuples.get(hd.tuple as usize) else {
            return;
        };
        let es = t.list(t.slot(hd.tag));
        let from = if start > 0 {
            es.partition_point(|e| e.pos < start)
        } else {
            0
        };
        for e in es.get(from..).unwrap_or(&[]) {
            if e.pos >= *best {
                break;
            }
            if e.tag == hd.tag && e.matches(k, p, self) {
                *best = e.pos;
                *hit = Some(e);
                break;
            }
        }
    }

    /// Batch stage 1 (start 0): the tag of every tuple for `p` into `tags`,
    /// with a prefetch of the summary word and the list reference of its
    /// slot.
    #[inline]
    fn stage_tags(&self, p: &PacketFields, tags: &mut [u32]) {
        let lh = self.lane_hashes(p);
        for (t, out) in self.tuples.iter().zip(tags.iter_mut()) {
            let tag = tag_of(t.fingerprint(&lh));
            let s = t.slot(tag);
            if let Some(b) = t.sums.get(s) {
                sluice_io::mem::prefetch(b);
            }
            if let Some(l) = t.lists.get(s) {
                sluice_io::mem::prefetch(l);
            }
            *out = tag;
        }
    }

    /// Batch stage 2: the candidate heads of one packet from its `tags`
    /// (as [`Self::first_match`] builds them with `start` 0, sorted by
    /// bound), with a prefetch of the first entry of every candidate slot.
    /// Returns how many heads were written.
    #[inline]
    fn stage_heads(&self, tags: &[u32], heads: &mut [Head]) -> usize {
        let mut n = 0;
        for (ti, (t, tag)) in self.tuples.iter().zip(tags.iter()).enumerate() {
            let s = t.slot(*tag);
            let b = t.bound(s, *tag);
            if b != EMPTY {
                if let Some(e) = t.list(s).first() {
                    sluice_io::mem::prefetch(e);
                }
                let h = Head {
                    bound: b,
                    tag: *tag,
                    tuple: ti as u32,
                };
                n = push_sorted(heads, n, h);
            }
        }
        n
    }

    /// Phase 2: visits the candidate slots `heads` (sorted by bound) in
    /// order and scans each one up to the best match so far; stops when the
    /// next bound is not below it. Every entry below the best is verified,
    /// so the result is the lowest-positioned match.
    #[inline(always)]
    fn resolve(&self, p: &PacketFields, start: u64, heads: &[Head]) -> Option<(u64, &Ent)> {
        let k = LeanKey::of(p);
        let mut best = u64::MAX;
        let mut hit: Option<&Ent> = None;
        for hd in heads {
            if u64::from(hd.bound) << 32 >= best {
                break;
            }
            self.visit(*hd, start, &k, p, &mut best, &mut hit);
        }
        hit.map(|r| (best, r))
    }

    fn tuple_mut<'a>(
        tuples: &'a mut Vec<Arc<Tuple>>,
        lanes: &mut Vec<(u8, u128)>,
        sig: Sig,
    ) -> &'a mut Tuple {
        let i = match tuples.iter().position(|t| t.sig == sig) {
            Some(i) => i,
            None => {
                tuples.push(Arc::new(Tuple::new(sig, lanes, 0)));
                tuples.len() - 1
            }
        };
        Arc::make_mut(&mut tuples[i])
    }

    /// Files the natural keys of a new rule against the current tables.
    fn place_keys(&self, nat: &[NatKey]) -> Vec<(Sig, u64)> {
        let mut sigs: Vec<Sig> = Vec::with_capacity(self.tuples.len());
        for t in &self.tuples {
            add_sig(&mut sigs, t.sig);
        }
        let mut out = Vec::with_capacity(nat.len());
        place(
            &sigs,
            nat,
            |sig, fp| {
                self.tuples
                    .iter()
                    .find(|t| t.sig == *sig)
                    .map_or(0, |t| t.load(fp))
            },
            &mut out,
        );
        out
    }

    fn add_entries(&mut self, rule: &CRule, slot: u32, keys: &[(Sig, u64)], pos: u64) {
        for (sig, fp) in keys {
            Self::tuple_mut(&mut self.tuples, &mut self.lanes, *sig).add(*fp, pos, rule, slot);
        }
    }

    fn remove_entries(&mut self, slot: u32, keys: &[(Sig, u64)], pos: u64) {
        for (sig, fp) in keys {
            let Some(i) = self.tuples.iter().position(|t| t.sig == *sig) else {
                continue;
            };
            let t = Arc::make_mut(&mut self.tuples[i]);
            t.remove(*fp, pos, slot);
            if t.entries == 0 {
                self.tuples.swap_remove(i);
            }
        }
    }

    fn move_rule(&mut self, slot: u32, new: u64) {
        let Some(s) = self.slots.get_mut(slot as usize) else {
            return;
        };
        let old = s.pos;
        s.pos = new;
        if s.rule.is_none() {
            return;
        }
        let keys = s.keys.clone();
        for (sig, fp) in keys.as_slice() {
            Self::tuple_mut(&mut self.tuples, &mut self.lanes, *sig).moved(*fp, slot, old, new);
        }
    }

    /// Finds a free position between `prev` and `next`, relabelling a window
    /// of neighbours when the gap is exhausted.
    fn alloc_pos(&mut self, prev: u32, next: u32) -> u64 {
        let lo = self.pos_of(prev).unwrap_or(0);
        let hi = self.pos_of(next).unwrap_or(u64::MAX);
        if next == NIL && lo <= u64::MAX - 2 * GAP {
            return lo + GAP;
        }
        if hi - lo >= 2 {
            return lo + (hi - lo) / 2;
        }
        // Relabel: widen [left.., NEW, right..] until sparse enough.
        let (mut left, mut right) = (Vec::new(), Vec::new());
        let (mut l, mut r) = (prev, next);
        let mut k = 8usize;
        loop {
            while left.len() < k && l != NIL {
                left.push(l);
                l = self.slot(l).map_or(NIL, |s| s.prev);
            }
            while right.len() < k && r != NIL {
                right.push(r);
                r = self.slot(r).map_or(NIL, |s| s.next);
            }
            let lo_b = self.pos_of(l).unwrap_or(0);
            let hi_b = self.pos_of(r).unwrap_or(u64::MAX);
            let n = (left.len() + right.len() + 1) as u64;
            let step = (hi_b - lo_b) / (n + 1);
            if step >= 1 << 20 || (l == NIL && r == NIL) {
                let mut p = lo_b;
                for s in left.iter().rev() {
                    p += step;
                    self.move_rule(*s, p);
                }
                p += step;
                let new_pos = p;
                for s in right.iter() {
                    p += step;
                    self.move_rule(*s, p);
                }
                return new_pos;
            }
            k *= 2;
        }
    }

    fn insert(&mut self, at: Placement, rule: &Rule) -> Result<(), UpdateError> {
        if self.by_id.get(rule.id).is_some() {
            return Err(UpdateError::DuplicateRule(rule.id));
        }
        let slot_of = |c: &Self, id: RuleId| c.by_id.get(id).ok_or(UpdateError::UnknownRule(id));
        let (prev, next) = match at {
            Placement::Front => (NIL, self.head),
            Placement::Back => (self.tail, NIL),
            Placement::Before(id) => {
                let s = slot_of(self, id)?;
                (self.slot(s).map_or(NIL, |x| x.prev), s)
            }
            Placement::After(id) => {
                let s = slot_of(self, id)?;
                (s, self.slot(s).map_or(NIL, |x| x.next))
            }
        };
        let pos = self.alloc_pos(prev, next);
        let mut sc = BuildScratch {
            classed: self.classed,
            ..BuildScratch::default()
        };
        let c = Arc::new(CRule::compile(rule, &mut sc));
        let keys = self.place_keys(&sc.keys);
        let new = Slot {
            pos,
            prev,
            next,
            rule: Some(c.clone()),
            keys: SlotKeys::new(&keys),
        };
        let s = match self.free.pop() {
            Some(f) => {
                if let Some(x) = self.slots.get_mut(f as usize) {
                    *x = new;
                }
                f
            }
            None => self.slots.push(new) as u32,
        };
        match self.slots.get_mut(prev as usize) {
            Some(p) => p.next = s,
            None => self.head = s,
        }
        match self.slots.get_mut(next as usize) {
            Some(n) => n.prev = s,
            None => self.tail = s,
        }
        self.by_id.insert(rule.id, s);
        self.add_entries(&c, s, &keys, pos);
        self.tuples.sort_by_key(|t| t.min_pos);
        if let Some(Verdict::Jump(t) | Verdict::Goto(t)) = rule.verdict {
            *self.edges.entry(t.0).or_insert(0) += 1;
        }
        self.len += 1;
        Ok(())
    }

    fn delete(&mut self, id: RuleId) -> Result<(), UpdateError> {
        let s = self.by_id.remove(id).ok_or(UpdateError::UnknownRule(id))?;
        let Some(slot) = self.slot(s).cloned() else {
            return Err(UpdateError::UnknownRule(id));
        };
        if let Some(r) = &slot.rule {
            self.remove_entries(s, slot.keys.as_slice(), slot.pos);
            self.tuples.sort_by_key(|t| t.min_pos);
            if let Some(Verdict::Jump(t) | Verdict::Goto(t)) = r.verdict {
                if let Some(n) = self.edges.get_mut(&t.0) {
                    *n -= 1;
                    if *n == 0 {
                        self.edges.remove(&t.0);
                    }
                }
            }
        }
        match self.slots.get_mut(slot.prev as usize) {
            Some(p) => p.next = slot.next,
            None => self.head = slot.next,
        }
        match self.slots.get_mut(slot.next as usize) {
            Some(n) => n.prev = slot.prev,
            None => self.tail = slot.prev,
        }
        if let Some(x) = self.slots.get_mut(s as usize) {
            x.rule = None;
            x.keys = SlotKeys::Many(Arc::from([]));
            x.prev = NIL;
            x.next = NIL;
        }
        self.free.push(s);
        self.len -= 1;
        Ok(())
    }
}

/// Whether `to` is reachable from `from` in the chain graph given by `succ`.
fn reaches(from: u32, to: u32, succ: impl Fn(u32) -> Option<Vec<u32>>) -> bool {
    let mut seen = hashbrown::HashSet::new();
    let mut work = vec![from];
    while let Some(c) = work.pop() {
        if c == to {
            return true;
        }
        if !seen.insert(c) {
            continue;
        }
        work.extend(succ(c).unwrap_or_default());
    }
    false
}

/// One generation of the compiled ruleset. Immutable once published (share it
/// as `Arc<Classifier>`); `clone()` is shallow and an update on the clone
/// copies only what it writes:
///
/// ```
/// # use std::sync::Arc;
/// # use sluice_classify::*;
/// let prog = gen::seed001_shape(1000);
/// let published = Arc::new(Classifier::compile(&prog).unwrap());
/// let mut next = (*published).clone();
/// next.delete_rule(ChainId(0), RuleId(5)).unwrap();
/// let published = Arc::new(next); // swap in, e.g. with arc-swap
/// # let _ = published;
/// ```
#[derive(Clone, Debug)]
pub struct Classifier {
    chains: ChunkVec<Arc<CChain>>,
}

impl Default for Classifier {
    fn default() -> Self {
        Self::new()
    }
}

impl Classifier {
    /// An empty program.
    pub fn new() -> Self {
        Classifier {
            chains: ChunkVec::new(),
        }
    }

    /// Compiles a whole program (chain `n` becomes `ChainId(n)`).
    ///
    /// Fails exactly as inserting every rule with [`Placement::Back`], chain
    /// by chain, would; the tables are then bulk-built in one pass.
    pub fn compile(prog: &Program) -> Result<Self, UpdateError> {
        Self::compile_keyed(prog, None)
    }

    /// [`Classifier::compile`] with every chain's L4-class keying forced on
    /// or off (`None`: decided by the rules, as `compile` does); for tests
    /// that must cover both forms whatever rules they draw.
    #[doc(hidden)]
    pub fn compile_keyed(prog: &Program, class_keys: Option<bool>) -> Result<Self, UpdateError> {
        let kind = |t: ChainId| prog.chains.get(t.0 as usize).map(|c| c.kind);
        let mut edges: Vec<BTreeMap<u32, u32>> = vec![BTreeMap::new(); prog.chains.len()];
        for (ci, ch) in prog.chains.iter().enumerate() {
            let mut ids = hashbrown::HashSet::with_capacity(ch.rules.len());
            for r in &ch.rules {
                let target = match r.verdict {
                    Some(Verdict::Jump(t) | Verdict::Goto(t)) => Some(t),
                    _ => None,
                };
                if let Some(t) = target {
                    if kind(t) != Some(ChainKind::Regular) {
                        return Err(UpdateError::BadTarget(r.id));
                    }
                    let succ = |c: u32| edges.get(c as usize).map(|e| e.keys().copied().collect());
                    if reaches(t.0, ci as u32, succ) {
                        return Err(UpdateError::Loop(r.id));
                    }
                }
                if !ids.insert(r.id) {
                    return Err(UpdateError::DuplicateRule(r.id));
                }
                if let (Some(t), Some(e)) = (target, edges.get_mut(ci)) {
                    *e.entry(t.0).or_insert(0) += 1;
                }
            }
        }
        let mut c = Classifier::new();
        for ch in &prog.chains {
            c.chains.push(Arc::new(CChain::build(
                &ch.name, ch.kind, &ch.rules, class_keys,
            )));
        }
        Ok(c)
    }

    /// Adds an empty chain.
    pub fn add_chain(&mut self, name: &str, kind: ChainKind) -> ChainId {
        ChainId(self.chains.push(Arc::new(CChain::new(name, kind))) as u32)
    }

    /// Number of rules in a chain.
    pub fn chain_len(&self, chain: ChainId) -> Option<usize> {
        self.chains.get(chain.0 as usize).map(|c| c.len)
    }

    /// Name of a chain.
    pub fn chain_name(&self, chain: ChainId) -> Option<&str> {
        self.chains.get(chain.0 as usize).map(|c| &*c.name)
    }

    /// Number of tuples (hash tables) probed at most per lookup in a chain.
    pub fn tuple_count(&self, chain: ChainId) -> Option<usize> {
        self.chains.get(chain.0 as usize).map(|c| c.tuples.len())
    }

    /// Whether chain `from` reaches chain `to` through jumps/gotos.
    fn reaches(&self, from: u32, to: u32) -> bool {
        reaches(from, to, |c| {
            self.chains
                .get(c as usize)
                .map(|ch| ch.edges.keys().copied().collect())
        })
    }

    /// Inserts a rule; only the tuple shards holding its entries are copied.
    pub fn insert_rule(
        &mut self,
        chain: ChainId,
        at: Placement,
        rule: &Rule,
    ) -> Result<(), UpdateError> {
        if self.chains.get(chain.0 as usize).is_none() {
            return Err(UpdateError::UnknownChain(chain));
        }
        if let Some(Verdict::Jump(t) | Verdict::Goto(t)) = rule.verdict {
            match self.chains.get(t.0 as usize).map(|c| c.kind) {
                Some(ChainKind::Regular) => {}
                _ => return Err(UpdateError::BadTarget(rule.id)),
            }
            if self.reaches(t.0, chain.0) {
                return Err(UpdateError::Loop(rule.id));
            }
        }
        let c = self
            .chains
            .get_mut(chain.0 as usize)
            .ok_or(UpdateError::UnknownChain(chain))?;
        Arc::make_mut(c).insert(at, rule)
    }

    /// Deletes a rule by handle.
    pub fn delete_rule(&mut self, chain: ChainId, id: RuleId) -> Result<(), UpdateError> {
        let c = self
            .chains
            .get_mut(chain.0 as usize)
            .ok_or(UpdateError::UnknownChain(chain))?;
        Arc::make_mut(c).delete(id)
    }

    /// The lowest-positioned rule of `chain` at or after `start` that matches.
    #[inline(always)]
    fn first_match(
        &self,
        chain: ChainId,
        p: &PacketFields,
        start: u64,
        heads: &mut Vec<Head>,
    ) -> Option<(u64, &Ent)> {
        self.chains
            .get(chain.0 as usize)?
            .first_match(p, start, heads)
    }

    /// Evaluates `pkt` from base chain `base`; same result and trace as
    /// [`crate::eval_linear`] on the program this generation was built from.
    pub fn eval(&self, base: ChainId, pkt: &PacketFields, s: &mut Scratch) -> Outcome {
        self.eval_from(base, pkt, s, None)
    }

    /// Evaluates every packet of `pkts` from base chain `base`, calling
    /// `f(index, outcome, trace)` for each, in order; every outcome and trace
    /// is the one [`Classifier::eval`] gives.
    ///
    /// Packets are taken in groups of [`BATCH`]: the group is hashed first
    /// and the summary slots of all its packets prefetched, then the bounds
    /// are read and the first entry of every candidate slot prefetched, and
    /// only then is each packet resolved, so the cache misses of a group
    /// overlap instead of forming one dependent chain per packet. Only the
    /// first lookup of each packet (base chain, from its first rule) is
    /// staged; lookups after a non-terminal rule or a jump run as in `eval`.
    pub fn eval_batch(
        &self,
        base: ChainId,
        pkts: &[PacketFields],
        s: &mut Scratch,
        mut f: impl FnMut(usize, Outcome, &[RuleId]),
    ) {
        let chain = match self.chains.get(base.0 as usize) {
            Some(c) if matches!(c.kind, ChainKind::Base(_)) => c,
            _ => {
                for (i, p) in pkts.iter().enumerate() {
                    let o = self.eval(base, p, s);
                    f(i, o, &s.trace);
                }
                return;
            }
        };
        let nt = chain.tuples.len();
        let need = BATCH * nt;
        if s.tags.len() < need {
            s.tags.resize(need, 0);
            s.bheads.resize(need, Head::default());
        }
        let mut spans = [(0usize, 0usize); BATCH];
        for (g, group) in pkts.chunks(BATCH).enumerate() {
            for (i, p) in group.iter().enumerate() {
                if let Some(t) = s.tags.get_mut(i * nt..(i + 1) * nt) {
                    chain.stage_tags(p, t);
                }
            }
            for (i, span) in spans.iter_mut().enumerate().take(group.len()) {
                let r = i * nt..(i + 1) * nt;
                if let (Some(t), Some(h)) = (s.tags.get(r.clone()), s.bheads.get_mut(r)) {
                    *span = (i * nt, chain.stage_heads(t, h));
                }
            }
            for (i, (p, span)) in group.iter().zip(spans.iter()).enumerate() {
                let o = self.eval_from(base, p, s, Some(*span));
                f(g * BATCH + i, o, &s.trace);
            }
        }
    }

    /// [`Classifier::eval`]; with `pre`, the first lookup resolves the
    /// staged heads `s.bheads[pre.0..pre.0 + pre.1]` of the base chain
    /// (built for this packet from its first rule) instead of hashing.
    #[inline(always)]
    fn eval_from(
        &self,
        base: ChainId,
        pkt: &PacketFields,
        s: &mut Scratch,
        mut pre: Option<(usize, usize)>,
    ) -> Outcome {
        // The packet as statements left it: copied only when a rule with
        // statements runs (a copy per lookup cost ~50 instructions).
        let mut own: Option<PacketFields> = None;
        s.trace.clear();
        s.counted.clear();
        s.stack.clear();
        let out = |v: Final, rule: Option<RuleId>, p: &PacketFields| Outcome {
            verdict: v,
            rule,
            mark: p.mark,
            ct_mark: p.ct_mark,
            ct_state: p.ct_state,
        };
        let policy = match self.chains.get(base.0 as usize).map(|c| c.kind) {
            Some(ChainKind::Base(pol)) => pol,
            _ => return out(Final::Error(EvalError::UnknownChain), None, pkt),
        };
        let mut chain = base;
        let mut start = 0u64;
        let mut entries = 0u32;
        loop {
            let p = own.as_ref().unwrap_or(pkt);
            let m = match pre.take() {
                Some((a, n)) => {
                    let hs = s.bheads.get(a..a + n).unwrap_or_default();
                    self.chains
                        .get(base.0 as usize)
                        .and_then(|c| c.resolve(p, 0, hs))
                }
                None => self.first_match(chain, p, start, &mut s.heads),
            };
            let Some((pos, e)) = m else {
                match s.stack.pop() {
                    Some((c, i)) => {
                        chain = c;
                        start = i;
                        continue;
                    }
                    None => return out(policy.into(), None, p),
                }
            };
            start = pos + 1;
            // A rule without statements that accepts or drops: decided from
            // the entry (no read of the rule, a likely cache miss).
            if e.lean.flags & (F_ACCEPT | F_DROP) != 0 {
                s.trace.push(e.id);
                let v = if e.lean.flags & F_ACCEPT != 0 {
                    Final::Accept
                } else {
                    Final::Drop
                };
                return out(v, Some(e.id), p);
            }
            // The entry's rule, in the chain the lookup ran in (a slot the
            // entry names always holds it; an inconsistent generation would
            // be an error, not a panic).
            let Some(r) = self
                .chains
                .get(chain.0 as usize)
                .and_then(|c| c.rule_at(e.slot))
            else {
                return out(Final::Error(EvalError::UnknownChain), Some(e.id), p);
            };
            let mut reached = 0;
            let pm = own.get_or_insert(*pkt);
            if !run_stmts(&r.stmts, pm, s.limit.as_ref(), &mut reached) {
                if reached != 0 {
                    s.counted.push((r.id, reached));
                }
                continue;
            }
            s.trace.push(r.id);
            let p = own.as_ref().unwrap_or(pkt);
            match r.verdict {
                None => {}
                Some(Verdict::Accept) => return out(Final::Accept, Some(r.id), p),
                Some(Verdict::Drop) => return out(Final::Drop, Some(r.id), p),
                Some(Verdict::Reject(k)) => return out(Final::Reject(k), Some(r.id), p),
                Some(Verdict::Nat(n)) => return out(Final::Nat(n), Some(r.id), p),
                Some(Verdict::Return) => match s.stack.pop() {
                    Some((c, i)) => {
                        chain = c;
                        start = i;
                    }
                    None => return out(policy.into(), None, p),
                },
                Some(v @ (Verdict::Jump(t) | Verdict::Goto(t))) => {
                    entries += 1;
                    if entries > MAX_CHAIN_ENTRIES {
                        return out(Final::Error(EvalError::ChainLimit), Some(r.id), p);
                    }
                    if matches!(v, Verdict::Jump(_)) {
                        if s.stack.len() >= MAX_DEPTH {
                            return out(Final::Error(EvalError::DepthExceeded), Some(r.id), p);
                        }
                        s.stack.push((chain, start));
                    }
                    match self.chains.get(t.0 as usize).map(|c| c.kind) {
                        Some(ChainKind::Regular) => {}
                        _ => return out(Final::Error(EvalError::UnknownChain), Some(r.id), p),
                    }
                    chain = t;
                    start = 0;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The id index of a bulk-built chain stores only its id range; later
    /// inserts and deletes, of ids inside the range or not, are exact.
    #[test]
    fn id_index_of_consecutive_ids_tracks_changes() {
        let r = |id| Rule {
            id: RuleId(id),
            matches: Vec::new(),
            stmts: Vec::new(),
            verdict: None,
        };
        let mut m = IdIndex::of(&[r(10), r(11), r(12)]);
        assert_eq!(m.changed.len, 0);
        assert_eq!(
            (m.get(RuleId(9)), m.get(RuleId(10)), m.get(RuleId(12))),
            (None, Some(0), Some(2))
        );
        assert_eq!(m.get(RuleId(13)), None);
        assert_eq!(m.remove(RuleId(11)), Some(1));
        assert_eq!((m.get(RuleId(11)), m.remove(RuleId(11))), (None, None));
        m.insert(RuleId(13), 1);
        m.insert(RuleId(11), 3);
        assert_eq!((m.get(RuleId(11)), m.get(RuleId(13))), (Some(3), Some(1)));
        assert_eq!(m.remove(RuleId(13)), Some(1));
        assert_eq!(m.get(RuleId(13)), None);
        let g = IdIndex::of(&[r(5), r(7)]);
        assert_eq!(
            (g.get(RuleId(5)), g.get(RuleId(6)), g.get(RuleId(7))),
            (Some(0), None, Some(1))
        );
    }

    #[test]
    fn dim_of_inverts_dim_fields() {
        for (d, f) in DIM_FIELDS.iter().enumerate() {
            assert_eq!(dim_of(*f), Some(d));
        }
        assert_eq!(dim_of(Field::TcpFlags), None);
    }
    use crate::ir::*;

    #[test]
    fn prefix_cover_of_port_range() {
        let mut v = Vec::new();
        prefixes(Range::new(1024, 65535), 16, 64, |x, l| {
            v.push((x, l));
            true
        });
        assert_eq!(
            v,
            vec![
                (1024, 6),
                (2048, 5),
                (4096, 4),
                (8192, 3),
                (16384, 2),
                (32768, 1)
            ]
        );
        let mut v = Vec::new();
        prefixes(Range::new(0, u128::MAX), 128, 64, |x, l| {
            v.push((x, l));
            true
        });
        assert_eq!(v, vec![(0, 0)]);
    }

    /// The step-by-step search `prefixes` used before its block size was
    /// computed in constant time: the reference it must equal.
    fn prefixes_reference(r: Range, width: u32, cap: usize) -> (bool, Vec<(u128, u32)>) {
        let (mut lo, hi) = (r.lo, r.hi);
        let span = |s: u32| u128::MAX.checked_shr(128 - s).unwrap_or(0);
        let mut out = Vec::new();
        loop {
            let mut s = if lo == 0 {
                width
            } else {
                lo.trailing_zeros().min(width)
            };
            while s > 0 && lo.checked_add(span(s)).is_none_or(|e| e > hi) {
                s -= 1;
            }
            out.push((lo, width - s));
            let end = lo + span(s);
            if end >= hi {
                return (true, out);
            }
            if out.len() >= cap {
                return (false, out);
            }
            lo = end + 1;
        }
    }

    proptest::proptest! {
        #[test]
        fn prefix_cover_equals_the_stepwise_search(
            width in proptest::sample::select(vec![8u32, 16, 32, 128]),
            a in proptest::prelude::any::<u128>(),
            b in proptest::prelude::any::<u128>(),
            small in proptest::prelude::any::<bool>(),
            cap in 1usize..80,
        ) {
            let max = u128::MAX.checked_shr(128 - width).unwrap_or(0);
            let (mut lo, mut hi) = (a & max, b & max);
            if small {
                hi = lo.saturating_add(b % 5000).min(max);
            }
            if lo > hi {
                std::mem::swap(&mut lo, &mut hi);
            }
            let r = Range::new(lo, hi);
            let mut got = Vec::new();
            let ok = prefixes(r, width, cap, |x, l| {
                got.push((x, l));
                true
            });
            proptest::prop_assert_eq!((ok, got), prefixes_reference(r, width, cap));
        }
    }

    #[test]
    fn small_ranges_are_enumerated_wide_ones_are_wildcard() {
        assert_eq!(
            expand_dim(4, &[Range::new(22, 23)]),
            Some(vec![(22, 1), (23, 1)])
        );
        assert_eq!(expand_dim(4, &[Range::new(1024, 65535)]), None);
        // IPv4 prefixes round down to /24, /16 or /8; shorter ones are not indexed.
        let a = Range::v4_cidr(0x0a01_0230, 28);
        assert_eq!(expand_dim(0, &[a]), Some(vec![(map_v4(0x0a01_0200), 5)]));
        let a = Range::v4_cidr(0x0a01_0000, 20);
        assert_eq!(expand_dim(0, &[a]), Some(vec![(map_v4(0x0a01_0000), 4)]));
        let a = Range::v4_cidr(0x0a00_0000, 8);
        assert_eq!(expand_dim(0, &[a]), Some(vec![(map_v4(0x0a00_0000), 3)]));
        assert_eq!(expand_dim(0, &[Range::v4_cidr(0x0a00_0000, 7)]), None);
        // IPv6 prefixes round down to /64 or /32.
        let v6 = Range::prefix(0x2001_0db8_0001_0002_u128 << 64, 80, 128);
        assert_eq!(
            expand_dim(1, &[v6]),
            Some(vec![(0x2001_0db8_0001_0002_u128 << 64, 2)])
        );
    }

    #[test]
    fn relabel_keeps_order_under_repeated_front_inserts() {
        let mut c = Classifier::new();
        let ch = c.add_chain("in", ChainKind::Base(Policy::Drop));
        for i in 0..200u16 {
            let r = Rule {
                id: RuleId(i as u64),
                matches: vec![Match::eq(Field::Dport, 1000 + i as u128)],
                stmts: vec![],
                verdict: Some(Verdict::Accept),
            };
            // Always right after rule 0: exhausts the gap and forces relabels.
            let at = if i == 0 {
                Placement::Back
            } else {
                Placement::After(RuleId(0))
            };
            c.insert_rule(ch, at, &r).unwrap();
        }
        let mut s = Scratch::new();
        for i in 0..200u16 {
            let p = PacketFields {
                dport: 1000 + i,
                ..Default::default()
            };
            assert_eq!(c.eval(ch, &p, &mut s).rule, Some(RuleId(i as u64)));
        }
        // Order: 0, 199, 198, …, 1 — a catch-all placed after 0 wins over all but 0.
        let all = Rule {
            id: RuleId(999),
            matches: vec![],
            stmts: vec![],
            verdict: Some(Verdict::Drop),
        };
        c.insert_rule(ch, Placement::After(RuleId(0)), &all)
            .unwrap();
        let p = PacketFields {
            dport: 1005,
            ..Default::default()
        };
        assert_eq!(c.eval(ch, &p, &mut s).rule, Some(RuleId(999)));
    }

    #[test]
    fn entries_decide_only_statement_free_accept_and_drop() {
        use crate::ir::{Chain, Program, RejectKind};
        let r = |id: u64, port: u128, stmts: Vec<Stmt>, v| Rule {
            id: RuleId(id),
            matches: vec![Match::eq(Field::Dport, port)],
            stmts,
            verdict: v,
        };
        let prog = Program {
            chains: vec![
                Chain {
                    name: "in".into(),
                    kind: ChainKind::Base(Policy::Accept),
                    rules: vec![
                        r(1, 1, vec![], Some(Verdict::Accept)),
                        r(2, 2, vec![], Some(Verdict::Drop)),
                        r(3, 3, vec![Stmt::Counter], Some(Verdict::Drop)),
                        r(4, 4, vec![], Some(Verdict::Reject(RejectKind::TcpReset))),
                        r(5, 5, vec![], Some(Verdict::Jump(ChainId(1)))),
                        r(6, 6, vec![], None),
                        r(7, 6, vec![], Some(Verdict::Drop)),
                    ],
                },
                Chain {
                    name: "sub".into(),
                    kind: ChainKind::Regular,
                    rules: vec![r(8, 5, vec![], Some(Verdict::Drop))],
                },
            ],
        };
        let c = Classifier::compile(&prog).unwrap();
        let ch = c.chains.get(0).unwrap();
        let flags = |id: u64| {
            let mut f = None;
            for t in &ch.tuples {
                for sl in 0..=t.mask {
                    for e in t.list(sl) {
                        if e.id == RuleId(id) {
                            assert_eq!(Some(e.id), ch.rule_at(e.slot).map(|r| r.id));
                            f = Some(e.lean.flags & (F_ACCEPT | F_DROP));
                        }
                    }
                }
            }
            f.unwrap()
        };
        assert_eq!(flags(1), F_ACCEPT);
        assert_eq!(flags(2), F_DROP);
        for id in 3..=7 {
            assert_eq!(flags(id), if id == 7 { F_DROP } else { 0 }, "rule {id}");
        }
        let (mut s1, mut s2) = (Scratch::new(), Scratch::new());
        for port in 0..8u16 {
            let p = PacketFields {
                dport: port,
                ..Default::default()
            };
            let want = crate::eval_linear(&prog, ChainId(0), &p, &mut s1);
            assert_eq!(c.eval(ChainId(0), &p, &mut s2), want, "port {port}");
            assert_eq!(s1.trace, s2.trace, "port {port}");
        }
    }

    #[test]
    fn tables_grow_to_load_at_most_one_half_and_stay_exact() {
        use crate::ir::Chain;
        let prog = crate::gen::classbench(3000, 11);
        let rules = &prog.chains[0].rules;
        let mut c = Classifier::new();
        let ch = c.add_chain("forward", ChainKind::Base(Policy::Drop));
        // One at a time, so every table grows (and rehashes) from empty.
        for r in rules {
            c.insert_rule(ch, Placement::Back, r).unwrap();
        }
        let chain = c.chains.get(0).unwrap();
        for t in &chain.tuples {
            assert!(
                2 * t.entries <= t.mask + 1,
                "{} entries, {} slots",
                t.entries,
                t.mask + 1
            );
            let n: usize = (0..=t.mask).map(|sl| t.list(sl).len()).sum();
            assert_eq!(n, t.entries);
            for sl in 0..=t.mask {
                assert_eq!(t.sums.get(sl).copied(), Some(summary(t.list(sl))));
            }
        }
        let linear = Program {
            chains: vec![Chain {
                name: "forward".into(),
                kind: ChainKind::Base(Policy::Drop),
                rules: rules.clone(),
            }],
        };
        let pkts = crate::gen::classbench_packets(&linear, 2000, 12);
        let (mut s1, mut s2) = (Scratch::new(), Scratch::new());
        for p in &pkts {
            assert_eq!(
                c.eval(ch, p, &mut s2),
                crate::eval_linear(&linear, ChainId(0), p, &mut s1)
            );
        }
    }

    #[test]
    fn loops_and_bad_targets_are_rejected() {
        let mut c = Classifier::new();
        let base = c.add_chain("in", ChainKind::Base(Policy::Accept));
        let a = c.add_chain("a", ChainKind::Regular);
        let b = c.add_chain("b", ChainKind::Regular);
        let r = |id, v| Rule {
            id: RuleId(id),
            matches: vec![],
            stmts: vec![],
            verdict: Some(v),
        };
        c.insert_rule(a, Placement::Back, &r(1, Verdict::Jump(b)))
            .unwrap();
        assert_eq!(
            c.insert_rule(b, Placement::Back, &r(2, Verdict::Goto(a))),
            Err(UpdateError::Loop(RuleId(2)))
        );
        assert_eq!(
            c.insert_rule(a, Placement::Back, &r(3, Verdict::Jump(base))),
            Err(UpdateError::BadTarget(RuleId(3)))
        );
        assert_eq!(
            c.insert_rule(a, Placement::Back, &r(1, Verdict::Accept)),
            Err(UpdateError::DuplicateRule(RuleId(1)))
        );
    }
}

#[cfg(test)]
mod stats {
    use super::*;
    use crate::bench::Shape;

    /// Per-lookup averages (single lookups from the first rule).
    /// `cargo test --release -p sluice-classify lookup_stats -- --ignored --nocapture`
    #[test]
    #[ignore]
    fn lookup_stats() {
        for shape in [Shape::Seed001, Shape::ClassBench] {
            for n in [20usize, 100, 1_000, 10_000, 100_000] {
                let (prog, pkts) = shape.build(n, 4096);
                let c = Classifier::compile(&prog).unwrap();
                let ch = c.chains.get(0).unwrap();
                let (mut heads_n, mut visited, mut scanned, mut tagok, mut full, mut empty_b) =
                    (0usize, 0usize, 0usize, 0usize, 0usize, 0usize);
                let mut heads = Vec::new();
                let mut ents = 0usize;
                let mut slots = 0usize;
                let mut maxlist = 0usize;
                let mut fail = [0usize; 5];
                let mut probed = 0usize;
                for t in &ch.tuples {
                    ents += t.entries;
                    slots += t.mask + 1;
                    for s in 0..=t.mask {
                        maxlist = maxlist.max(t.list(s).len());
                    }
                }
                for p in &pkts {
                    let lh = ch.lane_hashes(p);
                    heads.clear();
                    for (ti, t) in ch.tuples.iter().enumerate() {
                        let tag = tag_of(t.fingerprint(&lh));
                        let b = t.bound(t.slot(tag), tag);
                        if b != EMPTY {
                            heads.push(Head {
                                bound: b,
                                tag,
                                tuple: ti as u32,
                            });
                        } else {
                            empty_b += 1;
                        }
                    }
                    heads_n += heads.len();
                    let bestpos = ch
                        .first_match(p, 0, &mut Vec::new())
                        .map_or(u64::MAX, |x| x.0);
                    probed += ch.tuples.iter().filter(|t| t.min_pos < bestpos).count();
                    heads.sort_by_key(|h| h.bound);
                    let k = LeanKey::of(p);
                    let mut best = u64::MAX;
                    for hd in &heads {
                        if u64::from(hd.bound) << 32 >= best {
                            break;
                        }
                        visited += 1;
                        let t = &ch.tuples[hd.tuple as usize];
                        for e in t.list(t.slot(hd.tag)) {
                            if e.pos >= best {
                                break;
                            }
                            scanned += 1;
                            if e.tag == hd.tag {
                                tagok += 1;
                                if e.lean.holds(&k) && e.lean.flags & F_FULL != 0 {
                                    full += 1;
                                }
                                let l = &e.lean;
                                let r = [
                                    !((l.flags & F_SANY != 0)
                                        | (k.s_v4 & (l.saddr[0] <= k.s4) & (k.s4 <= l.saddr[1]))),
                                    !((l.flags & F_DANY != 0)
                                        | (k.d_v4 & (l.daddr[0] <= k.d4) & (k.d4 <= l.daddr[1]))),
                                    !((l.proto[0] <= k.proto) & (k.proto <= l.proto[1])),
                                    !((l.sport[0] <= k.sport) & (k.sport <= l.sport[1])),
                                    !((l.dport[0] <= k.dport) & (k.dport <= l.dport[1])),
                                ];
                                for (f, x) in fail.iter_mut().zip(r) {
                                    *f += x as usize;
                                }
                                if e.matches(&k, p, ch) {
                                    best = e.pos;
                                    break;
                                }
                            }
                        }
                    }
                }
                let f = pkts.len() as f64;
                println!(
                    "{:<10} {n:>6} tuples {:>2} lanes {:>2} ents {:>7} slots {:>7} maxlist {:>3} | heads {:.2} empty {:.2} visited {:.2} scanned {:.2} tagok {:.2} full {:.2}",
                    shape.name(), ch.tuples.len(), ch.lanes.len(), ents, slots, maxlist,
                    heads_n as f64 / f, empty_b as f64 / f, visited as f64 / f, scanned as f64 / f, tagok as f64 / f, full as f64 / f
                );
                println!(
                    "   fail s/d/proto/sport/dport {:?} probed {:.2}",
                    fail.map(|x| x as f64 / f),
                    probed as f64 / f
                );
                if n >= 10_000 {
                    for t in &ch.tuples {
                        println!(
                            "     sig {:?} ents {} min {} max {}",
                            t.sig,
                            t.entries,
                            t.min_pos / GAP,
                            t.max_pos / GAP
                        );
                    }
                }
            }
        }
    }
}
