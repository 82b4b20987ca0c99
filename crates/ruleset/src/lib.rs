//! `sluice-ruleset`: the rule-set front end of Sluice.
//!
//! Owns one AST ([`ast`]) fed by two parsers — nft syntax ([`parse_nft_str`],
//! [`parse_nft_file`]) and iptables-restore syntax ([`parse_iptables_restore_str`],
//! with optional ipset save files) — plus semantic validation and a canonical
//! nft printer ([`print_ruleset`]).
//!
//! Invariants:
//! - Parsing and validation are side-effect free (the only I/O is reading
//!   `include`d files through a [`SourceLoader`]).
//! - A parse either returns a complete, validated [`Ruleset`] or
//!   `Err(`[`Diagnostics`]`)` listing *every* error found, each with
//!   file:line:column, the source line, a caret, and a "did you mean" hint where
//!   one fits. There are no partial rule sets.
//! - Every rule, statement, match and set element carries a [`Span`].
//! - Printing is a fixed point: `print(parse(print(r))) == print(r)`.
//! - No panics on any input (fuzzed; no unchecked indexing or unwrap).
#![forbid(unsafe_code)]

pub mod ast;
pub mod command;
mod diag;
mod iptables;
mod lex;
mod nft;
mod packed;
mod print;
mod symbols;
pub mod timefmt;
mod validate;

pub use ast::*;
pub use command::{parse_nft_command, Command, RulePos};
pub use diag::{Diagnostic, Diagnostics};
pub use lex::{FsLoader, MemLoader, SourceLoader};
pub use packed::PackedRule;
pub use print::{print_ruleset, rule_to_string};

/// A MAC address `aa:bb:cc:dd:ee:ff` (or `aa-bb-...`) as the low 48 bits
/// of a `u64`, first byte most significant: how `ether saddr` values are
/// read.
pub fn parse_mac(s: &str) -> Option<u64> {
    symbols::parse_mac(s)
}

use diag::{RawDiag, SourceFile};
use std::path::{Path, PathBuf};

/// The syntax of a rule-set file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InputFormat {
    /// nftables (`nft -f`).
    Nft,
    /// iptables-restore / iptables-save.
    Iptables,
    /// ip6tables-restore / ip6tables-save.
    Ip6tables,
}

/// The syntax of rule-set text: iptables-restore when it has `*filter`-style
/// table headers (ip6tables when it is an `ip6tables-save` file, or its
/// rules have IPv6 addresses or ICMPv6), nft otherwise.
pub fn detect_format(text: &str) -> InputFormat {
    let ipt = text.lines().any(|l| {
        matches!(
            l.trim(),
            "*filter" | "*nat" | "*mangle" | "*raw" | "*security"
        )
    });
    if !ipt {
        return InputFormat::Nft;
    }
    let v6 = text.lines().any(|l| {
        let l = l.trim();
        if l.starts_with('#') {
            return l.contains("ip6tables-save");
        }
        let w: Vec<&str> = l.split_whitespace().collect();
        w.windows(2).any(|p| match p {
            ["-s" | "-d" | "--source" | "--destination" | "--src" | "--dst", a] => a.contains(':'),
            ["-p" | "--protocol", p] => matches!(*p, "icmpv6" | "ipv6-icmp" | "icmp6"),
            _ => false,
        }) || w.contains(&"--icmpv6-type")
    });
    if v6 {
        InputFormat::Ip6tables
    } else {
        InputFormat::Iptables
    }
}

/// Reads and parses a rule-set file in `format` (detected from its text
/// when `None`). For iptables input, `ipsets` is the `ipset save` text;
/// when `None`, the sibling `FILE.ipset` is read if it exists.
pub fn parse_ruleset_file(
    path: impl AsRef<Path>,
    format: Option<InputFormat>,
    ipsets: Option<&str>,
) -> Result<(Ruleset, InputFormat), Diagnostics> {
    let path = path.as_ref();
    let name = path.display().to_string();
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) => {
            return Err(Diagnostics {
                items: vec![Diagnostic {
                    file: name,
                    line: 0,
                    col: 0,
                    len: 0,
                    message: format!("cannot read file: {e}"),
                    help: None,
                    source_line: String::new(),
                }],
            })
        }
    };
    let format = format.unwrap_or_else(|| detect_format(&text));
    let sibling;
    let sets = match ipsets {
        Some(s) => Some(s),
        None if format != InputFormat::Nft => {
            sibling = std::fs::read_to_string(path.with_extension("ipset")).ok();
            sibling.as_deref()
        }
        None => None,
    };
    let rs = match format {
        InputFormat::Nft => parse_nft_owned(&name, text, Some(path), &FsLoader, true),
        InputFormat::Iptables => parse_iptables_restore_str(&name, &text, sets),
        InputFormat::Ip6tables => parse_ip6tables_restore_str(&name, &text, sets),
    }?;
    Ok((rs, format))
}

