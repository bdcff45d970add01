//! A row norm in the small-M kernel's prologue ([`Prologue`]): `matmul(norm(x, …), B)`,
//! the A operand computed from the kernel input `x` by an `rms_norm` or a `layer_norm`
//! (`sinter_ir::contract::prologue` says which bodies). Each CTA computes the statistics of
//! its own rows over the whole of K ([`row_stats`]) — in the order of the norm's own
//! row-reduction kernel (`kernels::row_order`), so they have the same bits — and its K loop
//! reads A through the element evaluator ([`a_values`]), which rounds as the norm kernel's
//! output pass does. The result is bit-identical to the norm kernel followed by the matmul
//! kernel.
//!
//! - `rms_norm`: each (row, warp of the norm kernel's cut) sums its squares, the warps'
//!   totals are folded through shared memory: `r = 1/√(Σx²/K + eps)`.
//! - `layer_norm`: the one-read schedule's statistics (`reduce/layer_norm.rs`,
//!   `layer_norm_fused`): each warp of the cut its own mean `b_w` and the corrected two-pass
//!   on its values, the warps' `(b_w, dev_w/n_w, M2_w, n_w)` merged through shared memory;
//!   the output centres each element on its warp's `b_w`, so every row keeps a table of each
//!   warp's `(b_w, d_w)` in shared memory, which the K loop reads at each element's warp.
//!
//! Cost: every CTA reads its rows of `x` once more for the statistics (from L2: the rows are
//! a few KiB) and waits for a shared-memory fold; the passes weigh that against the launch
//! it saves (`sinter_passes::cost::norm_prologue_saving`).
//!
//! Design notes: book/src/design/matmul.md

use inkwell::values::{FloatValue, IntValue, PointerValue};
use inkwell::IntPredicate;
use sinter_ir::{DType, Function, Node, OpKind, Value, ValueDef};

use super::spec::Spec;
use crate::isa::kit::{Kit, SharedKind, R};
use crate::isa::Combine;
use crate::kernels::element::{At, Ax, Buf, Eval, RowScalars, Tag};
use crate::kernels::row_order::{one_read, OneRead};
use crate::kernels::view::BufInfo;
use crate::math::Ops;

/// The norm a matmul kernel computes in its prologue.
pub(crate) struct Prologue {
    /// The norm node (`rms_norm` or `layer_norm`), its input `x` and the matmul's A (the
    /// norm's result, or casts of it).
    pub(super) node: Node,
    layer: bool,
    pub(super) x: Value,
    pub(super) a: Value,
    /// The row length (K).
    k: u32,
    /// `eps` as the norm kernel adds it, in f32.
    eps: f32,
    /// How the norm's own kernel would cut a row, hence its summation order.
    order: OneRead,
    /// The kernel body, evaluated with the kernel inputs as its parameters.
    body: Function,
}

/// One row's statistics for the K loop: `r`, and for a `layer_norm` the row's table of each
/// warp's `(b_w, d_w)` (f32 pairs in shared memory, warp `w` at pair `w`).
pub(super) struct RowStats<'ctx> {
    r: FloatValue<'ctx>,
    table: Option<PointerValue<'ctx>>,
}

