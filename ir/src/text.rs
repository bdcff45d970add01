//! The `.sir` text format: a printer and a parser that round-trip exactly.
//!
//! ```text
//! // comments run to the end of the line
//! func @mlp(%x: bf16[T, 576], %w_gate: bf16[576, 1536], %w_up: bf16[576, 1536], %w_down: bf16[1536, 576]) {
//!   %v4: bf16[T, 1536] = matmul(%x, %w_gate)
//!   %v5: bf16[T, 1536] = matmul(%x, %w_up)
//!   %v6: bf16[T, 1536] = swiglu(%v4, %v5)
//!   %out: bf16[T, 576] = matmul(%v6, %w_down)
//!   return %out
//! }
//! ```
//! Values are `%name` when named and `%vN` otherwise (`vN` names are reserved for unnamed
//! values); every result's type is printed inline; attributes equal to their default are
//! omitted; floats print in Rust's shortest round-trip form, so `parse(print(g)) == g`.

use std::collections::HashMap;
use std::fmt::{self, Write};

use crate::dim::Dim;
use crate::dtype::DType;
use crate::graph::{Function, Graph, TensorType, Value};
use crate::ops::{Attr, AttrError, Op, OpKind};

// ----------------------------------------------------------------------------------------
// Printer

fn print_attr(out: &mut String, a: &Attr) {
    match a {
        Attr::Int(v) => write!(out, "{v}"),
        Attr::Float(v) => write!(out, "{}", fmt_float(*v)),
        Attr::Bool(v) => write!(out, "{v}"),
        Attr::Str(s) => write!(out, "{s:?}"),
        Attr::Ints(v) => write!(out, "[{}]", v.iter().map(|x| x.to_string()).collect::<Vec<_>>().join(", ")),
        Attr::Dims(v) => write!(out, "[{}]", v.iter().map(|x| x.to_string()).collect::<Vec<_>>().join(", ")),
        Attr::Dim(d) => write!(out, "{d}"),
        Attr::DType(d) => write!(out, "{d}"),
        // Only an optional attribute's slot holds it, and there it is the default, which is
        // not printed; a node that carries it elsewhere does not verify.
        Attr::Absent => write!(out, "absent"),
    }
    .expect("writing to a String cannot fail");
}

/// Formats a float so that it reads back as a float with the same bits (`1.0`, not `1`).
fn fmt_float(v: f64) -> String {
    if v.is_nan() {
        // The sign survives (`0.0/0.0` is a negative NaN on x86); other payload bits do not.
        return if v.is_sign_negative() { "-nan".into() } else { "nan".into() };
    }
    if v.is_infinite() {
        return if v > 0.0 { "inf".into() } else { "-inf".into() };
    }
    let s = format!("{v:?}");
    if s.contains(['.', 'e', 'E']) {
        s
    } else {
        format!("{s}.0")
    }
}

/// Prints one function.
pub fn print_function(f: &Function) -> String {
    let mut out = String::new();
    let params: Vec<String> = f.params.iter().map(|&p| format!("{}: {}", f.label(p), f.ty(p))).collect();
    let _ = writeln!(out, "func @{}({}) {{", f.name, params.join(", "));
    for nd in f.nodes.values() {
        let results: Vec<String> = nd.results.iter().map(|&r| format!("{}: {}", f.label(r), f.ty(r))).collect();
        let inputs: Vec<String> = nd.inputs.iter().map(|&v| f.label(v)).collect();
        // A call of a function without outputs has no results: the line starts with `=`.
        let lhs = if results.is_empty() { String::new() } else { format!("{} ", results.join(", ")) };
        let _ = write!(out, "  {lhs}= {}({})", nd.op.kind.name(), inputs.join(", "));
        let specs = nd.op.kind.info().attrs;
        let shown: Vec<String> = specs
            .iter()
            .zip(&nd.op.attrs)
            .filter(|(spec, a)| spec.default_value().as_ref() != Some(*a))
            .map(|(spec, a)| {
                let mut s = format!("{}=", spec.name);
                print_attr(&mut s, a);
                s
            })
            .collect();
        if !shown.is_empty() {
            let _ = write!(out, " {{{}}}", shown.join(", "));
        }
        out.push('\n');
    }
    let outs: Vec<String> = f.outputs.iter().map(|&o| f.label(o)).collect();
    if outs.is_empty() {
        out.push_str("  return\n");
    } else {
        let _ = writeln!(out, "  return {}", outs.join(", "));
    }
    out.push_str("}\n");
    out
}

