//! The small-M kernel ([`SmallMSchedule`]): a GEMV / flat GEMM on CUDA cores for decode, with
//! block-quantized weights streamed per lane and every epilogue mode.
//!
//! Design notes: book/src/design/matmul.md

use inkwell::values::{FloatValue, IntValue, PointerValue};
use inkwell::IntPredicate;
use sinter_ir::{DType, Dim};
use sinter_ir::epilogue::{self, MatmulEpilogue as Epi};

use super::epilogue::{epilogue_and_store_accs, columns_output};
use super::schedule::SmallMSchedule;
use super::spec::{Spec, Bases, batch_bases};
use crate::isa::kit::{Kit, SharedKind, R};
use crate::kernels::element::Buf;

/// The small-M kernel (see [`SmallMSchedule`]).
pub(super) fn build_small_m(kit: &Kit<'_>, spec: &Spec, s: &SmallMSchedule) -> R<()> {
    let tid = kit.sreg("tid.x")?;
    let bx = kit.zext64(kit.sreg("ctaid.x")?)?;
    let by = kit.zext64(kit.sreg("ctaid.y")?)?;
    let bz = kit.zext64(kit.sreg("ctaid.z")?)?;
    let bases = batch_bases(kit, spec, bz)?;
    let (mdim, kdim) = (kit.dim(&spec.m)?, kit.dim(&spec.k)?);
    let (a_ptr, b_ptr) = (kit.buf(spec.a.buffer)?, kit.buf(spec.b.buffer)?);
    let (a_outer, a_ks) = (kit.dim(&spec.a.outer)?, kit.dim(&spec.a.ks)?);
    let (b_outer, b_ks) = (kit.dim(&spec.b.outer)?, kit.dim(&spec.b.ks)?);
    // The columns of R a group computes for its output column n: n itself, or (paired) the
    // n-th column of every segment, each with its own accumulators.
    let lanes = s.lanes;
    let g = kit.zext64(kit.udiv(tid, kit.i32c(lanes as i32))?)?;
    let lane = kit.zext64(kit.urem(tid, kit.i32c(lanes as i32))?)?;
    let n = kit.add(kit.mul(bx, kit.i64c(i64::from(s.columns)))?, g)?;
    let m0 = kit.mul(by, kit.i64c(i64::from(s.rows)))?;
    // Columns (QKV + RoPE): column n and its RoPE partners in the same head (rotate-half:
    // n ± R/2 for the R rotated features, n itself beyond; interleaved: n xor 1), so that the
    // epilogue reads R at either.
    let mut rope_head = 1i64;
    let (ncols, cols) = match &spec.epi {
        Epi::Paired { segs, width, .. } => (kit.dim(width)?, segs.iter().map(|sg| kit.add(n, kit.dim(&sg.start)?)).collect::<R<Vec<_>>>()?),
        Epi::Direct => (kit.dim(&spec.n)?, vec![n]),
        Epi::Columns { rope_d, .. } => {
            let mut cols = vec![n];
            let d = *rope_d;
            if d > 1 {
                rope_head = d;
                // (interleaved, rotary dim R) of each rope: the features from R on are copied.
                let forms: std::collections::BTreeSet<(bool, i64)> = spec
                    .epilogue
                    .nodes
                    .values()
                    .filter(|nd| sinter_ir::contract::is_rotation(nd.op.kind))
                    .map(|nd| (nd.op.str("form") == Some("interleaved"), nd.op.int("rotary_dim").unwrap_or(d)))
                    .collect();
                let within = kit.urem(n, kit.i64c(d))?;
                for &(_, r) in forms.iter().filter(|(i, _)| !i) {
                    let first = kit.icmp(IntPredicate::SLT, within, kit.i64c(r / 2))?;
                    let up = kit.add(n, kit.i64c(r / 2))?;
                    let down = kit.sub(n, kit.i64c(r / 2))?;
                    let mut partner = kit.select_i(first, up, down)?;
                    if r < d {
                        let rotated = kit.icmp(IntPredicate::SLT, within, kit.i64c(r))?;
                        partner = kit.select_i(rotated, partner, n)?;
                    }
                    cols.push(partner);
                }
                if forms.iter().any(|(i, _)| *i) {
                    cols.push(kit.xor(n, kit.i64c(1))?);
                }
            }
            (kit.dim(&spec.n)?, cols)
        }
    };
    let n_valid = kit.icmp(IntPredicate::SLT, n, ncols)?;
    prefetch_weights(kit, spec, s)?;
    // Columns: each group stages its head of R in shared memory for the epilogue (a private
    // array indexed by column would live on the stack).
    let group_tile = if matches!(spec.epi, Epi::Columns { .. }) {
        let head_bytes = rope_head as u32 * spec.dtype.size_bytes() as u32;
        let smem = kit.shared(SharedKind::Static, s.columns * head_bytes)?;
        let gi = kit.udiv(tid, kit.i32c(lanes as i32))?;
        Some(kit.sh_at(smem, kit.mul(gi, kit.i32c(head_bytes as i32))?)?)
    } else {
        None
    };

    // acc[column][row]
    let acc: Vec<Vec<PointerValue>> = cols.iter().map(|_| (0..s.rows).map(|_| kit.var_f(kit.f32c(0.0))).collect::<R<Vec<_>>>()).collect::<R<_>>()?;
    let m_valid: Vec<IntValue> = (0..s.rows)
        .map(|i| kit.icmp(IntPredicate::SLT, kit.add(m0, kit.i64c(i64::from(i)))?, mdim))
        .collect::<R<_>>()?;
    // A norm prologue: every row's statistics, before the K loop.
    let scales = match &spec.prologue {
        Some(p) => Some(super::prologue::row_stats(kit, spec, p, m0, s.rows, s.threads())?),
        None => None,
    };
    if let Some(q) = spec.b_quant {
        small_m_quant_loop(kit, spec, q, (lane, lanes), &cols, n_valid, (m0, &m_valid), &acc, &bases)?;
    } else {
    // Vector width along K: 16 bytes where both operands allow it and K is a multiple.
    let es = spec.dtype.size_bytes() as u32;
    let vw = 16 / es;
    let c = if lanes > 1 && spec.a.vector_ok(vw) && spec.b.vector_ok(vw) && spec.k.div_exact(i64::from(vw)).is_some() { vw } else { 1 };

    let start = kit.mul(lane, kit.i64c(i64::from(c)))?;
    let step = kit.i64c(i64::from(c * lanes));
    kit.for_range(start, kdim, step, |k, kk| {
        let mut bvs = Vec::with_capacity(cols.len());
        for &col in &cols {
            let bidx = k.add(bases.b, k.add(k.mul(col, b_outer)?, k.mul(kk, b_ks)?)?)?;
            bvs.push(k.guarded_load(n_valid, spec.dtype, b_ptr, bidx, c, c > 1, b_ks)?);
        }
        for i in 0..s.rows as usize {
            let m = k.add(m0, k.i64c(i as i64))?;
            let aidx = k.add(bases.a, k.add(k.mul(m, a_outer)?, k.mul(kk, a_ks)?)?)?;
            let av = match (&spec.prologue, &scales) {
                (Some(p), Some(rs)) => super::prologue::a_values(k, spec, p, k.select_i(m_valid[i], m, m0)?, kk, c, &rs[i])?,
                _ => k.guarded_load(m_valid[i], spec.dtype, a_ptr, aidx, c, c > 1, a_ks)?,
            };
            for (seg_acc, bv) in acc.iter().zip(&bvs) {
                let p = seg_acc[i];
                let mut sum = k.get_f(p)?;
                for (x, y) in av.iter().zip(bv) {
                    sum = k.fma(*x, *y, sum)?;
                }
                k.set(p, sum.into())?;
            }
        }
        Ok(())
    })?;
    }
    // Reduce over the lanes of a column (lanes are aligned groups of a warp).
    let masks: Vec<u32> = (0..lanes.trailing_zeros()).rev().map(|b| 1 << b).collect();
    let mut sums: Vec<Vec<FloatValue>> = Vec::with_capacity(acc.len());
    for seg_acc in &acc {
        let mut v = Vec::with_capacity(seg_acc.len());
        for p in seg_acc {
            v.push(kit.warp_reduce(kit.get_f(*p)?, &masks, |k, x, y| k.fadd(x, y))?);
        }
        sums.push(v);
    }
    let writer = kit.and(kit.icmp(IntPredicate::EQ, lane, kit.i64c(0))?, n_valid)?;
    kit.if_then(writer, |k| {
        for i in 0..s.rows as usize {
            let m = k.add(m0, k.i64c(i as i64))?;
            let row: Vec<FloatValue> = sums.iter().map(|v| v[i]).collect();
            match &spec.epi {
                Epi::Columns { segs, appends, .. } => k.if_then(m_valid[i], |k| small_m_columns(k, spec, (bz, m, n), &cols, &row, (group_tile, rope_head), segs, appends))?,
                _ => k.if_then(m_valid[i], |k| epilogue_and_store_accs(k, spec, &bases, m, n, &row))?,
            }
        }
        Ok(())
    })
}

