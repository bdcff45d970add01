//! `sinter-dsl`: the `graph!` macro, which turns tensor code written like the math into calls
//! of `sinter-ir`'s builder ([`sinter_ir::scope::Scope`]).
//!
//! The macro knows the DSL's vocabulary (method names, their tensor operands and attribute
//! names) and a light static view of shapes, so an unknown op, a wrong arity, an unknown
//! attribute, a dtype clash or a dim mismatch visible at expansion time is a compile error at
//! the offending span. Everything that depends on symbols or config values is checked when the
//! graph is built, with the user's source location. The grammar is documented on [`graph!`];
//! `sinter::dsl_guide` has a tested example of each form, and `tests/ui` the compile errors.

use proc_macro::TokenStream;
use proc_macro2::{Delimiter, Span, TokenStream as TokenStream2, TokenTree};
use quote::{quote, quote_spanned, ToTokens};
use syn::buffer::Cursor;
use syn::parse::discouraged::Speculative;
use syn::parse::{ParseStream, Parser};
use syn::{Ident, Token};

mod vocab;
use vocab::{find_method, suggest, MethodSpec};

/// Builds a graph from functions written in the tensor DSL.
///
/// Use it through the `sinter` crate (`sinter::graph!`): the expansion names `::sinter::ir`.
/// It evaluates to `Result<sinter::Graph, sinter::BuildError>`; `sinter::dsl_guide` has a
/// runnable example of every form below.
///
/// # Grammar
///
/// ```text
/// graph    := function+
/// function := "fn" NAME "(" (NAME ":" type),* ")" "->" (type | "(" type,* ")") block
/// type     := dtype "[" dim,* "]"                      f32[T, 4]    bf16[]
/// dtype    := bf16 | f16 | f32 | i32 | i64 | bool | "{" rust : DType "}"
/// dim      := INT | SYMBOL | "{" rust : IntoDim "}" | dim (+ | - | *) dim | "(" dim ")"
/// block    := "{" statement* expr? "}"              the tail is the function's result(s)
/// statement:= "let" PATTERN "=" expr ";"           let [k, v] = ... for several results
///           | NAME "=" expr ";"
///           | "for" PATTERN "in" rust block              unrolled while building
///           | "if" rust block ("else" (block | if))?     decided while building
///           | expr ";"
/// expr     := expr (@ | * | /) expr | expr (+ | -) expr | expr (== | != | < | <= | > | >=) expr
///           | "-" expr | expr "." OP "(" args ")" | OP "(" expr, args ")"
///           | FN "(" expr,* ")"                     a graph function defined above
///           | weight "(" rust : name, type ")" | input "(" rust : name, type ")"
///           | concat "(" "[" expr,* "]" "," axis ")"
///           | iota "(" dtype, "[" dim,* "]", axis? ")" | constant "(" value, dtype, ("[" dim,* "]")? ")"
///           | "if" rust block "else" block          both branches end with a value
///           | "(" expr,* ")"                        a tuple: a function's or a branch's tail
///           | NAME | NUMBER | "{" rust "}"            a number only beside a tensor
/// args     := tensor operands, then attributes: positional in the op's order, or NAME "=" value
/// ```
///
/// `*`, `/` and `@` bind tighter than `+` and `-`, which bind tighter than comparisons; all
/// are left-associative. A number (a literal, or a Rust number in braces) beside a tensor
/// becomes a scalar constant of the tensor's dtype. An attribute value is a literal, a dtype
/// name, a list of dims `[T, 4]`, or a Rust expression that converts into `sinter::ir::Attr`.
/// Rust code (conditions, iterators, names, `{ .. }`) sees the variables around the macro.
/// The ops, their tensor operands and attributes are `sinter::ir::OP_TABLE`'s.
///
/// # Checks
///
/// At expansion time, as a compile error at the offending token: unknown ops and functions
/// (with a "did you mean"), operand counts, unknown, missing and repeated attributes, unknown
/// dtypes, dtype clashes, dims that differ between literals or symbols (in broadcasting, in
/// `@`'s contracted axis), ranks below 2 for `@`, axes out of range for a known rank, reshapes
/// of a literal element count to another, float-only ops on integers, return types and counts
/// that differ from the declaration, duplicate functions and parameters, calls of functions
/// defined below or of the function itself, and destructuring that does not match the number
/// of results. What depends on a Rust value is checked when the graph is built: a
/// `BuildError` with the user's file:line:column, the op and its operand types.
#[proc_macro]
pub fn graph(input: TokenStream) -> TokenStream {
    match Parser::parse2(parse_graph, input.into()).and_then(expand_graph) {
        Ok(ts) => ts.into(),
        Err(e) => e.to_compile_error().into(),
    }
}

// ------------------------------------------------------------------------------------------
// Syntax

const DTYPES: [(&str, &str); 9] = [
    ("bf16", "BF16"),
    ("f16", "F16"),
    ("f32", "F32"),
    ("i32", "I32"),
    ("i64", "I64"),
    ("bool", "Bool"),
    ("q8_0", "Q8_0"),
    ("q4_1", "Q4_1"),
    ("f8e4m3", "F8E4M3"),
];

/// The ops that accept `f8e4m3` operands (`sinter_ir::infer::accepts_fp8`, which the root
/// crate's tests compare with this list through `__vocab_fp8!`): conversions, data movement and
/// calls. Anything else on an `f8e4m3` operand is refused at expansion when the dtype is known.
const FP8_OPS: [&str; 11] = ["Cast", "DequantizeFp8", "Transpose", "Permute", "Reshape", "Broadcast", "Concat", "Slice", "Gather", "Select", "Call"];

/// Refuses `f8e4m3` operands of an op that does not compute on them (see [`FP8_OPS`]); `word`
/// is how the user wrote the op (`@`, `exp`).
fn refuse_fp8(op: &str, word: &str, span: Span, tys: &[&SType]) -> syn::Result<()> {
    if FP8_OPS.contains(&op) {
        return Ok(());
    }
    match tys.iter().enumerate().find(|(_, t)| t.dtype.as_deref() == Some("f8e4m3")) {
        Some((i, t)) => err(
            span,
            format!("`{word}` does not compute on f8e4m3 (a storage type): operand {i} is {}; read it with `.dequantize_fp8(scale, bf16)` first", t.text()),
        ),
        None => Ok(()),
    }
}

#[derive(Clone)]
enum DimExpr {
    Sym(String, Span),
    Lit(i64),
    Rust(TokenStream2),
    Add(Box<DimExpr>, Box<DimExpr>),
    Sub(Box<DimExpr>, Box<DimExpr>),
    Mul(Box<DimExpr>, Box<DimExpr>),
}

#[derive(Clone)]
enum DTypeSpec {
    Lit(String),
    Rust(TokenStream2),
}

impl DTypeSpec {
    fn known(&self) -> Option<String> {
        match self {
            DTypeSpec::Lit(s) => Some(s.clone()),
            DTypeSpec::Rust(_) => None,
        }
    }
}

#[derive(Clone)]
struct TypeSpec {
    dtype: DTypeSpec,
    dims: Vec<DimExpr>,
    span: Span,
}

struct Param {
    name: Ident,
    ty: TypeSpec,
}

struct FnDef {
    name: Ident,
    params: Vec<Param>,
    ret: Vec<TypeSpec>,
    ret_span: Span,
    body: Block,
}

#[derive(Clone)]
struct Block {
    stmts: Vec<Stmt>,
    tail: Option<Expr>,
    /// The first and last token of `tail`, to underline all of it.
    tail_range: Option<(Span, Span)>,
    close: Span,
}

