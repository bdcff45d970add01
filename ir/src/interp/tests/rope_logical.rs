//! `rope`'s frequency scalings (linear, Llama 3, YaRN) and partial rotary dims, and the logical
//! ops. Each scaling's inverse frequencies are checked against the formula of Hugging Face's
//! `modeling_rope_utils.py` written out again here, and against literal values of real
//! configurations (computed with Python's `math` in f64 from that source).

use std::f64::consts::PI;

use super::{eval, eval1, graph, t};
use crate::attr::Attr;
use crate::dtype::DType;
use crate::ops::{Op, OpKind};
use crate::rope::freqs;

/// A `rope` op with `theta` and the named attributes.
fn rope_op(theta: f64, named: &[(&str, Attr)]) -> Op {
    let mut v = vec![("theta".to_string(), Attr::Float(theta))];
    v.extend(named.iter().map(|(n, a)| (n.to_string(), a.clone())));
    Op::new(OpKind::Rope, v).expect("rope op")
}

fn fl(v: f64) -> Attr {
    Attr::Float(v)
}

/// `|a − b| ≤ 1e-15·|b|` element-wise.
fn assert_rel(got: &[f64], want: &[f64], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= 1e-15 * w.abs(),
            "{what}[{i}]: {g:e} vs {w:e}"
        );
    }
}

/// HF's `_compute_default_rope_parameters`: 1/θ^(2i/dim).
fn hf_default(theta: f64, dim: usize) -> Vec<f64> {
    (0..dim / 2)
        .map(|i| 1.0 / theta.powf((2 * i) as f64 / dim as f64))
        .collect()
}

/// HF's `_compute_llama3_parameters`, step by step as written there.
fn hf_llama3(theta: f64, dim: usize, factor: f64, low: f64, high: f64, old: f64) -> Vec<f64> {
    let (low_wl, high_wl) = (old / low, old / high);
    hf_default(theta, dim)
        .into_iter()
        .map(|f| {
            let wavelen = 2.0 * PI / f;
            let llama = if wavelen > low_wl { f / factor } else { f };
            let smooth = (old / wavelen - low) / (high - low);
            let smoothed = (1.0 - smooth) * llama / factor + smooth * llama;
            let medium = !(wavelen < high_wl) && !(wavelen > low_wl);
            if medium {
                smoothed
            } else {
                llama
            }
        })
        .collect()
}

/// HF's `_compute_yarn_parameters` (inv_freq, attention_factor).
#[allow(clippy::too_many_arguments)]
fn hf_yarn(
    theta: f64,
    dim: usize,
    factor: f64,
    old: f64,
    beta: (f64, f64),
    truncate: bool,
    mscale: (Option<f64>, Option<f64>),
) -> (Vec<f64>, f64) {
    let get_mscale = |s: f64, m: f64| {
        if s <= 1.0 {
            1.0
        } else {
            0.1 * m * s.ln() + 1.0
        }
    };
    let af = match mscale {
        (Some(a), Some(b)) if a != 0.0 && b != 0.0 => get_mscale(factor, a) / get_mscale(factor, b),
        _ => get_mscale(factor, 1.0),
    };
    let d = dim as f64;
    let corr = |rot: f64| (d * (old / (rot * 2.0 * PI)).ln()) / (2.0 * theta.ln());
    let (mut low, mut high) = (corr(beta.0), corr(beta.1));
    if truncate {
        low = low.floor();
        high = high.ceil();
    }
    let (low, mut high) = (low.max(0.0), high.min(d - 1.0));
    if low == high {
        high += 0.001;
    }
    let inv = (0..dim / 2)
        .map(|i| {
            let pos_freq = theta.powf((2 * i) as f64 / d);
            let (extra, inter) = (1.0 / pos_freq, 1.0 / (factor * pos_freq));
            let ramp = ((i as f64 - low) / (high - low)).clamp(0.0, 1.0);
            let ef = 1.0 - ramp;
            inter * (1.0 - ef) + extra * ef
        })
        .collect();
    (inv, af)
}

