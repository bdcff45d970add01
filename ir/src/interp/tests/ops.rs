//! Hand-computed values of single ops.

use super::*;
use crate::interp::erf;

const SOFTMAX: &str = "func @main(%x: f32[R, N]) {\n  %y: f32[R, N] = softmax(%x)\n  return %y\n}";
const LOG_SOFTMAX: &str = "func @main(%x: f32[R, N]) {\n  %y: f32[R, N] = log_softmax(%x)\n  return %y\n}";

fn softmax_f32(rows: usize, data: Vec<f64>) -> Vec<f64> {
    let n = data.len() / rows;
    eval1(SOFTMAX, &[&t(DType::F32, &[rows, n], data)]).into_data()
}

#[test]
fn softmax_row_of_all_neg_inf_is_zero() {
    assert_eq!(softmax_f32(1, vec![NEG_INF; 4]), vec![0.0; 4]);
    let y = eval1(LOG_SOFTMAX, &[&t(DType::F32, &[1, 3], vec![NEG_INF; 3])]);
    assert_eq!(y.data(), &[NEG_INF; 3]);
}

#[test]
fn softmax_row_with_one_finite_value_is_one_hot() {
    assert_eq!(softmax_f32(1, vec![NEG_INF, -3.5, NEG_INF, NEG_INF]), vec![0.0, 1.0, 0.0, 0.0]);
    // log_softmax: 0 at the finite value, −inf elsewhere.
    let y = eval1(LOG_SOFTMAX, &[&t(DType::F32, &[1, 3], vec![NEG_INF, 7.0, NEG_INF])]);
    assert_eq!(y.data(), &[NEG_INF, 0.0, NEG_INF]);
}

#[test]
fn softmax_of_very_negative_finite_rows_is_valid() {
    // −1e7 and −1e7−1 are exact in f32; softmax([0, −1]) = [1/(1+e⁻¹), e⁻¹/(1+e⁻¹)].
    let y = softmax_f32(2, vec![-1e7, -1e7 - 1.0, -1e7, -1e7]);
    let a = 1.0 / (1.0 + (-1.0f64).exp());
    assert_eq!(y, vec![a as f32 as f64, (1.0 - a) as f32 as f64, 0.5, 0.5]);
    assert!((y[0] - 0.7310585786300049).abs() < 1e-7 && (y[1] - 0.2689414213699951).abs() < 1e-7);
}

#[test]
fn softmax_bf16_with_large_magnitudes() {
    let src = "func @main(%x: bf16[2, 3]) {\n  %y: bf16[2, 3] = softmax(%x)\n  return %y\n}";
    // 1e4 rounds to 9984 in bf16; e^(−19968) is 0.
    let x = t(DType::BF16, &[2, 3], vec![1e4, -1e4, 1e4, -1e4, -1e4, 0.0]);
    assert_eq!(x.data()[0], 9984.0);
    let y = eval1(src, &[&x]);
    assert_eq!(y.data(), &[0.5, 0.0, 0.5, 0.0, 0.0, 1.0]);
}

#[test]
fn softmax_rows_of_length_1_17_129() {
    for n in [1usize, 17, 129] {
        // A uniform row gives 1/n; a ramp row is checked against the textbook formula
        // exp(x_i)/Σexp(x_j) (no max subtraction: the values are small).
        let mut data = vec![0.25; n];
        data.extend((0..n).map(|j| j as f64 * 0.03 - 1.0));
        let y = softmax_f32(2, data.clone());
        let ramp = &data[n..];
        let total: f64 = ramp.iter().map(|v| (*v as f32 as f64).exp()).sum();
        for j in 0..n {
            assert_eq!(y[j], (1.0 / n as f64) as f32 as f64, "n={n} uniform j={j}");
            let want = (ramp[j] as f32 as f64).exp() / total;
            assert!((y[n + j] - want).abs() <= 1e-7 * want.max(1e-30) + 1e-12, "n={n} ramp j={j}: {} vs {want}", y[n + j]);
        }
        let s: f64 = y[n..].iter().sum();
        assert!((s - 1.0).abs() < 1e-5 * n as f64);
    }
}

