//! How rows are mapped to threads ([`RowSchedule`]): the default choice for a kernel and a
//! target, the checks of an explicit schedule, the autotuning candidates ([`variants`]) and
//! the occupancy each asks ptxas for.
//!
//! Beside the defaults, the candidates try other thread counts and unrolls and three
//! variants of the cluster schedule, none a default:
//! - *staged invariants* (`w` in the name): the row-invariant inputs of the row's length (a
//!   norm's weight and bias, a broadcast mask) copied into shared memory with each row's
//!   prefetch, read from there by every pass;
//! - *held iterations* (`k1`, `k2`): the slice's last loop iterations loaded into registers
//!   rather than staged, so that the stage shrinks and one more CTA fits an SM; offered only
//!   where that puts more rows on an SM;
//! - *persistent clusters* (`p16`, `p14`, …): a fixed grid of clusters loops over the rows,
//!   the output pass refilling each thread's staged chunks with its next row's.
//!
//! Design notes: book/src/design/reductions.md

use sinter_ir::{DType, Dim, Function, OpKind};

use super::analysis::{Analysis, OutKind};
use super::cluster::{Split, CLUSTER_SCRATCH_BYTES};
use crate::kernels::element::divisible;
use crate::kernels::row_order::{one_read, row_vec};
use crate::kernels::ctx::KernelCtx;
use crate::math::R;
use crate::target::Target;

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
    /// CTAs per row: 1, or 2 to 16 (8 by default) for the cluster schedule (sm_90+, multi-pass, a constant
    /// `N`): the row is split into `cluster` slices, one per CTA of a thread-block cluster,
    /// each staged in its CTA's shared memory (see the `reduce` module docs).
    pub cluster: u32,
    /// The cluster schedule only: the *row-invariant* inputs of the row's length (a
    /// `layer_norm`'s weight and bias, an `rms_norm`'s weight) are copied into the CTA's
    /// shared memory with each row's prefetch and read from there (see this module's docs);
    /// `false`: the passes read them from global memory.
    pub stage_invariant: bool,
    /// The cluster schedule only, when not 0: a *persistent* grid of this many clusters
    /// that loop over the rows (grid-stride; fewer when a constant row count is smaller), the
    /// next row's slice copied into the stage by the current row's output pass (each thread
    /// refills the chunks it has just read: no barrier), so a row's DRAM reads overlap the
    /// previous row's statistics and stores; with [`RowSchedule::stage_invariant`] the
    /// row-invariant inputs are staged once, before the first row, rather than once a row.
    /// The count is what [`persistent_clusters`] says fits an H100/H200 or 7/8 of it (the SMs
    /// a cluster may use are those of one GPC, so not every SM can take part).
    pub persistent: u32,
    /// The cluster schedule's LayerNorm over whole slices with 16-bit outputs only: each
    /// warp's shift `m₀` (the corrected two-pass's first mean) is the mean of its first chunk
    /// (`32·vec` elements) rather than of its whole share, so the statistics take one pass over
    /// the stage instead of two (see `Emitter::cluster_level`); and its last step is a
    /// `bf16x2` `fma` (`Eval::ln_bf16_fma`).
    pub sampled_shift: bool,
    /// With [`RowSchedule::sampled_shift`]: the shift `m₀` is the mean of the *row's* first
    /// `k = 32·vec` elements — loaded by every warp of every CTA of the cluster from global
    /// memory before the slice's copies are issued, and summed in the same order (a
    /// butterfly: the same bits everywhere) — rather than each warp's own first chunk. With
    /// one `m₀` for the whole row the statistics are plain sums `Σd`, `Σd²` of `d = x − m₀`,
    /// folded like an RMSNorm's over warps, CTAs and the cluster in `f32` (no Chan merges of
    /// `(n, mean, M2)` triples in `f64`), and the shift no longer waits for the slice's first
    /// copies; the corrected two-pass's `var = Σd²/N − (Σd/N)²`. Since the head is `k` of the
    /// row's `N` values, `(mean − m₀)² ≤ (N − k)/k · var`, so the relative error of `var`
    /// stays about `ε·N/k` (`ε` the `f32` rounding, times the summation's growth): below a
    /// 16-bit output's rounding for rows up to `N/k` = 1024 (262144 `bf16`).
    pub head_shift: bool,
    /// The cluster schedule only, when not 0: the slice's last `held` loop iterations are not
    /// staged but *held in registers* — each thread loads its `held·unroll` vectors of them
    /// with plain 16-byte loads right after issuing the staged iterations' `cp.async` copies
    /// and keeps them from the first pass through the output pass (`held·unroll·16` bytes, 4
    /// registers a vector); every pass loops over the staged iterations and then evaluates
    /// the held ones, unrolled. The stage shrinks by `held` iterations, so that one more CTA
    /// fits an SM's shared memory (a `bf16` row of 262144 over 8 CTAs: 48 KiB staged and
    /// 16 KiB held, four CTAs an SM instead of three at 64 registers a thread instead of 80).
    /// Needs whole slices (`Split::exact`), 16-byte vectors and `held` below the iterations.
    pub held: u32,
}

