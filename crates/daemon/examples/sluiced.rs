//! A small front end to the daemon library, for testing before the `sluice`
//! binary grows its `run` / `check` / `ctl` subcommands.
//!
//! ```text
//! sluiced run FILE [af_packet|af_xdp|auto]
//! sluiced check FILE
//! sluiced ctl SOCKET WORDS...      e.g. sluiced ctl /run/sluice.sock conntrack list proto tcp
//! ```

use std::path::Path;
use std::process::ExitCode;

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let words: Vec<&str> = args.iter().map(String::as_str).collect();
    let r: Result<(), String> = match words.as_slice() {
        ["run", file, rest @ ..] => {
            let backend = match rest.first() {
                Some(&"af_packet") => Some(sluice_daemon::config::BackendChoice::AfPacket),
                Some(&"af_xdp") => Some(sluice_daemon::config::BackendChoice::AfXdp),
                Some(&"auto") => Some(sluice_daemon::config::BackendChoice::Auto),
                _ => None,
            };
            let opts = sluice_daemon::RunOptions {
                backend,
                ..Default::default()
            };
            sluice_daemon::run(Path::new(file), &opts).map_err(|e| e.to_string())
        }
        ["check", file] => sluice_daemon::check(Path::new(file))
            .map(|s| println!("{s}"))
            .map_err(|e| e.to_string()),
        ["ctl", socket, rest @ ..] => sluice_daemon::ctl::request_from_args(&args[2..])
            .and_then(|req| sluice_daemon::ctl::client(Path::new(socket), &req))
            .map(|resp| println!("{resp}"))
            .map_err(|e| e.to_string())
            .map(|()| {
                let _ = rest;
            }),
        _ => Err("usage: sluiced run FILE [backend] | check FILE | ctl SOCKET WORDS...".into()),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
