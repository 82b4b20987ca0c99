//! Recursive-descent parser for nft syntax (block form and `add ...` command
//! form) over the preprocessed token stream from [`crate::lex`] (or over a
//! plain file it lexes itself on demand; see [`Parser::new`]).
//!
//! Hot path notes: words are `&str` borrowed from the source, "expected X"
//! texts are built only on the error path (`format_args!`), and a rule's
//! matches and statements are collected in reused scratch vectors and moved
//! out with exact capacity.
//!
//! The parser only builds the AST; semantic checks live in [`crate::validate`].
//! On an error it records a diagnostic and resumes at the next statement, so
//! one run reports every syntax error in the input.

use crate::ast::*;
use crate::diag::{suggest, RawDiag, SourceFile};
use crate::lex::{self, unescape, Lexer, Text, Tok, Token};
use crate::symbols::{self, parse_num};
use std::collections::HashSet;
use std::fmt;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};

/// Marker: an error was recorded; the caller recovers.
#[derive(Debug)]
pub(crate) struct Fail;
type P<T> = Result<T, Fail>;

const TOP_KEYWORDS: &[&str] = &[
    "table", "add", "create", "insert", "flush", "define", "include",
];
const STMT_KEYWORDS: &[&str] = &[
    "counter",
    "accept",
    "drop",
    "reject",
    "return",
    "continue",
    "jump",
    "goto",
    "log",
    "limit",
    "snat",
    "dnat",
    "masquerade",
    "redirect",
    "comment",
    "add",
    "update",
    "delete",
    "quota",
    "notrack",
    "flow",
];
const EXPR_KEYWORDS: &[&str] = &[
    "iifname", "oifname", "iif", "oif", "meta", "mark", "l4proto", "nfproto", "pkttype", "ip",
    "ip6", "tcp", "udp", "th", "icmp", "icmpv6", "ct", "fib", "ether",
];

/// `STMT_KEYWORDS.contains(&w)`, as one `match` (checked once per rule word).
fn is_stmt_keyword(w: &str) -> bool {
    matches!(
        w,
        "counter"
            | "accept"
            | "drop"
            | "reject"
            | "return"
            | "continue"
            | "jump"
            | "goto"
            | "log"
            | "limit"
            | "snat"
            | "dnat"
            | "masquerade"
            | "redirect"
            | "comment"
            | "add"
            | "update"
            | "delete"
            | "quota"
            | "notrack"
            | "flow"
    )
}

/// nft statements Sluice knows and does not implement, with the reason
/// (docs/configuration.md, "Not yet supported"); anything else unknown gets
/// the generic error with a suggestion.
fn unsupported_keyword(w: &str) -> Option<&'static str> {
    Some(match w {
        "synproxy" => "SYN proxying is not implemented",
        "queue" => "there is no userspace queue to hand packets to",
        "dup" | "fwd" => "packet duplication and forwarding by rule are not implemented",
        "vlan" => "VLAN tag matches are not implemented",
        _ => return None,
    })
}

/// nft expressions Sluice knows and does not implement, with the reason
/// (docs/configuration.md, "Not yet supported").
fn unsupported_field(what: &str, field: &str) -> Option<&'static str> {
    Some(match (what, field) {
        ("ct", "helper") => "conntrack helpers are not implemented",
        ("ct", "zone") => "conntrack zones are not implemented",
        ("meta", "skuid" | "skgid") => {
            "socket owners concern locally generated packets, which Sluice does not have"
        }
        ("meta", "priority") => "packet priorities are not implemented",
        _ => return None,
    })
}

/// Why a kind of nft stateful object Sluice knows is not implemented.
fn unsupported_object(kind: &str) -> &'static str {
    match kind {
        "ct helper" => "conntrack helpers are not implemented",
        "ct expectation" => "conntrack expectations are not implemented",
        "secmark" => "security marks label packets for local sockets, which Sluice does not have",
        "synproxy" => "SYN proxying is not implemented",
        "tunnel" => "tunnel metadata is not implemented",
        _ => "this object type is not implemented",
    }
}

/// `is_expr_keyword(w)`, as one `match`.
fn is_expr_keyword(w: &str) -> bool {
    matches!(
        w,
        "iifname"
            | "oifname"
            | "iif"
            | "oif"
            | "meta"
            | "mark"
            | "l4proto"
            | "nfproto"
            | "pkttype"
            | "fib"
            | "ether"
            | "ip"
            | "ip6"
            | "tcp"
            | "udp"
            | "th"
            | "icmp"
            | "icmpv6"
            | "ct"
    )
}

pub(crate) struct Parser<'s> {
    /// Source texts the tokens refer to.
    src: &'s [SourceFile],
    /// The tokens: all of them, or with [`Parser::lexer`] a window that
    /// always holds the current and next token (or ends with `Eof`) and
    /// one token before the current one.
    toks: Vec<Token>,
    pos: usize,
    /// Lexes the rest of the input on demand (see [`Preprocessor::lazy`]).
    ///
    /// [`Preprocessor::lazy`]: crate::lex::Preprocessor
    lexer: Option<Lexer<'s>>,
    /// Errors from [`Parser::lexer`]; they precede the parser's own.
    pub lex_diags: Vec<RawDiag>,
    depth: i32,
    /// The current chain's `type` line failed; do not also report its `policy`.
    base_failed: bool,
    pub diags: Vec<RawDiag>,
    pub tables: Vec<Table>,
    /// Reused by [`Parser::rule`].
    scratch_matches: Vec<Match>,
    scratch_stmts: Vec<Stmt>,
    /// The second half of a large plain file, parsed meanwhile by another
    /// thread ([`Split`]).
    split: Option<Split<'s>>,
    /// A [`Split`]'s tail was used.
    joined: bool,
}

/// A large plain file's second half, parsed on another thread as the rest
/// of a chain body ([`Parser::tail`]) from the first line at or after the
/// file's middle, while this parser parses the file from its start.
///
/// The lexer keeps no state across a newline (strings and comments end at
/// one; a line continuation is never chosen as the split), so lexing from
/// the split line gives the tokens the whole file's lexer gives there. The
/// tail is used only where it is exactly what this parser would parse
/// next: when this parser, at the top of a chain body's loop, stands on the
/// tail's first token ([`Parser::join_split`]). Then the tail's rules are
/// that chain's next rules, and its lexer, positioned at the `}` that ends
/// the chain, continues the file. Anything else (the split inside a set
/// declaration, a multi-line rule or between chains, a tail that met an
/// error, a chain's `type`/`policy`/`comment` line or the end of the file)
/// drops the tail and parses on as if there were none, so the AST and every
/// diagnostic are those of a sequential parse.
pub(crate) struct Split<'s> {
    /// The tail's first line (1-based) in file 0.
    line: u32,
    rx: mpsc::Receiver<Option<Tail<'s>>>,
    /// Tells the tail's thread to give up (its result will not be used).
    cancel: Arc<AtomicBool>,
}

/// What [`Parser::tail`] parsed: the rules from `first` on, and the parser
/// (its token window and lexer) standing on the `}` after them.
pub(crate) struct Tail<'s> {
    first: Span,
    rules: Vec<Rule>,
    parser: Parser<'s>,
}

/// A chain's rule count at which, while a [`Split`] is pending, its vector
/// is given room for the rules up to the split at once.
const HEAD_RESERVE_AT: usize = 4096;

/// Files at least this large (bytes) are parsed in two halves on two
/// threads ([`Split`]): about 13 000 one-line rules.
pub(crate) const SPLIT_MIN: usize = 1 << 20;

/// The number of `\n` bytes in `b`. Counted per block of 255 bytes in a
/// `u8`, which the compiler turns into vector compares and adds: about 9x
/// faster than `filter().count()` (11 MB: 1-2.5 ms instead of 8.5 ms).
pub(crate) fn count_newlines(b: &[u8]) -> usize {
    b.chunks(255)
        .map(|c| {
            let n = c
                .iter()
                .fold(0u8, |n, &x| n.wrapping_add(u8::from(x == b'\n')));
            usize::from(n)
        })
        .sum()
}

/// Where to split `text` for [`Split`]: the start of the first line at or
/// after the middle whose preceding newline does not end a line
/// continuation (`\` before it), and that line's number. None if there is
/// no such line.
pub(crate) fn split_point(text: &str) -> Option<(usize, u32)> {
    let b = text.as_bytes();
    let mut i = b.len() / 2;
    loop {
        let nl = i + b.get(i..)?.iter().position(|&c| c == b'\n')?;
        let before = b.get(..nl).unwrap_or_default();
        let continued = matches!(before, [.., b'\\'] | [.., b'\\', b'\r']);
        if !continued && nl + 1 < b.len() {
            // Every newline byte is one line for the lexer (comments and
            // strings stop at it; continuations count it).
            let line = 2 + count_newlines(before);
            return Some((nl + 1, u32::try_from(line).ok()?));
        }
        i = nl + 1;
    }
}

impl<'s> Parser<'s> {
    /// A parser over `toks` (ending with `Eof`), or if `lazy` names a file
    /// in `src`, over that file lexed on demand (`toks` is then empty).
    pub fn new(toks: Vec<Token>, src: &'s [SourceFile], lazy: Option<u32>) -> Self {
        let lexer = lazy.and_then(|id| {
            let f = src.get(id as usize)?;
            Some(Lexer::new(id, &f.text))
        });
        let mut p = Parser {
            src,
            toks,
            pos: 0,
            lexer,
            lex_diags: Vec::new(),
            depth: 0,
            base_failed: false,
            diags: Vec::new(),
            tables: Vec::new(),
            scratch_matches: Vec::new(),
            scratch_stmts: Vec::new(),
            split: None,
            joined: false,
        };
        p.fill();
        p
    }

