//! Load-time values and the frontier the partitioner cuts at.
//!
//! **Weights.** [`crate::PassOptions::weights`] names the graph parameters that are weights
//! (bound once, the same at every step); without names, [`infer_weights`] takes the
//! parameters of a fully constant shape and a float or storage dtype, provided some other
//! parameter's shape has a symbol. A parameter whose shape has a symbol (`T`, `B`, `P`) is
//! bound per run; integer parameters are token ids, positions and block tables; and a graph
//! whose every parameter has a constant shape gives no way to tell weights from activations,
//! so none is taken (taking them all would call the whole graph load-time work). A wrong guess
//! costs at most a launch: the GPU backend folds only buffers actually bound
//! ([`sinter_ir::KernelGraph::load_time_kernels`]).
//!
//! **Load-time values** ([`load_time_values`]). A value is load-time when its shape has no
//! symbol and it is a weight or the result of a node all of whose operands are load-time
//! (`constant` and `iota` have none); `kv_append` (an in-place update) never is.
//!
//! **Hoisting** ([`plan`]). A computed node (not a view or a source, which every kernel
//! reading them recomputes) whose results are load-time is *hoisted*: the partitioner keeps
//! it out of per-step kernels, so that its kernel reads only weights and other hoisted
//! results and runs once, when the weights are bound. A hoisted node whose results a per-step
//! node reads (the frontier) stays hoisted only when that does not make a step read more:
//!
//! - computed from weights: when its results' bytes are at most the bytes of the weights it
//!   is computed from (a transpose, `1 + w`, a scale, a concatenation, a narrowing cast);
//!   work that expands what a step reads — a widening cast, a dequantisation, a broadcast —
//!   is left to the per-step kernels, which then read the smaller weights and recompute it;
//! - computed from constants only: a step recomputes it without reading anything, so it is
//!   hoisted only when it does more than index arithmetic and is not a scalar (a `pow`,
//!   `exp` or `cos` table: work each step would redo for every row, against reading a table
//!   of constant shape; a scalar of constants the code generator folds);
//! - never when it feeds a graph output (a step writes those).
//!
//! A node left to the step makes its hoisted operands face the step in turn; the rule is
//! applied again until nothing changes. Nodes left to the step may still form a kernel of
//! their own that reads only weights (a dequantised weight a prefill GEMM reads from a
//! buffer): the kernel-level rule [`sinter_ir::KernelGraph::load_time_kernels`], by which
//! the lowering marks kernels and the GPU backend folds them, finds those too.

use std::collections::{BTreeSet, HashSet};

use sinter_ir::{Function, Graph, Node, OpClass, OpKind, TensorType, Value};

use crate::cost::CostConfig;
use crate::partition::{role_in, Role, Uses};

/// Whether every dimension of `t` is a constant.
pub fn is_static(t: &TensorType) -> bool {
    t.shape.iter().all(|d| d.as_const().is_some())
}

/// The weights [`infer_weights`] guesses when none are named: the parameters of a constant
/// shape and a float or storage dtype (`bf16`, `f16`, `f32`, block-quantized, `f8e4m3`), when
/// some parameter's shape has a symbol; none otherwise (see the module docs).
pub fn infer_weights(f: &Function) -> Vec<Value> {
    if f.params.iter().all(|&p| is_static(f.ty(p))) {
        return vec![];
    }
    f.params
        .iter()
        .copied()
        .filter(|&p| weight_type(f.ty(p)))
        .collect()
}

/// The weight parameters of `f`: those `names` names, or [`infer_weights`]' guess without names.
pub fn weight_params(f: &Function, names: Option<&BTreeSet<String>>) -> HashSet<Value> {
    match names {
        Some(names) => f
            .params
            .iter()
            .copied()
            .filter(|&p| f.values[p].name.as_ref().is_some_and(|n| names.contains(n)))
            .collect(),
        None => infer_weights(f).into_iter().collect(),
    }
}

/// The names of the weights of `g`'s entry function under `names` ([`weight_params`]): what the
/// GPU backend waits for before folding.
pub fn weight_names(g: &Graph, names: Option<&BTreeSet<String>>) -> BTreeSet<String> {
    let Some(f) = g.entry() else {
        return BTreeSet::new();
    };
    weight_params(f, names)
        .into_iter()
        .filter_map(|p| f.values[p].name.clone())
        .collect()
}

/// Whether a parameter of type `t` can hold a weight: a constant shape and a float, storage
/// (block-quantized) or fp8 dtype.
fn weight_type(t: &TensorType) -> bool {
    is_static(t) && (t.dtype.is_float() || t.dtype.is_quantized() || t.dtype.is_fp8())
}

