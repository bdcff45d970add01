//! Recognition rules for what surrounds attention's scores and for GELU: masks built from
//! `iota` comparisons, the logit softcap, and the written-out tanh- and erf-GELU.
//!
//! | rule | spellings |
//! |---|---|
//! | `attention-fold-mask` | `attention(q, k, v, mask)` whose mask is `select(keep, 0, −inf)`, `select(hide, −inf, 0)` or a sum of such masks (through casts, reshapes that keep the last two axes, broadcasts), with `keep` a conjunction (`logical_and`, `logical_not`, De Morgan over `logical_or`) of comparisons of affine forms in the query index `i` (axis −2) and key index `j` (axis −1) built from `iota`, integer constants, `+`, `−`, `neg`, `·k` and casts to integers or f32: `j ≤ i + (Skv − Sq)` becomes `causal=true` (bottom-right), `i − j < W − (Skv − Sq)` the sliding `window=W`, the other conjuncts (a key-padding mask `j < len`, …) stay a mask operand of their own, never a dense T×T |
//! | `attention-softcap` | `softmax(c·tanh(s/c) [+ mask])·V`, `s` any spelling the `attention` rule takes, `/c` or `·(1/c)`, `c·` on either side → `attention` with `softcap=c` |
//! | `gelu-tanh` | `0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))`: any product/sum order, `0.5` on either side or as `/2`, `0.5 + 0.5·tanh(·)`, `x³` as `pow(x, 3)`, `x·x·x` or `x·x²`, the constants folded (`0.7978845608·x + 0.0356774·x³`) or not, `k·x·(1 + a·x²)` |
//! | `gelu-erf` | `0.5·x·(1 + erf(x/√2))` (PyTorch's `F.gelu` written out, as Hugging Face's `_gelu_python` does): any product/sum order, `0.5` on either side or as `/2`, `0.5·x + 0.5·x·erf(·)`, `x·(0.5 + 0.5·erf(·))` (x·Φ(x)), `x/√2` as `x·0.7071067811865476`, as `/ sqrt(2)` (folded) or as `/ 1.4142135` |
//!
//! The mask and GELU matchers read values as polynomials (affine forms over iota indices, a
//! polynomial in `x` and `tanh(·)` or `erf(·)`) found on any e-node of each class, so every
//! spelling the e-graph has made equal is covered by one reading; constants must match to a
//! relative 1e-6 (GELU's in bf16/f16: within the dtype's rounding of the exact constants).
//! `x·0.5·erfc(−x/√2)` is not found: the IR has no `erfc`.
//!
//! **Soundness of `attention-fold-mask`.** The folded node hides exactly the keys the mask
//! made `−inf` (the affine constraints are checked for every i, j, not sampled): for finite K
//! and V the result is equal, fully masked rows included (both give 0: the mask's row is all
//! `−inf`, the causal op reads no key). Conditions: the index arithmetic is exact (integer
//! iota, or a cast to f32 of indices below 2²⁴), and a *hidden* key holds no NaN or ±inf
//! in K or V — the op with a mask operand still makes that key's p·v (0·NaN = NaN), the causal
//! op never reads it. The mask must be `−inf`; a finite "lowest value" mask is not folded
//! (a fully masked row gives the mean of V there, not 0).
//!
//! **Softcap.** The op computes `c·tanh(s/c)` in f32 where a bf16 graph rounds the quotient,
//! the tanh and the product: as `attention`, within the dtype's tolerance.

use egg::Id;
use sinter_ir::{Attr, DType, Dim, OpKind};

use super::{add, binary_args, comm_args, is_const, is_const_near, mk, nodes, scalar_const, ty, unary_args, RuleTable};
use crate::lang::SirEGraph;

use OpKind::*;

