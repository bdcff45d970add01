//! The chapter "Your own model" (`book/src/your-own-model.md`): a Qwen2-style decoder written
//! in the DSL, checked against a plain f64 forward, explained, compiled to PTX and served by
//! the engine. The chapter includes these functions by their anchors; every test here runs on
//! the interpreter at tiny sizes (no model file, no GPU).

use super::*;

// ANCHOR: own_use
use std::collections::BTreeMap;
use std::sync::Arc;

use sinter::llm::chat::ChatTemplate;
use sinter::llm::tokenizer::Tokenizer;
use sinter::llm::{DecoderModel, Engine, KvGeometry, SampleOptions};
use sinter::zoo::Mode;
use sinter::Dim;
// ANCHOR_END: own_use

// ANCHOR: own_config
/// A Qwen2-style decoder's hyper-parameters.
#[derive(Clone, Copy, Debug)]
pub struct Config {
    pub vocab: usize,
    pub hidden: usize,
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub ffn: usize,
    pub rope_theta: f64,
    pub rms_eps: f64,
    /// Tokens per page of the paged KV cache.
    pub page_size: usize,
}

/// Small enough for the interpreter to run in milliseconds.
pub const TINY: Config = Config {
    vocab: 64, hidden: 32, layers: 2, heads: 4, kv_heads: 2, head_dim: 16, ffn: 48,
    rope_theta: 10000.0, rms_eps: 1e-6, page_size: 4,
};
// ANCHOR_END: own_config

