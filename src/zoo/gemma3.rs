//! Gemma 3 (text) decoders, written in the DSL the way Hugging Face transformers writes them
//! (`modeling_gemma3.py`, `Gemma3ForCausalLM`): token embeddings scaled by √hidden (the
//! normaliser rounded to the activation dtype first), Gemma's RMSNorm (`x·rsqrt(mean(x²)+ε)`
//! times `1 + w`, all in f32, then cast back), sandwich norms around attention and the MLP,
//! RMS-normed queries and keys (`q_norm`/`k_norm` over the head) before RoPE, attention scaled
//! by `query_pre_attn_scalar^-½`, a GELU(tanh)-gated MLP, a final norm and an LM head tied to
//! the embedding, with optional logit soft-capping (attention and final, Gemma 2's; `None` in
//! Gemma 3).
//!
//! **Local and global layers.** Each layer is *sliding* (attention over the last
//! `sliding_window` keys, RoPE base `rope_local_theta`) or *full* (causal attention over every
//! key, RoPE base `rope_theta` with the optional linear `rope_scaling`). The window is the
//! `window` attribute of `attention` (prefill) and `paged_attention` (decode), never a mask, so
//! kernels skip the key tiles outside it.
//!
//! **Graphs.** [`build`] makes the prefill and the decode graph in the decoder signature
//! ([`crate::llm::decoder`]): inputs `tokens: i64[T]`, `positions: i32[T]`, `block_tables:
//! i32[L, B, M]`, `k_pages`/`v_pages: dtype[P, page_size, kv_heads, head_dim]`; outputs
//! `(logits: dtype[T, vocab], k_pages, v_pages, next: i32[T])`. Prefill: `T` tokens of one
//! sequence, positions `0..T`; decode: one token for each of `T` sequences.
//!
//! **Weights** carry llama.cpp's GGUF names (`token_embd.weight`, `blk.{i}.attn_q.weight`,
//! `blk.{i}.attn_q_norm.weight`, `blk.{i}.post_attention_norm.weight`,
//! `blk.{i}.post_ffw_norm.weight`, ...), matrices `[out, in]`; every norm weight is Hugging
//! Face's `w` (the graph adds the 1), not llama.cpp's stored `w + 1`.

use crate::zoo::Mode;
use crate::{graph, DType, Dim, Error, Graph};

/// Hyper-parameters of a Gemma 3 text decoder.
#[derive(Clone, Debug, PartialEq)]
pub struct Gemma3Config {
    /// Vocabulary size.
    pub vocab: usize,
    /// Model (residual) width.
    pub hidden: usize,
    /// Query heads.
    pub n_heads: usize,
    /// Key/value heads (`n_heads` is a multiple).
    pub n_kv_heads: usize,
    /// Width of one head.
    pub head_dim: usize,
    /// MLP inner width.
    pub ffn: usize,
    /// RMSNorm ε.
    pub rms_eps: f64,
    /// Attention scores are scaled by `query_pre_attn_scalar^-½`.
    pub query_pre_attn_scalar: f64,
    /// Keys a sliding layer's query sees, its own included.
    pub sliding_window: usize,
    /// One entry per layer: `true` for a sliding (local) layer, `false` for a full one.
    pub sliding: Vec<bool>,
    /// RoPE base of the full layers.
    pub rope_theta: f64,
    /// RoPE base of the sliding layers.
    pub rope_local_theta: f64,
    /// Linear RoPE scaling factor of the full layers (`rope_scaling = {"rope_type":
    /// "linear"}`), if any.
    pub rope_linear_factor: Option<f64>,
    /// Attention logit soft-cap `c` (scores `c·tanh(s/c)`), if any.
    pub attn_softcap: Option<f64>,
    /// Final logit soft-cap, if any.
    pub final_softcap: Option<f64>,
    /// GELU form of the MLP: `"tanh"` (`gelu_pytorch_tanh`) or `"erf"` (`gelu`).
    pub gelu_form: &'static str,
    /// Context length the model was trained for.
    pub context: usize,
    /// Tokens per KV-cache page.
    pub page_size: usize,
    /// Whether the LM head reuses `token_embd.weight`; otherwise it is `output.weight`.
    pub tied_embeddings: bool,
}

