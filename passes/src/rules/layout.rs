//! Layout rules: per-position ops move across the layout ops that only rearrange rows, so a
//! graph written with the heads transposed *before* RoPE (Hugging Face's order: project,
//! view as heads, `transpose(1, 2)`, then RoPE) holds the same e-nodes as one written with
//! RoPE first. Once `rope` sits directly on the projection's rows, it joins the matmul's
//! epilogue, and the transpose either folds into attention (`layout = bshd`), cancels against
//! the transpose back, or moves only a size-1 axis and becomes a `reshape`.
//!
//! | rule | rewrite | why it holds |
//! |---|---|---|
//! | `rope-through-permute` | `rope(permute(y, p), pos)` → `permute(rope(y, pos'), p)` when `p` keeps the last axis; `rotary(permute(y, p), c, s)` → `permute(rotary(y, c', s'), p)` alike | RoPE rotates each row of the last axis by its own position; `pos'` is `pos` (aligned to x's leading axes) permuted back by `p⁻¹`, so every row keeps its position; `rotary`'s tables (aligned to x's rank) likewise, their last axis kept |
//! | `rope-through-reshape` | `rope(reshape(y), pos)` → `reshape(rope(y, pos'))` when the reshape keeps the last axis and only adds or drops size-1 leading axes; `rotary` alike | row-major order of the rows is unchanged; `pos'` (the tables' leading axes) drops/adds the same size-1 axes |
//! | `pointwise-through-permute` | `u(permute(y, p))` → `permute(u(y), p)`; `b(permute(y, p), c)` → `permute(b(y, c'), p)` with `c'` the other operand aligned and permuted back by `p⁻¹`, only where that moves size-1 axes alone (a scalar, a bias, a per-position table) | an element-wise op computes each element alone; the same elements are computed, each rounded once |
//! | `norm-through-permute` | `rms_norm(permute(y, p), w)` → `permute(rms_norm(y, w), p)`, `layer_norm` likewise, when `p` keeps the last axis | a norm normalises each row of the last axis alone with weights along that axis; the permute only reorders the rows (Gemma's and Qwen3's q/k norms after the head transpose) |
//! | `slice-concat-through-permute` | `slice(permute(y, p), k)` → `permute(slice(y, p[k]), p)`; `concat(permute(a, p), permute(b, p), k)` → `permute(concat(a, b, p[k]), p)` | axis `k` of the permuted tensor is axis `p[k]` of its input (`rotate_half` after a transpose) |
//!
//! The rewrites compute nothing new: the same elements are computed with the same operands
//! ([`super::ROUNDING`]: exact). Positions are integers and are only permuted or reshaped.

use egg::Id;
use sinter_ir::{Dim, Op, OpClass, OpKind};

use super::{add, nodes, permute, reshape, ty, RuleTable};
use crate::lang::SirEGraph;

use OpKind::*;

/// The layout rules: name, doc line, trigger ops, body.
pub static RULES: RuleTable = &[
    ("rope-through-permute", "rope(permute(y, p), pos) → permute(rope(y, pos'), p) when p keeps the last axis; rotary alike", &[Rope, Rotary], rope_through_permute),
    ("rope-through-reshape", "rope(reshape(y), pos) → reshape(rope(y, pos')) when only size-1 leading axes change; rotary alike", &[Rope, Rotary], rope_through_reshape),
    ("pointwise-through-permute", "u(permute(y)), b(permute(y), c) → permute(u(y)), permute(b(y, c'))", &[
        Neg, Abs, Exp, Log, Sqrt, Rsqrt, Recip, Sigmoid, Silu, Gelu, Tanh, Erf, Sin, Cos, Cast, Add, Sub, Mul, Div, Maximum, Minimum,
    ], pointwise_through_permute),
    ("norm-through-permute", "rms_norm(permute(y, p), w) → permute(rms_norm(y, w), p) when p keeps the last axis", &[RmsNorm, LayerNorm], norm_through_permute),
    ("slice-concat-through-permute", "slice(permute(y, p)), concat(permute(aᵢ, p)) → permute(slice(y)), permute(concat(aᵢ)) on axis p[k]", &[Slice, Concat], slice_concat_through_permute),
];

fn perm_of(op: &Op) -> Vec<i64> {
    op.ints("perm").map(<[i64]>::to_vec).unwrap_or_default()
}

/// The inverse of permutation `p` (`q[p[i]] = i`).
fn inverse(p: &[i64]) -> Option<Vec<i64>> {
    let mut q = vec![-1; p.len()];
    for (i, &a) in p.iter().enumerate() {
        let slot = q.get_mut(usize::try_from(a).ok()?)?;
        *slot = i as i64;
    }
    q.iter().all(|&a| a >= 0).then_some(q)
}

/// Whether permuting a tensor of `shape` by `p` moves only size-1 axes (the non-unit axes
/// keep their order), so that it is a `reshape`.
fn moves_unit_axes_only(shape: &[Dim], p: &[i64]) -> bool {
    let kept: Vec<i64> = p.iter().copied().filter(|&a| shape.get(a as usize).is_some_and(|d| !d.is_one())).collect();
    kept.windows(2).all(|w| w[0] < w[1])
}

