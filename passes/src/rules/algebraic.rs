//! Algebraic rules: canonical forms and simplifications that are exact in the interpreter's
//! semantics (same values, same rounding points), so they may run in any order.
//!
//! | rule | rewrite | why it is exact |
//! |---|---|---|
//! | `cast-noop` | `cast(x: t, t)` → `x` | rounding to the dtype a value already has |
//! | `cast-roundtrip` | `cast(cast(x: t, w), t)` → `x` when `w` holds every `t` exactly (bf16/f16→f32, i32→i64) | the widening is exact and the narrowing rounds back |
//! | `permute-identity` | `permute(x, [0, 1, …])` → `x` | |
//! | `permute-permute` | `permute(permute(x, p), q)` → `permute(x, p∘q)` | composition of index maps |
//! | `permute-unit-axes` | a permute that moves only size-1 axes → `reshape` | row-major order unchanged |
//! | `reshape-noop`, `reshape-reshape` | `reshape(x, shape(x))` → `x`; `reshape(reshape(x, a), b)` → `reshape(x, b)` | row-major order |
//! | `broadcast-noop` | `broadcast(x, shape(x))` → `x` | |
//! | `mul-one`, `div-one`, `add-zero`, `sub-zero` | `x·1`, `1·x`, `x/1`, `x+0`, `0+x`, `x−0` → `x` when the result has x's type and the constant is exactly 1 or 0 | IEEE identities (−0 + 0 = +0 compares equal) |
//! | `neg-canonical` | `x·(−1)`, `(−1)·x`, `0−x` → `neg(x)` | exact negation |
//! | `neg-neg` | `neg(neg(x))` → `x` | |
//! | `fold-constants` | an element-wise op on scalar constants → the constant, computed by the interpreter | the reference computes it |
//! | `hoist-broadcast-unary` | `u(broadcast(x))` → `broadcast(u(x))` | element-wise: fewer elements computed |
//! | `hoist-broadcast-binary` | `b(broadcast(x), y)` → `broadcast(b(x, y))` when `y` fits x's shape | same elements, fewer computed |
//! | `absorb-broadcast` | `b(broadcast(x, S), y: S)` → `b(x, y)` | the op broadcasts implicitly |
//! | `matmul-fold-transpose` | `matmul(a, permute(b, swap last two))` → `matmul(a, b, transpose_b=!t)`, likewise for `a` | a transpose is a stride choice of the GEMM |

use egg::Id;
use sinter_ir::infer::broadcast_shapes;
use sinter_ir::{Attr, Bindings, OpClass, OpKind, TensorType};

use super::{add, binary_args, comm_args, constant, is_const, mk, nodes, permute, scalar_const, ty, unary_args, RuleTable};
use crate::lang::{widens_exactly, Sir, SirEGraph};

use OpKind::*;

/// The algebraic rules: name, doc line, trigger ops, body.
pub static RULES: RuleTable = &[
    ("cast-noop", "cast(x: t, t) → x", &[Cast], cast_noop),
    ("cast-roundtrip", "cast(cast(x: t, wider), t) → x", &[Cast], cast_roundtrip),
    ("permute-identity", "permute(x, identity) → x", &[Permute], permute_identity),
    ("permute-permute", "permute(permute(x, p), q) → permute(x, p∘q)", &[Permute], permute_permute),
    ("permute-unit-axes", "a permute that only moves size-1 axes → reshape", &[Permute], permute_unit_axes),
    ("reshape-noop", "reshape(x, shape(x)) → x", &[Reshape], reshape_noop),
    ("reshape-reshape", "reshape(reshape(x, a), b) → reshape(x, b)", &[Reshape], reshape_reshape),
    ("broadcast-noop", "broadcast(x, shape(x)) → x", &[Broadcast], broadcast_noop),
    ("mul-one", "x·1, 1·x → x", &[Mul], mul_one),
    ("div-one", "x/1 → x", &[Div], div_one),
    ("add-zero", "x+0, 0+x → x", &[Add], add_zero),
    ("sub-zero", "x−0 → x", &[Sub], sub_zero),
    ("neg-canonical", "x·(−1), (−1)·x, 0−x → neg(x)", &[Mul, Sub], neg_canonical),
    ("neg-neg", "neg(neg(x)) → x", &[Neg], neg_neg),
    ("fold-constants", "element-wise op of scalar constants → constant", &[
        Neg, Abs, Exp, Log, Sqrt, Rsqrt, Recip, Sigmoid, Silu, Tanh, Erf, Sin, Cos, Cast, Add, Sub, Mul, Div, Maximum, Minimum, Pow,
    ], fold_constants),
    ("hoist-broadcast-unary", "u(broadcast(x)) → broadcast(u(x))", &[
        Neg, Abs, Exp, Log, Sqrt, Rsqrt, Recip, Sigmoid, Silu, Gelu, Tanh, Erf, Sin, Cos, Cast,
    ], hoist_broadcast_unary),
    ("hoist-broadcast-binary", "b(broadcast(x), y) → broadcast(b(x, y)) when y fits x", &[Add, Sub, Mul, Div, Maximum, Minimum, Pow, LogicalAnd, LogicalOr], hoist_broadcast_binary),
    ("absorb-broadcast", "b(broadcast(x, S), y: S) → b(x, y)", &[Add, Sub, Mul, Div, Maximum, Minimum, Pow, Eq, Ne, Lt, Le, Gt, Ge, LogicalAnd, LogicalOr], absorb_broadcast),
    ("matmul-fold-transpose", "matmul(permute(a), b) / matmul(a, permute(b)) over the last two axes → transpose flags", &[Matmul], matmul_fold_transpose),
];

