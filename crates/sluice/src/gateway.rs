//! `sluice run`, `sluice ctl` and the gateway half of `sluice check`: thin
//! wrappers over `sluice-daemon`.

use std::path::Path;
use std::process::ExitCode;

use anyhow::Result;
use sluice_daemon::config::BackendChoice;

/// Whether `path` names a gateway configuration (TOML) rather than a rule set.
pub fn is_gateway_config(path: &Path) -> bool {
    path.extension().and_then(|e| e.to_str()) == Some("toml")
}

/// `sluice check -c sluice.toml`: the whole configuration, including the
/// ruleset it points at. Exit 0 when valid, 1 with the error otherwise.
pub fn check(path: &Path) -> Result<ExitCode> {
    match sluice_daemon::check(path) {
        Ok(summary) => {
            println!("{summary}");
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => {
            eprintln!("{e}");
            Ok(ExitCode::from(1))
        }
    }
}

/// `sluice run -c sluice.toml`: run the gateway until SIGTERM or SIGINT.
pub fn run(
    path: &Path,
    backend: Option<BackendChoice>,
    capture: Option<&Path>,
    socket: Option<&Path>,
    no_pin: bool,
) -> Result<ExitCode> {
    let opts = sluice_daemon::RunOptions {
        backend,
        capture: capture.map(Path::to_path_buf),
        control_socket: socket.map(Path::to_path_buf),
        no_pin,
        ..Default::default()
    };
    sluice_daemon::run(path, &opts)?;
    Ok(ExitCode::SUCCESS)
}

/// `sluice ctl [--text] WORDS...`: one request to a running gateway.
pub fn ctl(socket: &Path, words: &[String], text: bool) -> Result<ExitCode> {
    let req = sluice_daemon::ctl::request_from_args(words)?;
    let resp = sluice_daemon::ctl::client(socket, &req)?;
    let v = serde_json::from_str::<serde_json::Value>(&resp).ok();
    // `ruleset list` prints the rule set itself (nft syntax), `metrics`
    // the Prometheus text, the rest JSON (whose `ruleset` key, in `status`
    // and `reload`, is the rule set's file name); with `--text`, a
    // connection listing as `conntrack -L` prints it, and a count or flush
    // as its number.
    let raw_key = match words {
        [a, b] if a == "ruleset" && b == "list" => Some("ruleset"),
        [a] if a == "metrics" => Some("metrics"),
        _ => None,
    };
    let human = match (
        text,
        words.first().map(String::as_str),
        words.get(1).map(String::as_str),
    ) {
        (true, Some("conntrack"), Some("list")) => {
            v.as_ref().and_then(sluice_daemon::ctl::conntrack_text)
        }
        (true, Some("conntrack"), Some("count")) => v
            .as_ref()
            .and_then(|v| v.get("count"))
            .map(|n| format!("{n}\n")),
        (true, Some("conntrack"), Some("flush")) => v
            .as_ref()
            .and_then(|v| v.get("flushed"))
            .map(|n| format!("{n}\n")),
        _ => None,
    };
    match raw_key
        .and_then(|k| v.as_ref().and_then(|v| v.get(k)))
        .and_then(|r| r.as_str())
        .map(str::to_string)
        .or(human)
    {
        Some(text) => print!("{text}"),
        None => println!("{resp}"),
    }
    let failed = v.and_then(|v| v.get("error").cloned()).is_some();
    Ok(if failed {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

/// `sluice nat lookup -c FILE QUERY`: deterministic NAT's reverse (an
/// external endpoint's subscriber) and forward (a subscriber's address and
/// ports) mapping, from the configuration and its rule set's pools.
pub fn nat_lookup(path: &Path, query: &str) -> Result<ExitCode> {
    let nat = match sluice_daemon::nat_config(path) {
        Ok(n) => n,
        Err(e) => {
            eprintln!("{e}");
            return Ok(ExitCode::from(1));
        }
    };
    let Some((base, len)) = nat.deterministic else {
        anyhow::bail!(
            "{}: nat.deterministic is not set: only deterministic NAT maps without a log \
             (with port blocks, the NAT log's block lines give the subscriber)",
            path.display()
        );
    };
    let pools = nat.pools.len() as u16;
    if pools == 0 {
        anyhow::bail!("{}: the rule set has no snat pool", path.display());
    }
    if let Some((a, p)) = query.rsplit_once(':') {
        let addr: std::net::Ipv4Addr = a
            .parse()
            .map_err(|_| anyhow::anyhow!("{a:?} is not an IPv4 address (ADDRESS:PORT)"))?;
        let port: u16 = p
            .parse()
            .map_err(|_| anyhow::anyhow!("{p:?} is not a port (ADDRESS:PORT)"))?;
        for pool in 0..pools {
            if let Some(sub) = nat.deterministic_subscriber(sluice_nat::PoolId(pool), addr, port) {
                println!("{addr}:{port} -> {sub}");
                return Ok(ExitCode::SUCCESS);
            }
        }
        println!("{addr}:{port}: no subscriber (not a pool endpoint of a subscriber's block)");
        return Ok(ExitCode::from(1));
    }
    let sub: std::net::Ipv4Addr = query.parse().map_err(|_| {
        anyhow::anyhow!("{query:?} is neither ADDRESS:PORT nor a subscriber's IPv4 address")
    })?;
    let mut found = false;
    for pool in 0..pools {
        if let Some((addr, ranges)) = nat.deterministic_block(sluice_nat::PoolId(pool), sub) {
            let ports: Vec<String> = ranges
                .iter()
                .enumerate()
                .map(|(w, (f, l))| {
                    if ranges.len() == 1 {
                        format!("ports {f}-{l}")
                    } else {
                        format!("worker {w}: ports {f}-{l}")
                    }
                })
                .collect();
            println!("{sub} -> {addr} {}", ports.join(", "));
            found = true;
        }
    }
    if !found {
        println!("{sub}: outside the subscriber prefix {base}/{len}");
        return Ok(ExitCode::from(1));
    }
    Ok(ExitCode::SUCCESS)
}
