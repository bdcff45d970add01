//! The Ampere tensor-core kernel ([`MmaSchedule`]): `mma.m16n8k16` on `ldmatrix` fragments of
//! the `cp.async` pipeline's slabs.
//!
//! Design notes: book/src/design/matmul.md

use inkwell::values::{IntValue, PointerValue};
use inkwell::IntPredicate;

use super::epilogue::{MmaTile, mma_epilogue};
use super::pipeline::{raster, StageLoads};
use super::schedule::MmaSchedule;
use super::spec::{Spec, Slab, MmaPlan, batch_bases};
use crate::isa::kit::{Kit, SharedKind, R};

pub(super) fn build_mma<'ctx>(kit: &Kit<'ctx>, spec: &Spec, s: &MmaSchedule, plan: &MmaPlan) -> R<()> {
    let threads = s.threads();
    kit.launch_bounds(threads);
    let dt = spec.dtype;
    let (wm, wn) = s.warp_tile();
    let (mt, nt) = ((wm / 16) as usize, (wn / 8) as usize);
    let steps = s.bk / 16;
    let stages = s.stages;
    let tid = kit.sreg("tid.x")?;
    let lane = kit.and(tid, kit.i32c(31))?;
    let warp = kit.lshr(tid, 5)?;
    let warp_m = kit.urem(warp, kit.i32c(s.warps_m as i32))?;
    let warp_n = kit.udiv(warp, kit.i32c(s.warps_m as i32))?;
    let (pid_m, pid_n) = raster(kit, s.group_m)?;
    let bz = kit.zext64(kit.sreg("ctaid.z")?)?;
    let m0 = kit.mul(pid_m, kit.i64c(i64::from(s.bm)))?;
    let bases = batch_bases(kit, spec, bz)?;
    let smem = kit.shared(SharedKind::Dynamic(plan.smem_bytes), plan.smem_bytes)?;

    let loads = StageLoads::new(kit, spec, s, plan, tid, &bases, (m0, pid_n), smem)?;
    // k-tiles are counted in 32 bits (K < 2³¹·bk: a row of 2³⁷ 16-bit elements would not
    // fit in a device's memory), saving the main loop a register pair.
    let ktiles = loads.ktiles(kit)?;
    loads.prologue(kit, ktiles, stages - 1, plan.stage_bytes)?;
    let issue = |k: &Kit<'ctx>, kt: IntValue<'ctx>, stage: IntValue<'ctx>| loads.issue(k, kt, stage);

    // Each lane's ldmatrix row address within a 16×16 (outer × K) block of a slab: lane
    // 8j + r points at row r of matrix j; A's matrices are (rows 0–7, k 0–7), (8–15, 0–7),
    // (0–7, 8–15), (8–15, 8–15) — its fragment registers a0..a3 — and B's (n 0–7, k 0–7),
    // (0–7, 8–15), (8–15, 0–7), (8–15, 8–15) — b0, b1 of two n8 tiles. `warp_o` is the
    // warp's first row (A) or column (B) of the CTA tile. The block at (outer 16·blk, K
    // 16·kk) is then at `lane_addr(kk, blk)` (see `frag_addr`): the swizzle XORs only chunk
    // bits, so block offsets along the chunk axis are XORs and along the row axis adds.
    let j = kit.lshr(lane, 3)?;
    let r = kit.and(lane, kit.i32c(7))?;
    let lane_base = |slab: &Slab, is_a: bool, warp_o: IntValue<'ctx>| -> R<IntValue<'ctx>> {
        let (hi, lo) = (kit.lshr(j, 1)?, kit.and(j, kit.i32c(1))?);
        let (o_off, k_off) = if is_a { (lo, hi) } else { (hi, lo) };
        let (row, chunk) = if slab.k_contig { (kit.add(kit.shl(o_off, 3)?, r)?, k_off) } else { (kit.add(kit.shl(k_off, 3)?, r)?, o_off) };
        let off = slab.offset(kit, row, chunk)?;
        if slab.k_contig {
            kit.add(off, kit.mul(warp_o, kit.i32c(slab.row_bytes() as i32))?)
        } else {
            kit.xor(off, kit.shl(warp_o, 1)?)
        }
    };
    let a_lane = lane_base(&plan.a, true, kit.mul(warp_m, kit.i32c(wm as i32))?)?;
    let b_lane = lane_base(&plan.b, false, kit.mul(warp_n, kit.i32c(wn as i32))?)?;
    let frag_addr = |k: &Kit<'ctx>, slab: &Slab, lane_off: IntValue<'ctx>, stage: IntValue<'ctx>, kk: u32, blk: u32| -> R<PointerValue<'ctx>> {
        let rb = slab.row_bytes();
        let (xor, add) = if slab.k_contig { (32 * kk, 16 * blk * rb) } else { (32 * blk, 16 * kk * rb) };
        let off = k.add(k.xor(lane_off, k.i32c(xor as i32))?, k.i32c((add + slab.base) as i32))?;
        k.sh_at(smem, k.add(stage, off)?)
    };

    // Accumulators acc[mi][ni][0..4] and two buffers of fragments (i32 registers).
    let zero = kit.f32c(0.0);
    let acc: Vec<PointerValue> = (0..mt * nt * 4).map(|_| kit.var_f(zero)).collect::<R<_>>()?;
    let fa: Vec<PointerValue> = (0..2 * mt * 4).map(|_| kit.var_i(kit.i32c(0))).collect::<R<_>>()?;
    let fb: Vec<PointerValue> = (0..2 * nt * 2).map(|_| kit.var_i(kit.i32c(0))).collect::<R<_>>()?;
    let load_frags = |k: &Kit<'ctx>, kk: u32, stage: IntValue<'ctx>, buf: usize| -> R<()> {
        for mi in 0..mt {
            let v = k.ldmatrix_x4(frag_addr(k, &plan.a, a_lane, stage, kk, mi as u32)?, !plan.a.k_contig)?;
            for (q, x) in v.iter().enumerate() {
                k.set(fa[(buf * mt + mi) * 4 + q], (*x).into())?;
            }
        }
        for p in 0..nt / 2 {
            let v = k.ldmatrix_x4(frag_addr(k, &plan.b, b_lane, stage, kk, p as u32)?, !plan.b.k_contig)?;
            for (q, x) in v.iter().enumerate() {
                // Registers 0, 1: n8 tile 2p; 2, 3: tile 2p + 1.
                k.set(fb[(buf * nt + 2 * p + q / 2) * 2 + q % 2], (*x).into())?;
            }
        }
        Ok(())
    };
    let mmas = |k: &Kit<'ctx>, buf: usize| -> R<()> {
        let i32t = k.i32t;
        for mi in 0..mt {
            let fr = |q: usize| k.get_i(fa[(buf * mt + mi) * 4 + q], i32t);
            let a = [fr(0)?, fr(1)?, fr(2)?, fr(3)?];
            for jn in 0..nt {
                // Serpentine over the n8 tiles (consecutive MMAs share a B fragment).
                let ni = if mi % 2 == 0 { jn } else { nt - 1 - jn };
                let b = [k.get_i(fb[(buf * nt + ni) * 2], i32t)?, k.get_i(fb[(buf * nt + ni) * 2 + 1], i32t)?];
                let at = (mi * nt + ni) * 4;
                let c = [k.get_f(acc[at])?, k.get_f(acc[at + 1])?, k.get_f(acc[at + 2])?, k.get_f(acc[at + 3])?];
                let d = k.mma(dt, a, b, c)?;
                for (q, v) in d.iter().enumerate() {
                    k.set(acc[at + q], (*v).into())?;
                }
            }
        }
        Ok(())
    };
    let next_stage = |k: &Kit<'ctx>, v: PointerValue<'ctx>| -> R<()> {
        let cur = k.get_i(v, k.i32t)?;
        let nxt = k.add(cur, k.i32c(plan.stage_bytes as i32))?;
        let wrap = k.icmp(IntPredicate::EQ, nxt, k.i32c((stages * plan.stage_bytes) as i32))?;
        k.set(v, k.select_i(wrap, k.i32c(0), nxt)?.into())
    };

    kit.cp_async_wait(stages - 2)?;
    kit.barrier()?;
    let read = kit.var_i(kit.i32c(0))?;
    let write = kit.var_i(kit.i32c(((stages - 1) * plan.stage_bytes) as i32))?;
    load_frags(kit, 0, kit.i32c(0), 0)?;
    kit.for_range(kit.i32c(0), ktiles, kit.i32c(1), |k, kt| {
        for kk in 0..steps {
            if kk == steps - 1 {
                k.cp_async_wait(stages - 2)?;
                k.barrier()?;
                next_stage(k, read)?;
            }
            let rs = k.get_i(read, k.i32t)?;
            load_frags(k, (kk + 1) % steps, rs, ((kk + 1) % 2) as usize)?;
            if kk == 0 {
                let nk = k.add(kt, k.i32c((stages - 1) as i32))?;
                let ws = k.get_i(write, k.i32t)?;
                k.if_then(k.icmp(IntPredicate::SLT, nk, ktiles)?, |k| issue(k, nk, ws))?;
                k.cp_async_commit()?;
                next_stage(k, write)?;
            }
            mmas(k, (kk % 2) as usize)?;
        }
        Ok(())
    })?;
    kit.cp_async_wait(0)?;

    let tile = MmaTile { mt, nt, wm, wn, warps_m: s.warps_m, bm: s.bm, bn: s.bn, threads, first_thread: 0, m0, pid_n, bz };
    mma_epilogue(kit, spec, plan, smem, &acc, &tile, &bases)
}
