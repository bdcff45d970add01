//! The tensor-core kernel of a block-quantized B ([`QuantMmaSchedule`]): weight blocks read
//! straight into `mma.m16n8k16` B fragments and dequantised in registers, activations staged
//! in shared memory.
//!
//! Design notes: book/src/design/matmul.md

use inkwell::values::{IntValue, PointerValue};
use inkwell::IntPredicate;
use sinter_ir::DType;

use super::epilogue::epilogue_and_store;
use super::schedule::QuantMmaSchedule;
use super::spec::{Spec, batch_bases};
use crate::isa::kit::{Kit, SharedKind, R};

/// The quantized tensor-core kernel ([`QuantMmaSchedule`]): `C[16, 8·tiles·warps]` tiles of
/// `x · dequantize(W)ᵀ` with `x` ≤ 16 rows (padded to 16 with zeros) and `W` `[N, K]` in
/// `q8_0`/`q4_1` blocks. Per step of `chunk` K columns:
/// 1. each warp loads, for each of its tiles (8 weight rows) and each of the step's blocks,
///    the words its lanes' B fragments need ([`crate::quant::fragment_words`]: 3 or 5 naturally
///    aligned loads a lane per block, a row's four lanes reading the whole block) — all of
///    the step's loads issued before any is used;
/// 2. the CTA stages the step's activation columns (16 rows, zeros past M and K) in shared
///    memory with 16-byte loads, rows padded by 16 bytes (4·g + t distinct banks);
/// 3. after a barrier, each lane dequantises its 8 values per block
///    ([`crate::quant::fragment_values`], f32), rounds them to the operand dtype in pairs
///    (`pack_x2`: where the unfused graph rounds the dequantised weight), and issues two
///    `mma.m16n8k16` per block with A fragments read from shared memory (32-bit loads);
/// 4. a barrier before the next step overwrites the tile.
///
/// Accumulators are f32; the direct epilogue runs per element from them. Weight rows past N
/// and blocks past K read nothing (their fragments are zero).
pub(super) fn build_quant_mma<'ctx>(kit: &Kit<'ctx>, spec: &Spec, s: &QuantMmaSchedule) -> R<()> {
    let q = spec.b_quant.ok_or_else(|| kit.err("no quantized B"))?;
    let dt = spec.dtype;
    let tid = kit.sreg("tid.x")?;
    let bx = kit.zext64(kit.sreg("ctaid.x")?)?;
    let by = kit.zext64(kit.sreg("ctaid.y")?)?;
    let bz = kit.zext64(kit.sreg("ctaid.z")?)?;
    let bases = batch_bases(kit, spec, bz)?;
    let (mdim, ndim, kdim) = (kit.dim(&spec.m)?, kit.dim(&spec.n)?, kit.dim(&spec.k)?);
    let (a_ptr, b_ptr) = (kit.buf(spec.a.buffer)?, kit.buf(spec.b.buffer)?);
    let (a_outer, a_ks) = (kit.dim(&spec.a.outer)?, kit.dim(&spec.a.ks)?);
    let kblocks = kit.udiv(kdim, kit.i64c(32))?;
    let warp = kit.zext64(kit.udiv(tid, kit.i32c(32))?)?;
    let lane = kit.zext64(kit.urem(tid, kit.i32c(32))?)?;
    let g = kit.udiv(lane, kit.i64c(4))?;
    let t = kit.urem(lane, kit.i64c(4))?;
    let m0 = kit.mul(by, kit.i64c(16))?;
    let cta_n0 = kit.mul(bx, kit.i64c(i64::from(s.columns())))?;
    let warp_n0 = kit.add(cta_n0, kit.mul(warp, kit.i64c(i64::from(8 * s.tiles)))?)?;
    let pitch = (s.chunk + 8) * 2;
    let smem = kit.shared(SharedKind::Static, s.shared_bytes())?;
    let steps = s.chunk / 32;
    let acc: Vec<[PointerValue; 4]> = (0..s.tiles).map(|_| Ok([kit.var_f(kit.f32c(0.0))?, kit.var_f(kit.f32c(0.0))?, kit.var_f(kit.f32c(0.0))?, kit.var_f(kit.f32c(0.0))?])).collect::<R<_>>()?;
    // Each thread's 16-byte pieces of the staged tile: 16 rows × chunk/8 pieces.
    let pieces = 16 * s.chunk / 8;
    let nwords = if q == DType::Q4_1 { 3 } else { 5 };
    let i32t = kit.i32t;
    // The B fragment words of the step starting at block `kb0`: one i32 variable per word
    // (zero for rows past N and blocks past K), every load issued before any is used.
    let load_words = |k: &Kit<'ctx>, kb0: IntValue<'ctx>| -> R<Vec<Vec<Vec<PointerValue<'ctx>>>>> {
        let mut words = Vec::with_capacity(s.tiles as usize);
        for tile in 0..s.tiles {
            let row = k.add(k.add(warp_n0, k.i64c(i64::from(8 * tile)))?, g)?;
            let row_ok = k.icmp(IntPredicate::SLT, row, ndim)?;
            let mut per_block = Vec::with_capacity(steps as usize);
            for j in 0..steps {
                let blk = k.add(kb0, k.i64c(i64::from(j)))?;
                let ok = k.and(row_ok, k.icmp(IntPredicate::SLT, blk, kblocks)?)?;
                let vars: Vec<PointerValue> = (0..nwords).map(|_| k.var_i(i32t.const_zero())).collect::<R<_>>()?;
                k.if_then(ok, |k| {
                    let block = k.add(k.mul(row, kblocks)?, blk)?;
                    let w = k.math(|b| crate::quant::fragment_words(b, q, b_ptr, block, t))?;
                    for (p, v) in vars.iter().zip(w) {
                        k.set(*p, v.into())?;
                    }
                    Ok(())
                })?;
                per_block.push(vars);
            }
            words.push(per_block);
        }
        Ok(words)
    };
    // With prefetch, `cur` holds the words of the step about to compute (loaded one step
    // ahead); the loop loads the next step's into fresh variables and moves them over.
    let cur = if s.prefetch { Some(load_words(kit, kit.i64c(0))?) } else { None };
    kit.for_range(kit.i64c(0), kit.add(kblocks, kit.i64c(i64::from(steps - 1)))?, kit.i64c(i64::from(steps)), |k, kb0| {
        // 1. The B fragment words: this step's (no prefetch) or the next step's (prefetch).
        let fresh = load_words(k, if s.prefetch { k.add(kb0, k.i64c(i64::from(steps)))? } else { kb0 })?;
        let this = cur.as_ref().unwrap_or(&fresh);
        let words: Vec<Vec<Vec<IntValue>>> = this.iter().map(|t| t.iter().map(|b| b.iter().map(|&p| k.get_i(p, i32t)).collect::<R<Vec<_>>>()).collect::<R<Vec<_>>>()).collect::<R<_>>()?;
        // 2. The activation tile: 16 rows × chunk columns, zeros past M and K.
        let k0 = k.mul(kb0, k.i64c(32))?;
        for r in 0..pieces.div_ceil(s.threads()) {
            let piece = k.add(k.zext64(tid)?, k.i64c(i64::from(r * s.threads())))?;
            let inside = k.icmp(IntPredicate::SLT, piece, k.i64c(i64::from(pieces)))?;
            k.if_then(inside, |k| {
                let per_row = i64::from(s.chunk / 8);
                let (row, col) = (k.udiv(piece, k.i64c(per_row))?, k.mul(k.urem(piece, k.i64c(per_row))?, k.i64c(8))?);
                let m = k.add(m0, row)?;
                let kk = k.add(k0, col)?;
                let ok = k.and(k.icmp(IntPredicate::SLT, m, mdim)?, k.icmp(IntPredicate::SLT, kk, kdim)?)?;
                let aidx = k.add(bases.a, k.add(k.mul(m, a_outer)?, k.mul(kk, a_ks)?)?)?;
                let vals = k.guarded_load(ok, dt, a_ptr, aidx, 8, true, a_ks)?;
                let off = k.add(k.mul(k.trunc32(row)?, k.i32c(pitch as i32))?, k.mul(k.trunc32(col)?, k.i32c(2))?)?;
                k.sh_store(dt, k.sh_at(smem, off)?, &vals)
            })?;
        }
        k.barrier()?;
        // 3. Dequantise into the fragments; two MMAs a block.
        let g32 = k.trunc32(g)?;
        let t32 = k.trunc32(t)?;
        let a_word = |k: &Kit<'ctx>, row: IntValue<'ctx>, col: u32| -> R<IntValue<'ctx>> {
            // Row `row` (i32), columns `col + 2t`, `+1` of the staged tile, as one 32-bit word.
            let off = k.add(k.mul(row, k.i32c(pitch as i32))?, k.add(k.i32c(2 * col as i32), k.mul(t32, k.i32c(4))?)?)?;
            let p = k.sh_at(smem, off)?;
            k.math(|b| Ok(b.load(b.cx.i32_type().into(), p, 4)?.into_int_value()))
        };
        let g8 = k.add(g32, k.i32c(8))?;
        for j in 0..steps {
            let mut a_frags = Vec::with_capacity(2);
            for step in 0..2u32 {
                let col = 32 * j + 16 * step;
                a_frags.push([a_word(k, g32, col)?, a_word(k, g8, col)?, a_word(k, g32, col + 8)?, a_word(k, g8, col + 8)?]);
            }
            for (tile, per_block) in words.iter().enumerate() {
                let vals = k.math(|b| crate::quant::fragment_values(b, q, &per_block[j as usize]))?;
                let packed: Vec<IntValue> = vals.chunks(2).map(|p| k.math(|b| b.pack_x2(dt, p[0], p[1]))).collect::<R<_>>()?;
                let mut c = [k.get_f(acc[tile][0])?, k.get_f(acc[tile][1])?, k.get_f(acc[tile][2])?, k.get_f(acc[tile][3])?];
                for (step, a) in a_frags.iter().enumerate() {
                    c = k.mma(dt, *a, [packed[2 * step], packed[2 * step + 1]], c)?;
                }
                for (p, v) in acc[tile].iter().zip(c) {
                    k.set(*p, v.into())?;
                }
            }
        }
        // 4. The tile is rewritten by the next step; the prefetched words become current.
        if let Some(cur) = &cur {
            for (c, f) in cur.iter().flatten().flatten().zip(fresh.iter().flatten().flatten()) {
                k.set(*c, k.get_i(*f, i32t)?.into())?;
            }
        }
        k.barrier()
    })?;
    // The direct epilogue at each lane's four elements of each tile.
    for (tile, a) in acc.iter().enumerate() {
        let n_base = k_tile_col(kit, warp_n0, tile as u32, t)?;
        for (i, p) in a.iter().enumerate() {
            let m = kit.add(m0, kit.add(g, kit.i64c(if i >= 2 { 8 } else { 0 }))?)?;
            let n = kit.add(n_base, kit.i64c((i % 2) as i64))?;
            let ok = kit.and(kit.icmp(IntPredicate::SLT, m, mdim)?, kit.icmp(IntPredicate::SLT, n, ndim)?)?;
            let v = kit.get_f(*p)?;
            kit.if_then(ok, |k| epilogue_and_store(k, spec, &bases, m, n, v))?;
        }
    }
    Ok(())
}

/// The first of the two columns lane `t` holds in tile `tile` of a warp whose tiles start at
/// column `warp_n0`: `warp_n0 + 8·tile + 2t`.
pub(super) fn k_tile_col<'ctx>(k: &Kit<'ctx>, warp_n0: IntValue<'ctx>, tile: u32, t: IntValue<'ctx>) -> R<IntValue<'ctx>> {
    k.add(k.add(warp_n0, k.i64c(i64::from(8 * tile)))?, k.mul(t, k.i64c(2))?)
}