/// The clusters of `cluster` CTAs, `per_sm` of which fit an SM, that the target's SMs
/// ([`Target::sm_count`]) hold at once when every SM can take part (a grid of a constant size
/// keeps the plan a plain launch). Clusters that do not fit run after the others: correct,
/// slower.
pub fn persistent_clusters(cluster: u32, per_sm: u32, target: &Target) -> u32 {
    (target.sm_count() * per_sm.max(1) / cluster.max(1)).max(1)
}


/// The cluster schedule aims at slices of this many staged bytes per CTA (six CTAs of 256
/// threads per SM then fit the 228 KiB of shared memory of an H100/H200 SM) ...
pub(super) const CLUSTER_SLICE_BYTES: u64 = 32 << 10;
/// ... takes at most this many CTAs per row (the portable cluster size; with 16 each row's
/// statistics fold over twice as many partials and every CTA waits for the slowest of 16,
/// which costs more than twice the CTAs an SM gains) ...
const MAX_CLUSTER: u64 = 8;
/// The largest cluster an explicit schedule may ask for: Hopper's
/// non-portable size, which the runtime allows per kernel at load
/// (`CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED`).
const MAX_CLUSTER_EXPLICIT: u32 = 16;
/// ... and slices of at most this many bytes (two CTAs per SM); longer rows keep the
/// multi-pass schedule.
const MAX_SLICE_BYTES: u64 = 96 << 10;

impl RowSchedule {
    /// The schedule for rows of `n` elements whose narrowest row-varying buffer element is
    /// `min_size` bytes, on `target`. `heavy`: the body has a `layer_norm` (32 elements a
    /// thread in the one-read schedule, which halves its per-row work per element);
    /// `staged_bytes`: the bytes per row element the cluster schedule stages in shared memory
    /// (the row-varying inputs its statistics read); `unstaged`: an input of the row's length
    /// that is not staged (a weight the output pass reads from global memory).

    pub fn choose(n: &Dim, min_size: usize, heavy: bool, target: &Target, staged_bytes: u64, unstaged: bool) -> RowSchedule {
        // The one-read cut is shared with the matmul's norm prologue (`kernels::row_order`),
        // which must sum a row in the same order.
        let vec = row_vec(n, min_size);
        let multi = |threads_per_row| RowSchedule { threads_per_row, rows_per_cta: 1, vec, chunks: None, unroll: 2, cluster: 1, stage_invariant: false, persistent: 0, sampled_shift: false, head_shift: false, held: 0 };
        if let Some(o) = one_read(n, min_size, heavy) {
            return RowSchedule { threads_per_row: o.threads, rows_per_cta: o.rows_per_cta, vec: o.vec, chunks: Some(o.chunks), unroll: 1, ..multi(o.threads) };
        }
        let Some(n) = n.as_const() else { return multi(256) };
        let n = n.max(0) as u64;
        if target.sm_version() >= 90 && staged_bytes > 0 {
            let bytes = n * staged_bytes;
            let c = bytes.div_ceil(CLUSTER_SLICE_BYTES).clamp(2, MAX_CLUSTER);
            let slice = n.div_ceil(c).div_ceil(u64::from(vec)) * u64::from(vec) * staged_bytes;
            if slice <= MAX_SLICE_BYTES {
                // Slices up to 32 KiB: 256 threads, four vectors a loop iteration where the slices
                // are whole iterations of them, else two.
                // Slices over 32 KiB: 512 threads when the output pass also reads a global
                // input (its L2 latency wants more warps to hide it), else 256 threads with
                // four vectors per loop iteration (fewer, longer-running warps).
                // Four vectors only where every slice is whole iterations of them: the bounds
                // checks of a partial one cost the registers (bf16 LayerNorm of 33000 spills).
                let exact4 = n % (c * 4 * 256 * u64::from(vec)) == 0;
                let (t, unroll) = match (slice <= CLUSTER_SLICE_BYTES, unstaged) {
                    (true, _) if exact4 => (256, 4),
                    // A LayerNorm over slices over 32 KiB: 256 × 4 too.
                    (false, _) if exact4 && heavy => (256, 4),
                    (true, _) => (256, 2),
                    (false, true) => (512, 2),
                    (false, false) => (256, 4),
                };
                return RowSchedule { cluster: c as u32, unroll, ..multi(t) };
            }
        }
        multi(512)
    }

