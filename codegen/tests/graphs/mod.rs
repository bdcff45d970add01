//! The kernel graphs built by hand that the code generator's tests compile: small bodies
//! made with `FunctionBuilder`, every buffer contiguous, one kernel each. Shared by the
//! snapshot tests (`codegen/tests/kernels.rs`) and the CPU-emulator tests of the crate
//! (`codegen/src/cpu_tests/`, which include this file by path); each uses a part of it.

#![allow(dead_code)]

use sinter_ir::{
    Attr, Buffer, BufferData, BufferRole, DType, Dim, Family, Function, FunctionBuilder, Graph, Kernel, KernelData, KernelGraph, Layout, OpKind, TensorType, Value,
};

pub fn d(n: i64) -> Dim {
    Dim::constant(n)
}
pub fn s(name: &str) -> Dim {
    Dim::symbol(name)
}
pub fn ty(dt: DType, dims: &[Dim]) -> TensorType {
    TensorType::new(dt, dims.iter().cloned())
}
pub fn op(fb: &mut FunctionBuilder, kind: OpKind, ins: &[Value]) -> Value {
    fb.op1(kind, ins, vec![]).unwrap()
}
pub fn op_a(fb: &mut FunctionBuilder, kind: OpKind, ins: &[Value], attrs: Vec<(&str, Attr)>) -> Value {
    fb.op1(kind, ins, attrs).unwrap()
}

