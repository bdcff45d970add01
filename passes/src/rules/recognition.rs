//! Recognition rules: decomposed spellings of the op table's composite ops become the op.
//!
//! Each rule is a matcher over e-classes, not over one syntax tree: at every step it looks at
//! *every* e-node of the class it visits, so after the [algebraic](super::algebraic) rules
//! have made the spellings equal (casts that are no-ops removed, `transpose` as `permute`,
//! transposes folded into the matmul, `x·(−1)` as `neg`), one rule catches each of them.
//! Operand orders of commutative ops are tried both ways inside the rule (there is no
//! commutativity rule). Spellings covered (each is shown by a file test):
//!
//! | rule | spellings |
//! |---|---|
//! | `sigmoid` | `1/(1+exp(−x))`, `recip(1+exp(−x))` |
//! | `silu` | `x·sigmoid(x)`, `sigmoid(x)·x`, `x/(1+exp(−x))` |
//! | `swiglu` | `silu(a)·b`, `b·silu(a)` |
//! | `softmax` | `exp(x−max x)/Σexp(x−max x)` (safe), `exp(x)·recip(Σexp(x))`, `exp(x)/Σexp(x)` (unsafe, oriented to the safe op) |
//! | `log-softmax` | `x−max−log Σexp(x−max)`, `x−(max+log Σexp(x−max))` (log-sum-exp), `log(softmax(x))` |
//! | `softmax-from-lse` | `exp(log_softmax(x))`, so `exp(x − lse(x))` is softmax |
//! | `rms-norm` | `x·rsqrt(mean(x²)+ε)·w`, with `mean` or `sum/n`, `rsqrt` or `1/sqrt` or `/sqrt`, `x·x` or `x²`: in f32 with a cast back before the weight (Llama/HF: `rms_norm` in the narrow dtype), or all in f32 (`rms_norm` on f32; a weight applied in f32 before one cast back, as Gemma's `(1 + w)`, keeps that cast after the f32 `rms_norm`) |
//! | `layer-norm` | `(x−μ)·rsqrt(var+ε)·w + b` with the same variations |
//! | `attention` | `softmax(scale·Q·Kᵀ [+ mask])·V`: the scale on Q, on K or on the scores (`·c` or `/c`); Kᵀ as `transpose_b` or a transpose; no mask, an additive mask, an additive or `select` causal mask built from `iota` comparisons (`select(keep, s, −inf)`, or the hidden keys first as PyTorch's `masked_fill` writes it); GQA written as `reshape(broadcast(reshape(K)))`; heads split with a transpose (→ layout `bshd`) or already `[B,H,S,D]`; the softmax in the scores' dtype or cast to f32 and back (Llama) |
//! | `rope-rotate-half` | `x·cos + concat(−x₂, x₁)·sin` with `cos/sin(concat(f, f))`, `f = pos·inv_freq` |
//! | `rope-halves` | `concat(x₁·cos − x₂·sin, x₂·cos + x₁·sin)` over the halves, `cos/sin(f)` |
//! | `rope-interleaved` | `reshape(concat(x₀·cos − x₁·sin, x₁·cos + x₀·sin))` over the even/odd pairs of `reshape(x, [..., D/2, 2])` |
//!
//! The cos/sin tables may also be tables of every position `0..L` built in the graph
//! (`cos(rows · inv_freq)`, `rows` counting the rows) and gathered by the position ids, as a
//! rotary cache indexed by `position_ids`: the gather's indices are then the positions.
//! Tables that are graph inputs are not `rope` (their values are unknown); [`super::rotary`]
//! makes the same sums `rotary(x, cos, sin)`, which holds for any tables.
//!
//! `inv_freq` may be spelled any way that evaluates from constants and `iota`
//! (`θ^(−2i/D)`, `1/θ^(2i/D)`, `exp(−2i·ln θ/D)`): the rule evaluates it with the interpreter
//! and reads θ off the values (checking all of them).
//!
//! **Rounding.** Explicit casts are rounding points that rewrites keep (DESIGN.md): a rule
//! replaces a cast chain only by an op that rounds to the narrow dtype at the same places.
//! `rms_norm`/`layer_norm` in dtype `dt` round the normalised value to `dt` and then the
//! product with the weight, so they replace only `cast(normalized, dt)·w`; a weight applied
//! in f32 before the one cast back is recognised as the f32 op under the written cast. Inside
//! f32 a composite computes its statistics once, in f64, where the decomposition rounds each
//! f32 step: accumulation order, within DESIGN.md's f32 tolerance, which the consistency check
//! compares with. The ops that replace a chain in one dtype without casts (softmax, SiLU,
//! attention) round once where the decomposition rounds at every step in that dtype;
//! `attention` also takes the Llama spelling `cast(softmax(cast(s, f32)), dt)·V` without
//! rounding the probabilities to `dt` (a known difference, within the dtype's tolerance).

use egg::Id;
use sinter_ir::{Attr, DType, Dim, OpKind, TensorType};

use super::{binary_args, comm_args, constant, is_const, is_const_near, mk, nodes, permute, reshape, scalar_const, ty, unary_args, RuleTable};
use crate::lang::SirEGraph;

use OpKind::*;

/// The recognition rules: name, doc line, trigger ops, body.
pub static RULES: RuleTable = &[
    ("sigmoid", "1/(1+exp(−x)) → sigmoid(x)", &[Recip, Div], sigmoid),
    ("silu", "x·sigmoid(x), x/(1+exp(−x)) → silu(x)", &[Mul, Div], silu),
    ("swiglu", "silu(a)·b → swiglu(a, b)", &[Mul], swiglu),
    ("softmax", "exp(x−max)/Σexp(x−max), exp(x)/Σexp(x) → softmax(x)", &[Div, Mul], softmax),
    ("log-softmax", "x−max−log Σexp(x−max), log(softmax(x)) → log_softmax(x)", &[Sub, Log], log_softmax),
    ("softmax-from-lse", "exp(log_softmax(x)) → softmax(x)", &[Exp], softmax_from_lse),
    ("rms-norm", "x·rsqrt(mean(x²)+ε)·w → rms_norm(x, w, ε)", &[Mul], rms_norm),
    ("layer-norm", "(x−μ)·rsqrt(var+ε)·w + b → layer_norm(x, w, b, ε)", &[Add], layer_norm),
    ("attention", "softmax(scale·Q·Kᵀ + mask)·V → attention", &[Matmul], attention),
    ("rope-rotate-half", "x·cos + rotate_half(x)·sin → rope(rotate_half)", &[Add], rope_rotate_half),
    ("rope-halves", "concat(x₁c−x₂s, x₂c+x₁s) → rope(rotate_half)", &[Concat], rope_halves),
    ("rope-interleaved", "pairs (2i, 2i+1) rotated → rope(interleaved)", &[Reshape], rope_interleaved),
];