    pub(super) fn check(&self, n: &Dim, target: &Target) -> Result<(), String> {
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
        if self.stage_invariant && self.cluster == 1 {
            return Err("staged row-invariant inputs need the cluster schedule".into());
        }
        if self.sampled_shift && self.cluster == 1 {
            return Err("a sampled LayerNorm shift needs the cluster schedule".into());
        }
        if self.persistent > 0 && self.cluster == 1 {
            return Err("a persistent row schedule needs the cluster schedule".into());
        }
        if self.held > 0 && (self.cluster == 1 || self.persistent > 0 || self.stage_invariant) {
            return Err("slice iterations held in registers need the cluster schedule, neither persistent nor with staged row-invariant inputs".into());
        }
        if self.head_shift && (!self.sampled_shift || self.persistent > 0) {
            return Err("a LayerNorm shift from the row's head is a sampled shift, not persistent".into());
        }
        if self.cluster == 0 || self.cluster > MAX_CLUSTER_EXPLICIT {
            return Err(format!("{} CTAs per row (1 to {MAX_CLUSTER_EXPLICIT})", self.cluster));
        }
        if self.cluster > 1 {
            if target.sm_version() < 90 {
                return Err(format!("a cluster of {} CTAs per row needs sm_90, not {target}", self.cluster));
            }
            if self.chunks.is_some() || t < 64 || n.as_const().is_none() {
                return Err("the cluster schedule is a multi-pass schedule of CTAs over rows of a constant length".into());
            }
        }
        Ok(())
    }
}

impl RowSchedule {
    /// Elements of a row (or cluster slice) one multi-pass loop iteration covers:
    /// `unroll · threads_per_row · vec`.
    pub(super) fn per_iter(&self) -> i64 {
        i64::from(self.unroll) * i64::from(self.threads_per_row) * i64::from(self.vec)
    }

    /// A short, stable name (`rows t512 u2 c8`, `rows t32 r4 one-read`): part of an autotuned
    /// variant's cache key, and what `sinter explain` shows.
    pub fn name(&self) -> String {
        let mut n = format!("rows t{} u{} c{}", self.threads_per_row, self.unroll, self.cluster);
        if self.stage_invariant {
            n.push_str(" w");
        }
        if self.persistent > 0 {
            n.push_str(&format!(" p{}", self.persistent));
        }
        if self.sampled_shift {
            n.push_str(" s");
        }
        if self.head_shift {
            n.push_str(" h");
        }
        if self.held > 0 {
            n.push_str(&format!(" k{}", self.held));
        }
        if self.rows_per_cta > 1 {
            n.push_str(&format!(" r{}", self.rows_per_cta));
        }
        if self.chunks.is_some() {
            n.push_str(" one-read");
        }
        n
    }
}

