//! `dissect` never panics on any byte string, and a successful result keeps
//! its offsets inside the frame (mirrors the proptest
//! `dissect::tests::arbitrary_bytes_never_panic`).
#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_wire::fuzz_support::dissect_and_check;

fuzz_target!(|data: &[u8]| {
    let _ = dissect_and_check(data);
});