#[test]
fn softmax_propagates_nan_and_follows_ieee_for_inf() {
    let y = softmax_f32(3, vec![1.0, f64::NAN, 2.0, 0.0, 0.0, 0.0, f64::INFINITY, 0.0, 1.0]);
    assert!(y[..3].iter().all(|v| v.is_nan()), "NaN row: {y:?}");
    assert_eq!(&y[3..6], &[(1.0f64 / 3.0) as f32 as f64; 3]);
    // +inf: inf − inf is NaN, so the row is NaN (IEEE, as the decomposition gives).
    assert!(y[6..].iter().all(|v| v.is_nan()), "+inf row: {y:?}");
}

#[test]
fn softmax_over_a_leading_axis() {
    let src = "func @main(%x: f32[2, 2]) {\n  %y: f32[2, 2] = softmax(%x) {axis=0}\n  return %y\n}";
    let y = eval1(src, &[&t(DType::F32, &[2, 2], vec![0.0, NEG_INF, 0.0, 5.0])]);
    assert_eq!(y.data(), &[0.5, 0.0, 0.5, 1.0]);
}

#[test]
fn reduce_max_and_min_propagate_nan() {
    let src = "func @main(%x: f32[2, 3]) {\n  %a: f32[2, 1] = reduce_max(%x)\n  %b: f32[2, 1] = reduce_min(%x)\n  %c: f32[2, 1] = reduce_sum(%x)\n  return %a, %b, %c\n}";
    let out = eval(src, &[&t(DType::F32, &[2, 3], vec![1.0, f64::NAN, 3.0, 4.0, -5.0, 6.0])]);
    assert!(out[0].data()[0].is_nan() && out[1].data()[0].is_nan() && out[2].data()[0].is_nan());
    assert_eq!((out[0].data()[1], out[1].data()[1], out[2].data()[1]), (6.0, -5.0, 5.0));
    // maximum / minimum element-wise propagate NaN too.
    let src = "func @main(%a: f32[3], %b: f32[3]) {\n  %m: f32[3] = maximum(%a, %b)\n  %n: f32[3] = minimum(%a, %b)\n  return %m, %n\n}";
    let out = eval(src, &[&t(DType::F32, &[3], vec![f64::NAN, 1.0, 2.0]), &t(DType::F32, &[3], vec![0.0, f64::NAN, -2.0])]);
    assert!(out[0].data()[0].is_nan() && out[0].data()[1].is_nan() && out[0].data()[2] == 2.0);
    assert!(out[1].data()[0].is_nan() && out[1].data()[1].is_nan() && out[1].data()[2] == -2.0);
}

#[test]
fn reductions_over_a_length_one_axis() {
    let src = "func @main(%x: f32[3, 1]) {\n  %s: f32[3] = reduce_sum(%x) {axis=1, keepdim=false}\n  %m: f32[3, 1] = reduce_max(%x) {axis=-1}\n  %a: f32[3, 1] = reduce_mean(%x) {axis=1}\n  return %s, %m, %a\n}";
    let x = t(DType::F32, &[3, 1], vec![1.5, -2.0, NEG_INF]);
    let out = eval(src, &[&x]);
    assert_eq!(out[0].shape(), &[3]);
    for o in &out {
        assert_eq!(o.data(), x.data());
    }
}

#[test]
fn reductions_over_an_empty_axis() {
    let src = "func @main(%x: f32[2, 0]) {\n  %s: f32[2, 1] = reduce_sum(%x)\n  %m: f32[2, 1] = reduce_max(%x)\n  %n: f32[2, 1] = reduce_min(%x)\n  %a: f32[2, 1] = reduce_mean(%x)\n  return %s, %m, %n, %a\n}";
    let out = eval(src, &[&t(DType::F32, &[2, 0], vec![])]);
    assert_eq!(out[0].data(), &[0.0, 0.0]);
    assert_eq!(out[1].data(), &[NEG_INF, NEG_INF]);
    assert_eq!(out[2].data(), &[f64::INFINITY, f64::INFINITY]);
    assert!(out[3].data().iter().all(|v| v.is_nan()));
}

