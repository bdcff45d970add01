//! The architecture test: the sinter-internal arrows and the heavy dependencies' homes, as
//! ARCHITECTURE.md draws them. A crate that gains a forbidden arrow fails here.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// crate → the sinter crates it may depend on.
const ALLOWED: &[(&str, &[&str])] = &[
    ("sinter-ir", &[]),
    ("sinter-dsl", &[]),
    ("sinter-passes", &["sinter-ir"]),
    ("sinter-codegen", &["sinter-ir"]),
    ("sinter-runtime", &["sinter-ir"]),
    ("sinter", &["sinter-ir", "sinter-dsl", "sinter-passes", "sinter-codegen", "sinter-runtime"]),
];

/// heavy dependency → the one crate allowed to depend on it.
const HEAVY: &[(&str, &str)] = &[
    ("egg", "sinter-passes"),
    ("inkwell", "sinter-codegen"),
    ("llvm-sys", "sinter-codegen"),
    ("cudarc", "sinter-runtime"),
];

fn deps_of(manifest: &Path) -> (String, BTreeSet<String>) {
    let text = std::fs::read_to_string(manifest).unwrap();
    let doc: toml::Table = text.parse().unwrap();
    let name = doc["package"]["name"].as_str().unwrap().to_string();
    let mut deps = BTreeSet::new();
    for section in ["dependencies", "build-dependencies"] {
        if let Some(t) = doc.get(section).and_then(|s| s.as_table()) {
            for (k, v) in t {
                // `package = "..."` renames count under their real name.
                let real = v.get("package").and_then(|p| p.as_str()).unwrap_or(k);
                deps.insert(real.to_string());
            }
        }
    }
    (name, deps)
}

fn workspace_deps() -> BTreeMap<String, BTreeSet<String>> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut out = BTreeMap::new();
    for dir in [".", "ir", "dsl", "passes", "codegen", "runtime"] {
        let (name, deps) = deps_of(&root.join(dir).join("Cargo.toml"));
        out.insert(name, deps);
    }
    out
}

fn violations(deps: &BTreeMap<String, BTreeSet<String>>) -> Vec<String> {
    let allowed: BTreeMap<&str, &[&str]> = ALLOWED.iter().copied().collect();
    let mut bad = Vec::new();
    for (krate, ds) in deps {
        let Some(ok) = allowed.get(krate.as_str()) else {
            bad.push(format!("{krate} is not on the map in ARCHITECTURE.md"));
            continue;
        };
        for d in ds {
            if d.starts_with("sinter") && !ok.contains(&d.as_str()) {
                bad.push(format!("{krate} -> {d} is an arrow the map forbids"));
            }
            if let Some((_, home)) = HEAVY.iter().find(|(h, _)| h == d) {
                if krate != home {
                    bad.push(format!("{krate} depends on {d}, which belongs in {home} only"));
                }
            }
        }
    }
    bad
}

#[test]
fn crates_keep_to_the_map() {
    let deps = workspace_deps();
    assert_eq!(deps.len(), ALLOWED.len(), "every crate of the map exists: {:?}", deps.keys());
    let bad = violations(&deps);
    assert!(bad.is_empty(), "architecture violations:\n{}", bad.join("\n"));
}

#[test]
fn the_check_catches_a_forbidden_arrow_and_a_stray_heavy_dependency() {
    let mut deps = workspace_deps();
    deps.get_mut("sinter-passes").unwrap().insert("sinter-codegen".into());
    deps.get_mut("sinter-ir").unwrap().insert("egg".into());
    let bad = violations(&deps);
    assert!(bad.contains(&"sinter-passes -> sinter-codegen is an arrow the map forbids".to_string()), "{bad:?}");
    assert!(bad.contains(&"sinter-ir depends on egg, which belongs in sinter-passes only".to_string()), "{bad:?}");
}

#[test]
fn architecture_md_names_every_crate() {
    let text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("ARCHITECTURE.md")).unwrap();
    for (krate, _) in ALLOWED {
        assert!(text.contains(&format!("`{krate}`")), "ARCHITECTURE.md does not name `{krate}`");
    }
}

// ------------------------------------------------------------------------------------------
// Source rules: each is a pure function over `(path, text)` pairs, so a test can plant a
// violation; the real-tree tests feed it the workspace's Rust sources.
//
// - file length: no source file over `MAX_FILE_LINES` lines;
// - fn length: no `fn` over `MAX_FN_LINES` lines, from the line of its `fn` keyword to its
//   closing brace (nested fns and closures count toward it);
// - codegen layers: inside `codegen/src`, `isa/**` imports nothing from `crate::kernels` or
//   `crate::emu` (test code included); a family (`kernels::{pointwise, layout, ...}`, a file or
//   a folder) imports no sibling family; a shared piece (any other module under `kernels/`)
//   imports no family; no file under `kernels/` but the dispatcher `kernels/mod.rs` imports an
//   item defined in `kernels/mod.rs` (a name that `kernels/mod.rs` re-exports counts as the
//   module it comes from, so `crate::kernels::KernelCtx` re-exported from `kernels::ctx` is an
//   import of the shared piece `ctx`). Test code (`#[cfg(test)]` items, files named `tests.rs`
//   or under a `tests/` folder, modules declared `#[cfg(test)] mod x;`, `crate::emu`,
//   `crate::testing`) is exempt from all but the isa rule;
// - codegen cycles: no cycle of imports between distinct files of `codegen/src`, counting the
//   arrows of non-test code, with a folder module under `kernels/` (a family, or a shared
//   piece such as `element/`) counted as one file (it may be cut into files that use each
//   other, but a cycle that leaves the folder is reported); a name
//   reached through a re-export or a `use` of another module is an arrow to the file that
//   defines it, so a re-exporting `lib.rs` or `kernels/mod.rs` closes no cycle by itself;
// - comment references: no issue numbers (a hash and digits not glued to a word, since
//   `layer#3` is a name; or "issue" and a number) and no dates (year-month-day) in comments
//   (`//`, `///`, `//!`, and block comments).
//
// An import is a `use` item (its tree expanded, `super`/`self` resolved against the module
// the `use` sits in, inline `mod x { }` blocks included; a folder module's `mod.rs` is the
// folder) or a path written in code that starts with `crate::`, `super::`, `self::` or a child
// module's name (`kernels::matmul::generate(..)` in `lib.rs`).