    /// Parses file 0 (which must be the lazily lexed file) in two halves
    /// when it is large and another core is free ([`Split`]): the second
    /// half on a thread of `scope`, when the file has at least `min` bytes
    /// (normally [`SPLIT_MIN`]). The same result as [`Self::parse_file`];
    /// returns true if the second half's parse was used.
    pub fn parse_file_split<'scope>(
        &mut self,
        scope: &'scope std::thread::Scope<'scope, '_>,
        min: usize,
    ) -> bool
    where
        's: 'scope,
    {
        let src = self.src;
        let plan = match (&self.lexer, src.first()) {
            (Some(_), Some(f)) if f.text.len() >= min => split_point(&f.text),
            _ => None,
        };
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        if let (Some((at, line)), true) = (plan, cores > 1) {
            let (tx, rx) = mpsc::sync_channel(1);
            let cancel = Arc::new(AtomicBool::new(false));
            let stop = Arc::clone(&cancel);
            let spawned = std::thread::Builder::new()
                .name("nft-parse".into())
                .spawn_scoped(scope, move || {
                    let _ = tx.send(Parser::tail(src, at, line, &stop));
                });
            if spawned.is_ok() {
                self.split = Some(Split { line, rx, cancel });
            }
        }
        self.parse_file();
        match self.split.take() {
            // Never reached: the tail's thread may stop early.
            Some(split) => {
                split.cancel.store(true, Ordering::Relaxed);
                false
            }
            None => plan.is_some() && self.joined,
        }
    }

    /// The second half of file 0 from byte `at` (line `line`), parsed as
    /// the rest of a chain body: rules up to the chain's `}`. None on
    /// anything else (see [`Split`]) or when `cancel` is set.
    fn tail(src: &'s [SourceFile], at: usize, line: u32, cancel: &AtomicBool) -> Option<Tail<'s>> {
        let f = src.first()?;
        let mut p = Parser::new(Vec::new(), src, None);
        p.lexer = Some(Lexer::at(0, &f.text, at, line));
        p.fill();
        p.skip_separators();
        let first = p.span();
        // Room for a rule per line of the whole file: the head's rules are
        // moved in front of these when they join ([`Parser::join_split`]),
        // so the chain's vector is never copied into a larger one (at
        // 150 000 rules each copy writes 15 MB of fresh pages). Capacity
        // that is never written costs address space, not memory.
        // Lines before `at`: `line - 1`, counted by `split_point` already.
        let tail_lines = count_newlines(f.text.as_bytes().get(at..).unwrap_or_default());
        let lines = tail_lines + line as usize;
        let mut rules = Vec::with_capacity(lines + 1);
        loop {
            p.skip_separators();
            match p.peek() {
                Tok::RBrace => break,
                Tok::Eof => return None,
                Tok::Word(w) if matches!(p.text(w), "type" | "policy" | "comment") => return None,
                _ => {}
            }
            if cancel.load(Ordering::Relaxed) {
                return None;
            }
            let r = p.rule().ok()?;
            p.end_stmt().ok()?;
            rules.push(r);
        }
        let clean = p.depth == 0 && p.diags.is_empty() && p.lex_diags.is_empty();
        clean.then_some(Tail {
            first,
            rules,
            parser: p,
        })
    }

    /// At the top of chain `ci`'s body loop: if a [`Split`] is pending and
    /// this parser has reached its line, wait for the tail and take it when
    /// it starts exactly here (its rules join the chain, its token window
    /// and lexer replace this parser's); drop it otherwise.
    fn join_split(&mut self, ti: usize, ci: usize) {
        let here = self.span();
        let Some(split) = &self.split else {
            return;
        };
        if here.file != 0 || here.line < split.line {
            return;
        }
        let tail = split.rx.recv().ok().flatten();
        self.split = None;
        let Some(tail) = tail else {
            return;
        };
        if tail.first != here {
            return;
        }
        let Tail {
            mut rules, parser, ..
        } = tail;
        if let Some(c) = self.chain_mut(ti, ci) {
            if rules.capacity() - rules.len() >= c.rules.len() {
                // In place: the tail's vector has room for the head's rules.
                rules.splice(0..0, c.rules.drain(..));
                c.rules = rules;
            } else {
                c.rules.append(&mut rules);
            }
        }
        self.toks = parser.toks;
        self.pos = parser.pos;
        self.lexer = parser.lexer;
        self.joined = true;
    }

    /// With a lazy lexer, make sure the current and next tokens are in the
    /// window (lexing more lines), dropping tokens well behind the current one.
    fn fill(&mut self) {
        let Some(lexer) = &mut self.lexer else {
            return;
        };
        while self.toks.len() < self.pos + 2 {
            if self.pos > 256 {
                // Keep one token behind `pos`: `bitmask_list` steps back one.
                self.toks.drain(..self.pos - 1);
                self.pos = 1;
            }
            if !lexer.line(&mut self.toks, &mut self.lex_diags) {
                // End of the file: finish it as the preprocessor does, with
                // a newline if the last token was not one, then end of file.
                if let Some(last) = self.toks.last().copied() {
                    if last.tok != Tok::Newline {
                        self.toks.push(Token {
                            tok: Tok::Newline,
                            span: last.span,
                        });
                    }
                }
                let span = self.toks.last().map(|t| t.span).unwrap_or_default();
                self.toks.push(Token {
                    tok: Tok::Eof,
                    span: Span {
                        col: span.col + span.len,
                        len: 1,
                        ..span
                    },
                });
                self.lexer = None;
                return;
            }
        }
    }

    // ---- token helpers -------------------------------------------------

    fn peek(&self) -> Tok {
        self.peek_at(0)
    }

    fn peek_at(&self, n: usize) -> Tok {
        self.toks.get(self.pos + n).map_or(Tok::Eof, |t| t.tok)
    }

    fn text(&self, t: Text) -> &'s str {
        lex::text(self.src, t)
    }

    /// The value of a string token.
    fn string(&self, t: Text) -> String {
        unescape(self.text(t)).into_owned()
    }

    fn span(&self) -> Span {
        self.toks
            .get(self.pos)
            .or_else(|| self.toks.last())
            .map(|t| t.span)
            .unwrap_or_default()
    }

    fn bump(&mut self) -> Token {
        let t = match self.toks.get(self.pos) {
            Some(t) => *t,
            None => Token {
                tok: Tok::Eof,
                span: self.span(),
            },
        };
        match t.tok {
            Tok::LBrace => self.depth += 1,
            Tok::RBrace => self.depth -= 1,
            Tok::Eof => return t,
            _ => {}
        }
        self.pos += 1;
        if self.toks.len() < self.pos + 2 {
            self.fill();
        }
        t
    }

    fn word(&self) -> Option<&'s str> {
        self.word_at(0)
    }

    fn word_at(&self, n: usize) -> Option<&'s str> {
        match self.peek_at(n) {
            Tok::Word(w) => Some(self.text(w)),
            _ => None,
        }
    }

    fn is_word(&self, w: &str) -> bool {
        match self.peek() {
            // Lengths first: most probes (`set`, `vmap`, `-`) miss.
            Tok::Word(t) => t.end.wrapping_sub(t.start) as usize == w.len() && self.text(t) == w,
            _ => false,
        }
    }

    fn eat_word(&mut self, w: &str) -> bool {
        if self.is_word(w) {
            self.bump();
            true
        } else {
            false
        }
    }

    fn eat(&mut self, t: &Tok) -> bool {
        if self.peek() == *t {
            self.bump();
            true
        } else {
            false
        }
    }

    fn err<T>(&mut self, span: Span, msg: impl Into<String>) -> P<T> {
        self.diags.push(RawDiag::new(span, msg));
        Err(Fail)
    }

    fn err_help<T>(&mut self, span: Span, msg: impl Into<String>, help: Option<String>) -> P<T> {
        self.diags.push(RawDiag::new(span, msg).help(help));
        Err(Fail)
    }

    /// An error at the current token, "expected X". `what` is only formatted
    /// on this error path (callers pass `format_args!`, not a `String`).
    fn unexpected<T>(&mut self, what: impl fmt::Display) -> P<T> {
        let sp = self.span();
        if self.word().is_some_and(|w| w.starts_with('$')) {
            // An undefined variable, already reported by the preprocessor.
            return Err(Fail);
        }
        let got = self.peek().describe(self.src);
        self.err(sp, format!("syntax error, expected {what} but found {got}"))
    }

    fn expect(&mut self, t: Tok) -> P<Span> {
        if self.peek() == t {
            Ok(self.bump().span)
        } else {
            let want = t.describe(self.src);
            self.unexpected(want)
        }
    }

    fn expect_word(&mut self, what: impl fmt::Display) -> P<(&'s str, Span)> {
        match self.word() {
            Some(w) if !w.starts_with('$') => Ok((w, self.bump().span)),
            _ => self.unexpected(what),
        }
    }

    /// Identifiers (tables, chains, sets) may be quoted.
    fn name(&mut self, what: &str) -> P<(String, Span)> {
        match self.peek() {
            Tok::Str(s) => Ok((self.string(s), self.bump().span)),
            _ => self.expect_word(what).map(|(w, sp)| (w.to_string(), sp)),
        }
    }

    fn keyword(&mut self, what: &str, options: &[&str]) -> P<(&'s str, Span)> {
        let (w, sp) = self.expect_word(what)?;
        if options.contains(&w) {
            Ok((w, sp))
        } else {
            let help = suggest(w, options.iter().copied());
            self.err_help(sp, format!("unknown {what} '{w}'"), help)
        }
    }

    fn at_stmt_end(&self) -> bool {
        matches!(
            self.peek(),
            Tok::Newline | Tok::Semi | Tok::RBrace | Tok::Eof
        )
    }

    fn skip_separators(&mut self) {
        while matches!(self.peek(), Tok::Newline | Tok::Semi) {
            self.bump();
        }
    }

    fn skip_newlines(&mut self) {
        while matches!(self.peek(), Tok::Newline) {
            self.bump();
        }
    }

    /// Skip to the end of the current statement at brace depth `depth`.
    fn recover_to(&mut self, depth: i32) {
        loop {
            match self.peek() {
                Tok::Eof => return,
                Tok::Newline | Tok::Semi if self.depth <= depth => {
                    self.bump();
                    return;
                }
                Tok::RBrace if self.depth <= depth => return,
                _ => {
                    self.bump();
                }
            }
        }
    }

    fn end_stmt(&mut self) -> P<()> {
        if self.at_stmt_end() {
            Ok(())
        } else {
            self.unexpected("end of statement")
        }
    }

    // ---- top level ------------------------------------------------------

    pub fn parse_file(&mut self) {
        loop {
            self.skip_separators();
            let depth = self.depth;
            let sp = self.span();
            let r = match self.peek() {
                Tok::Eof => break,
                Tok::Word(w) => match self.text(w) {
                    "table" => {
                        self.bump();
                        self.table_block()
                    }
                    "add" | "create" => {
                        self.bump();
                        self.command(false)
                    }
                    "insert" => {
                        self.bump();
                        self.command(true)
                    }
                    "flush" => {
                        self.bump();
                        self.flush()
                    }
                    w if w.starts_with('$') => Err(Fail),
                    w @ ("delete" | "destroy" | "replace" | "reset" | "rename") => self.err(
                        sp,
                        format!(
                            "'{w}' is not supported in a rule-set file, which declares \
                             what to load; change a running gateway with `sluice ctl nft \
                             delete rule|element ...`"
                        ),
                    ),
                    w => {
                        let help = suggest(w, TOP_KEYWORDS.iter().copied());
                        self.err_help(sp, format!("unknown command '{w}'"), help)
                    }
                },
                Tok::RBrace => {
                    self.bump();
                    self.err(sp, "unexpected '}'")
                }
                _ => self.unexpected("a command"),
            };
            let r = r.and_then(|_| self.end_stmt());
            if r.is_err() {
                self.recover_to(depth);
                if self.peek() == Tok::RBrace && self.depth <= depth {
                    self.bump();
                }
            }
        }
    }

    fn family_opt(&mut self) -> P<Family> {
        let next_is_name = matches!(self.peek_at(1), Tok::Word(_) | Tok::Str(_));
        let fam = match self.word() {
            Some("ip") if next_is_name => Family::Ip,
            Some("ip6") if next_is_name => Family::Ip6,
            Some("inet") if next_is_name => Family::Inet,
            Some(f @ ("arp" | "bridge" | "netdev")) if next_is_name => {
                let f = f.to_string();
                let sp = self.span();
                return self.err(
                    sp,
                    format!("unsupported address family '{f}' (ip, ip6, inet)"),
                );
            }
            _ => return Ok(Family::Ip),
        };
        self.bump();
        Ok(fam)
    }

    fn table_index(&mut self, family: Family, name: &str, span: Span) -> usize {
        if let Some(i) = self
            .tables
            .iter()
            .position(|t| t.family == family && t.name == name)
        {
            return i;
        }
        self.tables.push(Table {
            family,
            name: name.to_string(),
            chains: Vec::new(),
            sets: Vec::new(),
            maps: Vec::new(),
            objects: Vec::new(),
            flowtables: Vec::new(),
            ct_timeouts: Vec::new(),
            span,
        });
        self.tables.len() - 1
    }

    fn find_table(&mut self, family: Family, name: &str, span: Span) -> P<usize> {
        if let Some(i) = self
            .tables
            .iter()
            .position(|t| t.family == family && t.name == name)
        {
            return Ok(i);
        }
        let help = suggest(name, self.tables.iter().map(|t| t.name.as_str()));
        self.err_help(
            span,
            format!("no such table '{} {name}'", family.name()),
            help,
        )
    }

    fn find_chain(&mut self, ti: usize, name: &str, span: Span) -> P<usize> {
        let chains = self
            .tables
            .get(ti)
            .map(|t| t.chains.as_slice())
            .unwrap_or(&[]);
        if let Some(i) = chains.iter().position(|c| c.name == name) {
            return Ok(i);
        }
        let help = suggest(name, chains.iter().map(|c| c.name.as_str()));
        self.err_help(span, format!("no such chain '{name}'"), help)
    }

    fn chain_index(&mut self, ti: usize, name: &str, span: Span) -> usize {
        let Some(t) = self.tables.get_mut(ti) else {
            return 0;
        };
        if let Some(i) = t.chains.iter().position(|c| c.name == name) {
            return i;
        }
        t.chains.push(Chain {
            name: name.to_string(),
            base: None,
            rules: Vec::new(),
            comment: None,
            span,
        });
        t.chains.len() - 1
    }

    fn chain_mut(&mut self, ti: usize, ci: usize) -> Option<&mut Chain> {
        self.tables.get_mut(ti).and_then(|t| t.chains.get_mut(ci))
    }

    fn table_block(&mut self) -> P<()> {
        let fam = self.family_opt()?;
        let (name, sp) = self.name("table name")?;
        let ti = self.table_index(fam, &name, sp);
        self.expect(Tok::LBrace)?;
        self.table_body(ti)
    }

    fn table_body(&mut self, ti: usize) -> P<()> {
        let open = self.span();
        let mut seen = HashSet::new();
        loop {
            self.skip_separators();
            let depth = self.depth;
            let sp = self.span();
            let r = match self.peek() {
                Tok::RBrace => {
                    self.bump();
                    return Ok(());
                }
                Tok::Eof => return self.err(open, "missing '}' at end of table"),
                Tok::Word(w) => match self.text(w) {
                    "chain" => {
                        self.bump();
                        self.chain_decl(ti, &mut seen)
                    }
                    w @ ("set" | "map") => {
                        self.bump();
                        self.set_decl(ti, w == "map")
                    }
                    w @ ("counter" | "quota" | "limit") => {
                        self.bump();
                        self.obj_decl(ti, obj_kind(w), true)
                    }
                    "flowtable" => {
                        self.bump();
                        self.flowtable_decl(ti)
                    }
                    "flags" | "comment" => {
                        self.bump();
                        while !self.at_stmt_end() {
                            self.bump();
                        }
                        Ok(())
                    }
                    w @ ("ct" | "secmark" | "synproxy" | "tunnel") => {
                        // nft's other stateful objects: known, not
                        // implemented (the whole declaration is skipped).
                        match (w, self.word_at(1)) {
                            ("ct", Some("timeout")) => {
                                self.bump();
                                self.bump();
                                self.ct_timeout_decl(ti)
                            }
                            ("ct", Some(k @ ("helper" | "expectation"))) => {
                                let kind = format!("ct {k}");
                                let why = unsupported_object(&kind);
                                self.err(sp, format!("'{kind}' objects are not supported: {why}"))
                            }
                            ("ct", next) => self.err(
                                sp,
                                format!(
                                    "unknown table item 'ct {}'; nft's ct objects are 'ct \
                                     helper', 'ct timeout' and 'ct expectation'",
                                    next.unwrap_or("")
                                ),
                            ),
                            _ => {
                                let why = unsupported_object(w);
                                self.err(sp, format!("'{w}' objects are not supported: {why}"))
                            }
                        }
                    }
                    w => {
                        let help = suggest(
                            w,
                            [
                                "chain",
                                "set",
                                "map",
                                "counter",
                                "quota",
                                "flowtable",
                                "flags",
                                "comment",
                            ],
                        );
                        self.err_help(sp, format!("unknown table item '{w}'"), help)
                    }
                },
                _ => self.unexpected("'chain', 'set', 'map', 'counter', 'quota' or 'limit'"),
            };
            if r.and_then(|_| self.end_stmt()).is_err() {
                self.recover_to(depth);
            }
        }
    }

    fn chain_decl(&mut self, ti: usize, seen: &mut HashSet<String>) -> P<()> {
        let (name, sp) = self.name("chain name")?;
        if !seen.insert(name.clone()) {
            self.diags.push(RawDiag::new(
                sp,
                format!("duplicate chain '{name}' in this table"),
            ));
        }
        let ci = self.chain_index(ti, &name, sp);
        if self.eat(&Tok::LBrace) {
            self.chain_body(ti, ci)?;
        }
        Ok(())
    }

    fn chain_body(&mut self, ti: usize, ci: usize) -> P<()> {
        let open = self.span();
        loop {
            self.skip_separators();
            if self.split.is_some() {
                self.join_split(ti, ci);
            }
            let depth = self.depth;
            let r = match self.peek() {
                Tok::RBrace => {
                    self.bump();
                    let pending = self.split.is_some();
                    if let Some(c) = self.chain_mut(ti, ci) {
                        // The room given below, unused: the chain ended
                        // before the split.
                        let n = c.rules.len();
                        if pending && n >= HEAD_RESERVE_AT && c.rules.capacity() > n + n / 4 {
                            c.rules.shrink_to_fit();
                        }
                    }
                    return Ok(());
                }
                Tok::Eof => return self.err(open, "missing '}' at end of chain"),
                Tok::Word(w) if self.text(w) == "type" => {
                    let r = self.base_spec(ti, ci);
                    self.base_failed = r.is_err();
                    r
                }
                Tok::Word(w) if self.text(w) == "policy" => self.policy(ti, ci),
                Tok::Word(w)
                    if self.text(w) == "comment" && matches!(self.peek_at(1), Tok::Str(_)) =>
                {
                    self.bump();
                    if let Tok::Str(s) = self.bump().tok {
                        let s = self.string(s);
                        if let Some(c) = self.chain_mut(ti, ci) {
                            c.comment = Some(s);
                        }
                    }
                    Ok(())
                }
                _ => self.rule().map(|r| {
                    let split_line = self.split.as_ref().map(|s| s.line);
                    let here = r.span;
                    if let Some(c) = self.chain_mut(ti, ci) {
                        if c.rules.len() == HEAD_RESERVE_AT {
                            // A large chain while the file's second half is
                            // parsed elsewhere: room for a rule per line up to
                            // the split instead of doubling (which writes each
                            // rule twice and leaves the smaller vectors' pages
                            // behind). Unused room goes at the chain's end.
                            if let (Some(l), 0) = (split_line, here.file) {
                                c.rules.reserve(l.saturating_sub(here.line) as usize);
                            }
                        }
                        c.rules.push(r);
                    }
                }),
            };
            if r.and_then(|_| self.end_stmt()).is_err() {
                self.recover_to(depth);
            }
        }
    }

    fn base_spec(&mut self, ti: usize, ci: usize) -> P<()> {
        let start = self.bump().span;
        let (t, _) = self.keyword("chain type", &["filter", "nat", "route"])?;
        let chain_type = match t {
            "nat" => ChainType::Nat,
            "route" => ChainType::Route,
            _ => ChainType::Filter,
        };
        if !self.eat_word("hook") {
            return self.unexpected("'hook'");
        }
        let hooks = ["prerouting", "input", "forward", "output", "postrouting"];
        let (h, _) = self.keyword("hook", &hooks)?;
        let hook = match h {
            "prerouting" => Hook::Prerouting,
            "input" => Hook::Input,
            "forward" => Hook::Forward,
            "output" => Hook::Output,
            _ => Hook::Postrouting,
        };
        if self.eat_word("device") {
            self.name("device name")?;
        }
        if !self.eat_word("priority") {
            return self.unexpected("'priority'");
        }
        let priority = self.priority()?;
        let Some(chain) = self.chain_mut(ti, ci) else {
            return Ok(());
        };
        if let Some(old) = chain.base {
            if old.chain_type != chain_type || old.hook != hook || old.priority != priority {
                let name = chain.name.clone();
                return self.err(
                    start,
                    format!("duplicate chain '{name}': base chain redefined"),
                );
            }
            return Ok(());
        }
        chain.base = Some(BaseChain {
            chain_type,
            hook,
            priority,
            policy: Policy::Accept,
            span: start,
        });
        Ok(())
    }

    fn priority(&mut self) -> P<i32> {
        const NAMES: &[(&str, i32)] = &[
            ("raw", -300),
            ("mangle", -150),
            ("dstnat", -100),
            ("filter", 0),
            ("security", 50),
            ("srcnat", 100),
        ];
        let (w, sp) = self.expect_word("priority")?;
        if let Ok(n) = w.parse::<i32>() {
            return Ok(n);
        }
        let (base, rest) = match w.find(['-', '+']) {
            Some(i) if i > 0 => (&w[..i], Some(&w[i..])),
            _ => (w, None),
        };
        let Some(&(_, b)) = NAMES.iter().find(|(n, _)| *n == base) else {
            let help = suggest(base, NAMES.iter().map(|(n, _)| *n));
            return self.err_help(sp, format!("unknown chain priority '{w}'"), help);
        };
        let offset: i64 = if let Some(r) = rest {
            match r.parse::<i64>() {
                Ok(n) => n,
                Err(_) => return self.err(sp, format!("invalid priority offset '{r}'")),
            }
        } else if self.eat(&Tok::Plus) {
            let (n, nsp) = self.expect_word("number")?;
            match n.parse::<i64>() {
                Ok(n) => n,
                Err(_) => return self.err(nsp, format!("invalid priority offset '{n}'")),
            }
        } else if self.is_word("-") {
            self.bump();
            let (n, nsp) = self.expect_word("number")?;
            match n.parse::<i64>() {
                Ok(n) => -n,
                Err(_) => return self.err(nsp, format!("invalid priority offset '{n}'")),
            }
        } else if let Some(n) = self
            .word()
            .filter(|w| w.starts_with('-'))
            .and_then(|w| w.parse::<i64>().ok())
        {
            self.bump();
            n
        } else {
            0
        };
        i32::try_from(i64::from(b) + offset).or_else(|_| self.err(sp, "priority out of range"))
    }

    fn policy(&mut self, ti: usize, ci: usize) -> P<()> {
        let sp = self.bump().span;
        let (p, _) = self.keyword("policy", &["accept", "drop"])?;
        let policy = if p == "drop" {
            Policy::Drop
        } else {
            Policy::Accept
        };
        let base_failed = self.base_failed;
        match self.chain_mut(ti, ci).and_then(|c| c.base.as_mut()) {
            Some(b) => {
                b.policy = policy;
                Ok(())
            }
            None if base_failed => Err(Fail),
            None => self.err(
                sp,
                "policy is only valid on base chains (add 'type ... hook ... priority ...' first)",
            ),
        }
    }

    /// `comment "TEXT"` in a declaration's body (at `isp`): the text.
    fn comment(&mut self, isp: Span) -> P<String> {
        self.bump();
        match self.bump().tok {
            Tok::Str(s) => Ok(self.string(s)),
            _ => self.err(isp, "expected a string after 'comment'"),
        }
    }

    /// `flowtable NAME { hook ingress priority P; devices = { D, ... };
    /// [flags offload;] [counter] }`.
    /// The items of a `{ ... }` block whose `{` was read, up to its `}`,
    /// one `item` per statement; a failed item is skipped to its end (its
    /// error reported) and the others still read. Returns whether any
    /// item failed; an end of file before the `}` is an error at `sp`.
    fn block_items(
        &mut self,
        sp: Span,
        what: &str,
        mut item: impl FnMut(&mut Self) -> P<()>,
    ) -> P<bool> {
        let mut failed = false;
        loop {
            self.skip_separators();
            if self.eat(&Tok::RBrace) {
                return Ok(failed);
            }
            if matches!(self.peek(), Tok::Eof) {
                return self.err(sp, format!("missing '}}' at end of {what}"));
            }
            let depth = self.depth;
            let r = item(self);
            if r.and_then(|_| self.end_stmt()).is_err() {
                failed = true;
                self.recover_to(depth);
            }
        }
    }

    fn flowtable_decl(&mut self, ti: usize) -> P<()> {
        let (name, sp) = self.name("flowtable name")?;
        self.expect(Tok::LBrace)?;
        let mut ft = Flowtable {
            name,
            priority: 0,
            devices: Vec::new(),
            offload: false,
            counter: false,
            span: sp,
        };
        let mut hooked = false;
        let mut failed =
            self.block_items(sp, "flowtable", |p| p.flowtable_item(&mut ft, &mut hooked))?;
        if !hooked && !failed {
            failed = true;
            self.diags.push(RawDiag::new(
                sp,
                "flowtable needs 'hook ingress priority P'".to_string(),
            ));
        }
        let Some(t) = self.tables.get_mut(ti) else {
            return Err(Fail);
        };
        if t.flowtables.iter().any(|f| f.name == ft.name) {
            let msg = format!("duplicate flowtable '{}' in this table", ft.name);
            return self.err(sp, msg);
        }
        // Declared even when an item was wrong, so that the rules naming
        // it do not add errors of their own.
        t.flowtables.push(ft);
        if failed {
            Err(Fail)
        } else {
            Ok(())
        }
    }

    fn flowtable_item(&mut self, ft: &mut Flowtable, hooked: &mut bool) -> P<()> {
        let (w, wsp) = self.keyword(
            "flowtable item",
            &["hook", "devices", "flags", "counter", "comment"],
        )?;
        match w {
            "hook" => {
                self.keyword("flowtable hook", &["ingress"])?;
                if !self.eat_word("priority") {
                    return self.unexpected("'priority'");
                }
                ft.priority = self.priority()?;
                *hooked = true;
            }
            "devices" => {
                if !self.eat(&Tok::Assign) {
                    return self.unexpected("'='");
                }
                if self.eat(&Tok::LBrace) {
                    loop {
                        self.skip_separators();
                        if self.eat(&Tok::RBrace) {
                            break;
                        }
                        ft.devices.push(self.name("device name")?.0);
                        self.skip_separators();
                        if !self.eat(&Tok::Comma) && !matches!(self.peek(), Tok::RBrace) {
                            return self.unexpected("',' or '}'");
                        }
                    }
                } else {
                    ft.devices.push(self.name("device name")?.0);
                }
            }
            "flags" => {
                self.keyword("flowtable flag", &["offload"])?;
                ft.offload = true;
            }
            "counter" => ft.counter = true,
            _ => {
                if !matches!(self.bump().tok, Tok::Str(_)) {
                    return self.err(wsp, "expected a string after 'comment'");
                }
            }
        }
        Ok(())
    }

    /// `ct timeout NAME { protocol tcp|udp; [l3proto ip|ip6|inet;] policy
    /// = { STATE: SECONDS, ... } }` (after `ct timeout`).
    fn ct_timeout_decl(&mut self, ti: usize) -> P<()> {
        let (name, sp) = self.name("ct timeout name")?;
        self.expect(Tok::LBrace)?;
        let mut protocol: Option<u8> = None;
        let mut l3proto = None;
        // States as written, checked against the protocol at the end
        // (nft takes `policy` before `protocol` too).
        let mut policy: Vec<(String, Span, u32)> = Vec::new();
        let mut failed = self.block_items(sp, "ct timeout", |p| {
            p.ct_timeout_item(&mut protocol, &mut l3proto, &mut policy)
        })?;
        let no_protocol = protocol.is_none();
        if no_protocol && !failed {
            failed = true;
            self.diags.push(RawDiag::new(
                sp,
                format!(
                    "ct timeout '{name}' has no protocol; add 'protocol tcp' or 'protocol udp'"
                ),
            ));
        }
        let protocol = protocol.unwrap_or(17);
        let states = CtTimeoutState::of_protocol(protocol);
        let mut set: Vec<(CtTimeoutState, u32)> = Vec::new();
        for (st, ssp, v) in policy.into_iter().filter(|_| !no_protocol) {
            match states.iter().find(|s| s.name() == st) {
                Some(s) => match set.iter_mut().find(|(k, _)| k == s) {
                    Some(e) => e.1 = v,
                    None => set.push((*s, v)),
                },
                None => {
                    let proto = if protocol == 6 { "tcp" } else { "udp" };
                    let help = suggest(&st, states.iter().map(|s| s.name()));
                    self.diags.push(
                        RawDiag::new(ssp, format!("invalid state '{st}' for protocol {proto}"))
                            .help(help),
                    );
                    failed = true;
                }
            }
        }
        set.sort_by_key(|(s, _)| *s);
        let Some(t) = self.tables.get_mut(ti) else {
            return Err(Fail);
        };
        if t.ct_timeouts.iter().any(|c| c.name == name) {
            return self.err(sp, format!("duplicate ct timeout '{name}' in this table"));
        }
        // Declared even when an item was wrong, so that the rules naming
        // it do not add errors of their own.
        t.ct_timeouts.push(CtTimeout {
            name,
            protocol,
            l3proto,
            policy: set,
            span: sp,
        });
        if failed {
            Err(Fail)
        } else {
            Ok(())
        }
    }

    fn ct_timeout_item(
        &mut self,
        protocol: &mut Option<u8>,
        l3proto: &mut Option<Family>,
        policy: &mut Vec<(String, Span, u32)>,
    ) -> P<()> {
        let (w, _) = self.keyword(
            "ct timeout item",
            &["protocol", "l3proto", "policy", "comment"],
        )?;
        match w {
            "protocol" => {
                let (p, psp) = self.expect_word("'tcp' or 'udp'")?;
                *protocol = Some(match p {
                    "tcp" => 6,
                    "udp" => 17,
                    _ => {
                        return self.err(
                            psp,
                            format!(
                                "ct timeout protocol '{p}' is not supported: nft takes \
                                 'tcp' or 'udp'"
                            ),
                        )
                    }
                });
            }
            "l3proto" => {
                let (f, _) = self.keyword("l3proto", &["ip", "ip6", "inet"])?;
                *l3proto = Some(match f {
                    "ip" => Family::Ip,
                    "ip6" => Family::Ip6,
                    _ => Family::Inet,
                });
            }
            "policy" => {
                self.expect(Tok::Assign)?;
                self.expect(Tok::LBrace)?;
                loop {
                    self.skip_newlines();
                    if self.eat(&Tok::RBrace) {
                        break;
                    }
                    let (w, ssp) = self.expect_word("a state such as 'established'")?;
                    // `state:120` and `state:` lex as one word (the
                    // colon of an IPv6 address).
                    let (st, v, vsp) = match w.split_once(':') {
                        Some((st, "")) => {
                            let (v, vsp) = self.expect_word("a timeout in seconds")?;
                            (st, v, vsp)
                        }
                        Some((st, v)) => (st, v, ssp),
                        None => {
                            self.expect(Tok::Colon)?;
                            let (v, vsp) = self.expect_word("a timeout in seconds")?;
                            (w, v, vsp)
                        }
                    };
                    let st = st.to_string();
                    let Some(v) = parse_num(v).and_then(|n| u32::try_from(n).ok()) else {
                        return self.err(
                            vsp,
                            format!("invalid timeout '{v}': expected whole seconds (0-4294967295)"),
                        );
                    };
                    policy.push((st, ssp, v));
                    self.skip_newlines();
                    if !self.eat(&Tok::Comma) && !matches!(self.peek(), Tok::RBrace) {
                        return self.unexpected("',' or '}'");
                    }
                }
            }
            _ => {
                if !matches!(self.bump().tok, Tok::Str(_)) {
                    return self.unexpected("a string after 'comment'");
                }
            }
        }
        Ok(())
    }

    /// `counter NAME { ... }`, `quota NAME { ... }`, `limit NAME { ... }`
    /// (the body is optional when `body_optional`, as in `add counter ip t
    /// c`).
    fn obj_decl(&mut self, ti: usize, kind: ObjKind, body_optional: bool) -> P<()> {
        let (name, sp) = self.name(obj_name_what(kind))?;
        let (mut packets, mut bytes) = (0, 0);
        let mut quota = None;
        let mut limit = None;
        let mut comment = None;
        let has_body = if body_optional {
            self.eat(&Tok::LBrace)
        } else {
            self.expect(Tok::LBrace)?;
            true
        };
        let (mut failed, mut done) = (false, false);
        while has_body && !done {
            self.skip_separators();
            if self.eat(&Tok::RBrace) {
                done = true;
                continue;
            }
            let depth = self.depth;
            let isp = self.span();
            let r: P<()> = match self.peek() {
                Tok::Eof => return self.err(sp, format!("missing '}}' at end of {}", kind.name())),
                Tok::Word(w) => match (kind, self.text(w)) {
                    (_, "comment") => self.comment(isp).map(|c| comment = Some(c)),
                    (ObjKind::Counter, "packets") => {
                        self.bump();
                        self.number("packet count").map(|n| packets = n)
                    }
                    (ObjKind::Counter, "bytes") => {
                        self.bump();
                        self.number("byte count").map(|n| bytes = n)
                    }
                    (ObjKind::Quota, _) if quota.is_none() => self.quota().map(|q| quota = Some(q)),
                    (ObjKind::Limit, "rate") if limit.is_none() => {
                        self.limit().map(|l| limit = Some(l))
                    }
                    (_, w) => {
                        let opts: &[&str] = match kind {
                            ObjKind::Counter => &["packets", "bytes", "comment"],
                            ObjKind::Quota => &["over", "until", "used", "comment"],
                            ObjKind::Limit => &["rate", "comment"],
                        };
                        let help = suggest(w, opts.iter().copied());
                        self.err_help(isp, format!("unknown {} item '{w}'", kind.name()), help)
                    }
                },
                _ => self.unexpected(match kind {
                    ObjKind::Counter => "'packets', 'bytes' or 'comment'",
                    ObjKind::Quota => "a quota such as 'over 100 mbytes'",
                    ObjKind::Limit => "a rate such as 'rate 10/second'",
                }),
            };
            // `packets N bytes M` share a line.
            if r.is_ok() && kind == ObjKind::Counter && self.is_word("bytes") {
                continue;
            }
            if r.and_then(|_| self.end_stmt()).is_err() {
                failed = true;
                self.recover_to(depth);
            }
        }
        if failed {
            return Err(Fail);
        }
        let state = match kind {
            ObjKind::Counter => ObjState::Counter { packets, bytes },
            ObjKind::Quota => match quota {
                Some(q) => ObjState::Quota(q),
                None => {
                    return self.err(
                        sp,
                        format!("quota '{name}' has no amount; add one such as 'over 100 mbytes'"),
                    )
                }
            },
            ObjKind::Limit => match limit {
                Some(l) => ObjState::Limit(l),
                None => {
                    return self.err(
                        sp,
                        format!("limit '{name}' has no rate; add one such as 'rate 10/second'"),
                    )
                }
            },
        };
        let Some(t) = self.tables.get_mut(ti) else {
            return Err(Fail);
        };
        if t.objects.iter().any(|o| o.kind() == kind && o.name == name) {
            return self.err(
                sp,
                format!("duplicate {} '{name}' in this table", kind.name()),
            );
        }
        t.objects.push(Object {
            name,
            state,
            comment,
            span: sp,
        });
        Ok(())
    }

    fn set_decl(&mut self, ti: usize, is_map: bool) -> P<()> {
        let (name, sp) = self.name("set name")?;
        self.expect(Tok::LBrace)?;
        let mut key: Option<Vec<DataType>> = None;
        let mut key_typeof = None;
        let mut data = None;
        let mut flags = Vec::new();
        let mut elements = Vec::new();
        let mut comment = None;
        let mut timeout_ms = None;
        let mut size = None;
        let mut failed = false;
        loop {
            self.skip_separators();
            let depth = self.depth;
            let isp = self.span();
            let r: P<()> = match self.peek() {
                Tok::RBrace => {
                    self.bump();
                    break;
                }
                Tok::Eof => return self.err(sp, "missing '}' at end of set"),
                Tok::Word(w) => match self.text(w) {
                    "type" => {
                        self.bump();
                        self.type_list().and_then(|k| {
                            key = Some(k);
                            if is_map {
                                self.expect(Tok::Colon)?;
                                data = Some(self.data_type()?);
                            }
                            Ok(())
                        })
                    }
                    "typeof" => {
                        self.bump();
                        self.fields().and_then(|(f, _)| {
                            key = Some(f.iter().map(|f| f.datatype()).collect());
                            key_typeof = Some(f.to_vec());
                            if is_map {
                                self.expect(Tok::Colon)?;
                                data = Some(if self.word().is_some_and(is_expr_keyword) {
                                    let (f, fsp) = self.fields()?;
                                    match f.as_slice() {
                                        [one] => one.datatype(),
                                        _ => {
                                            return self
                                                .err(fsp, "map data cannot be a concatenation")
                                        }
                                    }
                                } else {
                                    self.data_type()?
                                });
                            }
                            Ok(())
                        })
                    }
                    "flags" => {
                        self.bump();
                        self.set_flags().map(|f| flags = f)
                    }
                    "elements" => {
                        self.bump();
                        match key.clone() {
                            None => self.err(isp, "set elements given before the set type"),
                            Some(k) => self.expect(Tok::Assign).and_then(|_| {
                                let d = if is_map {
                                    data.or(Some(DataType::Verdict))
                                } else {
                                    None
                                };
                                elements = self.elements_with(&k, d, true)?;
                                Ok(())
                            }),
                        }
                    }
                    "comment" => self.comment(isp).map(|c| comment = Some(c)),
                    "timeout" => {
                        self.bump();
                        self.duration("set timeout").map(|t| timeout_ms = Some(t))
                    }
                    "size" => {
                        self.bump();
                        let sp = self.span();
                        self.number("set size")
                            .and_then(|n| match u32::try_from(n) {
                                Ok(n) if n > 0 => {
                                    size = Some(n);
                                    Ok(())
                                }
                                _ => self.err(
                                    sp,
                                    format!("set size {n} is not between 1 and 4294967295"),
                                ),
                            })
                    }
                    "gc-interval" | "policy" => {
                        self.bump();
                        self.expect_word("value").map(|_| ())
                    }
                    "auto-merge" => {
                        self.bump();
                        Ok(())
                    }
                    "counter" => self.err(
                        isp,
                        "per-element counters ('counter' on a set and its elements) are not \
                         supported; count with a rule's 'counter' instead",
                    ),
                    w => {
                        let opts = [
                            "type", "typeof", "flags", "elements", "comment", "size", "timeout",
                            "policy",
                        ];
                        let help = suggest(w, opts);
                        self.err_help(isp, format!("unknown set item '{w}'"), help)
                    }
                },
                _ => self.unexpected("a set item"),
            };
            if r.and_then(|_| self.end_stmt()).is_err() {
                failed = true;
                self.recover_to(depth);
            }
        }
        let Some(key) = key else {
            if failed {
                return Err(Fail);
            }
            return self.err(
                sp,
                format!("set '{name}' has no type; add 'type TYPE' or 'typeof EXPR'"),
            );
        };
        let Some(t) = self.tables.get_mut(ti) else {
            return Err(Fail);
        };
        if t.sets.iter().any(|s| s.name == name) || t.maps.iter().any(|m| m.name == name) {
            return self.err(sp, format!("duplicate set '{name}'"));
        }
        if is_map {
            t.maps.push(Map {
                name,
                key,
                key_typeof,
                data: data.unwrap_or(DataType::Verdict),
                flags,
                elements,
                comment,
                span: sp,
            });
        } else {
            t.sets.push(Set {
                name,
                key,
                key_typeof,
                flags,
                timeout_ms,
                size,
                elements,
                comment,
                span: sp,
            });
        }
        Ok(())
    }

    fn data_type(&mut self) -> P<DataType> {
        let (w, sp) = self.expect_word("data type")?;
        match DataType::ALL.iter().find(|d| d.name() == w) {
            Some(d) => Ok(*d),
            None => {
                let help = suggest(w, DataType::ALL.iter().map(|d| d.name()));
                self.err_help(sp, format!("unknown data type '{w}'"), help)
            }
        }
    }

    fn type_list(&mut self) -> P<Vec<DataType>> {
        let mut v = vec![self.data_type()?];
        while self.eat(&Tok::Dot) {
            v.push(self.data_type()?);
        }
        Ok(v)
    }

    fn set_flags(&mut self) -> P<Vec<SetFlag>> {
        let mut v = Vec::new();
        loop {
            let (f, _) =
                self.keyword("set flag", &["constant", "interval", "timeout", "dynamic"])?;
            v.push(match f {
                "constant" => SetFlag::Constant,
                "interval" => SetFlag::Interval,
                "timeout" => SetFlag::Timeout,
                _ => SetFlag::Dynamic,
            });
            if !self.eat(&Tok::Comma) {
                return Ok(v);
            }
        }
    }

    fn command(&mut self, insert: bool) -> P<()> {
        let opts: &[&str] = if insert {
            &["rule"]
        } else {
            &[
                "table",
                "chain",
                "rule",
                "set",
                "map",
                "element",
                "counter",
                "quota",
                "limit",
                "flowtable",
            ]
        };
        // `add ct timeout [FAMILY] TABLE NAME { ... }`.
        if !insert && self.is_word("ct") && self.word_at(1) == Some("timeout") {
            self.bump();
            self.bump();
            let fam = self.family_opt()?;
            let (tname, tsp) = self.name("table name")?;
            let ti = self.find_table(fam, &tname, tsp)?;
            return self.ct_timeout_decl(ti);
        }
        let (what, _) = self.keyword("object", opts)?;
        let fam = self.family_opt()?;
        let (tname, tsp) = self.name("table name")?;
        match what {
            "table" => {
                let ti = self.table_index(fam, &tname, tsp);
                if self.eat(&Tok::LBrace) {
                    self.table_body(ti)?;
                }
                Ok(())
            }
            "chain" => {
                let ti = self.find_table(fam, &tname, tsp)?;
                let mut seen = HashSet::new();
                self.chain_decl(ti, &mut seen)
            }
            "set" | "map" => {
                let ti = self.find_table(fam, &tname, tsp)?;
                self.set_decl(ti, what == "map")
            }
            "counter" | "quota" | "limit" => {
                let ti = self.find_table(fam, &tname, tsp)?;
                self.obj_decl(ti, obj_kind(what), what == "counter")
            }
            "flowtable" => {
                let ti = self.find_table(fam, &tname, tsp)?;
                self.flowtable_decl(ti)
            }
            "element" => {
                let ti = self.find_table(fam, &tname, tsp)?;
                let (sname, ssp) = self.name("set name")?;
                let (key, data) = self.set_key(ti, &sname, ssp)?;
                let is_map = data.is_some();
                let elems = self.elements_with(&key, data, true)?;
                let t = self.tables.get_mut(ti).ok_or(Fail)?;
                if is_map {
                    if let Some(m) = t.maps.iter_mut().find(|m| m.name == sname) {
                        m.elements.extend(elems);
                    }
                } else if let Some(s) = t.sets.iter_mut().find(|s| s.name == sname) {
                    s.elements.extend(elems);
                }
                Ok(())
            }
            _ => {
                // rule
                let ti = self.find_table(fam, &tname, tsp)?;
                let (cname, csp) = self.name("chain name")?;
                let ci = self.find_chain(ti, &cname, csp)?;
                let mut position = None;
                if matches!(self.word(), Some("position" | "index" | "handle")) {
                    self.bump();
                    let (n, nsp) = self.expect_word("number")?;
                    position = Some(
                        n.parse::<usize>()
                            .or_else(|_| self.err(nsp, "expected a number"))?,
                    );
                }
                let rule = self.rule()?;
                let chain = self.chain_mut(ti, ci).ok_or(Fail)?;
                match (insert, position) {
                    (true, None) => chain.rules.insert(0, rule),
                    (false, None) => chain.rules.push(rule),
                    (_, Some(p)) => {
                        let p = p.min(chain.rules.len());
                        chain.rules.insert(
                            if insert {
                                p
                            } else {
                                (p + 1).min(chain.rules.len())
                            },
                            rule,
                        );
                    }
                }
                Ok(())
            }
        }
    }

    fn flush(&mut self) -> P<()> {
        let (what, _) = self.keyword("object", &["ruleset", "table", "chain", "set", "map"])?;
        if what == "ruleset" {
            self.tables.clear();
            return Ok(());
        }
        let fam = self.family_opt()?;
        let (tname, tsp) = self.name("table name")?;
        let ti = self.find_table(fam, &tname, tsp)?;
        match what {
            "table" => {
                if let Some(t) = self.tables.get_mut(ti) {
                    t.chains.iter_mut().for_each(|c| c.rules.clear());
                }
            }
            "chain" => {
                let (c, csp) = self.name("chain name")?;
                let ci = self.find_chain(ti, &c, csp)?;
                if let Some(c) = self.chain_mut(ti, ci) {
                    c.rules.clear();
                }
            }
            _ => {
                let (s, _) = self.name("set name")?;
                if let Some(t) = self.tables.get_mut(ti) {
                    t.sets
                        .iter_mut()
                        .filter(|x| x.name == s)
                        .for_each(|x| x.elements.clear());
                    t.maps
                        .iter_mut()
                        .filter(|x| x.name == s)
                        .for_each(|x| x.elements.clear());
                }
            }
        }
        Ok(())
    }

    // ---- rules ------------------------------------------------------------

    /// One rule. Matches and statements are collected in reusable scratch
    /// vectors and moved into the rule with exact capacity: a rule set holds
    /// many rules, and growth slack would be most of their memory.
    fn rule(&mut self) -> P<Rule> {
        let mut matches = std::mem::take(&mut self.scratch_matches);
        let mut stmts = std::mem::take(&mut self.scratch_stmts);
        matches.clear();
        stmts.clear();
        let r = self.rule_into(&mut matches, &mut stmts);
        let r = r.map(|mut rule| {
            rule.matches = Vec::with_capacity(matches.len());
            rule.matches.append(&mut matches);
            rule.stmts = Vec::with_capacity(stmts.len());
            rule.stmts.append(&mut stmts);
            rule
        });
        self.scratch_matches = matches;
        self.scratch_stmts = stmts;
        r
    }

    /// [`Self::rule`], with matches and statements pushed to the given vectors.
    fn rule_into(&mut self, matches: &mut Vec<Match>, stmts: &mut Vec<Stmt>) -> P<Rule> {
        let span = self.span();
        let mut rule = Rule {
            matches: Vec::new(),
            stmts: Vec::new(),
            handle: None,
            comment: None,
            span,
        };
        while !self.at_stmt_end() {
            let sp = self.span();
            let Some(w) = self.word() else {
                return self.unexpected("a match or statement");
            };
            if w.starts_with('$') {
                return Err(Fail);
            }
            if w == "comment" {
                self.bump();
                match self.bump().tok {
                    Tok::Str(s) => rule.comment = Some(self.string(s)),
                    _ => return self.err(sp, "expected a string after 'comment'"),
                }
                continue;
            }
            if is_stmt_keyword(w) {
                let kind = self.stmt(w)?;
                stmts.push(Stmt { kind, span: sp });
                continue;
            }
            if w == "tcp" && self.word_at(1) == Some("option") {
                let kind = self.tcp_option()?;
                stmts.push(Stmt { kind, span: sp });
                continue;
            }
            if w == "numgen" {
                let kind = self.numgen(sp)?;
                stmts.push(Stmt { kind, span: sp });
                continue;
            }
            if (w == "meta" && self.word_at(1) == Some("nftrace")) || w == "nftrace" {
                if w == "meta" {
                    self.bump();
                }
                self.bump();
                if !self.eat_word("set") {
                    return self.unexpected("'set' and 0 or 1");
                }
                let (v, vsp) = self.expect_word("0 or 1")?;
                let on = match parse_num(v) {
                    Some(n @ 0..=1) => n as u8,
                    _ => return self.err(vsp, format!("nftrace value '{v}' is not 0 or 1")),
                };
                stmts.push(Stmt {
                    kind: StmtKind::NftraceSet(on),
                    span: sp,
                });
                continue;
            }
            if w == "ct" && self.word_at(1) == Some("timeout") {
                self.bump();
                self.bump();
                if !self.eat_word("set") {
                    return self.unexpected("'set' and a ct timeout name");
                }
                let (name, _) = self.name("ct timeout name")?;
                stmts.push(Stmt {
                    kind: StmtKind::CtTimeoutSet(name),
                    span: sp,
                });
                continue;
            }
            if w == "ct" && self.word_at(1) == Some("count") {
                self.bump();
                self.bump();
                let kind = StmtKind::CtCount(self.ct_count()?);
                stmts.push(Stmt { kind, span: sp });
                continue;
            }
            if let Some(why) = unsupported_keyword(w) {
                return self.err(sp, format!("'{w}' is not supported: {why}"));
            }
            if !is_expr_keyword(w) {
                let help = suggest(w, STMT_KEYWORDS.iter().chain(EXPR_KEYWORDS).copied());
                return self.err_help(sp, format!("unknown statement or expression '{w}'"), help);
            }
            let (fields, _) = self.fields()?;
            // One look at the next word for the two rare forms.
            let next = match self.word() {
                Some("set") => 1,
                Some("vmap") => 2,
                _ => 0,
            };
            if next == 1 {
                self.bump();
                // A mark from a map: `meta mark set ip saddr map @m` (the
                // key read again below when no `map` follows it).
                if matches!(fields.as_slice(), [Field::MetaMark] | [Field::CtMark])
                    && self.word().is_some_and(is_expr_keyword)
                {
                    let at = self.pos;
                    let (key, _) = self.fields()?;
                    if self.eat_word("map") {
                        let map = self.map_ref(&key, DataType::Mark)?;
                        stmts.push(Stmt {
                            kind: StmtKind::MarkMap {
                                ct: fields.as_slice() == [Field::CtMark],
                                key: key.to_vec(),
                                map: Box::new(map),
                            },
                            span: sp,
                        });
                        continue;
                    }
                    self.pos = at;
                }
                // Connmark: `meta mark set ct mark`, `ct mark set meta mark`
                // (also `mark set ct mark`, `ct mark set mark`).
                // A mark changed bit by bit: `meta mark set meta mark | 0x4000`.
                let own = match (fields.as_slice(), self.word(), self.word_at(1)) {
                    ([Field::MetaMark], Some("meta"), Some("mark")) => Some(2),
                    ([Field::MetaMark], Some("mark"), _) => Some(1),
                    ([Field::CtMark], Some("ct"), Some("mark")) => Some(2),
                    _ => None,
                };
                if let Some(words) = own {
                    for _ in 0..words {
                        self.bump();
                    }
                    let (and, xor) = self.mark_ops()?;
                    let ct = fields.as_slice() == [Field::CtMark];
                    let kind = match (ct, and) {
                        (false, 0) => StmtKind::MetaMarkSet(xor),
                        (true, 0) => StmtKind::CtMarkSet(xor),
                        (false, _) => StmtKind::MetaMarkMod { and, xor },
                        (true, _) => StmtKind::CtMarkMod { and, xor },
                    };
                    stmts.push(Stmt { kind, span: sp });
                    continue;
                }
                let copy = match (fields.as_slice(), self.word(), self.word_at(1)) {
                    ([Field::MetaMark], Some("ct"), Some("mark")) => {
                        Some((2, StmtKind::MetaMarkFromCt))
                    }
                    ([Field::CtMark], Some("meta"), Some("mark")) => {
                        Some((2, StmtKind::CtMarkFromMeta))
                    }
                    ([Field::CtMark], Some("mark"), _) => Some((1, StmtKind::CtMarkFromMeta)),
                    _ => None,
                };
                if let Some((words, kind)) = copy {
                    for _ in 0..words {
                        self.bump();
                    }
                    if matches!(self.peek(), Tok::Amp | Tok::Pipe | Tok::Caret)
                        || matches!(self.word(), Some("and" | "or" | "xor"))
                    {
                        let osp = self.span();
                        return self.err(
                            osp,
                            "a copied mark cannot be masked here; copy it whole, or change \
                             the mark in place (meta mark set meta mark & ...)",
                        );
                    }
                    stmts.push(Stmt { kind, span: sp });
                    continue;
                }
                let (v, vsp) = self.expect_word("mark value")?;
                let n = parse_num(v).and_then(|n| u32::try_from(n).ok());
                let Some(n) = n else {
                    return self.err(vsp, format!("invalid mark value '{v}'"));
                };
                let kind = match fields.as_slice() {
                    [Field::MetaMark] => StmtKind::MetaMarkSet(n),
                    [Field::CtMark] => StmtKind::CtMarkSet(n),
                    _ => {
                        return self.err(sp, "only 'meta mark set' and 'ct mark set' are supported")
                    }
                };
                stmts.push(Stmt { kind, span: sp });
                continue;
            }
            if next == 2 {
                self.bump();
                let map = self.map_ref(&fields, DataType::Verdict)?;
                stmts.push(Stmt {
                    kind: StmtKind::VerdictMap {
                        key: fields.to_vec(),
                        map: Box::new(map),
                    },
                    span: sp,
                });
                continue;
            }
            let m = self.relational(fields, sp)?;
            if !stmts.is_empty() {
                return self.err(sp, "matches must come before statements in a rule");
            }
            matches.push(m);
        }
        Ok(rule)
    }

    fn fields(&mut self) -> P<(Fields, Span)> {
        let sp = self.span();
        let mut v = Fields::from(self.field()?);
        while self.peek() == Tok::Dot && self.word_at(1).is_some_and(is_expr_keyword) {
            self.bump();
            v.push(self.field()?);
        }
        Ok((v, sp))
    }

    fn field(&mut self) -> P<Field> {
        // The common two-word fields in one step (no table scan); anything
        // else, errors included, takes the general path below.
        if let (Some(a), Some(b)) = (self.word(), self.word_at(1)) {
            let f = match (a, b) {
                ("ip", "saddr") => Some(Field::IpSaddr),
                ("ip", "daddr") => Some(Field::IpDaddr),
                ("tcp", "dport") => Some(Field::TcpDport),
                ("udp", "dport") => Some(Field::UdpDport),
                ("tcp", "sport") => Some(Field::TcpSport),
                ("udp", "sport") => Some(Field::UdpSport),
                ("ip6", "saddr") => Some(Field::Ip6Saddr),
                ("ip6", "daddr") => Some(Field::Ip6Daddr),
                ("ct", "state") => Some(Field::CtState),
                _ => None,
            };
            if let Some(f) = f {
                self.bump();
                self.bump();
                return Ok(f);
            }
        }
        let (w, sp) = self.expect_word("an expression")?;
        let sub = |p: &mut Self, what: &str, opts: &[(&str, Field)]| -> P<Field> {
            let (s, ssp) = p.expect_word(format_args!("{what} field"))?;
            match opts.iter().find(|(n, _)| *n == s) {
                Some((_, f)) => Ok(*f),
                None => match unsupported_field(what, s) {
                    Some(why) => p.err(ssp, format!("'{what} {s}' is not supported: {why}")),
                    None => {
                        let help = suggest(s, opts.iter().map(|(n, _)| *n));
                        p.err_help(ssp, format!("unknown {what} field '{s}'"), help)
                    }
                },
            }
        };
        Ok(match w {
            "iifname" => Field::Iifname,
            "oifname" => Field::Oifname,
            "iif" => Field::Iif,
            "oif" => Field::Oif,
            "mark" => Field::MetaMark,
            "l4proto" => Field::MetaL4proto,
            "nfproto" => Field::MetaNfproto,
            "pkttype" => Field::MetaPkttype,
            "meta" => sub(
                self,
                "meta",
                &[
                    ("iifname", Field::Iifname),
                    ("oifname", Field::Oifname),
                    ("iif", Field::Iif),
                    ("oif", Field::Oif),
                    ("l4proto", Field::MetaL4proto),
                    ("nfproto", Field::MetaNfproto),
                    ("protocol", Field::MetaProtocol),
                    ("mark", Field::MetaMark),
                    ("length", Field::MetaLength),
                    ("pkttype", Field::MetaPkttype),
                    ("time", Field::MetaTime),
                    ("day", Field::MetaDay),
                    ("hour", Field::MetaHour),
                ],
            )?,
            "ip" => sub(
                self,
                "ip",
                &[
                    ("saddr", Field::IpSaddr),
                    ("daddr", Field::IpDaddr),
                    ("protocol", Field::IpProtocol),
                    ("ttl", Field::IpTtl),
                    ("length", Field::IpLength),
                    ("dscp", Field::IpDscp),
                    ("frag-off", Field::IpFragOff),
                ],
            )?,
            "ip6" => sub(
                self,
                "ip6",
                &[
                    ("saddr", Field::Ip6Saddr),
                    ("daddr", Field::Ip6Daddr),
                    ("nexthdr", Field::Ip6Nexthdr),
                    ("hoplimit", Field::Ip6Hoplimit),
                    ("length", Field::Ip6Length),
                    ("dscp", Field::Ip6Dscp),
                ],
            )?,
            "tcp" => sub(
                self,
                "tcp",
                &[
                    ("sport", Field::TcpSport),
                    ("dport", Field::TcpDport),
                    ("flags", Field::TcpFlags),
                ],
            )?,
            "udp" => sub(
                self,
                "udp",
                &[("sport", Field::UdpSport), ("dport", Field::UdpDport)],
            )?,
            "th" => sub(
                self,
                "th",
                &[("sport", Field::ThSport), ("dport", Field::ThDport)],
            )?,
            "icmp" => sub(
                self,
                "icmp",
                &[("type", Field::IcmpType), ("code", Field::IcmpCode)],
            )?,
            "icmpv6" => sub(
                self,
                "icmpv6",
                &[("type", Field::Icmpv6Type), ("code", Field::Icmpv6Code)],
            )?,
            "ether" => sub(
                self,
                "ether",
                &[
                    ("saddr", Field::EtherSaddr),
                    ("daddr", Field::EtherDaddr),
                    ("type", Field::EtherType),
                ],
            )?,
            "fib" => {
                // `fib daddr type` / `fib saddr type`: the route type of
                // the address; `fib saddr [. mark] [. iif] oif`: is there a
                // route back to the source (through the input interface)?
                // `. mark` is accepted and has no effect: Sluice routes by
                // destination only.
                let (a, asp) = self.expect_word("fib field")?;
                let saddr = match a {
                    "daddr" => false,
                    "saddr" => true,
                    _ => {
                        let help = suggest(a, ["daddr", "saddr"]);
                        return self.err_help(asp, format!("unknown fib field '{a}'"), help);
                    }
                };
                let (mut iif, mut other) = (false, false);
                while self.eat(&Tok::Dot) {
                    let (k, _) = self.keyword("fib key", &["iif", "mark", "oif"])?;
                    iif |= k == "iif";
                    other |= k == "oif";
                }
                let unsupported = |p: &mut Self| {
                    let sp = p.span();
                    p.err(
                        sp,
                        "unsupported fib form: 'fib daddr type', 'fib saddr type' and \
                         'fib saddr [. mark] [. iif] oif missing|exists' are supported",
                    )
                };
                if self.eat_word("type") {
                    if iif || other {
                        return unsupported(self);
                    }
                    if saddr {
                        Field::FibSaddrType
                    } else {
                        Field::FibDaddrType
                    }
                } else if saddr && !other && self.eat_word("oif") {
                    if iif {
                        Field::FibSaddrIifOif
                    } else {
                        Field::FibSaddrOif
                    }
                } else {
                    return unsupported(self);
                }
            }
            "ct" if matches!(self.word(), Some("original" | "reply")) => {
                let (dir, _) = self.expect_word("direction")?;
                let orig = dir == "original";
                let fam = match self.word() {
                    Some(f @ ("ip" | "ip6")) => {
                        self.bump();
                        Some(f == "ip")
                    }
                    _ => None,
                };
                let (what, wsp) = self.expect_word("ct tuple field")?;
                match (fam, what) {
                    (Some(v4), "saddr" | "daddr") => {
                        let src = what == "saddr";
                        match (orig, v4, src) {
                            (true, true, true) => Field::CtOrigIpSaddr,
                            (true, true, false) => Field::CtOrigIpDaddr,
                            (false, true, true) => Field::CtReplyIpSaddr,
                            (false, true, false) => Field::CtReplyIpDaddr,
                            (true, false, true) => Field::CtOrigIp6Saddr,
                            (true, false, false) => Field::CtOrigIp6Daddr,
                            (false, false, true) => Field::CtReplyIp6Saddr,
                            (false, false, false) => Field::CtReplyIp6Daddr,
                        }
                    }
                    (None, "saddr" | "daddr") => {
                        return self.err(
                            wsp,
                            format!("say 'ct {dir} ip {what}' or 'ct {dir} ip6 {what}'"),
                        )
                    }
                    (None, "proto-src") if orig => Field::CtOrigProtoSrc,
                    (None, "proto-dst") if orig => Field::CtOrigProtoDst,
                    (None, "proto-src") => Field::CtReplyProtoSrc,
                    (None, "proto-dst") => Field::CtReplyProtoDst,
                    _ => {
                        let help = suggest(what, ["saddr", "daddr", "proto-src", "proto-dst"]);
                        return self.err_help(
                            wsp,
                            format!("unknown ct {dir} field '{what}'"),
                            help,
                        );
                    }
                }
            }
            "ct" => sub(
                self,
                "ct",
                &[
                    ("state", Field::CtState),
                    ("status", Field::CtStatus),
                    ("mark", Field::CtMark),
                    ("direction", Field::CtDirection),
                ],
            )?,
            _ => {
                let help = suggest(w, EXPR_KEYWORDS.iter().copied());
                return self.err_help(sp, format!("unknown expression '{w}'"), help);
            }
        })
    }

    fn relational(&mut self, left: Fields, span: Span) -> P<Match> {
        // Fast path, most matches: one field of a plain type, then one word
        // (`ip saddr 10.0.0.0/8`, `tcp dport 1024-2047`) not followed by a
        // spaced `- END`. What the general path below does for them, minus
        // its operator, mask, set and concatenation checks.
        if let ([f], Tok::Word(w)) = (left.as_slice(), self.peek()) {
            let dt = f.datatype();
            let spaced_range = match self.peek_at(1) {
                Tok::Word(t) => self.text(t) == "-",
                _ => false,
            };
            let text = self.text(w);
            if !dt.is_bitmask()
                && dt != DataType::Verdict
                && !spaced_range
                && !text.starts_with('$')
            {
                let sp = self.bump().span;
                let right = self.word_value(dt, text, sp)?;
                return Ok(Match {
                    left,
                    mask: None,
                    op: RelOp::Implicit,
                    right,
                    span,
                    right_span: Span {
                        len: sp.len.max(1),
                        ..sp
                    },
                });
            }
        }
        let types = KeyTypes::of(&left);
        let types = types.as_slice();
        let single = match types {
            [t] => Some(*t),
            _ => None,
        };
        let mut mask = None;
        if self.peek() == Tok::Amp {
            let asp = self.bump().span;
            match single {
                Some(dt)
                    if dt.is_bitmask()
                        || dt == DataType::Mark
                        || left.as_slice() == [Field::IpFragOff] =>
                {
                    let paren = self.eat(&Tok::LParen);
                    let mut bits = self.scalar(dt)?;
                    while self.eat(&Tok::Pipe) {
                        bits |= self.scalar(dt)?;
                    }
                    if paren {
                        self.expect(Tok::RParen)?;
                    }
                    mask = Some(bits);
                }
                _ => {
                    return self.err(
                        asp,
                        "'&' masks are only supported on flags, marks and 'ip frag-off'",
                    )
                }
            }
        }
        let op = match self.peek() {
            Tok::EqEq => RelOp::Eq,
            Tok::Ne => RelOp::Ne,
            Tok::Lt => RelOp::Lt,
            Tok::Gt => RelOp::Gt,
            Tok::Le => RelOp::Le,
            Tok::Ge => RelOp::Ge,
            _ => RelOp::Implicit,
        };
        if op != RelOp::Implicit {
            self.bump();
        }
        let right_span = self.span();
        let mut op = op;
        let mut right_span = right_span;
        let right = match (self.peek(), single) {
            (Tok::At, _) => {
                self.bump();
                let (n, nsp) = self.name("set name")?;
                right_span.len = nsp.len + 1;
                Value::SetRef(n)
            }
            (Tok::LBrace, _) => Value::Set(self.elements(types, None)?),
            (_, Some(dt)) if dt.is_bitmask() => {
                let (bits, slash) = self.bitmask_list(dt)?;
                if slash {
                    if mask.is_some() {
                        return self.err(right_span, "cannot combine '&' and '/' masks");
                    }
                    let (m, _) = self.bitmask_list(dt)?;
                    mask = Some(m);
                    if op == RelOp::Implicit {
                        op = RelOp::Eq;
                    }
                }
                Value::Num(bits)
            }
            _ => self.value_concat(types)?,
        };
        let right_span = Span {
            len: right_span.len.max(1),
            ..right_span
        };
        // A time of day range across midnight (`"22:00"-"06:00"`) is, as
        // nft rewrites it, the day outside the range between its ends.
        let (op, right) = match (single, op, right) {
            (Some(DataType::Hour), RelOp::Implicit | RelOp::Eq | RelOp::Ne, Value::Range(a, b))
                if matches!((&*a, &*b), (Value::Num(x), Value::Num(y)) if x > y) =>
            {
                let op = if op == RelOp::Ne {
                    RelOp::Implicit
                } else {
                    RelOp::Ne
                };
                (op, Value::Range(b, a))
            }
            (_, op, right) => (op, right),
        };
        Ok(Match {
            left,
            mask,
            op,
            right,
            span,
            right_span,
        })
    }

    /// `a,b,c` for bit-mask types, also `a | b` and `(a | b)` (the form
    /// nft reads for `tcp flags & (fin | syn) == fin | syn`); returns
    /// whether a `/ MASK` follows.
    fn bitmask_list(&mut self, dt: DataType) -> P<(u64, bool)> {
        let mut bits = 0;
        let paren = self.eat(&Tok::LParen);
        loop {
            let sp = self.span();
            let (w, _) = self.expect_word(format_args!("{} value", dt.name()))?;
            let (head, slash_inline) = match w.split_once('/') {
                Some((a, b)) => (a, Some(b)),
                None => (w, None),
            };
            if !head.is_empty() {
                bits |= self.scalar_word(dt, head, sp)?;
            }
            if let Some(rest) = slash_inline {
                // `syn/syn,ack`: re-insert the mask part as the next token.
                if !rest.is_empty() {
                    self.pos -= 1;
                    if let Some(t) = self.toks.get_mut(self.pos) {
                        if let Tok::Word(text) = t.tok {
                            t.tok = Tok::Word(text.suffix(head.len() + 1));
                        }
                    }
                }
                if paren {
                    self.expect(Tok::RParen)?;
                }
                return Ok((bits, true));
            }
            if !(self.eat(&Tok::Comma) || self.eat(&Tok::Pipe)) {
                break;
            }
        }
        if paren {
            self.expect(Tok::RParen)?;
        }
        if self.is_word("/") {
            self.bump();
            return Ok((bits, true));
        }
        Ok((bits, false))
    }

    /// One numeric/symbolic value (no ranges).
    fn scalar(&mut self, dt: DataType) -> P<u64> {
        let (w, sp) = self.expect_word(format_args!("{} value", dt.name()))?;
        self.scalar_word(dt, w, sp)
    }

    fn scalar_word(&mut self, dt: DataType, w: &str, sp: Span) -> P<u64> {
        if let Some(n) = parse_num(w).or_else(|| symbols::lookup(dt, w)) {
            return Ok(n);
        }
        let help = suggest(w, symbols::table(dt).iter().map(|(n, _)| *n));
        self.err_help(sp, format!("invalid {} value '{w}'", dt.name()), help)
    }

    fn value_concat(&mut self, types: &[DataType]) -> P<Value> {
        if let [dt] = types {
            return self.value(*dt);
        }
        let mut v = Vec::with_capacity(types.len());
        for (i, dt) in types.iter().enumerate() {
            if i > 0 {
                self.expect(Tok::Dot)?;
            }
            v.push(self.value(*dt)?);
        }
        Ok(Value::Concat(v))
    }

    /// One value of type `dt`, including ranges (`a-b` or `a - b`) and prefixes.
    fn value(&mut self, dt: DataType) -> P<Value> {
        let sp = self.span();
        let v = match self.peek() {
            Tok::Str(s) => {
                self.bump();
                let s = unescape(self.text(s));
                if matches!(
                    dt,
                    DataType::Ifname
                        | DataType::IfaceIndex
                        | DataType::CounterObj
                        | DataType::QuotaObj
                        | DataType::LimitObj
                ) {
                    Value::Str(s.into_owned())
                } else {
                    self.word_value(dt, &s, sp)?
                }
            }
            Tok::Word(w) if !self.text(w).starts_with('$') => {
                if dt == DataType::Verdict {
                    return Ok(Value::Verdict(self.verdict()?));
                }
                self.bump();
                self.word_value(dt, self.text(w), sp)?
            }
            _ => return self.unexpected(format_args!("{} value", dt.name())),
        };
        if self.is_word("-") && !matches!(v, Value::Range(..) | Value::Prefix { .. }) {
            self.bump();
            let hsp = self.span();
            let hi = match self.peek() {
                Tok::Str(s) => {
                    self.bump();
                    let s = unescape(self.text(s));
                    self.word_value(dt, &s, hsp)?
                }
                _ => {
                    let (h, _) = self.expect_word("end of range")?;
                    self.word_value(dt, h, hsp)?
                }
            };
            return Ok(Value::Range(Box::new(v), Box::new(hi)));
        }
        Ok(v)
    }

    fn word_value(&mut self, dt: DataType, w: &str, sp: Span) -> P<Value> {
        match dt {
            DataType::Ifname | DataType::IfaceIndex | DataType::CounterObj | DataType::QuotaObj => {
                Ok(Value::Str(w.to_string()))
            }
            DataType::Ipv4Addr | DataType::Ipv6Addr => match parse_addr_value(w) {
                Some(v) => Ok(v),
                None => self.err(sp, format!("invalid {} '{w}'", dt.name())),
            },
            DataType::Verdict => self.err(sp, format!("expected a verdict, found '{w}'")),
            DataType::EtherAddr => match symbols::parse_mac(w) {
                Some(n) => Ok(Value::Num(n)),
                None => self.err(sp, format!("invalid ether_addr '{w}'")),
            },
            DataType::Time => {
                // A number is seconds since the epoch, as nft reads it.
                let secs = crate::timefmt::parse_date_time(w).or_else(|| parse_num(w));
                match secs.and_then(|s| s.checked_mul(1_000_000_000)) {
                    Some(ns) => Ok(Value::Num(ns)),
                    None => self.err(
                        sp,
                        format!(
                            "invalid time '{w}': write \"YYYY-MM-DD\", \"YYYY-MM-DD HH:MM\" or \
                             \"YYYY-MM-DD HH:MM:SS\" (UTC), or seconds since 1970"
                        ),
                    ),
                }
            }
            DataType::Day => {
                let day = |x: &str| {
                    crate::timefmt::parse_day(x)
                        .or_else(|| parse_num(x))
                        .filter(|d| *d <= 6)
                };
                if let Some(d) = day(w) {
                    return Ok(Value::Num(d));
                }
                if let Some((a, b)) = w
                    .split_once('-')
                    .and_then(|(a, b)| Some((day(a)?, day(b)?)))
                {
                    return Ok(Value::Range(
                        Box::new(Value::Num(a)),
                        Box::new(Value::Num(b)),
                    ));
                }
                {
                    let help = suggest(w, crate::timefmt::DAYS);
                    self.err_help(
                        sp,
                        format!(
                            "invalid day '{w}': a day name such as \"Monday\", or 0 (Sunday) to 6"
                        ),
                        help,
                    )
                }
            }
            DataType::Hour => match crate::timefmt::parse_hour(w) {
                Some(s) => Ok(Value::Num(s)),
                None => self.err(
                    sp,
                    format!("invalid time of day '{w}': write \"HH:MM\" or \"HH:MM:SS\" (UTC)"),
                ),
            },
            _ => {
                if let Some(v) = decimal_value(w) {
                    return Ok(v);
                }
                if let Some(n) = parse_num(w).or_else(|| symbols::lookup(dt, w)) {
                    return Ok(Value::Num(n));
                }
                for (i, _) in w.match_indices('-') {
                    let (a, b) = (&w[..i], &w[i + 1..]);
                    let pa = parse_num(a).or_else(|| symbols::lookup(dt, a));
                    let pb = parse_num(b).or_else(|| symbols::lookup(dt, b));
                    if let (Some(a), Some(b)) = (pa, pb) {
                        return Ok(Value::Range(
                            Box::new(Value::Num(a)),
                            Box::new(Value::Num(b)),
                        ));
                    }
                }
                let help = suggest(w, symbols::table(dt).iter().map(|(n, _)| *n));
                self.err_help(sp, format!("invalid {} value '{w}'", dt.name()), help)
            }
        }
    }

    fn verdict(&mut self) -> P<Verdict> {
        // The common verdicts without the keyword table (one per rule).
        let fast = match self.word() {
            Some("accept") => Some(Verdict::Accept),
            Some("drop") => Some(Verdict::Drop),
            _ => None,
        };
        if let Some(v) = fast {
            self.bump();
            return Ok(v);
        }
        let (w, _) = self.keyword(
            "verdict",
            &["accept", "drop", "return", "continue", "jump", "goto"],
        )?;
        Ok(match w {
            "accept" => Verdict::Accept,
            "drop" => Verdict::Drop,
            "return" => Verdict::Return,
            "continue" => Verdict::Continue,
            "jump" => Verdict::Jump(self.name("chain name")?.0),
            _ => Verdict::Goto(self.name("chain name")?.0),
        })
    }

    /// `{ k : v, ... }` — named sets, anonymous sets, and map elements.
    fn elements(&mut self, key: &[DataType], data: Option<DataType>) -> P<Vec<Elem>> {
        self.elements_with(key, data, false)
    }

    /// [`Self::elements`] of a named set's or map's declaration (`decl`):
    /// each may carry `timeout T`, `expires T` and `comment "C"` after its
    /// key, as `nft list ruleset` prints them.
    fn elements_with(
        &mut self,
        key: &[DataType],
        data: Option<DataType>,
        decl: bool,
    ) -> P<Vec<Elem>> {
        self.expect(Tok::LBrace)?;
        let mut out = Vec::new();
        loop {
            self.skip_newlines();
            if self.eat(&Tok::RBrace) {
                return Ok(out);
            }
            let span = self.span();
            let k = self.value_concat(key)?;
            let opts = self.elem_opts(decl)?;
            let d = match data {
                Some(dt) => {
                    self.expect(Tok::Colon)?;
                    Some(self.value(dt)?)
                }
                None => None,
            };
            out.push(Elem {
                key: k,
                data: d,
                span,
                opts,
            });
            self.skip_newlines();
            match self.peek() {
                Tok::Comma => {
                    self.bump();
                }
                Tok::RBrace => {}
                _ => return self.unexpected("',' or '}'"),
            }
        }
    }

    /// An element's `timeout T`, `expires T`, `comment "C"` (any order,
    /// each once), where `decl` allows them; `counter` (per-element
    /// counters) is refused with the reason.
    fn elem_opts(&mut self, decl: bool) -> P<Option<Box<ElemOpts>>> {
        let mut o = ElemOpts::default();
        let mut any = false;
        while let Some(w @ ("timeout" | "expires" | "comment" | "counter")) = self.word() {
            let sp = self.span();
            if w == "counter" {
                return self.err(
                    sp,
                    "per-element counters ('counter' on a set and its elements) are not \
                     supported; count with a rule's 'counter' instead",
                );
            }
            if !decl {
                return self.err(
                    sp,
                    format!(
                        "an element's '{w}' is only read where a named set or map is \
                         declared or its elements are added ('elements = {{ ... }}', 'add \
                         element')"
                    ),
                );
            }
            let taken = match w {
                "timeout" => o.timeout_ms.is_some(),
                "expires" => o.expires_ms.is_some(),
                _ => o.comment.is_some(),
            };
            if taken {
                return self.err(sp, format!("an element's '{w}' given twice"));
            }
            match w {
                "timeout" => {
                    self.bump();
                    o.timeout_ms = Some(self.duration("element timeout")?);
                }
                "expires" => {
                    self.bump();
                    o.expires_ms = Some(self.duration("element expiry")?);
                }
                _ => o.comment = Some(self.comment(sp)?),
            }
            any = true;
        }
        Ok(any.then(|| Box::new(o)))
    }

    fn map_ref(&mut self, key: &[Field], data: DataType) -> P<MapRef> {
        if self.eat(&Tok::At) {
            return Ok(MapRef::Named(self.name("map name")?.0));
        }
        let types = KeyTypes::of(key);
        Ok(MapRef::Anon(self.elements(types.as_slice(), Some(data))?))
    }

    // ---- statements ---------------------------------------------------------

    /// What follows `log flags`: `all`, `tcp sequence[,options]`, `ip
    /// options`, `skuid` or `ether`.
    fn log_flags(&mut self) -> P<u8> {
        use crate::ast::log_flags as f;
        let (w, _) = self.keyword("log flag", &["all", "tcp", "ip", "skuid", "ether"])?;
        Ok(match w {
            "all" => f::ALL,
            "skuid" => f::UID,
            "ether" => f::MAC,
            "ip" => {
                self.keyword("ip log flag", &["options"])?;
                f::IP_OPT
            }
            _ => {
                let mut bits = 0;
                loop {
                    let (t, _) = self.keyword("tcp log flag", &["sequence", "options"])?;
                    bits |= if t == "sequence" {
                        f::TCP_SEQ
                    } else {
                        f::TCP_OPT
                    };
                    if !self.eat(&Tok::Comma) {
                        break bits;
                    }
                }
            }
        })
    }

    /// `tcp option maxseg size set rt mtu | N` (the cursor is on `tcp`).
    fn tcp_option(&mut self) -> P<StmtKind> {
        self.bump();
        self.bump();
        let (o, osp) = self.expect_word("TCP option")?;
        if o != "maxseg" {
            let help = suggest(o, ["maxseg"]);
            return self.err_help(
                osp,
                format!("unsupported TCP option '{o}': only 'tcp option maxseg size set' is"),
                help,
            );
        }
        self.keyword("TCP option field", &["size"])?;
        let sp = self.span();
        if !self.eat_word("set") {
            return self.err(
                sp,
                "matching on TCP options is not supported; expected 'set' \
                 ('tcp option maxseg size set rt mtu' or 'set N')",
            );
        }
        if self.eat_word("rt") {
            self.keyword("route expression", &["mtu"])?;
            return Ok(StmtKind::TcpMssSet(TcpMss::RtMtu));
        }
        let (v, vsp) = self.expect_word("an MSS value or 'rt mtu'")?;
        match parse_num(v).and_then(|n| u16::try_from(n).ok()) {
            Some(n) => Ok(StmtKind::TcpMssSet(TcpMss::Value(n))),
            None => self.err(
                vsp,
                format!("invalid MSS '{v}': expected 0-65535 or 'rt mtu'"),
            ),
        }
    }

    fn stmt(&mut self, w: &str) -> P<StmtKind> {
        match w {
            "notrack" => {
                self.bump();
                Ok(StmtKind::Notrack)
            }
            "flow" => {
                self.bump();
                // `flow offload @ft` is the older spelling.
                self.keyword("flow statement", &["add", "offload"])?;
                if !self.eat(&Tok::At) {
                    return self.unexpected("'@' and a flowtable name");
                }
                let (name, _) = self.name("flowtable name")?;
                Ok(StmtKind::FlowAdd(name))
            }
            "accept" | "drop" | "return" | "continue" | "jump" | "goto" => {
                Ok(StmtKind::Verdict(self.verdict()?))
            }
            "counter" => {
                self.bump();
                if self.eat_word("name") {
                    return self.obj_ref(ObjKind::Counter);
                }
                let (mut packets, mut bytes) = (None, None);
                loop {
                    if self.eat_word("packets") {
                        packets = Some(self.number("packet count")?);
                    } else if self.eat_word("bytes") {
                        bytes = Some(self.number("byte count")?);
                    } else {
                        break;
                    }
                }
                Ok(StmtKind::Counter { packets, bytes })
            }
            "reject" => {
                self.bump();
                if !self.eat_word("with") {
                    return Ok(StmtKind::Reject(None));
                }
                let (kind, _) = self.keyword("reject type", &["icmp", "icmpv6", "icmpx", "tcp"])?;
                if kind == "tcp" {
                    self.keyword("reject type", &["reset"])?;
                    return Ok(StmtKind::Reject(Some(RejectWith::TcpReset)));
                }
                self.eat_word("type");
                let tab = match kind {
                    "icmp" => symbols::ICMP_REJECT,
                    "icmpv6" => symbols::ICMPV6_REJECT,
                    _ => symbols::ICMPX_REJECT,
                };
                let (c, csp) = self.expect_word("reject code")?;
                let code = match symbols::code_lookup(tab, c)
                    .or_else(|| parse_num(c).and_then(|n| u8::try_from(n).ok()))
                {
                    Some(code) => code,
                    None => {
                        let help = suggest(c, tab.iter().map(|(n, _)| *n));
                        return self.err_help(
                            csp,
                            format!("invalid {kind} reject code '{c}'"),
                            help,
                        );
                    }
                };
                Ok(StmtKind::Reject(Some(match kind {
                    "icmp" => RejectWith::Icmp(code),
                    "icmpv6" => RejectWith::Icmpv6(code),
                    _ => RejectWith::Icmpx(code),
                })))
            }
            "log" => {
                self.bump();
                let mut log = Log {
                    prefix: None,
                    level: None,
                    group: None,
                    flags: 0,
                };
                loop {
                    if self.eat_word("prefix") {
                        let sp = self.span();
                        match self.bump().tok {
                            Tok::Str(s) => log.prefix = Some(self.string(s)),
                            _ => return self.err(sp, "expected a quoted string after 'prefix'"),
                        }
                    } else if self.eat_word("level") {
                        let names: Vec<&str> = LogLevel::ALL.iter().map(|l| l.name()).collect();
                        let (l, _) = self.keyword("log level", &names)?;
                        log.level = LogLevel::ALL.iter().find(|x| x.name() == l).copied();
                    } else if self.eat_word("group") {
                        let sp = self.span();
                        let n = self.number("log group")?;
                        log.group = Some(
                            u16::try_from(n).or_else(|_| self.err(sp, "log group out of range"))?,
                        );
                    } else if self.eat_word("flags") {
                        log.flags |= self.log_flags()?;
                    } else {
                        break;
                    }
                }
                Ok(StmtKind::Log(log))
            }
            "limit" => {
                self.bump();
                if self.eat_word("name") {
                    return self.obj_ref(ObjKind::Limit);
                }
                Ok(StmtKind::Limit(self.limit()?))
            }
            "add" | "update" | "delete" => self.set_update(),
            "quota" => {
                self.bump();
                if self.eat_word("name") {
                    return self.obj_ref(ObjKind::Quota);
                }
                Ok(StmtKind::Quota(self.quota()?))
            }
            _ => {
                let kind = match w {
                    "snat" => NatKind::Snat,
                    "dnat" => NatKind::Dnat,
                    "masquerade" => NatKind::Masquerade,
                    _ => NatKind::Redirect,
                };
                self.bump();
                Ok(StmtKind::Nat(Box::new(self.nat(kind)?)))
            }
        }
    }

    fn number(&mut self, what: &str) -> P<u64> {
        let (w, sp) = self.expect_word(what)?;
        parse_num(w).map_or_else(|| self.err(sp, format!("invalid {what} '{w}'")), Ok)
    }

    /// `& A`, `| O`, `^ X` (or `and`, `or`, `xor`) after `meta mark set meta
    /// mark`, composed into `(mark & and) ^ xor`; at least one.
    fn mark_ops(&mut self) -> P<(u32, u32)> {
        let (mut and, mut xor) = (u32::MAX, 0u32);
        let mut any = false;
        loop {
            let op = match self.peek() {
                Tok::Amp => '&',
                Tok::Pipe => '|',
                Tok::Caret => '^',
                _ => match self.word() {
                    Some("and") => '&',
                    Some("or") => '|',
                    Some("xor") => '^',
                    _ => break,
                },
            };
            self.bump();
            let (v, vsp) = self.expect_word("mark value")?;
            let Some(n) = parse_num(v).and_then(|n| u32::try_from(n).ok()) else {
                return self.err(vsp, format!("invalid mark value '{v}'"));
            };
            match op {
                '&' => {
                    and &= n;
                    xor &= n;
                }
                '|' => {
                    and &= !n;
                    xor = (xor & !n) | n;
                }
                _ => xor ^= n,
            }
            any = true;
        }
        if !any {
            let sp = self.span();
            return self.err(
                sp,
                "expected '&', '|' or '^' and a value (setting a mark to itself changes nothing)",
            );
        }
        Ok((and, xor))
    }

    /// nft's time format (`30s`, `1h30m`, `2d`), in ms.
    fn duration(&mut self, what: &str) -> P<u64> {
        let (w, sp) = self.expect_word(what)?;
        match crate::ast::parse_duration(w) {
            Some(ms) => Ok(ms),
            None => self.err(
                sp,
                format!("invalid {what} '{w}': expected a time such as 30s, 10m, 1h30m or 2d"),
            ),
        }
    }

    /// `add | update | delete @set { KEY [timeout T] [limit ...] [counter] }`
    /// (the cursor is on the operation).
    fn set_update(&mut self) -> P<StmtKind> {
        let (w, _) = self.expect_word("set operation")?;
        let op = match w {
            "add" => SetOp::Add,
            "update" => SetOp::Update,
            _ => SetOp::Delete,
        };
        let sp = self.span();
        if !self.eat(&Tok::At) {
            return self.err(
                sp,
                format!("expected '@set' after '{w}' (e.g. '{w} @name {{ ip saddr }}')"),
            );
        }
        let (set, _) = self.name("set name")?;
        self.expect(Tok::LBrace)?;
        let mut key = Vec::new();
        loop {
            if self.word().is_some_and(is_expr_keyword) {
                key.push(KeyPart::Field(self.field()?));
            } else {
                let (w, wsp) = self.expect_word("a key expression or value")?;
                let v = match parse_num(w) {
                    Some(n) => Value::Num(n),
                    None => match parse_addr_value(w) {
                        Some(v @ Value::Addr(_)) => v,
                        _ => {
                            return self.err(
                                wsp,
                                format!(
                                    "'{w}' is neither an expression nor a number or address \
                                     (a set key is e.g. 'ip saddr' or 'ip saddr . 22')"
                                ),
                            )
                        }
                    },
                };
                key.push(KeyPart::Const(v));
            }
            if !self.eat(&Tok::Dot) {
                break;
            }
        }
        if !key.iter().any(|k| matches!(k, KeyPart::Field(_))) {
            return self.err(sp, "a set key needs at least one expression of the packet");
        }
        let mut u = SetUpdate {
            op,
            set,
            key,
            timeout_ms: None,
            limit: None,
            counter: false,
            ct_count: None,
            quota: None,
        };
        loop {
            let isp = self.span();
            if self.eat(&Tok::RBrace) {
                break;
            }
            match self.word() {
                Some("timeout") if op != SetOp::Delete => {
                    self.bump();
                    u.timeout_ms = Some(self.duration("element timeout")?);
                }
                Some("limit") if op != SetOp::Delete => {
                    self.bump();
                    u.limit = Some(self.limit()?);
                }
                Some("quota") if op != SetOp::Delete => {
                    self.bump();
                    u.quota = Some(self.quota()?);
                }
                Some("counter") if op != SetOp::Delete => {
                    self.bump();
                    u.counter = true;
                    // `counter packets N bytes M` as nft lists it: the
                    // values are per element and start at zero here.
                    loop {
                        if self.eat_word("packets") || self.eat_word("bytes") {
                            self.number("count")?;
                        } else {
                            break;
                        }
                    }
                }
                Some("ct") if op != SetOp::Delete && self.word_at(1) == Some("count") => {
                    self.bump();
                    self.bump();
                    u.ct_count = Some(self.ct_count()?);
                }
                Some("ct") => {
                    return self.err(
                        isp,
                        "only 'ct count' is supported in a set element \
                         (with timeout, limit, quota and counter)",
                    );
                }
                _ => {
                    let expect = if op == SetOp::Delete {
                        "'}' (a delete takes only the key)"
                    } else {
                        "'timeout', 'limit', 'quota', 'counter', 'ct count' or '}'"
                    };
                    return self.unexpected(expect);
                }
            }
        }
        let exprs = usize::from(u.limit.is_some())
            + usize::from(u.quota.is_some())
            + usize::from(u.counter)
            + usize::from(u.ct_count.is_some());
        if exprs > 2 {
            return self.err(
                sp,
                "a set element takes at most two of limit, quota, counter and ct count \
                 (the kernel refuses more: NFT_SET_EXPR_MAX)",
            );
        }
        Ok(StmtKind::SetUpdate(Box::new(u)))
    }

    /// `N UNIT` of a quota (`25 mbytes`, also `25mbytes`).
    fn byte_amount(&mut self, what: &str) -> P<(u64, ByteUnit)> {
        let (w, sp) = self.expect_word(what)?;
        let split = w.find(|c: char| !c.is_ascii_digit()).unwrap_or(w.len());
        let (n, u) = w.split_at(split);
        let Some(n) = parse_num(n) else {
            return self.err(sp, format!("invalid {what} '{w}'"));
        };
        let u = if u.is_empty() {
            self.expect_word("byte unit")?.0
        } else {
            u
        };
        match byte_unit(u) {
            Some(b) => Ok((n, b)),
            None => self.err(
                sp,
                format!("invalid byte unit '{u}' (bytes, kbytes, mbytes)"),
            ),
        }
    }

    /// `numgen inc|random mod N [offset O]`, then the comparison.
    fn numgen(&mut self, sp: Span) -> P<StmtKind> {
        self.bump();
        let (kind, _) = self.keyword("numgen type", &["inc", "random"])?;
        let random = kind == "random";
        self.keyword("'mod'", &["mod"])?;
        let (w, wsp) = self.expect_word("modulus")?;
        let modulus = match parse_num(w).and_then(|n| u32::try_from(n).ok()) {
            Some(n) if n > 0 => n,
            _ => {
                return self.err(
                    wsp,
                    format!("invalid numgen modulus '{w}': expected 1-4294967295"),
                )
            }
        };
        let offset = if self.eat_word("offset") {
            let (w, wsp) = self.expect_word("offset")?;
            match parse_num(w).and_then(|n| u32::try_from(n).ok()) {
                Some(n) => n,
                None => {
                    return self.err(
                        wsp,
                        format!("invalid numgen offset '{w}': expected 0-4294967295"),
                    )
                }
            }
        } else {
            0
        };
        if self.eat_word("vmap") {
            let map = self.map_ref(&[Field::Numgen], DataType::Verdict)?;
            return Ok(StmtKind::NumgenVmap {
                random,
                modulus,
                offset,
                map: Box::new(map),
            });
        }
        let m = self.relational(Field::Numgen.into(), sp)?;
        Ok(StmtKind::Numgen(Box::new(Numgen {
            random,
            modulus,
            offset,
            m,
        })))
    }

    /// What follows `ct count`: `[over] N`.
    fn ct_count(&mut self) -> P<CtCount> {
        let over = self.eat_word("over");
        let (w, sp) = self.expect_word("connection count")?;
        match parse_num(w).and_then(|n| u32::try_from(n).ok()) {
            Some(count) => Ok(CtCount {
                count,
                over,
                existing: false,
            }),
            None => self.err(
                sp,
                format!("invalid connection count '{w}': expected 0-4294967295"),
            ),
        }
    }

    /// What follows `quota`: `[over | until] N UNIT [used N UNIT]`.
    /// The object of `counter name ...` / `quota name ...`: a name (an
    /// object map such as `counter name ip saddr map { ... }` is refused).
    fn obj_ref(&mut self, kind: ObjKind) -> P<StmtKind> {
        if matches!(self.peek(), Tok::Word(_)) && self.word().is_some_and(is_expr_keyword) {
            let (key, _) = self.fields()?;
            let (_, _) = self.keyword("'map'", &["map"])?;
            let map = self.map_ref(&key, kind.datatype())?;
            return Ok(StmtKind::ObjMap {
                kind,
                key: key.to_vec(),
                map: Box::new(map),
            });
        }
        let (name, _) = self.name(obj_name_what(kind))?;
        Ok(StmtKind::ObjRef { kind, name })
    }

    fn quota(&mut self) -> P<Quota> {
        let over = self.eat_word("over");
        if !over {
            self.eat_word("until");
        }
        let (amount, unit) = self.byte_amount("quota")?;
        let used = if self.eat_word("used") {
            Some(self.byte_amount("used amount")?)
        } else {
            None
        };
        Ok(Quota {
            over,
            amount,
            unit,
            used,
        })
    }

    fn limit(&mut self) -> P<Limit> {
        if !self.eat_word("rate") {
            return self.unexpected("'rate'");
        }
        let over = self.eat_word("over");
        let (w, sp) = self.expect_word("rate")?;
        let (rate_s, unit, per_s) = match w.split_once('/') {
            Some((r, p)) => (r, None, p),
            None => {
                let (u, usp) = self.expect_word("rate unit")?;
                let Some((bu, p)) = u.split_once('/') else {
                    return self.err(
                        usp,
                        format!("invalid rate unit '{u}', expected e.g. 'mbytes/second'"),
                    );
                };
                let Some(bu) = byte_unit(bu) else {
                    return self.err(
                        usp,
                        format!("invalid byte unit '{bu}' (bytes, kbytes, mbytes)"),
                    );
                };
                (w, Some(bu), p)
            }
        };
        let Some(rate) = parse_num(rate_s) else {
            return self.err(sp, format!("invalid rate '{rate_s}'"));
        };
        let per = match per_s {
            "second" => TimeUnit::Second,
            "minute" => TimeUnit::Minute,
            "hour" => TimeUnit::Hour,
            "day" => TimeUnit::Day,
            "week" => TimeUnit::Week,
            _ => {
                let help = suggest(per_s, ["second", "minute", "hour", "day", "week"]);
                return self.err_help(sp, format!("invalid time unit '{per_s}'"), help);
            }
        };
        let (mut burst, mut burst_unit) = (None, None);
        if self.eat_word("burst") {
            burst = Some(self.number("burst")?);
            let (u, usp) = self.expect_word("burst unit")?;
            if u != "packets" {
                match byte_unit(u) {
                    Some(b) => burst_unit = Some(b),
                    None => {
                        return self.err(
                            usp,
                            format!("invalid burst unit '{u}' (packets, bytes, kbytes, mbytes)"),
                        )
                    }
                }
            }
        }
        Ok(Limit {
            over,
            rate,
            unit,
            per,
            burst,
            burst_unit,
        })
    }

    fn nat(&mut self, kind: NatKind) -> P<Nat> {
        let mut nat = Nat {
            kind,
            family: None,
            addr: None,
            ports: None,
            flags: Vec::new(),
        };
        if matches!(self.word(), Some("ip" | "ip6")) && self.word_at(1) == Some("to") {
            nat.family = Some(if self.is_word("ip") {
                Family::Ip
            } else {
                Family::Ip6
            });
            self.bump();
        }
        let needs_to = matches!(kind, NatKind::Snat | NatKind::Dnat);
        if self.eat_word("to") {
            let sp = self.span();
            let is_expr = self.word().is_some_and(is_expr_keyword);
            if is_expr && needs_to {
                let (key, _) = self.fields()?;
                if !self.eat_word("map") {
                    return self.unexpected("'map'");
                }
                let data = match nat.family {
                    Some(Family::Ip6) => DataType::Ipv6Addr,
                    _ => DataType::Ipv4Addr,
                };
                let map = self.map_ref(&key, data)?;
                nat.addr = Some(NatAddr::Map {
                    key: key.to_vec(),
                    map,
                });
            } else {
                let (w, _) = self.expect_word("NAT address")?;
                let Some((addr, ports)) = parse_nat_target(w) else {
                    return self.err(
                        sp,
                        format!(
                            "invalid NAT target '{w}', expected ADDR[-ADDR|/LEN][:PORT[-PORT]]"
                        ),
                    );
                };
                if addr.is_some() && !needs_to {
                    return self.err(sp, "masquerade/redirect only take ':PORT[-PORT]'");
                }
                nat.addr = addr;
                nat.ports = ports;
            }
        } else if needs_to {
            return self.unexpected("'to'");
        }
        loop {
            match self.word() {
                Some("random") => nat.flags.push(NatFlag::Random),
                Some("fully-random") => nat.flags.push(NatFlag::FullyRandom),
                Some("persistent") => nat.flags.push(NatFlag::Persistent),
                _ => break,
            }
            self.bump();
            self.eat(&Tok::Comma);
        }
        Ok(nat)
    }
}

