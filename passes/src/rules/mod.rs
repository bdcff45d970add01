//! Rewrite rules, one family per file: [`algebraic`] (canonical forms and simplifications),
//! [`recognition`] (decomposed spellings → the op table's composite ops), [`masks`] (more
//! recognition: attention masks from `iota` comparisons, the logit softcap, tanh- and
//! erf-GELU),
//! [`rotary`] (rotation by caller-supplied cos/sin tables), [`layout`] (per-position ops
//! moved across transposes and reshapes of the rows) and
//! [`fusion`] (parallel matmuls sharing an input → one matmul on concatenated weights).
//!
//! **How a rule is written.** A rule is a Rust function `fn(&mut SirEGraph, Id) -> Vec<(Id,
//! Id)>` run on every e-class that holds an e-node of one of its trigger ops ([`Trigger`], an
//! egg [`Searcher`]). It reads the e-graph (every e-node of every class it visits, so one rule
//! covers every spelling that the canonical rules have made equal), adds the replacement
//! e-nodes through [`add`] — which runs the op table's shape rule first and adds nothing that
//! does not type — and returns the pairs of classes to union. The [`FnApplier`] then checks
//! each pair before the union: a pair whose types or known constants differ is an unsound
//! rule, recorded as a [`Conflict`] naming the rule and the class, and the optimiser stops.
//!
//! **Policy** (as in Cranelift's `opts/README.md`): rules are directional; there is no blanket
//! commutativity or associativity — a rule that matches a commutative op tries both operand
//! orders itself; real-number identities that are unsafe in floating point are only applied
//! from the unsafe to the safe form (`exp(x)/Σexp(x)` → `softmax`, which is max-subtracted).
//! Conditions only test facts that cannot change within a class (types, constants), so they
//! are monotone.
//!
//! **Rounding** (DESIGN.md: explicit casts are rounding points that rewrites keep). Every
//! rule states in [`ROUNDING`] how its replacement rounds compared with what it replaces, and
//! why; a rule that drops, moves or merges a cast does so only where the rounding is provably
//! the same (a widening cast is exact; rounding to the dtype a value has is the identity). The
//! claims are tested: the [`Rounding::Exact`] rules, each run alone, leave every e-node equal
//! to its class bit for bit on the file-test corpus and on random cast chains
//! (`tests/rounding.rs`), and the others within the dtype's tolerance (`tests/soundness.rs`).

pub mod algebraic;
pub mod fusion;
pub mod layout;
pub mod masks;
pub mod recognition;
pub mod rotary;

use egg::{Applier, Id, PatternAst, Rewrite, SearchMatches, Searcher, Subst, Symbol, Var};
use sinter_ir::{Attr, DType, Dim, Op, OpKind, TensorType};

use crate::lang::{infer, Conflict, OpSym, Sir, SirAnalysis, SirEGraph};

/// A rewrite rule of the passes.
pub type Rw = Rewrite<Sir, SirAnalysis>;

/// The body of a rule: the pairs of e-classes to union, given the triggering class.
pub type RuleFn = fn(&mut SirEGraph, Id) -> Vec<(Id, Id)>;

/// Searcher: every e-class holding an e-node of one of `kinds`.
#[derive(Clone, Debug)]
pub struct Trigger {
    kinds: &'static [OpKind],
}

impl Searcher<Sir, SirAnalysis> for Trigger {
    fn search_eclass_with_limit(&self, egraph: &SirEGraph, eclass: Id, limit: usize) -> Option<SearchMatches<'_, Sir>> {
        if limit == 0 {
            return None;
        }
        let hit = egraph[eclass].nodes.iter().any(|n| n.kind().is_some_and(|k| self.kinds.contains(&k)));
        hit.then(|| SearchMatches { eclass, substs: vec![Subst::default()], ast: None })
    }

    fn vars(&self) -> Vec<Var> {
        vec![]
    }
}

/// Applier: runs the rule body and performs the unions it asks for, refusing (and recording)
/// any union of differently typed classes.
#[derive(Clone)]
pub struct FnApplier {
    f: RuleFn,
}

