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
    prefetch_rounds: u32,
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
            prefetch_rounds,
            ..Nat44Options::default()
        };
        let r = nat44::run(&opts).with_context(|| format!("{n} connections"))?;
        rows.push(r);
    }
    print!("{}", nat44::table(&rows));
    for r in &rows {
        if let Some(c) = &r.prefetch_comparison {
            println!("{}", nat44::prefetch_line(r.connections, c));
        }
    }
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

/// `sluice bench rules`.
pub fn rules(counts: &[u64], json: Option<&Path>) -> Result<ExitCode> {
    use sluice_classify::bench::{measure_rules, Shape};
    let epoch = std::time::Instant::now();
    let mut clock = || epoch.elapsed().as_nanos() as u64;
    let mut rows = Vec::new();
    println!(
        "{:<11} {:>7} {:>7} {:>12} {:>9} {:>12} {:>9} {:>12}",
        "shape", "rules", "tuples", "compiled ns", "vs 20", "batch32 ns", "vs 20", "linear ns"
    );
    for shape in [Shape::Seed001, Shape::ClassBench, Shape::Hosts] {
        let mut base = None;
        for &n in counts {
            let n = usize::try_from(n).context("rule count too large")?;
            eprintln!("bench rules: {} x {n} ...", shape.name());
            let t = measure_rules(shape, n, 4096, 8, &mut clock);
            let (b, bb) = *base.get_or_insert((t.compiled_ns, t.batch_ns));
            println!(
                "{:<11} {:>7} {:>7} {:>12.1} {:>8.2}x {:>12.1} {:>8.2}x {:>12.1}",
                shape.name(),
                n,
                t.tuples,
                t.compiled_ns,
                t.compiled_ns / b,
                t.batch_ns,
                t.batch_ns / bb,
                t.linear_ns,
            );
            rows.push(serde_json::json!({
                "shape": shape.name(),
                "count": n,
                "compiled_ns": t.compiled_ns,
                "batch32_ns": t.batch_ns,
                "linear_ns": t.linear_ns,
                "tuples": t.tuples,
            }));
        }
    }
    if let Some(p) = json {
        let text = serde_json::to_string_pretty(&serde_json::json!({ "rules": rows }))?;
        std::fs::write(p, text + "\n").with_context(|| format!("writing {}", p.display()))?;
    }
    Ok(ExitCode::SUCCESS)
}

/// `sluice bench update`.
pub fn update(
    o: &sluice_tester::update::UpdateOptions,
    kernel_samples: Option<usize>,
    json: Option<&Path>,
) -> Result<ExitCode> {
    use sluice_tester::{update, update_kernel};
    if kernel_samples.is_some() {
        update_kernel::check_root().context("bench update")?;
    }
    eprintln!(
        "bench update: {} rules loaded, {} inserts/deletes, {} appends, through the control socket ...",
        o.objects, o.samples, o.appends
    );
    let r = update::run(o).context("bench update")?;
    print!("{}", update::table(&r));
    let kernel = match kernel_samples {
        Some(samples) => {
            eprintln!(
                "bench update --kernel: the same with {} in a network namespace ({samples} inserts/deletes each) ...",
                update_kernel::TOOLS.join(", ")
            );
            let rows = update_kernel::run(o, samples).context("bench update --kernel")?;
            print!("{}", update_kernel::table(&rows));
            Some(rows)
        }
        None => None,
    };
    if let Some(p) = json {
        let mut v = serde_json::to_value(&r)?;
        if let (Some(rows), Some(m)) = (kernel, v.as_object_mut()) {
            m.insert("kernel".into(), serde_json::to_value(rows)?);
        }
        let text = serde_json::to_string_pretty(&v)?;
        std::fs::write(p, text + "\n").with_context(|| format!("writing {}", p.display()))?;
    }
    Ok(ExitCode::SUCCESS)
}

/// `sluice bench forward`. SIGINT/SIGTERM stop the run; the namespaces it
/// built are removed before it returns.
pub fn forward(
    o: &sluice_tester::forward::ForwardOptions,
    json: Option<&Path>,
) -> Result<ExitCode> {
    use sluice_tester::forward;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, std::sync::Arc::clone(&stop))
            .context("installing signal handlers")?;
    }
    let rows = forward::run(o, &stop, &mut |line| eprintln!("{line}")).context("bench forward")?;
    print!("{}", forward::table(&rows));
    if let Some(p) = json {
        let text = serde_json::to_string_pretty(&serde_json::json!({ "results": rows }))?;
        std::fs::write(p, text + "\n").with_context(|| format!("writing {}", p.display()))?;
    }
    Ok(ExitCode::SUCCESS)
}
