#![no_main]
//! Fuzz the gateway configuration (`sluice.toml`): any text is either a
//! configuration or a located error (`file:line:col: setting: reason`),
//! never a panic.
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    match sluice_daemon::config::parse(std::path::Path::new("/fuzz/sluice.toml"), text) {
        Ok(cfg) => {
            // Every accepted configuration has at least one interface.
            assert!(!cfg.interfaces.is_empty());
        }
        Err(e) => {
            let msg = e.to_string();
            assert!(msg.starts_with("/fuzz/sluice.toml"), "unlocated error: {msg}");
        }
    }
});
