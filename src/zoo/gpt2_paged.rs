//! GPT-2 over a paged KV cache: the prefill and decode graphs of [`super::gpt2`]'s model in
//! the decoder signature the engine serves ([`crate::llm::decoder`]), so GPT-2 generates
//! with the same engine as the Llama family.
//!
//! The block is [`super::gpt2`]'s — pre-LayerNorm, fused QKV projection with bias,
//! multi-head attention (every head its own keys and values), a tanh-GELU MLP, biases on
//! every projection, learned positions added to the token embeddings, a final LayerNorm and
//! an LM head tied to the token embedding — with the keys and values written to the cache
//! (`kv_append`) and, in decode, attention over it (`paged_attention`). Weight names and
//! shapes are [`super::gpt2`]'s.
//!
//! - inputs `tokens: i64[T]`, `positions: i32[T]` (`< context`: they index
//!   `position_embd.weight`), `block_tables: i32[L, B, M]`, `k_pages`/`v_pages:
//!   dtype[P, page_size, heads, head_dim]`;
//! - outputs `(logits: dtype[T, vocab], k_pages, v_pages, next: i32[T])`.
//! - **Prefill**: the `T` tokens of one fresh sequence (`B = 1`), positions `0..T`;
//!   **decode**: one new token for each of `T` sequences (`B = T`).

use super::gpt2::Gpt2Config;
use super::Mode;
use crate::{graph, DType, Dim, Error, Graph};