/// Parse an nft file from disk; `include`s resolve relative to the including file.
pub fn parse_nft_file(path: impl AsRef<Path>) -> Result<Ruleset, Diagnostics> {
    parse_ruleset_file(path, Some(InputFormat::Nft), None).map(|(rs, _)| rs)
}

/// Parse nft text. `name` is used in diagnostics and as the base for relative
/// `include`s (read from the file system).
pub fn parse_nft_str(name: &str, text: &str) -> Result<Ruleset, Diagnostics> {
    parse_nft_with_loader(name, text, Some(Path::new(name)), &FsLoader)
}

/// Parse nft text, reading `include`d files through `loader`.
pub fn parse_nft_with_loader(
    name: &str,
    text: &str,
    path: Option<&Path>,
    loader: &dyn SourceLoader,
) -> Result<Ruleset, Diagnostics> {
    parse_nft_owned(name, text.to_string(), path, loader, true)
}

/// [`parse_nft_with_loader`] on text the parse may keep (no copy of a large
/// file). `allow_lazy`: let the parser lex a file that needs no
/// preprocessing itself (the same result; false only to test that).
fn parse_nft_owned(
    name: &str,
    text: String,
    path: Option<&Path>,
    loader: &dyn SourceLoader,
    allow_lazy: bool,
) -> Result<Ruleset, Diagnostics> {
    parse_nft_split(name, text, path, loader, allow_lazy, nft::SPLIT_MIN).0
}

/// [`parse_nft_owned`], parsing a plain file of at least `split_min` bytes
/// in two halves on two threads (`nft::Split`); true if the second half's
/// parse was used.
fn parse_nft_split(
    name: &str,
    text: String,
    path: Option<&Path>,
    loader: &dyn SourceLoader,
    allow_lazy: bool,
    split_min: usize,
) -> (Result<Ruleset, Diagnostics>, bool) {
    let mut pre = lex::Preprocessor::new(loader);
    pre.allow_lazy = allow_lazy;
    pre.run(name, path.map(|p| lex::normalize(&PathBuf::from(p))), text);
    let files = &pre.files;
    let mut parser = nft::Parser::new(std::mem::take(&mut pre.out), files, pre.lazy);
    let joined = std::thread::scope(|s| parser.parse_file_split(s, split_min));
    let mut diags = pre.diags;
    diags.extend(parser.lex_diags);
    diags.extend(parser.diags);
    let ruleset = Ruleset {
        tables: parser.tables,
        defines: pre.defines,
        files: pre.files.iter().map(|f| f.name.clone()).collect(),
    };
    (finish(ruleset, diags, &pre.files), joined)
}

/// Parse `iptables-save` / `iptables-restore` text into the same AST (tables
/// `ip filter`, `ip nat`, `ip mangle`, `ip raw`). `ipsets` is the text of an
/// `ipset save` file providing the sets used by `-m set --match-set`.
pub fn parse_iptables_restore_str(
    name: &str,
    text: &str,
    ipsets: Option<&str>,
) -> Result<Ruleset, Diagnostics> {
    restore(name, text, ipsets, false)
}

/// Parse `ip6tables-save` / `ip6tables-restore` text (tables `ip6 filter`,
/// `ip6 mangle`, `ip6 raw`; IPv6 addresses, `--icmpv6-type`, ip6t_REJECT's
/// codes). The `nat` table's targets are refused: Sluice has no NAT66.
pub fn parse_ip6tables_restore_str(
    name: &str,
    text: &str,
    ipsets: Option<&str>,
) -> Result<Ruleset, Diagnostics> {
    restore(name, text, ipsets, true)
}

fn restore(name: &str, text: &str, ipsets: Option<&str>, v6: bool) -> Result<Ruleset, Diagnostics> {
    let mut files = vec![SourceFile {
        name: name.to_string(),
        text: text.to_string(),
    }];
    if let Some(s) = ipsets {
        files.push(SourceFile {
            name: format!("{name} (ipsets)"),
            text: s.to_string(),
        });
    }
    let (tables, diags) = iptables::parse(text, ipsets, v6);
    let ruleset = Ruleset {
        tables,
        defines: Vec::new(),
        files: files.iter().map(|f| f.name.clone()).collect(),
    };
    finish(ruleset, diags, &files)
}

fn finish(
    ruleset: Ruleset,
    mut diags: Vec<RawDiag>,
    files: &[SourceFile],
) -> Result<Ruleset, Diagnostics> {
    diags.extend(validate::validate(&ruleset));
    if diags.is_empty() {
        Ok(ruleset)
    } else {
        Err(Diagnostics::from_raw(diags, files))
    }
}