#[test]
fn zero_size_dimensions_give_empty_results() {
    // Softmax, rms_norm, matmul, concat and slice over zero-size axes.
    let src = "func @main(%x: f32[0, 5], %w: f32[5], %a: f32[3, 0], %b: f32[0, 4], %c: f32[2, 0]) {
  %s: f32[0, 5] = softmax(%x)
  %r: f32[0, 5] = rms_norm(%x, %w) {eps=1e-6}
  %m: f32[3, 4] = matmul(%a, %b)
  %k: f32[2, 0] = concat(%c, %c) {axis=1}
  %e: f32[0, 5] = slice(%x) {axis=0, start=0, end=0}
  %g: f32[3, 2] = matmul(%a, %c) {transpose_b=true}
  return %s, %r, %m, %k, %e, %g
}";
    let out = eval(
        src,
        &[
            &t(DType::F32, &[0, 5], vec![]),
            &t(DType::F32, &[5], vec![1.0; 5]),
            &t(DType::F32, &[3, 0], vec![]),
            &t(DType::F32, &[0, 4], vec![]),
            &t(DType::F32, &[2, 0], vec![]),
        ],
    );
    assert_eq!(out[0].shape(), &[0, 5]);
    assert_eq!(out[1].numel(), 0);
    // A contraction over K = 0 is the empty sum.
    assert_eq!(out[2].data(), &[0.0; 12]);
    assert_eq!(out[3].shape(), &[2, 0]);
    assert_eq!(out[4].shape(), &[0, 5]);
    assert_eq!(out[5].data(), &[0.0; 6]);
}

#[test]
fn rms_norm_of_a_zero_row_is_zero() {
    let src = "func @main(%x: bf16[2, 4], %w: bf16[4]) {\n  %y: bf16[2, 4] = rms_norm(%x, %w) {eps=1e-6}\n  return %y\n}";
    let y = eval1(src, &[&t(DType::BF16, &[2, 4], vec![0.0, 0.0, 0.0, 0.0, 1.0, -1.0, 1.0, -1.0]), &t(DType::BF16, &[4], vec![2.0; 4])]);
    assert_eq!(&y.data()[..4], &[0.0; 4]);
    // mean(x²) = 1: h = x / sqrt(1 + 1e-6) rounds to ±1 in bf16, times 2.
    assert_eq!(&y.data()[4..], &[2.0, -2.0, 2.0, -2.0]);
}

#[test]
fn rms_norm_rounds_h_to_the_dtype_before_the_weight() {
    // x = [0.125, 0.25]: mean(x²) = 0.0390625, h₀ = 0.125/sqrt(0.0390625 + eps32) ≈ 0.632447;
    // round_bf16(h₀)·0.328125 rounds to 0.2080078125, while h₀·0.328125 would round to
    // 0.20703125.
    let src = "func @main(%x: bf16[1, 2], %w: bf16[2]) {\n  %y: bf16[1, 2] = rms_norm(%x, %w) {eps=1e-5}\n  return %y\n}";
    let y = eval1(src, &[&t(DType::BF16, &[1, 2], vec![0.125, 0.25]), &t(DType::BF16, &[2], vec![0.328125, 1.0])]);
    assert_eq!(y.data()[0], 0.2080078125);
}

#[test]
fn rms_norm_and_layer_norm_values() {
    let src = "func @main(%x: f32[1, 4], %w: f32[4], %b: f32[4]) {
  %r: f32[1, 4] = rms_norm(%x, %w) {eps=0.5}
  %l: f32[1, 4] = layer_norm(%x, %w, %b) {eps=0.5}
  return %r, %l
}";
    let x = t(DType::F32, &[1, 4], vec![1.0, 2.0, 3.0, 4.0]);
    // Weights that are not powers of two, so that rounding h first matters.
    let w = t(DType::F32, &[4], vec![1.1, 2.3, 0.7, 0.3]);
    let b = t(DType::F32, &[4], vec![0.0, 1.0, 0.0, -1.0]);
    let out = eval(src, &[&x, &w, &b]);
    // rms: mean(x²) = 7.5, r = sqrt(8); layer: mean 2.5, var 1.25, r = sqrt(1.75).
    for (i, xv) in [1.0f64, 2.0, 3.0, 4.0].into_iter().enumerate() {
        let h = (xv / 8f64.sqrt()) as f32 as f64;
        assert_eq!(out[0].data()[i], (h * w.data()[i]) as f32 as f64);
        let h = ((xv - 2.5) / 1.75f64.sqrt()) as f32 as f64;
        assert_eq!(out[1].data()[i], (h * w.data()[i] + b.data()[i]) as f32 as f64);
    }
}