/// Which parameters of every function of `g` are weights, by function name (a flag per
/// parameter, in order): the entry's from `names` or the guess ([`weight_params`]); a called
/// function's parameter is a weight when every call passes it a load-time value of the caller
/// ([`load_time_values`]), so that a layer's activation of constant shape (a decode graph
/// specialised to `T = 1`) is never taken for a weight the way its own types would suggest.
/// A function nothing calls keeps the guess from its own types ([`infer_weights`]).
pub fn weight_masks(g: &Graph, names: Option<&BTreeSet<String>>) -> std::collections::BTreeMap<String, Vec<bool>> {
    let mut masks = std::collections::BTreeMap::new();
    let Some(entry) = g.entry() else { return masks };
    let called: HashSet<&str> = g.funcs.values().flat_map(|f| f.nodes.values()).filter(|n| n.op.kind == OpKind::Call).filter_map(|n| n.op.str("func")).collect();
    let mask_of = |f: &Function, w: &HashSet<Value>| f.params.iter().map(|p| w.contains(p)).collect::<Vec<bool>>();
    masks.insert(entry.name.clone(), mask_of(entry, &weight_params(entry, names)));
    for f in g.funcs.values() {
        if f.name != entry.name && !called.contains(f.name.as_str()) {
            masks.insert(f.name.clone(), mask_of(f, &infer_weights(f).into_iter().collect()));
        }
    }
    // Callers come after their callees: walk from the last function, each callee's flags the
    // conjunction over every call site seen from callers already decided.
    let mut callee_flags: std::collections::BTreeMap<String, Vec<bool>> = std::collections::BTreeMap::new();
    for f in g.funcs.values().rev() {
        let mask = match masks.get(&f.name) {
            Some(m) => m.clone(),
            None => {
                let m: Vec<bool> = match callee_flags.get(&f.name) {
                    Some(c) => c.iter().zip(&f.params).map(|(&c, &p)| c && weight_type(f.ty(p))).collect(),
                    None => vec![false; f.params.len()],
                };
                masks.insert(f.name.clone(), m.clone());
                m
            }
        };
        let w: HashSet<Value> = f.params.iter().zip(&mask).filter(|(_, &m)| m).map(|(&p, _)| p).collect();
        let lt = load_time_values(f, &w);
        for nd in f.nodes.values().filter(|n| n.op.kind == OpKind::Call) {
            let Some(callee) = nd.op.str("func") else { continue };
            let here: Vec<bool> = nd.inputs.iter().map(|a| lt.contains(a)).collect();
            let e = callee_flags.entry(callee.to_string()).or_insert_with(|| vec![true; here.len()]);
            for (x, h) in e.iter_mut().zip(here) {
                *x &= h;
            }
        }
    }
    masks
}

/// The weight parameters of `f` under `mask` ([`weight_masks`]); the guess without one.
pub fn masked_weights(f: &Function, mask: Option<&[bool]>) -> HashSet<Value> {
    match mask {
        Some(m) => f.params.iter().zip(m).filter(|(_, &m)| m).map(|(&p, _)| p).collect(),
        None => infer_weights(f).into_iter().collect(),
    }
}

/// The load-time values of `f` given its weights (module docs). `f` is a flat function (no
/// `call`s); a `call`'s results are never load-time.
pub fn load_time_values(f: &Function, weights: &HashSet<Value>) -> HashSet<Value> {
    let mut lt: HashSet<Value> = weights
        .iter()
        .copied()
        .filter(|&w| is_static(f.ty(w)))
        .collect();
    for nd in f.nodes.values() {
        if matches!(nd.op.kind, OpKind::KvAppend | OpKind::Call) {
            continue;
        }
        if nd.inputs.iter().all(|v| lt.contains(v))
            && nd.results.iter().all(|&r| is_static(f.ty(r)))
        {
            lt.extend(nd.results.iter().copied());
        }
    }
    lt
}

/// What [`plan`] decided.
#[derive(Clone, Debug, Default)]
pub struct Hoist {
    /// The weight parameters.
    pub weights: HashSet<Value>,
    /// The load-time values ([`load_time_values`]).
    pub values: HashSet<Value>,
    /// The hoisted nodes: computed at load time, never in a kernel with per-step nodes.
    pub nodes: HashSet<Node>,
    /// The values a load-time kernel can compute: weights, hoisted nodes' results, and views
    /// and sources over those (a root of a kernel is on the load-time side when it is here).
    pub available: HashSet<Value>,
}

impl Hoist {
    /// Whether node `n` is hoisted.
    pub fn hoisted(&self, n: Node) -> bool {
        self.nodes.contains(&n)
    }
}

