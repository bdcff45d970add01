//! A row norm computed in the prologue of the matmul that reads it: `matmul(rms_norm(x, w),
//! B)` or `matmul(layer_norm(x, w, b), B)` as one kernel. Each CTA of the code generator's small-M kernel computes the
//! statistics of its own rows of `x` over the whole of K (the rows it reads anyway), in the
//! order the norm's own row-reduction kernel sums them, and feeds its K loop the normalised
//! elements rounded as the norm's output would be stored — so the kernel's result has the
//! bits of the norm kernel followed by the matmul kernel.
//!
//! The passes fuse such a norm only where [`norm_prologue`] accepts the matmul and the cost
//! model says the launch saved pays for every CTA's re-reading of its rows; the code
//! generator restates these rules (`kernels/matmul/prologue.rs`).

use super::operands::quantized_b;
use super::families::is_elementwise;
use crate::{DType, Function, Node, OpKind, Value, ValueDef};

/// The most rows (M) a matmul with a norm prologue may have: the small-M kernel's, which
/// holds every row's accumulators (decode batches).
pub const NORM_PROLOGUE_MAX_M: i64 = 16;

/// The longest row (K) a norm prologue takes: the longest row the row reductions read once
/// into registers (1024 threads of 16 elements), whose summation order the prologue follows.
pub const NORM_PROLOGUE_MAX_K: i64 = 16384;

/// Output columns a CTA of the small-M kernel computes when B is K-contiguous (`[N, K]` read
/// with `transpose_b`, the weights of a projection), else: each CTA re-reads its rows of `x`
/// for the statistics, which is what a norm prologue costs.
pub const NORM_PROLOGUE_COLUMNS_PER_CTA: [i64; 2] = [4, 128];

/// Follows `v` back through unary element-wise nodes of `f` (casts: Gemma's norm computes in
/// f32 and casts back) to the first value no such node computes.
pub fn through_unary(f: &Function, mut v: Value) -> Value {
    while let ValueDef::Result(n, _) = f.values[v].def {
        let nd = &f.nodes[n];
        if nd.inputs.len() != 1 || nd.results.len() != 1 || !is_elementwise(nd.op.kind) {
            break;
        }
        v = nd.inputs[0];
    }
    v
}

/// The `rms_norm` or `layer_norm` node whose result, through unary element-wise nodes ([`through_unary`]), is
/// matmul `mm`'s A operand, when the matmul generator computes that norm in its prologue: A
/// not transposed, of rank 2 `[M, K]` with M a constant in `1..=`[`NORM_PROLOGUE_MAX_M`] and
/// K a constant in `1..=`[`NORM_PROLOGUE_MAX_K`], the norm over those rows; the operands bf16,
/// f16 or f32; B neither block-quantized nor `f8e4m3`. `None` otherwise (the norm then keeps a
/// kernel of its own).
///
/// Works on a whole function (the passes) and on a kernel body (the contract check); what
/// else the body must satisfy — the norm's input a kernel input through unary element-wise
/// nodes, its result read by the matmul alone — is [`norm_prologue_body`]'s.
pub fn norm_prologue(f: &Function, mm: Node) -> Option<Node> {
    let nd = f.nodes.get(mm)?;
    if nd.op.kind != OpKind::Matmul || nd.inputs.len() != 2 || nd.op.bool("transpose_a") == Some(true) || quantized_b(f, mm) {
        return None;
    }
    let (a, b) = (nd.inputs[0], nd.inputs[1]);
    let h = through_unary(f, a);
    let ValueDef::Result(norm, 0) = f.values.get(h)?.def else { return None };
    if !matches!(f.nodes.get(norm)?.op.kind, OpKind::RmsNorm | OpKind::LayerNorm) {
        return None;
    }
    let (at, bt) = (f.ty(a), f.ty(b));
    if !matches!(at.dtype, DType::BF16 | DType::F16 | DType::F32) || bt.dtype != at.dtype || at.rank() != 2 || f.ty(h).shape != at.shape {
        return None;
    }
    let m_ok = at.shape[0].as_const().is_some_and(|m| (1..=NORM_PROLOGUE_MAX_M).contains(&m));
    let k_ok = at.shape[1].as_const().is_some_and(|k| (1..=NORM_PROLOGUE_MAX_K).contains(&k));
    (m_ok && k_ok).then_some(norm)
}

/// What a kernel body must satisfy beyond [`norm_prologue`] for the matmul generator to
/// compute norm `norm` in matmul `mm`'s prologue: the values from the norm's result to A are
/// read by the next of them (the matmul last) alone and are no outputs; the norm's `x` is a
/// kernel input through views and unary element-wise nodes (the rows each CTA reads).
///
/// # Errors
/// The rule broken, in words.
pub fn norm_prologue_body(body: &Function, norm: Node, mm: Node) -> Result<(), String> {
    let nd = &body.nodes[norm];
    let mut v = body.nodes[mm].inputs[0];
    let mut reader = mm;
    loop {
        let read_elsewhere = body.nodes.iter().any(|(n, o)| n != reader && o.inputs.contains(&v));
        if read_elsewhere || body.outputs.contains(&v) {
            return Err(format!("the prologue's value {} is read by more than the matmul", body.label(v)));
        }
        let ValueDef::Result(n, _) = body.values[v].def else { break };
        if n == norm {
            break;
        }
        reader = n;
        v = body.nodes[n].inputs[0];
    }
    if super::view::viewed_param(body, through_unary(body, nd.inputs[0])).is_none() {
        return Err(format!("the prologue's `{}` reads {}, which is not a kernel input", nd.op.kind.name(), body.label(nd.inputs[0])));
    }
    Ok(())
}