#[test]
fn integer_division_truncates_toward_zero() {
    let src = "func @main(%a: i32[4], %b: i32[4]) {\n  %q: i32[4] = div(%a, %b)\n  return %q\n}";
    let q = eval1(src, &[&t(DType::I32, &[4], vec![7.0, -7.0, 7.0, -7.0]), &t(DType::I32, &[4], vec![2.0, 2.0, -2.0, -2.0])]);
    assert_eq!(q.data(), &[3.0, -3.0, -3.0, 3.0]);
}

#[test]
fn comparisons_with_nan_are_false_except_ne() {
    let src = "func @main(%a: f32[2], %b: f32[2]) {
  %e: bool[2] = eq(%a, %b)
  %n: bool[2] = ne(%a, %b)
  %l: bool[2] = lt(%a, %b)
  %g: bool[2] = ge(%a, %b)
  return %e, %n, %l, %g
}";
    let out = eval(src, &[&t(DType::F32, &[2], vec![f64::NAN, 1.0]), &t(DType::F32, &[2], vec![f64::NAN, 1.0])]);
    assert_eq!(out[0].data(), &[0.0, 1.0]);
    assert_eq!(out[1].data(), &[1.0, 0.0]);
    assert_eq!(out[2].data(), &[0.0, 0.0]);
    assert_eq!(out[3].data(), &[0.0, 1.0]);
}

#[test]
fn casts_round_truncate_and_saturate() {
    let src = "func @main(%x: f32[6]) {
  %i: i32[6] = cast(%x) {dtype=i32}
  %b: bf16[6] = cast(%x) {dtype=bf16}
  %k: bool[6] = cast(%x) {dtype=bool}
  return %i, %b, %k
}";
    let out = eval(src, &[&t(DType::F32, &[6], vec![2.9, -2.9, 1e20, f64::NAN, 0.0, 1.0 + 1.0 / 256.0])]);
    assert_eq!(out[0].data(), &[2.0, -2.0, i32::MAX as f64, 0.0, 0.0, 1.0]);
    assert_eq!(out[1].data()[5], 1.0, "ties to even");
    assert_eq!(out[2].data(), &[1.0, 1.0, 1.0, 1.0, 0.0, 1.0]);
}

#[test]
fn broadcasting_select_iota_and_constant() {
    let src = "func @main(%x: f32[2, 3]) {
  %i: i32[2, 3] = iota() {dtype=i32, shape=[2, 3], axis=1}
  %one: i32[] = constant() {value=1.0, dtype=i32}
  %c: bool[2, 3] = ge(%i, %one)
  %z: f32[3] = constant() {value=-2.5, dtype=f32, shape=[3]}
  %y: f32[2, 3] = select(%c, %x, %z)
  %s: f32[2, 3] = add(%y, %z)
  return %s
}";
    let y = eval1(src, &[&t(DType::F32, &[2, 3], vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0])]);
    assert_eq!(y.data(), &[-5.0, -0.5, 0.5, -5.0, 2.5, 3.5]);
}

