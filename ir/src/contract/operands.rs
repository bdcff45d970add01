//! Operands a generator reads in a form other than the plain buffer of their value: a
//! block-quantized B read as stored blocks ([`quantized_b`]), and the `f8e4m3` operands of the
//! fp8 matmul and attention read as stored bytes with their scales ([`fp8_matmul`],
//! [`fp8_attention`]). Everywhere else the operands of a matmul or attention are kernel
//! inputs read through views ([`is_strict_operand`], [`super::view::viewed_param`]).
//!
//! The fp8 forms depend on the target: only sm_90a multiplies e4m3 on tensor cores
//! ([`Target::has_fp8_matmul`]); on the other targets the dequantised operands are written to
//! buffers and the ordinary GEMM or attention reads them.

use super::target::Target;
use super::view::{is_param, viewed_param};
use crate::{Function, Node, OpKind, Value, ValueDef};

/// Operand positions of `k` that a generator reads as a buffer (they must be kernel inputs).
pub fn is_strict_operand(k: OpKind, i: usize) -> bool {
    match k {
        OpKind::Matmul | OpKind::Attention | OpKind::PagedAttention | OpKind::AttentionMerge => true,
        OpKind::KvAppend => i < 2,
        _ => false,
    }
}

/// The largest constant M of a matmul that reads its B operand as quantized blocks
/// ([`quantized_b`]); larger or symbolic M dequantise into a buffer and run the bf16 GEMM.
pub const QUANTIZED_MAX_M: i64 = 16;

/// The block-quantized dtypes whose blocks the matmul kernels decode in registers; the others
/// (`q5_0`, `q4_k`, `q6_k`) are read by `dequantize` alone.
pub const MATMUL_BLOCK_TYPES: [crate::DType; 2] = [crate::DType::Q8_0, crate::DType::Q4_1];

/// Whether matmul node `mm` of `f` reads its B operand as stored `q8_0`/`q4_1` blocks (the
/// quantized GEMV / small-M kernel of the matmul family, on every target): B is
/// `dequantize(w)` of a value `w` that is not computed (a parameter of `f`, so a kernel
/// input), with `transpose_b` (the GGUF layout `[N, K]`, blocks along K), `w` of rank 2 and
/// the result's M a constant ≤ [`QUANTIZED_MAX_M`]. Elsewhere the dequantised weight is
/// written to a buffer first.
pub fn quantized_b(f: &Function, mm: Node) -> bool {
    let nd = &f.nodes[mm];
    if nd.op.kind != OpKind::Matmul || nd.inputs.len() != 2 || nd.op.bool("transpose_b") != Some(true) || nd.op.bool("transpose_a") == Some(true) {
        return false;
    }
    let ValueDef::Result(dq, _) = f.values[nd.inputs[1]].def else { return false };
    let dnd = &f.nodes[dq];
    if dnd.op.kind != OpKind::Dequantize {
        return false;
    }
    let w = dnd.inputs[0];
    let out = &f.ty(nd.results[0]).shape;
    matches!(f.values[w].def, ValueDef::Param(_))
        && MATMUL_BLOCK_TYPES.contains(&f.ty(w).dtype)
        && f.ty(w).rank() == 2
        && out.len() >= 2
        && out[out.len() - 2].as_const().is_some_and(|m| (1..=QUANTIZED_MAX_M).contains(&m))
}

/// Whether `v` of `f` is `dequantize_fp8(x8, scale)` whose `x8` and `scale` a kernel reads
/// from buffers (`buffer` says which values are; a `constant` scale is recomputed in the
/// body): the operand an fp8 kernel reads as stored bytes and one f32, dequantising in
/// registers ([`fp8_matmul`], [`fp8_attention`]).
pub fn fp8_view_with(f: &Function, v: Value, buffer: &dyn Fn(Value) -> bool) -> bool {
    let ValueDef::Result(n, _) = f.values[v].def else { return false };
    let nd = &f.nodes[n];
    if nd.op.kind != OpKind::DequantizeFp8 || nd.inputs.len() != 2 {
        return false;
    }
    let constant = |x: Value| matches!(f.values[x].def, ValueDef::Result(c, _) if f.nodes[c].op.kind == OpKind::Constant);
    buffer(nd.inputs[0]) && (buffer(nd.inputs[1]) || constant(nd.inputs[1]))
}