/// The K loop of the small-M kernel when B is block-quantized (`q8_0`/`q4_1`, `[N, K]`):
/// lane `l` of a column's group takes blocks `l, l + lanes, …` of the column's row of blocks
/// (so a warp reads `lanes` consecutive blocks, 640 contiguous bytes of `q4_1` or 1088 of
/// `q8_0`, per step), decodes the block's 32 values in registers ([`crate::quant::block_values`]:
/// 4-byte loads), rounds each to the `dequantize` dtype (where the unfused graph rounds), and
/// accumulates them against the 32 matching elements of each row of A (16-byte vectors where
/// A's layout allows) in f32. A column past N reads nothing.
#[allow(clippy::too_many_arguments)]
/// On targets with programmatic dependent launch, each group's B column (K-contiguous, of a
/// constant length, no batch) prefetched into L2 before the kernel waits for its inputs:
/// the weights of a decode projection stream in while the kernel before it runs.
fn prefetch_weights(kit: &Kit<'_>, spec: &Spec, s: &SmallMSchedule) -> R<()> {
    let target = kit.math(|kb| Ok(kb.target))?;
    let (Some(k), Some(outer), Some(ks)) = (spec.k.as_const(), spec.b.outer.as_const(), spec.b.ks.as_const()) else { return Ok(()) };
    if !target.has_programmatic_launch() || ks != 1 || !spec.batch.is_empty() || spec.b_quant.is_some() || k <= 0 || outer <= 0 {
        return Ok(());
    }
    let (Some(n), es) = (spec.n.as_const(), spec.dtype.size_bytes() as u64) else { return Ok(()) };
    let b_ptr = kit.buf(spec.b.buffer)?;
    let (columns, lanes) = (i64::from(s.columns), s.lanes);
    kit.math(|kb| {
        let (tid, bx) = (kb.sreg("tid.x")?, kb.sreg("ctaid.x")?);
        let (off, lane) = kb.in_prologue(|kb| {
            let i64t = kb.cx.i64_type();
            let tid = kb.b.build_int_z_extend(tid, i64t, "pf_tid")?;
            let bx = kb.b.build_int_z_extend(bx, i64t, "pf_cta")?;
            let lanes64 = i64t.const_int(u64::from(lanes), false);
            let g = kb.b.build_int_unsigned_div(tid, lanes64, "pf_group")?;
            let lane = kb.b.build_int_unsigned_rem(tid, lanes64, "pf_lane")?;
            let col = kb.b.build_int_add(kb.b.build_int_mul(bx, i64t.const_int(columns as u64, false), "pf_c0")?, g, "pf_col")?;
            // A column past N prefetches the last one (no branch in the prologue).
            let last = i64t.const_int((n - 1).max(0) as u64, false);
            let over = kb.b.build_int_compare(inkwell::IntPredicate::UGT, col, last, "pf_past")?;
            let col = kb.b.build_select(over, last, col, "pf_colc")?.into_int_value();
            let off = kb.b.build_int_mul(col, i64t.const_int(outer as u64 * es, false), "pf_coloff")?;
            Ok((off, lane))
        })?;
        kb.prefetch_l2_in_prologue(b_ptr, off, k as u64 * es, lane, lanes)
    })
}