impl Applier<Sir, SirAnalysis> for FnApplier {
    fn apply_one(&self, egraph: &mut SirEGraph, eclass: Id, _subst: &Subst, _ast: Option<&PatternAst<Sir>>, rule_name: Symbol) -> Vec<Id> {
        let pairs = (self.f)(egraph, eclass);
        let mut changed = vec![];
        for (a, b) in pairs {
            let (a, b) = (egraph.find(a), egraph.find(b));
            if a == b {
                continue;
            }
            let (da, db) = (&egraph[a].data, &egraph[b].data);
            let konst_clash = matches!((da.konst, db.konst), (Some(x), Some(y)) if !(x == y || (x.is_nan() && y.is_nan())));
            if da.tys != db.tys || konst_clash {
                let show = |t: &[TensorType]| t.iter().map(|t| t.to_string()).collect::<Vec<_>>().join(", ");
                let message = if da.tys != db.tys {
                    format!("would make a {} value equal to a {} value ({} = {})", show(&da.tys), show(&db.tys), describe(egraph, a), describe(egraph, b))
                } else {
                    format!("would make the constant {:?} equal to {:?}", da.konst, db.konst)
                };
                egraph.analysis.conflicts.push(Conflict { rule: Some(rule_name.to_string()), class: format!("{a}"), message });
                continue;
            }
            if egraph.union(a, b) {
                changed.push(a);
            }
        }
        changed
    }
}

/// A short description of a class: its first e-node and type.
pub fn describe(eg: &SirEGraph, id: Id) -> String {
    let c = &eg[id];
    let node = c.nodes.first().map(|n| n.to_string()).unwrap_or_default();
    let ty = c.data.tys.iter().map(|t| t.to_string()).collect::<Vec<_>>().join(", ");
    format!("{node}: {ty}")
}

/// A rule named `name` triggered by e-classes holding one of `kinds`.
pub fn rule(name: &str, kinds: &'static [OpKind], f: RuleFn) -> Option<Rw> {
    Rewrite::new(name, Trigger { kinds }, FnApplier { f }).ok()
}

/// A rule's name and doc line, for the report and the book.
#[derive(Clone, Copy, Debug)]
pub struct RuleInfo {
    /// Name (as counted in the fusion report).
    pub name: &'static str,
    /// Family: `algebraic`, `recognition`, `layout` or `fusion`.
    pub family: &'static str,
    /// What it rewrites.
    pub doc: &'static str,
}

/// Every rule of every family, with its doc line.
pub fn catalogue() -> Vec<RuleInfo> {
    let mut v = Vec::new();
    for (name, doc, _, _) in algebraic::RULES {
        v.push(RuleInfo { name, family: "algebraic", doc });
    }
    for (name, doc, _, _) in recognition::RULES.iter().chain(masks::RULES).chain(rotary::RULES) {
        v.push(RuleInfo { name, family: "recognition", doc });
    }
    for (name, doc, _, _) in layout::RULES {
        v.push(RuleInfo { name, family: "layout", doc });
    }
    for (name, doc, _, _) in fusion::RULES {
        v.push(RuleInfo { name, family: "fusion", doc });
    }
    v
}

/// How a rule's replacement rounds, compared with the e-nodes it is made equal to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rounding {
    /// Bit for bit the same value on every input: no rounding point is dropped, moved or
    /// merged, or only one that is exact (a widening cast; a cast to the dtype a value has).
    Exact,
    /// A composite op that rounds to the narrow dtype exactly where the decomposition's
    /// explicit casts do (the casts it replaces widen exactly or are its rounding point);
    /// inside f32 it computes its statistics once, in f64, where the decomposition rounds each
    /// f32 step: accumulation order, within DESIGN.md's f32 tolerance.
    CastsKept,
    /// A composite op that rounds once to its dtype where the decomposition rounds at every
    /// step in that same dtype; no explicit cast is involved. Within the dtype's tolerance.
    OnceInDtype,
    /// Known difference (FIXME): the replacement also drops an explicit cast of the
    /// decomposition. Within the dtype's tolerance; the justification says which cast.
    DropsCast,
}

