#![no_main]
//! Fuzz control commands against a running policy: parsing never panics,
//! and applying whatever parses either succeeds or is refused, never
//! panics, and never changes the policy it was applied to.
use libfuzzer_sys::fuzz_target;
use std::sync::OnceLock;

const BASE: &str = "table inet filter {\n\
  set blocked { type ipv4_addr; flags interval; elements = { 192.0.2.0/24 } }\n\
  map ports { type inet_service : verdict; elements = { 22 : accept } }\n\
  set seen { type ipv4_addr . inet_service; flags dynamic,timeout; timeout 1m; size 4; }\n\
  set conns { type ipv4_addr; flags dynamic; }\n\
  chain forward { type filter hook forward priority 0; policy accept;\n\
    ip saddr @blocked drop\n    ip saddr . tcp dport @seen drop\n\
    tcp dport 23 add @seen { ip saddr . 23 limit rate over 1/second } quota over 1 kbytes drop\n\
    tcp dport 22 ct state new add @conns { ip saddr ct count over 3 } reject with tcp reset\n\
    tcp dport vmap @ports\n    jump web\n  }\n\
  counter web { packets 1 bytes 60 }\n  quota cap { over 1 kbytes }\n\
  chain web { tcp dport 80 counter name web quota name cap accept }\n}\n\
table ip nat { chain post { type nat hook postrouting priority 100; policy accept;\n\
    oifname \"wan0\" masquerade } }\n";

fn base() -> &'static sluice_policy::CompiledPolicy {
    static P: OnceLock<sluice_policy::CompiledPolicy> = OnceLock::new();
    P.get_or_init(|| {
        let rs = sluice_ruleset::parse_nft_str("base.nft", BASE).expect("base parses");
        sluice_policy::CompiledPolicy::compile(&rs, &sluice_policy::Interfaces::from_ruleset(&rs))
            .expect("base compiles")
    })
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let p = base();
    let before = p.list_rules();
    if let Ok((next, _)) = p.apply_text("fuzz", text) {
        // The new generation lists and traces without panicking.
        let _ = next.list_rules();
        let _ = next.program();
    }
    assert_eq!(p.list_rules(), before, "applying a command changed its base");
});