/// The schedule candidates of row-reduction `kernel` for autotuning
/// ([`crate::schedule_variants`]): [`RowSchedule::choose`]'s first, then for a CTA-per-row
/// multi-pass or cluster schedule the other thread counts and unrolls (256 × 2, 256 × 4,
/// 512 × 2, and 1024 × 2 without a cluster), each named by [`RowSchedule::name`]; the
/// one-read and warp schedules have no alternatives.
///
/// # Errors
/// As [`super::generate`], when the kernel cannot be analysed.
pub(super) fn variants(cx: &KernelCtx<'_>, target: &Target) -> R<Vec<RowSchedule>> {
    let (default, _) = default_schedule(&cx, target)?;
    let mut scheds = vec![default];
    if default.chunks.is_none() && default.threads_per_row > 32 {
        let mut alts = vec![(256, 2), (256, 4), (512, 2)];
        if default.cluster == 1 {
            alts.push((1024, 2));
        } else {
            // Fewer, longer-running warps with more loads in flight each (a LayerNorm's output
            // pass waits on two row-invariant inputs from L2 per chunk).
            alts.extend([(128, 8), (256, 8)]);
        }
        for (t, u) in alts {
            let mut sc = RowSchedule { threads_per_row: t, unroll: u, sampled_shift: false, head_shift: false, ..default };
            // The default's sampled LayerNorm shift wherever it applies to the alternative too.
            sc.sampled_shift = default.sampled_shift && sampled_shift_applies(&cx, &Analysis::new(&cx, false, false)?, &sc)?;
            sc.head_shift = default.head_shift && sc.sampled_shift;
            scheds.push(sc);
        }
    }
    if default.cluster > 1 && !Analysis::new(&cx, false, true)?.resident.is_empty() {
        // The row-invariant inputs staged too, at the default's cluster size and the powers of
        // two around it (those whose slices fit the shared memory).
        for c in [2, 4, 8, default.cluster] {
            scheds.push(RowSchedule { cluster: c, stage_invariant: true, threads_per_row: 256, unroll: 2, ..default });
        }
    }
    if default.cluster > 1 && 2 * default.cluster <= MAX_CLUSTER_EXPLICIT {
        // Twice the CTAs a row: half the staged slice, twice the CTAs an SM (16, Hopper's
        // non-portable cluster size, for the longest rows).
        for (t, u) in [(256, 2), (256, 4)] {
            scheds.push(RowSchedule { cluster: 2 * default.cluster, threads_per_row: t, unroll: u, ..default });
        }
    }
    if default.cluster > 1 && cx.data.body.nodes.iter().any(|(_, nd)| nd.op.kind == OpKind::LayerNorm) {
        // One statistics pass over the stage (a sampled shift, see `RowSchedule::sampled_shift`).
        for (t, u) in [(default.threads_per_row, default.unroll), (256, 4), (128, 8)] {
            scheds.push(RowSchedule { sampled_shift: true, head_shift: false, threads_per_row: t, unroll: u, ..default });
            // The shift from the row's head (plain sums, no Chan merges).
            scheds.push(RowSchedule { sampled_shift: true, head_shift: true, threads_per_row: t, unroll: u, ..default });
        }
    }
    if default.cluster > 1 {
        // Persistent clusters (see `RowSchedule::persistent`): the row-invariant inputs staged
        // once where there are any (one CTA an SM: the slice and the invariants' slices), else
        // the slice alone; 512 and 1024 threads (one CTA an SM keeps only its own warps to
        // cover the latencies).
        let plan = Analysis::new(&cx, false, true)?;
        let w = !plan.resident.is_empty();
        for (t, u) in [(1024, 2), (512, 2), (512, 4)] {
            let sc = RowSchedule { persistent: 1, stage_invariant: w, threads_per_row: t, unroll: u, ..default };
            let split = Split::new(&plan, &sc, &cx)?;
            let per_sm = occupancy(&cx.data.body, sc, Some((split.stage_bytes + CLUSTER_SCRATCH_BYTES, split.staged.len() as u32)), target);
            let full = persistent_clusters(sc.cluster, per_sm, target);
            for g in [full, full * 7 / 8] {
                scheds.push(RowSchedule { persistent: g.max(1), ..sc });
            }
        }
    }
    if default.cluster > 1 && default.persistent == 0 {
        // The slice's last iterations held in registers (see `RowSchedule::held`) where that
        // puts more rows on an SM than the default's stage does (rows of 262144 `bf16`: three
        // CTAs of 8-CTA clusters an SM), at 256 threads × 4 vectors: 16 KiB of a 64 KiB slice
        // (four CTAs an SM at 64 registers a thread), or with half the cluster two iterations
        // of a 128 KiB slice (two CTAs an SM, 96 KiB staged).
        let plan = Analysis::new(&cx, false, true)?;
        let rows_per_sm = |sc: &RowSchedule| -> R<(u32, u32)> {
            let sp = Split::new(&plan, sc, &cx)?;
            Ok((occupancy(&cx.data.body, *sc, Some((sp.stage_bytes + CLUSTER_SCRATCH_BYTES, sp.staged.len() as u32)), target), sc.cluster))
        };
        let (base_ctas, base_cluster) = rows_per_sm(&default)?;
        for (c, t, u, k) in [(default.cluster, 256, 4, 1), (default.cluster / 2, 256, 4, 2)] {
            let sc = RowSchedule { cluster: c, threads_per_row: t, unroll: u, held: k, stage_invariant: false, ..default };
            if c < 2 || (sc.sampled_shift && !sampled_shift_applies(&cx, &plan, &sc)?) {
                continue;
            }
            let Ok(sp) = Split::new(&plan, &sc, &cx) else { continue };
            if u64::from(sp.stage_bytes) > MAX_SLICE_BYTES {
                continue;
            }
            // More rows an SM (CTAs an SM over the cluster size) than the default.
            let (ctas, cluster) = rows_per_sm(&sc)?;
            if ctas * base_cluster > base_ctas * cluster {
                scheds.push(sc);
            }
        }
    }
    // The shift from the row's head only where it fits (see `head_shift_fits`).
    for sc in &mut scheds {
        if sc.head_shift && !head_shift_fits(&cx, sc)? {
            sc.head_shift = false;
        }
    }
    let mut seen = std::collections::HashSet::new();
    scheds.retain(|sc| sc.cluster >= 1 && sc.cluster <= MAX_CLUSTER_EXPLICIT && seen.insert(*sc));
    Ok(scheds)
}

