//! Protocol state machines with netfilter semantics.
//!
//! * TCP follows `nf_conntrack_proto_tcp.c`: the state is driven by the
//!   packet's flag class (SYN, SYN/ACK, FIN, ACK, RST, none) and direction
//!   through the same transition table, including SYN_SENT2 (simultaneous
//!   open), "ignore" transitions, reopening from TIME_WAIT/CLOSE and killing a
//!   connection whose only answer is a RST. Sequence-number window tracking is
//!   not modelled (it would cost ~40 B per entry).
//! * UDP: unreplied -> replied -> stream. A packet seen after the reply makes
//!   the flow a stream and assures it (classic netfilter `udp_packet`).
//! * ICMP / ICMPv6 queries are keyed by identifier; any packet refreshes.
//! * Anything else uses the generic tracker. ICMP and generic entries are
//!   never assured, as in netfilter.

use crate::time::TimeoutKind;
use crate::Dir;

/// TCP header flags (byte 13 of the header).
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct TcpFlags(pub u8);

impl TcpFlags {
    /// FIN.
    pub const FIN: u8 = 0x01;
    /// SYN.
    pub const SYN: u8 = 0x02;
    /// RST.
    pub const RST: u8 = 0x04;
    /// PSH.
    pub const PSH: u8 = 0x08;
    /// ACK.
    pub const ACK: u8 = 0x10;
    /// URG.
    pub const URG: u8 = 0x20;

    fn has(self, f: u8) -> bool {
        self.0 & f != 0
    }

    /// The flag combinations netfilter accepts (`tcp_valid_flags`); PSH, ECE
    /// and CWR are ignored. Anything else (SYN+FIN, SYN+RST, no flags, ...)
    /// is invalid.
    pub fn is_valid_combination(self) -> bool {
        const S: u8 = TcpFlags::SYN;
        const A: u8 = TcpFlags::ACK;
        const F: u8 = TcpFlags::FIN;
        const R: u8 = TcpFlags::RST;
        const U: u8 = TcpFlags::URG;
        matches!(
            self.0 & (S | A | F | R | U),
            S | 0x22 | 0x12 | R | 0x14 | 0x11 | 0x31 | A | 0x30
        )
    }

    /// netfilter's `get_conntrack_index`.
    fn class(self) -> usize {
        if self.has(Self::RST) {
            C_RST
        } else if self.has(Self::SYN) {
            if self.has(Self::ACK) {
                C_SYNACK
            } else {
                C_SYN
            }
        } else if self.has(Self::FIN) {
            C_FIN
        } else if self.has(Self::ACK) {
            C_ACK
        } else {
            C_NONE
        }
    }
}

const C_SYN: usize = 0;
const C_SYNACK: usize = 1;
const C_FIN: usize = 2;
const C_ACK: usize = 3;
const C_RST: usize = 4;
const C_NONE: usize = 5;

/// TCP connection states (`enum tcp_conntrack`).
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
#[repr(u8)]
pub enum TcpState {
    /// No packet tracked yet (netfilter `sNO`): a fresh entry before its
    /// first [`Table::track`](crate::Table::track).
    #[default]
    None = 0,
    /// SYN seen in the original direction.
    SynSent = 1,
    /// SYN/ACK seen in reply.
    SynRecv = 2,
    /// Handshake completed (or a mid-stream pickup).
    Established = 3,
    /// First FIN seen.
    FinWait = 4,
    /// FIN acknowledged.
    CloseWait = 5,
    /// FIN seen in both directions.
    LastAck = 6,
    /// Last ACK seen.
    TimeWait = 7,
    /// Reset.
    Close = 8,
    /// Simultaneous open: SYN seen in both directions.
    SynSent2 = 9,
}

impl TcpState {
    fn from_code(c: u8) -> Self {
        match c {
            1 => Self::SynSent,
            2 => Self::SynRecv,
            3 => Self::Established,
            4 => Self::FinWait,
            5 => Self::CloseWait,
            6 => Self::LastAck,
            7 => Self::TimeWait,
            8 => Self::Close,
            9 => Self::SynSent2,
            _ => Self::None,
        }
    }

