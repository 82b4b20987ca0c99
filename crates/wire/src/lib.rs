//! `sluice-wire`: zero-copy typed packet views, `Repr` parse/emit, checksums
//! and flow-key extraction.
//!
//! # What this crate owns
//!
//! The byte layout of every protocol Sluice touches, and nothing else: no
//! state, no I/O, no clock, no allocation.
//!
//! * Typed views in the smoltcp style ([`ethernet`], [`arp`], [`ipv4`],
//!   [`ipv6`], [`udp`], [`tcp`], [`icmp`]): `Packet<T: AsRef<[u8]>>` wraps a
//!   buffer, `new_checked` validates its length once, getters read fields in
//!   place and setters (when `T: AsMut<[u8]>`) write them in place. Each view
//!   has a `Repr` (a plain, owned description) with `parse`, `buffer_len` and
//!   `emit`.
//! * [`checksum`]: the RFC 1071 internet checksum, the TCP/UDP/ICMPv6
//!   pseudo-header sums, and RFC 1624 incremental updates used by the NAT fast
//!   path.
//! * [`dissect()`]: the per-frame fast parser of the engine. One call per
//!   frame returns a small `Copy` summary ([`Dissect`]) with offsets, the flow
//!   key and an L4 summary. [`dissect_plain4`] and [`dissect_plain6`] are
//!   its fixed-offset shortcuts for plain TCP/UDP/echo frames, proven to agree
//!   with it.
//! * [`ndp`]: IPv6 neighbor discovery (RFC 4861) solicitations and
//!   advertisements, their validation, the addresses NDP derives, builders.
//! * [`build`]: frame builders for tests and the traffic generator.
//! * [`flow`]: the flow keys conntrack and NAT index by.
//!
//! # Invariants
//!
//! * No function in this crate panics on any byte string. `dissect` and every
//!   `new_checked` / `Repr::parse` return a [`ParseError`] instead. This is
//!   checked by proptest (`tests` in [`dissect`]) and by the cargo-fuzz targets
//!   in `fuzz/`.
//! * Once a view's `check_len` has passed, none of its getters panic. Views
//!   made with `new_unchecked` on a short buffer may panic on fixed fields
//!   (as in smoltcp); variable-length parts (options, payloads) never panic
//!   and come back empty when out of range.
//! * Setters that change a length field (`set_header_len`, `set_total_len`)
//!   can make a view inconsistent; call `check_len` again before trusting it.
//! * `dissect` and the checksum functions never allocate.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

/// Declare a protocol enum with an `Unknown` variant and conversions both
/// ways. `Unknown` only ever holds values that are not listed; converting a
/// listed value always yields its named variant.
macro_rules! enum_with_unknown {
    (
        $(#[$m:meta])*
        pub enum $name:ident($ty:ty) {
            $( $(#[$vm:meta])* $variant:ident = $value:expr ),+ $(,)?
        }
    ) => {
        $(#[$m])*
        #[derive(Debug, PartialEq, Eq, PartialOrd, Ord, Clone, Copy, Hash)]
        pub enum $name {
            $( $(#[$vm])* $variant, )+
            /// A value this crate has no name for.
            Unknown($ty),
        }

        impl ::core::convert::From<$ty> for $name {
            #[inline]
            fn from(value: $ty) -> Self {
                match value {
                    $( $value => $name::$variant, )+
                    other => $name::Unknown(other),
                }
            }
        }

        impl ::core::convert::From<$name> for $ty {
            #[inline]
            fn from(value: $name) -> Self {
                match value {
                    $( $name::$variant => $value, )+
                    $name::Unknown(other) => other,
                }
            }
        }
    };
}

pub mod arp;
pub mod build;
pub mod checksum;
pub mod dissect;
mod error;
pub mod ethernet;
pub mod flow;
pub mod frag;
#[doc(hidden)]
pub mod fuzz_support;
pub mod icmp;
pub mod ip;
pub mod ipv4;
pub mod ipv6;
pub mod ndp;
pub mod tcp;
pub mod udp;

pub use build::{
    build_icmp4_echo, build_icmp4_error, build_icmp6_echo, build_icmp6_error, build_tcp4,
    build_tcp6, build_udp4, build_udp6,
};
pub use dissect::{
    dissect, dissect_plain4, dissect_plain6, Dissect, InnerKey, Net, Plain4, Plain6, L4,
};
pub use error::{EmitError, ParseError};
pub use ethernet::EthernetAddress;
pub use flow::{FlowKey4, FlowKey6};
pub use ip::{Frag, IpPair, IpProtocol};

/// Result of parsing.
pub type Result<T> = core::result::Result<T, ParseError>;

/// Read a big-endian `u16` from the first two bytes of a fixed array.
#[inline(always)]
pub(crate) fn be16(b: [u8; 2]) -> u16 {
    u16::from_be_bytes(b)
}