const MAX_FILE_LINES: usize = 1500;
const MAX_FN_LINES: usize = 250;
/// The workspace's Rust sources, relative to the root.
const SOURCE_ROOTS: &[&str] = &["ir", "dsl", "passes", "codegen", "runtime", "src", "tests", "build.rs"];
/// The kernel families of `codegen/src/kernels`, siblings of each other.
const FAMILIES: &[&str] = &["pointwise", "layout", "gather", "kv_append", "reduce", "matmul", "attention"];

/// A broken rule: where, which, and what.
#[derive(Debug, Clone, PartialEq)]
struct Violation {
    path: String,
    line: usize,
    rule: &'static str,
    msg: String,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        write!(f, "{}:{}: [{}] {}", self.path, self.line, self.rule, self.msg)
    }
}

fn violation(path: &str, line: usize, rule: &'static str, msg: String) -> Violation {
    Violation { path: path.to_string(), line, rule, msg }
}

/// Every `.rs` file of `SOURCE_ROOTS` as `(path relative to the root with '/', text)`,
/// skipping `target/` and snapshot folders.
fn workspace_sources() -> Vec<(String, String)> {
    fn walk(root: &Path, rel: &str, out: &mut Vec<(String, String)>) {
        let path = root.join(rel);
        if path.is_file() {
            if rel.ends_with(".rs") {
                out.push((rel.to_string(), std::fs::read_to_string(&path).unwrap()));
            }
            return;
        }
        let Ok(entries) = std::fs::read_dir(&path) else { return };
        let mut names: Vec<String> = entries.map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        names.sort();
        for name in names {
            if name == "target" || name == "snapshots" || name.starts_with('.') {
                continue;
            }
            walk(root, &format!("{rel}/{name}"), out);
        }
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut out = Vec::new();
    for r in SOURCE_ROOTS {
        walk(root, r, &mut out);
    }
    out
}

fn report(rule: &str, bad: &[Violation]) {
    let lines: Vec<String> = bad.iter().map(|v| v.to_string()).collect();
    assert!(bad.is_empty(), "{} violation(s) of `{rule}`:\n{}", bad.len(), lines.join("\n"));
}

// ---- A small Rust tokenizer: enough to match braces and read paths and comments.

#[derive(Clone, Copy, Debug, PartialEq)]
enum Tok {
    Ident,
    Lifetime,
    Literal,
    /// One punctuation character, or `::`.
    Punct,
}

#[derive(Clone, Debug)]
struct Token {
    kind: Tok,
    text: String,
    line: usize,
}

impl Token {
    fn is(&self, s: &str) -> bool {
        self.kind != Tok::Literal && self.text == s
    }
}

/// One line of a comment (a block comment gives one per line), with its delimiters.
#[derive(Clone, Debug)]
struct Comment {
    line: usize,
    text: String,
}

#[derive(Default, Debug)]
struct Lexed {
    tokens: Vec<Token>,
    comments: Vec<Comment>,
}

struct Lexer {
    c: Vec<char>,
    i: usize,
    line: usize,
    out: Lexed,
}

impl Lexer {
    fn at(&self, k: usize) -> char {
        self.c.get(k).copied().unwrap_or('\0')
    }

    fn push(&mut self, kind: Tok, text: String, line: usize) {
        self.out.tokens.push(Token { kind, text, line });
    }

    /// Advances over one char, counting lines.
    fn bump(&mut self) {
        if self.at(self.i) == '\n' {
            self.line += 1;
        }
        self.i += 1;
    }

    fn line_comment(&mut self) {
        let start = self.i;
        while self.i < self.c.len() && self.c[self.i] != '\n' {
            self.i += 1;
        }
        let text = self.c[start..self.i].iter().collect();
        self.out.comments.push(Comment { line: self.line, text });
    }

    /// A block comment, nested ones included.
    fn block_comment(&mut self) {
        let (mut depth, mut cur) = (0usize, String::new());
        while self.i < self.c.len() {
            let (a, b) = (self.at(self.i), self.at(self.i + 1));
            if a == '/' && b == '*' {
                depth += 1;
                cur.push_str("/*");
                self.i += 2;
            } else if a == '*' && b == '/' {
                depth -= 1;
                cur.push_str("*/");
                self.i += 2;
                if depth == 0 {
                    break;
                }
            } else if a == '\n' {
                self.out.comments.push(Comment { line: self.line, text: std::mem::take(&mut cur) });
                self.bump();
            } else {
                cur.push(a);
                self.i += 1;
            }
        }
        self.out.comments.push(Comment { line: self.line, text: cur });
    }

    /// A quoted string from its opening `"` (escapes honoured).
    fn string(&mut self, line: usize) {
        self.i += 1;
        while self.i < self.c.len() {
            match self.at(self.i) {
                '\\' => {
                    self.i += 1;
                    self.bump();
                }
                '"' => {
                    self.i += 1;
                    break;
                }
                _ => self.bump(),
            }
        }
        self.push(Tok::Literal, "\"…\"".into(), line);
    }

    /// A raw string from its first `#` or `"`: ends at `"` and as many `#`.
    fn raw_string(&mut self, line: usize) {
        let mut hashes = 0;
        while self.at(self.i) == '#' {
            hashes += 1;
            self.i += 1;
        }
        self.i += 1; // the opening quote
        while self.i < self.c.len() {
            if self.at(self.i) == '"' && (0..hashes).all(|h| self.at(self.i + 1 + h) == '#') {
                self.i += 1 + hashes;
                break;
            }
            self.bump();
        }
        self.push(Tok::Literal, "r\"…\"".into(), line);
    }

    /// From a `'`: a char literal (`'x'`, `'\n'`, `'\u{1F600}'`, `'{'`) or a lifetime/label.
    fn quote(&mut self, line: usize) {
        let (n1, n2) = (self.at(self.i + 1), self.at(self.i + 2));
        if n1 == '\\' || (n2 == '\'' && n1 != '\n') {
            self.i += if n1 == '\\' { 3 } else { 2 };
            while self.i < self.c.len() && self.at(self.i) != '\'' && self.at(self.i) != '\n' {
                self.i += 1;
            }
            self.i += 1;
            self.push(Tok::Literal, "'…'".into(), line);
        } else if n1.is_alphabetic() || n1 == '_' {
            let start = self.i;
            self.i += 1;
            while self.at(self.i).is_alphanumeric() || self.at(self.i) == '_' {
                self.i += 1;
            }
            let text = self.c[start..self.i].iter().collect();
            self.push(Tok::Lifetime, text, line);
        } else {
            self.i += 1;
            self.push(Tok::Punct, "'".into(), line);
        }
    }

    /// A word: an identifier or keyword, or the prefix of a byte/raw/C string or byte char.
    fn word(&mut self, line: usize) {
        let start = self.i;
        while self.at(self.i).is_alphanumeric() || self.at(self.i) == '_' {
            self.i += 1;
        }
        let word: String = self.c[start..self.i].iter().collect();
        let (n1, n2) = (self.at(self.i), self.at(self.i + 1));
        match word.as_str() {
            "r" | "br" | "cr" if n1 == '"' || (n1 == '#' && (n2 == '"' || n2 == '#')) => self.raw_string(line),
            "r" if n1 == '#' && (n2.is_alphabetic() || n2 == '_') => {
                self.i += 1;
                let s = self.i;
                while self.at(self.i).is_alphanumeric() || self.at(self.i) == '_' {
                    self.i += 1;
                }
                let text = self.c[s..self.i].iter().collect();
                self.push(Tok::Ident, text, line);
            }
            "b" | "c" if n1 == '"' => self.string(line),
            "b" if n1 == '\'' => self.quote(line),
            _ => self.push(Tok::Ident, word, line),
        }
    }

    fn number(&mut self, line: usize) {
        while self.at(self.i).is_alphanumeric() || self.at(self.i) == '_' || (self.at(self.i) == '.' && self.at(self.i + 1).is_ascii_digit()) {
            self.i += 1;
        }
        self.push(Tok::Literal, "0".into(), line);
    }

    fn run(mut self) -> Lexed {
        while self.i < self.c.len() {
            let (ch, next, line) = (self.c[self.i], self.at(self.i + 1), self.line);
            match ch {
                _ if ch.is_whitespace() => self.bump(),
                '/' if next == '/' => self.line_comment(),
                '/' if next == '*' => self.block_comment(),
                '"' => self.string(line),
                '\'' => self.quote(line),
                _ if ch.is_alphabetic() || ch == '_' => self.word(line),
                _ if ch.is_ascii_digit() => self.number(line),
                ':' if next == ':' => {
                    self.i += 2;
                    self.push(Tok::Punct, "::".into(), line);
                }
                _ => {
                    self.i += 1;
                    self.push(Tok::Punct, ch.to_string(), line);
                }
            }
        }
        self.out
    }
}

fn lex(text: &str) -> Lexed {
    Lexer { c: text.chars().collect(), i: 0, line: 1, out: Lexed::default() }.run()
}

/// The index of the token that closes the bracket opened at `open` (or the last token).
fn matching(tokens: &[Token], open: usize) -> usize {
    let (o, c) = match tokens[open].text.as_str() {
        "{" => ("{", "}"),
        "(" => ("(", ")"),
        _ => ("[", "]"),
    };
    let mut depth = 0usize;
    for (k, t) in tokens.iter().enumerate().skip(open) {
        if t.is(o) {
            depth += 1;
        } else if t.is(c) {
            depth -= 1;
            if depth == 0 {
                return k;
            }
        }
    }
    tokens.len() - 1
}

// ---- File and fn length

fn check_file_lengths(files: &[(String, String)]) -> Vec<Violation> {
    let mut bad = Vec::new();
    for (path, text) in files {
        let n = text.lines().count();
        if n > MAX_FILE_LINES {
            let msg = format!("the file has {n} lines, over the limit of {MAX_FILE_LINES}: split it into modules");
            bad.push(violation(path, MAX_FILE_LINES + 1, "file length", msg));
        }
    }
    bad
}

/// Every `fn` with a body: its name and the lines of its `fn` keyword and its closing brace.
fn fn_spans(tokens: &[Token]) -> Vec<(String, usize, usize)> {
    let mut out = Vec::new();
    for k in 0..tokens.len().saturating_sub(1) {
        if !(tokens[k].is("fn") && tokens[k].kind == Tok::Ident && tokens[k + 1].kind == Tok::Ident) {
            continue;
        }
        // The body is the first `{` outside parentheses and brackets; a `;` first means none.
        let mut depth = 0i32;
        let mut body = None;
        for (j, t) in tokens.iter().enumerate().skip(k + 2) {
            match t.text.as_str() {
                _ if t.kind != Tok::Punct => {}
                "(" | "[" => depth += 1,
                ")" | "]" => depth -= 1,
                ";" if depth == 0 => break,
                "{" if depth == 0 => {
                    body = Some(j);
                    break;
                }
                _ => {}
            }
        }
        if let Some(open) = body {
            let close = matching(tokens, open);
            out.push((tokens[k + 1].text.clone(), tokens[k].line, tokens[close].line));
        }
    }
    out
}

fn check_fn_lengths(files: &[(String, String)]) -> Vec<Violation> {
    let mut bad = Vec::new();
    for (path, text) in files {
        for (name, start, end) in fn_spans(&lex(text).tokens) {
            let n = end - start + 1;
            if n > MAX_FN_LINES {
                let msg = format!("`fn {name}` has {n} lines (to line {end}), over the limit of {MAX_FN_LINES}: split it");
                bad.push(violation(path, start, "fn length", msg));
            }
        }
    }
    bad
}

// ---- Comment references

/// What a comment line cites that belongs in the history, not the code: an issue number or a
/// date.
fn comment_reference(text: &str) -> Option<String> {
    let c: Vec<char> = text.chars().collect();
    let lower: Vec<char> = c.iter().map(|x| x.to_ascii_lowercase()).collect();
    let digit = |k: usize| c.get(k).is_some_and(|d| d.is_ascii_digit());
    let digits = |from: usize, n: usize| (from..from + n).all(digit);
    let num = |from: usize| c[from..].iter().take_while(|d| d.is_ascii_digit()).collect::<String>();
    for k in 0..c.len() {
        let before = if k == 0 { ' ' } else { c[k - 1] };
        if c[k] == '#' && digit(k + 1) && !before.is_alphanumeric() && before != '&' {
            return Some(format!("an issue number `#{}`", num(k + 1)));
        }
        if lower[k..].starts_with(&['i', 's', 's', 'u', 'e']) && !before.is_alphabetic() {
            let mut j = k + 5;
            if c.get(j) == Some(&'s') {
                j += 1;
            }
            let ws = j;
            while c.get(j).is_some_and(|d| *d == ' ') {
                j += 1;
            }
            if c.get(j) == Some(&'#') {
                j += 1;
            }
            if j > ws && digit(j) {
                return Some(format!("an issue number `{}`", c[k..j].iter().collect::<String>() + &num(j)));
            }
        }
        if digits(k, 4) && !digit(k.wrapping_sub(1)) && c.get(k + 4) == Some(&'-') && digits(k + 5, 2) && c.get(k + 7) == Some(&'-') && digits(k + 8, 2) && !digit(k + 10) {
            let n = |a: usize, b: usize| c[a..b].iter().collect::<String>().parse::<u32>().unwrap();
            let (y, m, d) = (n(k, k + 4), n(k + 5, k + 7), n(k + 8, k + 10));
            if (1900..2100).contains(&y) && (1..=12).contains(&m) && (1..=31).contains(&d) {
                return Some(format!("a date `{}`", c[k..k + 10].iter().collect::<String>()));
            }
        }
    }
    None
}

fn check_comment_references(files: &[(String, String)]) -> Vec<Violation> {
    let mut bad = Vec::new();
    for (path, text) in files {
        for c in lex(text).comments {
            if let Some(what) = comment_reference(&c.text) {
                let msg = format!("a comment cites {what}: say what and why in the code, keep history in git and book/src/design/");
                bad.push(violation(path, c.line, "comment references", msg));
            }
        }
    }
    bad
}

// ---- The module graph of codegen/src

const CODEGEN_SRC: &str = "codegen/src/";

/// A module path below `crate`, e.g. `["kernels", "matmul"]`.
type ModPath = Vec<String>;

/// One import: a leaf of a `use` tree, or a `crate::`/`super::` path in code.
#[derive(Clone, Debug)]
struct Import {
    line: usize,
    /// The module it is written in (the file's, then inline `mod` blocks).
    here: ModPath,
    /// As written; `*` for a glob.
    path: Vec<String>,
    alias: Option<String>,
    /// A `use` item directly in a module (not in a fn or impl): it binds a name there.
    binds: bool,
    /// In a `#[cfg(test)]` item or an inline module under one.
    test: bool,
}

/// What the scan of one file of `codegen/src` finds.
#[derive(Debug)]
struct ModFile {
    path: String,
    module: ModPath,
    imports: Vec<Import>,
    inline_mods: Vec<ModPath>,
    /// Modules declared `#[cfg(test)] mod x;` here (their files are test code).
    test_children: Vec<ModPath>,
    /// `#![cfg(test)]`.
    test: bool,
}

/// `codegen/src/kernels/matmul/mod.rs` → `kernels::matmul`; `lib.rs` → the crate root.
fn module_of(path: &str) -> ModPath {
    let rel = path.strip_prefix(CODEGEN_SRC).unwrap_or(path).trim_end_matches(".rs");
    let mut segs: Vec<String> = rel.split('/').map(String::from).collect();
    if matches!(segs.last().map(String::as_str), Some("mod" | "lib")) {
        segs.pop();
    }
    segs
}

/// The leaves of a `use` tree starting at `*k`, which ends past the tree.
fn use_tree(toks: &[Token], k: &mut usize, prefix: Vec<String>, out: &mut Vec<(Vec<String>, Option<String>, usize)>) {
    let mut path = prefix;
    while let Some(t) = toks.get(*k) {
        match t.text.as_str() {
            "{" if t.kind == Tok::Punct => {
                *k += 1;
                while toks.get(*k).is_some_and(|t| !t.is("}")) {
                    use_tree(toks, k, path.clone(), out);
                    if toks.get(*k).is_some_and(|t| t.is(",")) {
                        *k += 1;
                    }
                }
                *k += 1;
                return;
            }
            "*" => {
                path.push("*".into());
                out.push((path, None, t.line));
                *k += 1;
                return;
            }
            "::" if path.is_empty() => {
                path.push("::".into()); // `use ::std::..`: an extern crate
                *k += 1;
            }
            _ if t.kind == Tok::Ident => {
                path.push(t.text.clone());
                *k += 1;
                if toks.get(*k).is_some_and(|t| t.is("::")) {
                    *k += 1;
                    continue;
                }
                let mut alias = None;
                if toks.get(*k).is_some_and(|t| t.is("as")) {
                    alias = toks.get(*k + 1).map(|t| t.text.clone());
                    *k += 2;
                }
                out.push((path, alias, t.line));
                return;
            }
            _ => return,
        }
    }
}

/// An open brace while scanning: the inline module it opens, if any, and whether it is test
/// code.
struct Frame {
    module: Option<String>,
    test: bool,
}

fn scan_module_file(path: &str, text: &str) -> ModFile {
    let toks = lex(text).tokens;
    let mut file = ModFile { path: path.into(), module: module_of(path), imports: vec![], inline_mods: vec![], test_children: vec![], test: false };
    let mut frames: Vec<Frame> = Vec::new();
    let (mut pending_test, mut test_item) = (false, None::<usize>);
    let mut k = 0;
    while k < toks.len() {
        let t = &toks[k];
        let prev = if k > 0 { toks[k - 1].text.as_str() } else { "" };
        if t.is("#") && toks.get(k + 1).is_some_and(|n| n.is("[") || n.is("!")) {
            let open = if toks[k + 1].is("!") { k + 2 } else { k + 1 };
            let close = matching(&toks, open);
            let inner: Vec<&str> = toks[open + 1..close].iter().map(|t| t.text.as_str()).collect();
            if inner == ["cfg", "(", "test", ")"] {
                if open == k + 2 {
                    file.test = true;
                } else {
                    pending_test = true;
                }
            }
            k = close + 1;
            continue;
        }
        if pending_test {
            pending_test = false;
            test_item = Some(frames.len());
        }
        let here = || file.module.iter().cloned().chain(frames.iter().filter_map(|f| f.module.clone())).collect::<ModPath>();
        let in_test = frames.iter().any(|f| f.test) || test_item.is_some();
        match t.text.as_str() {
            _ if t.kind == Tok::Literal || t.kind == Tok::Lifetime => {}
            "{" => {
                let module = (k >= 2 && toks[k - 2].is("mod") && toks[k - 1].kind == Tok::Ident).then(|| toks[k - 1].text.clone());
                if let Some(m) = &module {
                    file.inline_mods.push([here(), vec![m.clone()]].concat());
                }
                frames.push(Frame { module, test: in_test });
                if test_item == Some(frames.len() - 1) {
                    test_item = None;
                }
            }
            "}" => {
                frames.pop();
            }
            ";" if test_item == Some(frames.len()) => test_item = None,
            "mod" if in_test && toks.get(k + 2).is_some_and(|n| n.is(";")) => {
                file.test_children.push([here(), vec![toks[k + 1].text.clone()]].concat());
            }
            "use" if t.kind == Tok::Ident => {
                let mut leaves = Vec::new();
                k += 1;
                use_tree(&toks, &mut k, vec![], &mut leaves);
                let binds = frames.iter().all(|f| f.module.is_some());
                for (path, alias, line) in leaves {
                    file.imports.push(Import { line, here: here(), path, alias, binds, test: in_test });
                }
                if test_item == Some(frames.len()) {
                    test_item = None;
                }
                continue;
            }
            // A path in code: `crate::`, `super::`, `self::`, or a child module's name.
            _ if t.kind == Tok::Ident && toks.get(k + 1).is_some_and(|n| n.is("::")) && !matches!(prev, "::" | "." | "in") => {
                let mut path = vec![t.text.clone()];
                let mut j = k + 1;
                while toks.get(j).is_some_and(|n| n.is("::")) && toks.get(j + 1).is_some_and(|n| n.kind == Tok::Ident) {
                    path.push(toks[j + 1].text.clone());
                    j += 2;
                }
                if path.len() > 1 || matches!(path[0].as_str(), "crate" | "super" | "self") {
                    file.imports.push(Import { line: t.line, here: here(), path, alias: None, binds: false, test: in_test });
                }
                k = j;
                continue;
            }
            _ => {}
        }
        k += 1;
    }
    file
}

/// The layer of a module path (of an importing module, or of an import's resolved target).
#[derive(Clone, Debug, PartialEq)]
enum Layer {
    Isa,
    /// `kernels` itself (`kernels/mod.rs`, or a glob of it).
    Dispatcher,
    /// An item defined in `kernels/mod.rs`.
    DispatcherItem(String),
    Family(String),
    Shared(String),
    /// Test-only modules: `emu`, `testing`.
    TestOnly,
    Other,
}

/// The scanned files of `codegen/src`, with what the rules need to resolve a path.
struct CodegenTree {
    files: Vec<ModFile>,
    /// Every module (file or inline) → the file that holds it.
    modules: BTreeMap<ModPath, String>,
    /// `(module, name)` → the absolute path a module-level `use` binds the name to.
    bindings: BTreeMap<(ModPath, String), Vec<String>>,
    /// Files that are test code as a whole.
    test_files: BTreeSet<String>,
}

impl CodegenTree {
    fn new(sources: &[(String, String)]) -> CodegenTree {
        let files: Vec<ModFile> = sources.iter().filter(|(p, _)| p.starts_with(CODEGEN_SRC)).map(|(p, t)| scan_module_file(p, t)).collect();
        let mut modules = BTreeMap::new();
        for f in &files {
            modules.insert(f.module.clone(), f.path.clone());
            for m in &f.inline_mods {
                modules.insert(m.clone(), f.path.clone());
            }
        }
        let mut tree = CodegenTree { files, modules, bindings: BTreeMap::new(), test_files: BTreeSet::new() };
        let test_children: Vec<ModPath> = tree.files.iter().flat_map(|f| f.test_children.clone()).collect();
        let is_test = |f: &ModFile| {
            let name = f.path.rsplit('/').next().unwrap_or("");
            let under_tests = f.path[CODEGEN_SRC.len()..].split('/').any(|s| s == "tests");
            let declared_test = test_children.iter().any(|m| f.module.starts_with(m));
            f.test || name == "tests.rs" || under_tests || declared_test || tree.layer(&f.module) == Layer::TestOnly
        };
        let test_files = tree.files.iter().filter(|f| is_test(f)).map(|f| f.path.clone()).collect();
        tree.test_files = test_files;
        let mut bindings = BTreeMap::new();
        for f in &tree.files {
            for imp in f.imports.iter().filter(|i| i.binds && i.path.last().is_some_and(|s| s != "*")) {
                let mut p = imp.path.clone();
                if p.len() > 1 && p.last().is_some_and(|s| s == "self") {
                    p.pop();
                }
                if let Some(target) = tree.resolve(&imp.here, &p) {
                    let name = imp.alias.clone().unwrap_or_else(|| p.last().unwrap().clone());
                    bindings.insert((imp.here.clone(), name), target);
                }
            }
        }
        tree.bindings = bindings;
        tree
    }

    /// A path as written in module `here` → its absolute path below `crate`; `None` for paths
    /// into other crates.
    fn resolve(&self, here: &[String], path: &[String]) -> Option<Vec<String>> {
        let (mut base, rest) = match path.first()?.as_str() {
            "crate" => (vec![], &path[1..]),
            "self" => (here.to_vec(), &path[1..]),
            "super" => {
                let mut base = here.to_vec();
                let mut rest = path;
                while rest.first().is_some_and(|s| s == "super") {
                    base.pop()?;
                    rest = &rest[1..];
                }
                (base, rest)
            }
            first if self.modules.contains_key(&[here, &[first.to_string()][..]].concat()) => (here.to_vec(), path),
            _ => return None,
        };
        base.extend(rest.iter().filter(|s| *s != "self").cloned());
        Some(base)
    }

    /// How many leading segments of `p` name a module.
    fn module_prefix(&self, p: &[String]) -> usize {
        (0..=p.len()).rev().find(|&l| self.modules.contains_key(&p[..l])).unwrap_or(0)
    }

    /// Follows `use` bindings (re-exports included) to the module that defines the item.
    fn follow(&self, mut p: Vec<String>) -> Vec<String> {
        for _ in 0..8 {
            let m = self.module_prefix(&p);
            if m == p.len() {
                break;
            }
            match self.bindings.get(&(p[..m].to_vec(), p[m].clone())) {
                Some(t) if t.as_slice() != &p[..=m] => p = [t.clone(), p[m + 1..].to_vec()].concat(),
                _ => break,
            }
        }
        p
    }

    fn layer(&self, p: &[String]) -> Layer {
        let seg = |i: usize| p.get(i).map(String::as_str);
        match (seg(0), seg(1)) {
            (Some("isa"), _) => Layer::Isa,
            (Some("emu" | "testing"), _) => Layer::TestOnly,
            (Some("kernels"), None | Some("*")) => Layer::Dispatcher,
            (Some("kernels"), Some(f)) if FAMILIES.contains(&f) => Layer::Family(f.into()),
            (Some("kernels"), Some(s)) if self.modules.contains_key(&p[..2]) => Layer::Shared(s.into()),
            (Some("kernels"), Some(item)) => Layer::DispatcherItem(item.into()),
            _ => Layer::Other,
        }
    }

    /// Every import of non-extern paths: `(file, import, resolved target, test code?)`.
    fn arrows(&self) -> Vec<(&ModFile, &Import, Vec<String>, bool)> {
        let mut out = Vec::new();
        for f in &self.files {
            for imp in &f.imports {
                let Some(target) = self.resolve(&imp.here, &imp.path) else { continue };
                let test = imp.test || self.test_files.contains(&f.path) || self.layer(&imp.here) == Layer::TestOnly;
                out.push((f, imp, self.follow(target), test));
            }
        }
        out
    }
}

fn shown(imp: &Import, target: &[String]) -> String {
    let written = imp.path.join("::");
    let resolved = format!("crate::{}", target.join("::"));
    if written == resolved {
        format!("`{written}`")
    } else {
        format!("`{written}` (= `{resolved}`)")
    }
}

/// The layer rules of the kernels' layout (see the list at the top of this part).
fn check_codegen_layers(sources: &[(String, String)]) -> Vec<Violation> {
    let tree = CodegenTree::new(sources);
    let mut bad = Vec::new();
    for (f, imp, target, test) in tree.arrows() {
        let (from, to) = (tree.layer(&imp.here), tree.layer(&target));
        let what = shown(imp, &target);
        let msg = match (&from, &to) {
            (Layer::Isa, Layer::Dispatcher | Layer::DispatcherItem(_) | Layer::Family(_) | Layer::Shared(_)) => {
                format!("the instruction layer isa/ imports {what} from kernels/: isa knows no kernel")
            }
            (Layer::Isa, Layer::TestOnly) if target[0] == "emu" => format!("the instruction layer isa/ imports {what} from the emulator: isa knows no evaluator"),
            _ if test => continue,
            (Layer::Family(a), Layer::Family(b)) if a != b => {
                format!("family `{a}` imports {what} from its sibling family `{b}`: families are siblings; move what both need below them (a shared piece of kernels/, or isa/)")
            }
            (Layer::Shared(a), Layer::Family(b)) => {
                format!("shared piece `kernels::{a}` imports {what} from family `{b}`: shared pieces sit below the families")
            }
            (Layer::Family(_) | Layer::Shared(_), Layer::Dispatcher) => {
                format!("imports {what}, a glob or the whole of the dispatcher kernels/mod.rs: name the shared piece instead")
            }
            (Layer::Family(_) | Layer::Shared(_), Layer::DispatcherItem(item)) => {
                format!("imports {what}: `{item}` is defined in the dispatcher kernels/mod.rs, above the families; move it to a shared piece (kernels/ctx.rs, family.rs, ...)")
            }
            _ => continue,
        };
        bad.push(violation(&f.path, imp.line, "codegen layers", msg));
    }
    bad.dedup();
    bad
}

/// The folder module under `kernels/` a file belongs to (`codegen/src/kernels/<folder>/...`: a
/// family, or a shared piece cut into files such as `element/`).
fn family_folder(path: &str) -> Option<&str> {
    let rest = path.strip_prefix("codegen/src/kernels/")?;
    let (dir, _) = rest.split_once('/')?;
    Some(dir)
}

/// Import cycles between files of codegen/src, a family folder counting as one file: one
/// violation per strongly connected set, naming one cycle through it with each arrow's line.
fn check_codegen_cycles(sources: &[(String, String)]) -> Vec<Violation> {
    let tree = CodegenTree::new(sources);
    let node = |file: &str| match family_folder(file) {
        Some(f) => format!("codegen/src/kernels/{f}/"),
        None => file.to_string(),
    };
    // node → node it imports → the first such import: (file, line, imported file).
    let mut edges: BTreeMap<String, BTreeMap<String, (String, usize, String)>> = BTreeMap::new();
    for (f, imp, target, test) in tree.arrows() {
        let Some(to) = tree.modules.get(&target[..tree.module_prefix(&target)]) else { continue };
        let (a, b) = (node(&f.path), node(to));
        if !test && a != b {
            edges.entry(a).or_default().entry(b).or_insert_with(|| (f.path.clone(), imp.line, to.clone()));
        }
    }
    let reach = |from: &str| {
        let mut seen = BTreeSet::new();
        let mut stack = vec![from.to_string()];
        while let Some(n) = stack.pop() {
            for m in edges.get(&n).into_iter().flat_map(|e| e.keys()) {
                if seen.insert(m.clone()) {
                    stack.push(m.clone());
                }
            }
        }
        seen
    };
    let reachable: BTreeMap<&String, BTreeSet<String>> = edges.keys().map(|n| (n, reach(n))).collect();
    let mut done = BTreeSet::new();
    let mut bad = Vec::new();
    for (n, r) in &reachable {
        if done.contains(*n) || !r.contains(*n) {
            continue;
        }
        let scc: BTreeSet<String> = r.iter().filter(|m| reachable.get(m).is_some_and(|rm| rm.contains(*n))).cloned().collect();
        done.extend(scc.iter().cloned());
        // The shortest cycle through `n`, by breadth-first search inside the set.
        let mut parent: BTreeMap<String, String> = BTreeMap::new();
        let mut queue = std::collections::VecDeque::from([(*n).clone()]);
        'bfs: while let Some(u) = queue.pop_front() {
            for v in edges.get(&u).into_iter().flat_map(|e| e.keys()).filter(|v| scc.contains(*v)) {
                if !parent.contains_key(v) {
                    parent.insert(v.clone(), u.clone());
                    if v == *n {
                        break 'bfs;
                    }
                    queue.push_back(v.clone());
                }
            }
        }
        // Walk back from `n`'s parent to `n`: the cycle reversed.
        let mut cycle = vec![(*n).clone()];
        let mut at = parent[*n].clone();
        while at != **n {
            cycle.push(at.clone());
            at = parent[&at].clone();
        }
        cycle.push((*n).clone());
        cycle.reverse();
        let arrows: Vec<&(String, usize, String)> = cycle.windows(2).map(|w| &edges[&w[0]][&w[1]]).collect();
        let steps: Vec<String> = arrows.iter().map(|(from, line, to)| format!("{from}:{line} imports {to}")).collect();
        let members: Vec<&str> = scc.iter().map(String::as_str).collect();
        let msg = format!("import cycle: {}; the cycle's files: {}", steps.join(", "), members.join(", "));
        bad.push(violation(&arrows[0].0, arrows[0].1, "codegen cycles", msg));
    }
    bad
}

