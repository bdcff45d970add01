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
        target: target.name().to_owned(),
        grid: [gx, GridDim::fixed(p.kv_heads as u32), GridDim { numerator: p.batch.clone(), denominator: 1 }],
        block: [s.threads(), 1, 1],
        shared_bytes: dynamic_bytes(shared),
        params,
    })
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

        // Online softmax per row (the interpreter's 16-key rule, see the module docs).
        let lo_half = k.icmp(IntPredicate::ULT, lane, i32c(16))?;
        let mut bounds = Vec::with_capacity(rt as usize);
        for (r, info) in rows.iter().enumerate() {
            let visible = k.icmp(IntPredicate::SLT, j, info.limit)?;
            let sc = k.select_f(visible, k.fmul(k.get_f(sv[r])?, scale)?, ninf)?;
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
            let n_vis = k.smin(k.smax(k.sub(info.limit, j0)?, i32c(0))?, i32c(TILE))?;
            let hi = k.select_int(none_yet, i32c(0), n_vis)?;
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
    })?;

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
    use crate::kernels::matmul::tests::{assemble, d, plan_line, sym};
    use sinter_ir::interp::Tensor;

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
    /// warps, merged through shared memory; the cluster merge runs on the GPU tests): lengths
    /// 0, 1, a partly filled page, sequences long enough for several tiles per worker (so
    /// every worker holds a partial and some hold none), pages in scrambled order, T = 1 and
    /// T = 3 (causal within the step), GQA 4/2 and 3/1, D 64 and 80 (lane dims not
    /// a multiple of 32), f32 with a symbolic T, and NaN / ±inf in K and V.
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
    }
}
