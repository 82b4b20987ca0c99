//! Time as conntrack sees it: an [`Instant`] passed in by the caller, compact
//! 32-bit expiry ticks, and the configurable [`Timeouts`].
//!
//! Resolution and range: an [`Instant`] counts milliseconds from an arbitrary
//! epoch chosen by the caller. An entry stores its expiry as the low 32 bits
//! of that count (one tick = 1 ms) and compares it with wrapping arithmetic,
//! so an expiry may lie at most 2^31 - 1 ms (24.8 days) in the future;
//! [`Timeouts`] are clamped to that. An entry that has been expired for more
//! than 24.8 days would look alive again; GC visits every entry far more
//! often than that, as long as the caller runs it at all.

use core::ops::Add;
use core::time::Duration;

/// Monotonic time in milliseconds since an epoch chosen by the caller.
///
/// Core crates never read a clock: the worker reads one per batch and passes
/// it to every call, which keeps tests deterministic.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, Default)]
pub struct Instant(u64);

impl Instant {
    /// `ms` milliseconds after the epoch.
    pub const fn from_millis(ms: u64) -> Self {
        Self(ms)
    }

    /// `s` seconds after the epoch.
    pub const fn from_secs(s: u64) -> Self {
        Self(s.saturating_mul(1000))
    }

    /// Milliseconds since the epoch.
    pub const fn as_millis(self) -> u64 {
        self.0
    }

    /// The 32-bit tick stored in entries.
    #[inline]
    pub(crate) fn tick(self) -> u32 {
        self.0 as u32
    }
}

impl Add<Duration> for Instant {
    type Output = Instant;
    fn add(self, d: Duration) -> Instant {
        let ms = u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        Instant(self.0.saturating_add(ms))
    }
}

/// Longest timeout an entry can hold: 2^31 - 1 ms (about 24.8 days).
pub const MAX_TIMEOUT: Duration = Duration::from_millis(i32::MAX as u64);

/// Expiry tick for a timeout of `ms` starting at `now`.
#[inline]
pub(crate) fn expiry_after(now: Instant, ms: u32) -> u32 {
    now.tick().wrapping_add(ms)
}

/// True once `now` has reached `expiry` (netfilter: `timeout - now <= 0`).
#[inline]
pub(crate) fn is_expired(expiry: u32, now: Instant) -> bool {
    (now.tick().wrapping_sub(expiry) as i32) >= 0
}

/// Milliseconds left before `expiry`, or 0 if it has passed.
#[inline]
pub(crate) fn remaining_ms(expiry: u32, now: Instant) -> u32 {
    let d = expiry.wrapping_sub(now.tick()) as i32;
    d.max(0) as u32
}

/// Per-state timeouts. `Default` is netfilter's defaults
/// (`net.netfilter.nf_conntrack_*_timeout*`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Timeouts {
    /// TCP SYN_SENT and SYN_SENT2 (netfilter: 120 s).
    pub tcp_syn_sent: Duration,
    /// TCP SYN_RECV (60 s).
    pub tcp_syn_recv: Duration,
    /// TCP ESTABLISHED (432000 s = 5 days).
    pub tcp_established: Duration,
    /// TCP FIN_WAIT (120 s).
    pub tcp_fin_wait: Duration,
    /// TCP CLOSE_WAIT (60 s).
    pub tcp_close_wait: Duration,
    /// TCP LAST_ACK (30 s).
    pub tcp_last_ack: Duration,
    /// TCP TIME_WAIT (120 s).
    pub tcp_time_wait: Duration,
    /// TCP CLOSE, also used after any RST (10 s).
    pub tcp_close: Duration,
    /// Cap for TCP connections that are not assured yet (300 s). netfilter
    /// applies it while data is unacknowledged, which needs window tracking;
    /// Sluice applies it until the connection is assured, so a picked-up or
    /// never-answered connection cannot hold an entry for five days.
    pub tcp_unacknowledged: Duration,
    /// UDP until the flow is a stream (`nf_conntrack_udp_timeout`, 30 s).
    pub udp: Duration,
    /// UDP stream, i.e. assured (`nf_conntrack_udp_timeout_stream`, 120 s).
    pub udp_stream: Duration,
    /// ICMP / ICMPv6 query (30 s).
    pub icmp: Duration,
    /// Any other protocol (600 s).
    pub generic: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        let s = Duration::from_secs;
        Self {
            tcp_syn_sent: s(120),
            tcp_syn_recv: s(60),
            tcp_established: s(432_000),
            tcp_fin_wait: s(120),
            tcp_close_wait: s(60),
            tcp_last_ack: s(30),
            tcp_time_wait: s(120),
            tcp_close: s(10),
            tcp_unacknowledged: s(300),
            udp: s(30),
            udp_stream: s(120),
            icmp: s(30),
            generic: s(600),
        }
    }
}