/// Every rule's [`Rounding`], whether its matcher reads through `cast` e-nodes, and the
/// reason. A rule that reads through casts is never [`Rounding::OnceInDtype`].
pub static ROUNDING: &[(&str, Rounding, bool, &str)] = &[
    ("cast-noop", Rounding::Exact, true, "a cast to the dtype the value already has rounds nothing"),
    ("cast-roundtrip", Rounding::Exact, true, "only cast(cast(x: t, w), t) with t → w exact (lang::widens_exactly: bf16/f16 → f32, f8e4m3 → wider, i32 → i64, bool → any): the narrowing gives x back; f32 → bf16 → f32 is not matched"),
    ("permute-identity", Rounding::Exact, false, "moves no element"),
    ("permute-permute", Rounding::Exact, false, "composes index maps; computes nothing"),
    ("permute-unit-axes", Rounding::Exact, false, "row-major order unchanged; computes nothing"),
    ("reshape-noop", Rounding::Exact, false, "computes nothing"),
    ("reshape-reshape", Rounding::Exact, false, "computes nothing"),
    ("broadcast-noop", Rounding::Exact, false, "computes nothing"),
    ("mul-one", Rounding::Exact, false, "x·1 = x in IEEE arithmetic, and only where the result has x's type (no dtype change)"),
    ("div-one", Rounding::Exact, false, "x/1 = x, result of x's type"),
    ("add-zero", Rounding::Exact, false, "x+0 = x (−0 + 0 = +0 equals −0), result of x's type"),
    ("sub-zero", Rounding::Exact, false, "x−0 = x, result of x's type"),
    ("neg-canonical", Rounding::Exact, false, "x·(−1) and 0−x are the exact negation"),
    ("neg-neg", Rounding::Exact, false, "negation is exact"),
    ("fold-constants", Rounding::Exact, true, "the interpreter evaluates the node on its constants and rounds to its result dtype, as the node does (a cast of a constant folds to the rounded constant)"),
    ("hoist-broadcast-unary", Rounding::Exact, true, "an element-wise op, a cast included, rounds each element once before or after a broadcast alike"),
    ("hoist-broadcast-binary", Rounding::Exact, false, "the same elements computed, each rounded once"),
    ("absorb-broadcast", Rounding::Exact, false, "the op broadcasts implicitly: same elements, same rounding"),
    ("matmul-fold-transpose", Rounding::Exact, false, "a transpose is a stride choice of the same product"),
    ("sigmoid", Rounding::OnceInDtype, false, "sigmoid rounds once where 1/(1+exp(−x)) rounds each step"),
    ("silu", Rounding::OnceInDtype, false, "silu rounds once where x·sigmoid(x) rounds the sigmoid and the product"),
    ("swiglu", Rounding::Exact, false, "swiglu rounds silu(a) to the dtype before the product, as silu(a)·b does"),
    ("softmax", Rounding::OnceInDtype, false, "softmax rounds once where the decomposition rounds exp, sum and quotient"),
    ("log-softmax", Rounding::OnceInDtype, false, "log_softmax rounds once where the decomposition rounds each step"),
    ("softmax-from-lse", Rounding::OnceInDtype, false, "softmax rounds once where exp(log_softmax(x)) rounds twice"),
    ("rms-norm", Rounding::CastsKept, true, "rms_norm in dt rounds the normalised value to dt (the written cast back) and then the product with the weight (the written multiply in dt); x's cast to f32 widens exactly; a weight applied in f32 before the cast is the f32 op under the written cast"),
    ("layer-norm", Rounding::CastsKept, true, "as rms-norm: h rounded to dt at the written cast back, x's cast widens exactly; h·w + b is rounded once where the graph rounds the product and the sum in dt (no cast)"),
    ("attention", Rounding::DropsCast, true, "scores, scale, mask and probabilities stay f32 inside the op, one rounding at the end; the Llama spelling cast(softmax(cast(s, f32)), dt)·V rounds the probabilities to dt, which the op does not"),
    ("rope-rotate-half", Rounding::DropsCast, true, "angles in f64, one rounding; cos/sin tables cast to the dtype (HF) are read through the cast, so the tables are not rounded, and integer positions through their cast to float (exact in f32 below 2²⁴, not in bf16 above 256)"),
    ("rope-halves", Rounding::DropsCast, true, "as rope-rotate-half"),
    ("rope-interleaved", Rounding::DropsCast, true, "as rope-rotate-half"),
    ("rotary-rotate-half", Rounding::OnceInDtype, false, "rotary rounds once to x's dtype where x·c + rotate_half(x)·s rounds both products and the sum; the tables are read as they are (no cast read through), any values"),
    ("rotary-interleaved", Rounding::OnceInDtype, false, "as rotary-rotate-half"),
    ("rotary-partial", Rounding::Exact, false, "the same rotation of the first R features with the same tables, the rest copied: the concat moves values"),
    ("rope-through-permute", Rounding::Exact, false, "the same rope (rotary) of the same rows with the same positions (tables), only permuted; a permute moves values"),
    ("rope-through-reshape", Rounding::Exact, false, "the same rope (rotary) of the same rows with the same positions (tables), only reshaped; a reshape moves nothing"),
    ("pointwise-through-permute", Rounding::Exact, true, "an element-wise op (a cast included) computes each element from the same operand elements, rounded once, before or after a permute alike"),
    ("norm-through-permute", Rounding::Exact, false, "the same rows normalised with the same weights and statistics (the permute keeps the last axis); a permute moves values"),
    ("slice-concat-through-permute", Rounding::Exact, false, "moves values only: the same elements sliced or joined, along the input's axis"),
    ("attention-fold-mask", Rounding::Exact, true, "drops a mask operand whose values are 0 or −inf by the affine constraints it encodes (checked for every i, j): the op hides the same keys, so every visible score, its softmax and the one rounding at the end are the same; casts between float dtypes keep 0 and −inf; index casts only to integers or f32 (exact below 2²⁴); a hidden key's NaN/±inf in K or V reaches the output only through the mask form (see masks.rs)"),
    ("attention-softcap", Rounding::DropsCast, true, "as attention; c·tanh(s/c) is computed in f32 inside the op where a bf16 graph rounds the quotient, the tanh and the product"),
    ("gelu-tanh", Rounding::OnceInDtype, false, "gelu rounds once where 0.5·x·(1 + tanh(k·(x + a·x³))) rounds every step; the constants √(2/π) and 0.044715 are matched within a relative 1e-6 (bf16/f16: within four roundings of the dtype, as the graph's constants are rounded) and the op uses them exactly"),
    ("gelu-erf", Rounding::OnceInDtype, false, "gelu rounds once where 0.5·x·(1 + erf(x/√2)) rounds every step (the quotient or product x/√2, the erf, the sum and the products); the constant 1/√2 (or √2 as a divisor) is matched within a relative 1e-6 (bf16/f16: within four roundings of the dtype, as the graph's constants are rounded) and the op uses it exactly"),
    ("merge-parallel-matmuls", Rounding::Exact, false, "each output column is its own weight row's product, computed alike; slices move values"),
];