#[derive(Clone)]
enum Stmt {
    Let { pat: syn::Pat, init: Expr },
    Assign { name: Ident, value: Expr },
    For { pat: syn::Pat, iter: syn::Expr, body: Block },
    If { cond: syn::Expr, then: Block, els: Option<Block> },
    Expr(Expr),
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum BinOp {
    Add,
    Sub,
    Mul,
    Div,
    Matmul,
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

impl BinOp {
    fn op_kind(self) -> &'static str {
        match self {
            BinOp::Add => "Add",
            BinOp::Sub => "Sub",
            BinOp::Mul => "Mul",
            BinOp::Div => "Div",
            BinOp::Matmul => "Matmul",
            BinOp::Eq => "Eq",
            BinOp::Ne => "Ne",
            BinOp::Lt => "Lt",
            BinOp::Le => "Le",
            BinOp::Gt => "Gt",
            BinOp::Ge => "Ge",
        }
    }
    fn prec(self) -> u8 {
        match self {
            BinOp::Eq | BinOp::Ne | BinOp::Lt | BinOp::Le | BinOp::Gt | BinOp::Ge => 1,
            BinOp::Add | BinOp::Sub => 2,
            BinOp::Mul | BinOp::Div | BinOp::Matmul => 3,
        }
    }
    fn is_compare(self) -> bool {
        self.prec() == 1
    }
}

#[derive(Clone)]
enum Arg {
    Pos(TokenStream2, Span),
    Named(Ident, TokenStream2),
}

#[derive(Clone)]
enum Expr {
    Var(Ident),
    Lit(f64, Span),
    Rust(TokenStream2, Span),
    Binary { op: BinOp, span: Span, lhs: Box<Expr>, rhs: Box<Expr> },
    Neg { span: Span, e: Box<Expr> },
    Method { recv: Box<Expr>, name: Ident, args: Vec<Arg>, span: Span },
    Call { name: Ident, args: Vec<Arg>, span: Span },
    Tuple(Vec<Expr>, Span),
    If { cond: syn::Expr, then: Box<Block>, els: Box<Block>, span: Span },
}

impl Expr {
    fn span(&self) -> Span {
        match self {
            Expr::Var(i) => i.span(),
            Expr::Lit(_, s) | Expr::Rust(_, s) | Expr::Tuple(_, s) => *s,
            Expr::Binary { span, .. } | Expr::Neg { span, .. } | Expr::Method { span, .. } | Expr::Call { span, .. } | Expr::If { span, .. } => *span,
        }
    }
}

fn err<T>(span: Span, msg: impl std::fmt::Display) -> syn::Result<T> {
    Err(syn::Error::new(span, msg))
}

fn parse_graph(input: ParseStream) -> syn::Result<Vec<FnDef>> {
    let mut fns = Vec::new();
    while !input.is_empty() {
        fns.push(parse_fn(input)?);
    }
    if fns.is_empty() {
        return err(Span::call_site(), "`graph!` needs at least one `fn name(params) -> type { body }`");
    }
    Ok(fns)
}

fn parse_fn(input: ParseStream) -> syn::Result<FnDef> {
    if !input.peek(Token![fn]) {
        return Err(input.error("expected `fn`: a graph is a list of `fn name(params) -> type { body }`"));
    }
    input.parse::<Token![fn]>()?;
    let name: Ident = input.parse()?;
    let content;
    syn::parenthesized!(content in input);
    let mut params = Vec::new();
    while !content.is_empty() {
        let pname: Ident = content.parse()?;
        if !content.peek(Token![:]) {
            return err(pname.span(), format!("parameter `{pname}` needs a type, e.g. `{pname}: bf16[T, 576]`"));
        }
        content.parse::<Token![:]>()?;
        let ty = parse_type(&content)?;
        params.push(Param { name: pname, ty });
        if content.is_empty() {
            break;
        }
        content.parse::<Token![,]>()?;
    }
    let (ret, ret_span) = if input.peek(Token![->]) {
        let arrow = input.parse::<Token![->]>()?;
        if input.peek(syn::token::Paren) {
            let inner;
            let paren = syn::parenthesized!(inner in input);
            let mut tys = Vec::new();
            while !inner.is_empty() {
                tys.push(parse_type(&inner)?);
                if inner.is_empty() {
                    break;
                }
                inner.parse::<Token![,]>()?;
            }
            (tys, paren.span.join())
        } else {
            let t = parse_type(input)?;
            let s = t.span;
            let _ = arrow;
            (vec![t], s)
        }
    } else {
        return err(name.span(), format!("`fn {name}` needs a return type, e.g. `-> bf16[T, 576]`"));
    };
    let body_content;
    let brace = syn::braced!(body_content in input);
    let body = parse_block(&body_content, brace.span.close())?;
    Ok(FnDef { name, params, ret, ret_span, body })
}

fn parse_type(input: ParseStream) -> syn::Result<TypeSpec> {
    // The dtype is a name (`bf16`) or a Rust expression in braces (`{cfg.dtype}`).
    let (dtype, span) = if input.peek(syn::token::Brace) {
        let g: TokenTree = input.parse()?;
        let TokenTree::Group(g) = g else { return err(g.span(), "expected a dtype") };
        (DTypeSpec::Rust(g.stream()), g.span())
    } else {
        let dt: Ident = input.parse().map_err(|e| syn::Error::new(e.span(), "expected a tensor type such as `bf16[T, 576]`"))?;
        let name = dt.to_string();
        if !DTYPES.iter().any(|(n, _)| *n == name) {
            return err(dt.span(), format!("unknown dtype `{name}`; expected one of bf16, f16, f32, i32, i64, bool, q8_0, q4_1, f8e4m3 (or a Rust expression in braces)"));
        }
        (DTypeSpec::Lit(name), dt.span())
    };
    if !input.peek(syn::token::Bracket) {
        return err(span, "a tensor type needs a shape in brackets, e.g. `bf16[T, 576]` (a scalar is `bf16[]`)");
    }
    let inner;
    let br = syn::bracketed!(inner in input);
    let toks: TokenStream2 = inner.parse()?;
    let dims = split_commas(toks).into_iter().map(|t| parse_dim(t.0, t.1)).collect::<syn::Result<Vec<_>>>()?;
    Ok(TypeSpec { dtype, dims, span: span.join(br.span.close()).unwrap_or(span) })
}

/// Splits a token stream at top-level commas.
fn split_commas(ts: TokenStream2) -> Vec<(TokenStream2, Span)> {
    let mut out = Vec::new();
    let mut cur: Vec<TokenTree> = Vec::new();
    for tt in ts {
        if let TokenTree::Punct(p) = &tt {
            if p.as_char() == ',' {
                let span = cur.first().map(|t| t.span()).unwrap_or_else(|| p.span());
                out.push((cur.drain(..).collect(), span));
                continue;
            }
        }
        cur.push(tt);
    }
    if !cur.is_empty() {
        let span = cur[0].span();
        out.push((cur.into_iter().collect(), span));
    }
    out
}

fn parse_dim(ts: TokenStream2, span: Span) -> syn::Result<DimExpr> {
    let toks: Vec<TokenTree> = ts.into_iter().collect();
    if toks.is_empty() {
        return err(span, "empty dimension");
    }
    dim_sum(&toks, span)
}

fn punct_at(t: &TokenTree, c: char) -> bool {
    matches!(t, TokenTree::Punct(p) if p.as_char() == c)
}

fn dim_sum(toks: &[TokenTree], span: Span) -> syn::Result<DimExpr> {
    // Split at the last top-level binary + or - (left associative).
    for i in (1..toks.len()).rev() {
        if (punct_at(&toks[i], '+') || punct_at(&toks[i], '-')) && !punct_at(&toks[i - 1], '*') {
            let l = dim_sum(&toks[..i], span)?;
            let r = dim_prod(&toks[i + 1..], toks[i].span())?;
            return Ok(if punct_at(&toks[i], '+') { DimExpr::Add(Box::new(l), Box::new(r)) } else { DimExpr::Sub(Box::new(l), Box::new(r)) });
        }
    }
    dim_prod(toks, span)
}

fn dim_prod(toks: &[TokenTree], span: Span) -> syn::Result<DimExpr> {
    for i in (1..toks.len()).rev() {
        if punct_at(&toks[i], '*') {
            let l = dim_prod(&toks[..i], span)?;
            let r = dim_atom(&toks[i + 1..], toks[i].span())?;
            return Ok(DimExpr::Mul(Box::new(l), Box::new(r)));
        }
    }
    dim_atom(toks, span)
}

fn dim_atom(toks: &[TokenTree], span: Span) -> syn::Result<DimExpr> {
    match toks {
        [] => err(span, "expected a dimension after the operator"),
        [TokenTree::Ident(i)] => Ok(DimExpr::Sym(i.to_string(), i.span())),
        [TokenTree::Literal(l)] => {
            let lit = syn::Lit::new(l.clone());
            match lit {
                syn::Lit::Int(i) => Ok(DimExpr::Lit(i.base10_parse::<i64>()?)),
                _ => err(l.span(), "a dimension must be an integer, a symbol or a Rust expression"),
            }
        }
        [TokenTree::Group(g)] if g.delimiter() == Delimiter::Parenthesis => dim_sum(&g.stream().into_iter().collect::<Vec<_>>(), g.span()),
        [TokenTree::Group(g)] if g.delimiter() == Delimiter::Brace => Ok(DimExpr::Rust(g.stream())),
        other => Ok(DimExpr::Rust(other.iter().cloned().collect())),
    }
}

fn parse_block(input: ParseStream, close: Span) -> syn::Result<Block> {
    let mut stmts = Vec::new();
    let mut tail = None;
    let mut tail_range = None;
    while !input.is_empty() {
        let start = input.cursor();
        if input.peek(Token![let]) {
            input.parse::<Token![let]>()?;
            let pat = syn::Pat::parse_single(input)?;
            input.parse::<Token![=]>()?;
            let init = parse_expr(input, 0)?;
            expect_semi(input, start, "`let` binding")?;
            stmts.push(Stmt::Let { pat, init });
        } else if input.peek(Token![for]) {
            input.parse::<Token![for]>()?;
            let pat = syn::Pat::parse_multi(input)?;
            input.parse::<Token![in]>()?;
            let iter = syn::Expr::parse_without_eager_brace(input)?;
            let inner;
            let b = syn::braced!(inner in input);
            let body = parse_block(&inner, b.span.close())?;
            if let Some(t) = &body.tail {
                return err(t.span(), "a `for` body ends with `;`-terminated statements; add `;` or assign the value");
            }
            stmts.push(Stmt::For { pat, iter, body });
        } else if input.peek(Token![if]) {
            // An `if` whose branches both end with a value is an expression (a function's tail,
            // or a value discarded with `;`); otherwise it is a statement.
            let fork = input.fork();
            match parse_expr(&fork, 0) {
                Ok(e) if fork.is_empty() || fork.peek(Token![;]) => {
                    input.advance_to(&fork);
                    if input.is_empty() {
                        tail_range = token_range(start, input.cursor());
                        tail = Some(e);
                    } else {
                        input.parse::<Token![;]>()?;
                        stmts.push(Stmt::Expr(e));
                    }
                }
                _ => stmts.push(parse_if(input)?),
            }
        } else if input.peek(Ident) && input.peek2(Token![=]) && !input.peek2(Token![==]) {
            let name: Ident = input.parse()?;
            input.parse::<Token![=]>()?;
            let value = parse_expr(input, 0)?;
            expect_semi(input, start, "assignment")?;
            stmts.push(Stmt::Assign { name, value });
        } else {
            let e = parse_expr(input, 0)?;
            if input.peek(Token![;]) {
                input.parse::<Token![;]>()?;
                stmts.push(Stmt::Expr(e));
            } else if input.is_empty() {
                tail_range = token_range(start, input.cursor());
                tail = Some(e);
            } else {
                return Err(input.error("expected an operator, `;` or the end of the block"));
            }
        }
    }
    Ok(Block { stmts, tail, tail_range, close })
}

/// The spans of the first and the last token tree from `start` up to `end` (a later cursor of
/// the same buffer).
fn token_range(start: Cursor, end: Cursor) -> Option<(Span, Span)> {
    let (mut first, mut last) = (None, None);
    let mut c = start;
    while c != end {
        let Some((tt, next)) = c.token_tree() else { break };
        first.get_or_insert(tt.span());
        last = Some(match &tt {
            TokenTree::Group(g) => g.span_close(),
            t => t.span(),
        });
        c = next;
    }
    Some((first?, last?))
}

/// Expects the `;` that ends a statement; when it is missing, the error points just after the
/// statement (its last token), as rustc's does.
fn expect_semi(input: ParseStream, start: Cursor, what: &str) -> syn::Result<()> {
    if input.peek(Token![;]) {
        input.parse::<Token![;]>()?;
        return Ok(());
    }
    let at = token_range(start, input.cursor()).map(|(_, last)| last).unwrap_or_else(|| input.span());
    err(at, format!("expected `;` after this {what}"))
}

/// An error underlining `start` to `end` (syn draws the range from a first and a last token).
fn err_range<T>(range: (Span, Span), msg: impl std::fmt::Display) -> syn::Result<T> {
    let toks: TokenStream2 = [TokenTree::Ident(Ident::new("a", range.0)), TokenTree::Ident(Ident::new("b", range.1))].into_iter().collect();
    Err(syn::Error::new_spanned(toks, msg))
}

fn parse_if(input: ParseStream) -> syn::Result<Stmt> {
    input.parse::<Token![if]>()?;
    let cond = syn::Expr::parse_without_eager_brace(input)?;
    let inner;
    let b = syn::braced!(inner in input);
    let then = parse_block(&inner, b.span.close())?;
    let els = if input.peek(Token![else]) {
        input.parse::<Token![else]>()?;
        if input.peek(Token![if]) {
            let nested = parse_if(input)?;
            Some(Block { stmts: vec![nested], tail: None, tail_range: None, close: Span::call_site() })
        } else {
            let inner;
            let b = syn::braced!(inner in input);
            Some(parse_block(&inner, b.span.close())?)
        }
    } else {
        None
    };
    for blk in std::iter::once(&then).chain(els.as_ref()) {
        if let Some(t) = &blk.tail {
            return err(t.span(), "the branches of an `if` statement end with `;`; to use the value, write `let name = if .. { .. } else { .. };`");
        }
    }
    Ok(Stmt::If { cond, then, els })
}

fn peek_binop(input: ParseStream) -> Option<(BinOp, usize)> {
    // Two-character operators first.
    if input.peek(Token![==]) {
        Some((BinOp::Eq, 2))
    } else if input.peek(Token![!=]) {
        Some((BinOp::Ne, 2))
    } else if input.peek(Token![<=]) {
        Some((BinOp::Le, 2))
    } else if input.peek(Token![>=]) {
        Some((BinOp::Ge, 2))
    } else if input.peek(Token![<]) {
        Some((BinOp::Lt, 1))
    } else if input.peek(Token![>]) {
        Some((BinOp::Gt, 1))
    } else if input.peek(Token![+]) {
        Some((BinOp::Add, 1))
    } else if input.peek(Token![-]) {
        Some((BinOp::Sub, 1))
    } else if input.peek(Token![*]) {
        Some((BinOp::Mul, 1))
    } else if input.peek(Token![/]) {
        Some((BinOp::Div, 1))
    } else if input.peek(Token![@]) {
        Some((BinOp::Matmul, 1))
    } else {
        None
    }
}

fn parse_expr(input: ParseStream, min_prec: u8) -> syn::Result<Expr> {
    let mut lhs = parse_unary(input)?;
    loop {
        if input.peek(Token![%]) || input.peek(Token![&]) || input.peek(Token![|]) || input.peek(Token![^]) {
            let t: TokenTree = input.parse()?;
            return err(t.span(), format!("operator `{t}` is not a tensor op; the DSL has + - * / @ and comparisons, and methods such as .maximum(b)"));
        }
        let Some((op, _)) = peek_binop(input) else { break };
        if op.prec() <= min_prec {
            break;
        }
        let span = input.span();
        match op {
            BinOp::Eq => drop(input.parse::<Token![==]>()?),
            BinOp::Ne => drop(input.parse::<Token![!=]>()?),
            BinOp::Le => drop(input.parse::<Token![<=]>()?),
            BinOp::Ge => drop(input.parse::<Token![>=]>()?),
            _ => drop(input.parse::<TokenTree>()?),
        }
        if input.is_empty() || input.peek(Token![;]) || input.peek(Token![,]) {
            return err(span, format!("`{}` needs a right-hand operand", tokens_of_op(op)));
        }
        let rhs = parse_expr(input, op.prec())?;
        lhs = Expr::Binary { op, span, lhs: Box::new(lhs), rhs: Box::new(rhs) };
    }
    Ok(lhs)
}

fn tokens_of_op(op: BinOp) -> &'static str {
    match op {
        BinOp::Add => "+",
        BinOp::Sub => "-",
        BinOp::Mul => "*",
        BinOp::Div => "/",
        BinOp::Matmul => "@",
        BinOp::Eq => "==",
        BinOp::Ne => "!=",
        BinOp::Lt => "<",
        BinOp::Le => "<=",
        BinOp::Gt => ">",
        BinOp::Ge => ">=",
    }
}

