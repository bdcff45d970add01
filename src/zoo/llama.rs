//! Llama-family decoders (Llama 2/3, SmolLM2), written in the DSL the way the reference
//! implementations write them: RMSNorm decomposed (`x·rsqrt(mean(x²)+ε)` in f32, cast back,
//! times the weight), RoPE, grouped-query attention written as `softmax(Q·Kᵀ·scale + causal
//! mask)·V` with K/V heads repeated by `broadcast`, a SwiGLU MLP, residuals, a final norm and an
//! LM head tied to the embedding.
//!
//! **Graphs.** [`build`] makes the prefill and the decode graph from one definition; they share
//! weight names and the paged KV cache:
//!
//! - inputs `tokens: i64[T]`, `positions: i32[T]`, `block_tables: i32[L, B, M]`,
//!   `k_pages`/`v_pages: dtype[P, page_size, kv_heads, head_dim]`; outputs
//!   `(logits: dtype[T, vocab], k_pages, v_pages, next: i32[T])`, `next` the greedy token
//!   after each row (the lowest id of the largest logit; `vocab`, no id, for a row holding a
//!   NaN), so a greedy decode step reads back `T` integers instead of `T · vocab` logits.
//! - **Prefill**: the `T` tokens of one fresh sequence (`B = 1`); positions are `0..T`.
//! - **Decode**: one new token for each of `T` sequences (`B = T`); `positions[b]` is the number
//!   of tokens sequence `b` already has in the cache.
//!
//! **KV cache.** One pool of pages holds every layer's keys (and one its values): layer `l`
//! reads and writes the pages its block table `block_tables[l]` names, so the pool threads
//! through the layers as one value and the graph has four outputs whatever the depth.
//!
//! **Weights** carry llama.cpp's GGUF names (`token_embd.weight`, `blk.{i}.attn_q.weight`,
//! ...), each matrix stored `[out, in]` as GGUF and Hugging Face store them (the graph
//! multiplies by its transpose).

pub use crate::zoo::qwen::RopeScaling;
use crate::zoo::Mode;
use crate::{graph, DType, Dim, Error, Graph};

/// Hyper-parameters of a Llama-family decoder.
#[derive(Clone, Debug, PartialEq)]
pub struct LlamaConfig {
    /// Vocabulary size.
    pub vocab: usize,
    /// Model (residual) width.
    pub hidden: usize,
    /// Number of decoder layers.
    pub n_layers: usize,
    /// Query heads.
    pub n_heads: usize,
    /// Key/value heads (grouped-query attention: `n_heads` is a multiple).
    pub n_kv_heads: usize,
    /// Width of one head.
    pub head_dim: usize,
    /// MLP inner width.
    pub ffn: usize,
    /// RoPE base θ.
    pub rope_theta: f64,
    /// RoPE pairing: `"rotate_half"` (Hugging Face layout of `attn_q`/`attn_k`) or
    /// `"interleaved"` (llama.cpp's GGUF layout, whose converter permutes those rows).
    pub rope_form: &'static str,
    /// RoPE frequency scaling (Hugging Face's `rope_scaling`: linear, Llama 3.1's `llama3`,
    /// YaRN), as the `rope` op computes it.
    pub rope_scaling: RopeScaling,
    /// RMSNorm ε.
    pub rms_eps: f64,
    /// Context length the model was trained for.
    pub context: usize,
    /// Tokens per KV-cache page.
    pub page_size: usize,
    /// Whether the LM head reuses `token_embd.weight`; otherwise it is `output.weight`.
    pub tied_embeddings: bool,
}

impl LlamaConfig {
    /// SmolLM2-135M: hidden 576, 30 layers, 9 heads, 3 KV heads, head dim 64, FFN 1536,
    /// vocab 49152, RoPE θ 100000, RMS ε 1e-5, context 8192, tied embeddings.
    pub fn smollm2_135m() -> LlamaConfig {
        LlamaConfig {
            vocab: 49152,
            hidden: 576,
            n_layers: 30,
            n_heads: 9,
            n_kv_heads: 3,
            head_dim: 64,
            ffn: 1536,
            rope_theta: 100000.0,
            rope_form: "rotate_half",
            rope_scaling: RopeScaling::None,
            rms_eps: 1e-5,
            context: 8192,
            page_size: 16,
            tied_embeddings: true,
        }
    }