/// A base chain with its table, as returned by [`Ruleset::base_chains`].
#[derive(Debug, Clone, Copy)]
pub struct BaseChainRef<'a> {
    pub table: &'a Table,
    pub chain: &'a Chain,
    pub base: &'a BaseChain,
}

impl Ruleset {
    /// All base chains ordered by (hook, priority), ties in declaration order —
    /// the order netfilter runs them in.
    pub fn base_chains(&self) -> Vec<BaseChainRef<'_>> {
        let mut v: Vec<BaseChainRef<'_>> = self
            .tables
            .iter()
            .flat_map(|t| {
                t.chains.iter().filter_map(move |c| {
                    c.base.as_ref().map(|base| BaseChainRef {
                        table: t,
                        chain: c,
                        base,
                    })
                })
            })
            .collect();
        v.sort_by_key(|b| (b.base.hook, b.base.priority));
        v
    }

    /// Base chains on one hook, in priority order.
    pub fn hook_chains(&self, hook: Hook) -> Vec<BaseChainRef<'_>> {
        self.base_chains()
            .into_iter()
            .filter(|b| b.base.hook == hook)
            .collect()
    }

    pub fn table(&self, family: Family, name: &str) -> Option<&Table> {
        self.tables
            .iter()
            .find(|t| t.family == family && t.name == name)
    }

    /// The value text of a `define`.
    pub fn define(&self, name: &str) -> Option<&Define> {
        self.defines.iter().find(|d| d.name == name)
    }

    /// `FILE:LINE` for a span (used by `sluice trace` as `"rule": "FILE:LINE"`).
    pub fn location(&self, span: Span) -> String {
        let file = self
            .files
            .get(span.file as usize)
            .map(String::as_str)
            .unwrap_or("<input>");
        format!("{file}:{}", span.line)
    }

    /// `FILE:LINE` of a rule.
    pub fn rule_location(&self, rule: &Rule) -> String {
        self.location(rule.span)
    }

    /// Canonical nft text.
    pub fn to_nft(&self) -> String {
        print_ruleset(self)
    }
}