#[test]
fn layout_ops_move_elements() {
    let src = "func @main(%x: f32[2, 3]) {
  %t: f32[3, 2] = transpose(%x)
  %p: f32[3, 1, 2] = reshape(%t) {shape=[3, 1, 2]}
  %q: f32[1, 2, 3] = permute(%p) {perm=[1, 2, 0]}
  %b: f32[2, 2, 3] = broadcast(%q) {shape=[2, 2, 3]}
  %s: f32[2, 2, 1] = slice(%b) {axis=2, start=1, end=2}
  %c: f32[2, 2, 4] = concat(%s, %b) {axis=-1}
  return %t, %q, %c
}";
    let out = eval(src, &[&t(DType::F32, &[2, 3], vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0])]);
    assert_eq!(out[0].data(), &[1.0, 4.0, 2.0, 5.0, 3.0, 6.0]);
    assert_eq!(out[1].data(), &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    assert_eq!(out[2].data(), &[2.0, 1.0, 2.0, 3.0, 5.0, 4.0, 5.0, 6.0, 2.0, 1.0, 2.0, 3.0, 5.0, 4.0, 5.0, 6.0]);
}

#[test]
fn gather_looks_up_rows() {
    let src = "func @main(%t: f32[4, 2], %i: i64[2, 2]) {\n  %y: f32[2, 2, 2] = gather(%t, %i)\n  return %y\n}";
    let table = t(DType::F32, &[4, 2], (0..8).map(f64::from).collect());
    let y = eval1(src, &[&table, &t(DType::I64, &[2, 2], vec![3.0, 0.0, 1.0, 3.0])]);
    assert_eq!(y.data(), &[6.0, 7.0, 0.0, 1.0, 2.0, 3.0, 6.0, 7.0]);
}

#[test]
fn matmul_with_transposes_and_broadcast_batches() {
    // a [2, 1, 3, 4] is read as [2, 1, 4, 3] (M = 4, K = 3), b [3, 5, 3] as [3, 3, 5]
    // (N = 5); the batch axes [2, 1] and [3] broadcast to [2, 3].
    let src = "func @main(%a: f32[2, 1, 3, 4], %b: f32[3, 5, 3]) {
  %c: f32[2, 3, 4, 5] = matmul(%a, %b) {transpose_a=true, transpose_b=true}
  return %c
}";
    let mut rng = Rng(7);
    let a = rng.tensor(DType::F32, &[2, 1, 3, 4], 2.0);
    let b = rng.tensor(DType::F32, &[3, 5, 3], 2.0);
    let c = eval1(src, &[&a, &b]);
    for b0 in 0..2 {
        for b1 in 0..3 {
            for i in 0..4 {
                for j in 0..5 {
                    let s: f64 = (0..3).map(|p| a.get(&[b0, 0, p, i]).unwrap() * b.get(&[b1, j, p]).unwrap()).sum();
                    let got = c.get(&[b0, b1, i, j]).unwrap();
                    assert!((got - s as f32 as f64).abs() <= 1e-6 * s.abs().max(1.0), "{b0} {b1} {i} {j}: {got} vs {s}");
                }
            }
        }
    }
}

#[test]
fn rope_rotates_pairs_in_both_forms() {
    let src = "func @main(%x: f32[1, 4], %p: i32[1]) {
  %h: f32[1, 4] = rope(%x, %p) {theta=10000.0}
  %i: f32[1, 4] = rope(%x, %p) {theta=10000.0, form=\"interleaved\"}
  return %h, %i
}";
    let out = eval(src, &[&t(DType::F32, &[1, 4], vec![1.0, 0.0, 0.0, 1.0]), &t(DType::I32, &[1], vec![1.0])]);
    // D = 4: inv_freq = [1, 10000^(−1/2)] = [1, 0.01].
    let f = |v: f64| v as f32 as f64;
    // rotate_half pairs (0,2) at freq 1 and (1,3) at freq 0.01.
    assert_eq!(out[0].data(), &[f(1f64.cos()), f(-(0.01f64.sin())), f(1f64.sin()), f(0.01f64.cos())]);
    // interleaved pairs (0,1) at freq 1 and (2,3) at freq 0.01.
    assert_eq!(out[1].data(), &[f(1f64.cos()), f(1f64.sin()), f(-(0.01f64.sin())), f(0.01f64.cos())]);
}