/// Prints a graph in the `.sir` format: its functions in definition order, blank-line separated.
pub fn print(g: &Graph) -> String {
    g.funcs.values().map(print_function).collect::<Vec<_>>().join("\n")
}

impl fmt::Display for Graph {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&print(self))
    }
}

// ----------------------------------------------------------------------------------------
// Lexer

#[derive(Clone, Debug, PartialEq)]
enum Tok {
    Ident(String),
    Int(i64),
    Float(f64),
    Value(String),
    Func(String),
    Str(String),
    Punct(&'static str),
    Eof,
}

impl fmt::Display for Tok {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Tok::Ident(s) => write!(f, "`{s}`"),
            Tok::Int(v) => write!(f, "`{v}`"),
            Tok::Float(v) => write!(f, "`{}`", fmt_float(*v)),
            Tok::Value(s) => write!(f, "`%{s}`"),
            Tok::Func(s) => write!(f, "`@{s}`"),
            Tok::Str(s) => write!(f, "{s:?}"),
            Tok::Punct(p) => write!(f, "`{p}`"),
            Tok::Eof => f.write_str("end of input"),
        }
    }
}

/// A `.sir` text could not be parsed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{line}:{col}: expected {expected}, found {found}")]
pub struct ParseError {
    /// 1-based line.
    pub line: usize,
    /// 1-based column (in characters).
    pub col: usize,
    /// What was there.
    pub found: String,
    /// What the grammar wanted there.
    pub expected: String,
}

struct Lexed {
    tok: Tok,
    line: usize,
    col: usize,
}

const PUNCTS: [&str; 14] = ["->", "(", ")", "[", "]", "{", "}", ",", ":", "=", "*", "+", "-", "^"];

fn is_ident_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

