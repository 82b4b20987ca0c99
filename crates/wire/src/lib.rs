//! `sluice-wire`: zero-copy typed packet views, `Repr` parse/emit, checksums
//! and flow-key extraction.
//!
//! Owns: the byte layout of every protocol Sluice touches.
//! Invariant: no function in this crate panics on any byte string. Once a
//! view's `check_len` has passed, none of its accessors panic.
#![forbid(unsafe_code)]

pub mod flow;

pub use flow::{FlowKey4, FlowKey6};
