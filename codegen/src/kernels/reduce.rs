//! The row-reduction family ([`Family::RowReduction`]): reductions over the last axis with a
//! fused element-wise prologue and epilogue — `reduce_sum`/`reduce_max`/`reduce_min`/
//! `reduce_mean`, `softmax`, `log_softmax`, `rms_norm`, `layer_norm`, and any combination of
//! them over the same rows (a decomposed softmax or LayerNorm stays one kernel).
//!
//! # What a kernel computes
//! Every row node reduces the last axis of an operand of one shape `[L…, N]` (the *row
//! space*; `N` any length: 1, 17, 1000, 3420, 4096, 262144, or a symbol; any number of rows
//! `R = ΠL`). The body's outputs are *row values* (shape `[L…, N]`, written per element) or
//! *row scalars* (`[L…, 1]` or `[L…]`, written once per row); prologue and epilogue ops are
//! evaluated element by element by the `element.rs` evaluator, a row node's result
//! being read through its row statistics. Numerics (DESIGN.md, "Numerical conventions"):
//!
//! - statistics in f32 (integer sums, maxima and minima in i64, saturated to the dtype);
//! - `softmax` is safe: `m = max x` (NaN-propagating: `max.NaN.f32`, never `fmaxf`),
//!   `e = 2^((x − m)·log2e)` (`ex2.approx`), `out = e · (1/Σe)`; a row of
//!   all −inf gives 0 (`log_softmax`: −inf), a NaN anywhere gives a NaN row, a +inf gives
//!   NaN (`inf − inf`), as the interpreter does;
//! - `log_softmax = (x − m) − log Σe` with the precise [`crate::math::log`];
//! - `rms_norm`: `r = 1/√(Σx²/N + eps)` with `eps` rounded to f32 and added in f32,
//!   `out = round(round(x·r)·w)` (a zero row gives 0); `layer_norm`: two passes over the row
//!   (mean₀ = Σx/N, then `Σ(x − mean₀)` and `Σ(x − mean₀)²` together: the corrected two-pass
//!   algorithm, mean = mean₀ + d, var = Σ(x−mean₀)²/N − d², accurate even for rows with a
//!   large mean and a small spread; no Welford), `out = round(round((x−mean)·r)·w + b)`. In
//!   the one-read schedule the same corrected two-pass runs per warp on the values in
//!   registers (shuffles only) and the warps' `(count, mean, M2)` are merged once through
//!   shared memory with Chan et al.'s parallel formula (one barrier; see `LnFused`).
//!
//! # Schedule ([`RowSchedule`])
//! A row is reduced by one warp (short rows: `N ≤ 64·vec`, four rows per 128-thread CTA) or
//! one CTA of 64 to 1024 threads (`vec` = 16 bytes of the narrowest row buffer: 8 `bf16`, 4
//! `f32`, halved until it divides `N`). Each thread reduces its elements sequentially, then
//! the row group combines the per-thread partials with butterfly shuffles (`shfl.sync.bfly`,
//! CUDA C Programming Guide §7.22, PTX ISA §9.7.8.6) and, across warps, through shared memory
//! (each warp's result in `smem[warp]`, a barrier, and every thread combining the `T/32`
//! partials in the same order, so all threads hold the same bits — as Triton's reduce lowering
//! does: thread → warp shuffle → shared memory). Rows are looped over grid-stride.
//!
//! - **One read** (`N` constant, at most 32 elements per thread, 16 with 1024 threads; e.g.
//!   `N = 4096` `bf16`: 256 threads × 2 vectors of 8): the thread's elements are loaded once
//!   (16-byte vectors where proven) and stay in registers through every reduction level and
//!   the output pass. Elements past the row end (a partial last vector group) are read at a
//!   clamped in-bounds address and masked out of the statistics and the stores.
//! - **Multi-pass** (longer rows, e.g. `N ≥ 32k` `bf16`, or a symbolic `N`): 512 threads (256
//!   for a symbolic `N`) loop over the row once per reduction level, then once for the
//!   outputs, `unroll` vectors per thread per iteration. `softmax`/`log_softmax` take one
//!   level: for rows of at least 65536 elements or a symbolic length, the online softmax (Milakov & Gimelshein 2018, `SoftmaxOnline`) keeps a running
//!   max and a sum rescaled by `e^(m_old − m_new)`, so the row is read twice (statistics,
//!   outputs) rather than three times; `−inf` parts contribute 0 (the shift is 0 where the
//!   max is −inf), a NaN or +inf makes the sum NaN, as in the two-pass form.
//!
//! A reduction *level* is a set of statistics that can be computed in the same pass: a
//! statistic's level is one more than the deepest statistic its input depends on (softmax's
//! sum depends on its max; LayerNorm's variance on its mean; a reduction of a softmax on the
//! softmax's sum).

use std::collections::HashMap;

use inkwell::values::{FloatValue, IntValue};
use inkwell::IntPredicate;
use sinter_ir::{DType, Dim, Family, Function, GridDim, Kernel, KernelGraph, LaunchPlan, Layout, Node, OpKind, Value, ValueDef};

use super::element::{divisible, At, Ax, Buf, Eval, RowScalars, Scalar, Tag};
use super::{build_twice_occupancy, KernelCtx};
use crate::emit::Combine;
use crate::math::{self, Ops, R};
use crate::target::Target;
use crate::CodegenError;

/// How rows are mapped to threads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RowSchedule {
    /// Threads reducing one row: 32 (a warp) or a multiple of 32 up to 1024 (a CTA).
    pub threads_per_row: u32,
    /// Rows per CTA: `128 / 32` in warp mode, 1 in CTA mode.
    pub rows_per_cta: u32,
    /// Consecutive elements per thread per step (a power of two; `N` must be provably a
    /// multiple of it, or it is 1).
    pub vec: u32,
    /// `Some(c)`: the one-read schedule, `c` vectors per thread (requires a constant `N ≤
    /// c·vec·threads_per_row`); `None`: the multi-pass loop.
    pub chunks: Option<u32>,
    /// Vectors per thread per loop iteration in the multi-pass schedule.
    pub unroll: u32,
}

/// Elements a thread may hold in registers in the one-read schedule.
const MAX_ELEMS_PER_THREAD: u32 = 32;