// ANCHOR: own_graph
/// The prefill or the decode graph, with the decoder contract's inputs and outputs:
/// `(tokens, positions, block_tables, k_pages, v_pages) -> (logits, k_pages, v_pages, next)`.
pub fn tiny_qwen(c: &Config, mode: Mode, dt: DType) -> Result<Graph, sinter::BuildError> {
    let decode = mode == Mode::Decode;
    let (d, h, hkv, hd, ffn, vocab, ps, layers) = (c.hidden, c.heads, c.kv_heads, c.head_dim, c.ffn, c.vocab, c.page_size, c.layers);
    let (qd, kvd, group) = (h * hd, hkv * hd, h / hkv);
    let (scale, eps, theta) = (1.0 / (hd as f64).sqrt(), c.rms_eps, c.rope_theta);
    // Prefill takes one sequence; decode one token of each of T sequences.
    let seqs = if decode { Dim::symbol("T") } else { Dim::constant(1) };
    let vocab_f = vocab as f64;
    graph! {
        // Qwen2RMSNorm: statistics in f32, cast back, then the weight.
        fn rms_norm(x: {dt}[T, D], w: {dt}[D]) -> {dt}[T, D] {
            let x32 = x.cast(f32);
            (x32 * ((x32 * x32).mean(-1) + {eps}).rsqrt()).cast({dt}) * w
        }

        // Qwen2MLP: down(silu(gate(x)) · up(x)); matrices are stored [out, in].
        fn mlp(x: {dt}[T, {d}], gate: {dt}[{ffn}, {d}], up: {dt}[{ffn}, {d}], down: {dt}[{d}, {ffn}]) -> {dt}[T, {d}] {
            (x.matmul(gate, transpose_b = true).silu() * x.matmul(up, transpose_b = true)).matmul(down, transpose_b = true)
        }

        fn main(tokens: i64[T], positions: i32[T], block_tables: i32[{layers}, {&seqs}, M],
                k_pages: {dt}[P, {ps}, {hkv}, {hd}], v_pages: {dt}[P, {ps}, {hkv}, {hd}])
            -> ({dt}[T, {vocab}], {dt}[P, {ps}, {hkv}, {hd}], {dt}[P, {ps}, {hkv}, {hd}], i32[T])
        {
            let embed = weight("token_embd.weight", {dt}[{vocab}, {d}]);
            let mut x = embed.gather(tokens);
            let mut kp = k_pages;
            let mut vp = v_pages;
            let pos = positions.reshape([T, 1]);
            for i in 0..layers {
                let bt = block_tables.slice(0, i, i + 1).reshape([{&seqs}, M]);
                let hn = rms_norm(x, weight(format!("blk.{i}.attn_norm.weight"), {dt}[{d}]));
                // Q, K, V projections with biases, as heads, rotated (RoPE, rotate_half).
                let q = hn.matmul(weight(format!("blk.{i}.attn_q.weight"), {dt}[{qd}, {d}]), transpose_b = true)
                    + weight(format!("blk.{i}.attn_q.bias"), {dt}[{qd}]);
                let k = hn.matmul(weight(format!("blk.{i}.attn_k.weight"), {dt}[{kvd}, {d}]), transpose_b = true)
                    + weight(format!("blk.{i}.attn_k.bias"), {dt}[{kvd}]);
                let v = hn.matmul(weight(format!("blk.{i}.attn_v.weight"), {dt}[{kvd}, {d}]), transpose_b = true)
                    + weight(format!("blk.{i}.attn_v.bias"), {dt}[{kvd}]);
                let qr = q.reshape([T, {h}, {hd}]).rope(pos, theta = theta, form = "rotate_half");
                let kr = k.reshape([T, {hkv}, {hd}]).rope(pos, theta = theta, form = "rotate_half");
                let vh = v.reshape([T, {hkv}, {hd}]);
                let (attn, kp2, vp2) = if decode {
                    // Append this token's key and value to the cache, attend over the cache.
                    let [kpn, vpn] = kp.kv_append(vp, kr.reshape([T, 1, {hkv}, {hd}]), vh.reshape([T, 1, {hkv}, {hd}]), bt, positions);
                    let qb = qr.reshape([T, 1, {h}, {hd}]).transpose(1, 2);
                    let o = qb.paged_attention(kpn, vpn, bt, positions + 1, scale = scale, heads = h, kv_heads = hkv);
                    (o.transpose(1, 2).reshape([T, {qd}]), kpn, vpn)
                } else {
                    // The prompt's keys and values go to the cache too; attention is written
                    // plainly: GQA by repeating K and V, causal mask, softmax in f32.
                    let [kpn, vpn] = kp.kv_append(vp, kr.reshape([1, T, {hkv}, {hd}]), vh.reshape([1, T, {hkv}, {hd}]), bt, positions.slice(0, 0, 1));
                    let kt = kr.transpose(0, 1).reshape([{hkv}, 1, T, {hd}]).broadcast([{hkv}, {group}, T, {hd}]).reshape([{h}, T, {hd}]);
                    let vt = vh.transpose(0, 1).reshape([{hkv}, 1, T, {hd}]).broadcast([{hkv}, {group}, T, {hd}]).reshape([{h}, T, {hd}]);
                    let visible = iota(i32, [T, T], 0) >= iota(i32, [T, T], 1);
                    let mask = visible.select(constant(0.0, {dt}), constant(f64::NEG_INFINITY, {dt}));
                    let scores = (qr.transpose(0, 1) @ kt.transpose(-2, -1)) * {scale} + mask;
                    let probs = scores.cast(f32).softmax(-1).cast({dt});
                    ((probs @ vt).transpose(0, 1).reshape([T, {qd}]), kpn, vpn)
                };
                kp = kp2;
                vp = vp2;
                let x1 = x + attn.matmul(weight(format!("blk.{i}.attn_output.weight"), {dt}[{d}, {qd}]), transpose_b = true);
                let hn2 = rms_norm(x1, weight(format!("blk.{i}.ffn_norm.weight"), {dt}[{d}]));
                x = x1 + mlp(hn2, weight(format!("blk.{i}.ffn_gate.weight"), {dt}[{ffn}, {d}]),
                             weight(format!("blk.{i}.ffn_up.weight"), {dt}[{ffn}, {d}]),
                             weight(format!("blk.{i}.ffn_down.weight"), {dt}[{d}, {ffn}]));
            }
            // Final norm; the LM head is the embedding (tied).
            let logits = rms_norm(x, weight("output_norm.weight", {dt}[{d}])).matmul(embed, transpose_b = true);
            // Each row's greedy token: the lowest id of its largest logit.
            let best = logits.max(-1);
            let next = logits.eq(best).select(iota(i32, [T, {vocab}], 1), constant(vocab_f, i32)).min(-1, keepdim = false);
            (logits, kp, vp, next)
        }
    }
}
// ANCHOR_END: own_graph