fn lex(src: &str) -> Result<Vec<Lexed>, ParseError> {
    let chars: Vec<char> = src.chars().collect();
    let (mut i, mut line, mut col) = (0usize, 1usize, 1usize);
    let mut out = Vec::new();
    let bad = |line, col, found: String, expected: &str| ParseError { line, col, found, expected: expected.into() };
    while i < chars.len() {
        let c = chars[i];
        let (l0, c0) = (line, col);
        let advance = |n: usize, i: &mut usize, col: &mut usize| {
            *i += n;
            *col += n;
        };
        if c == '\n' {
            i += 1;
            line += 1;
            col = 1;
            continue;
        }
        if c.is_whitespace() {
            advance(1, &mut i, &mut col);
            continue;
        }
        if c == '/' && chars.get(i + 1) == Some(&'/') {
            while i < chars.len() && chars[i] != '\n' {
                advance(1, &mut i, &mut col);
            }
            continue;
        }
        if c == '%' || c == '@' {
            let start = i + 1;
            let mut j = start;
            while j < chars.len() && (chars[j].is_ascii_alphanumeric() || chars[j] == '_' || (c == '%' && chars[j] == '.')) {
                j += 1;
            }
            if j == start {
                return Err(bad(l0, c0, format!("`{c}`"), if c == '%' { "a value name after `%`" } else { "a function name after `@`" }));
            }
            let name: String = chars[start..j].iter().collect();
            out.push(Lexed { tok: if c == '%' { Tok::Value(name) } else { Tok::Func(name) }, line: l0, col: c0 });
            advance(j - i, &mut i, &mut col);
            continue;
        }
        if c == '"' {
            let mut j = i + 1;
            let mut s = String::new();
            while j < chars.len() && chars[j] != '"' {
                if chars[j] == '\n' {
                    break;
                }
                if chars[j] == '\\' && j + 1 < chars.len() {
                    // The escapes Rust's `{:?}` writes, which is how the printer quotes.
                    j += 1;
                    s.push(match chars[j] {
                        'n' => '\n',
                        't' => '\t',
                        'r' => '\r',
                        '0' => '\0',
                        'u' if chars.get(j + 1) == Some(&'{') => {
                            let close = chars[j..].iter().position(|&c| c == '}' || c == '"' || c == '\n').map(|k| j + k);
                            let code = close
                                .filter(|&k| chars[k] == '}')
                                .and_then(|k| u32::from_str_radix(&chars[j + 2..k].iter().collect::<String>(), 16).ok())
                                .and_then(char::from_u32);
                            match (code, close) {
                                (Some(ch), Some(k)) => {
                                    j = k;
                                    ch
                                }
                                _ => return Err(bad(l0, c0, "a bad `\\u{…}` escape".into(), "a string with valid escapes")),
                            }
                        }
                        other => other,
                    });
                } else {
                    s.push(chars[j]);
                }
                j += 1;
            }
            if j >= chars.len() || chars[j] != '"' {
                return Err(bad(l0, c0, "an unterminated string".into(), "a closing `\"`"));
            }
            out.push(Lexed { tok: Tok::Str(s), line: l0, col: c0 });
            advance(j + 1 - i, &mut i, &mut col);
            continue;
        }
        if c.is_ascii_digit() {
            let mut j = i;
            while j < chars.len() && chars[j].is_ascii_digit() {
                j += 1;
            }
            let mut is_float = false;
            if j < chars.len() && chars[j] == '.' && chars.get(j + 1).is_some_and(|c| c.is_ascii_digit()) {
                is_float = true;
                j += 1;
                while j < chars.len() && chars[j].is_ascii_digit() {
                    j += 1;
                }
            }
            if j < chars.len() && (chars[j] == 'e' || chars[j] == 'E') {
                let mut k = j + 1;
                if k < chars.len() && (chars[k] == '+' || chars[k] == '-') {
                    k += 1;
                }
                if k < chars.len() && chars[k].is_ascii_digit() {
                    is_float = true;
                    j = k;
                    while j < chars.len() && chars[j].is_ascii_digit() {
                        j += 1;
                    }
                }
            }
            if j < chars.len() && (chars[j].is_ascii_alphabetic() || chars[j] == '_') {
                let mut k = j;
                while k < chars.len() && is_ident_char(chars[k]) {
                    k += 1;
                }
                let word: String = chars[i..k].iter().collect();
                return Err(bad(l0, c0, format!("`{word}`"), "a number or a name (names start with a letter)"));
            }
            let text: String = chars[i..j].iter().collect();
            let tok = if is_float {
                Tok::Float(text.parse().map_err(|_| bad(l0, c0, format!("`{text}`"), "a number"))?)
            } else {
                Tok::Int(text.parse().map_err(|_| bad(l0, c0, format!("`{text}`"), "an integer that fits in i64"))?)
            };
            out.push(Lexed { tok, line: l0, col: c0 });
            advance(j - i, &mut i, &mut col);
            continue;
        }
        if c.is_ascii_alphabetic() || c == '_' {
            let mut j = i;
            while j < chars.len() && is_ident_char(chars[j]) {
                j += 1;
            }
            out.push(Lexed { tok: Tok::Ident(chars[i..j].iter().collect()), line: l0, col: c0 });
            advance(j - i, &mut i, &mut col);
            continue;
        }
        let two: String = chars[i..(i + 2).min(chars.len())].iter().collect();
        if let Some(p) = PUNCTS.iter().find(|p| two.starts_with(**p)) {
            out.push(Lexed { tok: Tok::Punct(p), line: l0, col: c0 });
            advance(p.len(), &mut i, &mut col);
            continue;
        }
        return Err(bad(l0, c0, format!("`{c}`"), "a token"));
    }
    out.push(Lexed { tok: Tok::Eof, line, col });
    Ok(out)
}

