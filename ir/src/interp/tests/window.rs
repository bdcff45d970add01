//! `attention` and `paged_attention` with a sliding window and a softcap, against a dense
//! reference written here the way Hugging Face builds it: a boolean mask `kv ≤ q` and
//! `kv > q − sliding_window` (transformers' `causal_mask_function` and
//! `sliding_window_overlay`, q the query's absolute position), scores soft-capped as Gemma 2's
//! `attn_weights / softcap → tanh → · softcap` before the additive mask, then softmax.

use super::*;

/// Dense f64 reference of one `[B, H, Sq, D]` attention in `bhsd`: `(out, lse)`.
#[allow(clippy::too_many_arguments)]
fn reference(q: &Tensor, k: &Tensor, v: &Tensor, mask: Option<&Tensor>, scale: f64, window: Option<usize>, softcap: Option<f64>, heads: usize, kv_heads: usize) -> (Vec<f64>, Vec<f64>) {
    let (b, sq, d) = (q.shape()[0], q.shape()[2], q.shape()[3]);
    let (skv, dv) = (k.shape()[2], v.shape()[3]);
    let mut out = vec![0.0; b * heads * sq * dv];
    let mut lse = vec![0.0; b * heads * sq];
    for bi in 0..b {
        for h in 0..heads {
            let g = h / (heads / kv_heads);
            for i in 0..sq {
                let pos = i as i64 + skv as i64 - sq as i64;
                let mut scores = vec![f64::NEG_INFINITY; skv];
                for (j, s) in scores.iter_mut().enumerate() {
                    let (kv_idx, q_idx) = (j as i64, pos);
                    let causal = kv_idx <= q_idx;
                    let sliding = window.is_none_or(|w| kv_idx > q_idx - w as i64);
                    if !(causal && sliding) {
                        continue;
                    }
                    let dot: f64 = (0..d).map(|x| q.data()[((bi * heads + h) * sq + i) * d + x] * k.data()[((bi * kv_heads + g) * skv + j) * d + x]).sum();
                    let mut w = scale * dot;
                    if let Some(c) = softcap {
                        w = (w / c).tanh() * c;
                    }
                    *s = w + mask.map_or(0.0, |m| m.data()[(i * skv) + j]);
                }
                let m = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let row = ((bi * heads + h) * sq + i) * dv;
                if m == f64::NEG_INFINITY {
                    lse[(bi * heads + h) * sq + i] = f64::NEG_INFINITY;
                    continue;
                }
                let l: f64 = scores.iter().map(|s| (s - m).exp()).sum();
                for (j, s) in scores.iter().enumerate() {
                    let p = (s - m).exp() / l;
                    for x in 0..dv {
                        out[row + x] += p * v.data()[((bi * kv_heads + g) * skv + j) * dv + x];
                    }
                }
                lse[(bi * heads + h) * sq + i] = m + l.ln();
            }
        }
    }
    (out, lse)
}

fn attrs_text(window: Option<usize>, softcap: Option<f64>) -> String {
    let mut s = String::new();
    if let Some(w) = window {
        s += &format!(", window={w}");
    }
    if let Some(c) = softcap {
        s += &format!(", softcap={c:?}");
    }
    s
}

/// One case: `(b, h, hkv, sq, skv, d, window, softcap, q scale)`.
type Case = (usize, usize, usize, usize, usize, usize, Option<usize>, Option<f64>, f64);

fn check_attention(case: Case, with_mask: bool, seed: u64) {
    let (b, h, hkv, sq, skv, d, window, softcap, qscale) = case;
    let mut rng = Rng(seed);
    let q = rng.tensor(DType::F32, &[b, h, sq, d], qscale);
    let k = rng.tensor(DType::F32, &[b, hkv, skv, d], 1.0);
    let v = rng.tensor(DType::F32, &[b, hkv, skv, d], 1.0);
    let mask = rng.tensor(DType::F32, &[1, 1, sq, skv], 2.0);
    let scale = 1.0 / (d as f64).sqrt();
    let (mask_param, mask_arg) = if with_mask { (format!(", %m: f32[1, 1, {sq}, {skv}]"), ", %m") } else { (String::new(), "") };
    let src = format!(
        "func @f(%q: f32[{b}, {h}, {sq}, {d}], %k: f32[{b}, {hkv}, {skv}, {d}], %v: f32[{b}, {hkv}, {skv}, {d}]{mask_param}) {{
  %o: f32[{b}, {h}, {sq}, {d}], %l: f32[{b}, {h}, {sq}] = attention(%q, %k, %v{mask_arg}) {{scale={scale:?}, causal=true, heads={h}, kv_heads={hkv}, lse=true{}}}
  return %o, %l
}}",
        attrs_text(window, softcap)
    );
    let ins: Vec<&Tensor> = if with_mask { vec![&q, &k, &v, &mask] } else { vec![&q, &k, &v] };
    let got = eval(&src, &ins);
    let (o, l) = reference(&q, &k, &v, with_mask.then_some(&mask), scale, window, softcap, h, hkv);
    let what = format!("attention {case:?} mask={with_mask}");
    assert_close(&got[0], &t(DType::F32, &[b, h, sq, d], o), DType::F32, &what);
    assert_close(&got[1], &t(DType::F32, &[b, h, sq], l), DType::F32, &format!("{what} lse"));
}

