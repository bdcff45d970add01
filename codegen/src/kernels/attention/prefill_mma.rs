//! Prefill attention on tensor cores: FlashAttention-2 with `mma.sync.m16n8k16`, `cp.async`
//! double buffered — the default for bf16/f16 prefill attention.
//!
//! Design notes: book/src/design/attention.md

use inkwell::context::Context;
use inkwell::values::{BasicValueEnum, FloatValue, IntValue, PointerValue};
use inkwell::{FloatPredicate, IntPredicate};
use sinter_ir::{DType, Family, LaunchPlan};

use super::analysis::{shared_kind, unsupported, Mask, Prefill, T4};
use super::prefill_wgmma::TmaAxes;
use super::schedule::{eligible, TcSchedule, TcSmem as Smem, WgSchedule, WS_CONSUMER_REGS, WS_PRODUCER_REGS, WS_STAGES};
use crate::kernels::matmul::kit::{Kit, SharedKind, R};
use crate::target::Target;

/// The launch plan of the tensor-core kernel for `p` with schedule `s`.
///
/// # Errors
/// [`crate::CodegenError::Unsupported`] when `p` is not [`eligible`], the schedule is invalid or
/// its shared memory exceeds the target's; LLVM errors otherwise.
pub(super) fn plan(p: &Prefill, target: &Target, s: &TcSchedule) -> R<LaunchPlan> {
    let fam = Family::Attention;
    s.check().map_err(|e| unsupported(&p.name, fam, e))?;
    eligible(p).map_err(|e| unsupported(&p.name, fam, e))?;
    let sm = Smem::new(s, p.d, p.dv);
    let shared = shared_kind(sm.total, target, &p.name, fam)?;
    let ctx = Context::create();
    let entry = format!("{}_attention", p.name);
    let (ptx, params) = Kit::build(&ctx, &entry, *target, p.n_inputs, p.n_buffers - p.n_inputs, &p.dims(), s.threads(), |kit| {
        kit.launch_bounds(s.threads());
        build(kit, p, s, &sm, shared, None)
    })?;
    Ok(p.launch_plan(target, (entry, ptx, params), s.block_q(), s.threads(), shared))
}

// ---- small emitters --------------------------------------------------------------------

fn or<'ctx>(k: &Kit<'ctx>, a: IntValue<'ctx>, b: IntValue<'ctx>) -> R<IntValue<'ctx>> {
    k.math(|kb| Ok(kb.b.build_or(a, b, "")?))
}

fn not<'ctx>(k: &Kit<'ctx>, a: IntValue<'ctx>) -> R<IntValue<'ctx>> {
    k.math(|kb| Ok(kb.b.build_not(a, "")?))
}

/// `ex2.approx.ftz.f32` (PTX ISA §9.7.3.23): one `MUFU.EX2`, a result below 2⁻¹²⁶ flushed to
/// 0 (without `.ftz` ptxas wraps each in a range check and two multiplications to keep
/// subnormal results). A flushed probability weighs under 2⁻¹²⁶ of its row's; a flushed
/// rescaling factor drops an accumulator whose maximum grew by more than 126 (log2 units).
fn ex2_ftz<'ctx>(k: &Kit<'ctx>, x: FloatValue<'ctx>) -> R<FloatValue<'ctx>> {
    k.math(|kb| Ok(kb.intrinsic_value("llvm.nvvm.ex2.approx.ftz", &[kb.cx.f32_type().into()], &[x.into()])?.into_float_value()))
}

/// Loads an integer vector of `n` i32s (or one i32) from shared memory at `ptr`, aligned to
/// its size.
fn load_i32s<'ctx>(k: &Kit<'ctx>, ptr: PointerValue<'ctx>, n: u32) -> R<Vec<IntValue<'ctx>>> {
    k.math(|kb| {
        let i32t = kb.cx.i32_type();
        if n == 1 {
            return Ok(vec![kb.load(i32t.into(), ptr, 4)?.into_int_value()]);
        }
        let v = kb.load(i32t.vec_type(n).into(), ptr, 4 * n)?.into_vector_value();
        (0..n).map(|i| Ok(kb.b.build_extract_element(v, i32t.const_int(u64::from(i), false), "")?.into_int_value())).collect()
    })
}

/// Stores i32s as one vector access (aligned to its size) at `ptr`.
fn store_i32s<'ctx>(k: &Kit<'ctx>, ptr: PointerValue<'ctx>, vals: &[IntValue<'ctx>]) -> R<()> {
    k.math(|kb| {
        let i32t = kb.cx.i32_type();
        if vals.len() == 1 {
            return kb.store(ptr, vals[0].into(), 4);
        }
        let mut v = i32t.vec_type(vals.len() as u32).get_poison();
        for (i, x) in vals.iter().enumerate() {
            v = kb.b.build_insert_element(v, *x, i32t.const_int(i as u64, false), "")?;
        }
        kb.store(ptr, BasicValueEnum::from(v), 4 * vals.len() as u32)
    })
}

/// P's power-of-two scale in the fp8 kernel (log2): probabilities are 2⁸·p ∈ [0, 256] before
/// they are rounded to e4m3 (max 448), so that e4m3's normal range (down to 2⁻⁶) covers
/// p ≥ 2⁻¹⁴ and its subnormals p ≥ 2⁻¹⁷, rather than 2⁻⁶ and 2⁻⁹ unscaled. The row sum l carries
/// the same factor, so it cancels exactly in acc / l.
const FP8_P_LOG2: u32 = 8;

