//! Statistic arithmetic of the row reductions: identities, a chunk's elements folded into a
//! thread's running values (the online softmax's rescaled sum included), the folds of the
//! partials over a warp (butterfly shuffles) and over a CTA's warps (shared memory, then
//! [`Emitter::fold_lanes`]), and the row scalars a node's outputs read ([`RowScalars`]).
//!
//! Every merge is symmetric in its two operands, so a butterfly leaves every lane (and, in
//! the cluster schedule, every CTA) with the same bits.
//!
//! Design notes: book/src/design/reductions.md

use inkwell::types::BasicTypeEnum;
use inkwell::values::{FloatValue, IntValue, PointerValue};
use sinter_ir::{DType, OpKind};

use super::analysis::{Stat, StatKind};
use super::emit::{Acc, Chunk, Emitter, Pending};
use crate::isa::Combine;
use crate::kernels::element::{exp_shifted_ftz, At, Eval, RowScalars, Scalar};
use crate::math::{self, Ops, R};
use crate::error::CodegenError;

impl<'p, 'ctx> Emitter<'p, 'ctx> {
    fn identity(&self, ev: &Eval<'_, 'ctx>, st: &Stat) -> Acc<'ctx> {
        let c = st.combine();
        if st.int {
            // The dtype's extremes, so that an empty row rounds as the interpreter's ±inf does.
            let dt = ev.f.ty(ev.f.nodes[st.node].inputs[0]).dtype;
            let (min, max) = if dt == DType::I32 { (i64::from(i32::MIN), i64::from(i32::MAX)) } else { (i64::MIN, i64::MAX) };
            Acc::I(ev.kb.i64c(match c {
                Combine::Sum => 0,
                Combine::Max => min,
                Combine::Min => max,
            }))
        } else {
            // −0 is the identity of IEEE addition (x + −0 = x, folded away); `finish_stat`
            // adds +0 once, so an empty row sums to +0 as the interpreter's does.
            Acc::F(ev.kb.f32c(match c {
                Combine::Sum => -0.0,
                Combine::Max => f32::NEG_INFINITY,
                Combine::Min => f32::INFINITY,
            }))
        }
    }

    pub(super) fn identities(&self, ev: &Eval<'_, 'ctx>, stats: &[Stat]) -> Vec<Acc<'ctx>> {
        let mut out = Vec::with_capacity(stats.len());
        for st in stats {
            if st.kind == StatKind::SoftmaxOnline {
                out.push(Acc::F(ev.kb.f32c(f32::NEG_INFINITY)));
                out.push(Acc::F(ev.kb.f32c(0.0)));
            } else {
                out.push(self.identity(ev, st));
            }
        }
        out
    }

    /// Merges two online-softmax partials `(m_a, s_a)`, `(m_b, s_b)`: `m = max(m_a, m_b)`
    /// (NaN-propagating), `s = s_a·e^(m_a − m') + s_b·e^(m_b − m')` with `m'` = `m`, or 0 where
    /// `m` is −inf (so that an all −inf part contributes 0, not NaN).
    ///
    /// Symmetric: `s_a·e_a + s_b·e_b` as two products and a sum (not an `fma`), so merging `b`
    /// into `a` gives the same bits as `a` into `b` and a butterfly leaves every lane with the
    /// same total (see [`Emitter::fold_lanes`]).
    fn online_merge(&self, ev: &mut Eval<'_, 'ctx>, ma: FloatValue<'ctx>, sa: FloatValue<'ctx>, mb: FloatValue<'ctx>, sb: FloatValue<'ctx>) -> R<(FloatValue<'ctx>, FloatValue<'ctx>)> {
        let m = ev.kb.combine_f32(Combine::Max, ma, mb)?;
        let ninf = ev.kb.f32c(f32::NEG_INFINITY);
        let all = ev.kb.feq(m, ninf)?;
        let zero = ev.kb.f32c(0.0);
        let ms = ev.kb.fsel(all, zero, m)?;
        let ea = exp_shifted_ftz(ev.kb, ma, ms)?;
        let eb = exp_shifted_ftz(ev.kb, mb, ms)?;
        let ta = ev.kb.fmul(sa, ea)?;
        let tb = ev.kb.fmul(sb, eb)?;
        Ok((m, ev.kb.fadd(ta, tb)?))
    }

    /// [`Emitter::online_merge`] over accumulator tuples (`(m, s)` pairs in order).
    fn online_merge_all(&self, ev: &mut Eval<'_, 'ctx>, a: &[Acc<'ctx>], b: &[Acc<'ctx>]) -> R<Vec<Acc<'ctx>>> {
        let mut out = Vec::with_capacity(a.len());
        for (x, y) in a.chunks(2).zip(b.chunks(2)) {
            let (Some(Acc::F(ma)), Some(Acc::F(sa)), Some(Acc::F(mb)), Some(Acc::F(sb))) = (x.first(), x.get(1), y.first(), y.get(1)) else {
                return Err(CodegenError::Builder("online softmax accumulators".into()));
            };
            let (m, s) = self.online_merge(ev, *ma, *sa, *mb, *sb)?;
            out.push(Acc::F(m));
            out.push(Acc::F(s));
        }
        Ok(out)
    }

    /// The fold of `n` tuples over a warp: lane `l` loads tuple `k = l mod P` (`P` = `n`
    /// rounded up to a power of two; `load(k)`, `identity` for `k ≥ n`), and `log₂ P`
    /// butterfly shuffles merge them. With a symmetric `merge` every lane of every warp ends
    /// with the same bits, for one load and `log₂ P` merges, where a sequential fold costs `n`.
    #[allow(clippy::type_complexity)]
    pub(super) fn fold_lanes(
        &self,
        ev: &mut Eval<'_, 'ctx>,
        n: u32,
        lane: IntValue<'ctx>,
        load: &dyn Fn(&mut Eval<'_, 'ctx>, IntValue<'ctx>) -> R<Vec<Acc<'ctx>>>,
        identity: Vec<Acc<'ctx>>,
        merge: &dyn Fn(&Self, &mut Eval<'_, 'ctx>, &[Acc<'ctx>], &[Acc<'ctx>]) -> R<Vec<Acc<'ctx>>>,
    ) -> R<Vec<Acc<'ctx>>> {
        let p = n.max(1).next_power_of_two();
        let k = ev.kb.b.build_and(lane, ev.ic(i64::from(p - 1)), "k")?;
        let mut vals = if p == n {
            load(ev, k)?
        } else {
            let last = ev.ic(i64::from(n.max(1) - 1));
            let kk = ev.kb.intrinsic_value("llvm.umin", &[ev.ity().into()], &[k.into(), last.into()])?.into_int_value();
            let v = load(ev, kk)?;
            let ok = ev.ilt(k, ev.ic(i64::from(n)))?;
            let mut out = Vec::with_capacity(v.len());
            for (x, id) in v.into_iter().zip(identity) {
                out.push(self.select(ev, ok, x, id)?);
            }
            out
        };
        let mut off = 1;
        while off < p {
            let mut other = Vec::with_capacity(vals.len());
            for v in &vals {
                other.push(match v {
                    Acc::F(f) => Acc::F(ev.kb.shfl_bfly_f32(*f, off)?),
                    Acc::I(i) => Acc::I(ev.kb.shfl_bfly_i64(*i, off)?),
                });
            }
            vals = merge(self, ev, &vals, &other)?;
            off *= 2;
        }
        Ok(vals)
    }

    /// Combines tuples of statistics `stats` element-wise ([`Combine`], symmetric).
    pub(super) fn combine_all(&self, ev: &mut Eval<'_, 'ctx>, stats: &[Stat], a: &[Acc<'ctx>], b: &[Acc<'ctx>]) -> R<Vec<Acc<'ctx>>> {
        stats.iter().zip(a.iter().zip(b)).map(|(st, (x, y))| self.combine(ev, st.combine(), *x, *y)).collect()
    }

    /// The online softmax's row statistics from the threads' `(m, s)`: warp shuffles, then
    /// (CTA mode) shared memory folded lane-parallel ([`Emitter::fold_lanes`]), then (the
    /// cluster schedule) the cluster's CTAs' ([`Emitter::cluster_fold_with`]); every merge is
    /// symmetric, so every thread ends with the same bits.
    pub(super) fn softmax_online_finish(&self, ev: &mut Eval<'_, 'ctx>, st: &Stat, m: FloatValue<'ctx>, s: FloatValue<'ctx>, warp: IntValue<'ctx>, t: IntValue<'ctx>) -> R<()> {
        let (mut m, mut s) = (m, s);
        for off in [16, 8, 4, 2, 1] {
            let mo = ev.kb.shfl_bfly_f32(m, off)?;
            let so = ev.kb.shfl_bfly_f32(s, off)?;
            (m, s) = self.online_merge(ev, m, s, mo, so)?;
        }
        let nw = self.sched.threads_per_row / 32;
        let lane = ev.kb.b.build_and(t, ev.ic(31), "lane")?;
        let identity = vec![Acc::F(ev.kb.f32c(f32::NEG_INFINITY)), Acc::F(ev.kb.f32c(0.0))];
        if nw > 1 {
            let f32t = ev.kb.cx.f32_type();
            let arr = self.smem_array(ev, f32t.into(), 4, 2 * nw, &format!("sm_{}", st.node.as_u32()))?;
            let i0 = ev.imul(warp, ev.ic(2))?;
            let p = ev.kb.gep(f32t.into(), arr, i0)?;
            ev.kb.store(p, m.into(), 4)?;
            let i1 = ev.iadd(i0, ev.ic(1))?;
            let p = ev.kb.gep(f32t.into(), arr, i1)?;
            ev.kb.store(p, s.into(), 4)?;
            ev.kb.barrier()?;
            let load = |ev: &mut Eval<'_, 'ctx>, k: IntValue<'ctx>| -> R<Vec<Acc<'ctx>>> {
                let i0 = ev.imul(k, ev.ic(2))?;
                let p = ev.kb.gep(f32t.into(), arr, i0)?;
                let mw = ev.kb.load(f32t.into(), p, 4)?.into_float_value();
                let i1 = ev.iadd(i0, ev.ic(1))?;
                let p = ev.kb.gep(f32t.into(), arr, i1)?;
                let sw = ev.kb.load(f32t.into(), p, 4)?.into_float_value();
                Ok(vec![Acc::F(mw), Acc::F(sw)])
            };
            let v = self.fold_lanes(ev, nw, lane, &load, identity.clone(), &|e, ev, a, b| e.online_merge_all(ev, a, b))?;
            let (Some(Acc::F(mm)), Some(Acc::F(ss))) = (v.first().copied(), v.get(1).copied()) else {
                return Err(CodegenError::Builder("online softmax accumulators".into()));
            };
            (m, s) = (mm, ss);
        }
        if self.split.is_some() {
            // The cluster's CTAs' (m, s).
            let v = self.cluster_fold_with(ev, &[Acc::F(m), Acc::F(s)], t, identity, &|e, ev, a, b| e.online_merge_all(ev, a, b))?;
            let (Some(Acc::F(mm)), Some(Acc::F(ss))) = (v.first().copied(), v.get(1).copied()) else {
                return Err(CodegenError::Builder("cluster softmax slots".into()));
            };
            (m, s) = (mm, ss);
        }
        let ninf = ev.kb.f32c(f32::NEG_INFINITY);
        let all = ev.kb.feq(m, ninf)?;
        let zero = ev.kb.f32c(0.0);
        let m_safe = ev.kb.fsel(all, zero, m)?;
        let one = ev.kb.f32c(1.0);
        let inv_s = ev.kb.fdiv(one, s)?;
        let log_s = math::log(ev.kb, s)?;
        ev.rows.insert(st.node, RowScalars::Softmax { m_safe, m, inv_s, log_s, all_neg_inf: all });
        Ok(())
    }

    /// The element values a statistic reduces, at a chunk.
    fn elements(&self, ev: &mut Eval<'_, 'ctx>, st: &Stat, at: &At<'ctx>) -> R<Vec<Acc<'ctx>>> {
        let x = ev.f.nodes[st.node].inputs[0];
        let i64t = ev.kb.cx.i64_type();
        let vals: Vec<Scalar<'ctx>> = match st.kind {
            StatKind::Reduce(_) | StatKind::SoftmaxMax | StatKind::SoftmaxOnline | StatKind::LnSum | StatKind::LnFused => ev.eval(x, at)?,
            StatKind::SoftmaxSum => {
                let Some(RowScalars::SoftmaxMax { m_safe }) = ev.rows.get(&st.node).copied() else {
                    return Err(CodegenError::Builder("softmax sum before its max".into()));
                };
                ev.softmax_exp(st.node, m_safe, at)?
            }
            StatKind::SumSquares => {
                let xs = ev.eval(x, at)?;
                let mut out = Vec::with_capacity(xs.len());
                for v in xs {
                    let f = v.f()?;
                    out.push(Scalar::F(ev.kb.fmul(f, f)?));
                }
                out
            }
            StatKind::LnDev | StatKind::LnVar => {
                let Some(RowScalars::LayerNormMean { mean }) = ev.rows.get(&st.node).copied() else {
                    return Err(CodegenError::Builder("layer_norm variance before its mean".into()));
                };
                let cs = ev.centered(st.node, mean, at)?;
                if st.kind == StatKind::LnDev {
                    cs
                } else {
                    let mut out = Vec::with_capacity(cs.len());
                    for v in cs {
                        let f = v.f()?;
                        out.push(Scalar::F(ev.kb.fmul(f, f)?));
                    }
                    out
                }
            }
        };
        vals.into_iter()
            .map(|v| {
                Ok(if st.int {
                    let i = v.i()?;
                    Acc::I(if i.get_type() == i64t { i } else { ev.kb.b.build_int_s_extend(i, i64t, "x")? })
                } else {
                    Acc::F(v.f()?)
                })
            })
            .collect()
    }

    fn combine(&self, ev: &Eval<'_, 'ctx>, op: Combine, a: Acc<'ctx>, b: Acc<'ctx>) -> R<Acc<'ctx>> {
        Ok(match (a, b) {
            (Acc::F(a), Acc::F(b)) => Acc::F(ev.kb.combine_f32(op, a, b)?),
            (Acc::I(a), Acc::I(b)) => Acc::I(ev.kb.combine_int(op, a, b)?),
            _ => return Err(CodegenError::Builder("mixed accumulators".into())),
        })
    }

    fn select(&self, ev: &Eval<'_, 'ctx>, c: IntValue<'ctx>, a: Acc<'ctx>, b: Acc<'ctx>) -> R<Acc<'ctx>> {
        Ok(match (a, b) {
            (Acc::F(a), Acc::F(b)) => Acc::F(ev.kb.b.build_select(c, a, b, "acc")?.into_float_value()),
            (Acc::I(a), Acc::I(b)) => Acc::I(ev.kb.b.build_select(c, a, b, "acc")?.into_int_value()),
            _ => return Err(CodegenError::Builder("mixed accumulators".into())),
        })
    }

    /// Folds one chunk's elements into the running values (unchanged where the chunk is
    /// outside the row).
    pub(super) fn accumulate(&self, ev: &mut Eval<'_, 'ctx>, stats: &[Stat], ch: &Chunk<'ctx>, acc: Vec<Acc<'ctx>>) -> R<Vec<Acc<'ctx>>> {
        if stats.iter().any(|st| st.kind == StatKind::SoftmaxOnline) {
            return self.accumulate_online(ev, stats, ch, acc);
        }
        let mut out = Vec::with_capacity(stats.len());
        for (st, a) in stats.iter().zip(acc) {
            let els = self.elements(ev, st, &ch.at)?;
            let mut part = els[0];
            for e in &els[1..] {
                part = self.combine(ev, st.combine(), part, *e)?;
            }
            let merged = self.combine(ev, st.combine(), a, part)?;
            out.push(match ch.valid {
                Some(v) => self.select(ev, v, merged, a)?,
                None => merged,
            });
        }
        Ok(out)
    }

    /// [`Self::accumulate`] for online-softmax statistics (two accumulators each): the
    /// chunk's max `c`, `m' = max(m, c)`, `s' = s·e^(m − m'_safe) + Σ e^(x − m'_safe)`.
    fn accumulate_online(&self, ev: &mut Eval<'_, 'ctx>, stats: &[Stat], ch: &Chunk<'ctx>, acc: Vec<Acc<'ctx>>) -> R<Vec<Acc<'ctx>>> {
        let mut out = Vec::with_capacity(acc.len());
        let mut i = 0;
        for st in stats {
            if st.kind != StatKind::SoftmaxOnline {
                return Err(CodegenError::Builder("online softmax mixed with other statistics in one pass".into()));
            }
            let (Some(Acc::F(m)), Some(Acc::F(s))) = (acc.get(i).copied(), acc.get(i + 1).copied()) else {
                return Err(CodegenError::Builder("online softmax accumulators".into()));
            };
            i += 2;
            let x = ev.f.nodes[st.node].inputs[0];
            let xs = ev.eval(x, &ch.at)?;
            let mut cm = m;
            for v in &xs {
                cm = ev.kb.combine_f32(Combine::Max, cm, v.f()?)?;
            }
            let ninf = ev.kb.f32c(f32::NEG_INFINITY);
            let all = ev.kb.feq(cm, ninf)?;
            let zero = ev.kb.f32c(0.0);
            let ms = ev.kb.fsel(all, zero, cm)?;
            let scale = exp_shifted_ftz(ev.kb, m, ms)?;
            let mut part = ev.kb.f32c(-0.0);
            for v in &xs {
                let e = exp_shifted_ftz(ev.kb, v.f()?, ms)?;
                part = ev.kb.fadd(part, e)?;
            }
            let ns = ev.kb.ffma(s, scale, part)?;
            match ch.valid {
                Some(v) => {
                    out.push(Acc::F(ev.kb.fsel(v, cm, m)?));
                    out.push(Acc::F(ev.kb.fsel(v, ns, s)?));
                }
                None => {
                    out.push(Acc::F(cm));
                    out.push(Acc::F(ns));
                }
            }
        }
        Ok(out)
    }

    /// Combines the per-thread partials of the row group: warp shuffles, then (CTA mode)
    /// shared memory across warps.
    ///
    /// In the cluster schedule a `layer_norm`'s statistics stop at the warp (see
    /// [`Emitter::warp_only`]): they are returned as warp totals.
    pub(super) fn combine_group(&self, ev: &mut Eval<'_, 'ctx>, stats: &[Stat], partials: Vec<Acc<'ctx>>, level: usize, warp: IntValue<'ctx>, lane: IntValue<'ctx>) -> R<Vec<Acc<'ctx>>> {
        let mut warped = Vec::with_capacity(partials.len());
        for (st, p) in stats.iter().zip(partials) {
            warped.push(match p {
                Acc::F(f) => Acc::F(ev.kb.warp_allreduce_f32(st.combine(), f)?),
                Acc::I(i) => Acc::I(ev.kb.warp_allreduce_i64(st.combine(), i)?),
            });
        }
        let nw = self.sched.threads_per_row / 32;
        if nw <= 1 {
            return Ok(warped);
        }
        // Every lane of a warp holds the warp's total: all of them store it (same value, same
        // address), a barrier, then every thread folds the warps' totals in order.
        let across: Vec<usize> = (0..stats.len()).filter(|&i| !self.warp_only(&stats[i])).collect();
        if across.is_empty() {
            return Ok(warped);
        }
        let f32t = ev.kb.cx.f32_type();
        let i64t = ev.kb.cx.i64_type();
        let nf = across.iter().filter(|&&i| !stats[i].int).count() as u32;
        let ni = across.iter().filter(|&&i| stats[i].int).count() as u32;
        let fsm = if nf > 0 { Some(self.smem_array(ev, f32t.into(), 4, nf * nw, &format!("red_f{level}"))?) } else { None };
        let ism = if ni > 0 { Some(self.smem_array(ev, i64t.into(), 8, ni * nw, &format!("red_i{level}"))?) } else { None };
        let (mut fi, mut ii) = (0u32, 0u32);
        let mut slots = Vec::with_capacity(across.len());
        for &i in &across {
            let (st, w) = (&stats[i], &warped[i]);
            let (arr, slot, ty): (_, u32, inkwell::types::BasicTypeEnum<'ctx>) = if st.int {
                ii += 1;
                (ism, ii - 1, i64t.into())
            } else {
                fi += 1;
                (fsm, fi - 1, f32t.into())
            };
            let arr = arr.ok_or_else(|| CodegenError::Builder("no shared array".into()))?;
            let idx = ev.iadd(ev.ic(i64::from(slot * nw)), warp)?;
            let p = ev.kb.gep(ty, arr, idx)?;
            let v = match w {
                Acc::F(f) => (*f).into(),
                Acc::I(i) => (*i).into(),
            };
            ev.kb.store(p, v, if st.int { 8 } else { 4 })?;
            slots.push((arr, slot, ty));
        }
        ev.kb.barrier()?;
        let mut out = warped;
        for (&i, (arr, slot, ty)) in across.iter().zip(slots) {
            out[i] = self.fold_warps(ev, arr, ty, slot * nw, lane, stats[i].combine())?;
        }
        Ok(out)
    }

    /// The fold of the `nw` warp partials at `arr[base..base + nw]` (shared memory, after a
    /// barrier): lane `l` loads partial `l mod nw` and `log₂ nw` butterfly shuffles combine
    /// them, so every lane of every warp ends with the same bits (the combines are
    /// commutative) for one load and `2·log₂ nw` instructions, where a sequential fold costs
    /// `2·nw`.
    fn fold_warps(&self, ev: &mut Eval<'_, 'ctx>, arr: PointerValue<'ctx>, ty: BasicTypeEnum<'ctx>, base: u32, lane: IntValue<'ctx>, op: Combine) -> R<Acc<'ctx>> {
        let nw = self.sched.threads_per_row / 32;
        let int = ty.is_int_type();
        let load = |ev: &mut Eval<'_, 'ctx>, k: IntValue<'ctx>| -> R<Vec<Acc<'ctx>>> {
            let idx = ev.iadd(k, ev.ic(i64::from(base)))?;
            let p = ev.kb.gep(ty, arr, idx)?;
            let v = ev.kb.load(ty, p, if int { 8 } else { 4 })?;
            Ok(vec![if int { Acc::I(v.into_int_value()) } else { Acc::F(v.into_float_value()) }])
        };
        let v = self.fold_lanes(ev, nw, lane, &load, Vec::new(), &|e, ev, a, b| Ok(vec![e.combine(ev, op, a[0], b[0])?]))?;
        v.into_iter().next().ok_or_else(|| CodegenError::Builder("no warp fold".into()))
    }

    /// Turns a statistic's total into the row scalars its node's outputs read.
    pub(super) fn finish_stat(&self, ev: &mut Eval<'_, 'ctx>, st: &Stat, total: Acc<'ctx>, nv: IntValue<'ctx>, pending: &mut Pending<'ctx>) -> R<()> {
        let Pending { softmax: pending, ln: pending_d } = pending;
        let nd = &ev.f.nodes[st.node];
        let kind = nd.op.kind;
        let result = nd.results[0];
        let dt = ev.f.ty(result).dtype;
        let eps = nd.op.float("eps").map(|e| e as f32);
        let f32t = ev.kb.cx.f32_type();
        let nf = ev.kb.b.build_unsigned_int_to_float(nv, f32t, "n")?;
        let scalars = match (st.kind, total) {
            (StatKind::Reduce(_), Acc::I(v)) => {
                // Saturate to the dtype.
                let r = if dt == DType::I32 {
                    let i64t = ev.kb.cx.i64_type();
                    let hi = i64t.const_int(i32::MAX as u64, true);
                    let lo = i64t.const_int(i32::MIN as i64 as u64, true);
                    let v = ev.kb.intrinsic_value("llvm.smin", &[i64t.into()], &[v.into(), hi.into()])?.into_int_value();
                    let v = ev.kb.intrinsic_value("llvm.smax", &[i64t.into()], &[v.into(), lo.into()])?.into_int_value();
                    ev.kb.b.build_int_truncate(v, ev.kb.cx.i32_type(), "r")?
                } else {
                    v
                };
                RowScalars::Reduce(Scalar::I(r))
            }
            (StatKind::Reduce(c), Acc::F(v)) => {
                let v = if c == Combine::Sum { ev.kb.fadd(v, ev.kb.f32c(0.0))? } else { v };
                let v = if kind == OpKind::ReduceMean { ev.kb.fdiv(v, nf)? } else { v };
                RowScalars::Reduce(Scalar::F(ev.kb.round_to(v, dt)?))
            }
            (StatKind::SoftmaxMax, Acc::F(m)) => {
                let ninf = ev.kb.f32c(f32::NEG_INFINITY);
                let all = ev.kb.feq(m, ninf)?;
                let zero = ev.kb.f32c(0.0);
                let m_safe = ev.kb.fsel(all, zero, m)?;
                pending.insert(st.node, (m, all, m_safe));
                RowScalars::SoftmaxMax { m_safe }
            }
            (StatKind::SoftmaxSum, Acc::F(sum)) => {
                let (m, all, m_safe) = pending.get(&st.node).copied().ok_or_else(|| CodegenError::Builder("softmax sum before max".into()))?;
                let one = ev.kb.f32c(1.0);
                let inv_s = ev.kb.fdiv(one, sum)?;
                let log_s = math::log(ev.kb, sum)?;
                RowScalars::Softmax { m_safe, m, inv_s, log_s, all_neg_inf: all }
            }
            (StatKind::SumSquares, Acc::F(ss)) => {
                let ms = ev.kb.fdiv(ss, nf)?;
                let e = ev.kb.f32c(eps.unwrap_or(0.0));
                let v = ev.kb.fadd(ms, e)?;
                let sq = ev.kb.fsqrt(v)?;
                let one = ev.kb.f32c(1.0);
                RowScalars::RmsNorm { r: ev.kb.fdiv(one, sq)? }
            }
            (StatKind::LnSum, Acc::F(sum)) => RowScalars::LayerNormMean { mean: ev.kb.fdiv(sum, nf)? },
            (StatKind::LnDev, Acc::F(dev)) => {
                // Corrected two-pass (Björck; Chan, Golub & LeVeque 1983): the first pass's
                // f32 mean is off by d = Σ(x − mean₀)/N, which this pass measures exactly
                // enough; var = Σ(x − mean₀)²/N − d².
                let Some(RowScalars::LayerNormMean { mean }) = ev.rows.get(&st.node).copied() else {
                    return Err(CodegenError::Builder("layer_norm correction before mean".into()));
                };
                let d = ev.kb.fdiv(dev, nf)?;
                pending_d.insert(st.node, d);
                RowScalars::LayerNormMean { mean }
            }
            (StatKind::LnVar, Acc::F(ss)) => {
                let Some(RowScalars::LayerNormMean { mean }) = ev.rows.get(&st.node).copied() else {
                    return Err(CodegenError::Builder("layer_norm variance before mean".into()));
                };
                let d = pending_d.get(&st.node).copied().ok_or_else(|| CodegenError::Builder("layer_norm variance before its correction".into()))?;
                let m2 = ev.kb.fdiv(ss, nf)?;
                let nd = ev.kb.fneg(d)?;
                let var = ev.kb.ffma(nd, d, m2)?;
                let zero = ev.kb.f32c(0.0);
                let var = ev.kb.combine_f32(Combine::Max, var, zero)?;
                let e = ev.kb.f32c(eps.unwrap_or(0.0));
                let v = ev.kb.fadd(var, e)?;
                let sq = ev.kb.fsqrt(v)?;
                let one = ev.kb.f32c(1.0);
                RowScalars::LayerNorm { mean, d, r: ev.kb.fdiv(one, sq)? }
            }
            _ => return Err(CodegenError::Builder("a statistic of the wrong kind".into())),
        };
        ev.rows.insert(st.node, scalars);
        Ok(())
    }
}
