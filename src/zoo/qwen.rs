//! Qwen2 and Qwen3 decoders, written in the DSL in the order Hugging Face transformers'
//! `modeling_qwen2.py` and `modeling_qwen3.py` compute them:
//!
//! - `Qwen2RMSNorm`: the input cast to f32, `x · rsqrt(mean(x²) + ε)`, cast back to the
//!   activation dtype, then `weight · x`;
//! - attention: `q_proj`/`k_proj`/`v_proj` (with biases in Qwen2; Qwen3 has none unless
//!   `attention_bias`), viewed as heads `[T, H, D]`; Qwen3 then normalises each query and key
//!   head with its own RMSNorm (`q_norm`/`k_norm`, over `head_dim`); the heads transposed to
//!   `[H, T, D]` (`transpose(1, 2)`), *then* RoPE in the `rotate_half` form (the `rope` op with
//!   the `rope_scaling` of the config); grouped-query attention
//!   `softmax(Q·Kᵀ·head_dim^-½ + causal mask)·V`, the softmax in f32; the heads transposed
//!   back; `o_proj`. The passes move RoPE across the transposes (`rules::layout`), so this
//!   order lowers to the kernels of RoPE applied before the transpose
//!   ([`Spelling::RopeFirst`], kept to show it);
//! - the MLP `down(silu(gate(x)) · up(x))`, residuals around both blocks, a final norm and an
//!   LM head (the embedding when `tie_word_embeddings`).
//!
//! Qwen3's `head_dim` comes from the config and may differ from `hidden / heads`.
//!
//! **Graphs.** [`build`] makes the prefill and the decode graph from one definition, with the
//! signature of the decoder contract ([`crate::llm::decoder`]) and the paged KV cache of the
//! Llama zoo ([`crate::zoo::llama`]): inputs `tokens`, `positions`, `block_tables`,
//! `k_pages`, `v_pages`; outputs `(logits, k_pages, v_pages, next)`.
//!
//! **Sliding window.** A layer with a window `W` ([`QwenConfig::windows`]; Hugging Face's
//! `use_sliding_window`, `sliding_window`, `max_window_layers`) lets query `i` see keys
//! `i − W < j ≤ i`: the prefill mask says so, the decode step passes `window = W` to
//! `paged_attention`.
//!
//! **Weights** carry llama.cpp's GGUF names (`token_embd.weight`, `blk.{i}.attn_q.weight`,
//! `blk.{i}.attn_q.bias`, `blk.{i}.attn_q_norm.weight`, ...), matrices `[out, in]`.

use crate::ir::Attr;
use crate::zoo::Mode;
use crate::{graph, DType, Dim, Error, Graph};

/// Which Qwen generation a config describes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QwenArch {
    /// Qwen2 / Qwen2.5: biases on the query, key and value projections.
    Qwen2,
    /// Qwen3: RMSNorm of each query and key head before RoPE, `head_dim` from the config.
    Qwen3,
}

impl QwenArch {
    /// The registry name: `qwen2` or `qwen3` (`model_type`, `general.architecture`).
    pub fn name(self) -> &'static str {
        match self {
            QwenArch::Qwen2 => "qwen2",
            QwenArch::Qwen3 => "qwen3",
        }
    }
}

/// RoPE frequency scaling (Hugging Face's `rope_scaling`), the types the `rope` op has.
#[derive(Clone, Debug, PartialEq)]
pub enum RopeScaling {
    /// No scaling (`rope_scaling` absent, or `rope_type = "default"`).
    None,
    /// Position interpolation: inverse frequencies divided by `factor`.
    Linear {
        /// The context extension factor.
        factor: f64,
    },
    /// Llama 3.1's wavelength-banded interpolation.
    Llama3 {
        /// `factor`.
        factor: f64,
        /// `low_freq_factor`.
        low_freq_factor: f64,
        /// `high_freq_factor`.
        high_freq_factor: f64,
        /// `original_max_position_embeddings`.
        original_max_position_embeddings: usize,
    },
    /// YaRN (the optional parameters take the op's defaults when `None`).
    Yarn {
        /// `factor`.
        factor: f64,
        /// `original_max_position_embeddings`.
        original_max_position_embeddings: usize,
        /// `beta_fast`.
        beta_fast: Option<f64>,
        /// `beta_slow`.
        beta_slow: Option<f64>,
        /// `truncate`.
        truncate: Option<bool>,
        /// `mscale`.
        mscale: Option<f64>,
        /// `mscale_all_dim`.
        mscale_all_dim: Option<f64>,
        /// `attention_factor`.
        attention_factor: Option<f64>,
    },
}

