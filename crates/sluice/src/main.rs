//! The `sluice` binary: CLI, daemon, ctl client. Thin by design.
fn main() {
    println!("sluice {}", env!("CARGO_PKG_VERSION"));
}