// ----------------------------------------------------------------------------------------
// Parser

struct Parser {
    toks: Vec<Lexed>,
    pos: usize,
    /// Nesting depth of the dim expression being parsed.
    depth: usize,
}

/// How deeply `(` and unary `-` may nest in a dim.
const MAX_DIM_DEPTH: usize = 64;
/// The longest canonical form a dim may expand to while it is parsed.
const MAX_DIM_TEXT: usize = 4096;

fn is_reserved_label(name: &str) -> bool {
    name.len() > 1 && name.starts_with('v') && name[1..].bytes().all(|b| b.is_ascii_digit())
}

impl Parser {
    fn peek(&self) -> &Tok {
        &self.toks[self.pos].tok
    }

    fn error(&self, expected: impl Into<String>) -> ParseError {
        let t = &self.toks[self.pos];
        ParseError { line: t.line, col: t.col, found: t.tok.to_string(), expected: expected.into() }
    }

    fn error_at(&self, pos: usize, found: String, expected: impl Into<String>) -> ParseError {
        let t = &self.toks[pos];
        ParseError { line: t.line, col: t.col, found, expected: expected.into() }
    }

    fn bump(&mut self) -> Tok {
        let t = self.toks[self.pos].tok.clone();
        if self.pos + 1 < self.toks.len() {
            self.pos += 1;
        }
        t
    }

    fn eat(&mut self, p: &str) -> bool {
        if matches!(self.peek(), Tok::Punct(q) if *q == p) {
            self.bump();
            true
        } else {
            false
        }
    }

    fn expect(&mut self, p: &str) -> Result<(), ParseError> {
        if self.eat(p) {
            Ok(())
        } else {
            Err(self.error(format!("`{p}`")))
        }
    }

    fn expect_keyword(&mut self, kw: &str) -> Result<(), ParseError> {
        match self.peek() {
            Tok::Ident(s) if s == kw => {
                self.bump();
                Ok(())
            }
            _ => Err(self.error(format!("`{kw}`"))),
        }
    }

    fn value_label(&mut self) -> Result<String, ParseError> {
        // Peek before bumping: `bump` does not move past the end, so stepping back after it
        // would blame the token before the end of input.
        match self.peek().clone() {
            Tok::Value(v) => {
                self.bump();
                Ok(v)
            }
            _ => Err(self.error("a value (`%name`)")),
        }
    }

    // dim := term (('+' | '-') term)*
    fn dim(&mut self) -> Result<Dim, ParseError> {
        let start = self.pos;
        let mut acc = self.dim_term()?;
        loop {
            let r = if self.eat("+") {
                acc.checked_add(&self.dim_term()?)
            } else if self.eat("-") {
                acc.checked_sub(&self.dim_term()?)
            } else {
                return Ok(acc);
            };
            acc = r.ok_or_else(|| self.overflow(start))?;
        }
    }

    fn dim_term(&mut self) -> Result<Dim, ParseError> {
        let start = self.pos;
        let mut acc = self.dim_factor()?;
        while self.eat("*") {
            acc = acc.checked_mul(&self.dim_factor()?).ok_or_else(|| self.overflow(start))?;
            // Products of sums expand: `(a+b)*(a+b)*…` grows exponentially. Stop early.
            if acc.to_string().len() > MAX_DIM_TEXT {
                return Err(self.error_at(start, "a product that expands past that".into(), format!("a dim of at most {MAX_DIM_TEXT} characters in canonical form")));
            }
        }
        Ok(acc)
    }

    fn overflow(&self, at: usize) -> ParseError {
        self.error_at(at, "a dim whose arithmetic overflows".into(), "a dim whose coefficients fit in i64")
    }

    fn dim_factor(&mut self) -> Result<Dim, ParseError> {
        // `-` and `(` recurse; bound the depth so that a hostile input cannot overflow the stack.
        if self.depth >= MAX_DIM_DEPTH {
            return Err(self.error(format!("a dim nested at most {MAX_DIM_DEPTH} deep")));
        }
        self.depth += 1;
        let r = self.dim_factor_inner();
        self.depth -= 1;
        r
    }