impl Prologue {
    /// The prologue of norm `node` of `body` read by matmul `mm` (checked by
    /// `sinter_ir::contract::norm_prologue` and `norm_prologue_body`).
    ///
    /// # Errors
    /// A norm other than `rms_norm` and `layer_norm`, or a row the one-read schedule does not
    /// cut (longer than the contract allows).
    pub(super) fn new(body: &Function, node: Node, mm: Node, buffers: &[BufInfo]) -> Result<Prologue, String> {
        let nd = &body.nodes[node];
        let layer = match nd.op.kind {
            OpKind::RmsNorm => false,
            OpKind::LayerNorm => true,
            k => return Err(format!("a `{}` prologue (only `rms_norm` and `layer_norm` are computed in a prologue)", k.name())),
        };
        let (x, a) = (nd.inputs[0], body.nodes[mm].inputs[0]);
        let k_dim = body.ty(a).shape.last().cloned().ok_or("a norm of a scalar")?;
        let k = k_dim.as_const().and_then(|k| u32::try_from(k).ok()).ok_or_else(|| format!("a norm prologue over a row of {k_dim}"))?;
        // The norm kernel's narrowest row-varying element: its output (A) and its inputs of
        // the row's length, as the row reductions' `min_row_elem_size` counts them.
        let mut min_size = body.ty(a).dtype.size_bytes();
        let mut stack = vec![a];
        let mut seen = std::collections::HashSet::new();
        while let Some(v) = stack.pop() {
            if !seen.insert(v) {
                continue;
            }
            match body.values[v].def {
                ValueDef::Param(i) if body.ty(v).shape.last() == Some(&k_dim) => {
                    min_size = min_size.min(buffers.get(i).map_or(4, |b| b.dtype.size_bytes()));
                }
                ValueDef::Param(_) => {}
                ValueDef::Result(n, _) => stack.extend(body.nodes[n].inputs.iter().copied()),
            }
        }
        let order = one_read(&k_dim, min_size, layer).ok_or_else(|| format!("a norm prologue over a row of {k}: longer than one read"))?;
        let eps = nd.op.float("eps").unwrap_or(0.0) as f32;
        Ok(Prologue { node, layer, x, a, k, eps, order, body: body.clone() })
    }

