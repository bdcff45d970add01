//! A Gemma 3 decoder written in Hugging Face's structure (`modeling_gemma3.py`, eager
//! attention), not the zoo's: the causal and sliding-window masks and the rotary cos/sin
//! tables (local and global θ) are built once in `main` from `iota` and passed into every
//! layer as tensors; each layer projects, splits and transposes the heads, RMS-norms Q and K,
//! applies RoPE with `rotate_half` on the passed-in tables, repeats the KV heads, adds the
//! mask to the scaled scores (after Gemma 2's logit softcap when one is set), takes the softmax
//! in f32, and runs a written-out tanh-GELU MLP. The passes must find the kernels of the
//! zoo's spelling (at most one more a layer), the window as the attention node's `window`
//! attribute, RoPE from the passed-in tables, the softcapped attention as one kernel, and at
//! most 9 kernels a layer (the gate). The tiny model's compiled graph equals the graph
//! as written on the interpreter.

use sinter::{graph, DType, Graph};
use sinter_ir::Family;
use sinter_passes::{compile, FusionReport, PassOptions, Target};

use super::passes::{check_against_reference, inputs};

/// Gemma 3's shape: hidden, heads, KV heads, head dim, FFN, vocab, which layers slide.
struct Shape {
    d: usize,
    h: usize,
    hkv: usize,
    hd: usize,
    ffn: usize,
    vocab: usize,
    window: usize,
    sliding: Vec<bool>,
    softcap: Option<f64>,
}

fn gemma3_1b() -> Shape {
    Shape { d: 1152, h: 4, hkv: 1, hd: 256, ffn: 6912, vocab: 262144, window: 512, sliding: (0..26).map(|i| (i + 1) % 6 != 0).collect(), softcap: None }
}

fn tiny(softcap: Option<f64>) -> Shape {
    Shape { d: 32, h: 4, hkv: 2, hd: 16, ffn: 48, vocab: 64, window: 3, sliding: vec![true, false, true], softcap }
}

