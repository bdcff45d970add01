//! The Hopper tensor-core kernel ([`WgmmaSchedule`]): warpgroup MMAs (`wgmma.mma_async`) on
//! 128-byte-swizzled slabs loaded by `cp.async` or the TMA, optionally warp-specialised and
//! persistent; bf16, f16 and fp8 (`f8e4m3`) operands.
//!
//! Design notes: book/src/design/matmul.md

use inkwell::values::{FloatValue, IntValue, PointerValue};
use inkwell::IntPredicate;
use sinter_ir::{DType, Dim};

use super::epilogue::{MmaTile, mma_epilogue};
use super::pipeline::{raster, group_tiles, StageLoads};
use super::schedule::{MmaSchedule, WgmmaSchedule, WS_PRODUCER_REGS, WS_CONSUMER_REGS};
use super::spec::{MatOperand, Spec, MmaPlan, Bases, batch_bases};
use crate::isa::kit::{Kit, SharedKind, R};
use crate::kernels::fp8_operand::fp8_scale;

/// One warpgroup's `wgmma` products of a K tile ([`build_wgmma`], [`build_wgmma_ws`]): the
/// matrix descriptors (PTX ISA §9.7.15.5.1: start address >> 4 in bits 0–13, leading byte
/// offset — unused for swizzled K-major operands: 1 — in 16–29, stride byte offset 1024 >> 4 in
/// 32–45, 128-byte swizzle (1) in 62–63) of the warpgroup's A rows and the CTA's B rows in a
/// stage, stepped `k_step_bytes` per instruction (16 of K for bf16/f16, 32 for e4m3).
pub(super) struct WgmmaProducts<'ctx> {
    pub(super) a_wg: IntValue<'ctx>,
    pub(super) b_cta: IntValue<'ctx>,
    pub(super) dt: DType,
    pub(super) ik: u32,
    pub(super) k_step_bytes: u32,
    pub(super) bk: u32,
    pub(super) bn: u32,
    pub(super) in_flight: u32,
}

impl<'ctx> WgmmaProducts<'ctx> {
    /// The products of warpgroup `wg` (i32) over the slabs at shared address `sbase` (i32).
    pub(super) fn new(kit: &Kit<'ctx>, spec: &Spec, w: &WgmmaSchedule, plan: &MmaPlan, sbase: IntValue<'ctx>, wg: IntValue<'ctx>) -> R<Self> {
        let dt = spec.a.dtype;
        let ik = crate::isa::wgmma_k(dt).ok_or_else(|| kit.err(format!("wgmma of {dt} operands")))?;
        let a_wg = kit.add(sbase, kit.add(kit.mul(wg, kit.i32c((64 * plan.a.row_bytes()) as i32))?, kit.i32c(plan.a.base as i32))?)?;
        let b_cta = kit.add(sbase, kit.i32c(plan.b.base as i32))?;
        Ok(WgmmaProducts { a_wg, b_cta, dt, ik, k_step_bytes: ik * dt.size_bytes() as u32, bk: w.tile.bk, bn: w.tile.bn, in_flight: w.in_flight })
    }