#[test]
fn unscaled_and_linear_frequencies_follow_hf() {
    let f = freqs(&rope_op(10000.0, &[]), 64).unwrap();
    assert_eq!((f.rotary_dim, f.attention_factor), (64, 1.0));
    assert_rel(&f.inv_freq, &hf_default(10000.0, 64), "default");
    let f = freqs(
        &rope_op(
            10000.0,
            &[("scaling", Attr::Str("linear".into())), ("factor", fl(4.0))],
        ),
        64,
    )
    .unwrap();
    let want: Vec<f64> = hf_default(10000.0, 64).iter().map(|v| v / 4.0).collect();
    assert_rel(&f.inv_freq, &want, "linear");
}

/// Llama-3.1-8B: head dim 128, θ = 500000, `rope_scaling` {factor 8, low_freq_factor 1,
/// high_freq_factor 4, original_max_position_embeddings 8192}.
#[test]
fn llama3_frequencies_of_llama_3_1_8b() {
    let op = rope_op(
        500000.0,
        &[
            ("scaling", Attr::Str("llama3".into())),
            ("factor", fl(8.0)),
            ("low_freq_factor", fl(1.0)),
            ("high_freq_factor", fl(4.0)),
            ("original_max_position_embeddings", Attr::Int(8192)),
        ],
    );
    let f = freqs(&op, 128).unwrap();
    assert_eq!((f.inv_freq.len(), f.attention_factor), (64, 1.0));
    assert_rel(
        &f.inv_freq,
        &hf_llama3(500000.0, 128, 8.0, 1.0, 4.0, 8192.0),
        "llama3",
    );
    // High frequencies unchanged, the band 29..=34 smoothed, 35.. divided by 8.
    for (i, want) in [
        (0, 1.0),
        (28, 0.003211445994752591),
        (29, 0.002166570763503359),
        (32, 0.0005248461609929547),
        (34, 0.0001785078127679964),
        (35, 9.556212353964683e-05),
        (63, 3.068925988914511e-07),
    ] {
        assert!(
            (f.inv_freq[i] - want).abs() <= 1e-14 * want,
            "inv_freq[{i}] = {:e}, want {want:e}",
            f.inv_freq[i]
        );
    }
}

#[test]
fn yarn_frequencies_and_attention_factor() {
    // Qwen2.5 with YaRN: head dim 128, θ = 1e6, factor 4, original 32768 (correction range
    // 23..40, truncated).
    let qwen = rope_op(
        1e6,
        &[
            ("scaling", Attr::Str("yarn".into())),
            ("factor", fl(4.0)),
            ("original_max_position_embeddings", Attr::Int(32768)),
        ],
    );
    let f = freqs(&qwen, 128).unwrap();
    let (want, af) = hf_yarn(1e6, 128, 4.0, 32768.0, (32.0, 1.0), true, (None, None));
    assert_rel(&f.inv_freq, &want, "yarn qwen");
    assert_eq!(f.attention_factor, af);
    assert!((af - 1.138629436111989).abs() < 1e-15);
    for (i, w) in [
        (0, 1.0),
        (20, 0.01333521432163324),
        (30, 0.0010643609812470017),
        (63, 3.102344401879299e-07),
    ] {
        assert!(
            (f.inv_freq[i] - w).abs() <= 1e-14 * w,
            "qwen inv_freq[{i}] = {:e}, want {w:e}",
            f.inv_freq[i]
        );
    }
    // gpt-oss: head dim 64, θ = 150000, factor 32, original 4096, truncate false.
    let oss = rope_op(
        150000.0,
        &[
            ("scaling", Attr::Str("yarn".into())),
            ("factor", fl(32.0)),
            ("original_max_position_embeddings", Attr::Int(4096)),
            ("beta_fast", fl(32.0)),
            ("beta_slow", fl(1.0)),
            ("truncate", Attr::Bool(false)),
        ],
    );
    let f = freqs(&oss, 64).unwrap();
    let (want, af) = hf_yarn(150000.0, 64, 32.0, 4096.0, (32.0, 1.0), false, (None, None));
    assert_rel(&f.inv_freq, &want, "yarn gpt-oss");
    assert!((f.attention_factor - 1.3465735902799727).abs() < 1e-15 && f.attention_factor == af);
    for (i, w) in [
        (8, 0.050813274815461475),
        (12, 0.006794959489732219),
        (20, 1.818833668168956e-05),
        (31, 3.0235114281192144e-07),
    ] {
        assert!(
            (f.inv_freq[i] - w).abs() <= 1e-14 * w,
            "gpt-oss inv_freq[{i}] = {:e}, want {w:e}",
            f.inv_freq[i]
        );
    }
    // DeepSeek-V3's mscale/mscale_all_dim ratio, and an explicit attention_factor.
    let ms = |a: f64, b: f64| {
        rope_op(
            10000.0,
            &[
                ("scaling", Attr::Str("yarn".into())),
                ("factor", fl(40.0)),
                ("original_max_position_embeddings", Attr::Int(4096)),
                ("mscale", fl(a)),
                ("mscale_all_dim", fl(b)),
            ],
        )
    };
    assert_eq!(freqs(&ms(1.0, 1.0), 64).unwrap().attention_factor, 1.0);
    assert!(
        (freqs(&ms(0.707, 1.0), 64).unwrap().attention_factor - 0.9210423553163399).abs() < 1e-15
    );
    let given = rope_op(
        10000.0,
        &[
            ("scaling", Attr::Str("yarn".into())),
            ("factor", fl(40.0)),
            ("original_max_position_embeddings", Attr::Int(4096)),
            ("attention_factor", fl(0.5)),
        ],
    );
    assert_eq!(freqs(&given, 64).unwrap().attention_factor, 0.5);
}

