//! nft lexer and preprocessor: tokenises files, splices `include`d files and
//! expands `define`d `$variables`, so the parser sees one flat token stream.

use crate::ast::{Define, Span};
use crate::diag::{suggest, RawDiag, SourceFile};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Tok {
    /// Identifiers, numbers, addresses, ranges, prefixes: any run of word characters.
    Word(String),
    Str(String),
    Var(String),
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
    Eof,
}

impl Tok {
    pub fn describe(&self) -> String {
        match self {
            Tok::Word(w) => format!("'{w}'"),
            Tok::Str(s) => format!("\"{s}\""),
            Tok::Var(v) => format!("'${v}'"),
            Tok::Newline => "end of line".into(),
            Tok::Eof => "end of file".into(),
            Tok::Semi => "';'".into(),
            Tok::LBrace => "'{'".into(),
            Tok::RBrace => "'}'".into(),
            Tok::LParen => "'('".into(),
            Tok::RParen => "')'".into(),
            Tok::Comma => "','".into(),
            Tok::Colon => "':'".into(),
            Tok::Dot => "'.'".into(),
            Tok::At => "'@'".into(),
            Tok::Assign => "'='".into(),
            Tok::EqEq => "'=='".into(),
            Tok::Ne => "'!='".into(),
            Tok::Lt => "'<'".into(),
            Tok::Gt => "'>'".into(),
            Tok::Le => "'<='".into(),
            Tok::Ge => "'>='".into(),
            Tok::Amp => "'&'".into(),
            Tok::Pipe => "'|'".into(),
            Tok::Plus => "'+'".into(),
        }
    }
}

#[derive(Debug, Clone)]
pub(crate) struct Token {
    pub tok: Tok,
    pub span: Span,
}

fn is_word_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-' | '/' | '*' | '[' | ']')
}

/// Tokenise one file. Errors (bad characters, unterminated strings) go to `diags`.
pub(crate) fn lex(file: u32, text: &str, diags: &mut Vec<RawDiag>) -> Vec<Token> {
    let chars: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    let (mut i, mut line, mut col) = (0usize, 1u32, 1u32);
    let at = |i: usize| chars.get(i).copied();
    while let Some(c) = at(i) {
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
            '\n' => {
                push(&mut out, Tok::Newline, 1);
                i += 1;
                line += 1;
                col = 1;
                continue;
            }
            ' ' | '\t' | '\r' => {}
            '#' => {
                while at(i).is_some_and(|c| c != '\n') {
                    i += 1;
                }
                continue;
            }
            '\\' => {
                // Line continuation, or `\;` as written in shell-quoted commands.
                match at(i + 1) {
                    Some('\n') => {
                        i += 2;
                        line += 1;
                        col = 1;
                        continue;
                    }
                    Some('\r') if at(i + 2) == Some('\n') => {
                        i += 3;
                        line += 1;
                        col = 1;
                        continue;
                    }
                    Some(';') => {
                        push(&mut out, Tok::Semi, 2);
                        i += 2;
                        col += 2;
                        continue;
                    }
                    _ => diags.push(RawDiag::new(span, "unexpected '\\'")),
                }
            }
            '"' => {
                let mut s = String::new();
                let mut j = i + 1;
                let mut closed = false;
                while let Some(d) = at(j) {
                    if d == '"' {
                        closed = true;
                        break;
                    }
                    if d == '\n' {
                        break;
                    }
                    if d == '\\' && at(j + 1) == Some('"') {
                        s.push('"');
                        j += 2;
                        continue;
                    }
                    s.push(d);
                    j += 1;
                }
                let len = (j - i + 1) as u32;
                if !closed {
                    diags.push(RawDiag::new(
                        Span {
                            len: (j - i) as u32,
                            ..span
                        },
                        "unterminated string",
                    ));
                    col += (j - i) as u32;
                    i = j;
                    continue;
                }
                push(&mut out, Tok::Str(s), len);
                col += len;
                i = j + 1;
                continue;
            }
            '$' | '@' => {
                let mut j = i + 1;
                let mut w = String::new();
                while let Some(d) = at(j).filter(|d| is_word_char(*d)) {
                    w.push(d);
                    j += 1;
                }
                let len = (j - i) as u32;
                if c == '@' {
                    push(&mut out, Tok::At, 1);
                    if !w.is_empty() {
                        out.push(Token {
                            tok: Tok::Word(w),
                            span: Span {
                                col: col + 1,
                                len: len - 1,
                                ..span
                            },
                        });
                    }
                } else if w.is_empty() {
                    diags.push(RawDiag::new(span, "expected variable name after '$'"));
                } else {
                    push(&mut out, Tok::Var(w), len);
                }
                col += len;
                i = j;
                continue;
            }
            _ => {
                let two: String = chars
                    .get(i..i + 2)
                    .map(|s| s.iter().collect())
                    .unwrap_or_default();
                let tok2 = match two.as_str() {
                    "==" => Some(Tok::EqEq),
                    "!=" => Some(Tok::Ne),
                    "<=" => Some(Tok::Le),
                    ">=" => Some(Tok::Ge),
                    _ => None,
                };
                if let Some(t) = tok2 {
                    push(&mut out, t, 2);
                    i += 2;
                    col += 2;
                    continue;
                }
                let word_start = is_word_char(c)
                    || (c == ':' && at(i + 1).is_some_and(|d| d == ':' || is_word_char(d)));
                if word_start {
                    let mut j = i;
                    let mut w = String::new();
                    while let Some(d) = at(j) {
                        let ok = is_word_char(d)
                            || (d == ':' && at(j + 1).is_some_and(|e| e == ':' || is_word_char(e)));
                        if !ok {
                            break;
                        }
                        w.push(d);
                        j += 1;
                    }
                    let len = (j - i) as u32;
                    let tok = if w == "." { Tok::Dot } else { Tok::Word(w) };
                    push(&mut out, tok, len);
                    col += len;
                    i = j;
                    continue;
                }
                let tok = match c {
                    ';' => Some(Tok::Semi),
                    '{' => Some(Tok::LBrace),
                    '}' => Some(Tok::RBrace),
                    '(' => Some(Tok::LParen),
                    ')' => Some(Tok::RParen),
                    ',' => Some(Tok::Comma),
                    ':' => Some(Tok::Colon),
                    '=' => Some(Tok::Assign),
                    '<' => Some(Tok::Lt),
                    '>' => Some(Tok::Gt),
                    '&' => Some(Tok::Amp),
                    '|' => Some(Tok::Pipe),
                    '+' => Some(Tok::Plus),
                    _ => None,
                };
                match tok {
                    Some(t) => push(&mut out, t, 1),
                    None => diags.push(RawDiag::new(span, format!("unexpected character '{c}'"))),
                }
            }
        }
        i += 1;
        col += 1;
    }
    out
}