/// The HF-structured decoder (prefill: `tokens` and `positions` of one sequence) in `dt`.
fn build(s: &Shape, dt: DType) -> Graph {
    let (d, h, hkv, hd, ffn, vocab) = (s.d, s.h, s.hkv, s.hd, s.ffn, s.vocab);
    let (qd, kvd, half, grp) = (h * hd, hkv * hd, hd / 2, h / hkv);
    let (eps, scaling, w) = (1e-6, 1.0 / (hd as f64).sqrt(), s.window as f64);
    let (capped, cap) = (s.softcap.is_some(), s.softcap.unwrap_or(1.0));
    let normaliser = sinter::zoo::gemma3::embed_scale(d, dt);
    let ninf = f64::NEG_INFINITY;
    let (sliding, n_layers) = (&s.sliding, s.sliding.len());
    let (two_over_hd, gelu_k, gelu_a) = (2.0 / hd as f64, (2.0 / std::f64::consts::PI).sqrt(), 0.044715);
    graph! {
        fn layer(x: {dt}[T, {d}], mask: {dt}[1, T, T], cos: {dt}[1, T, {hd}], sin: {dt}[1, T, {hd}],
                 attn_norm: {dt}[{d}], wq: {dt}[{qd}, {d}], wk: {dt}[{kvd}, {d}], wv: {dt}[{kvd}, {d}],
                 q_norm: {dt}[{hd}], k_norm: {dt}[{hd}], wo: {dt}[{d}, {qd}], post_attn_norm: {dt}[{d}],
                 ffn_norm: {dt}[{d}], w_gate: {dt}[{ffn}, {d}], w_up: {dt}[{ffn}, {d}], w_down: {dt}[{d}, {ffn}],
                 post_ffw_norm: {dt}[{d}])
            -> {dt}[T, {d}]
        {
            let x32 = x.cast(f32);
            let hn = (x32 * ((x32 * x32).mean(-1) + {eps}).rsqrt() * (attn_norm.cast(f32) + 1.0)).cast({dt});
            // q_proj / k_proj / v_proj, view(hidden_shape).transpose(1, 2).
            let q0 = hn.matmul(wq, transpose_b = true).reshape([T, {h}, {hd}]).transpose(0, 1);
            let k0 = hn.matmul(wk, transpose_b = true).reshape([T, {hkv}, {hd}]).transpose(0, 1);
            let v0 = hn.matmul(wv, transpose_b = true).reshape([T, {hkv}, {hd}]).transpose(0, 1);
            let q32 = q0.cast(f32);
            let k32 = k0.cast(f32);
            let qn = (q32 * ((q32 * q32).mean(-1) + {eps}).rsqrt() * (q_norm.cast(f32) + 1.0)).cast({dt});
            let kn = (k32 * ((k32 * k32).mean(-1) + {eps}).rsqrt() * (k_norm.cast(f32) + 1.0)).cast({dt});
            // apply_rotary_pos_emb: x·cos + rotate_half(x)·sin.
            let q = qn * cos + concat([qn.slice(-1, {half}, {hd}).neg(), qn.slice(-1, 0, {half})], -1) * sin;
            let k1 = kn * cos + concat([kn.slice(-1, {half}, {hd}).neg(), kn.slice(-1, 0, {half})], -1) * sin;
            // repeat_kv.
            let k = k1.reshape([{hkv}, 1, T, {hd}]).broadcast([{hkv}, {grp}, T, {hd}]).reshape([{h}, T, {hd}]);
            let v = v0.reshape([{hkv}, 1, T, {hd}]).broadcast([{hkv}, {grp}, T, {hd}]).reshape([{h}, T, {hd}]);
            let s0 = (q @ k.transpose(-2, -1)) * {scaling};
            let scores = if capped { (s0 / {cap}).tanh() * {cap} } else { s0 };
            let probs = (scores + mask).cast(f32).softmax(-1).cast({dt});
            let attn = (probs @ v).transpose(0, 1).reshape([T, {qd}]);
            let a32 = attn.matmul(wo, transpose_b = true).cast(f32);
            let x1 = x + (a32 * ((a32 * a32).mean(-1) + {eps}).rsqrt() * (post_attn_norm.cast(f32) + 1.0)).cast({dt});
            let y32 = x1.cast(f32);
            let hn2 = (y32 * ((y32 * y32).mean(-1) + {eps}).rsqrt() * (ffn_norm.cast(f32) + 1.0)).cast({dt});
            // gelu_pytorch_tanh written out.
            let g = hn2.matmul(w_gate, transpose_b = true);
            let gl = g * 0.5 * ((((g * g * g) * {gelu_a} + g) * {gelu_k}).tanh() + 1.0);
            let m32 = (gl * hn2.matmul(w_up, transpose_b = true)).matmul(w_down, transpose_b = true).cast(f32);
            x1 + (m32 * ((m32 * m32).mean(-1) + {eps}).rsqrt() * (post_ffw_norm.cast(f32) + 1.0)).cast({dt})
        }

        fn main(tokens: i64[T], positions: i32[T]) -> {dt}[T, {vocab}] {
            let embed = weight("token_embd.weight", {dt}[{vocab}, {d}]);
            let mut x = embed.gather(tokens) * constant(normaliser, {dt});
            // Gemma3RotaryEmbedding, local and global: cos/sin of positions · inv_freq.
            let p = positions.cast(f32).reshape([T, 1]);
            let ex = iota(f32, [{half}], 0) * {two_over_hd};
            let fl = p * (constant(10000.0, f32).pow(ex)).recip();
            let fg = p * (constant(1000000.0, f32).pow(ex)).recip();
            let el = concat([fl, fl], -1);
            let eg = concat([fg, fg], -1);
            let cos_l = el.cos().cast({dt}).reshape([1, T, {hd}]);
            let sin_l = el.sin().cast({dt}).reshape([1, T, {hd}]);
            let cos_g = eg.cos().cast({dt}).reshape([1, T, {hd}]);
            let sin_g = eg.sin().cast({dt}).reshape([1, T, {hd}]);
            // create_causal_mask / create_sliding_window_causal_mask.
            let qi = iota(i32, [T, 1], 0);
            let kj = iota(i32, [1, T], 1);
            let causal = kj <= qi;
            let local = causal.logical_and((qi - kj) < constant(w, i32));
            let full_mask = causal.select(constant(0.0, {dt}), constant(ninf, {dt})).reshape([1, T, T]);
            let local_mask = local.select(constant(0.0, {dt}), constant(ninf, {dt})).reshape([1, T, T]);
            for i in 0..n_layers {
                let (m, c, sn) = if sliding[i] { (local_mask, cos_l, sin_l) } else { (full_mask, cos_g, sin_g) };
                x = layer(x, m, c, sn,
                    weight(format!("blk.{i}.attn_norm.weight"), {dt}[{d}]),
                    weight(format!("blk.{i}.attn_q.weight"), {dt}[{qd}, {d}]),
                    weight(format!("blk.{i}.attn_k.weight"), {dt}[{kvd}, {d}]),
                    weight(format!("blk.{i}.attn_v.weight"), {dt}[{kvd}, {d}]),
                    weight(format!("blk.{i}.attn_q_norm.weight"), {dt}[{hd}]),
                    weight(format!("blk.{i}.attn_k_norm.weight"), {dt}[{hd}]),
                    weight(format!("blk.{i}.attn_output.weight"), {dt}[{d}, {qd}]),
                    weight(format!("blk.{i}.post_attention_norm.weight"), {dt}[{d}]),
                    weight(format!("blk.{i}.ffn_norm.weight"), {dt}[{d}]),
                    weight(format!("blk.{i}.ffn_gate.weight"), {dt}[{ffn}, {d}]),
                    weight(format!("blk.{i}.ffn_up.weight"), {dt}[{ffn}, {d}]),
                    weight(format!("blk.{i}.ffn_down.weight"), {dt}[{d}, {ffn}]),
                    weight(format!("blk.{i}.post_ffw_norm.weight"), {dt}[{d}]));
            }
            let x32 = x.cast(f32);
            let xn = (x32 * ((x32 * x32).mean(-1) + {eps}).rsqrt() * (weight("output_norm.weight", {dt}[{d}]).cast(f32) + 1.0)).cast({dt});
            xn.matmul(embed, transpose_b = true)
        }
    }
    .unwrap()
}

