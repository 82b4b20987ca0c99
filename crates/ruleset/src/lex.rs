//! nft lexer and preprocessor: tokenises files, splices `include`d files and
//! expands `define`d `$variables`, so the parser sees one flat token stream.
//!
//! Tokens are `Copy` and refer to their text by byte range ([`Text`]); no
//! token owns a string. A top-level file with no directives and no variables
//! (checked conservatively by [`is_plain`]) is not lexed here: the parser
//! lexes it a line at a time with a [`Lexer`], so a large rule file is never
//! held as a whole token vector. Both paths give the same tokens (a test in
//! the crate root compares them on every golden input).

use crate::ast::{Define, Span};
use crate::diag::{suggest, RawDiag, SourceFile};
use std::borrow::Cow;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// A run of source text: byte offsets into [`SourceFile::text`] of file `file`.
///
/// Tokens refer to their text instead of owning it, so lexing allocates
/// nothing per token and tokens are `Copy`. Resolve with [`text`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Text {
    pub file: u32,
    pub start: u32,
    pub end: u32,
}

impl Text {
    /// The part of this text from byte `from` (relative) on.
    pub fn suffix(self, from: usize) -> Text {
        let start = u32::try_from(from)
            .ok()
            .and_then(|f| self.start.checked_add(f))
            .map_or(self.end, |s| s.min(self.end));
        Text { start, ..self }
    }
}

/// The source text of `t` ("" if it is out of range, which the lexer never produces).
pub(crate) fn text(files: &[SourceFile], t: Text) -> &str {
    files
        .get(t.file as usize)
        .and_then(|f| f.text.get(t.start as usize..t.end as usize))
        .unwrap_or("")
}

/// The value of a string literal from its raw text between the quotes (`\"` is a quote).
pub(crate) fn unescape(raw: &str) -> Cow<'_, str> {
    if raw.contains("\\\"") {
        Cow::Owned(raw.replace("\\\"", "\""))
    } else {
        Cow::Borrowed(raw)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Tok {
    /// Identifiers, numbers, addresses, ranges, prefixes: any run of word characters.
    Word(Text),
    /// A string literal: the raw text between the quotes (see [`unescape`]).
    Str(Text),
    /// `$name`: the text of `name`, without the `$`.
    Var(Text),
    Newline,
    Semi,
    LBrace,
    RBrace,
    LParen,
    RParen,
    Comma,
    Colon,
    Dot,
    At,
    Assign,
    EqEq,
    Ne,
    Lt,
    Gt,
    Le,
    Ge,
    Amp,
    Pipe,
    Plus,
    Caret,
    Eof,
}

impl Tok {
    /// How diagnostics name this token (`'word'`, `"string"`, `';'`).
    pub fn describe(self, files: &[SourceFile]) -> String {
        let punct = match self {
            Tok::Word(w) => return format!("'{}'", text(files, w)),
            Tok::Str(s) => return format!("\"{}\"", unescape(text(files, s))),
            Tok::Var(v) => return format!("'${}'", text(files, v)),
            Tok::Newline => "end of line",
            Tok::Eof => "end of file",
            Tok::Semi => "';'",
            Tok::LBrace => "'{'",
            Tok::RBrace => "'}'",
            Tok::LParen => "'('",
            Tok::RParen => "')'",
            Tok::Comma => "','",
            Tok::Colon => "':'",
            Tok::Dot => "'.'",
            Tok::At => "'@'",
            Tok::Assign => "'='",
            Tok::EqEq => "'=='",
            Tok::Ne => "'!='",
            Tok::Lt => "'<'",
            Tok::Gt => "'>'",
            Tok::Le => "'<='",
            Tok::Ge => "'>='",
            Tok::Amp => "'&'",
            Tok::Pipe => "'|'",
            Tok::Plus => "'+'",
            Tok::Caret => "'^'",
        };
        punct.to_string()
    }
}

#[derive(Debug, Clone, Copy)]
pub(crate) struct Token {
    pub tok: Tok,
    pub span: Span,
}

/// Bytes of a word: identifiers, numbers, addresses, ranges, prefixes.
const fn is_word_byte_def(c: u8) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, b'_' | b'.' | b'-' | b'/' | b'*' | b'[' | b']')
}

