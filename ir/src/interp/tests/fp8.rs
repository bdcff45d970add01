//! `f8e4m3` in the interpreter: `quantize_fp8` / `dequantize_fp8` with per-tensor scales, the
//! fp8 matmul written as `matmul(dequantize_fp8(a8), dequantize_fp8(b8))` against an f64
//! reference, casts, the text format, and the errors for misuse.

use proptest::prelude::*;

use super::*;
use crate::dtype::f8e4m3_to_f64;
use crate::interp::Site;
use crate::{print, OpKind};

/// The spacing of f8e4m3 values around `v` (its binade's quantum; 2⁻⁹ among subnormals).
fn f8_ulp(v: f64) -> f64 {
    let e = if v.abs() >= 2f64.powi(-6) { v.abs().log2().floor() as i32 } else { -6 };
    2f64.powi(e - 3)
}

const ROUND_TRIP: &str = "func @main(%x: f32[N], %s: f32[]) {
  %q: f8e4m3[N] = quantize_fp8(%x, %s)
  %y: f32[N] = dequantize_fp8(%q, %s) {dtype=f32}
  return %q, %y
}";

#[test]
fn quantize_divides_rounds_and_saturates() {
    // x / 0.5 = 2x, then nearest even with saturation.
    let s = Tensor::scalar(DType::F32, 0.5);
    let xs = vec![0.0, -0.0, 0.25, 0.046875, 100.0, 224.0, 224.1, 1e6, -1e6, f64::INFINITY, f64::NEG_INFINITY, f64::NAN, 2f64.powi(-11)];
    let want = [0.0, -0.0, 0.5, 0.09375, 192.0, 448.0, 448.0, 448.0, -448.0, 448.0, -448.0, f64::NAN, 0.0];
    let x = t(DType::F32, &[xs.len()], xs);
    let out = eval(ROUND_TRIP, &[&x, &s]);
    let (q, y) = (&out[0], &out[1]);
    assert_eq!((q.dtype(), y.dtype()), (DType::F8E4M3, DType::F32));
    for (i, (&g, &w)) in q.data().iter().zip(&want).enumerate() {
        // 200 is halfway between 192 (mantissa 100) and 208 (101): even; 2^-10 is halfway
        // between 0 and the smallest subnormal: 0; ±inf saturate (satfinite), NaN stays.
        assert!(g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()), "element {i}: {g} vs {w}");
    }
    let back: Vec<f64> = want.iter().map(|w| w * 0.5).collect();
    for (i, (&g, &w)) in y.data().iter().zip(&back).enumerate() {
        assert!(g == w || (g.is_nan() && w.is_nan()), "element {i}: {g} vs {w}");
    }
    // A zero scale divides by zero: ±inf saturates, 0/0 is NaN.
    let out = eval(ROUND_TRIP, &[&t(DType::F32, &[2], vec![3.0, 0.0]), &Tensor::scalar(DType::F32, 0.0)]);
    assert_eq!(out[0].data()[0], 448.0);
    assert!(out[0].data()[1].is_nan());
}

#[test]
fn dequantize_multiplies_in_f32_then_rounds_to_the_dtype() {
    let src = "func @main(%q: f8e4m3[4], %s: f32[]) {
  %a: f32[4] = dequantize_fp8(%q, %s) {dtype=f32}
  %b: bf16[4] = dequantize_fp8(%q, %s) {dtype=bf16}
  %c: f16[4] = dequantize_fp8(%q, %s) {dtype=f16}
  return %a, %b, %c
}";
    let codes = [0x38u8, 0x7E, 0x01, 0xFF];
    let q = t(DType::F8E4M3, &[4], codes.iter().map(|&b| f8e4m3_to_f64(b)).collect());
    let s = 0.1f32;
    let out = eval(src, &[&q, &Tensor::scalar(DType::F32, f64::from(s))]);
    for (i, &b) in codes.iter().enumerate() {
        let v = f8e4m3_to_f64(b);
        let f32_product = (v as f32 * s) as f64;
        let want = [f32_product, DType::BF16.round(f32_product), DType::F16.round(f32_product)];
        for (o, w) in out.iter().zip(want) {
            let g = o.data()[i];
            assert!(g == w || (g.is_nan() && w.is_nan()), "{:?} element {i}: {g} vs {w}", o.dtype());
        }
    }
    // 448 · 0.1 in f32 is not 44.8 in f64: the product is rounded to f32 first.
    assert_eq!(out[0].data()[1], (448.0f32 * 0.1f32) as f64);
}

