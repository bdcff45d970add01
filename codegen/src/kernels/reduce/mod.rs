//! The row-reduction family ([`Family::RowReduction`]): reductions over the last axis with a
//! fused element-wise prologue and epilogue — `reduce_sum`/`reduce_max`/`reduce_min`/
//! `reduce_mean`, `softmax`, `log_softmax`, `rms_norm`, `layer_norm`, and any combination of
//! them over the same rows (a decomposed softmax or LayerNorm stays one kernel).
//!
//! # What a kernel computes
//! Every row node reduces the last axis of an operand of one shape `[L…, N]` (the *row
//! space*; `N` any length, constant or a symbol; any number of rows `R = ΠL`). The body's
//! outputs are *row values* (shape `[L…, N]`, written per element) or *row scalars*
//! (`[L…, 1]` or `[L…]`, written once per row); prologue and epilogue ops are evaluated
//! element by element by the element evaluator (`kernels::element`), a row node's result
//! being read through its row statistics. Numerics, as the interpreter's:
//!
//! - statistics in f32 (integer sums, maxima and minima in i64, saturated to the dtype);
//! - `softmax` is safe: `m = max x` (NaN-propagating: `max.NaN.f32`, never `fmaxf`),
//!   `e = 2^((x − m)·log2e)` (`ex2.approx.ftz`), `out = e · (1/Σe)`; a row of all −inf gives
//!   0 (`log_softmax`: −inf), a NaN anywhere gives a NaN row, a +inf gives NaN (`inf − inf`);
//! - `log_softmax = −((m − x) + log Σe)` (−0 at the row max when log Σe rounds to 0) with the precise [`crate::math::log`];
//! - `rms_norm`: `r = 1/√(Σx²/N + eps)` with `eps` rounded to f32 and added in f32,
//!   `out = round(round(x·r)·w)` (a zero row gives 0);
//! - `layer_norm`: the corrected two-pass algorithm (mean₀ = Σx/N, then `Σ(x − mean₀)` and
//!   `Σ(x − mean₀)²` together: mean = mean₀ + d, var = Σ(x−mean₀)²/N − d²), accurate even for
//!   rows with a large mean and a small spread; `out = round(round((x−mean)·r)·w + b)`.
//!
//! # Schedule ([`RowSchedule`])
//! A row is reduced by one warp (short rows, four a CTA), one CTA of 64 to 1024 threads, or
//! (sm_90+) a thread-block cluster of 2 to 16 CTAs. Each thread reduces its elements
//! sequentially; butterfly shuffles combine the partials within a warp, shared memory across
//! warps, distributed shared memory across a cluster's CTAs — every merge symmetric, so every
//! thread ends with the same bits. Rows are looped over grid-stride. Three ways over a row:
//! - **one read** (a constant `N`, at most 32 elements a thread): the thread's elements are
//!   loaded once and stay in registers through every reduction level and the output pass;
//! - **multi-pass** (longer rows, or a symbolic `N`): a loop over the row per reduction level,
//!   then one for the outputs; a long row's softmax is online (max and sum in one pass);
//! - **cluster** (sm_90+, a constant `N` too long for one read, when a later pass reads a row
//!   input again): the row is split over a cluster's CTAs, each staging its slice in shared
//!   memory, so the row crosses DRAM once each way.
//!
//! A reduction *level* is a set of statistics that can be computed in the same pass: a
//! statistic's level is one more than the deepest statistic its input depends on (softmax's
//! sum depends on its max; LayerNorm's variance on its mean; a reduction of a softmax on the
//! softmax's sum).
//!
//! | file | what |
//! |---|---|
//! | `mod.rs` | [`generate`], the family's `Generator` (analyse, schedule, build) |
//! | `schedule.rs` | [`RowSchedule`], its default, the autotuning candidates, occupancy |
//! | `analysis.rs` | the row space, the statistics by level, the outputs, the staged inputs |
//! | `emit.rs` | the kernel: the row loop, chunks, the passes over a row, the outputs |
//! | `stats.rs` | statistic arithmetic: identities, accumulation, folds, the row scalars |
//! | `cluster.rs` | the cluster schedule: the split, the prefetch, the cluster exchange |
//! | `layer_norm.rs` | LayerNorm statistics: the one-read fused form, per-warp shifts |
//!
//! Design notes: book/src/design/reductions.md

