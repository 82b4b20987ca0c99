#![no_main]
//! Fuzz the nft front end: no panics, and whatever parses prints to a fixed point.
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    if let Ok(r) = sluice_ruleset::parse_nft_str("fuzz.nft", text) {
        let printed = r.to_nft();
        let again = sluice_ruleset::parse_nft_str("fuzz.nft", &printed).map(|r| r.to_nft());
        assert_eq!(again.ok().as_deref(), Some(printed.as_str()), "printer is not a fixed point");
    }
});
