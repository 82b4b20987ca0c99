//! Diagnostics: located errors rendered nft-style (line + caret) with
//! "did you mean" suggestions.

use crate::ast::Span;
use std::fmt;

/// A source file seen by a front end.
#[derive(Debug, Clone)]
pub(crate) struct SourceFile {
    pub name: String,
    pub text: String,
}

/// An error before it is tied to source text.
#[derive(Debug, Clone)]
pub(crate) struct RawDiag {
    pub span: Span,
    pub message: String,
    pub help: Option<String>,
}

impl RawDiag {
    pub fn new(span: Span, message: impl Into<String>) -> Self {
        RawDiag {
            span,
            message: message.into(),
            help: None,
        }
    }
    pub fn help(mut self, help: Option<String>) -> Self {
        self.help = help;
        self
    }
}

/// One located error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnostic {
    pub file: String,
    pub line: u32,
    pub col: u32,
    pub len: u32,
    pub message: String,
    /// E.g. `did you mean "forward"?`
    pub help: Option<String>,
    /// The offending source line, without its newline.
    pub source_line: String,
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let len = self.len.max(1);
        if len > 1 {
            write!(
                f,
                "{}:{}:{}-{}: Error: {}",
                self.file,
                self.line,
                self.col,
                self.col + len - 1,
                self.message
            )?;
        } else {
            write!(
                f,
                "{}:{}:{}: Error: {}",
                self.file, self.line, self.col, self.message
            )?;
        }
        if let Some(h) = &self.help {
            write!(f, "; {h}")?;
        }
        writeln!(f)?;
        if !self.source_line.is_empty() || self.line > 0 {
            writeln!(f, "{}", self.source_line)?;
            // Keep tabs so the caret lines up under tab-indented source.
            let mut pad = String::new();
            for (i, c) in self.source_line.chars().enumerate() {
                if i + 1 >= self.col as usize {
                    break;
                }
                pad.push(if c == '\t' { '\t' } else { ' ' });
            }
            writeln!(f, "{pad}{}", "^".repeat(len as usize))?;
        }
        Ok(())
    }
}

/// All errors found in one parse; returned instead of a partial ruleset.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Diagnostics {
    pub items: Vec<Diagnostic>,
}

impl Diagnostics {
    pub(crate) fn from_raw(mut raw: Vec<RawDiag>, files: &[SourceFile]) -> Self {
        raw.sort_by_key(|d| (d.span.file, d.span.line, d.span.col));
        raw.dedup_by(|a, b| a.span == b.span && a.message == b.message);
        let items = raw
            .into_iter()
            .map(|d| {
                let file = files.get(d.span.file as usize);
                let source_line = file
                    .and_then(|f| f.text.lines().nth((d.span.line as usize).saturating_sub(1)))
                    .unwrap_or("")
                    .to_string();
                Diagnostic {
                    file: file
                        .map(|f| f.name.clone())
                        .unwrap_or_else(|| "<input>".into()),
                    line: d.span.line,
                    col: d.span.col,
                    len: d.span.len,
                    message: d.message,
                    help: d.help,
                    source_line,
                }
            })
            .collect();
        Diagnostics { items }
    }

    pub fn len(&self) -> usize {
        self.items.len()
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = &Diagnostic> {
        self.items.iter()
    }
}

impl fmt::Display for Diagnostics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for d in &self.items {
            write!(f, "{d}")?;
        }
        if self.items.len() > 1 {
            writeln!(f, "{} errors", self.items.len())?;
        }
        Ok(())
    }
}

impl std::error::Error for Diagnostics {}

/// Optimal-string-alignment distance (Levenshtein plus adjacent transpositions).
pub(crate) fn edit_distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    let w = b.len() + 1;
    let mut d = vec![0usize; (a.len() + 1) * w];
    let idx = |i: usize, j: usize| i * w + j;
    for i in 0..=a.len() {
        d[idx(i, 0)] = i;
    }
    for j in 0..=b.len() {
        d[idx(0, j)] = j;
    }
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut v = (d[idx(i - 1, j)] + 1)
                .min(d[idx(i, j - 1)] + 1)
                .min(d[idx(i - 1, j - 1)] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                v = v.min(d[idx(i - 2, j - 2)] + 1);
            }
            d[idx(i, j)] = v;
        }
    }
    d[idx(a.len(), b.len())]
}

/// The closest candidate within a small edit distance, as a help text.
pub(crate) fn suggest<'a, I>(word: &str, candidates: I) -> Option<String>
where
    I: IntoIterator<Item = &'a str>,
{
    let limit = ((word.chars().count() + 1) / 3).max(1);
    let mut best: Option<(usize, &str)> = None;
    for c in candidates {
        if c == word {
            continue;
        }
        let d = edit_distance(&word.to_ascii_lowercase(), &c.to_ascii_lowercase());
        if d <= limit && best.is_none_or(|(bd, _)| d < bd) {
            best = Some((d, c));
        }
    }
    best.map(|(_, c)| format!("did you mean \"{c}\"?"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distance() {
        assert_eq!(edit_distance("forwad", "forward"), 1);
        assert_eq!(edit_distance("", "abc"), 3);
        assert_eq!(
            suggest("acept", ["accept", "drop"]).as_deref(),
            Some("did you mean \"accept\"?")
        );
        assert_eq!(suggest("zzzzz", ["accept", "drop"]), None);
    }
}
