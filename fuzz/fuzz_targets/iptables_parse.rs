#![no_main]
//! Fuzz the iptables-restore and ip6tables-restore + ipset front ends: no
//! panics on any input, and whatever parses prints to a fixed point.
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    // Split the input: before the first NUL is the ruleset, after it the ipset file.
    let (rules, sets) = match text.split_once('\0') {
        Some((r, s)) => (r, Some(s)),
        None => (text, None),
    };
    for v6 in [false, true] {
        let parsed = if v6 {
            sluice_ruleset::parse_ip6tables_restore_str("fuzz.rules", rules, sets)
        } else {
            sluice_ruleset::parse_iptables_restore_str("fuzz.rules", rules, sets)
        };
        if let Ok(r) = parsed {
            let printed = r.to_nft();
            let again = sluice_ruleset::parse_nft_str("fuzz.nft", &printed).map(|r| r.to_nft());
            assert_eq!(again.ok().as_deref(), Some(printed.as_str()), "printer is not a fixed point");
        }
    }
});
