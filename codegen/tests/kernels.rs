//! Kernel generation, family by family: small kernel graphs built by hand (bodies with
//! `FunctionBuilder`, buffers with `Layout::contiguous`), compiled through the public entry
//! [`compile_kernel`] for sm_80 and sm_90a, every PTX assembled by ptxas (no spills, no stack),
//! snapshots of the PTX of every family at two fixed shapes per target (each with its launch
//! plan and ptxas resource lines), a snapshot of the ptxas resource report of every case, and
//! SASS checks with cuobjdump (16-byte loads in the vectorised pointwise kernel, butterfly
//! shuffles in the reductions).
//!
//! ptxas and cuobjdump come from `scripts/setup` (`~/.cache/sinter/bin`); where they are
//! missing the tests that need them say so and skip, except under CI (`CI` set), where they
//! fail.

use std::path::PathBuf;
use std::process::Command;

use sinter_codegen::target::Target;
use sinter_codegen::{compile_kernel, ptxas, CodegenError};
use sinter_ir::{
    Attr, Buffer, BufferData, BufferRole, DType, Dim, Family, Function, FunctionBuilder, Graph, GridDim, Kernel, KernelData, KernelGraph, KernelParam, LaunchPlan, Layout, OpKind,
    TensorType, Value,
};

fn d(n: i64) -> Dim {
    Dim::constant(n)
}
fn s(name: &str) -> Dim {
    Dim::symbol(name)
}
fn ty(dt: DType, dims: &[Dim]) -> TensorType {
    TensorType::new(dt, dims.iter().cloned())
}
fn op(fb: &mut FunctionBuilder, kind: OpKind, ins: &[Value]) -> Value {
    fb.op1(kind, ins, vec![]).unwrap()
}
fn op_a(fb: &mut FunctionBuilder, kind: OpKind, ins: &[Value], attrs: Vec<(&str, Attr)>) -> Value {
    fb.op1(kind, ins, attrs).unwrap()
}

/// A kernel graph holding one kernel of `family` with `body`, every buffer contiguous.
fn single(family: Family, body: Function) -> (KernelGraph, Kernel) {
    let mut g = KernelGraph::default();
    let mut add = |v: Value, role: BufferRole| -> Buffer {
        let t = body.ty(v).clone();
        let layout = Layout::contiguous(&t.shape);
        g.buffers.push(BufferData { name: body.values[v].name.clone(), ty: t, role, layout })
    };
    let inputs: Vec<Buffer> = body.params.iter().map(|&p| add(p, BufferRole::Input)).collect();
    let outputs: Vec<Buffer> = body.outputs.iter().map(|&o| add(o, BufferRole::Output)).collect();
    let k = g.kernels.push(KernelData { family, body, inputs: inputs.clone(), outputs: outputs.clone() });
    g.inputs = inputs;
    g.outputs = outputs;
    (g, k)
}

// ----- kernels ------------------------------------------------------------------------------

/// `silu(a) · b` over `[rows, cols]` (the SwiGLU of an MLP, unfused form).
fn silu_mul(dt: DType, rows: Dim, cols: Dim) -> (KernelGraph, Kernel) {
    let mut fb = FunctionBuilder::new(&Graph::new(), "silu_mul");
    let a = fb.param("a", ty(dt, &[rows.clone(), cols.clone()]));
    let b = fb.param("b", ty(dt, &[rows, cols]));
    let sa = op(&mut fb, OpKind::Silu, &[a]);
    let y = op(&mut fb, OpKind::Mul, &[sa, b]);
    single(Family::Pointwise, fb.finish(&[y]).unwrap())
}

/// A DAG of most element-wise ops over a broadcast: `x [T, 17] f32`, `w [17] f32`, `m [T, 1]
/// bool`, `i [T, 17] i32`; two outputs.
fn elementwise_zoo(dt: DType) -> (KernelGraph, Kernel) {
    let mut fb = FunctionBuilder::new(&Graph::new(), "zoo");
    let (t, n) = (s("T"), d(17));
    let x = fb.param("x", ty(dt, &[t.clone(), n.clone()]));
    let w = fb.param("w", ty(dt, std::slice::from_ref(&n)));
    let m = fb.param("m", ty(DType::Bool, &[t.clone(), d(1)]));
    let i = fb.param("i", ty(DType::I32, &[t.clone(), n.clone()]));
    let xw = op(&mut fb, OpKind::Add, &[x, w]);
    let g1 = op_a(&mut fb, OpKind::Gelu, &[xw], vec![("form", Attr::Str("erf".into()))]);
    let g2 = op_a(&mut fb, OpKind::Gelu, &[xw], vec![("form", Attr::Str("tanh".into()))]);
    let sg = op(&mut fb, OpKind::Sigmoid, &[g1]);
    let ab = op(&mut fb, OpKind::Abs, &[g2]);
    let rs = op(&mut fb, OpKind::Rsqrt, &[ab]);
    let lg = op(&mut fb, OpKind::Log, &[ab]);
    let ex = op(&mut fb, OpKind::Exp, &[lg]);
    let two = op_a(&mut fb, OpKind::Constant, &[], vec![("value", Attr::Float(2.0)), ("dtype", Attr::DType(dt))]);
    let sq = op(&mut fb, OpKind::Pow, &[ex, two]);
    let pw = op(&mut fb, OpKind::Pow, &[sq, sg]);
    let mx = op(&mut fb, OpKind::Maximum, &[pw, rs]);
    let mn = op(&mut fb, OpKind::Minimum, &[mx, xw]);
    let th = op(&mut fb, OpKind::Tanh, &[mn]);
    let sn = op(&mut fb, OpKind::Sin, &[th]);
    let cs = op(&mut fb, OpKind::Cos, &[sn]);
    let io = op_a(&mut fb, OpKind::Iota, &[], vec![("dtype", Attr::DType(dt)), ("shape", Attr::Dims(vec![t.clone(), n.clone()])), ("axis", Attr::Int(1))]);
    let lt = op(&mut fb, OpKind::Lt, &[cs, io]);
    let both = op(&mut fb, OpKind::Ne, &[lt, m]);
    let sel = op(&mut fb, OpKind::Select, &[both, cs, xw]);
    let dv = op(&mut fb, OpKind::Div, &[sel, w]);
    let rc = op(&mut fb, OpKind::Recip, &[dv]);
    let ng = op(&mut fb, OpKind::Neg, &[rc]);
    let out = op_a(&mut fb, OpKind::Cast, &[ng], vec![("dtype", Attr::DType(DType::BF16))]);
    // Integers: saturating arithmetic and casts.
    let fi = op_a(&mut fb, OpKind::Cast, &[xw], vec![("dtype", Attr::DType(DType::I32))]);
    let ia = op(&mut fb, OpKind::Add, &[fi, i]);
    let im = op(&mut fb, OpKind::Mul, &[ia, i]);
    let id = op(&mut fb, OpKind::Div, &[im, i]);
    let il = op_a(&mut fb, OpKind::Cast, &[id], vec![("dtype", Attr::DType(DType::I64))]);
    let il2 = op(&mut fb, OpKind::Mul, &[il, il]);
    let ineg = op(&mut fb, OpKind::Neg, &[il2]);
    let iout = op_a(&mut fb, OpKind::Cast, &[ineg], vec![("dtype", Attr::DType(DType::I32))]);
    single(Family::Pointwise, fb.finish(&[out, iout]).unwrap())
}

/// `rope(q, positions)`: `q [T, 9, 64]`, `positions [T] i32`.
fn rope(dt: DType, form: &str) -> (KernelGraph, Kernel) {
    let mut fb = FunctionBuilder::new(&Graph::new(), "rope");
    let q = fb.param("q", ty(dt, &[s("T"), d(9), d(64)]));
    let p = fb.param("positions", ty(DType::I32, &[s("T"), d(1)]));
    let y = op_a(&mut fb, OpKind::Rope, &[q, p], vec![("theta", Attr::Float(100000.0)), ("form", Attr::Str(form.into()))]);
    single(Family::Pointwise, fb.finish(&[y]).unwrap())
}

/// `swiglu(gate, up)` over `[T, 1536]`, and a cast to f32 as a second output.
fn swiglu(dt: DType) -> (KernelGraph, Kernel) {
    let mut fb = FunctionBuilder::new(&Graph::new(), "swiglu");
    let g = fb.param("gate", ty(dt, &[s("T"), d(1536)]));
    let u = fb.param("up", ty(dt, &[s("T"), d(1536)]));
    let y = op(&mut fb, OpKind::Swiglu, &[g, u]);
    let c = op_a(&mut fb, OpKind::Cast, &[y], vec![("dtype", Attr::DType(DType::F32))]);
    single(Family::Pointwise, fb.finish(&[y, c]).unwrap())
}

/// One row op over `x [R, n]`.
fn row_kernel(dt: DType, rows: Dim, n: Dim, what: &str) -> (KernelGraph, Kernel) {
    let mut fb = FunctionBuilder::new(&Graph::new(), what);
    let x = fb.param("x", ty(dt, &[rows, n.clone()]));
    let keep = |b: bool| vec![("keepdim", Attr::Bool(b))];
    let y = match what {
        "softmax" => op(&mut fb, OpKind::Softmax, &[x]),
        "log_softmax" => op(&mut fb, OpKind::LogSoftmax, &[x]),
        "rms_norm" => {
            let w = fb.param("w", ty(dt, std::slice::from_ref(&n)));
            op_a(&mut fb, OpKind::RmsNorm, &[x, w], vec![("eps", Attr::Float(1e-5))])
        }
        "layer_norm" => {
            let w = fb.param("w", ty(dt, std::slice::from_ref(&n)));
            let b = fb.param("b", ty(dt, std::slice::from_ref(&n)));
            op_a(&mut fb, OpKind::LayerNorm, &[x, w, b], vec![("eps", Attr::Float(1e-5))])
        }
        "reduce_sum" => op_a(&mut fb, OpKind::ReduceSum, &[x], keep(true)),
        "reduce_mean" => op_a(&mut fb, OpKind::ReduceMean, &[x], keep(false)),
        "reduce_max" => op_a(&mut fb, OpKind::ReduceMax, &[x], keep(false)),
        "reduce_min" => op_a(&mut fb, OpKind::ReduceMin, &[x], keep(true)),
        _ => unreachable!("{what}"),
    };
    single(Family::RowReduction, fb.finish(&[y]).unwrap())
}

/// Ends a decomposed-softmax body over `xm`: `m = max xm`, `e = exp(xm − m)`, `p = e / Σe`
/// and the entropy term `Σ p·(xm − m)`; outputs `p`, `m` and the entropy (three reduction
/// levels deep), as one row-reduction kernel.
fn softmax_entropy_kernel(mut fb: FunctionBuilder, xm: Value) -> (KernelGraph, Kernel) {
    let m = op_a(&mut fb, OpKind::ReduceMax, &[xm], vec![("keepdim", Attr::Bool(true))]);
    let c = op(&mut fb, OpKind::Sub, &[xm, m]);
    let e = op(&mut fb, OpKind::Exp, &[c]);
    let sum = op_a(&mut fb, OpKind::ReduceSum, &[e], vec![("keepdim", Attr::Bool(true))]);
    let p = op(&mut fb, OpKind::Div, &[e, sum]);
    let ent = op(&mut fb, OpKind::Mul, &[p, c]);
    let h = op_a(&mut fb, OpKind::ReduceSum, &[ent], vec![("keepdim", Attr::Bool(false))]);
    single(Family::RowReduction, fb.finish(&[p, m, h]).unwrap())
}

/// Softmax written out — `e = exp(x − max x)`, `e / Σe` — plus a masked prologue and the row
/// max as a second output: one kernel, three reduction levels deep in dependencies.
fn decomposed_softmax(dt: DType) -> (KernelGraph, Kernel) {
    let mut fb = FunctionBuilder::new(&Graph::new(), "softmax_decomposed");
    let (r, n) = (s("T"), d(1000));
    let x = fb.param("x", ty(dt, &[r.clone(), n.clone()]));
    let mask = fb.param("mask", ty(dt, &[d(1), n.clone()]));
    let scale = op_a(&mut fb, OpKind::Constant, &[], vec![("value", Attr::Float(0.125)), ("dtype", Attr::DType(dt))]);
    let xs = op(&mut fb, OpKind::Mul, &[x, scale]);
    let xm = op(&mut fb, OpKind::Add, &[xs, mask]);
    softmax_entropy_kernel(fb, xm)
}

/// The softmax of `x + y` written out over rows of `n` (two row inputs, a `[1, n]` −inf mask
/// broadcast over the rows, three reduction levels: max, Σe, the entropy), with the row max
/// and the entropy as extra outputs.
fn decomposed_softmax_sum(dt: DType, n: i64) -> (KernelGraph, Kernel) {
    let mut fb = FunctionBuilder::new(&Graph::new(), "softmax_sum_decomposed");
    let (r, n) = (s("R"), d(n));
    let x = fb.param("x", ty(dt, &[r.clone(), n.clone()]));
    let y = fb.param("y", ty(dt, &[r.clone(), n.clone()]));
    let mask = fb.param("mask", ty(dt, &[d(1), n.clone()]));
    let xy = op(&mut fb, OpKind::Add, &[x, y]);
    let xm = op(&mut fb, OpKind::Add, &[xy, mask]);
    softmax_entropy_kernel(fb, xm)
}

/// RMSNorm of Q/K heads (`x [T, 9, 64]`, weight `[64]`) followed by a residual add.
fn qk_norm(dt: DType) -> (KernelGraph, Kernel) {
    let mut fb = FunctionBuilder::new(&Graph::new(), "qk_norm");
    let x = fb.param("x", ty(dt, &[s("T"), d(9), d(64)]));
    let w = fb.param("w", ty(dt, &[d(64)]));
    let res = fb.param("res", ty(dt, &[s("T"), d(9), d(64)]));
    let y = op_a(&mut fb, OpKind::RmsNorm, &[x, w], vec![("eps", Attr::Float(1e-6))]);
    let z = op(&mut fb, OpKind::Add, &[y, res]);
    single(Family::RowReduction, fb.finish(&[z]).unwrap())
}

/// Integer row sums and maxima.
fn int_rows() -> (KernelGraph, Kernel) {
    let mut fb = FunctionBuilder::new(&Graph::new(), "int_rows");
    let x = fb.param("x", ty(DType::I32, &[s("R"), d(300)]));
    let a = op_a(&mut fb, OpKind::ReduceSum, &[x], vec![("keepdim", Attr::Bool(true))]);
    let b = op_a(&mut fb, OpKind::ReduceMax, &[x], vec![("keepdim", Attr::Bool(true))]);
    single(Family::RowReduction, fb.finish(&[a, b]).unwrap())
}

/// `permute(x [T, 9, 64], [1, 0, 2])` → `[9, T, 64]`.
fn transpose_heads(dt: DType) -> (KernelGraph, Kernel) {
    let mut fb = FunctionBuilder::new(&Graph::new(), "transpose");
    let x = fb.param("x", ty(dt, &[s("T"), d(9), d(64)]));
    let y = op_a(&mut fb, OpKind::Permute, &[x], vec![("perm", Attr::Ints(vec![1, 0, 2]))]);
    single(Family::Layout, fb.finish(&[y]).unwrap())
}

/// `transpose(x [T, 576])` → `[576, T]` (the innermost axis moves).
fn transpose_2d(dt: DType) -> (KernelGraph, Kernel) {
    let mut fb = FunctionBuilder::new(&Graph::new(), "transpose2d");
    let x = fb.param("x", ty(dt, &[s("T"), d(576)]));
    let y = op(&mut fb, OpKind::Transpose, &[x]);
    single(Family::Layout, fb.finish(&[y]).unwrap())
}

/// `concat([k [P, 64], v [T, 64]], axis 0)` then a slice of columns 8..40 and a broadcast.
fn concat_slice(dt: DType) -> (KernelGraph, Kernel) {
    let mut fb = FunctionBuilder::new(&Graph::new(), "concat");
    let a = fb.param("past", ty(dt, &[s("P"), d(64)]));
    let b = fb.param("new", ty(dt, &[s("T"), d(64)]));
    let c = op_a(&mut fb, OpKind::Concat, &[a, b], vec![("axis", Attr::Int(0))]);
    let sl = op_a(&mut fb, OpKind::Slice, &[c], vec![("axis", Attr::Int(1)), ("start", Attr::Int(8)), ("end", Attr::Int(40))]);
    let total = s("P").add(&s("T"));
    let bc = op_a(&mut fb, OpKind::Broadcast, &[sl], vec![("shape", Attr::Dims(vec![d(2), total, d(32)]))]);
    single(Family::Layout, fb.finish(&[bc]).unwrap())
}

/// `gather(table [49152, 576], ids [B, T])`.
fn embedding(dt: DType, idx: DType) -> (KernelGraph, Kernel) {
    let mut fb = FunctionBuilder::new(&Graph::new(), "embed");
    let t = fb.param("table", ty(dt, &[d(49152), d(576)]));
    let i = fb.param("ids", ty(idx, &[s("B"), s("T")]));
    let y = op(&mut fb, OpKind::Gather, &[t, i]);
    single(Family::Gather, fb.finish(&[y]).unwrap())
}

/// `kv_append` into pages `[P, 16, 3, 64]` from new rows `[B, T, 3, 64]`.
fn kv_append(dt: DType) -> (KernelGraph, Kernel) {
    let mut fb = FunctionBuilder::new(&Graph::new(), "kv_append");
    let pages = ty(dt, &[s("P"), d(16), d(3), d(64)]);
    let kp = fb.param("k_pages", pages.clone());
    let vp = fb.param("v_pages", pages);
    let kn = fb.param("k_new", ty(dt, &[s("B"), s("T"), d(3), d(64)]));
    let vn = fb.param("v_new", ty(dt, &[s("B"), s("T"), d(3), d(64)]));
    let bt = fb.param("block_table", ty(DType::I32, &[s("B"), s("M")]));
    let sp = fb.param("start_pos", ty(DType::I32, &[s("B")]));
    let r = fb.op(OpKind::KvAppend, &[kp, vp, kn, vn, bt, sp], vec![]).unwrap();
    single(Family::KvAppend, fb.finish(&r).unwrap())
}

/// Views at both ends: `x [T, 576]` reshaped to `[T, 9, 64]`, plus a bias `[64]`, cast to
/// f32 and reshaped back to `[T, 576]` (a trailing reshape is peeled off the output).
fn views_pointwise() -> (KernelGraph, Kernel) {
    let mut fb = FunctionBuilder::new(&Graph::new(), "views");
    let x = fb.param("x", ty(DType::BF16, &[s("T"), d(576)]));
    let b = fb.param("bias", ty(DType::BF16, &[d(64)]));
    let r = op_a(&mut fb, OpKind::Reshape, &[x], vec![("shape", Attr::Dims(vec![s("T"), d(9), d(64)]))]);
    let y = op(&mut fb, OpKind::Add, &[r, b]);
    let c = op_a(&mut fb, OpKind::Cast, &[y], vec![("dtype", Attr::DType(DType::F32))]);
    let o = op_a(&mut fb, OpKind::Reshape, &[c], vec![("shape", Attr::Dims(vec![s("T"), d(576)]))]);
    single(Family::Pointwise, fb.finish(&[o]).unwrap())
}

/// Mixed dtypes in a flat kernel: `cast(a bf16, f32)·b + 1` (f32) and its bf16 cast.
fn flat_mixed() -> (KernelGraph, Kernel) {
    let mut fb = FunctionBuilder::new(&Graph::new(), "mixed");
    let a = fb.param("a", ty(DType::BF16, &[s("T"), d(4096)]));
    let b = fb.param("b", ty(DType::F32, &[s("T"), d(4096)]));
    let af = op_a(&mut fb, OpKind::Cast, &[a], vec![("dtype", Attr::DType(DType::F32))]);
    let m = op(&mut fb, OpKind::Mul, &[af, b]);
    let one = op_a(&mut fb, OpKind::Constant, &[], vec![("value", Attr::Float(1.0)), ("dtype", Attr::DType(DType::F32))]);
    let y = op(&mut fb, OpKind::Add, &[m, one]);
    let yb = op_a(&mut fb, OpKind::Cast, &[y], vec![("dtype", Attr::DType(DType::BF16))]);
    single(Family::Pointwise, fb.finish(&[y, yb]).unwrap())
}

/// `concat` along the last axis: of `[T, 20]` and `[T, 44]` (groups straddle the seam) when
/// `aligned` is false, of `[T, 16]` and `[T, 48]` otherwise; then a slice of columns 3..67 of
/// a `[T, 100]` input (an unaligned start) added to it.
fn concat_last(aligned: bool) -> (KernelGraph, Kernel) {
    let mut fb = FunctionBuilder::new(&Graph::new(), "concat_last");
    let (na, nb) = if aligned { (16, 48) } else { (20, 44) };
    let a = fb.param("a", ty(DType::BF16, &[s("T"), d(na)]));
    let b = fb.param("b", ty(DType::BF16, &[s("T"), d(nb)]));
    let x = fb.param("x", ty(DType::BF16, &[s("T"), d(100)]));
    let c = op_a(&mut fb, OpKind::Concat, &[a, b], vec![("axis", Attr::Int(-1))]);
    let sl = op_a(&mut fb, OpKind::Slice, &[x], vec![("axis", Attr::Int(-1)), ("start", Attr::Int(3)), ("end", Attr::Int(67))]);
    let y = op(&mut fb, OpKind::Add, &[c, sl]);
    single(Family::Layout, fb.finish(&[y]).unwrap())
}