    fn timeout(self) -> TimeoutKind {
        match self {
            Self::None | Self::SynSent => TimeoutKind::TcpSynSent,
            Self::SynSent2 => TimeoutKind::TcpSynSent2,
            Self::SynRecv => TimeoutKind::TcpSynRecv,
            Self::Established => TimeoutKind::TcpEstablished,
            Self::FinWait => TimeoutKind::TcpFinWait,
            Self::CloseWait => TimeoutKind::TcpCloseWait,
            Self::LastAck => TimeoutKind::TcpLastAck,
            Self::TimeWait => TimeoutKind::TcpTimeWait,
            Self::Close => TimeoutKind::TcpClose,
        }
    }

    /// netfilter's state name, as `conntrack -L` prints it.
    pub fn name(self) -> &'static str {
        match self {
            Self::None => "NONE",
            Self::SynSent => "SYN_SENT",
            Self::SynRecv => "SYN_RECV",
            Self::Established => "ESTABLISHED",
            Self::FinWait => "FIN_WAIT",
            Self::CloseWait => "CLOSE_WAIT",
            Self::LastAck => "LAST_ACK",
            Self::TimeWait => "TIME_WAIT",
            Self::Close => "CLOSE",
            Self::SynSent2 => "SYN_SENT2",
        }
    }
}

/// UDP flow states.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub enum UdpState {
    /// Only the original direction seen.
    #[default]
    Unreplied,
    /// A reply was seen; still on the short timeout and not assured.
    Replied,
    /// Traffic continued after the reply: assured, stream timeout.
    Stream,
}

/// [`ProtoState::pack`] of UDP's first state.
pub(crate) const PACKED_UDP: u8 = 10;

/// [`ProtoState::unpack`]'s table, by packed code.
const UNPACKED: [ProtoState; 16] = {
    use TcpState::*;
    [
        ProtoState::Tcp(None),
        ProtoState::Tcp(SynSent),
        ProtoState::Tcp(SynRecv),
        ProtoState::Tcp(Established),
        ProtoState::Tcp(FinWait),
        ProtoState::Tcp(CloseWait),
        ProtoState::Tcp(LastAck),
        ProtoState::Tcp(TimeWait),
        ProtoState::Tcp(Close),
        ProtoState::Tcp(SynSent2),
        ProtoState::Udp(UdpState::Unreplied),
        ProtoState::Udp(UdpState::Replied),
        ProtoState::Udp(UdpState::Stream),
        ProtoState::Icmp,
        ProtoState::Generic,
        ProtoState::Generic,
    ]
};

/// Protocol state of an entry.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub enum ProtoState {
    /// TCP.
    Tcp(TcpState),
    /// UDP.
    Udp(UdpState),
    /// ICMP or ICMPv6 query (echo, timestamp, ...).
    Icmp,
    /// Any other protocol.
    #[default]
    Generic,
}

impl ProtoState {
    /// Initial state of a fresh entry for IP protocol `proto`.
    pub fn initial(proto: u8) -> Self {
        use sluice_wire::flow::proto as p;
        match proto {
            p::TCP => Self::Tcp(TcpState::None),
            p::UDP => Self::Udp(UdpState::Unreplied),
            p::ICMP | p::ICMPV6 => Self::Icmp,
            _ => Self::Generic,
        }
    }

    /// The timeout a packet leaves this state with (what a refresh of an
    /// offloaded entry applies; UDP after a reply as netfilter's stream
    /// once assured).
    pub(crate) fn idle_timeout(self, assured: bool) -> TimeoutKind {
        match self {
            Self::Udp(UdpState::Stream) => TimeoutKind::UdpStream,
            Self::Udp(_) if assured => TimeoutKind::UdpStream,
            other => other.initial_timeout(),
        }
    }

    pub(crate) fn initial_timeout(self) -> TimeoutKind {
        match self {
            Self::Tcp(s) => s.timeout(),
            Self::Udp(_) => TimeoutKind::Udp,
            Self::Icmp => TimeoutKind::Icmp,
            Self::Generic => TimeoutKind::Generic,
        }
    }