/// Fast path of [`Parser::word_value`] for numeric types: a decimal number
/// `N` or range `N-M` (the usual port and port range). Gives what the
/// general path gives (no symbol name starts with a digit, so the symbol
/// lookups there cannot match), or `None` to leave `w` to it.
fn obj_kind(w: &str) -> ObjKind {
    match w {
        "quota" => ObjKind::Quota,
        "limit" => ObjKind::Limit,
        _ => ObjKind::Counter,
    }
}

/// What an object's name is called in diagnostics.
fn obj_name_what(kind: ObjKind) -> &'static str {
    match kind {
        ObjKind::Counter => "counter name",
        ObjKind::Quota => "quota name",
        ObjKind::Limit => "limit name",
    }
}

fn decimal_value(w: &str) -> Option<Value> {
    let b = w.as_bytes();
    let (a, i) = decimal_prefix(b, 0)?;
    match b.get(i) {
        None => Some(Value::Num(a)),
        Some(b'-') => {
            let (hi, j) = decimal_prefix(b, i + 1)?;
            if j != b.len() {
                return None;
            }
            Some(Value::Range(
                Box::new(Value::Num(a)),
                Box::new(Value::Num(hi)),
            ))
        }
        Some(_) => None,
    }
}

/// The decimal number of 1 to 19 digits at `b[i..]` and the index after
/// it (`None`: no digit, or too many to be sure of `u64`: the general path
/// then decides; a strict subset of what `str::parse::<u64>` accepts, with
/// the same value). One pass, no searching for `-` first.
#[inline(always)]
fn decimal_prefix(b: &[u8], i: usize) -> Option<(u64, usize)> {
    let mut n: u64 = 0;
    let mut j = i;
    while let Some(&c) = b.get(j) {
        if !c.is_ascii_digit() {
            break;
        }
        if j - i == 19 {
            return None;
        }
        n = n * 10 + u64::from(c - b'0');
        j += 1;
    }
    (j > i).then_some((n, j))
}