fn same(eg: &SirEGraph, a: Id, b: Id) -> bool {
    eg.find(a) == eg.find(b)
}

fn last_dim(t: &TensorType) -> Option<Dim> {
    t.shape.last().cloned()
}

// ---------------------------------------------------------------------------------------
// SiLU family

/// `x` such that class `id` is `1 + exp(−x)` (either add order).
fn one_plus_exp_neg(eg: &SirEGraph, id: Id) -> Vec<Id> {
    let mut out = vec![];
    for (one, e) in comm_args(eg, id, Add) {
        if !is_const(eg, one, 1.0) {
            continue;
        }
        for n in unary_args(eg, e, Exp) {
            out.extend(unary_args(eg, n, Neg));
        }
    }
    out
}

fn sigmoid(eg: &mut SirEGraph, id: Id) -> Vec<(Id, Id)> {
    let mut xs = vec![];
    for d in unary_args(eg, id, Recip) {
        xs.extend(one_plus_exp_neg(eg, d));
    }
    for (one, d) in binary_args(eg, id, Div) {
        if is_const(eg, one, 1.0) {
            xs.extend(one_plus_exp_neg(eg, d));
        }
    }
    xs.into_iter().filter_map(|x| mk(eg, Sigmoid, vec![], &[x]).map(|n| (id, n))).collect()
}

fn silu(eg: &mut SirEGraph, id: Id) -> Vec<(Id, Id)> {
    let mut xs = vec![];
    for (x, s) in comm_args(eg, id, Mul) {
        if unary_args(eg, s, Sigmoid).iter().any(|&y| same(eg, x, y)) {
            xs.push(x);
        }
    }
    for (x, d) in binary_args(eg, id, Div) {
        if one_plus_exp_neg(eg, d).iter().any(|&y| same(eg, x, y)) {
            xs.push(x);
        }
    }
    xs.into_iter().filter_map(|x| mk(eg, Silu, vec![], &[x]).map(|n| (id, n))).collect()
}

fn swiglu(eg: &mut SirEGraph, id: Id) -> Vec<(Id, Id)> {
    let mut plans = vec![];
    for (s, b) in comm_args(eg, id, Mul) {
        for a in unary_args(eg, s, Silu) {
            plans.push((a, b));
        }
    }
    plans.into_iter().filter_map(|(a, b)| mk(eg, Swiglu, vec![], &[a, b]).map(|n| (id, n))).collect()
}

// ---------------------------------------------------------------------------------------
// softmax family

/// `(x, axis)` for each `reduce_<kind>(x, axis, keepdim=true)` in class `id`.
fn keepdim_reductions(eg: &SirEGraph, id: Id, kind: OpKind) -> Vec<(Id, i64)> {
    nodes(eg, id, kind)
        .into_iter()
        .filter(|(op, _)| op.bool("keepdim") == Some(true))
        .filter_map(|(op, ch)| Some((ch[0], op.int("axis")?)))
        .collect()
}

/// `(x, axis)` such that class `e` is `exp(x − max(x, axis))` (safe) or `exp(x)` (then any
/// axis: `None`).
fn exp_sources(eg: &SirEGraph, e: Id) -> Vec<(Id, Option<i64>)> {
    let mut out = vec![];
    for y in unary_args(eg, e, Exp) {
        for (x, m) in binary_args(eg, y, Sub) {
            for (x2, axis) in keepdim_reductions(eg, m, ReduceMax) {
                if same(eg, x, x2) {
                    out.push((x, Some(axis)));
                }
            }
        }
        out.push((y, None));
    }
    out
}

fn softmax(eg: &mut SirEGraph, id: Id) -> Vec<(Id, Id)> {
    let mut quotients = binary_args(eg, id, Div);
    for (e, r) in comm_args(eg, id, Mul) {
        for s in unary_args(eg, r, Recip) {
            quotients.push((e, s));
        }
    }
    let mut plans = vec![];
    for (e, s) in quotients {
        for (e2, axis) in keepdim_reductions(eg, s, ReduceSum) {
            if !same(eg, e, e2) {
                continue;
            }
            for (x, ax) in exp_sources(eg, e) {
                if ax.is_none() || ax == Some(axis) {
                    plans.push((x, axis));
                }
            }
        }
    }
    plans.into_iter().filter_map(|(x, axis)| mk(eg, Softmax, vec![("axis", Attr::Int(axis))], &[x]).map(|n| (id, n))).collect()
}

/// `(x, axis)` such that class `l` is `log Σ exp(x − max x)` or `log Σ exp(x)` over `axis`;
/// the `bool` says whether the max was subtracted (then `m` is the max's class).
fn log_sum_exp(eg: &SirEGraph, l: Id) -> Vec<(Id, i64, Option<Id>)> {
    let mut out = vec![];
    for s in unary_args(eg, l, Log) {
        for (e, axis) in keepdim_reductions(eg, s, ReduceSum) {
            for y in unary_args(eg, e, Exp) {
                for (x, m) in binary_args(eg, y, Sub) {
                    if keepdim_reductions(eg, m, ReduceMax).iter().any(|&(x2, a2)| same(eg, x, x2) && a2 == axis) {
                        out.push((x, axis, Some(eg.find(m))));
                    }
                }
                out.push((y, axis, None));
            }
        }
    }
    out
}

