//! Interface names and indexes, resolved once at compile time.

use std::collections::BTreeMap;

use sluice_classify::IfName;
use sluice_ruleset::{Field, MapRef, Match, Ruleset, StmtKind, Value};

/// The interfaces a policy is compiled against: name <-> index.
///
/// `iif "eth0"` / `oif "eth0"` compare indexes, so the name must be known at
/// compile time (nft refuses unknown interfaces the same way). `iifname` /
/// `oifname` compare names and need no entry here; the engine hands the
/// policy indexes and the policy turns them back into names through this map.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Interfaces {
    by_name: BTreeMap<String, u32>,
    by_index: BTreeMap<u32, String>,
}

impl Interfaces {
    /// An empty map.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds (or renames) an interface. Index 0 means "no interface" and is ignored.
    pub fn insert(&mut self, name: &str, index: u32) {
        if index == 0 {
            return;
        }
        if let Some(old) = self.by_index.insert(index, name.to_string()) {
            self.by_name.remove(&old);
        }
        self.by_name.insert(name.to_string(), index);
    }

    /// Index of `name`.
    pub fn index(&self, name: &str) -> Option<u32> {
        self.by_name.get(name).copied()
    }

    /// Name of `index`.
    pub fn name(&self, index: u32) -> Option<&str> {
        self.by_index.get(&index).map(String::as_str)
    }

    /// Kernel-style name of `index` (all zero when unknown).
    pub fn ifname(&self, index: u32) -> IfName {
        self.name(index).map(IfName::new).unwrap_or_default()
    }

    /// A synthetic map for offline use (`sluice check`, `sluice trace`): `lo`
    /// is 1, and every other exact interface name the rule set mentions gets
    /// the next index in sorted order. Wildcards (`eth*`) get no entry.
    pub fn from_ruleset(rs: &Ruleset) -> Self {
        let mut names = std::collections::BTreeSet::new();
        for t in &rs.tables {
            for c in &t.chains {
                for r in &c.rules {
                    for m in &r.matches {
                        collect_match(m, &mut names);
                    }
                    for s in &r.stmts {
                        if let StmtKind::VerdictMap { key, map } = &s.kind {
                            if let (MapRef::Anon(elems), true) =
                                (&**map, key.iter().any(|f| is_iface_field(*f)))
                            {
                                for e in elems {
                                    collect_value(&e.key, &mut names);
                                }
                            }
                        }
                    }
                }
            }
            for s in &t.sets {
                for e in &s.elements {
                    collect_value(&e.key, &mut names);
                }
            }
            for m in &t.maps {
                for e in &m.elements {
                    collect_value(&e.key, &mut names);
                }
            }
        }
        let mut out = Interfaces::new();
        out.insert("lo", 1);
        let mut next = 2u32;
        for n in names {
            if n != "lo" && !n.ends_with('*') {
                out.insert(&n, next);
                next = next.saturating_add(1);
            }
        }
        out
    }
}

fn is_iface_field(f: Field) -> bool {
    matches!(f, Field::Iif | Field::Oif | Field::Iifname | Field::Oifname)
}

fn collect_match(m: &Match, names: &mut std::collections::BTreeSet<String>) {
    if m.left.iter().any(|f| is_iface_field(*f)) {
        collect_value(&m.right, names);
    }
}

fn collect_value(v: &Value, names: &mut std::collections::BTreeSet<String>) {
    match v {
        Value::Str(s) => {
            names.insert(s.clone());
        }
        Value::Set(elems) => {
            for e in elems {
                collect_value(&e.key, names);
            }
        }
        Value::Concat(vs) => {
            for v in vs {
                collect_value(v, names);
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn insert_replaces_stale_names() {
        let mut i = Interfaces::new();
        i.insert("eth0", 2);
        i.insert("wan", 2);
        i.insert("ignored", 0);
        assert_eq!(i.index("eth0"), None);
        assert_eq!(i.index("wan"), Some(2));
        assert_eq!(i.name(2), Some("wan"));
        assert_eq!(i.index("ignored"), None);
        assert_eq!(i.ifname(9), IfName::default());
    }

    #[test]
    fn from_ruleset_numbers_exact_names_and_skips_wildcards() {
        let rs = sluice_ruleset::parse_nft_str(
            "t.nft",
            "table inet t { chain c { type filter hook input priority 0; \
             iif \"lo\" accept\n iifname { \"eth1\", \"eth0\", \"wg*\" } accept } }",
        )
        .unwrap_or_default();
        let i = Interfaces::from_ruleset(&rs);
        assert_eq!(i.index("lo"), Some(1));
        assert_eq!(i.index("eth0"), Some(2));
        assert_eq!(i.index("eth1"), Some(3));
        assert_eq!(i.index("wg*"), None);
    }
}
