//! The parser: `graph!`'s tokens to the syntax tree of [`crate::ast`], with errors at the
//! offending span.

use proc_macro2::{Delimiter, Span, TokenStream as TokenStream2, TokenTree};
use syn::buffer::Cursor;
use syn::parse::discouraged::Speculative;
use syn::parse::ParseStream;
use syn::{Ident, Token};

use crate::ast::*;
use crate::err;

pub(crate) fn parse_graph(input: ParseStream) -> syn::Result<Vec<FnDef>> {
    let mut fns = Vec::new();
    while !input.is_empty() {
        fns.push(parse_fn(input)?);
    }
    if fns.is_empty() {
        return err(Span::call_site(), "`graph!` needs at least one `fn name(params) -> type { body }`");
    }
    Ok(fns)
}

pub(crate) fn parse_fn(input: ParseStream) -> syn::Result<FnDef> {
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

pub(crate) fn parse_type(input: ParseStream) -> syn::Result<TypeSpec> {
    // The dtype is a name (`bf16`) or a Rust expression in braces (`{cfg.dtype}`).
    let (dtype, span) = if input.peek(syn::token::Brace) {
        let g: TokenTree = input.parse()?;
        let TokenTree::Group(g) = g else { return err(g.span(), "expected a dtype") };
        (DTypeSpec::Rust(g.stream()), g.span())
    } else {
        let dt: Ident = input.parse().map_err(|e| syn::Error::new(e.span(), "expected a tensor type such as `bf16[T, 576]`"))?;
        let name = dt.to_string();
        if !DTYPES.iter().any(|(n, _)| *n == name) {
            return err(dt.span(), unknown_dtype_message(&name));
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
pub(crate) fn split_commas(ts: TokenStream2) -> Vec<(TokenStream2, Span)> {
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

pub(crate) fn parse_dim(ts: TokenStream2, span: Span) -> syn::Result<DimExpr> {
    let toks: Vec<TokenTree> = ts.into_iter().collect();
    if toks.is_empty() {
        return err(span, "empty dimension");
    }
    dim_sum(&toks, span)
}

pub(crate) fn punct_at(t: &TokenTree, c: char) -> bool {
    matches!(t, TokenTree::Punct(p) if p.as_char() == c)
}

pub(crate) fn dim_sum(toks: &[TokenTree], span: Span) -> syn::Result<DimExpr> {
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

pub(crate) fn dim_prod(toks: &[TokenTree], span: Span) -> syn::Result<DimExpr> {
    for i in (1..toks.len()).rev() {
        if punct_at(&toks[i], '*') {
            let l = dim_prod(&toks[..i], span)?;
            let r = dim_atom(&toks[i + 1..], toks[i].span())?;
            return Ok(DimExpr::Mul(Box::new(l), Box::new(r)));
        }
    }
    dim_atom(toks, span)
}

pub(crate) fn dim_atom(toks: &[TokenTree], span: Span) -> syn::Result<DimExpr> {
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

pub(crate) fn parse_block(input: ParseStream, close: Span) -> syn::Result<Block> {
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
pub(crate) fn token_range(start: Cursor, end: Cursor) -> Option<(Span, Span)> {
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
pub(crate) fn expect_semi(input: ParseStream, start: Cursor, what: &str) -> syn::Result<()> {
    if input.peek(Token![;]) {
        input.parse::<Token![;]>()?;
        return Ok(());
    }
    let at = token_range(start, input.cursor()).map(|(_, last)| last).unwrap_or_else(|| input.span());
    err(at, format!("expected `;` after this {what}"))
}

pub(crate) fn parse_if(input: ParseStream) -> syn::Result<Stmt> {
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

pub(crate) fn peek_binop(input: ParseStream) -> Option<(BinOp, usize)> {
    // Two-character operators first.
    if input.peek(Token![&&]) {
        Some((BinOp::And, 2))
    } else if input.peek(Token![||]) {
        Some((BinOp::Or, 2))
    } else if input.peek(Token![==]) {
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

pub(crate) fn parse_expr(input: ParseStream, min_prec: u8) -> syn::Result<Expr> {
    let mut lhs = parse_unary(input)?;
    loop {
        let logical = input.peek(Token![&&]) || input.peek(Token![||]);
        if !logical && (input.peek(Token![%]) || input.peek(Token![&]) || input.peek(Token![|]) || input.peek(Token![^])) {
            let t: TokenTree = input.parse()?;
            return err(t.span(), format!("operator `{t}` is not a tensor op; the DSL has + - * / @, comparisons, && || ! on bool tensors, and methods such as .maximum(b)"));
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
            BinOp::And => drop(input.parse::<Token![&&]>()?),
            BinOp::Or => drop(input.parse::<Token![||]>()?),
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

pub(crate) fn tokens_of_op(op: BinOp) -> &'static str {
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
        BinOp::And => "&&",
        BinOp::Or => "||",
    }
}

pub(crate) fn parse_unary(input: ParseStream) -> syn::Result<Expr> {
    if input.peek(Token![-]) {
        let m = input.parse::<Token![-]>()?;
        let e = parse_unary(input)?;
        return Ok(match e {
            Expr::Lit(v, s) => Expr::Lit(-v, s),
            e => Expr::Neg { span: m.span, e: Box::new(e) },
        });
    }
    // `!m`: `m.logical_not()`.
    if input.peek(Token![!]) {
        let bang = input.parse::<Token![!]>()?;
        let e = parse_unary(input)?;
        return Ok(Expr::Method { recv: Box::new(e), name: Ident::new("logical_not", bang.span), args: vec![], span: bang.span });
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

pub(crate) fn parse_args(input: ParseStream) -> syn::Result<Vec<Arg>> {
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

pub(crate) fn parse_atom(input: ParseStream) -> syn::Result<Expr> {
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