    /// The chunks of row `m` that thread `v` of the norm kernel's cut holds (`i64`s): the
    /// coordinate of each, and whether it lies in the row (a chunk past the row's end is read
    /// at element 0 and left out; `None`: always inside).
    fn chunks<'ctx>(&self, ev: &mut Eval<'_, 'ctx>, m: IntValue<'ctx>, v: IntValue<'ctx>) -> R<Vec<(At<'ctx>, Option<IntValue<'ctx>>)>> {
        let o = self.order;
        let span = u64::from(o.threads) * u64::from(o.vec);
        let i64t = ev.kb.cx.i64_type();
        let tv = ev.kb.b.build_int_mul(v, i64t.const_int(u64::from(o.vec), false), "tv")?;
        let mut out = Vec::with_capacity(o.chunks as usize);
        for c in 0..u64::from(o.chunks) {
            let j = ev.kb.b.build_int_add(tv, i64t.const_int(c * span, false), "j")?;
            let (base, valid) = if (c + 1) * span <= u64::from(self.k) {
                (j, None)
            } else {
                let ok = ev.kb.b.build_int_compare(IntPredicate::ULT, j, i64t.const_int(u64::from(self.k), false), "in")?;
                (ev.kb.b.build_select(ok, j, i64t.const_zero(), "j")?.into_int_value(), Some(ok))
            };
            out.push((At { axes: vec![ev.uniform_ax(m), Ax { base, step: o.vec > 1, aligned: true, zero: false, tag: Tag::Other }], lanes: o.vec }, valid));
        }
        Ok(out)
    }

    /// The thread's chunks folded as the norm kernel folds a sum statistic: each chunk's
    /// values (`f` of each element) summed left to right, the sum added to the running value
    /// (from −0) where the chunk is inside the row; then a butterfly over the warp.
    fn warp_fold<'ctx>(ev: &mut Eval<'_, 'ctx>, x: Value, chunks: &[(At<'ctx>, Option<IntValue<'ctx>>)], square: bool) -> R<FloatValue<'ctx>> {
        let mut acc = ev.kb.f32c(-0.0);
        for (at, valid) in chunks {
            let mut part: Option<FloatValue<'ctx>> = None;
            for e in ev.eval(x, at)? {
                let f = e.f()?;
                let f = if square { ev.kb.fmul(f, f)? } else { f };
                part = Some(match part {
                    None => f,
                    Some(p) => ev.kb.combine_f32(Combine::Sum, p, f)?,
                });
            }
            let Some(part) = part else { continue };
            let merged = ev.kb.combine_f32(Combine::Sum, acc, part)?;
            acc = match valid {
                Some(ok) => ev.kb.b.build_select(*ok, merged, acc, "acc")?.into_float_value(),
                None => merged,
            };
        }
        ev.kb.warp_allreduce_f32(Combine::Sum, acc)
    }

    /// A `layer_norm`'s statistics of warp `w` of the cut (`i64`) over its elements of row
    /// `m`, as `layer_norm_fused` computes them: `b_w = Σx/n_w`, then `dev_w = Σ(x − b_w)`
    /// and `q_w = Σ(x − b_w)²` (one `fma` an element). Returns what the warp stores for the
    /// merge: `(b_w, dev_w/n_w, q_w − dev_w·(dev_w/n_w), n_w)` with several warps a row, or
    /// `(b_w, dev_w, q_w, 0)` with one.
    fn layer_warp<'ctx>(&self, ev: &mut Eval<'_, 'ctx>, chunks: &[(At<'ctx>, Option<IntValue<'ctx>>)], w: IntValue<'ctx>) -> R<[FloatValue<'ctx>; 4]> {
        let o = self.order;
        let i64t = ev.kb.cx.i64_type();
        // The warp's valid elements: Σ over chunks of clamp(K − c·threads·vec − w·32·vec, 0, 32·vec).
        let (tvs, wspan) = (i64::from(o.threads) * i64::from(o.vec), 32 * i64::from(o.vec));
        let ws = ev.kb.b.build_int_mul(w, i64t.const_int(wspan as u64, false), "ws")?;
        let mut count = i64t.const_zero();
        for c in 0..i64::from(o.chunks) {
            let left = ev.kb.b.build_int_sub(i64t.const_int((i64::from(self.k) - c * tvs) as u64, true), ws, "left")?;
            let lo = ev.kb.intrinsic_value("llvm.smax", &[i64t.into()], &[left.into(), i64t.const_zero().into()])?.into_int_value();
            let hi = ev.kb.intrinsic_value("llvm.smin", &[i64t.into()], &[lo.into(), i64t.const_int(wspan as u64, false).into()])?.into_int_value();
            count = ev.kb.b.build_int_add(count, hi, "count")?;
        }
        let f32t = ev.kb.cx.f32_type();
        let n_count = ev.kb.b.build_signed_int_to_float(count, f32t, "nc")?;
        let one = ev.kb.b.build_int_compare(IntPredicate::SLT, count, i64t.const_int(1, false), "empty")?;
        let n_own = ev.kb.fsel(one, ev.kb.f32c(1.0), n_count)?;
        let sum_w = Self::warp_fold(ev, self.x, chunks, false)?;
        let b_w = ev.kb.fdiv(sum_w, n_own)?;
        let (mut dev_t, mut q_t) = (ev.kb.f32c(-0.0), ev.kb.f32c(-0.0));
        for (at, valid) in chunks {
            let (mut dv, mut q) = (dev_t, q_t);
            for e in ev.eval(self.x, at)? {
                let c = ev.kb.fsub(e.f()?, b_w)?;
                dv = ev.kb.fadd(dv, c)?;
                q = ev.kb.ffma(c, c, q)?;
            }
            (dev_t, q_t) = match valid {
                Some(ok) => (ev.kb.fsel(*ok, dv, dev_t)?, ev.kb.fsel(*ok, q, q_t)?),
                None => (dv, q),
            };
        }
        let dev_w = ev.kb.warp_allreduce_f32(Combine::Sum, dev_t)?;
        let q_w = ev.kb.warp_allreduce_f32(Combine::Sum, q_t)?;
        if o.threads <= 32 {
            return Ok([b_w, dev_w, q_w, ev.kb.f32c(0.0)]);
        }
        let mw = ev.kb.fdiv(dev_w, n_own)?;
        let ndv = ev.kb.fneg(dev_w)?;
        Ok([b_w, mw, ev.kb.ffma(ndv, mw, q_w)?, n_count])
    }
}

/// The kernel inputs as the element evaluator reads them (the body's parameters).
fn input_bufs<'ctx>(kit: &Kit<'ctx>, spec: &Spec) -> R<Vec<Buf<'ctx>>> {
    (0..spec.n_inputs)
        .map(|i| {
            let info = &spec.buffers[i];
            Ok(Buf { ptr: kit.buf(i)?, dtype: info.dtype, strides: info.strides.clone(), align: info.align })
        })
        .collect()
}