fn parse_unary(input: ParseStream) -> syn::Result<Expr> {
    if input.peek(Token![-]) {
        let m = input.parse::<Token![-]>()?;
        let e = parse_unary(input)?;
        return Ok(match e {
            Expr::Lit(v, s) => Expr::Lit(-v, s),
            e => Expr::Neg { span: m.span, e: Box::new(e) },
        });
    }
    let mut e = parse_atom(input)?;
    while input.peek(Token![.]) {
        input.parse::<Token![.]>()?;
        if !input.peek(Ident) {
            return Err(input.error("expected a method name after `.` (e.g. `.silu()`)"));
        }
        let name: Ident = input.parse()?;
        if !input.peek(syn::token::Paren) {
            return err(name.span(), format!("`.{name}` needs parentheses: `.{name}(...)`"));
        }
        let inner;
        syn::parenthesized!(inner in input);
        let args = parse_args(&inner)?;
        let span = name.span();
        e = Expr::Method { recv: Box::new(e), name, args, span };
    }
    Ok(e)
}

fn parse_args(input: ParseStream) -> syn::Result<Vec<Arg>> {
    let toks: TokenStream2 = input.parse()?;
    let mut out = Vec::new();
    for (t, span) in split_commas(toks) {
        let v: Vec<TokenTree> = t.clone().into_iter().collect();
        match v.as_slice() {
            [TokenTree::Ident(name), TokenTree::Punct(eq), rest @ ..] if eq.as_char() == '=' && !rest.first().is_some_and(|r| punct_at(r, '=')) => {
                out.push(Arg::Named(name.clone(), rest.iter().cloned().collect()));
            }
            _ => out.push(Arg::Pos(t, span)),
        }
    }
    Ok(out)
}

fn parse_atom(input: ParseStream) -> syn::Result<Expr> {
    if input.peek(Token![if]) {
        let kw = input.parse::<Token![if]>()?;
        let cond = syn::Expr::parse_without_eager_brace(input)?;
        let inner;
        let b = syn::braced!(inner in input);
        let then = parse_block(&inner, b.span.close())?;
        if !input.peek(Token![else]) {
            return err(kw.span, "an `if` that gives a tensor needs an `else` branch");
        }
        input.parse::<Token![else]>()?;
        let inner;
        let b = syn::braced!(inner in input);
        let els = parse_block(&inner, b.span.close())?;
        for blk in [&then, &els] {
            if blk.tail.is_none() {
                return err(blk.close, "each branch of an `if` expression ends with the tensor(s) it gives");
            }
        }
        return Ok(Expr::If { cond, then: Box::new(then), els: Box::new(els), span: kw.span });
    }
    if input.peek(syn::token::Paren) {
        let inner;
        let p = syn::parenthesized!(inner in input);
        let mut items = Vec::new();
        let mut trailing = false;
        while !inner.is_empty() {
            items.push(parse_expr(&inner, 0)?);
            trailing = false;
            if inner.is_empty() {
                break;
            }
            inner.parse::<Token![,]>()?;
            trailing = true;
        }
        return match (items.len(), trailing) {
            (0, _) => err(p.span.join(), "empty parentheses are not a tensor"),
            (1, false) => Ok(items.pop().expect("one item")),
            _ => Ok(Expr::Tuple(items, p.span.join())),
        };
    }
    if input.peek(syn::token::Brace) {
        let g: TokenTree = input.parse()?;
        if let TokenTree::Group(g) = g {
            return Ok(Expr::Rust(g.stream(), g.span()));
        }
    }
    if input.peek(syn::Lit) {
        let lit: syn::Lit = input.parse()?;
        let v = match &lit {
            syn::Lit::Int(i) => i.base10_parse::<f64>()?,
            syn::Lit::Float(f) => f.base10_parse::<f64>()?,
            _ => return err(lit.span(), "only numeric literals can appear in tensor expressions"),
        };
        return Ok(Expr::Lit(v, lit.span()));
    }
    if input.peek(Ident) {
        let name: Ident = input.parse()?;
        if input.peek(syn::token::Paren) {
            let inner;
            syn::parenthesized!(inner in input);
            let args = parse_args(&inner)?;
            let span = name.span();
            return Ok(Expr::Call { name, args, span });
        }
        return Ok(Expr::Var(name));
    }
    Err(input.error("expected a tensor expression: a name, a literal, `(...)`, a call or `{ rust }`"))
}

