//! Each composite op against its own decomposition, on random and adversarial inputs.

use proptest::prelude::*;

use super::*;
use crate::builder::{BuildError, FunctionBuilder};
use crate::dim::Dim;
use crate::graph::{TensorType, Value};
use crate::ops::{Attr, OpKind};

type B<'a> = &'a mut FunctionBuilder;

fn ty(dtype: DType, shape: &[usize]) -> TensorType {
    TensorType::new(dtype, shape.iter().map(|&d| Dim::constant(d as i64)))
}

fn dims(shape: &[usize]) -> Attr {
    Attr::Dims(shape.iter().map(|&d| Dim::constant(d as i64)).collect())
}

/// A graph with one function `@main` of the given parameters, verified.
fn build(params: &[(&str, TensorType)], body: impl FnOnce(B<'_>, &[Value]) -> Result<Vec<Value>, BuildError>) -> Graph {
    let mut g = Graph::new();
    let mut b = FunctionBuilder::new(&g, "main");
    let vs: Vec<Value> = params.iter().map(|(n, t)| b.param(n, t.clone())).collect();
    let outs = body(&mut b, &vs).unwrap_or_else(|e| panic!("build: {e}"));
    g.add_func(b.finish(&outs).unwrap_or_else(|e| panic!("finish: {e}")));
    verify(&g).unwrap_or_else(|e| panic!("verify: {e}\n{}", crate::print(&g)));
    g
}

fn konst(b: B<'_>, value: f64, dtype: DType) -> Result<Value, BuildError> {
    b.op1(OpKind::Constant, &[], vec![("value", Attr::Float(value)), ("dtype", Attr::DType(dtype))])
}

fn cast(b: B<'_>, x: Value, dtype: DType) -> Result<Value, BuildError> {
    b.op1(OpKind::Cast, &[x], vec![("dtype", Attr::DType(dtype))])
}

fn un(b: B<'_>, kind: OpKind, x: Value) -> Result<Value, BuildError> {
    b.op1(kind, &[x], vec![])
}

fn bin(b: B<'_>, kind: OpKind, x: Value, y: Value) -> Result<Value, BuildError> {
    b.op1(kind, &[x, y], vec![])
}

fn reduce(b: B<'_>, kind: OpKind, x: Value, axis: i64) -> Result<Value, BuildError> {
    b.op1(kind, &[x], vec![("axis", Attr::Int(axis))])
}

fn dtype_strategy() -> impl Strategy<Value = DType> {
    prop_oneof![Just(DType::BF16), Just(DType::F16), Just(DType::F32)]
}

/// One adversarial or ordinary value: mostly moderate, sometimes huge, very negative, −inf.
fn value_strategy() -> impl Strategy<Value = f64> {
    prop_oneof![
        8 => -8.0..8.0f64,
        1 => -1e4..1e4f64,
        1 => (-1e7 - 4.0)..(-1e7 + 4.0),
        1 => Just(f64::NEG_INFINITY),
        1 => -1e-3..1e-3f64,
    ]
}

/// Rows × n values.
fn rows_strategy() -> impl Strategy<Value = (usize, usize, Vec<f64>)> {
    (1usize..4, 1usize..40).prop_flat_map(|(r, n)| prop::collection::vec(value_strategy(), r * n).prop_map(move |v| (r, n, v)))
}

/// The values as a `[r, n]` tensor of `dtype` with at least one finite value per row after
/// rounding (−1e7 is −inf in f16). A row of all −inf is the one place the fused ops and the
/// decomposition differ by design (0 versus NaN); it is tested on its own.
fn rows_tensor(dtype: DType, r: usize, n: usize, mut v: Vec<f64>) -> Tensor {
    for row in v.chunks_mut(n) {
        if row.iter().all(|x| dtype.round(*x).is_infinite()) {
            row[0] = 0.5;
        }
    }
    t(dtype, &[r, n], v)
}

fn softmax_pair(dtype: DType, r: usize, n: usize, log: bool) -> (Graph, Graph) {
    let kind = if log { OpKind::LogSoftmax } else { OpKind::Softmax };
    let fused = build(&[("x", ty(dtype, &[r, n]))], |b, p| Ok(vec![b.op1(kind, &[p[0]], vec![])?]));
    let decomp = build(&[("x", ty(dtype, &[r, n]))], |b, p| {
        let x = p[0];
        let m = reduce(b, OpKind::ReduceMax, x, -1)?;
        let d = bin(b, OpKind::Sub, x, m)?;
        let e = un(b, OpKind::Exp, d)?;
        let s = reduce(b, OpKind::ReduceSum, e, -1)?;
        Ok(vec![if log {
            let l = un(b, OpKind::Log, s)?;
            bin(b, OpKind::Sub, d, l)?
        } else {
            bin(b, OpKind::Div, e, s)?
        }])
    });
    (fused, decomp)
}

fn run_both(fused: &Graph, decomp: &Graph, inputs: &[&Tensor]) -> (Tensor, Tensor) {
    let a = call_fn(fused, "main", inputs).remove(0);
    let b = call_fn(decomp, "main", inputs).remove(0);
    (a, b)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn softmax_matches_its_decomposition(dtype in dtype_strategy(), (r, n, v) in rows_strategy()) {
        let x = rows_tensor(dtype, r, n, v);
        let (fused, decomp) = softmax_pair(dtype, r, n, false);
        let (a, b) = run_both(&fused, &decomp, &[&x]);
        assert_close(&a, &b, dtype, "softmax");
        // Exactly 0 where the input is −inf.
        for (i, xv) in x.data().iter().enumerate() {
            if *xv == NEG_INF {
                prop_assert_eq!(a.data()[i], 0.0);
            }
        }
    }

    #[test]
    fn log_softmax_matches_its_decomposition(dtype in dtype_strategy(), (r, n, v) in rows_strategy()) {
        let x = rows_tensor(dtype, r, n, v);
        let (fused, decomp) = softmax_pair(dtype, r, n, true);
        let (a, b) = run_both(&fused, &decomp, &[&x]);
        assert_close(&a, &b, dtype, "log_softmax");
    }

    #[test]
    fn rms_norm_matches_its_decomposition(dtype in dtype_strategy(), r in 1usize..4, n in 1usize..24, seed in any::<u64>(), scale in prop_oneof![Just(1e-4), Just(1.0), Just(300.0)], zero_row in any::<bool>()) {
        let mut rng = Rng(seed);
        let mut x = rng.tensor(dtype, &[r, n], scale);
        if zero_row {
            x = Tensor::from_fn(dtype, &[r, n], |i| if i[0] == 0 { 0.0 } else { x.get(i).unwrap_or(0.0) });
        }
        let w = rng.tensor(dtype, &[n], 2.0);
        let eps = 1e-5;
        let fused = build(&[("x", ty(dtype, &[r, n])), ("w", ty(dtype, &[n]))], |b, p| {
            Ok(vec![b.op1(OpKind::RmsNorm, &[p[0], p[1]], vec![("eps", Attr::Float(eps))])?])
        });
        // x · rsqrt(mean(x²) + eps) in f32, cast back, times w.
        let decomp = build(&[("x", ty(dtype, &[r, n])), ("w", ty(dtype, &[n]))], |b, p| {
            let xf = cast(b, p[0], DType::F32)?;
            let sq = bin(b, OpKind::Mul, xf, xf)?;
            let ms = reduce(b, OpKind::ReduceMean, sq, -1)?;
            let e = konst(b, eps, DType::F32)?;
            let a = bin(b, OpKind::Add, ms, e)?;
            let rs = un(b, OpKind::Rsqrt, a)?;
            let h = bin(b, OpKind::Mul, xf, rs)?;
            let h = cast(b, h, dtype)?;
            Ok(vec![bin(b, OpKind::Mul, h, p[1])?])
        });
        let (a, b) = run_both(&fused, &decomp, &[&x, &w]);
        assert_close(&a, &b, dtype, "rms_norm");
        if zero_row {
            prop_assert!(a.data()[..n].iter().all(|&v| v == 0.0));
        }
    }

    #[test]
    fn layer_norm_matches_its_decomposition(dtype in dtype_strategy(), r in 1usize..4, n in 2usize..24, seed in any::<u64>(), offset in prop_oneof![Just(0.0), Just(10.0), Just(-50.0)]) {
        let mut rng = Rng(seed);
        let x = Tensor::from_fn(dtype, &[r, n], |_| offset + rng.next() * 3.0);
        let w = rng.tensor(dtype, &[n], 2.0);
        let bias = rng.tensor(dtype, &[n], 1.0);
        let eps = 1e-5;
        let params = [("x", ty(dtype, &[r, n])), ("w", ty(dtype, &[n])), ("b", ty(dtype, &[n]))];
        let fused = build(&params, |b, p| Ok(vec![b.op1(OpKind::LayerNorm, &[p[0], p[1], p[2]], vec![("eps", Attr::Float(eps))])?]));
        let decomp = build(&params, |b, p| {
            let xf = cast(b, p[0], DType::F32)?;
            let mean = reduce(b, OpKind::ReduceMean, xf, -1)?;
            let d = bin(b, OpKind::Sub, xf, mean)?;
            let d2 = bin(b, OpKind::Mul, d, d)?;
            let var = reduce(b, OpKind::ReduceMean, d2, -1)?;
            let e = konst(b, eps, DType::F32)?;
            let a = bin(b, OpKind::Add, var, e)?;
            let rs = un(b, OpKind::Rsqrt, a)?;
            let h = bin(b, OpKind::Mul, d, rs)?;
            let h = cast(b, h, dtype)?;
            let hw = bin(b, OpKind::Mul, h, p[1])?;
            Ok(vec![bin(b, OpKind::Add, hw, p[2])?])
        });
        let (a, b) = run_both(&fused, &decomp, &[&x, &w, &bias]);
        // The decomposition rounds h·w before adding b (one more rounding of |h·w|), and its
        // f32 mean carries an error of up to |mean|·2⁻²⁴ that (x − mean)/σ magnifies by 1/σ
        // when the row's spread is small next to its mean: allow both on top of the usual
        // tolerance.
        let ulp = match dtype { DType::BF16 => 2f64.powi(-8), DType::F16 => 2f64.powi(-11), _ => 2f64.powi(-24) };
        let (atol, rtol) = match dtype { DType::BF16 => (1e-2, 1.6e-2), DType::F16 => (1e-3, 2e-3), _ => (1e-6, 1e-5) };
        for (i, (&g, &want)) in a.data().iter().zip(b.data()).enumerate() {
            let row = &x.data()[i / n * n..][..n];
            let mean = row.iter().sum::<f64>() / n as f64;
            let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / n as f64;
            let wi = w.data()[i % n].abs();
            let h = ((x.data()[i] - mean) / (var + eps).sqrt()).abs();
            let cancel = wi * 4.0 * mean.abs() * 2f64.powi(-24) / (var + eps).sqrt();
            let tol = atol * 2.0 + rtol * want.abs() + 2.0 * wi * h * ulp + cancel;
            prop_assert!((g - want).abs() <= tol, "layer_norm element {}: {} vs {} (tolerance {})", i, g, want, tol);
        }
    }

    #[test]
    fn swiglu_silu_and_gelu_match_their_decompositions(dtype in dtype_strategy(), n in 1usize..64, seed in any::<u64>(), scale in prop_oneof![Just(1.0), Just(8.0), Just(200.0)]) {
        let mut rng = Rng(seed);
        let g_in = rng.tensor(dtype, &[n], scale);
        let u_in = rng.tensor(dtype, &[n], 2.0);
        let params = [("g", ty(dtype, &[n])), ("u", ty(dtype, &[n]))];
        // swiglu = silu(g)·u, rounding silu first: exactly the unfused graph.
        let fused = build(&params, |b, p| Ok(vec![b.op1(OpKind::Swiglu, &[p[0], p[1]], vec![])?]));
        let decomp = build(&params, |b, p| {
            let s = un(b, OpKind::Silu, p[0])?;
            Ok(vec![bin(b, OpKind::Mul, s, p[1])?])
        });
        let (a, b) = run_both(&fused, &decomp, &[&g_in, &u_in]);
        prop_assert_eq!(a.data(), b.data());
        // silu = x·sigmoid(x).
        let fused = build(&params[..1], |b, p| Ok(vec![un(b, OpKind::Silu, p[0])?]));
        let decomp = build(&params[..1], |b, p| {
            let s = un(b, OpKind::Sigmoid, p[0])?;
            Ok(vec![bin(b, OpKind::Mul, p[0], s)?])
        });
        let (a, b) = run_both(&fused, &decomp, &[&g_in]);
        // Where sigmoid(x) is subnormal in the dtype, the decomposition keeps only a few of
        // its bits: allow |x| times the smallest subnormal.
        let sub = match dtype { DType::BF16 => 2f64.powi(-133), DType::F16 => 2f64.powi(-24), _ => 2f64.powi(-149) };
        let xmax = g_in.data().iter().fold(0.0f64, |m, v| m.max(v.abs()));
        assert_close_with(&a, &b, dtype, xmax * sub, "silu");
        // gelu, tanh form, against its formula in f32 ops.
        let fused = build(&params[..1], |b, p| Ok(vec![b.op1(OpKind::Gelu, &[p[0]], vec![("form", Attr::Str("tanh".into()))])?]));
        let decomp = build(&params[..1], |b, p| {
            let x = cast(b, p[0], DType::F32)?;
            let x2 = bin(b, OpKind::Mul, x, x)?;
            let x3 = bin(b, OpKind::Mul, x2, x)?;
            let c = konst(b, 0.044715, DType::F32)?;
            let cx3 = bin(b, OpKind::Mul, c, x3)?;
            let inner = bin(b, OpKind::Add, x, cx3)?;
            let k = konst(b, (2.0 / std::f64::consts::PI).sqrt(), DType::F32)?;
            let arg = bin(b, OpKind::Mul, k, inner)?;
            let th = un(b, OpKind::Tanh, arg)?;
            let one = konst(b, 1.0, DType::F32)?;
            let half = konst(b, 0.5, DType::F32)?;
            let s = bin(b, OpKind::Add, one, th)?;
            let hx = bin(b, OpKind::Mul, half, x)?;
            let y = bin(b, OpKind::Mul, hx, s)?;
            Ok(vec![cast(b, y, dtype)?])
        });
        let (a, b) = run_both(&fused, &decomp, &[&g_in]);
        // The f32 decomposition loses 1 + tanh(z) to cancellation for x ≪ 0 (absolute error
        // about |x|·2⁻²⁴): allow that on top of the dtype's tolerance.
        let (atol, rtol) = match dtype { DType::BF16 => (1e-2, 1.6e-2), DType::F16 => (1e-3, 2e-3), _ => (1e-6, 1e-5) };
        let max = b.data().iter().fold(0.0f64, |m, v| m.max(v.abs()));
        for (i, &x) in g_in.data().iter().enumerate() {
            let (got, want) = (a.data()[i], b.data()[i]);
            let tol = atol * max + rtol * want.abs() + x.abs() * 2f64.powi(-21) + 2f64.powi(-24);
            prop_assert!((got - want).abs() <= tol, "gelu tanh at x = {}: {} vs {}", x, got, want);
        }
        // gelu, erf form: against x/2·(1+erf(x/√2)) in f64 (erf itself is tested against its
        // series), against its written-out form with the `erf` op in f32 ops, and against the
        // tanh form, which approximates it to within 5e-4 (plus each one's rounding).
        let fused = build(&params[..1], |b, p| Ok(vec![b.op1(OpKind::Gelu, &[p[0]], vec![])?]));
        let ge = call_fn(&fused, "main", &[&g_in]).remove(0);
        let decomp = build(&params[..1], |b, p| {
            let x = cast(b, p[0], DType::F32)?;
            let k = konst(b, std::f64::consts::FRAC_1_SQRT_2, DType::F32)?;
            let a = bin(b, OpKind::Mul, x, k)?;
            let e = un(b, OpKind::Erf, a)?;
            let one = konst(b, 1.0, DType::F32)?;
            let half = konst(b, 0.5, DType::F32)?;
            let s = bin(b, OpKind::Add, one, e)?;
            let hx = bin(b, OpKind::Mul, half, x)?;
            let y = bin(b, OpKind::Mul, hx, s)?;
            Ok(vec![cast(b, y, dtype)?])
        });
        let written = call_fn(&decomp, "main", &[&g_in]).remove(0);
        // The f32 sum 1 + erf cancels for x ≪ 0 (absolute error about |x|·2⁻²⁴, as above).
        let gmax = ge.data().iter().fold(0.0f64, |m, v| m.max(v.abs()));
        for (i, &x) in g_in.data().iter().enumerate() {
            let (got, want) = (written.data()[i], ge.data()[i]);
            let tol = atol * gmax + rtol * want.abs() + x.abs() * 2f64.powi(-23) + 2f64.powi(-24);
            prop_assert!((got - want).abs() <= tol, "gelu erf written out at x = {}: {} vs {}", x, got, want);
        }
        let ulp = match dtype { DType::BF16 => 2f64.powi(-8), DType::F16 => 2f64.powi(-11), _ => 2f64.powi(-24) };
        for (i, &x) in g_in.data().iter().enumerate() {
            let want = dtype.round(0.5 * x * (1.0 + crate::interp::erf(x / std::f64::consts::SQRT_2)));
            prop_assert_eq!(ge.data()[i], want);
            let gt = a.data()[i];
            prop_assert!((ge.data()[i] - gt).abs() <= 5e-4 + 2.0 * ulp * gt.abs().max(ge.data()[i].abs()), "gelu forms at x = {}: {} vs {}", x, ge.data()[i], gt);
        }
    }
}

/// Configuration of one attention test case.
#[derive(Clone, Debug)]
struct Attn {
    dtype: DType,
    batch: usize,
    heads: usize,
    kv_heads: usize,
    sq: usize,
    skv: usize,
    d: usize,
    dv: usize,
    causal: bool,
    /// 0: none, 1: [Sq, Skv], 2: [B, 1, Sq, Skv].
    mask: u8,
    scale: f64,
    big: bool,
    seed: u64,
}

fn attn_strategy() -> impl Strategy<Value = Attn> {
    (
        dtype_strategy(),
        1usize..3,
        prop_oneof![Just((1usize, 1usize)), Just((2, 1)), Just((4, 2)), Just((4, 4)), Just((8, 2))],
        (1usize..6, prop_oneof![3 => 0usize..10, 1 => 10usize..48]),
        (prop_oneof![Just(1usize), Just(2), Just(4), Just(8)], prop_oneof![Just(1usize), Just(3), Just(4)]),
        (any::<bool>(), 0u8..3, any::<bool>()),
        any::<u64>(),
    )
        .prop_map(|(dtype, batch, (heads, kv_heads), (sq, skv), (d, dv), (causal, mask, big), seed)| Attn {
            dtype,
            batch,
            heads,
            kv_heads,
            sq,
            skv,
            d,
            dv,
            causal,
            mask,
            scale: 1.0 / (d as f64).sqrt(),
            big,
            seed,
        })
}

fn attn_attrs(c: &Attn) -> Vec<(&'static str, Attr)> {
    vec![
        ("scale", Attr::Float(c.scale)),
        ("causal", Attr::Bool(c.causal)),
        ("heads", Attr::Int(c.heads as i64)),
        ("kv_heads", Attr::Int(c.kv_heads as i64)),
    ]
}

/// `k [B, Hkv, S, X]` repeated to `[B, H, S, X]` (query head h reads KV head h / G).
fn repeat_kv(b: B<'_>, k: Value, c: &Attn, s: usize, x: usize) -> Result<Value, BuildError> {
    let g = c.heads / c.kv_heads;
    let r = b.op1(OpKind::Reshape, &[k], vec![("shape", dims(&[c.batch, c.kv_heads, 1, s, x]))])?;
    let r = b.op1(OpKind::Broadcast, &[r], vec![("shape", dims(&[c.batch, c.kv_heads, g, s, x]))])?;
    b.op1(OpKind::Reshape, &[r], vec![("shape", dims(&[c.batch, c.heads, s, x]))])
}

/// softmax(scale·QKᵀ + mask)·V in f32, with an explicit causal mask from iota/ge/select.
fn attention_decomposed(b: B<'_>, p: &[Value], c: &Attn) -> Result<Value, BuildError> {
    let f = DType::F32;
    let q = cast(b, p[0], f)?;
    let k = cast(b, p[1], f)?;
    let v = cast(b, p[2], f)?;
    let k = repeat_kv(b, k, c, c.skv, c.d)?;
    let v = repeat_kv(b, v, c, c.skv, c.dv)?;
    let s = b.op1(OpKind::Matmul, &[q, k], vec![("transpose_b", Attr::Bool(true))])?;
    let sc = konst(b, c.scale, f)?;
    let mut s = bin(b, OpKind::Mul, s, sc)?;
    if let Some(&m) = p.get(3) {
        let m = cast(b, m, f)?;
        s = bin(b, OpKind::Add, s, m)?;
    }
    if c.causal {
        let shape = dims(&[c.sq, c.skv]);
        let i = b.op1(OpKind::Iota, &[], vec![("dtype", Attr::DType(DType::I32)), ("shape", shape.clone()), ("axis", Attr::Int(0))])?;
        let j = b.op1(OpKind::Iota, &[], vec![("dtype", Attr::DType(DType::I32)), ("shape", shape), ("axis", Attr::Int(1))])?;
        let off = konst(b, c.skv as f64 - c.sq as f64, DType::I32)?;
        let last = bin(b, OpKind::Add, i, off)?;
        let visible = bin(b, OpKind::Ge, last, j)?;
        let ninf = konst(b, f64::NEG_INFINITY, f)?;
        s = b.op1(OpKind::Select, &[visible, s, ninf], vec![])?;
    }
    let pr = b.op1(OpKind::Softmax, &[s], vec![])?;
    let o = b.op1(OpKind::Matmul, &[pr, v], vec![])?;
    cast(b, o, c.dtype)
}

fn attn_inputs(c: &Attn) -> Vec<Tensor> {
    let mut rng = Rng(c.seed);
    let amp = if c.big { 6.0 } else { 1.5 };
    let q = rng.tensor(c.dtype, &[c.batch, c.heads, c.sq, c.d], amp);
    let k = rng.tensor(c.dtype, &[c.batch, c.kv_heads, c.skv, c.d], amp);
    let v = rng.tensor(c.dtype, &[c.batch, c.kv_heads, c.skv, c.dv], 2.0);
    let mut out = vec![q, k, v];
    let mshape: Option<Vec<usize>> = match c.mask {
        1 => Some(vec![c.sq, c.skv]),
        2 => Some(vec![c.batch, 1, c.sq, c.skv]),
        _ => None,
    };
    if let Some(ms) = mshape {
        out.push(Tensor::from_fn(c.dtype, &ms, |_| {
            let r = rng.next();
            if r < -0.4 {
                f64::NEG_INFINITY
            } else {
                r * 3.0
            }
        }));
    }
    out
}

/// True when no key is visible to query row (b, h, i): causal limit and mask together.
fn row_fully_masked(c: &Attn, inputs: &[Tensor], b: usize, i: usize) -> bool {
    let lim = if c.causal { (i as i64 + c.skv as i64 - c.sq as i64 + 1).clamp(0, c.skv as i64) as usize } else { c.skv };
    (0..lim).all(|j| match (c.mask, inputs.get(3)) {
        (1, Some(m)) => m.get(&[i, j]) == Some(f64::NEG_INFINITY),
        (2, Some(m)) => m.get(&[b, 0, i, j]) == Some(f64::NEG_INFINITY),
        _ => false,
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn attention_matches_its_decomposition(c in attn_strategy()) {
        let inputs = attn_inputs(&c);
        let mut params = vec![
            ("q", ty(c.dtype, &[c.batch, c.heads, c.sq, c.d])),
            ("k", ty(c.dtype, &[c.batch, c.kv_heads, c.skv, c.d])),
            ("v", ty(c.dtype, &[c.batch, c.kv_heads, c.skv, c.dv])),
        ];
        if let Some(m) = inputs.get(3) {
            params.push(("mask", ty(c.dtype, m.shape())));
        }
        let fused = build(&params, |b, p| Ok(vec![b.op1(OpKind::Attention, p, attn_attrs(&c))?]));
        let decomp = build(&params, |b, p| Ok(vec![attention_decomposed(b, p, &c)?]));
        let refs: Vec<&Tensor> = inputs.iter().collect();
        let (a, r) = run_both(&fused, &decomp, &refs);
        // With large scores (`big`) the f32 decomposition rounds exp(s − max) and the row sum
        // in f32 over up to 47 keys; its error reaches a few 1e-6·max|ref| where the fused op,
        // computed in f64, has none. Widen the absolute tolerance to 1e-5·max|ref| there.
        let max = r.data().iter().filter(|v| v.is_finite()).fold(0.0f64, |m, v| m.max(v.abs()));
        let extra = if c.big && c.dtype == DType::F32 { 1e-5 * max } else { 0.0 };
        assert_close_with(&a, &r, c.dtype, extra, &format!("attention {c:?}"));
        for b in 0..c.batch {
            for h in 0..c.heads {
                for i in 0..c.sq {
                    if row_fully_masked(&c, &inputs, b, i) {
                        for x in 0..c.dv {
                            prop_assert_eq!(a.get(&[b, h, i, x]), Some(0.0));
                            prop_assert_eq!(r.get(&[b, h, i, x]), Some(0.0));
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn attention_nan_propagates_like_the_decomposition() {
    let c = Attn { dtype: DType::F32, batch: 1, heads: 2, kv_heads: 1, sq: 3, skv: 5, d: 2, dv: 2, causal: true, mask: 0, scale: 0.7, big: false, seed: 3 };
    let mut inputs = attn_inputs(&c);
    // A NaN key at position 3: visible to query rows 1 and 2 (j ≤ i + 2), hidden from row 0.
    let k = Tensor::from_fn(DType::F32, &[1, 1, 5, 2], |i| if i[2] == 3 { f64::NAN } else { inputs[1].get(i).unwrap_or(0.0) });
    inputs[1] = k;
    let params = [("q", ty(DType::F32, &[1, 2, 3, 2])), ("k", ty(DType::F32, &[1, 1, 5, 2])), ("v", ty(DType::F32, &[1, 1, 5, 2]))];
    let fused = build(&params, |b, p| Ok(vec![b.op1(OpKind::Attention, p, attn_attrs(&c))?]));
    let decomp = build(&params, |b, p| Ok(vec![attention_decomposed(b, p, &c)?]));
    let refs: Vec<&Tensor> = inputs.iter().collect();
    let (a, r) = run_both(&fused, &decomp, &refs);
    assert_close(&a, &r, DType::F32, "attention with NaN");
    for h in 0..2 {
        assert!(a.get(&[0, h, 0, 0]).is_some_and(f64::is_finite));
        assert!(a.get(&[0, h, 1, 0]).is_some_and(f64::is_nan) && a.get(&[0, h, 2, 1]).is_some_and(f64::is_nan));
    }
}

#[test]
fn attention_bshd_layout_equals_bhsd() {
    let c = Attn { dtype: DType::BF16, batch: 2, heads: 4, kv_heads: 2, sq: 3, skv: 6, d: 4, dv: 4, causal: true, mask: 0, scale: 0.5, big: false, seed: 11 };
    let inputs = attn_inputs(&c);
    let params = [
        ("q", ty(c.dtype, &[2, 4, 3, 4])),
        ("k", ty(c.dtype, &[2, 2, 6, 4])),
        ("v", ty(c.dtype, &[2, 2, 6, 4])),
    ];
    let g = build(&params, |b, p| {
        let direct = b.op1(OpKind::Attention, p, attn_attrs(&c))?;
        let perm = |b: B<'_>, x: Value| b.op1(OpKind::Permute, &[x], vec![("perm", Attr::Ints(vec![0, 2, 1, 3]))]);
        let (q, k, v) = (perm(b, p[0])?, perm(b, p[1])?, perm(b, p[2])?);
        let mut attrs = attn_attrs(&c);
        attrs.push(("layout", Attr::Str("bshd".into())));
        let o = b.op1(OpKind::Attention, &[q, k, v], attrs)?;
        let back = perm(b, o)?;
        Ok(vec![direct, back])
    });
    let refs: Vec<&Tensor> = inputs.iter().collect();
    let out = call_fn(&g, "main", &refs);
    assert_eq!(out[0], out[1]);
}

/// Paged-attention case: per-sequence lengths, pages handed out in a scrambled order, unused
/// rows and pages full of NaN (so that reading one shows).
#[derive(Clone, Debug)]
struct Paged {
    dtype: DType,
    heads: usize,
    kv_heads: usize,
    page_size: usize,
    lens: Vec<usize>,
    t: usize,
    d: usize,
    causal: bool,
    seed: u64,
}

fn paged_strategy() -> impl Strategy<Value = Paged> {
    (
        dtype_strategy(),
        prop_oneof![Just((1usize, 1usize)), Just((4, 2)), Just((8, 2))],
        1usize..5,
        prop::collection::vec(prop_oneof![3 => 0usize..11, 1 => 11usize..40], 1..4),
        1usize..4,
        prop_oneof![Just(2usize), Just(4)],
        any::<bool>(),
        any::<u64>(),
    )
        .prop_map(|(dtype, (heads, kv_heads), page_size, lens, t, d, causal, seed)| Paged { dtype, heads, kv_heads, page_size, lens, t, d, causal, seed })
}

/// The paged inputs (q, k_pages, v_pages, block_table, seq_lens) and, per sequence, the dense
/// K and V `[1, Hkv, len, D]` gathered from them.
fn paged_inputs(c: &Paged) -> (Vec<Tensor>, Vec<(Tensor, Tensor)>) {
    let mut rng = Rng(c.seed);
    let s = c.page_size;
    let need: Vec<usize> = c.lens.iter().map(|l| l.div_ceil(s)).collect();
    let max_pages = need.iter().copied().max().unwrap_or(0) + 1;
    let pages = need.iter().sum::<usize>() + 2;
    // Hand out pages in a scrambled order: page ids p·7 mod P over a prime-ish stride.
    let mut order: Vec<usize> = (0..pages).collect();
    order.sort_by_key(|&p| (p * 7 + 3) % pages);
    let mut next = order.into_iter();
    let bsz = c.lens.len();
    let mut table = vec![-1.0; bsz * max_pages];
    for (b, &n) in need.iter().enumerate() {
        for col in 0..n {
            table[b * max_pages + col] = next.next().unwrap_or(0) as f64;
        }
    }
    let hkv = c.kv_heads;
    let mut kp = vec![f64::NAN; pages * s * hkv * c.d];
    let mut vp = vec![f64::NAN; pages * s * hkv * c.d];
    let mut dense = Vec::new();
    for (b, &len) in c.lens.iter().enumerate() {
        let k = rng.tensor(c.dtype, &[1, hkv, len, c.d], 2.0);
        let v = rng.tensor(c.dtype, &[1, hkv, len, c.d], 2.0);
        for j in 0..len {
            let page = table[b * max_pages + j / s] as usize;
            for g in 0..hkv {
                for x in 0..c.d {
                    let at = ((page * s + j % s) * hkv + g) * c.d + x;
                    kp[at] = k.get(&[0, g, j, x]).unwrap_or(0.0);
                    vp[at] = v.get(&[0, g, j, x]).unwrap_or(0.0);
                }
            }
        }
        dense.push((k, v));
    }
    let q = rng.tensor(c.dtype, &[bsz, c.heads, c.t, c.d], 2.0);
    let inputs = vec![
        q,
        t(c.dtype, &[pages, s, hkv, c.d], kp),
        t(c.dtype, &[pages, s, hkv, c.d], vp),
        t(DType::I32, &[bsz, max_pages], table),
        t(DType::I32, &[bsz], c.lens.iter().map(|&l| l as f64).collect()),
    ];
    (inputs, dense)
}

fn paged_graph(c: &Paged, shapes: &[&[usize]]) -> Graph {
    paged_graph_with(c, shapes, None)
}

/// [`paged_graph`], with `unified_max` given when `unified_max` is.
fn paged_graph_with(c: &Paged, shapes: &[&[usize]], unified_max: Option<f64>) -> Graph {
    let params = [
        ("q", ty(c.dtype, shapes[0])),
        ("k_pages", ty(c.dtype, shapes[1])),
        ("v_pages", ty(c.dtype, shapes[2])),
        ("block_table", ty(DType::I32, shapes[3])),
        ("seq_lens", ty(DType::I32, shapes[4])),
    ];
    build(&params, |b, p| {
        let attrs = vec![
            ("scale", Attr::Float(1.0 / (c.d as f64).sqrt())),
            ("causal", Attr::Bool(c.causal)),
            ("heads", Attr::Int(c.heads as i64)),
            ("kv_heads", Attr::Int(c.kv_heads as i64)),
        ];
        let attrs = attrs.into_iter().chain(unified_max.map(|phi| ("unified_max", Attr::Float(phi)))).collect();
        Ok(vec![b.op1(OpKind::PagedAttention, p, attrs)?])
    })
}

/// Dense attention of sequence `b`'s queries over its gathered keys.
fn dense_for(c: &Paged, q: &Tensor, b: usize, k: &Tensor, v: &Tensor) -> Tensor {
    let len = c.lens[b];
    let a = Attn { dtype: c.dtype, batch: 1, heads: c.heads, kv_heads: c.kv_heads, sq: c.t, skv: len, d: c.d, dv: c.d, causal: c.causal, mask: 0, scale: 1.0 / (c.d as f64).sqrt(), big: false, seed: 0 };
    let params = [
        ("q", ty(c.dtype, &[1, c.heads, c.t, c.d])),
        ("k", ty(c.dtype, &[1, c.kv_heads, len, c.d])),
        ("v", ty(c.dtype, &[1, c.kv_heads, len, c.d])),
    ];
    let g = build(&params, |bd, p| Ok(vec![bd.op1(OpKind::Attention, p, attn_attrs(&a))?]));
    let qb = Tensor::from_fn(c.dtype, &[1, c.heads, c.t, c.d], |i| q.get(&[b, i[1], i[2], i[3]]).unwrap_or(0.0));
    call_fn(&g, "main", &[&qb, k, v]).remove(0)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn paged_attention_matches_dense_attention(c in paged_strategy()) {
        let (inputs, dense) = paged_inputs(&c);
        let shapes: Vec<&[usize]> = inputs.iter().map(Tensor::shape).collect();
        let g = paged_graph(&c, &shapes);
        let refs: Vec<&Tensor> = inputs.iter().collect();
        let out = call_fn(&g, "main", &refs).remove(0);
        for (b, (k, v)) in dense.iter().enumerate() {
            let want = dense_for(&c, &inputs[0], b, k, v);
            // The same inner routine over the same keys in the same order: bit-identical.
            for h in 0..c.heads {
                for i in 0..c.t {
                    for x in 0..c.d {
                        let (g_, w_) = (out.get(&[b, h, i, x]), want.get(&[0, h, i, x]));
                        prop_assert!(g_ == w_ || g_.zip(w_).is_some_and(|(a, b)| a.is_nan() && b.is_nan()), "b {} h {} i {} x {}: {:?} vs {:?}", b, h, i, x, g_, w_);
                    }
                }
            }
            prop_assert!(out.data().iter().all(|v| !v.is_nan()), "NaN read from an unused page row");
        }
    }
}

#[test]
fn paged_attention_with_a_partly_filled_last_page() {
    // Page size 4, 6 keys: page 3 full, page 1 holding 2 keys and 2 rows of NaN.
    let c = Paged { dtype: DType::F32, heads: 4, kv_heads: 2, page_size: 4, lens: vec![6], t: 2, d: 4, causal: true, seed: 5 };
    let (inputs, dense) = paged_inputs(&c);
    let kp = &inputs[1];
    assert!(kp.data().iter().any(|v| v.is_nan()), "the test needs unused NaN rows");
    let shapes: Vec<&[usize]> = inputs.iter().map(Tensor::shape).collect();
    let g = paged_graph(&c, &shapes);
    let refs: Vec<&Tensor> = inputs.iter().collect();
    let out = call_fn(&g, "main", &refs).remove(0);
    let want = dense_for(&c, &inputs[0], 0, &dense[0].0, &dense[0].1);
    assert_eq!(out.data(), want.data());
    assert!(out.data().iter().all(|v| v.is_finite()));
}

/// `unified_max` is an execution strategy (FlashDecoding++'s unified-max softmax): the
/// interpreter's result is bit-identical with it, for φ near the scores, far below and far
/// above them.
#[test]
fn paged_attention_ignores_unified_max() {
    let c = Paged { dtype: DType::BF16, heads: 4, kv_heads: 2, page_size: 4, lens: vec![6, 0, 11], t: 2, d: 8, causal: true, seed: 7 };
    let (inputs, _) = paged_inputs(&c);
    let shapes: Vec<&[usize]> = inputs.iter().map(Tensor::shape).collect();
    let refs: Vec<&Tensor> = inputs.iter().collect();
    let plain = call_fn(&paged_graph(&c, &shapes), "main", &refs).remove(0);
    for phi in [1.0, -1e4, 1e4] {
        let g = paged_graph_with(&c, &shapes, Some(phi));
        let text = crate::text::print(&g);
        assert!(text.contains(&format!("unified_max={phi:?}")), "{text}");
        let out = call_fn(&g, "main", &refs).remove(0);
        assert!(out.data().iter().zip(plain.data()).all(|(a, b)| a.to_bits() == b.to_bits()), "unified_max={phi} changed the result");
    }
}

#[test]
fn kv_append_then_paged_attention_round_trip() {
    // Two sequences: a prefill of 5 tokens (starting at 0) and of 3 tokens, then a decode
    // step of 2 tokens each, then paged attention of the decode queries over all keys,
    // compared with dense `bshd` attention over the concatenated keys.
    let (hkv, heads, d, s) = (2usize, 4usize, 4usize, 2usize);
    let pages = 12usize;
    let dt = DType::BF16;
    let mut rng = Rng(99);
    let k0 = rng.tensor(dt, &[2, 5, hkv, d], 2.0);
    let v0 = rng.tensor(dt, &[2, 5, hkv, d], 2.0);
    let k1 = rng.tensor(dt, &[2, 2, hkv, d], 2.0);
    let v1 = rng.tensor(dt, &[2, 2, hkv, d], 2.0);
    let q = rng.tensor(dt, &[2, heads, 2, d], 2.0);
    // Sequence 1 only uses 3 of its 5 prefill rows: start_pos and seq_lens say so.
    let table = t(DType::I32, &[2, 4], vec![7.0, 2.0, 9.0, 11.0, 0.0, 5.0, 3.0, -1.0]);
    let start0 = t(DType::I32, &[2], vec![0.0, 0.0]);
    let start1 = t(DType::I32, &[2], vec![5.0, 3.0]);
    let lens = t(DType::I32, &[2], vec![7.0, 5.0]);
    let empty = Tensor::full(dt, &[pages, s, hkv, d], f64::NAN);
    let pt = ty(dt, &[pages, s, hkv, d]);
    let params = [
        ("kp", pt.clone()),
        ("vp", pt),
        ("k0", ty(dt, &[2, 5, hkv, d])),
        ("v0", ty(dt, &[2, 5, hkv, d])),
        ("k1", ty(dt, &[2, 2, hkv, d])),
        ("v1", ty(dt, &[2, 2, hkv, d])),
        ("bt", ty(DType::I32, &[2, 4])),
        ("s0", ty(DType::I32, &[2])),
        ("s1", ty(DType::I32, &[2])),
        ("lens", ty(DType::I32, &[2])),
        ("q", ty(dt, &[2, heads, 2, d])),
    ];
    let attrs = || vec![("scale", Attr::Float(0.5)), ("heads", Attr::Int(heads as i64)), ("kv_heads", Attr::Int(hkv as i64))];
    let g = build(&params, |b, p| {
        let r = b.op(OpKind::KvAppend, &[p[0], p[1], p[2], p[3], p[6], p[7]], vec![])?;
        let r = b.op(OpKind::KvAppend, &[r[0], r[1], p[4], p[5], p[6], p[8]], vec![])?;
        Ok(vec![b.op1(OpKind::PagedAttention, &[p[10], r[0], r[1], p[6], p[9]], attrs())?])
    });
    let out = call_fn(&g, "main", &[&empty, &empty, &k0, &v0, &k1, &v1, &table, &start0, &start1, &lens, &q]).remove(0);
    assert!(out.data().iter().all(|v| v.is_finite()), "{:?}", out.data());
    for (b, len0) in [(0usize, 5usize), (1, 3)] {
        let len = len0 + 2;
        let gather = |a: &Tensor, z: &Tensor| {
            Tensor::from_fn(dt, &[1, len, hkv, d], |i| if i[1] < len0 { a.get(&[b, i[1], i[2], i[3]]) } else { z.get(&[b, i[1] - len0, i[2], i[3]]) }.unwrap_or(f64::NAN))
        };
        let (k, v) = (gather(&k0, &k1), gather(&v0, &v1));
        let qb = Tensor::from_fn(dt, &[1, 2, heads, d], |i| q.get(&[b, i[2], i[1], i[3]]).unwrap_or(f64::NAN));
        let dense = build(
            &[("q", ty(dt, &[1, 2, heads, d])), ("k", ty(dt, &[1, len, hkv, d])), ("v", ty(dt, &[1, len, hkv, d]))],
            |bd, p| {
                let mut a = attrs();
                a.push(("causal", Attr::Bool(true)));
                a.push(("layout", Attr::Str("bshd".into())));
                Ok(vec![bd.op1(OpKind::Attention, p, a)?])
            },
        );
        let want = call_fn(&dense, "main", &[&qb, &k, &v]).remove(0);
        for h in 0..heads {
            for i in 0..2 {
                for x in 0..d {
                    assert_eq!(out.get(&[b, h, i, x]), want.get(&[0, i, h, x]), "b {b} h {h} i {i} x {x}");
                }
            }
        }
    }
}