/// The attention kernels of layer call `k` with their window and softcap.
fn attention_attrs(report: &FusionReport, kg: &sinter_ir::KernelGraph, k: usize) -> Vec<(Option<i64>, Option<f64>)> {
    let origin = format!("layer#{k}");
    report
        .kernels
        .iter()
        .filter(|r| r.origin == origin && r.family == Family::Attention)
        .flat_map(|r| kg.kernels[r.kernel].body.nodes.values().filter(|n| n.op.kind.name() == "attention").map(|n| (n.op.int("window"), n.op.float("softcap"))))
        .collect()
}

fn layer_kernels(report: &FusionReport, k: usize) -> Vec<String> {
    let origin = format!("layer#{k}");
    report.kernels.iter().filter(|r| r.origin == origin && !r.load_time).map(|r| format!("{:?}[{}]", r.family, r.ops.join(" "))).collect()
}

/// The zoo's Gemma 3 (`sinter::zoo::gemma3`, RoPE before the transpose, `window` written
/// as the attribute) at Gemma-3-1B's shape.
fn zoo_1b() -> sinter::zoo::gemma3::Gemma3Config {
    let s = gemma3_1b();
    sinter::zoo::gemma3::Gemma3Config {
        vocab: s.vocab,
        hidden: s.d,
        n_heads: s.h,
        n_kv_heads: s.hkv,
        head_dim: s.hd,
        ffn: s.ffn,
        query_pre_attn_scalar: s.hd as f64,
        sliding_window: s.window,
        sliding: s.sliding,
        ..sinter::zoo::gemma3::Gemma3Config::gemma3_270m()
    }
}

