//! `attention`, `kv_append` and `paged_attention`.
//!
//! Both attention ops share one inner routine, [`attend_row`]: a tiled online softmax over the
//! keys of one query row as in FlashAttention-2 (Dao 2023, arXiv 2307.08691, Algorithm 1),
//! in f64, independent of the `softmax(scale·QKᵀ + mask)·V` decomposition.

use crate::dtype::DType;
use crate::ops::Op;

use super::elementwise::nan_max;
use super::tensor::{bcast_strides, broadcasts_to, round_all, Tensor};
use super::{attr_err, attrs, operands_err, type_text, InterpError, Result, Site};

/// Keys per tile of the online softmax.
const TILE: usize = 16;

/// The keys and values one query head reads: key j is `k[k_offs[j]..][..d]`, its value
/// `v[v_offs[j]..][..dv]`.
struct Kv<'a> {
    k: &'a [f64],
    v: &'a [f64],
    k_offs: &'a [usize],
    v_offs: &'a [usize],
    d: usize,
    dv: usize,
}

/// The score transform of an attention op: `scale`, and the optional `softcap` c.
#[derive(Clone, Copy)]
struct Scores {
    scale: f64,
    softcap: Option<f64>,
}

impl Scores {
    fn of(op: &Op) -> Result<Scores> {
        let scale = attrs::float(op, "scale")?;
        let softcap = op.float("softcap");
        if let Some(c) = softcap {
            if !(c > 0.0 && (c as f32).is_finite()) {
                return attr_err(format!("softcap must be a finite f32 above 0, got {c:?}"));
            }
        }
        Ok(Scores { scale, softcap })
    }
    /// `scale·dot`, soft-capped to `c·tanh(s/c)` when a cap is given.
    fn score(self, dot: f64) -> f64 {
        let s = self.scale * dot;
        self.softcap.map_or(s, |c| c * (s / c).tanh())
    }
}

/// Attention of one query row over keys `keys` (the visible ones; the caller has applied the
/// causal limit and the sliding window, so hidden keys are never read), written to `out`
/// (length dv), unrounded.
///
/// Score `s_j = cap(scale·(q·k_j)) + mask_j` (cap: `c·tanh(s/c)` with a softcap, else the
/// identity; mask optional). Per tile (the keys of `keys` among `[16t, 16t + 16)`,
/// [`TILE`]): tile max `m̃`, `m_new = max(m, m̃)` (NaN-propagating), `α = exp(m − m_new)`, `l = α·l + Σ exp(s_j −
/// m_new)`, `acc = α·acc + Σ exp(s_j − m_new)·v_j`; finally `out = acc / l`. While every score
/// so far is −inf, `m_new` is taken as 0 (every weight is exp(−inf) = 0). Every visible key's
/// product `p_j·v_j` is made, a masked key's with `p_j = 0`: NaN or ±inf in V there gives NaN
/// (IEEE 0·NaN, 0·inf), as the written-out `softmax(s)·V` does. A row that never sees a score
/// above −inf (all masked to −inf) gives `Σ 0·v_j`: exactly 0 for finite V; a row with no
/// visible key gives 0. A NaN score makes `m` NaN and so the whole row NaN; a +inf score gives
/// exp(inf − inf) = NaN, as the reference softmax does.
///
/// Returns the row's log-sum-exp `m + ln l` (natural log; −inf for a row without a finite
/// score, NaN where the row is NaN).
fn attend_row(q: &[f64], sc: Scores, kv: &Kv<'_>, keys: std::ops::Range<usize>, mask: Option<&[f64]>, out: &mut [f64]) -> f64 {
    let mut s = [0.0f64; TILE];
    let mut m = f64::NEG_INFINITY;
    let mut l = 0.0f64;
    out.iter_mut().for_each(|o| *o = 0.0);
    let (mut j0, n) = (keys.start, keys.end);
    while j0 < n {
        // Tiles are aligned to absolute key indices (as the kernels' are), so a window's
        // first tile is partial.
        let j1 = ((j0 / TILE + 1) * TILE).min(n);
        let mut tile_max = f64::NEG_INFINITY;
        for j in j0..j1 {
            let k = &kv.k[kv.k_offs[j]..][..kv.d];
            let dot: f64 = q.iter().zip(k).map(|(a, b)| a * b).sum();
            let x = sc.score(dot) + mask.map_or(0.0, |mk| mk[j]);
            s[j - j0] = x;
            tile_max = nan_max(tile_max, x);
        }
        let m_new = nan_max(m, tile_max);
        let m_use = if m_new == f64::NEG_INFINITY { 0.0 } else { m_new };
        let alpha = (m - m_use).exp();
        l *= alpha;
        out.iter_mut().for_each(|o| *o *= alpha);
        for j in j0..j1 {
            let p = (s[j - j0] - m_use).exp();
            l += p;
            let v = &kv.v[kv.v_offs[j]..][..kv.dv];
            for (o, &vv) in out.iter_mut().zip(v) {
                *o += p * vv;
            }
        }
        m = m_new;
        j0 = j1;
    }
    if m == f64::NEG_INFINITY {
        // out is Σ 0·v_j (l = 0).
        f64::NEG_INFINITY
    } else {
        out.iter_mut().for_each(|o| *o /= l);
        m + l.ln()
    }
}