/// One of the timers a connection's state selects: the index into a
/// compiled timeout table, and what a [`TimeoutPolicy`] sets.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash)]
#[repr(u8)]
pub enum TimeoutKind {
    /// TCP SYN_SENT.
    TcpSynSent,
    /// TCP SYN_RECV.
    TcpSynRecv,
    /// TCP ESTABLISHED.
    TcpEstablished,
    /// TCP FIN_WAIT.
    TcpFinWait,
    /// TCP CLOSE_WAIT.
    TcpCloseWait,
    /// TCP LAST_ACK.
    TcpLastAck,
    /// TCP TIME_WAIT.
    TcpTimeWait,
    /// TCP CLOSE.
    TcpClose,
    /// TCP SYN_SENT2 (simultaneous open; [`Timeouts::tcp_syn_sent`] unless
    /// a policy sets it).
    TcpSynSent2,
    /// The cap on a TCP connection that is not assured yet
    /// ([`Timeouts::tcp_unacknowledged`]).
    TcpUnack,
    /// UDP until the flow is a stream.
    Udp,
    /// UDP stream.
    UdpStream,
    /// ICMP / ICMPv6 query.
    Icmp,
    /// Any other protocol.
    Generic,
}

pub(crate) const NTMO: usize = TimeoutKind::Generic as usize + 1;

impl TimeoutKind {
    /// Every timer, in index order.
    pub const ALL: [TimeoutKind; NTMO] = [
        Self::TcpSynSent,
        Self::TcpSynRecv,
        Self::TcpEstablished,
        Self::TcpFinWait,
        Self::TcpCloseWait,
        Self::TcpLastAck,
        Self::TcpTimeWait,
        Self::TcpClose,
        Self::TcpSynSent2,
        Self::TcpUnack,
        Self::Udp,
        Self::UdpStream,
        Self::Icmp,
        Self::Generic,
    ];
}

/// A timeout policy (nft's `ct timeout` object): the timers it sets, each
/// replacing the table's own for the connections that follow the policy
/// ([`crate::Table::apply_timeout_policy`]); the timers it leaves unset
/// stay the table's, also when those change
/// ([`crate::Table::set_timeouts`]).
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default, Hash)]
pub struct TimeoutPolicy {
    ms: [Option<u32>; NTMO],
}

impl TimeoutPolicy {
    /// Set timer `kind` to `d` (clamped to [`MAX_TIMEOUT`]).
    pub fn set(&mut self, kind: TimeoutKind, d: Duration) {
        self.ms[kind as usize] = Some(clamp_ms(d));
    }

    /// What the policy sets timer `kind` to, if it does.
    pub fn get(&self, kind: TimeoutKind) -> Option<Duration> {
        self.ms[kind as usize].map(|m| Duration::from_millis(u64::from(m)))
    }

    /// True if it sets no timer.
    pub fn is_empty(&self) -> bool {
        self.ms.iter().all(Option::is_none)
    }

    /// `base` with this policy's timers in place of its own.
    pub(crate) fn over(&self, base: &TimeoutTable) -> TimeoutTable {
        let mut t = *base;
        for (v, m) in t.0.iter_mut().zip(self.ms) {
            if let Some(m) = m {
                *v = m;
            }
        }
        t
    }
}

fn clamp_ms(d: Duration) -> u32 {
    let m = d.min(MAX_TIMEOUT).as_millis();
    u32::try_from(m).unwrap_or(i32::MAX as u32)
}

/// Timeouts converted once to clamped milliseconds, indexed by [`TimeoutKind`].
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct TimeoutTable([u32; NTMO]);

impl TimeoutTable {
    pub(crate) fn new(t: &Timeouts) -> Self {
        let ms = clamp_ms;
        Self([
            ms(t.tcp_syn_sent),
            ms(t.tcp_syn_recv),
            ms(t.tcp_established),
            ms(t.tcp_fin_wait),
            ms(t.tcp_close_wait),
            ms(t.tcp_last_ack),
            ms(t.tcp_time_wait),
            ms(t.tcp_close),
            ms(t.tcp_syn_sent),
            ms(t.tcp_unacknowledged),
            ms(t.udp),
            ms(t.udp_stream),
            ms(t.icmp),
            ms(t.generic),
        ])
    }

    #[inline]
    pub(crate) fn get(&self, t: TimeoutKind) -> u32 {
        self.0[t as usize]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expiry_compares_across_the_32_bit_wrap() {
        let now = Instant::from_millis(u64::from(u32::MAX) - 5);
        let exp = expiry_after(now, 10);
        assert!(!is_expired(exp, now));
        assert!(!is_expired(exp, Instant::from_millis(now.as_millis() + 9)));
        assert!(is_expired(exp, Instant::from_millis(now.as_millis() + 10)));
        assert_eq!(remaining_ms(exp, now), 10);
        assert_eq!(
            remaining_ms(exp, Instant::from_millis(now.as_millis() + 20)),
            0
        );
    }

    #[test]
    fn timeouts_are_clamped_to_the_tick_range() {
        let t = Timeouts {
            generic: Duration::from_secs(100 * 86_400),
            ..Timeouts::default()
        };
        let c = TimeoutTable::new(&t);
        assert_eq!(c.get(TimeoutKind::Generic), i32::MAX as u32);
        assert_eq!(c.get(TimeoutKind::TcpEstablished), 432_000_000);
    }

    #[test]
    fn instant_arithmetic() {
        assert_eq!(
            Instant::from_secs(2) + Duration::from_millis(5),
            Instant::from_millis(2005)
        );
    }
}
