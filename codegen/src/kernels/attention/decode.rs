//! Split-KV paged decode attention ([`Family::PagedAttention`]): FlashDecoding over a paged
//! KV cache — the keys of a sequence split across the warps of a CTA and, on sm_90, across the
//! CTAs of a thread-block cluster, the partial results merged by their log-sum-exp.
//!
//! # Algorithm
//! A CTA serves `rows` query rows that share one KV head (the `H/Hkv · T` rows of a GQA group,
//! so each K/V byte is read once per CTA) of one sequence; a cluster of `cluster` CTAs serves
//! the same rows. The keys are cut into tiles of 32; the `U = cluster · warps` warps of the
//! cluster are *workers* (warp `w` of CTA rank `c` is worker `w·cluster + c`) and worker `u`
//! takes tiles `u, u + U, …` (FlashDecoding: split the keys, not only the queries). Per tile,
//! with no CTA barrier, lane `j` looks key `j`'s page up and computes the scores of the CTA's
//! rows against its K row; per row the warp runs the online softmax and accumulates `P·V` over
//! every visible key (a −inf score's with p = 0, as the interpreter does), lane `l` owning
//! output dims `l·dv/32 …`.
//!
//! Each worker leaves `(m, l, acc)` per row in shared memory; the CTA (with a cluster, every
//! CTA of it, reading the others' partials through distributed shared memory) merges them by
//! log-sum-exp, each CTA of a cluster writing `1/cluster` of the outputs. A cluster whose
//! sequence has at most `SOLO_TILES` tiles runs in *solo mode*: its first CTA does all the
//! work and no cluster barrier is crossed. With `lse=true` the thread that writes a row's
//! output dim 0 also writes its log-sum-exp.
//!
//! # Unified maximum (FlashDecoding++, arXiv 2311.01282 §3)
//! With the node's `unified_max = φ` the workers take `p = exp(s − φ)` against φ instead of
//! the running maximum: no tile-maximum butterfly, no rescaling, each lane summing its own p.
//! After its last tile a worker checks each row's largest score against `[φ − UMAX_LO,
//! φ + UMAX_HI]`; inside it reports `(φ, Σp, Σp·v)`, outside it recomputes its own tiles with
//! the online softmax. φ cancels in the merge: the same softmax, rounded slightly differently.
//!
//! # Launch
//! Grid `(⌈rows_total / rows⌉ · cluster, Hkv, B)`, block `32 · warps`, cluster dims declared in
//! the PTX (`.reqnctapercluster`), so a plain `cuLaunchKernel` launches it. sm_80 has no
//! clusters; a symbolic row count also uses `cluster = 1`.
//!
//! # Sliding window and softcap
//! With the node's `window = W` a row sees keys `[max(limit − W, 0), limit)`: the workers start
//! at the tile holding the CTA's smallest first visible key (the tiles below it are never
//! loaded), keys below a row's window score −inf and are not multiplied. With `softcap = c`
//! each score is `c·tanh(s/c)` (f32) before the softmax.
//!
//! Design notes: book/src/design/attention.md

use inkwell::attributes::AttributeLoc;
use inkwell::context::Context;
use inkwell::values::{FloatValue, IntValue, PointerValue};
use inkwell::{FloatPredicate, IntPredicate};
use sinter_ir::{DType, Family, GridDim, Kernel, KernelGraph, LaunchPlan};

use super::analysis::{cap_score, dynamic_bytes, exp0, shared_kind, unsupported, Paged, PagedAddr};
use crate::isa::kit::{Kit, SharedKind, R};
use super::AttentionSchedule;
use crate::kernels::family::{Generator, Schedule};
use crate::target::Target;
use crate::error::CodegenError;

/// Keys per tile (one per lane).
pub(super) const TILE: u32 = 32;

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

