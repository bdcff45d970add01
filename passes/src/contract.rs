//! The code generator's contract: which kernel bodies each family's generator accepts.
//!
//! `sinter-codegen` generates one family per file (`codegen/src/kernels/`); each generator
//! accepts only some bodies and answers `Unsupported` for the rest. The passes do not depend
//! on the code generator (ARCHITECTURE.md: the arrows point one way), so the rules are
//! restated here, and [`check`] runs them on every kernel that [`crate::compile`] produces
//! under [`crate::PassOptions::codegen_contract`]: a kernel outside them is split
//! ([`crate::partition::dissolve`]) and the graph rebuilt.
//!
//! `f8e4m3` (issue #8): the FP8 matmul and attention bodies below are the shapes the FP8
//! kernels take. The FP8 matmul is generated on sm_90a (the `wgmma` e4m3 GEMM); the code
//! generator refuses every other kernel holding an `f8e4m3` value (the FP8 attention, the
//! matmul on other targets) with `Unsupported` (naming the dtype), and such graphs run on the
//! interpreter only.
//!
//! | family | body |
//! |---|---|
//! | Pointwise, Layout, Gather | element-wise ops, sources and views (no matmul, attention, `kv_append`, row reductions); every output of one shape, or of one shape once trailing `reshape`s are peeled |
//! | RowReduction | row nodes (`reduce_*`, `softmax`, `log_softmax`, `rms_norm`, `layer_norm`) over the last axis of operands of one shape `[L…, N]`, element-wise prologue and epilogue; every output (trailing reshapes peeled) `[L…, N]`, `[L…, 1]` or `[L…]` |
//! | Matmul | exactly one `matmul` of two float operands of one dtype that are kernel inputs through `reshape`s and `slice`s ([`sinter_ir::epilogue::viewed_param`]), or a B operand that is `dequantize` of a `q8_0`/`q4_1` kernel input `[N, K]` read with `transpose_b` at a constant M ≤ 16 ([`quantized_b`]), or both operands `dequantize_fp8` of `f8e4m3` kernel inputs, B `[N, K]` read with `transpose_b` ([`fp8_matmul`]); an epilogue that [`sinter_ir::epilogue::analyse`] accepts — element-wise at the same element, column segments through element-wise ops, reshapes, `rope` and a `kv_append` whose pages are kernel inputs (the QKV projection writing K and V into the cache), or paired segments (SwiGLU over gate/up) |
//! | Attention, PagedAttention | exactly one `attention` / `paged_attention` node (and views) whose operands are kernel inputs through `reshape`s and `slice`s — or, for `attention`, q, k, v all `dequantize_fp8` of `f8e4m3` kernel inputs ([`fp8_attention`]) — and whose result, through `reshape`s, is the one output (with `lse=true`: O and, unless unused, the lse result, through `reshape`s, are the outputs) |
//! | AttentionMerge | exactly one `attention_merge` node (and views) whose operands are kernel inputs through `reshape`s and `slice`s and whose o result and, unless unused, lse result are the outputs through `reshape`s |
//! | KvAppend | one `kv_append` whose page operands are kernel inputs and whose two results are exactly the outputs; element-wise ops and views on the other operands |

use std::collections::HashSet;

use sinter_ir::epilogue::viewed_param;
use sinter_ir::{Dim, Family, Function, KernelData, OpClass, OpKind, Value, ValueDef};

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

/// Whether the element evaluator can compute `k` (everything but the ops that need a kernel
/// of their own, and row nodes outside row reductions).
fn evaluable(k: OpKind) -> bool {
    !matches!(k, OpKind::Matmul | OpKind::Attention | OpKind::PagedAttention | OpKind::AttentionMerge | OpKind::KvAppend | OpKind::Call) && !is_row_node(k)
}

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