#[test]
fn casts_to_f8e4m3_saturate_and_from_it_are_exact() {
    let src = "func @main(%x: bf16[6]) {
  %q: f8e4m3[6] = cast(%x) {dtype=f8e4m3}
  %y: f32[6] = cast(%q) {dtype=f32}
  %i: i32[6] = cast(%q) {dtype=i32}
  return %y, %i
}";
    let x = t(DType::BF16, &[6], vec![1.0625, 1.1875, 500.0, -70000.0, 0.001, f64::NAN]);
    let out = eval(src, &[&x]);
    let y = out[0].data();
    assert_eq!(&y[..5], &[1.0, 1.25, 448.0, -448.0, 2f64.powi(-9)]);
    assert!(y[5].is_nan());
    assert_eq!(out[1].data(), &[1.0, 1.0, 448.0, -448.0, 0.0, 0.0]);
    // A constant rounds to f8e4m3 as a cast does.
    let src = "func @main() {\n  %c: f8e4m3[2] = constant() {value=1000.0, dtype=f8e4m3, shape=[2]}\n  return %c\n}";
    assert_eq!(eval1(src, &[]).data(), &[448.0, 448.0]);
}

#[test]
fn layout_ops_move_f8e4m3_exactly() {
    let src = "func @main(%q: f8e4m3[2, 3], %i: i32[2], %c: bool[3, 2]) {
  %t: f8e4m3[3, 2] = transpose(%q)
  %g: f8e4m3[2, 3] = gather(%q, %i)
  %k: f8e4m3[4, 3] = concat(%q, %g) {axis=0}
  %s: f8e4m3[3, 2] = select(%c, %t, %t)
  %r: f8e4m3[12] = reshape(%k) {shape=[12]}
  return %s, %r
}";
    let vals = [0.5, -2.0, 448.0, 0.0, 2f64.powi(-9), -0.75];
    let q = t(DType::F8E4M3, &[2, 3], vals.to_vec());
    let out = eval(src, &[&q, &t(DType::I32, &[2], vec![1.0, 0.0]), &Tensor::full(DType::Bool, &[3, 2], 1.0)]);
    assert_eq!(out[0].data(), &[0.5, 0.0, -2.0, 2f64.powi(-9), 448.0, -0.75]);
    let mut want = vals.to_vec();
    want.extend([0.0, 2f64.powi(-9), -0.75, 0.5, -2.0, 448.0]);
    assert_eq!(out[1].data(), &want[..]);
}

#[test]
fn fp8_matmul_agrees_with_an_f64_reference() {
    // A [M, K] and B [N, K] (K-major, as FP8 tensor cores read them) in f8e4m3 with
    // per-tensor scales; the product in f32 and in bf16.
    let (m, n, k) = (3usize, 5usize, 64usize);
    let mut rng = Rng(7);
    let a8 = Tensor::from_fn(DType::F8E4M3, &[m, k], |_| rng.next() * 448.0);
    let b8 = Tensor::from_fn(DType::F8E4M3, &[n, k], |_| rng.next() * 300.0);
    let (sa, sb) = (0.0123f32, 3.7e-3f32);
    for dt in [DType::F32, DType::BF16] {
        let src = format!(
            "func @main(%a8: f8e4m3[{m}, {k}], %sa: f32[], %b8: f8e4m3[{n}, {k}], %sb: f32[]) {{
  %a: {dt}[{m}, {k}] = dequantize_fp8(%a8, %sa) {{dtype={dt}}}
  %b: {dt}[{n}, {k}] = dequantize_fp8(%b8, %sb) {{dtype={dt}}}
  %y: {dt}[{m}, {n}] = matmul(%a, %b) {{transpose_b=true}}
  return %y
}}"
        );
        let y = eval1(&src, &[&a8, &Tensor::scalar(DType::F32, f64::from(sa)), &b8, &Tensor::scalar(DType::F32, f64::from(sb))]);
        // The graph's meaning, in f64: operands dequantised (f32 product, rounded to dt), then
        // one rounding of the exact-ish sum.
        let deq = |x: f64, s: f32| dt.round((x as f32 * s) as f64);
        let graph_ref = Tensor::from_fn(dt, &[m, n], |i| {
            (0..k).map(|kk| deq(a8.data()[i[0] * k + kk], sa) * deq(b8.data()[i[1] * k + kk], sb)).sum::<f64>()
        });
        assert_close(&y, &graph_ref, dt, &format!("{dt} fp8 matmul vs the graph in f64"));
        // What a fused FP8 kernel computes — Σ a8·b8 (exact products, f32-or-better
        // accumulation), scaled by sa·sb once — agrees within the dtype's tolerance.
        let fused = Tensor::from_fn(dt, &[m, n], |i| {
            let acc: f64 = (0..k).map(|kk| a8.data()[i[0] * k + kk] * b8.data()[i[1] * k + kk]).sum();
            acc * f64::from(sa) * f64::from(sb)
        });
        let tol = if dt == DType::F32 { DType::BF16 } else { dt };
        assert_close(&y, &fused, tol, &format!("{dt} fp8 matmul vs the scaled fp8 product"));
    }
}