impl RopeScaling {
    /// The `rope` op's attributes `scaling`, `factor`, `low_freq_factor`, `high_freq_factor`,
    /// `original_max_position_embeddings`, `beta_fast`, `beta_slow`, `truncate`, `mscale`,
    /// `mscale_all_dim`, `attention_factor`, in that order ([`Attr::Absent`] where not given).
    pub fn attrs(&self) -> [Attr; 11] {
        let f = |v: Option<f64>| v.map_or(Attr::Absent, Attr::Float);
        let n = |v: usize| Attr::Int(v as i64);
        let s = |v: &str| Attr::Str(v.to_string());
        match *self {
            RopeScaling::None => [
                s("none"),
                Attr::Absent,
                Attr::Absent,
                Attr::Absent,
                Attr::Absent,
                Attr::Absent,
                Attr::Absent,
                Attr::Absent,
                Attr::Absent,
                Attr::Absent,
                Attr::Absent,
            ],
            RopeScaling::Linear { factor } => [
                s("linear"),
                Attr::Float(factor),
                Attr::Absent,
                Attr::Absent,
                Attr::Absent,
                Attr::Absent,
                Attr::Absent,
                Attr::Absent,
                Attr::Absent,
                Attr::Absent,
                Attr::Absent,
            ],
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings,
            } => [
                s("llama3"),
                Attr::Float(factor),
                Attr::Float(low_freq_factor),
                Attr::Float(high_freq_factor),
                n(original_max_position_embeddings),
                Attr::Absent,
                Attr::Absent,
                Attr::Absent,
                Attr::Absent,
                Attr::Absent,
                Attr::Absent,
            ],
            RopeScaling::Yarn {
                factor,
                original_max_position_embeddings,
                beta_fast,
                beta_slow,
                truncate,
                mscale,
                mscale_all_dim,
                attention_factor,
            } => [
                s("yarn"),
                Attr::Float(factor),
                Attr::Absent,
                Attr::Absent,
                n(original_max_position_embeddings),
                f(beta_fast),
                f(beta_slow),
                truncate.map_or(Attr::Absent, Attr::Bool),
                f(mscale),
                f(mscale_all_dim),
                f(attention_factor),
            ],
        }
    }
}

/// Hyper-parameters of a Qwen2 or Qwen3 decoder.
#[derive(Clone, Debug, PartialEq)]
pub struct QwenConfig {
    /// Qwen2 or Qwen3.
    pub arch: QwenArch,
    /// Vocabulary size.
    pub vocab: usize,
    /// Model (residual) width.
    pub hidden: usize,
    /// Number of decoder layers.
    pub n_layers: usize,
    /// Query heads.
    pub n_heads: usize,
    /// Key/value heads (`n_heads` is a multiple).
    pub n_kv_heads: usize,
    /// Width of one head (Qwen3: from the config, not necessarily `hidden / n_heads`).
    pub head_dim: usize,
    /// MLP inner width.
    pub ffn: usize,
    /// RoPE base θ.
    pub rope_theta: f64,
    /// RoPE frequency scaling.
    pub rope_scaling: RopeScaling,
    /// RMSNorm ε.
    pub rms_eps: f64,
    /// Context length the model was trained for.
    pub context: usize,
    /// Tokens per KV-cache page.
    pub page_size: usize,
    /// Whether the LM head reuses `token_embd.weight`; otherwise it is `output.weight`.
    pub tied_embeddings: bool,
    /// Biases on the query, key and value projections (`blk.{i}.attn_{q,k,v}.bias`): always
    /// in Qwen2, `attention_bias` in Qwen3.
    pub qkv_bias: bool,
    /// A bias on the output projection (`blk.{i}.attn_output.bias`): Qwen3's
    /// `attention_bias`; never in Qwen2.
    pub o_bias: bool,
    /// RMSNorm of each query and key head before RoPE (`blk.{i}.attn_{q,k}_norm.weight`,
    /// `[head_dim]`): Qwen3.
    pub qk_norm: bool,
    /// Each layer's sliding window (keys a query sees, its own included), `None` for full
    /// causal attention; empty when no layer slides, otherwise one entry per layer.
    pub windows: Vec<Option<usize>>,
}