impl RowSchedule {
    /// The schedule for rows of `n` elements whose narrowest row-varying buffer element is
    /// `min_size` bytes.
    pub fn choose(n: &Dim, min_size: usize) -> RowSchedule {
        let mut vec = (16 / min_size.max(1)).clamp(1, 8) as u32;
        while vec > 1 && !divisible(n, vec) {
            vec /= 2;
        }
        match n.as_const() {
            Some(n) => {
                let n = n.max(0) as u64;
                let groups = n.div_ceil(u64::from(vec));
                if groups <= 64 {
                    let chunks = groups.div_ceil(32) as u32;
                    return RowSchedule { threads_per_row: 32, rows_per_cta: 4, vec, chunks: Some(chunks), unroll: 1 };
                }
                let t = groups.div_ceil(2).next_power_of_two().clamp(64, 1024) as u32;
                let chunks = groups.div_ceil(u64::from(t)) as u32;
                // 1024 threads leave 64 registers a thread: half the elements.
                let limit = if t == 1024 { MAX_ELEMS_PER_THREAD / 2 } else { MAX_ELEMS_PER_THREAD };
                if chunks * vec <= limit {
                    RowSchedule { threads_per_row: t, rows_per_cta: 1, vec, chunks: Some(chunks), unroll: 1 }
                } else {
                    RowSchedule { threads_per_row: 512, rows_per_cta: 1, vec, chunks: None, unroll: 2 }
                }
            }
            None => RowSchedule { threads_per_row: 256, rows_per_cta: 1, vec, chunks: None, unroll: 2 },
        }
    }

    fn check(&self, n: &Dim) -> Result<(), String> {
        let t = self.threads_per_row;
        if !(t == 32 || (t % 32 == 0 && t <= 1024)) || (t > 32 && self.rows_per_cta != 1) || self.rows_per_cta == 0 || t * self.rows_per_cta > 1024 {
            return Err(format!("{t} threads per row × {} rows per CTA", self.rows_per_cta));
        }
        if !self.vec.is_power_of_two() || !divisible(n, self.vec) {
            return Err(format!("vec {} does not divide the row length {n}", self.vec));
        }
        if let Some(c) = self.chunks {
            match n.as_const() {
                Some(nn) if nn as u64 <= u64::from(c) * u64::from(self.vec) * u64::from(t) => {}
                _ => return Err(format!("{c} chunks of {} × {t} do not cover a row of {n}", self.vec)),
            }
        }
        if self.unroll == 0 {
            return Err("unroll 0".into());
        }
        Ok(())
    }
}

/// Generates row-reduction kernel `kernel` of `graph` with [`RowSchedule::choose`].
///
/// Parameters: the kernel's buffers, then its symbolic sizes. Grid `(⌈R / rows_per_cta⌉, 1,
/// 1)` (rows are also looped over, grid-stride), block `(threads_per_row·rows_per_cta, 1,
/// 1)`, static shared memory only.
///
/// # Errors
/// [`CodegenError::Unsupported`] when a reduction is not over the last axis, the reductions
/// have different row shapes, or an output is neither a row value nor a row scalar;
/// [`CodegenError::BadKernel`] for a body that does not match its buffers.
pub fn generate(graph: &KernelGraph, kernel: Kernel, target: &Target) -> Result<LaunchPlan, CodegenError> {
    generate_with(graph, kernel, target, None)
}

/// As [`generate`] with a chosen schedule (`None`: [`RowSchedule::choose`]).
///
/// # Errors
/// As [`generate`]; [`CodegenError::Unsupported`] for a schedule that does not fit the rows.
pub fn generate_with(graph: &KernelGraph, kernel: Kernel, target: &Target, schedule: Option<RowSchedule>) -> Result<LaunchPlan, CodegenError> {
    let cx = KernelCtx::new(graph, kernel)?;
    if cx.data.family != Family::RowReduction {
        return Err(cx.bad(format!("a {:?} kernel given to the row-reduction generator", cx.data.family)));
    }
    let plan = Analysis::new(&cx, false)?;
    let min_size = plan.min_row_elem_size(&cx)?;
    let sched = schedule.unwrap_or_else(|| RowSchedule::choose(&plan.n, min_size));
    sched.check(&plan.n).map_err(|e| cx.unsupported(format!("schedule: {e}")))?;
    // The one-read schedule computes a LayerNorm's statistics in one level (see `LnFused`);
    // the multi-pass one a softmax's max and sum in one pass (see `SoftmaxOnline`).
    let plan = Analysis::new(&cx, sched.chunks.is_some())?;
    let width = cx.index_width();
    let entry = cx.entry();
    let block = sched.threads_per_row * sched.rows_per_cta;
    let min_ctas = occupancy(&cx.data.body, sched);
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
        let mut ev = Eval::new(kb, sizes, &cx.data.body, pbufs, width);
        Emitter { plan: &plan, sched, obufs }.emit(&mut ev)
    })?;
    let rows = Dim::product(&plan.lead);
    Ok(LaunchPlan {
        entry,
        ptx,
        target: target.name().to_owned(),
        grid: [GridDim { numerator: rows, denominator: sched.rows_per_cta }, GridDim::fixed(1), GridDim::fixed(1)],
        block: [block, 1, 1],
        shared_bytes: 0,
        params,
    })
}

/// The CTAs per SM asked of ptxas (`.minnctapersm`). The one-read schedule holds a CTA's
/// row in registers from its loads to its stores, through every reduction level; the SM's
/// memory pipe is kept full only by the other CTAs resident meanwhile, so occupancy is what
/// its bandwidth depends on (at 256 threads: 60 registers allow 4 CTAs, 48 five, 40 six).
/// With at most 16 elements per thread, ask for a register budget of 40 a thread (48 with a
/// `layer_norm`, whose centred values and two extra statistics need more); otherwise 1,
/// ptxas's own choice.
fn occupancy(body: &Function, s: RowSchedule) -> u32 {
    let Some(c) = s.chunks else { return 1 };
    let block = s.threads_per_row * s.rows_per_cta;
    if s.threads_per_row < 128 || c * s.vec > 16 || block > 512 {
        return 1;
    }
    let heavy = body.nodes.iter().any(|(_, nd)| nd.op.kind == OpKind::LayerNorm);
    let regs = if heavy { 48 } else { 40 };
    (65536 / (block * regs)).clamp(1, 2048 / block)
}

/// A per-row statistic: one reduction over the row of an element expression.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum StatKind {
    /// `reduce_*` of its operand (`op` Sum also serves `reduce_mean`).
    Reduce(Combine),
    /// `softmax`/`log_softmax`: the max of x.
    SoftmaxMax,
    /// `softmax`/`log_softmax`: Σ e^(x − m).
    SoftmaxSum,
    /// `rms_norm`: Σ x².
    SumSquares,
    /// `layer_norm`: Σ x.
    LnSum,
    /// `layer_norm`: Σ (x − mean₀), the correction of the first pass's mean.
    LnDev,
    /// `layer_norm`: Σ (x − mean₀)².
    LnVar,
    /// `layer_norm` in the one-read schedule, all its statistics in one level: per warp, the
    /// corrected two-pass on the values in registers (shuffles only), then the warps'
    /// `(count, mean, M2)` merged once through shared memory (Chan, Golub & LeVeque's
    /// parallel formula): one barrier instead of two.
    LnFused,
    /// `softmax`/`log_softmax` in the multi-pass schedule: the max and Σe in one pass over
    /// the row (online softmax, Milakov & Gimelshein 2018): a running `(m, s)` per thread,
    /// `s` rescaled by `e^(m_old − m_new)` when the max grows, merged across lanes and warps
    /// the same way. Two accumulators (`m`, then `s`).
    SoftmaxOnline,
}

