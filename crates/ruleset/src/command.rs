//! Control commands against a running rule set: nft's own `add rule`,
//! `insert rule`, `delete rule … handle N`, `add element`,
//! `delete element`, `flush set`, `add counter|quota` and
//! `delete counter|quota` lines, parsed and validated in the context of the
//! running [`Ruleset`] (its tables, chains and set declarations).
//!
//! This is the text `sluice ctl nft '…'` sends; the policy crate applies a
//! parsed [`Command`] incrementally. Parsing and validation are pure: a
//! command either comes back whole or as [`Diagnostics`] with
//! `NAME:LINE:COLUMN`, the line and a caret.

use std::path::PathBuf;

use crate::ast::{Chain, Elem, Family, Map, ObjKind, Object, Rule, Ruleset, Set, Table};
use crate::diag::{Diagnostics, SourceFile};
use crate::lex;
use crate::nft;

/// Where an added rule goes in its chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RulePos {
    /// `add rule` without a position: last.
    Back,
    /// `insert rule` without a position: first.
    Front,
    /// `add rule … position H`: right after the rule with handle `H`.
    AfterHandle(u64),
    /// `insert rule … position H`: right before the rule with handle `H`.
    BeforeHandle(u64),
    /// `add rule … index N`: after the rule at index `N` (0-based).
    AfterIndex(usize),
    /// `insert rule … index N`: before the rule at index `N`.
    BeforeIndex(usize),
}

/// One parsed control command.
#[derive(Debug, Clone, PartialEq)]
pub enum Command {
    /// `add rule` / `insert rule`.
    AddRule {
        family: Family,
        table: String,
        chain: String,
        at: RulePos,
        rule: Rule,
    },
    /// `delete rule FAMILY TABLE CHAIN handle H`.
    DeleteRule {
        family: Family,
        table: String,
        chain: String,
        handle: u64,
    },
    /// `add element FAMILY TABLE SET { … }` (sets and maps).
    AddElements {
        family: Family,
        table: String,
        set: String,
        elements: Vec<Elem>,
    },
    /// `delete element FAMILY TABLE SET { … }`.
    DeleteElements {
        family: Family,
        table: String,
        set: String,
        elements: Vec<Elem>,
    },
    /// `add counter|quota FAMILY TABLE NAME [{ ... }]`: a new named
    /// object.
    AddObject {
        family: Family,
        table: String,
        object: Object,
    },
    /// `delete counter|quota FAMILY TABLE NAME`: refused while a rule
    /// names it.
    DeleteObject {
        family: Family,
        table: String,
        kind: ObjKind,
        name: String,
    },
    /// `flush set FAMILY TABLE SET`: every element goes.
    FlushSet {
        family: Family,
        table: String,
        set: String,
    },
}

/// The declarations of `t` without rules or elements: what the parser
/// needs to resolve names and key types, at a cost independent of the
/// number of rules and elements loaded.
fn skeleton(t: &Table) -> Table {
    Table {
        family: t.family,
        name: t.name.clone(),
        chains: t
            .chains
            .iter()
            .map(|c| Chain {
                name: c.name.clone(),
                base: c.base,
                rules: Vec::new(),
                comment: None,
                span: c.span,
            })
            .collect(),
        sets: t
            .sets
            .iter()
            .map(|s| Set {
                elements: Vec::new(),
                ..s.clone_empty()
            })
            .collect(),
        maps: t
            .maps
            .iter()
            .map(|m| Map {
                elements: Vec::new(),
                ..m.clone_empty()
            })
            .collect(),
        objects: t.objects.clone(),
        flowtables: t.flowtables.clone(),
        ct_timeouts: t.ct_timeouts.clone(),
        span: t.span,
    }
}

impl Set {
    fn clone_empty(&self) -> Set {
        Set {
            name: self.name.clone(),
            key: self.key.clone(),
            key_typeof: self.key_typeof.clone(),
            flags: self.flags.clone(),
            timeout_ms: self.timeout_ms,
            size: self.size,
            elements: Vec::new(),
            comment: None,
            span: self.span,
        }
    }
}

impl Map {
    fn clone_empty(&self) -> Map {
        Map {
            name: self.name.clone(),
            key: self.key.clone(),
            key_typeof: self.key_typeof.clone(),
            data: self.data,
            flags: self.flags.clone(),
            elements: Vec::new(),
            comment: None,
            span: self.span,
        }
    }
}