impl QwenConfig {
    /// Qwen2-0.5B's shape: hidden 896, 24 layers, 14 heads, 2 KV heads, head dim 64, FFN
    /// 4864, vocab 151936, RoPE θ 1000000, RMS ε 1e-6, context 32768, tied embeddings.
    pub fn qwen2_0_5b() -> QwenConfig {
        QwenConfig {
            arch: QwenArch::Qwen2,
            vocab: 151936,
            hidden: 896,
            n_layers: 24,
            n_heads: 14,
            n_kv_heads: 2,
            head_dim: 64,
            ffn: 4864,
            rope_theta: 1_000_000.0,
            rope_scaling: RopeScaling::None,
            rms_eps: 1e-6,
            context: 32768,
            page_size: 16,
            tied_embeddings: true,
            qkv_bias: true,
            o_bias: false,
            qk_norm: false,
            windows: vec![],
        }
    }

    /// Qwen3-0.6B's shape: hidden 1024, 28 layers, 16 heads, 8 KV heads, head dim 128 (query
    /// width 2048 ≠ hidden), FFN 3072, vocab 151936, RoPE θ 1000000, RMS ε 1e-6, context
    /// 40960, tied embeddings, q/k norms.
    pub fn qwen3_0_6b() -> QwenConfig {
        QwenConfig {
            arch: QwenArch::Qwen3,
            vocab: 151936,
            hidden: 1024,
            n_layers: 28,
            n_heads: 16,
            n_kv_heads: 8,
            head_dim: 128,
            ffn: 3072,
            rope_theta: 1_000_000.0,
            rope_scaling: RopeScaling::None,
            rms_eps: 1e-6,
            context: 40960,
            page_size: 16,
            tied_embeddings: true,
            qkv_bias: false,
            o_bias: false,
            qk_norm: true,
            windows: vec![],
        }
    }

    /// A small configuration for tests: 2 layers, hidden 32, 4 heads, 2 KV heads, head dim 8
    /// (Qwen2) or 12 (Qwen3, so that the query width 48 differs from hidden), FFN 48,
    /// vocab 64, page size 4.
    pub fn tiny(arch: QwenArch) -> QwenConfig {
        let qwen3 = arch == QwenArch::Qwen3;
        QwenConfig {
            arch,
            vocab: 64,
            hidden: 32,
            n_layers: 2,
            n_heads: 4,
            n_kv_heads: 2,
            head_dim: if qwen3 { 12 } else { 8 },
            ffn: 48,
            rope_theta: 10000.0,
            rope_scaling: RopeScaling::None,
            rms_eps: 1e-6,
            context: 64,
            page_size: 4,
            tied_embeddings: true,
            qkv_bias: !qwen3,
            o_bias: false,
            qk_norm: qwen3,
            windows: vec![],
        }
    }

    /// Layer `i`'s sliding window, if it has one.
    pub fn window(&self, i: usize) -> Option<usize> {
        self.windows.get(i).copied().flatten()
    }

    /// Checks that the numbers fit together.
    ///
    /// # Errors
    /// [`Error::Unsupported`] naming the rule broken.
    pub fn validate(&self) -> Result<(), Error> {
        let bad = |m: String| {
            Err(Error::Unsupported(format!(
                "{} config: {m}",
                self.arch.name()
            )))
        };
        if self.n_heads == 0 || self.n_kv_heads == 0 || self.n_heads % self.n_kv_heads != 0 {
            return bad(format!(
                "n_heads ({}) must be a positive multiple of n_kv_heads ({})",
                self.n_heads, self.n_kv_heads
            ));
        }
        if self.head_dim == 0 || self.head_dim % 2 != 0 {
            return bad(format!(
                "head_dim ({}) must be even and positive",
                self.head_dim
            ));
        }
        if self.page_size == 0
            || self.n_layers == 0
            || self.vocab == 0
            || self.hidden == 0
            || self.ffn == 0
        {
            return bad("page_size, n_layers, vocab, hidden and ffn must be positive".into());
        }
        if !self.windows.is_empty() && self.windows.len() != self.n_layers {
            return bad(format!(
                "{} sliding windows for {} layers",
                self.windows.len(),
                self.n_layers
            ));
        }
        if self.windows.iter().any(|w| *w == Some(0)) {
            return bad("a sliding window must be at least 1".into());
        }
        if !(self.rope_theta.is_finite() && self.rope_theta > 0.0) {
            return bad(format!(
                "rope_theta ({}) must be a finite number above 0",
                self.rope_theta
            ));
        }
        Ok(())
    }
}