mod analysis;
mod cluster;
mod emit;
mod layer_norm;
mod schedule;
mod stats;

use std::cell::{Cell, RefCell};

use sinter_ir::{Dim, Family, GridDim, Kernel, KernelGraph, LaunchPlan, OpKind, ValueDef};

use self::analysis::Analysis;
use self::cluster::{Split, CLUSTER_SCRATCH_BYTES};
use self::emit::Emitter;
use self::schedule::{default_schedule, occupancy, sampled_shift_applies};
use super::element::Eval;
use super::family::{Generator, Schedule};
use super::ctx::{build_twice_occupancy, KernelCtx};
use crate::math::R;
use crate::target::Target;
use crate::error::CodegenError;

use self::schedule::variants;
pub use self::schedule::{persistent_clusters, RowSchedule};

/// Generates row-reduction kernel `kernel` of `graph` with [`RowSchedule::choose`].
///
/// Parameters: the kernel's buffers, then its symbolic sizes. Grid `(⌈R / rows_per_cta⌉,
/// cluster, 1)` (rows are also looped over, grid-stride), block `(threads_per_row·rows_per_cta,
/// 1, 1)`; static shared memory, or (the cluster schedule) only dynamic shared memory and
/// clusters of `(1, cluster, 1)` CTAs.
///
/// # Errors
/// [`CodegenError::Unsupported`] when a reduction is not over the last axis, the reductions
/// have different row shapes, or an output is neither a row value nor a row scalar;
/// [`CodegenError::BadKernel`] for a body that does not match its buffers.
pub fn generate(graph: &KernelGraph, kernel: Kernel, target: &Target) -> Result<LaunchPlan, CodegenError> {
    crate::kernels::family::compile::<RowReduction>(graph, kernel, target)
}

/// The row-reduction family's generator.
pub(crate) struct RowReduction;

impl Generator for RowReduction {
    type Analysis<'g> = KernelCtx<'g>;
    type Schedule = RowSchedule;
    fn analyse<'g>(graph: &'g KernelGraph, kernel: Kernel, _: &Target) -> R<KernelCtx<'g>> {
        let cx = KernelCtx::new(graph, kernel)?;
        if cx.data.family != Family::RowReduction {
            return Err(cx.bad(format!("a {:?} kernel given to the row-reduction generator", cx.data.family)));
        }
        Ok(cx)
    }
    /// [`RowSchedule::choose`]'s.
    fn default_schedule(cx: &KernelCtx<'_>, target: &Target) -> R<RowSchedule> {
        Ok(default_schedule(cx, target)?.0)
    }
    fn candidates(cx: &KernelCtx<'_>, target: &Target) -> R<Vec<RowSchedule>> {
        variants(cx, target)
    }
    fn build(cx: &KernelCtx<'_>, s: &RowSchedule, target: &Target) -> R<LaunchPlan> {
        build(cx, target, *s)
    }
}

impl Schedule for RowSchedule {
    fn name(&self) -> String {
        RowSchedule::name(self)
    }
}

/// The kernel's default schedule without its thread-block cluster (one CTA a row, 256
/// threads, four vectors a loop iteration): the form a kernel that shares its CTA with
/// others can take ([`crate::persistent`]). A default without a cluster is kept.
///
/// # Errors
/// As [`generate`].
pub fn generate_without_cluster(graph: &KernelGraph, kernel: Kernel, target: &Target) -> Result<LaunchPlan, CodegenError> {
    let cx = KernelCtx::new(graph, kernel)?;
    let (s, _) = default_schedule(&cx, target)?;
    let s = if s.cluster > 1 { RowSchedule { cluster: 1, stage_invariant: false, persistent: 0, sampled_shift: false, head_shift: false, held: 0, threads_per_row: 256, unroll: 4, ..s } } else { s };
    build(&cx, target, s)
}