/// `A.B.C.D` or `A.B.C.D/LEN` in the common spelling (octets without
/// leading zeros, a length of 1 to 3 digits up to 255), parsed in one pass;
/// `None` leaves everything else to the general path of
/// [`parse_addr_value`], which gives the same value for these.
fn ipv4_fast(w: &str) -> Option<Value> {
    let b = w.as_bytes();
    let mut octets = [0u8; 4];
    let mut i = 0;
    for (k, slot) in octets.iter_mut().enumerate() {
        if k > 0 {
            if b.get(i) != Some(&b'.') {
                return None;
            }
            i += 1;
        }
        let (n, j) = decimal_prefix(b, i)?;
        // At most 3 digits, no leading zero (std rejects "01"), <= 255.
        if j - i > 3 || (j - i > 1 && b.get(i) == Some(&b'0')) || n > 255 {
            return None;
        }
        *slot = n as u8;
        i = j;
    }
    let addr = IpAddr::from(octets);
    match b.get(i) {
        None => Some(Value::Addr(addr)),
        Some(b'/') => {
            let (len, j) = decimal_prefix(b, i + 1)?;
            if j != b.len() || j - (i + 1) > 3 || len > 255 {
                return None;
            }
            Some(Value::Prefix {
                addr,
                len: len as u8,
            })
        }
        Some(_) => None,
    }
}

