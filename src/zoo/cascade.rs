//! Cascade (shared-prefix) decode attention, as FlashInfer's cascade inference does it (Ye et
//! al. 2024, "Cascade Inference: Memory Bandwidth Efficient Shared Prefix Batch Decoding"),
//! written with the IR builder, and the plain paged decode over the same keys to compare with.
//!
//! A batch of `B` requests shares a prefix of `Sp` tokens (a system prompt, few-shot
//! examples) and each has its own suffix of up to `M·page_size` tokens in the paged KV cache.
//! Plain paged decode reads the prefix's K/V once per request; [`cascade_decode`] reads it
//! once for the whole batch:
//!
//! 1. **Prefix**: the `B·g` query rows of each KV head (`g = H/Hkv` query heads share it, one
//!    query token per request) become the rows of one prefill-style attention over the
//!    prefix, so each K/V tile is loaded once per CTA and used by 128 rows on tensor cores
//!    (FlashAttention-2). For parallelism the prefix's keys are cut into `chunks` key ranges
//!    that are the batch axis of that attention (`bshd` layout: prefix `[Sp, Hkv, D]` is
//!    `[chunks, Sp/chunks, Hkv, D]` with no copy; the query rows are broadcast over the
//!    chunks), each chunk giving a partial state (O, log-sum-exp).
//! 2. The chunks' states are merged by log-sum-exp (`attention_merge`, a tree over halves).
//! 3. **Suffix**: each request's own keys through `paged_attention {lse=true}` (split-KV
//!    decode).
//! 4. `attention_merge` of the prefix state and the suffix state is the attention over
//!    prefix + suffix.
//!
//! Graph inputs of [`cascade_decode`] (all `dtype` unless said): `q [B, H, 1, D]`,
//! `k_prefix`, `v_prefix [Sp, Hkv, D]` (the prefix's keys in token-major order, like a
//! page), `k_pages`, `v_pages [P, page_size, Hkv, D]` (the suffixes' pool), `block_table
//! i32[B, M]`, `suffix_lens i32[B]` (0 allowed: an empty suffix's state is empty, and the merge
//! returns the prefix's); output `o [B, H, 1, D]`. [`plain_decode`] takes `q`, `k_pages`,
//! `v_pages` holding prefix and suffix, `block_table i32[B, M]`, `seq_lens i32[B]` and gives
//! the same `o`.

use crate::ir::{Attr, FunctionBuilder, OpKind, Value};
use crate::{DType, Dim, Error, Graph, TensorType};

/// Shape of a cascade decode step.
#[derive(Clone, Debug, PartialEq)]
pub struct CascadeConfig {
    /// Requests (`B`).
    pub batch: usize,
    /// Query heads (`H`).
    pub heads: usize,
    /// KV heads (`Hkv`; `H` a multiple).
    pub kv_heads: usize,
    /// Head dim (`D`).
    pub head_dim: usize,
    /// Shared prefix tokens (`Sp`).
    pub prefix_len: usize,
    /// Tokens per page of the suffix pool.
    pub page_size: usize,
    /// Pages in the suffix pool (`P`).
    pub pages: usize,
    /// Block-table columns (`M`): the most pages a suffix holds.
    pub max_pages: usize,
    /// Key ranges the prefix is cut into (a power of two dividing `prefix_len`).
    pub chunks: usize,
    /// Storage dtype of q, K and V.
    pub dtype: DType,
}

impl CascadeConfig {
    /// The shape of the `cascade` benchmark group: Hq 32 / Hkv 8 / D 128, batch 64, a 32768-token shared
    /// prefix, suffixes of 256 tokens (16 pages of 16), bf16, the prefix in 16 chunks (a
    /// chunk of 2048 keys per CTA pair: 8 KV heads × 2 row tiles × 16 chunks = 256 CTAs).
    pub fn bench() -> CascadeConfig {
        CascadeConfig { batch: 64, heads: 32, kv_heads: 8, head_dim: 128, prefix_len: 32768, page_size: 16, pages: 64 * 16, max_pages: 16, chunks: 16, dtype: DType::BF16 }
    }

