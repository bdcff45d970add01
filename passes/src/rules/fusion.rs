//! Fusion rules in the e-graph: parallel matmuls sharing an input become one matmul on
//! concatenated weights.
//!
//! `merge-parallel-matmuls`: the matmuls `x·W₁ᵀ, x·W₂ᵀ, …` (same `x` class, same transpose
//! flags, each `Wᵢ` a rank-2 *parameter* — a weight) get an alternative: `slice(x·concat(W₁,
//! W₂, …)ᵀ, columns of i)`. The e-graph keeps both; the DAG-aware extraction
//! ([`crate::extract`]) takes the merged plan only where it pays under the cost model (one
//! launch and one read of `x` instead of several). Output column slices of a matmul are free
//! in the cost model: the matmul kernel writes each slice to its own buffer (epilogue).
//!
//! **Weights.** The weights are graph parameters, so the `concat` of them is a kernel over
//! inputs only: the lowering marks such kernels *load-time* (`KernelReport::load_time`); whoever
//! binds the weights runs them once (constant-folding the concatenation) instead of per call.
//! The merge is exact: each output column of a matmul depends only on its own weight row.
//!
//! The rest of fusion — pointwise chains into one kernel, pointwise consumers into a matmul's
//! epilogue, prologues and epilogues of row reductions — is decided after extraction on the
//! chosen graph, by [`crate::partition`], where kernel boundaries exist.

use egg::Id;
use sinter_ir::{Attr, Dim, OpKind};

use super::{is_param_class, mk, ty, RuleTable};
use crate::lang::{Sir, SirEGraph};

/// The fusion rules: name, doc line, trigger ops, body.
pub static RULES: RuleTable = &[(
    "merge-parallel-matmuls",
    "x·W₁, x·W₂, … (weights) → slices of x·concat(W₁, W₂, …)",
    &[OpKind::Matmul],
    merge_parallel_matmuls,
)];

fn merge_parallel_matmuls(eg: &mut SirEGraph, id: Id) -> Vec<(Id, Id)> {
    // The triggering matmul's input and flags.
    let mine: Vec<(Id, bool)> = eg[id]
        .nodes
        .iter()
        .filter_map(|n| match n {
            Sir::Op(s, ch) if s.kind() == OpKind::Matmul && s.op().bool("transpose_a") == Some(false) => {
                Some((eg.find(ch[0]), s.op().bool("transpose_b").unwrap_or(false)))
            }
            _ => None,
        })
        .collect();
    let mut out = vec![];
    for (x, tb) in mine {
        let Some(tx) = ty(eg, x) else { continue };
        // Every matmul of x by a weight with these flags, anywhere in the e-graph.
        let mut members: Vec<(u32, Id, Id, Dim)> = vec![]; // (param index, weight class, matmul class, N)
        for class in eg.classes() {
            for n in &class.nodes {
                let Sir::Op(s, ch) = n else { continue };
                if s.kind() != OpKind::Matmul || s.op().bool("transpose_a") != Some(false) || s.op().bool("transpose_b") != Some(tb) {
                    continue;
                }
                if eg.find(ch[0]) != x {
                    continue;
                }
                let w = eg.find(ch[1]);
                let (Some(p), Some(tw)) = (is_param_class(eg, w), eg[w].data.ty()) else { continue };
                if tw.rank() != 2 || tw.dtype != tx.dtype {
                    continue;
                }
                let n_cols = if tb { tw.shape[0].clone() } else { tw.shape[1].clone() };
                if !members.iter().any(|m| m.1 == w) {
                    members.push((p, w, class.id, n_cols));
                }
            }
        }
        if members.len() < 2 {
            continue;
        }
        members.sort_by_key(|m| m.0);
        let ws: Vec<Id> = members.iter().map(|m| m.1).collect();
        let axis = if tb { -2 } else { -1 };
        let Some(cat) = mk(eg, OpKind::Concat, vec![("axis", Attr::Int(axis))], &ws) else { continue };
        let Some(mm) = mk(eg, OpKind::Matmul, vec![("transpose_b", Attr::Bool(tb))], &[x, cat]) else { continue };
        let mut start = Dim::constant(0);
        for (_, _, class, n_cols) in &members {
            let end = start.add(n_cols);
            let attrs = vec![("axis", Attr::Int(-1)), ("start", Attr::Dim(start.clone())), ("end", Attr::Dim(end.clone()))];
            if let Some(sl) = mk(eg, OpKind::Slice, attrs, &[mm]) {
                out.push((*class, sl));
            }
            start = end;
        }
    }
    out
}