fn byte_unit(s: &str) -> Option<ByteUnit> {
    match s {
        "bytes" => Some(ByteUnit::Bytes),
        "kbytes" => Some(ByteUnit::Kbytes),
        "mbytes" => Some(ByteUnit::Mbytes),
        _ => None,
    }
}

/// `1.2.3.4`, `10.0.0.0/8`, `10.0.0.1-10.0.0.9`, `fe80::1`.
pub(crate) fn parse_addr_value(w: &str) -> Option<Value> {
    if let Some(v) = ipv4_fast(w) {
        return Some(v);
    }
    if let Some((a, l)) = w.split_once('/') {
        let addr: IpAddr = a.parse().ok()?;
        let len: u8 = l.parse().ok()?;
        return Some(Value::Prefix { addr, len });
    }
    if let Ok(a) = w.parse::<IpAddr>() {
        return Some(Value::Addr(a));
    }
    let (a, b) = w.split_once('-')?;
    let a: IpAddr = a.parse().ok()?;
    let b: IpAddr = b.parse().ok()?;
    Some(Value::Range(
        Box::new(Value::Addr(a)),
        Box::new(Value::Addr(b)),
    ))
}

fn parse_port_range(s: &str) -> Option<(u16, u16)> {
    match s.split_once('-') {
        Some((a, b)) => Some((a.parse().ok()?, b.parse().ok()?)),
        None => {
            let p = s.parse().ok()?;
            Some((p, p))
        }
    }
}