    /// The state in one byte, as an entry stores it: TCP's netfilter
    /// state code (0-9), UDP 10-12, ICMP 13, anything else 14.
    /// [`Self::unpack`] reads it.
    #[inline]
    pub(crate) const fn pack(self) -> u8 {
        match self {
            Self::Tcp(s) => s as u8,
            Self::Udp(UdpState::Unreplied) => PACKED_UDP,
            Self::Udp(UdpState::Replied) => PACKED_UDP + 1,
            Self::Udp(UdpState::Stream) => PACKED_UDP + 2,
            Self::Icmp => PACKED_UDP + 3,
            Self::Generic => PACKED_UDP + 4,
        }
    }

    /// The state [`Self::pack`] gave `b` (anything out of range reads as
    /// generic): one load from a table.
    #[inline]
    pub(crate) fn unpack(b: u8) -> Self {
        UNPACKED[usize::from(b & 15)]
    }

    /// The state as a number within its protocol (a restart's state file):
    /// TCP's netfilter state code (0-9), UDP 0 unreplied, 1 replied, 2
    /// stream; 0 for ICMP and other protocols. [`Self::from_code`] reads it.
    pub fn code(self) -> u8 {
        match self {
            Self::Tcp(s) => s as u8,
            Self::Udp(UdpState::Unreplied) => 0,
            Self::Udp(UdpState::Replied) => 1,
            Self::Udp(UdpState::Stream) => 2,
            Self::Icmp | Self::Generic => 0,
        }
    }

    /// The state of IP protocol `proto` that [`Self::code`] gave `code`;
    /// `None` for a code that protocol has no state for.
    pub fn from_code(proto: u8, code: u8) -> Option<Self> {
        match (Self::initial(proto), code) {
            (Self::Tcp(_), 0..=9) => Some(Self::Tcp(TcpState::from_code(code))),
            (Self::Udp(_), 0) => Some(Self::Udp(UdpState::Unreplied)),
            (Self::Udp(_), 1) => Some(Self::Udp(UdpState::Replied)),
            (Self::Udp(_), 2) => Some(Self::Udp(UdpState::Stream)),
            (s @ (Self::Icmp | Self::Generic), 0) => Some(s),
            _ => None,
        }
    }

    /// Human-readable name (`conntrack list`).
    pub fn name(self) -> &'static str {
        match self {
            Self::Tcp(s) => s.name(),
            Self::Udp(UdpState::Unreplied) => "UNREPLIED",
            Self::Udp(UdpState::Replied) => "REPLIED",
            Self::Udp(UdpState::Stream) => "STREAM",
            Self::Icmp | Self::Generic => "",
        }
    }
}

/// What the worker learned about the L4 header of a packet.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum L4Event {
    /// A TCP segment with these flags.
    Tcp(TcpFlags),
    /// A UDP datagram.
    Udp,
    /// An ICMP/ICMPv6 query message; `request` is true for echo request,
    /// timestamp request and the like (see [`icmp_is_query_request`]).
    Icmp {
        /// True for a request, false for a reply.
        request: bool,
    },
    /// Any other protocol.
    Other,
}

/// True for the ICMP query types that may create an entry: echo (v4 8 /
/// v6 128), timestamp (13), information (15) and address mask (17) requests.
pub fn icmp_is_query_request(v6: bool, icmp_type: u8) -> bool {
    if v6 {
        icmp_type == 128
    } else {
        matches!(icmp_type, 8 | 13 | 15 | 17)
    }
}

/// Connection-tracking state of a packet, as `ct state` matches it.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[repr(u8)]
pub enum CtState {
    /// First packet of a connection, or an original-direction packet before
    /// any reply was seen.
    New = 0,
    /// Part of a connection that has seen traffic in both directions (or any
    /// reply-direction packet).
    Established = 1,
    /// An ICMP error or expectation related to a tracked connection. The
    /// engine decides this (it parses the embedded header); conntrack never
    /// returns it.
    Related = 2,
    /// The packet does not fit the tracked state.
    Invalid = 3,
}