/// The mask, softcap and GELU rules: name, doc line, trigger ops, body.
pub static RULES: RuleTable = &[
    ("attention-fold-mask", "attention(q, k, v, causal/window mask from iota) → attention {causal, window}", &[Attention], fold_mask),
    ("attention-softcap", "softmax(c·tanh(scale·Q·Kᵀ/c) + mask)·V → attention {softcap=c}", &[Matmul], attention_softcap),
    ("gelu-tanh", "0.5·x·(1 + tanh(√(2/π)(x + 0.044715x³))) → gelu(form=tanh)", &[Mul, Add, Div], gelu_tanh),
    ("gelu-erf", "0.5·x·(1 + erf(x/√2)) → gelu(form=erf)", &[Mul, Add, Div], gelu_erf),
];

fn same(eg: &SirEGraph, a: Id, b: Id) -> bool {
    eg.find(a) == eg.find(b)
}

// ---------------------------------------------------------------------------------------
// softcap

/// `(x, c)` such that class `s` is `c·tanh(x/c)` (or `c·tanh(x·(1/c))`), `c` a finite scalar
/// constant above 0.
pub(super) fn softcapped(eg: &SirEGraph, s: Id) -> Vec<(Id, f64)> {
    let mut out = vec![];
    for (t, c) in comm_args(eg, s, Mul) {
        let Some(cap) = scalar_const(eg, c) else { continue };
        if !(cap > 0.0 && cap.is_finite()) {
            continue;
        }
        for y in unary_args(eg, t, Tanh) {
            for (x, d) in binary_args(eg, y, Div) {
                if is_const_near(eg, d, cap) {
                    out.push((x, cap));
                }
            }
            for (x, r) in comm_args(eg, y, Mul) {
                if is_const_near(eg, r, 1.0 / cap) {
                    out.push((x, cap));
                }
            }
        }
    }
    out
}

fn attention_softcap(eg: &mut SirEGraph, id: Id) -> Vec<(Id, Id)> {
    super::recognition::attention_with(eg, id, true)
}

// ---------------------------------------------------------------------------------------
// masks: affine forms over (i, j) = (index along axis −2, index along axis −1)

/// `ci·i + cj·j + c0`, over the last two axes of a value (NumPy broadcasting aligns axes from
/// the end, so the form is the same in every operand an op broadcasts).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Affine {
    ci: i64,
    cj: i64,
    c0: i64,
}

impl Affine {
    fn lin(self, k: i64, o: Affine) -> Option<Affine> {
        Some(Affine { ci: self.ci.checked_add(o.ci.checked_mul(k)?)?, cj: self.cj.checked_add(o.cj.checked_mul(k)?)?, c0: self.c0.checked_add(o.c0.checked_mul(k)?)? })
    }
    fn scale(self, k: i64) -> Option<Affine> {
        Affine { ci: 0, cj: 0, c0: 0 }.lin(k, self)
    }
}

/// Whether a dtype holds the index arithmetic exactly (integers; f32 below 2²⁴).
fn exact_index_dtype(d: DType) -> bool {
    d.is_int() || d == DType::F32
}

