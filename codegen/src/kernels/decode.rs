//! Split-KV paged decode attention ([`Family::PagedAttention`]): FlashDecoding over a paged
//! KV cache, the keys of a sequence split across the warps of a CTA and, on sm_90, across
//! the CTAs of a thread-block cluster, the partial results merged by their log-sum-exp.
//!
//! # Algorithm
//! `paged_attention(q [B, H, T, D], k_pages [P, S, Hkv, D], v_pages, block_table [B, M] i32,
//! seq_lens [B] i32)` (semantics as [`super::attention`]'s module docs say: bottom-right causal
//! alignment within the step, GQA, clamped lengths and page numbers, fully masked rows 0,
//! NaN propagated). A CTA serves `rows` query rows that share one KV head (the `H/Hkv · T`
//! rows of a GQA group, so each K/V byte is read once per CTA) of one sequence; a cluster of
//! `cluster` CTAs serves the same rows. The sequence's keys are cut into tiles of 32; the
//! `U = cluster · warps` warps of the cluster are *workers* (warp `w` of CTA rank `c` is
//! worker `u = w·cluster + c`, so consecutive tiles go to different SMs), and worker `u`
//! takes tiles `u, u + U, u + 2U, …` (FlashDecoding, Dao et al. 2023, "Flash-Decoding for long-context
//! inference": split the keys, not only the queries, so that a batch of few long sequences
//! still fills the GPU). Per tile, with no CTA barrier:
//! - lane `j` owns key `j` of the tile: it looks its page up in the block table and reads its
//!   whole K row (16-byte vectors where the layout allows) and computes the scores of the
//!   CTA's rows against it, `s = scale·q·k` in f32 (Q staged once in shared memory, in f32);
//! - per row, the warp takes the tile maximum and the sum of `p = exp(s − m_new)` with
//!   `shfl.sync.bfly` butterflies and rescales its running sum and accumulator (online
//!   softmax, FlashAttention-2, arXiv 2307.08691) — the same 16-key rule as the
//!   interpreter: while every score the worker has seen is −inf, a 16-key half tile is
//!   skipped rather than multiplied;
//! - the keys' V-row offsets and `p` go through the warp's slice of shared memory, and lane
//!   `l` accumulates `P·V` over output dims `l·dv/32 …` (8-byte coalesced V reads for D =
//!   128). The V slices of the tile's first keys (all 32 for D ≤ 128 in bf16: about 64
//!   registers) are loaded before the K row, so that one memory round trip serves the tile;
//!   the rest are loaded eight at a time.
//!
//! Each worker leaves `(m, l, acc)` per row in its CTA's shared memory. The CTA (and, for a
//! cluster, every CTA of it after `barrier.cluster.arrive`/`wait`, reading the others'
//! partials through distributed shared memory: `mapa.shared::cluster` +
//! `ld.shared::cluster`, PTX ISA §9.7.9.22 and §9.7.13.4) merges them by log-sum-exp:
//! `M = max m_u`, `O = Σ acc_u·e^{m_u − M} / Σ l_u·e^{m_u − M}`; each CTA of a cluster merges
//! and writes `1/cluster` of the outputs; a last cluster barrier keeps every CTA's shared
//! memory alive until the others have read it. A row whose workers all saw only −inf (or no
//! key) gives exactly 0. A cluster whose sequence has at most `SOLO_TILES` = 8 tiles (256 keys)
//! runs in *solo mode*: its first CTA's warps take every tile and merge alone, the other CTAs
//! return at once, and no cluster barrier is crossed (the chat-length decode of a small
//! model, where the barriers cost more than the split gains).
//!
//! With `lse=true` the thread that writes a row's output dim 0 also writes the row's
//! log-sum-exp `M + ln Σ l_u·e^{m_u − M}` (−inf for a row without a finite score).
//!
//! # Unified maximum (FlashDecoding++)
//! With the node's `unified_max = φ` the workers use FlashDecoding++'s asynchronous softmax
//! with a unified maximum (Hong et al. 2023, "FlashDecoding++: Faster Large Language Model
//! Inference on GPUs", arXiv 2311.01282, §3): per tile and row, lane `j` takes
//! `p = exp(s − φ)` against the one maximum φ chosen ahead of time instead of the running
//! maximum, so there is no tile-maximum butterfly and no rescaling of the running sum and
//! accumulator — and no per-tile sum butterfly either: each lane adds its p to its own partial
//! sum and keeps its own running maximum of its raw scores (one `max`), and the 16-key rule
//! comes from one `vote.ballot` of "score ≠ −inf" (NaN counts, as in the running maximum).
//! After its last tile the worker reduces the two across the warp (two butterflies per row)
//! and checks each row's largest score `m` against the window `[φ − UMAX_LO, φ + UMAX_HI]`
//! = `[φ − 30, φ + 20]` (the constants' docs give the reasons: above it exp(s − φ) could
//! overflow the sum or the accumulator, below it the weights would lose their precision to
//! subnormals and then underflow to 0).
//! - Every row inside the window (or empty: `m = −inf`; or NaN, which the result carries on
//!   either path): the worker reports `(φ, Σp, Σp·v)` per row, `(−inf, 0, 0)` for an empty
//!   one, and the log-sum-exp merge above combines the partials unchanged (`e^{φ − M} = 1`
//!   between two fast workers, so they merge without any rescaling).
//! - Some row outside it (`+inf` included): the worker *recomputes its own tiles* with the
//!   online softmax, in the kernel (reading its K and V again; no other worker waits, no
//!   host round trip), and reports its own `(m, l, acc)` as without `unified_max`.
//!
//! φ cancels in the merge, so the result is the same softmax; it is rounded differently: the
//! fast path rounds `s − φ` where the online one rounds `s − m`, which adds at most about
//! `47 · 2⁻²⁴ ≈ 3e-6` relative to the weight of any key within `e^−17` of the row's largest
//! (the keys f32 can tell apart from 0 in the sum). Fully masked rows give exactly 0, NaN
//! propagates, −inf scores contribute 0, and `lse=true` gives `φ + ln Σp` for the fast
//! workers' share — the same log-sum-exp. A good φ is an upper estimate of the scores'
//! maximum from the model's statistics (the benchmark takes the bound `scale · D · max|q| ·
//! max|k|` of its random inputs); a poor one costs the recomputation, never the result.
//!
//! A worker's "every score so far" is its own tiles', so where a key's score is −inf (an
//! infinite K element) and its V row holds NaN, the interpreter (one pass from key 0) may
//! multiply that V row by 0 where a worker skips it; finite inputs and NaN/inf anywhere else
//! agree.
//!
//! # Launch
//! Grid `(⌈rows_total / rows⌉ · cluster, Hkv, B)`, block `32 · warps`, cluster dims
//! `(cluster, 1, 1)` declared in the PTX (`.reqnctapercluster`, from the function attribute
//! `"nvvm.cluster_dim"`), so a plain `cuLaunchKernel` launches it. sm_80 has no clusters: the
//! split is across the CTA's warps only. A symbolic row count (`T` not constant) also uses
//! `cluster = 1`, since the grid's x extent must then be a multiple of the cluster.

use inkwell::attributes::AttributeLoc;
use inkwell::context::Context;
use inkwell::values::{FloatValue, IntValue, PointerValue};
use inkwell::{FloatPredicate, IntPredicate};
use sinter_ir::{DType, Family, GridDim, Kernel, KernelGraph, LaunchPlan};

use super::attention::{dynamic_bytes, shared_kind, unsupported, Paged};
use super::matmul::kit::{Kit, R};
use crate::target::Target;
use crate::CodegenError;

/// Keys per tile (one per lane).
const TILE: u32 = 32;

/// A cluster whose sequence has at most this many tiles runs in solo mode (its first CTA
/// does all the work, see the module docs).
const SOLO_TILES: u32 = 8;

/// Work split of a split-KV decode kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DecodeSchedule {
    /// Warps per CTA (workers per CTA), 1 to 16.
    pub warps: u32,
    /// Query rows per CTA (1 to 16), all of one KV head.
    pub rows: u32,
    /// CTAs per thread-block cluster splitting one row tile's keys (1, 2, 4 or 8; > 1 only
    /// on sm_90 and with a constant row count).
    pub cluster: u32,
}

impl DecodeSchedule {
    /// Threads per CTA.
    pub fn threads(&self) -> u32 {
        32 * self.warps
    }

    fn check(&self, target: &Target) -> Result<(), String> {
        if !(1..=16).contains(&self.warps) || !(1..=16).contains(&self.rows) || !matches!(self.cluster, 1 | 2 | 4 | 8) {
            return Err(format!("invalid decode schedule {self:?}: warps and rows in 1..=16, cluster 1, 2, 4 or 8"));
        }
        if self.cluster > 1 && target.sm_version() < 90 {
            return Err(format!("thread-block clusters need sm_90 or later, not {target}"));
        }
        Ok(())
    }
}

/// The schedule [`generate`] uses: 4 warps; the whole GQA group of a KV head per CTA when
/// it has at most 8 rows (else tiles of 8); clusters of 8 CTAs on sm_90 when the row count is
/// a constant (so 8 × 4 = 32 workers share each sequence's keys), none on sm_80.
pub fn choose_schedule(rows: Option<i64>, target: &Target) -> DecodeSchedule {
    let r = rows.map_or(8, |r| r.clamp(1, 8) as u32);
    let cluster = if rows.is_some() && target.sm_version() >= 90 { 8 } else { 1 };
    DecodeSchedule { warps: 4, rows: r, cluster }
}