impl CtState {
    /// The keyword nft uses.
    pub fn name(self) -> &'static str {
        match self {
            Self::New => "new",
            Self::Established => "established",
            Self::Related => "related",
            Self::Invalid => "invalid",
        }
    }
}

/// Outcome of [`Table::track`](crate::Table::track).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Verdict {
    /// The packet fits; state and expiry were updated.
    Valid,
    /// Accept the packet but leave state and expiry alone (netfilter `sIG`,
    /// e.g. a retransmitted SYN/ACK).
    Ignored,
    /// The packet does not fit the state (netfilter `sIV`); nothing changed.
    Invalid,
    /// Accept the packet; the connection is over (a RST before any reply):
    /// the caller should remove the entry now.
    Close,
    /// A SYN reopens a connection in TIME_WAIT or CLOSE (RFC 1122 4.2.2.13):
    /// the caller should remove the entry and handle the packet as new.
    Reopen,
    /// The entry had already expired (GC has not reached it yet): the caller
    /// should remove it and handle the packet as new.
    Expired,
}

impl Verdict {
    /// True when the caller must remove the entry.
    pub fn must_remove(self) -> bool {
        matches!(self, Self::Close | Self::Reopen | Self::Expired)
    }
}

/// Result of tracking one packet.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Tracked {
    /// What to do with the packet and the entry.
    pub verdict: Verdict,
    /// The entry's protocol state after the packet.
    pub state: ProtoState,
    /// The packet's `ct state`.
    pub ct: CtState,
}

/// The pure result of one state-machine step.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) struct Step {
    pub verdict: Verdict,
    pub state: ProtoState,
    pub assured: bool,
    /// New timeout, when the expiry is to be refreshed.
    pub timeout: Option<TimeoutKind>,
    /// Use at most the `tcp_unacknowledged` timeout.
    pub cap_unack: bool,
}

/// May this packet create an entry? (netfilter's per-protocol `new()`.)
/// TCP: a SYN does; with `tcp_loose` a pure ACK picks up a connection
/// mid-stream; FIN, RST, SYN/ACK and invalid flag combinations never do.
/// UDP and other protocols: yes. ICMP: only query requests.
pub fn may_create(ev: L4Event, tcp_loose: bool) -> bool {
    match ev {
        L4Event::Tcp(f) => {
            f.is_valid_combination()
                && match f.class() {
                    C_SYN => true,
                    C_ACK => tcp_loose,
                    _ => false,
                }
        }
        L4Event::Udp | L4Event::Other => true,
        L4Event::Icmp { request } => request,
    }
}

// Transition table codes: 0..=9 are `TcpState` discriminants (0 = sNO).
const SS: u8 = 1;
const SR: u8 = 2;
const ES: u8 = 3;
const FW: u8 = 4;
const CW: u8 = 5;
const LA: u8 = 6;
const TW: u8 = 7;
const CL: u8 = 8;
const S2: u8 = 9;
const IV: u8 = 10;
const IG: u8 = 11;

/// `tcp_conntracks[dir][flag class][old state]` from nf_conntrack_proto_tcp.c.
/// Columns: sNO, sSS, sSR, sES, sFW, sCW, sLA, sTW, sCL, sS2.
#[rustfmt::skip]
const TCP_TABLE: [[[u8; 10]; 6]; 2] = [
    [
        /* syn    */ [SS, SS, IG, IG, IG, IG, IG, SS, SS, S2],
        /* synack */ [IV, IV, SR, IV, IV, IV, IV, IV, IV, SR],
        /* fin    */ [IV, IV, FW, FW, LA, LA, LA, TW, CL, IV],
        /* ack    */ [ES, IV, ES, ES, CW, CW, TW, TW, CL, IV],
        /* rst    */ [IV, CL, CL, CL, CL, CL, CL, CL, CL, CL],
        /* none   */ [IV, IV, IV, IV, IV, IV, IV, IV, IV, IV],
    ],
    [
        /* syn    */ [IV, S2, IV, IV, IV, IV, IV, SS, IV, S2],
        /* synack */ [IV, SR, IG, IG, IG, IG, IG, IG, IG, SR],
        /* fin    */ [IV, IV, FW, FW, LA, LA, LA, TW, CL, IV],
        /* ack    */ [IV, IG, SR, ES, CW, CW, TW, TW, CL, IG],
        /* rst    */ [IV, CL, CL, CL, CL, CL, CL, CL, CL, CL],
        /* none   */ [IV, IV, IV, IV, IV, IV, IV, IV, IV, IV],
    ],
];