    /// The Llama-3-8B shape: hidden 4096, 32 layers, 32 heads, 8 KV heads, head dim 128,
    /// FFN 14336, vocab 128256, RoPE θ 500000, RMS ε 1e-5, context 8192, a separate
    /// `output.weight`.
    pub fn llama3_8b() -> LlamaConfig {
        LlamaConfig {
            vocab: 128256,
            hidden: 4096,
            n_layers: 32,
            n_heads: 32,
            n_kv_heads: 8,
            head_dim: 128,
            ffn: 14336,
            rope_theta: 500000.0,
            rope_form: "rotate_half",
            rope_scaling: RopeScaling::None,
            rms_eps: 1e-5,
            context: 8192,
            page_size: 16,
            tied_embeddings: false,
        }
    }

    /// A small configuration for tests: 2 layers, hidden 32, 4 heads, 2 KV heads, head dim 8,
    /// FFN 48, vocab 64, page size 4.
    pub fn tiny() -> LlamaConfig {
        LlamaConfig {
            vocab: 64,
            hidden: 32,
            n_layers: 2,
            n_heads: 4,
            n_kv_heads: 2,
            head_dim: 8,
            ffn: 48,
            rope_theta: 10000.0,
            rope_form: "rotate_half",
            rope_scaling: RopeScaling::None,
            rms_eps: 1e-5,
            context: 64,
            page_size: 4,
            tied_embeddings: true,
        }
    }

    /// Checks that the numbers fit together.
    ///
    /// # Errors
    /// [`Error::Unsupported`] naming the rule broken.
    pub fn validate(&self) -> Result<(), Error> {
        let bad = |m: String| Err(Error::Unsupported(format!("Llama config: {m}")));
        if self.n_heads == 0 || self.n_kv_heads == 0 || self.n_heads % self.n_kv_heads != 0 {
            return bad(format!("n_heads ({}) must be a positive multiple of n_kv_heads ({})", self.n_heads, self.n_kv_heads));
        }
        if self.head_dim == 0 || self.head_dim % 2 != 0 {
            return bad(format!("head_dim ({}) must be even and positive", self.head_dim));
        }
        if self.page_size == 0 || self.n_layers == 0 || self.vocab == 0 || self.hidden == 0 || self.ffn == 0 {
            return bad("page_size, n_layers, vocab, hidden and ffn must be positive".into());
        }
        if !matches!(self.rope_form, "rotate_half" | "interleaved") {
            return bad(format!("rope_form must be \"rotate_half\" or \"interleaved\", got {:?}", self.rope_form));
        }
        Ok(())
    }
}