#[test]
fn fp8_graphs_print_and_parse_back() {
    let src = "func @main(%x: bf16[T, 64], %sx: f32[], %w8: f8e4m3[32, 64], %sw: f32[]) {
  %x8: f8e4m3[T, 64] = quantize_fp8(%x, %sx)
  %a: bf16[T, 64] = dequantize_fp8(%x8, %sx) {dtype=bf16}
  %b: bf16[32, 64] = dequantize_fp8(%w8, %sw) {dtype=bf16}
  %y: bf16[T, 32] = matmul(%a, %b) {transpose_b=true}
  %c: f8e4m3[T, 32] = cast(%y) {dtype=f8e4m3}
  return %c
}";
    let g = graph(src);
    assert_eq!(print(&g).trim(), src.trim());
    assert_eq!(parse(&print(&g)).unwrap(), g);
    let f = g.entry().unwrap();
    let kinds: Vec<OpKind> = f.nodes.values().map(|n| n.op.kind).collect();
    assert_eq!(kinds, [OpKind::QuantizeFp8, OpKind::DequantizeFp8, OpKind::DequantizeFp8, OpKind::Matmul, OpKind::Cast]);
}

/// The verifier's message for `src`.
fn verify_err(src: &str) -> String {
    let g = parse(src).unwrap_or_else(|e| panic!("parse: {e}"));
    verify(&g).expect_err("the verifier refuses it").to_string()
}

#[test]
fn misuse_is_an_error_naming_the_node_and_the_operand() {
    // A scale that is not one f32 per tensor.
    let e = verify_err("func @f(%x: f32[4, 8], %s: f32[4]) {\n  %q: f8e4m3[4, 8] = quantize_fp8(%x, %s)\n  return %q\n}");
    assert_eq!(e, "in @f, n0 %q = `quantize_fp8`(f32[4, 8], f32[4]): the scale of `quantize_fp8` is one f32 per tensor, a scalar f32[]: operand 1 (`scale`) is f32[4]");
    let e = verify_err("func @f(%q: f8e4m3[4], %s: bf16[]) {\n  %y: f32[4] = dequantize_fp8(%q, %s) {dtype=f32}\n  return %y\n}");
    assert!(e.contains("n0 %y = `dequantize_fp8`") && e.contains("operand 1 (`scale`) is bf16[]"), "{e}");
    // Arithmetic on fp8, and a matmul of fp8 operands.
    let e = verify_err("func @f(%a: f8e4m3[4], %b: f8e4m3[4]) {\n  %y: f8e4m3[4] = add(%a, %b)\n  return %y\n}");
    assert!(e.starts_with("in @f, n0 %y = `add`(f8e4m3[4], f8e4m3[4]): `add` does not compute on f8e4m3 (a storage type): operand 0 (`a`) is f8e4m3[4]"), "{e}");
    let e = verify_err("func @f(%a: bf16[2, 4], %b: f8e4m3[3, 4]) {\n  %y: bf16[2, 3] = matmul(%a, %b) {transpose_b=true}\n  return %y\n}");
    assert!(e.contains("`matmul` does not compute on f8e4m3") && e.contains("operand 1 (`b`) is f8e4m3[3, 4]") && e.contains("dequantize_fp8(a8, sa)"), "{e}");
    let e = verify_err("func @f(%a: f8e4m3[2, 4]) {\n  %y: f8e4m3[2, 1] = reduce_max(%a)\n  return %y\n}");
    assert!(e.contains("`reduce_max` does not compute on f8e4m3") && e.contains("operand 0 (`x`)"), "{e}");
    // Reading something that is not fp8, or producing fp8 where only quantize/cast may.
    let e = verify_err("func @f(%x: bf16[4], %s: f32[]) {\n  %y: f32[4] = dequantize_fp8(%x, %s) {dtype=f32}\n  return %y\n}");
    assert!(e.contains("`dequantize_fp8` reads an f8e4m3 tensor: operand 0 (`x`) is bf16[4]"), "{e}");
    let e = verify_err("func @f(%q: f8e4m3[4], %s: f32[]) {\n  %y: f8e4m3[4] = dequantize_fp8(%q, %s) {dtype=f8e4m3}\n  return %y\n}");
    assert!(e.contains("gives a float dtype (bf16, f16, f32), not f8e4m3"), "{e}");
    let e = verify_err("func @f(%q: f8e4m3[4], %s: f32[]) {\n  %y: f8e4m3[4] = quantize_fp8(%q, %s)\n  return %y\n}");
    assert!(e.contains("`quantize_fp8` does not compute on f8e4m3 (a storage type): operand 0 (`x`) is f8e4m3[4]"), "{e}");
    let e = verify_err("func @f(%q: i32[4], %s: f32[]) {\n  %y: f8e4m3[4] = quantize_fp8(%q, %s)\n  return %y\n}");
    assert!(e.contains("`quantize_fp8` quantizes a float tensor (bf16, f16, f32): operand 0 (`x`) is i32[4]"), "{e}");
    let e = verify_err("func @f() {\n  %y: f8e4m3[4] = iota() {dtype=f8e4m3, shape=[4]}\n  return %y\n}");
    assert!(e.contains("`iota` cannot produce f8e4m3"), "{e}");
}

