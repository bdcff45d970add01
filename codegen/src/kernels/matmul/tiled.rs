//! The tiled CUDA-core kernel ([`TiledSchedule`]): f32 slabs of A and B in shared memory,
//! register micro-tiles per thread.
//!
//! Design notes: book/src/design/matmul.md

use inkwell::values::{IntValue, PointerValue};
use inkwell::IntPredicate;
use sinter_ir::DType;

use super::epilogue::{epilogue_and_store, staged_epilogue};
use super::schedule::{TiledSchedule, PAD};
use super::spec::{Spec, batch_bases, tile_column};
use crate::isa::kit::{Kit, SharedKind, R};

/// The tiled kernel (see [`TiledSchedule`]).
pub(super) fn build_tiled<'ctx>(kit: &Kit<'ctx>, spec: &Spec, s: &TiledSchedule) -> R<()> {
    let threads = s.threads();
    let tid = kit.sreg("tid.x")?;
    let bx = kit.zext64(kit.sreg("ctaid.x")?)?;
    let by = kit.zext64(kit.sreg("ctaid.y")?)?;
    let bz = kit.zext64(kit.sreg("ctaid.z")?)?;
    let m0 = kit.mul(bx, kit.i64c(i64::from(s.bm)))?;
    let n0 = kit.mul(by, kit.i64c(i64::from(s.bn)))?;
    let bases = batch_bases(kit, spec, bz)?;
    let (mdim, ndim, kdim) = (kit.dim(&spec.m)?, kit.dim(&spec.n)?, kit.dim(&spec.k)?);
    let (a_ptr, b_ptr) = (kit.buf(spec.a.buffer)?, kit.buf(spec.b.buffer)?);
    let (a_outer, a_ks) = (kit.dim(&spec.a.outer)?, kit.dim(&spec.a.ks)?);
    let (b_outer, b_ks) = (kit.dim(&spec.b.outer)?, kit.dim(&spec.b.ks)?);
    // Which axis of each operand is contiguous decides the staging order (coalescing).
    let a_k_contig = spec.a.ks.as_const() == Some(1);
    let b_k_contig = spec.b.ks.as_const() == Some(1);

    let a_row = s.bm + PAD; // f32s per k-row of the A slab
    let b_row = s.bn + PAD;
    let smem = kit.shared(SharedKind::Static, spec.staged_bytes(s))?;
    let b_off = s.b_slab_offset();
    // The column of R that virtual tile column `v` (i32) computes, and whether it exists.
    let tile = by;
    let colmap = |k: &Kit<'ctx>, v: IntValue<'ctx>| -> R<(IntValue<'ctx>, IntValue<'ctx>)> {
        let (n, j, limit) = tile_column(k, spec, s.bn, tile, v)?;
        Ok((n, k.icmp(IntPredicate::SLT, j, limit)?))
    };

    let acc: Vec<PointerValue> = (0..s.tm * s.tn).map(|_| kit.var_f(kit.f32c(0.0))).collect::<R<_>>()?;
    let tx = kit.urem(tid, kit.i32c((s.bn / s.tn) as i32))?;
    let ty = kit.udiv(tid, kit.i32c((s.bn / s.tn) as i32))?;
    let zero64 = kit.i64c(0);

    kit.for_range(zero64, kdim, kit.i64c(i64::from(s.bk)), |k, k0| {
        // Stage A: bm × bk elements, `per` per thread.
        for l in 0..(s.bm * s.bk) / threads {
            let e = k.add(tid, k.i32c((l * threads) as i32))?;
            let (mm, kk) = if a_k_contig {
                (k.udiv(e, k.i32c(s.bk as i32))?, k.urem(e, k.i32c(s.bk as i32))?)
            } else {
                (k.urem(e, k.i32c(s.bm as i32))?, k.udiv(e, k.i32c(s.bm as i32))?)
            };
            let m = k.add(m0, k.zext64(mm)?)?;
            let kk64 = k.add(k0, k.zext64(kk)?)?;
            let valid = k.and(k.icmp(IntPredicate::SLT, m, mdim)?, k.icmp(IntPredicate::SLT, kk64, kdim)?)?;
            let idx = k.add(bases.a, k.add(k.mul(m, a_outer)?, k.mul(kk64, a_ks)?)?)?;
            let v = k.guarded_load(valid, spec.dtype, a_ptr, idx, 1, true, zero64)?;
            let off = k.mul(k.add(k.mul(kk, k.i32c(a_row as i32))?, mm)?, k.i32c(4))?;
            k.sh_store(DType::F32, k.sh_at(smem, off)?, &v)?;
        }
        // Stage B: bk × bn elements.
        for l in 0..(s.bk * s.bn) / threads {
            let e = k.add(tid, k.i32c((l * threads) as i32))?;
            let (kk, nn) = if b_k_contig {
                (k.urem(e, k.i32c(s.bk as i32))?, k.udiv(e, k.i32c(s.bk as i32))?)
            } else {
                (k.udiv(e, k.i32c(s.bn as i32))?, k.urem(e, k.i32c(s.bn as i32))?)
            };
            let (n, n_ok) = colmap(k, nn)?;
            let kk64 = k.add(k0, k.zext64(kk)?)?;
            let valid = k.and(n_ok, k.icmp(IntPredicate::SLT, kk64, kdim)?)?;
            let idx = k.add(bases.b, k.add(k.mul(n, b_outer)?, k.mul(kk64, b_ks)?)?)?;
            let v = k.guarded_load(valid, spec.dtype, b_ptr, idx, 1, true, zero64)?;
            let off = k.add(k.i32c(b_off as i32), k.mul(k.add(k.mul(kk, k.i32c(b_row as i32))?, nn)?, k.i32c(4))?)?;
            k.sh_store(DType::F32, k.sh_at(smem, off)?, &v)?;
        }
        k.barrier()?;
        // Accumulate: per k-row, tm values of A and tn of B from shared memory (16-byte
        // loads), tm·tn FMAs.
        let a_col = k.mul(ty, k.i32c(s.tm as i32))?;
        let b_col = k.mul(tx, k.i32c(s.tn as i32))?;
        for kk in 0..s.bk {
            let ao = k.mul(k.add(k.i32c((kk * a_row) as i32), a_col)?, k.i32c(4))?;
            let bo = k.add(k.i32c(b_off as i32), k.mul(k.add(k.i32c((kk * b_row) as i32), b_col)?, k.i32c(4))?)?;
            let av = k.sh_load(DType::F32, k.sh_at(smem, ao)?, s.tm)?;
            let bv = k.sh_load(DType::F32, k.sh_at(smem, bo)?, s.tn)?;
            for i in 0..s.tm as usize {
                for j in 0..s.tn as usize {
                    let p = acc[i * s.tn as usize + j];
                    let v = k.fma(av[i], bv[j], k.get_f(p)?)?;
                    k.set(p, v.into())?;
                }
            }
        }
        k.barrier()
    })?;

    if spec.epi.staged() {
        return staged_epilogue(kit, spec, s, smem, (m0, tile, bz), &acc, (tid, tx, ty));
    }
    // Epilogue: every thread its micro-tile, bounds-checked.
    let mbase = kit.add(m0, kit.zext64(kit.mul(ty, kit.i32c(s.tm as i32))?)?)?;
    let nbase = kit.add(n0, kit.zext64(kit.mul(tx, kit.i32c(s.tn as i32))?)?)?;
    for i in 0..s.tm {
        for j in 0..s.tn {
            let m = kit.add(mbase, kit.i64c(i64::from(i)))?;
            let n = kit.add(nbase, kit.i64c(i64::from(j)))?;
            let inside = kit.and(kit.icmp(IntPredicate::SLT, m, mdim)?, kit.icmp(IntPredicate::SLT, n, ndim)?)?;
            let a = kit.get_f(acc[(i * s.tn + j) as usize])?;
            kit.if_then(inside, |k| epilogue_and_store(k, spec, &bases, m, n, a))?;
        }
    }
    Ok(())
}
