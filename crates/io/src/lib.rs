//! `sluice-io`: packet I/O backends (mem, pcap, AF_PACKET, AF_XDP) and the few
//! hardware/OS primitives the fast path needs (prefetch, huge-page advice).
//!
//! This is the only crate in the workspace that contains `unsafe`. Every
//! unsafe block carries a `// SAFETY:` comment that states why it is sound.
#![deny(unsafe_op_in_unsafe_fn)]
#![deny(clippy::undocumented_unsafe_blocks)]

pub mod mem;