/// Windows of 1, shorter than, equal to and longer than the keys; prefill (Sq = Skv), a
/// chunk after a prefix (Sq < Skv) and more queries than keys (rows with no visible key);
/// GQA; soft caps that bite (scores far beyond the cap) and that do not.
#[test]
fn attention_window_and_softcap_match_the_hugging_face_masking() {
    let cases: &[Case] = &[
        (1, 2, 2, 9, 9, 8, Some(1), None, 1.0),
        (1, 2, 2, 9, 9, 8, Some(3), None, 1.0),
        (2, 4, 2, 5, 13, 8, Some(4), None, 1.0),
        (1, 4, 1, 7, 7, 8, Some(7), None, 1.0),
        (1, 4, 1, 7, 7, 8, Some(100), None, 1.0),
        (1, 2, 1, 6, 3, 8, Some(2), None, 1.0),
        (1, 2, 2, 9, 9, 8, None, Some(2.0), 40.0),
        (1, 2, 2, 9, 9, 8, None, Some(50.0), 1.0),
        (2, 4, 2, 5, 21, 8, Some(6), Some(0.5), 300.0),
        (1, 3, 3, 40, 40, 8, Some(17), Some(30.0), 8.0),
    ];
    for (n, &c) in cases.iter().enumerate() {
        check_attention(c, false, n as u64 + 1);
        check_attention(c, true, n as u64 + 101);
    }
}

/// A window at least as long as the keys is plain causal attention, bit for bit.
#[test]
fn attention_window_longer_than_the_keys_is_causal() {
    let mut rng = Rng(7);
    let (q, k, v) = (rng.tensor(DType::BF16, &[1, 4, 6, 16], 1.0), rng.tensor(DType::BF16, &[1, 2, 11, 16], 1.0), rng.tensor(DType::BF16, &[1, 2, 11, 16], 1.0));
    let run = |extra: &str| {
        eval1(
            &format!(
                "func @f(%q: bf16[1, 4, 6, 16], %k: bf16[1, 2, 11, 16], %v: bf16[1, 2, 11, 16]) {{
  %o: bf16[1, 4, 6, 16] = attention(%q, %k, %v) {{scale=0.25, causal=true, heads=4, kv_heads=2{extra}}}
  return %o
}}"
            ),
            &[&q, &k, &v],
        )
    };
    let plain = run("");
    for w in [11, 12, 2147483647] {
        let got = run(&format!(", window={w}"));
        assert!(got.data().iter().zip(plain.data()).all(|(a, b)| a.to_bits() == b.to_bits()), "window={w}");
    }
    assert_ne!(run(", window=10").data(), plain.data());
}