    /// Issues the K tile in the stage at byte offset `stage` (i32) onto the accumulators `acc`
    /// (their variables, updated in place; [`KernelBuilder::wgmma_k_tile`](crate::isa::KernelBuilder::wgmma_k_tile)).
    pub(super) fn k_tile(&self, k: &Kit<'ctx>, stage: IntValue<'ctx>, acc: &[PointerValue<'ctx>]) -> R<()> {
        let desc_fixed = k.i64c((1i64 << 16) | (64i64 << 32) | (1i64 << 62));
        let desc = |addr: IntValue<'ctx>| -> R<IntValue<'ctx>> {
            let enc = k.lshr(k.and(addr, k.i32c(0x3FFFF))?, 4)?;
            k.add(desc_fixed, k.zext64(enc)?)
        };
        let mut descs = Vec::with_capacity((self.bk / self.ik) as usize);
        for kk in 0..self.bk / self.ik {
            let off = k.add(stage, k.i32c((self.k_step_bytes * kk) as i32))?;
            descs.push((desc(k.add(self.a_wg, off)?)?, desc(k.add(self.b_cta, off)?)?));
        }
        let cur: Vec<FloatValue> = acc.iter().map(|&p| k.get_f(p)).collect::<R<_>>()?;
        let out = k.wgmma_k_tile(self.dt, self.bn, &cur, &descs, self.in_flight)?;
        for (&p, v) in acc.iter().zip(out) {
            k.set(p, v.into())?;
        }
        Ok(())
    }
}

/// The TMA loads of the wgmma kernel's pipeline ([`WgmmaSchedule::tma`], PTX ISA §9.7.9.25.5.2
/// and §9.7.13.15 "mbarrier"): stage `i` has an mbarrier (arrival count 1); thread 0 fills a
/// stage by arriving with the expected transaction bytes (A's and B's boxes) and issuing one
/// `cp.async.bulk.tensor` per operand from its tensor map (`Kit` maps 0 and 1,
/// [`Spec::tma_maps`]), which completes the barrier's phase as the bytes land; every thread
/// waits on the phase's parity (`(kt / stages) mod 2` for K tile `kt`) before reading the
/// stage. The boxes land 128-byte swizzled, as the descriptors expect.
pub(super) struct TmaLoads<'ctx> {
    /// Shared address of stage 0's mbarrier (i32).
    pub(super) bars: IntValue<'ctx>,
    /// Shared address of the dynamic shared memory (i32).
    pub(super) sbase: IntValue<'ctx>,
    /// Whether this is thread 0 (i1).
    pub(super) leader: IntValue<'ctx>,
    /// The box coordinates after K: (M row, N column, batch coordinates…) for A and B (i32).
    pub(super) a_at: Vec<IntValue<'ctx>>,
    pub(super) b_at: Vec<IntValue<'ctx>>,
    pub(super) a_base: u32,
    pub(super) b_base: u32,
    pub(super) tx_bytes: u32,
    pub(super) stage_bytes: u32,
    pub(super) stages: u32,
    pub(super) bk: u32,
}

