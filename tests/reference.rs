//! The zoo's models against hand-written references.
//!
//! Each reference is plain Rust over `Vec<f32>` — no DSL, no IR, no interpreter — written from
//! the models' definitions (the Llama decoder of `src/zoo/llama.rs`, GPT-2 of
//! `src/zoo/gpt2.rs`). Values are stored in f32; dot products and row statistics accumulate in
//! f64 (the interpreter accumulates in f64 and rounds once per op, so an f32 accumulator would
//! only add noise); RoPE angles are computed in f64, as the `rope` op does. The tests build each
//! tiny model in f32, bind the same seeded random weights to the graph and to the reference, run
//! a 7-token prefill on the interpreter through the facade and compare with DESIGN.md's f32
//! tolerance: element-wise `|out − ref| ≤ 1e-6·max|ref| + 1e-5·|ref|`, norm-wise
//! `‖out − ref‖ / ‖ref‖ < 1e-5`.

use std::collections::BTreeMap;

use sinter::zoo::gpt2::{self, Gpt2Config};
use sinter::zoo::llama::{self, LlamaConfig};
use sinter::zoo::Mode;
use sinter::{Backend, DType, Program, Tensor};

use crate::zoo::bind_random_weights;

/// Weights by name, as f32.
type Weights = BTreeMap<String, Vec<f32>>;

/// The 7-token prompt every test runs.
const PROMPT: [usize; 7] = [3, 17, 42, 5, 9, 60, 1];

fn weight<'a>(ws: &'a Weights, name: &str) -> &'a [f32] {
    ws.get(name).unwrap_or_else(|| panic!("no weight `{name}` was bound"))
}

fn to_f32(bound: &BTreeMap<String, Tensor>) -> Weights {
    bound.iter().map(|(k, t)| (k.clone(), t.data().iter().map(|&x| x as f32).collect())).collect()
}

// ------------------------------------------------------------------------------------------
// Building blocks, written for this file only.

/// `y[r, o] = Σ_i x[r, i] · w[o, i] (+ bias[o])`: `x` is `[rows, n_in]`, `w` is stored
/// `[n_out, n_in]`; the sum accumulates in f64 and is rounded to f32 once, then the bias is added.
fn linear(x: &[f32], n_in: usize, w: &[f32], n_out: usize, bias: Option<&[f32]>) -> Vec<f32> {
    assert_eq!(x.len() % n_in, 0);
    assert_eq!(w.len(), n_out * n_in);
    let rows = x.len() / n_in;
    let mut y = vec![0f32; rows * n_out];
    for r in 0..rows {
        let xr = &x[r * n_in..(r + 1) * n_in];
        for o in 0..n_out {
            let wo = &w[o * n_in..(o + 1) * n_in];
            let mut v = xr.iter().zip(wo).map(|(&a, &b)| a as f64 * b as f64).sum::<f64>() as f32;
            if let Some(b) = bias {
                v += b[o];
            }
            y[r * n_out + o] = v;
        }
    }
    y
}

/// RMSNorm over rows of width `d`: `(x · 1/sqrt(mean(x²) + eps)) · w`, `eps` added in f32.
fn rms_norm(x: &[f32], d: usize, w: &[f32], eps: f32) -> Vec<f32> {
    let mut y = vec![0f32; x.len()];
    for (src, dst) in x.chunks(d).zip(y.chunks_mut(d)) {
        let ms = (src.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / d as f64) as f32;
        let r = 1.0 / (ms + eps).sqrt();
        for ((o, &v), &wv) in dst.iter_mut().zip(src).zip(w) {
            *o = (v * r) * wv;
        }
    }
    y
}

/// LayerNorm over rows of width `d`: `(x − mean) / sqrt(var + eps) · w + b`, biased variance,
/// `eps` added in f32.
fn layer_norm(x: &[f32], d: usize, w: &[f32], b: &[f32], eps: f32) -> Vec<f32> {
    let mut y = vec![0f32; x.len()];
    for (src, dst) in x.chunks(d).zip(y.chunks_mut(d)) {
        let mean = src.iter().map(|&v| v as f64).sum::<f64>() / d as f64;
        let var = (src.iter().map(|&v| (v as f64 - mean) * (v as f64 - mean)).sum::<f64>() / d as f64) as f32;
        let sd = (var + eps).sqrt();
        for (((o, &v), &wv), &bv) in dst.iter_mut().zip(src).zip(w).zip(b) {
            *o = ((v - mean as f32) / sd) * wv + bv;
        }
    }
    y
}