/// [`is_word_byte_def`] as a table, for the lexer's inner loop.
const WORD_BYTES: [bool; 256] = {
    let mut t = [false; 256];
    let mut c = 0;
    while c < 256 {
        t[c] = is_word_byte_def(c as u8);
        c += 1;
    }
    t
};

fn is_word_byte(c: u8) -> bool {
    // In range for every u8; `get` keeps the no-indexing rule at no cost.
    WORD_BYTES.get(usize::from(c)).copied().unwrap_or(false)
}

/// Number of characters in UTF-8 bytes (columns count characters).
fn char_count(b: &[u8]) -> usize {
    b.iter().filter(|&&x| (x & 0xC0) != 0x80).count()
}

/// Tokenise one file. Errors (bad characters, unterminated strings) go to `diags`.
pub(crate) fn lex(file: u32, src: &str, diags: &mut Vec<RawDiag>) -> Vec<Token> {
    if u32::try_from(src.len()).is_err() {
        diags.push(RawDiag::new(
            Span {
                file,
                line: 1,
                col: 1,
                len: 1,
            },
            "file too large (at most 4 GiB)",
        ));
        return Vec::new();
    }
    // About one token per 4 bytes at most in practice; reserving does not
    // touch the memory, and it saves the copies of repeated growth.
    let mut out = Vec::with_capacity(src.len() / 4 + 1);
    let mut lexer = Lexer::new(file, src);
    while lexer.line(&mut out, diags) {}
    out
}

/// A resumable lexer over one file, for lexing a line at a time.
///
/// Works on bytes: every token boundary is an ASCII byte, so all offsets are
/// on character boundaries; columns count characters. Offsets are `u32`:
/// callers check that the text is shorter than 4 GiB ([`lex`] reports it).
#[derive(Debug, Clone)]
pub(crate) struct Lexer<'t> {
    file: u32,
    src: &'t str,
    i: usize,
    line: u32,
    col: u32,
}

impl<'t> Lexer<'t> {
    pub fn new(file: u32, src: &'t str) -> Self {
        Lexer {
            file,
            src,
            i: 0,
            line: 1,
            col: 1,
        }
    }

    /// A lexer over `src` from byte `at`, the start of line `line` (see
    /// [`crate::nft::split_point`]).
    pub fn at(file: u32, src: &'t str, at: usize, line: u32) -> Self {
        Lexer {
            file,
            src,
            i: at,
            line,
            col: 1,
        }
    }