/// Builds GPT-2's prefill or decode graph over a paged KV cache of `page_size`-token pages,
/// with weights of `dtype`.
///
/// ```
/// use sinter::zoo::{gpt2::Gpt2Config, gpt2_paged, Mode};
/// let g = gpt2_paged::build(&Gpt2Config::tiny(), Mode::Decode, sinter::DType::F32, 4)?;
/// sinter::ir::verify(&g)?;
/// assert_eq!(g.func("main").unwrap().outputs.len(), 4);
/// # Ok::<(), sinter::Error>(())
/// ```
///
/// # Errors
/// An invalid config or a page size of 0 ([`Error::Unsupported`]); build errors (which would
/// be bugs of this definition).
pub fn build(cfg: &Gpt2Config, mode: Mode, dtype: DType, page_size: usize) -> Result<Graph, Error> {
    cfg.validate()?;
    if page_size == 0 {
        return Err(Error::Unsupported("GPT-2 config: page_size must be positive".into()));
    }
    let decode = mode == Mode::Decode;
    let dt = dtype;
    let (d, nh, hd, ffn, vocab, ctx, n_layers, ps) = (cfg.hidden, cfg.n_heads, cfg.head_dim(), cfg.ffn, cfg.vocab, cfg.context, cfg.n_layers, page_size);
    let (d2, d3, eps) = (2 * d, 3 * d, cfg.ln_eps);
    let scale = 1.0 / (hd as f64).sqrt();
    let nb = if decode { Dim::symbol("T") } else { Dim::constant(1) };
    let ninf = f64::NEG_INFINITY;
    let vocab_f = vocab as f64;
    let g = graph! {
        fn block(x: {dt}[T, {d}], positions: i32[T], block_table: i32[{&nb}, M],
                 k_pages: {dt}[P, {ps}, {nh}, {hd}], v_pages: {dt}[P, {ps}, {nh}, {hd}],
                 ln1_w: {dt}[{d}], ln1_b: {dt}[{d}], w_qkv: {dt}[{d3}, {d}], b_qkv: {dt}[{d3}],
                 w_o: {dt}[{d}, {d}], b_o: {dt}[{d}],
                 ln2_w: {dt}[{d}], ln2_b: {dt}[{d}], w_up: {dt}[{ffn}, {d}], b_up: {dt}[{ffn}],
                 w_down: {dt}[{d}, {ffn}], b_down: {dt}[{d}])
            -> ({dt}[T, {d}], {dt}[P, {ps}, {nh}, {hd}], {dt}[P, {ps}, {nh}, {hd}])
        {
            let h = x.layer_norm(ln1_w, ln1_b, eps = eps);
            let qkv = h.matmul(w_qkv, transpose_b = true) + b_qkv;
            let q = qkv.slice(1, 0, d).reshape([T, {nh}, {hd}]);
            let k = qkv.slice(1, d, d2).reshape([T, {nh}, {hd}]);
            let v = qkv.slice(1, d2, d3).reshape([T, {nh}, {hd}]);
            let (attn, kp, vp) = if decode {
                // One query per sequence, attending to the sequence's cached keys.
                let [kp, vp] = k_pages.kv_append(v_pages, k.reshape([T, 1, {nh}, {hd}]), v.reshape([T, 1, {nh}, {hd}]), block_table, positions);
                let qb = q.reshape([T, 1, {nh}, {hd}]).transpose(1, 2);
                let o = qb.paged_attention(kp, vp, block_table, positions + 1, scale = scale, causal = true, heads = nh, kv_heads = nh);
                (o.transpose(1, 2).reshape([T, {d}]), kp, vp)
            } else {
                // The prompt attends to itself (as GPT-2 writes it); its keys and values go to
                // the cache too.
                let [kp, vp] = k_pages.kv_append(v_pages, k.reshape([1, T, {nh}, {hd}]), v.reshape([1, T, {nh}, {hd}]), block_table, positions.slice(0, 0, 1));
                let scores = (q.transpose(0, 1) @ k.transpose(0, 1).transpose(-2, -1)) * {scale};
                let visible = iota(i32, [T, T], 0) >= iota(i32, [T, T], 1);
                let mask = visible.select(constant(0.0, {dt}), constant(ninf, {dt}));
                let probs = (scores + mask).cast(f32).softmax(-1).cast({dt});
                ((probs @ v.transpose(0, 1)).transpose(0, 1).reshape([T, {d}]), kp, vp)
            };
            let x1 = x + (attn.matmul(w_o, transpose_b = true) + b_o);
            let h2 = x1.layer_norm(ln2_w, ln2_b, eps = eps);
            let up = (h2.matmul(w_up, transpose_b = true) + b_up).gelu("tanh");
            (x1 + (up.matmul(w_down, transpose_b = true) + b_down), kp, vp)
        }

        fn main(tokens: i64[T], positions: i32[T], block_tables: i32[{n_layers}, {&nb}, M],
                k_pages: {dt}[P, {ps}, {nh}, {hd}], v_pages: {dt}[P, {ps}, {nh}, {hd}])
            -> ({dt}[T, {vocab}], {dt}[P, {ps}, {nh}, {hd}], {dt}[P, {ps}, {nh}, {hd}], i32[T])
        {
            let wte = weight("token_embd.weight", {dt}[{vocab}, {d}]);
            let wpe = weight("position_embd.weight", {dt}[{ctx}, {d}]);
            let mut x = wte.gather(tokens) + wpe.gather(positions);
            let mut kp = k_pages;
            let mut vp = v_pages;
            for i in 0..n_layers {
                let bt = block_tables.slice(0, i, i + 1).reshape([{&nb}, M]);
                let [x2, kp2, vp2] = block(x, positions, bt, kp, vp,
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
                x = x2;
                kp = kp2;
                vp = vp2;
            }
            let xn = x.layer_norm(weight("output_norm.weight", {dt}[{d}]), weight("output_norm.bias", {dt}[{d}]), eps = eps);
            let logits = xn.matmul(wte, transpose_b = true);
            // The greedy next token of each row (see the decoder contract).
            let best = logits.max(-1);
            let next = logits.eq(best).select(iota(i32, [T, {vocab}], 1), constant(vocab_f, i32)).min(-1, keepdim = false);
            (logits, kp, vp, next)
        }
    }?;
    Ok(g)
}