impl Table {
    pub fn chain(&self, name: &str) -> Option<&Chain> {
        self.chains.iter().find(|c| c.name == name)
    }
    pub fn set(&self, name: &str) -> Option<&Set> {
        self.sets.iter().find(|s| s.name == name)
    }
    pub fn map(&self, name: &str) -> Option<&Map> {
        self.maps.iter().find(|m| m.name == name)
    }
    /// Elements of the named set referenced by `@name`, if it exists.
    pub fn resolve_set(&self, name: &str) -> Option<&[Elem]> {
        self.set(name).map(|s| s.elements.as_slice())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Both ways of getting tokens to the parser: lexed lazily by the parser
    /// (files needing no preprocessing) and through the preprocessor.
    fn both(name: &str, text: &str) -> [Result<Ruleset, Diagnostics>; 2] {
        let path = Some(Path::new(name));
        [true, false].map(|lazy| parse_nft_owned(name, text.to_string(), path, &FsLoader, lazy))
    }

    /// The golden files, a large rule set with and without errors, and
    /// snippets that end early, span lines or hold errors.
    fn inputs() -> Vec<(String, String)> {
        let mut inputs: Vec<(String, String)> = Vec::new();
        for dir in ["tests/golden", "tests/golden/errors"] {
            let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
                .map(|d| d.filter_map(|e| e.ok().map(|e| e.path())).collect())
                .unwrap_or_default();
            paths.retain(|p| p.extension().is_some_and(|e| e == "nft"));
            paths.sort();
            for p in paths {
                let text = std::fs::read_to_string(&p).unwrap_or_default();
                inputs.push((p.display().to_string(), text));
            }
        }
        assert!(inputs.len() >= 4, "golden inputs missing");
        // Many rules, so the parser's token window slides, with
        // `syn/syn,ack` (a token rewritten in place) at every offset.
        let mut big = String::from(
            "table inet f {\n chain c {\n  type filter hook input priority 0; policy drop;\n",
        );
        for i in 0..700 {
            big.push_str(&format!(
                "  tcp flags syn/syn,ack ip saddr 10.{}.0.0/16 tcp dport {}-{} accept\n",
                i % 256,
                i,
                i + 5
            ));
            if i % 7 == 0 {
                big.push_str("  tcp flags & (syn|ack) == syn counter comment \"x\" accept\n");
            }
        }
        big.push_str(" }\n}\n");
        inputs.push(("big.nft".into(), big.clone()));
        inputs.push(("big_errors.nft".into(), big.replace("accept\n", "acept\n")));
        let snippets = [
            "",
            "\n\n",
            "table ip t {",
            "table ip t { chain c { tcp dport 22 accept",
            "table ip t { chain c { tcp dport 22 accept }}",
            "table ip t {\r\n chain c {\r\n  tcp dport \\\n 22 accept\r\n }\r\n}",
            "table ip t { chain c { comment \"unterminated\n } }",
            "table ip t { chain c { tcp dport 22 accept € } }",
            "table ip t { chain c { tcp dport 22 accept }}\u{e9}",
            "table ip t { chain c { meta mark set 0x10 ; ct state new,established accept } }",
            "table ip t { chain c { tcp flags syn/ accept } }",
            "table ip t { chain c { tcp flags syn / syn,ack accept } }",
            "tabel ip t { }",
            "table ip t { chain c { jump nowhere } }",
        ];
        for (i, s) in snippets.iter().enumerate() {
            inputs.push((format!("snippet{i}.nft"), s.to_string()));
        }
        inputs
    }

    #[test]
    fn lazily_lexed_files_parse_as_preprocessed_ones() {
        let inputs = inputs();
        let plain = inputs.iter().filter(|(_, t)| lex::is_plain(t)).count();
        assert!(plain >= 16, "only {plain} inputs take the lazy path");
        for (name, text) in &inputs {
            let [lazy, eager] = both(name, text);
            if name == "big_errors.nft" {
                assert!(lazy.as_ref().is_err_and(|d| d.len() > 700), "{name}");
            }
            assert_eq!(lazy, eager, "{name}");
        }
    }

    /// A file parsed in two halves (`nft::Split`) gives the sequential
    /// parse's AST and diagnostics wherever its middle falls: padding
    /// before or after the text moves the split over every line.
    #[test]
    fn split_parses_match_sequential_ones() {
        let tricky = "table ip t {\n set s {\n  type ipv4_addr\n  elements = {\n   10.0.0.1,\n   \
                      10.0.0.2\n  }\n }\n chain a {\n  type filter hook input priority 0; policy drop;\n  \
                      ip saddr @s accept\n  tcp dport { 22,\n   80 } accept # a comment\n  \
                      tcp dport \\\n 443 accept\n\n  comment \"chain a\"\n  \
                      udp dport 53 accept; udp dport 54 drop\n  policy accept\n  \
                      ip saddr 10.0.0.3 counter drop\n }\n chain b {\n  \
                      ip daddr 10.0.0.0/8 jump a\n  ip daddr 10.1.0.0/16 return\n }\n}\n\
                      add rule ip t b tcp dport 1 accept\n";
        let mut cases = inputs();
        cases.push(("tricky.nft".into(), tricky.into()));
        cases.push((
            "tricky_error.nft".into(),
            tricky.replace("return", "retrun"),
        ));
        cases.push((
            "tricky_open.nft".into(),
            tricky.replace(" }\n chain b", "\n chain b"),
        ));
        let mut joined = 0;
        for (name, text) in &cases {
            // Every offset of the small texts, a few of the large ones.
            let step = match text.len() {
                0..=4096 => (text.len() / 150).max(1),
                n => n / 6,
            };
            for pad in (0..=text.len()).step_by(step) {
                let padding = "x".repeat(pad);
                for t in [
                    format!("#{padding}\n{text}"),
                    format!("{text}\n#{padding}\n"),
                ] {
                    let parse = |min| parse_nft_split(name, t.clone(), None, &FsLoader, true, min);
                    let (seq, _) = parse(usize::MAX);
                    let (split, j) = parse(0);
                    assert_eq!(split, seq, "{name}, padded by {pad}: {t}");
                    joined += usize::from(j);
                }
            }
        }
        assert!(joined > 300, "only {joined} split parses were used");
    }

    /// Chains large enough to be given room up to the split at once
    /// (`nft::HEAD_RESERVE_AT`), one ending before the split and one holding
    /// it, parse as sequentially; the first keeps no unused room.
    #[test]
    fn split_parses_of_large_chains_match_sequential_ones() {
        let rule = |i: usize| {
            format!(
                "  ip saddr 10.{}.{}.0/24 tcp dport {} accept\n",
                i / 256 % 256,
                i % 256,
                i % 60000 + 1
            )
        };
        let mut text = String::from("table ip t {\n chain a {\n");
        for i in 0..5000 {
            text.push_str(&rule(i));
        }
        text.push_str(" }\n chain b {\n");
        for i in 0..12000 {
            text.push_str(&rule(i));
        }
        text.push_str(" }\n}\n");
        let parse = |min| parse_nft_split("t.nft", text.clone(), None, &FsLoader, true, min);
        let (seq, _) = parse(usize::MAX);
        let (split, joined) = parse(0);
        assert!(joined);
        let split = split.unwrap_or_else(|d| panic!("{d}"));
        assert_eq!(Ok(&split), seq.as_ref());
        let a = &split.tables[0].chains[0].rules;
        assert_eq!(a.len(), 5000);
        assert!(a.capacity() < 2 * a.len(), "{}", a.capacity());
        assert_eq!(split.tables[0].chains[1].rules.len(), 12000);
    }
}