    /// Lex up to and including the next newline token. Returns false at the
    /// end of the text (when nothing more will come).
    pub fn line(&mut self, out: &mut Vec<Token>, diags: &mut Vec<RawDiag>) -> bool {
        let (file, src) = (self.file, self.src);
        let b = src.as_bytes();
        let (mut i, mut line, mut col) = (self.i, self.line, self.col);
        let at = |i: usize| b.get(i).copied();
        // Offsets fit in u32: see the type's doc.
        let txt = |s: usize, e: usize| Text {
            file,
            start: s as u32,
            end: e as u32,
        };
        let more = loop {
            let Some(c) = at(i) else {
                break false;
            };
            // Fast paths, for the bulk of a rule file: blanks and words
            // (no other token starts with a word byte or a blank).
            if c == b' ' || c == b'\t' {
                let mut j = i + 1;
                while matches!(at(j), Some(b' ' | b'\t')) {
                    j += 1;
                }
                col += (j - i) as u32;
                i = j;
                continue;
            }
            if is_word_byte(c) {
                let mut j = i + 1;
                loop {
                    match at(j) {
                        Some(d) if is_word_byte(d) => j += 1,
                        // `a:b`, `a::b`, and the second colon of a
                        // trailing `::` (`2001:db8::`).
                        Some(b':')
                            if at(j + 1).is_some_and(|e| e == b':' || is_word_byte(e))
                                || at(j - 1) == Some(b':') =>
                        {
                            j += 1
                        }
                        _ => break,
                    }
                }
                let len = (j - i) as u32;
                let tok = if c == b'.' && len == 1 {
                    Tok::Dot
                } else {
                    Tok::Word(txt(i, j))
                };
                out.push(Token {
                    tok,
                    span: Span {
                        file,
                        line,
                        col,
                        len,
                    },
                });
                col += len;
                i = j;
                continue;
            }
            let span = Span {
                file,
                line,
                col,
                len: 1,
            };
            let push = |out: &mut Vec<Token>, tok: Tok, len: u32| {
                out.push(Token {
                    tok,
                    span: Span { len, ..span },
                });
            };
            match c {
                b'\n' => {
                    push(&mut *out, Tok::Newline, 1);
                    i += 1;
                    line += 1;
                    col = 1;
                    break true;
                }
                b' ' | b'\t' | b'\r' => {}
                b'#' => {
                    i = b
                        .get(i..)
                        .and_then(|r| r.iter().position(|&d| d == b'\n'))
                        .map_or(b.len(), |n| i + n);
                    continue;
                }
                b'\\' => {
                    // Line continuation, or `\;` as written in shell-quoted commands.
                    match at(i + 1) {
                        Some(b'\n') => {
                            i += 2;
                            line += 1;
                            col = 1;
                            continue;
                        }
                        Some(b'\r') if at(i + 2) == Some(b'\n') => {
                            i += 3;
                            line += 1;
                            col = 1;
                            continue;
                        }
                        Some(b';') => {
                            push(&mut *out, Tok::Semi, 2);
                            i += 2;
                            col += 2;
                            continue;
                        }
                        _ => diags.push(RawDiag::new(span, "unexpected '\\'")),
                    }
                }
                b'"' => {
                    let mut j = i + 1;
                    let mut closed = false;
                    while let Some(d) = at(j) {
                        if d == b'"' {
                            closed = true;
                            break;
                        }
                        if d == b'\n' {
                            break;
                        }
                        if d == b'\\' && at(j + 1) == Some(b'"') {
                            j += 2;
                            continue;
                        }
                        j += 1;
                    }
                    let chars = b.get(i..j).map_or(0, char_count) as u32;
                    if !closed {
                        diags.push(RawDiag::new(
                            Span { len: chars, ..span },
                            "unterminated string",
                        ));
                        col += chars;
                        i = j;
                        continue;
                    }
                    push(&mut *out, Tok::Str(txt(i + 1, j)), chars + 1);
                    col += chars + 1;
                    i = j + 1;
                    continue;
                }
                b'$' | b'@' => {
                    let mut j = i + 1;
                    while at(j).is_some_and(is_word_byte) {
                        j += 1;
                    }
                    let len = (j - i) as u32;
                    if c == b'@' {
                        push(&mut *out, Tok::At, 1);
                        if j > i + 1 {
                            out.push(Token {
                                tok: Tok::Word(txt(i + 1, j)),
                                span: Span {
                                    col: col + 1,
                                    len: len - 1,
                                    ..span
                                },
                            });
                        }
                    } else if j == i + 1 {
                        diags.push(RawDiag::new(span, "expected variable name after '$'"));
                    } else {
                        push(&mut *out, Tok::Var(txt(i + 1, j)), len);
                    }
                    col += len;
                    i = j;
                    continue;
                }
                _ => {
                    let tok2 = match (c, at(i + 1)) {
                        (b'=', Some(b'=')) => Some(Tok::EqEq),
                        (b'!', Some(b'=')) => Some(Tok::Ne),
                        (b'<', Some(b'=')) => Some(Tok::Le),
                        (b'>', Some(b'=')) => Some(Tok::Ge),
                        _ => None,
                    };
                    if let Some(t) = tok2 {
                        push(&mut *out, t, 2);
                        i += 2;
                        col += 2;
                        continue;
                    }
                    let colon_word = |j: usize| {
                        at(j) == Some(b':')
                            && at(j + 1).is_some_and(|e| e == b':' || is_word_byte(e))
                    };
                    if is_word_byte(c) || colon_word(i) {
                        let mut j = i;
                        // The second colon of a trailing `::` (`::`,
                        // `2001:db8::`) belongs to the word too.
                        while at(j).is_some_and(is_word_byte)
                            || colon_word(j)
                            || (j > i && at(j) == Some(b':') && at(j - 1) == Some(b':'))
                        {
                            j += 1;
                        }
                        let len = (j - i) as u32;
                        let tok = if c == b'.' && len == 1 {
                            Tok::Dot
                        } else {
                            Tok::Word(txt(i, j))
                        };
                        push(&mut *out, tok, len);
                        col += len;
                        i = j;
                        continue;
                    }
                    let tok = match c {
                        b';' => Some(Tok::Semi),
                        b'{' => Some(Tok::LBrace),
                        b'}' => Some(Tok::RBrace),
                        b'(' => Some(Tok::LParen),
                        b')' => Some(Tok::RParen),
                        b',' => Some(Tok::Comma),
                        b':' => Some(Tok::Colon),
                        b'=' => Some(Tok::Assign),
                        b'<' => Some(Tok::Lt),
                        b'>' => Some(Tok::Gt),
                        b'&' => Some(Tok::Amp),
                        b'|' => Some(Tok::Pipe),
                        b'+' => Some(Tok::Plus),
                        b'^' => Some(Tok::Caret),
                        _ => None,
                    };
                    match tok {
                        Some(t) => push(&mut *out, t, 1),
                        None => {
                            // Possibly a multi-byte character: report it whole and skip it.
                            let ch = src.get(i..).and_then(|r| r.chars().next());
                            let shown = ch.unwrap_or(char::REPLACEMENT_CHARACTER);
                            diags.push(RawDiag::new(
                                span,
                                format!("unexpected character '{shown}'"),
                            ));
                            i += ch.map_or(1, char::len_utf8);
                            col += 1;
                            continue;
                        }
                    }
                }
            }
            i += 1;
            col += 1;
        };
        self.i = i;
        self.line = line;
        self.col = col;
        more
    }
}

