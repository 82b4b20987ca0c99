//! `sluice-nat` (scaffold; see docs/architecture.md).
#![forbid(unsafe_code)]