/// Rotary position embedding of `x: [T, heads, hd]` in place; token `t` is at `positions[t]`.
/// Pair `i` (of `hd/2`) is rotated by `p · theta^(−2i/hd)`; `rotate_half` pairs `(i, i + hd/2)`,
/// `interleaved` pairs `(2i, 2i + 1)`.
fn rope(x: &mut [f32], heads: usize, hd: usize, positions: &[usize], theta: f64, interleaved: bool) {
    let half = hd / 2;
    for (t, &p) in positions.iter().enumerate() {
        for h in 0..heads {
            let row = &mut x[(t * heads + h) * hd..(t * heads + h + 1) * hd];
            for i in 0..half {
                let angle = p as f64 * theta.powf(-((2 * i) as f64) / hd as f64);
                let (s, c) = (angle.sin() as f32, angle.cos() as f32);
                let (a, b) = if interleaved { (2 * i, 2 * i + 1) } else { (i, i + half) };
                let (xa, xb) = (row[a], row[b]);
                row[a] = xa * c - xb * s;
                row[b] = xb * c + xa * s;
            }
        }
    }
}

/// Causal multi-head attention with grouped KV heads. `q: [T, heads, hd]`, `k`, `v:
/// [T, kv_heads, hd]`; query head `h` reads KV head `h / (heads / kv_heads)`; query `i` sees keys
/// `j ≤ i`; scores `(q·k)·scale`, safe softmax. Returns `[T, heads·hd]` (heads concatenated).
fn causal_attention(q: &[f32], k: &[f32], v: &[f32], heads: usize, kv_heads: usize, hd: usize, scale: f32) -> Vec<f32> {
    let t_len = q.len() / (heads * hd);
    let group = heads / kv_heads;
    let mut out = vec![0f32; t_len * heads * hd];
    for h in 0..heads {
        let kvh = h / group;
        for i in 0..t_len {
            let qi = &q[(i * heads + h) * hd..(i * heads + h + 1) * hd];
            let mut scores = vec![f32::NEG_INFINITY; t_len];
            for (j, s) in scores.iter_mut().enumerate().take(i + 1) {
                let kj = &k[(j * kv_heads + kvh) * hd..(j * kv_heads + kvh + 1) * hd];
                let dot = qi.iter().zip(kj).map(|(&a, &b)| a as f64 * b as f64).sum::<f64>() as f32;
                *s = dot * scale;
            }
            let m = scores.iter().fold(f32::NEG_INFINITY, |m, &s| m.max(s));
            let e: Vec<f32> = scores.iter().map(|&s| (s - m).exp()).collect();
            let sum = e.iter().map(|&x| x as f64).sum::<f64>() as f32;
            let o = &mut out[(i * heads + h) * hd..(i * heads + h + 1) * hd];
            for (c, oc) in o.iter_mut().enumerate() {
                let acc: f64 = e.iter().take(i + 1).enumerate().map(|(j, &ej)| (ej / sum) as f64 * v[(j * kv_heads + kvh) * hd + c] as f64).sum();
                *oc = acc as f32;
            }
        }
    }
    out
}

fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// GELU, tanh form (GPT-2): `x/2 · (1 + tanh(sqrt(2/π)·(x + 0.044715·x³)))`.
fn gelu_tanh(x: f32) -> f32 {
    let k = (2.0 / std::f32::consts::PI).sqrt();
    0.5 * x * (1.0 + (k * (x + 0.044715 * x * x * x)).tanh())
}

fn add_into(x: &mut [f32], y: &[f32]) {
    for (a, b) in x.iter_mut().zip(y) {
        *a += b;
    }
}

// ------------------------------------------------------------------------------------------
// The models.

/// What the Llama reference computes for a prompt.
struct LlamaOut {
    /// `[T, vocab]`.
    logits: Vec<f32>,
    /// Per layer, the keys after RoPE, `[T, kv_heads, head_dim]`.
    keys: Vec<Vec<f32>>,
    /// Per layer, the values, `[T, kv_heads, head_dim]`.
    values: Vec<Vec<f32>>,
}