/// Where included files come from. The default reads the file system.
pub trait SourceLoader {
    /// Read `path`, returning its text or an error message.
    fn load(&self, path: &Path) -> Result<String, String>;

    /// The names of the entries of directory `dir` (for an `include` with
    /// wildcards), or an error message.
    fn list(&self, dir: &Path) -> Result<Vec<String>, String>;
}

/// Reads includes from the file system (read-only).
#[derive(Debug, Default, Clone, Copy)]
pub struct FsLoader;

impl SourceLoader for FsLoader {
    fn load(&self, path: &Path) -> Result<String, String> {
        std::fs::read_to_string(path).map_err(|e| e.to_string())
    }

    fn list(&self, dir: &Path) -> Result<Vec<String>, String> {
        let rd = match std::fs::read_dir(if dir.as_os_str().is_empty() {
            Path::new(".")
        } else {
            dir
        }) {
            Ok(rd) => rd,
            // No directory, no match: not an error (nft's glob(3)).
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(e.to_string()),
        };
        Ok(rd
            .filter_map(|e| e.ok())
            .filter(|e| e.file_type().is_ok_and(|t| !t.is_dir()))
            .filter_map(|e| e.file_name().into_string().ok())
            .collect())
    }
}

/// An in-memory file system, for tests and embedding.
#[derive(Debug, Default, Clone)]
pub struct MemLoader {
    pub files: HashMap<PathBuf, String>,
}

impl SourceLoader for MemLoader {
    fn load(&self, path: &Path) -> Result<String, String> {
        self.files
            .get(path)
            .cloned()
            .ok_or_else(|| "No such file or directory".to_string())
    }