    /// `1/√D`.
    pub fn scale(&self) -> f64 {
        1.0 / (self.head_dim as f64).sqrt()
    }

    fn check(&self) -> Result<(), Error> {
        let ok = self.batch > 0
            && self.kv_heads > 0
            && self.heads % self.kv_heads == 0
            && self.heads > 0
            && self.head_dim > 0
            && self.page_size > 0
            && self.chunks.is_power_of_two()
            && self.prefix_len > 0
            && self.prefix_len % self.chunks == 0;
        if ok {
            Ok(())
        } else {
            Err(Error::Unsupported(format!("invalid cascade config {self:?}: heads a multiple of kv_heads, chunks a power of two dividing prefix_len > 0")))
        }
    }
}

fn d(n: usize) -> Dim {
    Dim::constant(n as i64)
}

fn ty(dt: DType, dims: &[usize]) -> TensorType {
    TensorType::new(dt, dims.iter().map(|&n| d(n)))
}

fn view(fb: &mut FunctionBuilder, kind: OpKind, x: Value, attr: (&str, Attr)) -> Result<Value, Error> {
    Ok(fb.op1(kind, &[x], vec![attr])?)
}

fn reshape(fb: &mut FunctionBuilder, x: Value, shape: &[usize]) -> Result<Value, Error> {
    view(fb, OpKind::Reshape, x, ("shape", Attr::Dims(shape.iter().map(|&n| d(n)).collect())))
}

fn permute(fb: &mut FunctionBuilder, x: Value, perm: &[i64]) -> Result<Value, Error> {
    view(fb, OpKind::Permute, x, ("perm", Attr::Ints(perm.to_vec())))
}

fn slice0(fb: &mut FunctionBuilder, x: Value, start: usize, end: usize) -> Result<Value, Error> {
    Ok(fb.op1(OpKind::Slice, &[x], vec![("axis", Attr::Int(0)), ("start", Attr::Int(start as i64)), ("end", Attr::Int(end as i64))])?)
}

fn merge(fb: &mut FunctionBuilder, a: (Value, Value), b: (Value, Value)) -> Result<(Value, Value), Error> {
    let r = fb.op(OpKind::AttentionMerge, &[a.0, a.1, b.0, b.1], vec![])?;
    Ok((r[0], r[1]))
}