// ANCHOR: own_weights
/// Seeded weights for every parameter of the graph that is not a decoder input, in the shape
/// the graph declares: norms near 1, biases small, matrices scaled by 1/√fan-in.
pub fn seeded_weights(g: &Graph) -> BTreeMap<String, Arc<Tensor>> {
    let main = g.func("main").unwrap();
    let mut weights = BTreeMap::new();
    for (n, &p) in main.params.iter().enumerate().skip(5) {
        let name = main.values[p].name.clone().unwrap();
        let shape: Vec<usize> = main.ty(p).shape.iter().map(|d| d.as_const().unwrap() as usize).collect();
        let fan_in = *shape.last().unwrap() as f64;
        let t = Tensor::from_fn(DType::F32, &shape, |i| {
            let flat = i.iter().fold(0, |acc, &k| acc * 97 + k);
            let r = ((flat as f64 + 1.0) * (0.37 + n as f64 * 0.011)).sin(); // in [-1, 1]
            if name.contains("norm") { 1.0 + 0.2 * r } else if name.ends_with(".bias") { 0.2 * r } else if name.starts_with("token_embd") { r } else { 1.5 * r / fan_in.sqrt() }
        });
        weights.insert(name, Arc::new(t));
    }
    weights
}
// ANCHOR_END: own_weights

// ANCHOR: own_reference
/// The logits of every position of `tokens`, computed in f64 the way transformers'
/// `modeling_qwen2.py` does, one token and one head at a time: `[len][vocab]`.
pub fn reference_logits(c: &Config, w: &BTreeMap<String, Arc<Tensor>>, tokens: &[u32]) -> Vec<Vec<f64>> {
    let get = |name: &str| w[name].data();
    // x @ Wᵀ + b for W stored [out, in].
    let linear = |x: &[f64], wt: &[f64], b: Option<&[f64]>| -> Vec<f64> {
        (0..wt.len() / x.len())
            .map(|o| wt[o * x.len()..][..x.len()].iter().zip(x).map(|(a, b)| a * b).sum::<f64>() + b.map_or(0.0, |b| b[o]))
            .collect()
    };
    let rms = |x: &[f64], g: &[f64]| -> Vec<f64> {
        let r = 1.0 / (x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64 + c.rms_eps).sqrt();
        x.iter().zip(g).map(|(v, g)| v * r * g).collect()
    };
    // rotate_half: pair (i, i + d/2) turns by pos · θ^(−2i/d).
    let rope = |x: &mut [f64], pos: usize| {
        let (d, orig) = (x.len(), x.to_vec());
        for i in 0..d {
            let angle = pos as f64 * c.rope_theta.powf(-2.0 * (i % (d / 2)) as f64 / d as f64);
            let rotated = if i < d / 2 { -orig[i + d / 2] } else { orig[i - d / 2] };
            x[i] = orig[i] * angle.cos() + rotated * angle.sin();
        }
    };
    let (d, hd, n) = (c.hidden, c.head_dim, tokens.len());
    let embed = get("token_embd.weight");
    let mut xs: Vec<Vec<f64>> = tokens.iter().map(|&t| embed[t as usize * d..][..d].to_vec()).collect();
    for l in 0..c.layers {
        let p = |s: &str| format!("blk.{l}.{s}");
        let (mut qs, mut ks, mut vs) = (vec![], vec![], vec![]);
        for (pos, x) in xs.iter().enumerate() {
            let hn = rms(x, get(&p("attn_norm.weight")));
            let mut q = linear(&hn, get(&p("attn_q.weight")), Some(get(&p("attn_q.bias"))));
            let mut k = linear(&hn, get(&p("attn_k.weight")), Some(get(&p("attn_k.bias"))));
            q.chunks_mut(hd).chain(k.chunks_mut(hd)).for_each(|head| rope(head, pos));
            vs.push(linear(&hn, get(&p("attn_v.weight")), Some(get(&p("attn_v.bias")))));
            qs.push(q);
            ks.push(k);
        }
        for i in 0..n {
            let mut attn = vec![0.0; c.heads * hd];
            for head in 0..c.heads {
                let kv = head / (c.heads / c.kv_heads); // repeat_kv
                let dot = |j: usize| (0..hd).map(|e| qs[i][head * hd + e] * ks[j][kv * hd + e]).sum::<f64>() / (hd as f64).sqrt();
                let scores: Vec<f64> = (0..=i).map(dot).collect();
                let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let z: f64 = scores.iter().map(|s| (s - m).exp()).sum();
                for (j, s) in scores.iter().enumerate() {
                    for e in 0..hd {
                        attn[head * hd + e] += (s - m).exp() / z * vs[j][kv * hd + e];
                    }
                }
            }
            let o = linear(&attn, get(&p("attn_output.weight")), None);
            let x1: Vec<f64> = xs[i].iter().zip(&o).map(|(a, b)| a + b).collect();
            let hn2 = rms(&x1, get(&p("ffn_norm.weight")));
            let gate = linear(&hn2, get(&p("ffn_gate.weight")), None);
            let up = linear(&hn2, get(&p("ffn_up.weight")), None);
            let act: Vec<f64> = gate.iter().zip(&up).map(|(g, u)| g / (1.0 + (-g).exp()) * u).collect();
            let down = linear(&act, get(&p("ffn_down.weight")), None);
            xs[i] = x1.iter().zip(&down).map(|(a, b)| a + b).collect();
        }
    }
    xs.iter().map(|x| linear(&rms(x, get("output_norm.weight")), embed, None)).collect()
}
// ANCHOR_END: own_reference