/// Whether any of the `f8e4m3` bytes packed in the i32s `words` is NaN (`S.1111.111`; e4m3 has
/// no infinities), as an i1: a byte `b` is NaN when `(b & 0x7f) xor 0x7f` is zero, found
/// with the "has a zero byte" test `(y − 0x01010101) & ~y & 0x80808080` (no false positives:
/// `y`'s bytes are below 0x80).
fn any_nan_e4m3<'ctx>(k: &Kit<'ctx>, words: &[IntValue<'ctx>]) -> R<IntValue<'ctx>> {
    let mut acc = k.i32c(0);
    for &w in words {
        let y = k.xor(k.and(w, k.i32c(0x7f7f_7f7f))?, k.i32c(0x7f7f_7f7f))?;
        let z = k.and(k.and(k.sub(y, k.i32c(0x0101_0101))?, not(k, y)?)?, k.i32c(0x8080_8080u32 as i32))?;
        acc = or(k, acc, z)?;
    }
    k.icmp(IntPredicate::NE, acc, k.i32c(0))
}

/// Whether any lane of the warp has `flag` (i1) set, in every lane (`vote.sync.any`).
fn warp_any<'ctx>(k: &Kit<'ctx>, flag: IntValue<'ctx>) -> R<IntValue<'ctx>> {
    k.math(|kb| kb.vote_any(flag))
}

/// A mutable i32 (a prologue alloca).
fn var_i32<'ctx>(k: &Kit<'ctx>, init: IntValue<'ctx>) -> R<PointerValue<'ctx>> {
    k.var_i(init)
}

fn get_i32<'ctx>(k: &Kit<'ctx>, p: PointerValue<'ctx>) -> R<IntValue<'ctx>> {
    k.get_i(p, k.i32t)
}

/// Whether any of the 16-bit floats (exponent mask `e`) packed in the i32s `words` is ±inf or
/// NaN, as an i1: per word, a half is non-finite when `~w & e` is zero there, and a zero half
/// is found with the "has a zero lane" test `(x − 0x0001_0001) & ~x & 0x8000_8000` (no false
/// positives: `x`'s halves are multiples of the exponent's lowest bit and below 0x8000).
fn any_nonfinite<'ctx>(k: &Kit<'ctx>, words: &[IntValue<'ctx>], e: u32) -> R<IntValue<'ctx>> {
    let m = k.i32c((e | (e << 16)) as i32);
    let mut acc = k.i32c(0);
    for &w in words {
        let x = k.and(not(k, w)?, m)?;
        let y = k.sub(x, k.i32c(0x0001_0001))?;
        let z = k.and(k.and(y, not(k, x)?)?, k.i32c(0x8000_8000u32 as i32))?;
        acc = or(k, acc, z)?;
    }
    k.icmp(IntPredicate::NE, acc, k.i32c(0))
}

// ---- the kernel --------------------------------------------------------------------------

/// Per-thread row facts: for slab `mi` and half `h` (rows `g` and `g + 8`).
struct Rows<'ctx> {
    /// Key limit of the row (i32): keys `j < limit` are visible.
    limit: Vec<[IntValue<'ctx>; 2]>,
    /// Whether the row exists (< Sq).
    valid: Vec<[IntValue<'ctx>; 2]>,
    /// Query row index (i64).
    index: Vec<[IntValue<'ctx>; 2]>,
}

// Fragment coordinates index several parallel arrays at once: index loops read better here.
#[allow(clippy::too_many_lines, clippy::needless_range_loop)]
pub(super) fn build<'ctx>(kit: &Kit<'ctx>, p: &Prefill, s: &TcSchedule, sm: &Smem, shared: SharedKind, wg: Option<&WgSchedule>) -> R<()> {
    let dt = p.dtype;
    let (d, dv, bkv, mt) = (p.d, p.dv, s.block_kv, s.m_tiles as usize);
    let (bq, threads, rpw) = (s.block_q(), s.threads(), s.rows_per_warp());
    let n_nt = (bkv / 8) as usize; // n8 tiles of S
    let n_ov = (dv / 8) as usize; // n8 tiles of O
    let smem = kit.shared(shared, sm.total)?;
    if wg.is_some() {
        kit.align_dynamic_shared(1024)?;
    }
    let c32 = |v: u32| kit.i32c(v as i32);
    let ninf = kit.f32c(f64::NEG_INFINITY);
    let zero = kit.f32c(0.0);
    let exp_mask = if dt == DType::BF16 { 0x7f80 } else { 0x7c00 };
    // fp8 (the `wgmma` kernel only; see "fp8" in the module docs): q, k, v are e4m3 bytes,
    // 16 to a 16-byte chunk, 32 to a k-step; sq·sk is folded into the scores' scale, sv into
    // the output's.
    let fp8 = p.fp8.filter(|_| wg.is_some());
    let ein = if fp8.is_some() { DType::F8E4M3 } else { dt };
    let epc = if fp8.is_some() { 16 } else { 8 };
    let kstep = if fp8.is_some() { 32 } else { 16 };
    // Scores in the log2 domain: x = s·c (+ mask·log2 e). With a positive scale and no mask,
    // the row maximum is taken over the raw scores and `s·c − m` is one fma.
    let c = p.scale * std::f64::consts::LOG2_E;
    let fused = c > 0.0 && p.mask.is_none() && fp8.is_none();
    let (cf, v_scale) = match fp8 {
        Some(sc) => {
            let qk = kit.fmul(crate::kernels::matmul::fp8_scale(kit, sc[0])?, crate::kernels::matmul::fp8_scale(kit, sc[1])?)?;
            (kit.fmul(kit.f32c(c), qk)?, Some(crate::kernels::matmul::fp8_scale(kit, sc[2])?))
        }
        None => (kit.f32c(c), None),
    };

    // ---- indices -----------------------------------------------------------------------
    // With the producer warpgroup (warpgroup 0), the consumers' thread index counts from 0
    // after it: everything below but the producer's loop is the consumers'.
    let ws = wg.is_some_and(|w| w.producer);
    let pingpong = wg.is_some_and(|w| w.pingpong);
    let raw_tid = kit.sreg("tid.x")?;
    let tid = if ws { kit.sub(raw_tid, c32(128))? } else { raw_tid };
    let warp = kit.udiv(tid, c32(32))?;
    let lane = kit.urem(tid, c32(32))?;
    let g = kit.udiv(lane, c32(4))?;
    let t4 = kit.urem(lane, c32(4))?;
    // Causal CTAs in reverse order: the longest (bottom) tiles start first.
    let qtile = kit.zext64(kit.sub(kit.sub(kit.sreg("nctaid.x")?, c32(1))?, kit.sreg("ctaid.x")?)?)?;
    let h = kit.zext64(kit.sreg("ctaid.y")?)?;
    let b = kit.zext64(kit.sreg("ctaid.z")?)?;
    let hk = kit.udiv(h, kit.i64c(p.heads / p.kv_heads))?;
    let q0 = kit.mul(qtile, kit.i64c(i64::from(bq)))?;
    let (sq, skv) = (kit.dim(&p.sq)?, kit.dim(&p.skv)?);
    let skv32 = kit.trunc32(skv)?;
    let shift = kit.sub(skv, sq)?; // query i sees keys j ≤ i + shift
    let base = |t: &T4, x: IntValue<'ctx>, y: IntValue<'ctx>| -> R<IntValue<'ctx>> {
        let a = kit.add(kit.dim(&t.offset)?, kit.mul(x, kit.dim(&t.st[0])?)?)?;
        kit.add(a, kit.mul(y, kit.dim(&t.st[1])?)?)
    };
    let q_base = base(&p.q, b, h)?;
    let o_base = base(&p.out, b, h)?;
    let k_base = base(&p.k, b, hk)?;
    let v_base = base(&p.v, b, hk)?;
    let (q_ss, o_ss, k_ss, v_ss) = (kit.dim(&p.q.st[2])?, kit.dim(&p.out.st[2])?, kit.dim(&p.k.st[2])?, kit.dim(&p.v.st[2])?);
    let (q_ptr, k_ptr, v_ptr, o_ptr) = (kit.buf(p.q.buffer)?, kit.buf(p.k.buffer)?, kit.buf(p.v.buffer)?, kit.buf(p.out.buffer)?);
    // The key limit of query row i (i64): causal min(max(i + shift + 1, 0), Skv), else Skv.
    let limit_of = |k: &Kit<'ctx>, i: IntValue<'ctx>| -> R<IntValue<'ctx>> {
        if p.causal {
            k.smin(k.smax(k.add(k.add(i, shift)?, k.i64c(1))?, k.i64c(0))?, skv)
        } else {
            Ok(skv)
        }
    };
    // Keys the CTA needs: up to its last row's limit.
    let kv_end = {
        let last = kit.sub(kit.smin(kit.add(q0, kit.i64c(i64::from(bq)))?, sq)?, kit.i64c(1))?;
        limit_of(kit, last)?
    };
    let n_tiles = kit.trunc32(kit.udiv(kit.add(kit.smax(kv_end, kit.i64c(0))?, kit.i64c(i64::from(bkv - 1)))?, kit.i64c(i64::from(bkv)))?)?;
    // The warp's rows: [w0, w_end) ∩ [0, Sq); its key range [min_limit, warp_end).
    let w0 = kit.add(q0, kit.zext64(kit.mul(warp, c32(rpw))?)?)?;
    let w_last = kit.sub(kit.smin(kit.add(w0, kit.i64c(i64::from(rpw)))?, sq)?, kit.i64c(1))?;
    let has_rows = kit.icmp(IntPredicate::SLT, w0, sq)?;
    let min_limit = kit.trunc32(limit_of(kit, w0)?)?;
    let warp_end = kit.select_int(has_rows, kit.trunc32(limit_of(kit, w_last)?)?, c32(0))?;
    // The tiles a warp computes end at its last row's limit; a warpgroup's `wgmma` needs all
    // four warps, so there they end at the warpgroup's (64 rows from 64·(warp / 4)).
    let wg_id = kit.lshr(tid, 7)?;
    let grp_end = if wg.is_some() {
        let g0 = kit.add(q0, kit.zext64(kit.mul(wg_id, c32(64))?)?)?;
        let g_last = kit.sub(kit.smin(kit.add(g0, kit.i64c(64))?, sq)?, kit.i64c(1))?;
        kit.select_int(kit.icmp(IntPredicate::SLT, g0, sq)?, kit.trunc32(limit_of(kit, g_last)?)?, c32(0))?
    } else {
        warp_end
    };
    let rows = {
        let mut r = Rows { limit: Vec::new(), valid: Vec::new(), index: Vec::new() };
        for mi in 0..mt {
            let mut lim = Vec::new();
            let mut val = Vec::new();
            let mut idx = Vec::new();
            for hh in 0..2u32 {
                let i = kit.add(w0, kit.zext64(kit.add(g, c32(16 * mi as u32 + 8 * hh))?)?)?;
                lim.push(kit.trunc32(limit_of(kit, i)?)?);
                val.push(kit.icmp(IntPredicate::SLT, i, sq)?);
                idx.push(i);
            }
            r.limit.push([lim[0], lim[1]]);
            r.valid.push([val[0], val[1]]);
            r.index.push([idx[0], idx[1]]);
        }
        r
    };

    // ---- global → shared copies ----------------------------------------------------------
    // The byte offset (i32) of 16-byte chunk `col` of row `r` of a `rows`-row tile at
    // `sm_off`: padded rows of `ld` elements, or (wgmma) the 128-byte-swizzled K-major
    // canonical layout ([`Smem::swz`]).
    let sm_at = |k: &Kit<'ctx>, sm_off: IntValue<'ctx>, rows: u32, ld: u32, r: IntValue<'ctx>, col: IntValue<'ctx>| -> R<IntValue<'ctx>> {
        if sm.swz {
            let slab = k.mul(k.lshr(col, 3)?, c32(rows * 128))?;
            let phys = k.xor(k.and(col, c32(7))?, k.and(r, c32(7))?)?;
            k.add(sm_off, k.add(slab, k.add(k.mul(r, c32(128))?, k.shl(phys, 4)?)?)?)
        } else {
            k.add(sm_off, k.add(k.mul(r, c32(ld * 2))?, k.mul(col, c32(16))?)?)
        }
    };
    // `rows` rows of `chunks` 16-byte chunks: row r (< nvalid, i64, else zero-filled) starts
    // at element `row0 + r·rstride` of `gptr`, lands at byte `sm_off + r·ld·2`.
    #[allow(clippy::too_many_arguments)]
    let copy_rows = |k: &Kit<'ctx>, rows: u32, chunks: u32, ld: u32, sm_off: IntValue<'ctx>, gptr: PointerValue<'ctx>, row0: IntValue<'ctx>, rstride: IntValue<'ctx>, nvalid: IntValue<'ctx>| -> R<()> {
        let total = rows * chunks;
        if threads % chunks == 0 && (!sm.swz || (threads / chunks) % 8 == 0) {
            // Every copy of this thread is at column tid % chunks, rows tid / chunks + i·step.
            let step = threads / chunks;
            let r0 = k.udiv(tid, c32(chunks))?;
            let col = k.urem(tid, c32(chunks))?;
            let g0 = k.add(row0, k.add(k.mul(k.zext64(r0)?, rstride)?, k.zext64(k.mul(col, c32(epc))?)?)?)?;
            let s0 = k.sh_at(smem, sm_at(k, sm_off, rows, ld, r0, col)?)?;
            // Rows step·i apart: `step` is a multiple of 8 when swizzled (checked below), so
            // their swizzle is the first row's.
            let row_bytes = if sm.swz { 128 } else { ld * 2 };
            let left = k.sub(nvalid, k.zext64(r0)?)?; // copy i is valid when i·step < left
            // The source walks by `step` rows from one pointer (no per-copy offsets for LLVM
            // to hoist out of the tile loop into registers).
            let jump = k.mul(rstride, k.i64c(i64::from(step)))?;
            let mut src = k.gep_raw(ein, gptr, g0)?;
            for i in 0..rows.div_ceil(step) {
                if i > 0 {
                    src = k.gep_raw(ein, src, jump)?;
                }
                let go = |k: &Kit<'ctx>| -> R<()> {
                    let valid = k.icmp(IntPredicate::SLT, k.i64c(i64::from(i * step)), left)?;
                    let dst = k.sh_at(s0, c32(i * step * row_bytes))?;
                    k.cp_async_16(dst, src, k.select_int(valid, c32(16), c32(0))?)
                };
                if (i + 1) * step <= rows {
                    go(k)?;
                } else {
                    k.if_then(k.icmp(IntPredicate::ULT, k.add(r0, c32(i * step))?, c32(rows))?, go)?;
                }
            }
            return Ok(());
        }
        for i in 0..total.div_ceil(threads) {
            let e = k.add(tid, c32(i * threads))?;
            let go = |k: &Kit<'ctx>| -> R<()> {
                let r = k.udiv(e, c32(chunks))?;
                let col = k.urem(e, c32(chunks))?;
                let r64 = k.zext64(r)?;
                let gi = k.add(row0, k.add(k.mul(r64, rstride)?, k.zext64(k.mul(col, c32(epc))?)?)?)?;
                let valid = k.icmp(IntPredicate::SLT, r64, nvalid)?;
                let dst = k.sh_at(smem, sm_at(k, sm_off, rows, ld, r, col)?)?;
                k.cp_async_16(dst, k.gep_raw(ein, gptr, gi)?, k.select_int(valid, c32(16), c32(0))?)
            };
            if (i + 1) * threads <= total {
                go(k)?;
            } else {
                k.if_then(k.icmp(IntPredicate::ULT, e, c32(total))?, go)?;
            }
        }
        Ok(())
    };
    // K (or V) of tile t (i32) into its stage t & 1.
    let issue_k = |k: &Kit<'ctx>, t: IntValue<'ctx>| -> R<()> {
        let j0 = k.mul(k.zext64(t)?, k.i64c(i64::from(bkv)))?;
        let ks = k.add(c32(sm.k[0]), k.mul(k.and(t, c32(1))?, c32(sm.k[1] - sm.k[0]))?)?;
        copy_rows(k, bkv, d / epc, sm.ldk, ks, k_ptr, k.add(k_base, k.mul(j0, k_ss)?)?, k_ss, k.sub(skv, j0)?)
    };
    let issue_v = |k: &Kit<'ctx>, t: IntValue<'ctx>| -> R<()> {
        let j0 = k.mul(k.zext64(t)?, k.i64c(i64::from(bkv)))?;
        let vs = k.add(c32(sm.v[0]), k.mul(k.and(t, c32(1))?, c32(sm.v[1] - sm.v[0]))?)?;
        copy_rows(k, bkv, dv / epc, sm.ldv, vs, v_ptr, k.add(v_base, k.mul(j0, v_ss)?)?, v_ss, k.sub(skv, j0)?)
    };
    // K and V of tile t into stage t & 1.
    let issue_tile = |k: &Kit<'ctx>, t: IntValue<'ctx>| -> R<()> {
        let j0 = k.mul(k.zext64(t)?, k.i64c(i64::from(bkv)))?;
        let stage = k.and(t, c32(1))?;
        let nvalid = k.sub(skv, j0)?;
        let ks = k.add(c32(sm.k[0]), k.mul(stage, c32(sm.k[1] - sm.k[0]))?)?;
        let vs = k.add(c32(sm.v[0]), k.mul(stage, c32(sm.v[1] - sm.v[0]))?)?;
        copy_rows(k, bkv, d / epc, sm.ldk, ks, k_ptr, k.add(k_base, k.mul(j0, k_ss)?)?, k_ss, nvalid)?;
        copy_rows(k, bkv, dv / epc, sm.ldv, vs, v_ptr, k.add(v_base, k.mul(j0, v_ss)?)?, v_ss, nvalid)
    };
    let overlap = wg.is_some_and(|w| w.overlap);

    // ---- prologue: Q and tile 0 ------------------------------------------------------------
    // The warp-specialised kernel's mbarriers (static shared memory, 8 bytes each): full[i]
    // (arrival count 1: the producer's `arrive.expect_tx`, then the TMA's bytes) and empty[i]
    // (one arrival from each consumer warp) of stage i, and Q's full barrier.
    let bars = if ws { Some(kit.mbarriers(2 * WS_STAGES + 1)?) } else { None };
    let full = |k: &Kit<'ctx>, bars: IntValue<'ctx>, st: IntValue<'ctx>| k.add(bars, k.shl(st, 3)?);
    let empty = |k: &Kit<'ctx>, bars: IntValue<'ctx>, st: IntValue<'ctx>| k.add(bars, k.shl(k.add(st, c32(WS_STAGES))?, 3)?);
    // Stage and phase parity of key tile t (i32): tile t fills stage t mod S in round t / S.
    let ring = |k: &Kit<'ctx>, t: IntValue<'ctx>| -> R<(IntValue<'ctx>, IntValue<'ctx>)> { Ok((k.urem(t, c32(WS_STAGES))?, k.and(k.udiv(t, c32(WS_STAGES))?, c32(1))?)) };
    if let (Some(bars), Some(w)) = (bars, wg.filter(|w| w.producer)) {
        let q_full = kit.add(bars, c32(16 * WS_STAGES))?;
        kit.if_then(kit.icmp(IntPredicate::EQ, raw_tid, c32(0))?, |k| {
            for i in 0..WS_STAGES {
                k.mbarrier_init(full(k, bars, c32(i))?, 1)?;
                k.mbarrier_init(empty(k, bars, c32(i))?, 4 * w.warpgroups)?;
            }
            k.mbarrier_init(q_full, 1)?;
            k.fence_mbarrier_init()
        })?;
        // The kernel's one CTA-wide barrier: the mbarriers initialised, for every role.
        kit.barrier()?;
        // The producer: its registers to the pool, then thread 0 issues every TMA copy —
        // Q once, then each key tile's K and V into stage t mod S once the consumers have
        // freed it (its empty barrier's previous phase: on the first round, a fresh barrier's
        // phase −1 counts as complete, so the stages start free) — and the warpgroup leaves.
        // It walks exactly the consumers' `n_tiles` tiles (the same expression of the CTA's
        // indices), so every wait on either side has its arrival.
        kit.return_if(kit.icmp(IntPredicate::ULT, raw_tid, c32(128))?, |k| {
            k.setmaxnreg(false, WS_PRODUCER_REGS)?;
            k.if_then(k.icmp(IntPredicate::EQ, raw_tid, c32(0))?, |k| {
                let sbase = k.smem_addr(smem)?;
                let (hq, bz) = (k.sreg("ctaid.y")?, k.sreg("ctaid.z")?);
                let hkv = k.udiv(hq, c32((p.heads / p.kv_heads) as u32))?;
                let axes = |t: &T4, h: IntValue<'ctx>| -> Vec<IntValue<'ctx>> {
                    let a = TmaAxes::of(t);
                    let mut c = Vec::new();
                    if a.head {
                        c.push(h);
                    }
                    if a.batch {
                        c.push(bz);
                    }
                    c
                };
                let (q_hb, k_hb, v_hb) = (axes(&p.q, hq), axes(&p.k, hkv), axes(&p.v, hkv));
                // A tile of `width` columns at shared offset `at`: one box per 64-column slab
                // of `rows` rows, rows from `row0` (i32).
                let boxes = |k: &Kit<'ctx>, map: usize, at: IntValue<'ctx>, width: u32, rows: u32, row0: IntValue<'ctx>, hb: &[IntValue<'ctx>], bar: IntValue<'ctx>| -> R<()> {
                    for slab in 0..width / 64 {
                        let mut c = vec![c32(64 * slab), row0];
                        c.extend_from_slice(hb);
                        k.tma_load(k.add(sbase, k.add(at, c32(slab * rows * 128))?)?, map, &c, bar)?;
                    }
                    Ok(())
                };
                k.mbarrier_arrive_expect_tx(q_full, bq * d * 2)?;
                boxes(k, 0, c32(0), d, bq, k.trunc32(q0)?, &q_hb, q_full)?;
                k.for_range(c32(0), n_tiles, c32(1), |k, t| {
                    let (st, ph) = ring(k, t)?;
                    k.mbarrier_wait_parity(empty(k, bars, st)?, k.xor(ph, c32(1))?)?;
                    let bar = full(k, bars, st)?;
                    k.mbarrier_arrive_expect_tx(bar, bkv * (d + dv) * 2)?;
                    let k_sm = k.add(c32(sm.k[0]), k.mul(st, c32(sm.k[1] - sm.k[0]))?)?;
                    let v_sm = k.add(c32(sm.v[0]), k.mul(st, c32(sm.v[1] - sm.v[0]))?)?;
                    let j0 = k.mul(t, c32(bkv))?;
                    boxes(k, 1, k_sm, d, bkv, j0, &k_hb, bar)?;
                    boxes(k, 2, v_sm, dv, bkv, j0, &v_hb, bar)
                })
            })
        })?;
        kit.setmaxnreg(true, WS_CONSUMER_REGS)?;
        // Q landed (waited for even without key tiles: no copy is left in flight at exit).
        kit.mbarrier_wait_parity(q_full, c32(0))?;
    } else {
        copy_rows(kit, bq, d / epc, sm.ldq, c32(0), q_ptr, kit.add(q_base, kit.mul(q0, q_ss)?)?, q_ss, kit.sub(sq, q0)?)?;
        // (The overlapped `wgmma` loop takes V one tile after K: V_0 in its first iteration.)
        kit.if_then(kit.icmp(IntPredicate::SGT, n_tiles, c32(0))?, |k| if overlap { issue_k(k, c32(0)) } else { issue_tile(k, c32(0)) })?;
        kit.cp_async_commit()?;
        kit.cp_async_wait(0)?;
        if wg.is_some() {
            // The copies (generic proxy) before the `wgmma`s' reads (async proxy), §9.7.15.1.
            kit.fence_proxy_async()?;
        }
        kit.barrier()?;
    }
    // Matrix descriptors (§9.7.15.5.1, "Matrix Descriptor Format"): start address >> 4 in bits
    // 0–13, leading byte offset >> 4 in 16–29, stride byte offset >> 4 in 32–45, the swizzle
    // mode in 62–63 (1: 128 bytes). Every operand tile here is stored as 128-byte rows (64
    // elements of its contiguous axis) XOR-swizzled by `row mod 8` in 1024-byte atoms of 8
    // rows, "slabs" of 64 columns one after the other ([`Smem::swz`]).
    // - Q [q, d] (A, K-major) and K [kv, d] (B, K-major): exactly the GEMM's operands
    //   (`matmul::build_wgmma`): leading byte offset unused for swizzled K-major layouts (1),
    //   stride byte offset 1024 (the next 8 rows of M or N); a k16 step is +32 bytes inside
    //   the 128-byte row, the next 64 columns of d the next slab.
    // - V [kv, d] as B of P·V ([K = kv, N = d], N contiguous: **MN-major**, `imm-trans-b` 1).
    //   The MN-major 128-byte-swizzle canonical layout (§9.7.15.5.1; CUTLASS
    //   `make_gmma_desc<Major::MN>`: `Swizzle<3,4,3> o ((T,8,m),(8,k)) : ((1,T,LBO),(8T,SBO))`,
    //   T = 8 elements) is 64 contiguous N elements per 128-byte row, 8 rows of K per 1024-byte
    //   atom: the same bytes as a slab. The **stride** byte offset steps K by 8 rows (1024);
    //   the **leading** byte offset steps N by 64 columns (one atom along MN), i.e. the slab
    //   stride `block_kv · 128` — used only by an `n` over 64 (Dv = 128 in one `wgmma`; the
    //   `pv_split` schedules issue one n64 per slab and never use it). A k16 step is 16 rows:
    //   +2048 bytes, atom-aligned.
    let sbase = kit.smem_addr(smem)?;
    let k_major = (1i64 << 16) | (64i64 << 32) | (1i64 << 62);
    let mn_major = (i64::from(bkv * 128 / 16) << 16) | (64i64 << 32) | (1i64 << 62);
    let desc = |k: &Kit<'ctx>, addr: IntValue<'ctx>, fixed: i64| -> R<IntValue<'ctx>> {
        let enc = k.lshr(k.and(addr, c32(0x3FFFF))?, 4)?;
        k.add(k.i64c(fixed), k.zext64(enc)?)
    };
    // The warpgroup's 64 rows of Q (slab 0).
    let q_wg = kit.add(sbase, kit.mul(wg_id, c32(64 * 128))?)?;
    // ldmatrix lane offsets (bytes). A (Q, row-major 16×16): lane l → row l % 16, column
    // chunk l / 16. B from K ([key, d], two n8 tiles): row (l % 8) + 8·(l / 16), chunk
    // (l / 8) % 2. B from V ([key, d], transposed, two n8 tiles): row (l % 8) + 8·((l / 8) % 2),
    // chunk l / 16.
    let l8 = kit.urem(lane, c32(8))?;
    let l16 = kit.udiv(lane, c32(16))?;
    let l8b = kit.urem(kit.udiv(lane, c32(8))?, c32(2))?;
    let q_lane = kit.add(kit.mul(kit.add(kit.mul(warp, c32(rpw))?, kit.urem(lane, c32(16))?)?, c32(sm.ldq * 2))?, kit.mul(l16, c32(16))?)?;
    let k_lane = kit.add(kit.mul(kit.add(l8, kit.mul(l16, c32(8))?)?, c32(sm.ldk * 2))?, kit.mul(l8b, c32(16))?)?;
    let v_lane = kit.add(kit.mul(kit.add(l8, kit.mul(l8b, c32(8))?)?, c32(sm.ldv * 2))?, kit.mul(l16, c32(16))?)?;
    let q_ptr_sm = kit.sh_at(smem, q_lane)?;
    let q_frag = |k: &Kit<'ctx>, mi: usize, ks: u32| -> R<[IntValue<'ctx>; 4]> {
        k.ldmatrix_x4(k.sh_at(q_ptr_sm, c32(16 * mi as u32 * sm.ldq * 2 + ks * 32))?, false)
    };
    let qf: Vec<Vec<[IntValue<'ctx>; 4]>> = if s.q_in_regs {
        (0..mt).map(|mi| (0..d / 16).map(|ks| q_frag(kit, mi, ks)).collect::<R<Vec<_>>>()).collect::<R<_>>()?
    } else {
        Vec::new()
    };

    // ---- per-thread state ------------------------------------------------------------------
    let m: Vec<[PointerValue<'ctx>; 2]> = (0..mt).map(|_| Ok([kit.var_f(ninf)?, kit.var_f(ninf)?])).collect::<R<_>>()?;
    let l: Vec<[PointerValue<'ctx>; 2]> = (0..mt).map(|_| Ok([kit.var_f(zero)?, kit.var_f(zero)?])).collect::<R<_>>()?;
    // acc[mi][n][e]: O(row g + 8·(e / 2), column 8n + 2·t4 + e % 2) of slab mi.
    let acc: Vec<Vec<[PointerValue<'ctx>; 4]>> =
        (0..mt).map(|_| (0..n_ov).map(|_| Ok([kit.var_f(zero)?, kit.var_f(zero)?, kit.var_f(zero)?, kit.var_f(zero)?])).collect::<R<Vec<_>>>()).collect::<R<_>>()?;
    // Scores of the current tile, same layout as acc over the tile's keys.
    let sv: Vec<Vec<[PointerValue<'ctx>; 4]>> =
        (0..mt).map(|_| (0..n_nt).map(|_| Ok([kit.var_f(zero)?, kit.var_f(zero)?, kit.var_f(zero)?, kit.var_f(zero)?])).collect::<R<Vec<_>>>()).collect::<R<_>>()?;
    // While some row of the warp has seen only −inf, the interpreter may skip 16-key groups:
    // first[mi][h] is the key (tile-relative) of the row's first group it multiplies.
    let maybe_skipping = var_i32(kit, c32(1))?;
    let (lo_var, slow_var) = (var_i32(kit, c32(0))?, var_i32(kit, c32(0))?);
    let first: Vec<[PointerValue<'ctx>; 2]> = (0..mt).map(|_| Ok([var_i32(kit, c32(0))?, var_i32(kit, c32(0))?])).collect::<R<_>>()?;
    let mask_rows: Vec<[Option<IntValue<'ctx>>; 2]> = match &p.mask {
        Some(mk) => {
            let mb = base_mask(kit, mk, b, h)?;
            (0..mt)
                .map(|mi| -> R<[Option<IntValue<'ctx>>; 2]> {
                    let at = |hh: usize| -> R<Option<IntValue<'ctx>>> {
                        let i = kit.smin(rows.index[mi][hh], kit.sub(sq, kit.i64c(1))?)?;
                        Ok(Some(kit.add(mb, kit.mul(i, kit.dim(&mk.st[2])?)?)?))
                    };
                    Ok([at(0)?, at(1)?])
                })
                .collect::<R<_>>()?
        }
        None => vec![[None, None]; mt],
    };

    // ---- the steps of a key tile -------------------------------------------------------------
    // The K and V stages of tile t (byte offsets from the shared base).
    let stage_of = |k: &Kit<'ctx>, t: IntValue<'ctx>| -> R<(IntValue<'ctx>, IntValue<'ctx>)> {
        let stage = k.and(t, c32(1))?;
        Ok((k.add(c32(sm.k[0]), k.mul(stage, c32(sm.k[1] - sm.k[0]))?)?, k.add(c32(sm.v[0]), k.mul(stage, c32(sm.v[1] - sm.v[0]))?)?))
    };
    // S = Q·Kᵀ on `wgmma` (K at `k_sm`): m64n{bkv}k16 per 16 columns of d, A = the
    // warpgroup's Q rows, B = the K tile, as one group, `in_flight` groups left pending;
    // this warp's 16 rows come back in the m16n8 C layout of each n8 tile (`bkv / 2` floats).
    let qk_wg = |k: &Kit<'ctx>, k_sm: IntValue<'ctx>, in_flight: u32| -> R<Vec<FloatValue<'ctx>>> {
        let k_addr = k.add(sbase, k_sm)?;
        let descs = (0..d / kstep)
            .map(|ks| {
                let (slab, kb) = (ks / 4, (ks % 4) * 32);
                Ok((desc(k, k.add(q_wg, c32(slab * bq * 128 + kb))?, k_major)?, desc(k, k.add(k_addr, c32(slab * bkv * 128 + kb))?, k_major)?))
            })
            .collect::<R<Vec<_>>>()?;
        k.wgmma_k_tile(ein, bkv, &vec![zero; (bkv / 2) as usize], &descs, in_flight)
    };
    // The scores of the tile at key j0 (`sacc`, raw products) into `sv`, in the log2 domain;
    // masked; and the skipping state (`first`, `lo_var`, `maybe_skipping`) of this tile.
    let scores = |k: &Kit<'ctx>, j0: IntValue<'ctx>, sacc: &[Vec<[FloatValue<'ctx>; 4]>]| -> R<()> {
        for mi in 0..mt {
            for n in 0..n_nt {
                for e in 0..4 {
                    let v = if fused { sacc[mi][n][e] } else { k.fmul(sacc[mi][n][e], cf)? };
                    k.set(sv[mi][n][e], v.into())?;
                }
            }
        }

        // Mask keys past each row's limit (and add the additive mask) where the tile
        // crosses a row's limit.
        let col0 = k.add(j0, k.mul(t4, c32(2))?)?;
        let crosses = k.icmp(IntPredicate::SGT, k.add(j0, c32(bkv))?, min_limit)?;
        let crosses = if p.mask.is_some() { k.bool_c(true) } else { crosses };
        k.if_then(crosses, |k| {
            for mi in 0..mt {
                for n in 0..n_nt {
                    for e in 0..4 {
                        let hh = e / 2;
                        let col = k.add(col0, c32(8 * n as u32 + (e % 2) as u32))?;
                        let vis = k.icmp(IntPredicate::SLT, col, rows.limit[mi][hh])?;
                        let mut x = k.get_f(sv[mi][n][e])?;
                        if let (Some(mk), Some(mrow)) = (&p.mask, mask_rows[mi][hh]) {
                            // Row clamped below Sq, key below Skv: always in bounds, no branch.
                            let j = k.select_int(vis, col, c32(0))?;
                            let idx = k.add(mrow, k.mul(k.zext64(j)?, k.dim(&mk.st[3])?)?)?;
                            let mv = k.load_vec(mk.dtype, k.buf(mk.buffer)?, idx, 1)?[0];
                            x = k.fma(mv, k.f32c(std::f64::consts::LOG2_E), x)?;
                        }
                        k.set(sv[mi][n][e], k.select_f(vis, x, ninf)?.into())?;
                    }
                }
            }
            Ok(())
        })?;

        // Rows that have seen only −inf: the interpreter skips their leading 16-key groups
        // whose scores are all −inf. Count them (first[mi][h]), and note whether any row
        // skips a group here and whether any is still without a score after this tile.
        let n_grp = n_nt / 2;
        k.set(lo_var, k.smax(min_limit, j0)?.into())?;
        for f in first.iter().flatten() {
            k.set(*f, c32(0).into())?;
        }
        k.if_then(k.icmp(IntPredicate::NE, get_i32(k, maybe_skipping)?, c32(0))?, |k| {
            let mut skip = k.bool_c(false);
            let mut dead = k.bool_c(false);
            for mi in 0..mt {
                for hh in 0..2 {
                    let mut live = k.fcmp(FloatPredicate::UNE, k.get_f(m[mi][hh])?, ninf)?;
                    let mut count = c32(0);
                    for grp in 0..n_grp {
                        let mut gm = ninf;
                        for n in [2 * grp, 2 * grp + 1] {
                            for e in [2 * hh, 2 * hh + 1] {
                                gm = k.max_nan(gm, k.get_f(sv[mi][n][e])?)?;
                            }
                        }
                        gm = k.max_nan(gm, k.shfl_xor(gm, 1)?)?;
                        gm = k.max_nan(gm, k.shfl_xor(gm, 2)?)?;
                        live = or(k, live, k.fcmp(FloatPredicate::UNE, gm, ninf)?)?;
                        count = k.add(count, k.select_int(live, c32(0), c32(16))?)?;
                    }
                    k.set(first[mi][hh], count.into())?;
                    skip = or(k, skip, k.icmp(IntPredicate::NE, count, c32(0))?)?;
                    dead = or(k, dead, k.icmp(IntPredicate::EQ, count, c32(16 * n_grp as u32))?)?;
                }
            }
            let skip = warp_any(k, skip)?;
            let dead = warp_any(k, dead)?;
            k.set(maybe_skipping, k.select_int(dead, c32(1), c32(0))?.into())?;
            k.if_then(skip, |k| k.set(lo_var, j0.into()))
        })
    };
    // Online softmax per row of `sv`: updates m and l, and gives P (pf, the layout of `sv`),
    // whether any row of the warp has a new maximum, and each row's rescaling factor α (the
    // accumulator is not touched here).
    #[allow(clippy::type_complexity)]
    let softmax = |k: &Kit<'ctx>| -> R<(Vec<Vec<[FloatValue<'ctx>; 4]>>, IntValue<'ctx>, Vec<(usize, usize, FloatValue<'ctx>)>)> {
        let mut pf: Vec<Vec<[FloatValue<'ctx>; 4]>> = vec![vec![[zero; 4]; n_nt]; mt];
        let mut rescale = k.bool_c(false);
        let mut alphas = Vec::new();
        for mi in 0..mt {
            for hh in 0..2 {
                let xs: Vec<FloatValue<'ctx>> = (0..n_nt).flat_map(|n| [2 * hh, 2 * hh + 1].map(|e| (n, e))).map(|(n, e)| k.get_f(sv[mi][n][e])).collect::<R<_>>()?;
                let mut mx = xs[0];
                for &x in &xs[1..] {
                    mx = k.max_nan(mx, x)?;
                }
                mx = k.max_nan(mx, k.shfl_xor(mx, 1)?)?;
                mx = k.max_nan(mx, k.shfl_xor(mx, 2)?)?;
                let mx = if fused { k.fmul(mx, cf)? } else { mx };
                let mo = k.get_f(m[mi][hh])?;
                let mn = k.max_nan(mo, mx)?;
                let none = k.fcmp(FloatPredicate::OEQ, mn, ninf)?;
                let mu = k.select_f(none, zero, mn)?;
                let alpha = ex2_ftz(k, k.fsub(mo, mu)?)?;
                let neg = k.fsub(zero, mu)?;
                // fp8: p·2⁸ (P's e4m3 rounding keeps 2⁻¹⁷ of the row maximum, not 2⁻⁹; l
                // carries the same factor, so O = acc / l is unchanged).
                let mu_p = if fp8.is_some() { k.fsub(mu, k.f32c(f64::from(FP8_P_LOG2)))? } else { mu };
                let mut sum = zero;
                for (i, &x) in xs.iter().enumerate() {
                    let arg = if fused { k.fma(x, cf, neg)? } else { k.fsub(x, mu_p)? };
                    let pv = ex2_ftz(k, arg)?;
                    sum = if i == 0 { pv } else { k.fadd(sum, pv)? };
                    pf[mi][i / 2][2 * hh + i % 2] = pv;
                }
                k.set(l[mi][hh], k.fma(k.get_f(l[mi][hh])?, alpha, sum)?.into())?;
                k.set(m[mi][hh], mn.into())?;
                rescale = or(k, rescale, k.fcmp(FloatPredicate::UNE, alpha, k.f32c(1.0))?)?;
                alphas.push((mi, hh, alpha));
            }
        }
        Ok((pf, rescale, alphas))
    };
    // P as A fragments (pa[mi][kk]: keys 16kk..16kk+16), rounded to bf16/f16 pairs.
    let pack = |k: &Kit<'ctx>, pf: &[Vec<[FloatValue<'ctx>; 4]>]| -> R<Vec<Vec<[IntValue<'ctx>; 4]>>> {
        if fp8.is_some() {
            // The e4m3 A fragment of k-step kk (32 keys): register r holds row g (r even) or
            // g + 8 (r odd) at k positions 4·t4 + 16·(r / 2) .. +3, which Vᵀ's transposition
            // assigns the keys this lane's S accumulators hold: 2·t4, 2·t4 + 1 of n8 tiles
            // 4kk + 2·(r / 2) and 4kk + 2·(r / 2) + 1 (see `vt_key`). No shuffles.
            return (0..mt)
                .map(|mi| {
                    (0..n_nt / 4)
                        .map(|kk| {
                            let pk = |n: usize, e: usize| k.pack_e4m3x4([pf[mi][n][e], pf[mi][n][e + 1], pf[mi][n + 1][e], pf[mi][n + 1][e + 1]]);
                            Ok([pk(4 * kk, 0)?, pk(4 * kk, 2)?, pk(4 * kk + 2, 0)?, pk(4 * kk + 2, 2)?])
                        })
                        .collect::<R<Vec<_>>>()
                })
                .collect::<R<_>>();
        }
        (0..mt)
            .map(|mi| {
                (0..n_nt / 2)
                    .map(|kk| {
                        let pk = |n: usize, e: usize| k.math(|kb| kb.pack_x2(dt, pf[mi][n][e], pf[mi][n][e + 1]));
                        Ok([pk(2 * kk, 0)?, pk(2 * kk, 2)?, pk(2 * kk + 1, 0)?, pk(2 * kk + 1, 2)?])
                    })
                    .collect::<R<Vec<_>>>()
            })
            .collect::<R<_>>()
    };
    // acc ·= α, skipped when no row of the warp has a new maximum (α = 1 exactly).
    let rescale_acc = |k: &Kit<'ctx>, rescale: IntValue<'ctx>, alphas: &[(usize, usize, FloatValue<'ctx>)]| -> R<()> {
        k.if_then(warp_any(k, rescale)?, |k| {
            for &(mi, hh, alpha) in alphas {
                for a in &acc[mi] {
                    for e in [2 * hh, 2 * hh + 1] {
                        k.set(a[e], k.fmul(k.get_f(a[e])?, alpha)?.into())?;
                    }
                }
            }
            Ok(())
        })
    };
    // Products the interpreter does not make (see the module docs) in the tile at key j0
    // (V at `v_sm`), after its `scores`: keys at or past the warp's first row's limit, and
    // the groups some row skips. Whether V holds a non-finite value there, so that this
    // tile's P·V must go the CUDA-core way (the warpgroup's decision with `wgmma`).
    let decide_slow = |k: &Kit<'ctx>, j0: IntValue<'ctx>, v_sm: IntValue<'ctx>| -> R<IntValue<'ctx>> {
        let hi = k.smin(k.add(j0, c32(bkv))?, skv32)?;
        k.set(slow_var, c32(0).into())?;
        let lo = get_i32(k, lo_var)?;
        k.if_then(k.icmp(IntPredicate::SLT, lo, hi)?, |k| {
            // Lanes scan 16-byte chunks of V rows lo..hi (tile-relative rows lo − j0..).
            let cv = dv / epc;
            let r0 = k.sub(lo, j0)?;
            let total = k.mul(k.sub(hi, lo)?, c32(cv))?;
            let found = var_i32(k, c32(0))?;
            k.for_range(lane, total, c32(32), |k, e| {
                let r = k.add(r0, k.udiv(e, c32(cv))?)?;
                let col = k.urem(e, c32(cv))?;
                let at = sm_at(k, v_sm, bkv, sm.ldv, r, col)?;
                let words = load_i32s(k, k.sh_at(smem, at)?, 4)?;
                let bad = if fp8.is_some() { any_nan_e4m3(k, &words)? } else { any_nonfinite(k, &words, exp_mask)? };
                k.if_then(bad, |k| k.set(found, c32(1).into()))
            })?;
            if wg.is_some() {
                return k.set(slow_var, get_i32(k, found)?.into());
            }
            let any = warp_any(k, k.icmp(IntPredicate::NE, get_i32(k, found)?, c32(0))?)?;
            k.set(slow_var, k.select_int(any, c32(1), c32(0))?.into())
        })?;
        let slow = k.icmp(IntPredicate::NE, get_i32(k, slow_var)?, c32(0))?;
        // The warpgroup decides together (its P·V is one `wgmma`): named barrier 1 + wg.
        if wg.is_some() {
            k.bar_red_or(k.add(wg_id, c32(1))?, 128, slow)
        } else {
            Ok(slow)
        }
    };
    // CUDA-core P·V of the tile at key j0 (V at `v_sm`, P in `pa`), exactly the
    // interpreter's products: per row, keys below its limit from its first multiplied group on.
    // fp8: P is the e4m3 fragments (`pack`), read back as f16 pairs in the mma.sync A layout
    // of 16-key steps (exactly the values the `wgmma` multiplies), and V is e4m3 bytes.
    let pdt = if fp8.is_some() { DType::F16 } else { dt };
    let pv_slow = |k: &Kit<'ctx>, j0: IntValue<'ctx>, v_sm: IntValue<'ctx>, pa: &[Vec<[IntValue<'ctx>; 4]>]| -> R<()> {
        let pa16: Vec<Vec<[IntValue<'ctx>; 4]>>;
        let pa = if fp8.is_some() {
            // Register r of 32-key step kk holds the pairs (n8 tile 4kk + 2·(r / 2), rows
            // g + 8·(r % 2)) in its low half and (tile 4kk + 2·(r / 2) + 1) in its high half.
            let lo = |k: &Kit<'ctx>, w: IntValue<'ctx>| k.e4m3x2_to_f16x2(w);
            let hi = |k: &Kit<'ctx>, w: IntValue<'ctx>| k.e4m3x2_to_f16x2(k.lshr(w, 16)?);
            pa16 = pa
                .iter()
                .map(|steps| {
                    let mut v = Vec::new();
                    for f in steps {
                        v.push([lo(k, f[0])?, lo(k, f[1])?, hi(k, f[0])?, hi(k, f[1])?]);
                        v.push([lo(k, f[2])?, lo(k, f[3])?, hi(k, f[2])?, hi(k, f[3])?]);
                    }
                    Ok(v)
                })
                .collect::<R<_>>()?;
            &pa16[..]
        } else {
            pa
        };
        let first: Vec<[IntValue<'ctx>; 2]> = first.iter().map(|f| Ok([get_i32(k, f[0])?, get_i32(k, f[1])?])).collect::<R<_>>()?;
        // P (rounded as the mma would see it) to the warp's scratch rows: row
        // 16mi + 8h + g of the warp, keys as in the A fragments.
        let prow0 = k.add(c32(sm.p), k.mul(k.add(k.mul(warp, c32(rpw))?, g)?, c32(sm.ldp * 2))?)?;
        let pst = k.sh_at(smem, k.add(prow0, k.mul(t4, c32(4))?)?)?;
        for mi in 0..mt {
            for (kk, frag) in pa[mi].iter().enumerate() {
                for (r, &word) in frag.iter().enumerate() {
                    let off = (16 * mi as u32 + 8 * (r % 2) as u32) * sm.ldp * 2 + (16 * kk as u32 + 8 * (r / 2) as u32) * 2;
                    store_i32s(k, k.sh_at(pst, c32(off))?, &[word])?;
                }
            }
        }
        k.warp_sync()?;
        k.for_range(c32(0), c32(bkv), c32(1), |k, jj| {
            let j = k.add(j0, jj)?;
            // V(j, 8n + 2·t4 ..) at constant offsets from one pointer.
            let vs: Vec<Vec<FloatValue<'ctx>>> = if fp8.is_some() {
                // Bytes 8·(n % 2) + 2·t4 of chunk n / 2 of V row jj: columns 8n + 2·t4 + {0, 1}.
                (0..n_ov)
                    .map(|n| {
                        let at = k.add(sm_at(k, v_sm, bkv, sm.ldv, jj, c32(n as u32 / 2))?, k.add(k.mul(t4, c32(2))?, c32(8 * (n as u32 % 2)))?)?;
                        let ptr = k.sh_at(smem, at)?;
                        let pair = k.math(|kb| Ok(kb.load(kb.cx.i16_type().into(), ptr, 2)?.into_int_value()))?;
                        Ok(k.e4m3x2_to_f32(k.math(|kb| Ok(kb.b.build_int_z_extend(pair, kb.cx.i32_type(), "")?))?)?.to_vec())
                    })
                    .collect::<R<_>>()?
            } else if sm.swz {
                (0..n_ov).map(|n| k.sh_load(dt, k.sh_at(smem, k.add(sm_at(k, v_sm, bkv, sm.ldv, jj, c32(n as u32))?, k.mul(t4, c32(4))?)?)?, 2)).collect::<R<_>>()?
            } else {
                let vrow = k.sh_at(smem, k.add(k.add(v_sm, k.mul(jj, c32(sm.ldv * 2))?)?, k.mul(t4, c32(4))?)?)?;
                (0..n_ov).map(|n| k.sh_load(dt, k.sh_at(vrow, c32(16 * n as u32))?, 2)).collect::<R<_>>()?
            };
            let pcol = k.sh_at(smem, k.add(prow0, k.mul(jj, c32(2))?)?)?;
            for mi in 0..mt {
                for hh in 0..2 {
                    let pj = k.sh_load(pdt, k.sh_at(pcol, c32((16 * mi as u32 + 8 * hh as u32) * sm.ldp * 2))?, 1)?[0];
                    let made = k.and(k.icmp(IntPredicate::SLT, j, rows.limit[mi][hh])?, k.icmp(IntPredicate::SGE, jj, first[mi][hh])?)?;
                    for (a, v) in acc[mi].iter().zip(&vs) {
                        for e in 0..2 {
                            let old = k.get_f(a[2 * hh + e])?;
                            let new = k.fma(pj, v[e], old)?;
                            k.set(a[2 * hh + e], k.select_f(made, new, old)?.into())?;
                        }
                    }
                }
            }
            Ok(())
        })?;
        k.warp_sync()
    };
    // fp8: the Vᵀ buffer the next P·V reads (byte offset).
    // (Only an fp8 kernel allocates it: the other kernels' PTX stays as it was.)
    let vt_var = if fp8.is_some() { Some(var_i32(kit, c32(sm.vt[0]))?) } else { None };
    // The `wgmma` P·V's groups: one, or Dv / 64 with `pv_split`.
    let pv_parts = wg.map_or(1, |w| if w.pv_split { dv / 64 } else { 1 });
    // O += P·V on tensor cores (V at `v_sm`, P in `pa`). With `wgmma`, each of the
    // `pv_parts` groups is waited for at once, or with `overlapped` (one Q·Kᵀ group issued
    // before them) none is: part i's wait leaves its `2 + i` groups pending.
    let pv_tc = |k: &Kit<'ctx>, v_sm: IntValue<'ctx>, v_at: PointerValue<'ctx>, pa: &[Vec<[IntValue<'ctx>; 4]>], overlapped: bool| -> R<()> {
        if fp8.is_some() {
            // A = P's e4m3 fragments (k-step kk: the 32 keys 32kk..), B = Vᵀ (K-major, its
            // k positions permuted as `pack` needs): one m64n{Dv}k32 per 32 keys.
            let vt_addr = k.add(sbase, get_i32(k, vt_var.ok_or_else(|| k.err("no Vᵀ offset"))?)?)?;
            let flat: Vec<PointerValue<'ctx>> = acc[0].iter().flatten().copied().collect();
            let steps = (0..n_nt / 4).map(|kk| Ok((pa[0][kk], desc(k, k.add(vt_addr, c32(kk as u32 * 32))?, k_major)?))).collect::<R<Vec<_>>>()?;
            let cur: Vec<FloatValue<'ctx>> = flat.iter().map(|&a| k.get_f(a)).collect::<R<_>>()?;
            let out = k.wgmma_rs_k_tile(ein, dv, &cur, &steps, false, if overlapped { 2 } else { 0 })?;
            for (&a, v) in flat.iter().zip(out) {
                k.set(a, v.into())?;
            }
            return Ok(());
        }
        if wg.is_some() {
            // A = P from registers (k-step kk: keys 16kk..), B = V rows 16kk.. of
            // each slab (MN-major, see `mn_major`): Dv / n products of m64n{n}k16.
            let n = dv / pv_parts;
            let v_addr = k.add(sbase, v_sm)?;
            let flat: Vec<PointerValue<'ctx>> = acc[0].iter().flatten().copied().collect();
            for part in 0..pv_parts as usize {
                let steps = (0..n_nt / 2)
                    .map(|kk| Ok((pa[0][kk], desc(k, k.add(v_addr, c32(part as u32 * bkv * 128 + kk as u32 * 2048))?, mn_major)?)))
                    .collect::<R<Vec<_>>>()?;
                let regs = &flat[part * (n / 2) as usize..(part + 1) * (n / 2) as usize];
                let cur: Vec<FloatValue<'ctx>> = regs.iter().map(|&a| k.get_f(a)).collect::<R<_>>()?;
                let out = k.wgmma_rs_k_tile(dt, n, &cur, &steps, true, if overlapped { 2 + part as u32 } else { 0 })?;
                for (&a, v) in regs.iter().zip(out) {
                    k.set(a, v.into())?;
                }
            }
            return Ok(());
        }
        for kk in 0..n_nt / 2 {
            for np in 0..n_ov / 2 {
                let vb = k.ldmatrix_x4(k.sh_at(v_at, c32(kk as u32 * 16 * sm.ldv * 2 + np as u32 * 32))?, true)?;
                for mi in 0..mt {
                    for (half, bb) in [[vb[0], vb[1]], [vb[2], vb[3]]].into_iter().enumerate() {
                        let a = &acc[mi][2 * np + half];
                        let cur = [k.get_f(a[0])?, k.get_f(a[1])?, k.get_f(a[2])?, k.get_f(a[3])?];
                        let out = k.mma(dt, pa[mi][kk], bb, cur)?;
                        for e in 0..4 {
                            k.set(a[e], out[e].into())?;
                        }
                    }
                }
            }
        }
        Ok(())
    };

    // ---- the key tiles -------------------------------------------------------------------------
    // fp8: V_t (keys outer, as stored) → Vᵀ, the K-major B operand of P·V (8-bit `wgmma`
    // has no transposed B). Thread u of the CTA takes a 4-key × 16-column block: keys
    // a, a + 1, a + 8, a + 9 (a = 32·g + 16·hh + 2·t, the keys lane t4 = t holds in n8
    // tiles 4g + 2hh and 4g + 2hh + 1 of S) and V columns 16·cn ..: four 16-byte row
    // reads, four 4×4 byte transposes, and column n's four bytes are one 32-bit word of
    // Vᵀ row n at k positions 32g + 16hh + 4t .. +3 (`pack`'s A fragment order). Vᵀ
    // rows are 128-byte swizzled (chunk c of row n at c xor (n mod 8)). Every thread's
    // `wgmma`s of the previous tile were waited for before the barrier that precedes
    // this, so the one Vᵀ buffer is free.
    let transpose_v = |k: &Kit<'ctx>, v_sm: IntValue<'ctx>, vt_sm: IntValue<'ctx>| -> R<()> {
        let ng = bkv / 32;
        let units = bkv * dv / 64;
        for i in 0..units.div_ceil(threads) {
            let u = k.add(tid, c32(i * threads))?;
            let go = |k: &Kit<'ctx>| -> R<()> {
                let t = k.and(u, c32(3))?;
                let cn0 = k.and(k.lshr(u, 2)?, c32(1))?;
                let hh = k.and(k.lshr(u, 3)?, c32(1))?;
                let r = k.lshr(u, 4)?;
                let g = k.urem(r, c32(ng))?;
                let cn = k.add(k.mul(k.udiv(r, c32(ng))?, c32(2))?, cn0)?;
                let a = k.add(k.add(k.mul(g, c32(32))?, k.mul(hh, c32(16))?)?, k.mul(t, c32(2))?)?;
                let rows = [0u32, 1, 8, 9].map(|o| -> R<Vec<IntValue<'ctx>>> {
                    let at = sm_at(k, v_sm, bkv, sm.ldv, k.add(a, c32(o))?, cn)?;
                    load_i32s(k, k.sh_at(smem, at)?, 4)
                });
                let rows: Vec<Vec<IntValue<'ctx>>> = rows.into_iter().collect::<R<_>>()?;
                let kc = k.add(k.mul(g, c32(2))?, hh)?; // k-position chunk of the word
                for w in 0..4u32 {
                    let cols = k.transpose_bytes_4x4([rows[0][w as usize], rows[1][w as usize], rows[2][w as usize], rows[3][w as usize]])?;
                    for (b, &word) in cols.iter().enumerate() {
                        let n = k.add(k.mul(cn, c32(16))?, c32(4 * w + b as u32))?;
                        let chunk = k.xor(kc, k.and(n, c32(7))?)?;
                        let at = k.add(vt_sm, k.add(k.mul(n, c32(128))?, k.add(k.shl(chunk, 4)?, k.shl(t, 2)?)?)?)?;
                        store_i32s(k, k.sh_at(smem, at)?, &[word])?;
                    }
                }
                Ok(())
            };
            if (i + 1) * threads <= units {
                go(k)?;
            } else {
                k.if_then(k.icmp(IntPredicate::ULT, u, c32(units))?, go)?;
            }
        }
        Ok(())
    };
    if overlap {
        // FlashAttention-3's intra-warpgroup pipelining (arXiv 2407.08608 §3.2, Algorithm 2):
        // iteration t issues S_t = Q·K_tᵀ, then O += P_{t−1}·V_{t−1}, waits for S_t alone
        // and runs its softmax while the P·V group is in flight, then waits for it and
        // rescales O by α_t. The same operations in the same order as the loop below (O is
        // rescaled by α_t after P_{t−1}·V_{t−1} is added, before P_t·V_t), so the same results.
        // - P_{t−1} crosses the back edge in registers (`pa_prev`), and is an operand of the
        //   wait for its P·V: the `wgmma` reads A registers asynchronously (§9.7.15.6), so
        //   P_t, packed during the softmax, must not take P_{t−1}'s registers while it runs.
        // - ptxas serializes every `wgmma` (C7520) when a group is in flight across a branch
        //   it cannot prove uniform, and a warpgroup's tile range (`grp_end`) comes from the
        //   thread index: so every warpgroup walks all `n_tiles` tiles (a causal CTA's upper
        //   warpgroup computes up to one tile above its diagonal, fully masked: α = 1, p = 0,
        //   and the non-finite scan of V keeps the products exact), and the rare CUDA-core
        //   P·V (non-finite V where p = 0) takes a separate, unpipelined iteration.
        // - Loads: iteration t takes K_{t+1} and V_t (V one tile later than K), so its barrier
        //   finds K_t and V_{t−1} landed, and the stages it overwrites — K_{t−1}'s (its Q·Kᵀ
        //   was waited for in iteration t − 1) and V_{t−2}'s (its P·V too) — are free in
        //   every warpgroup. One iteration more than there are tiles, for the last P·V.
        let i32t = kit.i32t;
        let f32t = kit.f32t;
        // (fp8: 32-key steps, half as many.)
        let pa_prev: Vec<[PointerValue<'ctx>; 4]> = (0..n_nt / if fp8.is_some() { 4 } else { 2 }).map(|_| Ok([kit.var_i(c32(0))?, kit.var_i(c32(0))?, kit.var_i(c32(0))?, kit.var_i(c32(0))?])).collect::<R<_>>()?;
        let flat: Vec<PointerValue<'ctx>> = acc[0].iter().flatten().copied().collect();
        let keep_pa = |k: &Kit<'ctx>, pa: &[Vec<[IntValue<'ctx>; 4]>]| -> R<()> {
            for (v, w) in pa_prev.iter().zip(&pa[0]) {
                for e in 0..4 {
                    k.set(v[e], w[e].into())?;
                }
            }
            Ok(())
        };
        kit.for_range(c32(0), kit.add(n_tiles, c32(1))?, c32(1), |k, t| {
            k.cp_async_wait(0)?;
            k.fence_proxy_async()?;
            k.barrier()?;
            let next = k.add(t, c32(1))?;
            k.if_then(k.icmp(IntPredicate::SLT, next, n_tiles)?, |k| issue_k(k, next))?;
            k.if_then(k.icmp(IntPredicate::SLT, t, n_tiles)?, |k| issue_v(k, t))?;
            k.cp_async_commit()?;
            if fp8.is_some() {
                // V_{t−1} (landed) → Vᵀ for this iteration's P_{t−1}·V_{t−1}: its previous
                // readers, P_{t−2}·V_{t−2}, were waited for in iteration t − 1. The writers
                // fence the async proxy, then the barrier (CTA-uniform condition).
                k.if_then(k.icmp(IntPredicate::SGT, t, c32(0))?, |k| {
                    transpose_v(k, stage_of(k, k.sub(t, c32(1))?)?.1, c32(sm.vt[0]))?;
                    k.fence_proxy_async()?;
                    k.barrier()
                })?;
            }
            let j0 = k.mul(t, c32(bkv))?;
            let jp = k.sub(j0, c32(bkv))?;
            // Uniform in the CTA (the trip count is), which ptxas sees.
            let cur = k.icmp(IntPredicate::SLT, t, n_tiles)?;
            let prev = k.icmp(IntPredicate::SGT, t, c32(0))?;
            let (k_sm, _) = stage_of(k, t)?;
            let (_, vp_sm) = stage_of(k, k.sub(t, c32(1))?)?;
            let vp_at = k.sh_at(smem, k.add(vp_sm, v_lane)?)?; // (the mma.sync form's; unused)
            let pa_old = |k: &Kit<'ctx>| -> R<Vec<Vec<[IntValue<'ctx>; 4]>>> {
                Ok(vec![pa_prev.iter().map(|v| Ok([k.get_i(v[0], i32t)?, k.get_i(v[1], i32t)?, k.get_i(v[2], i32t)?, k.get_i(v[3], i32t)?])).collect::<R<Vec<_>>>()?])
            };
            let slow = var_i32(k, c32(0))?;
            k.if_then(prev, |k| {
                let s = decide_slow(k, jp, vp_sm)?;
                k.set(slow, k.select_int(s, c32(1), c32(0))?.into())
            })?;
            let slow = k.icmp(IntPredicate::NE, get_i32(k, slow)?, c32(0))?;
            k.if_else(
                or(k, slow, not(k, prev)?)?,
                |k| {
                    // The first tile, or tile t − 1's CUDA-core P·V: tile t as the loop below
                    // does, nothing left in flight.
                    k.if_then(slow, |k| pv_slow(k, jp, vp_sm, &pa_old(k)?))?;
                    k.if_then(cur, |k| {
                        let out = qk_wg(k, k_sm, 0)?;
                        let sacc = vec![(0..n_nt).map(|n| [out[4 * n], out[4 * n + 1], out[4 * n + 2], out[4 * n + 3]]).collect::<Vec<_>>()];
                        scores(k, j0, &sacc)?;
                        let (pf, rescale, alphas) = softmax(k)?;
                        rescale_acc(k, rescale, &alphas)?;
                        keep_pa(k, &pack(k, &pf)?)
                    })
                },
                |k| {
                    k.if_else(
                        cur,
                        |k| {
                            // No branch from here to the last wait: S_t's group, then the
                            // `pv_parts` P·V groups, S_t waited for alone.
                            let s_next = qk_wg(k, k_sm, 1)?;
                            let pa = pa_old(k)?;
                            pv_tc(k, vp_sm, vp_at, &pa, true)?;
                            let out = k.wgmma_wait_group(&s_next, pv_parts)?;
                            let sacc = vec![(0..n_nt).map(|n| [out[4 * n], out[4 * n + 1], out[4 * n + 2], out[4 * n + 3]]).collect::<Vec<_>>()];
                            scores(k, j0, &sacc)?;
                            let (pf, rescale, alphas) = softmax(k)?;
                            let pa_new = pack(k, &pf)?;
                            // O readable again (P_{t−1} free): the P·V groups done. ptxas
                            // schedules a wait as early as its basic block allows, so it is
                            // in each arm of the rescaling branch, after the softmax, not in
                            // the softmax's block; the branch is the warpgroup's decision
                            // (`bar.red.or`: a `wgmma.wait_group` under a condition must see
                            // the whole warpgroup take the same way, §9.7.15.7.3), rescaling
                            // when any of its rows has a new maximum (α = 1 exactly for the
                            // others).
                            let mut o: Vec<FloatValue<'ctx>> = flat.iter().map(|&a| k.get_f(a)).collect::<R<_>>()?;
                            for w in pa[0].iter().flatten() {
                                o.push(k.math(|kb| Ok(kb.b.build_bit_cast(*w, f32t, "")?.into_float_value()))?);
                            }
                            let wait = |k: &Kit<'ctx>, note: &str| -> R<()> {
                                for (&a, v) in flat.iter().zip(k.wgmma_wait_group_noted(&o, 0, note)?) {
                                    k.set(a, v.into())?;
                                }
                                Ok(())
                            };
                            k.if_else(
                                k.bar_red_or(k.add(wg_id, c32(1))?, 128, rescale)?,
                                |k| {
                                    wait(k, "rescale")?;
                                    for &(mi, hh, alpha) in &alphas {
                                        for a in &acc[mi] {
                                            for e in [2 * hh, 2 * hh + 1] {
                                                k.set(a[e], k.fmul(k.get_f(a[e])?, alpha)?.into())?;
                                            }
                                        }
                                    }
                                    Ok(())
                                },
                                |k| wait(k, "as is"),
                            )?;
                            keep_pa(k, &pa_new)
                        },
                        // The last tile's P·V.
                        |k| pv_tc(k, vp_sm, vp_at, &pa_old(k)?, false),
                    )
                },
            )
        })?;
    } else if let Some(bars) = bars {
        // The warp-specialised consumers: per key tile, wait for its stage's full barrier
        // (the TMA's bytes landed: acquire, so the generic loads of the non-finite scan see
        // them too), compute it as the loop below does when the warpgroup sees any of its
        // keys, then free the stage: each warp, converged after its last read of it (the
        // `wgmma`s waited for, the scans behind the warpgroup's `bar.red`), arrives on its
        // empty barrier from lane 0. Every warp walks all `n_tiles` tiles and frees each
        // once, so the producer, walking the same tiles, is never left waiting.
        //
        // Ping-pong (FlashAttention-3 §3.1): warpgroup c waits at its scheduling barrier
        // `3 + c` before issuing S = Q·Kᵀ and, once it is issued, signals the other's
        // (`bar.arrive`, 256 threads: the other warpgroup's 128 waiting and this one's 128) —
        // so the warpgroups issue their products in turn and one's softmax and P·V run while
        // the other's Q·Kᵀ does. Warpgroup 0 goes first (it signals its own barrier once
        // before the loop) and waits once more after it, for warpgroup 1's last signal: on
        // each barrier every phase has its 128 waiting and 128 arriving threads, and none is
        // left half full at exit. Tiles a warpgroup skips (above its causal diagonal) still
        // take their turn, so the counts match whatever the tiles.
        let mine = kit.add(wg_id, c32(3))?;
        let other = kit.sub(c32(4), wg_id)?;
        let first_wg = kit.and(kit.icmp(IntPredicate::EQ, wg_id, c32(0))?, kit.icmp(IntPredicate::SGT, n_tiles, c32(0))?)?;
        if pingpong {
            kit.if_then(first_wg, |k| k.bar_arrive(mine, 256))?;
        }
        let lane0 = kit.icmp(IntPredicate::EQ, lane, c32(0))?;
        kit.for_range(c32(0), n_tiles, c32(1), |k, t| {
            let (st, ph) = ring(k, t)?;
            k.mbarrier_wait_parity(full(k, bars, st)?, ph)?;
            if pingpong {
                k.bar_sync(mine, 256)?;
            }
            let j0 = k.mul(t, c32(bkv))?;
            k.if_else(
                k.icmp(IntPredicate::SLT, j0, grp_end)?,
                |k| {
                    let (k_sm, v_sm) = stage_of(k, t)?;
                    let v_at = k.sh_at(smem, k.add(v_sm, v_lane)?)?;
                    // S = Q·Kᵀ: issued, the other warpgroup signalled, then waited for.
                    let out = if pingpong {
                        let out = qk_wg(k, k_sm, 1)?;
                        k.bar_arrive(other, 256)?;
                        k.wgmma_wait_group(&out, 0)?
                    } else {
                        qk_wg(k, k_sm, 0)?
                    };
                    let sacc = vec![(0..n_nt).map(|n| [out[4 * n], out[4 * n + 1], out[4 * n + 2], out[4 * n + 3]]).collect::<Vec<_>>()];
                    scores(k, j0, &sacc)?;
                    let (pf, rescale, alphas) = softmax(k)?;
                    rescale_acc(k, rescale, &alphas)?;
                    let pa = pack(k, &pf)?;
                    let slow = decide_slow(k, j0, v_sm)?;
                    k.if_else(slow, |k| pv_slow(k, j0, v_sm, &pa), |k| pv_tc(k, v_sm, v_at, &pa, false))
                },
                |k| if pingpong { k.bar_arrive(other, 256) } else { Ok(()) },
            )?;
            k.warp_sync()?;
            k.if_then(lane0, |k| k.mbarrier_arrive(empty(k, bars, st)?))
        })?;
        if pingpong {
            kit.if_then(first_wg, |k| k.bar_sync(mine, 256))?;
        }
    } else {
        // fp8: V is loaded two tiles ahead of its use (three stages, t mod 3) and transposed
        // one tile ahead into Vᵀ buffer t mod 2, so that the barrier at the top of the next
        // tile publishes it (no second barrier). The prologue took K_0 and V_0: V_1 now, and
        // V_0's transposition.
        let v_stage = |k: &Kit<'ctx>, t: IntValue<'ctx>| -> R<IntValue<'ctx>> {
            let r = k.urem(t, c32(3))?;
            k.select_int(k.icmp(IntPredicate::EQ, r, c32(0))?, c32(sm.v[0]), k.select_int(k.icmp(IntPredicate::EQ, r, c32(1))?, c32(sm.v[1]), c32(sm.v2))?)
        };
        let vt_of = |k: &Kit<'ctx>, t: IntValue<'ctx>| -> R<IntValue<'ctx>> { k.add(c32(sm.vt[0]), k.mul(k.and(t, c32(1))?, c32(sm.vt[1] - sm.vt[0]))?) };
        let issue_v3 = |k: &Kit<'ctx>, t: IntValue<'ctx>| -> R<()> {
            let j0 = k.mul(k.zext64(t)?, k.i64c(i64::from(bkv)))?;
            copy_rows(k, bkv, dv / epc, sm.ldv, v_stage(k, t)?, v_ptr, k.add(v_base, k.mul(j0, v_ss)?)?, v_ss, k.sub(skv, j0)?)
        };
        if fp8.is_some() {
            kit.if_then(kit.icmp(IntPredicate::SGT, n_tiles, c32(1))?, |k| issue_v3(k, c32(1)))?;
            kit.cp_async_commit()?;
            transpose_v(kit, c32(sm.v[0]), c32(sm.vt[0]))?;
            kit.fence_proxy_async()?;
        }
        kit.for_range(c32(0), n_tiles, c32(1), |k, t| {
            k.cp_async_wait(0)?;
            if wg.is_some() {
                k.fence_proxy_async()?;
            }
            k.barrier()?;
            let next = k.add(t, c32(1))?;
            if fp8.is_some() {
                k.if_then(k.icmp(IntPredicate::SLT, next, n_tiles)?, |k| issue_k(k, next))?;
                let after = k.add(t, c32(2))?;
                k.if_then(k.icmp(IntPredicate::SLT, after, n_tiles)?, |k| issue_v3(k, after))?;
                k.cp_async_commit()?;
            } else {
                k.if_then(k.icmp(IntPredicate::SLT, next, n_tiles)?, |k| {
                    issue_tile(k, next)?;
                    k.cp_async_commit()
                })?;
            }
            let j0 = k.mul(t, c32(bkv))?;
            // fp8: every warpgroup issues its S = Q·K_tᵀ (for every tile of the CTA, so that the
            // issue and its wait are under no condition ptxas cannot prove uniform; a causal
            // CTA's upper warpgroup computes up to one fully masked tile it then skips), the
            // threads transpose V_{t+1} into the other Vᵀ buffer while it runs (on the last
            // tile, a stage no tile reads: harmless), then wait for it and fence the async
            // proxy for the transposed bytes (PTX ISA §9.7.15.1; the next tile's barrier
            // publishes them). ptxas 12.9 crashes on a fence between the issue and the wait.
            let s_fp8 = if fp8.is_some() {
                let pending = qk_wg(k, stage_of(k, t)?.0, 1)?;
                transpose_v(k, v_stage(k, next)?, vt_of(k, next)?)?;
                let out = k.wgmma_wait_group(&pending, 0)?;
                k.fence_proxy_async()?;
                if let Some(v) = vt_var {
                    k.set(v, vt_of(k, t)?.into())?;
                }
                Some(out)
            } else {
                None
            };
            k.if_then(k.icmp(IntPredicate::SLT, j0, grp_end)?, |k| {
                let (k_sm, v_sm) = stage_of(k, t)?;
                let v_sm = if fp8.is_some() { v_stage(k, t)? } else { v_sm };
                let (k_at, v_at) = (k.sh_at(smem, k.add(k_sm, k_lane)?)?, k.sh_at(smem, k.add(v_sm, v_lane)?)?);

                // S = Q·Kᵀ.
                let mut sacc: Vec<Vec<[FloatValue<'ctx>; 4]>> = vec![vec![[zero; 4]; n_nt]; mt];
                if wg.is_some() {
                    let out = match &s_fp8 {
                        Some(out) => out.clone(),
                        None => qk_wg(k, k_sm, 0)?,
                    };
                    for n in 0..n_nt {
                        for e in 0..4 {
                            sacc[0][n][e] = out[4 * n + e];
                        }
                    }
                }
                for ks in 0..if wg.is_some() { 0 } else { d / 16 } {
                    let qa: Vec<[IntValue<'ctx>; 4]> = (0..mt).map(|mi| if s.q_in_regs { Ok(qf[mi][ks as usize]) } else { q_frag(k, mi, ks) }).collect::<R<_>>()?;
                    for np in 0..(bkv / 16) as usize {
                        let kb = k.ldmatrix_x4(k.sh_at(k_at, c32(np as u32 * 16 * sm.ldk * 2 + ks * 32))?, false)?;
                        for mi in 0..mt {
                            sacc[mi][2 * np] = k.mma(dt, qa[mi], [kb[0], kb[1]], sacc[mi][2 * np])?;
                            sacc[mi][2 * np + 1] = k.mma(dt, qa[mi], [kb[2], kb[3]], sacc[mi][2 * np + 1])?;
                        }
                    }
                }
                scores(k, j0, &sacc)?;
                let (pf, rescale, alphas) = softmax(k)?;
                rescale_acc(k, rescale, &alphas)?;
                let pa = pack(k, &pf)?;
                let slow = decide_slow(k, j0, v_sm)?;
                k.if_else(slow, |k| pv_slow(k, j0, v_sm, &pa), |k| pv_tc(k, v_sm, v_at, &pa, false))
            })
        })?;
    }
    // ---- O = acc / l, rounded once ------------------------------------------------------------
    let mut outs: Vec<[Vec<FloatValue<'ctx>>; 2]> = Vec::new();
    for mi in 0..mt {
        let mut pair: [Vec<FloatValue<'ctx>>; 2] = [Vec::new(), Vec::new()];
        for (hh, o) in pair.iter_mut().enumerate() {
            let mut lt = kit.get_f(l[mi][hh])?;
            lt = kit.fadd(lt, kit.shfl_xor(lt, 1)?)?;
            lt = kit.fadd(lt, kit.shfl_xor(lt, 2)?)?;
            let empty = kit.fcmp(FloatPredicate::OEQ, kit.get_f(m[mi][hh])?, ninf)?;
            // fp8: O = sv · Σ p·v8 / l.
            let inv = kit.fdiv(v_scale.unwrap_or(kit.f32c(1.0)), lt)?;
            for a in &acc[mi] {
                for e in [2 * hh, 2 * hh + 1] {
                    o.push(kit.select_f(empty, zero, kit.fmul(kit.get_f(a[e])?, inv)?)?);
                }
            }
        }
        outs.push(pair);
    }
    let o_sd = kit.dim(&p.out.st[3])?;
    if p.out.vector_ok(8) {
        // Stage the warp's rows in its rows of the Q tile (which only this warp reads), then
        // 16-byte stores.
        kit.warp_sync()?;
        let wrow0 = kit.mul(warp, c32(rpw))?;
        let staged = |k: &Kit<'ctx>, x: IntValue<'ctx>| if sm.stage == 0 { Ok(x) } else { k.add(c32(sm.stage), x) };
        for (mi, pair) in outs.iter().enumerate() {
            for (hh, o) in pair.iter().enumerate() {
                let row = kit.add(wrow0, kit.add(g, c32(16 * mi as u32 + 8 * hh as u32))?)?;
                for n in 0..n_ov {
                    let col = kit.add(kit.mul(t4, c32(2))?, c32(8 * n as u32))?;
                    let word = kit.math(|kb| kb.pack_x2(dt, o[2 * n], o[2 * n + 1]))?;
                    let at = staged(kit, kit.add(kit.mul(row, c32(sm.ldst * 2))?, kit.mul(col, c32(2))?)?)?;
                    store_i32s(kit, kit.sh_at(smem, at)?, &[word])?;
                }
            }
        }
        kit.warp_sync()?;
        let cv = dv / 8;
        let total = rpw * cv;
        for i in 0..total.div_ceil(32) {
            let e = kit.add(lane, c32(32 * i))?;
            let r = kit.udiv(e, c32(cv))?;
            let col = kit.urem(e, c32(cv))?;
            let grow = kit.add(w0, kit.zext64(r)?)?;
            let ok = kit.and(kit.icmp(IntPredicate::ULT, e, c32(total))?, kit.icmp(IntPredicate::SLT, grow, sq)?)?;
            kit.if_then(ok, |k| {
                let at = staged(k, k.add(k.mul(k.add(wrow0, r)?, c32(sm.ldst * 2))?, k.mul(col, c32(16))?)?)?;
                let words = load_i32s(k, k.sh_at(smem, at)?, 4)?;
                let gi = k.add(o_base, k.add(k.mul(grow, o_ss)?, k.zext64(k.mul(col, c32(8))?)?)?)?;
                store_i32s(k, k.gep_raw(dt, o_ptr, gi)?, &words)
            })?;
        }
    } else {
        for (mi, pair) in outs.iter().enumerate() {
            for (hh, o) in pair.iter().enumerate() {
                kit.if_then(rows.valid[mi][hh], |k| {
                    let row = k.add(o_base, k.mul(rows.index[mi][hh], o_ss)?)?;
                    for n in 0..n_ov {
                        for e in 0..2 {
                            let col = k.add(k.mul(t4, c32(2))?, c32(8 * n as u32 + e as u32))?;
                            let idx = k.add(row, k.mul(k.zext64(col)?, o_sd)?)?;
                            k.store_vec(dt, o_ptr, idx, &[o[2 * n + e]])?;
                        }
                    }
                    Ok(())
                })?;
            }
        }
    }
    // ---- lse = m·ln 2 + ln l (m is in log2 units), after O so that O's registers are free --
    if let Some(t) = &p.lse {
        let (lb, ls, lptr) = (base(t, b, h)?, kit.dim(&t.st[2])?, kit.buf(t.buffer)?);
        for mi in 0..mt {
            for hh in 0..2 {
                let mut lt = kit.get_f(l[mi][hh])?;
                lt = kit.fadd(lt, kit.shfl_xor(lt, 1)?)?;
                lt = kit.fadd(lt, kit.shfl_xor(lt, 2)?)?;
                let mv = kit.get_f(m[mi][hh])?;
                let empty = kit.fcmp(FloatPredicate::OEQ, mv, ninf)?;
                // fp8: l carries P's 2⁸ (m − 8 is the log2 of the scale p's are relative to).
                let mv2 = if fp8.is_some() { kit.fsub(mv, kit.f32c(f64::from(FP8_P_LOG2)))? } else { mv };
                let v = kit.select_f(empty, ninf, kit.fma(mv2, kit.f32c(std::f64::consts::LN_2), kit.log(lt)?)?)?;
                // The quad's four lanes hold the row's m and l; the first writes.
                let first = kit.and(rows.valid[mi][hh], kit.icmp(IntPredicate::EQ, t4, c32(0))?)?;
                kit.if_then(first, |k| k.store_vec(DType::F32, lptr, k.add(lb, k.mul(rows.index[mi][hh], ls)?)?, &[v]))?;
            }
        }
    }
    Ok(())
}

/// The (batch, head) base of the additive mask.
fn base_mask<'ctx>(kit: &Kit<'ctx>, mk: &Mask, b: IntValue<'ctx>, h: IntValue<'ctx>) -> R<IntValue<'ctx>> {
    let a = kit.add(kit.dim(&mk.offset)?, kit.mul(b, kit.dim(&mk.st[0])?)?)?;
    kit.add(a, kit.mul(h, kit.dim(&mk.st[1])?)?)
}
