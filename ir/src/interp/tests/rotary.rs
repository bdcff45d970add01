//! `rotary(x, cos, sin)`: rotation by caller-supplied tables, against its formula written out
//! with literal values, against its decomposition `x·cos + rotate_half(x)·sin`, against
//! `rope` when the tables are RoPE's own, and on NaN, partial rotation, broadcasting and
//! zero-sized T.

use super::{assert_close, eval1, t};
use crate::dtype::DType;
use crate::interp::Tensor;

fn lcg(seed: u64, n: usize, lo: f64, hi: f64) -> Vec<f64> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            lo + (hi - lo) * ((s >> 11) as f64 / (1u64 << 53) as f64)
        })
        .collect()
}

#[test]
fn rotate_half_and_interleaved_follow_the_formula() {
    let x = t(DType::F32, &[1, 4], vec![1.0, 2.0, 3.0, 4.0]);
    let c = t(DType::F32, &[1, 4], vec![0.5, 0.25, -0.5, 2.0]);
    let s = t(DType::F32, &[1, 4], vec![1.0, -1.0, 0.125, 0.5]);
    let half = eval1("func @f(%x: f32[1, 4], %c: f32[1, 4], %s: f32[1, 4]) {\n  %y: f32[1, 4] = rotary(%x, %c, %s)\n  return %y\n}", &[&x, &c, &s]);
    // out[i] = x[i]·c[i] − x[i+2]·s[i], out[i+2] = x[i+2]·c[i+2] + x[i]·s[i+2].
    assert_eq!(half.data(), [1.0 * 0.5 - 3.0 * 1.0, 2.0 * 0.25 + 4.0 * 1.0, 3.0 * -0.5 + 1.0 * 0.125, 4.0 * 2.0 + 2.0 * 0.5]);
    let inter = eval1("func @f(%x: f32[1, 4], %c: f32[1, 4], %s: f32[1, 4]) {\n  %y: f32[1, 4] = rotary(%x, %c, %s) {form=\"interleaved\"}\n  return %y\n}", &[&x, &c, &s]);
    // out[2i] = x[2i]·c[2i] − x[2i+1]·s[2i], out[2i+1] = x[2i+1]·c[2i+1] + x[2i]·s[2i+1].
    assert_eq!(inter.data(), [1.0 * 0.5 - 2.0 * 1.0, 2.0 * 0.25 + 1.0 * -1.0, 3.0 * -0.5 - 4.0 * 0.125, 4.0 * 2.0 + 3.0 * 0.5]);
}

#[test]
fn equals_its_decomposition_with_broadcast_tables() {
    for dt in [DType::F32, DType::BF16] {
        let x = t(dt, &[3, 2, 8], lcg(1, 48, -2.0, 2.0));
        let c = t(dt, &[3, 1, 8], lcg(2, 24, -1.0, 1.0));
        let s = t(dt, &[3, 1, 8], lcg(3, 24, -1.0, 1.0));
        let fused =
            eval1(&format!("func @f(%x: {dt}[T, 2, 8], %c: {dt}[T, 1, 8], %s: {dt}[T, 1, 8]) {{\n  %y: {dt}[T, 2, 8] = rotary(%x, %c, %s)\n  return %y\n}}"), &[&x, &c, &s]);
        let decomposed = eval1(
            &format!(
                "func @f(%x: {dt}[T, 2, 8], %c: {dt}[T, 1, 8], %s: {dt}[T, 1, 8]) {{
  %x1: {dt}[T, 2, 4] = slice(%x) {{axis=-1, start=0, end=4}}
  %x2: {dt}[T, 2, 4] = slice(%x) {{axis=-1, start=4, end=8}}
  %n: {dt}[T, 2, 4] = neg(%x2)
  %r: {dt}[T, 2, 8] = concat(%n, %x1) {{axis=-1}}
  %a: {dt}[T, 2, 8] = mul(%x, %c)
  %b: {dt}[T, 2, 8] = mul(%r, %s)
  %y: {dt}[T, 2, 8] = add(%a, %b)
  return %y
}}"
            ),
            &[&x, &c, &s],
        );
        assert_close(&fused, &decomposed, dt, &format!("rotary vs x·c + rotate_half(x)·s ({dt})"));
        // The same tables broadcast explicitly to x's shape give the same values, bit for bit.
        let full = eval1(&format!("func @f(%c: {dt}[T, 1, 8]) {{\n  %b: {dt}[T, 2, 8] = broadcast(%c) {{shape=[T, 2, 8]}}\n  return %b\n}}"), &[&c]);
        let fs = eval1(&format!("func @f(%c: {dt}[T, 1, 8]) {{\n  %b: {dt}[T, 2, 8] = broadcast(%c) {{shape=[T, 2, 8]}}\n  return %b\n}}"), &[&s]);
        let again =
            eval1(&format!("func @f(%x: {dt}[T, 2, 8], %c: {dt}[T, 2, 8], %s: {dt}[T, 2, 8]) {{\n  %y: {dt}[T, 2, 8] = rotary(%x, %c, %s)\n  return %y\n}}"), &[&x, &full, &fs]);
        assert_eq!(fused.data(), again.data(), "{dt}");
    }
}

