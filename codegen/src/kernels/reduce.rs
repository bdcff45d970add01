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
//!   `e = 2^((x − m)·log2e)` (`ex2.approx.ftz`: an `e` below 2⁻¹²⁶ is 0, see
//!   `element::exp_shifted_ftz`), `out = e · (1/Σe)`; a row of all −inf gives 0
//!   (`log_softmax`: −inf), a NaN anywhere gives a NaN row, a +inf gives NaN (`inf − inf`),
//!   as the interpreter does;
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
//! A row is reduced by one warp (short rows: `N ≤ 64·vec`, four rows per 128-thread CTA), one
//! CTA of 64 to 1024 threads, or (sm_90+) a thread-block cluster of 2 to 8 such CTAs (`vec`
//! = 16 bytes of the narrowest row buffer: 8 `bf16`, 4 `f32`, halved until it divides `N`).
//! Each thread reduces its elements sequentially, then the row group combines the per-thread
//! partials with butterfly shuffles (`shfl.sync.bfly`, CUDA C Programming Guide §7.22, PTX
//! ISA §9.7.8.6) and, across warps, through shared memory: each warp's result in
//! `smem[warp]`, a barrier, then lane `l` of every warp loads `smem[l mod n_w]` and `log₂ n_w`
//! butterfly shuffles fold them (`fold_lanes`: every merge is symmetric, so all threads hold
//! the same bits — Triton's reduce lowering: thread → warp shuffle → shared memory). Rows are
//! looped over grid-stride (the grid has a CTA, or a cluster, per row group, so the loop
//! normally runs once; the barrier that lets the next row reuse the shared scratch is only
//! executed when there is a next row).
//!
//! - **One read** (`N` constant, at most 32 elements per thread, 16 with 1024 threads; e.g.
//!   `N = 4096` `bf16`: 256 threads × 2 vectors of 8, or with a `layer_norm` 128 threads × 4
//!   vectors, which halves the shuffles and the cross-warp merge per element): the thread's
//!   elements are loaded once (16-byte vectors where proven) and stay in registers through
//!   every reduction level and the output pass. Elements past the row end (a partial last
//!   vector group) are read at a clamped in-bounds address and masked out of the statistics
//!   and the stores.
//! - **Multi-pass** (longer rows on sm_80, e.g. `N ≥ 32k` `bf16`, or a symbolic `N`): 512
//!   threads (256 for a symbolic `N`) loop over the row once per reduction level, then once
//!   for the outputs, `unroll` vectors per thread per iteration. `softmax`/`log_softmax` take
//!   one level: for rows of at least 65536 elements or a symbolic length, the online softmax
//!   (Milakov & Gimelshein 2018, `SoftmaxOnline`) keeps a running max and a sum rescaled by
//!   `e^(m_old − m_new)`, so the row is read twice (statistics, outputs) rather than three
//!   times; `−inf` parts contribute 0 (the shift is 0 where the max is −inf), a NaN or +inf
//!   makes the sum NaN, as in the two-pass form.
//! - **Cluster** (sm_90/sm_90a, a constant `N` too long for one read, when a statistic reads
//!   a row input that a later pass reads again): the row is split over a thread-block cluster
//!   of `c` CTAs (PTX ISA §11.7 `.reqnctapercluster 1, c, 1`, set through LLVM 22's
//!   `"nvvm.cluster_dim"`; grid `(R, c, 1)`, so a plain `cuLaunchKernel` launches it and any
//!   row count is a whole number of clusters). CTA `r` (`%cluster_ctarank`) owns the slice
//!   `[r·S, min(N, (r+1)·S))`, `S = ⌈N/c⌉` rounded up to `vec`. Every row input a statistic
//!   reads is *staged* in the CTA's shared memory (`element::Stage`), as loaded: a prefetch
//!   loop first issues the whole slice as 16-byte `cp.async` copies (PTX ISA §9.7.9.25.3;
//!   each thread copies exactly the chunks it later reads, so `cp.async.wait_group` and no
//!   barrier make them visible), so the slice is in flight at once rather than `unroll`
//!   vectors per thread per round trip; where the slices are whole loop iterations, each
//!   iteration's copies are a commit group of their own and the first pass waits for a group
//!   only when it reaches its iteration (`Emitter::wait_iteration`), so the statistics of the
//!   first chunks overlap the arrival of the last; chunks that are not aligned 16-byte
//!   vectors (an odd `N`) are loaded and staged by the first pass instead. The first pass folds the
//!   stage into the first level's statistics; later levels and the outputs read it too, so
//!   the row crosses DRAM once each way. The CTA's partial statistics (after its own shuffles and barrier)
//!   go to its shared memory, a cluster barrier (PTX ISA §9.7.13.4: the warp of thread 0,
//!   which wrote the slots, arrives with release semantics, the other warps relaxed — a
//!   release arrive costs every thread that executes it a `MEMBAR.ALL.GPU` — and every
//!   thread waits, acquire) and every warp reads the `c` CTAs' partials through
//!   distributed shared memory (`mapa.shared::cluster` + `ld.shared::cluster`, PTX ISA
//!   §9.7.9) and folds them (`fold_lanes`, the same bits in every CTA). The slots alternate
//!   by row parity, so one cluster barrier per level suffices across rows; a last, relaxed,
//!   cluster barrier keeps a CTA resident until its cluster has read its slots, split: a CTA
//!   arrives once it has read the partials of its last row (before that row's output pass)
//!   and waits at its exit, so it leaves when its own outputs are written. Every
//!   shared array is carved from the dynamic shared memory (the launch passes its size).
//!   `softmax` is always online here (one exchange), and a `layer_norm` crosses the CTA and
//!   the cluster once too: where the slices are whole loop iterations, each *warp* computes
//!   corrected two-pass statistics of the chunks it staged (its mean by shuffles, then Σ(x − mean) and Σ(x − mean)² from the stage: no
//!   barrier between the passes), and its `(n, mean, M2)` is merged over the CTA's warps
//!   (one barrier; elsewhere the CTA's statistics, two barriers) and then the cluster's CTAs by Chan, Golub & LeVeque's pairwise update,
//!   in `f64` (see `Emitter::cluster_level`; equal counts on both sides of every step, so
//!   without a division). With 16-bit outputs (`RowSchedule::sampled_shift`, the default
//!   there) the warp's shift is the mean of its first chunk rather than of all its chunks
//!   (one statistics pass over the stage instead of two; the corrected two-pass stays exact
//!   enough: the shift is a mean of the warp's own values, so `(mean − shift)² ≤ n_w·var`
//!   bounds the relative error by about `ε·n_w`, far below a `bf16` ulp) and the last step,
//!   `round(h·w + b)`, is one `fma.rn.bf16x2` a pair (`Eval::ln_bf16_fma`): LayerNorm
//!   4096 × 32768 `bf16` on an H200 143.2 µs against 151.3, 512 × 262144 156.1 against 162.2.
//!   Over slices above 32 KiB (`RowSchedule::head_shift`, the default there) the shift is
//!   the whole row's, the mean of its first `32·vec` elements, which every warp loads before
//!   the slice's copies: the statistics are then plain `f32` sums folded like an RMSNorm's,
//!   without Chan merges (512 × 262144 `bf16`: 150.0–151.4 µs against 153.1–155.4), and the
//!   loop takes eight vectors a thread an iteration where the slices are whole iterations of
//!   them (half the output pass's round trips for the weight and bias; 0.5–1% faster). Sizes: `c = ⌈N·b / 32 KiB⌉` clamped to
//!   2..=8 (`b` the staged bytes per column), 256 threads per CTA for slices up to 32 KiB,
//!   with four vectors a loop iteration where the slices are whole iterations of them
//!   (LayerNorm 4096 × 32768 on an H200: 146.6-149.6 µs against 150.9-152.3 with two; the
//!   other row statistics equal or better, bench/RESULTS.md), else two;
//!   up to 96 KiB, 512 threads when the output pass also reads an unstaged input (a weight)
//!   unless it is a LayerNorm over whole iterations of four vectors (256 × 4: 157.0 µs
//!   against 165.7 at 512 × 262144), else 256 threads with four vectors a loop iteration
//!   (longer rows keep the multi-pass schedule); e.g. `bf16` rows of 32768: 2 CTAs × 256 threads, 32 KiB each, six CTAs per
//!   SM; rms_norm rows of 262144: 8 CTAs × 512 threads, 64 KiB each, three CTAs per SM (16
//!   CTAs of 32 KiB, six per SM, measured slower: see
//!   `MAX_CLUSTER`; an explicit schedule may still ask for up to 16, Hopper's non-portable
//!   size, which the runtime allows per kernel). The pass loops carry `.pragma "nounroll"`: ptxas would
//!   otherwise unroll their few iterations completely and exceed the 40 registers a thread
//!   that occupancy allows. Reductions alone (nothing to stage: the row is read once anyway)
//!   keep the multi-pass schedule.
//! - *Staged invariants* (an autotuning variant, `w` in its name; not a default): the
//!   row-invariant inputs of the row's length (shape `[1…, N]`: a `layer_norm`'s weight and
//!   bias, an `rms_norm`'s weight, a broadcast mask) are copied into the CTA's shared memory by
//!   each row's prefetch too (`cp.async`, the same group as the row's slice), so their L2
//!   latency hides behind the row's DRAM reads and every pass reads them from there at the
//!   chunk's own column. Measured on an H200 (bench/RESULTS.md, 2026-11-30): no better than
//!   reading them from L2 at equal cluster size, and the larger clusters their shared memory
//!   asks for cost far more than they save (`layer_norm` 4096 × 32768: 150.4 µs with 2 CTAs
//!   unstaged, 190.6 µs with 4 staged, 269.7 µs with 8).
//! - *Held iterations* (autotuning variants, `k1`, `k2` in the name, where the stage is over
//!   32 KiB; `RowSchedule::held`): the slice's last loop iterations are not staged but loaded
//!   into registers (16-byte vectors, right after the staged iterations' `cp.async` copies are
//!   issued, `Emitter::load_held`) and read from there by every pass — after the staged loop in
//!   a statistics pass (they arrive last), before it in the output pass (their registers are
//!   then free for the loop's loads) — so the stage shrinks and one more CTA fits an SM: rows
//!   of 262144 `bf16` in clusters of 8 with 48 KiB staged and 16 KiB held (`t256 u4 c8 k1`, four
//!   CTAs an SM at 64 registers), or in clusters of 4 with 96 KiB staged and 32 KiB held
//!   (`t256 u4 c4 k2`, two CTAs an SM); offered only where they put more rows on an SM than
//!   the default, with the held vectors counted in the register budget (`occupancy`). The thread's addresses are computed in the row's
//!   body (`KernelBuilder::opaque_here`), not hoisted out of the row loop, where they would stay
//!   live beside the held vectors and spill. Measured on an H200 (bench/RESULTS.md,
//!   2026-11-30): within 1% of the staged schedules for the RMSNorm and the softmax, no faster
//!   for the LayerNorm (more rows in flight, but fewer registers for its output pass's loads).
//! - *Persistent clusters* (autotuning variants, `p16`, `p14`, … in the name: the grid's
//!   clusters; not a default): a fixed grid of clusters loops over the rows, the output pass
//!   refilling each thread's staged chunks with its next row's (`cp.async` after the chunk's
//!   stores; 0 bytes past the last row) and the row-invariant inputs staged once. Correct
//!   (CPU-simulated and on the H200), but measured far slower (bench/RESULTS.md, 2026-11-30:
//!   `layer_norm` 512 × 262144 253–437 µs against 156; `softmax` 155–198 µs against 143):
//!   with a single stage a row's loads start only as the previous row's output pass ends,
//!   and one CTA an SM exposes every barrier and L2 round trip; the H200 holds 45 clusters
//!   of 8 three-CTA-an-SM kernels at once (Nsight Compute), so `p16` at one CTA an SM does
//!   not even fit and runs in two waves. A double-buffered stage would need twice the shared
//!   memory.
//!
//! A reduction *level* is a set of statistics that can be computed in the same pass: a
//! statistic's level is one more than the deepest statistic its input depends on (softmax's
//! sum depends on its max; LayerNorm's variance on its mean; a reduction of a softmax on the
//! softmax's sum).