impl Gemma3Config {
    /// Gemma-3-270M's shape: hidden 640, 18 layers (every 6th full), 4 heads, 1 KV head, head
    /// dim 256, FFN 2048, vocab 262144, window 512, RoPE θ 1e6 (local 1e4), ε 1e-6, context
    /// 32768.
    pub fn gemma3_270m() -> Gemma3Config {
        Gemma3Config {
            vocab: 262144,
            hidden: 640,
            n_heads: 4,
            n_kv_heads: 1,
            head_dim: 256,
            ffn: 2048,
            rms_eps: 1e-6,
            query_pre_attn_scalar: 256.0,
            sliding_window: 512,
            sliding: (0..18).map(|i| (i + 1) % 6 != 0).collect(),
            rope_theta: 1e6,
            rope_local_theta: 1e4,
            rope_linear_factor: None,
            attn_softcap: None,
            final_softcap: None,
            gelu_form: "tanh",
            context: 32768,
            page_size: 16,
            tied_embeddings: true,
        }
    }

    /// A small configuration for tests: 3 layers (sliding, full, sliding), hidden 32, 4 heads,
    /// 2 KV heads, head dim 16, FFN 48, vocab 64, window 4, page size 4.
    pub fn tiny() -> Gemma3Config {
        Gemma3Config {
            vocab: 64,
            hidden: 32,
            n_heads: 4,
            n_kv_heads: 2,
            head_dim: 16,
            ffn: 48,
            rms_eps: 1e-6,
            query_pre_attn_scalar: 16.0,
            sliding_window: 4,
            sliding: vec![true, false, true],
            rope_theta: 1e6,
            rope_local_theta: 1e4,
            rope_linear_factor: None,
            attn_softcap: None,
            final_softcap: None,
            gelu_form: "tanh",
            context: 128,
            page_size: 4,
            tied_embeddings: true,
        }
    }

    /// Decoder layers.
    pub fn n_layers(&self) -> usize {
        self.sliding.len()
    }

    /// Checks that the numbers fit together.
    ///
    /// # Errors
    /// [`Error::Unsupported`] naming the rule broken.
    pub fn validate(&self) -> Result<(), Error> {
        let bad = |m: String| Err(Error::Unsupported(format!("Gemma 3 config: {m}")));
        if self.n_heads == 0 || self.n_kv_heads == 0 || self.n_heads % self.n_kv_heads != 0 {
            return bad(format!("n_heads ({}) must be a positive multiple of n_kv_heads ({})", self.n_heads, self.n_kv_heads));
        }
        if self.head_dim == 0 || self.head_dim % 2 != 0 {
            return bad(format!("head_dim ({}) must be even and positive", self.head_dim));
        }
        if self.page_size == 0 || self.sliding.is_empty() || self.vocab == 0 || self.hidden == 0 || self.ffn == 0 || self.sliding_window == 0 {
            return bad("page_size, the number of layers, vocab, hidden, ffn and sliding_window must be positive".into());
        }
        if !(self.query_pre_attn_scalar > 0.0 && self.query_pre_attn_scalar.is_finite()) {
            return bad(format!("query_pre_attn_scalar ({}) must be a finite number above 0", self.query_pre_attn_scalar));
        }
        for (what, c) in [("attn_logit_softcapping", self.attn_softcap), ("final_logit_softcapping", self.final_softcap), ("rope_scaling factor", self.rope_linear_factor)] {
            if c.is_some_and(|c| !(c > 0.0 && c.is_finite())) {
                return bad(format!("{what} ({c:?}) must be a finite number above 0"));
            }
        }
        if !matches!(self.gelu_form, "tanh" | "erf") {
            return bad(format!("gelu_form must be \"tanh\" or \"erf\", got {:?}", self.gelu_form));
        }
        Ok(())
    }
}