/// The log-sum-exp result of an attention op with `lse=true`: f32 of the given shape.
fn lse_tensor(op: &Op, shape: Vec<usize>, mut data: Vec<f64>) -> Result<Option<Tensor>> {
    if !attrs::bool(op, "lse")? {
        return Ok(None);
    }
    round_all(DType::F32, &mut data);
    Ok(Some(Tensor::from_parts(DType::F32, shape, data)))
}

/// The keys query row `i` of `sq` sees among `skv`: all without `causal`; with it `j ≤ pᵢ`
/// (bottom-right aligned, pᵢ = i + skv − sq), and with a sliding window W also `pᵢ − j < W`.
fn visible(causal: bool, window: Option<usize>, i: usize, sq: usize, skv: usize) -> std::ops::Range<usize> {
    if !causal {
        return 0..skv;
    }
    let lim = i as i128 + skv as i128 - sq as i128 + 1;
    let hi = lim.clamp(0, skv as i128) as usize;
    let lo = window.map_or(0, |w| (lim - w as i128).clamp(0, hi as i128) as usize);
    lo..hi
}

/// The `window` attribute: absent, or an integer ≥ 1 with `causal=true`.
fn window_attr(op: &Op, causal: bool) -> Result<Option<usize>> {
    match op.int("window") {
        None => Ok(None),
        Some(w) if w >= 1 && causal => Ok(Some(usize::try_from(w).unwrap_or(usize::MAX))),
        Some(w) if w >= 1 => attr_err(format!("window={w} is a causal sliding window: it needs causal=true")),
        Some(w) => attr_err(format!("window must be at least 1, got {w}")),
    }
}

fn heads_attrs(op: &Op) -> Result<(usize, usize)> {
    let (h, hkv) = (attrs::int(op, "heads")?, attrs::int(op, "kv_heads")?);
    if h <= 0 || hkv <= 0 || h % hkv != 0 {
        return attr_err(format!("heads ({h}) must be a positive multiple of kv_heads ({hkv})"));
    }
    Ok((h as usize, hkv as usize))
}

fn want(cond: bool, msg: impl FnOnce() -> String) -> Result<()> {
    if cond {
        Ok(())
    } else {
        operands_err(msg())
    }
}

fn tt(t: &Tensor) -> String {
    type_text(t.dtype, &t.shape)
}

