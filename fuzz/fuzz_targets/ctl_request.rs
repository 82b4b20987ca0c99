#![no_main]
//! Fuzz the control socket's request lines and `sluice ctl`'s words: a
//! line either parses into a request or gets a `bad-request` failure with
//! a message, never a panic; a connection filter in a request builds or is
//! refused with a message; and whatever `sluice ctl` makes of its words is
//! a JSON line the daemon parses back (or refuses with a reason, e.g. an
//! address that is not one).
use libfuzzer_sys::fuzz_target;
use sluice_daemon::ctl::{parse_request, request_from_args, CtFilter, Request};

fn filters(r: &Request) {
    let (proto, addr, port, state, mark) = match r {
        Request::ConntrackList {
            proto,
            addr,
            port,
            state,
            mark,
            ..
        }
        | Request::ConntrackCount {
            proto,
            addr,
            port,
            state,
            mark,
        }
        | Request::ConntrackFlush {
            proto,
            addr,
            port,
            state,
            mark,
        } => (proto, addr, port, state, mark),
        _ => return,
    };
    let f = CtFilter::new(proto.as_deref(), addr.as_deref(), *port)
        .and_then(|f| f.with(state.as_deref(), mark.as_deref()));
    if let Err(e) = f {
        assert!(!e.message.is_empty());
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match parse_request(text) {
        Ok(r) => filters(&r),
        Err(e) => {
            assert_eq!(e.kind, "bad-request");
            assert!(!e.message.is_empty());
        }
    }
    let words: Vec<String> = text.split_whitespace().map(String::from).collect();
    if let Ok(line) = request_from_args(&words) {
        match parse_request(&line) {
            Ok(r) => filters(&r),
            Err(e) => assert!(!e.message.is_empty(), "{line}"),
        }
    }
});
