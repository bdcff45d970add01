//! The per-family acceptance rules: which kernel bodies each generator takes (the table of
//! [`super`]'s docs), checked on a built kernel by [`check`].

use std::collections::HashSet;

use super::operands::{fp8_attention, fp8_attention_form, fp8_matmul, fp8_matmul_form, quantized_b};
use super::target::Target;
use super::view::{is_param, peel, viewed_param};
use crate::{DType, Dim, Family, KernelData, Op, OpClass, OpKind, TensorType, Value, ValueDef};

/// The largest head dimension, of Q/K and of V, that the attention generators accept (the
/// CUDA-core, `mma.sync` and `wgmma` prefill kernels and the paged decode kernels alike): a
/// head dim must be a constant in `1..=MAX_ATTENTION_HEAD_DIM`. The code generator's own
/// check (`sinter_codegen`'s attention analysis) uses this one constant; the passes lower an
/// attention with a larger head dim as its decomposition (matmul, scale, softmax, matmul).
pub const MAX_ATTENTION_HEAD_DIM: u32 = 512;

/// Whether the generators of `kind` (`attention` or `paged_attention`) implement a sliding
/// `window` and a logit `softcap`: their key loops skip the tiles wholly outside the window
/// and mask the partial ones, and cap each score before the mask. Where this is false, the
/// contract refuses a node with either attribute and the passes lower it as its
/// decomposition (the one place a window becomes a dense mask).
pub fn window_softcap_kernels(kind: OpKind) -> bool {
    // Attention: the `mma.sync` and CUDA-core kernels (not `wgmma`, which leaves such a node
    // to `mma.sync`); PagedAttention: the split-KV and the single-CTA kernels.
    matches!(kind, OpKind::Attention | OpKind::PagedAttention)
}

/// The `window` and `softcap` of attention node `op` against [`window_softcap_kernels`]: when
/// given, a window in `1..=i32::MAX` with `causal=true` and a finite f32 softcap above 0
/// (as the verifier checks), on an op whose kernels implement them.
fn window_softcap(op: &Op) -> Result<(), String> {
    let name = op.kind.name();
    let window = op.int("window");
    let softcap = op.float("softcap");
    if window.is_none() && softcap.is_none() {
        return Ok(());
    }
    if let Some(w) = window {
        if !(1..=i64::from(i32::MAX)).contains(&w) || op.bool("causal") != Some(true) {
            return Err(format!("`{name}`: window={w} must be in 1..={} with causal=true", i32::MAX));
        }
    }
    if let Some(c) = softcap {
        if !(c > 0.0 && (c as f32).is_finite()) {
            return Err(format!("`{name}`: softcap must be a finite f32 above 0, got {c}"));
        }
    }
    if !window_softcap_kernels(op.kind) {
        return Err(format!("`{name}`: no kernel implements a sliding window or a softcap (window={window:?}, softcap={softcap:?})"));
    }
    Ok(())
}

/// Whether `d` is a head dim the attention generators take: a constant in
/// `1..=`[`MAX_ATTENTION_HEAD_DIM`].
pub fn head_dim_ok(d: &Dim) -> bool {
    d.as_const().is_some_and(|v| (1..=i64::from(MAX_ATTENTION_HEAD_DIM)).contains(&v))
}