    fn list(&self, dir: &Path) -> Result<Vec<String>, String> {
        Ok(self
            .files
            .keys()
            .filter(|p| p.parent() == Some(dir))
            .filter_map(|p| p.file_name()?.to_str().map(str::to_string))
            .collect())
    }
}

const MAX_INCLUDE_DEPTH: usize = 16;

pub(crate) struct Preprocessor<'a> {
    loader: &'a dyn SourceLoader,
    pub files: Vec<SourceFile>,
    pub diags: Vec<RawDiag>,
    pub defines: Vec<Define>,
    values: HashMap<String, Vec<Token>>,
    stack: Vec<PathBuf>,
    pub out: Vec<Token>,
    /// Set by [`Preprocessor::run`] when the top-level file needs no
    /// preprocessing: the id of the file, which the parser lexes lazily
    /// itself (`out` is then empty and has no end-of-file token).
    pub lazy: Option<u32>,
    /// Whether [`Preprocessor::run`] may leave a plain file to the parser.
    pub allow_lazy: bool,
}

impl<'a> Preprocessor<'a> {
    pub fn new(loader: &'a dyn SourceLoader) -> Self {
        Preprocessor {
            loader,
            files: Vec::new(),
            diags: Vec::new(),
            defines: Vec::new(),
            values: HashMap::new(),
            stack: Vec::new(),
            out: Vec::new(),
            lazy: None,
            allow_lazy: true,
        }
    }

    /// Process a top-level file.
    pub fn run(&mut self, name: &str, path: Option<PathBuf>, text: String) {
        if self.allow_lazy && self.files.is_empty() && is_plain(&text) {
            // Preprocessing would pass the tokens through unchanged: leave
            // the lexing to the parser, a line at a time, instead of
            // materialising every token of a possibly huge file.
            self.lazy = Some(0);
            self.files.push(SourceFile {
                name: name.to_string(),
                text,
            });
            return;
        }
        self.file(name.to_string(), path, text);
        let span = self.out.last().map(|t| t.span).unwrap_or_default();
        self.out.push(Token {
            tok: Tok::Eof,
            span: Span {
                col: span.col + span.len,
                len: 1,
                ..span
            },
        });
    }

    fn file(&mut self, name: String, path: Option<PathBuf>, text: String) {
        let id = self.files.len() as u32;
        let toks = lex(id, &text, &mut self.diags);
        self.files.push(SourceFile { name, text });
        if let Some(p) = &path {
            self.stack.push(p.clone());
        }
        self.tokens(toks, path.as_deref());
        if path.is_some() {
            self.stack.pop();
        }
        // Make sure an included file ends a statement.
        if let Some(last) = self.out.last() {
            if last.tok != Tok::Newline {
                let span = last.span;
                self.out.push(Token {
                    tok: Tok::Newline,
                    span,
                });
            }
        }
    }

