//! `sluice check`, `sluice ruleset print` and `sluice trace`: glue between
//! files, the ruleset parsers, `sluice-policy` and the terminal.
//!
//! Exit codes: 0 success; 1 invalid rule set, or (trace) a bad packet line
//! or an evaluator mismatch; 2 usage or I/O errors (from `main`).

use std::fs;
use std::io::{BufRead, Write};
use std::path::Path;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::ValueEnum;
use serde::Serialize;
use serde_json::Value as Json;
use sluice_policy::{
    parse_ct, parse_hook, parse_proto, parse_tcp_flags, parse_u32, CompileError, CompiledPolicy,
    Interfaces, Trace, TracePacket,
};
use sluice_ruleset::{parse_ruleset_file, InputFormat, Ruleset};

/// Input syntax.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// nftables (`nft -f` syntax).
    Nft,
    /// iptables-restore / iptables-save.
    Iptables,
    /// ip6tables-restore / ip6tables-save.
    Ip6tables,
}

impl From<Format> for InputFormat {
    fn from(f: Format) -> Self {
        match f {
            Format::Nft => InputFormat::Nft,
            Format::Iptables => InputFormat::Iptables,
            Format::Ip6tables => InputFormat::Ip6tables,
        }
    }
}

/// Parses a rule set; `Ok(None)` after printing diagnostics to stderr.
fn load(path: &Path, format: Option<Format>, ipsets: Option<&Path>) -> Result<Option<Ruleset>> {
    // The file must be readable (a usage error, not a diagnostic).
    fs::metadata(path).with_context(|| format!("cannot read {}", path.display()))?;
    let sets = match ipsets {
        Some(p) => {
            Some(fs::read_to_string(p).with_context(|| format!("cannot read {}", p.display()))?)
        }
        None => None,
    };
    let parsed =
        parse_ruleset_file(path, format.map(InputFormat::from), sets.as_deref()).map(|(rs, _)| rs);
    match parsed {
        Ok(r) => Ok(Some(r)),
        Err(d) => {
            eprint!("{d}");
            Ok(None)
        }
    }
}

/// Renders lowering errors like parse diagnostics (source line and caret).
fn report_compile_error(e: &CompileError) {
    for le in &e.errors {
        let line = fs::read_to_string(&le.file)
            .ok()
            .and_then(|t| {
                t.lines()
                    .nth((le.line as usize).saturating_sub(1))
                    .map(str::to_string)
            })
            .unwrap_or_default();
        eprint!("{}", le.to_diagnostic(line));
    }
    if e.errors.len() > 1 {
        eprintln!("{} errors", e.errors.len());
    }
}

fn compile(
    path: &Path,
    format: Option<Format>,
    ipsets: Option<&Path>,
) -> Result<Option<CompiledPolicy>> {
    let Some(rs) = load(path, format, ipsets)? else {
        return Ok(None);
    };
    match CompiledPolicy::compile(&rs, &Interfaces::from_ruleset(&rs)) {
        Ok(p) => Ok(Some(p)),
        Err(e) => {
            report_compile_error(&e);
            Ok(None)
        }
    }
}

/// `sluice check`: parse, validate and lower.
pub fn check(path: &Path, format: Option<Format>, ipsets: Option<&Path>) -> Result<ExitCode> {
    Ok(match compile(path, format, ipsets)? {
        Some(_) => ExitCode::SUCCESS,
        None => ExitCode::from(1),
    })
}

/// `sluice ruleset print`: canonical nft text.
pub fn print(path: &Path, format: Option<Format>, ipsets: Option<&Path>) -> Result<ExitCode> {
    Ok(match load(path, format, ipsets)? {
        Some(rs) => {
            print!("{}", rs.to_nft());
            ExitCode::SUCCESS
        }
        None => ExitCode::from(1),
    })
}