#[test]
fn rope_broadcasts_positions_over_heads() {
    // x [T=2, H=2, D=2], positions [T, 1]: both heads of token t use position pos[t].
    let src = "func @main(%x: f32[2, 2, 2], %p: i64[2, 1]) {\n  %y: f32[2, 2, 2] = rope(%x, %p) {theta=2.0}\n  return %y\n}";
    let y = eval1(src, &[&t(DType::F32, &[2, 2, 2], vec![1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 1.0, 0.0]), &t(DType::I64, &[2, 1], vec![0.0, 3.0])]);
    let f = |v: f64| v as f32 as f64;
    assert_eq!(y.data(), &[1.0, 0.0, 1.0, 0.0, f(3f64.cos()), f(3f64.sin()), f(3f64.cos()), f(3f64.sin())]);
}

#[test]
fn erf_and_gelu_values() {
    // Reference values of erf (Abramowitz & Stegun table 7.1, to 16 digits).
    for (x, want) in [(0.5, 0.5204998778130465), (1.0, 0.8427007929497149), (2.0, 0.9953222650189527), (3.0, 0.9999779095030014), (1e-10, 1.1283791670955126e-10)] {
        assert!((erf(x) - want).abs() <= 2e-16 * want.max(1e-300) + 1e-26, "erf({x}) = {} vs {want}", erf(x));
        assert_eq!(erf(-x), -erf(x));
    }
    assert_eq!((erf(f64::INFINITY), erf(NEG_INF), erf(0.0)), (1.0, -1.0, 0.0));
    assert!(erf(f64::NAN).is_nan());
    let src = "func @main(%x: f32[3]) {
  %e: f32[3] = gelu(%x)
  %t: f32[3] = gelu(%x) {form=\"tanh\"}
  return %e, %t
}";
    let out = eval(src, &[&t(DType::F32, &[3], vec![1.0, -1.0, 0.0])]);
    let f = |v: f64| v as f32 as f64;
    assert_eq!(out[0].data(), &[f(0.8413447460685429), f(-0.15865525393145707), 0.0]);
    assert_eq!(out[1].data(), &[f(0.8411919906082768), f(-0.15880800939172324), 0.0]);
}

#[test]
fn erf_matches_its_taylor_series() {
    // erf(x) = 2/√π Σ (−1)ⁿ x^(2n+1) / (n! (2n+1)), summed in f64 for |x| ≤ 1.5.
    for k in -30..=30 {
        let x = k as f64 * 0.05;
        let (mut term, mut sum) = (x, 0.0);
        for n in 0..60 {
            sum += term / (2 * n + 1) as f64;
            term *= -x * x / (n + 1) as f64;
        }
        let want = sum * 2.0 / std::f64::consts::PI.sqrt();
        // The series itself loses a few ulps to cancellation near |x| = 1.5.
        assert!((erf(x) - want).abs() <= 1.5e-15, "erf({x}) = {} vs {want}", erf(x));
    }
}

#[test]
fn the_erf_op_rounds_once_per_dtype_and_keeps_specials() {
    let xs = vec![0.0, -0.0, 1e-30, -1e-30, 0.5, -1.0, 2.0, 3.5, -10.0, f64::INFINITY, NEG_INF, f64::NAN];
    for dt in [DType::F32, DType::BF16, DType::F16] {
        let src = format!("func @main(%x: {dt}[12]) {{\n  %y: {dt}[12] = erf(%x)\n  return %y\n}}");
        let x = t(dt, &[12], xs.clone());
        let y = eval1(&src, &[&x]);
        assert_eq!(y.dtype(), dt);
        for (&xi, &yi) in x.data().iter().zip(y.data()) {
            if xi.is_nan() {
                assert!(yi.is_nan(), "{dt}: erf(NaN) = {yi}");
                continue;
            }
            // f64 erf of the stored input, rounded once to the dtype; the sign of zero kept.
            let want = dt.round(libm::erf(xi));
            assert_eq!(yi.to_bits(), want.to_bits(), "{dt}: erf({xi}) = {yi}, want {want}");
        }
    }
    let y = eval1("func @main(%x: f32[4]) {\n  %y: f32[4] = erf(%x)\n  return %y\n}", &[&t(DType::F32, &[4], vec![-0.0, 1.0, f64::INFINITY, NEG_INF])]);
    assert_eq!(y.data()[0].to_bits(), (-0.0f64).to_bits());
    assert_eq!(&y.data()[1..], &[0.8427007929497149f64 as f32 as f64, 1.0, -1.0]);
    // erf is float-only: an integer operand is refused.
    let bad = "func @main(%x: i32[4]) {\n  %y: i32[4] = erf(%x)\n  return %y\n}";
    assert!(parse(bad).map_err(|e| e.to_string()).and_then(|g| verify(&g).map_err(|e| e.to_string())).is_err());
}