/// [`RowSchedule::choose`]'s schedule for the kernel of `cx`, with its analysis.
pub(super) fn default_schedule(cx: &KernelCtx<'_>, target: &Target) -> R<(RowSchedule, Analysis)> {
    let plan = Analysis::new(cx, false, false)?;
    let body = &cx.data.body;
    let min_size = plan.min_row_elem_size(cx)?;
    let heavy = body.nodes.iter().any(|(_, nd)| nd.op.kind == OpKind::LayerNorm);
    let mut staged_bytes = 0u64;
    for &i in &plan.staged {
        staged_bytes += cx.buffer(i)?.ty.dtype.size_bytes() as u64;
    }
    let unstaged = body.params.iter().enumerate().any(|(i, &p)| body.ty(p).shape.last() == Some(&plan.n) && !plan.staged.contains(&i));
    let mut sched = RowSchedule::choose(&plan.n, min_size, heavy, target, staged_bytes, unstaged);
    if heavy && sched.cluster > 1 && sampled_shift_applies(cx, &plan, &sched)? {
        // A LayerNorm over whole slices with 16-bit outputs: the sampled shift (one
        // statistics pass) and the bf16x2 `fma`.
        sched.sampled_shift = true;
        // Over slices above 32 KiB (three CTAs an SM, registers to spare), the shift from the
        // row's head; at six CTAs an SM (40 registers) it spills.
        sched.head_shift = head_shift_fits(cx, &sched)?;
        // With the row head's shift, eight vectors a loop iteration where the slices are whole
        // iterations of them (two a 64 KiB slice: half the output pass's round trips for the
        // weight and bias).
        let eight = RowSchedule { unroll: 8, ..sched };
        if sched.head_shift && sched.threads_per_row == 256 && sampled_shift_applies(cx, &plan, &eight)? {
            sched = eight;
        }
    }
    Ok((sched, plan))
}

/// Whether [`RowSchedule::head_shift`] fits `sched` (a sampled shift, not persistent): over
/// staged slices above 32 KiB, where three CTAs fit an SM and registers are to spare (at six
/// CTAs an SM, 40 registers, ptxas 12.9 spills the row head's vectors).
fn head_shift_fits(cx: &KernelCtx<'_>, sched: &RowSchedule) -> R<bool> {
    if !sched.sampled_shift || sched.persistent > 0 || sched.cluster < 2 {
        return Ok(false);
    }
    let plan = Analysis::new(cx, false, true)?;
    Ok(u64::from(Split::new(&plan, sched, cx)?.stage_bytes) > CLUSTER_SLICE_BYTES)
}

