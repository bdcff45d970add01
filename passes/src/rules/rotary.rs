//! Recognition of rotation by caller-supplied tables: `x·cos + rotate_half(x)·sin` with `cos`
//! and `sin` any values (Hugging Face's `apply_rotary_pos_emb` on `position_embeddings` that
//! arrive as graph inputs) becomes `rotary(x, cos, sin)`, which fuses where `rope` fuses. The
//! rule claims nothing about the tables: the op computes exactly the decomposition's formula
//! for any values, so it applies where `rope`'s rules (which must prove the tables are a
//! rotary table of some θ) do not.
//!
//! | rule | spellings |
//! |---|---|
//! | `rotary-rotate-half` | `x·c + concat(−x₂, x₁)·s`: either product order, the sum in either order, `−x₂` as `neg` (or `x₂·(−1)`, `0 − x₂`, made `neg` by the algebraic rules), the halves as slices of the last axis (`axis=-1` or its positive index, by `start/end` or a split into two); `c`/`s` of x's shape or broadcasting against it (`unsqueeze`d by reshapes, an explicit `broadcast` read through) |
//! | `rotary-interleaved` | the same sum with GPT-J's `rotate_every_two(x)`: `reshape(concat(−x_odd, x_even))` over the pairs of `reshape(x, [..., D/2, 2])` |
//! | `rotary-partial` | `concat(rotary(x[..., :R], c, s), x[..., R:])` → `rotary(x, c, s) {rotary_dim=R}` (GPT-NeoX/Phi's `partial_rotary_factor`) |
//!
//! **Rounding** ([`super::ROUNDING`]): the op rounds once to x's dtype where the decomposition
//! rounds both products and the sum in that dtype; no cast is read through.

use egg::Id;
use sinter_ir::{Attr, Dim, OpKind};

use super::{comm_args, mk, nodes, ty, unary_args, RuleTable};
use crate::lang::SirEGraph;

use OpKind::*;

/// The rotary rules: name, doc line, trigger ops, body.
pub static RULES: RuleTable = &[
    ("rotary-rotate-half", "x·c + concat(−x₂, x₁)·s → rotary(x, c, s) for any tables c, s", &[Add], rotary_rotate_half),
    ("rotary-interleaved", "x·c + rotate_every_two(x)·s → rotary(x, c, s) {form=interleaved}", &[Add], rotary_interleaved),
    ("rotary-partial", "concat(rotary(x[..., :R], c, s), x[..., R:]) → rotary(x, c, s) {rotary_dim=R}", &[Concat], rotary_partial),
];

fn same(eg: &SirEGraph, a: Id, b: Id) -> bool {
    eg.find(a) == eg.find(b)
}

/// Whether an `axis` attribute names the last axis of a rank-`rank` operand.
fn is_last_axis(axis: Option<i64>, rank: usize) -> bool {
    axis.is_some_and(|a| a == -1 || a == rank as i64 - 1)
}

/// Whether class `id` holds `slice(x, start..end)` of x's last axis.
fn is_last_slice(eg: &SirEGraph, id: Id, x: Id, start: i64, end: i64) -> bool {
    let Some(rank) = ty(eg, x).map(|t| t.rank()) else { return false };
    let (start, end) = (Dim::constant(start), Dim::constant(end));
    nodes(eg, id, Slice).iter().any(|(op, ch)| same(eg, ch[0], x) && is_last_axis(op.int("axis"), rank) && op.dim("start") == Some(&start) && op.dim("end") == Some(&end))
}

/// Whether class `id` joins `a` and `b` (in that order) along its last axis.
fn is_last_concat(eg: &SirEGraph, id: Id, a: impl Fn(&SirEGraph, Id) -> bool, b: impl Fn(&SirEGraph, Id) -> bool) -> bool {
    let Some(rank) = ty(eg, id).map(|t| t.rank()) else { return false };
    nodes(eg, id, Concat).iter().any(|(op, ch)| ch.len() == 2 && is_last_axis(op.int("axis"), rank) && a(eg, ch[0]) && b(eg, ch[1]))
}

/// Whether class `rot` is `rotate_half(x)` = `concat(−x[..., D/2:], x[..., :D/2])`.
pub(super) fn is_rotate_half(eg: &SirEGraph, rot: Id, x: Id, d: i64) -> bool {
    let h = d / 2;
    is_last_concat(eg, rot, |eg, a| unary_args(eg, a, Neg).iter().any(|&x2| is_last_slice(eg, x2, x, h, d)), |eg, b| is_last_slice(eg, b, x, 0, h))
}