    /// Copy `toks` to the output, running directives and expanding `$vars`.
    /// Runs of plain tokens are copied in bulk; a file with neither
    /// directives nor variables is moved to the output as is.
    fn tokens(&mut self, toks: Vec<Token>, path: Option<&Path>) {
        let mut i = 0;
        // `toks[copied..i]` are plain tokens not yet copied to `self.out`.
        let mut copied = 0;
        let mut line_start = true;
        while let Some(&t) = toks.get(i) {
            let word = match t.tok {
                Tok::Word(w) if line_start => Some(text(&self.files, w)),
                _ => None,
            };
            let directive = match word {
                Some("include") => Some(Directive::Include),
                Some("define") => Some(Directive::Define),
                Some("redefine") => Some(Directive::Redefine),
                Some("undefine") => Some(Directive::Undefine),
                _ => None,
            };
            if directive.is_none() && !matches!(t.tok, Tok::Var(_)) {
                line_start = matches!(t.tok, Tok::Newline | Tok::Semi | Tok::LBrace | Tok::RBrace);
                i += 1;
                continue;
            }
            self.out
                .extend_from_slice(toks.get(copied..i).unwrap_or_default());
            match directive {
                Some(Directive::Include) => {
                    let end = line_end(&toks, i);
                    match toks.get(i + 1) {
                        Some(&Token {
                            tok: Tok::Str(f),
                            span,
                        }) if end == i + 2 => {
                            let f = unescape(text(&self.files, f)).into_owned();
                            self.include(&f, span, path);
                        }
                        _ => self
                            .diags
                            .push(RawDiag::new(t.span, "expected: include \"FILE\"")),
                    }
                    i = end;
                }
                Some(d @ (Directive::Define | Directive::Redefine)) => {
                    let end = define_end(&toks, i);
                    self.define(&toks, i, end, d == Directive::Define);
                    i = end;
                }
                Some(Directive::Undefine) => {
                    let end = line_end(&toks, i);
                    if let Some(&Token {
                        tok: Tok::Word(n),
                        span,
                    }) = toks.get(i + 1)
                    {
                        let n = text(&self.files, n);
                        if self.values.remove(n).is_none() {
                            self.diags
                                .push(RawDiag::new(span, format!("undefined symbol '{n}'")));
                        }
                        self.defines.retain(|d| d.name != n);
                    }
                    i = end;
                }
                None => {
                    // A `$var` outside a directive.
                    line_start = false;
                    expand_into(
                        &self.files,
                        &self.values,
                        &mut self.diags,
                        std::slice::from_ref(&t),
                        &mut self.out,
                        None,
                    );
                    i += 1;
                }
            }
            copied = i;
        }
        if copied == 0 && self.out.is_empty() {
            self.out = toks;
        } else {
            self.out
                .extend_from_slice(toks.get(copied..).unwrap_or_default());
        }
    }

    /// `define NAME = VALUE` (or `redefine`) spanning `toks[i..end]`.
    fn define(&mut self, toks: &[Token], i: usize, end: usize, is_define: bool) {
        let Some(t) = toks.get(i) else {
            return;
        };
        let name = match toks.get(i + 1) {
            Some(Token {
                tok: Tok::Word(n), ..
            }) => Some(text(&self.files, *n).to_string()),
            _ => None,
        };
        let assign = matches!(
            toks.get(i + 2),
            Some(Token {
                tok: Tok::Assign,
                ..
            })
        );
        match (name, assign) {
            (Some(name), true) if end > i + 3 => {
                let span = toks.get(i + 1).map(|t| t.span).unwrap_or(t.span);
                if is_define && self.values.contains_key(&name) {
                    self.diags.push(
                        RawDiag::new(span, format!("redefinition of symbol '{name}'"))
                            .help(Some("use \"redefine\" to change it".into())),
                    );
                }
                let raw = toks.get(i + 3..end).unwrap_or(&[]);
                let mut value = Vec::new();
                expand_into(
                    &self.files,
                    &self.values,
                    &mut self.diags,
                    raw,
                    &mut value,
                    None,
                );
                value.retain(|t| t.tok != Tok::Newline);
                let text = value
                    .iter()
                    .map(|t| token_text(&self.files, t))
                    .collect::<Vec<_>>()
                    .join(" ");
                self.defines.retain(|d| d.name != name);
                self.defines.push(Define {
                    name: name.clone(),
                    value: text,
                    span,
                });
                self.values.insert(name, value);
            }
            _ => self
                .diags
                .push(RawDiag::new(t.span, "expected: define NAME = VALUE")),
        }
    }

    fn include(&mut self, file: &str, span: Span, from: Option<&Path>) {
        let base = from
            .and_then(Path::parent)
            .map(Path::to_path_buf)
            .unwrap_or_default();
        let target = if Path::new(file).is_absolute() {
            PathBuf::from(file)
        } else {
            base.join(file)
        };
        let target = normalize(&target);
        if file.contains(['*', '?', '[']) {
            self.include_glob(&target, span);
            return;
        }
        self.include_one(target, span);
    }