/// Whether matmul node `mm` of `f` reads its B operand as stored `q8_0`/`q4_1` blocks (the
/// quantized GEMV / small-M kernel of `codegen`'s matmul family): B is `dequantize(w)` of a
/// value `w` that is not computed (a parameter of `f`, so a kernel input), with
/// `transpose_b` (the GGUF layout `[N, K]`, blocks along K), `w` of rank 2 and the result's
/// M a constant ≤ [`QUANTIZED_MAX_M`]. Elsewhere the dequantised weight is written to a
/// buffer first.
pub fn quantized_b(f: &Function, mm: sinter_ir::Node) -> bool {
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

/// Whether matmul node `mm` of `f` is an FP8 matmul (issue #8): both operands are
/// `dequantize_fp8` of `f8e4m3` tensors read from buffers ([`fp8_view_with`]), A `[…, M, K]`
/// as stored and B a rank-2 `[N, K]` read with `transpose_b`: both K-major, as FP8 tensor cores
/// (`mma` e4m3 from sm_89, `wgmma` on sm_90a) and `torch._scaled_mm` take them. Such a matmul
/// is one kernel reading the fp8 bytes and the two scales; elsewhere (a bf16 operand, another
/// layout) the dequantised operands are written to buffers and the ordinary GEMM reads them.
/// Only `dequantize_fp8` the user wrote is fused: the passes never introduce fp8.
pub fn fp8_matmul_with(f: &Function, mm: sinter_ir::Node, buffer: &dyn Fn(Value) -> bool) -> bool {
    let nd = &f.nodes[mm];
    if nd.op.kind != OpKind::Matmul || nd.inputs.len() != 2 || nd.op.bool("transpose_b") != Some(true) || nd.op.bool("transpose_a") == Some(true) {
        return false;
    }
    nd.inputs.iter().all(|&v| fp8_view_with(f, v, buffer)) && f.ty(nd.inputs[1]).rank() == 2
}

/// Whether attention node `n` of `f` is an FP8 attention: q, k and v are all `dequantize_fp8`
/// of `f8e4m3` tensors read from buffers ([`fp8_view_with`]; FlashAttention-3's FP8 forward
/// with per-tensor descaling), a mask, if any, a kernel input through views.
pub fn fp8_attention_with(f: &Function, n: sinter_ir::Node, buffer: &dyn Fn(Value) -> bool) -> bool {
    let nd = &f.nodes[n];
    nd.op.kind == OpKind::Attention
        && nd.inputs.len() >= 3
        && nd.inputs[..3].iter().all(|&v| fp8_view_with(f, v, buffer))
        && nd.inputs.get(3).is_none_or(|&m| viewed_param(f, m).is_some())
}

/// Whether `v` of kernel body `f` is a kernel input (a parameter).
fn param(f: &Function) -> impl Fn(Value) -> bool + '_ {
    move |v| matches!(f.values[v].def, ValueDef::Param(_))
}

/// [`fp8_matmul_with`] in a kernel body: the fp8 tensors and scales are kernel inputs.
pub fn fp8_matmul(f: &Function, mm: sinter_ir::Node) -> bool {
    fp8_matmul_with(f, mm, &param(f))
}

/// [`fp8_attention_with`] in a kernel body: the fp8 tensors and scales are kernel inputs.
pub fn fp8_attention(f: &Function, n: sinter_ir::Node) -> bool {
    fp8_attention_with(f, n, &param(f))
}

/// Whether operand `i` of node `n` of `f` is read as fp8 bytes by its kernel (an operand of an
/// FP8 matmul or attention, `buffer` as in [`fp8_view_with`]).
pub fn reads_fp8_with(f: &Function, n: sinter_ir::Node, i: usize, buffer: &dyn Fn(Value) -> bool) -> bool {
    match f.nodes[n].op.kind {
        OpKind::Matmul => i < 2 && fp8_matmul_with(f, n, buffer),
        OpKind::Attention => i < 3 && fp8_attention_with(f, n, buffer),
        _ => false,
    }
}

/// Follows `v` back through `reshape` nodes of `body` (as the generators peel trailing
/// reshapes of contiguous outputs).
pub fn peel(body: &Function, mut v: Value) -> Value {
    while let ValueDef::Result(n, _) = body.values[v].def {
        let nd = &body.nodes[n];
        if nd.op.kind != OpKind::Reshape {
            break;
        }
        v = nd.inputs[0];
    }
    v
}

/// Whether outputs of shapes `plain` (as written) and `peeled` (trailing reshapes peeled) can
/// be written by one pointwise kernel: all of one shape either way.
pub fn one_shape(plain: &[Vec<Dim>], peeled: &[Vec<Dim>]) -> bool {
    let same = |s: &[Vec<Dim>]| s.iter().all(|x| *x == s[0]);
    plain.is_empty() || same(plain) || same(peeled)
}