pub(super) fn small_m_quant_loop<'ctx>(
    kit: &Kit<'ctx>,
    spec: &Spec,
    q: DType,
    (lane, lanes): (IntValue<'ctx>, u32),
    cols: &[IntValue<'ctx>],
    n_valid: IntValue<'ctx>,
    (m0, m_valid): (IntValue<'ctx>, &[IntValue<'ctx>]),
    acc: &[Vec<PointerValue<'ctx>>],
    bases: &Bases<'ctx>,
) -> R<()> {
    let dt = spec.dtype;
    let (a_ptr, b_ptr) = (kit.buf(spec.a.buffer)?, kit.buf(spec.b.buffer)?);
    let (a_outer, a_ks) = (kit.dim(&spec.a.outer)?, kit.dim(&spec.a.ks)?);
    let kdim = kit.dim(&spec.k)?;
    let kblocks = kit.udiv(kdim, kit.i64c(32))?;
    // A's 32 elements of a block: vectors of 16 bytes where its layout allows.
    let vw = 16 / dt.size_bytes() as u32;
    let vector = spec.a.vector_ok(vw);
    let (chunk, nchunks) = if vector { (vw, 32 / vw) } else { (32, 1) };
    kit.if_then(n_valid, |k| {
        k.for_range(lane, kblocks, k.i64c(i64::from(lanes)), |k, kb| {
            let mut bvs = Vec::with_capacity(cols.len());
            for &col in cols {
                let block = k.add(k.mul(col, kblocks)?, kb)?;
                let vals = k.math(|b| crate::quant::block_values(b, q, b_ptr, block))?;
                let vals: Vec<FloatValue> = vals.into_iter().map(|v| k.math(|b| b.round_to(v, dt))).collect::<R<_>>()?;
                bvs.push(vals);
            }
            let k0 = k.mul(kb, k.i64c(32))?;
            for (i, &mv) in m_valid.iter().enumerate() {
                let m = k.add(m0, k.i64c(i as i64))?;
                let mut av = Vec::with_capacity(32);
                for c in 0..nchunks {
                    let kk = k.add(k0, k.i64c(i64::from(c * chunk)))?;
                    let aidx = k.add(bases.a, k.add(k.mul(m, a_outer)?, k.mul(kk, a_ks)?)?)?;
                    av.extend(k.guarded_load(mv, dt, a_ptr, aidx, chunk, vector, a_ks)?);
                }
                for (seg_acc, bv) in acc.iter().zip(&bvs) {
                    let p = seg_acc[i];
                    let mut sum = k.get_f(p)?;
                    for (x, y) in av.iter().zip(bv) {
                        sum = k.fma(*x, *y, sum)?;
                    }
                    k.set(p, sum.into())?;
                }
            }
            Ok(())
        })
    })
}

/// The columns epilogue of the small-M kernel at R's element (row `m` of batch `z`, column
/// `n`): the accumulators of `cols` (n and its RoPE partners) are rounded to R's dtype into
/// the group's shared-memory copy of n's head of `head` columns (`tile`; written and read by
/// the same thread, so no barrier), which the evaluator reads as R (row stride 0, column
/// stride 1, based at the head's first column); then every output whose segment holds column
/// n is written ([`columns_output`]).
#[allow(clippy::too_many_arguments)]
pub(super) fn small_m_columns<'ctx>(
    k: &Kit<'ctx>,
    spec: &Spec,
    (z, m, n): (IntValue<'ctx>, IntValue<'ctx>, IntValue<'ctx>),
    cols: &[IntValue<'ctx>],
    accs: &[FloatValue<'ctx>],
    (tile, head): (Option<PointerValue<'ctx>>, i64),
    segs: &[epilogue::Seg],
    appends: &[Option<epilogue::Append>],
) -> R<()> {
    let dt = spec.dtype;
    let arr = tile.ok_or_else(|| k.err("no staging tile for a columns epilogue"))?;
    let first = k.sub(n, k.urem(n, k.i64c(head))?)?;
    let es = dt.size_bytes() as i32;
    for (&col, &acc) in cols.iter().zip(accs) {
        let off = k.mul(k.trunc32(k.sub(col, first)?)?, k.i32c(es))?;
        k.sh_store(dt, k.sh_at(arr, off)?, &[acc])?;
    }
    let rank = spec.batch.len() + 2;
    let strides: Vec<Dim> = (0..rank).map(|i| Dim::constant(i64::from(i == rank - 1))).collect();
    let rbuf = Buf { ptr: k.gep_raw(dt, arr, k.sub(k.i64c(0), first)?)?, dtype: dt, strides, align: dt.size_bytes() as u32 };
    for (j, seg) in segs.iter().enumerate() {
        let (a, w) = (k.dim(&seg.start)?, k.dim(&seg.width)?);
        let c = k.sub(n, a)?;
        let inside = k.and(k.icmp(IntPredicate::SGE, c, k.i64c(0))?, k.icmp(IntPredicate::SLT, c, w)?)?;
        let append = appends.get(j).cloned().flatten();
        k.if_then(inside, |k| columns_output(k, spec, j, append.as_ref(), (z, m, c, w), vec![rbuf.clone()]))?;
    }
    Ok(())
}
