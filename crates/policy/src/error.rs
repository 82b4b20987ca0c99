//! Errors of lowering and compiling a rule set.

use std::fmt;

use sluice_ruleset::{Diagnostic, Ruleset, Span};

/// One construct that could not be lowered, with its source location.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file}:{line}:{col}: Error: {message}")]
pub struct LowerError {
    /// File name as recorded in [`Ruleset::files`].
    pub file: String,
    /// 1-based line.
    pub line: u32,
    /// 1-based column.
    pub col: u32,
    /// Length of the offending text (for the caret).
    pub len: u32,
    /// What is wrong.
    pub message: String,
}

impl LowerError {
    pub(crate) fn new(rs: &Ruleset, span: Span, message: impl Into<String>) -> Self {
        LowerError {
            file: rs
                .files
                .get(span.file as usize)
                .cloned()
                .unwrap_or_else(|| "<input>".to_string()),
            line: span.line,
            col: span.col,
            len: span.len,
            message: message.into(),
        }
    }

    /// The same error as a ruleset [`Diagnostic`], which renders the source
    /// line and a caret. `source_line` is the text of line [`Self::line`]
    /// (the caller reads it; this crate does no I/O).
    pub fn to_diagnostic(&self, source_line: String) -> Diagnostic {
        Diagnostic {
            file: self.file.clone(),
            line: self.line,
            col: self.col,
            len: self.len,
            message: self.message.clone(),
            help: None,
            source_line,
        }
    }
}

/// Everything wrong with a rule set, all at once, in source order.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CompileError {
    /// The errors, sorted by file, line and column.
    pub errors: Vec<LowerError>,
}

impl fmt::Display for CompileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for e in &self.errors {
            writeln!(f, "{e}")?;
        }
        if self.errors.len() > 1 {
            writeln!(f, "{} errors", self.errors.len())?;
        }
        Ok(())
    }
}

impl std::error::Error for CompileError {}