/// `sluice trace`.
pub fn trace(
    path: &Path,
    format: Option<Format>,
    ipsets: Option<&Path>,
    packet: Option<&str>,
    packets: Option<&Path>,
) -> Result<ExitCode> {
    let Some(pol) = compile(path, format, ipsets)? else {
        return Ok(ExitCode::from(1));
    };
    if let Some(spec) = packet {
        let pkt = TracePacket::parse(spec).context("bad --packet")?;
        let t = pol.trace(&pkt);
        print!("{t}");
        return Ok(if t.mismatch.is_some() {
            ExitCode::from(1)
        } else {
            ExitCode::SUCCESS
        });
    }
    let Some(file) = packets else {
        anyhow::bail!("give --packet 'SPEC' or --packets FILE.jsonl");
    };
    let reader: Box<dyn BufRead> = if file == Path::new("-") {
        Box::new(std::io::stdin().lock())
    } else {
        Box::new(std::io::BufReader::new(
            fs::File::open(file).with_context(|| format!("cannot open {}", file.display()))?,
        ))
    };
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    let mut failed = false;
    // Dynamic sets carry from line to line (what `add @s` put in, a later
    // `ip saddr @s` sees), at each line's `time_ms`.
    let state = pol.trace_state();
    for (i, line) in reader.lines().enumerate() {
        let n = i + 1;
        let line = line.with_context(|| format!("{}: line {n}", file.display()))?;
        if line.trim().is_empty() {
            continue;
        }
        let json = match packet_from_json(&line) {
            Ok((pkt, now_ms)) => {
                let t = pol.trace_stateful(&pkt, &state, now_ms);
                if let Some(m) = &t.mismatch {
                    eprintln!("line {n}: evaluator mismatch: {m}");
                    failed = true;
                }
                serde_json::to_string(&TraceJson::from(&t))?
            }
            Err(e) => {
                failed = true;
                serde_json::json!({ "error": format!("line {n}: {e}") }).to_string()
            }
        };
        writeln!(out, "{json}")?;
    }
    out.flush()?;
    Ok(if failed {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

/// One result line of `--packets`.
#[derive(Serialize)]
struct TraceJson {
    verdict: &'static str,
    rule: Option<String>,
    nat: Option<NatJson>,
    /// Present only when the connection gets a second translation: the
    /// source one (`snat`, `masquerade`) after a `dnat` in `nat`.
    #[serde(skip_serializing_if = "Option::is_none")]
    nat_also: Option<NatJson>,
    mark: u32,
    /// Present (true) only when a `notrack` statement exempted the packet.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    untracked: bool,
    /// For an accepted new UDP packet, TCP SYN or ICMP echo request: the
    /// seconds its connection starts with (netfilter's default timers, or
    /// its `ct timeout` policy's).
    #[serde(skip_serializing_if = "Option::is_none")]
    timeout: Option<u32>,
    /// Present (true) only when a `ct timeout set` gave the connection a
    /// policy.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    ct_timeout: bool,
}

#[derive(Serialize)]
struct NatJson {
    #[serde(rename = "type")]
    kind: &'static str,
    addr: Option<String>,
    port: Option<u16>,
}

impl From<&sluice_policy::NatReport> for NatJson {
    fn from(n: &sluice_policy::NatReport) -> Self {
        NatJson {
            kind: n.kind.name(),
            addr: n.addr.map(|a| a.to_string()),
            port: n.port,
        }
    }
}

impl From<&Trace> for TraceJson {
    fn from(t: &Trace) -> Self {
        TraceJson {
            verdict: t.verdict.name(),
            rule: t.rule.clone(),
            nat: t.nat.as_ref().map(NatJson::from),
            nat_also: t.nat_all.get(1).map(NatJson::from),
            mark: t.mark,
            untracked: t.untracked,
            timeout: t.timeout,
            ct_timeout: t.ct_timeout,
        }
    }
}

const KEYS: &str =
    "time_ms, wall_time, hook, iif, oif, proto, src, sport, dst, dport, tcp_flags, ct, ct_status, mark, ctmark, type, code, ttl, length, dscp, pkttype, daddr_type, saddr_type, ether_saddr, ether_daddr, ct_direction, rpf";

/// Parses one `--packets` line: the packet and its `time_ms` (default 0),
/// the clock of the dynamic sets' timeouts and meters.
fn packet_from_json(line: &str) -> Result<(TracePacket, u64), String> {
    let v: Json = serde_json::from_str(line).map_err(|e| format!("invalid JSON: {e}"))?;
    let Json::Object(obj) = v else {
        return Err("expected a JSON object".to_string());
    };
    let mut p = TracePacket::default();
    let mut now_ms = 0;
    for (k, v) in &obj {
        let s = || match v {
            Json::String(s) => Ok(s.as_str()),
            _ => Err(format!("'{k}' must be a string")),
        };
        let num = |max: u64| -> Result<u64, String> {
            let n = match v {
                Json::Number(n) => n.as_u64(),
                Json::String(s) => parse_u32(s).ok().map(u64::from),
                _ => None,
            };
            n.filter(|n| *n <= max)
                .ok_or_else(|| format!("'{k}' must be a number from 0 to {max}"))
        };
        let e = |e: sluice_policy::PacketError| e.to_string();
        match k.as_str() {
            "time_ms" => {
                now_ms = match v {
                    Json::Number(n) => n.as_u64(),
                    _ => None,
                }
                .ok_or_else(|| format!("'{k}' must be a number of milliseconds"))?
            }
            "wall_time" => {
                p.wall_s = Some(match v {
                    Json::Number(n) => n
                        .as_u64()
                        .ok_or_else(|| format!("'{k}' must be seconds since 1970"))?,
                    _ => sluice_policy::parse_wall_time(s()?).map_err(e)?,
                })
            }
            "hook" => p.hook = parse_hook(s()?).map_err(e)?,
            "iif" => p.iif = Some(s()?.to_string()),
            "oif" => p.oif = Some(s()?.to_string()),
            "proto" => {
                p.proto = match v {
                    Json::Number(_) => num(255)? as u8,
                    _ => parse_proto(s()?).map_err(e)?,
                }
            }
            "src" | "dst" => {
                let a = s()?
                    .parse()
                    .map_err(|_| format!("'{k}' is not an IP address"))?;
                if k == "src" {
                    p.src = Some(a);
                } else {
                    p.dst = Some(a);
                }
            }
            "sport" => p.sport = num(65535)? as u16,
            "dport" => p.dport = num(65535)? as u16,
            "tcp_flags" => p.tcp_flags = parse_tcp_flags(s()?).map_err(e)?,
            "ct" => p.ct = parse_ct(s()?).map_err(e)?,
            "mark" => p.mark = num(u64::from(u32::MAX))? as u32,
            "ctmark" => p.ct_mark = num(u64::from(u32::MAX))? as u32,
            "ct_status" => {
                p.ct_status = Some(match v {
                    Json::Number(_) => num(u64::from(u32::MAX))? as u32,
                    _ => sluice_policy::parse_ct_status(s()?).map_err(e)?,
                })
            }
            "type" => p.icmp_type = num(255)? as u8,
            "code" => p.icmp_code = num(255)? as u8,
            "ttl" => p.ttl = num(255)? as u8,
            "length" => {
                p.length = Some(
                    match v {
                        Json::Number(_) => sluice_policy::parse_length(&num(65535)?.to_string()),
                        _ => sluice_policy::parse_length(s()?),
                    }
                    .map_err(e)?,
                )
            }
            "dscp" => {
                p.dscp = match v {
                    Json::Number(_) => sluice_policy::parse_dscp(&num(63)?.to_string()),
                    _ => sluice_policy::parse_dscp(s()?),
                }
                .map_err(e)?
            }
            "pkttype" => p.pkttype = sluice_policy::parse_pkttype(s()?).map_err(e)?,
            "ether_saddr" => p.ether.0 = sluice_policy::parse_mac(s()?).map_err(e)?,
            "ct_direction" => p.ct_dir = sluice_policy::parse_ct_direction(s()?).map_err(e)?,
            "rpf" => p.rpf = sluice_policy::parse_rpf(s()?).map_err(e)?,
            "ether_daddr" => p.ether.1 = sluice_policy::parse_mac(s()?).map_err(e)?,
            "daddr_type" | "saddr_type" => {
                let t = match v {
                    Json::Number(_) => sluice_policy::parse_addr_type(&num(11)?.to_string()),
                    _ => sluice_policy::parse_addr_type(s()?),
                }
                .map_err(e)?;
                if k == "daddr_type" {
                    p.daddr_type = Some(t);
                } else {
                    p.saddr_type = Some(t);
                }
            }
            _ => return Err(format!("unknown key '{k}' (keys: {KEYS})")),
        }
    }
    p.check().map_err(|e| e.to_string())?;
    Ok((p, now_ms))
}

#[cfg(test)]
mod tests {
    use super::*;

    use sluice_ruleset::detect_format as detect;

    #[test]
    fn detects_iptables_by_table_header() {
        assert_eq!(
            detect("*filter\n:INPUT ACCEPT [0:0]\nCOMMIT\n"),
            InputFormat::Iptables
        );
        assert_eq!(detect("table inet t {}\n"), InputFormat::Nft);
        assert_eq!(
            detect("# Generated by ip6tables-save v1.8.9\n*filter\nCOMMIT\n"),
            InputFormat::Ip6tables
        );
        assert_eq!(
            detect("*filter\n-A INPUT -s 2001:db8::/32 -j DROP\nCOMMIT\n"),
            InputFormat::Ip6tables
        );
        assert_eq!(
            detect("*filter\n-A INPUT -p ipv6-icmp -j ACCEPT\nCOMMIT\n"),
            InputFormat::Ip6tables
        );
        assert_eq!(
            detect(
                "# Generated by iptables-save\n*filter\n-A INPUT -s 10.0.0.0/8 -j DROP\nCOMMIT\n"
            ),
            InputFormat::Iptables
        );
    }

    #[test]
    fn json_packets_parse_and_bad_ones_explain() {
        let p = packet_from_json(
            r#"{"hook":"input","proto":"tcp","src":"10.0.0.2","sport":1234,"dst":"192.0.2.1","dport":80,"tcp_flags":"S","ct":"new","mark":7,"time_ms":1500}"#,
        );
        let (p, t) = p.unwrap_or_default();
        assert_eq!(t, 1500);
        assert_eq!(
            (p.proto, p.sport, p.dport, p.tcp_flags, p.mark),
            (6, 1234, 80, 2, 7)
        );
        assert!(packet_from_json("[1]").is_err());
        assert!(packet_from_json(r#"{"dport":70000}"#).is_err());
        assert!(packet_from_json(r#"{"dprot":1}"#).is_err());
        assert!(packet_from_json(r#"{"src":"10.0.0.1","dst":"::1"}"#).is_err());
        assert!(packet_from_json("{").is_err());
        assert!(packet_from_json(r#"{"time_ms":-1}"#).is_err());
        assert!(packet_from_json(r#"{"time_ms":"soon"}"#).is_err());
    }
}