/// A kernel graph holding one kernel of `family` with `body`, every buffer contiguous.
pub fn single(family: Family, body: Function) -> (KernelGraph, Kernel) {
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

/// `silu(a) · b` over `[rows, cols]` (the SwiGLU of an MLP, unfused form).
pub fn silu_mul(dt: DType, rows: Dim, cols: Dim) -> (KernelGraph, Kernel) {
    let mut fb = FunctionBuilder::new(&Graph::new(), "silu_mul");
    let a = fb.param("a", ty(dt, &[rows.clone(), cols.clone()]));
    let b = fb.param("b", ty(dt, &[rows, cols]));
    let sa = op(&mut fb, OpKind::Silu, &[a]);
    let y = op(&mut fb, OpKind::Mul, &[sa, b]);
    single(Family::Pointwise, fb.finish(&[y]).unwrap())
}

/// A DAG of most element-wise ops over a broadcast: `x [T, 17] f32`, `w [17] f32`, `m [T, 1]
/// bool`, `i [T, 17] i32`; two outputs.
pub fn elementwise_zoo(dt: DType) -> (KernelGraph, Kernel) {
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

/// `erf(x)` over `x [T, n]`: the element-wise kernel of the `erf` op.
pub fn erf_pointwise(dt: DType, n: Dim) -> (KernelGraph, Kernel) {
    let mut fb = FunctionBuilder::new(&Graph::new(), "erf");
    let x = fb.param("x", ty(dt, &[s("T"), n]));
    let e = op(&mut fb, OpKind::Erf, &[x]);
    single(Family::Pointwise, fb.finish(&[e]).unwrap())
}

/// erf-GELU written out over `x [T, n]` as Hugging Face writes it, `x·0.5·(1 + erf(x/√2))`,
/// beside `gelu(x)` (erf form): two outputs of one element-wise kernel.
pub fn erf_gelu_written(dt: DType, n: Dim) -> (KernelGraph, Kernel) {
    let mut fb = FunctionBuilder::new(&Graph::new(), "erf_gelu");
    let x = fb.param("x", ty(dt, &[s("T"), n]));
    let c = |fb: &mut FunctionBuilder, v: f64| op_a(fb, OpKind::Constant, &[], vec![("value", Attr::Float(v)), ("dtype", Attr::DType(dt))]);
    let r2 = c(&mut fb, std::f64::consts::SQRT_2);
    let z = op(&mut fb, OpKind::Div, &[x, r2]);
    let e = op(&mut fb, OpKind::Erf, &[z]);
    let one = c(&mut fb, 1.0);
    let s1 = op(&mut fb, OpKind::Add, &[one, e]);
    let half = c(&mut fb, 0.5);
    let hx = op(&mut fb, OpKind::Mul, &[x, half]);
    let y = op(&mut fb, OpKind::Mul, &[hx, s1]);
    let g = op(&mut fb, OpKind::Gelu, &[x]);
    single(Family::Pointwise, fb.finish(&[y, g]).unwrap())
}

/// `rope(q, positions)`: `q [T, 9, 64]`, `positions [T] i32`.
pub fn rope(dt: DType, form: &str) -> (KernelGraph, Kernel) {
    let mut fb = FunctionBuilder::new(&Graph::new(), "rope");
    let q = fb.param("q", ty(dt, &[s("T"), d(9), d(64)]));
    let p = fb.param("positions", ty(DType::I32, &[s("T"), d(1)]));
    let y = op_a(&mut fb, OpKind::Rope, &[q, p], vec![("theta", Attr::Float(100000.0)), ("form", Attr::Str(form.into()))]);
    single(Family::Pointwise, fb.finish(&[y]).unwrap())
}

/// `rotary(q, cos, sin)` (rotation by caller-supplied tables) over `q [T, 9, 64]`, the
/// tables `[T, 1, 64]` of `table_dt` (Hugging Face's unsqueezed `position_embeddings`).
pub fn rotary_tables(dt: DType, table_dt: DType, form: &str) -> (KernelGraph, Kernel) {
    let mut fb = FunctionBuilder::new(&Graph::new(), "rotary");
    let q = fb.param("q", ty(dt, &[s("T"), d(9), d(64)]));
    let c = fb.param("cos", ty(table_dt, &[s("T"), d(1), d(64)]));
    let sn = fb.param("sin", ty(table_dt, &[s("T"), d(1), d(64)]));
    let y = op_a(&mut fb, OpKind::Rotary, &[q, c, sn], vec![("form", Attr::Str(form.into()))]);
    single(Family::Pointwise, fb.finish(&[y]).unwrap())
}

/// SmolLM2's merged QKV projection `x [T, 576] · w [960, 576]ᵀ` with rotation by tables
/// `[T, 1, 64]` on Q `[T, 9, 64]` and K `[T, 3, 64]` in its epilogue, V sliced out.
pub fn qkv_rotary(dt: DType, m: Dim) -> (KernelGraph, Kernel) {
    let mut fb = FunctionBuilder::new(&Graph::new(), "qkv_rotary");
    let x = fb.param("x", ty(dt, &[m.clone(), d(576)]));
    let w = fb.param("w", ty(dt, &[d(960), d(576)]));
    let c = fb.param("cos", ty(dt, &[m.clone(), d(1), d(64)]));
    let sn = fb.param("sin", ty(dt, &[m.clone(), d(1), d(64)]));
    let mm = op_a(&mut fb, OpKind::Matmul, &[x, w], vec![("transpose_b", Attr::Bool(true))]);
    let part = |fb: &mut FunctionBuilder, a: i64, b: i64, h: i64| {
        let sl = op_a(fb, OpKind::Slice, &[mm], vec![("axis", Attr::Int(-1)), ("start", Attr::Dim(d(a))), ("end", Attr::Dim(d(b)))]);
        op_a(fb, OpKind::Reshape, &[sl], vec![("shape", Attr::Dims(vec![m.clone(), d(h), d(64)]))])
    };
    let q = part(&mut fb, 0, 576, 9);
    let k = part(&mut fb, 576, 768, 3);
    let v = part(&mut fb, 768, 960, 3);
    let q = op(&mut fb, OpKind::Rotary, &[q, c, sn]);
    let k = op(&mut fb, OpKind::Rotary, &[k, c, sn]);
    single(Family::Matmul, fb.finish(&[q, k, v]).unwrap())
}

/// Qwen3's q norm then rotation by tables in one row kernel: `rotary(rms_norm(x, w), cos,
/// sin)` over `x [T, 16, 128]`, tables `[T, 1, 128]`.
pub fn qk_norm_rotary(dt: DType) -> (KernelGraph, Kernel) {
    let mut fb = FunctionBuilder::new(&Graph::new(), "qk_norm_rotary");
    let x = fb.param("x", ty(dt, &[s("T"), d(16), d(128)]));
    let w = fb.param("w", ty(dt, &[d(128)]));
    let c = fb.param("cos", ty(dt, &[s("T"), d(1), d(128)]));
    let sn = fb.param("sin", ty(dt, &[s("T"), d(1), d(128)]));
    let n = op_a(&mut fb, OpKind::RmsNorm, &[x, w], vec![("eps", Attr::Float(1e-6))]);
    let y = op(&mut fb, OpKind::Rotary, &[n, c, sn]);
    single(Family::RowReduction, fb.finish(&[y]).unwrap())
}

/// `kv_append` of K rows rotated by tables (its prologue): new rows `[B, 1, 3, 64]`, tables
/// `[B, 1, 1, 64]`, pages `[P, 16, 3, 64]`.
pub fn kv_append_rotary(dt: DType) -> (KernelGraph, Kernel) {
    let mut fb = FunctionBuilder::new(&Graph::new(), "kv_append_rotary");
    let pages = ty(dt, &[s("P"), d(16), d(3), d(64)]);
    let kp = fb.param("k_pages", pages.clone());
    let vp = fb.param("v_pages", pages);
    let kn = fb.param("k_new", ty(dt, &[s("B"), d(1), d(3), d(64)]));
    let vn = fb.param("v_new", ty(dt, &[s("B"), d(1), d(3), d(64)]));
    let c = fb.param("cos", ty(dt, &[s("B"), d(1), d(1), d(64)]));
    let sn = fb.param("sin", ty(dt, &[s("B"), d(1), d(1), d(64)]));
    let bt = fb.param("block_table", ty(DType::I32, &[s("B"), s("M")]));
    let sp = fb.param("start_pos", ty(DType::I32, &[s("B")]));
    let kr = op(&mut fb, OpKind::Rotary, &[kn, c, sn]);
    let r = fb.op(OpKind::KvAppend, &[kp, vp, kr, vn, bt, sp], vec![]).unwrap();
    single(Family::KvAppend, fb.finish(&r).unwrap())
}

/// `swiglu(gate, up)` over `[T, 1536]`, and a cast to f32 as a second output.
pub fn swiglu(dt: DType) -> (KernelGraph, Kernel) {
    let mut fb = FunctionBuilder::new(&Graph::new(), "swiglu");
    let g = fb.param("gate", ty(dt, &[s("T"), d(1536)]));
    let u = fb.param("up", ty(dt, &[s("T"), d(1536)]));
    let y = op(&mut fb, OpKind::Swiglu, &[g, u]);
    let c = op_a(&mut fb, OpKind::Cast, &[y], vec![("dtype", Attr::DType(DType::F32))]);
    single(Family::Pointwise, fb.finish(&[y, c]).unwrap())
}

/// One row op over `x [R, n]`.
pub fn row_kernel(dt: DType, rows: Dim, n: Dim, what: &str) -> (KernelGraph, Kernel) {
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
pub fn softmax_entropy_kernel(mut fb: FunctionBuilder, xm: Value) -> (KernelGraph, Kernel) {
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
pub fn decomposed_softmax(dt: DType) -> (KernelGraph, Kernel) {
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
pub fn decomposed_softmax_sum(dt: DType, n: i64) -> (KernelGraph, Kernel) {
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
pub fn qk_norm(dt: DType) -> (KernelGraph, Kernel) {
    let mut fb = FunctionBuilder::new(&Graph::new(), "qk_norm");
    let x = fb.param("x", ty(dt, &[s("T"), d(9), d(64)]));
    let w = fb.param("w", ty(dt, &[d(64)]));
    let res = fb.param("res", ty(dt, &[s("T"), d(9), d(64)]));
    let y = op_a(&mut fb, OpKind::RmsNorm, &[x, w], vec![("eps", Attr::Float(1e-6))]);
    let z = op(&mut fb, OpKind::Add, &[y, res]);
    single(Family::RowReduction, fb.finish(&[z]).unwrap())
}

/// Gemma's q/k norm with RoPE in one row kernel: `rope(cast(rms_norm(cast(x, f32), cast(w, f32)
/// + 1), dt), positions)` over heads `x [T, H, D]` (`heads_first`: `[H, T, D]`, positions
/// `[1, T]`), rotate-half, θ = 10⁴.
pub fn qk_norm_rope(dt: DType, h: i64, hd: i64, heads_first: bool) -> (KernelGraph, Kernel) {
    let mut fb = FunctionBuilder::new(&Graph::new(), "qk_norm_rope");
    let (xs, ps) = if heads_first { (vec![d(h), s("T"), d(hd)], vec![d(1), s("T")]) } else { (vec![s("T"), d(h), d(hd)], vec![s("T"), d(1)]) };
    let x = fb.param("x", ty(dt, &xs));
    let w = fb.param("w", ty(dt, &[d(hd)]));
    let p = fb.param("positions", ty(DType::I32, &ps));
    let f32_ = |fb: &mut FunctionBuilder, v: Value| op_a(fb, OpKind::Cast, &[v], vec![("dtype", Attr::DType(DType::F32))]);
    let x32 = f32_(&mut fb, x);
    let w32 = f32_(&mut fb, w);
    let one = op_a(&mut fb, OpKind::Constant, &[], vec![("value", Attr::Float(1.0)), ("dtype", Attr::DType(DType::F32))]);
    let w1 = op(&mut fb, OpKind::Add, &[w32, one]);
    let n = op_a(&mut fb, OpKind::RmsNorm, &[x32, w1], vec![("eps", Attr::Float(1e-6))]);
    let nb = op_a(&mut fb, OpKind::Cast, &[n], vec![("dtype", Attr::DType(dt))]);
    let y = op_a(&mut fb, OpKind::Rope, &[nb, p], vec![("theta", Attr::Float(10000.0))]);
    single(Family::RowReduction, fb.finish(&[y]).unwrap())
}

/// Integer row sums and maxima.
pub fn int_rows() -> (KernelGraph, Kernel) {
    let mut fb = FunctionBuilder::new(&Graph::new(), "int_rows");
    let x = fb.param("x", ty(DType::I32, &[s("R"), d(300)]));
    let a = op_a(&mut fb, OpKind::ReduceSum, &[x], vec![("keepdim", Attr::Bool(true))]);
    let b = op_a(&mut fb, OpKind::ReduceMax, &[x], vec![("keepdim", Attr::Bool(true))]);
    single(Family::RowReduction, fb.finish(&[a, b]).unwrap())
}

/// `permute(x [T, 9, 64], [1, 0, 2])` → `[9, T, 64]`.
pub fn transpose_heads(dt: DType) -> (KernelGraph, Kernel) {
    let mut fb = FunctionBuilder::new(&Graph::new(), "transpose");
    let x = fb.param("x", ty(dt, &[s("T"), d(9), d(64)]));
    let y = op_a(&mut fb, OpKind::Permute, &[x], vec![("perm", Attr::Ints(vec![1, 0, 2]))]);
    single(Family::Layout, fb.finish(&[y]).unwrap())
}

/// `transpose(x [T, 576])` → `[576, T]` (the innermost axis moves).
pub fn transpose_2d(dt: DType) -> (KernelGraph, Kernel) {
    let mut fb = FunctionBuilder::new(&Graph::new(), "transpose2d");
    let x = fb.param("x", ty(dt, &[s("T"), d(576)]));
    let y = op(&mut fb, OpKind::Transpose, &[x]);
    single(Family::Layout, fb.finish(&[y]).unwrap())
}

/// `concat([k [P, 64], v [T, 64]], axis 0)` then a slice of columns 8..40 and a broadcast.
pub fn concat_slice(dt: DType) -> (KernelGraph, Kernel) {
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
pub fn embedding(dt: DType, idx: DType) -> (KernelGraph, Kernel) {
    let mut fb = FunctionBuilder::new(&Graph::new(), "embed");
    let t = fb.param("table", ty(dt, &[d(49152), d(576)]));
    let i = fb.param("ids", ty(idx, &[s("B"), s("T")]));
    let y = op(&mut fb, OpKind::Gather, &[t, i]);
    single(Family::Gather, fb.finish(&[y]).unwrap())
}

/// `kv_append` into pages `[P, 16, 3, 64]` from new rows `[B, T, 3, 64]`.
pub fn kv_append(dt: DType) -> (KernelGraph, Kernel) {
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
pub fn views_pointwise() -> (KernelGraph, Kernel) {
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
pub fn flat_mixed() -> (KernelGraph, Kernel) {
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
pub fn concat_last(aligned: bool) -> (KernelGraph, Kernel) {
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
pub fn row_epilogues(dt: DType) -> (KernelGraph, Kernel) {
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
pub fn embedding_scaled() -> (KernelGraph, Kernel) {
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
pub fn fused_pointwise(rows: i64, cols: i64) -> (KernelGraph, Kernel) {
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

/// `quantize_fp8(x from[R, C], s f32[])` → `f8e4m3[R, C]`.
pub fn quantize_fp8_at(from: DType, rows: Dim, cols: Dim) -> (KernelGraph, Kernel) {
    let mut fb = FunctionBuilder::new(&Graph::new(), "quantize_fp8");
    let x = fb.param("x", ty(from, &[rows, cols]));
    let sc = fb.param("s", ty(DType::F32, &[]));
    let y = op(&mut fb, OpKind::QuantizeFp8, &[x, sc]);
    single(Family::Pointwise, fb.finish(&[y]).unwrap())
}

/// `dequantize_fp8(x8 f8e4m3[R, C], s f32[]) {dtype=to}`.
pub fn dequantize_fp8_at(to: DType, rows: Dim, cols: Dim) -> (KernelGraph, Kernel) {
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
pub fn fp8_misc() -> Vec<(String, (KernelGraph, Kernel))> {
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
pub fn cast_kernel(from: DType, to: DType, rows: i64, cols: i64) -> (KernelGraph, Kernel) {
    let mut fb = FunctionBuilder::new(&Graph::new(), "cast");
    let x = fb.param("x", ty(from, &[d(rows), d(cols)]));
    let y = op_a(&mut fb, OpKind::Cast, &[x], vec![("dtype", Attr::DType(to))]);
    single(Family::Pointwise, fb.finish(&[y]).unwrap())
}

/// `rope(q [T, H, D], positions [T, 1])` in `form`, θ = 10⁴.
pub fn rope_at(dt: DType, form: &str, t: i64, h: i64, hd: i64) -> (KernelGraph, Kernel) {
    let mut fb = FunctionBuilder::new(&Graph::new(), "rope");
    let q = fb.param("q", ty(dt, &[d(t), d(h), d(hd)]));
    let p = fb.param("positions", ty(DType::I32, &[d(t), d(1)]));
    let y = op_a(&mut fb, OpKind::Rope, &[q, p], vec![("theta", Attr::Float(10000.0)), ("form", Attr::Str(form.into()))]);
    single(Family::Pointwise, fb.finish(&[y]).unwrap())
}

/// `rope(q [T, H, D], positions [T, 1])` in `form`, θ = 10⁴, with `extra` attributes (a
/// partial rotary dim, a frequency scaling).
pub fn rope_scaled_at(dt: DType, form: &str, (t, h, hd): (i64, i64, i64), extra: Vec<(&str, Attr)>) -> (KernelGraph, Kernel) {
    let mut fb = FunctionBuilder::new(&Graph::new(), "rope");
    let q = fb.param("q", ty(dt, &[d(t), d(h), d(hd)]));
    let p = fb.param("positions", ty(DType::I32, &[d(t), d(1)]));
    let mut attrs = vec![("theta", Attr::Float(10000.0)), ("form", Attr::Str(form.into()))];
    attrs.extend(extra);
    let y = op_a(&mut fb, OpKind::Rope, &[q, p], attrs);
    single(Family::Pointwise, fb.finish(&[y]).unwrap())
}

/// A sliding-window style mask from logical ops: `keep = (j ≤ i) ∧ ¬(j < i − w)` over
/// `i [T, 1]`, `j [N]` (i32) selecting `x [T, N]` bf16 or −inf; the mask is a second output.
pub fn logical_mask_at(t: i64, n: i64) -> (KernelGraph, Kernel) {
    let mut fb = FunctionBuilder::new(&Graph::new(), "mask");
    let i = fb.param("i", ty(DType::I32, &[d(t), d(1)]));
    let j = fb.param("j", ty(DType::I32, &[d(n)]));
    let x = fb.param("x", ty(DType::BF16, &[d(t), d(n)]));
    let w = op_a(&mut fb, OpKind::Constant, &[], vec![("value", Attr::Float(128.0)), ("dtype", Attr::DType(DType::I32))]);
    let lo = op(&mut fb, OpKind::Sub, &[i, w]);
    let causal = op(&mut fb, OpKind::Le, &[j, i]);
    let old = op(&mut fb, OpKind::Lt, &[j, lo]);
    let recent = op(&mut fb, OpKind::LogicalNot, &[old]);
    let keep = op(&mut fb, OpKind::LogicalAnd, &[causal, recent]);
    let ninf = op_a(&mut fb, OpKind::Constant, &[], vec![("value", Attr::Float(f64::NEG_INFINITY)), ("dtype", Attr::DType(DType::BF16))]);
    let y = op(&mut fb, OpKind::Select, &[keep, x, ninf]);
    let either = op(&mut fb, OpKind::LogicalOr, &[keep, old]);
    single(Family::Pointwise, fb.finish(&[y, either]).unwrap())
}

/// The `swiglu(gate, up)` op alone over `[T, N]`.
pub fn swiglu_at(dt: DType, t: i64, n: i64) -> (KernelGraph, Kernel) {
    let mut fb = FunctionBuilder::new(&Graph::new(), "swiglu");
    let g = fb.param("gate", ty(dt, &[d(t), d(n)]));
    let u = fb.param("up", ty(dt, &[d(t), d(n)]));
    let y = op(&mut fb, OpKind::Swiglu, &[g, u]);
    single(Family::Pointwise, fb.finish(&[y]).unwrap())
}

/// `gather(table [V, D], ids [B, T])`.
pub fn embedding_at(dt: DType, idx: DType, vocab: i64, dim: i64, b: i64, t: i64) -> (KernelGraph, Kernel) {
    let mut fb = FunctionBuilder::new(&Graph::new(), "embed");
    let table = fb.param("table", ty(dt, &[d(vocab), d(dim)]));
    let i = fb.param("ids", ty(idx, &[d(b), d(t)]));
    let y = op(&mut fb, OpKind::Gather, &[table, i]);
    single(Family::Gather, fb.finish(&[y]).unwrap())
}

/// `kv_append` of new rows `[B, T, Hkv, D]` into `pages` pages `[pages, page, Hkv, D]` through
/// a block table `[B, M]`.
#[allow(clippy::too_many_arguments)]
pub fn kv_append_at(dt: DType, pages: i64, page: i64, hkv: i64, hd: i64, b: i64, t: i64, m: i64) -> (KernelGraph, Kernel) {
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
pub fn transpose_at(dt: DType, rows: i64, cols: i64) -> (KernelGraph, Kernel) {
    let mut fb = FunctionBuilder::new(&Graph::new(), "transpose");
    let x = fb.param("x", ty(dt, &[d(rows), d(cols)]));
    let y = op(&mut fb, OpKind::Transpose, &[x]);
    single(Family::Layout, fb.finish(&[y]).unwrap())
}

/// `concat([a [R, Ca], b [R, Cb]], axis -1)`: a copy into one buffer.
pub fn concat_at(dt: DType, rows: i64, ca: i64, cb: i64) -> (KernelGraph, Kernel) {
    let mut fb = FunctionBuilder::new(&Graph::new(), "concat");
    let a = fb.param("a", ty(dt, &[d(rows), d(ca)]));
    let b = fb.param("b", ty(dt, &[d(rows), d(cb)]));
    let y = op_a(&mut fb, OpKind::Concat, &[a, b], vec![("axis", Attr::Int(-1))]);
    single(Family::Layout, fb.finish(&[y]).unwrap())
}

/// `x [M, K] · w [N, K]ᵀ` (a projection as the models write it).
pub fn matmul_at(dt: DType, m: i64, n: i64, k: i64) -> (KernelGraph, Kernel) {
    let mut fb = FunctionBuilder::new(&Graph::new(), "proj");
    let x = fb.param("x", ty(dt, &[d(m), d(k)]));
    let w = fb.param("w", ty(dt, &[d(n), d(k)]));
    let y = op_a(&mut fb, OpKind::Matmul, &[x, w], vec![("transpose_b", Attr::Bool(true))]);
    single(Family::Matmul, fb.finish(&[y]).unwrap())
}

/// `rms_norm(x [M, K], g [K]) · w [N, K]ᵀ + r [M, N]`: a projection with the norm in its
/// prologue (the small-M kernel computing its rows' statistics) and a residual add.
pub fn norm_matmul_at(dt: DType, m: i64, n: i64, k: i64) -> (KernelGraph, Kernel) {
    let mut fb = FunctionBuilder::new(&Graph::new(), "norm_proj");
    let x = fb.param("x", ty(dt, &[d(m), d(k)]));
    let g = fb.param("g", ty(dt, &[d(k)]));
    let w = fb.param("w", ty(dt, &[d(n), d(k)]));
    let r = fb.param("r", ty(dt, &[d(m), d(n)]));
    let h = op_a(&mut fb, OpKind::RmsNorm, &[x, g], vec![("eps", Attr::Float(1e-5))]);
    let y = op_a(&mut fb, OpKind::Matmul, &[h, w], vec![("transpose_b", Attr::Bool(true))]);
    let o = op_a(&mut fb, OpKind::Add, &[y, r], vec![]);
    single(Family::Matmul, fb.finish(&[o]).unwrap())
}

/// The fp8 matmul: `dequantize_fp8(a8 [M, K], sa) · dequantize_fp8(b8 [N, K], sb)ᵀ`
/// with f8e4m3 operands, f32 scalar scales and a result of `out` (the `dequantize_fp8` dtype).
pub fn fp8_matmul_at(out: DType, m: i64, n: i64, k: i64) -> (KernelGraph, Kernel) {
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
pub fn matmul_kn_at(dt: DType, m: i64, n: i64, k: i64) -> (KernelGraph, Kernel) {
    let mut fb = FunctionBuilder::new(&Graph::new(), "proj");
    let x = fb.param("x", ty(dt, &[d(m), d(k)]));
    let w = fb.param("w", ty(dt, &[d(k), d(n)]));
    let y = op(&mut fb, OpKind::Matmul, &[x, w]);
    single(Family::Matmul, fb.finish(&[y]).unwrap())
}

/// Grouped-query prefill attention: `q [B, H, S, D]`, `k`, `v [B, Hkv, S, D]`.
pub fn attention_at(dt: DType, b: i64, h: i64, hkv: i64, seq: i64, hd: i64, causal: bool) -> (KernelGraph, Kernel) {
    let mut fb = FunctionBuilder::new(&Graph::new(), "attn");
    let q = fb.param("q", ty(dt, &[d(b), d(h), d(seq), d(hd)]));
    let k = fb.param("k", ty(dt, &[d(b), d(hkv), d(seq), d(hd)]));
    let v = fb.param("v", ty(dt, &[d(b), d(hkv), d(seq), d(hd)]));
    let attrs = vec![("scale", Attr::Float(1.0 / (hd as f64).sqrt())), ("causal", Attr::Bool(causal)), ("heads", Attr::Int(h)), ("kv_heads", Attr::Int(hkv))];
    let o = op_a(&mut fb, OpKind::Attention, &[q, k, v], attrs);
    single(Family::Attention, fb.finish(&[o]).unwrap())
}

/// The fp8 attention: `attention(dequantize_fp8(q8, sq), dequantize_fp8(k8, sk),
/// dequantize_fp8(v8, sv))` of `f8e4m3` `[B, H, S, D]` inputs and `f32[]` scales, bf16 out.
pub fn fp8_attention_at(b: i64, h: i64, hkv: i64, seq: i64, hd: i64, causal: bool) -> (KernelGraph, Kernel) {
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
pub fn paged_at(dt: DType, b: i64, h: i64, hkv: i64, hd: i64, pages: i64, page: i64, m: i64) -> (KernelGraph, Kernel) {
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
pub fn attention_lse_at(dt: DType, n: i64, rows: i64, hkv: i64, skv: i64, hd: i64) -> (KernelGraph, Kernel) {
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
pub fn paged_lse_at(dt: DType, b: i64, h: i64, hkv: i64, hd: i64, pages: i64, page: i64, m: i64) -> (KernelGraph, Kernel) {
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
pub fn merge_at(dt: DType, rows: &[Dim], hd: i64) -> (KernelGraph, Kernel) {
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
