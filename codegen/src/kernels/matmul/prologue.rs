//! A row norm in the small-M kernel's prologue ([`Prologue`]): `matmul(rms_norm(x, w), B)`,
//! the A operand computed from the kernel input `x` (`sinter_ir::contract::prologue` says
//! which bodies). Each CTA computes the statistics of its own rows over the whole of K
//! ([`row_scales`]) — summed in the order of the norm's own row-reduction kernel
//! (`kernels::row_order`), so `r = 1/√(Σx²/K + eps)` has the same bits — and its K loop reads
//! A through the element evaluator ([`a_values`]), which rounds `x·r` and then `·w` to the
//! storage dtype as the norm kernel's output pass does. The result is bit-identical to the
//! norm kernel followed by the matmul kernel.
//!
//! Cost: every CTA reads its rows of `x` once more for the statistics (from L2: the rows are
//! a few KiB) and waits for one shared-memory fold; the passes weigh that against the launch
//! it saves (`sinter_passes::cost::norm_prologue_saving`).
//!
//! Design notes: book/src/design/matmul.md

use inkwell::values::{FloatValue, IntValue};
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
    /// The `rms_norm` node, its input `x` and the matmul's A (the norm's result, or casts
    /// of it).
    pub(super) node: Node,
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

impl Prologue {
    /// The prologue of norm `node` of `body` (checked by `sinter_ir::contract::norm_prologue`
    /// and `norm_prologue_body`).
    ///
    /// # Errors
    /// A row the one-read schedule does not cut (longer than the contract allows).
    pub(super) fn new(body: &Function, node: Node, mm: Node, buffers: &[BufInfo]) -> Result<Prologue, String> {
        let nd = &body.nodes[node];
        if nd.op.kind != OpKind::RmsNorm {
            return Err(format!("a `{}` prologue (only `rms_norm` is computed in a prologue)", nd.op.kind.name()));
        }
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
        let order = one_read(&k_dim, min_size, false).ok_or_else(|| format!("a norm prologue over a row of {k}: longer than one read"))?;
        let eps = nd.op.float("eps").unwrap_or(0.0) as f32;
        Ok(Prologue { node, x, a, k, eps, order, body: body.clone() })
    }