/// With RoPE's own tables (`cos/sin(cat(f, f))`, `f = pos·inv_freq`, as Hugging Face builds
/// `position_embeddings`) `rotary` is `rope`.
#[test]
fn equals_rope_with_ropes_tables() {
    let (tl, d) = (5usize, 8usize);
    let pos: Vec<f64> = (0..tl).map(|i| (3 * i + 1) as f64).collect();
    let inv: Vec<f64> = (0..d / 2).map(|i| 10000f64.powf(-((2 * i) as f64) / d as f64)).collect();
    let ang = |p: f64, j: usize| p * inv[j % (d / 2)];
    let c = t(DType::F32, &[tl, 1, d], (0..tl * d).map(|k| ang(pos[k / d], k % d).cos()).collect());
    let s = t(DType::F32, &[tl, 1, d], (0..tl * d).map(|k| ang(pos[k / d], k % d).sin()).collect());
    let x = t(DType::F32, &[tl, 3, d], lcg(4, tl * 3 * d, -2.0, 2.0));
    let p = t(DType::I32, &[tl, 1], pos.clone());
    let rotary = eval1("func @f(%x: f32[T, 3, 8], %c: f32[T, 1, 8], %s: f32[T, 1, 8]) {\n  %y: f32[T, 3, 8] = rotary(%x, %c, %s)\n  return %y\n}", &[&x, &c, &s]);
    let rope = eval1("func @f(%x: f32[T, 3, 8], %p: i32[T, 1]) {\n  %y: f32[T, 3, 8] = rope(%x, %p) {theta=10000.0}\n  return %y\n}", &[&x, &p]);
    assert_close(&rotary, &rope, DType::F32, "rotary with rope's tables vs rope");
}

#[test]
fn partial_rotation_copies_the_rest() {
    let x = t(DType::BF16, &[2, 8], lcg(5, 16, -2.0, 2.0));
    let c = t(DType::BF16, &[2, 4], lcg(6, 8, -1.0, 1.0));
    let s = t(DType::BF16, &[2, 4], lcg(7, 8, -1.0, 1.0));
    let y = eval1("func @f(%x: bf16[2, 8], %c: bf16[2, 4], %s: bf16[2, 4]) {\n  %y: bf16[2, 8] = rotary(%x, %c, %s) {rotary_dim=4}\n  return %y\n}", &[&x, &c, &s]);
    for r in 0..2 {
        let (xr, cr, sr, yr) = (&x.data()[r * 8..], &c.data()[r * 4..], &s.data()[r * 4..], &y.data()[r * 8..]);
        assert_eq!(yr[4..8], xr[4..8], "features from R on pass through");
        for i in 0..2 {
            let want = [xr[i] * cr[i] - xr[i + 2] * sr[i], xr[i + 2] * cr[i + 2] + xr[i] * sr[i + 2]];
            assert_eq!([yr[i], yr[i + 2]], want.map(|v| DType::BF16.round(v)), "row {r} pair {i}");
        }
    }
}

#[test]
fn nan_propagates_to_the_features_that_read_it() {
    let src = "func @f(%x: f32[2, 4], %c: f32[2, 4], %s: f32[2, 4]) {\n  %y: f32[2, 4] = rotary(%x, %c, %s)\n  return %y\n}";
    let one = |v: Vec<f64>| t(DType::F32, &[2, 4], v);
    let x = one(vec![1.0, 2.0, 3.0, 4.0, f64::NAN, 1.0, 1.0, 1.0]);
    let c = one(vec![1.0, 1.0, f64::NAN, 1.0, 1.0, 1.0, 1.0, 1.0]);
    let s = one(vec![0.5; 8]);
    let y = eval1(src, &[&x, &c, &s]);
    let nan: Vec<bool> = y.data().iter().map(|v| v.is_nan()).collect();
    // Row 0: cos[2] is NaN → feature 2 only. Row 1: x[0] is NaN → feature 0 and its partner 2.
    assert_eq!(nan, [false, false, true, false, true, false, true, false], "{:?}", y.data());
    // Infinities follow IEEE rules: inf·0 is NaN.
    let x = one(vec![f64::INFINITY, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]);
    let z = one(vec![0.0; 8]);
    let y = eval1(src, &[&x, &z, &c]);
    assert!(y.data()[0].is_nan() && y.data()[2].is_nan(), "{:?}", y.data());
}

#[test]
fn zero_sized_t_gives_an_empty_result() {
    let src = "func @f(%x: bf16[T, 2, 8], %c: bf16[T, 1, 8], %s: bf16[T, 1, 8]) {\n  %y: bf16[T, 2, 8] = rotary(%x, %c, %s)\n  return %y\n}";
    let x = Tensor::new(DType::BF16, &[0, 2, 8], vec![]).unwrap();
    let c = Tensor::new(DType::BF16, &[0, 1, 8], vec![]).unwrap();
    let y = eval1(src, &[&x, &c, &c]);
    assert_eq!(y.shape(), [0, 2, 8]);
    assert!(y.data().is_empty());
}