    /// `include "DIR/PATTERN"` with shell wildcards (`*`, `?`, `[...]`),
    /// as nft takes it: the files of DIR whose names match, in
    /// alphabetical order, names beginning with a dot left out; none
    /// matching is not an error. Wildcards in DIR are refused.
    fn include_glob(&mut self, target: &Path, span: Span) {
        let dir = target.parent().unwrap_or(Path::new(""));
        if dir.to_string_lossy().contains(['*', '?', '[']) {
            self.diags.push(RawDiag::new(
                span,
                format!(
                    "cannot include \"{}\": wildcards are supported in the file name only, \
                     not in directories",
                    target.display()
                ),
            ));
            return;
        }
        let name = target
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        let pattern = match glob::Pattern::new(name) {
            Ok(p) => p,
            Err(e) => {
                self.diags.push(RawDiag::new(
                    span,
                    format!("cannot include \"{}\": {e}", target.display()),
                ));
                return;
            }
        };
        let opts = glob::MatchOptions {
            case_sensitive: true,
            require_literal_separator: true,
            require_literal_leading_dot: true,
        };
        let names = match self.loader.list(dir) {
            Ok(n) => n,
            Err(e) => {
                self.diags.push(RawDiag::new(
                    span,
                    format!("cannot include \"{}\": {e}", target.display()),
                ));
                return;
            }
        };
        let mut matched: Vec<String> = names
            .into_iter()
            .filter(|n| pattern.matches_with(n, opts))
            .collect();
        matched.sort();
        for n in matched {
            self.include_one(dir.join(n), span);
        }
    }

    fn include_one(&mut self, target: PathBuf, span: Span) {
        if self.stack.contains(&target) {
            let chain: Vec<String> = self
                .stack
                .iter()
                .chain(std::iter::once(&target))
                .map(|p| p.display().to_string())
                .collect();
            self.diags.push(RawDiag::new(
                span,
                format!("include loop: {}", chain.join(" -> ")),
            ));
            return;
        }
        if self.stack.len() >= MAX_INCLUDE_DEPTH {
            self.diags
                .push(RawDiag::new(span, "include nesting too deep"));
            return;
        }
        match self.loader.load(&target) {
            Ok(text) => self.file(target.display().to_string(), Some(target), text),
            Err(e) => self.diags.push(RawDiag::new(
                span,
                format!("cannot include \"{}\": {e}", target.display()),
            )),
        }
    }
}

/// True if preprocessing `text` would not change its tokens: no `$` (so no
/// variables), no `include` or `define` anywhere (so no directives; also
/// covers `redefine` and `undefine`), and short enough for [`Lexer`].
/// Conservative: a directive word in a comment makes it false.
pub(crate) fn is_plain(text: &str) -> bool {
    u32::try_from(text.len()).is_ok()
        && memchr::memchr(b'$', text.as_bytes()).is_none()
        && memchr::memmem::find(text.as_bytes(), b"include").is_none()
        && memchr::memmem::find(text.as_bytes(), b"define").is_none()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Directive {
    Include,
    Define,
    Redefine,
    Undefine,
}

/// Copy tokens, substituting `$vars`; substituted tokens take the use-site span.
fn expand_into(
    files: &[SourceFile],
    values: &HashMap<String, Vec<Token>>,
    diags: &mut Vec<RawDiag>,
    toks: &[Token],
    out: &mut Vec<Token>,
    site: Option<Span>,
) {
    for t in toks {
        match t.tok {
            Tok::Var(v) => {
                let name = text(files, v);
                match values.get(name) {
                    Some(val) => {
                        let site = site.unwrap_or(t.span);
                        out.extend(val.iter().map(|x| Token {
                            tok: x.tok,
                            span: site,
                        }));
                    }
                    None => {
                        let help = suggest(name, values.keys().map(String::as_str));
                        diags.push(
                            RawDiag::new(t.span, format!("undefined symbol '${name}'")).help(help),
                        );
                        // Keep a placeholder so the parser does not report a
                        // second error: the word `$name`, `$` included.
                        out.push(Token {
                            tok: Tok::Word(Text {
                                start: v.start.saturating_sub(1),
                                ..v
                            }),
                            span: t.span,
                        });
                    }
                }
            }
            tok => out.push(Token {
                tok,
                span: site.unwrap_or(t.span),
            }),
        }
    }
}

/// Lexically normalise a path (drop `.`, fold `..`), without touching the file system.
pub(crate) fn normalize(p: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            std::path::Component::CurDir => {}
            std::path::Component::ParentDir => {
                if !out.pop() {
                    out.push("..");
                }
            }
            other => out.push(other.as_os_str()),
        }
    }
    out
}