/// Generates the kernel of `cx` with schedule `sched`.
///
/// # Errors
/// As [`generate`]; [`CodegenError::Unsupported`] for a schedule that does not fit the rows
/// or the target.
fn build(cx: &KernelCtx<'_>, target: &Target, sched: RowSchedule) -> Result<LaunchPlan, CodegenError> {
    let (_, plan) = default_schedule(&cx, target)?;
    sched.check(&plan.n, target).map_err(|e| cx.unsupported(format!("schedule: {e}")))?;
    // The one-read schedule computes a LayerNorm's statistics in one level (see `LnFused`);
    // the multi-pass one a softmax's max and sum in one pass (see `SoftmaxOnline`).
    let plan = Analysis::new(&cx, sched.chunks.is_some(), sched.cluster > 1)?;
    let split = if sched.cluster > 1 { Some(Split::new(&plan, &sched, &cx)?) } else { None };
    // A sampled shift bounds the statistics' relative error by about `ε·n_w` (the shift is a
    // mean of the warp's own values, so `(mean − m₀)² ≤ n_w·var`): far below a 16-bit output's
    // rounding, not below an f32's.
    if sched.sampled_shift && !sampled_shift_applies(&cx, &plan, &sched)? {
        return Err(cx.unsupported("a sampled LayerNorm shift needs whole cluster slices and 16-bit outputs"));
    }
    let width = cx.index_width();
    let entry = cx.entry();
    let block = sched.threads_per_row * sched.rows_per_cta;
    let min_ctas = occupancy(&cx.data.body, sched, split.as_ref().map(|s| (s.stage_bytes + CLUSTER_SCRATCH_BYTES, s.staged.len() as u32)), target);
    let dynamic = std::cell::Cell::new(0u32);
    let (ptx, params) = build_twice_occupancy(&cx, target, &entry, block, min_ctas, width, |kb, sizes| {
        let n_in = cx.data.inputs.len();
        let mut pbufs = Vec::with_capacity(n_in);
        for i in 0..n_in {
            pbufs.push(cx.buf(kb, i)?);
        }
        let mut obufs = Vec::with_capacity(plan.outs.len());
        for o in &plan.outs {
            let mut b = cx.buf(kb, o.buffer)?;
            b.strides = o.strides.clone();
            obufs.push(b);
        }
        if sched.cluster > 1 {
            kb.set_cluster_dims([1, sched.cluster, 1])?;
        }
        if block >= 1024 {
            // `.minnctapersm 1` at 1024 threads too: without it ptxas 12.9 may aim at two CTAs
            // an SM (32 registers) and spill the one-read schedule's 16 elements a thread.
            kb.set_min_ctas_per_sm(1);
        }
        let mut ev = Eval::new(kb, sizes, &cx.data.body, pbufs, width);
        ev.bf16_words = super::element::words_params(&cx.data.body);
        if sched.sampled_shift {
            // The bf16x2 `fma` of a LayerNorm's last step reads its weight and bias as loaded.
            ev.ln_bf16_fma = true;
            let body = &cx.data.body;
            for (_, nd) in body.nodes.iter().filter(|(_, nd)| nd.op.kind == OpKind::LayerNorm) {
                for &v in nd.inputs.iter().skip(1) {
                    if let ValueDef::Param(i) = body.values[v].def {
                        ev.bf16_words.remove(&i);
                    }
                }
            }
        }
        ev.pair_rounding = true;
        let em = Emitter { plan: &plan, sched, obufs, split: split.clone(), dsmem: Cell::new(None), dsmem_used: Cell::new(0), crow: Cell::new(None), groups: Cell::new(0), head: RefCell::new(None), held: RefCell::new(Vec::new()) };
        em.emit(&mut ev)?;
        dynamic.set(em.dsmem_used.get());
        Ok(())
    })?;
    let shared_bytes = dynamic.get();
    if shared_bytes > target.max_shared_memory_per_block() {
        return Err(cx.unsupported(format!("{shared_bytes} bytes of shared memory exceed {target}'s limit")));
    }
    let rows = Dim::product(&plan.lead);
    Ok(LaunchPlan {
        entry,
        ptx,
        target: *target,
        grid: [
            if sched.persistent > 0 {
                let g = sched.persistent;
                // A constant row count smaller than the persistent grid: a cluster a row.
                GridDim::fixed(rows.as_const().map_or(g, |r| g.min(u32::try_from(r.max(1)).unwrap_or(g))))
            } else { GridDim { numerator: rows, denominator: sched.rows_per_cta } },
            GridDim::fixed(sched.cluster),
            GridDim::fixed(1),
        ],
        block: [block, 1, 1],
        shared_bytes,
        params,
    })
}