/// The cascade decode graph (see the module docs).
///
/// # Errors
/// [`Error::Unsupported`] for an invalid config; builder errors.
pub fn cascade_decode(c: &CascadeConfig) -> Result<Graph, Error> {
    c.check()?;
    let (b, h, hkv, dd, g, n) = (c.batch, c.heads, c.kv_heads, c.head_dim, c.heads / c.kv_heads, c.chunks);
    let rows = b * g;
    let mut fb = FunctionBuilder::new(&Graph::new(), "main");
    let q = fb.param("q", ty(c.dtype, &[b, h, 1, dd]));
    let kp = fb.param("k_prefix", ty(c.dtype, &[c.prefix_len, hkv, dd]));
    let vp = fb.param("v_prefix", ty(c.dtype, &[c.prefix_len, hkv, dd]));
    let ks = fb.param("k_pages", ty(c.dtype, &[c.pages, c.page_size, hkv, dd]));
    let vs = fb.param("v_pages", ty(c.dtype, &[c.pages, c.page_size, hkv, dd]));
    let bt = fb.param("block_table", ty(DType::I32, &[b, c.max_pages]));
    let lens = fb.param("suffix_lens", ty(DType::I32, &[b]));

    // 1. Prefix: rows (request, head in group) of each KV head, broadcast over key chunks.
    let qg = reshape(&mut fb, q, &[b, hkv, g, dd])?;
    let qr = permute(&mut fb, qg, &[0, 2, 1, 3])?; // [B, g, Hkv, D]
    let qr = reshape(&mut fb, qr, &[1, rows, hkv, dd])?;
    let qc = view(&mut fb, OpKind::Broadcast, qr, ("shape", Attr::Dims(vec![d(n), d(rows), d(hkv), d(dd)])))?;
    let kc = reshape(&mut fb, kp, &[n, c.prefix_len / n, hkv, dd])?;
    let vc = reshape(&mut fb, vp, &[n, c.prefix_len / n, hkv, dd])?;
    let attrs = vec![
        ("scale", Attr::Float(c.scale())),
        ("heads", Attr::Int(hkv as i64)),
        ("kv_heads", Attr::Int(hkv as i64)),
        ("layout", Attr::Str("bshd".into())),
        ("lse", Attr::Bool(true)),
    ];
    let r = fb.op(OpKind::Attention, &[qc, kc, vc], attrs)?;
    let (mut o, mut l) = (r[0], r[1]); // [N, rows, Hkv, D], [N, rows, Hkv]
    // 2. The chunks' states merged, halves at a time.
    let mut m = n;
    while m > 1 {
        let half = m / 2;
        let a = (slice0(&mut fb, o, 0, half)?, slice0(&mut fb, l, 0, half)?);
        let z = (slice0(&mut fb, o, half, m)?, slice0(&mut fb, l, half, m)?);
        (o, l) = merge(&mut fb, a, z)?;
        m = half;
    }
    // Back to [B, H, 1, D] and [B, H, 1].
    let o = reshape(&mut fb, o, &[b, g, hkv, dd])?;
    let o = permute(&mut fb, o, &[0, 2, 1, 3])?;
    let o_prefix = reshape(&mut fb, o, &[b, h, 1, dd])?;
    let l = reshape(&mut fb, l, &[b, g, hkv])?;
    let l = permute(&mut fb, l, &[0, 2, 1])?;
    let l_prefix = reshape(&mut fb, l, &[b, h, 1])?;

    // 3. Suffix: each request's own keys.
    let attrs = vec![
        ("scale", Attr::Float(c.scale())),
        ("causal", Attr::Bool(true)),
        ("heads", Attr::Int(h as i64)),
        ("kv_heads", Attr::Int(hkv as i64)),
        ("lse", Attr::Bool(true)),
    ];
    let r = fb.op(OpKind::PagedAttention, &[q, ks, vs, bt, lens], attrs)?;

    // 4. Prefix ⊕ suffix.
    let (out, _) = merge(&mut fb, (o_prefix, l_prefix), (r[0], r[1]))?;
    let f = fb.finish(&[out])?;
    let mut graph = Graph::new();
    graph.add_func(f);
    Ok(graph)
}

/// The plain paged decode over prefix + suffix that [`cascade_decode`] replaces: `q [B, H, 1,
/// D]` over `pages` pages of `[page_size, Hkv, D]` through `block_table i32[B, max_pages]`
/// and `seq_lens i32[B]`.
///
/// # Errors
/// [`Error::Unsupported`] for an invalid config; builder errors.
pub fn plain_decode(c: &CascadeConfig, pages: usize, max_pages: usize) -> Result<Graph, Error> {
    c.check()?;
    let (b, h, hkv, dd) = (c.batch, c.heads, c.kv_heads, c.head_dim);
    let mut fb = FunctionBuilder::new(&Graph::new(), "main");
    let q = fb.param("q", ty(c.dtype, &[b, h, 1, dd]));
    let ks = fb.param("k_pages", ty(c.dtype, &[pages, c.page_size, hkv, dd]));
    let vs = fb.param("v_pages", ty(c.dtype, &[pages, c.page_size, hkv, dd]));
    let bt = fb.param("block_table", ty(DType::I32, &[b, max_pages]));
    let lens = fb.param("seq_lens", ty(DType::I32, &[b]));
    let attrs = vec![("scale", Attr::Float(c.scale())), ("causal", Attr::Bool(true)), ("heads", Attr::Int(h as i64)), ("kv_heads", Attr::Int(hkv as i64))];
    let o = fb.op1(OpKind::PagedAttention, &[q, ks, vs, bt, lens], attrs)?;
    let f = fb.finish(&[o])?;
    let mut graph = Graph::new();
    graph.add_func(f);
    Ok(graph)
}

