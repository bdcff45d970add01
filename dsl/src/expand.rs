//! The expansion: the syntax tree to calls of `sinter-ir`'s builder, each passing its
//! `BuildError` through the user's source location.

use proc_macro2::{Delimiter, Span, TokenStream as TokenStream2, TokenTree};
use quote::{quote, quote_spanned, ToTokens};
use syn::parse::{ParseStream, Parser};
use syn::Ident;

use crate::ast::*;
use crate::parse::{parse_dim, parse_expr, parse_type, split_commas, tokens_of_op};
use crate::types::*;
use crate::vocab::{self, find_method, suggest, MethodSpec};
use crate::{err, err_range};

pub(crate) struct FnSig {
    pub(crate) name: String,
    pub(crate) n_params: usize,
    pub(crate) params: Vec<String>,
    pub(crate) ret: Vec<TypeSpec>,
}

pub(crate) struct Cx<'a> {
    /// Functions defined above the current one (callable).
    pub(crate) fns: &'a [FnSig],
    /// The current function and those defined below it (not callable from here).
    pub(crate) not_yet: &'a [String],
    /// Static types of the tensor variables in scope (innermost last).
    pub(crate) vars: Vec<(String, SType)>,
    /// Every variable assigned with `name = ...` so far (to forget types after a loop or branch).
    pub(crate) assigned: Vec<String>,
    pub(crate) tmp: usize,
}

/// `__sinter_at(Location::caller())`, the location spelled with `span`: every builder call of the
/// expansion passes its error through it, so a `BuildError` names the user's operator or
/// method (file:line:column) whatever location the builder took.
pub(crate) fn relocate(span: Span) -> TokenStream2 {
    let loc = quote_spanned!(span=> ::core::panic::Location::caller());
    quote!(__sinter_at(#loc))
}

pub(crate) fn ir() -> TokenStream2 {
    quote!(::sinter::ir)
}

pub(crate) fn scope_ident() -> Ident {
    Ident::new("__sinter_scope", Span::call_site())
}

impl Cx<'_> {
    pub(crate) fn var_type(&self, name: &str) -> SType {
        self.vars.iter().rev().find(|(n, _)| n == name).map(|(_, t)| t.clone()).unwrap_or_default()
    }

    /// Binds the names of `pat`: a plain name gets `t`, the names of a destructuring pattern
    /// (`let [a, b] = ...`, a `for` pattern) an unknown type, so no stale type survives shadowing.
    pub(crate) fn bind(&mut self, pat: &syn::Pat, t: SType) {
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
    pub(crate) fn forget_assigned(&mut self, from: usize) {
        let names: Vec<String> = self.assigned[from..].to_vec();
        for n in names {
            if self.vars.iter().any(|(v, _)| *v == n) {
                self.vars.push((n, SType::default()));
            }
        }
    }

    pub(crate) fn fresh(&mut self) -> Ident {
        self.tmp += 1;
        Ident::new(&format!("__sinter_t{}", self.tmp), Span::call_site())
    }
}

/// The names a pattern binds.
pub(crate) fn pat_idents(pat: &syn::Pat, out: &mut Vec<String>) {
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

pub(crate) fn dim_tokens(d: &DimExpr) -> TokenStream2 {
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

pub(crate) fn type_tokens(t: &TypeSpec) -> TokenStream2 {
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

pub(crate) fn attr_tokens(ts: &TokenStream2) -> syn::Result<TokenStream2> {
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
            return err(i.span(), unknown_dtype_message(&i.to_string()));
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
pub(crate) struct Compiled {
    pub(crate) code: TokenStream2,
    pub(crate) ty: SType,
    pub(crate) multi: Option<usize>,
}

pub(crate) fn compile_expr(cx: &mut Cx, e: &Expr) -> syn::Result<Compiled> {
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
pub(crate) fn compile_branch(cx: &mut Cx, b: &Block) -> syn::Result<TokenStream2> {
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

pub(crate) fn compile_single(cx: &mut Cx, e: &Expr) -> syn::Result<Compiled> {
    let c = compile_expr(cx, e)?;
    if let Some(n) = c.multi {
        return err(e.span(), format!("this gives {n} tensors; bind them with `let [a, b] = ...` first"));
    }
    Ok(c)
}

pub(crate) fn compile_binary(cx: &mut Cx, op: BinOp, span: Span, lhs: &Expr, rhs: &Expr) -> syn::Result<Compiled> {
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
    if op.is_logical() {
        for t in [&lty, &rty] {
            if let Some(d) = t.dtype.as_deref().filter(|d| *d != "bool") {
                return err(span, format!("`{}` takes bool tensors, got {d} ({}); compare first, e.g. `(x > 0.0) {} m`", tokens_of_op(op), t.text(), tokens_of_op(op)));
            }
        }
    }
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

pub(crate) fn compile_call(cx: &mut Cx, name: &Ident, span: Span, args: &[Arg]) -> syn::Result<Compiled> {
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

pub(crate) fn compile_source(_cx: &mut Cx, spec: &MethodSpec, name: &Ident, span: Span, args: &[Arg]) -> syn::Result<Compiled> {
    let ir = ir();
    let s = scope_ident();
    let attrs = collect_attrs(spec, name, args, 0)?;
    let kind = Ident::new(spec.op, span);
    let __at = relocate(span);
    Ok(Compiled { code: quote_spanned!(span=> #s.op1(#ir::OpKind::#kind, &[], ::std::vec![#(#attrs),*]).map_err(#__at)?), ty: SType::default(), multi: None })
}

pub(crate) fn collect_attrs(spec: &MethodSpec, name: &Ident, args: &[Arg], first_attr_pos: usize) -> syn::Result<Vec<TokenStream2>> {
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

pub(crate) fn arity_text(spec: &MethodSpec) -> String {
    let (lo, hi) = (spec.tensors.0, spec.tensors.1 + spec.attrs.len());
    let lo = lo + spec.required.len();
    if lo == hi {
        format!("{lo} argument{}", if lo == 1 { "" } else { "s" })
    } else {
        format!("{lo} to {hi} arguments")
    }
}

pub(crate) fn operand_list(spec: &MethodSpec) -> String {
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

pub(crate) fn compile_op(cx: &mut Cx, name: &Ident, span: Span, recv: Option<&Expr>, args: &[Arg]) -> syn::Result<Compiled> {
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

pub(crate) fn compile_block(cx: &mut Cx, b: &Block) -> syn::Result<TokenStream2> {
    let mut out = TokenStream2::new();
    let depth = cx.vars.len();
    for st in &b.stmts {
        out.extend(compile_stmt(cx, st)?);
    }
    cx.vars.truncate(depth);
    Ok(out)
}

pub(crate) fn compile_stmt(cx: &mut Cx, st: &Stmt) -> syn::Result<TokenStream2> {
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
pub(crate) fn check_let_pattern(pat: &syn::Pat, init: &Expr, c: &Compiled) -> syn::Result<()> {
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

pub(crate) fn expand_graph(fns: Vec<FnDef>) -> syn::Result<TokenStream2> {
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