/// The Llama decoder of `src/zoo/llama.rs`, prefill of one sequence: embedding lookup; per
/// layer RMSNorm → Q/K/V projections → RoPE on Q and K → GQA causal attention → output
/// projection → residual → RMSNorm → SwiGLU MLP → residual; final RMSNorm; LM head
/// (`output.weight` if bound, else tied to `token_embd.weight`).
fn llama_reference(cfg: &LlamaConfig, ws: &Weights, tokens: &[usize], positions: &[usize]) -> LlamaOut {
    let (d, h, hkv, hd, ffn, vocab) = (cfg.hidden, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.ffn, cfg.vocab);
    let eps = cfg.rms_eps as f32;
    let interleaved = match cfg.rope_form {
        "rotate_half" => false,
        "interleaved" => true,
        other => panic!("unknown rope form {other}"),
    };
    let scale = (1.0 / (hd as f64).sqrt()) as f32;
    let embed = weight(ws, "token_embd.weight");
    let mut x: Vec<f32> = tokens.iter().flat_map(|&t| embed[t * d..(t + 1) * d].iter().copied()).collect();
    let (mut keys, mut values) = (Vec::new(), Vec::new());
    for l in 0..cfg.n_layers {
        let wn = |n: &str| weight(ws, &format!("blk.{l}.{n}.weight"));
        let hn = rms_norm(&x, d, wn("attn_norm"), eps);
        let mut q = linear(&hn, d, wn("attn_q"), h * hd, None);
        let mut k = linear(&hn, d, wn("attn_k"), hkv * hd, None);
        let v = linear(&hn, d, wn("attn_v"), hkv * hd, None);
        rope(&mut q, h, hd, positions, cfg.rope_theta, interleaved);
        rope(&mut k, hkv, hd, positions, cfg.rope_theta, interleaved);
        let attn = causal_attention(&q, &k, &v, h, hkv, hd, scale);
        add_into(&mut x, &linear(&attn, h * hd, wn("attn_output"), d, None));
        let hn2 = rms_norm(&x, d, wn("ffn_norm"), eps);
        let gate = linear(&hn2, d, wn("ffn_gate"), ffn, None);
        let up = linear(&hn2, d, wn("ffn_up"), ffn, None);
        let act: Vec<f32> = gate.iter().zip(&up).map(|(&g, &u)| silu(g) * u).collect();
        add_into(&mut x, &linear(&act, ffn, wn("ffn_down"), d, None));
        keys.push(k);
        values.push(v);
    }
    let xn = rms_norm(&x, d, weight(ws, "output_norm.weight"), eps);
    let head = ws.get("output.weight").map(Vec::as_slice).unwrap_or(embed);
    LlamaOut { logits: linear(&xn, d, head, vocab, None), keys, values }
}

/// GPT-2 as `src/zoo/gpt2.rs` defines it: token plus position embedding; per block LayerNorm →
/// fused QKV projection with bias → causal multi-head attention → output projection with bias →
/// residual → LayerNorm → up projection with bias → tanh-GELU → down projection with bias →
/// residual; final LayerNorm; LM head tied to `token_embd.weight`. Returns `[T, vocab]`.
fn gpt2_reference(cfg: &Gpt2Config, ws: &Weights, tokens: &[usize], positions: &[usize]) -> Vec<f32> {
    let (d, nh, ffn, vocab) = (cfg.hidden, cfg.n_heads, cfg.ffn, cfg.vocab);
    let hd = d / nh;
    let eps = cfg.ln_eps as f32;
    let scale = (1.0 / (hd as f64).sqrt()) as f32;
    let (wte, wpe) = (weight(ws, "token_embd.weight"), weight(ws, "position_embd.weight"));
    let mut x = Vec::with_capacity(tokens.len() * d);
    for (&t, &p) in tokens.iter().zip(positions) {
        x.extend((0..d).map(|i| wte[t * d + i] + wpe[p * d + i]));
    }
    for l in 0..cfg.n_layers {
        let wn = |n: &str| weight(ws, &format!("blk.{l}.{n}.weight"));
        let bn = |n: &str| weight(ws, &format!("blk.{l}.{n}.bias"));
        let hn = layer_norm(&x, d, wn("attn_norm"), bn("attn_norm"), eps);
        let qkv = linear(&hn, d, wn("attn_qkv"), 3 * d, Some(bn("attn_qkv")));
        let (mut q, mut k, mut v) = (Vec::new(), Vec::new(), Vec::new());
        for row in qkv.chunks(3 * d) {
            q.extend_from_slice(&row[..d]);
            k.extend_from_slice(&row[d..2 * d]);
            v.extend_from_slice(&row[2 * d..]);
        }
        let attn = causal_attention(&q, &k, &v, nh, nh, hd, scale);
        add_into(&mut x, &linear(&attn, d, wn("attn_output"), d, Some(bn("attn_output"))));
        let hn2 = layer_norm(&x, d, wn("ffn_norm"), bn("ffn_norm"), eps);
        let up: Vec<f32> = linear(&hn2, d, wn("ffn_up"), ffn, Some(bn("ffn_up"))).into_iter().map(gelu_tanh).collect();
        add_into(&mut x, &linear(&up, ffn, wn("ffn_down"), d, Some(bn("ffn_down"))));
    }
    let xn = layer_norm(&x, d, weight(ws, "output_norm.weight"), weight(ws, "output_norm.bias"), eps);
    linear(&xn, d, wte, vocab, None)
}