/// Builds the prefill or the decode graph of a Llama decoder with weights of `dtype`.
///
/// ```
/// use sinter::zoo::{llama, Mode};
/// let cfg = llama::LlamaConfig::tiny();
/// let g = llama::build(&cfg, Mode::Prefill, sinter::DType::F32)?;
/// sinter::ir::verify(&g)?;
/// assert_eq!(g.func("main").unwrap().outputs.len(), 4);
/// # Ok::<(), sinter::Error>(())
/// ```
///
/// # Errors
/// An invalid config; build errors (which would be bugs of this definition).
pub fn build(cfg: &LlamaConfig, mode: Mode, dtype: DType) -> Result<Graph, Error> {
    cfg.validate()?;
    let decode = mode == Mode::Decode;
    let dt = dtype;
    let (d, hd, h, hkv, ffn, vocab) = (cfg.hidden, cfg.head_dim, cfg.n_heads, cfg.n_kv_heads, cfg.ffn, cfg.vocab);
    let (qd, kvd, group, ps, n_layers) = (h * hd, hkv * hd, h / hkv, cfg.page_size, cfg.n_layers);
    let scale = 1.0 / (hd as f64).sqrt();
    let (eps, theta, form) = (cfg.rms_eps, cfg.rope_theta, cfg.rope_form);
    let [sc, fac, lo, hi, orig, bfast, bslow, trunc, ms, msa, attf] = cfg.rope_scaling.attrs();
    // Sequences per step: one for prefill, T (one token each) for decode.
    let nb = if decode { Dim::symbol("T") } else { Dim::constant(1) };
    let ninf = f64::NEG_INFINITY;
    let vocab_f = vocab as f64;
    let (tied, head_name) = (cfg.tied_embeddings, if cfg.tied_embeddings { "token_embd.weight" } else { "output.weight" });
    let g = graph! {
        fn layer(x: {dt}[T, {d}], positions: i32[T], block_table: i32[{&nb}, M],
                 k_pages: {dt}[P, {ps}, {hkv}, {hd}], v_pages: {dt}[P, {ps}, {hkv}, {hd}],
                 attn_norm: {dt}[{d}], wq: {dt}[{qd}, {d}], wk: {dt}[{kvd}, {d}], wv: {dt}[{kvd}, {d}],
                 wo: {dt}[{d}, {qd}], ffn_norm: {dt}[{d}],
                 w_gate: {dt}[{ffn}, {d}], w_up: {dt}[{ffn}, {d}], w_down: {dt}[{d}, {ffn}])
            -> ({dt}[T, {d}], {dt}[P, {ps}, {hkv}, {hd}], {dt}[P, {ps}, {hkv}, {hd}])
        {
            // RMSNorm as Hugging Face writes it: statistics in f32, cast back, times the weight.
            let x32 = x.cast(f32);
            let hn = (x32 * ((x32 * x32).mean(-1) + {eps}).rsqrt()).cast({dt}) * attn_norm;
            let pos = positions.reshape([T, 1]);
            let q = hn.matmul(wq, transpose_b = true).reshape([T, {h}, {hd}]).rope(pos, theta = theta, form = form, scaling = {sc.clone()}, factor = {fac.clone()},
                low_freq_factor = {lo.clone()}, high_freq_factor = {hi.clone()}, original_max_position_embeddings = {orig.clone()},
                beta_fast = {bfast.clone()}, beta_slow = {bslow.clone()}, truncate = {trunc.clone()}, mscale = {ms.clone()},
                mscale_all_dim = {msa.clone()}, attention_factor = {attf.clone()});
            let k = hn.matmul(wk, transpose_b = true).reshape([T, {hkv}, {hd}]).rope(pos, theta = theta, form = form, scaling = {sc.clone()}, factor = {fac.clone()},
                low_freq_factor = {lo.clone()}, high_freq_factor = {hi.clone()}, original_max_position_embeddings = {orig.clone()},
                beta_fast = {bfast.clone()}, beta_slow = {bslow.clone()}, truncate = {trunc.clone()}, mscale = {ms.clone()},
                mscale_all_dim = {msa.clone()}, attention_factor = {attf.clone()});
            let v = hn.matmul(wv, transpose_b = true).reshape([T, {hkv}, {hd}]);
            let (attn, kp, vp) = if decode {
                // One query per sequence, attending to the sequence's cached keys.
                let [kp, vp] = k_pages.kv_append(v_pages, k.reshape([T, 1, {hkv}, {hd}]), v.reshape([T, 1, {hkv}, {hd}]), block_table, positions);
                let qb = q.reshape([T, 1, {h}, {hd}]).transpose(1, 2);
                let o = qb.paged_attention(kp, vp, block_table, positions + 1, scale = scale, causal = true, heads = h, kv_heads = hkv);
                (o.transpose(1, 2).reshape([T, {qd}]), kp, vp)
            } else {
                // The prompt attends to itself; its keys and values go to the cache too.
                let [kp, vp] = k_pages.kv_append(v_pages, k.reshape([1, T, {hkv}, {hd}]), v.reshape([1, T, {hkv}, {hd}]), block_table, positions.slice(0, 0, 1));
                let qh = q.transpose(0, 1);
                let kh = k.transpose(0, 1).reshape([{hkv}, 1, T, {hd}]).broadcast([{hkv}, {group}, T, {hd}]).reshape([{h}, T, {hd}]);
                let vh = v.transpose(0, 1).reshape([{hkv}, 1, T, {hd}]).broadcast([{hkv}, {group}, T, {hd}]).reshape([{h}, T, {hd}]);
                let scores = (qh @ kh.transpose(-2, -1)) * {scale};
                let visible = iota(i32, [T, T], 0) >= iota(i32, [T, T], 1);
                let mask = visible.select(constant(0.0, {dt}), constant(ninf, {dt}));
                let probs = (scores + mask).cast(f32).softmax(-1).cast({dt});
                ((probs @ vh).transpose(0, 1).reshape([T, {qd}]), kp, vp)
            };
            let x1 = x + attn.matmul(wo, transpose_b = true);
            let y32 = x1.cast(f32);
            let hn2 = (y32 * ((y32 * y32).mean(-1) + {eps}).rsqrt()).cast({dt}) * ffn_norm;
            let mlp = (hn2.matmul(w_gate, transpose_b = true).silu() * hn2.matmul(w_up, transpose_b = true)).matmul(w_down, transpose_b = true);
            (x1 + mlp, kp, vp)
        }

        fn main(tokens: i64[T], positions: i32[T], block_tables: i32[{n_layers}, {&nb}, M],
                k_pages: {dt}[P, {ps}, {hkv}, {hd}], v_pages: {dt}[P, {ps}, {hkv}, {hd}])
            -> ({dt}[T, {vocab}], {dt}[P, {ps}, {hkv}, {hd}], {dt}[P, {ps}, {hkv}, {hd}], i32[T])
        {
            let embed = weight("token_embd.weight", {dt}[{vocab}, {d}]);
            let mut x = embed.gather(tokens);
            let mut kp = k_pages;
            let mut vp = v_pages;
            for i in 0..n_layers {
                let bt = block_tables.slice(0, i, i + 1).reshape([{&nb}, M]);
                let [x2, kp2, vp2] = layer(x, positions, bt, kp, vp,
                    weight(format!("blk.{i}.attn_norm.weight"), {dt}[{d}]),
                    weight(format!("blk.{i}.attn_q.weight"), {dt}[{qd}, {d}]),
                    weight(format!("blk.{i}.attn_k.weight"), {dt}[{kvd}, {d}]),
                    weight(format!("blk.{i}.attn_v.weight"), {dt}[{kvd}, {d}]),
                    weight(format!("blk.{i}.attn_output.weight"), {dt}[{d}, {qd}]),
                    weight(format!("blk.{i}.ffn_norm.weight"), {dt}[{d}]),
                    weight(format!("blk.{i}.ffn_gate.weight"), {dt}[{ffn}, {d}]),
                    weight(format!("blk.{i}.ffn_up.weight"), {dt}[{ffn}, {d}]),
                    weight(format!("blk.{i}.ffn_down.weight"), {dt}[{d}, {ffn}]));
                x = x2;
                kp = kp2;
                vp = vp2;
            }
            let x32 = x.cast(f32);
            let xn = (x32 * ((x32 * x32).mean(-1) + {eps}).rsqrt()).cast({dt}) * weight("output_norm.weight", {dt}[{d}]);
            let lm_head = if tied { embed } else { weight(head_name, {dt}[{vocab}, {d}]) };
            let logits = xn.matmul(lm_head, transpose_b = true);
            // The greedy next token of each row: the lowest id of the largest logit, or the
            // vocabulary size (no id) for a row holding a NaN (its max is NaN, which equals
            // nothing); the engine then takes that row's argmax on the host.
            let best = logits.max(-1);
            let next = logits.eq(best).select(iota(i32, [T, {vocab}], 1), constant(vocab_f, i32)).min(-1, keepdim = false);
            (logits, kp, vp, next)
        }
    }?;
    Ok(g)
}
