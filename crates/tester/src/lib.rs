//! `sluice-tester`: the RFC 2544 / RFC 4814 / RFC 9693 procedures, traffic
//! generation, the DUT drivers and the reports behind `sluice bench`.
//!
//! Owns: how Sluice is measured. Every figure it prints comes from a run of
//! these procedures on the machine at hand; nothing is computed from models.
#![forbid(unsafe_code)]

pub mod batch;
pub mod forward;
pub mod memprobe;
pub mod nat44;
pub mod perm;
pub mod update;
pub mod update_kernel;