/// [`choose_schedule`] for head dim `dv`: a lane's accumulators (`rows·nd`, nd = ⌈dv/32⌉) at
/// most 64 up to D 256 (8 rows), at most 32 above (3 rows at D 320, 2 at D 512: 4 rows at
/// D 512 take 253 to 255 registers, too close to spilling).
pub fn choose_schedule_for(rows: Option<i64>, dv: u32, target: &Target) -> DecodeSchedule {
    let s = choose_schedule(rows, target);
    let nd = dv.div_ceil(32);
    let most = (if nd > 8 { 32 } else { 64 } / nd).max(1);
    DecodeSchedule { rows: s.rows.min(most), ..s }
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
/// [`choose_schedule_for`]'s schedule. See the module docs.
///
/// # Errors
/// [`CodegenError::Unsupported`] for a body [`super::generate_paged`] refuses, or
/// a head dim whose per-CTA shared memory exceeds the target's limit; LLVM errors otherwise.
pub fn generate(graph: &KernelGraph, kernel: Kernel, target: &Target) -> Result<LaunchPlan, CodegenError> {
    crate::kernels::family::compile::<PagedAttention>(graph, kernel, target)
}

/// [`generate`]'s schedule without a thread-block cluster (each CTA reads all of its rows'
/// keys): the form a kernel that shares its CTA with others can take
/// ([`crate::persistent`]).
///
/// # Errors
/// As [`generate`].
pub fn generate_without_cluster(graph: &KernelGraph, kernel: Kernel, target: &Target) -> Result<LaunchPlan, CodegenError> {
    let p = Paged::analyse(graph, kernel)?;
    let s = choose_schedule_for(p.rows().as_const(), p.d, target);
    PagedAttention::build(&p, &PagedSchedule::SplitKv(DecodeSchedule { cluster: 1, ..s }), target)
}

/// One schedule of paged attention: the split-KV kernel (this file's) or the single-CTA one
/// ([`super::generate_paged`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum PagedSchedule {
    /// The split-KV kernel with [`choose_schedule_for`]'s schedule: the one candidate, `default`.
    Default,
    /// The split-KV kernel.
    SplitKv(DecodeSchedule),
    /// The single-CTA CUDA-core kernel.
    SingleCta(AttentionSchedule),
}

impl Schedule for PagedSchedule {
    fn name(&self) -> String {
        match self {
            PagedSchedule::Default => "default".into(),
            PagedSchedule::SplitKv(s) => format!("split-kv w{} r{} c{}", s.warps, s.rows, s.cluster),
            PagedSchedule::SingleCta(s) => format!("single-cta {s:?}"),
        }
    }
}

/// The paged attention family's generator.
pub(crate) struct PagedAttention;

impl Generator for PagedAttention {
    type Analysis<'g> = Paged;
    type Schedule = PagedSchedule;
    fn analyse<'g>(graph: &'g KernelGraph, kernel: Kernel, _: &Target) -> R<Paged> {
        Paged::analyse(graph, kernel)
    }
    fn default_schedule(_: &Paged, _: &Target) -> R<PagedSchedule> {
        Ok(PagedSchedule::Default)
    }
    fn build(p: &Paged, s: &PagedSchedule, target: &Target) -> R<LaunchPlan> {
        match s {
            PagedSchedule::Default => plan(p, target, &choose_schedule_for(p.rows().as_const(), p.d, target)),
            PagedSchedule::SplitKv(s) => plan(p, target, s),
            PagedSchedule::SingleCta(s) => super::simt::paged_plan(p, target, s),
        }
    }
}

/// As [`generate`], with the schedule given.
///
/// # Errors
/// As [`generate`], and [`CodegenError::Unsupported`] for an invalid schedule (a cluster on
/// sm_80, or with a symbolic row count).
pub fn generate_with(graph: &KernelGraph, kernel: Kernel, target: &Target, schedule: &DecodeSchedule) -> Result<LaunchPlan, CodegenError> {
    let p = Paged::analyse(graph, kernel)?;
    PagedAttention::build(&p, &PagedSchedule::SplitKv(*schedule), target)
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
pub(super) const UMAX_HI: f64 = 20.0;

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
}

/// Test hooks of the unified-max path: `PoisonFallback` makes a worker that recomputed report
/// l = NaN (so the rows it served come out NaN), `NeverFallback` drops the recomputation, so
/// that the tests can see which path each worker took.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(not(test), allow(dead_code))]
pub(super) enum Probe {
    Off,
    PoisonFallback,
    NeverFallback,
}

#[cfg(test)]
thread_local! {
    pub(super) static PROBE: std::cell::Cell<Probe> = const { std::cell::Cell::new(Probe::Off) };
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
    /// Its first visible key (i32): 0, or with a sliding window `max(limit − W, 0)`.
    start: IntValue<'ctx>,
    /// Element offset of its log-sum-exp, when the kernel writes it (`lse=true`).
    lse_off: Option<IntValue<'ctx>>,
}

/// Emits the split-KV decode kernel (see the module docs): the CTA's indices and rows
/// ([`Decode::new`]), Q staged, the worker's tiles ([`Worker`]), its partial result, and the
/// log-sum-exp merge.
fn build<'ctx>(kit: &Kit<'ctx>, p: &Paged, s: &DecodeSchedule, sm: &Smem, shared: SharedKind) -> R<()> {
    let cta = Decode::new(kit, p, s, sm, shared)?;
    cta.load_q()?;
    let w = cta.worker()?;
    match (p.unified_max, &w.um) {
        (Some(phi), Some(u)) => w.unified(phi, u)?,
        _ => w.tiles(kit, None)?,
    }
    let clustered = w.store_partial()?;
    cta.merge_all(clustered)
}