fn cast_noop(eg: &mut SirEGraph, id: Id) -> Vec<(Id, Id)> {
    let Some(t) = ty(eg, id) else { return vec![] };
    unary_args(eg, id, Cast).into_iter().filter(|&x| ty(eg, x).is_some_and(|tx| tx.dtype == t.dtype)).map(|x| (id, x)).collect()
}

fn cast_roundtrip(eg: &mut SirEGraph, id: Id) -> Vec<(Id, Id)> {
    let Some(t) = ty(eg, id) else { return vec![] };
    let mut out = vec![];
    for mid in unary_args(eg, id, Cast) {
        let Some(tm) = ty(eg, mid) else { continue };
        for x in unary_args(eg, mid, Cast) {
            if ty(eg, x).is_some_and(|tx| tx.dtype == t.dtype && tx.dtype != tm.dtype && widens_exactly(tx.dtype, tm.dtype)) {
                out.push((id, x));
            }
        }
    }
    out
}

fn perm_of(op: &sinter_ir::Op) -> Vec<i64> {
    op.ints("perm").map(<[i64]>::to_vec).unwrap_or_default()
}

fn permute_identity(eg: &mut SirEGraph, id: Id) -> Vec<(Id, Id)> {
    nodes(eg, id, Permute)
        .into_iter()
        .filter(|(op, _)| perm_of(op).iter().enumerate().all(|(i, &p)| p == i as i64))
        .map(|(_, ch)| (id, ch[0]))
        .collect()
}

fn permute_permute(eg: &mut SirEGraph, id: Id) -> Vec<(Id, Id)> {
    let mut plans = vec![];
    for (outer, ch) in nodes(eg, id, Permute) {
        let q = perm_of(&outer);
        for (inner, ich) in nodes(eg, ch[0], Permute) {
            let p = perm_of(&inner);
            if p.len() != q.len() {
                continue;
            }
            // Result axis i is inner axis q[i], which is x axis p[q[i]].
            let comp: Option<Vec<i64>> = q.iter().map(|&qi| p.get(qi as usize).copied()).collect();
            if let Some(c) = comp {
                plans.push((ich[0], c));
            }
        }
    }
    plans.into_iter().filter_map(|(x, c)| permute(eg, x, &c).map(|n| (id, n))).collect()
}

fn permute_unit_axes(eg: &mut SirEGraph, id: Id) -> Vec<(Id, Id)> {
    let Some(t) = ty(eg, id) else { return vec![] };
    let mut plans = vec![];
    for (op, ch) in nodes(eg, id, Permute) {
        let Some(tx) = ty(eg, ch[0]) else { continue };
        let p = perm_of(&op);
        let kept: Vec<i64> = p.iter().copied().filter(|&a| tx.shape.get(a as usize).is_some_and(|d| !d.is_one())).collect();
        if kept.windows(2).all(|w| w[0] < w[1]) && p.iter().enumerate().any(|(i, &a)| a != i as i64) {
            plans.push(ch[0]);
        }
    }
    plans.into_iter().filter_map(|x| super::reshape(eg, x, &t.shape).map(|n| (id, n))).collect()
}

fn reshape_noop(eg: &mut SirEGraph, id: Id) -> Vec<(Id, Id)> {
    let Some(t) = ty(eg, id) else { return vec![] };
    unary_args(eg, id, Reshape).into_iter().filter(|&x| ty(eg, x).as_ref() == Some(&t)).map(|x| (id, x)).collect()
}

fn reshape_reshape(eg: &mut SirEGraph, id: Id) -> Vec<(Id, Id)> {
    let Some(t) = ty(eg, id) else { return vec![] };
    let mut plans = vec![];
    for x in unary_args(eg, id, Reshape) {
        plans.extend(unary_args(eg, x, Reshape));
    }
    plans.into_iter().filter_map(|y| super::reshape(eg, y, &t.shape).map(|n| (id, n))).collect()
}