/// Whether class `rot` is GPT-J's `rotate_every_two(x)`: `reshape(concat(−x_odd, x_even))`
/// over the pairs `xr = reshape(x, [..., D/2, 2])`, `x_even = xr[..., 0:1]`, `x_odd = xr[..., 1:2]`.
fn is_rotate_every_two(eg: &SirEGraph, rot: Id, x: Id) -> bool {
    let Some(tx) = ty(eg, x) else { return false };
    let r = tx.rank();
    unary_args(eg, rot, Reshape).into_iter().any(|st| {
        let Some(ts) = ty(eg, st) else { return false };
        let pairs_of_x = |eg: &SirEGraph, xr: Id| unary_args(eg, xr, Reshape).iter().any(|&y| same(eg, y, x));
        ts.rank() == r + 1
            && ts.shape[r] == Dim::constant(2)
            && ts.shape[..r - 1] == tx.shape[..r - 1]
            && nodes(eg, st, Concat).iter().any(|(op, ch)| {
                ch.len() == 2 && is_last_axis(op.int("axis"), r + 1) && {
                    // The even half's source `xr` (a slice 0..1 of x's pairs); the odd half, negated, slices it at 1..2.
                    nodes(eg, ch[1], Slice).iter().any(|(_, sc)| {
                        let xr = sc[0];
                        pairs_of_x(eg, xr) && is_last_slice(eg, ch[1], xr, 0, 1) && unary_args(eg, ch[0], Neg).iter().any(|&xo| is_last_slice(eg, xo, xr, 1, 2))
                    })
                }
            })
    })
}

/// The tables a product's other operand can be read as: the value itself and, through an
/// explicit `broadcast`, its source (the op broadcasts the tables itself).
fn table_forms(eg: &SirEGraph, c: Id) -> Vec<Id> {
    let mut v = vec![eg.find(c)];
    v.extend(unary_args(eg, c, Broadcast));
    v
}

/// `(x, c, s)` of every way class `id` is `x·c + rot(x)·s` (products and sum in either
/// order), `rot` the rotation `is_rot(eg, rot, x, d)` recognises, x of the sum's type.
pub(super) fn rotations(eg: &SirEGraph, id: Id, is_rot: fn(&SirEGraph, Id, Id, i64) -> bool) -> Vec<(Id, Id, Id)> {
    let Some(t) = ty(eg, id) else { return vec![] };
    let Some(d) = t.shape.last().and_then(Dim::as_const) else { return vec![] };
    if d % 2 != 0 || d < 2 {
        return vec![];
    }
    let mut plans = vec![];
    for (xc, rs) in comm_args(eg, id, Add) {
        for (x, c) in comm_args(eg, xc, Mul) {
            if ty(eg, x).as_ref() != Some(&t) {
                continue;
            }
            for (rot, s) in comm_args(eg, rs, Mul) {
                if ty(eg, rot).as_ref() == Some(&t) && is_rot(eg, rot, x, d) {
                    plans.push((x, c, s));
                }
            }
        }
    }
    plans
}

/// The `rotary` node on `x` with tables `c`, `s` (or their broadcast sources), if it types.
fn rotary_node(eg: &mut SirEGraph, x: Id, c: Id, s: Id, form: &str) -> Option<Id> {
    for cc in table_forms(eg, c).into_iter().rev() {
        for ss in table_forms(eg, s).into_iter().rev() {
            if let Some(n) = mk(eg, Rotary, vec![("form", Attr::Str(form.into()))], &[x, cc, ss]) {
                return Some(n);
            }
        }
    }
    None
}

fn rotary_rotate_half(eg: &mut SirEGraph, id: Id) -> Vec<(Id, Id)> {
    let plans = rotations(eg, id, is_rotate_half);
    plans.into_iter().filter_map(|(x, c, s)| rotary_node(eg, x, c, s, "rotate_half").map(|n| (id, n))).collect()
}

fn rotary_interleaved(eg: &mut SirEGraph, id: Id) -> Vec<(Id, Id)> {
    let plans = rotations(eg, id, |eg, rot, x, _| is_rotate_every_two(eg, rot, x));
    plans.into_iter().filter_map(|(x, c, s)| rotary_node(eg, x, c, s, "interleaved").map(|n| (id, n))).collect()
}

fn rotary_partial(eg: &mut SirEGraph, id: Id) -> Vec<(Id, Id)> {
    let Some(t) = ty(eg, id) else { return vec![] };
    let Some(d) = t.shape.last().and_then(Dim::as_const) else { return vec![] };
    let mut plans = vec![];
    for (op, ch) in nodes(eg, id, Concat) {
        if ch.len() != 2 || !is_last_axis(op.int("axis"), t.rank()) {
            continue;
        }
        for (rop, rch) in nodes(eg, ch[0], Rotary) {
            // A rotary of all of its operand's features, that operand x[..., :R].
            let Some(r) = ty(eg, rch[0]).and_then(|tr| tr.shape.last().and_then(Dim::as_const)) else { continue };
            if rop.int("rotary_dim").is_some() || r >= d {
                continue;
            }
            for (_, sch) in nodes(eg, rch[0], Slice) {
                let x = sch[0];
                if ty(eg, x).as_ref() == Some(&t) && is_last_slice(eg, rch[0], x, 0, r) && is_last_slice(eg, ch[1], x, r, d) {
                    plans.push((x, rch[1], rch[2], rop.str("form").unwrap_or("rotate_half").to_string(), r));
                }
            }
        }
    }
    plans.into_iter().filter_map(|(x, c, s, form, r)| mk(eg, Rotary, vec![("form", Attr::Str(form)), ("rotary_dim", Attr::Int(r))], &[x, c, s]).map(|n| (id, n))).collect()
}