// ------------------------------------------------------------------------------------------
// Comparison.

/// Checks `out` against `reference` with DESIGN.md's f32 tolerance; returns the largest
/// element-wise error and the norm-wise error, and prints them (`--nocapture` shows them).
fn assert_close(what: &str, out: &[f64], reference: &[f32]) -> (f64, f64) {
    assert_eq!(out.len(), reference.len(), "{what}: lengths differ");
    let max_ref = reference.iter().fold(0f64, |m, &r| m.max((r as f64).abs()));
    let (mut max_err, mut num, mut den) = (0f64, 0f64, 0f64);
    for (i, (&o, &r)) in out.iter().zip(reference).enumerate() {
        let r = r as f64;
        let e = (o - r).abs();
        assert!(e <= 1e-6 * max_ref + 1e-5 * r.abs(), "{what}[{i}]: interpreter {o} vs reference {r} (error {e:e}, max|ref| {max_ref})");
        max_err = max_err.max(e);
        num += e * e;
        den += r * r;
    }
    let norm = if den > 0.0 { (num / den).sqrt() } else { num.sqrt() };
    assert!(norm < 1e-5, "{what}: norm-wise error {norm:e} ≥ 1e-5");
    eprintln!("{what}: max |out − ref| = {max_err:.3e} (max|ref| = {max_ref:.3e}), ‖out − ref‖/‖ref‖ = {norm:.3e}");
    (max_err, norm)
}

fn i_tensor(dtype: DType, v: &[usize]) -> Tensor {
    Tensor::new(dtype, &[v.len()], v.iter().map(|&x| x as f64).collect()).unwrap()
}

// ------------------------------------------------------------------------------------------
// Tests.

/// Runs a Llama prefill of [`PROMPT`] on the interpreter and checks the logits and the KV cache
/// pages against the reference. Layer `l`'s block table names pages in reverse order, so page
/// numbers differ from slot numbers; page 0 is never named and must stay zero.
fn check_llama(cfg: &LlamaConfig, seed: u64) {
    let g = llama::build(cfg, Mode::Prefill, DType::F32).unwrap();
    let mut p = Program::compile(g, Backend::Interpreter).unwrap();
    let ws = to_f32(&bind_random_weights(&mut p, seed));
    let t_len = PROMPT.len();
    let positions: Vec<usize> = (0..t_len).collect();
    let (ps, hkv, hd, n_layers) = (cfg.page_size, cfg.n_kv_heads, cfg.head_dim, cfg.n_layers);
    let per_layer = t_len.div_ceil(ps);
    let n_pages = n_layers * per_layer + 1;
    let page_of = |l: usize, m: usize| n_pages - 1 - (l * per_layer + m);
    let bt = Tensor::from_fn(DType::I32, &[n_layers, 1, per_layer], |i| page_of(i[0], i[2]) as f64);
    let empty = Tensor::zeros(DType::F32, &[n_pages, ps, hkv, hd]);
    let (tokens, pos) = (i_tensor(DType::I64, &PROMPT), i_tensor(DType::I32, &positions));
    let out = p.run(&[("tokens", &tokens), ("positions", &pos), ("block_tables", &bt), ("k_pages", &empty), ("v_pages", &empty)], &[]).unwrap();
    assert_eq!(out[0].shape(), &[t_len, cfg.vocab]);
    let r = llama_reference(cfg, &ws, &PROMPT, &positions);
    let form = cfg.rope_form;
    assert_close(&format!("llama ({form}) logits"), out[0].data(), &r.logits);
    // The cache: token t of layer l sits at page page_of(l, t / ps), offset t % ps.
    for (which, pages, refs) in [("k", &out[1], &r.keys), ("v", &out[2], &r.values)] {
        assert_eq!(pages.shape(), &[n_pages, ps, hkv, hd]);
        let mut written = vec![false; pages.numel()];
        for (l, layer) in refs.iter().enumerate() {
            let mut got = Vec::with_capacity(layer.len());
            for t in 0..t_len {
                let base = ((page_of(l, t / ps) * ps + t % ps) * hkv) * hd;
                got.extend_from_slice(&pages.data()[base..base + hkv * hd]);
                written[base..base + hkv * hd].iter_mut().for_each(|w| *w = true);
            }
            assert_close(&format!("llama ({form}) layer {l} {which} cache"), &got, layer);
        }
        for (i, (&x, w)) in pages.data().iter().zip(&written).enumerate() {
            assert!(*w || x == 0.0, "{which} cache element {i} was written but no token belongs there: {x}");
        }
    }
}