    fn dim_factor_inner(&mut self) -> Result<Dim, ParseError> {
        if self.eat("-") {
            let at = self.pos;
            return Dim::constant(0).checked_sub(&self.dim_factor()?).ok_or_else(|| self.overflow(at));
        }
        if self.eat("(") {
            let d = self.dim()?;
            self.expect(")")?;
            return Ok(d);
        }
        let base = match self.peek().clone() {
            Tok::Int(v) => {
                self.bump();
                Dim::constant(v)
            }
            // Words that mean something else as an attribute value are not symbols, so that a
            // dim prints to text that reads back as a dim in every position.
            Tok::Ident(s) if DType::from_name(&s).is_none() && !["inf", "nan", "true", "false"].contains(&s.as_str()) => {
                self.bump();
                Dim::symbol(&s)
            }
            _ => return Err(self.error("a dim (an integer, a symbol, or an expression of them)")),
        };
        if self.eat("^") {
            let at = self.pos;
            match self.bump() {
                Tok::Int(p) if (1..=64).contains(&p) => {
                    let mut d = Dim::constant(1);
                    for _ in 0..p {
                        d = d.checked_mul(&base).ok_or_else(|| self.overflow(at))?;
                    }
                    return Ok(d);
                }
                t => return Err(self.error_at(at, t.to_string(), "a power from 1 to 64")),
            }
        }
        Ok(base)
    }

    fn ty(&mut self) -> Result<TensorType, ParseError> {
        let dtype = match self.peek() {
            Tok::Ident(s) => DType::from_name(s),
            _ => None,
        }
        .ok_or_else(|| self.error(format!("a dtype ({})", DType::ALL.map(DType::name).join(", "))))?;
        self.bump();
        self.expect("[")?;
        let mut shape = Vec::new();
        if !self.eat("]") {
            loop {
                shape.push(self.dim()?);
                if self.eat("]") {
                    break;
                }
                if !self.eat(",") {
                    return Err(self.error("`,` or `]`"));
                }
            }
        }
        Ok(TensorType { dtype, shape })
    }

    fn attr_value(&mut self) -> Result<Attr, ParseError> {
        let neg = matches!(self.peek(), Tok::Punct("-"));
        match (self.peek().clone(), neg) {
            (Tok::Str(s), _) => {
                self.bump();
                Ok(Attr::Str(s))
            }
            (Tok::Float(v), _) => {
                self.bump();
                Ok(Attr::Float(v))
            }
            (Tok::Ident(s), _) if s == "true" || s == "false" => {
                self.bump();
                Ok(Attr::Bool(s == "true"))
            }
            (Tok::Ident(s), _) if s == "inf" || s == "nan" => {
                self.bump();
                Ok(Attr::Float(if s == "inf" { f64::INFINITY } else { f64::NAN }))
            }
            (Tok::Ident(s), _) if let Some(dt) = DType::from_name(&s) => {
                self.bump();
                Ok(Attr::DType(dt))
            }
            (_, true) => {
                // -inf, -1.5, or a negative dim / integer
                self.bump();
                match self.peek().clone() {
                    Tok::Float(v) => {
                        self.bump();
                        Ok(Attr::Float(-v))
                    }
                    Tok::Ident(s) if s == "inf" => {
                        self.bump();
                        Ok(Attr::Float(f64::NEG_INFINITY))
                    }
                    Tok::Ident(s) if s == "nan" => {
                        self.bump();
                        Ok(Attr::Float(-f64::NAN))
                    }
                    _ => {
                        let d = self.dim_term()?.scale(-1);
                        self.finish_dim_attr(d)
                    }
                }
            }
            (Tok::Punct("["), _) => {
                self.bump();
                let mut items = Vec::new();
                if !self.eat("]") {
                    loop {
                        items.push(self.dim()?);
                        if self.eat("]") {
                            break;
                        }
                        if !self.eat(",") {
                            return Err(self.error("`,` or `]`"));
                        }
                    }
                }
                if items.iter().all(|d| d.as_const().is_some()) {
                    Ok(Attr::Ints(items.iter().filter_map(Dim::as_const).collect()))
                } else {
                    Ok(Attr::Dims(items))
                }
            }
            _ => {
                let d = self.dim()?;
                self.finish_dim_attr(d)
            }
        }
    }

