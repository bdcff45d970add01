//! The static view of types: what is known of dtypes and dims at expansion time, and the
//! checks (broadcasting, `@`, axes, fp8 operands) that fail at the offending span.

use proc_macro2::{Delimiter, Span, TokenStream as TokenStream2, TokenTree};

use crate::ast::*;
use crate::err;
use crate::expand::Compiled;
use crate::parse::{parse_dim, split_commas};
use crate::vocab::{self, MethodSpec};

/// The ops that accept `f8e4m3` operands (`sinter_ir::infer::accepts_fp8`, which the root
/// crate's tests compare with this list through `__vocab_fp8!`): conversions, data movement and
/// calls. Anything else on an `f8e4m3` operand is refused at expansion when the dtype is known.
pub(crate) const FP8_OPS: [&str; 11] = ["Cast", "DequantizeFp8", "Transpose", "Permute", "Reshape", "Broadcast", "Concat", "Slice", "Gather", "Select", "Call"];

/// Refuses `f8e4m3` operands of an op that does not compute on them (see [`FP8_OPS`]); `word`
/// is how the user wrote the op (`@`, `exp`).
pub(crate) fn refuse_fp8(op: &str, word: &str, span: Span, tys: &[&SType]) -> syn::Result<()> {
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

#[derive(Clone, PartialEq, Debug)]
pub(crate) enum SDim {
    Sym(String),
    Lit(i64),
    Unknown,
}

impl SDim {
    pub(crate) fn known(&self) -> bool {
        !matches!(self, SDim::Unknown)
    }
    pub(crate) fn is_one(&self) -> bool {
        *self == SDim::Lit(1)
    }
    pub(crate) fn text(&self) -> String {
        match self {
            SDim::Sym(s) => s.clone(),
            SDim::Lit(n) => n.to_string(),
            SDim::Unknown => "?".into(),
        }
    }
}

#[derive(Clone, Debug, Default)]
pub(crate) struct SType {
    pub(crate) dtype: Option<String>,
    pub(crate) dims: Option<Vec<SDim>>,
}

impl SType {
    pub(crate) fn of(t: &TypeSpec) -> SType {
        SType { dtype: t.dtype.known(), dims: Some(t.dims.iter().map(sdim_of).collect()) }
    }
    pub(crate) fn text(&self) -> String {
        format!(
            "{}[{}]",
            self.dtype.clone().unwrap_or_else(|| "?".into()),
            self.dims.as_ref().map(|d| d.iter().map(SDim::text).collect::<Vec<_>>().join(", ")).unwrap_or_else(|| "…".into())
        )
    }
}

pub(crate) fn sdim_of(d: &DimExpr) -> SDim {
    match d {
        DimExpr::Sym(s, _) => SDim::Sym(s.clone()),
        DimExpr::Lit(n) => SDim::Lit(*n),
        _ => SDim::Unknown,
    }
}

pub(crate) fn literal_int(ts: &TokenStream2) -> Option<i64> {
    let v: Vec<TokenTree> = ts.clone().into_iter().collect();
    match v.as_slice() {
        [TokenTree::Literal(l)] => l.to_string().parse().ok(),
        [TokenTree::Punct(m), TokenTree::Literal(l)] if m.as_char() == '-' => l.to_string().parse::<i64>().ok().map(|x| -x),
        _ => None,
    }
}

pub(crate) fn norm_axis(axis: i64, rank: usize) -> Option<usize> {
    let a = if axis < 0 { axis + rank as i64 } else { axis };
    (0..rank as i64).contains(&a).then_some(a as usize)
}

pub(crate) fn check_broadcast(span: Span, a: &SType, b: &SType, what: &str) -> syn::Result<SType> {
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

pub(crate) fn matmul_type(span: Span, a: &SType, b: &SType, ta: bool, tb: bool) -> syn::Result<SType> {
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

pub(crate) fn attr_arg<'a>(spec: &MethodSpec, args: &'a [Arg], first_attr: usize, key: &str) -> Option<&'a TokenStream2> {
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
pub(crate) fn static_type(spec: &MethodSpec, span: Span, ops: &[Compiled], args: &[Arg], first_attr: usize) -> syn::Result<SType> {
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
        vocab::Kind::Logical => {
            for o in ops.iter().take(2) {
                if let Some(d) = o.ty.dtype.as_deref().filter(|d| *d != "bool") {
                    return err(span, format!("`{}` takes bool tensors, got {d} ({}); compare first, e.g. `(x > 0.0).{}(..)`", spec.name, o.ty.text(), spec.name));
                }
            }
            let mut t = match ops.get(1) {
                Some(y) => check_broadcast(span, &x, &y.ty, spec.name)?,
                None => x,
            };
            t.dtype = Some("bool".into());
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