fn broadcast_noop(eg: &mut SirEGraph, id: Id) -> Vec<(Id, Id)> {
    let Some(t) = ty(eg, id) else { return vec![] };
    unary_args(eg, id, Broadcast).into_iter().filter(|&x| ty(eg, x).as_ref() == Some(&t)).map(|x| (id, x)).collect()
}

/// `x` for each `kind(x, c)` (and `kind(c, x)` when `commute`) with `c` the constant `v`,
/// when the result has x's type.
fn identity_operand(eg: &SirEGraph, id: Id, kind: OpKind, v: f64, commute: bool) -> Vec<(Id, Id)> {
    let Some(t) = ty(eg, id) else { return vec![] };
    let pairs = if commute { comm_args(eg, id, kind) } else { binary_args(eg, id, kind) };
    pairs.into_iter().filter(|&(x, c)| is_const(eg, c, v) && ty(eg, x).as_ref() == Some(&t)).map(|(x, _)| (id, x)).collect()
}

fn mul_one(eg: &mut SirEGraph, id: Id) -> Vec<(Id, Id)> {
    identity_operand(eg, id, Mul, 1.0, true)
}
fn div_one(eg: &mut SirEGraph, id: Id) -> Vec<(Id, Id)> {
    identity_operand(eg, id, Div, 1.0, false)
}
fn add_zero(eg: &mut SirEGraph, id: Id) -> Vec<(Id, Id)> {
    identity_operand(eg, id, Add, 0.0, true)
}
fn sub_zero(eg: &mut SirEGraph, id: Id) -> Vec<(Id, Id)> {
    identity_operand(eg, id, Sub, 0.0, false)
}

fn neg_canonical(eg: &mut SirEGraph, id: Id) -> Vec<(Id, Id)> {
    let Some(t) = ty(eg, id) else { return vec![] };
    let mut xs: Vec<Id> = comm_args(eg, id, Mul).into_iter().filter(|&(_, c)| is_const(eg, c, -1.0)).map(|(x, _)| x).collect();
    xs.extend(binary_args(eg, id, Sub).into_iter().filter(|&(z, _)| is_const(eg, z, 0.0)).map(|(_, x)| x));
    xs.retain(|&x| ty(eg, x).as_ref() == Some(&t));
    xs.into_iter().filter_map(|x| mk(eg, Neg, vec![], &[x]).map(|n| (id, n))).collect()
}

fn neg_neg(eg: &mut SirEGraph, id: Id) -> Vec<(Id, Id)> {
    let mut out = vec![];
    for x in unary_args(eg, id, Neg) {
        for y in unary_args(eg, x, Neg) {
            out.push((id, y));
        }
    }
    out
}

fn fold_constants(eg: &mut SirEGraph, id: Id) -> Vec<(Id, Id)> {
    let Some(t) = ty(eg, id) else { return vec![] };
    if !crate::lang::is_scalarlike(&t) || t.shape.iter().any(|d| d.as_const().is_none()) || eg[id].data.konst.is_some() {
        return vec![];
    }
    let mut plan = None;
    for n in &eg[id].nodes {
        let Sir::Op(sym, ch) = n else { continue };
        let class = sym.kind().info().class;
        if !matches!(class, OpClass::Unary | OpClass::Binary) || sym.kind() == Select || sym.kind() == Gelu {
            continue;
        }
        let vals: Option<Vec<(f64, TensorType)>> = ch.iter().map(|&c| Some((scalar_const(eg, c)?, ty(eg, c)?))).collect();
        if let Some(vals) = vals {
            plan = Some((sym.op().clone(), vals));
            break;
        }
    }
    let Some((op, vals)) = plan else { return vec![] };
    let tensors: Vec<sinter_ir::interp::Tensor> = vals
        .iter()
        .map(|(v, t)| sinter_ir::interp::Tensor::full(t.dtype, &vec![1; t.rank()], *v))
        .collect();
    let tys: Vec<TensorType> = vals.iter().map(|(_, t)| t.clone()).collect();
    let refs: Vec<&sinter_ir::interp::Tensor> = tensors.iter().collect();
    let Ok(out) = crate::eval::eval_op(&op, &tys, &refs, &Bindings::new(), None) else { return vec![] };
    let Some(v) = out.first().and_then(|o| o.data().first().copied()) else { return vec![] };
    let c = if t.rank() == 0 {
        constant(eg, v, t.dtype)
    } else {
        mk(eg, Constant, vec![("value", Attr::Float(v)), ("dtype", Attr::DType(t.dtype)), ("shape", Attr::Dims(t.shape.clone()))], &[])
    };
    c.map(|c| vec![(id, c)]).unwrap_or_default()
}

fn unary_kinds() -> &'static [OpKind] {
    &[Neg, Abs, Exp, Log, Sqrt, Rsqrt, Recip, Sigmoid, Silu, Gelu, Tanh, Erf, Sin, Cos, Cast]
}