#[derive(Clone, Copy, Debug)]
struct Stat {
    node: Node,
    kind: StatKind,
    level: usize,
    /// Accumulated in i64 (an integer reduction).
    int: bool,
}

impl Stat {
    fn combine(&self) -> Combine {
        match self.kind {
            StatKind::Reduce(c) => c,
            StatKind::SoftmaxMax => Combine::Max,
            _ => Combine::Sum,
        }
    }
}

/// What an output is in the row space.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum OutKind {
    /// `[L…, N]`: one value per element.
    Row,
    /// `[L…, 1]`: one value per row.
    ScalarKeep,
    /// `[L…]`: one value per row.
    Scalar,
}

struct Out {
    value: Value,
    buffer: usize,
    strides: Vec<Dim>,
    kind: OutKind,
}

/// The row space, the statistics by level, the outputs.
struct Analysis {
    lead: Vec<Dim>,
    n: Dim,
    stats: Vec<Stat>,
    levels: usize,
    outs: Vec<Out>,
}

fn is_row_node(k: OpKind) -> bool {
    use OpKind::*;
    matches!(k, ReduceSum | ReduceMax | ReduceMin | ReduceMean | Softmax | LogSoftmax | RmsNorm | LayerNorm)
}

/// The shortest constant row length for which the multi-pass schedule computes a softmax's max
/// and sum in one (online) pass.
const ONLINE_SOFTMAX_MIN_ROW: i64 = 65536;

impl Analysis {
    /// `fused_ln` (the one-read schedule): a `layer_norm` is one [`StatKind::LnFused`]
    /// statistic rather than three over two levels; otherwise (multi-pass) a softmax over rows
    /// of at least [`ONLINE_SOFTMAX_MIN_ROW`] (or of a symbolic length) is one
    /// [`StatKind::SoftmaxOnline`] rather than two over two levels.
    fn new(cx: &KernelCtx<'_>, fused_ln: bool) -> R<Analysis> {
        let body = &cx.data.body;
        let mut sref: Option<Vec<Dim>> = None;
        let mut row_nodes = Vec::new();
        for (n, nd) in body.nodes.iter() {
            if !is_row_node(nd.op.kind) {
                continue;
            }
            let x = *nd.inputs.first().ok_or_else(|| cx.bad(format!("{n} has no operand")))?;
            let xs = body.ty(x).shape.clone();
            if xs.is_empty() {
                return Err(cx.unsupported(format!("{n} `{}` of a scalar", nd.op.kind.name())));
            }
            if let Some(a) = nd.op.int("axis") {
                let ax = sinter_ir::infer::norm_axis(a, xs.len()).map_err(|e| cx.bad(format!("{n}: {e}")))?;
                if ax + 1 != xs.len() {
                    return Err(cx.unsupported(format!("{n} `{}` reduces axis {a}, not the last (the passes move it last)", nd.op.kind.name())));
                }
            }
            match &sref {
                None => sref = Some(xs),
                Some(s) if *s == xs => {}
                Some(s) => {
                    return Err(cx.unsupported(format!(
                        "{n} reduces rows of {} but another row node rows of {}",
                        super::element::shape_text(&xs),
                        super::element::shape_text(s)
                    )))
                }
            }
            row_nodes.push(n);
        }
        let Some(sref) = sref else {
            return Err(cx.unsupported("no reduction in a row-reduction kernel"));
        };
        let k = sref.len() - 1;
        let lead = sref[..k].to_vec();
        let n = sref[k].clone();
        // The online softmax for long rows (or a symbolic length): it saves a read of the row,
        // which pays where the row does not stay in L2 (measured on the H200: 44% → 55% of copy
        // at 262144 columns), but costs more than the second read from L2 at 32768 (79% → 69%).
        let online = n.as_const().is_none_or(|c| c >= ONLINE_SOFTMAX_MIN_ROW);
        // Levels.
        let mut final_level: HashMap<Node, usize> = HashMap::new();
        let mut stats = Vec::new();
        for &node in &row_nodes {
            let nd = &body.nodes[node];
            let mut dep = 0;
            for &i in &nd.inputs {
                dep = dep.max(depth(body, i, &final_level));
            }
            let int = !body.ty(nd.inputs[0]).dtype.is_float();
            use OpKind::*;
            let (kinds, fin): (Vec<(StatKind, usize)>, usize) = match nd.op.kind {
                ReduceSum | ReduceMean => (vec![(StatKind::Reduce(Combine::Sum), dep + 1)], dep + 1),
                ReduceMax => (vec![(StatKind::Reduce(Combine::Max), dep + 1)], dep + 1),
                ReduceMin => (vec![(StatKind::Reduce(Combine::Min), dep + 1)], dep + 1),
                Softmax | LogSoftmax if !fused_ln && online => (vec![(StatKind::SoftmaxOnline, dep + 1)], dep + 1),
                Softmax | LogSoftmax => (vec![(StatKind::SoftmaxMax, dep + 1), (StatKind::SoftmaxSum, dep + 2)], dep + 2),
                RmsNorm => (vec![(StatKind::SumSquares, dep + 1)], dep + 1),
                _ if fused_ln => (vec![(StatKind::LnFused, dep + 1)], dep + 1),
                _ => (vec![(StatKind::LnSum, dep + 1), (StatKind::LnDev, dep + 2), (StatKind::LnVar, dep + 2)], dep + 2),
            };
            if int && !matches!(nd.op.kind, ReduceSum | ReduceMax | ReduceMin) {
                return Err(cx.bad(format!("{node} `{}` of an integer tensor", nd.op.kind.name())));
            }
            for (kind, level) in kinds {
                stats.push(Stat { node, kind, level, int });
            }
            final_level.insert(node, fin);
        }
        let levels = stats.iter().map(|s| s.level).max().unwrap_or(0);
        // Outputs (trailing reshapes of contiguous outputs peeled).
        let n_in = cx.data.inputs.len();
        let mut lead1 = lead.clone();
        lead1.push(Dim::constant(1));
        let mut outs = Vec::new();
        for (j, &o) in body.outputs.iter().enumerate() {
            let b = cx.buffer(n_in + j)?;
            let mut value = o;
            let mut strides = b.layout.strides.clone();
            let contiguous = Layout::contiguous(&b.ty.shape).strides == strides;
            loop {
                let sh = &body.ty(value).shape;
                if *sh == sref || *sh == lead1 || *sh == lead {
                    break;
                }
                let ValueDef::Result(nn, _) = body.values[value].def else { break };
                let nd = &body.nodes[nn];
                if !contiguous || nd.op.kind != OpKind::Reshape {
                    break;
                }
                value = nd.inputs[0];
                strides = Layout::contiguous(&body.ty(value).shape).strides;
            }
            let sh = &body.ty(value).shape;
            let kind = if *sh == sref {
                OutKind::Row
            } else if *sh == lead1 {
                OutKind::ScalarKeep
            } else if *sh == lead {
                OutKind::Scalar
            } else {
                return Err(cx.unsupported(format!(
                    "output {j} has shape {}, neither the rows {} nor one value per row",
                    super::element::shape_text(sh),
                    super::element::shape_text(&sref)
                )));
            };
            outs.push(Out { value, buffer: n_in + j, strides, kind });
        }
        Ok(Analysis { lead, n, stats, levels, outs })
    }

