//! Every view's `new_checked`, its getters and every `Repr::parse` never
//! panic; a parsed `Repr` re-emits and re-parses to itself (mirrors the
//! proptests in `sluice_wire::dissect::tests`). Also runs the views at the
//! usual header offsets of an Ethernet frame.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_wire::fuzz_support::exercise_views;

fuzz_target!(|data: &[u8]| {
    exercise_views(data);
    for off in [14usize, 18, 22, 34, 42, 54] {
        if let Some(rest) = data.get(off..) {
            exercise_views(rest);
        }
    }
});