fn log_softmax(eg: &mut SirEGraph, id: Id) -> Vec<(Id, Id)> {
    let mut plans = vec![];
    for (a, l) in binary_args(eg, id, Sub) {
        // (x − m) − log Σ exp(x − m)
        for (x, axis, m) in log_sum_exp(eg, l) {
            if let Some(m) = m {
                if binary_args(eg, a, Sub).iter().any(|&(x2, m2)| same(eg, x, x2) && same(eg, m, m2)) {
                    plans.push((x, axis));
                }
            } else if same(eg, a, x) {
                // x − log Σ exp(x): unsafe, oriented to the safe op.
                plans.push((x, axis));
            }
        }
        // x − (m + log Σ exp(x − m))
        for (m, l2) in comm_args(eg, l, Add) {
            for (x, axis, m2) in log_sum_exp(eg, l2) {
                if same(eg, a, x) && m2.is_some_and(|m2| same(eg, m, m2)) {
                    plans.push((x, axis));
                }
            }
        }
    }
    for p in unary_args(eg, id, Log) {
        for (op, ch) in nodes(eg, p, Softmax) {
            if let Some(axis) = op.int("axis") {
                plans.push((ch[0], axis));
            }
        }
    }
    plans.into_iter().filter_map(|(x, axis)| mk(eg, LogSoftmax, vec![("axis", Attr::Int(axis))], &[x]).map(|n| (id, n))).collect()
}

fn softmax_from_lse(eg: &mut SirEGraph, id: Id) -> Vec<(Id, Id)> {
    let mut plans = vec![];
    for y in unary_args(eg, id, Exp) {
        for (op, ch) in nodes(eg, y, LogSoftmax) {
            if let Some(axis) = op.int("axis") {
                plans.push((ch[0], axis));
            }
        }
    }
    plans.into_iter().filter_map(|(x, axis)| mk(eg, Softmax, vec![("axis", Attr::Int(axis))], &[x]).map(|n| (id, n))).collect()
}

// ---------------------------------------------------------------------------------------
// norms

/// The classes `q` such that class `id` is the mean of `q` over its last axis with keepdim:
/// `reduce_mean(q)`, `reduce_sum(q)/n` or `reduce_sum(q)·(1/n)` with `n` the axis size.
fn mean_last(eg: &SirEGraph, id: Id) -> Vec<Id> {
    let mut out: Vec<Id> = keepdim_reductions(eg, id, ReduceMean).into_iter().filter(|&(_, a)| a == -1).map(|(q, _)| q).collect();
    let sums = |s: Id| -> Vec<(Id, i64)> {
        keepdim_reductions(eg, s, ReduceSum)
            .into_iter()
            .filter(|&(_, a)| a == -1)
            .filter_map(|(q, _)| Some((q, ty(eg, q)?.shape.last()?.as_const()?)))
            .collect()
    };
    for (s, n) in binary_args(eg, id, Div) {
        for (q, d) in sums(s) {
            if is_const(eg, n, d as f64) {
                out.push(q);
            }
        }
    }
    for (s, r) in comm_args(eg, id, Mul) {
        for (q, d) in sums(s) {
            if d > 0 && is_const_near(eg, r, 1.0 / d as f64) {
                out.push(q);
            }
        }
    }
    out
}

/// The classes `x` such that class `q` is `x·x` or `x²`.
fn squares(eg: &SirEGraph, q: Id) -> Vec<Id> {
    let mut out: Vec<Id> = binary_args(eg, q, Mul).into_iter().filter(|&(a, b)| same(eg, a, b)).map(|(a, _)| a).collect();
    out.extend(binary_args(eg, q, Pow).into_iter().filter(|&(_, e)| is_const(eg, e, 2.0)).map(|(a, _)| a));
    out
}

/// `(v, eps)` such that class `v_eps` is `v + eps` (either order) with a scalar constant eps.
/// The constant is read as written (`1e-5`) when the class holds a `constant` node; the norms
/// round `eps` to f32 as the graph's f32 constant is, so both spellings give the same value.
fn plus_eps(eg: &SirEGraph, v_eps: Id) -> Vec<(Id, f64)> {
    comm_args(eg, v_eps, Add)
        .into_iter()
        .filter_map(|(v, e)| {
            let k = scalar_const(eg, e)?;
            let written = nodes(eg, e, Constant).into_iter().filter_map(|(op, _)| op.float("value")).find(|w| (*w as f32) as f64 == k);
            Some((v, written.unwrap_or(k)))
        })
        .collect()
}

/// `(x, v_eps)` such that class `n` is `x · rsqrt(v_eps)` in any of its spellings
/// (`x·rsqrt(·)`, `x·recip(sqrt(·))`, `x·(1/sqrt(·))`, `x/sqrt(·)`).
fn times_rsqrt(eg: &SirEGraph, n: Id) -> Vec<(Id, Id)> {
    let mut out = vec![];
    for (x, r) in comm_args(eg, n, Mul) {
        out.extend(unary_args(eg, r, Rsqrt).into_iter().map(|v| (x, v)));
        for sq in unary_args(eg, r, Recip) {
            out.extend(unary_args(eg, sq, Sqrt).into_iter().map(|v| (x, v)));
        }
        for (one, sq) in binary_args(eg, r, Div) {
            if is_const(eg, one, 1.0) {
                out.extend(unary_args(eg, sq, Sqrt).into_iter().map(|v| (x, v)));
            }
        }
    }
    for (x, sq) in binary_args(eg, n, Div) {
        out.extend(unary_args(eg, sq, Sqrt).into_iter().map(|v| (x, v)));
    }
    out
}

/// `(x32, eps)` such that class `n` is `x32 · rsqrt(mean(x32²) + eps)`.
fn rms_normalized(eg: &SirEGraph, n: Id) -> Vec<(Id, f64)> {
    let mut out = vec![];
    for (x, v_eps) in times_rsqrt(eg, n) {
        for (ms, eps) in plus_eps(eg, v_eps) {
            for q in mean_last(eg, ms) {
                if squares(eg, q).iter().any(|&y| same(eg, x, y)) {
                    out.push((x, eps));
                }
            }
        }
    }
    out
}

/// `(x32, eps)` such that class `n` is `(x32 − mean x32) · rsqrt(var + eps)`.
fn ln_normalized(eg: &SirEGraph, n: Id) -> Vec<(Id, f64)> {
    let mut out = vec![];
    for (xc, v_eps) in times_rsqrt(eg, n) {
        for (var, eps) in plus_eps(eg, v_eps) {
            for q in mean_last(eg, var) {
                if !squares(eg, q).iter().any(|&y| same(eg, xc, y)) {
                    continue;
                }
                for (x, mu) in binary_args(eg, xc, Sub) {
                    if mean_last(eg, mu).iter().any(|&y| same(eg, x, y)) {
                        out.push((x, eps));
                    }
                }
            }
        }
    }
    out
}