/// One attention graph, bhsd, f32, with V = the identity so the output shows the weights.
fn attention_weights(sq: usize, skv: usize, causal: bool) -> Vec<f64> {
    let src = format!(
        "func @main(%q: f32[1, 1, {sq}, 2], %k: f32[1, 1, {skv}, 2], %v: f32[1, 1, {skv}, {skv}]) {{
  %o: f32[1, 1, {sq}, {skv}] = attention(%q, %k, %v) {{scale=1.0, causal={causal}, heads=1, kv_heads=1}}
  return %o
}}"
    );
    let q = Tensor::zeros(DType::F32, &[1, 1, sq, 2]);
    let k = Tensor::zeros(DType::F32, &[1, 1, skv, 2]);
    let v = Tensor::from_fn(DType::F32, &[1, 1, skv, skv], |i| if i[2] == i[3] { 1.0 } else { 0.0 });
    eval1(&src, &[&q, &k, &v]).into_data()
}

#[test]
fn causal_attention_q3_kv7_is_aligned_bottom_right() {
    // Equal scores: query i spreads its weight evenly over keys j ≤ i + (7 − 3).
    let w = attention_weights(3, 7, true);
    for i in 0..3 {
        let n = i + 5;
        for j in 0..7 {
            let want = if j < n { (1.0 / n as f64) as f32 as f64 } else { 0.0 };
            assert_eq!(w[i * 7 + j], want, "query {i}, key {j}");
        }
    }
    // q_len 4 > kv_len 2: queries 0 and 1 see no key and give exactly 0.
    let w = attention_weights(4, 2, true);
    assert_eq!(w, vec![0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.5, 0.5]);
    // Not causal: every query sees every key.
    assert!(attention_weights(3, 7, false).iter().all(|&x| x == (1.0f64 / 7.0) as f32 as f64));
}

#[test]
fn attention_gqa_8_2_reads_kv_head_h_div_4() {
    let src = "func @main(%q: f32[1, 8, 1, 2], %k: f32[1, 2, 3, 2], %v: f32[1, 2, 3, 1]) {
  %o: f32[1, 8, 1, 1] = attention(%q, %k, %v) {scale=1.0, heads=8, kv_heads=2}
  return %o
}";
    // Zero scores: the output is the mean of the KV head's values, 10·g + 1.
    let v = Tensor::from_fn(DType::F32, &[1, 2, 3, 1], |i| (10 * i[1] + i[2]) as f64);
    let o = eval1(src, &[&Tensor::zeros(DType::F32, &[1, 8, 1, 2]), &Tensor::zeros(DType::F32, &[1, 2, 3, 2]), &v]);
    assert_eq!(o.data(), &[1.0, 1.0, 1.0, 1.0, 11.0, 11.0, 11.0, 11.0]);
}

#[test]
fn attention_rows_all_masked_are_zero_and_nan_propagates() {
    let src = "func @main(%q: f32[1, 1, 3, 1], %k: f32[1, 1, 2, 1], %v: f32[1, 1, 2, 1], %m: f32[3, 2]) {
  %o: f32[1, 1, 3, 1] = attention(%q, %k, %v, %m) {scale=1.0, heads=1, kv_heads=1}
  return %o
}";
    let q = t(DType::F32, &[1, 1, 3, 1], vec![1.0, f64::NAN, 1.0]);
    let k = t(DType::F32, &[1, 1, 2, 1], vec![0.0, 0.0]);
    let v = t(DType::F32, &[1, 1, 2, 1], vec![2.0, 4.0]);
    let m = t(DType::F32, &[3, 2], vec![NEG_INF, NEG_INF, 0.0, 0.0, 0.0, NEG_INF]);
    let o = eval1(src, &[&q, &k, &v, &m]);
    assert_eq!(o.data()[0], 0.0);
    assert!(o.data()[1].is_nan());
    assert_eq!(o.data()[2], 2.0);
}