use std::cell::{Cell, RefCell};
use std::collections::HashMap;

use inkwell::types::BasicTypeEnum;
use inkwell::values::{FloatValue, IntValue, PointerValue};
use inkwell::IntPredicate;
use sinter_ir::{DType, Dim, Family, Function, GridDim, Kernel, KernelGraph, LaunchPlan, Layout, Node, OpKind, Value, ValueDef};

use super::element::{divisible, exp_shifted_ftz, At, Ax, Buf, Eval, RowScalars, Scalar, Stage, Tag};
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
    /// CTAs per row: 1, or 2 to 16 (8 by default) for the cluster schedule (sm_90+, multi-pass, a constant
    /// `N`): the row is split into `cluster` slices, one per CTA of a thread-block cluster,
    /// each staged in its CTA's shared memory (see the module docs).
    pub cluster: u32,
    /// The cluster schedule only: the *row-invariant* inputs of the row's length (a
    /// `layer_norm`'s weight and bias, an `rms_norm`'s weight) are copied into the CTA's
    /// shared memory with each row's prefetch and read from there (see the module docs);
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
    /// the stage instead of two (see [`Emitter::cluster_level`]); and its last step is a
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

/// The clusters of `cluster` CTAs, `per_sm` of which fit an SM, that an H100/H200's 132 SMs
/// hold at once when every SM can take part ([`crate::kernels::matmul::WS_PERSISTENT_CTAS`];
/// the SM count is not known at code generation, and a grid of a constant size keeps the
/// plan a plain launch). Clusters that do not fit run after the others: correct, slower.
pub fn persistent_clusters(cluster: u32, per_sm: u32) -> u32 {
    (super::matmul::WS_PERSISTENT_CTAS * per_sm.max(1) / cluster.max(1)).max(1)
}

/// Elements a thread may hold in registers in the one-read schedule.
const MAX_ELEMS_PER_THREAD: u32 = 32;