fn unchanged(verdict: Verdict, state: ProtoState, assured: bool) -> Step {
    Step {
        verdict,
        state,
        assured,
        timeout: None,
        cap_unack: false,
    }
}

/// One packet through the state machine of `state`. `seen_reply` and
/// `assured` are the entry's flags before this packet.
pub(crate) fn step(
    state: ProtoState,
    seen_reply: bool,
    assured: bool,
    dir: Dir,
    ev: L4Event,
) -> Step {
    match (state, ev) {
        (ProtoState::Tcp(old), L4Event::Tcp(flags)) => {
            tcp_step(old, seen_reply, assured, dir, flags)
        }
        (ProtoState::Udp(old), L4Event::Udp) => {
            let new = match (old, dir) {
                (UdpState::Unreplied, Dir::Original) => UdpState::Unreplied,
                (UdpState::Unreplied, Dir::Reply) => UdpState::Replied,
                (UdpState::Replied | UdpState::Stream, _) => UdpState::Stream,
            };
            let (assured, tmo) = match new {
                UdpState::Stream => (true, TimeoutKind::UdpStream),
                _ => (assured, TimeoutKind::Udp),
            };
            Step {
                verdict: Verdict::Valid,
                state: ProtoState::Udp(new),
                assured,
                timeout: Some(tmo),
                cap_unack: false,
            }
        }
        (ProtoState::Icmp, L4Event::Icmp { .. }) => Step {
            verdict: Verdict::Valid,
            state,
            assured,
            timeout: Some(TimeoutKind::Icmp),
            cap_unack: false,
        },
        (ProtoState::Generic, L4Event::Other) => Step {
            verdict: Verdict::Valid,
            state,
            assured,
            timeout: Some(TimeoutKind::Generic),
            cap_unack: false,
        },
        // The event does not belong to the entry's protocol.
        _ => unchanged(Verdict::Invalid, state, assured),
    }
}