#[test]
fn attention_spans_several_key_tiles() {
    // 40 keys (tiles of 16): the mask hides keys 0..20, so the first tile is all −inf and the
    // second mixes −inf and finite scores. Query 0 scores key j as j/8 (k_j = j/8, q = 1);
    // the weights are softmax over j in 20..40, checked against the formula.
    let src = "func @main(%q: f32[1, 1, 2, 1], %k: f32[1, 1, 40, 1], %v: f32[1, 1, 40, 1], %m: f32[1, 40]) {
  %o: f32[1, 1, 2, 1] = attention(%q, %k, %v, %m) {scale=1.0, heads=1, kv_heads=1}
  return %o
}";
    let q = t(DType::F32, &[1, 1, 2, 1], vec![1.0, 0.0]);
    let k = Tensor::from_fn(DType::F32, &[1, 1, 40, 1], |i| i[2] as f64 / 8.0);
    let v = Tensor::from_fn(DType::F32, &[1, 1, 40, 1], |i| (i[2] as f64 - 30.0).abs());
    let m = Tensor::from_fn(DType::F32, &[1, 40], |i| if i[1] < 20 { NEG_INF } else { 0.0 });
    let o = eval1(src, &[&q, &k, &v, &m]);
    let w: Vec<f64> = (20..40).map(|j| (j as f64 / 8.0).exp()).collect();
    let total: f64 = w.iter().sum();
    let want0: f64 = (20..40).zip(&w).map(|(j, wj)| wj / total * (j as f64 - 30.0).abs()).sum();
    let want1: f64 = (20..40).map(|j| (j as f64 - 30.0).abs()).sum::<f64>() / 20.0;
    assert!((o.data()[0] - want0).abs() <= 1e-6 * want0, "{} vs {want0}", o.data()[0]);
    assert_eq!(o.data()[1], want1 as f32 as f64);
}

#[test]
fn attention_over_no_keys_is_zero() {
    let src = "func @main(%q: f32[1, 2, 3, 4], %k: f32[1, 1, 0, 4], %v: f32[1, 1, 0, 4]) {
  %o: f32[1, 2, 3, 4] = attention(%q, %k, %v) {scale=1.0, causal=true, heads=2, kv_heads=1}
  return %o
}";
    let o = eval1(src, &[&Tensor::full(DType::F32, &[1, 2, 3, 4], 1.0), &Tensor::zeros(DType::F32, &[1, 1, 0, 4]), &Tensor::zeros(DType::F32, &[1, 1, 0, 4])]);
    assert_eq!(o.data(), &[0.0; 24]);
}

#[test]
fn tensor_accessors() {
    let x = Tensor::from_fn(DType::BF16, &[2, 3], |i| (i[0] * 3 + i[1]) as f64 + 0.001);
    assert_eq!(x.get(&[1, 2]), Some(DType::BF16.round(5.001)));
    assert_eq!(x.get(&[2, 0]), None);
    assert_eq!(x.get(&[0]), None);
    assert_eq!(x.strides(), vec![3, 1]);
    assert_eq!(Tensor::scalar(DType::I32, 2.7).data(), &[2.0]);
    assert_eq!(Tensor::full(DType::Bool, &[2], -3.0).data(), &[1.0, 1.0]);
    assert_eq!(x.to_f32_vec()[5], DType::BF16.round(5.001) as f32);
    assert!(matches!(Tensor::new(DType::F32, &[2, 2], vec![1.0]), Err(InterpError::BadTensor { .. })));
    assert!(matches!(Tensor::new(DType::F32, &[usize::MAX, 2], vec![]), Err(InterpError::BadTensor { .. })));
}