// ---- Tests of the source rules: each plants a violation, then the real tree.

fn src(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs.iter().map(|(p, t)| (p.to_string(), t.to_string())).collect()
}

/// The violations as `path:line: [rule]` (what a test asserts on; messages are checked apart).
fn places(bad: &[Violation]) -> Vec<String> {
    bad.iter().map(|v| format!("{}:{}: [{}]", v.path, v.line, v.rule)).collect()
}

#[test]
fn the_tokenizer_matches_braces_past_strings_chars_comments_and_lifetimes() {
    let text = r####"struct S<'ctx> { x: &'ctx str }
fn tricky<'ctx, 'b: 'ctx>(x: &'ctx str) -> [u8; 3] where 'b: 'ctx {
    let s = "}}} \" }";  // } a comment brace
    let r = r#"{{ "quoted" }"#;
    let rr = br##"}"# still inside"##;
    let (c, d, e, f) = ('{', '\'', b'}', '\u{7d}');
    let g = '\\';
    /* { /* nested } */ still a comment { */
    'outer: loop { break 'outer; }
    let h: &'static str = "'";
    let u = 'é';
    [1, 2, 3]
}
trait T {
    fn declared(&self) -> [u8; 4];
    fn provided(&self) {}
}
fn after() {
    let f: fn(u8) -> u8 = |x| x;
}
"####;
    let spans = fn_spans(&lex(text).tokens);
    let want = [("tricky", 2, 13), ("provided", 16, 16), ("after", 18, 20)];
    let want: Vec<(String, usize, usize)> = want.iter().map(|(n, a, b)| (n.to_string(), *a, *b)).collect();
    assert_eq!(spans, want);
    let comments: Vec<usize> = lex(text).comments.iter().map(|c| c.line).collect();
    assert_eq!(comments, [3, 8], "one line comment and a one-line block comment");
    let lifetimes: Vec<String> = lex(text).tokens.iter().filter(|t| t.kind == Tok::Lifetime).map(|t| t.text.clone()).collect();
    assert_eq!(lifetimes, ["'ctx", "'ctx", "'ctx", "'b", "'ctx", "'ctx", "'b", "'ctx", "'outer", "'outer", "'static"]);
}