/// The tables of [`plain_decode`] over the same keys as [`cascade_decode`]'s: the pool holds
/// the prefix's `Sp/page_size` pages once (`shared_prefix`: every block table names them, as a
/// cache with prefix sharing but no cascade kernel reads them) or once per request (a private
/// copy each, as a cache without prefix sharing holds them), then the suffix pool's pages.
/// Returns `(pages, max_pages, block_table, seq_lens)`; [`plain_pages`] builds the pool.
///
/// # Errors
/// [`Error::Unsupported`] unless `prefix_len` is a multiple of `page_size` (a suffix starts
/// on a fresh page) and the suffix table holds `batch · max_pages` entries and the lengths
/// `batch`.
pub fn plain_tables(c: &CascadeConfig, suffix_table: &[i32], suffix_lens: &[i32], shared_prefix: bool) -> Result<(usize, usize, Vec<f64>, Vec<f64>), Error> {
    c.check()?;
    if c.prefix_len % c.page_size != 0 || suffix_table.len() != c.batch * c.max_pages || suffix_lens.len() != c.batch {
        return Err(Error::Unsupported(format!(
            "plain decode tables: prefix_len {} must be a multiple of page_size {}, with {} suffix table entries and {} lengths (got {} and {})",
            c.prefix_len,
            c.page_size,
            c.batch * c.max_pages,
            c.batch,
            suffix_table.len(),
            suffix_lens.len()
        )));
    }
    let pp = c.prefix_len / c.page_size;
    let copies = if shared_prefix { 1 } else { c.batch };
    let mut table = Vec::with_capacity(c.batch * (pp + c.max_pages));
    for b in 0..c.batch {
        let copy = if shared_prefix { 0 } else { b };
        table.extend((0..pp).map(|i| (copy * pp + i) as f64));
        table.extend(suffix_table[b * c.max_pages..(b + 1) * c.max_pages].iter().map(|&p| (copies * pp) as f64 + f64::from(p)));
    }
    let lens = suffix_lens.iter().map(|&l| (c.prefix_len as i64 + i64::from(l)) as f64).collect();
    Ok((copies * pp + c.pages, pp + c.max_pages, table, lens))
}

/// The page pool of [`plain_decode`] for [`plain_tables`]: `copies` times the prefix `[Sp,
/// Hkv, D]` (token-major, so its pages are consecutive rows), then the suffix pool `[P,
/// page_size, Hkv, D]`.
///
/// # Errors
/// [`Error::Unsupported`] for tensors whose shapes do not match the config.
pub fn plain_pages(c: &CascadeConfig, prefix: &crate::Tensor, pool: &crate::Tensor, shared_prefix: bool) -> Result<crate::Tensor, Error> {
    let row = c.kv_heads * c.head_dim;
    if prefix.shape() != [c.prefix_len, c.kv_heads, c.head_dim] || pool.shape() != [c.pages, c.page_size, c.kv_heads, c.head_dim] || c.prefix_len % c.page_size != 0 {
        return Err(Error::Unsupported(format!("plain pages: prefix {:?} and pool {:?} do not match {c:?}", prefix.shape(), pool.shape())));
    }
    let copies = if shared_prefix { 1 } else { c.batch };
    let mut data = Vec::with_capacity((copies * c.prefix_len + c.pages * c.page_size) * row);
    for _ in 0..copies {
        data.extend_from_slice(prefix.data());
    }
    data.extend_from_slice(pool.data());
    let pages = copies * c.prefix_len / c.page_size + c.pages;
    Ok(crate::Tensor::new(prefix.dtype(), &[pages, c.page_size, c.kv_heads, c.head_dim], data)?)
}