/// Where included files come from. The default reads the file system.
pub trait SourceLoader {
    /// Read `path`, returning its text or an error message.
    fn load(&self, path: &Path) -> Result<String, String>;
}

/// Reads includes from the file system (read-only).
#[derive(Debug, Default, Clone, Copy)]
pub struct FsLoader;

impl SourceLoader for FsLoader {
    fn load(&self, path: &Path) -> Result<String, String> {
        std::fs::read_to_string(path).map_err(|e| e.to_string())
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
        }
    }

    /// Process a top-level file.
    pub fn run(&mut self, name: &str, path: Option<PathBuf>, text: String) {
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

    fn tokens(&mut self, toks: Vec<Token>, path: Option<&Path>) {
        let mut i = 0;
        let mut line_start = true;
        while let Some(t) = toks.get(i) {
            let word = match &t.tok {
                Tok::Word(w) if line_start => Some(w.as_str()),
                _ => None,
            };
            match word {
                Some("include") => {
                    let end = line_end(&toks, i);
                    match toks.get(i + 1) {
                        Some(Token {
                            tok: Tok::Str(f),
                            span,
                        }) if end == i + 2 => {
                            self.include(f, *span, path);
                        }
                        _ => self
                            .diags
                            .push(RawDiag::new(t.span, "expected: include \"FILE\"")),
                    }
                    i = end;
                    continue;
                }
                Some(kw @ ("define" | "redefine")) => {
                    let end = define_end(&toks, i);
                    let name = match toks.get(i + 1) {
                        Some(Token {
                            tok: Tok::Word(n), ..
                        }) => Some(n.clone()),
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
                            if kw == "define" && self.values.contains_key(&name) {
                                self.diags.push(
                                    RawDiag::new(span, format!("redefinition of symbol '{name}'"))
                                        .help(Some("use \"redefine\" to change it".into())),
                                );
                            }
                            let raw: Vec<Token> = toks.get(i + 3..end).unwrap_or(&[]).to_vec();
                            let mut value = Vec::new();
                            self.expand_into(raw, &mut value, None);
                            value.retain(|t| t.tok != Tok::Newline);
                            let text = value.iter().map(token_text).collect::<Vec<_>>().join(" ");
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
                    i = end;
                    continue;
                }
                Some("undefine") => {
                    let end = line_end(&toks, i);
                    if let Some(Token {
                        tok: Tok::Word(n),
                        span,
                    }) = toks.get(i + 1)
                    {
                        if self.values.remove(n).is_none() {
                            self.diags
                                .push(RawDiag::new(*span, format!("undefined symbol '{n}'")));
                        }
                        self.defines.retain(|d| &d.name != n);
                    }
                    i = end;
                    continue;
                }
                _ => {}
            }
            line_start = matches!(t.tok, Tok::Newline | Tok::Semi | Tok::LBrace | Tok::RBrace);
            let t = t.clone();
            let mut out = std::mem::take(&mut self.out);
            self.expand_into(vec![t], &mut out, None);
            self.out = out;
            i += 1;
        }
    }

    /// Copy tokens, substituting `$vars`; substituted tokens take the use-site span.
    fn expand_into(&mut self, toks: Vec<Token>, out: &mut Vec<Token>, site: Option<Span>) {
        for t in toks {
            match &t.tok {
                Tok::Var(v) => match self.values.get(v) {
                    Some(val) => {
                        let site = site.unwrap_or(t.span);
                        out.extend(val.iter().map(|x| Token {
                            tok: x.tok.clone(),
                            span: site,
                        }));
                    }
                    None => {
                        let help = suggest(v, self.values.keys().map(String::as_str));
                        self.diags.push(
                            RawDiag::new(t.span, format!("undefined symbol '${v}'")).help(help),
                        );
                        // Keep a placeholder so the parser does not report a second error.
                        out.push(Token {
                            tok: Tok::Word(format!("${v}")),
                            span: t.span,
                        });
                    }
                },
                _ => out.push(Token {
                    span: site.unwrap_or(t.span),
                    ..t
                }),
            }
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

pub(crate) fn token_text(t: &Token) -> String {
    match &t.tok {
        Tok::Word(w) => w.clone(),
        Tok::Str(s) => format!("\"{s}\""),
        Tok::Var(v) => format!("${v}"),
        other => other.describe().trim_matches('\'').to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(s: &str) -> Vec<Tok> {
        let mut d = Vec::new();
        let t = lex(0, s, &mut d);
        assert!(d.is_empty(), "{d:?}");
        t.into_iter().map(|t| t.tok).collect()
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