/// Row epilogues: softmax written as `[R, 4, N/4]` (peeled reshape), and the row sum without
/// keepdim times a per-row scale `[R]`.
fn row_epilogues(dt: DType) -> (KernelGraph, Kernel) {
    let mut fb = FunctionBuilder::new(&Graph::new(), "row_epilogues");
    let x = fb.param("x", ty(dt, &[s("R"), d(1024)]));
    let scale = fb.param("scale", ty(dt, &[s("R")]));
    let p = op(&mut fb, OpKind::Softmax, &[x]);
    let pr = op_a(&mut fb, OpKind::Reshape, &[p], vec![("shape", Attr::Dims(vec![s("R"), d(4), d(256)]))]);
    let sm = op_a(&mut fb, OpKind::ReduceSum, &[x], vec![("keepdim", Attr::Bool(false))]);
    let sc = op(&mut fb, OpKind::Mul, &[sm, scale]);
    single(Family::RowReduction, fb.finish(&[pr, sc]).unwrap())
}

/// `gather` then a scale by `√576` and a cast to f32 (Gemma's embedding).
fn embedding_scaled() -> (KernelGraph, Kernel) {
    let mut fb = FunctionBuilder::new(&Graph::new(), "embed_scaled");
    let t = fb.param("table", ty(DType::BF16, &[d(1000), d(576)]));
    let i = fb.param("ids", ty(DType::I64, &[s("T")]));
    let g = op(&mut fb, OpKind::Gather, &[t, i]);
    let k = op_a(&mut fb, OpKind::Constant, &[], vec![("value", Attr::Float(24.0)), ("dtype", Attr::DType(DType::BF16))]);
    let y = op(&mut fb, OpKind::Mul, &[g, k]);
    let c = op_a(&mut fb, OpKind::Cast, &[y], vec![("dtype", Attr::DType(DType::F32))]);
    single(Family::Gather, fb.finish(&[c]).unwrap())
}

// ----- kernels at fixed shapes (the PTX snapshots) -------------------------------------------

/// A fused pointwise expression over broadcasts and mixed dtypes:
/// `cast(silu(cast(x, f32) + bias) · cast(scale, f32), bf16)` with `x bf16[R, C]`, `bias
/// f32[C]` (broadcast over rows) and `scale bf16[R, 1]` (broadcast over columns).
fn fused_pointwise(rows: i64, cols: i64) -> (KernelGraph, Kernel) {
    let mut fb = FunctionBuilder::new(&Graph::new(), "fused");
    let x = fb.param("x", ty(DType::BF16, &[d(rows), d(cols)]));
    let bias = fb.param("bias", ty(DType::F32, &[d(cols)]));
    let scale = fb.param("scale", ty(DType::BF16, &[d(rows), d(1)]));
    let f32_ = vec![("dtype", Attr::DType(DType::F32))];
    let xf = op_a(&mut fb, OpKind::Cast, &[x], f32_.clone());
    let xb = op(&mut fb, OpKind::Add, &[xf, bias]);
    let sx = op(&mut fb, OpKind::Silu, &[xb]);
    let sf = op_a(&mut fb, OpKind::Cast, &[scale], f32_);
    let y = op(&mut fb, OpKind::Mul, &[sx, sf]);
    let out = op_a(&mut fb, OpKind::Cast, &[y], vec![("dtype", Attr::DType(DType::BF16))]);
    single(Family::Pointwise, fb.finish(&[out]).unwrap())
}

/// `quantize_fp8(x from[R, C], s f32[])` → `f8e4m3[R, C]` (issue #8).
fn quantize_fp8_at(from: DType, rows: Dim, cols: Dim) -> (KernelGraph, Kernel) {
    let mut fb = FunctionBuilder::new(&Graph::new(), "quantize_fp8");
    let x = fb.param("x", ty(from, &[rows, cols]));
    let sc = fb.param("s", ty(DType::F32, &[]));
    let y = op(&mut fb, OpKind::QuantizeFp8, &[x, sc]);
    single(Family::Pointwise, fb.finish(&[y]).unwrap())
}

/// `dequantize_fp8(x8 f8e4m3[R, C], s f32[]) {dtype=to}` (issue #8).
fn dequantize_fp8_at(to: DType, rows: Dim, cols: Dim) -> (KernelGraph, Kernel) {
    let mut fb = FunctionBuilder::new(&Graph::new(), "dequantize_fp8");
    let x = fb.param("x8", ty(DType::F8E4M3, &[rows, cols]));
    let sc = fb.param("s", ty(DType::F32, &[]));
    let y = op_a(&mut fb, OpKind::DequantizeFp8, &[x, sc], vec![("dtype", Attr::DType(to))]);
    single(Family::Pointwise, fb.finish(&[y]).unwrap())
}

/// Every other use of `f8e4m3` the element evaluator takes, each a kernel: the fake-quant
/// round trip `dequantize_fp8(quantize_fp8(x, s), s)` (an fp8 value in registers only), casts
/// to and from f8e4m3 (bf16, i32), a `select` of an fp8 tensor and an fp8 constant, a
/// transpose of an fp8 tensor (layout), and a row reduction of dequantised fp8 rows.
fn fp8_misc() -> Vec<(String, (KernelGraph, Kernel))> {
    let (t, n) = (s("T"), d(1000));
    let mut v = Vec::new();
    let mut fb = FunctionBuilder::new(&Graph::new(), "fake_quant");
    let x = fb.param("x", ty(DType::BF16, &[t.clone(), n.clone()]));
    let sc = fb.param("s", ty(DType::F32, &[]));
    let q = op(&mut fb, OpKind::QuantizeFp8, &[x, sc]);
    let y = op_a(&mut fb, OpKind::DequantizeFp8, &[q, sc], vec![("dtype", Attr::DType(DType::BF16))]);
    v.push(("pointwise fp8 fake quant bf16 [T,1000]".into(), single(Family::Pointwise, fb.finish(&[y]).unwrap())));
    let mut fb = FunctionBuilder::new(&Graph::new(), "fp8_casts");
    let x = fb.param("x", ty(DType::BF16, &[t.clone(), n.clone()]));
    let i = fb.param("i", ty(DType::I32, &[t.clone(), n.clone()]));
    let x8 = fb.param("x8", ty(DType::F8E4M3, &[t.clone(), n.clone()]));
    let m = fb.param("m", ty(DType::Bool, &[t.clone(), d(1)]));
    let to8 = || vec![("dtype", Attr::DType(DType::F8E4M3))];
    let a = op_a(&mut fb, OpKind::Cast, &[x], to8());
    let b = op_a(&mut fb, OpKind::Cast, &[i], to8());
    let c = op_a(&mut fb, OpKind::Cast, &[x8], vec![("dtype", Attr::DType(DType::F32))]);
    let e = op_a(&mut fb, OpKind::Cast, &[x8], vec![("dtype", Attr::DType(DType::I32))]);
    let k = op_a(&mut fb, OpKind::Constant, &[], vec![("value", Attr::Float(-3.3)), ("dtype", Attr::DType(DType::F8E4M3))]);
    let sel = op(&mut fb, OpKind::Select, &[m, x8, k]);
    v.push(("pointwise fp8 casts and select [T,1000]".into(), single(Family::Pointwise, fb.finish(&[a, b, c, e, sel]).unwrap())));
    let mut fb = FunctionBuilder::new(&Graph::new(), "fp8_transpose");
    let x = fb.param("x8", ty(DType::F8E4M3, &[t.clone(), d(576)]));
    let y = op(&mut fb, OpKind::Transpose, &[x]);
    v.push(("layout transpose f8e4m3".into(), single(Family::Layout, fb.finish(&[y]).unwrap())));
    let mut fb = FunctionBuilder::new(&Graph::new(), "fp8_rows");
    let x = fb.param("x8", ty(DType::F8E4M3, &[s("R"), d(4096)]));
    let sc = fb.param("s", ty(DType::F32, &[]));
    let xf = op_a(&mut fb, OpKind::DequantizeFp8, &[x, sc], vec![("dtype", Attr::DType(DType::F32))]);
    let y = op_a(&mut fb, OpKind::ReduceSum, &[xf], vec![("keepdim", Attr::Bool(true))]);
    let z = op(&mut fb, OpKind::Softmax, &[xf]);
    let zq = op(&mut fb, OpKind::QuantizeFp8, &[z, sc]);
    v.push(("row fp8 reduce_sum + softmax quantized [R,4096]".into(), single(Family::RowReduction, fb.finish(&[y, zq]).unwrap())));
    v
}

/// `cast(x [R, C], to)`.
fn cast_kernel(from: DType, to: DType, rows: i64, cols: i64) -> (KernelGraph, Kernel) {
    let mut fb = FunctionBuilder::new(&Graph::new(), "cast");
    let x = fb.param("x", ty(from, &[d(rows), d(cols)]));
    let y = op_a(&mut fb, OpKind::Cast, &[x], vec![("dtype", Attr::DType(to))]);
    single(Family::Pointwise, fb.finish(&[y]).unwrap())
}

/// `rope(q [T, H, D], positions [T, 1])` in `form`, θ = 10⁴.
fn rope_at(dt: DType, form: &str, t: i64, h: i64, hd: i64) -> (KernelGraph, Kernel) {
    let mut fb = FunctionBuilder::new(&Graph::new(), "rope");
    let q = fb.param("q", ty(dt, &[d(t), d(h), d(hd)]));
    let p = fb.param("positions", ty(DType::I32, &[d(t), d(1)]));
    let y = op_a(&mut fb, OpKind::Rope, &[q, p], vec![("theta", Attr::Float(10000.0)), ("form", Attr::Str(form.into()))]);
    single(Family::Pointwise, fb.finish(&[y]).unwrap())
}

/// The `swiglu(gate, up)` op alone over `[T, N]`.
fn swiglu_at(dt: DType, t: i64, n: i64) -> (KernelGraph, Kernel) {
    let mut fb = FunctionBuilder::new(&Graph::new(), "swiglu");
    let g = fb.param("gate", ty(dt, &[d(t), d(n)]));
    let u = fb.param("up", ty(dt, &[d(t), d(n)]));
    let y = op(&mut fb, OpKind::Swiglu, &[g, u]);
    single(Family::Pointwise, fb.finish(&[y]).unwrap())
}

/// `gather(table [V, D], ids [B, T])`.
fn embedding_at(dt: DType, idx: DType, vocab: i64, dim: i64, b: i64, t: i64) -> (KernelGraph, Kernel) {
    let mut fb = FunctionBuilder::new(&Graph::new(), "embed");
    let table = fb.param("table", ty(dt, &[d(vocab), d(dim)]));
    let i = fb.param("ids", ty(idx, &[d(b), d(t)]));
    let y = op(&mut fb, OpKind::Gather, &[table, i]);
    single(Family::Gather, fb.finish(&[y]).unwrap())
}

/// `kv_append` of new rows `[B, T, Hkv, D]` into `pages` pages `[pages, page, Hkv, D]` through
/// a block table `[B, M]`.
#[allow(clippy::too_many_arguments)]
fn kv_append_at(dt: DType, pages: i64, page: i64, hkv: i64, hd: i64, b: i64, t: i64, m: i64) -> (KernelGraph, Kernel) {
    let mut fb = FunctionBuilder::new(&Graph::new(), "kv_append");
    let pty = ty(dt, &[d(pages), d(page), d(hkv), d(hd)]);
    let kp = fb.param("k_pages", pty.clone());
    let vp = fb.param("v_pages", pty);
    let kn = fb.param("k_new", ty(dt, &[d(b), d(t), d(hkv), d(hd)]));
    let vn = fb.param("v_new", ty(dt, &[d(b), d(t), d(hkv), d(hd)]));
    let bt = fb.param("block_table", ty(DType::I32, &[d(b), d(m)]));
    let sp = fb.param("start_pos", ty(DType::I32, &[d(b)]));
    let r = fb.op(OpKind::KvAppend, &[kp, vp, kn, vn, bt, sp], vec![]).unwrap();
    single(Family::KvAppend, fb.finish(&r).unwrap())
}

/// `transpose(x [R, C])` → `[C, R]`.
fn transpose_at(dt: DType, rows: i64, cols: i64) -> (KernelGraph, Kernel) {
    let mut fb = FunctionBuilder::new(&Graph::new(), "transpose");
    let x = fb.param("x", ty(dt, &[d(rows), d(cols)]));
    let y = op(&mut fb, OpKind::Transpose, &[x]);
    single(Family::Layout, fb.finish(&[y]).unwrap())
}

/// `concat([a [R, Ca], b [R, Cb]], axis -1)`: a copy into one buffer.
fn concat_at(dt: DType, rows: i64, ca: i64, cb: i64) -> (KernelGraph, Kernel) {
    let mut fb = FunctionBuilder::new(&Graph::new(), "concat");
    let a = fb.param("a", ty(dt, &[d(rows), d(ca)]));
    let b = fb.param("b", ty(dt, &[d(rows), d(cb)]));
    let y = op_a(&mut fb, OpKind::Concat, &[a, b], vec![("axis", Attr::Int(-1))]);
    single(Family::Layout, fb.finish(&[y]).unwrap())
}

/// `x [M, K] · w [N, K]ᵀ` (a projection as the models write it).
fn matmul_at(dt: DType, m: i64, n: i64, k: i64) -> (KernelGraph, Kernel) {
    let mut fb = FunctionBuilder::new(&Graph::new(), "proj");
    let x = fb.param("x", ty(dt, &[d(m), d(k)]));
    let w = fb.param("w", ty(dt, &[d(n), d(k)]));
    let y = op_a(&mut fb, OpKind::Matmul, &[x, w], vec![("transpose_b", Attr::Bool(true))]);
    single(Family::Matmul, fb.finish(&[y]).unwrap())
}

/// The fp8 matmul (issue #8): `dequantize_fp8(a8 [M, K], sa) · dequantize_fp8(b8 [N, K], sb)ᵀ`
/// with f8e4m3 operands, f32 scalar scales and a result of `out` (the `dequantize_fp8` dtype).
fn fp8_matmul_at(out: DType, m: i64, n: i64, k: i64) -> (KernelGraph, Kernel) {
    let mut fb = FunctionBuilder::new(&Graph::new(), "fp8_proj");
    let a8 = fb.param("a8", ty(DType::F8E4M3, &[d(m), d(k)]));
    let sa = fb.param("sa", ty(DType::F32, &[]));
    let b8 = fb.param("b8", ty(DType::F8E4M3, &[d(n), d(k)]));
    let sb = fb.param("sb", ty(DType::F32, &[]));
    let a = op_a(&mut fb, OpKind::DequantizeFp8, &[a8, sa], vec![("dtype", Attr::DType(out))]);
    let b = op_a(&mut fb, OpKind::DequantizeFp8, &[b8, sb], vec![("dtype", Attr::DType(out))]);
    let y = op_a(&mut fb, OpKind::Matmul, &[a, b], vec![("transpose_b", Attr::Bool(true))]);
    single(Family::Matmul, fb.finish(&[y]).unwrap())
}

/// `x [M, K] · w [K, N]` (B N-contiguous).
fn matmul_kn_at(dt: DType, m: i64, n: i64, k: i64) -> (KernelGraph, Kernel) {
    let mut fb = FunctionBuilder::new(&Graph::new(), "proj");
    let x = fb.param("x", ty(dt, &[d(m), d(k)]));
    let w = fb.param("w", ty(dt, &[d(k), d(n)]));
    let y = op(&mut fb, OpKind::Matmul, &[x, w]);
    single(Family::Matmul, fb.finish(&[y]).unwrap())
}

/// Grouped-query prefill attention: `q [B, H, S, D]`, `k`, `v [B, Hkv, S, D]`.
fn attention_at(dt: DType, b: i64, h: i64, hkv: i64, seq: i64, hd: i64, causal: bool) -> (KernelGraph, Kernel) {
    let mut fb = FunctionBuilder::new(&Graph::new(), "attn");
    let q = fb.param("q", ty(dt, &[d(b), d(h), d(seq), d(hd)]));
    let k = fb.param("k", ty(dt, &[d(b), d(hkv), d(seq), d(hd)]));
    let v = fb.param("v", ty(dt, &[d(b), d(hkv), d(seq), d(hd)]));
    let attrs = vec![("scale", Attr::Float(1.0 / (hd as f64).sqrt())), ("causal", Attr::Bool(causal)), ("heads", Attr::Int(h)), ("kv_heads", Attr::Int(hkv))];
    let o = op_a(&mut fb, OpKind::Attention, &[q, k, v], attrs);
    single(Family::Attention, fb.finish(&[o]).unwrap())
}

/// The fp8 attention (issue #8): `attention(dequantize_fp8(q8, sq), dequantize_fp8(k8, sk),
/// dequantize_fp8(v8, sv))` of `f8e4m3` `[B, H, S, D]` inputs and `f32[]` scales, bf16 out.
fn fp8_attention_at(b: i64, h: i64, hkv: i64, seq: i64, hd: i64, causal: bool) -> (KernelGraph, Kernel) {
    let mut fb = FunctionBuilder::new(&Graph::new(), "attn8");
    let f8 = DType::F8E4M3;
    let deq = |fb: &mut FunctionBuilder, name: &str, s: &str, heads: i64| {
        let x = fb.param(name, ty(f8, &[d(b), d(heads), d(seq), d(hd)]));
        let sc = fb.param(s, ty(DType::F32, &[]));
        op_a(fb, OpKind::DequantizeFp8, &[x, sc], vec![("dtype", Attr::DType(DType::BF16))])
    };
    let q = deq(&mut fb, "q8", "sq", h);
    let k = deq(&mut fb, "k8", "sk", hkv);
    let v = deq(&mut fb, "w8", "sv", hkv);
    let attrs = vec![("scale", Attr::Float(1.0 / (hd as f64).sqrt())), ("causal", Attr::Bool(causal)), ("heads", Attr::Int(h)), ("kv_heads", Attr::Int(hkv))];
    let o = op_a(&mut fb, OpKind::Attention, &[q, k, v], attrs);
    single(Family::Attention, fb.finish(&[o]).unwrap())
}

/// Paged decode attention: `q [B, H, 1, D]` over pages `[P, page, Hkv, D]`, block table
/// `[B, M]`, sequence lengths `[B]`.
#[allow(clippy::too_many_arguments)]
fn paged_at(dt: DType, b: i64, h: i64, hkv: i64, hd: i64, pages: i64, page: i64, m: i64) -> (KernelGraph, Kernel) {
    let mut fb = FunctionBuilder::new(&Graph::new(), "decode");
    let q = fb.param("q", ty(dt, &[d(b), d(h), d(1), d(hd)]));
    let kp = fb.param("k_pages", ty(dt, &[d(pages), d(page), d(hkv), d(hd)]));
    let vp = fb.param("v_pages", ty(dt, &[d(pages), d(page), d(hkv), d(hd)]));
    let bt = fb.param("block_table", ty(DType::I32, &[d(b), d(m)]));
    let lens = fb.param("seq_lens", ty(DType::I32, &[d(b)]));
    let attrs = vec![("scale", Attr::Float(1.0 / (hd as f64).sqrt())), ("causal", Attr::Bool(true)), ("heads", Attr::Int(h)), ("kv_heads", Attr::Int(hkv))];
    let o = op_a(&mut fb, OpKind::PagedAttention, &[q, kp, vp, bt, lens], attrs);
    single(Family::PagedAttention, fb.finish(&[o]).unwrap())
}

/// Cascade decode's prefix attention with its rows' log-sum-exp: `q [N, R, Hkv, D]` (layout
/// `bshd`, the batch axis holding N key chunks) over `k`, `v [N, S, Hkv, D]`, results (o, lse).
fn attention_lse_at(dt: DType, n: i64, rows: i64, hkv: i64, skv: i64, hd: i64) -> (KernelGraph, Kernel) {
    let mut fb = FunctionBuilder::new(&Graph::new(), "prefix");
    let q = fb.param("q", ty(dt, &[d(n), d(rows), d(hkv), d(hd)]));
    let k = fb.param("k", ty(dt, &[d(n), d(skv), d(hkv), d(hd)]));
    let v = fb.param("v", ty(dt, &[d(n), d(skv), d(hkv), d(hd)]));
    let attrs = vec![
        ("scale", Attr::Float(1.0 / (hd as f64).sqrt())),
        ("heads", Attr::Int(hkv)),
        ("kv_heads", Attr::Int(hkv)),
        ("layout", Attr::Str("bshd".into())),
        ("lse", Attr::Bool(true)),
    ];
    let r = fb.op(OpKind::Attention, &[q, k, v], attrs).unwrap();
    single(Family::Attention, fb.finish(&r).unwrap())
}

/// Paged decode attention with its rows' log-sum-exp (cascade decode's suffix): as
/// [`paged_at`], results (o, lse).
#[allow(clippy::too_many_arguments)]
fn paged_lse_at(dt: DType, b: i64, h: i64, hkv: i64, hd: i64, pages: i64, page: i64, m: i64) -> (KernelGraph, Kernel) {
    let mut fb = FunctionBuilder::new(&Graph::new(), "suffix");
    let q = fb.param("q", ty(dt, &[d(b), d(h), d(1), d(hd)]));
    let kp = fb.param("k_pages", ty(dt, &[d(pages), d(page), d(hkv), d(hd)]));
    let vp = fb.param("v_pages", ty(dt, &[d(pages), d(page), d(hkv), d(hd)]));
    let bt = fb.param("block_table", ty(DType::I32, &[d(b), d(m)]));
    let lens = fb.param("seq_lens", ty(DType::I32, &[d(b)]));
    let attrs = vec![("scale", Attr::Float(1.0 / (hd as f64).sqrt())), ("heads", Attr::Int(h)), ("kv_heads", Attr::Int(hkv)), ("lse", Attr::Bool(true))];
    let r = fb.op(OpKind::PagedAttention, &[q, kp, vp, bt, lens], attrs).unwrap();
    single(Family::PagedAttention, fb.finish(&r).unwrap())
}

