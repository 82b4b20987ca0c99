#![no_main]
//! Fuzz the connection state file (`state_file`) reader: any bytes either
//! decode, or are refused with a message, never a panic; what decodes
//! encodes back to the same bytes (every field is checked, none ignored).
use libfuzzer_sys::fuzz_target;
use sluice_daemon::state::{decode, encode};

fuzz_target!(|data: &[u8]| {
    match decode(data) {
        Ok(s) => assert_eq!(encode(s.workers, s.saved_at_ms, &s.policies, &s.conns), data),
        Err(e) => assert!(!e.to_string().is_empty()),
    }
});