fn hoist_broadcast_unary(eg: &mut SirEGraph, id: Id) -> Vec<(Id, Id)> {
    let mut plans = vec![];
    for n in &eg[id].nodes {
        let Sir::Op(sym, ch) = n else { continue };
        if !unary_kinds().contains(&sym.kind()) || ch.len() != 1 {
            continue;
        }
        for (bop, bch) in nodes(eg, ch[0], Broadcast) {
            plans.push((sym.op().clone(), bop, bch[0]));
        }
    }
    let mut out = vec![];
    for (uop, bop, x) in plans {
        if let Some(u) = add(eg, uop, &[x]) {
            if let Some(b) = add(eg, bop, &[u]) {
                out.push((id, b));
            }
        }
    }
    out
}

fn binary_kind_nodes(eg: &SirEGraph, id: Id) -> Vec<(sinter_ir::Op, Id, Id)> {
    eg[id]
        .nodes
        .iter()
        .filter_map(|n| match n {
            Sir::Op(s, ch) if ch.len() == 2 && matches!(s.kind().info().class, OpClass::Binary | OpClass::Compare) && s.kind() != Select => {
                Some((s.op().clone(), eg.find(ch[0]), eg.find(ch[1])))
            }
            _ => None,
        })
        .collect()
}

fn hoist_broadcast_binary(eg: &mut SirEGraph, id: Id) -> Vec<(Id, Id)> {
    let mut plans = vec![];
    for (op, a, b) in binary_kind_nodes(eg, id) {
        if op.kind.info().class != OpClass::Binary {
            continue;
        }
        for (side, bc, other) in [(0, a, b), (1, b, a)] {
            let Some(to) = ty(eg, other) else { continue };
            for (bop, bch) in nodes(eg, bc, Broadcast) {
                let Some(tx) = ty(eg, bch[0]) else { continue };
                if to.rank() <= tx.rank() && broadcast_shapes(&tx.shape, &to.shape).ok().as_deref() == Some(&tx.shape[..]) {
                    plans.push((op.clone(), side, bch[0], other, bop));
                }
            }
        }
    }
    let mut out = vec![];
    for (op, side, x, other, bop) in plans {
        let ch = if side == 0 { [x, other] } else { [other, x] };
        if let Some(inner) = add(eg, op, &ch) {
            if let Some(b) = add(eg, bop, &[inner]) {
                out.push((id, b));
            }
        }
    }
    out
}

fn absorb_broadcast(eg: &mut SirEGraph, id: Id) -> Vec<(Id, Id)> {
    let mut plans = vec![];
    for (op, a, b) in binary_kind_nodes(eg, id) {
        for (side, bc, other) in [(0, a, b), (1, b, a)] {
            let Some(to) = ty(eg, other) else { continue };
            for x in unary_args(eg, bc, Broadcast) {
                let Some(tx) = ty(eg, x) else { continue };
                let Some(tb) = ty(eg, bc) else { continue };
                if tb.shape == to.shape && broadcast_shapes(&tx.shape, &to.shape).ok().as_deref() == Some(&to.shape[..]) {
                    plans.push((op.clone(), side, x, other));
                }
            }
        }
    }
    let mut out = vec![];
    for (op, side, x, other) in plans {
        let ch = if side == 0 { [x, other] } else { [other, x] };
        if let Some(n) = add(eg, op, &ch) {
            out.push((id, n));
        }
    }
    out
}

fn swaps_last_two(perm: &[i64]) -> bool {
    let r = perm.len();
    r >= 2 && perm.iter().enumerate().all(|(i, &p)| if i == r - 2 { p == (r - 1) as i64 } else if i == r - 1 { p == (r - 2) as i64 } else { p == i as i64 })
}

fn matmul_fold_transpose(eg: &mut SirEGraph, id: Id) -> Vec<(Id, Id)> {
    let mut plans = vec![];
    for (op, ch) in nodes(eg, id, Matmul) {
        let ta = op.bool("transpose_a").unwrap_or(false);
        let tb = op.bool("transpose_b").unwrap_or(false);
        for (pop, pch) in nodes(eg, ch[0], Permute) {
            if swaps_last_two(&perm_of(&pop)) {
                plans.push(([pch[0], ch[1]], !ta, tb));
            }
        }
        for (pop, pch) in nodes(eg, ch[1], Permute) {
            if swaps_last_two(&perm_of(&pop)) {
                plans.push(([ch[0], pch[0]], ta, !tb));
            }
        }
    }
    plans
        .into_iter()
        .filter_map(|(ch, ta, tb)| mk(eg, Matmul, vec![("transpose_a", Attr::Bool(ta)), ("transpose_b", Attr::Bool(tb))], &ch).map(|n| (id, n)))
        .collect()
}