/// The affine form of class `id` in the query/key indices, read off any e-node that gives one.
fn affine(eg: &SirEGraph, id: Id, depth: usize) -> Option<Affine> {
    let t = ty(eg, id)?;
    if depth > 12 || !exact_index_dtype(t.dtype) {
        return None;
    }
    if let Some(c) = scalar_const(eg, id) {
        return (c.fract() == 0.0 && c.abs() < 9.0e15).then_some(Affine { ci: 0, cj: 0, c0: c as i64 });
    }
    let r = t.rank();
    for (op, _) in nodes(eg, id, Iota) {
        let axis = op.int("axis")?;
        let from_end = r.checked_sub(usize::try_from(axis).ok()?)?;
        match from_end {
            1 => return Some(Affine { ci: 0, cj: 1, c0: 0 }),
            2 => return Some(Affine { ci: 1, cj: 0, c0: 0 }),
            _ if t.shape[axis as usize].is_one() => return Some(Affine { ci: 0, cj: 0, c0: 0 }),
            _ => {}
        }
    }
    for x in unary_args(eg, id, Broadcast) {
        if let Some(a) = affine(eg, x, depth + 1) {
            return Some(a);
        }
    }
    for x in unary_args(eg, id, Reshape) {
        if let Some(a) = affine(eg, x, depth + 1).and_then(|a| through_reshape(eg, x, id, a)) {
            return Some(a);
        }
    }
    for x in unary_args(eg, id, Cast) {
        if let Some(a) = affine(eg, x, depth + 1) {
            return Some(a);
        }
    }
    for x in unary_args(eg, id, Neg) {
        if let Some(a) = affine(eg, x, depth + 1).and_then(|a| a.scale(-1)) {
            return Some(a);
        }
    }
    for (kind, k) in [(Add, 1), (Sub, -1)] {
        for (a, b) in binary_args(eg, id, kind) {
            if let (Some(fa), Some(fb)) = (affine(eg, a, depth + 1), affine(eg, b, depth + 1)) {
                if let Some(s) = fa.lin(k, fb) {
                    return Some(s);
                }
            }
        }
    }
    for (a, c) in comm_args(eg, id, Mul) {
        let Some(k) = scalar_const(eg, c).filter(|k| k.fract() == 0.0 && k.abs() < 1e9) else { continue };
        if let Some(s) = affine(eg, a, depth + 1).and_then(|fa| fa.scale(k as i64)) {
            return Some(s);
        }
    }
    None
}

/// The affine form of `x` read in `y = reshape(x)`'s axes: the non-unit axes of both shapes
/// must agree in order, and the form's axes must land on y's last two.
fn through_reshape(eg: &SirEGraph, x: Id, y: Id, a: Affine) -> Option<Affine> {
    let (tx, ty_) = (ty(eg, x)?, ty(eg, y)?);
    let nonunit = |s: &[Dim]| -> Vec<(usize, Dim)> { s.iter().enumerate().filter(|(_, d)| !d.is_one()).map(|(i, d)| (s.len() - i, d.clone())).collect() };
    let (nx, ny) = (nonunit(&tx.shape), nonunit(&ty_.shape));
    if nx.len() != ny.len() || nx.iter().zip(&ny).any(|(p, q)| p.1 != q.1) {
        return None;
    }
    let map = |fe: usize| -> Option<usize> { nx.iter().zip(&ny).find(|(p, _)| p.0 == fe).map(|(_, q)| q.0) };
    let mut out = Affine { ci: 0, cj: 0, c0: a.c0 };
    for (fe, c) in [(2, a.ci), (1, a.cj)] {
        if c == 0 {
            continue;
        }
        // An axis of size 1 in x has index 0.
        let Some(to) = map(fe) else {
            if tx.shape.len() >= fe && tx.shape[tx.shape.len() - fe].is_one() {
                continue;
            }
            return None;
        };
        match to {
            1 => out.cj += c,
            2 => out.ci += c,
            _ => return None,
        }
    }
    Some(out)
}

/// One conjunct of a mask condition: an affine constraint `form ≥ 0`, or a bool class kept as
/// it is (negated when `true`).
#[derive(Clone, Copy, Debug)]
enum Conjunct {
    Ge0(Affine),
    Other(Id, bool),
}

/// The constraint of comparison class `c` (of its negation when `neg`) as `form ≥ 0`.
fn comparison(eg: &SirEGraph, c: Id, neg: bool) -> Option<Affine> {
    let minus_one = Affine { ci: 0, cj: 0, c0: -1 };
    // (op in the graph, its negation): ¬(a ≥ b) is a < b, ¬(a > b) is a ≤ b.
    for (kind, negation) in [(Ge, Lt), (Gt, Le), (Le, Gt), (Lt, Ge)] {
        let effective = if neg { negation } else { kind };
        for (a, b) in binary_args(eg, c, kind) {
            let (Some(fa), Some(fb)) = (affine(eg, a, 0), affine(eg, b, 0)) else { continue };
            // a ≥ b: a − b ≥ 0; a > b: a − b − 1 ≥ 0 (integer values); ≤ and < mirrored.
            let form = match effective {
                Ge => fa.lin(-1, fb),
                Gt => fa.lin(-1, fb).and_then(|f| f.lin(1, minus_one)),
                Le => fb.lin(-1, fa),
                _ => fb.lin(-1, fa).and_then(|f| f.lin(1, minus_one)),
            };
            if form.is_some() {
                return form;
            }
        }
    }
    None
}