#[test]
fn the_file_length_check_reports_a_long_file() {
    let long = "let x = 1;\n".repeat(1600);
    let ok = "let x = 1;\n".repeat(MAX_FILE_LINES);
    let bad = check_file_lengths(&src(&[("codegen/src/big.rs", &long), ("codegen/src/fine.rs", &ok)]));
    assert_eq!(places(&bad), ["codegen/src/big.rs:1501: [file length]"]);
    assert!(bad[0].to_string().contains("1600 lines, over the limit of 1500"), "{}", bad[0]);
}

#[test]
fn the_fn_length_check_reports_a_long_fn() {
    let body = |n: usize| "    let x = 1;\n".repeat(n - 2);
    let text = format!("// a file\nfn long() {{\n{}}}\n\nfn fine() {{\n{}}}\n", body(300), body(MAX_FN_LINES));
    let bad = check_fn_lengths(&src(&[("passes/src/x.rs", &text)]));
    assert_eq!(places(&bad), ["passes/src/x.rs:2: [fn length]"]);
    assert!(bad[0].to_string().contains("`fn long` has 300 lines (to line 301)"), "{}", bad[0]);
}

/// A small kernels/ tree that keeps the rules; tests add one file that breaks one.
fn layered_tree() -> Vec<(&'static str, &'static str)> {
    vec![
        ("codegen/src/lib.rs", "mod isa;\nmod kernels;\n#[cfg(test)]\nmod emu;\n#[cfg(test)]\nmod testing;\n"),
        ("codegen/src/isa/mod.rs", "pub mod kit;\n"),
        ("codegen/src/isa/kit.rs", "use super::super::math::exp;\npub struct Kit;\n"),
        ("codegen/src/emu/mod.rs", "use crate::kernels::matmul::Spec;\npub fn run() {}\n"),
        ("codegen/src/testing.rs", "use crate::kernels::{attention::simt, matmul::Spec};\n"),
        (
            "codegen/src/kernels/mod.rs",
            "mod attention;\nmod ctx;\nmod matmul;\nmod view;\npub use ctx::KernelCtx;\npub use matmul::Spec as MatmulSpec;\npub fn compile_kernel() { attention::build(); matmul::build(); }\npub struct Defined;\n",
        ),
        ("codegen/src/kernels/ctx.rs", "use crate::isa::kit::Kit;\npub struct KernelCtx;\n"),
        ("codegen/src/kernels/view.rs", "use super::ctx::KernelCtx;\npub struct View;\n"),
        ("codegen/src/kernels/matmul/mod.rs", "mod tiled;\nuse crate::kernels::KernelCtx;\npub use tiled::Spec;\npub fn build() { tiled::go() }\n"),
        ("codegen/src/kernels/matmul/tiled.rs", "use super::super::view::View;\nuse super::build;\npub struct Spec;\npub fn go() {}\n"),
        (
            "codegen/src/kernels/attention/mod.rs",
            "pub mod simt;\nuse crate::kernels::{ctx::KernelCtx, view::View};\npub fn build() { simt::go() }\n#[cfg(test)]\nmod tests;\n",
        ),
        (
            "codegen/src/kernels/attention/simt.rs",
            "use super::build;\npub fn go() { let _ = crate::isa::kit::Kit; }\n#[cfg(test)]\nmod tests {\n    use crate::kernels::matmul::Spec;\n    use crate::testing::*;\n}\n",
        ),
        ("codegen/src/kernels/attention/tests.rs", "use crate::kernels::MatmulSpec;\nuse crate::emu::run;\n"),
    ]
}