/// `attention(q, k, v, mask?)`: see the op table. Layout `bhsd` (q `[B,H,Sq,D]`) or `bshd`
/// (q `[B,Sq,H,D]`); GQA head h reads KV head `h / (H/Hkv)`; causal bottom-right, with an
/// optional sliding window; scores optionally soft-capped before the mask; optional
/// additive mask broadcast to `[B,H,Sq,Skv]`; one rounding to q's dtype. With `lse=true`, also
/// each row's log-sum-exp (f32 `[B,H,Sq]`, `[B,Sq,H]` in `bshd`).
pub(super) fn attention(op: &Op, q: &Tensor, k: &Tensor, v: &Tensor, mask: Option<&Tensor>) -> Result<(Tensor, Option<Tensor>)> {
    for (t, n) in [(q, "q"), (k, "k"), (v, "v")] {
        want(t.rank() == 4 && t.dtype.is_float() && t.dtype == q.dtype, || {
            format!("{n} must be a rank-4 float tensor of q's dtype, got {} (q is {})", tt(t), tt(q))
        })?;
    }
    let sc = Scores::of(op)?;
    let causal = attrs::bool(op, "causal")?;
    let window = window_attr(op, causal)?;
    let (heads, kv_heads) = heads_attrs(op)?;
    let bshd = match attrs::str(op, "layout")? {
        "bhsd" => false,
        "bshd" => true,
        other => return attr_err(format!("layout must be \"bhsd\" or \"bshd\", got {other:?}")),
    };
    // (B, H, S, D) of a tensor in the layout.
    let dims = |t: &Tensor| {
        let s = &t.shape;
        if bshd {
            (s[0], s[2], s[1], s[3])
        } else {
            (s[0], s[1], s[2], s[3])
        }
    };
    let (bq, hq, sq, d) = dims(q);
    let (bk, hk, skv, dk) = dims(k);
    let (bv, hv, sv, dv) = dims(v);
    want(hq == heads, || format!("q has {hq} heads, the attribute says {heads}"))?;
    want(hk == kv_heads && hv == kv_heads, || format!("k and v have {hk} and {hv} heads, kv_heads is {kv_heads}"))?;
    want(bq == bk && bq == bv, || format!("batch sizes differ: q {}, k {}, v {}", tt(q), tt(k), tt(v)))?;
    want(d == dk, || format!("q and k head dims differ: {} vs {}", tt(q), tt(k)))?;
    want(skv == sv, || format!("k and v sequence lengths differ: {} vs {}", tt(k), tt(v)))?;
    let full = [bq, heads, sq, skv];
    let mask_strides = match mask {
        Some(mk) => {
            want(mk.dtype.is_float(), || format!("the additive mask must be float, got {}", tt(mk)))?;
            want(broadcasts_to(&mk.shape, &full), || format!("the mask {} does not broadcast to [B, H, Sq, Skv] = {full:?}", tt(mk)))?;
            Some(bcast_strides(&mk.shape, &full))
        }
        None => None,
    };
    // Offset of row (b, h, s) of a [B, H, S, X] (or [B, S, H, X]) tensor with row length x.
    let off = |b: usize, h: usize, s: usize, nh: usize, ns: usize, x: usize| {
        if bshd {
            ((b * ns + s) * nh + h) * x
        } else {
            ((b * nh + h) * ns + s) * x
        }
    };
    let out_shape = if bshd { vec![bq, sq, heads, dv] } else { vec![bq, heads, sq, dv] };
    let mut data = vec![0.0; bq * heads * sq * dv];
    let mut lse = vec![0.0; bq * heads * sq];
    let group = heads / kv_heads;
    let (mut k_offs, mut v_offs) = (vec![0usize; skv], vec![0usize; skv]);
    let mut mrow = vec![0.0; skv];
    let mut acc = vec![0.0; dv];
    for b in 0..bq {
        for g in 0..kv_heads {
            for j in 0..skv {
                k_offs[j] = off(b, g, j, kv_heads, skv, d);
                v_offs[j] = off(b, g, j, kv_heads, skv, dv);
            }
            let kv = Kv { k: &k.data, v: &v.data, k_offs: &k_offs, v_offs: &v_offs, d, dv };
            for h in g * group..(g + 1) * group {
                for i in 0..sq {
                    let keys = visible(causal, window, i, sq, skv);
                    let mrow = match (mask, &mask_strides) {
                        (Some(mk), Some(st)) => {
                            let base = b * st[0] + h * st[1] + i * st[2];
                            for j in keys.clone() {
                                mrow[j] = mk.data[base + j * st[3]];
                            }
                            Some(&mrow[..])
                        }
                        _ => None,
                    };
                    let qrow = &q.data[off(b, h, i, heads, sq, d)..][..d];
                    lse[off(b, h, i, heads, sq, 1)] = attend_row(qrow, sc, &kv, keys, mrow, &mut acc);
                    data[off(b, h, i, heads, sq, dv)..][..dv].copy_from_slice(&acc);
                }
            }
        }
    }
    round_all(q.dtype, &mut data);
    let lse = lse_tensor(op, out_shape[..3].to_vec(), lse)?;
    Ok((Tensor::from_parts(q.dtype, out_shape, data), lse))
}