#[test]
fn unverified_misuse_is_an_interpreter_error_not_a_panic() {
    let run_err = |src: &str, ins: &[&Tensor]| {
        let g = parse(src).unwrap();
        run_entry(&g, ins, &Bindings::new()).expect_err("the interpreter refuses it")
    };
    let q = t(DType::F8E4M3, &[4], vec![1.0, 2.0, 3.0, 4.0]);
    let e = run_err("func @main(%a: f8e4m3[4]) {\n  %y: f8e4m3[4] = exp(%a)\n  return %y\n}", &[&q]);
    assert!(matches!(&e, InterpError::Operands { site: Site { node: Some(_), op: Some("exp"), .. }, .. }), "{e:?}");
    assert!(e.to_string().starts_with("in @main, n0 `exp`: `exp` does not compute on f8e4m3 (a storage type): operand 0 (`x`) is f8e4m3[4]"), "{e}");
    let e = run_err(
        "func @main(%x: f32[4], %s: f32[2]) {\n  %y: f8e4m3[4] = quantize_fp8(%x, %s)\n  return %y\n}",
        &[&Tensor::zeros(DType::F32, &[4]), &Tensor::zeros(DType::F32, &[2])],
    );
    assert_eq!(e.to_string(), "in @main, n0 `quantize_fp8`: the scale of `quantize_fp8` is one f32 per tensor, a scalar f32[]: operand 1 (`scale`) is f32[2]");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// quantize_fp8 then dequantize_fp8 (to f32) is within half an e4m3 ulp of x/scale,
    /// times the scale (plus the two f32 roundings), where x/scale is in range; beyond, it
    /// saturates to ±448·scale.
    #[test]
    fn quantize_then_dequantize_is_within_half_an_ulp(
        xs in proptest::collection::vec((-1.0f64..1.0, -12i32..10), 1..24),
        (sm, se) in (0.5f64..1.0, -8i32..6),
    ) {
        let s = (sm * 2f64.powi(se)) as f32 as f64;
        let data: Vec<f64> = xs.iter().map(|&(m, e)| (m * 2f64.powi(e) * s) as f32 as f64).collect();
        let x = t(DType::F32, &[data.len()], data.clone());
        let out = eval(ROUND_TRIP, &[&x, &Tensor::scalar(DType::F32, s)]);
        for (i, (&xi, &yi)) in data.iter().zip(out[1].data()).enumerate() {
            let v = xi / s;
            if v.abs() <= 448.0 {
                let bound = 0.5 * f8_ulp(v) * s + xi.abs() * 2f64.powi(-22);
                prop_assert!((yi - xi).abs() <= bound, "element {i}: x {xi} s {s}: {yi} is {} away, bound {bound}", (yi - xi).abs());
            } else {
                prop_assert_eq!(yi, (448.0 * s as f32) as f64 * xi.signum(), "element {}: saturates", i);
            }
            // The stored value is an f8e4m3 value: quantizing it again changes nothing.
            let qi = out[0].data()[i];
            prop_assert_eq!(DType::F8E4M3.round(qi).to_bits(), qi.to_bits());
        }
    }
}