#[test]
fn tiny_llama_prefill_matches_reference() {
    check_llama(&LlamaConfig::tiny(), 11);
}

#[test]
fn tiny_llama_interleaved_rope_matches_reference() {
    let cfg = LlamaConfig { rope_form: "interleaved", ..LlamaConfig::tiny() };
    check_llama(&cfg, 12);
}

#[test]
fn tiny_gpt2_prefill_matches_reference() {
    let cfg = Gpt2Config::tiny();
    let g = gpt2::build(&cfg, DType::F32).unwrap();
    let mut p = Program::compile(g, Backend::Interpreter).unwrap();
    let ws = to_f32(&bind_random_weights(&mut p, 13));
    let t_len = PROMPT.len();
    let tokens = i_tensor(DType::I64, &PROMPT);
    // Positions 0..T, then shifted ones (rows 5.. of the position embedding).
    for start in [0, 5] {
        let positions: Vec<usize> = (start..start + t_len).collect();
        let out = p.run(&[("tokens", &tokens), ("positions", &i_tensor(DType::I32, &positions))], &[]).unwrap();
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].shape(), &[t_len, cfg.vocab]);
        let r = gpt2_reference(&cfg, &ws, &PROMPT, &positions);
        assert_close(&format!("gpt2 logits (positions {start}..)"), out[0].data(), &r);
    }
}

/// The reference's own pieces agree with textbook values, so a shared misunderstanding between
/// the graph and the reference would have to be in the model's structure, not in a helper.
#[test]
fn reference_helpers_match_known_values() {
    // linear: [1, 2] · [[1, 0], [2, 3]]ᵀ + [0.5, 0] = [1.5, 8].
    assert_eq!(linear(&[1.0, 2.0], 2, &[1.0, 0.0, 2.0, 3.0], 2, Some(&[0.5, 0.0])), vec![1.5, 8.0]);
    // RMSNorm of [3, 4]: rms = sqrt(12.5).
    let y = rms_norm(&[3.0, 4.0], 2, &[1.0, 2.0], 0.0);
    assert!((y[0] - 3.0 / 12.5f32.sqrt()).abs() < 1e-6 && (y[1] - 8.0 / 12.5f32.sqrt()).abs() < 1e-6);
    // LayerNorm of [1, 3]: mean 2, var 1 → [-1, 1].
    assert_eq!(layer_norm(&[1.0, 3.0], 2, &[1.0, 1.0], &[0.0, 0.5], 0.0), vec![-1.0, 1.5]);
    // RoPE at position 0 is the identity; with hd = 2 the one pair turns by the position (1 rad).
    let mut x = vec![1.0, 2.0, 3.0, 4.0];
    rope(&mut x, 1, 4, &[0], 10000.0, false);
    assert_eq!(x, vec![1.0, 2.0, 3.0, 4.0]);
    let mut x = vec![1.0, 2.0];
    rope(&mut x, 1, 2, &[1], 10000.0, true);
    let (s, c) = (1f32.sin(), 1f32.cos());
    assert!((x[0] - (c - 2.0 * s)).abs() < 1e-6 && (x[1] - (2.0 * c + s)).abs() < 1e-6);
    // Attention over two tokens: the first sees only itself; the second averages equally when
    // its scores tie.
    let q = [0.0, 0.0, 0.0, 0.0];
    let (k, v) = ([1.0, 0.0, 0.0, 1.0], [1.0, 2.0, 3.0, 4.0]);
    assert_eq!(causal_attention(&q, &k, &v, 1, 1, 2, 1.0), vec![1.0, 2.0, 2.0, 3.0]);
    assert!((gelu_tanh(1.0) - 0.841192).abs() < 1e-5);
}