/// The statistics of each of the CTA's `rows` rows from `m0` (rows past M take row `m0`'s),
/// computed by the CTA's `threads` threads: the warps take the (row, warp of the norm
/// kernel's cut) pairs in turn, each lane the norm kernel's thread of its lane; the warps'
/// partials go through shared memory and are merged as the norm kernel merges them (lane `l`
/// takes warp `l mod w`'s, butterflies over masks 1, 2, …): every thread gets every row's
/// statistics with the norm kernel's bits.
pub(super) fn row_stats<'ctx>(kit: &Kit<'ctx>, spec: &Spec, p: &Prologue, m0: IntValue<'ctx>, rows: u32, threads: u32) -> R<Vec<RowStats<'ctx>>> {
    let nw = p.order.threads / 32;
    let per = if p.layer { 4 } else { 1 };
    let tid = kit.zext64(kit.sreg("tid.x")?)?;
    let (warp, lane) = (kit.udiv(tid, kit.i64c(32))?, kit.urem(tid, kit.i64c(32))?);
    let mdim = kit.dim(&spec.m)?;
    let parts = kit.shared(SharedKind::Static, rows * nw * per * 4)?;
    let items = kit.i64c(i64::from(rows * nw));
    kit.for_range(warp, items, kit.i64c(i64::from((threads / 32).max(1))), |k, it| {
        let (i, vw) = (k.udiv(it, k.i64c(i64::from(nw)))?, k.urem(it, k.i64c(i64::from(nw)))?);
        let m = k.add(m0, i)?;
        let m = k.select_i(k.icmp(IntPredicate::SLT, m, mdim)?, m, m0)?;
        let v = k.add(k.mul(vw, k.i64c(32))?, lane)?;
        let vals = k.with_eval(&p.body, input_bufs(k, spec)?, |ev| {
            let chunks = p.chunks(ev, m, v)?;
            if p.layer {
                Ok(p.layer_warp(ev, &chunks, vw)?.to_vec())
            } else {
                Ok(vec![Prologue::warp_fold(ev, p.x, &chunks, true)?])
            }
        })?;
        k.sh_store(DType::F32, k.sh_at(parts, k.mul(k.trunc32(it)?, k.i32c(4 * per as i32))?)?, &vals)
    })?;
    kit.barrier()?;
    let table = if p.layer { Some(kit.shared(SharedKind::Static, rows * nw * 8)?) } else { None };
    let slot = if nw > 1 { kit.trunc32(kit.and(lane, kit.i64c(i64::from(nw - 1)))?)? } else { kit.i32c(0) };
    let writer = kit.and(kit.icmp(IntPredicate::EQ, warp, kit.i64c(0))?, kit.icmp(IntPredicate::ULT, lane, kit.i64c(i64::from(nw)))?)?;
    let mut out = Vec::with_capacity(rows as usize);
    for i in 0..rows {
        let row = (i * nw) as i32;
        let at = |w: IntValue<'ctx>| kit.sh_at(parts, kit.mul(kit.add(w, kit.i32c(row))?, kit.i32c(4 * per as i32))?);
        let mine = kit.sh_load(DType::F32, at(slot)?, per)?;
        let first = kit.sh_load(DType::F32, at(kit.i32c(0))?, 1)?[0];
        let (eps, kf) = (p.eps, p.k as f32);
        // As the norm kernel's `finish_stat` (rms_norm) and `layer_norm_fused`.
        let (r, entry) = kit.math(|kb| {
            let nf = kb.f32c(kf);
            let fold = |kb: &mut crate::isa::KernelBuilder<'ctx>, mut v: FloatValue<'ctx>| -> R<FloatValue<'ctx>> {
                let mut off = 1;
                while off < nw {
                    let other = kb.shfl_bfly_f32(v, off)?;
                    v = kb.combine_f32(Combine::Sum, v, other)?;
                    off *= 2;
                }
                Ok(v)
            };
            let rsqrt = |kb: &mut crate::isa::KernelBuilder<'ctx>, v: FloatValue<'ctx>| -> R<FloatValue<'ctx>> {
                let v = kb.fadd(v, kb.f32c(eps))?;
                let sq = kb.fsqrt(v)?;
                kb.fdiv(kb.f32c(1.0), sq)
            };
            if !p.layer {
                let total = fold(kb, mine[0])?;
                let ms = kb.fdiv(total, nf)?;
                return Ok((rsqrt(kb, ms)?, None));
            }
            let (b, d, m2) = if nw <= 1 {
                let d = kb.fdiv(mine[1], nf)?;
                let m2 = kb.fdiv(mine[2], nf)?;
                let nd = kb.fneg(d)?;
                (mine[0], d, kb.ffma(nd, d, m2)?)
            } else {
                let off = kb.fsub(mine[0], first)?;
                let delta = kb.fadd(off, mine[1])?;
                let cd = kb.fmul(mine[3], delta)?;
                let cd2 = kb.fmul(cd, delta)?;
                let m2k = kb.fadd(mine[2], cd2)?;
                let (sd, m2) = (fold(kb, cd)?, fold(kb, m2k)?);
                let d = kb.fdiv(sd, nf)?;
                let nd = kb.fneg(d)?;
                let m2 = kb.fdiv(m2, nf)?;
                let m2 = kb.ffma(nd, d, m2)?;
                // Warp `slot`'s shift of the mean: d − (b_w − b_0).
                let own = kb.fsub(mine[0], first)?;
                (mine[0], kb.fsub(d, own)?, m2)
            };
            let var = kb.combine_f32(Combine::Max, m2, kb.f32c(0.0))?;
            Ok((rsqrt(kb, var)?, Some((b, d))))
        })?;
        if let (Some(t), Some((b, d))) = (table, entry) {
            kit.if_then(writer, |k| k.sh_store(DType::F32, k.sh_at(t, k.mul(k.add(slot, k.i32c(row))?, k.i32c(8))?)?, &[b, d]))?;
        }
        out.push(RowStats { r, table: table.map(|t| (t, row)).map(|(t, row)| kit.sh_at(t, kit.i32c(row * 8))).transpose()? });
    }
    if table.is_some() {
        kit.barrier()?;
    }
    Ok(out)
}

