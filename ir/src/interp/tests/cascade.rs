//! The log-sum-exp of `attention`/`paged_attention` (`lse=true`) and `attention_merge`:
//! hand-computed values, the −inf conventions, and the cascade identity — attention over a
//! key set equals the merge of attention over any split of it (FlashInfer's cascade
//! inference, Ye et al. 2024).

use super::*;

/// Attention of `q` [1, H, Sq, D] over `k`/`v` [1, Hkv, Skv, D], f32, with its lse.
#[allow(clippy::too_many_arguments)]
fn attn_lse(h: usize, hkv: usize, sq: usize, skv: usize, d: usize, causal: bool, q: &Tensor, k: &Tensor, v: &Tensor) -> (Tensor, Tensor) {
    let src = format!(
        "func @main(%q: f32[1, {h}, {sq}, {d}], %k: f32[1, {hkv}, {skv}, {d}], %v: f32[1, {hkv}, {skv}, {d}]) {{
  %o: f32[1, {h}, {sq}, {d}], %lse: f32[1, {h}, {sq}] = attention(%q, %k, %v) {{scale=0.5, causal={causal}, heads={h}, kv_heads={hkv}, lse=true}}
  return %o, %lse
}}"
    );
    let mut r = eval(&src, &[q, k, v]).into_iter();
    (r.next().expect("o"), r.next().expect("lse"))
}

fn merge(oa: &Tensor, la: &Tensor, ob: &Tensor, lb: &Tensor) -> (Tensor, Tensor) {
    let (os, ls) = (type_of(oa), type_of(la));
    let src = format!(
        "func @main(%oa: {os}, %la: {ls}, %ob: {os}, %lb: {ls}) {{
  %o: {os}, %l: {ls} = attention_merge(%oa, %la, %ob, %lb)
  return %o, %l
}}"
    );
    let mut r = eval(&src, &[oa, la, ob, lb]).into_iter();
    (r.next().expect("o"), r.next().expect("lse"))
}

fn type_of(t: &Tensor) -> String {
    let dims: Vec<String> = t.shape().iter().map(|d| d.to_string()).collect();
    format!("{}[{}]", t.dtype(), dims.join(", "))
}

/// Deterministic pseudo-random data in [-2, 2).
fn rnd(dtype: DType, shape: &[usize], seed: u64) -> Tensor {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    Tensor::from_fn(dtype, shape, |_| {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        (s >> 11) as f64 / (1u64 << 53) as f64 * 4.0 - 2.0
    })
}

#[test]
fn lse_is_the_natural_log_of_the_sum_of_exp_scores() {
    // One head, D 1: scores 0.5·q·k_j.
    let q = t(DType::F32, &[1, 1, 2, 1], vec![1.0, -2.0]);
    let k = t(DType::F32, &[1, 1, 3, 1], vec![0.0, 1.0, 4.0]);
    let v = t(DType::F32, &[1, 1, 3, 1], vec![1.0, 2.0, 3.0]);
    let (_, lse) = attn_lse(1, 1, 2, 3, 1, false, &q, &k, &v);
    for (i, qi) in [1.0f64, -2.0].into_iter().enumerate() {
        let want = [0.0, 1.0, 4.0].iter().map(|kj| (0.5 * qi * kj).exp()).sum::<f64>().ln();
        assert!((lse.data()[i] - want).abs() < 1e-6, "row {i}: {} vs {want}", lse.data()[i]);
    }
}

#[test]
fn fully_masked_rows_give_zero_and_minus_infinite_lse() {
    // Causal with Sq 3 > Skv 1: query 0 and 1 see no key.
    let q = rnd(DType::F32, &[1, 1, 3, 4], 1);
    let k = rnd(DType::F32, &[1, 1, 1, 4], 2);
    let v = rnd(DType::F32, &[1, 1, 1, 4], 3);
    let (o, lse) = attn_lse(1, 1, 3, 1, 4, true, &q, &k, &v);
    assert_eq!(lse.data()[..2], [NEG_INF, NEG_INF]);
    assert!(lse.data()[2].is_finite());
    assert_eq!(o.data()[..8], [0.0; 8]);
    // Merging two empty states: 0 and −inf, no NaN.
    let (om, lm) = merge(&o, &lse, &o, &lse);
    assert_eq!(lm.data()[..2], [NEG_INF, NEG_INF]);
    assert_eq!(om.data()[..8], [0.0; 8]);
    // An empty state is the identity of the merge (its o is not read, even if NaN).
    let nan_o = Tensor::full(DType::F32, &[1, 1, 3, 4], f64::NAN);
    let minus_inf = Tensor::full(DType::F32, &[1, 1, 3], NEG_INF);
    let (om, lm) = merge(&o, &lse, &nan_o, &minus_inf);
    assert_eq!(om.data(), o.data());
    assert_eq!(lm.data(), lse.data());
}