/// The [`ROUNDING`] entry of rule `name`: its class, whether it reads through casts, why.
pub fn rounding(name: &str) -> Option<(Rounding, bool, &'static str)> {
    ROUNDING.iter().find(|r| r.0 == name).map(|r| (r.1, r.2, r.3))
}

/// A table of rules: name, doc line, trigger ops, body.
pub type RuleTable = &'static [(&'static str, &'static str, &'static [OpKind], RuleFn)];

/// The rewrites of a rule table.
pub fn build(table: RuleTable) -> Vec<Rw> {
    table.iter().filter_map(|(name, _, kinds, f)| rule(name, kinds, *f)).collect()
}

// ---------------------------------------------------------------------------------------
// Matching helpers. Children are canonicalised (`find`) so that ids compare.

/// The single type of a class.
pub fn ty(eg: &SirEGraph, id: Id) -> Option<TensorType> {
    eg[id].data.ty().cloned()
}

/// The splat constant a class is known to hold.
pub fn konst(eg: &SirEGraph, id: Id) -> Option<f64> {
    eg[id].data.konst
}

/// Whether a class is a scalar-like constant equal to `v`, exactly (as its dtype holds it):
/// the identity rules (`x·1 → x`) are exact only for the constant itself, not for `1 + 2⁻²³`.
pub fn is_const(eg: &SirEGraph, id: Id, v: f64) -> bool {
    scalar_const(eg, id) == Some(v)
}

/// Whether a class is a scalar-like constant equal to `v` within a relative 1e-6 (exact for
/// 0, ±inf): a constant like `1/n` as the graph's f32 holds it.
pub fn is_const_near(eg: &SirEGraph, id: Id, v: f64) -> bool {
    match scalar_const(eg, id) {
        Some(c) => c == v || (v != 0.0 && v.is_finite() && ((c - v) / v).abs() <= 1e-6),
        None => false,
    }
}