/// The CTA of a split-KV decode kernel: its indices, the paged addressing of its sequence and
/// KV head, and its query rows.
struct Decode<'a, 'ctx> {
    kit: &'a Kit<'ctx>,
    p: &'a Paged,
    s: &'a DecodeSchedule,
    sm: &'a Smem,
    dt: DType,
    d: u32,
    dv: u32,
    /// Rows, warps (workers) and cluster CTAs.
    rt: u32,
    nw: u32,
    nc: u32,
    /// Elements of a Q or K row per load.
    ck: u32,
    smem: PointerValue<'ctx>,
    zero: FloatValue<'ctx>,
    ninf: FloatValue<'ctx>,
    tid: IntValue<'ctx>,
    warp: IntValue<'ctx>,
    lane: IntValue<'ctx>,
    /// The CTA's rank in its cluster.
    rank: IntValue<'ctx>,
    a: PagedAddr<'ctx>,
    rows: Vec<Row<'ctx>>,
}

impl<'a, 'ctx> Decode<'a, 'ctx> {
    /// The cluster attribute, the shared memory, the CTA's indices, the sequence's length
    /// (clamped to what the table can hold) with the paged addressing, and the rows.
    fn new(kit: &'a Kit<'ctx>, p: &'a Paged, s: &'a DecodeSchedule, sm: &'a Smem, shared: SharedKind) -> R<Self> {
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

        let a = p.addressing(kit, g, b)?;
        let row = |k: &Kit<'ctx>, r: u32| -> R<Row<'ctx>> {
            let rg = k.add(k.mul(tile_row, k.i64c(i64::from(rt)))?, k.i64c(i64::from(r)))?;
            let (valid, q_off, o_off, limit, start) = a.row(k, rg)?;
            let limit = k.select_int(valid, limit, k.i64c(0))?;
            Ok(Row { valid, q_off, o_off, limit: k.trunc32(limit)?, start: k.trunc32(start)?, lse_off: a.lse_off(k, rg)? })
        };
        let rows: Vec<Row> = (0..rt).map(|r| row(kit, r)).collect::<R<_>>()?;
        let ck = [8u32, 4, 2, 1].into_iter().find(|c| d % c == 0).unwrap_or(1);
        Ok(Decode { kit, p, s, sm, dt, d, dv, rt, nw, nc, ck, smem, zero, ninf, tid, warp, lane, rank, a, rows })
    }