/// The cluster schedule aims at slices of this many staged bytes per CTA (six CTAs of 256
/// threads per SM then fit the 228 KiB of shared memory of an H100/H200 SM) ...
const CLUSTER_SLICE_BYTES: u64 = 32 << 10;
/// ... takes at most this many CTAs per row (the portable cluster size: 16, Hopper's
/// non-portable size, measured slower at 512 × 262144 bf16 on an H200 — rms_norm 81.5% and
/// softmax 74.1% of the copy bandwidth against 83.6% and 80.6% with 8: six CTAs per SM
/// instead of three, but each row's statistics folded over twice as many partials, and every
/// CTA waiting for the slowest of 16) ...
const MAX_CLUSTER: u64 = 8;
/// The largest cluster an explicit schedule may ask for ([`generate_with`]): Hopper's
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
        let mut vec = (16 / min_size.max(1)).clamp(1, 8) as u32;
        while vec > 1 && !divisible(n, vec) {
            vec /= 2;
        }
        let one = |threads_per_row, rows_per_cta, chunks| RowSchedule { threads_per_row, rows_per_cta, vec, chunks: Some(chunks), unroll: 1, cluster: 1, stage_invariant: false, persistent: 0, sampled_shift: false, head_shift: false, held: 0 };
        let multi = |threads_per_row| RowSchedule { threads_per_row, rows_per_cta: 1, vec, chunks: None, unroll: 2, cluster: 1, stage_invariant: false, persistent: 0, sampled_shift: false, head_shift: false, held: 0 };
        let Some(n) = n.as_const() else { return multi(256) };
        let n = n.max(0) as u64;
        let groups = n.div_ceil(u64::from(vec));
        if groups <= 64 {
            return one(32, 4, groups.div_ceil(32) as u32);
        }
        let per_thread = if heavy { 4 } else { 2 };
        let t = groups.div_ceil(per_thread).next_power_of_two().clamp(64, 1024) as u32;
        let chunks = groups.div_ceil(u64::from(t)) as u32;
        // 1024 threads leave 64 registers a thread: half the elements.
        let limit = if t == 1024 { MAX_ELEMS_PER_THREAD / 2 } else { MAX_ELEMS_PER_THREAD };
        if chunks * vec <= limit {
            return one(t, 1, chunks);
        }
        if target.sm_version() >= 90 && staged_bytes > 0 {
            let bytes = n * staged_bytes;
            let c = bytes.div_ceil(CLUSTER_SLICE_BYTES).clamp(2, MAX_CLUSTER);
            let slice = n.div_ceil(c).div_ceil(u64::from(vec)) * u64::from(vec) * staged_bytes;
            if slice <= MAX_SLICE_BYTES {
                // Slices up to 32 KiB: 256 threads × 4 vectors (see the module docs).
                // Slices over 32 KiB: 512 threads when the output pass also reads a global
                // input (its L2 latency wants more warps to hide it), else 256 threads with
                // four vectors per loop iteration (fewer, longer-running warps; 512 × 262144
                // bf16 softmax on an H200: 85.3-86.0% of copy against 84.3-84.9% with 512 × 2,
                // rms_norm the other way round: 86.0% with 256 × 4, 86.5-87.5% with 512 × 2).
                // Four vectors only where every slice is whole iterations of them: the bounds
                // checks of a partial one cost the registers (bf16 LayerNorm of 33000 spills).
                let exact4 = n % (c * 4 * 256 * u64::from(vec)) == 0;
                let (t, unroll) = match (slice <= CLUSTER_SLICE_BYTES, unstaged) {
                    (true, _) if exact4 => (256, 4),
                    // A LayerNorm over slices over 32 KiB: 256 × 4 too (512 × 262144 bf16 on
                    // an H200: 157.0 µs against 165.7 with 512 × 2; rms_norm equal either way).
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

    fn check(&self, n: &Dim, target: &Target) -> Result<(), String> {
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

/// The cluster schedule's split of a row (see the module docs).
#[derive(Clone, Debug)]
struct Split {
    /// Elements per CTA slice (a multiple of `vec`); CTA `r` of the cluster takes `[r·slice,
    /// min(N, (r + 1)·slice))`.
    slice: i64,
    /// Loop iterations over a slice (`unroll·T·vec` elements each).
    iters: i64,
    /// The last iterations of the slice held in registers rather than staged
    /// ([`RowSchedule::held`]).
    held: i64,
    /// The staged parameters and their element sizes.
    staged: Vec<(usize, u32)>,
    /// The staged row-invariant parameters and their element sizes
    /// ([`RowSchedule::stage_invariant`]).
    resident: Vec<(usize, u32)>,
    /// Bytes of shared memory staging takes (each array a whole number of iterations,
    /// 16-byte aligned).
    stage_bytes: u32,
    /// Every CTA's slice is full and a whole number of iterations: no chunk is ever past its
    /// slice's end (no bounds checks).
    exact: bool,
}

/// Shared memory of a CTA the cluster schedule asks for beyond its staged slice: the
/// reduction scratch (at most `4·T/32` words per level and statistic) and the cluster slots;
/// a bound, checked after generation.
const CLUSTER_SCRATCH_BYTES: u32 = 4 << 10;

impl Split {
    fn new(plan: &Analysis, sched: &RowSchedule, cx: &KernelCtx<'_>) -> R<Split> {
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

impl RowSchedule {
    /// Elements of a row (or cluster slice) one multi-pass loop iteration covers:
    /// `unroll · threads_per_row · vec`.
    fn per_iter(&self) -> i64 {
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
/// 512 × 2, and 1024 × 2 without a cluster), each with its [`RowSchedule::name`] and a closure
/// that compiles it; the one-read and warp schedules have no alternatives.
///
/// # Errors
/// As [`generate`], when the kernel cannot be analysed.
pub fn variants<'a>(graph: &'a KernelGraph, kernel: Kernel, target: &'a Target) -> Result<Vec<crate::Candidate<'a>>, CodegenError> {
    let cx = KernelCtx::new(graph, kernel)?;
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
            let full = persistent_clusters(sc.cluster, per_sm);
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
        // of a 128 KiB slice (two CTAs an SM, 96 KiB staged). (128 × 8 and 512 × 2 measured no
        // better, bench/RESULTS.md 2026-11-30, and their registers are harder to foresee.)
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
    Ok(scheds
        .into_iter()
        .map(|sc| {
            let build: Box<dyn FnOnce() -> Result<LaunchPlan, CodegenError> + 'a> = Box::new(move || generate_with(graph, kernel, target, Some(sc)));
            (sc.name(), build)
        })
        .collect())
}

/// [`RowSchedule::choose`]'s schedule for the kernel of `cx`, with its analysis.
fn default_schedule(cx: &KernelCtx<'_>, target: &Target) -> R<(RowSchedule, Analysis)> {
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
        // statistics pass) and the bf16x2 `fma` (H200, bench/RESULTS.md 2026-11-30: 4096 ×
        // 32768 bf16 143.2 µs against 151.3, 512 × 262144 157.0 against 162.5).
        sched.sampled_shift = true;
        // Over slices above 32 KiB (three CTAs an SM, registers to spare), the shift from the
        // row's head: 512 × 262144 bf16 on an H200, 150.0–151.4 µs against 153.1–155.4
        // (bench/RESULTS.md 2026-11-30); at six CTAs an SM (40 registers) it spills.
        sched.head_shift = head_shift_fits(cx, &sched)?;
        // With the row head's shift, eight vectors a loop iteration where the slices are whole
        // iterations of them (two a 64 KiB slice: half the output pass's round trips for the
        // weight and bias): 512 × 262144 bf16 on an H200, 148.3 / 149.7 / 151.5 µs against
        // 149.1 / 150.9 / 153.1 with four in three calls (bench/RESULTS.md 2026-11-30).
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
fn sampled_shift_applies(cx: &KernelCtx<'_>, plan: &Analysis, sched: &RowSchedule) -> R<bool> {
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
    generate_with(graph, kernel, target, None)
}

/// As [`generate`] with a chosen schedule (`None`: [`RowSchedule::choose`]).
///
/// # Errors
/// As [`generate`]; [`CodegenError::Unsupported`] for a schedule that does not fit the rows
/// or the target.
pub fn generate_with(graph: &KernelGraph, kernel: Kernel, target: &Target, schedule: Option<RowSchedule>) -> Result<LaunchPlan, CodegenError> {
    let cx = KernelCtx::new(graph, kernel)?;
    if cx.data.family != Family::RowReduction {
        return Err(cx.bad(format!("a {:?} kernel given to the row-reduction generator", cx.data.family)));
    }
    let (chosen, plan) = default_schedule(&cx, target)?;
    let sched = schedule.unwrap_or(chosen);
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
/// [`Emitter::cluster_level`]) plus, with [`RowSchedule::held`] iterations, the held vectors'
/// (4 registers each, a staged parameter, 8 from two held iterations on) and the loop's beyond
/// four an iteration (4 each). Otherwise 1, ptxas's own choice.
fn occupancy(body: &Function, s: RowSchedule, smem: Option<(u32, u32)>, target: &Target) -> u32 {
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
            // beyond four an iteration (4 each). ptxas 12.9 at sm_90a: `t256 u4 c8 k1` of rows
            // of 262144 fits 64, `t128 u8 c4 k1` of 65536 spills at 72, `t256 u4 c4 k2` of
            // 196608 at 80 (it takes 118–128 at 262144).
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
    /// Parameters the cluster schedule stages in shared memory: those of the row space's
    /// shape that a statistic reads (an ancestor of a row node's reduced operand).
    staged: Vec<usize>,
    /// Row-invariant parameters of the row's length (shape `[1…, N]`, `N` not 1, not staged):
    /// what [`RowSchedule::stage_invariant`] stages.
    resident: Vec<usize>,
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
    /// of at least [`ONLINE_SOFTMAX_MIN_ROW`] (or of a symbolic length, or any in the cluster
    /// schedule: `clustered`) is one [`StatKind::SoftmaxOnline`] rather than two over two
    /// levels.
    fn new(cx: &KernelCtx<'_>, fused_ln: bool, clustered: bool) -> R<Analysis> {
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
        // In the cluster schedule every pass after the first reads shared memory, and the
        // online form saves a cluster exchange: always online there.
        let online = clustered || n.as_const().is_none_or(|c| c >= ONLINE_SOFTMAX_MIN_ROW);
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
        // Parameters read by the statistics, of the rows' shape.
        let mut staged = Vec::new();
        let mut stack: Vec<Value> = row_nodes.iter().filter_map(|&n| body.nodes[n].inputs.first().copied()).collect();
        let mut seen = std::collections::HashSet::new();
        while let Some(v) = stack.pop() {
            if !seen.insert(v) {
                continue;
            }
            match body.values[v].def {
                ValueDef::Param(i) => {
                    if body.ty(v).shape == sref && !staged.contains(&i) {
                        staged.push(i);
                    }
                }
                ValueDef::Result(n, _) => stack.extend(body.nodes[n].inputs.iter().copied()),
            }
        }
        staged.sort_unstable();
        // Staging pays only when a later pass reads what the first one loads: another level of
        // statistics, an online softmax beside other statistics, or outputs along the row.
        let passes: usize = (1..=levels)
            .map(|l| {
                let at = |online: bool| stats.iter().any(|s| s.level == l && (s.kind == StatKind::SoftmaxOnline) == online);
                usize::from(at(true)) + usize::from(at(false))
            })
            .sum::<usize>()
            + usize::from(outs.iter().any(|o| o.kind == OutKind::Row));
        if passes <= 1 {
            staged.clear();
        }
        let resident = if staged.is_empty() || n.is_one() {
            Vec::new()
        } else {
            body.params
                .iter()
                .enumerate()
                .filter(|&(i, &p)| {
                    let sh = &body.ty(p).shape;
                    !staged.contains(&i) && sh.last() == Some(&n) && sh[..sh.len() - 1].iter().all(Dim::is_one)
                })
                .map(|(i, _)| i)
                .collect()
        };
        Ok(Analysis { lead, n, stats, levels, outs, staged, resident })
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
    /// The cluster schedule's split of a row (`sched.cluster > 1`).
    split: Option<Split>,
    /// The cluster schedule's dynamic shared memory: its base, and the bytes handed out so
    /// far (every shared array of the kernel is carved from it, see [`Emitter::smem_array`]).
    dsmem: Cell<Option<PointerValue<'ctx>>>,
    dsmem_used: Cell<u32>,
    /// The cluster schedule's facts about the current row.
    crow: Cell<Option<ClusterRow<'ctx>>>,
    /// The commit groups the row's prefetch left in flight, one a loop iteration (see
    /// [`Emitter::prefetch_slice`]); 0 once waited for.
    groups: Cell<u32>,
    /// The row head's chunk ([`RowSchedule::head_shift`]), its loads issued before the slice's.
    head: RefCell<Option<At<'ctx>>>,
    /// The current row's chunks held in registers ([`RowSchedule::held`]): each chunk's
    /// slice element `j` and coordinate, made once a row (their vectors are in
    /// [`Eval::pinned`], keyed by the coordinate's last-axis base).
    held: RefCell<Vec<(IntValue<'ctx>, At<'ctx>)>>,
}

/// Where the current row's slice lies, in the cluster schedule.
#[derive(Clone, Copy)]
struct ClusterRow<'ctx> {
    /// This CTA's rank in its cluster (`i32`).
    rank: IntValue<'ctx>,
    /// The slice's first element and its end (`min(N, start + slice)`), as indices.
    start: IntValue<'ctx>,
    end: IntValue<'ctx>,
    /// The parity of the CTA's row count (0 or 1, an index): which of the two sets of
    /// cluster slots this row uses.
    parity: IntValue<'ctx>,
    /// Whether this is the CTA's last row (`i1`, the same in every thread of the CTA): after
    /// its statistics the CTA reads no other CTA's shared memory, so it arrives at the exit
    /// barrier there (see [`Emitter::emit`]).
    last: IntValue<'ctx>,
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

/// Where [`Emitter::chunk_loop`] evaluates the chunks held in registers
/// ([`RowSchedule::held`]).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Held {
    /// Not at all (the prefetch: nothing to copy).
    Skip,
    /// Before the loop (the output pass: their registers are free for the loop's loads).
    Before,
    /// After the loop (a statistics pass: they were loaded after the staged copies).
    After,
}

/// The body of [`Emitter::chunk_loop`]: `(ev, j, accumulators) -> next accumulators`.
type ChunkBody<'f, 'ctx> = dyn FnMut(&mut Eval<'_, 'ctx>, IntValue<'ctx>, Vec<Acc<'ctx>>) -> R<Vec<Acc<'ctx>>> + 'f;

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
        // The cluster schedule: its CTA's slice and staged arrays.
        let cluster = match &self.split {
            Some(split) => {
                let base = ev.kb.dynamic_shared_base()?;
                self.dsmem.set(Some(base));
                let per_iter = s.per_iter();
                let mut arrays = HashMap::new();
                for &(i, size) in split.staged.iter().chain(&split.resident) {
                    let len = u32::try_from((split.iters - split.held) * per_iter).map_err(|_| CodegenError::Builder("a slice too large".into()))?;
                    arrays.insert(i, self.smem_alloc(ev, len * size, 16)?);
                }
                ev.stage = Some(Stage {
                    arrays,
                    ready: Default::default(),
                    filling: Default::default(),
                    fill: true,
                    cursor: None,
                    lanes: s.vec,
                    resident: split.resident.iter().map(|&(i, _)| i).collect(),
                    resident_fill: false,
                    row_axis: self.plan.lead.len(),
                });
                let rank = ev.kb.sreg("cluster.ctarank")?;
                let slice = split.slice;
                let (start, end) = ev.kb.in_prologue(|kb| {
                    let r = kb.b.build_int_z_extend_or_bit_cast(rank, ity, "rank")?;
                    let start = kb.b.build_int_mul(r, ity.const_int(slice as u64, false), "slice0")?;
                    let end = kb.b.build_int_add(start, ity.const_int(slice as u64, false), "slice1")?;
                    let i = kb.intrinsic_value("llvm.umin", &[ity.into()], &[end.into(), nv.into()])?.into_int_value();
                    Ok((start, i))
                })?;
                Some((rank, start, end))
            }
            None => None,
        };
        if s.persistent > 0 {
            // The first row's slice (and the row-invariant inputs, once) are in flight before
            // the row loop; every later row's is issued by the output pass before it.
            let some = ev.ilt(row0, rows)?;
            self.guarded(ev, Some(some), |ev| {
                let lead0 = self.lead_axes(ev, row0)?;
                if let Some((rank, start, end)) = cluster {
                    let one = ev.kb.b.build_int_compare(IntPredicate::EQ, ev.ic(0), ev.ic(0), "one")?;
                    self.crow.set(Some(ClusterRow { rank, start, end, parity: ev.ic(0), last: one }));
                }
                self.prefetch_slice(ev, &lead0, t, nv, false)?;
                self.crow.set(None);
                Ok(())
            })?;
        }
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
        let parity = ev.kb.b.build_phi(ity, "parity")?;
        parity.add_incoming(&[(&ev.ic(0), pre)]);
        let pv = parity.as_basic_value().into_int_value();
        let more = ev.kb.b.build_int_compare(IntPredicate::ULT, rv, rows, "more")?;
        ev.kb.cond_br(more, body, exit)?;
        ev.kb.position(body);
        ev.forget();
        ev.rows.clear();
        if let Some((rank, start, end)) = cluster {
            let following = ev.iadd(rv, rstride)?;
            let last = ev.kb.b.build_int_compare(IntPredicate::UGE, following, rows, "last")?;
            self.crow.set(Some(ClusterRow { rank, start, end, parity: pv, last }));
        }
        self.row(ev, rv, t, nv, warp, lane)?;
        let next = ev.iadd(rv, rstride)?;
        if s.threads_per_row > 32 && cluster.is_none() {
            // The next row's partials reuse the shared memory: a barrier before it, if there
            // is one (the grid has a CTA per row, so normally there is none). In the cluster
            // schedule each row's cluster barriers already order the reuse (see
            // `cluster_fold_with`).
            let again = ev.kb.b.build_int_compare(IntPredicate::ULT, next, rows, "again")?;
            self.guarded(ev, Some(again), |ev| ev.kb.barrier())?;
        }
        let flip = ev.kb.b.build_xor(pv, ev.ic(1), "parity")?;
        let latch = ev.kb.current_block()?;
        r.add_incoming(&[(&next, latch)]);
        parity.add_incoming(&[(&flip, latch)]);
        ev.kb.br(header)?;
        ev.kb.position(exit);
        if cluster.is_some() {
            // No CTA leaves while another CTA of its cluster may still read its shared memory.
            // Each CTA arrives (relaxed: a release would make every thread wait for its
            // outstanding global stores, `MEMBAR.ALL.GPU`) once it has read the other CTAs'
            // partials of its last row, before that row's output pass (`row`), or here if it
            // had no row; it waits here, usually without stalling, since the others arrived
            // before their own output passes. A CTA thus frees its SM slot when its own
            // outputs are stored rather than when its cluster's slowest CTA's are.
            let none = ev.kb.b.build_int_compare(IntPredicate::UGE, row0, rows, "norow")?;
            self.guarded(ev, Some(none), |ev| ev.kb.cluster_arrive_relaxed())?;
            if s.persistent > 0 {
                // The last row's refills (of nothing: zero bytes read) land before the exit.
                ev.kb.cp_async_wait(0)?;
            }
            ev.kb.cluster_wait()?;
        }
        ev.kb.ret()
    }

    /// `bytes` of the cluster schedule's dynamic shared memory, aligned to `align`.
    fn smem_alloc(&self, ev: &mut Eval<'_, 'ctx>, bytes: u32, align: u32) -> R<PointerValue<'ctx>> {
        let base = self.dsmem.get().ok_or_else(|| CodegenError::Builder("no dynamic shared memory".into()))?;
        let off = self.dsmem_used.get().div_ceil(align) * align;
        self.dsmem_used.set(off + bytes);
        let i8t = ev.kb.cx.i8_type();
        // SAFETY (of the IR, not of Rust): inside the dynamic area the launch sizes.
        Ok(unsafe { ev.kb.b.build_gep(i8t, base, &[ev.kb.i32c(i64::from(off))], "smem") }?)
    }

    /// A shared array of `len` elements of `ty` (`size` bytes each): a static `.shared`
    /// array, or in the cluster schedule a piece of the dynamic shared memory.
    fn smem_array(&self, ev: &mut Eval<'_, 'ctx>, ty: BasicTypeEnum<'ctx>, size: u32, len: u32, name: &str) -> R<PointerValue<'ctx>> {
        if self.split.is_some() {
            self.smem_alloc(ev, size * len, 16)
        } else {
            Ok(ev.kb.shared_array(ty, len, 16, name))
        }
    }

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
    fn cluster_fold_with(
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
        // relaxed (a release arrive is a `MEMBAR.ALL.GPU` in each thread that executes it; the
        // profile of 512 × 262144 rms_norm showed 14% of the warps' stall samples there when
        // every thread released), and every thread waits (acquire) before reading the slots.
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
    fn cluster_level(&self, ev: &mut Eval<'_, 'ctx>, stats: &[Stat], totals: Vec<Acc<'ctx>>, t: IntValue<'ctx>, nv: IntValue<'ctx>, pending: &mut Pending<'ctx>) -> R<()> {
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

    /// Chan, Golub & LeVeque's merge of two `(n, mean, M2)` triples of `f64`s carried as
    /// their bits (`i64`, so that the exchange and the shuffles move them whole), in a form
    /// symmetric in `a` and `b` (see [`Emitter::cluster_level`]); two empty triples give
    /// `(0, 0, 0)`.
    ///
    /// `uniform`: the caller guarantees `n_a = n_b` (whole slices, a power of two of them), so
    /// `mean = (mean_a + mean_b)/2` and `M2 = M2_a + M2_b + δ²·n_a/2` — no division (an `f64`
    /// division is a long dependent sequence, and a row's statistics wait for six merges).
    fn chan_merge(&self, ev: &mut Eval<'_, 'ctx>, a: &[Acc<'ctx>], b: &[Acc<'ctx>], uniform: bool) -> R<Vec<Acc<'ctx>>> {
        let f64t = ev.kb.cx.f64_type();
        let i64t = ev.kb.cx.i64_type();
        let mut v = Vec::with_capacity(6);
        for x in a.iter().take(3).chain(b.iter().take(3)) {
            let Acc::I(i) = x else {
                return Err(CodegenError::Builder("layer_norm cluster triples".into()));
            };
            v.push(ev.kb.b.build_bit_cast(*i, f64t, "f")?.into_float_value());
        }
        let [na, ma, qa, nb, mb, qb] = v[..] else {
            return Err(CodegenError::Builder("layer_norm cluster triples".into()));
        };
        let zero = ev.kb.f64c(0.0);
        let n = ev.kb.fadd(na, nb)?;
        // The merged mean and the weight `n_a·n_b/n` of δ².
        let (mean, w) = if uniform {
            let half = ev.kb.f64c(0.5);
            let s = ev.kb.fadd(ma, mb)?;
            (ev.kb.fmul(s, half)?, ev.kb.fmul(na, half)?)
        } else {
            let empty = ev.kb.feq(n, zero)?;
            let inv = ev.kb.fdiv(ev.kb.f64c(1.0), n)?;
            let inv = ev.kb.fsel(empty, zero, inv)?;
            let sa = ev.kb.fmul(na, ma)?;
            let sb = ev.kb.fmul(nb, mb)?;
            let s = ev.kb.fadd(sa, sb)?;
            let nn = ev.kb.fmul(na, nb)?;
            (ev.kb.fmul(s, inv)?, ev.kb.fmul(nn, inv)?)
        };
        let delta = ev.kb.fsub(mb, ma)?;
        let d2 = ev.kb.fmul(delta, delta)?;
        let q = ev.kb.fadd(qa, qb)?;
        let dw = ev.kb.fmul(d2, w)?;
        let m2 = ev.kb.fadd(q, dw)?;
        let mut out = Vec::with_capacity(3);
        for x in [n, mean, m2] {
            out.push(Acc::I(ev.kb.b.build_bit_cast(x, i64t, "bits")?.into_int_value()));
        }
        Ok(out)
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
        // With chunks held in registers (`RowSchedule::held`) the thread's addresses are
        // computed in the row's body, where each pass uses them: hoisted out of the row loop
        // (which normally runs once) they would all stay live next to the held vectors.
        let t = if s.held > 0 { ev.kb.opaque_here(t)? } else { t };
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
        if self.sched.persistent > 0 {
            // This row's slice was issued before the loop or by the previous row's output pass.
            if self.split.as_ref().is_some_and(|sp| !sp.staged.is_empty()) {
                ev.kb.cp_async_wait(0)?;
            }
        } else {
            if self.head_shift() {
                // The row head's loads first (lane `l` of every warp: the row's chunk at
                // `l·vec`, from global memory — it may lie in another CTA's slice): the shift
                // waits for them, not for the slice's copies.
                let lane_col = ev.imul(lane, ev.ic(i64::from(s.vec)))?;
                let at = self.chunk(ev, &lead, lane_col, nv, true)?.at;
                if let Some(sp) = &self.split {
                    for &(i, _) in &sp.staged {
                        if let Some(v) = ev.load_vector(i, &at)? {
                            ev.pinned.push((i, lane_col, v));
                        }
                    }
                }
                self.head.replace(Some(at));
            }
            self.prefetch_slice(ev, &lead, t, nv, true)?;
            self.load_held(ev, &lead, t)?;
        }
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
                    self.softmax_online_finish(ev, st, m, sm, warp, t)?;
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
                None if self.head_shift() && stats.iter().all(|st| st.kind == StatKind::LnSum) => {
                    // The shift from the row's head (`RowSchedule::head_shift`), its vectors
                    // loaded before the slice's copies ([`Eval::pinned`]).
                    ev.forget();
                    if let Some(st) = ev.stage.as_mut() {
                        st.cursor = None;
                    }
                    let at = self.head.take().ok_or_else(|| CodegenError::Builder("no row head".into()))?;
                    let init = self.identities(ev, &stats);
                    let base = at.axes.last().map(|a| a.base);
                    let acc = self.accumulate(ev, &stats, &Chunk { at, valid: None }, init)?;
                    // The head's vectors are done with (the held chunks' stay).
                    ev.pinned.retain(|(_, b, _)| base.is_none_or(|h| h != *b));
                    ev.forget();
                    acc
                }
                None if self.sampled() && stats.iter().all(|st| st.kind == StatKind::LnSum) => {
                    // A sampled shift: the thread's first chunk of the slice only (see
                    // `RowSchedule::sampled_shift`); its warp's 32 chunks are the sample.
                    ev.forget();
                    let j = ev.imul(t, ev.ic(i64::from(s.vec)))?;
                    let groups = self.groups.get();
                    if groups > 0 {
                        // The first iteration's group; the pass after waits for the others.
                        self.wait_iteration(ev, j, groups)?;
                    }
                    let ch = self.slice_chunk(ev, &lead, j, nv)?;
                    let init = self.identities(ev, &stats);
                    let acc = self.accumulate(ev, &stats, &ch, init)?;
                    ev.forget();
                    if let Some(st) = ev.stage.as_mut() {
                        st.cursor = None;
                    }
                    acc
                }
                None => self.loop_level(ev, &stats, &lead, t, nv)?,
            };
            let totals = self.combine_group(ev, &stats, partials, level, warp, lane)?;
            if self.split.is_some() {
                self.cluster_level(ev, &stats, totals, t, nv, &mut pending_m)?;
            } else {
                for (st, tot) in stats.iter().zip(totals) {
                    self.finish_stat(ev, st, tot, nv, &mut pending_m)?;
                }
            }
        }
        if let Some(c) = self.crow.get() {
            // The last remote read of the CTA's last row is done: the exit barrier's arrive.
            self.guarded(ev, Some(c.last), |ev| ev.kb.cluster_arrive_relaxed())?;
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
            None if !row_outs.is_empty() => self.loop_outputs(ev, &row_outs, &lead, (r, t, nv))?,
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
            let mut first = ev.kb.b.build_int_compare(IntPredicate::EQ, t, ev.ic(0), "t0")?;
            if let Some(c) = self.crow.get() {
                // Every CTA of the cluster holds the row's statistics; the first writes them.
                let r0 = ev.kb.b.build_int_compare(IntPredicate::EQ, c.rank, ev.kb.i32c(0), "r0")?;
                first = ev.kb.b.build_and(first, r0, "t0")?;
            }
            self.guarded(ev, Some(first), |ev| {
                for ((&i, v), at) in scalar_outs.iter().zip(&vals).zip(&ats) {
                    ev.store(&self.obufs[i], at, v)?;
                }
                Ok(())
            })?;
        }
        // The held vectors belong to this row.
        ev.pinned.clear();
        self.held.borrow_mut().clear();
        Ok(())
    }

    /// The row's chunks held in registers ([`RowSchedule::held`]): the slice's last `held`
    /// iterations, each thread's `held·unroll` chunks at the columns every pass maps to it,
    /// loaded as 16-byte vectors right after the staged iterations' copies were issued (the
    /// first pass reaches them last) and kept in [`Eval::pinned`] until the row's output pass
    /// has read them. Nothing to do without held iterations.
    fn load_held(&self, ev: &mut Eval<'_, 'ctx>, lead: &[Ax<'ctx>], t: IntValue<'ctx>) -> R<()> {
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
    fn fold_lanes(
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
    fn combine_all(&self, ev: &mut Eval<'_, 'ctx>, stats: &[Stat], a: &[Acc<'ctx>], b: &[Acc<'ctx>]) -> R<Vec<Acc<'ctx>>> {
        stats.iter().zip(a.iter().zip(b)).map(|(st, (x, y))| self.combine(ev, st.combine(), *x, *y)).collect()
    }

    /// The online softmax's row statistics from the threads' `(m, s)`: warp shuffles, then
    /// (CTA mode) shared memory folded lane-parallel ([`Emitter::fold_lanes`]), then (the
    /// cluster schedule) the cluster's CTAs' ([`Emitter::cluster_fold_with`]); every merge is
    /// symmetric, so every thread ends with the same bits.
    fn softmax_online_finish(&self, ev: &mut Eval<'_, 'ctx>, st: &Stat, m: FloatValue<'ctx>, s: FloatValue<'ctx>, warp: IntValue<'ctx>, t: IntValue<'ctx>) -> R<()> {
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

    /// The cluster schedule's prefetch: before the first pass, a loop over the CTA's slice
    /// issues one 16-byte `cp.async` per staged chunk ([`Eval::prefetch_param`]) with the
    /// chunk-to-thread map of every later pass, then `cp.async.commit_group` and
    /// `cp.async.wait_group 0`, so the whole slice is in flight at once (instead of `unroll`
    /// vectors per thread per round trip) and the first pass reads the stage. Chunks the
    /// prefetch cannot copy (not a contiguous, aligned 16-byte vector) are loaded and staged
    /// by the first pass as before. The staged row-invariant inputs are copied in the same
    /// loop ([`RowSchedule::stage_invariant`]). Nothing to do outside the cluster schedule.
    fn prefetch_slice(&self, ev: &mut Eval<'_, 'ctx>, lead: &[Ax<'ctx>], t: IntValue<'ctx>, nv: IntValue<'ctx>, wait: bool) -> R<()> {
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

    /// A multi-pass loop over the row (or, in the cluster schedule, the CTA's slice):
    /// `body(ev, j, acc)` for each of the `unroll` chunks of an iteration, `j` the chunk's
    /// first element (see [`Emitter::slice_chunk`]), `acc` the loop-carried accumulators
    /// (starting at `init`; `body` returns their next values); returns the accumulators at
    /// the exit. Memoised values are forgotten at the top of the body — before every chunk
    /// when `forget_each` — and after the loop.
    ///
    /// In a pass over the stage (`held` not [`Held::Skip`]) the loop covers the staged
    /// iterations, and the chunks held in registers ([`RowSchedule::held`]) are evaluated
    /// unrolled before or after it.
    fn chunk_loop(&self, ev: &mut Eval<'_, 'ctx>, name: &str, (t, nv): (IntValue<'ctx>, IntValue<'ctx>), init: &[Acc<'ctx>], forget_each: bool, held: Held, body_fn: &mut ChunkBody<'_, 'ctx>) -> R<Vec<Acc<'ctx>>> {
        let init = if held == Held::Before { self.held_chunks(ev, init.to_vec(), body_fn)? } else { init.to_vec() };
        let acc = self.staged_loop(ev, name, (t, nv), &init, forget_each, body_fn)?;
        if held == Held::After {
            return self.held_chunks(ev, acc, body_fn);
        }
        Ok(acc)
    }

    /// [`Emitter::chunk_loop`]'s chunks held in registers, in order.
    fn held_chunks(&self, ev: &mut Eval<'_, 'ctx>, mut acc: Vec<Acc<'ctx>>, body_fn: &mut ChunkBody<'_, 'ctx>) -> R<Vec<Acc<'ctx>>> {
        let js: Vec<IntValue<'ctx>> = self.held.borrow().iter().map(|(j, _)| *j).collect();
        for j in js {
            ev.forget();
            acc = body_fn(ev, j, acc)?;
        }
        ev.forget();
        Ok(acc)
    }

    /// [`Emitter::chunk_loop`]'s loop.
    fn staged_loop(&self, ev: &mut Eval<'_, 'ctx>, name: &str, (t, nv): (IntValue<'ctx>, IntValue<'ctx>), init: &[Acc<'ctx>], forget_each: bool, body_fn: &mut ChunkBody<'_, 'ctx>) -> R<Vec<Acc<'ctx>>> {
        let s = self.sched;
        let ity = ev.ity();
        let pre = ev.kb.current_block()?;
        let header = ev.kb.block(name);
        let body = ev.kb.block(&format!("{name}_body"));
        let exit = ev.kb.block(&format!("{name}_exit"));
        ev.kb.br(header)?;
        ev.kb.position(header);
        let it = ev.kb.b.build_phi(ity, "it")?;
        it.add_incoming(&[(&ev.ic(0), pre)]);
        let mut phis = Vec::with_capacity(init.len());
        for a in init {
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
        let per_iter = s.per_iter();
        let start = ev.imul(itv, ev.ic(per_iter))?;
        let bound = self.loop_bound(ev, nv)?;
        let more = ev.ilt(start, bound)?;
        ev.kb.cond_br(more, body, exit)?;
        ev.kb.position(body);
        self.no_unroll(ev)?;
        if !forget_each {
            ev.forget();
        }
        let mut acc: Vec<Acc<'ctx>> = phis.iter().map(|(_, v)| *v).collect();
        let tj = ev.imul(t, ev.ic(i64::from(s.vec)))?;
        for u in 0..s.unroll {
            if forget_each {
                ev.forget();
            }
            let off = ev.ic(i64::from(u) * i64::from(s.threads_per_row) * i64::from(s.vec));
            let j = ev.iadd(start, off)?;
            let j = ev.iadd(j, tj)?;
            acc = body_fn(ev, j, acc)?;
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

    /// The coordinate of the chunk held in registers at slice element `j` (an SSA value of
    /// [`Emitter::held`]), if it is one.
    fn held_at(&self, j: IntValue<'ctx>) -> Option<At<'ctx>> {
        self.held.borrow().iter().find(|(h, _)| *h == j).map(|(_, at)| at.clone())
    }

    /// The multi-pass schedule's loop over the row for one level.
    fn loop_level(&self, ev: &mut Eval<'_, 'ctx>, stats: &[Stat], lead: &[Ax<'ctx>], t: IntValue<'ctx>, nv: IntValue<'ctx>) -> R<Vec<Acc<'ctx>>> {
        let init = self.identities(ev, stats);
        let groups = self.groups.replace(0);
        let calls = Cell::new(0u32);
        let out = self.chunk_loop(ev, "pass", (t, nv), &init, false, Held::After, &mut |ev, j, acc| {
            if groups > 0 && calls.get() % self.sched.unroll == 0 && self.held_at(j).is_none() {
                self.wait_iteration(ev, j, groups)?;
            }
            calls.set(calls.get() + 1);
            let ch = self.slice_chunk(ev, lead, j, nv)?;
            self.accumulate(ev, stats, &ch, acc)
        })?;
        if let Some(st) = ev.stage.as_mut() {
            st.end_pass();
        }
        Ok(out)
    }

    /// Waits for the prefetch's commit group of the loop iteration whose first chunk for this
    /// thread is slice element `j` (and every earlier one): with `groups` groups committed in
    /// iteration order, iteration `k = ⌊j / (unroll·T·vec)⌋` may leave `groups − 1 − k` in
    /// flight (`cp.async.wait_group` takes a constant: a uniform branch per count, capped at
    /// 7, which only waits for more).
    fn wait_iteration(&self, ev: &mut Eval<'_, 'ctx>, j: IntValue<'ctx>, groups: u32) -> R<()> {
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

    /// The multi-pass loops' chunk at element `j` of the pass (`j` counts from the row's
    /// start, or in the cluster schedule from the CTA's slice's start, and is then also the
    /// chunk's slot in the staged arrays).
    fn slice_chunk(&self, ev: &mut Eval<'_, 'ctx>, lead: &[Ax<'ctx>], j: IntValue<'ctx>, nv: IntValue<'ctx>) -> R<Chunk<'ctx>> {
        let Some(c) = self.crow.get() else {
            return self.chunk(ev, lead, j, nv, false);
        };
        if let Some(at) = self.held_at(j) {
            // Held in registers: read through `Eval::pinned`, not the stage.
            if let Some(st) = ev.stage.as_mut() {
                st.cursor = None;
            }
            return Ok(Chunk { at, valid: None });
        }
        let col = ev.iadd(c.start, j)?;
        let exact = self.split.as_ref().is_some_and(|s| s.exact);
        let ch = self.chunk(ev, lead, col, c.end, exact)?;
        if let Some(st) = ev.stage.as_mut() {
            let k = ch.at.axes.len() - 1;
            st.cursor = Some((ch.at.axes[k].base, j));
        }
        Ok(ch)
    }

    /// In the cluster schedule, `.pragma "nounroll";` at the start of a pass loop's body (the
    /// loop's header once LLVM has rotated it; PTX ISA §11.4, "Performance-Tuning Directives:
    /// .pragma"): ptxas sees through the opaque trip count and would otherwise unroll the few
    /// iterations of a slice completely, hoisting every load and exceeding the register budget
    /// of the occupancy the schedule asks for.
    fn no_unroll(&self, ev: &mut Eval<'_, 'ctx>) -> R<()> {
        if self.split.is_none() {
            return Ok(());
        }
        let vt = ev.kb.cx.void_type().fn_type(&[], false);
        let asm = ev.kb.cx.create_inline_asm(vt, ".pragma \"nounroll\";".to_owned(), String::new(), true, false, None, false);
        ev.kb.b.build_indirect_call(vt, asm, &[], "")?;
        Ok(())
    }

    /// The row length as the multi-pass loops' bound: a constant is made opaque so that
    /// LLVM keeps the loop a loop (see [`crate::emit::KernelBuilder::opaque`]).
    fn loop_bound(&self, ev: &mut Eval<'_, 'ctx>, nv: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        if let Some(split) = &self.split {
            // The cluster schedule loops over its CTA's slice (its staged iterations).
            let per_iter = self.sched.per_iter();
            let sv = ev.ic(if split.held > 0 { (split.iters - split.held) * per_iter } else { split.slice });
            ev.kb.in_prologue(|kb| kb.opaque(sv))
        } else if self.plan.n.as_const().is_some() {
            ev.kb.in_prologue(|kb| kb.opaque(nv))
        } else {
            Ok(nv)
        }
    }

    /// The multi-pass schedule's output pass.
    ///
    /// In a persistent schedule ([`RowSchedule::persistent`]) each chunk's staged slots are
    /// refilled with the next row's chunk (row `r` + the grid's clusters) once the chunk's
    /// outputs are stored: one `cp.async` a chunk, of 0 bytes past the last row (the source
    /// address clamped to row `r`), committed as one group that the next row waits for.
    fn loop_outputs(&self, ev: &mut Eval<'_, 'ctx>, row_outs: &[usize], lead: &[Ax<'ctx>], (r, t, nv): (IntValue<'ctx>, IntValue<'ctx>, IntValue<'ctx>)) -> R<()> {
        if let Some(st) = ev.stage.as_mut() {
            // Staged inputs are read, not filled, by the outputs.
            st.fill = false;
        }
        let refill = match &self.split {
            Some(split) if self.sched.persistent > 0 && !split.staged.is_empty() => {
                let rows = ev.dim(&Dim::product(&self.plan.lead))?;
                let nctaid = ev.kb.nctaid_x()?;
                let stride = ev.kb.b.build_int_z_extend_or_bit_cast(nctaid, ev.ity(), "rs")?;
                let next = ev.iadd(r, stride)?;
                let more = ev.ilt(next, rows)?;
                let rn = ev.kb.b.build_select(more, next, r, "rn")?.into_int_value();
                let bytes = ev.kb.b.build_select(more, ev.kb.i32c(16), ev.kb.i32c(0), "bytes")?.into_int_value();
                Some((self.lead_axes(ev, rn)?, bytes, split.staged.clone()))
            }
            _ => None,
        };
        self.chunk_loop(ev, "out", (t, nv), &[], true, Held::Before, &mut |ev, j, acc| {
            let ch = self.slice_chunk(ev, lead, j, nv)?;
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
            if let Some((next_lead, bytes, staged)) = &refill {
                let mut at = ch.at.clone();
                at.axes[..next_lead.len()].copy_from_slice(next_lead);
                for &(i, _) in staged {
                    if !ev.refill_param(i, &at, *bytes)? {
                        return Err(CodegenError::Unsupported {
                            kernel: String::new(),
                            message: format!("a persistent row schedule needs parameter {i}'s chunks to be aligned 16-byte vectors (one cp.async each)"),
                        });
                    }
                }
            }
            Ok(acc)
        })?;
        if refill.is_some() {
            ev.kb.cp_async_commit()?;
        }
        if let Some(st) = ev.stage.as_mut() {
            st.end_pass();
            st.fill = true;
        }
        Ok(())
    }

    /// Combines the per-thread partials of the row group: warp shuffles, then (CTA mode)
    /// shared memory across warps.
    ///
    /// In the cluster schedule a `layer_norm`'s statistics stop at the warp (see
    /// [`Emitter::warp_only`]): they are returned as warp totals.
    fn combine_group(&self, ev: &mut Eval<'_, 'ctx>, stats: &[Stat], partials: Vec<Acc<'ctx>>, level: usize, warp: IntValue<'ctx>, lane: IntValue<'ctx>) -> R<Vec<Acc<'ctx>>> {
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

    /// Whether statistic `st` is combined over the warp only by [`Emitter::combine_group`]:
    /// a `layer_norm`'s in the cluster schedule, whose statistics are corrected two-pass per
    /// warp and merged once as `(n, mean, M2)` triples (see [`Emitter::cluster_level`]).
    ///
    /// Only where every slice is whole loop iterations (`Split::exact`): elsewhere (an odd
    /// row length, a short last slice) the bounds checks leave no registers for the warps'
    /// `f64` triples (a `bf16` LayerNorm of 262147 spilled 12 bytes at 40 registers), and the
    /// CTA's statistics are merged as before.
    fn warp_only(&self, st: &Stat) -> bool {
        self.ln_per_warp()
            && match st.kind {
                // A shift from the row's head is the same in every warp: no fold.
                StatKind::LnSum => true,
                StatKind::LnDev | StatKind::LnVar => !self.head_shift(),
                _ => false,
            }
    }

    /// Whether this kernel's LayerNorm shift is the mean of the row's head
    /// ([`RowSchedule::head_shift`]).
    fn head_shift(&self) -> bool {
        self.sched.head_shift && self.sampled()
    }

    /// Whether this kernel's LayerNorm shifts are sampled ([`RowSchedule::sampled_shift`]):
    /// only where the statistics are the warp's ([`Emitter::ln_per_warp`]).
    fn sampled(&self) -> bool {
        self.sched.sampled_shift && self.ln_per_warp()
    }

    /// Whether a `layer_norm`'s statistics are the warp's until the exchange (see
    /// [`Emitter::warp_only`]).
    fn ln_per_warp(&self) -> bool {
        self.split.as_ref().is_some_and(|s| s.exact)
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

    /// A `layer_norm`'s statistics in the one-read schedule ([`StatKind::LnFused`]).
    ///
    /// Warp `w` (`n_w` valid elements, a constant: `N` is) computes `b_w = Σx/n_w` (f32,
    /// shuffles), then `dev_w = Σ(x − b_w)` and `q_w = Σ(x − b_w)²` on the values in
    /// registers (shuffles): its mean is `b_w + dev_w/n_w` and `M2_w = q_w − dev_w²/n_w`, the
    /// corrected two-pass. The warps' `(b_w, dev_w/n_w, M2_w, n_w)` go through shared memory
    /// once (one barrier, one 16-byte store a warp); lane `l` of every warp then takes warp
    /// `l mod n_w`'s and butterfly shuffles sum the terms of the merge relative to warp 0's
    /// `b_0` (Chan et al.: `δ_w = (b_w − b_0) + dev_w/n_w`, `d = Σ n_w δ_w / N`,
    /// `M2 = Σ M2_w + Σ n_w δ_w² − N d²`), so the row mean is `b_0 + d` without rounding it to
    /// one f32 (rows with a large mean and a small spread stay accurate), and the output reads
    /// `(x − b_w) − (d − (b_w − b_0))` from the centred values already in registers.
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
        // This thread's warp's count (uniform over the warp), at least 1 as a divisor, and as
        // it is (0 for a warp past the row's end: its terms of the merge below vanish).
        let per_warp = |ev: &mut Eval<'_, 'ctx>, f: &dyn Fn(i64) -> i64| -> R<FloatValue<'ctx>> {
            if counts.iter().all(|&c| f(c) == f(counts[0])) {
                return Ok(ev.kb.f32c(f(counts[0]) as f32));
            }
            let mut acc = ev.kb.f32c(f(counts[0]) as f32);
            for (w, &c) in counts.iter().enumerate().skip(1) {
                let is = ev.kb.b.build_int_compare(IntPredicate::EQ, warp, ev.ic(w as i64), "isw")?;
                acc = ev.kb.fsel(is, ev.kb.f32c(f(c) as f32), acc)?;
            }
            Ok(acc)
        };
        let n_own = per_warp(ev, &|c| c.max(1))?;
        let n_count = per_warp(ev, &|c| c)?;
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
            // (b_w, dev_w/n_w, M2_w, n_w) of each warp: one 16-byte store, a barrier; then lane
            // l takes warp k = l mod n_w's (one 16-byte load) and butterfly shuffles sum its
            // terms over the warps (see `fold_warps`).
            let mw = ev.kb.fdiv(dev_w, n_own)?;
            let ndv = ev.kb.fneg(dev_w)?;
            let m2w = ev.kb.ffma(ndv, mw, q_w)?;
            let v4 = f32t.vec_type(4);
            let arr = self.smem_array(ev, f32t.into(), 4, 4 * nw, &format!("ln_{}", node.as_u32()))?;
            let mut v = v4.get_undef();
            for (i, x) in [b_w, mw, m2w, n_count].into_iter().enumerate() {
                v = ev.kb.b.build_insert_element(v, x, ev.kb.cx.i32_type().const_int(i as u64, false), "ln")?;
            }
            // The warp index computed again here from `%tid.x` (made opaque): kept from the
            // prologue, its shared address is what ptxas spills at 48 registers.
            let _ = warp;
            let tid = ev.kb.tid_x()?;
            let tid = ev.kb.opaque(tid)?;
            let tid = ev.kb.b.build_int_z_extend_or_bit_cast(tid, ev.ity(), "tid")?;
            let warp = ev.kb.b.build_right_shift(tid, ev.ic(5), false, "warp")?;
            let lane = ev.kb.b.build_and(tid, ev.ic(31), "lane")?;
            let idx = ev.imul(warp, ev.ic(4))?;
            let p = ev.kb.gep(f32t.into(), arr, idx)?;
            ev.kb.store(p, v.into(), 16)?;
            ev.kb.barrier()?;
            let k = ev.kb.b.build_and(lane, ev.ic(i64::from(nw - 1)), "k")?;
            let p = ev.kb.gep(f32t.into(), arr, ev.imul(k, ev.ic(4))?)?;
            let vk = ev.kb.load(v4.into(), p, 16)?.into_vector_value();
            let mut e = [f32t.const_zero(); 4];
            for (i, slot) in e.iter_mut().enumerate() {
                *slot = ev.kb.b.build_extract_element(vk, ev.kb.cx.i32_type().const_int(i as u64, false), "ln")?.into_float_value();
            }
            let [b, mwk, m2k, ck] = e;
            let p0 = ev.kb.gep(f32t.into(), arr, ev.ic(0))?;
            let b0 = ev.kb.load(f32t.into(), p0, 16)?.into_float_value();
            // δ_k = (b_k − b_0) + dev_k/n_k; d = Σ n_k δ_k / N; M2 = Σ M2_k + Σ n_k δ_k² − N d²
            // (δ_0 ≈ 0, so |d| ≤ max |δ_k − δ_0| + |δ_0|: no cancellation that matters). A warp
            // with no element of the row has n_k = 0 and adds nothing.
            let off = ev.kb.fsub(b, b0)?;
            let delta = ev.kb.fadd(off, mwk)?;
            let cd = ev.kb.fmul(ck, delta)?;
            let cd2 = ev.kb.fmul(cd, delta)?;
            let m2k = ev.kb.fadd(m2k, cd2)?;
            let (mut sd, mut m2) = (cd, m2k);
            let mut o = 1;
            while o < nw {
                let a = ev.kb.shfl_bfly_f32(sd, o)?;
                let c = ev.kb.shfl_bfly_f32(m2, o)?;
                sd = ev.kb.fadd(sd, a)?;
                m2 = ev.kb.fadd(m2, c)?;
                o *= 2;
            }
            let d = ev.kb.fdiv(sd, nf)?;
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
