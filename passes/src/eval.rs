//! Evaluating single e-nodes and closed sub-terms on the reference interpreter.
//!
//! Used by rules that need a value (constant folding, reading RoPE's inverse frequencies out
//! of a closed sub-expression) and by the consistency check of [`crate::check`]. Every
//! evaluation goes through `sinter_ir::interp`, so it has the reference's semantics exactly.

// The interpreter's error names its site and shapes; it is built once per failed evaluation.
#![allow(clippy::result_large_err)]

use std::collections::{BTreeMap, HashMap};

use egg::Id;
use sinter_ir::interp::{self, InterpError, Tensor};
use sinter_ir::{Bindings, Function, Graph, Op, OpKind, Signature, TensorType};

use crate::lang::{infer, Sir, SirEGraph};

/// Evaluates `op` on `inputs` (whose declared types are `in_tys`) with the interpreter, by
/// running a one-node function. `graph` supplies callees for `call`.
///
/// # Errors
/// Whatever the interpreter reports, or an ill-typed node.
pub fn eval_op(op: &Op, in_tys: &[TensorType], inputs: &[&Tensor], bindings: &Bindings, graph: Option<&Graph>) -> Result<Vec<Tensor>, InterpError> {
    let callees: BTreeMap<String, Signature> = graph.map(|g| g.funcs.values().map(|f| (f.name.clone(), f.signature())).collect()).unwrap_or_default();
    let refs: Vec<&TensorType> = in_tys.iter().collect();
    let out = infer(op, &refs, &callees).map_err(|m| InterpError::Operands { site: Default::default(), message: m })?;
    let mut f = Function::new("__sinter_eval");
    let params: Vec<_> = in_tys.iter().map(|t| f.add_param(None, t.clone())).collect();
    let (_, results) = f.push_node(op.clone(), params, out);
    f.outputs = results;
    let mut g = graph.cloned().unwrap_or_default();
    g.add_func(f);
    interp::run(&g, "__sinter_eval", inputs, bindings)
}

/// The value of a closed e-class (one computable from constants and `iota` alone, with
/// concrete shapes), found by evaluating, for each class, the first e-node whose operands are
/// closed. `None` when the class depends on a parameter or a symbol.
pub fn closed_value(eg: &SirEGraph, id: Id) -> Option<Tensor> {
    let mut memo: HashMap<Id, Option<Tensor>> = HashMap::new();
    closed_rec(eg, eg.find(id), &mut memo, 0)
}

fn closed_rec(eg: &SirEGraph, id: Id, memo: &mut HashMap<Id, Option<Tensor>>, depth: usize) -> Option<Tensor> {
    let id = eg.find(id);
    if let Some(v) = memo.get(&id) {
        return v.clone();
    }
    if depth > 24 {
        return None;
    }
    let ty = eg[id].data.ty()?.clone();
    if ty.shape.iter().any(|d| d.as_const().is_none()) {
        memo.insert(id, None);
        return None;
    }
    // Mark as in progress (a cycle gives up on this path).
    memo.insert(id, None);
    let nodes = eg[id].nodes.clone();
    for n in nodes {
        let Sir::Op(sym, ch) = &n else { continue };
        if matches!(sym.kind(), OpKind::Call | OpKind::KvAppend) {
            continue;
        }
        let mut vals = Vec::with_capacity(ch.len());
        let mut tys = Vec::with_capacity(ch.len());
        for &c in ch {
            match closed_rec(eg, c, memo, depth + 1) {
                Some(t) => {
                    tys.push(eg[c].data.ty().cloned()?);
                    vals.push(t);
                }
                None => break,
            }
        }
        if vals.len() != ch.len() {
            continue;
        }
        let refs: Vec<&Tensor> = vals.iter().collect();
        if let Ok(mut out) = eval_op(sym.op(), &tys, &refs, &Bindings::new(), None) {
            if out.len() == 1 {
                let t = out.pop();
                memo.insert(id, t.clone());
                return t;
            }
        }
    }
    None
}
