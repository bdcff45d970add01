//! The cluster schedule (sm_90+): a row split over a thread-block cluster of `c` CTAs
//! (`.reqnctapercluster 1, c, 1`; grid `(R, c, 1)`). CTA `r` (`%cluster_ctarank`) owns the
//! slice `[r·S, min(N, (r+1)·S))`, `S = ⌈N/c⌉` rounded up to `vec` ([`Split`]). Every row
//! input a statistic reads is staged in the CTA's shared memory as loaded: a prefetch loop
//! first issues the whole slice as 16-byte `cp.async` copies, each thread copying exactly the
//! chunks it later reads (so `cp.async.wait_group` and no barrier make them visible), one
//! commit group a loop iteration where the slices are whole iterations. The CTA's partial
//! statistics go to its shared memory, a cluster barrier (the warp of thread 0, which wrote
//! them, arrives with release semantics, the others relaxed), and every warp reads the `c`
//! CTAs' partials through distributed shared memory and folds them. The slots alternate by
//! row parity, so one cluster barrier a level suffices across rows; a last, relaxed, split
//! cluster barrier keeps a CTA resident until its cluster has read its slots.
//!
//! Design notes: book/src/design/reductions.md

use std::cell::Cell;

use inkwell::values::{FloatValue, IntValue, PointerValue};
use inkwell::IntPredicate;
use sinter_ir::Node;

use super::analysis::{Analysis, Stat, StatKind};
use super::emit::{Acc, Emitter, Held, Pending};
use super::schedule::{RowSchedule, CLUSTER_SLICE_BYTES};
use crate::isa::Combine;
use crate::kernels::element::{Ax, Eval, RowScalars};
use crate::kernels::ctx::KernelCtx;
use crate::math::{Ops, R};
use crate::error::CodegenError;

/// The cluster schedule's split of a row (see this module's docs).
#[derive(Clone, Debug)]
pub(super) struct Split {
    /// Elements per CTA slice (a multiple of `vec`); CTA `r` of the cluster takes `[r·slice,
    /// min(N, (r + 1)·slice))`.
    pub(super) slice: i64,
    /// Loop iterations over a slice (`unroll·T·vec` elements each).
    pub(super) iters: i64,
    /// The last iterations of the slice held in registers rather than staged
    /// ([`RowSchedule::held`]).
    pub(super) held: i64,
    /// The staged parameters and their element sizes.
    pub(super) staged: Vec<(usize, u32)>,
    /// The staged row-invariant parameters and their element sizes
    /// ([`RowSchedule::stage_invariant`]).
    pub(super) resident: Vec<(usize, u32)>,
    /// Bytes of shared memory staging takes (each array a whole number of iterations,
    /// 16-byte aligned).
    pub(super) stage_bytes: u32,
    /// Every CTA's slice is full and a whole number of iterations: no chunk is ever past its
    /// slice's end (no bounds checks).
    pub(super) exact: bool,
}

/// Shared memory of a CTA the cluster schedule asks for beyond its staged slice: the
/// reduction scratch (at most `4·T/32` words per level and statistic) and the cluster slots;
/// a bound, checked after generation.
pub(super) const CLUSTER_SCRATCH_BYTES: u32 = 4 << 10;