    /// The narrowest element of the buffers read or written along the rows.
    fn min_row_elem_size(&self, cx: &KernelCtx<'_>) -> R<usize> {
        let body = &cx.data.body;
        let mut m = usize::MAX;
        if !self.n.is_one() {
            for (i, &p) in body.params.iter().enumerate() {
                if body.ty(p).shape.last() == Some(&self.n) {
                    m = m.min(cx.buffer(i)?.ty.dtype.size_bytes());
                }
            }
        }
        for o in &self.outs {
            if o.kind == OutKind::Row {
                m = m.min(cx.buffer(o.buffer)?.ty.dtype.size_bytes());
            }
        }
        Ok(if m == usize::MAX { 4 } else { m })
    }
}

/// The deepest final level of a row node `v` depends on (0 if none), stopping at row nodes.
fn depth(body: &Function, v: Value, final_level: &HashMap<Node, usize>) -> usize {
    let mut best = 0;
    let mut stack = vec![v];
    let mut seen = std::collections::HashSet::new();
    while let Some(v) = stack.pop() {
        if !seen.insert(v) {
            continue;
        }
        if let ValueDef::Result(n, _) = body.values[v].def {
            if let Some(&l) = final_level.get(&n) {
                best = best.max(l);
                continue;
            }
            stack.extend(body.nodes[n].inputs.iter().copied());
        }
    }
    best
}

/// Row statistics of a node waiting for the rest of its statistics: softmax's `(m, m is −inf,
/// m_safe)`, layer_norm's mean correction `d`.
struct Pending<'ctx> {
    softmax: HashMap<Node, (FloatValue<'ctx>, IntValue<'ctx>, FloatValue<'ctx>)>,
    ln: HashMap<Node, FloatValue<'ctx>>,
}

struct Emitter<'p, 'ctx> {
    plan: &'p Analysis,
    sched: RowSchedule,
    obufs: Vec<Buf<'ctx>>,
}

/// A chunk of a thread's share of a row: its coordinate and whether it is inside the row.
struct Chunk<'ctx> {
    at: At<'ctx>,
    valid: Option<IntValue<'ctx>>,
}