/// Ops whose constant-only evaluation is index arithmetic: cheaper to recompute in every
/// reader than to read as a table.
fn index_arithmetic(k: OpKind) -> bool {
    matches!(
        k,
        OpKind::Neg
            | OpKind::Abs
            | OpKind::Cast
            | OpKind::Add
            | OpKind::Sub
            | OpKind::Mul
            | OpKind::Maximum
            | OpKind::Minimum
            | OpKind::Select
            | OpKind::LogicalAnd
            | OpKind::LogicalOr
            | OpKind::LogicalNot
    ) || k.info().class == OpClass::Compare
}

/// Bytes of the weights `n` is computed from, and whether its computation (`n` included)
/// does more than index arithmetic.
fn cone(
    f: &Function,
    uses: &Uses,
    cfg: &CostConfig,
    weights: &HashSet<Value>,
    n: Node,
) -> (f64, bool) {
    let mut bytes = 0.0;
    let mut work = false;
    let mut seen_nodes = HashSet::new();
    let mut seen_params = HashSet::new();
    let mut stack = vec![n];
    while let Some(m) = stack.pop() {
        if !seen_nodes.insert(m) {
            continue;
        }
        let nd = &f.nodes[m];
        let source = matches!(role_in(f, m, uses.contract), Role::View | Role::Source);
        work |= !source && !index_arithmetic(nd.op.kind);
        for &v in &nd.inputs {
            match uses.producer.get(&v) {
                Some(&p) => stack.push(p),
                None if weights.contains(&v) && seen_params.insert(v) => {
                    bytes += cfg.bytes(f.ty(v))
                }
                None => {}
            }
        }
    }
    (bytes, work)
}

/// Whether hoisted node `n`, read by per-step nodes, stays hoisted (module docs).
fn worth_hoisting(
    f: &Function,
    uses: &Uses,
    cfg: &CostConfig,
    weights: &HashSet<Value>,
    n: Node,
) -> bool {
    let read: f64 = f.nodes[n].results.iter().map(|&r| cfg.bytes(f.ty(r))).sum();
    let (weight_bytes, work) = cone(f, uses, cfg, weights, n);
    if weight_bytes > 0.0 {
        read <= weight_bytes
    } else {
        // A scalar of constants is a constant the code generator folds.
        work && !f.nodes[n]
            .results
            .iter()
            .all(|&r| crate::lang::is_scalarlike(f.ty(r)))
    }
}

