//! The control socket: a unix stream socket speaking line-delimited JSON.
//!
//! One request object per line, one response object per line:
//!
//! ```text
//! {"cmd":"status"}
//! {"cmd":"counters"}
//! {"cmd":"conntrack-list","proto":"tcp","addr":"10.0.0.2","port":80,"limit":100}
//! {"cmd":"conntrack-count"}
//! {"cmd":"conntrack-flush"}
//! {"cmd":"conntrack-flush","addr":"10.0.0.7"}
//! {"cmd":"ruleset-replace","path":"/etc/sluice/new.nft"}
//! {"cmd":"reload"}
//! ```
//!
//! Success is `{"ok":true,...}`; failure is
//! `{"ok":false,"error":{"kind":"...","message":"..."}}` with kind one of
//! `bad-request`, `ruleset`, `unsupported`, `internal`. A bad request never
//! closes the connection or stops the daemon.
//!
//! [`client`] sends one request and returns the response line;
//! [`request_from_args`] turns `sluice ctl` words into a request.

use core::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::io::{BufRead, BufReader, Write};
use std::os::fd::AsFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use sluice_conntrack::{Dir, Entry};
use sluice_engine::worker::{FlowInfo, FlowInfo6};
use sluice_wire::flow::{FlowKey4, FlowKey6};

/// Longest request line accepted.
pub const MAX_LINE: usize = 1 << 16;
/// Default `conntrack-list` limit.
pub const DEFAULT_LIMIT: usize = 1000;

/// A control-plane failure (client side).
#[derive(Debug, thiserror::Error)]
pub enum CtlError {
    /// Could not connect or talk to the socket.
    #[error("{path}: {reason}")]
    Socket {
        /// Socket path.
        path: String,
        /// What failed.
        reason: String,
    },
    /// The command words do not form a request.
    #[error("{0}")]
    Usage(String),
}

/// A parsed request.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(tag = "cmd", rename_all = "kebab-case", deny_unknown_fields)]
pub enum Request {
    /// Uptime, workers, interfaces and their stats.
    Status,
    /// Engine counters with drop reasons by name.
    Counters,
    /// Every counter in the Prometheus text format (`metrics`).
    Metrics,
    /// Who holds a NAT external endpoint (`ADDR:PORT`), or what an
    /// internal address holds (`ADDR`): live mappings and port blocks.
    NatLookup {
        /// `198.51.100.7:4500` or `10.0.0.2`.
        query: String,
        /// `tcp`, `udp`, `icmp` (endpoint queries only; default all).
        #[serde(default)]
        proto: Option<String>,
    },
    /// List connections.
    ConntrackList {
        /// `tcp`, `udp`, `icmp` or a protocol number.
        #[serde(default)]
        proto: Option<String>,
        /// Any address of either tuple.
        #[serde(default)]
        addr: Option<String>,
        /// Any port of either tuple.
        #[serde(default)]
        port: Option<u16>,
        /// The connection's state as `conntrack -L` names it
        /// (`ESTABLISHED`, `TIME_WAIT`, UDP's `UNREPLIED`, ...).
        #[serde(default)]
        state: Option<String>,
        /// Its `ct mark`: `VALUE` or `VALUE/MASK`.
        #[serde(default)]
        mark: Option<String>,
        /// Most entries returned (default [`DEFAULT_LIMIT`]).
        #[serde(default)]
        limit: Option<usize>,
    },
    /// Number of connections; with a filter, of those it selects (a walk
    /// of the tables).
    ConntrackCount {
        /// `tcp`, `udp`, `icmp` or a protocol number.
        #[serde(default)]
        proto: Option<String>,
        /// Any address of either tuple.
        #[serde(default)]
        addr: Option<String>,
        /// Any port of either tuple.
        #[serde(default)]
        port: Option<u16>,
        /// The connection's state as `conntrack -L` names it
        /// (`ESTABLISHED`, `TIME_WAIT`, UDP's `UNREPLIED`, ...).
        #[serde(default)]
        state: Option<String>,
        /// Its `ct mark`: `VALUE` or `VALUE/MASK`.
        #[serde(default)]
        mark: Option<String>,
    },
    /// Remove every connection (in bulk); with a filter, those it selects
    /// (a walk of the tables, in steps between the workers' batches),
    /// as netfilter's `conntrack -D` does.
    ConntrackFlush {
        /// `tcp`, `udp`, `icmp` or a protocol number.
        #[serde(default)]
        proto: Option<String>,
        /// Any address of either tuple.
        #[serde(default)]
        addr: Option<String>,
        /// Any port of either tuple.
        #[serde(default)]
        port: Option<u16>,
        /// The connection's state as `conntrack -L` names it
        /// (`ESTABLISHED`, `TIME_WAIT`, UDP's `UNREPLIED`, ...).
        #[serde(default)]
        state: Option<String>,
        /// Its `ct mark`: `VALUE` or `VALUE/MASK`.
        #[serde(default)]
        mark: Option<String>,
    },
    /// Replace the ruleset from an nft file, atomically.
    RulesetReplace {
        /// The nft file.
        path: String,
    },
    /// Reload the configuration file and its ruleset (as SIGHUP).
    Reload,
    /// What a reload would apply and what would need a restart, without
    /// reloading (`reload check`).
    ReloadCheck,
    /// The running rule set in nft syntax, with live counters.
    RulesetList,
    /// One nft command applied incrementally: `add rule …`, `insert rule …`
    /// (optionally `position HANDLE` or `index N`), `delete rule … handle H`,
    /// `add element …`, `delete element …`, `flush set …`.
    Nft {
        /// The command, in nft syntax.
        command: String,
    },
    /// The commands of a file, one per line (blank lines and `#` comments
    /// skipped), applied as one change: each to the generation the ones
    /// before it made, and the result published once; a failing line
    /// publishes nothing (`sluice ctl nft -f FILE`).
    NftFile {
        /// The file (read by the daemon, resolved in its working directory).
        path: String,
    },
    /// The live elements of the dynamic sets (or of one).
    SetList {
        /// Only this set (`"inet filter denylist"` or just `"denylist"`).
        #[serde(default)]
        set: Option<String>,
    },
    /// The named counters and quotas with their live values
    /// (`counter list`, `quota list`), or set back to zero (`reset`).
    ObjectList {
        /// `"counter"` or `"quota"`; both when absent.
        #[serde(default)]
        kind: Option<String>,
        /// Only this object (`"inet filter http"`, `"filter http"` or
        /// `"http"`).
        #[serde(default)]
        name: Option<String>,
        /// Reset the listed objects to zero (the values listed are the
        /// ones before).
        #[serde(default)]
        reset: bool,
    },
    /// The running rules with their handles.
    RuleList {
        /// Only this chain (`"inet filter forward"` or just `"forward"`).
        #[serde(default)]
        chain: Option<String>,
    },
}

/// An error answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CtlFailure {
    /// Machine-readable kind.
    pub kind: &'static str,
    /// Human-readable message.
    pub message: String,
}