    fn i32c(&self, v: u32) -> IntValue<'ctx> {
        self.kit.i32c(v as i32)
    }

    /// Pointer to element `e` (i32) of `size` bytes of the shared part at byte `base`.
    fn at(&self, k: &Kit<'ctx>, base: u32, e: IntValue<'ctx>, size: i32) -> R<PointerValue<'ctx>> {
        k.sh_at(self.smem, k.add(k.i32c(base as i32), k.mul(e, k.i32c(size))?)?)
    }

    /// 1. Q → shared memory (f32), zeros for missing rows.
    fn load_q(&self) -> R<()> {
        let (kit, p, d, ck) = (self.kit, self.p, self.d, self.ck);
        let i32c = |v: u32| self.i32c(v);
        let q_vec = p.q.vector_ok(ck);
        let q_sd = kit.dim(&p.q.st[3])?;
        for (r, info) in self.rows.iter().enumerate() {
            kit.for_range(self.tid, i32c(d / ck), i32c(self.s.threads()), |k, c| {
                let dc = k.mul(c, i32c(ck))?;
                let idx = k.add(info.q_off, k.mul(k.zext64(dc)?, q_sd)?)?;
                let vals = k.guarded_load(info.valid, self.dt, k.buf(p.q.buffer)?, idx, ck, q_vec, q_sd)?;
                k.sh_store(DType::F32, self.at(k, self.sm.q, k.add(i32c(r as u32 * d), dc)?, 4)?, &vals)
            })?;
        }
        kit.barrier()
    }

    /// 2. The worker's tiles: how many the sequence has, solo mode, this warp's place among the
    /// workers and its running state.
    fn worker(&self) -> R<Worker<'_, 'ctx>> {
        let (kit, p, rt, nw, nc, dv) = (self.kit, self.p, self.rt, self.nw, self.nc, self.dv);
        let i32c = |v: u32| self.i32c(v);
        let (zero, ninf) = (self.zero, self.ninf);
        let kv_end = self.rows.iter().try_fold(kit.i32c(0), |acc, r| kit.smax(acc, r.limit))?;
        let ntiles = kit.udiv(kit.add(kv_end, i32c(TILE - 1))?, i32c(TILE))?;
        // With a sliding window the tiles below the rows' first visible key are skipped: the
        // workers start at the tile holding it (past `ntiles` when no row exists).
        let kv_start = match p.window {
            Some(_) => self.rows.iter().try_fold(kit.i32c(i32::MAX), |acc, r| kit.smin(acc, kit.select_int(r.valid, r.start, kit.i32c(i32::MAX))?))?,
            None => kit.i32c(0),
        };
        let tile_lo = kit.udiv(kv_start, i32c(TILE))?;
        // Solo mode (a cluster whose sequence has at most SOLO_TILES tiles): rank 0 takes every
        // tile, the other CTAs leave at once, and no cluster barrier is crossed. Otherwise
        // consecutive tiles go to different CTAs (SMs) first, then to the warps of each.
        let solo = match (nc > 1, p.window.is_some()) {
            (false, _) => kit.bool_c(true),
            (true, false) => kit.icmp(IntPredicate::ULE, ntiles, i32c(SOLO_TILES))?,
            (true, true) => kit.icmp(IntPredicate::SLE, kit.sub(ntiles, tile_lo)?, i32c(SOLO_TILES))?,
        };
        if nc > 1 {
            let idle = kit.and(solo, kit.icmp(IntPredicate::NE, self.rank, i32c(0))?)?;
            let (leave, stay) = kit.math(|kb| Ok((kb.block("idle"), kb.block("work"))))?;
            kit.math(|kb| kb.cond_br(idle, leave, stay))?;
            kit.math(|kb| {
                kb.position(leave);
                kb.ret()?;
                kb.position(stay);
                Ok(())
            })?;
        }
        let worker = kit.select_int(solo, self.warp, kit.add(kit.mul(self.warp, i32c(nc))?, self.rank)?)?;
        let n_workers = kit.select_int(solo, i32c(nw), i32c(nc * nw))?;
        let m: Vec<PointerValue> = (0..rt).map(|_| kit.var_f(ninf)).collect::<R<_>>()?;
        let l: Vec<PointerValue> = (0..rt).map(|_| kit.var_f(zero)).collect::<R<_>>()?;
        // Lane dims: `cv` consecutive dims per lane when dv is a multiple of 32, else dims
        // lane + 32·i (i < nd), guarded by dv.
        let per_lane = dv % 32 == 0 && matches!(dv / 32, 1 | 2 | 4 | 8);
        let nd = if per_lane { dv / 32 } else { dv.div_ceil(32) };
        let v_vec = per_lane && p.vp.vector_ok(nd);
        let acc: Vec<Vec<PointerValue>> = (0..rt).map(|_| (0..nd).map(|_| kit.var_f(zero)).collect::<R<_>>()).collect::<R<_>>()?;
        let (k_sd, v_sd) = (kit.dim(&p.kp.st[3])?, kit.dim(&p.vp.st[3])?);
        let k_vec = p.kp.vector_ok(self.ck);
        let (k_ptr, v_ptr) = (kit.buf(p.kp.buffer)?, kit.buf(p.vp.buffer)?);
        let scale = kit.f32c(p.scale);
        // V rows prefetched with K: as many keys as fit about 64 registers of V values (16-bit
        // values two to a register), fewer when the accumulators are many.
        let per_reg = if self.dt.size_bytes() == 2 { 2 } else { 1 };
        let mut prefetch = (64 * per_reg / nd).clamp(8, TILE) / 8 * 8;
        if rt * nd > 16 {
            prefetch = (prefetch / 2).max(8);
        }
        // Head dims above 256 (16 values a V row at D 512): no V rows live across the scores,
        // and V loaded four rows at a time.
        let v_batch = if nd > 8 { 4 } else { 8 };
        if nd > 8 {
            prefetch = 0;
        }
        // The unified-max path's per-row state: each lane's running maximum of its raw scores
        // and sum of its p.
        let um = match p.unified_max {
            Some(_) => Some(Unified {
                lmax: (0..rt).map(|_| kit.var_f(ninf)).collect::<R<_>>()?,
                lsum: (0..rt).map(|_| kit.var_f(zero)).collect::<R<_>>()?,
            }),
            None => None,
        };
        Ok(Worker { c: self, kv_start, kv_end, tile_lo, ntiles, solo, worker, n_workers, m, l, per_lane, nd, v_vec, acc, k_sd, v_sd, k_vec, k_ptr, v_ptr, scale, prefetch, v_batch, um })
    }

    /// 4. Merge by log-sum-exp. In cluster mode each CTA writes its share of the rt·dv outputs
    /// from every CTA's partials; in solo mode (and without a cluster) the CTA writes them all
    /// from its own.
    fn merge_all(&self, clustered: IntValue<'ctx>) -> R<()> {
        let (kit, nc) = (self.kit, self.nc);
        let i32c = |v: u32| self.i32c(v);
        let outs = self.rt * self.dv;
        let o_sd = kit.dim(&self.p.out.st[3])?;
        if nc == 1 {
            self.merge(kit, 1, i32c(0), i32c(outs), o_sd)?;
        } else {
            let per = outs.div_ceil(nc);
            let o_lo = kit.mul(self.rank, i32c(per))?;
            let o_hi = kit.smin(kit.add(o_lo, i32c(per))?, i32c(outs))?;
            kit.if_else(clustered, |k| self.merge(k, nc, o_lo, o_hi, o_sd), |k| self.merge(k, 1, k.i32c(0), k.i32c(outs as i32), o_sd))?;
            // Every CTA's shared memory stays until the others have read it.
            kit.if_then(clustered, cluster_barrier)?;
        }
        Ok(())
    }

    /// Outputs `o_lo..o_hi` (row-major over the CTA's rows and dims) merged from the partials
    /// of `ctas` CTAs (1: this CTA's own).
    fn merge(&self, kit: &Kit<'ctx>, ctas: u32, o_lo: IntValue<'ctx>, o_hi: IntValue<'ctx>, o_sd: IntValue<'ctx>) -> R<()> {
        let (p, dv, rt, nw, sm) = (self.p, self.dv, self.rt, self.nw, self.sm);
        let (zero, ninf) = (self.zero, self.ninf);
        let i32c = |v: u32| self.i32c(v);
        let peer = |k: &Kit<'ctx>, ptr: PointerValue<'ctx>, cta: u32| -> R<PointerValue<'ctx>> {
            if ctas == 1 {
                return Ok(ptr);
            }
            k.math(|kb| Ok(kb.intrinsic_value("llvm.nvvm.mapa.shared.cluster", &[], &[ptr.into(), kb.i32c(i64::from(cta)).into()])?.into_pointer_value()))
        };
        kit.for_range(kit.add(o_lo, self.tid)?, o_hi, i32c(self.s.threads()), |k, o| {
            let r = k.udiv(o, i32c(dv))?;
            let dcol = k.urem(o, i32c(dv))?;
            // Row r's facts (r is not a constant here: select among the CTA's rows).
            let mut valid = k.bool_c(false);
            let mut o_off = k.i64c(0);
            let mut lse_off = k.i64c(0);
            for (ri, info) in self.rows.iter().enumerate() {
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
                        let mp = peer(k, self.at(k, sm.part, slot, 8)?, cta)?;
                        let ap = peer(k, self.at(k, sm.acc, k.add(k.mul(slot, i32c(dv))?, dcol)?, 4)?, cta)?;
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
                    let w = exp0(k, k.fsub(mv, m_use)?)?;
                    num = k.fma(av, w, num)?;
                    den = k.fma(lv, w, den)?;
                }
                // A row without a score above −inf: num = Σ 0·acc_u (0 for finite V).
                let out = k.select_f(empty, num, k.fdiv(num, den)?)?;
                let idx = k.add(o_off, k.mul(k.zext64(dcol)?, o_sd)?)?;
                k.store_vec(self.dt, k.buf(p.out.buffer)?, idx, &[out])?;
                if let Some(lse) = &p.lse {
                    // The row's log-sum-exp M + ln Σ l_u·e^{m_u − M}, by its dim-0 thread.
                    let v = k.select_f(empty, ninf, k.fadd(m_use, k.log(den)?)?)?;
                    k.if_then(k.icmp(IntPredicate::EQ, dcol, i32c(0))?, |k| k.store_vec(DType::F32, k.buf(lse.buffer)?, lse_off, &[v]))?;
                }
                Ok(())
            })
        })
    }
}

