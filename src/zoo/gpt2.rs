//! GPT-2 (Radford et al. 2019), written in the DSL the way the reference implementation
//! (Hugging Face `GPT2LMHeadModel`) computes it: learned position embeddings added to the token
//! embeddings, pre-LayerNorm decoder blocks with a fused QKV projection, multi-head causal
//! attention written decomposed as `softmax(Q·Kᵀ·scale + causal mask)·V`, a tanh-GELU MLP,
//! biases on every projection, a final LayerNorm and an LM head tied to the token embedding.
//!
//! **Graph.** [`build`] makes the prefill graph (the `T` tokens of one sequence at once):
//!
//! - inputs `tokens: i64[T]` (token ids, `< vocab`) and `positions: i32[T]` (`< context`,
//!   normally `0..T`; attention is causal over the `T` tokens in order, so positions only
//!   choose rows of the position embedding);
//! - output `logits: dtype[T, vocab]`.
//!
//! This is the full-recompute forward (no KV cache); the engine serves GPT-2 through the paged
//! prefill and decode graphs of [`crate::zoo::gpt2_paged`].
//!
//! **Weights** carry llama.cpp's GGUF names for the `gpt2` architecture, each matrix stored
//! `[out, in]` (GGUF's converter transposes Hugging Face's `Conv1D` matrices, which are stored
//! `[in, out]`; the graph multiplies by the transpose, as [`super::llama`] does). With
//! `H = hidden`, `F = ffn`, `V = vocab`, `C = context`:
//!
//! | name | shape | Hugging Face name |
//! |---|---|---|
//! | `token_embd.weight` | `[V, H]` | `transformer.wte.weight` (also the LM head) |
//! | `position_embd.weight` | `[C, H]` | `transformer.wpe.weight` |
//! | `blk.{i}.attn_norm.weight` / `.bias` | `[H]` | `h.{i}.ln_1.weight` / `.bias` |
//! | `blk.{i}.attn_qkv.weight` | `[3H, H]` | `h.{i}.attn.c_attn.weight`ᵀ (rows: Q, then K, then V) |
//! | `blk.{i}.attn_qkv.bias` | `[3H]` | `h.{i}.attn.c_attn.bias` |
//! | `blk.{i}.attn_output.weight` / `.bias` | `[H, H]` / `[H]` | `h.{i}.attn.c_proj.weight`ᵀ / `.bias` |
//! | `blk.{i}.ffn_norm.weight` / `.bias` | `[H]` | `h.{i}.ln_2.weight` / `.bias` |
//! | `blk.{i}.ffn_up.weight` / `.bias` | `[F, H]` / `[F]` | `h.{i}.mlp.c_fc.weight`ᵀ / `.bias` |
//! | `blk.{i}.ffn_down.weight` / `.bias` | `[H, F]` / `[H]` | `h.{i}.mlp.c_proj.weight`ᵀ / `.bias` |
//! | `output_norm.weight` / `.bias` | `[H]` | `transformer.ln_f.weight` / `.bias` |
//!
//! **Numerics.** LayerNorm is the `layer_norm` op (statistics in f32, biased variance); the
//! attention scores are scaled by `1/sqrt(head_dim)` in the weights' dtype, masked with `-inf`
//! above the diagonal, and the softmax runs in f32 and is cast back, as in [`super::llama`].

use crate::{graph, DType, Error, Graph};

/// Hyper-parameters of a GPT-2 model.
#[derive(Clone, Debug, PartialEq)]
pub struct Gpt2Config {
    /// Vocabulary size `V` (rows of `token_embd.weight`, columns of the logits).
    pub vocab: usize,
    /// Model (residual) width `H`.
    pub hidden: usize,
    /// Number of decoder blocks.
    pub n_layers: usize,
    /// Attention heads (every head has its own keys and values: KV heads = heads).
    pub n_heads: usize,
    /// MLP inner width `F` (GPT-2: `4·hidden`).
    pub ffn: usize,
    /// Context length `C` (`n_positions`): rows of `position_embd.weight`.
    pub context: usize,
    /// LayerNorm ε (GPT-2: 1e-5).
    pub ln_eps: f64,
}

impl Gpt2Config {
    /// GPT-2 small (124M): vocab 50257, hidden 768, 12 layers, 12 heads (head dim 64), FFN 3072,
    /// context 1024, LayerNorm ε 1e-5.
    pub fn gpt2_small() -> Gpt2Config {
        Gpt2Config { vocab: 50257, hidden: 768, n_layers: 12, n_heads: 12, ffn: 3072, context: 1024, ln_eps: 1e-5 }
    }

    /// A small configuration for tests: vocab 64, hidden 32, 2 layers, 4 heads (head dim 8),
    /// FFN 128, context 32, LayerNorm ε 1e-5.
    pub fn tiny() -> Gpt2Config {
        Gpt2Config { vocab: 64, hidden: 32, n_layers: 2, n_heads: 4, ffn: 128, context: 32, ln_eps: 1e-5 }
    }

    /// Width of one head: `hidden / n_heads`.
    pub fn head_dim(&self) -> usize {
        self.hidden / self.n_heads.max(1)
    }

    /// Checks that the numbers fit together.
    ///
    /// # Errors
    /// [`Error::Unsupported`] naming the rule broken.
    pub fn validate(&self) -> Result<(), Error> {
        let bad = |m: String| Err(Error::Unsupported(format!("GPT-2 config: {m}")));
        if self.n_heads == 0 || self.hidden % self.n_heads != 0 {
            return bad(format!("hidden ({}) must be a multiple of a positive n_heads ({})", self.hidden, self.n_heads));
        }
        if self.vocab == 0 || self.hidden == 0 || self.n_layers == 0 || self.ffn == 0 || self.context == 0 {
            return bad("vocab, hidden, n_layers, ffn and context must be positive".into());
        }
        if !(self.ln_eps.is_finite() && self.ln_eps >= 0.0) {
            return bad(format!("ln_eps must be finite and non-negative, got {}", self.ln_eps));
        }
        Ok(())
    }
}