impl<'ctx> TmaLoads<'ctx> {
    /// Initialises the stages' mbarriers (thread 0, then a fence and a CTA barrier).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn new(kit: &Kit<'ctx>, spec: &Spec, s: &MmaSchedule, plan: &MmaPlan, tid: IntValue<'ctx>, bases: &Bases<'ctx>, (m0, pid_n): (IntValue<'ctx>, IntValue<'ctx>), smem: PointerValue<'ctx>) -> R<Self> {
        let bars = kit.mbarriers(s.stages)?;
        let leader = kit.icmp(IntPredicate::EQ, tid, kit.i32c(0))?;
        kit.if_then(leader, |k| {
            for i in 0..s.stages {
                k.mbarrier_init(k.add(bars, k.i32c((8 * i) as i32))?, 1)?;
            }
            k.fence_mbarrier_init()
        })?;
        kit.barrier()?;
        let n0 = kit.mul(pid_n, kit.i64c(i64::from(s.bn)))?;
        let at = |op: &MatOperand, outer: IntValue<'ctx>| tma_box_at(kit, op, outer, bases);
        Ok(TmaLoads {
            bars,
            sbase: kit.smem_addr(smem)?,
            leader,
            a_at: at(&spec.a, m0)?,
            b_at: at(&spec.b, n0)?,
            a_base: plan.a.base,
            b_base: plan.b.base,
            tx_bytes: plan.a.bytes() + plan.b.bytes(),
            stage_bytes: plan.stage_bytes,
            stages: s.stages,
            bk: s.bk,
        })
    }

    /// The mbarrier of the stage at byte offset `stage` (i32).
    pub(super) fn bar(&self, k: &Kit<'ctx>, stage: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        let idx = k.udiv(stage, k.i32c(self.stage_bytes as i32))?;
        k.add(self.bars, k.shl(idx, 3)?)
    }

    /// Thread 0 issues K tile `kt`'s boxes into the stage at byte offset `stage`.
    pub(super) fn issue(&self, k: &Kit<'ctx>, kt: IntValue<'ctx>, stage: IntValue<'ctx>) -> R<()> {
        k.if_then(self.leader, |k| {
            let bar = self.bar(k, stage)?;
            k.mbarrier_arrive_expect_tx(bar, self.tx_bytes)?;
            let k0 = k.mul(kt, k.i32c(self.bk as i32))?;
            let dst = k.add(self.sbase, stage)?;
            let mut a = vec![k0];
            a.extend(self.a_at.iter().copied());
            k.tma_load(k.add(dst, k.i32c(self.a_base as i32))?, 0, &a, bar)?;
            let mut b = vec![k0];
            b.extend(self.b_at.iter().copied());
            k.tma_load(k.add(dst, k.i32c(self.b_base as i32))?, 1, &b, bar)
        })
    }

    /// Waits until K tile `kt`'s boxes are in the stage at byte offset `stage`.
    pub(super) fn wait(&self, k: &Kit<'ctx>, kt: IntValue<'ctx>, stage: IntValue<'ctx>) -> R<()> {
        let parity = k.and(k.udiv(kt, k.i32c(self.stages as i32))?, k.i32c(1))?;
        k.mbarrier_wait_parity(self.bar(k, stage)?, parity)
    }

    /// K tiles `0 … ahead − 1` (those that exist) into stages `0 … ahead − 1`.
    pub(super) fn prologue(&self, kit: &Kit<'ctx>, ktiles: IntValue<'ctx>, ahead: u32) -> R<()> {
        for st in 0..ahead {
            kit.if_then(kit.icmp(IntPredicate::SLT, kit.i32c(st as i32), ktiles)?, |k| self.issue(k, k.i32c(st as i32), k.i32c((st * self.stage_bytes) as i32)))?;
        }
        Ok(())
    }
}

/// The coordinates after K of an operand's TMA box (i32): its first row along M or N
/// (`outer`, i64), then the batch coordinates of `bases` along the axes the operand is not
/// broadcast on (the tensor map's axes, [`Spec::tma_maps`]).
pub(super) fn tma_box_at<'ctx>(kit: &Kit<'ctx>, op: &MatOperand, outer: IntValue<'ctx>, bases: &Bases<'ctx>) -> R<Vec<IntValue<'ctx>>> {
    let mut v = vec![kit.trunc32(outer)?];
    for (c, st) in bases.coords.iter().zip(&op.batch_strides) {
        if st.as_const() != Some(0) {
            v.push(kit.trunc32(*c)?);
        }
    }
    Ok(v)
}