impl CtlFailure {
    /// A `bad-request` failure.
    pub fn bad(message: impl Into<String>) -> Self {
        Self {
            kind: "bad-request",
            message: message.into(),
        }
    }

    /// The JSON line.
    pub fn to_json(&self) -> Value {
        json!({"ok": false, "error": {"kind": self.kind, "message": self.message}})
    }
}

/// Parse one request line.
pub fn parse_request(line: &str) -> Result<Request, CtlFailure> {
    // Straight into the request type when that works and there is no unit
    // variant to check for extra keys (the common `nft`, `ruleset-replace`
    // requests): one pass over the line instead of two. Anything else takes
    // the path below, which words the errors.
    if let Ok(r) = serde_json::from_str::<Request>(line) {
        if !matches!(
            r,
            Request::Status | Request::Counters | Request::Reload | Request::ReloadCheck
        ) {
            return Ok(r);
        }
    }
    let v: Value =
        serde_json::from_str(line).map_err(|e| CtlFailure::bad(format!("not JSON: {e}")))?;
    if !v.is_object() {
        return Err(CtlFailure::bad("a request is a JSON object with a \"cmd\""));
    }
    let Some(cmd) = v.get("cmd").and_then(Value::as_str) else {
        return Err(CtlFailure::bad("missing \"cmd\" (a string)"));
    };
    // serde ignores extra keys on unit variants of a tagged enum; refuse them.
    if matches!(cmd, "status" | "counters" | "reload" | "reload-check") {
        if let Some(k) = v
            .as_object()
            .and_then(|o| o.keys().find(|k| k.as_str() != "cmd"))
        {
            return Err(CtlFailure::bad(format!(
                "unknown field `{k}`: {cmd} takes no arguments"
            )));
        }
    }
    serde_json::from_value(v).map_err(|e| CtlFailure::bad(e.to_string()))
}

/// Connection-list filter.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CtFilter {
    /// Protocol number.
    pub proto: Option<u8>,
    /// Address on either side of either tuple.
    pub addr: Option<IpAddr>,
    /// Port on either side of either tuple.
    pub port: Option<u16>,
    /// State name, as `conntrack -L` prints it (one of [`STATE_NAMES`]).
    pub state: Option<&'static str>,
    /// `ct mark` value and mask: `mark & mask == value`.
    pub mark: Option<(u32, u32)>,
}

/// The state names a filter takes (netfilter's TCP states, UDP's three).
pub const STATE_NAMES: [&str; 13] = [
    "NONE",
    "SYN_SENT",
    "SYN_RECV",
    "ESTABLISHED",
    "FIN_WAIT",
    "CLOSE_WAIT",
    "LAST_ACK",
    "TIME_WAIT",
    "CLOSE",
    "SYN_SENT2",
    "UNREPLIED",
    "REPLIED",
    "STREAM",
];

impl CtFilter {
    /// Build a filter from request fields.
    pub fn new(
        proto: Option<&str>,
        addr: Option<&str>,
        port: Option<u16>,
    ) -> Result<Self, CtlFailure> {
        let proto = proto
            .map(|p| match p {
                "tcp" => Ok(6),
                "udp" => Ok(17),
                "icmp" => Ok(1),
                "icmpv6" | "ipv6-icmp" => Ok(58),
                n => n.parse::<u8>().map_err(|_| {
                    CtlFailure::bad(format!(
                        "proto: {n:?} is not tcp, udp, icmp or a protocol number"
                    ))
                }),
            })
            .transpose()?;
        let addr = addr
            .map(|a| {
                a.parse::<IpAddr>()
                    .map_err(|_| CtlFailure::bad(format!("addr: {a:?} is not an IP address")))
            })
            .transpose()?;
        Ok(Self {
            proto,
            addr,
            port,
            state: None,
            mark: None,
        })
    }

    /// The filter also selecting by state (`ESTABLISHED`, any case) and
    /// `ct mark` (`VALUE` or `VALUE/MASK`, decimal or `0x` hex).
    pub fn with(mut self, state: Option<&str>, mark: Option<&str>) -> Result<Self, CtlFailure> {
        if let Some(st) = state {
            let name = STATE_NAMES
                .iter()
                .find(|n| n.eq_ignore_ascii_case(st))
                .ok_or_else(|| {
                    CtlFailure::bad(format!(
                        "state: {st:?} is not one of {}",
                        STATE_NAMES.join(", ")
                    ))
                })?;
            self.state = Some(name);
        }
        if let Some(m) = mark {
            let num = |t: &str| -> Option<u32> {
                match t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
                    Some(h) => u32::from_str_radix(h, 16).ok(),
                    None => t.parse().ok(),
                }
            };
            let (v, mask) = match m.split_once('/') {
                Some((v, k)) => (num(v), num(k)),
                None => (num(m), Some(u32::MAX)),
            };
            let (Some(v), Some(mask)) = (v, mask) else {
                return Err(CtlFailure::bad(format!(
                    "mark: {m:?} is not VALUE or VALUE/MASK (32-bit numbers, 0x for hex)"
                )));
            };
            self.mark = Some((v & mask, mask));
        }
        Ok(self)
    }

    /// Whether a connection's state and mark pass.
    fn state_and_mark(&self, state: &str, mark: u32) -> bool {
        self.state.is_none_or(|s| s == state) && self.mark.is_none_or(|(v, m)| mark & m == v)
    }

    /// Selects every connection.
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }

    /// [`Self::matches`] on an IPv4 table entry itself (no listing built:
    /// what a filtered flush or count walks with).
    pub fn matches4(&self, e: &Entry<FlowKey4, FlowInfo>) -> bool {
        let t = [e.orig(), e.reply()];
        self.proto.is_none_or(|p| p == e.proto())
            && self.addr.is_none_or(|a| match a {
                IpAddr::V4(a) => {
                    let a = u32::from(a);
                    t.iter().any(|k| k.src == a || k.dst == a)
                }
                IpAddr::V6(_) => false,
            })
            && self
                .port
                .is_none_or(|p| t.iter().any(|k| k.sport == p || k.dport == p))
            && self.state_and_mark(e.state().name(), e.mark())
    }

    /// [`Self::matches`] on an IPv6 table entry itself.
    pub fn matches6(&self, e: &Entry<FlowKey6, FlowInfo6>) -> bool {
        let t = [e.orig(), e.reply()];
        self.proto.is_none_or(|p| p == e.orig().proto)
            && self.addr.is_none_or(|a| match a {
                IpAddr::V6(a) => {
                    let a = u128::from(a);
                    t.iter().any(|k| k.src == a || k.dst == a)
                }
                IpAddr::V4(_) => false,
            })
            && self
                .port
                .is_none_or(|p| t.iter().any(|k| k.sport == p || k.dport == p))
            && self.state_and_mark(e.state().name(), e.mark())
    }

    /// Whether `e` passes.
    pub fn matches(&self, e: &CtEntry) -> bool {
        let tuples = [&e.orig, &e.reply];
        self.proto.is_none_or(|p| p == e.proto)
            && self
                .addr
                .is_none_or(|a| tuples.iter().any(|t| t.src == a || t.dst == a))
            && self
                .port
                .is_none_or(|p| tuples.iter().any(|t| t.sport == p || t.dport == p))
            && self.state_and_mark(e.state_name, e.mark)
    }
}