fn parse_nat_addr(s: &str) -> Option<NatAddr> {
    if let Some((a, len)) = s.split_once('/') {
        return nat_prefix(a.parse().ok()?, len.parse().ok()?);
    }
    match s.split_once('-') {
        Some((a, b)) => Some(NatAddr::Range(a.parse().ok()?, b.parse().ok()?)),
        None => Some(NatAddr::Single(s.parse().ok()?)),
    }
}

/// The addresses of prefix `a/len` as a NAT target, as nft takes it (host
/// bits ignored) and as the kernel lists an address range that is one
/// (`snat to 198.51.100.0/30`, also `/32`, and with ports
/// `198.51.100.8/31:1024-65535`, a form nft 1.0.6 lists but does not read
/// back): a range, or the address for a full-length prefix.
fn nat_prefix(a: IpAddr, len: u32) -> Option<NatAddr> {
    let (lo, hi) = match a {
        IpAddr::V4(v) => {
            let m = u32::MAX.checked_shl(32u32.checked_sub(len)?).unwrap_or(0);
            let lo = u32::from(v) & m;
            (
                IpAddr::from(lo.to_be_bytes()),
                IpAddr::from((lo | !m).to_be_bytes()),
            )
        }
        IpAddr::V6(v) => {
            let m = u128::MAX.checked_shl(128u32.checked_sub(len)?).unwrap_or(0);
            let lo = u128::from(v) & m;
            (
                IpAddr::from(lo.to_be_bytes()),
                IpAddr::from((lo | !m).to_be_bytes()),
            )
        }
    };
    Some(if lo == hi {
        NatAddr::Single(lo)
    } else {
        NatAddr::Range(lo, hi)
    })
}