/// The stage loads of the wgmma kernel: every thread's `cp.async` chunks or the TMA's boxes.
pub(super) enum WgmmaLoads<'a, 'ctx> {
    Chunks(StageLoads<'a, 'ctx>),
    Tma(TmaLoads<'ctx>),
}

/// The Hopper tensor-core GEMM ([`MatmulSchedule::Wgmma`](super::MatmulSchedule::Wgmma), sm_90a): the pipeline of
/// [`build_mma`](super::mma::build_mma) — every thread copies its 16-byte chunks of A's and B's slabs of a stage
/// with `cp.async` into 128-byte-swizzled rows, `stages − 1` K tiles in flight — with the
/// products on warpgroup MMAs (PTX ISA §9.7.15, `wgmma.mma_async` m64nNk16 for bf16/f16,
/// m64nNk32 `.e4m3.e4m3` for the fp8 matmul, both operands
/// read by the tensor cores straight from shared memory through matrix descriptors:
/// no `ldmatrix`, no fragment registers). Warpgroup `j` (threads `128j …`) owns rows
/// `64j … 64j + 63` of the CTA tile and all its `bn` columns: `bn/2` f32 accumulators per
/// thread. Per K tile: wait for its copies, `fence.proxy.async.shared::cta` (the copies are
/// generic-proxy writes, `wgmma` reads through the async proxy), a CTA barrier, `bk/16`
/// (`bk/32` for e4m3: four either way)
/// `wgmma`s committed as one group and waited for ([`KernelBuilder::wgmma_k_tile`](crate::isa::KernelBuilder::wgmma_k_tile)), then
/// the copies of K tile `kt + stages − 1` into the stage K tile `kt − 1` used (every
/// warpgroup has finished with it: it waited for its products before this tile's barrier).
///
/// The slab layout is [`Slab`](super::spec::Slab)'s: for `bk` = 64 16-bit or 128 8-bit elements, rows of 128
/// bytes whose 16-byte chunks are XOR-swizzled by `row mod 8` — exactly the K-major
/// 128-byte-swizzle canonical layout of §9.7.15.5.1 (8-row, 1024-byte swizzle atoms, stacked
/// along M/N: stride byte offset 1024; the leading byte offset unused), given a
/// 1024-byte-aligned slab; the layout is defined in bytes (16-byte units), so the same
/// descriptors serve both element sizes. A `k16` (bf16/f16) or `k32` (e4m3) step advances a
/// descriptor's start address by 32 bytes inside the atom.
///
/// **fp8** ([`Spec::fp8`]): A and B are the `f8e4m3` bytes of `dequantize_fp8(a8, scale_a)`
/// and `dequantize_fp8(b8, scale_b)`, copied as stored; the products of the e4m3 values
/// accumulate in f32 on the tensor cores, and after the last K tile every accumulator is
/// multiplied by `scale_a · scale_b` (the two f32 scalars loaded once) before the shared
/// epilogue rounds R to its dtype. The unfused graph instead rounds each dequantised operand
/// to the `dequantize_fp8` dtype before the product (for bf16, a relative 2⁻⁹ per element);
/// the fused kernel computes the exact products — as `torch._scaled_mm` and cuBLAS do — so
/// it differs from the interpreter by those roundings as well as by the accumulation order.
pub(super) fn build_wgmma<'ctx>(kit: &Kit<'ctx>, spec: &Spec, w: &WgmmaSchedule, plan: &MmaPlan) -> R<()> {
    if w.specialized {
        return build_wgmma_ws(kit, spec, w, plan);
    }
    let s = &w.tile;
    let threads = s.threads();
    kit.launch_bounds(threads);
    let stages = s.stages;
    let tid = kit.sreg("tid.x")?;
    let wg = kit.lshr(tid, 7)?;
    let (pid_m, pid_n) = raster(kit, s.group_m)?;
    let bz = kit.zext64(kit.sreg("ctaid.z")?)?;
    let m0 = kit.mul(pid_m, kit.i64c(i64::from(s.bm)))?;
    let bases = batch_bases(kit, spec, bz)?;
    let smem = kit.shared(SharedKind::Dynamic(plan.smem_bytes), plan.smem_bytes)?;
    kit.align_dynamic_shared(1024)?;

    let loads = if w.tma {
        WgmmaLoads::Tma(TmaLoads::new(kit, spec, s, plan, tid, &bases, (m0, pid_n), smem)?)
    } else {
        WgmmaLoads::Chunks(StageLoads::new(kit, spec, s, plan, tid, &bases, (m0, pid_n), smem)?)
    };
    let kdim = kit.dim(&spec.k)?;
    let bk = i64::from(s.bk);
    let ktiles = kit.trunc32(kit.udiv(kit.add(kdim, kit.i64c(bk - 1))?, kit.i64c(bk))?)?;
    // K tiles the copies run ahead: a stage is refilled once no warpgroup's products can
    // still read it (with a group left in flight, the one two tiles back).
    let ahead = stages - 1 - w.in_flight;
    if ahead < 1 {
        return Err(kit.err(format!("{w:?}: too few stages")));
    }
    match &loads {
        WgmmaLoads::Chunks(l) => l.prologue(kit, ktiles, ahead, plan.stage_bytes)?,
        WgmmaLoads::Tma(l) => l.prologue(kit, ktiles, ahead)?,
    }
    let issue = |k: &Kit<'ctx>, kt: IntValue<'ctx>, stage: IntValue<'ctx>| match &loads {
        WgmmaLoads::Chunks(l) => l.issue(k, kt, stage),
        WgmmaLoads::Tma(l) => l.issue(k, kt, stage),
    };

    let products = WgmmaProducts::new(kit, spec, w, plan, kit.smem_addr(smem)?, wg)?;

    let n_acc = (s.bn / 2) as usize;
    let zero = kit.f32c(0.0);
    let acc: Vec<PointerValue> = (0..n_acc).map(|_| kit.var_f(zero)).collect::<R<_>>()?;
    let next_stage = |k: &Kit<'ctx>, v: PointerValue<'ctx>| -> R<()> {
        let cur = k.get_i(v, k.i32t)?;
        let nxt = k.add(cur, k.i32c(plan.stage_bytes as i32))?;
        let wrap = k.icmp(IntPredicate::EQ, nxt, k.i32c((stages * plan.stage_bytes) as i32))?;
        k.set(v, k.select_i(wrap, k.i32c(0), nxt)?.into())
    };
    let read = kit.var_i(kit.i32c(0))?;
    let write = kit.var_i(kit.i32c((ahead * plan.stage_bytes) as i32))?;
    kit.for_range(kit.i32c(0), ktiles, kit.i32c(1), |k, kt| {
        let rs = k.get_i(read, k.i32t)?;
        match &loads {
            WgmmaLoads::Chunks(_) => {
                k.cp_async_wait(ahead - 1)?;
                k.fence_proxy_async()?;
            }
            // The TMA writes through the async proxy, as wgmma reads: no proxy fence.
            WgmmaLoads::Tma(l) => l.wait(k, kt, rs)?,
        }
        k.barrier()?;
        products.k_tile(k, rs, &acc)?;
        next_stage(k, read)?;
        let nk = k.add(kt, k.i32c(ahead as i32))?;
        let ws = k.get_i(write, k.i32t)?;
        k.if_then(k.icmp(IntPredicate::SLT, nk, ktiles)?, |k| issue(k, nk, ws))?;
        if !w.tma {
            k.cp_async_commit()?;
        }
        next_stage(k, write)
    })?;
    if !w.tma {
        kit.cp_async_wait(0)?;
    }
    if w.in_flight > 0 {
        // The last group, waited for with the accumulators as its operands.
        let cur: Vec<FloatValue> = acc.iter().map(|&p| kit.get_f(p)).collect::<R<_>>()?;
        let out = kit.wgmma_wait(&cur)?;
        for (&p, v) in acc.iter().zip(out) {
            kit.set(p, v.into())?;
        }
    }
    if let Some(scales) = spec.fp8 {
        // The fp8 matmul's dequantisation, once per accumulator: Σ a8·b8 · (scale_a·scale_b).
        let scale = kit.fmul(fp8_scale(kit, scales[0])?, fp8_scale(kit, scales[1])?)?;
        for &p in &acc {
            kit.set(p, kit.fmul(kit.get_f(p)?, scale)?.into())?;
        }
    }
    let tile = MmaTile { mt: 1, nt: (s.bn / 8) as usize, wm: 16, wn: s.bn, warps_m: s.warps_m, bm: s.bm, bn: s.bn, threads, first_thread: 0, m0, pid_n, bz };
    mma_epilogue(kit, spec, plan, smem, &acc, &tile, &bases)
}