/// One direction's tuple.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Tuple {
    /// Source address.
    pub src: IpAddr,
    /// Source port / ICMP id.
    pub sport: u16,
    /// Destination address.
    pub dst: IpAddr,
    /// Destination port / ICMP id.
    pub dport: u16,
}

impl From<&FlowKey4> for Tuple {
    fn from(k: &FlowKey4) -> Self {
        Self {
            src: Ipv4Addr::from(k.src).into(),
            sport: k.sport,
            dst: Ipv4Addr::from(k.dst).into(),
            dport: k.dport,
        }
    }
}

impl From<&FlowKey6> for Tuple {
    fn from(k: &FlowKey6) -> Self {
        Self {
            src: Ipv6Addr::from(k.src).into(),
            sport: k.sport,
            dst: Ipv6Addr::from(k.dst).into(),
            dport: k.dport,
        }
    }
}

/// A connection as listed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CtEntry {
    /// Owning worker.
    pub worker: u16,
    /// Protocol number.
    pub proto: u8,
    /// Protocol state.
    pub state: String,
    /// The state as netfilter's `conntrack -L` names it (`ESTABLISHED`,
    /// `TIME_WAIT`, ...; UDP `UNREPLIED`, `REPLIED`, `STREAM`; empty for
    /// ICMP and other protocols).
    pub state_name: &'static str,
    /// A packet of the reply direction was seen.
    pub seen_reply: bool,
    /// Original direction (as sent by the initiator).
    pub orig: Tuple,
    /// Reply direction (as it arrives, after NAT).
    pub reply: Tuple,
    /// Seen traffic both ways and stable.
    pub assured: bool,
    /// Packets counted by the engine.
    pub packets: u32,
    /// `ct mark`.
    pub mark: u32,
    /// Seconds until expiry (an offloaded connection's expiry moves when
    /// the GC finds it was used, see `offload_packets`).
    pub expires_in: u64,
    /// Forwarded by the XDP offload (`xdp_offload`) in some direction.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub offloaded: bool,
    /// Packets the XDP offload forwarded, both directions.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub offload_packets: Option<u64>,
    /// In a flowtable (`flow add @ft`): its packets skip the filter chains.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub flowtable: bool,
    /// Its `ct timeout` policy's slot (0: none; see
    /// `sluice_engine::ct_timeout`), named in [`Self::timeout_policy`].
    #[serde(skip)]
    pub timeout_slot: u8,
    /// The `ct timeout` object it follows, `"FAMILY TABLE NAME"` (or, for
    /// a policy the running rule set no longer has, `"(policy of an
    /// earlier rule set)"`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeout_policy: Option<String>,
}

impl CtEntry {
    /// Build from a table entry.
    pub fn of(
        worker: u16,
        e: &Entry<FlowKey4, FlowInfo>,
        now: sluice_conntrack::Instant,
    ) -> Option<Self> {
        Some(Self {
            worker,
            proto: e.proto(),
            state: format!("{:?}", e.state()),
            state_name: e.state().name(),
            seen_reply: e.seen_reply(),
            orig: (&e.orig()).into(),
            reply: (&e.reply()).into(),
            assured: e.is_assured(),
            packets: e.packets(),
            mark: e.mark(),
            expires_in: e.expires_in(now).as_secs(),
            offloaded: e.is_offloaded(Dir::Original) || e.is_offloaded(Dir::Reply),
            offload_packets: None,
            flowtable: e.in_flowtable(),
            timeout_slot: e.timeout_policy(),
            timeout_policy: None,
        })
    }

    /// Build from an IPv6 table entry.
    pub fn of6(
        worker: u16,
        e: &Entry<FlowKey6, FlowInfo6>,
        now: sluice_conntrack::Instant,
    ) -> Option<Self> {
        Some(Self {
            worker,
            proto: e.orig().proto,
            state: format!("{:?}", e.state()),
            state_name: e.state().name(),
            seen_reply: e.seen_reply(),
            orig: (&e.orig()).into(),
            reply: (&e.reply()).into(),
            assured: e.is_assured(),
            packets: e.packets(),
            mark: e.mark(),
            expires_in: e.expires_in(now).as_secs(),
            offloaded: e.is_offloaded(Dir::Original) || e.is_offloaded(Dir::Reply),
            offload_packets: None,
            flowtable: e.in_flowtable(),
            timeout_slot: e.timeout_policy(),
            timeout_policy: None,
        })
    }
}

/// A `conntrack list` answer as `conntrack -L` prints connections, one line
/// each (`sluice ctl --text`): protocol name and number, seconds to
/// expiry, the TCP state, the original tuple, `[UNREPLIED]` until a reply
/// was seen, the reply tuple (translated), `[ASSURED]`, then Sluice's own
/// `[OFFLOAD]` (with `offload_packets=`), `[FLOWTABLE]`, `timeout_policy="..."`
/// (a `ct timeout` object), `packets=` and `worker=`. ICMP tuples show their identifier as `id=`. `None` when
/// the answer is not a listing.
pub fn conntrack_text(answer: &Value) -> Option<String> {
    let conns = answer.get("connections")?.as_array()?;
    let mut out = String::new();
    for c in conns {
        let proto = c["proto"].as_u64().unwrap_or(0);
        let name = match proto {
            6 => "tcp",
            17 => "udp",
            1 => "icmp",
            58 => "icmpv6",
            _ => "unknown",
        };
        let tuple = |t: &Value| {
            let (s, d) = (
                t["src"].as_str().unwrap_or("?"),
                t["dst"].as_str().unwrap_or("?"),
            );
            if matches!(proto, 1 | 58) {
                format!("src={s} dst={d} id={}", t["sport"])
            } else {
                format!("src={s} dst={d} sport={} dport={}", t["sport"], t["dport"])
            }
        };
        let mut line = format!("{name:<8} {proto} {} ", c["expires_in"]);
        if proto == 6 {
            if let Some(st) = c["state_name"].as_str().filter(|s| !s.is_empty()) {
                line.push_str(st);
                line.push(' ');
            }
        }
        line.push_str(&tuple(&c["orig"]));
        if c["seen_reply"] == false {
            line.push_str(" [UNREPLIED]");
        }
        line.push(' ');
        line.push_str(&tuple(&c["reply"]));
        if c["assured"] == true {
            line.push_str(" [ASSURED]");
        }
        if c["offloaded"] == true {
            line.push_str(" [OFFLOAD]");
            if let Some(n) = c["offload_packets"].as_u64() {
                line.push_str(&format!(" offload_packets={n}"));
            }
        }
        if c["flowtable"] == true {
            line.push_str(" [FLOWTABLE]");
        }
        if let Some(m) = c["mark"].as_u64().filter(|m| *m != 0) {
            line.push_str(&format!(" mark={m}"));
        }
        if let Some(p) = c["timeout_policy"].as_str() {
            line.push_str(&format!(" timeout_policy=\"{p}\""));
        }
        line.push_str(&format!(
            " packets={} worker={}\n",
            c["packets"], c["worker"]
        ));
        out.push_str(&line);
    }
    Some(out)
}