fn check_pages(kp: &Tensor, vp: &Tensor) -> Result<(usize, usize, usize, usize)> {
    want(kp.rank() == 4 && kp.dtype.is_float(), || format!("k_pages must be a rank-4 float tensor [pages, page_size, kv_heads, head_dim], got {}", tt(kp)))?;
    want(kp.dtype == vp.dtype && kp.shape == vp.shape, || format!("k_pages and v_pages must have one type, got {} and {}", tt(kp), tt(vp)))?;
    Ok((kp.shape[0], kp.shape[1], kp.shape[2], kp.shape[3]))
}

fn check_table(bt: &Tensor, lens: &Tensor, batch: usize, lens_name: &str) -> Result<usize> {
    want(bt.rank() == 2 && bt.dtype == DType::I32, || format!("block_table must be i32[batch, max_pages], got {}", tt(bt)))?;
    want(lens.rank() == 1 && lens.dtype == DType::I32, || format!("{lens_name} must be i32[batch], got {}", tt(lens)))?;
    want(bt.shape[0] == batch && lens.shape[0] == batch, || format!("batch is {batch}, but block_table is {} and {lens_name} {}", tt(bt), tt(lens)))?;
    Ok(bt.shape[1])
}

/// The page holding slot `slot` of sequence `b`, checked against the block table and the
/// page count.
fn page_of(bt: &Tensor, b: usize, slot: usize, page_size: usize, pages: usize, what: &str) -> Result<usize> {
    let cols = bt.shape[1];
    let col = slot / page_size;
    let entry = bt.data[b * cols + col] as i64;
    usize::try_from(entry).ok().filter(|&p| p < pages).ok_or_else(|| InterpError::IndexOutOfRange {
        site: Site::default(),
        what: format!("block_table[{b}][{col}] (the page of {what} {slot} of sequence {b})"),
        index: entry,
        len: pages as i64,
    })
}