/// The conjuncts of bool class `c` (of its negation when `neg`): `logical_and` splits,
/// `logical_not` flips, `logical_or` under a negation splits (De Morgan), comparisons of
/// affine forms become constraints; anything else is kept whole.
fn conjuncts(eg: &SirEGraph, c: Id, neg: bool, depth: usize, out: &mut Vec<Conjunct>) {
    let c = eg.find(c);
    if depth < 8 {
        let split = if neg { LogicalOr } else { LogicalAnd };
        if let Some((a, b)) = binary_args(eg, c, split).into_iter().next() {
            conjuncts(eg, a, neg, depth + 1, out);
            conjuncts(eg, b, neg, depth + 1, out);
            return;
        }
        if let Some(x) = unary_args(eg, c, LogicalNot).into_iter().next() {
            conjuncts(eg, x, !neg, depth + 1, out);
            return;
        }
        for x in unary_args(eg, c, Broadcast) {
            let mut inner = vec![];
            conjuncts(eg, x, neg, depth + 1, &mut inner);
            if inner.iter().all(|k| matches!(k, Conjunct::Ge0(_))) {
                out.extend(inner);
                return;
            }
        }
    }
    match comparison(eg, c, neg) {
        Some(f) => out.push(Conjunct::Ge0(f)),
        None => out.push(Conjunct::Other(c, neg)),
    }
}

/// A mask operand read as conjuncts of "key visible", plus additive parts kept as they are.
#[derive(Default, Debug)]
struct MaskParts {
    keep: Vec<Conjunct>,
    additive_rest: Vec<Id>,
}

/// Reads additive mask class `m` (0 where visible, −inf where hidden): `select(keep, 0, −inf)`,
/// `select(hide, −inf, 0)`, sums of masks, views (casts between float dtypes keep 0 and −inf).
fn read_mask(eg: &SirEGraph, m: Id, depth: usize, parts: &mut MaskParts) -> bool {
    if depth > 8 {
        return false;
    }
    for (_, ch) in nodes(eg, m, Select) {
        let (zero, ninf) = (f64::from(0u8), f64::NEG_INFINITY);
        if is_const(eg, ch[1], zero) && is_const(eg, ch[2], ninf) {
            conjuncts(eg, ch[0], false, 0, &mut parts.keep);
            return true;
        }
        if is_const(eg, ch[1], ninf) && is_const(eg, ch[2], zero) {
            conjuncts(eg, ch[0], true, 0, &mut parts.keep);
            return true;
        }
    }
    for (a, b) in binary_args(eg, m, Add) {
        let mut pa = MaskParts::default();
        if read_mask(eg, a, depth + 1, &mut pa) {
            let mut pb = MaskParts::default();
            if !read_mask(eg, b, depth + 1, &mut pb) {
                pb.additive_rest.push(eg.find(b));
            }
            parts.keep.extend(pa.keep.into_iter().chain(pb.keep));
            parts.additive_rest.extend(pa.additive_rest.into_iter().chain(pb.additive_rest));
            return true;
        }
    }
    for x in unary_args(eg, m, Broadcast) {
        if read_mask(eg, x, depth + 1, parts) {
            return true;
        }
    }
    let tm = ty(eg, m);
    for x in unary_args(eg, m, Reshape) {
        let keeps_last_two = match (ty(eg, x), &tm) {
            (Some(tx), Some(tm)) => tx.rank() >= 2 && tm.rank() >= 2 && tx.shape[tx.rank() - 2..] == tm.shape[tm.rank() - 2..],
            _ => false,
        };
        if keeps_last_two && read_mask(eg, x, depth + 1, parts) {
            return true;
        }
    }
    for x in unary_args(eg, m, Cast) {
        if ty(eg, x).is_some_and(|t| t.dtype.is_float()) && read_mask(eg, x, depth + 1, parts) {
            return true;
        }
    }
    false
}