/// The original-dtype values `x` of dtype `dt` behind an f32 value `x32`: `x32 = cast(x, f32)`
/// or, when `dt` is f32, `x32` itself.
fn uncast(eg: &SirEGraph, x32: Id, dt: DType) -> Vec<Id> {
    let mut out: Vec<Id> = unary_args(eg, x32, Cast).into_iter().filter(|&x| ty(eg, x).is_some_and(|t| t.dtype == dt)).collect();
    if ty(eg, x32).is_some_and(|t| t.dtype == dt) {
        out.push(x32);
    }
    out
}

/// `n` such that class `h` (of dtype `dt`) is `cast(n: f32, dt)`, or `h` itself when f32.
fn cast_back(eg: &SirEGraph, h: Id, dt: DType) -> Vec<Id> {
    let mut out: Vec<Id> = unary_args(eg, h, Cast).into_iter().filter(|&n| ty(eg, n).is_some_and(|t| t.dtype == DType::F32)).collect();
    if dt == DType::F32 {
        out.push(h);
    }
    out
}

fn is_weight_for(eg: &SirEGraph, w: Id, d: &Dim, dt: DType) -> bool {
    ty(eg, w).is_some_and(|t| t.dtype == dt && t.shape.len() == 1 && &t.shape[0] == d)
}

fn rms_norm(eg: &mut SirEGraph, id: Id) -> Vec<(Id, Id)> {
    let Some(t) = ty(eg, id) else { return vec![] };
    let Some(d) = last_dim(&t) else { return vec![] };
    let dt = t.dtype;
    if !dt.is_float() {
        return vec![];
    }
    let mut plans = vec![];
    // (A) cast(normalized, dt) · w — the weight after the cast back (Llama / HF).
    for (h, w) in comm_args(eg, id, Mul) {
        if !is_weight_for(eg, w, &d, dt) {
            continue;
        }
        for n in cast_back(eg, h, dt) {
            for (x32, eps) in rms_normalized(eg, n) {
                for x in uncast(eg, x32, dt) {
                    plans.push((x, w, eps));
                }
            }
        }
    }
    // Not `cast(normalized · w32, dt)`, the weight applied in f32 before one rounding to
    // `dt` (Gemma's `(1 + w)`, or any weight in f32): `rms_norm` in `dt` rounds the
    // normalised value to `dt` before the weight, a rounding point the graph does not have.
    // (A) at f32 takes the inner `normalized · w32` as `rms_norm` on f32 instead, and the
    // written cast stays.
    plans.into_iter().filter_map(|(x, w, eps)| mk(eg, RmsNorm, vec![("eps", Attr::Float(eps))], &[x, w]).map(|n| (id, n))).collect()
}

fn layer_norm(eg: &mut SirEGraph, id: Id) -> Vec<(Id, Id)> {
    let Some(t) = ty(eg, id) else { return vec![] };
    let Some(d) = last_dim(&t) else { return vec![] };
    let dt = t.dtype;
    if !dt.is_float() {
        return vec![];
    }
    let mut plans = vec![];
    for (mw, b) in comm_args(eg, id, Add) {
        if !is_weight_for(eg, b, &d, dt) {
            continue;
        }
        for (h, w) in comm_args(eg, mw, Mul) {
            if !is_weight_for(eg, w, &d, dt) {
                continue;
            }
            for n in cast_back(eg, h, dt) {
                for (x32, eps) in ln_normalized(eg, n) {
                    for x in uncast(eg, x32, dt) {
                        plans.push((x, w, b, eps));
                    }
                }
            }
        }
    }
    plans
        .into_iter()
        .filter_map(|(x, w, b, eps)| mk(eg, LayerNorm, vec![("eps", Attr::Float(eps))], &[x, w, b]).map(|n| (id, n)))
        .collect()
}

// ---------------------------------------------------------------------------------------
// attention

/// `(inner, factor)`: class `id` is `inner · factor` for a scalar constant factor (`x·c`,
/// `c·x`, `x/c`), one level deep; always includes `(id, 1)`.
fn scalar_factors(eg: &SirEGraph, id: Id) -> Vec<(Id, f64)> {
    let mut out = vec![(eg.find(id), 1.0)];
    for (x, c) in comm_args(eg, id, Mul) {
        if let Some(v) = scalar_const(eg, c) {
            out.push((x, v));
        }
    }
    for (x, c) in binary_args(eg, id, Div) {
        if let Some(v) = scalar_const(eg, c) {
            if v != 0.0 {
                out.push((x, 1.0 / v));
            }
        }
    }
    out
}

/// An iota with values equal to the index along `axis` counted from the end.
fn is_iota_along(eg: &SirEGraph, id: Id, from_end: usize) -> bool {
    let Some(t) = ty(eg, id) else { return false };
    nodes(eg, id, Iota).iter().any(|(op, _)| op.int("axis").is_some_and(|a| a as usize + from_end == t.rank()))
}

/// Whether a bool class is "key j visible from query i" for a causal mask (`i >= j`, `j <= i`)
/// (`keep = true`) or "key j hidden" (`j > i`, `i < j`) (`keep = false`).
fn is_causal_cond(eg: &SirEGraph, c: Id, keep: bool) -> bool {
    let (ge, le) = if keep { (Ge, Le) } else { (Lt, Gt) };
    // keep: row >= col  or  col <= row;  hide: row < col  or  col > row.
    binary_args(eg, c, ge).iter().any(|&(a, b)| is_iota_along(eg, a, 2) && is_iota_along(eg, b, 1))
        || binary_args(eg, c, le).iter().any(|&(a, b)| is_iota_along(eg, a, 1) && is_iota_along(eg, b, 2))
}

/// The causal-mask pattern `select(visible, 0, −inf)` / `select(hidden, −inf, 0)`.
fn is_causal_additive(eg: &SirEGraph, m: Id) -> bool {
    nodes(eg, m, Select).iter().any(|(_, ch)| {
        (is_const(eg, ch[1], 0.0) && is_const(eg, ch[2], f64::NEG_INFINITY) && is_causal_cond(eg, ch[0], true))
            || (is_const(eg, ch[1], f64::NEG_INFINITY) && is_const(eg, ch[2], 0.0) && is_causal_cond(eg, ch[0], false))
    })
}