/// Whether [`RowSchedule::sampled_shift`] applies to `sched`: the cluster schedule over whole
/// slices (`Split::exact`) of a kernel with a `layer_norm` whose row outputs are all `bf16` or
/// `f16`.
pub(super) fn sampled_shift_applies(cx: &KernelCtx<'_>, plan: &Analysis, sched: &RowSchedule) -> R<bool> {
    let Some(n) = plan.n.as_const() else { return Ok(false) };
    let (c, per_iter) = (i64::from(sched.cluster), sched.per_iter());
    let slice = (n.max(0) + c - 1) / c;
    let slice = (slice + i64::from(sched.vec) - 1) / i64::from(sched.vec) * i64::from(sched.vec);
    if sched.cluster < 2 || slice * c != n || slice % per_iter != 0 {
        return Ok(false);
    }
    let mut narrow = true;
    for o in plan.outs.iter().filter(|o| o.kind == OutKind::Row) {
        narrow &= matches!(cx.buffer(o.buffer)?.ty.dtype, DType::BF16 | DType::F16);
    }
    Ok(narrow && cx.data.body.nodes.iter().any(|(_, nd)| nd.op.kind == OpKind::LayerNorm))
}

/// The CTAs per SM asked of ptxas (`.minnctapersm`). The one-read schedule holds a CTA's
/// row in registers from its loads to its stores, through every reduction level; the SM's
/// memory pipe is kept full only by the other CTAs resident meanwhile, so occupancy is what
/// its bandwidth depends on (at 256 threads: 60 registers allow 4 CTAs, 48 five, 40 six).
/// With at most 16 elements per thread, ask for a register budget of 40 a thread (48 with a
/// `layer_norm`, whose centred values and two extra statistics need more); with 32 (a
/// `layer_norm`), 64. The cluster schedule (`smem`: its shared memory per CTA, and how many
/// parameters it stages) asks for as many CTAs as the SM's shared memory and threads allow, with
/// 40 registers a thread (56 with an `f32` `layer_norm`, 64 without staging; a `bf16`
/// `layer_norm` fits 40 since its statistics cross the cluster once, see
/// `Emitter::cluster_level`) plus, with [`RowSchedule::held`] iterations, the held vectors'
/// (4 registers each, a staged parameter, 8 from two held iterations on) and the loop's beyond
/// four an iteration (4 each). Otherwise 1, ptxas's own choice.
pub(super) fn occupancy(body: &Function, s: RowSchedule, smem: Option<(u32, u32)>, target: &Target) -> u32 {
    let block = s.threads_per_row * s.rows_per_cta;
    let heavy = body.nodes.iter().any(|(_, nd)| nd.op.kind == OpKind::LayerNorm);
    if let Some((smem, staged_params)) = smem {
        let staged = staged_params > 0;
        // 1 KiB of every CTA's shared memory is reserved on sm_80/sm_90.
        let by_smem = target.max_shared_memory_per_sm() / (smem + 1024);
        // f32 LayerNorm stages 4-byte elements: at 48 registers ptxas 12.9 spills 4 bytes
        // (rows of 32768, sm_90a), at 56 none.
        let wide = body.params.iter().any(|&p| body.ty(p).dtype == DType::F32);
        let regs = match (staged, heavy) {
            (false, _) => 64,
            (true, true) if wide => 56,
            (true, true) => 40,
            (true, false) => 40,
        } + if s.held > 0 {
            // The held vectors (4 registers each, a staged parameter; 8 from two held
            // iterations on, whose chunks' addresses stay live too) and the loop's vectors
            // beyond four an iteration (4 each).
            let per_vector = if s.held >= 2 { 8 } else { 4 };
            staged_params * (per_vector * s.held * s.unroll + 4 * s.unroll.saturating_sub(4))
        } else {
            0
        };
        return by_smem.min(65536 / (block * regs)).min(2048 / block).max(1);
    }
    let Some(c) = s.chunks else { return 1 };
    if s.threads_per_row < 128 || block > 512 {
        return 1;
    }
    let regs = match c * s.vec {
        e if e <= 16 && heavy => 48,
        e if e <= 16 => 40,
        e if e <= 32 && heavy => 64,
        _ => return 1,
    };
    (65536 / (block * regs)).clamp(1, 2048 / block)
}