// ANCHOR: own_model
/// The model the engine serves: its graphs, its KV cache's shape, its weights, a tokenizer.
pub struct TinyQwen {
    pub cfg: Config,
    pub weights: BTreeMap<String, Arc<Tensor>>,
    pub tokenizer: Tokenizer,
}

impl DecoderModel for TinyQwen {
    fn architecture(&self) -> &str {
        "tiny-qwen"
    }
    fn graph(&self, mode: Mode) -> Result<Graph, sinter::Error> {
        Ok(tiny_qwen(&self.cfg, mode, DType::F32)?)
    }
    fn kv(&self) -> KvGeometry {
        let c = &self.cfg;
        KvGeometry { layers: c.layers, kv_heads: c.kv_heads, head_dim: c.head_dim, page_size: c.page_size, dtype: DType::F32 }
    }
    fn vocab(&self) -> usize {
        self.cfg.vocab
    }
    fn context(&self) -> usize {
        64
    }
    fn weights(&self) -> &BTreeMap<String, Arc<Tensor>> {
        &self.weights
    }
    fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }
    fn chat_template(&self) -> Option<&ChatTemplate> {
        None // a base model: prompts are plain text
    }
    fn eos_tokens(&self) -> Vec<u32> {
        vec![] // random weights: generate until max_new
    }
    fn source(&self) -> &std::path::Path {
        std::path::Path::new("")
    }
}

/// A word-level tokenizer over the words `t0` … `t63`, from a `tokenizer.json` written to
/// `dir` (a real model ships its own `tokenizer.json`).
pub fn word_tokenizer(dir: &std::path::Path, vocab: usize) -> Result<Tokenizer, Box<dyn std::error::Error>> {
    let words: serde_json::Map<String, serde_json::Value> = (0..vocab).map(|i| (format!("t{i}"), i.into())).collect();
    let json = serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": [], "normalizer": null,
        "pre_tokenizer": {"type": "Whitespace"}, "post_processor": null, "decoder": null,
        "model": {"type": "WordLevel", "vocab": words, "unk_token": "t0"}
    });
    std::fs::create_dir_all(dir)?;
    std::fs::write(dir.join("tokenizer.json"), json.to_string())?;
    Ok(Tokenizer::from_file(&dir.join("tokenizer.json"), 0, 0, false)?)
}
// ANCHOR_END: own_model