fn with(extra: &[(&'static str, &'static str)]) -> Vec<(String, String)> {
    let mut files = layered_tree();
    for (p, t) in extra {
        files.retain(|(q, _)| q != p);
        files.push((p, t));
    }
    src(&files)
}

#[test]
fn the_layer_check_passes_a_tree_that_keeps_the_layers() {
    let bad = check_codegen_layers(&with(&[]));
    assert!(bad.is_empty(), "{bad:#?}");
    assert!(check_codegen_cycles(&with(&[])).is_empty());
}

#[test]
fn the_layer_check_reports_a_sibling_family_import() {
    let simt = "use super::build;\n\nuse crate::kernels::matmul::X;\npub fn go() { crate::kernels::matmul::build() }\n";
    let bad = check_codegen_layers(&with(&[("codegen/src/kernels/attention/simt.rs", simt)]));
    assert_eq!(places(&bad), ["codegen/src/kernels/attention/simt.rs:3: [codegen layers]", "codegen/src/kernels/attention/simt.rs:4: [codegen layers]"]);
    let msg = bad[0].to_string();
    assert!(msg.contains("family `attention` imports `crate::kernels::matmul::X` from its sibling family `matmul`"), "{msg}");
    // Through a re-export of the dispatcher, the import is still one of the sibling.
    let bad = check_codegen_layers(&with(&[("codegen/src/kernels/attention/simt.rs", "use crate::kernels::MatmulSpec;\n")]));
    assert!(bad[0].msg.contains("(= `crate::kernels::matmul::tiled::Spec`) from its sibling family `matmul`"), "{bad:?}");
}