/// Gemma-3-1B in HF structure: the masks fold into `window` (sliding layers) and `causal`
/// (full layers), RoPE is recognised from the passed-in tables, GELU is found, and the
/// layer takes no more kernels a step than the zoo's spelling does.
#[test]
fn gemma3_1b_in_hf_structure_lowers_like_the_zoo_spelling() {
    let g = build(&gemma3_1b(), DType::BF16);
    let (kg, report) = compile(&g, &Target::SM_90A, &PassOptions::for_graph(&g)).unwrap();
    let per_layer = report.kernels_per_call("layer").unwrap();
    let zoo = sinter::zoo::gemma3::build(&zoo_1b(), sinter::zoo::Mode::Prefill, DType::BF16).unwrap();
    let (_, zoo_report) = compile(&zoo, &Target::SM_90A, &PassOptions::for_graph(&zoo)).unwrap();
    let n_layers = gemma3_1b().sliding.len();
    eprintln!(
        "gemma-3-1b prefill: HF structure {} kernels ({per_layer} per layer), zoo spelling {} kernels; HF layer 0: {:?}",
        report.kernels_after(),
        zoo_report.kernels_after(),
        layer_kernels(&report, 0)
    );
    // Sliding layers get window=512, full ones (every 6th) none; no mask reaches a kernel.
    for k in [0, 5] {
        let want = if k == 5 { None } else { Some(512) };
        assert_eq!(attention_attrs(&report, &kg, k), vec![(want, None)], "layer {k}\n{report}");
    }
    let composite = report.composite_ops();
    assert_eq!((composite.get("rope"), composite.get("gelu")), (Some(&(2 * n_layers)), Some(&n_layers)), "{report}");
    assert!(!report.kernels.iter().any(|r| r.ops.iter().any(|o| o == "iota" || o == "tanh" || o == "softmax" || o == "sin")), "{report}");
    // At most one kernel a layer more than the zoo's spelling (which also writes the KV cache).
    assert!(report.kernels_after() <= zoo_report.kernels_after() + n_layers, "HF {} vs zoo {}\n{report}", report.kernels_after(), zoo_report.kernels_after());
}

/// The gate: at most 9 kernels a layer — QKV, Q norm + RoPE, K norm + RoPE,
/// attention (`bshd`, the transposes folded), O, post-attention norm + residual + pre-FFN
/// norm, gate/up + GELU, down, post-FFN norm + residual + the next layer's input norm (each
/// `1 + w` computed in its norm's kernel).
#[test]
fn gemma3_1b_in_hf_structure_lowers_to_at_most_9_kernels_a_layer() {
    let g = build(&gemma3_1b(), DType::BF16);
    let (_, report) = compile(&g, &Target::SM_90A, &PassOptions::for_graph(&g)).unwrap();
    let per_layer = report.kernels_per_call("layer").unwrap();
    assert!(per_layer <= 9, "{per_layer} kernels a layer\n{report}");
}

#[test]
fn gemma3_hf_structure_softcapped_attention_is_one_kernel_and_matches_the_reference() {
    for softcap in [None, Some(50.0)] {
        let s = tiny(softcap);
        let g = build(&s, DType::F32);
        let (kg, report) = compile(&g, &Target::SM_90A, &PassOptions::for_graph(&g)).unwrap();
        eprintln!("tiny gemma3 HF softcap {softcap:?}: {} per layer: {:?}", report.kernels_per_call("layer").unwrap(), layer_kernels(&report, 0));
        for k in 0..s.sliding.len() {
            let want = if s.sliding[k] { Some(s.window as i64) } else { None };
            assert_eq!(attention_attrs(&report, &kg, k), vec![(want, softcap)], "layer {k}\n{report}");
            let kernels = layer_kernels(&report, k);
            assert!(!kernels.iter().any(|k| k.contains("tanh") || k.contains("softmax")), "{kernels:?}");
        }
        check_against_reference(&format!("gemma3 HF softcap {softcap:?}"), &g, &kg, &inputs(&g, 5, false));
    }
}