/// Send `request` (one JSON object) to the daemon at `socket` and return its
/// one-line JSON response.
pub fn client(socket: &Path, request: &str) -> Result<String, CtlError> {
    let err = |reason: String| CtlError::Socket {
        path: socket.display().to_string(),
        reason,
    };
    let mut s = UnixStream::connect(socket).map_err(|e| err(format!("connect: {e}")))?;
    s.set_read_timeout(Some(Duration::from_secs(30)))
        .map_err(|e| err(e.to_string()))?;
    let line = request.trim().replace('\n', " ");
    s.write_all(format!("{line}\n").as_bytes())
        .map_err(|e| err(format!("write: {e}")))?;
    sluice_io::spin::wait_readable(s.as_fd(), SPIN);
    let mut r = BufReader::new(s);
    let mut out = String::new();
    r.read_line(&mut out)
        .map_err(|e| err(format!("read: {e}")))?;
    if out.is_empty() {
        return Err(err("the daemon closed the connection".into()));
    }
    Ok(out.trim_end().to_string())
}

/// Turn `sluice ctl` words into a request line:
/// `status`, `counters`, `metrics`, `nat lookup ADDR[:PORT] [proto P]`, `conntrack list [proto P] [addr A] [port N] [limit N]`,
/// `conntrack count`, `conntrack flush`, `ruleset replace FILE`, `ruleset
/// list`, `reload`, `reload check`,
/// `rule list [CHAIN]`, `set list [SET]`, `counter list|reset [NAME]`,
/// `quota list|reset [NAME]`, `nft COMMAND…` (`add rule …`, `insert rule …`,
/// `delete rule … handle H`, `add element …`, `delete element …`; the words
/// are joined with spaces, so quoting the command is optional).
pub fn request_from_args(args: &[String]) -> Result<String, CtlError> {
    let usage = || {
        CtlError::Usage(
            "usage: status | counters | metrics | nat lookup ADDR[:PORT] [proto P] | conntrack list [proto P] [addr A] [port N] [state S] [mark M[/MASK]] [limit N] | conntrack count|flush [proto P] [addr A] [port N] [state S] [mark M[/MASK]] | ruleset replace FILE | ruleset list | reload | reload check | rule list [CHAIN] | set list [SET] | counter|quota|limit list|reset [NAME] | nft add|insert|delete rule ... | nft add|delete element ... | nft flush set ..."
                .into(),
        )
    };
    let words: Vec<&str> = args.iter().map(String::as_str).collect();
    let v = match words.as_slice() {
        ["status"] => json!({"cmd": "status"}),
        ["counters"] => json!({"cmd": "counters"}),
        ["metrics"] => json!({"cmd": "metrics"}),
        ["nat", "lookup", q] => json!({"cmd": "nat-lookup", "query": q}),
        ["nat", "lookup", q, "proto", p] => json!({"cmd": "nat-lookup", "query": q, "proto": p}),
        ["reload"] => json!({"cmd": "reload"}),
        ["reload", "check"] => json!({"cmd": "reload-check"}),
        ["ruleset", "list"] => json!({"cmd": "ruleset-list"}),
        ["rule", "list"] => json!({"cmd": "rule-list"}),
        ["set", "list"] => json!({"cmd": "set-list"}),
        ["set", "list", set @ ..] if !set.is_empty() => {
            json!({"cmd": "set-list", "set": set.join(" ")})
        }
        [kind @ ("counter" | "quota" | "limit"), op @ ("list" | "reset"), name @ ..] => {
            let mut m = serde_json::Map::new();
            m.insert("cmd".into(), json!("object-list"));
            m.insert("kind".into(), json!(kind));
            if !name.is_empty() {
                m.insert("name".into(), json!(name.join(" ")));
            }
            if *op == "reset" {
                m.insert("reset".into(), json!(true));
            }
            Value::Object(m)
        }
        ["rule", "list", chain @ ..] if !chain.is_empty() => {
            json!({"cmd": "rule-list", "chain": chain.join(" ")})
        }
        ["nft", "-f", path] => {
            // The daemon reads the file, in its own working directory.
            let p = std::fs::canonicalize(path).unwrap_or_else(|_| Path::new(path).to_path_buf());
            json!({"cmd": "nft-file", "path": p.display().to_string()})
        }
        ["nft", command @ ..] if !command.is_empty() => {
            json!({"cmd": "nft", "command": command.join(" ")})
        }
        ["conntrack", op @ ("count" | "flush"), rest @ ..] => {
            let mut m = serde_json::Map::new();
            m.insert("cmd".into(), json!(format!("conntrack-{op}")));
            for kv in rest.chunks(2) {
                let [k, v] = kv else { return Err(usage()) };
                let val = match *k {
                    "proto" | "addr" | "state" | "mark" => json!(v),
                    "port" => json!(v
                        .parse::<u64>()
                        .map_err(|_| CtlError::Usage(format!("{k}: {v:?} is not a number")))?),
                    _ => return Err(usage()),
                };
                m.insert((*k).into(), val);
            }
            Value::Object(m)
        }
        ["ruleset", "replace", path] => {
            // The daemon resolves the path in its own working directory.
            let p = std::fs::canonicalize(path).unwrap_or_else(|_| Path::new(path).to_path_buf());
            json!({"cmd": "ruleset-replace", "path": p.display().to_string()})
        }
        ["conntrack", "list", rest @ ..] => {
            let mut m = serde_json::Map::new();
            m.insert("cmd".into(), json!("conntrack-list"));
            let mut it = rest.chunks(2);
            for kv in &mut it {
                let [k, v] = kv else { return Err(usage()) };
                let val = match *k {
                    "proto" | "addr" | "state" | "mark" => json!(v),
                    "port" | "limit" => json!(v
                        .parse::<u64>()
                        .map_err(|_| CtlError::Usage(format!("{k}: {v:?} is not a number")))?),
                    _ => return Err(usage()),
                };
                m.insert((*k).into(), val);
            }
            Value::Object(m)
        }
        _ => return Err(usage()),
    };
    Ok(v.to_string())
}