// ---------------------------------------------------------------------------------------------
// The tests the chapter shows.

#[test]
// ANCHOR: own_checked
fn tiny_qwen_agrees_with_the_f64_forward() -> Result<(), Box<dyn std::error::Error>> {
    let g = tiny_qwen(&TINY, Mode::Prefill, DType::F32)?;
    let weights = seeded_weights(&g);
    assert_eq!(weights.len(), 2 + 12 * TINY.layers); // embedding, final norm, 12 per layer

    // Teacher-forced logits of 9 tokens from the prefill graph, on the interpreter.
    let mut p = Program::compile(g, Backend::Interpreter)?;
    for (name, t) in &weights {
        p.bind(name, t.clone())?;
    }
    let tokens: Vec<u32> = vec![3, 14, 15, 9, 26, 53, 58, 9, 7];
    let n = tokens.len();
    let pages = TINY.layers * n.div_ceil(TINY.page_size); // each layer's pages, in order
    let pool = Tensor::zeros(DType::F32, &[pages, TINY.page_size, TINY.kv_heads, TINY.head_dim]);
    let out = p.run(&[
        ("tokens", &Tensor::from_fn(DType::I64, &[n], |i| tokens[i[0]] as f64)),
        ("positions", &Tensor::from_fn(DType::I32, &[n], |i| i[0] as f64)),
        ("block_tables", &Tensor::from_fn(DType::I32, &[TINY.layers, 1, pages / TINY.layers], |i| (i[0] * pages / TINY.layers + i[2]) as f64)),
        ("k_pages", &pool),
        ("v_pages", &pool),
    ], &[])?;
    let (logits, next) = (&out[0], &out[3]);

    let want = reference_logits(&TINY, &weights, &tokens);
    for (pos, row) in want.iter().enumerate() {
        let got = &logits.data()[pos * TINY.vocab..][..TINY.vocab];
        let scale = row.iter().fold(1.0f64, |m, v| m.max(v.abs()));
        let err = got.iter().zip(row).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max) / scale;
        assert!(err < 1e-5, "position {pos}: relative error {err}"); // f32 roundings only
        assert_eq!(next.data()[pos], sinter::llm::argmax(row) as f64);
    }
    Ok(())
}
// ANCHOR_END: own_checked

#[test]
// ANCHOR: own_served
fn tiny_qwen_is_served_by_the_engine() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::temp_dir().join(format!("sinter-book-tiny-qwen-{}", std::process::id()));
    let weights = seeded_weights(&tiny_qwen(&TINY, Mode::Prefill, DType::F32)?);
    let model = TinyQwen { cfg: TINY, weights, tokenizer: word_tokenizer(&dir, TINY.vocab)? };
    let engine = Engine::new(model)?; // checks both graphs against the decoder contract

    let prompts = [engine.model().tokenizer.encode("t5 t17 t42")?, engine.model().tokenizer.encode("t9 t3 t60 t33 t21")?];
    assert_eq!(prompts[0], [5, 17, 42]);
    let out = engine.generate(&prompts, &SampleOptions::greedy(4), &mut |_seq, _token| {})?;

    // Prefill, then decode steps over the paged cache, both sequences in one batch: every
    // token is the one the f64 forward picks over the whole sequence so far.
    for (prompt, generated) in prompts.iter().zip(&out.tokens) {
        assert_eq!(generated.len(), 4);
        let mut seq = prompt.clone();
        for &t in generated {
            let logits = reference_logits(&TINY, engine.model().weights(), &seq);
            assert_eq!(t, sinter::llm::argmax(logits.last().unwrap()));
            seq.push(t);
        }
    }
    println!("{}", engine.model().tokenizer.decode(&out.tokens[0])?);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
// ANCHOR_END: own_served

// ANCHOR: own_gpu
/// The same model on the GPU: kernels from the code generator (or the kernel cache), weights
/// uploaded once, decode steps replayed as a CUDA graph.
fn serve_on_the_gpu(model: TinyQwen, prompt: Vec<u32>) -> Result<Vec<u32>, sinter::Error> {
    let device = sinter::Device::open()?;
    let engine = Engine::new_gpu(model, &device, sinter::Lowering::Fused)?;
    let out = engine.generate(&[prompt], &SampleOptions::greedy(16), &mut |_, _| {})?;
    Ok(out.tokens[0].clone())
}
// ANCHOR_END: own_gpu