/// Runs `body(kit, row tile, column tile, batch index)` (i64s) for each output tile this CTA
/// computes: with [`WgmmaSchedule::ctas`] 0, the CTA's one tile ([`raster`] of `ctaid.x/y`,
/// batch `ctaid.z`); otherwise the persistent walk — tiles `ctaid.x + i·nctaid.x` of the
/// `⌈M/bm⌉ · ⌈N/bn⌉ · batch` tiles, batch-major, each batch's tiles in [`group_tiles`]'s
/// order. Every role of the warp-specialised kernel walks the same sequence.
pub(super) fn for_each_tile<'ctx>(kit: &Kit<'ctx>, spec: &Spec, w: &WgmmaSchedule, body: impl Fn(&Kit<'ctx>, IntValue<'ctx>, IntValue<'ctx>, IntValue<'ctx>) -> R<()>) -> R<()> {
    let s = &w.tile;
    if w.ctas == 0 {
        let (pid_m, pid_n) = raster(kit, s.group_m)?;
        let bz = kit.zext64(kit.sreg("ctaid.z")?)?;
        return body(kit, pid_m, pid_n, bz);
    }
    let ceil = |d: &Dim, by: u32| -> R<IntValue<'ctx>> { kit.udiv(kit.add(kit.dim(d)?, kit.i64c(i64::from(by) - 1))?, kit.i64c(i64::from(by))) };
    let (tm, tn) = (ceil(&spec.m, s.bm)?, ceil(&spec.n, s.bn)?);
    let per_batch = kit.mul(tm, tn)?;
    let total = kit.mul(per_batch, kit.dim(&Dim::product(&spec.batch))?)?;
    let first = kit.zext64(kit.sreg("ctaid.x")?)?;
    let step = kit.zext64(kit.sreg("nctaid.x")?)?;
    kit.for_range(first, total, step, |k, t| {
        let bz = k.udiv(t, per_batch)?;
        let (pid_m, pid_n) = group_tiles(k, k.urem(t, per_batch)?, (tm, tn), s.group_m)?;
        body(k, pid_m, pid_n, bz)
    })
}