impl Split {
    pub(super) fn new(plan: &Analysis, sched: &RowSchedule, cx: &KernelCtx<'_>) -> R<Split> {
        let n = plan.n.as_const().ok_or_else(|| cx.unsupported("the cluster schedule needs a constant row length"))?.max(0) as u64;
        let (c, t, v, u) = (u64::from(sched.cluster), u64::from(sched.threads_per_row), u64::from(sched.vec), u64::from(sched.unroll));
        let slice = n.div_ceil(c).div_ceil(v) * v;
        let per_iter = u * t * v;
        let iters = slice.div_ceil(per_iter).max(1);
        let (slice, iters, per_iter) = (slice as i64, iters as i64, per_iter as i64);
        let held = i64::from(sched.held);
        let exact = slice * i64::from(sched.cluster) == n as i64 && slice % per_iter == 0;
        if held > 0 {
            let mut vectors = !plan.staged.is_empty();
            for &i in &plan.staged {
                vectors &= u64::from(sched.vec) * cx.buffer(i)?.ty.dtype.size_bytes() as u64 == 16;
            }
            if !exact || held >= iters || !vectors {
                return Err(cx.unsupported(format!("{held} slice iterations held in registers need a staged input, whole slices of more iterations (here {iters}) and 16-byte vectors")));
            }
        }
        let mut staged = Vec::new();
        let mut bytes = 0u64;
        let mut resident = Vec::new();
        let kept: &[usize] = if sched.stage_invariant { &plan.resident } else { &[] };
        for (keep, &i) in plan.staged.iter().map(|i| (false, i)).chain(kept.iter().map(|i| (true, i))) {
            let size = cx.buffer(i)?.ty.dtype.size_bytes() as u32;
            if keep { &mut resident } else { &mut staged }.push((i, size));
            bytes += ((iters - held) * per_iter) as u64 * u64::from(size);
            bytes = bytes.div_ceil(16) * 16;
        }
        let stage_bytes = u32::try_from(bytes).map_err(|_| cx.unsupported("a slice too large to stage"))?;
        Ok(Split { slice, iters, held, staged, resident, stage_bytes, exact })
    }
}