/// Shared-memory layout (bytes): Q in f32, per warp P and the keys' V offsets, the workers'
/// partial results.
struct Smem {
    q: u32,
    p: u32,
    voff: u32,
    part: u32,
    acc: u32,
    total: u32,
}

impl Smem {
    fn new(s: &DecodeSchedule, d: u32, dv: u32) -> Smem {
        let q = 0;
        let p = q + 4 * s.rows * d;
        let voff = p + 4 * s.warps * s.rows * TILE;
        let part = voff + 8 * s.warps * TILE;
        let acc = part + 8 * s.warps * s.rows;
        let total = acc + 4 * s.warps * s.rows * dv;
        Smem { q, p, voff, part, acc, total }
    }
}

/// Generates split-KV paged decode attention for kernel `kernel` of `graph` with
/// [`choose_schedule`]'s schedule. See the module docs.
///
/// # Errors
/// [`CodegenError::Unsupported`] for a body [`super::attention::generate_paged`] refuses, or
/// a head dim whose per-CTA shared memory exceeds the target's limit; LLVM errors otherwise.
pub fn generate(graph: &KernelGraph, kernel: Kernel, target: &Target) -> Result<LaunchPlan, CodegenError> {
    let p = Paged::analyse(graph, kernel)?;
    let s = choose_schedule(p.rows().as_const(), target);
    plan(&p, target, &s)
}

/// As [`generate`], with the schedule given.
///
/// # Errors
/// As [`generate`], and [`CodegenError::Unsupported`] for an invalid schedule (a cluster on
/// sm_80, or with a symbolic row count).
pub fn generate_with(graph: &KernelGraph, kernel: Kernel, target: &Target, schedule: &DecodeSchedule) -> Result<LaunchPlan, CodegenError> {
    let p = Paged::analyse(graph, kernel)?;
    plan(&p, target, schedule)
}

fn plan(p: &Paged, target: &Target, s: &DecodeSchedule) -> R<LaunchPlan> {
    let fam = Family::PagedAttention;
    s.check(target).map_err(|e| unsupported(&p.name, fam, e))?;
    let rows_total = p.rows();
    if s.cluster > 1 && rows_total.as_const().is_none() {
        return Err(unsupported(&p.name, fam, "a cluster needs a constant number of query rows per KV head"));
    }
    let smem = Smem::new(s, p.d, p.d);
    let shared = shared_kind(smem.total, target, &p.name, fam)?;
    let ctx = Context::create();
    let entry = format!("{}_paged_attention", p.name);
    let (ptx, params) = Kit::build(&ctx, &entry, *target, p.n_inputs, p.n_buffers - p.n_inputs, &p.dims(), s.threads(), |kit| build(kit, p, s, &smem, shared))?;
    let gx = match rows_total.as_const() {
        Some(r) => GridDim::fixed((r.max(1) as u32).div_ceil(s.rows) * s.cluster),
        None => GridDim { numerator: rows_total, denominator: s.rows },
    };
    Ok(LaunchPlan {
        entry,
        ptx,
        target: *target,
        grid: [gx, GridDim::fixed(p.kv_heads as u32), GridDim { numerator: p.batch.clone(), denominator: 1 }],
        block: [s.threads(), 1, 1],
        shared_bytes: dynamic_bytes(shared),
        params,
    })
}

/// A worker whose largest score of a row exceeds φ + `UMAX_HI` recomputes its tiles with the
/// online softmax: each of its at most 2³¹ keys then has p = e^(s − φ) ≤ e^20, so its sum l
/// stays below 2³¹·e^20 < e^42 and its accumulator below e^42·max|V| — no overflow of f32
/// (max ≈ e^88.7) for any |V| < e^46 ≈ 10^20 (the bound e^HI·max_kv_len < f32 max alone would
/// allow HI ≈ 67, with no room left for V).
const UMAX_HI: f64 = 20.0;

/// A worker whose largest (finite) score of a row is below φ − `UMAX_LO` recomputes its tiles
/// with the online softmax: on the fast path its largest p is at least e^−30, so every key
/// whose weight is within e^−57 of the largest (far below f32's resolution, 2^−24 ≈ e^−16.6)
/// still has a normal f32 p ≥ e^−87, and the largest key's p·v stays normal for |v| ≥ e^−57.
/// (LO ≈ 87 would only keep the largest p from underflowing to 0, with the other keys' weights
/// already subnormal or lost.)
const UMAX_LO: f64 = 30.0;

/// Per-row state of the unified-max path (see the module docs).
struct Unified<'ctx> {
    /// Each lane's running maximum of its raw scores (NaN propagated).
    lmax: Vec<PointerValue<'ctx>>,
    /// Each lane's sum of its p = e^(s − φ).
    lsum: Vec<PointerValue<'ctx>>,
    /// `i1`: whether the worker has seen a score other than −inf (the 16-key rule).
    seen: Vec<PointerValue<'ctx>>,
}

/// Test hooks of the unified-max path: `PoisonFallback` makes a worker that recomputed report
/// l = NaN (so the rows it served come out NaN), `NeverFallback` drops the recomputation, so
/// that the tests can see which path each worker took.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(not(test), allow(dead_code))]
enum Probe {
    Off,
    PoisonFallback,
    NeverFallback,
}

#[cfg(test)]
thread_local! {
    static PROBE: std::cell::Cell<Probe> = const { std::cell::Cell::new(Probe::Off) };
}

fn probe() -> Probe {
    #[cfg(test)]
    return PROBE.with(std::cell::Cell::get);
    #[cfg(not(test))]
    Probe::Off
}

/// One query row of the CTA: whether it exists, its q and o offsets, how many keys it sees.
struct Row<'ctx> {
    valid: IntValue<'ctx>,
    q_off: IntValue<'ctx>,
    o_off: IntValue<'ctx>,
    /// Keys it sees (i32): the causal limit, ≤ the sequence length; 0 for a missing row.
    limit: IntValue<'ctx>,
    /// Element offset of its log-sum-exp, when the kernel writes it (`lse=true`).
    lse_off: Option<IntValue<'ctx>>,
}