#[test]
fn merge_values_and_nan() {
    // Rows: equal weights; a dominant state; NaN lse; +inf lse (inf − inf is NaN).
    let oa = t(DType::F32, &[4, 2], vec![1.0, 2.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]);
    let ob = t(DType::F32, &[4, 2], vec![3.0, 4.0, 5.0, 5.0, 1.0, 1.0, 1.0, 1.0]);
    let la = t(DType::F32, &[4], vec![0.0, -1000.0, f64::NAN, f64::INFINITY]);
    let lb = t(DType::F32, &[4], vec![0.0, 0.0, 0.0, f64::INFINITY]);
    let (o, l) = merge(&oa, &la, &ob, &lb);
    assert_eq!(o.data()[..4], [2.0, 3.0, 5.0, 5.0]);
    assert_eq!(l.data()[0], (2.0f64.ln()) as f32 as f64);
    assert_eq!(l.data()[1], 0.0);
    assert!(o.data()[4..].iter().all(|x| x.is_nan()) && l.data()[2].is_nan() && l.data()[3].is_nan());
}

#[test]
fn merging_a_key_split_equals_attention_over_all_keys() {
    // GQA 6/2, 2 query rows, 37 keys split at 16 (a tile boundary) and at 5 (inside one).
    let (h, hkv, sq, skv, d) = (6, 2, 2, 37, 8);
    let q = rnd(DType::F32, &[1, h, sq, d], 11);
    let k = rnd(DType::F32, &[1, hkv, skv, d], 12);
    let v = rnd(DType::F32, &[1, hkv, skv, d], 13);
    let (o_all, l_all) = attn_lse(h, hkv, sq, skv, d, false, &q, &k, &v);
    for cut in [5usize, 16] {
        let part = |t: &Tensor, a: usize, b: usize| Tensor::from_fn(DType::F32, &[1, hkv, b - a, d], |i| t.get(&[0, i[1], i[2] + a, i[3]]).unwrap_or(0.0));
        let (o1, l1) = attn_lse(h, hkv, sq, cut, d, false, &q, &part(&k, 0, cut), &part(&v, 0, cut));
        let (o2, l2) = attn_lse(h, hkv, sq, skv - cut, d, false, &q, &part(&k, cut, skv), &part(&v, cut, skv));
        let (o, l) = merge(&o1, &l1, &o2, &l2);
        assert_close(&o, &o_all, DType::F32, &format!("o, cut {cut}"));
        assert_close(&l, &l_all, DType::F32, &format!("lse, cut {cut}"));
        // Commutative.
        let (o_ba, l_ba) = merge(&o2, &l2, &o1, &l1);
        assert_close(&o_ba, &o, DType::F32, "commuted");
        assert_close(&l_ba, &l, DType::F32, "commuted lse");
    }
}

#[test]
fn merge_is_associative() {
    let o: Vec<Tensor> = (0..3).map(|i| rnd(DType::F32, &[2, 3, 16], 20 + i)).collect();
    let l: Vec<Tensor> = (0..3)
        .map(|i| {
            let mut x = rnd(DType::F32, &[2, 3], 30 + i);
            if i == 1 {
                // One empty state among finite ones.
                x = Tensor::from_fn(DType::F32, &[2, 3], |j| if j == [0, 0] { NEG_INF } else { x.get(j).unwrap_or(0.0) * 10.0 });
            }
            x
        })
        .collect();
    let (o01, l01) = merge(&o[0], &l[0], &o[1], &l[1]);
    let (left, ll) = merge(&o01, &l01, &o[2], &l[2]);
    let (o12, l12) = merge(&o[1], &l[1], &o[2], &l[2]);
    let (right, lr) = merge(&o[0], &l[0], &o12, &l12);
    assert_close(&left, &right, DType::F32, "o");
    assert_close(&ll, &lr, DType::F32, "lse");
}

#[test]
fn merge_of_bf16_states_rounds_o_once() {
    let oa = rnd(DType::BF16, &[3, 8], 40);
    let ob = rnd(DType::BF16, &[3, 8], 41);
    let la = rnd(DType::F32, &[3], 42);
    let lb = rnd(DType::F32, &[3], 43);
    let (o, l) = merge(&oa, &la, &ob, &lb);
    assert_eq!(o.dtype(), DType::BF16);
    assert_eq!(l.dtype(), DType::F32);
    for r in 0..3 {
        let (a, b) = (la.data()[r], lb.data()[r]);
        let m = a.max(b);
        let (wa, wb) = ((a - m).exp(), (b - m).exp());
        assert_eq!(l.data()[r], (m + (wa + wb).ln()) as f32 as f64);
        for c in 0..8 {
            let want = (wa * oa.data()[r * 8 + c] + wb * ob.data()[r * 8 + c]) / (wa + wb);
            assert_eq!(o.data()[r * 8 + c], DType::BF16.round(want), "({r}, {c})");
        }
    }
}