/// `attention_merge(o_a, lse_a, o_b, lse_b)` of o `[rows…, D]`, results (o, lse).
fn merge_at(dt: DType, rows: &[Dim], hd: i64) -> (KernelGraph, Kernel) {
    let mut fb = FunctionBuilder::new(&Graph::new(), "merge");
    let mut os = rows.to_vec();
    os.push(d(hd));
    let oa = fb.param("o_a", ty(dt, &os));
    let la = fb.param("lse_a", ty(DType::F32, rows));
    let ob = fb.param("o_b", ty(dt, &os));
    let lb = fb.param("lse_b", ty(DType::F32, rows));
    let r = fb.op(OpKind::AttentionMerge, &[oa, la, ob, lb], vec![]).unwrap();
    single(Family::AttentionMerge, fb.finish(&r).unwrap())
}

/// The PTX snapshot cases: every kernel family at two fixed shapes, as (snapshot name, what it
/// is, kernel). The snapshot of a case at a target is `kernels__ptx_<name>_<target>.snap`.
fn ptx_cases() -> Vec<(String, String, (KernelGraph, Kernel))> {
    let mut v: Vec<(String, String, (KernelGraph, Kernel))> = Vec::new();
    let mut add = |name: String, what: String, gk: (KernelGraph, Kernel)| v.push((name, what, gk));
    for (r, c) in [(64, 4096), (333, 1000)] {
        add(format!("pointwise_fused_{r}x{c}"), format!("pointwise: cast(silu(cast(x bf16[{r},{c}], f32) + bias f32[{c}]) * cast(scale bf16[{r},1], f32), bf16)"), fused_pointwise(r, c));
    }
    for what in ["softmax", "log_softmax", "rms_norm", "layer_norm", "reduce_sum", "reduce_max", "reduce_mean"] {
        for (r, n) in [(4096, 576), (64, 32768)] {
            add(format!("row_{what}_{r}x{n}"), format!("row reduction: {what} of bf16[{r},{n}]"), row_kernel(DType::BF16, d(r), d(n), what));
        }
    }
    // The cluster schedule on sm_90a (the multi-pass one on sm_80): 8 CTAs × 512 threads, and
    // 3 CTAs with a short last slice (rows of 32768 above: 2 CTAs × 256 threads).
    for (what, r, n) in [("rms_norm", 16, 262144), ("softmax", 16, 262144), ("softmax", 3, 33000)] {
        add(format!("row_{what}_{r}x{n}"), format!("row reduction: {what} of bf16[{r},{n}]"), row_kernel(DType::BF16, d(r), d(n), what));
    }
    for form in ["rotate_half", "interleaved"] {
        for (t, h, hd) in [(128, 9, 64), (7, 32, 128)] {
            add(format!("rope_{form}_{t}x{h}x{hd}"), format!("rope {form}: bf16[{t},{h},{hd}], positions i32[{t},1]"), rope_at(DType::BF16, form, t, h, hd));
        }
    }
    for (t, n) in [(64, 1536), (5, 14336)] {
        add(format!("swiglu_{t}x{n}"), format!("swiglu(gate, up): bf16[{t},{n}]"), swiglu_at(DType::BF16, t, n));
    }
    add("gather_bf16_i32_49152x576".into(), "gather: table bf16[49152,576], ids i32[4,32]".into(), embedding_at(DType::BF16, DType::I32, 49152, 576, 4, 32));
    add("gather_f32_i64_32000x4096".into(), "gather: table f32[32000,4096], ids i64[1,7]".into(), embedding_at(DType::F32, DType::I64, 32000, 4096, 1, 7));
    // fp8 activations (issue #8): quantize and dequantize, one shape each.
    add("quantize_fp8_bf16_64x4096".into(), "quantize_fp8(x bf16[64,4096], s f32[]) → f8e4m3".into(), quantize_fp8_at(DType::BF16, d(64), d(4096)));
    add("dequantize_fp8_bf16_64x4096".into(), "dequantize_fp8(x8 f8e4m3[64,4096], s f32[]) → bf16".into(), dequantize_fp8_at(DType::BF16, d(64), d(4096)));
    for (from, to) in [(DType::BF16, DType::F32), (DType::F32, DType::BF16)] {
        for (r, c) in [(1024, 4096), (3, 1000)] {
            add(format!("cast_{from}_{to}_{r}x{c}"), format!("cast {from}[{r},{c}] to {to}"), cast_kernel(from, to, r, c));
        }
    }
    add("kv_append_prefill".into(), "kv_append: pages bf16[64,16,3,64], new [2,5,3,64], block table [2,32]".into(), kv_append_at(DType::BF16, 64, 16, 3, 64, 2, 5, 32));
    add("kv_append_decode".into(), "kv_append: pages bf16[256,16,8,128], new [16,1,8,128], block table [16,16]".into(), kv_append_at(DType::BF16, 256, 16, 8, 128, 16, 1, 16));
    for (r, c) in [(128, 576), (33, 1000)] {
        add(format!("layout_transpose_{r}x{c}"), format!("layout: transpose bf16[{r},{c}]"), transpose_at(DType::BF16, r, c));
    }
    for (r, ca, cb) in [(64, 16, 48), (9, 20, 44)] {
        add(format!("layout_concat_{r}x{ca}_{cb}"), format!("layout: concat bf16[{r},{ca}], bf16[{r},{cb}] along the last axis"), concat_at(DType::BF16, r, ca, cb));
    }
    for (m, n, k) in [(256, 1536, 576), (512, 4096, 4096)] {
        add(format!("matmul_mma_{m}x{n}x{k}"), format!("matmul (tensor cores): bf16[{m},{k}] · bf16[{n},{k}]ᵀ"), matmul_at(DType::BF16, m, n, k));
    }
    add("matmul_mma_kn_256x1536x576".into(), "matmul (tensor cores, B [K, N]): bf16[256,576] · bf16[576,1536]".into(), matmul_kn_at(DType::BF16, 256, 1536, 576));
    add("matmul_tiled_f32_256x1536x576".into(), "matmul (tiled): f32[256,576] · f32[1536,576]ᵀ".into(), matmul_at(DType::F32, 256, 1536, 576));
    add("matmul_small_m_1x1536x576".into(), "matmul (small M): bf16[1,576] · bf16[1536,576]ᵀ".into(), matmul_at(DType::BF16, 1, 1536, 576));
    // The flat tensor-core GEMM (M in 2..=16).
    for (m, n, k) in [(16, 1536, 576), (16, 4096, 4096)] {
        add(format!("matmul_flat_{m}x{n}x{k}"), format!("matmul (flat, tensor cores): bf16[{m},{k}] · bf16[{n},{k}]ᵀ"), matmul_at(DType::BF16, m, n, k));
    }
    add("matmul_flat_kn_5x192x576".into(), "matmul (flat, tensor cores, B [K, N]): bf16[5,576] · bf16[576,192]".into(), matmul_kn_at(DType::BF16, 5, 192, 576));
    add("attention_causal_gqa_9_3_s128_d64".into(), "attention, causal GQA 9/3: bf16 B1 S128 D64".into(), attention_at(DType::BF16, 1, 9, 3, 128, 64, true));
    add("attention_causal_gqa_32_8_s512_d128".into(), "attention, causal GQA 32/8: bf16 B2 S512 D128".into(), attention_at(DType::BF16, 2, 32, 8, 512, 128, true));
    add("attention_mha_32_s4096_d128".into(), "attention, not causal, MHA 32: bf16 B2 S4096 D128 (the benchmark's shape)".into(), attention_at(DType::BF16, 2, 32, 32, 4096, 128, false));
    add("paged_attention_9_3_d64".into(), "paged attention, GQA 9/3: bf16 B4 D64, pages [64,16,3,64], block table [4,16]".into(), paged_at(DType::BF16, 4, 9, 3, 64, 64, 16, 16));
    add("paged_attention_32_8_d128".into(), "paged attention, GQA 32/8: bf16 B16 D128, pages [1024,16,8,128], block table [16,64]".into(), paged_at(DType::BF16, 16, 32, 8, 128, 1024, 16, 64));
    // Cascade decode: the prefix attention and the suffix decode with lse, the merge.
    add("attention_lse_prefix_bshd_d128".into(), "attention with lse, bshd: q bf16[16,256,8,128] over k/v [16,2048,8,128] (cascade prefix)".into(), attention_lse_at(DType::BF16, 16, 256, 8, 2048, 128));
    add("paged_attention_lse_32_8_d128".into(), "paged attention with lse, GQA 32/8: bf16 B64 D128, pages [1024,16,8,128], block table [64,16] (cascade suffix)".into(), paged_lse_at(DType::BF16, 64, 32, 8, 128, 1024, 16, 16));
    add("attention_merge_64x32x1x128".into(), "attention_merge: o bf16[64,32,1,128], lse f32[64,32,1]".into(), merge_at(DType::BF16, &[d(64), d(32), d(1)], 128));
    add("attention_merge_f32_rx5x40".into(), "attention_merge: o f32[R,5,40], lse f32[R,5]".into(), merge_at(DType::F32, &[s("R"), d(5)], 40));
    v
}

// ----- tools ------------------------------------------------------------------------------

/// Assembles `plan` for its target; asserts no spills, no stack, no warnings.
fn assemble(plan: &LaunchPlan) -> Option<ptxas::PtxasReport> {
    let path = ptxas::find_ptxas_for_tests().unwrap_or_else(|e| panic!("{e}"))?;
    let target = plan.target;
    let report = ptxas::assemble_with(&path, &plan.ptx, &target).unwrap_or_else(|e| panic!("{}: {e}\n{}", plan.entry, plan.ptx));
    let k = report.function(&plan.entry).unwrap_or_else(|| panic!("{}: not in {report:?}", plan.entry));
    assert!(!report.spills(), "{}: spills\n{report}", plan.entry);
    assert_eq!(k.stack_frame_bytes, 0, "{}: stack\n{report}", plan.entry);
    assert!(report.warnings.is_empty(), "{report}");
    assert!(k.registers * plan.block.iter().product::<u32>() <= target.registers_per_sm(), "{}: {} registers × {:?} threads", plan.entry, k.registers, plan.block);
    Some(report)
}

/// cuobjdump from the cache (it needs nvdisasm beside it, on PATH); `None` (skipped) where it
/// is missing, a panic under CI.
fn cuobjdump() -> Option<PathBuf> {
    let cache = std::env::var_os("SINTER_CACHE").map(PathBuf::from).or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/sinter")));
    let p = cache.map(|c| c.join("bin/cuobjdump")).filter(|p| p.is_file());
    if p.is_none() {
        assert!(std::env::var_os("CI").is_none(), "cuobjdump not found: run scripts/setup");
        eprintln!("skipped: cuobjdump not found, run scripts/setup");
    }
    p
}

