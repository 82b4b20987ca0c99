//! `sluice bench ...`: run a tester procedure, print a table, write JSON.

use std::path::Path;
use std::process::ExitCode;

use anyhow::{Context, Result};
use sluice_tester::nat44::{self, Nat44Options};

/// `sluice bench nat44`.
pub fn nat44(
    counts: &[u64],
    cores: u16,
    frames: Option<u64>,
    seed: u64,
    json: Option<&Path>,
) -> Result<ExitCode> {
    let mut rows = Vec::with_capacity(counts.len());
    for &n in counts {
        eprintln!("bench nat44: {n} connections on {cores} core(s) ...");
        let opts = Nat44Options {
            connections: n,
            cores: usize::from(cores),
            seed,
            throughput_frames: frames,
            ..Nat44Options::default()
        };
        let r = nat44::run(&opts).with_context(|| format!("{n} connections"))?;
        rows.push(r);
    }
    print!("{}", nat44::table(&rows));
    if let Some(p) = json {
        let text = if rows.len() == 1 {
            serde_json::to_string_pretty(&rows[0])?
        } else {
            serde_json::to_string_pretty(&rows)?
        };
        std::fs::write(p, text + "\n").with_context(|| format!("writing {}", p.display()))?;
    }
    let failed = rows.iter().any(|r| r.validation != "pass");
    if failed {
        eprintln!("bench nat44: validation FAILED: the engine lost or mistranslated frames");
        return Ok(ExitCode::from(1));
    }
    Ok(ExitCode::SUCCESS)
}