#[test]
fn the_layer_check_reports_a_shared_piece_importing_a_family_and_dispatcher_items() {
    let view = "use super::matmul::Spec;\nuse crate::kernels::Defined;\nuse super::*;\n";
    let bad = check_codegen_layers(&with(&[("codegen/src/kernels/view.rs", view)]));
    assert_eq!(places(&bad), ["codegen/src/kernels/view.rs:1: [codegen layers]", "codegen/src/kernels/view.rs:2: [codegen layers]", "codegen/src/kernels/view.rs:3: [codegen layers]"]);
    assert!(bad[0].msg.contains("shared piece `kernels::view` imports `super::matmul::Spec` (= `crate::kernels::matmul::tiled::Spec`) from family `matmul`"), "{}", bad[0]);
    assert!(bad[1].msg.contains("`Defined` is defined in the dispatcher kernels/mod.rs"), "{}", bad[1]);
    assert!(bad[2].msg.contains("a glob or the whole of the dispatcher"), "{}", bad[2]);
}

#[test]
fn the_layer_check_reports_an_isa_file_importing_a_family_or_the_emulator_even_in_tests() {
    let kit = "use crate::kernels::matmul::Spec;\npub struct Kit;\n#[cfg(test)]\nmod tests {\n    use crate::emu::run;\n}\n";
    let bad = check_codegen_layers(&with(&[("codegen/src/isa/kit.rs", kit)]));
    assert_eq!(places(&bad), ["codegen/src/isa/kit.rs:1: [codegen layers]", "codegen/src/isa/kit.rs:5: [codegen layers]"]);
    assert!(bad[0].msg.contains("the instruction layer isa/ imports `crate::kernels::matmul::Spec` (= `crate::kernels::matmul::tiled::Spec`) from kernels/"), "{}", bad[0]);
    assert!(bad[1].msg.contains("from the emulator"), "{}", bad[1]);
}