/// `kv_append`: writes token t of sequence b of `k_new`/`v_new` to slot `start_pos[b] + t`,
/// i.e. page `block_table[b][slot / page_size]`, row `slot % page_size`; returns new pages
/// (the inputs are copied; the op is functional). Writes happen in (b, t) order, so when two
/// tokens map to one slot the later one stays.
pub(super) fn kv_append(kp: &Tensor, vp: &Tensor, kn: &Tensor, vn: &Tensor, bt: &Tensor, start: &Tensor) -> Result<(Tensor, Tensor)> {
    let (pages, page_size, hkv, d) = check_pages(kp, vp)?;
    want(kn.rank() == 4 && kn.dtype == kp.dtype, || format!("k_new must be [batch, T, kv_heads, head_dim] of the pages' dtype, got {}", tt(kn)))?;
    want(kn.dtype == vn.dtype && kn.shape == vn.shape, || format!("k_new and v_new must have one type, got {} and {}", tt(kn), tt(vn)))?;
    want(kn.shape[2] == hkv && kn.shape[3] == d, || format!("k_new {} does not match the pages {}", tt(kn), tt(kp)))?;
    let (batch, t) = (kn.shape[0], kn.shape[1]);
    let cols = check_table(bt, start, batch, "start_pos")?;
    if page_size == 0 && batch * t > 0 {
        return Err(InterpError::ZeroSize { site: Site::default(), message: format!("page_size is 0 ({}), so the {t} new tokens per sequence have no slot", tt(kp)) });
    }
    let row = hkv * d;
    let (mut ko, mut vo) = (kp.data.clone(), vp.data.clone());
    let capacity = cols * page_size;
    for b in 0..batch {
        let s0 = start.data[b] as i64;
        for ti in 0..t {
            let slot = s0 + ti as i64;
            let Some(slot) = usize::try_from(slot).ok().filter(|&s| s < capacity) else {
                return Err(InterpError::IndexOutOfRange {
                    site: Site::default(),
                    what: format!("the slot of token {ti} of sequence {b} (start_pos[{b}] = {s0}; the block table holds {cols} pages of {page_size})"),
                    index: slot,
                    len: capacity as i64,
                });
            };
            let page = page_of(bt, b, slot, page_size, pages, "slot")?;
            let dst = (page * page_size + slot % page_size) * row;
            let src = (b * t + ti) * row;
            ko[dst..dst + row].copy_from_slice(&kn.data[src..src + row]);
            vo[dst..dst + row].copy_from_slice(&vn.data[src..src + row]);
        }
    }
    Ok((Tensor::from_parts(kp.dtype, kp.shape.clone(), ko), Tensor::from_parts(vp.dtype, vp.shape.clone(), vo)))
}

/// `paged_attention`: q `[B, H, T, D]` over `seq_lens[b]` keys of sequence b, key j at page
/// `block_table[b][j / page_size]`, row `j % page_size`; causal bottom-right with
/// Skv = `seq_lens[b]`, Sq = T, and the sliding window and softcap of `attention`; GQA as in
/// `attention`; a sequence of length 0 gives 0s.
/// Only the block-table entries a sequence reads are checked. With `lse=true`, also each
/// row's log-sum-exp (f32 `[B, H, T]`).
pub(super) fn paged_attention(op: &Op, q: &Tensor, kp: &Tensor, vp: &Tensor, bt: &Tensor, lens: &Tensor) -> Result<(Tensor, Option<Tensor>)> {
    want(q.rank() == 4 && q.dtype.is_float(), || format!("q must be a rank-4 float tensor [batch, heads, T, head_dim], got {}", tt(q)))?;
    let (pages, page_size, hkv, d) = check_pages(kp, vp)?;
    want(kp.dtype == q.dtype, || format!("q and the pages must share a dtype, got {} and {}", tt(q), tt(kp)))?;
    let sc = Scores::of(op)?;
    let causal = attrs::bool(op, "causal")?;
    let window = window_attr(op, causal)?;
    let (heads, kv_heads) = heads_attrs(op)?;
    let (batch, h, t, dq) = (q.shape[0], q.shape[1], q.shape[2], q.shape[3]);
    want(h == heads, || format!("q has {h} heads, the attribute says {heads}"))?;
    want(hkv == kv_heads, || format!("the pages have {hkv} heads, kv_heads is {kv_heads}"))?;
    want(dq == d, || format!("q's head dim differs from the pages': {} vs {}", tt(q), tt(kp)))?;
    let cols = check_table(bt, lens, batch, "seq_lens")?;
    let capacity = cols * page_size;
    let group = heads / kv_heads;
    let mut data = vec![0.0; q.data.len()];
    let mut lse = vec![0.0; batch * heads * t];
    let mut acc = vec![0.0; d];
    let (mut base, mut k_offs) = (Vec::new(), Vec::new());
    for b in 0..batch {
        let len = lens.data[b] as i64;
        let Some(len) = usize::try_from(len).ok().filter(|&l| l <= capacity) else {
            return Err(InterpError::IndexOutOfRange {
                site: Site::default(),
                what: format!("seq_lens[{b}] (the block table holds {cols} pages of {page_size} keys)"),
                index: len,
                len: capacity as i64 + 1,
            });
        };
        base.clear();
        for j in 0..len {
            let page = page_of(bt, b, j, page_size, pages, "key")?;
            base.push((page * page_size + j % page_size) * hkv * d);
        }
        for g in 0..kv_heads {
            k_offs.clear();
            k_offs.extend(base.iter().map(|o| o + g * d));
            let kv = Kv { k: &kp.data, v: &vp.data, k_offs: &k_offs, v_offs: &k_offs, d, dv: d };
            for hh in g * group..(g + 1) * group {
                for i in 0..t {
                    let keys = visible(causal, window, i, t, len);
                    let at = ((b * heads + hh) * t + i) * d;
                    lse[(b * heads + hh) * t + i] = attend_row(&q.data[at..][..d], sc, &kv, keys, None, &mut acc);
                    data[at..at + d].copy_from_slice(&acc);
                }
            }
        }
    }
    round_all(q.dtype, &mut data);
    let lse = lse_tensor(op, vec![batch, heads, t], lse)?;
    Ok((Tensor::from_parts(q.dtype, q.shape.clone(), data), lse))
}