/// The rules of one `attention` or `paged_attention` node by itself — its op and its operands'
/// types, as the attention generators analyse them — on `target`; [`check`] applies them to
/// an Attention or PagedAttention kernel's node, and the passes to an attention they might
/// form (before extraction picks it) or lower (a user-written one). The rules:
///
/// - `heads` and `kv_heads` positive, `heads` a multiple of `kv_heads`;
/// - `attention`: q, k, v rank 4 of one float dtype; the head dims of q/k and of v (the last
///   axis in both layouts) constants in `1..=`[`MAX_ATTENTION_HEAD_DIM`]; a mask a float
///   tensor of rank ≤ 4;
/// - `paged_attention`: q and the K pages rank 4 of one float dtype, the V pages of the K
///   pages' type; `block_table` i32 of rank 2 and `seq_lens` i32 of rank 1; the head dim a
///   constant in `1..=`[`MAX_ATTENTION_HEAD_DIM`]; `unified_max`, when given, a finite f32;
/// - both: a `window` or `softcap` only where [`window_softcap_kernels`] says the op's
///   kernels implement them (and valid: a window in `1..=i32::MAX` with `causal=true`, a
///   finite f32 softcap above 0).
///
/// The same on every target today (fp8 operands, sm_90a only, are [`check`]'s). Shared
/// memory is the generator's schedule's: every schedule at a head dim within the limit fits.
///
/// # Errors
/// The rule broken, in words; an op other than the two attentions is refused.
pub fn attention_node(op: &Op, ins: &[&TensorType], target: &Target) -> Result<(), String> {
    let _ = target;
    let name = op.kind.name();
    let (heads, kv_heads) = (op.int("heads").unwrap_or(0), op.int("kv_heads").unwrap_or(0));
    if heads <= 0 || kv_heads <= 0 || heads % kv_heads != 0 {
        return Err(format!("`{name}`: heads ({heads}) must be a positive multiple of kv_heads ({kv_heads})"));
    }
    if matches!(op.kind, OpKind::Attention | OpKind::PagedAttention) {
        window_softcap(op)?;
    }
    let head_dim = |t: &TensorType, what: &str| -> Result<(), String> {
        match t.shape.last() {
            Some(d) if head_dim_ok(d) => Ok(()),
            d => Err(format!("`{name}`: the head dim of {what} must be a constant in 1..={MAX_ATTENTION_HEAD_DIM}, got {}", d.map_or("none".into(), |d| d.to_string()))),
        }
    };
    match op.kind {
        OpKind::Attention => {
            let [q, k, v, rest @ ..] = ins else { return Err(format!("`{name}` with {} operands", ins.len())) };
            if !q.dtype.is_float() || [q, k, v].iter().any(|t| t.rank() != 4 || t.dtype != q.dtype) {
                return Err(format!("`{name}`: q, k and v must be rank-4 tensors of one float dtype, got {q}, {k}, {v}"));
            }
            head_dim(q, "q and k")?;
            head_dim(v, "v")?;
            if let Some(m) = rest.first() {
                if !m.dtype.is_float() || m.rank() > 4 {
                    return Err(format!("`{name}`: the mask is {m}: a float tensor broadcasting to [B, H, Sq, Skv] expected"));
                }
            }
            Ok(())
        }
        OpKind::PagedAttention => {
            let [q, kp, vp, table, lens, ..] = ins else { return Err(format!("`{name}` with {} operands", ins.len())) };
            if !q.dtype.is_float() || q.rank() != 4 || kp.rank() != 4 || kp.dtype != q.dtype || vp != kp {
                return Err(format!("`{name}`: q and the pages must be rank-4 tensors of one float dtype, got {q}, {kp} and {vp}"));
            }
            if table.dtype != DType::I32 || table.rank() != 2 || lens.dtype != DType::I32 || lens.rank() != 1 {
                return Err(format!("`{name}`: block_table must be i32[B, M] and seq_lens i32[B], got {table} and {lens}"));
            }
            head_dim(q, "q")?;
            match op.float("unified_max") {
                Some(phi) if !(phi as f32).is_finite() => Err(format!("`{name}`: unified_max must be a finite f32, got {phi}")),
                _ => Ok(()),
            }
        }
        _ => Err(format!("`{name}` is not an attention")),
    }
}

/// Whether `k` is a row node of the RowReduction family.
pub fn is_row_node(k: OpKind) -> bool {
    use OpKind::*;
    matches!(k, ReduceSum | ReduceMax | ReduceMin | ReduceMean | Softmax | LogSoftmax | RmsNorm | LayerNorm)
}

/// Whether `k` computes each output element from the same element of its operands
/// (broadcasting aside): unary, binary, comparison, `select`, `swiglu`.
pub fn is_elementwise(k: OpKind) -> bool {
    matches!(k.info().class, OpClass::Unary | OpClass::Binary | OpClass::Compare) || k == OpKind::Swiglu
}

/// Whether `k` rotates pairs of its first operand's last axis (`rope`, angles from positions;
/// `rotary`, caller-supplied cos/sin tables): each output element also reads its pair's
/// partner in the same row, and the other operands are read at the element's own row.
pub fn is_rotation(k: OpKind) -> bool {
    matches!(k, OpKind::Rope | OpKind::Rotary)
}