#[test]
fn paged_lse_equals_dense_lse() {
    // Two sequences of 5 and 0 keys in pages of 4 (a partly filled page, an empty sequence).
    let src = "func @main(%q: f32[2, 2, 1, 4], %kp: f32[3, 4, 1, 4], %vp: f32[3, 4, 1, 4], %bt: i32[2, 2], %l: i32[2]) {
  %o: f32[2, 2, 1, 4], %lse: f32[2, 2, 1] = paged_attention(%q, %kp, %vp, %bt, %l) {scale=0.5, heads=2, kv_heads=1, lse=true}
  return %o, %lse
}";
    let q = rnd(DType::F32, &[2, 2, 1, 4], 50);
    let kp = rnd(DType::F32, &[3, 4, 1, 4], 51);
    let vp = rnd(DType::F32, &[3, 4, 1, 4], 52);
    let bt = t(DType::I32, &[2, 2], vec![2.0, 0.0, 1.0, 1.0]);
    let lens = t(DType::I32, &[2], vec![5.0, 0.0]);
    let r = eval(src, &[&q, &kp, &vp, &bt, &lens]);
    // Sequence 0's keys: page 2 rows 0..4, then page 0 row 0.
    let key = |p: &Tensor, j: usize| -> Vec<f64> {
        let (page, row) = if j < 4 { (2, j) } else { (0, j - 4) };
        (0..4).map(|c| p.get(&[page, row, 0, c]).unwrap_or(0.0)).collect()
    };
    let k = Tensor::from_fn(DType::F32, &[1, 1, 5, 4], |i| key(&kp, i[2])[i[3]]);
    let v = Tensor::from_fn(DType::F32, &[1, 1, 5, 4], |i| key(&vp, i[2])[i[3]]);
    let q0 = Tensor::from_fn(DType::F32, &[1, 2, 1, 4], |i| q.get(&[0, i[1], 0, i[3]]).unwrap_or(0.0));
    let (o_d, l_d) = attn_lse(2, 1, 1, 5, 4, true, &q0, &k, &v);
    assert_close(&Tensor::from_fn(DType::F32, &[1, 2, 1, 4], |i| r[0].get(&[0, i[1], 0, i[3]]).unwrap_or(0.0)), &o_d, DType::F32, "o");
    assert_eq!(r[1].data()[..2], l_d.data()[..]);
    assert_eq!(r[1].data()[2..], [NEG_INF, NEG_INF]);
    assert_eq!(r[0].data()[8..], [0.0; 8]);
}

#[test]
fn merge_shape_rules_name_the_operand() {
    let bad = "func @main(%oa: f32[2, 4], %la: bf16[2], %ob: f32[2, 4], %lb: f32[2]) {
  %o: f32[2, 4], %l: f32[2] = attention_merge(%oa, %la, %ob, %lb)
  return %o, %l
}";
    let e = verify(&parse(bad).expect("parses")).expect_err("bf16 lse");
    assert!(e.to_string().contains("lse_a must be f32[2]"), "{e}");
    let bad = "func @main(%oa: f32[2, 4], %la: f32[2], %ob: f32[2, 8], %lb: f32[2]) {
  %o: f32[2, 4], %l: f32[2] = attention_merge(%oa, %la, %ob, %lb)
  return %o, %l
}";
    let e = verify(&parse(bad).expect("parses")).expect_err("o shapes differ");
    assert!(e.to_string().contains("o_a and o_b must have one type"), "{e}");
    // lse=true adds the second result; a node that declares one result is refused.
    let bad = "func @main(%q: f32[1, 1, 2, 4], %k: f32[1, 1, 3, 4], %v: f32[1, 1, 3, 4]) {
  %o: f32[1, 1, 2, 4] = attention(%q, %k, %v) {scale=1.0, heads=1, kv_heads=1, lse=true}
  return %o
}";
    assert!(parse(bad).map_err(|e| e.to_string()).and_then(|g| verify(&g).map_err(|e| e.to_string())).is_err());
}

#[test]
fn lse_attention_round_trips_through_the_text_format() {
    let src = "func @main(%q: bf16[B, 4, 1, 64], %k: bf16[B, 2, S, 64], %v: bf16[B, 2, S, 64]) {
  %o: bf16[B, 4, 1, 64], %lse: f32[B, 4, 1] = attention(%q, %k, %v) {scale=0.125, heads=4, kv_heads=2, lse=true}
  %o2: bf16[B, 4, 1, 64], %lse2: f32[B, 4, 1] = attention_merge(%o, %lse, %o, %lse)
  return %o2, %lse2
}";
    let g = graph(src);
    let text = crate::print(&g);
    assert_eq!(parse(&text).expect("reparses"), g);
    assert!(text.contains("lse=true") && text.contains("attention_merge("), "{text}");
}