/// `√hidden` rounded to `dtype`, as Hugging Face casts the embedding normaliser to the
/// weights' dtype before multiplying (bf16: √640 = 25.298… becomes 25.25).
pub fn embed_scale(hidden: usize, dtype: DType) -> f64 {
    let s = (hidden as f64).sqrt();
    match dtype {
        DType::BF16 => half::bf16::from_f64(s).to_f64(),
        DType::F16 => half::f16::from_f64(s).to_f64(),
        _ => s as f32 as f64,
    }
}

/// Builds the prefill or the decode graph of a Gemma 3 decoder with weights of `dtype`.
///
/// ```
/// use sinter::zoo::{gemma3, Mode};
/// let cfg = gemma3::Gemma3Config::tiny();
/// let g = gemma3::build(&cfg, Mode::Decode, sinter::DType::F32)?;
/// sinter::ir::verify(&g)?;
/// assert_eq!(g.func("main").unwrap().outputs.len(), 4);
/// # Ok::<(), sinter::Error>(())
/// ```
///
/// # Errors
/// An invalid config; build errors (which would be bugs of this definition).
pub fn build(cfg: &Gemma3Config, mode: Mode, dtype: DType) -> Result<Graph, Error> {
    cfg.validate()?;
    let decode = mode == Mode::Decode;
    let dt = dtype;
    let (d, hd, h, hkv, ffn, vocab) = (cfg.hidden, cfg.head_dim, cfg.n_heads, cfg.n_kv_heads, cfg.ffn, cfg.vocab);
    let (qd, kvd, ps, n_layers) = (h * hd, hkv * hd, cfg.page_size, cfg.n_layers());
    let scale = 1.0 / cfg.query_pre_attn_scalar.sqrt();
    let (eps, window, gelu) = (cfg.rms_eps, cfg.sliding_window, cfg.gelu_form);
    let (capped, cap) = (cfg.attn_softcap.is_some(), cfg.attn_softcap.unwrap_or(1.0));
    let (final_capped, final_cap) = (cfg.final_softcap.is_some(), cfg.final_softcap.unwrap_or(1.0));
    let (linear, factor) = (cfg.rope_linear_factor.is_some(), cfg.rope_linear_factor.unwrap_or(1.0));
    let normaliser = embed_scale(d, dt);
    let nb = if decode { Dim::symbol("T") } else { Dim::constant(1) };
    let vocab_f = vocab as f64;
    let (layer_sliding, local_theta, global_theta, tied) = (&cfg.sliding, cfg.rope_local_theta, cfg.rope_theta, cfg.tied_embeddings);
    let head_name = if tied { "token_embd.weight" } else { "output.weight" };
    let g = graph! {
        // input_layernorm, the projections, q_norm/k_norm (Gemma3RMSNorm over the head).
        fn qkv(x: {dt}[T, {d}], attn_norm: {dt}[{d}], wq: {dt}[{qd}, {d}], wk: {dt}[{kvd}, {d}], wv: {dt}[{kvd}, {d}],
               q_norm: {dt}[{hd}], k_norm: {dt}[{hd}])
            -> ({dt}[T, {h}, {hd}], {dt}[T, {hkv}, {hd}], {dt}[T, {hkv}, {hd}])
        {
            let x32 = x.cast(f32);
            let hn = (x32 * ((x32 * x32).mean(-1) + {eps}).rsqrt() * (attn_norm.cast(f32) + 1.0)).cast({dt});
            let q32 = hn.matmul(wq, transpose_b = true).reshape([T, {h}, {hd}]).cast(f32);
            let k32 = hn.matmul(wk, transpose_b = true).reshape([T, {hkv}, {hd}]).cast(f32);
            let q = (q32 * ((q32 * q32).mean(-1) + {eps}).rsqrt() * (q_norm.cast(f32) + 1.0)).cast({dt});
            let k = (k32 * ((k32 * k32).mean(-1) + {eps}).rsqrt() * (k_norm.cast(f32) + 1.0)).cast({dt});
            (q, k, hn.matmul(wv, transpose_b = true).reshape([T, {hkv}, {hd}]))
        }

        // o_proj, post_attention_layernorm, residual; pre_feedforward_layernorm, the gated
        // MLP, post_feedforward_layernorm, residual.
        fn finish(x: {dt}[T, {d}], attn: {dt}[T, {qd}], wo: {dt}[{d}, {qd}], post_attn_norm: {dt}[{d}],
                  ffn_norm: {dt}[{d}], w_gate: {dt}[{ffn}, {d}], w_up: {dt}[{ffn}, {d}], w_down: {dt}[{d}, {ffn}],
                  post_ffw_norm: {dt}[{d}])
            -> {dt}[T, {d}]
        {
            let a32 = attn.matmul(wo, transpose_b = true).cast(f32);
            let x1 = x + (a32 * ((a32 * a32).mean(-1) + {eps}).rsqrt() * (post_attn_norm.cast(f32) + 1.0)).cast({dt});
            let y32 = x1.cast(f32);
            let hn = (y32 * ((y32 * y32).mean(-1) + {eps}).rsqrt() * (ffn_norm.cast(f32) + 1.0)).cast({dt});
            let m32 = (hn.matmul(w_gate, transpose_b = true).gelu(form = gelu) * hn.matmul(w_up, transpose_b = true)).matmul(w_down, transpose_b = true).cast(f32);
            x1 + (m32 * ((m32 * m32).mean(-1) + {eps}).rsqrt() * (post_ffw_norm.cast(f32) + 1.0)).cast({dt})
        }

        fn main(tokens: i64[T], positions: i32[T], block_tables: i32[{n_layers}, {&nb}, M],
                k_pages: {dt}[P, {ps}, {hkv}, {hd}], v_pages: {dt}[P, {ps}, {hkv}, {hd}])
            -> ({dt}[T, {vocab}], {dt}[P, {ps}, {hkv}, {hd}], {dt}[P, {ps}, {hkv}, {hd}], i32[T])
        {
            let embed = weight("token_embd.weight", {dt}[{vocab}, {d}]);
            let mut x = embed.gather(tokens) * constant(normaliser, {dt});
            let mut kp = k_pages;
            let mut vp = v_pages;
            let pos = positions.reshape([T, 1]);
            for i in 0..n_layers {
                let bt = block_tables.slice(0, i, i + 1).reshape([{&nb}, M]);
                let [q0, k0, v] = qkv(x,
                    weight(format!("blk.{i}.attn_norm.weight"), {dt}[{d}]),
                    weight(format!("blk.{i}.attn_q.weight"), {dt}[{qd}, {d}]),
                    weight(format!("blk.{i}.attn_k.weight"), {dt}[{kvd}, {d}]),
                    weight(format!("blk.{i}.attn_v.weight"), {dt}[{kvd}, {d}]),
                    weight(format!("blk.{i}.attn_q_norm.weight"), {dt}[{hd}]),
                    weight(format!("blk.{i}.attn_k_norm.weight"), {dt}[{hd}]));
                // Sliding layers rotate with the local base, full ones with the global base
                // and its scaling.
                let (q, k) = if layer_sliding[i] {
                    (q0.rope(pos, theta = local_theta), k0.rope(pos, theta = local_theta))
                } else {
                    if linear {
                        (q0.rope(pos, theta = global_theta, scaling = "linear", factor = factor), k0.rope(pos, theta = global_theta, scaling = "linear", factor = factor))
                    } else {
                        (q0.rope(pos, theta = global_theta), k0.rope(pos, theta = global_theta))
                    }
                };
                let (attn, kp2, vp2) = if decode {
                    // One query per sequence over its cached keys (the last `window` of them
                    // in a sliding layer).
                    let [kp2, vp2] = kp.kv_append(vp, k.reshape([T, 1, {hkv}, {hd}]), v.reshape([T, 1, {hkv}, {hd}]), bt, positions);
                    let qb = q.reshape([T, 1, {h}, {hd}]).transpose(1, 2);
                    let lens = positions + 1;
                    let o = if layer_sliding[i] {
                        if capped {
                            qb.paged_attention(kp2, vp2, bt, lens, scale = scale, causal = true, heads = h, kv_heads = hkv, window = window, softcap = cap)
                        } else {
                            qb.paged_attention(kp2, vp2, bt, lens, scale = scale, causal = true, heads = h, kv_heads = hkv, window = window)
                        }
                    } else {
                        if capped {
                            qb.paged_attention(kp2, vp2, bt, lens, scale = scale, causal = true, heads = h, kv_heads = hkv, softcap = cap)
                        } else {
                            qb.paged_attention(kp2, vp2, bt, lens, scale = scale, causal = true, heads = h, kv_heads = hkv)
                        }
                    };
                    (o.transpose(1, 2).reshape([T, {qd}]), kp2, vp2)
                } else {
                    // The prompt attends to itself; its keys and values go to the cache too.
                    let [kp2, vp2] = kp.kv_append(vp, k.reshape([1, T, {hkv}, {hd}]), v.reshape([1, T, {hkv}, {hd}]), bt, positions.slice(0, 0, 1));
                    let qs = q.reshape([1, T, {h}, {hd}]);
                    let ks = k.reshape([1, T, {hkv}, {hd}]);
                    let vs = v.reshape([1, T, {hkv}, {hd}]);
                    let o = if layer_sliding[i] {
                        if capped {
                            qs.attention(ks, vs, scale = scale, causal = true, heads = h, kv_heads = hkv, layout = "bshd", window = window, softcap = cap)
                        } else {
                            qs.attention(ks, vs, scale = scale, causal = true, heads = h, kv_heads = hkv, layout = "bshd", window = window)
                        }
                    } else {
                        if capped {
                            qs.attention(ks, vs, scale = scale, causal = true, heads = h, kv_heads = hkv, layout = "bshd", softcap = cap)
                        } else {
                            qs.attention(ks, vs, scale = scale, causal = true, heads = h, kv_heads = hkv, layout = "bshd")
                        }
                    };
                    (o.reshape([T, {qd}]), kp2, vp2)
                };
                x = finish(x, attn,
                    weight(format!("blk.{i}.attn_output.weight"), {dt}[{d}, {qd}]),
                    weight(format!("blk.{i}.post_attention_norm.weight"), {dt}[{d}]),
                    weight(format!("blk.{i}.ffn_norm.weight"), {dt}[{d}]),
                    weight(format!("blk.{i}.ffn_gate.weight"), {dt}[{ffn}, {d}]),
                    weight(format!("blk.{i}.ffn_up.weight"), {dt}[{ffn}, {d}]),
                    weight(format!("blk.{i}.ffn_down.weight"), {dt}[{d}, {ffn}]),
                    weight(format!("blk.{i}.post_ffw_norm.weight"), {dt}[{d}]));
                kp = kp2;
                vp = vp2;
            }
            let x32 = x.cast(f32);
            let xn = (x32 * ((x32 * x32).mean(-1) + {eps}).rsqrt() * (weight("output_norm.weight", {dt}[{d}]).cast(f32) + 1.0)).cast({dt});
            let lm_head = if tied { embed } else { weight(head_name, {dt}[{vocab}, {d}]) };
            let raw = xn.matmul(lm_head, transpose_b = true);
            let logits = if final_capped { (raw / {final_cap}).tanh() * {final_cap} } else { raw };
            // The greedy next token of each row (see the decoder contract).
            let best = logits.max(-1);
            let next = logits.eq(best).select(iota(i32, [T, {vocab}], 1), constant(vocab_f, i32)).min(-1, keepdim = false);
            (logits, kp, vp, next)
        }
    }?;
    Ok(g)
}