// ------------------------------------------------------------------------------------------
// Static view of types (what is known at expansion time)

#[derive(Clone, PartialEq, Debug)]
enum SDim {
    Sym(String),
    Lit(i64),
    Unknown,
}

impl SDim {
    fn known(&self) -> bool {
        !matches!(self, SDim::Unknown)
    }
    fn is_one(&self) -> bool {
        *self == SDim::Lit(1)
    }
    fn text(&self) -> String {
        match self {
            SDim::Sym(s) => s.clone(),
            SDim::Lit(n) => n.to_string(),
            SDim::Unknown => "?".into(),
        }
    }
}

#[derive(Clone, Debug, Default)]
struct SType {
    dtype: Option<String>,
    dims: Option<Vec<SDim>>,
}

impl SType {
    fn of(t: &TypeSpec) -> SType {
        SType { dtype: t.dtype.known(), dims: Some(t.dims.iter().map(sdim_of).collect()) }
    }
    fn text(&self) -> String {
        format!(
            "{}[{}]",
            self.dtype.clone().unwrap_or_else(|| "?".into()),
            self.dims.as_ref().map(|d| d.iter().map(SDim::text).collect::<Vec<_>>().join(", ")).unwrap_or_else(|| "…".into())
        )
    }
}

fn sdim_of(d: &DimExpr) -> SDim {
    match d {
        DimExpr::Sym(s, _) => SDim::Sym(s.clone()),
        DimExpr::Lit(n) => SDim::Lit(*n),
        _ => SDim::Unknown,
    }
}

fn literal_int(ts: &TokenStream2) -> Option<i64> {
    let v: Vec<TokenTree> = ts.clone().into_iter().collect();
    match v.as_slice() {
        [TokenTree::Literal(l)] => l.to_string().parse().ok(),
        [TokenTree::Punct(m), TokenTree::Literal(l)] if m.as_char() == '-' => l.to_string().parse::<i64>().ok().map(|x| -x),
        _ => None,
    }
}

fn norm_axis(axis: i64, rank: usize) -> Option<usize> {
    let a = if axis < 0 { axis + rank as i64 } else { axis };
    (0..rank as i64).contains(&a).then_some(a as usize)
}

// ------------------------------------------------------------------------------------------
// Expansion

struct FnSig {
    name: String,
    n_params: usize,
    params: Vec<String>,
    ret: Vec<TypeSpec>,
}

struct Cx<'a> {
    /// Functions defined above the current one (callable).
    fns: &'a [FnSig],
    /// The current function and those defined below it (not callable from here).
    not_yet: &'a [String],
    /// Static types of the tensor variables in scope (innermost last).
    vars: Vec<(String, SType)>,
    /// Every variable assigned with `name = ...` so far (to forget types after a loop or branch).
    assigned: Vec<String>,
    tmp: usize,
}