/// `paged_attention` with a window and a softcap: each sequence against the dense reference
/// over its own keys (positions from its length), pages handed out in a scrambled order.
#[test]
fn paged_attention_window_and_softcap_per_sequence() {
    let (h, hkv, d, page, tq) = (4usize, 2usize, 8usize, 4usize, 3usize);
    let lens = [0usize, 1, 2, 7, 13];
    for (window, softcap, qscale) in [(Some(1), None, 1.0), (Some(5), None, 1.0), (Some(64), Some(3.0), 30.0), (None, Some(1.0), 100.0), (Some(4), Some(20.0), 4.0)] {
        let mut rng = Rng(11);
        let bsz = lens.len();
        let cols = 4;
        let pages = bsz * cols;
        let q = rng.tensor(DType::F32, &[bsz, h, tq, d], qscale);
        let kp = rng.tensor(DType::F32, &[pages, page, hkv, d], 1.0);
        let vp = rng.tensor(DType::F32, &[pages, page, hkv, d], 1.0);
        let table: Vec<f64> = (0..bsz * cols).map(|i| ((i * 7 + 3) % pages) as f64).collect();
        let bt = t(DType::I32, &[bsz, cols], table.clone());
        let sl = t(DType::I32, &[bsz], lens.iter().map(|&l| l as f64).collect());
        let scale = 1.0 / (d as f64).sqrt();
        let src = format!(
            "func @f(%q: f32[{bsz}, {h}, {tq}, {d}], %kp: f32[{pages}, {page}, {hkv}, {d}], %vp: f32[{pages}, {page}, {hkv}, {d}], %bt: i32[{bsz}, {cols}], %sl: i32[{bsz}]) {{
  %o: f32[{bsz}, {h}, {tq}, {d}], %l: f32[{bsz}, {h}, {tq}] = paged_attention(%q, %kp, %vp, %bt, %sl) {{scale={scale:?}, heads={h}, kv_heads={hkv}, lse=true{}}}
  return %o, %l
}}",
            attrs_text(window, softcap)
        );
        let got = eval(&src, &[&q, &kp, &vp, &bt, &sl]);
        for (b, &len) in lens.iter().enumerate() {
            let gather = |p: &Tensor| {
                Tensor::from_fn(DType::F32, &[1, hkv, len, d], |ix| {
                    let pg = table[b * cols + ix[2] / page] as usize;
                    p.data()[((pg * page + ix[2] % page) * hkv + ix[1]) * d + ix[3]]
                })
            };
            let qb = Tensor::from_fn(DType::F32, &[1, h, tq, d], |ix| q.data()[((b * h + ix[1]) * tq + ix[2]) * d + ix[3]]);
            let (o, l) = reference(&qb, &gather(&kp), &gather(&vp), None, scale, window, softcap, h, hkv);
            let go = Tensor::from_fn(DType::F32, &[1, h, tq, d], |ix| got[0].data()[((b * h + ix[1]) * tq + ix[2]) * d + ix[3]]);
            let gl = Tensor::from_fn(DType::F32, &[1, h, tq], |ix| got[1].data()[(b * h + ix[1]) * tq + ix[2]]);
            let what = format!("paged window={window:?} softcap={softcap:?} sequence {b} (length {len})");
            assert_close(&go, &t(DType::F32, &[1, h, tq, d], o), DType::F32, &what);
            assert_close(&gl, &t(DType::F32, &[1, h, tq], l), DType::F32, &format!("{what} lse"));
        }
    }
}

/// A soft cap keeps +inf scores finite (c·tanh(+inf) = c) and NaN NaN.
#[test]
fn softcap_of_infinite_and_nan_scores() {
    let q = t(DType::F32, &[1, 1, 1, 1], vec![1.0]);
    let k = t(DType::F32, &[1, 1, 3, 1], vec![f64::INFINITY, 0.0, f64::NEG_INFINITY]);
    let v = t(DType::F32, &[1, 1, 3, 1], vec![2.0, 4.0, 8.0]);
    let src = "func @f(%q: f32[1, 1, 1, 1], %k: f32[1, 1, 3, 1], %v: f32[1, 1, 3, 1]) {
  %o: f32[1, 1, 1, 1], %l: f32[1, 1, 1] = attention(%q, %k, %v) {scale=1.0, heads=1, kv_heads=1, lse=true, softcap=1.0}
  return %o, %l
}";
    let got = eval(src, &[&q, &k, &v]);
    let (e1, em1) = (1f64.exp(), (-1f64).exp());
    let want = (2.0 * e1 + 4.0 + 8.0 * em1) / (e1 + 1.0 + em1);
    assert_close(&got[0], &t(DType::F32, &[1, 1, 1, 1], vec![want]), DType::F32, "capped infinities");
    assert_close(&got[1], &t(DType::F32, &[1, 1, 1], vec![(e1 + 1.0 + em1).ln()]), DType::F32, "capped lse");
    let kn = t(DType::F32, &[1, 1, 3, 1], vec![f64::NAN, 0.0, 1.0]);
    assert!(eval(src, &[&q, &kn, &v])[0].data()[0].is_nan());
}