/// The scalar-like constant of a class.
pub fn scalar_const(eg: &SirEGraph, id: Id) -> Option<f64> {
    let scalarish = eg[id].data.ty().is_some_and(crate::lang::is_scalarlike);
    if scalarish {
        konst(eg, id)
    } else {
        None
    }
}

/// The e-nodes of `kind` in class `id`: their ops and canonical children.
pub fn nodes(eg: &SirEGraph, id: Id, kind: OpKind) -> Vec<(Op, Vec<Id>)> {
    eg[id]
        .nodes
        .iter()
        .filter_map(|n| match n {
            Sir::Op(s, ch) if s.kind() == kind => Some((s.op().clone(), ch.iter().map(|c| eg.find(*c)).collect())),
            _ => None,
        })
        .collect()
}

/// The operands of every `kind` e-node with exactly one operand in class `id`.
pub fn unary_args(eg: &SirEGraph, id: Id, kind: OpKind) -> Vec<Id> {
    nodes(eg, id, kind).into_iter().filter_map(|(_, ch)| (ch.len() == 1).then(|| ch[0])).collect()
}

/// The operand pairs of every `kind` e-node in class `id`.
pub fn binary_args(eg: &SirEGraph, id: Id, kind: OpKind) -> Vec<(Id, Id)> {
    nodes(eg, id, kind).into_iter().filter_map(|(_, ch)| (ch.len() == 2).then(|| (ch[0], ch[1]))).collect()
}

/// Like [`binary_args`] for a commutative op: each pair in both orders.
pub fn comm_args(eg: &SirEGraph, id: Id, kind: OpKind) -> Vec<(Id, Id)> {
    let mut v = Vec::new();
    for (a, b) in binary_args(eg, id, kind) {
        v.push((a, b));
        if a != b {
            v.push((b, a));
        }
    }
    v
}

/// Whether class `id` holds the parameter e-node.
pub fn is_param_class(eg: &SirEGraph, id: Id) -> Option<u32> {
    eg[id].nodes.iter().find_map(|n| match n {
        Sir::Param(i) => Some(*i),
        _ => None,
    })
}

/// Adds `op` on `children` if its shape rule accepts them; returns the class.
pub fn add(eg: &mut SirEGraph, op: Op, children: &[Id]) -> Option<Id> {
    let tys: Option<Vec<TensorType>> = children.iter().map(|&c| ty(eg, c)).collect();
    let tys = tys?;
    let refs: Vec<&TensorType> = tys.iter().collect();
    let out = infer(&op, &refs, &eg.analysis.callees).ok()?;
    if out.len() != 1 && op.kind != OpKind::KvAppend && op.kind != OpKind::Call {
        return None;
    }
    Some(eg.add(Sir::Op(OpSym::new(op), children.iter().map(|&c| eg.find(c)).collect())))
}

/// Adds the op `kind` with named attributes (defaults filled in) on `children`.
pub fn mk(eg: &mut SirEGraph, kind: OpKind, attrs: Vec<(&str, Attr)>, children: &[Id]) -> Option<Id> {
    let op = Op::new(kind, attrs.into_iter().map(|(k, v)| (k.to_string(), v)).collect()).ok()?;
    add(eg, op, children)
}

/// Adds a scalar constant.
pub fn constant(eg: &mut SirEGraph, value: f64, dtype: DType) -> Option<Id> {
    mk(eg, OpKind::Constant, vec![("value", Attr::Float(value)), ("dtype", Attr::DType(dtype))], &[])
}

/// Adds `reshape(x, shape)`, or returns `x` when it already has that shape.
pub fn reshape(eg: &mut SirEGraph, x: Id, shape: &[Dim]) -> Option<Id> {
    if ty(eg, x)?.shape == shape {
        return Some(eg.find(x));
    }
    mk(eg, OpKind::Reshape, vec![("shape", Attr::Dims(shape.to_vec()))], &[x])
}

/// Adds `permute(x, perm)`, or returns `x` for the identity.
pub fn permute(eg: &mut SirEGraph, x: Id, perm: &[i64]) -> Option<Id> {
    if perm.iter().enumerate().all(|(i, &p)| p == i as i64) {
        return Some(eg.find(x));
    }
    mk(eg, OpKind::Permute, vec![("perm", Attr::Ints(perm.to_vec()))], &[x])
}