/// `permute(v, q)` for `v` of `shape`: a `reshape` where `q` moves size-1 axes alone.
fn permute_view(eg: &mut SirEGraph, v: Id, shape: &[Dim], q: &[i64]) -> Option<Id> {
    if moves_unit_axes_only(shape, q) {
        let to: Vec<Dim> = q.iter().map(|&a| shape[a as usize].clone()).collect();
        reshape(eg, v, &to)
    } else {
        permute(eg, v, q)
    }
}

/// `v` (of rank ≤ `rank`) as a class of rank `rank`, size-1 axes added in front.
fn align(eg: &mut SirEGraph, v: Id, rank: usize) -> Option<(Id, Vec<Dim>)> {
    let t = ty(eg, v)?;
    let extra = rank.checked_sub(t.rank())?;
    let mut shape = vec![Dim::constant(1); extra];
    shape.extend(t.shape.iter().cloned());
    Some((reshape(eg, v, &shape)?, shape))
}

fn rope_through_permute(eg: &mut SirEGraph, id: Id) -> Vec<(Id, Id)> {
    let mut plans = vec![];
    for kind in [Rope, Rotary] {
        for (op, ch) in nodes(eg, id, kind) {
            for (pop, pch) in nodes(eg, ch[0], Permute) {
                let p = perm_of(&pop);
                let r = p.len();
                if r < 2 || p[r - 1] != (r - 1) as i64 {
                    continue;
                }
                plans.push((op.clone(), pch[0], ch[1..].to_vec(), p));
            }
        }
    }
    let mut out = vec![];
    'plan: for (op, y, rest, p) in plans {
        let r = p.len();
        // Positions index x's leading axes (rank r − 1); tables have x's rank, last axis kept.
        let rank = if op.kind == Rope { r - 1 } else { r };
        let Some(q) = inverse(&p[..rank]) else { continue };
        let mut args = vec![y];
        for v in rest {
            let Some((va, shape)) = align(eg, v, rank) else { continue 'plan };
            let Some(vy) = permute_view(eg, va, &shape, &q) else { continue 'plan };
            args.push(vy);
        }
        let Some(ry) = add(eg, op, &args) else { continue };
        if let Some(n) = permute(eg, ry, &p) {
            out.push((id, n));
        }
    }
    out
}

fn norm_through_permute(eg: &mut SirEGraph, id: Id) -> Vec<(Id, Id)> {
    let mut plans = vec![];
    for kind in [RmsNorm, LayerNorm] {
        for (op, ch) in nodes(eg, id, kind) {
            for (pop, pch) in nodes(eg, ch[0], Permute) {
                let p = perm_of(&pop);
                let r = p.len();
                if r >= 2 && p[r - 1] == (r - 1) as i64 {
                    let mut args = ch.clone();
                    args[0] = pch[0];
                    plans.push((op.clone(), args, p));
                }
            }
        }
    }
    let mut out = vec![];
    for (op, args, p) in plans {
        let Some(inner) = add(eg, op, &args) else { continue };
        if let Some(n) = permute(eg, inner, &p) {
            out.push((id, n));
        }
    }
    out
}

fn rope_through_reshape(eg: &mut SirEGraph, id: Id) -> Vec<(Id, Id)> {
    let mut plans = vec![];
    for (op, ch) in nodes(eg, id, Rope).into_iter().chain(nodes(eg, id, Rotary)) {
        let Some(tx) = ty(eg, ch[0]) else { continue };
        for y in super::unary_args(eg, ch[0], Reshape) {
            let Some(tyy) = ty(eg, y) else { continue };
            let (rx, ry) = (tx.rank(), tyy.rank());
            if rx == 0 || ry == 0 || tx.shape[rx - 1] != tyy.shape[ry - 1] || tx.shape == tyy.shape {
                continue;
            }
            let (lx, ly) = (&tx.shape[..rx - 1], &tyy.shape[..ry - 1]);
            let nonunit = |s: &[Dim]| s.iter().enumerate().filter(|(_, d)| !d.is_one()).map(|(i, _)| i).collect::<Vec<_>>();
            let (nx, ny) = (nonunit(lx), nonunit(ly));
            if nx.len() != ny.len() || nx.iter().zip(&ny).any(|(&a, &b)| lx[a] != ly[b]) {
                continue;
            }
            plans.push((op.clone(), y, ch[1..].to_vec(), rx - 1, nx, ny, ly.len()));
        }
    }
    let mut out = vec![];
    'plan: for (op, y, rest, lead_x, nx, ny, lead_y) in plans {
        // Positions cover x's leading axes; tables have x's rank, their last axis kept.
        let table = op.kind == Rotary;
        let mut args = vec![y];
        for v in rest {
            let Some((_, pa)) = align(eg, v, lead_x + usize::from(table)) else { continue 'plan };
            // v' axis ny[k] takes v's (aligned) axis nx[k]; every other leading axis is size 1.
            let mut shape = vec![Dim::constant(1); lead_y];
            for (a, b) in nx.iter().zip(&ny) {
                shape[*b] = pa[*a].clone();
            }
            if table {
                shape.extend(pa.last().cloned());
            }
            let Some(vy) = reshape(eg, v, &shape) else { continue 'plan };
            args.push(vy);
        }
        let Some(ry) = add(eg, op, &args) else { continue };
        let Some(tid) = ty(eg, id) else { continue };
        if let Some(n) = reshape(eg, ry, &tid.shape) {
            out.push((id, n));
        }
    }
    out
}

fn pointwise_through_permute(eg: &mut SirEGraph, id: Id) -> Vec<(Id, Id)> {
    let Some(t) = ty(eg, id) else { return vec![] };
    let r = t.rank();
    let mut plans = vec![];
    for n in eg[id].nodes.clone() {
        let crate::lang::Sir::Op(s, ch) = &n else { continue };
        let kind = s.kind();
        let class = kind.info().class;
        if !(matches!(class, OpClass::Unary | OpClass::Binary) && ch.len() <= 2) || kind == Select {
            continue;
        }
        let ch: Vec<Id> = ch.iter().map(|c| eg.find(*c)).collect();
        for (i, &c) in ch.iter().enumerate() {
            // Only an operand of the result's full shape carries the permute.
            if ty(eg, c).map(|tc| tc.shape) != Some(t.shape.clone()) {
                continue;
            }
            for (pop, pch) in nodes(eg, c, Permute) {
                let p = perm_of(&pop);
                if p.len() == r {
                    plans.push((s.op().clone(), ch.clone(), i, pch[0], p));
                }
            }
        }
    }
    let mut out = vec![];
    'plan: for (op, ch, i, y, p) in plans {
        let Some(q) = inverse(&p) else { continue };
        let mut args = Vec::with_capacity(ch.len());
        for (j, &c) in ch.iter().enumerate() {
            if j == i {
                args.push(y);
                continue;
            }
            // The other operand: a permute by the same `p` gives its input; otherwise aligned
            // to rank r and permuted back, only where that moves size-1 axes alone (no
            // transpose of a real tensor is created).
            let same_p = nodes(eg, c, Permute).into_iter().find(|(o, _)| perm_of(o) == p).map(|(_, pc)| pc[0]);
            if let Some(cy) = same_p {
                args.push(cy);
                continue;
            }
            if ty(eg, c).is_some_and(|tc| tc.rank() <= r && tc.shape.iter().all(Dim::is_one)) {
                args.push(c);
                continue;
            }
            let Some((ca, shape)) = align(eg, c, r) else { continue 'plan };
            if !moves_unit_axes_only(&shape, &q) {
                continue 'plan;
            }
            let Some(cp) = permute_view(eg, ca, &shape, &q) else { continue 'plan };
            args.push(cp);
        }
        let Some(inner) = add(eg, op, &args) else { continue };
        if let Some(n) = permute(eg, inner, &p) {
            out.push((id, n));
        }
    }
    out
}

/// `op` with its `axis` attribute set to `a`.
fn with_axis(op: &Op, a: i64) -> Op {
    let mut o = op.clone();
    if let Some(i) = o.kind.attr_index("axis") {
        o.attrs[i] = sinter_ir::Attr::Int(a);
    }
    o
}

fn slice_concat_through_permute(eg: &mut SirEGraph, id: Id) -> Vec<(Id, Id)> {
    let Some(t) = ty(eg, id) else { return vec![] };
    let r = t.rank() as i64;
    let norm = |a: i64| if a < 0 { a + r } else { a };
    let mut plans: Vec<(Op, Vec<Id>, Vec<i64>)> = vec![];
    for (op, ch) in nodes(eg, id, Slice) {
        let Some(a) = op.int("axis").map(norm) else { continue };
        for (pop, pch) in nodes(eg, ch[0], Permute) {
            let p = perm_of(&pop);
            if let (Some(&pa), true) = (p.get(a as usize), p.len() as i64 == r) {
                plans.push((with_axis(&op, pa), vec![pch[0]], p));
            }
        }
    }
    for (op, ch) in nodes(eg, id, Concat) {
        let Some(a) = op.int("axis").map(norm) else { continue };
        let Some((pop, _)) = nodes(eg, ch[0], Permute).into_iter().next() else { continue };
        let p = perm_of(&pop);
        let Some(&pa) = p.get(a as usize) else { continue };
        let ins: Option<Vec<Id>> = ch.iter().map(|&c| nodes(eg, c, Permute).into_iter().find(|(o, _)| perm_of(o) == p).map(|(_, pc)| pc[0])).collect();
        if let (Some(ins), true) = (ins, p.len() as i64 == r) {
            plans.push((with_axis(&op, pa), ins, p));
        }
    }
    let mut out = vec![];
    for (op, ins, p) in plans {
        let Some(inner) = add(eg, op, &ins) else { continue };
        if let Some(n) = permute(eg, inner, &p) {
            out.push((id, n));
        }
    }
    out
}