    /// The sum of squares of row `m` that thread `v` of the norm kernel's cut holds, reduced
    /// over its warp: its chunks folded in turn, each chunk's squares summed left to right
    /// (a chunk past the row's end read at element 0 and left out), then a butterfly (every
    /// lane ends with the warp's total). `m` and `v` are `i64`.
    fn warp_sum<'ctx>(&self, ev: &mut Eval<'_, 'ctx>, m: IntValue<'ctx>, v: IntValue<'ctx>) -> R<FloatValue<'ctx>> {
        let o = self.order;
        let span = u64::from(o.threads) * u64::from(o.vec);
        let i64t = ev.kb.cx.i64_type();
        let tv = ev.kb.b.build_int_mul(v, i64t.const_int(u64::from(o.vec), false), "tv")?;
        let mut acc = ev.kb.f32c(-0.0);
        for c in 0..u64::from(o.chunks) {
            let j = ev.kb.b.build_int_add(tv, i64t.const_int(c * span, false), "j")?;
            let (base, valid) = if (c + 1) * span <= u64::from(self.k) {
                (j, None)
            } else {
                let ok = ev.kb.b.build_int_compare(IntPredicate::ULT, j, i64t.const_int(u64::from(self.k), false), "in")?;
                (ev.kb.b.build_select(ok, j, i64t.const_zero(), "j")?.into_int_value(), Some(ok))
            };
            let at = At { axes: vec![ev.uniform_ax(m), Ax { base, step: o.vec > 1, aligned: true, zero: false, tag: Tag::Other }], lanes: o.vec };
            let xs = ev.eval(self.x, &at)?;
            let mut part: Option<FloatValue<'ctx>> = None;
            for x in xs {
                let f = x.f()?;
                let sq = ev.kb.fmul(f, f)?;
                part = Some(match part {
                    None => sq,
                    Some(p) => ev.kb.combine_f32(Combine::Sum, p, sq)?,
                });
            }
            let Some(part) = part else { continue };
            let merged = ev.kb.combine_f32(Combine::Sum, acc, part)?;
            acc = match valid {
                Some(ok) => ev.kb.b.build_select(ok, merged, acc, "acc")?.into_float_value(),
                None => merged,
            };
        }
        ev.kb.warp_allreduce_f32(Combine::Sum, acc)
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

/// `r = 1/√(Σx²/K + eps)` of each of the CTA's `rows` rows from `m0` (rows past M take row
/// `m0`'s), computed by the CTA's `threads` threads: the warps take the (row, warp of the
/// norm kernel's cut) pairs in turn, each lane the norm kernel's thread of its lane
/// ([`Prologue::warp_sum`]); the warps' totals go through shared memory and are folded as
/// the norm kernel folds them (lane `l` takes warp `l mod w`'s, butterflies over masks 1, 2,
/// …): every thread gets every row's `r`, with the norm kernel's bits.
pub(super) fn row_scales<'ctx>(kit: &Kit<'ctx>, spec: &Spec, p: &Prologue, m0: IntValue<'ctx>, rows: u32, threads: u32) -> R<Vec<FloatValue<'ctx>>> {
    let nw = p.order.threads / 32;
    let tid = kit.zext64(kit.sreg("tid.x")?)?;
    let (warp, lane) = (kit.udiv(tid, kit.i64c(32))?, kit.urem(tid, kit.i64c(32))?);
    let mdim = kit.dim(&spec.m)?;
    let parts = kit.shared(SharedKind::Static, rows * nw * 4)?;
    let items = kit.i64c(i64::from(rows * nw));
    kit.for_range(warp, items, kit.i64c(i64::from((threads / 32).max(1))), |k, it| {
        let (i, vw) = (k.udiv(it, k.i64c(i64::from(nw)))?, k.urem(it, k.i64c(i64::from(nw)))?);
        let m = k.add(m0, i)?;
        let m = k.select_i(k.icmp(IntPredicate::SLT, m, mdim)?, m, m0)?;
        let v = k.add(k.mul(vw, k.i64c(32))?, lane)?;
        let total = k.with_eval(&p.body, input_bufs(k, spec)?, |ev| p.warp_sum(ev, m, v))?;
        k.sh_store(DType::F32, k.sh_at(parts, k.mul(k.trunc32(it)?, k.i32c(4))?)?, &[total])
    })?;
    kit.barrier()?;
    let slot = if nw > 1 { kit.trunc32(kit.and(lane, kit.i64c(i64::from(nw - 1)))?)? } else { kit.i32c(0) };
    let mut rs = Vec::with_capacity(rows as usize);
    for i in 0..rows {
        let at = kit.mul(kit.add(slot, kit.i32c((i * nw) as i32))?, kit.i32c(4))?;
        let mut total = kit.sh_load(DType::F32, kit.sh_at(parts, at)?, 1)?[0];
        rs.push(kit.math(|kb| {
            let mut off = 1;
            while off < nw {
                let other = kb.shfl_bfly_f32(total, off)?;
                total = kb.combine_f32(Combine::Sum, total, other)?;
                off *= 2;
            }
            // As the norm kernel's `finish_stat`: the mean, eps added in f32, 1/√.
            let ms = kb.fdiv(total, kb.f32c(p.k as f32))?;
            let v = kb.fadd(ms, kb.f32c(p.eps))?;
            let sq = kb.fsqrt(v)?;
            kb.fdiv(kb.f32c(1.0), sq)
        })?);
    }
    Ok(rs)
}

/// A's `c` elements of row `m` from column `kk` (a multiple of `c`; `i64`s): the norm's
/// output there, `round(round(x·r)·w)`, through the element evaluator.
pub(super) fn a_values<'ctx>(kit: &Kit<'ctx>, spec: &Spec, p: &Prologue, m: IntValue<'ctx>, kk: IntValue<'ctx>, c: u32, r: FloatValue<'ctx>) -> R<Vec<FloatValue<'ctx>>> {
    kit.with_eval(&p.body, input_bufs(kit, spec)?, |ev| {
        ev.rows.insert(p.node, RowScalars::RmsNorm { r });
        let at = At { axes: vec![ev.uniform_ax(m), Ax { base: kk, step: c > 1, aligned: true, zero: false, tag: Tag::Other }], lanes: c };
        ev.eval(p.a, &at)?.into_iter().map(|s| s.f()).collect()
    })
}

#[cfg(test)]
mod tests;