/// `ADDR[-ADDR|/LEN][:PORT[-PORT]]`, `[V6]:PORT`, `:PORT[-PORT]`.
/// A parsed NAT target: optional address part and optional port range.
pub(crate) type NatTarget = (Option<NatAddr>, Option<(u16, u16)>);

pub(crate) fn parse_nat_target(w: &str) -> Option<NatTarget> {
    if let Some(p) = w.strip_prefix(':') {
        if !p.contains(':') {
            return Some((None, Some(parse_port_range(p)?)));
        }
    }
    if let Some(rest) = w.strip_prefix('[') {
        let (inner, after) = rest.split_once(']')?;
        let addr = parse_nat_addr(inner)?;
        let ports = match after.strip_prefix(':') {
            Some(p) => Some(parse_port_range(p)?),
            None if after.is_empty() => None,
            None => return None,
        };
        return Some((Some(addr), ports));
    }
    let colons = w.matches(':').count();
    if colons >= 2 {
        return Some((Some(parse_nat_addr(w)?), None));
    }
    match w.split_once(':') {
        Some((a, p)) => Some((Some(parse_nat_addr(a)?), Some(parse_port_range(p)?))),
        None => Some((Some(parse_nat_addr(w)?), None)),
    }
}

// ---- control commands ------------------------------------------------------