#[derive(Clone, Copy, Debug)]
enum Mask {
    None,
    Additive(Id),
    /// `select(cond, scores, −inf)`: keep where cond (`false`); `select(cond, −inf, scores)`:
    /// hide where cond (`true`, PyTorch's `masked_fill(cond, −inf)`).
    Keep(Id, bool),
}

/// `(scores, mask)` alternatives for the softmax input `z`.
fn masked_scores(eg: &SirEGraph, z: Id) -> Vec<(Id, Mask)> {
    let mut out = vec![(eg.find(z), Mask::None)];
    for (s, m) in comm_args(eg, z, Add) {
        out.push((s, Mask::Additive(m)));
    }
    for (_, ch) in nodes(eg, z, Select) {
        if is_const(eg, ch[2], f64::NEG_INFINITY) {
            out.push((ch[1], Mask::Keep(ch[0], false)));
        }
        if is_const(eg, ch[1], f64::NEG_INFINITY) {
            out.push((ch[2], Mask::Keep(ch[0], true)));
        }
    }
    out
}

/// The softmax inputs `z` (in dtype `dt`, over the last axis) behind the probabilities `p`:
/// `softmax(z)`, `cast(softmax(cast(z, f32)), dt)`, `softmax(cast(z, f32))` with p f32.
fn softmax_inputs(eg: &SirEGraph, p: Id, dt: DType) -> Vec<Id> {
    let mut probs = vec![eg.find(p)];
    probs.extend(unary_args(eg, p, Cast));
    let mut out = vec![];
    for pr in probs {
        for (op, ch) in nodes(eg, pr, Softmax) {
            if op.int("axis") != Some(-1) {
                continue;
            }
            let y = ch[0];
            if ty(eg, y).is_some_and(|t| t.dtype == dt) {
                out.push(y);
            }
            for z in unary_args(eg, y, Cast) {
                if ty(eg, z).is_some_and(|t| t.dtype == dt) {
                    out.push(z);
                }
            }
        }
    }
    out
}

/// Heads-split sources of an operand of logical shape `[.., H, S, D]` (rank 3 or 4; class
/// `id` holds it, or a reshape of it): `(x, bshd, to)` where `x` is the same tensor in
/// `[.., S, H, D]` order: with one head (`H = 1`) the class itself reshaped to `[.., S, 1,
/// D]` (`to`: that shape, the same row-major order), else when the class is a head/sequence
/// transpose of `x` (`to` = `None`); and the class itself as `[.., H, S, D]`.
fn head_sources(eg: &SirEGraph, id: Id, shape: &[Dim]) -> Vec<(Id, bool, Option<Vec<Dim>>)> {
    let r = shape.len();
    let swap: Vec<i64> = if r == 3 { vec![1, 0, 2] } else { vec![0, 2, 1, 3] };
    let mut out = vec![];
    // One head first: the class as it is, not a spelling of it through the permute.
    if r >= 3 && shape[r - 3].is_one() {
        let mut s = shape.to_vec();
        s.swap(r - 3, r - 2);
        out.push((eg.find(id), true, Some(s)));
    }
    if ty(eg, id).is_some_and(|t| t.shape == shape) {
        for (op, ch) in nodes(eg, id, Permute) {
            if op.ints("perm") == Some(&swap[..]) {
                out.push((ch[0], true, None));
            }
        }
    }
    out.push((eg.find(id), false, Some(shape.to_vec())));
    out
}

/// GQA: `(k0, hkv, shape)` where class `k` ([.., H, S, D]) is `reshape(broadcast(reshape(k0,
/// [.., Hkv, 1, S, D]), [.., Hkv, G, S, D]), [.., H, S, D])` (`k0` holds the `[.., Hkv, S,
/// D]` = `shape` tensor, or a reshape of it), or `(k, H, [.., H, S, D])`.
fn kv_heads(eg: &SirEGraph, k: Id) -> Vec<(Id, Dim, Vec<Dim>)> {
    let Some(t) = ty(eg, k) else { return vec![] };
    let r = t.rank();
    let mut out = vec![];
    for bc in unary_args(eg, k, Reshape) {
        let Some(tb) = ty(eg, bc) else { continue };
        if tb.rank() != r + 1 {
            continue;
        }
        for r1 in unary_args(eg, bc, Broadcast) {
            let Some(t1) = ty(eg, r1) else { continue };
            if t1.rank() != r + 1 || !t1.shape[r - 2].is_one() {
                continue;
            }
            for k0 in unary_args(eg, r1, Reshape) {
                let hkv = t1.shape[r - 3].clone();
                let mut want = t.shape.clone();
                want[r - 3] = hkv.clone();
                if tb.shape[r - 3] == hkv {
                    out.push((k0, hkv, want));
                }
            }
        }
    }
    out.push((eg.find(k), t.shape[r - 3].clone(), t.shape.clone()));
    out
}

struct AttnPlan {
    softcap: Option<f64>,
    window: Option<i64>,
    q: Id,
    k: Id,
    v: Id,
    mask: Option<Id>,
    make_mask: Option<Id>,
    scale: f64,
    causal: bool,
    heads: i64,
    kv_heads: i64,
    bshd: bool,
    /// q, k, v: the shape each is reshaped to first, if any ([`head_sources`]).
    shapes: [Option<Vec<Dim>>; 3],
    rank: usize,
}

fn attention(eg: &mut SirEGraph, id: Id) -> Vec<(Id, Id)> {
    attention_with(eg, id, false)
}