/// Builds the prefill or the decode graph of a Qwen2/Qwen3 decoder with weights of `dtype`.
///
/// ```
/// use sinter::zoo::{qwen, Mode};
/// let cfg = qwen::QwenConfig::tiny(qwen::QwenArch::Qwen3);
/// let g = qwen::build(&cfg, Mode::Decode, sinter::DType::F32)?;
/// sinter::ir::verify(&g)?;
/// assert_eq!(g.func("main").unwrap().outputs.len(), 4);
/// # Ok::<(), sinter::Error>(())
/// ```
///
/// # Errors
/// An invalid config; build errors (a rope scaling whose parameters the op refuses).
pub fn build(cfg: &QwenConfig, mode: Mode, dtype: DType) -> Result<Graph, Error> {
    build_spelled(cfg, mode, dtype, Spelling::HuggingFace)
}

/// The order in which a layer applies RoPE and the head transpose.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Spelling {
    /// Hugging Face's: view as heads, transpose to `[H, T, D]`, then RoPE ([`build`]).
    HuggingFace,
    /// RoPE on the `[T, H, D]` view, then the transpose (this zoo's earlier order); the same
    /// values, kept so that tests and the book can compare the two lowerings.
    RopeFirst,
}

/// [`build`] with the layer's operations in the order `spelling` says; both orders compute
/// the same values (RoPE is per position; a transpose moves values).
///
/// # Errors
/// As [`build`].
pub fn build_spelled(cfg: &QwenConfig, mode: Mode, dtype: DType, spelling: Spelling) -> Result<Graph, Error> {
    cfg.validate()?;
    let hf = spelling == Spelling::HuggingFace;
    let decode = mode == Mode::Decode;
    let dt = dtype;
    let (d, hd, h, hkv, ffn, vocab) = (
        cfg.hidden,
        cfg.head_dim,
        cfg.n_heads,
        cfg.n_kv_heads,
        cfg.ffn,
        cfg.vocab,
    );
    let (qd, kvd, group, ps, n_layers) = (h * hd, hkv * hd, h / hkv, cfg.page_size, cfg.n_layers);
    // Qwen2Attention.scaling = head_dim ** -0.5.
    let scale = 1.0 / (hd as f64).sqrt();
    let (eps, theta) = (cfg.rms_eps, cfg.rope_theta);
    let [sc, fac, lo, hi, orig, bfast, bslow, trunc, ms, msa, attf] = cfg.rope_scaling.attrs();
    let (qkv_bias, o_bias, qk_norm) = (cfg.qkv_bias, cfg.o_bias, cfg.qk_norm);
    // Per layer: the sliding window (0 = none) and the `window` attribute of the decode step.
    let windows: Vec<i64> = (0..n_layers)
        .map(|i| cfg.window(i).map_or(0, |w| w as i64))
        .collect();
    let window_attr = |w: i64| if w > 0 { Attr::Int(w) } else { Attr::Absent };
    let nb = if decode {
        Dim::symbol("T")
    } else {
        Dim::constant(1)
    };
    let ninf = f64::NEG_INFINITY;
    let vocab_f = vocab as f64;
    let (tied, head_name) = (
        cfg.tied_embeddings,
        if cfg.tied_embeddings {
            "token_embd.weight"
        } else {
            "output.weight"
        },
    );
    let g = graph! {
        // Qwen2RMSNorm / Qwen3RMSNorm over the last axis: f32 statistics, cast back, weight.
        fn rms_norm(x: {dt}[T, D], w: {dt}[D]) -> {dt}[T, D] {
            let x32 = x.cast(f32);
            (x32 * ((x32 * x32).mean(-1) + {eps}).rsqrt()).cast({dt}) * w
        }

        // The same norm over each head (Qwen3's q_norm / k_norm).
        fn head_norm(x: {dt}[T, H, D], w: {dt}[D]) -> {dt}[T, H, D] {
            let x32 = x.cast(f32);
            (x32 * ((x32 * x32).mean(-1) + {eps}).rsqrt()).cast({dt}) * w
        }

        // Qwen2MLP: down_proj(act_fn(gate_proj(x)) * up_proj(x)), act_fn = silu.
        fn mlp(x: {dt}[T, {d}], w_gate: {dt}[{ffn}, {d}], w_up: {dt}[{ffn}, {d}], w_down: {dt}[{d}, {ffn}]) -> {dt}[T, {d}] {
            (x.matmul(w_gate, transpose_b = true).silu() * x.matmul(w_up, transpose_b = true)).matmul(w_down, transpose_b = true)
        }

        fn main(tokens: i64[T], positions: i32[T], block_tables: i32[{n_layers}, {&nb}, M],
                k_pages: {dt}[P, {ps}, {hkv}, {hd}], v_pages: {dt}[P, {ps}, {hkv}, {hd}])
            -> ({dt}[T, {vocab}], {dt}[P, {ps}, {hkv}, {hd}], {dt}[P, {ps}, {hkv}, {hd}], i32[T])
        {
            let embed = weight("token_embd.weight", {dt}[{vocab}, {d}]);
            let mut x = embed.gather(tokens);
            let mut kp = k_pages;
            let mut vp = v_pages;
            let pos = positions.reshape([T, 1]);
            for i in 0..n_layers {
                let bt = block_tables.slice(0, i, i + 1).reshape([{&nb}, M]);
                // Qwen2DecoderLayer: input_layernorm, self_attn, residual.
                let hn = rms_norm(x, weight(format!("blk.{i}.attn_norm.weight"), {dt}[{d}]));
                let mut q = hn.matmul(weight(format!("blk.{i}.attn_q.weight"), {dt}[{qd}, {d}]), transpose_b = true);
                let mut k = hn.matmul(weight(format!("blk.{i}.attn_k.weight"), {dt}[{kvd}, {d}]), transpose_b = true);
                let mut v = hn.matmul(weight(format!("blk.{i}.attn_v.weight"), {dt}[{kvd}, {d}]), transpose_b = true);
                if qkv_bias {
                    q = q + weight(format!("blk.{i}.attn_q.bias"), {dt}[{qd}]);
                    k = k + weight(format!("blk.{i}.attn_k.bias"), {dt}[{kvd}]);
                    v = v + weight(format!("blk.{i}.attn_v.bias"), {dt}[{kvd}]);
                }
                let mut qh = q.reshape([T, {h}, {hd}]);
                let mut kh = k.reshape([T, {hkv}, {hd}]);
                let vh = v.reshape([T, {hkv}, {hd}]);
                if qk_norm {
                    qh = head_norm(qh, weight(format!("blk.{i}.attn_q_norm.weight"), {dt}[{hd}]));
                    kh = head_norm(kh, weight(format!("blk.{i}.attn_k_norm.weight"), {dt}[{hd}]));
                }
                // Hugging Face: query_states.transpose(1, 2), then apply_rotary_pos_emb
                // (rotate_half) with the config's rope_scaling, cos/sin unsqueezed over the heads.
                let (qx, kx, px) = if !hf {
                    (qh, kh, pos)
                } else {
                    let (a, b, c) = if decode {
                        (qh.reshape([T, 1, {h}, {hd}]).transpose(1, 2), kh.reshape([T, 1, {hkv}, {hd}]).transpose(1, 2), positions.reshape([T, 1, 1]))
                    } else {
                        (qh.transpose(0, 1), kh.transpose(0, 1), positions)
                    };
                    (a, b, c)
                };
                let qr = qx.rope(px, theta = theta, form = "rotate_half", scaling = {sc.clone()}, factor = {fac.clone()},
                    low_freq_factor = {lo.clone()}, high_freq_factor = {hi.clone()}, original_max_position_embeddings = {orig.clone()},
                    beta_fast = {bfast.clone()}, beta_slow = {bslow.clone()}, truncate = {trunc.clone()}, mscale = {ms.clone()},
                    mscale_all_dim = {msa.clone()}, attention_factor = {attf.clone()});
                let kr = kx.rope(px, theta = theta, form = "rotate_half", scaling = {sc.clone()}, factor = {fac.clone()},
                    low_freq_factor = {lo.clone()}, high_freq_factor = {hi.clone()}, original_max_position_embeddings = {orig.clone()},
                    beta_fast = {bfast.clone()}, beta_slow = {bslow.clone()}, truncate = {trunc.clone()}, mscale = {ms.clone()},
                    mscale_all_dim = {msa.clone()}, attention_factor = {attf.clone()});
                let (attn, kp2, vp2) = if decode {
                    // One query per sequence, attending to the sequence's cached keys.
                    // Hugging Face's states are [T, H, 1, D]; the cache takes [T, 1, Hkv, D].
                    let (kn, qb) = if hf {
                        (kr.transpose(1, 2), qr)
                    } else {
                        (kr.reshape([T, 1, {hkv}, {hd}]), qr.reshape([T, 1, {h}, {hd}]).transpose(1, 2))
                    };
                    let vn = if hf { vh.reshape([T, 1, {hkv}, {hd}]).transpose(1, 2).transpose(1, 2) } else { vh.reshape([T, 1, {hkv}, {hd}]) };
                    let [kpn, vpn] = kp.kv_append(vp, kn, vn, bt, positions);
                    let o = qb.paged_attention(kpn, vpn, bt, positions + 1, scale = scale, causal = true, heads = h, kv_heads = hkv, window = {window_attr(windows[i])});
                    (o.transpose(1, 2).reshape([T, {qd}]), kpn, vpn)
                } else {
                    // eager_attention_forward: repeat_kv, Q·Kᵀ·scaling + causal mask, softmax in
                    // f32 cast back, ·V; the prompt's keys and values also go to the cache.
                    // Hugging Face's states are [H, T, D]; the cache takes [1, T, Hkv, D].
                    let (qt, kt0, vt0) = if hf { (qr, kr, vh.transpose(0, 1)) } else { (qr.transpose(0, 1), kr.transpose(0, 1), vh.transpose(0, 1)) };
                    let (kn, vn) = if hf { (kt0.transpose(0, 1), vt0.transpose(0, 1)) } else { (kr, vh) };
                    let [kpn, vpn] = kp.kv_append(vp, kn.reshape([1, T, {hkv}, {hd}]), vn.reshape([1, T, {hkv}, {hd}]), bt, positions.slice(0, 0, 1));
                    let kt = kt0.reshape([{hkv}, 1, T, {hd}]).broadcast([{hkv}, {group}, T, {hd}]).reshape([{h}, T, {hd}]);
                    let vt = vt0.reshape([{hkv}, 1, T, {hd}]).broadcast([{hkv}, {group}, T, {hd}]).reshape([{h}, T, {hd}]);
                    let scores = (qt @ kt.transpose(-2, -1)) * {scale};
                    let mut visible = iota(i32, [T, T], 0) >= iota(i32, [T, T], 1);
                    if windows[i] > 0 {
                        // Sliding window: query i sees keys j with i − j < W.
                        visible = visible && ((iota(i32, [T, T], 0) - iota(i32, [T, T], 1)) < constant({windows[i] as f64}, i32));
                    }
                    let mask = visible.select(constant(0.0, {dt}), constant(ninf, {dt}));
                    let probs = (scores + mask).cast(f32).softmax(-1).cast({dt});
                    ((probs @ vt).transpose(0, 1).reshape([T, {qd}]), kpn, vpn)
                };
                kp = kp2;
                vp = vp2;
                let mut o = attn.matmul(weight(format!("blk.{i}.attn_output.weight"), {dt}[{d}, {qd}]), transpose_b = true);
                if o_bias {
                    o = o + weight(format!("blk.{i}.attn_output.bias"), {dt}[{d}]);
                }
                let x1 = x + o;
                // post_attention_layernorm, mlp, residual.
                let hn2 = rms_norm(x1, weight(format!("blk.{i}.ffn_norm.weight"), {dt}[{d}]));
                x = x1 + mlp(hn2, weight(format!("blk.{i}.ffn_gate.weight"), {dt}[{ffn}, {d}]),
                    weight(format!("blk.{i}.ffn_up.weight"), {dt}[{ffn}, {d}]),
                    weight(format!("blk.{i}.ffn_down.weight"), {dt}[{d}, {ffn}]));
            }
            let xn = rms_norm(x, weight("output_norm.weight", {dt}[{d}]));
            let lm_head = if tied { embed } else { weight(head_name, {dt}[{vocab}, {d}]) };
            let logits = xn.matmul(lm_head, transpose_b = true);
            // The greedy next token of each row: the lowest id of the largest logit, or the
            // vocabulary size for a row holding a NaN (the engine then takes it on the host).
            let best = logits.max(-1);
            let next = logits.eq(best).select(iota(i32, [T, {vocab}], 1), constant(vocab_f, i32)).min(-1, keepdim = false);
            (logits, kp, vp, next)
        }
    }?;
    Ok(g)
}