/// Whether the element evaluator can compute `k` (everything but the ops that need a kernel
/// of their own, and row nodes outside row reductions).
pub fn evaluable(k: OpKind) -> bool {
    !matches!(k, OpKind::Matmul | OpKind::Attention | OpKind::PagedAttention | OpKind::AttentionMerge | OpKind::KvAppend | OpKind::Call) && !is_row_node(k)
}

/// Whether outputs of shapes `plain` (as written) and `peeled` (trailing reshapes peeled) can
/// be written by one pointwise kernel: all of one shape either way.
pub fn one_shape(plain: &[Vec<Dim>], peeled: &[Vec<Dim>]) -> bool {
    let same = |s: &[Vec<Dim>]| s.iter().all(|x| *x == s[0]);
    plain.is_empty() || same(plain) || same(peeled)
}

/// Checks a kernel's body against its family's rules on `target` (see the module docs).
///
/// # Errors
/// What the generator would reject, in words.
pub fn check(kd: &KernelData, target: &Target) -> Result<(), String> {
    let body = &kd.body;
    if body.outputs.is_empty() {
        return Err("the kernel has no outputs".into());
    }
    fp8_outside_its_kernels(kd)?;
    match kd.family {
        Family::Pointwise | Family::Layout | Family::Gather => {
            if let Some(nd) = body.nodes.values().find(|nd| !evaluable(nd.op.kind)) {
                return Err(format!("`{}` in a {:?} kernel", nd.op.kind.name(), kd.family));
            }
            let plain: Vec<Vec<Dim>> = body.outputs.iter().map(|&o| body.ty(o).shape.clone()).collect();
            let peeled: Vec<Vec<Dim>> = body.outputs.iter().map(|&o| body.ty(peel(body, o)).shape.clone()).collect();
            if !one_shape(&plain, &peeled) {
                return Err("the outputs have different shapes".into());
            }
            Ok(())
        }
        Family::RowReduction => {
            let mut sref: Option<Vec<Dim>> = None;
            for nd in body.nodes.values() {
                let k = nd.op.kind;
                if !evaluable(k) && !is_row_node(k) {
                    return Err(format!("`{}` in a RowReduction kernel", k.name()));
                }
                if !is_row_node(k) {
                    continue;
                }
                let xs = body.ty(nd.inputs[0]).shape.clone();
                if xs.is_empty() {
                    return Err(format!("`{}` of a scalar", k.name()));
                }
                if let Some(a) = nd.op.int("axis") {
                    if !(a == -1 || a + 1 == xs.len() as i64) {
                        return Err(format!("`{}` over axis {a}, not the last", k.name()));
                    }
                }
                match &sref {
                    None => sref = Some(xs),
                    Some(s) if *s == xs => {}
                    Some(_) => return Err("row nodes over rows of different shapes".into()),
                }
            }
            let Some(sref) = sref else { return Err("no row node".into()) };
            // A row's statistics exist while that row is computed: a slice of a value derived
            // from a row node reads it at the row's own coordinates only along the row itself.
            let mut from_rows: HashSet<Value> = HashSet::new();
            for nd in body.nodes.values() {
                if !is_row_node(nd.op.kind) && !nd.inputs.iter().any(|v| from_rows.contains(v)) {
                    continue;
                }
                if is_rotation(nd.op.kind) && body.ty(nd.inputs[0]).shape != sref {
                    return Err(format!("a {} of {} reads a row node's result at another row", nd.op.kind.name(), body.ty(nd.inputs[0])));
                }
                if nd.op.kind == OpKind::Slice {
                    let xs = &body.ty(nd.inputs[0]).shape;
                    let axis = nd.op.int("axis").unwrap_or(-1);
                    if *xs != sref || !(axis == -1 || axis + 1 == xs.len() as i64) {
                        return Err(format!("a slice over axis {axis} of {} reads a row node's result at another row", body.ty(nd.inputs[0])));
                    }
                }
                from_rows.extend(nd.results.iter().copied());
            }
            let lead = sref[..sref.len() - 1].to_vec();
            let mut lead1 = lead.clone();
            lead1.push(Dim::constant(1));
            for &o in &body.outputs {
                let mut v = o;
                loop {
                    let sh = &body.ty(v).shape;
                    if *sh == sref || *sh == lead1 || *sh == lead {
                        break;
                    }
                    match body.values[v].def {
                        ValueDef::Result(n, _) if body.nodes[n].op.kind == OpKind::Reshape => v = body.nodes[n].inputs[0],
                        _ => return Err(format!("output {} is {}, neither a row nor one value per row", body.label(o), body.ty(o))),
                    }
                }
            }
            Ok(())
        }
        Family::Matmul => {
            let mut mms = body.nodes.iter().filter(|(_, nd)| nd.op.kind == OpKind::Matmul);
            let Some((_, mnd)) = mms.next() else { return Err("no matmul".into()) };
            if mms.next().is_some() {
                return Err("more than one matmul".into());
            }
            let (mm, _) = body.nodes.iter().find(|(_, nd)| nd.op.kind == OpKind::Matmul).ok_or("no matmul")?;
            if !target.has_fp8_matmul() && fp8_matmul_form(body, mm, &|v| is_param(body, v)) {
                return Err(format!("an fp8 matmul multiplies e4m3 on sm_90a only, not {target}"));
            }
            // A row norm the generator computes in its prologue (`super::prologue`).
            let prologue = match super::prologue::norm_prologue(body, mm) {
                Some(nn) => super::prologue::norm_prologue_body(body, nn, mm).map(|()| nn).ok(),
                None => None,
            };
            let operand_ok = |i: usize, v: Value| viewed_param(body, v).is_some() || (i == 1 && quantized_b(body, mm)) || fp8_matmul(body, mm, target) || (i == 0 && prologue.is_some());
            if mnd.inputs.len() != 2 || mnd.results.len() != 1 || !mnd.inputs.iter().enumerate().all(|(i, &v)| operand_ok(i, v)) {
                return Err("the matmul's operands must be kernel inputs (possibly through reshapes and slices)".into());
            }
            let (a, b) = (body.ty(mnd.inputs[0]), body.ty(mnd.inputs[1]));
            if !a.dtype.is_float() || a.dtype != b.dtype {
                return Err(format!("matmul of {a} and {b}"));
            }
            for (n, nd) in body.nodes.iter() {
                match nd.op.kind {
                    OpKind::Matmul => {}
                    _ if Some(n) == prologue => {}
                    OpKind::KvAppend if !nd.inputs[..2].iter().all(|&v| is_param(body, v)) => {
                        return Err("the kv_append's page operands must be kernel inputs".into());
                    }
                    OpKind::KvAppend => {}
                    k if !evaluable(k) => return Err(format!("`{}` in a Matmul kernel", k.name())),
                    _ => {}
                }
            }
            super::epilogue::analyse(body, mnd.results[0]).map(|_| ())
        }
        Family::Attention | Family::PagedAttention | Family::AttentionMerge => {
            let want = match kd.family {
                Family::Attention => OpKind::Attention,
                Family::PagedAttention => OpKind::PagedAttention,
                _ => OpKind::AttentionMerge,
            };
            // Views, and the `dequantize_fp8` (with a constant scale) of an fp8 attention.
            let node = body.nodes.iter().find(|(_, nd)| nd.op.kind == want).map(|(n, _)| n);
            if !target.has_fp8_matmul() && node.is_some_and(|n| fp8_attention_form(body, n, &|v| is_param(body, v))) {
                return Err(format!("an fp8 attention multiplies e4m3 on sm_90a only, not {target}"));
            }
            let fp8 = node.is_some_and(|n| fp8_attention(body, n, target));
            let aside = |k: OpKind| matches!(k, OpKind::Reshape | OpKind::Slice) || (fp8 && matches!(k, OpKind::DequantizeFp8 | OpKind::Constant));
            let mut main = body.nodes.values().filter(|nd| !aside(nd.op.kind));
            match (main.next(), main.next()) {
                (Some(nd), None) if nd.op.kind == want => {
                    if want != OpKind::AttentionMerge {
                        let tys: Vec<&TensorType> = nd.inputs.iter().map(|&v| body.ty(v)).collect();
                        attention_node(&nd.op, &tys, target)?;
                    }
                    if !nd.inputs.iter().enumerate().all(|(i, &v)| viewed_param(body, v).is_some() || (fp8 && i < 3)) {
                        return Err("operands must be kernel inputs (possibly through reshapes and slices)".into());
                    }
                    // O is an output; every output is a result of the node (the lse may be unused).
                    let peeled: Vec<Value> = body.outputs.iter().map(|&o| peel(body, o)).collect();
                    let distinct: HashSet<Value> = peeled.iter().copied().collect();
                    if peeled.contains(&nd.results[0]) && peeled.iter().all(|v| nd.results.contains(v)) && distinct.len() == peeled.len() {
                        Ok(())
                    } else {
                        Err("the outputs must be the node's results (possibly through reshapes), O among them".into())
                    }
                }
                _ => Err(format!("the body must be exactly one `{}` node (and views)", want.name())),
            }
        }
        Family::KvAppend => {
            let mut kv = body.nodes.values().filter(|nd| nd.op.kind == OpKind::KvAppend);
            let Some(nd) = kv.next() else { return Err("no kv_append".into()) };
            if kv.next().is_some() {
                return Err("more than one kv_append".into());
            }
            if let Some(o) = body.nodes.values().find(|o| o.op.kind != OpKind::KvAppend && !evaluable(o.op.kind)) {
                return Err(format!("`{}` in a KvAppend kernel", o.op.kind.name()));
            }
            if nd.inputs.len() != 6 || !nd.inputs[..2].iter().all(|&v| is_param(body, v)) {
                return Err("the page operands must be kernel inputs".into());
            }
            let outs: HashSet<Value> = body.outputs.iter().copied().collect();
            let res: HashSet<Value> = nd.results.iter().copied().collect();
            if body.outputs.len() != nd.results.len() || outs != res {
                return Err("the outputs must be exactly the kv_append's results".into());
            }
            Ok(())
        }
    }
}