/// `attention_merge(o_a, lse_a, o_b, lse_b)`: per row (every axis of o but the last), with
/// `M = max(lse_a, lse_b)` (NaN-propagating) and `wₓ = exp(lseₓ − M)`, `o = (w_a·o_a +
/// w_b·o_b)/(w_a + w_b)` rounded once to o's dtype and `lse = M + ln(w_a + w_b)` in f32. A
/// state whose lse is −inf contributes nothing (its o is not read); two empty states give
/// o = 0 and lse = −inf.
pub(super) fn attention_merge(oa: &Tensor, la: &Tensor, ob: &Tensor, lb: &Tensor) -> Result<(Tensor, Tensor)> {
    want(oa.rank() >= 1 && oa.dtype.is_float(), || format!("o_a must be a float tensor [..., D], got {}", tt(oa)))?;
    want(oa.dtype == ob.dtype && oa.shape == ob.shape, || format!("o_a and o_b must have one type, got {} and {}", tt(oa), tt(ob)))?;
    let rows_shape = &oa.shape[..oa.rank() - 1];
    for (l, n) in [(la, "lse_a"), (lb, "lse_b")] {
        want(l.dtype == DType::F32 && l.shape == rows_shape, || format!("{n} must be f32 of o's shape without its last axis, got {} (o is {})", tt(l), tt(oa)))?;
    }
    let d = oa.shape[oa.rank() - 1];
    let rows = la.data.len();
    let mut o = vec![0.0; rows * d];
    let mut lse = vec![0.0; rows];
    for r in 0..rows {
        let (a, b) = (la.data[r], lb.data[r]);
        let m = nan_max(a, b);
        let out = &mut o[r * d..][..d];
        if m == f64::NEG_INFINITY {
            lse[r] = f64::NEG_INFINITY;
            continue;
        }
        let mut sum = 0.0;
        for (l, src) in [(a, row_of(oa, r, d)), (b, row_of(ob, r, d))] {
            if l == f64::NEG_INFINITY {
                continue;
            }
            let w = (l - m).exp();
            sum += w;
            for (x, &y) in out.iter_mut().zip(src) {
                *x += w * y;
            }
        }
        out.iter_mut().for_each(|x| *x /= sum);
        lse[r] = m + sum.ln();
    }
    round_all(oa.dtype, &mut o);
    round_all(DType::F32, &mut lse);
    Ok((Tensor::from_parts(oa.dtype, oa.shape.clone(), o), Tensor::from_parts(DType::F32, la.shape.clone(), lse)))
}

/// Row `r` (of length `d`) of `t`.
fn row_of(t: &Tensor, r: usize, d: usize) -> &[f64] {
    &t.data[r * d..][..d]
}