/// Parses one control command (`name` labels diagnostics) and validates it
/// against the running rule set `ctx`: the table, chain and set must exist,
/// values must fit their types, jumps must name chains of the table. Jump
/// loops and NAT placement are checked when the command is applied.
///
/// `define`s and `include` are not available in a command.
pub fn parse_nft_command(ctx: &Ruleset, name: &str, text: &str) -> Result<Command, Diagnostics> {
    let loader = lex::MemLoader::default();
    let mut pre = lex::Preprocessor::new(&loader);
    pre.run(name, Some(PathBuf::from(name)), text.to_string());
    let mut parser = nft::Parser::new(std::mem::take(&mut pre.out), &pre.files, pre.lazy);
    parser.tables = ctx.tables.iter().map(skeleton).collect();
    let cmd = parser.ctl_command();
    let mut diags = pre.diags;
    diags.append(&mut parser.lex_diags);
    diags.append(&mut parser.diags);
    drop(parser);
    let files: Vec<SourceFile> = pre.files;
    let cmd = match cmd {
        Ok(c) if diags.is_empty() => c,
        _ => {
            if diags.is_empty() {
                diags.push(crate::diag::RawDiag::new(
                    Default::default(),
                    "cannot parse the command",
                ));
            }
            return Err(Diagnostics::from_raw(diags, &files));
        }
    };
    let diags = crate::validate::validate_command(ctx, &cmd);
    if diags.is_empty() {
        Ok(cmd)
    } else {
        Err(Diagnostics::from_raw(diags, &files))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse_nft_str;

    fn ctx() -> Ruleset {
        parse_nft_str(
            "base.nft",
            "table inet filter {\n\
             set blocked { type ipv4_addr; flags interval; elements = { 192.0.2.0/24 } }\n\
             chain forward { type filter hook forward priority 0; policy accept;\n\
               ip saddr @blocked drop\n\
             }\n\
             chain web { tcp dport 80 accept }\n\
             }\n",
        )
        .expect("valid base")
    }

    /// Rules may name a ct timeout the rule set declares; the objects
    /// themselves change only with the rule set.
    #[test]
    fn ct_timeouts_are_named_by_rules_and_changed_by_a_reload() {
        let c = parse_nft_str(
            "base.nft",
            "table ip t { ct timeout q { protocol udp; policy = { unreplied: 5 } }\n\
             chain c { type filter hook forward priority 0; } }\n",
        )
        .expect("valid base");
        let cmd = parse_nft_command(
            &c,
            "ctl",
            "add rule ip t c udp dport 53 ct timeout set \"q\"",
        )
        .expect("ok");
        assert!(matches!(cmd, Command::AddRule { .. }));
        let e = parse_nft_command(&c, "ctl", "add rule ip t c ct timeout set \"r\"").unwrap_err();
        assert!(e.to_string().contains("no ct timeout 'r'"), "{e}");
        for text in [
            "add ct timeout ip t r { protocol tcp; }",
            "delete ct timeout ip t q",
        ] {
            let e = parse_nft_command(&c, "ctl", text).unwrap_err();
            assert!(e.to_string().contains("change with the rule set"), "{e}");
        }
    }

    #[test]
    fn add_rule_with_positions() {
        let c = ctx();
        let cmd = parse_nft_command(&c, "ctl", "add rule inet filter forward tcp dport 22 drop")
            .expect("ok");
        assert!(
            matches!(cmd, Command::AddRule { at: RulePos::Back, ref chain, .. } if chain == "forward")
        );
        let cmd = parse_nft_command(
            &c,
            "ctl",
            "insert rule inet filter forward position 7 ip daddr 10.0.0.1 jump web",
        )
        .expect("ok");
        assert!(matches!(
            cmd,
            Command::AddRule {
                at: RulePos::BeforeHandle(7),
                ..
            }
        ));
        let cmd = parse_nft_command(&c, "ctl", "add rule inet filter forward index 0 accept")
            .expect("ok");
        assert!(matches!(
            cmd,
            Command::AddRule {
                at: RulePos::AfterIndex(0),
                ..
            }
        ));
        let cmd =
            parse_nft_command(&c, "ctl", "insert rule inet filter forward counter").expect("ok");
        assert!(matches!(
            cmd,
            Command::AddRule {
                at: RulePos::Front,
                ..
            }
        ));
    }

    #[test]
    fn delete_rule_and_elements() {
        let c = ctx();
        assert_eq!(
            parse_nft_command(&c, "ctl", "delete rule inet filter forward handle 12"),
            Ok(Command::DeleteRule {
                family: Family::Inet,
                table: "filter".into(),
                chain: "forward".into(),
                handle: 12
            })
        );
        let cmd = parse_nft_command(
            &c,
            "ctl",
            "add element inet filter blocked { 198.51.100.7, 203.0.113.0/24 }",
        )
        .expect("ok");
        assert!(matches!(cmd, Command::AddElements { ref elements, .. } if elements.len() == 2));
        let cmd = parse_nft_command(
            &c,
            "ctl",
            "delete element inet filter blocked { 192.0.2.0/24 }",
        )
        .expect("ok");
        assert!(matches!(cmd, Command::DeleteElements { .. }));
    }

    #[test]
    fn errors_are_specific() {
        let c = ctx();
        let e = |t: &str| parse_nft_command(&c, "ctl", t).expect_err(t).to_string();
        assert!(
            e("add rule inet filter forwrd accept").contains("forward"),
            "suggests the chain"
        );
        assert!(e("add rule inet nope forward accept").contains("table"));
        assert!(e("add element inet filter blockd { 1.2.3.4 }").contains("blocked"));
        assert!(e("add element inet filter blocked { 80 }").contains("ctl:1:"));
        assert!(e("add rule inet filter forward ip saddr @nosuch drop").contains("nosuch"));
        assert!(e("add rule inet filter forward jump nochain").contains("nochain"));
        assert!(e("delete rule inet filter forward handle x").contains("number"));
        assert!(e("delete rule inet filter forward 3").contains("handle"));
        let flush = e("flush ruleset");
        assert!(
            flush.contains("ruleset") && flush.contains("set"),
            "{flush}"
        );
        assert!(e("flush set inet filter blockd").contains("blocked"));
        assert!(e("reset counters").contains("command"));
        assert!(matches!(
            parse_nft_command(&c, "ctl", "flush set inet filter blocked"),
            Ok(Command::FlushSet { .. })
        ));
        assert!(e(
            "add rule inet filter forward tcp dport 22 accept; add rule inet filter forward drop"
        )
        .contains("end of the command"));
    }
}