#[test]
fn the_cycle_check_reports_a_two_file_cycle_but_not_one_inside_a_family_folder() {
    // A family importing the dispatcher, which dispatches to it: a cycle through the folder.
    let tiled = "use crate::kernels::Defined;\npub struct Spec;\npub fn go() {}\n";
    let bad = check_codegen_cycles(&with(&[("codegen/src/kernels/matmul/tiled.rs", tiled)]));
    assert_eq!(places(&bad), ["codegen/src/kernels/matmul/tiled.rs:1: [codegen cycles]"]);
    assert!(bad[0].msg.contains("tiled.rs:1 imports codegen/src/kernels/mod.rs, codegen/src/kernels/mod.rs:"), "{}", bad[0]);
    let files = src(&[
        ("codegen/src/lib.rs", "mod a;\nmod b;\nmod kernels;\n"),
        ("codegen/src/a.rs", "use crate::b::B;\npub struct A;\n"),
        ("codegen/src/b.rs", "pub struct B;\n\nfn f() -> crate::a::A { todo!() }\n"),
        ("codegen/src/kernels/mod.rs", "mod matmul;\n"),
        ("codegen/src/kernels/matmul/mod.rs", "mod tiled;\nuse tiled::T;\npub struct M;\n"),
        ("codegen/src/kernels/matmul/tiled.rs", "use super::M;\npub struct T;\n#[cfg(test)]\nmod tests {\n    use crate::a::A;\n}\n"),
    ]);
    let bad = check_codegen_cycles(&files);
    assert_eq!(places(&bad), ["codegen/src/a.rs:1: [codegen cycles]"]);
    assert!(bad[0].msg.contains("import cycle: codegen/src/a.rs:1 imports codegen/src/b.rs, codegen/src/b.rs:3 imports codegen/src/a.rs"), "{}", bad[0]);
}