/// `__sinter_at(Location::caller())`, the location spelled with `span`: every builder call of the
/// expansion passes its error through it, so a `BuildError` names the user's operator or
/// method (file:line:column) whatever location the builder took.
fn relocate(span: Span) -> TokenStream2 {
    let loc = quote_spanned!(span=> ::core::panic::Location::caller());
    quote!(__sinter_at(#loc))
}

fn ir() -> TokenStream2 {
    quote!(::sinter::ir)
}

fn scope_ident() -> Ident {
    Ident::new("__sinter_scope", Span::call_site())
}

impl Cx<'_> {
    fn var_type(&self, name: &str) -> SType {
        self.vars.iter().rev().find(|(n, _)| n == name).map(|(_, t)| t.clone()).unwrap_or_default()
    }

    /// Binds the names of `pat`: a plain name gets `t`, the names of a destructuring pattern
    /// (`let [a, b] = ...`, a `for` pattern) an unknown type, so no stale type survives shadowing.
    fn bind(&mut self, pat: &syn::Pat, t: SType) {
        match pat {
            syn::Pat::Ident(pi) if pi.subpat.is_none() => self.vars.push((pi.ident.to_string(), t)),
            _ => {
                let mut names = Vec::new();
                pat_idents(pat, &mut names);
                self.vars.extend(names.into_iter().map(|n| (n, SType::default())));
            }
        }
    }

    /// After a loop or a branch: the variables it assigned have types not known statically.
    fn forget_assigned(&mut self, from: usize) {
        let names: Vec<String> = self.assigned[from..].to_vec();
        for n in names {
            if self.vars.iter().any(|(v, _)| *v == n) {
                self.vars.push((n, SType::default()));
            }
        }
    }

    fn fresh(&mut self) -> Ident {
        self.tmp += 1;
        Ident::new(&format!("__sinter_t{}", self.tmp), Span::call_site())
    }
}

/// The names a pattern binds.
fn pat_idents(pat: &syn::Pat, out: &mut Vec<String>) {
    match pat {
        syn::Pat::Ident(pi) => {
            out.push(pi.ident.to_string());
            if let Some((_, sub)) = &pi.subpat {
                pat_idents(sub, out);
            }
        }
        syn::Pat::Slice(p) => p.elems.iter().for_each(|e| pat_idents(e, out)),
        syn::Pat::Tuple(p) => p.elems.iter().for_each(|e| pat_idents(e, out)),
        syn::Pat::TupleStruct(p) => p.elems.iter().for_each(|e| pat_idents(e, out)),
        syn::Pat::Struct(p) => p.fields.iter().for_each(|f| pat_idents(&f.pat, out)),
        syn::Pat::Reference(p) => pat_idents(&p.pat, out),
        syn::Pat::Type(p) => pat_idents(&p.pat, out),
        syn::Pat::Paren(p) => pat_idents(&p.pat, out),
        syn::Pat::Or(p) => p.cases.iter().for_each(|c| pat_idents(c, out)),
        _ => {}
    }
}

fn dim_tokens(d: &DimExpr) -> TokenStream2 {
    let ir = ir();
    match d {
        DimExpr::Sym(s, span) => quote_spanned!(*span=> #ir::Dim::symbol(#s)),
        DimExpr::Lit(n) => quote!(#ir::Dim::constant(#n)),
        DimExpr::Rust(ts) => quote!(#ir::scope::IntoDim::into_dim(#ts)),
        DimExpr::Add(a, b) => {
            let (a, b) = (dim_tokens(a), dim_tokens(b));
            quote!((#a).add(&#b))
        }
        DimExpr::Sub(a, b) => {
            let (a, b) = (dim_tokens(a), dim_tokens(b));
            quote!((#a).sub(&#b))
        }
        DimExpr::Mul(a, b) => {
            let (a, b) = (dim_tokens(a), dim_tokens(b));
            quote!((#a).mul(&#b))
        }
    }
}

fn type_tokens(t: &TypeSpec) -> TokenStream2 {
    let ir = ir();
    let dt = match &t.dtype {
        DTypeSpec::Lit(name) => {
            let v = Ident::new(DTYPES.iter().find(|(n, _)| n == name).map(|(_, v)| *v).unwrap_or("F32"), t.span);
            quote!(#ir::DType::#v)
        }
        DTypeSpec::Rust(ts) => quote!({ #ts }),
    };
    let dims: Vec<TokenStream2> = t.dims.iter().map(dim_tokens).collect();
    quote!(#ir::TensorType::new(#dt, ::std::vec![#(#dims),*]))
}

fn attr_tokens(ts: &TokenStream2) -> syn::Result<TokenStream2> {
    let ir = ir();
    let v: Vec<TokenTree> = ts.clone().into_iter().collect();
    if let [TokenTree::Ident(i)] = v.as_slice() {
        if let Some((_, variant)) = DTYPES.iter().find(|(n, _)| i == n) {
            let var = Ident::new(variant, i.span());
            return Ok(quote!(#ir::Attr::DType(#ir::DType::#var)));
        }
        // A Rust primitive type is never a value: it is a dtype the DSL does not have.
        const PRIMITIVES: [&str; 13] = ["f64", "f8", "i8", "i16", "i128", "isize", "u8", "u16", "u32", "u64", "u128", "usize", "char"];
        if PRIMITIVES.iter().any(|p| i == p) {
            return err(i.span(), format!("unknown dtype `{i}`; expected one of bf16, f16, f32, i32, i64, bool, q8_0, q4_1, f8e4m3 (or a Rust expression in braces)"));
        }
    }
    if let [TokenTree::Group(g)] = v.as_slice() {
        if g.delimiter() == Delimiter::Bracket {
            let dims = split_commas(g.stream()).into_iter().map(|(t, s)| parse_dim(t, s).map(|d| dim_tokens(&d))).collect::<syn::Result<Vec<_>>>()?;
            return Ok(quote!(#ir::Attr::Dims(::std::vec![#(#dims),*])));
        }
    }
    if v.is_empty() {
        return err(Span::call_site(), "empty attribute value");
    }
    Ok(quote!(#ir::Attr::from(#ts)))
}

/// A compiled expression: tokens that evaluate to a `Value` (or `[Value; n]`), and its static type.
struct Compiled {
    code: TokenStream2,
    ty: SType,
    multi: Option<usize>,
}

fn compile_expr(cx: &mut Cx, e: &Expr) -> syn::Result<Compiled> {
    let ir = ir();
    let s = scope_ident();
    match e {
        Expr::Var(i) => Ok(Compiled { code: i.to_token_stream(), ty: cx.var_type(&i.to_string()), multi: None }),
        Expr::Rust(ts, span) => Ok(Compiled { code: quote_spanned!(*span=> { #ts }), ty: SType::default(), multi: None }),
        Expr::Lit(_, span) => err(*span, "a literal needs a tensor beside it to take its dtype from (e.g. `x * 0.5`); write constants with `constant(value, dtype, [dims])`"),
        Expr::Tuple(_, span) => err(*span, "a tuple can only end a function or an `if` branch"),
        Expr::If { cond, then, els, .. } => {
            let assigned = cx.assigned.len();
            let t = compile_branch(cx, then)?;
            let e = compile_branch(cx, els)?;
            cx.forget_assigned(assigned);
            Ok(Compiled { code: quote!(if #cond { #t } else { #e }), ty: SType::default(), multi: None })
        }
        Expr::Neg { span, e } => {
            let c = compile_single(cx, e)?;
            refuse_fp8("Neg", "-", *span, &[&c.ty])?;
            let code = c.code;
            let t = cx.fresh();
            let __at = relocate(*span);
            Ok(Compiled {
                code: quote_spanned!(*span=> { let #t = #code; #s.op1(#ir::OpKind::Neg, &[#t], ::std::vec::Vec::new()).map_err(#__at)? }),
                ty: c.ty,
                multi: None,
            })
        }
        Expr::Binary { op, span, lhs, rhs } => compile_binary(cx, *op, *span, lhs, rhs),
        Expr::Method { recv, name, args, span } => {
            let mut all = vec![Arg::Pos(TokenStream2::new(), recv.span())];
            all.extend(args.iter().cloned());
            compile_op(cx, name, *span, Some(recv), &all[1..])
        }
        Expr::Call { name, args, span } => compile_call(cx, name, *span, args),
    }
}

/// A branch of an `if` expression: its statements, then its tail (a tensor or a tuple).
fn compile_branch(cx: &mut Cx, b: &Block) -> syn::Result<TokenStream2> {
    let depth = cx.vars.len();
    let mut out = TokenStream2::new();
    for st in &b.stmts {
        out.extend(compile_stmt(cx, st)?);
    }
    let tail = match &b.tail {
        Some(Expr::Tuple(items, _)) => {
            let codes = items.iter().map(|i| compile_single(cx, i).map(|c| c.code)).collect::<syn::Result<Vec<_>>>()?;
            let temps: Vec<Ident> = codes.iter().map(|_| cx.fresh()).collect();
            quote!({ #(let #temps = #codes;)* (#(#temps),*) })
        }
        Some(e) => compile_expr(cx, e)?.code,
        None => return err(b.close, "this branch must end with the tensor(s) it gives"),
    };
    cx.vars.truncate(depth);
    Ok(quote!(#out #tail))
}

fn compile_single(cx: &mut Cx, e: &Expr) -> syn::Result<Compiled> {
    let c = compile_expr(cx, e)?;
    if let Some(n) = c.multi {
        return err(e.span(), format!("this gives {n} tensors; bind them with `let [a, b] = ...` first"));
    }
    Ok(c)
}

fn check_broadcast(span: Span, a: &SType, b: &SType, what: &str) -> syn::Result<SType> {
    if let (Some(x), Some(y)) = (&a.dtype, &b.dtype) {
        if x != y {
            return err(span, format!("dtype mismatch in `{what}`: {} vs {} (insert a `.cast(...)`)", a.text(), b.text()));
        }
    }
    let dims = match (&a.dims, &b.dims) {
        (Some(da), Some(db)) => {
            let n = da.len().max(db.len());
            let mut out = Vec::new();
            for i in 0..n {
                let x = (i + da.len()).checked_sub(n).map(|j| da[j].clone());
                let y = (i + db.len()).checked_sub(n).map(|j| db[j].clone());
                out.push(match (x, y) {
                    (Some(x), None) | (None, Some(x)) => x,
                    (Some(x), Some(y)) if x == y => x,
                    (Some(x), Some(y)) if x.is_one() => y,
                    (Some(x), Some(y)) if y.is_one() => x,
                    (Some(x), Some(y)) if x.known() && y.known() => {
                        return err(span, format!("shapes do not broadcast in `{what}`: {} vs {} ({} vs {})", a.text(), b.text(), x.text(), y.text()));
                    }
                    _ => SDim::Unknown,
                });
            }
            Some(out)
        }
        _ => None,
    };
    Ok(SType { dtype: a.dtype.clone().or_else(|| b.dtype.clone()), dims })
}

fn compile_binary(cx: &mut Cx, op: BinOp, span: Span, lhs: &Expr, rhs: &Expr) -> syn::Result<Compiled> {
    let ir = ir();
    let s = scope_ident();
    let kind = Ident::new(op.op_kind(), span);
    let (lt, rt) = (cx.fresh(), cx.fresh());
    // A literal beside a tensor becomes a scalar constant of the tensor's dtype.
    // A literal or a `{ rust }` value beside a tensor becomes a scalar constant of the tensor's
    // dtype (`Operand::into_operand`); the tensor side is evaluated first.
    let deferred = |e: &Expr| matches!(e, Expr::Lit(..) | Expr::Rust(..));
    if op == BinOp::Matmul {
        if let Some(Expr::Lit(_, ls)) = [lhs, rhs].into_iter().find(|e| matches!(e, Expr::Lit(..))) {
            return err(*ls, "`@` needs two tensors");
        }
    }
    let side = |cx: &mut Cx, e: &Expr, like: Option<&Ident>| -> syn::Result<(TokenStream2, SType)> {
        let like = match like {
            Some(l) => quote!(::core::option::Option::Some(#l)),
            None => quote!(::core::option::Option::None),
        };
        match e {
            Expr::Lit(v, ls) => match like.to_string().contains("Some") {
                true => Ok(({
                    let __at = relocate(*ls);
                    quote_spanned!(*ls=> #ir::scope::Operand::into_operand(#v, &mut #s, #like).map_err(#__at)?)
                }, SType::default())),
                false => err(span, format!("both operands of `{}` are literals: compute the number in Rust, e.g. `{{ 2.0 + 3.0 }}`", tokens_of_op(op))),
            },
            Expr::Rust(ts, rs) => {
                let __at = relocate(*rs);
                Ok((quote_spanned!(*rs=> #ir::scope::Operand::into_operand({ #ts }, &mut #s, #like).map_err(#__at)?), SType::default()))
            }
            other => {
                let c = compile_single(cx, other)?;
                Ok((c.code, c.ty))
            }
        }
    };
    let lhs_first = !deferred(lhs) || deferred(rhs);
    let ((lcode, mut lty), (rcode, mut rty)) = if lhs_first {
        let l = side(cx, lhs, None)?;
        let r = side(cx, rhs, Some(&lt))?;
        (l, r)
    } else {
        let r = side(cx, rhs, None)?;
        let l = side(cx, lhs, Some(&rt))?;
        (l, r)
    };
    if deferred(lhs) {
        lty = SType { dtype: rty.dtype.clone(), dims: Some(vec![]) };
    }
    if deferred(rhs) {
        rty = SType { dtype: lty.dtype.clone(), dims: Some(vec![]) };
    }
    refuse_fp8(op.op_kind(), tokens_of_op(op), span, &[&lty, &rty])?;
    let ty = if op == BinOp::Matmul { matmul_type(span, &lty, &rty, false, false)? } else {
        let mut t = check_broadcast(span, &lty, &rty, tokens_of_op(op))?;
        if op.is_compare() {
            t.dtype = Some("bool".into());
        }
        t
    };
    let __at = relocate(span);
    let code = if !lhs_first {
        quote_spanned!(span=> { let #rt = #rcode; let #lt = #lcode; #s.op1(#ir::OpKind::#kind, &[#lt, #rt], ::std::vec::Vec::new()).map_err(#__at)? })
    } else {
        quote_spanned!(span=> { let #lt = #lcode; let #rt = #rcode; #s.op1(#ir::OpKind::#kind, &[#lt, #rt], ::std::vec::Vec::new()).map_err(#__at)? })
    };
    Ok(Compiled { code, ty, multi: None })
}

fn matmul_type(span: Span, a: &SType, b: &SType, ta: bool, tb: bool) -> syn::Result<SType> {
    if let (Some(x), Some(y)) = (&a.dtype, &b.dtype) {
        if x != y {
            return err(span, format!("dtype mismatch in `@`: {} vs {}", a.text(), b.text()));
        }
    }
    let dims = match (&a.dims, &b.dims) {
        (Some(da), Some(db)) => {
            if da.len() < 2 || db.len() < 2 {
                return err(span, format!("`@` needs operands of rank ≥ 2, got {} and {}", a.text(), b.text()));
            }
            let (mut m, mut ka) = (da[da.len() - 2].clone(), da[da.len() - 1].clone());
            if ta {
                std::mem::swap(&mut m, &mut ka);
            }
            let (mut kb, mut n) = (db[db.len() - 2].clone(), db[db.len() - 1].clone());
            if tb {
                std::mem::swap(&mut kb, &mut n);
            }
            if ka.known() && kb.known() && ka != kb {
                return err(span, format!("matmul inner dimensions differ: {} @ {} contracts {} with {}", a.text(), b.text(), ka.text(), kb.text()));
            }
            let batch = check_broadcast(
                span,
                &SType { dtype: None, dims: Some(da[..da.len() - 2].to_vec()) },
                &SType { dtype: None, dims: Some(db[..db.len() - 2].to_vec()) },
                "@ (batch axes)",
            )?;
            batch.dims.map(|mut d| {
                d.push(m);
                d.push(n);
                d
            })
        }
        _ => None,
    };
    Ok(SType { dtype: a.dtype.clone().or_else(|| b.dtype.clone()), dims })
}

fn compile_call(cx: &mut Cx, name: &Ident, span: Span, args: &[Arg]) -> syn::Result<Compiled> {
    let __at = relocate(span);
    let ir = ir();
    let s = scope_ident();
    let n = name.to_string();
    if n == "weight" || n == "input" {
        let [Arg::Pos(wname, _), Arg::Pos(ty, _)] = args else {
            return err(span, format!("`{n}` takes a name and a type: `{n}(\"blk.0.wq\", bf16[576, 576])`"));
        };
        let ty = Parser::parse2(parse_type, ty.clone())?;
        let tt = type_tokens(&ty);
        return Ok(Compiled { code: quote_spanned!(span=> #s.param(#wname, #tt).map_err(#__at)?), ty: SType::of(&ty), multi: None });
    }
    if n == "concat" {
        let (list, rest) = match args {
            [Arg::Pos(l, _), rest @ ..] => (l, rest),
            _ => return err(span, "`concat` takes a list of tensors and an axis: `concat([a, b], -1)`"),
        };
        let items: Vec<TokenTree> = list.clone().into_iter().collect();
        let [TokenTree::Group(g)] = items.as_slice() else {
            return err(span, "`concat` takes a list of tensors in brackets: `concat([a, b], -1)`");
        };
        let mut codes = Vec::new();
        let mut temps = Vec::new();
        for (t, _) in split_commas(g.stream()) {
            let e = Parser::parse2(|p: ParseStream| parse_expr(p, 0), t)?;
            codes.push(compile_single(cx, &e)?.code);
            temps.push(cx.fresh());
        }
        let mut attrs = Vec::new();
        for a in rest {
            match a {
                Arg::Pos(t, _) => {
                    let at = attr_tokens(t)?;
                    attrs.push(quote!(("axis", #at)));
                }
                Arg::Named(k, t) if k == "axis" => {
                    let at = attr_tokens(t)?;
                    attrs.push(quote!(("axis", #at)));
                }
                Arg::Named(k, _) => return err(k.span(), format!("`concat` has no attribute `{k}`; it has: axis")),
            }
        }
        if attrs.len() > 1 {
            return err(span, "`concat` takes one axis");
        }
        return Ok(Compiled {
            code: quote_spanned!(span=> { #(let #temps = #codes;)* #s.op1(#ir::OpKind::Concat, &[#(#temps),*], ::std::vec![#(#attrs),*]).map_err(#__at)? }),
            ty: SType::default(),
            multi: None,
        });
    }
    if let Some(pos) = cx.fns.iter().position(|f| f.name == n) {
        let f = &cx.fns[pos];
        let ret = f.ret.clone();
        if args.len() != f.n_params {
            let s = if f.n_params == 1 { "" } else { "s" };
            return err(span, format!("`{n}` takes {} argument{s} ({}), got {}", f.n_params, f.params.join(", "), args.len()));
        }
        let mut codes = Vec::new();
        let mut temps = Vec::new();
        for a in args {
            match a {
                Arg::Pos(t, _) => {
                    let e = Parser::parse2(|p: ParseStream| parse_expr(p, 0), t.clone())?;
                    codes.push(compile_single(cx, &e)?.code);
                    temps.push(cx.fresh());
                }
                Arg::Named(k, _) => return err(k.span(), "arguments of a graph function are positional"),
            }
        }
        let nret = ret.len();
        let code = if nret == 1 {
            quote_spanned!(span=> { #(let #temps = #codes;)* let [__r] = #s.call::<1>(#n, &[#(#temps),*]).map_err(#__at)?; __r })
        } else {
            quote_spanned!(span=> { #(let #temps = #codes;)* #s.call::<#nret>(#n, &[#(#temps),*]).map_err(#__at)? })
        };
        let ty = if nret == 1 { SType { dtype: ret[0].dtype.known(), dims: None } } else { SType::default() };
        return Ok(Compiled { code, ty, multi: (nret != 1).then_some(nret) });
    }
    if find_method(&n).is_some() {
        // Free-function form of a method: the first argument is the receiver.
        let Some(Arg::Pos(first, fspan)) = args.first() else {
            return err(span, format!("`{n}(...)` needs its tensor operand first"));
        };
        let recv = Parser::parse2(|p: ParseStream| parse_expr(p, 0), first.clone()).map_err(|e| syn::Error::new(*fspan, e.to_string()))?;
        return compile_op(cx, name, span, Some(&recv), &args[1..]);
    }
    if let Some(spec) = vocab::find_source(&n) {
        return compile_source(cx, spec, name, span, args);
    }
    if let Some((current, below)) = cx.not_yet.split_first() {
        if *current == n {
            return err(span, format!("`{n}` calls itself; graph functions cannot be recursive (unroll with a Rust `for` loop)"));
        }
        if below.contains(&n) {
            return err(span, format!("`{n}` is defined below `{current}`; a graph function can only call the functions defined above it"));
        }
    }
    let hint = suggest(&n).map(|s| format!("; did you mean `{s}`?")).unwrap_or_default();
    err(span, format!("unknown function or op `{n}`{hint}"))
}

fn compile_source(_cx: &mut Cx, spec: &MethodSpec, name: &Ident, span: Span, args: &[Arg]) -> syn::Result<Compiled> {
    let ir = ir();
    let s = scope_ident();
    let attrs = collect_attrs(spec, name, args, 0)?;
    let kind = Ident::new(spec.op, span);
    let __at = relocate(span);
    Ok(Compiled { code: quote_spanned!(span=> #s.op1(#ir::OpKind::#kind, &[], ::std::vec![#(#attrs),*]).map_err(#__at)?), ty: SType::default(), multi: None })
}

fn collect_attrs(spec: &MethodSpec, name: &Ident, args: &[Arg], first_attr_pos: usize) -> syn::Result<Vec<TokenStream2>> {
    let mut out = Vec::new();
    let mut given: Vec<String> = Vec::new();
    let mut pos_i = 0usize;
    for (i, a) in args.iter().enumerate() {
        let (key, toks, span) = match a {
            Arg::Pos(t, sp) => {
                if i < first_attr_pos {
                    continue;
                }
                let k = spec.attrs.get(pos_i).copied().ok_or_else(|| {
                    syn::Error::new(
                        *sp,
                        format!(
                            "`{name}` takes {} ({}), got {}",
                            arity_text(spec),
                            operand_list(spec),
                            args.len() + usize::from(spec.receiver)
                        ),
                    )
                })?;
                pos_i += 1;
                (k.to_string(), t, *sp)
            }
            Arg::Named(k, t) => {
                let ks = k.to_string();
                if !spec.attrs.contains(&ks.as_str()) {
                    let known = if spec.attrs.is_empty() { "none".to_string() } else { spec.attrs.join(", ") };
                    return err(k.span(), format!("`{name}` has no attribute `{ks}`; it has: {known}"));
                }
                (ks, t, k.span())
            }
        };
        if given.contains(&key) {
            return err(span, format!("attribute `{key}` of `{name}` is given twice"));
        }
        given.push(key.clone());
        let at = attr_tokens(toks).map_err(|e| syn::Error::new(span, e.to_string()))?;
        out.push(quote!((#key, #at)));
    }
    for req in spec.required {
        if !given.iter().any(|g| g == req) {
            return err(name.span(), format!("`{name}` needs attribute `{req}` ({})", operand_list(spec)));
        }
    }
    Ok(out)
}

fn arity_text(spec: &MethodSpec) -> String {
    let (lo, hi) = (spec.tensors.0, spec.tensors.1 + spec.attrs.len());
    let lo = lo + spec.required.len();
    if lo == hi {
        format!("{lo} argument{}", if lo == 1 { "" } else { "s" })
    } else {
        format!("{lo} to {hi} arguments")
    }
}

fn operand_list(spec: &MethodSpec) -> String {
    let mut parts: Vec<String> = Vec::new();
    if spec.receiver {
        parts.push("self".into());
    }
    let extra = spec.tensors.1.saturating_sub(usize::from(spec.receiver));
    for i in 0..extra {
        parts.push(if i + usize::from(spec.receiver) >= spec.tensors.0 { "tensor?".into() } else { "tensor".into() });
    }
    parts.extend(spec.attrs.iter().map(|a| if spec.required.contains(a) { a.to_string() } else { format!("{a}?") }));
    parts.join(", ")
}

fn compile_op(cx: &mut Cx, name: &Ident, span: Span, recv: Option<&Expr>, args: &[Arg]) -> syn::Result<Compiled> {
    let ir = ir();
    let s = scope_ident();
    let n = name.to_string();
    let Some(spec) = find_method(&n) else {
        let hint = suggest(&n).map(|s| format!("; did you mean `{s}`?")).unwrap_or_default();
        return err(span, format!("unknown op `{n}`{hint}"));
    };
    // Tensor operands: the receiver, then positional arguments up to the op's tensor count.
    // Ops with optional tensor operands (attention's mask) take every positional argument as a
    // tensor, so their attributes must be named.
    let positional = args.iter().filter(|a| matches!(a, Arg::Pos(..))).count();
    let extra_tensors_max = spec.tensors.1 - 1;
    let extra_tensors_min = spec.tensors.0 - 1;
    let n_tensor_args = if spec.tensors.0 != spec.tensors.1 { positional.min(extra_tensors_max) } else { extra_tensors_min };
    if positional < n_tensor_args || (spec.tensors.0 != spec.tensors.1 && positional < extra_tensors_min) {
        return err(span, format!("`{n}` takes {} ({}), got {}", arity_text(spec), operand_list(spec), 1 + args.len()));
    }
    let mut compiled = Vec::new();
    if let Some(r) = recv {
        compiled.push(compile_single(cx, r)?);
    }
    let mut tensor_args = 0usize;
    let mut first_attr = args.len();
    for (i, a) in args.iter().enumerate() {
        if tensor_args == n_tensor_args {
            first_attr = i;
            break;
        }
        match a {
            Arg::Pos(t, sp) => {
                let e = Parser::parse2(|p: ParseStream| parse_expr(p, 0), t.clone()).map_err(|e| syn::Error::new(*sp, e.to_string()))?;
                compiled.push(compile_single(cx, &e)?);
                tensor_args += 1;
            }
            Arg::Named(k, _) => return err(k.span(), format!("`{n}` needs its tensor operands before named attributes ({})", operand_list(spec))),
        }
    }
    if tensor_args == n_tensor_args && first_attr == args.len() {
        first_attr = n_tensor_args.min(args.len());
    }
    let attrs = collect_attrs(spec, name, args, first_attr)?;
    let ty = static_type(spec, span, &compiled, args, first_attr)?;
    let temps: Vec<Ident> = compiled.iter().map(|_| cx.fresh()).collect();
    let codes: Vec<TokenStream2> = compiled.into_iter().map(|c| c.code).collect();
    let kind = Ident::new(spec.op, span);
    let __at = relocate(span);
    let (code, multi) = if spec.results == 1 {
        (quote_spanned!(span=> { #(let #temps = #codes;)* #s.op1(#ir::OpKind::#kind, &[#(#temps),*], ::std::vec![#(#attrs),*]).map_err(#__at)? }), None)
    } else {
        let r = spec.results;
        (quote_spanned!(span=> { #(let #temps = #codes;)* #s.opn::<#r>(#ir::OpKind::#kind, &[#(#temps),*], ::std::vec![#(#attrs),*]).map_err(#__at)? }), Some(r))
    };
    Ok(Compiled { code, ty, multi })
}

fn attr_arg<'a>(spec: &MethodSpec, args: &'a [Arg], first_attr: usize, key: &str) -> Option<&'a TokenStream2> {
    let mut pos_i = 0;
    for (i, a) in args.iter().enumerate() {
        match a {
            Arg::Pos(t, _) if i >= first_attr => {
                if spec.attrs.get(pos_i) == Some(&key) {
                    return Some(t);
                }
                pos_i += 1;
            }
            Arg::Named(k, t) if k == key => return Some(t),
            _ => {}
        }
    }
    None
}

/// The static type of an op's result, checking what can be checked at expansion time.
fn static_type(spec: &MethodSpec, span: Span, ops: &[Compiled], args: &[Arg], first_attr: usize) -> syn::Result<SType> {
    let x = ops.first().map(|c| c.ty.clone()).unwrap_or_default();
    // An integer attribute's value: its default when absent, `None` when given as anything
    // but an integer literal (a Rust value known only when the graph is built).
    let int_attr = |k: &str, default: i64| match attr_arg(spec, args, first_attr, k) {
        None => Some(default),
        Some(t) => literal_int(t),
    };
    let check_axis = |k: &str, default: i64| -> syn::Result<()> {
        if let (Some(a), Some(d)) = (int_attr(k, default), &x.dims) {
            if norm_axis(a, d.len()).is_none() {
                let msg = format!("`{k}` {a} is out of range for the rank-{} operand {} of `{}`", d.len(), x.text(), spec.name);
                return Err(match attr_arg(spec, args, first_attr, k) {
                    Some(t) => syn::Error::new_spanned(t, msg),
                    None => syn::Error::new(span, msg),
                });
            }
        }
        Ok(())
    };
    refuse_fp8(spec.op, spec.name, span, &ops.iter().map(|c| &c.ty).collect::<Vec<_>>())?;
    // The per-tensor scale of the fp8 conversions: one f32, a scalar.
    let check_scale = || -> syn::Result<()> {
        let sc = ops.get(1).map(|c| c.ty.clone()).unwrap_or_default();
        let not_f32 = sc.dtype.as_deref().is_some_and(|d| d != "f32");
        let not_scalar = sc.dims.as_ref().is_some_and(|d| !d.is_empty());
        if not_f32 || not_scalar {
            return err(span, format!("the scale of `{}` is one f32 per tensor, a scalar f32[]: got {}", spec.name, sc.text()));
        }
        Ok(())
    };
    Ok(match spec.kind {
        vocab::Kind::Other if spec.op == "QuantizeFp8" => {
            if let Some(d) = x.dtype.as_deref().filter(|d| !matches!(*d, "bf16" | "f16" | "f32")) {
                return err(span, format!("`quantize_fp8` quantizes a float tensor (bf16, f16, f32), got {d} ({})", x.text()));
            }
            check_scale()?;
            SType { dtype: Some("f8e4m3".into()), dims: x.dims }
        }
        vocab::Kind::Cast if spec.op == "DequantizeFp8" => {
            if let Some(d) = x.dtype.as_deref().filter(|d| *d != "f8e4m3") {
                return err(span, format!("`dequantize_fp8` reads an f8e4m3 tensor, got {d} ({})", x.text()));
            }
            check_scale()?;
            let dt = attr_arg(spec, args, first_attr, "dtype").map(|t| t.to_string()).filter(|t| DTYPES.iter().any(|(n, _)| n == t));
            SType { dtype: dt, dims: x.dims }
        }
        vocab::Kind::Unary => {
            if let Some(d) = &x.dtype {
                if spec.float_only && !matches!(d.as_str(), "bf16" | "f16" | "f32") {
                    return err(span, format!("`{}` needs a float tensor, got {}", spec.name, x.text()));
                }
            }
            x
        }
        vocab::Kind::Cast => {
            let dt = attr_arg(spec, args, first_attr, "dtype").map(|t| t.to_string()).filter(|t| DTYPES.iter().any(|(n, _)| n == t));
            SType { dtype: dt, dims: x.dims }
        }
        vocab::Kind::Binary | vocab::Kind::Compare => {
            let y = ops.get(1).map(|c| c.ty.clone()).unwrap_or_default();
            let mut t = check_broadcast(span, &x, &y, spec.name)?;
            if spec.kind == vocab::Kind::Compare {
                t.dtype = Some("bool".into());
            }
            t
        }
        vocab::Kind::Matmul => {
            let y = ops.get(1).map(|c| c.ty.clone()).unwrap_or_default();
            // `Some(flag)` for an absent or literal flag; `None` for a Rust value.
            let lit_bool = |k: &str| match attr_arg(spec, args, first_attr, k).map(|t| t.to_string()) {
                None => Some(false),
                Some(t) if t == "true" => Some(true),
                Some(t) if t == "false" => Some(false),
                Some(_) => None,
            };
            match (lit_bool("transpose_a"), lit_bool("transpose_b")) {
                (Some(ta), Some(tb)) => matmul_type(span, &x, &y, ta, tb)?,
                _ => SType { dtype: x.dtype.clone().or(y.dtype), dims: None },
            }
        }
        vocab::Kind::Reduce => {
            check_axis("axis", -1)?;
            SType { dtype: x.dtype, dims: None }
        }
        vocab::Kind::Row => {
            check_axis("axis", -1)?;
            x
        }
        vocab::Kind::Transpose => {
            check_axis("dim0", -2)?;
            check_axis("dim1", -1)?;
            let mut t = x.clone();
            match (&mut t.dims, int_attr("dim0", -2), int_attr("dim1", -1)) {
                (Some(d), Some(a), Some(b)) => {
                    let r = d.len();
                    if let (Some(a), Some(b)) = (norm_axis(a, r), norm_axis(b, r)) {
                        d.swap(a, b);
                    }
                }
                // Axes known only at build time: the rank stays, the dims do not.
                (Some(d), _, _) => d.iter_mut().for_each(|x| *x = SDim::Unknown),
                _ => {}
            }
            t
        }
        vocab::Kind::Reshape => {
            let target = attr_arg(spec, args, first_attr, "shape").and_then(|t| {
                let v: Vec<TokenTree> = t.clone().into_iter().collect();
                match v.as_slice() {
                    [TokenTree::Group(g)] if g.delimiter() == Delimiter::Bracket => {
                        split_commas(g.stream()).into_iter().map(|(t, s)| parse_dim(t, s).ok().map(|d| sdim_of(&d))).collect::<Option<Vec<_>>>()
                    }
                    _ => None,
                }
            });
            if let (Some(from), Some(to)) = (&x.dims, &target) {
                let lit = |d: &[SDim]| d.iter().map(|x| if let SDim::Lit(n) = x { Some(*n) } else { None }).product::<Option<i64>>();
                if spec.name == "reshape" {
                    if let (Some(a), Some(b)) = (lit(from), lit(to)) {
                        if a != b {
                            let shape_arg = attr_arg(spec, args, first_attr, "shape").expect("the target came from it");
                            let to = to.iter().map(SDim::text).collect::<Vec<_>>().join(", ");
                            return Err(syn::Error::new_spanned(shape_arg, format!("cannot reshape {} ({a} elements) to [{to}] ({b} elements)", x.text())));
                        }
                    }
                }
            }
            SType { dtype: x.dtype, dims: target }
        }
        vocab::Kind::Same => x,
        // `cond.select(a, b)`: the branches' dtype, the three shapes broadcast.
        vocab::Kind::Other if spec.op == "Select" => {
            if let Some(d) = x.dtype.as_deref().filter(|d| *d != "bool") {
                return err(span, format!("the condition of `select` must be bool, got {d} ({}); compare first, e.g. `(x > 0.0).select(a, b)`", x.text()));
            }
            let (a, b) = (ops.get(1).map(|c| c.ty.clone()).unwrap_or_default(), ops.get(2).map(|c| c.ty.clone()).unwrap_or_default());
            let ab = check_broadcast(span, &a, &b, "select")?;
            let all = check_broadcast(span, &SType { dtype: None, dims: x.dims.clone() }, &SType { dtype: None, dims: ab.dims }, "select")?;
            SType { dtype: ab.dtype, dims: all.dims }
        }
        vocab::Kind::Other => SType { dtype: x.dtype, dims: None },
    })
}

fn compile_block(cx: &mut Cx, b: &Block) -> syn::Result<TokenStream2> {
    let mut out = TokenStream2::new();
    let depth = cx.vars.len();
    for st in &b.stmts {
        out.extend(compile_stmt(cx, st)?);
    }
    cx.vars.truncate(depth);
    Ok(out)
}

fn compile_stmt(cx: &mut Cx, st: &Stmt) -> syn::Result<TokenStream2> {
    Ok(match st {
        Stmt::Let { pat, init } => {
            let c = compile_expr(cx, init)?;
            check_let_pattern(pat, init, &c)?;
            let code = c.code;
            cx.bind(pat, c.ty);
            quote!(let #pat = #code;)
        }
        Stmt::Assign { name, value } => {
            let c = compile_single(cx, value)?;
            let code = c.code;
            cx.vars.push((name.to_string(), c.ty));
            cx.assigned.push(name.to_string());
            quote!(#name = #code;)
        }
        Stmt::For { pat, iter, body } => {
            let (depth, assigned) = (cx.vars.len(), cx.assigned.len());
            // The loop variable is a Rust value; it hides a tensor of the same name.
            cx.bind(pat, SType::default());
            let b = compile_block(cx, body)?;
            cx.vars.truncate(depth);
            // Types assigned inside a loop are not known after it.
            cx.forget_assigned(assigned);
            quote!(for #pat in #iter { #b })
        }
        Stmt::If { cond, then, els } => {
            let assigned = cx.assigned.len();
            let t = compile_block(cx, then)?;
            let code = match els {
                Some(e) => {
                    let e = compile_block(cx, e)?;
                    quote!(if #cond { #t } else { #e })
                }
                None => quote!(if #cond { #t }),
            };
            cx.forget_assigned(assigned);
            code
        }
        Stmt::Expr(e) => {
            let c = compile_expr(cx, e)?;
            let code = c.code;
            quote!(let _ = #code;)
        }
    })
}

/// `let` of a multi-result op or call binds every result: `let [k, v] = ...`.
fn check_let_pattern(pat: &syn::Pat, init: &Expr, c: &Compiled) -> syn::Result<()> {
    let elems = match pat {
        syn::Pat::Slice(p) => Some(p.elems.len()),
        _ => None,
    };
    let what = match init {
        Expr::Method { name, .. } | Expr::Call { name, .. } => format!("`{name}`"),
        _ => "the value".to_string(),
    };
    let bad = |msg: String| Err(syn::Error::new_spanned(pat, msg));
    match (c.multi, elems) {
        (Some(n), None) if !matches!(pat, syn::Pat::Wild(_)) => {
            let names: Vec<String> = (0..n).map(|i| ((b'a' + i as u8) as char).to_string()).collect();
            bad(format!("{what} gives {n} tensors; bind each of them: `let [{}] = ...`", names.join(", ")))
        }
        (Some(n), Some(m)) if n != m && !pat.to_token_stream().to_string().contains("..") => bad(format!("{what} gives {n} tensors but this pattern binds {m}")),
        (None, Some(m)) if !matches!(init, Expr::If { .. } | Expr::Rust(..)) => bad(format!("{what} gives one tensor but this pattern binds {m}; write `let name = ...`")),
        _ => Ok(()),
    }
}

fn expand_graph(fns: Vec<FnDef>) -> syn::Result<TokenStream2> {
    let ir = ir();
    let s = scope_ident();
    let mut sigs: Vec<FnSig> = Vec::new();
    let mut bodies = Vec::new();
    for (fi, f) in fns.iter().enumerate() {
        let name = f.name.to_string();
        if sigs.iter().any(|g| g.name == name) {
            return err(f.name.span(), format!("function `{name}` is defined twice in this graph"));
        }
        let mut seen: Vec<String> = Vec::new();
        for p in &f.params {
            let pn = p.name.to_string();
            if seen.contains(&pn) {
                return err(p.name.span(), format!("parameter `{pn}` is declared twice"));
            }
            seen.push(pn);
        }
        let not_yet: Vec<String> = fns[fi..].iter().map(|g| g.name.to_string()).collect();
        let mut cx = Cx { fns: &sigs, not_yet: &not_yet, vars: Vec::new(), assigned: Vec::new(), tmp: 0 };
        let mut params = Vec::new();
        for p in &f.params {
            let (pn, pi) = (p.name.to_string(), &p.name);
            let tt = type_tokens(&p.ty);
            let __at = relocate(p.name.span());
            params.push(quote_spanned!(p.name.span()=> let #pi: #ir::Value = #s.param(#pn, #tt).map_err(#__at)?;));
            cx.vars.push((pn, SType::of(&p.ty)));
        }
        // The body's statements share the function's scope with its tail, so the tail's static
        // types are known.
        let mut body = TokenStream2::new();
        for st in &f.body.stmts {
            body.extend(compile_stmt(&mut cx, st)?);
        }
        let tail = f.body.tail.as_ref().ok_or_else(|| syn::Error::new(f.body.close, format!("`fn {name}` must end with the tensor(s) it returns (an expression without `;`)")))?;
        let mut out_codes = Vec::new();
        let mut out_temps = Vec::new();
        let mut out_lets = TokenStream2::new();
        let mut tuple_temps: Vec<Ident> = Vec::new();
        if let (Expr::If { .. }, true) = (tail, f.ret.len() > 1) {
            // `if c { (a, b) } else { (p, q) }` as the tail of a function with several results.
            let code = compile_expr(&mut cx, tail)?.code;
            let temps: Vec<Ident> = f.ret.iter().map(|_| cx.fresh()).collect();
            out_lets = quote!(let (#(#temps),*) = #code;);
            tuple_temps = temps;
        }
        let outs: Vec<&Expr> = match tail {
            _ if !tuple_temps.is_empty() => vec![],
            Expr::Tuple(items, _) => items.iter().collect(),
            e => vec![e],
        };
        if tuple_temps.is_empty() && outs.len() != f.ret.len() {
            let s = if f.ret.len() == 1 { "" } else { "s" };
            let msg = format!("`fn {name}` declares {} return value{s} but returns {}", f.ret.len(), outs.len());
            return err_range(f.body.tail_range.unwrap_or((tail.span(), tail.span())), msg);
        }
        // Where a returned value's type error points: all of a single returned expression, the
        // op that made an element of a returned tuple.
        let at = |o: &Expr| if outs.len() == 1 { f.body.tail_range.unwrap_or((o.span(), o.span())) } else { (o.span(), o.span()) };
        for (o, decl) in outs.iter().zip(&f.ret) {
            let c = compile_single(&mut cx, o)?;
            let declared = SType::of(decl);
            if let (Some(a), Some(b)) = (&c.ty.dtype, &declared.dtype) {
                if a != b {
                    return err_range(at(o), format!("`fn {name}` returns {} but declares {}", c.ty.text(), declared.text()));
                }
            }
            if let (Some(a), Some(b)) = (&c.ty.dims, &declared.dims) {
                let clash = a.len() != b.len() || a.iter().zip(b).any(|(x, y)| x.known() && y.known() && x != y);
                if clash {
                    return err_range(at(o), format!("`fn {name}` returns {} but declares {}", c.ty.text(), declared.text()));
                }
            }
            out_codes.push(c.code);
            out_temps.push(cx.fresh());
        }
        let decls: Vec<TokenStream2> = f.ret.iter().map(type_tokens).collect();
        let ret_span = f.ret_span;
        let results = if tuple_temps.is_empty() { &out_temps } else { &tuple_temps };
        let __at = relocate(ret_span);
        let finish = quote_spanned!(ret_span=> #s.finish(&[#(#results),*], &[#(#decls),*]).map_err(#__at)?);
        bodies.push(quote! {
            {
                let mut #s = #ir::scope::Scope::new(&__sinter_graph, #name);
                #(#params)*
                #body
                #out_lets
                #(let #out_temps = #out_codes;)*
                let __f = #finish;
                __sinter_graph.add_func(__f);
            }
        });
        sigs.push(FnSig { name, n_params: f.params.len(), params: f.params.iter().map(|p| p.name.to_string()).collect(), ret: f.ret.clone() });
    }
    Ok(quote! {
        {
            // `{ rust }` escapes are braces on purpose; the DSL's own temporaries are single-use.
            #[allow(unused_braces, unused_parens, clippy::redundant_closure_call)]
            let __sinter_result = (|| -> ::core::result::Result<#ir::Graph, #ir::BuildError> {
                fn __sinter_at(at: &'static ::core::panic::Location<'static>) -> impl ::core::ops::FnOnce(#ir::BuildError) -> #ir::BuildError {
                    move |mut e| {
                        e.location = at;
                        e
                    }
                }
                let mut __sinter_graph = #ir::Graph::new();
                #(#bodies)*
                ::core::result::Result::Ok(__sinter_graph)
            })();
            __sinter_result
        }
    })
}

/// The vocabulary as data, for the root crate's consistency test against the op table:
/// expands to `&[(dsl_name, op_variant, &[attr names])]`.
#[doc(hidden)]
#[proc_macro]
pub fn __vocab(_input: TokenStream) -> TokenStream {
    let rows = vocab::METHODS.iter().chain(vocab::SOURCES).map(|m| {
        let (n, op, attrs) = (m.name, m.op, m.attrs);
        quote!((#n, #op, &[#(#attrs),*] as &[&str]))
    });
    quote!(&[#(#rows),*] as &[(&str, &str, &[&str])]).into()
}

/// The ops whose `f8e4m3` operands the macro lets through ([`FP8_OPS`]), for the root crate's
/// consistency test against `sinter_ir::infer::accepts_fp8`: expands to `&[op_variant]`.
#[doc(hidden)]
#[proc_macro]
pub fn __vocab_fp8(_input: TokenStream) -> TokenStream {
    let ops = FP8_OPS.iter();
    quote!(&[#(#ops),*] as &[&str]).into()
}