/// Decides which nodes of the flat function `f` are hoisted (module docs), with `uses` taken
/// under the same contract as the partition and sizes from `cfg` (only constant shapes are
/// measured, so the sizes of symbols do not matter).
pub fn plan(f: &Function, uses: &Uses, cfg: &CostConfig, weights: HashSet<Value>) -> Hoist {
    let values = load_time_values(f, &weights);
    let computed = |n: Node| !matches!(role_in(f, n, uses.contract), Role::View | Role::Source);
    let mut nodes: BTreeSet<Node> = f
        .nodes
        .iter()
        .filter(|(n, nd)| {
            computed(*n)
                && nd.op.kind != OpKind::KvAppend
                && !nd.results.is_empty()
                && nd.results.iter().all(|r| values.contains(r))
        })
        .map(|(n, _)| n)
        .collect();
    // Nodes whose results are graph outputs, directly or through views and sources.
    let at_output: HashSet<Node> = f
        .outputs
        .iter()
        .flat_map(|&o| uses.bases(f, o))
        .filter_map(|b| uses.producer.get(&b).copied())
        .collect();
    loop {
        let mut demote = vec![];
        for &n in &nodes {
            if at_output.contains(&n) {
                demote.push(n);
                continue;
            }
            let readers = uses.users.get(&n).map(Vec::as_slice).unwrap_or(&[]);
            // Not at the frontier: unread, or some hoisted node needs it at load time.
            if readers.is_empty() || readers.iter().any(|u| nodes.contains(u)) {
                continue;
            }
            if !worth_hoisting(f, uses, cfg, &weights, n) {
                demote.push(n);
            }
        }
        if demote.is_empty() {
            break;
        }
        for n in demote {
            nodes.remove(&n);
        }
    }
    let nodes: HashSet<Node> = nodes.into_iter().collect();
    let mut available: HashSet<Value> = weights
        .iter()
        .copied()
        .filter(|w| values.contains(w))
        .collect();
    for (n, nd) in f.nodes.iter() {
        let through = matches!(role_in(f, n, uses.contract), Role::View | Role::Source)
            && nd.inputs.iter().all(|v| available.contains(v));
        if nodes.contains(&n) || (through && nd.results.iter().all(|r| values.contains(r))) {
            available.extend(nd.results.iter().copied());
        }
    }
    Hoist {
        weights,
        values,
        nodes,
        available,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flat(text: &str) -> Function {
        sinter_ir::parse(text)
            .expect("parses")
            .entry()
            .expect("a function")
            .clone()
    }

    fn named(f: &Function, names: &[&str]) -> HashSet<Node> {
        f.nodes
            .iter()
            .filter(|(_, nd)| {
                nd.results.iter().any(|&r| {
                    f.values[r]
                        .name
                        .as_deref()
                        .is_some_and(|n| names.contains(&n))
                })
            })
            .map(|(n, _)| n)
            .collect()
    }

    #[test]
    fn weights_are_guessed_only_beside_a_symbolic_parameter() {
        let f = flat("func @f(%x: bf16[T, 8], %w: bf16[8], %q: q8_0[4, 32], %pos: i32[4]) {\n  %y: bf16[T, 8] = mul(%x, %w)\n  return %y\n}\n");
        let names: Vec<&str> = infer_weights(&f)
            .iter()
            .filter_map(|&p| f.values[p].name.as_deref())
            .collect();
        assert_eq!(
            names,
            ["w", "q"],
            "static float and storage parameters; not the i32 indices"
        );
        let all_static = flat("func @f(%x: bf16[4, 8], %w: bf16[8]) {\n  %y: bf16[4, 8] = mul(%x, %w)\n  return %y\n}\n");
        assert!(
            infer_weights(&all_static).is_empty(),
            "no symbol: activations and weights cannot be told apart"
        );
        let explicit: BTreeSet<String> = ["x".to_string()].into();
        assert_eq!(weight_params(&all_static, Some(&explicit)).len(), 1);
    }

    #[test]
    fn load_time_values_and_the_frontier() {
        let f = flat(
            "func @f(%x: bf16[T, 8], %w: bf16[8], %g: bf16[8], %v: bf16[8]) {
  %one: bf16[] = constant() {value=1.0, dtype=bf16}
  %w1: bf16[8] = add(%w, %one)
  %g32: f32[8] = cast(%g) {dtype=f32}
  %x32: f32[T, 8] = cast(%x) {dtype=f32}
  %a: f32[T, 8] = mul(%x32, %g32)
  %ab: bf16[T, 8] = cast(%a) {dtype=bf16}
  %b: bf16[T, 8] = mul(%ab, %w1)
  %vt: bf16[T, 8] = broadcast(%v) {shape=[T, 8]}
  %i: f32[8] = iota() {dtype=f32, shape=[8]}
  %c: f32[8] = cos(%i)
  %k: f32[8] = add(%i, %i)
  %ck: f32[8] = add(%c, %k)
  %ckb: bf16[8] = cast(%ck) {dtype=bf16}
  %o: bf16[T, 8] = add(%b, %ckb)
  %o2: bf16[T, 8] = add(%o, %vt)
  return %o2, %g32
}
",
        );
        let weights = weight_params(&f, None);
        assert_eq!(weights.len(), 3);
        let values = load_time_values(&f, &weights);
        let name = |v: &Value| f.values[*v].name.clone().unwrap_or_default();
        let mut lt: Vec<String> = values
            .iter()
            .filter(|v| !weights.contains(v))
            .map(name)
            .collect();
        lt.sort();
        // The broadcast has a symbol in its shape; x-derived values are per step.
        assert_eq!(lt, ["c", "ck", "ckb", "g32", "i", "k", "one", "w1"]);
        let uses = Uses::with(&f, true);
        let h = plan(&f, &uses, &CostConfig::prefill(), weights);
        // `1 + w` keeps its bytes: hoisted. The cast of g widens it and is also a graph output:
        // left to the step. The constant-only chain computes a cosine: hoisted, with the
        // index arithmetic it reads (a hoisted node needs it).
        assert_eq!(h.nodes, named(&f, &["w1", "c", "k", "ck", "ckb"]));
        assert!(
            h.available.contains(&f.param_named("w").unwrap())
                && !h.available.contains(&f.param_named("x").unwrap())
        );
    }

    #[test]
    fn index_arithmetic_on_constants_and_widening_stay_in_the_step() {
        let f = flat(
            "func @f(%x: f32[T, 8], %w: bf16[8]) {
  %i: f32[8] = iota() {dtype=f32, shape=[8]}
  %two: f32[] = constant() {value=2.0, dtype=f32}
  %m: f32[8] = mul(%i, %two)
  %w32: f32[8] = cast(%w) {dtype=f32}
  %s: f32[8] = add(%w32, %m)
  %y: f32[T, 8] = add(%x, %s)
  return %y
}
",
        );
        let uses = Uses::with(&f, true);
        let h = plan(&f, &uses, &CostConfig::prefill(), weight_params(&f, None));
        // s (f32, 32 bytes) is computed from 16 bytes of weights: left to the step, and then its
        // operands face the step too: the widening cast, and `iota · 2` (index arithmetic).
        assert!(h.nodes.is_empty(), "{:?}", h.nodes);
    }
}