impl Parser<'_> {
    /// Key types of the named set (data `None`) or map (data its type) of
    /// table `ti`, or an error naming the closest existing one.
    fn set_key(&mut self, ti: usize, name: &str, sp: Span) -> P<(Vec<DataType>, Option<DataType>)> {
        let t = self.tables.get(ti).ok_or(Fail)?;
        if let Some(s) = t.sets.iter().find(|s| s.name == name) {
            return Ok((s.key.clone(), None));
        }
        if let Some(m) = t.maps.iter().find(|m| m.name == name) {
            return Ok((m.key.clone(), Some(m.data)));
        }
        let names: Vec<String> = t
            .sets
            .iter()
            .map(|s| s.name.clone())
            .chain(t.maps.iter().map(|m| m.name.clone()))
            .collect();
        let help = suggest(name, names.iter().map(String::as_str));
        self.err_help(sp, format!("no such set '{name}'"), help)
    }

    /// One control command against a running rule set (the tables in
    /// `self.tables` are its context: chains and set/map declarations).
    pub(crate) fn ctl_command(&mut self) -> P<crate::command::Command> {
        use crate::command::{Command, RulePos};
        self.skip_separators();
        let (verb, _) = self.keyword("command", &["add", "insert", "delete", "flush"])?;
        if self.is_word("ct") && self.word_at(1) == Some("timeout") {
            let sp = self.span();
            return self.err(
                sp,
                "ct timeout objects change with the rule set: edit the rule-set file and \
                 reload (SIGHUP, or 'sluice ctl ruleset replace FILE'); rules may name \
                 the ones it declares ('add rule ... ct timeout set \"NAME\"')",
            );
        }
        let opts: &[&str] = match verb {
            "insert" => &["rule"],
            "flush" => &["set"],
            _ => &["rule", "element", "counter", "quota", "limit"],
        };
        let (what, _) = self.keyword("object", opts)?;
        let family = self.family_opt()?;
        let (table, tsp) = self.name("table name")?;
        let ti = self.find_table(family, &table, tsp)?;
        let cmd = if let w @ ("counter" | "quota" | "limit") = what {
            let kind = obj_kind(w);
            if verb == "add" {
                // Declared into this parser's copy of the table (which
                // refuses a name already taken), then taken back out.
                self.obj_decl(ti, kind, kind == ObjKind::Counter)?;
                let object = self
                    .tables
                    .get_mut(ti)
                    .and_then(|t| t.objects.pop())
                    .ok_or(Fail)?;
                Command::AddObject {
                    family,
                    table,
                    object,
                }
            } else {
                let (name, nsp) = self.name(obj_name_what(kind))?;
                let names: Vec<String> = self
                    .tables
                    .get(ti)
                    .map(|t| {
                        t.objects
                            .iter()
                            .filter(|o| o.kind() == kind)
                            .map(|o| o.name.clone())
                            .collect()
                    })
                    .unwrap_or_default();
                if !names.contains(&name) {
                    let help = suggest(&name, names.iter().map(String::as_str));
                    return self.err_help(nsp, format!("no such {w} '{name}'"), help);
                }
                Command::DeleteObject {
                    family,
                    table,
                    kind,
                    name,
                }
            }
        } else if what == "set" {
            let (set, ssp) = self.name("set name")?;
            let known = self
                .tables
                .get(ti)
                .is_some_and(|t| t.sets.iter().any(|s| s.name == set));
            if !known {
                let names: Vec<String> = self
                    .tables
                    .get(ti)
                    .map(|t| t.sets.iter().map(|s| s.name.clone()).collect())
                    .unwrap_or_default();
                let help = suggest(&set, names.iter().map(String::as_str));
                return self.err_help(ssp, format!("no such set '{set}'"), help);
            }
            Command::FlushSet { family, table, set }
        } else if what == "element" {
            let (set, ssp) = self.name("set name")?;
            let (key, data) = self.set_key(ti, &set, ssp)?;
            // `add element ... { KEY timeout 1h }` (a ban list's entry).
            let elements = self.elements_with(&key, data, verb == "add")?;
            if verb == "add" {
                Command::AddElements {
                    family,
                    table,
                    set,
                    elements,
                }
            } else {
                Command::DeleteElements {
                    family,
                    table,
                    set,
                    elements,
                }
            }
        } else {
            let (chain, csp) = self.name("chain name")?;
            self.find_chain(ti, &chain, csp)?;
            let number = |p: &mut Parser| -> P<u64> {
                let (n, nsp) = p.expect_word("number")?;
                n.parse::<u64>()
                    .or_else(|_| p.err(nsp, format!("expected a number, found '{n}'")))
            };
            if verb == "delete" {
                let (_, _) = self.keyword("'handle'", &["handle"])?;
                let handle = number(self)?;
                Command::DeleteRule {
                    family,
                    table,
                    chain,
                    handle,
                }
            } else {
                let insert = verb == "insert";
                let at = match self.word() {
                    Some("position" | "handle") => {
                        self.bump();
                        let h = number(self)?;
                        if insert {
                            RulePos::BeforeHandle(h)
                        } else {
                            RulePos::AfterHandle(h)
                        }
                    }
                    Some("index") => {
                        self.bump();
                        let i = number(self)?;
                        let i = usize::try_from(i).unwrap_or(usize::MAX);
                        if insert {
                            RulePos::BeforeIndex(i)
                        } else {
                            RulePos::AfterIndex(i)
                        }
                    }
                    _ if insert => RulePos::Front,
                    _ => RulePos::Back,
                };
                let rule = self.rule()?;
                Command::AddRule {
                    family,
                    table,
                    chain,
                    at,
                    rule,
                }
            }
        };
        self.skip_separators();
        if self.peek() != Tok::Eof {
            return self.unexpected("end of the command");
        }
        Ok(cmd)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The block count agrees with a plain count, blocks of newlines only
    /// (255 fit a block's `u8`) and block edges included.
    #[test]
    fn count_newlines_counts_every_newline() {
        let mut text = vec![b'\n'; 1000];
        text.extend((0..5000u32).map(|i| if i % 7 == 0 { b'\n' } else { b'x' }));
        for n in [0, 1, 254, 255, 256, 510, 1000, 1001, 6000] {
            let b = &text[..n];
            let plain = b.iter().filter(|&&c| c == b'\n').count();
            assert_eq!(count_newlines(b), plain, "{n}");
        }
    }

    #[test]
    fn decimal_fast_path_agrees_with_the_general_path() {
        let words = [
            "0",
            "22",
            "1024-1100",
            "65535",
            "65536",
            "0x10",
            "10-",
            "-10",
            "1-2-3",
            "ssh",
            "22-ssh",
            "ssh-22",
            "ftp-data",
            "18446744073709551616",
            "1-18446744073709551616",
            "007",
            "1.5",
            "",
            "1--2",
        ];
        let files = [SourceFile {
            name: "t".into(),
            text: String::new(),
        }];
        for dt in [DataType::InetService, DataType::InetProto, DataType::Mark] {
            for w in words {
                let fast = decimal_value(w);
                let mut p = Parser::new(Vec::new(), &files, None);
                // The general path alone: what word_value did before the fast path.
                let general = (|| {
                    if let Some(n) = parse_num(w).or_else(|| symbols::lookup(dt, w)) {
                        return Some(Value::Num(n));
                    }
                    for (i, _) in w.match_indices('-') {
                        let (a, b) = (w.get(..i)?, w.get(i + 1..)?);
                        let pa = parse_num(a).or_else(|| symbols::lookup(dt, a));
                        let pb = parse_num(b).or_else(|| symbols::lookup(dt, b));
                        if let (Some(a), Some(b)) = (pa, pb) {
                            return Some(Value::Range(
                                Box::new(Value::Num(a)),
                                Box::new(Value::Num(b)),
                            ));
                        }
                    }
                    None
                })();
                if let Some(v) = &fast {
                    assert_eq!(Some(v), general.as_ref(), "{dt:?} {w}");
                }
                let full = p.word_value(dt, w, Span::default()).ok();
                assert_eq!(full, general, "{dt:?} {w}");
            }
        }
    }

    #[test]
    fn ipv4_fast_path_agrees_with_the_general_path() {
        let words = [
            "1.2.3.4",
            "0.0.0.0",
            "255.255.255.255",
            "256.1.1.1",
            "10.0.0.0/8",
            "10.0.0.0/32",
            "10.0.0.0/33",
            "10.0.0.0/255",
            "10.0.0.0/256",
            "10.0.0.0/008",
            "10.0.0.0/0008",
            "10.0.0.0/",
            "10.0.0.0/+8",
            "01.2.3.4",
            "1.2.3.04",
            "1.2.3",
            "1.2.3.4.5",
            "1..3.4",
            "1.2.3.4-1.2.3.9",
            "1.2.3.4/8/8",
            "1.2.3.4x",
            "1000.2.3.4",
            "::1",
            "fe80::1/64",
            "",
        ];
        for w in words {
            let general = (|| {
                if let Some((a, l)) = w.split_once('/') {
                    let addr: IpAddr = a.parse().ok()?;
                    let len: u8 = l.parse().ok()?;
                    return Some(Value::Prefix { addr, len });
                }
                w.parse::<IpAddr>().ok().map(Value::Addr)
            })();
            if let Some(v) = ipv4_fast(w) {
                assert_eq!(Some(v), general, "{w}");
            }
            if general.is_some() {
                assert_eq!(parse_addr_value(w), general, "{w}");
            }
        }
    }

    #[test]
    fn keyword_matchers_agree_with_the_keyword_tables() {
        for w in STMT_KEYWORDS {
            assert!(is_stmt_keyword(w), "{w}");
        }
        for w in EXPR_KEYWORDS {
            assert!(is_expr_keyword(w), "{w}");
        }
        let all: Vec<&str> = STMT_KEYWORDS.iter().chain(EXPR_KEYWORDS).copied().collect();
        for w in ["", "ipx", "counte", "set", "vmap", "table", "Accept"] {
            assert!(!all.contains(&w));
            assert!(!is_stmt_keyword(w) && !is_expr_keyword(w), "{w}");
        }
    }
}