/// What the one fp8 attention kernel (sm_90a `wgmma`, e4m3 Q·Kᵀ and P·V) takes beyond
/// [`super::operands::fp8_attention_form`]: head dims 64 or 128 (of q/k and of v), no additive
/// mask, a bf16 or f16 result; [`super::operands::fp8_attention_with`] requires it, so an fp8
/// attention outside these limits has its operands dequantised into buffers. (Its q/k/v rows
/// must also be contiguous and 16-byte aligned: a buffer layout fact the generator checks.)
///
/// # Errors
/// The limit broken, in words.
pub fn fp8_attention_kernel(body: &crate::Function, nd: &crate::NodeData) -> Result<(), String> {
    let dim = |v: Value| body.ty(v).shape.last().and_then(Dim::as_const);
    let (d, dv) = (dim(nd.inputs[0]), dim(nd.inputs[2]));
    if !matches!(d, Some(64 | 128)) || !matches!(dv, Some(64 | 128)) {
        return Err(format!("an fp8 attention takes head dims 64 and 128 only, not {d:?} and {dv:?}"));
    }
    if nd.inputs.len() > 3 {
        return Err("an fp8 attention takes no additive mask".into());
    }
    if nd.op.int("window").is_some() || nd.op.float("softcap").is_some() {
        return Err("an fp8 attention takes no sliding window or softcap".into());
    }
    let out = body.ty(nd.results[0]).dtype;
    if !matches!(out, DType::BF16 | DType::F16) {
        return Err(format!("an fp8 attention gives bf16 or f16, not {out}"));
    }
    Ok(())
}