impl<'p, 'ctx> Emitter<'p, 'ctx> {
    /// The cluster schedule's fold of a row's CTA totals `vals` (every thread of the CTA holds
    /// the same) over the cluster: thread 0 of each CTA writes them to its shared memory (the
    /// row parity's set of slots), a cluster barrier (`barrier.cluster.arrive`/`wait`:
    /// release / acquire), then lane `l` of every warp reads CTA `l`'s through distributed
    /// shared memory (`mapa`, `ld.shared::cluster`) and a butterfly merges them (see
    /// [`Emitter::fold_lanes`]): every thread of the cluster ends with the same bits.
    ///
    /// A row's slots are rewritten two rows later, after the cluster barrier of the row in
    /// between, which every CTA reaches only after reading them; the CTA-level scratch of a
    /// row is last read before this barrier too, so the next row may reuse it without a CTA
    /// barrier.
    #[allow(clippy::type_complexity)]
    pub(super) fn cluster_fold_with(
        &self,
        ev: &mut Eval<'_, 'ctx>,
        vals: &[Acc<'ctx>],
        t: IntValue<'ctx>,
        identity: Vec<Acc<'ctx>>,
        merge: &dyn Fn(&Self, &mut Eval<'_, 'ctx>, &[Acc<'ctx>], &[Acc<'ctx>]) -> R<Vec<Acc<'ctx>>>,
    ) -> R<Vec<Acc<'ctx>>> {
        let crow = self.crow.get().ok_or_else(|| CodegenError::Builder("no cluster row".into()))?;
        let n = vals.len() as u32;
        let slots = self.smem_alloc(ev, 2 * n * 8, 16)?;
        let i64t = ev.kb.cx.i64_type();
        let f32t = ev.kb.cx.f32_type();
        let first = ev.imul(crow.parity, ev.ic(i64::from(n)))?;
        let cell = move |ev: &mut Eval<'_, 'ctx>, i: u32| -> R<PointerValue<'ctx>> {
            let idx = ev.iadd(first, ev.ic(i64::from(i)))?;
            ev.kb.gep(i64t.into(), slots, idx)
        };
        let t0 = ev.kb.b.build_int_compare(IntPredicate::EQ, t, ev.ic(0), "t0")?;
        self.guarded(ev, Some(t0), |ev| {
            for (i, v) in vals.iter().enumerate() {
                let p = cell(ev, i as u32)?;
                match v {
                    Acc::F(f) => ev.kb.store(p, (*f).into(), 8)?,
                    Acc::I(x) => ev.kb.store(p, (*x).into(), 8)?,
                }
            }
            Ok(())
        })?;
        // Only thread 0 wrote slots: its warp arrives with release semantics, the other warps
        // relaxed (a release arrive is a `MEMBAR.ALL.GPU` in each thread that executes it),
        // and every thread waits (acquire) before reading the slots.
        let w0 = ev.ilt(t, ev.ic(32))?;
        let rest = ev.kb.b.build_not(w0, "rest")?;
        self.guarded(ev, Some(w0), |ev| ev.kb.cluster_arrive())?;
        self.guarded(ev, Some(rest), |ev| ev.kb.cluster_arrive_relaxed())?;
        ev.kb.cluster_wait()?;
        let kinds: Vec<bool> = vals.iter().map(|v| matches!(v, Acc::I(_))).collect();
        let load = |ev: &mut Eval<'_, 'ctx>, k: IntValue<'ctx>| -> R<Vec<Acc<'ctx>>> {
            let r = ev.kb.b.build_int_truncate_or_bit_cast(k, ev.kb.cx.i32_type(), "rank")?;
            let mut out = Vec::with_capacity(kinds.len());
            for (i, &int) in kinds.iter().enumerate() {
                let p = cell(ev, i as u32)?;
                let q = ev.kb.mapa_shared(p, r)?;
                out.push(if int { Acc::I(ev.kb.load(i64t.into(), q, 8)?.into_int_value()) } else { Acc::F(ev.kb.load(f32t.into(), q, 8)?.into_float_value()) });
            }
            Ok(out)
        };
        let lane = ev.kb.b.build_and(t, ev.ic(31), "lane")?;
        self.fold_lanes(ev, self.sched.cluster, lane, &load, identity, merge)
    }

    /// The cluster schedule's end of a reduction level: the CTA's `totals` of `stats` become
    /// the row's statistics with at most one cluster exchange.
    ///
    /// A `layer_norm` crosses the cluster once, not once per level, and its statistics are
    /// the warp's until then ([`Emitter::warp_only`]): its first level (`LnSum`) gives the
    /// warp's own mean `m₀ = Σx / n_w` over the chunks it staged (shuffles only, no barrier;
    /// `n_w = slice / warps`, the same constant in every warp: the slices are whole), the second its corrected two-pass statistics,
    /// `mean_w = m₀ + Σ(x − m₀)/n_w` and `M2_w = Σ(x − m₀)² − (Σ(x − m₀))²/n_w` (Björck's
    /// correction, as the CTA schedules use); the warps' triples are merged over the CTA
    /// through shared memory (one barrier) and the cluster merges the CTAs' `(n_c, mean_c,
    /// M2_c)`, both by Chan, Golub & LeVeque's
    /// pairwise update (1979/1983: `n = n_a + n_b`, `mean = (n_a·mean_a + n_b·mean_b)/n`,
    /// `M2 = M2_a + M2_b + δ²·n_a·n_b/n`, `δ = mean_b − mean_a`) — symmetric in `a` and `b`,
    /// so the butterfly leaves every thread of the cluster with the same bits (see
    /// [`Emitter::fold_lanes`]); with equal counts on both sides (a power of two of warps or
    /// CTAs) without a division (see [`Emitter::chan_merge`]). An empty slice is `(0, 0, 0)`.
    /// Other statistics of the level are folded in the same exchange.
    pub(super) fn cluster_level(&self, ev: &mut Eval<'_, 'ctx>, stats: &[Stat], totals: Vec<Acc<'ctx>>, t: IntValue<'ctx>, nv: IntValue<'ctx>, pending: &mut Pending<'ctx>) -> R<()> {
        let crow = self.crow.get().ok_or_else(|| CodegenError::Builder("no cluster row".into()))?;
        let f32t = ev.kb.cx.f32_type();
        // A layer norm's statistics are the warp's (`warp_only`): its element count. Where
        // every slice is full and whole loop iterations (`Split::exact`, which `ln_per_warp`
        // requires), every warp of every CTA counts `slice / n_w` elements: a constant, so the
        // divisions by it below fold (to products by a power of two, exact, where it is one).
        let nw = self.sched.threads_per_row / 32;
        let len = match &self.split {
            Some(sp) if self.ln_per_warp() => ev.ic(sp.slice / i64::from(nw)),
            _ => {
                let some = ev.ilt(crow.start, crow.end)?;
                let len = ev.isub(crow.end, crow.start)?;
                ev.kb.b.build_select(some, len, ev.ic(0), "n_c")?.into_int_value()
            }
        };
        let some = ev.ilt(ev.ic(0), len)?;
        let n_c = ev.kb.b.build_unsigned_int_to_float(len, f32t, "n_w")?;
        let zero = ev.kb.f32c(0.0);
        // The statistics every CTA folds as usual, and the layer norms' (dev, var) pairs.
        let mut folded: Vec<(Stat, Acc<'ctx>)> = Vec::new();
        let mut ln: Vec<(Node, Option<FloatValue<'ctx>>, Option<FloatValue<'ctx>>)> = Vec::new();
        for (st, tot) in stats.iter().zip(totals) {
            match (st.kind, tot) {
                (StatKind::LnSum, Acc::F(sum)) => {
                    // The slice's own mean (0 for an empty slice), or the mean of the warp's
                    // first chunk (a sampled shift).
                    let n_c = if self.sampled() { ev.kb.f32c((32 * self.sched.vec) as f32) } else { n_c };
                    let m0 = ev.kb.fdiv(sum, n_c)?;
                    let m0 = ev.kb.fsel(some, m0, zero)?;
                    ev.rows.insert(st.node, RowScalars::LayerNormMean { mean: m0 });
                }
                // With a shift from the row's head they are plain sums, folded below.
                (StatKind::LnDev | StatKind::LnVar, Acc::F(v)) if !self.head_shift() => {
                    let i = match ln.iter().position(|e| e.0 == st.node) {
                        Some(i) => i,
                        None => {
                            ln.push((st.node, None, None));
                            ln.len() - 1
                        }
                    };
                    if st.kind == StatKind::LnDev {
                        ln[i].1 = Some(v);
                    } else {
                        ln[i].2 = Some(v);
                    }
                }
                (_, tot) => folded.push((*st, tot)),
            }
        }
        let fstats: Vec<Stat> = folded.iter().map(|(s, _)| *s).collect();
        let mut vals: Vec<Acc<'ctx>> = folded.iter().map(|(_, a)| *a).collect();
        let mut identity = self.identities(ev, &fstats);
        let f64t = ev.kb.cx.f64_type();
        let i64t = ev.kb.cx.i64_type();
        let n64 = ev.kb.b.build_unsigned_int_to_float(len, f64t, "n_c")?;
        let z64 = ev.kb.f64c(0.0);
        let bits = |ev: &mut Eval<'_, 'ctx>, v: FloatValue<'ctx>| -> R<Acc<'ctx>> { Ok(Acc::I(ev.kb.b.build_bit_cast(v, i64t, "bits")?.into_int_value())) };
        for &(node, dev, ss) in &ln {
            let (Some(dev), Some(ss)) = (dev, ss) else {
                return Err(CodegenError::Builder("layer_norm statistics of a level incomplete".into()));
            };
            let Some(RowScalars::LayerNormMean { mean: m0 }) = ev.rows.get(&node).copied() else {
                return Err(CodegenError::Builder("layer_norm variance before its mean".into()));
            };
            // In f64: the merged mean must keep what an f32 would round away (a row of mean
            // 1000 and spread 0.01 needs its mean to far below an f32 ulp at 1000).
            let m0 = ev.kb.b.build_float_ext(m0, f64t, "m0")?;
            let dev = ev.kb.b.build_float_ext(dev, f64t, "dev")?;
            let ss = ev.kb.b.build_float_ext(ss, f64t, "ss")?;
            let d = ev.kb.fdiv(dev, n64)?;
            let mean = ev.kb.fadd(m0, d)?;
            let mean = ev.kb.fsel(some, mean, z64)?;
            let dd = ev.kb.fmul(d, dev)?;
            let m2 = ev.kb.fsub(ss, dd)?;
            let m2 = ev.kb.fsel(some, m2, z64)?;
            let mut tri = Vec::with_capacity(3);
            for v in [n64, mean, m2] {
                tri.push(bits(ev, v)?);
            }
            // The warps' triples merged over the CTA: each warp's in shared memory, one
            // barrier, a butterfly of Chan merges (every thread ends with the same bits).
            let cta = if nw > 1 && self.ln_per_warp() {
                let arr = self.smem_alloc(ev, 3 * 8 * nw, 16)?;
                let warp = ev.kb.b.build_right_shift(t, ev.ic(5), false, "warp")?;
                let base = ev.imul(warp, ev.ic(3))?;
                for (j, v) in tri.iter().enumerate() {
                    let Acc::I(x) = v else { return Err(CodegenError::Builder("layer_norm warp triple".into())) };
                    let idx = ev.iadd(base, ev.ic(j as i64))?;
                    let p = ev.kb.gep(i64t.into(), arr, idx)?;
                    ev.kb.store(p, (*x).into(), 8)?;
                }
                ev.kb.barrier()?;
                let load = |ev: &mut Eval<'_, 'ctx>, k: IntValue<'ctx>| -> R<Vec<Acc<'ctx>>> {
                    let b = ev.imul(k, ev.ic(3))?;
                    let mut out = Vec::with_capacity(3);
                    for j in 0..3 {
                        let idx = ev.iadd(b, ev.ic(j))?;
                        let p = ev.kb.gep(i64t.into(), arr, idx)?;
                        out.push(Acc::I(ev.kb.load(i64t.into(), p, 8)?.into_int_value()));
                    }
                    Ok(out)
                };
                let lane = ev.kb.b.build_and(t, ev.ic(31), "lane")?;
                let id = vec![Acc::I(ev.kb.i64c(0)); 3];
                // Without divisions ptxas schedules the fold for more registers: at six CTAs an
                // SM (slices of 32 KiB, 40 registers) a bf16 LayerNorm of 32768 spills 12
                // bytes, so the division-free warp fold only where fewer CTAs fit.
                let roomy = self.split.as_ref().is_some_and(|sp| u64::from(sp.stage_bytes) > CLUSTER_SLICE_BYTES);
                let uniform = roomy && nw.is_power_of_two();
                self.fold_lanes(ev, nw, lane, &load, id, &|e, ev, a, b| e.chan_merge(ev, a, b, uniform))?
            } else {
                tri
            };
            vals.extend(cta);
            identity.extend([Acc::I(ev.kb.i64c(0)), Acc::I(ev.kb.i64c(0)), Acc::I(ev.kb.i64c(0))]);
        }
        if vals.is_empty() {
            // Only slice means this level: nothing crosses the cluster.
            return Ok(());
        }
        let k = fstats.len();
        // Equal counts on both sides of every butterfly step: the warps' (or CTAs') triples of
        // whole slices, a power of two of them (no identity padding, see `fold_lanes`).
        let uniform = self.ln_per_warp() && self.sched.cluster.is_power_of_two();
        let merged = self.cluster_fold_with(ev, &vals, t, identity, &|e, ev, a, b| {
            let mut out = e.combine_all(ev, &fstats, &a[..k], &b[..k])?;
            for (x, y) in a[k..].chunks(3).zip(b[k..].chunks(3)) {
                out.extend(e.chan_merge(ev, x, y, uniform)?);
            }
            Ok(out)
        })?;
        for ((st, _), tot) in folded.iter().zip(&merged) {
            self.finish_stat(ev, st, *tot, nv, pending)?;
        }
        for (&(node, _, _), tri) in ln.iter().zip(merged[k..].chunks(3)) {
            let (Some(Acc::I(n)), Some(Acc::I(mean)), Some(Acc::I(m2))) = (tri.first().copied(), tri.get(1).copied(), tri.get(2).copied()) else {
                return Err(CodegenError::Builder("layer_norm cluster statistics".into()));
            };
            let n = ev.kb.b.build_bit_cast(n, f64t, "n")?.into_float_value();
            let mean = ev.kb.b.build_bit_cast(mean, f64t, "mean")?.into_float_value();
            let m2 = ev.kb.b.build_bit_cast(m2, f64t, "m2")?.into_float_value();
            // The mean as an f32 and its correction (see `RowScalars::LayerNorm`).
            let hi = ev.kb.b.build_float_trunc(mean, f32t, "mean")?;
            let hi64 = ev.kb.b.build_float_ext(hi, f64t, "mean")?;
            let lo = ev.kb.fsub(mean, hi64)?;
            let d = ev.kb.b.build_float_trunc(lo, f32t, "d")?;
            // The row's count: the constant `N` where the slices are whole (a product where it
            // is a power of two), else the merged one.
            let n = match (self.ln_per_warp(), self.plan.n.as_const()) {
                (true, Some(c)) => ev.kb.f64c(c as f64),
                _ => n,
            };
            let var = ev.kb.fdiv(m2, n)?;
            let var = ev.kb.b.build_float_trunc(var, f32t, "var")?;
            let eps = ev.f.nodes[node].op.float("eps").unwrap_or(0.0) as f32;
            let var = ev.kb.combine_f32(Combine::Max, var, zero)?;
            let v = ev.kb.fadd(var, ev.kb.f32c(eps))?;
            let sq = ev.kb.fsqrt(v)?;
            let r = ev.kb.fdiv(ev.kb.f32c(1.0), sq)?;
            ev.rows.insert(node, RowScalars::LayerNorm { mean: hi, d, r });
        }
        Ok(())
    }

    /// The row's chunks held in registers ([`RowSchedule::held`]): the slice's last `held`
    /// iterations, each thread's `held·unroll` chunks at the columns every pass maps to it,
    /// loaded as 16-byte vectors right after the staged iterations' copies were issued (the
    /// first pass reaches them last) and kept in [`Eval::pinned`] until the row's output pass
    /// has read them. Nothing to do without held iterations.
    pub(super) fn load_held(&self, ev: &mut Eval<'_, 'ctx>, lead: &[Ax<'ctx>], t: IntValue<'ctx>) -> R<()> {
        let (Some(split), Some(c)) = (&self.split, self.crow.get()) else { return Ok(()) };
        if split.held == 0 {
            return Ok(());
        }
        let s = self.sched;
        let per_iter = s.per_iter();
        let tj = ev.imul(t, ev.ic(i64::from(s.vec)))?;
        let mut held = Vec::new();
        for h in split.iters - split.held..split.iters {
            for u in 0..i64::from(s.unroll) {
                let j = ev.iadd(ev.ic(h * per_iter + u * i64::from(s.threads_per_row) * i64::from(s.vec)), tj)?;
                let col = ev.iadd(c.start, j)?;
                let at = self.chunk(ev, lead, col, c.end, true)?.at;
                let base = at.axes.last().map(|a| a.base).ok_or_else(|| CodegenError::Builder("a held chunk without a row axis".into()))?;
                for &(i, _) in &split.staged {
                    let v = ev.load_vector(i, &at)?.ok_or_else(|| CodegenError::Unsupported {
                        kernel: String::new(),
                        message: format!("parameter {i}'s chunks are not aligned 16-byte vectors, which holding slice iterations in registers needs"),
                    })?;
                    ev.pinned.push((i, base, v));
                }
                held.push((j, at));
            }
        }
        self.held.replace(held);
        Ok(())
    }

    /// The cluster schedule's prefetch: before the first pass, a loop over the CTA's slice
    /// issues one 16-byte `cp.async` per staged chunk ([`Eval::prefetch_param`]) with the
    /// chunk-to-thread map of every later pass, then `cp.async.commit_group` and
    /// `cp.async.wait_group 0`, so the whole slice is in flight at once (instead of `unroll`
    /// vectors per thread per round trip) and the first pass reads the stage. Chunks the
    /// prefetch cannot copy (not a contiguous, aligned 16-byte vector) are loaded and staged
    /// by the first pass as before. The staged row-invariant inputs are copied in the same
    /// loop ([`RowSchedule::stage_invariant`]). Nothing to do outside the cluster schedule.
    pub(super) fn prefetch_slice(&self, ev: &mut Eval<'_, 'ctx>, lead: &[Ax<'ctx>], t: IntValue<'ctx>, nv: IntValue<'ctx>, wait: bool) -> R<()> {
        let Some(split) = &self.split else { return Ok(()) };
        if split.staged.is_empty() {
            return Ok(());
        }
        // The staged row-invariant inputs (`RowSchedule::stage_invariant`), read at the
        // chunk's column: a `cp.async` each, or a load and a store (visible to the thread at
        // once) where the chunk is not an aligned 16-byte vector.
        let mut row_shape = self.plan.lead.clone();
        row_shape.push(self.plan.n.clone());
        let mut invariant = Vec::with_capacity(split.resident.len());
        for &(i, _) in &split.resident {
            let p = *ev.f.params.get(i).ok_or_else(|| CodegenError::Builder(format!("no parameter {i}")))?;
            invariant.push((i, ev.f.ty(p).shape.clone()));
        }
        if let Some(st) = ev.stage.as_mut() {
            st.resident_fill = true;
        }
        let mut issued = false;
        // One commit group a loop iteration, so that the first pass waits for each
        // iteration's chunks only when it reaches them (`Emitter::wait_iteration`): its
        // statistics of the first chunks overlap the arrival of the last. Not where a chunk
        // falls back to a load (its group would be empty but the pass must fill it anyway) or
        // where the row-invariant inputs are staged too.
        let per_iteration = wait && split.exact && split.resident.is_empty();
        let calls = Cell::new(0u32);
        self.chunk_loop(ev, "prefetch", (t, nv), &[], true, Held::Skip, &mut |ev, j, acc| {
            let ch = self.slice_chunk(ev, lead, j, nv)?;
            for &(i, _) in &split.staged {
                issued |= ev.prefetch_param(i, &ch.at)?;
            }
            for (i, shape) in &invariant {
                let at = ev.broadcast_at(&ch.at, &row_shape, shape)?;
                issued |= ev.fill_param(*i, &at)?;
            }
            calls.set(calls.get() + 1);
            if per_iteration && calls.get() % self.sched.unroll == 0 {
                ev.kb.cp_async_commit()?;
            }
            Ok(acc)
        })?;
        if per_iteration && issued {
            self.groups.set(u32::try_from(split.iters - split.held).unwrap_or(u32::MAX));
        } else if issued {
            ev.kb.cp_async_commit()?;
            if wait {
                ev.kb.cp_async_wait(0)?;
            }
        }
        if let Some(st) = ev.stage.as_mut() {
            st.end_pass();
            st.resident_fill = false;
        }
        Ok(())
    }

    /// Waits for the prefetch's commit group of the loop iteration whose first chunk for this
    /// thread is slice element `j` (and every earlier one): with `groups` groups committed in
    /// iteration order, iteration `k = ⌊j / (unroll·T·vec)⌋` may leave `groups − 1 − k` in
    /// flight (`cp.async.wait_group` takes a constant: a uniform branch per count, capped at
    /// 7, which only waits for more).
    pub(super) fn wait_iteration(&self, ev: &mut Eval<'_, 'ctx>, j: IntValue<'ctx>, groups: u32) -> R<()> {
        let s = self.sched;
        let per_iter = s.per_iter();
        let k = ev.kb.b.build_int_unsigned_div(j, ev.ic(per_iter), "k")?;
        let left = ev.isub(ev.ic(i64::from(groups) - 1), k)?;
        let cap = (groups - 1).min(7);
        let left = ev.kb.intrinsic_value("llvm.umin", &[ev.ity().into()], &[left.into(), ev.ic(i64::from(cap)).into()])?.into_int_value();
        for n in 0..=cap {
            let is = ev.kb.b.build_int_compare(IntPredicate::EQ, left, ev.ic(i64::from(n)), "left")?;
            self.guarded(ev, Some(is), |ev| ev.kb.cp_async_wait(n))?;
        }
        Ok(())
    }
}