fn tcp_step(old: TcpState, seen_reply: bool, assured: bool, dir: Dir, flags: TcpFlags) -> Step {
    let cur = ProtoState::Tcp(old);
    if !flags.is_valid_combination() {
        return unchanged(Verdict::Invalid, cur, assured);
    }
    let class = flags.class();
    let code = TCP_TABLE[dir as usize][class][old as usize];
    match code {
        IV => return unchanged(Verdict::Invalid, cur, assured),
        IG => return unchanged(Verdict::Ignored, cur, assured),
        // RFC 1122 4.2.2.13: a new SYN may reopen a connection in TIME_WAIT;
        // netfilter also reopens from CLOSE. It deletes the entry and looks
        // the packet up again.
        SS if matches!(old, TcpState::TimeWait | TcpState::Close) => {
            return unchanged(Verdict::Reopen, cur, assured);
        }
        _ => {}
    }
    let new = TcpState::from_code(code);
    let state = ProtoState::Tcp(new);
    if class == C_RST && !seen_reply {
        // "If only reply is a RST, we can consider ourselves not to have an
        // established connection" (netfilter kills the entry at once).
        return Step {
            verdict: Verdict::Close,
            state,
            assured,
            timeout: Some(TimeoutKind::TcpClose),
            cap_unack: false,
        };
    }
    let assured = assured
        || (seen_reply
            && matches!(old, TcpState::SynRecv | TcpState::Established)
            && new == TcpState::Established);
    let tmo = if class == C_RST {
        TimeoutKind::TcpClose
    } else {
        new.timeout()
    };
    // Until assured, the timeout is capped by `tcp_unacknowledged`.
    Step {
        verdict: Verdict::Valid,
        state,
        assured,
        timeout: Some(tmo),
        cap_unack: !assured,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u8 = TcpFlags::SYN;
    const A: u8 = TcpFlags::ACK;
    const F: u8 = TcpFlags::FIN;
    const R: u8 = TcpFlags::RST;

    fn tcp(old: TcpState, dir: Dir, f: u8) -> (Verdict, TcpState) {
        let s = step(
            ProtoState::Tcp(old),
            true,
            false,
            dir,
            L4Event::Tcp(TcpFlags(f)),
        );
        match s.state {
            ProtoState::Tcp(t) => (s.verdict, t),
            other => panic!("tcp became {other:?}"),
        }
    }

    #[test]
    fn flag_combinations_follow_tcp_valid_flags() {
        for ok in [
            S,
            S | A,
            R,
            R | A,
            F | A,
            A,
            A | TcpFlags::PSH,
            S | TcpFlags::URG,
        ] {
            assert!(TcpFlags(ok).is_valid_combination(), "{ok:#x}");
        }
        for bad in [0, F, S | F, S | R, S | F | A, F | R, TcpFlags::PSH] {
            assert!(!TcpFlags(bad).is_valid_combination(), "{bad:#x}");
        }
    }

    /// Every cell of netfilter's table, driven through `step`.
    #[test]
    fn every_tcp_transition_matches_netfilter() {
        use TcpState::*;
        let states = [
            None,
            SynSent,
            SynRecv,
            Established,
            FinWait,
            CloseWait,
            LastAck,
            TimeWait,
            Close,
            SynSent2,
        ];
        let flags = [S, S | A, F | A, A, R, 0x20 /* URG only: class none */];
        for (d, dir) in [Dir::Original, Dir::Reply].into_iter().enumerate() {
            for (c, &f) in flags.iter().enumerate() {
                for (o, &old) in states.iter().enumerate() {
                    let want = TCP_TABLE[d][c][o];
                    let (v, new) = tcp(old, dir, f);
                    match want {
                        IV => assert_eq!((v, new), (Verdict::Invalid, old)),
                        IG => assert_eq!((v, new), (Verdict::Ignored, old)),
                        SS if matches!(old, TimeWait | Close) => assert_eq!(v, Verdict::Reopen),
                        _ => {
                            assert_eq!(v, Verdict::Valid, "{dir:?} {f:#x} {old:?}");
                            assert_eq!(new as u8, want);
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn named_transitions() {
        use Dir::{Original as O, Reply as Rp};
        use TcpState::*;
        assert_eq!(tcp(None, O, S), (Verdict::Valid, SynSent));
        assert_eq!(tcp(None, O, A), (Verdict::Valid, Established));
        assert_eq!(tcp(SynSent, O, S), (Verdict::Valid, SynSent));
        assert_eq!(tcp(SynSent, Rp, S | A), (Verdict::Valid, SynRecv));
        assert_eq!(tcp(SynSent, Rp, S), (Verdict::Valid, SynSent2));
        assert_eq!(tcp(SynSent2, O, S | A), (Verdict::Valid, SynRecv));
        assert_eq!(tcp(SynRecv, O, A), (Verdict::Valid, Established));
        assert_eq!(tcp(SynRecv, Rp, S | A), (Verdict::Ignored, SynRecv));
        assert_eq!(tcp(SynSent, O, A), (Verdict::Invalid, SynSent));
        assert_eq!(tcp(Established, O, F | A), (Verdict::Valid, FinWait));
        assert_eq!(tcp(FinWait, Rp, A), (Verdict::Valid, CloseWait));
        assert_eq!(tcp(FinWait, Rp, F | A), (Verdict::Valid, LastAck));
        assert_eq!(tcp(CloseWait, Rp, F | A), (Verdict::Valid, LastAck));
        assert_eq!(tcp(LastAck, O, A), (Verdict::Valid, TimeWait));
        assert_eq!(tcp(Established, Rp, R), (Verdict::Valid, Close));
        assert_eq!(tcp(Established, O, S), (Verdict::Ignored, Established));
        assert_eq!(tcp(TimeWait, O, S).0, Verdict::Reopen);
        assert_eq!(tcp(TimeWait, Rp, S).0, Verdict::Reopen);
        assert_eq!(tcp(Close, O, S).0, Verdict::Reopen);
        assert_eq!(tcp(Established, O, S | F).0, Verdict::Invalid);
    }

    #[test]
    fn assured_after_handshake_completes_with_reply_seen() {
        let st = ProtoState::Tcp(TcpState::SynRecv);
        let s = step(st, true, false, Dir::Original, L4Event::Tcp(TcpFlags(A)));
        assert!(s.assured && !s.cap_unack);
        assert_eq!(s.timeout, Some(TimeoutKind::TcpEstablished));
        // A picked-up connection is not assured until a reply was seen.
        let st = ProtoState::Tcp(TcpState::Established);
        let s = step(st, false, false, Dir::Reply, L4Event::Tcp(TcpFlags(A)));
        assert!(!s.assured && s.cap_unack);
        assert_eq!(s.timeout, Some(TimeoutKind::TcpEstablished));
    }

    #[test]
    fn rst_before_reply_closes() {
        let st = ProtoState::Tcp(TcpState::SynSent);
        let s = step(st, false, false, Dir::Reply, L4Event::Tcp(TcpFlags(R | A)));
        assert_eq!(s.verdict, Verdict::Close);
        let s = step(st, true, false, Dir::Reply, L4Event::Tcp(TcpFlags(R | A)));
        assert_eq!(
            (s.verdict, s.timeout),
            (Verdict::Valid, Some(TimeoutKind::TcpClose))
        );
    }

    #[test]
    fn creation_rules() {
        let t = |f| L4Event::Tcp(TcpFlags(f));
        assert!(may_create(t(S), false));
        assert!(may_create(t(A), true));
        assert!(!may_create(t(A), false));
        assert!(!may_create(t(F | A), true));
        assert!(!may_create(t(R), true));
        assert!(!may_create(t(S | A), true));
        assert!(!may_create(t(S | F), true));
        assert!(may_create(L4Event::Udp, false));
        assert!(may_create(L4Event::Other, false));
        assert!(may_create(L4Event::Icmp { request: true }, false));
        assert!(!may_create(L4Event::Icmp { request: false }, false));
        assert!(icmp_is_query_request(false, 8) && !icmp_is_query_request(false, 0));
        assert!(icmp_is_query_request(true, 128) && !icmp_is_query_request(true, 129));
    }

    #[test]
    fn udp_goes_unreplied_replied_stream() {
        let u = |st, dir| step(ProtoState::Udp(st), false, false, dir, L4Event::Udp);
        let s = u(UdpState::Unreplied, Dir::Original);
        assert_eq!(
            (s.state, s.assured, s.timeout),
            (
                ProtoState::Udp(UdpState::Unreplied),
                false,
                Some(TimeoutKind::Udp)
            )
        );
        let s = u(UdpState::Unreplied, Dir::Reply);
        assert_eq!(
            (s.state, s.assured, s.timeout),
            (
                ProtoState::Udp(UdpState::Replied),
                false,
                Some(TimeoutKind::Udp)
            )
        );
        let s = u(UdpState::Replied, Dir::Original);
        assert_eq!(
            (s.state, s.assured, s.timeout),
            (
                ProtoState::Udp(UdpState::Stream),
                true,
                Some(TimeoutKind::UdpStream)
            )
        );
    }

    #[test]
    fn mismatched_event_is_invalid() {
        let s = step(
            ProtoState::Udp(UdpState::Unreplied),
            false,
            false,
            Dir::Original,
            L4Event::Other,
        );
        assert_eq!(s.verdict, Verdict::Invalid);
    }
}