/// `f8e4m3` where no generator reads it: any fp8 value (a parameter or a result) in a paged
/// attention, attention merge or KV append kernel; in a matmul kernel an fp8 result, or a
/// `dequantize_fp8` the epilogue reads (not one of the matmul's operands).
fn fp8_outside_its_kernels(kd: &KernelData) -> Result<(), String> {
    let body = &kd.body;
    match kd.family {
        Family::PagedAttention | Family::AttentionMerge | Family::KvAppend => match body.values.iter().find(|(_, d)| d.ty.dtype.is_fp8()) {
            Some((v, d)) => Err(format!("f8e4m3 value {} ({}) in a {:?} kernel", body.label(v), d.ty, kd.family)),
            None => Ok(()),
        },
        Family::Matmul => {
            let operands: Vec<Value> = body.nodes.values().filter(|n| n.op.kind == OpKind::Matmul).flat_map(|n| n.inputs.iter().copied()).collect();
            let bad = body.values.iter().find(|(v, d)| match d.def {
                ValueDef::Result(n, _) => d.ty.dtype.is_fp8() || (body.nodes[n].op.kind == OpKind::DequantizeFp8 && !operands.contains(v)),
                ValueDef::Param(_) => false,
            });
            match bad {
                Some((v, d)) => Err(format!("f8e4m3 in a matmul epilogue: value {} ({})", body.label(v), d.ty)),
                None => Ok(()),
            }
        }
        _ => Ok(()),
    }
}