/// The attributes of the scores' keep-condition `c` (`select(c, s, −inf)`; with `hide`, `c`
/// says which keys are hidden: `select(c, −inf, s)`, PyTorch's `masked_fill`): `Some(window)`
/// when it is exactly the bottom-right causal mask for `off = Skv − Sq`, with an optional
/// sliding window; `None` for anything else (then the `attention` rule keeps the mask).
pub(super) fn keep_is_causal(eg: &SirEGraph, c: Id, hide: bool, off: i64) -> Option<Option<i64>> {
    let mut keep = vec![];
    conjuncts(eg, c, hide, 0, &mut keep);
    let (causal, window, rest) = classify(&keep, None, None);
    if causal != Some(off) || !rest.is_empty() {
        return None;
    }
    window_attr(window, off)
}

/// Splits conjuncts into the causal bound `c` of `j ≤ i + c`, the window bound `w` of
/// `i − j ≤ w` (each the tightest, starting from the given ones) and the rest (`None` for an
/// affine constraint with no attribute, which blocks the fold).
fn classify(keep: &[Conjunct], mut causal: Option<i64>, mut window: Option<i64>) -> (Option<i64>, Option<i64>, Vec<Option<(Id, bool)>>) {
    let mut rest = vec![];
    for k in keep {
        match *k {
            Conjunct::Ge0(f) if f.ci == 1 && f.cj == -1 => causal = Some(causal.map_or(f.c0, |c| c.min(f.c0))),
            Conjunct::Ge0(f) if f.ci == -1 && f.cj == 1 => window = Some(window.map_or(f.c0, |w| w.min(f.c0))),
            Conjunct::Ge0(f) if f.ci == 0 && f.cj == 0 && f.c0 >= 0 => {}
            Conjunct::Ge0(_) => rest.push(None),
            Conjunct::Other(c, neg) => rest.push(Some((c, neg))),
        }
    }
    (causal, window, rest)
}

/// True when the sequence lengths `sq`, `sk` are constants with at most 2¹⁶ (query, key)
/// pairs and the conjuncts, all affine, keep exactly the bottom-right causal pairs
/// `j ≤ i + off` (checked at every pair).
fn keeps_plain_causal(keep: &[Conjunct], sq: &Dim, sk: &Dim, off: i64) -> bool {
    let (Some(sq), Some(sk)) = (sq.as_const(), sk.as_const()) else { return false };
    if sq < 1 || sk < 1 || sq.saturating_mul(sk) > 1 << 16 {
        return false;
    }
    let forms: Option<Vec<Affine>> = keep.iter().map(|c| if let Conjunct::Ge0(a) = c { Some(*a) } else { None }).collect();
    let Some(forms) = forms else { return false };
    let value = |a: &Affine, i: i64, j: i64| a.ci.checked_mul(i).and_then(|x| x.checked_add(a.cj.checked_mul(j)?)).and_then(|x| x.checked_add(a.c0));
    (0..sq).all(|i| (0..sk).all(|j| forms.iter().map(|a| value(a, i, j).map(|v| v >= 0)).collect::<Option<Vec<bool>>>().is_some_and(|v| v.iter().all(|&b| b) == (j <= i + off))))
}

/// The `window` attribute for the bound `i − j ≤ w` at offset `off`: `W = w + 1 + off`, which
/// must be in `1..=i32::MAX` (outer `None` otherwise: not foldable).
fn window_attr(window: Option<i64>, off: i64) -> Option<Option<i64>> {
    match window {
        None => Some(None),
        Some(w) => {
            let wa = w.checked_add(1 + off)?;
            (1..=i64::from(i32::MAX)).contains(&wa).then_some(Some(wa))
        }
    }
}

