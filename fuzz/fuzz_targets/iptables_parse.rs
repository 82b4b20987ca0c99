#![no_main]
//! Fuzz the iptables-restore + ipset front end: no panics on any input.
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    // Split the input: before the first NUL is the ruleset, after it the ipset file.
    let (rules, sets) = match text.split_once('\0') {
        Some((r, s)) => (r, Some(s)),
        None => (text, None),
    };
    if let Ok(r) = sluice_ruleset::parse_iptables_restore_str("fuzz.rules", rules, sets) {
        let _ = r.to_nft();
    }
});