/// A warp of a split-KV decode CTA as a worker: its tiles, its running state (m, l, acc per
/// row), and how it reads V.
struct Worker<'w, 'ctx> {
    c: &'w Decode<'w, 'ctx>,
    /// The CTA's key range: from the smallest of its rows' first visible keys (0 without a
    /// window) to the largest of their limits; in tiles `tile_lo..ntiles`.
    kv_start: IntValue<'ctx>,
    kv_end: IntValue<'ctx>,
    tile_lo: IntValue<'ctx>,
    ntiles: IntValue<'ctx>,
    /// Solo mode (see the module docs), `i1`.
    solo: IntValue<'ctx>,
    worker: IntValue<'ctx>,
    n_workers: IntValue<'ctx>,
    m: Vec<PointerValue<'ctx>>,
    l: Vec<PointerValue<'ctx>>,
    /// Whether each lane owns `nd` consecutive dims (else dims `lane + 32·i`).
    per_lane: bool,
    nd: u32,
    v_vec: bool,
    acc: Vec<Vec<PointerValue<'ctx>>>,
    k_sd: IntValue<'ctx>,
    v_sd: IntValue<'ctx>,
    k_vec: bool,
    k_ptr: PointerValue<'ctx>,
    v_ptr: PointerValue<'ctx>,
    scale: FloatValue<'ctx>,
    /// Keys whose V slices are loaded with K.
    prefetch: u32,
    /// V rows loaded at a time after those (8; 4 above D 256).
    v_batch: u32,
    um: Option<Unified<'ctx>>,
}