/// Folds a causal / sliding-window mask into the attention node's attributes. Sound for the
/// conditions in the module doc.
fn fold_mask(eg: &mut SirEGraph, id: Id) -> Vec<(Id, Id)> {
    let mut out = vec![];
    for (op, ch) in nodes(eg, id, Attention) {
        if ch.len() != 4 || op.bool("lse") == Some(true) {
            continue;
        }
        let (Some(tq), Some(tk), Some(tm)) = (ty(eg, ch[0]), ty(eg, ch[1]), ty(eg, ch[3])) else { continue };
        let seq = if op.str("layout") == Some("bshd") { 1 } else { 2 };
        let Some(off) = tk.shape[seq].sub(&tq.shape[seq]).as_const() else { continue };
        let mut parts = MaskParts::default();
        if !read_mask(eg, ch[3], 0, &mut parts) {
            continue;
        }
        // Causal: j ≤ i + c (form i − j + c ≥ 0); window: i − j ≤ w (form j − i + w ≥ 0).
        let (c0, w0) = if op.bool("causal") == Some(true) { (Some(off), op.int("window").map(|w| w - 1 - off)) } else { (None, None) };
        let (mut causal, mut window, mut rest) = classify(&parts.keep, c0, w0);
        // Sequence lengths known and small (a decode step's one query): the constraints read
        // at every (i, j); size-1 axes make i and j both 0, whatever form they took.
        if (causal != Some(off) || rest.iter().any(Option::is_none)) && c0.is_none() && keeps_plain_causal(&parts.keep, &tq.shape[seq], &tk.shape[seq], off) {
            (causal, window, rest) = (Some(off), None, vec![]);
        }
        // Only the bottom-right causal diagonal has an attribute; other affine constraints
        // (and an everything-hidden mask) are not folded.
        if causal != Some(off) || rest.iter().any(Option::is_none) {
            continue;
        }
        let Some(w_attr) = window_attr(window, off) else { continue };
        let mut new_op = op.clone();
        let set = |o: &mut sinter_ir::Op, name: &str, a: Attr| {
            if let Some(i) = OpKind::Attention.attr_index(name) {
                o.attrs[i] = a;
            }
        };
        set(&mut new_op, "causal", Attr::Bool(true));
        set(&mut new_op, "window", w_attr.map_or(Attr::Absent, Attr::Int));
        // The mask parts that stay: the other conjuncts as select(·, 0, −inf), plus the
        // additive parts that were not masks of this form.
        let Some(rest_mask) = rebuild_rest(eg, &rest, &parts.additive_rest, tm.dtype) else { continue };
        let mut children = vec![ch[0], ch[1], ch[2]];
        children.extend(rest_mask);
        if let Some(n) = add(eg, new_op, &children) {
            out.push((id, n));
        }
    }
    out
}

/// `select(∧ others, 0, −inf) + Σ additive` in `dt`, `None` inside for no mask at all; outer
/// `None` when a part does not build.
fn rebuild_rest(eg: &mut SirEGraph, others: &[Option<(Id, bool)>], additive: &[Id], dt: DType) -> Option<Option<Id>> {
    let mut cond: Option<Id> = None;
    for &(c, neg) in others.iter().flatten() {
        let c = if neg { mk(eg, LogicalNot, vec![], &[c])? } else { c };
        cond = Some(match cond {
            None => c,
            Some(p) => mk(eg, LogicalAnd, vec![], &[p, c])?,
        });
    }
    let mut mask = match cond {
        Some(c) => {
            let z = super::constant(eg, 0.0, dt)?;
            let ninf = super::constant(eg, f64::NEG_INFINITY, dt)?;
            Some(mk(eg, Select, vec![], &[c, z, ninf])?)
        }
        None => None,
    };
    for &a in additive {
        if ty(eg, a)?.dtype != dt {
            return None;
        }
        mask = Some(match mask {
            None => a,
            Some(m) => mk(eg, Add, vec![], &[m, a])?,
        });
    }
    Some(mask)
}

// ---------------------------------------------------------------------------------------
// GELU (tanh and erf forms)

/// A polynomial in two atoms `x` and `t`: terms `(power of x, power of t, coefficient)`.
type Poly = Vec<(u32, u32, f64)>;