#[allow(clippy::too_many_lines)]
fn build<'ctx>(kit: &Kit<'ctx>, p: &Paged, s: &DecodeSchedule, sm: &Smem, shared: super::matmul::kit::SharedKind) -> R<()> {
    let dt = p.dtype;
    let (d, dv) = (p.d, p.d);
    let (rt, nw, nc) = (s.rows, s.warps, s.cluster);
    if nc > 1 {
        let attr = kit.ctx.create_string_attribute("nvvm.cluster_dim", &format!("{nc},1,1"));
        kit.math(|kb| {
            kb.func.add_attribute(AttributeLoc::Function, attr);
            Ok(())
        })?;
    }
    let smem = kit.shared(shared, sm.total)?;
    let at = |k: &Kit<'ctx>, base: u32, e: IntValue<'ctx>, size: i32| -> R<PointerValue<'ctx>> { k.sh_at(smem, k.add(k.i32c(base as i32), k.mul(e, k.i32c(size))?)?) };
    let i32c = |v: u32| kit.i32c(v as i32);
    let zero = kit.f32c(0.0);
    let ninf = kit.f32c(f64::NEG_INFINITY);
    let tid = kit.sreg("tid.x")?;
    let warp = kit.udiv(tid, i32c(32))?;
    let lane = kit.urem(tid, i32c(32))?;
    let cx = kit.sreg("ctaid.x")?;
    let rank = kit.urem(cx, i32c(nc))?;
    let tile_row = kit.zext64(kit.udiv(cx, i32c(nc))?)?;
    let g = kit.zext64(kit.sreg("ctaid.y")?)?;
    let b = kit.zext64(kit.sreg("ctaid.z")?)?;

    // The sequence's length (clamped to what the table can hold) and the paged addressing.
    let a = p.addressing(kit, g, b)?;
    let row = |k: &Kit<'ctx>, r: u32| -> R<Row<'ctx>> {
        let rg = k.add(k.mul(tile_row, k.i64c(i64::from(rt)))?, k.i64c(i64::from(r)))?;
        let (valid, q_off, o_off, limit) = a.row(k, rg)?;
        let limit = k.select_int(valid, limit, k.i64c(0))?;
        Ok(Row { valid, q_off, o_off, limit: k.trunc32(limit)?, lse_off: a.lse_off(k, rg)? })
    };
    let rows: Vec<Row> = (0..rt).map(|r| row(kit, r)).collect::<R<_>>()?;

    // 1. Q → shared memory (f32), zeros for missing rows.
    let ck = [8u32, 4, 2, 1].into_iter().find(|c| d % c == 0).unwrap_or(1);
    let q_vec = p.q.vector_ok(ck);
    let q_sd = kit.dim(&p.q.st[3])?;
    for (r, info) in rows.iter().enumerate() {
        kit.for_range(tid, i32c(d / ck), i32c(s.threads()), |k, c| {
            let dc = k.mul(c, i32c(ck))?;
            let idx = k.add(info.q_off, k.mul(k.zext64(dc)?, q_sd)?)?;
            let vals = k.guarded_load(info.valid, dt, k.buf(p.q.buffer)?, idx, ck, q_vec, q_sd)?;
            k.sh_store(DType::F32, at(k, sm.q, k.add(i32c(r as u32 * d), dc)?, 4)?, &vals)
        })?;
    }
    kit.barrier()?;

    // 2. The worker's tiles.
    let kv_end = rows.iter().try_fold(kit.i32c(0), |acc, r| kit.smax(acc, r.limit))?;
    let ntiles = kit.udiv(kit.add(kv_end, i32c(TILE - 1))?, i32c(TILE))?;
    // Solo mode (a cluster whose sequence has at most SOLO_TILES tiles): rank 0 takes every
    // tile, the other CTAs leave at once, and no cluster barrier is crossed. Otherwise
    // consecutive tiles go to different CTAs (SMs) first, then to the warps of each.
    let solo = if nc > 1 { kit.icmp(IntPredicate::ULE, ntiles, i32c(SOLO_TILES))? } else { kit.bool_c(true) };
    if nc > 1 {
        let idle = kit.and(solo, kit.icmp(IntPredicate::NE, rank, i32c(0))?)?;
        let (leave, stay) = kit.math(|kb| Ok((kb.block("idle"), kb.block("work"))))?;
        kit.math(|kb| kb.cond_br(idle, leave, stay))?;
        kit.math(|kb| {
            kb.position(leave);
            kb.ret()?;
            kb.position(stay);
            Ok(())
        })?;
    }
    let worker = kit.select_int(solo, warp, kit.add(kit.mul(warp, i32c(nc))?, rank)?)?;
    let n_workers = kit.select_int(solo, i32c(nw), i32c(nc * nw))?;
    let m: Vec<PointerValue> = (0..rt).map(|_| kit.var_f(ninf)).collect::<R<_>>()?;
    let l: Vec<PointerValue> = (0..rt).map(|_| kit.var_f(zero)).collect::<R<_>>()?;
    // Lane dims: `cv` consecutive dims per lane when dv is a multiple of 32, else dims
    // lane + 32·i (i < nd), guarded by dv.
    let per_lane = dv % 32 == 0 && matches!(dv / 32, 1 | 2 | 4 | 8);
    let nd = if per_lane { dv / 32 } else { dv.div_ceil(32) };
    let v_vec = per_lane && p.vp.vector_ok(nd);
    let dim_of = |k: &Kit<'ctx>, i: u32| -> R<IntValue<'ctx>> {
        if per_lane {
            k.add(k.mul(lane, i32c(nd))?, i32c(i))
        } else {
            k.add(lane, i32c(32 * i))
        }
    };
    let acc: Vec<Vec<PointerValue>> = (0..rt).map(|_| (0..nd).map(|_| kit.var_f(zero)).collect::<R<_>>()).collect::<R<_>>()?;
    let (k_sd, v_sd) = (kit.dim(&p.kp.st[3])?, kit.dim(&p.vp.st[3])?);
    let k_vec = p.kp.vector_ok(ck);
    let (k_ptr, v_ptr) = (kit.buf(p.kp.buffer)?, kit.buf(p.vp.buffer)?);
    let scale = kit.f32c(p.scale);
    let i64t = kit.i64t;
    let p_row = |k: &Kit<'ctx>, r: u32, jj: IntValue<'ctx>| -> R<PointerValue<'ctx>> {
        let e = k.add(k.mul(k.add(k.mul(warp, i32c(rt))?, i32c(r))?, i32c(TILE))?, jj)?;
        at(k, sm.p, e, 4)
    };
    let voff_at = |k: &Kit<'ctx>, jj: IntValue<'ctx>| -> R<PointerValue<'ctx>> { at(k, sm.voff, k.add(k.mul(warp, i32c(TILE))?, jj)?, 8) };

    let v_row = |k: &Kit<'ctx>, jj: IntValue<'ctx>| -> R<Vec<FloatValue<'ctx>>> {
        let slot = voff_at(k, jj)?;
        let vo = k.math(|kb| Ok(kb.load(i64t.into(), slot, 8)?.into_int_value()))?;
        if per_lane {
            let idx = k.add(vo, k.mul(k.zext64(dim_of(k, 0)?)?, v_sd)?)?;
            if v_vec {
                k.load_vec(dt, v_ptr, idx, nd)
            } else {
                k.load_strided(dt, v_ptr, idx, v_sd, nd)
            }
        } else {
            (0..nd)
                .map(|i| {
                    let dcol = k.smin(dim_of(k, i)?, i32c(dv - 1))?;
                    Ok(k.load_vec(dt, v_ptr, k.add(vo, k.mul(k.zext64(dcol)?, v_sd)?)?, 1)?[0])
                })
                .collect()
        }
    };
    // V rows prefetched with K: as many keys as fit about 64 registers of V values (16-bit
    // values two to a register), fewer when the accumulators are many.
    let per_reg = if dt.size_bytes() == 2 { 2 } else { 1 };
    let mut prefetch = (64 * per_reg / nd).clamp(8, TILE) / 8 * 8;
    if rt * nd > 16 {
        prefetch = (prefetch / 2).max(8);
    }
    // The unified-max path's per-row state: each lane's running maximum of its raw scores
    // and sum of its p, and whether the worker has seen a score other than −inf.
    let um = match p.unified_max {
        Some(_) => Some(Unified {
            lmax: (0..rt).map(|_| kit.var_f(ninf)).collect::<R<_>>()?,
            lsum: (0..rt).map(|_| kit.var_f(zero)).collect::<R<_>>()?,
            seen: (0..rt).map(|_| kit.var_i(kit.bool_c(false))).collect::<R<_>>()?,
        }),
        None => None,
    };
    // The worker's tiles: with the online softmax (`unified` None), or with the unified
    // maximum φ (the fast path, whose per-row state is `um`).
    let tiles = |kit: &Kit<'ctx>, unified: Option<f32>| -> R<()> {
        kit.for_range(worker, ntiles, n_workers, |k, tile| {
            let j0 = k.mul(tile, i32c(TILE))?;
            let j = k.add(j0, lane)?;
            let in_seq = k.icmp(IntPredicate::SLT, j, kv_end)?;
            // Key j's page and offsets (V's through the warp's shared memory to every lane).
            let sv: Vec<PointerValue> = (0..rt).map(|_| k.var_f(zero)).collect::<R<_>>()?;
            let voff_slot = voff_at(k, lane)?;
            let kvar = k.math(|kb| kb.in_prologue(|kb| Ok(kb.b.build_alloca(i64t, "")?)))?;
            k.math(|kb| {
                kb.store(voff_slot, kb.i64c(0).into(), 8)?;
                kb.store(kvar, kb.i64c(0).into(), 8)
            })?;
            k.if_then(in_seq, |k| {
                let (ko, vo) = a.key(k, k.zext64(j)?)?;
                k.math(|kb| {
                    kb.store(voff_slot, vo.into(), 8)?;
                    kb.store(kvar, ko.into(), 8)
                })
            })?;
            k.warp_sync()?;
            // Every key's V slice of this lane, loaded now (a key past the sequence reads offset 0,
            // inside the buffer, and is never multiplied), so that its latency overlaps K's.
            let vrows: Vec<Vec<FloatValue>> = (0..prefetch).map(|jj| v_row(k, i32c(jj))).collect::<R<_>>()?;
            let ko = k.math(|kb| Ok(kb.load(i64t.into(), kvar, 8)?.into_int_value()))?;
            k.if_then(in_seq, |k| {
                // The whole K row first (independent loads in flight), then the dot products.
                let mut kv = Vec::with_capacity(d as usize);
                for c in 0..d / ck {
                    let idx = k.add(ko, k.mul(k.i64c(i64::from(c * ck)), k_sd)?)?;
                    kv.extend(if k_vec { k.load_vec(dt, k_ptr, idx, ck)? } else { k.load_strided(dt, k_ptr, idx, k_sd, ck)? });
                }
                for (r, sp) in sv.iter().enumerate() {
                    let mut sum = zero;
                    for c in 0..d / ck {
                        let qv = k.sh_load(DType::F32, at(k, sm.q, i32c(r as u32 * d + c * ck), 4)?, ck)?;
                        for (i, q) in qv.iter().enumerate() {
                            sum = k.fma(*q, kv[(c * ck) as usize + i], sum)?;
                        }
                    }
                    k.set(*sp, sum.into())?;
                }
                Ok(())
            })?;

            // Per row: the online softmax (the interpreter's 16-key rule, see the module docs), or
            // p = exp(s − φ) against the unified maximum with the same rule from a ballot.
            let lo_half = k.icmp(IntPredicate::ULT, lane, i32c(16))?;
            let mut bounds = Vec::with_capacity(rt as usize);
            for (r, info) in rows.iter().enumerate() {
                let visible = k.icmp(IntPredicate::SLT, j, info.limit)?;
                let sc = k.select_f(visible, k.fmul(k.get_f(sv[r])?, scale)?, ninf)?;
                let n_vis = |k: &Kit<'ctx>| k.smin(k.smax(k.sub(info.limit, j0)?, i32c(0))?, i32c(TILE));
                if let (Some(phi), Some(u)) = (unified, &um) {
                    k.set(u.lmax[r], k.max_nan(k.get_f(u.lmax[r])?, sc)?.into())?;
                    let pj = k.exp(k.fsub(sc, kit.f32c(f64::from(phi)))?)?;
                    k.set(u.lsum[r], k.fadd(k.get_f(u.lsum[r])?, pj)?.into())?;
                    k.sh_store(DType::F32, p_row(k, r as u32, lane)?, &[pj])?;
                    // Lanes whose score is not −inf (NaN counts, as it does for the running max).
                    let some = k.fcmp(FloatPredicate::UNE, sc, ninf)?;
                    let bal = k.math(|kb| kb.vote_ballot(some))?;
                    let first_some = k.icmp(IntPredicate::NE, k.and(bal, i32c(0xffff))?, i32c(0))?;
                    let seen_old = k.get_i(u.seen[r], kit.i1t)?;
                    let seen_new = k.select_int(seen_old, seen_old, k.icmp(IntPredicate::NE, bal, i32c(0))?)?;
                    k.set(u.seen[r], seen_new.into())?;
                    let lo = k.select_int(k.select_int(seen_old, seen_old, first_some)?, i32c(0), i32c(16))?;
                    let hi = k.select_int(seen_new, n_vis(k)?, i32c(0))?;
                    bounds.push((lo, hi));
                    continue;
                }
                let half = k.warp_reduce(sc, &[8, 4, 2, 1], |k, a, b| k.max_nan(a, b))?;
                let other = k.shfl_xor(half, 16)?;
                let tile_max = k.max_nan(half, other)?;
                let first_half = k.select_f(lo_half, half, other)?;
                let m_old = k.get_f(m[r])?;
                let m_new = k.max_nan(m_old, tile_max)?;
                let none_yet = k.fcmp(FloatPredicate::OEQ, m_new, ninf)?;
                let m_use = k.select_f(none_yet, zero, m_new)?;
                let alpha = k.exp(k.fsub(m_old, m_use)?)?;
                let pj = k.exp(k.fsub(sc, m_use)?)?;
                let psum = k.warp_reduce(pj, &[16, 8, 4, 2, 1], |k, a, b| k.fadd(a, b))?;
                k.set(l[r], k.fma(k.get_f(l[r])?, alpha, psum)?.into())?;
                for a in &acc[r] {
                    k.set(*a, k.fmul(k.get_f(*a)?, alpha)?.into())?;
                }
                k.set(m[r], m_new.into())?;
                k.sh_store(DType::F32, p_row(k, r as u32, lane)?, &[pj])?;
                let old_none = k.fcmp(FloatPredicate::OEQ, m_old, ninf)?;
                let first_none = k.fcmp(FloatPredicate::OEQ, first_half, ninf)?;
                let lo = k.select_int(k.and(old_none, first_none)?, i32c(16), i32c(0))?;
                let hi = k.select_int(none_yet, i32c(0), n_vis(k)?)?;
                bounds.push((lo, hi));
            }
            k.warp_sync()?;

            // acc += P·V over the keys some row multiplies; unguarded and 8 keys at a time when
            // every row takes the whole tile.
            let mut full = k.bool_c(true);
            let (mut jlo, mut jhi) = (i32c(TILE), i32c(0));
            for (lo, hi) in &bounds {
                full = k.and(full, k.and(k.icmp(IntPredicate::EQ, *lo, i32c(0))?, k.icmp(IntPredicate::EQ, *hi, i32c(TILE))?)?)?;
                jlo = k.smin(jlo, *lo)?;
                jhi = k.smax(jhi, *hi)?;
            }
            let accumulate = |k: &Kit<'ctx>, jj: IntValue<'ctx>, vs: &[FloatValue<'ctx>], guarded: bool| -> R<()> {
                for (r, (lo, hi)) in bounds.iter().enumerate() {
                    let pj = k.sh_load(DType::F32, p_row(k, r as u32, jj)?, 1)?[0];
                    let ok = if guarded { Some(k.and(k.icmp(IntPredicate::SGE, jj, *lo)?, k.icmp(IntPredicate::SLT, jj, *hi)?)?) } else { None };
                    for (a, v) in acc[r].iter().zip(vs) {
                        let old = k.get_f(*a)?;
                        let new = k.fma(pj, *v, old)?;
                        let new = match ok {
                            Some(ok) => k.select_f(ok, new, old)?,
                            None => new,
                        };
                        k.set(*a, new.into())?;
                    }
                }
                Ok(())
            };
            // The prefetched keys, then the rest eight V loads at a time.
            let pv = |k: &Kit<'ctx>, guarded: bool| -> R<()> {
                let step = |k: &Kit<'ctx>, jj: u32, v: &[FloatValue<'ctx>]| -> R<()> {
                    let jv = i32c(jj);
                    if guarded {
                        let used = k.and(k.icmp(IntPredicate::SGE, jv, jlo)?, k.icmp(IntPredicate::SLT, jv, jhi)?)?;
                        k.if_then(used, |k| accumulate(k, jv, v, true))
                    } else {
                        accumulate(k, jv, v, false)
                    }
                };
                for (jj, v) in vrows.iter().enumerate() {
                    step(k, jj as u32, v)?;
                }
                for j8 in (prefetch..TILE).step_by(8) {
                    let batch: Vec<Vec<FloatValue>> = (j8..j8 + 8).map(|jj| v_row(k, i32c(jj))).collect::<R<_>>()?;
                    for (u, v) in batch.iter().enumerate() {
                        step(k, j8 + u as u32, v)?;
                    }
                }
                Ok(())
            };
            k.if_else(full, |k| pv(k, false), |k| pv(k, true))?;
            k.warp_sync()
        })
    };
    match (p.unified_max, &um) {
        (Some(phi), Some(u)) => {
            tiles(kit, Some(phi))?;
            // The worker's largest score and its sum per row (one warp reduction each), and
            // whether some row's largest score lies outside [φ − UMAX_LO, φ + UMAX_HI]: then
            // the worker recomputes its tiles with the online softmax.
            let (top, bottom) = (kit.f32c(f64::from(phi) + UMAX_HI), kit.f32c(f64::from(phi) - UMAX_LO));
            let mut redo = kit.bool_c(false);
            for r in 0..rt as usize {
                let wmax = kit.warp_reduce(kit.get_f(u.lmax[r])?, &[16, 8, 4, 2, 1], |k, a, b| k.max_nan(a, b))?;
                let wsum = kit.warp_reduce(kit.get_f(u.lsum[r])?, &[16, 8, 4, 2, 1], |k, a, b| k.fadd(a, b))?;
                let over = kit.fcmp(FloatPredicate::OGT, wmax, top)?;
                let under = kit.and(kit.fcmp(FloatPredicate::OLT, wmax, bottom)?, kit.fcmp(FloatPredicate::ONE, wmax, ninf)?)?;
                redo = kit.select_int(redo, redo, kit.select_int(over, over, under)?)?;
                // A row without a score other than −inf is empty (m = −inf, l = 0), as the
                // online softmax leaves it; the others report m = φ.
                let empty = kit.fcmp(FloatPredicate::OEQ, wmax, ninf)?;
                kit.set(m[r], kit.select_f(empty, ninf, kit.f32c(f64::from(phi)))?.into())?;
                kit.set(l[r], wsum.into())?;
            }
            if probe() != Probe::NeverFallback {
                kit.if_then(redo, |k| {
                    for r in 0..rt as usize {
                        k.set(m[r], ninf.into())?;
                        k.set(l[r], zero.into())?;
                        for a in &acc[r] {
                            k.set(*a, zero.into())?;
                        }
                    }
                    tiles(k, None)?;
                    if probe() == Probe::PoisonFallback {
                        for lr in &l {
                            k.set(*lr, k.f32c(f64::NAN).into())?;
                        }
                    }
                    Ok(())
                })?;
            }
        }
        _ => tiles(kit, None)?,
    }

    // 3. The worker's partial result → shared memory.
    for r in 0..rt {
        let slot = kit.add(kit.mul(warp, i32c(rt))?, i32c(r))?;
        let ml = at(kit, sm.part, slot, 8)?;
        kit.sh_store(DType::F32, ml, &[kit.get_f(m[r as usize])?, kit.get_f(l[r as usize])?])?;
        for (i, a) in acc[r as usize].iter().enumerate() {
            let dcol = dim_of(kit, i as u32)?;
            let inside = kit.icmp(IntPredicate::SLT, dcol, i32c(dv))?;
            let val = kit.get_f(*a)?;
            kit.if_then(inside, |k| k.sh_store(DType::F32, at(k, sm.acc, k.add(k.mul(slot, i32c(dv))?, dcol)?, 4)?, &[val]))?;
        }
    }
    kit.barrier()?;
    let clustered = kit.and(kit.bool_c(nc > 1), kit.icmp(IntPredicate::EQ, solo, kit.bool_c(false))?)?;
    if nc > 1 {
        kit.if_then(clustered, cluster_barrier)?;
    }

    // 4. Merge by log-sum-exp. In cluster mode each CTA writes its share of the rt·dv outputs
    // from every CTA's partials; in solo mode (and without a cluster) the CTA writes them all
    // from its own.
    let outs = rt * dv;
    let o_sd = kit.dim(&p.out.st[3])?;
    let merge = |kit: &Kit<'ctx>, ctas: u32, o_lo: IntValue<'ctx>, o_hi: IntValue<'ctx>| -> R<()> {
        let peer = |k: &Kit<'ctx>, ptr: PointerValue<'ctx>, cta: u32| -> R<PointerValue<'ctx>> {
            if ctas == 1 {
                return Ok(ptr);
            }
            k.math(|kb| Ok(kb.intrinsic_value("llvm.nvvm.mapa.shared.cluster", &[], &[ptr.into(), kb.i32c(i64::from(cta)).into()])?.into_pointer_value()))
        };
        kit.for_range(kit.add(o_lo, tid)?, o_hi, i32c(s.threads()), |k, o| {
            let r = k.udiv(o, i32c(dv))?;
            let dcol = k.urem(o, i32c(dv))?;
            // Row r's facts (r is not a constant here: select among the CTA's rows).
            let mut valid = k.bool_c(false);
            let mut o_off = k.i64c(0);
            let mut lse_off = k.i64c(0);
            for (ri, info) in rows.iter().enumerate() {
                let is = k.icmp(IntPredicate::EQ, r, i32c(ri as u32))?;
                valid = k.select_int(is, info.valid, valid)?;
                o_off = k.select_int(is, info.o_off, o_off)?;
                if let Some(lo) = info.lse_off {
                    lse_off = k.select_int(is, lo, lse_off)?;
                }
            }
            k.if_then(valid, |k| {
                let mut parts = Vec::with_capacity((ctas * nw) as usize);
                let mut mx = ninf;
                let f32t = k.f32t;
                for cta in 0..ctas {
                    for w in 0..nw {
                        let slot = k.add(i32c(w * rt), r)?;
                        let mp = peer(k, at(k, sm.part, slot, 8)?, cta)?;
                        let ap = peer(k, at(k, sm.acc, k.add(k.mul(slot, i32c(dv))?, dcol)?, 4)?, cta)?;
                        let lp = k.gep(f32t.into(), mp, i32c(1))?;
                        let (mv, lv, av) = k.math(|kb| {
                            let ld = |p: PointerValue<'ctx>, a: u32| -> R<FloatValue<'ctx>> { Ok(kb.load(f32t.into(), p, a)?.into_float_value()) };
                            Ok((ld(mp, 8)?, ld(lp, 4)?, ld(ap, 4)?))
                        })?;
                        mx = k.max_nan(mx, mv)?;
                        parts.push((mv, lv, av));
                    }
                }
                let empty = k.fcmp(FloatPredicate::OEQ, mx, ninf)?;
                let m_use = k.select_f(empty, zero, mx)?;
                let (mut num, mut den) = (zero, zero);
                for (mv, lv, av) in parts {
                    let w = k.exp(k.fsub(mv, m_use)?)?;
                    num = k.fma(av, w, num)?;
                    den = k.fma(lv, w, den)?;
                }
                let out = k.select_f(empty, zero, k.fdiv(num, den)?)?;
                let idx = k.add(o_off, k.mul(k.zext64(dcol)?, o_sd)?)?;
                k.store_vec(dt, k.buf(p.out.buffer)?, idx, &[out])?;
                if let Some(lse) = &p.lse {
                    // The row's log-sum-exp M + ln Σ l_u·e^{m_u − M}, by its dim-0 thread.
                    let v = k.select_f(empty, ninf, k.fadd(m_use, k.log(den)?)?)?;
                    k.if_then(k.icmp(IntPredicate::EQ, dcol, i32c(0))?, |k| k.store_vec(DType::F32, k.buf(lse.buffer)?, lse_off, &[v]))?;
                }
                Ok(())
            })
        })
    };
    if nc == 1 {
        merge(kit, 1, i32c(0), i32c(outs))?;
    } else {
        let per = outs.div_ceil(nc);
        let o_lo = kit.mul(rank, i32c(per))?;
        let o_hi = kit.smin(kit.add(o_lo, i32c(per))?, i32c(outs))?;
        kit.if_else(clustered, |k| merge(k, nc, o_lo, o_hi), |k| merge(k, 1, k.i32c(0), k.i32c(outs as i32)))?;
        // Every CTA's shared memory stays until the others have read it.
        kit.if_then(clustered, cluster_barrier)?;
    }
    Ok(())
}