/// The SASS of a cubin.
fn sass(tool: &PathBuf, cubin: &[u8], name: &str) -> String {
    let dir = std::env::temp_dir().join(format!("sinter-sass-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let f = dir.join("k.cubin");
    std::fs::write(&f, cubin).unwrap();
    let bin = tool.parent().unwrap();
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
    let out = Command::new(tool).arg("--dump-sass").arg(&f).env("PATH", path).output().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(out.status.success(), "cuobjdump: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Every case of the suite: (name, graph, kernel).
fn cases() -> Vec<(String, (KernelGraph, Kernel))> {
    let mut v: Vec<(String, (KernelGraph, Kernel))> = vec![
        ("pointwise silu_mul bf16 [T,14336]".into(), silu_mul(DType::BF16, s("T"), d(14336))),
        ("pointwise silu_mul f32 [T,17] (tail)".into(), silu_mul(DType::F32, s("T"), d(17))),
        ("pointwise silu_mul bf16 [3,5] (i32 index)".into(), silu_mul(DType::BF16, d(3), d(5))),
        ("pointwise zoo f32".into(), elementwise_zoo(DType::F32)),
        ("pointwise zoo bf16".into(), elementwise_zoo(DType::BF16)),
        ("pointwise rope rotate_half bf16".into(), rope(DType::BF16, "rotate_half")),
        ("pointwise rope interleaved f32".into(), rope(DType::F32, "interleaved")),
        ("pointwise swiglu bf16".into(), swiglu(DType::BF16)),
        ("row softmax decomposed bf16".into(), decomposed_softmax(DType::BF16)),
        ("row qk_norm bf16".into(), qk_norm(DType::BF16)),
        ("row int sum/max i32".into(), int_rows()),
        ("layout permute bf16".into(), transpose_heads(DType::BF16)),
        ("layout transpose f32".into(), transpose_2d(DType::F32)),
        ("layout concat/slice/broadcast bf16".into(), concat_slice(DType::BF16)),
        ("gather embedding bf16 i32".into(), embedding(DType::BF16, DType::I32)),
        ("gather embedding f32 i64".into(), embedding(DType::F32, DType::I64)),
        ("kv_append bf16".into(), kv_append(DType::BF16)),
        ("pointwise views bf16→f32".into(), views_pointwise()),
        ("pointwise flat mixed bf16/f32".into(), flat_mixed()),
        ("pointwise silu_mul f16 [T,100]".into(), silu_mul(DType::F16, s("T"), d(100))),
        ("layout concat last (straddling) + slice".into(), concat_last(false)),
        ("layout concat last (aligned) + slice".into(), concat_last(true)),
        ("row epilogues f32".into(), row_epilogues(DType::F32)),
        ("row softmax f16 [R,1000]".into(), row_kernel(DType::F16, s("R"), d(1000), "softmax")),
        ("gather scaled embedding".into(), embedding_scaled()),
        ("pointwise quantize_fp8 bf16 [T,1000]".into(), quantize_fp8_at(DType::BF16, s("T"), d(1000))),
        ("pointwise quantize_fp8 f32 [T,17] (tail)".into(), quantize_fp8_at(DType::F32, s("T"), d(17))),
        ("pointwise dequantize_fp8 bf16 [T,1000]".into(), dequantize_fp8_at(DType::BF16, s("T"), d(1000))),
        ("pointwise dequantize_fp8 f32 [T,17] (tail)".into(), dequantize_fp8_at(DType::F32, s("T"), d(17))),
    ];
    v.extend(fp8_misc());
    for what in ["softmax", "log_softmax", "rms_norm", "layer_norm", "reduce_sum", "reduce_mean", "reduce_max", "reduce_min"] {
        for dt in [DType::BF16, DType::F32] {
            let ns: Vec<Dim> = if matches!(what, "softmax" | "rms_norm") {
                vec![d(1), d(17), d(1000), d(3420), d(4096), d(32768), d(33000), d(262144), s("N")]
            } else {
                // 32768 and 33000: cluster schedules on sm_90a (f32 LayerNorm spilled there).
                vec![d(17), d(4096), d(32768), d(33000), d(262144), s("N")]
            };
            for n in ns {
                v.push((format!("row {what} {dt} [R,{n}]"), row_kernel(dt, s("R"), n, what)));
            }
        }
    }
    v
}

// ----- tests ------------------------------------------------------------------------------

/// Every case compiles for sm_80 and sm_90a and assembles without spills; the ptxas resource
/// report of every kernel is a snapshot.
#[test]
fn every_family_assembles_without_spills() {
    let mut lines = String::new();
    let mut assembled = false;
    for (name, (g, k)) in cases() {
        for t in [Target::SM_80, Target::SM_90A] {
            let plan = compile_kernel(&g, k, &t).unwrap_or_else(|e| panic!("{name} {t}: {e}"));
            assert!(plan.ptx.contains(&format!(".visible .entry {}(", plan.entry)), "{name}");
            assert_eq!(plan.params[..g.kernels[k].inputs.len()], (0..g.kernels[k].inputs.len()).map(KernelParam::Buffer).collect::<Vec<_>>()[..]);
            if let Some(r) = assemble(&plan) {
                assembled = true;
                let f = r.function(&plan.entry).unwrap();
                lines.push_str(&format!(
                    "{name} | {t}: {} regs, {} barriers, {} B smem, {} B spill | grid {}/{} block {:?}\n",
                    f.registers,
                    f.barriers,
                    f.shared_bytes,
                    f.spill_store_bytes + f.spill_load_bytes,
                    plan.grid[0].numerator,
                    plan.grid[0].denominator,
                    plan.block
                ));
            }
        }
    }
    if assembled {
        insta::assert_snapshot!("ptxas_reports", lines);
    }
}

/// One line about a plan: entry, target, launch geometry, dynamic shared memory, parameters.
fn plan_line(plan: &LaunchPlan) -> String {
    let grid: Vec<String> = plan.grid.iter().map(|g| format!("⌈{}/{}⌉", g.numerator, g.denominator)).collect();
    let sizes: Vec<String> = plan.params.iter().filter_map(|p| if let KernelParam::Size(d) = p { Some(d.to_string()) } else { None }).collect();
    format!(
        "{} {}: grid [{}], block {:?}, dynamic smem {}, {} buffers, sizes [{}]",
        plan.entry,
        plan.target,
        grid.join(", "),
        plan.block,
        plan.shared_bytes,
        plan.params.len() - sizes.len(),
        sizes.join(", ")
    )
}

/// The PTX of every kernel family at two fixed shapes, for sm_80 and sm_90a, each assembled by
/// ptxas (no spills, no stack, no warnings: see [`assemble`]); a snapshot holds what the case
/// is, its launch plan, ptxas's resource lines for that PTX and the PTX itself. Skipped (with
/// a message) where ptxas is missing outside CI, since the resource lines are part of the
/// snapshot.
#[test]
fn ptx_snapshots() {
    for (name, what, (g, k)) in ptx_cases() {
        for t in [Target::SM_80, Target::SM_90A] {
            let plan = compile_kernel(&g, k, &t).unwrap_or_else(|e| panic!("{name} {t}: {e}"));
            let Some(report) = assemble(&plan) else { return };
            assert!(!report.spills(), "{name} {t}: spills\n{report}");
            let text = format!("# {what}\n# {}\n{}{}", plan_line(&plan), report.to_string().lines().map(|l| format!("# ptxas {l}\n")).collect::<String>(), plan.ptx);
            insta::assert_snapshot!(format!("ptx_{name}_{}", t.name()), text);
        }
    }
}

/// 16-byte loads (`LDG.E.128`) in the vectorised pointwise kernel, butterfly shuffles
/// (`SHFL.BFLY`) in every reduction, checked in the SASS.
#[test]
fn sass_has_vector_loads_and_shuffles() {
    let Some(tool) = cuobjdump() else { return };
    for t in [Target::SM_80, Target::SM_90A] {
        let (g, k) = silu_mul(DType::BF16, s("T"), d(14336));
        let plan = compile_kernel(&g, k, &t).unwrap();
        let Some(r) = assemble(&plan) else { return };
        let code = sass(&tool, &r.cubin, "silu");
        assert!(code.contains("LDG.E.128"), "{t}: no 16-byte load:\n{code}");
        assert!(code.contains("STG.E.128"), "{t}: no 16-byte store:\n{code}");
        let (g, k) = embedding(DType::BF16, DType::I32);
        let plan = compile_kernel(&g, k, &t).unwrap();
        let r = assemble(&plan).unwrap();
        let code = sass(&tool, &r.cubin, "gather");
        assert!(code.contains("LDG.E.128") && code.contains("STG.E.128"), "{t}: gather rows not vectorised:\n{code}");
        for what in ["softmax", "rms_norm", "layer_norm", "reduce_max"] {
            for n in [d(17), d(4096), d(262144), s("N")] {
                let (g, k) = row_kernel(DType::BF16, s("R"), n.clone(), what);
                let plan = compile_kernel(&g, k, &t).unwrap();
                let r = assemble(&plan).unwrap();
                let code = sass(&tool, &r.cubin, what);
                assert!(code.contains("SHFL.BFLY"), "{t} {what} {n}: no butterfly shuffle:\n{code}");
                if n == d(4096) {
                    assert!(code.contains("LDG.E.128"), "{t} {what} {n}: row not read in 16-byte vectors:\n{code}");
                }
                if n == d(262144) && t == Target::SM_90A && what != "reduce_max" {
                    // The cluster schedule: the slice prefetched into shared memory with
                    // 16-byte cp.async (LDGSTS.E.BYPASS.128, L1 bypassed), read back in 16-byte
                    // vectors, the cluster barrier in hardware.
                    for ins in ["LDGSTS.E.BYPASS.128", "LDGDEPBAR", "LDS.128", "UCGABAR_ARV", "UCGABAR_WAIT"] {
                        assert!(code.contains(ins), "{t} {what} {n}: no {ins}:\n{code}");
                    }
                }
            }
        }
    }
}

/// The tensor-core matmul is what it claims in the SASS: `HMMA` (mma.sync), `LDSM`
/// (ldmatrix; `.MT88` transposed for a `[K, N]` B) and `LDGSTS` (cp.async), with the main
/// loop's shared-memory reads and copies in between the MMAs, at sm_80 and sm_90a.
#[test]
fn sass_has_tensor_core_instructions() {
    let Some(tool) = cuobjdump() else { return };
    // sm_90 (not sm_90a, whose large matmuls take `wgmma`: `sass_wgmma_has_hgmma`).
    for t in [Target::SM_80, Target::SM_90] {
        for (what, gk) in [("[N, K] B", matmul_at(DType::BF16, 512, 4096, 4096)), ("[K, N] B", matmul_kn_at(DType::BF16, 256, 1536, 576)), ("f16", matmul_at(DType::F16, 256, 1536, 576))] {
            let plan = compile_kernel(&gk.0, gk.1, &t).unwrap();
            assert!(plan.entry.ends_with("_mma"), "{t} {what}: {}", plan.entry);
            let Some(r) = assemble(&plan) else { return };
            let code = sass(&tool, &r.cubin, "mma");
            for want in ["HMMA.16816.F32", "LDSM.16.M", "LDGSTS.E.BYPASS", "DEPBAR", "BAR.SYNC"] {
                assert!(code.contains(want), "{t} {what}: no {want}:\n{code}");
            }
            assert_eq!(code.contains("LDSM.16.MT88.4"), what == "[K, N] B", "{t} {what}: transposed ldmatrix only for [K, N]");
            // 64×64 warp tiles: 32 MMAs per 16-deep k-step, 4 steps per 64-deep stage.
            assert!(code.matches("HMMA.16816").count() >= 128, "{t} {what}: {} HMMA", code.matches("HMMA.16816").count());
        }
        // The flat GEMM (M ≤ 16): 16×16 warp tiles, 2 MMAs per k-step, 16 steps per 256-deep
        // stage.
        for (what, gk) in [("flat [N, K] B", matmul_at(DType::BF16, 16, 1536, 576)), ("flat [K, N] B", matmul_kn_at(DType::BF16, 5, 192, 576))] {
            let plan = compile_kernel(&gk.0, gk.1, &t).unwrap();
            assert!(plan.entry.ends_with("_mma") && plan.block == [64, 1, 1], "{t} {what}: {} {:?}", plan.entry, plan.block);
            let Some(r) = assemble(&plan) else { return };
            let code = sass(&tool, &r.cubin, "flat");
            for want in ["HMMA.16816.F32", "LDSM.16.M", "LDGSTS.E.BYPASS", "DEPBAR", "BAR.SYNC"] {
                assert!(code.contains(want), "{t} {what}: no {want}:\n{code}");
            }
            assert_eq!(code.contains("LDSM.16.MT88.4"), what == "flat [K, N] B", "{t} {what}: transposed ldmatrix only for [K, N]");
            assert!(code.matches("HMMA.16816").count() >= 32, "{t} {what}: {} HMMA", code.matches("HMMA.16816").count());
        }
    }
}

/// The Hopper GEMM (`wgmma`, sm_90a) loaded by cp.async (the schedule where the operands
/// allow no tensor map) in the SASS: `HGMMA` warpgroup products reading both operands from
/// shared memory, `LDGSTS` (cp.async) for the slabs, the async-proxy fence;
/// no spills. sm_80 refuses the schedule.
#[test]
fn sass_wgmma_has_hgmma() {
    let Some(tool) = cuobjdump() else { return };
    use sinter_codegen::kernels::matmul::{MatmulSchedule, WgmmaSchedule};
    let chunks = WgmmaSchedule { tma: false, ..WgmmaSchedule::DEFAULT };
    for w in [MatmulSchedule::Wgmma(chunks), MatmulSchedule::Wgmma(WgmmaSchedule { in_flight: 0, ..chunks })] {
    for (what, gk) in [("[N, K] B", matmul_at(DType::BF16, 512, 4096, 4096)), ("f16 tails", matmul_at(DType::F16, 200, 1000, 520))] {
        let plan = sinter_codegen::kernels::matmul::generate_with(&gk.0, gk.1, &Target::SM_90A, &w).unwrap();
        assert!(plan.entry.ends_with("_wgmma"), "{what}: {}", plan.entry);
        assert!(plan.ptx.contains(".align 1024 .b8 smem_dyn[]"), "{what}: the slabs' 1024-byte alignment");
        let Some(r) = assemble(&plan) else { return };
        assert!(!r.spills(), "{what}: spills: {r:?}");
        let code = sass(&tool, &r.cubin, "wgmma");
        if std::env::var_os("SINTER_DUMP_WGMMA").is_some() {
            std::fs::write(format!("/tmp/wgmma_{}_{}.ptx", what.len(), w.name().len()), &plan.ptx).unwrap();
        }
        for want in ["HGMMA.64x256x16.F32", "LDGSTS.E.BYPASS", "FENCE.VIEW.ASYNC.S", "BAR.SYNC"] {
            assert!(code.contains(want), "{what}: no {want}:\n{code}");
        }
        assert!(!code.contains("HMMA.16816"), "{what}: mma.sync in the wgmma kernel");
        let err = sinter_codegen::kernels::matmul::generate_with(&gk.0, gk.1, &Target::SM_80, &w).unwrap_err();
        assert!(err.to_string().contains("sm_90a"), "{what}: {err}");
    }
    }
}

/// The TMA-loaded wgmma matmul (sm_90a): two tensor maps (A `[M, K]`, B `[N, K]`, boxes of
/// one K tile, 128-byte swizzle) as 128-byte `__grid_constant__` parameters addressed in the
/// parameter space, `cp.async.bulk.tensor` copies completing on mbarriers; in the SASS
/// `UTMALDG` and the mbarrier's `SYNCS` operations, `HGMMA`, and no `LDGSTS` (cp.async).
/// Shapes with tails (200 × 1000 × 520, f16) too: the boxes' out-of-bounds rows read zero.
#[test]
fn sass_wgmma_tma_has_utmaldg() {
    use sinter_codegen::kernels::matmul::{MatmulSchedule, WgmmaSchedule};
    use sinter_ir::KernelParam;
    let w = MatmulSchedule::Wgmma(WgmmaSchedule { tma: true, ..WgmmaSchedule::DEFAULT });
    for (what, gk, (m, n, k)) in [("[N, K] B", matmul_at(DType::BF16, 512, 4096, 4096), (512, 4096, 4096)), ("f16 tails", matmul_at(DType::F16, 200, 1000, 520), (200, 1000, 520))] {
        let plan = sinter_codegen::kernels::matmul::generate_with(&gk.0, gk.1, &Target::SM_90A, &w).unwrap();
        let maps: Vec<_> = plan.params.iter().filter_map(|p| if let KernelParam::TensorMap(t) = p { Some(t.clone()) } else { None }).collect();
        assert_eq!(maps.len(), 2, "{what}: {:?}", plan.params);
        for (t, outer, rows) in [(&maps[0], m, 128u32), (&maps[1], n, 256)] {
            assert_eq!((t.dims.iter().map(|d| d.as_const()).collect::<Vec<_>>(), t.box_dims.clone(), t.swizzle), (vec![Some(k), Some(outer)], vec![64, rows], 128), "{what}");
        }
        for want in [".param .align 64 .b8", "cvta.param.u64", "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes", "mbarrier.try_wait.parity", "mbarrier.arrive.expect_tx", "fence.mbarrier_init"] {
            assert!(plan.ptx.contains(want), "{what}: no `{want}` in the PTX");
        }
        assert!(!plan.ptx.contains("cp.async.cg"), "{what}: cp.async chunks in the TMA kernel");
        let Some(r) = assemble(&plan) else { return };
        assert!(!r.spills(), "{what}: spills: {r:?}");
        let Some(tool) = cuobjdump() else { return };
        let code = sass(&tool, &r.cubin, "wgmma");
        for want in ["UTMALDG.2D", "SYNCS", "HGMMA.64x256x16.F32"] {
            assert!(code.contains(want), "{what}: no {want}:\n{code}");
        }
        assert!(!code.contains("LDGSTS"), "{what}: cp.async in the TMA kernel");
    }
    // Batched: A `[3, 130, 256]` gets a rank-3 map (its batch axis), B `[200, 256]`
    // broadcast across the batch a rank-2 one; the TMA is the sm_90a default.
    let mut fb = FunctionBuilder::new(&Graph::new(), "bmm");
    let x = fb.param("x", ty(DType::BF16, &[d(3), d(130), d(256)]));
    let wt = fb.param("w", ty(DType::BF16, &[d(200), d(256)]));
    let y = op_a(&mut fb, OpKind::Matmul, &[x, wt], vec![("transpose_b", Attr::Bool(true))]);
    let gk = single(Family::Matmul, fb.finish(&[y]).unwrap());
    let plan = compile_kernel(&gk.0, gk.1, &Target::SM_90A).unwrap();
    let ranks: Vec<usize> = plan.params.iter().filter_map(|p| if let KernelParam::TensorMap(t) = p { Some(t.dims.len()) } else { None }).collect();
    assert_eq!(ranks, vec![3, 2], "{:?}", plan.params);
    assert!(plan.ptx.contains("cp.async.bulk.tensor.3d") && plan.ptx.contains("cp.async.bulk.tensor.2d"));
    // Operands neither the wgmma kernel nor a tensor map can read are refused with the
    // reason: a K of 100 f16 (200-byte rows, not a multiple of 16 bytes).
    let gk = matmul_at(DType::F16, 128, 256, 100);
    let err = sinter_codegen::kernels::matmul::generate_with(&gk.0, gk.1, &Target::SM_90A, &w).unwrap_err();
    assert!(err.to_string().contains("16-byte"), "{err}");
}

/// The warp-specialised wgmma matmul (`WgmmaSchedule::specialized`, issue #8), one CTA per
/// tile and persistent over 132 CTAs: 384 threads (`.maxntid 384`, so ptxas budgets ≤ 168
/// registers a thread), `setmaxnreg` 40/232 (`USETMAXREG` in the SASS), the producer's
/// `UTMALDG`, the mbarriers' `SYNCS`, `HGMMA`, no spills, and one `BAR.SYNC` only (the one
/// publishing the mbarriers' initialisation: none in the main loop); the persistent form's
/// grid is `[132, 1, 1]`. Both are schedule candidates of a plain sm_90a product.
#[test]
fn sass_wgmma_ws_has_setmaxnreg() {
    use sinter_codegen::kernels::matmul::{MatmulSchedule, WgmmaSchedule};
    let ws = WgmmaSchedule { specialized: true, ..WgmmaSchedule::DEFAULT };
    let persistent = WgmmaSchedule { ctas: 132, ..ws };
    let gk = matmul_at(DType::BF16, 512, 4096, 4096);
    let names: Vec<String> = sinter_codegen::schedule_variants(&gk.0, gk.1, &Target::SM_90A).unwrap().into_iter().map(|v| v.name).collect();
    for w in [ws, persistent] {
        assert!(names.contains(&MatmulSchedule::Wgmma(w).name()), "{:?} not in {names:?}", MatmulSchedule::Wgmma(w).name());
    }
    for (what, gk) in [("bf16 512x4096x4096", matmul_at(DType::BF16, 512, 4096, 4096)), ("f16 tails", matmul_at(DType::F16, 200, 1000, 520))] {
        for w in [ws, persistent] {
            let name = MatmulSchedule::Wgmma(w).name();
            let plan = sinter_codegen::kernels::matmul::generate_with(&gk.0, gk.1, &Target::SM_90A, &MatmulSchedule::Wgmma(w)).unwrap();
            assert_eq!(plan.block, [384, 1, 1], "{what} {name}");
            if w.ctas > 0 {
                assert_eq!(plan.grid.iter().map(|g| (g.numerator.as_const(), g.denominator)).collect::<Vec<_>>(), vec![(Some(132), 1), (Some(1), 1), (Some(1), 1)], "{what} {name}");
            }
            for want in [".maxntid 384", "setmaxnreg.dec.sync.aligned.u32 40", "setmaxnreg.inc.sync.aligned.u32 232", "mbarrier.arrive.shared::cta.b64", "mbarrier.arrive.expect_tx", "cp.async.bulk.tensor.2d"] {
                assert!(plan.ptx.contains(want), "{what} {name}: no `{want}` in the PTX");
            }
            let Some(r) = assemble(&plan) else { return };
            let regs = r.function(&plan.entry).map(|k| k.registers).unwrap_or(0);
            eprintln!("{what} {name}: {regs} registers");
            assert!(regs <= 168, "{what} {name}: {regs} registers");
            let Some(tool) = cuobjdump() else { return };
            let code = sass(&tool, &r.cubin, "wgmma");
            for want in ["USETMAXREG", "UTMALDG.2D", "SYNCS", "HGMMA.64x256x16.F32"] {
                assert!(code.contains(want), "{what} {name}: no {want}:\n{code}");
            }
            assert_eq!(code.matches("BAR.SYNC").count(), 1, "{what} {name}: CTA barriers beyond the initialisation's:\n{code}");
            assert!(!code.contains("LDGSTS"), "{what} {name}: cp.async in the TMA kernel");
        }
    }
}

/// The fp8 matmul (`f8e4m3` operands, issue #8) on sm_90a: the `wgmma` kernel with e4m3
/// products — `QGMMA` in the SASS (`wgmma.mma_async …k32.f32.e4m3.e4m3`), no `HGMMA`/`HMMA`
/// —, `LDGSTS` (cp.async) for the byte slabs, no spills, for every wgmma schedule candidate
/// and with M, N and K tails (K a multiple of 16: 16-byte rows); bf16 and f32 results. sm_80
/// and sm_90 (no `wgmma`) refuse it, naming f8e4m3.
#[test]
fn sass_fp8_wgmma_has_qgmma() {
    let Some(tool) = cuobjdump() else { return };
    for (what, gk) in [("fp8 512x4096x4096", fp8_matmul_at(DType::BF16, 512, 4096, 4096)), ("fp8 tails 200x300x208", fp8_matmul_at(DType::BF16, 200, 300, 208)), ("fp8 f32 out", fp8_matmul_at(DType::F32, 128, 256, 128))] {
        let variants = sinter_codegen::schedule_variants(&gk.0, gk.1, &Target::SM_90A).unwrap();
        assert!(variants.len() >= 3 && variants.iter().all(|v| v.name.starts_with("wgmma ") && v.name.contains("x128 ")), "{what}: {:?}", variants.iter().map(|v| &v.name).collect::<Vec<_>>());
        for v in &variants {
            let plan = &v.plan;
            assert!(plan.entry.ends_with("_matmul_wgmma_e4m3"), "{what}: {}", plan.entry);
            assert!(plan.ptx.contains("wgmma.mma_async.sync.aligned.m64n") && plan.ptx.contains("k32.f32.e4m3.e4m3"), "{what} {}", v.name);
            let Some(r) = assemble(plan) else { return };
            assert!(!r.spills(), "{what} {}: spills: {r:?}", v.name);
            let code = sass(&tool, &r.cubin, "fp8");
            // The TMA-loaded candidate (`… tma`: e4m3 boxes of 128 × rows, one byte an
            // element) or every thread's cp.async chunks.
            let loads: &[&str] = if v.name.ends_with(" tma") { &["UTMALDG.2D", "SYNCS"] } else { &["LDGSTS.E.BYPASS", "FENCE.VIEW.ASYNC.S"] };
            for want in ["QGMMA.64x", "BAR.SYNC"].iter().chain(loads) {
                assert!(code.contains(want), "{what} {}: no {want}:\n{code}", v.name);
            }
            assert!(!code.contains("HGMMA") && !code.contains("HMMA"), "{what} {}: 16-bit tensor-core products in the fp8 kernel", v.name);
        }
        for t in [Target::SM_80, Target::SM_90] {
            let err = compile_kernel(&gk.0, gk.1, &t).unwrap_err().to_string();
            assert!(err.contains("f8e4m3") && err.contains("sm_90a"), "{what} {t}: {err}");
        }
    }
}

/// The PTX of the fp8 matmul (sm_90a only: the other targets refuse it) at one shape with
/// its launch plan and ptxas's resource lines (no spills), as [`ptx_snapshots`].
#[test]
fn ptx_snapshot_fp8_wgmma() {
    let (g, k) = fp8_matmul_at(DType::BF16, 512, 4096, 4096);
    let plan = compile_kernel(&g, k, &Target::SM_90A).unwrap();
    let Some(report) = assemble(&plan) else { return };
    assert!(!report.spills(), "spills\n{report}");
    let what = "matmul (fp8 wgmma): dequantize_fp8(f8e4m3[512,4096], sa) · dequantize_fp8(f8e4m3[4096,4096], sb)ᵀ → bf16";
    let text = format!("# {what}\n# {}\n{}{}", plan_line(&plan), report.to_string().lines().map(|l| format!("# ptxas {l}\n")).collect::<String>(), plan.ptx);
    insta::assert_snapshot!("ptx_matmul_fp8_wgmma_512x4096x4096_sm_90a", text);
}

/// The fp8 attention (`f8e4m3` q, k, v, issue #8) on sm_90a: the `wgmma` attention kernel
/// with e4m3 products — `QGMMA` in the SASS for Q·Kᵀ (both operands from shared memory) and
/// P·V (A from registers), no `HGMMA`/`HMMA` —, `F2FP` packing P to e4m3, `PRMT` transposing
/// V, `LDGSTS` (cp.async) for the tiles, `FENCE.VIEW.ASYNC.S` (the async-proxy fence), no
/// spills, at head dims 128 and 64, causal or not, for each schedule candidate (128- and
/// 64-key tiles, and the intra-warpgroup overlap). sm_80 and sm_90 refuse it, naming f8e4m3.
#[test]
fn sass_fp8_attention_has_qgmma() {
    let Some(tool) = cuobjdump() else { return };
    for (what, gk) in [("fp8 attention D128 causal", fp8_attention_at(2, 32, 8, 512, 128, true)), ("fp8 attention D64", fp8_attention_at(1, 8, 8, 300, 64, false))] {
        let variants = sinter_codegen::schedule_variants(&gk.0, gk.1, &Target::SM_90A).unwrap();
        assert_eq!(variants.iter().map(|v| v.name.as_str()).collect::<Vec<_>>(), ["wgmma kv128 g2 e4m3", "wgmma kv64 g2 e4m3", "wgmma kv128 g2 ov e4m3"], "{what}");
        for v in &variants {
            let plan = &v.plan;
            assert!(plan.entry.ends_with("_attention_wgmma_e4m3"), "{what}: {}", plan.entry);
            let Some(r) = assemble(plan) else { return };
            assert!(!r.spills(), "{what} {}: spills: {r:?}", v.name);
            let code = sass(&tool, &r.cubin, "fp8attn");
            for want in ["QGMMA.64x", "F2FP.SATFINITE.E4M3.F32.PACK_AB", "PRMT", "LDGSTS.E.BYPASS", "FENCE.VIEW.ASYNC.S", "MUFU.EX2", "BAR.SYNC"] {
                assert!(code.contains(want), "{what} {}: no {want}:\n{code}", v.name);
            }
            assert!(!code.contains("HGMMA") && !code.contains("HMMA"), "{what} {}: 16-bit tensor-core products in the fp8 kernel", v.name);
        }
        for t in [Target::SM_80, Target::SM_90] {
            let err = compile_kernel(&gk.0, gk.1, &t).unwrap_err().to_string();
            assert!(err.contains("f8e4m3") && err.contains("sm_90a"), "{what} {t}: {err}");
        }
    }
}

/// The PTX of the fp8 attention (sm_90a only) at head dims 128 (causal GQA 32/8) and 64 with
/// its launch plan and ptxas's resource lines (no spills), as [`ptx_snapshots`].
#[test]
fn ptx_snapshot_fp8_attention() {
    for (name, what, (g, k)) in [
        ("ptx_attention_fp8_causal_gqa_32_8_s512_d128_sm_90a", "attention (fp8 wgmma), causal GQA 32/8: f8e4m3 B2 S512 D128 → bf16", fp8_attention_at(2, 32, 8, 512, 128, true)),
        ("ptx_attention_fp8_s300_d64_sm_90a", "attention (fp8 wgmma): f8e4m3 B1 H8 S300 D64 → bf16", fp8_attention_at(1, 8, 8, 300, 64, false)),
    ] {
        let plan = compile_kernel(&g, k, &Target::SM_90A).unwrap();
        let Some(report) = assemble(&plan) else { return };
        assert!(!report.spills(), "spills\n{report}");
        let text = format!("# {what}\n# {}\n{}{}", plan_line(&plan), report.to_string().lines().map(|l| format!("# ptxas {l}\n")).collect::<String>(), plan.ptx);
        insta::assert_snapshot!(name, text);
    }
}

/// Prefill attention on tensor cores, in the SASS: `HMMA` for Q·Kᵀ and P·V, `LDSM` for Q
/// and K and its transposed form (`.MT88`) for V, `LDGSTS` (cp.async) for the tiles,
/// `MUFU.EX2` alone for the exponentials (no subnormal range fix-ups), `VOTE.ANY` for the
/// warp's decisions, at sm_80 and sm_90 (sm_90a takes the `wgmma` kernel:
/// [`sass_attention_wgmma_has_hgmma`]), for head dims 64 and 128, causal or not.
#[test]
fn sass_attention_has_tensor_core_instructions() {
    let Some(tool) = cuobjdump() else { return };
    for t in [Target::SM_80, Target::SM_90] {
        for (hd, causal) in [(64, true), (128, true), (128, false)] {
            let (g, k) = attention_at(DType::BF16, 2, 32, 8, 512, hd, causal);
            let plan = compile_kernel(&g, k, &t).unwrap();
            let Some(r) = assemble(&plan) else { return };
            let code = sass(&tool, &r.cubin, "attention");
            for want in ["HMMA.16816.F32.BF16", "LDSM.16.M88.4", "LDSM.16.MT88.4", "LDGSTS.E.BYPASS.128", "MUFU.EX2", "SHFL.BFLY", "VOTE.ANY", "BAR.SYNC", "STG.E.128"] {
                assert!(code.contains(want), "{t} D{hd} causal={causal}: no {want}:\n{code}");
            }
            // One 32- or 64-key tile: 2 slabs × (D/16 · kv/8 for S + kv/16 · D/8 for O).
            let hmma = code.matches("HMMA.16816").count();
            assert!(hmma >= 128, "{t} D{hd}: {hmma} HMMA");
            assert!(!code.contains("LDL") && !code.contains("STL"), "{t} D{hd}: local memory");
        }
    }
}

/// Prefill attention on Hopper tensor cores (sm_90a, the default there for head dims 64 and
/// 128): `HGMMA` for Q·Kᵀ and P·V and no `HMMA`, `LDGSTS` for the tiles, the async-proxy
/// fence, the warpgroup's `BAR.RED.OR`, `MUFU.EX2` for the exponentials; no local memory.
/// Each schedule candidate, bf16, causal or not, D 64 and 128; the intra-warpgroup overlap
/// (`ov`) with a group left in flight and no serialization by ptxas.
#[test]
fn sass_attention_wgmma_has_hgmma() {
    use sinter_codegen::kernels::attention::generate_prefill_wg_with;
    use sinter_codegen::kernels::attention_tc::{choose_wg_schedule, WgSchedule};
    let Some(tool) = cuobjdump() else { return };
    for (hd, causal) in [(64, true), (128, true), (128, false)] {
        let (g, k) = attention_at(DType::BF16, 2, 32, 8, 512, hd, causal);
        let default = compile_kernel(&g, k, &Target::SM_90A).unwrap();
        assert!(default.entry.ends_with("_attention_wgmma"), "D{hd}: {}", default.entry);
        let w = choose_wg_schedule(hd as u32, hd as u32);
        for sc in [w, WgSchedule { pv_split: true, ..w }, WgSchedule { block_kv: 64, ..w }, WgSchedule { overlap: true, ..w }, WgSchedule { overlap: true, block_kv: 64, ..w }] {
            let plan = generate_prefill_wg_with(&g, k, &Target::SM_90A, &sc).unwrap();
            let Some(r) = assemble(&plan) else { return };
            let code = sass(&tool, &r.cubin, "attention_wgmma");
            for want in ["HGMMA.64x", "LDGSTS.E.BYPASS.128", "FENCE.VIEW.ASYNC.S", "MUFU.EX2", "SHFL.BFLY", "BAR.SYNC", "BAR.RED.OR", "STG.E.128"] {
                assert!(code.contains(want), "{} D{hd} causal={causal}: no {want}:\n{code}", sc.name());
            }
            assert!(!code.contains("HMMA.16816"), "{} D{hd}: mma.sync in the wgmma kernel", sc.name());
            assert!(!code.contains("LDL") && !code.contains("STL"), "{} D{hd}: local memory", sc.name());
            // S: m64n{kv}k16 per 16 of D; P·V: per 16 keys, one m64n{Dv}k16 or Dv/64 n64.
            let n = code.matches("HGMMA.64x").count() as u32;
            let pv = if sc.pv_split { hd / 64 } else { 1 };
            assert!(n >= hd as u32 / 16 + sc.block_kv / 16 * pv as u32, "{} D{hd}: {n} HGMMA", sc.name());
            // The overlap keeps a group in flight: a `WARPGROUP.DEPBAR` that waits for all but
            // one group (S_t done while P·V runs) with the softmax's exponentials before the
            // wait for the last (ptxas hoists a wait to the top of its basic block), and
            // ptxas did not serialize the `wgmma`s.
            if sc.overlap {
                let overlapped = code.match_indices("WARPGROUP.DEPBAR.LE gsb0, 0x1").any(|(i, _)| {
                    let rest = &code[i..];
                    rest.find("WARPGROUP.DEPBAR.LE gsb0, 0x0").is_some_and(|j| rest[..j].contains("MUFU.EX2"))
                });
                assert!(overlapped, "{} D{hd} causal={causal}: no softmax between the waits:\n{code}", sc.name());
                assert!(!r.log.contains("serialized"), "{} D{hd} causal={causal}: {}", sc.name(), r.log);
            }
        }
    }
}

/// The warp-specialised wgmma attention (`WgSchedule::producer`, names ` ws`) and its
/// ping-pong (` ws pp`), issue #8: schedule candidates of a plain sm_90a prefill at D 64 and
/// 128; 384 threads (`.maxntid 384`: ptxas budgets ≤ 168 registers a thread before
/// `setmaxnreg`), `USETMAXREG` (24/240), the producer's `UTMALDG.4D` (Q, K, V through 4-d
/// maps), the mbarriers' `SYNCS`, `HGMMA`, no `LDGSTS` (cp.async) and no local memory, no
/// `wgmma` serialization; one CTA-wide `BAR.SYNC 0` (the mbarriers' initialisation: none in
/// the key loop), the ping-pong's `BAR.ARV` on the named scheduling barriers.
#[test]
fn sass_attention_wgmma_ws_has_tma_and_setmaxnreg() {
    use sinter_codegen::kernels::attention::generate_prefill_wg_with;
    use sinter_codegen::kernels::attention_tc::{choose_wg_schedule, WgSchedule};
    for (hd, causal) in [(64, true), (128, true), (128, false)] {
        let (g, k) = attention_at(DType::BF16, 2, 32, 8, 512, hd, causal);
        let names: Vec<String> = sinter_codegen::schedule_variants(&g, k, &Target::SM_90A).unwrap().into_iter().map(|v| v.name).collect();
        let ws = WgSchedule { producer: true, ..choose_wg_schedule(hd as u32, hd as u32) };
        let pp = WgSchedule { pingpong: true, ..ws };
        for sc in [ws, pp, WgSchedule { block_kv: 64, ..ws }, WgSchedule { block_kv: 64, ..pp }] {
            assert!(names.contains(&sc.name()), "{} not in {names:?}", sc.name());
            let plan = generate_prefill_wg_with(&g, k, &Target::SM_90A, &sc).unwrap();
            assert_eq!(plan.block, [384, 1, 1], "{}", sc.name());
            assert!(plan.ptx.contains(".maxntid 384"), "{}", sc.name());
            let Some(r) = assemble(&plan) else { return };
            let regs = r.function(&plan.entry).map(|k| k.registers).unwrap_or(0);
            assert!(regs <= 168, "{} D{hd}: {regs} registers", sc.name());
            assert!(!r.log.contains("serialized"), "{} D{hd} causal={causal}: {}", sc.name(), r.log);
            let Some(tool) = cuobjdump() else { return };
            let code = sass(&tool, &r.cubin, "attention_wgmma_ws");
            for want in ["USETMAXREG", "UTMALDG.4D", "SYNCS", "HGMMA.64x", "MUFU.EX2", "BAR.RED.OR", "STG.E.128"] {
                assert!(code.contains(want), "{} D{hd} causal={causal}: no {want}:\n{code}", sc.name());
            }
            assert!(!code.contains("LDGSTS"), "{} D{hd}: cp.async in the TMA kernel", sc.name());
            assert!(!code.contains("HMMA.16816"), "{} D{hd}: mma.sync in the wgmma kernel", sc.name());
            assert!(!code.contains("LDL") && !code.contains("STL"), "{} D{hd}: local memory", sc.name());
            let cta = code.lines().filter(|l| l.contains("BAR.SYNC") && !l.contains("BAR.SYNC.DEFER_BLOCKING R") && (l.contains("BAR.SYNC 0x0") || l.contains("BAR.SYNC.DEFER_BLOCKING 0x0"))).count();
            assert_eq!(cta, 1, "{} D{hd}: CTA barriers beyond the initialisation's:\n{code}", sc.name());
            assert_eq!(code.contains("BAR.ARV"), sc.pingpong, "{} D{hd}: the ping-pong's bar.arrive", sc.name());
        }
    }
}

/// Launch plans: symbolic sizes become `Size` parameters after the buffers, constant ones
/// are baked in; grids are `ceil(work / per-CTA)` expressions.
#[test]
fn launch_plans() {
    let (g, k) = silu_mul(DType::BF16, s("T"), d(14336));
    let plan = compile_kernel(&g, k, &Target::SM_90A).unwrap();
    assert_eq!(plan.entry, "k0_pointwise");
    assert_eq!(plan.target, Target::SM_90A);
    assert_eq!(plan.params, vec![KernelParam::Buffer(0), KernelParam::Buffer(1), KernelParam::Buffer(2), KernelParam::Size(s("T").scale(14336))]);
    assert_eq!(plan.grid[0], GridDim { numerator: s("T").scale(14336), denominator: 8 * 256 });
    assert_eq!(plan.block, [256, 1, 1]);
    assert_eq!(plan.shared_bytes, 0);
    let (g, k) = silu_mul(DType::F32, d(3), d(5));
    let plan = compile_kernel(&g, k, &Target::SM_80).unwrap();
    assert_eq!(plan.params, vec![KernelParam::Buffer(0), KernelParam::Buffer(1), KernelParam::Buffer(2)]);
    let (g, k) = row_kernel(DType::BF16, s("R"), d(4096), "softmax");
    let plan = compile_kernel(&g, k, &Target::SM_90A).unwrap();
    assert_eq!(plan.entry, "k0_row_reduction");
    assert_eq!(plan.grid[0], GridDim { numerator: s("R"), denominator: 1 });
    assert_eq!(plan.block, [256, 1, 1]);
    assert_eq!(plan.params, vec![KernelParam::Buffer(0), KernelParam::Buffer(1), KernelParam::Size(s("R"))]);
    let (g, k) = row_kernel(DType::F32, s("R"), d(17), "softmax");
    let plan = compile_kernel(&g, k, &Target::SM_90A).unwrap();
    assert_eq!(plan.grid[0], GridDim { numerator: s("R"), denominator: 4 }, "a warp per row, four rows per CTA");
    assert_eq!(plan.block, [128, 1, 1]);
    let (g, k) = kv_append(DType::BF16);
    let plan = compile_kernel(&g, k, &Target::SM_90A).unwrap();
    assert_eq!(plan.params[..8], (0..8).map(KernelParam::Buffer).collect::<Vec<_>>()[..]);
    assert!(plan.params[8..].iter().all(|p| matches!(p, KernelParam::Size(_))));
    // The kv_append outputs alias the inputs: no pointer is noalias.
    assert!(!plan.ptx.contains("ld.global.nc"), "{}", plan.ptx);
}

/// What the generators refuse, with errors that name the kernel.
#[test]
fn unsupported_kernels_are_errors() {
    // A reduction over the first axis.
    let mut fb = FunctionBuilder::new(&Graph::new(), "bad");
    let x = fb.param("x", ty(DType::F32, &[d(4), d(8)]));
    let y = op_a(&mut fb, OpKind::ReduceSum, &[x], vec![("axis", Attr::Int(0))]);
    let (g, k) = single(Family::RowReduction, fb.finish(&[y]).unwrap());
    let e = compile_kernel(&g, k, &Target::SM_80).unwrap_err();
    assert!(matches!(e, CodegenError::Unsupported { .. }) && e.to_string().contains("k0") && e.to_string().contains("not the last"), "{e}");
    // A matmul in a pointwise kernel.
    let mut fb = FunctionBuilder::new(&Graph::new(), "bad");
    let a = fb.param("a", ty(DType::F32, &[d(4), d(8)]));
    let b = fb.param("b", ty(DType::F32, &[d(8), d(4)]));
    let y = op(&mut fb, OpKind::Matmul, &[a, b]);
    let (g, k) = single(Family::Pointwise, fb.finish(&[y]).unwrap());
    let e = compile_kernel(&g, k, &Target::SM_80).unwrap_err();
    assert!(e.to_string().contains("matmul") && e.to_string().contains("k0 (Pointwise)"), "{e}");
    // A softmax outside a row-reduction kernel.
    let mut fb = FunctionBuilder::new(&Graph::new(), "bad");
    let x = fb.param("x", ty(DType::F32, &[d(4), d(8)]));
    let y = op(&mut fb, OpKind::Softmax, &[x]);
    let (g, k) = single(Family::Pointwise, fb.finish(&[y]).unwrap());
    let e = compile_kernel(&g, k, &Target::SM_80).unwrap_err();
    assert!(e.to_string().contains("RowReduction"), "{e}");
    // A body that does not match its buffers.
    let (mut g, k) = silu_mul(DType::BF16, d(4), d(8));
    let b0 = g.kernels[k].inputs[0];
    g.buffers[b0].ty = ty(DType::F32, &[d(4), d(8)]);
    let e = compile_kernel(&g, k, &Target::SM_80).unwrap_err();
    assert!(matches!(e, CodegenError::BadKernel { .. }), "{e}");
    // A kernel that does not exist.
    let e = compile_kernel(&g, Kernel::from_u32(7), &Target::SM_80).unwrap_err();
    assert!(e.to_string().contains("k7"), "{e}");
}

/// Strided inputs: a transposed (non-contiguous) input buffer is read with its strides, and
/// an input slice with a 2-byte-aligned base is read element by element.
#[test]
fn strided_and_unaligned_inputs() {
    let (mut g, k) = silu_mul(DType::BF16, d(64), d(128));
    let b0 = g.kernels[k].inputs[0];
    g.buffers[b0].layout = Layout { strides: vec![d(1), d(64)], align: 256 };
    let b1 = g.kernels[k].inputs[1];
    g.buffers[b1].layout.align = 2;
    for t in [Target::SM_80, Target::SM_90A] {
        let plan = compile_kernel(&g, k, &t).unwrap();
        assemble(&plan);
        // The output is still written in 16-byte vectors.
        assert!(plan.ptx.contains("st.global.v4.b32"), "{}", plan.ptx);
    }
}

// ----- running kernels on the CPU -----------------------------------------------------------

/// Runs a kernel's LLVM IR on the host: the verified IR of [`compile_kernel`] (captured with
/// `sinter_codegen::emit::capture_ir`) is retargeted to x86-64 — address spaces dropped, the
/// special registers, shuffles, barriers and `ex2`/`div` approximations replaced by calls into
/// a C harness — compiled with LLVM 22's `llc` and the system C compiler, and launched with
/// one POSIX thread per GPU thread (a CTA at a time; `bar.sync` is a barrier of the CTA's
/// threads, `shfl.sync.bfly` an exchange through a per-warp slot array between two barriers
/// of the warp's 32 threads). A cluster kernel (`nvvm.cluster_dim`, the cluster schedule of
/// the row reductions) runs a cluster at a time: its CTAs' threads together, each CTA with
/// its own copy of the dynamic shared memory (the kernel addresses it from the opaque zero
/// of `dynamic_shared_base`, which the harness makes the CTA's offset), `mapa` an offset
/// between copies, `barrier.cluster` a barrier of all the cluster's threads, `cp.async` a copy at once. `ex2.approx` is modelled as the exact `2^x` rounded to f32 (the
/// device's is within 2 ulp of it).
///
/// This checks the generated arithmetic, indexing, vectorisation, bounds and grid-stride logic
/// against the interpreter without a GPU; it does not check the NVPTX back end or ptxas (the
/// GPU tests do).
mod sim {
    use std::path::{Path, PathBuf};
    use std::process::Command;

    use sinter_ir::{KernelParam, LaunchPlan};

    pub struct Tools {
        llc: PathBuf,
        cc: String,
    }

    /// `llc` of LLVM 22 and a C compiler, or `None` (the simulation tests skip).
    pub fn tools() -> Option<Tools> {
        let prefix = std::env::var("LLVM_SYS_221_PREFIX").unwrap_or_else(|_| "/usr/lib/llvm-22".into());
        let llc = Path::new(&prefix).join("bin/llc");
        let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
        let cc_ok = Command::new(&cc).arg("--version").output().map(|o| o.status.success()).unwrap_or(false);
        if !llc.is_file() || !cc_ok {
            eprintln!("skipped: no llc ({}) or C compiler ({cc}) to run kernels on the CPU", llc.display());
            return None;
        }
        Some(Tools { llc, cc })
    }

    /// The NVPTX kernel IR rewritten for the host.
    pub fn host_ir(ir: &str) -> String {
        let mut out = String::new();
        for line in ir.lines() {
            if line.starts_with("target datalayout") {
                continue;
            }
            if line.starts_with("target triple") {
                out.push_str("target triple = \"x86_64-unknown-linux-gnu\"\n");
                continue;
            }
            if line.starts_with("attributes #") {
                let n = line.split_whitespace().nth(1).unwrap_or("#0");
                out.push_str(&format!("attributes {n} = {{ nounwind }}\n"));
                continue;
            }
            if line.contains("asm sideeffect \".pragma") {
                // A ptxas directive (`.pragma "nounroll"`): nothing to run.
                continue;
            }
            if let Some(conv) = convert_line(line) {
                out.push_str(&conv);
                continue;
            }
            let mut l = line.replace("ptx_kernel ", "").replace(" addrspace(1)", "").replace(" addrspace(3)", "").replace(" addrspace(4)", "").replace(" addrspace(7)", "").replace(" immarg", "");
            for (from, to) in [
                ("@llvm.nvvm.read.ptx.sreg.cluster.ctarank", "@sim_cluster_ctarank"),
                ("@llvm.nvvm.mapa.shared.cluster", "@sim_mapa"),
                ("@llvm.nvvm.barrier.cluster.arrive.aligned", "@sim_cluster_arrive"),
                ("@llvm.nvvm.barrier.cluster.arrive.relaxed.aligned", "@sim_cluster_arrive_relaxed"),
                ("@llvm.nvvm.barrier.cluster.wait.aligned", "@sim_cluster_wait"),
                ("asm \"mov.u32 $0, 0;\", \"=r\"", "@sim_smem_off"),
                ("@llvm.nvvm.cp.async.cg.shared.global.16.s", "@sim_cp_async16"),
                ("@llvm.nvvm.cp.async.commit.group", "@sim_cp_async_commit"),
                ("@llvm.nvvm.cp.async.wait.group", "@sim_cp_async_wait"),
                ("@llvm.nvvm.read.ptx.sreg.tid.x", "@sim_tid_x"),
                ("@llvm.nvvm.read.ptx.sreg.ntid.x", "@sim_ntid_x"),
                ("@llvm.nvvm.read.ptx.sreg.ctaid.x", "@sim_ctaid_x"),
                ("@llvm.nvvm.read.ptx.sreg.nctaid.x", "@sim_nctaid_x"),
                ("@llvm.nvvm.shfl.sync.bfly.f32", "@sim_shfl_f32"),
                ("@llvm.nvvm.shfl.sync.bfly.i32", "@sim_shfl_i32"),
                ("@llvm.nvvm.barrier.cta.sync.aligned.all", "@sim_barrier"),
                ("@llvm.nvvm.ex2.approx.f32", "@sim_ex2"),
                ("@llvm.nvvm.ex2.approx.ftz.f32", "@sim_ex2"),
                ("@llvm.nvvm.div.approx.f", "@sim_div"),
                ("asm sideeffect \"mov.b64 $0, $1;\", \"=l,l\"", "@sim_id64"),
                ("asm sideeffect \"mov.b32 $0, $1;\", \"=r,r\"", "@sim_id32"),
                ("asm \"mov.b64 $0, $1;\", \"=l,l\"", "@sim_id64"),
                ("asm \"mov.b32 $0, $1;\", \"=r,r\"", "@sim_id32"),
            ] {
                l = l.replace(from, to);
            }
            out.push_str(&l);
            out.push('\n');
        }
        out.push_str("declare i64 @sim_id64(i64)\ndeclare i32 @sim_id32(i32)\n");
        if ir.contains("mov.u32 $0, 0;") {
            out.push_str("declare i32 @sim_smem_off()\n");
        }
        out.push_str("declare i16 @sim_f32_to_bf16(float)\ndeclare i16 @sim_f32_to_f16(float)\n");
        out.push_str("declare float @sim_bf16_to_f32(i16)\ndeclare float @sim_f16_to_f32(i16)\n");
        if ir.contains("bfloat") {
            // The host's `f32 → bf16` libcall (a `bf16x2` `fma`'s operands: x86 promotes it to
            // f32), round to nearest even, NaN quieted — absent from this C runtime's libgcc.
            out.push_str(
                "define bfloat @__truncsfbf2(float %f) {\n  %u = bitcast float %f to i32\n  %a = and i32 %u, 2147483647\n  %nan = icmp ugt i32 %a, 2139095040\n  %l = lshr i32 %u, 16\n  %lsb = and i32 %l, 1\n  %b = add i32 %u, 32767\n  %r = add i32 %b, %lsb\n  %rs = lshr i32 %r, 16\n  %q = or i32 %l, 64\n  %s = select i1 %nan, i32 %q, i32 %rs\n  %h = trunc i32 %s to i16\n  %v = bitcast i16 %h to bfloat\n  ret bfloat %v\n}\n",
            );
        }
        out
    }

    /// `%r = fptrunc float %x to bfloat` (and `half`, and the `fpext`s back) as calls into
    /// the harness with integer arguments, so that no compiler-runtime ABI for `bfloat`/`half`
    /// is involved.
    fn convert_line(line: &str) -> Option<String> {
        let t = line.trim_start();
        let indent = &line[..line.len() - t.len()];
        let (name, rest) = t.split_once(" = ")?;
        let words: Vec<&str> = rest.split_whitespace().collect();
        match words.as_slice() {
            ["fptrunc", "float", x, "to", ty @ ("bfloat" | "half")] => {
                let f = if *ty == "bfloat" { "sim_f32_to_bf16" } else { "sim_f32_to_f16" };
                Some(format!("{indent}{name}.bits = call i16 @{f}(float {x})\n{indent}{name} = bitcast i16 {name}.bits to {ty}\n"))
            }
            ["fptrunc", "<2", "x", "float>", x, "to", "<2", "x", "bfloat>"] => {
                let mut o = String::new();
                for i in 0..2 {
                    o.push_str(&format!("{indent}{name}.e{i} = extractelement <2 x float> {x}, i32 {i}\n"));
                    o.push_str(&format!("{indent}{name}.b{i} = call i16 @sim_f32_to_bf16(float {name}.e{i})\n"));
                }
                o.push_str(&format!("{indent}{name}.v0 = insertelement <2 x i16> poison, i16 {name}.b0, i32 0\n"));
                o.push_str(&format!("{indent}{name}.v1 = insertelement <2 x i16> {name}.v0, i16 {name}.b1, i32 1\n"));
                o.push_str(&format!("{indent}{name} = bitcast <2 x i16> {name}.v1 to <2 x bfloat>\n"));
                Some(o)
            }
            ["fpext", ty @ ("bfloat" | "half"), x, "to", "float"] => {
                let f = if *ty == "bfloat" { "sim_bf16_to_f32" } else { "sim_f16_to_f32" };
                Some(format!("{indent}{name}.bits = bitcast {ty} {x} to i16\n{indent}{name} = call float @{f}(i16 {name}.bits)\n"))
            }
            _ => None,
        }
    }

    const HARNESS: &str = r#"
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
static __thread unsigned t_tid, t_cta, t_rank;
static unsigned g_ntid, g_nctaid, g_cta, g_cluster;
unsigned sim_tid_x(void) { return t_tid; }
unsigned sim_ntid_x(void) { return g_ntid; }
unsigned sim_ctaid_x(void) { return t_cta; }
unsigned sim_nctaid_x(void) { return g_nctaid; }
/* A cluster's CTAs run together, each with its own barrier, warp slots and copy of the
   dynamic shared memory `dsmem` (the kernel addresses it through `sim_smem_off`). */
#define MAX_CLUSTER 16
#define SMEM_STRIDE (256 << 10)
unsigned char dsmem[MAX_CLUSTER * SMEM_STRIDE] __attribute__((aligned(16)));
static pthread_barrier_t cta_bar[MAX_CLUSTER], warp_bar[MAX_CLUSTER][32], cluster_bar;
static uint32_t slots[MAX_CLUSTER][32][32];
static uint32_t shfl(uint32_t v, int lanemask) {
    unsigned w = t_tid / 32, l = t_tid % 32;
    slots[t_rank][w][l] = v;
    pthread_barrier_wait(&warp_bar[t_rank][w]);
    uint32_t r = slots[t_rank][w][(l ^ lanemask) & 31];
    pthread_barrier_wait(&warp_bar[t_rank][w]);
    return r;
}
float sim_shfl_f32(int m, float v, int lm, int c) { uint32_t u; memcpy(&u, &v, 4); u = shfl(u, lm); memcpy(&v, &u, 4); return v; }
int sim_shfl_i32(int m, int v, int lm, int c) { return (int)shfl((uint32_t)v, lm); }
void sim_barrier(int id) { pthread_barrier_wait(&cta_bar[t_rank]); }
unsigned sim_cluster_ctarank(void) { return t_rank; }
int sim_smem_off(void) { return (int)(t_rank * SMEM_STRIDE); }
void *sim_mapa(void *p, int r) { return (unsigned char *)p + ((long)r - (long)t_rank) * SMEM_STRIDE; }
/* arrive + wait: the arrive is the whole barrier (a stronger order than the hardware's). */
void sim_cluster_arrive(void) { pthread_barrier_wait(&cluster_bar); }
void sim_cluster_arrive_relaxed(void) { pthread_barrier_wait(&cluster_bar); }
void sim_cluster_wait(void) {}
/* cp.async: the copy at once (the harness has no asynchrony to model), zero-filled past
   the source bytes; commit and wait have nothing left to do. */
void sim_cp_async16(void *d, const void *s, int n) { memcpy(d, s, (size_t)n); memset((unsigned char *)d + n, 0, (size_t)(16 - n)); }
void sim_cp_async_commit(void) {}
void sim_cp_async_wait(int n) { (void)n; }
float sim_ex2(float x) { return (float)exp2((double)x); }
float sim_div(float a, float b) { return a / b; }
int64_t sim_id64(int64_t x) { return x; }
int32_t sim_id32(int32_t x) { return x; }
/* bf16 / f16 conversions, round to nearest even (libgcc 12 lacks the bf16 ones). */
uint16_t sim_f32_to_bf16(float f) {
    uint32_t u; memcpy(&u, &f, 4);
    if ((u & 0x7fffffff) > 0x7f800000) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fff + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}
uint16_t sim_f32_to_f16(float f) {
    uint32_t u; memcpy(&u, &f, 4);
    uint32_t sign = (u >> 16) & 0x8000, a = u & 0x7fffffff;
    if (a > 0x7f800000) return (uint16_t)(sign | 0x7e00);
    if (a >= 0x477ff000) return (uint16_t)(sign | 0x7c00);
    if (a < 0x38800000) { /* subnormal or zero */
        float af; memcpy(&af, &a, 4);
        float q = af * 16777216.0f; /* 2^24: units of the smallest subnormal */
        uint32_t n = (uint32_t)nearbyintf(q);
        return (uint16_t)(sign | n);
    }
    uint32_t e = ((a >> 23) - 112) << 10, m = a & 0x7fffff;
    uint32_t h = e | (m >> 13);
    uint32_t rest = m & 0x1fff;
    if (rest > 0x1000 || (rest == 0x1000 && (h & 1))) h++;
    return (uint16_t)(sign | h);
}
float sim_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ff, u;
    if (e == 0) { float f = m / 16777216.0f; memcpy(&u, &f, 4); u |= sign; }
    else if (e == 31) u = sign | 0x7f800000 | (m << 13);
    else u = sign | ((e + 112) << 23) | (m << 13);
    float f; memcpy(&f, &u, 4); return f;
}
float sim_bf16_to_f32(uint16_t h) { uint32_t u = (uint32_t)h << 16; float f; memcpy(&f, &u, 4); return f; }
KERNEL_DECL;
static void *bufs[64];
static long long sizes[64];
static void *thread_main(void *p) {
    unsigned i = (unsigned)(uintptr_t)p;
    t_tid = i % g_ntid;
    t_rank = i / g_ntid;
    t_cta = g_cta;
    KERNEL_CALL;
    return 0;
}
int main(int argc, char **argv) {
    g_nctaid = (unsigned)atoi(argv[1]);
    g_ntid = (unsigned)atoi(argv[2]);
    g_cluster = (unsigned)atoi(argv[3]);
    int nb = atoi(argv[4]), ns = atoi(argv[5]), a = 6;
    if (g_cluster < 1 || g_cluster > MAX_CLUSTER) return 4;
    for (int i = 0; i < nb; i++) {
        FILE *f = fopen(argv[a], "rb"); long n;
        fseek(f, 0, SEEK_END); n = ftell(f); fseek(f, 0, SEEK_SET);
        bufs[i] = malloc(n > 0 ? n : 1);
        if (n > 0 && fread(bufs[i], 1, n, f) != (size_t)n) return 2;
        fclose(f); a++;
    }
    for (int i = 0; i < ns; i++) sizes[i] = atoll(argv[a++]);
    unsigned nt = g_ntid * g_cluster;
    pthread_barrier_init(&cluster_bar, 0, nt);
    for (unsigned r = 0; r < g_cluster; r++) {
        pthread_barrier_init(&cta_bar[r], 0, g_ntid);
        for (unsigned w = 0; w < (g_ntid + 31) / 32; w++) pthread_barrier_init(&warp_bar[r][w], 0, 32);
    }
    pthread_t *th = malloc(sizeof(pthread_t) * nt);
    pthread_attr_t attr; pthread_attr_init(&attr); pthread_attr_setstacksize(&attr, 1 << 18);
    for (g_cta = 0; g_cta < g_nctaid; g_cta++) {
        for (unsigned t = 0; t < nt; t++) if (pthread_create(&th[t], &attr, thread_main, (void *)(uintptr_t)t)) return 3;
        for (unsigned t = 0; t < nt; t++) pthread_join(th[t], 0);
    }
    a = 6;
    for (int i = 0; i < nb; i++) {
        FILE *f = fopen(argv[a], "rb+"); long n;
        fseek(f, 0, SEEK_END); n = ftell(f); fseek(f, 0, SEEK_SET);
        if (n > 0) fwrite(bufs[i], 1, n, f);
        fclose(f); a++;
    }
    return 0;
}
"#;

    /// Runs `plan` (whose verified IR is `ir`) with `ctas` CTAs on `buffers` (inputs then
    /// outputs, as bytes; updated in place) and the plan's sizes evaluated as `sizes`.
    pub fn run(tools: &Tools, tag: &str, plan: &LaunchPlan, ir: &str, buffers: &mut [Vec<u8>], sizes: &[i64], ctas: u32) {
        let safe: String = tag.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }).collect();
        let dir = std::env::temp_dir().join(format!("sinter-sim-{}-{safe}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("k.ll"), host_ir(ir)).unwrap();
        let st = Command::new(&tools.llc).args(["-O2", "-filetype=obj", "-relocation-model=pic", "-o"]).arg(dir.join("k.o")).arg(dir.join("k.ll")).output().unwrap();
        assert!(st.status.success(), "llc: {}", String::from_utf8_lossy(&st.stderr));
        let args: Vec<&str> = plan.params.iter().map(|p| if matches!(p, KernelParam::Buffer(_)) { "void *" } else { "long long" }).collect();
        let mut call = Vec::new();
        let (mut b, mut s) = (0, 0);
        for p in &plan.params {
            if matches!(p, KernelParam::Buffer(_)) {
                call.push(format!("bufs[{b}]"));
                b += 1;
            } else {
                call.push(format!("sizes[{s}]"));
                s += 1;
            }
        }
        let c = HARNESS
            .replace("KERNEL_DECL", &format!("extern void {}({})", plan.entry, args.join(", ")))
            .replace("KERNEL_CALL", &format!("{}({})", plan.entry, call.join(", ")));
        std::fs::write(dir.join("h.c"), c).unwrap();
        let st = Command::new(&tools.cc).args(["-O1", "-o"]).arg(dir.join("sim")).arg(dir.join("h.c")).arg(dir.join("k.o")).args(["-lpthread", "-lm"]).output().unwrap();
        assert!(st.status.success(), "cc: {}", String::from_utf8_lossy(&st.stderr));
        let mut cmd = Command::new(dir.join("sim"));
        // A cluster kernel's grid is (rows, cluster, 1): its clusters run one at a time.
        let cluster = if ir.contains("nvvm.cluster_dim") { plan.grid[1].numerator.as_const().unwrap_or(1) } else { 1 };
        cmd.arg(ctas.to_string()).arg(plan.block[0].to_string()).arg(cluster.to_string()).arg(buffers.len().to_string()).arg(sizes.len().to_string());
        for (i, buf) in buffers.iter().enumerate() {
            let f = dir.join(format!("b{i}"));
            std::fs::write(&f, buf).unwrap();
            cmd.arg(f);
        }
        for v in sizes {
            cmd.arg(v.to_string());
        }
        let st = cmd.output().unwrap();
        assert!(st.status.success(), "{tag}: the simulated kernel failed: {:?} {}", st.status, String::from_utf8_lossy(&st.stderr));
        for (i, buf) in buffers.iter_mut().enumerate() {
            *buf = std::fs::read(dir.join(format!("b{i}"))).unwrap();
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}

use sinter_ir::interp::{run_kernel_graph, Tensor};
use sinter_ir::Bindings;

/// A deterministic pseudo-random stream (SplitMix64).
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in `[lo, hi)`.
    fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * ((self.next() >> 11) as f64 / (1u64 << 53) as f64)
    }
}

fn random(rng: &mut Rng, dt: DType, shape: &[usize], lo: f64, hi: f64) -> Tensor {
    Tensor::from_fn(dt, shape, |_| {
        let v = rng.uniform(lo, hi);
        if dt.is_float() {
            v
        } else {
            v.floor()
        }
    })
}

fn with(t: Tensor, f: impl Fn(usize, f64) -> f64) -> Tensor {
    let (dt, shape) = (t.dtype(), t.shape().to_vec());
    let data: Vec<f64> = t.data().iter().enumerate().map(|(i, &v)| f(i, v)).collect();
    Tensor::new(dt, &shape, data).unwrap()
}

fn encode(dt: DType, data: &[f64]) -> Vec<u8> {
    if dt.is_quantized() {
        return sinter_ir::dtype::qcodes_to_bytes(dt, data).expect("whole blocks");
    }
    let mut out = Vec::with_capacity(data.len() * dt.size_bytes());
    for &v in data {
        match dt {
            DType::BF16 => out.extend(half::bf16::from_f64(v).to_bits().to_le_bytes()),
            DType::F16 => out.extend(half::f16::from_f64(v).to_bits().to_le_bytes()),
            DType::F32 => out.extend((v as f32).to_le_bytes()),
            DType::I32 => out.extend((v as i32).to_le_bytes()),
            DType::I64 => out.extend((v as i64).to_le_bytes()),
            DType::Bool => out.push(u8::from(v != 0.0)),
            DType::F8E4M3 => out.push(sinter_ir::dtype::f8e4m3_from_f64(v)),
            DType::Q8_0 | DType::Q4_1 => unreachable!("handled above"),
        }
    }
    out
}

fn decode(dt: DType, bytes: &[u8], n: usize) -> Vec<f64> {
    let w = dt.size_bytes();
    (0..n)
        .map(|i| {
            let b = &bytes[i * w..(i + 1) * w];
            match dt {
                DType::BF16 => half::bf16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f64(),
                DType::F16 => half::f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f64(),
                DType::F32 => f32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f64,
                DType::I32 => i32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f64,
                DType::I64 => i64::from_le_bytes(b.try_into().unwrap()) as f64,
                DType::Bool => f64::from(b[0]),
                DType::F8E4M3 => sinter_ir::dtype::f8e4m3_to_f64(b[0]),
                DType::Q8_0 | DType::Q4_1 => panic!("a block-quantized output"),
            }
        })
        .collect()
}

/// Bytes after each output buffer that must stay untouched.
const GUARD: usize = 64;

/// Runs kernel `k` of `g` on the CPU (see [`sim`]) with `inputs` and compares every output with
/// the interpreter under DESIGN.md's tolerance (f32: rtol 1e-5, atol 1e-6·max|ref|; bf16:
/// rtol 1.6e-2, atol 1e-2·max|ref|; NaN exactly where the reference has NaN; integers exact),
/// checking that nothing is written past an output. Returns the outputs (or `None`, skipped).
fn check_on_cpu(tag: &str, gk: &(KernelGraph, Kernel), bindings: &Bindings, inputs: &[Tensor], max_ctas: u32) -> Option<Vec<Vec<f64>>> {
    check_built_on_cpu(tag, gk, bindings, inputs, max_ctas, || compile_kernel(&gk.0, gk.1, &Target::SM_90A))
}

/// [`check_on_cpu`] with the plan `build` makes (for sm_90a).
fn check_built_on_cpu(tag: &str, gk: &(KernelGraph, Kernel), bindings: &Bindings, inputs: &[Tensor], max_ctas: u32, build: impl FnOnce() -> Result<LaunchPlan, sinter_codegen::CodegenError>) -> Option<Vec<Vec<f64>>> {
    let tools = sim::tools()?;
    let (g, k) = gk;
    let (plan, irs) = sinter_codegen::emit::capture_ir(build);
    let plan = plan.unwrap_or_else(|e| panic!("{tag}: {e}"));
    let ir = irs.last().unwrap_or_else(|| panic!("{tag}: no IR captured"));
    let refs: Vec<&Tensor> = inputs.iter().collect();
    let kd = &g.kernels[*k];
    let mut buffers: Vec<Vec<u8>> = inputs.iter().map(|t| encode(t.dtype(), t.data())).collect();
    let mut out_meta = Vec::new();
    for (j, &b) in kd.outputs.iter().enumerate() {
        let bd = &g.buffers[b];
        let n = bd.ty.shape.iter().map(|d| d.eval(bindings).unwrap() as usize).product::<usize>();
        // KvAppend updates its pages in place: output j starts as the page input it aliases.
        let alias = (kd.family == Family::KvAppend).then(|| page_param(&kd.body, j)).flatten();
        let mut bytes = match alias {
            Some(i) => buffers[i].clone(),
            None => vec![0xFF; n * bd.ty.dtype.size_bytes()],
        };
        bytes.extend(std::iter::repeat_n(0xA5, GUARD));
        out_meta.push((bd.ty.dtype, n));
        buffers.push(bytes);
    }
    let sizes: Vec<i64> = plan.params.iter().filter_map(|p| if let KernelParam::Size(d) = p { Some(d.eval(bindings).unwrap()) } else { None }).collect();
    let ctas = plan.grid[0].eval(bindings).unwrap().min(max_ctas);
    sim::run(&tools, tag, &plan, ir, &mut buffers, &sizes, ctas);
    // The interpreter rejects out-of-range gather indices: those tags end in "oor" and the
    // caller checks the outputs itself.
    let reference = if tag.ends_with("oor") {
        None
    } else {
        Some(run_kernel_graph(g, &refs, bindings).unwrap_or_else(|e| panic!("{tag}: the interpreter: {e}")))
    };
    let mut outs = Vec::new();
    for (j, (dt, n)) in out_meta.iter().enumerate() {
        let bytes = &buffers[inputs.len() + j];
        assert!(bytes[n * dt.size_bytes()..].iter().all(|&b| b == 0xA5), "{tag}: output {j} written past its end");
        let got = decode(*dt, bytes, *n);
        if let Some(r) = &reference {
            compare(&format!("{tag} output {j}"), *dt, &got, r[j].data());
        }
        outs.push(got);
    }
    Some(outs)
}

/// The parameter position of page operand `j` of the body's `kv_append`.
fn page_param(body: &Function, j: usize) -> Option<usize> {
    let nd = body.nodes.values().find(|nd| nd.op.kind == OpKind::KvAppend)?;
    match body.values[*nd.inputs.get(j)?].def {
        sinter_ir::ValueDef::Param(i) => Some(i),
        _ => None,
    }
}

fn compare(tag: &str, dt: DType, got: &[f64], want: &[f64]) {
    assert_eq!(got.len(), want.len(), "{tag}");
    let max = want.iter().filter(|v| v.is_finite()).fold(0.0f64, |m, v| m.max(v.abs()));
    let (rtol, atol) = match dt {
        DType::BF16 => (1.6e-2, 1e-2 * max),
        DType::F16 => (2e-3, 1e-3 * max),
        DType::F32 => (1e-5, 1e-6 * max),
        _ => (0.0, 0.0),
    };
    let mut bad = Vec::new();
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let ok = if w.is_nan() || g.is_nan() {
            w.is_nan() && g.is_nan()
        } else if w.is_infinite() || g.is_infinite() {
            g == w
        } else {
            (g - w).abs() <= atol + rtol * w.abs()
        };
        if !ok {
            bad.push(format!("[{i}] got {g}, want {w}"));
        }
    }
    assert!(bad.is_empty(), "{tag}: {} of {} elements differ (max|ref| {max}):\n{}", bad.len(), got.len(), bad.iter().take(12).cloned().collect::<Vec<_>>().join("\n"));
}

fn bind(pairs: &[(&str, i64)]) -> Bindings {
    pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
}

/// The merge of partial attention states on the PTX simulator: finite states, one empty
/// (lse −inf, its o NaN and never read), both empty (0 and −inf), NaN and +inf lse; bf16
/// vectorised and f32 with a symbolic row count.
#[test]
fn cpu_attention_merge_matches_the_interpreter() {
    let mut rng = Rng(11);
    let specials = |t: Tensor, at: &[(usize, f64)]| with(t, |i, v| at.iter().find(|p| p.0 == i).map_or(v, |p| p.1));
    let gk = merge_at(DType::BF16, &[d(4), d(8), d(1)], 128);
    let la = specials(random(&mut rng, DType::F32, &[4, 8, 1], -3.0, 3.0), &[(1, f64::NEG_INFINITY), (2, f64::NEG_INFINITY), (5, f64::NAN), (6, f64::INFINITY)]);
    let lb = specials(random(&mut rng, DType::F32, &[4, 8, 1], -3.0, 3.0), &[(2, f64::NEG_INFINITY), (3, f64::NEG_INFINITY)]);
    let oa = specials(random(&mut rng, DType::BF16, &[4, 8, 1, 128], -2.0, 2.0), &[(128 + 3, f64::NAN)]);
    let ob = specials(random(&mut rng, DType::BF16, &[4, 8, 1, 128], -2.0, 2.0), &[(3 * 128 + 5, f64::NAN)]);
    check_on_cpu("merge bf16", &gk, &Bindings::new(), &[oa, la, ob, lb], 2);
    let gk = merge_at(DType::F32, &[s("R"), d(5)], 40);
    let ins = [random(&mut rng, DType::F32, &[3, 5, 40], -2.0, 2.0), random(&mut rng, DType::F32, &[3, 5], -30.0, 30.0), random(&mut rng, DType::F32, &[3, 5, 40], -2.0, 2.0), random(&mut rng, DType::F32, &[3, 5], -30.0, 30.0)];
    check_on_cpu("merge f32", &gk, &bind(&[("R", 3)]), &ins, 1);
}

#[test]
fn cpu_pointwise_matches_the_interpreter() {
    let mut rng = Rng(1);
    // Vectorised, several CTAs' worth of groups on 3 CTAs (grid-stride).
    let gk = silu_mul(DType::BF16, s("T"), d(14336));
    let ins = [random(&mut rng, DType::BF16, &[3, 14336], -8.0, 8.0), random(&mut rng, DType::BF16, &[3, 14336], -2.0, 2.0)];
    check_on_cpu("silu_mul bf16", &gk, &bind(&[("T", 3)]), &ins, 3);
    // Scalar tail, with special values.
    let gk = silu_mul(DType::F32, s("T"), d(17));
    let a = with(random(&mut rng, DType::F32, &[5, 17], -100.0, 100.0), |i, v| match i {
        0 => f64::NEG_INFINITY,
        1 => f64::INFINITY,
        2 => f64::NAN,
        3 => 0.0,
        _ => v,
    });
    let ins = [a, random(&mut rng, DType::F32, &[5, 17], -2.0, 2.0)];
    check_on_cpu("silu_mul f32 tail", &gk, &bind(&[("T", 5)]), &ins, 1);
    // 32-bit indices.
    let gk = silu_mul(DType::BF16, d(3), d(5));
    let ins = [random(&mut rng, DType::BF16, &[3, 5], -4.0, 4.0), random(&mut rng, DType::BF16, &[3, 5], -4.0, 4.0)];
    check_on_cpu("silu_mul i32 index", &gk, &Bindings::new(), &ins, 1);
    // The zoo of element-wise ops, both dtypes.
    for dt in [DType::F32, DType::BF16] {
        let gk = elementwise_zoo(dt);
        let t = 6;
        let ins = [
            random(&mut rng, dt, &[t, 17], -3.0, 3.0),
            random(&mut rng, dt, &[17], 0.5, 2.0),
            random(&mut rng, DType::Bool, &[t, 1], 0.0, 2.0),
            with(random(&mut rng, DType::I32, &[t, 17], -50.0, 50.0), |_, v| if v == 0.0 { 7.0 } else { v }),
        ];
        check_on_cpu(&format!("zoo {dt}"), &gk, &bind(&[("T", t as i64)]), &ins, 2);
    }
    // RoPE, both forms, positions up to 10⁵.
    for (dt, form) in [(DType::BF16, "rotate_half"), (DType::F32, "interleaved"), (DType::F32, "rotate_half"), (DType::BF16, "interleaved")] {
        let gk = rope(dt, form);
        let ins = [random(&mut rng, dt, &[4, 9, 64], -2.0, 2.0), random(&mut rng, DType::I32, &[4, 1], 0.0, 100_000.0)];
        check_on_cpu(&format!("rope {form} {dt}"), &gk, &bind(&[("T", 4)]), &ins, 2);
    }
    // Four heads a thread (32 heads), and none shared (5 heads: one a thread).
    for (dt, form, h, hd) in [(DType::BF16, "rotate_half", 32, 128), (DType::BF16, "interleaved", 32, 128), (DType::F32, "rotate_half", 5, 64)] {
        let gk = rope_at(dt, form, 3, h, hd);
        let ins = [random(&mut rng, dt, &[3, h as usize, hd as usize], -2.0, 2.0), random(&mut rng, DType::I32, &[3, 1], 0.0, 100_000.0)];
        check_on_cpu(&format!("rope {form} {dt} H={h}"), &gk, &Bindings::new(), &ins, 2);
    }
    let gk = swiglu(DType::BF16);
    let ins = [random(&mut rng, DType::BF16, &[2, 1536], -6.0, 6.0), random(&mut rng, DType::BF16, &[2, 1536], -2.0, 2.0)];
    check_on_cpu("swiglu", &gk, &bind(&[("T", 2)]), &ins, 1);
}

/// Rows of `[rows, n]` with the special rows of DESIGN.md: all −inf, one NaN, one +inf, all
/// zero, a very negative but finite row, then random ones.
fn special_rows(rng: &mut Rng, dt: DType, rows: usize, n: usize, what: &str) -> Tensor {
    let x = random(rng, dt, &[rows, n], -4.0, 4.0);
    let soft = what.contains("softmax");
    with(x, |i, v| {
        let (r, c) = (i / n, i % n);
        match r {
            0 if soft => f64::NEG_INFINITY,
            0 => 0.0,
            1 if c == n / 2 => f64::NAN,
            2 if c == n / 3 && soft => f64::INFINITY,
            3 if soft => -1e4 + v,
            3 => 0.0,
            _ => v,
        }
    })
}

#[test]
fn cpu_views_and_mixed_dtypes_match_the_interpreter() {
    let mut rng = Rng(5);
    let b = bind(&[("T", 3)]);
    check_on_cpu("views", &views_pointwise(), &b, &[random(&mut rng, DType::BF16, &[3, 576], -4.0, 4.0), random(&mut rng, DType::BF16, &[64], -1.0, 1.0)], 2);
    check_on_cpu("flat mixed", &flat_mixed(), &b, &[random(&mut rng, DType::BF16, &[3, 4096], -4.0, 4.0), random(&mut rng, DType::F32, &[3, 4096], -1.0, 1.0)], 2);
    check_on_cpu("silu_mul f16", &silu_mul(DType::F16, s("T"), d(100)), &b, &[random(&mut rng, DType::F16, &[3, 100], -8.0, 8.0), random(&mut rng, DType::F16, &[3, 100], -2.0, 2.0)], 2);
    for aligned in [false, true] {
        let (na, nb) = if aligned { (16, 48) } else { (20, 44) };
        let ins = [random(&mut rng, DType::BF16, &[3, na], -4.0, 4.0), random(&mut rng, DType::BF16, &[3, nb], -4.0, 4.0), random(&mut rng, DType::BF16, &[3, 100], -4.0, 4.0)];
        check_on_cpu(&format!("concat last {aligned}"), &concat_last(aligned), &b, &ins, 2);
    }
    let ins = [random(&mut rng, DType::F32, &[3, 1024], -4.0, 4.0), random(&mut rng, DType::F32, &[3], -1.0, 1.0)];
    check_on_cpu("row epilogues", &row_epilogues(DType::F32), &bind(&[("R", 3)]), &ins, 2);
    let ins = [special_rows(&mut rng, DType::F16, 5, 1000, "softmax")];
    check_on_cpu("softmax f16", &row_kernel(DType::F16, s("R"), d(1000), "softmax"), &bind(&[("R", 5)]), &ins, 2);
    let ins = [random(&mut rng, DType::BF16, &[1000, 576], -1.0, 1.0), random(&mut rng, DType::I64, &[3], 0.0, 1000.0)];
    check_on_cpu("gather scaled", &embedding_scaled(), &b, &ins, 2);
}

#[test]
fn cpu_row_reductions_match_the_interpreter() {
    let mut rng = Rng(2);
    for what in ["softmax", "log_softmax", "rms_norm", "layer_norm", "reduce_sum", "reduce_mean", "reduce_max", "reduce_min"] {
        for dt in [DType::F32, DType::BF16] {
            let all: &[(Dim, usize)] = &[(d(1), 1), (d(17), 17), (d(1000), 1000), (d(3420), 3420), (d(4096), 4096), (s("N"), 777), (d(40000), 40000)];
            let ns = if what.starts_with("reduce") { &all[1..6] } else { all };
            for (nd, n) in ns {
                let rows = 6;
                let gk = row_kernel(dt, s("R"), nd.clone(), what);
                let mut ins = vec![special_rows(&mut rng, dt, rows, *n, what)];
                if matches!(what, "rms_norm" | "layer_norm") {
                    ins.push(random(&mut rng, dt, &[*n], 0.5, 1.5));
                }
                if what == "layer_norm" {
                    ins.push(random(&mut rng, dt, &[*n], -0.5, 0.5));
                }
                let b = bind(&[("R", rows as i64), ("N", *n as i64)]);
                check_on_cpu(&format!("{what} {dt} N={n}"), &gk, &b, &ins, 2);
            }
        }
    }
}

/// The thread-block cluster helpers of `KernelBuilder`: the cluster shape becomes
/// `.explicitcluster` / `.reqnctapercluster`, the rank `%cluster_ctarank`, a remote address
/// `mapa.shared::cluster`, the barriers `barrier.cluster.arrive`(`.relaxed`)/`wait`, the
/// dynamic shared memory an `extern .shared` array; ptxas assembles it for sm_90a, and sm_80
/// refuses a cluster shape.
#[test]
fn cluster_helpers_emit_what_ptx_says() {
    use sinter_codegen::emit::{KernelBuilder, ParamKind};
    let cx = inkwell::context::Context::create();
    let mut kb = KernelBuilder::new(&cx, "clusters", &[ParamKind::output()], Target::SM_90A).unwrap();
    kb.set_max_threads(64);
    kb.set_cluster_dims([1, 4, 1]).unwrap();
    let out = kb.param_ptr(0).unwrap();
    let base = kb.dynamic_shared_base().unwrap();
    let rank = kb.sreg("cluster.ctarank").unwrap();
    let f32t = cx.f32_type();
    let v = kb.b.build_unsigned_int_to_float(rank, f32t, "v").unwrap();
    kb.store(base, v.into(), 4).unwrap();
    kb.cluster_barrier().unwrap();
    let next = kb.b.build_xor(rank, kb.i32c(1), "next").unwrap();
    let remote = kb.mapa_shared(base, next).unwrap();
    let w = kb.load(f32t.into(), remote, 4).unwrap();
    let i = kb.b.build_int_z_extend(rank, cx.i64_type(), "i").unwrap();
    let p = kb.gep(f32t.into(), out, i).unwrap();
    kb.store(p, w, 4).unwrap();
    kb.cluster_barrier_relaxed().unwrap();
    kb.ret().unwrap();
    let ptx = kb.finish().unwrap();
    for s in [".explicitcluster", ".reqnctapercluster 1, 4, 1", "%cluster_ctarank", "mapa.shared::cluster", "ld.shared::cluster", "barrier.cluster.arrive.aligned", "barrier.cluster.arrive.relaxed.aligned", "barrier.cluster.wait.aligned", ".extern .shared .align 16 .b8 dsmem[]"] {
        assert!(ptx.contains(s), "no `{s}`:\n{ptx}");
    }
    if let Some(path) = ptxas::find_ptxas_for_tests().unwrap_or_else(|e| panic!("{e}")) {
        let r = ptxas::assemble_with(&path, &ptx, &Target::SM_90A).unwrap_or_else(|e| panic!("{e}\n{ptx}"));
        assert!(!r.spills() && r.warnings.is_empty(), "{r}");
    }
    let kb80 = KernelBuilder::new(&cx, "clusters80", &[ParamKind::output()], Target::SM_80).unwrap();
    assert!(kb80.set_cluster_dims([2, 1, 1]).is_err());
}

/// The cluster schedule of long rows (sm_90a): each row split over a thread-block cluster,
/// its slices staged in shared memory, the statistics exchanged through distributed shared
/// memory. Rows of 32768 (two CTAs, exact slices), 33000 (three, a short last slice), 262147
/// (eight CTAs, an odd length: scalar loads; 512 threads where the output pass reads a
/// weight, 256 threads × 4 vectors an iteration where it does not or, over whole slices, for
/// a LayerNorm); the special rows of
/// DESIGN.md; more rows than clusters (each cluster loops over rows, alternating its exchange
/// slots).
#[test]
fn cpu_cluster_rows_match_the_interpreter() {
    let mut rng = Rng(7);
    for n in [32768usize, 33000, 262144, 262147] {
        for what in ["softmax", "log_softmax", "rms_norm", "layer_norm"] {
            // (CTAs per row, threads per CTA)
            let expect = match (what, n) {
                (_, 32768) => (2, 256),
                (_, 33000) => (3, 256),
                ("layer_norm", 262144) => (8, 256),
                ("rms_norm" | "layer_norm", _) => (8, 512),
                _ => (8, 256),
            };
            let dt = DType::BF16;
            let rows = if n > 100_000 { 2 } else { 5 };
            let gk = row_kernel(dt, s("R"), d(n as i64), what);
            let plan = compile_kernel(&gk.0, gk.1, &Target::SM_90A).unwrap();
            assert_eq!((plan.grid[1].numerator.as_const().unwrap_or(0), plan.block[0]), expect, "{what} {n}: (CTAs per row, threads)");
            assert!(plan.ptx.contains(&format!(".reqnctapercluster 1, {}, 1", expect.0)) && plan.ptx.contains("mapa.shared::cluster"), "{what} {n}");
            // The slice is prefetched with 16-byte cp.async where rows allow 16-byte vectors
            // (an odd N has 2-byte chunks: the first pass loads and stages them).
            assert_eq!(plan.ptx.contains("cp.async.cg.shared.global"), n % 8 == 0, "{what} {n}: the prefetch");
            let plan80 = compile_kernel(&gk.0, gk.1, &Target::SM_80).unwrap();
            assert!(plan80.grid[1].numerator.is_one() && !plan80.ptx.contains("cluster"), "{what} {n}: sm_80 keeps the multi-pass schedule");
            let mut ins = vec![special_rows(&mut rng, dt, rows, n, what)];
            if matches!(what, "rms_norm" | "layer_norm") {
                ins.push(random(&mut rng, dt, &[n], 0.5, 1.5));
            }
            if what == "layer_norm" {
                ins.push(random(&mut rng, dt, &[n], -0.5, 0.5));
            }
            check_on_cpu(&format!("cluster {what} {dt} N={n}"), &gk, &bind(&[("R", rows as i64)]), &ins, 2);
        }
    }
    // A decomposed softmax: three levels, a broadcast mask read from global memory in every
    // pass, two staged inputs, three outputs.
    let gk = decomposed_softmax_sum(DType::BF16, 40000);
    let plan = compile_kernel(&gk.0, gk.1, &Target::SM_90A).unwrap();
    // Two staged bf16 inputs: 4 bytes a column, 160 kB a row, five slices of 32 kB.
    assert_eq!(plan.grid[1].numerator.as_const(), Some(5), "decomposed softmax: not the cluster schedule");
    let mask = with(random(&mut rng, DType::BF16, &[1, 40000], -1.0, 1.0), |i, v| if i % 7 == 0 { f64::NEG_INFINITY } else { v });
    let ins = [random(&mut rng, DType::BF16, &[4, 40000], -10.0, 10.0), random(&mut rng, DType::BF16, &[4, 40000], -10.0, 10.0), mask];
    check_on_cpu("cluster softmax decomposed", &gk, &bind(&[("R", 4)]), &ins, 2);
    // f32 LayerNorm of rows with a large mean and a small spread (the corrected two-pass).
    let gk = row_kernel(DType::F32, s("R"), d(40000), "layer_norm");
    let x = with(random(&mut rng, DType::F32, &[3, 40000], -1.0, 1.0), |_, v| ((1000.0 + 0.01 * v) as f32) as f64);
    let ins = [x, random(&mut rng, DType::F32, &[40000], 0.5, 1.5), random(&mut rng, DType::F32, &[40000], -0.5, 0.5)];
    check_on_cpu("cluster layer_norm offset f32", &gk, &bind(&[("R", 3)]), &ins, 1);
    // Slices of very different means (a step and a ramp along the row): the variance is
    // mostly the spread between the CTAs' slice means, the δ² term of their Chan merge.
    let x = with(random(&mut rng, DType::F32, &[3, 40000], -1.0, 1.0), |i, v| {
        let (r, c) = (i / 40000, (i % 40000) as f64);
        let m = if r == 0 { if c < 20000.0 { -50.0 } else { 50.0 } } else { 1e3 + c * 0.05 * r as f64 };
        ((m + v) as f32) as f64
    });
    let ins = [x, random(&mut rng, DType::F32, &[40000], 0.5, 1.5), random(&mut rng, DType::F32, &[40000], -0.5, 0.5)];
    check_on_cpu("cluster layer_norm slice means apart f32", &gk, &bind(&[("R", 3)]), &ins, 1);
}

/// Every row schedule autotuning may pick computes what the interpreter does: the cluster
/// schedule's thread counts and unrolls (softmax and rms_norm, rows of 33000: three CTAs, a
/// short last slice), with the row-invariant inputs staged or not and its cluster sizes
/// (rms_norm; layer_norm of an odd 33001 and of 32768: whole slices), the persistent
/// clusters (` p`: two clusters over three rows, so one cluster's output pass refills its
/// stage with its next row), and the multi-pass CTA schedule's (f32 softmax, rows of 262144).
#[test]
fn cpu_row_schedule_variants_match_the_interpreter() {
    let mut rng = Rng(11);
    for (dt, n, what) in [(DType::BF16, 33000usize, "softmax"), (DType::BF16, 33000, "rms_norm"), (DType::BF16, 33001, "layer_norm"), (DType::BF16, 32768, "layer_norm"), (DType::F32, 262144, "softmax")] {
        let gk = row_kernel(dt, s("R"), d(n as i64), what);
        let target = Target::SM_90A;
        let variants = sinter_codegen::schedule_variants(&gk.0, gk.1, &target).unwrap();
        assert!(variants.len() >= 3, "{what} {n}: {:?}", variants.iter().map(|v| &v.name).collect::<Vec<_>>());
        assert_eq!(variants[0].plan, compile_kernel(&gk.0, gk.1, &target).unwrap(), "{what} {n}: the first variant is the default");
        let rows = if n > 100_000 { 2 } else { 3 };
        let mut ins = vec![special_rows(&mut rng, dt, rows, n, what)];
        if matches!(what, "rms_norm" | "layer_norm") {
            ins.push(random(&mut rng, dt, &[n], 0.5, 1.5));
        }
        if what == "layer_norm" {
            ins.push(random(&mut rng, dt, &[n], -0.5, 0.5));
            // An odd length: the staged weight and bias (` w`) are copied by loads and stores,
            // not cp.async.
            assert!(variants.iter().filter(|v| v.name.contains(" w")).count() >= 2, "{:?}", variants.iter().map(|v| &v.name).collect::<Vec<_>>());
        }
        // Persistent clusters wherever the slices are 16-byte chunks (not the odd 33001: its
        // staged chunks are single elements, which the output pass cannot refill by cp.async).
        // The sampled LayerNorm shift (` s`) where the slices are whole (32768, not 33001).
        let sampled = variants.iter().filter(|v| v.name.ends_with(" s")).count();
        assert_eq!(sampled > 0, what == "layer_norm" && n == 32768, "{what} {n}: {:?}", variants.iter().map(|v| &v.name).collect::<Vec<_>>());
        let persistent = variants.iter().filter(|v| v.name.contains(" p")).count();
        assert_eq!(persistent > 0, n % 8 == 0 && n < 100_000, "{what} {n}: {:?}", variants.iter().map(|v| &v.name).collect::<Vec<_>>());
        for v in &variants {
            let tag = format!("variant `{}` {what} {dt} N={n}", v.name);
            check_built_on_cpu(&tag, &gk, &bind(&[("R", rows as i64)]), &ins, 2, || sinter_codegen::compile_variant(&gk.0, gk.1, &target, &v.name));
        }
    }
}

#[test]
fn cpu_long_rows_and_fused_rows() {
    let mut rng = Rng(3);
    // A long row, multi-pass.
    for what in ["softmax", "layer_norm"] {
        let gk = row_kernel(DType::F32, s("R"), d(262144), what);
        let mut ins = vec![random(&mut rng, DType::F32, &[1, 262144], -5.0, 5.0)];
        if what == "layer_norm" {
            ins.push(random(&mut rng, DType::F32, &[262144], 0.5, 1.5));
            ins.push(random(&mut rng, DType::F32, &[262144], -0.5, 0.5));
        }
        check_on_cpu(&format!("{what} 262144"), &gk, &bind(&[("R", 1)]), &ins, 1);
    }
    // The online softmax of the multi-pass schedule: rows whose max grows along the row, with
    // a −inf prefix (a thread's or a warp's part all −inf), and a masked tail.
    for what in ["softmax", "log_softmax"] {
        let gk = row_kernel(DType::F32, s("R"), d(40000), what);
        let x = with(random(&mut rng, DType::F32, &[3, 40000], -5.0, 5.0), |i, v| {
            let (r, c) = (i / 40000, i % 40000);
            match r {
                0 if c < 30000 => f64::NEG_INFINITY,
                1 => v + c as f64 * 1e-3,
                2 if c >= 7 => f64::NEG_INFINITY,
                _ => v,
            }
        });
        check_on_cpu(&format!("{what} online 40000"), &gk, &bind(&[("R", 3)]), &[x], 3);
    }
    // LayerNorm of rows with a large mean and a small spread (the corrected two-pass).
    // (4096 and 1000: the one-read schedule's per-warp statistics merged across warps, 1000
    // with partial warps; 100000: the multi-pass schedule.)
    for n in [1000usize, 4096, 100_000] {
        let gk = row_kernel(DType::F32, s("R"), if n < 100_000 { d(n as i64) } else { s("N") }, "layer_norm");
        let x = with(random(&mut rng, DType::F32, &[2, n], -1.0, 1.0), |_, v| ((1000.0 + 0.01 * v) as f32) as f64);
        let ins = [x, random(&mut rng, DType::F32, &[n], 0.5, 1.5), random(&mut rng, DType::F32, &[n], -0.5, 0.5)];
        check_on_cpu(&format!("layer_norm offset {n}"), &gk, &bind(&[("R", 2), ("N", n as i64)]), &ins, 1);
    }
    // The same in bf16: a mean of 64 and values 63…65 (a few bf16 steps apart).
    let gk = row_kernel(DType::BF16, s("R"), d(4096), "layer_norm");
    let x = with(random(&mut rng, DType::BF16, &[3, 4096], -1.0, 1.0), |_, v| DType::BF16.round(64.0 + v));
    let ins = [x, random(&mut rng, DType::BF16, &[4096], 0.5, 1.5), random(&mut rng, DType::BF16, &[4096], -0.5, 0.5)];
    check_on_cpu("layer_norm offset bf16", &gk, &bind(&[("R", 3)]), &ins, 3);
    // Decomposed softmax with a −inf mask and three outputs.
    let gk = decomposed_softmax(DType::BF16);
    let mask = with(random(&mut rng, DType::BF16, &[1, 1000], -1.0, 1.0), |i, v| if i % 7 == 0 { f64::NEG_INFINITY } else { v });
    let ins = [random(&mut rng, DType::BF16, &[5, 1000], -20.0, 20.0), mask];
    check_on_cpu("softmax decomposed", &gk, &bind(&[("T", 5)]), &ins, 2);
    let gk = qk_norm(DType::BF16);
    let ins = [random(&mut rng, DType::BF16, &[3, 9, 64], -3.0, 3.0), random(&mut rng, DType::BF16, &[64], 0.5, 1.5), random(&mut rng, DType::BF16, &[3, 9, 64], -1.0, 1.0)];
    check_on_cpu("qk_norm", &gk, &bind(&[("T", 3)]), &ins, 3);
    let gk = int_rows();
    let ins = [random(&mut rng, DType::I32, &[3, 300], -1e7, 1e7)];
    check_on_cpu("int rows", &gk, &bind(&[("R", 3)]), &ins, 2);
}

#[test]
fn cpu_layout_gather_kv_append_match_the_interpreter() {
    let mut rng = Rng(4);
    let gk = transpose_heads(DType::BF16);
    check_on_cpu("permute", &gk, &bind(&[("T", 5)]), &[random(&mut rng, DType::BF16, &[5, 9, 64], -4.0, 4.0)], 2);
    let gk = transpose_2d(DType::F32);
    check_on_cpu("transpose", &gk, &bind(&[("T", 7)]), &[random(&mut rng, DType::F32, &[7, 576], -4.0, 4.0)], 2);
    let gk = concat_slice(DType::BF16);
    let ins = [random(&mut rng, DType::BF16, &[3, 64], -4.0, 4.0), random(&mut rng, DType::BF16, &[5, 64], -4.0, 4.0)];
    check_on_cpu("concat/slice/broadcast", &gk, &bind(&[("P", 3), ("T", 5)]), &ins, 2);
    for (dt, it) in [(DType::BF16, DType::I32), (DType::F32, DType::I64)] {
        let gk = embedding(dt, it);
        let table = random(&mut rng, dt, &[49152, 576], -1.0, 1.0);
        let ids = random(&mut rng, it, &[2, 3], 0.0, 49152.0);
        check_on_cpu(&format!("gather {dt} {it}"), &gk, &bind(&[("B", 2), ("T", 3)]), &[table.clone(), ids], 2);
        // Out-of-range indices give a NaN row (the interpreter reports an error).
        let ids = Tensor::new(it, &[2, 3], vec![0.0, -1.0, 49152.0, 5.0, 1e9, 49151.0]).unwrap();
        let outs = check_on_cpu(&format!("gather {dt} oor"), &gk, &bind(&[("B", 2), ("T", 3)]), &[table.clone(), ids], 2).unwrap_or_default();
        if let Some(out) = outs.first() {
            for (row, ok) in [(0, true), (1, false), (2, false), (3, true), (4, false), (5, true)] {
                let vals = &out[row * 576..(row + 1) * 576];
                if ok {
                    let src = [0usize, 0, 0, 5, 0, 49151][row];
                    assert_eq!(vals, &table.data()[src * 576..(src + 1) * 576], "row {row}");
                } else {
                    assert!(vals.iter().all(|v| v.is_nan()), "row {row}: {:?}", &vals[..4]);
                }
            }
        }
    }
    let gk = kv_append(DType::BF16);
    let (p, b, t, m) = (6usize, 2usize, 5usize, 3usize);
    let kp = random(&mut rng, DType::BF16, &[p, 16, 3, 64], -1.0, 1.0);
    let vp = random(&mut rng, DType::BF16, &[p, 16, 3, 64], -1.0, 1.0);
    let kn = random(&mut rng, DType::BF16, &[b, t, 3, 64], -1.0, 1.0);
    let vn = random(&mut rng, DType::BF16, &[b, t, 3, 64], -1.0, 1.0);
    // Sequence 0 starts at 14 (crosses a page), sequence 1 at 30.
    let bt = Tensor::new(DType::I32, &[b, m], vec![4.0, 1.0, 0.0, 2.0, 5.0, 3.0]).unwrap();
    let sp = Tensor::new(DType::I32, &[b], vec![14.0, 30.0]).unwrap();
    check_on_cpu("kv_append", &gk, &bind(&[("P", p as i64), ("B", b as i64), ("T", t as i64), ("M", m as i64)]), &[kp, vp, kn, vn, bt, sp], 3);
}

/// Kernel bodies as the passes produce them for the zoo models (`tests/fused_zoo.rs` with
/// `SINTER_DUMP_KERNELS=1`: SmolLM2-135M decode, tiny Llama decode, tiny GPT-2), run on the CPU
/// against the interpreter.
const ZOO_BODIES: &str = r#"
func @k4_pointwise(%v0: bf16[T, 960], %positions: i32[T]) {
  %v2: bf16[T, 576] = slice(%v0) {start=0, end=576}
  %v3: bf16[T, 9, 64] = reshape(%v2) {shape=[T, 9, 64]}
  %v4: i32[T, 1] = reshape(%positions) {shape=[T, 1]}
  %v5: bf16[T, 9, 64] = rope(%v3, %v4) {theta=100000.0}
  %v6: bf16[T, 9, 1, 64] = reshape(%v5) {shape=[T, 9, 1, 64]}
  return %v6
}
func @k5_pointwise(%positions: i32[T]) {
  %v1: i32[] = constant() {value=1.0, dtype=i32}
  %v2: i32[T] = add(%positions, %v1)
  return %v2
}
func @k7_layout(%block_tables: i32[2, T, M]) {
  %v1: i32[1, T, M] = slice(%block_tables) {axis=-3, start=0, end=1}
  %v2: i32[T, M] = reshape(%v1) {shape=[T, M]}
  %v3: i32[1, T, M] = slice(%block_tables) {axis=-3, start=1, end=2}
  %v4: i32[T, M] = reshape(%v3) {shape=[T, M]}
  return %v4, %v2
}
func @k8_kv_append(%positions: i32[T], %v1: bf16[T, 64], %k_pages: bf16[P, 4, 2, 8], %v_pages: bf16[P, 4, 2, 8], %v4: i32[T, M]) {
  %v5: i32[T, 1] = reshape(%positions) {shape=[T, 1]}
  %v6: bf16[T, 16] = slice(%v1) {start=32, end=48}
  %v7: bf16[T, 2, 8] = reshape(%v6) {shape=[T, 2, 8]}
  %v8: bf16[T, 2, 8] = rope(%v7, %v5) {theta=10000.0}
  %v9: bf16[T, 1, 2, 8] = reshape(%v8) {shape=[T, 1, 2, 8]}
  %v10: bf16[T, 16] = slice(%v1) {start=48, end=64}
  %v11: bf16[T, 1, 2, 8] = reshape(%v10) {shape=[T, 1, 2, 8]}
  %v12: bf16[P, 4, 2, 8], %v13: bf16[P, 4, 2, 8] = kv_append(%k_pages, %v_pages, %v9, %v11, %v4, %positions)
  return %v12, %v13
}
func @k14_pointwise(%v0: bf16[T, 96]) {
  %v1: bf16[T, 48] = slice(%v0) {start=0, end=48}
  %v2: bf16[T, 48] = slice(%v0) {start=48, end=96}
  %v3: bf16[T, 48] = swiglu(%v1, %v2)
  return %v3
}
func @k2_row_reduction(%v0: bf16[T, 32], %v1: bf16[T, 32], %w: bf16[32], %b: bf16[32]) {
  %v4: bf16[T, 32] = add(%v0, %v1)
  %v5: bf16[T, 32] = layer_norm(%v4, %w, %b) {eps=1e-5}
  return %v4, %v5
}
func @k4_layout(%v0: bf16[T, 96]) {
  %v1: bf16[T, 32] = slice(%v0) {start=0, end=32}
  %v2: bf16[1, T, 4, 8] = reshape(%v1) {shape=[1, T, 4, 8]}
  %v3: bf16[T, 32] = slice(%v0) {start=32, end=64}
  %v4: bf16[1, T, 4, 8] = reshape(%v3) {shape=[1, T, 4, 8]}
  %v5: bf16[T, 32] = slice(%v0) {start=64, end=96}
  %v6: bf16[1, T, 4, 8] = reshape(%v5) {shape=[1, T, 4, 8]}
  return %v6, %v4, %v2
}
func @k1_row_reduction(%v0: bf16[T, 576], %w: bf16[576]) {
  %v2: bf16[T, 576] = rms_norm(%v0, %w) {eps=1e-5}
  return %v2
}
func @k0_gather(%token_embd.weight: bf16[49152, 576], %tokens: i64[T]) {
  %v2: bf16[T, 576] = gather(%token_embd.weight, %tokens)
  return %v2
}
"#;

#[test]
fn cpu_zoo_bodies_match_the_interpreter() {
    let g = sinter_ir::parse(ZOO_BODIES).unwrap_or_else(|e| panic!("{e}"));
    let mut rng = Rng(6);
    let (t, p, m) = (3usize, 16usize, 3usize);
    let b = bind(&[("T", t as i64), ("P", p as i64), ("M", m as i64)]);
    for f in g.funcs.values() {
        let family = match f.name.split_once('_').map(|(_, fam)| fam) {
            Some("pointwise") => Family::Pointwise,
            Some("layout") => Family::Layout,
            Some("kv_append") => Family::KvAppend,
            Some("row_reduction") => Family::RowReduction,
            Some("gather") => Family::Gather,
            other => panic!("{other:?}"),
        };
        let inputs: Vec<Tensor> = f
            .params
            .iter()
            .map(|&v| {
                let tt = f.ty(v);
                let shape: Vec<usize> = tt.shape.iter().map(|d| d.eval(&b).unwrap() as usize).collect();
                let name = f.values[v].name.clone().unwrap_or_default();
                let (lo, hi) = match (name.as_str(), tt.dtype, shape.len()) {
                    ("positions", _, _) => (0.0, (m * 4) as f64),
                    ("tokens", _, _) => (0.0, 49152.0),
                    (_, DType::I32, _) => (0.0, p as f64),
                    _ => (-3.0, 3.0),
                };
                if tt.dtype == DType::I32 && shape.len() == 2 {
                    // A block table: distinct pages per sequence, so no two tokens share a slot.
                    let cols = shape[1];
                    return Tensor::from_fn(DType::I32, &shape, |ix| ((ix[0] * cols + ix[1]) % p) as f64);
                }
                random(&mut rng, tt.dtype, &shape, lo, hi)
            })
            .collect();
        check_on_cpu(&f.name, &single(family, f.clone()), &b, &inputs, 2);
    }
}


/// The persistent row schedules (` p16`, ` p14`, …: autotuning candidates) at the long-row
/// benchmark shapes on sm_90a: grids of `[16, 8, 1]` and `[14, 8, 1]` for the LayerNorm and
/// the RMSNorm (clusters of 8 CTAs, one CTA an SM: the staged weights fill the shared memory)
/// and of `[49, 8, 1]`, `[42, 8, 1]` for the softmax's 512 threads (three CTAs an SM) over 512
/// rows of 262144, the refill of the next row's slice as a `cp.async` whose source size is a
/// register (16 bytes, or 0 past the last row), no spills (ptxas), and `LDGSTS` in the SASS;
/// the LayerNorm's weight and bias staged once (` w p`: 192 KiB of the stage).
#[test]
fn ptxas_persistent_row_schedules() {
    for what in ["layer_norm", "rms_norm", "softmax"] {
        let gk = row_kernel(DType::BF16, d(512), d(262144), what);
        let variants = sinter_codegen::schedule_variants(&gk.0, gk.1, &Target::SM_90A).unwrap();
        let names: Vec<&str> = variants.iter().map(|v| v.name.as_str()).collect();
        let persistent: Vec<_> = variants.iter().filter(|v| v.name.contains(" p")).collect();
        assert_eq!(persistent.len(), 6, "{what}: {names:?}");
        for v in persistent {
            let plan = &v.plan;
            let tag = format!("{what} `{}`", v.name);
            let g = v.name.split(' ').find_map(|w| w.strip_prefix('p')).and_then(|g| g.parse::<i64>().ok());
            let want: &[i64] = if what == "softmax" && !v.name.contains(" t1024 ") { &[49, 42] } else { &[16, 14] };
            assert!(g.is_some_and(|g| want.contains(&g)), "{tag}");
            assert_eq!(plan.grid.iter().map(|g| (g.numerator.as_const(), g.denominator)).collect::<Vec<_>>(), vec![(g, 1), (Some(8), 1), (Some(1), 1)], "{tag}");
            assert_eq!(v.name.contains(" w "), what != "softmax", "{tag}");
            if what == "layer_norm" {
                assert!(plan.shared_bytes >= 192 << 10, "{tag}: {} bytes of shared memory", plan.shared_bytes);
            }
            assert!(plan.ptx.lines().any(|l| l.contains("cp.async.cg.shared.global") && l.trim_end().trim_end_matches(';').rsplit(',').next().is_some_and(|a| a.trim().starts_with("%r"))), "{tag}: no refill cp.async with a register source size");
            let Some(r) = assemble(plan) else { return };
            let regs = r.function(&plan.entry).map(|k| k.registers).unwrap_or(0);
            eprintln!("{tag}: {regs} registers, {} bytes of shared memory", plan.shared_bytes);
            let Some(tool) = cuobjdump() else { continue };
            let code = sass(&tool, &r.cubin, "persistent");
            assert!(code.contains("LDGSTS"), "{tag}: no LDGSTS:\n{code}");
        }
    }
}


/// Slice iterations held in registers (` k1`, `RowSchedule::held`): at 512 × 262144 `bf16`
/// (8-CTA clusters, 64 KiB slices) the RMSNorm, the softmax and the LayerNorm (row-head shift)
/// have candidates whose stage is 48 KiB, so four CTAs fit an H100/H200 SM's 228 KiB, that
/// assemble without spills in the 64 registers a thread four CTAs of 256 threads leave, and
/// that compute what the interpreter does (CPU simulation: five rows over two clusters, so a
/// cluster's second row reloads its held chunks; NaN, ±inf, zero and offset rows where
/// `special_rows` puts them, and random rows). At `bf16` rows of 65536, 131072 and 196608 and
/// `f32` rows of 131072 the held candidates there are (only where they put more rows on an SM)
/// assemble without spills.
#[test]
fn cpu_held_slice_iterations_match_the_interpreter() {
    let mut rng = Rng(29);
    let n = 262144usize;
    for what in ["rms_norm", "softmax", "layer_norm"] {
        let gk = row_kernel(DType::BF16, s("R"), d(n as i64), what);
        let target = Target::SM_90A;
        let variants = sinter_codegen::schedule_variants(&gk.0, gk.1, &target).unwrap();
        let names: Vec<&str> = variants.iter().map(|v| v.name.as_str()).collect();
        let held: Vec<_> = variants.iter().filter(|v| v.name.contains(" k")).collect();
        assert!(!held.is_empty(), "{what}: {names:?}");
        for shape in ["rows t256 u4 c8", "rows t256 u4 c4"] {
            assert!(held.iter().any(|v| v.name.starts_with(shape)), "{what}: {names:?}");
        }
        if what == "layer_norm" {
            assert!(held.iter().any(|v| v.name.contains(" s h ")), "{what}: {names:?}");
        }
        let mut ins = vec![special_rows(&mut rng, DType::BF16, 5, n, what)];
        if matches!(what, "rms_norm" | "layer_norm") {
            ins.push(random(&mut rng, DType::BF16, &[n], 0.5, 1.5));
        }
        if what == "layer_norm" {
            ins.push(random(&mut rng, DType::BF16, &[n], -0.5, 0.5));
        }
        for v in held {
            let tag = format!("variant `{}` {what} N={n}", v.name);
            // CTAs an SM by shared memory (228 KiB, 1 KiB reserved a CTA): more rows an SM
            // than the three eighths of the unheld 64 KiB slices, and the registers allow as
            // many CTAs.
            let per_sm = (228u32 << 10) / (v.plan.shared_bytes + 1024);
            let cluster = v.plan.grid[1].numerator.as_const().unwrap() as u32;
            assert!(per_sm * 8 > 3 * cluster, "{tag}: {} bytes of shared memory, {per_sm} CTAs an SM, clusters of {cluster}", v.plan.shared_bytes);
            if let Some(r) = assemble(&v.plan) {
                let regs = r.function(&v.plan.entry).map(|k| k.registers).unwrap_or(0);
                eprintln!("{tag}: {regs} registers, {} bytes of shared memory, {per_sm} CTAs an SM", v.plan.shared_bytes);
                assert!(regs * v.plan.block[0] * per_sm <= 65536, "{tag}: {regs} registers × {} threads × {per_sm} CTAs", v.plan.block[0]);
            }
            check_built_on_cpu(&tag, &gk, &bind(&[("R", 5)]), &ins, 2, || sinter_codegen::compile_variant(&gk.0, gk.1, &target, &v.name));
        }
    }
    // Other long rows: held candidates only where they put more rows on an SM, and those
    // assemble without spills (their register budget counts the held vectors).
    for (dt, n) in [(DType::BF16, 65536i64), (DType::BF16, 131072), (DType::BF16, 196608), (DType::F32, 131072)] {
        for what in ["rms_norm", "softmax", "layer_norm"] {
            let gk = row_kernel(dt, s("R"), d(n), what);
            let variants = sinter_codegen::schedule_variants(&gk.0, gk.1, &Target::SM_90A).unwrap();
            for v in variants.iter().filter(|v| v.name.contains(" k")) {
                eprintln!("{what} {dt} N={n}: `{}`", v.name);
                assemble(&v.plan);
            }
        }
    }
}

/// The sampled LayerNorm shifts stay within the bf16 tolerance on rows built against them:
/// ` s` (each warp's shift the mean of its first chunk) and ` s h` (the whole row's shift the
/// mean of the row's first 32 × 8 elements, where the slices are over 32 KiB). The corrected
/// two-pass's error grows with (mean − shift)², bounded by the sample being the shift's own
/// data: a large mean with a small spread, the first chunk of every warp far from the rest,
/// one huge element at the row's end, the row's head far from the rest ((mean − shift)² ≈
/// (N/256)·var, the ` h` bound), and an ordinary row. Every sampled candidate of rows of 32768
/// (2-CTA clusters) and 262144 (8-CTA clusters) runs, and each ` s h` candidate assembles
/// without spills.
#[test]
fn cpu_sampled_layer_norm_shift_is_accurate() {
    let mut rng = Rng(23);
    for n in [32768usize, 262144] {
        let gk = row_kernel(DType::BF16, s("R"), d(n as i64), "layer_norm");
        let target = Target::SM_90A;
        let x = random(&mut rng, DType::BF16, &[5, n], -1.0, 1.0);
        let x = with(x, |i, v| {
            let (r, c) = (i / n, i % n);
            match r {
                0 => 256.0 + 2.0 * v,
                // Every warp's first chunk (8 columns × 32 lanes of each 256-thread × 8 span).
                1 if c % 2048 < 256 => 3e4 + v,
                2 if c == n - 1 => 1e5,
                3 if c < 256 => 3e4 + v,
                3 => 256.0 + 2.0 * v,
                _ => v,
            }
        });
        let ins = vec![x, random(&mut rng, DType::BF16, &[n], 0.5, 1.5), random(&mut rng, DType::BF16, &[n], -0.5, 0.5)];
        let variants = sinter_codegen::schedule_variants(&gk.0, gk.1, &target).unwrap();
        let names: Vec<&str> = variants.iter().map(|v| v.name.as_str()).collect();
        let sampled: Vec<_> = variants.iter().filter(|v| v.name.contains(" s") && !v.name.contains(" p")).collect();
        assert!(sampled.len() >= 3, "{names:?}");
        let head = sampled.iter().filter(|v| v.name.contains(" s h")).count();
        // The row head's shift over slices above 32 KiB only, and the default there.
        assert_eq!(head >= 2, n == 262144, "{names:?}");
        assert_eq!(names[0].contains(" s h"), n == 262144, "{names:?}");
        for v in sampled {
            let tag = format!("variant `{}` sampled shift N={n}", v.name);
            if v.name.contains(" s h") {
                assemble(&v.plan);
            }
            check_built_on_cpu(&tag, &gk, &bind(&[("R", 5)]), &ins, 2, || sinter_codegen::compile_variant(&gk.0, gk.1, &target, &v.name));
        }
    }
}