fn poly_add(mut a: Poly, b: Poly, k: f64) -> Poly {
    for (px, pt, c) in b {
        match a.iter_mut().find(|e| e.0 == px && e.1 == pt) {
            Some(e) => e.2 += k * c,
            None => a.push((px, pt, k * c)),
        }
    }
    a.retain(|e| e.2 != 0.0);
    a
}

fn poly_mul(a: &Poly, b: &Poly) -> Option<Poly> {
    let mut out: Poly = vec![];
    for &(px, pt, c) in a {
        for &(qx, qt, d) in b {
            out = poly_add(out, vec![(px + qx, pt + qt, c * d)], 1.0);
        }
    }
    (out.len() <= 8 && out.iter().all(|e| e.0 <= 6 && e.1 <= 2)).then_some(out)
}

/// Class `id` as a polynomial in `x` and `t` (`t` optional), read off any e-node that gives
/// one: `+`, `−`, `neg`, `·`, `/` by a constant, `pow` by a small integer constant.
fn poly(eg: &SirEGraph, id: Id, x: Id, t: Option<Id>, depth: usize) -> Option<Poly> {
    if same(eg, id, x) {
        return Some(vec![(1, 0, 1.0)]);
    }
    if t.is_some_and(|t| same(eg, id, t)) {
        return Some(vec![(0, 1, 1.0)]);
    }
    if let Some(c) = scalar_const(eg, id) {
        return c.is_finite().then(|| if c == 0.0 { vec![] } else { vec![(0, 0, c)] });
    }
    if depth > 8 {
        return None;
    }
    for (a, b) in binary_args(eg, id, Mul) {
        if let (Some(pa), Some(pb)) = (poly(eg, a, x, t, depth + 1), poly(eg, b, x, t, depth + 1)) {
            if let Some(p) = poly_mul(&pa, &pb) {
                return Some(p);
            }
        }
    }
    for (kind, k) in [(Add, 1.0), (Sub, -1.0)] {
        for (a, b) in binary_args(eg, id, kind) {
            if let (Some(pa), Some(pb)) = (poly(eg, a, x, t, depth + 1), poly(eg, b, x, t, depth + 1)) {
                return Some(poly_add(pa, pb, k));
            }
        }
    }
    for a in unary_args(eg, id, Neg) {
        if let Some(pa) = poly(eg, a, x, t, depth + 1) {
            return Some(poly_add(vec![], pa, -1.0));
        }
    }
    for (a, d) in binary_args(eg, id, Div) {
        let Some(c) = scalar_const(eg, d).filter(|c| *c != 0.0 && c.is_finite()) else { continue };
        if let Some(pa) = poly(eg, a, x, t, depth + 1) {
            return Some(poly_add(vec![], pa, 1.0 / c));
        }
    }
    for (a, e) in binary_args(eg, id, Pow) {
        let Some(n) = scalar_const(eg, e).filter(|n| n.fract() == 0.0 && (1.0..=3.0).contains(n)) else { continue };
        if let Some(pa) = poly(eg, a, x, t, depth + 1) {
            let mut p = pa.clone();
            for _ in 1..n as u32 {
                p = poly_mul(&p, &pa)?;
            }
            return Some(p);
        }
    }
    None
}

/// Whether `p` is `Σ want` with coefficients within a relative `tol`.
fn poly_is(p: &Poly, want: &[(u32, u32, f64)], tol: f64) -> bool {
    p.len() == want.len() && want.iter().all(|&(px, pt, c)| p.iter().any(|e| e.0 == px && e.1 == pt && ((e.2 - c) / c).abs() <= tol))
}

/// How far GELU's constants may be from √(2/π) and 0.044715 (tanh form) or 1/√2 (erf form)
/// as a graph of dtype `dt` holds them: a relative 1e-6 in f32; in bf16/f16, four units of
/// rounding (each constant rounded, and the folded product `k·a` rounded again).
fn gelu_tolerance(dt: DType) -> f64 {
    match dt {
        DType::BF16 => 4.0 * 2f64.powi(-8),
        DType::F16 => 4.0 * 2f64.powi(-11),
        _ => 1e-6,
    }
}