    fn finish_dim_attr(&mut self, first: Dim) -> Result<Attr, ParseError> {
        let mut d = first;
        loop {
            if self.eat("+") {
                d = d.add(&self.dim_term()?);
            } else if self.eat("-") {
                d = d.sub(&self.dim_term()?);
            } else {
                break;
            }
        }
        Ok(match d.as_const() {
            Some(c) => Attr::Int(c),
            None => Attr::Dim(d),
        })
    }

    fn function(&mut self, graph: &Graph) -> Result<Function, ParseError> {
        self.expect_keyword("func")?;
        let name = match self.peek().clone() {
            Tok::Func(n) => {
                self.bump();
                n
            }
            _ => return Err(self.error("a function name (`@name`)")),
        };
        if graph.func(&name).is_some() {
            return Err(self.error_at(self.pos - 1, format!("`@{name}`, already defined above"), "a new function name"));
        }
        let mut f = Function::new(name);
        let mut labels: HashMap<String, Value> = HashMap::new();
        // The line that defines each label, for redefinition errors.
        let mut def_lines: HashMap<String, usize> = HashMap::new();
        self.expect("(")?;
        if !self.eat(")") {
            loop {
                let at = self.pos;
                let label = self.value_label()?;
                self.expect(":")?;
                let ty = self.ty()?;
                if let Some(line) = def_lines.get(&label) {
                    return Err(self.error_at(at, format!("`%{label}`, already defined on line {line}"), "a new value name"));
                }
                def_lines.insert(label.clone(), self.toks[at].line);
                let v = f.add_param(if is_reserved_label(&label) { None } else { Some(label.clone()) }, ty);
                labels.insert(label, v);
                if self.eat(")") {
                    break;
                }
                if !self.eat(",") {
                    return Err(self.error("`,` or `)`"));
                }
            }
        }
        self.expect("{")?;
        loop {
            if matches!(self.peek(), Tok::Ident(s) if s == "return") {
                self.bump();
                let mut outs = Vec::new();
                if !matches!(self.peek(), Tok::Punct("}")) {
                    loop {
                        let at = self.pos;
                        let l = self.value_label()?;
                        outs.push(*labels.get(&l).ok_or_else(|| self.error_at(at, format!("`%{l}`"), "a value defined before"))?);
                        if !self.eat(",") {
                            break;
                        }
                    }
                }
                self.expect("}")?;
                f.outputs = outs;
                return Ok(f);
            }
            // results (none before `=` for a call of a function without outputs)
            let mut results = Vec::new();
            if !matches!(self.peek(), Tok::Punct("=")) {
                loop {
                    let at = self.pos;
                    let label = match self.peek() {
                        Tok::Value(_) => self.value_label()?,
                        _ => return Err(self.error("a result (`%name: type`) or `return`")),
                    };
                    if let Some(line) = def_lines.get(&label) {
                        return Err(self.error_at(at, format!("`%{label}`, already defined on line {line}"), "a new value name"));
                    }
                    if results.iter().any(|(l, _, _): &(String, TensorType, usize)| *l == label) {
                        return Err(self.error_at(at, format!("`%{label}` twice"), "a new value name"));
                    }
                    self.expect(":")?;
                    let ty = self.ty()?;
                    results.push((label, ty, at));
                    if !self.eat(",") {
                        break;
                    }
                }
            }
            self.expect("=")?;
            let op_at = self.pos;
            let kind = match self.peek().clone() {
                Tok::Ident(s) => OpKind::from_name(&s).ok_or_else(|| self.error_at(op_at, format!("`{s}`"), "an op name"))?,
                _ => return Err(self.error("an op name")),
            };
            self.bump();
            self.expect("(")?;
            let mut inputs = Vec::new();
            if !self.eat(")") {
                loop {
                    let at = self.pos;
                    let l = self.value_label()?;
                    inputs.push(*labels.get(&l).ok_or_else(|| self.error_at(at, format!("`%{l}`"), "a value defined before"))?);
                    if self.eat(")") {
                        break;
                    }
                    if !self.eat(",") {
                        return Err(self.error("`,` or `)`"));
                    }
                }
            }
            let mut named: Vec<(String, Attr)> = Vec::new();
            if self.eat("{") && !self.eat("}") {
                loop {
                    let name_at = self.pos;
                    let name = match self.peek().clone() {
                        Tok::Ident(n) => {
                            self.bump();
                            n
                        }
                        _ => return Err(self.error("an attribute name")),
                    };
                    let info = kind.info();
                    if kind.attr_index(&name).is_none() {
                        let known = if info.attrs.is_empty() {
                            "it has none".to_string()
                        } else {
                            info.attrs.iter().map(|a| a.name).collect::<Vec<_>>().join(", ")
                        };
                        return Err(self.error_at(name_at, format!("`{name}`"), format!("an attribute of `{}` ({known})", info.name)));
                    }
                    if named.iter().any(|(n, _)| *n == name) {
                        return Err(self.error_at(name_at, format!("`{name}` again"), "each attribute once"));
                    }
                    self.expect("=")?;
                    let value_at = self.pos;
                    let v = self.attr_value()?;
                    // Check the value's kind now, to point at it. `Op::new` with this one
                    // attribute reports a wrong kind before a missing required attribute.
                    if let Err(AttrError::Kind { expected, .. }) = Op::new(kind, vec![(name.clone(), v.clone())]) {
                        let mut found = String::new();
                        print_attr(&mut found, &v);
                        return Err(self.error_at(
                            value_at,
                            format!("`{found}`"),
                            format!("{expected} for attribute `{name}` of `{}`", info.name),
                        ));
                    }
                    named.push((name, v));
                    if self.eat("}") {
                        break;
                    }
                    if !self.eat(",") {
                        return Err(self.error("`,` or `}`"));
                    }
                }
            }
            // Names and kinds are checked above: only a missing required attribute is left.
            let op = Op::new(kind, named).map_err(|e| match e {
                AttrError::Missing { op, name } => {
                    self.error_at(op_at, "none".into(), format!("a value for attribute `{name}` of `{op}` (it has no default)"))
                }
                other => self.error_at(op_at, format!("`{}`", kind.name()), format!("valid attributes ({other})")),
            })?;
            for (l, _, at) in &results {
                def_lines.insert(l.clone(), self.toks[*at].line);
            }
            let (labels_here, types): (Vec<_>, Vec<_>) = results.into_iter().map(|(l, t, _)| (l, t)).unzip();
            let (_, vals) = f.push_node(op, inputs, types);
            for (l, v) in labels_here.into_iter().zip(vals) {
                if !is_reserved_label(&l) {
                    f.values[v].name = Some(l.clone());
                }
                labels.insert(l, v);
            }
        }
    }
}

/// Parses a `.sir` text into a graph. The result is not verified: call [`crate::verify()`].
///
/// # Errors
/// A [`ParseError`] with the line and column, what was found and what was expected.
pub fn parse(src: &str) -> Result<Graph, ParseError> {
    let toks = lex(src)?;
    let mut p = Parser { toks, pos: 0, depth: 0 };
    let mut g = Graph::new();
    while *p.peek() != Tok::Eof {
        let f = p.function(&g)?;
        g.add_func(f);
    }
    if g.funcs.is_empty() {
        return Err(p.error("a function (`func @name(...) { ... }`)"));
    }
    Ok(g)
}

/// True for names the text format reserves for unnamed values (`v0`, `v17`).
pub fn is_reserved_name(name: &str) -> bool {
    is_reserved_label(name)
}