fn line_end(toks: &[Token], mut i: usize) -> usize {
    while let Some(t) = toks.get(i) {
        if matches!(t.tok, Tok::Newline | Tok::Semi) {
            return i;
        }
        i += 1;
    }
    i
}

/// End of a define value: end of line, but braces may span lines.
fn define_end(toks: &[Token], mut i: usize) -> usize {
    let mut depth = 0i32;
    while let Some(t) = toks.get(i) {
        match t.tok {
            Tok::LBrace => depth += 1,
            Tok::RBrace => depth -= 1,
            Tok::Newline | Tok::Semi if depth <= 0 => return i,
            _ => {}
        }
        i += 1;
    }
    i
}

/// Source form of a token, as `define` values are recorded.
pub(crate) fn token_text(files: &[SourceFile], t: &Token) -> String {
    match t.tok {
        Tok::Word(w) => text(files, w).to_string(),
        Tok::Str(s) => format!("\"{}\"", unescape(text(files, s))),
        Tok::Var(v) => format!("${}", text(files, v)),
        other => other.describe(files).trim_matches('\'').to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::{lex, text, SourceFile, Tok as T};

    /// Owned mirror of the token kinds these tests use (tokens refer to the source).
    #[derive(Debug, PartialEq)]
    enum Tok {
        Word(String),
        Dot,
        LBrace,
        RBrace,
        Colon,
        Ne,
        At,
        Other(String),
    }

    fn words(s: &str) -> Vec<Tok> {
        let mut d = Vec::new();
        let t = lex(0, s, &mut d);
        assert!(d.is_empty(), "{d:?}");
        let files = [SourceFile {
            name: "t".into(),
            text: s.into(),
        }];
        t.into_iter()
            .map(|t| match t.tok {
                T::Word(w) => Tok::Word(text(&files, w).into()),
                T::Dot => Tok::Dot,
                T::LBrace => Tok::LBrace,
                T::RBrace => Tok::RBrace,
                T::Colon => Tok::Colon,
                T::Ne => Tok::Ne,
                T::At => Tok::At,
                other => Tok::Other(other.describe(&files)),
            })
            .collect()
    }

    #[test]
    fn lexes_addresses_and_punct() {
        assert_eq!(
            words("ip daddr . tcp dport { 1.2.3.4 . 80 }"),
            vec![
                Tok::Word("ip".into()),
                Tok::Word("daddr".into()),
                Tok::Dot,
                Tok::Word("tcp".into()),
                Tok::Word("dport".into()),
                Tok::LBrace,
                Tok::Word("1.2.3.4".into()),
                Tok::Dot,
                Tok::Word("80".into()),
                Tok::RBrace
            ]
        );
        assert_eq!(
            words("type ipv4_addr : verdict"),
            vec![
                Tok::Word("type".into()),
                Tok::Word("ipv4_addr".into()),
                Tok::Colon,
                Tok::Word("verdict".into())
            ]
        );
        assert_eq!(
            words("dnat to [::1]:80"),
            vec![
                Tok::Word("dnat".into()),
                Tok::Word("to".into()),
                Tok::Word("[::1]:80".into())
            ]
        );
        assert_eq!(
            words("a != @s"),
            vec![
                Tok::Word("a".into()),
                Tok::Ne,
                Tok::At,
                Tok::Word("s".into())
            ]
        );
        assert_eq!(
            words("x \\\n y # c"),
            vec![Tok::Word("x".into()), Tok::Word("y".into())]
        );
    }
}