/// `barrier.cluster.arrive` (release) + `barrier.cluster.wait` (acquire), aligned: every
/// thread of every CTA of the cluster (PTX ISA §9.7.13.4).
fn cluster_barrier(kit: &Kit<'_>) -> R<()> {
    kit.math(|kb| {
        kb.intrinsic("llvm.nvvm.barrier.cluster.arrive.aligned", &[], &[])?;
        kb.intrinsic("llvm.nvvm.barrier.cluster.wait.aligned", &[], &[])?;
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::attention::tests::{bind, paged};
    use crate::kernels::matmul::tests::{assemble, d, plan_line, single_kernel, sym, ty};
    use sinter_ir::interp::Tensor;
    use sinter_ir::{Attr, Dim, FunctionBuilder, Graph, OpKind};

    /// Split-KV decode at sm_80 (no cluster) and sm_90a (clusters of 8): plans and ptxas
    /// resource lines (no spills, no stack).
    #[test]
    fn ptxas_reports() {
        let cases = vec![
            ("bf16 D64 GQA 9/3 T=1 page 16 (SmolLM2)", paged(DType::BF16, 9, 3, d(1), 64, 16)),
            ("bf16 D128 GQA 32/8 T=1 page 16", paged(DType::BF16, 32, 8, d(1), 128, 16)),
            ("bf16 D128 GQA 32/8 T=4 page 32", paged(DType::BF16, 32, 8, d(4), 128, 32)),
            ("bf16 D128 GQA 16/1 T=1 (two row tiles)", paged(DType::BF16, 16, 1, d(1), 128, 16)),
            ("f32 D128 GQA 8/2 T symbolic", paged(DType::F32, 8, 2, sym("T"), 128, 16)),
            ("bf16 D256 MHA 4/4 T=1", paged(DType::BF16, 4, 4, d(1), 256, 16)),
            ("bf16 D80 GQA 6/2 T=1", paged(DType::BF16, 6, 2, d(1), 80, 16)),
        ];
        let mut text = String::new();
        for t in [Target::SM_80, Target::SM_90A] {
            for (what, (g, k)) in &cases {
                let plan = generate(g, *k, &t).unwrap_or_else(|e| panic!("{what}: {e}"));
                if t == Target::SM_90A && plan.grid[0].numerator.as_const().is_some() {
                    assert!(plan.ptx.contains(".reqnctapercluster 8, 1, 1") && plan.ptx.contains("mapa.shared::cluster"), "{what}: no cluster");
                }
                let Some(report) = assemble(&plan) else { return };
                text.push_str(&format!("# {what}\n{}\n{report}", plan_line(&plan)));
            }
        }
        insta::assert_snapshot!("decode_ptxas", text);
    }

    #[test]
    fn schedules() {
        assert_eq!(choose_schedule(Some(4), &Target::SM_90A), DecodeSchedule { warps: 4, rows: 4, cluster: 8 });
        assert_eq!(choose_schedule(Some(16), &Target::SM_80), DecodeSchedule { warps: 4, rows: 8, cluster: 1 });
        assert_eq!(choose_schedule(None, &Target::SM_90A), DecodeSchedule { warps: 4, rows: 8, cluster: 1 });
        let (g, k) = paged(DType::BF16, 8, 2, d(1), 64, 16);
        let e = generate_with(&g, k, &Target::SM_80, &DecodeSchedule { warps: 4, rows: 4, cluster: 2 }).unwrap_err();
        assert!(e.to_string().contains("sm_90"), "{e}");
        let (g, k) = paged(DType::F32, 8, 2, sym("T"), 64, 16);
        let e = generate_with(&g, k, &Target::SM_90A, &DecodeSchedule { warps: 4, rows: 4, cluster: 2 }).unwrap_err();
        assert!(e.to_string().contains("constant number of query rows"), "{e}");
        let e = generate_with(&g, k, &Target::SM_90A, &DecodeSchedule { warps: 0, rows: 4, cluster: 1 }).unwrap_err();
        assert!(e.to_string().contains("invalid decode schedule"), "{e}");
    }

    /// Split-KV decode emulated against the interpreter (sm_80: the split across the CTA's
    /// warps, merged through shared memory): lengths 0, 1, a partly filled page, sequences
    /// long enough for several tiles per worker (so every worker holds a partial and some hold
    /// none), pages in scrambled order, T = 1 and T = 3 (causal within the step), GQA 4/2 and
    /// 3/1, D 64 and 80 (lane dims not a multiple of 32), f32 with a symbolic T, and NaN / ±inf
    /// in K and V; and sm_90a's clusters of 8 CTAs (lengths 0, 1111 and 333: the cluster merge
    /// through distributed shared memory).
    #[test]
    fn emulated_matches_interpreter() {
        use crate::kernels::matmul::emu::{check, random};
        let gen = |g: &KernelGraph, k: Kernel| generate(g, k, &Target::SM_80);
        let (b, pages, page, m) = (4usize, 40usize, 16usize, 10usize);
        let table: Vec<f64> = (0..b * m).map(|i| ((i * 7 + 3) % pages) as f64).collect();
        let table = Tensor::new(DType::I32, &[b, m], table).unwrap();
        let lens = Tensor::new(DType::I32, &[b], vec![0.0, 1.0, 37.0, 160.0]).unwrap();
        for (tq, h, hkv, hd) in [(1usize, 4i64, 2i64, 64usize), (3, 4, 2, 64), (1, 3, 1, 80)] {
            let (g, k) = paged(DType::BF16, h, hkv, d(tq as i64), hd as i64, page as i64);
            let ins = [
                random(DType::BF16, &[b, h as usize, tq, hd], 30),
                random(DType::BF16, &[pages, page, hkv as usize, hd], 31),
                random(DType::BF16, &[pages, page, hkv as usize, hd], 32),
                table.clone(),
                lens.clone(),
            ];
            check(&format!("bf16 split-KV T={tq} H={h}/{hkv} D={hd}"), &g, k, gen, &ins, &bind(&[("B", b as i64), ("P", pages as i64), ("M", m as i64)]));
        }
        // NaN in a V row of sequence 3 (every row sees it: all NaN), +inf in a K row of
        // sequence 2 (its rows: NaN), −inf in a K element of sequence 2's first key.
        let (g, k) = paged(DType::BF16, 4, 2, d(1), 64, page as i64);
        let kp = random(DType::BF16, &[pages, page, 2, 64], 33);
        let mut vp = random(DType::BF16, &[pages, page, 2, 64], 34).data().to_vec();
        let mut kd = kp.data().to_vec();
        let at = |p: usize, s: usize, h: usize, e: usize| ((p * page + s) * 2 + h) * 64 + e;
        let page_of = |bq: usize, j: usize| ((bq * m + j / page) * 7 + 3) % pages;
        vp[at(page_of(3, 100), 100 % page, 0, 5)] = f64::NAN;
        kd[at(page_of(2, 20), 20 % page, 1, 0)] = f64::INFINITY;
        let ins = [
            random(DType::BF16, &[b, 4, 1, 64], 35),
            Tensor::new(DType::BF16, &[pages, page, 2, 64], kd).unwrap(),
            Tensor::new(DType::BF16, &[pages, page, 2, 64], vp).unwrap(),
            table.clone(),
            lens.clone(),
        ];
        check("bf16 split-KV with NaN and inf", &g, k, gen, &ins, &bind(&[("B", b as i64), ("P", pages as i64), ("M", m as i64)]));
        // f32, D = 32, T symbolic.
        let (g, k) = paged(DType::F32, 2, 1, sym("T"), 32, 16);
        let table = Tensor::new(DType::I32, &[2, 3], vec![2.0, 0.0, 1.0, 5.0, 4.0, 3.0]).unwrap();
        let lens = Tensor::new(DType::I32, &[2], vec![40.0, 17.0]).unwrap();
        let ins = [random(DType::F32, &[2, 2, 2, 32], 23), random(DType::F32, &[6, 16, 1, 32], 24), random(DType::F32, &[6, 16, 1, 32], 25), table, lens];
        check("f32 split-KV T=2", &g, k, gen, &ins, &bind(&[("B", 2), ("T", 2), ("P", 6), ("M", 3)]));
        // sm_90a: clusters of 8 CTAs, 32 workers.
        let (b, pages, m) = (3usize, 211usize, 70usize);
        let table = Tensor::new(DType::I32, &[b, m], (0..b * m).map(|i| ((i * 7 + 3) % pages) as f64).collect()).unwrap();
        let lens = Tensor::new(DType::I32, &[b], vec![0.0, 1111.0, 333.0]).unwrap();
        let (g, k) = paged(DType::BF16, 4, 2, d(1), 64, page as i64);
        let ins = [random(DType::BF16, &[b, 4, 1, 64], 36), random(DType::BF16, &[pages, page, 2, 64], 37), random(DType::BF16, &[pages, page, 2, 64], 38), table, lens];
        let plan = generate(&g, k, &Target::SM_90A).unwrap();
        assert!(plan.ptx.contains(".reqnctapercluster 8, 1, 1"), "no cluster");
        check("bf16 split-KV sm_90a clusters of 8", &g, k, |g, k| generate(g, k, &Target::SM_90A), &ins, &bind(&[("B", b as i64), ("P", pages as i64), ("M", m as i64)]));
    }

    /// `paged_attention` as [`paged`] builds it, with `unified_max` and `lse` as given.
    #[allow(clippy::too_many_arguments)]
    fn paged_with(dt: DType, h: i64, hkv: i64, t: Dim, hd: i64, page: i64, unified_max: Option<f64>, lse: bool) -> (KernelGraph, Kernel) {
        let b = sym("B");
        let mut fb = FunctionBuilder::new(&Graph::new(), "decode");
        let q = fb.param("q", ty(dt, &[b.clone(), d(h), t, d(hd)]));
        let kp = fb.param("k_pages", ty(dt, &[sym("P"), d(page), d(hkv), d(hd)]));
        let vp = fb.param("v_pages", ty(dt, &[sym("P"), d(page), d(hkv), d(hd)]));
        let bt = fb.param("block_table", ty(DType::I32, &[b.clone(), sym("M")]));
        let lens = fb.param("seq_lens", ty(DType::I32, &[b]));
        let mut attrs = vec![("scale", Attr::Float(1.0 / (hd as f64).sqrt())), ("causal", Attr::Bool(true)), ("heads", Attr::Int(h)), ("kv_heads", Attr::Int(hkv))];
        if let Some(phi) = unified_max {
            attrs.push(("unified_max", Attr::Float(phi)));
        }
        if lse {
            attrs.push(("lse", Attr::Bool(true)));
        }
        let r = fb.op(OpKind::PagedAttention, &[q, kp, vp, bt, lens], attrs).unwrap();
        single_kernel(Family::PagedAttention, fb.finish(&r).unwrap())
    }

    /// [`generate`] for `target` under the unified-max test hook `probe`.
    fn gen_at(target: Target, probe: Probe) -> impl Fn(&KernelGraph, Kernel) -> Result<LaunchPlan, CodegenError> {
        move |g, k| {
            PROBE.with(|p| p.set(probe));
            let r = generate(g, k, &target);
            PROBE.with(|p| p.set(Probe::Off));
            r
        }
    }

    /// Runs kernel `k` in the emulator (generated by `gen`) and returns the interpreter's
    /// outputs and the kernel's.
    fn emulate(g: &KernelGraph, k: Kernel, gen: impl Fn(&KernelGraph, Kernel) -> Result<LaunchPlan, CodegenError>, inputs: &[Tensor], bindings: &sinter_ir::Bindings) -> (Vec<Tensor>, Vec<Vec<f64>>) {
        use crate::kernels::matmul::emu::{from_bytes, run, to_bytes};
        use crate::kernels::matmul::kit::EMIT_IR;
        let body = &g.kernels[k].body;
        let mut graph = Graph::new();
        graph.add_func(body.clone());
        let refs: Vec<&Tensor> = inputs.iter().collect();
        let want = sinter_ir::interp::run(&graph, &body.name, &refs, bindings).unwrap();
        EMIT_IR.with(|f| f.set(true));
        let plan = gen(g, k);
        EMIT_IR.with(|f| f.set(false));
        let plan = plan.unwrap();
        let mut bufs: Vec<Vec<u8>> = inputs.iter().map(to_bytes).collect();
        for w in &want {
            bufs.push(vec![0xFF; w.data().len() * w.dtype().size_bytes() + 256]);
        }
        run(&plan, bindings, &mut bufs);
        let got = want.iter().enumerate().map(|(j, w)| from_bytes(w.dtype(), &bufs[inputs.len() + j], w.data().len())).collect();
        (want, got)
    }

    /// Per sequence of an output `[B, H, T, D]`: how many of its `H·T` rows hold a NaN.
    fn nan_rows(out: &[f64], b: usize, hd: usize) -> Vec<usize> {
        let per = out.len() / b;
        (0..b).map(|s| out[s * per..(s + 1) * per].chunks(hd).filter(|row| row.iter().any(|x| x.is_nan())).count()).collect()
    }

    /// The unified-max tests' batch on a target: 4 sequences, pages of 16 in scrambled order
    /// (`page_of`, a bijection: `pages` prime).
    /// - sm_80 (4 workers a sequence): 0, 1, 37 (a partly filled page) and 160 keys (five
    ///   tiles: worker 0 takes tiles 0 and 4, workers 1–3 one each);
    /// - sm_90a (clusters of 8 CTAs, 32 workers): 0, 1, 160 (solo mode: the first CTA's 4
    ///   workers) and 1111 keys (35 tiles, the cluster split: workers 0–2 take two, 3–31 one,
    ///   merged through distributed shared memory).
    struct Batch {
        lens: [usize; 4],
        maxp: usize,
        pages: usize,
        /// Workers splitting the last sequence's tiles (worker `u` takes tiles `u`, `u + U`, …).
        workers: usize,
    }

    const B: usize = 4;
    const PAGE: usize = 16;

    impl Batch {
        fn on(t: Target) -> Batch {
            if t == Target::SM_80 {
                Batch { lens: [0, 1, 37, 160], maxp: 10, pages: 41, workers: 4 }
            } else {
                Batch { lens: [0, 1, 160, 1111], maxp: 70, pages: 281, workers: 32 }
            }
        }

        fn page_of(&self, bq: usize, j: usize) -> usize {
            ((bq * self.maxp + j / PAGE) * 7 + 3) % self.pages
        }

        /// q (`abs`: all positive, when asked), K and V random in [−1, 1), the table, the lengths.
        fn inputs(&self, h: usize, hkv: usize, tq: usize, hd: usize, positive_q: bool, seed: u64) -> Vec<Tensor> {
            use crate::kernels::matmul::emu::random;
            let table = Tensor::new(DType::I32, &[B, self.maxp], (0..B * self.maxp).map(|i| self.page_of(i / self.maxp, (i % self.maxp) * PAGE) as f64).collect()).unwrap();
            let lens = Tensor::new(DType::I32, &[B], self.lens.iter().map(|&l| l as f64).collect()).unwrap();
            let mut q = random(DType::BF16, &[B, h, tq, hd], seed);
            if positive_q {
                q = Tensor::new(DType::BF16, &[B, h, tq, hd], q.data().iter().map(|x| x.abs()).collect()).unwrap();
            }
            vec![q, random(DType::BF16, &[self.pages, PAGE, hkv, hd], seed + 1), random(DType::BF16, &[self.pages, PAGE, hkv, hd], seed + 2), table, lens]
        }

        fn sizes(&self) -> sinter_ir::Bindings {
            bind(&[("B", B as i64), ("P", self.pages as i64), ("M", self.maxp as i64)])
        }

        /// Sets key `j` of sequence `bq` to `value` in every dim of every KV head of `pages`.
        fn set_key(&self, pages: &Tensor, bq: usize, j: usize, value: f64) -> Tensor {
            let (hkv, hd) = (pages.shape()[2], pages.shape()[3]);
            let mut data = pages.data().to_vec();
            let base = (self.page_of(bq, j) * PAGE + j % PAGE) * hkv * hd;
            data[base..base + hkv * hd].iter_mut().for_each(|x| *x = value);
            Tensor::new(pages.dtype(), pages.shape(), data).unwrap()
        }

        /// Per sequence: the rows of `h` heads and `tq` queries that see a key (causal,
        /// bottom-right: query t of T sees keys j ≤ t + L − T).
        fn seeing_rows(&self, h: usize, tq: usize) -> Vec<usize> {
            self.lens.iter().map(|&l| h * (0..tq).filter(|&i| i + l >= tq).count()).collect()
        }

        /// The largest score (f64, over the bf16 inputs) that worker `u` sees among the rows of
        /// KV head `g` of the last sequence.
        fn worker_max(&self, ins: &[Tensor], g: usize, u: usize) -> f64 {
            let (h, tq, hd) = (ins[0].shape()[1], ins[0].shape()[2], ins[0].shape()[3]);
            let hkv = ins[1].shape()[2];
            let (bq, len) = (B - 1, self.lens[B - 1]);
            let mut top = f64::NEG_INFINITY;
            for hh in (0..h).filter(|hh| hh / (h / hkv) == g) {
                for t in 0..tq {
                    for j in (0..len).filter(|j| (j / TILE as usize) % self.workers == u && j + tq <= t + len) {
                        let dot: f64 = (0..hd).map(|e| ins[0].get(&[bq, hh, t, e]).unwrap() * ins[1].get(&[self.page_of(bq, j), j % PAGE, g, e]).unwrap()).sum();
                        top = top.max(dot / (hd as f64).sqrt());
                    }
                }
            }
            top
        }
    }

    /// The unified-max fast path with φ = 1 near the scores' maximum (random q and K in
    /// [−1, 1), D 64–80: |s| ≤ √D, typically below 1.5), emulated against the interpreter at
    /// sm_80 (split across the CTA's warps) and sm_90a (clusters of 8: solo mode and the
    /// cluster merge) with the fallback poisoned (a worker that recomputed would report l =
    /// NaN), so the match shows that every worker took the fast path and that it is right.
    /// T = 1 and 3 (causal within the step), GQA 4/2, 3/1 and 8/1, D 64 and 80, a partly
    /// filled page, an empty sequence (its rows exactly 0), and f32 with a symbolic T.
    #[test]
    fn emulated_unified_max_fast_path() {
        use crate::kernels::matmul::emu::{check, random};
        for t in [Target::SM_80, Target::SM_90A] {
            let bt = Batch::on(t);
            for (tq, h, hkv, hd) in [(1usize, 4usize, 2usize, 64usize), (3, 4, 2, 64), (1, 3, 1, 80), (1, 8, 1, 64)] {
                let (g, k) = paged_with(DType::BF16, h as i64, hkv as i64, d(tq as i64), hd as i64, PAGE as i64, Some(1.0), false);
                let ins = bt.inputs(h, hkv, tq, hd, false, 40);
                let what = format!("{t} unified max 1.0 T={tq} H={h}/{hkv} D={hd}");
                check(&format!("{what} (fallback poisoned)"), &g, k, gen_at(t, Probe::PoisonFallback), &ins, &bt.sizes());
                let (_, got) = emulate(&g, k, gen_at(t, Probe::Off), &ins, &bt.sizes());
                let per = got[0].len() / B;
                assert!(got[0][..per].iter().all(|&x| x == 0.0), "{what}: the empty sequence's rows are not exactly 0");
            }
        }
        let (g, k) = paged_with(DType::F32, 2, 1, sym("T"), 32, 16, Some(0.5), false);
        let table = Tensor::new(DType::I32, &[2, 3], vec![2.0, 0.0, 1.0, 5.0, 4.0, 3.0]).unwrap();
        let lens = Tensor::new(DType::I32, &[2], vec![40.0, 17.0]).unwrap();
        let ins = [random(DType::F32, &[2, 2, 2, 32], 23), random(DType::F32, &[6, 16, 1, 32], 24), random(DType::F32, &[6, 16, 1, 32], 25), table, lens];
        for t in [Target::SM_80, Target::SM_90A] {
            check(&format!("{t} f32 unified max 0.5 T=2 (fallback poisoned)"), &g, k, gen_at(t, Probe::PoisonFallback), &ins, &bind(&[("B", 2), ("T", 2), ("P", 6), ("M", 3)]));
        }
    }

    /// φ far below the scores (−100: exp(s − φ) overflows) and far above them (100: every p
    /// subnormal; 200: every p underflows to 0): every worker with a key recomputes its tiles
    /// with the online softmax, and the result matches the interpreter, at sm_80 and sm_90a
    /// (clusters). The hooks show the path: with the fallback poisoned every row that sees a
    /// key is NaN (the others exactly 0), and without the fallback the fast path alone gives
    /// NaN there (φ = −100: inf/inf; φ = 200: 0/0).
    #[test]
    fn emulated_unified_max_fallback() {
        use crate::kernels::matmul::emu::check;
        for t in [Target::SM_80, Target::SM_90A] {
            let bt = Batch::on(t);
            let shapes: &[(usize, usize, usize, usize)] = if t == Target::SM_80 { &[(1, 4, 2, 64), (3, 3, 1, 80)] } else { &[(3, 3, 1, 80)] };
            for &(tq, h, hkv, hd) in shapes {
                let ins = bt.inputs(h, hkv, tq, hd, false, 50);
                for phi in [-100.0, 100.0, 200.0] {
                    let (g, k) = paged_with(DType::BF16, h as i64, hkv as i64, d(tq as i64), hd as i64, PAGE as i64, Some(phi), false);
                    let what = format!("{t} unified max {phi} T={tq} H={h}/{hkv} D={hd}");
                    check(&what, &g, k, gen_at(t, Probe::Off), &ins, &bt.sizes());
                    let probes: &[Probe] = if phi == 100.0 { &[Probe::PoisonFallback] } else { &[Probe::PoisonFallback, Probe::NeverFallback] };
                    for &probe in probes {
                        let (_, got) = emulate(&g, k, gen_at(t, probe), &ins, &bt.sizes());
                        assert_eq!(nan_rows(&got[0], B, hd), bt.seeing_rows(h, tq), "{what} {probe:?}: rows with NaN per sequence");
                    }
                }
            }
        }
    }

    /// A mix across workers whose partials all weigh in the result: q positive, K random and,
    /// in the last sequence, key 100 (tile 3, worker 3's) set to 0.75 in every dim, so its
    /// score ≈ 0.75·Σq/8 ≈ 3 while the other keys' stay near 1 (checked on the inputs: worker
    /// 3's largest above 2.2, every other worker's below 1.8); with φ = −18 worker 3 sees a
    /// score above φ + 20 = 2 and recomputes, the others stay on the fast path, and the merge
    /// (across warps on sm_80, across the cluster on sm_90a) combines partials at m = φ with
    /// one at its own m, both weighing in the result (key 100 outweighs each other key by a
    /// few e only). With the fallback poisoned only the last sequence's rows are NaN.
    #[test]
    fn emulated_unified_max_mixed_partials() {
        use crate::kernels::matmul::emu::check;
        let phi = -18.0;
        for t in [Target::SM_80, Target::SM_90A] {
            let bt = Batch::on(t);
            let shapes: &[(usize, usize, usize, usize, bool)] = if t == Target::SM_80 { &[(1, 4, 2, 64, false), (3, 4, 2, 64, true), (1, 8, 1, 64, true)] } else { &[(3, 4, 2, 64, true), (1, 8, 1, 64, false)] };
            for &(tq, h, hkv, hd, lse) in shapes {
                let mut ins = bt.inputs(h, hkv, tq, hd, true, 80);
                ins[1] = bt.set_key(&ins[1], B - 1, 100, 0.75);
                for g in 0..hkv {
                    for u in 0..bt.workers {
                        let top = bt.worker_max(&ins, g, u);
                        assert!(if u == 3 { top > phi + UMAX_HI + 0.2 } else { top < phi + UMAX_HI - 0.2 }, "{t}: worker {u} of head {g}: largest score {top}");
                    }
                }
                let (g, k) = paged_with(DType::BF16, h as i64, hkv as i64, d(tq as i64), hd as i64, PAGE as i64, Some(phi), lse);
                let what = format!("{t} unified max {phi}, worker 3 above the window, T={tq} H={h}/{hkv} D={hd} lse={lse}");
                check(&what, &g, k, gen_at(t, Probe::Off), &ins, &bt.sizes());
                let (_, got) = emulate(&g, k, gen_at(t, Probe::PoisonFallback), &ins, &bt.sizes());
                assert_eq!(nan_rows(&got[0], B, hd), vec![0, 0, 0, h * tq], "{what}: rows with NaN per sequence, fallback poisoned");
            }
        }
    }

    /// A score far above φ in one worker: φ = 1 and q positive, and in the last sequence key
    /// 100 (tile 3, worker 3's) set to 32 in every dim, so its score ≈ 4·Σq ≈ 128 > φ + 20
    /// (and e^(s − φ) overflows f32): that worker recomputes its tile and reports its own
    /// maximum, the others report φ, and the merge combines them. The hooks: with the fallback
    /// poisoned only the last sequence's rows are NaN, and without the fallback too (inf/inf).
    /// Also with `lse=true` (both outputs compared), GQA 4/2 and 8/1, T = 1 and 3, at sm_80 and
    /// sm_90a (clusters; 32 workers, so the other 31 report φ).
    #[test]
    fn emulated_unified_max_mixed_workers() {
        use crate::kernels::matmul::emu::check;
        for t in [Target::SM_80, Target::SM_90A] {
            let bt = Batch::on(t);
            let shapes: &[(usize, usize, usize, usize, bool)] = if t == Target::SM_80 { &[(1, 4, 2, 64, false), (3, 4, 2, 64, true)] } else { &[(1, 8, 1, 64, true)] };
            for &(tq, h, hkv, hd, lse) in shapes {
                let mut ins = bt.inputs(h, hkv, tq, hd, true, 60);
                ins[1] = bt.set_key(&ins[1], B - 1, 100, 32.0);
                let (g, k) = paged_with(DType::BF16, h as i64, hkv as i64, d(tq as i64), hd as i64, PAGE as i64, Some(1.0), lse);
                let what = format!("{t} unified max 1.0, one large score, T={tq} H={h}/{hkv} D={hd} lse={lse}");
                check(&what, &g, k, gen_at(t, Probe::Off), &ins, &bt.sizes());
                for probe in [Probe::PoisonFallback, Probe::NeverFallback] {
                    let (want, got) = emulate(&g, k, gen_at(t, probe), &ins, &bt.sizes());
                    assert_eq!(nan_rows(&got[0], B, hd), vec![0, 0, 0, h * tq], "{what} {probe:?}: rows with NaN per sequence");
                    assert_eq!(nan_rows(want[0].data(), B, hd), vec![0; B], "{what}: the reference");
                }
            }
        }
    }

    /// NaN and ±inf with the unified maximum (φ = 1), at sm_80 and sm_90a (clusters): NaN in a
    /// V row of the last sequence (its rows NaN), +inf in a K element of sequence 2 (rows whose
    /// q·k is +inf: above the window, recomputed, NaN as the reference; −inf ones contribute
    /// 0), −inf in a K element of sequence 2's first key and of sequence 1's only key (rows
    /// whose one score is −inf give 0, those where it is +inf NaN), a NaN in q (its row NaN);
    /// `lse=false` and `true`.
    #[test]
    fn emulated_unified_max_nan_inf() {
        use crate::kernels::matmul::emu::check;
        for t in [Target::SM_80, Target::SM_90A] {
            let bt = Batch::on(t);
            let ins = bt.inputs(4, 2, 1, 64, false, 70);
            let mut vp = ins[2].data().to_vec();
            let mut kd = ins[1].data().to_vec();
            let mut qd = ins[0].data().to_vec();
            let at = |p: usize, s: usize, h: usize, e: usize| ((p * PAGE + s) * 2 + h) * 64 + e;
            vp[at(bt.page_of(3, 100), 100 % PAGE, 0, 5)] = f64::NAN;
            kd[at(bt.page_of(2, 20), 20 % PAGE, 1, 0)] = f64::INFINITY;
            kd[at(bt.page_of(2, 0), 0, 0, 3)] = f64::NEG_INFINITY;
            kd[at(bt.page_of(1, 0), 0, 1, 7)] = f64::NEG_INFINITY;
            qd[(2 * 4 + 1) * 64 + 9] = f64::NAN;
            let ins = [
                Tensor::new(DType::BF16, ins[0].shape(), qd).unwrap(),
                Tensor::new(DType::BF16, ins[1].shape(), kd).unwrap(),
                Tensor::new(DType::BF16, ins[2].shape(), vp).unwrap(),
                ins[3].clone(),
                ins[4].clone(),
            ];
            for lse in [false, true] {
                let (g, k) = paged_with(DType::BF16, 4, 2, d(1), 64, PAGE as i64, Some(1.0), lse);
                check(&format!("{t} unified max with NaN and inf, lse={lse}"), &g, k, gen_at(t, Probe::Off), &ins, &bt.sizes());
            }
        }
    }

    /// The fast path's structure: with the fallback dropped (the hook) the kernel has no
    /// shuffle in its tile loop — only the two butterflies per row after it (5 shuffles each)
    /// — and one ballot per row; the plain kernel shuffles in its loop (10 per row and tile)
    /// and has no ballot; a unified-max kernel holds both loops. A φ that is not a finite f32
    /// is refused.
    #[test]
    fn unified_max_kernel_structure() {
        let count = |ptx: &str, what: &str| ptx.matches(what).count();
        for t in [Target::SM_80, Target::SM_90A] {
            let (g, k) = paged_with(DType::BF16, 4, 2, d(1), 64, 16, Some(1.0), false);
            let rows = 2;
            let fast = gen_at(t, Probe::NeverFallback)(&g, k).unwrap().ptx;
            assert_eq!(count(&fast, "shfl.sync.bfly"), 10 * rows, "{t}: shuffles of the fast path");
            assert_eq!(count(&fast, "vote.sync.ballot"), rows, "{t}: ballots of the fast path");
            let both = gen_at(t, Probe::Off)(&g, k).unwrap().ptx;
            assert_eq!(count(&both, "shfl.sync.bfly"), 20 * rows, "{t}: shuffles of the fast path and the fallback");
            let (g, k) = paged_with(DType::BF16, 4, 2, d(1), 64, 16, None, false);
            let plain = gen_at(t, Probe::Off)(&g, k).unwrap().ptx;
            assert_eq!(count(&plain, "shfl.sync.bfly"), 10 * rows, "{t}: shuffles of the online softmax");
            assert_eq!(count(&plain, "vote.sync.ballot"), 0);
        }
        let (mut g, k) = paged_with(DType::BF16, 4, 2, d(1), 64, 16, Some(1.0), false);
        let body = &mut g.kernels[k].body;
        let nd = body.nodes.values_mut().next().unwrap();
        let i = OpKind::PagedAttention.attr_index("unified_max").unwrap();
        nd.op.attrs[i] = Attr::Float(1e39);
        let e = generate(&g, k, &Target::SM_80).unwrap_err();
        assert!(e.to_string().contains("`unified_max` must be a finite f32 number, got 1e39"), "{e}");
    }

    /// The unified-max kernel at sm_80 and sm_90a (clusters of 8), at the benchmark's shape
    /// (bf16 D128 GQA 32/8 T=1) and SmolLM2's (D64 GQA 9/3), with `lse=true`, and f32 with a
    /// symbolic T: plans and ptxas resource lines (no spills, no stack); and the PTX of a small
    /// one (MHA 8/8 D64, one row a CTA) for sm_90a: the fast loop (a ballot, no shuffle),
    /// the fallback loop, the cluster merge.
    #[test]
    fn unified_max_ptxas_reports() {
        let cases = vec![
            ("bf16 D128 GQA 32/8 T=1 page 16 unified_max", paged_with(DType::BF16, 32, 8, d(1), 128, 16, Some(11.3), false)),
            ("bf16 D64 GQA 9/3 T=1 page 16 unified_max (SmolLM2)", paged_with(DType::BF16, 9, 3, d(1), 64, 16, Some(8.0), false)),
            ("bf16 D128 GQA 32/8 T=1 page 16 unified_max lse", paged_with(DType::BF16, 32, 8, d(1), 128, 16, Some(11.3), true)),
            ("f32 D128 GQA 8/2 T symbolic unified_max", paged_with(DType::F32, 8, 2, sym("T"), 128, 16, Some(4.0), false)),
        ];
        let mut text = String::new();
        for t in [Target::SM_80, Target::SM_90A] {
            for (what, (g, k)) in &cases {
                let plan = generate(g, *k, &t).unwrap_or_else(|e| panic!("{what}: {e}"));
                assert!(plan.ptx.contains("vote.sync.ballot"), "{what}: no ballot");
                if t == Target::SM_90A && plan.grid[0].numerator.as_const().is_some() {
                    assert!(plan.ptx.contains(".reqnctapercluster 8, 1, 1") && plan.ptx.contains("mapa.shared::cluster"), "{what}: no cluster");
                }
                let Some(report) = assemble(&plan) else { return };
                text.push_str(&format!("# {what}\n{}\n{report}", plan_line(&plan)));
            }
        }
        insta::assert_snapshot!("decode_unified_max_ptxas", text);
        let (g, k) = paged_with(DType::BF16, 8, 8, d(1), 64, 16, Some(6.0), false);
        let plan = generate(&g, k, &Target::SM_90A).unwrap();
        assert!(!plan.ptx.contains(".local"), "local memory in the unified-max decode kernel");
        insta::assert_snapshot!("decode_unified_max_sm_90a_ptx", plan.ptx);
    }
}