/// Whether matmul node `mm` of `f` has the fp8 matmul's form, whatever the target: both
/// operands are `dequantize_fp8` of `f8e4m3` tensors read from buffers ([`fp8_view_with`]),
/// A `[…, M, K]` as stored and B a rank-2 `[N, K]` read with `transpose_b`: both K-major, as
/// FP8 tensor cores and `torch._scaled_mm` take them.
pub fn fp8_matmul_form(f: &Function, mm: Node, buffer: &dyn Fn(Value) -> bool) -> bool {
    let nd = &f.nodes[mm];
    if nd.op.kind != OpKind::Matmul || nd.inputs.len() != 2 || nd.op.bool("transpose_b") != Some(true) || nd.op.bool("transpose_a") == Some(true) {
        return false;
    }
    nd.inputs.iter().all(|&v| fp8_view_with(f, v, buffer)) && f.ty(nd.inputs[1]).rank() == 2
}

/// Whether matmul node `mm` of `f` is an FP8 matmul on `target`: [`fp8_matmul_form`] where the
/// target multiplies e4m3 ([`Target::has_fp8_matmul`]: sm_90a). Such a matmul is one kernel
/// reading the fp8 bytes and the two scales; elsewhere (another target, a bf16 operand,
/// another layout) the dequantised operands are written to buffers and the ordinary GEMM reads
/// them. Only `dequantize_fp8` the user wrote is fused: the passes never introduce fp8.
pub fn fp8_matmul_with(f: &Function, mm: Node, buffer: &dyn Fn(Value) -> bool, target: &Target) -> bool {
    target.has_fp8_matmul() && fp8_matmul_form(f, mm, buffer)
}

/// Whether attention node `n` of `f` has the fp8 attention's form, whatever the target: q, k
/// and v are all `dequantize_fp8` of `f8e4m3` tensors read from buffers ([`fp8_view_with`];
/// FlashAttention-3's FP8 forward with per-tensor descaling), a mask, if any, a kernel input
/// through views.
pub fn fp8_attention_form(f: &Function, n: Node, buffer: &dyn Fn(Value) -> bool) -> bool {
    let nd = &f.nodes[n];
    nd.op.kind == OpKind::Attention
        && nd.inputs.len() >= 3
        && nd.inputs[..3].iter().all(|&v| fp8_view_with(f, v, buffer))
        && nd.inputs.get(3).is_none_or(|&m| viewed_param(f, m).is_some())
}

/// Whether attention node `n` of `f` is an FP8 attention on `target`: [`fp8_attention_form`]
/// where the target multiplies e4m3 ([`Target::has_fp8_matmul`]: sm_90a), within the fp8
/// kernel's limits ([`super::families::fp8_attention_kernel`]: head dims 64/128, no mask).
pub fn fp8_attention_with(f: &Function, n: Node, buffer: &dyn Fn(Value) -> bool, target: &Target) -> bool {
    target.has_fp8_matmul() && fp8_attention_form(f, n, buffer) && super::families::fp8_attention_kernel(f, &f.nodes[n]).is_ok()
}

/// [`fp8_matmul_with`] in a kernel body: the fp8 tensors and scales are kernel inputs.
pub fn fp8_matmul(f: &Function, mm: Node, target: &Target) -> bool {
    fp8_matmul_with(f, mm, &|v| is_param(f, v), target)
}

/// [`fp8_attention_with`] in a kernel body: the fp8 tensors and scales are kernel inputs.
pub fn fp8_attention(f: &Function, n: Node, target: &Target) -> bool {
    fp8_attention_with(f, n, &|v| is_param(f, v), target)
}

/// Whether operand `i` of node `n` of `f` is read as fp8 bytes by its kernel on `target` (an
/// operand of an FP8 matmul or attention, `buffer` as in [`fp8_view_with`]).
pub fn reads_fp8_with(f: &Function, n: Node, i: usize, buffer: &dyn Fn(Value) -> bool, target: &Target) -> bool {
    match f.nodes[n].op.kind {
        OpKind::Matmul => i < 2 && fp8_matmul_with(f, n, buffer, target),
        OpKind::Attention => i < 3 && fp8_attention_with(f, n, buffer, target),
        _ => false,
    }
}