/// Checks a kernel's body against its family's rules (see the module docs).
///
/// # Errors
/// What the generator would reject, in words.
pub fn check(kd: &KernelData) -> Result<(), String> {
    let body = &kd.body;
    if body.outputs.is_empty() {
        return Err("the kernel has no outputs".into());
    }
    let is_param = |v: Value| matches!(body.values[v].def, ValueDef::Param(_));
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
            let operand_ok = |i: usize, v: Value| viewed_param(body, v).is_some() || (i == 1 && quantized_b(body, mm)) || fp8_matmul(body, mm);
            if mnd.inputs.len() != 2 || mnd.results.len() != 1 || !mnd.inputs.iter().enumerate().all(|(i, &v)| operand_ok(i, v)) {
                return Err("the matmul's operands must be kernel inputs (possibly through reshapes and slices)".into());
            }
            let (a, b) = (body.ty(mnd.inputs[0]), body.ty(mnd.inputs[1]));
            if !a.dtype.is_float() || a.dtype != b.dtype {
                return Err(format!("matmul of {a} and {b}"));
            }
            for nd in body.nodes.values() {
                match nd.op.kind {
                    OpKind::Matmul => {}
                    OpKind::KvAppend if !nd.inputs[..2].iter().all(|&v| is_param(v)) => {
                        return Err("the kv_append's page operands must be kernel inputs".into());
                    }
                    OpKind::KvAppend => {}
                    k if !evaluable(k) => return Err(format!("`{}` in a Matmul kernel", k.name())),
                    _ => {}
                }
            }
            sinter_ir::epilogue::analyse(body, mnd.results[0]).map(|_| ())
        }
        Family::Attention | Family::PagedAttention | Family::AttentionMerge => {
            let want = match kd.family {
                Family::Attention => OpKind::Attention,
                Family::PagedAttention => OpKind::PagedAttention,
                _ => OpKind::AttentionMerge,
            };
            // Views, and the `dequantize_fp8` (with a constant scale) of an fp8 attention.
            let fp8 = body.nodes.iter().find(|(_, nd)| nd.op.kind == want).is_some_and(|(n, _)| fp8_attention(body, n));
            let aside = |k: OpKind| matches!(k, OpKind::Reshape | OpKind::Slice) || (fp8 && matches!(k, OpKind::DequantizeFp8 | OpKind::Constant));
            let mut main = body.nodes.values().filter(|nd| !aside(nd.op.kind));
            match (main.next(), main.next()) {
                (Some(nd), None) if nd.op.kind == want => {
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
            if nd.inputs.len() != 6 || !nd.inputs[..2].iter().all(|&v| is_param(v)) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{compile, PassOptions};
    use sinter_ir::interp::{self, run_kernel_graph, Tensor};
    use sinter_ir::{Bindings, Graph, KernelGraph};

    fn refused(kg: &KernelGraph) -> Vec<String> {
        kg.kernels.iter().filter_map(|(k, kd)| check(kd).err().map(|e| format!("{k} ({:?}): {e}", kd.family))).collect()
    }

    /// Compiles `src` with and without the contract; checks the contract holds with it and the
    /// fused graph matches the reference (T = 5).
    fn compile_both(src: &str) -> (KernelGraph, KernelGraph) {
        let g: Graph = sinter_ir::parse(src).unwrap();
        let (kg, _) = compile(&g, &PassOptions::default()).unwrap();
        assert_eq!(refused(&kg), Vec::<String>::new());
        let f = g.entry().unwrap();
        let b: Bindings = [("T".to_string(), 5)].into_iter().collect();
        let ins: Vec<Tensor> = f
            .params
            .iter()
            .map(|&p| {
                let ty = f.ty(p);
                let shape: Vec<usize> = ty.shape.iter().map(|d| d.eval(&b).unwrap() as usize).collect();
                Tensor::from_fn(ty.dtype, &shape, |i| ((i.iter().sum::<usize>() * 7 + 3) % 11) as f64 / 11.0 - 0.4)
            })
            .collect();
        let refs: Vec<&Tensor> = ins.iter().collect();
        let want = interp::run(&g, &f.name, &refs, &b).unwrap();
        let got = run_kernel_graph(&kg, &refs, &b).unwrap();
        for (w, o) in want.iter().zip(&got) {
            crate::check::compare(w, o, false).unwrap();
        }
        let (free, _) = compile(&g, &PassOptions { codegen_contract: false, ..PassOptions::default() }).unwrap();
        (kg, free)
    }

    #[test]
    fn merged_projection_with_rope_and_attention_stays_within_the_contract() {
        // A QKV projection whose column slices are reshaped, RoPE'd and fed to attention: the
        // slices and RoPE join the matmul's columns epilogue (which writes Q and K roped and V
        // as three outputs), attention reads them through reshapes and writes its output
        // through one: two kernels, both within the contract.
        let src = "func @main(%x: f32[T, 16], %w: f32[32, 16], %pos: i32[T]) {
  %qkv: f32[T, 32] = matmul(%x, %w) {transpose_b=true}
  %q: f32[T, 16] = slice(%qkv) {start=0, end=16}
  %k: f32[T, 8] = slice(%qkv) {start=16, end=24}
  %v: f32[T, 8] = slice(%qkv) {start=24, end=32}
  %q3: f32[T, 2, 8] = reshape(%q) {shape=[T, 2, 8]}
  %k3: f32[T, 1, 8] = reshape(%k) {shape=[T, 1, 8]}
  %p: i32[T, 1] = reshape(%pos) {shape=[T, 1]}
  %qr: f32[T, 2, 8] = rope(%q3, %p) {theta=10000.0}
  %kr: f32[T, 1, 8] = rope(%k3, %p) {theta=10000.0}
  %q4: f32[1, T, 2, 8] = reshape(%qr) {shape=[1, T, 2, 8]}
  %k4: f32[1, T, 1, 8] = reshape(%kr) {shape=[1, T, 1, 8]}
  %v4: f32[1, T, 1, 8] = reshape(%v) {shape=[1, T, 1, 8]}
  %o: f32[1, T, 2, 8] = attention(%q4, %k4, %v4) {scale=0.35, causal=true, heads=2, kv_heads=1, layout=\"bshd\"}
  %o2: f32[T, 16] = reshape(%o) {shape=[T, 16]}
  return %o2
}";
        let (kg, _) = compile_both(src);
        let fams: Vec<Family> = kg.kernels.values().map(|k| k.family).collect();
        assert_eq!(fams, [Family::Matmul, Family::Attention], "{fams:?}");
        let mm = kg.kernels.values().find(|k| k.family == Family::Matmul).unwrap();
        assert_eq!(mm.outputs.len(), 3);
        assert_eq!(mm.body.nodes.values().filter(|n| n.op.kind == OpKind::Rope).count(), 2);
    }

    #[test]
    fn a_kernel_outside_the_contract_is_split() {
        // `e` and `f` fuse into one Pointwise DAG with `s`, but `f` is also an output of
        // another shape: the kernel would write [T, 8] and [8]; it is split.
        let src = "func @main(%x: f32[T, 8], %w: f32[8]) {
  %e: f32[T, 8] = exp(%x)
  %f: f32[8] = tanh(%w)
  %s: f32[T, 8] = add(%e, %f)
  return %s, %f
}";
        let (kg, free) = compile_both(src);
        assert!(!refused(&free).is_empty());
        assert_eq!((free.kernels.len(), kg.kernels.len()), (1, 3), "one kernel per node once split");
    }

    #[test]
    fn check_names_what_a_generator_refuses() {
        let body = |fam: Family, src: &str| {
            let g = sinter_ir::parse(src).unwrap();
            let f = g.entry().unwrap().clone();
            check(&KernelData { family: fam, body: f, inputs: vec![], outputs: vec![] }).err().unwrap_or_default()
        };
        // RoPE of the whole result is a columns epilogue (the head is the last axis); its
        // transpose is not: the epilogue reads the result at its own columns only.
        let rope = body(
            Family::Matmul,
            "func @k(%x: f32[4, 8], %w: f32[8, 8], %p: i32[4, 1]) {
  %m: f32[4, 8] = matmul(%x, %w)
  %r: f32[4, 8] = rope(%m, %p) {theta=10000.0}
  return %r
}",
        );
        assert_eq!(rope, "");
        let transposed = body(
            Family::Matmul,
            "func @k(%x: f32[4, 8], %w: f32[8, 8]) {
  %m: f32[4, 8] = matmul(%x, %w)
  %t: f32[8, 4] = transpose(%m) {dim0=0, dim1=1}
  return %t
}",
        );
        assert!(transposed.contains("transpose"), "{transposed}");
        // Views of the operands are read in place; computing one is not.
        let view = body(
            Family::Attention,
            "func @k(%q: f32[4, 2, 8]) {
  %r: f32[1, 4, 2, 8] = reshape(%q) {shape=[1, 4, 2, 8]}
  %o: f32[1, 4, 2, 8] = attention(%r, %r, %r) {scale=0.35, heads=2, kv_heads=2, layout=\"bshd\"}
  %o3: f32[4, 16] = reshape(%o) {shape=[4, 16]}
  return %o3
}",
        );
        assert_eq!(view, "");
        let computed = body(
            Family::Attention,
            "func @k(%q: f32[1, 4, 2, 8]) {
  %e: f32[1, 4, 2, 8] = exp(%q)
  %o: f32[1, 4, 2, 8] = attention(%e, %q, %q) {scale=0.35, heads=2, kv_heads=2, layout=\"bshd\"}
  return %o
}",
        );
        assert!(computed.contains("exactly one"), "{computed}");
        let shapes = body(
            Family::Pointwise,
            "func @k(%x: f32[4, 8], %y: f32[8]) {
  %a: f32[4, 8] = exp(%x)
  %b: f32[8] = exp(%y)
  return %a, %b
}",
        );
        assert!(shapes.contains("different shapes"), "{shapes}");
        // A trailing reshape is peeled: [4, 8] and reshape([4, 8]) → [32] are one shape.
        let peeled = body(
            Family::Pointwise,
            "func @k(%x: f32[4, 8]) {
  %a: f32[4, 8] = exp(%x)
  %b: f32[32] = reshape(%a) {shape=[32]}
  return %a, %b
}",
        );
        assert_eq!(peeled, "");
    }
}