impl<'w, 'ctx> Worker<'w, 'ctx> {
    fn i32c(&self, v: u32) -> IntValue<'ctx> {
        self.c.i32c(v)
    }

    /// Output dim `i` of this lane.
    fn dim_of(&self, k: &Kit<'ctx>, i: u32) -> R<IntValue<'ctx>> {
        if self.per_lane {
            k.add(k.mul(self.c.lane, self.i32c(self.nd))?, self.i32c(i))
        } else {
            k.add(self.c.lane, self.i32c(32 * i))
        }
    }

    /// Row `r`'s p of tile key `jj` in the warp's shared memory.
    fn p_row(&self, k: &Kit<'ctx>, r: u32, jj: IntValue<'ctx>) -> R<PointerValue<'ctx>> {
        let i32c = |v: u32| self.i32c(v);
        let e = k.add(k.mul(k.add(k.mul(self.c.warp, i32c(self.c.rt))?, i32c(r))?, i32c(TILE))?, jj)?;
        self.c.at(k, self.c.sm.p, e, 4)
    }

    /// Tile key `jj`'s V-row offset in the warp's shared memory.
    fn voff_at(&self, k: &Kit<'ctx>, jj: IntValue<'ctx>) -> R<PointerValue<'ctx>> {
        self.c.at(k, self.c.sm.voff, k.add(k.mul(self.c.warp, self.i32c(TILE))?, jj)?, 8)
    }

    /// This lane's slice of tile key `jj`'s V row.
    fn v_row(&self, k: &Kit<'ctx>, jj: IntValue<'ctx>) -> R<Vec<FloatValue<'ctx>>> {
        let (dt, nd, v_ptr, v_sd) = (self.c.dt, self.nd, self.v_ptr, self.v_sd);
        let slot = self.voff_at(k, jj)?;
        let i64t = k.i64t;
        let vo = k.math(|kb| Ok(kb.load(i64t.into(), slot, 8)?.into_int_value()))?;
        if self.per_lane {
            let idx = k.add(vo, k.mul(k.zext64(self.dim_of(k, 0)?)?, v_sd)?)?;
            if self.v_vec {
                k.load_vec(dt, v_ptr, idx, nd)
            } else {
                k.load_strided(dt, v_ptr, idx, v_sd, nd)
            }
        } else {
            (0..nd)
                .map(|i| {
                    let dcol = k.smin(self.dim_of(k, i)?, self.i32c(self.c.dv - 1))?;
                    Ok(k.load_vec(dt, v_ptr, k.add(vo, k.mul(k.zext64(dcol)?, v_sd)?)?, 1)?[0])
                })
                .collect()
        }
    }

    /// The worker's tiles: with the online softmax (`unified` None), or with the unified
    /// maximum φ (the fast path, whose per-row state is `um`).
    fn tiles(&self, kit: &Kit<'ctx>, unified: Option<f32>) -> R<()> {
        let first = if self.c.p.window.is_some() { kit.add(self.tile_lo, self.worker)? } else { self.worker };
        kit.for_range(first, self.ntiles, self.n_workers, |k, tile| {
            let j0 = k.mul(tile, self.i32c(TILE))?;
            let j = k.add(j0, self.c.lane)?;
            let (sv, vrows) = self.scores(k, j)?;
            let bounds = self.softmax(k, j0, j, &sv, unified)?;
            k.warp_sync()?;
            self.pv(k, &bounds, &vrows)?;
            k.warp_sync()
        })
    }

    /// Key `j`'s page and offsets (V's through the warp's shared memory to every lane), the
    /// prefetched V slices, and the scores of the CTA's rows against key `j`.
    #[allow(clippy::type_complexity)]
    fn scores(&self, k: &Kit<'ctx>, j: IntValue<'ctx>) -> R<(Vec<PointerValue<'ctx>>, Vec<Vec<FloatValue<'ctx>>>)> {
        let (c, i64t, zero, ck, d) = (self.c, k.i64t, self.c.zero, self.c.ck, self.c.d);
        let i32c = |v: u32| self.i32c(v);
        let in_seq = k.icmp(IntPredicate::SLT, j, self.kv_end)?;
        let in_seq = if c.p.window.is_some() { k.and(in_seq, k.icmp(IntPredicate::SGE, j, self.kv_start)?)? } else { in_seq };
        let sv: Vec<PointerValue> = (0..c.rt).map(|_| k.var_f(zero)).collect::<R<_>>()?;
        let voff_slot = self.voff_at(k, c.lane)?;
        let kvar = k.math(|kb| kb.in_prologue(|kb| Ok(kb.b.build_alloca(i64t, "")?)))?;
        k.math(|kb| {
            kb.store(voff_slot, kb.i64c(0).into(), 8)?;
            kb.store(kvar, kb.i64c(0).into(), 8)
        })?;
        k.if_then(in_seq, |k| {
            let (ko, vo) = c.a.key(k, k.zext64(j)?)?;
            k.math(|kb| {
                kb.store(voff_slot, vo.into(), 8)?;
                kb.store(kvar, ko.into(), 8)
            })
        })?;
        k.warp_sync()?;
        // Every key's V slice of this lane, loaded now (a key past the sequence reads offset 0,
        // inside the buffer, and is never multiplied), so that its latency overlaps K's.
        let vrows: Vec<Vec<FloatValue>> = (0..self.prefetch).map(|jj| self.v_row(k, i32c(jj))).collect::<R<_>>()?;
        let ko = k.math(|kb| Ok(kb.load(i64t.into(), kvar, 8)?.into_int_value()))?;
        k.if_then(in_seq, |k| {
            // The whole K row first (independent loads in flight), then the dot products.
            let mut kv = Vec::with_capacity(d as usize);
            for cc in 0..d / ck {
                let idx = k.add(ko, k.mul(k.i64c(i64::from(cc * ck)), self.k_sd)?)?;
                kv.extend(if self.k_vec { k.load_vec(c.dt, self.k_ptr, idx, ck)? } else { k.load_strided(c.dt, self.k_ptr, idx, self.k_sd, ck)? });
            }
            for (r, sp) in sv.iter().enumerate() {
                let mut sum = zero;
                for cc in 0..d / ck {
                    let qv = k.sh_load(DType::F32, c.at(k, c.sm.q, i32c(r as u32 * d + cc * ck), 4)?, ck)?;
                    for (i, q) in qv.iter().enumerate() {
                        sum = k.fma(*q, kv[(cc * ck) as usize + i], sum)?;
                    }
                }
                k.set(*sp, sum.into())?;
            }
            Ok(())
        })?;
        Ok((sv, vrows))
    }

    /// Per row: the online softmax, or p = exp(s − φ) against the unified maximum. Returns the
    /// keys `[lo, hi)` of the tile each row multiplies: its visible ones (a −inf score's with
    /// p = 0, as the interpreter does).
    fn softmax(&self, k: &Kit<'ctx>, j0: IntValue<'ctx>, j: IntValue<'ctx>, sv: &[PointerValue<'ctx>], unified: Option<f32>) -> R<Vec<(IntValue<'ctx>, IntValue<'ctx>)>> {
        let (c, zero, ninf) = (self.c, self.c.zero, self.c.ninf);
        let (m, l) = (&self.m, &self.l);
        let i32c = |v: u32| self.i32c(v);
        let lane = c.lane;
        let mut bounds = Vec::with_capacity(c.rt as usize);
        for (r, info) in c.rows.iter().enumerate() {
            let visible = k.icmp(IntPredicate::SLT, j, info.limit)?;
            let visible = if c.p.window.is_some() { k.and(visible, k.icmp(IntPredicate::SGE, j, info.start)?)? } else { visible };
            let sc = k.select_f(visible, cap_score(k, k.fmul(k.get_f(sv[r])?, self.scale)?, c.p.softcap)?, ninf)?;
            let n_vis = |k: &Kit<'ctx>| k.smin(k.smax(k.sub(info.limit, j0)?, i32c(0))?, i32c(TILE));
            // The tile's keys below the row's window are never multiplied.
            let w_lo = |k: &Kit<'ctx>, lo: IntValue<'ctx>| -> R<IntValue<'ctx>> {
                if c.p.window.is_none() {
                    return Ok(lo);
                }
                k.smax(lo, k.smin(k.smax(k.sub(info.start, j0)?, i32c(0))?, i32c(TILE))?)
            };
            if let (Some(phi), Some(u)) = (unified, &self.um) {
                k.set(u.lmax[r], k.max_nan(k.get_f(u.lmax[r])?, sc)?.into())?;
                let pj = exp0(k, k.fsub(sc, k.f32c(f64::from(phi)))?)?;
                k.set(u.lsum[r], k.fadd(k.get_f(u.lsum[r])?, pj)?.into())?;
                k.sh_store(DType::F32, self.p_row(k, r as u32, lane)?, &[pj])?;
                bounds.push((w_lo(k, i32c(0))?, n_vis(k)?));
                continue;
            }
            let tile_max = k.warp_reduce(sc, &[16, 8, 4, 2, 1], |k, a, b| k.max_nan(a, b))?;
            let m_old = k.get_f(m[r])?;
            let m_new = k.max_nan(m_old, tile_max)?;
            let none_yet = k.fcmp(FloatPredicate::OEQ, m_new, ninf)?;
            let m_use = k.select_f(none_yet, zero, m_new)?;
            let alpha = exp0(k, k.fsub(m_old, m_use)?)?;
            let pj = exp0(k, k.fsub(sc, m_use)?)?;
            let psum = k.warp_reduce(pj, &[16, 8, 4, 2, 1], |k, a, b| k.fadd(a, b))?;
            k.set(l[r], k.fma(k.get_f(l[r])?, alpha, psum)?.into())?;
            for a in &self.acc[r] {
                k.set(*a, k.fmul(k.get_f(*a)?, alpha)?.into())?;
            }
            k.set(m[r], m_new.into())?;
            k.sh_store(DType::F32, self.p_row(k, r as u32, lane)?, &[pj])?;
            bounds.push((w_lo(k, i32c(0))?, n_vis(k)?));
        }
        Ok(bounds)
    }

    /// acc += P·V over the keys some row multiplies; unguarded and 8 keys at a time when
    /// every row takes the whole tile.
    fn pv(&self, k: &Kit<'ctx>, bounds: &[(IntValue<'ctx>, IntValue<'ctx>)], vrows: &[Vec<FloatValue<'ctx>>]) -> R<()> {
        let i32c = |v: u32| self.i32c(v);
        let mut full = k.bool_c(true);
        let (mut jlo, mut jhi) = (i32c(TILE), i32c(0));
        for (lo, hi) in bounds {
            full = k.and(full, k.and(k.icmp(IntPredicate::EQ, *lo, i32c(0))?, k.icmp(IntPredicate::EQ, *hi, i32c(TILE))?)?)?;
            jlo = k.smin(jlo, *lo)?;
            jhi = k.smax(jhi, *hi)?;
        }
        let accumulate = |k: &Kit<'ctx>, jj: IntValue<'ctx>, vs: &[FloatValue<'ctx>], guarded: bool| -> R<()> {
            for (r, (lo, hi)) in bounds.iter().enumerate() {
                let pj = k.sh_load(DType::F32, self.p_row(k, r as u32, jj)?, 1)?[0];
                let ok = if guarded { Some(k.and(k.icmp(IntPredicate::SGE, jj, *lo)?, k.icmp(IntPredicate::SLT, jj, *hi)?)?) } else { None };
                for (a, v) in self.acc[r].iter().zip(vs) {
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
        // The prefetched keys, then the rest `v_batch` V loads at a time.
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
            for j8 in (self.prefetch..TILE).step_by(self.v_batch as usize) {
                let batch: Vec<Vec<FloatValue>> = (j8..j8 + self.v_batch).map(|jj| self.v_row(k, i32c(jj))).collect::<R<_>>()?;
                for (u, v) in batch.iter().enumerate() {
                    step(k, j8 + u as u32, v)?;
                }
            }
            Ok(())
        };
        k.if_else(full, |k| pv(k, false), |k| pv(k, true))
    }

    /// The unified-max path: the tiles against φ, then the worker's largest score and its sum
    /// per row (one warp reduction each), and whether some row's largest score lies outside
    /// [φ − UMAX_LO, φ + UMAX_HI]: then the worker recomputes its tiles with the online softmax.
    fn unified(&self, phi: f32, u: &Unified<'ctx>) -> R<()> {
        let (kit, rt, zero, ninf) = (self.c.kit, self.c.rt, self.c.zero, self.c.ninf);
        let (m, l) = (&self.m, &self.l);
        self.tiles(kit, Some(phi))?;
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
                    for a in &self.acc[r] {
                        k.set(*a, zero.into())?;
                    }
                }
                self.tiles(k, None)?;
                if probe() == Probe::PoisonFallback {
                    for lr in l {
                        k.set(*lr, k.f32c(f64::NAN).into())?;
                    }
                }
                Ok(())
            })?;
        }
        Ok(())
    }

    /// 3. The worker's partial result → shared memory; then, in cluster mode (`i1`, returned),
    /// the cluster barrier that makes every CTA's partials visible.
    fn store_partial(&self) -> R<IntValue<'ctx>> {
        let (c, kit) = (self.c, self.c.kit);
        let (rt, dv, nc) = (c.rt, c.dv, c.nc);
        let i32c = |v: u32| self.i32c(v);
        for r in 0..rt {
            let slot = kit.add(kit.mul(c.warp, i32c(rt))?, i32c(r))?;
            let ml = c.at(kit, c.sm.part, slot, 8)?;
            kit.sh_store(DType::F32, ml, &[kit.get_f(self.m[r as usize])?, kit.get_f(self.l[r as usize])?])?;
            for (i, a) in self.acc[r as usize].iter().enumerate() {
                let dcol = self.dim_of(kit, i as u32)?;
                let inside = kit.icmp(IntPredicate::SLT, dcol, i32c(dv))?;
                let val = kit.get_f(*a)?;
                kit.if_then(inside, |k| k.sh_store(DType::F32, c.at(k, c.sm.acc, k.add(k.mul(slot, i32c(dv))?, dcol)?, 4)?, &[val]))?;
            }
        }
        kit.barrier()?;
        let clustered = kit.and(kit.bool_c(nc > 1), kit.icmp(IntPredicate::EQ, self.solo, kit.bool_c(false))?)?;
        if nc > 1 {
            kit.if_then(clustered, cluster_barrier)?;
        }
        Ok(clustered)
    }
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