/// The chapter's GPU function, where there is a GPU (skipped otherwise; `SINTER_GPU_REQUIRED=1`
/// makes a missing GPU a failure): it generates the interpreter engine's tokens.
#[test]
fn gpu_tiny_qwen_generates_the_interpreters_tokens() {
    if let Err(e) = sinter::Device::open() {
        assert!(std::env::var_os("SINTER_GPU_REQUIRED").is_none(), "SINTER_GPU_REQUIRED is set but: {e}");
        eprintln!("skipped: no GPU ({e})");
        return;
    }
    let dir = std::env::temp_dir().join(format!("sinter-book-tiny-qwen-gpu-{}", std::process::id()));
    let model = || TinyQwen {
        cfg: TINY,
        weights: seeded_weights(&tiny_qwen(&TINY, Mode::Prefill, DType::F32).unwrap()),
        tokenizer: word_tokenizer(&dir, TINY.vocab).unwrap(),
    };
    let prompt = vec![9, 3, 60, 33, 21];
    let cpu = Engine::new(model()).unwrap().generate(&[prompt.clone()], &SampleOptions::greedy(16), &mut |_, _| {}).unwrap();
    assert_eq!(serve_on_the_gpu(model(), prompt).unwrap(), cpu.tokens[0]);
    let _ = std::fs::remove_dir_all(&dir);
}

// ---------------------------------------------------------------------------------------------
// What the passes make of it, and its PTX.

#[cfg(feature = "llvm")]
#[test]
// ANCHOR: own_ptx
fn tiny_qwen_compiles_to_ptx_for_sm_90a() -> Result<(), Box<dyn std::error::Error>> {
    let g = tiny_qwen(&TINY, Mode::Prefill, DType::BF16)?;
    let compiled = sinter::compile_ptx(&g, &sinter::Target::SM_90A)?;

    // The fusion report: each kernel's entry, family and ops, in launch order.
    let mut report = String::new();
    for k in &compiled.kernels {
        report += &format!("{:<22} {:<16} {}\n", k.plan.entry, k.family.name(), k.ops.join(" "));
    }
    let ptx_for = |family: &str| &compiled.kernels.iter().find(|k| k.family.name() == family).unwrap().plan.ptx;
    // The first matmul, QKV: Hopper's warpgroup MMA, stages loaded by the TMA onto mbarriers.
    assert!(ptx_for("matmul").contains("wgmma.mma_async") && ptx_for("matmul").contains("cp.async.bulk.tensor"));
    // The plain softmax(Q·Kᵀ)·V became one FlashAttention-2 kernel on tensor cores.
    assert!(ptx_for("attention").contains("mma.sync.aligned.m16n8k16"));

    // A snapshot test of the kernels and of one kernel's PTX: `cargo insta review` shows what
    // changed when the compiler does.
    insta::with_settings!({ snapshot_path => "../book/src/your-own-model", prepend_module_to_snapshot => false }, {
        insta::assert_snapshot!("tiny_qwen_kernels", report);
        let rms_norm = compiled.kernels.iter().find(|k| k.ops == ["rms_norm"]).unwrap();
        insta::assert_snapshot!("tiny_qwen_rms_norm_ptx", rms_norm.plan.ptx);
    });
    Ok(())
}
// ANCHOR_END: own_ptx

/// `book/src/your-own-model/tiny-qwen.sir` is the bf16 prefill graph's text, which the
/// chapter's `sinter explain` and `sinter compile` examples read.
#[test]
fn tiny_qwen_sir_file_is_the_chapters_graph() {
    let g = tiny_qwen(&TINY, Mode::Prefill, DType::BF16).unwrap();
    check_generated("book/src/your-own-model/tiny-qwen.sir", &g.to_string(), "tests/book_own_model.rs (tiny_qwen)");
}