#[test]
fn the_comment_check_reports_issue_numbers_and_dates_in_comments_only() {
    let text = "// fixed for #12\nfn f() {} // measured 2026-11-30\n/// see issue 5\n//! Issues #7\nlet s = \"#12 and 2026-11-30 in a string\";\n/* block: issue #9 */\n// fine: a # 1 gap, x#1, 1024-4096-8, 2026-13-01, &#123;\n";
    let bad = check_comment_references(&src(&[("ir/src/x.rs", text)]));
    assert_eq!(places(&bad), ["ir/src/x.rs:1: [comment references]", "ir/src/x.rs:2: [comment references]", "ir/src/x.rs:3: [comment references]", "ir/src/x.rs:4: [comment references]", "ir/src/x.rs:6: [comment references]"]);
    assert!(bad[0].msg.contains("an issue number `#12`"), "{}", bad[0]);
    assert!(bad[1].msg.contains("a date `2026-11-30`"), "{}", bad[1]);
    assert!(bad[2].msg.contains("an issue number `issue 5`"), "{}", bad[2]);
}

#[test]
fn no_source_file_is_too_long() {
    report("file length", &check_file_lengths(&workspace_sources()));
}

#[test]
fn no_function_is_too_long() {
    report("fn length", &check_fn_lengths(&workspace_sources()));
}

#[test]
fn codegen_keeps_its_layers() {
    report("codegen layers", &check_codegen_layers(&workspace_sources()));
}

#[test]
fn codegen_has_no_import_cycles() {
    report("codegen cycles", &check_codegen_cycles(&workspace_sources()));
}

#[test]
fn comments_cite_no_issue_numbers_or_dates() {
    report("comment references", &check_comment_references(&workspace_sources()));
}