/// A statistic's running value.
#[derive(Clone, Copy)]
enum Acc<'ctx> {
    F(FloatValue<'ctx>),
    I(IntValue<'ctx>),
}

impl<'p, 'ctx> Emitter<'p, 'ctx> {
    fn emit(&self, ev: &mut Eval<'_, 'ctx>) -> R<()> {
        let ity = ev.ity();
        let s = self.sched;
        let tid = ev.kb.tid_x()?;
        let ctaid = ev.kb.ctaid_x()?;
        let nctaid = ev.kb.nctaid_x()?;
        let rows = ev.dim(&Dim::product(&self.plan.lead))?;
        let nv = ev.dim(&self.plan.n)?;
        let rpc = u64::from(s.rows_per_cta);
        let (t, row0, rstride, warp, lane) = ev.kb.in_prologue(|kb| {
            let z = |v| kb.b.build_int_z_extend_or_bit_cast(v, ity, "w");
            let (tid, ctaid, nctaid) = (z(tid)?, z(ctaid)?, z(nctaid)?);
            let c32 = ity.const_int(32, false);
            let lane = kb.b.build_int_unsigned_rem(tid, c32, "lane")?;
            let warp = kb.b.build_int_unsigned_div(tid, c32, "warp")?;
            let rpc_v = ity.const_int(rpc, false);
            if s.threads_per_row == 32 {
                let row0 = kb.b.build_int_add(kb.b.build_int_mul(ctaid, rpc_v, "r")?, warp, "row0")?;
                let rs = kb.b.build_int_mul(nctaid, rpc_v, "rs")?;
                Ok((lane, row0, rs, warp, lane))
            } else {
                Ok((tid, ctaid, nctaid, warp, lane))
            }
        })?;
        // Row loop.
        let pre = ev.kb.current_block()?;
        let header = ev.kb.block("row");
        let body = ev.kb.block("row_body");
        let exit = ev.kb.block("exit");
        ev.kb.br(header)?;
        ev.kb.position(header);
        let r = ev.kb.b.build_phi(ity, "r")?;
        r.add_incoming(&[(&row0, pre)]);
        let rv = r.as_basic_value().into_int_value();
        let more = ev.kb.b.build_int_compare(IntPredicate::ULT, rv, rows, "more")?;
        ev.kb.cond_br(more, body, exit)?;
        ev.kb.position(body);
        ev.forget();
        ev.rows.clear();
        self.row(ev, rv, t, nv, warp, lane)?;
        if s.threads_per_row > 32 {
            // The next row's partials reuse the shared memory.
            ev.kb.barrier()?;
        }
        let next = ev.iadd(rv, rstride)?;
        let latch = ev.kb.current_block()?;
        r.add_incoming(&[(&next, latch)]);
        ev.kb.br(header)?;
        ev.kb.position(exit);
        ev.kb.ret()
    }

    /// The lead coordinates of row `r` (innermost first), tagged as the row space's axes.
    fn lead_axes(&self, ev: &mut Eval<'_, 'ctx>, r: IntValue<'ctx>) -> R<Vec<Ax<'ctx>>> {
        let lead = &self.plan.lead;
        let mut axes = vec![ev.zero_ax(); lead.len()];
        let mut rem = r;
        for i in (0..lead.len()).rev() {
            let d = &lead[i];
            if d.is_one() {
                axes[i] = Ax { tag: Tag::Ref(i), ..ev.zero_ax() };
                continue;
            }
            let outer_one = lead[..i].iter().all(Dim::is_one);
            let (c, next) = if outer_one {
                (rem, rem)
            } else {
                let dv = ev.dim(d)?;
                (ev.irem(rem, dv)?, ev.idiv(rem, dv)?)
            };
            axes[i] = Ax { base: c, step: false, aligned: false, zero: false, tag: Tag::Ref(i) };
            rem = next;
        }
        Ok(axes)
    }

    /// The coordinate of the vector starting at row element `j` (clamped to 0 when invalid).
    fn chunk(&self, ev: &mut Eval<'_, 'ctx>, lead: &[Ax<'ctx>], j: IntValue<'ctx>, nv: IntValue<'ctx>, always_valid: bool) -> R<Chunk<'ctx>> {
        let (base, valid) = if always_valid {
            (j, None)
        } else {
            let ok = ev.ilt(j, nv)?;
            let z = ev.ic(0);
            (ev.kb.b.build_select(ok, j, z, "j")?.into_int_value(), Some(ok))
        };
        let mut axes = lead.to_vec();
        let k = lead.len();
        axes.push(Ax { base, step: self.sched.vec > 1, aligned: true, zero: false, tag: Tag::Ref(k) });
        Ok(Chunk { at: At { axes, lanes: self.sched.vec }, valid })
    }

    fn row(&self, ev: &mut Eval<'_, 'ctx>, r: IntValue<'ctx>, t: IntValue<'ctx>, nv: IntValue<'ctx>, warp: IntValue<'ctx>, lane: IntValue<'ctx>) -> R<()> {
        let s = self.sched;
        let lead = self.lead_axes(ev, r)?;
        let tv = u64::from(s.threads_per_row) * u64::from(s.vec);
        // The one-read schedule's chunks, made once so that every level reuses the loads.
        let chunks: Option<Vec<Chunk<'ctx>>> = match s.chunks {
            Some(c) => {
                let mut v = Vec::with_capacity(c as usize);
                let n_const = self.plan.n.as_const().unwrap_or(0).max(0) as u64;
                for ci in 0..c {
                    let off = ev.ic((u64::from(ci) * tv) as i64);
                    let tj = ev.imul(t, ev.ic(i64::from(s.vec)))?;
                    let j = ev.iadd(off, tj)?;
                    let always = (u64::from(ci) + 1) * tv <= n_const;
                    v.push(self.chunk(ev, &lead, j, nv, always)?);
                }
                Some(v)
            }
            None => None,
        };
        // Pending softmax / layer-norm pieces.
        let mut pending_m = Pending { softmax: HashMap::new(), ln: HashMap::new() };
        for level in 1..=self.plan.levels {
            let all: Vec<Stat> = self.plan.stats.iter().copied().filter(|st| st.level == level).collect();
            let (fused, stats): (Vec<Stat>, Vec<Stat>) = all.into_iter().partition(|st| st.kind == StatKind::LnFused);
            if let Some(chs) = &chunks {
                for st in &fused {
                    self.layer_norm_fused(ev, st, chs, warp, nv)?;
                }
            }
            let (online, stats): (Vec<Stat>, Vec<Stat>) = stats.into_iter().partition(|st| st.kind == StatKind::SoftmaxOnline);
            if !online.is_empty() {
                // Multi-pass only: one pass for the online statistics.
                let acc = self.loop_level(ev, &online, &lead, t, nv)?;
                for (i, st) in online.iter().enumerate() {
                    let (Some(Acc::F(m)), Some(Acc::F(sm))) = (acc.get(2 * i).copied(), acc.get(2 * i + 1).copied()) else {
                        return Err(CodegenError::Builder("online softmax accumulators".into()));
                    };
                    self.softmax_online_finish(ev, st, m, sm, warp)?;
                }
            }
            if stats.is_empty() {
                continue;
            }
            let partials = match &chunks {
                Some(chs) => {
                    let mut acc = self.identities(ev, &stats);
                    for ch in chs {
                        acc = self.accumulate(ev, &stats, ch, acc)?;
                    }
                    acc
                }
                None => self.loop_level(ev, &stats, &lead, t, nv)?,
            };
            let totals = self.combine_group(ev, &stats, partials, level, warp, lane)?;
            for (st, tot) in stats.iter().zip(totals) {
                self.finish_stat(ev, st, tot, nv, &mut pending_m)?;
            }
        }
        // Outputs.
        let row_outs: Vec<usize> = (0..self.plan.outs.len()).filter(|&i| self.plan.outs[i].kind == OutKind::Row).collect();
        match &chunks {
            Some(chs) => {
                for ch in chs {
                    let mut vals = Vec::new();
                    for &i in &row_outs {
                        vals.push(ev.eval(self.plan.outs[i].value, &ch.at)?);
                    }
                    self.guarded(ev, ch.valid, |ev| {
                        for (&i, v) in row_outs.iter().zip(&vals) {
                            ev.store(&self.obufs[i], &ch.at, v)?;
                        }
                        Ok(())
                    })?;
                }
            }
            None if !row_outs.is_empty() => self.loop_outputs(ev, &row_outs, &lead, t, nv)?,
            None => {}
        }
        // Row scalars, written by the row group's thread 0.
        let scalar_outs: Vec<usize> = (0..self.plan.outs.len()).filter(|&i| self.plan.outs[i].kind != OutKind::Row).collect();
        if !scalar_outs.is_empty() {
            let mut vals = Vec::new();
            let mut ats = Vec::new();
            for &i in &scalar_outs {
                let o = &self.plan.outs[i];
                let mut axes = lead.clone();
                if o.kind == OutKind::ScalarKeep {
                    axes.push(ev.zero_ax());
                }
                let at = At { axes, lanes: 1 };
                vals.push(ev.eval(o.value, &at)?);
                ats.push(at);
            }
            let first = ev.kb.b.build_int_compare(IntPredicate::EQ, t, ev.ic(0), "t0")?;
            self.guarded(ev, Some(first), |ev| {
                for ((&i, v), at) in scalar_outs.iter().zip(&vals).zip(&ats) {
                    ev.store(&self.obufs[i], at, v)?;
                }
                Ok(())
            })?;
        }
        Ok(())
    }

    /// Runs `f` under `if cond` (always when `None`).
    fn guarded(&self, ev: &mut Eval<'_, 'ctx>, cond: Option<IntValue<'ctx>>, f: impl FnOnce(&mut Eval<'_, 'ctx>) -> R<()>) -> R<()> {
        match cond {
            None => f(ev),
            Some(c) => {
                let then = ev.kb.block("then");
                let join = ev.kb.block("join");
                ev.kb.cond_br(c, then, join)?;
                ev.kb.position(then);
                f(ev)?;
                ev.kb.br(join)?;
                ev.kb.position(join);
                Ok(())
            }
        }
    }

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

    fn identities(&self, ev: &Eval<'_, 'ctx>, stats: &[Stat]) -> Vec<Acc<'ctx>> {
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
    fn online_merge(&self, ev: &mut Eval<'_, 'ctx>, ma: FloatValue<'ctx>, sa: FloatValue<'ctx>, mb: FloatValue<'ctx>, sb: FloatValue<'ctx>) -> R<(FloatValue<'ctx>, FloatValue<'ctx>)> {
        let m = ev.kb.combine_f32(Combine::Max, ma, mb)?;
        let ninf = ev.kb.f32c(f32::NEG_INFINITY);
        let all = ev.kb.feq(m, ninf)?;
        let zero = ev.kb.f32c(0.0);
        let ms = ev.kb.fsel(all, zero, m)?;
        let ea = math::exp_shifted(ev.kb, ma, ms)?;
        let eb = math::exp_shifted(ev.kb, mb, ms)?;
        let t = ev.kb.fmul(sb, eb)?;
        Ok((m, ev.kb.ffma(sa, ea, t)?))
    }

    /// The online softmax's row statistics from the threads' `(m, s)`: warp shuffles, then
    /// (CTA mode) shared memory, merged in the same order by every thread.
    fn softmax_online_finish(&self, ev: &mut Eval<'_, 'ctx>, st: &Stat, m: FloatValue<'ctx>, s: FloatValue<'ctx>, warp: IntValue<'ctx>) -> R<()> {
        let (mut m, mut s) = (m, s);
        for off in [16, 8, 4, 2, 1] {
            let mo = ev.kb.shfl_bfly_f32(m, off)?;
            let so = ev.kb.shfl_bfly_f32(s, off)?;
            (m, s) = self.online_merge(ev, m, s, mo, so)?;
        }
        let nw = self.sched.threads_per_row / 32;
        if nw > 1 {
            let f32t = ev.kb.cx.f32_type();
            let arr = ev.kb.shared_array(f32t.into(), 2 * nw, 16, &format!("sm_{}", st.node.as_u32()));
            let i0 = ev.imul(warp, ev.ic(2))?;
            let p = ev.kb.gep(f32t.into(), arr, i0)?;
            ev.kb.store(p, m.into(), 4)?;
            let i1 = ev.iadd(i0, ev.ic(1))?;
            let p = ev.kb.gep(f32t.into(), arr, i1)?;
            ev.kb.store(p, s.into(), 4)?;
            ev.kb.barrier()?;
            let mut acc: Option<(FloatValue<'ctx>, FloatValue<'ctx>)> = None;
            for w in 0..nw {
                let p = ev.kb.gep(f32t.into(), arr, ev.ic(i64::from(2 * w)))?;
                let mw = ev.kb.load(f32t.into(), p, 4)?.into_float_value();
                let p = ev.kb.gep(f32t.into(), arr, ev.ic(i64::from(2 * w + 1)))?;
                let sw = ev.kb.load(f32t.into(), p, 4)?.into_float_value();
                acc = Some(match acc {
                    None => (mw, sw),
                    Some((ma, sa)) => self.online_merge(ev, ma, sa, mw, sw)?,
                });
            }
            (m, s) = acc.ok_or_else(|| CodegenError::Builder("no warps".into()))?;
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
    fn accumulate(&self, ev: &mut Eval<'_, 'ctx>, stats: &[Stat], ch: &Chunk<'ctx>, acc: Vec<Acc<'ctx>>) -> R<Vec<Acc<'ctx>>> {
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
            let scale = math::exp_shifted(ev.kb, m, ms)?;
            let mut part = ev.kb.f32c(-0.0);
            for v in &xs {
                let e = math::exp_shifted(ev.kb, v.f()?, ms)?;
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

    /// The multi-pass schedule's loop over the row for one level.
    fn loop_level(&self, ev: &mut Eval<'_, 'ctx>, stats: &[Stat], lead: &[Ax<'ctx>], t: IntValue<'ctx>, nv: IntValue<'ctx>) -> R<Vec<Acc<'ctx>>> {
        let s = self.sched;
        let ity = ev.ity();
        let init = self.identities(ev, stats);
        let pre = ev.kb.current_block()?;
        let header = ev.kb.block("pass");
        let body = ev.kb.block("pass_body");
        let exit = ev.kb.block("pass_exit");
        ev.kb.br(header)?;
        ev.kb.position(header);
        let it = ev.kb.b.build_phi(ity, "it")?;
        it.add_incoming(&[(&ev.ic(0), pre)]);
        let mut phis = Vec::with_capacity(init.len());
        for a in &init {
            let (phi, v) = match a {
                Acc::F(f) => {
                    let p = ev.kb.b.build_phi(ev.kb.cx.f32_type(), "acc")?;
                    p.add_incoming(&[(f, pre)]);
                    (p, Acc::F(p.as_basic_value().into_float_value()))
                }
                Acc::I(i) => {
                    let p = ev.kb.b.build_phi(ev.kb.cx.i64_type(), "acc")?;
                    p.add_incoming(&[(i, pre)]);
                    (p, Acc::I(p.as_basic_value().into_int_value()))
                }
            };
            phis.push((phi, v));
        }
        let itv = it.as_basic_value().into_int_value();
        let per_iter = i64::from(s.unroll) * i64::from(s.threads_per_row) * i64::from(s.vec);
        let start = ev.imul(itv, ev.ic(per_iter))?;
        let bound = self.loop_bound(ev, nv)?;
        let more = ev.ilt(start, bound)?;
        ev.kb.cond_br(more, body, exit)?;
        ev.kb.position(body);
        ev.forget();
        let mut acc: Vec<Acc<'ctx>> = phis.iter().map(|(_, v)| *v).collect();
        let tj = ev.imul(t, ev.ic(i64::from(s.vec)))?;
        for u in 0..s.unroll {
            let off = ev.ic(i64::from(u) * i64::from(s.threads_per_row) * i64::from(s.vec));
            let j = ev.iadd(start, off)?;
            let j = ev.iadd(j, tj)?;
            let ch = self.chunk(ev, lead, j, nv, false)?;
            acc = self.accumulate(ev, stats, &ch, acc)?;
        }
        let next = ev.iadd(itv, ev.ic(1))?;
        let latch = ev.kb.current_block()?;
        it.add_incoming(&[(&next, latch)]);
        for ((phi, _), a) in phis.iter().zip(&acc) {
            match a {
                Acc::F(f) => phi.add_incoming(&[(f, latch)]),
                Acc::I(i) => phi.add_incoming(&[(i, latch)]),
            }
        }
        ev.kb.br(header)?;
        ev.kb.position(exit);
        ev.forget();
        Ok(phis.iter().map(|(_, v)| *v).collect())
    }

    /// The row length as the multi-pass loops' bound: a constant is made opaque so that
    /// LLVM keeps the loop a loop (see [`crate::emit::KernelBuilder::opaque`]).
    fn loop_bound(&self, ev: &mut Eval<'_, 'ctx>, nv: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        if self.plan.n.as_const().is_some() {
            ev.kb.in_prologue(|kb| kb.opaque(nv))
        } else {
            Ok(nv)
        }
    }

    /// The multi-pass schedule's output pass.
    fn loop_outputs(&self, ev: &mut Eval<'_, 'ctx>, row_outs: &[usize], lead: &[Ax<'ctx>], t: IntValue<'ctx>, nv: IntValue<'ctx>) -> R<()> {
        let s = self.sched;
        let ity = ev.ity();
        let pre = ev.kb.current_block()?;
        let header = ev.kb.block("out");
        let body = ev.kb.block("out_body");
        let exit = ev.kb.block("out_exit");
        ev.kb.br(header)?;
        ev.kb.position(header);
        let it = ev.kb.b.build_phi(ity, "it")?;
        it.add_incoming(&[(&ev.ic(0), pre)]);
        let itv = it.as_basic_value().into_int_value();
        let per_iter = i64::from(s.unroll) * i64::from(s.threads_per_row) * i64::from(s.vec);
        let start = ev.imul(itv, ev.ic(per_iter))?;
        let bound = self.loop_bound(ev, nv)?;
        let more = ev.ilt(start, bound)?;
        ev.kb.cond_br(more, body, exit)?;
        ev.kb.position(body);
        let tj = ev.imul(t, ev.ic(i64::from(s.vec)))?;
        for u in 0..s.unroll {
            ev.forget();
            let off = ev.ic(i64::from(u) * i64::from(s.threads_per_row) * i64::from(s.vec));
            let j = ev.iadd(start, off)?;
            let j = ev.iadd(j, tj)?;
            let ch = self.chunk(ev, lead, j, nv, false)?;
            let mut vals = Vec::new();
            for &i in row_outs {
                vals.push(ev.eval(self.plan.outs[i].value, &ch.at)?);
            }
            self.guarded(ev, ch.valid, |ev| {
                for (&i, v) in row_outs.iter().zip(&vals) {
                    ev.store(&self.obufs[i], &ch.at, v)?;
                }
                Ok(())
            })?;
        }
        let next = ev.iadd(itv, ev.ic(1))?;
        let latch = ev.kb.current_block()?;
        it.add_incoming(&[(&next, latch)]);
        ev.kb.br(header)?;
        ev.kb.position(exit);
        ev.forget();
        Ok(())
    }

    /// Combines the per-thread partials of the row group: warp shuffles, then (CTA mode)
    /// shared memory across warps.
    fn combine_group(&self, ev: &mut Eval<'_, 'ctx>, stats: &[Stat], partials: Vec<Acc<'ctx>>, level: usize, warp: IntValue<'ctx>, lane: IntValue<'ctx>) -> R<Vec<Acc<'ctx>>> {
        let _ = lane;
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
        let f32t = ev.kb.cx.f32_type();
        let i64t = ev.kb.cx.i64_type();
        let nf = stats.iter().filter(|s| !s.int).count() as u32;
        let ni = stats.iter().filter(|s| s.int).count() as u32;
        let fsm = (nf > 0).then(|| ev.kb.shared_array(f32t.into(), nf * nw, 16, &format!("red_f{level}")));
        let ism = (ni > 0).then(|| ev.kb.shared_array(i64t.into(), ni * nw, 16, &format!("red_i{level}")));
        let (mut fi, mut ii) = (0u32, 0u32);
        let mut slots = Vec::with_capacity(stats.len());
        for (st, w) in stats.iter().zip(&warped) {
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
        let mut out = Vec::with_capacity(stats.len());
        for (st, (arr, slot, ty)) in stats.iter().zip(slots) {
            let mut acc: Option<Acc<'ctx>> = None;
            for w in 0..nw {
                let p = ev.kb.gep(ty, arr, ev.ic(i64::from(slot * nw + w)))?;
                let v = ev.kb.load(ty, p, if st.int { 8 } else { 4 })?;
                let v = if st.int { Acc::I(v.into_int_value()) } else { Acc::F(v.into_float_value()) };
                acc = Some(match acc {
                    None => v,
                    Some(a) => self.combine(ev, st.combine(), a, v)?,
                });
            }
            out.push(acc.ok_or_else(|| CodegenError::Builder("no warps".into()))?);
        }
        Ok(out)
    }

    /// A `layer_norm`'s statistics in the one-read schedule ([`StatKind::LnFused`]).
    ///
    /// Warp `w` (`n_w` valid elements, a constant: `N` is) computes `b_w = Σx/n_w` (f32,
    /// shuffles), then `dev_w = Σ(x − b_w)` and `q_w = Σ(x − b_w)²` on the values in
    /// registers (shuffles): its mean is `b_w + dev_w/n_w` and `M2_w = q_w − dev_w²/n_w`, the
    /// corrected two-pass. The warps' `(b_w, dev_w, q_w)` go through shared memory once (one
    /// barrier); every thread then merges them relative to warp 0's `b_0` (Chan et al.: `δ_w
    /// = (b_w − b_0) + dev_w/n_w`, `d = Σ n_w δ_w / N`, `M2 = Σ M2_w + Σ n_w (δ_w − d)²`),
    /// so the row mean is `b_0 + d` without rounding it to one f32 (rows with a large mean
    /// and a small spread stay accurate), and the output reads `(x − b_w) − (d − (b_w −
    /// b_0))` from the centred values already in registers.
    fn layer_norm_fused(&self, ev: &mut Eval<'_, 'ctx>, st: &Stat, chs: &[Chunk<'ctx>], warp: IntValue<'ctx>, nv: IntValue<'ctx>) -> R<()> {
        let s = self.sched;
        let node = st.node;
        let eps = ev.f.nodes[node].op.float("eps").map(|e| e as f32);
        let n = self.plan.n.as_const().ok_or_else(|| CodegenError::Builder("a one-read layer_norm of a symbolic length".into()))?.max(0);
        let nw = s.threads_per_row / 32;
        let tv = i64::from(s.threads_per_row) * i64::from(s.vec);
        let wspan = 32 * i64::from(s.vec);
        // Valid elements of warp `w` of the row group.
        let count = |w: i64| -> i64 { (0..i64::from(chs.len() as u32)).map(|ci| (n - ci * tv - w * wspan).clamp(0, wspan)).sum() };
        let counts: Vec<i64> = (0..i64::from(nw)).map(count).collect();
        // This thread's warp's count (uniform over the warp).
        let n_own = if counts.iter().all(|&c| c == counts[0]) {
            ev.kb.f32c(counts[0].max(1) as f32)
        } else {
            let mut acc = ev.kb.f32c(counts[0].max(1) as f32);
            for (w, &c) in counts.iter().enumerate().skip(1) {
                let is = ev.kb.b.build_int_compare(IntPredicate::EQ, warp, ev.ic(w as i64), "isw")?;
                acc = ev.kb.fsel(is, ev.kb.f32c(c.max(1) as f32), acc)?;
            }
            acc
        };
        // Σx over the warp, its base b_w.
        let sum_st = Stat { kind: StatKind::LnSum, ..*st };
        let mut acc = self.identities(ev, &[sum_st]);
        for ch in chs {
            acc = self.accumulate(ev, &[sum_st], ch, acc)?;
        }
        let Some(Acc::F(sum_t)) = acc.first().copied() else {
            return Err(CodegenError::Builder("layer_norm sum not in f32".into()));
        };
        let sum_w = ev.kb.warp_allreduce_f32(Combine::Sum, sum_t)?;
        let b_w = ev.kb.fdiv(sum_w, n_own)?;
        // Σ(x − b_w) and Σ(x − b_w)² (one `fma` an element) on the registers.
        let (mut dev_t, mut q_t) = (ev.kb.f32c(-0.0), ev.kb.f32c(-0.0));
        for ch in chs {
            let cs = ev.centered(node, b_w, &ch.at)?;
            let (mut dv, mut q) = (dev_t, q_t);
            for c in cs {
                let c = c.f()?;
                dv = ev.kb.fadd(dv, c)?;
                q = ev.kb.ffma(c, c, q)?;
            }
            (dev_t, q_t) = match ch.valid {
                Some(v) => (ev.kb.fsel(v, dv, dev_t)?, ev.kb.fsel(v, q, q_t)?),
                None => (dv, q),
            };
        }
        let dev_w = ev.kb.warp_allreduce_f32(Combine::Sum, dev_t)?;
        let q_w = ev.kb.warp_allreduce_f32(Combine::Sum, q_t)?;
        let f32t = ev.kb.cx.f32_type();
        let nf = ev.kb.b.build_unsigned_int_to_float(nv, f32t, "n")?;
        let (d, m2) = if nw <= 1 {
            let d = ev.kb.fdiv(dev_w, nf)?;
            let m2 = ev.kb.fdiv(q_w, nf)?;
            let nd = ev.kb.fneg(d)?;
            (d, ev.kb.ffma(nd, d, m2)?)
        } else {
            // (b_w, dev_w/n_w, M2_w, 0) of each warp: one 16-byte store, a barrier, 16-byte
            // loads.
            let mw = ev.kb.fdiv(dev_w, n_own)?;
            let ndv = ev.kb.fneg(dev_w)?;
            let m2w = ev.kb.ffma(ndv, mw, q_w)?;
            let v4 = f32t.vec_type(4);
            let arr = ev.kb.shared_array(f32t.into(), 4 * nw, 16, &format!("ln_{}", node.as_u32()));
            let mut v = v4.get_undef();
            for (i, x) in [b_w, mw, m2w, ev.kb.f32c(0.0)].into_iter().enumerate() {
                v = ev.kb.b.build_insert_element(v, x, ev.kb.cx.i32_type().const_int(i as u64, false), "ln")?;
            }
            // The warp index computed again here from `%tid.x` (made opaque): kept from the
            // prologue, its shared address is what ptxas spills at 48 registers.
            let _ = warp;
            let tid = ev.kb.tid_x()?;
            let tid = ev.kb.opaque(tid)?;
            let tid = ev.kb.b.build_int_z_extend_or_bit_cast(tid, ev.ity(), "tid")?;
            let warp = ev.kb.b.build_right_shift(tid, ev.ic(5), false, "warp")?;
            let idx = ev.imul(warp, ev.ic(4))?;
            let p = ev.kb.gep(f32t.into(), arr, idx)?;
            ev.kb.store(p, v.into(), 16)?;
            ev.kb.barrier()?;
            let mut parts = Vec::with_capacity(nw as usize);
            for (w, &c) in counts.iter().enumerate() {
                if c == 0 {
                    continue;
                }
                let p = ev.kb.gep(f32t.into(), arr, ev.ic(4 * w as i64))?;
                let v = ev.kb.load(v4.into(), p, 16)?.into_vector_value();
                let mut e = [f32t.const_zero(); 3];
                for (i, slot) in e.iter_mut().enumerate() {
                    *slot = ev.kb.b.build_extract_element(v, ev.kb.cx.i32_type().const_int(i as u64, false), "ln")?.into_float_value();
                }
                parts.push((c, e));
            }
            let b0 = parts.first().map(|p| p.1[0]).ok_or_else(|| CodegenError::Builder("an empty layer_norm row".into()))?;
            // δ_w = (b_w − b_0) + dev_w/n_w; d = Σ n_w δ_w / N; M2 = Σ M2_w + Σ n_w δ_w² − N d²
            // (δ_0 ≈ 0, so |d| ≤ max |δ_w − δ_0| + |δ_0|: no cancellation that matters).
            let mut sd = ev.kb.f32c(-0.0);
            let mut s2 = ev.kb.f32c(-0.0);
            let mut m2 = ev.kb.f32c(-0.0);
            for (c, [b, mw, m2w]) in &parts {
                let cf = ev.kb.f32c(*c as f32);
                let off = ev.kb.fsub(*b, b0)?;
                let delta = ev.kb.fadd(off, *mw)?;
                let cd = ev.kb.fmul(cf, delta)?;
                sd = ev.kb.fadd(sd, cd)?;
                s2 = ev.kb.ffma(cd, delta, s2)?;
                m2 = ev.kb.fadd(m2, *m2w)?;
            }
            let d = ev.kb.fdiv(sd, nf)?;
            let m2 = ev.kb.fadd(m2, s2)?;
            let nd = ev.kb.fneg(d)?;
            let m2 = ev.kb.fdiv(m2, nf)?;
            let m2 = ev.kb.ffma(nd, d, m2)?;
            // The output centres on this warp's b_w: (x − b_w) − (b_0 + d − b_w) (b_w read
            // back from shared memory rather than kept in a register across the barrier).
            let p = ev.kb.gep(f32t.into(), arr, idx)?;
            let b_own = ev.kb.load(f32t.into(), p, 16)?.into_float_value();
            let own = ev.kb.fsub(b_own, b0)?;
            (ev.kb.fsub(d, own)?, m2)
        };
        let zero = ev.kb.f32c(0.0);
        let var = ev.kb.combine_f32(Combine::Max, m2, zero)?;
        let e = ev.kb.f32c(eps.unwrap_or(0.0));
        let v = ev.kb.fadd(var, e)?;
        let sq = ev.kb.fsqrt(v)?;
        let one = ev.kb.f32c(1.0);
        let r = ev.kb.fdiv(one, sq)?;
        ev.rows.insert(node, RowScalars::LayerNorm { mean: b_w, d, r });
        Ok(())
    }

    /// Turns a statistic's total into the row scalars its node's outputs read.
    fn finish_stat(&self, ev: &mut Eval<'_, 'ctx>, st: &Stat, total: Acc<'ctx>, nv: IntValue<'ctx>, pending: &mut Pending<'ctx>) -> R<()> {
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