/// The `attention` rule's matcher; with `softcapped` it matches only scores under a logit
/// softcap `c·tanh(s/c)` ([`super::masks::softcapped`]) and folds `c` into the op.
pub(super) fn attention_with(eg: &mut SirEGraph, id: Id, softcapped: bool) -> Vec<(Id, Id)> {
    let Some(t_out) = ty(eg, id) else { return vec![] };
    let r = t_out.rank();
    if !(r == 3 || r == 4) || !t_out.dtype.is_float() {
        return vec![];
    }
    let dt = t_out.dtype;
    let mut plans: Vec<AttnPlan> = vec![];
    for (op, ch) in nodes(eg, id, Matmul) {
        if op.bool("transpose_a") == Some(true) || op.bool("transpose_b") == Some(true) {
            continue;
        }
        let (p, v) = (ch[0], ch[1]);
        for z in softmax_inputs(eg, p, dt) {
            for (s0, mask) in masked_scores(eg, z) {
                let capped: Vec<(Id, Option<f64>)> = if softcapped { super::masks::softcapped(eg, s0).into_iter().map(|(x, c)| (x, Some(c))).collect() } else { vec![(s0, None)] };
                for (s, softcap) in capped {
                    for (inner, f) in scalar_factors(eg, s) {
                        for (mop, mch) in nodes(eg, inner, Matmul) {
                            if mop.bool("transpose_a") == Some(true) || mop.bool("transpose_b") != Some(true) {
                                continue;
                            }
                            for (q, fq) in scalar_factors(eg, mch[0]) {
                                for (k, fk) in scalar_factors(eg, mch[1]) {
                                    if let Some(mut plan) = attention_plan(eg, q, k, v, mask, f * fq * fk, r) {
                                        plan.softcap = softcap;
                                        plans.push(plan);
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    let mut out = vec![];
    for plan in plans {
        if let Some(n) = build_attention(eg, &plan, &t_out) {
            out.push((id, n));
        }
    }
    out
}

fn attention_plan(eg: &SirEGraph, q: Id, k: Id, v: Id, mask: Mask, scale: f64, r: usize) -> Option<AttnPlan> {
    let (tq, tk, tv) = (ty(eg, q)?, ty(eg, k)?, ty(eg, v)?);
    if tq.rank() != r || tk.rank() != r || tv.rank() != r || tq.dtype != tv.dtype || tk.dtype != tv.dtype {
        return None;
    }
    let heads = tq.shape[r - 3].as_const()?;
    let (sq, skv) = (tq.shape[r - 2].clone(), tk.shape[r - 2].clone());
    // K and V must agree on the KV heads.
    let mut best: Option<AttnPlan> = None;
    for (k0, hk, ks0) in kv_heads(eg, k) {
        for (v0, hv, vs0) in kv_heads(eg, v) {
            if hk != hv {
                continue;
            }
            let kv_heads = hk.as_const()?;
            if kv_heads <= 0 || heads % kv_heads != 0 {
                continue;
            }
            let (mut causal, mut maskv, mut make_mask, mut window) = (false, None, None, None);
            match mask {
                Mask::None => {}
                Mask::Additive(m) => {
                    if is_causal_additive(eg, m) && sq == skv {
                        causal = true;
                    } else {
                        maskv = Some(m);
                    }
                }
                Mask::Keep(c, hide) => {
                    // Hiding by select is what the op's causal/window do (a hidden NaN score
                    // is never read): fold it here, not through an additive mask.
                    if let Some(w) = skv.sub(&sq).as_const().and_then(|off| super::masks::keep_is_causal(eg, c, hide, off)) {
                        causal = true;
                        window = w;
                    } else if is_causal_cond(eg, c, !hide) && sq == skv {
                        causal = true;
                    } else if hide {
                        // A hide condition that is no causal mask stays written out: as a
                        // mask operand, a hidden key's NaN in V would reach the output
                        // (0·NaN), which the select never lets through.
                        continue;
                    } else {
                        make_mask = Some(c);
                    }
                }
            }
            // Layout: bshd when all three are head/sequence transposes, else bhsd.
            let qs = head_sources(eg, q, &tq.shape);
            let ks = head_sources(eg, k0, &ks0);
            let vs = head_sources(eg, v0, &vs0);
            let pick = |srcs: &[(Id, bool, Option<Vec<Dim>>)], bshd: bool| srcs.iter().find(|s| s.1 == bshd).map(|s| (s.0, s.2.clone()));
            for bshd in [true, false] {
                if let (Some((q1, sq1)), Some((k1, sk1)), Some((v1, sv1))) = (pick(&qs, bshd), pick(&ks, bshd), pick(&vs, bshd)) {
                    let shapes = [sq1, sk1, sv1];
                    // One head everywhere: both layouts are the same, keep bhsd.
                    if bshd && shapes.iter().all(Option::is_some) {
                        continue;
                    }
                    let plan = AttnPlan { softcap: None, window, q: q1, k: k1, v: v1, mask: maskv, make_mask, scale, causal, heads, kv_heads, bshd, shapes, rank: r };
                    // The first plan, or a later bshd one with as many KV heads (another
                    // spelling of the same K or V may carry the transpose).
                    if best.as_ref().is_none_or(|b| plan.bshd && !b.bshd && b.kv_heads == plan.kv_heads) {
                        best = Some(plan);
                    }
                    break;
                }
            }
            if best.as_ref().is_some_and(|b| b.bshd) {
                return best;
            }
        }
    }
    best
}

fn to_rank4(eg: &mut SirEGraph, x: Id) -> Option<Id> {
    let t = ty(eg, x)?;
    if t.rank() == 4 {
        return Some(eg.find(x));
    }
    let mut s = vec![Dim::constant(1)];
    s.extend(t.shape.iter().cloned());
    reshape(eg, x, &s)
}

fn build_attention(eg: &mut SirEGraph, p: &AttnPlan, t_out: &TensorType) -> Option<Id> {
    let mut qkv = [p.q, p.k, p.v];
    for (x, to) in qkv.iter_mut().zip(&p.shapes) {
        if let Some(s) = to {
            *x = reshape(eg, *x, s)?;
        }
    }
    let q4 = to_rank4(eg, qkv[0])?;
    let k4 = to_rank4(eg, qkv[1])?;
    let v4 = to_rank4(eg, qkv[2])?;
    let mut ch = vec![q4, k4, v4];
    let mask = match (p.mask, p.make_mask) {
        (Some(m), _) => Some(m),
        (None, Some(c)) => {
            let dt = ty(eg, p.v)?.dtype;
            let z = constant(eg, 0.0, dt)?;
            let ninf = constant(eg, f64::NEG_INFINITY, dt)?;
            mk(eg, Select, vec![], &[c, z, ninf])
        }
        (None, None) => None,
    };
    if let Some(m) = mask {
        ch.push(m);
    }
    let attrs = vec![
        ("scale", Attr::Float(p.scale)),
        ("causal", Attr::Bool(p.causal)),
        ("heads", Attr::Int(p.heads)),
        ("kv_heads", Attr::Int(p.kv_heads)),
        ("layout", Attr::Str(if p.bshd { "bshd" } else { "bhsd" }.into())),
    ];
    let mut attrs = attrs;
    if let Some(c) = p.softcap {
        attrs.push(("softcap", Attr::Float(c)));
    }
    if let Some(w) = p.window {
        attrs.push(("window", Attr::Int(w)));
    }
    let att = mk(eg, Attention, attrs, &ch)?;
    let r = p.rank;
    if !p.bshd {
        return reshape(eg, att, &t_out.shape);
    }
    // [B, Sq, H, Dv] → the matmul's [.., H, Sq, Dv].
    let ta = ty(eg, att)?;
    if r == 3 {
        let s3 = vec![ta.shape[1].clone(), ta.shape[2].clone(), ta.shape[3].clone()];
        let x = reshape(eg, att, &s3)?;
        permute(eg, x, &[1, 0, 2])
    } else {
        permute(eg, att, &[0, 2, 1, 3])
    }
}

// ---------------------------------------------------------------------------------------
// RoPE

/// Strips views and casts that keep the element order: `reshape`, `cast`, and `broadcast`
/// that only adds size-1... (here: any reshape/cast). Returns every class reached.
fn through_views(eg: &SirEGraph, id: Id) -> Vec<Id> {
    let mut out = vec![eg.find(id)];
    let mut i = 0;
    while i < out.len() && out.len() < 16 {
        let c = out[i];
        for k in [Reshape, Cast] {
            for x in unary_args(eg, c, k) {
                if !out.contains(&x) {
                    out.push(x);
                }
            }
        }
        i += 1;
    }
    out
}

/// θ such that the closed class `f` holds `θ^(−2i/D)` for i in 0..D/2 (`D = 2·len`).
fn rope_theta(eg: &SirEGraph, f: Id) -> Option<f64> {
    let t = crate::eval::closed_value(eg, f)?;
    let v = t.data();
    let half = v.len();
    if half < 2 || t.rank() != 1 {
        return None;
    }
    let d = 2.0 * half as f64;
    if !(v[1] > 0.0 && v[1] < 1.0) {
        return None;
    }
    let theta = (-(d / 2.0) * v[1].ln()).exp();
    let fits = |theta: f64| {
        v.iter().enumerate().all(|(i, &x)| {
            let want = theta.powf(-(2.0 * i as f64) / d);
            (x - want).abs() <= 1e-5 * want.abs()
        })
    };
    // The tables were computed in f32: prefer θ rounded to 6 significant digits (10000,
    // 500000) when it explains them as well.
    let nice: f64 = format!("{theta:.5e}").parse().unwrap_or(theta);
    if fits(nice) {
        Some(nice)
    } else if fits(theta) {
        Some(theta)
    } else {
        None
    }
}

/// `(positions, θ)` such that class `f` is `pos · inv_freq` (either order) with `pos` an
/// integer tensor (cast to float, reshaped) of shape `[.., 1]` and `inv_freq` closed.
fn angles(eg: &SirEGraph, f: Id) -> Vec<(Id, f64)> {
    let mut out = vec![];
    for (pp, invf) in comm_args(eg, f, Mul) {
        let Some(tp) = ty(eg, pp) else { continue };
        if !tp.shape.last().is_some_and(Dim::is_one) {
            continue;
        }
        let Some(theta) = rope_theta(eg, invf) else { continue };
        for src in through_views(eg, pp) {
            if ty(eg, src).is_some_and(|t| t.dtype.is_int()) {
                out.push((src, theta));
            }
        }
    }
    out
}

/// `(f, table_shape)` for each class `c` that is a view/cast of `trig(f)`.
fn trig_of(eg: &SirEGraph, c: Id, trig: OpKind) -> Vec<Id> {
    let mut out = vec![];
    for v in through_views(eg, c) {
        out.extend(unary_args(eg, v, trig));
    }
    out
}

/// `(indices, F)` for each way class `c` is a view/cast of `gather(trig(F), indices)`.
fn gathered_trig(eg: &SirEGraph, c: Id, trig: OpKind) -> Vec<(Id, Id)> {
    let mut out = vec![];
    for v in through_views(eg, c) {
        for (_, ch) in nodes(eg, v, Gather) {
            if ch.len() == 2 {
                out.extend(trig_of(eg, ch[0], trig).into_iter().map(|f| (ch[1], f)));
            }
        }
    }
    out
}

/// θ such that class `f` is the angle table `rows · inv_freq` (either order) of every
/// position: `rows` closed, of shape `[L, 1]`, holding 0, 1, …, L−1 (an `iota`, cast or not),
/// so that row `p` of the table is position `p`'s angles.
fn row_angles(eg: &SirEGraph, f: Id) -> Option<f64> {
    if ty(eg, f)?.rank() != 2 {
        return None;
    }
    for (rows, invf) in comm_args(eg, f, Mul) {
        let Some(t) = crate::eval::closed_value(eg, rows) else { continue };
        let counts = t.rank() == 2 && t.shape()[1] == 1 && t.data().iter().enumerate().all(|(i, &v)| v == i as f64);
        if !counts {
            continue;
        }
        if let Some(theta) = rope_theta(eg, invf) {
            return Some(theta);
        }
    }
    None
}

/// `(xa, xb, c, s)` such that `a = xa·c − xb·s` and `b = xb·c + xa·s` (any operand orders).
fn rotation(eg: &SirEGraph, a: Id, b: Id) -> Vec<(Id, Id, Id, Id)> {
    let mut out = vec![];
    for (ac, bs) in binary_args(eg, a, Sub) {
        for (xa, c) in comm_args(eg, ac, Mul) {
            for (xb, s) in comm_args(eg, bs, Mul) {
                for (bc, as_) in comm_args(eg, b, Add) {
                    let ok1 = comm_args(eg, bc, Mul).iter().any(|&(x, y)| same(eg, x, xb) && same(eg, y, c));
                    let ok2 = comm_args(eg, as_, Mul).iter().any(|&(x, y)| same(eg, x, xa) && same(eg, y, s));
                    if ok1 && ok2 {
                        out.push((xa, xb, c, s));
                    }
                }
            }
        }
    }
    out
}

/// The rope node for `x` given a cos table class `c`, a sin table class `s` (views of
/// `cos(F)`/`sin(F)` with `F = pos·inv_freq` or `concat(F', F')` when `doubled`).
fn rope_from_tables(eg: &mut SirEGraph, x: Id, c: Id, s: Id, doubled: bool, form: &str, table_lead: usize) -> Option<Id> {
    let tc = ty(eg, c)?;
    let tx = ty(eg, x)?;
    let inner = |eg: &SirEGraph, fc: Id| -> Vec<Id> {
        if doubled {
            nodes(eg, fc, Concat).into_iter().filter(|(op, ch)| op.int("axis") == Some(-1) && ch.len() == 2 && same(eg, ch[0], ch[1])).map(|(_, ch)| ch[0]).collect()
        } else {
            vec![fc]
        }
    };
    let mut found = None;
    'outer: for fc in trig_of(eg, c, Cos) {
        for fs in trig_of(eg, s, Sin) {
            if !same(eg, fc, fs) {
                continue;
            }
            for f in inner(eg, fc) {
                if let Some(a) = angles(eg, f).into_iter().next() {
                    found = Some(a);
                    break 'outer;
                }
            }
        }
    }
    // Tables of every position, built in the graph and indexed by the positions (a cos/sin
    // cache gathered by position ids): the indices are the positions.
    if found.is_none() {
        'tables: for (ic, fc) in gathered_trig(eg, c, Cos) {
            for (is, fs) in gathered_trig(eg, s, Sin) {
                if !(same(eg, ic, is) && same(eg, fc, fs)) {
                    continue;
                }
                for f in inner(eg, fc) {
                    if let Some(theta) = row_angles(eg, f) {
                        found = Some((ic, theta));
                        break 'tables;
                    }
                }
            }
        }
    }
    let (pos, theta) = found?;
    if !ty(eg, pos)?.dtype.is_int() {
        return None;
    }
    // The table's leading axes (without its last `table_lead` axes) index the rows of x.
    let lead: Vec<Dim> = tc.shape[..tc.rank().checked_sub(table_lead)?].to_vec();
    let tp = ty(eg, pos)?;
    if tp.numel() != Dim::product(&lead) {
        return None;
    }
    let pos_r = reshape(eg, pos, &lead)?;
    let _ = tx;
    mk(eg, Rope, vec![("theta", Attr::Float(theta)), ("form", Attr::Str(form.into()))], &[x, pos_r])
}

fn is_slice(eg: &SirEGraph, id: Id, x: Id, start: &Dim, end: &Dim) -> bool {
    nodes(eg, id, Slice).iter().any(|(op, ch)| same(eg, ch[0], x) && op.int("axis") == Some(-1) && op.dim("start") == Some(start) && op.dim("end") == Some(end))
}

fn rope_rotate_half(eg: &mut SirEGraph, id: Id) -> Vec<(Id, Id)> {
    let Some(t) = ty(eg, id) else { return vec![] };
    if last_dim(&t).and_then(|d| d.as_const()).is_none_or(|d| d < 4) {
        return vec![];
    }
    let plans = super::rotary::rotations(eg, id, super::rotary::is_rotate_half);
    plans.into_iter().filter_map(|(x, c, s)| rope_from_tables(eg, x, c, s, true, "rotate_half", 1).map(|n| (id, n))).collect()
}

fn rope_halves(eg: &mut SirEGraph, id: Id) -> Vec<(Id, Id)> {
    let Some(t) = ty(eg, id) else { return vec![] };
    let Some(d) = last_dim(&t).and_then(|d| d.as_const()) else { return vec![] };
    if d % 2 != 0 || d < 4 {
        return vec![];
    }
    let (zero, half, full) = (Dim::constant(0), Dim::constant(d / 2), Dim::constant(d));
    let mut plans = vec![];
    for (op, ch) in nodes(eg, id, Concat) {
        if op.int("axis") != Some(-1) || ch.len() != 2 {
            continue;
        }
        for (x1, x2, c, s) in rotation(eg, ch[0], ch[1]) {
            for (_, sch) in nodes(eg, x1, Slice) {
                let x = sch[0];
                if ty(eg, x).as_ref() == Some(&t) && is_slice(eg, x1, x, &zero, &half) && is_slice(eg, x2, x, &half, &full) {
                    plans.push((x, c, s));
                }
            }
        }
    }
    plans.into_iter().filter_map(|(x, c, s)| rope_from_tables(eg, x, c, s, false, "rotate_half", 1).map(|n| (id, n))).collect()
}

fn rope_interleaved(eg: &mut SirEGraph, id: Id) -> Vec<(Id, Id)> {
    let Some(t) = ty(eg, id) else { return vec![] };
    let Some(d) = last_dim(&t).and_then(|d| d.as_const()) else { return vec![] };
    if d % 2 != 0 || d < 4 {
        return vec![];
    }
    let (zero, one, two) = (Dim::constant(0), Dim::constant(1), Dim::constant(2));
    let mut plans = vec![];
    for cc in unary_args(eg, id, Reshape) {
        for (op, ch) in nodes(eg, cc, Concat) {
            if op.int("axis") != Some(-1) || ch.len() != 2 {
                continue;
            }
            for (x0, x1, c, s) in rotation(eg, ch[0], ch[1]) {
                for (_, sch) in nodes(eg, x0, Slice) {
                    let xr = sch[0];
                    if !(is_slice(eg, x0, xr, &zero, &one) && is_slice(eg, x1, xr, &one, &two)) {
                        continue;
                    }
                    for x in unary_args(eg, xr, Reshape) {
                        let txr = ty(eg, xr);
                        let ok = ty(eg, x).as_ref() == Some(&t)
                            && txr.is_some_and(|txr| txr.rank() == t.rank() + 1 && txr.shape[txr.rank() - 1] == two && txr.shape[..t.rank() - 1] == t.shape[..t.rank() - 1]);
                        if ok {
                            plans.push((x, c, s));
                        }
                    }
                }
            }
        }
    }
    plans.into_iter().filter_map(|(x, c, s)| rope_from_tables(eg, x, c, s, false, "interleaved", 2).map(|n| (id, n))).collect()
}