/// A's `c` elements of row `m` from column `kk` (a multiple of `c`; `i64`s) with the row's
/// statistics `st`: the norm's output there (`round(round(x·r)·w)`, or a `layer_norm`'s
/// `round(round((x − b_w)·r − d_w·r)·w + b)` with the `(b_w, d_w)` of the warp of the cut
/// that holds column `kk`), through the element evaluator.
pub(super) fn a_values<'ctx>(kit: &Kit<'ctx>, spec: &Spec, p: &Prologue, m: IntValue<'ctx>, kk: IntValue<'ctx>, c: u32, st: &RowStats<'ctx>) -> R<Vec<FloatValue<'ctx>>> {
    let scalars = match st.table {
        Some(t) => {
            // Column kk's vector of the cut, its thread and warp (`c` divides the cut's vector).
            let o = p.order;
            let g = kit.udiv(kk, kit.i64c(i64::from(o.vec)))?;
            let w = kit.udiv(kit.urem(g, kit.i64c(i64::from(o.threads)))?, kit.i64c(32))?;
            let bd = kit.sh_load(DType::F32, kit.sh_at(t, kit.mul(kit.trunc32(w)?, kit.i32c(8))?)?, 2)?;
            RowScalars::LayerNorm { mean: bd[0], d: bd[1], r: st.r }
        }
        None => RowScalars::RmsNorm { r: st.r },
    };
    kit.with_eval(&p.body, input_bufs(kit, spec)?, |ev| {
        ev.rows.insert(p.node, scalars);
        let at = At { axes: vec![ev.uniform_ax(m), Ax { base: kk, step: c > 1, aligned: true, zero: false, tag: Tag::Other }], lanes: c };
        ev.eval(p.a, &at)?.into_iter().map(|s| s.f()).collect()
    })
}

#[cfg(test)]
mod tests;