/// The warp-specialised Hopper GEMM ([`WgmmaSchedule::specialized`], sm_90a; the
/// producer/consumer split of CUTLASS's `KernelTmaWarpSpecialized*`), 384 threads:
///
/// - **warpgroup 0, the producer**: `setmaxnreg.dec` to [`WS_PRODUCER_REGS`]; thread 0
///   alone then walks the K tiles of its tiles: waits on stage `s`'s *empty* mbarrier, arrives
///   on its *full* mbarrier with the boxes' transaction bytes and issues the two
///   `cp.async.bulk.tensor` copies (PTX ISA §9.7.9.25.5.2) that complete it. Its other 127
///   threads exit.
/// - **warpgroups 1 and 2, the consumers**: `setmaxnreg.inc` to [`WS_CONSUMER_REGS`];
///   consumer warpgroup `j` (threads `128 + 128j …`) owns rows `64j … 64j + 63` of the CTA
///   tile, as in [`build_wgmma`]. Per K tile: wait on the stage's *full* mbarrier, one group
///   of `bk/16` `wgmma`s ([`KernelBuilder::wgmma_k_tile`](crate::isa::KernelBuilder::wgmma_k_tile), `wgmma.wait_group in_flight`),
///   then free the stage whose products are known complete — this tile's with `in_flight`
///   0, the previous tile's with 1 (the last one after the final `wgmma.wait_group 0`) —
///   by an arrival on its *empty* mbarrier from lane 0 of every consumer warp (the wait is
///   `.sync.aligned`: the warp is converged and its products done). Then the direct
///   epilogue ([`mma_epilogue`], from registers: no shared memory, so it overlaps the
///   producer's copies for the next tile).
///
/// Mbarriers (PTX ISA §9.7.13.15), `2·stages` of them in static shared memory: *full* `i`
/// at `8i` (arrival count 1: the producer's `arrive.expect_tx`, then the TMA's bytes),
/// *empty* `i` at `8(stages + i)` (arrival count: the consumer warps, `bm/16` = 8). Both
/// sides count K tiles across output tiles with a stage index and a phase bit that flips
/// each time the stage index wraps; a consumer waits for the full barrier's phase of that
/// parity, the producer for the empty barrier's previous phase (parity flipped: on the
/// first round a fresh barrier's "previous phase" counts as complete, so the stages start
/// free). The only CTA-wide barrier is the one publishing the barriers' initialisation.
///
/// With [`WgmmaSchedule::ctas`] > 0 the CTAs are persistent ([`for_each_tile`]): the stage
/// counters run on across tiles, so the producer fills the first stages of tile `i + 1`
/// while the consumers finish and write tile `i`.
///
/// The launch bound is 384 threads, so ptxas budgets at most 65536/384 = 168 registers per
/// thread for the kernel; `setmaxnreg` then moves them between the roles.
pub(super) fn build_wgmma_ws<'ctx>(kit: &Kit<'ctx>, spec: &Spec, w: &WgmmaSchedule, plan: &MmaPlan) -> R<()> {
    let s = &w.tile;
    spec.ws_ok(w).map_err(|e| kit.err(e))?;
    kit.launch_bounds(w.threads());
    let stages = s.stages;
    let stage_bytes = plan.stage_bytes;
    let tid = kit.sreg("tid.x")?;
    let smem = kit.shared(SharedKind::Dynamic(plan.smem_bytes), plan.smem_bytes)?;
    kit.align_dynamic_shared(1024)?;
    let sbase = kit.smem_addr(smem)?;
    let bars = kit.mbarriers(2 * stages)?;
    kit.if_then(kit.icmp(IntPredicate::EQ, tid, kit.i32c(0))?, |k| {
        for i in 0..stages {
            k.mbarrier_init(k.add(bars, k.i32c((8 * i) as i32))?, 1)?;
            k.mbarrier_init(k.add(bars, k.i32c((8 * (stages + i)) as i32))?, s.threads() / 32)?;
        }
        k.fence_mbarrier_init()
    })?;
    kit.barrier()?;
    let full = |k: &Kit<'ctx>, st: IntValue<'ctx>| k.add(bars, k.shl(st, 3)?);
    let empty = |k: &Kit<'ctx>, st: IntValue<'ctx>| k.add(bars, k.shl(k.add(st, k.i32c(stages as i32))?, 3)?);
    // (stage, phase) += 1 K tile.
    let advance = |k: &Kit<'ctx>, st: PointerValue<'ctx>, ph: PointerValue<'ctx>| -> R<()> {
        let nxt = k.add(k.get_i(st, k.i32t)?, k.i32c(1))?;
        let wrap = k.icmp(IntPredicate::EQ, nxt, k.i32c(stages as i32))?;
        k.set(st, k.select_i(wrap, k.i32c(0), nxt)?.into())?;
        k.set(ph, k.select_i(wrap, k.xor(k.get_i(ph, k.i32t)?, k.i32c(1))?, k.get_i(ph, k.i32t)?)?.into())
    };
    let kdim = kit.dim(&spec.k)?;
    let bk = i64::from(s.bk);
    let ktiles = kit.trunc32(kit.udiv(kit.add(kdim, kit.i64c(bk - 1))?, kit.i64c(bk))?)?;
    let producer = kit.icmp(IntPredicate::ULT, tid, kit.i32c(128))?;
    kit.if_else(
        producer,
        |k| {
            k.setmaxnreg(false, WS_PRODUCER_REGS)?;
            k.if_then(k.icmp(IntPredicate::EQ, tid, k.i32c(0))?, |k| {
                let (st, ph) = (k.var_i(k.i32c(0))?, k.var_i(k.i32c(0))?);
                let tx = plan.a.bytes() + plan.b.bytes();
                for_each_tile(k, spec, w, |k, pid_m, pid_n, bz| {
                    let bases = batch_bases(k, spec, bz)?;
                    let a_at = tma_box_at(k, &spec.a, k.mul(pid_m, k.i64c(i64::from(s.bm)))?, &bases)?;
                    let b_at = tma_box_at(k, &spec.b, k.mul(pid_n, k.i64c(i64::from(s.bn)))?, &bases)?;
                    k.for_range(k.i32c(0), ktiles, k.i32c(1), |k, kt| {
                        let stv = k.get_i(st, k.i32t)?;
                        k.mbarrier_wait_parity(empty(k, stv)?, k.xor(k.get_i(ph, k.i32t)?, k.i32c(1))?)?;
                        let bar = full(k, stv)?;
                        k.mbarrier_arrive_expect_tx(bar, tx)?;
                        let dst = k.add(sbase, k.mul(stv, k.i32c(stage_bytes as i32))?)?;
                        let k0 = k.mul(kt, k.i32c(s.bk as i32))?;
                        for (map, base, at) in [(0, plan.a.base, &a_at), (1, plan.b.base, &b_at)] {
                            let mut c = vec![k0];
                            c.extend(at.iter().copied());
                            k.tma_load(k.add(dst, k.i32c(base as i32))?, map, &c, bar)?;
                        }
                        advance(k, st, ph)
                    })
                })
            })
        },
        |k| {
            k.setmaxnreg(true, WS_CONSUMER_REGS)?;
            let cwg = k.lshr(k.sub(tid, k.i32c(128))?, 7)?;
            let lane0 = k.icmp(IntPredicate::EQ, k.and(tid, k.i32c(31))?, k.i32c(0))?;
            let release = |k: &Kit<'ctx>, stv: IntValue<'ctx>| k.if_then(lane0, |k| k.mbarrier_arrive(empty(k, stv)?));
            let products = WgmmaProducts::new(k, spec, w, plan, sbase, cwg)?;
            let zero = k.f32c(0.0);
            let acc: Vec<PointerValue> = (0..s.bn / 2).map(|_| k.var_f(zero)).collect::<R<_>>()?;
            let (st, ph, prev) = (k.var_i(k.i32c(0))?, k.var_i(k.i32c(0))?, k.var_i(k.i32c(0))?);
            for_each_tile(k, spec, w, |k, pid_m, pid_n, bz| {
                for &p in &acc {
                    k.set(p, zero.into())?;
                }
                k.for_range(k.i32c(0), ktiles, k.i32c(1), |k, kt| {
                    let stv = k.get_i(st, k.i32t)?;
                    k.mbarrier_wait_parity(full(k, stv)?, k.get_i(ph, k.i32t)?)?;
                    let rs = k.mul(stv, k.i32c(stage_bytes as i32))?;
                    products.k_tile(k, rs, &acc)?;
                    if w.in_flight == 0 {
                        release(k, stv)?;
                    } else {
                        // K tile kt − 1's products are complete: free its stage.
                        k.if_then(k.icmp(IntPredicate::SGT, kt, k.i32c(0))?, |k| release(k, k.get_i(prev, k.i32t)?))?;
                        k.set(prev, stv.into())?;
                    }
                    advance(k, st, ph)
                })?;
                if w.in_flight > 0 {
                    let cur: Vec<FloatValue> = acc.iter().map(|&p| k.get_f(p)).collect::<R<_>>()?;
                    let out = k.wgmma_wait(&cur)?;
                    for (&p, v) in acc.iter().zip(out) {
                        k.set(p, v.into())?;
                    }
                    k.if_then(k.icmp(IntPredicate::SGT, ktiles, k.i32c(0))?, |k| release(k, k.get_i(prev, k.i32t)?))?;
                }
                let bases = batch_bases(k, spec, bz)?;
                let m0 = k.mul(pid_m, k.i64c(i64::from(s.bm)))?;
                let tile = MmaTile { mt: 1, nt: (s.bn / 8) as usize, wm: 16, wn: s.bn, warps_m: s.warps_m, bm: s.bm, bn: s.bn, threads: s.threads(), first_thread: 128, m0, pid_n, bz };
                mma_epilogue(k, spec, plan, smem, &acc, &tile, &bases)
            })
        },
    )
}