/// Builds the GPT-2 prefill graph with weights of `dtype`: `@main(tokens: i64[T],
/// positions: i32[T]) -> dtype[T, vocab]`, one `@block` function called per layer (see the
/// module documentation for the weight names and shapes).
///
/// ```
/// use sinter::zoo::gpt2;
/// let cfg = gpt2::Gpt2Config::tiny();
/// let g = gpt2::build(&cfg, sinter::DType::F32)?;
/// sinter::ir::verify(&g)?;
/// let main = g.func("main").unwrap();
/// assert!(g.func("block").is_some());
/// assert_eq!(main.outputs.len(), 1);
/// // 2 inputs, 2 embeddings, 12 tensors per block, the final norm's weight and bias.
/// assert_eq!(main.params.len(), 2 + 2 + 12 * cfg.n_layers + 2);
/// # Ok::<(), sinter::Error>(())
/// ```
///
/// # Errors
/// An invalid config ([`Error::Unsupported`]); build errors (which would be bugs of this
/// definition).
pub fn build(cfg: &Gpt2Config, dtype: DType) -> Result<Graph, Error> {
    cfg.validate()?;
    let dt = dtype;
    let (d, nh, hd, ffn, vocab, ctx, n_layers) = (cfg.hidden, cfg.n_heads, cfg.head_dim(), cfg.ffn, cfg.vocab, cfg.context, cfg.n_layers);
    let d3 = 3 * d;
    let (d2, eps) = (2 * d, cfg.ln_eps);
    let scale = 1.0 / (hd as f64).sqrt();
    let ninf = f64::NEG_INFINITY;
    let g = graph! {
        fn block(x: {dt}[T, {d}],
                 ln1_w: {dt}[{d}], ln1_b: {dt}[{d}], w_qkv: {dt}[{d3}, {d}], b_qkv: {dt}[{d3}],
                 w_o: {dt}[{d}, {d}], b_o: {dt}[{d}],
                 ln2_w: {dt}[{d}], ln2_b: {dt}[{d}], w_up: {dt}[{ffn}, {d}], b_up: {dt}[{ffn}],
                 w_down: {dt}[{d}, {ffn}], b_down: {dt}[{d}])
            -> {dt}[T, {d}]
        {
            // Attention: LayerNorm, fused QKV projection, heads split as [heads, T, head_dim].
            let h = x.layer_norm(ln1_w, ln1_b, eps = eps);
            let qkv = h.matmul(w_qkv, transpose_b = true) + b_qkv;
            let q = qkv.slice(1, 0, d).reshape([T, {nh}, {hd}]).transpose(0, 1);
            let k = qkv.slice(1, d, d2).reshape([T, {nh}, {hd}]).transpose(0, 1);
            let v = qkv.slice(1, d2, d3).reshape([T, {nh}, {hd}]).transpose(0, 1);
            let scores = (q @ k.transpose(-2, -1)) * {scale};
            let visible = iota(i32, [T, T], 0) >= iota(i32, [T, T], 1);
            let mask = visible.select(constant(0.0, {dt}), constant(ninf, {dt}));
            let probs = (scores + mask).cast(f32).softmax(-1).cast({dt});
            let attn = (probs @ v).transpose(0, 1).reshape([T, {d}]);
            let x1 = x + (attn.matmul(w_o, transpose_b = true) + b_o);
            // MLP: LayerNorm, up projection, tanh-GELU, down projection.
            let h2 = x1.layer_norm(ln2_w, ln2_b, eps = eps);
            let up = (h2.matmul(w_up, transpose_b = true) + b_up).gelu("tanh");
            x1 + (up.matmul(w_down, transpose_b = true) + b_down)
        }

        fn main(tokens: i64[T], positions: i32[T]) -> {dt}[T, {vocab}] {
            let wte = weight("token_embd.weight", {dt}[{vocab}, {d}]);
            let wpe = weight("position_embd.weight", {dt}[{ctx}, {d}]);
            let mut x = wte.gather(tokens) + wpe.gather(positions);
            for i in 0..n_layers {
                x = block(x,
                    weight(format!("blk.{i}.attn_norm.weight"), {dt}[{d}]),
                    weight(format!("blk.{i}.attn_norm.bias"), {dt}[{d}]),
                    weight(format!("blk.{i}.attn_qkv.weight"), {dt}[{d3}, {d}]),
                    weight(format!("blk.{i}.attn_qkv.bias"), {dt}[{d3}]),
                    weight(format!("blk.{i}.attn_output.weight"), {dt}[{d}, {d}]),
                    weight(format!("blk.{i}.attn_output.bias"), {dt}[{d}]),
                    weight(format!("blk.{i}.ffn_norm.weight"), {dt}[{d}]),
                    weight(format!("blk.{i}.ffn_norm.bias"), {dt}[{d}]),
                    weight(format!("blk.{i}.ffn_up.weight"), {dt}[{ffn}, {d}]),
                    weight(format!("blk.{i}.ffn_up.bias"), {dt}[{ffn}]),
                    weight(format!("blk.{i}.ffn_down.weight"), {dt}[{d}, {ffn}]),
                    weight(format!("blk.{i}.ffn_down.bias"), {dt}[{d}]));
            }
            let xn = x.layer_norm(weight("output_norm.weight", {dt}[{d}]), weight("output_norm.bias", {dt}[{d}]), eps = eps);
            xn.matmul(wte, transpose_b = true)
        }
    }?;
    Ok(g)
}