/// The classes holding a `kind` e-node (GELU's `tanh` or `erf`) within a few levels of `id`.
fn unary_classes(eg: &SirEGraph, id: Id, kind: OpKind, depth: usize, out: &mut Vec<Id>) {
    if depth > 4 || out.len() > 4 {
        return;
    }
    let id = eg.find(id);
    if !unary_args(eg, id, kind).is_empty() && !out.contains(&id) {
        out.push(id);
        return;
    }
    for k in [Mul, Add, Div, Sub] {
        for (a, b) in binary_args(eg, id, k) {
            unary_classes(eg, a, kind, depth + 1, out);
            unary_classes(eg, b, kind, depth + 1, out);
        }
    }
}

/// The non-constant classes of the tree under `z` (candidates for GELU's `x`).
fn leaves(eg: &SirEGraph, z: Id, depth: usize, out: &mut Vec<Id>) {
    let z = eg.find(z);
    if depth > 5 || out.len() > 8 || scalar_const(eg, z).is_some() {
        return;
    }
    let mut inner = false;
    for kind in [Mul, Add, Sub, Div, Pow] {
        for (a, b) in binary_args(eg, z, kind) {
            inner = true;
            leaves(eg, a, depth + 1, out);
            leaves(eg, b, depth + 1, out);
        }
    }
    if !inner && !out.contains(&z) {
        out.push(z);
    }
}

/// GELU at class `id`, read as `0.5·x + 0.5·x·t` with `t` an `atom` e-node (`tanh` or `erf`)
/// whose argument is the polynomial `inner` in `x` (constants within [`gelu_tolerance`]);
/// adds `gelu(x) {form}` for every such `x` of `id`'s type.
fn gelu_with(eg: &mut SirEGraph, id: Id, atom: OpKind, inner: &[(u32, u32, f64)], form: &str) -> Vec<(Id, Id)> {
    let Some(t_out) = ty(eg, id) else { return vec![] };
    if !t_out.dtype.is_float() {
        return vec![];
    }
    let tol = gelu_tolerance(t_out.dtype);
    let mut atoms = vec![];
    unary_classes(eg, id, atom, 0, &mut atoms);
    let mut xs = vec![];
    for t in atoms {
        for z in unary_args(eg, t, atom) {
            let mut cands = vec![];
            leaves(eg, z, 0, &mut cands);
            for x in cands {
                if ty(eg, x).as_ref() != Some(&t_out) {
                    continue;
                }
                let inner_ok = poly(eg, z, x, None, 0).is_some_and(|p| poly_is(&p, inner, tol));
                let outer_ok = inner_ok && poly(eg, id, x, Some(t), 0).is_some_and(|p| poly_is(&p, &[(1, 0, 0.5), (1, 1, 0.5)], 1e-6));
                if outer_ok && !xs.contains(&x) {
                    xs.push(x);
                }
            }
        }
    }
    xs.into_iter().filter_map(|x| mk(eg, Gelu, vec![("form", Attr::Str(form.into()))], &[x]).map(|n| (id, n))).collect()
}

/// `0.5·x·(1 + tanh(k·(x + a·x³)))`, k = √(2/π), a = 0.044715 → `gelu(x) {form="tanh"}`.
fn gelu_tanh(eg: &mut SirEGraph, id: Id) -> Vec<(Id, Id)> {
    let k = (2.0 / std::f64::consts::PI).sqrt();
    gelu_with(eg, id, Tanh, &[(1, 0, k), (3, 0, k * 0.044715)], "tanh")
}

/// `0.5·x·(1 + erf(x/√2))` → `gelu(x) {form="erf"}`.
fn gelu_erf(eg: &mut SirEGraph, id: Id) -> Vec<(Id, Id)> {
    gelu_with(eg, id, Erf, &[(1, 0, std::f64::consts::FRAC_1_SQRT_2)], "erf")
}