/// A partial rotary dim rotates the first R features at θ^(−2i/R) and copies the rest; YaRN's
/// attention factor scales only the rotated ones.
#[test]
fn partial_rotary_dims_pass_the_rest_through() {
    let src = "func @main(%x: f32[1, 6], %p: i32[1]) {
  %h: f32[1, 6] = rope(%x, %p) {theta=10000.0, rotary_dim=4}
  %i: f32[1, 6] = rope(%x, %p) {theta=10000.0, form=\"interleaved\", rotary_dim=4}
  %y: f32[1, 6] = rope(%x, %p) {theta=10000.0, rotary_dim=2, scaling=\"yarn\", factor=2.0, original_max_position_embeddings=16, attention_factor=1.5}
  return %h, %i, %y
}";
    let x = [0.5, -0.25, 2.0, 1.0, 3.0, -7.0];
    let out = eval(
        src,
        &[
            &t(DType::F32, &[1, 6], x.to_vec()),
            &t(DType::I32, &[1], vec![3.0]),
        ],
    );
    let f = |v: f64| v as f32 as f64;
    // R = 4: inv_freq = [1, 10000^(−1/2)].
    let (a0, a1) = (3.0f64, 3.0 * 0.01);
    let rot = |xa: f64, xb: f64, a: f64, k: f64| {
        (
            f(k * (xa * a.cos() - xb * a.sin())),
            f(k * (xb * a.cos() + xa * a.sin())),
        )
    };
    let (h0, h2) = rot(x[0], x[2], a0, 1.0);
    let (h1, h3) = rot(x[1], x[3], a1, 1.0);
    assert_eq!(out[0].data(), &[h0, h1, h2, h3, x[4], x[5]]);
    let (i0, i1) = rot(x[0], x[1], a0, 1.0);
    let (i2, i3) = rot(x[2], x[3], a1, 1.0);
    assert_eq!(out[1].data(), &[i0, i1, i2, i3, x[4], x[5]]);
    // R = 2: one pair at inv_freq 1 (YaRN's ramp keeps pair 0 extrapolated), scaled by 1.5.
    let fy = freqs(
        &rope_op(
            10000.0,
            &[
                ("rotary_dim", Attr::Int(2)),
                ("scaling", Attr::Str("yarn".into())),
                ("factor", fl(2.0)),
                ("original_max_position_embeddings", Attr::Int(16)),
                ("attention_factor", fl(1.5)),
            ],
        ),
        6,
    )
    .unwrap();
    assert_eq!(fy.inv_freq, vec![1.0]);
    let (y0, y1) = (
        f(x[0] * (1.5 * a0.cos()) - x[1] * (1.5 * a0.sin())),
        f(x[1] * (1.5 * a0.cos()) + x[0] * (1.5 * a0.sin())),
    );
    assert_eq!(out[2].data(), &[y0, y1, x[2], x[3], x[4], x[5]]);
}

#[test]
fn bad_rope_attributes_are_refused_by_the_verifier() {
    let case = |attrs: &str| {
        let src = format!("func @main(%x: f32[2, 8], %p: i32[2]) {{\n  %y: f32[2, 8] = rope(%x, %p) {{theta=10000.0, {attrs}}}\n  return %y\n}}");
        let g = crate::parse(&src).unwrap_or_else(|e| panic!("parse: {e}"));
        crate::verify(&g).expect_err(attrs).to_string()
    };
    for (attrs, want) in [
        ("rotary_dim=3", "attribute `rotary_dim` must be even and at least 2, got 3"),
        ("rotary_dim=10", "attribute `rotary_dim` (10) exceeds the rotary axis (8)"),
        ("scaling=\"linear\"", "scaling=\"linear\" needs attribute `factor`"),
        ("factor=2.0", "attribute `factor` belongs to scaling=\"linear\" or \"llama3\" or \"yarn\", not scaling=\"none\""),
        ("scaling=\"linear\", factor=2.0, beta_fast=4.0", "attribute `beta_fast` belongs to scaling=\"yarn\", not scaling=\"linear\""),
        ("scaling=\"llama3\", factor=8.0, low_freq_factor=4.0, high_freq_factor=1.0, original_max_position_embeddings=8192", "needs high_freq_factor above low_freq_factor"),
        ("scaling=\"yarn\", factor=4.0", "scaling=\"yarn\" needs attribute `original_max_position_embeddings`"),
        ("scaling=\"yarn\", factor=-4.0, original_max_position_embeddings=64", "attribute `factor` must be above 0, got -4.0"),
        ("scaling=\"yarn\", factor=4.0, original_max_position_embeddings=0", "`original_max_position_embeddings` must be a positive integer"),
    ] {
        let e = case(attrs);
        assert!(e.contains(want), "{attrs}: {e}");
    }
    // Every scaling's complete attribute set verifies and prints back as written.
    let src = "func @main(%x: f32[2, 8], %p: i32[2]) {\n  %y: f32[2, 8] = rope(%x, %p) {theta=10000.0, rotary_dim=4, scaling=\"llama3\", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=8192}\n  return %y\n}\n";
    assert_eq!(crate::print(&graph(src)), src);
}

#[test]
fn logical_ops_broadcast_over_bool() {
    let src = "func @main(%a: bool[2, 2], %b: bool[2]) {
  %x: bool[2, 2] = logical_and(%a, %b)
  %y: bool[2, 2] = logical_or(%a, %b)
  %z: bool[2, 2] = logical_not(%a)
  return %x, %y, %z
}";
    let a = t(DType::Bool, &[2, 2], vec![0.0, 1.0, 0.0, 1.0]);
    let b = t(DType::Bool, &[2], vec![0.0, 1.0]);
    let out = eval(src, &[&a, &b]);
    assert_eq!(out[0].data(), &[0.0, 1.0, 0.0, 1.0]);
    assert_eq!(out[1].data(), &[0.0, 1.0, 0.0, 1.0]);
    assert_eq!(out[2].data(), &[1.0, 0.0, 1.0, 0.0]);
    let b2 = t(DType::Bool, &[2], vec![1.0, 0.0]);
    let out = eval(src, &[&a, &b2]);
    assert_eq!(out[0].data(), &[0.0, 0.0, 0.0, 0.0]);
    assert_eq!(out[1].data(), &[1.0, 1.0, 1.0, 1.0]);
    // A mask built from comparisons: 1 ≤ i < 3.
    let src = "func @main(%i: i32[4]) {
  %lo: i32[] = constant() {value=1.0, dtype=i32}
  %hi: i32[] = constant() {value=3.0, dtype=i32}
  %a: bool[4] = ge(%i, %lo)
  %b: bool[4] = lt(%i, %hi)
  %m: bool[4] = logical_and(%a, %b)
  return %m
}";
    let m = eval1(src, &[&t(DType::I32, &[4], vec![0.0, 1.0, 2.0, 3.0])]);
    assert_eq!(m.data(), &[0.0, 1.0, 1.0, 0.0]);
    // Operands other than bool are refused.
    let bad =
        "func @main(%a: f32[2], %b: f32[2]) {\n  %x: bool[2] = logical_or(%a, %b)\n  return %x\n}";
    let e = crate::verify(&crate::parse(bad).unwrap())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("`logical_or` takes bool operands: operand 0 is f32[2]"),
        "{e}"
    );
}