/// Serve the control socket until `stop` is set; `handle` answers one
/// request.
///
/// The first request of a connection is answered on the accepting thread
/// itself, which saves a thread start and a wake-up on the latency of every
/// `sluice ctl` call (one request per connection). A client that sends
/// nothing within [`INLINE_WAIT`], and any later requests on the same
/// connection, are served on a thread of their own, so a stuck client never
/// holds up the others for longer than that.
pub fn serve(
    listener: UnixListener,
    stop: &std::sync::atomic::AtomicBool,
    handle: &(dyn Fn(Request) -> Value + Sync),
) {
    use std::sync::atomic::Ordering;
    // Blocking accept: a request is served as soon as it arrives. Whoever
    // sets `stop` wakes this loop by connecting once ([`wake`]).
    if let Err(e) = listener.set_nonblocking(false) {
        tracing::error!("control socket: {e}");
        return;
    }
    std::thread::scope(|sc| {
        while !stop.load(Ordering::Relaxed) {
            match listener.accept() {
                Ok((conn, _)) => {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    let Some(mut c) = Conn::new(conn) else {
                        continue;
                    };
                    // Most clients (`sluice ctl`, scripts) send one request
                    // and close once they have the answer: wait briefly for
                    // that close so no thread is started for them.
                    let first = c.serve_one(stop, handle, INLINE_WAIT);
                    let next = match first {
                        Step::Served => c.wait_close(CLOSE_WAIT),
                        other => other,
                    };
                    match next {
                        Step::Closed => {}
                        Step::Served | Step::Idle => {
                            sc.spawn(move || c.serve(stop, handle));
                        }
                    }
                }
                Err(e) => {
                    tracing::warn!("control socket accept: {e}");
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
        }
    });
}

/// How long the accepting thread waits for a connection's first request
/// before handing the connection to a thread of its own.
pub const INLINE_WAIT: Duration = Duration::from_millis(50);

/// How long the accepting thread waits, after answering a connection's
/// first request, for the client to close before it hands the connection to
/// a thread of its own.
pub const CLOSE_WAIT: Duration = Duration::from_millis(2);

/// How long either side of a control connection polls for the other's next
/// line before it blocks (`sluice_io::spin::wait_readable`): the daemon for
/// the next request on a connection, a client for the answer. A burst of
/// requests (seed 002's appends) then never lets a vCPU halt between two
/// of them; an isolated request costs at most this much CPU on each side.
pub const SPIN: Duration = Duration::from_micros(500);

/// A request that makes the daemon read a file (`ruleset replace FILE`,
/// `nft -f FILE`) reads it with the daemon's privileges, and a rule set's
/// diagnostics quote the lines they find wrong: from a client that is
/// neither root nor the daemon's own user (a member of
/// `control_socket_group`), it could read any file the daemon can. Such a
/// request is refused (`None`: allowed); everything else is open to every
/// client that may connect.
pub fn file_refusal(req: &Request, peer: Option<u32>, own: u32) -> Option<CtlFailure> {
    let (what, path) = match req {
        Request::RulesetReplace { path } => ("ruleset replace", path),
        Request::NftFile { path } => ("nft -f", path),
        _ => return None,
    };
    match peer {
        Some(0) => None,
        Some(u) if u == own => None,
        Some(u) => Some(CtlFailure::bad(format!(
            "{what} {path}: the gateway reads the file with its own privileges, so a client \
             that is not root (uid {u}) may not name one; run it as root, or send the changes \
             one command at a time (sluice ctl nft ...)"
        ))),
        None => Some(CtlFailure::bad(format!(
            "{what} {path}: the client's user is unknown (no SO_PEERCRED), so it may not name a file"
        ))),
    }
}

/// Wakes [`serve`] after its `stop` flag was set.
pub fn wake(socket: &Path) {
    let _ = UnixStream::connect(socket);
}

/// A read that ended without data or end of stream: the read timeout
/// passed or a signal interrupted it.
fn no_data_yet(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::WouldBlock
            | std::io::ErrorKind::TimedOut
            | std::io::ErrorKind::Interrupted
    )
}

/// One control connection: a line reader (the partial line survives a
/// hand-over between threads) and the writing half.
struct Conn {
    r: BufReader<UnixStream>,
    w: UnixStream,
    /// The client's user id (`SO_PEERCRED`).
    peer: Option<u32>,
    buf: Vec<u8>,
    /// The socket's read timeout as last set ([`Conn::read_timeout`]).
    timeout: Option<Duration>,
}

/// What [`Conn::serve_one`] did.
enum Step {
    /// A request was answered.
    Served,
    /// Nothing complete arrived in time.
    Idle,
    /// The client closed the connection (or it failed).
    Closed,
}

impl Conn {
    fn new(conn: UnixStream) -> Option<Conn> {
        let _ = conn.set_nonblocking(false);
        let w = conn.try_clone().ok()?;
        let peer = sluice_io::unixsock::peer_uid(&conn);
        Some(Conn {
            r: BufReader::new(conn),
            w,
            peer,
            buf: Vec::new(),
            timeout: None,
        })
    }

    /// Makes the next read wait at most about `left`: the timeout already
    /// set is kept when it lies between half of `left` and an eighth over it
    /// (a request on a busy connection costs no `setsockopt`), else it is
    /// set to `left`. False if the socket refuses.
    fn read_timeout(&mut self, left: Duration) -> bool {
        if self
            .timeout
            .is_some_and(|t| t >= left / 2 && t <= left + left / 8)
        {
            return true;
        }
        if self.r.get_ref().set_read_timeout(Some(left)).is_err() {
            return false;
        }
        self.timeout = Some(left);
        true
    }

    /// Waits up to `wait` for the client to close. Anything it sends
    /// instead stays buffered for [`Conn::serve`]: `Served` if a byte
    /// arrived, `Idle` if nothing did.
    fn wait_close(&mut self, wait: Duration) -> Step {
        if !self.r.buffer().is_empty() {
            return Step::Served;
        }
        if sluice_io::spin::wait_readable(self.r.get_ref().as_fd(), SPIN.min(wait))
            == sluice_io::spin::Readiness::Closed
        {
            return Step::Closed;
        }
        if !self.read_timeout(wait) {
            return Step::Closed;
        }
        match self.r.fill_buf() {
            Ok([]) => Step::Closed,
            Ok(_) => Step::Served,
            Err(e) if no_data_yet(&e) => Step::Idle,
            Err(_) => Step::Closed,
        }
    }

    /// Serves requests until the client closes or `stop` is set.
    fn serve(
        mut self,
        stop: &std::sync::atomic::AtomicBool,
        handle: &(dyn Fn(Request) -> Value + Sync),
    ) {
        use std::sync::atomic::Ordering;
        while !stop.load(Ordering::Relaxed) {
            if let Step::Closed = self.serve_one(stop, handle, Duration::from_millis(200)) {
                return;
            }
        }
    }

    /// Reads one line (bounded by [`MAX_LINE`]) for at most `wait` and
    /// answers it.
    ///
    /// The read timeout is set only before a read that reaches the socket
    /// (the buffer is empty), not per byte, and only when the one already
    /// set does not fit ([`Conn::read_timeout`]): one `read` for a typical
    /// request on a kept connection.
    fn serve_one(
        &mut self,
        stop: &std::sync::atomic::AtomicBool,
        handle: &(dyn Fn(Request) -> Value + Sync),
        wait: Duration,
    ) -> Step {
        use std::sync::atomic::Ordering;
        let deadline = std::time::Instant::now() + wait;
        loop {
            if self.r.buffer().is_empty() {
                let left = deadline.saturating_duration_since(std::time::Instant::now());
                if left.is_zero() || stop.load(Ordering::Relaxed) {
                    return Step::Idle;
                }
                // Poll briefly first ([`SPIN`]); a closed peer is found by
                // the read below.
                sluice_io::spin::wait_readable(self.r.get_ref().as_fd(), SPIN.min(left));
                if !self.read_timeout(left) {
                    return Step::Closed;
                }
            }
            let chunk = match self.r.fill_buf() {
                Ok([]) => return Step::Closed,
                Ok(b) => b,
                Err(e) if no_data_yet(&e) => continue,
                Err(_) => return Step::Closed,
            };
            let (line, used, complete) = match chunk.iter().position(|&b| b == b'\n') {
                Some(i) => (&chunk[..i], i + 1, true),
                None => (chunk, chunk.len(), false),
            };
            let room = MAX_LINE.saturating_sub(self.buf.len());
            self.buf.extend_from_slice(&line[..line.len().min(room)]);
            self.r.consume(used);
            if !complete {
                continue;
            }
            let resp = if self.buf.len() >= MAX_LINE {
                CtlFailure::bad(format!("request longer than {MAX_LINE} bytes")).to_json()
            } else {
                match std::str::from_utf8(&self.buf) {
                    Ok(l) if l.trim().is_empty() => {
                        self.buf.clear();
                        continue;
                    }
                    Ok(l) => match parse_request(l) {
                        Ok(req) => match file_refusal(&req, self.peer, sluice_io::unixsock::euid())
                        {
                            Some(f) => f.to_json(),
                            None => handle(req),
                        },
                        Err(f) => f.to_json(),
                    },
                    Err(_) => CtlFailure::bad("request is not UTF-8").to_json(),
                }
            };
            self.buf.clear();
            let mut out = resp.to_string().into_bytes();
            out.push(b'\n');
            if self.w.write_all(&out).is_err() {
                return Step::Closed;
            }
            return Step::Served;
        }
    }
}

#[cfg(test)]
mod tests {
    /// The filters a walk uses on table entries select exactly what the
    /// listing filter selects on their listings, for every combination of
    /// protocol, address (either tuple, either side, either family) and
    /// port.
    #[test]
    fn raw_matchers_agree_with_the_listing_filter() {
        use sluice_conntrack::{Config, Instant, Table};
        let now = Instant::from_millis(1);
        let mut t4: Table<FlowKey4, FlowInfo> = Table::new(Config::new(64, 1)).expect("table");
        let mut t6: Table<FlowKey6, FlowInfo6> = Table::new(Config::new(64, 2)).expect("table");
        let k4 = |src: [u8; 4], sport: u16, dst: [u8; 4], dport: u16, proto: u8| FlowKey4 {
            src: u32::from_be_bytes(src),
            dst: u32::from_be_bytes(dst),
            sport,
            dport,
            proto,
        };
        // A translated connection (its reply tuple has the pool address)
        // and a plain one.
        let orig = k4([10, 0, 0, 2], 4000, [203, 0, 113, 2], 53, 17);
        let reply = k4([203, 0, 113, 2], 53, [198, 51, 100, 7], 61000, 17);
        t4.insert(now, orig, reply, FlowInfo::default(), &mut |_| {})
            .expect("insert");
        let plain = k4([10, 0, 0, 3], 5000, [203, 0, 113, 9], 80, 6);
        let id = t4
            .insert(
                now,
                plain,
                plain.reversed(),
                FlowInfo::default(),
                &mut |_| {},
            )
            .expect("insert");
        // A SYN_SENT connection with a mark.
        t4.track(
            id,
            sluice_conntrack::Dir::Original,
            now,
            sluice_conntrack::L4Event::Tcp(sluice_conntrack::TcpFlags(0x02)),
        );
        t4.entry_mut(id).set_mark(0x5);
        let k6 = FlowKey6::new(
            6,
            "fd00::2".parse().expect("ip"),
            4000,
            "2001:db8::9".parse().expect("ip"),
            443,
        );
        t6.insert(now, k6, k6.reversed(), FlowInfo6::default(), &mut |_| {})
            .expect("insert");
        let protos = [None, Some("tcp"), Some("udp"), Some("17")];
        let addrs = [
            None,
            Some("10.0.0.2"),
            Some("198.51.100.7"),
            Some("203.0.113.9"),
            Some("2001:db8::9"),
            Some("fd00::2"),
            Some("::ffff:10.0.0.2"),
            Some("10.9.9.9"),
        ];
        let ports = [None, Some(53), Some(61000), Some(443), Some(4000), Some(1)];
        let states = [None, Some("syn_sent"), Some("UNREPLIED"), Some("NONE")];
        let marks = [None, Some("5"), Some("0x4/0x4"), Some("0x2/0x2"), Some("0")];
        let mut selected = 0;
        for p in protos {
            for a in addrs {
                let combos: Vec<_> = ports
                    .iter()
                    .flat_map(|p| states.iter().map(move |s| (*p, *s)))
                    .flat_map(|(p, s)| marks.iter().map(move |m| (p, (s, *m))))
                    .collect();
                for (port, (st, mk)) in combos {
                    let f = CtFilter::new(p, a, port)
                        .and_then(|f| f.with(st, mk))
                        .expect("filter");
                    for (_, e) in t4.iter() {
                        let listed = CtEntry::of(0, e, now).expect("listing");
                        assert_eq!(f.matches4(e), f.matches(&listed), "{f:?} {listed:?}");
                        selected += usize::from(f.matches4(e));
                    }
                    for (_, e) in t6.iter() {
                        let listed = CtEntry::of6(0, e, now).expect("listing");
                        assert_eq!(f.matches6(e), f.matches(&listed), "{f:?} {listed:?}");
                        selected += usize::from(f.matches6(e));
                    }
                }
            }
        }
        assert!(selected > 20, "the filters select something: {selected}");
        // State and mark alone, and what they refuse.
        let only = |st, mk| CtFilter::default().with(st, mk).expect("filter");
        let count4 = |f: &CtFilter| t4.iter().filter(|(_, e)| f.matches4(e)).count();
        assert_eq!(count4(&only(Some("Syn_Sent"), None)), 1);
        assert_eq!(count4(&only(None, Some("0x5"))), 1);
        assert_eq!(count4(&only(None, Some("0x1/0x1"))), 1);
        assert_eq!(count4(&only(None, Some("0/0x1"))), 1, "the unmarked one");
        assert_eq!(count4(&only(Some("ESTABLISHED"), None)), 0);
        assert!(CtFilter::default().with(Some("OPEN"), None).is_err());
        assert!(CtFilter::default().with(None, Some("0xfffffffff")).is_err());
        assert!(CtFilter::default().with(None, Some("1/x")).is_err());
        assert!(!only(Some("STREAM"), None).is_empty());
        assert!(CtFilter::new(None, None, None).expect("filter").is_empty());
        assert!(!CtFilter::new(None, None, Some(1))
            .expect("filter")
            .is_empty());
    }

    /// `sluice ctl --text conntrack list`: `conntrack -L`'s layout.
    #[test]
    fn a_listing_prints_as_conntrack_does() {
        let v = json!({"ok": true, "count": 3, "connections": [
            {"worker": 0, "proto": 6, "state": "Tcp(Established)", "state_name": "ESTABLISHED",
             "seen_reply": true, "orig": {"src": "10.0.0.2", "sport": 40000, "dst": "203.0.113.2", "dport": 80},
             "reply": {"src": "203.0.113.2", "sport": 80, "dst": "198.51.100.7", "dport": 61000},
             "assured": true, "packets": 12, "expires_in": 431999,
             "offloaded": true, "offload_packets": 900},
            {"worker": 1, "proto": 17, "state": "Udp(Unreplied)", "state_name": "UNREPLIED",
             "seen_reply": false, "orig": {"src": "fd00::2", "sport": 5353, "dst": "2001:db8::1", "dport": 53},
             "reply": {"src": "2001:db8::1", "sport": 53, "dst": "fd00::2", "dport": 5353},
             "assured": false, "packets": 1, "expires_in": 29, "flowtable": true,
             "timeout_policy": "inet voip dns"},
            {"worker": 0, "proto": 1, "state": "Icmp", "state_name": "",
             "seen_reply": true, "orig": {"src": "10.0.0.2", "sport": 7, "dst": "203.0.113.2", "dport": 7},
             "reply": {"src": "203.0.113.2", "sport": 9, "dst": "198.51.100.7", "dport": 9},
             "assured": false, "packets": 2, "expires_in": 30}
        ]});
        let t = conntrack_text(&v).expect("a listing");
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(
            lines,
            [
                "tcp      6 431999 ESTABLISHED src=10.0.0.2 dst=203.0.113.2 sport=40000 dport=80 \
                 src=203.0.113.2 dst=198.51.100.7 sport=80 dport=61000 [ASSURED] [OFFLOAD] \
                 offload_packets=900 packets=12 worker=0",
                "udp      17 29 src=fd00::2 dst=2001:db8::1 sport=5353 dport=53 [UNREPLIED] \
                 src=2001:db8::1 dst=fd00::2 sport=53 dport=5353 [FLOWTABLE] \
                 timeout_policy=\"inet voip dns\" packets=1 worker=1",
                "icmp     1 30 src=10.0.0.2 dst=203.0.113.2 id=7 src=203.0.113.2 dst=198.51.100.7 \
                 id=9 packets=2 worker=0",
            ]
        );
        assert_eq!(conntrack_text(&json!({"ok": true, "count": 3})), None);
    }

    #[test]
    fn conntrack_count_and_flush_take_a_filter() {
        let a = |w: &[&str]| {
            let v: Vec<String> = w.iter().map(|s| s.to_string()).collect();
            request_from_args(&v)
        };
        assert_eq!(
            a(&["conntrack", "flush", "addr", "10.0.0.7", "port", "53"]).ok(),
            Some(r#"{"addr":"10.0.0.7","cmd":"conntrack-flush","port":53}"#.into())
        );
        assert_eq!(
            a(&["conntrack", "count", "proto", "udp"]).ok(),
            Some(r#"{"cmd":"conntrack-count","proto":"udp"}"#.into())
        );
        assert_eq!(
            a(&["conntrack", "flush"]).ok(),
            Some(r#"{"cmd":"conntrack-flush"}"#.into())
        );
        for bad in [
            &["conntrack", "flush", "addr"][..],
            &["conntrack", "flush", "limit", "5"],
            &["conntrack", "count", "port", "http"],
        ] {
            assert!(a(bad).is_err(), "{bad:?}");
        }
        // Unknown keys of the JSON form are refused, not ignored.
        let e = parse_request(r#"{"cmd":"conntrack-flush","adr":"10.0.0.7"}"#).unwrap_err();
        assert!(e.message.contains("adr"), "{e:?}");
    }

    use super::*;

    /// A silent client does not hold up others for longer than the inline
    /// wait, and one connection can carry several requests.
    #[test]
    fn file_requests_only_from_root_or_the_daemons_user() {
        let replace = Request::RulesetReplace {
            path: "/etc/shadow".into(),
        };
        let file = Request::NftFile {
            path: "/etc/shadow".into(),
        };
        for r in [&replace, &file] {
            assert!(file_refusal(r, Some(0), 0).is_none());
            assert!(file_refusal(r, Some(1000), 1000).is_none());
            let f = file_refusal(r, Some(1000), 0).expect("refused");
            assert!(f.message.contains("uid 1000"), "{}", f.message);
            assert!(f.message.contains("/etc/shadow"), "{}", f.message);
            assert!(file_refusal(r, None, 0).is_some());
        }
        assert!(file_refusal(&Request::Status, Some(1000), 0).is_none());
        let flush = Request::ConntrackFlush {
            proto: None,
            addr: None,
            port: None,
            state: None,
            mark: None,
        };
        assert!(file_refusal(&flush, None, 0).is_none());
    }

    #[test]
    fn serves_around_a_silent_client_and_several_requests_per_connection() {
        use std::io::{BufRead, Write};
        use std::sync::atomic::{AtomicBool, Ordering};
        let dir = std::env::temp_dir().join(format!("sluice-ctl-test-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&dir);
        let sock = dir.join("ctl.sock");
        let _ = std::fs::remove_file(&sock);
        let listener = UnixListener::bind(&sock).expect("bind a test socket");
        let stop = AtomicBool::new(false);
        std::thread::scope(|sc| {
            let stop = &stop;
            sc.spawn(move || {
                serve(listener, stop, &|r| match r {
                    Request::Status => json!({"ok": true, "status": 1}),
                    _ => json!({"ok": false}),
                })
            });
            // Connects and says nothing.
            let silent = UnixStream::connect(&sock).expect("connect");
            let t = std::time::Instant::now();
            let answer = client(&sock, r#"{"cmd":"status"}"#).expect("answered");
            assert_eq!(answer, r#"{"ok":true,"status":1}"#);
            assert!(
                t.elapsed() < Duration::from_secs(5),
                "a silent client held up another for {:?}",
                t.elapsed()
            );
            // Two requests on one connection, the second after the first
            // answer (so the connection has moved to a thread of its own).
            let mut c = UnixStream::connect(&sock).expect("connect");
            let mut r = BufReader::new(c.try_clone().expect("clone"));
            for _ in 0..2 {
                c.write_all(b"{\"cmd\":\"status\"}\n").expect("write");
                let mut line = String::new();
                r.read_line(&mut line).expect("read");
                assert_eq!(line.trim_end(), r#"{"ok":true,"status":1}"#);
            }
            // A malformed request gets a specific error, not a dropped line.
            c.write_all(b"not json\n").expect("write");
            let mut line = String::new();
            r.read_line(&mut line).expect("read");
            assert!(line.contains("\"ok\":false"), "{line}");
            drop((silent, c, r));
            stop.store(true, Ordering::Relaxed);
            wake(&sock);
        });
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn parses_each_request() {
        assert_eq!(parse_request(r#"{"cmd":"status"}"#), Ok(Request::Status));
        assert_eq!(
            parse_request(r#"{"cmd":"conntrack-list","proto":"tcp","port":80}"#),
            Ok(Request::ConntrackList {
                proto: Some("tcp".into()),
                addr: None,
                port: Some(80),
                state: None,
                mark: None,
                limit: None
            })
        );
        assert_eq!(
            parse_request(r#"{"cmd":"ruleset-replace","path":"/x.nft"}"#),
            Ok(Request::RulesetReplace {
                path: "/x.nft".into()
            })
        );
        assert_eq!(
            parse_request(r#"{"cmd":"conntrack-flush"}"#),
            Ok(Request::ConntrackFlush {
                proto: None,
                addr: None,
                port: None,
                state: None,
                mark: None,
            })
        );
        assert_eq!(
            parse_request(r#"{"cmd":"conntrack-count","addr":"10.0.0.7","port":53}"#),
            Ok(Request::ConntrackCount {
                proto: None,
                addr: Some("10.0.0.7".into()),
                port: Some(53),
                state: None,
                mark: None,
            })
        );
        assert_eq!(
            parse_request(r#"{"cmd":"conntrack-flush","state":"time_wait","mark":"0x1/0x1"}"#),
            Ok(Request::ConntrackFlush {
                proto: None,
                addr: None,
                port: None,
                state: Some("time_wait".into()),
                mark: Some("0x1/0x1".into()),
            })
        );
    }

    #[test]
    fn bad_requests_get_specific_errors() {
        let e = |l: &str| parse_request(l).unwrap_err().message;
        assert!(e("nope").starts_with("not JSON"));
        assert!(e("[1]").contains("JSON object"));
        assert!(e(r#"{"x":1}"#).contains("missing \"cmd\""));
        assert!(e(r#"{"cmd":"explode"}"#).contains("unknown variant `explode`"));
        assert!(e(r#"{"cmd":"status","x":1}"#).contains("unknown field `x`"));
        assert!(e(r#"{"cmd":"ruleset-replace"}"#).contains("missing field `path`"));
        assert!(e(r#"{"cmd":"conntrack-list","port":70000}"#).contains("70000"));
    }

    #[test]
    fn filters() {
        assert!(CtFilter::new(Some("sctpx"), None, None).is_err());
        assert!(CtFilter::new(None, Some("10.0.0.300"), None).is_err());
        let f = CtFilter::new(Some("tcp"), Some("198.51.100.7"), Some(8000)).unwrap();
        let t = |s: [u8; 4], sp, d: [u8; 4], dp| Tuple {
            src: s.into(),
            sport: sp,
            dst: d.into(),
            dport: dp,
        };
        let mut e = CtEntry {
            worker: 0,
            proto: 6,
            state: String::new(),
            state_name: "ESTABLISHED",
            seen_reply: true,
            orig: t([10, 0, 0, 2], 40000, [203, 0, 113, 2], 8000),
            reply: t([203, 0, 113, 2], 8000, [198, 51, 100, 7], 1025),
            assured: true,
            packets: 3,
            mark: 0,
            expires_in: 10,
            offloaded: false,
            offload_packets: None,
            flowtable: false,
            timeout_slot: 0,
            timeout_policy: None,
        };
        assert!(f.matches(&e));
        e.proto = 17;
        assert!(!f.matches(&e));
    }

    #[test]
    fn args_to_requests() {
        let a = |s: &str| -> Vec<String> { s.split(' ').map(String::from).collect() };
        assert_eq!(
            request_from_args(&a("status")).unwrap(),
            r#"{"cmd":"status"}"#
        );
        let r = request_from_args(&a("conntrack list proto tcp port 80")).unwrap();
        assert_eq!(
            parse_request(&r).unwrap(),
            Request::ConntrackList {
                proto: Some("tcp".into()),
                addr: None,
                port: Some(80),
                state: None,
                mark: None,
                limit: None
            }
        );
        let r = request_from_args(&a("conntrack flush state TIME_WAIT mark 0x1/0x1")).unwrap();
        assert_eq!(
            parse_request(&r).unwrap(),
            Request::ConntrackFlush {
                proto: None,
                addr: None,
                port: None,
                state: Some("TIME_WAIT".into()),
                mark: Some("0x1/0x1".into()),
            }
        );
        assert!(request_from_args(&a("conntrack list port")).is_err());
        assert!(request_from_args(&a("conntrack list port x")).is_err());
        assert!(request_from_args(&a("frobnicate")).is_err());
        let r = request_from_args(&a("reload check")).unwrap();
        assert_eq!(parse_request(&r).unwrap(), Request::ReloadCheck);
        assert!(request_from_args(&a("reload checks")).is_err());
        assert!(parse_request(r#"{"cmd":"reload-check","path":"x"}"#).is_err());
        let r =
            request_from_args(&a("nft add rule inet filter forward tcp dport 22 drop")).unwrap();
        assert_eq!(
            parse_request(&r).unwrap(),
            Request::Nft {
                command: "add rule inet filter forward tcp dport 22 drop".into()
            }
        );
        assert!(request_from_args(&a("nft")).is_err());
        // `nft -f FILE`: the file's commands in one request (an absolute
        // path stays as it is).
        let r = request_from_args(&a("nft -f /nonexistent/changes.nft")).unwrap();
        assert_eq!(
            parse_request(&r).unwrap(),
            Request::NftFile {
                path: "/nonexistent/changes.nft".into()
            }
        );
        let r = request_from_args(&a("rule list forward")).unwrap();
        assert_eq!(
            parse_request(&r).unwrap(),
            Request::RuleList {
                chain: Some("forward".into())
            }
        );
        let r = request_from_args(&a("counter list inet t web")).unwrap();
        assert_eq!(
            parse_request(&r).unwrap(),
            Request::ObjectList {
                kind: Some("counter".into()),
                name: Some("inet t web".into()),
                reset: false
            }
        );
        let r = request_from_args(&a("quota reset")).unwrap();
        assert_eq!(
            parse_request(&r).unwrap(),
            Request::ObjectList {
                kind: Some("quota".into()),
                name: None,
                reset: true
            }
        );
        assert!(request_from_args(&a("counter drop x")).is_err());
        let r = request_from_args(&a("set list inet filter deny")).unwrap();
        assert_eq!(
            parse_request(&r).unwrap(),
            Request::SetList {
                set: Some("inet filter deny".into())
            }
        );
        let r = request_from_args(&a("set list")).unwrap();
        assert_eq!(parse_request(&r).unwrap(), Request::SetList { set: None });
    }
}
